/* qpack_amx: the packed K-quant tiles (Q4_K, Q5_K and Q6_K x Q8_K, layouts and
 * arithmetic in qpack.h) with AMX-INT8, for steps of several tokens; fewer go to the
 * AVX-512 kernels, which build nothing.
 *
 * Why: the AVX-512 tile spends a vpdpbusd per 4 elements of 16 rows and one token, and a
 * prompt's matrices are most of a prefill. One tile product does 64 elements of 16 rows
 * for 16 tokens.
 *
 * The sub-block scales go into B, so each super-block is a few products over its whole
 * 256 elements instead of one per sub-block with a vector multiply by the scale after
 * each. A scale times a weight does not fit a byte, so the scale is split into digits
 * that do, one B "plane" per digit:
 *   Q4_K, Q5_K  sc = s0 + 8 s1 (s0, s1 in 0..7: q s <= 31 * 7 = 217, unsigned)
 *               sumq = P0 + 8 P1; the mins stay on the vector unit (a vpdpwssd of
 *               the rows' mins against the token's sub-block sums, 4 per token): a
 *               plane of them costs the tile unit a third more for 8 products a row
 *   Q6_K        the product itself: p = q sc (q = u - 32 in -32..31, sc in -128..127,
 *               |p| <= 4096) as a 16-bit word, split into its low byte b0 (signed) and
 *               b1 = (p - b0) / 256 in -16..16, so p = b0 + 256 b1
 *               sumq = P0 + 256 P1 (two planes; the scale's base-7 digits took three,
 *               each a multiply of its own)
 * where Pk = sum over the super-block of (plane k's byte of the element) x activation,
 * exact in the tile's int32. These are the integers qpack.h
 * defines (sum_j sc_j x sub-block dot, and for Q6_K the dot of u - 32 is the
 * reference's i - 32 bsums), then the same FMAs in the same order per super-block: the
 * reference's bits, and the AVX-512 kernels', so a token's result does not depend on
 * whether its step took this path (batch invariance).
 *
 * B planes are built once per 16-row group and super-block (VNNI order: dword r of
 * tile row k = row r's elements 4k..4k+3, which is how the packed chunks already lie)
 * and serve every group of 16 tokens; A tiles are the Q8_K rows' qs, loaded in place.
 * They are built QA_KB super-blocks at a time, so each token group then reads its
 * activations for those in one pass and keeps its sums in registers across them, and
 * for two 16-row groups at once where the task has them, so each A tile serves both. */
#include <immintrin.h>
#include <string.h>

#include "core/cpu/amx_x86.h"
#include "core/cpu/qpack.h"
#include "core/cpu/qpack_x86.h"
#include "core/cpu/quant_kern.h"

#define QA_INLINE static inline __attribute__((always_inline))
#define QA_UNROLL _Pragma("GCC unroll 16")
/* Tokens from which the tiles pay for building B (fewer: the AVX-512 kernels, which
 * build nothing), measured in decode steps of the 1B shapes on an AMX Xeon: at 8 / 12 /
 * 16 streams Q4_K_M ran 121 / 132 / 146 tok/s with this at 13 against 99 / 123 / 147 at
 * the 6 (Q4_K, Q5_K) and 12 (Q6_K) measured before in cache, Q5_K_M 115 / 127 / 142
 * against 93 / 115 / 143; Q6_K at 12 streams 116 on AVX-512 against 107 on the tiles, at
 * 14 streams 121 on the tiles against 117. In cache the tiles win from fewer tokens:
 * there the builders read no memory. */
#define QA_MIN_NC 13

enum { QA_Q4K, QA_Q5K, QA_Q6K };

QA_INLINE size_t qa_gblk(const int kind) {
    return kind == QA_Q6K ? QP_Q6K_GBLK : kind == QA_Q5K ? QP_Q5K_GBLK : QP_Q4K_GBLK;
}

