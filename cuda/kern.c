/* kern: loading the embedded module and launching its kernels (see kern.h). */
#include "cuda/kern.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

extern const unsigned char kiln_cuda_fatbin[];

int kern_load(kern *k, const cu_api *cu, char *err, size_t errlen) {
    memset(k, 0, sizeof *k);
    k->cu = cu;
    CUresult r = cu->cuModuleLoadData(&k->mod, kiln_cuda_fatbin);
    if (r != CUDA_SUCCESS) return cu_fail(cu, r, "cuda: loading the kernels (cuModuleLoadData)", err, errlen);
    struct { CUfunction *f; const char *name; } fs[] = {
        {&k->embed, "k_embed"}, {&k->rmsnorm, "k_rmsnorm"}, {&k->mm, "k_mm"},
        {&k->swiglu, "k_swiglu"}, {&k->bias, "k_bias"}, {&k->rope_store, "k_rope_store"},
        {&k->attn, "k_attn"}, {&k->kv_to_fp8, "k_kv_to_fp8"}, {&k->kv_expand, "k_kv_expand"},
        {&k->dq_f16, "k_dq_f16"},
        {&k->f32_to_f16, "k_f32_to_f16"}, {&k->argmax, "k_argmax"},
    };
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++)
        if ((r = cu->cuModuleGetFunction(fs[i].f, k->mod, fs[i].name)) != CUDA_SUCCESS) {
            char what[96];
            snprintf(what, sizeof what, "cuda: kernel %s", fs[i].name);
            cu->cuModuleUnload(k->mod);
            k->mod = NULL;
            return cu_fail(cu, r, what, err, errlen);
        }
    /* k_attn's shared memory can pass the 48 KB default for wide heads. */
    cu->cuFuncSetAttribute(k->attn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 96 * 1024);
    return 0;
}

void kern_unload(kern *k) {
    if (k->mod) k->cu->cuModuleUnload(k->mod);
    k->mod = NULL;
}

static CUresult launch(const kern *k, CUfunction f, CUstream s, unsigned gx, unsigned gy,
                       unsigned threads, unsigned smem, void **args) {
    if (gx == 0 || gy == 0) return CUDA_SUCCESS; /* nothing to do */
    return k->cu->cuLaunchKernel(f, gx, gy, 1, threads, 1, 1, smem, s, args, NULL);
}

static unsigned blocks_for(long long n, unsigned threads) {
    return (unsigned)((n + threads - 1) / threads);
}

CUresult kern_embed(const kern *k, CUstream s, CUdeviceptr x, const kern_mat *w, CUdeviceptr tokens,
                    int T) {
    int type = w->type, d = w->n_in;
    long long rb = w->row_bytes;
    void *a[] = {&x, (void *)&w->w, &type, &rb, &tokens, &d};
    return launch(k, k->embed, s, (unsigned)T, 1, 128, 0, a);
}

CUresult kern_rmsnorm(const kern *k, CUstream s, CUdeviceptr out, CUdeviceptr x, CUdeviceptr w,
                      int d, float eps, CUdeviceptr rows, int n) {
    void *a[] = {&out, &x, &w, &d, &eps, &rows};
    return launch(k, k->rmsnorm, s, (unsigned)n, 1, 256, 0, a);
}

#define MM_WARPS 4
#define MM_TOKENS 8 /* as in kernels.cu */
CUresult kern_mm(const kern *k, CUstream s, const kern_mat *w, CUdeviceptr x, int xstride,
                 CUdeviceptr out, int ostride, int T, int add, CUdeviceptr bias) {
    int type = w->type, n_in = w->n_in, n_out = w->n_out;
    long long rb = w->row_bytes;
    void *a[] = {&type, (void *)&w->w, &rb, &n_in, &n_out, &x, &xstride, &out, &ostride, &T, &add, &bias};
    if (T < 1) return CUDA_SUCCESS;
    return launch(k, k->mm, s, blocks_for(n_out, MM_WARPS), blocks_for(T, MM_TOKENS), 32 * MM_WARPS, 0, a);
}

CUresult kern_swiglu(const kern *k, CUstream s, CUdeviceptr h, CUdeviceptr g, CUdeviceptr u,
                     long long n) {
    void *a[] = {&h, &g, &u, &n};
    return launch(k, k->swiglu, s, blocks_for(n, 256), 1, 256, 0, a);
}

