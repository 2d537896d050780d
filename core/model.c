/* model: loading a Llama-family GGUF and the forward pass over a batch. */
#include "core/model.h"
#include "core/model_int.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/cpu/attn.h"
#include "core/cpu/isa.h"
#include "core/cpu/qpack.h"
#include "core/cpu/quant.h"
#include "core/cpu/vmath.h"
#include "core/threads.h"

#define MM_CHUNK 16    /* weight rows per matmul task: a multiple of quant_dot_rows' 4
                        * and of a packed group's QP_ROWS */
#define MM_CHUNK_WIDE 64 /* for the vocabulary-wide output matrix: longer runs of each
                          * token's logits per store (its rows are 196 KB apart) */
#define MM_CHUNK_BATCH 32 /* for steps of several tokens: the AMX K-quant tiles read each
                           * token group's activations once per two 16-row groups */
_Static_assert(MM_CHUNK % QP_ROWS == 0 && MM_CHUNK_WIDE % QP_ROWS == 0 && MM_CHUNK_BATCH % QP_ROWS == 0,
               "tasks start on a packed group");
#define MM_STREAM_T 4      /* steps of at most this many tokens stream their weights */
#define MM_STREAM_TASKS 2  /* tasks per thread and matrix when they do (1B Q4_K_M decode,
                            * paired runs: 16-row tasks 38 tok/s, 2 per thread 41, 1 per
                            * thread 42 but no slack when one thread is held up) */
#define MAX_XQ 3       /* distinct activation dot types one parallel matmul may need */
#define MM_EXACT_MAX 16384 /* widest row the f32-activation (exact) path handles */

/* ------------------------------------------------------------------ scratch */

static size_t mm_job_bytes(void); /* the parallel matmul's job, defined below */

struct model_state {
    int max_tokens, max_logits, max_ctx;
    float *x;      /* [T][d] residual stream */
    float *xb;     /* [T][max(d, qd)] normalized input / attention output */
    float *q;      /* [T][qd] */
    float *k, *v;  /* [T][kd] */
    float *hb;     /* [T][ffn] SwiGLU hidden */
    float *rope;   /* [T][rope_dim/2][2] cos, sin */
    float *rope_swa; /* the same for the sliding-window layers' RoPE */
    float *tmp;    /* [T][d] an output before its post-norm (Gemma) */
    float *logits; /* [max_logits][n_vocab] */
    int32_t *att_t0; /* [T + 1] the step's attention tiles: tile i is tokens
                      * [att_t0[i], att_t0[i + 1]) (att_tiles) */
    int n_att_tiles;
    uint8_t *xq[MAX_XQ]; /* quantized activations, one per dot type in use */
    int xq_type[MAX_XQ];
    size_t xq_stride;    /* bytes per token row in xq */
    int exact;           /* f32 activations (model_state_set_exact) */
    model_layer *layers; /* the model's layers, with packed copies where wanted */
    model_mat *experts;  /* their exp_gate/up/down arrays (the model's, copied) */
    model_mat output;
    /* mixture of experts: the router's logits [T][n_expert], each token's chosen experts
     * and weights [T][k], the (token, choice) pairs grouped by expert: gidx[t*k + j] is
     * the pair's row in xg/hg/og, gtok[row] its token */
    float *route, *selw, *xg, *hg, *og;
    float *shared, *shg; /* the shared expert's output [T][d] and gate logit [T] */
    int32_t *sel, *gidx, *gtok;
    uint8_t *xqg[2];     /* xg or hg quantized for the experts' matrices (two dot types) */
    size_t xqg_stride;   /* bytes per row there: as wide as d or an expert, not the widest
                          * matrix (a [T * k] buffer at xq_stride was 100 MB per 512 tokens) */
    struct mm_job *mjobs; /* [n_expert]: one job per chosen expert */
    uint8_t *packed;     /* one mapping holding every packed matrix */
    size_t packed_bytes;
};

/* A packed matrix's GGUF pages, read once by the packer, leave this process's
 * resident set: the packed copy is what the kernels read, so keeping both would
 * double the memory of a large model (peak RSS stays about one copy, piece by piece).
 * Only pages inside the file's read-only mapping, never a caller's buffer: there
 * MADV_DONTNEED just drops them, and a later read (the exact path) faults them back in
 * from the page cache. Not the token embedding's (a tied output matrix): its rows are
 * read from the file by every step, see commit_embedding. */
static void drop_source(const model *m, const void *from, size_t bytes) {
    const gguf_file *f = &m->gguf;
    if (!f->mapped) return;
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)from, hi = lo + bytes;
    uintptr_t base = (uintptr_t)f->base, end = base + f->size;
    if (lo < base || hi > end) return;
    lo = (lo + pg - 1) & ~(pg - 1), hi &= ~(pg - 1); /* whole pages of this range only */
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* Packed copies (core/cpu/qpack) of the matrices that want one, in one allocation: a
 * first pass sizes it and places each matrix, then threads pack them. */
static size_t place_one(model_mat *w, uint8_t *mem, size_t at) {
    size_t n = qp_wanted(w->type) ? qp_bytes(w->type, w->n_in, w->n_out) : 0;
    if (!n) return at;
    if (mem) w->packed = mem + at;
    return at + ((n + 63) & ~(size_t)63);
}

/* Part `part` of `parts` of every packed matrix: its share of the 16-row groups, so
 * the threads' work is even whatever the matrices' sizes. */
typedef struct {
    const model *m;
    model_state *s;
    int part, parts;
} pack_job;

static void pack_part_of(const pack_job *j, model_mat *w) {
    if (!w->packed) return;
    int groups = (w->n_out + QP_ROWS - 1) / QP_ROWS;
    int r0 = (int)((int64_t)groups * j->part / j->parts) * QP_ROWS;
    int r1 = (int)((int64_t)groups * (j->part + 1) / j->parts) * QP_ROWS;
    if (r1 > w->n_out) r1 = w->n_out;
    if (r1 <= r0) return;
    const uint8_t *src = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    size_t group_bytes = qp_bytes(w->type, w->n_in, QP_ROWS);
    uint8_t *dst = (uint8_t *)w->packed; /* const for the kernels; the state's own mapping */
    qp_pack(w->type, w->n_in, src, w->row_bytes, r1 - r0, dst + (size_t)(r0 / QP_ROWS) * group_bytes);
    if (w->data != j->m->w.tok_embd.data) drop_source(j->m, src, (size_t)(r1 - r0) * w->row_bytes);
}

/* The token embedding is read a row per token straight from the file's mapping (the
 * packed copy of a tied output matrix is laid out for the kernels, not by row). Left
 * to demand paging, a token's row joined the resident set the first time a request
 * used that token: kilnd's RSS crept up as long as new tokens turned up (issue 24: the
 * model file's resident pages went from 10 to 24 MiB over a 3,000-request soak, toward
 * the whole 29 MiB embedding of the default model), and a token's first use paid a
 * page fault in a step, a disk read on a cold page cache. Fixed-size memory is
 * committed at start instead: every page of the embedding is faulted in here, once.
 * (Clean file pages: the kernel may still reclaim them under memory pressure.) */
static void commit_embedding(const model *m) {
    const gguf_file *f = &m->gguf;
    const model_mat *w = &m->w.tok_embd;
    if (!f->mapped || !w->data) return;
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)w->data;
    uintptr_t hi = lo + (size_t)m->cfg.n_vocab * w->row_bytes;
    uintptr_t base = (uintptr_t)f->base, end = base + f->size;
    if (lo < base || hi > end || hi <= lo) return;
    lo &= ~(pg - 1);
    madvise((void *)lo, hi - lo, MADV_WILLNEED); /* read ahead; advice only */
    volatile const uint8_t *p = (const uint8_t *)lo;
    uint8_t sink = 0;
    for (uintptr_t at = 0; at < hi - lo; at += pg) sink ^= p[at];
    (void)sink;
}

