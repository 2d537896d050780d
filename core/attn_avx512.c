/* attn_avx512: the attention block with 16-lane AVX-512 vectors (see attn_simd.h). */
#include <immintrin.h>
#include <stdint.h>

#include "core/attn.h"

#include "core/vec_avx512.h"

#define ATTN_FN attn_block_avx512
#define ATTN_Q8_FN attn_block_q8_avx512

/* Within each 128-bit quarter: unpack pairs lanes (a0+a2, b0+b2, a1+a3, b1+b3), the
 * shuffles finish each vector's quarter-sum: [a b c d] per quarter. */
static inline __m512 RED4(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    return _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
}

/* [x0+x1, x2+x3, y0+y1, y2+y3] of the quarters of x and y. */
static inline __m512 pair_quarters(__m512 x, __m512 y) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Four RED4 results to 16 sums: twice pair_quarters, key r in lane r. */
static inline __m512 REDW(const __m512 *u) {
    return pair_quarters(pair_quarters(u[0], u[1]), pair_quarters(u[2], u[3]));
}

#include "core/attn_simd.h"
