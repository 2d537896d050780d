/* server: sessions, the protocol's verbs, the engine's callbacks, /metrics. */
#include "net/server.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/prompt.h"
#include "core/sampler.h"
#include "net/http.h"
#include "net/metrics.h"
#include "net/proto.h"
#include "net/tls.h"
#include "net/update.h"
#include "sched/drive.h"
#include "sched/engine.h"
#include "sched/ladder.h"

#define SRV_MAX_N 8           /* samples per request (the engine's limit) */
#define SRV_MAX_TOKENS 256    /* entries in the tokens file */
#define SRV_TOKEN_MAX 128     /* bytes per token */
#define SRV_LINGER_MS 2000    /* reading (and dropping) input after our close */
#define SRV_SWEEP_MS 250      /* timeouts are checked this often */
#define SRV_METRICS_CAP (256 * 1024)
#define SRV_RETRY_MS DRIVE_SHED_MIN_MS /* retry_after_ms when the engine is full */
_Static_assert((int)DRIVE_LOG_ERROR == (int)CFG_LOG_ERROR && (int)DRIVE_LOG_WARN == (int)CFG_LOG_WARN,
               "the driver logs at the config's levels");
#define SRV_EXIT_RESTART 75   /* EX_TEMPFAIL: the supervisor restarts kilnd */
#define SRV_MAX_HTTP 16       /* scrapes and probes at once */
#define SRV_HTTP_MS 10000     /* an HTTP request and its answer must fit in this */
#define SRV_GOODBYE_MS 1500   /* after draining: time for the last lines to leave */
#define SRV_UPD_BEGIN_MS 10000     /* kiln-init removes the slot's boot entry within this */
#define SRV_UPD_ACTIVATE_MS 180000 /* ... and verifies and activates the slot within this */
#define SRV_UPD_PROGRESS (1u << 20) /* an UPDATE progress line every this many bytes */
#define SRV_UPD_SLICE (4u << 20)   /* update bytes taken per wakeup before the loop goes on */

enum { ROLE_NONE, ROLE_USER, ROLE_ADMIN };
enum { SS_TLS, SS_HELLO, SS_READY, SS_CLOSING };
/* A network update: kiln-init clears the slot's entry (BEGIN), the bytes come (DATA),
 * kiln-init verifies and activates (ACTIVATE). */
enum { UP_IDLE, UP_BEGIN, UP_DATA, UP_ACTIVATE };

typedef struct srv_sess srv_sess;

/* One GEN: the engine's request and where its lines go. */
typedef struct srv_req {
    struct srv *owner;
    srv_sess *sess;        /* NULL once the connection is gone */
    int64_t eng_id;
    char id[PROTO_ID_MAX + 1];
    int n, n_done, logprobs, paused;
    int failed;            /* ERR sent: the other samples end silently */
    double t_last[SRV_MAX_N]; /* the previous token's time, per sample */
    struct srv_req *next;  /* the session's list, or the free list */
} srv_req;

struct srv_sess {
    srv *s;
    net_conn *c;
    tls_conn *tls;
    int state, role, num;
    char *in;              /* the line being received */
    size_t in_len, in_cap;
    char *out;             /* unsent output: out[out_head, out_len) */
    size_t out_head, out_len, out_cap;
    int close_when_flushed;
    int broken;            /* output could not be buffered: reset at the next flush */
    int paused;            /* its requests are paused for output room */
    srv_req *reqs;
    int n_reqs;
    int64_t deadline_ms;   /* handshake + HELLO, or the linger after our close */
    int64_t last_rx_ms;
    srv_sess *prev, *next; /* every session */
    srv_sess *next_dirty;  /* output to flush after the step */
    int dirty;
    uint64_t raw_left;     /* bytes of an UPDATE still to come: data, not lines */
    int64_t resume_timer;  /* reading resumes here after an update slice */
};

/* An HTTP connection on metrics_port: one request, one response, close. */
typedef struct srv_http {
    struct srv_http *prev, *next;
    srv *s;
    net_conn *c;
    char head[HTTP_HEAD_MAX];
    size_t len;
    const char *resp;      /* what is left to send */
    size_t resp_len;
    char *resp_buf;
    int64_t deadline_ms;
} srv_http;

typedef struct {
    int role;
    size_t len;
    char tok[SRV_TOKEN_MAX];
} srv_token;

struct srv {
    srv_env env;
    kiln_config cfg;
    engine *eng;
    tls_server *tls;
    metrics *met;
    srv_req *reqs, *free_reqs;
    int n_req_slots;
    srv_sess *sessions, *dirty;
    int n_sessions, next_num;
    struct srv_http *https;
    int n_http;
    int64_t goodbye_ms;    /* drained: sessions closing, the loop stops at this time */
    srv_token tokens[SRV_MAX_TOKENS];
    int n_tokens;
    prompt_builder pb;     /* GEN's text to ids; its input is at most two lines */
    char *metrics_text;    /* [SRV_METRICS_CAP] */
    int draining, restart;
    drive drv;             /* the engine on the loop; the ladder is drv.lad */
    int64_t drain_since_ms; /* when draining began; 0: not draining */
    int drain_expired;     /* drain_timeout_ms passed: the rest were ended */
    int hung;              /* a step overran step_timeout_ms: telling clients, then exit */
    int fault_write_n;     /* FAULT write_fail: the next n session writes fail (a reset) */
    int64_t fault_kv_until; /* FAULT kv_fail: every KV block allocation fails until then */
    int stopping;          /* srv_drain: stop the loop once nothing is pending */
    int64_t t_start_ms;
    int64_t sweep_timer;
    int64_t requests_total;
    eng_stats last;        /* engine counters already added to the metrics */
    /* metric handles */
    int m_running, m_waiting, m_kv, m_pq, m_ph, m_preempt, m_ptok, m_gtok, m_level, m_conns;
    int m_up, m_ttft, m_itl, m_e2e, m_reason[4], m_rejected;
    int m_trans[LADDER_LEVELS][LADDER_LEVELS], m_batch, m_pressure, m_shed;
    int m_kv8, m_kv8_share, m_kv8_conv;
    uint64_t kv8_conv_seen; /* conversions already added to m_kv8_conv */
    /* the network update (UPDATE): one at a time */
    upd up;
    int up_state, up_tries;
    srv_sess *up_sess;     /* the session that sent it; NULL once it is gone */
    int64_t up_deadline_ms; /* kiln-init's answer is due */
    uint64_t up_progress;  /* the next progress line at this many bytes */
    srv_notify_fn notify;  /* kiln-init's control socket (net/ctl.c) */
    void *notify_ud;
};

static double now_s(void) { return (double)loop_now_us() * 1e-6; }

static int fault_arm(srv *s, const char *what, const proto_line *l);
static void drain_expire(srv *s);
static void verb_update(srv_sess *ss, const proto_line *l);
static void verb_reboot(srv_sess *ss);
static void update_data(srv_sess *ss, const char *p, size_t n);
static void update_lost(srv_sess *ss);
static void update_sweep(srv *s);

