/* net_host: the host transport, the kernel's TCP through non-blocking sockets on the
 * loop (see net.h).
 *
 * The loop is level-triggered but readable and writable are edge-like promises (a
 * reader that stops before -EAGAIN is applying backpressure and must not be woken over
 * and over), so a direction is watched only while it is wanted: read from accept, and
 * again once net_read returned -EAGAIN; write after net_write took less than it was
 * given. Interest is dropped lazily, after the callback, so a reader that drains costs
 * no epoll_ctl at all.
 *
 * net_close lingers: shutdown(SHUT_WR) and discard input until the peer's FIN (or
 * NET_LINGER_MS), because close() with unread input makes the kernel send RST, which can
 * destroy the response the peer has not read yet.
 *
 * A probe is a non-blocking connect watched for LOOP_WRITE (SO_ERROR then tells how it
 * ended) plus a timer for its timeout; a connect that ends at once (no route, an
 * "unreachable" route) is handed to the caller by a timer of 0 ms, so never from inside
 * net_probe. The socket is closed with RST as soon as the outcome is known.
 *
 * A lookup (net_resolve) runs getaddrinfo on a detached thread of its own, which may
 * block for the resolver's whole timeout; the thread tells the loop through a pipe. The
 * lookup's record is shared by the two and freed by whichever lets go last, so a cancel,
 * a timeout or net_free never waits for the thread and never frees what it still uses. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/netif.h"

#define HOST_MAX_LISTEN 8
#define HOST_ACCEPT_BATCH 64
#define HOST_TICK_MS 200       /* linger deadlines, paused listeners */
#define HOST_PAUSE_MS 100      /* a listener that hit EMFILE waits this long */
#define HOST_DRAIN_ROUNDS 16   /* recv calls per event while lingering */
#define HOST_DEFAULT_CONNS 1024 /* cfg.max_conns 0: the conn slots made at init */

typedef struct host_stack host_stack;
typedef struct host_conn host_conn;

typedef struct {
    host_stack *s;
    int id;              /* 0: free */
    int fd;              /* -1 once closed (the outcome is known) */
    int result;          /* the outcome once fd is -1 */
    int64_t timer;       /* the timeout, or the 0 ms delivery of an outcome known early */
    int64_t start_us, end_us;
    net_probe_fn fn;
    void *ud;
} host_probe;

/* What a lookup's thread and the loop share; refs: one each, the last to drop frees. */
typedef struct {
    atomic_int refs;
    int pipe[2];          /* the thread writes one byte when result and ipv4 are set */
    int result;
    char ipv4[INET_ADDRSTRLEN];
    char name[NET_NAME_MAX + 1];
} host_lookup;

typedef struct {
    host_stack *s;
    int id;               /* 0: free */
    host_lookup *lk;      /* NULL once the loop let go of it */
    int64_t timer;
    int64_t start_us;
    net_resolve_fn fn;
    void *ud;
} host_resolve;

typedef struct {
    host_stack *s;
    int fd;
    net_accept_fn fn;
    void *ud;
    int64_t paused_until; /* ms; 0 when watching */
    char host[64];
} host_listener;

struct host_stack {
    struct net_stack base;
    loop_t *l;
    int max_conns, nconns;
    host_listener *ls[HOST_MAX_LISTEN];
    int nls;
    host_conn *conns;    /* every conn, lingering ones included */
    host_conn *slots;    /* [max_conns], made at init: a conn is a slot, never a malloc */
    host_conn *free_slots; /* those not in use (linked by next) */
    host_conn *cb_conn;  /* whose callback runs now; cleared if that conn is freed */
    int64_t tick;        /* maintenance timer id, 0 when not running */
    host_probe probes[NET_PROBES_MAX];
    int probe_seq;       /* the last probe id given */
    host_resolve lookups[NET_RESOLVES_MAX];
    int lookup_seq;
    char scratch[16384]; /* where lingering input is discarded */
};

struct host_conn {
    struct net_conn base;
    host_stack *s;
    int fd;
    const net_conn_ops *ops;
    void *ud;
    int read_armed, want_write, eof, err, lingering;
    int64_t linger_deadline;
    host_conn *prev, *next;
    char peer[64];
};

static const net_transport host_transport;

/* ---------------------------------------------------------------- helpers */

