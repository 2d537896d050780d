/* qpack_avx512: the packed Q4_1/Q5_1 x Q8_1, Q8_0/Q4_0/Q5_0 x Q8_0, Q4_K x Q8_K and Q6_K x Q8_K tiles
 * (and Q5_K) with AVX-512 VNNI, F16 x F32 and BF16 x BF16 (FMAs, or vdpbf16ps) (layouts
 * and arithmetic in qpack.h). For the integer types lane r of every vector is row r of
 * the group (F16's and BF16's vectors are four rows' 128-bit lanes, below): a chunk's
 * 64 bytes hold 4 bytes of each of the 16 rows, so a chunk times the column's 4
 * activation bytes of it, broadcast, is one vpdpbusd for all 16 rows (for Q4_1 its low
 * nibbles one, its high nibbles another). Eight of them sum a block exactly (int32, in
 * two chains for latency), then one conversion and one or two FMAs per 16 rows finish
 * the block, in qpack.h's order. */
#include <immintrin.h>
#include <string.h>

#include "core/cpu/isa.h"
#include "core/cpu/qpack.h"
#include "core/cpu/qpack_x86.h"
#include "core/cpu/quant_kern.h"

#define QP_INLINE static inline __attribute__((always_inline))
#define Q41_GBLK QP_Q41_GBLK
#define Q80_GBLK QP_Q80_GBLK
#define QP_MAXC 8 /* columns per pass: 8 weight vectors + 8 accumulators stay in registers */
_Static_assert(QP_MAXC <= QP_XTAB_C, "a pass's columns fit the activation table");
/* C and the chunk count are constants at each call: unrolled, the weight vectors and
 * accumulators live in registers (-O2 would keep them in memory) */
#define QP_UNROLL _Pragma("GCC unroll 8")

/* The 4 activation bytes at p, in every dword lane. */
QP_INLINE __m512i qp_bcast(const uint8_t *p) {
    int v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* ---------------------------------------------------------------- Q4_1 */

/* One group of 16 rows x C columns over all nb blocks of Q4_1, or Q5_1 (q5); acc lane
 * r is row r. */
QP_INLINE void q41_group(const int q5, const int C, int64_t nb, const uint8_t *g, const uint8_t *x,
                         size_t xs, __m512 acc[QP_MAXC]) {
    const __m512i one = _mm512_set1_epi32(1);
    const size_t gbb = q5 ? QP_Q51_GBLK : Q41_GBLK, qat = q5 ? 128 : 64;
    QP_UNROLL for (int c = 0; c < C; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = g + b * gbb;
        qp_prefetch(gb, gbb);
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
        __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gb + 32)));
        __m512i w[8], h5 = q5 ? _mm512_loadu_si512((const void *)(gb + 64)) : _mm512_setzero_si512();
        QP_UNROLL for (int k = 0; k < 4; k++)
            qp_nibbles(_mm512_loadu_si512((const void *)(gb + qat + 64 * k)), q5, h5, k, w + 2 * k);
        QP_UNROLL for (int c = 0; c < C; c++) {
            const uint8_t *xb = x + c * xs + b * sizeof(blk_q8_1);
            const uint8_t *q = xb + 4; /* the 32 activation bytes */
            __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
            QP_UNROLL for (int k = 0; k < 4; k++) {
                lo = _mm512_dpbusd_epi32(lo, w[2 * k], qp_bcast(q + 4 * k));
                hi = _mm512_dpbusd_epi32(hi, w[2 * k + 1], qp_bcast(q + 16 + 4 * k));
            }
            __m512 fi = _mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi));
            /* [d_x, s_x] of the block; vcvtph2ps reads 4 halves, the last 2 are qs */
            __m512 ds = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)xb)));
            __m512 dx = _mm512_permutexvar_ps(_mm512_setzero_si512(), ds);
            __m512 sx = _mm512_permutexvar_ps(one, ds);
            acc[c] = _mm512_fmadd_ps(fi, _mm512_mul_ps(d, dx), acc[c]);
            acc[c] = _mm512_fmadd_ps(m, sx, acc[c]);
        }
    }
}

