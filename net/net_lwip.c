/* net_lwip: the lwIP transport (raw API, NO_SYS=1) over a frame device (netif_tap.c,
 * netif_packet.c), driven from the loop (see net.h).
 *
 * lwIP is one global stack, so there is at most one lwIP net_stack at a time and its
 * object is static (a dispatch task still queued on the loop after net_free then finds
 * it inactive instead of freed memory).
 *
 * lwIP's callbacks (accept, recv, sent, err, poll) run inside lwIP, sometimes inside our
 * own calls into it, so they only record state on the conn and queue it for the
 * dispatch task; the user's callbacks run from there, where they may call anything.
 *
 * Received data is copied out of its pbufs into a per-conn ring at once rather than kept
 * as a pbuf chain: a chain holds one pool pbuf per segment however small, so a few peers
 * sending tiny segments to a conn that is not being read could empty the pool, and then
 * the ACKs that would free memory for everyone else are dropped too (the stack wedges).
 * The window still closes while the user does not read: tcp_recved follows net_read.
 *
 * Ownership of a pcb: ours from accept until the err callback (lwIP freed it: never
 * touched again), tcp_abort, or a successful tcp_close with every callback cleared
 * first (lwIP finishes the close alone). net_close first shuts down only our sending
 * side and keeps discarding input until the peer's FIN, because lwIP (like the kernel)
 * answers data arriving after a full close with RST, which could destroy a response the
 * peer has not read yet; after NET_LINGER_MS it aborts.
 *
 * A probe is a pcb of its own (never a conn: no slot, no ring) with connected and err
 * callbacks, and a loop timer for its timeout. Those callbacks run inside lwIP, so they
 * only record the outcome (tcp_abort on connect: RST, nothing sent) and move the
 * probe's timer to 0 ms; the user's fn runs from that timer. The next hop is chosen here
 * as lwIP's etharp_output would (on the subnet: the host; else the gateway), so that
 * "no route" is told at once and an ARP that never got an answer by the timeout is told
 * apart from a host that answered ARP but not the SYN. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "lwip/dhcp.h"
#include "lwip/dns.h"
#include "lwip/etharp.h"
#include "lwip/ethip6.h"
#include "lwip/init.h"
#include "lwip/ip_addr.h"
#include "lwip/netif.h"
#include "lwip/pbuf.h"
#include "lwip/priv/tcp_priv.h"
#include "lwip/stats.h"
#include "lwip/tcp.h"
#include "lwip/timeouts.h"
#include "netif/ethernet.h"

#include "core/config.h"
#include "net/netif.h"

/* A conn's receive ring holds what the peer sent and the user has not read: never more
 * than TCP_WND, since the window only reopens as the user reads (tcp_recved). Without
 * window scaling that is < 64 KiB, which also fits tcp_recved's u16. */
#if LWIP_WND_SCALE || TCP_WND > 0xffff
#error "net_lwip.c needs LWIP_WND_SCALE 0 and TCP_WND <= 0xffff"
#endif
#define LW_RXBUF TCP_WND

#define LW_MAX_LISTEN MEMP_NUM_TCP_PCB_LISTEN
#define LW_POLL_TICKS 2          /* lwIP poll callback every 2 slow ticks (2 x 200 ms) */
#define LW_TIMER_MAX_MS 100      /* longest sleep between sys_check_timeouts */
#define LW_DISPATCH_BUDGET 4096  /* events per dispatch task before yielding */

/* ---------------------------------------------------------------- lwIP port */

u32_t sys_now(void) { return (u32_t)loop_now_ms(); }

uint32_t kiln_lwip_rand(void) {
    /* Batched: lwIP draws one per connection (ISN), port and DHCP transaction. */
    static uint32_t pool[64];
    static size_t left;
    if (left == 0) {
        size_t got = 0;
        while (got < sizeof pool) {
            ssize_t n = getrandom((char *)pool + got, sizeof pool - got, 0);
            if (n > 0) got += (size_t)n;
            else if (n < 0 && errno == EINTR) continue;
            else break;
        }
        if (got < sizeof pool) {
            /* No getrandom (ancient kernel): a clock-seeded splitmix, better than none. */
            static uint64_t x;
            x ^= (uint64_t)loop_now_us() * 0x9e3779b97f4a7c15ull;
            for (size_t i = 0; i < sizeof pool / sizeof pool[0]; i++) {
                uint64_t z = (x += 0x9e3779b97f4a7c15ull);
                z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
                z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
                pool[i] = (uint32_t)(z ^ (z >> 31));
            }
        }
        left = sizeof pool / sizeof pool[0];
    }
    return pool[--left];
}

/* ---------------------------------------------------------------- counters */

/* What lwIP does not count (kiln_lwip_tcp_in, lw_accept); global like lwIP itself. */
static struct {
    uint64_t syns, syn_backlog, syn_no_pcb, syn_time_wait, syn_dup, accept_refused;
} lw_count;

/* lwIP's counters are 32 bits: each is widened to 64 by adding what it moved since the
 * last look (the timer looks every LW_TIMER_MAX_MS, far less than a wrap). */
enum { W_SEGS_OUT, W_SEGS_IN, W_RETRANS, W_RSTS_OUT, W_IN_ERRS, W_MEM_ERRS, W_N };
static struct {
    uint32_t last[W_N];
    uint64_t total[W_N];
} lw_wide;

/* The heap and every pool (tcp.memerr is left out: it also counts a tcp_write refused
 * for a full send queue, which is backpressure, not a shortage). */
static uint32_t lw_mem_errs_now(void) {
    uint32_t n = lwip_stats.mem.err;
    for (int i = 0; i < MEMP_MAX; i++) n += lwip_stats.memp[i]->err;
    return n;
}

static void lw_widen(void) {
    const uint32_t now[W_N] = {
        /* tcp.xmit: data segments and control ones (pure ACKs, RSTs) alike; MIB2's
         * tcpoutsegs leaves the control segments out */
        [W_SEGS_OUT] = lwip_stats.tcp.xmit,
        [W_SEGS_IN] = lwip_stats.mib2.tcpinsegs,
        [W_RETRANS] = lwip_stats.mib2.tcpretranssegs,
        [W_RSTS_OUT] = lwip_stats.mib2.tcpoutrsts,
        /* checksum and length errors never reach tcpinerrs (it counts refused data) */
        [W_IN_ERRS] = lwip_stats.mib2.tcpinerrs + lwip_stats.tcp.chkerr + lwip_stats.tcp.lenerr,
        [W_MEM_ERRS] = lw_mem_errs_now(),
    };
    for (int i = 0; i < W_N; i++) {
        lw_wide.total[i] += (uint32_t)(now[i] - lw_wide.last[i]);
        lw_wide.last[i] = now[i];
    }
}

/* TIME_WAIT pcbs a new SYN met, to be freed once lwIP's input is done (the hook below
 * may not change pcb lists). */
#define LW_TW_KILL 16
static const struct tcp_pcb *lw_tw_kill[LW_TW_KILL];
static int lw_n_tw_kill;

