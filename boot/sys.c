/* sys: see sys.h. */
#include "boot/sys.h"

#include <dirent.h>
#include <errno.h>
#include <net/if.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "boot/logring.h"
#include "boot/util.h"

/* ------------------------------------------------------------------ filesystems */

static const struct mnt {
    const char *src, *dir, *type;
    unsigned long flags;
    const char *data;
} mounts[] = {
    {"proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL},
    {"sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL},
    {"devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755"},
    {"tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755"},
    {"tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777"},
};

/* mkdir that accepts an existing directory. */
static int mkdir_ok(const char *dir, mode_t mode) {
    if (mkdir(dir, mode) == 0 || errno == EEXIST) return 0;
    int e = errno;
    logring_say("kiln-init: mkdir %s: %s", dir, strerror(e));
    return -e;
}

int sys_mount_all(void) {
    int failed = 0;
    for (size_t i = 0; i < sizeof mounts / sizeof mounts[0]; i++) {
        const struct mnt *m = &mounts[i];
        if (mkdir_ok(m->dir, 0755) < 0) { failed++; continue; }
        /* EBUSY: already mounted (a kernel with CONFIG_DEVTMPFS_MOUNT, or a second run). */
        if (mount(m->src, m->dir, m->type, m->flags, m->data) < 0 && errno != EBUSY) {
            logring_say("kiln-init: mount %s on %s: %s", m->type, m->dir, strerror(errno));
            failed++;
        }
    }
    if (mkdir_ok("/run/kiln", 0755) < 0) failed++;
    return failed;
}

/* ------------------------------------------------------------------ command line, hostname */

int sys_cmdline_get(const char *cmdline, const char *key, char *out, size_t cap) {
    size_t kl = strlen(key);
    const char *p = cmdline;
    while (*p) {
        while (*p == ' ' || *p == '\n' || *p == '\t') p++;
        const char *w = p;
        while (*p && *p != ' ' && *p != '\n' && *p != '\t') p++;
        size_t wl = (size_t)(p - w);
        if (wl > kl && !strncmp(w, key, kl) && w[kl] == '=') {
            size_t vl = wl - kl - 1;
            if (vl >= cap) vl = cap - 1;
            memcpy(out, w + kl + 1, vl);
            out[vl] = 0;
            return 1;
        }
        if (wl == kl && !strncmp(w, key, kl)) { /* a bare flag: "kiln.test" */
            snprintf(out, cap, "1");
            return 1;
        }
    }
    return 0;
}

int sys_hostname_ok(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > 63 || name[0] == '-' || name[0] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.')) return 0;
    }
    return 1;
}

int sys_set_hostname(const char *name) {
    if (sethostname(name, strlen(name)) < 0) {
        int e = errno;
        logring_say("kiln-init: sethostname %s: %s", name, strerror(e));
        return -e;
    }
    return 0;
}

/* ------------------------------------------------------------------ interfaces */

int sys_if_up(const char *ifname) {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) {
        int e = errno;
        logring_say("kiln-init: socket for %s: %s", ifname, strerror(e));
        return -e;
    }
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", ifname);
    int r = 0;
    if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0) {
        r = -errno; /* ENODEV: not there (yet); the caller decides whether that is an error */
    } else if (!(ifr.ifr_flags & IFF_UP)) {
        ifr.ifr_flags |= IFF_UP;
        if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0) {
            r = -errno;
            logring_say("kiln-init: SIOCSIFFLAGS %s up: %s", ifname, strerror(-r));
        }
    }
    close(s);
    return r;
}

int sys_ipv6_off(const char *ifname) {
    char path[UTIL_PATH_MAX];
    snprintf(path, sizeof path, "/proc/sys/net/ipv6/conf/%s/disable_ipv6", ifname);
    int r = util_write_file(path, "1\n");
    /* ENOENT: a kernel without IPv6 holds no IPv6 address either. */
    if (r < 0 && r != -ENOENT) logring_say("kiln-init: write %s: %s", path, strerror(-r));
    return r == -ENOENT ? 0 : r;
}

/* ------------------------------------------------------------------ facts for `status` */

int sys_meminfo(long *total_kib, long *avail_kib) {
    static char buf[4096]; /* the first lines are all we need */
    ssize_t n = util_read_file("/proc/meminfo", buf, sizeof buf);
    if (n < 0) return (int)n;
    *total_kib = *avail_kib = -1;
    for (char *line = buf; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        if (util_starts(line, "MemTotal:")) *total_kib = strtol(line + 9, NULL, 10);
        if (util_starts(line, "MemAvailable:")) *avail_kib = strtol(line + 13, NULL, 10);
        line = nl ? nl + 1 : NULL;
    }
    return *total_kib >= 0 ? 0 : -EINVAL;
}

double sys_uptime(void) {
    char buf[64];
    if (util_read_file("/proc/uptime", buf, sizeof buf) < 0) return -1;
    return strtod(buf, NULL);
}

int sys_netifs(char *out, size_t cap) {
    DIR *d = opendir("/sys/class/net");
    if (!d) return -errno;
    size_t used = 0;
    out[0] = 0;
    int shown = 0;
    struct dirent *e;
    while ((e = readdir(d)) && shown < 8) { /* a box has a few NICs; bound the line anyway */
        if (e->d_name[0] == '.') continue;
        char path[UTIL_PATH_MAX], mac[32] = "?", state[16] = "?";
        snprintf(path, sizeof path, "/sys/class/net/%.64s/address", e->d_name);
        if (util_read_file(path, mac, sizeof mac) < 0) snprintf(mac, sizeof mac, "?");
        snprintf(path, sizeof path, "/sys/class/net/%.64s/operstate", e->d_name);
        if (util_read_file(path, state, sizeof state) < 0) snprintf(state, sizeof state, "?");
        int n = snprintf(out + used, cap - used, "%s%s %s %s", shown ? ", " : "", e->d_name, util_trim(mac), util_trim(state));
        if (n < 0 || (size_t)n >= cap - used) break;
        used += (size_t)n;
        shown++;
    }
    closedir(d);
    return shown;
}

/* ------------------------------------------------------------------ the end */

static void reap_all(void) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {}
}

void sys_kill_all(double grace_s) {
    /* kill(-1) reaches every process but PID 1 itself. */
    if (kill(-1, SIGTERM) < 0 && errno != ESRCH) logring_say("kiln-init: kill(-1, SIGTERM): %s", strerror(errno));
    double end = util_now() + grace_s;
    while (util_now() < end) {
        reap_all();
        if (kill(-1, 0) < 0 && errno == ESRCH) return; /* nobody left */
        util_sleep(0.05);
    }
    if (kill(-1, SIGKILL) < 0 && errno != ESRCH) logring_say("kiln-init: kill(-1, SIGKILL): %s", strerror(errno));
    util_sleep(0.1);
    reap_all();
}
