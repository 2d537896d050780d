/* qpack_avx2: the packed Q4_1/Q5_1 x Q8_1, Q8_0/Q4_0/Q5_0 x Q8_0, Q4_K/Q5_K x Q8_K, Q6_K x Q8_K,
 * F16 x F32 and BF16 x BF16 tiles with AVX2 (layouts and arithmetic in qpack.h), for machines
 * without AVX-512 (and TCG guests). For the integer types a 256-bit vector holds 8 rows, so a
 * group goes as two halves of 8 rows, each over all blocks, its accumulators in
 * registers (F16's and BF16's vectors are two rows' 128-bit lanes, below). With no
 * VNNI, vpmaddubsw multiplies a chunk's nibbles by the broadcast activation bytes into
 * 16-bit pair sums; the 8 of a block add up in 16 bits without overflow (each at most
 * 2 * 15 * 127, eight of them 30,480 < 32,767), then one vpmaddwd makes each row's
 * int32 sum: the same exact integer as the reference's, so the two FMAs after it give
 * its bits. */
#include <immintrin.h>
#include <string.h>

#include "core/cpu/qpack.h"
#include "core/cpu/qpack_x86.h"
#include "core/cpu/quant_kern.h"

#define QP2_INLINE static inline __attribute__((always_inline))
#define Q41_GBLK QP_Q41_GBLK
#define QP2_MAXC 4 /* columns per pass: 8 weight vectors + 4 accumulators in 16 registers */
#define QP2_UNROLL _Pragma("GCC unroll 8")

QP2_INLINE __m256i qp2_bcast(const uint8_t *p) {
    int v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Chunk k's nibbles of a 32-byte load v in w[0] (low) and w[1] (high), plus for the
 * 5-bit types their 5th bits from the per-chunk bytes h5 at bit 4 (qpack_avx512.c's
 * qp_nibbles; with no mask registers a compare makes the byte mask). */
QP2_INLINE void qp2_nibbles(__m256i v, const int q5, __m256i h5, const int k, __m256i w[2]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    w[0] = _mm256_and_si256(v, m4);
    w[1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if (q5) {
        const __m256i idx = _mm256_add_epi8(_mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0,
                                                              0x04040404, 0x08080808, 0x0C0C0C0C),
                                            _mm256_set1_epi8((char)k));
        const __m256i b = _mm256_shuffle_epi8(h5, idx), sixteen = _mm256_set1_epi8(16);
        const __m256i lo = _mm256_set1_epi32(0x08040201), hi = _mm256_set1_epi32((int)0x80402010u);
        w[0] = _mm256_or_si256(w[0], _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(b, lo), lo), sixteen));
        w[1] = _mm256_or_si256(w[1], _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(b, hi), hi), sixteen));
    }
}

/* The 32 products of a block as int32 per row: 4-bit values sum all 8 vpmaddubsw in
 * 16 bits (at most 8 * 2 * 15 * 128 = 30,720), 5-bit ones the low and the high
 * nibbles' 4 apart (4 * 2 * 31 * 128 = 31,744 each) before vpmaddwd widens. */
QP2_INLINE __m256i qp2_sum32(const __m256i w[8], const uint8_t *q, const int q5) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s = _mm256_setzero_si256(), t = _mm256_setzero_si256();
    QP2_UNROLL for (int k = 0; k < 4; k++) {
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[2 * k], qp2_bcast(q + 4 * k)));
        __m256i p = _mm256_maddubs_epi16(w[2 * k + 1], qp2_bcast(q + 16 + 4 * k));
        if (q5) t = _mm256_add_epi16(t, p);
        else s = _mm256_add_epi16(s, p);
    }
    __m256i i = _mm256_madd_epi16(s, ones);
    return q5 ? _mm256_add_epi32(i, _mm256_madd_epi16(t, ones)) : i;
}

