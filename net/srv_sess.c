/* srv_sess: sessions: the tokens file and roles, each connection's bounded output buffer,
 * the connection lifecycle over TLS (accept, read, write, close, linger), and line input. */
#include "net/srv_int.h"

static void sess_mark_dirty(srv_sess *ss);
static void sess_free(srv_sess *ss);
static int sess_resume_later(srv_sess *ss);

/* "role token" per line; '#' starts a comment. All or nothing: on error the old set
 * stays. Returns the count or -1 with err. */
int srv_load_tokens(srv *s, char *err, size_t errlen) {
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
int srv_token_role(const srv *s, const char *tok, int *idx) {
    size_t len = tok ? strlen(tok) : 0;
    int role = ROLE_NONE, at = -1;
    for (int i = 0; i < s->n_tokens; i++) {
        unsigned diff = (unsigned)(len != s->tokens[i].len);
        for (size_t j = 0; j < SRV_TOKEN_MAX; j++)
            diff |= (unsigned char)(j < len ? tok[j] : 0) ^ (unsigned char)s->tokens[i].tok[j];
        if (!diff) role = s->tokens[i].role, at = i;
    }
    if (idx) *idx = at;
    return role;
}

/* ---------------------------------------------------------------- admission
 * A connection is pending until TLS and HELLO (or its first HTTP request) are done. Pending
 * ones are cheap to open and cost nothing to hold idle, so they have their own budget
 * within max_connections: over it, the oldest pending one that has sent nothing for
 * SRV_PENDING_QUIET_MS (from the same address first) is reset for the newcomer. A real
 * client's handshake moves every few milliseconds (a balancer opening 64 at once
 * included), so only the silent ones go. When max_connections is full, the oldest pending
 * one goes whatever its age, else the greeted session idle longest (ERR 408, as its idle
 * timeout would); only when every session has work in flight is the newcomer refused. */

static int sess_pending(const srv_sess *ss) {
    return ss->state == SS_TLS || ss->state == SS_HELLO;
}

/* Still counted against max_connections: not closing (a closing one lingers a moment and
 * is bounded by the transport's own limit). */
static int sess_live(const srv_sess *ss) {
    return ss->state != SS_CLOSING && !ss->close_when_flushed;
}

/* The address part of "a.b.c.d:port". */
static size_t peer_host_len(const char *peer) {
    const char *colon = strrchr(peer, ':');
    return colon ? (size_t)(colon - peer) : strlen(peer);
}

static int same_host(const char *a, const char *b) {
    size_t la = peer_host_len(a);
    return la == peer_host_len(b) && !memcmp(a, b, la);
}

/* An idle greeted session for eviction: no request in flight, not sending an update,
 * and a user before an admin (an operator's console stays longest); the one quiet
 * longest. tok >= 0: that token's only. */
static srv_sess *idle_victim(srv *s, int tok) {
    srv_sess *best = NULL;
    for (srv_sess *ss = s->sessions; ss; ss = ss->next) {
        if (ss->state != SS_READY || !sess_live(ss) || ss->n_reqs || ss->http_busy || ss == s->up_sess ||
            ss->raw_left || (tok >= 0 && ss->tok != tok))
            continue;
        if (!best || (ss->role < best->role) ||
            (ss->role == best->role && ss->last_rx_ms <= best->last_rx_ms))
            best = ss;
    }
    return best;
}

static void sess_evict_idle(srv_sess *v, const char *why) {
    srv_log(v->s, CFG_LOG_INFO, "session %d (%s): closed, idle, to make room (%s)", v->num, v->peer, why);
    if (v->kind != SK_HTTP) sess_err(v, "-", 408, "idle_timeout", why);
    sess_close(v);
}

/* Room for a new connection from peer: 0, or -1 (refused). */
static int sess_admit(srv *s, const char *peer) {
    const kiln_config *c = &s->cfg;
    int live = 0, pending = 0, from_peer = 0;
    int64_t quiet = loop_now_ms() - SRV_PENDING_QUIET_MS;
    /* the oldest pending, the oldest silent one, and the same from peer's address (the
     * list is newest first) */
    srv_sess *oldest = NULL, *silent = NULL, *silent_peer = NULL;
    for (srv_sess *ss = s->sessions; ss; ss = ss->next) {
        if (!sess_live(ss)) continue;
        live++;
        if (!sess_pending(ss)) continue;
        int mine = same_host(ss->peer, peer);
        pending++, from_peer += mine, oldest = ss;
        if (ss->last_rx_ms <= quiet) silent = ss, silent_peer = mine ? ss : silent_peer;
    }
    srv_sess *drop = live >= c->net.max_connections ? oldest
                     : from_peer >= c->net.max_pending_per_address && silent_peer ? silent_peer
                     : pending >= c->net.max_pending_connections ? silent : NULL;
    if (drop) {
        srv_log(s, CFG_LOG_INFO, "session %d (%s): not through TLS + HELLO yet; reset for a new connection",
                drop->num, drop->peer);
        sess_kill(drop, 1);
        return 0;
    }
    if (live < c->net.max_connections) return 0;
    srv_sess *v = idle_victim(s, -1);
    if (!v) return -1;
    sess_evict_idle(v, "max_connections");
    return 0;
}

int sess_token_admit(srv_sess *ss, int tok) {
    srv *s = ss->s;
    int cap = s->cfg.net.max_connections_per_token, n = 0;
    if (tok < 0 || ss->tok == tok) { ss->tok = tok; return 0; }
    if (cap > 0) {
        for (srv_sess *o = s->sessions; o; o = o->next) n += o != ss && o->tok == tok && sess_live(o);
        if (n >= cap) {
            srv_sess *v = idle_victim(s, tok);
            if (!v) return -1;
            sess_evict_idle(v, "max_connections_per_token");
        }
    }
    ss->tok = tok;
    return 0;
}

int srv_token_requests(const srv *s, int tok) {
    int n = 0;
    for (const srv_sess *ss = s->sessions; ss; ss = ss->next) n += ss->tok == tok ? ss->n_reqs : 0;
    return n;
}

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
    char *p = cap > hard || ss->broken ? NULL : mm_heap_realloc(&ss->s->heap, ss->out, cap);
    if (!p) { /* never drop a line silently: the connection goes instead */
        if (!ss->broken) ss->broken = 1;
        sess_mark_dirty(ss);
        return -1;
    }
    ss->out = p, ss->out_cap = cap;
    return 0;
}

