/* libkiln sessions: options, the box list, connect with failover and HELLO, dropping a
 * broken connection, close, and the accessors of the HELLO reply. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "net/proto.h"

void kiln_options_init(kiln_options *o) {
    memset(o, 0, sizeof *o);
    o->connect_timeout_ms = 5000;
    o->io_timeout_ms = 30000;
    o->retries = 2;
    o->backoff_ms = 200;
    o->backoff_max_ms = 5000;
    o->connections_per_host = 1;
}

const char *kiln_strerror(int code) {
    switch (code) {
    case KILN_OK: return "ok";
    case KILN_ECONNECT: return "cannot connect";
    case KILN_ETLS: return "TLS error";
    case KILN_ETIMEOUT: return "timed out";
    case KILN_ECLOSED: return "connection closed";
    case KILN_EPROTO: return "protocol error";
    case KILN_EINVAL: return "invalid argument";
    case KILN_ENOMEM: return "out of memory";
    case 400: return "bad_request";
    case 401: return "unauthorized";
    case 403: return "forbidden";
    case 404: return "not_found";
    case 408: return "idle_timeout";
    case 409: return "duplicate_id";
    case 413: return "too_long";
    case 429: return "too_many";
    case 500: return "internal";
    case 501: return "not_implemented";
    case 503: return "unavailable";
    default: return code > 0 ? "server error" : "unknown error";
    }
}

/* ------------------------------------------------------------------ the box list */

static int parse_port(const char *s, size_t n, char out[8]) {
    if (n == 0 || n > 5)
        return -1;
    unsigned v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (unsigned)(s[i] - '0');
    }
    if (v == 0 || v > 65535)
        return -1;
    snprintf(out, 8, "%u", v);
    return 0;
}

/* One entry, s[0..n) with spaces trimmed: "host", "host:port", "[v6]", "[v6]:port",
 * or a bare IPv6 literal (more than one ':', default port). */
static int parse_box(const char *s, size_t n, kl_box *b, kiln_error *err) {
    const char *host = s, *port = NULL;
    size_t hn = n, pn = 0;
    if (n > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', n);
        if (!close)
            goto bad;
        host = s + 1;
        hn = (size_t)(close - host);
        size_t rest = n - (size_t)(close + 1 - s);
        if (rest > 0) {
            if (close[1] != ':')
                goto bad;
            port = close + 2;
            pn = rest - 1;
        }
    } else {
        const char *colon = memchr(s, ':', n);
        if (colon && !memchr(colon + 1, ':', n - (size_t)(colon + 1 - s))) {
            hn = (size_t)(colon - s);
            port = colon + 1;
            pn = n - hn - 1;
        }
    }
    if (hn == 0 || hn >= sizeof b->host)
        goto bad;
    memcpy(b->host, host, hn);
    b->host[hn] = '\0';
    if (port ? parse_port(port, pn, b->port) : (snprintf(b->port, 8, KL_DEFAULT_PORT), 0))
        goto bad;
    snprintf(b->name, sizeof b->name, "%.*s", (int)n, s);
    return 0;
bad:
    kl_err(err, KILN_EINVAL, "bad box \"%.*s\" in hosts (want host:port)", (int)(n > 200 ? 200 : n), s);
    return KILN_EINVAL;
}

static int parse_hosts(kl_one *c, kiln_error *err) {
    const char *s = c->s_hosts;
    int cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    c->boxes = calloc((size_t)cap, sizeof *c->boxes);
    if (!c->boxes) {
        kl_err(err, KILN_ENOMEM, "out of memory");
        return KILN_ENOMEM;
    }
    while (*s) {
        const char *end = strchr(s, ',');
        size_t n = end ? (size_t)(end - s) : strlen(s);
        const char *a = s;
        while (n > 0 && *a == ' ')
            a++, n--;
        while (n > 0 && a[n - 1] == ' ')
            n--;
        if (n > 0) {
            int r = parse_box(a, n, &c->boxes[c->n_boxes], err);
            if (r)
                return r;
            c->n_boxes++;
        }
        if (!end)
            break;
        s = end + 1;
    }
    if (c->n_boxes == 0) {
        kl_err(err, KILN_EINVAL, "no box in hosts");
        return KILN_EINVAL;
    }
    return 0;
}

/* ------------------------------------------------------------------ HELLO */

static int status_code(const proto_str *s) {
    if (!s || s->len != 3 || s->quoted)
        return 0;
    int v = 0;
    for (int i = 0; i < 3; i++) {
        if (s->s[i] < '0' || s->s[i] > '9')
            return 0;
        v = v * 10 + (s->s[i] - '0');
    }
    return v >= 100 ? v : 0;
}

