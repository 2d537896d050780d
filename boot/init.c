/* init: kiln-init's main: PID 1 duties and the event loop. See init.h.
 *
 * Signals: blocked from the start and read from a signalfd in the loop, one table row per
 * signal (SIGCHLD reaps, SIGTERM and SIGINT power off: with RB_DISABLE_CAD the kernel turns
 * ctrl-alt-del into SIGINT for PID 1). Children get the original mask back before exec. */
#include "boot/init.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/reboot.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "boot/ini.h"
#include "boot/logring.h"
#include "boot/modules.h"
#include "boot/shell.h"
#include "boot/sys.h"

#define TICK_S 0.25          /* the longest poll() sleep: timers are checked at least this often */
#define NET_RETRY_S 1.0      /* eth0 missing at boot (a slow driver): look again this often ... */
#define NET_GIVE_UP_S 30.0   /* ... for this long */
#define KILL_ALL_GRACE_S 2.0 /* at the end: SIGTERM to SIGKILL for any process left */

static kinit K; /* one PID 1, one state; static so its buffers are not on the stack */

extern char **environ;
static char *const box_env[] = {(char *)"PATH=/bin:/sbin", (char *)"HOME=/", (char *)"TERM=linux", NULL};
/* The CUDA kilnd's on a GPU disk whose data partition has cuBLAS (boot/gpu.h). Its CPU
 * fallback gets it too: a static musl program has no loader to read it. */
static char *const cuda_env[] = {(char *)"PATH=/bin:/sbin", (char *)"HOME=/", (char *)"TERM=linux",
                                 (char *)GPU_DATA_LIB_ENV, NULL};

/* ------------------------------------------------------------------ console plumbing */

/* logring's sink: kiln-init's messages and kilnd's chosen lines reach the console. */
static void to_console(void *arg, const char *line) {
    kinit *k = arg;
    if (k->con.out_fd >= 0) con_async(&k->con, line);
    else dprintf(2, "%s\n", line); /* before the console is open: whatever fd 2 is */
}

static void on_console_line(void *arg, char *line) {
    kinit *k = arg;
    if (!line) { /* test mode: stdin ended; nobody is left to power us off */
        kinit_halt(k, RB_POWER_OFF, "end of console input");
        return;
    }
    sh_run(k, line);
}

static void on_ctl_event(void *arg, int ev, double value) {
    kinit *k = arg;
    sup_on_ctl(&k->sup, ev, value, util_now());
}

/* ------------------------------------------------------------------ kilnd asks */

/* kilnd's ASK lines (boot/initctl.h): the steps of a network update (kilnd writes the inactive
 * slot's partition; kiln-init, which holds the key and the ESP, makes that slot unbootable
 * before and verifies and activates it after) and an admin's REBOOT. The answer goes back
 * as a request of ours once the control socket is free (ask_tick). */
static void on_ask(void *arg, const char *what) {
    kinit *k = arg;
    char out[400];
    int slot = -1, tries = 3;
    char c = 0;
    if (!strcmp(what, "reboot")) {
        kinit_halt(k, RB_AUTOBOOT, "an admin's REBOOT over the network");
        return;
    }
    int begin = sscanf(what, "update-begin %c", &c) == 1;
    int act = !begin && sscanf(what, "update-activate %c tries=%d", &c, &tries) == 2;
    if (c == 'a' || c == 'b') slot = c - 'a';
    if ((!begin && !act) || slot < 0 || tries < 1 || tries > 9) {
        logring_note("kiln-init: ctl: kilnd asks what we do not do: %.160s", what);
        return;
    }
    int r = begin ? disk_update_begin(&k->disk, slot, out, sizeof out) : disk_activate(&k->disk, slot, tries, out, sizeof out);
    char why[300];
    /* The new slot verified: the identity goes with it (else it boots to safe mode). */
    if (r == 0 && act && id_seal_slot(&k->id, slot, why, sizeof why) < 0)
        logring_say("kiln: WARNING: network update: %s: slot %c will not unseal the identity (safe mode there)", why, c);
    if (r == 0) snprintf(k->ask_reply, sizeof k->ask_reply, "update %s %c %s", begin ? "ready" : "done", c, begin ? "" : out);
    else snprintf(k->ask_reply, sizeof k->ask_reply, "update refused %c %s", c, out);
}

