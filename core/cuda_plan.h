/* cuda_plan: the CUDA backend's host-side arithmetic, free of CUDA so that it builds and is
 * unit-tested (tests/unit/test_cuda_plan.c) on machines without a GPU or a toolkit:
 * how a batch is packed for the device, the attention kernel's geometry, the keys
 * under which decode steps are kept as CUDA graphs, and how the device's memory is
 * shared between weights, scratch and the KV pool. It is in core/, beside the backend
 * (core/backend_cuda.c), because it reads the model's batch and mm's sequences; cuda/
 * below it knows neither. */
#ifndef KILN_CUDA_PLAN_H
#define KILN_CUDA_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "core/model.h"

/* One int32 staging area per step, uploaded in one copy. Offsets (in int32s) are fixed
 * from the maximum sizes, so the device addresses kernels see never change from step
 * to step: what lets a captured graph be replayed with new inputs. */
typedef struct {
    size_t tokens, pos, slot, tiles, rows, tables; /* offsets */
    size_t total;                                  /* int32s in all */
    int max_tokens, max_logits, tstride;           /* tstride: page-table row length */
} cplan_layout;

int cplan_layout_init(cplan_layout *L, int max_tokens, int max_logits, int tstride);

/* What one packed step holds. Tiles are runs of up to qt consecutive batch tokens of
 * one sequence (one attention block each); each run of a sequence gets a table row. */
typedef struct {
    int n_tokens, n_tiles, n_logits, n_rows;
    size_t upload; /* int32s to copy: through the last table row used */
} cplan_step;

/* Packs b into stage (L->total int32s): tokens, positions, cache slots (the block's
 * first unit * block_size + offset), tiles {table row, first token, count}, logit rows,
 * and the page-table prefix each run needs, as first units: loc[block id] (the pool's
 * kv_pool.loc: mm/kv.h's units), or the ids themselves when loc is NULL. 0, or -EINVAL
 * with err set when the batch does not fit the layout or a position has no block. */
int cplan_pack(const cplan_layout *L, const model_batch *b, const int32_t *loc, int block_size,
               int qt, int32_t *stage, cplan_step *out, char *err, size_t errlen);

/* The attention kernel's geometry (cuda/kernels.cu k_attn): keys per shared-memory
 * tile, (token, head) pairs per block, tokens per tile, threads and shared bytes. */
#define CPLAN_ATT_WARPS 8
#define CPLAN_ATT_PAIRS_WARP 8
#define CPLAN_ATT_MAX_HD 256
typedef struct {
    int kt, pairs_max, qt, threads;
    size_t smem;
} cplan_attn;

/* 0, or -EINVAL for a head_dim or group the kernel does not handle. */
int cplan_attn_geom(int head_dim, int group, cplan_attn *a);

/* CUDA graphs: a step's kernels depend on its token, tile and logit counts and on the
 * matmul path; everything else they read from the fixed staging addresses. Graphs are
 * kept for decode-like steps (at most max_tokens tokens) in a small LRU cache. */
uint64_t cplan_graph_key(const cplan_step *s, int gemm_path);
int cplan_graph_wanted(const cplan_step *s, int max_tokens);

#define CPLAN_GRAPHS 32
typedef struct {
    uint64_t key[CPLAN_GRAPHS]; /* 0: empty */
    uint64_t used[CPLAN_GRAPHS];
    uint64_t clock;
} cplan_graphs;

/* Index holding key, or -1. A hit refreshes its age. */
int cplan_graph_find(cplan_graphs *g, uint64_t key);
/* Slot for a new key: an empty one, else the least recently used (the caller destroys
 * what was there first when *evicted). Marks it as holding key. */
int cplan_graph_put(cplan_graphs *g, uint64_t key, int *evicted);

/* KV blocks the device can hold: of total * util, minus what others already use
 * (total - free), minus this process's weights and scratch, in blocks of block_bytes,
 * at most max_blocks when > 0. 0 when nothing is left. */
long cplan_kv_blocks(size_t total, size_t free_now, double util, size_t weights, size_t scratch,
                     size_t block_bytes, long max_blocks);

/* Device memory pressure for the degrade ladder: 0 while the device has at least
 * `headroom` bytes free (what the sizing left for the runtime: cuBLAS' workspace, graph
 * instantiation, the module), rising linearly to 1 as others, or our own runtime, take
 * it. headroom 0: 0. */
double cplan_mem_pressure(size_t free_now, size_t headroom);

#endif
