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
#define LOAD _mm512_loadu_ps
#define STORE _mm512_storeu_ps
#define HSUM _mm512_reduce_add_ps
#define ATTN_FN attn_block_avx512
#define ATTN_Q8_FN attn_block_q8_avx512

#include "core/attn_simd.h"
