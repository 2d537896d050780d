/* netif_tap: frames over a TAP device (/dev/net/tun, IFF_TAP | IFF_NO_PI).
 *
 * The kernel's end of the TAP is an ordinary interface (address, routes: set up by
 * whoever owns the machine); lwIP sits at the other end of the wire with its own MAC. The
 * kernel completes checksums and segments before a frame reaches a TAP without
 * IFF_VNET_HDR, so frames here are plain and at most MTU-sized. */
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <linux/if_tun.h>

#include "lwip/netif.h"
#include "lwip/pbuf.h"
#include "net/netif.h"

#define TAP_IOV 16

static int tap_rx(netif_dev *d, struct netif *nif, int max) {
    int n = 0;
    while (n < max) {
        ssize_t len = read(d->fd, d->buf, NETIF_FRAME_MAX);
        if (len < 0) {
            if (errno == EINTR) continue;
            break; /* EAGAIN: drained (anything else shows up again as an event) */
        }
        n++;
        if (len < 14) {
            d->rx_drops++;
            continue;
        }
        netif_input_frame(d, nif, d->buf, (size_t)len);
    }
    return n;
}

static int tap_tx(netif_dev *d, struct pbuf *p) {
    struct iovec iov[TAP_IOV];
    int n = 0;
    const struct pbuf *q = p;
    for (; q && n < TAP_IOV; q = q->next) iov[n++] = (struct iovec){q->payload, q->len};
    ssize_t w;
    if (q) { /* a long chain: flatten it (rare: lwIP frames are 1-3 pbufs) */
        _Static_assert(NETIF_FRAME_MAX >= 0xffff, "txbuf holds any pbuf chain (tot_len is 16 bits)");
        pbuf_copy_partial(p, d->txbuf, p->tot_len, 0);
        w = write(d->fd, d->txbuf, p->tot_len);
    } else {
        w = writev(d->fd, iov, n);
    }
    if (w < 0) {
        d->tx_drops++;
        return -errno;
    }
    d->tx_frames++;
    return 0;
}

static void tap_close(netif_dev *d) {
    if (d->fd >= 0) close(d->fd);
    d->fd = -1;
    free(d->buf), free(d->txbuf);
    d->buf = d->txbuf = NULL;
}

int netif_tap_open(netif_dev *d, const char *ifname, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    d->fd = -1;
    d->rx = tap_rx;
    d->tx = tap_tx;
    d->close = tap_close;
    d->mtu = 1500;
    if (strlen(ifname) >= IFNAMSIZ) {
        snprintf(err, errlen, "net: tap '%s': name longer than %d bytes", ifname, IFNAMSIZ - 1);
        return -EINVAL;
    }
    int rc;
    d->fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (d->fd < 0) {
        rc = -errno;
        snprintf(err, errlen, "net: tap %s: open /dev/net/tun: %s", ifname, strerror(-rc));
        return rc;
    }
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
    memcpy(ifr.ifr_name, ifname, strlen(ifname));
    if (ioctl(d->fd, TUNSETIFF, &ifr) < 0) {
        rc = -errno;
        snprintf(err, errlen, "net: tap %s: TUNSETIFF: %s%s", ifname, strerror(-rc),
                 rc == -EBUSY ? " (attached to another process)"
                 : rc == -EINVAL ? " (a TUN device, or flags that do not match)"
                                 : "");
        tap_close(d);
        return rc;
    }
    /* Interface ioctls go through any socket in the device's namespace. */
    int sk = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sk < 0) {
        rc = -errno;
        snprintf(err, errlen, "net: tap %s: socket: %s", ifname, strerror(-rc));
        tap_close(d);
        return rc;
    }
    memset(&ifr, 0, sizeof ifr);
    memcpy(ifr.ifr_name, ifname, strlen(ifname));
    if (ioctl(sk, SIOCGIFMTU, &ifr) == 0 && ifr.ifr_mtu >= 576) d->mtu = ifr.ifr_mtu;
    rc = 0;
    if (ioctl(sk, SIOCGIFFLAGS, &ifr) < 0) {
        rc = -errno;
        snprintf(err, errlen, "net: tap %s: SIOCGIFFLAGS: %s", ifname, strerror(-rc));
    } else if (!(ifr.ifr_flags & IFF_UP)) {
        ifr.ifr_flags |= IFF_UP;
        if (ioctl(sk, SIOCSIFFLAGS, &ifr) < 0) {
            rc = -errno;
            snprintf(err, errlen, "net: tap %s: bring link up: %s", ifname, strerror(-rc));
        }
    }
    close(sk);
    if (rc < 0) {
        tap_close(d);
        return rc;
    }
    d->buf = malloc(NETIF_FRAME_MAX);
    d->txbuf = malloc(NETIF_FRAME_MAX);
    if (!d->buf || !d->txbuf) {
        snprintf(err, errlen, "net: tap %s: out of memory", ifname);
        tap_close(d);
        return -ENOMEM;
    }
    return 0;
}
