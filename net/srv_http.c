/* srv_http: the HTTP listener on metrics_port: GET /metrics, /healthz, /readyz; one request,
 * one response, close. */
#include "net/srv_int.h"

static void http_unlink(srv_http *h) {
    srv *s = h->s;
    if (h->prev) h->prev->next = h->next;
    else s->https = h->next;
    if (h->next) h->next->prev = h->prev;
    s->n_http--;
    mm_heap_free(&s->heap, h->resp_buf);
    h->next = s->free_https, s->free_https = h; /* back to the slots */
}

void srvh_done(srv_http *h, int abort) {
    abort ? net_abort(h->c) : net_close(h->c);
    http_unlink(h);
}

static void http_send(srv_http *h) {
    while (h->resp_len > 0) {
        ssize_t n = net_write(h->c, h->resp, h->resp_len);
        if (n == -EAGAIN) return;
        if (n < 0) { srvh_done(h, 1); return; }
        h->resp += n, h->resp_len -= (size_t)n;
    }
    srvh_done(h, 0);
}

static void http_respond(srv_http *h, int status, const char *ctype, const char *body, size_t blen,
                         int head_only) {
    char head[512];
    int hl = http_head(head, sizeof head, status, ctype, blen);
    if (hl < 0) { srvh_done(h, 1); return; }
    size_t total = (size_t)hl + (head_only ? 0 : blen);
    h->resp_buf = mm_heap_alloc(&h->s->heap, total);
    if (!h->resp_buf) { srvh_done(h, 1); return; }
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
        if (n <= 0) { srvh_done(h, n < 0); return; }
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
        int n = srv_render_metrics(s);
        if (n < 0) http_respond(h, 500, "text/plain", "metrics too large\n", 18, head_only);
        else http_respond(h, 200, "text/plain; version=0.0.4; charset=utf-8", s->metrics_text, (size_t)n, head_only);
    } else if (!strcmp(rq.path, "/healthz")) {
        int ok = srv_live(s);
        http_respond(h, ok ? 200 : 503, "text/plain", ok ? "ok\n" : "stalled\n", ok ? 3 : 8, head_only);
    } else if (!strcmp(rq.path, "/readyz")) {
        int ok = srv_ready(s);
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

/* The oldest connection that has not sent its request yet: when every slot is taken,
 * it goes for the newcomer, so slow or silent clients cannot keep an orchestrator's
 * /healthz probe out (a probe's request comes at once and is answered at once). */
static srv_http *http_victim(srv *s) {
    srv_http *v = NULL;
    for (srv_http *h = s->https; h; h = h->next) /* newest first */
        if (!h->resp_buf) v = h;
    return v;
}

int srvh_accept(void *lud, net_conn *c, const net_conn_ops **ops, void **ud) {
    srv *s = lud;
    if (s->n_http >= SRV_MAX_HTTP) {
        srv_http *v = http_victim(s);
        if (!v) return -EMFILE;
        srvh_done(v, 1);
    }
    srv_http *h = s->free_https; /* SRV_MAX_HTTP slots, made at init */
    if (!h) return -EMFILE;
    s->free_https = h->next;
    memset(h, 0, sizeof *h);
    h->s = s, h->c = c;
    h->head_deadline_ms = loop_now_ms() + SRV_HTTP_HEAD_MS;
    h->deadline_ms = loop_now_ms() + SRV_HTTP_MS;
    h->next = s->https;
    if (s->https) s->https->prev = h;
    s->https = h;
    s->n_http++;
    *ops = &http_ops, *ud = h;
    return 0;
}
