/* shell: the console's commands (`help` lists them). Local ones (status's first part,
 * log, restart, reboot, poweroff) never wait on kilnd; relayed ones (stats, drain,
 * config, net, status's second part) go over the control socket with a 2 s limit, and
 * the console takes no input meanwhile. */
#ifndef KILN_BOOT_SHELL_H
#define KILN_BOOT_SHELL_H

#include "boot/init.h"

#define SH_RELAY_TIMEOUT_S 2.0
#define SH_DEBUG_TIMEOUT_S 12.0 /* debug probe: its connect's 10 s at most, and room */
#define SH_DEBUG_KMSG_MAX 100   /* kernel log lines at once: they fit the console's buffer */

void sh_run(kinit *k, char *line); /* one typed line */

#endif
