/* backend_cuda: the forward pass on an NVIDIA GPU through the driver API (core/backend.h).
 *
 * At start: the primary context of the chosen device, one stream, the embedded kernels;
 * every weight uploaded once as it is in the file (quantized blocks stay quantized and
 * are dequantized in registers by the kernels); scratch for the largest step; then the
 * KV pool gets what the memory budget leaves (cplan_kv_blocks). The host keeps the page
 * tables (mm/kv with external data); the blocks live on the device, and copy-on-write
 * becomes a device copy queued on the stream.
 *
 * A step: pack the batch into pinned staging (core/cuda_plan.c), one upload, the kernels (or
 * a replayed CUDA graph for a decode shape seen before), the logits rows downloaded into
 * pinned memory, then an event and a host callback that writes the eventfd the engine's
 * loop sleeps on. submit never blocks. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/cuda_plan.h"
#include "cuda/blas.h"
#include "cuda/cu.h"
#include "cuda/kern.h"

#define GRAPH_MAX_TOKENS 256      /* decode steps up to this many tokens become graphs */
#define RUNTIME_RESERVE (256u << 20) /* for cuBLAS' workspace, graphs, the module */
#define ALIGN 256

typedef struct {
    kern_mat wq, wk, wv, wo, gate, up, down;
    CUdeviceptr attn_norm, ffn_norm, bq, bk, bv;
    CUdeviceptr q_norm, k_norm; /* Qwen3's per-head RMSNorm weights, or 0 */
} dlayer;

/* KILN_CUDA_PROFILE=1 in the environment: an event after each kernel (graphs off), the
 * time between events summed per kind, separately for decode-like and prefill steps,
 * and printed to stderr when the backend is destroyed. Where a step's time goes. */
enum { P_EMBED, P_NORM, P_QKV, P_ROPE, P_ATTN, P_WO, P_GATEUP, P_SWIGLU, P_DOWN, P_LOGITS,
       P_DOWNLOAD, P_N };
static const char *const prof_names[P_N] = {"embed", "rmsnorm", "qkv", "rope+store", "attention",
                                             "wo", "gate+up", "swiglu", "down", "logits",
                                             "download"};
#define PROF_MAX 1024
typedef struct {
    int on, n, decode;
    CUevent ev[PROF_MAX];
    int kind[PROF_MAX];
    double ms[2][P_N];
    long steps[2];
} prof;

typedef struct {
    backend be;
    const cu_api *cu;
    CUdevice dev;
    CUcontext ctx;
    CUstream st;
    CUevent done;
    kern k;
    blas *bl;
    const model *m;
    kv_pool *kv;
    model_config c;
    backend_cuda_config cfg;
    kern_mat embd, out;
    CUdeviceptr out_norm;
    dlayer *L;
    CUdeviceptr wmem, w16mem, kvmem, scratch, kv8_list; /* kv8_list: [n_blocks] ints */
    size_t wbytes, w16bytes, kvbytes, scratch_bytes;
    kern_kv kvd;
    kern_heads heads;   /* c's head shape, as the kernels take it */
    kern_attn_geom kag; /* ag's launch numbers, as k_attn takes them */
    /* scratch: activations for the largest step */
    CUdeviceptr x, xb, q, kk, v, hb, hb2, logits, stage_d, x16, w16tmp;
    int32_t *stage_h; /* pinned */
    float *logits_h;  /* pinned */
    cplan_layout lay;
    cplan_attn ag;
    cplan_step step;
    cplan_graphs gc;
    CUgraphExec exec[CPLAN_GRAPHS];
    int efd, running;
    CUresult copy_err; /* a failed KV copy or conversion (kv_ext), reported by the next submit */
    char devname[96];
    size_t total_mem;
    long n_blocks;
    prof pf;
} cuda_backend;

static void prof_mark(cuda_backend *cb, int kind) {
    prof *p = &cb->pf;
    if (!p->on || p->n == PROF_MAX) return;
    if (cb->cu->cuEventRecord(p->ev[p->n], cb->st) == CUDA_SUCCESS) p->kind[p->n++] = kind;
}

/* After the step's end: the gaps between its events, added to their kinds. */
static void prof_collect(cuda_backend *cb) {
    prof *p = &cb->pf;
    if (!p->on) return;
    for (int i = 1; i < p->n; i++) {
        float ms = 0;
        if (cb->cu->cuEventElapsedTime(&ms, p->ev[i - 1], p->ev[i]) == CUDA_SUCCESS)
            p->ms[p->decode][p->kind[i]] += ms;
    }
    if (p->n) p->steps[p->decode]++;
    p->n = 0;
}

static void prof_print(cuda_backend *cb) {
    prof *p = &cb->pf;
    for (int d = 0; d < 2; d++) {
        if (!p->steps[d]) continue;
        double total = 0;
        for (int k = 0; k < P_N; k++) total += p->ms[d][k];
        fprintf(stderr, "cuda profile, %s steps: %ld, %.3f ms each:", d ? "decode" : "prefill",
                p->steps[d], total / p->steps[d]);
        for (int k = 0; k < P_N; k++)
            if (p->ms[d][k] > 0)
                fprintf(stderr, " %s %.3f (%.0f%%)", prof_names[k], p->ms[d][k] / p->steps[d],
                        100 * p->ms[d][k] / total);
        fprintf(stderr, "\n");
    }
}

