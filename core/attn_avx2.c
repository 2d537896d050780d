/* attn_avx2: the attention block with 8-lane AVX2 + F16C vectors (see attn_simd.h). */
#include <immintrin.h>
#include <stdint.h>

#include "core/attn.h"

#define VEC __m256
#define W 8
#define LOADH(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define LOADB(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define SET1 _mm256_set1_ps
#define ZERO _mm256_setzero_ps
#define FMA _mm256_fmadd_ps
#define MUL _mm256_mul_ps
#define ADD _mm256_add_ps
#define SUB _mm256_sub_ps
#define MAXV _mm256_max_ps
#define RINT(v) _mm256_round_ps((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define LDEXP(e, k) _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(e), \
                                        _mm256_slli_epi32(_mm256_cvtps_epi32(k), 23)))
#define ZERO_BELOW(x, lim, e) _mm256_and_ps(_mm256_cmp_ps((x), SET1(lim), _CMP_GE_OQ), (e))
#define LOAD _mm256_loadu_ps
#define STORE _mm256_storeu_ps
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
