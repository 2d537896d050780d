/* quant_amx: the AMX level (AVX-512 plus AMX-INT8 tiles): Q4_1 x Q8_1, the default
 * model's layers, for dot, rows and tile alike. Named *_avx512.c so the build gives it
 * the AVX-512 flags; the AMX ones come from the pragma below.
 *
 * Why AMX: in a batched step the 512-bit VNNI tile spends ~4 vector ops per (row,
 * column, block pair) on int->float conversion, scale and accumulation. One tdpbsud
 * computes the exact int32 block dots of 16 tokens x 16 weight rows at once, leaving
 * the float work lane-parallel over 16 rows: ~9 ops per 16 pairs and block.
 *
 * Arithmetic (one definition for every nr, nc and place in the tile; lanes are weight
 * rows, and every lane runs the same IEEE operations, so results are batch invariant):
 *   s = 0; for each block b in order:
 *     i = exact int dot of the 32 weight nibbles and 32 activation int8s
 *     s = fma((float)i, d_w*d_x, s);  s = fma(m_w, s_x, s)
 * tests/unit/test_quant.c mirrors it in plain C and checks it bit for bit.
 *
 * Tiles: A = 16 tokens x 32 int8 (the Q8_1 blocks' qs, loaded in place with the row
 * stride), B = the 16 weight rows in VNNI order (B[j][4n+t] = weight n, element
 * 4j+t: gathered and unpacked here), C = 16 tokens x 16 rows of int32. */
#pragma GCC target("amx-tile,amx-int8")
#include "core/quant_kern.h"

#include <immintrin.h>
#include <string.h>

#define AMX_KB 32 /* blocks whose B tiles are built at once (16 KB, stays in L1) */

/* palette 1: tiles 0/3 C (mt x 16 int32), 1/4 A (mt x 32 bytes), 2/5 B (8 x 64 bytes). */
typedef struct {
    uint8_t palette, start;
    uint8_t pad[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* Tile configuration is per thread; reload it only when the token count changes. */
static _Thread_local int amx_mt;

static void amx_config(int mt) {
    if (amx_mt == mt) return;
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 6; t += 3) {
        c.rows[t] = (uint8_t)mt, c.colsb[t] = 64;
        c.rows[t + 1] = (uint8_t)mt, c.colsb[t + 1] = 32;
        c.rows[t + 2] = 8, c.colsb[t + 2] = 64;
    }
    _tile_loadconfig(&c);
    amx_mt = mt;
}

/* B tiles and [d, m] for nb blocks of 16 weight rows (row offsets idx: rows past nr
 * repeat the last one, their results are dropped). */
static void amx_build_b(const uint8_t *w, __m512i idx, int nb, uint8_t (*B)[512],
                        float (*wd)[16], float (*wm)[16]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int b = 0; b < nb; b++) {
        const uint8_t *p = w + (size_t)b * sizeof(blk_q4_1);
        __m512i dm = _mm512_i32gather_epi32(idx, p, 1);
        _mm512_storeu_ps(wd[b], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm)));
        _mm512_storeu_ps(wm[b], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16))));
        for (int j = 0; j < 4; j++) { /* qs dword j: elements 4j.. (low), 16+4j.. (high) */
            __m512i q = _mm512_i32gather_epi32(idx, p + 4 + 4 * j, 1);
            _mm512_storeu_si512(B[b] + 64 * j, _mm512_and_si512(q, m4));
            _mm512_storeu_si512(B[b] + 64 * (j + 4), _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
        }
    }
}

/* The float step for one block of mt tokens: s[c] (lanes = rows) as defined above. */
static inline void amx_epilogue(const int32_t (*C)[16], int mt, const uint8_t *x, size_t xs,
                                const float *wd, const float *wm, __m512 *s) {
    const __m512 vd = _mm512_loadu_ps(wd), vm = _mm512_loadu_ps(wm);
    for (int c = 0; c < mt; c++) {
        int h;
        memcpy(&h, x + (size_t)c * xs, 4);
        __m128 ds = _mm_cvtph_ps(_mm_cvtsi32_si128(h)); /* d_x, s_x */
        __m512 fi = _mm512_cvtepi32_ps(_mm512_loadu_si512(C[c]));
        __m512 p = _mm512_mul_ps(vd, _mm512_broadcastss_ps(ds));
        s[c] = _mm512_fmadd_ps(fi, p, s[c]);
        s[c] = _mm512_fmadd_ps(vm, _mm512_broadcastss_ps(_mm_movehdup_ps(ds)), s[c]);
    }
}

