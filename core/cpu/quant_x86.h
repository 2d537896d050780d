/* quant_x86.h: the 256-bit SIMD kernels, included by quant_avx2.c (AVX2+FMA+F16C:
 * maddubs/madd integer dots) and by quant_avx512.c with QX_VNNI defined (the same
 * kernels with vpdpbusd, 32 vector registers so wider tiles, plus AVX-512-only code
 * there). Everything is static: each including file registers what it wants.
 *
 * All integer dots work on unsigned weights x signed int8 activations (the form both
 * maddubs and vpdpbusd take). Types whose weights are signed (Q4_0, Q5_0: q - bias;
 * Q8_0) are made unsigned by adding a bias, and bias*sum(x) is taken off once per
 * activation block, shared by all the weight rows in a tile. Float work mirrors the
 * references' arithmetic where the result must be bit-exact (dequant, quantize). */
#ifndef KILN_QUANT_X86_H
#define KILN_QUANT_X86_H

#include "core/cpu/quant_kern.h"

#include <immintrin.h>
#include <string.h>

#define QX_INLINE static inline __attribute__((always_inline))
/* Tile loops over R rows and C columns (constants at each call) must be unrolled so
 * the accumulators live in registers; -O2 alone leaves them as arrays in memory. */
#ifndef QX_UNROLL
#define QX_UNROLL _Pragma("GCC unroll 4")
#endif

/* ---------------------------------------------------------------- helpers */

QX_INLINE float qx_h2f(uint16_t h) { return _cvtsh_ss(h); }

QX_INLINE float qx_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
QX_INLINE int qx_hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* sum over groups of 4 of u8 * s8, as 8 int32 lanes, added to acc. maddubs's int16
 * intermediate saturates above 32767; every caller keeps 2*|w|*|x| below that. */
QX_INLINE __m256i qx_dpbusd(__m256i acc, __m256i wu, __m256i xs) {
#ifdef QX_VNNI
    return _mm256_dpbusd_epi32(acc, wu, xs);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(wu, xs),
                                                   _mm256_set1_epi16(1)));
#endif
}

/* 16 packed bytes -> 32 nibbles: low nibbles in bytes 0-15, high in 16-31 (the Q4 order). */
QX_INLINE __m256i qx_nibbles(const uint8_t *qs) {
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}
/* The 32 high bits of a Q5 block as 0x10 in byte j when bit j of qh is set. */
QX_INLINE __m256i qx_q5_high(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303ll, 0x0202020202020202ll,
                                             0x0101010101010101ll, 0);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201ll);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), spread);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* ---------------------------------------------------------------- 32-block dots */

enum { QX_Q4_0, QX_Q4_1, QX_Q5_0, QX_Q5_1, QX_Q8_0 };

QX_INLINE size_t qx_wbytes(const int kind) {
    return kind == QX_Q4_0 ? sizeof(blk_q4_0) : kind == QX_Q4_1 ? sizeof(blk_q4_1)
         : kind == QX_Q5_0 ? sizeof(blk_q5_0) : kind == QX_Q5_1 ? sizeof(blk_q5_1)
         : sizeof(blk_q8_0);
}
/* Activation block: Q8_1 for the types with a min (they need s), else Q8_0. */
QX_INLINE int qx_has_min(const int kind) { return kind == QX_Q4_1 || kind == QX_Q5_1; }
QX_INLINE size_t qx_xbytes(const int kind) {
    return qx_has_min(kind) ? sizeof(blk_q8_1) : sizeof(blk_q8_0);
}
/* Offset added to make weights unsigned; taken off as bias*sum(x). For Q8_0 only the
 * VNNI build biases (w ^ 0x80 = w + 128); maddubs would saturate on 255*127, so the
 * AVX2 build uses the sign trick instead (bias 0 here). */
QX_INLINE int qx_bias(const int kind) {
#ifdef QX_VNNI
    if (kind == QX_Q8_0) return 128;
#endif
    return kind == QX_Q4_0 ? 8 : kind == QX_Q5_0 ? 16 : 0;
}

