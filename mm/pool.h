/* pool: the pinned arena, carved once at start-up.
 *
 * One mapping is made at init (mmap + mlock by default; the CUDA backend plugs in
 * cuMemHostAlloc through mm_pool_ops) and handed out by bump allocation. Nothing is
 * ever returned piecemeal: the arena lives as long as the engine, so there is no
 * fragmentation and no allocation on any hot path. */
#ifndef KILN_MM_POOL_H
#define KILN_MM_POOL_H

#include <stddef.h>

#define MM_POOL_MAX_ALIGN 4096

/* How the arena's memory is obtained. map returns the base (any alignment) or NULL with
 * a message in err; *locked says whether the pages are pinned (an unpinned arena still
 * works, the caller decides whether to warn). */
typedef struct {
    const char *name;
    void *(*map)(size_t bytes, int *locked, char *err, size_t errlen);
    void (*unmap)(void *base, size_t bytes);
} mm_pool_ops;

typedef struct {
    const mm_pool_ops *ops;
    unsigned char *base; /* [size] */
    size_t size;         /* bytes usable, as asked at init */
    size_t used;         /* bump cursor, bytes from base */
    int locked;          /* 1 when the pages are pinned (mlock succeeded) */
    int fail_n;          /* test hook: allocations left before a forced failure; <=0 off */
    int fail_sticky;     /* keep failing after the first forced failure */
    char err[128];       /* why init failed */
} mm_pool;

/* The default ops: anonymous mmap, then mlock; when mlock fails (RLIMIT_MEMLOCK) the
 * arena is kept unlocked and locked=0. Logs nothing. */
extern const mm_pool_ops mm_pool_host_ops;

/* 0, or -EINVAL (bytes 0) / -ENOMEM with p->err set. ops NULL = mm_pool_host_ops. */
int mm_pool_init(mm_pool *p, size_t bytes, const mm_pool_ops *ops);
/* Bump allocation; align is a power of two up to MM_POOL_MAX_ALIGN (0 = 16). NULL when
 * the arena is exhausted, align is invalid, or the fail hook fires. Memory is never
 * reused; with the host ops it starts zeroed (other ops: not promised). */
void *mm_pool_alloc(mm_pool *p, size_t bytes, size_t align);
size_t mm_pool_used(const mm_pool *p);
size_t mm_pool_size(const mm_pool *p);
/* Unmaps; the struct is zeroed, so a second call is a no-op. */
void mm_pool_free(mm_pool *p);

/* Test hooks (the SQLite OOM loop): fail the nth allocation from now (n = 1: the next);
 * fail_after fails that one only, fail_from it and every later one. n <= 0: off. */
void mm_pool_fail_after(mm_pool *p, int n);
void mm_pool_fail_from(mm_pool *p, int n);

#endif
