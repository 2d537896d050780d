/* attn_avx512: the attention block with 16-lane AVX-512 vectors (see attn_simd.h). */
#include <immintrin.h>
#include <stdint.h>

#include "core/cpu/attn.h"

#include "core/cpu/vec_avx512.h"

#define ATTN_FN attn_block_avx512
#define ATTN_Q8_FN attn_block_q8_avx512

#include "core/cpu/attn_simd.h"