static void conn_unlink_free(host_conn *c) {
    host_stack *s = c->s;
    if (s->cb_conn == c) s->cb_conn = NULL;
    if (c->fd >= 0) {
        loop_fd_del(s->l, c->fd, LOOP_READ | LOOP_WRITE);
        close(c->fd);
    }
    if (c->prev) c->prev->next = c->next;
    else s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    s->nconns--;
    c->next = s->free_slots, s->free_slots = c;
}

/* RST instead of FIN: what close() does when told not to linger. */
static void conn_reset_free(host_conn *c) {
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    if (c->fd >= 0) setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    conn_unlink_free(c);
}

static void conn_ev(loop_t *l, int fd, void *ud, int mask);
static void accept_ev(loop_t *l, int fd, void *ud, int mask);

/* Watch exactly the wanted directions; with add_only, only add what is missing (the
 * lazy half: unwanted ones are dropped after the next callback). */
static int conn_interest(host_conn *c, int add_only) {
    int want = (c->read_armed ? LOOP_READ : 0) | (c->want_write ? LOOP_WRITE : 0);
    if (c->lingering) want = LOOP_READ;
    int have = loop_fd_mask(c->s->l, c->fd);
    if (!add_only && (have & ~want)) loop_fd_del(c->s->l, c->fd, have & ~want);
    if (want & ~have) return loop_fd_add(c->s->l, c->fd, want & ~have, conn_ev, c);
    return 0;
}

static int64_t tick_fn(loop_t *l, int64_t id, void *ud);

static void tick_start(host_stack *s) {
    if (s->tick > 0) return;
    int64_t id = loop_timer_add(s->l, HOST_TICK_MS, tick_fn, s);
    if (id > 0) s->tick = id;
}

static int format_peer(const struct sockaddr_storage *sa, char *buf, size_t cap) {
    char a[INET6_ADDRSTRLEN];
    int n;
    if (sa->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, a, sizeof a);
        n = snprintf(buf, cap, "%s:%u", a, ntohs(in->sin_port));
    } else if (sa->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, a, sizeof a);
        n = snprintf(buf, cap, "[%s]:%u", a, ntohs(in6->sin6_port));
    } else {
        n = snprintf(buf, cap, "?");
    }
    return n;
}

/* ---------------------------------------------------------------- lingering close */

/* Discards input; frees the conn at the peer's FIN or an error. 1 when freed. */
static int linger_drain(host_conn *c) {
    for (int i = 0; i < HOST_DRAIN_ROUNDS; i++) {
        ssize_t n = recv(c->fd, c->s->scratch, sizeof c->s->scratch, 0);
        if (n > 0) continue;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        conn_unlink_free(c); /* FIN or error: nothing left to wait for */
        return 1;
    }
    return 0;
}

static int64_t tick_fn(loop_t *l, int64_t id, void *ud) {
    (void)id;
    host_stack *s = ud;
    int64_t now = loop_now_ms();
    int busy = 0;
    for (host_conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (!c->lingering) continue;
        if (now >= c->linger_deadline) conn_unlink_free(c);
        else busy = 1;
    }
    for (int i = 0; i < s->nls; i++) {
        host_listener *lis = s->ls[i];
        if (!lis->paused_until) continue;
        if (now >= lis->paused_until &&
            loop_fd_add(l, lis->fd, LOOP_READ, accept_ev, lis) == 0)
            lis->paused_until = 0;
        else
            busy = 1;
    }
    if (busy) return HOST_TICK_MS;
    s->tick = 0;
    return LOOP_NOMORE;
}

/* ---------------------------------------------------------------- events */

static void conn_ev(loop_t *l, int fd, void *ud, int mask) {
    (void)l;
    (void)fd;
    host_conn *c = ud;
    host_stack *s = c->s;
    if (c->lingering) {
        linger_drain(c);
        return;
    }
    s->cb_conn = c;
    if ((mask & LOOP_READ) && c->read_armed && c->ops) {
        c->read_armed = 0;
        c->ops->readable(c->ud);
        if (s->cb_conn != c) return; /* closed or aborted from the callback */
    }
    if ((mask & LOOP_WRITE) && c->want_write && c->ops) {
        c->want_write = 0;
        c->ops->writable(c->ud);
        if (s->cb_conn != c) return;
    }
    s->cb_conn = NULL;
    if (conn_interest(c, 0) < 0 && c->ops) {
        /* Cannot watch the fd any more: the conn would hang, so report it failed. */
        const net_conn_ops *ops = c->ops;
        void *cud = c->ud;
        c->ops = NULL;
        ops->closed(cud, -EIO);
        conn_reset_free(c);
    }
}

