/* vec.h: helpers written once over a set of vector macros that core/cpu/vec_avx2.h (8
 * lanes) or core/cpu/vec_avx512.h (16 lanes) defines: VEC (type), W (lanes), LOADH(p)
 * (f16 -> f32 vector), LOADB(p) (int8 -> f32 vector), LOAD, STORE, SET1, ZERO, ADD,
 * SUB, MUL, DIV, FMA(a,b,c) (a*b+c), MAXV, MINV, REDUCE_ADD, REDUCE_MAX (lanes to a
 * float), RINT (to nearest), LDEXP(e, k) (e * 2^k, k integral), ZERO_BELOW(x, lim, e)
 * (e where x >= lim, else 0). Included after one of them by each SIMD kernel file (no
 * include guard: once per translation unit). */

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

/* A vector's lanes summed, or their max, by the includer's fixed tree (halves, then
 * quarters, ...: REDUCE_ADD, REDUCE_MAX): the same order every time, and a dependency
 * depth of log2(W) where a lane-order loop was W long; attention reduces each query's
 * scores once per KV block. */
static inline float lane_sum(VEC v) { return REDUCE_ADD(v); }

static inline float lane_max(VEC v) { return REDUCE_MAX(v); }
