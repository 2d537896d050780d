/* kern: the embedded kernels (cuda/kernels.cu) loaded into the current context, and a
 * launch wrapper per kernel that owns its geometry. Used by the backend (core/backend_cuda.c)
 * and by the GPU tests, which compare each kernel with its CPU reference. All launches
 * are asynchronous on the given stream and return the CUresult of the launch.
 * cuda/ is a leaf: the wrappers take plain numbers and the structs below, never core's
 * model or mm's KV types, so nothing here includes a folder above it. */
#ifndef KILN_CUDA_KERN_H
#define KILN_CUDA_KERN_H

#include <stddef.h>

#include "cuda/cu.h"

typedef struct {
    const cu_api *cu;
    CUmodule mod;
    CUfunction embed, rmsnorm, mm, swiglu, bias, rope_store, attn, kv_to_fp8, kv_expand, dq_f16,
        f32_to_f16, argmax;
} kern;

/* A weight matrix on the device: n_out rows of n_in elements of quant type `type`. */
typedef struct {
    CUdeviceptr w;
    int type, n_in, n_out;
    long long row_bytes;
    CUdeviceptr w16; /* f16 copy for cuBLAS, or 0 */
} kern_mat;

/* The KV pool as the kernels see it: n_units units of unit_elems f16 each, a block
 * one unit (units_per_block 1) or two (a pool whose fp8 blocks take half a block and
 * free the other half: mm/kv.h's units). Page tables and cache slots name a block by
 * its first unit; flags and scales are kept by it too. */
typedef struct {
    CUdeviceptr data;  /* [n_units][unit_elems] f16 */
    CUdeviceptr fp8;   /* [n_units] u8: 1 = the block starting there holds fp8 (0 = no fp8 support) */
    CUdeviceptr scale; /* [n_units][slabs] f32 fp8 scales */
    int n_layers, n_kv, hd, bs;
    long long block_elems, unit_elems;
} kern_kv;

/* The model's attention heads as the kernels read them (the backend fills it from its
 * model_config): rope_freq is a device array of rope_dim / 2 doubles, each pair's angle
 * per position with the model's RoPE factors and scaling in it (model_config.rope_freq),
 * and cos and sin are scaled by rope_mscale. */
typedef struct {
    int n_heads, n_kv_heads, head_dim, rope_dim, rope_neox;
    CUdeviceptr rope_freq;
    float rope_mscale;
} kern_heads;

/* k_attn's launch: keys per shared-memory tile, threads per block and dynamic shared
 * bytes, which the caller derives from the head shape (core/cuda_plan.h, cplan_attn_geom). */
typedef struct {
    int kt, threads;
    size_t smem;
} kern_attn_geom;

/* Loads the module from the embedded fatbin into the current context. */
int kern_load(kern *k, const cu_api *cu, char *err, size_t errlen);
void kern_unload(kern *k);

CUresult kern_embed(const kern *k, CUstream s, CUdeviceptr x, const kern_mat *w, CUdeviceptr tokens,
                    int T);
/* out row i = rmsnorm(x row rows[i], or i without rows) * w, n rows of d; out may be x. */
CUresult kern_rmsnorm(const kern *k, CUstream s, CUdeviceptr out, CUdeviceptr x, CUdeviceptr w,
                      int d, float eps, CUdeviceptr rows, int n);
/* out[t*ostride + r] (=, or += when add) W·x[t*xstride] (+ bias) for T tokens. */
CUresult kern_mm(const kern *k, CUstream s, const kern_mat *w, CUdeviceptr x, int xstride,
                 CUdeviceptr out, int ostride, int T, int add, CUdeviceptr bias);
CUresult kern_swiglu(const kern *k, CUstream s, CUdeviceptr h, CUdeviceptr g, CUdeviceptr u,
                     long long n);
CUresult kern_bias(const kern *k, CUstream s, CUdeviceptr out, int ostride, CUdeviceptr bias, int n,
                   int T);
CUresult kern_rope_store(const kern *k, CUstream s, const kern_heads *h, const kern_kv *kv,
                         CUdeviceptr q, CUdeviceptr kk, CUdeviceptr v, CUdeviceptr pos,
                         CUdeviceptr slot, int layer, int T);
CUresult kern_attn(const kern *k, CUstream s, const kern_heads *h, const kern_kv *kv,
                   const kern_attn_geom *g, CUdeviceptr q, CUdeviceptr out, CUdeviceptr tiles,
                   CUdeviceptr pos, CUdeviceptr tables, int tstride, int layer, int n_tiles);
/* Blocks [n] (device ints: first units) to fp8 in place, into their first half; sets
 * their kv->fp8 flags when kv->fp8. blocks 0: the one block at unit `one` (n is 1). */
CUresult kern_kv_to_fp8(const kern *k, CUstream s, const kern_kv *kv, CUdeviceptr blocks, int one,
                        int n);
/* The fp8 block at unit src as f16 into the free block at unit dst, flagged f16. */
CUresult kern_kv_expand(const kern *k, CUstream s, const kern_kv *kv, int dst, int src);
CUresult kern_dq_f16(const kern *k, CUstream s, CUdeviceptr dst, const kern_mat *w);
CUresult kern_f32_to_f16(const kern *k, CUstream s, CUdeviceptr dst, CUdeviceptr x, long long n);
CUresult kern_argmax(const kern *k, CUstream s, CUdeviceptr out, CUdeviceptr logits, int n_vocab,
                     int n);

#endif
