/* attn_simd.h: the SIMD attention block, written once over a few vector macros and
 * included by attn_avx2.c (8 lanes) and attn_avx512.c (16 lanes). Each includer
 * defines: VEC (type), W (lanes), LOADH(p) (f16 → f32 vector), LOADB(p) (int8 → f32
 * vector), SET1, ZERO, FMA(a,b,c), MUL, STORE, LOAD, HSUM(v), and the function names
 * ATTN_FN (f16 K/V) and ATTN_Q8_FN (int8 K/V, a scale each). The body, in
 * attn_simd_body.h, is included once per element type: the K scale multiplies each
 * score, the V scale each softmax weight; for f16 both are 1, which changes no bit. */

/* exp for x ≤ 0 (scores minus their running max): range-reduce by ln2, a degree-6
 * polynomial on [-ln2/2, ln2/2], scale by 2^k. Relative error ≈ 2e-7; 0 below -87. */
static inline void vexp_inplace(float *x, int n) {
    for (int i = 0; i < n; i++) { /* branch-free so the compiler vectorizes it */
        float v = x[i] < -87.0f ? -87.0f : x[i];
        float k = __builtin_rintf(v * 1.44269504088896341f);
        float r = v - k * 0.693145751953125f - k * 1.428606765330187045e-06f;
        float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.16666667f + r * (0.041666667f +
                  r * (0.0083333333f + r * 0.0013888889f)))));
        union { float f; uint32_t i; } u = {p};
        u.i += (uint32_t)(int32_t)k << 23; /* scale by 2^k in the exponent field */
        x[i] = x[i] < -87.0f ? 0.0f : u.f;
    }
}

#define ATTN_BODY attn_body_f16
#define ATTN_ELEM uint16_t
#define ATTN_LOADE LOADH
#include "core/attn_simd_body.h"

#define ATTN_BODY attn_body_q8
#define ATTN_ELEM int8_t
#define ATTN_LOADE LOADB
#include "core/attn_simd_body.h"

void ATTN_FN(attn_state *st, const float *q, const uint16_t *K, const uint16_t *V, int n) {
    attn_body_f16(st, q, K, 1.0f, V, 1.0f, n);
}

void ATTN_Q8_FN(attn_state *st, const float *q, const int8_t *K, float ks, const int8_t *V,
                float vs, int n) {
    attn_body_q8(st, q, K, ks, V, vs, n);
}
