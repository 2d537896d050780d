/* attn: reference online-softmax attention over a KV block, and the dispatcher. */
#include "core/attn.h"

#include <math.h>

#include "core/quant.h"

void attn_init(attn_state *st, int g, int hd) {
    st->g = g, st->hd = hd;
    for (int j = 0; j < g; j++) st->m[j] = -INFINITY, st->l[j] = 0.0f;
    for (int i = 0; i < g * hd; i++) st->acc[i] = 0.0f;
}

/* For each query: scores against the block's keys, a new running max, the old sum and
 * output rescaled by exp(old max - new max), then the block's weighted values added. */
void attn_block_ref(attn_state *st, const float *q, const uint16_t *K, const uint16_t *V, int n) {
    int g = st->g, hd = st->hd;
    static _Thread_local float s[ATTN_MAX_GROUP][ATTN_MAX_BLOCK];
    for (int j = 0; j < g; j++) {
        float mx = st->m[j];
        for (int i = 0; i < n; i++) {
            float dot = 0.0f;
            for (int d = 0; d < hd; d++) dot += q[j * hd + d] * quant_f16_to_f32(K[i * hd + d]);
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
            for (int d = 0; d < hd; d++) st->acc[j * hd + d] += p * quant_f16_to_f32(V[i * hd + d]);
        }
    }
}

/* The reference over int8 K/V: the same loops, each key and value widened and scaled. */
void attn_block_q8_ref(attn_state *st, const float *q, const int8_t *K, float ks,
                       const int8_t *V, float vs, int n) {
    int g = st->g, hd = st->hd;
    static _Thread_local float s[ATTN_MAX_GROUP][ATTN_MAX_BLOCK];
    for (int j = 0; j < g; j++) {
        float mx = st->m[j];
        for (int i = 0; i < n; i++) {
            float dot = 0.0f;
            for (int d = 0; d < hd; d++) dot += q[j * hd + d] * (float)K[i * hd + d];
            s[j][i] = dot * ks;
            if (s[j][i] > mx) mx = s[j][i];
        }
        float corr = expf(st->m[j] - mx);
        st->l[j] *= corr;
        for (int d = 0; d < hd; d++) st->acc[j * hd + d] *= corr;
        st->m[j] = mx;
        for (int i = 0; i < n; i++) {
            float p = expf(s[j][i] - mx);
            st->l[j] += p;
            for (int d = 0; d < hd; d++) st->acc[j * hd + d] += p * vs * (float)V[i * hd + d];
        }
    }
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