/* Rows 8h..8h+7 of one Q4_1 (Q5_1: q5) group x C columns over all nb blocks. */
QP2_INLINE void q41_half(const int q5, const int C, int64_t nb, const uint8_t *g, int h, const uint8_t *x,
                         size_t xs, __m256 acc[QP2_MAXC]) {
    const size_t gbb = q5 ? QP_Q51_GBLK : Q41_GBLK, qat = q5 ? 128 : 64;
    QP2_UNROLL for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = g + b * gbb;
        qp_prefetch(gb, gbb);
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 16 * h)));
        __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 32 + 16 * h)));
        __m256i w[8], h5 = q5 ? _mm256_loadu_si256((const __m256i *)(gb + 64 + 32 * h)) : _mm256_setzero_si256();
        QP2_UNROLL for (int k = 0; k < 4; k++)
            qp2_nibbles(_mm256_loadu_si256((const __m256i *)(gb + qat + 64 * k + 32 * h)), q5, h5, k, w + 2 * k);
        QP2_UNROLL for (int c = 0; c < C; c++) {
            const uint8_t *xb = x + c * xs + b * sizeof(blk_q8_1), *q = xb + 4;
            __m256 fi = _mm256_cvtepi32_ps(qp2_sum32(w, q, q5));
            /* [d_x, s_x] of the block; vcvtph2ps reads 4 halves, the last 2 are qs */
            __m128 ds = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)xb));
            __m256 dx = _mm256_broadcastss_ps(ds), sx = _mm256_broadcastss_ps(_mm_movehdup_ps(ds));
            acc[c] = _mm256_fmadd_ps(fi, _mm256_mul_ps(d, dx), acc[c]);
            acc[c] = _mm256_fmadd_ps(m, sx, acc[c]);
        }
    }
}

/* C columns over rows [r0, r0 + nr), half group by half group; a half past nr is
 * skipped, a partial one stored through a buffer. */
QP2_INLINE void qp2_pass(const int q5, const int C, int64_t nb, const uint8_t *wp, int r0, int nr,
                         const uint8_t *x, size_t xs, float *out, size_t os) {
    for (int r = 0; r < nr; r += 8) {
        const uint8_t *g = wp + (size_t)((r0 + r) / QP_ROWS) * nb * (q5 ? QP_Q51_GBLK : Q41_GBLK);
        __m256 acc[QP2_MAXC];
        q41_half(q5, C, nb, g, (r / 8) % 2, x, xs, acc);
        int left = nr - r < 8 ? nr - r : 8;
        QP2_UNROLL for (int c = 0; c < C; c++) {
            if (left == 8) {
                _mm256_storeu_ps(out + c * os + r, acc[c]);
            } else {
                float o[8];
                _mm256_storeu_ps(o, acc[c]);
                memcpy(out + c * os + r, o, (size_t)left * sizeof(float));
            }
        }
    }
}

QP2_INLINE void q451_tile(const int q5, int64_t n, const void *wp, int r0, int nr, const void *xq,
                          size_t xs, int nc, float *out, size_t os) {
    const int64_t nb = n / QK4;
    const uint8_t *W = wp, *X = xq;
    int c = 0;
    for (; c + QP2_MAXC <= nc; c += QP2_MAXC)
        qp2_pass(q5, QP2_MAXC, nb, W, r0, nr, X + c * xs, xs, out + c * os, os);
    X += c * xs, out += c * os;
    switch (nc - c) {
    case 3: qp2_pass(q5, 3, nb, W, r0, nr, X, xs, out, os); break;
    case 2: qp2_pass(q5, 2, nb, W, r0, nr, X, xs, out, os); break;
    case 1: qp2_pass(q5, 1, nb, W, r0, nr, X, xs, out, os); break;
    }
}

void qp_q41_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                      int nc, float *out, size_t os) {
    q451_tile(0, n, wp, r0, nr, xq, xs, nc, out, os);
}

void qp_q51_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                      int nc, float *out, size_t os) {
    q451_tile(1, n, wp, r0, nr, xq, xs, nc, out, os);
}

/* ---------------------------------------------------------------- Q4_0 */

/* Rows 8rh..8rh+7 of one Q4_0 (Q5_0: q5) group x C columns: Q4_1's (Q5_1's) sums,
 * less the table's 8 (16) * (block sum), times d_w * d_x. */
