/* srv_int: the server's private structures and the functions its files share (net/server.c,
 * net/srv_*.c). Nothing outside net/server*.c and net/srv_*.c includes it. */
#ifndef KILN_SRV_INT_H
#define KILN_SRV_INT_H

#include "net/server.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/prompt.h"
#include "core/sampler.h"
#include "mm/heap.h"
#include "net/api.h"
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
#define SRV_LAG_WINDOW_MS 10000 /* the longest loop pass shown is of the last 10-20 s */
#define SRV_METRICS_CAP (256 * 1024)
#define SRV_RETRY_MS DRIVE_SHED_MIN_MS /* retry_after_ms when the engine is full */
_Static_assert((int)DRIVE_LOG_ERROR == (int)CFG_LOG_ERROR && (int)DRIVE_LOG_WARN == (int)CFG_LOG_WARN,
               "the driver logs at the config's levels");
#define SRV_EXIT_RESTART 75   /* EX_TEMPFAIL: the supervisor restarts kilnd */
#define SRV_MAX_HTTP 64       /* scrapes and probes at once */
#define SRV_HTTP_HEAD_MS 2000 /* a probe's request must have come within this */
#define SRV_HTTP_MS 10000     /* an HTTP request and its answer must fit in this */
#define SRV_GOODBYE_MS 1500   /* after draining: time for the last lines to leave */
#define SRV_GOAWAY_IDLE_MS 1000 /* after GOAWAY: a connection this long idle is closed */
#define SRV_UPD_BEGIN_MS 10000     /* kiln-init removes the slot's boot entry within this */
#define SRV_UPD_ACTIVATE_MS 180000 /* ... and verifies and activates the slot within this */
#define SRV_UPD_PROGRESS (1u << 20) /* an UPDATE progress line every this many bytes */
#define SRV_UPD_SLICE (4u << 20)   /* update bytes taken per wakeup before the loop goes on */
/* A connection's input per loop pass: then the others' turn (a client sending without
 * pause must not hold the loop, its timers included). */
#define SRV_READ_SLICE (64u << 10) /* bytes */
#define SRV_READ_LINES 256         /* protocol lines, empty ones included */
#define SRV_PENDING_QUIET_MS 1000  /* a connection before HELLO this long silent may be dropped */

enum { ROLE_NONE, ROLE_USER, ROLE_ADMIN };
enum { SS_TLS, SS_HELLO, SS_READY, SS_CLOSING };
/* What a connection speaks: told by ALPN, or else by its first bytes (net/srv_sess.c) */
enum { SK_UNKNOWN, SK_LINE, SK_HTTP };
#define SRV_SNIFF_MAX 8 /* bytes that tell an HTTP method + SP from a protocol verb */
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
    struct srv_api_req *api; /* an OpenAI API request's answer being built; NULL for GEN */
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
    int broken;            /* output could not be buffered: 1 closed with an ERR at the next
                            * flush, 2 done (deadline_ms: reset then if still unflushed) */
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
    int kind;              /* SK_* */
    char *held;            /* input read but not yet handled (the pass's budget ran out, or
                            * the output is over max_output_bytes): held[held_off, held_len) */
    size_t held_off, held_len;
    int read_blocked;      /* input stopped until the output drains below half the limit */
    int pass_lines;        /* lines handled in this pass */
    char sniff[SRV_SNIFF_MAX]; /* SK_UNKNOWN: the first bytes, until they tell */
    size_t sniff_len;
    /* SK_HTTP (net/srv_api.c): one request at a time; the next waits in `in` */
    int http_busy;         /* a request's answer is still being produced */
    int http_keep;         /* keep the connection after this answer */
    int http_chunked;      /* the answer's body is chunked (HTTP/1.1 streams) */
    int http_continued;    /* 100 Continue sent for the head at the front of `in` */
    int goaway;            /* GOAWAY sent (draining): closed once idle (the sweep) */
    int tok;               /* greeted: its token's entry in tokens[], else -1 */
    unsigned key_updates;  /* the client's TLS 1.3 KeyUpdates logged so far */
    char peer[48];         /* "a.b.c.d:port", for the logs */
};