static void sess_mark_dirty(srv_sess *ss) {
    if (ss->dirty) return;
    ss->dirty = 1;
    ss->next_dirty = ss->s->dirty;
    ss->s->dirty = ss;
}

void sess_printf(srv_sess *ss, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || out_reserve(ss, (size_t)n + 1) < 0) return;
    va_start(ap, fmt);
    vsnprintf(ss->out + ss->out_len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    ss->out_len += (size_t)n;
    sess_mark_dirty(ss);
}

/* A quoted string appended as is (the caller adds the rest of the line). */
void sess_quote(srv_sess *ss, const char *text, size_t len) {
    size_t need = PROTO_QUOTED_MAX(len);
    if (out_reserve(ss, need) < 0) return;
    int n = proto_quote(ss->out + ss->out_len, need, text, len);
    if (n > 0) ss->out_len += (size_t)n;
}

void sess_write(srv_sess *ss, const char *p, size_t n) {
    if (!n || out_reserve(ss, n) < 0) return;
    memcpy(ss->out + ss->out_len, p, n);
    ss->out_len += n;
    sess_mark_dirty(ss);
}

/* ERR <id> <code> <slug>[ msg="..."] */
void sess_err(srv_sess *ss, const char *id, int code, const char *slug, const char *msg) {
    sess_printf(ss, "ERR %s %d %s", id && *id ? id : "-", code, slug);
    if (msg && *msg) {
        sess_printf(ss, " msg=");
        sess_quote(ss, msg, strlen(msg));
    }
    sess_printf(ss, "\n");
}

/* A multi-line body ending with ".", lines starting with "." doubled (dot-stuffing). */
void sess_body(srv_sess *ss, const char *text, size_t len) {
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t l = nl ? (size_t)(nl - p) : (size_t)(end - p);
        sess_printf(ss, "%s%.*s\n", *p == '.' ? "." : "", (int)l, p);
        p += l + (nl != NULL);
    }
    sess_printf(ss, ".\n");
}

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
    srv_kick(ss->s);
}