/* ---------------------------------------------------------------- errors */

static int cufail(cuda_backend *cb, CUresult r, const char *what) {
    return cu_fail(cb->cu, r, what, cb->be.err, sizeof cb->be.err);
}

#define CK(call, what)                                                                     \
    do {                                                                                   \
        CUresult r_ = (call);                                                              \
        if (r_ != CUDA_SUCCESS) return cufail(cb, r_, what);                               \
    } while (0)

/* ---------------------------------------------------------------- weights */

static size_t up(size_t x) { return (x + ALIGN - 1) & ~(size_t)(ALIGN - 1); }

static size_t mat_bytes(const model_mat *w) { return (size_t)w->n_out * w->row_bytes; }

/* Weights are laid out in one allocation in this order; the same walk sizes it (dst 0)
 * and fills it. */
typedef struct {
    cuda_backend *cb;
    CUdeviceptr base;
    size_t off;
    int fill;
} wwalk;

static int put_bytes(wwalk *w, const void *src, size_t n, CUdeviceptr *out) {
    *out = w->base + w->off;
    if (w->fill && n) {
        CUresult r = w->cb->cu->cuMemcpyHtoD(*out, src, n);
        if (r != CUDA_SUCCESS) return cufail(w->cb, r, "cuda: uploading weights");
    }
    w->off += up(n);
    return 0;
}

static int put_vec(wwalk *w, const float *v, int n, CUdeviceptr *out) {
    if (!v) {
        *out = 0;
        return 0;
    }
    return put_bytes(w, v, (size_t)n * sizeof(float), out);
}

static int put_mat(wwalk *w, const model_mat *m, kern_mat *out) {
    *out = (kern_mat){0, (int)m->type, m->n_in, m->n_out, (long long)m->row_bytes, 0};
    return put_bytes(w, m->data, mat_bytes(m), &out->w);
}

static int walk_weights(cuda_backend *cb, wwalk *w) {
    const model *m = cb->m;
    const model_config *c = &cb->c;
    int qd = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim, r = 0;
    r = put_mat(w, &m->w.tok_embd, &cb->embd);
    if (!r && m->w.output.data == m->w.tok_embd.data) cb->out = cb->embd; /* tied */
    else if (!r) r = put_mat(w, &m->w.output, &cb->out);
    if (!r) r = put_vec(w, m->w.out_norm, c->d_model, &cb->out_norm);
    /* the RoPE angles per position, factors and scaling in them, as the CPU turns by */
    if (!r) r = put_bytes(w, c->rope_freq, (size_t)(c->rope_dim / 2) * sizeof(double), &cb->heads.rope_freq);
    for (int l = 0; l < c->n_layers && !r; l++) {
        const model_layer *s = &m->w.layers[l];
        dlayer *d = &cb->L[l];
        r = put_mat(w, &s->wq, &d->wq);
        if (!r) r = put_mat(w, &s->wk, &d->wk);
        if (!r) r = put_mat(w, &s->wv, &d->wv);
        if (!r) r = put_mat(w, &s->wo, &d->wo);
        if (!r) r = put_mat(w, &s->w_gate, &d->gate);
        if (!r) r = put_mat(w, &s->w_up, &d->up);
        if (!r) r = put_mat(w, &s->w_down, &d->down);
        if (!r) r = put_vec(w, s->attn_norm, c->d_model, &d->attn_norm);
        if (!r) r = put_vec(w, s->ffn_norm, c->d_model, &d->ffn_norm);
        if (!r) r = put_vec(w, s->bq, qd, &d->bq);
        if (!r) r = put_vec(w, s->bk, kd, &d->bk);
        if (!r) r = put_vec(w, s->bv, kd, &d->bv);
        if (!r) r = put_vec(w, s->q_norm, c->head_dim, &d->q_norm);
        if (!r) r = put_vec(w, s->k_norm, c->head_dim, &d->k_norm);
    }
    return r;
}

static int upload_weights(cuda_backend *cb) {
    wwalk w = {cb, 0, 0, 0};
    walk_weights(cb, &w); /* sizing pass: no copies, cannot fail */
    cb->wbytes = w.off;
    CK(cb->cu->cuMemAlloc(&cb->wmem, cb->wbytes), "cuda: allocating the weights");
    w = (wwalk){cb, cb->wmem, 0, 1};
    return walk_weights(cb, &w);
}

/* The f16 copies cuBLAS multiplies: kept for every layer matrix when they take at most
 * a quarter of the device (this model: 270 MB), else one matrix at a time is
 * dequantized into w16tmp before its GEMM. */
static kern_mat *layer_mats(dlayer *d, int i) {
    kern_mat *all[7] = {&d->wq, &d->wk, &d->wv, &d->wo, &d->gate, &d->up, &d->down};
    return all[i];
}

