/* quant_amx: AVX-512 plus AMX-INT8 tiles: Q4_1 x Q8_1 (the default model's layers) and
 * Q8_0 x Q8_0 (its tied output matrix: the logits), for dot, rows and tile alike; the
 * Q8_0 block tiles also run qpack's packed Q8_0, Q4_0 and Q5_0 (amx_q80_blocks). Named
 * *_avx512.c so the build gives it the AVX-512 flags; the tile instructions are inline
 * asm (core/cpu/amx_x86.h), which gcc and clang both take without AMX flags.
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
#include "core/cpu/amx_x86.h"
#include "core/cpu/quant_kern.h"

#include <immintrin.h>
#include <string.h>

/* Tokens from which the tile path pays for its B tiles (one token: the AVX-512 path). */
#define AMX_MIN_NC 2

/* The two weight types: Q4_1 x Q8_1 (unsigned nibbles, a min term) and Q8_0 x Q8_0. */
enum { AMX_Q4_1, AMX_Q8_0 };
static inline size_t amx_wb(const int k) { return k == AMX_Q4_1 ? sizeof(blk_q4_1) : sizeof(blk_q8_0); }
static inline size_t amx_xb(const int k) { return k == AMX_Q4_1 ? sizeof(blk_q8_1) : sizeof(blk_q8_0); }
static inline size_t amx_xq(const int k) { return k == AMX_Q4_1 ? 4 : 2; } /* qs offset */

/* The configurations of core/cpu/amx_x86.h, loaded per thread when they change. */
typedef struct {
    uint8_t palette, start;
    uint8_t pad[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

static _Thread_local int amx_loaded; /* layout * 32 + mt */

void amx_config(int layout, int mt) {
    if (amx_loaded == layout * 32 + mt) return;
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    if (layout == AMX_CFG_BLOCK) {
        for (int t = 0; t < 6; t += 3) {
            c.rows[t] = (uint8_t)mt, c.colsb[t] = 64;
            c.rows[t + 1] = (uint8_t)mt, c.colsb[t + 1] = 32;
            c.rows[t + 2] = 8, c.colsb[t + 2] = 64;
        }
    } else {
        for (int t = 0; t < 5; t++) c.rows[t] = (uint8_t)mt, c.colsb[t] = 64; /* C, A */
        for (int t = 5; t < 8; t++) c.rows[t] = 16, c.colsb[t] = 64;           /* B */
    }
    /* the whole struct as operand: with gcc 12's _tile_loadconfig the stores to rows
     * and colsb were dropped (it did not see the 64 bytes read) */
    __asm__ volatile("ldtilecfg %0" : : "m"(c) : "memory");
    amx_loaded = layout * 32 + mt;
}

/* ---------------------------------------------------------------- B tiles */

/* 16 bytes at offset o of the 16 rows r[0..15] -> v[j] (j < 4): dword n = row n's
 * dword j. Four rows per vector (one per 128-bit lane), a 4x4 dword transpose inside
 * each, then a 4x4 transpose of 128-bit lanes across the four. */
static inline void amx_transpose16(const uint8_t *const *r, size_t o, __m512i v[4]) {
    const __m512i tr = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m512i t[4];
    for (int g = 0; g < 4; g++) {
        const uint8_t *const *q = r + 4 * g;
        __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(q[0] + o)));
        z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(q[1] + o)), 1);
        z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(q[2] + o)), 2);
        z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(q[3] + o)), 3);
        t[g] = _mm512_permutexvar_epi32(tr, z); /* lane j: rows 4g..4g+3, dword j */
    }
    __m512i u0 = _mm512_shuffle_i32x4(t[0], t[1], 0x44), u1 = _mm512_shuffle_i32x4(t[0], t[1], 0xEE);
    __m512i u2 = _mm512_shuffle_i32x4(t[2], t[3], 0x44), u3 = _mm512_shuffle_i32x4(t[2], t[3], 0xEE);
    v[0] = _mm512_shuffle_i32x4(u0, u2, 0x88), v[1] = _mm512_shuffle_i32x4(u0, u2, 0xDD);
    v[2] = _mm512_shuffle_i32x4(u1, u3, 0x88), v[3] = _mm512_shuffle_i32x4(u1, u3, 0xDD);
}