static void ask_done(void *arg, int status) {
    (void)arg;
    if (status < 0) logring_note("kiln-init: ctl: the update answer to kilnd: %s", strerror(-status));
}

static void ask_tick(kinit *k) {
    if (!k->ask_reply[0] || !initctl_connected(&k->ctl) || initctl_busy(&k->ctl)) return;
    if (initctl_request(&k->ctl, k->ask_reply, SUP_CTL_TIMEOUT_S, NULL, ask_done, k) == 0) k->ask_reply[0] = 0;
}

/* ------------------------------------------------------------------ the end */

void kinit_halt(kinit *k, int how, const char *why) {
    const char *what = how == RB_POWER_OFF ? "power off" : "reboot";
    if (k->halting) {
        con_printf(&k->con, "kiln: already shutting down");
        return;
    }
    k->halting = 1;
    k->halt_how = how;
    logring_say("kiln: %s (%s): stopping kilnd first", what, why);
    sup_shutdown(&k->sup, util_now());
}

static void finish_halt(kinit *k) {
    const char *what = k->halt_how == RB_POWER_OFF ? "poweroff" : "reboot";
    con_set_busy(&k->con, 1, util_now()); /* no more commands, no more prompts */
    if (k->test_mode) {
        logring_say("kiln: %s (test mode: exiting)", what);
        con_flush(&k->con, 2.0);
        con_restore(&k->con);
        exit(0);
    }
    logring_say("kiln: %s now", what);
    con_flush(&k->con, 2.0);
    sys_kill_all(KILL_ALL_GRACE_S);
    sync();
    if (reboot(k->halt_how) < 0) {
        /* PID 1 must not exit: stay, with the console, and say why. */
        char why[160];
        snprintf(why, sizeof why, "%s failed: reboot(): %s", what, strerror(errno));
        k->halting = 0;
        sup_enter_safe(&k->sup, why);
        con_set_busy(&k->con, 0, util_now());
    }
}

/* ------------------------------------------------------------------ signals */

static void reap(kinit *k) {
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid < 0 && errno == EINTR) continue;
        if (pid <= 0) return; /* 0: children left but none done; ECHILD: none */
        if (!sup_reaped(&k->sup, pid, st, util_now())) {
            char how[96];
            logring_note("kiln-init: reaped pid %d (%s)", (int)pid, util_exit_text(st, how, sizeof how));
        }
    }
}

static void on_sigchld(kinit *k) { reap(k); }
static void on_sigterm(kinit *k) { kinit_halt(k, RB_POWER_OFF, "SIGTERM"); }
static void on_sigint(kinit *k) { kinit_halt(k, RB_POWER_OFF, k->test_mode ? "SIGINT" : "ctrl-alt-del"); }

static const struct {
    int sig;
    void (*fn)(kinit *k);
} sig_table[] = {
    {SIGCHLD, on_sigchld},
    {SIGTERM, on_sigterm},
    {SIGINT, on_sigint},
};

static void on_signalfd(kinit *k) {
    struct signalfd_siginfo si;
    for (;;) {
        ssize_t n = read(k->sfd, &si, sizeof si);
        if (n < 0 && errno == EINTR) continue;
        if (n != (ssize_t)sizeof si) return; /* EAGAIN: all taken */
        for (size_t i = 0; i < sizeof sig_table / sizeof sig_table[0]; i++)
            if ((int)si.ssi_signo == sig_table[i].sig) sig_table[i].fn(k);
    }
}

/* Blocks the table's signals (old gets the mask to give children) and opens the signalfd.
 * Without a signalfd kiln-init still works: ticks reap, and SIGTERM stays pending. */
