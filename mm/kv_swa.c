/* kv_swa: sliding windows in the pool: kv_seq_slide, and the windowed part of blocks
 * under KV_SWA_SHRINK (the need counts, gone blocks, the spare list), see kv.h. */
#include "mm/kv.h"

#include <assert.h>

#include "mm/kv_int.h"

void kv_spare_push(kv_pool *p, int32_t b) {
    assert(p->gone[b] == KV_WHOLE && p->refcount[b] > 0 && p->need[b] == 0 && p->hash[b]);
    p->gone[b] = KV_SPARE;
    kv_list_push(p->sp_prev, p->sp_next, &p->sp_head, &p->sp_tail, b);
    p->n_spare++;
}

void kv_spare_unlink(kv_pool *p, int32_t b) {
    assert(p->gone[b] == KV_SPARE);
    kv_list_unlink(p->sp_prev, p->sp_next, &p->sp_head, &p->sp_tail, b);
    p->gone[b] = KV_WHOLE;
    p->n_spare--;
}

/* All but the first unit of f16 block b go back; the global layers stay in the first. */
static void make_gone(kv_pool *p, int32_t b) {
    kv_units_shrink(p, b, 1);
    p->gone[b] = KV_GONE;
}

void kv_spare_take(kv_pool *p) {
    int32_t b = p->sp_head;
    assert(b >= 0);
    kv_spare_unlink(p, b);
    make_gone(p, b);
}

void kv_need_inc(kv_pool *p, int32_t b) {
    if (p->need[b]++ == 0 && p->gone[b] == KV_SPARE) kv_spare_unlink(p, b);
}

int kv_need_dec(kv_pool *p, int32_t b) {
    if (--p->need[b] > 0 || p->refcount[b] == 0 || kv_units_of(p, b) < p->units) return 0;
    if (p->hash[b]) kv_spare_push(p, b); /* still matchable until a unit is wanted */
    else make_gone(p, b);
    return 1;
}

/* Page i of s leaves its windowed layers' reach. Returns 1 when memory came free or
 * evictable. */
static int page_leaves(kv_pool *p, kv_seq *s, int i) {
    int32_t b = s->blocks[i];
    if (p->swa == KV_SWA_SHRINK) return kv_need_dec(p, b);
    int last = p->refcount[b] == 1; /* holes: no layer reads it, let go of the block */
    kv_block_put(p, b);
    s->blocks[i] = -1;
    return last;
}

int kv_seq_slide(kv_pool *p, kv_seq *s, int n) {
    assert(s && s->in_use);
    if (p->swa == KV_SWA_NONE || n < 0) return 0;
    int lo = kv_window_page(p, n), freed = 0;
    if (lo > s->n_blocks) lo = s->n_blocks;
    for (; s->swa_lo < lo; s->swa_lo++) freed += page_leaves(p, s, s->swa_lo);
    p->stats.swa_freed += (uint64_t)freed;
    return freed;
}