/* B tiles and d (and Q4_1's m) for nb blocks of 16 weight rows r[] (rows past nr repeat
 * the last one; their results are dropped). idx: the rows' byte offsets from r[0]. */
static inline void amx_build_b(const int kind, const uint8_t *const *r, __m512i idx, int nb,
                               uint8_t (*B)[512], float (*wd)[16], float (*wm)[16]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int b = 0; b < nb; b++) {
        const size_t o = (size_t)b * amx_wb(kind);
        __m512i dm = _mm512_i32gather_epi32(idx, r[0] + o, 1), v[4];
        _mm512_storeu_ps(wd[b], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm)));
        if (kind == AMX_Q4_1) {
            _mm512_storeu_ps(wm[b], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16))));
            amx_transpose16(r, o + 4, v); /* qs dword j: elements 4j.. low, 16+4j.. high */
            for (int j = 0; j < 4; j++) {
                _mm512_storeu_si512(B[b] + 64 * j, _mm512_and_si512(v[j], m4));
                _mm512_storeu_si512(B[b] + 64 * (j + 4), _mm512_and_si512(_mm512_srli_epi16(v[j], 4), m4));
            }
        } else {
            for (int h = 0; h < 2; h++) {
                amx_transpose16(r, o + 2 + 16 * h, v);
                for (int j = 0; j < 4; j++) _mm512_storeu_si512(B[b] + 64 * (4 * h + j), v[j]);
            }
        }
    }
}

/* ---------------------------------------------------------------- tiles */

/* The float step for one block of mt tokens: s[c] (lanes = rows) as defined above;
 * xd[c], xs[c] the tokens' d and s (broadcast from memory: no shuffles). */
static inline __attribute__((always_inline)) void
amx_epilogue(const int kind, const int32_t (*C)[16], const int mt, const float *xd,
             const float *xsum, const float *wd, const float *wm, __m512 *s) {
    const __m512 vd = _mm512_loadu_ps(wd);
    const __m512 vm = kind == AMX_Q4_1 ? _mm512_loadu_ps(wm) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int c = 0; c < mt; c++) {
        __m512 fi = _mm512_cvtepi32_ps(_mm512_loadu_si512(C[c]));
        s[c] = _mm512_fmadd_ps(fi, _mm512_mul_ps(vd, _mm512_set1_ps(xd[c])), s[c]);
        if (kind == AMX_Q4_1) s[c] = _mm512_fmadd_ps(vm, _mm512_set1_ps(xsum[c]), s[c]);
    }
}

/* d (and Q4_1's s) of kb blocks of mt tokens at x, by block: one gather of the 16
 * tokens' headers per block (tokens past mt repeat the last one). */
static inline void amx_xscales(const int kind, const uint8_t *x, size_t xs, int mt, int kb,
                               float (*xd)[16], float (*xsum)[16]) {
    __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i idx = _mm512_mullo_epi32(_mm512_min_epi32(lane, _mm512_set1_epi32(mt - 1)),
                                     _mm512_set1_epi32((int)xs));
    for (int b = 0; b < kb; b++) {
        __m512i g = _mm512_i32gather_epi32(idx, x + (size_t)b * amx_xb(kind), 1);
        _mm512_storeu_ps(xd[b], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)));
        if (kind == AMX_Q4_1)
            _mm512_storeu_ps(xsum[b], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16))));
    }
}

/* One block's C tile (tiles tc, ta, tb: literals) for mt tokens into C. */
#define AMX_BLOCK(kind, tc, ta, tb, xp, xs, Bp, C)                                   \
    do {                                                                             \
        AMX_ZERO(tc);                                                                \
        AMX_LOAD(ta, (xp) + amx_xq(kind), xs);                                       \
        AMX_LOAD(tb, Bp, 64);                                                        \
        if (kind == AMX_Q4_1) AMX_DPBSUD(tc, ta, tb);                                \
        else AMX_DPBSSD(tc, ta, tb);                                                 \
        AMX_STORE(tc, C, 64);                                                        \
    } while (0)

