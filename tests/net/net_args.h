/* net_args: the transport flags the tests/net programs share, into a net_config. */
#ifndef KILN_TESTS_NET_ARGS_H
#define KILN_TESTS_NET_ARGS_H

#include <string.h>

#include "core/config.h"
#include "net/net.h"

/* --driver host|tap|packet, --ifname, --address, --gateway, --mac, --dns with its value v:
 * 1 taken, 0 not one of these, -1 a bad --driver. v must outlive cfg. */
static inline int net_args_take(net_config *cfg, const char *flag, const char *v) {
    if (!strcmp(flag, "--driver")) {
        if (!strcmp(v, "host")) cfg->driver = CFG_DRIVER_HOST;
        else if (!strcmp(v, "tap")) cfg->driver = CFG_DRIVER_TAP;
        else if (!strcmp(v, "packet")) cfg->driver = CFG_DRIVER_PACKET;
        else return -1;
    } else if (!strcmp(flag, "--ifname")) {
        cfg->ifname = v;
    } else if (!strcmp(flag, "--address")) {
        cfg->address = v;
    } else if (!strcmp(flag, "--gateway")) {
        cfg->gateway = v;
    } else if (!strcmp(flag, "--mac")) {
        cfg->mac = v;
    } else if (!strcmp(flag, "--dns")) {
        cfg->dns = v;
    } else {
        return 0;
    }
    return 1;
}

#endif