static void accept_ev(loop_t *l, int fd, void *ud, int mask) {
    (void)mask;
    host_listener *lis = ud;
    host_stack *s = lis->s;
    for (int i = 0; i < HOST_ACCEPT_BATCH; i++) {
        struct sockaddr_storage sa;
        socklen_t sl = sizeof sa;
        int cfd = accept4(fd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* Level-triggered: the pending connection would wake us at once again. */
                loop_fd_del(l, fd, LOOP_READ);
                lis->paused_until = loop_now_ms() + HOST_PAUSE_MS;
                tick_start(s);
                return;
            }
            continue; /* ECONNABORTED and the like: that one is gone, try the next */
        }
        host_conn *c = s->free_slots; /* none when nconns is max_conns */
        if (s->nconns >= s->max_conns || !c) {
            close(cfd);
            continue;
        }
        s->free_slots = c->next;
        memset(c, 0, sizeof *c);
        int one = 1;
        setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        c->base.t = &host_transport;
        c->s = s;
        c->fd = cfd;
        c->read_armed = 1;
        format_peer(&sa, c->peer, sizeof c->peer);
        c->next = s->conns;
        if (s->conns) s->conns->prev = c;
        s->conns = c;
        s->nconns++;

        const net_conn_ops *ops = NULL;
        void *cud = NULL;
        s->cb_conn = c;
        int rc = lis->fn(lis->ud, &c->base, &ops, &cud);
        if (s->cb_conn != c) continue;
        s->cb_conn = NULL;
        if (rc < 0 || !ops) {
            conn_reset_free(c);
            continue;
        }
        c->ops = ops;
        c->ud = cud;
        if (conn_interest(c, 1) < 0) {
            c->ops = NULL;
            ops->closed(cud, -EMFILE); /* the loop has no room for this fd */
            conn_reset_free(c);
        }
    }
}

/* ---------------------------------------------------------------- probes */

/* Closes the probe's socket with RST (a completed handshake leaves no TIME_WAIT here and
 * nothing half-open there) and records the outcome. */
static void probe_settle(host_probe *p, int result) {
    if (p->fd >= 0) {
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        setsockopt(p->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        loop_fd_del(p->s->l, p->fd, LOOP_WRITE);
        close(p->fd);
        p->fd = -1;
    }
    p->result = result;
    p->end_us = loop_now_us();
}

/* Frees the slot, then calls fn (which may start, cancel, or net_free anything). */
static void probe_deliver(host_probe *p) {
    net_probe_fn fn = p->fn;
    void *ud = p->ud;
    int result = p->result;
    double ms = (double)(p->end_us - p->start_us) / 1000.0;
    if (p->timer > 0) loop_timer_del(p->s->l, p->timer);
    p->timer = 0;
    p->id = 0;
    fn(ud, result, ms);
}

static void probe_ev(loop_t *l, int fd, void *ud, int mask) {
    (void)l;
    (void)mask;
    host_probe *p = ud;
    int e = 0;
    socklen_t el = sizeof e;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0) e = errno;
    /* A reset before we looked came after the handshake (one in SYN_SENT is
     * ECONNREFUSED): the port listens. */
    if (e == ECONNRESET || e == EPIPE) e = 0;
    probe_settle(p, -e);
    probe_deliver(p);
}

static int64_t probe_timer(loop_t *l, int64_t id, void *ud) {
    (void)l;
    (void)id;
    host_probe *p = ud;
    p->timer = 0; /* this timer ends here: probe_deliver must not delete it */
    if (p->fd >= 0) {
        /* No outcome in time; a soft error the kernel noted meanwhile (an ICMP
         * unreachable that did not end the connect) says more than a timeout. */
        int e = 0;
        socklen_t el = sizeof e;
        if (getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0 || e == 0) e = ETIMEDOUT;
        probe_settle(p, -e);
    }
    probe_deliver(p);
    return LOOP_NOMORE;
}

