/* heap: the bounded buddy allocator (see heap.h). */
#include "mm/heap.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

/* Under ASan the arena is annotated as its allocator would be: a block's bytes past what
 * was asked for, and free blocks past their header, are poisoned, so an overflow or a use
 * after free inside the heap is reported as with malloc. Block headers stay addressable
 * (the allocator reads its buddies' headers). */
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* Every block starts with this 16-byte header, its data right after. A free block's list
 * links are block indices (offset / MM_HEAP_MIN), so they fit in the header too and
 * everything past it can be poisoned. */
struct mm_heap_blk {
    uint32_t tag;           /* HEAP_FREE or HEAP_USED */
    uint32_t order;         /* its size: MM_HEAP_MIN << order */
    union {
        uint64_t asked;     /* allocated: bytes asked for (realloc copies these) */
        struct { uint32_t next, prev; } l; /* free: the order's list, HEAP_NIL ends it */
    } u;
};
#define HEAP_HDR 16
#define HEAP_NIL UINT32_MAX
#define HEAP_FREE 0x46524545u
#define HEAP_USED 0x55534544u
#define HEAP_PAGE 4096             /* the header's page stays (it is written again at once) */
#define HEAP_RELEASE (256u << 10)  /* freed blocks this big are given back to the kernel */
_Static_assert(sizeof(mm_heap_blk) == HEAP_HDR, "one header for free and allocated blocks");
_Static_assert(((uint64_t)MM_HEAP_MIN << (MM_HEAP_ORDERS - 1)) / MM_HEAP_MIN < HEAP_NIL, "indices fit the links");

/* ---------------------------------------------------------------- free lists */

static uint32_t blk_idx(const mm_heap *h, const mm_heap_blk *b) {
    return b ? (uint32_t)(((const unsigned char *)b - h->base) / MM_HEAP_MIN) : HEAP_NIL;
}

static mm_heap_blk *blk_at(const mm_heap *h, uint32_t i) {
    return i == HEAP_NIL ? NULL : (mm_heap_blk *)(h->base + (size_t)i * MM_HEAP_MIN);
}

static void list_push(mm_heap *h, mm_heap_blk *b, int order) {
    UNPOISON(b, sizeof *b);
    b->tag = HEAP_FREE, b->order = (uint32_t)order;
    mm_heap_blk *head = h->free_[order];
    b->u.l.prev = HEAP_NIL, b->u.l.next = blk_idx(h, head);
    if (head) head->u.l.prev = blk_idx(h, b);
    h->free_[order] = b;
}

static void list_unlink(mm_heap *h, mm_heap_blk *b) {
    mm_heap_blk *prev = blk_at(h, b->u.l.prev), *next = blk_at(h, b->u.l.next);
    if (prev) prev->u.l.next = b->u.l.next;
    else h->free_[b->order] = next;
    if (next) next->u.l.prev = b->u.l.prev;
    b->tag = 0;
}

/* ---------------------------------------------------------------- arena */

int mm_heap_init(mm_heap *h, size_t bytes) {
    memset(h, 0, sizeof *h);
    if (bytes == 0) return -EINVAL;
    int order = 0;
    while (((size_t)MM_HEAP_MIN << order) < bytes) {
        if (++order >= MM_HEAP_ORDERS) return -EINVAL;
    }
    size_t size = (size_t)MM_HEAP_MIN << order;
    /* NORESERVE: the cap is reserved address space; only pages a connection touched
     * count, as with malloc, but nothing past the cap can ever be handed out. */
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return -ENOMEM;
    h->base = base, h->size = size, h->max_order = order;
    POISON(h->base, h->size);
    list_push(h, (mm_heap_blk *)h->base, order);
    return 0;
}

void mm_heap_free_all(mm_heap *h) {
    if (h->base) UNPOISON(h->base, h->size); /* the range may be mapped again by others */
    if (h->base) munmap(h->base, h->size);
    memset(h, 0, sizeof *h);
}

int mm_heap_owns(const mm_heap *h, const void *p) {
    const unsigned char *c = p;
    return h->base && c >= h->base && c < h->base + h->size;
}

/* ---------------------------------------------------------------- allocation */

static int fail_hook_fires(mm_heap *h) {
    if (h->fail_n <= 0) return 0;
    if (--h->fail_n > 0) return 0;
    if (h->fail_sticky) h->fail_n = 1;
    return 1;
}

static int order_for(const mm_heap *h, size_t n) {
    if (n > h->size - HEAP_HDR) return -1;
    int o = 0;
    while (((size_t)MM_HEAP_MIN << o) - HEAP_HDR < n) o++;
    return o;
}

