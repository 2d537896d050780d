/* blas: cuBLAS, dlopen'ed ("libcublas.so.13") only when the CUDA backend is asked for
 * it: loading it costs about half a second and 200 MB of RSS, which a box that never
 * uses it should not pay. It runs on the context current to the calling thread. */
#ifndef KILN_CUDA_BLAS_H
#define KILN_CUDA_BLAS_H

#include <stddef.h>

#include <cuda.h>

typedef struct blas blas;

/* NULL with err set when the library or a symbol is missing or cublasCreate fails. */
blas *blas_open(CUstream stream, char *err, size_t errlen);
void blas_close(blas *b);
/* out[t*ostride + r] = beta*out + sum_i w16[r*n_in + i] * x16[t*n_in + i] for r < n_out,
 * t < T: f16 inputs, f32 accumulation and output. 0 or -EIO with err set. */
int blas_gemm(blas *b, CUdeviceptr w16, CUdeviceptr x16, CUdeviceptr out, int n_out, int n_in,
              int T, int ostride, float beta, char *err, size_t errlen);

#endif
