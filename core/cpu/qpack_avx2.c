/* qpack_avx2: the packed Q4_1 x Q8_1 tile with AVX2 (layout and arithmetic in qpack.h),
 * for machines without AVX-512 (and TCG guests). A 256-bit lane holds 8 rows, so a
 * group goes as two halves of 8 rows, each over all blocks, its accumulators in
 * registers. With no VNNI, vpmaddubsw multiplies a chunk's nibbles by the broadcast
 * activation bytes into 16-bit pair sums; the 8 of a block add up in 16 bits without
 * overflow (each at most 2 * 15 * 127, eight of them 30,480 < 32,767), then one
 * vpmaddwd makes each row's int32 sum: the same exact integer as the reference's, so
 * the two FMAs after it give its bits. */
#include <immintrin.h>
#include <string.h>

#include "core/cpu/qpack.h"
#include "core/cpu/quant_kern.h"

#define QP2_INLINE static inline __attribute__((always_inline))
#define Q41_GBLK (QP_ROWS * sizeof(blk_q4_1))
#define QP2_MAXC 4 /* columns per pass: 8 weight vectors + 4 accumulators in 16 registers */
#define QP2_UNROLL _Pragma("GCC unroll 8")

QP2_INLINE __m256i qp2_bcast(const uint8_t *p) {
    int v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Rows 8h..8h+7 of one group x C columns over all nb blocks. */
QP2_INLINE void q41_half(const int C, int64_t nb, const uint8_t *g, int h, const uint8_t *x,
                         size_t xs, __m256 acc[QP2_MAXC]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    QP2_UNROLL for (int c = 0; c < C; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = g + b * Q41_GBLK;
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 16 * h)));
        __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 32 + 16 * h)));
        __m256i w[8];
        QP2_UNROLL for (int k = 0; k < 4; k++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(gb + 64 * (1 + k) + 32 * h));
            w[2 * k] = _mm256_and_si256(v, m4);
            w[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        }
        QP2_UNROLL for (int c = 0; c < C; c++) {
            const uint8_t *xb = x + c * xs + b * sizeof(blk_q8_1), *q = xb + 4;
            __m256i s = _mm256_setzero_si256();
            QP2_UNROLL for (int k = 0; k < 4; k++) {
                s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[2 * k], qp2_bcast(q + 4 * k)));
                s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[2 * k + 1], qp2_bcast(q + 16 + 4 * k)));
            }
            __m256 fi = _mm256_cvtepi32_ps(_mm256_madd_epi16(s, ones));
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
QP2_INLINE void qp2_pass(const int C, int64_t nb, const uint8_t *wp, int r0, int nr,
                         const uint8_t *x, size_t xs, float *out, size_t os) {
    for (int r = 0; r < nr; r += 8) {
        const uint8_t *g = wp + (size_t)((r0 + r) / QP_ROWS) * nb * Q41_GBLK;
        __m256 acc[QP2_MAXC];
        q41_half(C, nb, g, (r / 8) % 2, x, xs, acc);
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

void qp_q41_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                      int nc, float *out, size_t os) {
    const int64_t nb = n / QK4;
    const uint8_t *W = wp, *X = xq;
    int c = 0;
    for (; c + QP2_MAXC <= nc; c += QP2_MAXC)
        qp2_pass(QP2_MAXC, nb, W, r0, nr, X + c * xs, xs, out + c * os, os);
    X += c * xs, out += c * os;
    switch (nc - c) {
    case 3: qp2_pass(3, nb, W, r0, nr, X, xs, out, os); break;
    case 2: qp2_pass(2, nb, W, r0, nr, X, xs, out, os); break;
    case 1: qp2_pass(1, nb, W, r0, nr, X, xs, out, os); break;
    }
}
