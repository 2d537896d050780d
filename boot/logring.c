/* logring: see logring.h. */
#include "boot/logring.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "boot/util.h"

static struct {
    char lines[LOGRING_LINES][LOGRING_WIDTH];
    int next;  /* slot the next line goes to */
    int count; /* lines held, <= LOGRING_LINES */
    double t0; /* kiln-init's start, util_now() seconds */
    logring_sink sink;
    void *ctx;
} ring;

void logring_init(double t0, logring_sink sink, void *ctx) {
    ring.t0 = t0;
    ring.sink = sink;
    ring.ctx = ctx;
}

void logring_add(const char *line, int echo) {
    char *slot = ring.lines[ring.next];
    int n = snprintf(slot, LOGRING_WIDTH, "[%8.3f] %s", util_now() - ring.t0, line);
    /* A cut line says so, so nobody mistakes it for the whole message. */
    if (n >= LOGRING_WIDTH) memcpy(slot + LOGRING_WIDTH - 4, "...", 4);
    ring.next = (ring.next + 1) % LOGRING_LINES;
    if (ring.count < LOGRING_LINES) ring.count++;
    if (echo && ring.sink) ring.sink(ring.ctx, line);
}

static void vadd(int echo, const char *fmt, va_list ap) {
    char line[LOGRING_WIDTH];
    vsnprintf(line, sizeof line, fmt, ap);
    logring_add(line, echo);
}

void logring_say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vadd(1, fmt, ap);
    va_end(ap);
}

void logring_note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vadd(0, fmt, ap);
    va_end(ap);
}

int logring_count(void) { return ring.count; }

const char *logring_line(int i) {
    if (i < 0 || i >= ring.count) return "";
    int first = (ring.next - ring.count + LOGRING_LINES) % LOGRING_LINES;
    return ring.lines[(first + i) % LOGRING_LINES];
}

/* ------------------------------------------------------------------ line splitting */

static void emit_line(logring_splitter *sp, logring_emit emit, void *ctx) {
    if (sp->len > 0 && sp->buf[sp->len - 1] == '\r') sp->len--; /* CRLF senders */
    sp->buf[sp->len] = 0;
    emit(ctx, sp->buf);
    sp->len = 0;
}

void logring_split(logring_splitter *sp, const char *data, size_t n, logring_emit emit, void *ctx) {
    for (size_t i = 0; i < n; i++) {
        char c = data[i];
        if (c == '\n') {
            if (sp->cut) sp->cut = 0, sp->len = 0; /* its head was emitted already */
            else emit_line(sp, emit, ctx);
            continue;
        }
        if (sp->cut) continue;
        if (sp->len + 1 >= sizeof sp->buf) {
            /* Emit what fits and drop the rest of this line: a runaway writer must not make
             * us buffer without bound. */
            emit_line(sp, emit, ctx);
            sp->cut = 1;
            continue;
        }
        sp->buf[sp->len++] = c;
    }
}

void logring_split_flush(logring_splitter *sp, logring_emit emit, void *ctx) {
    if (sp->len > 0 && !sp->cut) emit_line(sp, emit, ctx);
    sp->len = 0;
    sp->cut = 0;
}