/* Every TCP segment that found a pcb, before lwIP acts on it (lwipopts.h). A SYN on a
 * listener whose backlog (handshakes not yet accepted) is full is dropped by lwIP
 * without a word. A SYN on a TIME_WAIT pcb of the same addresses and ports means the
 * peer reused its port within lwIP's 2 MSL (2 minutes; the kernel picks a port again
 * that soon, seen in the soak): lwIP answers with an ACK (or RST) and ignores the
 * peer's RST (RFC 1337), so every retransmitted SYN meets the same pcb and the connect
 * times out. Like Linux and BSD (RFC 1122 4.2.2.13) a new SYN ends the TIME_WAIT: it is
 * dropped here, the pcb is freed after this input (lw_tw_reap), and the peer's SYN
 * retransmission (1 s later) finds the listener. */
int kiln_lwip_tcp_in(const struct tcp_pcb *pcb, const struct tcp_hdr *hdr) {
    u16_t fl = TCPH_FLAGS(hdr);
    if ((fl & (TCP_SYN | TCP_ACK | TCP_RST)) != TCP_SYN) return ERR_OK;
    switch (pcb->state) {
    case LISTEN: {
        const struct tcp_pcb_listen *l = (const struct tcp_pcb_listen *)pcb;
        lw_count.syns++;
        if (l->accepts_pending >= l->backlog) lw_count.syn_backlog++;
        break;
    }
    case TIME_WAIT:
        lw_count.syn_time_wait++;
        for (int i = 0; i < lw_n_tw_kill; i++)
            if (lw_tw_kill[i] == pcb) return ERR_ABRT;
        if (lw_n_tw_kill == LW_TW_KILL) return ERR_OK; /* lwIP's old answer, for now */
        lw_tw_kill[lw_n_tw_kill++] = pcb;
        return ERR_ABRT; /* dropped: the retransmitted SYN gets the SYN-ACK */
    case SYN_RCVD: lw_count.syn_dup++; break;
    default: break;
    }
    return ERR_OK;
}

/* Frees the TIME_WAIT pcbs kiln_lwip_tcp_in marked, those still in TIME_WAIT (lwIP may
 * have reused the memory for another pcb meanwhile: only a pcb on the list is freed). */
static void lw_tw_reap(void) {
    for (int i = 0; i < lw_n_tw_kill; i++)
        for (struct tcp_pcb *p = tcp_tw_pcbs; p; p = p->next)
            if (p == lw_tw_kill[i]) {
                tcp_abort(p); /* a TIME_WAIT pcb is only unlinked and freed: no RST */
                break;
            }
    lw_n_tw_kill = 0;
}

/* ---------------------------------------------------------------- state */

enum { ST_ACCEPTING, ST_OPEN, ST_CLOSING };
enum { EV_ACCEPT = 1, EV_READ = 2, EV_WRITE = 4, EV_CLOSED = 8 };

typedef struct lw_stack lw_stack;
typedef struct lw_conn lw_conn;

typedef struct {
    lw_stack *s;
    struct tcp_pcb *pcb;
    net_accept_fn fn;
    void *ud;
} lw_listener;

typedef struct {
    lw_stack *s;
    int id;              /* 0: free */
    struct tcp_pcb *pcb; /* ours until the outcome; NULL after (aborted, or lwIP freed it) */
    int done, result;    /* the outcome, once known */
    ip4_addr_t hop;      /* the next hop: the host itself, or the gateway */
    int64_t timer;       /* the timeout, or the 0 ms delivery once done */
    int64_t start_us, end_us;
    net_probe_fn fn;
    void *ud;
} lw_probe;

/* A name lookup through lwIP's DNS client. lwIP has no way to cancel a query, so the
 * found callback's argument is a token, never a pointer: the answer to a lookup that was
 * cancelled or timed out (its slot perhaps reused since) or that belongs to an earlier
 * stack finds no slot with its token and is dropped. How many queries are out at once is
 * lwIP's own bound (DNS_TABLE_SIZE: ERR_MEM, -EBUSY to the caller). */
typedef struct {
    lw_stack *s;
    int id;              /* 0: the caller let go (none, cancelled, told) */
    uintptr_t token;     /* lwIP's callback argument for this lookup's query; 0: none */
    int done, result;    /* the outcome, once known */
    char ipv4[16];
    int64_t timer;       /* the timeout, or the 0 ms delivery once done */
    int64_t start_us, end_us;
    net_resolve_fn fn;
    void *ud;
} lw_lookup;

struct lw_stack {
    struct net_stack base;
    int active;
    loop_t *l;
    netif_dev dev;
    int dev_open, dev_watched;
    struct netif nif;
    int nif_added, dhcp;
    int64_t timer;
    int max_conns, nconns;
    lw_listener ls[LW_MAX_LISTEN];
    int nls;
    lw_conn *conns;                /* every conn object */
    lw_conn *slots;                /* [max_conns], made at init: a conn is a slot */
    lw_conn *free_slots;           /* those not in use (linked by next) */
    unsigned char *rxmem;          /* [max_conns][LW_RXBUF]: slot i's receive ring (pages
                                    * touched only once a connection in that slot reads) */
    lw_conn *pend_head, *pend_tail; /* conns with events for the dispatch task */
    int dispatching;               /* suppresses task posts while the task runs */
    int posted;                    /* a dispatch task is queued */
    int mem_blocked;               /* conns whose tcp_write failed for lwIP memory */
    int mem_wake;                  /* data was acked (memory freed): wake those */
    lw_conn *cb_conn;              /* whose user callback runs now; cleared if freed */
    lw_probe probes[NET_PROBES_MAX];
    int probe_seq;                 /* the last probe id given */
    lw_lookup lookups[NET_RESOLVES_MAX];
    int lookup_seq;
    char hostname[64];
};

struct lw_conn {
    struct net_conn base;
    lw_stack *s;
    struct tcp_pcb *pcb; /* NULL once lwIP freed it or we handed it back */
    lw_listener *lis;
    int state;
    const net_conn_ops *ops;
    void *ud;
    unsigned char *rxbuf; /* LW_RXBUF ring of received, unread bytes: its slot's */
    size_t rx_head, rx_len;
    int fin;             /* the peer's FIN came (after the ring's bytes) */
    int err;             /* negative errno once the pcb failed */
    int read_armed, want_write, mem_blocked, shut_tx;
    int events, pending;
    int64_t deadline;    /* ST_CLOSING: abort after this (ms) */
    lw_conn *prev, *next, *pprev, *pnext;
    char peer[64];
};

static lw_stack the_stack;
static int lwip_ready;

static const net_transport lwip_transport;

/* ---------------------------------------------------------------- helpers */

