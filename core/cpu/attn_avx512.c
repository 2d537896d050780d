/* attn_avx512: the attention block with 16-lane AVX-512 vectors (see attn_simd.h). */
#include <immintrin.h>
#include <stdint.h>

#include "core/cpu/attn.h"

#include "core/cpu/vec_avx512.h"

#define ATTN_FN attn_block_avx512
#define ATTN_Q8_FN attn_block_q8_avx512

/* [x0+x1, x2+x3, y0+y1, y2+y3] of the quarters of x and y. */
static inline __m512 pair_quarters(__m512 x, __m512 y) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Four RED4 results to 16 sums: twice pair_quarters, key r in lane r. */
static inline __m512 REDW(const __m512 *u) {
    return pair_quarters(pair_quarters(u[0], u[1]), pair_quarters(u[2], u[3]));
}

#include "core/cpu/attn_simd.h"
