/* pool: the pinned arena (see pool.h). */
#include "mm/pool.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---------------------------------------------------------------- default host ops */

static size_t page_round(size_t bytes) {
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096;
    if (bytes > SIZE_MAX - (page - 1)) return 0;
    return (bytes + page - 1) / page * page;
}

static void *host_map(size_t bytes, int *locked, char *err, size_t errlen) {
    size_t len = page_round(bytes);
    *locked = 0;
    if (len == 0) {
        snprintf(err, errlen, "mmap %zu bytes: size overflows", bytes);
        return NULL;
    }
    void *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        snprintf(err, errlen, "mmap %zu bytes: %s", len, strerror(errno));
        return NULL;
    }
    /* Huge pages where the kernel gives them (THP "madvise" mode, as on these hosts):
     * attention reads KV blocks scattered through the pool, each on its own 4 KB page
     * otherwise, and a page walk per block read. Advice only: ignored where not
     * available. */
    madvise(base, len, MADV_HUGEPAGE);
    /* Pinning is best effort: under a low RLIMIT_MEMLOCK the arena still works, only
     * slower to DMA from and swappable. The caller reports locked=0. */
    *locked = mlock(base, len) == 0;
    return base;
}

static void host_unmap(void *base, size_t bytes) {
    size_t len = page_round(bytes);
    munlock(base, len); /* harmless when it was never locked */
    munmap(base, len);
}

const mm_pool_ops mm_pool_host_ops = {"host-mmap", host_map, host_unmap};

/* ---------------------------------------------------------------- the arena */

int mm_pool_init(mm_pool *p, size_t bytes, const mm_pool_ops *ops) {
    memset(p, 0, sizeof *p);
    p->ops = ops ? ops : &mm_pool_host_ops;
    if (bytes == 0) {
        snprintf(p->err, sizeof p->err, "mm_pool: size 0");
        return -EINVAL;
    }
    int locked = 0;
    void *base = p->ops->map(bytes, &locked, p->err, sizeof p->err);
    if (!base) {
        if (!p->err[0])
            snprintf(p->err, sizeof p->err, "%s: map %zu bytes failed", p->ops->name, bytes);
        return -ENOMEM;
    }
    p->base = base;
    p->size = bytes;
    p->locked = locked;
    return 0;
}

/* The fail hook counts every call, so an OOM loop can walk them one by one. */
static int fail_hook_fires(mm_pool *p) {
    if (p->fail_n <= 0) return 0;
    if (--p->fail_n > 0) return 0;
    if (p->fail_sticky) p->fail_n = 1; /* stays armed: the next call fires too */
    return 1;
}

void *mm_pool_alloc(mm_pool *p, size_t bytes, size_t align) {
    if (align == 0) align = 16;
    if ((align & (align - 1)) != 0 || align > MM_POOL_MAX_ALIGN) return NULL;
    if (!p->base || fail_hook_fires(p)) return NULL;
    /* Align the address, not the offset: a plugged-in map need not return pages. */
    uintptr_t at = (uintptr_t)p->base + p->used;
    size_t off = p->used + (size_t)((align - (at & (align - 1))) & (align - 1));
    if (off > p->size || bytes > p->size - off) return NULL;
    p->used = off + bytes;
    return p->base + off;
}

size_t mm_pool_used(const mm_pool *p) { return p->used; }
size_t mm_pool_size(const mm_pool *p) { return p->size; }

void mm_pool_free(mm_pool *p) {
    if (p->base && p->ops) p->ops->unmap(p->base, p->size);
    memset(p, 0, sizeof *p);
}

void mm_pool_fail_after(mm_pool *p, int n) {
    p->fail_n = n > 0 ? n : 0;
    p->fail_sticky = 0;
}

void mm_pool_fail_from(mm_pool *p, int n) {
    p->fail_n = n > 0 ? n : 0;
    p->fail_sticky = n > 0;
}
