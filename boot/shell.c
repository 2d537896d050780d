/* shell: see shell.h. One table of commands; a new command is a new row. */
#include "boot/shell.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/reboot.h>

#include "boot/ini.h"
#include "boot/logring.h"
#include "boot/sys.h"

#define SH_MAX_ARGS 8

typedef struct {
    int argc;
    char *argv[SH_MAX_ARGS];
    const char *rest[SH_MAX_ARGS]; /* the original text from argv[i] on: `config set` values keep spaces */
} sh_args;

typedef struct {
    const char *name, *usage, *help;
    int test_only;
    void (*fn)(kinit *k, sh_args *a);
} sh_cmd;

/* ------------------------------------------------------------------ relaying to kilnd */

enum { RELAY_PLAIN, RELAY_STATUS, RELAY_CONFIG_SET, RELAY_DEBUG };

/* The one relayed command in flight (the console takes no input until it ends). */
static struct {
    kinit *k;
    int kind;
    double timeout_s;
    int lines, ok, error;
    char sec[32], key[64], value[CON_LINE_MAX];
} relay;

static void persist(kinit *k, int kilnd_took_it) {
    char err[256];
    if (ini_set(k->ini, relay.sec, relay.key, relay.value, err, sizeof err) < 0) {
        con_printf(&k->con, "not saved: %s", err);
        return;
    }
    logring_note("kiln-init: config %s.%s = %s saved to %s", relay.sec, relay.key, relay.value, k->ini);
    con_printf(&k->con, "saved in %s%s", k->ini,
               kilnd_took_it ? "" : " only (kilnd is not running: it reads it at its next start; `restart`)");
    con_printf(&k->con, "note: without a data partition the file lives in RAM: the change lasts until reboot");
}

static void relay_line(void *arg, const char *line) {
    (void)arg;
    relay.lines++;
    if (!strcmp(line, "ok")) relay.ok = 1;
    if (util_starts(line, "error")) relay.error = 1;
    con_printf(&relay.k->con, "  %s", line);
}

static void relay_done(void *arg, int status) {
    (void)arg;
    kinit *k = relay.k;
    if (status == -ETIMEDOUT)
        con_printf(&k->con, "kilnd is not answering (no reply within %.0f s)", relay.timeout_s);
    else if (status < 0)
        con_printf(&k->con, "kilnd closed the control connection before answering");
    else if (relay.lines == 0 && relay.kind != RELAY_STATUS)
        con_printf(&k->con, "  (no output)");
    if (relay.kind == RELAY_CONFIG_SET && status == 0 && relay.ok && !relay.error) persist(k, 1);
    con_set_busy(&k->con, 0, util_now());
}

/* Sends cmd to kilnd; the answer is printed when it comes. 0 when it is on its way. */
static int relay_send(kinit *k, const char *cmd, int kind) {
    if (!initctl_connected(&k->ctl)) {
        con_printf(&k->con, "kilnd is not reachable (%s)", sup_state_name(k->sup.state));
        return -ENOTCONN;
    }
    relay.k = k;
    relay.kind = kind;
    /* a debug probe waits for its connect (at most 10 s) before it answers */
    relay.timeout_s = kind == RELAY_DEBUG ? SH_DEBUG_TIMEOUT_S : SH_RELAY_TIMEOUT_S;
    relay.lines = relay.ok = relay.error = 0;
    int r = initctl_request(&k->ctl, cmd, relay.timeout_s, relay_line, relay_done, NULL);
    if (r == -EBUSY) con_printf(&k->con, "the control socket is busy (a restart is being asked for); try again");
    else if (r < 0) con_printf(&k->con, "cannot send to kilnd: %s", strerror(-r));
    else con_set_busy(&k->con, 1, util_now());
    return r;
}

/* ------------------------------------------------------------------ local facts */

