/* bench_oai.c: `kiln bench --openai URL` - the same load as `kiln bench`, sent to any
 * OpenAI-compatible server as streaming chat completions, so kilnd's HTTP path and
 * another server (llama.cpp's llama-server) are measured by one client.
 *
 * C threads, each with its own connection (HTTP/1.1 keep-alive, one request at a time,
 * as OpenAI clients do), each sending POST .../chat/completions with stream: true and
 * stream_options.include_usage. A response is read as it arrives: the head, a chunked
 * (or Content-Length, or close-delimited) body, and in it server-sent events, whose few
 * fields we need (a delta's content, the usage) are found by a small bounded scanner.
 * TTFT is request written to first non-empty content delta; output tokens come from the
 * usage chunk (content deltas counted when the server sends none). Malformed input ends
 * that request as a KILN_EPROTO error and closes its connection, never more. */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "bench.h"

#define OAI_HEAD_MAX 16384       /* response head bytes */
#define OAI_LINE_MAX (256u << 10) /* one SSE line (a token's chunk is ~300 bytes) */
#define OAI_BODY_KEEP 65536      /* a non-stream body kept (GET /v1/models, errors) */
#define OAI_READ_MS 1000         /* one wait, so Ctrl-C is seen within a second */
#define OAI_ERR_STREAM 500       /* an `error` event inside a 200 stream */
#define OAI_CANCELLED 1          /* read_response: Ctrl-C (not an error) */

/* ------------------------------------------------------------------ the URL */

typedef struct {
    int plain;           /* http:// */
    char hostport[272];  /* "host:port" for libkiln (brackets kept for IPv6) */
    char path[512];      /* of the chat endpoint */
    char models[512];    /* of GET models */
} oai_url;

/* http[s]://host[:port][/base]: the path is base + "/chat/completions" unless it ends in
 * that already; no base means "/v1". 0 or -1 (message printed). */
static int oai_parse_url(const char *url, oai_url *u) {
    const char *rest;
    memset(u, 0, sizeof *u);
    if (!strncmp(url, "https://", 8)) rest = url + 8;
    else if (!strncmp(url, "http://", 7)) rest = url + 7, u->plain = 1;
    else {
        cli_err("bench: --openai %.200s: want http://host:port or https://host:port", url);
        return -1;
    }
    size_t hl = strcspn(rest, "/?#");
    const char *path = rest + hl;
    if (hl == 0 || hl >= sizeof u->hostport || *path == '?' || *path == '#' || strchr(rest, '@')) {
        cli_err("bench: --openai %.200s: bad host, or a query/userinfo this client does not send", url);
        return -1;
    }
    /* no port: the scheme's (a bare IPv6 literal needs brackets to take one) */
    int has_port = rest[hl - 1] != ']' && memchr(rest, ':', hl) != NULL;
    snprintf(u->hostport, sizeof u->hostport, "%.*s%s", (int)hl, rest,
             has_port ? "" : u->plain ? ":80" : ":443");
    size_t pl = strlen(path);
    while (pl > 0 && path[pl - 1] == '/') pl--;
    const char *tail = "/chat/completions";
    size_t tl = strlen(tail);
    int full = pl >= tl && !memcmp(path + pl - tl, tail, tl);
    size_t base = full ? pl - tl : pl;
    if (pl + 32 > sizeof u->path) {
        cli_err("bench: --openai: the URL's path is too long");
        return -1;
    }
    if (base == 0) snprintf(u->path, sizeof u->path, "/v1%s", tail);
    else snprintf(u->path, sizeof u->path, "%.*s%s", (int)base, path, tail);
    snprintf(u->models, sizeof u->models, "%.*s/models", (int)(base ? base : 3), base ? path : "/v1");
    return 0;
}

/* ------------------------------------------------------------------ JSON, a few fields */

/* The end of the JSON string starting at s[i] == '"' (index after its closing quote),
 * or 0 when it does not close within s. */
static size_t json_str_end(const char *s, size_t n, size_t i) {
    for (i++; i < n; i++) {
        if (s[i] == '\\') i++;
        else if (s[i] == '"') return i + 1;
    }
    return 0;
}

/* The value of the first member named key, at any depth: its offset in s, or -1. Strings
 * are skipped whole, so a key's text inside a value (a token's content) never matches. */