/* "ERR <id> <code> <slug> [msg=...]" as an error: the code (or KILN_EPROTO). */
int kl_err_line(const proto_line *l, kiln_error *err) {
    int code = l->n_pos >= 2 ? status_code(&l->pos[1]) : 0;
    if (!code) {
        kl_err(err, KILN_EPROTO, "unreadable ERR line from the server");
        return KILN_EPROTO;
    }
    const proto_str *msg = proto_get(l, "msg");
    const char *slug = l->n_pos >= 3 ? l->pos[2].s : kiln_strerror(code);
    if (msg)
        kl_err(err, code, "%s: %s", slug, msg->s);
    else
        kl_err(err, code, "%s", slug);
    return code;
}

static long num_of(const proto_line *l, const char *key) {
    const proto_str *v = proto_get(l, key);
    return v ? strtol(v->s, NULL, 10) : 0;
}

static void copy_str(char *dst, size_t cap, const proto_str *v) {
    snprintf(dst, cap, "%s", v ? v->s : "");
}

static int hello_reply(kl_one *c, char *line, size_t len, kiln_error *err) {
    proto_line l;
    char perr[128];
    if (proto_split(line, len, &l, perr, sizeof perr)) {
        kl_err(err, KILN_EPROTO, "%s: bad HELLO reply: %s", c->server, perr);
        return KILN_EPROTO;
    }
    if (!strcmp(l.verb, "ERR"))
        return kl_err_line(&l, err);
    if (strcmp(l.verb, "OK") || l.n_pos < 1 || strcmp(l.pos[0].s, "kiln/1")) {
        kl_err(err, KILN_EPROTO, "%s: unexpected HELLO reply (%s)", c->server, l.verb);
        return KILN_EPROTO;
    }
    copy_str(c->model, sizeof c->model, proto_get(&l, "model"));
    copy_str(c->role, sizeof c->role, proto_get(&l, "role"));
    c->ctx = num_of(&l, "ctx");
    c->session = num_of(&l, "session");
    return 0;
}

static int hello(kl_one *c, int64_t deadline_ms, kiln_error *err) {
    size_t tl = strlen(c->o.token);
    size_t cap = 32 + PROTO_QUOTED_MAX(tl);
    char *buf = malloc(cap);
    if (!buf) {
        kl_err(err, KILN_ENOMEM, "out of memory");
        return KILN_ENOMEM;
    }
    int n = snprintf(buf, cap, "HELLO kiln/1 token=");
    int q = proto_quote(buf + n, cap - (size_t)n, c->o.token, tl);
    int r = q < 0 ? KILN_EINVAL : kl_tls_write(c, buf, (size_t)(n + q), deadline_ms, err);
    if (!r)
        r = kl_tls_write(c, "\n", 1, deadline_ms, err);
    free(buf);
    if (q < 0)
        kl_err(err, KILN_EINVAL, "token cannot be sent");
    if (r)
        return r;
    char *line;
    size_t len;
    r = kl_line(c, deadline_ms, &line, &len, err);
    if (r == 0) {
        kl_err(err, KILN_ETIMEOUT, "%s: no HELLO reply in time", c->server);
        return KILN_ETIMEOUT;
    }
    if (r < 0)
        return r;
    return hello_reply(c, line, len, err);
}

/* TCP + TLS + HELLO with one box. 0, or a code. */
static int open_box(kl_one *c, const kl_box *b, kiln_error *err) {
    int64_t deadline = kl_now_ms() + c->o.connect_timeout_ms;
    snprintf(c->server, sizeof c->server, "%s", b->name);
    c->conn_err = 0;
    int r = kl_tls_open(c, b, deadline, err);
    if (r)
        return r;
    r = c->raw ? 0 : hello(c, deadline, err);
    if (r) {
        char m[KILN_MSG_MAX];
        snprintf(m, sizeof m, "%s", err ? err->message : "");
        if (r > 0) {
            /* Keep the server's words (401 + msg) but say which box. */
            kl_err(err, r, "%s: %s", b->name, m);
        } else if ((r == KILN_ETLS || r == KILN_ECLOSED) && !c->o.cert_file) {
            /* With TLS 1.3 a server that wants a client certificate refuses it only
             * after our side of the handshake is done: the first read fails (often as
             * a bad MAC). Say what is the likely cause. */
            kl_err(err, r, "%s (right after the handshake: the server may require a "
                   "client certificate)", m);
        }
        kl_tls_close(c, 0);
        return r;
    }
    c->up = 1;
    c->broken = 0;
    return 0;
}

/* Errors worth trying the next box (or another round) for: the network, a box that
 * went away, or one that is overloaded. A wrong token or an untrusted certificate
 * would fail the same way everywhere, and must be seen at once. */
