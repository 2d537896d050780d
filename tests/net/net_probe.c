/* net_probe: the outgoing TCP connect probe (net_probe, net.h) checked over one transport,
 * for tests/net/echo.sh.
 *
 *   net_probe --driver host|tap|packet [--ifname NAME] [--address A/len] [--gateway G]
 *             [--mac M] [--listen PORT] [--open A:P] [--silent A:P] [--einval A]...
 *             [--expect A:P:TIMEOUT_MS:WANT[/WANT]]...
 *
 * --expect: one probe whose outcome must be one of WANT (connected, ECONNREFUSED,
 * ETIMEDOUT, EHOSTUNREACH, ENETUNREACH); they run NET_PROBES_MAX at a time. Its time must
 * fit the outcome: > 0 for connected, within [TIMEOUT, TIMEOUT + SLACK_MS] for one told
 * by the timeout (ETIMEDOUT, or a WANT ending in '~': lwIP's EHOSTUNREACH~, no ARP answer
 * by the timeout), under TIMEOUT for the others.
 * --listen PORT (host): the stack itself listens on 127.0.0.1:PORT (and resets whatever
 * connects), a port for --open.
 * --silent A:P: one that never answers (its probes last until their timeout), for the
 * cancel checks that need a probe still in flight after the loop ran.
 * --open A:P: a port that listens. With it, the fixed checks also run:
 *   einval   bad arguments (and each --einval address) give -EINVAL at once, no callback
 *   busy     NET_PROBES_MAX at once, one more is -EBUSY; a slot is free again inside a
 *            probe's callback (a new probe started there succeeds)
 *   cancel   a cancelled probe's callback never runs (cancelled at once; with --silent
 *            also after the loop ran, and from inside another probe's callback); done,
 *            zero, negative and unknown ids are ignored
 *   free     net_free with NET_PROBES_MAX probes in flight: no callback, nothing leaked
 * --resolve NAME:TIMEOUT_MS:WANT[/WANT]: one lookup (net_resolve) whose outcome must be
 * one of WANT (an IPv4 address, ENOENT, ETIMEDOUT, ENETUNREACH, EAGAIN); with any, the
 * lookups' fixed checks run too: bad names and arguments are -EINVAL at once, a
 * cancelled lookup never calls back, NET_RESOLVES_MAX at once and one more is -EBUSY,
 * net_free with lookups in flight calls none back. --dns A[,B]: lwIP's DNS servers.
 * --wait-address MS: first wait (up to MS) for the stack to have an address (DHCP).
 * Every probe's callback must run exactly once, from the loop, never inside net_probe.
 * Prints "ok NAME ..." or "FAIL NAME ..." per check; exit 0 when all passed. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "net/net.h"
#include "tests/net/net_args.h"
#include "sched/loop.h"

#define MAX_EXPECT 32
#define SLACK_MS 1000 /* a timeout may be told this late (a loaded machine, ASan) */

typedef struct {
    char addr[64];
    int port, timeout_ms;
    char want[128];
    int id, calls, result;
    double ms;
} probe_t;

typedef struct {
    char name[NET_NAME_MAX + 2];
    int timeout_ms;
    char want[128];
    int id, calls, result;
    char addr[16];
    double ms;
} lookup_t;

static loop_t *g_loop;
static net_stack *g_net;
static int g_in_probe;  /* inside a net_probe call: a callback now is a bug */
static int g_sync_cb;   /* callbacks that came from inside net_probe */
static int g_failed;