static void show_local(kinit *k) {
    double now = util_now();
    char buf[1024];
    if (k->sup.boot_ready_shown)
        con_printf(&k->con, "kiln-init: up %.0f s; boot to READY %.2f s%s", now - k->t0, k->sup.boot_ready_s,
                   k->halting ? "; SHUTTING DOWN" : "");
    else
        con_printf(&k->con, "kiln-init: up %.0f s; kilnd not READY yet%s", now - k->t0, k->halting ? "; SHUTTING DOWN" : "");
    sup_describe(&k->sup, now, buf, sizeof buf);
    for (char *line = buf, *nl; line; line = nl) {
        if ((nl = strchr(line, '\n'))) *nl++ = 0;
        con_printf(&k->con, "%s", line);
    }
    long total, avail;
    if (sys_meminfo(&total, &avail) == 0) con_printf(&k->con, "memory: %ld MiB available of %ld MiB", avail / 1024, total / 1024);
    if (sys_netifs(buf, sizeof buf) > 0) con_printf(&k->con, "interfaces (kernel side): %s", buf);
    con_printf(&k->con, "gpu: %s", k->gpu.line);
    if (k->gpu.cublas[0]) con_printf(&k->con, "%s", k->gpu.cublas);
    con_printf(&k->con, "watchdog: %s", wdog_describe(&k->wd, buf, sizeof buf));
    meas_describe(&k->meas, buf, sizeof buf);
    con_printf(&k->con, "%s", buf);
    id_describe(&k->id, buf, sizeof buf);
    con_printf(&k->con, "%s", buf);
    if (k->disk.data_dev[0]) {
        disk_describe(&k->disk, buf, sizeof buf);
        con_printf(&k->con, "%s", buf);
    }
}

/* ------------------------------------------------------------------ commands */

static void cmd_help(kinit *k, sh_args *a);

static void cmd_status(kinit *k, sh_args *a) {
    (void)a;
    show_local(k);
    if (!initctl_connected(&k->ctl)) {
        con_printf(&k->con, "kilnd: control socket not connected");
        return;
    }
    con_printf(&k->con, "kilnd reports:");
    relay_send(k, "status", RELAY_STATUS);
}

static void cmd_stats(kinit *k, sh_args *a) { (void)a, relay_send(k, "stats", RELAY_PLAIN); }
static void cmd_net(kinit *k, sh_args *a) { (void)a, relay_send(k, "net", RELAY_PLAIN); }

/* gpu: the bring-up's outcome, each GPU, the driver's own view once it is loaded */
static void cmd_gpu(kinit *k, sh_args *a) {
    (void)a;
    char buf[8192];
    gpu_describe(&k->gpu, k->root, buf, sizeof buf);
    for (char *line = buf, *nl; line && *line; line = nl) {
        if ((nl = strchr(line, '\n'))) *nl++ = 0;
        con_printf(&k->con, "%s", line);
    }
}

/* debug ...: kilnd's DEBUG (docs/PROTOCOL.md) with the console's positional words */
static void cmd_debug(kinit *k, sh_args *a) {
    char cmd[384]; /* room for a host name's 253 characters */
    const char *sub = a->argc > 1 ? a->argv[1] : "status";
    int n = -1;
    if (a->argc <= 2 && (!strcmp(sub, "status") || !strcmp(sub, "close") || !strcmp(sub, "open") ||
                         !strcmp(sub, "net") || !strcmp(sub, "gpu") || !strcmp(sub, "kmsg")))
        n = snprintf(cmd, sizeof cmd, "debug %s", sub);
    else if (a->argc == 3 && !strcmp(sub, "open"))
        n = snprintf(cmd, sizeof cmd, "debug open minutes=%.8s", a->argv[2]);
    else if (a->argc == 3 && !strcmp(sub, "kmsg") && atoi(a->argv[2]) <= SH_DEBUG_KMSG_MAX)
        n = snprintf(cmd, sizeof cmd, "debug kmsg lines=%.8s", a->argv[2]);
    else if ((a->argc == 4 || a->argc == 5) && !strcmp(sub, "probe"))
        n = snprintf(cmd, sizeof cmd, "debug probe host=%s port=%.8s%s%.8s", a->argv[2], a->argv[3],
                     a->argc == 5 ? " timeout_ms=" : "", a->argc == 5 ? a->argv[4] : "");
    if (n < 0 || (size_t)n >= sizeof cmd || strpbrk(cmd + 6, "\"")) {
        con_printf(&k->con, "usage: debug [open [MINUTES] | close | net | kmsg [LINES <= %d] | gpu | probe HOST PORT [TIMEOUT_MS]]",
                   SH_DEBUG_KMSG_MAX);
        return;
    }
    relay_send(k, cmd, RELAY_DEBUG);
}

static void cmd_drain(kinit *k, sh_args *a) {
    if (a->argc == 2 && !strcmp(a->argv[1], "off")) relay_send(k, "drain off", RELAY_PLAIN);
    else if (a->argc == 1) relay_send(k, "drain", RELAY_PLAIN);
    else con_printf(&k->con, "usage: drain [off]");
}

static void cmd_log(kinit *k, sh_args *a) {
    int n = 20;
    if (a->argc > 1) {
        char *end;
        long v = strtol(a->argv[1], &end, 10);
        if (*end || v <= 0) {
            con_printf(&k->con, "usage: log [n]   (n > 0; the last %d lines are kept)", LOGRING_LINES);
            return;
        }
        n = v > LOGRING_LINES ? LOGRING_LINES : (int)v;
    }
    int count = logring_count(), first = count > n ? count - n : 0;
    for (int i = first; i < count; i++) con_printf(&k->con, "%s", logring_line(i));
}

