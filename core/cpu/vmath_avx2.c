/* vmath_avx2: vmath's 8-lane AVX2 + FMA paths (see vmath_simd.h). */
#include "core/cpu/vmath.h"

#include "core/cpu/vec_avx2.h"

#define VM_SWIGLU_FN vm_swiglu_avx2
#define VM_ADD_FN vm_add_avx2
#define VM_RMSNORM_FN vm_rmsnorm_avx2
#include "core/cpu/vmath_simd.h"
