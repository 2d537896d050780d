/* cu: the CUDA driver API, reached through dlopen("libcuda.so.1") and
 * cuGetProcAddress_v2, so kilnd has no link-time dependency on the driver and starts
 * (and falls back to the CPU) on a machine without one.
 *
 * Every entry point is a member of one table, typed from cuda.h's own prototypes
 * (__typeof__(&cuX) picks the versioned ABI the header maps cuX to, and
 * cuGetProcAddress is asked for the same version). */
#ifndef KILN_CUDA_CU_H
#define KILN_CUDA_CU_H

#include <stddef.h>

#include <cuda.h>

/* The entry points kiln uses, by their unversioned names. */
#define CU_FUNCS(X)                                                                        \
    X(cuInit) X(cuDriverGetVersion) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName)  \
    X(cuDeviceGetAttribute) X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain)                \
    X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuCtxSynchronize) X(cuStreamCreate)  \
    X(cuStreamDestroy) X(cuStreamSynchronize) X(cuEventCreate) X(cuEventRecord)           \
    X(cuEventQuery) X(cuEventSynchronize) X(cuEventElapsedTime) X(cuEventDestroy)         \
    X(cuMemAlloc) X(cuMemFree) X(cuMemGetInfo) X(cuMemHostAlloc) X(cuMemFreeHost)          \
    X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync)              \
    X(cuMemcpyDtoDAsync) X(cuMemsetD8Async) X(cuModuleLoadData) X(cuModuleUnload)          \
    X(cuModuleGetFunction) X(cuLaunchKernel) X(cuLaunchHostFunc) X(cuGetErrorString)       \
    X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuGraphInstantiateWithFlags) X(cuGraphLaunch)   \
    X(cuGraphExecDestroy) X(cuGraphDestroy) X(cuFuncSetAttribute)

typedef struct {
#define CU_MEMBER(name) __typeof__(&name) name;
    CU_FUNCS(CU_MEMBER)
#undef CU_MEMBER
    int driver_version; /* e.g. 13000 */
    void *lib;
} cu_api;

/* Loads the driver once per process and calls cuInit. NULL with a plain reason in err
 * ("no NVIDIA driver: libcuda.so.1 not found", "no CUDA device") when unusable. */
const cu_api *cu_load(char *err, size_t errlen);

/* "cuMemAlloc: out of memory (2)" into err; returns -EIO (or -ENOMEM for
 * CUDA_ERROR_OUT_OF_MEMORY) so call sites can `return cu_fail(...)`. */
int cu_fail(const cu_api *cu, CUresult r, const char *what, char *err, size_t errlen);

#endif
