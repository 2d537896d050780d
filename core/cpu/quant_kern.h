/* quant_kern.h: internals shared by quant.c and its SIMD files (quant_avx2.c,
 * quant_avx512.c). Not part of the public API: block layouts (bit-exact with GGUF /
 * ggml), the per-type kernel table and the hooks each SIMD file fills in. */
#ifndef KILN_QUANT_KERN_H
#define KILN_QUANT_KERN_H

#include "core/cpu/quant.h"

#define QK4 32   /* Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 block */
#define QKK 256  /* K-quant super-block */

/* f16 fields are raw IEEE half bits. Every struct has only 1- and 2-byte members
 * (Q8_K: 4-byte float first), so sizeof equals the GGUF block size with no padding. */
typedef struct { uint16_t d; uint8_t qs[16]; } blk_q4_0;              /* x = d*(q-8) */
typedef struct { uint16_t d, m; uint8_t qs[16]; } blk_q4_1;           /* x = d*q + m */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_0; /* x = d*(q-16) */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_1;
typedef struct { uint16_t d; int8_t qs[32]; } blk_q8_0;               /* x = d*q */
typedef struct { uint16_t d, s; int8_t qs[32]; } blk_q8_1;            /* s = d*sum(qs) */
/* K-quants: 8 sub-blocks of 32 with 6-bit scale/min packed in scales[12]:
 * bytes 0-3 scale 0-3 (+2 high bits of scale 4-7), 4-7 min 0-3 (+2 high bits of min
 * 4-7), 8-11 low nibble: scale 4-7, high nibble: min 4-7. qs: 4 chunks of 32 bytes,
 * chunk c holds sub-block 2c in low nibbles and 2c+1 in high nibbles. */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } blk_q4_k;
/* Q5_K: as Q4_K plus qh[32]: bit j of qh[l] is the 5th bit of sub-block j, element l. */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } blk_q5_k;
/* Q6_K: 16 sub-blocks of 16, x = d*scales[i/16]*(q-32). Two halves of 128; in half h,
 * element t*32+l (t 0..3) has low 4 bits from ql[h*64 + (t&1)*32 + l] (nibble t>>1)
 * and high 2 bits from qh[h*32 + l] >> 2t. */
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } blk_q6_k;
/* Q8_K: activation type for K-quants. bsums[j] = sum of qs[16j..16j+15]. */
typedef struct { float d; int8_t qs[256]; int16_t bsums[16]; } blk_q8_k;

_Static_assert(sizeof(blk_q4_0) == 18, "q4_0");
_Static_assert(sizeof(blk_q4_1) == 20, "q4_1");
_Static_assert(sizeof(blk_q5_0) == 22, "q5_0");
_Static_assert(sizeof(blk_q5_1) == 24, "q5_1");
_Static_assert(sizeof(blk_q8_0) == 34, "q8_0");
_Static_assert(sizeof(blk_q8_1) == 36, "q8_1");
_Static_assert(sizeof(blk_q4_k) == 144, "q4_k");
_Static_assert(sizeof(blk_q5_k) == 176, "q5_k");
_Static_assert(sizeof(blk_q6_k) == 210, "q6_k");
_Static_assert(sizeof(blk_q8_k) == 292, "q8_k");

typedef void (*qk_dequant_fn)(const void *src, float *dst, int64_t n);
typedef void (*qk_quant_fn)(const float *src, void *dst, int64_t n);
typedef float (*qk_dot_fn)(int64_t n, const void *w, const void *xq);
typedef void (*qk_rows_fn)(int64_t n, const void *w, size_t wstride, int nr,
                           const void *xq, float *out);
typedef void (*qk_tile_fn)(int64_t n, const void *w, size_t wstride, int nr,
                           const void *xq, size_t xstride, int nc, float *out,
                           size_t ostride);

/* One row per type and dispatch slot (core/cpu/isa.h: a level, or AVX-512 with AMX). A
 * NULL entry a register function leaves means "use the level below" (the table is
 * filled bottom-up, so after setup no entry is NULL).
 * Batch invariance: at one level, dot, rows and tile must give the same bits for a
 * (weight row, activation row) pair whatever nr, nc and the pair's place in the tile
 * (same operations in the same order), so a sequence's output does not depend on its
 * batch. A level that brings a rows or tile kernel builds them on the same per-pair
 * arithmetic as its dot (tests/unit/test_quant.c checks it: "batch invariance"). */
typedef struct {
    qk_dequant_fn dequant;
    qk_quant_fn quantize;
    qk_dot_fn dot;
    qk_rows_fn rows;   /* NULL: generic loop over dot */
    qk_tile_fn tile;   /* NULL: generic loop over rows */
} quant_kernels;

/* Each SIMD file overwrites the entries it implements. */
void quant_register_avx2(quant_kernels k[QT_COUNT]);
void quant_register_avx512(quant_kernels k[QT_COUNT]);
/* AMX (quant_amx_avx512.c): Q4_1, and Q8_0 when all. */
void quant_register_amx(quant_kernels k[QT_COUNT], int all);

/* 6-bit scale j and min j of a Q4_K/Q5_K scales[12] array. */
static inline void quant_scale_min_k4(int j, const uint8_t *s, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Q6_K value at element e (0..255) of a block, already minus 32. */
static inline int quant_q6k_get(const blk_q6_k *b, int e) {
    int h = e / 128, t = (e % 128) / 32, l = e % 32;
    int lo = (b->ql[h * 64 + (t & 1) * 32 + l] >> ((t >> 1) * 4)) & 0xF;
    int hi = (b->qh[h * 32 + l] >> (2 * t)) & 3;
    return (lo | (hi << 4)) - 32;
}

#endif