static void setup_signals(kinit *k, sigset_t *old) {
    sigset_t set;
    sigemptyset(&set);
    for (size_t i = 0; i < sizeof sig_table / sizeof sig_table[0]; i++) sigaddset(&set, sig_table[i].sig);
    if (sigprocmask(SIG_BLOCK, &set, old) < 0) logring_say("kiln-init: sigprocmask: %s", strerror(errno));
    /* A closed console or control socket must not kill us; children get SIG_DFL back. */
    signal(SIGPIPE, SIG_IGN);
    k->sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (k->sfd < 0) logring_say("kiln-init: signalfd: %s (reaping on timer ticks)", strerror(errno));
}

/* ------------------------------------------------------------------ the box (not test mode) */

/* fds 0-2 on the console so that any stray write lands somewhere visible. */
static void console_fds(void) {
    int fd = open("/dev/console", O_RDWR | O_NOCTTY);
    if (fd < 0) fd = open("/dev/null", O_RDWR);
    if (fd < 0) return;
    for (int i = 0; i < 3; i++)
        if (fd != i) dup2(fd, i);
    if (fd > 2) close(fd);
}

static void set_hostname(kinit *k) {
    char name[80] = "kiln", v[80];
    const char *from = "default";
    if (sys_cmdline_get(k->cmdline, "kiln.hostname", v, sizeof v)) snprintf(name, sizeof name, "%s", v), from = "kiln.hostname=";
    else if (ini_get(k->ini, "net", "hostname", v, sizeof v) == 0 && v[0]) snprintf(name, sizeof name, "%s", v), from = "kiln.ini";
    if (!sys_hostname_ok(name)) {
        logring_say("kiln-init: hostname '%.64s' (%s) is not valid; using kiln", name, from);
        snprintf(name, sizeof name, "kiln");
    }
    if (sys_set_hostname(name) == 0) logring_note("kiln-init: hostname %s (%s)", name, from);
}

/* IPv6 off before eth0 goes up, else the kernel gives it a link-local address and answers
 * on the NIC that lwIP drives. 1 when eth0 is up. */
static int net_up(void) {
    if (sys_ipv6_off("eth0") < 0) return 0;
    int r = sys_if_up("eth0");
    if (r == 0) logring_note("kiln-init: eth0 up (IPv6 off; lwIP in kilnd owns it)");
    return r == 0;
}

static void setup_box(kinit *k) {
    umask(022);
    if (chdir("/") < 0) logring_say("kiln-init: chdir /: %s", strerror(errno));
    int failed = sys_mount_all();
    console_fds();
    if (con_open_device(&k->con, "/dev/console", on_console_line, k) < 0)
        logring_note("kiln-init: open /dev/console: %s", strerror(errno));
    logring_say("kiln-init: kiln firmware PID 1 starting%s", failed ? " (some mounts failed: see `log`)" : "");
    /* ctrl-alt-del becomes SIGINT to us instead of an immediate reboot: we drain first. */
    if (reboot(RB_DISABLE_CAD) < 0) logring_say("kiln-init: reboot(RB_DISABLE_CAD): %s", strerror(errno));
    ssize_t n = util_read_file("/proc/cmdline", k->cmdline, sizeof k->cmdline);
    if (n < 0) logring_say("kiln-init: read /proc/cmdline: %s", strerror((int)-n));

    char release[128] = "", dir[UTIL_PATH_MAX];
    if (util_read_file("/proc/sys/kernel/osrelease", release, sizeof release) < 0)
        logring_say("kiln-init: read /proc/sys/kernel/osrelease: %s", strerror(errno));
    snprintf(dir, sizeof dir, "/lib/modules/%s", util_trim(release));
    mod_result mr;
    int r = mod_load_list("/etc/kiln/modules", dir, &mr);
    if (r < 0 && r != -ENOENT) logring_say("kiln-init: read /etc/kiln/modules: %s", strerror(-r));
    else if (r == 0) logring_say("kiln: modules: %d loaded, %d failed (%.2f s)", mr.loaded, mr.failed, mr.secs);
    gpu_bring_up(&k->gpu, "", dir, 1); /* before kilnd: its backend = auto looks for the device */
    logring_say("kiln: gpu: %s", k->gpu.line);

    disk_setup(&k->disk, 3.0); /* before kilnd: the model may be on the data partition */
    set_hostname(k);
    if (sys_ipv6_off("default") < 0) logring_note("kiln-init: IPv6 default stays on");
    if (sys_if_up("lo") < 0) logring_say("kiln-init: lo did not come up");
    k->net_pending = !net_up();
    k->net_retry_at = util_now() + NET_RETRY_S;
    k->net_give_up = util_now() + NET_GIVE_UP_S;
}