/* Blocks [b0, b0+kb) of one 16-row group for mt (<= 16) tokens at x, accumulated into
 * out (s starts at 0 when first). Two tile sets take even and odd blocks so one block's
 * tile work overlaps the other's float step. mt is a constant (16) for whole tiles, so
 * the accumulators stay in registers. */
static inline __attribute__((always_inline)) void
amx_cols(const int kind, const uint8_t (*B)[512], const float (*wd)[16],
         const float (*wm)[16], int b0, int kb, const uint8_t *x, size_t xs, const int mt,
         float *out, size_t os, __mmask16 keep, int first) {
    int32_t C0[16][16], C1[16][16];
    float xd[AMX_KB][16], xsum[AMX_KB][16];
    __m512 s[16];
#pragma GCC unroll 16
    for (int c = 0; c < 16; c++) /* all 16 set: gcc cannot see that only mt are read */
        s[c] = first || c >= mt ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(keep, out + (size_t)c * os);
    amx_config(AMX_CFG_BLOCK, mt);
    const size_t xb = amx_xb(kind);
    amx_xscales(kind, x + (size_t)b0 * xb, xs, mt, kb, xd, xsum);
    int b = 0;
    for (; b + 2 <= kb; b += 2) {
        const uint8_t *x0 = x + (size_t)(b0 + b) * xb;
        AMX_BLOCK(kind, 0, 1, 2, x0, xs, B[b], C0);
        AMX_BLOCK(kind, 3, 4, 5, x0 + xb, xs, B[b + 1], C1);
        amx_epilogue(kind, (const int32_t (*)[16])C0, mt, xd[b], xsum[b], wd[b], wm[b], s);
        amx_epilogue(kind, (const int32_t (*)[16])C1, mt, xd[b + 1], xsum[b + 1], wd[b + 1],
                     wm[b + 1], s);
    }
    if (b < kb) {
        const uint8_t *x0 = x + (size_t)(b0 + b) * xb;
        AMX_BLOCK(kind, 0, 1, 2, x0, xs, B[b], C0);
        amx_epilogue(kind, (const int32_t (*)[16])C0, mt, xd[b], xsum[b], wd[b], wm[b], s);
    }
#pragma GCC unroll 16
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

/* Row l of a 16-row group. A whole group (uni) is evenly spaced: row 4j+k is at
 * r[k] + g4[j] (g4 = 0, 4, 8, 12 row strides), which needs 7 registers where 16
 * pointers spill; a last partial group goes through r[l] (rows past nr repeat the
 * last one). */
static inline __attribute__((always_inline)) const uint8_t *
amx_row(const int uni, const uint8_t *const *r, const size_t *g4, int l) {
    return uni ? r[l & 3] + g4[l >> 2] : r[l];
}

/* 16 bytes at offset o of rows k, 4+k, 8+k, 12+k (one per 128-bit lane). */
static inline __attribute__((always_inline)) __m512i
amx_load4(const int uni, const uint8_t *const *r, const size_t *g4, int k, size_t o) {
    __m512i q = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(amx_row(uni, r, g4, k) + o)));
    q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(amx_row(uni, r, g4, 4 + k) + o)), 1);
    q = _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(amx_row(uni, r, g4, 8 + k) + o)), 2);
    return _mm512_inserti32x4(q, _mm_loadu_si128((const __m128i *)(amx_row(uni, r, g4, 12 + k) + o)), 3);
}

/* 32 bytes at offset o of rows lo (low half) and hi (high half). */
static inline __attribute__((always_inline)) __m512i
amx_load2(const int uni, const uint8_t *const *r, const size_t *g4, int lo, int hi, size_t o) {
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(amx_row(uni, r, g4, lo) + o))),
        _mm256_loadu_si256((const __m256i *)(amx_row(uni, r, g4, hi) + o)), 1);
}

/* The exact int dot of block o of 16 rows with the activation block's qs xq; lane l =
 * row l. Q4_1: 16 packed bytes a row, four rows per vector (one per 128-bit lane),
 * against x's halves broadcast. Q8_0: 32 bytes a row, two per vector (rows 8j+k and
 * 8j+4+k in vector 2k+j), made unsigned (w ^ 0x80 = w + 128) with 128*sum(x) taken
 * off up front; a 128-bit lane shuffle-add first brings each row to 4 dwords. */
