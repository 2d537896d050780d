/* net: byte-stream connections over two transports behind one interface.
 *
 *   host    the machine's kernel TCP through non-blocking sockets: a workstation, no
 *           root (net.driver = host).
 *   tap     lwIP 2.2.1 (raw API, NO_SYS=1) over a TAP device (/dev/net/tun).
 *   packet  lwIP over an AF_PACKET socket bound to an existing interface (the
 *           appliance's NIC), with PACKET_VNET_HDR: partial checksums are completed in
 *           software, GSO-sized frames are accepted, GRO is turned off on the interface.
 *
 * Everything runs on the cooperative loop (sched/loop.h) and nothing blocks. The
 * transport holds no application buffers: net_write takes what the send window
 * (kernel socket buffer, or lwIP's tcp_sndbuf) has room for and the caller keeps the
 * rest; net_read hands out what arrived, and lwIP's receive window only reopens as the
 * caller reads, so a reader that stops reading stops its sender (backpressure both
 * ways).
 *
 * Callbacks never run from inside a net_* call: events are delivered from the loop, so
 * a callback may read, write, close or abort any connection, its own included. After
 * net_close or net_abort a connection gets no more callbacks and the pointer is dead
 * to the caller. */
#ifndef KILN_NET_H
#define KILN_NET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "sched/loop.h"

typedef struct net_stack net_stack;
typedef struct net_conn net_conn;

typedef struct {
    /* Bytes, EOF or an error can be read: call net_read until it returns -EAGAIN. */
    void (*readable)(void *ud);
    /* Send space opened after a net_write that took less than it was given. */
    void (*writable)(void *ud);
    /* The connection failed (reset, timeout, transport error: err < 0, a negative errno).
     * The conn is freed after this returns; do not call net_* on it again. */
    void (*closed)(void *ud, int err);
} net_conn_ops;

/* A new connection on a listener: return 0 with *ops and *ud set to take it, or a
 * negative errno to refuse it (the transport resets it). */
typedef int (*net_accept_fn)(void *lud, net_conn *c, const net_conn_ops **ops, void **ud);

typedef struct {
    int driver;            /* CFG_DRIVER_HOST / _TAP / _PACKET (core/config.h) */
    const char *ifname;    /* tap: device to create or attach to; packet: the interface */
    const char *address;   /* lwIP IPv4: "dhcp" or "a.b.c.d/len" */
    const char *gateway;   /* lwIP IPv4 default gateway, "" for none */
    const char *mac;       /* "aa:bb:cc:dd:ee:ff", or "" (tap: random locally
                            * administered; packet: the interface's own) */
    const char *hostname;  /* sent with DHCP */
    const char *dns;       /* lwIP: DNS servers, "a.b.c.d[,a.b.c.d]", or "" (DHCP's, if any) */
    int max_conns;         /* connections open at once over all listeners */
} net_config;

/* Bring up the transport (for lwIP: open the device, start the stack, configure the
 * address; IPv6 link-local always). NULL with err set. */
net_stack *net_new(loop_t *l, const net_config *cfg, char *err, size_t errlen);
/* Aborts every open connection and probe (no callbacks) and releases the device. */
void net_free(net_stack *s);

/* Listen on host:port ("0.0.0.0" for all addresses; lwIP ignores host other than its
 * own address). 0 or a negative errno with err set. */
int net_listen(net_stack *s, const char *host, int port, net_accept_fn fn, void *ud,
               char *err, size_t errlen);

/* > 0 bytes read, 0 end of stream (the peer sent FIN), -EAGAIN nothing yet, or another
 * negative errno (the connection is broken; close or abort it). */
ssize_t net_read(net_conn *c, void *buf, size_t cap);
/* Bytes taken (1..len), -EAGAIN when no space (writable fires later), or another
 * negative errno. len 0 returns 0. */
ssize_t net_write(net_conn *c, const void *buf, size_t len);
/* Graceful: what was written is still delivered, then FIN; the conn is freed by the
 * transport when done (or after a bounded linger). */
void net_close(net_conn *c);
/* At once: RST, queued data dropped. */
void net_abort(net_conn *c);
/* "a.b.c.d:port" of the peer; the length written, or a negative errno. */
int net_peer(const net_conn *c, char *buf, size_t cap);

/* Outgoing TCP connect probes: "is that host reachable from the box, and does it listen
 * on that port?" (the admin diagnostics; no raw ICMP). A probe opens one connection, and
 * closes it at once with RST if the handshake completes; no byte is sent. Probes are not
 * connections: neither max_conns nor net_open_conns counts them.
 *
 * result: 0 connected, or a negative errno:
 *   -ECONNREFUSED  the host answered with RST (nothing listens on the port)
 *   -ETIMEDOUT     no answer within timeout_ms (lwIP: though the next hop answered ARP)
 *   -EHOSTUNREACH  the host (or the gateway) is not there: the kernel's neighbour
 *                  resolution failed (host, after ~3 s), an ICMP host unreachable came
 *                  (host), or no ARP answer within timeout_ms (lwIP)
 *   -ENETUNREACH   no route: the address is off every subnet and there is no gateway,
 *                  or (lwIP) the interface has no address yet (DHCP)
 *   or another connect error the kernel reports (host).
 * ms: from net_probe to the outcome. */
