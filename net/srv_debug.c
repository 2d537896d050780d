/* srv_debug: DEBUG, the sanctioned diagnostics path (docs/PROTOCOL.md). An admin opens a
 * window of at most an hour; while it is open the diagnostics answer, each run logged
 * with who asked; when it ends (closed, or its time is up) they refuse again. There is
 * no shell: each diagnostic is a fixed, bounded piece of code that reads and reports. */
#include "net/srv_int.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include "core/cpu/isa.h"

#define DBG_DEFAULT_MIN 15
#define DBG_MAX_MIN 60
#define DBG_BODY_MAX (128 * 1024) /* DBG_KMSG_MAX lines fit */
#define DBG_KMSG_DEFAULT 50
#define DBG_KMSG_MAX 400
#define DBG_KMSG_LINE 240
#define DBG_KMSG_READS 200000 /* records read at most: the kernel's buffer is far smaller */
#define DBG_PROBE_DEFAULT_MS 3000
#define DBG_PROBE_MAX_MS 10000
#define DBG_IFACES_MAX 16
#define DBG_PROBES 4

static const char dbg_usage[] =
    "usage: DEBUG [open [minutes=1..60 | seconds=1..3600] | close | net | kmsg [lines=1..400] | gpu | "
    "probe host=A.B.C.D|NAME port=1..65535 [timeout_ms=100..10000]]";

/* The answer being built (one at a time: the loop is one thread). */
static struct {
    char buf[DBG_BODY_MAX];
    size_t len;
} body;

static void body_reset(void) { body.len = 0, body.buf[0] = 0; }

static void body_add(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void body_add(const char *fmt, ...) {
    if (body.len >= sizeof body.buf - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(body.buf + body.len, sizeof body.buf - body.len, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    body.len += (size_t)n < sizeof body.buf - body.len ? (size_t)n : sizeof body.buf - body.len - 1;
}

/* ------------------------------------------------------------------ the window */

static int64_t window_left_ms(const srv *s) {
    int64_t left = s->dbg_until_ms - loop_now_ms();
    return s->dbg_until_ms && left > 0 ? left : 0;
}

void srv_debug_sweep(srv *s) {
    if (s->dbg_until_ms && !window_left_ms(s)) {
        s->dbg_until_ms = 0;
        srv_log(s, CFG_LOG_WARN, "debug: the window opened by %s is over", s->dbg_by);
    }
}

static void window_line(srv *s, const srv_debug_io *io) {
    char line[256];
    int64_t left = window_left_ms(s);
    if (left) snprintf(line, sizeof line, "DEBUG window=open remaining_s=%lld by=\"%s\"",
                       (long long)((left + 999) / 1000), s->dbg_by);
    else snprintf(line, sizeof line, "DEBUG window=closed");
    io->line(io->ud, line);
}

/* A whole number lo..hi; -1 when it is not one. */
static long small_num(const proto_str *v, long lo, long hi) {
    char *end;
    long n = strtol(v->s, &end, 10);
    return *end || end == v->s || n < lo || n > hi ? -1 : n;
}

/* minutes=1..60 (default 15), or seconds=1..3600 for a short look */
static void window_open(srv *s, const proto_line *l, const char *who, const srv_debug_io *io) {
    const proto_str *m = proto_get(l, "minutes"), *sec = proto_get(l, "seconds");
    long secs = DBG_DEFAULT_MIN * 60L;
    if (m && sec) secs = -1;
    else if (m) secs = small_num(m, 1, DBG_MAX_MIN) * 60;
    else if (sec) secs = small_num(sec, 1, DBG_MAX_MIN * 60L);
    if (secs <= 0) {
        io->err(io->ud, 400, "bad_request", "DEBUG open [minutes=1..60 | seconds=1..3600]");
        return;
    }
    s->dbg_until_ms = loop_now_ms() + secs * 1000;
    snprintf(s->dbg_by, sizeof s->dbg_by, "%s", who);
    srv_log(s, CFG_LOG_WARN, "debug: window opened for %ld s by %s", secs, who);
    window_line(s, io);
}

static void window_close(srv *s, const char *who, const srv_debug_io *io) {
    if (window_left_ms(s)) srv_log(s, CFG_LOG_WARN, "debug: window closed by %s", who);
    s->dbg_until_ms = 0;
    window_line(s, io);
}

/* ------------------------------------------------------------------ net */

/* The start of a small file (sysfs, procfs), NUL-terminated; its length, 0 when it
 * cannot be read. */
static size_t read_text(const char *path, char *out, size_t cap) {
    out[0] = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, out, cap - 1);
    close(fd);
    if (n <= 0) return 0;
    out[n] = 0;
    return (size_t)n;
}

/* One file's first line; "" when it cannot be read. */
static void read_line(const char *path, char *out, size_t cap) {
    read_text(path, out, cap);
    out[strcspn(out, "\n")] = 0;
}

/* The kernel's view of each interface: the NIC itself, whichever stack drives it. */
static void kernel_links(void) {
    DIR *d = opendir("/sys/class/net");
    if (!d) { body_add("kernel_links=unreadable (%s)\n", strerror(errno)); return; }
    static const char *const fields[] = {"operstate", "carrier", "address", "mtu", "speed"};
    static const char *const counters[] = {"rx_bytes", "rx_packets", "rx_errors", "rx_dropped",
                                           "tx_bytes", "tx_packets", "tx_errors", "tx_dropped"};
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) && n < DBG_IFACES_MAX) {
        if (e->d_name[0] == '.' || strlen(e->d_name) > 32) continue;
        n++;
        body_add("link %s:", e->d_name);
        char path[128], v[64];
        for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
            snprintf(path, sizeof path, "/sys/class/net/%.32s/%s", e->d_name, fields[i]);
            read_line(path, v, sizeof v);
            if (v[0]) body_add(" %s=%s", fields[i], v);
        }
        for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++) {
            snprintf(path, sizeof path, "/sys/class/net/%.32s/statistics/%s", e->d_name, counters[i]);
            read_line(path, v, sizeof v);
            if (v[0]) body_add(" %s=%s", counters[i], v);
        }
        body_add("\n");
    }
    closedir(d);
}

