/* vmath_simd.h: vmath's SIMD paths, written once over the vector macros of core/vec.h
 * and included by vmath_avx2.c and vmath_avx512.c, which name the functions
 * (VM_SWIGLU_FN, VM_ADD_FN). */
#include <string.h>

#include "core/vec.h"

/* silu(g) * u. exp(-g) is clamped to g >= -88 (exp(88) is still finite), where the
 * reference's exp overflows to inf: silu is then ~5e-37 * g instead of -0. */
static inline VEC swiglu_vec(VEC g, VEC u) {
    VEC e = vexp(MINV(SUB(ZERO(), g), SET1(88.0f)));
    return MUL(DIV(g, ADD(SET1(1.0f), e)), u);
}

void VM_SWIGLU_FN(float *out, const float *gate, const float *up, int n) {
    int i = 0;
    for (; i + W <= n; i += W) STORE(out + i, swiglu_vec(LOAD(gate + i), LOAD(up + i)));
    if (i < n) { /* the last n - i < W through one padded vector: the same arithmetic */
        float g[W] = {0}, u[W] = {0}, o[W];
        memcpy(g, gate + i, (size_t)(n - i) * sizeof(float));
        memcpy(u, up + i, (size_t)(n - i) * sizeof(float));
        STORE(o, swiglu_vec(LOAD(g), LOAD(u)));
        memcpy(out + i, o, (size_t)(n - i) * sizeof(float));
    }
}

void VM_ADD_FN(float *out, const float *a, int n) {
    int i = 0;
    for (; i + W <= n; i += W) STORE(out + i, ADD(LOAD(out + i), LOAD(a + i)));
    for (; i < n; i++) out[i] += a[i]; /* an add is exact either way */
}