static long json_key(const char *s, size_t n, const char *key) {
    size_t kl = strlen(key);
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '"') continue;
        size_t e = json_str_end(s, n, i), j = e;
        if (!e) return -1;
        while (j < n && isspace((unsigned char)s[j])) j++;
        if (j < n && s[j] == ':' && e - i - 2 == kl && !memcmp(s + i + 1, key, kl)) {
            for (j++; j < n && isspace((unsigned char)s[j]);) j++;
            return j < n ? (long)j : -1;
        }
        i = e - 1; /* the loop's i++ moves past the string */
    }
    return -1;
}

/* A non-negative integer member: its value, or -1 (absent, null, not a number). */
static long json_int(const char *s, size_t n, const char *key) {
    long at = json_key(s, n, key), v = 0;
    if (at < 0 || !isdigit((unsigned char)s[at])) return -1;
    for (size_t i = (size_t)at; i < n && isdigit((unsigned char)s[i]) && v < 1000000000L; i++)
        v = v * 10 + (s[i] - '0');
    return v;
}

/* A string member's raw (still escaped) bytes: their length, or -1. */
static long json_raw_str(const char *s, size_t n, const char *key, const char **out) {
    long at = json_key(s, n, key);
    if (at < 0 || s[at] != '"') return -1;
    size_t e = json_str_end(s, n, (size_t)at);
    if (!e) return -1; /* unclosed */
    *out = s + at + 1;
    return (long)(e - (size_t)at - 2);
}

/* s as a JSON string's contents (quotes not included) into out; bounded by cap. The
 * length, or -1 when it does not fit. */
static long json_escape(const char *s, char *out, size_t cap) {
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char e[8];
        size_t el;
        if (*p == '"' || *p == '\\') e[0] = '\\', e[1] = (char)*p, el = 2;
        else if (*p < 0x20) el = (size_t)snprintf(e, sizeof e, "\\u%04x", *p);
        else e[0] = (char)*p, el = 1;
        if (o + el >= cap) return -1;
        memcpy(out + o, e, el);
        o += el;
    }
    out[o] = '\0';
    return (long)o;
}

/* ------------------------------------------------------------------ the response */

enum { RS_HEAD, RS_SIZE, RS_DATA, RS_DATA_END, RS_TRAILER, RS_LENGTH, RS_CLOSE, RS_DONE };

typedef struct {
    /* filled by the caller before feeding */
    double t_sent;
    /* the head */
    char head[OAI_HEAD_MAX];
    size_t head_len;
    int status, chunked, conn_close, sse;
    long long left;     /* Content-Length / chunk bytes still to come */
    char size_line[32]; /* a chunk-size line being read */
    size_t size_len;
    int state;
    /* the body: SSE lines, or the bytes kept (non-stream) */
    char *line;         /* OAI_LINE_MAX */
    size_t line_len;
    char *body;         /* OAI_BODY_KEEP */
    size_t body_len;
    /* what the events said */
    int done_seen, error_event;
    long content_chunks, usage_out, usage_prompt, usage_cached;
    double t_first, t_last;
    pct_set *ttft, *itl; /* where to add samples (under mu), or NULL */
    pthread_mutex_t *mu;
} oai_resp;

static void resp_reset(oai_resp *r) {
    r->head_len = r->size_len = r->line_len = r->body_len = 0;
    r->status = r->chunked = r->conn_close = r->sse = 0;
    r->left = -1;
    r->state = RS_HEAD;
    r->done_seen = r->error_event = 0;
    r->content_chunks = 0;
    r->usage_out = r->usage_prompt = r->usage_cached = -1;
    r->t_first = r->t_last = 0;
}

/* A header's value if line (no CRLF) is "name: value", else NULL. */
static const char *header_value(const char *line, const char *name) {
    size_t n = strlen(name);
    if (strncasecmp(line, name, n) || line[n] != ':') return NULL;
    line += n + 1;
    while (*line == ' ' || *line == '\t') line++;
    return line;
}

static int has_token(const char *v, const char *tok) {
    size_t n = strlen(tok);
    for (const char *p = v; (p = strcasestr(p, tok)) != NULL; p += n) {
        int before = p == v || p[-1] == ',' || p[-1] == ' ';
        int after = p[n] == '\0' || p[n] == ',' || p[n] == ' ' || p[n] == ';';
        if (before && after) return 1;
    }
    return 0;
}

