/* gpu: see gpu.h. */
#include "boot/gpu.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "boot/ini.h"
#include "boot/modules.h"
#include "boot/util.h"

#define GPU_VENDOR 0x10de
#define GPU_CTL_MINOR 255 /* /dev/nvidiactl; GPU i is minor i */

/* A sysfs number file ("0x10de\n"); -1 when it cannot be read. */
static long read_hex(const char *dir, const char *name) {
    char path[UTIL_PATH_MAX], buf[32];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) return -1;
    if (util_read_file(path, buf, sizeof buf) < 0) return -1;
    char *end;
    long v = strtol(util_trim(buf), &end, 16);
    return end == buf || *end ? -1 : v;
}

int gpu_scan(const char *root, gpu_state *g) {
    memset(g, 0, sizeof *g);
    char dir[UTIL_PATH_MAX];
    util_join(dir, sizeof dir, root, "/sys/bus/pci/devices");
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        g->pci_seen = -1;
        snprintf(g->line, sizeof g->line, "no PCI bus to scan (%.150s: %.40s): kilnd serves from the CPU", dir, strerror(e));
        return -e;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || strlen(e->d_name) >= sizeof g->dev[0].bus) continue;
        char fn[UTIL_PATH_MAX];
        if (snprintf(fn, sizeof fn, "%s/%s", dir, e->d_name) >= (int)sizeof fn) continue;
        g->pci_seen++;
        long vendor = read_hex(fn, "vendor"), cls = read_hex(fn, "class"), dev = read_hex(fn, "device");
        if (vendor != GPU_VENDOR || cls < 0 || (cls >> 16) != 0x03) continue; /* 0x03: display */
        if (g->n < GPU_MAX) {
            gpu_dev *gd = &g->dev[g->n];
            snprintf(gd->bus, sizeof gd->bus, "%.15s", e->d_name);
            gd->device = dev < 0 ? 0 : (unsigned)dev, gd->class_code = (unsigned)cls;
        }
        g->n++;
    }
    closedir(d);
    if (!g->n)
        snprintf(g->line, sizeof g->line, "no NVIDIA GPU on the PCI bus (%d devices): kilnd serves from the CPU",
                 g->pci_seen);
    return 0;
}

/* The major /proc/devices gives a character device name; -1 when it is not there. */
static int char_major(const char *root, const char *name) {
    char path[UTIL_PATH_MAX], buf[8192];
    util_join(path, sizeof path, root, "/proc/devices");
    if (util_read_file(path, buf, sizeof buf) < 0) return -1;
    char *blk = strstr(buf, "\nBlock devices:");
    if (blk) *blk = 0; /* character devices come first */
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        int major;
        char dev[64];
        if (sscanf(line, "%d %63s", &major, dev) == 2 && !strcmp(dev, name)) return major;
    }
    return -1;
}