/* Every weight matrix of a layer, the router's and experts' too, for the loops that
 * place, pack and list them; mats has room for LAYER_MATS_MAX. */
#define LAYER_MATS_MAX (12 + 3 * MODEL_MAX_EXPERTS)
static int layer_mats(const model_config *c, model_layer *L, model_mat **mats) {
    model_mat *fixed[] = {&L->wq,     &L->wk,          &L->wv,      &L->wo,    &L->w_gate, &L->w_up,
                          &L->w_down, &L->router,      &L->sh_gate_inp, &L->sh_gate, &L->sh_up,
                          &L->sh_down};
    int n = 0;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (fixed[i]->data) mats[n++] = fixed[i];
    for (int e = 0; e < c->n_expert; e++) {
        mats[n++] = &L->exp_gate[e];
        mats[n++] = &L->exp_up[e];
        mats[n++] = &L->exp_down[e];
    }
    return n;
}

static void *pack_part(void *arg) {
    const pack_job *j = arg;
    model_mat *mats[LAYER_MATS_MAX];
    for (int l = 0; l < j->m->cfg.n_layers; l++) {
        int n = layer_mats(&j->m->cfg, &j->s->layers[l], mats);
        for (int i = 0; i < n; i++) pack_part_of(j, mats[i]);
    }
    pack_part_of(j, &j->s->output);
    return NULL;
}

/* Packing reads and rewrites every weight once (an 8B Q4_K_M file is 4.9 GB): on one
 * thread that was most of its start-up. As many threads as the machine has (at most
 * PACK_THREADS), each a share of every matrix; one that cannot start is done here. */
#define PACK_THREADS 16
static void pack_parallel(model_state *s, const model *m) {
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    int parts = nc < 1 ? 1 : nc > PACK_THREADS ? PACK_THREADS : (int)nc;
    pack_job jobs[PACK_THREADS];
    pthread_t th[PACK_THREADS];
    int started[PACK_THREADS] = {0};
    for (int i = 0; i < parts; i++) {
        jobs[i] = (pack_job){m, s, i, parts};
        if (i > 0) started[i] = pthread_create(&th[i], NULL, pack_part, &jobs[i]) == 0;
    }
    pack_part(&jobs[0]);
    for (int i = 1; i < parts; i++) {
        if (started[i]) pthread_join(th[i], NULL);
        else pack_part(&jobs[i]);
    }
}

/* AMX's own tiles run Q4_1 (and Q8_0 with KILN_AMX=all) from the row-major layout: a
 * matrix they take is not on the slow path, though it has no packed copy. */
static int amx_runs(uint32_t type) {
    int a = isa_level() == ISA_AVX512 ? isa_amx() : ISA_AMX_OFF;
    return (a >= ISA_AMX_Q4_1 && type == QT_Q4_1) || (a == ISA_AMX_ALL && type == QT_Q8_0);
}

int model_unpacked_note(const model *m, char *buf, size_t n) {
    int count[QT_COUNT] = {0}, total = 0, slow = 0;
    model_mat *mats[LAYER_MATS_MAX];
    for (int l = 0; l <= m->cfg.n_layers; l++) {
        int k = 1; /* only reads them: the const cast is for layer_mats' other callers */
        if (l < m->cfg.n_layers) k = layer_mats(&m->cfg, (model_layer *)&m->w.layers[l], mats);
        else mats[0] = (model_mat *)&m->w.output;
        for (int i = 0; i < k; i++) {
            const model_mat *w = mats[i];
            if (!w->data) continue;
            total++;
            if ((qp_wanted(w->type) && qp_bytes(w->type, w->n_in, w->n_out)) || amx_runs(w->type)) continue;
            slow++;
            if (w->type < QT_COUNT) count[w->type]++;
        }
    }
    if (n) buf[0] = 0;
    if (!slow || !n) return slow;
    int lv = isa_level();
    size_t at = (size_t)snprintf(buf, n, "model: %d of %d matrices (", slow, total);
    const char *sep = "";
    for (int t = 0; t < QT_COUNT && at < n; t++)
        if (count[t]) {
            at += (size_t)snprintf(buf + at, n - at, "%s%s x %d", sep, quant_traits_of((uint32_t)t)->name, count[t]);
            sep = ", ";
        }
    if (at < n)
        snprintf(buf + at, n - at, ") have no packed kernel at %s: the row-major ones run them (slower)",
                 isa_name(lv));
    return slow;
}

static size_t place_all(model_state *s, const model *m, uint8_t *mem) {
    size_t at = 0;
    model_mat *mats[LAYER_MATS_MAX];
    for (int l = 0; l < m->cfg.n_layers; l++) {
        int n = layer_mats(&m->cfg, &s->layers[l], mats);
        for (int i = 0; i < n; i++) at = place_one(mats[i], mem, at);
    }
    return place_one(&s->output, mem, at);
}

static int pack_weights(model_state *s, const model *m) {
    size_t nl = (size_t)m->cfg.n_layers;
    s->layers = malloc(nl * sizeof *s->layers);
    if (!s->layers) return -1;
    memcpy(s->layers, m->w.layers, nl * sizeof *s->layers);
    if (m->cfg.n_expert) { /* the experts' matrices get packed copies too: the state's own */
        size_t ne = nl * 3 * (size_t)m->cfg.n_expert;
        if (!(s->experts = malloc(ne * sizeof *s->experts))) return -1;
        memcpy(s->experts, m->experts, ne * sizeof *s->experts);
        for (size_t l = 0; l < nl; l++) {
            model_layer *L = &s->layers[l];
            L->exp_gate = s->experts + (L->exp_gate - m->experts);
            L->exp_up = s->experts + (L->exp_up - m->experts);
            L->exp_down = s->experts + (L->exp_down - m->experts);
        }
    }
    s->output = m->w.output;
    size_t bytes = place_all(s, m, NULL);
    if (!bytes) return 0;
    /* its own mapping (page aligned), on huge pages where the kernel gives them: every
     * step streams all of it, ~100 MB for the default model, through the TLB */
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return -1;
    madvise(p, bytes, MADV_HUGEPAGE);
    s->packed = p, s->packed_bytes = bytes;
    place_all(s, m, s->packed);
    pack_parallel(s, m);
    return 0;
}

/* The state's scratch rows are sized for the largest step (max_tokens rows; the logits
 * are max_logits rows of the vocabulary, 9 MiB in the soak's configuration), but a
 * fresh allocation's pages only become resident when a step first writes that far:
 * RSS kept creeping up through a soak as steps grew (issue 24: the logits' mapping by
 * 0.6 MiB after the warm-up). The pages are written once here, so the state's memory
 * is committed when it is made. */
static void *commit_pages(void *p, size_t bytes) {
    if (!p) return NULL;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    volatile uint8_t *b = p;
    for (size_t at = 0; at < bytes; at += pg) b[at] = 0;
    if (bytes) b[bytes - 1] = 0;
    return p;
}
static void *state_alloc(size_t bytes) { return commit_pages(malloc(bytes), bytes); }
static void *state_aligned(size_t bytes) { return commit_pages(aligned_alloc(64, bytes), bytes); }