QP2_INLINE void q40_half(const int q5, const int C, int64_t nb, const uint8_t *g, int rh, const uint8_t *x,
                         size_t xs, const qp_xtab *t, __m256 acc[QP2_MAXC]) {
    const size_t gbb = q5 ? QP_Q50_GBLK : QP_Q40_GBLK, qat = q5 ? 192 : 64;
    QP2_UNROLL for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = g + b * gbb;
        qp_prefetch(gb, gbb);
        for (int h = 0; h < 2; h++) {
            __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 32 * h + 16 * rh)));
            __m256i w[8], h5 = q5 ? _mm256_loadu_si256((const __m256i *)(gb + 64 + 64 * h + 32 * rh))
                                  : _mm256_setzero_si256();
            QP2_UNROLL for (int k = 0; k < 4; k++)
                qp2_nibbles(_mm256_loadu_si256((const __m256i *)(gb + qat + 256 * h + 64 * k + 32 * rh)), q5, h5, k,
                            w + 2 * k);
            const int64_t bb = 2 * b + h;
            QP2_UNROLL for (int c = 0; c < C; c++) {
                const uint8_t *q = x + c * xs + bb * sizeof(blk_q8_0) + 2;
                __m256i i = _mm256_sub_epi32(qp2_sum32(w, q, q5), _mm256_set1_epi32(t->corr[c][bb]));
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(d, _mm256_set1_ps(t->dx[c][bb])),
                                         acc[c]);
            }
        }
    }
}

/* ---------------------------------------------------------------- Q8_0 */

/* Q8_0's bytes are stored + 128 (qpack.h, for vpdpbusd), and two products of 255 and
 * 127 overflow vpmaddubsw's 16-bit pair sum: each byte goes in as its two nibbles,
 * whose products sum exactly in 16 bits over a block (8 chunks x 2 x 15 x 128 = 30,720
 * each), then 16 * high + low in int32, less the table's 128 * (block sum), times
 * d_w * d_x (qpack_avx512.c's q80_group). Chunk by chunk against every column: the 16
 * nibble vectors of a block would not fit the registers beside the sums. Rows
 * 8rh..8rh+7 of one group x C columns. */
QP2_INLINE void q80_half(const int C, int64_t nb, const uint8_t *g, int rh, const uint8_t *x, size_t xs,
                         const qp_xtab *t, __m256 acc[QP2_MAXC]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), sixteen = _mm256_set1_epi16(16);
    QP2_UNROLL for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = g + b * QP_Q80_GBLK;
        qp_prefetch(gb, QP_Q80_GBLK);
        __m256i sl[QP2_MAXC], sh[QP2_MAXC];
        QP2_UNROLL for (int c = 0; c < C; c++) sl[c] = sh[c] = _mm256_setzero_si256();
        QP2_UNROLL for (int k = 0; k < 8; k++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(gb + 64 + 64 * k + 32 * rh));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            QP2_UNROLL for (int c = 0; c < C; c++) {
                __m256i bx = qp2_bcast(x + c * xs + b * sizeof(blk_q8_0) + 2 + 4 * k);
                sl[c] = _mm256_add_epi16(sl[c], _mm256_maddubs_epi16(lo, bx));
                sh[c] = _mm256_add_epi16(sh[c], _mm256_maddubs_epi16(hi, bx));
            }
        }
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 16 * rh)));
        QP2_UNROLL for (int c = 0; c < C; c++) {
            __m256i i = _mm256_add_epi32(_mm256_madd_epi16(sl[c], ones), _mm256_madd_epi16(sh[c], sixteen));
            i = _mm256_sub_epi32(i, _mm256_set1_epi32(t->corr[c][b]));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(d, _mm256_set1_ps(t->dx[c][b])), acc[c]);
        }
    }
}

/* The 32-element types with a bias: kind 0 Q4_0, 1 Q5_0 (two GGUF blocks a group-block),
 * 2 Q8_0 (one). */
