/* kv: the KV block pool, per-sequence page tables, refcounts, copy-on-write and the
 * prefix cache.
 *
 * Physical KV memory is n_blocks fixed-size blocks of block_size token slots each.
 * A sequence's page table maps logical block i (positions [i*block_size, (i+1)*block_size))
 * to a physical block id. Forks share blocks (refcount) and copy on write. Everything,
 * page tables and the prefix index included, is allocated at init; no call below allocates.
 *
 * Block layout: [layer][K,V][kv_head] slabs of f16, a K slab [head_dim][slot] and a V
 * slab [slot][head_dim] (kv_k, kv_v), so a block is contiguous and copy-on-write is one
 * memcpy. s->n_tokens is the caller's count of positions written:
 * kv_seq_reserve only makes capacity, the caller advances n_tokens after writing.
 *
 * Prefix cache (cfg.prefix_cache != 0), vLLM-style automatic prefix caching:
 *   - A full block's key is kv_block_key(parent key, its block_size token ids); block 0's
 *     parent is KV_KEY_SEED, so a key names the whole token prefix up to the block's end.
 *   - kv_seq_commit registers a sequence's full, written blocks in an open-addressing
 *     index key -> block; kv_seq_match attaches indexed blocks to a new sequence. The
 *     index stores each indexed block's parent key and token ids and compares them on
 *     lookup, so a 64-bit key collision can never hand out the wrong block.
 *   - A block whose refcount drops to 0 while indexed goes on an LRU list instead of the
 *     free stack: still matchable. Allocation takes the free stack first, then evicts the
 *     least recently used cached block (dropping it from the index). Releases and
 *     truncations give blocks back last block first, so a sequence's tail is evicted
 *     before its head (a head block evicted would strand the blocks chained after it).
 *
 * Block states (kv_check verifies them): free (refcount 0, not indexed, on the free
 * stack) | cached (refcount 0, indexed, on the LRU list) | in use (refcount > 0, indexed
 * or not). free + cached + in use = n_ids; kv_free_blocks = free + cached (in f16 blocks).
 *
 * 8-bit blocks (cfg.kv8, the degrade ladder's rung 2; external data through kv_pool.ext,
 * whose 8-bit format is the owner's): memory is
 * n_blocks slots of one f16 block each, every slot `units` units: two halves, or four
 * quarters for a sliding-window model whose global layers fit in a quarter (below); an
 * 8-bit block (int8, one scale per (layer, K|V, head) slab) takes half a slot. Block
 * ids are then handles, one per unit, and loc[id] says which unit a block's data
 * starts at (aligned to its size), so a block converted in place (kv_block_to_q8,
 * freeing its second half) or moved keeps its id: page tables and the prefix index
 * never change. Blocks are born f16 (a whole slot); when a slot is needed and none is
 * free, the slot with the most free units is emptied by moving its 8-bit and gone
 * blocks into free units elsewhere (compaction; with quarters, a gone block may move
 * first to free an aligned half). So the pool can always allocate an f16 block while
 * a slot's worth of units is free, cached or spare, and kv_free_blocks is that count /
 * units. Only f16 blocks are written:
 * kv_seq_cow turns an 8-bit block about to be written back into a private f16 copy.
 * Conversion and moves rewrite block data, so with kv8 every call that may allocate
 * (kv_seq_reserve, kv_seq_cow) or convert must run while no step reads the pool.
 * Without kv8 ids are slots, nothing moves, and everything is as above.
 *
 * Sliding windows (cfg.swa_window > 0, the layers flagged in cfg.swa_layers): a windowed
 * layer computing position pos reads positions [kv_swa_first(swa_window, pos), pos]
 * only. A sequence's blocks wholly before the window of the next position it will write
 * (s->swa_lo of them, advanced by kv_seq_slide) are never read by its windowed layers
 * again, so their windowed KV is given back:
 *   - every layer windowed (KV_SWA_HOLES): the sequence drops its reference to the
 *     block (cached when indexed, else freed) and its page-table entry becomes -1, a
 *     hole. No layer reads a hole.
 *   - some layers global (KV_SWA_SHRINK, at most half of them, host data): the global
 *     layers are stored first in a block (kv_k's layer order is cfg's, the storage
 *     order is lslot's), so their KV is the block's first unit: a quarter of it when
 *     they fit there (Gemma 3: 4 of 26 layers), else half. Once no holder still needs
 *     a block's windowed part (need[b] counts the page-table references at or past
 *     their sequence's swa_lo), the block goes KV_GONE: all but its first unit are
 *     freed (the pool then always uses units, kv8 or not). A gone block keeps serving
 *     the global layers and prefix matches that end past its window. An indexed block
 *     is not shrunk at once but goes KV_SPARE: its other units stay, still matchable,
 *     on the spare list (in use blocks only, oldest first) and count as free;
 *     allocation takes spare blocks' units (making them gone) once no cached block is
 *     left to evict: a spare block may be what a shared system prompt's next request
 *     matches. A match that needs a spare block's window again makes it whole.
 *   - otherwise (more global than windowed layers, or device data) nothing is freed.
 * kv_seq_match only hands a new sequence blocks it can read: it reuses k blocks only if
 * those in its window, [swa_lo, k), are present and not gone (holes mode: a match may
 * skip missing blocks before its window).
 *
 * Invariants the prefix cache rests on:
 *   1. An indexed block's contents never change: it holds exactly the KV of its token ids
 *      under its prefix (kv_block_to_q8 lowers its precision, not what it holds; an
 *      8-bit block keeps serving matches until it is evicted, also after the ladder has
 *      stepped down; a gone block loses only windowed KV that kv_seq_match never hands
 *      to a window that reads it). Writes go through kv_seq_cow (call it before writing ANY position,
 *      not only in shared blocks): a shared block is copied and the copy is not indexed;
 *      an unshared indexed block is dropped from the index before the write.
 *   2. Only full blocks are indexed. kv_seq_truncate into the middle of an indexed block
 *      drops it from the index when s is its only holder; when shared, the next
 *      kv_seq_cow copies it.
 *   3. Identical blocks are indexed once: committing a block equal to an indexed one (same
 *      key, parent, tokens) leaves that entry alone and this block unindexed; a block is
 *      never deduplicated in place (page tables are not rewritten by commit).
 *   4. Per sequence, blocks [0, n_committed) are full, written, and keys[0..n_committed)
 *      chain their token ids (keys[n_committed-1] is the last committed key). Writing into
 *      (kv_seq_cow) or truncating into a committed block rewinds n_committed to it. */