static int lw_errno(err_t e) {
    switch (e) {
    case ERR_OK: return 0;
    case ERR_MEM: return -ENOMEM;
    case ERR_BUF: return -ENOBUFS;
    case ERR_TIMEOUT: return -ETIMEDOUT;
    case ERR_RTE: return -EHOSTUNREACH;
    case ERR_INPROGRESS: return -EINPROGRESS;
    case ERR_VAL: return -EINVAL;
    case ERR_WOULDBLOCK: return -EAGAIN;
    case ERR_USE: return -EADDRINUSE;
    case ERR_ALREADY: return -EALREADY;
    case ERR_ISCONN: return -EISCONN;
    case ERR_CONN: return -ENOTCONN;
    case ERR_IF: return -ENETDOWN;
    case ERR_ABRT: return -ECONNABORTED;
    case ERR_RST: return -ECONNRESET;
    case ERR_CLSD: return -ENOTCONN;
    case ERR_ARG: return -EINVAL;
    default: return -EIO;
    }
}

static void dispatch_task(loop_t *l, void *ud);

static void schedule(lw_stack *s) {
    if (s->posted || s->dispatching) return;
    /* A full task ring: the timer or the next frame retries (see after_lwip). */
    if (loop_task_post(s->l, dispatch_task, s) == 0) s->posted = 1;
}

static void pend_unlink(lw_conn *c) {
    lw_stack *s = c->s;
    if (!c->pending) return;
    if (c->pprev) c->pprev->pnext = c->pnext;
    else s->pend_head = c->pnext;
    if (c->pnext) c->pnext->pprev = c->pprev;
    else s->pend_tail = c->pprev;
    c->pprev = c->pnext = NULL;
    c->pending = 0;
}

static void post(lw_conn *c, int ev) {
    lw_stack *s = c->s;
    c->events |= ev;
    if (!c->pending) {
        c->pending = 1;
        c->pnext = NULL;
        c->pprev = s->pend_tail;
        if (s->pend_tail) s->pend_tail->pnext = c;
        else s->pend_head = c;
        s->pend_tail = c;
    }
    schedule(s);
}

static void set_mem_blocked(lw_conn *c, int on) {
    if (c->mem_blocked == on) return;
    c->mem_blocked = on;
    c->s->mem_blocked += on ? 1 : -1;
}

/* Frees the conn object (never the pcb: the caller has dealt with it). */
static void conn_free(lw_conn *c) {
    lw_stack *s = c->s;
    if (s->cb_conn == c) s->cb_conn = NULL;
    pend_unlink(c);
    set_mem_blocked(c, 0);
    if (c->prev) c->prev->next = c->next;
    else s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    s->nconns--;
    c->next = s->free_slots, s->free_slots = c;
}

static void pcb_detach(struct tcp_pcb *pcb) {
    tcp_arg(pcb, NULL);
    tcp_recv(pcb, NULL);
    tcp_sent(pcb, NULL);
    tcp_err(pcb, NULL);
    tcp_poll(pcb, NULL, 0);
}

/* RST and forget. tcp_abort would call our err callback: detach first. */
static void conn_abort_free(lw_conn *c) {
    if (c->pcb) {
        struct tcp_pcb *pcb = c->pcb;
        c->pcb = NULL;
        pcb_detach(pcb);
        tcp_abort(pcb);
    }
    conn_free(c);
}

static int has_room(struct tcp_pcb *pcb) {
    if (tcp_sndqueuelen(pcb) >= TCP_SND_QUEUELEN) return 0;
    return tcp_sndbuf(pcb) >= TCP_MSS || (!pcb->unsent && !pcb->unacked && tcp_sndbuf(pcb));
}

/* ---------------------------------------------------------------- closing */

static err_t lw_recv(void *arg, struct tcp_pcb *pcb, struct pbuf *p, err_t err);
static err_t lw_poll(void *arg, struct tcp_pcb *pcb);
static void lw_err(void *arg, err_t err);

/* One step of a user's net_close. Returns ERR_ABRT when it aborted the pcb (so an lwIP
 * callback calling it must return ERR_ABRT), else ERR_OK; the conn may be freed. */
static err_t close_step(lw_conn *c) {
    struct tcp_pcb *pcb = c->pcb;
    if (c->fin) {
        /* The peer is done sending: a full close cannot meet later data. */
        pcb_detach(pcb);
        if (tcp_close(pcb) == ERR_OK) {
            c->pcb = NULL;
            conn_free(c);
            return ERR_OK;
        }
        tcp_arg(pcb, c); /* out of memory for the FIN: lw_poll retries */
        tcp_recv(pcb, lw_recv);
        tcp_err(pcb, lw_err);
        tcp_poll(pcb, lw_poll, LW_POLL_TICKS);
        return ERR_OK;
    }
    if (!c->shut_tx && tcp_shutdown(pcb, 0, 1) == ERR_OK) c->shut_tx = 1;
    return ERR_OK;
}

/* ---------------------------------------------------------------- lwIP callbacks */

static err_t lw_recv(void *arg, struct tcp_pcb *pcb, struct pbuf *p, err_t err) {
    lw_conn *c = arg;
    if (!c) { /* cannot happen: recv is cleared with arg; behave like tcp_recv_null */
        if (p) {
            tcp_recved(pcb, p->tot_len);
            pbuf_free(p);
        }
        return ERR_OK;
    }
    if (!p) {
        c->fin = 1;
        if (c->state == ST_CLOSING) return close_step(c);
        if (c->read_armed) post(c, EV_READ);
        return ERR_OK;
    }
    if (err != ERR_OK || c->state == ST_CLOSING) { /* closing: discard */
        tcp_recved(pcb, p->tot_len);
        pbuf_free(p);
        return ERR_OK;
    }
    /* ERR_MEM leaves p with lwIP as refused data, offered again later. */
    size_t n = p->tot_len;
    if (n > LW_RXBUF - c->rx_len) return ERR_MEM; /* beyond the window: cannot happen */
    size_t tail = (c->rx_head + c->rx_len) % LW_RXBUF;
    size_t first = n < LW_RXBUF - tail ? n : LW_RXBUF - tail;
    pbuf_copy_partial(p, c->rxbuf + tail, (u16_t)first, 0);
    if (n > first) pbuf_copy_partial(p, c->rxbuf, (u16_t)(n - first), (u16_t)first);
    c->rx_len += n;
    pbuf_free(p);
    if (c->read_armed) post(c, EV_READ);
    return ERR_OK;
}

static err_t lw_sent(void *arg, struct tcp_pcb *pcb, u16_t len) {
    (void)len;
    lw_conn *c = arg;
    if (!c) return ERR_OK;
    if (c->s->mem_blocked) {
        c->s->mem_wake = 1;
        schedule(c->s);
    }
    if (c->state != ST_CLOSING && c->want_write && has_room(pcb)) post(c, EV_WRITE);
    return ERR_OK;
}

static void lw_err(void *arg, err_t err) {
    lw_conn *c = arg;
    if (!c) return;
    c->pcb = NULL; /* already freed by lwIP */
    if (c->state != ST_OPEN) { /* closing, or never shown to the user */
        conn_free(c);
        return;
    }
    c->err = lw_errno(err);
    if (!c->err) c->err = -EIO;
    set_mem_blocked(c, 0);
    post(c, EV_CLOSED);
}

