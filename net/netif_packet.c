/* netif_packet: frames over an AF_PACKET socket bound to an existing interface (the
 * appliance's NIC), for lwIP.
 *
 * A packet socket sees frames as the kernel holds them, before or without the work a NIC
 * (or the kernel, for a TAP) would finish: with checksum offload a TCP/UDP checksum is
 * only partial (the peer's stack left it to "hardware"), and GRO or a TSO peer (veth,
 * virtio) hands over one frame carrying many MSS of data. PACKET_VNET_HDR puts a
 * virtio_net_hdr before each frame saying so; we complete the checksum in software and
 * pass the large frame on whole (lwIP takes a segment larger than its MSS; the window
 * bounds its size). GRO is also turned off on the interface, so merged frames are rare.
 *
 * By default lwIP uses the interface's own MAC, so the NIC's unicast filter passes its
 * frames; the kernel's stack on that interface must then have no address of its own
 * (IPv4: none configured; IPv6: disable_ipv6=1, else the kernel claims the same
 * link-local address). */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <netpacket/packet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <linux/ethtool.h>
#include <linux/if_ether.h>
#include <linux/virtio_net.h>

#include "lwip/netif.h"
#include "lwip/pbuf.h"
#include "net/netif.h"

#ifndef SIOCETHTOOL /* <linux/sockios.h> clashes with musl's <sys/ioctl.h> */
#define SIOCETHTOOL 0x8946
#endif
#ifndef PACKET_IGNORE_OUTGOING
#define PACKET_IGNORE_OUTGOING 23
#endif

#define PKT_IOV 16
#define PKT_HDR ((int)sizeof(struct virtio_net_hdr))
#define PKT_SOCKBUF (4 << 20) /* bytes: a burst of GSO frames from 64 connections */

/* One's-complement sum of n bytes at p, folded to 16 bits, in memory order: stored with
 * memcpy it is the checksum field (RFC 1071: the sum is byte-order independent). */
static uint16_t csum16(const unsigned char *p, size_t n) {
    uint64_t sum = 0;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        sum += (v & 0xffffffffu) + (v >> 32);
    }
    if (n >= 4) {
        uint32_t v;
        memcpy(&v, p, 4);
        sum += v;
        p += 4;
        n -= 4;
    }
    if (n >= 2) {
        uint16_t v;
        memcpy(&v, p, 2);
        sum += v;
        p += 2;
        n -= 2;
    }
    if (n) { /* the last odd byte is the first of a zero-padded 16-bit word */
        uint16_t v = 0;
        memcpy(&v, p, 1);
        sum += v;
    }
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    return (uint16_t)sum;
}

/* VIRTIO_NET_HDR_F_NEEDS_CSUM: the field at start+off holds the pseudo-header sum; the
 * checksum is the complement of the sum from start to the end (what skb_checksum_help
 * does, including 0 -> 0xffff). */
static int csum_complete(unsigned char *f, size_t len, size_t start, size_t off) {
    if (start + off + 2 > len || start < 14) return -EINVAL;
    uint16_t c = (uint16_t)~csum16(f + start, len - start);
    if (c == 0) c = 0xffff;
    memcpy(f + start + off, &c, 2);
    return 0;
}

static int pkt_rx(netif_dev *d, struct netif *nif, int max) {
    int n = 0;
    const size_t cap = NETIF_FRAME_MAX + PKT_HDR;
    while (n < max) {
        struct sockaddr_ll from;
        socklen_t fl = sizeof from;
        ssize_t len = recvfrom(d->fd, d->buf, cap, MSG_TRUNC, (struct sockaddr *)&from, &fl);
        if (len < 0) {
            if (errno == EINTR) continue;
            break; /* EAGAIN: drained */
        }
        n++;
        if (from.sll_pkttype == PACKET_OUTGOING) continue; /* our own, or the kernel's */
        if ((size_t)len > cap || len < PKT_HDR + 14) {
            d->rx_drops++;
            continue;
        }
        struct virtio_net_hdr vh;
        memcpy(&vh, d->buf, sizeof vh);
        unsigned char *f = d->buf + PKT_HDR;
        size_t flen = (size_t)len - PKT_HDR;
        /* A promiscuous or shared NIC shows frames for other hosts too. */
        if (!(f[0] & 1) && memcmp(f, d->lwip_mac, 6) != 0) continue;
        if (vh.flags & VIRTIO_NET_HDR_F_NEEDS_CSUM) {
            if (csum_complete(f, flen, le16toh(vh.csum_start), le16toh(vh.csum_offset)) < 0) {
                d->rx_drops++;
                continue;
            }
            d->rx_csum_fixed++;
        }
        netif_input_frame(d, nif, f, flen);
    }
    return n;
}