model_state *model_state_new(const model *m, int max_tokens, int max_logits, int max_ctx) {
    const model_config *c = &m->cfg;
    model_state *s = calloc(1, sizeof *s);
    if (!s || max_tokens < 1 || max_logits < 1) {
        free(s);
        return NULL;
    }
    size_t T = (size_t)max_tokens;
    size_t qd = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->n_kv_heads * c->head_dim;
    size_t wide = qd > (size_t)c->d_model ? qd : (size_t)c->d_model;
    size_t widest = wide > (size_t)c->ffn_dim ? wide : (size_t)c->ffn_dim;
    if ((size_t)c->ffn_exp_dim > widest) widest = (size_t)c->ffn_exp_dim;
    if ((size_t)c->ffn_shexp_dim > widest) widest = (size_t)c->ffn_shexp_dim;
    s->max_tokens = max_tokens, s->max_logits = max_logits, s->max_ctx = max_ctx;
    s->x = state_alloc(T * c->d_model * sizeof(float));
    s->xb = state_alloc(T * wide * sizeof(float));
    s->q = state_alloc(T * qd * sizeof(float));
    s->k = state_alloc(T * kd * sizeof(float));
    s->v = state_alloc(T * kd * sizeof(float));
    /* the dense FFN's hidden rows, or the shared expert's (Qwen2-MoE) */
    s->hb = state_alloc(T * (c->ffn_shexp_dim > c->ffn_dim ? c->ffn_shexp_dim : c->ffn_dim) * sizeof(float));
    s->rope = state_alloc(T * c->rope_dim * sizeof(float));
    if (c->swa_rope) s->rope_swa = state_alloc(T * c->rope_dim * sizeof(float));
    if (c->post_norms) s->tmp = state_alloc(T * c->d_model * sizeof(float));
    s->logits = state_alloc((size_t)max_logits * c->n_vocab * sizeof(float));
    s->att_t0 = state_alloc((T + 1) * sizeof(int32_t));
    /* Largest dot-type row: Q8_K is 292 bytes per 256, Q8_0/1 36 per 32, F32 4 per 1. */
    s->xq_stride = (widest * 4 + 63) & ~(size_t)63;
    int ok = s->x && s->xb && s->q && s->k && s->v && s->hb && s->rope && s->logits && s->att_t0 &&
             (!c->swa_rope || s->rope_swa) && (!c->post_norms || s->tmp) &&
             pack_weights(s, m) == 0;
    if (c->n_expert) {
        size_t P = T * (size_t)c->n_expert_used; /* (token, choice) pairs */
        s->route = state_alloc(T * c->n_expert * sizeof(float));
        s->selw = state_alloc(P * sizeof(float));
        s->xg = state_alloc(P * c->d_model * sizeof(float));
        s->hg = state_alloc(P * c->ffn_exp_dim * sizeof(float));
        s->og = state_alloc(P * c->d_model * sizeof(float));
        s->sel = state_alloc(P * sizeof(int32_t));
        s->gidx = state_alloc(P * sizeof(int32_t));
        s->gtok = state_alloc(P * sizeof(int32_t));
        size_t wx = (size_t)(c->d_model > c->ffn_exp_dim ? c->d_model : c->ffn_exp_dim);
        s->xqg_stride = (wx * 4 + 63) & ~(size_t)63; /* f32 rows (exact) are the widest form */
        s->xqg[0] = state_aligned(P * s->xqg_stride);
        s->xqg[1] = state_aligned(P * s->xqg_stride);
        s->mjobs = state_alloc((size_t)c->n_expert * mm_job_bytes());
        ok = ok && s->route && s->selw && s->xg && s->hg && s->og && s->sel && s->gidx && s->gtok &&
             s->xqg[0] && s->xqg[1] && s->mjobs;
        if (c->ffn_shexp_dim) {
            s->shared = state_alloc(T * c->d_model * sizeof(float));
            s->shg = state_alloc(T * sizeof(float));
            ok = ok && s->shared && s->shg;
        }
    }
    for (int i = 0; i < MAX_XQ; i++) {
        s->xq[i] = state_aligned(T * s->xq_stride);
        ok = ok && s->xq[i];
    }
    if (!ok) {
        model_state_free(s);
        return NULL;
    }
    commit_embedding(m);
    return s;
}

int model_state_set_exact(model_state *s, const model *m, int on) {
    const model_config *c = &m->cfg;
    int widest = c->ffn_dim > c->d_model ? c->ffn_dim : c->d_model;
    if (c->ffn_exp_dim > widest) widest = c->ffn_exp_dim;
    if (c->ffn_shexp_dim > widest) widest = c->ffn_shexp_dim;
    if (on && widest > MM_EXACT_MAX) return -EINVAL;
    s->exact = on;
    return 0;
}

void model_state_free(model_state *s) {
    if (!s) return;
    free(s->x), free(s->xb), free(s->q), free(s->k), free(s->v), free(s->hb);
    free(s->rope), free(s->rope_swa), free(s->tmp), free(s->logits), free(s->att_t0);
    for (int i = 0; i < MAX_XQ; i++) free(s->xq[i]);
    free(s->layers);
    free(s->experts);
    free(s->route), free(s->selw), free(s->xg), free(s->hg), free(s->og);
    free(s->sel), free(s->gidx), free(s->gtok), free(s->xqg[0]), free(s->xqg[1]), free(s->mjobs);
    free(s->shared), free(s->shg);
    if (s->packed) munmap(s->packed, s->packed_bytes);
    free(s);
}

/* ------------------------------------------------------------------ small kernels */

/* cos/sin of pos * rope_freq[i] (base^(-2i/rope_dim), scaled: model.h) for each token,
 * computed once per step. */
static void rope_table(const model_config *c, const model_batch *b, const double *freq,
                       float mscale, float *tab) {
    int half = c->rope_dim / 2;
    for (int t = 0; t < b->n_tokens; t++)
        for (int i = 0; i < half; i++) {
            double theta = (double)b->pos[t] * freq[i];
            tab[(t * half + i) * 2] = (float)cos(theta) * mscale;
            tab[(t * half + i) * 2 + 1] = (float)sin(theta) * mscale;
        }
}

static void rope_apply(const model_config *c, float *vec, int n_heads, const float *tab) {
    int half = c->rope_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = vec + h * c->head_dim;
        for (int i = 0; i < half; i++) {
            float co = tab[2 * i], si = tab[2 * i + 1];
            /* Llama (GGUF-permuted): pairs (2i, 2i+1). NeoX: pairs (i, i + rope_dim/2). */
            int a = c->rope_neox ? i : 2 * i, bb = c->rope_neox ? i + half : 2 * i + 1;
            float x0 = v[a], x1 = v[bb];
            v[a] = x0 * co - x1 * si;
            v[bb] = x0 * si + x1 * co;
        }
    }
}

/* ------------------------------------------------------------------ per-token work */

/* fn(ctx, t0, t1) over tokens [t0, t1). The norms, activation quantization, RoPE and
 * cache writes between the matmuls are per token; with a batch (a decode step of many
 * streams, a prompt chunk) they run in the pool instead of on the caller alone while
 * the other threads wait. Below PAR_MIN_TOKENS the hand-off costs more than it saves.
 * A token's result is the same either way. */
#define PAR_MIN_TOKENS 8
typedef void (*tok_fn)(void *ctx, int t0, int t1);
typedef struct {
    tok_fn fn;
    void *ctx;
    int n_tok, per;
} tok_job;

static void tok_task(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    const tok_job *j = ctx;
    int t0 = task * j->per, t1 = t0 + j->per < j->n_tok ? t0 + j->per : j->n_tok;
    j->fn(j->ctx, t0, t1);
}