static void report(int ok, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void report(int ok, const char *name, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("%-4s %-22s %s\n", ok ? "ok" : "FAIL", name, msg);
    fflush(stdout);
    if (!ok) g_failed++;
}

static const char *result_name(int r) {
    switch (r) {
    case 0: return "connected";
    case -ECONNREFUSED: return "ECONNREFUSED";
    case -ETIMEDOUT: return "ETIMEDOUT";
    case -EHOSTUNREACH: return "EHOSTUNREACH";
    case -ENETUNREACH: return "ENETUNREACH";
    case -EINVAL: return "EINVAL";
    case -EBUSY: return "EBUSY";
    default: return strerror(-r);
    }
}

static void on_probe(void *ud, int result, double ms) {
    probe_t *p = ud;
    if (g_in_probe) g_sync_cb++;
    p->calls++;
    p->result = result;
    p->ms = ms;
}

static int start(probe_t *p, const char *addr, int port, int timeout_ms, net_probe_fn fn) {
    g_in_probe = 1;
    int id = net_probe(g_net, addr, port, timeout_ms, fn, p);
    g_in_probe = 0;
    if (p) p->id = id, p->calls = 0, p->result = 1, p->ms = -1;
    return id;
}

/* Runs the loop until every probe in ps has been called back, or max_ms. */
static void wait_for(probe_t *ps, int n, int64_t max_ms) {
    int64_t end = loop_now_ms() + max_ms;
    for (;;) {
        int left = 0;
        for (int i = 0; i < n; i++) left += ps[i].id > 0 && ps[i].calls == 0;
        if (!left || loop_now_ms() >= end) return;
        loop_run_once(g_loop, 20);
    }
}

static void run_for(int64_t ms) {
    int64_t end = loop_now_ms() + ms;
    while (loop_now_ms() < end) loop_run_once(g_loop, 20);
}

/* ---------------------------------------------------------------- --expect */

/* 0: name is not one of want; 1: it is; 2: it is, told by the timeout ("NAME~"). */
static int want_has(const char *want, const char *name) {
    size_t n = strlen(name);
    for (const char *w = want; *w;) {
        const char *slash = strchr(w, '/');
        size_t len = slash ? (size_t)(slash - w) : strlen(w);
        if (len >= n && !strncmp(w, name, n) && (len == n || (len == n + 1 && w[n] == '~')))
            return len == n ? 1 : 2;
        w += len + (slash ? 1 : 0);
    }
    return 0;
}

/* Cancels the probes of ps not called back yet (a failed check): none may outlive ps. */
static void forget(probe_t *ps, int n) {
    for (int i = 0; i < n; i++)
        if (ps[i].id > 0 && ps[i].calls == 0) net_probe_cancel(g_net, ps[i].id);
}

static void judge(const probe_t *p) {
    char name[96];
    snprintf(name, sizeof name, "%s:%d", p->addr, p->port);
    if (p->id <= 0) {
        report(0, name, "net_probe returned %s", result_name(p->id));
        return;
    }
    if (p->calls != 1) {
        report(0, name, "called back %d times (want %s)", p->calls, p->want);
        return;
    }
    const char *got = result_name(p->result);
    int w = want_has(p->want, got);
    if (!w) {
        report(0, name, "%s in %.1f ms, want %s", got, p->ms, p->want);
        return;
    }
    int by_timeout = p->result == -ETIMEDOUT || w == 2;
    int ok = p->result == 0 ? p->ms > 0
             : by_timeout   ? p->ms >= p->timeout_ms - 1 && p->ms <= p->timeout_ms + SLACK_MS
                            : p->ms >= 0 && p->ms < p->timeout_ms;
    report(ok, name, "%s in %.2f ms (timeout %d ms)", got, p->ms, p->timeout_ms);
}

static void run_expects(probe_t *ps, int n) {
    for (int b = 0; b < n; b += NET_PROBES_MAX) {
        int m = n - b < NET_PROBES_MAX ? n - b : NET_PROBES_MAX;
        int longest = 0;
        for (int i = b; i < b + m; i++) {
            start(&ps[i], ps[i].addr, ps[i].port, ps[i].timeout_ms, on_probe);
            if (ps[i].timeout_ms > longest) longest = ps[i].timeout_ms;
        }
        wait_for(ps + b, m, longest + SLACK_MS + 2000);
        run_for(50); /* a second callback would come now */
        forget(ps + b, m);
        for (int i = b; i < b + m; i++) judge(&ps[i]);
    }
}

/* ---------------------------------------------------------------- --resolve */

static int g_in_resolve, g_sync_lookup;

static void on_lookup(void *ud, int result, const char *ipv4, double ms) {
    lookup_t *k = ud;
    if (g_in_resolve) g_sync_lookup++;
    k->calls++, k->result = result, k->ms = ms;
    snprintf(k->addr, sizeof k->addr, "%s", result == 0 && ipv4 ? ipv4 : "");
}

static int resolve(lookup_t *k, const char *name, int timeout_ms) {
    g_in_resolve = 1;
    int id = net_resolve(g_net, name, timeout_ms, on_lookup, k);
    g_in_resolve = 0;
    k->id = id, k->calls = 0, k->result = 1, k->ms = -1, k->addr[0] = 0;
    return id;
}

static void wait_lookups(lookup_t *ks, int n, int64_t max_ms) {
    int64_t end = loop_now_ms() + max_ms;
    for (;;) {
        int left = 0;
        for (int i = 0; i < n; i++) left += ks[i].id > 0 && ks[i].calls == 0;
        if (!left || loop_now_ms() >= end) return;
        loop_run_once(g_loop, 20);
    }
}

static void forget_lookups(lookup_t *ks, int n) {
    for (int i = 0; i < n; i++)
        if (ks[i].id > 0 && ks[i].calls == 0) net_resolve_cancel(g_net, ks[i].id);
}

static void judge_lookup(const lookup_t *k) {
    if (k->id <= 0) {
        report(0, k->name, "net_resolve returned %s", result_name(k->id));
        return;
    }
    if (k->calls != 1) {
        report(0, k->name, "called back %d times (want %s)", k->calls, k->want);
        return;
    }
    const char *got = k->result == 0 ? k->addr : k->result == -ENOENT ? "ENOENT"
                      : k->result == -EAGAIN ? "EAGAIN" : result_name(k->result);
    int ok = want_has(k->want, got) != 0;
    if (ok && k->result == -ETIMEDOUT) ok = k->ms >= k->timeout_ms - 1 && k->ms <= k->timeout_ms + SLACK_MS;
    else if (ok) ok = k->ms >= 0 && k->ms < k->timeout_ms;
    report(ok, k->name, "%s in %.2f ms (timeout %d ms, want %s)", got, k->ms, k->timeout_ms, k->want);
}

static void run_lookups(lookup_t *ks, int n) {
    for (int b = 0; b < n; b += NET_RESOLVES_MAX) {
        int m = n - b < NET_RESOLVES_MAX ? n - b : NET_RESOLVES_MAX, longest = 0;
        for (int i = b; i < b + m; i++) {
            resolve(&ks[i], ks[i].name, ks[i].timeout_ms);
            if (ks[i].timeout_ms > longest) longest = ks[i].timeout_ms;
        }
        wait_lookups(ks + b, m, longest + SLACK_MS + 2000);
        run_for(50); /* a second callback would come now */
        forget_lookups(ks + b, m);
        for (int i = b; i < b + m; i++) judge_lookup(&ks[i]);
    }
}

/* Bad names and arguments: -EINVAL at once, nothing called back; a cancelled lookup
 * never calls back; NET_RESOLVES_MAX at once, then -EBUSY (name: one that resolves). */
static void check_lookups(const char *name) {
    static char long_name[300], long_label[80];
    memset(long_name, 'a', 254), long_name[254] = 0;
    memset(long_label, 'b', 64), long_label[64] = 0;
    const char *const bad[] = {"",       ".",          "a..b",    "a b",     "a/b",    "a\nb",
                               "exa mple.com", "10.1.2", "1.2.3.4.5", "10.1.2.256", long_name, long_label};
    lookup_t k;
    int bad_n = 0;
    char first[128] = "";
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = resolve(&k, bad[i], 1000);
        if (rc > 0) net_resolve_cancel(g_net, rc);
        if (rc != -EINVAL && !first[0]) snprintf(first, sizeof first, "'%.40s': %s", bad[i], result_name(rc));
        bad_n += rc != -EINVAL;
    }
    int args[] = {resolve(&k, NULL, 1000), resolve(&k, name, 0), resolve(&k, name, NET_PROBE_TIMEOUT_MAX_MS + 1),
                  net_resolve(g_net, name, 1000, NULL, &k), net_resolve(NULL, name, 1000, on_lookup, &k)};
    for (size_t i = 0; i < sizeof args / sizeof args[0]; i++) {
        if (args[i] > 0) net_resolve_cancel(g_net, args[i]);
        if (args[i] != -EINVAL && !first[0]) snprintf(first, sizeof first, "argument set %zu: %s", i, result_name(args[i]));
        bad_n += args[i] != -EINVAL;
    }
    run_for(100);
    report(!bad_n && k.calls == 0, "resolve-einval", "%zu bad calls, %d not EINVAL%s%s, %d called back",
           sizeof bad / sizeof bad[0] + sizeof args / sizeof args[0], bad_n, first[0] ? ": " : "", first, k.calls);

    lookup_t c, ks[NET_RESOLVES_MAX], extra;
    resolve(&c, name, 2000);
    net_resolve_cancel(g_net, c.id);
    net_resolve_cancel(g_net, 0), net_resolve_cancel(g_net, -1), net_resolve_cancel(g_net, 0x7fffffff);
    run_for(1500); /* long enough for an answer: none may be told */
    int started = 0;
    for (int i = 0; i < NET_RESOLVES_MAX; i++) started += resolve(&ks[i], name, 2000) > 0;
    int over = resolve(&extra, name, 2000);
    wait_lookups(ks, NET_RESOLVES_MAX, 4000);
    run_for(50);
    forget_lookups(ks, NET_RESOLVES_MAX);
    int found = 0;
    for (int i = 0; i < NET_RESOLVES_MAX; i++) found += ks[i].calls == 1 && ks[i].result == 0;
    report(c.id > 0 && c.calls == 0 && started == NET_RESOLVES_MAX && over == -EBUSY && extra.calls == 0 &&
           found == NET_RESOLVES_MAX, "resolve-busy",
           "cancelled: %d calls; %d of %d started, one more: %s; %d found", c.calls, started, NET_RESOLVES_MAX,
           result_name(over), found);
}

