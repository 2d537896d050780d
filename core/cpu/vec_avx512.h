/* vec_avx512.h: the vector macros of core/cpu/vec.h for 16-lane AVX-512 (F, DQ), for the
 * files built with AVX-512 flags that write their kernels once over these macros
 * (attention, vmath). No include guard: one includer per translation unit. */
#include <immintrin.h>

#define VEC __m512
#define W 16
#define LOADH(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define LOADB(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
/* The first m (< W) elements of p, the other lanes 0: masked loads, nothing read past m. */
#define LOADH_N(p, m) _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((__mmask16)((1u << (m)) - 1), (p)))
#define LOADB_N(p, m) \
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8((__mmask16)((1u << (m)) - 1), (p))))
#define SET1 _mm512_set1_ps
#define ZERO _mm512_setzero_ps
#define FMA _mm512_fmadd_ps
#define MUL _mm512_mul_ps
#define ADD _mm512_add_ps
#define SUB _mm512_sub_ps
#define MAXV _mm512_max_ps
#define MINV _mm512_min_ps
#define REDUCE_ADD _mm512_reduce_add_ps /* trees: 8+8 lanes, 4+4, 2+2, 1+1 */
#define REDUCE_MAX _mm512_reduce_max_ps
#define DIV _mm512_div_ps
#define RINT(v) _mm512_roundscale_ps((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define LDEXP(e, k) _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(e), \
                                        _mm512_slli_epi32(_mm512_cvtps_epi32(k), 23)))
#define ZERO_BELOW(x, lim, e) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask((x), SET1(lim), _CMP_GE_OQ), (e))
#define LOAD _mm512_loadu_ps
#define STORE _mm512_storeu_ps