/* ---------------------------------------------------------------- Q8_0 */


QP_INLINE void q80_group(const int C, int64_t nb, const uint8_t *g, const uint8_t *x,
                         size_t xs, const qp_xtab *t, __m512 acc[QP_MAXC]) {
    QP_UNROLL for (int c = 0; c < C; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = g + b * Q80_GBLK;
        qp_prefetch(gb, Q80_GBLK);
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
        __m512i w[8];
        QP_UNROLL for (int k = 0; k < 8; k++) w[k] = _mm512_loadu_si512((const void *)(gb + 64 * (1 + k)));
        QP_UNROLL for (int c = 0; c < C; c++) {
            const uint8_t *q = x + c * xs + b * sizeof(blk_q8_0) + 2;
            __m512i s0 = _mm512_set1_epi32(-t->corr[c][b]), s1 = _mm512_setzero_si512(); /* the bias in s0 */
            QP_UNROLL for (int k = 0; k < 8; k += 2) {
                s0 = _mm512_dpbusd_epi32(s0, w[k], qp_bcast(q + 4 * k));
                s1 = _mm512_dpbusd_epi32(s1, w[k + 1], qp_bcast(q + 4 * k + 4));
            }
            __m512i i = _mm512_add_epi32(s0, s1);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(d, _mm512_set1_ps(t->dx[c][b])),
                                     acc[c]);
        }
    }
}

/* ---------------------------------------------------------------- Q4_0 */

/* A group-block is two GGUF blocks (qpack.h): per half, the (5-bit for Q5_0: q5)
 * values times the column's Q8_0 bytes, less 8 (16) * (the block's sum of them),
 * exactly as Q8_0's bias. */
QP_INLINE void q40_group(const int q5, const int C, int64_t nb, const uint8_t *g, const uint8_t *x,
                         size_t xs, const qp_xtab *t, __m512 acc[QP_MAXC]) {
    const size_t gbb = q5 ? QP_Q50_GBLK : QP_Q40_GBLK, qat = q5 ? 192 : 64;
    QP_UNROLL for (int c = 0; c < C; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = g + b * gbb;
        qp_prefetch(gb, gbb);
        QP_UNROLL for (int h = 0; h < 2; h++) {
            __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gb + 32 * h)));
            __m512i w[8], h5 = q5 ? _mm512_loadu_si512((const void *)(gb + 64 + 64 * h)) : _mm512_setzero_si512();
            QP_UNROLL for (int k = 0; k < 4; k++)
                qp_nibbles(_mm512_loadu_si512((const void *)(gb + qat + 256 * h + 64 * k)), q5, h5, k, w + 2 * k);
            const int64_t bb = 2 * b + h; /* the GGUF block */
            QP_UNROLL for (int c = 0; c < C; c++) {
                const uint8_t *q = x + c * xs + bb * sizeof(blk_q8_0) + 2;
                __m512i lo = _mm512_set1_epi32(-t->corr[c][bb]), hi = _mm512_setzero_si512(); /* as Q8_0's */
                QP_UNROLL for (int k = 0; k < 4; k++) {
                    lo = _mm512_dpbusd_epi32(lo, w[2 * k], qp_bcast(q + 4 * k));
                    hi = _mm512_dpbusd_epi32(hi, w[2 * k + 1], qp_bcast(q + 16 + 4 * k));
                }
                __m512i i = _mm512_add_epi32(lo, hi);
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(d, _mm512_set1_ps(t->dx[c][bb])),
                                         acc[c]);
            }
        }
    }
}

/* ---------------------------------------------------------------- the 32-element types */

enum { QP_K41, QP_K80, QP_K40, QP_K50, QP_K51 }; /* which 32-element type a pass runs */

/* C columns (a constant at each call) over rows [r0, r0 + nr): group by group, the
 * last one's missing rows masked off the stores. kind: the type (a constant too); nb
 * counts 32-element blocks. */