static void cmd_restart(kinit *k, sh_args *a) {
    (void)a;
    char msg[200];
    sup_restart(&k->sup, util_now(), msg, sizeof msg);
    logring_note("kiln-init: console restart: %s", msg);
    con_printf(&k->con, "kiln: %s", msg);
}

static void cmd_reboot(kinit *k, sh_args *a) { (void)a, kinit_halt(k, RB_AUTOBOOT, "console"); }
static void cmd_poweroff(kinit *k, sh_args *a) { (void)a, kinit_halt(k, RB_POWER_OFF, "console"); }

static void config_get(kinit *k, const char *sec, const char *key) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "config get %s.%s", sec, key);
    if (initctl_connected(&k->ctl)) {
        relay_send(k, cmd, RELAY_PLAIN);
        return;
    }
    char v[256];
    int r = ini_get(k->ini, sec, key, v, sizeof v);
    if (r == 0) con_printf(&k->con, "%s.%s = %s   (from %s; kilnd is not running)", sec, key, v, k->ini);
    else if (r == -ENOENT) con_printf(&k->con, "%s.%s is not in %s (kilnd's default applies)", sec, key, k->ini);
    else con_printf(&k->con, "cannot read %s: %s", k->ini, strerror(-r));
}

static void config_set(kinit *k, const char *sec, const char *key, const char *value) {
    snprintf(relay.sec, sizeof relay.sec, "%s", sec);
    snprintf(relay.key, sizeof relay.key, "%s", key);
    snprintf(relay.value, sizeof relay.value, "%s", value);
    util_trim(relay.value); /* starts at a non-blank: only the end changes */
    if (!initctl_connected(&k->ctl)) {
        /* Safe mode's way out: fix the file, then `restart` (check-config reads it). */
        persist(k, 0);
        return;
    }
    char cmd[CON_LINE_MAX + 32];
    snprintf(cmd, sizeof cmd, "config set %s.%s %s", sec, key, value);
    relay_send(k, cmd, RELAY_CONFIG_SET);
}

static void cmd_config(kinit *k, sh_args *a) {
    char sec[32], key[64];
    int get = a->argc == 3 && !strcmp(a->argv[1], "get");
    int set = a->argc >= 4 && !strcmp(a->argv[1], "set");
    if ((!get && !set) || ini_split_name(a->argv[2], sec, sizeof sec, key, sizeof key) < 0) {
        con_printf(&k->con, "usage: config get SECTION.KEY | config set SECTION.KEY VALUE");
        return;
    }
    if (get) config_get(k, sec, key);
    else config_set(k, sec, key, a->rest[3]);
}

static void test_signal(kinit *k, int sig, const char *what) {
    int r = sup_test_signal(&k->sup, sig);
    if (r < 0) con_printf(&k->con, "no kilnd to %s: %s", what, strerror(-r));
    else con_printf(&k->con, "kiln: test: sent %s to kilnd (pid %d)", sig == SIGKILL ? "SIGKILL" : "SIGSTOP", (int)k->sup.pid);
    logring_note("kiln-init: test: %s kilnd", what);
}

static void cmd_test_kill(kinit *k, sh_args *a) { (void)a, test_signal(k, SIGKILL, "kill"); }
static void cmd_test_hang(kinit *k, sh_args *a) { (void)a, test_signal(k, SIGSTOP, "hang"); }

static void cmd_version(kinit *k, sh_args *a) {
    (void)a;
    char buf[512];
    disk_version(&k->disk, buf, sizeof buf);
    for (char *line = buf, *nl; line; line = nl) {
        if ((nl = strchr(line, '\n'))) *nl++ = 0;
        con_printf(&k->con, "%s", line);
    }
}

static void cmd_slot(kinit *k, sh_args *a) {
    if (a->argc == 1) {
        cmd_version(k, a);
        return;
    }
    if (a->argc != 2 || (strcmp(a->argv[1], "a") && strcmp(a->argv[1], "b"))) {
        con_printf(&k->con, "usage: slot [a|b]");
        return;
    }
    char msg[300];
    int slot = a->argv[1][0] - 'a';
    char why[300];
    if (disk_switch(&k->disk, slot, msg, sizeof msg) == 0 && id_seal_slot(&k->id, slot, why, sizeof why) < 0)
        con_printf(&k->con, "kiln: WARNING: %s: slot %c will not unseal the identity (safe mode there)", why, a->argv[1][0]);
    logring_note("kiln-init: console slot %s: %s", a->argv[1], msg);
    con_printf(&k->con, "%s", msg);
}

