/* libkiln requests: GEN lines from kiln_gen, routing of TOK/END/ERR by id to the
 * callbacks, 503 retries on a timer, the pump loop with its io timeout, CANCEL, and the
 * blocking kiln_generate on top.
 *
 * Safety with callbacks: a callback may call kiln_submit or kiln_cancel, which can add
 * or free requests. So no kl_req pointer is used after a callback returns (it is looked
 * up again by handle), a request is unlinked before its last on_end, and a connection
 * that breaks while writing is only marked (c->broken) and torn down by the loops here,
 * never from inside a callback. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ------------------------------------------------------------------ the GEN line */

typedef struct {
    char *s;
    size_t len, cap;
    int fail;
} kl_buf;

static void buf_put(kl_buf *b, const char *s, size_t n) {
    if (b->fail)
        return;
    if (b->cap - b->len < n + 1) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->len < n + 1)
            cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->fail = 1;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

static void put_key(kl_buf *b, const char *key) {
    buf_put(b, " ", 1);
    buf_put(b, key, strlen(key));
    buf_put(b, "=", 1);
}

/* key="..." with the protocol's escapes (proto_quote). */
static void put_str(kl_buf *b, const char *key, const char *s) {
    size_t n = strlen(s);
    char *q = malloc(PROTO_QUOTED_MAX(n));
    int w = q ? proto_quote(q, PROTO_QUOTED_MAX(n), s, n) : -1;
    if (w < 0) {
        b->fail = 1;
    } else {
        put_key(b, key);
        buf_put(b, q, (size_t)w);
    }
    free(q);
}

static void put_int(kl_buf *b, const char *key, long long v) {
    char t[32];
    put_key(b, key);
    buf_put(b, t, (size_t)snprintf(t, sizeof t, "%lld", v));
}

/* Floats as the protocol wants them: decimal, never inf/nan, '.' whatever the locale. */
static void put_float(kl_buf *b, const char *key, double v) {
    char t[40];
    int n = snprintf(t, sizeof t, "%.9g", v);
    for (int i = 0; i < n; i++)
        if (t[i] == ',')
            t[i] = '.';
    put_key(b, key);
    buf_put(b, t, (size_t)n);
}

static int is_role(const char *r) {
    return r && (!strcmp(r, "system") || !strcmp(r, "user") || !strcmp(r, "assistant"));
}

/* A conversation's shape (the server checks it too; a role becomes a key, so it must be
 * one of the three). */
static int check_msgs(const kiln_gen *p, kiln_error *err) {
    if (p->prompt || p->system) {
        kl_err(err, KILN_EINVAL, "msgs exclude prompt and system (give the system message as msgs[0])");
        return KILN_EINVAL;
    }
    if (p->chat == 0) {
        kl_err(err, KILN_EINVAL, "msgs need chat (the template renders them)");
        return KILN_EINVAL;
    }
    if (p->n_msgs < 1 || p->n_msgs > KILN_MAX_MSGS) {
        kl_err(err, KILN_EINVAL, "n_msgs must be 1..%d", KILN_MAX_MSGS);
        return KILN_EINVAL;
    }
    for (int i = 0; i < p->n_msgs; i++)
        if (!is_role(p->msgs[i].role) || !p->msgs[i].content) {
            kl_err(err, KILN_EINVAL, "msgs[%d] needs a role (system, user, assistant) and content", i);
            return KILN_EINVAL;
        }
    return 0;
}

static int check_gen(const kiln_gen *p, kiln_error *err) {
    if (p && p->msgs) {
        if (check_msgs(p, err))
            return KILN_EINVAL;
    } else if (!p || !p->prompt) {
        kl_err(err, KILN_EINVAL, "no prompt");
        return KILN_EINVAL;
    }
    const double f[] = {p->temperature, p->top_p, p->min_p, p->repeat_penalty,
                        p->presence_penalty, p->frequency_penalty};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (isinf(f[i])) {
            kl_err(err, KILN_EINVAL, "a sampling parameter is infinite");
            return KILN_EINVAL;
        }
    if (p->n_stops < 0 || p->n_stops > KILN_MAX_STOPS) {
        kl_err(err, KILN_EINVAL, "n_stops must be 0..%d", KILN_MAX_STOPS);
        return KILN_EINVAL;
    }
    for (int i = 0; i < p->n_stops; i++)
        if (!p->stops[i] || !p->stops[i][0] || strlen(p->stops[i]) > 64) {
            kl_err(err, KILN_EINVAL, "stop %d must be 1..64 bytes", i);
            return KILN_EINVAL;
        }
    return 0;
}

