/* kv8: 8-bit blocks (cfg.kv8, the degrade ladder's rung 2): the units of slots (halves,
 * or quarters for Gemma 3's gone blocks), their allocation and compaction, and the f16
 * <-> int8 conversion of host data through the caller's converters, cfg.f16 (external
 * data: the owner's kv_ext moves and converts; see kv.h). */
#include "mm/kv.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <string.h>

#include "mm/kv_int.h"

/* ---------------------------------------------------------------- units and slots */

static int slot_is_free(const kv_pool *p, int32_t s) {
    for (int i = 0; i < p->units; i++)
        if (p->owner[s * p->units + i] != -1) return 0;
    return 1;
}

/* Give back the units of block b (now refcount 0, not cached); b keeps no memory. */
void kv_units_release(kv_pool *p, int32_t b) {
    int32_t u = p->loc[b], k = kv_units_of(p, b);
    for (int i = 0; i < k; i++) p->owner[u + i] = -1;
    p->n_units_free += k;
    p->n_q8 -= p->q8[b];
    if (slot_is_free(p, u / p->units)) p->free_slots[p->n_free_slots++] = u / p->units;
    p->loc[b] = -1;
    p->q8[b] = 0;
    if (p->gone) p->gone[b] = KV_WHOLE;
}

void kv_units_shrink(kv_pool *p, int32_t b, int keep) {
    int32_t u = p->loc[b], k = kv_units_of(p, b);
    assert(k == p->units && keep >= 1 && keep < k && u % k == 0);
    if (p->refcount[b] == 0) p->n_units_cached -= k - keep; /* on the LRU: fewer units now */
    for (int i = keep; i < k; i++) p->owner[u + i] = -1;
    p->n_units_free += k - keep;
}

/* Evict the least recently used cached block: out of the index, its memory freed. */
static void evict_lru(kv_pool *p) {
    int32_t b = p->lru_head;
    assert(b >= 0);
    kv_lru_unlink(p, b);
    kv_index_del(p, b);
    p->stats.evictions++;
    if (p->q8) {
        kv_units_release(p, b);
        p->free_ids[p->n_free++] = b;
    }
}

/* Block x's k units to the free units at `to`. */
static void move_units(kv_pool *p, int32_t x, int32_t to) {
    int32_t from = p->loc[x], k = kv_units_of(p, x);
    if (p->data)
        memcpy(kv_unit_data(p, to), kv_unit_data(p, from), (size_t)k * p->unit_elems * sizeof(uint16_t));
    else
        p->ext.copy(p->ext.ctx, to, from, k);
    for (int i = 0; i < k; i++) p->owner[to + i] = x, p->owner[from + i] = -1;
    p->loc[x] = to;
    p->stats.q8_moves++;
}

/* The first run of k free units aligned to k outside slot avoid, or -1. */
static int32_t free_run(const kv_pool *p, int k, int32_t avoid) {
    int32_t n_units = p->units * p->cfg.n_blocks;
    for (int32_t u = 0; u < n_units; u += k) {
        if (u / p->units == avoid) continue;
        int i = 0;
        while (i < k && p->owner[u + i] == -1) i++;
        if (i == k) return u;
    }
    return -1;
}

/* A free run of k (1 or half a slot) outside slot avoid. With none of half a slot, two
 * half-slots outside it each have one free unit (there are at least k free units out
 * there, the caller counted), and such a half's other unit is a gone block (an 8-bit
 * block fills its half): that block moves into the other's free unit. Quarters only:
 * with halves for units, k is 1 and a free unit is always there. */
static int32_t make_run(kv_pool *p, int k, int32_t avoid) {
    int32_t u = free_run(p, k, avoid);
    if (u >= 0 || k == 1) return u;
    assert(k == 2 && p->units == 4);
    int32_t a = -1, c = -1;
    for (int32_t v = 0; v < p->units * p->cfg.n_blocks && c < 0; v++)
        if (p->owner[v] == -1 && v / p->units != avoid) {
            if (a < 0) a = v;
            else if (v / 2 != a / 2) c = v;
        }
    assert(a >= 0 && c >= 0);
    int32_t g = p->owner[a ^ 1];
    assert(g >= 0 && kv_units_of(p, g) == 1);
    move_units(p, g, c);
    return a & ~1;
}

/* A whole free slot. None on the stack: the slot with the most free units is emptied,
 * its blocks (one-unit gone blocks, half-slot 8-bit ones) moved to free units elsewhere.
 * The caller made sure a slot's worth of units is free, so they fit. */
static int32_t slot_get(kv_pool *p) {
    if (p->n_free_slots > 0) return p->free_slots[--p->n_free_slots];
    int32_t best = -1, most = -1;
    for (int32_t s = 0; s < p->cfg.n_blocks; s++) {
        int f = 0;
        for (int i = 0; i < p->units; i++) f += p->owner[s * p->units + i] == -1;
        if (f > most) most = f, best = s;
    }
    assert(best >= 0);
    for (int i = 0; i < p->units;) {
        int32_t x = p->owner[best * p->units + i];
        if (x < 0) {
            i++;
            continue;
        }
        int k = kv_units_of(p, x);
        assert(k < p->units && p->loc[x] == best * p->units + i);
        move_units(p, x, make_run(p, k, best));
        i += k;
    }
    return best;
}

/* A fresh f16 block (a whole slot) under a free id, evicting cached blocks and halving
 * spare ones until a slot's worth of units is free. */
