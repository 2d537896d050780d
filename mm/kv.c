/* kv: the KV block pool (see kv.h). */
#include "mm/kv.h"

#include <assert.h>
#include <limits.h>
#include <math.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/quant.h"

/* ---------------------------------------------------------------- sizes */

/* kv8 needs the data on the host (conversion and moves are memory writes here) and an
 * even number of bytes per block to halve. */
static int cfg_valid(const kv_config *c) {
    return c->n_layers > 0 && c->n_kv_heads > 0 && c->head_dim > 0 && c->block_size > 0 &&
           c->n_blocks > 0 && c->max_seqs > 0 && c->max_blocks_per_seq > 0 &&
           (!c->kv8 || (!c->external_data && c->n_blocks <= INT_MAX / 2));
}

static int n_ids_of(const kv_config *c) { return c->kv8 ? 2 * c->n_blocks : c->n_blocks; }
static int slabs_of(const kv_config *c) { return 2 * c->n_layers * c->n_kv_heads; }

/* f16 elements of one block; 0 on overflow. */
static size_t block_elems(const kv_config *c) {
    size_t n = 2;
    if (__builtin_mul_overflow(n, (size_t)c->n_layers, &n) ||
        __builtin_mul_overflow(n, (size_t)c->n_kv_heads, &n) ||
        __builtin_mul_overflow(n, (size_t)c->block_size, &n) ||
        __builtin_mul_overflow(n, (size_t)c->head_dim, &n) || n > SIZE_MAX / 2)
        return 0;
    return n;
}

size_t kv_block_bytes(const kv_config *cfg) {
    if (!cfg_valid(cfg)) return 0;
    return block_elems(cfg) * sizeof(uint16_t);
}

/* Blocks needed for positions [0, n): ceil without overflowing n + block_size. */
static int blocks_for(const kv_pool *p, int n) {
    int bs = p->cfg.block_size;
    return n / bs + (n % bs != 0);
}

/* Byte offsets of every array inside the one allocation; the data comes first so it
 * gets the allocation's page alignment. Returns the total, 0 on overflow. */
typedef struct {
    size_t data, refcount, free_ids, scratch, hash, parent, tok, lru_prev, lru_next, index;
    size_t seqs, tables, seq_keys, loc, owner, q8, scale, free_slots, total;
    size_t index_cap; /* slots: power of two >= 2 * n_ids */
} kv_layout;

static size_t align_up(size_t x, size_t a) { return (x + a - 1) & ~(a - 1); }

static size_t layout_of(const kv_config *c, kv_layout *l) {
    /* per-id metadata is sized by ids (2 per slot with kv8), the data by slots */
    size_t nb = (size_t)n_ids_of(c), ns = (size_t)c->n_blocks, ms = (size_t)c->max_seqs;
    size_t data, tables, tok, be = block_elems(c), k8 = c->kv8 ? 1 : 0;
    if (be == 0 || __builtin_mul_overflow(ns, c->external_data ? 0 : be * sizeof(uint16_t), &data) ||
        __builtin_mul_overflow(ms, (size_t)c->max_blocks_per_seq * sizeof(int32_t), &tables) ||
        __builtin_mul_overflow(nb, (size_t)c->block_size * sizeof(int32_t), &tok) ||
        data > SIZE_MAX / 2 || tables > SIZE_MAX / 8 || tok > SIZE_MAX / 8 ||
        nb > SIZE_MAX / 64 || ms > SIZE_MAX / 64)
        return 0;
    size_t cap = 2;
    while (cap < 2 * nb) cap *= 2; /* nb <= INT_MAX, so cap <= 2^32 */
    size_t off = 0;
    l->data = off, off = align_up(off + data, 64);
    l->refcount = off, off = align_up(off + nb * sizeof(int32_t), 64);
    l->free_ids = off, off = align_up(off + nb * sizeof(int32_t), 64);
    l->scratch = off, off = align_up(off + nb * sizeof(int32_t), 64);
    l->hash = off, off = align_up(off + nb * sizeof(uint64_t), 64);
    l->parent = off, off = align_up(off + nb * sizeof(uint64_t), 64);
    l->tok = off, off = align_up(off + tok, 64);
    l->lru_prev = off, off = align_up(off + nb * sizeof(int32_t), 64);
    l->lru_next = off, off = align_up(off + nb * sizeof(int32_t), 64);
    l->index = off, off = align_up(off + cap * sizeof(int32_t), 64);
    l->index_cap = cap;
    l->seqs = off, off = align_up(off + ms * sizeof(kv_seq), 64);
    l->tables = off, off = align_up(off + tables, 64);
    l->seq_keys = off, off = align_up(off + 2 * tables, 64); /* u64 per page-table entry */
    l->loc = off, off = align_up(off + nb * sizeof(int32_t), 64);
    l->owner = off, off = align_up(off + k8 * nb * sizeof(int32_t), 64); /* units = ids */
    l->q8 = off, off = align_up(off + k8 * nb, 64);
    l->scale = off, off = align_up(off + k8 * nb * (size_t)slabs_of(c) * sizeof(float), 64);
    l->free_slots = off, off = align_up(off + k8 * ns * sizeof(int32_t), 64);
    if (off > SIZE_MAX / 2) return 0;
    l->total = off;
    return off;
}