QP_INLINE void qp_pass(const int kind, const int C, int64_t nb, const uint8_t *wp, int r0, int nr,
                       const uint8_t *x, size_t xs, float *out, size_t os, qp_xtab *t) {
    if (kind == QP_K80 || kind == QP_K40 || kind == QP_K50)
        qp_xtab_fill(t, kind == QP_K80 ? 128 : kind == QP_K40 ? 8 : 16, C, nb, x, xs);
    const size_t group = kind == QP_K80 ? nb * Q80_GBLK : kind == QP_K40 ? nb / 2 * QP_Q40_GBLK
                       : kind == QP_K50 ? nb / 2 * QP_Q50_GBLK : kind == QP_K51 ? nb * QP_Q51_GBLK
                                                                                 : nb * Q41_GBLK;
    for (int r = 0; r < nr; r += QP_ROWS) {
        const uint8_t *g = wp + (size_t)((r0 + r) / QP_ROWS) * group;
        __m512 acc[QP_MAXC];
        if (kind == QP_K80) q80_group(C, nb, g, x, xs, t, acc);
        else if (kind == QP_K40 || kind == QP_K50) q40_group(kind == QP_K50, C, nb / 2, g, x, xs, t, acc);
        else q41_group(kind == QP_K51, C, nb, g, x, xs, acc);
        int left = nr - r;
        __mmask16 keep = left >= QP_ROWS ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        QP_UNROLL for (int c = 0; c < C; c++) _mm512_mask_storeu_ps(out + c * os + r, keep, acc[c]);
    }
}

/* Passes of QP_MAXC columns, then one of the rest: each pass a constant width. */
QP_INLINE void qp_tile_any(const int kind, int64_t n, const void *wp, int r0, int nr,
                           const void *xq, size_t xs, int nc, float *out, size_t os,
                           qp_xtab *t) {
    const int64_t nb = n / QK4;
    const uint8_t *W = wp, *X = xq;
    int c = 0;
    for (; c + QP_MAXC <= nc; c += QP_MAXC)
        qp_pass(kind, QP_MAXC, nb, W, r0, nr, X + c * xs, xs, out + c * os, os, t);
    X += c * xs, out += c * os;
    switch (nc - c) {
    case 7: qp_pass(kind, 7, nb, W, r0, nr, X, xs, out, os, t); break;
    case 6: qp_pass(kind, 6, nb, W, r0, nr, X, xs, out, os, t); break;
    case 5: qp_pass(kind, 5, nb, W, r0, nr, X, xs, out, os, t); break;
    case 4: qp_pass(kind, 4, nb, W, r0, nr, X, xs, out, os, t); break;
    case 3: qp_pass(kind, 3, nb, W, r0, nr, X, xs, out, os, t); break;
    case 2: qp_pass(kind, 2, nb, W, r0, nr, X, xs, out, os, t); break;
    case 1: qp_pass(kind, 1, nb, W, r0, nr, X, xs, out, os, t); break;
    }
}

void qp_q41_tile_avx512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                        int nc, float *out, size_t os) {
    qp_tile_any(QP_K41, n, wp, r0, nr, xq, xs, nc, out, os, NULL);
}

void qp_q80_tile_avx512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                        int nc, float *out, size_t os) {
    qp_xtab t; /* 32 KB: compute threads have 4 MiB stacks (threads.c) */
    qp_tile_any(QP_K80, n, wp, r0, nr, xq, xs, nc, out, os, &t);
}

void qp_q40_tile_avx512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                        int nc, float *out, size_t os) {
    qp_xtab t;
    qp_tile_any(QP_K40, n, wp, r0, nr, xq, xs, nc, out, os, &t);
}

void qp_q50_tile_avx512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                        int nc, float *out, size_t os) {
    qp_xtab t;
    qp_tile_any(QP_K50, n, wp, r0, nr, xq, xs, nc, out, os, &t);
}

void qp_q51_tile_avx512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                        int nc, float *out, size_t os) {
    qp_tile_any(QP_K51, n, wp, r0, nr, xq, xs, nc, out, os, NULL);
}

/* ---------------------------------------------------------------- K-quants */