/* Everything of the GEN line after the id; unset keys are left out. */
static int gen_args(const kiln_gen *p, kl_buf *b) {
    if (p->msgs) { /* the conversation form: each message a key of its role, in order */
        for (int i = 0; i < p->n_msgs; i++)
            put_str(b, p->msgs[i].role, p->msgs[i].content);
        put_int(b, "chat", 1);
    } else {
        put_str(b, "prompt", p->prompt);
        if (p->system)
            put_str(b, "system", p->system);
        if (p->chat >= 0)
            put_int(b, "chat", p->chat);
    }
    if (p->max_tokens >= 0)
        put_int(b, "max_tokens", p->max_tokens);
    if (!isnan(p->temperature))
        put_float(b, "temperature", p->temperature);
    if (!isnan(p->top_p))
        put_float(b, "top_p", p->top_p);
    if (p->top_k >= 0)
        put_int(b, "top_k", p->top_k);
    if (!isnan(p->min_p))
        put_float(b, "min_p", p->min_p);
    if (!isnan(p->repeat_penalty))
        put_float(b, "repeat_penalty", p->repeat_penalty);
    if (p->repeat_last_n >= 0)
        put_int(b, "repeat_last_n", p->repeat_last_n);
    if (!isnan(p->presence_penalty))
        put_float(b, "presence_penalty", p->presence_penalty);
    if (!isnan(p->frequency_penalty))
        put_float(b, "frequency_penalty", p->frequency_penalty);
    if (p->has_seed) {
        char t[32];
        put_key(b, "seed");
        buf_put(b, t, (size_t)snprintf(t, sizeof t, "%llu", (unsigned long long)p->seed));
    }
    if (p->n >= 0)
        put_int(b, "n", p->n);
    for (int i = 0; i < p->n_stops; i++)
        put_str(b, "stop", p->stops[i]);
    if (p->logprobs >= 0)
        put_int(b, "logprobs", p->logprobs);
    if (p->ignore_eos >= 0)
        put_int(b, "ignore_eos", p->ignore_eos);
    return b->fail ? KILN_ENOMEM : 0;
}

void kiln_gen_init(kiln_gen *p) {
    memset(p, 0, sizeof *p);
    p->chat = p->max_tokens = p->top_k = p->repeat_last_n = p->n = -1;
    p->logprobs = p->ignore_eos = -1;
    p->temperature = p->top_p = p->min_p = p->repeat_penalty = NAN;
    p->presence_penalty = p->frequency_penalty = NAN;
}

/* ------------------------------------------------------------------ the table */

static kl_req *find_h(kl_one *c, kiln_req h) {
    for (kl_req *r = c->reqs; r; r = r->next)
        if (r->h == h)
            return r;
    return NULL;
}

static kl_req *find_wire(kl_one *c, const char *id) {
    for (kl_req *r = c->reqs; r; r = r->next)
        if (r->state == KL_SENT && !strcmp(r->id, id))
            return r;
    return NULL;
}

static void unlink_req(kl_one *c, kl_req *r) {
    for (kl_req **pp = &c->reqs; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            r->next = NULL;
            return;
        }
}

static void free_req(kl_req *r) {
    if (r) {
        free(r->args);
        free(r);
    }
}

int kl_in_flight(const kl_one *c, int sent_only) {
    int n = 0;
    for (const kl_req *r = c->reqs; r; r = r->next)
        n += !sent_only || r->state == KL_SENT;
    return n;
}

int kl1_pending(const kl_one *c) {
    return kl_in_flight(c, 0);
}

/* The request is over: unlink it, tell the caller, free it. */
static void finish(kl_one *c, kl_req *r, int sample, int status, const kiln_usage *u,
                   const char *msg) {
    kiln_usage zero;
    if (!u) {
        memset(&zero, 0, sizeof zero);
        u = &zero;
    }
    unlink_req(c, r);
    if (r->cb.on_end)
        r->cb.on_end(r->ud, sample, status, u, msg ? msg : "");
    free_req(r);
}