static int make_node(const char *root, const char *rel, int major, int minor) {
    char path[UTIL_PATH_MAX];
    if (util_join(path, sizeof path, root, rel) < 0) return -ENAMETOOLONG;
    /* 0666 as the driver's own nvidia-modprobe makes them: kilnd opens them */
    if (mknod(path, S_IFCHR | 0666, makedev((unsigned)major, (unsigned)minor)) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

/* /dev/nvidiactl, one /dev/nvidiaN per GPU, /dev/nvidia-uvm(-tools); the count made, or
 * -1 with why in g->line. */
static int make_nodes(gpu_state *g, const char *root) {
    int fe = char_major(root, "nvidia-frontend");
    if (fe < 0) fe = char_major(root, "nvidia");
    int uvm = char_major(root, "nvidia-uvm");
    if (fe < 0) {
        snprintf(g->line, sizeof g->line, "%d NVIDIA GPU(s), but the driver registered no device "
                 "(/proc/devices has no nvidia): kilnd serves from the CPU", g->n);
        return -1;
    }
    int made = 0, r = make_node(root, "/dev/nvidiactl", fe, GPU_CTL_MINOR);
    made += r == 0;
    for (int i = 0; i < g->n && i < GPU_MAX && r == 0; i++) {
        char rel[32];
        snprintf(rel, sizeof rel, "/dev/nvidia%d", i);
        made += (r = make_node(root, rel, fe, i)) == 0;
    }
    if (r == 0 && uvm >= 0) made += (r = make_node(root, "/dev/nvidia-uvm", uvm, 0)) == 0;
    if (r == 0 && uvm >= 0) made += (r = make_node(root, "/dev/nvidia-uvm-tools", uvm, 1)) == 0;
    if (r < 0) {
        snprintf(g->line, sizeof g->line, "%d NVIDIA GPU(s): cannot make their device nodes (%s): "
                 "kilnd serves from the CPU", g->n, strerror(-r));
        return -1;
    }
    return made;
}

/* No GPU on the bus, but the image has the driver: load its modules anyway, up to the first
 * that fails, as a check that they fit this kernel. Without a GPU the driver's own init says
 * so (nvidia.ko: ENODEV, "No NVIDIA GPU found" in the kernel log), which proves its symbols
 * resolved; a vermagic mismatch (ENOEXEC) or an unknown symbol (ENOENT) is a driver that
 * would not come up with a GPU either, and the line says that instead. */
static void check_driver(gpu_state *g, const char *list, const char *mod_dir) {
    mod_result mr;
    int r = mod_load_list_until_failure(list, mod_dir, &mr);
    g->loaded = r == 0 ? mr.loaded : 0, g->failed = r == 0 ? mr.failed : 0;
    char what[160];
    if (r < 0)
        snprintf(what, sizeof what, "cannot read the driver's module list (%s)", strerror(-r));
    else if (mr.failed && mr.first_err == ENODEV)
        snprintf(what, sizeof what, "the driver fits this kernel (%.60s: no device to drive)", mr.first_failed);
    else if (mr.failed)
        snprintf(what, sizeof what, "the image's driver does not load on this kernel (%.60s: %.40s)",
                 mr.first_failed, strerror(mr.first_err));
    else
        snprintf(what, sizeof what, "the driver's %d modules loaded", mr.loaded);
    snprintf(g->line, sizeof g->line, "no NVIDIA GPU on the PCI bus (%d devices); %s: kilnd serves from the CPU",
             g->pci_seen, what);
}

void gpu_bring_up(gpu_state *g, const char *root, const char *mod_dir, int load) {
    if (gpu_scan(root, g) < 0) return;
    char list[UTIL_PATH_MAX];
    util_join(list, sizeof list, root, "/etc/kiln/modules-gpu");
    struct stat st;
    g->driver = stat(list, &st) == 0;
    if (!g->n) {
        if (g->driver && load) check_driver(g, list, mod_dir);
        return;
    }
    if (!g->driver) {
        snprintf(g->line, sizeof g->line, "%d NVIDIA GPU(s) (%s, 10de:%04x), but this image carries no NVIDIA "
                 "driver (no /etc/kiln/modules-gpu): kilnd serves from the CPU",
                 g->n, g->dev[0].bus, g->dev[0].device);
        return;
    }
    if (!load) { /* test mode: no modules; the nodes when ROOT has a /proc/devices to read */
        char devs[UTIL_PATH_MAX];
        util_join(devs, sizeof devs, root, "/proc/devices");
        int made = stat(devs, &st) == 0 ? make_nodes(g, root) : 0;
        if (made >= 0) {
            g->nodes = made;
            snprintf(g->line, sizeof g->line, "%d NVIDIA GPU(s); test mode: the driver's modules are not loaded, "
                     "%d device nodes", g->n, made);
        }
        return;
    }
    mod_result mr;
    int r = mod_load_list(list, mod_dir, &mr);
    g->loaded = r == 0 ? mr.loaded : 0, g->failed = r == 0 ? mr.failed : 0;
    if (r < 0 || mr.failed) {
        snprintf(g->line, sizeof g->line, "%d NVIDIA GPU(s): the driver did not load (%s): kilnd serves from "
                 "the CPU (`log` has the module that failed)", g->n,
                 r < 0 ? strerror(-r) : "a module failed");
        return;
    }
    int made = make_nodes(g, root);
    if (made < 0) return;
    g->nodes = made;
    snprintf(g->line, sizeof g->line, "%d NVIDIA GPU(s) up: %d driver modules loaded, %d device nodes",
             g->n, g->loaded, g->nodes);
}

/* buf[at..] += text; the new length */
static size_t put(char *buf, size_t cap, size_t at, const char *fmt, const char *a, const char *b) {
    if (at >= cap) return at;
    int n = snprintf(buf + at, cap - at, fmt, a, b);
    return n < 0 ? at : at + ((size_t)n < cap - at ? (size_t)n : cap - at - 1);
}

size_t gpu_describe(const gpu_state *g, const char *root, char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = 0;
    at = put(buf, cap, at, "gpu: %s%s\n", g->line, "");
    if (g->cublas[0]) at = put(buf, cap, at, "%s%s\n", g->cublas, "");
    for (int i = 0; i < g->n && i < GPU_MAX; i++) {
        char id[64];
        snprintf(id, sizeof id, "10de:%04x, class %06x", g->dev[i].device, g->dev[i].class_code);
        at = put(buf, cap, at, "gpu %s: %s\n", g->dev[i].bus, id);
    }
    char path[UTIL_PATH_MAX], text[2048];
    util_join(path, sizeof path, root, "/proc/driver/nvidia/version");
    if (util_read_file(path, text, sizeof text) < 0) return at; /* no driver loaded */
    for (char *l = strtok(text, "\n"); l; l = strtok(NULL, "\n")) at = put(buf, cap, at, "driver: %s%s\n", l, "");
    for (int i = 0; i < g->n && i < GPU_MAX; i++) {
        char rel[96];
        snprintf(rel, sizeof rel, "/proc/driver/nvidia/gpus/%s/information", g->dev[i].bus);
        util_join(path, sizeof path, root, rel);
        if (util_read_file(path, text, sizeof text) < 0) continue;
        for (char *l = strtok(text, "\n"); l; l = strtok(NULL, "\n"))
            at = put(buf, cap, at, "gpu %s: %s\n", g->dev[i].bus, util_trim(l));
    }
    return at;
}

int gpu_pick_kilnd(const char *root, const char *ini, char *out, size_t cap, char *why, size_t wcap) {
    char backend[16] = "auto", cuda[UTIL_PATH_MAX], loader[UTIL_PATH_MAX];
    /* kilnd's own default when the key is absent; an invalid value is check-config's to refuse */
    if (ini_get(ini, "engine", "backend", backend, sizeof backend) < 0) snprintf(backend, sizeof backend, "auto");
    struct stat st;
    int have = util_join(cuda, sizeof cuda, root, GPU_KILND_CUDA) == 0 && stat(cuda, &st) == 0 && S_ISREG(st.st_mode) &&
               util_join(loader, sizeof loader, root, GPU_KILND_LOADER) == 0 && stat(loader, &st) == 0;
    int use = have && strcmp(backend, "cpu") != 0;
    snprintf(out, cap, "%s", use ? GPU_KILND_CUDA : GPU_KILND_CPU);
    if (use) snprintf(why, wcap, "the CUDA kilnd (glibc), backend = %.15s", backend);
    else if (have) snprintf(why, wcap, "the CPU kilnd (static musl): backend = cpu");
    else snprintf(why, wcap, "the CPU kilnd (static musl): this image has no CUDA kilnd");
    return use;
}

/* ------------------------------------------------------------------ cuBLAS on the data partition */

int gpu_data_lib(const char *root) {
    char dir[UTIL_PATH_MAX];
    struct stat st;
    return util_join(dir, sizeof dir, root, GPU_DATA_LIB) == 0 && stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Runs argv with no environment, its stdout and stderr into out (NUL-terminated; what does
 * not fit is dropped), for at most limit_s seconds. Its exit status (128 + the signal when
 * one ended it), or -errno: -ETIMEDOUT when it was killed at the limit. PID 1 calls this
 * before its loop reaps anything, so waiting for this one pid races with nothing. */
static int run_capture(char *const argv[], const sigset_t *mask, char *out, size_t cap, double limit_s) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) return -errno;
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(p[0]), close(p[1]);
        return -e;
    }
    if (pid == 0) { /* only async-signal-safe calls from here */
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0) dup2(null, 0);
        dup2(p[1], 1), dup2(p[1], 2);
        sigprocmask(SIG_SETMASK, mask, NULL);
        char *const env[] = {NULL};
        execve(argv[0], argv, env);
        dprintf(2, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(p[1]);
    size_t len = 0;
    int timed_out = 0;
    double end = util_now() + limit_s;
    for (;;) {
        double left = end - util_now();
        struct pollfd pf = {p[0], POLLIN, 0};
        int r = left > 0 ? poll(&pf, 1, (int)(left * 1000.0) + 1) : 0;
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            timed_out = r == 0;
            break;
        }
        char buf[1024];
        ssize_t n = read(p[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break; /* EOF: the child is done writing */
        size_t k = (size_t)n < cap - 1 - len ? (size_t)n : cap - 1 - len;
        memcpy(out + len, buf, k);
        len += k;
    }
    out[len] = 0;
    close(p[0]);
    if (timed_out) kill(pid, SIGKILL);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -errno;
    if (timed_out) return -ETIMEDOUT;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int gpu_check_cublas(const char *root, const sigset_t *child_mask, char *line, size_t cap) {
    char loader[UTIL_PATH_MAX], dir[UTIL_PATH_MAX], lib[UTIL_PATH_MAX], out[4096], why[256] = "";
    if (util_join(loader, sizeof loader, root, GPU_KILND_LOADER) < 0 || util_join(dir, sizeof dir, root, GPU_DATA_LIB) < 0 ||
        util_join(lib, sizeof lib, root, GPU_DATA_LIB "/" GPU_CUBLAS) < 0) {
        snprintf(line, cap, "WARNING: cuBLAS (%s): paths too long", GPU_DATA_LIB);
        return -ENAMETOOLONG;
    }
    char *argv[] = {loader, (char *)"--library-path", dir, (char *)"--list", lib, NULL};
    int rc = run_capture(argv, child_mask, out, sizeof out, 10.0);
    /* ld.so --list: one "name => path (address)" line per library, "name => not found"
     * for one it cannot find; libcublasLt must be the folder's (not some other copy). */
    int found = 0, lt_here = 0;
    size_t dl = strlen(dir);
    for (char *l = strtok(out, "\n"); l; l = strtok(NULL, "\n")) {
        char name[96], path[UTIL_PATH_MAX];
        if (sscanf(l, " %95s => %255s", name, path) != 2) continue;
        if (!strcmp(path, "not")) {
            if (!why[0]) snprintf(why, sizeof why, "%.80s not found", name);
            continue;
        }
        found++;
        if (!strcmp(name, "libcublasLt.so.12") && !strncmp(path, dir, dl) && path[dl] == '/') lt_here = 1;
    }
    if (!why[0] && rc == -ETIMEDOUT) snprintf(why, sizeof why, "the loader did not finish in 10 s");
    else if (!why[0] && rc < 0) snprintf(why, sizeof why, "cannot run the loader: %s", strerror(-rc));
    else if (!why[0] && rc != 0) snprintf(why, sizeof why, "the loader: exit status %d: %.200s", rc, util_trim(out));
    else if (!why[0] && !lt_here) snprintf(why, sizeof why, "libcublasLt.so.12 is not taken from %s", GPU_DATA_LIB);
    if (why[0]) {
        snprintf(line, cap, "WARNING: cuBLAS on the data partition (%s) does not load: %s: the CUDA kilnd's "
                 "cuda_prefill = cublas will fail (kiln's own kernels are not affected)", GPU_DATA_LIB, why);
        return -ENOENT;
    }
    snprintf(line, cap, "cuBLAS: %s is the CUDA kilnd's library path; the image's loader resolves %s there "
             "(%d libraries, libcublasLt.so.12 from the data partition)", GPU_DATA_LIB, GPU_CUBLAS, found);
    return 0;
}
