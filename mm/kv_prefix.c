/* kv_prefix: the prefix cache: block keys, the hash index key -> block, the LRU list
 * of cached blocks, kv_seq_commit and kv_seq_match (see kv.h). */
#include "mm/kv.h"

#include <assert.h>
#include <errno.h>
#include <string.h>

#include "mm/kv_int.h"

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
int32_t kv_index_find(const kv_pool *p, uint64_t key, uint64_t parent, const int32_t *tokens) {
    for (size_t i = key & p->index_mask;; i = (i + 1) & p->index_mask) {
        int32_t b = p->index[i];
        if (b < 0) return -1;
        if (same_block(p, b, key, parent, tokens)) return b;
    }
}

/* Index unindexed block b under (key, parent, tokens), which must not be indexed yet.
 * The table has at least twice the slots of blocks, so an empty slot exists. */
void kv_index_add(kv_pool *p, int32_t b, uint64_t key, uint64_t parent, const int32_t *tokens) {
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
void kv_index_del(kv_pool *p, int32_t b) {
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

void kv_lru_push(kv_pool *p, int32_t b) { /* most recently used end */
    p->n_units_cached += kv_units_of(p, b);
    kv_list_push(p->lru_prev, p->lru_next, &p->lru_head, &p->lru_tail, b);
    p->n_lru++;
}

void kv_lru_unlink(kv_pool *p, int32_t b) {
    p->n_units_cached -= kv_units_of(p, b);
    kv_list_unlink(p->lru_prev, p->lru_next, &p->lru_head, &p->lru_tail, b);
    p->n_lru--;
}

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
         * to the prefix it was indexed under) or an identical block is. A hole (a block
         * s let go of behind its window) is only chained through. */
        if (b >= 0 && p->hash[b] == 0 && kv_index_find(p, key, parent, t) < 0)
            kv_index_add(p, b, key, parent, t);
        s->keys[i] = key;
        s->n_committed = i + 1;
        added++;
    }
    return added;
}

/* The indexed blocks that begin tokens[0, n_tokens), in order, at most (n_tokens - 1) /
 * block_size (the last token is left to compute) and max_blocks_per_seq of them: the
 * most k of them such that pages [kv_window_page(k * block_size), k) are there and not
 * gone, so every layer can read what it will. A page before that window may be missing
 * only when every layer is windowed (it becomes a hole); otherwise the walk stops at
 * the first miss. Returns k; each page's block (or -1) and key into blocks/keys when
 * given (pages past k may be written too). */
static int walk_prefix(const kv_pool *p, const int32_t *tokens, int n_tokens, int32_t *blocks,
                       uint64_t *keys) {
    int bs = p->cfg.block_size;
    int max = n_tokens > 0 ? (n_tokens - 1) / bs : 0;
    if (max > p->cfg.max_blocks_per_seq) max = p->cfg.max_blocks_per_seq;
    uint64_t parent = KV_KEY_SEED;
    int k = 0, bad = -1; /* bad: the last page a window may not reach */
    for (int i = 0; i < max; i++) {
        const int32_t *t = tokens + (size_t)i * (size_t)bs;
        uint64_t key = kv_block_key(parent, t, bs);
        int32_t b = kv_index_find(p, key, parent, t);
        if (b < 0 && p->swa != KV_SWA_HOLES) break;
        if (b < 0 || kv_gone(p, b)) bad = i;
        if (blocks) blocks[i] = b, keys[i] = key;
        parent = key;
        if (bad < kv_window_page(p, (i + 1) * bs)) k = i + 1;
    }
    return k;
}

int kv_prefix_hits(const kv_pool *p, const int32_t *tokens, int n_tokens) {
    if (!p->cfg.prefix_cache || n_tokens < 0) return 0;
    return walk_prefix(p, tokens, n_tokens, NULL, NULL) * p->cfg.block_size;
}

int kv_seq_match(kv_pool *p, kv_seq *s, const int32_t *tokens, int n_tokens) {
    assert(s && s->in_use);
    if (!p->cfg.prefix_cache) return 0;
    if (n_tokens < 0 || s->n_blocks != 0) return -EINVAL;
    int bs = p->cfg.block_size, i = walk_prefix(p, tokens, n_tokens, s->blocks, s->keys);
    int lo = kv_window_page(p, i * bs);
    for (int j = 0; j < i; j++) {
        int32_t b = s->blocks[j];
        if (p->swa == KV_SWA_HOLES && j < lo) { /* behind the window: not needed */
            s->blocks[j] = -1;
            continue;
        }
        int revived = p->refcount[b]++ == 0;
        if (revived) kv_lru_unlink(p, b); /* from the cache */
        if (p->need && j >= lo) kv_need_inc(p, b);
        else if (revived && p->need && p->need[b] == 0 && kv_units_of(p, b) == p->units)
            kv_spare_push(p, b); /* behind every window: spare, as kv_seq_slide leaves it */
    }
    s->swa_lo = lo;
    s->n_blocks = s->n_committed = i;
    s->n_tokens = i * bs;
    p->stats.prefix_queries += (uint64_t)n_tokens;
    p->stats.prefix_hits += (uint64_t)s->n_tokens;
    return s->n_tokens;
}