size_t kv_pool_bytes(const kv_config *cfg) {
    kv_layout l;
    if (!cfg_valid(cfg) || layout_of(cfg, &l) == 0) return 0;
    return align_up(l.total, 4096) + 4096; /* slack for the arena's alignment of the base */
}

/* ---------------------------------------------------------------- init / free */

int kv_pool_init(kv_pool *p, const kv_config *cfg, mm_pool *arena) {
    memset(p, 0, sizeof *p);
    if (!cfg_valid(cfg)) return -EINVAL;
    kv_layout l;
    if (layout_of(cfg, &l) == 0) return -E2BIG;

    unsigned char *mem;
    if (arena) {
        mem = mm_pool_alloc(arena, l.total, 4096);
        if (!mem) return -ENOMEM;
    } else {
        size_t bytes = align_up(l.total, 4096);
        mem = aligned_alloc(4096, bytes);
        if (!mem) return -ENOMEM;
        memset(mem, 0, bytes); /* touch it now, at boot, not on the first request */
        p->mem = mem;
        p->mem_bytes = bytes;
    }
    p->cfg = *cfg;
    p->block_elems = block_elems(cfg);
    p->head_elems = (size_t)cfg->block_size * (size_t)cfg->head_dim;
    p->data = cfg->external_data ? NULL : (uint16_t *)(mem + l.data);
    p->refcount = (int32_t *)(mem + l.refcount);
    p->free_ids = (int32_t *)(mem + l.free_ids);
    p->scratch = (int32_t *)(mem + l.scratch);
    p->hash = (uint64_t *)(mem + l.hash);
    p->parent = (uint64_t *)(mem + l.parent);
    p->tok = (int32_t *)(mem + l.tok);
    p->lru_prev = (int32_t *)(mem + l.lru_prev);
    p->lru_next = (int32_t *)(mem + l.lru_next);
    p->index = (int32_t *)(mem + l.index);
    p->index_mask = l.index_cap - 1;
    p->seqs = (kv_seq *)(mem + l.seqs);
    p->tables = (int32_t *)(mem + l.tables);
    p->seq_keys = (uint64_t *)(mem + l.seq_keys);
    p->n_ids = n_ids_of(cfg);
    p->units = cfg->kv8 ? 2 : 1;
    p->unit_elems = p->block_elems / (size_t)p->units;
    p->loc = (int32_t *)(mem + l.loc);
    if (cfg->kv8) {
        p->owner = (int32_t *)(mem + l.owner);
        p->q8 = mem + l.q8;
        p->scale = (float *)(mem + l.scale);
        p->free_slots = (int32_t *)(mem + l.free_slots);
    }
    /* An arena need not hand out zeroed memory (cuMemHostAlloc); the metadata must be. */
    memset(mem + l.refcount, 0, l.total - l.refcount);

    /* Pushed high to low so block 0 is handed out first: deterministic for tests. */
    for (int i = p->n_ids - 1; i >= 0; i--) p->free_ids[p->n_free++] = i;
    memset(p->lru_prev, 0xff, (size_t)p->n_ids * sizeof(int32_t)); /* all -1 */
    memset(p->lru_next, 0xff, (size_t)p->n_ids * sizeof(int32_t));
    if (cfg->kv8) { /* ids hold no memory until taken; every slot is free */
        memset(p->loc, 0xff, (size_t)p->n_ids * sizeof(int32_t));
        memset(p->owner, 0xff, (size_t)p->n_ids * sizeof(int32_t));
        for (int i = cfg->n_blocks - 1; i >= 0; i--) p->free_slots[p->n_free_slots++] = i;
        p->n_units_free = 2 * cfg->n_blocks;
    } else {
        for (int i = 0; i < p->n_ids; i++) p->loc[i] = i; /* a block is its slot */
    }
    memset(p->index, 0xff, l.index_cap * sizeof(int32_t));
    p->lru_head = p->lru_tail = -1;
    for (int i = 0; i < cfg->max_seqs; i++) {
        p->seqs[i].blocks = p->tables + (size_t)i * (size_t)cfg->max_blocks_per_seq;
        p->seqs[i].keys = p->seq_keys + (size_t)i * (size_t)cfg->max_blocks_per_seq;
        p->seqs[i].id = i;
    }
    return 0;
}

void kv_pool_free(kv_pool *p) {
    free(p->mem); /* arena memory goes with the arena */
    memset(p, 0, sizeof *p);
}

/* ---------------------------------------------------------------- keys */

#define P1 0x9e3779b185ebca87ull
#define P2 0xc2b2ae3d27d4eb4full
#define P3 0x165667b19e3779f9ull
#define P4 0x85ebca77c2b2ae63ull
#define P5 0x27d4eb2f165667c5ull

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