static void net_tick(kinit *k, double now) {
    if (!k->net_pending || now < k->net_retry_at) return;
    k->net_retry_at = now + NET_RETRY_S;
    if (net_up()) {
        k->net_pending = 0;
    } else if (now >= k->net_give_up) {
        k->net_pending = 0;
        logring_say("kiln-init: eth0 did not appear within %.0f s (NIC module?)", NET_GIVE_UP_S);
    }
}

/* ------------------------------------------------------------------ test mode */

static void usage(void) {
    fprintf(stderr, "usage: kiln-init                (as PID 1 on the box)\n"
                    "       kiln-init --test ROOT --kilnd PATH [--kilnd-fallback PATH] [--cmdline \"kiln.test=1 ...\"]\n");
}

static int parse_test_args(kinit *k, int argc, char **argv, char *kilnd, char *fallback, size_t cap) {
    for (int i = 1; i < argc; i += 2) { /* flag value pairs */
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return -1;
        if (!strcmp(argv[i], "--test")) snprintf(k->root, sizeof k->root, "%s", v);
        else if (!strcmp(argv[i], "--kilnd")) snprintf(kilnd, cap, "%s", v);
        else if (!strcmp(argv[i], "--kilnd-fallback")) snprintf(fallback, cap, "%s", v);
        else if (!strcmp(argv[i], "--cmdline")) snprintf(k->cmdline, sizeof k->cmdline, "%s", v);
        else return -1;
    }
    if (!k->root[0] || !kilnd[0]) return -1;
    /* kilnd runs in the config's folder: a relative path would not name it there. */
    char abs[PATH_MAX];
    if (kilnd[0] != '/' && realpath(kilnd, abs) && strlen(abs) < cap) strcpy(kilnd, abs);
    if (fallback[0] && fallback[0] != '/' && realpath(fallback, abs) && strlen(abs) < cap) strcpy(fallback, abs);
    return 0;
}

static void setup_test(kinit *k) {
    char dir[UTIL_PATH_MAX];
    /* Orphans of kilnd come to us, as they would to PID 1. */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0) logring_note("kiln-init: PR_SET_CHILD_SUBREAPER: %s", strerror(errno));
    con_open_stdio(&k->con, on_console_line, k);
    for (const char *const *d = (const char *const[]){"/run", "/run/kiln", NULL}; *d; d++) {
        if (util_join(dir, sizeof dir, k->root, *d) == 0 && mkdir(dir, 0755) < 0 && errno != EEXIST)
            logring_say("kiln-init: mkdir %s: %s", dir, strerror(errno));
    }
    logring_say("kiln-init: test mode, root %s", k->root);
    gpu_bring_up(&k->gpu, k->root, "", 0);
    logring_say("kiln: gpu: %s", k->gpu.line);
}

/* ------------------------------------------------------------------ the loop */

static double min2(double a, double b) { return a < b ? a : b; }

