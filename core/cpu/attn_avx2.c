/* attn_avx2: the attention block with 8-lane AVX2 + F16C vectors (see attn_simd.h). */
#include <immintrin.h>
#include <stdint.h>

#include "core/cpu/attn.h"

#include "core/cpu/vec_avx2.h"

#define ATTN_FN attn_block_avx2
#define ATTN_Q8_FN attn_block_q8_avx2

/* Two RED4 results: add their halves, keys 0..3 in the low half, 4..7 in the high. */
static inline __m256 REDW(const __m256 *u) {
    return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
}

#include "core/cpu/attn_simd.h"