/* The connection is gone or must go now: cancel, forget, free. */
void sess_kill(srv_sess *ss, int abort) {
    if (ss->c) abort ? net_abort(ss->c) : net_close(ss->c);
    ss->c = NULL;
    sess_free(ss);
}

/* Finish what is queued, then close_notify and FIN; input is read and dropped for a
 * short linger so the peer sees our last lines rather than a reset. */
void sess_close(srv_sess *ss) {
    sess_drop_requests(ss);
    ss->close_when_flushed = 1;
    sess_mark_dirty(ss);
}

void sess_close_idle(srv_sess *ss) {
    ss->close_when_flushed = 1;
    sess_mark_dirty(ss);
}

void sess_goaway(srv_sess *ss) {
    if (ss->kind == SK_HTTP || ss->state != SS_READY || ss->role == ROLE_ADMIN || ss->goaway ||
        ss->close_when_flushed)
        return;
    ss->goaway = 1;
    sess_printf(ss, "GOAWAY reason=draining\n");
    /* closed by the sweep once idle (SRV_GOAWAY_IDLE_MS), not now: a GEN already on its
     * way gets a clean 503 draining, which clients retry elsewhere, not a bare close */
}

void srv_goaway_all(srv *s) {
    for (srv_sess *ss = s->sessions; ss; ss = ss->next) sess_goaway(ss); /* flushed before sleep */
}

static void sess_linger(srv_sess *ss) {
    int r = tls_close_notify(ss->tls);
    if (r == 0) return; /* again when writable */
    ss->state = SS_CLOSING;
    ss->deadline_ms = loop_now_ms() + SRV_LINGER_MS;
}

static void sess_pause(srv_sess *ss, int on) {
    if (ss->paused == on) return;
    ss->paused = on;
    for (srv_req *r = ss->reqs; r; r = r->next) {
        eng_pause(ss->s->eng, r->eng_id, on);
        r->paused = on;
    }
    if (!on) srv_kick(ss->s);
}

/* The output went over its hard limit (nothing a client's input can cause since input
 * stops at max_output_bytes; accepted requests' output could). The client learns why:
 * an ERR after what is queued (beyond the limit: it is short), then the close, and a
 * client that never reads is reset when the linger ends. */
static void sess_overflow(srv_sess *ss) {
    static const char msg[] = "ERR - 507 output_overflow msg=\"output over the connection's hard limit; "
                              "read faster or ask for less\"\n";
    srv_log(ss->s, CFG_LOG_WARN, "session %d: output over its hard limit; closing", ss->num);
    ss->broken = 2;
    char *p = mm_heap_realloc(&ss->s->heap, ss->out, ss->out_len + sizeof msg);
    if (p) {
        memcpy(p + ss->out_len, msg, sizeof msg - 1);
        ss->out = p, ss->out_len += sizeof msg - 1, ss->out_cap = ss->out_len;
    }
    sess_close(ss);
    ss->deadline_ms = loop_now_ms() + SRV_LINGER_MS;
}

void sess_flush(srv_sess *ss) {
    if (!ss->c || !ss->tls) return;
    if (ss->broken == 1) sess_overflow(ss);
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
    if (!ss->paused && pending > budget) sess_pause(ss, 1);
    else if (ss->paused && pending <= budget / 2) sess_pause(ss, 0);
    if (ss->read_blocked && pending <= budget / 2 && sess_resume_later(ss) == 0) ss->read_blocked = 0;
    if (pending == 0 && ss->close_when_flushed && ss->state != SS_CLOSING) sess_linger(ss);
}

/* More output waiting than max_output_bytes: a client that sends and does not read (100,000
 * pipelined HEALTHs) gets no more answers until it reads, rather than a reset. */
static int sess_out_full(const srv_sess *ss) {
    return ss->out_len - ss->out_head > (size_t)ss->s->cfg.net.max_output_bytes;
}

/* Received plaintext: handle each complete line. A line longer than max_line_bytes ends
 * the session with 413 (its bytes are not kept). Returns the bytes taken: all of n, or
 * fewer when the pass's line budget is spent or the output is full (the caller holds the
 * rest). */