static void per_token(thr_pool *tp, int T, tok_fn fn, void *ctx) {
    int nt = tp ? thr_pool_size(tp) : 1;
    if (nt < 2 || T < PAR_MIN_TOKENS) {
        fn(ctx, 0, T);
        return;
    }
    tok_job j = {fn, ctx, T, (T + 2 * nt - 1) / (2 * nt)}; /* two ranges per thread */
    thr_run(tp, tok_task, &j, (T + j.per - 1) / j.per);
}

typedef struct {
    float *out;
    const float *x;
    const float *w;
    int n, stride, in_stride;
    float eps;
    const int32_t *rows; /* token t reads x row rows[t] (NULL: row t) */
} norm_job;

static void norm_range(void *ctx, int t0, int t1) {
    const norm_job *j = ctx;
    for (int t = t0; t < t1; t++)
        vm_rmsnorm(j->out + (size_t)t * j->stride,
                   j->x + (size_t)(j->rows ? j->rows[t] : t) * j->in_stride, j->w, j->n, j->eps);
}

/* out[t] = rmsnorm(x[rows ? rows[t] : t]) for t < T, rows d wide. */
static void norm_tokens(thr_pool *tp, int T, float *out, const float *x, const int32_t *rows,
                        const float *w, int d, float eps) {
    norm_job j = {out, x, w, d, d, d, eps, rows};
    per_token(tp, T, norm_range, &j);
}

/* ------------------------------------------------------------------ parallel matmul */

enum { EPI_STORE, EPI_ADD, EPI_SWIGLU, EPI_GEGLU };

/* out = W·x for up to three matrices that read the same activations, split into
 * MM_CHUNK-row tasks. EPI_ADD accumulates scale·W·x into out (the residual add; scale is
 * Granite's residual multiplier, else 1), EPI_SWIGLU treats mats[0] as gate and mats[1]
 * as up and writes silu(gate)*up into out[0], EPI_GEGLU the same with gelu (Gemma). */
typedef struct mm_job {
    int n_mats;
    const model_mat *w[3];
    const uint8_t *xq[3];
    const float *bias[3];
    float *out[3];
    int ostride[3];      /* floats between tokens in out */
    int chunks[3];       /* tasks per matrix */
    int rows[3];         /* weight rows per task */
    int epi;
    float scale;
    int n_tok;
    size_t xstride;
    int exact;           /* xq holds f32 rows: dequantize weights, dot in f32 */
} mm_job;

static size_t mm_job_bytes(void) { return sizeof(mm_job); }

/* Rows [r0, r0 + nr) of w against nt activation rows: out[t*os + r]. The packed kernel
 * where the matrix has a packed copy, else the row-major one; either computes every
 * row x token pair the same way whatever the batch. */
static void mm_tile(const model_mat *w, int r0, int nr, const uint8_t *xq, size_t xs, int nt,
                    float *out, size_t os) {
    if (w->packed)
        qp_tile(w->type, w->n_in, w->packed, r0, nr, xq, xs, nt, out, os);
    else
        quant_dot_tile(w->type, w->n_in, (const uint8_t *)w->data + (size_t)r0 * w->row_bytes,
                       w->row_bytes, nr, xq, xs, nt, out, os);
}

static void mm_rows(const mm_job *j, int m, int r0, int nr, float *tmp) {
    const model_mat *w = j->w[m];
    const uint8_t *rows = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    if (j->exact) { /* the verification path: no activation rounding at all */
        float wrow[MM_EXACT_MAX];
        for (int r = 0; r < nr; r++) {
            quant_dequant(w->type, rows + (size_t)r * w->row_bytes, wrow, w->n_in);
            for (int t = 0; t < j->n_tok; t++)
                tmp[t * nr + r] = quant_dot(QT_F32, w->n_in, wrow, j->xq[m] + (size_t)t * j->xstride);
        }
    } else /* one kernel for every batch size: a token's result never depends on its batch */
        mm_tile(w, r0, nr, j->xq[m], j->xstride, j->n_tok, tmp, (size_t)nr);
    if (j->bias[m])
        for (int t = 0; t < j->n_tok; t++)
            for (int r = 0; r < nr; r++) tmp[t * nr + r] += j->bias[m][r0 + r];
}

static void mm_task(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    const mm_job *j = ctx;
    float tmp[2][MM_CHUNK_BATCH * 512]; /* a batch task's rows x 512 tokens */
    int m = 0;
    while (task >= j->chunks[m]) task -= j->chunks[m++];
    int rows = j->rows[m], r0 = task * rows, n_out = j->w[m]->n_out;
    int nr = n_out - r0 < rows ? n_out - r0 : rows;
    int tile = (int)(sizeof tmp[0] / sizeof(float)) / rows; /* tokens per pass */
    for (int t0 = 0; t0 < j->n_tok; t0 += tile) {
        mm_job part = *j; /* token tiles keep tmp on the stack */
        part.n_tok = j->n_tok - t0 < tile ? j->n_tok - t0 : tile;
        for (int i = 0; i < j->n_mats; i++) part.xq[i] = j->xq[i] + (size_t)t0 * j->xstride;
        float *o0 = j->out[m] + (size_t)t0 * j->ostride[m] + r0;
        if (j->epi == EPI_STORE && !j->bias[m] && !j->exact) { /* straight into out */
            mm_tile(j->w[m], r0, nr, part.xq[m], j->xstride, part.n_tok, o0, (size_t)j->ostride[m]);
            continue;
        }
        /* the epilogue in as few calls as it can: a task's piece of a token's row is
         * short (16 floats), so a call per token would cost more than its work */
        mm_rows(&part, m, r0, nr, tmp[0]);
        size_t os = (size_t)j->ostride[m];
        if (j->epi == EPI_SWIGLU || j->epi == EPI_GEGLU) {
            mm_rows(&part, 1, r0, nr, tmp[1]);
            (j->epi == EPI_SWIGLU ? vm_swiglu_rows : vm_geglu_rows)(o0, os, tmp[0], tmp[1], (size_t)nr,
                                                                    nr, part.n_tok);
        } else if (j->epi == EPI_ADD) {
            if (j->scale != 1.0f)
                for (int i = 0; i < part.n_tok * nr; i++) tmp[0][i] *= j->scale;
            vm_add_rows(o0, os, tmp[0], (size_t)nr, nr, part.n_tok);
        } else {
            for (int t = 0; t < part.n_tok; t++)
                memcpy(o0 + (size_t)t * os, tmp[0] + t * nr, (size_t)nr * sizeof(float));
        }
    }
}

/* Quantize T rows of x (stride xs floats, n wide) to the dot type of w, reusing a
 * buffer already holding that type for this input. Slot bookkeeping is per call. */
typedef struct {
    uint32_t type;
    const float *x;
    int xs, n;
    uint8_t *dst;
    size_t dst_stride;
} quant_job;

static void quant_range(void *ctx, int t0, int t1) {
    const quant_job *j = ctx;
    for (int t = t0; t < t1; t++)
        quant_quantize(j->type, j->x + (size_t)t * j->xs, j->dst + (size_t)t * j->dst_stride, j->n);
}

static int mm_dot_type(const model_state *s, const model_mat *w) {
    return s->exact ? QT_F32 : quant_traits_of(w->type)->dot_type;
}

/* rows [0, T) of x (xs floats apart, n wide) into dst as type dt, dst_stride bytes apart */
static void quant_rows(thr_pool *tp, int dt, const float *x, int xs, int n, int T, uint8_t *dst,
                       size_t dst_stride) {
    quant_job j = {(uint32_t)dt, x, xs, n, dst, dst_stride};
    per_token(tp, T, quant_range, &j);
}