static int host_probe_start(net_stack *bs, uint32_t addr, int port, int timeout_ms,
                            net_probe_fn fn, void *ud) {
    host_stack *s = (host_stack *)bs;
    host_probe *p = NULL;
    for (int i = 0; i < NET_PROBES_MAX && !p; i++)
        if (!s->probes[i].id) p = &s->probes[i];
    if (!p) return -EBUSY;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    *p = (host_probe){.s = s, .fd = fd, .fn = fn, .ud = ud, .start_us = loop_now_us()};
    struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    in.sin_addr.s_addr = addr;
    int rc = connect(fd, (struct sockaddr *)&in, sizeof in);
    int64_t delay = timeout_ms;
    if (rc == 0 || errno != EINPROGRESS) {
        probe_settle(p, rc == 0 ? 0 : -errno); /* known now, told from the loop */
        delay = 0;
    } else if ((rc = loop_fd_add(s->l, fd, LOOP_WRITE, probe_ev, p)) < 0) {
        probe_settle(p, 0);
        return rc;
    }
    int64_t t = loop_timer_add(s->l, delay, probe_timer, p);
    if (t < 0) {
        probe_settle(p, 0);
        return (int)t;
    }
    p->timer = t;
    p->id = net_probe_next_id(&s->probe_seq);
    return p->id;
}

static void host_probe_cancel(net_stack *bs, int id) {
    host_stack *s = (host_stack *)bs;
    for (int i = 0; i < NET_PROBES_MAX; i++) {
        host_probe *p = &s->probes[i];
        if (p->id != id) continue;
        probe_settle(p, 0);
        if (p->timer > 0) loop_timer_del(s->l, p->timer);
        p->timer = 0;
        p->id = 0;
    }
}

/* ---------------------------------------------------------------- lookups */

static void lookup_unref(host_lookup *lk) {
    if (atomic_fetch_sub(&lk->refs, 1) != 1) return;
    close(lk->pipe[0]);
    close(lk->pipe[1]);
    free(lk);
}

static int gai_errno(int rc) {
    switch (rc) {
    case 0: return 0;
    case EAI_NONAME:
#ifdef EAI_NODATA
    case EAI_NODATA:
#endif
#ifdef EAI_ADDRFAMILY
    case EAI_ADDRFAMILY:
#endif
        return -ENOENT;
    case EAI_AGAIN: case EAI_FAIL: return -EAGAIN;
    case EAI_MEMORY: return -ENOMEM;
    case EAI_SYSTEM: return errno ? -errno : -EAGAIN;
    default: return -EINVAL;
    }
}

static void *lookup_thread(void *arg) {
    host_lookup *lk = arg;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(lk->name, NULL, &hints, &res);
    lk->result = gai_errno(rc);
    if (rc == 0 && res && res->ai_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)res->ai_addr;
        inet_ntop(AF_INET, &in->sin_addr, lk->ipv4, sizeof lk->ipv4);
    } else if (rc == 0) {
        lk->result = -ENOENT;
    }
    if (res) freeaddrinfo(res);
    char b = 1;
    ssize_t w = write(lk->pipe[1], &b, 1); /* the pipe lives while this thread holds a ref */
    (void)w;
    lookup_unref(lk);
    return NULL;
}

/* The loop lets go of r's lookup (the thread keeps its own ref) and frees the slot. */
static void lookup_release(host_resolve *r) {
    if (r->lk) {
        loop_fd_del(r->s->l, r->lk->pipe[0], LOOP_READ);
        lookup_unref(r->lk);
        r->lk = NULL;
    }
    if (r->timer > 0) loop_timer_del(r->s->l, r->timer);
    r->timer = 0;
    r->id = 0;
}

/* Frees the slot, then calls fn (which may start, cancel, or net_free anything). */
static void lookup_deliver(host_resolve *r, int result, const char *ipv4) {
    char addr[INET_ADDRSTRLEN] = "";
    if (ipv4) snprintf(addr, sizeof addr, "%s", ipv4);
    net_resolve_fn fn = r->fn;
    void *ud = r->ud;
    double ms = (double)(loop_now_us() - r->start_us) / 1000.0;
    lookup_release(r);
    fn(ud, result, result == 0 ? addr : NULL, ms);
}

static void lookup_ev(loop_t *l, int fd, void *ud, int mask) {
    (void)l, (void)fd, (void)mask;
    host_resolve *r = ud;
    char b;
    if (read(r->lk->pipe[0], &b, 1) != 1) return; /* spurious: the thread is not done */
    char ipv4[INET_ADDRSTRLEN];
    memcpy(ipv4, r->lk->ipv4, sizeof ipv4);
    lookup_deliver(r, r->lk->result, ipv4);
}

static int64_t lookup_timer(loop_t *l, int64_t id, void *ud) {
    (void)l, (void)id;
    host_resolve *r = ud;
    r->timer = 0; /* this timer ends here */
    lookup_deliver(r, -ETIMEDOUT, NULL);
    return LOOP_NOMORE;
}