/* An HTTP connection on metrics_port: one request, one response, close. */
typedef struct srv_http {
    struct srv_http *prev, *next; /* the open ones, or the free list (next) */
    srv *s;
    net_conn *c;
    char head[HTTP_HEAD_MAX];
    size_t len;
    const char *resp;      /* what is left to send */
    size_t resp_len;
    char *resp_buf;        /* from the server's heap */
    int64_t head_deadline_ms, deadline_ms;
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
    /* The connections' memory, reserved at init (srv_heap_bytes, net/server.c): sessions,
     * their input, output and held buffers, API answers being built, metrics responses,
     * and mbedTLS's per-session state (net/tls.c). Full: the new connection or request is
     * refused as when max_connections is full; nothing on the loop mallocs. */
    mm_heap heap;
    struct srv_http *http_slots, *free_https; /* [SRV_MAX_HTTP], and those unused */
    srv_sess *sessions, *dirty;
    int n_sessions, next_num;
    struct srv_http *https;
    int n_http;
    int64_t goodbye_ms;    /* drained: sessions closing, the loop stops at this time */
    srv_token tokens[SRV_MAX_TOKENS];
    int n_tokens;
    prompt_builder pb;     /* GEN's text to ids; its input is at most two lines or a body */
    api_parser api;        /* the OpenAI API's bodies */
    api_req *api_req;      /* the body being read (one at a time) */
    struct srv_api_buf *api_scratch; /* one response or event being built */
    char *metrics_text;    /* [SRV_METRICS_CAP] */
    int draining, restart;
    drive drv;             /* the engine on the loop; the ladder is drv.lad */
    int64_t drain_since_ms; /* when draining began; 0: not draining */
    int drain_expired;     /* drain_timeout_ms passed: the rest were ended */
    int hung;              /* a step overran step_timeout_ms: telling clients, then exit */
    int fault_write_n;     /* FAULT write_fail: the next n session writes fail (a reset) */
    int64_t fault_kv_until; /* FAULT kv_fail: every KV block allocation fails until then */
    int64_t fault_mem_until; /* FAULT conn_mem_fail: the heap refuses everything until then */
    int stopping;          /* srv_drain: stop the loop once nothing is pending */
    int64_t t_start_ms;
    int64_t sweep_timer;
    int64_t requests_total;
    eng_stats last;        /* engine counters already added to the metrics */
    /* metric handles */
    int m_running, m_waiting, m_kv, m_pq, m_ph, m_preempt, m_ptok, m_gtok, m_level, m_conns;
    int m_up, m_ttft, m_itl, m_e2e, m_reason[4], m_rejected;
    int m_trans[LADDER_LEVELS][LADDER_LEVELS], m_batch, m_pressure, m_shed;
    int m_kv8, m_kv8_share, m_kv8_conv, m_kv_swa;
    int m_proc_start, m_proc_cpu, m_proc_rss;
    int m_loop_pass, m_loop_max, m_paused;
    int m_queue, m_prefill, m_decode, m_infer; /* vLLM's request phase histograms */
    /* the transport's counters (lwIP only: m_net_on 0 for host sockets), net_counters
     * order; net_seen: what is already added to them */
    int m_net_on, m_net[17];
    net_counters net_seen;
    int64_t lag_max_us[2];  /* the longest loop pass: this window, the one before */
    int64_t lag_window_ms;  /* when this window began */
    uint64_t kv8_conv_seen; /* conversions already added to m_kv8_conv */
    uint64_t kv_swa_seen;   /* sliding-window frees already added to m_kv_swa */
    /* the network update (UPDATE): one at a time */
    upd up;
    int up_state, up_tries;
    srv_sess *up_sess;     /* the session that sent it; NULL once it is gone */
    int64_t up_deadline_ms; /* kiln-init's answer is due */
    uint64_t up_progress;  /* the next progress line at this many bytes */
    srv_notify_fn notify;  /* kiln-init's control socket (net/ctl.c) */
    /* DEBUG (net/srv_debug.c): the diagnostics window is open until this time (0: closed) */
    int64_t dbg_until_ms;
    char dbg_by[96];       /* who opened it, for the log and DEBUG's answer */
    void *notify_ud;
};

static inline double now_s(void) { return (double)loop_now_us() * 1e-6; }

/* net/server.c */
void srv_flush_dirty(srv *s);
void srv_kick(srv *s);
int srv_live(const srv *s);
int srv_ready(const srv *s);
int srv_render_metrics(srv *s);