/* A K-quant group-block is 2-3 KB: its 256 weights of 16 rows go through the
 * registers a sub-block pair (or quad) at a time, against every column of the pass,
 * and the per-column sums wait on the stack. */
#define QK_MAXC 16 /* columns per pass */

/* The Q8_K activation block b of a column: f32 d, then qs[256], then bsums[16]. */
QP_INLINE const uint8_t *qk_x(const uint8_t *x, size_t xs, int c, int64_t b) {
    return x + c * xs + b * sizeof(blk_q8_k);
}

/* Q4_K, and Q5_K (q5) with its 5th bits or-ed in from qh. */
QP_INLINE void q45k_group(const int q5, int C, int64_t nb, const uint8_t *g, const uint8_t *x,
                          size_t xs, __m512 acc[QK_MAXC]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const size_t gbb = q5 ? QP_Q5K_GBLK : QP_Q4K_GBLK;
    for (int c = 0; c < C; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = g + b * gbb;
        __m512i sq[QK_MAXC]; /* set by the first pair: zeroing it costs a memset a block */
        QP_UNROLL for (int p = 0; p < 4; p++) { /* sub-blocks 2p (low nibbles) and 2p+1 (high) */
            qp_prefetch_part(gb, gbb, p, 4);
            __m512i w[16];
            QP_UNROLL for (int k = 0; k < 8; k++) {
                __m512i v = _mm512_loadu_si512((const void *)(gb + QP_Q4K_Q + 64 * (8 * p + k)));
                w[k] = _mm512_and_si512(v, m4);
                w[8 + k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if (q5) {
                    __m512i h = _mm512_loadu_si512((const void *)(gb + QP_Q5K_QH + 64 * k));
                    w[k] = _mm512_or_si512(w[k], q5_bit4(h, 2 * p));
                    w[8 + k] = _mm512_or_si512(w[8 + k], q5_bit4(h, 2 * p + 1));
                }
            }
            __m512i s0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(gb + QP_Q4K_SC + 32 * p)));
            __m512i s1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(gb + QP_Q4K_SC + 32 * p + 16)));
            for (int c = 0; c < C; c++) {
                const uint8_t *q = qk_x(x, xs, c, b) + 4 + 64 * p;
                __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
                QP_UNROLL for (int k = 0; k < 8; k++) {
                    lo = _mm512_dpbusd_epi32(lo, w[k], qp_bcast(q + 4 * k));
                    hi = _mm512_dpbusd_epi32(hi, w[8 + k], qp_bcast(q + 32 + 4 * k));
                }
                __m512i v = _mm512_add_epi32(_mm512_mullo_epi32(lo, s0), _mm512_mullo_epi32(hi, s1));
                sq[c] = p == 0 ? v : _mm512_add_epi32(sq[c], v);
            }
        }
        __m512i mn[4];
        QP_UNROLL for (int p = 0; p < 4; p++)
            mn[p] = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(gb + QP_Q4K_MN + 32 * p)));
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
        __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gb + 32)));
        for (int c = 0; c < C; c++) {
            const blk_q8_k *xb = (const blk_q8_k *)qk_x(x, xs, c, b);
            __m512i sm = qp_kmins(xb->bsums, mn);
            __m512 dx = _mm512_set1_ps(xb->d);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sq[c]), _mm512_mul_ps(d, dx), acc[c]);
            acc[c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(sm), _mm512_mul_ps(dm, dx), acc[c]);
        }
    }
}

/* Q6_K's unsigned u = q + 32: sumq = sum_j sc_j (sub-block j's products u x) - 32 sum_j
 * sc_j bsums_j. The second term (exact in int32, as every partial sum here: the same
 * integer as qpack.h's) starts each column's sum, a vpdpwssd per pair of sub-blocks
 * against the Q8_K block's bsums (adjacent int16, so one broadcast dword a pair). */