/* ---------------------------------------------------------------- fixed checks */

static void check_einval(const char *open_addr, int open_port, char **extra, int nextra) {
    static const char *const bad[] = {
        "",          "10.1.2",       "10.1.2.3.4",  "10.1.2.256", "abc",
        "::1",       " 10.1.2.3",    "10.1.2.3 ",   "010.1.2.3",  "10.1.2.3:80",
        "0.0.0.0",   "224.0.0.1",    "239.1.2.3",   "255.255.255.255",
    };
    probe_t p;
    int bad_n = 0, calls = 0;
    char first[96] = "";
    for (size_t i = 0; i < sizeof bad / sizeof bad[0] + (size_t)nextra; i++) {
        const char *a = i < sizeof bad / sizeof bad[0] ? bad[i] : extra[i - sizeof bad / sizeof bad[0]];
        int rc = start(&p, a, open_port, 1000, on_probe);
        if (rc > 0) net_probe_cancel(g_net, rc);
        if (rc != -EINVAL && !first[0]) snprintf(first, sizeof first, "'%s': %s", a, result_name(rc));
        bad_n += rc != -EINVAL;
    }
    const struct {
        const char *a;
        int port, timeout;
        net_probe_fn fn;
    } args[] = {
        {NULL, open_port, 1000, on_probe},     {open_addr, 0, 1000, on_probe},
        {open_addr, -1, 1000, on_probe},       {open_addr, 65536, 1000, on_probe},
        {open_addr, open_port, 0, on_probe},   {open_addr, open_port, -5, on_probe},
        {open_addr, open_port, NET_PROBE_TIMEOUT_MAX_MS + 1, on_probe},
        {open_addr, open_port, 1000, NULL},
    };
    for (size_t i = 0; i < sizeof args / sizeof args[0]; i++) {
        int rc = start(&p, args[i].a, args[i].port, args[i].timeout, args[i].fn);
        if (rc > 0) net_probe_cancel(g_net, rc);
        if (rc != -EINVAL && !first[0])
            snprintf(first, sizeof first, "argument set %zu: %s", i, result_name(rc));
        bad_n += rc != -EINVAL;
    }
    if (net_probe(NULL, open_addr, open_port, 1000, on_probe, &p) != -EINVAL && !first[0])
        snprintf(first, sizeof first, "no stack: not EINVAL"), bad_n++;
    run_for(100);
    calls = p.calls;
    report(!bad_n && !calls, "einval", "%zu bad calls, %d not EINVAL%s%s, %d called back",
           sizeof bad / sizeof bad[0] + (size_t)nextra + sizeof args / sizeof args[0] + 1,
           bad_n, first[0] ? ": " : "", first, calls);
}

