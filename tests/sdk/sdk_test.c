/* sdk_test: libkiln (sdk/c/kiln.h) against a running kilnd.
 *
 * sdk_test --hosts h:p[,h:p...] --ca ca.crt --token T --admin-token A
 *          --expect-text-file F --prompt P --max-tokens N [--wrong-ca other-ca.crt]
 *          [--server-name NAME]
 *
 * Prints "ok   name" or "FAIL name: detail" per check; exit status 0 only if all passed.
 * Checks: greedy generate matches F; failover past a box that is down, and back to it
 * once it returns; 503 retried then
 * reported, and retried until the server recovers; cancel frees the sequence and its KV
 * blocks; 8 requests in flight on one connection; n=2 samples; wrong CA and wrong token
 * fail fast and clearly; a user token gets 403 for an admin verb; HEALTH and METRICS;
 * raw streams (kiln_raw_*): HTTP over TLS to kilnd, plain TCP to a local peer, and
 * KILN_EINVAL on a line-protocol client. */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kiln.h"

static const char *hosts, *ca, *token, *admin_token, *expect_file, *prompt, *wrong_ca,
    *server_name;
static int max_tokens = 24, failures;

static void ok(const char *name) {
    printf("ok   %s\n", name);
    fflush(stdout);
}

static void fail(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(const char *name, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL %s: ", name);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    failures++;
}

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------------ helpers */

static int retry_count, retry_status;
static void count_retry(void *ud, int status, int attempt, int delay_ms, const char *msg) {
    (void)ud, (void)attempt, (void)delay_ms, (void)msg;
    retry_count++;
    retry_status = status;
}

static void opts(kiln_options *o, const char *h, const char *tok, int retries) {
    kiln_options_init(o);
    o->hosts = h;
    o->token = tok;
    o->ca_file = ca;
    o->server_name = server_name;
    o->connect_timeout_ms = 5000;
    o->io_timeout_ms = 5000;
    o->retries = retries;
    o->backoff_ms = 100;
    o->backoff_max_ms = 1000;
    o->on_retry = count_retry;
}

static kiln_client *open_as(const char *tok, int retries, kiln_error *err) {
    kiln_options o;
    opts(&o, hosts, tok, retries);
    return kiln_connect(&o, err);
}

typedef struct {
    char text[8192];
    size_t len;
    int tokens;
} textbuf;

static int collect(void *ud, const char *text, size_t len, int sample, int token_id,
                   double logprob) {
    textbuf *t = ud;
    (void)sample, (void)token_id, (void)logprob;
    if (t->len + len < sizeof t->text) {
        memcpy(t->text + t->len, text, len);
        t->len += len;
        t->text[t->len] = '\0';
    }
    t->tokens++;
    return 0;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

static void greedy(kiln_gen *p) {
    kiln_gen_init(p);
    p->prompt = prompt;
    p->chat = 1;
    p->temperature = 0;
    p->max_tokens = max_tokens;
}

/* ------------------------------------------------------------------ 1. greedy */

static void t_greedy(void) {
    const char *name = "greedy generate matches kilnd generate";
    kiln_error e;
    const char *want = read_file(expect_file);
    kiln_client *c = open_as(token, 2, &e);
    if (!want || !c) {
        fail(name, "%s", !want ? "cannot read the expected text" : e.message);
        kiln_close(c);
        return;
    }
    kiln_gen p;
    greedy(&p);
    textbuf t = {.len = 0};
    kiln_usage u;
    int r = kiln_generate(c, &p, collect, &t, &u, &e);
    if (r)
        fail(name, "status %d: %s", r, e.message);
    else if (strcmp(t.text, want))
        fail(name, "got \"%s\", want \"%s\"", t.text, want);
    else if (u.completion_tokens <= 0 || !u.reason[0])
        fail(name, "usage missing: reason '%s' completion %ld", u.reason, u.completion_tokens);
    else
        ok(name);
    const char *n2 = "HELLO reply readable";
    if (strcmp(kiln_role(c), "user") || kiln_ctx(c) <= 0 || !kiln_model(c)[0])
        fail(n2, "role '%s' ctx %ld model '%s'", kiln_role(c), kiln_ctx(c), kiln_model(c));
    else
        ok(n2);
    kiln_close(c);
}

/* ------------------------------------------------------------------ 1b. messages */

static void t_conversation(void) {
    const char *name = "msgs: one user message is the chat prompt";
    kiln_error e;
    const char *want = read_file(expect_file);
    kiln_client *c = open_as(token, 2, &e);
    if (!want || !c) {
        fail(name, "%s", !want ? "cannot read the expected text" : e.message);
        kiln_close(c);
        return;
    }
    kiln_gen p;
    greedy(&p);
    kiln_msg one[1] = {{"user", prompt}};
    p.prompt = NULL, p.chat = -1; /* msgs send chat=1 themselves */
    p.msgs = one, p.n_msgs = 1;
    textbuf t = {.len = 0};
    kiln_usage u1, u3;
    int r = kiln_generate(c, &p, collect, &t, &u1, &e);
    if (r)
        fail(name, "status %d: %s", r, e.message);
    else if (strcmp(t.text, want))
        fail(name, "got \"%s\", want \"%s\"", t.text, want);
    else
        ok(name);

    const char *n2 = "msgs: the earlier turns reach the template";
    kiln_msg three[3] = {{"user", "Remember the word otter."}, {"assistant", "Noted: otter."}, {"user", prompt}};
    p.msgs = three, p.n_msgs = 3, p.max_tokens = 0;
    r = kiln_generate(c, &p, NULL, NULL, &u3, &e);
    if (r || u3.prompt_tokens <= u1.prompt_tokens)
        fail(n2, "status %d (%s): prompt_tokens %ld vs %ld", r, e.message, u3.prompt_tokens, u1.prompt_tokens);
    else
        ok(n2);

    const char *n3 = "msgs: a conversation ending with assistant is 400";
    p.n_msgs = 2;
    r = kiln_generate(c, &p, NULL, NULL, NULL, &e);
    if (r != 400 || !strstr(e.message, "last message"))
        fail(n3, "%d: %s", r, e.message);
    else
        ok(n3);

    const char *n4 = "msgs: with prompt, a bad role or chat 0: KILN_EINVAL";
    kiln_msg bad[1] = {{"tool", "x"}};
    int bad_n = 0;
    p.n_msgs = 1, p.prompt = prompt;
    bad_n += kiln_submit(c, &p, NULL, NULL, &e) == 0 && e.code == KILN_EINVAL;
    p.prompt = NULL, p.msgs = bad;
    bad_n += kiln_submit(c, &p, NULL, NULL, &e) == 0 && e.code == KILN_EINVAL;
    p.msgs = one, p.chat = 0;
    bad_n += kiln_submit(c, &p, NULL, NULL, &e) == 0 && e.code == KILN_EINVAL;
    if (bad_n != 3)
        fail(n4, "%d of 3 refused (%s)", bad_n, e.message);
    else
        ok(n4);
    kiln_close(c);
}

/* ------------------------------------------------------------------ 2. failover */

static void t_failover(void) {
    const char *name = "failover past a box that is down";
    char list[1024];
    snprintf(list, sizeof list, "127.0.0.1:1,%s", hosts);
    kiln_options o;
    opts(&o, list, token, 0);
    kiln_error e;
    kiln_client *c = kiln_connect(&o, &e);
    if (!c) {
        fail(name, "connect: %d %s", e.code, e.message);
        return;
    }
    kiln_health_info h;
    int r = kiln_health(c, &h, &e);
    if (!strcmp(kiln_server(c), "127.0.0.1:1") || r)
        fail(name, "server %s, health %d %s", kiln_server(c), r, e.message);
    else
        ok(name);
    kiln_close(c);
}

/* ------------------------------------------------------------------ 2b. back home */

/* A box that comes back: a TCP relay on a port of ours to the real server (the same
 * address, so its certificate holds), accepting only once `open` is set. It counts the
 * connections it carried. */
typedef struct {
    int lfd, open, stop, carried;
    struct sockaddr_in to;
} relay;

static void relay_pipe(int a, int b, const int *stop) {
    struct pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    char buf[16384];
    while (!*stop && poll(p, 2, 100) >= 0)
        for (int i = 0; i < 2; i++) {
            if (!p[i].revents)
                continue;
            ssize_t n = read(p[i].fd, buf, sizeof buf);
            if (n <= 0 || write(p[1 - i].fd, buf, (size_t)n) != n)
                return;
        }
}

static void *relay_main(void *arg) {
    relay *r = arg;
    while (!r->stop) {
        int c = accept(r->lfd, NULL, NULL);
        if (c < 0)
            continue;
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (s >= 0 && connect(s, (struct sockaddr *)&r->to, sizeof r->to) == 0) {
            r->carried++;
            relay_pipe(c, s, &r->stop); /* one connection at a time is all the test needs */
        }
        if (s >= 0)
            close(s);
        close(c);
    }
    return NULL;
}

/* A port nobody listens on (bound, then left), for the relay to open later. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &l)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

static void t_back_home(void) {
    const char *name = "a connection that failed over goes back to its box when it returns";
    int port = free_port(), rport = 0;
    relay r = {.lfd = -1};
    if (port < 0 || sscanf(hosts, "127.0.0.1:%d", &rport) != 1 || strchr(hosts, ',')) {
        printf("SKIP %s (needs one 127.0.0.1 box in --hosts)\n", name);
        return;
    }
    r.to = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)rport),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char list[1024], first[64];
    snprintf(first, sizeof first, "127.0.0.1:%d", port);
    snprintf(list, sizeof list, "%s,%s", first, hosts);
    kiln_options o;
    opts(&o, list, token, 0);
    kiln_error e;
    kiln_client *c = kiln_connect(&o, &e); /* box 0 is down: its connection fails over */
    if (!c) {
        fail(name, "connect: %d %s", e.code, e.message);
        return;
    }
    /* the box comes back */
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    r.lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(r.lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    pthread_t th;
    if (bind(r.lfd, (struct sockaddr *)&a, sizeof a) || listen(r.lfd, 4) ||
        pthread_create(&th, NULL, relay_main, &r)) {
        fail(name, "relay on port %d: %s", port, strerror(errno));
        close(r.lfd);
        kiln_close(c);
        return;
    }
    /* past the first backoff (1 s), sequential requests reach box 0 again */
    int home = 0, done = 0;
    for (long long end = now_ms() + 8000; now_ms() < end && home < 2; done++) {
        usleep(300 * 1000);
        kiln_health_info h;
        if (kiln_health(c, &h, &e) == 0 && !strcmp(kiln_server(c), first))
            home++;
    }
    if (home < 2 || r.carried < 1)
        fail(name, "%d of %d requests on the returned box, %d connections relayed", home, done, r.carried);
    else
        ok(name);
    kiln_close(c);
    r.stop = 1;
    shutdown(r.lfd, SHUT_RDWR);
    pthread_join(th, NULL);
    close(r.lfd);
}

/* ------------------------------------------------------------------ 3. 503 retry */

static int ladder(int level) {
    kiln_error e;
    kiln_client *a = open_as(admin_token, 2, &e);
    if (!a)
        return e.code ? e.code : -1;
    char cmd[32], reply[128], want[32];
    snprintf(cmd, sizeof cmd, "LADDER level=%d", level);
    snprintf(want, sizeof want, "LADDER level=%d ", level); /* then name=, pinned= ... */
    int r = kiln_command(a, cmd, reply, sizeof reply, &e);
    kiln_close(a);
    return r ? r : strncmp(reply, want, strlen(want)) ? -100 : 0;
}

static void t_retry(void) {
    const char *n1 = "503 retried after retry_after_ms, then reported";
    const char *n2 = "503 retried until the server recovers";
    int r = ladder(3);
    if (r) {
        fail(n1, "LADDER level=3: %d", r);
        return;
    }
    kiln_error e;
    kiln_gen p;
    greedy(&p);
    p.max_tokens = 4;

    kiln_client *c = open_as(token, 1, &e);
    retry_count = 0;
    long long t0 = now_ms();
    r = c ? kiln_generate(c, &p, NULL, NULL, NULL, &e) : e.code;
    long long dt = now_ms() - t0;
    if (r != 503 || retry_count != 1 || retry_status != 503 || dt < 450)
        fail(n1, "status %d (%s), %d retries, %lld ms", r, e.message, retry_count, dt);
    else
        ok(n1);
    kiln_close(c);

    /* A child turns shedding off 700 ms from now; meanwhile the GEN keeps getting 503
     * and is retried every retry_after_ms (500). The child uses only its own client. */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        usleep(700 * 1000);
        _exit(ladder(0) ? 1 : 0);
    }
    c = open_as(token, 5, &e);
    retry_count = 0;
    textbuf t = {.len = 0};
    r = c ? kiln_generate(c, &p, collect, &t, NULL, &e) : e.code;
    int st = 0;
    if (pid > 0)
        waitpid(pid, &st, 0);
    if (pid < 0 || r || retry_count < 1 || t.tokens < 1)
        fail(n2, "status %d (%s), %d retries, %d tokens, child %d", r, e.message,
             retry_count, t.tokens, st);
    else
        ok(n2);
    kiln_close(c);
    if (ladder(0))
        fail("LADDER level=0 at the end", "failed");
}

/* ------------------------------------------------------------------ 4. cancel */

typedef struct {
    int tokens, ends, status;
    char reason[16];
} track;

static int track_tok(void *ud, const char *text, size_t len, int sample, int token_id,
                     double logprob) {
    (void)text, (void)len, (void)sample, (void)token_id, (void)logprob;
    ((track *)ud)->tokens++;
    return 0;
}

static void track_end(void *ud, int sample, int status, const kiln_usage *u,
                      const char *msg) {
    track *t = ud;
    (void)sample, (void)msg;
    t->ends++;
    t->status = status;
    snprintf(t->reason, sizeof t->reason, "%s", u->reason);
}

static void t_cancel(void) {
    const char *name = "cancel ends the request and frees its KV blocks";
    kiln_error e;
    kiln_client *c = open_as(token, 0, &e);
    if (!c) {
        fail(name, "connect: %s", e.message);
        return;
    }
    kiln_gen p;
    kiln_gen_init(&p);
    p.prompt = "Count from one to one thousand:";
    p.max_tokens = 400;
    p.ignore_eos = 1;
    track t = {0};
    kiln_callbacks cb = {track_tok, track_end};
    kiln_req h = kiln_submit(c, &p, &cb, &t, &e);
    long long end = now_ms() + 20000;
    while (h && t.tokens < 3 && !t.ends && now_ms() < end)
        if (kiln_pump(c, 100, &e) < 0)
            break;
    int cr = h ? kiln_cancel(c, h, &e) : -1;
    while (!cr && !t.ends && now_ms() < end)
        if (kiln_pump(c, 100, &e) < 0)
            break;
    if (!h || cr || t.ends != 1 || t.status || strcmp(t.reason, "cancelled")) {
        fail(name, "handle %llu cancel %d ends %d status %d reason '%s' (%s)",
             (unsigned long long)h, cr, t.ends, t.status, t.reason, e.message);
        kiln_close(c);
        return;
    }
    kiln_stats_info s;
    double running = -1, used = -1;
    for (end = now_ms() + 5000; now_ms() < end; usleep(100 * 1000)) {
        if (kiln_stats(c, &s, &e))
            break;
        running = kiln_stats_num(&s, "running", -1);
        used = kiln_stats_num(&s, "kv_blocks_used", -1);
        if (running == 0 && used == 0)
            break;
    }
    if (running != 0 || used != 0)
        fail(name, "running=%g kv_blocks_used=%g (%s)", running, used, e.message);
    else
        ok(name);
    kiln_close(c);
}

/* ------------------------------------------------------------------ 5. many in flight */

static void t_many(void) {
    const char *name = "8 requests in flight on one connection";
    kiln_error e;
    kiln_client *c = open_as(token, 2, &e);
    if (!c) {
        fail(name, "connect: %s", e.message);
        return;
    }
    static const char *const topics[8] = {"cats", "rivers", "bread", "stars",
                                          "trains", "music", "snow", "bees"};
    char prompts[8][64];
    track t[8];
    memset(t, 0, sizeof t);
    kiln_callbacks cb = {track_tok, track_end};
    int submitted = 0;
    for (int i = 0; i < 8; i++) {
        kiln_gen p;
        kiln_gen_init(&p);
        snprintf(prompts[i], sizeof prompts[i], "Write one sentence about %s.", topics[i]);
        p.prompt = prompts[i];
        p.chat = 1;
        p.max_tokens = 16;
        p.temperature = 0.7;
        p.seed = (uint64_t)i + 1;
        p.has_seed = 1;
        submitted += kiln_submit(c, &p, &cb, &t[i], &e) != 0;
    }
    int inflight = kiln_pending(c);
    for (long long end = now_ms() + 60000; kiln_pending(c) > 0 && now_ms() < end;)
        if (kiln_pump(c, 1000, &e) < 0)
            break;
    int good = 0;
    for (int i = 0; i < 8; i++)
        good += t[i].ends == 1 && t[i].status == 0 && t[i].tokens > 0 &&
                (!strcmp(t[i].reason, "stop") || !strcmp(t[i].reason, "length"));
    if (submitted != 8 || inflight != 8 || good != 8)
        fail(name, "submitted %d, in flight %d, ended well %d (%s)", submitted, inflight,
             good, e.message);
    else
        ok(name);

    /* n=2: two samples, one END each, one request. */
    const char *n2 = "n=2 gives two samples";
    kiln_gen p;
    greedy(&p);
    p.n = 2;
    p.max_tokens = 4;
    p.temperature = 0.8;
    kiln_usage u;
    int r = kiln_generate(c, &p, NULL, NULL, &u, &e);
    if (r || u.completion_tokens < 2)
        fail(n2, "status %d (%s) completion %ld", r, e.message, u.completion_tokens);
    else
        ok(n2);
    kiln_close(c);
}

/* ------------------------------------------------------------------ 5b. per host */

/* connections_per_host=3 to one box: three sessions, and nine requests in flight
 * spread three to each (the fewest in flight, ties in turn). */
static void t_per_host(void) {
    const char *name = "connections_per_host=3: 9 requests spread 3/3/3 over 3 connections";
    kiln_error e;
    kiln_options o;
    opts(&o, hosts, token, 2);
    o.connections_per_host = 3;
    kiln_client *c = kiln_connect(&o, &e);
    if (!c) {
        fail(name, "connect: %s", e.message);
        return;
    }
    track t[9];
    memset(t, 0, sizeof t);
    kiln_callbacks cb = {track_tok, track_end};
    long sessions[9];
    int submitted = 0;
    for (int i = 0; i < 9; i++) {
        kiln_gen p;
        greedy(&p);
        p.max_tokens = 4;
        submitted += kiln_submit(c, &p, &cb, &t[i], &e) != 0;
        sessions[i] = kiln_session(c); /* of the connection the request went to */
    }
    for (long long end = now_ms() + 60000; kiln_pending(c) > 0 && now_ms() < end;)
        if (kiln_pump(c, 1000, &e) < 0)
            break;
    int good = 0, distinct = 0, most = 0;
    for (int i = 0; i < 9; i++) {
        good += t[i].ends == 1 && t[i].status == 0 && t[i].tokens > 0;
        int same = 0, first = 1;
        for (int j = 0; j < 9; j++) {
            same += sessions[j] == sessions[i];
            if (j < i && sessions[j] == sessions[i])
                first = 0;
        }
        distinct += first;
        most = same > most ? same : most;
    }
    if (submitted != 9 || good != 9 || distinct != 3 || most != 3)
        fail(name, "submitted %d, ended well %d, sessions %d, most on one %d (%s)", submitted,
             good, distinct, most, e.message);
    else
        ok(name);
    kiln_close(c);

    const char *lim = "connections_per_host over 64 connections is refused";
    o.connections_per_host = 65;
    c = kiln_connect(&o, &e);
    if (c || e.code != KILN_EINVAL)
        fail(lim, "got %p code %d", (void *)c, e.code);
    else
        ok(lim);
    kiln_close(c);
}

/* ------------------------------------------------------------------ 6. bad inputs */

static void t_bad(void) {
    kiln_error e;
    kiln_options o;
    if (wrong_ca) {
        const char *name = "wrong CA: KILN_ETLS, certificate not trusted";
        opts(&o, hosts, token, 0);
        o.ca_file = wrong_ca;
        kiln_client *c = kiln_connect(&o, &e);
        if (c || e.code != KILN_ETLS || !strstr(e.message, "not trusted"))
            fail(name, "client %p code %d: %s", (void *)c, e.code, e.message);
        else
            ok(name);
        printf("     (%s)\n", e.message);
        kiln_close(c);
    }
    const char *name = "wrong token: 401 at once";
    opts(&o, hosts, "not-a-token-000000", 3);
    long long t0 = now_ms();
    kiln_client *c = kiln_connect(&o, &e);
    long long dt = now_ms() - t0;
    if (c || e.code != 401 || dt > 5500)
        fail(name, "client %p code %d in %lld ms: %s", (void *)c, e.code, dt, e.message);
    else
        ok(name);
    printf("     (%s)\n", e.message);
    kiln_close(c);

    const char *n3 = "admin verb with a user token: 403";
    c = open_as(token, 0, &e);
    char reply[128];
    int r = c ? kiln_command(c, "LADDER level=0", reply, sizeof reply, &e) : e.code;
    if (r != 403)
        fail(n3, "%d: %s", r, e.message);
    else
        ok(n3);

    const char *n4 = "bad GEN parameter: 400 through on_end";
    kiln_gen p;
    greedy(&p);
    p.top_p = 5;
    r = c ? kiln_generate(c, &p, NULL, NULL, NULL, &e) : e.code;
    if (r != 400 || !strstr(e.message, "top_p"))
        fail(n4, "%d: %s", r, e.message);
    else
        ok(n4);
    kiln_close(c);
}

/* ------------------------------------------------------------------ 7. verbs */

static void t_verbs(void) {
    kiln_error e;
    kiln_client *c = open_as(token, 0, &e);
    if (!c) {
        fail("health", "connect: %s", e.message);
        return;
    }
    kiln_health_info h;
    int r = kiln_health(c, &h, &e);
    if (r || h.live != 1 || h.ready != 1)
        fail("health live=1 ready=1", "%d live %d ready %d (%s)", r, h.live, h.ready,
             e.message);
    else
        ok("health live=1 ready=1");
    size_t len = 0;
    char *m = kiln_metrics(c, &len, &e);
    if (!m || !strstr(m, "kiln_generation_tokens_total") || strlen(m) != len)
        fail("metrics", "%s", m ? "kiln_generation_tokens_total missing" : e.message);
    else
        ok("metrics has kiln_generation_tokens_total");
    free(m);
    kiln_close(c);
}

/* ------------------------------------------------------------------ 8. raw streams */

/* Reads into buf until want appears, the peer closes, or 5 s pass. The last code. */
static long raw_until(kiln_client *c, char *buf, size_t cap, const char *want,
                      kiln_error *e) {
    size_t len = 0;
    long n = 0;
    long long end = now_ms() + 5000;
    buf[0] = '\0';
    while (len + 1 < cap && !strstr(buf, want) && now_ms() < end) {
        n = kiln_raw_read(c, buf + len, cap - 1 - len, 200, e);
        if (n < 0)
            break;
        len += (size_t)n;
        buf[len] = '\0';
    }
    return n;
}

static void t_raw(void) {
    kiln_error e;
    kiln_options o;
    char buf[4096] = "";
    /* TLS: HTTP/1.1 to kilnd's OpenAI API on the same port, token in a header */
    const char *n1 = "raw TLS: GET /v1/models answers HTTP/1.1 200";
    opts(&o, hosts, NULL, 0);
    o.connections_per_host = 4; /* not read: a raw client is one connection */
    kiln_client *c = kiln_raw_open(&o, 0, &e);
    if (!c) {
        fail(n1, "open: %d %s", e.code, e.message);
    } else {
        char req[512];
        int l = snprintf(req, sizeof req, "GET /v1/models HTTP/1.1\r\nHost: kiln\r\n"
                         "Authorization: Bearer %s\r\n\r\n", token);
        int r = kiln_raw_write(c, req, (size_t)l, &e);
        if (!r)
            raw_until(c, buf, sizeof buf, "\r\n\r\n", &e);
        if (r || strncmp(buf, "HTTP/1.1 200", 12))
            fail(n1, "%d %s: '%.80s'", r, e.message, r ? "" : buf);
        else
            ok(n1);
        /* after a hangup the next write reconnects */
        kiln_raw_hangup(c);
        r = kiln_raw_write(c, req, (size_t)l, &e);
        if (!r)
            raw_until(c, buf, sizeof buf, "\r\n\r\n", &e);
        if (r || strncmp(buf, "HTTP/1.1 200", 12) || !kiln_connected(c))
            fail("raw TLS: a write after a hangup reconnects", "%d %s", r, e.message);
        else
            ok("raw TLS: a write after a hangup reconnects");
        kiln_close(c);
    }

    /* plain TCP to a local peer that answers "pong" to "ping" and closes */
    const char *n2 = "raw plain TCP: ping, pong, then KILN_ECLOSED";
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1) ||
        getsockname(ls, (struct sockaddr *)&a, &al)) {
        fail(n2, "listen failed");
        if (ls >= 0)
            close(ls);
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        int s = accept(ls, NULL, NULL);
        char in[8];
        size_t got = 0;
        while (s >= 0 && got < 4) {
            ssize_t k = read(s, in + got, 4 - got);
            if (k <= 0)
                break;
            got += (size_t)k;
        }
        if (got == 4 && !memcmp(in, "ping", 4) && write(s, "pong", 4) != 4)
            _exit(1);
        _exit(0); /* closes s */
    }
    close(ls);
    char hp[64];
    snprintf(hp, sizeof hp, "127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    kiln_options_init(&o);
    o.hosts = hp; /* no token, no CA: plain */
    o.retries = 0;
    o.io_timeout_ms = 5000;
    c = kiln_raw_open(&o, 1, &e);
    int r = c ? kiln_raw_write(c, "ping", 4, &e) : e.code;
    long last = r ? r : raw_until(c, buf, sizeof buf, "pong", &e);
    if (!r && strstr(buf, "pong")) { /* then the peer's close */
        long long end = now_ms() + 5000;
        do
            last = kiln_raw_read(c, buf, sizeof buf, 200, &e);
        while (last == 0 && now_ms() < end);
    }
    if (r || strcmp(buf, "pong") || last != KILN_ECLOSED)
        fail(n2, "%d, read '%.20s', then %ld: %s", r, buf, last, e.message);
    else
        ok(n2);
    kiln_close(c);
    if (pid > 0)
        waitpid(pid, NULL, 0);

    /* the raw calls refuse a line-protocol client */
    const char *n3 = "raw write on a kiln_connect client: KILN_EINVAL";
    c = open_as(token, 0, &e);
    r = c ? kiln_raw_write(c, "x", 1, &e) : e.code;
    if (r != KILN_EINVAL)
        fail(n3, "%d: %s", r, e.message);
    else
        ok(n3);
    kiln_close(c);
}