#ifndef KILN_MM_KV_H
#define KILN_MM_KV_H

#include <stddef.h>
#include <stdint.h>

#include "mm/pool.h"

/* f16 <-> f32 row converters for 8-bit blocks: mm holds no number-format code, so
 * whoever builds a kv8 config passes the ones its kernels use (model_kv_shape sets
 * core's). to_f32 must be exact; to_f16 rounds to nearest even. */
typedef struct {
    void (*to_f32)(const uint16_t *src, float *dst, int64_t n);
    void (*to_f16)(const float *src, uint16_t *dst, int64_t n);
} kv_f16_conv;

#define KV_MAX_LAYERS 512 /* layers a sliding-window config can flag */

typedef struct {
    int n_layers, n_kv_heads, head_dim; /* model shape */
    int block_size;                     /* tokens per block, e.g. 16 */
    int n_blocks;                       /* physical blocks in the pool */
    int max_seqs;                       /* page tables available */
    int max_blocks_per_seq;             /* page-table length = ceil(max_seq_len / block_size) */
    int prefix_cache;                   /* 0: off (commit and match do nothing), else on */
    int external_data;                  /* 1: the blocks live elsewhere (device memory):
                                         * no host data, data = NULL, and every write of
                                         * the pool's own goes through kv_pool.ext */
    int kv8;                            /* 1: blocks may be turned to 8 bits (see the top) */
    kv_f16_conv f16;                    /* kv8 on host data: both converters required
                                         * (else -EINVAL) */
    int swa_window;                     /* > 0: the flagged layers read only the last
                                         * swa_window positions (see the top); host
                                         * data only (else -EINVAL) */
    uint64_t swa_layers[KV_MAX_LAYERS / 64]; /* bit l: layer l is windowed */
} kv_config;

