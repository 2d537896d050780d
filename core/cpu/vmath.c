/* vmath: the references and the dispatcher (see vmath.h). */
#include "core/cpu/vmath.h"

#include <math.h>

#include "core/cpu/quant.h"

void vm_swiglu_ref(float *out, const float *gate, const float *up, int n) {
    for (int i = 0; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

void vm_add_ref(float *out, const float *a, int n) {
    for (int i = 0; i < n; i++) out[i] += a[i];
}

void vm_rmsnorm_ref(float *out, const float *x, const float *w, int n, float eps) {
    float s[16] = {0};
    for (int i = 0; i < n; i++) s[i % 16] += x[i] * x[i];
    float scale = vm_rms_scale(s, n, eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

/* Each function's paths, indexed by path(): the C reference, AVX2, AVX-512. */
#if defined(__x86_64__)
#define PATHS(f) {f##_ref, f##_avx2, f##_avx512}
#else
#define PATHS(f) {f##_ref, f##_ref, f##_ref}
#endif
typedef void (*swiglu_fn)(float *, const float *, const float *, int);
typedef void (*add_fn)(float *, const float *, int);
typedef void (*rmsnorm_fn)(float *, const float *, const float *, int, float);
static const swiglu_fn swiglu_paths[3] = PATHS(vm_swiglu);
static const add_fn add_paths[3] = PATHS(vm_add);
static const rmsnorm_fn rmsnorm_paths[3] = PATHS(vm_rmsnorm);

/* The path of the current SIMD level. */
static int path(void) {
    int lvl = quant_simd();
    return lvl >= QS_AVX512 ? 2 : lvl >= QS_AVX2 ? 1 : 0;
}

void vm_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    rmsnorm_paths[path()](out, x, w, n, eps);
}

void vm_swiglu(float *out, const float *gate, const float *up, int n) {
    swiglu_paths[path()](out, gate, up, n);
}

void vm_add(float *out, const float *a, int n) { add_paths[path()](out, a, n); }

void vm_swiglu_rows(float *out, size_t os, const float *gate, const float *up, size_t gs, int n,
                    int rows) {
    swiglu_fn sw = swiglu_paths[path()];
    for (int r = 0; r < rows; r++)
        sw(out + (size_t)r * os, gate + (size_t)r * gs, up + (size_t)r * gs, n);
}

void vm_add_rows(float *out, size_t os, const float *a, size_t as, int n, int rows) {
    add_fn add = add_paths[path()];
    for (int r = 0; r < rows; r++) add(out + (size_t)r * os, a + (size_t)r * as, n);
}
