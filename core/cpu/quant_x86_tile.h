/* quant_x86_tile.h: the body of the R x C tile kernel, included twice by quant_x86.h:
 * QX_TILE_RC names the function and QX_UNROLL its loop pragma (unrolled for tiles,
 * rolled for single columns, which measured faster for decode). Same arithmetic. */
/* R weight rows x C activation rows, every block: acc[r][c] += d_w*d_x * idot, and
 * for min types m_w*s_x. [d_w, m_w] * [d_x, s_x] is one multiply: lane 0 is the
 * block's scale (broadcast), lane 1 the min term, summed in macc. With C > 1 a min
 * type packs two columns in one 256-bit multiply and accumulator (columns 2k, 2k+1 in
 * lanes 0-1 and 4-5; a row's [d_w, m_w] repeated), which halves the macc registers.
 * A lane's product and sum are the same IEEE operations whatever the vector width,
 * so every (row, column) pair gets the same bits for any R, C and place in the tile
 * (batch invariance). R, C are constants at each call, so the loops unroll and the
 * accumulators stay in registers. */
QX_INLINE void QX_TILE_RC(const int kind, const int R, const int C, int64_t nb,
                          const uint8_t *w, size_t ws, const uint8_t *x, size_t xs,
                          float *out, size_t os) {
    const int pack = qx_has_min(kind) && C > 1;
    __m256 acc[4][4], macc2[4][2];
    __m128 macc[4];
    QX_UNROLL for (int r = 0; r < R; r++) {
        macc[r] = _mm_setzero_ps();
        macc2[r][0] = macc2[r][1] = _mm256_setzero_ps();
        QX_UNROLL for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    }
    const size_t wb = qx_wbytes(kind), xb = qx_xbytes(kind);
    const int bias = qx_bias(kind);
    for (int64_t i = 0; i < nb; i++) {
        __m256i xq[4], xneg[4];
        __m128 xds[4];
        __m256 xds2[2];
        QX_UNROLL for (int c = 0; c < C; c++) {
            const uint8_t *p = x + c * xs + i * xb;
            if (!pack) xds[c] = qx_h2f_pair(p);
            xq[c] = _mm256_loadu_si256((const __m256i *)(p + (qx_has_min(kind) ? 4 : 2)));
            xneg[c] = _mm256_setzero_si256();
            if (bias)
                xneg[c] = _mm256_sub_epi32(xneg[c], qx_dpbusd(_mm256_setzero_si256(),
                                                              _mm256_set1_epi8((char)bias), xq[c]));
        }
        if (pack)
            QX_UNROLL for (int k = 0; k < (C + 1) / 2; k++) {
                int h0, h1 = 0;
                memcpy(&h0, x + 2 * k * xs + i * xb, 4);
                if (2 * k + 1 < C) memcpy(&h1, x + (2 * k + 1) * xs + i * xb, 4);
                xds2[k] = _mm256_cvtph_ps(_mm_set_epi32(0, h1, 0, h0));
            }
        QX_UNROLL for (int r = 0; r < R; r++) {
            const uint8_t *p = w + r * ws + i * wb;
            /* the same spot of the next R rows (contiguous after these): weights are
             * streamed once per step, so fetch ahead to overlap memory latency */
            _mm_prefetch((const char *)p + R * ws, _MM_HINT_T0);
            float dw, mw;
            __m256i wq = qx_decode(kind, p, &dw, &mw);
            if (pack) {
                int hw;
                memcpy(&hw, p, 4);
                __m256 wdm2 = _mm256_cvtph_ps(_mm_set1_epi32(hw));
                __m256 prod2[2];
                QX_UNROLL for (int k = 0; k < (C + 1) / 2; k++) {
                    prod2[k] = _mm256_mul_ps(wdm2, xds2[k]);
                    macc2[r][k] = _mm256_add_ps(macc2[r][k], prod2[k]);
                }
                QX_UNROLL for (int c = 0; c < C; c++) {
                    __m256 sc = c & 1 ? _mm256_permutevar8x32_ps(prod2[c / 2], _mm256_set1_epi32(4))
                                      : _mm256_broadcastss_ps(_mm256_castps256_ps128(prod2[c / 2]));
                    __m256 fi = _mm256_cvtepi32_ps(qx_idot(kind, wq, xq[c], xneg[c]));
                    acc[r][c] = _mm256_fmadd_ps(fi, sc, acc[r][c]);
                }
                continue;
            }
            __m128 wdm = qx_h2f_pair(p);
            QX_UNROLL for (int c = 0; c < C; c++) {
                __m128 prod = _mm_mul_ps(wdm, xds[c]);
                __m256 fi = _mm256_cvtepi32_ps(qx_idot(kind, wq, xq[c], xneg[c]));
                acc[r][c] = _mm256_fmadd_ps(fi, _mm256_broadcastss_ps(prod), acc[r][c]);
                if (qx_has_min(kind)) macc[r] = _mm_add_ps(macc[r], prod);
            }
        }
    }
    QX_UNROLL for (int r = 0; r < R; r++)
        QX_UNROLL for (int c = 0; c < C; c++) {
            float m = 0.0f;
            if (pack) {
                __m256 v = macc2[r][c / 2];
                m = _mm_cvtss_f32(_mm_movehdup_ps(c & 1 ? _mm256_extractf128_ps(v, 1)
                                                        : _mm256_castps256_ps128(v)));
            } else if (qx_has_min(kind)) {
                m = _mm_cvtss_f32(_mm_movehdup_ps(macc[r]));
            }
            out[c * os + r] = qx_hsum(acc[r][c]) + m;
        }
}