/* Send (or send again) r's GEN with a fresh wire id. */
static int send_req(kl_one *c, kl_req *r, kiln_error *err) {
    snprintf(r->id, sizeof r->id, "k%llu", (unsigned long long)c->next_wire++);
    size_t cap = r->args_len + sizeof r->id + 16;
    char *line = malloc(cap);
    if (!line) {
        kl_err(err, KILN_ENOMEM, "out of memory");
        return KILN_ENOMEM;
    }
    int n = snprintf(line, cap, "GEN id=%s", r->id);
    memcpy(line + n, r->args, r->args_len);
    r->state = KL_SENT;
    r->ended = 0;
    /* A request just sent starts the wait for the server's first byte. */
    c->last_rx_ms = kl_now_ms();
    int s = kl_send_line(c, line, (size_t)n + r->args_len, err);
    free(line);
    return s;
}

/* 503 (or a lost connection) before any token: wait and send again. */
static void schedule_retry(kl_one *c, kl_req *r, int status, int delay_ms,
                           const char *msg) {
    r->attempts++;
    r->state = KL_WAIT_RETRY;
    r->due_ms = kl_now_ms() + delay_ms;
    r->id[0] = '\0';
    if (c->o.on_retry)
        c->o.on_retry(c->o.retry_ud, status, r->attempts, delay_ms, msg ? msg : "");
}

static int can_retry(const kl_one *c, const kl_req *r) {
    return !r->delivered && !r->cancelled && r->attempts < c->o.retries;
}

static int transient(int code) {
    return code == KILN_ECLOSED || code == KILN_ETIMEOUT || code == 503;
}

void kl_fail_all(kl_one *c, int code, const char *msg, int final) {
    kl_req *keep = NULL, **kt = &keep, *fail = NULL;
    for (kl_req *r = c->reqs, *next; r; r = next) {
        next = r->next;
        r->next = NULL;
        int stay = !final && (r->state == KL_WAIT_RETRY ||
                              (r->retry_on_close && can_retry(c, r) && transient(code)));
        if (stay) {
            if (r->state == KL_SENT)
                schedule_retry(c, r, code, kl_backoff_ms(c, r->attempts + 1), msg);
            *kt = r;
            kt = &r->next;
        } else {
            r->next = fail;
            fail = r;
        }
    }
    /* Callbacks may submit new requests: they go onto the fresh list. */
    c->reqs = keep;
    kiln_usage zero;
    memset(&zero, 0, sizeof zero);
    while (fail) {
        kl_req *r = fail;
        fail = r->next;
        if (r->cb.on_end)
            r->cb.on_end(r->ud, -1, code, &zero, msg ? msg : "");
        free_req(r);
    }
}

/* ------------------------------------------------------------------ server lines */

static int starts(const char *line, size_t len, const char *verb) {
    size_t n = strlen(verb);
    return len > n && !memcmp(line, verb, n) && line[n] == ' ';
}

static long long kv_ll(const proto_line *l, const char *key, long long dflt) {
    const proto_str *v = proto_get(l, key);
    if (!v || v->quoted)
        return dflt;
    char *end;
    long long x = strtoll(v->s, &end, 10);
    return end != v->s && !*end ? x : dflt;
}

static double kv_f(const proto_line *l, const char *key) {
    const proto_str *v = proto_get(l, key);
    if (!v || v->quoted)
        return 0;
    char *end;
    double x = strtod(v->s, &end);
    return end != v->s && !*end && isfinite(x) ? x : 0;
}

static void on_tok(kl_one *c, const proto_line *l) {
    kl_req *r = find_wire(c, l->pos[0].s);
    if (!r || r->cancelled || l->n_pos < 2)
        return; /* late lines of a cancelled or finished request */
    r->delivered++;
    if (!r->cb.on_token)
        return;
    kiln_req h = r->h;
    int sample = (int)kv_ll(l, "sample", 0);
    int tok = (int)kv_ll(l, "token", -1);
    int stop = r->cb.on_token(r->ud, l->pos[1].s, l->pos[1].len, sample, tok,
                              kv_f(l, "logprob"));
    if (stop)
        (void)kl1_cancel(c, h, NULL); /* looked up again: the callback may have ended it */
}