/* Weight block -> 32 bytes ready for qx_dpbusd (unsigned, or signed Q8_0 on AVX2),
 * plus its scale d and min m. */
QX_INLINE __m256i qx_decode(const int kind, const uint8_t *b, float *d, float *m) {
    uint16_t h[2];
    memcpy(h, b, 4);
    *d = qx_h2f(h[0]);
    *m = qx_has_min(kind) ? qx_h2f(h[1]) : 0.0f;
    switch (kind) {
    case QX_Q4_0: return qx_nibbles(((const blk_q4_0 *)b)->qs);
    case QX_Q4_1: return qx_nibbles(((const blk_q4_1 *)b)->qs);
    case QX_Q5_0: {
        const blk_q5_0 *p = (const blk_q5_0 *)b;
        return _mm256_or_si256(qx_nibbles(p->qs), qx_q5_high(p->qh));
    }
    case QX_Q5_1: {
        const blk_q5_1 *p = (const blk_q5_1 *)b;
        return _mm256_or_si256(qx_nibbles(p->qs), qx_q5_high(p->qh));
    }
    default: {
        __m256i q = _mm256_loadu_si256((const __m256i *)((const blk_q8_0 *)b)->qs);
        return qx_bias(QX_Q8_0) ? _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)) : q;
    }
    }
}

/* Integer dot of a decoded weight block with activations x; xneg = -bias*sum(x). */
QX_INLINE __m256i qx_idot(const int kind, __m256i wq, __m256i x, __m256i xneg) {
    (void)kind;
#ifndef QX_VNNI
    if (kind == QX_Q8_0)
        return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq),
                                                      _mm256_sign_epi8(x, wq)),
                                 _mm256_set1_epi16(1));
#endif
    return qx_dpbusd(xneg, wq, x);
}

/* The two f16 at p (d and m, or d and s) as floats in lanes 0 and 1: one conversion
 * instead of two scalar ones. Lanes 2-3 are zero. */
QX_INLINE __m128 qx_h2f_pair(const uint8_t *p) {
    int v;
    memcpy(&v, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128(v));
}

/* The tile kernel twice, with identical arithmetic: unrolled (accumulators in registers
 * for multi-column tiles: prefill, batches) and rolled (single columns: decode, where
 * the unrolled loop measured ~8% slower end to end). */
#define QX_TILE_RC qx_tile_rc
#include "core/cpu/quant_x86_tile.h"
#undef QX_TILE_RC
#pragma push_macro("QX_UNROLL")
#undef QX_UNROLL
#define QX_UNROLL
#define QX_TILE_RC qx_tile_rc_col
#include "core/cpu/quant_x86_tile.h"
#undef QX_TILE_RC
#pragma pop_macro("QX_UNROLL")

#ifdef QX_VNNI
#define QX_TILE_C 4 /* 32 registers: 4 rows x 4 columns of accumulators */
#else
#define QX_TILE_C 2 /* 16 registers: 4 x 2 */
#endif

/* Tiles of 4 rows x QX_TILE_C columns, then the edges with smaller tiles. */
QX_INLINE void qx_tile(const int kind, int64_t n, const void *w, size_t ws, int nr,
                       const void *x, size_t xs, int nc, float *out, size_t os) {
    const int64_t nb = n / QK4;
    const uint8_t *W = w, *X = x;
    int c = 0;
    for (; c + QX_TILE_C <= nc; c += QX_TILE_C) {
        const uint8_t *xc = X + c * xs;
        float *oc = out + c * os;
        int r = 0;
        for (; r + 4 <= nr; r += 4) qx_tile_rc(kind, 4, QX_TILE_C, nb, W + r * ws, ws, xc, xs, oc + r, os);
        for (; r < nr; r++) qx_tile_rc(kind, 1, QX_TILE_C, nb, W + r * ws, ws, xc, xs, oc + r, os);
    }
    for (; c < nc; c++) {
        const uint8_t *xc = X + c * xs;
        float *oc = out + c * os;
        int r = 0;
        for (; r + 4 <= nr; r += 4) qx_tile_rc_col(kind, 4, 1, nb, W + r * ws, ws, xc, xs, oc + r, os);
        for (; r + 2 <= nr; r += 2) qx_tile_rc_col(kind, 2, 1, nb, W + r * ws, ws, xc, xs, oc + r, os);
        for (; r < nr; r++) qx_tile_rc_col(kind, 1, 1, nb, W + r * ws, ws, xc, xs, oc + r, os);
    }
}