/* busy: a probe started from inside another's callback (its slot is free by then). */
static probe_t g_chained;
static const char *g_open_addr, *g_silent_addr;
static int g_open_port, g_silent_port, g_chain_rc;

static void on_probe_chain(void *ud, int result, double ms) {
    on_probe(ud, result, ms);
    if (!g_chain_rc) g_chain_rc = start(&g_chained, g_open_addr, g_open_port, 2000, on_probe);
}

static void check_busy(void) {
    probe_t ps[NET_PROBES_MAX], extra;
    int ids_ok = 1;
    g_chain_rc = 0;
    for (int i = 0; i < NET_PROBES_MAX; i++) {
        int id = start(&ps[i], g_open_addr, g_open_port, 2000, on_probe_chain);
        if (id <= 0) ids_ok = 0;
        for (int j = 0; j < i; j++) ids_ok &= ps[j].id != id;
    }
    int over = start(&extra, g_open_addr, g_open_port, 2000, on_probe);
    wait_for(ps, NET_PROBES_MAX, 4000);
    wait_for(&g_chained, 1, 4000);
    run_for(50);
    forget(ps, NET_PROBES_MAX);
    forget(&extra, 1);
    int all = 1;
    for (int i = 0; i < NET_PROBES_MAX; i++) all &= ps[i].calls == 1 && ps[i].result == 0;
    int chained = g_chain_rc > 0 && g_chained.calls == 1 && g_chained.result == 0;
    report(ids_ok && over == -EBUSY && all && chained && extra.calls == 0, "busy",
           "%d distinct ids, one more: %s, all connected: %s, a probe started in a callback: "
           "%s (%s)",
           NET_PROBES_MAX, result_name(over), all ? "yes" : "no",
           g_chain_rc > 0 ? "started" : result_name(g_chain_rc),
           g_chain_rc > 0 ? result_name(g_chained.result) : "-");
}