/* Everything that runs on time; returns the seconds until something wants to run again. */
static double tick(kinit *k, double now) {
    char why[200] = "";
    double next = TICK_S;
    if (k->sfd < 0) reap(k);
    /* Heartbeats that arrived while we were busy elsewhere count before kilnd is judged:
     * a slow kiln-init must not make kilnd look hung. */
    if (initctl_connected(&k->ctl)) initctl_on_readable(&k->ctl);
    next = min2(next, sup_tick(&k->sup, now));
    next = min2(next, initctl_tick(&k->ctl, now));
    int ok = sup_watchdog_ok(&k->sup, now, why, sizeof why);
    next = min2(next, wdog_tick(&k->wd, now, ok, why));
    next = min2(next, con_tick(&k->con, now));
    net_tick(k, now);
    ask_tick(k);
    /* A slot on trial: blessed once kilnd is ready and has served a GEN, else its try ends
     * in a reboot. */
    if (!k->halting && disk_tick(&k->disk, k->sup.ready, sup_healthy(&k->sup), k->sup.state == SUP_SAFE, now))
        kinit_halt(k, RB_AUTOBOOT, "the slot on trial is not healthy");
    return next < 0 ? 0 : next;
}

enum { FD_SIG, FD_CON, FD_CON_OUT, FD_LOG, FD_CHECK, FD_CTL, FD_N };

static void dispatch(kinit *k, int which) {
    switch (which) {
    case FD_SIG: on_signalfd(k); break;
    case FD_CON: con_on_readable(&k->con, util_now()); break;
    case FD_CON_OUT: con_on_writable(&k->con); break;
    case FD_LOG: sup_on_log(&k->sup); break;
    case FD_CHECK: sup_on_check(&k->sup); break;
    case FD_CTL: initctl_on_readable(&k->ctl); break;
    }
}

static void loop(kinit *k) {
    for (;;) {
        double wait = tick(k, util_now());
        struct pollfd p[FD_N];
        int which[FD_N], n = 0;
        /* Handlers read the fds from the state, not from p[]: a handler may close or
         * replace one that a later entry names. */
        int fds[FD_N] = {k->sfd, con_poll_fd(&k->con), con_out_fd(&k->con), k->sup.log_fd, k->sup.check_fd, k->ctl.fd};
        for (int i = 0; i < FD_N; i++) {
            if (fds[i] < 0) continue;
            p[n] = (struct pollfd){.fd = fds[i], .events = i == FD_CON_OUT ? POLLOUT : POLLIN};
            which[n++] = i;
        }
        int r = poll(p, (nfds_t)n, (int)(wait * 1000.0) + 1);
        if (r < 0) {
            if (errno != EINTR) {
                logring_note("kiln-init: poll: %s", strerror(errno));
                util_sleep(0.1); /* never spin */
            }
            continue;
        }
        for (int i = 0; i < n; i++)
            if (p[i].revents) dispatch(k, which[i]);
        if (k->halting && sup_down(&k->sup)) finish_halt(k);
    }
}

/* The data partition has cuBLAS (the GPU disk): the CUDA kilnd gets it as its library path,
 * after the image's loader was asked whether cuBLAS resolves there (one console line). */
static char *const *cuda_lib_env(kinit *k, const sigset_t *child_mask) {
    gpu_check_cublas(k->root, child_mask, k->gpu.cublas, sizeof k->gpu.cublas); /* `gpu`, `status` show it */
    logring_say("kiln: %s", k->gpu.cublas);
    return cuda_env;
}

