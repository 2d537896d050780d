/* attn_simd.h: the SIMD attention block, written once over the vector macros of
 * core/cpu/vec.h and included by attn_avx2.c (8 lanes) and attn_avx512.c (16 lanes),
 * which define the function names ATTN_FN (f16 K/V) and ATTN_Q8_FN (int8 K/V, a scale
 * each). The body, in attn_simd_body.h, is included once per element type: the K scale
 * multiplies each score, the V scale each softmax weight; for f16 both are 1, which
 * changes no bit. */

#include <math.h>

#include "core/cpu/vec.h"

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
#define ATTN_SCORES_VEC attn_scores_vec_f16
#define ATTN_VALUES attn_values_f16
#define ATTN_ELEM uint16_t
#define ATTN_LOADE LOADH
#define ATTN_LOADE_N LOADH_N
#include "core/cpu/attn_simd_body.h"

#define ATTN_BODY attn_body_q8
#define ATTN_SCORES attn_scores_q8
#define ATTN_SCORES_VEC attn_scores_vec_q8
#define ATTN_VALUES attn_values_q8
#define ATTN_ELEM int8_t
#define ATTN_LOADE LOADB
#define ATTN_LOADE_N LOADB_N
#include "core/cpu/attn_simd_body.h"

void ATTN_FN(attn_state *st, const float *q, const uint16_t *K, size_t kstride, const uint16_t *V,
             int n) {
    attn_body_f16(st, q, K, kstride, 1.0f, V, 1.0f, n);
}

void ATTN_Q8_FN(attn_state *st, const float *q, const int8_t *K, size_t kstride, float ks,
                const int8_t *V, float vs, int n) {
    attn_body_q8(st, q, K, kstride, ks, V, vs, n);
}
