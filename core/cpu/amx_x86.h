/* amx_x86.h: the AMX-INT8 tile instructions and the tile configurations the AMX
 * kernels (quant_amx_avx512.c, qpack_amx_avx512.c) run under. Only for *_avx512.c files:
 * the instructions are inline asm, which gcc and clang (the fuzz build) both take
 * without AMX flags.
 *
 * A thread holds one configuration, so one function loads them all: amx_config(layout,
 * mt) for mt (1..16) tokens, only when the layout or mt changed on this thread (a
 * kernel with its own cache would leave the next kernel's tiles the wrong shape).
 *   AMX_CFG_BLOCK (32-element blocks, Q4_1 and Q8_0):
 *     tiles 0, 3  C: mt x 16 int32 (tokens x weight rows)
 *     tiles 1, 4  A: mt x 32 int8 (a block of each token's activations)
 *     tiles 2, 5  B: 8 x 64 bytes (32 elements of 16 weight rows in VNNI order)
 *   AMX_CFG_WIDE (64 elements a product, the K-quants' two planes, for one 16-row group
 *   or two sharing each A tile):
 *     tiles 0-3   C: mt x 16 int32
 *     tile 4      A: mt x 64 int8
 *     tiles 5-7   B: 16 x 64 bytes */
#ifndef KILN_AMX_X86_H
#define KILN_AMX_X86_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

/* Tile instructions (t: a tile number literal, pasted into the instruction). Loads and
 * stores clobber memory so the compiler keeps C reads after tilestored. */
#define AMX_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
#define AMX_LOAD(t, base, stride) \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t : : "r"(base), "r"((long)(stride)) : "memory")
#define AMX_STORE(t, base, stride) \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" : : "r"(base), "r"((long)(stride)) : "memory")
/* c += a (signed bytes) . b (unsigned bytes); c += a . b, both signed */
#define AMX_DPBSUD(c, a, b) __asm__ volatile("tdpbsud %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define AMX_DPBSSD(c, a, b) __asm__ volatile("tdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

enum { AMX_CFG_BLOCK = 1, AMX_CFG_WIDE = 2 };
void amx_config(int layout, int mt);

#define AMX_KB 32 /* blocks whose B tiles are built at once (16 KB, stays in L1) */

/* 32-element blocks [b0, b0 + kb) of one 16-row group, whose B tiles (signed bytes, VNNI
 * order) and f32 scales wd the caller built, against nc tokens of Q8_0 activations
 * (token c's row at x + c xs) into out (lane r = row r; the running sums from b0 > 0
 * on): per block s = fma((float)(exact int dot), d_w * d_x, s), the arithmetic of Q8_0 in
 * quant_amx_avx512.c and of Q8_0, Q4_0 and Q5_0 in qpack.h. */
void amx_q80_blocks(const uint8_t (*B)[512], const float (*wd)[16], int b0, int kb, const uint8_t *x,
                    size_t xs, int nc, float *out, size_t os, __mmask16 keep);

#endif
