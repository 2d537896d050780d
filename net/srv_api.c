/* srv_api: HTTP/1.1 and the OpenAI-compatible API on the protocol's TLS port.
 *
 * A connection told apart as HTTP (ALPN http/1.1, or a method as its first word) sends
 * requests here: one at a time, keep-alive, the next one waiting in the session's input
 * buffer (bounded by [net] max_http_head_bytes + max_http_body_bytes). A generation is a
 * GEN with another framing: the body becomes GEN's request (net/api.h) and goes through
 * gen_submit, the same admission, ladder, engine, metrics and cancel-on-disconnect. Its
 * tokens become server-sent events on a chunked body (stream: true) or build the
 * response JSON, sent whole when the last sample ends; either way through the session's
 * bounded output buffer, so a slow reader pauses its request as on the line protocol.
 * Errors are OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}. */
#include "net/srv_int.h"

#include <math.h>
#include <strings.h>
#include <time.h>

/* The answer being built for one API request (srv_req.api). */
typedef struct srv_api_buf {
    mm_heap *h;            /* where p lives: the server's heap */
    char *p;
    size_t len, cap;
    int oom;               /* an append did not fit its bound: the answer is an error */
} api_buf;

typedef struct srv_api_req {
    int kind, stream, include_usage, logprobs, top_logprobs, n;
    char id[48];
    long long created;
    int head_sent;         /* stream: the 200 head is out */
    int prompt_tokens, completion_tokens, cached_tokens;
    int finish[SRV_MAX_N]; /* EF_* per sample, -1 still running */
    int started[SRV_MAX_N]; /* stream, chat: the role went out in a delta */
    size_t text_len[SRV_MAX_N]; /* bytes of text so far (completions' text_offset) */
    api_buf text[SRV_MAX_N]; /* not streamed: each choice's text, JSON-escaped */
    api_buf lp[SRV_MAX_N];  /* not streamed, logprobs: each choice's entries, rendered */
    api_buf lp2[SRV_MAX_N], lp3[SRV_MAX_N]; /* completions: token_logprobs, text_offset */
    api_buf lp4[SRV_MAX_N]; /* completions with logprobs N > 0: top_logprobs */
} srv_api_req;

static const char *const api_reasons[] = {"stop", "length", "stop", "stop"};

/* ---------------------------------------------------------------- buffers */

/* Room for n more bytes, within max (a response must fit the session's output bound). */
static int ab_room(api_buf *b, size_t n, size_t max) {
    if (b->oom) return -1;
    if (b->len + n <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n) cap *= 2;
    if (b->len + n > max) { b->oom = 1; return -1; }
    if (cap > max) cap = max;
    char *p = mm_heap_realloc(b->h, b->p, cap);
    if (!p) { b->oom = 1; return -1; }
    b->p = p, b->cap = cap;
    return 0;
}

static void ab_put(api_buf *b, size_t max, const char *s, size_t n) {
    if (n && ab_room(b, n, max) == 0) memcpy(b->p + b->len, s, n), b->len += n; /* s may be NULL when n is 0 */
}

/* a string literal, its length counted by the compiler */
#define AB_LIT(b, max, lit) ab_put((b), (max), "" lit, sizeof(lit) - 1)

