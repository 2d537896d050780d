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
#define LOAD _mm256_loadu_ps
#define STORE _mm256_storeu_ps
#define ATTN_FN attn_block_avx2
#define ATTN_Q8_FN attn_block_q8_avx2

static inline float HSUM(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#include "core/attn_simd.h"
