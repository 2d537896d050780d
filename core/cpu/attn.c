/* attn: reference online-softmax attention over a KV block, and the dispatcher. */
#include "core/cpu/attn.h"

#include <math.h>

#include "core/cpu/isa.h"
#include "core/cpu/quant.h"

void attn_init(attn_state *st, int g, int hd) {
    st->g = g, st->hd = hd, st->softcap = 0.0f;
    for (int j = 0; j < g; j++) st->m[j] = -INFINITY, st->l[j] = 0.0f;
    for (int i = 0; i < g * hd; i++) st->acc[i] = 0.0f;
}

void attn_set_softcap(attn_state *st, float softcap) { st->softcap = softcap > 0.0f ? softcap : 0.0f; }

/* Element i of a K or V block: f16, or int8 times the block's scale. */
static inline float elem(const void *p, size_t i, float scale, int q8) {
    return q8 ? (float)((const int8_t *)p)[i] * scale : quant_f16_to_f32(((const uint16_t *)p)[i]);
}

/* For each query: scores against the block's keys, a new running max, the old sum and
 * output rescaled by exp(old max - new max), then the block's weighted values added. */
static void ref_block(attn_state *st, const float *q, const void *K, size_t kstride, float ks,
                      const void *V, float vs, int n, int q8) {
    int g = st->g, hd = st->hd;
    static _Thread_local float s[ATTN_MAX_GROUP][ATTN_MAX_BLOCK];
    for (int j = 0; j < g; j++) {
        float mx = st->m[j];
        for (int i = 0; i < n; i++) {
            float dot = 0.0f;
            for (int d = 0; d < hd; d++) dot += q[j * hd + d] * elem(K, (size_t)d * kstride + (size_t)i, ks, q8);
            if (st->softcap > 0.0f) dot = st->softcap * tanhf(dot / st->softcap);
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

void attn_block_ref(attn_state *st, const float *q, const uint16_t *K, size_t kstride,
                    const uint16_t *V, int n) {
    ref_block(st, q, K, kstride, 1.0f, V, 1.0f, n, 0);
}

void attn_block_q8_ref(attn_state *st, const float *q, const int8_t *K, size_t kstride,
                       float ks, const int8_t *V, float vs, int n) {
    ref_block(st, q, K, kstride, ks, V, vs, n, 1);
}

/* ---------------------------------------------------------------- dispatch */

typedef void (*attn_f16_fn)(attn_state *, const float *, const uint16_t *, size_t,
                            const uint16_t *, int);
typedef void (*attn_q8_fn)(attn_state *, const float *, const int8_t *, size_t, float,
                           const int8_t *, float, int);
typedef struct {
    attn_f16_fn f16;
    attn_q8_fn q8;
    int lanes; /* the path needs hd a multiple of it */
} attn_path;

/* Per dispatch slot (isa.h); no AMX kernels, so the AMX slots run AVX-512's. */
static const attn_path paths[ISA_SLOTS] = {
    [ISA_SCALAR] = {attn_block_ref, attn_block_q8_ref, 1},
#if defined(__x86_64__)
    [ISA_AVX2] = {attn_block_avx2, attn_block_q8_avx2, 8},
    [ISA_AVX512] = {attn_block_avx512, attn_block_q8_avx512, 16},
    [ISA_SLOT_AMX_Q4_1] = {attn_block_avx512, attn_block_q8_avx512, 16},
    [ISA_SLOT_AMX_ALL] = {attn_block_avx512, attn_block_q8_avx512, 16},
#endif
};

/* The slot's path, or the first below it whose lanes divide hd (the reference's is 1). */
static const attn_path *path(const attn_state *st) {
    const attn_path *p = ISA_PICK(paths);
    while (st->hd % p->lanes) p--;
    return p;
}

void attn_block_q8(attn_state *st, const float *q, const int8_t *K, size_t kstride, float ks,
                   const int8_t *V, float vs, int n) {
    path(st)->q8(st, q, K, kstride, ks, V, vs, n);
}

void attn_block(attn_state *st, const float *q, const uint16_t *K, size_t kstride,
                const uint16_t *V, int n) {
    path(st)->f16(st, q, K, kstride, V, n);
}

void attn_finish(const attn_state *st, float *out, size_t out_stride) {
    for (int j = 0; j < st->g; j++) {
        float inv = st->l[j] > 0.0f ? 1.0f / st->l[j] : 0.0f;
        for (int d = 0; d < st->hd; d++) out[j * out_stride + d] = st->acc[j * st->hd + d] * inv;
    }
}