CUresult kern_bias(const kern *k, CUstream s, CUdeviceptr out, int ostride, CUdeviceptr bias, int n,
                   int T) {
    void *a[] = {&out, &ostride, &bias, &n, &T};
    return launch(k, k->bias, s, blocks_for((long long)n * T, 256), 1, 256, 0, a);
}

CUresult kern_rope_store(const kern *k, CUstream s, const kern_heads *c, const kern_kv *kv,
                         CUdeviceptr q, CUdeviceptr kk, CUdeviceptr v, CUdeviceptr pos,
                         CUdeviceptr slot, int layer, int T) {
    int nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim, rd = c->rope_dim, neox = c->rope_neox;
    CUdeviceptr freq = c->rope_freq;
    float mscale = c->rope_mscale;
    int bs = kv->bs;
    long long us = kv->unit_elems;
    CUdeviceptr data = kv->data, fp8 = kv->fp8;
    void *a[] = {&q, &kk, &v, &pos, &slot, &data, &fp8, &layer, &nh, &nkv, &hd, &rd, &neox, &freq, &mscale, &bs, &us};
    return launch(k, k->rope_store, s, (unsigned)T, 1, 128, 0, a);
}

CUresult kern_attn(const kern *k, CUstream s, const kern_heads *c, const kern_kv *kv,
                   const kern_attn_geom *g, CUdeviceptr q, CUdeviceptr out, CUdeviceptr tiles,
                   CUdeviceptr pos, CUdeviceptr tables, int tstride, int layer, int n_tiles) {
    int nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim, bs = kv->bs, kt = g->kt;
    long long be = kv->block_elems, us = kv->unit_elems;
    float scale = 1.0f / sqrtf((float)hd);
    CUdeviceptr data = kv->data, fp8 = kv->fp8, sc = kv->scale;
    void *a[] = {&q, &out, &tiles, &pos, &tables, &tstride, &data, &fp8, &sc, &layer, &nh, &nkv,
                 &hd, &bs, &be, &us, &kt, &scale};
    return launch(k, k->attn, s, (unsigned)n_tiles, (unsigned)nkv, (unsigned)g->threads,
                  (unsigned)g->smem, a);
}

CUresult kern_kv_to_fp8(const kern *k, CUstream s, const kern_kv *kv, CUdeviceptr blocks, int one,
                        int n) {
    CUdeviceptr data = kv->data, sc = kv->scale, fp8 = kv->fp8;
    long long be = kv->block_elems, us = kv->unit_elems;
    int he = kv->bs * kv->hd;
    void *a[] = {&data, &sc, &fp8, &blocks, &one, &be, &us, &he};
    return launch(k, k->kv_to_fp8, s, (unsigned)n, 1, 256, (unsigned)he * 4, a);
}

CUresult kern_kv_expand(const kern *k, CUstream s, const kern_kv *kv, int dst, int src) {
    CUdeviceptr data = kv->data, sc = kv->scale, fp8 = kv->fp8;
    long long be = kv->block_elems, us = kv->unit_elems;
    int he = kv->bs * kv->hd;
    void *a[] = {&data, &sc, &fp8, &dst, &src, &be, &us, &he};
    return launch(k, k->kv_expand, s, (unsigned)(be / he), 1, 256, 0, a);
}

CUresult kern_dq_f16(const kern *k, CUstream s, CUdeviceptr dst, const kern_mat *w) {
    int type = w->type, n_in = w->n_in;
    long long rb = w->row_bytes;
    void *a[] = {&dst, (void *)&w->w, &type, &rb, &n_in};
    return launch(k, k->dq_f16, s, (unsigned)w->n_out, 1, 128, 0, a);
}

CUresult kern_f32_to_f16(const kern *k, CUstream s, CUdeviceptr dst, CUdeviceptr x, long long n) {
    void *a[] = {&dst, &x, &n};
    return launch(k, k->f32_to_f16, s, blocks_for(n, 256), 1, 256, 0, a);
}

CUresult kern_argmax(const kern *k, CUstream s, CUdeviceptr out, CUdeviceptr logits, int n_vocab,
                     int n) {
    void *a[] = {&out, &logits, &n_vocab};
    return launch(k, k->argmax, s, (unsigned)n, 1, 256, 0, a);
}