/* The complete head in r->head (NUL-terminated, ends "\r\n\r\n"): 0 or -1 malformed. */
static int parse_head(oai_resp *r) {
    char *save = NULL, *line = strtok_r(r->head, "\r\n", &save);
    int minor = 1;
    if (!line || sscanf(line, "HTTP/1.%d %3d", &minor, &r->status) != 2 || r->status < 100 ||
        r->status > 599)
        return -1;
    if (minor == 0) r->conn_close = 1;
    while ((line = strtok_r(NULL, "\r\n", &save)) != NULL) {
        const char *v;
        if ((v = header_value(line, "content-length"))) {
            char *end;
            long long l = strtoll(v, &end, 10);
            if (end == v || l < 0) return -1;
            r->left = l;
        } else if ((v = header_value(line, "transfer-encoding"))) {
            r->chunked = has_token(v, "chunked");
        } else if ((v = header_value(line, "connection"))) {
            if (has_token(v, "close")) r->conn_close = 1;
            else if (has_token(v, "keep-alive")) r->conn_close = 0;
        } else if ((v = header_value(line, "content-type"))) {
            r->sse = strncasecmp(v, "text/event-stream", 17) == 0;
        }
    }
    r->state = r->chunked ? RS_SIZE : r->left >= 0 ? RS_LENGTH : RS_CLOSE;
    if (r->state == RS_LENGTH && r->left == 0) r->state = RS_DONE;
    if (r->state == RS_CLOSE) r->conn_close = 1;
    return 0;
}

/* One SSE data payload (a JSON object, or [DONE]). */
static void on_event(oai_resp *r, const char *d, size_t n, double now) {
    if (n == 6 && !memcmp(d, "[DONE]", 6)) {
        r->done_seen = 1;
        return;
    }
    if (json_key(d, n, "error") >= 0) r->error_event = 1;
    const char *txt;
    long tl = json_raw_str(d, n, "content", &txt);
    if (tl > 0) {
        r->content_chunks++;
        pthread_mutex_lock(r->mu);
        if (r->content_chunks == 1) pct_add(r->ttft, (now - r->t_sent) * 1e3);
        else pct_add(r->itl, (now - r->t_last) * 1e3);
        pthread_mutex_unlock(r->mu);
        if (r->content_chunks == 1) r->t_first = now;
        r->t_last = now;
    }
    long out = json_int(d, n, "completion_tokens");
    if (out >= 0) {
        r->usage_out = out;
        r->usage_prompt = json_int(d, n, "prompt_tokens");
        r->usage_cached = json_int(d, n, "cached_tokens");
    }
}

/* Body bytes, de-framed: SSE lines of a 200 event stream, else kept (bounded). */
static int body_bytes(oai_resp *r, const char *p, size_t n, double now) {
    if (!(r->sse && r->status == 200)) {
        size_t k = n < OAI_BODY_KEEP - 1 - r->body_len ? n : OAI_BODY_KEEP - 1 - r->body_len;
        memcpy(r->body + r->body_len, p, k);
        r->body_len += k;
        r->body[r->body_len] = '\0';
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\n') {
            if (r->line_len == OAI_LINE_MAX) return -1;
            r->line[r->line_len++] = p[i];
            continue;
        }
        size_t l = r->line_len;
        if (l > 0 && r->line[l - 1] == '\r') l--;
        r->line_len = 0;
        if (l >= 5 && !memcmp(r->line, "data:", 5)) {
            size_t o = 5 + (l > 5 && r->line[5] == ' ');
            on_event(r, r->line + o, l - o, now);
        }
    }
    return 0;
}

/* A chunk-size line's byte: -1 malformed. */
static int chunk_size_byte(oai_resp *r, char ch) {
    if (ch != '\n') {
        if (r->size_len + 1 >= sizeof r->size_line) return -1;
        r->size_line[r->size_len++] = ch;
        return 0;
    }
    r->size_line[r->size_len] = '\0';
    r->size_len = 0;
    char *end;
    long long v = strtoll(r->size_line, &end, 16);
    if (end == r->size_line || v < 0 || v > (1LL << 40)) return -1;
    r->left = v;
    r->state = v == 0 ? RS_TRAILER : RS_DATA;
    return 0;
}