#define QX_DEFINE_DOTS(name, kind)                                                     \
    static float name##_dot(int64_t n, const void *w, const void *x) {                 \
        float o;                                                                       \
        qx_tile_rc(kind, 1, 1, n / QK4, w, 0, x, 0, &o, 0);                            \
        return o;                                                                      \
    }                                                                                  \
    static void name##_rows(int64_t n, const void *w, size_t ws, int nr, const void *x, \
                            float *out) {                                              \
        qx_tile(kind, n, w, ws, nr, x, 0, 1, out, 0);                                  \
    }                                                                                  \
    static void name##_tile(int64_t n, const void *w, size_t ws, int nr, const void *x, \
                            size_t xs, int nc, float *out, size_t os) {                \
        qx_tile(kind, n, w, ws, nr, x, xs, nc, out, os);                               \
    }

QX_DEFINE_DOTS(qx_q4_0, QX_Q4_0)
QX_DEFINE_DOTS(qx_q4_1, QX_Q4_1)
QX_DEFINE_DOTS(qx_q5_0, QX_Q5_0)
QX_DEFINE_DOTS(qx_q5_1, QX_Q5_1)
QX_DEFINE_DOTS(qx_q8_0, QX_Q8_0)

/* ---------------------------------------------------------------- quantize */

/* round(v) with ties away from zero, exactly as roundf: truncate, then step away from
 * zero when the dropped fraction is >= 0.5 (v - trunc(v) is exact). */
QX_INLINE __m256i qx_roundf(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    __m256 step = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    step = _mm256_and_ps(step, _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ));
    return _mm256_cvttps_epi32(_mm256_add_ps(t, step));
}
/* 32 floats -> 32 int8 = roundf(x*id); returns their sum. */
QX_INLINE int qx_q8_32(const float *x, float id, int8_t *q) {
    __m256 vid = _mm256_set1_ps(id);
    __m256i i0 = qx_roundf(_mm256_mul_ps(_mm256_loadu_ps(x), vid));
    __m256i i1 = qx_roundf(_mm256_mul_ps(_mm256_loadu_ps(x + 8), vid));
    __m256i i2 = qx_roundf(_mm256_mul_ps(_mm256_loadu_ps(x + 16), vid));
    __m256i i3 = qx_roundf(_mm256_mul_ps(_mm256_loadu_ps(x + 24), vid));
    int sum = qx_hsum_i32(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
    /* packs work per 128-bit lane; the permute puts the 8 dwords back in order */
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p);
    return sum;
}
QX_INLINE float qx_amax(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static void qx_quant_q8_0(const float *src, void *dst, int64_t n) {
    blk_q8_0 *b = dst;
    for (int64_t i = 0; i < n / QK4; i++, src += QK4) {
        float d = qx_amax(src, QK4) / 127.0f, id = d ? 1.0f / d : 0.0f;
        b[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        qx_q8_32(src, id, b[i].qs);
    }
}
static void qx_quant_q8_1(const float *src, void *dst, int64_t n) {
    blk_q8_1 *b = dst;
    for (int64_t i = 0; i < n / QK4; i++, src += QK4) {
        float d = qx_amax(src, QK4) / 127.0f, id = d ? 1.0f / d : 0.0f;
        int sum = qx_q8_32(src, id, b[i].qs);
        b[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        b[i].s = _cvtss_sh((float)sum * d, _MM_FROUND_TO_NEAREST_INT);
    }
}
static void qx_quant_q8_k(const float *src, void *dst, int64_t n) {
    blk_q8_k *b = dst;
    for (int64_t i = 0; i < n / QKK; i++, src += QKK) {
        float d = qx_amax(src, QKK) / 127.0f, id = d ? 1.0f / d : 0.0f;
        b[i].d = d;
        for (int j = 0; j < QKK; j += 32) qx_q8_32(src + j, id, b[i].qs + j);
        /* bsums: maddubs with ones sums byte pairs, madd folds to dwords per 4 */
        for (int j = 0; j < 16; j += 2) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(b[i].qs + j * 16));
            __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q),
                                          _mm256_set1_epi16(1));
            int lo[8];
            _mm256_storeu_si256((__m256i *)lo, s);
            b[i].bsums[j] = (int16_t)(lo[0] + lo[1] + lo[2] + lo[3]);
            b[i].bsums[j + 1] = (int16_t)(lo[4] + lo[5] + lo[6] + lo[7]);
        }
    }
}
static void qx_quant_f16(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) d[i] = quant_f32_to_f16(src[i]);
}