static int host_resolve_start(net_stack *bs, const char *name, int timeout_ms, net_resolve_fn fn,
                              void *ud) {
    host_stack *s = (host_stack *)bs;
    host_resolve *r = NULL;
    for (int i = 0; i < NET_RESOLVES_MAX && !r; i++)
        if (!s->lookups[i].id) r = &s->lookups[i];
    if (!r) return -EBUSY;
    host_lookup *lk = calloc(1, sizeof *lk); /* an admin's diagnostics: rare, not a hot path */
    if (!lk) return -ENOMEM;
    if (pipe2(lk->pipe, O_NONBLOCK | O_CLOEXEC) < 0) {
        int e = -errno;
        free(lk);
        return e;
    }
    snprintf(lk->name, sizeof lk->name, "%s", name);
    atomic_init(&lk->refs, 2);
    *r = (host_resolve){.s = s, .lk = lk, .fn = fn, .ud = ud, .start_us = loop_now_us()};
    int rc = loop_fd_add(s->l, lk->pipe[0], LOOP_READ, lookup_ev, r);
    int64_t t = rc < 0 ? rc : loop_timer_add(s->l, timeout_ms, lookup_timer, r);
    pthread_attr_t at;
    pthread_t th;
    if (t >= 0 && (rc = pthread_attr_init(&at)) == 0) {
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        rc = -pthread_create(&th, &at, lookup_thread, lk);
        pthread_attr_destroy(&at);
    } else if (t >= 0) {
        rc = -rc;
    }
    if (t < 0 || rc < 0) { /* no thread holds a ref: drop both */
        if (t > 0) loop_timer_del(s->l, t);
        atomic_fetch_sub(&lk->refs, 1);
        r->timer = 0;
        lookup_release(r);
        return t < 0 ? (int)t : rc;
    }
    r->timer = t;
    r->id = net_probe_next_id(&s->lookup_seq);
    return r->id;
}

static void host_resolve_cancel(net_stack *bs, int id) {
    host_stack *s = (host_stack *)bs;
    for (int i = 0; i < NET_RESOLVES_MAX; i++)
        if (s->lookups[i].id == id) lookup_release(&s->lookups[i]);
}

/* ---------------------------------------------------------------- transport */

static void host_free(net_stack *bs) {
    host_stack *s = (host_stack *)bs;
    for (int i = 0; i < NET_PROBES_MAX; i++)
        if (s->probes[i].id) host_probe_cancel(bs, s->probes[i].id);
    for (int i = 0; i < NET_RESOLVES_MAX; i++)
        if (s->lookups[i].id) lookup_release(&s->lookups[i]);
    while (s->conns) conn_reset_free(s->conns);
    for (int i = 0; i < s->nls; i++) {
        loop_fd_del(s->l, s->ls[i]->fd, LOOP_READ);
        close(s->ls[i]->fd);
        free(s->ls[i]);
    }
    if (s->tick > 0) loop_timer_del(s->l, s->tick);
    free(s->slots);
    free(s);
}

static int host_listen(net_stack *bs, const char *host, int port, net_accept_fn fn,
                       void *ud, char *err, size_t errlen) {
    host_stack *s = (host_stack *)bs;
    if (s->nls == HOST_MAX_LISTEN) {
        snprintf(err, errlen, "net: listen %s:%d: at most %d listeners", host, port,
                 HOST_MAX_LISTEN);
        return -ENOSPC;
    }
    struct sockaddr_storage sa = {0};
    socklen_t sl;
    struct sockaddr_in *in = (struct sockaddr_in *)&sa;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&sa;
    if (inet_pton(AF_INET, host, &in->sin_addr) == 1) {
        in->sin_family = AF_INET;
        in->sin_port = htons((uint16_t)port);
        sl = sizeof *in;
    } else if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        sl = sizeof *in6;
    } else {
        snprintf(err, errlen, "net: listen: '%s' is not an IPv4 or IPv6 address", host);
        return -EINVAL;
    }
    int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "net: socket: %s", strerror(e));
        return -e;
    }
    int one = 1, rc;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const char *what = "bind";
    if (bind(fd, (struct sockaddr *)&sa, sl) < 0 || (what = "listen", listen(fd, 511) < 0)) {
        rc = -errno;
        snprintf(err, errlen, "net: %s %s:%d: %s", what, host, port, strerror(-rc));
        close(fd);
        return rc;
    }
    host_listener *lis = calloc(1, sizeof *lis);
    if (!lis) {
        close(fd);
        snprintf(err, errlen, "net: listen: out of memory");
        return -ENOMEM;
    }
    *lis = (host_listener){.s = s, .fd = fd, .fn = fn, .ud = ud};
    snprintf(lis->host, sizeof lis->host, "%s", host);
    if ((rc = loop_fd_add(s->l, fd, LOOP_READ, accept_ev, lis)) < 0) {
        snprintf(err, errlen, "net: listen %s:%d: loop: %s", host, port, strerror(-rc));
        close(fd);
        free(lis);
        return rc;
    }
    s->ls[s->nls++] = lis;
    return 0;
}

