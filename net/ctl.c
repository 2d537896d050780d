/* ctl: the control socket kiln-init talks to (see ctl.h). */
#include "net/ctl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define CTL_LINE_MAX 4096
#define CTL_OUT_MAX 65536 /* a client that does not read loses its connection */

typedef struct ctl_client {
    struct ctl *owner;
    int fd;               /* -1: free slot */
    char in[CTL_LINE_MAX];
    size_t in_len;
    char out[CTL_OUT_MAX];
    size_t out_len;
} ctl_client;

struct ctl {
    loop_t *l;
    srv *s;
    net_stack *net;
    int fd;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int64_t hb_timer;
    long long hb;
    ctl_client clients[CTL_MAX_CLIENTS];
};

static void client_close(ctl *c, ctl_client *k) {
    if (k->fd < 0) return;
    srv_debug_forget(c->s, k); /* a probe it asked for answers nobody */
    loop_fd_del(c->l, k->fd, LOOP_READ | LOOP_WRITE);
    close(k->fd);
    k->fd = -1;
}

static void on_client(loop_t *l, int fd, void *ud, int mask);

static void client_flush(ctl *c, ctl_client *k) {
    while (k->out_len > 0) {
        ssize_t n = send(k->fd, k->out, k->out_len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (n <= 0) { client_close(c, k); return; }
        memmove(k->out, k->out + n, k->out_len - (size_t)n);
        k->out_len -= (size_t)n;
    }
    if (k->fd >= 0) { /* wait for room only while something is left */
        if (k->out_len) loop_fd_add(c->l, k->fd, LOOP_WRITE, on_client, k);
        else loop_fd_del(c->l, k->fd, LOOP_WRITE);
    }
}

static void client_printf(ctl *c, ctl_client *k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void client_printf(ctl *c, ctl_client *k, const char *fmt, ...) {
    if (k->fd < 0) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(k->out + k->out_len, sizeof k->out - k->out_len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof k->out - k->out_len) { /* the supervisor stopped reading */
        client_close(c, k);
        return;
    }
    k->out_len += (size_t)n;
}

static void cmd_status(ctl *c, ctl_client *k) {
    char health[256], addr[64] = "";
    srv_health(c->s, health, sizeof health);
    net_address(c->net, addr, sizeof addr);
    client_printf(c, k, "model=%s\nuptime_s=%.1f\ndriver=%s\naddress=%s\nconnections=%d\nserved=%lld\nbackend=%s\n",
                  srv_model_name(c->s), srv_uptime_s(c->s), net_driver_name(c->net), addr,
                  net_open_conns(c->net), srv_served(c->s), srv_backend_name(c->s));
    const char *note = srv_backend_note(c->s);
    if (note[0]) client_printf(c, k, "backend_note=%s\n", note);
    /* the HEALTH line's pairs, one per line */
    for (char *p = strchr(health, ' '); p && *p;) {
        char *q = strchr(p + 1, ' ');
        client_printf(c, k, "%.*s\n", (int)(q ? q - p - 1 : (long)strlen(p + 1)), p + 1);
        p = q;
    }
}

/* debug: DEBUG's answers as the control socket's lines (net/srv_debug.c) */
static void dbg_line(void *ud, const char *text) {
    ctl_client *k = ud;
    client_printf(k->owner, k, "%s\n", text);
}

static void dbg_body(void *ud, const char *text, size_t len) {
    ctl_client *k = ud;
    for (const char *p = text, *end = text + len; p < end && k->fd >= 0;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (k->out_len + n + 128 > sizeof k->out) client_flush(k->owner, k); /* room, if it reads */
        if (k->fd < 0) return;
        if (k->out_len + n + 128 > sizeof k->out) { /* it does not: say so rather than lose the socket */
            client_printf(k->owner, k, "(the rest cut: the control socket's buffer is full)\n");
            return;
        }
        /* "." alone ends an answer here: such a line goes out as ".." */
        client_printf(k->owner, k, "%s%.*s\n", n == 1 && *p == '.' ? "." : "", (int)n, p);
        p += n + 1;
    }
}

static void dbg_err(void *ud, int code, const char *slug, const char *msg) {
    ctl_client *k = ud;
    client_printf(k->owner, k, "error: %d %s: %s\n", code, slug, msg);
}

static void dbg_done(void *ud) { /* a probe's answer came: the "." it was waiting for */
    ctl_client *k = ud;
    client_printf(k->owner, k, ".\n");
    if (k->fd >= 0) client_flush(k->owner, k);
}

/* 1 when the answer comes later (its "." then too) */
static int cmd_debug(ctl *c, ctl_client *k, char *line) {
    char buf[CTL_LINE_MAX + 8], err[256];
    int n = snprintf(buf, sizeof buf, "DEBUG%s", line + 5);
    proto_line l;
    if (n < 0 || (size_t)n >= sizeof buf || proto_split(buf, (size_t)n, &l, err, sizeof err) < 0) {
        client_printf(c, k, "error: 400 bad_request: %s\n", n < 0 || (size_t)n >= sizeof buf ? "too long" : err);
        return 0;
    }
    srv_debug_io io = {dbg_line, dbg_body, dbg_err, dbg_done, k};
    return srv_debug(c->s, &l, "console", &io) == 1;
}

static void run_command(ctl *c, ctl_client *k, char *line) {
    char buf[CFG_STR_MAX + 64];
    char err[512];
    if (!strcmp(line, "status")) {
        cmd_status(c, k);
    } else if (!strcmp(line, "stats")) {
        srv_stats(c->s, buf, sizeof buf);
        client_printf(c, k, "%s\n", buf);
    } else if (!strcmp(line, "drain") || !strcmp(line, "drain off")) {
        srv_set_draining(c->s, line[5] == 0);
        client_printf(c, k, "draining=%d\n", line[5] == 0);
    } else if (!strcmp(line, "restart")) {
        client_printf(c, k, "restarting\n");
        srv_drain(c->s, 1);
    } else if (!strncmp(line, "config get ", 11)) {
        const char *key = line + 11;
        if (srv_config_get(c->s, key, buf, sizeof buf) < 0) client_printf(c, k, "error: no such key %.64s\n", key);
        else client_printf(c, k, "%s=%s\n", key, buf);
    } else if (!strncmp(line, "config set ", 11)) {
        char *key = line + 11, *val = strchr(key, ' ');
        if (!val) {
            client_printf(c, k, "error: config set SECTION.KEY VALUE\n");
        } else {
            *val++ = 0;
            int r = srv_config_set(c->s, key, val, err, sizeof err);
            if (r == 0) client_printf(c, k, "ok\n");
            else client_printf(c, k, "%s: %s\n", r == -EAGAIN ? "later" : "error", err);
        }
    } else if (!strncmp(line, "update ", 7)) { /* kiln-init's answer to our ASK (the network update) */
        if (srv_update_answer(c->s, line) == 0) client_printf(c, k, "ok\n");
        else client_printf(c, k, "error: no update waits for that\n");
    } else if (!strcmp(line, "net")) {
        char addr[64] = "";
        net_address(c->net, addr, sizeof addr);
        client_printf(c, k, "driver=%s\naddress=%s\nconnections=%d\n", net_driver_name(c->net), addr,
                      net_open_conns(c->net));
    } else if (!strcmp(line, "debug") || !strncmp(line, "debug ", 6)) {
        if (cmd_debug(c, k, line)) return; /* a probe: its "." follows its answer */
    } else if (line[0]) {
        client_printf(c, k, "error: unknown command %.64s (status stats drain restart config net debug)\n", line);
    }
    client_printf(c, k, ".\n");
}

static void on_client(loop_t *l, int fd, void *ud, int mask) {
    (void)l, (void)fd;
    ctl_client *k = ud;
    ctl *c = k->owner;
    if (mask & LOOP_WRITE) client_flush(c, k);
    if (k->fd < 0 || !(mask & LOOP_READ)) return;
    ssize_t n = recv(k->fd, k->in + k->in_len, sizeof k->in - k->in_len, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) { client_close(c, k); return; }
    k->in_len += (size_t)n;
    char *nl;
    while (k->fd >= 0 && (nl = memchr(k->in, '\n', k->in_len))) {
        *nl = 0;
        if (nl > k->in && nl[-1] == '\r') nl[-1] = 0;
        run_command(c, k, k->in);
        size_t used = (size_t)(nl - k->in) + 1;
        memmove(k->in, k->in + used, k->in_len - used);
        k->in_len -= used;
    }
    if (k->fd >= 0 && k->in_len == sizeof k->in) client_close(c, k); /* a line too long */
    if (k->fd >= 0) client_flush(c, k);
}

static void on_accept(loop_t *l, int fd, void *ud, int mask) {
    (void)mask;
    ctl *c = ud;
    int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (cfd < 0) return;
    ctl_client *k = NULL;
    for (int i = 0; i < CTL_MAX_CLIENTS && !k; i++)
        if (c->clients[i].fd < 0) k = &c->clients[i];
    if (!k || loop_fd_add(l, cfd, LOOP_READ, on_client, k) < 0) {
        close(cfd);
        return;
    }
    k->owner = c, k->fd = cfd, k->in_len = 0, k->out_len = 0;
    if (srv_is_ready(c->s)) client_printf(c, k, "READY %.2f\n", srv_uptime_s(c->s));
    client_flush(c, k);
}

/* srv_notify_fn: an ASK line to every client (kiln-init is the one there is). */
static int ask_clients(void *ud, const char *line) {
    ctl *c = ud;
    int n = 0;
    for (int i = 0; i < CTL_MAX_CLIENTS; i++) {
        ctl_client *k = &c->clients[i];
        if (k->fd < 0) continue;
        client_printf(c, k, "%s\n", line);
        client_flush(c, k);
        n += k->fd >= 0;
    }
    return n;
}

static int64_t on_heartbeat(loop_t *l, int64_t id, void *ud) {
    (void)l, (void)id;
    ctl *c = ud;
    c->hb++;
    for (int i = 0; i < CTL_MAX_CLIENTS; i++) {
        ctl_client *k = &c->clients[i];
        if (k->fd < 0) continue;
        client_printf(c, k, "HB %lld served=%lld loop_max_ms=%.1f\n", c->hb, srv_served(c->s),
                      srv_loop_max_ms(c->s));
        client_flush(c, k);
    }
    return CTL_HB_MS;
}

ctl *ctl_new(loop_t *l, srv *s, net_stack *net, const char *path, char *err, size_t errlen) {
    ctl *c = calloc(1, sizeof *c);
    if (!c) { snprintf(err, errlen, "out of memory"); return NULL; }
    c->l = l, c->s = s, c->net = net, c->fd = -1;
    for (int i = 0; i < CTL_MAX_CLIENTS; i++) c->clients[i].fd = -1;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path) {
        snprintf(err, errlen, "control socket path too long: %.64s", path);
        free(c);
        return NULL;
    }
    strcpy(a.sun_path, path);
    strcpy(c->path, path);
    unlink(path); /* a socket file left by a previous kilnd */
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    mode_t old = umask(077);
    int r = c->fd < 0 ? -1 : bind(c->fd, (struct sockaddr *)&a, sizeof a);
    umask(old);
    if (r < 0 || listen(c->fd, 4) < 0 || loop_fd_add(l, c->fd, LOOP_READ, on_accept, c) < 0) {
        snprintf(err, errlen, "control socket %s: %s", path, strerror(errno));
        ctl_free(c);
        return NULL;
    }
    srv_set_notify(s, ask_clients, c);
    if ((c->hb_timer = loop_timer_add(l, CTL_HB_MS, on_heartbeat, c)) < 0) {
        snprintf(err, errlen, "control socket: no timer");
        ctl_free(c);
        return NULL;
    }
    return c;
}

void ctl_free(ctl *c) {
    if (!c) return;
    for (int i = 0; i < CTL_MAX_CLIENTS; i++) client_close(c, &c->clients[i]);
    if (c->s) srv_set_notify(c->s, NULL, NULL);
    if (c->hb_timer > 0) loop_timer_del(c->l, c->hb_timer);
    if (c->fd >= 0) {
        loop_fd_del(c->l, c->fd, LOOP_READ);
        close(c->fd);
        unlink(c->path);
    }
    free(c);
}
