/* vmath: the forward pass's elementwise epilogues over rows of floats (SwiGLU, the
 * residual add), with a plain C reference beside AVX2 and AVX-512 paths picked at run
 * time from quant_simd(); tests/unit/test_vmath.c compares them.
 *
 * Every element goes through the same arithmetic wherever it sits in the row (a row's
 * tail goes through a padded vector), so a token's result never depends on its batch. */
#ifndef KILN_VMATH_H
#define KILN_VMATH_H

#include <stddef.h>

/* out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + exp(-x)). The SIMD paths use a
 * polynomial exp (relative error ~2e-7; core/vec.h), the reference libm's expf. */
void vm_swiglu(float *out, const float *gate, const float *up, int n);
void vm_swiglu_ref(float *out, const float *gate, const float *up, int n);
void vm_swiglu_avx2(float *out, const float *gate, const float *up, int n);
void vm_swiglu_avx512(float *out, const float *gate, const float *up, int n);

/* out[i] += a[i]: the same IEEE additions on every path. */
void vm_add(float *out, const float *a, int n);
void vm_add_ref(float *out, const float *a, int n);
void vm_add_avx2(float *out, const float *a, int n);
void vm_add_avx512(float *out, const float *a, int n);
/* vm_add over `rows` rows: out + r*os += a + r*as, n elements each. One dispatch for
 * all of them: a matmul task adds 16-element pieces of many tokens' rows. */
void vm_add_rows(float *out, size_t os, const float *a, size_t as, int n, int rows);

#endif
