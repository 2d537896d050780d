/* attn_simd_body.h: the attention block's body (see attn_simd.h), included once per
 * K/V element type; no include guard on purpose. The includer defines ATTN_BODY (the
 * function's name) and its two helpers' (ATTN_SCORES, ATTN_VALUES), ATTN_ELEM (the
 * element type) and ATTN_LOADE (its vector load).
 *
 * Queries go four at a time (a GQA group is 3 for SmolLM2), so each K and V row is
 * converted to f32 once per four queries and their accumulators stay in registers. */

/* Scores of queries [j0, j0+gj) (gj ≤ 4) against keys [0, n), times ks, into s. Four
 * keys' lane-wise dot products are folded by RED4, W keys' by REDW into one vector of W
 * scores: about two shuffles per key instead of a horizontal sum per key and query. */
static inline __attribute__((always_inline)) void ATTN_SCORES(float s[][ATTN_MAX_BLOCK], const float *q, int j0, int gj,
                                      int hd, const ATTN_ELEM *K, float ks, int n) {
    const float *q0 = q + (size_t)j0 * hd;
    for (int i0 = 0; i0 < n; i0 += W) {
        VEC u[4][W / 4];
        for (int r4 = 0; r4 < W / 4; r4++) {
            VEC c[4][4];
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) c[0][r] = c[1][r] = c[2][r] = c[3][r] = ZERO();
            int nr = n - (i0 + 4 * r4); /* keys left; rows past n stay 0 */
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                if (r >= nr) break;
                const ATTN_ELEM *kr = K + (size_t)(i0 + 4 * r4 + r) * hd;
                for (int d = 0; d < hd; d += W) {
                    VEC k = ATTN_LOADE(kr + d);
                    c[0][r] = FMA(LOAD(q0 + d), k, c[0][r]);
                    if (gj > 1) c[1][r] = FMA(LOAD(q0 + hd + d), k, c[1][r]);
                    if (gj > 2) c[2][r] = FMA(LOAD(q0 + 2 * hd + d), k, c[2][r]);
                    if (gj > 3) c[3][r] = FMA(LOAD(q0 + 3 * hd + d), k, c[3][r]);
                }
            }
#pragma GCC unroll 4
            for (int jj = 0; jj < 4; jj++)
                if (jj < gj) u[jj][r4] = RED4(c[jj][0], c[jj][1], c[jj][2], c[jj][3]);
        }
        for (int jj = 0; jj < gj; jj++) STORE(&s[j0 + jj][i0], MUL(REDW(u[jj]), SET1(ks)));
    }
}

/* acc[j] += sum_i p[j][i] * V[i] for queries [j0, j0+gj), two W-lane columns at a time:
 * up to eight independent FMA chains, enough to hide the FMA latency. */
static inline __attribute__((always_inline)) void ATTN_VALUES(attn_state *st, float p[][ATTN_MAX_BLOCK], int j0, int gj,
                                      const ATTN_ELEM *V, int n) {
    int hd = st->hd;
    for (int d = 0; d < hd; d += 2 * W) {
        int two = d + W < hd; /* hd a multiple of W, maybe not of 2W */
        float *a = st->acc + (size_t)j0 * hd + d;
        VEC a0[4], a1[4];
#pragma GCC unroll 4
        for (int jj = 0; jj < 4; jj++) {
            a0[jj] = jj < gj ? LOAD(a + jj * hd) : ZERO();
            a1[jj] = jj < gj && two ? LOAD(a + jj * hd + W) : ZERO();
        }
        for (int i = 0; i < n; i++) {
            const ATTN_ELEM *vr = V + (size_t)i * hd + d;
            VEC v0 = ATTN_LOADE(vr), v1 = two ? ATTN_LOADE(vr + W) : ZERO();
#pragma GCC unroll 4
            for (int jj = 0; jj < 4; jj++) {
                if (jj >= gj) break;
                VEC w = SET1(p[j0 + jj][i]);
                a0[jj] = FMA(w, v0, a0[jj]);
                a1[jj] = FMA(w, v1, a1[jj]);
            }
        }
#pragma GCC unroll 4
        for (int jj = 0; jj < 4; jj++) {
            if (jj >= gj) break;
            STORE(a + jj * hd, a0[jj]);
            if (two) STORE(a + jj * hd + W, a1[jj]);
        }
    }
}

static inline void ATTN_BODY(attn_state *st, const float *q, const ATTN_ELEM *K, float ks,
                             const ATTN_ELEM *V, float vs, int n) {
    int g = st->g, hd = st->hd, nw = (n + W - 1) / W * W;
    /* rows rounded up to W: whole vectors throughout, the pad scores -inf (weight 0) */
    float s[ATTN_MAX_GROUP][ATTN_MAX_BLOCK] __attribute__((aligned(64)));
    for (int j0 = 0; j0 < g; j0 += 4) ATTN_GROUPS(g - j0, ATTN_SCORES(s, q, j0, GJ, hd, K, ks, n));
    if (st->softcap > 0.0f) attn_softcap_scores(s, g, n, st->softcap);
    /* softmax weights under the new max; rescale what was accumulated before (unless
     * the max stayed: a factor of 1 changes nothing). The V scale rides on the weights;
     * l sums the weights without it. */
    for (int j = 0; j < g; j++) {
        float *sj = s[j];
        for (int i = n; i < nw; i++) sj[i] = -__builtin_inff();
        VEC vm = SET1(st->m[j]);
        for (int i = 0; i < nw; i += W) vm = MAXV(vm, LOAD(sj + i));
        float mx = lane_max(vm);
        VEC vsum = ZERO(), vmx = SET1(mx), vvs = SET1(vs);
        for (int i = 0; i < nw; i += W) {
            VEC p = vexp(SUB(LOAD(sj + i), vmx));
            vsum = ADD(vsum, p);
            STORE(sj + i, MUL(p, vvs));
        }
        if (mx != st->m[j]) {
            float corr = st->m[j] == -__builtin_inff() ? 0.0f : __builtin_expf(st->m[j] - mx);
            st->l[j] *= corr;
            VEC c = SET1(corr);
            for (int d = 0; d < hd; d += W) STORE(st->acc + j * hd + d, MUL(LOAD(st->acc + j * hd + d), c));
        }
        st->l[j] += lane_sum(vsum);
        st->m[j] = mx;
    }
    for (int j0 = 0; j0 < g; j0 += 4) ATTN_GROUPS(g - j0, ATTN_VALUES(st, s, j0, GJ, V, n));
}

#undef ATTN_BODY
#undef ATTN_SCORES
#undef ATTN_VALUES
#undef ATTN_ELEM
#undef ATTN_LOADE