static void ab_printf(api_buf *b, size_t max, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void ab_printf(api_buf *b, size_t max, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || ab_room(b, (size_t)n + 1, max) < 0) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* s[0..n) JSON-escaped, without quotes */
static void ab_esc(api_buf *b, size_t max, const char *s, size_t n) {
    if (!n) return;
    size_t need = API_JSON_ESCAPED_MAX(n);
    if (ab_room(b, need, max) < 0) return;
    long k = api_json_escape(b->p + b->len, b->cap - b->len, s, n);
    if (k > 0) b->len += (size_t)k;
}

/* "s" as a JSON string, or null */
static void ab_str(api_buf *b, size_t max, const char *s) {
    if (!s) { AB_LIT(b, max, "null"); return; }
    AB_LIT(b, max, "\"");
    ab_esc(b, max, s, strlen(s));
    AB_LIT(b, max, "\"");
}

static void ab_free(api_buf *b) {
    if (b->h) mm_heap_free(b->h, b->p);
    b->p = NULL, b->len = b->cap = 0, b->oom = 0; /* keeps h */
}

/* What one answer may hold: it goes into the session's output whole. */
static size_t api_max(const srv *s) { return 3 * (size_t)s->cfg.net.max_output_bytes; }

/* The server's scratch for one response or event, reset by each user: building an
 * answer never nests (one loop, one thread). */
static api_buf *api_scratch(srv *s) {
    api_buf *b = s->api_scratch;
    b->len = 0, b->oom = 0;
    return b;
}

/* ---------------------------------------------------------------- responses */

/* Once an answer is complete: the connection goes, or waits for the next request. */
static int64_t api_next_timer(loop_t *l, int64_t id, void *ud);

static void api_answered(srv_sess *ss) {
    ss->http_busy = 0;
    ss->http_continued = 0;
    if (!ss->http_keep) { sess_close_idle(ss); return; }
    /* a request already waiting is taken on the next pass of the loop, not from inside
     * the engine's callback that may have ended this one */
    if (ss->in_len && ss->resume_timer <= 0) {
        int64_t t = loop_timer_add(ss->s->env.loop, 0, api_next_timer, ss);
        if (t > 0) ss->resume_timer = t;
    }
}

static void api_head(srv_sess *ss, int status, const char *ctype, long long len, const char *extra) {
    if (ss->s->draining) ss->http_keep = 0; /* a draining box moves its clients elsewhere */
    sess_printf(ss, "HTTP/1.1 %d %s\r\n", status, http_reason(status));
    if (ctype) sess_printf(ss, "Content-Type: %s\r\n", ctype);
    if (len >= 0) sess_printf(ss, "Content-Length: %lld\r\n", len);
    else if (ss->http_chunked) sess_printf(ss, "Transfer-Encoding: chunked\r\n");
    sess_printf(ss, "Connection: %s\r\nCache-Control: no-store\r\n%s\r\n",
                ss->http_keep ? "keep-alive" : "close", extra ? extra : "");
}

static void api_respond(srv_sess *ss, int status, const char *ctype, const char *body, size_t len,
                        const char *extra) {
    api_head(ss, status, ctype, (long long)len, extra);
    sess_write(ss, body, len);
    api_answered(ss);
}

static const char *api_err_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 429: return "rate_limit_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

/* {"error": {...}} into b */
static void api_err_json(api_buf *b, size_t max, int status, const char *msg, const char *param,
                         const char *code) {
    ab_printf(b, max, "{\"error\":{\"message\":");
    ab_str(b, max, msg);
    ab_printf(b, max, ",\"type\":\"%s\",\"param\":", api_err_type(status));
    ab_str(b, max, param && *param ? param : NULL);
    ab_printf(b, max, ",\"code\":");
    ab_str(b, max, code);
    ab_printf(b, max, "}}");
}

/* An error answer's head and body; retry_ms > 0 adds Retry-After (whole seconds, rounded
 * up, from the same retry_after_ms a GEN's ERR line carries). The connection closes after
 * a 401 (as after a refused HELLO) or an internal error; api_process has already chosen to
 * close after input it could not read to its end. */
static void api_error_body(srv_sess *ss, int status, const char *msg, const char *param, const char *code,
                           int retry_ms, const char *allow) {
    api_buf *b = api_scratch(ss->s);
    api_err_json(b, api_max(ss->s), status, msg, param, code);
    AB_LIT(b, api_max(ss->s), "\n");
    char extra[160] = "";
    if (retry_ms > 0) snprintf(extra, sizeof extra, "Retry-After: %d\r\n", (retry_ms + 999) / 1000);
    else if (status == 401) snprintf(extra, sizeof extra, "WWW-Authenticate: Bearer\r\n");
    else if (allow) snprintf(extra, sizeof extra, "Allow: %s\r\n", allow);
    if (status == 401 || status == 500) ss->http_keep = 0;
    api_head(ss, status, "application/json", (long long)b->len, extra);
    sess_write(ss, b->p, b->len);
}

static void api_error(srv_sess *ss, int status, const char *msg, const char *param, const char *code,
                      int retry_ms) {
    api_error_body(ss, status, msg, param, code, retry_ms, NULL);
    api_answered(ss);
}

/* One piece of a chunked (or, for HTTP/1.0, close-delimited) body. */
static void api_chunk(srv_sess *ss, const char *p, size_t n) {
    if (!n) return;
    if (ss->http_chunked) sess_printf(ss, "%zx\r\n", n);
    sess_write(ss, p, n);
    if (ss->http_chunked) sess_printf(ss, "\r\n");
}

static void api_body_end(srv_sess *ss) {
    if (ss->http_chunked) sess_printf(ss, "0\r\n\r\n");
    else ss->http_keep = 0;
}

/* ---------------------------------------------------------------- answers' JSON */

/* The object's common opening: {"id":...,"object":...,"created":...,"model":..., */
static void api_open(srv *s, api_buf *b, const srv_api_req *a, int chunk) {
    size_t max = api_max(s);
    static const char *const objs[2][2] = {{"chat.completion", "chat.completion.chunk"},
                                           {"text_completion", "text_completion"}};
    ab_printf(b, max, "{\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", a->id,
              objs[a->kind == API_COMPLETIONS][chunk], a->created);
    ab_str(b, max, s->env.model_name);
    AB_LIT(b, max, ",");
}

static void api_usage(srv *s, api_buf *b, const srv_api_req *a) {
    ab_printf(b, api_max(s), "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,"
              "\"prompt_tokens_details\":{\"cached_tokens\":%d}}",
              a->prompt_tokens, a->completion_tokens, a->prompt_tokens + a->completion_tokens, a->cached_tokens);
}

/* "token":"...","logprob":x,"bytes":[...] of one token (chat's entries and their
 * alternatives), or with key_only its text as an object key ("...":x, completions'). */
static void api_lp_tok(srv *s, api_buf *b, int32_t tok, float lp, int key_only) {
    size_t max = api_max(s);
    char piece[256];
    int pl = tok_decode(s->env.tok, tok, 0, piece, sizeof piece);
    if (pl < 0) pl = 0;
    double v = isfinite(lp) ? lp : -9999.0;
    if (key_only) AB_LIT(b, max, "\"");
    else AB_LIT(b, max, "\"token\":\"");
    ab_esc(b, max, piece, (size_t)pl);
    if (key_only) { ab_printf(b, max, "\":%.6g", v); return; }
    ab_printf(b, max, "\",\"logprob\":%.6g,\"bytes\":[", v);
    for (int i = 0; i < pl; i++) ab_printf(b, max, "%s%u", i ? "," : "", (unsigned char)piece[i]);
    AB_LIT(b, max, "]");
}

/* One token's logprob entry, in the endpoint's shape, into b (chat) or b, b2, b3, b4
 * (completions' parallel lists); comma-separated after the first. Called inside the
 * engine's on_token, where eng_token_top holds the step's most likely tokens. */
static void api_lp_entry(srv *s, const srv_api_req *a, int sample, int32_t tok, float lp, api_buf *b,
                         api_buf *b2, api_buf *b3, api_buf *b4) {
    size_t max = api_max(s);
    const int32_t *tid = NULL;
    const float *tlp = NULL;
    int nt = a->top_logprobs ? eng_token_top(s->eng, &tid, &tlp) : 0;
    if (nt > a->top_logprobs) nt = a->top_logprobs;
    int first = b->len == 0;
    if (a->kind == API_CHAT) {
        if (!first) AB_LIT(b, max, ",");
        AB_LIT(b, max, "{");
        api_lp_tok(s, b, tok, lp, 0);
        AB_LIT(b, max, ",\"top_logprobs\":[");
        for (int i = 0; i < nt; i++) {
            if (i) AB_LIT(b, max, ",");
            AB_LIT(b, max, "{");
            api_lp_tok(s, b, tid[i], tlp[i], 0);
            AB_LIT(b, max, "}");
        }
        AB_LIT(b, max, "]}");
    } else {
        char piece[256];
        int pl = tok_decode(s->env.tok, tok, 0, piece, sizeof piece);
        if (pl < 0) pl = 0;
        ab_printf(b, max, "%s\"", first ? "" : ",");
        ab_esc(b, max, piece, (size_t)pl);
        AB_LIT(b, max, "\"");
        ab_printf(b2, max, "%s%.6g", first ? "" : ",", isfinite(lp) ? lp : -9999.0);
        ab_printf(b3, max, "%s%zu", first ? "" : ",", a->text_len[sample]);
        if (a->top_logprobs) {
            if (!first) AB_LIT(b4, max, ",");
            AB_LIT(b4, max, "{");
            for (int i = 0; i < nt; i++) {
                if (i) AB_LIT(b4, max, ",");
                api_lp_tok(s, b4, tid[i], tlp[i], 1);
            }
            AB_LIT(b4, max, "}");
        }
    }
}

/* The logprobs value of a choice: entries rendered in b (and b2, b3, b4). */
static void api_lp_value(srv *s, api_buf *out, const srv_api_req *a, const api_buf *b, const api_buf *b2,
                         const api_buf *b3, const api_buf *b4) {
    size_t max = api_max(s);
    if (!a->logprobs) { AB_LIT(out, max, "null"); return; }
    if (a->kind == API_CHAT) {
        AB_LIT(out, max, "{\"content\":[");
        ab_put(out, max, b->p, b->len);
        AB_LIT(out, max, "],\"refusal\":null}");
    } else {
        AB_LIT(out, max, "{\"tokens\":[");
        ab_put(out, max, b->p, b->len);
        AB_LIT(out, max, "],\"token_logprobs\":[");
        ab_put(out, max, b2->p, b2->len);
        if (a->top_logprobs) {
            AB_LIT(out, max, "],\"top_logprobs\":[");
            ab_put(out, max, b4->p, b4->len);
            AB_LIT(out, max, "],\"text_offset\":[");
        } else {
            AB_LIT(out, max, "],\"top_logprobs\":null,\"text_offset\":[");
        }
        ab_put(out, max, b3->p, b3->len);
        AB_LIT(out, max, "]}");
    }
}

/* The scratch, opened for a streamed event. */
static api_buf *api_event_begin(srv *s) {
    api_buf *b = api_scratch(s);
    AB_LIT(b, api_max(s), "data: ");
    return b;
}

/* A streamed event (data: <json>\n\n) as one chunk. */
static void api_event(srv_sess *ss, api_buf *b) {
    AB_LIT(b, api_max(ss->s), "\n\n");
    if (!b->oom) api_chunk(ss, b->p, b->len);
}

/* A streamed choice's piece: its text (and the token's logprob), or its end. */
static void api_stream_choice(srv_sess *ss, srv_api_req *a, int sample, const char *text, size_t len,
                              int32_t tok, float lp, int finish) {
    srv *s = ss->s;
    size_t max = api_max(s);
    api_buf *b = api_event_begin(s);
    api_open(s, b, a, 1);
    ab_printf(b, max, "\"choices\":[{\"index\":%d,", sample);
    if (a->kind == API_CHAT) {
        AB_LIT(b, max, "\"delta\":{");
        if (finish < 0) {
            if (!a->started[sample]) AB_LIT(b, max, "\"role\":\"assistant\",");
            a->started[sample] = 1;
            AB_LIT(b, max, "\"content\":\"");
            ab_esc(b, max, text, len);
            AB_LIT(b, max, "\"");
        }
        AB_LIT(b, max, "},");
    } else {
        AB_LIT(b, max, "\"text\":\"");
        ab_esc(b, max, text, len);
        AB_LIT(b, max, "\",");
    }
    AB_LIT(b, max, "\"logprobs\":");
    if (a->logprobs && tok >= 0) {
        api_buf e1 = {.h = &s->heap}, e2 = {.h = &s->heap}, e3 = {.h = &s->heap}, e4 = {.h = &s->heap};
        api_lp_entry(s, a, sample, tok, lp, &e1, &e2, &e3, &e4);
        api_lp_value(s, b, a, &e1, &e2, &e3, &e4);
        ab_free(&e1), ab_free(&e2), ab_free(&e3), ab_free(&e4);
    } else {
        AB_LIT(b, max, "null");
    }
    ab_printf(b, max, ",\"finish_reason\":");
    ab_str(b, max, finish < 0 ? NULL : api_reasons[finish]);
    AB_LIT(b, max, "}]");
    if (a->include_usage) AB_LIT(b, max, ",\"usage\":null");
    AB_LIT(b, max, "}");
    api_event(ss, b);
}

/* The non-streamed answer: every choice, then the usage. */
static void api_whole(srv_sess *ss, srv_api_req *a) {
    srv *s = ss->s;
    size_t max = api_max(s);
    api_buf *b = api_scratch(s);
    api_open(s, b, a, 0);
    AB_LIT(b, max, "\"choices\":[");
    for (int i = 0; i < a->n; i++) {
        ab_printf(b, max, "%s{\"index\":%d,", i ? "," : "", i);
        if (a->kind == API_CHAT) AB_LIT(b, max, "\"message\":{\"role\":\"assistant\",\"content\":\"");
        else AB_LIT(b, max, "\"text\":\"");
        ab_put(b, max, a->text[i].p, a->text[i].len);
        ab_put(b, max, a->kind == API_CHAT ? "\"}," : "\",", a->kind == API_CHAT ? 3 : 2);
        AB_LIT(b, max, "\"logprobs\":");
        api_lp_value(s, b, a, &a->lp[i], &a->lp2[i], &a->lp3[i], &a->lp4[i]);
        ab_printf(b, max, ",\"finish_reason\":\"%s\"}", api_reasons[a->finish[i] < 0 ? EF_LENGTH : a->finish[i]]);
    }
    AB_LIT(b, max, "],");
    api_usage(s, b, a);
    AB_LIT(b, max, "}\n");
    int oom = b->oom;
    for (int i = 0; i < a->n; i++)
        oom |= a->text[i].oom | a->lp[i].oom | a->lp2[i].oom | a->lp3[i].oom | a->lp4[i].oom;
    if (oom) {
        api_error(ss, 500, "the answer is over 3 x [net] max_output_bytes: ask with stream: true", NULL,
                  "too_large", 0);
        return;
    }
    api_respond(ss, 200, "application/json", b->p, b->len, NULL);
}

/* The end of a stream: the usage chunk when asked, [DONE], the body's end. */
static void api_stream_end(srv_sess *ss, srv_api_req *a) {
    srv *s = ss->s;
    if (a->include_usage) {
        api_buf *b = api_event_begin(s);
        api_open(s, b, a, 1);
        AB_LIT(b, api_max(s), "\"choices\":[],");
        api_usage(s, b, a);
        AB_LIT(b, api_max(s), "}");
        api_event(ss, b);
    }
    api_chunk(ss, "data: [DONE]\n\n", 14);
    api_body_end(ss);
    api_answered(ss);
}

/* ---------------------------------------------------------------- the engine's side */

void api_on_token(srv_req *r, int sample, int32_t tok, const char *text, int len, float lp) {
    srv_api_req *a = r->api;
    srv_sess *ss = r->sess;
    if (r->failed || sample < 0 || sample >= a->n) return;
    int want_lp = a->logprobs && tok >= 0;
    if (len <= 0 && !want_lp) return;
    size_t n = len > 0 ? (size_t)len : 0;
    if (a->stream) {
        api_stream_choice(ss, a, sample, text, n, tok, lp, -1);
    } else {
        size_t max = api_max(ss->s);
        ab_esc(&a->text[sample], max, text, n);
        if (want_lp)
            api_lp_entry(ss->s, a, sample, tok, lp, &a->lp[sample], &a->lp2[sample], &a->lp3[sample], &a->lp4[sample]);
    }
    a->text_len[sample] += n;
}

void api_on_finish(srv_req *r, int sample, int reason, const eng_usage *u, const char *msg) {
    (void)msg;
    srv_api_req *a = r->api;
    if (sample < 0 || sample >= a->n) return;
    if (reason == EF_CANCELLED) { gen_fail(r, 503, "cancelled", "the request was cancelled"); return; }
    a->finish[sample] = reason;
    a->prompt_tokens = u->prompt_tokens;
    a->cached_tokens = u->cached_tokens;
    a->completion_tokens += u->completion_tokens;
    if (a->stream && r->sess) api_stream_choice(r->sess, a, sample, "", 0, -1, 0, reason);
}

static void api_state_free(srv *s, srv_api_req *a) {
    for (int i = 0; i < SRV_MAX_N; i++)
        ab_free(&a->text[i]), ab_free(&a->lp[i]), ab_free(&a->lp2[i]), ab_free(&a->lp3[i]), ab_free(&a->lp4[i]);
    mm_heap_free(&s->heap, a);
}

void api_req_free(srv_req *r) {
    srv_api_req *a = r->api;
    srv_sess *ss = r->sess;
    r->api = NULL;
    if (ss && !r->failed) {
        if (a->stream) api_stream_end(ss, a);
        else api_whole(ss, a);
    } else if (ss) {
        api_answered(ss); /* the error went out (api_fail); the connection closes */
    }
    api_state_free(r->owner, a);
}

void api_fail(srv_req *r, int code, const char *slug, const char *msg) {
    srv_api_req *a = r->api;
    srv_sess *ss = r->sess;
    ss->http_keep = 0; /* whatever was sent of this answer, the connection ends with it */
    if (!a->head_sent) { /* not streaming yet: an error answer; api_req_free ends it */
        api_error_body(ss, code, msg && *msg ? msg : slug, NULL, slug, 0, NULL);
        return;
    }
    api_buf *b = api_event_begin(ss->s);
    api_err_json(b, api_max(ss->s), code, msg && *msg ? msg : slug, NULL, slug);
    api_event(ss, b);
    api_body_end(ss);
}

/* ---------------------------------------------------------------- generations */

static void api_gen_error(srv_sess *ss, const gen_err *e) {
    char msg[320];
    if (e->retry_ms > 0) snprintf(msg, sizeof msg, "%s (retry after %d ms)", e->msg, e->retry_ms);
    else snprintf(msg, sizeof msg, "%s", e->msg);
    api_error(ss, e->code, msg, NULL, e->slug, e->retry_ms);
}

static srv_api_req *api_state_new(srv *s, const api_req *q) {
    srv_api_req *a = mm_heap_calloc(&s->heap, 1, sizeof *a);
    if (!a) return NULL;
    for (int i = 0; i < SRV_MAX_N; i++)
        a->text[i].h = a->lp[i].h = a->lp2[i].h = a->lp3[i].h = a->lp4[i].h = &s->heap;
    a->kind = q->kind, a->stream = q->stream, a->include_usage = q->include_usage;
    a->logprobs = q->g.logprobs, a->top_logprobs = q->g.logprobs ? q->g.top_logprobs : 0, a->n = q->g.n;
    a->created = (long long)time(NULL);
    snprintf(a->id, sizeof a->id, "%s-kiln%lld", q->kind == API_CHAT ? "chatcmpl" : "cmpl",
             (long long)s->requests_total + 1);
    for (int i = 0; i < SRV_MAX_N; i++) a->finish[i] = -1;
    return a;
}

static void api_stream_head(srv_sess *ss, srv_api_req *a) {
    api_head(ss, 200, "text/event-stream", -1, NULL);
    a->head_sent = 1;
}

static void api_generate(srv_sess *ss, int kind, const char *body, size_t len, int minor) {
    srv *s = ss->s;
    api_req *q = s->api_req;
    api_err ae;
    int rc = api_parse(&s->api, kind, body, len, q, &ae);
    if (rc) { api_error(ss, ae.status, ae.msg, ae.param, ae.status == 413 ? "too_large" : NULL, 0); return; }
    if (strcmp(q->model, s->env.model_name)) {
        char msg[400];
        snprintf(msg, sizeof msg, "The model `%.200s` does not exist (this box serves `%.64s`)", q->model,
                 s->env.model_name);
        api_error(ss, 404, msg, "model", "model_not_found", 0);
        return;
    }
    srv_api_req *a = api_state_new(s, q);
    if (!a) { api_error(ss, 500, "out of memory", NULL, "internal", 0); return; } /* the heap is full */
    snprintf(a->id + strlen(a->id), sizeof a->id - strlen(a->id), "-%d", ss->num);
    q->g.id = a->id;
    srv_req *r;
    int n_prompt = 0;
    gen_err e;
    rc = gen_submit(ss, &q->g, kind == API_CHAT ? q->msgs : NULL, kind == API_CHAT ? q->n_msgs : 0, &r,
                    &n_prompt, &e);
    if (rc < 0) { api_state_free(s, a); api_gen_error(ss, &e); return; }
    ss->http_chunked = minor >= 1;
    if (rc == 0) { /* max_tokens 0: every choice ends at once, by length */
        a->prompt_tokens = n_prompt;
        for (int i = 0; i < a->n; i++) a->finish[i] = EF_LENGTH;
        ss->http_busy = 1;
        if (a->stream) {
            api_stream_head(ss, a);
            for (int i = 0; i < a->n; i++) api_stream_choice(ss, a, i, "", 0, -1, 0, EF_LENGTH);
            api_stream_end(ss, a);
        } else {
            api_whole(ss, a);
        }
        api_state_free(s, a);
        return;
    }
    r->api = a;
    ss->http_busy = 1;
    if (a->stream) {
        if (!ss->http_chunked) ss->http_keep = 0; /* HTTP/1.0: the stream ends with the connection */
        api_stream_head(ss, a);
    }
}

/* ---------------------------------------------------------------- routing */

/* "Bearer <token>" against the tokens file: the role, or ROLE_NONE. */
static int api_auth(srv *s, const http_msg *m, int *tok) {
    *tok = -1;
    if (!m->auth_set || m->auth_too_long) return ROLE_NONE;
    const char *v = m->auth;
    if (strncasecmp(v, "bearer", 6) || (v[6] != ' ' && v[6] != '\t')) return ROLE_NONE;
    v += 6;
    while (*v == ' ' || *v == '\t') v++;
    return srv_token_role(s, v, tok);
}

static void api_models(srv_sess *ss) {
    srv *s = ss->s;
    size_t max = api_max(s);
    api_buf *b = api_scratch(s);
    AB_LIT(b, max, "{\"object\":\"list\",\"data\":[{\"id\":");
    ab_str(b, max, s->env.model_name);
    ab_printf(b, max, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"kiln\",\"max_model_len\":%d}]}\n",
              (long long)time(NULL) - (long long)srv_uptime_s(s), s->env.max_seq_len);
    api_respond(ss, 200, "application/json", b->p, b->len, NULL);
}

static void api_health(srv_sess *ss) {
    srv *s = ss->s;
    int live = srv_live(s), ready = srv_ready(s);
    char body[160];
    int n = snprintf(body, sizeof body, "{\"status\":\"%s\",\"live\":%s,\"ready\":%s,\"level\":%d}\n",
                     live && ready ? "ok" : live ? "not ready" : "stalled", live ? "true" : "false",
                     ready ? "true" : "false", s->drv.lad.level);
    api_respond(ss, live && ready ? 200 : 503, "application/json", body, (size_t)n, NULL);
}

static const struct {
    const char *path;
    const char *method;
    int kind;              /* API_CHAT / API_COMPLETIONS, 0: not a generation */
    int auth;              /* needs a token */
} api_routes[] = {
    {"/v1/chat/completions", "POST", API_CHAT, 1},
    {"/v1/completions", "POST", API_COMPLETIONS, 1},
    {"/v1/models", "GET", 0, 1},
    {"/health", "GET", 0, 0},
};

static void api_route(srv_sess *ss, const http_msg *m, const char *body, size_t len) {
    srv *s = ss->s;
    for (size_t i = 0; i < sizeof api_routes / sizeof api_routes[0]; i++) {
        if (strcmp(m->path, api_routes[i].path)) continue;
        if (strcmp(m->method, api_routes[i].method)) {
            char msg[HTTP_PATH_MAX + 64];
            snprintf(msg, sizeof msg, "%s %s: use %s", m->method, m->path, api_routes[i].method);
            api_error_body(ss, 405, msg, NULL, "method_not_allowed", 0, api_routes[i].method);
            api_answered(ss);
            return;
        }
        if (api_routes[i].auth) {
            int tok, role = api_auth(s, m, &tok);
            if (role == ROLE_NONE) {
                srv_log(s, CFG_LOG_INFO, "session %d: HTTP %s %s: no valid token", ss->num, m->method, m->path);
                api_error(ss, 401, "Incorrect API key provided (Authorization: Bearer <a token of the tokens file>)",
                          NULL, "invalid_api_key", 0);
                return;
            }
            if (sess_token_admit(ss, tok) < 0) {
                api_error(ss, 429, "This API key holds [net] max_connections_per_token connections, all busy",
                          NULL, "too_many_connections", 0);
                return;
            }
            ss->role = role;
            if (ss->state != SS_READY) ss->state = SS_READY, ss->deadline_ms = 0;
        }
        if (api_routes[i].kind) api_generate(ss, api_routes[i].kind, body, len, m->minor);
        else if (!strcmp(m->path, "/v1/models")) api_models(ss);
        else api_health(ss);
        return;
    }
    char msg[HTTP_PATH_MAX + 64];
    snprintf(msg, sizeof msg, "Unknown request URL: %s %s", m->method, m->path);
    api_error(ss, 404, msg, NULL, "unknown_url", 0);
}

/* The request at the front of `in`, when it is all there: answered (or started), then
 * its bytes dropped. Stops while an answer is being produced. */
static void api_process(srv_sess *ss) {
    srv *s = ss->s;
    size_t max_head = (size_t)s->cfg.net.max_http_head_bytes, max_body = (size_t)s->cfg.net.max_http_body_bytes;
    while (!ss->http_busy && !ss->close_when_flushed && ss->c && ss->in_len) {
        http_msg m;
        int hl = http_parse_msg(ss->in, ss->in_len, max_head, &m);
        if (hl == 0) return;
        ss->http_keep = 0, ss->http_chunked = 0;
        if (hl < 0) {
            char msg[96];
            snprintf(msg, sizeof msg, "bad HTTP request: %d %s", -hl, http_reason(-hl));
            api_error(ss, -hl, msg, NULL, NULL, 0);
            return;
        }
        if (m.content_length > (long long)max_body) {
            char msg[96];
            snprintf(msg, sizeof msg, "the body is over [net] max_http_body_bytes (%zu)", max_body);
            api_error(ss, 413, msg, NULL, "too_large", 0);
            return;
        }
        size_t cl = m.content_length > 0 ? (size_t)m.content_length : 0;
        if (ss->in_len - (size_t)hl < cl) {
            if (m.expect_continue && !ss->http_continued) {
                sess_printf(ss, "HTTP/1.1 100 Continue\r\n\r\n");
                ss->http_continued = 1;
            }
            return;
        }
        ss->http_keep = m.minor >= 1 ? !m.conn_close : m.conn_keep_alive && !m.conn_close;
        size_t used = (size_t)hl + cl;
        /* the body is parsed before its bytes go: api_parse copies what it keeps */
        api_route(ss, &m, ss->in + hl, cl);
        memmove(ss->in, ss->in + used, ss->in_len - used);
        ss->in_len -= used;
        ss->http_continued = 0;
    }
}

static int64_t api_next_timer(loop_t *l, int64_t id, void *ud) {
    (void)l, (void)id;
    srv_sess *ss = ud;
    ss->resume_timer = 0;
    api_process(ss);
    srv_flush_dirty(ss->s);
    srv_kick(ss->s);
    return LOOP_NOMORE;
}

void api_sess_input(srv_sess *ss, const char *p, size_t n) {
    srv *s = ss->s;
    size_t limit = (size_t)s->cfg.net.max_http_head_bytes + (size_t)s->cfg.net.max_http_body_bytes;
    while (n > 0 && !ss->close_when_flushed && ss->c) {
        if (ss->in_len == limit) { /* a pipelined request beyond what one may hold */
            srv_log(s, CFG_LOG_INFO, "session %d: HTTP input over %zu bytes while busy", ss->num, limit);
            sess_close(ss);
            return;
        }
        size_t take = n < limit - ss->in_len ? n : limit - ss->in_len;
        if (ss->in_len + take > ss->in_cap) {
            size_t cap = ss->in_cap ? ss->in_cap : 4096;
            while (cap < ss->in_len + take) cap *= 2;
            if (cap > limit) cap = limit;
            char *q = mm_heap_realloc(&s->heap, ss->in, cap);
            if (!q) { sess_close(ss); return; }
            ss->in = q, ss->in_cap = cap;
        }
        memcpy(ss->in + ss->in_len, p, take);
        ss->in_len += take, p += take, n -= take;
        api_process(ss);
    }
}

int api_init(srv *s) {
    s->api_scratch = calloc(1, sizeof *s->api_scratch);
    s->api_req = malloc(sizeof *s->api_req);
    if (!s->api_scratch || !s->api_req) return -ENOMEM;
    s->api_scratch->h = &s->heap; /* grows to the largest answer once, then stays */
    return api_parser_init(&s->api, (size_t)s->cfg.net.max_http_body_bytes) < 0 ? -ENOMEM : 0;
}

void api_free(srv *s) {
    api_parser_free(&s->api);
    if (s->api_scratch) ab_free(s->api_scratch);
    free(s->api_scratch), free(s->api_req);
    s->api_scratch = NULL, s->api_req = NULL;
}