static err_t lw_poll(void *arg, struct tcp_pcb *pcb) {
    lw_conn *c = arg;
    if (!c) return ERR_OK;
    if (c->state == ST_CLOSING) {
        if (loop_now_ms() >= c->deadline) {
            conn_abort_free(c);
            return ERR_ABRT;
        }
        return close_step(c);
    }
    /* Fallback wakeup: memory may have been freed by pcbs that have no sent callback. */
    if (c->state == ST_OPEN && (c->want_write || c->mem_blocked) && has_room(pcb)) {
        set_mem_blocked(c, 0);
        post(c, EV_WRITE);
    }
    return ERR_OK;
}

static err_t lw_accept(void *arg, struct tcp_pcb *pcb, err_t err) {
    lw_listener *lis = arg;
    lw_stack *s = lis->s;
    /* Any error return makes lwIP abort (RST) the new pcb. */
    if (!pcb) { /* a SYN lwIP had no pcb for (ERR_MEM): it goes unanswered */
        lw_count.syn_no_pcb++;
        return ERR_VAL;
    }
    if (err != ERR_OK || !s->active) return ERR_VAL;
    lw_conn *c = s->free_slots; /* none when nconns is max_conns */
    if (s->nconns >= s->max_conns || !c) {
        lw_count.accept_refused++;
        return ERR_VAL;
    }
    s->free_slots = c->next;
    memset(c, 0, sizeof *c);
    c->rxbuf = s->rxmem + (size_t)(c - s->slots) * LW_RXBUF;
    c->base.t = &lwip_transport;
    c->s = s;
    c->pcb = pcb;
    c->lis = lis;
    c->state = ST_ACCEPTING;
    c->read_armed = 1;
    char a[IPADDR_STRLEN_MAX];
    ipaddr_ntoa_r(&pcb->remote_ip, a, sizeof a);
    snprintf(c->peer, sizeof c->peer, IP_IS_V6(&pcb->remote_ip) ? "[%s]:%u" : "%s:%u", a,
             (unsigned)pcb->remote_port);
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    tcp_arg(pcb, c);
    tcp_recv(pcb, lw_recv);
    tcp_sent(pcb, lw_sent);
    tcp_err(pcb, lw_err);
    tcp_poll(pcb, lw_poll, LW_POLL_TICKS);
    tcp_nagle_disable(pcb); /* like TCP_NODELAY on the host transport */
    post(c, EV_ACCEPT);
    return ERR_OK;
}

/* ---------------------------------------------------------------- dispatch */

static void run_event(lw_stack *s, lw_conn *c, int ev) {
    s->cb_conn = c;
    switch (ev) {
    case EV_ACCEPT: {
        const net_conn_ops *ops = NULL;
        void *ud = NULL;
        int rc = c->lis->fn(c->lis->ud, &c->base, &ops, &ud);
        if (s->cb_conn != c) return; /* closed or aborted from inside */
        if (rc < 0 || !ops) {
            conn_abort_free(c);
            return;
        }
        c->ops = ops;
        c->ud = ud;
        c->state = ST_OPEN;
        break;
    }
    case EV_READ:
        c->read_armed = 0;
        c->ops->readable(c->ud);
        break;
    case EV_WRITE:
        if (!c->want_write) break;
        c->want_write = 0;
        set_mem_blocked(c, 0);
        c->ops->writable(c->ud);
        break;
    case EV_CLOSED:
        c->ops->closed(c->ud, c->err);
        if (s->cb_conn == c) conn_free(c);
        break;
    }
    if (s->cb_conn == c) s->cb_conn = NULL;
}

static void dispatch_task(loop_t *l, void *ud) {
    (void)l;
    lw_stack *s = ud;
    s->posted = 0;
    if (!s->active) return;
    s->dispatching = 1;
    if (s->mem_wake) {
        s->mem_wake = 0;
        for (lw_conn *c = s->conns; c && s->mem_blocked; c = c->next) {
            if (!c->mem_blocked) continue;
            set_mem_blocked(c, 0);
            if (c->want_write && c->state == ST_OPEN) post(c, EV_WRITE);
        }
    }
    for (int budget = LW_DISPATCH_BUDGET; s->pend_head && budget > 0; budget--) {
        lw_conn *c = s->pend_head;
        int ev = c->events & EV_ACCEPT   ? EV_ACCEPT
                 : c->events & EV_READ  ? EV_READ
                 : c->events & EV_WRITE ? EV_WRITE
                                        : EV_CLOSED;
        c->events &= ~ev;
        if (!c->events) pend_unlink(c);
        /* An event for a state the conn has left (a read event for a closing conn)
         * has nobody to go to. */
        if (ev != EV_ACCEPT && c->state != ST_OPEN) continue;
        if (ev == EV_ACCEPT && c->state != ST_ACCEPTING) continue;
        run_event(s, c, ev);
        if (!s->active) return; /* net_free from a callback */
    }
    s->dispatching = 0;
    if (s->pend_head || s->mem_wake) schedule(s);
}

/* After lwIP ran (frames in, timers): lwIP's out-of-order queues give back pool pbufs
 * when asked, and a dispatch the full task ring refused is retried. */
static void after_lwip(lw_stack *s) {
    lw_tw_reap();
    PBUF_CHECK_FREE_OOSEQ();
    if (s->pend_head || s->mem_wake) schedule(s);
}

/* ---------------------------------------------------------------- device and timers */

int netif_input_frame(netif_dev *d, struct netif *nif, const void *frame, size_t len) {
    /* A pbuf chain holds at most 64 KiB - 1; the peer never sends a GSO frame that large
     * into our (unscaled) window. */
    if (len > 0xffff) {
        d->rx_drops++;
        return -EMSGSIZE;
    }
    struct pbuf *p = pbuf_alloc(PBUF_RAW, (u16_t)len, PBUF_POOL);
    if (!p) { /* pool empty: like a frame lost on the wire */
        d->rx_drops++;
        d->rx_no_pbuf++;
        return -ENOMEM;
    }
    pbuf_take(p, frame, (u16_t)len);
    if (nif->input(p, nif) != ERR_OK) {
        pbuf_free(p);
        d->rx_drops++;
        return -EIO;
    }
    d->rx_frames++;
    return 0;
}

static void dev_ev(loop_t *l, int fd, void *ud, int mask) {
    (void)l;
    (void)fd;
    (void)mask;
    lw_stack *s = ud;
    s->dev.rx(&s->dev, &s->nif, NETIF_RX_BATCH);
    after_lwip(s);
}

static int64_t lw_timer(loop_t *l, int64_t id, void *ud) {
    (void)l;
    (void)id;
    lw_stack *s = ud;
    sys_check_timeouts();
    after_lwip(s);
    lw_widen();
    u32_t t = sys_timeouts_sleeptime();
    return t > LW_TIMER_MAX_MS ? LW_TIMER_MAX_MS : (int64_t)t;
}

static err_t nif_linkoutput(struct netif *nif, struct pbuf *p) {
    lw_stack *s = nif->state;
    /* A frame the device cannot take now is dropped like one lost on the wire (the
     * device counted it): TCP retransmits, ARP and ND retry. */
    s->dev.tx(&s->dev, p);
    return ERR_OK;
}