/* Per dword lane r, v's lane in both 16-bit halves: a per-row factor for vpmullw. */
QA_INLINE __m512i qa_pair16(__m512i v) {
    return _mm512_or_si512(_mm512_and_si512(v, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(v, 16));
}

/* Bytes w (each < 32) times the per-row factor f (< 8, qa_pair16): a product below 256
 * never carries into its neighbour byte, so one 16-bit multiply does both. */
QA_INLINE __m512i qa_mul_u8(__m512i w, __m512i f) { return _mm512_mullo_epi16(w, f); }

/* Q4_K, Q5_K planes of one group-block: B + 4096 k, tile row 8 j + e for sub-block j.
 * The builders (and qb_build) read the weights from memory in a step of a few dozen
 * tokens, so they ask for them ahead as the AVX-512 kernels do (qpack_x86.h). */
QA_INLINE void qa_build_k45(const int kind, const uint8_t *gb, uint8_t *B) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m7 = _mm512_set1_epi32(7);
    QA_UNROLL for (int p = 0; p < 4; p++) { /* sub-blocks 2p (low nibbles) and 2p + 1 */
        qp_prefetch_part(gb, qa_gblk(kind), p, 4);
        __m512i f[2][2];
        QA_UNROLL for (int h = 0; h < 2; h++) {
            __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(gb + QP_Q4K_SC + 16 * (2 * p + h))));
            f[h][0] = qa_pair16(_mm512_and_si512(sc, m7));
            f[h][1] = qa_pair16(_mm512_srli_epi32(sc, 3));
        }
        QA_UNROLL for (int k = 0; k < 8; k++) {
            __m512i v = _mm512_loadu_si512((const void *)(gb + QP_Q4K_Q + 64 * (8 * p + k)));
            __m512i q[2] = {_mm512_and_si512(v, m4), _mm512_and_si512(_mm512_srli_epi16(v, 4), m4)};
            if (kind == QA_Q5K) {
                __m512i hb = _mm512_loadu_si512((const void *)(gb + QP_Q5K_QH + 64 * k));
                q[0] = _mm512_or_si512(q[0], q5_bit4(hb, 2 * p));
                q[1] = _mm512_or_si512(q[1], q5_bit4(hb, 2 * p + 1));
            }
            QA_UNROLL for (int h = 0; h < 2; h++) {
                uint8_t *row = B + 64 * (8 * (2 * p + h) + k);
                _mm512_store_si512((void *)row, qa_mul_u8(q[h], f[h][0]));
                _mm512_store_si512((void *)(row + 4096), qa_mul_u8(q[h], f[h][1]));
            }
        }
    }
}

/* Q6_K planes of one group-block: B + 4096 k, tile row 4 j + t for sub-block j. Chunk
 * h (0..15) and 16 + h, 32 + h, 48 + h are row h % 4 of sub-blocks h / 4 + 4 q. The
 * products q sc are 16-bit words: even bytes' and odd bytes' apart, each sign-extended. */
QA_INLINE void qa_build_q6k(const uint8_t *gb, uint8_t *B) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30), k32 = _mm512_set1_epi8(32);
    const __m512i k128 = _mm512_set1_epi16(128), hi8 = _mm512_set1_epi16((short)0xFF00);
    QA_UNROLL for (int h = 0; h < 16; h++) {
        qp_prefetch_part(gb, QP_Q6K_GBLK, h, 16);
        __m512i a = _mm512_loadu_si512((const void *)(gb + QP_Q6K_QL + 64 * h));
        __m512i bq = _mm512_loadu_si512((const void *)(gb + QP_Q6K_QL + 64 * (16 + h)));
        __m512i hb = _mm512_loadu_si512((const void *)(gb + QP_Q6K_QH + 64 * h));
        __m512i u[4] = {
            _mm512_or_si512(_mm512_and_si512(a, m4), _mm512_and_si512(_mm512_slli_epi16(hb, 4), m30)),
            _mm512_or_si512(_mm512_and_si512(bq, m4), _mm512_and_si512(_mm512_slli_epi16(hb, 2), m30)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(a, 4), m4), _mm512_and_si512(hb, m30)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(bq, 4), m4),
                            _mm512_and_si512(_mm512_srli_epi16(hb, 2), m30)),
        };
        QA_UNROLL for (int q = 0; q < 4; q++) {
            const int j = h / 4 + 4 * q;
            __m512i w = _mm512_sub_epi8(u[q], k32);
            __m512i f = qa_pair16(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(gb + QP_Q6K_SC + 16 * j))));
            __m512i pe = _mm512_mullo_epi16(_mm512_srai_epi16(_mm512_slli_epi16(w, 8), 8), f);
            __m512i po = _mm512_mullo_epi16(_mm512_srai_epi16(w, 8), f);
            __m512i b0 = _mm512_mask_blend_epi8((__mmask64)0xAAAAAAAAAAAAAAAAull, pe, _mm512_slli_epi16(po, 8));
            __m512i b1 = _mm512_or_si512(_mm512_srli_epi16(_mm512_add_epi16(pe, k128), 8),
                                         _mm512_and_si512(_mm512_add_epi16(po, k128), hi8));
            uint8_t *row = B + 64 * (4 * j + h % 4);
            _mm512_store_si512((void *)row, b0);
            _mm512_store_si512((void *)(row + 4096), b1);
        }
    }
}