static inline __attribute__((always_inline)) __m512i
amx_col_idot(const int kind, const int uni, const uint8_t *const *r, const size_t *g4,
             size_t o, const uint8_t *xq) {
    const __m512i zero = _mm512_setzero_si512();
    __m512i p[4];
    if (kind == AMX_Q4_1) {
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        __m512i xlo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)xq));
        __m512i xhi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xq + 16)));
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) { /* lane g of p[k]: row 4g+k */
            __m512i q = amx_load4(uni, r, g4, k, o + 4);
            __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
            p[k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, lo, xlo), hi, xhi);
        }
    } else {
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)xq));
        __m512i neg = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, flip, xv));
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) { /* lane g of p[k]: row 4g+k */
            __m512i a0 = _mm512_xor_si512(amx_load2(uni, r, g4, k, 4 + k, o + 2), flip);
            __m512i a1 = _mm512_xor_si512(amx_load2(uni, r, g4, 8 + k, 12 + k, o + 2), flip);
            a0 = _mm512_dpbusd_epi32(neg, a0, xv), a1 = _mm512_dpbusd_epi32(neg, a1, xv);
            p[k] = _mm512_add_epi32(_mm512_shuffle_i32x4(a0, a1, 0x88), _mm512_shuffle_i32x4(a0, a1, 0xDD));
        }
    }
    return amx_hsum4x4(p[0], p[1], p[2], p[3]);
}

/* Rows r[0..15] (past nrow: repeats, dropped) against one activation row x. Decode
 * streams each weight once: fetch the same spot of the next 16 rows (ahead = 16 row
 * strides, contiguous after these in a matrix; a prefetch past its end never faults)
 * so memory latency overlaps compute. */
static inline __attribute__((always_inline)) void
amx_col(const int kind, const int uni, int nb, const uint8_t *const *r, size_t ws,
        __m512i idx, int nrow, const uint8_t *x, float *out, size_t ahead) {
    const size_t g4[4] = {0, 4 * ws, 8 * ws, 12 * ws};
    __m512 s = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *xb = x + (size_t)b * amx_xb(kind);
        const size_t o = (size_t)b * amx_wb(kind);
        if (ahead && (o & 63) < amx_wb(kind)) /* once per cache line a block starts in */
#pragma GCC unroll 16
            for (int l = 0; l < 16; l++)
                _mm_prefetch((const char *)amx_row(uni, r, g4, l) + o + ahead, _MM_HINT_T0);
        __m512 fi = _mm512_cvtepi32_ps(amx_col_idot(kind, uni, r, g4, o, xb + amx_xq(kind)));
        __m512i dm = _mm512_i32gather_epi32(idx, r[0] + o, 1);
        __m512 vd = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
        int h;
        memcpy(&h, xb, 4);
        __m128 ds = _mm_cvtph_ps(_mm_cvtsi32_si128(kind == AMX_Q4_1 ? h : h & 0xFFFF));
        s = _mm512_fmadd_ps(fi, _mm512_mul_ps(vd, _mm512_broadcastss_ps(ds)), s);
        if (kind == AMX_Q4_1) {
            __m512 vm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
            s = _mm512_fmadd_ps(vm, _mm512_broadcastss_ps(_mm_movehdup_ps(ds)), s);
        }
    }
    _mm512_mask_storeu_ps(out, (__mmask16)((1u << nrow) - 1), s);
}

/* ---------------------------------------------------------------- dispatch */