QP2_INLINE void q40_pass(const int kind, const int C, int64_t n, const uint8_t *wp, int r0, int nr,
                         const uint8_t *x, size_t xs, float *out, size_t os, qp_xtab *t) {
    const int64_t nb = kind == 2 ? n / QK4 : n / (2 * QK4);
    const size_t gbb = kind == 2 ? QP_Q80_GBLK : kind ? QP_Q50_GBLK : QP_Q40_GBLK;
    qp_xtab_fill(t, kind == 2 ? 128 : kind ? 16 : 8, C, n / QK4, x, xs);
    for (int r = 0; r < nr; r += 8) {
        const uint8_t *g = wp + (size_t)((r0 + r) / QP_ROWS) * nb * gbb;
        __m256 acc[QP2_MAXC];
        if (kind == 2) q80_half(C, nb, g, (r / 8) % 2, x, xs, t, acc);
        else q40_half(kind, C, nb, g, (r / 8) % 2, x, xs, t, acc);
        int left = nr - r < 8 ? nr - r : 8;
        QP2_UNROLL for (int c = 0; c < C; c++) {
            float o[8];
            _mm256_storeu_ps(o, acc[c]);
            memcpy(out + c * os + r, o, (size_t)left * sizeof(float));
        }
    }
}

QP2_INLINE void q450_tile(const int kind, int64_t n, const void *wp, int r0, int nr, const void *xq,
                          size_t xs, int nc, float *out, size_t os) {
    qp_xtab t; /* 32 KB: compute threads have 4 MiB stacks (threads.c) */
    const uint8_t *X = xq;
    int c = 0;
    for (; c + QP2_MAXC <= nc; c += QP2_MAXC)
        q40_pass(kind, QP2_MAXC, n, wp, r0, nr, X + c * xs, xs, out + c * os, os, &t);
    X += c * xs, out += c * os;
    switch (nc - c) {
    case 3: q40_pass(kind, 3, n, wp, r0, nr, X, xs, out, os, &t); break;
    case 2: q40_pass(kind, 2, n, wp, r0, nr, X, xs, out, os, &t); break;
    case 1: q40_pass(kind, 1, n, wp, r0, nr, X, xs, out, os, &t); break;
    }
}

void qp_q40_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                      int nc, float *out, size_t os) {
    q450_tile(0, n, wp, r0, nr, xq, xs, nc, out, os);
}

void qp_q50_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                      int nc, float *out, size_t os) {
    q450_tile(1, n, wp, r0, nr, xq, xs, nc, out, os);
}

void qp_q80_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                      int nc, float *out, size_t os) {
    q450_tile(2, n, wp, r0, nr, xq, xs, nc, out, os);
}

/* ---------------------------------------------------------------- K-quants */

/* A sub-block at a time: its chunks' weights in 8 registers against every column of
 * the pass, the per-column int32 sums on the stack. vpmaddubsw's 16-bit pair sums
 * stay exact when 4 chunks add up in 16 bits (at most 8 * 31 * 128 = 31,744 per lane for
 * Q5_K, 4 * 63 * 128 = 32,256 for a Q6_K pair of 2); vpmaddwd then widens. */
#define QK2_MAXC 16

QP2_INLINE __m256i qk2_sum4(const __m256i w[4], const uint8_t *q) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a = _mm256_add_epi16(_mm256_maddubs_epi16(w[0], qp2_bcast(q)), _mm256_maddubs_epi16(w[1], qp2_bcast(q + 4)));
    __m256i b = _mm256_add_epi16(_mm256_maddubs_epi16(w[2], qp2_bcast(q + 8)), _mm256_maddubs_epi16(w[3], qp2_bcast(q + 12)));
    return _mm256_add_epi32(_mm256_madd_epi16(a, ones), _mm256_madd_epi16(b, ones));
}

QP2_INLINE __m256i qk2_sum8(const __m256i w[8], const uint8_t *q) {
    return _mm256_add_epi32(qk2_sum4(w, q), qk2_sum4(w + 4, q + 16));
}

