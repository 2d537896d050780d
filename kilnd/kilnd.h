/* kilnd: the engine daemon's subcommands and the choice of backend. kilnd/ is the top
 * of the tree: it includes net/, sched/, core/ and mm/; nothing includes it.
 *
 * Each kd_<command> takes argv from the subcommand's name on and returns the process
 * exit status: 0 ok, 1 runtime error, 2 usage. */
#ifndef KILN_KILND_H
#define KILN_KILND_H

#include <stddef.h>

#include "core/backend.h"

#define KILN_VERSION "0.1.0"

int kd_serve(int argc, char **argv);        /* serve.c: the appliance's main job */
int kd_check_config(int argc, char **argv); /* serve.c: what kiln-init runs before a start */
int kd_certs(int argc, char **argv);        /* certs.c: development TLS certificates */
int kd_generate(int argc, char **argv);     /* generate.c: one request to stdout */
int kd_bench(int argc, char **argv);        /* bench.c: single-stream prefill and decode */
int kd_bench_engine(int argc, char **argv); /* bench_engine.c: many requests, no network */
int kd_tokenize(int argc, char **argv);     /* tokenize.c */
int kd_detokenize(int argc, char **argv);   /* tokenize.c */
int kd_shape(int argc, char **argv);        /* shape.c: random-weight models of real shapes */
void kd_usage(void);                        /* main.c */

/* ---- choosing the backend (backend.c) */

typedef struct {
    int kind;             /* CFG_BACKEND_AUTO, _CPU or _CUDA (core/config.h) */
    int threads, max_batch_tokens, max_logits, max_ctx, exact; /* as backend_cpu_config */
    size_t kv_bytes;      /* the CPU's KV pool */
    size_t kv_gpu_bytes;  /* the GPU's: 0 = what the memory budget leaves, else at most */
    double gpu_util;      /* as backend_cuda_config */
    int cublas, graphs;
} kd_backend_want;

/* Starts the backend w asks for, with its KV pool of kc's shape (kc->n_blocks is set
 * here): CUDA when asked, or with `auto` when a device is usable (else it says on
 * stderr why not and uses the CPU); the CPU backend's pool is carved from arena (pinned
 * by mlock). NULL with err set; nothing is left allocated then. The caller destroys the
 * backend, then kv_pool_free(kv) and mm_pool_free(arena). */
backend *kd_backend_open(const model *m, const kd_backend_want *w, kv_config *kc,
                         mm_pool *arena, kv_pool *kv, char *err, size_t n);
/* After kd_backend_open: why the backend is not the one asked for ("" when it is). */
const char *kd_backend_note(void);

#endif