/* net/srv_sess.c */
int srv_load_tokens(srv *s, char *err, size_t errlen);
/* The role of a token (ROLE_NONE when unknown) and, when idx is not NULL, its entry. */
int srv_token_role(const srv *s, const char *tok, int *idx);
/* A greeted session's token, within [net] max_connections_per_token: 0, or -1 (refused:
 * the caller answers 429 and closes). It may close the token's oldest idle session. */
int sess_token_admit(srv_sess *ss, int tok);
/* Requests in flight under token tok, over all its connections. */
int srv_token_requests(const srv *s, int tok);
void sess_printf(srv_sess *ss, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sess_quote(srv_sess *ss, const char *text, size_t len);
void sess_err(srv_sess *ss, const char *id, int code, const char *slug, const char *msg);
void sess_body(srv_sess *ss, const char *text, size_t len);
void sess_write(srv_sess *ss, const char *p, size_t n); /* bytes as they are */
/* sess_close for a session with no request in flight, safe inside the engine's callbacks
 * (it cancels nothing and kicks nothing) */
void sess_close_idle(srv_sess *ss);
/* Draining: tell a line-protocol client to go elsewhere (GOAWAY, docs/PROTOCOL.md) and
 * close once its requests are done. Admin sessions stay (they may want DRAIN off). */
void sess_goaway(srv_sess *ss);
void srv_goaway_all(srv *s);
void sess_kill(srv_sess *ss, int abort);
void sess_close(srv_sess *ss);
void sess_flush(srv_sess *ss);
int sess_accept(void *lud, net_conn *c, const net_conn_ops **ops, void **ud);

/* net/srv_gen.c */
/* Why gen_submit refused: GEN's code and slug, a message, and for 503 the client's wait. */
typedef struct {
    int code;
    const char *slug;
    char msg[256];
    int retry_ms;          /* > 0: retry_after_ms */
} gen_err;
/* The one way a request reaches the engine, for GEN and the OpenAI API alike: admission
 * (draining, the ladder's shed rung, the connection's limit), the prompt through
 * core/prompt (msgs: a conversation instead of g's system + prompt), the context check,
 * g's sampling over the config's defaults, eng_submit. 1: running as *rp (its id copied
 * from g->id); 0: nothing to generate (max_tokens 0), *n_prompt says the prompt's
 * tokens; -1: refused, *e says why (rejections counted in the metrics). */
int gen_submit(srv_sess *ss, const proto_gen *g, const chat_msg *msgs, int n_msgs, srv_req **rp,
               int *n_prompt, gen_err *e);
/* The request's client learns it failed (once; later samples end silently). */
void gen_fail(srv_req *r, int code, const char *slug, const char *msg);
void gen_on_token(void *ud, int64_t id, int sample, int32_t tok, const char *text, int len, float lp);
void gen_on_finish(void *ud, int64_t id, int sample, int reason, const eng_usage *u, const char *msg);
void verb_gen(srv_sess *ss, const proto_line *l);
void verb_cancel(srv_sess *ss, const proto_line *l);

/* net/srv_debug.c: the window ends when its time is up (the sweep) */
void srv_debug_sweep(srv *s);

/* net/srv_verbs.c */
void verb_line(srv_sess *ss, char *line, size_t len);

/* net/srv_update.c */
void verb_update(srv_sess *ss, const proto_line *l);
void update_data(srv_sess *ss, const char *p, size_t n);
void update_lost(srv_sess *ss);
void update_sweep(srv *s);
void verb_reboot(srv_sess *ss, const proto_line *l);

/* net/srv_fault.c */
void verb_fault(srv_sess *ss, const proto_line *l);

/* net/srv_api.c: HTTP/1.1 and the OpenAI API on the protocol port */
void api_sess_input(srv_sess *ss, const char *p, size_t n);
void api_on_token(srv_req *r, int sample, int32_t tok, const char *text, int len, float lp);
void api_on_finish(srv_req *r, int sample, int reason, const eng_usage *u, const char *msg);
void api_req_free(srv_req *r);     /* all samples ended: the answer's memory */
void api_fail(srv_req *r, int code, const char *slug, const char *msg);
int api_init(srv *s);              /* 0 or -ENOMEM */
void api_free(srv *s);

/* net/srv_http.c */
void srvh_done(srv_http *h, int abort);
int srvh_accept(void *lud, net_conn *c, const net_conn_ops **ops, void **ud);

#endif