/* Feeds received bytes: 0 more wanted, 1 the response is complete, -1 malformed. */
static int resp_feed(oai_resp *r, const char *p, size_t n, double now) {
    size_t i = 0;
    while (i < n && r->state != RS_DONE) {
        switch (r->state) {
        case RS_HEAD:
            if (r->head_len + 1 >= OAI_HEAD_MAX) return -1;
            r->head[r->head_len++] = p[i++];
            if (r->head_len >= 4 && !memcmp(r->head + r->head_len - 4, "\r\n\r\n", 4)) {
                r->head[r->head_len] = '\0';
                if (parse_head(r) < 0) return -1;
            }
            break;
        case RS_SIZE:
            if (chunk_size_byte(r, p[i++]) < 0) return -1;
            break;
        case RS_DATA:
        case RS_LENGTH: {
            size_t k = n - i;
            if ((long long)k > r->left) k = (size_t)r->left;
            if (body_bytes(r, p + i, k, now) < 0) return -1;
            i += k, r->left -= (long long)k;
            if (r->left == 0) r->state = r->state == RS_DATA ? RS_DATA_END : RS_DONE;
            break;
        }
        case RS_DATA_END: /* the CRLF after a chunk's data */
            if (p[i] == '\n') r->state = RS_SIZE;
            else if (p[i] != '\r') return -1;
            i++;
            break;
        case RS_TRAILER: /* trailer lines until an empty one; we send TE: nothing */
            if (p[i] == '\n') {
                if (r->size_len == 0) r->state = RS_DONE;
                r->size_len = 0;
            } else if (p[i] != '\r' && ++r->size_len >= OAI_HEAD_MAX) {
                return -1;
            }
            i++;
            break;
        case RS_CLOSE:
            if (body_bytes(r, p + i, n - i, now) < 0) return -1;
            i = n;
            break;
        }
    }
    return r->state == RS_DONE;
}

/* ------------------------------------------------------------------ one client */

typedef struct {
    bench *b;
    const oai_url *u;
    const char *model_esc; /* the model's name, JSON-escaped */
    const char *auth;      /* "Authorization: Bearer ...\r\n" or "" */
    kiln_client *c;
    char *req, *prompt, *esc;
    size_t req_cap, prompt_cap, esc_cap;
    oai_resp r;
} oai_client;

/* The request: head and body in c->req. Its length, or -1 (the prompt is too long). */
static long build_request(oai_client *oc, const char *prompt) {
    bench *b = oc->b;
    double temp = isnan(b->gen.p.temperature) ? 0.0 : b->gen.p.temperature;
    if (json_escape(prompt, oc->esc, oc->esc_cap) < 0) return -1;
    /* the body goes after room for the head, then the head is written in front of it */
    size_t room = 1024 + strlen(oc->auth);
    if (room >= oc->req_cap) return -1;
    int bl = snprintf(oc->req + room, oc->req_cap - room,
                      "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],"
                      "\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                      "\"max_tokens\":%d,\"temperature\":%g%s%s}",
                      oc->model_esc, oc->esc, b->gen.p.max_tokens, temp,
                      *b->oai_extra ? "," : "", b->oai_extra);
    if (bl < 0 || (size_t)bl >= oc->req_cap - room) return -1;
    char head[1536];
    int hl = snprintf(head, sizeof head,
                      "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                      "Accept: text/event-stream\r\n%sContent-Length: %d\r\n\r\n",
                      oc->u->path, oc->u->hostport, oc->auth, bl);
    if (hl < 0 || (size_t)hl > room) return -1;
    memmove(oc->req + hl, oc->req + room, (size_t)bl);
    memcpy(oc->req, head, (size_t)hl);
    return hl + bl;
}

/* Reads the response to the request just written until it is complete. 0, or a code
 * (KILN_EPROTO malformed, a library code) after which the connection is dropped. */
static int read_response(oai_client *oc, kiln_error *err) {
    char buf[16384];
    double idle_since = cli_now();
    for (;;) {
        if (bench_stopping(oc->b)) return OAI_CANCELLED; /* the hangup cancels it */
        long n = kiln_raw_read(oc->c, buf, sizeof buf, OAI_READ_MS, err);
        double now = cli_now();
        if (n < 0) {
            /* a close-delimited body ends with the connection */
            if (n == KILN_ECLOSED && oc->r.state == RS_CLOSE) return 0;
            return (int)n;
        }
        if (n == 0) {
            if (now - idle_since > 60) {
                snprintf(err->message, sizeof err->message, "no byte for 60 s");
                err->code = KILN_ETIMEOUT;
                return KILN_ETIMEOUT;
            }
            continue;
        }
        idle_since = now;
        int f = resp_feed(&oc->r, buf, (size_t)n, now);
        if (f < 0) {
            snprintf(err->message, sizeof err->message, "malformed HTTP response or event stream");
            err->code = KILN_EPROTO;
            return KILN_EPROTO;
        }
        if (f == 1) return 0;
    }
}