static int pkt_tx(netif_dev *d, struct pbuf *p) {
    struct virtio_net_hdr vh; /* all zero: complete checksums, no GSO */
    memset(&vh, 0, sizeof vh);
    struct iovec iov[PKT_IOV + 1];
    int n = 0;
    iov[n++] = (struct iovec){&vh, sizeof vh};
    const struct pbuf *q = p;
    for (; q && n < PKT_IOV + 1; q = q->next) iov[n++] = (struct iovec){q->payload, q->len};
    if (q) { /* a long chain: flatten it (rare: lwIP frames are 1-3 pbufs) */
        _Static_assert(NETIF_FRAME_MAX >= 0xffff, "txbuf holds any pbuf chain (tot_len is 16 bits)");
        pbuf_copy_partial(p, d->txbuf, p->tot_len, 0);
        iov[1] = (struct iovec){d->txbuf, p->tot_len};
        n = 2;
    }
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t w;
    do w = sendmsg(d->fd, &msg, MSG_DONTWAIT);
    while (w < 0 && errno == EINTR);
    int rc = w < 0 ? -errno : 0;
    if (rc < 0) d->tx_drops++;
    else d->tx_frames++;
    return rc;
}

static void pkt_close(netif_dev *d) {
    if (d->fd >= 0) close(d->fd);
    d->fd = -1;
    free(d->buf), free(d->txbuf);
    d->buf = d->txbuf = NULL;
}

static int fail(netif_dev *d, int rc, char *err, size_t errlen, const char *ifname,
                const char *what) {
    snprintf(err, errlen, "net: packet %s: %s: %s", ifname, what, strerror(-rc));
    pkt_close(d);
    return rc;
}