uint64_t kv_block_key(uint64_t parent, const int32_t *tokens, int n) {
    uint64_t h = parent + P5 + (uint64_t)n * sizeof(int32_t);
    int i = 0;
    for (; i + 2 <= n; i += 2) { /* two ids per lane, by value: endian-independent */
        uint64_t lane = (uint64_t)(uint32_t)tokens[i] | (uint64_t)(uint32_t)tokens[i + 1] << 32;
        h ^= rotl64(lane * P2, 31) * P1;
        h = rotl64(h, 27) * P1 + P4;
    }
    if (i < n) {
        h ^= (uint64_t)(uint32_t)tokens[i] * P1;
        h = rotl64(h, 23) * P2 + P3;
    }
    h ^= h >> 33, h *= P2, h ^= h >> 29, h *= P3, h ^= h >> 32;
    return h ? h : 1; /* 0 marks "not indexed" */
}

/* ---------------------------------------------------------------- index */

static int same_block(const kv_pool *p, int32_t b, uint64_t key, uint64_t parent,
                      const int32_t *tokens) {
    int bs = p->cfg.block_size;
    return p->hash[b] == key && p->parent[b] == parent &&
           memcmp(p->tok + (size_t)b * (size_t)bs, tokens, (size_t)bs * sizeof(int32_t)) == 0;
}

/* The indexed block with this key, parent and tokens, or -1. */
static int32_t index_find(const kv_pool *p, uint64_t key, uint64_t parent, const int32_t *tokens) {
    for (size_t i = key & p->index_mask;; i = (i + 1) & p->index_mask) {
        int32_t b = p->index[i];
        if (b < 0) return -1;
        if (same_block(p, b, key, parent, tokens)) return b;
    }
}

/* Index unindexed block b under (key, parent, tokens), which must not be indexed yet.
 * The table has at least twice the slots of blocks, so an empty slot exists. */
static void index_add(kv_pool *p, int32_t b, uint64_t key, uint64_t parent,
                      const int32_t *tokens) {
    assert(p->hash[b] == 0 && key != 0);
    size_t i = key & p->index_mask;
    while (p->index[i] >= 0) i = (i + 1) & p->index_mask;
    p->index[i] = b;
    p->hash[b] = key;
    p->parent[b] = parent;
    memcpy(p->tok + (size_t)b * (size_t)p->cfg.block_size, tokens,
           (size_t)p->cfg.block_size * sizeof(int32_t));
    p->n_indexed++;
}

/* Drop indexed block b: backward-shift deletion keeps every probe chain unbroken. */
static void index_del(kv_pool *p, int32_t b) {
    size_t m = p->index_mask, i = p->hash[b] & m;
    assert(p->hash[b] != 0);
    while (p->index[i] != b) {
        assert(p->index[i] >= 0);
        i = (i + 1) & m;
    }
    for (size_t j = i;;) {
        j = (j + 1) & m;
        int32_t e = p->index[j];
        if (e < 0) break;
        size_t home = p->hash[e] & m;
        /* e may fill hole i unless its home lies cyclically in (i, j]. */
        int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (stays) continue;
        p->index[i] = e;
        i = j;
    }
    p->index[i] = -1;
    p->hash[b] = 0;
    p->n_indexed--;
}

/* ---------------------------------------------------------------- LRU */

/* Units of memory block b holds (kv8 pools count units; the others count blocks). */
static int units_of(const kv_pool *p, int32_t b) { return p->q8 && !p->q8[b] ? 2 : 1; }

static void lru_push(kv_pool *p, int32_t b) { /* most recently used end */
    p->n_units_cached += units_of(p, b);
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = b;
    else p->lru_head = b;
    p->lru_tail = b;
    p->n_lru++;
}

static void lru_unlink(kv_pool *p, int32_t b) {
    p->n_units_cached -= units_of(p, b);
    int32_t pr = p->lru_prev[b], nx = p->lru_next[b];
    if (pr >= 0) p->lru_next[pr] = nx;
    else p->lru_head = nx;
    if (nx >= 0) p->lru_prev[nx] = pr;
    else p->lru_tail = pr;
    p->lru_prev[b] = p->lru_next[b] = -1;
    p->n_lru--;
}

/* ---------------------------------------------------------------- blocks */

static int fail_hook_fires(kv_pool *p) {
    if (p->fail_n <= 0) return 0;
    if (--p->fail_n > 0) return 0;
    if (p->fail_sticky) p->fail_n = 1;
    return 1;
}

/* May n fresh (f16) blocks be taken? Counts n allocations against the fail hook, so the
 * hook sees the same allocation numbers as taking them one by one; nothing is taken.
 * With kv8 each takes two units, and any two free or cached units can be made a slot
 * (eviction, then compaction), so the count is exact. */
static int can_take(kv_pool *p, int n) {
    if (p->q8 ? 2LL * n > (long long)p->n_units_free + p->n_units_cached
              : n > p->n_free + p->n_lru)
        return 0;
    for (int i = 0; i < n; i++)
        if (fail_hook_fires(p)) return 0;
    return 1;
}

/* ---- kv8: units and slots */

static uint16_t *unit_data(const kv_pool *p, int32_t unit) {
    return p->data + (size_t)unit * p->unit_elems;
}

/* Give back the units of kv8 block b (now refcount 0, not cached); b keeps no memory. */
static void units_release(kv_pool *p, int32_t b) {
    int32_t u = p->loc[b];
    if (!p->q8[b]) {
        p->owner[u] = p->owner[u + 1] = -1;
        p->n_units_free += 2;
        p->free_slots[p->n_free_slots++] = u / 2;
    } else {
        p->owner[u] = -1;
        p->n_units_free++;
        p->n_q8--;
        if (p->owner[u ^ 1] == -1) p->free_slots[p->n_free_slots++] = u / 2;
    }
    p->loc[b] = -1;
    p->q8[b] = 0;
}