static const uint8_t *prep_x(model_state *s, thr_pool *tp, int *used, const float *x, int xs,
                             int n, int T, const model_mat *w) {
    int dt = mm_dot_type(s, w);
    for (int i = 0; i < *used; i++)
        if (s->xq_type[i] == dt) return s->xq[i];
    int i = (*used)++;
    s->xq_type[i] = dt;
    quant_rows(tp, dt, x, xs, n, T, s->xq[i], s->xq_stride);
    return s->xq[i];
}

/* Weight rows per task. A batch wants short tasks (each streams its rows' weights
 * once for all the tokens, and short ones balance the threads). A decode step of one
 * or a few tokens is a pure stream of the weights: there long runs per task let each
 * core's prefetcher follow one long sequential read, instead of restarting on every
 * 16-row group the other threads leave gaps between. The split never changes a
 * result: every (row, token) pair is computed the same way in any task. */
static int mm_task_rows(int n_out, int T, int n_threads) {
    if (T > MM_STREAM_T) return n_out >= 8192 ? MM_CHUNK_WIDE : MM_CHUNK_BATCH;
    int rows = n_out >= 8192 ? MM_CHUNK_WIDE : MM_CHUNK;
    if (n_threads < 2) return rows;
    int want = (n_out + n_threads * MM_STREAM_TASKS - 1) / (n_threads * MM_STREAM_TASKS);
    want = (want + QP_ROWS - 1) / QP_ROWS * QP_ROWS;
    int most = MM_CHUNK * 512 / T; /* mm_task's tmp holds rows x tokens */
    most -= most % QP_ROWS;
    return want < rows ? rows : want > most ? most : want;
}

/* A job over activations already quantized (xq[i] for w[i], rows xstride apart);
 * returns its task count. */
static int mm_setup(mm_job *j, const model_state *s, thr_pool *tp, int T, int epi, float scale,
                    int n_mats, const model_mat *const *w, const uint8_t *const *xq,
                    size_t xstride, const float *const *bias, float *const *out,
                    const int *ostride) {
    *j = (mm_job){.n_mats = n_mats, .epi = epi, .scale = scale, .n_tok = T, .xstride = xstride,
                  .exact = s->exact};
    int total = 0;
    for (int i = 0; i < n_mats; i++) {
        j->w[i] = w[i];
        j->xq[i] = xq[i];
        j->bias[i] = bias ? bias[i] : NULL;
        j->out[i] = out[i];
        j->ostride[i] = ostride[i];
        j->rows[i] = mm_task_rows(w[i]->n_out, T, tp ? thr_pool_size(tp) : 1);
        j->chunks[i] = ((epi == EPI_SWIGLU || epi == EPI_GEGLU) && i == 1)
                           ? 0 : (w[i]->n_out + j->rows[i] - 1) / j->rows[i];
        total += j->chunks[i];
    }
    return total;
}

static void matmul(model_state *s, thr_pool *tp, const float *x, int xs, int T, int epi,
                   float scale, int n_mats, const model_mat *const *w, const float *const *bias,
                   float *const *out, const int *ostride) {
    const uint8_t *xq[3];
    int used = 0;
    for (int i = 0; i < n_mats; i++) xq[i] = prep_x(s, tp, &used, x, xs, w[i]->n_in, T, w[i]);
    mm_job j;
    int total = mm_setup(&j, s, tp, T, epi, scale, n_mats, w, xq, s->xq_stride, bias, out, ostride);
    if (tp) thr_run(tp, mm_task, &j, total);
    else for (int t = 0; t < total; t++) mm_task(&j, t, total);
}

/* Many jobs as one parallel run (the chosen experts of a layer): task t belongs to the
 * job k with first[k] <= t < first[k + 1]. */
typedef struct {
    const mm_job *jobs;
    const int *first;
    int n;
} mm_multi;

static void mm_multi_task(void *ctx, int task, int n_tasks) {
    const mm_multi *mj = ctx;
    int lo = 0, hi = mj->n - 1;
    while (lo < hi) { /* the last job whose first task is <= task */
        int mid = (lo + hi + 1) / 2;
        if (mj->first[mid] <= task) lo = mid;
        else hi = mid - 1;
    }
    mm_task((void *)&mj->jobs[lo], task - mj->first[lo], n_tasks);
}

/* ------------------------------------------------------------------ attention */

typedef struct {
    const model *m;
    const model_batch *b;
    model_state *s;
    const kv_pool *kv;
    int layer;
    int heads; /* KV heads per task: all of a token's (decode steps with many tokens), or 1 */
} att_job;

/* Query states one task holds: ATT_MAX_KV_HEADS heads of one token, or ATT_TILE tokens
 * of one head. att_run's frame holds that many queries and states, ~530 KB: compute
 * threads get 4 MiB stacks (threads.c, backend_cpu.c), musl's default of 128 KB would
 * not do. */
#define ATT_MAX_KV_HEADS 8
#define ATT_TILE 16
#define ATT_MAX_STATES 16

/* The step's tokens in attention tiles (s->att_t0): runs of tokens of one sequence at
 * consecutive positions (a prompt chunk), a token alone otherwise (a decode). A run is
 * cut into tiles of at most ATT_TILE tokens, fewer when the step is small, so there are
 * about four tasks (tile x KV head) a thread: a 14-token chunk beside a decode was 3
 * tasks of 14 tokens for 2 threads, one waiting out the other's. Their count. */
static int att_tiles(model_state *s, const model_batch *b, const model_config *c, int threads) {
    int tile = b->n_tokens * c->n_kv_heads / (4 * threads);
    tile = tile < 1 ? 1 : tile > ATT_TILE ? ATT_TILE : tile;
    int n = 0;
    for (int t = 0; t < b->n_tokens; t++)
        if (t == 0 || b->seq[t] != b->seq[t - 1] || b->pos[t] != b->pos[t - 1] + 1 ||
            t - s->att_t0[n - 1] >= tile)
            s->att_t0[n++] = t;
    s->att_t0[n] = b->n_tokens;
    return s->n_att_tiles = n;
}

/* Asks for the K slabs and the V rows [0, rows) of heads [h0, h0 + nh) of a block, one
 * block ahead of their attn_block calls: the page table scatters a sequence's blocks,
 * so the hardware prefetcher starts afresh at each 2 KB slab and a decode at a long
 * context waited on memory at every block. (A K slab is dimension-major: its first
 * rows' keys lie across all of it.) */
static void att_prefetch(const kv_pool *kv, int32_t blk, int layer, int h0, int nh, int rows) {
    int q8 = kv_is_q8(kv, blk);
    size_t el = q8 ? 1 : sizeof(uint16_t); /* a block's heads are adjacent slabs */
    size_t kbytes = (size_t)nh * kv->head_elems * el;
    size_t vbytes = ((size_t)(nh - 1) * kv->head_elems + (size_t)rows * kv->cfg.head_dim) * el;
    const char *k = q8 ? (const char *)kv_q8_slab(kv, blk, layer, 0, h0)
                       : (const char *)kv_k(kv, blk, layer, h0);
    const char *v = q8 ? (const char *)kv_q8_slab(kv, blk, layer, 1, h0)
                       : (const char *)kv_v(kv, blk, layer, h0);
    for (size_t o = 0; o < kbytes; o += 64) isa_prefetch_l2(k + o);
    for (size_t o = 0; o < vbytes; o += 64) isa_prefetch_l2(v + o);
}