/* The kept body for a message: trailing whitespace cut (error bodies end in "\n"). */
static const char *body_text(oai_resp *r) {
    while (r->body_len > 0 && isspace((unsigned char)r->body[r->body_len - 1]))
        r->body[--r->body_len] = '\0';
    return r->body_len ? r->body : "";
}

/* Counts one finished request (rc: read_response's) into the report. */
static void account(oai_client *oc, int rc, double now) {
    bench *b = oc->b;
    oai_resp *r = &oc->r;
    int code = rc == OAI_CANCELLED ? 0 : rc ? rc : r->status != 200 ? r->status
                                   : r->error_event ? OAI_ERR_STREAM : 0;
    pthread_mutex_lock(&b->mu);
    b->rep.ended++;
    b->t_last_end = now;
    if (rc == OAI_CANCELLED) {
        b->rep.cancelled++;
    } else if (code) {
        report_add_error(&b->rep, code);
    } else {
        b->rep.completed++;
        b->rep.output_tokens += (uint64_t)(r->usage_out >= 0 ? r->usage_out : r->content_chunks);
        if (r->usage_prompt > 0) b->rep.prompt_tokens += (uint64_t)r->usage_prompt;
        if (r->usage_cached > 0) b->rep.cached_tokens += (uint64_t)r->usage_cached;
        pct_add(&b->rep.e2e_ms, (now - r->t_sent) * 1e3);
    }
    pthread_mutex_unlock(&b->mu);
    if (code && b->verbose)
        fprintf(stderr, "kiln: request failed: %d %s: %.200s\n", code,
                code == OAI_ERR_STREAM ? "error event" : kiln_strerror(code),
                rc ? "" : body_text(r));
}

/* Sends request idx and reads its answer. */
static void one_request(oai_client *oc, long idx) {
    bench *b = oc->b;
    kiln_error err = {0};
    long len = build_request(oc, bench_prompt(b, idx, oc->prompt, oc->prompt_cap));
    resp_reset(&oc->r);
    oc->r.t_sent = cli_now();
    int rc = len < 0 ? KILN_EINVAL : kiln_raw_write(oc->c, oc->req, (size_t)len, &err);
    pthread_mutex_lock(&b->mu);
    if (rc) b->rep.submit_failed++, report_add_error(&b->rep, rc);
    else b->rep.submitted++;
    pthread_mutex_unlock(&b->mu);
    if (rc) {
        if (b->verbose) cli_kiln_err(&err);
        /* the server is gone and did not come back: do not spin through the rest */
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        return;
    }
    rc = read_response(oc, &err);
    if (rc == KILN_ECLOSED && oc->r.head_len == 0) {
        /* closed before any answer: a kept-alive connection the server had just given
         * up (its idle timer raced our request); once more on a fresh one, as HTTP
         * clients do */
        if (b->verbose) fprintf(stderr, "kiln: %s; resending on a new connection\n", err.message);
        oc->r.t_sent = cli_now();
        rc = kiln_raw_write(oc->c, oc->req, (size_t)len, &err);
        if (!rc) rc = read_response(oc, &err);
    }
    if (rc < 0 && b->verbose) cli_kiln_err(&err);
    /* after an error the stream's position is unknown: start clean */
    if (rc || oc->r.conn_close) kiln_raw_hangup(oc->c);
    account(oc, rc, cli_now());
}

static void *oai_main(void *arg) {
    oai_client *oc = arg;
    long idx;
    while ((idx = bench_claim(oc->b)) >= 0) one_request(oc, idx);
    bench_worker_done(oc->b);
    return NULL;
}

/* ------------------------------------------------------------------ setup */