/* Evict the least recently used cached block: out of the index, its memory freed. */
static void evict_lru(kv_pool *p) {
    int32_t b = p->lru_head;
    assert(b >= 0);
    lru_unlink(p, b);
    index_del(p, b);
    p->stats.evictions++;
    if (p->q8) {
        units_release(p, b);
        p->free_ids[p->n_free++] = b;
    }
}

/* A whole free slot. None on the stack: two lone free halves (each in a slot whose
 * other half holds an 8-bit block, as a slot with both halves free is on the stack)
 * are joined by moving the 8-bit neighbour of the first into the second. The caller
 * made sure two units are free. */
static int32_t slot_get(kv_pool *p) {
    if (p->n_free_slots > 0) return p->free_slots[--p->n_free_slots];
    int32_t a = -1, c = -1, n_units = 2 * p->cfg.n_blocks;
    for (int32_t u = 0; u < n_units && c < 0; u++)
        if (p->owner[u] == -1) {
            if (a < 0) a = u;
            else c = u;
        }
    assert(a >= 0 && c >= 0 && a / 2 != c / 2);
    int32_t nb = a ^ 1, x = p->owner[nb];
    assert(x >= 0 && p->q8[x] && p->loc[x] == nb);
    memcpy(unit_data(p, c), unit_data(p, nb), p->unit_elems * sizeof(uint16_t));
    p->owner[c] = x, p->owner[nb] = -1, p->loc[x] = c;
    p->stats.q8_moves++;
    return a / 2;
}

/* kv8: a fresh f16 block (a whole slot) under a free id, evicting cached blocks until
 * two units are free. */
static int32_t take_kv8(kv_pool *p) {
    while (p->n_units_free < 2) evict_lru(p);
    int32_t slot = slot_get(p);
    assert(p->n_free > 0); /* ids outnumber blocks: each holds at least one unit */
    int32_t b = p->free_ids[--p->n_free];
    p->loc[b] = 2 * slot;
    p->owner[2 * slot] = p->owner[2 * slot + 1] = b;
    p->q8[b] = 0;
    p->n_units_free -= 2;
    return b;
}

/* A fresh block at refcount 1: the free stack first, else evict the LRU cached block.
 * The caller made sure one exists (can_take). */
static int32_t block_take(kv_pool *p) {
    int32_t b;
    if (p->q8) {
        b = take_kv8(p);
    } else if (p->n_free > 0) {
        b = p->free_ids[--p->n_free];
    } else {
        b = p->lru_head;
        assert(b >= 0);
        lru_unlink(p, b);
        index_del(p, b);
        p->stats.evictions++;
    }
    assert(p->refcount[b] == 0 && p->hash[b] == 0);
    p->refcount[b] = 1;
    return b;
}

static void block_put(kv_pool *p, int32_t b) {
    assert(b >= 0 && b < p->n_ids && p->refcount[b] > 0);
    if (--p->refcount[b] > 0) return;
    if (p->hash[b]) {
        lru_push(p, b); /* cached: kv_seq_match can still revive it */
        return;
    }
    if (p->q8) units_release(p, b);
    p->free_ids[p->n_free++] = b;
}

int kv_free_blocks(const kv_pool *p) {
    return p->q8 ? (p->n_units_free + p->n_units_cached) / 2 : p->n_free + p->n_lru;
}

int kv_cached_blocks(const kv_pool *p) { return p->n_lru; }

int kv_refcount(const kv_pool *p, int32_t block) {
    if (block < 0 || block >= p->n_ids) return -1;
    return p->refcount[block];
}

void kv_fail_after(kv_pool *p, int n) {
    p->fail_n = n > 0 ? n : 0;
    p->fail_sticky = 0;
}

void kv_fail_from(kv_pool *p, int n) {
    p->fail_n = n > 0 ? n : 0;
    p->fail_sticky = n > 0;
}

/* ---------------------------------------------------------------- sequences */

static void q8_expand(kv_pool *p, int32_t src, int32_t dst); /* 8-bit blocks, below */

kv_seq *kv_seq_new(kv_pool *p) {
    for (int i = 0; i < p->cfg.max_seqs; i++) {
        kv_seq *s = &p->seqs[i];
        if (s->in_use) continue;
        s->in_use = 1;
        s->n_blocks = 0;
        s->n_tokens = 0;
        s->n_committed = 0;
        p->n_seqs_used++;
        return s;
    }
    return NULL;
}

void kv_seq_release(kv_pool *p, kv_seq *s) {
    if (!s || !s->in_use) return;
    assert(s >= p->seqs && s < p->seqs + p->cfg.max_seqs);
    /* Last block first: a sequence released right after reserve leaves the free stack
     * as it found it, and a cached sequence's tail is evicted before its head. */
    while (s->n_blocks > 0) block_put(p, s->blocks[--s->n_blocks]);
    s->n_tokens = 0;
    s->n_committed = 0;
    s->in_use = 0;
    p->n_seqs_used--;
}

