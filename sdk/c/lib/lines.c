/* libkiln utilities: the monotonic clock, error filling, backoff, and the line layer
 * over the TLS stream (server lines out of the receive buffer, bounded by
 * KL_LINE_MAX; whole lines out). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "internal.h"

int64_t kl_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void kl_sleep_ms(int ms) {
    if (ms <= 0)
        return;
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

void kl_err(kiln_error *err, int code, const char *fmt, ...) {
    if (!err)
        return;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    /* One line, whatever a server message or a file name put in. */
    for (char *p = err->message; *p; p++)
        if ((unsigned char)*p < 0x20)
            *p = ' ';
}

/* backoff_ms doubling per attempt (1-based), capped at backoff_max_ms. */
int kl_backoff_ms(const kl_one *c, int attempt) {
    int64_t d = c->o.backoff_ms > 0 ? c->o.backoff_ms : 0;
    for (int i = 1; i < attempt && d < c->o.backoff_max_ms; i++)
        d *= 2;
    if (d > c->o.backoff_max_ms)
        d = c->o.backoff_max_ms;
    return (int)d;
}

void kl_buf_reset(kl_one *c) {
    c->rpos = c->rlen = 0;
}

/* A complete line in rbuf[rpos..rlen): cut it out. 1 found, 0 not yet, < 0 too long. */
static int take_line(kl_one *c, char **line, size_t *len, kiln_error *err) {
    size_t avail = c->rlen - c->rpos;
    char *start = c->rbuf + c->rpos;
    char *nl = avail ? memchr(start, '\n', avail) : NULL;
    if (!nl) {
        if (avail > KL_LINE_MAX) {
            kl_err(err, KILN_EPROTO, "%s sent a line longer than %zu bytes", c->server,
                   KL_LINE_MAX);
            return KILN_EPROTO;
        }
        return 0;
    }
    size_t n = (size_t)(nl - start);
    c->rpos += n + 1;
    if (n > 0 && start[n - 1] == '\r')
        n--;
    start[n] = '\0';
    *line = start;
    *len = n;
    return 1;
}

int kl_line(kl_one *c, int64_t deadline_ms, char **line, size_t *len, kiln_error *err) {
    for (;;) {
        int t = take_line(c, line, len, err);
        if (t != 0)
            return t;
        int r = kl_tls_read(c, deadline_ms, err);
        if (r <= 0)
            return r;
    }
}

int kl_send_line(kl_one *c, const char *s, size_t len, kiln_error *err) {
    kiln_error e = {0, ""};
    if (!c->up) {
        kl_err(err, KILN_ECLOSED, "not connected");
        return KILN_ECLOSED;
    }
    int64_t deadline = kl_now_ms() + c->o.io_timeout_ms;
    int r;
    char small[4096];
    if (len < sizeof small) {
        /* One TLS record for short lines (most of them). */
        memcpy(small, s, len);
        small[len] = '\n';
        r = kl_tls_write(c, small, len + 1, deadline, &e);
    } else {
        r = kl_tls_write(c, s, len, deadline, &e);
        if (!r)
            r = kl_tls_write(c, "\n", 1, deadline, &e);
    }
    if (r) {
        if (err)
            *err = e;
        /* The stream is now in an unknown state; tear down at the next safe point
         * (not here: we may be inside a callback). */
        if (!c->broken) {
            c->broken = r;
            c->broke = e;
        }
    }
    return r;
}
