/* attn_avx2: the attention block with 8-lane AVX2 + F16C vectors (see attn_simd.h). */
#include <immintrin.h>
#include <stdint.h>

#include "core/attn.h"

#include "core/vec_avx2.h"

#define ATTN_FN attn_block_avx2
#define ATTN_Q8_FN attn_block_q8_avx2

/* Within each 128-bit half: unpack pairs lanes (a0+a2, b0+b2, a1+a3, b1+b3), the
 * shuffles finish each vector's half-sum: [a b c d] per half. */
static inline __m256 RED4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 ab = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    __m256 cd = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
    return _mm256_add_ps(_mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
}

/* Two RED4 results: add their halves, keys 0..3 in the low half, 4..7 in the high. */
static inline __m256 REDW(const __m256 *u) {
    return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
}

#include "core/attn_simd.h"
