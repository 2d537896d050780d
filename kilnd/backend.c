/* backend: which backend runs the model, and the KV pool that goes with it. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kilnd/kilnd.h"

static backend *open_cpu(const model *m, const kd_backend_want *w, kv_config *kc, mm_pool *arena,
                         kv_pool *kv, char *err, size_t n) {
    size_t bb = kv_block_bytes(kc);
    if (!bb) {
        snprintf(err, n, "invalid KV pool shape");
        return NULL;
    }
    if (w->kv_bytes / bb > 0x7fffffff) {
        snprintf(err, n, "a KV pool of %zu MiB has too many blocks", w->kv_bytes >> 20);
        return NULL;
    }
    kc->n_blocks = (int)(w->kv_bytes / bb);
    kc->external_data = 0;
    int r = mm_pool_init(arena, kv_pool_bytes(kc), NULL);
    if (r == 0) r = kv_pool_init(kv, kc, arena);
    if (r < 0) {
        snprintf(err, n, "cannot allocate the KV pool (%zu MiB): %s", w->kv_bytes >> 20, strerror(-r));
        mm_pool_free(arena);
        return NULL;
    }
    backend_cpu_config bc = {w->threads, w->max_batch_tokens, w->max_logits, w->max_ctx, w->exact};
    backend *be = backend_cpu_new(m, kv, &bc, err, n);
    if (!be) {
        kv_pool_free(kv);
        mm_pool_free(arena);
        return NULL;
    }
    char note[256]; /* never silently slow: said once, at load */
    if (model_unpacked_note(m, note, sizeof note) > 0) fprintf(stderr, "kilnd: %s\n", note);
    return be;
}

/* Why the backend running is not the one asked for (DEBUG gpu shows it); "" when it is. */
static char backend_note[320];

const char *kd_backend_note(void) { return backend_note; }

backend *kd_backend_open(const model *m, const kd_backend_want *w, kv_config *kc, mm_pool *arena,
                      kv_pool *kv, char *err, size_t n) {
    char why[256] = "";
    backend_note[0] = 0;
    /* auto in a kilnd without the CUDA backend is simply the CPU: nothing to report */
    int auto_gpu = w->kind == CFG_BACKEND_AUTO && backend_cuda_built();
    int try_cuda = w->kind == CFG_BACKEND_CUDA || (auto_gpu && backend_cuda_probe(why, sizeof why));
    if (auto_gpu && !try_cuda) {
        snprintf(backend_note, sizeof backend_note, "no GPU (%s): using the CPU", why);
        fprintf(stderr, "kilnd: %s\n", backend_note);
    }
    if (!try_cuda) return open_cpu(m, w, kc, arena, kv, err, n);
    backend_cuda_config cc = {0, w->gpu_util, w->max_batch_tokens, w->max_logits, w->max_ctx,
                              w->cublas, 64, w->graphs, w->kv_gpu_bytes};
    memset(arena, 0, sizeof *arena); /* the CPU pool's arena is not used */
    /* The device pool takes kv8's half-block units (its fp8 blocks free their second
     * half), not windows: backend_cuda_new clears them, as the kernels read every layer. */
    int swa = kc->swa_window;
    backend *be = backend_cuda_new(m, kv, kc, &cc, err, n);
    if (be || w->kind == CFG_BACKEND_CUDA) return be;
    /* auto: a device that is there but cannot hold the model is reported, then the CPU */
    snprintf(backend_note, sizeof backend_note, "the CUDA backend did not start (%.250s): using the CPU", err);
    fprintf(stderr, "kilnd: %s\n", backend_note);
    kc->swa_window = swa;
    return open_cpu(m, w, kc, arena, kv, err, n);
}
