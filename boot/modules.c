/* modules: see modules.h. */
#include "boot/modules.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "boot/logring.h"
#include "boot/util.h"

#ifndef MODULE_INIT_COMPRESSED_FILE
#define MODULE_INIT_COMPRESSED_FILE 4 /* linux/module.h since 5.17 */
#endif

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* One module file; 0 when it is in the kernel afterwards. */
static int load_one(const char *path) {
    int fd;
    do fd = open(path, O_RDONLY | O_CLOEXEC); while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        int e = errno;
        logring_say("kiln-init: module %s: open: %s", path, strerror(e));
        return -e;
    }
    unsigned flags = 0;
    if (ends_with(path, ".xz") || ends_with(path, ".zst") || ends_with(path, ".gz")) flags = MODULE_INIT_COMPRESSED_FILE;
    long r;
    do r = syscall(SYS_finit_module, fd, "", flags); while (r < 0 && errno == EINTR);
    int e = r < 0 ? errno : 0;
    close(fd);
    if (r < 0 && e != EEXIST) {
        logring_say("kiln-init: module %s: finit_module: %s", path, strerror(e));
        return -e;
    }
    logring_note("kiln-init: module %s %s", path, e == EEXIST ? "already loaded" : "loaded");
    return 0;
}

static int load_list(const char *list_path, const char *mod_dir, int stop, mod_result *res) {
    static char list[16384]; /* a few dozen paths */
    double t0 = util_now();
    memset(res, 0, sizeof *res);
    ssize_t n = util_read_file(list_path, list, sizeof list);
    if (n < 0) return (int)n;
    if ((size_t)n == sizeof list - 1) logring_say("kiln-init: %s: longer than %zu bytes, the rest is ignored", list_path, sizeof list - 1);
    for (char *line = list; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        char *name = util_trim(line);
        line = nl ? nl + 1 : NULL;
        if (!*name || *name == '#') continue;
        char path[UTIL_PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s", mod_dir, name) >= (int)sizeof path) {
            logring_say("kiln-init: module path too long: %.80s", name);
            if (!res->failed++) {
                res->first_err = ENAMETOOLONG;
                snprintf(res->first_failed, sizeof res->first_failed, "%.40s...", name);
            }
            if (stop) break;
            continue;
        }
        int r = load_one(path);
        if (r == 0) {
            res->loaded++;
            continue;
        }
        if (!res->failed++) {
            const char *base = strrchr(name, '/');
            res->first_err = -r;
            snprintf(res->first_failed, sizeof res->first_failed, "%s", base ? base + 1 : name);
        }
        if (stop) break;
    }
    res->secs = util_now() - t0;
    return 0;
}

int mod_load_list(const char *list_path, const char *mod_dir, mod_result *res) {
    return load_list(list_path, mod_dir, 0, res);
}

int mod_load_list_until_failure(const char *list_path, const char *mod_dir, mod_result *res) {
    return load_list(list_path, mod_dir, 1, res);
}