/* Tile c (a literal) += A (tile 4) . tile b: signed planes for Q6_K, unsigned ones for
 * Q4_K and Q5_K. */
#define QA_DP(kind, c, b)                          \
    do {                                           \
        if ((kind) == QA_Q6K) AMX_DPBSSD(c, 4, b); \
        else AMX_DPBSUD(c, 4, b);                  \
    } while (0)

/* The two planes' sums for mt tokens (A: token 0's qs at x, stride xs) into C[k][c][r]:
 * four products of 64 elements per plane, accumulated in the tile. */
QA_INLINE void qa_dots(const int kind, const uint8_t *B, const uint8_t *x, size_t xs,
                       int32_t (*C)[16][16]) {
    AMX_ZERO(0);
    AMX_ZERO(1);
    QA_UNROLL for (int i = 0; i < 4; i++) {
        const uint8_t *b = B + 1024 * i;
        AMX_LOAD(4, x + 4 + 64 * i, xs);
        AMX_LOAD(5, b, 64);
        AMX_LOAD(6, b + 4096, 64);
        QA_DP(kind, 0, 5);
        QA_DP(kind, 1, 6);
    }
    AMX_STORE(0, C[0], 64);
    AMX_STORE(1, C[1], 64);
}

/* Plane p into tile 7, then tile t += A . it. */
#define QA_PLANE(kind, t, p)  \
    do {                      \
        AMX_LOAD(7, p, 64);   \
        QA_DP(kind, t, 7);    \
    } while (0)

/* The same for two 16-row groups (planes B0, B1), into C[0 .. 2) and C[2 .. 4): each A
 * tile serves both groups, so a step's activations are read once per 32 rows (for a
 * long prompt they come from L2 or memory: per 16 rows they cost more than the
 * products). */
QA_INLINE void qa_dots2(const int kind, const uint8_t *B0, const uint8_t *B1, const uint8_t *x,
                        size_t xs, int32_t (*C)[16][16]) {
    AMX_ZERO(0);
    AMX_ZERO(1);
    AMX_ZERO(2);
    AMX_ZERO(3);
    QA_UNROLL for (int i = 0; i < 4; i++) {
        const uint8_t *b = B0 + 1024 * i, *c = B1 + 1024 * i;
        AMX_LOAD(4, x + 4 + 64 * i, xs);
        QA_PLANE(kind, 0, b);
        QA_PLANE(kind, 1, b + 4096);
        QA_PLANE(kind, 2, c);
        QA_PLANE(kind, 3, c + 4096);
    }
    AMX_STORE(0, C[0], 64);
    AMX_STORE(1, C[1], 64);
    AMX_STORE(2, C[2], 64);
    AMX_STORE(3, C[3], 64);
}

/* The float steps of one super-block (group-block gb) for mt tokens whose plane sums
 * are in C (x: token 0's Q8_K block, stride xs) onto the running sums acc (lane r = row
 * r, one register per token). */
QA_INLINE void qa_finish(const int kind, const uint8_t *gb, int32_t (*C)[16][16], const uint8_t *x,
                         size_t xs, const int mt, __m512 *acc) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
    const __m512 dm = kind == QA_Q6K ? d : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gb + 32)));
    __m512i mn[4];
    if (kind != QA_Q6K)
        QA_UNROLL for (int p = 0; p < 4; p++)
            mn[p] = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(gb + QP_Q4K_MN + 32 * p)));
    QA_UNROLL for (int c = 0; c < 16; c++) {
        if (c >= mt) break;
        const blk_q8_k *xb = (const blk_q8_k *)(x + (size_t)c * xs);
        __m512i p0 = _mm512_load_si512((const void *)C[0][c]), p1 = _mm512_load_si512((const void *)C[1][c]);
        __m512i sq = _mm512_add_epi32(p0, _mm512_slli_epi32(p1, kind == QA_Q6K ? 8 : 3));
        const __m512 dx = _mm512_set1_ps(xb->d);
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sq), _mm512_mul_ps(d, dx), acc[c]);
        if (kind != QA_Q6K)
            acc[c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(qp_kmins(xb->bsums, mn)), _mm512_mul_ps(dm, dx), acc[c]);
    }
}

