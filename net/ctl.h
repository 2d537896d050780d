/* ctl: kilnd's control socket, for kiln-init (PID 1) on the same box.
 *
 * A unix stream socket (`kilnd serve --control PATH`). Unsolicited, to every client:
 * `HB <n> served=<GENs> loop_max_ms=<ms>` every CTL_HB_MS from a loop timer (so heartbeats
 * stop when the loop hangs, which is what the supervisor watches; served: samples finished
 * by stop or length, srv_served; loop_max_ms: the longest loop pass lately, a loop that
 * is slowing down before it stops) and `READY <seconds since start>` once the server takes requests.
 * Commands, one per line; every reply ends with a line ".":
 *   status                  key=value lines: model, uptime_s, ready, draining, level,
 *                           running, waiting, address, driver, connections, served
 *   stats                   the protocol's STATS line
 *   drain | drain off       stop / resume taking requests
 *   restart                 drain, then exit 75 for the supervisor
 *   config get S.K          S.K=value
 *   config set S.K V        ok, or "error: ..." (keys that need a restart say so)
 *   net                     driver, address, open connections
 *   update ready|done|refused S ...   kiln-init's answer to an ASK of the network update
 * kilnd asks kiln-init, unsolicited like HB: `ASK update-begin S`, `ASK update-activate S
 * tries=T`, `ASK reboot` (net/server.c's UPDATE and REBOOT verbs).
 * The socket is only as private as its path: kiln-init creates it under /run/kiln
 * (mode 0700); the file itself is made mode 0600. */
#ifndef KILN_CTL_H
#define KILN_CTL_H

#include <stddef.h>

#include "net/net.h"
#include "net/server.h"
#include "sched/loop.h"

#define CTL_HB_MS 500
#define CTL_MAX_CLIENTS 4

typedef struct ctl ctl;

/* Listen on path (an old socket file there is replaced). NULL with err set. */
ctl *ctl_new(loop_t *l, srv *s, net_stack *net, const char *path, char *err, size_t errlen);
void ctl_free(ctl *c); /* closes the clients, removes the socket file */

#endif
