/* init: kiln-init, the box's PID 1 (static musl). It mounts the pseudo filesystems, loads
 * the kernel modules, names the host, brings lo and eth0 up (kilnd's lwIP drives eth0;
 * the kernel keeps no address on it), then supervises kilnd, serves the serial console
 * and pets the hardware watchdog, all from one poll() loop: no threads, no async signal
 * handlers (signals come through a signalfd). It never exits on the box: a fatal problem
 * puts it in safe mode with the console alive.
 *
 * Test mode, `kiln-init --test ROOT --kilnd PATH [--cmdline "kiln.test=1 ..."]`, runs it as
 * an ordinary process for tests/boot: paths under ROOT, the console on stdin/stdout, no
 * mounts, modules, hostname or network; poweroff and reboot exit(0).
 *
 * kinit is the whole program's state; boot/shell.c (the console commands) works on it. */
#ifndef KILN_BOOT_INIT_H
#define KILN_BOOT_INIT_H

#include "boot/console.h"
#include "boot/initctl.h"
#include "boot/disk.h"
#include "boot/gpu.h"
#include "boot/identity.h"
#include "boot/measure.h"
#include "boot/supervise.h"
#include "boot/util.h"
#include "boot/watchdog.h"

typedef struct {
    int test_mode;
    int test_cmds;                   /* kiln.test=1: test-kill-kilnd, test-hang-kilnd */
    char root[UTIL_PATH_MAX];        /* "" on the box; ROOT in test mode */
    char cmdline[1024];              /* the kernel command line */
    char ini[UTIL_PATH_MAX];         /* /etc/kiln/kiln.ini */
    char pass_file[UTIL_PATH_MAX];   /* /etc/kiln/console.pass */
    double t0;                       /* kiln-init's start, util_now() seconds */
    int sfd;                         /* the signalfd, -1 if none (then we reap on ticks) */
    int halting, halt_how;           /* a poweroff/reboot is under way; RB_POWER_OFF or RB_AUTOBOOT */
    int net_pending;                 /* eth0 not up yet: retried on ticks */
    double net_retry_at, net_give_up;
    con con;
    initctl ctl;
    sup sup;
    wdog wd;
    dsk disk;                        /* the data partition (disk image boots) */
    gpu_state gpu;                   /* the NVIDIA GPUs and their driver (boot/gpu.h) */
    meas meas;                       /* measured boot: what PCR 15 says about this boot */
    ident id;                        /* the sealed identity (TLS key, tokens) */
    char ask_reply[512];             /* kiln-init's answer to a kilnd ASK, to send; "" none */
} kinit;

void kinit_halt(kinit *k, int how, const char *why); /* drain kilnd, then power off or reboot */

#endif
