/* kv: the KV block pool: sizes, init, block allocation, refcounts, page tables and
 * copy-on-write (see kv.h). The prefix index and its LRU are in kv_prefix.c, 8-bit
 * blocks in kv8.c, the consistency checks in kv_check.c. */
#include "mm/kv.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "mm/kv_int.h"

/* ---------------------------------------------------------------- sizes */

/* What the pool frees of windowed KV (kv.h's top): holes when every layer is windowed,
 * a gone block's second unit when the global layers fit in its first. */
static int swa_mode(const kv_config *c) {
    int nw = 0;
    for (int l = 0; l < c->n_layers; l++) nw += kv_swa_layer(c, l);
    if (nw == 0) return KV_SWA_NONE;
    if (nw == c->n_layers) return KV_SWA_HOLES;
    return 2 * (c->n_layers - nw) <= c->n_layers ? KV_SWA_SHRINK : KV_SWA_NONE;
}

/* Units a slot is made of: two (halves) for kv8 and for gone blocks; four (quarters)
 * when the global layers fit in a quarter of a block (Gemma 3: 4 of 26 layers), so a
 * gone block keeps a quarter, not half. 1: the pool counts whole blocks. */
static int slot_units(const kv_config *c) {
    int m = swa_mode(c), ng = 0;
    for (int l = 0; l < c->n_layers; l++) ng += !kv_swa_layer(c, l);
    if (m == KV_SWA_SHRINK) return 4 * ng <= c->n_layers ? 4 : 2;
    return c->kv8 ? 2 : 1;
}
static int has_units(const kv_config *c) { return slot_units(c) > 1; }

/* kv8 on host data needs the caller's f16 converters (external data: the owner's
 * kv_ext converts). Windows are host-only: a device's page tables may not hold holes,
 * and its kernels read every layer of a block. */
static int cfg_valid(const kv_config *c) {
    return c->n_layers > 0 && c->n_kv_heads > 0 && c->head_dim > 0 && c->block_size > 0 &&
           c->n_blocks > 0 && c->max_seqs > 0 && c->max_blocks_per_seq > 0 &&
           (c->swa_window <= 0 || (c->n_layers <= KV_MAX_LAYERS && !c->external_data)) &&
           (!has_units(c) || c->n_blocks <= INT_MAX / 4) &&
           (!c->kv8 || c->external_data || (c->f16.to_f32 && c->f16.to_f16));
}

/* Ids: one per unit, as every block holds one at least. */
static int n_ids_of(const kv_config *c) { return slot_units(c) * c->n_blocks; }

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
    size_t seqs, tables, seq_keys, loc, owner, q8, scale, free_slots, lslot, gone, need, spare, total;
    size_t index_cap; /* slots: power of two >= 2 * n_ids */
} kv_layout;

static size_t align_up(size_t x, size_t a) { return (x + a - 1) & ~(a - 1); }