/* Bit `bit` of each byte moved to bit 4 (qpack_avx512.c's q5_bit4). */
QP2_INLINE __m256i q5_bit4_2(__m256i v, const int bit) {
    v = bit < 4 ? _mm256_slli_epi16(v, 4 - bit) : bit > 4 ? _mm256_srli_epi16(v, bit - 4) : v;
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* Rows 8h..8h+7 of one Q4_K (or Q5_K: q5) group x C columns over all nb super-blocks. */
QP2_INLINE void q45k_half(const int q5, int C, int64_t nb, const uint8_t *g, int h, const uint8_t *x,
                          size_t xs, __m256 acc[QK2_MAXC]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const size_t gbb = q5 ? QP_Q5K_GBLK : QP_Q4K_GBLK;
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = g + b * gbb;
        __m256i sq[QK2_MAXC];
        for (int c = 0; c < C; c++) sq[c] = _mm256_setzero_si256();
        QP2_UNROLL for (int j = 0; j < 8; j++) {
            qp_prefetch_part(gb, gbb, j, 8);
            __m256i w[8];
            QP2_UNROLL for (int k = 0; k < 8; k++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(gb + QP_Q4K_Q + 64 * (8 * (j / 2) + k) + 32 * h));
                w[k] = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(v, 4) : v, m4);
                if (q5)
                    w[k] = _mm256_or_si256(w[k], q5_bit4_2(_mm256_loadu_si256((const __m256i *)(
                                                               gb + QP_Q5K_QH + 64 * k + 32 * h)), j));
            }
            __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(gb + QP_Q4K_SC + 16 * j + 8 * h)));
            for (int c = 0; c < C; c++) {
                const uint8_t *q = x + c * xs + b * sizeof(blk_q8_k) + 4 + 32 * j;
                sq[c] = _mm256_add_epi32(sq[c], _mm256_mullo_epi32(qk2_sum8(w, q), sc));
            }
        }
        __m256i mn[4];
        QP2_UNROLL for (int p = 0; p < 4; p++)
            mn[p] = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(gb + QP_Q4K_MN + 32 * p + 16 * h)));
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 16 * h)));
        __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 32 + 16 * h)));
        for (int c = 0; c < C; c++) {
            const blk_q8_k *xb = (const blk_q8_k *)(x + c * xs + b * sizeof(blk_q8_k));
            __m256i sm = _mm256_setzero_si256();
            QP2_UNROLL for (int p = 0; p < 4; p++) {
                const int16_t *bs = xb->bsums + 4 * p;
                uint32_t pair = (uint16_t)(bs[0] + bs[1]) | (uint32_t)(uint16_t)(bs[2] + bs[3]) << 16;
                sm = _mm256_add_epi32(sm, _mm256_madd_epi16(mn[p], _mm256_set1_epi32((int)pair)));
            }
            __m256 dx = _mm256_set1_ps(xb->d);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sq[c]), _mm256_mul_ps(d, dx), acc[c]);
            acc[c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(sm), _mm256_mul_ps(dm, dx), acc[c]);
        }
    }
}

/* Rows 8h..8h+7 of one Q6_K group x C columns. Sub-blocks s, s+4, s+8, s+12 (qs = 0..3
 * of their chunks 4s..4s+3, qpack.h) share those chunks' qh bytes, and s, s+8 (s+4,
 * s+12) their ql bytes, low and high nibbles: each pass builds two sub-blocks from one
 * set of loads. The -32 bias, -32 sum_j sc_j bsums_j, starts each column's sum: a
 * vpmaddwd per pair of sub-blocks (qpack_avx512.c's q6k_bias), the same integer. */