static void on_end_line(kl_one *c, const proto_line *l) {
    kl_req *r = find_wire(c, l->pos[0].s);
    if (!r)
        return;
    kiln_usage u;
    memset(&u, 0, sizeof u);
    const proto_str *reason = proto_get(l, "reason");
    snprintf(u.reason, sizeof u.reason, "%s", reason ? reason->s : "");
    u.prompt_tokens = (long)kv_ll(l, "prompt_tokens", 0);
    u.completion_tokens = (long)kv_ll(l, "completion_tokens", 0);
    u.cached_tokens = (long)kv_ll(l, "cached_tokens", 0);
    u.ttft_ms = kv_f(l, "ttft_ms");
    u.tpot_ms = kv_f(l, "tpot_ms");
    u.e2e_ms = kv_f(l, "e2e_ms");
    int sample = (int)kv_ll(l, "sample", 0);
    if (++r->ended >= r->samples) {
        finish(c, r, sample, 0, &u, "");
        return;
    }
    if (r->cb.on_end)
        r->cb.on_end(r->ud, sample, 0, &u, "");
}

static void on_err_line(kl_one *c, const proto_line *l) {
    kl_req *r = find_wire(c, l->pos[0].s);
    if (!r)
        return; /* e.g. the 404 of a CANCEL that crossed the END */
    kiln_error e;
    int code = kl_err_line(l, &e);
    if (code == 503 && can_retry(c, r)) {
        long long after = kv_ll(l, "retry_after_ms", -1);
        int delay = after >= 0 && after <= 600000 ? (int)after
                                                  : kl_backoff_ms(c, r->attempts + 1);
        schedule_retry(c, r, code, delay, e.message);
        return;
    }
    finish(c, r, -1, code, NULL, e.message);
}

/* A session-level ERR ("ERR - 408 idle_timeout") that the server sends before closing:
 * kept so the close is reported with the server's reason. */
static void on_session_err(kl_one *c, char *line, size_t len) {
    proto_line l;
    char perr[96];
    if (proto_split(line, len, &l, perr, sizeof perr) || strcmp(l.verb, "ERR"))
        return;
    kiln_error e;
    int code = kl_err_line(&l, &e);
    if (code == 408 || code == 413 || code == 503 || code == 401) {
        c->conn_err = code;
        snprintf(c->conn_msg, sizeof c->conn_msg, "%s", e.message);
    }
}

int kl_dispatch(kl_one *c, char *line, size_t len) {
    if (starts(line, len, "GOAWAY")) { /* never a verb's reply: taken here for everyone */
        c->going_away = 1;
        c->first_box = c->n_boxes > 0 ? (c->box_i + 1) % c->n_boxes : 0;
        return 1;
    }
    int tok = starts(line, len, "TOK"), end = starts(line, len, "END");
    int err = starts(line, len, "ERR");
    if (!tok && !end && !err)
        return 0;
    if (err && len > 5 && line[4] == '-' && (len == 5 || line[5] == ' '))
        return 0; /* no id: a verb's reply or a session error */
    proto_line l;
    char perr[96];
    if (proto_split(line, len, &l, perr, sizeof perr) || l.n_pos < 1) {
        if (!c->broken) {
            c->broken = KILN_EPROTO;
            kl_err(&c->broke, KILN_EPROTO, "%s sent a bad %s line: %s", c->server,
                   tok ? "TOK" : end ? "END" : "ERR", perr);
        }
        return 1;
    }
    if (tok)
        on_tok(c, &l);
    else if (end)
        on_end_line(c, &l);
    else
        on_err_line(c, &l);
    return 1;
}

/* ------------------------------------------------------------------ pumping */

static void handle_line(kl_one *c, char *line, size_t len) {
    if (!kl_dispatch(c, line, len) && starts(line, len, "ERR"))
        on_session_err(c, line, len);
    /* anything else unasked for (a stray OK) is ignored */
}

static int64_t next_due(const kl_one *c) {
    int64_t d = INT64_MAX;
    for (const kl_req *r = c->reqs; r; r = r->next)
        if (r->state == KL_WAIT_RETRY && r->due_ms < d)
            d = r->due_ms;
    return d;
}

/* Tear down a connection marked broken. The code, or 0 when it was not. */
static int settle(kl_one *c, kiln_error *err) {
    if (!c->broken)
        return 0;
    kiln_error e = c->broke;
    if (c->up)
        kl_drop(c, e.code, e.message);
    c->broken = 0;
    if (err)
        *err = e;
    return e.code;
}

/* Send the requests whose retry time has come, reconnecting first if needed. When no
 * box can be reached they end with that error. 0 or the code. */