static err_t nif_init(struct netif *nif) {
    lw_stack *s = nif->state;
    nif->name[0] = 'k';
    nif->name[1] = 'n';
    nif->output = etharp_output;
    nif->output_ip6 = ethip6_output;
    nif->linkoutput = nif_linkoutput;
    nif->mtu = (u16_t)(s->dev.mtu > 0 && s->dev.mtu < 65535 ? s->dev.mtu : 1500);
    nif->hwaddr_len = 6;
    memcpy(nif->hwaddr, s->dev.lwip_mac, 6);
    nif->flags = NETIF_FLAG_BROADCAST | NETIF_FLAG_ETHARP | NETIF_FLAG_ETHERNET |
                 NETIF_FLAG_MLD6;
    return ERR_OK;
}

/* ---------------------------------------------------------------- probes */

static int64_t probe_timer(loop_t *l, int64_t id, void *ud);

/* Records the outcome and hands it to a 0 ms timer (lwIP's callbacks call this); when the
 * loop has no timer free the timeout timer, already armed, delivers it instead. */
static void probe_done(lw_probe *p, int result) {
    p->done = 1;
    p->result = result;
    p->end_us = loop_now_us();
    int64_t t = loop_timer_add(p->s->l, 0, probe_timer, p);
    if (t > 0) {
        loop_timer_del(p->s->l, p->timer);
        p->timer = t;
    }
}

/* Detaches and aborts the probe's pcb, if it still has one. */
static void probe_drop_pcb(lw_probe *p) {
    struct tcp_pcb *pcb = p->pcb;
    if (!pcb) return;
    p->pcb = NULL;
    tcp_arg(pcb, NULL);
    tcp_err(pcb, NULL);
    tcp_abort(pcb); /* RST for a handshake that completed or is under way */
}

static err_t probe_connected(void *arg, struct tcp_pcb *pcb, err_t err) {
    (void)pcb;
    (void)err; /* lwIP only calls it with ERR_OK */
    lw_probe *p = arg;
    if (!p) return ERR_OK;
    probe_drop_pcb(p);
    probe_done(p, 0);
    return ERR_ABRT; /* the pcb is gone */
}

static void probe_err(void *arg, err_t err) {
    lw_probe *p = arg;
    if (!p) return;
    p->pcb = NULL; /* freed by lwIP */
    /* In SYN_SENT: RST is a refusal; ERR_ABRT is lwIP giving up after TCP_SYNMAXRTX. */
    probe_done(p, err == ERR_RST ? -ECONNREFUSED : err == ERR_ABRT ? -ETIMEDOUT : lw_errno(err));
}

static int64_t probe_timer(loop_t *l, int64_t id, void *ud) {
    (void)l;
    (void)id;
    lw_probe *p = ud;
    p->timer = 0;
    if (!p->done) {
        /* Timed out. No ARP answer from the next hop by now: nobody is there. */
        struct eth_addr *eth;
        const ip4_addr_t *ip;
        probe_drop_pcb(p);
        p->result = etharp_find_addr(&p->s->nif, &p->hop, &eth, &ip) >= 0 ? -ETIMEDOUT
                                                                          : -EHOSTUNREACH;
        p->end_us = loop_now_us();
    }
    net_probe_fn fn = p->fn;
    void *fud = p->ud;
    int result = p->result;
    double ms = (double)(p->end_us - p->start_us) / 1000.0;
    p->id = 0; /* free before fn: it may start another or net_free */
    fn(fud, result, ms);
    return LOOP_NOMORE;
}

static void lwip_probe_cancel(net_stack *bs, int id) {
    lw_stack *s = (lw_stack *)bs;
    for (int i = 0; i < NET_PROBES_MAX; i++) {
        lw_probe *p = &s->probes[i];
        if (p->id != id) continue;
        probe_drop_pcb(p);
        if (p->timer > 0) loop_timer_del(s->l, p->timer);
        p->timer = 0;
        p->id = 0;
    }
}

static int lwip_probe(net_stack *bs, uint32_t addr, int port, int timeout_ms, net_probe_fn fn,
                      void *ud) {
    lw_stack *s = (lw_stack *)bs;
    lw_probe *p = NULL;
    for (int i = 0; i < NET_PROBES_MAX && !p; i++)
        if (!s->probes[i].id) p = &s->probes[i];
    if (!p) return -EBUSY;
    *p = (lw_probe){.s = s, .fn = fn, .ud = ud, .start_us = loop_now_us()};
    ip4_addr_t dst;
    ip4_addr_set_u32(&dst, addr);
    const struct netif *nif = &s->nif;
    if (ip4_addr_isbroadcast(&dst, nif)) return -EINVAL; /* the subnet's broadcast */
    int64_t delay = timeout_ms;
    if (!netif_is_up(nif) || ip4_addr_isany(netif_ip4_addr(nif))) {
        p->done = 1, p->result = -ENETUNREACH; /* no address yet (DHCP) */
    } else if (ip4_addr_net_eq(&dst, netif_ip4_addr(nif), netif_ip4_netmask(nif))) {
        p->hop = dst;
    } else if (!ip4_addr_isany(netif_ip4_gw(nif))) {
        p->hop = *netif_ip4_gw(nif);
    } else {
        p->done = 1, p->result = -ENETUNREACH; /* off the subnet, no gateway */
    }
    if (!p->done) {
        struct tcp_pcb *pcb = tcp_new_ip_type(IPADDR_TYPE_V4);
        if (!pcb) return -ENOMEM;
        tcp_arg(pcb, p);
        tcp_err(pcb, probe_err);
        ip_addr_t a = IPADDR4_INIT(addr);
        err_t e = tcp_connect(pcb, &a, (u16_t)port, probe_connected);
        if (e == ERR_RTE) {
            p->done = 1, p->result = -ENETUNREACH;
        } else if (e != ERR_OK) {
            tcp_arg(pcb, NULL);
            tcp_err(pcb, NULL);
            tcp_abort(pcb);
            return lw_errno(e);
        }
        if (p->done) {
            tcp_arg(pcb, NULL);
            tcp_err(pcb, NULL);
            tcp_abort(pcb);
        } else {
            p->pcb = pcb;
        }
    }
    if (p->done) {
        p->end_us = loop_now_us();
        delay = 0; /* known now, told from the loop */
    }
    int64_t t = loop_timer_add(s->l, delay, probe_timer, p);
    if (t < 0) {
        probe_drop_pcb(p);
        return (int)t;
    }
    p->timer = t;
    p->id = net_probe_next_id(&s->probe_seq);
    return p->id;
}

/* ---------------------------------------------------------------- lookups */

static uintptr_t lookup_tokens; /* outlives the stack object: tokens are never reused */

static int64_t lookup_timer(loop_t *l, int64_t id, void *ud) {
    (void)l, (void)id;
    lw_lookup *k = ud;
    k->timer = 0;
    if (!k->done) k->done = 1, k->result = -ETIMEDOUT, k->end_us = loop_now_us();
    net_resolve_fn fn = k->fn;
    void *fud = k->ud;
    int result = k->result;
    char ipv4[16];
    memcpy(ipv4, k->ipv4, sizeof ipv4);
    double ms = (double)(k->end_us - k->start_us) / 1000.0;
    k->id = 0, k->token = 0; /* told: free; a late answer finds no slot */
    fn(fud, result, result == 0 ? ipv4 : NULL, ms);
    return LOOP_NOMORE;
}