static int client_init(oai_client *oc, bench *b, const oai_url *u, const char *auth,
                       cli_global *g) {
    int rc;
    oc->b = b, oc->u = u, oc->auth = auth;
    oc->prompt_cap = bench_prompt_cap(b);
    size_t longest = oc->prompt_cap;
    for (long i = 0; b->prompts && i < b->n_prompts; i++)
        if (strlen(b->prompts[i]) + 1 > longest) longest = strlen(b->prompts[i]) + 1;
    oc->esc_cap = longest * 6 + 1; /* \u00XX at worst */
    oc->req_cap = oc->esc_cap + strlen(b->oai_extra) + strlen(auth) + 4096;
    oc->prompt = malloc(oc->prompt_cap);
    oc->esc = malloc(oc->esc_cap);
    oc->req = malloc(oc->req_cap);
    oc->r.line = malloc(OAI_LINE_MAX);
    oc->r.body = malloc(OAI_BODY_KEEP);
    oc->r.mu = &b->mu, oc->r.ttft = &b->rep.ttft_ms, oc->r.itl = &b->rep.itl_ms;
    if (!oc->prompt || !oc->esc || !oc->req || !oc->r.line || !oc->r.body) {
        cli_err("out of memory");
        return EXIT_FAIL;
    }
    oc->c = cli_connect_raw(g, u->hostport, u->plain, &rc);
    return oc->c ? EXIT_OK : rc;
}

static void client_free(oai_client *oc) {
    kiln_close(oc->c);
    free(oc->prompt), free(oc->esc), free(oc->req), free(oc->r.line), free(oc->r.body);
}

/* GET models: the first model's id (still JSON-escaped, which is how it is sent) into
 * out, for the requests' "model" (kilnd requires the name it serves). 0 or -1. */
static int fetch_model(oai_client *oc, const char *url, char *out, size_t cap) {
    kiln_error err = {0};
    int hl = snprintf(oc->req, oc->req_cap, "GET %s HTTP/1.1\r\nHost: %s\r\n%s"
                      "Accept: application/json\r\n\r\n", oc->u->models, oc->u->hostport, oc->auth);
    resp_reset(&oc->r);
    int rc = kiln_raw_write(oc->c, oc->req, (size_t)hl, &err);
    if (!rc) rc = read_response(oc, &err);
    if (rc || oc->r.conn_close) kiln_raw_hangup(oc->c);
    const char *id = NULL;
    long il = rc || oc->r.status != 200 ? -1 : json_raw_str(oc->r.body, oc->r.body_len, "id", &id);
    if (il > 0 && (size_t)il < cap) {
        snprintf(out, cap, "%.*s", (int)il, id);
        return 0;
    }
    if (rc < 0) cli_err("bench: GET %s at %s: %s", oc->u->models, url, err.message);
    else if (oc->r.status != 200)
        cli_err("bench: GET %s at %s: HTTP %d: %.200s", oc->u->models, url, oc->r.status,
                body_text(&oc->r));
    else cli_err("bench: GET %s at %s: no model id in the answer; give --openai-model", oc->u->models, url);
    return -1;
}

/* "Authorization: Bearer <token>\r\n" for a token, "" without one. */
static int make_auth(char *out, size_t cap) {
    const char *t = cli_token();
    if (strpbrk(t, "\r\n")) {
        cli_err("bench: the token has a line break");
        return -1;
    }
    snprintf(out, cap, *t ? "Authorization: Bearer %s\r\n" : "", t);
    return 0;
}

int oai_bench(bench *b, cli_global *g) {
    static oai_url u;
    static char auth[CONF_TOKEN_MAX + 32], model[512];
    if (oai_parse_url(b->openai, &u) < 0) return EXIT_USAGE;
    oai_client *cs = calloc((size_t)b->concurrency, sizeof *cs);
    if (!cs) {
        cli_err("out of memory");
        return EXIT_FAIL;
    }
    int rc = EXIT_OK, n = 0;
    for (; n < b->concurrency && rc == EXIT_OK; n++) {
        rc = client_init(&cs[n], b, &u, auth, g);
        /* the token is known once the settings are resolved (by the first connect) */
        if (rc == EXIT_OK && n == 0 && make_auth(auth, sizeof auth) < 0) rc = EXIT_USAGE;
    }
    if (rc == EXIT_OK) {
        if (b->oai_model) rc = json_escape(b->oai_model, model, sizeof model) < 0 ? EXIT_USAGE : EXIT_OK;
        else rc = fetch_model(&cs[0], b->openai, model, sizeof model) < 0 ? EXIT_FAIL : EXIT_OK;
        for (int k = 0; k < n; k++) cs[k].model_esc = model;
    }
    if (rc == EXIT_OK) {
        cli_sigint_arm();
        bench_run(b, n, oai_main, cs, sizeof *cs);
        cli_sigint_disarm();
    }
    for (int k = 0; k < n; k++) client_free(&cs[k]);
    free(cs);
    return rc;
}
