/* console: the serial console's line discipline. kiln-init reads /dev/console itself
 * (non-canonical, no echo from the tty) so that it can print kilnd's log lines and its own
 * messages while someone types, redrawing the prompt and the half-typed line after them.
 * Editing is minimal: backspace, ^U (erase the line), ^C (drop it); escape sequences
 * (arrow keys) are swallowed. An optional password guards the shell (3 tries, then a
 * 10 s pause). In test mode the console is stdin/stdout (a pipe): no tty, no echo.
 *
 * While a command waits for kilnd (busy), input is not read: it waits in the tty, then is
 * taken in order. Output never blocks: what the line cannot take now waits in a buffer
 * that the loop flushes on POLLOUT. */
#ifndef KILN_BOOT_CONSOLE_H
#define KILN_BOOT_CONSOLE_H

#include <stddef.h>
#include <termios.h>

#include "boot/util.h"

#define CON_LINE_MAX 256
#define CON_PROMPT "kiln> "
#define CON_PASS_TRIES 3
#define CON_LOCK_S 10.0
#define CON_REOPEN_S 2.0   /* after the console fails, open it again this much later */
#define CON_OUT_MAX 65536  /* bytes of output waiting for a slow console; more is dropped */

typedef void (*con_line_fn)(void *arg, char *line); /* a typed command; NULL: input ended */

enum { CON_SHELL, CON_PASSWORD, CON_LOCKED };

typedef struct {
    int in_fd, out_fd;      /* -1: none (real mode: one fd, both) */
    char dev[UTIL_PATH_MAX]; /* real mode: the device, reopened after errors; "" in test mode */
    int tty;                /* a terminal: we echo and redraw */
    struct termios saved;   /* the tty's settings before ours, restored at exit */
    int have_saved;
    char line[CON_LINE_MAX]; /* the line being typed */
    size_t len;
    int last_cr, esc;       /* CRLF folding; escape-sequence skipping state */
    char in[512];           /* bytes read but not handled yet (a command went busy) */
    size_t in_off, in_len;
    char out[CON_OUT_MAX];  /* output the console has not taken yet: out[out_off, +out_len) */
    size_t out_off, out_len;
    size_t dropped;         /* bytes dropped since the buffer filled up */
    int shown;              /* the prompt and line are on screen, the cursor after them */
    int busy;
    int mode;               /* CON_SHELL, CON_PASSWORD, CON_LOCKED */
    char pass[128];         /* the password, when there is one */
    int tries;
    double locked_until, reopen_at;
    con_line_fn on_line;
    void *arg;
} con;

int con_open_device(con *c, const char *dev, con_line_fn on_line, void *arg);
int con_open_stdio(con *c, con_line_fn on_line, void *arg);
void con_set_password(con *c, const char *pass);
int con_poll_fd(const con *c);           /* for POLLIN; -1 when input is not wanted now */
int con_out_fd(const con *c);            /* for POLLOUT; -1 when no output waits */
void con_on_readable(con *c, double now);
void con_on_writable(con *c);
void con_flush(con *c, double timeout_s); /* before the end: let waiting output out */
void con_printf(con *c, const char *fmt, ...) __attribute__((format(printf, 2, 3))); /* one output line */
void con_async(con *c, const char *line); /* a line not asked for (a log line) */
void con_prompt(con *c);
void con_set_busy(con *c, int busy, double now);
double con_tick(con *c, double now);
void con_restore(con *c);                /* the tty's settings back (test mode's exit) */

#endif