QP_INLINE void q6k_bias(int C, const uint8_t *gb, const uint8_t *x, size_t xs, int64_t b, __m512i *sq) {
    const __m512i lo16 = _mm512_set1_epi32(0xFFFF);
    __m512i scp[8];
    QP_UNROLL for (int k = 0; k < 8; k++) { /* dword r: sc[2k][r] | sc[2k + 1][r] << 16 */
        const uint8_t *sc = gb + QP_Q6K_SC + 32 * k;
        scp[k] = _mm512_or_si512(_mm512_and_si512(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)sc)), lo16),
                                 _mm512_slli_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sc + 16))), 16));
    }
    for (int c = 0; c < C; c++) {
        const uint8_t *bs = (const uint8_t *)((const blk_q8_k *)qk_x(x, xs, c, b))->bsums;
        __m512i m = _mm512_setzero_si512();
        QP_UNROLL for (int k = 0; k < 8; k++) m = _mm512_dpwssd_epi32(m, scp[k], qp_bcast(bs + 4 * k));
        sq[c] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(m, 5));
    }
}

QP_INLINE void q6k_group(int C, int64_t nb, const uint8_t *g, const uint8_t *x, size_t xs,
                         __m512 acc[QK_MAXC]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    for (int c = 0; c < C; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = g + b * QP_Q6K_GBLK;
        __m512i sq[QK_MAXC];
        q6k_bias(C, gb, x, xs, b, sq);
        for (int s = 0; s < 4; s++) { /* sub-blocks s, s+4, s+8, s+12: chunks 4s+t+16q */
            __m512i w[16], sc[4];
            QP_UNROLL for (int t = 0; t < 4; t++) {
                int h = 4 * s + t;
                qp_prefetch_part(gb, QP_Q6K_GBLK, h, 16);
                __m512i a = _mm512_loadu_si512((const void *)(gb + QP_Q6K_QL + 64 * h));
                __m512i bq = _mm512_loadu_si512((const void *)(gb + QP_Q6K_QL + 64 * (16 + h)));
                __m512i hb = _mm512_loadu_si512((const void *)(gb + QP_Q6K_QH + 64 * h));
                w[t] = _mm512_or_si512(_mm512_and_si512(a, m4), _mm512_and_si512(_mm512_slli_epi16(hb, 4), m30));
                w[4 + t] = _mm512_or_si512(_mm512_and_si512(bq, m4), _mm512_and_si512(_mm512_slli_epi16(hb, 2), m30));
                w[8 + t] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(a, 4), m4), _mm512_and_si512(hb, m30));
                w[12 + t] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(bq, 4), m4),
                                            _mm512_and_si512(_mm512_srli_epi16(hb, 2), m30));
            }
            QP_UNROLL for (int q = 0; q < 4; q++)
                sc[q] = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(gb + QP_Q6K_SC + 16 * (s + 4 * q))));
            for (int c = 0; c < C; c++) {
                const blk_q8_k *xb = (const blk_q8_k *)qk_x(x, xs, c, b);
                const uint8_t *xq = (const uint8_t *)xb->qs;
                __m512i sum = sq[c];
                QP_UNROLL for (int q = 0; q < 4; q++) {
                    __m512i i = _mm512_setzero_si512();
                    QP_UNROLL for (int t = 0; t < 4; t++)
                        i = _mm512_dpbusd_epi32(i, w[4 * q + t], qp_bcast(xq + 4 * (4 * s + t + 16 * q)));
                    sum = _mm512_add_epi32(sum, _mm512_mullo_epi32(i, sc[q]));
                }
                sq[c] = sum;
            }
        }
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
        for (int c = 0; c < C; c++) {
            __m512 dx = _mm512_set1_ps(((const blk_q8_k *)qk_x(x, xs, c, b))->d);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sq[c]), _mm512_mul_ps(d, dx), acc[c]);
        }
    }
}

/* Rows [r0, r0 + nr) x nc columns, group by group and pass by pass of QK_MAXC
 * columns (a pass re-reads its group's few KB from cache, not memory). */
