/* update: see update.h. */
#include "net/update.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int upd_init(upd *u, const char *spec) {
    memset(u, 0, sizeof *u);
    u->fd = -1;
    if (!spec || !spec[0]) return 0;
    if ((spec[0] != 'a' && spec[0] != 'b') || spec[1] != ':' || !spec[2] || strlen(spec + 2) >= sizeof u->dev)
        return -EINVAL;
    u->slot = spec[0];
    memcpy(u->dev, spec + 2, strlen(spec + 2) + 1);
    return 0;
}

int upd_enabled(const upd *u) { return u->slot != 0; }
int upd_busy(const upd *u) { return u->fd >= 0; }

int upd_open(upd *u, uint64_t size, const uint8_t sha256[32], char *err, size_t cap) {
    if (!u->slot) return snprintf(err, cap, "no slot to update (not booted from an A/B disk image)"), -ENODEV;
    if (u->fd >= 0) return snprintf(err, cap, "another update is in progress"), -EBUSY;
    int fd = open(u->dev, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return snprintf(err, cap, "open %s: %s", u->dev, strerror(errno)), -errno;
    off_t end = lseek(fd, 0, SEEK_END); /* a partition's size; a stand-in file's too */
    if (end < 0) {
        int e = errno;
        close(fd);
        return snprintf(err, cap, "%s: size: %s", u->dev, strerror(e)), -e;
    }
    u->cap = (uint64_t)end;
    if (size > u->cap) {
        close(fd);
        return snprintf(err, cap, "%llu bytes do not fit slot %c (%llu bytes)", (unsigned long long)size, u->slot,
                        (unsigned long long)u->cap), -EFBIG;
    }
    u->fd = fd, u->size = size, u->done = 0;
    memcpy(u->want, sha256, 32);
    mbedtls_sha256_init(&u->sha);
    mbedtls_sha256_starts(&u->sha, 0);
    return 0;
}

int upd_write(upd *u, const void *buf, size_t n, char *err, size_t cap) {
    if (u->fd < 0 || n > u->size - u->done) return snprintf(err, cap, "write past the announced size"), -EINVAL;
    mbedtls_sha256_update(&u->sha, buf, n);
    for (size_t put = 0; put < n;) {
        ssize_t r = pwrite(u->fd, (const char *)buf + put, n - put, (off_t)(u->done + put));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return snprintf(err, cap, "write %s: %s", u->dev, r < 0 ? strerror(errno) : "no progress"), r < 0 ? -errno : -EIO;
        put += (size_t)r;
    }
    u->done += n;
    return 0;
}

static void upd_close(upd *u) {
    if (u->fd >= 0) close(u->fd);
    u->fd = -1;
    mbedtls_sha256_free(&u->sha);
}

int upd_finish(upd *u, char *err, size_t cap) {
    uint8_t got[32];
    int r = 0;
    mbedtls_sha256_finish(&u->sha, got);
    /* EINVAL: a stand-in that cannot be synced; the block device can */
    if (fdatasync(u->fd) < 0 && errno != EINVAL) r = -errno, snprintf(err, cap, "fdatasync %s: %s", u->dev, strerror(errno));
    else if (memcmp(got, u->want, 32)) r = -EBADMSG, snprintf(err, cap, "sha256 of the %llu bytes received differs from the one announced",
                                                              (unsigned long long)u->done);
    upd_close(u);
    return r;
}

void upd_abort(upd *u) { upd_close(u); }
