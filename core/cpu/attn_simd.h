/* attn_simd.h: the SIMD attention block, written once over the vector macros of
 * core/cpu/vec.h and included by attn_avx2.c (8 lanes) and attn_avx512.c (16 lanes). RED4
 * (below) folds four vectors to one whose every 128-bit lane holds the four vectors'
 * sums over that lane; each includer defines REDW(u) (W/4 RED4 results to the W sums,
 * vector r's in lane r, which crosses 128-bit lanes differently per width), and the
 * function names ATTN_FN (f16 K/V) and ATTN_Q8_FN (int8 K/V, a scale each). The body,
 * in attn_simd_body.h, is included once per element type: the K scale multiplies each
 * score, the V scale each softmax weight; for f16 both are 1, which changes no bit. */

#include <math.h>

#include "core/cpu/vec.h"

/* Within each 128-bit lane: the unpacks pair lanes (a0+a2, b0+b2, a1+a3, b1+b3), the
 * shuffles finish each vector's sum over that lane: [a b c d] per 128 bits. */
static inline VEC RED4(VEC a, VEC b, VEC c, VEC d) {
    VEC ab = ADD(UNPACKLO(a, b), UNPACKHI(a, b));
    VEC cd = ADD(UNPACKLO(c, d), UNPACKHI(c, d));
    return ADD(SHUF4(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)), SHUF4(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
}

/* Gemma 2's capped scores, cap * tanh(score / cap), by the reference's own tanhf: one
 * call per score, small beside the score's head_dim-long dot product. */
static inline void attn_softcap_scores(float s[][ATTN_MAX_BLOCK], int g, int n, float cap) {
    for (int j = 0; j < g; j++)
        for (int i = 0; i < n; i++) s[j][i] = cap * tanhf(s[j][i] / cap);
}

/* call, with GJ the queries of this pass (left: those still to go) as a constant: the
 * bodies inline once per count, their per-query tests gone from the inner loops (the
 * branches on a variable count were a fifth of a block's samples). */
#define ATTN_GROUPS(left, call)                                                             \
    switch ((left) < 4 ? (left) : 4) {                                                    \
    case 4: { enum { GJ = 4 }; call; break; }                                              \
    case 3: { enum { GJ = 3 }; call; break; }                                              \
    case 2: { enum { GJ = 2 }; call; break; }                                              \
    default: { enum { GJ = 1 }; call; break; }                                             \
    }

#define ATTN_BODY attn_body_f16
#define ATTN_SCORES attn_scores_f16
#define ATTN_VALUES attn_values_f16
#define ATTN_ELEM uint16_t
#define ATTN_LOADE LOADH
#include "core/cpu/attn_simd_body.h"

#define ATTN_BODY attn_body_q8
#define ATTN_SCORES attn_scores_q8
#define ATTN_VALUES attn_values_q8
#define ATTN_ELEM int8_t
#define ATTN_LOADE LOADB
#include "core/cpu/attn_simd_body.h"

void ATTN_FN(attn_state *st, const float *q, const uint16_t *K, const uint16_t *V, int n) {
    attn_body_f16(st, q, K, 1.0f, V, 1.0f, n);
}

void ATTN_Q8_FN(attn_state *st, const float *q, const int8_t *K, float ks, const int8_t *V,
                float vs, int n) {
    attn_body_q8(st, q, K, ks, V, vs, n);
}
