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
 * Ten types have a packed layout: Q4_1 (the default model's layers), Q8_0 (its
 * output matrix), Q4_0, Q5_0, Q5_1, F16, BF16, Q4_K and Q6_K (what a Q4_K_M file is made
 * of) and Q5_K (with Q6_K, a Q5_K_M file). A group of 16
 * rows is stored block by block (for the K-quants, super-block of 256 by super-block);
 * group-blocks are multiples of 64 bytes, so each is 64-byte aligned when the buffer
 * is. The last group's missing rows are zero (their outputs are computed, never stored).
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
 * Q4_0, 576 bytes per group-block of two GGUF blocks (64 elements; 18 bytes per row
 * and block as in GGUF, and 64-byte aligned with no padding, which one block is not):
 *   d[2][16]  block h's f16 scale of row r,
 *   q[2][4][16][4]  block h, chunk k, row r: its qs[4k .. 4k+3] (as Q4_1's). The
 *                   nibbles go in unsigned; the kernels take 8 * (the activation
 *                   block's sum) back off, exactly, as Q8_0's 128.
 * Q5_1, 384 bytes per group-block (24 per row and block, as in GGUF):
 *   d[16], m[16]  f16,  h5[16][4]  row r's 5th bits, byte k for chunk k: bit e for
 *                 element 4k+e (its low nibble), bit 4+e for 16+4k+e (its high one),
 *   q[4][16][4]   as Q4_1's.
 * Q5_0, 704 bytes per group-block of two GGUF blocks (22 per row and block):
 *   d[2][16],  h5[2][16][4] (as Q5_1's, per block),  q[2][4][16][4] (as Q4_0's); the
 *   kernels take 16 * (the activation block's sum) back off.
 * F16, 1024 bytes per group-block of 32 elements: w[8][16][4], chunk q, row r: the
 *   row's elements 4q .. 4q+3 (2 bytes each, as in GGUF). Converted, a 128-bit lane is
 *   one row's four elements, so its four floats are the row's four partial sums (the
 *   arithmetic below): a 512-bit vector holds 4 rows, a 256-bit one 2, and a column's
 *   activations x[4q .. 4q+3], one 16-byte broadcast, serve all of them.
 * BF16, 1024 bytes per group-block of 32 elements: w[4][16][8], chunk q, row r: the
 *   row's elements 8q .. 8q+7, i.e. its pairs 4q .. 4q+3 (a dword each, vdpbf16ps's
 *   operand): a 128-bit lane is one row's four pairs, its four partial sums, as F16's;
 *   magnitudes under 2^-48 (quant.h's QUANT_BF16_FLOOR) stored as zero.
 * Q4_K, 2368 bytes per group-block (148 per row and super-block against GGUF's 144:
 * the 6-bit scales unpacked to bytes, so no kernel decodes them):
 *   d[16], dmin[16]  f16,  sc[8][16]  sub-block j's scale of row r,
 *   mn[4][16][2]  the mins of sub-blocks 2p and 2p+1 side by side (one int16 pair
 *                 per row once widened: a vpdpwssd against the activation's sums),
 *   q[4][8][16][4]  pair p, chunk k, row r: the row's qs[32p + 4k .. +3], i.e.
 *                   elements 4k.. of sub-block 2p (low nibbles) and 2p+1 (high).
 * Q5_K, 2880 bytes per group-block (180 per row against 176): Q4_K's layout, then
 *   qh[8][16][4]  chunk k, row r: the row's qh[4k .. 4k+3]: bit j of a byte is the 5th
 *                 bit of that element of sub-block j, as in GGUF.
 * Q6_K, 3392 bytes per group-block (212 per row against 210: 32 bytes of padding):
 *   d[16]  f16,  32 zero bytes,  sc[16][16]  sub-block j's signed scale of row r,
 *   ql[32][16][4], qh[16][16][4]: chunk ch (elements 4ch..4ch+3, sub-block ch/4) as
 *   unsigned 6-bit values u = q + 32: the low 4 bits in ql[(ch & 15) + 16 * (ch/16 & 1)]
 *   (low nibble for ch < 32, high for ch >= 32), the high 2 bits in qh[ch & 15] at
 *   bit 2 * (ch / 16). One load of qh serves the four chunks ch, ch+16, ch+32, ch+48.
 *
 * Arithmetic (the same at every SIMD level, bit for bit; the C reference is the
 * definition): per row r, column c and block b, with the activation in Q8_1 (d_x, s_x)
 * for Q4_1 and Q5_1 and in Q8_0 (d_x) for Q8_0, Q4_0 and Q5_0
 *   i = sum of the 32 products q_w * q_x        (exact in int32; Q4_0, Q5_0: q_w - 8, - 16)
 *   acc = fmaf((float)i, d_w * d_x, acc)        (d_w * d_x is exact in f32)
 *   acc = fmaf(m_w, s_x, acc)                   (Q4_1 and Q5_1 only)
 * and, per super-block, with the activation in Q8_K (f32 d_x, bsums)
 *   Q4_K, Q5_K: sumq = sum_j sc_j * (sum of sub-block j's products)  (exact in int32)
 *         summ = sum_j mn_j * (bsums[2j] + bsums[2j+1])
 *         acc = fmaf((float)sumq, d_w * d_x, acc); acc = fmaf(-(float)summ, dmin_w * d_x, acc)
 *   Q6_K: sumq = sum_j sc_j * (sum of sub-block j's products u * q_x - 32 * bsums[j])
 *         acc = fmaf((float)sumq, d_w * d_x, acc)
 * and for F16, with f32 activations x, four partial sums by element index
 *   s[k % 4] = fmaf(w_k, x_k, s[k % 4]) for k in order; dot = (s0 + s1) + (s2 + s3)
 * and for BF16, with BF16 activations x (quant.c's q_bf16: rounded to nearest even,
 * magnitudes under 2^-48 to zero), four partial sums by pair index, the odd element first
 *   s[p % 4] = fmaf(w_2p+1, x_2p+1, s[p % 4]); s[p % 4] = fmaf(w_2p, x_2p, s[p % 4])
 *   for p in order; dot = (s0 + s1) + (s2 + s3)
 * from acc = 0, blocks in order. Every (row, column) pair goes through exactly these
 * operations whatever the tile shape, its place in it, or the batch: batch invariant.
 *
 * BF16 is vdpbf16ps's arithmetic: it does two of those fmaf per lane, odd element first,
 * with denormal inputs and results flushed to zero (so on the Intel and AMD parts
 * measured, tests/bench/tdpbf16ps.c; test_qpack holds the vdpbf16ps kernel to the
 * reference wherever it runs).
 * The floor keeps the flushing from ever acting: a product of two bf16 at or over
 * 2^-48 is exact in f32 and a multiple of 2^-110, and so is every rounded sum of them,
 * never under 2^-126 unless zero. So plain FMAs give vdpbf16ps's bits, and each CPU
 * runs whichever is faster: vdpbf16ps where it issues as fast as an FMA (AMD, measured
 * on a Zen 5: twice the products per instruction), FMAs on Intel (there it issues at a
 * quarter of vfmadd231ps's rate) and at AVX2.
 *
 * Why F16 is on f32 FMAs, measured on the AMX Xeon (BENCHMARKS.md, 2026-12-06): an F16
 * weight is no bf16, so a bf16 product would need it in two limbs. AMX-BF16's tdpbf16ps
 * has a C mirror (per output: the even and the odd products each summed by fmaf from 0
 * over the instruction's 16 pairs, then C + (even + odd), denormals in and out flushed;
 * tests/bench/tdpbf16ps.c), so F16 could take it with an exact-limb arithmetic of its
 * own (activations in three bf16 limbs, weights in two, six tile products per 32
 * elements). Built and measured, that took the 1B F16 prefill +28% but decode -26%: a
 * step of a few tokens must give the same bits, six FMAs per weight instead of one. */
#ifndef KILN_QPACK_H
#define KILN_QPACK_H

#include <stddef.h>
#include <stdint.h>

#define QP_ROWS 16 /* rows per packed group */

/* Group-block sizes and the K layouts' field offsets, in bytes (shared by the kernels). */
#define QP_Q41_GBLK 320
#define QP_Q80_GBLK 576
#define QP_Q40_GBLK 576
#define QP_Q50_GBLK 704
#define QP_Q51_GBLK 384
#define QP_H16_BLOCK 32
#define QP_H16_GBLK 1024
#define QP_Q4K_GBLK 2368
#define QP_Q4K_SC 64
#define QP_Q4K_MN 192
#define QP_Q4K_Q 320
#define QP_Q5K_GBLK 2880
#define QP_Q5K_QH 2368
#define QP_Q6K_GBLK 3392
#define QP_Q6K_SC 64
#define QP_Q6K_QL 320
#define QP_Q6K_QH 2368

/* 1 when `type` has a packed layout with a fast kernel at the current SIMD level (so a
 * loader should pack it), 0 when the row-major quant_dot_tile is the better path:
 * every packed type from AVX2 up; not Q4_1 or Q8_0 where AMX runs them. */
int qp_wanted(uint32_t type);

#define QP_MAX_N 16384 /* widest Q8_0 / Q4_0 / Q5_0 row packed (the kernels' per-column tables) */

/* Bytes of the packed copy of nr rows of n elements (n a multiple of 32); 0 when the
 * type has no packed layout or n is not a multiple of its block (Q4_0, Q5_0: of 64)
 * or, for Q8_0, Q4_0 and Q5_0, wider than QP_MAX_N. */
size_t qp_bytes(uint32_t type, int64_t n, int nr);
/* Packs nr row-major rows (row stride ws bytes) into dst (qp_bytes of room, 64-byte
 * aligned for the fast kernels). */
void qp_pack(uint32_t type, int64_t n, const void *w, size_t ws, int nr, void *dst);
/* out[c*os + r] = dot(row r0 + r, xq + c*xs) for r < nr and c < nc, where r0 is a
 * multiple of QP_ROWS and xq holds rows of the type's dot type (Q8_1 for Q4_1, Q8_0
 * for Q8_0, Q8_K for the K-quants, F32 for F16, BF16 for BF16). Runs the fastest kernel of the current SIMD level (the reference where
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
void qp_q40_tile_avx512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                        int nc, float *out, size_t os);
void qp_q50_tile_avx512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                        int nc, float *out, size_t os);
void qp_q51_tile_avx512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                        int nc, float *out, size_t os);
void qp_f16_tile_avx512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                        int nc, float *out, size_t os);
void qp_bf16_tile_avx512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                         int nc, float *out, size_t os);
/* qp_bf16_tile_avx512 runs one of these by isa_dpbf16(): FMAs, or vdpbf16ps (only
 * where the CPU has AVX512_BF16); the same bits. */
void qp_bf16_tile_fma512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                         int nc, float *out, size_t os);
void qp_bf16_tile_dpbf16(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                         int nc, float *out, size_t os);
void qp_q4k_tile_avx512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                        int nc, float *out, size_t os);
void qp_q5k_tile_avx512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                        int nc, float *out, size_t os);
void qp_q6k_tile_avx512(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                        int nc, float *out, size_t os);
/* AMX-INT8 tiles for Q8_0, Q4_0, Q5_0 and the K-quants (qpack_amx_avx512.c), the
 * reference's bits as every kernel here: for steps of 13 tokens or more (the K-quants;
 * 25 for the 32-element types), fewer go to the AVX-512 kernels. Only called where the
 * CPU has AMX and the kernel allows it (isa.h). */
void qp_q80_tile_amx(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs, int nc,
                     float *out, size_t os);
void qp_q40_tile_amx(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs, int nc,
                     float *out, size_t os);
void qp_q50_tile_amx(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs, int nc,
                     float *out, size_t os);
void qp_q4k_tile_amx(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs, int nc,
                     float *out, size_t os);
void qp_q5k_tile_amx(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs, int nc,
                     float *out, size_t os);
void qp_q6k_tile_amx(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs, int nc,
                     float *out, size_t os);
/* The AVX2 kernels (qpack_avx2.c). Q8_0's biased bytes times the activations would
 * overflow vpmaddubsw's 16-bit pair sums, so its kernel takes each byte as two nibbles. */
void qp_q41_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                      int nc, float *out, size_t os);
void qp_q80_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                      int nc, float *out, size_t os);
void qp_q40_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                      int nc, float *out, size_t os);
void qp_q50_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                      int nc, float *out, size_t os);
void qp_q51_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                      int nc, float *out, size_t os);
void qp_f16_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                      int nc, float *out, size_t os);
void qp_bf16_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                       int nc, float *out, size_t os);
void qp_q4k_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                      int nc, float *out, size_t os);
void qp_q5k_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                      int nc, float *out, size_t os);
void qp_q6k_tile_avx2(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                      int nc, float *out, size_t os);

#endif
