/* attn: reference online-softmax attention over a KV block, and the dispatcher. */
#include "core/cpu/attn.h"

#include <math.h>

#include "core/cpu/quant.h"

void attn_init(attn_state *st, int g, int hd) {
    st->g = g, st->hd = hd;
    for (int j = 0; j < g; j++) st->m[j] = -INFINITY, st->l[j] = 0.0f;
    for (int i = 0; i < g * hd; i++) st->acc[i] = 0.0f;
}

/* Element i of a K or V block: f16, or int8 times the block's scale. */
static inline float elem(const void *p, size_t i, float scale, int q8) {
    return q8 ? (float)((const int8_t *)p)[i] * scale : quant_f16_to_f32(((const uint16_t *)p)[i]);
}

/* For each query: scores against the block's keys, a new running max, the old sum and
 * output rescaled by exp(old max - new max), then the block's weighted values added. */
static void ref_block(attn_state *st, const float *q, const void *K, float ks, const void *V,
                      float vs, int n, int q8) {
    int g = st->g, hd = st->hd;
    static _Thread_local float s[ATTN_MAX_GROUP][ATTN_MAX_BLOCK];
    for (int j = 0; j < g; j++) {
        float mx = st->m[j];
        for (int i = 0; i < n; i++) {
            float dot = 0.0f;
            for (int d = 0; d < hd; d++) dot += q[j * hd + d] * elem(K, (size_t)(i * hd + d), ks, q8);
            s[j][i] = dot;
            if (dot > mx) mx = dot;
        }
        float corr = expf(st->m[j] - mx); /* 0 on the first block: m = -inf */
        st->l[j] *= corr;
        for (int d = 0; d < hd; d++) st->acc[j * hd + d] *= corr;
        st->m[j] = mx;
        for (int i = 0; i < n; i++) {
            float p = expf(s[j][i] - mx);
            st->l[j] += p;
            for (int d = 0; d < hd; d++) st->acc[j * hd + d] += p * elem(V, (size_t)(i * hd + d), vs, q8);
        }
    }
}

void attn_block_ref(attn_state *st, const float *q, const uint16_t *K, const uint16_t *V, int n) {
    ref_block(st, q, K, 1.0f, V, 1.0f, n, 0);
}

void attn_block_q8_ref(attn_state *st, const float *q, const int8_t *K, float ks,
                       const int8_t *V, float vs, int n) {
    ref_block(st, q, K, ks, V, vs, n, 1);
}

void attn_block_q8(attn_state *st, const float *q, const int8_t *K, float ks, const int8_t *V,
                   float vs, int n) {
    int lvl = quant_simd();
#if defined(__x86_64__)
    if (lvl >= QS_AVX512 && st->hd % 16 == 0) return attn_block_q8_avx512(st, q, K, ks, V, vs, n);
    if (lvl >= QS_AVX2 && st->hd % 8 == 0) return attn_block_q8_avx2(st, q, K, ks, V, vs, n);
#endif
    (void)lvl;
    attn_block_q8_ref(st, q, K, ks, V, vs, n);
}

void attn_block(attn_state *st, const float *q, const uint16_t *K, const uint16_t *V, int n) {
    int lvl = quant_simd();
#if defined(__x86_64__)
    if (lvl >= QS_AVX512 && st->hd % 16 == 0) return attn_block_avx512(st, q, K, V, n);
    if (lvl >= QS_AVX2 && st->hd % 8 == 0) return attn_block_avx2(st, q, K, V, n);
#endif
    (void)lvl;
    attn_block_ref(st, q, K, V, n);
}

void attn_finish(const attn_state *st, float *out, size_t out_stride) {
    for (int j = 0; j < st->g; j++) {
        float inv = st->l[j] > 0.0f ? 1.0f / st->l[j] : 0.0f;
        for (int d = 0; d < st->hd; d++) out[j * out_stride + d] = st->acc[j * st->hd + d] * inv;
    }
}
