/* attn_simd.h: the SIMD attention block, written once over a few vector macros and
 * included by attn_avx2.c (8 lanes) and attn_avx512.c (16 lanes). Each includer
 * defines: VEC (type), W (lanes), LOADH(p) (f16 → f32 vector), LOADB(p) (int8 → f32
 * vector), SET1, ZERO, FMA(a,b,c), MUL, STORE, LOAD, RED4(a,b,c,d) (four vectors to one
 * whose every 128-bit quarter holds the four vectors' sums over that quarter), REDW(u)
 * (W/4 RED4 results to the W sums, vector r's in lane r), for the softmax's exp MAXV,
 * RINT (to nearest), LDEXP(e, k) (e * 2^k, k integral), ZERO_BELOW(x, lim, e) (e where
 * x ≥ lim, else 0), and the function names
 * ATTN_FN (f16 K/V) and ATTN_Q8_FN (int8 K/V, a scale each). The body, in
 * attn_simd_body.h, is included once per element type: the K scale multiplies each
 * score, the V scale each softmax weight; for f16 both are 1, which changes no bit. */

/* exp for x ≤ 0 (scores minus their running max), W lanes: range-reduce by ln2, a
 * degree-6 polynomial on [-ln2/2, ln2/2], scale by 2^k. Relative error ≈ 2e-7; 0 below
 * -87 (so -inf gives 0). Written in vector macros: the compiler's cheap vectorizer at -O2
 * leaves the same loop scalar (it does not if-convert the clamp). */
static inline VEC vexp(VEC x) {
    VEC v = MAXV(x, SET1(-87.0f));
    VEC k = RINT(MUL(v, SET1(1.44269504088896341f)));
    VEC r = FMA(k, SET1(-1.428606765330187045e-06f), FMA(k, SET1(-0.693145751953125f), v));
    VEC e = FMA(r, SET1(0.0013888889f), SET1(0.0083333333f));
    e = FMA(r, e, SET1(0.041666667f));
    e = FMA(r, e, SET1(0.16666667f));
    e = FMA(r, e, SET1(0.5f));
    e = FMA(r, e, SET1(1.0f));
    e = FMA(r, e, SET1(1.0f));
    return ZERO_BELOW(x, -87.0f, LDEXP(e, k));
}

/* Sum of a vector's lanes, in lane order (the same order every time). */
static inline float lane_sum(VEC v) {
    float t[W], sum = 0.0f;
    STORE(t, v);
    for (int l = 0; l < W; l++) sum += t[l];
    return sum;
}

static inline float lane_max(VEC v) {
    float t[W], m = -__builtin_inff();
    STORE(t, v);
    for (int l = 0; l < W; l++) m = t[l] > m ? t[l] : m;
    return m;
}

#define ATTN_BODY attn_body_f16
#define ATTN_SCORES attn_scores_f16
#define ATTN_VALUES attn_values_f16
#define ATTN_ELEM uint16_t
#define ATTN_LOADE LOADH
#include "core/attn_simd_body.h"

#define ATTN_BODY attn_body_q8
#define ATTN_SCORES attn_scores_q8
#define ATTN_VALUES attn_values_q8
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
