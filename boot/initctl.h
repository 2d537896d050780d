/* initctl: kiln-init's client of kilnd's control socket (a unix stream socket kilnd listens
 * on, /run/kiln/ctl.sock). Line-based:
 *   kilnd -> init, unsolicited: "HB <n> served=<k>" every 500 ms from kilnd's loop (k: GENs
 *                                finished by stop or length; an older kilnd sends "HB <n>");
 *                                "READY <s>" once kilnd serves;
 *                                "ASK <what>": kilnd asks kiln-init to act (a network
 *                                update's steps, a reboot; see initctl_on_ask).
 *   init -> kilnd: one command line; kilnd answers zero or more lines, then ".". HB lines
 *                  may come in between; they are not part of the answer.
 * One request is outstanding at a time and each has a deadline, so a wedged kilnd never
 * blocks PID 1: the request fails with -ETIMEDOUT and its late answer, if it ever comes,
 * is dropped (answers come in order, so a count of owed answers tells them apart). */
#ifndef KILN_BOOT_INITCTL_H
#define KILN_BOOT_INITCTL_H

#include "boot/logring.h"

enum { INITCTL_EV_HB, INITCTL_EV_SERVED, INITCTL_EV_READY, INITCTL_EV_UP, INITCTL_EV_DOWN, INITCTL_EV_LOOP };

/* HB: n; SERVED (right after its HB, when the HB line has served=): k; READY: seconds */
typedef void (*initctl_event_fn)(void *arg, int ev, double value);
typedef void (*initctl_line_fn)(void *arg, const char *line);  /* one line of an answer */
typedef void (*initctl_done_fn)(void *arg, int status);        /* 0, -ETIMEDOUT, -ECONNRESET, -ENOTCONN */
typedef void (*initctl_ask_fn)(void *arg, const char *what);   /* an ASK line, without "ASK " */

typedef struct {
    char path[108];        /* sun_path */
    int fd;                /* -1 when not connected */
    logring_splitter sp;   /* input lines */
    initctl_event_fn on_event;
    void *ev_arg;
    /* the outstanding request */
    int pending;
    double deadline;       /* util_now() seconds */
    initctl_line_fn on_line;
    initctl_done_fn on_done;
    void *arg;
    int owed;              /* answers of timed-out requests still to come: dropped */
    initctl_ask_fn on_ask; /* NULL: ASK lines are noted and ignored */
    void *ask_arg;
} initctl;

int initctl_init(initctl *c, const char *path, initctl_event_fn on_event, void *ev_arg);
/* kilnd's ASK lines go to fn; kiln-init answers with a request of its own (initctl_request). */
void initctl_on_ask(initctl *c, initctl_ask_fn fn, void *arg);
int initctl_connect(initctl *c); /* 1 connected, 0 not yet (no listener), <0 error */
void initctl_close(initctl *c);  /* fails the pending request with -ECONNRESET */
int initctl_connected(const initctl *c);
int initctl_busy(const initctl *c);
void initctl_on_readable(initctl *c);
int initctl_request(initctl *c, const char *cmd, double timeout_s, initctl_line_fn on_line, initctl_done_fn on_done, void *arg);
double initctl_tick(initctl *c, double now); /* expires the request; returns seconds to its deadline */

#endif
