/* blas: the one cuBLAS call kiln makes (see blas.h). */
#include "cuda/blas.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include <cublas_api.h>

#include "cuda/cu.h"

struct blas {
    void *lib;
    cublasHandle_t h;
    __typeof__(&cublasCreate_v2) create;
    __typeof__(&cublasDestroy_v2) destroy;
    __typeof__(&cublasSetStream_v2) set_stream;
    __typeof__(&cublasGemmEx) gemm;
};

blas *blas_open(CUstream stream, char *err, size_t errlen) {
    blas *b = calloc(1, sizeof *b);
    if (!b) {
        snprintf(err, errlen, "cublas: out of memory");
        return NULL;
    }
    /* The cuBLAS the driver runs: a CUDA 12 driver (the GPU image's 550) only cuBLAS 12;
     * a CUDA 13 one either, 13 first. The few entry points used here (create, destroy,
     * set stream, GemmEx) have the same ABI in both. */
    static const char *const names[] = {"libcublas.so.13", "libcublas.so.12"};
    const cu_api *cu = cu_load(NULL, 0);
    int first = cu && cu->driver_version < 13000 ? 1 : 0;
    for (int i = first; i < 2 && !b->lib; i++) b->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!b->lib) {
        snprintf(err, errlen, "cublas: %s not found (%s)", first ? names[1] : "libcublas.so.13 or .12", dlerror());
        free(b);
        return NULL;
    }
    b->create = (__typeof__(b->create))dlsym(b->lib, "cublasCreate_v2");
    b->destroy = (__typeof__(b->destroy))dlsym(b->lib, "cublasDestroy_v2");
    b->set_stream = (__typeof__(b->set_stream))dlsym(b->lib, "cublasSetStream_v2");
    b->gemm = (__typeof__(b->gemm))dlsym(b->lib, "cublasGemmEx");
    cublasStatus_t st = CUBLAS_STATUS_NOT_INITIALIZED;
    if (b->create && b->destroy && b->set_stream && b->gemm) st = b->create(&b->h);
    /* CUstream and cudaStream_t are the same type (cuda_runtime_api.h). */
    if (st == CUBLAS_STATUS_SUCCESS) st = b->set_stream(b->h, (cudaStream_t)stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "cublas: cannot start (status %d)", (int)st);
        if (b->h) b->destroy(b->h);
        dlclose(b->lib);
        free(b);
        return NULL;
    }
    return b;
}

void blas_close(blas *b) {
    if (!b) return;
    b->destroy(b->h);
    dlclose(b->lib);
    free(b);
}

int blas_gemm(blas *b, CUdeviceptr w16, CUdeviceptr x16, CUdeviceptr out, int n_out, int n_in,
              int T, int ostride, float beta, char *err, size_t errlen) {
    /* Column-major view: out (n_out x T, ld ostride) = W^T' ... W is row-major
     * [n_out][n_in], i.e. column-major n_in x n_out: op T. x is [T][n_in]: n_in x T. */
    float alpha = 1.0f;
    cublasStatus_t st = b->gemm(b->h, CUBLAS_OP_T, CUBLAS_OP_N, n_out, T, n_in, &alpha,
                                (const void *)w16, CUDA_R_16F, n_in, (const void *)x16, CUDA_R_16F,
                                n_in, &beta, (void *)out, CUDA_R_32F, ostride, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "cublas: GemmEx %dx%dx%d failed (status %d)", n_out, T, n_in, (int)st);
        return -EIO;
    }
    return 0;
}