int kv_seq_reserve(kv_pool *p, kv_seq *s, int n_tokens) {
    assert(s && s->in_use);
    if (n_tokens < 0) return -EINVAL;
    int need = blocks_for(p, n_tokens);
    if (need > p->cfg.max_blocks_per_seq) return -E2BIG;
    if (need <= s->n_blocks) return 0;
    /* All or nothing: the hook and the count are settled before anything is taken, so a
     * failure leaves the pool, cache included, exactly as it was. */
    if (!can_take(p, need - s->n_blocks)) return -ENOMEM;
    for (int i = s->n_blocks; i < need; i++) s->blocks[i] = block_take(p);
    s->n_blocks = need;
    return 0;
}

kv_seq *kv_seq_fork(kv_pool *p, const kv_seq *src) {
    assert(src && src->in_use);
    kv_seq *s = kv_seq_new(p);
    if (!s) return NULL;
    for (int i = 0; i < src->n_blocks; i++) {
        s->blocks[i] = src->blocks[i];
        p->refcount[src->blocks[i]]++;
    }
    memcpy(s->keys, src->keys, (size_t)src->n_committed * sizeof(uint64_t));
    s->n_blocks = src->n_blocks;
    s->n_tokens = src->n_tokens;
    s->n_committed = src->n_committed;
    return s;
}

int kv_seq_cow(kv_pool *p, kv_seq *s, int pos) {
    assert(s && s->in_use);
    if (pos < 0 || pos / p->cfg.block_size >= s->n_blocks) return -EINVAL;
    int i = pos / p->cfg.block_size;
    int32_t old = s->blocks[i];
    if (kv_is_q8(p, old)) {
        /* Writes go to f16 blocks only: a private f16 copy of the 8-bit block (taking
         * it may move old's data, so read it after), then old's reference dropped. */
        if (!can_take(p, 1)) return -ENOMEM;
        int32_t b = block_take(p);
        q8_expand(p, old, b);
        block_put(p, old);
        s->blocks[i] = b;
    } else if (p->refcount[old] <= 1) {
        /* s's alone: written in place, so it must not stay in the index (invariant 1). */
        if (p->hash[old]) index_del(p, old);
    } else {
        if (!can_take(p, 1)) return -ENOMEM;
        int32_t b = block_take(p); /* never old: old is referenced, so not cached */
        if (p->data)
            memcpy(p->data + (size_t)p->loc[b] * p->unit_elems,
                   p->data + (size_t)p->loc[old] * p->unit_elems, p->block_elems * sizeof(uint16_t));
        else
            p->copy_block(p->copy_ctx, b, old);
        p->refcount[old]--; /* was shared, so it stays >= 1 */
        s->blocks[i] = b;   /* the copy is not indexed */
    }
    if (s->n_committed > i) s->n_committed = i; /* block i's tokens are changing */
    return 0;
}

int kv_seq_truncate(kv_pool *p, kv_seq *s, int n_tokens) {
    assert(s && s->in_use);
    if (n_tokens < 0) return -EINVAL;
    int keep = blocks_for(p, n_tokens);
    while (s->n_blocks > keep) block_put(p, s->blocks[--s->n_blocks]);
    if (n_tokens < s->n_tokens) s->n_tokens = n_tokens;
    int full = s->n_tokens / p->cfg.block_size;
    if (s->n_committed > full) s->n_committed = full;
    /* A kept block past the last full one will be written again: out of the index if s
     * is its only holder (a shared one is copied by kv_seq_cow before the write). */
    for (int i = full; i < s->n_blocks; i++) {
        int32_t b = s->blocks[i];
        if (p->hash[b] && p->refcount[b] == 1) index_del(p, b);
    }
    return 0;
}

/* ---------------------------------------------------------------- 8-bit blocks */

#define Q8_CHUNK 256 /* f32 staging per call of the f16 converters */

/* The 8-bit format is int8 with one scale per slab (max |x| / 127). Measured on the
 * parity prompts (tests/unit/test_kv8.c, BENCHMARKS.md; before their chat prompts had a
 * system message): fp8 e4m3 with the same scale
 * (the CUDA backend's format) gave a higher mean KL divergence (0.0044 against 0.0034
 * nats); a scale per key channel and per value row lowered it to 0.0025 but costs an
 * eighth of the pool in scales and kept greedy output no longer. */

/* One slab of n values: f16 in, int8 out, symmetric, returns the scale. dst may be src
 * itself (in place): chunk j's bytes [j, j+1) * C overlap only source chunks <= j, each
 * read before it is overwritten. The max is taken on the f16 bits (|h| orders like the
 * values), capped at the largest finite f16: an infinity saturates to +-127 and a NaN
 * becomes 0, so a broken activation cannot poison the block's scale. */