static int diag_net(srv *s, const proto_line *l, const srv_debug_io *io) {
    (void)l, (void)io;
    const kiln_config *c = &s->cfg;
    net_stack *net = s->env.net;
    char addr[64] = "";
    net_address(net, addr, sizeof addr);
    body_add("driver=%s\naddress=%s\n", net_driver_name(net), addr);
    if (c->net.driver != CFG_DRIVER_HOST)
        body_add("interface=%s\nconfigured_address=%s\ngateway=%s\nmac=%s\n", c->net.interface,
                 c->net.address, c->net.gateway, c->net.mac[0] ? c->net.mac : "(generated)");
    body_add("listen=%s:%d\nmetrics_port=%d\nconnections=%d\n", c->net.listen_host, c->net.listen_port,
             c->net.metrics_port, net_open_conns(net));
    net_counters k;
    if (net_stats(net, &k) == 0)
        body_add("tcp_segs_in=%llu\ntcp_segs_out=%llu\ntcp_retransmits=%llu\ntcp_resets_out=%llu\n"
                 "tcp_in_errors=%llu\ntcp_syns=%llu\ntcp_accept_refused=%llu\nlink_rx_frames=%llu\n"
                 "link_tx_frames=%llu\nlink_rx_no_pbuf=%llu\nlink_rx_bad=%llu\nlink_tx_drops=%llu\n"
                 "mem_errors=%llu\n",
                 (unsigned long long)k.tcp_segs_in, (unsigned long long)k.tcp_segs_out,
                 (unsigned long long)k.tcp_retransmits, (unsigned long long)k.tcp_resets_out,
                 (unsigned long long)k.tcp_in_errors, (unsigned long long)k.tcp_syns,
                 (unsigned long long)k.tcp_accept_refused, (unsigned long long)k.link_rx_frames,
                 (unsigned long long)k.link_tx_frames, (unsigned long long)k.link_rx_no_pbuf,
                 (unsigned long long)k.link_rx_bad, (unsigned long long)k.link_tx_drops,
                 (unsigned long long)k.mem_errors);
    kernel_links();
    return 0;
}

