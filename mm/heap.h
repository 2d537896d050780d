/* heap: a bounded buddy allocator over one arena reserved at init.
 *
 * For memory whose size is not known in advance but whose total is bounded: the server's
 * per-connection and per-request buffers, and mbedTLS's per-session state. The arena is
 * one mapping made at init (MAP_NORESERVE: pages cost memory only once touched) and is
 * never grown; blocks are powers of two from MM_HEAP_MIN bytes, split on allocation and
 * merged with their buddy on free, so a freed buffer's memory serves any size later (no
 * per-size pools to drift apart). Exhaustion returns NULL: the caller refuses cleanly.
 * One thread only (the loop); nothing here takes a lock. */
#ifndef KILN_MM_HEAP_H
#define KILN_MM_HEAP_H

#include <stddef.h>
#include <stdint.h>

#define MM_HEAP_MIN 64      /* bytes: the smallest block, its 16-byte header included */
/* Under ASan the arena is poisoned as malloc's would be: past what was asked, and free
 * blocks past their header (overflows and uses after free inside it are reported). */
#define MM_HEAP_ORDERS 32   /* block sizes MM_HEAP_MIN << [0, MM_HEAP_ORDERS): 128 GiB at most */

typedef struct mm_heap_blk mm_heap_blk;

typedef struct mm_heap {
    unsigned char *base;    /* [size] the arena */
    size_t size;            /* a power of two, MM_HEAP_MIN << max_order */
    int max_order;
    mm_heap_blk *free_[MM_HEAP_ORDERS]; /* free blocks by order */
    size_t used, peak;      /* bytes in allocated blocks (whole blocks, headers included) */
    uint64_t allocs, fails; /* successful allocations, refusals (exhaustion or the hook) */
    int fail_n, fail_sticky; /* test hook, as mm_pool's */
} mm_heap;

/* 0, or -EINVAL / -ENOMEM. bytes is rounded up to a power of two. */
int mm_heap_init(mm_heap *h, size_t bytes);
void mm_heap_free_all(mm_heap *h); /* unmaps; zeroes h (a second call is a no-op) */

/* malloc's contract within the arena: 16-byte aligned, NULL when it does not fit.
 * calloc zeroes; realloc keeps the block when the new size still fits it, and on
 * failure leaves p as it was. free(NULL) is a no-op. */
void *mm_heap_alloc(mm_heap *h, size_t n);
void *mm_heap_calloc(mm_heap *h, size_t nmemb, size_t size);
void *mm_heap_realloc(mm_heap *h, void *p, size_t n);
void mm_heap_free(mm_heap *h, void *p);
int mm_heap_owns(const mm_heap *h, const void *p);
/* The largest single allocation that could succeed now. */
size_t mm_heap_largest(const mm_heap *h);
/* Consistency: every block's header and the free lists agree. 0, or -1. */
int mm_heap_check(const mm_heap *h);

/* Test hooks: fail the nth allocation from now; _from keeps failing. n <= 0: off. */
void mm_heap_fail_after(mm_heap *h, int n);
void mm_heap_fail_from(mm_heap *h, int n);

#endif
