/* net_echo: an echo server over net.h, for tests/net/echo.sh.
 *
 *   net_echo --driver host|tap|packet [--ifname NAME] [--address A/len|dhcp|HOST]
 *            [--gateway G] [--mac M] [--port P] [--max-conns N] [--greet BYTES]
 *
 * host: --address is the address to listen on (default 0.0.0.0). tap/packet: the lwIP
 * interface's IPv4 configuration. Prints "listening <address>:<port>" once it can be
 * reached (for DHCP: once an address is bound), then echoes every byte of every
 * connection back, with backpressure (it stops reading while its writes are refused),
 * and closes a connection once the peer's EOF came and everything was echoed.
 *
 * --greet BYTES: instead of echoing, answer a connection's first input with BYTES bytes
 * (byte i is i % 251) and close it without reading anything: the peer must still get
 * all of them and a clean EOF (net_close delivers what was written even with input
 * left unread).
 *
 * Runs until SIGTERM or SIGINT, then prints "exit open_conns=N" and frees everything
 * (so a leak checker sees what the transport left behind). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "net/net.h"
#include "tests/net/net_args.h"
#include "sched/loop.h"

#define ECHO_BUF 65536
#define ECHO_ROUNDS 16 /* read+write rounds per callback before yielding to the loop */

typedef struct {
    net_conn *c;
    size_t off, len;
    size_t greeted; /* --greet: bytes written so far */
    int eof, task_pending, dead;
    char buf[ECHO_BUF];
} echo_conn;

static loop_t *g_loop;
static net_stack *g_net;
static int g_port;
static const char *g_listen_host = "0.0.0.0";
static size_t g_greet;

static void pump(echo_conn *e);

static void pump_task(loop_t *l, void *ud) {
    (void)l;
    echo_conn *e = ud;
    e->task_pending = 0;
    if (e->dead) {
        free(e);
        return;
    }
    pump(e);
}

static void drop(echo_conn *e) {
    if (e->task_pending) e->dead = 1; /* the queued task frees it */
    else free(e);
}

/* --greet: write the pattern until all of it is taken, then close. */
static void greet(echo_conn *e) {
    while (e->greeted < g_greet) {
        size_t n = g_greet - e->greeted;
        if (n > sizeof e->buf) n = sizeof e->buf;
        for (size_t i = 0; i < n; i++) e->buf[i] = (char)((e->greeted + i) % 251);
        ssize_t w = net_write(e->c, e->buf, n);
        if (w == -EAGAIN) return; /* writable fires */
        if (w < 0) {
            net_abort(e->c);
            drop(e);
            return;
        }
        e->greeted += (size_t)w;
        if ((size_t)w < n) return;
    }
    net_close(e->c);
    drop(e);
}

/* Echo what is pending, then read more, until the transport says wait. */
static void pump(echo_conn *e) {
    if (g_greet) {
        greet(e);
        return;
    }
    for (int round = 0; round < ECHO_ROUNDS; round++) {
        if (e->off < e->len) {
            ssize_t w = net_write(e->c, e->buf + e->off, e->len - e->off);
            if (w == -EAGAIN) return; /* writable fires */
            if (w < 0) {
                net_abort(e->c);
                drop(e);
                return;
            }
            e->off += (size_t)w;
            if (e->off < e->len) return; /* took less: writable fires */
            e->off = e->len = 0;
        }
        if (e->eof) {
            net_close(e->c);
            drop(e);
            return;
        }
        ssize_t r = net_read(e->c, e->buf, sizeof e->buf);
        if (r == -EAGAIN) return; /* readable fires */
        if (r == 0) {
            e->eof = 1;
            continue;
        }
        if (r < 0) {
            net_abort(e->c);
            drop(e);
            return;
        }
        e->len = (size_t)r;
    }
    /* Still busy: neither callback will come, so continue from a task (fairness). */
    if (!e->task_pending && loop_task_post(g_loop, pump_task, e) == 0) e->task_pending = 1;
}

static void on_readable(void *ud) { pump(ud); }
static void on_writable(void *ud) { pump(ud); }
static void on_closed(void *ud, int err) {
    (void)err;
    drop(ud);
}

static const net_conn_ops echo_ops = {on_readable, on_writable, on_closed};

static int on_accept(void *lud, net_conn *c, const net_conn_ops **ops, void **ud) {
    (void)lud;
    echo_conn *e = malloc(sizeof *e);
    if (!e) return -ENOMEM;
    e->c = c;
    e->off = e->len = e->greeted = 0;
    e->eof = e->task_pending = e->dead = 0;
    *ops = &echo_ops;
    *ud = e;
    return 0;
}

/* Prints the ready line once the stack has an address. */
static int64_t ready_check(loop_t *l, int64_t id, void *ud) {
    (void)l;
    (void)id;
    (void)ud;
    char a[64];
    if (net_address(g_net, a, sizeof a) < 0 || !a[0]) return 20;
    printf("listening %s:%d\n", a, g_port);
    fflush(stdout);
    return LOOP_NOMORE;
}

static void on_signal(int sig) {
    (void)sig;
    loop_stop(g_loop);
}

static void usage(void) {
    fprintf(stderr, "usage: net_echo --driver host|tap|packet [--ifname NAME] "
                    "[--address A/len|dhcp|HOST] [--gateway G] [--mac M] [--port P] "
                    "[--max-conns N] [--greet BYTES]\n");
    exit(2);
}

int main(int argc, char **argv) {
    net_config cfg = {.driver = CFG_DRIVER_HOST, .ifname = "", .address = "", .gateway = "",
                      .mac = "", .hostname = "kiln-echo", .max_conns = 256};
    g_port = 7;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) usage();
        const char *v = argv[++i];
        int took = net_args_take(&cfg, a, v);
        if (took < 0) usage();
        if (took) continue;
        if (!strcmp(a, "--port")) {
            g_port = atoi(v);
        } else if (!strcmp(a, "--max-conns")) {
            cfg.max_conns = atoi(v);
        } else if (!strcmp(a, "--greet")) {
            g_greet = (size_t)strtoull(v, NULL, 10);
        } else {
            usage();
        }
    }
    if (cfg.driver == CFG_DRIVER_HOST && cfg.address[0]) g_listen_host = cfg.address;
    signal(SIGPIPE, SIG_IGN);

    g_loop = loop_new(4096, 64);
    if (!g_loop) {
        perror("net_echo: loop_new");
        return 1;
    }
    char err[256];
    g_net = net_new(g_loop, &cfg, err, sizeof err);
    if (!g_net) {
        fprintf(stderr, "net_echo: %s\n", err);
        return 1;
    }
    if (err[0]) fprintf(stderr, "net_echo: warning: %s\n", err);
    if (net_listen(g_net, g_listen_host, g_port, on_accept, NULL, err, sizeof err) < 0) {
        fprintf(stderr, "net_echo: %s\n", err);
        net_free(g_net);
        return 1;
    }
    if (loop_timer_add(g_loop, 0, ready_check, NULL) < 0) {
        fprintf(stderr, "net_echo: loop_timer_add failed\n");
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    int rc = loop_run(g_loop);
    printf("exit open_conns=%d\n", net_open_conns(g_net));
    fflush(stdout);
    net_free(g_net);
    loop_free(g_loop);
    return rc < 0 ? 1 : 0;
}