/* Records the outcome and moves the timer to 0 ms (inside lwIP: no user code here). */
static void lookup_settle(lw_lookup *k, const ip_addr_t *a) {
    if (k->done || !k->id) return;
    k->done = 1, k->end_us = loop_now_us();
    if (a && IP_IS_V4(a)) {
        ip4addr_ntoa_r(ip_2_ip4(a), k->ipv4, sizeof k->ipv4);
        k->result = 0;
    } else {
        k->result = -ENOENT; /* lwIP says NULL for NXDOMAIN, a server error and no answer alike */
    }
    if (k->timer > 0) loop_timer_del(k->s->l, k->timer);
    k->timer = loop_timer_add(k->s->l, 0, lookup_timer, k);
    if (k->timer < 0) k->timer = 0, k->id = 0; /* no room to tell: dropped, never twice */
}

static void lookup_found(const char *name, const ip_addr_t *a, void *arg) {
    (void)name;
    lw_stack *s = &the_stack;
    uintptr_t token = (uintptr_t)arg;
    for (int i = 0; i < NET_RESOLVES_MAX && s->active; i++) {
        lw_lookup *k = &s->lookups[i];
        if (k->token != token) continue;
        k->token = 0;
        lookup_settle(k, a);
    }
}

static int lwip_resolve(net_stack *bs, const char *name, int timeout_ms, net_resolve_fn fn, void *ud) {
    lw_stack *s = (lw_stack *)bs;
    lw_lookup *k = NULL;
    for (int i = 0; i < NET_RESOLVES_MAX && !k; i++)
        if (!s->lookups[i].id) k = &s->lookups[i];
    if (!k) return -EBUSY;
    *k = (lw_lookup){.s = s, .fn = fn, .ud = ud, .start_us = loop_now_us()};
    uintptr_t token = ++lookup_tokens ? lookup_tokens : ++lookup_tokens;
    ip_addr_t a;
    int64_t delay = timeout_ms;
    err_t e = dns_gethostbyname_addrtype(name, &a, lookup_found, (void *)token, LWIP_DNS_ADDRTYPE_IPV4);
    if (e == ERR_OK) { /* a literal, or in lwIP's cache */
        ip4addr_ntoa_r(ip_2_ip4(&a), k->ipv4, sizeof k->ipv4);
        k->done = 1, k->result = 0;
    } else if (e == ERR_INPROGRESS) {
        k->token = token;
    } else if (e == ERR_VAL) {
        k->done = 1, k->result = -ENETUNREACH; /* no DNS server: none set, none from DHCP */
    } else {
        return e == ERR_MEM ? -EBUSY : -EINVAL; /* lwIP's table full; a name it refused */
    }
    if (k->done) k->end_us = loop_now_us(), delay = 0;
    int64_t t = loop_timer_add(s->l, delay, lookup_timer, k);
    if (t < 0) return (int)t; /* the slot stays free: a late answer finds no id */
    k->timer = t;
    k->id = net_probe_next_id(&s->lookup_seq);
    return k->id;
}

static void lwip_resolve_cancel(net_stack *bs, int id) {
    lw_stack *s = (lw_stack *)bs;
    for (int i = 0; i < NET_RESOLVES_MAX; i++) {
        lw_lookup *k = &s->lookups[i];
        if (k->id != id) continue;
        if (k->timer > 0) loop_timer_del(s->l, k->timer);
        k->timer = 0, k->id = 0, k->token = 0; /* lwIP's late answer finds no slot */
    }
}

/* ---------------------------------------------------------------- config parsing */

static int parse_mac(const char *str, unsigned char mac[6]) {
    unsigned v[6];
    char tail;
    if (sscanf(str, "%2x:%2x:%2x:%2x:%2x:%2x%c", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
               &tail) != 6 ||
        strlen(str) != 17)
        return -EINVAL;
    for (int i = 0; i < 6; i++) mac[i] = (unsigned char)v[i];
    if (mac[0] & 1) return -EINVAL; /* multicast: no unicast address */
    return 0;
}

static int parse_ip4(const char *str, ip4_addr_t *a) {
    struct in_addr in;
    if (inet_pton(AF_INET, str, &in) != 1) return -EINVAL;
    ip4_addr_set_u32(a, in.s_addr);
    return 0;
}

/* "" or "a.b.c.d[,a.b.c.d]" -> up to DNS_MAX_SERVERS addresses; their count or -EINVAL. */
static int parse_dns(const char *str, ip4_addr_t *out) {
    char buf[64];
    int n = 0;
    if (!str[0]) return 0;
    if (strlen(str) >= sizeof buf) return -EINVAL;
    snprintf(buf, sizeof buf, "%s", str);
    for (char *p = buf, *next; p; p = next) {
        if ((next = strchr(p, ','))) *next++ = 0;
        if (n == DNS_MAX_SERVERS || parse_ip4(p, &out[n]) < 0) return -EINVAL;
        n++;
    }
    return n;
}

/* "a.b.c.d/len" -> address and netmask. */
static int parse_cidr(const char *str, ip4_addr_t *a, ip4_addr_t *mask) {
    char buf[32];
    const char *slash = strchr(str, '/');
    if (!slash || (size_t)(slash - str) >= sizeof buf) return -EINVAL;
    memcpy(buf, str, (size_t)(slash - str));
    buf[slash - str] = '\0';
    if (parse_ip4(buf, a) < 0) return -EINVAL;
    char *end;
    long len = strtol(slash + 1, &end, 10);
    if (end == slash + 1 || *end || len < 1 || len > 32) return -EINVAL;
    uint32_t m = len == 32 ? 0xffffffffu : ~(0xffffffffu >> len);
    ip4_addr_set_u32(mask, htonl(m));
    return 0;
}

/* ---------------------------------------------------------------- transport */

static void lwip_free(net_stack *bs) {
    lw_stack *s = (lw_stack *)bs;
    for (int i = 0; i < NET_PROBES_MAX; i++)
        if (s->probes[i].id) lwip_probe_cancel(bs, s->probes[i].id);
    for (int i = 0; i < NET_RESOLVES_MAX; i++)
        if (s->lookups[i].id) lwip_resolve_cancel(bs, s->lookups[i].id);
    while (s->conns) conn_abort_free(s->conns);
    for (int i = 0; i < s->nls; i++) {
        tcp_arg(s->ls[i].pcb, NULL);
        tcp_accept(s->ls[i].pcb, NULL);
        tcp_close(s->ls[i].pcb); /* a listen pcb closes at once */
    }
    s->nls = 0;
    if (s->nif_added) {
        if (s->dhcp) {
            dhcp_stop(&s->nif);
            dhcp_cleanup(&s->nif);
        }
        netif_set_down(&s->nif);
        netif_remove(&s->nif);
    }
    if (s->timer > 0) loop_timer_del(s->l, s->timer);
    if (s->dev_watched) loop_fd_del(s->l, s->dev.fd, LOOP_READ);
    if (s->dev_open) s->dev.close(&s->dev);
    s->active = 0;
    free(s->slots), free(s->rxmem);
    s->slots = s->free_slots = NULL, s->rxmem = NULL;
}