void *mm_heap_alloc(mm_heap *h, size_t n) {
    if (!h->base) return NULL;
    int want = order_for(h, n ? n : 1);
    int k = want;
    if (want >= 0)
        while (k <= h->max_order && !h->free_[k]) k++;
    if (want < 0 || k > h->max_order || fail_hook_fires(h)) {
        h->fails++;
        return NULL;
    }
    mm_heap_blk *b = h->free_[k];
    list_unlink(h, b);
    while (k > want) { /* split: the upper half goes on the list below */
        k--;
        list_push(h, (mm_heap_blk *)((unsigned char *)b + ((size_t)MM_HEAP_MIN << k)), k);
    }
    b->tag = HEAP_USED, b->order = (uint32_t)want, b->u.asked = n;
    UNPOISON(b, HEAP_HDR + n);
    h->used += (size_t)MM_HEAP_MIN << want;
    if (h->used > h->peak) h->peak = h->used;
    h->allocs++;
    return (unsigned char *)b + HEAP_HDR;
}

void *mm_heap_calloc(mm_heap *h, size_t nmemb, size_t size) {
    if (size && nmemb > SIZE_MAX / size) return NULL;
    void *p = mm_heap_alloc(h, nmemb * size);
    if (p) memset(p, 0, nmemb * size);
    return p;
}

static mm_heap_blk *blk_of(void *p) { return (mm_heap_blk *)((unsigned char *)p - HEAP_HDR); }

void mm_heap_free(mm_heap *h, void *p) {
    if (!p) return;
    mm_heap_blk *b = blk_of(p);
    int o = (int)b->order;
    size_t sz = (size_t)MM_HEAP_MIN << o;
    h->used -= sz;
    /* A big buffer's pages go back to the kernel, as free() does with a large block: the
     * arena's resident size follows what is in use, not its high-water mark. */
    if (sz >= HEAP_RELEASE) madvise((unsigned char *)b + HEAP_PAGE, sz - HEAP_PAGE, MADV_DONTNEED);
    POISON(p, b->u.asked);
    while (o < h->max_order) { /* merge while the buddy is free and whole */
        size_t off = (size_t)((unsigned char *)b - h->base);
        mm_heap_blk *bud = (mm_heap_blk *)(h->base + (off ^ ((size_t)MM_HEAP_MIN << o)));
        if (bud->tag != HEAP_FREE || (int)bud->order != o) break;
        list_unlink(h, bud);
        POISON(bud < b ? b : bud, sizeof *b); /* that header is inside the merged block now */
        if (bud < b) b = bud;
        o++;
    }
    list_push(h, b, o);
}

void *mm_heap_realloc(mm_heap *h, void *p, size_t n) {
    if (!p) return mm_heap_alloc(h, n);
    mm_heap_blk *b = blk_of(p);
    size_t have = ((size_t)MM_HEAP_MIN << b->order) - HEAP_HDR, old = b->u.asked;
    if (n <= have) { /* still fits: the block stays, only its addressable part moves */
        if (n > old) UNPOISON((unsigned char *)p + old, n - old);
        else POISON((unsigned char *)p + n, old - n);
        b->u.asked = n;
        return p;
    }
    void *q = mm_heap_alloc(h, n);
    if (!q) return NULL;
    memcpy(q, p, old);
    mm_heap_free(h, p);
    return q;
}

size_t mm_heap_largest(const mm_heap *h) {
    for (int k = h->max_order; k >= 0 && h->base; k--)
        if (h->free_[k]) return ((size_t)MM_HEAP_MIN << k) - HEAP_HDR;
    return 0;
}

/* Walk the arena block by block: each header is valid and aligned to its size, the used
 * bytes add up, and the free lists hold exactly the free blocks. */
int mm_heap_check(const mm_heap *h) {
    if (!h->base) return 0;
    size_t off = 0, used = 0, n_free = 0, n_listed = 0;
    while (off < h->size) {
        const mm_heap_blk *b = (const mm_heap_blk *)(h->base + off);
        if ((b->tag != HEAP_FREE && b->tag != HEAP_USED) || (int)b->order > h->max_order) return -1;
        size_t sz = (size_t)MM_HEAP_MIN << b->order;
        if (off % sz) return -1;
        if (b->tag == HEAP_USED) used += sz;
        else n_free++;
        off += sz;
    }
    for (int k = 0; k <= h->max_order; k++)
        for (const mm_heap_blk *b = h->free_[k]; b; b = blk_at(h, b->u.l.next)) {
            if (b->tag != HEAP_FREE || (int)b->order != k) return -1;
            n_listed++;
        }
    return off == h->size && used == h->used && n_free == n_listed ? 0 : -1;
}

void mm_heap_fail_after(mm_heap *h, int n) {
    h->fail_n = n > 0 ? n : 0;
    h->fail_sticky = 0;
}

void mm_heap_fail_from(mm_heap *h, int n) {
    h->fail_n = n > 0 ? n : 0;
    h->fail_sticky = n > 0;
}
