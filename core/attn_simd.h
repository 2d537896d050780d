/* attn_simd.h: the SIMD attention block, written once over a few vector macros and
 * included by attn_avx2.c (8 lanes) and attn_avx512.c (16 lanes). Each includer
 * defines: VEC (type), W (lanes), LOADH(p) (f16 → f32 vector), SET1, ZERO, FMA(a,b,c),
 * MUL, STORE, LOAD, HSUM(v), and the function name ATTN_FN. */

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

void ATTN_FN(attn_state *st, const float *q, const uint16_t *K, const uint16_t *V, int n) {
    int g = st->g, hd = st->hd;
    float s[ATTN_MAX_GROUP][ATTN_MAX_BLOCK];
    float mx[ATTN_MAX_GROUP];
    for (int j = 0; j < g; j++) mx[j] = st->m[j];
    /* scores: each K row is converted once and dotted with every query of the group */
    for (int i = 0; i < n; i++) {
        VEC acc[ATTN_MAX_GROUP];
        for (int j = 0; j < g; j++) acc[j] = ZERO();
        for (int d = 0; d < hd; d += W) {
            VEC k = LOADH(K + (size_t)i * hd + d);
            for (int j = 0; j < g; j++) acc[j] = FMA(LOAD(q + j * hd + d), k, acc[j]);
        }
        for (int j = 0; j < g; j++) {
            float dot = HSUM(acc[j]);
            s[j][i] = dot;
            if (dot > mx[j]) mx[j] = dot;
        }
    }
    /* softmax weights under the new max; rescale what was accumulated before */
    for (int j = 0; j < g; j++) {
        float corr = st->m[j] == -__builtin_inff() ? 0.0f : __builtin_expf(st->m[j] - mx[j]);
        for (int i = 0; i < n; i++) s[j][i] -= mx[j];
        vexp_inplace(s[j], n);
        float sum = 0.0f;
        for (int i = 0; i < n; i++) sum += s[j][i];
        st->l[j] = st->l[j] * corr + sum;
        st->m[j] = mx[j];
        VEC c = SET1(corr);
        for (int d = 0; d < hd; d += W) STORE(st->acc + j * hd + d, MUL(LOAD(st->acc + j * hd + d), c));
    }
    /* values: each V row converted once, added into every query's output */
    for (int i = 0; i < n; i++) {
        for (int d = 0; d < hd; d += W) {
            VEC v = LOADH(V + (size_t)i * hd + d);
            for (int j = 0; j < g; j++) {
                float *a = st->acc + j * hd + d;
                STORE(a, FMA(SET1(s[j][i]), v, LOAD(a)));
            }
        }
    }
}
