/* backend: the compute interface the scheduler drives.
 *
 * A step is submitted and runs on the backend's own threads (CPU) or stream (CUDA);
 * submit returns at once so the cooperative loop keeps serving the network, and the
 * loop learns of completion by polling or by the event fd becoming readable. One step
 * is in flight at a time per backend. */
#ifndef KILN_BACKEND_H
#define KILN_BACKEND_H

#include <stddef.h>

#include "core/model.h"
#include "mm/kv.h"

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

static inline int backend_run(backend *be, const model_batch *b) {
    int r = be->ops->submit(be, b);
    return r < 0 ? r : be->ops->wait(be);
}

#endif