#define NET_PROBES_MAX 4 /* probes in flight per stack */
typedef void (*net_probe_fn)(void *ud, int result, double ms);
/* Starts one probe of ipv4:port ("a.b.c.d": a name goes through net_resolve first), given
 * at most timeout_ms (1..NET_PROBE_TIMEOUT_MAX_MS). fn is called exactly once, from the
 * loop, never from inside net_probe. Returns a probe id > 0, or a negative errno and fn
 * is never called: -EINVAL (not a unicast IPv4 address: 0.0.0.0, multicast, broadcast,
 * lwIP's subnet broadcast; port outside 1..65535; timeout out of range; no fn), -EBUSY
 * (NET_PROBES_MAX in flight), or a shortage: no socket or pcb (-EMFILE, -ENFILE,
 * -ENOMEM), no room on the loop (-ERANGE for the fd, -ENOSPC for the timer). */
#define NET_PROBE_TIMEOUT_MAX_MS 600000
int net_probe(net_stack *s, const char *ipv4, int port, int timeout_ms, net_probe_fn fn,
              void *ud);
/* Forgets a probe in flight: its fn is not called (for a caller that goes away first).
 * An id that is done, cancelled or unknown is ignored. net_free cancels every probe. */
void net_probe_cancel(net_stack *s, int id);

/* Name lookups for the same diagnostics: the IPv4 address of a host name. The host
 * transport asks the system's resolver (getaddrinfo, /etc/hosts and resolv.conf) on a
 * thread of its own, so the loop never waits on it; lwIP asks the DNS servers DHCP gave
 * or net_config.dns names, over UDP. An IPv4 literal is its own answer.
 *
 * result: 0 with ipv4 set ("a.b.c.d"), or a negative errno:
 *   -ENOENT        the name does not exist (NXDOMAIN), or has no IPv4 address
 *   -ETIMEDOUT     no answer within timeout_ms
 *   -ENETUNREACH   no DNS server to ask (lwIP: none configured, none from DHCP)
 *   -EAGAIN        the resolver failed for now (SERVFAIL, an unreachable server)
 * ms: from net_resolve to the outcome. */
#define NET_RESOLVES_MAX 4   /* lookups in flight per stack */
#define NET_NAME_MAX 253     /* a DNS name's longest text form */
typedef void (*net_resolve_fn)(void *ud, int result, const char *ipv4, double ms);
/* Starts one lookup of `name` (1..NET_NAME_MAX of letters, digits, '-', '.', '_'), given at
 * most timeout_ms (1..NET_PROBE_TIMEOUT_MAX_MS). fn is called exactly once, from the
 * loop, never from inside net_resolve. Returns an id > 0, or a negative errno and fn is
 * never called: -EINVAL (a malformed name or timeout, no fn), -EBUSY (NET_RESOLVES_MAX in
 * flight), -ENOMEM or another shortage. */
int net_resolve(net_stack *s, const char *name, int timeout_ms, net_resolve_fn fn, void *ud);
/* Forgets a lookup in flight: its fn is not called. Unknown or done ids are ignored;
 * net_free cancels every lookup. */
void net_resolve_cancel(net_stack *s, int id);

/* The IPv4 address in use ("a.b.c.d", "" while DHCP has none); 0 or -ENOSPC. */
int net_address(const net_stack *s, char *buf, size_t cap);
int net_open_conns(const net_stack *s);
const char *net_driver_name(const net_stack *s);

/* What the transport counted since it started (monotonic, for /metrics). lwIP fills it
 * from its own statistics plus what kiln counts around it; the host transport has none
 * (the kernel's are in /proc/net/snmp). */
typedef struct {
    uint64_t tcp_segs_out;        /* segments sent: data, pure ACKs, RSTs, retransmits */
    uint64_t tcp_segs_in;         /* segments received (before any check) */
    uint64_t tcp_retransmits;     /* segments sent again: timeout or fast retransmit */
    uint64_t tcp_resets_out;      /* RSTs sent */
    uint64_t tcp_in_errors;       /* segments dropped: checksum, length, refused data */
    uint64_t tcp_syns;            /* SYNs that reached a listener */
    uint64_t tcp_syn_backlog;     /* ... left unanswered: the listen backlog was full */
    uint64_t tcp_syn_no_pcb;      /* ... left unanswered: no pcb free */
    uint64_t tcp_syn_time_wait;   /* SYNs that met a TIME_WAIT pcb of the same 4-tuple
                                   * (answered by ACK or RST, not by SYN-ACK) */
    uint64_t tcp_syn_dup;         /* SYNs again for a handshake in progress (the peer
                                   * retransmitted: our SYN-ACK or its SYN was late) */
    uint64_t tcp_accept_refused;  /* handshakes done but reset: the connection limit */
    uint64_t link_rx_frames;      /* frames handed to lwIP */
    uint64_t link_tx_frames;      /* frames written to the device */
    uint64_t link_rx_no_pbuf;     /* frames dropped: lwIP's pbuf pool was empty */
    uint64_t link_rx_bad;         /* frames dropped: too short or long, refused by lwIP */
    uint64_t link_tx_drops;       /* frames the device would not take */
    uint64_t mem_errors;          /* lwIP heap and pool allocations that failed */
} net_counters;

/* 0 with *out filled, or -ENOTSUP (the host transport). */
int net_stats(const net_stack *s, net_counters *out);

#endif