static size_t sess_lines(srv_sess *ss, const char *p, size_t n) {
    size_t max = (size_t)ss->s->cfg.net.max_line_bytes, n0 = n;
    while (n > 0 && !ss->close_when_flushed) {
        if (ss->raw_left) { /* an UPDATE's bytes */
            size_t take = n < ss->raw_left ? n : (size_t)ss->raw_left;
            update_data(ss, p, take);
            p += take, n -= take;
            continue;
        }
        if (ss->pass_lines >= SRV_READ_LINES || sess_out_full(ss)) return n0 - n;
        const char *nl = memchr(p, '\n', n);
        size_t take = nl ? (size_t)(nl - p) : n;
        if (ss->in_len + take > max) {
            srv_log(ss->s, CFG_LOG_INFO, "session %d: line over %zu bytes", ss->num, max);
            sess_err(ss, "-", 413, "too_long", "line longer than max_line_bytes");
            sess_close(ss);
            return n0;
        }
        if (ss->in_len + take + 1 > ss->in_cap) {
            size_t cap = ss->in_cap ? ss->in_cap : 1024;
            while (cap < ss->in_len + take + 1) cap *= 2;
            if (cap > max + 1) cap = max + 1;
            char *q = mm_heap_realloc(&ss->s->heap, ss->in, cap);
            if (!q) { sess_err(ss, "-", 500, "internal", "out of memory"); sess_close(ss); return n0; }
            ss->in = q, ss->in_cap = cap;
        }
        memcpy(ss->in + ss->in_len, p, take);
        ss->in_len += take;
        if (!nl) return n0;
        p += take + 1, n -= take + 1;
        ss->pass_lines++;
        verb_line(ss, ss->in, ss->in_len);
        ss->in_len = 0;
    }
    return n0;
}

/* Does a connection's first word name an HTTP method (then it speaks HTTP), or not (the
 * line protocol: HELLO, or anything else, which gets its 401)? 1 HTTP, 0 line, -1 not
 * known yet. The protocol's verbs that share a prefix with a method (HEALTH, HEAD) part
 * at the space a method needs. */
static int sess_sniff(const char *p, size_t n) {
    static const char *const methods[] = {"GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS",
                                          "PATCH", "CONNECT", "TRACE"};
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        size_t ml = strlen(methods[i]), k = n < ml ? n : ml;
        if (memcmp(p, methods[i], k)) continue;
        if (n <= ml) return -1;   /* a prefix so far */
        if (p[ml] == ' ') return 1;
    }
    return 0;
}

/* Plaintext from the client: until the connection's kind is known (ALPN said nothing),
 * its first bytes wait in sniff; then everything goes to the line protocol or to HTTP.
 * Returns the bytes taken (sess_lines may stop early; HTTP takes everything and holds its
 * pipelined requests itself). */
static size_t sess_input(srv_sess *ss, const char *p, size_t n) {
    size_t sniffed = 0;
    if (ss->kind == SK_UNKNOWN) {
        size_t take = n < SRV_SNIFF_MAX - ss->sniff_len ? n : SRV_SNIFF_MAX - ss->sniff_len;
        memcpy(ss->sniff + ss->sniff_len, p, take);
        ss->sniff_len += take, p += take, n -= take, sniffed = take;
        int k = sess_sniff(ss->sniff, ss->sniff_len);
        if (k < 0 && ss->sniff_len < SRV_SNIFF_MAX) return sniffed;
        ss->kind = k == 1 ? SK_HTTP : SK_LINE;
        srv_log(ss->s, CFG_LOG_DEBUG, "session %d: %s (first bytes)", ss->num, k == 1 ? "HTTP" : "line protocol");
        /* at most SRV_SNIFF_MAX bytes, the connection's first: within any budget */
        sess_input(ss, ss->sniff, ss->sniff_len);
        if (n == 0 || ss->close_when_flushed) return sniffed + n;
    }
    if (ss->kind == SK_HTTP) {
        api_sess_input(ss, p, n);
        return sniffed + n;
    }
    return sniffed + sess_lines(ss, p, n);
}

