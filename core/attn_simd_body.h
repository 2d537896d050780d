/* attn_simd_body.h: the attention block's body (see attn_simd.h), included once per
 * K/V element type; no include guard on purpose. The includer defines ATTN_BODY (the
 * function's name), ATTN_ELEM (the element type) and ATTN_LOADE (its vector load). */
static inline void ATTN_BODY(attn_state *st, const float *q, const ATTN_ELEM *K, float ks,
                             const ATTN_ELEM *V, float vs, int n) {
    int g = st->g, hd = st->hd;
    float s[ATTN_MAX_GROUP][ATTN_MAX_BLOCK];
    float mx[ATTN_MAX_GROUP];
    for (int j = 0; j < g; j++) mx[j] = st->m[j];
    /* scores: each K row is converted once and dotted with every query of the group */
    for (int i = 0; i < n; i++) {
        VEC acc[ATTN_MAX_GROUP];
        for (int j = 0; j < g; j++) acc[j] = ZERO();
        for (int d = 0; d < hd; d += W) {
            VEC k = ATTN_LOADE(K + (size_t)i * hd + d);
            for (int j = 0; j < g; j++) acc[j] = FMA(LOAD(q + j * hd + d), k, acc[j]);
        }
        for (int j = 0; j < g; j++) {
            float dot = HSUM(acc[j]) * ks;
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
            VEC v = ATTN_LOADE(V + (size_t)i * hd + d);
            for (int j = 0; j < g; j++) {
                float *a = st->acc + j * hd + d;
                STORE(a, FMA(SET1(s[j][i] * vs), v, LOAD(a)));
            }
        }
    }
}

#undef ATTN_BODY
#undef ATTN_ELEM
#undef ATTN_LOADE