QP2_INLINE void q6k_half(int C, int64_t nb, const uint8_t *g, int h, const uint8_t *x, size_t xs,
                         __m256 acc[QK2_MAXC]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const __m256i lo16 = _mm256_set1_epi32(0xFFFF);
    for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = g + b * QP_Q6K_GBLK;
        __m256i sq[QK2_MAXC], scp[8];
        QP2_UNROLL for (int k = 0; k < 8; k++) { /* dword r: sc[2k][r] | sc[2k + 1][r] << 16 */
            const uint8_t *sc = gb + QP_Q6K_SC + 32 * k + 8 * h;
            scp[k] = _mm256_or_si256(_mm256_and_si256(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)sc)), lo16),
                                     _mm256_slli_epi32(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 16))), 16));
        }
        for (int c = 0; c < C; c++) {
            const uint8_t *bs = (const uint8_t *)((const blk_q8_k *)(x + c * xs + b * sizeof(blk_q8_k)))->bsums;
            __m256i m = _mm256_setzero_si256();
            QP2_UNROLL for (int k = 0; k < 8; k++) m = _mm256_add_epi32(m, _mm256_madd_epi16(scp[k], qp2_bcast(bs + 4 * k)));
            sq[c] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(m, 5));
        }
        QP2_UNROLL for (int s = 0; s < 4; s++)
            QP2_UNROLL for (int pr = 0; pr < 2; pr++) { /* sub-blocks s + 4pr (qs = pr) and s + 4pr + 8 */
                qp_prefetch_part(gb, QP_Q6K_GBLK, 2 * s + pr, 8);
                __m256i w[8];
                QP2_UNROLL for (int t = 0; t < 4; t++) {
                    int ch = 4 * s + t;
                    __m256i v = _mm256_loadu_si256((const __m256i *)(gb + QP_Q6K_QL + 64 * (ch + 16 * pr) + 32 * h));
                    __m256i hb = _mm256_loadu_si256((const __m256i *)(gb + QP_Q6K_QH + 64 * ch + 32 * h));
                    w[t] = _mm256_or_si256(_mm256_and_si256(v, m4),
                                           _mm256_and_si256(pr ? _mm256_slli_epi16(hb, 2) : _mm256_slli_epi16(hb, 4), m30));
                    w[4 + t] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                                               _mm256_and_si256(pr ? _mm256_srli_epi16(hb, 2) : hb, m30));
                }
                const int j0 = s + 4 * pr, j1 = j0 + 8;
                __m256i sc0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(gb + QP_Q6K_SC + 16 * j0 + 8 * h)));
                __m256i sc1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(gb + QP_Q6K_SC + 16 * j1 + 8 * h)));
                for (int c = 0; c < C; c++) {
                    const uint8_t *q = (const uint8_t *)((const blk_q8_k *)(x + c * xs + b * sizeof(blk_q8_k)))->qs;
                    __m256i v0 = _mm256_mullo_epi32(qk2_sum4(w, q + 16 * j0), sc0);
                    __m256i v1 = _mm256_mullo_epi32(qk2_sum4(w + 4, q + 16 * j1), sc1);
                    sq[c] = _mm256_add_epi32(sq[c], _mm256_add_epi32(v0, v1));
                }
            }
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 16 * h)));
        for (int c = 0; c < C; c++) {
            __m256 dx = _mm256_set1_ps(((const blk_q8_k *)(x + c * xs + b * sizeof(blk_q8_k)))->d);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sq[c]), _mm256_mul_ps(d, dx), acc[c]);
        }
    }
}

QP2_INLINE void qk2_tile(const int q5, const int q6, int64_t n, const void *wp, int r0, int nr, const void *xq,
                         size_t xs, int nc, float *out, size_t os) {
    const int64_t nb = n / QKK;
    const size_t gblk = q6 ? QP_Q6K_GBLK : q5 ? QP_Q5K_GBLK : QP_Q4K_GBLK;
    const uint8_t *W = wp, *X = xq;
    for (int r = 0; r < nr; r += 8) {
        const uint8_t *g = W + (size_t)((r0 + r) / QP_ROWS) * nb * gblk;
        int h = (r / 8) % 2, left = nr - r < 8 ? nr - r : 8;
        for (int c0 = 0; c0 < nc; c0 += QK2_MAXC) {
            int C = nc - c0 < QK2_MAXC ? nc - c0 : QK2_MAXC;
            __m256 acc[QK2_MAXC];
            /* one column (decode) as a constant: its sums stay in registers, not on the
             * stack (a store-to-load chain per sub-block held Q6_K to a third) */
            if (q6 && C == 1) q6k_half(1, nb, g, h, X + c0 * xs, xs, acc);
            else if (q6) q6k_half(C, nb, g, h, X + c0 * xs, xs, acc);
            else if (C == 1) q45k_half(q5, 1, nb, g, h, X + c0 * xs, xs, acc);
            else q45k_half(q5, C, nb, g, h, X + c0 * xs, xs, acc);
            for (int c = 0; c < C; c++) {
                float o[8];
                _mm256_storeu_ps(o, acc[c]);
                memcpy(out + (c0 + c) * os + r, o, (size_t)left * sizeof(float));
            }
        }
    }
}

void qp_q4k_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                      int nc, float *out, size_t os) {
    qk2_tile(0, 0, n, wp, r0, nr, xq, xs, nc, out, os);
}

