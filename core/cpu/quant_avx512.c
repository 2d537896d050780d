/* quant_avx512: AVX-512 (F/BW/VL/DQ) + VNNI. The quant_x86.h kernels rebuilt with
 * vpdpbusd in place of maddubs+madd and 4x4 tiles (32 vector registers), plus a
 * 512-bit Q4_1 x Q8_1 tile kernel (the default model's layers) doing two blocks per
 * vpdpbusd, used for dot, rows and tile alike. */
#define QX_VNNI 1
#include "core/cpu/quant_x86.h"

/* ---------------------------------------------------------------- Q4_1 x Q8_1, 512-bit */

/* R weight rows x C activation rows, two blocks per vpdpbusd. The weights' 2x16 packed
 * bytes become [b0 lo nibbles | b1 lo | b0 hi | b1 hi] (elements b0 0-15, b1 0-15,
 * b0 16-31, b1 16-31); each activation row is permuted once per block pair to the same
 * order and shared by the R rows. dpbusd dword lanes 0-3 and 8-11 belong to block 0,
 * 4-7 and 12-15 to block 1, which is how the scale vector is laid out.
 *
 * Batch invariance: every (row, column) pair goes through the same operations in the
 * same order whatever R, C and its place in the tile (so dot, rows and tile agree bit
 * for bit, and a token's result does not depend on its batch). Scales: per block pair
 * [d0, m0, d1, m1] * [dx0, sx0, dx1, sx1] lane by lane; with C > 1 the C columns'
 * [dx, sx] sit in 128-bit lane c of one vector and a row's [d, m] is broadcast, so one
 * 512-bit multiply and add serve all columns (a lane's product is the same IEEE
 * operation whatever the vector width). Lanes 0/2 are the blocks' scales (permuted
 * to the dpbusd layout), lanes 1/3 the min terms, summed in macc. An odd block count
 * ends with one more pass whose second block is zero (adding exact zeros). */
QX_INLINE __m512i q41_xload(const uint8_t *p, int two) {
    const __m512i xperm = _mm512_setr_epi64(0, 1, 4, 5, 2, 3, 6, 7);
    __m256i b1 = two ? _mm256_loadu_si256((const __m256i *)(p + sizeof(blk_q8_1) + 4))
                     : _mm256_setzero_si256();
    __m512i v = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 4))), b1, 1);
    return _mm512_permutexvar_epi64(xperm, v);
}
/* The f16 pairs (d, m or d, s) of blocks i and i+1 (0 when !two) as one int64. */
QX_INLINE __m128i q41_hpair(const uint8_t *p, size_t stride, int two) {
    int h0, h1 = 0;
    memcpy(&h0, p, 4);
    if (two) memcpy(&h1, p + stride, 4);
    return _mm_insert_epi32(_mm_cvtsi32_si128(h0), h1, 1);
}

/* The tile kernel twice, same arithmetic: unrolled for multi-column tiles (prefill,
 * batches), rolled for single columns (decode). */
#define Q41_STEP q41_step
#define Q41_TILE_RC q41_tile_rc
#include "core/cpu/quant_q41_512.h"
#undef Q41_STEP
#undef Q41_TILE_RC
#pragma push_macro("QX_UNROLL")
#undef QX_UNROLL
#define QX_UNROLL
#define Q41_STEP q41_step_col
#define Q41_TILE_RC q41_tile_rc_col
#include "core/cpu/quant_q41_512.h"
#undef Q41_STEP
#undef Q41_TILE_RC
#pragma pop_macro("QX_UNROLL")

/* Tiles of 4 rows x 4 columns (16 zmm accumulators, 4 for the min terms, 4 activation
 * vectors: a few spill to L1, still the fastest shape here), then the edges. Decode
 * (nc = 1) runs 4-row x 1 tiles, whose prefetch reaches 4 rows ahead. */
QX_INLINE void q41_cols512(const int C, int64_t nb, const uint8_t *w, size_t ws, int nr,
                           const uint8_t *x, size_t xs, float *out, size_t os) {
    int r = 0;
    if (C == 1) { /* decode */
        for (; r + 4 <= nr; r += 4) q41_tile_rc_col(4, 1, nb, w + r * ws, ws, x, xs, out + r, os);
        for (; r + 2 <= nr; r += 2) q41_tile_rc_col(2, 1, nb, w + r * ws, ws, x, xs, out + r, os);
        for (; r < nr; r++) q41_tile_rc_col(1, 1, nb, w + r * ws, ws, x, xs, out + r, os);
        return;
    }
    for (; r + 4 <= nr; r += 4) q41_tile_rc(4, C, nb, w + r * ws, ws, x, xs, out + r, os);
    for (; r + 2 <= nr; r += 2) q41_tile_rc(2, C, nb, w + r * ws, ws, x, xs, out + r, os);
    for (; r < nr; r++) q41_tile_rc(1, C, nb, w + r * ws, ws, x, xs, out + r, os);
}

static void q41_tile512(int64_t n, const void *w, size_t ws, int nr, const void *x,
                        size_t xs, int nc, float *out, size_t os) {
    const int64_t nb = n / QK4;
    const uint8_t *X = x;
    int c = 0;
    for (; c + 4 <= nc; c += 4) q41_cols512(4, nb, w, ws, nr, X + c * xs, xs, out + c * os, os);
    switch (nc - c) {
    case 3: q41_cols512(3, nb, w, ws, nr, X + c * xs, xs, out + c * os, os); break;
    case 2: q41_cols512(2, nb, w, ws, nr, X + c * xs, xs, out + c * os, os); break;
    case 1: q41_cols512(1, nb, w, ws, nr, X + c * xs, xs, out + c * os, os); break;
    }
}
static void q41_rows512(int64_t n, const void *w, size_t ws, int nr, const void *x,
                        float *out) {
    q41_cols512(1, n / QK4, w, ws, nr, x, 0, out, 0);
}
static float q41_dot512(int64_t n, const void *w, const void *x) {
    float o;
    q41_tile_rc(1, 1, n / QK4, w, 0, x, 0, &o, 0);
    return o;
}

void quant_register_avx512(quant_kernels k[QT_COUNT]) {
    qx_register(k);
    /* dot, rows and tile are one kernel: the same result for a (row, column) pair
     * whichever is called and whatever the tile shape */
    k[QT_Q4_1].dot = q41_dot512;
    k[QT_Q4_1].rows = q41_rows512;
    k[QT_Q4_1].tile = q41_tile512;
}
