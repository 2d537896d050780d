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

/* Units of memory block b holds (kv8 pools count units; the others count blocks). */
static inline int kv_units_of(const kv_pool *p, int32_t b) { return p->q8 && !p->q8[b] ? 2 : 1; }

static inline uint16_t *kv_unit_data(const kv_pool *p, int32_t unit) {
    return p->data + (size_t)unit * p->unit_elems;
}

/* ---- kv_prefix.c: the index (open addressing) and the LRU list of cached blocks */

/* The indexed block with this key, parent and tokens, or -1. */
int32_t kv_index_find(const kv_pool *p, uint64_t key, uint64_t parent, const int32_t *tokens);
/* Index unindexed block b under (key, parent, tokens), which must not be indexed yet. */
void kv_index_add(kv_pool *p, int32_t b, uint64_t key, uint64_t parent, const int32_t *tokens);
void kv_index_del(kv_pool *p, int32_t b); /* drop indexed block b */
void kv_lru_push(kv_pool *p, int32_t b);  /* at the most recently used end */
void kv_lru_unlink(kv_pool *p, int32_t b);

/* ---- kv8.c: units and slots (kv8 pools only) */

/* A fresh f16 block (a whole slot) under a free id, evicting cached blocks and joining
 * lone halves as needed; the caller made sure two units are free or cached. */
int32_t kv_units_take(kv_pool *p);
/* Give back the units of block b (now refcount 0, not cached); b keeps no memory. */
void kv_units_release(kv_pool *p, int32_t b);
/* The f16 contents of 8-bit block src into f16 block dst. */
void kv_q8_expand(kv_pool *p, int32_t src, int32_t dst);

#endif