static kl_req *first_due(kl_one *c, int64_t now) {
    for (kl_req *q = c->reqs; q; q = q->next)
        if (q->state == KL_WAIT_RETRY && q->due_ms <= now)
            return q;
    return NULL;
}

static int run_due(kl_one *c, kiln_error *err) {
    int64_t now = kl_now_ms();
    if (!first_due(c, now))
        return 0;
    kiln_error e = {0, ""};
    int r = kl_ensure(c, &e);
    /* Each pass takes the first due request afresh: finish() runs callbacks that may
     * change the list, and a sent request is no longer KL_WAIT_RETRY. */
    for (kl_req *q; (q = first_due(c, now));) {
        if (r)
            finish(c, q, -1, r, NULL, e.message);
        else if (send_req(c, q, &e))
            break; /* the connection is marked broken; settle() deals with it */
    }
    if (r && err)
        *err = e;
    return r;
}

/* Why the wait ended with nothing read: 1 io timeout (connection dropped), 0 not. */
static int io_timed_out(kl_one *c, kiln_error *err) {
    if (!c->up || !kl_in_flight(c, 1) || kl_now_ms() < c->last_rx_ms + c->o.io_timeout_ms)
        return 0;
    kiln_error e;
    kl_err(&e, KILN_ETIMEOUT, "%s: no data for %d ms", c->server, c->o.io_timeout_ms);
    kl_drop(c, KILN_ETIMEOUT, e.message);
    if (err)
        *err = e;
    return 1;
}

/* The loop of kiln_pump and kiln_generate: until end_ms, until *stop (if given), or
 * until nothing is in flight. The count in flight, or a negative code when the
 * connection broke or timed out (after the requests got their on_end). */
static int pump(kl_one *c, int64_t end_ms, const int *stop, kiln_error *err) {
    for (;;) {
        int s = settle(c, err);
        if (s)
            return s < 0 ? s : KILN_ECLOSED;
        s = run_due(c, err);
        if (s) /* no box could be reached: *err has the reason (a 401 too) */
            return s < 0 ? s : KILN_ECONNECT;
        if ((stop && *stop) || !kl_in_flight(c, 0))
            return kl_in_flight(c, 0);
        int64_t now = kl_now_ms(), deadline = end_ms, due = next_due(c);
        if (due < deadline)
            deadline = due;
        if (!c->up || !kl_in_flight(c, 1)) {
            /* Only retries waiting: sleep until the first, or the end. */
            if (now >= end_ms)
                return kl_in_flight(c, 0);
            int64_t w = deadline - now;
            kl_sleep_ms(w > 1000000 ? 1000000 : (int)w);
            continue;
        }
        int64_t io = c->last_rx_ms + c->o.io_timeout_ms;
        if (io < deadline)
            deadline = io;
        char *line;
        size_t len;
        kiln_error e;
        int r = kl_line(c, deadline, &line, &len, &e);
        if (r < 0) {
            kl_drop(c, r, e.message);
            if (err)
                *err = e;
            return r;
        }
        if (r > 0) {
            handle_line(c, line, len);
            continue;
        }
        if (io_timed_out(c, err))
            return KILN_ETIMEOUT;
        if (kl_now_ms() >= end_ms)
            return kl_in_flight(c, 0);
    }
}

int kl1_pump(kl_one *c, int timeout_ms, kiln_error *err) {
    if (err)
        *err = (kiln_error){0, ""};
    int64_t end = timeout_ms < 0 ? INT64_MAX : kl_now_ms() + timeout_ms;
    return pump(c, end, NULL, err);
}

void kl_drain(kl_one *c) {
    while (c->up && !c->broken) {
        char *line;
        size_t len;
        kiln_error e;
        int r = kl_line(c, 0, &line, &len, &e);
        if (r == 0)
            break;
        if (r < 0) {
            kl_drop(c, r, e.message);
            return;
        }
        handle_line(c, line, len);
    }
    settle(c, NULL);
}

/* ------------------------------------------------------------------ submit, cancel */