/* cancel from a callback: the probe whose callback runs cancels g_victim. */
static probe_t g_victim;

static void on_probe_cancel(void *ud, int result, double ms) {
    on_probe(ud, result, ms);
    net_probe_cancel(g_net, g_victim.id);
}

/* cancel: right away; with --silent after loop passes, and from another's callback;
 * cancelling a done id, 0, a negative or an unknown one does nothing. */
static void check_cancel(void) {
    probe_t a, b = {.id = 1}, c;
    start(&a, g_open_addr, g_open_port, 2000, on_probe);
    net_probe_cancel(g_net, a.id);
    if (g_silent_addr) {
        start(&b, g_silent_addr, g_silent_port, 2000, on_probe);
        for (int i = 0; i < 5; i++) loop_run_once(g_loop, 10);
        net_probe_cancel(g_net, b.id);
        start(&g_victim, g_silent_addr, g_silent_port, 2000, on_probe);
    }
    start(&c, g_open_addr, g_open_port, 2000, g_silent_addr ? on_probe_cancel : on_probe);
    wait_for(&c, 1, 3000);
    net_probe_cancel(g_net, c.id); /* done: ignored */
    net_probe_cancel(g_net, 0);
    net_probe_cancel(g_net, -1);
    net_probe_cancel(g_net, 0x7fffffff);
    run_for(300);
    /* The cancelled ones' slots are free again: NET_PROBES_MAX start at once. */
    probe_t ps[NET_PROBES_MAX];
    int started = 0;
    for (int i = 0; i < NET_PROBES_MAX; i++)
        started += start(&ps[i], g_open_addr, g_open_port, 2000, on_probe) > 0;
    wait_for(ps, NET_PROBES_MAX, 3000);
    forget(ps, NET_PROBES_MAX);
    forget(&c, 1);
    if (g_silent_addr) forget(&b, 1);
    int later = 0;
    for (int i = 0; i < NET_PROBES_MAX; i++) later += ps[i].calls == 1 && ps[i].result == 0;
    int ok = a.id > 0 && b.id > 0 && a.calls == 0 && b.calls == 0 && c.calls == 1 &&
             c.result == 0 && started == NET_PROBES_MAX && later == NET_PROBES_MAX;
    if (g_silent_addr) {
        ok &= g_victim.id > 0 && g_victim.calls == 0;
        report(ok, "cancel",
               "cancelled at once: %d calls, after loop passes: %d, from a callback: %d; "
               "uncancelled: %d call (%s); then %d of %d started and connected",
               a.calls, b.calls, g_victim.calls, c.calls, result_name(c.result), later,
               NET_PROBES_MAX);
    } else {
        report(ok, "cancel",
               "cancelled at once: %d calls; uncancelled: %d call (%s); then %d of %d "
               "started and connected",
               a.calls, c.calls, result_name(c.result), later, NET_PROBES_MAX);
    }
}