static void srv_log(const srv *s, int level, const char *fmt, ...) {
    if (level > s->cfg.log.level) return;
    static const char *const names[] = {"error", "warn", "info", "debug"};
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kilnd: %s: ", names[level]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ------------------------------------------------------------------ tokens file */

/* "role token" per line; '#' starts a comment. All or nothing: on error the old set
 * stays. Returns the count or -1 with err. */
static int load_tokens(srv *s, char *err, size_t errlen) {
    FILE *f = fopen(s->cfg.net.tokens_file, "r");
    if (!f) {
        snprintf(err, errlen, "tokens file %s: %s", s->cfg.net.tokens_file, strerror(errno));
        return -1;
    }
    static srv_token t[SRV_MAX_TOKENS];
    int n = 0, lineno = 0, bad = 0;
    char line[512];
    while (!bad && fgets(line, sizeof line, f)) {
        lineno++;
        char *h = strchr(line, '#');
        if (h) *h = 0;
        char role[16], tok[SRV_TOKEN_MAX + 1], extra[2];
        int k = sscanf(line, "%15s %128s %1s", role, tok, extra);
        if (k <= 0) continue;
        int r = !strcmp(role, "admin") ? ROLE_ADMIN : !strcmp(role, "user") ? ROLE_USER : 0;
        if (k != 2 || !r || strlen(tok) < 8 || strlen(tok) >= SRV_TOKEN_MAX || n == SRV_MAX_TOKENS) {
            snprintf(err, errlen, "%s:%d: want \"user|admin TOKEN\" (8..%d bytes, at most %d lines)",
                     s->cfg.net.tokens_file, lineno, SRV_TOKEN_MAX - 1, SRV_MAX_TOKENS);
            bad = 1;
            break;
        }
        t[n].role = r, t[n].len = strlen(tok);
        memset(t[n].tok, 0, sizeof t[n].tok);
        memcpy(t[n].tok, tok, t[n].len);
        n++;
    }
    fclose(f);
    if (bad) return -1;
    if (n == 0) {
        snprintf(err, errlen, "tokens file %s has no tokens", s->cfg.net.tokens_file);
        return -1;
    }
    memcpy(s->tokens, t, sizeof t);
    s->n_tokens = n;
    return n;
}

/* The role of a token, comparing against every entry in full (no early exit that
 * would tell a prober how much of a token matched). */
static int token_role(const srv *s, const char *tok) {
    size_t len = tok ? strlen(tok) : 0;
    int role = ROLE_NONE;
    for (int i = 0; i < s->n_tokens; i++) {
        unsigned diff = (unsigned)(len != s->tokens[i].len);
        for (size_t j = 0; j < SRV_TOKEN_MAX; j++)
            diff |= (unsigned char)(j < len ? tok[j] : 0) ^ (unsigned char)s->tokens[i].tok[j];
        if (!diff) role = s->tokens[i].role;
    }
    return role;
}

/* ------------------------------------------------------------------ output */

static void mark_dirty(srv_sess *ss);

/* Room for n more bytes of output. The buffer grows past max_output_bytes only by
 * what the requests already accepted produce before their pause takes effect (one
 * step's tokens); a hard cap guards against anything else. */
static int out_reserve(srv_sess *ss, size_t n) {
    if (ss->out_head > 0 && ss->out_len + n > ss->out_cap) {
        memmove(ss->out, ss->out + ss->out_head, ss->out_len - ss->out_head);
        ss->out_len -= ss->out_head, ss->out_head = 0;
    }
    if (ss->out_len + n <= ss->out_cap) return 0;
    size_t hard = 4 * (size_t)ss->s->cfg.net.max_output_bytes + SRV_METRICS_CAP;
    size_t cap = ss->out_cap ? ss->out_cap : 4096;
    while (cap < ss->out_len + n) cap *= 2;
    char *p = cap > hard ? NULL : realloc(ss->out, cap);
    if (!p) { /* never drop a line silently: the connection goes instead */
        ss->broken = 1;
        mark_dirty(ss);
        return -1;
    }
    ss->out = p, ss->out_cap = cap;
    return 0;
}

static void mark_dirty(srv_sess *ss) {
    if (ss->dirty) return;
    ss->dirty = 1;
    ss->next_dirty = ss->s->dirty;
    ss->s->dirty = ss;
}

static void sess_printf(srv_sess *ss, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sess_printf(srv_sess *ss, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || out_reserve(ss, (size_t)n + 1) < 0) return;
    va_start(ap, fmt);
    vsnprintf(ss->out + ss->out_len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    ss->out_len += (size_t)n;
    mark_dirty(ss);
}

/* A quoted string appended as is (the caller adds the rest of the line). */
static void sess_quote(srv_sess *ss, const char *text, size_t len) {
    size_t need = PROTO_QUOTED_MAX(len);
    if (out_reserve(ss, need) < 0) return;
    int n = proto_quote(ss->out + ss->out_len, need, text, len);
    if (n > 0) ss->out_len += (size_t)n;
}

/* ERR <id> <code> <slug>[ msg="..."] */
static void sess_err(srv_sess *ss, const char *id, int code, const char *slug, const char *msg) {
    sess_printf(ss, "ERR %s %d %s", id && *id ? id : "-", code, slug);
    if (msg && *msg) {
        sess_printf(ss, " msg=");
        sess_quote(ss, msg, strlen(msg));
    }
    sess_printf(ss, "\n");
}

/* A multi-line body ending with ".", lines starting with "." doubled (dot-stuffing). */
static void sess_body(srv_sess *ss, const char *text, size_t len) {
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t l = nl ? (size_t)(nl - p) : (size_t)(end - p);
        sess_printf(ss, "%s%.*s\n", *p == '.' ? "." : "", (int)l, p);
        p += l + (nl != NULL);
    }
    sess_printf(ss, ".\n");
}

/* ------------------------------------------------------------------ sessions */

static void sess_free(srv_sess *ss);
static void sess_flush(srv_sess *ss);
static void kick(srv *s);
static void http_done(struct srv_http *h, int abort);

/* Detach the session's requests and cancel them: their blocks go back to the pool
 * now, or when the step in flight completes. */
static void sess_drop_requests(srv_sess *ss) {
    srv_req *r = ss->reqs;
    ss->reqs = NULL;
    ss->n_reqs = 0;
    while (r) {
        srv_req *next = r->next;
        r->sess = NULL;
        r->next = NULL;
        eng_cancel(ss->s->eng, r->eng_id); /* may finish (and recycle) r right here */
        r = next;
    }
    kick(ss->s);
}

/* The connection is gone or must go now: cancel, forget, free. */
static void sess_kill(srv_sess *ss, int abort) {
    if (ss->c) abort ? net_abort(ss->c) : net_close(ss->c);
    ss->c = NULL;
    sess_free(ss);
}

/* Finish what is queued, then close_notify and FIN; input is read and dropped for a
 * short linger so the peer sees our last lines rather than a reset. */
static void sess_close(srv_sess *ss) {
    sess_drop_requests(ss);
    ss->close_when_flushed = 1;
    mark_dirty(ss);
}

static void start_linger(srv_sess *ss) {
    int r = tls_close_notify(ss->tls);
    if (r == 0) return; /* again when writable */
    ss->state = SS_CLOSING;
    ss->deadline_ms = loop_now_ms() + SRV_LINGER_MS;
}

static void pause_requests(srv_sess *ss, int on) {
    if (ss->paused == on) return;
    ss->paused = on;
    for (srv_req *r = ss->reqs; r; r = r->next) {
        eng_pause(ss->s->eng, r->eng_id, on);
        r->paused = on;
    }
    if (!on) kick(ss->s);
}

static void sess_flush(srv_sess *ss) {
    if (!ss->c || !ss->tls) return;
    if (ss->broken) {
        srv_log(ss->s, CFG_LOG_WARN, "session %d: output over its hard limit; reset", ss->num);
        sess_kill(ss, 1);
        return;
    }
    if (ss->s->fault_write_n > 0 && ss->n_reqs > 0 && ss->out_len > ss->out_head && ss->state == SS_READY) {
        ss->s->fault_write_n--; /* as a write to a peer that vanished: ECONNRESET */
        srv_log(ss->s, CFG_LOG_WARN, "fault: session %d: write failed", ss->num);
        sess_kill(ss, 1);
        return;
    }
    while (ss->out_len > ss->out_head) {
        ssize_t n = tls_write(ss->tls, ss->out + ss->out_head, ss->out_len - ss->out_head);
        if (n == -EAGAIN) break;
        if (n < 0) {
            srv_log(ss->s, CFG_LOG_INFO, "session %d: TLS write: %s", ss->num, tls_error(ss->tls));
            sess_kill(ss, 1);
            return;
        }
        ss->out_head += (size_t)n;
    }
    size_t pending = ss->out_len - ss->out_head;
    if (pending == 0) ss->out_head = ss->out_len = 0;
    size_t budget = (size_t)ss->s->cfg.net.max_output_bytes;
    if (!ss->paused && pending > budget) pause_requests(ss, 1);
    else if (ss->paused && pending <= budget / 2) pause_requests(ss, 0);
    if (pending == 0 && ss->close_when_flushed && ss->state != SS_CLOSING) start_linger(ss);
}

/* ------------------------------------------------------------------ the engine's callbacks */

static void on_token(void *ud, int64_t id, int sample, int32_t tok, const char *text, int len,
                     float lp) {
    (void)id;
    srv_req *r = ud;
    srv *s = r->owner;
    double t = now_s();
    if (tok >= 0 && r->t_last[sample] > 0) met_observe(s->met, s->m_itl, t - r->t_last[sample]);
    if (tok >= 0) r->t_last[sample] = t;
    srv_sess *ss = r->sess;
    if (!ss || len <= 0) return; /* nothing to show yet (held back), or nobody to show it to */
    sess_printf(ss, "TOK %s ", r->id);
    sess_quote(ss, text, (size_t)len);
    if (r->n > 1) sess_printf(ss, " sample=%d", sample);
    if (r->logprobs && tok >= 0) sess_printf(ss, " token=%d logprob=%.6g", tok, lp);
    sess_printf(ss, "\n");
}

static void req_unlink(srv_sess *ss, srv_req *r) {
    for (srv_req **p = &ss->reqs; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            ss->n_reqs--;
            return;
        }
}

static void on_finish(void *ud, int64_t id, int sample, int reason, const eng_usage *u,
                      const char *msg) {
    (void)id;
    srv_req *r = ud;
    srv_sess *ss = r->sess;
    srv *s = r->owner;
    static const char *const reasons[] = {"stop", "length", "cancelled", "error"};
    met_inc(s->met, s->m_reason[reason], 1);
    met_observe(s->met, s->m_e2e, u->e2e_s);
    if (u->completion_tokens > 0) met_observe(s->met, s->m_ttft, u->ttft_s);
    if (ss) {
        if (reason == EF_ERROR) {
            if (!r->failed++) sess_err(ss, r->id, 500, "internal", msg);
        } else if (!r->failed) {
            double tpot = u->completion_tokens > 1
                              ? (u->e2e_s - u->ttft_s) / (u->completion_tokens - 1) : 0.0;
            sess_printf(ss, "END %s reason=%s prompt_tokens=%d completion_tokens=%d cached_tokens=%d "
                        "ttft_ms=%.1f tpot_ms=%.2f e2e_ms=%.1f",
                        r->id, reasons[reason], u->prompt_tokens, u->completion_tokens,
                        u->cached_tokens, u->ttft_s * 1e3, tpot * 1e3, u->e2e_s * 1e3);
            if (r->n > 1) sess_printf(ss, " sample=%d", sample);
            sess_printf(ss, "\n");
        }
    }
    if (++r->n_done < r->n) return;
    drive_note_finished(&s->drv);
    if (ss) req_unlink(ss, r);
    r->sess = NULL;
    r->next = s->free_reqs;
    s->free_reqs = r;
}

/* ------------------------------------------------------------------ driving the engine */

/* The loop's before-sleep hook: what the callbacks buffered leaves, one write per
 * session, before the loop waits again. */
static void flush_dirty(srv *s) {
    while (s->dirty) {
        srv_sess *ss = s->dirty;
        s->dirty = ss->next_dirty;
        ss->dirty = 0;
        ss->next_dirty = NULL;
        sess_flush(ss); /* may free ss */
    }
}

static void before_sleep(loop_t *l, void *ud) {
    (void)l;
    flush_dirty(ud);
}

static void kick(srv *s) {
    if (s->drv.eng) drive_kick(&s->drv);
}

/* Nothing left to run: when draining is done, close every session, then stop. */
static void on_idle(void *ud, int pending) {
    srv *s = ud;
    if (pending || !s->stopping || s->goodbye_ms) return;
    s->goodbye_ms = loop_now_ms() + SRV_GOODBYE_MS;
    for (srv_sess *ss = s->sessions; ss; ss = ss->next) sess_close(ss);
    flush_dirty(s);
}

static void on_drive_log(void *ud, int level, const char *msg) { srv_log(ud, level, "%s", msg); }

/* ------------------------------------------------------------------ verbs */

static void verb_hello(srv_sess *ss, const proto_line *l) {
    proto_hello h;
    char err[256];
    srv *s = ss->s;
    int role = ROLE_NONE;
    if (proto_hello_parse(l, &h, err, sizeof err) == 0) role = token_role(s, h.token);
    if (role == ROLE_NONE) {
        srv_log(s, CFG_LOG_INFO, "session %d: HELLO refused", ss->num);
        sess_err(ss, "-", 401, "unauthorized", NULL);
        sess_close(ss);
        return;
    }
    ss->role = role, ss->state = SS_READY, ss->deadline_ms = 0;
    sess_printf(ss, "OK kiln/1 model=");
    sess_quote(ss, s->env.model_name, strlen(s->env.model_name));
    sess_printf(ss, " ctx=%d session=%d role=%s\n", s->env.max_seq_len, ss->num,
                role == ROLE_ADMIN ? "admin" : "user");
}

static srv_req *find_req(srv_sess *ss, const char *id) {
    for (srv_req *r = ss->reqs; r; r = r->next)
        if (!strcmp(r->id, id)) return r;
    return NULL;
}

static void verb_gen(srv_sess *ss, const proto_line *l) {
    srv *s = ss->s;
    proto_gen g;
    char err[256];
    if (proto_gen_parse(l, &g, err, sizeof err) < 0) {
        const proto_str *id = proto_get(l, "id");
        sess_err(ss, id && proto_id_ok(id->s, id->len) ? id->s : "-", 400, "bad_request", err);
        return;
    }
    if (s->draining) { sess_err(ss, g.id, 503, "draining", "the server is draining"); return; }
    if (s->drv.lad.level >= LADDER_SHED) { /* the ladder's third rung: running ones finish */
        sess_printf(ss, "ERR %s 503 overloaded retry_after_ms=%d\n", g.id, drive_retry_after_ms(&s->drv));
        met_inc(s->met, s->m_rejected, 1);
        met_inc(s->met, s->m_shed, 1);
        return;
    }
    if (find_req(ss, g.id)) { sess_err(ss, g.id, 409, "duplicate_id", "that id is in flight"); return; }
    if (ss->n_reqs >= s->cfg.net.max_requests_per_conn) {
        sess_err(ss, g.id, 429, "too_many", "too many requests in flight on this connection");
        return;
    }
    if (g.n > SRV_MAX_N) { sess_err(ss, g.id, 400, "bad_request", "n is too large"); return; }
    prompt_req pr = {g.system, g.prompt, g.prompt_len, g.chat, 0};
    int n_prompt = prompt_build(&s->pb, &pr);
    if (n_prompt < 0) { sess_err(ss, g.id, 400, "bad_request", prompt_strerror(n_prompt)); return; }
    if (n_prompt == 0) { sess_err(ss, g.id, 400, "bad_request", "the prompt is empty"); return; }
    int max_tokens = g.set & PG_MAX_TOKENS ? g.max_tokens : s->cfg.engine.default_max_tokens;
    if (n_prompt + max_tokens > s->env.max_seq_len) {
        snprintf(err, sizeof err, "prompt (%d tokens) + max_tokens (%d) exceeds the context (%d)",
                 n_prompt, max_tokens, s->env.max_seq_len);
        sess_err(ss, g.id, 413, "too_long", err);
        return;
    }
    srv_req *r = s->free_reqs;
    if (!r) {
        sess_printf(ss, "ERR %s 503 overloaded retry_after_ms=%d\n", g.id, SRV_RETRY_MS);
        met_inc(s->met, s->m_rejected, 1);
        return;
    }
    eng_params ep = {0};
    ep.prompt = s->pb.ids, ep.n_prompt = n_prompt, ep.n = g.n, ep.ud = r;
    ep.stops = g.stops, ep.n_stops = g.n_stops;
    ep.ignore_eog = g.ignore_eos, ep.logprobs = g.logprobs;
    ep.client = ss->num + 1; /* fairness across connections (0 would mean "anyone") */
    sampler_params *sp = &ep.sp;
    sampler_params_default(sp);
    const kiln_config *c = &s->cfg;
    sp->temperature = g.set & PG_TEMPERATURE ? g.temperature : (float)c->sampling.temperature;
    sp->top_p = g.set & PG_TOP_P ? g.top_p : (float)c->sampling.top_p;
    sp->top_k = g.set & PG_TOP_K ? g.top_k : c->sampling.top_k;
    sp->min_p = g.set & PG_MIN_P ? g.min_p : (float)c->sampling.min_p;
    sp->repeat_penalty = g.set & PG_REPEAT_PENALTY ? g.repeat_penalty : (float)c->sampling.repeat_penalty;
    sp->repeat_last_n = g.repeat_last_n;
    sp->presence_penalty = g.presence_penalty;
    sp->frequency_penalty = g.frequency_penalty;
    sp->seed = g.set & PG_SEED ? g.seed : c->sampling.seed;
    sp->max_tokens = max_tokens;
    if (max_tokens == 0) { /* nothing to generate: the usage alone */
        sess_printf(ss, "END %s reason=length prompt_tokens=%d completion_tokens=0 cached_tokens=0 "
                    "ttft_ms=0 tpot_ms=0 e2e_ms=0\n", g.id, n_prompt);
        return;
    }
    int64_t eid = eng_submit(s->eng, &ep, err, sizeof err);
    if (eid < 0) {
        if (eid == -EAGAIN) {
            sess_printf(ss, "ERR %s 503 overloaded retry_after_ms=%d\n", g.id, SRV_RETRY_MS);
            met_inc(s->met, s->m_rejected, 1);
        } else {
            sess_err(ss, g.id, eid == -E2BIG ? 413 : 400, eid == -E2BIG ? "too_long" : "bad_request", err);
        }
        return;
    }
    s->free_reqs = r->next;
    memset(r, 0, sizeof *r);
    r->owner = s, r->sess = ss, r->eng_id = eid, r->n = g.n, r->logprobs = g.logprobs;
    snprintf(r->id, sizeof r->id, "%s", g.id);
    r->next = ss->reqs;
    ss->reqs = r;
    ss->n_reqs++;
    s->requests_total++;
    if (ss->paused) eng_pause(s->eng, eid, 1), r->paused = 1;
    kick(s);
}

static void verb_cancel(srv_sess *ss, const proto_line *l) {
    const proto_str *id = l->n_pos == 1 && l->n_kv == 0 ? &l->pos[0] : proto_get(l, "id");
    if (!id || !proto_id_ok(id->s, id->len) || l->n_pos + l->n_kv != 1) {
        sess_err(ss, "-", 400, "bad_request", "usage: CANCEL <id>");
        return;
    }
    srv_req *r = find_req(ss, id->s);
    if (!r) { sess_err(ss, id->s, 404, "not_found", "no such request in flight"); return; }
    eng_cancel(ss->s->eng, r->eng_id); /* END reason=cancelled comes from on_finish */
    kick(ss->s);
}

static int live(const srv *s) {
    return drive_step_age_ms(&s->drv) < s->cfg.engine.step_timeout_ms;
}
static int ready(const srv *s) { return !s->draining && s->drv.lad.level < LADDER_SHED; }

int srv_health(const srv *s, char *out, size_t cap) {
    eng_stats st;
    eng_get_stats(s->eng, &st);
    return snprintf(out, cap, "HEALTH live=%d ready=%d level=%d running=%d waiting=%d draining=%d",
                    live(s), ready(s), s->drv.lad.level, st.running, st.waiting, s->draining);
}

int srv_stats(const srv *s, char *out, size_t cap) {
    eng_stats st;
    eng_get_stats(s->eng, &st);
    int total = s->env.kv->cfg.n_blocks, used = total - kv_free_blocks(s->env.kv);
    return snprintf(out, cap, "STATS uptime_s=%lld requests_total=%lld running=%d waiting=%d "
                    "kv_blocks_used=%d kv_blocks_total=%d kv_blocks_cached=%d kv_usage=%.4f "
                    "prefix_hit_rate=%.4f prompt_tokens_total=%lld generation_tokens_total=%lld "
                    "preemptions_total=%lld connections=%d",
                    (long long)((loop_now_ms() - s->t_start_ms) / 1000), (long long)s->requests_total,
                    st.running, st.waiting, used, total, kv_cached_blocks(s->env.kv),
                    total ? (double)used / total : 0.0,
                    st.prefix_queries ? (double)st.prefix_hits / (double)st.prefix_queries : 0.0,
                    (long long)st.prompt_tokens, (long long)st.generation_tokens,
                    (long long)st.preemptions, s->n_sessions);
}

static void verb_health(srv_sess *ss) {
    char line[256];
    srv_health(ss->s, line, sizeof line);
    sess_printf(ss, "%s\n", line);
}

static void verb_stats(srv_sess *ss) {
    char line[1024];
    srv_stats(ss->s, line, sizeof line);
    sess_printf(ss, "%s\n", line);
}

/* The ladder's rung 2 in the metrics: 8-bit blocks, their share of the blocks held (in
 * use or cached), and conversions so far. */
static void set_kv8_metrics(srv *s) {
    const kv_pool *kv = s->env.kv;
    int held = kv->n_ids - kv->n_free, q8 = kv_q8_blocks(kv);
    met_set(s->met, s->m_kv8, q8);
    met_set(s->met, s->m_kv8_share, held > 0 ? (double)q8 / held : 0.0);
    met_inc(s->met, s->m_kv8_conv, (double)(kv->stats.q8_conversions - s->kv8_conv_seen));
    s->kv8_conv_seen = kv->stats.q8_conversions;
}

/* Gauges sampled now; engine counters advanced by what happened since the last render. */
static int render_metrics(srv *s) {
    eng_stats st;
    eng_get_stats(s->eng, &st);
    int total = s->env.kv->cfg.n_blocks, used = total - kv_free_blocks(s->env.kv);
    met_set(s->met, s->m_running, st.running);
    met_set(s->met, s->m_waiting, st.waiting);
    met_set(s->met, s->m_kv, total ? (double)used / total : 0.0);
    met_set(s->met, s->m_level, s->drv.lad.level);
    met_set(s->met, s->m_batch, s->drv.lad.batch);
    met_set(s->met, s->m_pressure, s->drv.lad.pressure);
    set_kv8_metrics(s);
    met_set(s->met, s->m_conns, s->n_sessions);
    met_set(s->met, s->m_up, live(s));
    met_inc(s->met, s->m_pq, (double)(st.prefix_queries - s->last.prefix_queries));
    met_inc(s->met, s->m_ph, (double)(st.prefix_hits - s->last.prefix_hits));
    met_inc(s->met, s->m_preempt, (double)(st.preemptions - s->last.preemptions));
    met_inc(s->met, s->m_ptok, (double)(st.prompt_tokens - s->last.prompt_tokens));
    met_inc(s->met, s->m_gtok, (double)(st.generation_tokens - s->last.generation_tokens));
    s->last = st;
    return met_render(s->met, s->metrics_text, SRV_METRICS_CAP);
}

static void verb_config(srv_sess *ss, const proto_line *l) {
    srv *s = ss->s;
    const proto_str *k = proto_get(l, "key");
    if (!k) {
        static char dump[CFG_DUMP_MAX];
        int n = cfg_dump(&s->cfg, dump, sizeof dump);
        if (n < 0) { sess_err(ss, "-", 500, "internal", "config too large"); return; }
        sess_body(ss, dump, (size_t)n);
        return;
    }
    char out[CFG_STR_MAX + 1];
    int r = srv_config_get(s, k->s, out, sizeof out);
    if (r < 0) {
        sess_err(ss, "-", r == -EINVAL ? 400 : 404, r == -EINVAL ? "bad_request" : "not_found",
                 r == -EINVAL ? "key=section.name" : "no such key");
        return;
    }
    size_t n = strlen(out), bare = n > 0;
    for (size_t i = 0; i < n && bare; i++) /* a bare word when it can be one */
        bare = (unsigned char)out[i] > 0x20 && (unsigned char)out[i] < 0x7f && out[i] != '"' && out[i] != '=';
    sess_printf(ss, "CONFIG %s=", k->s);
    if (bare) sess_printf(ss, "%s", out);
    else sess_quote(ss, out, n);
    sess_printf(ss, "\n");
}

static void verb_admin(srv_sess *ss, const char *verb, const proto_line *l) {
    srv *s = ss->s;
    if (ss->role != ROLE_ADMIN) { sess_err(ss, "-", 403, "forbidden", "an admin token is needed"); return; }
    char err[256];
    if (!strcmp(verb, "DRAIN")) {
        srv_set_draining(s, !(l->n_pos == 1 && !strcmp(l->pos[0].s, "off")));
        sess_printf(ss, "OK draining=%d\n", s->draining);
    } else if (!strcmp(verb, "LADDER")) {
        const proto_str *lv = proto_get(l, "level");
        if (lv) {
            int want = !strcmp(lv->s, "auto") ? -1 : lv->len == 1 && lv->s[0] >= '0' && lv->s[0] <= '3'
                                                         ? lv->s[0] - '0' : -2;
            if (want == -2 || drive_ladder_pin(&s->drv, want) < 0) {
                sess_err(ss, "-", 400, "bad_request", "usage: LADDER [level=0|1|2|3|auto]");
                return;
            }
            srv_log(s, CFG_LOG_WARN, "ladder %s by session %d", want < 0 ? "back to automatic" : "pinned",
                    ss->num);
        }
        sess_printf(ss, "LADDER level=%d name=%s pinned=%d batch=%d pressure=%.3f kv8=%d kv8_blocks=%d\n",
                    s->drv.lad.level, ladder_names[s->drv.lad.level], s->drv.lad.pinned >= 0, s->drv.lad.batch,
                    s->drv.lad.pressure, s->drv.lad.cfg.has_kv8, kv_q8_blocks(s->env.kv));
    } else if (!strcmp(verb, "CONFIG")) {
        verb_config(ss, l);
    } else if (!strcmp(verb, "UPDATE")) {
        verb_update(ss, l);
    } else if (!strcmp(verb, "REBOOT")) {
        verb_reboot(ss);
    } else if (!strcmp(verb, "RELOAD")) {
        int n = load_tokens(s, err, sizeof err);
        if (n < 0) sess_err(ss, "-", 500, "internal", err);
        else sess_printf(ss, "OK tokens=%d\n", n);
    } else if (!strcmp(verb, "FAULT")) {
        if (!s->env.faults) {
            sess_err(ss, "-", 403, "forbidden", "fault injection is off (kilnd serve --faults)");
        } else if (l->n_pos == 1 && !strcmp(l->pos[0].s, "drop_step")) {
            drive_fault_drop(&s->drv);
            srv_log(s, CFG_LOG_WARN, "fault drop_step armed by session %d", ss->num);
            sess_printf(ss, "OK fault=drop_step\n");
        } else if (l->n_pos == 1 && fault_arm(s, l->pos[0].s, l) == 0) {
            srv_log(s, CFG_LOG_WARN, "fault %s armed by session %d", l->pos[0].s, ss->num);
            sess_printf(ss, "OK fault=%s\n", l->pos[0].s);
        } else {
            sess_err(ss, "-", 400, "bad_request",
                     "usage: FAULT drop_step | slow_step ms=N count=K | kv_fail ms=N | write_fail count=K");
        }
    } else { /* RESTART */
        sess_printf(ss, "OK restarting\n");
        srv_drain(s, 1);
    }
}

static void handle_line(srv_sess *ss, char *line, size_t len) {
    if (len && line[len - 1] == '\r') len--;
    size_t i = 0;
    while (i < len && line[i] == ' ') i++;
    if (i == len) return; /* empty lines are allowed: keep-alives typed by hand */
    proto_line l;
    char err[256];
    if (proto_split(line, len, &l, err, sizeof err) < 0) {
        if (ss->state != SS_READY) {
            sess_err(ss, "-", 401, "unauthorized", "HELLO first");
            sess_close(ss);
        } else {
            sess_err(ss, "-", 400, "bad_request", err);
        }
        return;
    }
    const char *v = l.verb;
    if (ss->state != SS_READY) {
        if (!strcmp(v, "HELLO")) verb_hello(ss, &l);
        else {
            sess_err(ss, "-", 401, "unauthorized", "HELLO first");
            sess_close(ss);
        }
        return;
    }
    if (!strcmp(v, "GEN")) verb_gen(ss, &l);
    else if (!strcmp(v, "CANCEL")) verb_cancel(ss, &l);
    else if (!strcmp(v, "HEALTH")) verb_health(ss);
    else if (!strcmp(v, "STATS")) verb_stats(ss);
    else if (!strcmp(v, "METRICS")) {
        int n = render_metrics(ss->s);
        if (n < 0) sess_err(ss, "-", 500, "internal", "metrics too large");
        else sess_body(ss, ss->s->metrics_text, (size_t)n);
    } else if (!strcmp(v, "QUIT")) {
        sess_printf(ss, "OK bye\n");
        sess_close(ss);
    } else if (!strcmp(v, "DRAIN") || !strcmp(v, "LADDER") || !strcmp(v, "CONFIG") ||
               !strcmp(v, "RELOAD") || !strcmp(v, "RESTART") || !strcmp(v, "FAULT") || !strcmp(v, "UPDATE") ||
               !strcmp(v, "REBOOT")) {
        verb_admin(ss, v, &l);
    } else if (!strcmp(v, "HELLO")) {
        sess_err(ss, "-", 400, "bad_request", "already greeted");
    } else {
        snprintf(err, sizeof err, "unknown verb %s", v);
        sess_err(ss, "-", 400, "bad_request", err);
    }
}

/* Append received plaintext; handle each complete line. A line longer than
 * max_line_bytes ends the session with 413 (its bytes are not kept). */
static void sess_input(srv_sess *ss, const char *p, size_t n) {
    size_t max = (size_t)ss->s->cfg.net.max_line_bytes;
    while (n > 0 && !ss->close_when_flushed) {
        if (ss->raw_left) { /* an UPDATE's bytes */
            size_t take = n < ss->raw_left ? n : (size_t)ss->raw_left;
            update_data(ss, p, take);
            p += take, n -= take;
            continue;
        }
        const char *nl = memchr(p, '\n', n);
        size_t take = nl ? (size_t)(nl - p) : n;
        if (ss->in_len + take > max) {
            srv_log(ss->s, CFG_LOG_INFO, "session %d: line over %zu bytes", ss->num, max);
            sess_err(ss, "-", 413, "too_long", "line longer than max_line_bytes");
            sess_close(ss);
            return;
        }
        if (ss->in_len + take + 1 > ss->in_cap) {
            size_t cap = ss->in_cap ? ss->in_cap : 1024;
            while (cap < ss->in_len + take + 1) cap *= 2;
            if (cap > max + 1) cap = max + 1;
            char *q = realloc(ss->in, cap);
            if (!q) { sess_err(ss, "-", 500, "internal", "out of memory"); sess_close(ss); return; }
            ss->in = q, ss->in_cap = cap;
        }
        memcpy(ss->in + ss->in_len, p, take);
        ss->in_len += take;
        if (!nl) return;
        p += take + 1, n -= take + 1;
        handle_line(ss, ss->in, ss->in_len);
        ss->in_len = 0;
    }
}

/* ------------------------------------------------------------------ transport events */

static ssize_t bio_read(void *ctx, void *buf, size_t cap) { return net_read(ctx, buf, cap); }
static ssize_t bio_write(void *ctx, const void *buf, size_t len) { return net_write(ctx, buf, len); }

static int resume_later(srv_sess *ss);

static void on_readable(void *ud) {
    srv_sess *ss = ud;
    srv *s = ss->s;
    if (ss->state == SS_TLS) {
        int r = tls_handshake(ss->tls);
        if (r < 0) {
            srv_log(s, CFG_LOG_INFO, "session %d: TLS handshake failed: %s", ss->num, tls_error(ss->tls));
            sess_kill(ss, 1);
            return;
        }
        if (r == 0) return;
        ss->state = SS_HELLO;
        srv_log(s, CFG_LOG_DEBUG, "session %d: %s %s", ss->num, tls_version(ss->tls), tls_suite(ss->tls));
    }
    char buf[16384];
    size_t raw = 0;
    for (;;) { /* until -EAGAIN: decrypted bytes may wait inside TLS with nothing new below */
        if (ss->raw_left && raw >= SRV_UPD_SLICE && resume_later(ss) == 0) break; /* others' turn */
        ssize_t n = tls_read(ss->tls, buf, sizeof buf);
        if (n == -EAGAIN) break;
        if (n <= 0) {
            if (n < 0) srv_log(s, CFG_LOG_INFO, "session %d: %s", ss->num, tls_error(ss->tls));
            sess_kill(ss, n < 0);
            return;
        }
        ss->last_rx_ms = loop_now_ms();
        if (ss->state == SS_CLOSING || ss->close_when_flushed) continue; /* dropped */
        if (ss->raw_left) raw += (size_t)n;
        sess_input(ss, buf, (size_t)n);
    }
    flush_dirty(s);
    kick(s);
}

static void on_writable(void *ud) {
    srv_sess *ss = ud;
    if (ss->state == SS_TLS) { on_readable(ud); return; }
    if (ss->state == SS_CLOSING) return;
    sess_flush(ss); /* may free ss */
}

static void on_closed(void *ud, int err) {
    srv_sess *ss = ud;
    srv_log(ss->s, CFG_LOG_DEBUG, "session %d: connection lost (%s)", ss->num, strerror(-err));
    ss->c = NULL; /* the transport freed it */
    sess_free(ss);
}

static const net_conn_ops sess_ops = {on_readable, on_writable, on_closed};

static int on_accept(void *lud, net_conn *c, const net_conn_ops **ops, void **ud) {
    srv *s = lud;
    if (s->n_sessions >= s->cfg.net.max_connections) return -EMFILE;
    srv_sess *ss = calloc(1, sizeof *ss);
    if (!ss) return -ENOMEM;
    char err[256];
    tls_bio bio = {c, bio_read, bio_write};
    ss->tls = tls_conn_new(s->tls, &bio, err, sizeof err);
    if (!ss->tls) {
        free(ss);
        return -ENOMEM;
    }
    ss->s = s, ss->c = c, ss->state = SS_TLS, ss->num = ++s->next_num;
    ss->deadline_ms = loop_now_ms() + s->cfg.net.handshake_timeout_ms;
    ss->last_rx_ms = loop_now_ms();
    ss->next = s->sessions;
    if (s->sessions) s->sessions->prev = ss;
    s->sessions = ss;
    s->n_sessions++;
    *ops = &sess_ops, *ud = ss;
    if (s->cfg.log.level >= CFG_LOG_DEBUG) {
        char peer[64] = "?";
        net_peer(c, peer, sizeof peer);
        srv_log(s, CFG_LOG_DEBUG, "session %d: connection from %s", ss->num, peer);
    }
    return 0;
}

static void sess_free(srv_sess *ss) {
    srv *s = ss->s;
    sess_drop_requests(ss);
    update_lost(ss);
    if (ss->resume_timer > 0) loop_timer_del(s->env.loop, ss->resume_timer);
    if (ss->c) net_abort(ss->c);
    if (ss->dirty) { /* off the flush list */
        for (srv_sess **p = &s->dirty; *p; p = &(*p)->next_dirty)
            if (*p == ss) { *p = ss->next_dirty; break; }
    }
    if (ss->prev) ss->prev->next = ss->next;
    else s->sessions = ss->next;
    if (ss->next) ss->next->prev = ss->prev;
    s->n_sessions--;
    tls_conn_free(ss->tls);
    free(ss->in);
    free(ss->out);
    free(ss);
}

/* A step ran past step_timeout_ms (a hung device or driver): the engine cannot be
 * trusted to finish anything, so every request in flight gets `ERR id 503 restarting`
 * now, the connections close, and kilnd exits for its supervisor to restart it. */
static void step_hung(srv *s) {
    srv_log(s, CFG_LOG_ERROR, "a step has run %lld ms (step_timeout_ms %d): restarting",
            (long long)drive_step_age_ms(&s->drv), s->cfg.engine.step_timeout_ms);
    s->hung = s->restart = s->draining = s->stopping = 1;
    drive_ladder_restart(&s->drv);
    for (srv_sess *ss = s->sessions; ss; ss = ss->next) {
        for (srv_req *r = ss->reqs; r; r = r->next) {
            sess_err(ss, r->id, 503, "restarting", "the engine stopped responding; retry");
            r->sess = NULL; /* the engine keeps the slot; nothing more goes out for it */
        }
        ss->reqs = NULL, ss->n_reqs = 0;
        sess_close(ss);
    }
    s->goodbye_ms = loop_now_ms() + SRV_GOODBYE_MS;
    flush_dirty(s);
}

/* ------------------------------------------------------------------ the network update */

/* UPDATE size=N sha256=HEX [tries=T] (admin): the bytes of a signed bundle go into the
 * inactive slot's partition (net/update.h), kiln-init verifies and activates it. The steps:
 * kiln-init is asked to remove the slot's boot entry (ASK update-begin), then `OK update`
 * and the client's N raw bytes (progress lines on the way), the hash compared, then
 * kiln-init is asked to verify and activate (ASK update-activate), and the session hears
 * `OK update done ...` or an ERR. Anything that breaks on the way activates nothing. */

static void update_reset(srv *s) {
    if (upd_busy(&s->up)) upd_abort(&s->up);
    if (s->up_sess) s->up_sess->raw_left = 0;
    s->up_state = UP_IDLE, s->up_sess = NULL, s->up_deadline_ms = 0;
}

static int ask_init(srv *s, const char *what) {
    char line[128];
    snprintf(line, sizeof line, "ASK %s", what);
    return s->notify ? s->notify(s->notify_ud, line) : 0;
}

/* The update failed: the session (if still there) hears why, the log says what is left:
 * before kiln-init said ready the slot may still have its entry (kiln-init refused: it
 * does), after that it has none. */
static void update_fail(srv *s, int code, const char *slug, const char *msg) {
    const char *left = s->up_state == UP_BEGIN ? (code == 422 ? "its boot entry unchanged" : "its boot entry perhaps removed")
                                               : "no boot entry";
    srv_log(s, CFG_LOG_WARN, "update refused: %s: nothing activated (slot %c: %s); the running slot is untouched", msg,
            s->up.slot, left);
    if (s->up_sess) sess_err(s->up_sess, "-", code, slug, msg);
    update_reset(s);
}

static void verb_update(srv_sess *ss, const proto_line *l) {
    srv *s = ss->s;
    proto_update u;
    char err[256];
    if (proto_update_parse(l, &u, err, sizeof err) < 0) { sess_err(ss, "-", 400, "bad_request", err); return; }
    if (!upd_enabled(&s->up)) {
        sess_err(ss, "-", 501, "not_implemented", "no slot to update: not booted from an A/B disk image");
        return;
    }
    if (s->up_state != UP_IDLE) { sess_err(ss, "-", 409, "busy", "another update is in progress"); return; }
    int r = upd_open(&s->up, u.size, u.sha256, err, sizeof err);
    if (r < 0) {
        sess_err(ss, "-", r == -EFBIG ? 413 : 500, r == -EFBIG ? "too_long" : "internal", err);
        return;
    }
    char what[32];
    snprintf(what, sizeof what, "update-begin %c", s->up.slot);
    if (ask_init(s, what) <= 0) {
        upd_abort(&s->up);
        sess_err(ss, "-", 503, "unavailable", "no kiln-init on the control socket to activate an update");
        return;
    }
    /* From here the connection carries the bundle's bytes, not lines (sent after OK). */
    s->up_state = UP_BEGIN, s->up_sess = ss, s->up_tries = u.tries;
    s->up_deadline_ms = loop_now_ms() + SRV_UPD_BEGIN_MS;
    s->up_progress = SRV_UPD_PROGRESS;
    ss->raw_left = u.size;
    srv_log(s, CFG_LOG_INFO, "update: session %d sends %llu bytes for slot %c", ss->num, (unsigned long long)u.size, s->up.slot);
}

static void update_data(srv_sess *ss, const char *p, size_t n) {
    srv *s = ss->s;
    char err[256];
    if (s->up_sess != ss || s->up_state != UP_DATA) { /* bytes before OK: they cannot be told from lines */
        if (s->up_sess == ss) update_fail(s, 400, "bad_request", "update bytes before OK update");
        ss->raw_left = 0;
        sess_close(ss);
        return;
    }
    if (upd_write(&s->up, p, n, err, sizeof err) < 0) {
        update_fail(s, 500, "internal", err);
        sess_close(ss); /* the rest of the bytes would be read as lines */
        return;
    }
    ss->raw_left -= n;
    if (s->up.done >= s->up_progress || !ss->raw_left) {
        sess_printf(ss, "UPDATE progress bytes=%llu total=%llu\n", (unsigned long long)s->up.done, (unsigned long long)s->up.size);
        while (s->up_progress <= s->up.done) s->up_progress += SRV_UPD_PROGRESS;
    }
    if (ss->raw_left) return;
    int64_t t0 = loop_now_ms();
    int r = upd_finish(&s->up, err, sizeof err); /* the device's sync: the one long call */
    if (r < 0) { update_fail(s, r == -EBADMSG ? 422 : 500, r == -EBADMSG ? "refused" : "internal", err); return; }
    char what[48];
    snprintf(what, sizeof what, "update-activate %c tries=%d", s->up.slot, s->up_tries);
    if (ask_init(s, what) <= 0) { update_fail(s, 503, "unavailable", "kiln-init left the control socket"); return; }
    s->up_state = UP_ACTIVATE;
    s->up_deadline_ms = loop_now_ms() + SRV_UPD_ACTIVATE_MS;
    sess_printf(ss, "UPDATE verifying slot=%c\n", s->up.slot);
    srv_log(s, CFG_LOG_INFO, "update: %llu bytes in slot %c (synced in %lld ms), sha256 good; kiln-init verifies",
            (unsigned long long)s->up.size, s->up.slot, (long long)(loop_now_ms() - t0));
}

/* The session goes: a transfer under way is over, and nothing is activated. */
static void update_lost(srv_sess *ss) {
    srv *s = ss->s;
    if (s->up_sess != ss) return;
    if (s->up_state == UP_ACTIVATE) { /* all bytes are in: kiln-init's answer goes to the log */
        s->up_sess = NULL;
        return;
    }
    s->up_sess = NULL;
    char msg[160];
    snprintf(msg, sizeof msg, "session %d lost after %llu of %llu bytes", ss->num, (unsigned long long)s->up.done,
             (unsigned long long)s->up.size);
    update_fail(s, 0, NULL, msg);
}

static void update_sweep(srv *s) {
    if (s->up_state != UP_BEGIN && s->up_state != UP_ACTIVATE) return;
    if (loop_now_ms() < s->up_deadline_ms) return;
    srv_sess *ss = s->up_sess;
    update_fail(s, 503, "unavailable", "kiln-init did not answer in time");
    if (ss) sess_close(ss); /* it may be sending bytes that are not lines */
}

int srv_update_answer(srv *s, const char *line) {
    char verdict[16], slot = 0;
    int used = 0;
    if (sscanf(line, "update %15s %c %n", verdict, &slot, &used) < 2 || slot != s->up.slot) return -ENOENT;
    const char *rest = used ? line + used : "";
    srv_sess *ss = s->up_sess;
    if (!strcmp(verdict, "ready") && s->up_state == UP_BEGIN) {
        s->up_state = UP_DATA;
        if (ss) sess_printf(ss, "OK update slot=%c max=%llu\n", s->up.slot, (unsigned long long)s->up.cap);
    } else if (!strcmp(verdict, "done") && s->up_state == UP_ACTIVATE) {
        unsigned version = 0;
        const char *v = strstr(rest, "version=");
        if (v) version = (unsigned)strtoul(v + 8, NULL, 10);
        srv_log(s, CFG_LOG_INFO, "update: slot %c verified and activated by kiln-init (%s); it boots next", s->up.slot, rest);
        if (ss) sess_printf(ss, "OK update done slot=%c version=%u tries=%d\n", s->up.slot, version, s->up_tries);
        update_reset(s);
    } else if (!strcmp(verdict, "refused") && (s->up_state == UP_BEGIN || s->up_state == UP_ACTIVATE)) {
        char msg[480];
        snprintf(msg, sizeof msg, "kiln-init: %s", rest);
        if (ss && s->up_state == UP_BEGIN) ss->raw_left = 0; /* no OK was sent: no bytes come */
        update_fail(s, 422, "refused", msg);
    } else {
        return -ENOENT;
    }
    flush_dirty(s);
    return 0;
}

void srv_set_notify(srv *s, srv_notify_fn fn, void *ud) { s->notify = fn, s->notify_ud = ud; }

/* REBOOT (admin): kiln-init drains kilnd and reboots the box (into a slot just updated). */
static void verb_reboot(srv_sess *ss) {
    srv *s = ss->s;
    if (s->up_state != UP_IDLE) { sess_err(ss, "-", 409, "busy", "an update is in progress"); return; }
    if (ask_init(s, "reboot") <= 0) {
        sess_err(ss, "-", 503, "unavailable", "no kiln-init on the control socket to reboot the box");
        return;
    }
    srv_log(s, CFG_LOG_WARN, "REBOOT by session %d: kiln-init reboots the box", ss->num);
    sess_printf(ss, "OK rebooting\n");
}

/* Reading an update's bytes pauses after a slice so the loop serves the others; this
 * picks it up again on the next pass. 0, or -1 (no timer: go on reading now). */
static int64_t resume_read(loop_t *l, int64_t id, void *ud) {
    (void)l, (void)id;
    srv_sess *ss = ud;
    ss->resume_timer = 0;
    on_readable(ss);
    return LOOP_NOMORE;
}

static int resume_later(srv_sess *ss) {
    if (ss->resume_timer > 0) return 0;
    int64_t t = loop_timer_add(ss->s->env.loop, 0, resume_read, ss);
    if (t < 0) return -1;
    ss->resume_timer = t;
    return 0;
}

/* ------------------------------------------------------------------ fault injection */

/* FAULT <what> [ms=N] [count=K] (admin, kilnd serve --faults only): slow_step delays the
 * next K step completions by N ms (a slow device); kv_fail makes every KV block
 * allocation fail for N ms (the engine preempts and waits, loses nothing); write_fail
 * makes the next K writes of sessions with requests in flight fail (a peer that
 * vanished: the session is reset, its requests cancelled and their blocks freed). -1
 * for an unknown fault or bad numbers. */
static int fault_arm(srv *s, const char *what, const proto_line *l) {
    const proto_str *ms = proto_get(l, "ms"), *count = proto_get(l, "count");
    long v_ms = ms ? strtol(ms->s, NULL, 10) : 0, v_n = count ? strtol(count->s, NULL, 10) : 1;
    if (v_ms < 0 || v_ms > 600000 || v_n < 1 || v_n > 1000000) return -1;
    if (!strcmp(what, "slow_step") && ms) {
        drive_fault_slow(&s->drv, (int)v_ms, (int)v_n);
    } else if (!strcmp(what, "kv_fail") && ms) {
        s->fault_kv_until = loop_now_ms() + v_ms;
        kv_fail_from(s->env.kv, 1);
    } else if (!strcmp(what, "write_fail")) {
        s->fault_write_n = (int)v_n;
    } else {
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ the degrade ladder */

/* After each tick of the ladder (sched/drive.c): its pressure, and when it moved, each
 * transition logged and counted. */
static void on_ladder_tick(void *ud, int moved) {
    srv *s = ud;
    const ladder *lad = &s->drv.lad;
    met_set(s->met, s->m_pressure, lad->pressure);
    if (!moved) return;
    for (int f = 0; f < LADDER_LEVELS; f++)
        for (int t = 0; t < LADDER_LEVELS; t++) {
            if (f == t) continue;
            uint64_t n = lad->transitions[f][t], seen = (uint64_t)met_value(s->met, s->m_trans[f][t]);
            if (n <= seen) continue;
            met_inc(s->met, s->m_trans[f][t], (double)(n - seen));
            srv_log(s, CFG_LOG_WARN, "ladder: %d (%s) -> %d (%s): pressure %.3f, batch %d%s", f,
                    ladder_names[f], t, ladder_names[t], lad->pressure, lad->batch,
                    t == LADDER_COMPACT && !lad->cfg.has_kv8 ? ", no 8-bit KV here: passed through" : "");
        }
    met_set(s->met, s->m_level, lad->level);
    met_set(s->met, s->m_batch, lad->batch);
}

/* drain_timeout_ms has passed with requests still running: each ends with ERR 503
 * draining (its END suppressed), and the engine drops it. */
static void drain_expire(srv *s) {
    s->drain_expired = 1;
    int n = 0;
    for (srv_sess *ss = s->sessions; ss; ss = ss->next)
        for (srv_req *r = ss->reqs, *next; r; r = next) {
            next = r->next; /* eng_cancel may finish (and recycle) r right here */
            if (!r->failed++) sess_err(ss, r->id, 503, "draining", "drain_timeout_ms passed; retry elsewhere");
            eng_cancel(s->eng, r->eng_id);
            n++;
        }
    srv_log(s, CFG_LOG_WARN, "drain: %d ms passed, %d request(s) ended with 503",
            s->cfg.engine.drain_timeout_ms, n);
    flush_dirty(s);
    kick(s);
}

/* Handshake/HELLO deadlines, idle connections, lingering closes. */
static int64_t sweep(loop_t *l, int64_t id, void *ud) {
    (void)l, (void)id;
    srv *s = ud;
    int64_t now = loop_now_ms();
    if (!s->hung && drive_step_age_ms(&s->drv) > s->cfg.engine.step_timeout_ms)
        step_hung(s);
    if (s->fault_kv_until && now >= s->fault_kv_until) { /* FAULT kv_fail: the window is over */
        s->fault_kv_until = 0;
        kv_fail_from(s->env.kv, 0);
        srv_log(s, CFG_LOG_WARN, "fault kv_fail over");
        kick(s);
    }
    if (s->draining && !s->hung && !s->drain_expired &&
        now - s->drain_since_ms >= s->cfg.engine.drain_timeout_ms)
        drain_expire(s);
    update_sweep(s);
    for (srv_sess *ss = s->sessions, *next; ss; ss = next) {
        next = ss->next;
        if (ss->state == SS_CLOSING) {
            if (now >= ss->deadline_ms) sess_kill(ss, 0);
        } else if (ss->state != SS_READY) {
            if (now >= ss->deadline_ms) {
                srv_log(s, CFG_LOG_INFO, "session %d: handshake timeout", ss->num);
                sess_kill(ss, 1);
            }
        } else if (!ss->n_reqs && !ss->close_when_flushed &&
                   now - ss->last_rx_ms >= s->cfg.net.idle_timeout_ms) {
            sess_err(ss, "-", 408, "idle_timeout", NULL);
            sess_close(ss);
        }
    }
    for (struct srv_http *h = s->https, *next; h; h = next) {
        next = h->next;
        if (now >= h->deadline_ms) http_done(h, 1);
    }
    flush_dirty(s);
    if (s->goodbye_ms && (s->n_sessions == 0 || now >= s->goodbye_ms)) loop_stop(s->env.loop);
    return SRV_SWEEP_MS;
}

/* ------------------------------------------------------------------ HTTP /metrics */

static void http_unlink(srv_http *h) {
    srv *s = h->s;
    if (h->prev) h->prev->next = h->next;
    else s->https = h->next;
    if (h->next) h->next->prev = h->prev;
    s->n_http--;
    free(h->resp_buf);
    free(h);
}

static void http_done(srv_http *h, int abort) {
    abort ? net_abort(h->c) : net_close(h->c);
    http_unlink(h);
}

static void http_send(srv_http *h) {
    while (h->resp_len > 0) {
        ssize_t n = net_write(h->c, h->resp, h->resp_len);
        if (n == -EAGAIN) return;
        if (n < 0) { http_done(h, 1); return; }
        h->resp += n, h->resp_len -= (size_t)n;
    }
    http_done(h, 0);
}

static void http_respond(srv_http *h, int status, const char *ctype, const char *body, size_t blen,
                         int head_only) {
    char head[512];
    int hl = http_head(head, sizeof head, status, ctype, blen);
    if (hl < 0) { http_done(h, 1); return; }
    size_t total = (size_t)hl + (head_only ? 0 : blen);
    h->resp_buf = malloc(total);
    if (!h->resp_buf) { http_done(h, 1); return; }
    memcpy(h->resp_buf, head, (size_t)hl);
    if (!head_only) memcpy(h->resp_buf + hl, body, blen);
    h->resp = h->resp_buf, h->resp_len = total;
    http_send(h);
}

static void http_readable(void *ud) {
    srv_http *h = ud;
    if (h->resp_buf) { /* answered: drop whatever else comes */
        char sink[512];
        while (net_read(h->c, sink, sizeof sink) > 0) {}
        return;
    }
    for (;;) {
        ssize_t n = net_read(h->c, h->head + h->len, sizeof h->head - h->len);
        if (n == -EAGAIN) break;
        if (n <= 0) { http_done(h, n < 0); return; }
        h->len += (size_t)n;
        if (h->len == sizeof h->head) break;
    }
    http_req rq;
    int r = http_parse(h->head, h->len, &rq);
    if (r == 0) return;
    if (r < 0) { http_respond(h, -r, "text/plain", http_reason(-r), strlen(http_reason(-r)), 0); return; }
    srv *s = h->s;
    int head_only = rq.method == HTTP_HEAD;
    if (!strcmp(rq.path, "/metrics")) {
        int n = render_metrics(s);
        if (n < 0) http_respond(h, 500, "text/plain", "metrics too large\n", 18, head_only);
        else http_respond(h, 200, "text/plain; version=0.0.4; charset=utf-8", s->metrics_text, (size_t)n, head_only);
    } else if (!strcmp(rq.path, "/healthz")) {
        int ok = live(s);
        http_respond(h, ok ? 200 : 503, "text/plain", ok ? "ok\n" : "stalled\n", ok ? 3 : 8, head_only);
    } else if (!strcmp(rq.path, "/readyz")) {
        int ok = ready(s);
        http_respond(h, ok ? 200 : 503, "text/plain", ok ? "ready\n" : "not ready\n", ok ? 6 : 10, head_only);
    } else {
        http_respond(h, 404, "text/plain", "not found\n", 10, head_only);
    }
}

static void http_writable(void *ud) { http_send(ud); }

static void http_closed(void *ud, int err) {
    (void)err;
    http_unlink(ud);
}

static const net_conn_ops http_ops = {http_readable, http_writable, http_closed};

static int on_accept_http(void *lud, net_conn *c, const net_conn_ops **ops, void **ud) {
    srv *s = lud;
    if (s->n_http >= SRV_MAX_HTTP) return -EMFILE;
    srv_http *h = calloc(1, sizeof *h);
    if (!h) return -ENOMEM;
    h->s = s, h->c = c;
    h->deadline_ms = loop_now_ms() + SRV_HTTP_MS;
    h->next = s->https;
    if (s->https) s->https->prev = h;
    s->https = h;
    s->n_http++;
    *ops = &http_ops, *ud = h;
    return 0;
}

/* ------------------------------------------------------------------ setup */

static int add_metrics(srv *s) {
    metrics *m = s->met;
    static const double lat[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0};
    static const double itl[] = {0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
                                 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0};
    int nl = (int)(sizeof lat / sizeof lat[0]), ni = (int)(sizeof itl / sizeof itl[0]);
    s->m_up = met_add_gauge(m, "kiln_up", "1 while the event loop and the engine make progress", NULL);
    s->m_running = met_add_gauge(m, "kiln_num_requests_running", "Sequences running (prefill or decode)", NULL);
    s->m_waiting = met_add_gauge(m, "kiln_num_requests_waiting", "Sequences waiting to be scheduled", NULL);
    s->m_kv = met_add_gauge(m, "kiln_kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full)", NULL);
    s->m_pq = met_add_counter(m, "kiln_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache", NULL);
    s->m_ph = met_add_counter(m, "kiln_prefix_cache_hits_total", "Prompt tokens found in the prefix cache", NULL);
    s->m_preempt = met_add_counter(m, "kiln_num_preemptions_total", "Sequences preempted (blocks freed, recomputed later)", NULL);
    s->m_ptok = met_add_counter(m, "kiln_prompt_tokens_total", "Prompt tokens accepted", NULL);
    s->m_gtok = met_add_counter(m, "kiln_generation_tokens_total", "Tokens generated", NULL);
    static const char *const reasons[] = {"reason=\"stop\"", "reason=\"length\"", "reason=\"cancelled\"", "reason=\"error\""};
    for (int i = 0; i < 4; i++)
        s->m_reason[i] = met_add_counter(m, "kiln_request_success_total", "Samples finished, by reason", reasons[i]);
    s->m_rejected = met_add_counter(m, "kiln_requests_rejected_total", "Requests refused with 503 (queue full or shedding)", NULL);
    s->m_ttft = met_add_histogram(m, "kiln_time_to_first_token_seconds", "Arrival to first token", NULL, lat, nl);
    s->m_itl = met_add_histogram(m, "kiln_inter_token_latency_seconds", "Time between consecutive tokens of a sample", NULL, itl, ni);
    s->m_e2e = met_add_histogram(m, "kiln_e2e_request_latency_seconds", "Arrival to finish, per sample", NULL, lat, nl);
    s->m_level = met_add_gauge(m, "kiln_degrade_level", "Degrade ladder level (0 normal .. 4 restart)", NULL);
    s->m_conns = met_add_gauge(m, "kiln_connections_open", "Protocol connections open", NULL);
    s->m_batch = met_add_gauge(m, "kiln_effective_batch_size", "Max sequences per step now (the ladder halves it under pressure)", NULL);
    s->m_pressure = met_add_gauge(m, "kiln_memory_pressure", "Pressure the degrade ladder acts on (KV pool use, 0..1)", NULL);
    s->m_shed = met_add_counter(m, "kiln_requests_shed_total", "Requests refused by the ladder's shed rung (503 retry_after_ms)", NULL);
    s->m_kv8 = met_add_gauge(m, "kiln_kv_cache_8bit_blocks", "KV blocks held in 8 bits (the ladder's compact rung)", NULL);
    s->m_kv8_share = met_add_gauge(m, "kiln_kv_cache_8bit_share", "Share of the KV blocks held (in use or cached) that are 8-bit, 0..1", NULL);
    s->m_kv8_conv = met_add_counter(m, "kiln_kv_cache_8bit_conversions_total", "KV blocks turned to 8 bits", NULL);
    for (int f = 0; f < LADDER_LEVELS; f++)
        for (int t = 0; t < LADDER_LEVELS; t++) {
            char lab[48];
            snprintf(lab, sizeof lab, "from=\"%d\",to=\"%d\"", f, t);
            s->m_trans[f][t] = f == t ? 0 : met_add_counter(m, "kiln_degrade_transitions_total",
                                                            "Degrade ladder transitions", lab);
            if (s->m_trans[f][t] < 0) return -1;
        }
    int hs[] = {s->m_up, s->m_running, s->m_waiting, s->m_kv, s->m_pq, s->m_ph, s->m_preempt, s->m_ptok,
                s->m_gtok, s->m_reason[0], s->m_reason[1], s->m_reason[2], s->m_reason[3], s->m_rejected,
                s->m_ttft, s->m_itl, s->m_e2e, s->m_level, s->m_conns, s->m_batch, s->m_pressure,
                s->m_shed, s->m_kv8, s->m_kv8_share, s->m_kv8_conv};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
        if (hs[i] < 0) return -1;
    return 0;
}

srv *srv_new(const srv_env *env, char *err, size_t errlen) {
    srv *s = calloc(1, sizeof *s);
    if (!s) { snprintf(err, errlen, "out of memory"); return NULL; }
    s->env = *env;
    s->cfg = *env->cfg;
    if (upd_init(&s->up, env->update_slot) < 0) {
        snprintf(err, errlen, "--update-slot wants a|b:PATH, not %.64s", env->update_slot);
        free(s);
        return NULL;
    }
    s->t_start_ms = loop_now_ms();
    const kiln_config *c = &s->cfg;
    char e2[512];
    if (load_tokens(s, err, errlen) < 0) goto fail;
    tls_config tc = {c->net.cert, c->net.key, c->net.client_ca, c->net.client_ca[0] != 0};
    if (!(s->tls = tls_server_new(&tc, e2, sizeof e2))) {
        snprintf(err, errlen, "TLS: %s", e2);
        goto fail;
    }
    s->n_req_slots = c->engine.max_queued_requests;
    s->reqs = calloc((size_t)s->n_req_slots, sizeof *s->reqs);
    s->metrics_text = malloc(SRV_METRICS_CAP);
    s->met = met_new(64);
    int chat_kind = prompt_chat_kind(&env->m->gguf, c->model.chat_template);
    if (prompt_init(&s->pb, env->tok, chat_kind, 2 * (size_t)c->net.max_line_bytes) < 0 || !s->reqs ||
        !s->metrics_text || !s->met || add_metrics(s) < 0) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (int i = s->n_req_slots - 1; i >= 0; i--) s->reqs[i].next = s->free_reqs, s->free_reqs = &s->reqs[i];
    eng_config ec = {.max_batch_size = c->engine.max_batch_size,
                     .max_batched_tokens = c->engine.max_batched_tokens,
                     .max_seq_len = env->max_seq_len,
                     .max_seqs = env->kv->cfg.max_seqs,
                     .max_queued_requests = c->engine.max_queued_requests,
                     .max_queued_tokens = c->engine.max_queued_tokens,
                     .prefix_caching = c->engine.prefix_caching};
    eng_callbacks cb = {on_token, on_finish};
    if (!(s->eng = eng_new(&ec, env->m, env->tok, env->kv, env->be, &cb, err, errlen))) goto fail;
    drive_hooks dh = {.idle = on_idle, .log = on_drive_log, .ladder_tick = on_ladder_tick, .ud = s};
    if (drive_init(&s->drv, env->loop, s->eng, env->be, env->kv, &dh) < 0) {
        snprintf(err, errlen, "cannot watch the backend's event fd");
        goto fail;
    }
    loop_set_before_sleep(env->loop, before_sleep, s);
    if (net_listen(env->net, c->net.listen_host, c->net.listen_port, on_accept, s, e2, sizeof e2) < 0) {
        snprintf(err, errlen, "listen %s:%d: %s", c->net.listen_host, c->net.listen_port, e2);
        goto fail;
    }
    if (c->net.metrics_port &&
        net_listen(env->net, c->net.listen_host, c->net.metrics_port, on_accept_http, s, e2, sizeof e2) < 0) {
        snprintf(err, errlen, "listen %s:%d (metrics): %s", c->net.listen_host, c->net.metrics_port, e2);
        goto fail;
    }
    s->sweep_timer = loop_timer_add(env->loop, SRV_SWEEP_MS, sweep, s);
    if (s->sweep_timer < 0) { snprintf(err, errlen, "no timer for the sweep"); goto fail; }
    /* The ladder: rung 2 acts where the pool can hold 8-bit blocks (the CPU backend's,
     * [engine] kv_8bit); elsewhere it passes through to shedding. */
    ladder_config lc = {c->engine.ladder_high, c->engine.ladder_low, c->engine.ladder_hold_ms,
                        c->engine.max_batch_size, env->kv->cfg.kv8};
    int lr = drive_ladder_start(&s->drv, &lc, c->engine.ladder_tick_ms);
    if (lr < 0) {
        snprintf(err, errlen, lr == -EINVAL ? "[engine] ladder_low must be below ladder_high"
                                            : "no timer for the ladder");
        goto fail;
    }
    return s;
fail:
    srv_free(s);
    return NULL;
}

void srv_free(srv *s) {
    if (!s) return;
    while (s->sessions) sess_kill(s->sessions, 1);
    if (upd_busy(&s->up)) upd_abort(&s->up);
    while (s->https) http_done(s->https, 1);
    if (s->sweep_timer > 0) loop_timer_del(s->env.loop, s->sweep_timer);
    if (s->drv.loop) loop_set_before_sleep(s->env.loop, NULL, NULL);
    drive_free(&s->drv);
    eng_free(s->eng);
    tls_server_free(s->tls);
    met_free(s->met);
    prompt_free(&s->pb);
    free(s->reqs), free(s->metrics_text);
    free(s);
}

/* "section.name" split for cfg_get / cfg_set; -EINVAL when malformed. */
static int split_key(const char *key, char sec[32], const char **name) {
    const char *dot = strchr(key, '.');
    if (!dot || dot == key || dot - key >= 32 || !dot[1]) return -EINVAL;
    memcpy(sec, key, (size_t)(dot - key));
    sec[dot - key] = 0;
    *name = dot + 1;
    return 0;
}

int srv_config_get(const srv *s, const char *key, char *out, size_t cap) {
    char sec[32];
    const char *name;
    if (split_key(key, sec, &name) < 0) return -EINVAL;
    return cfg_get(&s->cfg, sec, name, out, cap) < 0 ? -ENOENT : 0;
}

/* Keys a running server can take at once: request defaults and per-connection limits.
 * The rest shape memory carved at start (pools, batch sizes, the model) or sockets. */
static int config_live(const char *key) {
    static const char *const live_keys[] = {
        "sampling.", "engine.default_max_tokens", "net.idle_timeout_ms",
        "net.handshake_timeout_ms", "net.max_output_bytes", "net.max_requests_per_conn",
        "log.level", NULL};
    for (int i = 0; live_keys[i]; i++)
        if (!strncmp(key, live_keys[i], strlen(live_keys[i])) &&
            (live_keys[i][strlen(live_keys[i]) - 1] == '.' || !key[strlen(live_keys[i])]))
            return 1;
    return 0;
}

int srv_config_set(srv *s, const char *key, const char *value, char *err, size_t errlen) {
    char sec[32];
    const char *name;
    if (split_key(key, sec, &name) < 0) { snprintf(err, errlen, "want section.key"); return -EINVAL; }
    kiln_config c = s->cfg;
    if (cfg_set(&c, sec, name, value, err, errlen) < 0 || cfg_validate(&c, err, errlen) < 0) return -EINVAL;
    if (!config_live(key)) {
        snprintf(err, errlen, "%s takes effect at the next start of kilnd", key);
        return -EAGAIN;
    }
    s->cfg = c;
    srv_log(s, CFG_LOG_INFO, "config %s = %s", key, value);
    return 0;
}

void srv_set_draining(srv *s, int on) {
    if (on && !s->draining) s->drain_since_ms = loop_now_ms(), s->drain_expired = 0;
    s->draining = on != 0;
    srv_log(s, CFG_LOG_INFO, "drain %s", on ? "on" : "off");
}

int srv_is_ready(const srv *s) { return ready(s); }
/* GENs served: samples that ended by stop or length (kiln-init blesses a slot on it) */
long long srv_served(const srv *s) {
    return (long long)(met_value(s->met, s->m_reason[EF_STOP]) + met_value(s->met, s->m_reason[EF_LENGTH]));
}
double srv_uptime_s(const srv *s) { return (double)(loop_now_ms() - s->t_start_ms) / 1e3; }
const char *srv_model_name(const srv *s) { return s->env.model_name; }

void srv_drain(srv *s, int restart) {
    if (!s->draining) s->drain_since_ms = loop_now_ms(), s->drain_expired = 0;
    s->draining = 1;
    s->restart |= restart;
    s->stopping = 1;
    srv_log(s, CFG_LOG_INFO, "draining%s", restart ? " for a restart" : "");
    kick(s);
}

int srv_exit_code(const srv *s) { return s->restart ? SRV_EXIT_RESTART : 0; }
int srv_hung(const srv *s) { return s->hung; }