/* Super-blocks whose planes are built at once (128 KB a 16-row group, in L2):
 * each token group then reads its activations for them in one pass, and its sums stay
 * in registers. Stack: two groups' planes, 256 KB (worker threads have 4 MB). */
#define QA_KB 16
#define QA_PLANES 2 /* planes a super-block takes in the buffer */
#define QA_GROUP_B ((size_t)QA_KB * QA_PLANES * 4096) /* one 16-row group's planes */

/* Super-blocks [b0, b0 + kb) of R (1 or 2) 16-row groups (g: the first's group-blocks,
 * the second's gs bytes on; B: their planes, QA_GROUP_B apart) for mt tokens (x: token
 * 0's row, stride xs) into out (lane r = row r, the second group's rows 16 floats on;
 * the running sums from b0 > 0 on; keep: the last group's rows). The tile products of
 * the next super-block go before the float steps of this one, so the tile stores are
 * done by the time the vector loads read them. R and mt are constants for whole token
 * groups, so the sums stay in registers. */
QA_INLINE void qa_cols(const int kind, const int R, const uint8_t *g, size_t gs, const uint8_t *B,
                       int64_t b0, int kb, const uint8_t *x, size_t xs, const int mt, float *out,
                       size_t os, __mmask16 keep) {
    const size_t gblk = qa_gblk(kind), xb = sizeof(blk_q8_k);
    int32_t C[2][2 * QA_PLANES][16][16] __attribute__((aligned(64)));
    __m512 acc[2][16];
    QA_UNROLL for (int h = 0; h < R; h++) {
        __mmask16 m = h == R - 1 ? keep : (__mmask16)0xFFFF;
        QA_UNROLL for (int c = 0; c < 16; c++) /* all 16 set: gcc cannot see that only mt are read */
            acc[h][c] = b0 == 0 || c >= mt ? _mm512_setzero_ps()
                                           : _mm512_maskz_loadu_ps(m, out + (size_t)c * os + 16 * h);
    }
    amx_config(AMX_CFG_WIDE, mt);
    for (int b = -1; b < kb; b++) {
        if (b + 1 < kb) {
            const uint8_t *Bb = B + (size_t)(b + 1) * QA_PLANES * 4096, *xn = x + (size_t)(b0 + b + 1) * xb;
            if (R == 2) qa_dots2(kind, Bb, Bb + QA_GROUP_B, xn, xs, C[(b + 1) & 1]);
            else qa_dots(kind, Bb, xn, xs, C[(b + 1) & 1]);
        }
        if (b < 0) continue;
        QA_UNROLL for (int h = 0; h < R; h++)
            qa_finish(kind, g + h * gs + (size_t)(b0 + b) * gblk, C[b & 1] + QA_PLANES * h,
                      x + (size_t)(b0 + b) * xb, xs, mt, acc[h]);
    }
    QA_UNROLL for (int h = 0; h < R; h++) {
        __mmask16 m = h == R - 1 ? keep : (__mmask16)0xFFFF;
        QA_UNROLL for (int c = 0; c < 16; c++) {
            if (c >= mt) break;
            _mm512_mask_storeu_ps(out + (size_t)c * os + 16 * h, m, acc[h][c]);
        }
    }
}

/* Every token group of nc columns over the planes of R groups' super-blocks [b0, b0 + kb). */
QA_INLINE void qa_groups(const int kind, const int R, const uint8_t *g, size_t gs, const uint8_t *B,
                         int64_t b0, int kb, const uint8_t *X, size_t xs, int nc, float *out,
                         size_t os, __mmask16 keep) {
    int c = 0;
    for (; c + 16 <= nc; c += 16)
        qa_cols(kind, R, g, gs, B, b0, kb, X + (size_t)c * xs, xs, 16, out + (size_t)c * os, os, keep);
    if (c < nc)
        qa_cols(kind, R, g, gs, B, b0, kb, X + (size_t)c * xs, xs, nc - c, out + (size_t)c * os, os, keep);
}