/* What a pool frees of windowed KV (kv_pool.swa), and a block's windowed part
 * (kv_pool.gone) under KV_SWA_SHRINK: see the top. */
enum { KV_SWA_NONE, KV_SWA_HOLES, KV_SWA_SHRINK };
enum { KV_WHOLE, KV_GONE, KV_SPARE };

/* The first position a windowed layer reads when computing position pos: the window
 * holds the last `window` positions, pos included. The model's attention and the pool's
 * freeing both use this, so they cannot disagree. */
static inline int kv_swa_first(int window, int pos) {
    return window > 0 && pos + 1 > window ? pos + 1 - window : 0;
}

/* Parent key of a sequence's first block. */
#define KV_KEY_SEED 0x6b696c6e2d6b7631ull /* "kiln-kv1" */

/* With external data (cfg.external_data) the owner of the memory writes it: the CUDA
 * backend queues each call on its stream, ordered after the step in flight and before
 * the next. Addresses are units (kv_pool.units per slot; without units a unit is a
 * block): a block's data starts at unit loc[id], which the owner's kernels read the
 * page tables through. The 8-bit state and scales of a block are the owner's too, kept
 * by the block's first unit. Set before the first kv_seq_cow (copy) and, with kv8,
 * before the first allocation (all three). */
typedef struct {
    void *ctx;
    /* n units from unit src to unit dst, with src's 8-bit state and scales: copy-on-write
     * (a whole slot) and compaction (an 8-bit block's half). The ranges never overlap. */
    void (*copy)(void *ctx, int32_t dst, int32_t src, int n);
    /* kv8: the f16 block at unit u to 8 bits in place, into its first half. */
    void (*to_q8)(void *ctx, int32_t u);
    /* kv8: the 8-bit block at unit src as f16 into the free slot starting at unit dst. */
    void (*expand)(void *ctx, int32_t dst, int32_t src);
} kv_ext;

typedef struct kv_seq {
    int32_t *blocks; /* [max_blocks_per_seq] physical block ids; [0, n_blocks) valid */
    int n_blocks;    /* blocks held: capacity n_blocks * block_size positions */
    int n_tokens;    /* positions written (the caller advances it) */
    int id;          /* index in the pool's seq table, stable */
    int in_use;
    int n_committed; /* blocks [0, n_committed) registered by kv_seq_commit / kv_seq_match */
    uint64_t *keys;  /* [max_blocks_per_seq] chained keys of the committed blocks */
    int swa_lo;      /* blocks [0, swa_lo) are past its windowed layers' reach for good:
                      * holes (KV_SWA_HOLES) or not counted in need (KV_SWA_SHRINK) */
} kv_seq;

