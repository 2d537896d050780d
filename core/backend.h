/* backend: the compute interface the scheduler drives.
 *
 * A step is submitted and runs on the backend's own threads (CPU) or stream (CUDA);
 * submit returns at once so the cooperative loop keeps serving the network, and the
 * loop learns of completion by polling or by the event fd becoming readable. One step
 * is in flight at a time per backend. */
#ifndef KILN_BACKEND_H
#define KILN_BACKEND_H

#include <stddef.h>

#include "core/config.h"
#include "core/model.h"
#include "mm/kv.h"
#include "mm/pool.h"

typedef struct backend backend;

typedef struct {
    const char *name;
    /* Start a step. The batch and every array it points to must stay valid until the
     * step completes. 0, or negative with be->err set (e.g. a step already running). */
    int (*submit)(backend *be, const model_batch *b);
    /* 1 done (logits ready), 0 still running, negative: the step failed (be->err). */
    int (*poll)(backend *be);
    /* Block until the running step ends; the same results as poll (never 0). */
    int (*wait)(backend *be);
    /* Readable when a step completes; poll() consumes the event. */
    int (*event_fd)(backend *be);
    /* [n_logits][n_vocab] of the last completed step, valid until the next submit. */
    const float *(*logits)(backend *be);
    void (*destroy)(backend *be);
    /* Milliseconds the last completed step computed (the scheduler's cost model), or
     * NULL: the scheduler times submit to completion itself. */
    double (*step_ms)(backend *be);
    /* Pressure on memory the KV pool's share does not show, 0..1 (the degrade ladder
     * acts on the larger of the two), or NULL: none (the CPU backend's memory is all
     * taken at start). CUDA: the device's free memory against its runtime headroom. */
    double (*mem_pressure)(backend *be);
} backend_ops;

struct backend {
    const backend_ops *ops;
    char err[256];
};

typedef struct {
    int threads;          /* compute threads in all (≥ 1) */
    int max_batch_tokens; /* largest step */
    int max_logits;       /* largest number of logit rows per step */
    int max_ctx;          /* longest sequence */
    int exact;            /* f32 activations (verification; see model_state_set_exact) */
} backend_cpu_config;

/* The CPU backend over a loaded model and a KV pool; NULL with err set on failure. */
backend *backend_cpu_new(const model *m, kv_pool *kv, const backend_cpu_config *cfg, char *err,
                         size_t errlen);

/* ---- the CUDA backend (backend_cuda.c on cuda/; in the kilnd of `make cuda`, else
 * stubs that say so: backend_nocuda.c) */

typedef struct {
    int device;            /* CUDA device ordinal */
    double mem_util;       /* share of the device's memory kilnd may hold (weights, scratch, KV) */
    int max_batch_tokens;  /* largest step */
    int max_logits;        /* largest number of logit rows per step */
    int max_ctx;           /* longest sequence */
    int cublas;            /* 1: steps of at least cublas_min_tokens tokens run their matmuls
                            * through cuBLAS in f16 (faster prefill, not batch invariant);
                            * 0: kiln's own kernels for every step (batch invariant) */
    int cublas_min_tokens;
    int graphs;            /* 1: decode steps are captured once and replayed as CUDA graphs */
    size_t kv_bytes;       /* KV pool: 0 = what the memory budget leaves, else at most this */
} backend_cuda_config;

/* 1 in the kilnd of `make cuda`, 0 in the others. */
int backend_cuda_built(void);
/* 1 when this kilnd has the CUDA backend and a usable device; else 0 with the reason in
 * err ("built without CUDA", "no NVIDIA driver: ...", "no CUDA device ..."). */
int backend_cuda_probe(char *err, size_t errlen);
/* Starts the CUDA backend: uploads the weights (quantized blocks stay quantized), then
 * sizes the device KV pool from the free memory and initializes kv with kc's shape
 * (block_size, max_seqs, max_blocks_per_seq, prefix_cache, kv8: fp8 blocks in half a
 * block, the other half given back, as mm's units; n_blocks is set here): the
 * host keeps the page tables, the blocks live on the device. NULL with err set; kv is
 * then untouched. The caller frees kv (kv_pool_free) after destroying the backend. */
backend *backend_cuda_new(const model *m, kv_pool *kv, kv_config *kc, const backend_cuda_config *cfg,
                          char *err, size_t errlen);
/* 8-bit KV (the accuracy measurement): turn these full, written blocks to fp8 e4m3 in
 * place; attention reads them as such until the block's first position is written
 * again (a reused block). A kv8 pool (kv_config.kv8: the ladder's rung 2 converts
 * through mm as on the CPU) converts through kv_block_to_q8, which gives each block's
 * second half back; without kv8 nothing is freed. No step may be running. 0, or
 * negative with be->err set. */
int backend_cuda_kv8(backend *be, const int32_t *blocks, int n);
/* One line about the device: name, memory, what the KV pool and weights took. */
void backend_cuda_describe(backend *be, char *buf, size_t n);

static inline int backend_run(backend *be, const model_batch *b) {
    int r = be->ops->submit(be, b);
    return r < 0 ? r : be->ops->wait(be);
}

#endif