static int lwip_listen(net_stack *bs, const char *host, int port, net_accept_fn fn,
                       void *ud, char *err, size_t errlen) {
    lw_stack *s = (lw_stack *)bs;
    (void)host; /* one interface: always every address of it (it may change by DHCP) */
    if (s->nls == LW_MAX_LISTEN) {
        snprintf(err, errlen, "net: listen :%d: at most %d listeners", port, LW_MAX_LISTEN);
        return -ENOSPC;
    }
    struct tcp_pcb *pcb = tcp_new_ip_type(IPADDR_TYPE_ANY);
    if (!pcb) {
        snprintf(err, errlen, "net: listen :%d: lwIP out of pcbs", port);
        return -ENOMEM;
    }
    ip_set_option(pcb, SOF_REUSEADDR);
    err_t e = tcp_bind(pcb, IP_ANY_TYPE, (u16_t)port);
    if (e != ERR_OK) {
        tcp_close(pcb);
        snprintf(err, errlen, "net: listen :%d: bind: %s", port, strerror(-lw_errno(e)));
        return lw_errno(e);
    }
    struct tcp_pcb *lpcb = tcp_listen_with_backlog_and_err(pcb, TCP_DEFAULT_LISTEN_BACKLOG, &e);
    if (!lpcb) {
        tcp_close(pcb);
        snprintf(err, errlen, "net: listen :%d: %s", port, strerror(-lw_errno(e)));
        return lw_errno(e);
    }
    lw_listener *lis = &s->ls[s->nls++];
    *lis = (lw_listener){.s = s, .pcb = lpcb, .fn = fn, .ud = ud};
    tcp_arg(lpcb, lis);
    tcp_accept(lpcb, lw_accept);
    return 0;
}

static ssize_t lwip_read(net_conn *bc, void *buf, size_t cap) {
    lw_conn *c = (lw_conn *)bc;
    if (cap == 0) return -EINVAL;
    if (c->rx_len) {
        size_t n = c->rx_len < cap ? c->rx_len : cap;
        size_t first = n < LW_RXBUF - c->rx_head ? n : LW_RXBUF - c->rx_head;
        memcpy(buf, c->rxbuf + c->rx_head, first);
        memcpy((char *)buf + first, c->rxbuf, n - first);
        c->rx_head = (c->rx_head + n) % LW_RXBUF;
        c->rx_len -= n;
        if (c->pcb) tcp_recved(c->pcb, (u16_t)n); /* reopens the window only as we read */
        return (ssize_t)n;
    }
    if (c->err) return c->err;
    if (c->fin) return 0;
    if (!c->pcb) return -ENOTCONN;
    c->read_armed = 1;
    return -EAGAIN;
}

static ssize_t lwip_write(net_conn *bc, const void *buf, size_t len) {
    lw_conn *c = (lw_conn *)bc;
    if (c->err) return c->err;
    if (!c->pcb || c->state == ST_CLOSING) return -ENOTCONN;
    struct tcp_pcb *pcb = c->pcb;
    size_t room = tcp_sndqueuelen(pcb) >= TCP_SND_QUEUELEN ? 0 : tcp_sndbuf(pcb);
    size_t n = len < room ? len : room;
    if (n > 0xffff) n = 0xffff;
    err_t e = ERR_MEM;
    if (n) {
        e = tcp_write(pcb, buf, (u16_t)n, TCP_WRITE_FLAG_COPY);
        /* Short of segments or heap for all of it: a single segment may still fit. */
        if (e == ERR_MEM && n > TCP_MSS) {
            n = TCP_MSS;
            e = tcp_write(pcb, buf, (u16_t)n, TCP_WRITE_FLAG_COPY);
        }
    }
    if (e == ERR_OK) {
        tcp_output(pcb);
        set_mem_blocked(c, 0);
        if (n < len) c->want_write = 1;
        return (ssize_t)n;
    }
    if (e == ERR_MEM) {
        /* Window or queue full: tcp_sent fires as acks come. Heap or segment pool
         * empty: that is freed by any connection's acks, so all wakers are asked. */
        c->want_write = 1;
        if (room) set_mem_blocked(c, 1);
        tcp_output(pcb);
        return -EAGAIN;
    }
    return lw_errno(e);
}

static void lwip_close(net_conn *bc) {
    lw_conn *c = (lw_conn *)bc;
    lw_stack *s = c->s;
    if (s->cb_conn == c) s->cb_conn = NULL;
    pend_unlink(c);
    c->events = 0;
    c->ops = NULL;
    set_mem_blocked(c, 0);
    if (!c->pcb) {
        conn_free(c);
        return;
    }
    if (c->rx_len) { /* unread input is dropped, but counted as read: no RST for it */
        tcp_recved(c->pcb, (u16_t)c->rx_len);
        c->rx_len = 0;
    }
    c->state = ST_CLOSING;
    c->deadline = loop_now_ms() + NET_LINGER_MS;
    tcp_sent(c->pcb, NULL);
    close_step(c);
}

static void lwip_abort(net_conn *bc) { conn_abort_free((lw_conn *)bc); }

static int lwip_peer(const net_conn *bc, char *buf, size_t cap) {
    const lw_conn *c = (const lw_conn *)bc;
    size_t n = strlen(c->peer);
    if (n + 1 > cap) return -ENOSPC;
    memcpy(buf, c->peer, n + 1);
    return (int)n;
}

static int lwip_address(const net_stack *bs, char *buf, size_t cap) {
    const lw_stack *s = (const lw_stack *)bs;
    char a[IP4ADDR_STRLEN_MAX] = "";
    const ip4_addr_t *ip = netif_ip4_addr(&s->nif);
    if (s->nif_added && !ip4_addr_isany(ip)) ip4addr_ntoa_r(ip, a, sizeof a);
    size_t n = strlen(a);
    if (n + 1 > cap) return -ENOSPC;
    memcpy(buf, a, n + 1);
    return 0;
}

static int lwip_open_conns(const net_stack *bs) { return ((const lw_stack *)bs)->nconns; }

static int lwip_counters(const net_stack *bs, net_counters *o) {
    const lw_stack *s = (const lw_stack *)bs;
    lw_widen();
    *o = (net_counters){
        .tcp_segs_out = lw_wide.total[W_SEGS_OUT],
        .tcp_segs_in = lw_wide.total[W_SEGS_IN],
        .tcp_retransmits = lw_wide.total[W_RETRANS],
        .tcp_resets_out = lw_wide.total[W_RSTS_OUT],
        .tcp_in_errors = lw_wide.total[W_IN_ERRS],
        .tcp_syns = lw_count.syns,
        .tcp_syn_backlog = lw_count.syn_backlog,
        .tcp_syn_no_pcb = lw_count.syn_no_pcb,
        .tcp_syn_time_wait = lw_count.syn_time_wait,
        .tcp_syn_dup = lw_count.syn_dup,
        .tcp_accept_refused = lw_count.accept_refused,
        .link_rx_frames = s->dev.rx_frames,
        .link_tx_frames = s->dev.tx_frames,
        .link_rx_no_pbuf = s->dev.rx_no_pbuf,
        .link_rx_bad = s->dev.rx_drops - s->dev.rx_no_pbuf,
        .link_tx_drops = s->dev.tx_drops,
        .mem_errors = lw_wide.total[W_MEM_ERRS],
    };
    return 0;
}

