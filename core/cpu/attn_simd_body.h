/* attn_simd_body.h: the attention block's body (see attn_simd.h), included once per
 * K/V element type; no include guard on purpose. The includer defines ATTN_BODY (the
 * function's name) and its two helpers' (ATTN_SCORES, ATTN_VALUES), ATTN_ELEM (the
 * element type), ATTN_LOADE (its vector load) and ATTN_LOADE_N (the first m lanes of
 * one, the rest 0).
 *
 * Queries go four at a time (a GQA group is 3 for SmolLM2), so each K and V row is
 * converted to f32 once per four queries and their accumulators stay in registers. */

/* Scores of queries [j0, j0+gj) (gj ≤ 4) against keys [i0, i0 + m) (m ≤ W; part: m < W,
 * a constant at each call), times ks, into s. K is dimension-major (attn.h): element d
 * of the W keys is one vector, so a query's W scores build up lane by lane, one FMA of
 * its broadcast q[d] per d, in ch chains over d (d mod 2; d mod 4 for one or two
 * queries: enough chains to hide the FMA's latency) summed at the end. A part vector
 * loads its lanes past m as 0 and reads nothing past them. */
static inline __attribute__((always_inline)) void ATTN_SCORES_VEC(
    float s[][ATTN_MAX_BLOCK], const float *q0, int j0, const int gj, int hd,
    const ATTN_ELEM *K, size_t kstride, float ks, int i0, int m, const int part) {
    const int ch = gj > 2 ? 2 : 4;
    VEC c[4][4];
#pragma GCC unroll 4
    for (int jj = 0; jj < 4; jj++) c[jj][0] = c[jj][1] = c[jj][2] = c[jj][3] = ZERO();
    for (int d = 0; d < hd; d += ch) {
#pragma GCC unroll 4
        for (int e = 0; e < ch; e++) {
            const ATTN_ELEM *kr = K + (size_t)(d + e) * kstride + i0;
            VEC k = part ? ATTN_LOADE_N(kr, m) : ATTN_LOADE(kr);
#pragma GCC unroll 4
            for (int jj = 0; jj < gj; jj++) c[jj][e] = FMA(SET1(q0[jj * hd + d + e]), k, c[jj][e]);
        }
    }
#pragma GCC unroll 4
    for (int jj = 0; jj < gj; jj++) {
        VEC sum = ch == 2 ? ADD(c[jj][0], c[jj][1])
                          : ADD(ADD(c[jj][0], c[jj][1]), ADD(c[jj][2], c[jj][3]));
        STORE(&s[j0 + jj][i0], MUL(sum, SET1(ks)));
    }
}

/* Scores of queries [j0, j0+gj) against keys [0, n): whole vectors of keys, then the
 * last part one. */
static inline __attribute__((always_inline)) void ATTN_SCORES(
    float s[][ATTN_MAX_BLOCK], const float *q, int j0, const int gj, int hd,
    const ATTN_ELEM *K, size_t kstride, float ks, int n) {
    const float *q0 = q + (size_t)j0 * hd;
    int i0 = 0;
    for (; i0 + W <= n; i0 += W) ATTN_SCORES_VEC(s, q0, j0, gj, hd, K, kstride, ks, i0, W, 0);
    if (i0 < n) ATTN_SCORES_VEC(s, q0, j0, gj, hd, K, kstride, ks, i0, n - i0, 1);
}

/* acc[j] += sum_i p[j][i] * V[i] for queries [j0, j0+gj), two W-lane columns at a time:
 * up to eight independent FMA chains, enough to hide the FMA latency. */
static inline __attribute__((always_inline)) void ATTN_VALUES(
    attn_state *st, float p[][ATTN_MAX_BLOCK], int j0, int gj, const ATTN_ELEM *V, int n) {
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

static inline void ATTN_BODY(attn_state *st, const float *q, const ATTN_ELEM *K, size_t kstride,
                             float ks, const ATTN_ELEM *V, float vs, int n) {
    int g = st->g, hd = st->hd, nw = (n + W - 1) / W * W;
    /* rows rounded up to W: whole vectors throughout, the pad scores -inf (weight 0) */
    float s[ATTN_MAX_GROUP][ATTN_MAX_BLOCK] __attribute__((aligned(64)));
    for (int j0 = 0; j0 < g; j0 += 4)
        ATTN_GROUPS(g - j0, ATTN_SCORES(s, q, j0, GJ, hd, K, kstride, ks, n));
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
            float *aj = st->acc + j * hd;
            for (int d = 0; d < hd; d += W) STORE(aj + d, MUL(LOAD(aj + d), c));
        }
        st->l[j] += lane_sum(vsum);
        st->m[j] = mx;
    }
    for (int j0 = 0; j0 < g; j0 += 4) ATTN_GROUPS(g - j0, ATTN_VALUES(st, s, j0, GJ, V, n));
}

#undef ATTN_BODY
#undef ATTN_SCORES
#undef ATTN_SCORES_VEC
#undef ATTN_VALUES
#undef ATTN_ELEM
#undef ATTN_LOADE
#undef ATTN_LOADE_N