/* Blocks [b0, b0+kb) of one 16-row group for mt (<= 16) tokens at x, accumulated into
 * out (s starts at 0 when first). Two tile sets take even and odd blocks so one block's
 * tile work overlaps the other's float step. */
static void amx_cols(const uint8_t (*B)[512], const float (*wd)[16], const float (*wm)[16],
                     int b0, int kb, const uint8_t *x, size_t xs, int mt, float *out,
                     size_t os, __mmask16 keep, int first) {
    int32_t C0[16][16], C1[16][16];
    __m512 s[16];
    for (int c = 0; c < mt; c++)
        s[c] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(keep, out + (size_t)c * os);
    amx_config(mt);
    const size_t xb = sizeof(blk_q8_1);
    int b = 0;
    for (; b + 2 <= kb; b += 2) {
        const uint8_t *x0 = x + (size_t)(b0 + b) * xb;
        _tile_zero(0);
        _tile_zero(3);
        _tile_loadd(1, x0 + 4, (long)xs);
        _tile_loadd(2, B[b], 64);
        _tile_loadd(4, x0 + xb + 4, (long)xs);
        _tile_loadd(5, B[b + 1], 64);
        _tile_dpbsud(0, 1, 2);
        _tile_dpbsud(3, 4, 5);
        _tile_stored(0, C0, 64);
        _tile_stored(3, C1, 64);
        amx_epilogue((const int32_t (*)[16])C0, mt, x0, xs, wd[b], wm[b], s);
        amx_epilogue((const int32_t (*)[16])C1, mt, x0 + xb, xs, wd[b + 1], wm[b + 1], s);
    }
    if (b < kb) {
        const uint8_t *x0 = x + (size_t)(b0 + b) * xb;
        _tile_zero(0);
        _tile_loadd(1, x0 + 4, (long)xs);
        _tile_loadd(2, B[b], 64);
        _tile_dpbsud(0, 1, 2);
        _tile_stored(0, C0, 64);
        amx_epilogue((const int32_t (*)[16])C0, mt, x0, xs, wd[b], wm[b], s);
    }
    for (int c = 0; c < mt; c++) _mm512_mask_storeu_ps(out + (size_t)c * os, keep, s[c]);
}

/* ---------------------------------------------------------------- one column, AVX-512 */

/* Decode (one token) gains nothing from tiles: building B costs more than the dots it
 * feeds. Here lanes are the 16 rows too, and each block's int dot comes from vpdpbusd
 * (4 rows per vector, one per 128-bit lane) and a 4x4 transpose-add; the int is exact,
 * so the float steps and thus the bits are those of the tile path. */
static inline __m512i amx_hsum4x4(__m512i a, __m512i b, __m512i c, __m512i d) {
    /* per 128-bit lane: [a0..a3], [b0..b3], ... -> [sum a, sum b, sum c, sum d] */
    __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
}

/* 16 raw qs bytes of 4 rows (r[0], r[4], r[8], r[12]: one per 128-bit lane) at offset o. */
static inline __m512i amx_load4(const uint8_t *const *r, size_t o) {
    __m512i q = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(r[0] + o)));
    q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(r[4] + o)), 1);
    q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(r[8] + o)), 2);
    return _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(r[12] + o)), 3);
}

