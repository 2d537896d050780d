/* attn_avx512: the attention block with 16-lane AVX-512 vectors (see attn_simd.h). */
#include <immintrin.h>
#include <stdint.h>

#include "core/attn.h"

#define VEC __m512
#define W 16
#define LOADH(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define LOADB(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
#define SET1 _mm512_set1_ps
#define ZERO _mm512_setzero_ps
#define FMA _mm512_fmadd_ps
#define MUL _mm512_mul_ps
#define ADD _mm512_add_ps
#define SUB _mm512_sub_ps
#define MAXV _mm512_max_ps
#define RINT(v) _mm512_roundscale_ps((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define LDEXP(e, k) _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(e), \
                                        _mm512_slli_epi32(_mm512_cvtps_epi32(k), 23)))
#define ZERO_BELOW(x, lim, e) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask((x), SET1(lim), _CMP_GE_OQ), (e))
#define LOAD _mm512_loadu_ps
#define STORE _mm512_storeu_ps
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