/* Input the last pass left unhandled goes first. 1 when all of it is handled now. */
static int sess_take_held(srv_sess *ss) {
    while (ss->held_off < ss->held_len && !ss->close_when_flushed && ss->state != SS_CLOSING) {
        size_t used = sess_input(ss, ss->held + ss->held_off, ss->held_len - ss->held_off);
        if (!used) return 0;
        ss->held_off += used;
    }
    ss->held_off = ss->held_len = 0;
    return 1;
}

/* Keep what sess_input did not take (at most one read's worth: nothing more is read
 * until it is handled). 0, or -1 out of memory. */
static int sess_hold(srv_sess *ss, const char *p, size_t n, size_t cap) {
    if (!ss->held && !(ss->held = mm_heap_alloc(&ss->s->heap, cap))) return -1;
    memcpy(ss->held, p, n);
    ss->held_off = 0, ss->held_len = n;
    return 0;
}

/* A client that sent plaintext to the TLS port is told, in its own protocol, what the
 * port speaks: an HTTP response for an HTTP request, an ERR line otherwise. Best effort,
 * unencrypted (there is no TLS session), then the connection goes. */
static void sess_plain_answer(srv_sess *ss) {
    char head[16], sink[4096], msg[400];
    size_t n = tls_plain_head(ss->tls, head, sizeof head);
    if (!n || !ss->c) return;
    /* what the request sent beyond the bytes TLS looked at: unread input would turn our
     * close into a reset that can overtake the answer */
    for (int i = 0; i < 16 && net_read(ss->c, sink, sizeof sink) > 0; i++) {}
    static const char text[] = "This port speaks HTTPS (TLS) only: use https:// (the OpenAI API is "
                               "under /v1/, the line protocol after a TLS handshake).\n";
    int len;
    if (sess_sniff(head, n) != 0)
        len = snprintf(msg, sizeof msg, "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n"
                       "Connection: close\r\nContent-Length: %zu\r\n\r\n%s", sizeof text - 1, text);
    else
        len = snprintf(msg, sizeof msg, "ERR - 400 tls_required msg=\"this port speaks TLS only: "
                       "connect with TLS (openssl s_client), then HELLO kiln/1 token=...\"\n");
    if (len > 0 && (size_t)len < sizeof msg) (void)net_write(ss->c, msg, (size_t)len);
}

static ssize_t bio_read(void *ctx, void *buf, size_t cap) { return net_read(ctx, buf, cap); }

static ssize_t bio_write(void *ctx, const void *buf, size_t len) { return net_write(ctx, buf, len); }

/* The client's TLS 1.3 KeyUpdates (RFC 8446 §4.6.3) are handled inside TLS; the log says
 * when some were, once per read that saw them (a client may send many in a row). */
static void sess_key_updates(srv_sess *ss) {
    unsigned ours, got = tls_key_updates(ss->tls, &ours);
    if (got == ss->key_updates) return;
    srv_log(ss->s, CFG_LOG_DEBUG, "session %d: TLS 1.3 KeyUpdate from the client: %u (%u in all, %u of ours in answer)",
            ss->num, got - ss->key_updates, got, ours);
    ss->key_updates = got;
}

/* Until -EAGAIN (decrypted bytes may wait inside TLS with nothing new below), within the
 * pass's budget: SRV_READ_SLICE bytes and SRV_READ_LINES lines (an update's data:
 * SRV_UPD_SLICE), then the next pass goes on (a timer: the transport's readable is an
 * edge, and TLS may hold bytes it already has). With the output over max_output_bytes it
 * stops until sess_flush sees the client drain it. */
