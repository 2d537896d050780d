/* bundle: see bundle.h. */
#include "image/bundle.h"
#include "image/img_err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK (1u << 20)

static uint64_t align_up(uint64_t x) { return (x + BUN_ALIGN - 1) / BUN_ALIGN * BUN_ALIGN; }

uint64_t bun_part_offset(const man_manifest *m, int i) {
    uint64_t off = BUN_HEAD;
    for (int j = 0; j < i; j++) off = align_up(off + m->parts[j].size);
    return off;
}

uint64_t bun_length(const man_manifest *m) {
    if (m->nparts == 0) return BUN_HEAD;
    const man_part *last = &m->parts[m->nparts - 1];
    return bun_part_offset(m, m->nparts - 1) + last->size;
}

static int read_full(int fd, void *buf, size_t n, uint64_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -errno;
        if (r == 0) return -ENODATA; /* short: the file ends */
        got += (size_t)r;
    }
    return 0;
}

int bun_read_manifest(int fd, uint64_t off, man_manifest *m, char *text, char *err, size_t cap) {
    char block[BUN_HEAD];
    int r = read_full(fd, block, sizeof block, off);
    if (r == -ENODATA) return img_fail(err, cap, -EINVAL, "bundle: shorter than its %d-byte manifest block", BUN_HEAD);
    if (r < 0) return img_fail(err, cap, r, "bundle: read: %s", strerror(-r));
    size_t len = strnlen(block, sizeof block);
    if (len == sizeof block) return img_fail(err, cap, -EINVAL, "bundle: no NUL in the manifest block (not a kiln bundle)");
    for (size_t i = len; i < sizeof block; i++)
        if (block[i]) return img_fail(err, cap, -EINVAL, "bundle: stray bytes after the manifest in its block");
    if (len > MAN_MAX) return img_fail(err, cap, -EINVAL, "bundle: manifest longer than %d bytes", MAN_MAX);
    memcpy(text, block, len);
    text[len] = 0;
    return man_parse(text, len, m, err, cap);
}

int bun_hash_range(int fd, uint64_t off, uint64_t n, uint8_t out[32], char *err, size_t cap) {
    char *buf = malloc(CHUNK);
    if (!buf) return img_fail(err, cap, -ENOMEM, "bundle: out of memory");
    man_sha s;
    man_sha_init(&s);
    int r = 0;
    while (n) {
        size_t k = n < CHUNK ? (size_t)n : CHUNK;
        if ((r = read_full(fd, buf, k, off)) < 0) break;
        man_sha_update(&s, buf, k);
        off += k;
        n -= k;
    }
    man_sha_final(&s, out);
    free(buf);
    if (r == -ENODATA) return img_fail(err, cap, -EINVAL, "bundle: truncated (the data ends before the part does)");
    if (r < 0) return img_fail(err, cap, r, "bundle: read: %s", strerror(-r));
    return 0;
}

int bun_check_copy(int fd, const man_part *p, char *err, size_t cap) {
    struct stat st;
    if (fstat(fd, &st) < 0) return img_fail(err, cap, -errno, "copy of `%s`: fstat: %s", p->name, strerror(errno));
    if (S_ISREG(st.st_mode) && (uint64_t)st.st_size != p->size)
        return img_fail(err, cap, -EPERM, "copy of `%s`: %llu bytes, the signed manifest says %llu", p->name,
                    (unsigned long long)st.st_size, (unsigned long long)p->size);
    uint8_t h[32];
    int r = bun_hash_range(fd, 0, p->size, h, err, cap);
    if (r < 0) return r;
    if (memcmp(h, p->sha256, 32))
        return img_fail(err, cap, -EPERM, "copy of `%s`: sha256 differs from the signed manifest (tampered or corrupt)", p->name);
    return 0;
}

int bun_write(int fd, const void *buf, size_t n, uint64_t off) {
    size_t put = 0;
    while (put < n) {
        ssize_t r = pwrite(fd, (const char *)buf + put, n - put, (off_t)(off + put));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return r < 0 ? -errno : -EIO;
        put += (size_t)r;
    }
    return 0;
}

int bun_copy(int src, uint64_t soff, int dst, uint64_t doff, uint64_t n, char *err, size_t cap) {
    char *a = malloc(CHUNK), *b = malloc(CHUNK);
    int r = a && b ? 0 : -ENOMEM;
    const char *what = "out of memory";
    for (uint64_t done = 0; !r && done < n; done += CHUNK) {
        size_t k = n - done < CHUNK ? (size_t)(n - done) : CHUNK;
        if ((r = read_full(src, a, k, soff + done)) < 0) what = "read";
        else if ((r = bun_write(dst, a, k, doff + done)) < 0) what = "write";
    }
    /* EINVAL: a file or device that cannot be synced (a pipe, some test setups) */
    if (!r && fdatasync(dst) < 0 && errno != EINVAL) r = -errno, what = "fdatasync";
    for (uint64_t done = 0; !r && done < n; done += CHUNK) { /* read back */
        size_t k = n - done < CHUNK ? (size_t)(n - done) : CHUNK;
        if ((r = read_full(src, a, k, soff + done)) < 0 || (r = read_full(dst, b, k, doff + done)) < 0) what = "read back";
        else if (memcmp(a, b, k)) {
            free(a), free(b);
            return img_fail(err, cap, -EIO, "read back differs near byte %llu", (unsigned long long)done);
        }
    }
    free(a), free(b);
    if (r == -ENODATA) return img_fail(err, cap, -EIO, "%s: the data ends early", what);
    return r < 0 ? img_fail(err, cap, r, "%s: %s", what, strerror(-r)) : 0;
}

int bun_verify(int fd, uint64_t off, uint64_t limit, const uint8_t pub[MAN_PUB_LEN], man_manifest *m, char *err, size_t cap) {
    char text[MAN_MAX + 1];
    int r = bun_read_manifest(fd, off, m, text, err, cap);
    if (r < 0) return r;
    if ((r = man_verify(m, text, pub, err, cap)) < 0) return r;
    for (int i = 0; i < m->nparts; i++)
        if (m->parts[i].size > (UINT64_MAX / 4)) return img_fail(err, cap, -EINVAL, "bundle: part `%s` too large", m->parts[i].name);
    if (limit && bun_length(m) > limit)
        return img_fail(err, cap, -EFBIG, "bundle: %llu bytes, more than the %llu there is room for",
                    (unsigned long long)bun_length(m), (unsigned long long)limit);
    for (int i = 0; i < m->nparts; i++) {
        const man_part *p = &m->parts[i];
        uint8_t h[32];
        if ((r = bun_hash_range(fd, off + bun_part_offset(m, i), p->size, h, err, cap)) < 0) return r;
        if (memcmp(h, p->sha256, 32))
            return img_fail(err, cap, -EPERM, "bundle: part `%s`: sha256 differs from the signed manifest (tampered or corrupt)", p->name);
    }
    return 0;
}