static size_t layout_of(const kv_config *c, kv_layout *l) {
    /* per-id metadata is sized by ids (2 per slot with kv8), the data by slots */
    size_t nb = (size_t)n_ids_of(c), ns = (size_t)c->n_blocks, ms = (size_t)c->max_seqs;
    size_t data, tables, tok, be = block_elems(c), un = has_units(c);
    size_t k8 = c->kv8 && !c->external_data; /* the owner keeps external blocks' scales */
    size_t sh = swa_mode(c) == KV_SWA_SHRINK;
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
    l->owner = off, off = align_up(off + un * nb * sizeof(int32_t), 64); /* units = ids */
    l->q8 = off, off = align_up(off + un * nb, 64);
    l->scale = off, off = align_up(off + k8 * nb * (size_t)kv_slabs_of(c) * sizeof(float), 64);
    l->free_slots = off, off = align_up(off + un * ns * sizeof(int32_t), 64);
    l->lslot = off, off = align_up(off + (size_t)c->n_layers * sizeof(int32_t), 64);
    l->gone = off, off = align_up(off + sh * nb, 64);
    l->need = off, off = align_up(off + sh * nb * sizeof(int32_t), 64);
    l->spare = off, off = align_up(off + 2 * sh * nb * sizeof(int32_t), 64); /* prev, next */
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
    p->units = slot_units(cfg);
    p->unit_elems = p->block_elems / (size_t)p->units;
    p->loc = (int32_t *)(mem + l.loc);
    if (has_units(cfg)) {
        p->owner = (int32_t *)(mem + l.owner);
        p->q8 = mem + l.q8;
        p->free_slots = (int32_t *)(mem + l.free_slots);
    }
    if (cfg->kv8 && !cfg->external_data) p->scale = (float *)(mem + l.scale);
    p->swa = swa_mode(cfg);
    p->lslot = (int32_t *)(mem + l.lslot);
    if (p->swa == KV_SWA_SHRINK) {
        p->gone = mem + l.gone;
        p->need = (int32_t *)(mem + l.need);
        p->sp_prev = (int32_t *)(mem + l.spare);
        p->sp_next = p->sp_prev + p->n_ids;
    }
    /* An arena need not hand out zeroed memory (cuMemHostAlloc); the metadata must be. */
    memset(mem + l.refcount, 0, l.total - l.refcount);

    /* Pushed high to low so block 0 is handed out first: deterministic for tests. */
    for (int i = p->n_ids - 1; i >= 0; i--) p->free_ids[p->n_free++] = i;
    memset(p->lru_prev, 0xff, (size_t)p->n_ids * sizeof(int32_t)); /* all -1 */
    memset(p->lru_next, 0xff, (size_t)p->n_ids * sizeof(int32_t));
    int slot = 0; /* global layers first: a gone block keeps them in its first unit */
    for (int w = 0; w < 2; w++)
        for (int i = 0; i < cfg->n_layers; i++)
            if (kv_swa_layer(cfg, i) == w) p->lslot[i] = slot++;
    if (p->q8) { /* ids hold no memory until taken; every slot is free */
        memset(p->loc, 0xff, (size_t)p->n_ids * sizeof(int32_t));
        memset(p->owner, 0xff, (size_t)p->n_ids * sizeof(int32_t));
        for (int i = cfg->n_blocks - 1; i >= 0; i--) p->free_slots[p->n_free_slots++] = i;
        p->n_units_free = p->units * cfg->n_blocks;
    } else {
        for (int i = 0; i < p->n_ids; i++) p->loc[i] = i; /* a block is its slot */
    }
    memset(p->index, 0xff, l.index_cap * sizeof(int32_t));
    p->lru_head = p->lru_tail = -1;
    p->sp_head = p->sp_tail = -1;
    if (p->sp_prev) memset(p->sp_prev, 0xff, 2 * (size_t)p->n_ids * sizeof(int32_t));
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

/* ---------------------------------------------------------------- blocks */

static int fail_hook_fires(kv_pool *p) {
    if (p->fail_n <= 0) return 0;
    if (--p->fail_n > 0) return 0;
    if (p->fail_sticky) p->fail_n = 1;
    return 1;
}

/* May n fresh (f16) blocks be taken? Counts n allocations against the fail hook, so the
 * hook sees the same allocation numbers as taking them one by one; nothing is taken.
 * With units each takes a slot's, and any that many free, cached or spare units can be
 * made a slot (eviction, spare halving, then compaction), so the count is exact. */
static int can_take(kv_pool *p, int n) {
    if (p->q8 ? (long long)p->units * n > (long long)p->n_units_free + p->n_units_cached + kv_spare_units(p)
              : n > p->n_free + p->n_lru)
        return 0;
    for (int i = 0; i < n; i++)
        if (fail_hook_fires(p)) return 0;
    return 1;
}

/* A fresh block at refcount 1: the free stack first, else evict the LRU cached block.
 * The caller made sure one exists (can_take). */
static int32_t block_take(kv_pool *p) {
    int32_t b;
    if (p->q8) {
        b = kv_units_take(p);
    } else if (p->n_free > 0) {
        b = p->free_ids[--p->n_free];
    } else {
        b = p->lru_head;
        assert(b >= 0);
        kv_lru_unlink(p, b);
        kv_index_del(p, b);
        p->stats.evictions++;
    }
    assert(p->refcount[b] == 0 && p->hash[b] == 0);
    p->refcount[b] = 1;
    if (p->need) p->need[b] = 1; /* taken for a page at or past its sequence's swa_lo */
    return b;
}

void kv_block_put(kv_pool *p, int32_t b) {
    assert(b >= 0 && b < p->n_ids && p->refcount[b] > 0);
    if (--p->refcount[b] > 0) return;
    if (p->gone && p->gone[b] == KV_SPARE) kv_spare_unlink(p, b); /* the cache evicts it whole */
    if (p->hash[b]) {
        kv_lru_push(p, b); /* cached: kv_seq_match can still revive it */
        return;
    }
    if (p->q8) kv_units_release(p, b);
    p->free_ids[p->n_free++] = b;
}

/* s lets go of its page i (a hole holds nothing). */
static void seq_put(kv_pool *p, const kv_seq *s, int i) {
    int32_t b = s->blocks[i];
    if (b < 0) return;
    kv_block_put(p, b);
    if (p->need && i >= s->swa_lo) kv_need_dec(p, b); /* the others may be past it */
}

int kv_free_blocks(const kv_pool *p) {
    return p->q8 ? (p->n_units_free + p->n_units_cached + kv_spare_units(p)) / p->units : p->n_free + p->n_lru;
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

kv_seq *kv_seq_new(kv_pool *p) {
    for (int i = 0; i < p->cfg.max_seqs; i++) {
        kv_seq *s = &p->seqs[i];
        if (s->in_use) continue;
        s->in_use = 1;
        s->n_blocks = 0;
        s->n_tokens = 0;
        s->n_committed = 0;
        s->swa_lo = 0;
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
    while (s->n_blocks > 0) seq_put(p, s, --s->n_blocks);
    s->n_tokens = 0;
    s->n_committed = 0;
    s->swa_lo = 0;
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
        int32_t b = s->blocks[i] = src->blocks[i];
        if (b < 0) continue; /* a hole */
        p->refcount[b]++;
        if (p->need && i >= src->swa_lo) kv_need_inc(p, b);
    }
    memcpy(s->keys, src->keys, (size_t)src->n_committed * sizeof(uint64_t));
    s->swa_lo = src->swa_lo;
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
    if (i < s->swa_lo) return -EINVAL; /* its windowed KV may be gone: never written again */
    if (kv_is_q8(p, old)) {
        /* Writes go to f16 blocks only: a private f16 copy of the 8-bit block (taking
         * it may move old's data, so read it after), then old's reference dropped. */
        if (!can_take(p, 1)) return -ENOMEM;
        int32_t b = block_take(p);
        kv_q8_expand(p, old, b);
        seq_put(p, s, i);
        s->blocks[i] = b;
    } else if (p->refcount[old] <= 1) {
        /* s's alone: written in place, so it must not stay in the index (invariant 1). */
        if (p->hash[old]) kv_index_del(p, old);
    } else {
        if (!can_take(p, 1)) return -ENOMEM;
        int32_t b = block_take(p); /* never old: old is referenced, so not cached */
        if (p->data)
            memcpy(p->data + (size_t)p->loc[b] * p->unit_elems,
                   p->data + (size_t)p->loc[old] * p->unit_elems, p->block_elems * sizeof(uint16_t));
        else
            p->ext.copy(p->ext.ctx, p->loc[b], p->loc[old], p->units);
        p->refcount[old]--; /* was shared, so it stays >= 1 */
        if (p->need) kv_need_dec(p, old);
        s->blocks[i] = b;   /* the copy is not indexed */
    }
    if (s->n_committed > i) s->n_committed = i; /* block i's tokens are changing */
    return 0;
}

int kv_seq_truncate(kv_pool *p, kv_seq *s, int n_tokens) {
    assert(s && s->in_use);
    if (n_tokens < 0) return -EINVAL;
    int keep = blocks_for(p, n_tokens);
    /* Rewinding moves the window back (position n_tokens is written next): the pages it
     * reaches again must still be whole. */
    int lo = kv_window_page(p, n_tokens);
    for (int i = lo; i < s->swa_lo && i < keep; i++)
        if (s->blocks[i] < 0 || kv_gone(p, s->blocks[i])) return -EINVAL;
    for (; s->swa_lo > lo; s->swa_lo--)
        if (p->need && s->swa_lo - 1 < s->n_blocks) kv_need_inc(p, s->blocks[s->swa_lo - 1]);
    while (s->n_blocks > keep) seq_put(p, s, --s->n_blocks);
    if (s->swa_lo > s->n_blocks) s->swa_lo = s->n_blocks;
    if (n_tokens < s->n_tokens) s->n_tokens = n_tokens;
    int full = s->n_tokens / p->cfg.block_size;
    if (s->n_committed > full) s->n_committed = full;
    /* A kept block past the last full one will be written again: out of the index if s
     * is its only holder (a shared one is copied by kv_seq_cow before the write). */
    for (int i = full; i < s->n_blocks; i++) {
        int32_t b = s->blocks[i];
        if (p->hash[b] && p->refcount[b] == 1) kv_index_del(p, b);
    }
    return 0;
}