static void sess_read(srv_sess *ss) {
    char buf[16384];
    size_t raw = 0, lines = 0;
    ss->pass_lines = 0;
    if (!sess_take_held(ss)) goto stopped;
    for (;;) {
        if (ss->state != SS_CLOSING && !ss->close_when_flushed && sess_out_full(ss)) goto stopped;
        if ((ss->raw_left ? raw >= SRV_UPD_SLICE : lines >= SRV_READ_SLICE) && sess_resume_later(ss) == 0)
            return; /* others' turn */
        ssize_t n = tls_read(ss->tls, buf, sizeof buf);
        sess_key_updates(ss);
        if (n == -EAGAIN) return;
        if (n <= 0) {
            if (n < 0) srv_log(ss->s, CFG_LOG_INFO, "session %d: %s", ss->num, tls_error(ss->tls));
            /* a failure told to the peer by alert ends with FIN: a reset could drop the alert */
            sess_kill(ss, n < 0 && !tls_alerted(ss->tls));
            return;
        }
        ss->last_rx_ms = loop_now_ms();
        if (ss->state == SS_CLOSING || ss->close_when_flushed) continue; /* dropped */
        *(ss->raw_left ? &raw : &lines) += (size_t)n;
        size_t used = sess_input(ss, buf, (size_t)n);
        if (used < (size_t)n) {
            if (sess_hold(ss, buf + used, (size_t)n - used, sizeof buf) < 0) {
                sess_err(ss, "-", 500, "internal", "out of memory");
                sess_close(ss);
                return;
            }
            goto stopped;
        }
    }
stopped: /* held input, or output to drain first */
    if (sess_out_full(ss)) ss->read_blocked = 1; /* sess_flush resumes */
    else (void)sess_resume_later(ss);         /* the line budget: the next pass */
}

static void on_readable(void *ud) {
    srv_sess *ss = ud;
    srv *s = ss->s;
    if (ss->state == SS_TLS) {
        int r = tls_handshake(ss->tls);
        if (r < 0) {
            srv_log(s, CFG_LOG_INFO, "session %d: TLS handshake failed: %s", ss->num, tls_error(ss->tls));
            sess_plain_answer(ss);
            sess_kill(ss, 0);
            return;
        }
        if (r == 0) return;
        ss->state = SS_HELLO;
        const char *alpn = tls_alpn(ss->tls);
        if (alpn) ss->kind = !strcmp(alpn, "http/1.1") ? SK_HTTP : SK_LINE;
        srv_log(s, CFG_LOG_DEBUG, "session %d: %s %s", ss->num, tls_version(ss->tls), tls_suite(ss->tls));
    }
    sess_read(ss);
    srv_flush_dirty(s);
    srv_kick(s);
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

int sess_accept(void *lud, net_conn *c, const net_conn_ops **ops, void **ud) {
    srv *s = lud;
    char peer[sizeof ((srv_sess *)0)->peer];
    if (net_peer(c, peer, sizeof peer) < 0) snprintf(peer, sizeof peer, "?");
    if (sess_admit(s, peer) < 0) {
        srv_log(s, CFG_LOG_INFO, "connection from %s refused: max_connections (%d), all busy", peer,
                s->cfg.net.max_connections);
        return -EMFILE;
    }
    /* the heap full: refused as when max_connections is (the transport resets it) */
    srv_sess *ss = mm_heap_calloc(&s->heap, 1, sizeof *ss);
    if (!ss) {
        srv_log(s, CFG_LOG_WARN, "connection from %s refused: connection memory full", peer);
        return -ENOMEM;
    }
    char err[256];
    tls_bio bio = {c, bio_read, bio_write};
    ss->tls = tls_conn_new(s->tls, &bio, err, sizeof err); /* from the heap too (tls_use_heap) */
    if (!ss->tls) {
        srv_log(s, CFG_LOG_WARN, "connection from %s refused: %s", peer, err);
        mm_heap_free(&s->heap, ss);
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
    ss->tok = -1;
    memcpy(ss->peer, peer, sizeof ss->peer);
    srv_log(s, CFG_LOG_DEBUG, "session %d: connection from %s", ss->num, ss->peer);
    return 0;
}

static void sess_free(srv_sess *ss) {
    srv *s = ss->s;
    sess_drop_requests(ss);
    update_lost(ss);
    srv_debug_forget(s, ss); /* a probe it asked for answers nobody */
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
    mm_heap_free(&s->heap, ss->held);
    mm_heap_free(&s->heap, ss->in);
    mm_heap_free(&s->heap, ss->out);
    mm_heap_free(&s->heap, ss);
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

static int sess_resume_later(srv_sess *ss) {
    if (ss->resume_timer > 0) return 0;
    int64_t t = loop_timer_add(ss->s->env.loop, 0, resume_read, ss);
    if (t < 0) return -1;
    ss->resume_timer = t;
    return 0;
}