/* ------------------------------------------------------------------ kmsg */

static struct {
    char line[DBG_KMSG_MAX][DBG_KMSG_LINE];
} kring;

/* One /dev/kmsg record ("prio,seq,usec,flags;text\n" then " KEY=value" lines) as
 * "[seconds] text"; 0, or -1 when it is not one. */
static int kmsg_format(const char *rec, size_t n, char *out, size_t cap) {
    const char *semi = memchr(rec, ';', n);
    if (!semi) return -1;
    unsigned long long usec = 0;
    int field = 0;
    for (const char *p = rec; p < semi; p++) { /* the third field is the time */
        if (*p == ',') { field++; continue; }
        if (field == 2 && *p >= '0' && *p <= '9') usec = usec * 10 + (unsigned)(*p - '0');
    }
    const char *text = semi + 1, *end = memchr(text, '\n', (size_t)(rec + n - text));
    if (!end) end = rec + n;
    int len = (int)(end - text);
    snprintf(out, cap, "[%llu.%06llu] %.*s", usec / 1000000, usec % 1000000, len, text);
    for (char *p = out; *p; p++) /* the kernel escapes most; keep the body's lines whole */
        if ((unsigned char)*p < 0x20) *p = ' ';
    return 0;
}

static int diag_kmsg(srv *s, const proto_line *l, const srv_debug_io *io) {
    (void)s;
    const proto_str *ls = proto_get(l, "lines");
    int want = DBG_KMSG_DEFAULT;
    if (ls && (want = (int)small_num(ls, 1, DBG_KMSG_MAX)) < 0) {
        io->err(io->ud, 400, "bad_request", "lines=1..400");
        return -1;
    }
    int fd = open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        char msg[128];
        snprintf(msg, sizeof msg, "the kernel log is not readable: /dev/kmsg: %s", strerror(errno));
        io->err(io->ud, 503, "unavailable", msg);
        return -1;
    }
    long total = 0;
    char rec[8192];
    for (int i = 0; i < DBG_KMSG_READS; i++) {
        ssize_t n = read(fd, rec, sizeof rec);
        if (n < 0 && errno == EPIPE) continue; /* overwritten while we read: the next one */
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;                     /* EAGAIN: the end of the buffer */
        if (kmsg_format(rec, (size_t)n, kring.line[total % DBG_KMSG_MAX], DBG_KMSG_LINE) == 0) total++;
    }
    close(fd);
    long first = total > want ? total - want : 0;
    body_add("# the last %ld of %ld kernel log lines\n", total - first, total);
    for (long i = first; i < total; i++) body_add("%s\n", kring.line[i % DBG_KMSG_MAX]);
    return 0;
}

/* ------------------------------------------------------------------ gpu */

static void nvidia_proc(void) {
    char v[256];
    read_line("/proc/driver/nvidia/version", v, sizeof v);
    if (!v[0]) { body_add("nvidia_driver=not loaded (no /proc/driver/nvidia)\n"); return; }
    body_add("nvidia_driver=%s\n", v);
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    struct dirent *e;
    for (int n = 0; d && (e = readdir(d)) && n < DBG_IFACES_MAX;) {
        if (e->d_name[0] == '.' || strlen(e->d_name) > 32) continue;
        n++;
        char path[128];
        snprintf(path, sizeof path, "/proc/driver/nvidia/gpus/%.32s/information", e->d_name);
        char info[2048];
        if (!read_text(path, info, sizeof info)) continue;
        for (char *line = strtok(info, "\n"); line; line = strtok(NULL, "\n"))
            body_add("gpu %s: %s\n", e->d_name, line);
    }
    if (d) closedir(d);
}