/* Tokens [t0, t0 + nt) of one sequence at consecutive positions, each with the query
 * heads that share each of its KV heads [h0, h0 + nh) (nt * nh ≤ ATT_MAX_STATES),
 * against the sequence's positions up to the token's own, block by block through the
 * page table (online softmax in core/cpu/attn). The block loop is outermost: a prompt
 * chunk's tokens fold each block in while it is in cache, where a token at a time would
 * read the whole context from memory once per token (32 tokens at position 900 read 32x
 * the KV they need). A block's K rows of all heads of a layer lie side by side (V's
 * too: mm/kv.h), so a decode's heads walked inside the block loop read one run of memory
 * instead of nh scattered ones. Each (token, head) state sees the same blocks, in the
 * same order and with the same counts, whatever the tiling: the arithmetic of a token
 * does not depend on its batch. */
static void att_run(const att_job *j, int t0, int nt, int h0, int nh) {
    const model_config *c = &j->m->cfg;
    const kv_pool *kv = j->kv;
    int hd = c->head_dim, bs = kv->cfg.block_size, g = c->n_heads / c->n_kv_heads;
    const kv_seq *sq = j->b->seq[t0];
    int swa = j->m->w.layers[j->layer].swa;
    float q[ATT_MAX_STATES][ATTN_MAX_GROUP * ATTN_MAX_DIM];
    attn_state st[ATT_MAX_STATES];
    int first[ATT_TILE], n_pos[ATT_TILE], lo = INT_MAX, hi = 0;
    float scale = c->attn_scale;
    for (int i = 0; i < nt; i++) {
        int t = t0 + i;
        n_pos[i] = j->b->pos[t] + 1;
        /* a sliding-window layer sees the last swa_window positions, this one included */
        first[i] = swa ? kv_swa_first(c->swa_window, j->b->pos[t]) : 0;
        lo = first[i] / bs * bs < lo ? first[i] / bs * bs : lo;
        hi = n_pos[i] > hi ? n_pos[i] : hi;
        for (int h = 0; h < nh; h++) {
            const float *qsrc = j->s->q + (size_t)t * c->n_heads * hd + (size_t)(h0 + h) * g * hd;
            float *qd = q[i * nh + h];
            for (int e = 0; e < g * hd; e++) qd[e] = qsrc[e] * scale;
            attn_init(&st[i * nh + h], g, hd);
            attn_set_softcap(&st[i * nh + h], c->attn_softcap);
        }
    }
    for (int p0 = lo; p0 < hi; p0 += bs) {
        int32_t blk = sq->blocks[p0 / bs];
        if (p0 + bs < hi)
            att_prefetch(kv, sq->blocks[p0 / bs + 1], j->layer, h0, nh, hi - p0 - bs < bs ? hi - p0 - bs : bs);
        for (int i = 0; i < nt; i++) {
            if (p0 < first[i] / bs * bs || p0 >= n_pos[i]) continue; /* outside its range */
            int skip = first[i] > p0 ? first[i] - p0 : 0; /* rows of this block before the window */
            int n = (n_pos[i] - p0 < bs ? n_pos[i] - p0 : bs) - skip;
            size_t at = (size_t)skip * hd; /* V's rows; K's columns start at skip */
            for (int h = 0; h < nh; h++) {
                int kvh = h0 + h;
                attn_state *sh = &st[i * nh + h];
                if (kv_is_q8(kv, blk)) /* an 8-bit block (the ladder's rung 2) */
                    attn_block_q8(sh, q[i * nh + h], kv_q8_slab(kv, blk, j->layer, 0, kvh) + skip,
                                  (size_t)bs, kv_q8_scale(kv, blk, j->layer, 0, kvh),
                                  kv_q8_slab(kv, blk, j->layer, 1, kvh) + at,
                                  kv_q8_scale(kv, blk, j->layer, 1, kvh), n);
                else
                    attn_block(sh, q[i * nh + h], kv_k(kv, blk, j->layer, kvh) + skip, (size_t)bs,
                               kv_v(kv, blk, j->layer, kvh) + at, n);
            }
        }
    }
    for (int i = 0; i < nt; i++)
        for (int h = 0; h < nh; h++)
            attn_finish(&st[i * nh + h],
                        j->s->xb + (size_t)(t0 + i) * c->n_heads * hd + (size_t)(h0 + h) * g * hd,
                        (size_t)hd);
}

/* Task i: tile i / per_tile, its KV heads' group i % per_tile. */
static void att_task(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    const att_job *j = ctx;
    const int32_t *t0 = j->s->att_t0;
    int per_tile = j->m->cfg.n_kv_heads / j->heads, tile = task / per_tile;
    att_run(j, t0[tile], t0[tile + 1] - t0[tile], task % per_tile * j->heads, j->heads);
}

typedef struct {
    const model_config *c;
    const model_layer *L;
    model_state *s;
    kv_pool *kv;
    const model_batch *b;
    int layer;
} rope_store_job;

static void head_norm(const model_config *c, float *vec, int n_heads, const float *w) {
    for (int h = 0; h < n_heads; h++)
        vm_rmsnorm(vec + (size_t)h * c->head_dim, vec + (size_t)h * c->head_dim, w, c->head_dim,
                   c->rms_eps);
}

/* Qwen3's per-head q/k norms and RoPE on the step's q and k rows, then k and v into the
 * cache (f16) at each token's position: tokens of one sequence write different rows,
 * so ranges run in parallel. */
static void rope_store_range(void *ctx, int t0, int t1) {
    const rope_store_job *j = ctx;
    const model_config *c = j->c;
    model_state *s = j->s;
    int hd = c->head_dim, bs = j->kv->cfg.block_size, kd = c->n_kv_heads * hd;
    int qd = c->n_heads * hd, half = c->rope_dim / 2;
    const float *tab = j->L->swa && c->swa_rope ? s->rope_swa : s->rope;
    for (int t = t0; t < t1; t++) {
        if (j->L->q_norm) {
            head_norm(c, s->q + (size_t)t * qd, c->n_heads, j->L->q_norm);
            head_norm(c, s->k + (size_t)t * kd, c->n_kv_heads, j->L->k_norm);
        }
        rope_apply(c, s->q + (size_t)t * qd, c->n_heads, tab + (size_t)t * half * 2);
        rope_apply(c, s->k + (size_t)t * kd, c->n_kv_heads, tab + (size_t)t * half * 2);
        int pos = j->b->pos[t];
        int32_t blk = j->b->seq[t]->blocks[pos / bs];
        int slot = pos % bs;
        for (int h = 0; h < c->n_kv_heads; h++) {
            uint16_t row[ATTN_MAX_DIM]; /* K's slab is dimension-major (mm/kv.h) */
            uint16_t *K = kv_k(j->kv, blk, j->layer, h);
            quant_quantize(QT_F16, s->k + (size_t)t * kd + h * hd, row, hd);
            for (int d = 0; d < hd; d++) K[kv_k_index(j->kv, slot, d)] = row[d];
            quant_quantize(QT_F16, s->v + (size_t)t * kd + h * hd,
                           kv_v(j->kv, blk, j->layer, h) + (size_t)slot * hd, hd);
        }
    }
}

/* ------------------------------------------------------------------ experts */

/* Each token's n_expert_used experts: the largest router logits (the lower index first
 * on a tie), weighted by the softmax over those alone, which is the softmax over all
 * experts renormalized over the chosen ones; without expert_norm (Qwen2-MoE) by their
 * softmax probabilities over all the experts. */
