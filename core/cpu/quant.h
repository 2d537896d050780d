/* quant: tensor element types, dequantization and dot products.
 *
 * Each type has a plain C reference (quant_*_ref) and SIMD paths chosen at run time
 * (AVX2, AVX-512/VNNI; scalar fallback). A weight row of type T is dotted against an
 * activation row already quantized to T's "dot type" (Q8_0, Q8_1, Q8_K, BF16 or F32), the
 * integer-dot scheme that keeps decode memory-bound rather than compute-bound. */
#ifndef KILN_QUANT_H
#define KILN_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "core/cpu/qtypes.h" /* enum qtype: QT_F32 .. QT_BF16, GGUF's numbering */

typedef struct {
    const char *name;
    int block;        /* elements per block */
    size_t bytes;     /* bytes per block */
    int dot_type;     /* type the activation row is quantized to for quant_dot */
} quant_traits;

/* NULL for a type this build does not know (callers report it as an error). */
const quant_traits *quant_traits_of(uint32_t type);
/* GGML's name of a type number, also for the types this build cannot run (Q2_K,
 * the IQ formats, ...), so a refusal names what the file holds; NULL for a number
 * GGML does not define either. */
const char *quant_type_name(uint32_t type);
/* Bytes of a row of n elements; 0 if n is not a multiple of the block size or the
 * type is unknown. */
size_t quant_row_size(uint32_t type, int64_t n);

/* Dispatched to the SIMD level in force (core/cpu/isa.h). n is a multiple of the type's block. */
void quant_dequant(uint32_t type, const void *src, float *dst, int64_t n);
/* Quantize an f32 row to a dot type (Q8_0, Q8_1, Q8_K, BF16; F32 is a copy). */
void quant_quantize(uint32_t type, const float *src, void *dst, int64_t n);
/* dot(w, x) where w is a row of `type` and xq a row of quant_traits_of(type)->dot_type. */
float quant_dot(uint32_t type, int64_t n, const void *w, const void *xq);
/* The same dot for nr consecutive weight rows (row stride wstride bytes) against one
 * activation row: out[r] = dot(w + r*wstride, xq). Lets SIMD paths reuse the
 * unpacked activation across rows. */
void quant_dot_rows(uint32_t type, int64_t n, const void *w, size_t wstride, int nr,
                    const void *xq, float *out);
/* Batched micro kernel (prefill): nr weight rows x nc activation rows (row stride
 * xstride bytes): out[c*ostride + r] = dot(w + r*wstride, xq + c*xstride). Batch
 * invariant: each out value is bit-identical to quant_dot (and quant_dot_rows) of
 * that pair at the same SIMD level, whatever nr, nc and the pair's place in the tile. */
void quant_dot_tile(uint32_t type, int64_t n, const void *w, size_t wstride, int nr,
                    const void *xq, size_t xstride, int nc, float *out, size_t ostride);

/* Plain C references, never removed. */
void quant_dequant_ref(uint32_t type, const void *src, float *dst, int64_t n);
void quant_quantize_ref(uint32_t type, const float *src, void *dst, int64_t n);
float quant_dot_ref(uint32_t type, int64_t n, const void *w, const void *xq);

/* Half-precision helpers (IEEE fp16 and bfloat16), exact round-to-nearest-even. */
float quant_f16_to_f32(uint16_t h);
uint16_t quant_f32_to_f16(float f);
float quant_bf16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f);
/* 2^-48 as f32 bits: BF16 as a dot type (activations, and packed BF16 weights) holds
 * smaller magnitudes as zero, so no product or sum of its dot is ever denormal
 * (core/cpu/qpack.h says why). */
#define QUANT_BF16_FLOOR 0x27800000u

#endif