static ssize_t host_read(net_conn *bc, void *buf, size_t cap) {
    host_conn *c = (host_conn *)bc;
    if (c->err) return c->err;
    if (c->eof) return 0;
    if (cap == 0) return -EINVAL;
    for (;;) {
        ssize_t n = recv(c->fd, buf, cap, 0);
        if (n > 0) return n;
        if (n == 0) {
            c->eof = 1;
            return 0;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            c->read_armed = 1;
            int rc = conn_interest(c, 1);
            return rc < 0 ? rc : -EAGAIN;
        }
        c->err = -errno;
        return c->err;
    }
}

static ssize_t host_write(net_conn *bc, const void *buf, size_t len) {
    host_conn *c = (host_conn *)bc;
    if (c->err) return c->err;
    for (;;) {
        ssize_t n = send(c->fd, buf, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            c->err = -errno;
            return c->err;
        }
        if (n < 0 || (size_t)n < len) {
            c->want_write = 1;
            int rc = conn_interest(c, 1);
            if (rc < 0) return rc;
        }
        return n < 0 ? -EAGAIN : n;
    }
}

static void host_close(net_conn *bc) {
    host_conn *c = (host_conn *)bc;
    host_stack *s = c->s;
    if (s->cb_conn == c) s->cb_conn = NULL;
    c->ops = NULL;
    if (c->eof || c->err) {
        conn_unlink_free(c);
        return;
    }
    if (shutdown(c->fd, SHUT_WR) < 0) {
        conn_unlink_free(c);
        return;
    }
    c->lingering = 1;
    c->linger_deadline = loop_now_ms() + NET_LINGER_MS;
    if (linger_drain(c)) return;
    if (conn_interest(c, 0) < 0) {
        conn_unlink_free(c);
        return;
    }
    tick_start(s);
}

static void host_abort(net_conn *bc) { conn_reset_free((host_conn *)bc); }

static int host_peer(const net_conn *bc, char *buf, size_t cap) {
    const host_conn *c = (const host_conn *)bc;
    size_t n = strlen(c->peer);
    if (n + 1 > cap) return -ENOSPC;
    memcpy(buf, c->peer, n + 1);
    return (int)n;
}

static int host_address(const net_stack *bs, char *buf, size_t cap) {
    const host_stack *s = (const host_stack *)bs;
    const char *a = s->nls ? s->ls[0]->host : "";
    size_t n = strlen(a);
    if (n + 1 > cap) return -ENOSPC;
    memcpy(buf, a, n + 1);
    return 0;
}

static int host_open_conns(const net_stack *bs) { return ((const host_stack *)bs)->nconns; }

static const net_transport host_transport = {
    .name = "host",
    .free = host_free,
    .listen = host_listen,
    .read = host_read,
    .write = host_write,
    .close = host_close,
    .abort = host_abort,
    .peer = host_peer,
    .address = host_address,
    .open_conns = host_open_conns,
    .probe = host_probe_start,
    .probe_cancel = host_probe_cancel,
    .resolve = host_resolve_start,
    .resolve_cancel = host_resolve_cancel,
};

net_stack *net_host_new(loop_t *l, const net_config *cfg, char *err, size_t errlen) {
    host_stack *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "net: out of memory");
        return NULL;
    }
    s->base.t = &host_transport;
    s->base.driver_name = "host";
    s->l = l;
    s->max_conns = cfg->max_conns > 0 ? cfg->max_conns : HOST_DEFAULT_CONNS;
    s->slots = calloc((size_t)s->max_conns, sizeof *s->slots);
    if (!s->slots) {
        snprintf(err, errlen, "net: out of memory for %d connections", s->max_conns);
        free(s);
        return NULL;
    }
    for (int i = s->max_conns - 1; i >= 0; i--) s->slots[i].next = s->free_slots, s->free_slots = &s->slots[i];
    return &s->base;
}
