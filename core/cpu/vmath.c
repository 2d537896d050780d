/* vmath: the references and the dispatcher (see vmath.h). */
#include "core/cpu/vmath.h"

#include <math.h>

#include "core/cpu/isa.h"

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

/* ---------------------------------------------------------------- dispatch */

typedef void (*swiglu_fn)(float *, const float *, const float *, int);
typedef void (*add_fn)(float *, const float *, int);
typedef void (*rmsnorm_fn)(float *, const float *, const float *, int, float);
typedef struct {
    swiglu_fn swiglu;
    add_fn add;
    rmsnorm_fn rmsnorm;
} vm_path;

/* Per dispatch slot (isa.h); no AMX kernels, so the AMX slots run AVX-512's. */
static const vm_path paths[ISA_SLOTS] = {
    [ISA_SCALAR] = {vm_swiglu_ref, vm_add_ref, vm_rmsnorm_ref},
#if defined(__x86_64__)
    [ISA_AVX2] = {vm_swiglu_avx2, vm_add_avx2, vm_rmsnorm_avx2},
    [ISA_AVX512] = {vm_swiglu_avx512, vm_add_avx512, vm_rmsnorm_avx512},
    [ISA_SLOT_AMX_Q4_1] = {vm_swiglu_avx512, vm_add_avx512, vm_rmsnorm_avx512},
    [ISA_SLOT_AMX_ALL] = {vm_swiglu_avx512, vm_add_avx512, vm_rmsnorm_avx512},
#endif
};

void vm_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    ISA_PICK(paths)->rmsnorm(out, x, w, n, eps);
}

void vm_swiglu(float *out, const float *gate, const float *up, int n) {
    ISA_PICK(paths)->swiglu(out, gate, up, n);
}

void vm_add(float *out, const float *a, int n) { ISA_PICK(paths)->add(out, a, n); }

void vm_swiglu_rows(float *out, size_t os, const float *gate, const float *up, size_t gs, int n,
                    int rows) {
    swiglu_fn sw = ISA_PICK(paths)->swiglu;
    for (int r = 0; r < rows; r++)
        sw(out + (size_t)r * os, gate + (size_t)r * gs, up + (size_t)r * gs, n);
}

void vm_geglu_rows(float *out, size_t os, const float *gate, const float *up, size_t gs, int n,
                   int rows) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    for (int r = 0; r < rows; r++) {
        const float *g = gate + (size_t)r * gs, *u = up + (size_t)r * gs;
        float *o = out + (size_t)r * os;
        for (int i = 0; i < n; i++)
            o[i] = 0.5f * g[i] * (1.0f + tanhf(k * (g[i] + 0.044715f * g[i] * g[i] * g[i]))) * u[i];
    }
}

void vm_add_rows(float *out, size_t os, const float *a, size_t as, int n, int rows) {
    add_fn add = ISA_PICK(paths)->add;
    for (int r = 0; r < rows; r++) add(out + (size_t)r * os, a + (size_t)r * as, n);
}