static int diag_gpu(srv *s, const proto_line *l, const srv_debug_io *io) {
    (void)l, (void)io;
    backend *be = s->env.be;
    body_add("backend=%s\n", be->ops->name);
    if (!strcmp(be->ops->name, "cpu")) {
        body_add("simd=%s\n", isa_name(isa_level()));
    } else {
        char desc[256];
        backend_cuda_describe(be, desc, sizeof desc);
        body_add("device=%s\n", desc);
    }
    body_add("cuda_built=%d\n", backend_cuda_built());
    if (srv_backend_note(s)[0]) body_add("note=%s\n", srv_backend_note(s));
    nvidia_proc();
    return 0;
}

/* ------------------------------------------------------------------ probe */

/* The probes in flight, each with whom to answer. A host name is looked up first
 * (net_resolve), then its address probed in the time left. */
static struct dbg_probe {
    srv *s;
    int id;                /* net_probe's, or 0 */
    int lookup;            /* net_resolve's while the name is looked up, or 0 */
    srv_debug_io io;
    char host[NET_NAME_MAX + 1];
    char addr[INET_ADDRSTRLEN]; /* what host is (itself when an address) */
    int port, timeout_ms;
    double dns_ms;         /* the lookup's time; < 0: none (host was an address) */
} probes[DBG_PROBES];

static int probe_busy(const struct dbg_probe *p) { return p->id || p->lookup; }

/* The answer line, then the request is done. */
static void probe_answer(struct dbg_probe *p, const char *result, const char *msg, double ms) {
    srv *s = p->s;
    srv_debug_io io = p->io;
    char line[512], dns[32] = "";
    if (p->dns_ms >= 0) snprintf(dns, sizeof dns, " dns_ms=%.1f", p->dns_ms);
    int n = snprintf(line, sizeof line, "DEBUG probe host=%s%s%s port=%d result=%s ms=%.1f%s", p->host,
                     p->addr[0] ? " addr=" : "", p->addr, p->port, result, ms, dns);
    if (msg && n > 0 && (size_t)n < sizeof line) snprintf(line + n, sizeof line - (size_t)n, " msg=\"%s\"", msg);
    srv_log(s, CFG_LOG_WARN, "debug: probe %s:%d: %s%s%s", p->host, p->port, result, msg ? ": " : "", msg ? msg : "");
    p->id = p->lookup = 0;
    io.line(io.ud, line);
    if (io.done) io.done(io.ud);
    srv_flush_dirty(s); /* not after a read or a step: nothing else would flush it now */
}

static void on_probe(void *ud, int result, double ms) {
    struct dbg_probe *p = ud;
    const char *what = result == 0 ? "connected" : result == -ECONNREFUSED ? "refused"
                       : result == -ETIMEDOUT ? "timeout"
                       : result == -EHOSTUNREACH || result == -ENETUNREACH ? "unreachable" : NULL;
    p->id = 0;
    if (p->dns_ms >= 0) ms += p->dns_ms; /* the whole probe's time, the lookup's included */
    probe_answer(p, what ? what : "error", what ? NULL : strerror(-result), ms);
}

static void on_resolved(void *ud, int result, const char *ipv4, double ms) {
    struct dbg_probe *p = ud;
    p->lookup = 0, p->dns_ms = ms;
    if (result < 0) {
        probe_answer(p, "unresolved", result == -ENOENT ? "no such name (or no answer)"
                                      : result == -ENETUNREACH ? "no DNS server (none in [net] dns, none from DHCP)"
                                      : strerror(-result), ms);
        return;
    }
    snprintf(p->addr, sizeof p->addr, "%s", ipv4);
    int left = p->timeout_ms - (int)ms;
    int id = net_probe(p->s->env.net, p->addr, p->port, left > 100 ? left : 100, on_probe, p);
    if (id <= 0) probe_answer(p, "error", strerror(-id), ms);
    else p->id = id;
}

/* host=A.B.C.D|NAME port=N [timeout_ms=T]: 1 when started (the answer comes later), -1
 * when it answered with an error. */