static int make_f16_copies(cuda_backend *cb) {
    size_t need = 0, widest = 0;
    for (int l = 0; l < cb->c.n_layers; l++)
        for (int i = 0; i < 7; i++) {
            kern_mat *km = layer_mats(&cb->L[l], i);
            size_t b = (size_t)km->n_out * km->n_in * 2;
            need += up(b);
            widest = b > widest ? b : widest;
        }
    if (need <= cb->total_mem / 4 && cb->cu->cuMemAlloc(&cb->w16mem, need) == CUDA_SUCCESS) {
        cb->w16bytes = need;
        size_t off = 0;
        for (int l = 0; l < cb->c.n_layers; l++)
            for (int i = 0; i < 7; i++) {
                kern_mat *km = layer_mats(&cb->L[l], i);
                km->w16 = cb->w16mem + off;
                off += up((size_t)km->n_out * km->n_in * 2);
                CK(kern_dq_f16(&cb->k, cb->st, km->w16, km), "cuda: f16 weight copies");
            }
        CK(cb->cu->cuStreamSynchronize(cb->st), "cuda: f16 weight copies");
        return 0;
    }
    CK(cb->cu->cuMemAlloc(&cb->w16tmp, widest), "cuda: allocating f16 weight scratch");
    cb->w16bytes = widest;
    return 0;
}

/* ---------------------------------------------------------------- scratch */

static int alloc_scratch(cuda_backend *cb) {
    const model_config *c = &cb->c;
    size_t T = (size_t)cb->cfg.max_batch_tokens, d = (size_t)c->d_model;
    size_t qd = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->n_kv_heads * c->head_dim;
    size_t wide = qd > d ? qd : d, ffn = (size_t)c->ffn_dim;
    size_t widest = wide > ffn ? wide : ffn;
    size_t sizes[] = {T * d * 4, T * wide * 4, T * qd * 4, T * kd * 4, T * kd * 4, T * ffn * 4,
                      T * ffn * 4, (size_t)cb->cfg.max_logits * c->n_vocab * 4,
                      cb->lay.total * 4, cb->cfg.cublas ? T * widest * 2 : 0};
    CUdeviceptr *dst[] = {&cb->x, &cb->xb, &cb->q, &cb->kk, &cb->v, &cb->hb, &cb->hb2,
                          &cb->logits, &cb->stage_d, &cb->x16};
    size_t n = sizeof sizes / sizeof sizes[0], total = 0;
    for (size_t i = 0; i < n; i++) total += up(sizes[i]);
    CK(cb->cu->cuMemAlloc(&cb->scratch, total), "cuda: allocating step scratch");
    cb->scratch_bytes = total;
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        *dst[i] = sizes[i] ? cb->scratch + off : 0;
        off += up(sizes[i]);
    }
    CK(cb->cu->cuMemHostAlloc((void **)&cb->stage_h, cb->lay.total * 4, 0), "cuda: pinned staging");
    CK(cb->cu->cuMemHostAlloc((void **)&cb->logits_h,
                              (size_t)cb->cfg.max_logits * c->n_vocab * 4, 0),
       "cuda: pinned logits");
    return 0;
}

/* ---------------------------------------------------------------- the KV pool */

/* mm's kv_ext (mm/kv.h): the pool's own writes, queued on the stream after the step in
 * flight. A failure is kept for the next submit to report. */
static void kv_failed(cuda_backend *cb, CUresult r) {
    if (r != CUDA_SUCCESS && cb->copy_err == CUDA_SUCCESS) cb->copy_err = r;
}

static void kv_copy(void *ctx, int32_t dst, int32_t src, int n) {
    cuda_backend *cb = ctx;
    const cu_api *cu = cb->cu;
    size_t ub = (size_t)cb->kvd.unit_elems * 2;
    int slabs = (int)(cb->kvd.block_elems / ((long long)cb->kvd.bs * cb->kvd.hd));
    CUresult r = cu->cuCtxSetCurrent(cb->ctx);
    if (r == CUDA_SUCCESS)
        r = cu->cuMemcpyDtoDAsync(cb->kvd.data + (size_t)dst * ub, cb->kvd.data + (size_t)src * ub,
                                  (size_t)n * ub, cb->st);
    /* the copy keeps the source's format: its fp8 flag and scales */
    if (r == CUDA_SUCCESS)
        r = cu->cuMemcpyDtoDAsync(cb->kvd.fp8 + (size_t)dst, cb->kvd.fp8 + (size_t)src, 1, cb->st);
    if (r == CUDA_SUCCESS)
        r = cu->cuMemcpyDtoDAsync(cb->kvd.scale + (size_t)dst * slabs * 4,
                                  cb->kvd.scale + (size_t)src * slabs * 4, (size_t)slabs * 4, cb->st);
    kv_failed(cb, r);
}

static void kv_to_q8(void *ctx, int32_t u) {
    cuda_backend *cb = ctx;
    CUresult r = cb->cu->cuCtxSetCurrent(cb->ctx);
    if (r == CUDA_SUCCESS) r = kern_kv_to_fp8(&cb->k, cb->st, &cb->kvd, 0, u, 1);
    kv_failed(cb, r);
}

