/* vmath_simd.h: vmath's SIMD paths, written once over the vector macros of core/cpu/vec.h
 * and included by vmath_avx2.c and vmath_avx512.c, which name the functions
 * (VM_SWIGLU_FN, VM_ADD_FN, VM_RMSNORM_FN). */
#include <string.h>

#include "core/cpu/vec.h"

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

/* The sum of squares in vmath.h's 16 lanes: 16 / W vectors side by side, a last chunk
 * of fewer than 16 through a zero-padded copy (adding 0 * 0 changes nothing), then
 * the reference's fold of the 16 lanes in C. */
void VM_RMSNORM_FN(float *out, const float *x, const float *w, int n, float eps) {
    VEC acc[16 / W];
    for (int k = 0; k < 16 / W; k++) acc[k] = ZERO();
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16 / W; k++) {
            VEC v = LOAD(x + i + k * W);
            acc[k] = ADD(acc[k], MUL(v, v));
        }
    if (i < n) {
        float t[16] = {0};
        memcpy(t, x + i, (size_t)(n - i) * sizeof(float));
        for (int k = 0; k < 16 / W; k++) {
            VEC v = LOAD(t + k * W);
            acc[k] = ADD(acc[k], MUL(v, v));
        }
    }
    float s[16];
    for (int k = 0; k < 16 / W; k++) STORE(s + k * W, acc[k]);
    float scale = vm_rms_scale(s, n, eps);
    VEC sv = SET1(scale);
    for (i = 0; i + W <= n; i += W) STORE(out + i, MUL(MUL(LOAD(x + i), sv), LOAD(w + i)));
    for (; i < n; i++) out[i] = x[i] * scale * w[i]; /* the same two roundings */
}