QP_INLINE void qk_tile(const int q5, const int q6, int64_t n, const void *wp, int r0, int nr, const void *xq,
                       size_t xs, int nc, float *out, size_t os) {
    const int64_t nb = n / QKK;
    const size_t gblk = q6 ? QP_Q6K_GBLK : q5 ? QP_Q5K_GBLK : QP_Q4K_GBLK;
    const uint8_t *W = wp, *X = xq;
    for (int r = 0; r < nr; r += QP_ROWS) {
        const uint8_t *g = W + (size_t)((r0 + r) / QP_ROWS) * nb * gblk;
        int left = nr - r;
        __mmask16 keep = left >= QP_ROWS ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        for (int c0 = 0; c0 < nc; c0 += QK_MAXC) {
            int C = nc - c0 < QK_MAXC ? nc - c0 : QK_MAXC;
            __m512 acc[QK_MAXC];
            if (q6) q6k_group(C, nb, g, X + c0 * xs, xs, acc);
            else q45k_group(q5, C, nb, g, X + c0 * xs, xs, acc);
            for (int c = 0; c < C; c++) _mm512_mask_storeu_ps(out + (c0 + c) * os + r, keep, acc[c]);
        }
    }
}

void qp_q4k_tile_avx512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                        int nc, float *out, size_t os) {
    qk_tile(0, 0, n, wp, r0, nr, xq, xs, nc, out, os);
}

void qp_q5k_tile_avx512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                        int nc, float *out, size_t os) {
    qk_tile(1, 0, n, wp, r0, nr, xq, xs, nc, out, os);
}

void qp_q6k_tile_avx512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                        int nc, float *out, size_t os) {
    qk_tile(0, 1, n, wp, r0, nr, xq, xs, nc, out, os);
}

/* ---------------------------------------------------------------- F16 */

/* A 512-bit vector is four rows' 128-bit lanes (qpack.h): after F16's conversion, rows
 * 4i..4i+3's elements 4q..4q+3; for BF16, their pairs 4q..4q+3. A lane's four floats
 * are the row's four partial sums, and one column's activations of the chunk, a 16-byte
 * broadcast, serve the group's four vectors: per chunk and C columns, 4 weight loads
 * and C broadcasts for 4 x C FMAs. */
#define QH_MAXC 6 /* columns per pass: 6 x 4 accumulators, 4 weight vectors, a broadcast */
#define QH_FMA_MAXC 4 /* BF16's FMA kernel: 4 x 4 accumulators, 8 activation vectors (below) */

/* Every float of a lane: the lane's (s0 + s1) + (s2 + s3) (its third and fourth get
 * (s2 + s3) + (s0 + s1), the same bits). */
QP_INLINE __m512 h16_lane_dots(__m512 s) {
    __m512 t = _mm512_add_ps(s, _mm512_permute_ps(s, 0xB1));
    return _mm512_add_ps(t, _mm512_permute_ps(t, 0x4E));
}

/* The 16 rows' dots of C columns (column c's four vectors s[c]), the first `left` rows
 * stored. */
QP_INLINE void h16_store(const int C, __m512 s[][4], int left, float *out, size_t os) {
    __mmask16 keep = left >= QP_ROWS ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
    const __m512i first = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0);
    QP_UNROLL for (int c = 0; c < C; c++) {
        __m512 lo = _mm512_permutex2var_ps(h16_lane_dots(s[c][0]), first, h16_lane_dots(s[c][1]));
        __m512 hi = _mm512_permutex2var_ps(h16_lane_dots(s[c][2]), first, h16_lane_dots(s[c][3]));
        _mm512_mask_storeu_ps(out + c * os, keep, _mm512_shuffle_f32x4(lo, hi, _MM_SHUFFLE(1, 0, 1, 0)));
    }
}