static void kv_expand(void *ctx, int32_t dst, int32_t src) {
    cuda_backend *cb = ctx;
    CUresult r = cb->cu->cuCtxSetCurrent(cb->ctx);
    if (r == CUDA_SUCCESS) r = kern_kv_expand(&cb->k, cb->st, &cb->kvd, dst, src);
    kv_failed(cb, r);
}

static int make_kv(cuda_backend *cb, kv_pool *kv, kv_config *kc) {
    const cu_api *cu = cb->cu;
    kc->n_blocks = 1; /* for kv_block_bytes' shape checks */
    size_t bb = kv_block_bytes(kc);
    if (!bb) {
        snprintf(cb->be.err, sizeof cb->be.err, "cuda: invalid KV shape");
        return -EINVAL;
    }
    /* kv8: fp8 blocks take half a block (mm's units), and each unit has a flag and scales */
    int slabs = 2 * kc->n_layers * kc->n_kv_heads, units = kc->kv8 ? 2 : 1;
    size_t per_block = bb + (size_t)units * (1 + (size_t)slabs * 4);
    size_t free_now = 0, total = 0;
    CK(cu->cuMemGetInfo(&free_now, &total), "cuda: cuMemGetInfo");
    long cap = cb->cfg.kv_bytes ? (long)(cb->cfg.kv_bytes / bb) : 0;
    if (cb->cfg.kv_bytes && cap < 1) cap = 1;
    long n = cplan_kv_blocks(total, free_now, cb->cfg.mem_util, 0, RUNTIME_RESERVE, per_block, cap);
    if (n < kc->max_blocks_per_seq) {
        snprintf(cb->be.err, sizeof cb->be.err,
                 "cuda: the KV pool would hold %ld blocks, fewer than one sequence needs (%d): "
                 "%zu MiB free of %zu, gpu_memory_utilization %.2f",
                 n, kc->max_blocks_per_seq, free_now >> 20, total >> 20, cb->cfg.mem_util);
        return -ENOMEM;
    }
    long most = 0x7fffffff / ((long)units * kc->block_size); /* cache slots are int32 */
    kc->n_blocks = (int)(n > most ? most : n);
    kc->external_data = 1;
    kc->swa_window = 0; /* the kernels address layers in model order and read every page */
    size_t data = (size_t)kc->n_blocks * bb, nu = (size_t)units * (size_t)kc->n_blocks;
    size_t all = up(data) + up(nu) + nu * slabs * 4;
    CK(cu->cuMemAlloc(&cb->kvmem, all), "cuda: allocating the KV pool");
    cb->kvbytes = all;
    cb->kvd = (kern_kv){cb->kvmem, cb->kvmem + up(data), cb->kvmem + up(data) + up(nu),
                        kc->n_layers, kc->n_kv_heads, kc->head_dim, kc->block_size,
                        (long long)(bb / 2), (long long)(bb / 2) / units};
    CK(cu->cuMemsetD8Async(cb->kvd.fp8, 0, nu, cb->st), "cuda: KV flags");
    CK(cu->cuMemAlloc(&cb->kv8_list, (size_t)kc->n_blocks * sizeof(int32_t)), "cuda: KV block list");
    CK(cu->cuStreamSynchronize(cb->st), "cuda: KV flags");
    int r = kv_pool_init(kv, kc, NULL);
    if (r < 0) {
        snprintf(cb->be.err, sizeof cb->be.err, "cuda: KV page tables for %d blocks: %s", kc->n_blocks,
                 strerror(-r));
        return r;
    }
    if (kv->units != units) { /* the kernels' unit stride must be mm's */
        snprintf(cb->be.err, sizeof cb->be.err, "cuda: the KV pool has %d units a block, not %d",
                 kv->units, units);
        kv_pool_free(kv);
        return -EINVAL;
    }
    kv->ext = (kv_ext){cb, kv_copy, kv_to_q8, kv_expand};
    cb->kv = kv;
    cb->n_blocks = kc->n_blocks;
    return 0;
}

/* ---------------------------------------------------------------- one step */

#define STAGE(field) (cb->stage_d + cb->lay.field * sizeof(int32_t))

/* out = W·x (+= when add) for T tokens; cuBLAS in f16 when use_blas. */
static int matmul(cuda_backend *cb, const kern_mat *w, CUdeviceptr x, CUdeviceptr out, int ostride,
                  int T, int add, CUdeviceptr bias, int use_blas) {
    if (!use_blas) {
        CK(kern_mm(&cb->k, cb->st, w, x, w->n_in, out, ostride, T, add, bias), "cuda: k_mm");
        return 0;
    }
    CUdeviceptr w16 = w->w16;
    if (!w16) {
        CK(kern_dq_f16(&cb->k, cb->st, cb->w16tmp, w), "cuda: k_dq_f16");
        w16 = cb->w16tmp;
    }
    CK(kern_f32_to_f16(&cb->k, cb->st, cb->x16, x, (long long)T * w->n_in), "cuda: k_f32_to_f16");
    if (blas_gemm(cb->bl, w16, cb->x16, out, w->n_out, w->n_in, T, ostride, add ? 1.0f : 0.0f,
                  cb->be.err, sizeof cb->be.err) < 0)
        return -EIO;
    if (bias) CK(kern_bias(&cb->k, cb->st, out, ostride, bias, w->n_out, T), "cuda: k_bias");
    return 0;
}

