/* qpack: weight matrices repacked, once at load, into the layout the CPU kernels want.
 *
 * GGUF keeps a matrix row-major, block after block of one row. A SIMD dot over that
 * layout finishes each (row, block) pair with a horizontal step: a conversion, a
 * scale permute and an FMA per 32 weights, which is most of the work of a batched
 * step. The packed layout interleaves QP_ROWS rows instead, so that one vector lane
 * is one row: a 512-bit vpdpbusd then advances 16 rows by 4 weights each, the 32
 * weights of a block sum exactly in int32 lanes, and each block costs one conversion
 * and two FMAs per 16 rows.
 *
 * Two types have a packed layout: Q4_1 (the default model's layers) and Q8_0 (its
 * output matrix). A group of 16 rows is stored block by block; group-blocks are
 * multiples of 64 bytes, so each is 64-byte aligned when the buffer is. The last
 * group's missing rows are zero (their outputs are computed, never stored).
 *
 * Q4_1, 320 bytes per group-block (the same 20 bytes per row and block as Q4_1):
 *   d[16]  the rows' f16 scales,  m[16]  their f16 mins,
 *   q[4][16][4]  chunk k, row r: the row's Q4_1 bytes qs[4k .. 4k+3], i.e. elements
 *                4k..4k+3 in the low nibbles and 16+4k..16+4k+3 in the high ones.
 * Q8_0, 576 bytes per group-block (34 per row and block, plus 2 of padding):
 *   d[16]  f16 scales,  32 zero bytes,
 *   q[8][16][4]  chunk k, row r: the row's quants 4k..4k+3 plus 128, as unsigned
 *                bytes: vpdpbusd multiplies unsigned by signed bytes, so the kernels
 *                take 128 * (the activation block's sum) back off, exactly.
 *
 * Arithmetic (the same at every SIMD level, bit for bit; the C reference is the
 * definition): per row r, column c and block b, with the activation in Q8_1 (d_x, s_x)
 * for Q4_1 and in Q8_0 (d_x) for Q8_0
 *   i = sum of the 32 products q_w * q_x        (exact in int32)
 *   acc = fmaf((float)i, d_w * d_x, acc)        (d_w * d_x is exact in f32)
 *   acc = fmaf(m_w, s_x, acc)                   (Q4_1 only)
 * from acc = 0, blocks in order. Every (row, column) pair goes through exactly these
 * operations whatever the tile shape, its place in it, or the batch: batch invariant. */
#ifndef KILN_QPACK_H
#define KILN_QPACK_H

#include <stddef.h>
#include <stdint.h>

#define QP_ROWS 16 /* rows per packed group */

/* 1 when `type` has a packed layout with a fast kernel at the current SIMD level (so a
 * loader should pack it), 0 when the row-major quant_dot_tile is the better path:
 * Q4_1 from AVX2 up, Q8_0 at AVX-512; neither where AMX runs them. */
int qp_wanted(uint32_t type);

#define QP_MAX_N 16384 /* widest Q8_0 row packed (the kernel's per-column tables) */

/* Bytes of the packed copy of nr rows of n elements (n a multiple of 32); 0 when the
 * type has no packed layout or n is not a multiple of its block (or, for Q8_0, wider
 * than QP_MAX_N). */
size_t qp_bytes(uint32_t type, int64_t n, int nr);
/* Packs nr row-major rows (row stride ws bytes) into dst (qp_bytes of room, 64-byte
 * aligned for the fast kernels). */
void qp_pack(uint32_t type, int64_t n, const void *w, size_t ws, int nr, void *dst);
/* out[c*os + r] = dot(row r0 + r, xq + c*xs) for r < nr and c < nc, where r0 is a
 * multiple of QP_ROWS and xq holds rows of the type's dot type (Q8_1 for Q4_1, Q8_0
 * for Q8_0). Runs the fastest kernel of the current SIMD level (the reference where
 * none has one); all give the reference's bits. */
void qp_tile(uint32_t type, int64_t n, const void *wp, int r0, int nr, const void *xq,
             size_t xs, int nc, float *out, size_t os);
/* The plain C definition, never removed. */
void qp_tile_ref(uint32_t type, int64_t n, const void *wp, int r0, int nr, const void *xq,
                 size_t xs, int nc, float *out, size_t os);
/* The AVX-512 VNNI kernels (qpack_avx512.c); only called where the CPU has them. */
void qp_q41_tile_avx512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                        int nc, float *out, size_t os);
void qp_q80_tile_avx512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                        int nc, float *out, size_t os);
/* The AVX2 kernel (qpack_avx2.c), Q4_1 only: Q8_0's biased bytes times the activations
 * would overflow vpmaddubsw's 16-bit sums, so at AVX2 Q8_0 stays row-major. */
void qp_q41_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                      int nc, float *out, size_t os);

#endif