static int diag_probe(srv *s, const proto_line *l, const srv_debug_io *io) {
    const proto_str *h = proto_get(l, "host"), *pt = proto_get(l, "port"), *t = proto_get(l, "timeout_ms");
    struct in_addr a;
    long port = pt ? small_num(pt, 1, 65535) : -1;
    long ms = t ? small_num(t, 100, DBG_PROBE_MAX_MS) : DBG_PROBE_DEFAULT_MS;
    if (!h || h->len == 0 || h->len >= sizeof probes[0].host || port < 0 || ms < 0) {
        io->err(io->ud, 400, "bad_request",
                "DEBUG probe host=A.B.C.D|NAME port=1..65535 [timeout_ms=100..10000]");
        return -1;
    }
    struct dbg_probe *p = NULL;
    for (int i = 0; i < DBG_PROBES && !p; i++)
        if (!probe_busy(&probes[i])) p = &probes[i];
    if (!p) {
        io->err(io->ud, 429, "too_many", "4 probes are in flight: wait for one");
        return -1;
    }
    *p = (struct dbg_probe){.s = s, .io = *io, .port = (int)port, .timeout_ms = (int)ms, .dns_ms = -1};
    snprintf(p->host, sizeof p->host, "%s", h->s);
    int literal = inet_pton(AF_INET, h->s, &a) == 1, id;
    if (literal) {
        snprintf(p->addr, sizeof p->addr, "%s", h->s);
        if ((id = net_probe(s->env.net, h->s, (int)port, (int)ms, on_probe, p)) > 0) p->id = id;
    } else if ((id = net_resolve(s->env.net, h->s, (int)ms, on_resolved, p)) > 0) {
        p->lookup = id;
    }
    if (id <= 0) {
        io->err(io->ud, id == -EBUSY ? 429 : id == -EINVAL ? 400 : 500,
                id == -EBUSY ? "too_many" : id == -EINVAL ? "bad_request" : "internal",
                id == -EBUSY ? "the stack's probes or lookups are all in flight: wait for one"
                : id == -EINVAL ? "DEBUG probe: host is neither an IPv4 unicast address nor a host name"
                                : strerror(-id));
        return -1;
    }
    return 1;
}

void srv_debug_forget(srv *s, void *ud) {
    for (int i = 0; i < DBG_PROBES; i++) {
        struct dbg_probe *p = &probes[i];
        if (!probe_busy(p) || p->s != s || p->io.ud != ud) continue;
        if (p->id) net_probe_cancel(s->env.net, p->id);
        if (p->lookup) net_resolve_cancel(s->env.net, p->lookup);
        p->id = p->lookup = 0;
    }
}

/* ------------------------------------------------------------------ dispatch */

/* The diagnostics, each run only while the window is open; a new one is a new row.
 * fn builds the body (0), has answered with an error (-1), or answers later (1). */
static const struct {
    const char *name;
    int (*fn)(srv *s, const proto_line *l, const srv_debug_io *io);
} diags[] = {
    {"net", diag_net},
    {"kmsg", diag_kmsg},
    {"gpu", diag_gpu},
    {"probe", diag_probe},
};

int srv_debug(srv *s, const proto_line *l, const char *who, const srv_debug_io *io) {
    srv_debug_sweep(s);
    const char *sub = l->n_pos ? l->pos[0].s : "";
    if (!sub[0] || !strcmp(sub, "status")) { window_line(s, io); return 0; }
    if (!strcmp(sub, "open")) { window_open(s, l, who, io); return 0; }
    if (!strcmp(sub, "close")) { window_close(s, who, io); return 0; }
    size_t i = 0, n = sizeof diags / sizeof diags[0];
    while (i < n && strcmp(sub, diags[i].name)) i++;
    if (i == n || l->n_pos > 1) { io->err(io->ud, 400, "bad_request", dbg_usage); return 0; }
    if (!window_left_ms(s)) {
        io->err(io->ud, 403, "debug_closed", "the debug window is closed: DEBUG open [minutes=N] first");
        return 0;
    }
    srv_log(s, CFG_LOG_WARN, "debug: %s ran %s", who, sub);
    body_reset();
    int r = diags[i].fn(s, l, io);
    if (r == 0) io->body(io->ud, body.buf, body.len);
    return r == 1;
}