/* Every kernel of one step, in order, on cb->st (also what a graph captures). */
static int enqueue_forward(cuda_backend *cb, int use_blas) {
    const model_config *c = &cb->c;
    const kern *k = &cb->k;
    CUstream s = cb->st;
    int T = cb->step.n_tokens, d = c->d_model, qd = c->n_heads * c->head_dim;
    int kd = c->n_kv_heads * c->head_dim, ffn = c->ffn_dim, r = 0;
    float eps = c->rms_eps;
    prof_mark(cb, P_EMBED); /* the start */
    CK(kern_embed(k, s, cb->x, &cb->embd, STAGE(tokens), T), "cuda: k_embed");
    prof_mark(cb, P_EMBED);
    for (int l = 0; l < c->n_layers; l++) {
        const dlayer *L = &cb->L[l];
        CK(kern_rmsnorm(k, s, cb->xb, cb->x, L->attn_norm, d, eps, 0, T), "cuda: k_rmsnorm");
        prof_mark(cb, P_NORM);
        if ((r = matmul(cb, &L->wq, cb->xb, cb->q, qd, T, 0, L->bq, use_blas)) ||
            (r = matmul(cb, &L->wk, cb->xb, cb->kk, kd, T, 0, L->bk, use_blas)) ||
            (r = matmul(cb, &L->wv, cb->xb, cb->v, kd, T, 0, L->bv, use_blas)))
            return r;
        prof_mark(cb, P_QKV);
        if (L->q_norm) { /* Qwen3: each head's q and k rows RMS-normalized before RoPE */
            CK(kern_rmsnorm(k, s, cb->q, cb->q, L->q_norm, c->head_dim, eps, 0, T * c->n_heads),
               "cuda: k_rmsnorm q heads");
            CK(kern_rmsnorm(k, s, cb->kk, cb->kk, L->k_norm, c->head_dim, eps, 0, T * c->n_kv_heads),
               "cuda: k_rmsnorm k heads");
            prof_mark(cb, P_NORM);
        }
        CK(kern_rope_store(k, s, &cb->heads, &cb->kvd, cb->q, cb->kk, cb->v, STAGE(pos), STAGE(slot), l, T),
           "cuda: k_rope_store");
        prof_mark(cb, P_ROPE);
        CK(kern_attn(k, s, &cb->heads, &cb->kvd, &cb->kag, cb->q, cb->xb, STAGE(tiles), STAGE(pos), STAGE(tables),
                     cb->lay.tstride, l, cb->step.n_tiles),
           "cuda: k_attn");
        prof_mark(cb, P_ATTN);
        if ((r = matmul(cb, &L->wo, cb->xb, cb->x, d, T, 1, 0, use_blas))) return r;
        prof_mark(cb, P_WO);
        CK(kern_rmsnorm(k, s, cb->xb, cb->x, L->ffn_norm, d, eps, 0, T), "cuda: k_rmsnorm");
        prof_mark(cb, P_NORM);
        if ((r = matmul(cb, &L->gate, cb->xb, cb->hb, ffn, T, 0, 0, use_blas)) ||
            (r = matmul(cb, &L->up, cb->xb, cb->hb2, ffn, T, 0, 0, use_blas)))
            return r;
        prof_mark(cb, P_GATEUP);
        CK(kern_swiglu(k, s, cb->hb, cb->hb, cb->hb2, (long long)T * ffn), "cuda: k_swiglu");
        prof_mark(cb, P_SWIGLU);
        if ((r = matmul(cb, &L->down, cb->hb, cb->x, d, T, 1, 0, use_blas))) return r;
        prof_mark(cb, P_DOWN);
    }
    int nl = cb->step.n_logits;
    if (nl > 0) {
        CK(kern_rmsnorm(k, s, cb->xb, cb->x, cb->out_norm, d, eps, STAGE(rows), nl), "cuda: k_rmsnorm");
        CK(kern_mm(k, s, &cb->out, cb->xb, d, cb->logits, c->n_vocab, nl, 0, 0), "cuda: k_mm logits");
        prof_mark(cb, P_LOGITS);
    }
    return 0;
}

