/* vmath: the references and the dispatcher (see vmath.h). */
#include "core/vmath.h"

#include <math.h>

#include "core/quant.h"

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

void vm_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
#if defined(__x86_64__)
    int lvl = quant_simd();
    if (lvl >= QS_AVX512) return vm_rmsnorm_avx512(out, x, w, n, eps);
    if (lvl >= QS_AVX2) return vm_rmsnorm_avx2(out, x, w, n, eps);
#endif
    vm_rmsnorm_ref(out, x, w, n, eps);
}

void vm_swiglu(float *out, const float *gate, const float *up, int n) {
#if defined(__x86_64__)
    int lvl = quant_simd();
    if (lvl >= QS_AVX512) return vm_swiglu_avx512(out, gate, up, n);
    if (lvl >= QS_AVX2) return vm_swiglu_avx2(out, gate, up, n);
#endif
    vm_swiglu_ref(out, gate, up, n);
}

void vm_add(float *out, const float *a, int n) {
#if defined(__x86_64__)
    int lvl = quant_simd();
    if (lvl >= QS_AVX512) return vm_add_avx512(out, a, n);
    if (lvl >= QS_AVX2) return vm_add_avx2(out, a, n);
#endif
    vm_add_ref(out, a, n);
}

void vm_swiglu_rows(float *out, size_t os, const float *gate, const float *up, size_t gs, int n,
                    int rows) {
    void (*sw)(float *, const float *, const float *, int) = vm_swiglu_ref;
#if defined(__x86_64__)
    int lvl = quant_simd();
    sw = lvl >= QS_AVX512 ? vm_swiglu_avx512 : lvl >= QS_AVX2 ? vm_swiglu_avx2 : vm_swiglu_ref;
#endif
    for (int r = 0; r < rows; r++)
        sw(out + (size_t)r * os, gate + (size_t)r * gs, up + (size_t)r * gs, n);
}

void vm_add_rows(float *out, size_t os, const float *a, size_t as, int n, int rows) {
    void (*add)(float *, const float *, int) = vm_add_ref;
#if defined(__x86_64__)
    int lvl = quant_simd();
    add = lvl >= QS_AVX512 ? vm_add_avx512 : lvl >= QS_AVX2 ? vm_add_avx2 : vm_add_ref;
#endif
    for (int r = 0; r < rows; r++) add(out + (size_t)r * os, a + (size_t)r * as, n);
}