/* quant.c's q_bf16 eight at a time: magnitudes under 2^-48 to a signed zero, NaN made
 * quiet, the rest rounded to nearest even in integers. */
static void qx_quant_bf16(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), floor = _mm256_set1_epi32((int)QUANT_BF16_FLOOR);
    const __m256i inf = _mm256_set1_epi32(0x7f800000), one = _mm256_set1_epi32(1);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(src + i)), a = _mm256_and_si256(x, abs);
        __m256i tiny = _mm256_cmpgt_epi32(floor, a), nan = _mm256_cmpgt_epi32(a, inf);
        __m256i r = _mm256_add_epi32(x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                                         _mm256_and_si256(_mm256_srli_epi32(x, 16), one)));
        r = _mm256_blendv_epi8(r, _mm256_or_si256(x, _mm256_set1_epi32(0x400000)), nan);
        r = _mm256_blendv_epi8(r, _mm256_andnot_si256(abs, x), tiny);
        r = _mm256_srli_epi32(r, 16); /* 0..0xffff: packus keeps it */
        __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
        _mm_storeu_si128((__m128i *)(d + i), h);
    }
    quant_quantize_ref(QT_BF16, src + i, d + i, n - i);
}

/* ---------------------------------------------------------------- float dots */

static float qx_dot_f32(int64_t n, const void *w, const void *xq) {
    const float *a = w, *x = xq;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(x + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(x + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(x + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), s0);
    float s = qx_hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += a[i] * x[i];
    return s;
}
QX_INLINE __m256 qx_load_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
QX_INLINE __m256 qx_load_bf16(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
#define QX_DOT_HALF(name, load, scalar)                                                \
    static float name(int64_t n, const void *w, const void *xq) {                      \
        const uint16_t *a = w;                                                         \
        const float *x = xq;                                                           \
        __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;                    \
        int64_t i = 0;                                                                 \
        for (; i + 32 <= n; i += 32) {                                                 \
            s0 = _mm256_fmadd_ps(load(a + i), _mm256_loadu_ps(x + i), s0);             \
            s1 = _mm256_fmadd_ps(load(a + i + 8), _mm256_loadu_ps(x + i + 8), s1);     \
            s2 = _mm256_fmadd_ps(load(a + i + 16), _mm256_loadu_ps(x + i + 16), s2);   \
            s3 = _mm256_fmadd_ps(load(a + i + 24), _mm256_loadu_ps(x + i + 24), s3);   \
        }                                                                              \
        for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load(a + i), _mm256_loadu_ps(x + i), s0); \
        float s = qx_hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3))); \
        for (; i < n; i++) s += scalar(a[i]) * x[i];                                   \
        return s;                                                                      \
    }