/* Rows [r0, r0 + nr) x nc columns: per pair of 16-row groups (a lone last one alone) and
 * QA_KB super-blocks, the planes built once, then every group of up to 16 tokens over
 * them; out holds the running sums between chunks of super-blocks (the same float steps
 * in the same order as a register would: the reference's bits, whichever groups share
 * a pass). */
QA_INLINE void qa_tile(const int kind, int64_t n, const void *wp, int r0, int nr, const void *xq,
                       size_t xs, int nc, float *out, size_t os) {
    const int64_t nb = n / QKK;
    const size_t gblk = qa_gblk(kind), gs = (size_t)nb * gblk;
    const uint8_t *W = wp, *X = xq;
    uint8_t B[2 * QA_GROUP_B] __attribute__((aligned(64)));
    for (int r = 0; r < nr; r += 2 * QP_ROWS) {
        const uint8_t *g = W + (size_t)((r0 + r) / QP_ROWS) * gs;
        int left = nr - r, R = left > QP_ROWS ? 2 : 1;
        left -= (R - 1) * QP_ROWS;
        __mmask16 keep = left >= QP_ROWS ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        for (int64_t b0 = 0; b0 < nb; b0 += QA_KB) {
            int kb = nb - b0 < QA_KB ? (int)(nb - b0) : QA_KB;
            for (int h = 0; h < R; h++)
                for (int b = 0; b < kb; b++) {
                    uint8_t *Bb = B + h * QA_GROUP_B + (size_t)b * QA_PLANES * 4096;
                    const uint8_t *gb = g + h * gs + (size_t)(b0 + b) * gblk;
                    if (kind == QA_Q6K) qa_build_q6k(gb, Bb);
                    else qa_build_k45(kind, gb, Bb);
                }
            if (R == 2) qa_groups(kind, 2, g, gs, B, b0, kb, X, xs, nc, out + r, os, keep);
            else qa_groups(kind, 1, g, gs, B, b0, kb, X, xs, nc, out + r, os, keep);
        }
    }
}

/* ---------------------------------------------------------------- Q8_0, Q4_0, Q5_0 */

/* The 32-element types against Q8_0 activations: per block an exact int dot and one FMA
 * (qpack.h), which is Q8_0's arithmetic in quant_amx_avx512.c once the weights are
 * signed bytes: Q8_0's q (packed as q + 128), Q4_0's q - 8, Q5_0's q - 16. Their B
 * tiles are built here, AMX_KB blocks at a time; the tiles run there. */
enum { QB_Q80, QB_Q40, QB_Q50 };

/* Bytes of one 16-row group's packed row of nb GGUF blocks. */
QA_INLINE size_t qb_group_bytes(const int kind, int64_t nb) {
    return kind == QB_Q80 ? (size_t)nb * QP_Q80_GBLK : (size_t)(nb / 2) * (kind == QB_Q40 ? QP_Q40_GBLK : QP_Q50_GBLK);
}

/* The B tile and scales of GGUF block b of group g. */
QA_INLINE void qb_build(const int kind, const uint8_t *g, int64_t b, uint8_t *B, float *wd) {
    if (kind == QB_Q80) {
        const uint8_t *gb = g + b * QP_Q80_GBLK;
        qp_prefetch_part(gb, QP_Q80_GBLK, 0, 1);
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        QA_UNROLL for (int k = 0; k < 8; k++)
            _mm512_store_si512((void *)(B + 64 * k),
                               _mm512_xor_si512(_mm512_load_si512((const void *)(gb + 64 + 64 * k)), flip));
        _mm512_storeu_ps(wd, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb)));
        return;
    }
    const int h = (int)(b & 1), q5 = kind == QB_Q50;
    const uint8_t *gb = g + (b / 2) * (q5 ? QP_Q50_GBLK : QP_Q40_GBLK);
    qp_prefetch_part(gb, q5 ? QP_Q50_GBLK : QP_Q40_GBLK, h, 2);
    const __m512i bias = _mm512_set1_epi8(q5 ? 16 : 8);
    const __m512i h5 = q5 ? _mm512_loadu_si512((const void *)(gb + 64 + 64 * h)) : _mm512_setzero_si512();
    QA_UNROLL for (int k = 0; k < 4; k++) { /* chunk k: elements 4k.. (low), 16 + 4k.. (high) */
        __m512i w[2];
        qp_nibbles(_mm512_loadu_si512((const void *)(gb + (q5 ? 192 : 64) + 256 * h + 64 * k)), q5, h5, k, w);
        _mm512_store_si512((void *)(B + 64 * k), _mm512_sub_epi8(w[0], bias));
        _mm512_store_si512((void *)(B + 64 * (4 + k)), _mm512_sub_epi8(w[1], bias));
    }
    _mm512_storeu_ps(wd, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gb + 32 * h))));
}

