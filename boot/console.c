/* console: see console.h. */
#include "boot/console.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "boot/logring.h"

static void handle_input(con *c, double now);

/* ------------------------------------------------------------------ output */

/* Writes what the console takes now; the rest waits in c->out for POLLOUT. PID 1 never
 * blocks on a slow or flow-controlled serial line. */
static void flush_out(con *c) {
    while (c->out_len > 0 && c->out_fd >= 0) {
        ssize_t w = write(c->out_fd, c->out + c->out_off, c->out_len);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EAGAIN) return;
        if (w < 0) {
            /* Nowhere to report a console error but the console: the text is lost; input
             * errors on the same device make us reopen it. */
            logring_note("kiln-init: console write: %s", strerror(errno));
            c->out_off = c->out_len = 0;
            return;
        }
        c->out_off += (size_t)w;
        c->out_len -= (size_t)w;
    }
    if (c->out_len == 0) c->out_off = 0;
}

static void append(con *c, const char *buf, size_t n) {
    if (c->out_off + c->out_len + n > sizeof c->out) { /* compact */
        memmove(c->out, c->out + c->out_off, c->out_len);
        c->out_off = 0;
    }
    if (c->out_len + n > sizeof c->out) {
        c->dropped += n;
        return;
    }
    memcpy(c->out + c->out_off + c->out_len, buf, n);
    c->out_len += n;
}

/* Queues text for the console. When the console has not taken CON_OUT_MAX bytes, newer
 * text is dropped, and a note says how much once there is room again. */
static void emit(con *c, const char *buf, size_t n) {
    if (c->out_fd < 0) return;
    if (c->dropped && c->out_len + 80 + n <= sizeof c->out) {
        char note[80];
        int k = snprintf(note, sizeof note, "\n[console: %zu bytes of output dropped]\n", c->dropped);
        c->dropped = 0;
        append(c, note, (size_t)k);
    }
    append(c, buf, n);
    flush_out(c);
}

int con_out_fd(const con *c) { return c->out_len > 0 ? c->out_fd : -1; }

void con_on_writable(con *c) { flush_out(c); }

void con_flush(con *c, double timeout_s) {
    double end = util_now() + timeout_s;
    while (c->out_len > 0 && c->out_fd >= 0 && util_now() < end) {
        struct pollfd p = {.fd = c->out_fd, .events = POLLOUT};
        if (poll(&p, 1, 50) < 0 && errno != EINTR) return;
        flush_out(c);
    }
}

static void emits(con *c, const char *s) { emit(c, s, strlen(s)); }

static const char *prompt_text(const con *c) { return c->mode == CON_PASSWORD ? "password: " : CON_PROMPT; }

void con_prompt(con *c) {
    if (c->busy || c->mode == CON_LOCKED) return;
    emits(c, prompt_text(c));
    if (c->tty && c->mode == CON_SHELL) emit(c, c->line, c->len);
    c->shown = 1;
}

/* Takes the prompt line off the screen so other text can go there. */
static void hide_prompt(con *c) {
    if (!c->shown) return;
    emits(c, c->tty ? "\r\033[K" : "\n");
    c->shown = 0;
}

void con_printf(con *c, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n > sizeof buf - 2) n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    hide_prompt(c);
    emit(c, buf, (size_t)n);
}

void con_async(con *c, const char *line) {
    int was = c->shown;
    con_printf(c, "%s", line);
    if (was) con_prompt(c);
}

/* ------------------------------------------------------------------ opening */

static void init_common(con *c, con_line_fn on_line, void *arg) {
    memset(c, 0, sizeof *c);
    c->in_fd = c->out_fd = -1;
    c->on_line = on_line;
    c->arg = arg;
    c->mode = CON_SHELL;
}

/* Raw-ish mode: we echo and edit; ^S/^Q flow control off so nobody can freeze PID 1's
 * output from the keyboard; output processing stays on ("\n" -> "\r\n"). */
static void make_raw(con *c) {
    if (tcgetattr(c->in_fd, &c->saved) < 0) return; /* not a tty: a pipe in test mode */
    c->have_saved = 1;
    c->tty = 1;
    struct termios t = c->saved;
    t.c_lflag &= ~(tcflag_t)(ICANON | ECHO | ECHONL | ISIG | IEXTEN);
    t.c_iflag &= ~(tcflag_t)(IXON | IXOFF | ICRNL | INLCR | IGNCR | ISTRIP);
    t.c_oflag |= OPOST | ONLCR;
    t.c_cc[VMIN] = 1;
    t.c_cc[VTIME] = 0;
    if (tcsetattr(c->in_fd, TCSANOW, &t) < 0) logring_note("kiln-init: tcsetattr console: %s", strerror(errno));
}

static int open_dev(con *c) {
    int fd;
    do fd = open(c->dev, O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC); while (fd < 0 && errno == EINTR);
    if (fd < 0) return -errno;
    c->in_fd = c->out_fd = fd;
    make_raw(c);
    return 0;
}

int con_open_device(con *c, const char *dev, con_line_fn on_line, void *arg) {
    init_common(c, on_line, arg);
    snprintf(c->dev, sizeof c->dev, "%s", dev);
    int r = open_dev(c);
    if (r < 0) c->reopen_at = util_now() + CON_REOPEN_S;
    return r;
}

int con_open_stdio(con *c, con_line_fn on_line, void *arg) {
    init_common(c, on_line, arg);
    c->in_fd = 0;
    c->out_fd = 1;
    make_raw(c); /* a person at a terminal gets the same editing as on the serial line */
    return 0;
}

void con_restore(con *c) {
    if (c->have_saved) tcsetattr(c->in_fd, TCSANOW, &c->saved);
}

