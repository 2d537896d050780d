/* kv_int.h: internals shared by the files of the KV pool: kv.c (sizes, init, blocks,
 * sequences), kv_prefix.c (keys, index, LRU), kv8.c (8-bit blocks), kv_check.c. Not
 * part of the public API (that is mm/kv.h alone); nothing outside them includes it. */
#ifndef KILN_MM_KV_INT_H
#define KILN_MM_KV_INT_H

#include <stddef.h>
#include <stdint.h>

#include "mm/kv.h"

/* (layer, K|V, head) slabs per block. */
static inline int kv_slabs_of(const kv_config *c) { return 2 * c->n_layers * c->n_kv_heads; }

/* Is layer l windowed? */
static inline int kv_swa_layer(const kv_config *c, int l) {
    return c->swa_window > 0 && (c->swa_layers[l / 64] >> (l % 64) & 1);
}

/* The first page the windowed layers of a sequence that writes position n next still
 * read: its swa_lo (0 when the pool frees nothing). */
static inline int kv_window_page(const kv_pool *p, int n) {
    return p->swa == KV_SWA_NONE ? 0 : kv_swa_first(p->cfg.swa_window, n) / p->cfg.block_size;
}

static inline int kv_gone(const kv_pool *p, int32_t b) { return p->gone && p->gone[b] == KV_GONE; }

/* Units of memory block b holds (pools with units count them; the others count blocks):
 * a whole slot for f16 (spare too), half of it for 8-bit, one unit for a gone block. */
static inline int kv_units_of(const kv_pool *p, int32_t b) {
    if (!p->q8) return 1;
    return p->q8[b] ? p->units / 2 : kv_gone(p, b) ? 1 : p->units;
}

/* Units the spare blocks would give back (each keeps one). */
static inline int kv_spare_units(const kv_pool *p) { return p->n_spare * (p->units - 1); }

static inline uint16_t *kv_unit_data(const kv_pool *p, int32_t unit) {
    return p->data + (size_t)unit * p->unit_elems;
}

/* Doubly linked lists over block ids (prev, next: -1 = none): the LRU and the spare list.
 * b goes at the tail, or out of the list. */
static inline void kv_list_push(int32_t *prev, int32_t *next, int32_t *head, int32_t *tail, int32_t b) {
    prev[b] = *tail;
    next[b] = -1;
    if (*tail >= 0) next[*tail] = b;
    else *head = b;
    *tail = b;
}
static inline void kv_list_unlink(int32_t *prev, int32_t *next, int32_t *head, int32_t *tail, int32_t b) {
    int32_t pr = prev[b], nx = next[b];
    if (pr >= 0) next[pr] = nx;
    else *head = nx;
    if (nx >= 0) prev[nx] = pr;
    else *tail = pr;
    prev[b] = next[b] = -1;
}

/* ---- kv_prefix.c: the index (open addressing) and the LRU list of cached blocks */

/* The indexed block with this key, parent and tokens, or -1. */
int32_t kv_index_find(const kv_pool *p, uint64_t key, uint64_t parent, const int32_t *tokens);
/* Index unindexed block b under (key, parent, tokens), which must not be indexed yet. */
void kv_index_add(kv_pool *p, int32_t b, uint64_t key, uint64_t parent, const int32_t *tokens);
void kv_index_del(kv_pool *p, int32_t b); /* drop indexed block b */
void kv_lru_push(kv_pool *p, int32_t b);  /* at the most recently used end */
void kv_lru_unlink(kv_pool *p, int32_t b);

/* ---- kv.c */

/* Drop a reference to block b: at 0 it is cached when indexed, else freed. */
void kv_block_put(kv_pool *p, int32_t b);

/* ---- kv_swa.c: the windowed part of blocks (KV_SWA_SHRINK) */

/* A holder's page at or past its swa_lo now maps to b: a spare b is whole again. */
void kv_need_inc(kv_pool *p, int32_t b);
/* One page fewer in a window maps to b: when none is left and others still hold b
 * (behind their windows), its second unit goes: spare when indexed, else at once.
 * Returns 1 when it did. */
int kv_need_dec(kv_pool *p, int32_t b);
/* b (indexed, in use, need 0, whole f16) onto the spare list, newest end. */
void kv_spare_push(kv_pool *p, int32_t b);
/* b off the spare list, whole again (its refcount dropped to 0, a holder needs its
 * window, or it turns 8-bit). */
void kv_spare_unlink(kv_pool *p, int32_t b);
/* Halve the oldest spare block: one more free unit. */
void kv_spare_take(kv_pool *p);

/* ---- kv8.c: units and slots (pools with units: kv8 or KV_SWA_SHRINK). A block's units
 * are aligned to their count: an 8-bit block a slot's half, f16 the whole slot. */

/* A fresh f16 block (a whole slot) under a free id, evicting cached blocks, halving
 * spare ones and moving one-unit and half-slot blocks together as needed; the caller made
 * sure a slot's worth of units is free, cached or spare. */
int32_t kv_units_take(kv_pool *p);
/* Give back the units of block b (now refcount 0, not cached); b keeps no memory. */
void kv_units_release(kv_pool *p, int32_t b);
/* f16 block b keeps its first keep units (an 8-bit conversion: half; a gone block's
 * global layers: one) and gives the rest back. */
void kv_units_shrink(kv_pool *p, int32_t b, int keep);
/* The f16 contents of 8-bit block src into f16 block dst. */
void kv_q8_expand(kv_pool *p, int32_t src, int32_t dst);

#endif