QA_INLINE void qb_tile(const int kind, int64_t n, const void *wp, int r0, int nr, const void *xq,
                       size_t xs, int nc, float *out, size_t os) {
    const int64_t nb = n / QK4;
    const size_t gbytes = qb_group_bytes(kind, nb);
    uint8_t B[AMX_KB][512] __attribute__((aligned(64)));
    float wd[AMX_KB][16];
    for (int r = 0; r < nr; r += QP_ROWS) {
        const uint8_t *g = (const uint8_t *)wp + (size_t)((r0 + r) / QP_ROWS) * gbytes;
        int left = nr - r;
        __mmask16 keep = left >= QP_ROWS ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        for (int64_t b0 = 0; b0 < nb; b0 += AMX_KB) {
            int kb = nb - b0 < AMX_KB ? (int)(nb - b0) : AMX_KB;
            for (int b = 0; b < kb; b++) qb_build(kind, g, b0 + b, B[b], wd[b]);
            amx_q80_blocks((const uint8_t (*)[512])B, (const float (*)[16])wd, (int)b0, kb, xq, xs, nc,
                           out + r, os, keep);
        }
    }
}

/* Tokens from which building B pays (fewer: the AVX-512 kernels), measured as QA_MIN_NC
 * in decode steps of the 1B shapes: at 4 to 24 streams the AVX-512 kernels ran Q4_0 87 /
 * 129 / 139 / 151 / 159 tok/s (4, 8, 12, 20, 24) against the tiles' 65 / 102 / 125 / 142 /
 * 156, Q8_0 61 / 93 / 105 / 128 / 140 against 44 / 76 / 94 / 121 / 135; alike at 16 and 32. */
#define QB_MIN_NC 25

void qp_q80_tile_amx(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs, int nc,
                     float *out, size_t os) {
    if (nc < QB_MIN_NC) qp_q80_tile_avx512(n, wp, r0, nr, xq, xs, nc, out, os);
    else qb_tile(QB_Q80, n, wp, r0, nr, xq, xs, nc, out, os);
}

void qp_q40_tile_amx(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs, int nc,
                     float *out, size_t os) {
    if (nc < QB_MIN_NC) qp_q40_tile_avx512(n, wp, r0, nr, xq, xs, nc, out, os);
    else qb_tile(QB_Q40, n, wp, r0, nr, xq, xs, nc, out, os);
}

void qp_q50_tile_amx(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs, int nc,
                     float *out, size_t os) {
    if (nc < QB_MIN_NC) qp_q50_tile_avx512(n, wp, r0, nr, xq, xs, nc, out, os);
    else qb_tile(QB_Q50, n, wp, r0, nr, xq, xs, nc, out, os);
}

/* ---------------------------------------------------------------- dispatch */

void qp_q4k_tile_amx(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs, int nc,
                     float *out, size_t os) {
    if (nc < QA_MIN_NC) qp_q4k_tile_avx512(n, wp, r0, nr, xq, xs, nc, out, os);
    else qa_tile(QA_Q4K, n, wp, r0, nr, xq, xs, nc, out, os);
}

void qp_q5k_tile_amx(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs, int nc,
                     float *out, size_t os) {
    if (nc < QA_MIN_NC) qp_q5k_tile_avx512(n, wp, r0, nr, xq, xs, nc, out, os);
    else qa_tile(QA_Q5K, n, wp, r0, nr, xq, xs, nc, out, os);
}

void qp_q6k_tile_amx(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs, int nc,
                     float *out, size_t os) {
    if (nc < QA_MIN_NC) qp_q6k_tile_avx512(n, wp, r0, nr, xq, xs, nc, out, os);
    else qa_tile(QA_Q6K, n, wp, r0, nr, xq, xs, nc, out, os);
}
