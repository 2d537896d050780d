/* vec_avx2.h: the vector macros of core/cpu/vec.h for 8-lane AVX2 + FMA + F16C, for the
 * files built with AVX2 flags that write their kernels once over these macros
 * (attention, vmath). No include guard: one includer per translation unit. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define VEC __m256
#define W 8
#define LOADH(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define LOADB(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define LOADH_N avx2_loadh_n
#define LOADB_N avx2_loadb_n
#define SET1 _mm256_set1_ps
#define ZERO _mm256_setzero_ps
#define FMA _mm256_fmadd_ps
#define MUL _mm256_mul_ps
#define ADD _mm256_add_ps
#define SUB _mm256_sub_ps
#define MAXV _mm256_max_ps
#define MINV _mm256_min_ps
#define REDUCE_ADD avx2_reduce_add
#define REDUCE_MAX avx2_reduce_max
#define DIV _mm256_div_ps
#define RINT(v) _mm256_round_ps((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define LDEXP(e, k) _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(e), \
                                        _mm256_slli_epi32(_mm256_cvtps_epi32(k), 23)))
#define ZERO_BELOW(x, lim, e) _mm256_and_ps(_mm256_cmp_ps((x), SET1(lim), _CMP_GE_OQ), (e))
#define LOAD _mm256_loadu_ps
#define STORE _mm256_storeu_ps

/* The 8 lanes to one by a tree: 4+4, 2+2, 1+1. */
static inline float avx2_reduce_add(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static inline float avx2_reduce_max(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

/* The first m (< W) elements of p, the other lanes 0 (AVX2 has no masked 16- or 8-bit
 * loads: through a zeroed copy, nothing read past m). */
static inline __m256 avx2_loadh_n(const uint16_t *p, int m) {
    uint16_t t[8] = {0};
    memcpy(t, p, sizeof *p * (size_t)m);
    return LOADH(t);
}

static inline __m256 avx2_loadb_n(const int8_t *p, int m) {
    int8_t t[8] = {0};
    memcpy(t, p, (size_t)m);
    return LOADB(t);
}
