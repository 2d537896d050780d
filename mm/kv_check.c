/* kv_check: the pool's consistency checks, a debugging aid (see kv.h). */
#include "mm/kv.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "mm/kv_int.h"

/* ---------------------------------------------------------------- consistency */

#define FAIL(...) (snprintf(err, errlen, __VA_ARGS__), -EFAULT)

/* Units (kv8, KV_SWA_SHRINK): every id's memory against the unit owners, the free-slot
 * stack and the unit counters. Ids on the free stack hold nothing; in-use and cached
 * ones hold their kv_units_of, aligned to that count (a whole slot for f16, half of it
 * for 8-bit, one unit for gone). */
static int check_units(const kv_pool *p, char *err, size_t errlen) {
    int U = p->units, n_units = U * p->cfg.n_blocks, free_u = 0, cached_u = 0, q8 = 0;
    int32_t *seen = p->scratch; /* free-slot marks; reused after kv_check's passes */
    for (int32_t b = 0; b < p->n_ids; b++) {
        int32_t u = p->loc[b];
        int holds = p->refcount[b] > 0 || p->hash[b] != 0;
        int gone = p->gone ? p->gone[b] : KV_WHOLE;
        if (!holds) {
            if (u != -1 || p->q8[b] || gone)
                return FAIL("free id %d holds unit %d (q8 %d, gone %d)", b, u, p->q8[b], gone);
            continue;
        }
        int k = kv_units_of(p, b);
        if (u < 0 || u + k > n_units || u % k)
            return FAIL("block %d: units [%d, %d) out of range or not aligned", b, u, u + k);
        if (p->q8[b] && gone) return FAIL("block %d is both 8-bit and gone or spare", b);
        for (int i = 0; i < k; i++)
            if (p->owner[u + i] != b) return FAIL("block %d: unit %d owned by %d", b, u + i, p->owner[u + i]);
        q8 += p->q8[b];
        if (p->refcount[b] == 0) cached_u += k;
    }
    for (int32_t u = 0; u < n_units; u++) {
        int32_t b = p->owner[u];
        if (b == -1) {
            free_u++;
            continue;
        }
        if (b < 0 || b >= p->n_ids || p->loc[b] < 0 || u < p->loc[b] || u >= p->loc[b] + kv_units_of(p, b))
            return FAIL("unit %d: owner %d does not hold it", u, b);
    }
    memset(seen, 0, (size_t)p->n_ids * sizeof *seen);
    int whole = 0;
    for (int s = 0; s < p->cfg.n_blocks; s++) {
        int f = 0;
        for (int i = 0; i < U; i++) f += p->owner[s * U + i] == -1;
        whole += f == U;
        seen[s] = f == U ? 0 : -1; /* -1: not wholly free */
    }
    for (int k = 0; k < p->n_free_slots; k++) {
        int32_t s = p->free_slots[k];
        if (s < 0 || s >= p->cfg.n_blocks || seen[s]++)
            return FAIL("free slot stack[%d] = %d: out of range, twice or in use", k, s);
    }
    if (whole != p->n_free_slots)
        return FAIL("%d slots wholly free, %d on the free-slot stack", whole, p->n_free_slots);
    if (free_u != p->n_units_free || cached_u != p->n_units_cached || q8 != p->n_q8)
        return FAIL("units free %d / cached %d / 8-bit blocks %d; counters say %d / %d / %d",
                    free_u, cached_u, q8, p->n_units_free, p->n_units_cached, p->n_q8);
    return 0;
}

/* KV_SWA_SHRINK: need[b] counts the pages at or past their sequence's swa_lo that map
 * to b (page tables already checked); the spare list holds exactly the KV_SPARE blocks,
 * each in use, indexed, whole f16 and needed by none. Uses scratch. */
static int check_need(const kv_pool *p, char *err, size_t errlen) {
    if (!p->need) return 0;
    int32_t *need = p->scratch;
    memset(need, 0, (size_t)p->n_ids * sizeof *need);
    for (int i = 0; i < p->cfg.max_seqs; i++) {
        const kv_seq *s = &p->seqs[i];
        for (int j = s->swa_lo; s->in_use && j < s->n_blocks; j++) need[s->blocks[j]]++;
    }
    int n_spare = 0;
    for (int32_t b = 0; b < p->n_ids; b++) {
        if (need[b] != p->need[b])
            return FAIL("block %d: need %d, %d pages in their window", b, p->need[b], need[b]);
        n_spare += p->gone[b] == KV_SPARE;
    }
    int n = 0;
    for (int32_t b = p->sp_head, prev = -1; b != -1; prev = b, b = p->sp_next[b], n++) {
        if (b < 0 || b >= p->n_ids || n >= p->n_spare)
            return FAIL("spare entry %d: block %d out of range, or the list is longer than %d", n, b,
                        p->n_spare);
        if (p->gone[b] != KV_SPARE || p->refcount[b] <= 0 || p->need[b] || !p->hash[b] ||
            p->q8[b] || p->sp_prev[b] != prev)
            return FAIL("spare block %d: state %d, refcount %d, need %d, key %d, 8-bit %d, prev %d/%d",
                        b, p->gone[b], p->refcount[b], p->need[b], p->hash[b] != 0, p->q8[b],
                        p->sp_prev[b], prev);
        if (p->sp_next[b] == -1 && p->sp_tail != b)
            return FAIL("spare list ends at %d, tail says %d", b, p->sp_tail);
    }
    if (n != p->n_spare || n_spare != n)
        return FAIL("spare list holds %d, %d blocks spare, counter says %d", n, n_spare, p->n_spare);
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
        if (s->swa_lo < 0 || s->swa_lo > s->n_blocks || (p->swa == KV_SWA_NONE && s->swa_lo))
            return FAIL("seq %d: swa_lo %d of %d pages", i, s->swa_lo, s->n_blocks);
        for (int j = 0; j < s->n_blocks; j++) {
            int32_t b = s->blocks[j];
            if (b == -1 && p->swa == KV_SWA_HOLES && j < s->swa_lo) continue; /* a hole */
            if (b < 0 || b >= nb) return FAIL("seq %d: page %d -> block %d out of range", i, j, b);
            if (j >= s->swa_lo && p->gone && p->gone[b])
                return FAIL("seq %d: page %d -> block %d, gone but in its window", i, j, b);
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
        int32_t f = kv_index_find(p, p->hash[b], p->parent[b], t);
        if (f != b) return FAIL("block %d: its key %016llx finds block %d", b,
                                (unsigned long long)p->hash[b], f);
    }
    int r = check_need(p, err, errlen);
    if (r) return r;
    return p->q8 ? check_units(p, err, errlen) : 0;
}
#undef FAIL