static float slab_to_q8(const uint16_t *src, int8_t *dst, size_t n) {
    uint16_t hmax = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t a = src[i] & 0x7fff;
        hmax = a > hmax ? a : hmax;
    }
    if (hmax > 0x7bff) hmax = 0x7bff; /* 65504 */
    float amax = quant_f16_to_f32(hmax), inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    float tmp[Q8_CHUNK];
    for (size_t i = 0; i < n; i += Q8_CHUNK) {
        size_t m = n - i < Q8_CHUNK ? n - i : Q8_CHUNK;
        quant_dequant(QT_F16, src + i, tmp, (int64_t)m);
        for (size_t j = 0; j < m; j++) {
            float v = tmp[j] * inv;
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v == v ? v : 0.0f;
            dst[i + j] = (int8_t)lrintf(v);
        }
    }
    return amax / 127.0f;
}

/* n int8 values times scale, as f16. */
static void slab_to_f16(const int8_t *src, float scale, uint16_t *dst, size_t n) {
    float tmp[Q8_CHUNK];
    for (size_t i = 0; i < n; i += Q8_CHUNK) {
        size_t m = n - i < Q8_CHUNK ? n - i : Q8_CHUNK;
        for (size_t j = 0; j < m; j++) tmp[j] = (float)src[i + j] * scale;
        quant_quantize(QT_F16, tmp, dst + i, (int64_t)m);
    }
}

void kv_q8_read(const kv_pool *p, int32_t block, int layer, int head, int n, uint16_t *k,
                uint16_t *v) {
    size_t m = (size_t)n * (size_t)p->cfg.head_dim;
    slab_to_f16(kv_q8_slab(p, block, layer, 0, head), kv_q8_scale(p, block, layer, 0, head), k, m);
    slab_to_f16(kv_q8_slab(p, block, layer, 1, head), kv_q8_scale(p, block, layer, 1, head), v, m);
}

/* The f16 contents of 8-bit block src into f16 block dst. */
static void q8_expand(kv_pool *p, int32_t src, int32_t dst) {
    int slabs = slabs_of(&p->cfg);
    const int8_t *in = (const int8_t *)unit_data(p, p->loc[src]);
    uint16_t *out = unit_data(p, p->loc[dst]);
    const float *sc = p->scale + (size_t)src * (size_t)slabs;
    for (int k = 0; k < slabs; k++)
        slab_to_f16(in + (size_t)k * p->head_elems, sc[k], out + (size_t)k * p->head_elems,
                    p->head_elems);
}

int kv_block_to_q8(kv_pool *p, int32_t b) {
    if (b < 0 || b >= p->n_ids || (p->q8 && p->loc[b] < 0)) return -EINVAL;
    if (!p->q8 || p->q8[b]) return 0;
    int slabs = slabs_of(&p->cfg);
    int32_t u = p->loc[b];
    uint16_t *src = unit_data(p, u);
    int8_t *dst = (int8_t *)src;
    float *sc = p->scale + (size_t)b * (size_t)slabs;
    /* Slab k's int8 bytes [k, k+1) * he overlap only f16 slabs <= k, already read. */
    for (int k = 0; k < slabs; k++)
        sc[k] = slab_to_q8(src + (size_t)k * p->head_elems, dst + (size_t)k * p->head_elems,
                           p->head_elems);
    int cached = p->refcount[b] == 0; /* on the LRU: it now holds one unit, not two */
    if (cached) p->n_units_cached--;
    p->q8[b] = 1;
    p->owner[u + 1] = -1;
    p->n_units_free++;
    p->n_q8++;
    p->stats.q8_conversions++;
    return 1;
}

int kv_seq_to_q8(kv_pool *p, kv_seq *s, int n_written, int max) {
    if (!p->q8 || !s || !s->in_use) return 0;
    int full = n_written / p->cfg.block_size, done = 0;
    if (full > s->n_blocks) full = s->n_blocks;
    for (int i = 0; i < full && done < max; i++) done += kv_block_to_q8(p, s->blocks[i]) == 1;
    return done;
}

int kv_cached_to_q8(kv_pool *p, int max) {
    int done = 0;
    for (int32_t b = p->lru_head; p->q8 && b >= 0 && done < max; b = p->lru_next[b])
        done += kv_block_to_q8(p, b) == 1;
    return done;
}

int kv_q8_blocks(const kv_pool *p) { return p->n_q8; }

/* ---------------------------------------------------------------- prefix cache */

int kv_seq_commit(kv_pool *p, kv_seq *s, const int32_t *tokens, int n_tokens) {
    assert(s && s->in_use);
    if (!p->cfg.prefix_cache) return 0;
    int bs = p->cfg.block_size;
    if (n_tokens < 0 || (long long)n_tokens > (long long)s->n_blocks * bs) return -EINVAL;
    if (s->n_tokens < n_tokens) s->n_tokens = n_tokens; /* declared written */
    int full = n_tokens / bs, added = 0;
    for (int i = s->n_committed; i < full; i++) {
        const int32_t *t = tokens + (size_t)i * (size_t)bs;
        uint64_t parent = i ? s->keys[i - 1] : KV_KEY_SEED;
        uint64_t key = kv_block_key(parent, t, bs);
        int32_t b = s->blocks[i];
        /* Index b unless it already is (shared with a sequence that committed it; kept
         * as it is even if s now sees other tokens before it, since its contents belong
         * to the prefix it was indexed under) or an identical block is. */
        if (p->hash[b] == 0 && index_find(p, key, parent, t) < 0) index_add(p, b, key, parent, t);
        s->keys[i] = key;
        s->n_committed = i + 1;
        added++;
    }
    return added;
}