int32_t kv_units_take(kv_pool *p) {
    while (p->n_units_free < p->units) { /* the cache first: spare blocks serve matches too */
        if (p->lru_head < 0) kv_spare_take(p);
        else evict_lru(p);
    }
    int32_t slot = slot_get(p);
    assert(p->n_free > 0); /* ids outnumber blocks: each holds at least one unit */
    int32_t b = p->free_ids[--p->n_free];
    p->loc[b] = p->units * slot;
    for (int i = 0; i < p->units; i++) p->owner[p->units * slot + i] = b;
    p->q8[b] = 0;
    if (p->gone) p->gone[b] = KV_WHOLE;
    p->n_units_free -= p->units;
    return b;
}

/* ---------------------------------------------------------------- conversion */

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
static float slab_to_q8(const kv_f16_conv *cv, const uint16_t *src, int8_t *dst, size_t n) {
    uint16_t hmax = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t a = src[i] & 0x7fff;
        hmax = a > hmax ? a : hmax;
    }
    if (hmax > 0x7bff) hmax = 0x7bff; /* 65504 */
    float amax; /* finite: every exact converter gives the same value */
    cv->to_f32(&hmax, &amax, 1);
    float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    float tmp[Q8_CHUNK];
    for (size_t i = 0; i < n; i += Q8_CHUNK) {
        size_t m = n - i < Q8_CHUNK ? n - i : Q8_CHUNK;
        cv->to_f32(src + i, tmp, (int64_t)m);
        for (size_t j = 0; j < m; j++) {
            float v = tmp[j] * inv;
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v == v ? v : 0.0f;
            dst[i + j] = (int8_t)lrintf(v);
        }
    }
    return amax / 127.0f;
}

/* n int8 values times scale, as f16. */
static void slab_to_f16(const kv_f16_conv *cv, const int8_t *src, float scale, uint16_t *dst,
                        size_t n) {
    float tmp[Q8_CHUNK];
    for (size_t i = 0; i < n; i += Q8_CHUNK) {
        size_t m = n - i < Q8_CHUNK ? n - i : Q8_CHUNK;
        for (size_t j = 0; j < m; j++) tmp[j] = (float)src[i + j] * scale;
        cv->to_f16(tmp, dst + i, (int64_t)m);
    }
}

void kv_q8_read(const kv_pool *p, int32_t block, int layer, int head, uint16_t *k, uint16_t *v) {
    size_t m = p->head_elems;
    const kv_f16_conv *cv = &p->cfg.f16;
    slab_to_f16(cv, kv_q8_slab(p, block, layer, 0, head), kv_q8_scale(p, block, layer, 0, head),
                k, m);
    slab_to_f16(cv, kv_q8_slab(p, block, layer, 1, head), kv_q8_scale(p, block, layer, 1, head),
                v, m);
}

/* The f16 contents of 8-bit block src into f16 block dst. */
void kv_q8_expand(kv_pool *p, int32_t src, int32_t dst) {
    if (!p->data) {
        p->ext.expand(p->ext.ctx, p->loc[dst], p->loc[src]);
        return;
    }
    int slabs = kv_slabs_of(&p->cfg);
    const int8_t *in = (const int8_t *)kv_unit_data(p, p->loc[src]);
    uint16_t *out = kv_unit_data(p, p->loc[dst]);
    const float *sc = p->scale + (size_t)src * (size_t)slabs;
    for (int k = 0; k < slabs; k++)
        slab_to_f16(&p->cfg.f16, in + (size_t)k * p->head_elems, sc[k],
                    out + (size_t)k * p->head_elems, p->head_elems);
}

int kv_block_to_q8(kv_pool *p, int32_t b) {
    if (b < 0 || b >= p->n_ids || (p->q8 && p->loc[b] < 0)) return -EINVAL;
    /* already 8-bit, or gone: one unit, its windowed slabs hold nothing */
    if (!p->cfg.kv8 || kv_units_of(p, b) < p->units) return 0;
    if (p->gone && p->gone[b] == KV_SPARE) kv_spare_unlink(p, b); /* half a slot, every layer kept */
    if (p->data) {
        int slabs = kv_slabs_of(&p->cfg);
        uint16_t *src = kv_unit_data(p, p->loc[b]);
        int8_t *dst = (int8_t *)src;
        float *sc = p->scale + (size_t)b * (size_t)slabs;
        /* Slab k's int8 bytes [k, k+1) * he overlap only f16 slabs <= k, already read. */
        for (int k = 0; k < slabs; k++)
            sc[k] = slab_to_q8(&p->cfg.f16, src + (size_t)k * p->head_elems,
                               dst + (size_t)k * p->head_elems, p->head_elems);
    } else {
        p->ext.to_q8(p->ext.ctx, p->loc[b]);
    }
    kv_units_shrink(p, b, p->units / 2);
    p->q8[b] = 1;
    p->n_q8++;
    p->stats.q8_conversions++;
    return 1;
}

int kv_seq_to_q8(kv_pool *p, kv_seq *s, int n_written, int max) {
    if (!p->cfg.kv8 || !s || !s->in_use) return 0;
    int full = n_written / p->cfg.block_size, done = 0;
    if (full > s->n_blocks) full = s->n_blocks;
    for (int i = 0; i < full && done < max; i++)
        done += s->blocks[i] >= 0 && kv_block_to_q8(p, s->blocks[i]) == 1; /* holes hold nothing */
    return done;
}

int kv_cached_to_q8(kv_pool *p, int max) {
    int done = 0;
    for (int32_t b = p->lru_head; p->cfg.kv8 && b >= 0 && done < max; b = p->lru_next[b])
        done += kv_block_to_q8(p, b) == 1;
    return done;
}

int kv_q8_blocks(const kv_pool *p) { return p->n_q8; }