int netif_packet_open(netif_dev *d, const char *ifname, const unsigned char *mac,
                      char *err, size_t errlen, char *warn, size_t warnlen) {
    memset(d, 0, sizeof *d);
    d->fd = -1;
    d->rx = pkt_rx;
    d->tx = pkt_tx;
    d->close = pkt_close;
    d->mtu = 1500;
    if (warnlen) warn[0] = '\0';
    if (strlen(ifname) >= IFNAMSIZ) {
        snprintf(err, errlen, "net: packet '%s': name longer than %d bytes", ifname,
                 IFNAMSIZ - 1);
        return -EINVAL;
    }
    unsigned ifindex = if_nametoindex(ifname);
    if (!ifindex) return fail(d, -errno, err, errlen, ifname, "no such interface");

    /* Protocol 0: no frames at all until bound to the one interface. */
    d->fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (d->fd < 0) return fail(d, -errno, err, errlen, ifname, "socket(AF_PACKET)");
    int one = 1;
    if (setsockopt(d->fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) < 0)
        return fail(d, -errno, err, errlen, ifname, "PACKET_VNET_HDR");
    setsockopt(d->fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one); /* 4.20+ */
    int bufsz = PKT_SOCKBUF;
    if (setsockopt(d->fd, SOL_SOCKET, SO_RCVBUFFORCE, &bufsz, sizeof bufsz) < 0)
        setsockopt(d->fd, SOL_SOCKET, SO_RCVBUF, &bufsz, sizeof bufsz);
    if (setsockopt(d->fd, SOL_SOCKET, SO_SNDBUFFORCE, &bufsz, sizeof bufsz) < 0)
        setsockopt(d->fd, SOL_SOCKET, SO_SNDBUF, &bufsz, sizeof bufsz);
    struct sockaddr_ll sll = {.sll_family = AF_PACKET,
                              .sll_protocol = htons(ETH_P_ALL),
                              .sll_ifindex = (int)ifindex};
    if (bind(d->fd, (struct sockaddr *)&sll, sizeof sll) < 0)
        return fail(d, -errno, err, errlen, ifname, "bind");

    /* Interface ioctls through a plain socket in the same namespace. */
    int sk = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sk < 0) return fail(d, -errno, err, errlen, ifname, "socket");
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    memcpy(ifr.ifr_name, ifname, strlen(ifname));
    int rc = 0;
    const char *what = "";
    if (ioctl(sk, SIOCGIFHWADDR, &ifr) < 0) {
        rc = -errno;
        what = "SIOCGIFHWADDR";
    } else if (ifr.ifr_hwaddr.sa_family != ARPHRD_ETHER) {
        rc = -EPROTONOSUPPORT;
        what = "not an Ethernet interface";
    } else {
        memcpy(d->mac, ifr.ifr_hwaddr.sa_data, 6);
    }
    if (!rc && ioctl(sk, SIOCGIFMTU, &ifr) == 0 && ifr.ifr_mtu >= 576) d->mtu = ifr.ifr_mtu;
    if (!rc && ioctl(sk, SIOCGIFFLAGS, &ifr) < 0) {
        rc = -errno;
        what = "SIOCGIFFLAGS";
    }
    if (!rc && !(ifr.ifr_flags & IFF_UP)) {
        ifr.ifr_flags |= IFF_UP;
        if (ioctl(sk, SIOCSIFFLAGS, &ifr) < 0) {
            rc = -errno;
            what = "bring link up";
        }
    }
    if (!rc) {
        /* GRO merges the peer's segments into frames larger than the MTU, which then
         * need long pool chains, and hardware GRO/LRO may leave checksums that only the
         * NIC vouched for (the vnet header says "valid", lwIP checks again). */
        struct ethtool_value ev = {.cmd = ETHTOOL_SGRO, .data = 0};
        ifr.ifr_data = (void *)&ev;
        if (ioctl(sk, SIOCETHTOOL, &ifr) < 0)
            snprintf(warn, warnlen, "net: packet %s: could not turn GRO off: %s", ifname,
                     strerror(errno));
    }
    close(sk);
    if (rc) return fail(d, rc, err, errlen, ifname, what);

    memcpy(d->lwip_mac, mac ? mac : d->mac, 6);
    /* Multicast (IPv6 neighbour discovery, router adverts) passes the NIC's filter only
     * for groups the kernel joined; lwIP filters groups itself. */
    struct packet_mreq mr = {.mr_ifindex = (int)ifindex, .mr_type = PACKET_MR_ALLMULTI};
    setsockopt(d->fd, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mr, sizeof mr);
    if (mac && memcmp(mac, d->mac, 6) != 0) {
        /* Another MAC than the NIC's: add it to the NIC's unicast filter (the kernel
         * falls back to promiscuous mode where there is none). */
        memset(&mr, 0, sizeof mr);
        mr.mr_ifindex = (int)ifindex;
        mr.mr_type = PACKET_MR_UNICAST;
        mr.mr_alen = 6;
        memcpy(mr.mr_address, mac, 6);
        if (setsockopt(d->fd, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mr, sizeof mr) < 0) {
            mr.mr_type = PACKET_MR_PROMISC;
            if (setsockopt(d->fd, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mr, sizeof mr) < 0)
                return fail(d, -errno, err, errlen, ifname, "add the MAC to the filter");
        }
    }
    d->buf = malloc(NETIF_FRAME_MAX + PKT_HDR);
    d->txbuf = malloc(NETIF_FRAME_MAX);
    if (!d->buf || !d->txbuf) return fail(d, -ENOMEM, err, errlen, ifname, "frame buffers");
    return 0;
}