static const net_transport lwip_transport = {
    .name = "lwip",
    .free = lwip_free,
    .listen = lwip_listen,
    .read = lwip_read,
    .write = lwip_write,
    .close = lwip_close,
    .abort = lwip_abort,
    .peer = lwip_peer,
    .address = lwip_address,
    .open_conns = lwip_open_conns,
    .stats = lwip_counters,
    .probe = lwip_probe,
    .probe_cancel = lwip_probe_cancel,
    .resolve = lwip_resolve,
    .resolve_cancel = lwip_resolve_cancel,
};

net_stack *net_lwip_new(loop_t *l, const net_config *cfg, char *err, size_t errlen) {
    lw_stack *s = &the_stack;
    if (s->active) {
        snprintf(err, errlen, "net: lwIP is already running (one stack per process)");
        return NULL;
    }
    const char *drv = cfg->driver == CFG_DRIVER_TAP ? "tap" : "packet";
    const char *ifname = cfg->ifname ? cfg->ifname : "";
    const char *address = cfg->address ? cfg->address : "";
    ip4_addr_t ip, mask, gw;
    ip4_addr_set_zero(&ip);
    ip4_addr_set_zero(&mask);
    ip4_addr_set_zero(&gw);
    int dhcp = strcmp(address, "dhcp") == 0;
    if (!dhcp && parse_cidr(address, &ip, &mask) < 0) {
        snprintf(err, errlen, "net: address '%s': want \"dhcp\" or a.b.c.d/len", address);
        return NULL;
    }
    if (cfg->gateway && cfg->gateway[0] && parse_ip4(cfg->gateway, &gw) < 0) {
        snprintf(err, errlen, "net: gateway '%s': want a.b.c.d", cfg->gateway);
        return NULL;
    }
    ip4_addr_t dns[DNS_MAX_SERVERS];
    int n_dns = parse_dns(cfg->dns ? cfg->dns : "", dns);
    if (n_dns < 0) {
        snprintf(err, errlen, "net: dns '%s': want a.b.c.d[,a.b.c.d]", cfg->dns);
        return NULL;
    }
    unsigned char mac[6];
    int have_mac = cfg->mac && cfg->mac[0];
    if (have_mac && parse_mac(cfg->mac, mac) < 0) {
        snprintf(err, errlen, "net: mac '%s': want a unicast aa:bb:cc:dd:ee:ff", cfg->mac);
        return NULL;
    }
    if (!ifname[0]) {
        snprintf(err, errlen, "net: %s: no interface name", drv);
        return NULL;
    }

    memset(s, 0, sizeof *s);
    s->base.t = &lwip_transport;
    s->base.driver_name = drv;
    s->l = l;
    s->max_conns = cfg->max_conns > 0 ? cfg->max_conns : MEMP_NUM_TCP_PCB;
    s->slots = calloc((size_t)s->max_conns, sizeof *s->slots);
    s->rxmem = calloc((size_t)s->max_conns, LW_RXBUF);
    if (!s->slots || !s->rxmem) {
        snprintf(err, errlen, "net: out of memory for %d connections", s->max_conns);
        free(s->slots), free(s->rxmem);
        s->slots = NULL, s->rxmem = NULL;
        return NULL;
    }
    for (int i = s->max_conns - 1; i >= 0; i--) s->slots[i].next = s->free_slots, s->free_slots = &s->slots[i];
    s->dhcp = dhcp;
    snprintf(s->hostname, sizeof s->hostname, "%s",
             cfg->hostname && cfg->hostname[0] ? cfg->hostname : "kiln");

    char warn[256] = "";
    int rc;
    if (cfg->driver == CFG_DRIVER_TAP) {
        rc = netif_tap_open(&s->dev, ifname, err, errlen);
        if (rc == 0) {
            if (have_mac) {
                memcpy(s->dev.lwip_mac, mac, 6);
            } else {
                /* Random, locally administered, unicast: the TAP's own MAC is the
                 * kernel's end of the wire, not ours. */
                for (int i = 0; i < 6; i++) s->dev.lwip_mac[i] = (unsigned char)kiln_lwip_rand();
                s->dev.lwip_mac[0] = (unsigned char)((s->dev.lwip_mac[0] & 0xfe) | 0x02);
            }
        }
    } else {
        rc = netif_packet_open(&s->dev, ifname, have_mac ? mac : NULL, err, errlen, warn,
                               sizeof warn);
    }
    if (rc < 0) { lwip_free(&s->base); return NULL; } /* the conn slots */
    s->dev_open = 1;
    s->active = 1;

    if (!lwip_ready) {
        lwip_init();
        lwip_ready = 1;
    }
    if (!netif_add(&s->nif, &ip, &mask, &gw, s, nif_init, ethernet_input)) {
        snprintf(err, errlen, "net: %s %s: lwIP refused the interface", drv, ifname);
        lwip_free(&s->base);
        return NULL;
    }
    s->nif_added = 1;
    netif_set_hostname(&s->nif, s->hostname);
    netif_set_default(&s->nif);
    netif_create_ip6_linklocal_address(&s->nif, 1);
    netif_set_ip6_autoconfig_enabled(&s->nif, 1);
    for (int i = 0; i < DNS_MAX_SERVERS; i++) { /* DHCP may set its own later */
        ip_addr_t d = IPADDR4_INIT(i < n_dns ? ip4_addr_get_u32(&dns[i]) : 0);
        dns_setserver((u8_t)i, i < n_dns ? &d : NULL);
    }
    netif_set_up(&s->nif);
    netif_set_link_up(&s->nif);
    if (dhcp && dhcp_start(&s->nif) != ERR_OK) {
        snprintf(err, errlen, "net: %s %s: DHCP could not start", drv, ifname);
        lwip_free(&s->base);
        return NULL;
    }

    if ((rc = loop_fd_add(l, s->dev.fd, LOOP_READ, dev_ev, s)) < 0) {
        snprintf(err, errlen, "net: %s %s: loop: %s", drv, ifname, strerror(-rc));
        lwip_free(&s->base);
        return NULL;
    }
    s->dev_watched = 1;
    int64_t id = loop_timer_add(l, 0, lw_timer, s);
    if (id < 0) {
        snprintf(err, errlen, "net: %s %s: loop timer: %s", drv, ifname, strerror((int)-id));
        lwip_free(&s->base);
        return NULL;
    }
    s->timer = id;
    if (errlen) snprintf(err, errlen, "%s", warn); /* a warning for the caller to log */
    return &s->base;
}