/* F16 against f32 activations: per chunk of 4 elements, 4 conversions for the group. */
QP_INLINE void h16_pass(const int C, int64_t nb, const uint8_t *wp, int r0, int nr, const uint8_t *x,
                        size_t xs, float *out, size_t os) {
    for (int r = 0; r < nr; r += QP_ROWS) {
        const uint8_t *g = wp + (size_t)((r0 + r) / QP_ROWS) * nb * QP_H16_GBLK;
        __m512 s[QH_MAXC][4];
        QP_UNROLL for (int c = 0; c < C; c++)
            QP_UNROLL for (int i = 0; i < 4; i++) s[c][i] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *gb = g + b * QP_H16_GBLK;
            QP_UNROLL for (int q = 0; q < 8; q++) {
                if (q % 2 == 0) qp_prefetch_part_at(gb, QP_H16_GBLK, q / 2, 4, QP_PF_H16);
                __m512 w[4];
                QP_UNROLL for (int i = 0; i < 4; i++)
                    w[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gb + 8 * QP_ROWS * q + 32 * i)));
                QP_UNROLL for (int c = 0; c < C; c++) {
                    const float *xc = (const float *)(x + c * xs) + b * QP_H16_BLOCK + 4 * q;
                    __m512 xv = _mm512_broadcast_f32x4(_mm_loadu_ps(xc));
                    QP_UNROLL for (int i = 0; i < 4; i++) s[c][i] = _mm512_fmadd_ps(w[i], xv, s[c][i]);
                }
            }
        }
        h16_store(C, s, nr - r, out + r, os);
    }
}

/* ---------------------------------------------------------------- BF16 */

/* Block b's activations of C columns widened to f32: xf[c][0] its 16 pairs' odd
 * elements, xf[c][1] the even ones (a chunk's 4 of each then one 16-byte broadcast). */
QP_INLINE void bf16_widen(const int C, const uint8_t *x, size_t xs, int64_t b, float xf[][2][16]) {
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    QP_UNROLL for (int c = 0; c < C; c++) {
        __m512i v = _mm512_loadu_si512((const void *)(x + c * xs + b * 2 * QP_H16_BLOCK));
        _mm512_store_si512((void *)xf[c][0], _mm512_and_si512(v, hi));
        _mm512_store_si512((void *)xf[c][1], _mm512_slli_epi32(v, 16));
    }
}

/* BF16 with FMAs: the pass's activations widened on the stack a block ahead (read right
 * after its store, a wide store would not forward to the narrow loads: 70% slower), per
 * pair the odd then the even element. Four columns a pass: their odd and even
 * activations of a chunk stay in registers (8), beside 16 accumulators; the weights'
 * split into odd and even (an AND and a shift per 4 rows) serves 8 FMAs. With the
 * activations as FMA memory operands (six columns) a pass ran at 39 against 58 GMAC/s
 * on the Zen 4 VM, whose 512-bit loads issue at half the rate of its FMAs. */
QP_INLINE void bf16_pass_fma(const int C, int64_t nb, const uint8_t *wp, int r0, int nr,
                             const uint8_t *x, size_t xs, float *out, size_t os) {
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    for (int r = 0; r < nr; r += QP_ROWS) {
        const uint8_t *g = wp + (size_t)((r0 + r) / QP_ROWS) * nb * QP_H16_GBLK;
        __m512 s[QH_MAXC][4];
        QP_UNROLL for (int c = 0; c < C; c++)
            QP_UNROLL for (int i = 0; i < 4; i++) s[c][i] = _mm512_setzero_ps();
        float xbuf[2][QH_MAXC][2][16] __attribute__((aligned(64)));
        bf16_widen(C, x, xs, 0, xbuf[0]);
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *gb = g + b * QP_H16_GBLK;
            if (b + 1 < nb) bf16_widen(C, x, xs, b + 1, xbuf[(b + 1) & 1]);
            float (*xf)[2][16] = xbuf[b & 1];
            QP_UNROLL for (int q = 0; q < 4; q++) {
                qp_prefetch_part_at(gb, QP_H16_GBLK, q, 4, QP_PF_H16);
                __m512 xo[QH_MAXC], xe[QH_MAXC];
                QP_UNROLL for (int c = 0; c < C; c++) {
                    xo[c] = _mm512_broadcast_f32x4(_mm_load_ps(xf[c][0] + 4 * q));
                    xe[c] = _mm512_broadcast_f32x4(_mm_load_ps(xf[c][1] + 4 * q));
                }
                QP_UNROLL for (int i = 0; i < 4; i++) {
                    __m512i v = _mm512_loadu_si512((const void *)(gb + 16 * QP_ROWS * q + 64 * i));
                    __m512 wo = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
                    __m512 we = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
                    QP_UNROLL for (int c = 0; c < C; c++) {
                        s[c][i] = _mm512_fmadd_ps(wo, xo[c], s[c][i]);
                        s[c][i] = _mm512_fmadd_ps(we, xe[c], s[c][i]);
                    }
                }
            }
        }
        h16_store(C, s, nr - r, out + r, os);
    }
}

