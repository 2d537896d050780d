/* quant_q41_512.h: the body of the 512-bit Q4_1 x Q8_1 tile, included twice by
 * quant_avx512.c: Q41_STEP / Q41_TILE_RC name the functions and QX_UNROLL their loop
 * pragma (unrolled for multi-column tiles, rolled for single columns, which measured
 * faster for decode). The arithmetic is the same in both (batch invariance). */
/* One block pair (two = 1) or a last odd block (two = 0) of R rows x C columns. */
QX_INLINE void Q41_STEP(const int R, const int C, const int two, const uint8_t *w,
                        size_t ws, const uint8_t *x, size_t xs, __m512 acc[4][4],
                        __m512 macc[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const size_t wb = sizeof(blk_q4_1), xb = sizeof(blk_q8_1);
    __m512i xv[4];
    __m512 xds;
    QX_UNROLL for (int c = 0; c < C; c++) xv[c] = q41_xload(x + c * xs, two);
    if (C == 1) {
        xds = _mm512_castps128_ps512(_mm_cvtph_ps(q41_hpair(x, xb, two)));
    } else {
        __m128i z = _mm_setzero_si128();
        __m128i h01 = _mm_unpacklo_epi64(q41_hpair(x, xb, two), q41_hpair(x + xs, xb, two));
        __m128i h23 = _mm_unpacklo_epi64(C > 2 ? q41_hpair(x + 2 * xs, xb, two) : z,
                                         C > 3 ? q41_hpair(x + 3 * xs, xb, two) : z);
        xds = _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(h01), h23, 1));
    }
    QX_UNROLL for (int r = 0; r < R; r++) {
        const uint8_t *p = w + r * ws;
        /* Decode streams each weight once: fetch the same spot of the next group of R
         * rows (contiguous after these) so memory latency overlaps compute. */
        _mm_prefetch((const char *)p + R * ws, _MM_HINT_T0);
        __m128 wdm = _mm_cvtph_ps(q41_hpair(p, wb, two));
        __m128i q1 = two ? _mm_loadu_si128((const __m128i *)(p + wb + 4)) : _mm_setzero_si128();
        __m256i q = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p + 4))), q1, 1);
        __m512i wq = _mm512_inserti64x4(_mm512_castsi256_si512(q), _mm256_srli_epi16(q, 4), 1);
        wq = _mm512_and_si512(wq, m4);
        __m512 prod;
        if (C == 1) {
            __m128 p1 = _mm_mul_ps(wdm, _mm512_castps512_ps128(xds));
            macc[r] = _mm512_castps128_ps512(_mm_add_ps(_mm512_castps512_ps128(macc[r]), p1));
            prod = _mm512_castps128_ps512(p1);
        } else {
            prod = _mm512_mul_ps(_mm512_broadcast_f32x4(wdm), xds);
            macc[r] = _mm512_add_ps(macc[r], prod);
        }
        QX_UNROLL for (int c = 0; c < C; c++) {
            const __m512i sperm = _mm512_add_epi32(
                _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2),
                _mm512_set1_epi32(4 * c));
            __m512 fi = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, xv[c]));
            acc[r][c] = _mm512_fmadd_ps(fi, _mm512_permutexvar_ps(sperm, prod), acc[r][c]);
        }
    }
}

QX_INLINE void Q41_TILE_RC(const int R, const int C, int64_t nb, const uint8_t *w,
                           size_t ws, const uint8_t *x, size_t xs, float *out, size_t os) {
    const size_t wb = sizeof(blk_q4_1), xb = sizeof(blk_q8_1);
    __m512 acc[4][4], macc[4];
    QX_UNROLL for (int r = 0; r < R; r++) {
        macc[r] = _mm512_setzero_ps();
        QX_UNROLL for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) Q41_STEP(R, C, 1, w + i * wb, ws, x + i * xb, xs, acc, macc);
    if (i < nb) Q41_STEP(R, C, 0, w + i * wb, ws, x + i * xb, xs, acc, macc);
    QX_UNROLL for (int r = 0; r < R; r++) {
        float m[16];
        if (C == 1) _mm_storeu_ps(m, _mm512_castps512_ps128(macc[r]));
        else _mm512_storeu_ps(m, macc[r]);
        /* min terms sit in lanes 4c+1 and 4c+3 */
        QX_UNROLL for (int c = 0; c < C; c++)
            out[c * os + r] = _mm512_reduce_add_ps(acc[r][c]) + (m[4 * c + 1] + m[4 * c + 3]);
    }
}