int main(int argc, char **argv) {
    kinit *k = &K;
    char kilnd[UTIL_PATH_MAX] = GPU_KILND_CPU, fallback[UTIL_PATH_MAX] = "", path[UTIL_PATH_MAX], sock[UTIL_PATH_MAX];
    char *const *env = box_env;
    k->t0 = util_now();
    k->sfd = -1;
    k->con.in_fd = k->con.out_fd = -1;
    /* As PID 1 the arguments are whatever the kernel did not understand on its command
     * line: never ours, and never a reason to exit (that would panic the kernel). */
    k->test_mode = getpid() != 1;
    if (k->test_mode && parse_test_args(k, argc, argv, kilnd, fallback, sizeof kilnd) < 0) {
        fprintf(stderr, "kiln-init: not PID 1: only --test runs here (PID 1 mounts, loads modules, powers off)\n");
        usage();
        return 2;
    }
    logring_init(k->t0, to_console, k);
    sigset_t child_mask;
    setup_signals(k, &child_mask);
    if (k->test_mode) setup_test(k);
    else setup_box(k);
    meas_boot(&k->meas, &k->disk, k->test_mode); /* after disk_setup verified the running slot */

    char v[16];
    k->test_cmds = sys_cmdline_get(k->cmdline, "kiln.test", v, sizeof v) && strcmp(v, "0");
    /* The data partition's configuration, when there is one, survives reboots and updates. */
    struct stat st;
    int data_ini = !k->test_mode && k->disk.data_mounted && stat(DISK_CONFIG, &st) == 0;
    /* The GPU image's CUDA kilnd when it has one (and backend is not cpu), else the CPU one. */
    if (util_join(k->ini, sizeof k->ini, k->root, data_ini ? DISK_CONFIG : "/etc/kiln/kiln.ini") == 0) {
        char pick[UTIL_PATH_MAX], why[96];
        gpu_pick_kilnd(k->root, k->ini, pick, sizeof pick, why, sizeof why);
        if (k->test_mode) logring_say("kiln: kilnd: %s (test mode runs --kilnd)", why);
        else if (util_join(kilnd, sizeof kilnd, k->root, pick) == 0) {
            logring_say("kiln: kilnd: %s", why);
            /* a CUDA kilnd that cannot run at all (its loader or a library broken, a crash
             * loop in the driver) gives way to the CPU one instead of safe mode */
            if (strcmp(pick, GPU_KILND_CPU) != 0) {
                util_join(fallback, sizeof fallback, k->root, GPU_KILND_CPU);
                if (k->disk.data_mounted && gpu_data_lib(k->root)) env = cuda_lib_env(k, &child_mask);
            }
        }
    }
    if (util_join(k->ini, sizeof k->ini, k->root, data_ini ? DISK_CONFIG : "/etc/kiln/kiln.ini") < 0 ||
        util_join(k->pass_file, sizeof k->pass_file, k->root, "/etc/kiln/console.pass") < 0 ||
        util_join(sock, sizeof sock, k->root, "/run/kiln/ctl.sock") < 0 ||
        util_join(path, sizeof path, k->root, "/dev/watchdog") < 0 ||
        initctl_init(&k->ctl, sock, on_ctl_event, k) < 0 ||
        sup_init(&k->sup, kilnd, k->ini, sock, k->test_mode, k->test_mode ? environ : env, &child_mask, &k->ctl, k->t0) < 0) {
        /* Only a too-long ROOT gets here, and only in test mode. */
        logring_say("kiln-init: paths under %s are too long", k->root);
        if (k->test_mode) return 2;
        sup_enter_safe(&k->sup, "internal error: paths too long");
    }
    if (fallback[0]) sup_set_fallback(&k->sup, fallback);
    /* The sealed identity in place (or refused) before kilnd can start with it. */
    id_boot(&k->id, &k->disk, &k->meas, k->ini, k->test_mode);
    if (k->id.state == ID_FAILED) sup_hold(&k->sup, k->id.why);
    wdog_init(&k->wd, path, k->test_mode);
    initctl_on_ask(&k->ctl, on_ask, k);
    char dev[64];
    int us = disk_update_slot(&k->disk, dev, sizeof dev);
    if (us >= 0) snprintf(k->sup.update, sizeof k->sup.update, "%c:%s", 'a' + us, dev);

    char pass[128];
    if (util_read_file(k->pass_file, pass, sizeof pass) > 0 && *util_trim(pass)) con_set_password(&k->con, util_trim(pass));
    if (k->test_cmds) logring_say("kiln-init: kiln.test=1: test commands enabled");
    if (k->sup.state != SUP_SAFE) sup_start(&k->sup, util_now());
    con_prompt(&k->con);
    loop(k);
    return 0; /* not reached: loop() never returns */
}