QX_DOT_HALF(qx_dot_f16, qx_load_f16, quant_f16_to_f32)
/* BF16 weights against BF16 activations (their dot type). */
static float qx_dot_bf16(int64_t n, const void *w, const void *xq) {
    const uint16_t *a = w, *x = xq;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(qx_load_bf16(a + i), qx_load_bf16(x + i), s0);
        s1 = _mm256_fmadd_ps(qx_load_bf16(a + i + 8), qx_load_bf16(x + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(qx_load_bf16(a + i), qx_load_bf16(x + i), s0);
    float s = qx_hsum(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += quant_bf16_to_f32(a[i]) * quant_bf16_to_f32(x[i]);
    return s;
}

/* ---------------------------------------------------------------- dequant */

static void qx_dq_f16(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, qx_load_f16(s + i));
    for (; i < n; i++) dst[i] = quant_f16_to_f32(s[i]);
}
static void qx_dq_bf16(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, qx_load_bf16(s + i));
    for (; i < n; i++) dst[i] = quant_bf16_to_f32(s[i]);
}
/* 32 unsigned bytes q -> dst = d*(q - off) + m, as the references compute it (mul then
 * add, no FMA, so the result is bit-identical). */
QX_INLINE void qx_dq_store(__m256i q, int off, float d, float m, int has_m, float *dst) {
    __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    __m256i voff = _mm256_set1_epi32(off);
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; k++) {
        __m256i v = _mm256_sub_epi32(_mm256_cvtepu8_epi32(parts[k]), voff);
        __m256 f = _mm256_mul_ps(vd, _mm256_cvtepi32_ps(v));
        if (has_m) f = _mm256_add_ps(f, vm);
        _mm256_storeu_ps(dst + 8 * k, f);
    }
}
#define QX_DQ32(name, kind, off)                                                       \
    static void name(const void *src, float *dst, int64_t n) {                         \
        const uint8_t *b = src;                                                        \
        for (int64_t i = 0; i < n / QK4; i++, b += qx_wbytes(kind), dst += QK4) {      \
            float d, m;                                                                \
            __m256i q = qx_decode(kind, b, &d, &m);                                    \
            qx_dq_store(q, off, d, m, qx_has_min(kind), dst);                          \
        }                                                                              \
    }
QX_DQ32(qx_dq_q4_0, QX_Q4_0, 8)
QX_DQ32(qx_dq_q4_1, QX_Q4_1, 0)
QX_DQ32(qx_dq_q5_0, QX_Q5_0, 16)
QX_DQ32(qx_dq_q5_1, QX_Q5_1, 0)
static void qx_dq_q8_0(const void *src, float *dst, int64_t n) {
    const blk_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK4; i++, dst += QK4) {
        __m256 vd = _mm256_set1_ps(qx_h2f(b[i].d));
        for (int k = 0; k < 4; k++) {
            __m128i q = _mm_loadl_epi64((const __m128i *)(b[i].qs + 8 * k));
            _mm256_storeu_ps(dst + 8 * k, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
        }
    }
}

/* ---------------------------------------------------------------- K-quant dots */

/* Q4_K / Q5_K: per sub-block j, maddubs(q, x) pairs, then madd with the 6-bit scale
 * folds scale and the dword sum in one step; the min term comes from Q8_K's bsums. */
QX_INLINE float qx_dot_k45(const int five, int64_t n, const void *w, const void *xq) {
    const blk_q8_k *x = xq;
    __m256 acc = _mm256_setzero_ps();
    float mins = 0;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < n / QKK; i++) {
        const uint8_t *scales, *qs, *qh = NULL;
        uint16_t d, dmin;
        if (five) {
            const blk_q5_k *b = (const blk_q5_k *)w + i;
            scales = b->scales, qs = b->qs, qh = b->qh, d = b->d, dmin = b->dmin;
        } else {
            const blk_q4_k *b = (const blk_q4_k *)w + i;
            scales = b->scales, qs = b->qs, d = b->d, dmin = b->dmin;
        }
        uint8_t sc[8], mn[8];
        for (int j = 0; j < 8; j++) quant_scale_min_k4(j, scales, &sc[j], &mn[j]);
        __m256i hbits = five ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (five) {
                __m256i one = _mm256_set1_epi8(1);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * c), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * c + 1), one), 4));
            }
            __m256i x0 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 64 * c));
            __m256i x1 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 64 * c + 32));
            __m256i p0 = _mm256_maddubs_epi16(lo, x0), p1 = _mm256_maddubs_epi16(hi, x1);
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * c])));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * c + 1])));
        }
        int summ = 0;
        for (int j = 0; j < 8; j++) summ += mn[j] * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(qx_h2f(d) * x[i].d), acc);
        mins += qx_h2f(dmin) * x[i].d * (float)summ;
    }
    return qx_hsum(acc) - mins;
}
static float qx_dot_q4_k(int64_t n, const void *w, const void *xq) { return qx_dot_k45(0, n, w, xq); }
static float qx_dot_q5_k(int64_t n, const void *w, const void *xq) { return qx_dot_k45(1, n, w, xq); }