static inline __attribute__((always_inline)) void
amx_tile(const int kind, int64_t n, const void *w, size_t ws, int nr, const void *x,
         size_t xs, int nc, float *out, size_t os) {
    const int nb = (int)(n / QK4);
    const uint8_t *W = w, *X = x;
    uint8_t B[AMX_KB][512] __attribute__((aligned(64)));
    float wd[AMX_KB][16], wm[AMX_KB][16];
    for (int r = 0; r < nr; r += 16) {
        int nrow = nr - r < 16 ? nr - r : 16;
        const uint8_t *rp[16];
        for (int l = 0; l < 16; l++) rp[l] = W + (size_t)(r + (l < nrow ? l : nrow - 1)) * ws;
        __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        __m512i idx = _mm512_mullo_epi32(_mm512_min_epi32(lane, _mm512_set1_epi32(nrow - 1)),
                                         _mm512_set1_epi32((int)ws));
        __mmask16 keep = (__mmask16)((1u << nrow) - 1);
        if (nc < AMX_MIN_NC) {
            for (int c = 0; c < nc; c++) {
                const uint8_t *xc = X + (size_t)c * xs;
                float *oc = out + (size_t)c * os + r;
                if (nrow == 16) amx_col(kind, 1, nb, rp, ws, idx, 16, xc, oc, 16 * ws);
                else amx_col(kind, 0, nb, rp, ws, idx, nrow, xc, oc, 0);
            }
            continue;
        }
        for (int b0 = 0; b0 < nb; b0 += AMX_KB) {
            int kb = nb - b0 < AMX_KB ? nb - b0 : AMX_KB;
            const uint8_t *rb[16];
            for (int l = 0; l < 16; l++) rb[l] = rp[l] + (size_t)b0 * amx_wb(kind);
            amx_build_b(kind, rb, idx, kb, B, wd, wm);
            const uint8_t (*cB)[512] = (const uint8_t (*)[512])B;
            const float (*cd)[16] = (const float (*)[16])wd, (*cm)[16] = (const float (*)[16])wm;
            int c = 0;
            for (; c + 16 <= nc; c += 16)
                amx_cols(kind, cB, cd, cm, b0, kb, X + (size_t)c * xs, xs, 16,
                         out + (size_t)c * os + r, os, keep, b0 == 0);
            if (c < nc)
                amx_cols(kind, cB, cd, cm, b0, kb, X + (size_t)c * xs, xs, nc - c,
                         out + (size_t)c * os + r, os, keep, b0 == 0);
        }
    }
}

void amx_q80_blocks(const uint8_t (*B)[512], const float (*wd)[16], int b0, int kb, const uint8_t *x,
                    size_t xs, int nc, float *out, size_t os, __mmask16 keep) {
    int c = 0;
    for (; c + 16 <= nc; c += 16)
        amx_cols(AMX_Q8_0, B, wd, wd, b0, kb, x + (size_t)c * xs, xs, 16, out + (size_t)c * os, os, keep,
                 b0 == 0);
    if (c < nc)
        amx_cols(AMX_Q8_0, B, wd, wd, b0, kb, x + (size_t)c * xs, xs, nc - c, out + (size_t)c * os, os,
                 keep, b0 == 0);
}

#define AMX_DEFINE(name, kind)                                                         \
    static void name##_tile(int64_t n, const void *w, size_t ws, int nr, const void *x, \
                            size_t xs, int nc, float *out, size_t os) {                \
        amx_tile(kind, n, w, ws, nr, x, xs, nc, out, os);                              \
    }                                                                                  \
    static void name##_rows(int64_t n, const void *w, size_t ws, int nr, const void *x, \
                            float *out) {                                              \
        amx_tile(kind, n, w, ws, nr, x, 0, 1, out, 0);                                 \
    }                                                                                  \
    static float name##_dot(int64_t n, const void *w, const void *x) {                 \
        float o;                                                                       \
        amx_tile(kind, n, w, 0, 1, x, 0, 1, &o, 0);                                    \
        return o;                                                                      \
    }
AMX_DEFINE(amx_q41, AMX_Q4_1)
AMX_DEFINE(amx_q80, AMX_Q8_0)

void quant_register_amx(quant_kernels k[QT_COUNT], int all) {
    k[QT_Q4_1].dot = amx_q41_dot;
    k[QT_Q4_1].rows = amx_q41_rows;
    k[QT_Q4_1].tile = amx_q41_tile;
    if (!all) return;
    k[QT_Q8_0].dot = amx_q80_dot;
    k[QT_Q8_0].rows = amx_q80_rows;
    k[QT_Q8_0].tile = amx_q80_tile;
}
