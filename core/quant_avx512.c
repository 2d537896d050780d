/* quant_avx512: AVX-512 (F/BW/VL/DQ) + VNNI. The quant_x86.h kernels rebuilt with
 * vpdpbusd in place of maddubs+madd and 4x4 tiles (32 vector registers), plus a
 * 512-bit Q4_1 x Q8_1 row kernel (the default model's layers) doing two blocks per
 * vpdpbusd. */
#define QX_VNNI 1
#include "core/quant_x86.h"

/* ---------------------------------------------------------------- Q4_1 x Q8_1, 512-bit */

/* Two blocks per iteration. The weights' 2x16 packed bytes become
 * [b0 lo nibbles | b1 lo | b0 hi | b1 hi] (elements b0 0-15, b1 0-15, b0 16-31,
 * b1 16-31); the activations are permuted once per block pair to the same order and
 * shared by the R rows. dpbusd dword lanes 0-3 and 8-11 belong to block 0, 4-7 and
 * 12-15 to block 1, which is how the scale vector is laid out. */
QX_INLINE void q41_rows512(const int R, int64_t nb, const uint8_t *w, size_t ws,
                           const uint8_t *x, float *out) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i xperm = _mm512_setr_epi64(0, 1, 4, 5, 2, 3, 6, 7);
    const __m512i sperm = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2);
    __m512 acc[4];
    __m128 macc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps(), macc[r] = _mm_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const blk_q8_1 *xb = (const blk_q8_1 *)x + i;
        __m512i xv = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)xb[0].qs)),
            _mm256_loadu_si256((const __m256i *)xb[1].qs), 1);
        xv = _mm512_permutexvar_epi64(xperm, xv);
        int xh0, xh1;
        memcpy(&xh0, &xb[0], 4);
        memcpy(&xh1, &xb[1], 4);
        __m128 xds = _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128(xh0), xh1, 1));
        for (int r = 0; r < R; r++) {
            const blk_q4_1 *wb = (const blk_q4_1 *)(w + r * ws) + i;
            /* Decode streams each weight once: fetch the same spot of the next group of
             * R rows (contiguous after these) so memory latency overlaps compute. */
            _mm_prefetch((const char *)wb + R * ws, _MM_HINT_T0);
            int wh0, wh1;
            memcpy(&wh0, &wb[0], 4);
            memcpy(&wh1, &wb[1], 4);
            /* [d0, m0, d1, m1] * [dx0, sx0, dx1, sx1] */
            __m128 prod = _mm_mul_ps(_mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128(wh0), wh1, 1)), xds);
            __m256i q = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)wb[0].qs)),
                _mm_loadu_si128((const __m128i *)wb[1].qs), 1);
            __m512i wq = _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1);
            wq = _mm512_and_si512(wq, m4);
            __m512 fi = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, xv));
            __m512 sc = _mm512_permutexvar_ps(sperm, _mm512_castps128_ps512(prod));
            acc[r] = _mm512_fmadd_ps(fi, sc, acc[r]);
            macc[r] = _mm_add_ps(macc[r], prod);
        }
    }
    for (int r = 0; r < R; r++) {
        /* min terms sit in lanes 1 and 3 */
        __m128 m = _mm_add_ps(macc[r], _mm_movehl_ps(macc[r], macc[r]));
        float s = _mm512_reduce_add_ps(acc[r]) + _mm_cvtss_f32(_mm_movehdup_ps(m));
        if (i < nb) { /* odd block count: the last block with the 256-bit kernel */
            float t;
            qx_tile_rc(QX_Q4_1, 1, 1, 1, w + r * ws + i * sizeof(blk_q4_1), 0,
                       x + i * sizeof(blk_q8_1), 0, &t, 0);
            s += t;
        }
        out[r] = s;
    }
}

static float q41_dot512(int64_t n, const void *w, const void *x) {
    float o;
    q41_rows512(1, n / QK4, w, 0, x, &o);
    return o;
}
static void q41_dot_rows512(int64_t n, const void *w, size_t ws, int nr, const void *x,
                            float *out) {
    const uint8_t *W = w;
    int r = 0;
    for (; r + 4 <= nr; r += 4) q41_rows512(4, n / QK4, W + r * ws, ws, x, out + r);
    for (; r < nr; r++) q41_rows512(1, n / QK4, W + r * ws, ws, x, out + r);
}

void quant_register_avx512(quant_kernels k[QT_COUNT]) {
    qx_register(k);
    k[QT_Q4_1].dot = q41_dot512;
    k[QT_Q4_1].rows = q41_dot_rows512;
    /* the 256-bit 4x4 tile stays for batches: it reuses each weight load 4 times */
    k[QT_Q4_1].tile = qx_q4_1_tile;
}