static int transient(int code) {
    return code == KILN_ECONNECT || code == KILN_ETIMEOUT || code == KILN_ECLOSED ||
           code == KILN_EPROTO || code == 503;
}

/* Drop a broken connection, or a draining one that owes no answer. */
static void settle_conn(kl_one *c) {
    if (c->up && c->broken)
        kl_drop(c, c->broke.code, c->broke.message);
    /* a draining box said GOAWAY: leave it once no answer is owed (requests waiting to
     * be retried stay, and go to the next box) */
    if (c->up && c->going_away && !kl_in_flight(c, 1))
        kl_drop(c, KILN_ECLOSED, "the box is draining");
}

int kl_ensure(kl_one *c, kiln_error *err) {
    settle_conn(c);
    if (c->up)
        return 0;
    kiln_error e = {KILN_ECONNECT, "no box"};
    int rounds = 1 + (c->o.retries > 0 ? c->o.retries : 0);
    for (int round = 0; round < rounds; round++) {
        if (round > 0) {
            int d = kl_backoff_ms(c, round);
            if (c->o.on_retry)
                c->o.on_retry(c->o.retry_ud, e.code, round, d, e.message);
            kl_sleep_ms(d);
        }
        for (int k = 0; k < c->n_boxes; k++) {
            int i = (c->first_box + k) % c->n_boxes;
            int r = open_box(c, &c->boxes[i], &e);
            if (!r) {
                c->box_i = i;
                return 0;
            }
            if (!transient(r)) {
                if (err)
                    *err = e;
                return r;
            }
        }
    }
    if (err)
        *err = e;
    return e.code;
}

void kl_drop(kl_one *c, int code, const char *msg) {
    /* The server's own reason ("ERR - 408 idle_timeout", "ERR - 413 too_long") beats
     * the bare close that followed it. */
    char m[KILN_MSG_MAX];
    if (c->conn_err) {
        code = c->conn_err;
        snprintf(m, sizeof m, "%s", c->conn_msg);
    } else {
        snprintf(m, sizeof m, "%s", msg ? msg : "");
    }
    kl_tls_close(c, 0);
    c->up = 0;
    c->broken = 0;
    c->conn_err = 0;
    c->going_away = 0;
    kl_buf_reset(c);
    kl_fail_all(c, code, m, 0);
}

/* ------------------------------------------------------------------ public */

static char *dup_opt(const char *s, int *fail) {
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *fail = 1;
    return d;
}

/* raw: no HELLO, so no token needed; plain: no TLS, so no CA either. */
static int check_options(const kiln_options *o, int raw, int plain, kiln_error *err) {
    if (!o || !o->hosts || !o->hosts[0]) {
        kl_err(err, KILN_EINVAL, "no hosts given");
        return KILN_EINVAL;
    }
    if (!raw && (!o->token || !o->token[0])) {
        kl_err(err, KILN_EINVAL, "no token given");
        return KILN_EINVAL;
    }
    if (!plain && (!o->ca_file || !o->ca_file[0])) {
        kl_err(err, KILN_EINVAL, "no CA file given (the server must be verified)");
        return KILN_EINVAL;
    }
    if (!o->cert_file != !o->key_file) {
        kl_err(err, KILN_EINVAL, "a client certificate needs its key (and the other way)");
        return KILN_EINVAL;
    }
    return 0;
}

/* Copies o into c, with defaults for unset numbers. */
static int copy_options(kl_one *c, const kiln_options *o, kiln_error *err) {
    int fail = 0;
    c->o = *o;
    c->o.hosts = c->s_hosts = dup_opt(o->hosts, &fail);
    c->o.token = c->s_token = dup_opt(o->token, &fail);
    c->o.ca_file = c->s_ca = dup_opt(o->ca_file, &fail);
    c->o.server_name = c->s_name = dup_opt(o->server_name, &fail);
    c->o.cert_file = c->s_crt = dup_opt(o->cert_file, &fail);
    c->o.key_file = c->s_key = dup_opt(o->key_file, &fail);
    if (fail) {
        kl_err(err, KILN_ENOMEM, "out of memory");
        return KILN_ENOMEM;
    }
    kiln_options d;
    kiln_options_init(&d);
    if (c->o.connect_timeout_ms <= 0)
        c->o.connect_timeout_ms = d.connect_timeout_ms;
    if (c->o.io_timeout_ms <= 0)
        c->o.io_timeout_ms = d.io_timeout_ms;
    if (c->o.retries < 0)
        c->o.retries = 0;
    if (c->o.backoff_ms < 0)
        c->o.backoff_ms = 0;
    if (c->o.backoff_max_ms < c->o.backoff_ms)
        c->o.backoff_max_ms = c->o.backoff_ms;
    return 0;
}