static void lost(con *c, double now, const char *why) {
    if (!c->dev[0]) { /* test mode: stdin ended, the harness is gone */
        c->in_fd = -1;
        c->on_line(c->arg, NULL);
        return;
    }
    logring_note("kiln-init: console %s: %s; reopening in %.0f s", c->dev, why, CON_REOPEN_S);
    close(c->in_fd);
    c->in_fd = c->out_fd = -1;
    c->have_saved = c->tty = 0;
    c->reopen_at = now + CON_REOPEN_S;
}

/* ------------------------------------------------------------------ password */

void con_set_password(con *c, const char *pass) {
    snprintf(c->pass, sizeof c->pass, "%s", pass);
    if (c->pass[0]) c->mode = CON_PASSWORD;
}

/* Compares in time independent of where the strings differ. */
static int pass_ok(const char *want, const char *got) {
    size_t a = strlen(want), b = strlen(got), n = a > b ? a : b;
    unsigned d = (unsigned)(a ^ b);
    for (size_t i = 0; i < n; i++) d |= (unsigned)((i < a ? want[i] : 0) ^ (i < b ? got[i] : 0));
    return d == 0;
}

static void password_line(con *c, const char *line, double now) {
    if (pass_ok(c->pass, line)) {
        c->mode = CON_SHELL;
        c->tries = 0;
        con_printf(c, "kiln: console unlocked; `help` lists the commands");
        return;
    }
    if (++c->tries < CON_PASS_TRIES) {
        con_printf(c, "wrong password");
        return;
    }
    c->tries = 0;
    c->mode = CON_LOCKED;
    c->locked_until = now + CON_LOCK_S;
    con_printf(c, "wrong password %d times: wait %.0f s", CON_PASS_TRIES, CON_LOCK_S);
    logring_note("kiln-init: console: %d wrong passwords", CON_PASS_TRIES);
}

/* ------------------------------------------------------------------ input */

static void submit(con *c, double now) {
    c->line[c->len] = 0;
    if (c->tty) emits(c, "\n");
    c->shown = 0;
    char line[CON_LINE_MAX];
    memcpy(line, c->line, c->len + 1);
    c->len = 0;
    if (c->mode == CON_PASSWORD) password_line(c, line, now);
    else c->on_line(c->arg, line);
    con_prompt(c); /* no-op while a command waits for kilnd */
}

static void key(con *c, unsigned char ch, double now) {
    if (c->esc) { /* ESC [ params final: skip it all */
        if (c->esc == 1 && ch == '[') c->esc = 2;
        else if (c->esc == 1 || (ch >= 0x40 && ch <= 0x7e)) c->esc = 0;
        return;
    }
    int cr = c->last_cr;
    c->last_cr = ch == '\r';
    if (ch == '\r' || (ch == '\n' && !cr)) {
        submit(c, now);
        return;
    }
    if (ch == '\n') return; /* the LF of a CRLF */
    if (ch == 0x1b) { c->esc = 1; return; }
    if (ch == 0x7f || ch == 0x08) {
        if (c->len > 0 && c->tty && c->mode == CON_SHELL) emits(c, "\b \b");
        if (c->len > 0) c->len--;
        return;
    }
    if (ch == 0x15 || ch == 0x03) { /* ^U erases the line, ^C drops it */
        c->len = 0;
        if (!c->tty) return;
        emits(c, ch == 0x03 ? "^C\n" : "\r\033[K");
        c->shown = 0;
        con_prompt(c);
        return;
    }
    if (ch < 0x20) return;
    if (c->len + 1 >= sizeof c->line) return; /* full: further keys are dropped */
    c->line[c->len++] = (char)ch;
    if (c->tty && c->mode == CON_SHELL) emit(c, (const char *)&ch, 1);
}

/* Handles stashed input until it is used up or a command goes busy. */
static void handle_input(con *c, double now) {
    while (c->in_off < c->in_len && !c->busy) {
        unsigned char ch = (unsigned char)c->in[c->in_off++];
        if (c->mode == CON_LOCKED) continue; /* typed during the pause: dropped */
        key(c, ch, now);
    }
    if (c->in_off >= c->in_len) c->in_off = c->in_len = 0;
}

int con_poll_fd(const con *c) {
    if (c->busy || c->in_len > 0) return -1;
    return c->in_fd;
}

void con_on_readable(con *c, double now) {
    if (c->in_fd < 0 || c->in_len > 0) return;
    ssize_t n = read(c->in_fd, c->in, sizeof c->in);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
        lost(c, now, n < 0 ? strerror(errno) : "end of input");
        return;
    }
    c->in_off = 0;
    c->in_len = (size_t)n;
    handle_input(c, now);
}

void con_set_busy(con *c, int busy, double now) {
    (void)now;
    c->busy = busy;
    /* What was typed meanwhile is handled on the next tick, not from here: we may be deep
     * in a callback (kilnd just exited) where running a command is not safe. */
    if (!busy) con_prompt(c);
}

double con_tick(con *c, double now) {
    if (c->in_len > 0 && !c->busy) handle_input(c, now);
    if (c->dev[0] && c->in_fd < 0) {
        if (now < c->reopen_at) return c->reopen_at - now;
        if (open_dev(c) < 0) {
            c->reopen_at = now + CON_REOPEN_S;
            return CON_REOPEN_S;
        }
        logring_note("kiln-init: console %s reopened", c->dev);
        con_prompt(c);
    }
    if (c->mode == CON_LOCKED) {
        if (now < c->locked_until) return c->locked_until - now;
        c->mode = CON_PASSWORD;
        con_prompt(c);
    }
    return c->in_len > 0 && !c->busy ? 0 : 1e9; /* stashed input: no sleeping */
}
