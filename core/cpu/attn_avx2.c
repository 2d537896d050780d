/* attn_avx2: the attention block with 8-lane AVX2 + F16C vectors (see attn_simd.h). */
#include <immintrin.h>
#include <stdint.h>

#include "core/cpu/attn.h"

#include "core/cpu/vec_avx2.h"

#define ATTN_FN attn_block_avx2
#define ATTN_Q8_FN attn_block_q8_avx2

#include "core/cpu/attn_simd.h"