static kiln_req submit(kl_one *c, const kiln_gen *p, const kiln_callbacks *cb,
                       void *ud, int retry_on_close, kiln_error *err) {
    if (err)
        *err = (kiln_error){0, ""};
    if (check_gen(p, err))
        return 0;
    kl_buf b = {0};
    kl_req *r = calloc(1, sizeof *r);
    if (!r || gen_args(p, &b)) {
        free(r);
        free(b.s);
        kl_err(err, KILN_ENOMEM, "out of memory");
        return 0;
    }
    r->args = b.s;
    r->args_len = b.len;
    if (cb)
        r->cb = *cb;
    r->ud = ud;
    r->samples = p->n > 0 ? p->n : 1;
    r->retry_on_close = retry_on_close;
    /* Inside a callback a broken connection cannot be torn down (kl_ensure would); say
     * so instead. */
    if (c->up && c->broken) {
        free_req(r);
        if (err)
            *err = c->broke;
        return 0;
    }
    int e = kl_ensure(c, err);
    if (e) {
        free_req(r);
        return 0;
    }
    r->h = c->next_h++;
    r->next = c->reqs;
    c->reqs = r;
    /* A failed write marks the connection broken; the request then ends (or is resent)
     * through the pump like any other request on a lost connection. */
    (void)send_req(c, r, NULL);
    return r->h;
}

kiln_req kl1_submit(kl_one *c, const kiln_gen *p, const kiln_callbacks *cb, void *ud,
                     kiln_error *err) {
    return submit(c, p, cb, ud, 0, err);
}

int kl1_cancel(kl_one *c, kiln_req h, kiln_error *err) {
    kl_req *r = find_h(c, h);
    if (!r) {
        kl_err(err, KILN_EINVAL, "request %llu is not in flight", (unsigned long long)h);
        return KILN_EINVAL;
    }
    if (r->state == KL_WAIT_RETRY) {
        kiln_usage u;
        memset(&u, 0, sizeof u);
        snprintf(u.reason, sizeof u.reason, "cancelled");
        finish(c, r, -1, 0, &u, "");
        return 0;
    }
    if (r->cancelled)
        return 0;
    r->cancelled = 1;
    char line[64];
    int n = snprintf(line, sizeof line, "CANCEL %s", r->id);
    return kl_send_line(c, line, (size_t)n, err);
}

/* ------------------------------------------------------------------ generate */

typedef struct {
    kiln_on_token fn;
    void *ud;
    int samples, ends, done, status;
    long completion;
    kiln_usage u;
    char msg[KILN_MSG_MAX];
} kl_gen_state;

static int gen_tok(void *ud, const char *text, size_t len, int sample, int token_id,
                   double logprob) {
    kl_gen_state *g = ud;
    return g->fn ? g->fn(g->ud, text, len, sample, token_id, logprob) : 0;
}

static void gen_end(void *ud, int sample, int status, const kiln_usage *u, const char *msg) {
    kl_gen_state *g = ud;
    (void)sample;
    if (status == 0) {
        g->completion += u->completion_tokens;
        g->u = *u;
    } else {
        g->status = status;
        snprintf(g->msg, sizeof g->msg, "%s", msg);
    }
    /* An error, a cancel while waiting (sample -1), or the last sample's END. */
    if (status != 0 || sample < 0 || ++g->ends >= g->samples)
        g->done = 1;
}

int kl1_generate(kl_one *c, const kiln_gen *p, kiln_on_token on_token, void *ud,
                  kiln_usage *usage, kiln_error *err) {
    kl_gen_state g;
    memset(&g, 0, sizeof g);
    g.fn = on_token;
    g.ud = ud;
    g.samples = p && p->n > 0 ? p->n : 1;
    if (err)
        *err = (kiln_error){0, ""};
    if (usage)
        memset(usage, 0, sizeof *usage);
    /* Lines already waiting may show the connection is gone (an idle timeout): find
     * out before sending, so the request goes to a live one. */
    kl_drain(c);
    kiln_callbacks cb = {gen_tok, gen_end};
    kiln_req h = submit(c, p, &cb, &g, 1, err);
    if (!h)
        return err ? err->code : KILN_EINVAL;
    while (!g.done) {
        int r = pump(c, INT64_MAX, &g.done, NULL);
        if (!g.done && r >= 0 && !find_h(c, h)) {
            /* cannot happen: the request left without its on_end */
            g.status = KILN_EPROTO;
            snprintf(g.msg, sizeof g.msg, "request lost");
            break;
        }
    }
    if (g.status) {
        kl_err(err, g.status, "%s", g.msg);
        return g.status;
    }
    g.u.completion_tokens = g.completion;
    if (usage)
        *usage = g.u;
    return 0;
}