/* `identity`: the identity's state; `identity enrol`: seal the provisioned one in place of
 * this box's (a new key or tokens, or a moved disk whose sealed identity does not load
 * here), then start kilnd with it: this boot's safe mode, if that was its cause, ends. */
static void cmd_identity(kinit *k, sh_args *a) {
    char msg[400], r[200];
    if (a->argc == 1) {
        id_describe(&k->id, msg, sizeof msg);
        con_printf(&k->con, "%s", msg);
        return;
    }
    if (a->argc != 2 || strcmp(a->argv[1], "enrol")) {
        con_printf(&k->con, "usage: identity [enrol]");
        return;
    }
    int e = id_enrol(&k->id, &k->disk, &k->meas, msg, sizeof msg);
    logring_note("kiln-init: console identity enrol: %s", msg);
    con_printf(&k->con, "kiln: %s", msg);
    if (e < 0) return;
    sup_unhold(&k->sup);
    sup_restart(&k->sup, util_now(), r, sizeof r);
    con_printf(&k->con, "kiln: %s", r);
}

static const sh_cmd commands[] = {
    {"help", "help", "this list", 0, cmd_help},
    {"status", "status", "kilnd's state, restarts, memory, interfaces, watchdog; then kilnd's own status", 0, cmd_status},
    {"stats", "stats", "kilnd's STATS line", 0, cmd_stats},
    {"log", "log [n]", "the last n lines (default 20) of kilnd's output and kiln-init's messages", 0, cmd_log},
    {"drain", "drain [off]", "stop taking new requests (running ones finish); `off` resumes", 0, cmd_drain},
    {"restart", "restart", "restart kilnd gracefully (leaves safe mode)", 0, cmd_restart},
    {"config", "config get S.K | config set S.K V", "read or change a setting (set also saves kiln.ini)", 0, cmd_config},
    {"net", "net", "kilnd's address, MAC, link state, counters", 0, cmd_net},
    {"gpu", "gpu", "the NVIDIA GPUs on the PCI bus and their driver: what kiln-init brought up", 0, cmd_gpu},
    {"debug", "debug [open [MIN] | close | net | kmsg [N] | gpu | probe HOST PORT [MS]]",
     "diagnostics, logged, while a window of MIN minutes (default 15, at most 60) is open", 0, cmd_debug},
    {"version", "version", "the running slot and version, and the other slot's", 0, cmd_version},
    {"identity", "identity [enrol]", "the TLS key and tokens: sealed, unsealed or not; `enrol`: seal the provisioned ones in their place",
     0, cmd_identity},
    {"slot", "slot [a|b]", "which slot runs; `slot b`: verify slot b's signed image, boot it next (then `reboot`)", 0, cmd_slot},
    {"reboot", "reboot", "drain kilnd, then reboot", 0, cmd_reboot},
    {"poweroff", "poweroff", "drain kilnd, then power off", 0, cmd_poweroff},
    {"test-kill-kilnd", "test-kill-kilnd", "(test) SIGKILL kilnd", 1, cmd_test_kill},
    {"test-hang-kilnd", "test-hang-kilnd", "(test) SIGSTOP kilnd: its heartbeat stops", 1, cmd_test_hang},
};

static void cmd_help(kinit *k, sh_args *a) {
    (void)a;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (commands[i].test_only && !k->test_cmds) continue;
        con_printf(&k->con, "  %-36s %s", commands[i].usage, commands[i].help);
    }
}

static void split(char *line, sh_args *a, const char *orig) {
    a->argc = 0;
    char *p = line;
    while (*p && a->argc < SH_MAX_ARGS) {
        while (*p == ' ' || *p == '\t') p++;
        if (!*p) break;
        a->rest[a->argc] = orig + (p - line);
        a->argv[a->argc++] = p;
        while (*p && *p != ' ' && *p != '\t') p++;
        if (*p) *p++ = 0;
    }
}

void sh_run(kinit *k, char *line) {
    char orig[CON_LINE_MAX];
    snprintf(orig, sizeof orig, "%s", line);
    sh_args a;
    split(line, &a, orig);
    if (a.argc == 0) return;
    logring_note("kiln-init: console: %.200s", orig);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        const sh_cmd *c = &commands[i];
        if (strcmp(c->name, a.argv[0]) || (c->test_only && !k->test_cmds)) continue;
        c->fn(k, &a);
        return;
    }
    con_printf(&k->con, "unknown command `%.40s`; `help` lists them", a.argv[0]);
}