void qp_q5k_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                      int nc, float *out, size_t os) {
    qk2_tile(1, 0, n, wp, r0, nr, xq, xs, nc, out, os);
}

void qp_q6k_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                      int nc, float *out, size_t os) {
    qk2_tile(0, 1, n, wp, r0, nr, xq, xs, nc, out, os);
}

/* ---------------------------------------------------------------- F16, BF16 */

/* A 256-bit vector is two rows' 128-bit lanes (qpack.h): after F16's conversion, rows 2i
 * and 2i+1's elements 4q..4q+3; for BF16, their pairs 4q..4q+3 (odd elements in the
 * dwords' high halves). A lane's four floats are the row's four partial sums, and one
 * column's activations of the chunk, a 16-byte broadcast, serve every pair of rows: a
 * pass of RP row pairs x C columns takes RP weight loads and C broadcasts per RP x C
 * FMAs (with rows in lanes, one weight load and C broadcasts per C FMAs: F16 ran
 * load-bound at 65% of the FMAs' rate).
 * Columns per pass, F16: 3 row pairs x 4 columns = 12 accumulators, 3 weight vectors
 * and a broadcast, of 16 registers (4 pairs spill). BF16: 4 row pairs x 2 columns,
 * their odd and even activations (4 registers) kept: 3 x 3 spilled (kbench 30 against
 * 44 GMAC/s), and with the activations as FMA memory operands the loads were as many as
 * the FMAs (33). */
#define QH2_MAXC 4
#define QH2_BF_MAXC 2

/* Rows 2i and 2i+1's dots from their accumulator: (s0 + s1) + (s2 + s3) of each lane
 * (the lane's third float gets (s2 + s3) + (s0 + s1), the same bits). */
QP2_INLINE void h16_dots2(__m256 s, float *o) {
    __m256 t = _mm256_add_ps(s, _mm256_permute_ps(s, 0xB1));
    __m256 u = _mm256_add_ps(t, _mm256_permute_ps(t, 0x4E));
    o[0] = _mm256_cvtss_f32(u);
    o[1] = _mm256_cvtss_f32(_mm256_permute2f128_ps(u, u, 1));
}

/* RP row pairs of a group (g at the first's bytes in a group-block) x C columns, over
 * all nb blocks; the first `left` of the 2 * RP rows stored. pf: the pass asks for the
 * group's next blocks ahead (its first pass only: the others' prefetches found the lines
 * on their way, and cost the F16 task 8% in kbench, 49 against 53 GMAC/s; end to end,
 * 1B F16 prefill at AVX2, five pairs: within the VM's spread). */
QP2_INLINE void h16_pass2(const int bf, const int C, const int RP, int64_t nb, const uint8_t *g,
                          const uint8_t *x, size_t xs, float *out, size_t os, int left, const int pf) {
    __m256 s[QH2_MAXC][8];
    QP2_UNROLL for (int c = 0; c < C; c++)
        QP2_UNROLL for (int i = 0; i < RP; i++) s[c][i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = g + b * QP_H16_GBLK;
        if (!bf) {
            QP2_UNROLL for (int q = 0; q < 8; q++) {
                if (pf && q % 2 == 0) qp_prefetch_part_at(gb, QP_H16_GBLK, q / 2, 4, QP_PF_H16);
                __m256 w[8];
                QP2_UNROLL for (int i = 0; i < RP; i++)
                    w[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 8 * QP_ROWS * q + 16 * i)));
                QP2_UNROLL for (int c = 0; c < C; c++) {
                    const float *xc = (const float *)(x + c * xs) + b * QP_H16_BLOCK + 4 * q;
                    __m256 xv = _mm256_broadcast_ps((const __m128 *)xc);
                    QP2_UNROLL for (int i = 0; i < RP; i++) s[c][i] = _mm256_fmadd_ps(w[i], xv, s[c][i]);
                }
            }
            continue;
        }
        const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
        QP2_UNROLL for (int q = 0; q < 4; q++) {
            if (pf) qp_prefetch_part_at(gb, QP_H16_GBLK, q, 4, QP_PF_H16);
            __m256 xo[QH2_MAXC], xe[QH2_MAXC]; /* the column's odd, even elements of the chunk */
            QP2_UNROLL for (int c = 0; c < C; c++) {
                const uint8_t *xc = x + c * xs + b * 2 * QP_H16_BLOCK + 16 * q;
                __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)xc));
                xo[c] = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
                xe[c] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
            }
            QP2_UNROLL for (int i = 0; i < RP; i++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(gb + 16 * QP_ROWS * q + 32 * i));
                __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
                __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
                QP2_UNROLL for (int c = 0; c < C; c++) {
                    s[c][i] = _mm256_fmadd_ps(wo, xo[c], s[c][i]);
                    s[c][i] = _mm256_fmadd_ps(we, xe[c], s[c][i]);
                }
            }
        }
    }
    QP2_UNROLL for (int c = 0; c < C; c++) {
        float o[16];
        QP2_UNROLL for (int i = 0; i < RP; i++) h16_dots2(s[c][i], o + 2 * i);
        memcpy(out + c * os, o, (size_t)(left < 2 * RP ? left : 2 * RP) * sizeof(float));
    }
}