/* Q6_K: unsigned 6-bit q dotted with x, then 32*sum(x) per 16-element sub-block taken
 * off using bsums. Scale per 16 elements: madd with two scales per 256-bit vector. */
static float qx_dot_q6_k(int64_t n, const void *w, const void *xq) {
    const blk_q6_k *b = w;
    const blk_q8_k *x = xq;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QKK; i++) {
        __m256i sumi = _mm256_setzero_si256();
        int bias = 0;
        for (int j = 0; j < 16; j++) bias += b[i].scales[j] * x[i].bsums[j];
        for (int h = 0; h < 2; h++) {
            __m256i ql0 = _mm256_loadu_si256((const __m256i *)(b[i].ql + 64 * h));
            __m256i ql1 = _mm256_loadu_si256((const __m256i *)(b[i].ql + 64 * h + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(b[i].qh + 32 * h));
            __m256i q[4] = {
                _mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
            for (int t = 0; t < 4; t++) {
                __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * t), m2), 4);
                __m256i v = _mm256_or_si256(q[t], hi);
                __m256i xv = _mm256_loadu_si256((const __m256i *)(x[i].qs + 128 * h + 32 * t));
                const int8_t *s = b[i].scales + 8 * h + 2 * t;
                __m256i sc = _mm256_set_m128i(_mm_set1_epi16(s[1]), _mm_set1_epi16(s[0]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(v, xv), sc));
            }
        }
        float dd = qx_h2f(b[i].d) * x[i].d;
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(dd), acc);
        acc = _mm256_sub_ps(acc, _mm256_set_ps(0, 0, 0, 0, 0, 0, 0, dd * (float)(32 * bias)));
    }
    return qx_hsum(acc);
}

/* ---------------------------------------------------------------- registration */

static void qx_register(quant_kernels k[QT_COUNT]) {
    k[QT_F32].dot = qx_dot_f32;
    k[QT_F16] = (quant_kernels){qx_dq_f16, qx_quant_f16, qx_dot_f16, NULL, NULL};
    k[QT_BF16] = (quant_kernels){qx_dq_bf16, qx_quant_bf16, qx_dot_bf16, NULL, NULL};
    k[QT_Q4_0] = (quant_kernels){qx_dq_q4_0, NULL, qx_q4_0_dot, qx_q4_0_rows, qx_q4_0_tile};
    k[QT_Q4_1] = (quant_kernels){qx_dq_q4_1, NULL, qx_q4_1_dot, qx_q4_1_rows, qx_q4_1_tile};
    k[QT_Q5_0] = (quant_kernels){qx_dq_q5_0, NULL, qx_q5_0_dot, qx_q5_0_rows, qx_q5_0_tile};
    k[QT_Q5_1] = (quant_kernels){qx_dq_q5_1, NULL, qx_q5_1_dot, qx_q5_1_rows, qx_q5_1_tile};
    k[QT_Q8_0] = (quant_kernels){qx_dq_q8_0, qx_quant_q8_0, qx_q8_0_dot, qx_q8_0_rows, qx_q8_0_tile};
    k[QT_Q8_1].quantize = qx_quant_q8_1;
    k[QT_Q8_K].quantize = qx_quant_q8_k;
    k[QT_Q4_K].dot = qx_dot_q4_k;
    k[QT_Q5_K].dot = qx_dot_q5_k;
    k[QT_Q6_K].dot = qx_dot_q6_k;
}

#endif
