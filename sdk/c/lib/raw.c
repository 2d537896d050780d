/* libkiln raw streams: the client's transport (TCP with deadlines, the same verified TLS)
 * without the line protocol, so a tool can speak another protocol to kilnd's port or to
 * another server (`kiln bench --openai` speaks HTTP/1.1 over it, TLS or plain). The
 * receive buffer of the line layer is reused: bytes are copied out of it. All of one
 * kl_one; the kiln_raw_* calls (pool.c) give them the raw pool's only connection. */
#include <string.h>

#include "internal.h"

int kl1_raw_write(kl_one *c, const void *buf, size_t len, kiln_error *err) {
    if (!c->raw) {
        kl_err(err, KILN_EINVAL, "not a raw client");
        return KILN_EINVAL;
    }
    int r = kl_ensure(c, err);
    if (r)
        return r;
    r = kl_tls_write(c, buf, len, kl_now_ms() + c->o.io_timeout_ms, err);
    if (r)
        kl_drop(c, r, err ? err->message : "");
    return r;
}

long kl1_raw_read(kl_one *c, void *buf, size_t cap, int timeout_ms, kiln_error *err) {
    if (!c->raw || !c->up) {
        kl_err(err, !c->raw ? KILN_EINVAL : KILN_ECLOSED, "%s",
               !c->raw ? "not a raw client" : "not connected");
        return !c->raw ? KILN_EINVAL : KILN_ECLOSED;
    }
    if (c->rpos == c->rlen) {
        kl_buf_reset(c);
        int r = kl_tls_read(c, kl_now_ms() + (timeout_ms > 0 ? timeout_ms : 0), err);
        if (r == 0)
            return 0;
        if (r < 0) {
            kl_drop(c, r, err ? err->message : "");
            return r;
        }
    }
    size_t n = c->rlen - c->rpos;
    if (n > cap)
        n = cap;
    memcpy(buf, c->rbuf + c->rpos, n);
    c->rpos += n;
    return (long)n;
}

void kl1_raw_hangup(kl_one *c) {
    if (c->raw && c->up)
        kl_drop(c, KILN_ECLOSED, "hung up");
}
