/* net: the public net_* calls, dispatched to the transport the stack was made with
 * (net_host.c: kernel sockets; net_lwip.c: lwIP over a TAP or AF_PACKET device). */
#include "net/net.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/config.h"
#include "net/netif.h"

net_stack *net_new(loop_t *l, const net_config *cfg, char *err, size_t errlen) {
    if (errlen) err[0] = '\0';
    if (!l || !cfg) {
        snprintf(err, errlen, "net: no loop or config");
        return NULL;
    }
    switch (cfg->driver) {
    case CFG_DRIVER_HOST: return net_host_new(l, cfg, err, errlen);
    case CFG_DRIVER_TAP:
    case CFG_DRIVER_PACKET: return net_lwip_new(l, cfg, err, errlen);
    default:
        snprintf(err, errlen, "net: unknown driver %d", cfg->driver);
        return NULL;
    }
}

void net_free(net_stack *s) {
    if (s) s->t->free(s);
}

int net_listen(net_stack *s, const char *host, int port, net_accept_fn fn, void *ud,
               char *err, size_t errlen) {
    if (errlen) err[0] = '\0';
    if (!fn || port <= 0 || port > 65535) {
        snprintf(err, errlen, "net: listen: bad port %d or no accept function", port);
        return -EINVAL;
    }
    return s->t->listen(s, host ? host : "0.0.0.0", port, fn, ud, err, errlen);
}

ssize_t net_read(net_conn *c, void *buf, size_t cap) { return c->t->read(c, buf, cap); }

ssize_t net_write(net_conn *c, const void *buf, size_t len) {
    if (len == 0) return 0;
    return c->t->write(c, buf, len);
}

void net_close(net_conn *c) {
    if (c) c->t->close(c);
}

void net_abort(net_conn *c) {
    if (c) c->t->abort(c);
}

int net_peer(const net_conn *c, char *buf, size_t cap) { return c->t->peer(c, buf, cap); }

int net_address(const net_stack *s, char *buf, size_t cap) {
    return s->t->address(s, buf, cap);
}

int net_open_conns(const net_stack *s) { return s->t->open_conns(s); }

const char *net_driver_name(const net_stack *s) { return s->driver_name; }

int net_stats(const net_stack *s, net_counters *out) {
    if (!s->t->stats) return -ENOTSUP;
    return s->t->stats(s, out);
}

int net_probe(net_stack *s, const char *ipv4, int port, int timeout_ms, net_probe_fn fn,
              void *ud) {
    struct in_addr in;
    if (!s || !ipv4 || !fn || port <= 0 || port > 65535 || timeout_ms <= 0 ||
        timeout_ms > NET_PROBE_TIMEOUT_MAX_MS || inet_pton(AF_INET, ipv4, &in) != 1)
        return -EINVAL;
    /* A TCP connect needs one unicast host: not 0.0.0.0 (the kernel would take it for
     * itself), not multicast (224/4), not the limited broadcast. */
    uint32_t h = ntohl(in.s_addr);
    if (h == 0 || (h >> 28) == 0xe || h == 0xffffffffu) return -EINVAL;
    if (!s->t->probe) return -ENOTSUP;
    return s->t->probe(s, in.s_addr, port, timeout_ms, fn, ud);
}

void net_probe_cancel(net_stack *s, int id) {
    if (s && id > 0 && s->t->probe_cancel) s->t->probe_cancel(s, id);
}

/* A host name's text form: labels of letters, digits, '-' and '_' (SRV-style names and
 * some internal zones use it) of 1..63 each, joined by single dots, one trailing dot
 * allowed, the last label not all digits (no top-level domain is; "10.1.2" or "1.2.3.4.5"
 * is a mistyped address, not a name to send to DNS), an IPv4 address as itself. What
 * reaches a resolver from an admin's line is only this. */
static int name_ok(const char *name) {
    size_t n = strlen(name), label = 0;
    int digits = 1; /* the current label is all digits so far */
    struct in_addr in;
    if (n == 0 || n > NET_NAME_MAX) return 0;
    if (inet_pton(AF_INET, name, &in) == 1) return 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c == '.') {
            if (label == 0) return 0;
            if (i == n - 1) break; /* the trailing dot: the label before it was the last */
            label = 0, digits = 1;
        } else if (isalnum(c) || c == '-' || c == '_') {
            if (++label > 63) return 0;
            digits &= isdigit(c) != 0;
        } else {
            return 0;
        }
    }
    return !digits;
}

int net_resolve(net_stack *s, const char *name, int timeout_ms, net_resolve_fn fn, void *ud) {
    if (!s || !name || !fn || timeout_ms <= 0 || timeout_ms > NET_PROBE_TIMEOUT_MAX_MS || !name_ok(name))
        return -EINVAL;
    if (!s->t->resolve) return -ENOTSUP;
    return s->t->resolve(s, name, timeout_ms, fn, ud);
}

void net_resolve_cancel(net_stack *s, int id) {
    if (s && id > 0 && s->t->resolve_cancel) s->t->resolve_cancel(s, id);
}