static int usage(void) {
    fprintf(stderr, "usage: sdk_test --hosts h:p[,h:p...] --ca ca.crt --token T "
                    "--admin-token A --expect-text-file F --prompt P --max-tokens N "
                    "[--wrong-ca ca2.crt] [--server-name NAME]\n");
    return 2;
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--hosts")) hosts = v;
        else if (!strcmp(k, "--ca")) ca = v;
        else if (!strcmp(k, "--token")) token = v;
        else if (!strcmp(k, "--admin-token")) admin_token = v;
        else if (!strcmp(k, "--expect-text-file")) expect_file = v;
        else if (!strcmp(k, "--prompt")) prompt = v;
        else if (!strcmp(k, "--max-tokens")) max_tokens = atoi(v);
        else if (!strcmp(k, "--wrong-ca")) wrong_ca = v;
        else if (!strcmp(k, "--server-name")) server_name = v;
        else return usage();
    }
    if (argc % 2 != 1 || !hosts || !ca || !token || !admin_token || !expect_file || !prompt)
        return usage();
    t_greedy();
    t_conversation();
    t_failover();
    t_back_home();
    t_retry();
    t_cancel();
    t_many();
    t_per_host();
    t_bad();
    t_verbs();
    t_raw();
    printf("%s\n", failures ? "sdk_test: FAILED" : "sdk_test: all passed");
    return failures ? 1 : 0;
}