/* A decode shape seen before replays its graph; a new one is captured, then replayed. */
static int launch_graph(cuda_backend *cb) {
    const cu_api *cu = cb->cu;
    uint64_t key = cplan_graph_key(&cb->step, 0);
    int i = cplan_graph_find(&cb->gc, key);
    if (i < 0) {
        CK(cu->cuStreamBeginCapture(cb->st, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuda: graph capture");
        int r = enqueue_forward(cb, 0);
        CUgraph g = NULL;
        CUresult e = cu->cuStreamEndCapture(cb->st, &g);
        if (r < 0) {
            if (g) cu->cuGraphDestroy(g);
            return r;
        }
        if (e != CUDA_SUCCESS) return cufail(cb, e, "cuda: graph capture");
        CUgraphExec ex = NULL;
        e = cu->cuGraphInstantiateWithFlags(&ex, g, 0);
        cu->cuGraphDestroy(g);
        if (e != CUDA_SUCCESS) return cufail(cb, e, "cuda: graph instantiate");
        int evicted;
        i = cplan_graph_put(&cb->gc, key, &evicted);
        if (evicted) cu->cuGraphExecDestroy(cb->exec[i]);
        cb->exec[i] = ex;
    }
    CK(cu->cuGraphLaunch(cb->exec[i], cb->st), "cuda: graph launch");
    return 0;
}

static void CUDA_CB notify(void *ud) {
    cuda_backend *cb = ud;
    uint64_t one = 1;
    if (write(cb->efd, &one, sizeof one) < 0) { /* the counter cannot overflow here */ }
}

static int cuda_submit(backend *be, const model_batch *b) {
    cuda_backend *cb = (cuda_backend *)be;
    const cu_api *cu = cb->cu;
    if (cb->running) {
        snprintf(be->err, sizeof be->err, "cuda backend: a step is already running");
        return -EBUSY;
    }
    if (cb->copy_err != CUDA_SUCCESS) return cufail(cb, cb->copy_err, "cuda: a KV pool copy or conversion");
    for (int t = 0; t < b->n_tokens; t++)
        if (b->tokens[t] < 0 || b->tokens[t] >= cb->c.n_vocab || b->pos[t] < 0 || b->pos[t] >= cb->cfg.max_ctx) {
            snprintf(be->err, sizeof be->err, "cuda: token %d at position %d out of range",
                     b->tokens[t], b->pos[t]);
            return -EINVAL;
        }
    if (cplan_pack(&cb->lay, b, cb->kv->loc, cb->kvd.bs, cb->ag.qt, cb->stage_h, &cb->step, be->err,
                   sizeof be->err) < 0)
        return -EINVAL;
    CK(cu->cuCtxSetCurrent(cb->ctx), "cuda: cuCtxSetCurrent");
    CK(cu->cuMemcpyHtoDAsync(cb->stage_d, cb->stage_h, cb->step.upload * sizeof(int32_t), cb->st),
       "cuda: uploading the step");
    int use_blas = cb->bl && cb->step.n_tokens >= cb->cfg.cublas_min_tokens;
    cb->pf.decode = cb->step.n_tiles == cb->step.n_tokens;
    int r = cb->cfg.graphs && !use_blas && cplan_graph_wanted(&cb->step, GRAPH_MAX_TOKENS)
                ? launch_graph(cb)
                : enqueue_forward(cb, use_blas);
    if (r < 0) return r;
    size_t lb = (size_t)cb->step.n_logits * cb->c.n_vocab * sizeof(float);
    if (lb) CK(cu->cuMemcpyDtoHAsync(cb->logits_h, cb->logits, lb, cb->st), "cuda: downloading logits");
    prof_mark(cb, P_DOWNLOAD);
    /* The callback before the event: a step poll() finds done has always written the
     * eventfd already, so reaping it consumes the wakeup (a stale one would make the
     * loop call poll for a step that is not running). */
    CK(cu->cuLaunchHostFunc(cb->st, notify, cb), "cuda: cuLaunchHostFunc");
    CK(cu->cuEventRecord(cb->done, cb->st), "cuda: cuEventRecord");
    cb->running = 1;
    return 0;
}

static int reap(cuda_backend *cb, CUresult r) {
    uint64_t n;
    if (read(cb->efd, &n, sizeof n) < 0) { /* nonblocking: already consumed is fine */ }
    cb->running = 0;
    if (r == CUDA_SUCCESS) prof_collect(cb);
    return r == CUDA_SUCCESS ? 1 : cufail(cb, r, "cuda: the step failed");
}

static int cuda_poll(backend *be) {
    cuda_backend *cb = (cuda_backend *)be;
    if (!cb->running) return 1;
    CUresult r = cb->cu->cuEventQuery(cb->done);
    return r == CUDA_ERROR_NOT_READY ? 0 : reap(cb, r);
}

static int cuda_wait(backend *be) {
    cuda_backend *cb = (cuda_backend *)be;
    if (!cb->running) return 1;
    return reap(cb, cb->cu->cuEventSynchronize(cb->done));
}

static int cuda_event_fd(backend *be) { return ((cuda_backend *)be)->efd; }
static const float *cuda_logits(backend *be) { return ((cuda_backend *)be)->logits_h; }

static void cuda_destroy(backend *be) {
    cuda_backend *cb = (cuda_backend *)be;
    if (!cb) return;
    const cu_api *cu = cb->cu;
    if (cb->ctx) {
        cu->cuCtxSetCurrent(cb->ctx);
        if (cb->running) cuda_wait(be);
        if (cb->st) cu->cuStreamSynchronize(cb->st);
        for (int i = 0; i < CPLAN_GRAPHS; i++)
            if (cb->gc.key[i]) cu->cuGraphExecDestroy(cb->exec[i]);
        if (cb->pf.on) {
            prof_print(cb);
            for (int i = 0; i < PROF_MAX; i++) cu->cuEventDestroy(cb->pf.ev[i]);
        }
        blas_close(cb->bl);
        CUdeviceptr mem[] = {cb->wmem, cb->w16mem, cb->w16tmp, cb->kvmem, cb->scratch, cb->kv8_list};
        for (size_t i = 0; i < sizeof mem / sizeof mem[0]; i++)
            if (mem[i]) cu->cuMemFree(mem[i]);
        if (cb->stage_h) cu->cuMemFreeHost(cb->stage_h);
        if (cb->logits_h) cu->cuMemFreeHost(cb->logits_h);
        kern_unload(&cb->k);
        if (cb->done) cu->cuEventDestroy(cb->done);
        if (cb->st) cu->cuStreamDestroy(cb->st);
        cu->cuDevicePrimaryCtxRelease(cb->dev);
    }
    if (cb->kv) cb->kv->ext = (kv_ext){0};
    if (cb->efd >= 0) close(cb->efd);
    free(cb->L);
    free(cb);
}

/* The KV pool is allocated once, so converting KV does not lower this: the ladder climbs
 * to shedding (503 with retry_after) until the memory comes back. A failed query says
 * nothing: the next step's launch reports a broken context. */
static double cuda_mem_pressure(backend *be) {
    cuda_backend *cb = (cuda_backend *)be;
    size_t free_now = 0, total = 0;
    if (cb->cu->cuCtxSetCurrent(cb->ctx) != CUDA_SUCCESS ||
        cb->cu->cuMemGetInfo(&free_now, &total) != CUDA_SUCCESS)
        return 0.0;
    return cplan_mem_pressure(free_now, RUNTIME_RESERVE);
}

static const backend_ops cuda_ops = {"cuda", cuda_submit, cuda_poll, cuda_wait, cuda_event_fd,
                                     cuda_logits, cuda_destroy,
                                     NULL /* step_ms: the scheduler times the step */,
                                     cuda_mem_pressure};

/* ---------------------------------------------------------------- start-up */

int backend_cuda_built(void) { return 1; }

int backend_cuda_probe(char *err, size_t errlen) { return cu_load(err, errlen) != NULL; }

static int start(cuda_backend *cb, kv_pool *kv, kv_config *kc) {
    const cu_api *cu = cb->cu;
    const model_config *c = &cb->c;
    CK(cu->cuDeviceGet(&cb->dev, cb->cfg.device), "cuda: cuDeviceGet");
    CK(cu->cuDevicePrimaryCtxRetain(&cb->ctx, cb->dev), "cuda: cuDevicePrimaryCtxRetain");
    CK(cu->cuCtxSetCurrent(cb->ctx), "cuda: cuCtxSetCurrent");
    cu->cuDeviceGetName(cb->devname, sizeof cb->devname, cb->dev);
    CK(cu->cuDeviceTotalMem(&cb->total_mem, cb->dev), "cuda: cuDeviceTotalMem");
    CK(cu->cuStreamCreate(&cb->st, CU_STREAM_NON_BLOCKING), "cuda: cuStreamCreate");
    CK(cu->cuEventCreate(&cb->done, CU_EVENT_DISABLE_TIMING), "cuda: cuEventCreate");
    int r = kern_load(&cb->k, cu, cb->be.err, sizeof cb->be.err);
    if (r < 0) return r;
    const char *pe = getenv("KILN_CUDA_PROFILE");
    if (pe && *pe && *pe != '0') {
        for (int i = 0; i < PROF_MAX; i++) CK(cu->cuEventCreate(&cb->pf.ev[i], 0), "cuda: profile events");
        cb->pf.on = 1;
        cb->cfg.graphs = 0; /* the events are per launch */
    }
    if (cplan_attn_geom(c->head_dim, c->n_heads / c->n_kv_heads, &cb->ag) < 0 ||
        c->d_model % 8 || c->ffn_dim % 8 || (c->n_heads * c->head_dim) % 8) {
        snprintf(cb->be.err, sizeof cb->be.err, "cuda: head_dim %d with %d query heads per KV head, "
                 "or widths not multiples of 8, are not supported", c->head_dim,
                 c->n_heads / c->n_kv_heads);
        return -ENOTSUP;
    }
    cb->heads = (kern_heads){c->n_heads, c->n_kv_heads, c->head_dim, c->rope_dim, c->rope_neox,
                             0 /* uploaded with the weights */, c->rope_mscale};
    cb->kag = (kern_attn_geom){cb->ag.kt, cb->ag.threads, cb->ag.smem};
    if (cplan_layout_init(&cb->lay, cb->cfg.max_batch_tokens, cb->cfg.max_logits,
                          kc->max_blocks_per_seq) < 0) {
        snprintf(cb->be.err, sizeof cb->be.err, "cuda: invalid step limits");
        return -EINVAL;
    }
    if ((r = upload_weights(cb)) < 0) return r;
    if (cb->cfg.cublas) {
        if (!(cb->bl = blas_open(cb->st, cb->be.err, sizeof cb->be.err))) return -ENOTSUP;
        if ((r = make_f16_copies(cb)) < 0) return r;
    }
    if ((r = alloc_scratch(cb)) < 0) return r;
    return make_kv(cb, kv, kc);
}

backend *backend_cuda_new(const model *m, kv_pool *kv, kv_config *kc, const backend_cuda_config *cfg,
                          char *err, size_t errlen) {
    char extras[256];
    if (model_extras(m, extras, sizeof extras)) { /* the kernels run plain Llama/Qwen2 math */
        snprintf(err, errlen, "cuda: the CUDA backend does not implement this model's %s", extras);
        return NULL;
    }
    const cu_api *cu = cu_load(err, errlen);
    if (!cu) return NULL;
    cuda_backend *cb = calloc(1, sizeof *cb);
    if (cb) cb->L = calloc((size_t)m->cfg.n_layers, sizeof *cb->L);
    if (!cb || !cb->L) {
        snprintf(err, errlen, "cuda: out of memory");
        if (cb) free(cb);
        return NULL;
    }
    cb->be.ops = &cuda_ops;
    cb->cu = cu, cb->m = m, cb->c = m->cfg, cb->cfg = *cfg;
    if (cb->cfg.cublas_min_tokens < 1) cb->cfg.cublas_min_tokens = 1;
    cb->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    kv_pool kv_new;
    int r = cb->efd < 0 ? (snprintf(cb->be.err, sizeof cb->be.err, "cuda: eventfd failed"), -EIO)
                        : start(cb, &kv_new, kc);
    if (r < 0) {
        snprintf(err, errlen, "%s", cb->be.err);
        if (cb->kv) kv_pool_free(&kv_new);
        cb->kv = NULL;
        cuda_destroy(&cb->be);
        return NULL;
    }
    *kv = kv_new; /* the hook's context is cb, not the pool: moving the struct is safe */
    cb->kv = kv;
    return &cb->be;
}

int backend_cuda_kv8(backend *be, const int32_t *blocks, int n) {
    cuda_backend *cb = (cuda_backend *)be;
    const cu_api *cu = cb->cu;
    kv_pool *p = cb->kv;
    if (cb->running || n < 0 || n > p->n_ids) {
        snprintf(be->err, sizeof be->err, "cuda: kv8: a step is running or %d blocks is out of range", n);
        return -EINVAL;
    }
    for (int i = 0; i < n; i++)
        if (blocks[i] < 0 || blocks[i] >= p->n_ids || p->loc[blocks[i]] < 0) {
            snprintf(be->err, sizeof be->err, "cuda: kv8: block %d out of range or free", blocks[i]);
            return -EINVAL;
        }
    CUresult r = CUDA_SUCCESS;
    if (p->q8) { /* a kv8 pool: through mm, which frees each block's second half */
        for (int i = 0; i < n; i++) kv_block_to_q8(p, blocks[i]);
    } else if (n) { /* in place, nothing freed: each block once (two CUDA blocks
                     * converting one KV block at once would tear it) */
        int32_t *list = malloc((size_t)n * sizeof *list);
        if (!list) {
            snprintf(be->err, sizeof be->err, "cuda: kv8: out of memory");
            return -ENOMEM;
        }
        int m = 0;
        for (int i = 0; i < n; i++) {
            int dup = 0;
            for (int j = 0; j < m && !dup; j++) dup = list[j] == blocks[i];
            if (!dup) list[m++] = blocks[i];
        }
        r = cu->cuCtxSetCurrent(cb->ctx);
        if (r == CUDA_SUCCESS)
            r = cu->cuMemcpyHtoDAsync(cb->kv8_list, list, (size_t)m * sizeof(int32_t), cb->st);
        if (r == CUDA_SUCCESS) r = kern_kv_to_fp8(&cb->k, cb->st, &cb->kvd, cb->kv8_list, 0, m);
        if (r == CUDA_SUCCESS) r = cu->cuStreamSynchronize(cb->st); /* list is freed below */
        free(list);
    }
    if (r == CUDA_SUCCESS && cb->copy_err != CUDA_SUCCESS) r = cb->copy_err, cb->copy_err = CUDA_SUCCESS;
    return r == CUDA_SUCCESS ? 0 : cufail(cb, r, "cuda: kv8");
}

void backend_cuda_describe(backend *be, char *buf, size_t n) {
    cuda_backend *cb = (cuda_backend *)be;
    snprintf(buf, n, "%s, %zu MiB: weights %zu MiB%s, KV pool %ld blocks (%zu MiB), scratch %zu MiB%s",
             cb->devname, cb->total_mem >> 20, cb->wbytes >> 20,
             cb->w16mem ? " (+ f16 copies for cuBLAS)" : "", cb->n_blocks, cb->kvbytes >> 20,
             cb->scratch_bytes >> 20, cb->cfg.graphs ? ", CUDA graphs" : "");
}