static void route_tokens(const model_config *c, model_state *s, int T) {
    int ne = c->n_expert, k = c->n_expert_used;
    for (int t = 0; t < T; t++) {
        const float *lg = s->route + (size_t)t * ne;
        int32_t *sel = s->sel + (size_t)t * k;
        float *w = s->selw + (size_t)t * k;
        uint8_t taken[MODEL_MAX_EXPERTS] = {0};
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < ne; e++)
                if (!taken[e] && (best < 0 || lg[e] > lg[best])) best = e;
            taken[best] = 1, sel[j] = best;
        }
        double sum = 0;
        for (int j = 0; j < k; j++) sum += w[j] = expf(lg[sel[j]] - lg[sel[0]]);
        if (!c->expert_norm)
            for (int e = 0; e < ne; e++) sum += taken[e] ? 0.0 : expf(lg[e] - lg[sel[0]]);
        for (int j = 0; j < k; j++) w[j] = (float)(w[j] / sum);
    }
}

typedef struct {
    const model_config *c;
    model_state *s;
} moe_sum_job;

/* x[t] += resid_scale * sum_j w_j * expert_j(x[t]), the choices in rank order: a token's
 * sum is the same whatever else is in its batch. */
static void moe_sum_range(void *ctx, int t0, int t1) {
    const moe_sum_job *j = ctx;
    const model_config *c = j->c;
    model_state *s = j->s;
    int d = c->d_model, k = c->n_expert_used;
    for (int t = t0; t < t1; t++) {
        float *acc = s->xb + (size_t)t * d; /* the normed input is no longer needed */
        for (int i = 0; i < d; i++) acc[i] = 0.0f;
        for (int jj = 0; jj < k; jj++) {
            const float *o = s->og + (size_t)s->gidx[t * k + jj] * d;
            float w = s->selw[t * k + jj];
            for (int i = 0; i < d; i++) acc[i] += w * o[i];
        }
        if (c->ffn_shexp_dim) { /* Qwen2-MoE's shared expert, gated per token */
            float g = 1.0f / (1.0f + expf(-s->shg[t]));
            const float *o = s->shared + (size_t)t * d;
            for (int i = 0; i < d; i++) acc[i] += g * o[i];
        }
        float *x = s->x + (size_t)t * d;
        for (int i = 0; i < d; i++) x[i] += c->resid_scale * acc[i];
    }
}

/* Qwen2-MoE's shared expert on every token's normed row (xb): its gate logit into shg,
 * its SwiGLU output into shared. */
static void shared_expert(const model_config *c, model_state *s, thr_pool *tp, const model_layer *L,
                          int T) {
    int d = c->d_model, fs = c->ffn_shexp_dim;
    const model_mat *gw[1] = {&L->sh_gate_inp};
    float *go[1] = {s->shg};
    int gs[1] = {1};
    matmul(s, tp, s->xb, d, T, EPI_STORE, 1.0f, 1, gw, NULL, go, gs);
    const model_mat *gu[2] = {&L->sh_gate, &L->sh_up};
    float *hb[2] = {s->hb, s->hb};
    int hs[2] = {fs, fs};
    matmul(s, tp, s->xb, d, T, EPI_SWIGLU, 1.0f, 2, gu, NULL, hb, hs);
    const model_mat *dw[1] = {&L->sh_down};
    float *so[1] = {s->shared};
    int ss[1] = {d};
    matmul(s, tp, s->hb, fs, T, EPI_STORE, 1.0f, 1, dw, NULL, so, ss);
}

/* The mixture-of-experts FFN on the normed rows in xb: route, group the (token, choice)
 * pairs by expert, run each chosen expert once over its tokens (its weights stream once
 * per step however many tokens chose it; a decode step reads only the chosen experts),
 * then sum each token's choices into the residual. */
static void moe_ffn(const model *m, model_state *s, thr_pool *tp, const model_layer *L, int T) {
    const model_config *c = &m->cfg;
    int d = c->d_model, fe = c->ffn_exp_dim, k = c->n_expert_used, ne = c->n_expert;
    const model_mat *rw[1] = {&L->router};
    float *ro[1] = {s->route};
    int rs[1] = {ne};
    matmul(s, tp, s->xb, d, T, EPI_STORE, 1.0f, 1, rw, NULL, ro, rs);
    route_tokens(c, s, T);
    int cnt[MODEL_MAX_EXPERTS] = {0}, off[MODEL_MAX_EXPERTS + 1], at[MODEL_MAX_EXPERTS];
    for (int i = 0; i < T * k; i++) cnt[s->sel[i]]++;
    off[0] = 0;
    for (int e = 0; e < ne; e++) off[e + 1] = off[e] + cnt[e], at[e] = off[e];
    for (int i = 0; i < T * k; i++) {
        int g = at[s->sel[i]]++;
        s->gidx[i] = g, s->gtok[g] = i / k;
    }
    int P = T * k;
    for (int g = 0; g < P; g++)
        memcpy(s->xg + (size_t)g * d, s->xb + (size_t)s->gtok[g] * d, (size_t)d * sizeof(float));
    /* every chosen expert's gate and up in one parallel run, then every down in another:
     * a decode step has 8 small experts per layer, and a run each left the threads
     * waiting on one another (28% of a Qwen3-MoE decode step spent in the hand-offs) */
    size_t qs = s->xqg_stride;
    int dg = mm_dot_type(s, &L->exp_gate[0]), du = mm_dot_type(s, &L->exp_up[0]);
    quant_rows(tp, dg, s->xg, d, d, P, s->xqg[0], qs);
    if (du != dg) quant_rows(tp, du, s->xg, d, d, P, s->xqg[1], qs);
    const uint8_t *xu = du != dg ? s->xqg[1] : s->xqg[0];
    int first[MODEL_MAX_EXPERTS + 1], n = 0;
    first[0] = 0;
    for (int e = 0; e < ne; e++) {
        if (!cnt[e]) continue;
        const model_mat *gu[2] = {&L->exp_gate[e], &L->exp_up[e]};
        const uint8_t *xq[2] = {s->xqg[0] + (size_t)off[e] * qs, xu + (size_t)off[e] * qs};
        float *h = s->hg + (size_t)off[e] * fe, *hh[2] = {h, h};
        int hs[2] = {fe, fe};
        first[n + 1] = first[n] + mm_setup(&s->mjobs[n], s, tp, cnt[e], EPI_SWIGLU, 1.0f, 2, gu, xq,
                                           qs, NULL, hh, hs);
        n++;
    }
    mm_multi mj = {s->mjobs, first, n};
    if (tp) thr_run(tp, mm_multi_task, &mj, first[n]);
    else for (int t = 0; t < first[n]; t++) mm_multi_task(&mj, t, first[n]);
    quant_rows(tp, mm_dot_type(s, &L->exp_down[0]), s->hg, fe, fe, P, s->xqg[0], qs);
    n = 0;
    for (int e = 0; e < ne; e++) {
        if (!cnt[e]) continue;
        const model_mat *dw[1] = {&L->exp_down[e]};
        const uint8_t *xq[1] = {s->xqg[0] + (size_t)off[e] * qs};
        float *o[1] = {s->og + (size_t)off[e] * d};
        int os[1] = {d};
        first[n + 1] = first[n] + mm_setup(&s->mjobs[n], s, tp, cnt[e], EPI_STORE, 1.0f, 1, dw, xq, qs,
                                           NULL, o, os);
        n++;
    }
    if (tp) thr_run(tp, mm_multi_task, &mj, first[n]);
    else for (int t = 0; t < first[n]; t++) mm_multi_task(&mj, t, first[n]);
    if (c->ffn_shexp_dim) shared_expert(c, s, tp, L, T);
    moe_sum_job j = {c, s};
    per_token(tp, T, moe_sum_range, &j);
}

/* ------------------------------------------------------------------ residual adds */

typedef struct {
    model_state *s;
    const float *w;
    int d;
    float eps;
} post_job;