/* BF16 with vdpbf16ps: four rows' four pairs against the column's, one instruction. */
__attribute__((target("avx512bf16"))) static inline __attribute__((always_inline)) void
bf16_pass_dp(const int C, int64_t nb, const uint8_t *wp, int r0, int nr, const uint8_t *x, size_t xs,
             float *out, size_t os) {
    for (int r = 0; r < nr; r += QP_ROWS) {
        const uint8_t *g = wp + (size_t)((r0 + r) / QP_ROWS) * nb * QP_H16_GBLK;
        __m512 s[QH_MAXC][4];
        QP_UNROLL for (int c = 0; c < C; c++)
            QP_UNROLL for (int i = 0; i < 4; i++) s[c][i] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *gb = g + b * QP_H16_GBLK;
            QP_UNROLL for (int q = 0; q < 4; q++) {
                qp_prefetch_part_at(gb, QP_H16_GBLK, q, 4, QP_PF_H16);
                __m512bh w[4];
                QP_UNROLL for (int i = 0; i < 4; i++)
                    w[i] = (__m512bh)_mm512_loadu_si512((const void *)(gb + 16 * QP_ROWS * q + 64 * i));
                QP_UNROLL for (int c = 0; c < C; c++) {
                    const uint8_t *xc = x + c * xs + b * 2 * QP_H16_BLOCK + 16 * q;
                    __m512bh xv = (__m512bh)_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)xc));
                    QP_UNROLL for (int i = 0; i < 4; i++) s[c][i] = _mm512_dpbf16_ps(s[c][i], w[i], xv);
                }
            }
        }
        h16_store(C, s, nr - r, out + r, os);
    }
}

/* Passes of QH_MAXC columns, then one of the rest: each pass a constant width (a
 * macro, not a function: vdpbf16ps's pass may only inline into a function built for it). */
#define QH_TILE(pass, maxc)                                                     \
    do {                                                                        \
        const int64_t nb = n / QP_H16_BLOCK;                                    \
        const uint8_t *X = xq;                                                  \
        int c = 0;                                                              \
        for (; c + (maxc) <= nc; c += (maxc))                                   \
            pass((maxc), nb, wp, r0, nr, X + c * xs, xs, out + c * os, os);     \
        X += c * xs, out += c * os;                                             \
        switch (nc - c) {                                                       \
        case 5: pass(5, nb, wp, r0, nr, X, xs, out, os); break;                 \
        case 4: pass(4, nb, wp, r0, nr, X, xs, out, os); break;                 \
        case 3: pass(3, nb, wp, r0, nr, X, xs, out, os); break;                 \
        case 2: pass(2, nb, wp, r0, nr, X, xs, out, os); break;                 \
        case 1: pass(1, nb, wp, r0, nr, X, xs, out, os); break;                 \
        }                                                                       \
    } while (0)

void qp_f16_tile_avx512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                        int nc, float *out, size_t os) {
    QH_TILE(h16_pass, QH_MAXC);
}

void qp_bf16_tile_fma512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                         int nc, float *out, size_t os) {
    QH_TILE(bf16_pass_fma, QH_FMA_MAXC);
}

__attribute__((target("avx512bf16"))) void qp_bf16_tile_dpbf16(int64_t n, const void *wp, int r0, int nr,
                                                             const void *xq, size_t xs, int nc,
                                                             float *out, size_t os) {
    QH_TILE(bf16_pass_dp, QH_MAXC);
}

void qp_bf16_tile_avx512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                         int nc, float *out, size_t os) {
    (isa_dpbf16() ? qp_bf16_tile_dpbf16 : qp_bf16_tile_fma512)(n, wp, r0, nr, xq, xs, nc, out, os);
}
