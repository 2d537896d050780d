/* vmath_avx512: vmath's 16-lane AVX-512 paths (see vmath_simd.h). */
#include "core/cpu/vmath.h"

#include "core/cpu/vec_avx512.h"

#define VM_SWIGLU_FN vm_swiglu_avx512
#define VM_ADD_FN vm_add_avx512
#define VM_RMSNORM_FN vm_rmsnorm_avx512
#include "core/cpu/vmath_simd.h"