static void post_range(void *ctx, int t0, int t1) {
    const post_job *j = ctx;
    for (int t = t0; t < t1; t++) {
        float *o = j->s->tmp + (size_t)t * j->d;
        vm_rmsnorm(o, o, j->w, j->d, j->eps);
        vm_add(j->s->x + (size_t)t * j->d, o, j->d);
    }
}

/* x += resid_scale * W·in (the add inside the matmul's epilogue), or with a post-norm
 * (Gemma) x += rmsnorm(W·in). */
static void residual_matmul(const model_config *c, model_state *s, thr_pool *tp, const float *in,
                            int in_w, int T, const model_mat *w, const float *post) {
    const model_mat *ws[1] = {w};
    int os[1] = {c->d_model};
    if (!post) {
        float *xo[1] = {s->x};
        matmul(s, tp, in, in_w, T, EPI_ADD, c->resid_scale, 1, ws, NULL, xo, os);
        return;
    }
    float *to[1] = {s->tmp};
    matmul(s, tp, in, in_w, T, EPI_STORE, 1.0f, 1, ws, NULL, to, os);
    post_job j = {s, post, c->d_model, c->rms_eps};
    per_token(tp, T, post_range, &j);
}

/* ------------------------------------------------------------------ forward */

static int check_batch(const model *m, const model_state *s, const kv_pool *kv,
                       const model_batch *b, char *err, size_t en) {
    if (b->n_tokens < 1 || b->n_tokens > s->max_tokens || b->n_logits < 0 ||
        b->n_logits > s->max_logits)
        return model_fail(err, en, -EINVAL, "forward: batch of %d tokens / %d logits exceeds %d / %d",
                    b->n_tokens, b->n_logits, s->max_tokens, s->max_logits);
    int bs = kv->cfg.block_size;
    if (bs > ATTN_MAX_BLOCK || kv->cfg.head_dim != m->cfg.head_dim ||
        kv->cfg.n_layers != m->cfg.n_layers || kv->cfg.n_kv_heads != m->cfg.n_kv_heads)
        return model_fail(err, en, -EINVAL, "forward: KV pool shape does not match the model");
    for (int t = 0; t < b->n_tokens; t++) {
        if (b->tokens[t] < 0 || b->tokens[t] >= m->cfg.n_vocab)
            return model_fail(err, en, -EINVAL, "forward: token id %d out of range", b->tokens[t]);
        if (b->pos[t] < 0 || b->pos[t] >= s->max_ctx || b->pos[t] >= b->seq[t]->n_blocks * bs)
            return model_fail(err, en, -EINVAL, "forward: position %d has no KV block reserved",
                        b->pos[t]);
        if (kv_is_q8(kv, b->seq[t]->blocks[b->pos[t] / bs])) /* writes need kv_seq_cow */
            return model_fail(err, en, -EINVAL, "forward: position %d lies in an 8-bit KV block",
                        b->pos[t]);
    }
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n_tokens)
            return model_fail(err, en, -EINVAL, "forward: logit row %d out of range", b->logit_rows[i]);
    return 0;
}

const float *model_forward(const model *m, model_state *s, kv_pool *kv, thr_pool *tp,
                           const model_batch *b, char *err, size_t en) {
    const model_config *c = &m->cfg;
    if (check_batch(m, s, kv, b, err, en) < 0) return NULL;
    int T = b->n_tokens, d = c->d_model, hd = c->head_dim;
    int qd = c->n_heads * hd, kd = c->n_kv_heads * hd;

    for (int t = 0; t < T; t++) /* token embeddings */
        quant_dequant(m->w.tok_embd.type,
                      (const uint8_t *)m->w.tok_embd.data + (size_t)b->tokens[t] * m->w.tok_embd.row_bytes,
                      s->x + (size_t)t * d, d);
    if (c->embd_scale != 1.0f)
        for (size_t i = 0; i < (size_t)T * d; i++) s->x[i] *= c->embd_scale;
    rope_table(c, b, c->rope_freq, c->rope_mscale, s->rope);
    if (c->swa_rope) rope_table(c, b, c->rope_freq_swa, 1.0f, s->rope_swa);
    int n_tiles = att_tiles(s, b, c, tp ? thr_pool_size(tp) : 1);

    for (int l = 0; l < c->n_layers; l++) {
        const model_layer *L = &s->layers[l];
        /* attention: norm, q/k/v projections, rope, cache write */
        norm_tokens(tp, T, s->xb, s->x, NULL, L->attn_norm, d, c->rms_eps);
        const model_mat *qkv[3] = {&L->wq, &L->wk, &L->wv};
        const float *bias[3] = {L->bq, L->bk, L->bv};
        float *qkv_out[3] = {s->q, s->k, s->v};
        int qkv_stride[3] = {qd, kd, kd};
        matmul(s, tp, s->xb, d, T, EPI_STORE, 1.0f, 3, qkv, bias, qkv_out, qkv_stride);
        rope_store_job rj = {c, L, s, kv, b, l};
        per_token(tp, T, rope_store_range, &rj);
        /* attention over the paged cache, output into xb, then x += Wo·xb */
        /* a decode batch with enough tokens to share among the threads: a task per
         * token (all its heads); else a task per tile (a prompt chunk's tokens, or a
         * lone decode) and KV head */
        int whole = n_tiles == T && c->n_kv_heads <= ATT_MAX_KV_HEADS &&
                    T >= 4 * (tp ? thr_pool_size(tp) : 1);
        att_job aj = {m, b, s, kv, l, whole ? c->n_kv_heads : 1};
        int n_att = n_tiles * (c->n_kv_heads / aj.heads);
        if (tp) thr_run(tp, att_task, &aj, n_att);
        else for (int i = 0; i < n_att; i++) att_task(&aj, i, n_att);
        residual_matmul(c, s, tp, s->xb, qd, T, &L->wo, L->attn_post_norm);
        /* feed-forward: x += W_down·(silu(W_gate·n) * W_up·n), n = norm(x) */
        norm_tokens(tp, T, s->xb, s->x, NULL, L->ffn_norm, d, c->rms_eps);
        if (c->n_expert) {
            moe_ffn(m, s, tp, L, T);
            continue;
        }
        const model_mat *gu[2] = {&L->w_gate, &L->w_up};
        float *hb[2] = {s->hb, s->hb};
        int hs[2] = {c->ffn_dim, c->ffn_dim};
        matmul(s, tp, s->xb, d, T, c->ffn_gelu ? EPI_GEGLU : EPI_SWIGLU, 1.0f, 2, gu, NULL, hb, hs);
        residual_matmul(c, s, tp, s->hb, c->ffn_dim, T, &L->w_down, L->ffn_post_norm);
    }

    /* final norm and logits, only for the requested rows */
    norm_tokens(tp, b->n_logits, s->xb, s->x, b->logit_rows, m->w.out_norm, d, c->rms_eps);
    if (b->n_logits > 0) {
        const model_mat *wout[1] = {&s->output};
        float *lo[1] = {s->logits};
        int ls[1] = {c->n_vocab};
        matmul(s, tp, s->xb, d, b->n_logits, EPI_STORE, 1.0f, 1, wout, NULL, lo, ls);
        size_t nl = (size_t)b->n_logits * c->n_vocab;
        if (c->logit_scale != 1.0f) /* Granite divides, as llama.cpp does */
            for (size_t i = 0; i < nl; i++) s->logits[i] /= c->logit_scale;
        if (c->final_softcap > 0)
            for (size_t i = 0; i < nl; i++)
                s->logits[i] = c->final_softcap * tanhf(s->logits[i] / c->final_softcap);
    }
    return s->logits;
}