/* Rows r0.. (nrow <= 16; lane l is row min(l, nrow-1)) against one activation row. */
static void amx_col(int nb, const uint8_t *w, size_t ws, int nrow, const uint8_t *x,
                    float *out) {
    const uint8_t *rp[16];
    for (int l = 0; l < 16; l++) rp[l] = w + (size_t)(l < nrow ? l : nrow - 1) * ws;
    const __m512i idx = _mm512_mullo_epi32(
        _mm512_min_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(nrow - 1)),
        _mm512_set1_epi32((int)ws));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 s = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *xb = x + (size_t)b * sizeof(blk_q8_1);
        const size_t o = (size_t)b * sizeof(blk_q4_1);
        __m512i xlo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xb + 4)));
        __m512i xhi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xb + 20)));
        __m512i acc[4];
        for (int k = 0; k < 4; k++) { /* lane g of acc[k]: row 4g+k */
            __m512i q = amx_load4(rp + k, o + 4);
            __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
            acc[k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xlo), hi, xhi);
        }
        __m512 fi = _mm512_cvtepi32_ps(amx_hsum4x4(acc[0], acc[1], acc[2], acc[3]));
        __m512i dm = _mm512_i32gather_epi32(idx, w + o, 1);
        __m512 vd = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
        __m512 vm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
        int h;
        memcpy(&h, xb, 4);
        __m128 ds = _mm_cvtph_ps(_mm_cvtsi32_si128(h));
        s = _mm512_fmadd_ps(fi, _mm512_mul_ps(vd, _mm512_broadcastss_ps(ds)), s);
        s = _mm512_fmadd_ps(vm, _mm512_broadcastss_ps(_mm_movehdup_ps(ds)), s);
    }
    _mm512_mask_storeu_ps(out, (__mmask16)((1u << nrow) - 1), s);
}

/* ---------------------------------------------------------------- dispatch */

/* Tokens from which the tile path pays for its B tiles (measured: see BENCHMARKS.md). */
#define AMX_MIN_NC 2

static void amx_q41_tile(int64_t n, const void *w, size_t ws, int nr, const void *x,
                         size_t xs, int nc, float *out, size_t os) {
    const int nb = (int)(n / QK4);
    const uint8_t *W = w, *X = x;
    if (nc < AMX_MIN_NC) {
        for (int c = 0; c < nc; c++)
            for (int r = 0; r < nr; r += 16)
                amx_col(nb, W + (size_t)r * ws, ws, nr - r < 16 ? nr - r : 16,
                        X + (size_t)c * xs, out + (size_t)c * os + r);
        return;
    }
    uint8_t B[AMX_KB][512] __attribute__((aligned(64)));
    float wd[AMX_KB][16], wm[AMX_KB][16];
    for (int r = 0; r < nr; r += 16) {
        int nrow = nr - r < 16 ? nr - r : 16;
        __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        __m512i idx = _mm512_mullo_epi32(_mm512_min_epi32(lane, _mm512_set1_epi32(nrow - 1)),
                                         _mm512_set1_epi32((int)ws));
        __mmask16 keep = (__mmask16)((1u << nrow) - 1);
        for (int b0 = 0; b0 < nb; b0 += AMX_KB) {
            int kb = nb - b0 < AMX_KB ? nb - b0 : AMX_KB;
            amx_build_b(W + (size_t)r * ws + (size_t)b0 * sizeof(blk_q4_1), idx, kb, B, wd, wm);
            for (int c = 0; c < nc; c += 16)
                amx_cols((const uint8_t (*)[512])B, (const float (*)[16])wd,
                         (const float (*)[16])wm, b0, kb, X + (size_t)c * xs, xs,
                         nc - c < 16 ? nc - c : 16, out + (size_t)c * os + r, os, keep, b0 == 0);
        }
    }
}
static void amx_q41_rows(int64_t n, const void *w, size_t ws, int nr, const void *x,
                         float *out) {
    amx_q41_tile(n, w, ws, nr, x, 0, 1, out, 0);
}
static float amx_q41_dot(int64_t n, const void *w, const void *x) {
    float o;
    amx_q41_tile(n, w, 0, 1, x, 0, 1, &o, 0);
    return o;
}

void quant_register_amx(quant_kernels k[QT_COUNT]) {
    k[QT_Q4_1].dot = amx_q41_dot;
    k[QT_Q4_1].rows = amx_q41_rows;
    k[QT_Q4_1].tile = amx_q41_tile;
}
