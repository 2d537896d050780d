/* kv: the KV block pool, per-sequence page tables, refcounts and copy-on-write.
 *
 * Physical KV memory is n_blocks fixed-size blocks of block_size token slots each.
 * A sequence's page table maps logical block i (positions [i*block_size, (i+1)*block_size))
 * to a physical block id. Forks share blocks (refcount) and copy on write. Everything,
 * page tables included, is allocated at init; no call below allocates.
 *
 * Block layout: [layer][K,V][kv_head][slot][head_dim] f16, so a block is contiguous and
 * copy-on-write is one memcpy. s->n_tokens is the caller's count of positions written:
 * kv_seq_reserve only makes capacity, the caller advances n_tokens after writing. */
#ifndef KILN_MM_KV_H
#define KILN_MM_KV_H

#include <stddef.h>
#include <stdint.h>

#include "mm/pool.h"

typedef struct {
    int n_layers, n_kv_heads, head_dim; /* model shape */
    int block_size;                     /* tokens per block, e.g. 16 */
    int n_blocks;                       /* physical blocks in the pool */
    int max_seqs;                       /* page tables available */
    int max_blocks_per_seq;             /* page-table length = ceil(max_seq_len / block_size) */
} kv_config;

typedef struct kv_seq {
    int32_t *blocks; /* [max_blocks_per_seq] physical block ids; [0, n_blocks) valid */
    int n_blocks;    /* blocks held: capacity n_blocks * block_size positions */
    int n_tokens;    /* positions written (the caller advances it) */
    int id;          /* index in the pool's seq table, stable */
    int in_use;
} kv_seq;

typedef struct kv_pool {
    kv_config cfg;
    uint16_t *data;     /* [n_blocks][block_elems] f16 */
    size_t block_elems; /* f16 elements per block, all layers, K and V */
    size_t head_elems;  /* block_size * head_dim: one (layer, K|V, head) slab */
    int32_t *refcount;  /* [n_blocks] page-table references */
    int32_t *free_ids;  /* [n_blocks] stack of free block ids, top at n_free-1 */
    int n_free;
    uint64_t *hash;     /* [n_blocks] prefix-cache key, 0 = none (reserved, unused yet) */
    kv_seq *seqs;       /* [max_seqs] */
    int32_t *tables;    /* [max_seqs][max_blocks_per_seq] page-table slab */
    int32_t *scratch;   /* [n_blocks] for kv_check */
    int n_seqs_used;
    void *mem;          /* own allocation (arena NULL), else NULL */
    size_t mem_bytes;
    int fail_n, fail_sticky; /* test hook on block allocation */
} kv_pool;

/* 0, -EINVAL (bad config), -E2BIG (sizes overflow) or -ENOMEM. arena NULL: own memory. */
int kv_pool_init(kv_pool *p, const kv_config *cfg, mm_pool *arena);
void kv_pool_free(kv_pool *p); /* memory from an arena stays with the arena */
/* Arena bytes kv_pool_init needs for cfg (data, metadata, page tables); 0 if invalid. */
size_t kv_pool_bytes(const kv_config *cfg);
size_t kv_block_bytes(const kv_config *cfg); /* one block, all layers, K and V; 0 if invalid */

kv_seq *kv_seq_new(kv_pool *p);             /* empty; NULL when no page table is free */
void kv_seq_release(kv_pool *p, kv_seq *s); /* drops block refs; refcount-0 blocks are freed */
/* Capacity for positions [0, n_tokens): 0; -ENOMEM leaving s unchanged; -E2BIG past
 * max_blocks_per_seq; -EINVAL for n_tokens < 0. Never shrinks, never touches n_tokens. */
int kv_seq_reserve(kv_pool *p, kv_seq *s, int n_tokens);
/* New page table sharing all of src's blocks (refcount++), n_tokens copied; NULL when
 * no page table is free. */
kv_seq *kv_seq_fork(kv_pool *p, const kv_seq *src);
/* Call before writing position pos: if its block is shared, copy it into a fresh block
 * and point s at it. 0, -ENOMEM (s unchanged), -EINVAL (pos not reserved). */
int kv_seq_cow(kv_pool *p, kv_seq *s, int pos);
/* Keep positions [0, n_tokens): blocks past the end are released, s->n_tokens becomes
 * min(n_tokens, s->n_tokens). 0 or -EINVAL. */
int kv_seq_truncate(kv_pool *p, kv_seq *s, int n_tokens);

/* [block_size][head_dim] f16 slabs of one (block, layer, head). */
static inline uint16_t *kv_k(const kv_pool *p, int32_t block, int layer, int head) {
    return p->data + (size_t)block * p->block_elems +
           ((size_t)layer * 2 * (size_t)p->cfg.n_kv_heads + (size_t)head) * p->head_elems;
}
static inline uint16_t *kv_v(const kv_pool *p, int32_t block, int layer, int head) {
    return p->data + (size_t)block * p->block_elems +
           (((size_t)layer * 2 + 1) * (size_t)p->cfg.n_kv_heads + (size_t)head) * p->head_elems;
}

int kv_free_blocks(const kv_pool *p);
int kv_refcount(const kv_pool *p, int32_t block);
/* Consistency: refcounts equal page-table references, the free list holds exactly the
 * refcount-0 blocks once each, page tables are in range. 0, or -EFAULT with err set. */
int kv_check(const kv_pool *p, char *err, size_t errlen);
/* Test hooks: fail the nth block allocation from now (n <= 0 off); fail_from keeps
 * failing after it. */
void kv_fail_after(kv_pool *p, int n);
void kv_fail_from(kv_pool *p, int n);

#endif