/* ---------------------------------------------------------------- main */

static int on_accept(void *lud, net_conn *c, const net_conn_ops **ops, void **ud) {
    (void)lud, (void)c, (void)ops, (void)ud;
    return -ECONNREFUSED; /* the transport resets it */
}

static int split_hostport(const char *s, char *host, size_t cap, int *port) {
    const char *colon = strrchr(s, ':');
    if (!colon || (size_t)(colon - s) >= cap) return -1;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    *port = atoi(colon + 1);
    return 0;
}

static void usage(void) {
    fprintf(stderr, "usage: net_probe --driver host|tap|packet [--ifname NAME] [--address A/len] "
                    "[--gateway G] [--mac M] [--listen PORT] [--open A:P] [--silent A:P] "
                    "[--einval A]... "
                    "[--expect A:P:TIMEOUT_MS:WANT[/WANT]]... [--dns A[,B]] [--wait-address MS] "
                    "[--resolve NAME:TIMEOUT_MS:WANT[/WANT]]...\n");
    exit(2);
}

int main(int argc, char **argv) {
    net_config cfg = {.driver = CFG_DRIVER_HOST, .ifname = "", .address = "", .gateway = "",
                      .mac = "", .hostname = "kiln-probe", .max_conns = 16};
    static probe_t ex[MAX_EXPECT];
    static lookup_t lk[MAX_EXPECT];
    int nlk = 0;
    static char open_host[64], silent_host[64];
    char *einval[MAX_EXPECT];
    int nex = 0, neinval = 0, listen_port = 0, wait_addr_ms = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) usage();
        char *v = argv[++i];
        int took = net_args_take(&cfg, a, v);
        if (took < 0) usage();
        if (took) continue;
        if (!strcmp(a, "--listen")) {
            listen_port = atoi(v);
        } else if (!strcmp(a, "--wait-address")) {
            wait_addr_ms = atoi(v);
        } else if (!strcmp(a, "--open")) {
            if (split_hostport(v, open_host, sizeof open_host, &g_open_port) < 0) usage();
            g_open_addr = open_host;
        } else if (!strcmp(a, "--silent")) {
            if (split_hostport(v, silent_host, sizeof silent_host, &g_silent_port) < 0) usage();
            g_silent_addr = silent_host;
        } else if (!strcmp(a, "--einval")) {
            if (neinval == MAX_EXPECT) usage();
            einval[neinval++] = v;
        } else if (!strcmp(a, "--resolve")) {
            if (nlk == MAX_EXPECT) usage();
            lookup_t *k = &lk[nlk++];
            char *f[3], *save = NULL, *t = strtok_r(v, ":", &save);
            int n = 0;
            for (; t && n < 3; t = strtok_r(NULL, ":", &save)) f[n++] = t;
            if (n != 3) usage();
            snprintf(k->name, sizeof k->name, "%s", f[0]);
            k->timeout_ms = atoi(f[1]);
            snprintf(k->want, sizeof k->want, "%s", f[2]);
        } else if (!strcmp(a, "--expect")) {
            if (nex == MAX_EXPECT) usage();
            probe_t *p = &ex[nex++];
            char *f[4], *save = NULL, *t = strtok_r(v, ":", &save);
            int k = 0;
            for (; t && k < 4; t = strtok_r(NULL, ":", &save)) f[k++] = t;
            if (k != 4) usage();
            snprintf(p->addr, sizeof p->addr, "%s", f[0]);
            p->port = atoi(f[1]);
            p->timeout_ms = atoi(f[2]);
            snprintf(p->want, sizeof p->want, "%s", f[3]);
        } else {
            usage();
        }
    }
    signal(SIGPIPE, SIG_IGN);
    g_loop = loop_new(1024, 64);
    if (!g_loop) {
        perror("net_probe: loop_new");
        return 1;
    }
    char err[256];
    g_net = net_new(g_loop, &cfg, err, sizeof err);
    if (!g_net) {
        fprintf(stderr, "net_probe: %s\n", err);
        loop_free(g_loop);
        return 1;
    }
    if (listen_port &&
        net_listen(g_net, "127.0.0.1", listen_port, on_accept, NULL, err, sizeof err) < 0) {
        fprintf(stderr, "net_probe: %s\n", err);
        net_free(g_net);
        loop_free(g_loop);
        return 1;
    }
    printf("     driver %s\n", net_driver_name(g_net));
    if (wait_addr_ms) {
        char addr[64] = "";
        int64_t end = loop_now_ms() + wait_addr_ms;
        while (loop_now_ms() < end && (net_address(g_net, addr, sizeof addr) < 0 || !addr[0]))
            loop_run_once(g_loop, 20);
        report(addr[0] != 0, "address", "%s", addr[0] ? addr : "none within the wait");
    }
    if (g_open_addr) {
        /* A first probe to the open port, with room for a lost first ARP (lwIP asks
         * again after 1 s): a TAP's kernel side drops what it sends for up to a second
         * after the device is opened (until the link watcher starts its queue). */
        probe_t open = {.port = g_open_port, .timeout_ms = 5000};
        snprintf(open.addr, sizeof open.addr, "%s", g_open_addr);
        snprintf(open.want, sizeof open.want, "connected");
        run_expects(&open, 1);
    }
    run_expects(ex, nex);
    if (g_open_addr) {
        check_einval(g_open_addr, g_open_port, einval, neinval);
        check_busy();
        check_cancel();
    }
    report(g_sync_cb == 0, "from-loop", "%d callbacks from inside net_probe", g_sync_cb);
    const char *found = NULL; /* a name that resolves, for the fixed lookup checks */
    if (nlk) {
        run_lookups(lk, nlk);
        for (int i = 0; i < nlk && !found; i++)
            if (lk[i].result == 0) found = lk[i].name;
        if (found) check_lookups(found);
        report(g_sync_lookup == 0, "resolve-from-loop", "%d callbacks from inside net_resolve", g_sync_lookup);
    }

    /* free: probes in flight when the stack goes; none may call back. */
    probe_t fl[NET_PROBES_MAX];
    int started = 0;
    for (int i = 0; i < NET_PROBES_MAX; i++) {
        /* the listening port and the --expect ones, in turn */
        const char *a = g_open_addr;
        int port = g_open_port;
        if ((i % 2 || !a) && nex) a = ex[i % nex].addr, port = ex[i % nex].port;
        if (!a) a = "10.255.255.1", port = 80;
        started += start(&fl[i], a, port, 2000, on_probe) > 0;
    }
    lookup_t fk[NET_RESOLVES_MAX];
    int looking = 0;
    for (int i = 0; found && i < NET_RESOLVES_MAX; i++) looking += resolve(&fk[i], found, 2000) > 0;
    net_free(g_net);
    g_net = NULL;
    run_for(found ? 1500 : 300);
    int calls = 0;
    for (int i = 0; i < NET_PROBES_MAX; i++) calls += fl[i].calls;
    for (int i = 0; i < looking; i++) calls += fk[i].calls;
    report(started == NET_PROBES_MAX && calls == 0 && (!found || looking == NET_RESOLVES_MAX), "free",
           "net_free with %d probes and %d lookups in flight: %d called back", started, looking, calls);
    loop_free(g_loop);
    printf("%s\n", g_failed ? "net_probe: FAILED" : "net_probe: all passed");
    return g_failed ? 1 : 0;
}