static void free_client(kl_one *c) {
    kl_tls_close(c, 0);
    kl_tls_free(c);
    free(c->rbuf);
    free(c->boxes);
    free(c->s_hosts);
    free(c->s_token);
    free(c->s_ca);
    free(c->s_name);
    free(c->s_crt);
    free(c->s_key);
    free(c);
}

/* A connection to the box list, not connected yet; it starts at box home (modulo the
 * list's length) and kl1_reconnect_home dials only that one. raw: no HELLO (so no token
 * needed); plain: no TLS either (so no CA). */
static kl_one *one_new(const kiln_options *o, int home, int raw, int plain, kiln_error *err) {
    if (err)
        *err = (kiln_error){0, ""};
    if (check_options(o, raw, plain, err))
        return NULL;
    kl_one *c = calloc(1, sizeof *c);
    if (!c) {
        kl_err(err, KILN_ENOMEM, "out of memory");
        return NULL;
    }
    c->fd = -1;
    c->next_h = 1;
    c->next_wire = 1;
    c->raw = raw, c->plain = plain;
    /* kl_tls_init before any failure path: free_client frees its contexts. */
    int r = kl_tls_init(c, err);
    if (!r)
        r = copy_options(c, o, err);
    if (!r)
        r = parse_hosts(c, err);
    if (!r && !plain)
        r = kl_tls_init_files(c, err);
    if (r) {
        free_client(c);
        return NULL;
    }
    c->home_box = c->first_box = home % c->n_boxes;
    return c;
}

kl_one *kl1_new(const kiln_options *o, int home, kiln_error *err) {
    return one_new(o, home, 0, 0, err);
}

kl_one *kl1_new_raw(const kiln_options *o, int plain, kiln_error *err) {
    return one_new(o, 0, 1, plain, err);
}

int kl1_reconnect(kl_one *c, kiln_error *err) { return kl_ensure(c, err); }

int kl1_reconnect_home(kl_one *c, kiln_error *err) {
    settle_conn(c);
    if (c->up)
        return 0;
    int r = open_box(c, &c->boxes[c->home_box], err);
    if (!r)
        c->box_i = c->first_box = c->home_box;
    return r;
}

int kl1_away(const kl_one *c) { return c->up && !c->broken && c->box_i != c->home_box; }

/* The probe is a bare TCP connect, bounded well below connect_timeout_ms: it runs while
 * a request is being routed, and the away connection is given up only for a box that
 * answers. */
#define KL_HOME_PROBE_MS 500
int kl1_go_home(kl_one *c, kiln_error *err) {
    if (!kl1_away(c) || kl_in_flight(c, 0))
        return kl1_away(c) ? KILN_EINVAL : 0;
    int wait = c->o.connect_timeout_ms < KL_HOME_PROBE_MS ? c->o.connect_timeout_ms : KL_HOME_PROBE_MS;
    int r = kl_tcp_probe(&c->boxes[c->home_box], kl_now_ms() + wait, err);
    if (r)
        return r;
    kl_drop(c, KILN_ECLOSED, "moving back to its home box"); /* nothing in flight to fail */
    return kl1_reconnect_home(c, err);
}

void kl1_drop_idle_draining(kl_one *c) {
    if (c->up && !c->broken && c->going_away && !kl_in_flight(c, 0))
        kl_drop(c, KILN_ECLOSED, "the box is draining");
}

int kl1_n_boxes(const kl_one *c) { return c->n_boxes; }
int kl1_going_away(const kl_one *c) { return c->going_away; }
int kl1_broken(const kl_one *c) { return c->up && c->broken; }
int kl1_fd(const kl_one *c) { return c->up ? c->fd : -1; }

void kl1_close(kl_one *c) {
    if (!c)
        return;
    if (c->up && !c->broken && !c->raw) {
        /* Best effort and brief: QUIT lets the server log a clean end. */
        static const char quit[] = "QUIT\n";
        kiln_error e;
        (void)kl_tls_write(c, quit, sizeof quit - 1, kl_now_ms() + 200, &e);
    }
    kl_tls_close(c, c->up && !c->broken);
    c->up = 0;
    kl_fail_all(c, KILN_ECLOSED, "client closed", 1);
    free_client(c);
}

const char *kl1_model(const kl_one *c) { return c->model; }
long kl1_ctx(const kl_one *c) { return c->ctx; }
long kl1_session(const kl_one *c) { return c->session; }
const char *kl1_role(const kl_one *c) { return c->role; }
const char *kl1_server(const kl_one *c) { return c->server; }
int kl1_connected(const kl_one *c) { return c->up && !c->broken; }