int kv_seq_match(kv_pool *p, kv_seq *s, const int32_t *tokens, int n_tokens) {
    assert(s && s->in_use);
    if (!p->cfg.prefix_cache) return 0;
    if (n_tokens < 0 || s->n_blocks != 0) return -EINVAL;
    int bs = p->cfg.block_size;
    int max = n_tokens > 0 ? (n_tokens - 1) / bs : 0; /* leave the last token to compute */
    if (max > p->cfg.max_blocks_per_seq) max = p->cfg.max_blocks_per_seq;
    uint64_t parent = KV_KEY_SEED;
    int i = 0;
    for (; i < max; i++) {
        const int32_t *t = tokens + (size_t)i * (size_t)bs;
        uint64_t key = kv_block_key(parent, t, bs);
        int32_t b = index_find(p, key, parent, t);
        if (b < 0) break;
        if (p->refcount[b]++ == 0) lru_unlink(p, b); /* revived from the cache */
        s->blocks[i] = b;
        s->keys[i] = key;
        parent = key;
    }
    s->n_blocks = s->n_committed = i;
    s->n_tokens = i * bs;
    p->stats.prefix_queries += (uint64_t)n_tokens;
    p->stats.prefix_hits += (uint64_t)s->n_tokens;
    return s->n_tokens;
}

/* ---------------------------------------------------------------- consistency */

#define FAIL(...) (snprintf(err, errlen, __VA_ARGS__), -EFAULT)

/* kv8: every id's memory against the unit owners, the free-slot stack and the unit
 * counters. Ids on the free stack hold nothing; in-use and cached ones hold one unit
 * (8-bit) or a whole slot (f16). */
static int check_units(const kv_pool *p, char *err, size_t errlen) {
    int n_units = 2 * p->cfg.n_blocks, free_u = 0, cached_u = 0, q8 = 0;
    int32_t *seen = p->scratch; /* free-slot marks; reused after kv_check's passes */
    for (int32_t b = 0; b < p->n_ids; b++) {
        int32_t u = p->loc[b];
        int holds = p->refcount[b] > 0 || p->hash[b] != 0;
        if (!holds) {
            if (u != -1 || p->q8[b]) return FAIL("free id %d holds unit %d (q8 %d)", b, u, p->q8[b]);
            continue;
        }
        if (u < 0 || u >= n_units) return FAIL("block %d: unit %d out of range", b, u);
        if (p->owner[u] != b) return FAIL("block %d: unit %d owned by %d", b, u, p->owner[u]);
        if (!p->q8[b] && (u % 2 || p->owner[u + 1] != b))
            return FAIL("f16 block %d: unit %d is not a whole slot of its own", b, u);
        q8 += p->q8[b];
        if (p->refcount[b] == 0) cached_u += p->q8[b] ? 1 : 2;
    }
    for (int32_t u = 0; u < n_units; u++) {
        int32_t b = p->owner[u];
        if (b == -1) {
            free_u++;
            continue;
        }
        if (b < 0 || b >= p->n_ids || (p->loc[b] != u && (p->q8[b] || p->loc[b] != u - 1)))
            return FAIL("unit %d: owner %d does not hold it", u, b);
    }
    memset(seen, 0, (size_t)p->n_ids * sizeof *seen);
    int whole = 0;
    for (int s = 0; s < p->cfg.n_blocks; s++) whole += p->owner[2 * s] == -1 && p->owner[2 * s + 1] == -1;
    for (int k = 0; k < p->n_free_slots; k++) {
        int32_t s = p->free_slots[k];
        if (s < 0 || s >= p->cfg.n_blocks || seen[s]++ || p->owner[2 * s] != -1 ||
            p->owner[2 * s + 1] != -1)
            return FAIL("free slot stack[%d] = %d: out of range, twice or in use", k, s);
    }
    if (whole != p->n_free_slots)
        return FAIL("%d slots wholly free, %d on the free-slot stack", whole, p->n_free_slots);
    if (free_u != p->n_units_free || cached_u != p->n_units_cached || q8 != p->n_q8)
        return FAIL("units free %d / cached %d / 8-bit blocks %d; counters say %d / %d / %d",
                    free_u, cached_u, q8, p->n_units_free, p->n_units_cached, p->n_q8);
    return 0;
}

