/* vmath: the forward pass's row-wise float work (SwiGLU, the residual add, RMSNorm),
 * with a plain C reference beside AVX2 and AVX-512 paths picked at run
 * time by the level in force (core/cpu/isa.h); tests/unit/test_vmath.c compares them.
 *
 * Every element goes through the same arithmetic wherever it sits in the row (a row's
 * tail goes through a padded vector), so a token's result never depends on its batch. */
#ifndef KILN_VMATH_H
#define KILN_VMATH_H

#include <math.h>
#include <stddef.h>

/* out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + exp(-x)). The SIMD paths use a
 * polynomial exp (relative error ~2e-7; core/cpu/vec.h), the reference libm's expf. */
void vm_swiglu(float *out, const float *gate, const float *up, int n);
void vm_swiglu_ref(float *out, const float *gate, const float *up, int n);
void vm_swiglu_avx2(float *out, const float *gate, const float *up, int n);
void vm_swiglu_avx512(float *out, const float *gate, const float *up, int n);

/* vm_swiglu over `rows` rows: out + r*os from gate + r*gs and up + r*gs, n each. One
 * dispatch for all of them (see vm_add_rows). */
void vm_swiglu_rows(float *out, size_t os, const float *gate, const float *up, size_t gs, int n,
                    int rows);

/* GeGLU (Gemma): out[i] = gelu(gate[i]) * up[i] with GELU's tanh form,
 * gelu(x) = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), over `rows` rows as
 * vm_swiglu_rows. Plain C on every level: libm's tanhf. */
void vm_geglu_rows(float *out, size_t os, const float *gate, const float *up, size_t gs, int n,
                   int rows);

/* out[i] += a[i]: the same IEEE additions on every path. */
void vm_add(float *out, const float *a, int n);
void vm_add_ref(float *out, const float *a, int n);
void vm_add_avx2(float *out, const float *a, int n);
void vm_add_avx512(float *out, const float *a, int n);
/* vm_add over `rows` rows: out + r*os += a + r*as, n elements each. One dispatch for
 * all of them: a matmul task adds 16-element pieces of many tokens' rows. */
void vm_add_rows(float *out, size_t os, const float *a, size_t as, int n, int rows);

/* RMSNorm: out[i] = x[i] * scale * w[i], scale = 1 / sqrt(sum(x^2) / n + eps). The sum
 * of squares has one order on every path, so every level gives the reference's bits:
 * squares go to 16 lanes (element i to lane i % 16), then lanes fold pairwise (l += l+8,
 * l += l+4, l += l+2, l += l+1). */
void vm_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
void vm_rmsnorm_ref(float *out, const float *x, const float *w, int n, float eps);
void vm_rmsnorm_avx2(float *out, const float *x, const float *w, int n, float eps);
void vm_rmsnorm_avx512(float *out, const float *x, const float *w, int n, float eps);
/* The fold and the scale, shared by every path (s: the 16 lane sums, clobbered). */
static inline float vm_rms_scale(float s[16], int n, float eps) {
    for (int h = 8; h >= 1; h /= 2)
        for (int l = 0; l < h; l++) s[l] += s[l + h];
    return 1.0f / sqrtf(s[0] / (float)n + eps);
}

#endif