typedef struct kv_pool {
    kv_config cfg;
    uint16_t *data;     /* [n_blocks][block_elems] f16 (slots) */
    size_t block_elems; /* f16 elements per block, all layers, K and V */
    size_t head_elems;  /* block_size * head_dim: one (layer, K|V, head) slab */
    int n_ids;          /* block ids: n_blocks, or units * n_blocks with units (one per unit) */
    int units;          /* units per slot: 1 (no units), 2, or 4 (Gemma 3-like windows) */
    size_t unit_elems;  /* f16 elements of one unit: block_elems / units */
    int32_t *loc;       /* [n_ids] first unit of a block's data; identity without units,
                         * -1 for a free id with them */
    /* with units only (NULL otherwise; scale with kv8 only): */
    int32_t *owner;     /* [units * n_blocks] block id in each unit, -1 free */
    uint8_t *q8;        /* [n_ids] 1: the block is 8-bit */
    float *scale;       /* [n_ids][n_layers * 2 * n_kv_heads] int8 scale per slab (host
                         * data only) */
    int32_t *free_slots;/* [n_blocks] stack of slots with all units free */
    int n_free_slots;
    int n_units_free;   /* free units (in free slots and in partly used ones) */
    int n_units_cached; /* units held by cached blocks */
    int n_q8;           /* 8-bit blocks in use or cached */
    /* sliding windows: */
    int swa;            /* KV_SWA_NONE, _HOLES or _SHRINK */
    int32_t *lslot;     /* [n_layers] storage index of each layer: global layers first */
    uint8_t *gone;      /* [n_ids] KV_SWA_SHRINK: KV_WHOLE, KV_GONE or KV_SPARE */
    int32_t *need;      /* [n_ids] KV_SWA_SHRINK: holders still reading the windowed part */
    int32_t *sp_prev, *sp_next; /* [n_ids] spare list links, -1 = none */
    int32_t sp_head, sp_tail;   /* oldest / newest spare block, -1 = empty */
    int n_spare;        /* spare blocks: units allocation may take from in-use blocks */
    int32_t *refcount;  /* [n_blocks] page-table references */
    int32_t *free_ids;  /* [n_blocks] stack of free block ids, top at n_free-1 */
    int n_free;
    uint64_t *hash;     /* [n_blocks] key of an indexed block; 0 = not indexed */
    uint64_t *parent;   /* [n_blocks] parent key of an indexed block */
    int32_t *tok;       /* [n_blocks][block_size] token ids of an indexed block */
    int32_t *lru_prev, *lru_next; /* [n_blocks] LRU links, -1 = none (and off the list) */
    int32_t lru_head, lru_tail;   /* least / most recently used cached block, -1 = empty */
    int n_lru;          /* cached blocks (refcount 0, indexed) */
    int32_t *index;     /* [index_mask+1] open addressing (linear probing): block id, -1 empty */
    size_t index_mask;  /* capacity - 1; capacity = power of two >= 2 * n_blocks */
    int n_indexed;
    kv_seq *seqs;       /* [max_seqs] */
    int32_t *tables;    /* [max_seqs][max_blocks_per_seq] page-table slab */
    uint64_t *seq_keys; /* [max_seqs][max_blocks_per_seq] slab for kv_seq.keys */
    int32_t *scratch;   /* [n_blocks] for kv_check */
    int n_seqs_used;
    struct {
        uint64_t prefix_queries; /* prompt tokens looked up by kv_seq_match */
        uint64_t prefix_hits;    /* of those, tokens reused */
        uint64_t evictions;      /* cached blocks evicted to make room */
        uint64_t q8_conversions; /* blocks turned to 8 bits */
        uint64_t q8_moves;       /* 8-bit blocks moved to join two free halves */
        uint64_t swa_freed;      /* blocks whose windowed KV kv_seq_slide gave back */
    } stats;
    void *mem;          /* own allocation (arena NULL), else NULL */
    size_t mem_bytes;
    int fail_n, fail_sticky; /* test hook on block allocation */
    kv_ext ext; /* external data: who writes it (set before the first allocation) */
} kv_pool;

/* 0, -EINVAL (bad config), -E2BIG (sizes overflow) or -ENOMEM. arena NULL: own memory. */
int kv_pool_init(kv_pool *p, const kv_config *cfg, mm_pool *arena);
void kv_pool_free(kv_pool *p); /* memory from an arena stays with the arena */
/* Arena bytes kv_pool_init needs for cfg (data, metadata, page tables); 0 if invalid. */
size_t kv_pool_bytes(const kv_config *cfg);
size_t kv_block_bytes(const kv_config *cfg); /* one block, all layers, K and V; 0 if invalid */

kv_seq *kv_seq_new(kv_pool *p); /* empty; NULL when no page table is free */
/* Drops block refs, last block first; refcount-0 blocks are freed, or cached when indexed. */
void kv_seq_release(kv_pool *p, kv_seq *s);
/* Capacity for positions [0, n_tokens): 0; -ENOMEM leaving the pool unchanged; -E2BIG past
 * max_blocks_per_seq; -EINVAL for n_tokens < 0. Never shrinks, never touches n_tokens.
 * New blocks come from the free stack, then by evicting cached blocks (LRU first). */
int kv_seq_reserve(kv_pool *p, kv_seq *s, int n_tokens);
/* New page table sharing all of src's blocks (refcount++), n_tokens and the committed
 * keys copied; NULL when no page table is free. */
kv_seq *kv_seq_fork(kv_pool *p, const kv_seq *src);
/* Call before writing position pos: if its block is shared, copy it into a fresh block
 * (not indexed) and point s at it; if it is s's alone but indexed, drop it from the index.
 * A write into a committed block rewinds s->n_committed to it. 0, -ENOMEM (s unchanged),
 * -EINVAL (pos not reserved). Only the copy allocates. */
