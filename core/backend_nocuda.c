/* backend_nocuda: the CUDA backend's entry points in a kilnd built without it. The
 * CUDA kilnd (`make cuda`) links core/backend_cuda.o and cuda/'s objects ahead of
 * libkilnd.a, so this object is never pulled in there; it defines nothing else for the
 * same reason. */
#include <stdio.h>

#include "core/backend.h"

int backend_cuda_built(void) { return 0; }

int backend_cuda_probe(char *err, size_t errlen) {
    snprintf(err, errlen, "this kilnd was built without the CUDA backend (make cuda)");
    return 0;
}

backend *backend_cuda_new(const model *m, kv_pool *kv, kv_config *kc, const backend_cuda_config *cfg,
                          char *err, size_t errlen) {
    (void)m, (void)kv, (void)kc, (void)cfg;
    backend_cuda_probe(err, errlen);
    return NULL;
}

int backend_cuda_kv8(backend *be, const int32_t *blocks, int n) {
    (void)blocks, (void)n;
    snprintf(be->err, sizeof be->err, "8-bit KV needs the CUDA backend");
    return -1;
}

void backend_cuda_describe(backend *be, char *buf, size_t n) {
    (void)be;
    snprintf(buf, n, "no CUDA backend");
}
