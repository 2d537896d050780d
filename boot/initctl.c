/* initctl: see initctl.h. */
#include "boot/initctl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "boot/util.h"

int initctl_init(initctl *c, const char *path, initctl_event_fn on_event, void *ev_arg) {
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->on_event = on_event;
    c->ev_arg = ev_arg;
    if (strlen(path) >= sizeof c->path) return -ENAMETOOLONG;
    strcpy(c->path, path);
    return 0;
}

int initctl_connected(const initctl *c) { return c->fd >= 0; }
void initctl_on_ask(initctl *c, initctl_ask_fn fn, void *arg) { c->on_ask = fn, c->ask_arg = arg; }
int initctl_busy(const initctl *c) { return c->pending; }

static void finish(initctl *c, int status) {
    if (!c->pending) return;
    c->pending = 0; /* first: on_done may start the next request */
    if (c->on_done) c->on_done(c->arg, status);
}

void initctl_close(initctl *c) {
    if (c->fd < 0) return;
    close(c->fd); /* close cannot be retried on EINTR: the fd is gone either way */
    c->fd = -1;
    c->owed = 0;
    c->sp.len = 0, c->sp.cut = 0;
    finish(c, -ECONNRESET);
    c->on_event(c->ev_arg, INITCTL_EV_DOWN, 0);
}

int initctl_connect(initctl *c) {
    if (c->fd >= 0) return 1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, c->path, strlen(c->path) + 1);
    int r;
    do r = connect(fd, (struct sockaddr *)&a, sizeof a); while (r < 0 && errno == EINTR);
    if (r < 0) {
        int e = errno;
        close(fd);
        /* Not there yet, or there but not listening yet, or its backlog is full: try later. */
        if (e == ENOENT || e == ECONNREFUSED || e == EAGAIN) return 0;
        return -e;
    }
    c->fd = fd;
    c->on_event(c->ev_arg, INITCTL_EV_UP, 0);
    return 1;
}

/* One line from kilnd: an unsolicited event, a line of the current answer, or a line of
 * an answer nobody waits for any more. */
static void on_line(void *arg, const char *line) {
    initctl *c = arg;
    if (util_starts(line, "HB ") || !strcmp(line, "HB")) {
        c->on_event(c->ev_arg, INITCTL_EV_HB, strtod(line + 2, NULL));
        const char *sv = strstr(line, " served=");
        if (sv) {
            char *end;
            double k = strtod(sv + 8, &end);
            if (end != sv + 8 && k >= 0 && k < 1e18) c->on_event(c->ev_arg, INITCTL_EV_SERVED, k);
        }
        const char *lm = strstr(line, " loop_max_ms=");
        if (lm) {
            char *end;
            double ms = strtod(lm + 13, &end);
            if (end != lm + 13 && ms >= 0 && ms < 1e9) c->on_event(c->ev_arg, INITCTL_EV_LOOP, ms);
        }
        return;
    }
    if (util_starts(line, "READY")) {
        c->on_event(c->ev_arg, INITCTL_EV_READY, strtod(line + 5, NULL));
        return;
    }
    if (util_starts(line, "ASK ")) { /* never part of an answer: answers never start so */
        if (c->on_ask) c->on_ask(c->ask_arg, line + 4);
        else logring_note("kiln-init: ctl: kilnd asks, nobody listens: %.160s", line);
        return;
    }
    int end = !strcmp(line, ".");
    if (c->owed > 0) {
        if (end) c->owed--;
        return;
    }
    if (!c->pending) {
        logring_note("kiln-init: ctl: unexpected line from kilnd: %.160s", line);
        return;
    }
    if (end) finish(c, 0);
    else if (c->on_line) c->on_line(c->arg, line);
}

void initctl_on_readable(initctl *c) {
    char buf[4096];
    /* A few reads per wakeup: enough to empty the socket normally, bounded so a chatty
     * kilnd cannot starve the console. */
    for (int i = 0; i < 8 && c->fd >= 0; i++) {
        ssize_t n = read(c->fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) return;
        if (n <= 0) {
            if (n < 0) logring_note("kiln-init: ctl: read: %s", strerror(errno));
            initctl_close(c);
            return;
        }
        logring_split(&c->sp, buf, (size_t)n, on_line, c);
    }
}

int initctl_request(initctl *c, const char *cmd, double timeout_s, initctl_line_fn line_fn, initctl_done_fn done_fn, void *arg) {
    if (c->fd < 0) return -ENOTCONN;
    if (c->pending) return -EBUSY;
    char buf[512];
    int n = snprintf(buf, sizeof buf, "%s\n", cmd);
    if (n < 0 || (size_t)n >= sizeof buf) return -EMSGSIZE;
    ssize_t w;
    do w = send(c->fd, buf, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT); while (w < 0 && errno == EINTR);
    if (w < 0) {
        int e = errno;
        /* A full socket buffer means kilnd has not read for a long while: fail this
         * request, keep the connection (the heartbeat decides whether kilnd is hung). */
        if (e == EAGAIN) return -EAGAIN;
        initctl_close(c);
        return -e;
    }
    if (w != n) {
        /* Half a command would desynchronise the protocol; a fresh connection will not. */
        initctl_close(c);
        return -EIO;
    }
    c->pending = 1;
    c->deadline = util_now() + timeout_s;
    c->on_line = line_fn;
    c->on_done = done_fn;
    c->arg = arg;
    return 0;
}

double initctl_tick(initctl *c, double now) {
    if (!c->pending) return 1e9;
    if (now >= c->deadline) {
        c->owed++; /* its answer may still come: drop it then */
        finish(c, -ETIMEDOUT);
        return 1e9;
    }
    return c->deadline - now;
}