int kv_seq_cow(kv_pool *p, kv_seq *s, int pos);
/* Keep positions [0, n_tokens): blocks past the end are released (cached when indexed),
 * s->n_tokens becomes min(n_tokens, s->n_tokens), n_committed at most the full blocks
 * left; an indexed block cut in the middle and held by s alone leaves the index. 0 or
 * -EINVAL. */
int kv_seq_truncate(kv_pool *p, kv_seq *s, int n_tokens);

/* s will write position n next, and only later ones after it: the blocks its windowed
 * layers can no longer reach ([s->swa_lo, kv_swa_first(swa_window, n) / block_size))
 * give their windowed KV back (see the top). Returns the blocks newly freed or made
 * evictable; 0 when the pool frees nothing. Never allocates; may free units, so with
 * units (kv8 or KV_SWA_SHRINK) it runs while no step reads the pool, like kv_seq_cow. */
int kv_seq_slide(kv_pool *p, kv_seq *s, int n);

/* ---- prefix cache: kv_seq_commit and kv_seq_match do nothing, return 0, when
 * cfg.prefix_cache is 0 */

/* Key of a full block: XXH64-style rounds (the XXH64 primes, one accumulator, seeded with
 * parent, token ids packed two per 64-bit lane, XXH64's avalanche) over n token ids;
 * never 0 (0 maps to 1), since 0 marks an unindexed block. Not bit-compatible with XXH64. */
uint64_t kv_block_key(uint64_t parent, const int32_t *tokens, int n);
/* Positions [0, n_tokens) of s have been written with these tokens; s->n_tokens is raised
 * to n_tokens if lower (a caller that counts its own positions need not maintain it).
 * Registers every full block in [s->n_committed, n_tokens / block_size): computes its key
 * and indexes it unless an identical block (key, parent, tokens) already is; a block s
 * shares that is already indexed stays as it is. Costs only the new blocks. Returns the
 * number of blocks newly committed, or -EINVAL (n_tokens < 0 or past the reserved
 * capacity). Never allocates, so it cannot fail for want of memory. */
int kv_seq_commit(kv_pool *p, kv_seq *s, const int32_t *tokens, int n_tokens);
/* s must be empty (n_blocks == 0, else -EINVAL). Walks the full blocks of tokens[0,
 * n_tokens), at most (n_tokens - 1) / block_size of them (the last prompt token is always
 * left to compute, for its logits) and at most max_blocks_per_seq, chaining keys; attaches
 * each indexed match in order (refcount++, a cached block leaves the LRU) and stops at the
 * first miss. Sets s->n_tokens = s->n_blocks * block_size = the return value, the tokens
 * reused, and s->n_committed to the blocks attached. Counts stats.prefix_queries
 * (n_tokens) and stats.prefix_hits. Never allocates. */
int kv_seq_match(kv_pool *p, kv_seq *s, const int32_t *tokens, int n_tokens);
/* The tokens kv_seq_match would reuse for these tokens now, changing nothing (no
 * refcount, no LRU move, no stats): what a waiting prompt will really need computed. */
int kv_prefix_hits(const kv_pool *p, const int32_t *tokens, int n_tokens);

/* The f16 slabs of one (block, layer, head) of an f16 block; layer is the model's,
 * stored at lslot[layer]. V slabs are slot-major, [block_size][head_dim]; K slabs are
 * dimension-major, [head_dim][block_size] (kv_k_index): dimension d of the block's
 * slots side by side, so attention takes a block's keys into a vector's lanes and a
 * score needs no sum across lanes. */
static inline uint16_t *kv_k(const kv_pool *p, int32_t block, int layer, int head) {
    return p->data + (size_t)p->loc[block] * p->unit_elems +
           ((size_t)p->lslot[layer] * 2 * (size_t)p->cfg.n_kv_heads + (size_t)head) * p->head_elems;
}
/* Where element d of slot's key lies in a K slab (f16 or int8). */
static inline size_t kv_k_index(const kv_pool *p, int slot, int d) {
    return (size_t)d * (size_t)p->cfg.block_size + (size_t)slot;
}
static inline uint16_t *kv_v(const kv_pool *p, int32_t block, int layer, int head) {
    return p->data + (size_t)p->loc[block] * p->unit_elems +
           (((size_t)p->lslot[layer] * 2 + 1) * (size_t)p->cfg.n_kv_heads + (size_t)head) * p->head_elems;
}