int kv_check(const kv_pool *p, char *err, size_t errlen) {
    const kv_config *c = &p->cfg;
    int nb = p->n_ids, bs = c->block_size;
    int32_t *refs = p->scratch; /* page-table references per block, then list marks */
    memset(refs, 0, (size_t)nb * sizeof *refs);
    int used = 0;
    for (int i = 0; i < c->max_seqs; i++) {
        const kv_seq *s = &p->seqs[i];
        if (s->id != i || s->blocks != p->tables + (size_t)i * (size_t)c->max_blocks_per_seq ||
            s->keys != p->seq_keys + (size_t)i * (size_t)c->max_blocks_per_seq)
            return FAIL("seq %d: id %d or page table pointers corrupted", i, s->id);
        if (!s->in_use) {
            if (s->n_blocks || s->n_tokens || s->n_committed)
                return FAIL("seq %d: free but holds %d blocks, %d tokens, %d committed", i,
                            s->n_blocks, s->n_tokens, s->n_committed);
            continue;
        }
        used++;
        if (s->n_blocks < 0 || s->n_blocks > c->max_blocks_per_seq || s->n_tokens < 0 ||
            (long long)s->n_tokens > (long long)s->n_blocks * bs)
            return FAIL("seq %d: n_blocks %d, n_tokens %d out of range", i, s->n_blocks,
                        s->n_tokens);
        if (s->n_committed < 0 || s->n_committed > s->n_tokens / bs)
            return FAIL("seq %d: %d blocks committed, %d tokens written", i, s->n_committed,
                        s->n_tokens);
        for (int j = 0; j < s->n_committed; j++)
            if (s->keys[j] == 0) return FAIL("seq %d: committed block %d has key 0", i, j);
        for (int j = 0; j < s->n_blocks; j++) {
            int32_t b = s->blocks[j];
            if (b < 0 || b >= nb) return FAIL("seq %d: page %d -> block %d out of range", i, j, b);
            refs[b]++;
        }
    }
    if (used != p->n_seqs_used)
        return FAIL("%d seqs in use, counter says %d", used, p->n_seqs_used);
    int n_zero = 0, n_keyed = 0;
    for (int b = 0; b < nb; b++) {
        if (p->refcount[b] != refs[b])
            return FAIL("block %d: refcount %d, %d page-table references", b, p->refcount[b],
                        refs[b]);
        n_zero += refs[b] == 0;
        n_keyed += p->hash[b] != 0;
    }

    /* Refcount-0 blocks: each on exactly one of the free stack and the LRU list. Marks:
     * 0 unseen, -1 free stack, -2 LRU (refs[] is 0 for all of them by now). */
    if (p->n_free < 0 || p->n_lru < 0 || p->n_free + p->n_lru != n_zero)
        return FAIL("free stack %d + LRU %d, %d blocks at refcount 0", p->n_free, p->n_lru,
                    n_zero);
    for (int k = 0; k < p->n_free; k++) {
        int32_t b = p->free_ids[k];
        if (b < 0 || b >= nb || p->refcount[b] != 0 || refs[b] != 0)
            return FAIL("free list[%d] = block %d: out of range, in use or twice", k, b);
        if (p->hash[b]) return FAIL("free block %d is indexed", b);
        refs[b] = -1;
    }
    int n = 0;
    for (int32_t b = p->lru_head, prev = -1; b != -1; prev = b, b = p->lru_next[b], n++) {
        if (b < 0 || b >= nb || n >= p->n_lru)
            return FAIL("LRU entry %d: block %d out of range, or the list is longer than %d", n,
                        b, p->n_lru);
        if (p->refcount[b] != 0 || refs[b] != 0)
            return FAIL("LRU block %d: refcount %d, or on a list twice", b, p->refcount[b]);
        if (!p->hash[b]) return FAIL("LRU block %d is not indexed", b);
        if (p->lru_prev[b] != prev)
            return FAIL("LRU block %d: prev %d, expected %d", b, p->lru_prev[b], prev);
        if (p->lru_next[b] == -1 && p->lru_tail != b)
            return FAIL("LRU ends at %d, tail says %d", b, p->lru_tail);
        refs[b] = -2;
    }
    if (n != p->n_lru) return FAIL("LRU list holds %d, counter says %d", n, p->n_lru);
    if ((p->lru_head == -1) != (p->lru_tail == -1))
        return FAIL("LRU head %d, tail %d", p->lru_head, p->lru_tail);
    for (int b = 0; b < nb; b++)
        if (refs[b] != -2 && (p->lru_prev[b] != -1 || p->lru_next[b] != -1))
            return FAIL("block %d is off the LRU but linked (%d, %d)", b, p->lru_prev[b],
                        p->lru_next[b]);

    /* The index: exactly the keyed blocks, once each, each found by its own lookup. */
    memset(refs, 0, (size_t)nb * sizeof *refs);
    int n_slots = 0;
    for (size_t i = 0; i <= p->index_mask; i++) {
        int32_t b = p->index[i];
        if (b == -1) continue;
        if (b < 0 || b >= nb) return FAIL("index slot %zu: block %d out of range", i, b);
        if (!p->hash[b]) return FAIL("index slot %zu: block %d has no key", i, b);
        if (refs[b]++) return FAIL("block %d indexed twice", b);
        n_slots++;
    }
    if (n_slots != n_keyed || n_slots != p->n_indexed)
        return FAIL("index holds %d, %d blocks keyed, counter says %d", n_slots, n_keyed,
                    p->n_indexed);
    for (int b = 0; b < nb; b++) {
        if (!p->hash[b]) continue;
        const int32_t *t = p->tok + (size_t)b * (size_t)bs;
        if (p->hash[b] != kv_block_key(p->parent[b], t, bs))
            return FAIL("block %d: stored key is not the key of its parent and tokens", b);
        int32_t f = index_find(p, p->hash[b], p->parent[b], t);
        if (f != b) return FAIL("block %d: its key %016llx finds block %d", b,
                                (unsigned long long)p->hash[b], f);
    }
    return p->q8 ? check_units(p, err, errlen) : 0;
}
#undef FAIL