/* One group's `left` rows (g its first group-block) x C columns: its 8 row pairs in
 * passes of 8 (one column: 8 chains hide the FMA's latency), 4 (two columns), else
 * 3, 3, 2. */
QP2_INLINE void h16_group2(const int bf, const int C, int64_t nb, const uint8_t *g, const uint8_t *x,
                           size_t xs, float *out, size_t os, int left) {
    const size_t pair = bf ? 32 : 16; /* a row pair's bytes in a chunk */
    if (C == 1) {
        h16_pass2(bf, 1, 8, nb, g, x, xs, out, os, left, 1);
    } else if (C == 2) {
        h16_pass2(bf, 2, 4, nb, g, x, xs, out, os, left, 1);
        if (left > 8) h16_pass2(bf, 2, 4, nb, g + 4 * pair, x, xs, out + 8, os, left - 8, 0);
    } else {
        h16_pass2(bf, C, 3, nb, g, x, xs, out, os, left, 1);
        if (left > 6) h16_pass2(bf, C, 3, nb, g + 3 * pair, x, xs, out + 6, os, left - 6, 0);
        if (left > 12) h16_pass2(bf, C, 2, nb, g + 6 * pair, x, xs, out + 12, os, left - 12, 0);
    }
}

QP2_INLINE void h16_cols2(const int bf, const int C, int64_t nb, const uint8_t *wp, int r0, int nr,
                          const uint8_t *x, size_t xs, float *out, size_t os) {
    for (int r = 0; r < nr; r += QP_ROWS) {
        const uint8_t *g = wp + (size_t)((r0 + r) / QP_ROWS) * nb * QP_H16_GBLK;
        h16_group2(bf, C, nb, g, x, xs, out + r, os, nr - r);
    }
}

QP2_INLINE void h16_tile2(const int bf, int64_t n, const void *wp, int r0, int nr, const void *xq,
                          size_t xs, int nc, float *out, size_t os) {
    const int64_t nb = n / QP_H16_BLOCK;
    const uint8_t *X = xq;
    int c = 0;
    if (bf)
        for (; c + QH2_BF_MAXC <= nc; c += QH2_BF_MAXC)
            h16_cols2(1, QH2_BF_MAXC, nb, wp, r0, nr, X + c * xs, xs, out + c * os, os);
    else
        for (; c + QH2_MAXC <= nc; c += QH2_MAXC)
            h16_cols2(0, QH2_MAXC, nb, wp, r0, nr, X + c * xs, xs, out + c * os, os);
    X += c * xs, out += c * os;
    if (nc - c == 3 && !bf) h16_cols2(0, 3, nb, wp, r0, nr, X, xs, out, os);
    else if (nc - c == 2) h16_cols2(bf, 2, nb, wp, r0, nr, X, xs, out, os);
    else if (nc - c == 1) h16_cols2(bf, 1, nb, wp, r0, nr, X, xs, out, os);
}

void qp_f16_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                      int nc, float *out, size_t os) {
    h16_tile2(0, n, wp, r0, nr, xq, xs, nc, out, os);
}

void qp_bf16_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                       int nc, float *out, size_t os) {
    h16_tile2(1, n, wp, r0, nr, xq, xs, nc, out, os);
}