/* ---- 8-bit blocks (cfg.kv8) */

static inline int kv_is_q8(const kv_pool *p, int32_t block) { return p->q8 && p->q8[block]; }
/* Slab index of (layer, K|V, head) in a block: the same order as the f16 layout. */
static inline size_t kv_slab(const kv_pool *p, int layer, int is_v, int head) {
    return ((size_t)p->lslot[layer] * 2 + (size_t)is_v) * (size_t)p->cfg.n_kv_heads + (size_t)head;
}
/* The int8 slab of an 8-bit block, laid out as the f16 one (K dimension-major, V
 * slot-major); value = q * kv_q8_scale. */
static inline const int8_t *kv_q8_slab(const kv_pool *p, int32_t block, int layer, int is_v,
                                       int head) {
    return (const int8_t *)(p->data + (size_t)p->loc[block] * p->unit_elems) +
           kv_slab(p, layer, is_v, head) * p->head_elems;
}
static inline float kv_q8_scale(const kv_pool *p, int32_t block, int layer, int is_v, int head) {
    return p->scale[(size_t)block * 2 * (size_t)p->cfg.n_layers * (size_t)p->cfg.n_kv_heads +
                    kv_slab(p, layer, is_v, head)];
}
/* An 8-bit block's K and V slabs of (layer, head), as f16 in the same layouts:
 * head_elems values each into k and v. */
void kv_q8_read(const kv_pool *p, int32_t block, int layer, int head, uint16_t *k, uint16_t *v);
/* Turn an f16 block (in use or cached) into 8 bits in place: per slab a symmetric int8
 * scale (max |x| / 127), its second unit freed. 1 converted, 0 nothing to do (already
 * 8-bit, or the pool has no kv8), -EINVAL (no such block). No step may read the pool. */
int kv_block_to_q8(kv_pool *p, int32_t block);
/* s's f16 blocks that lie wholly in positions [0, n_written), at most max of them,
 * first to last: the number converted. */
int kv_seq_to_q8(kv_pool *p, kv_seq *s, int n_written, int max);
/* Cached f16 blocks, least recently used first, at most max: the number converted. */
int kv_cached_to_q8(kv_pool *p, int max);
int kv_q8_blocks(const kv_pool *p); /* 8-bit blocks in use or cached */
/* Blocks one sequence can hold in a pool of n_blocks slots: n_blocks, or with kv8 all but
 * its last blocks in 8 bits, 2 * n_blocks - 4 (room for the partial f16 block and the
 * next one being taken, two slots). The engine compacts a sequence that outgrows the
 * f16 pool alone rather than recompute it forever. */
static inline long long kv_seq_max_blocks(long long n_blocks, int kv8) {
    return kv8 ? 2 * n_blocks - 4 : n_blocks;
}

/* Allocatable f16 blocks: free + cached (evictable) ones; with units, (free + cached +
 * spare units) / 2. */
int kv_free_blocks(const kv_pool *p);
int kv_cached_blocks(const kv_pool *p); /* refcount-0 blocks kept for the prefix cache (LRU) */
int kv_refcount(const kv_pool *p, int32_t block);
/* Consistency: refcounts equal page-table references, page tables are in range, every
 * refcount-0 block is on exactly one of the free stack (not indexed) and the LRU list
 * (indexed; links consistent both ways), in-use blocks are on neither; the index holds
 * exactly the blocks with a key, each once, each stored key is kv_block_key of the stored
 * parent and tokens, and a lookup of them finds that block; committed counts are in range. 0, or -EFAULT with
 * err set. Costs O(n_blocks * block_size + index capacity): a debugging aid. */
int kv_check(const kv_pool *p, char *err, size_t errlen);
/* Test hooks: fail the nth block allocation from now (n <= 0 off); fail_from keeps
 * failing after it. */
void kv_fail_after(kv_pool *p, int n);
void kv_fail_from(kv_pool *p, int n);

#endif
