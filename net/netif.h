/* netif.h: private to net/ (not for the rest of kiln).
 *
 * Two small interfaces:
 *   1. the transport table net.c dispatches the public net_* calls through (net_host.c
 *      and net_lwip.c each provide one), with the common first member of their stack
 *      and connection objects;
 *   2. the frame device net_lwip.c drives lwIP with (netif_tap.c, netif_packet.c): an fd
 *      that becomes readable on the loop, a receive pass that hands whole Ethernet
 *      frames to lwIP, and a transmit function for lwIP's linkoutput.
 * Nothing here logs; errors come back as a negative errno plus a message in err. */
#ifndef KILN_NET_NETIF_H
#define KILN_NET_NETIF_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "net/net.h"

struct netif;
struct pbuf;

/* ---------------------------------------------------------------- transports */

typedef struct net_transport {
    const char *name;
    void (*free)(net_stack *s);
    int (*listen)(net_stack *s, const char *host, int port, net_accept_fn fn, void *ud,
                  char *err, size_t errlen);
    ssize_t (*read)(net_conn *c, void *buf, size_t cap);
    ssize_t (*write)(net_conn *c, const void *buf, size_t len);
    void (*close)(net_conn *c);
    void (*abort)(net_conn *c);
    int (*peer)(const net_conn *c, char *buf, size_t cap);
    int (*address)(const net_stack *s, char *buf, size_t cap);
    int (*open_conns)(const net_stack *s);
    int (*stats)(const net_stack *s, net_counters *out); /* NULL: none */
    /* net_probe with its arguments checked: addr is the IPv4 address in network order
     * (NULL: -ENOTSUP) */
    int (*probe)(net_stack *s, uint32_t addr, int port, int timeout_ms, net_probe_fn fn,
                 void *ud);
    void (*probe_cancel)(net_stack *s, int id);
    /* net_resolve with its arguments checked (NULL: -ENOTSUP) */
    int (*resolve)(net_stack *s, const char *name, int timeout_ms, net_resolve_fn fn, void *ud);
    void (*resolve_cancel)(net_stack *s, int id);
} net_transport;

/* The first member of every transport's stack and connection object. */
struct net_stack {
    const net_transport *t;
    const char *driver_name;
};
struct net_conn {
    const net_transport *t;
};

net_stack *net_host_new(loop_t *l, const net_config *cfg, char *err, size_t errlen);
net_stack *net_lwip_new(loop_t *l, const net_config *cfg, char *err, size_t errlen);

/* Both transports' probe ids: > 0, counting up, never 0 or negative after a wrap. */
static inline int net_probe_next_id(int *seq) {
    *seq = *seq >= 0x7fffffff || *seq < 0 ? 1 : *seq + 1;
    return *seq;
}

/* Both transports: how long a closed connection may take to deliver what was written
 * and see the peer's FIN before it is reset. */
#define NET_LINGER_MS 10000

/* ---------------------------------------------------------------- frame devices */

/* The largest frame a device hands up: a GSO/GRO-sized one (64 KiB of IP) plus its
 * Ethernet and VLAN headers. */
#define NETIF_FRAME_MAX (65536 + 32)
/* Frames read per readiness callback: a busy NIC must not starve the loop. */
#define NETIF_RX_BATCH 64

typedef struct netif_dev netif_dev;
struct netif_dev {
    int fd;                /* non-blocking; LOOP_READ means frames are waiting */
    unsigned char mac[6];  /* the interface's own MAC (packet); zeros for tap */
    int mtu;               /* the interface's MTU, 1500 when unknown */
    /* Reads up to max frames and passes each to nif->input as a pbuf (frames that fail
     * to allocate or that lwIP refuses are dropped and counted). Returns the frames
     * read; fewer than max means the fd is drained. */
    int (*rx)(netif_dev *d, struct netif *nif, int max);
    /* Writes one frame. 0, or a negative errno: the frame was dropped (counted). */
    int (*tx)(netif_dev *d, struct pbuf *p);
    void (*close)(netif_dev *d);
    unsigned char *buf;    /* receive buffer of NETIF_FRAME_MAX + a header */
    unsigned char *txbuf;  /* [NETIF_FRAME_MAX]: a long pbuf chain flattened to send (made at
                            * open: no malloc per frame) */
    /* The MAC lwIP uses: frames to other unicast MACs are dropped (packet). */
    unsigned char lwip_mac[6];
    uint64_t rx_frames, rx_drops, tx_frames, tx_drops, rx_csum_fixed;
    uint64_t rx_no_pbuf;   /* of rx_drops: lwIP's pbuf pool was empty */
};

/* Copies one received Ethernet frame into a pbuf chain from lwIP's pool and hands it to
 * nif->input (net_lwip.c; for the drivers' rx). 0, or a negative errno: dropped and
 * counted in d->rx_drops. */
int netif_input_frame(netif_dev *d, struct netif *nif, const void *frame, size_t len);

/* Open (or create) the TAP device ifname and bring its link up. */
int netif_tap_open(netif_dev *d, const char *ifname, char *err, size_t errlen);
/* Open an AF_PACKET socket on the existing interface ifname. mac: the MAC lwIP will use,
 * NULL for the interface's own (read into d->mac either way). A problem that does not
 * stop the device (GRO could not be turned off) is written to warn ("" if none). */
int netif_packet_open(netif_dev *d, const char *ifname, const unsigned char *mac,
                      char *err, size_t errlen, char *warn, size_t warnlen);

#endif
