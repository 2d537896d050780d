/* shape: random-weight GGUF models of real shapes (see shape.h). */
#include "core/shape.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cpu/quant.h"
#include "core/gguf.h"
#include "core/threads.h"

/* Published configurations (each model's config.json). */
static const shape_def shapes[] = {
    {.name = "smollm2-135m", .arch = "llama", .d = 576, .layers = 30, .heads = 9, .kv = 3,
     .ffn = 1536, .vocab = 49152, .tied = 1, .ctx = 8192, .theta = 1e5f, .eps = 1e-5f},
    {.name = "llama-3.2-1b", .arch = "llama", .d = 2048, .layers = 16, .heads = 32, .kv = 8,
     .ffn = 8192, .vocab = 128256, .tied = 1, .ctx = 131072, .theta = 5e5f, .eps = 1e-5f,
     .llama3 = {32, 1, 4, 8192}},
    {.name = "llama-3.2-3b", .arch = "llama", .d = 3072, .layers = 28, .heads = 24, .kv = 8,
     .ffn = 8192, .vocab = 128256, .tied = 1, .ctx = 131072, .theta = 5e5f, .eps = 1e-5f,
     .llama3 = {32, 1, 4, 8192}},
    /* Llama 3 8B: 3.1's shape without its RoPE factors (what the CUDA backend runs today) */
    {.name = "llama-3-8b", .arch = "llama", .d = 4096, .layers = 32, .heads = 32, .kv = 8,
     .ffn = 14336, .vocab = 128256, .ctx = 8192, .theta = 5e5f, .eps = 1e-5f},
    {.name = "llama-3.1-8b", .arch = "llama", .d = 4096, .layers = 32, .heads = 32, .kv = 8,
     .ffn = 14336, .vocab = 128256, .ctx = 131072, .theta = 5e5f, .eps = 1e-5f,
     .llama3 = {8, 1, 4, 8192}},
    {.name = "qwen3-0.6b", .arch = "qwen3", .d = 1024, .layers = 28, .heads = 16, .kv = 8,
     .hd = 128, .ffn = 3072, .vocab = 151936, .tied = 1, .ctx = 40960, .theta = 1e6f, .eps = 1e-6f},
    {.name = "qwen3-8b", .arch = "qwen3", .d = 4096, .layers = 36, .heads = 32, .kv = 8,
     .hd = 128, .ffn = 12288, .vocab = 151936, .ctx = 40960, .theta = 1e6f, .eps = 1e-6f},
    /* Qwen3-30B-A3B with 32 of its 128 experts: the same 8 active per token, so the same
     * bytes per decoded token, in a file a 24 GB machine holds */
    {.name = "qwen3-30b-a3b-e32", .arch = "qwen3moe", .d = 2048, .layers = 48, .heads = 32,
     .kv = 4, .hd = 128, .ffn = 6144, .vocab = 151936, .ctx = 40960, .theta = 1e6f,
     .eps = 1e-6f, .experts = {32, 8, 768}},
    {.name = "qwen2.5-1.5b", .arch = "qwen2", .d = 1536, .layers = 28, .heads = 12, .kv = 2,
     .ffn = 8960, .vocab = 151936, .tied = 1, .bias = 1, .ctx = 32768, .theta = 1e6f, .eps = 1e-6f},
    {.name = "qwen2.5-7b", .arch = "qwen2", .d = 3584, .layers = 28, .heads = 28, .kv = 4,
     .ffn = 18944, .vocab = 152064, .bias = 1, .ctx = 32768, .theta = 1e6f, .eps = 1e-6f},
    /* Gemma 3 1B: 5 of every 6 layers see the last 512 positions (RoPE base 10000) */
    {.name = "gemma3-1b", .arch = "gemma3", .d = 1152, .layers = 26, .heads = 4, .kv = 1,
     .hd = 256, .ffn = 6912, .vocab = 262144, .tied = 1, .ctx = 32768, .theta = 1e6f,
     .eps = 1e-6f, .swa = {512, 6}, .swa_base = 10000},
};

const shape_def *shape_at(int i) {
    return i >= 0 && i < (int)(sizeof shapes / sizeof shapes[0]) ? &shapes[i] : NULL;
}

const shape_def *shape_find(const char *name) {
    for (int i = 0; shape_at(i); i++)
        if (!strcmp(shapes[i].name, name)) return &shapes[i];
    return NULL;
}

/* llama.cpp's file types (general.file_type) and the base type of each. */
static const struct {
    const char *name;
    uint32_t file_type, base;
} ftypes[] = {
    {"F32", 0, QT_F32},       {"F16", 1, QT_F16},       {"BF16", 32, QT_BF16},
    {"Q8_0", 7, QT_Q8_0},     {"Q4_0", 2, QT_Q4_0},     {"Q4_1", 3, QT_Q4_1},
    {"Q5_0", 8, QT_Q5_0},     {"Q5_1", 9, QT_Q5_1},     {"Q4_K_M", 15, QT_Q4_K},
    {"Q5_K_M", 17, QT_Q5_K},  {"Q6_K", 18, QT_Q6_K},
};
#define N_FTYPES (int)(sizeof ftypes / sizeof ftypes[0])

int shape_ftype(const char *name) {
    for (int i = 0; i < N_FTYPES; i++)
        if (!strcmp(ftypes[i].name, name)) return i;
    return -1;
}

const char *shape_ftype_name(int ftype) {
    return ftype >= 0 && ftype < N_FTYPES ? ftypes[ftype].name : NULL;
}

/* ------------------------------------------------------------------ the plan */

static int head_dim(const shape_def *s) { return s->hd ? s->hd : s->d / s->heads; }

static int is_float(uint32_t t) { return t == QT_F32 || t == QT_F16 || t == QT_BF16; }

/* llama-quantize's use_more_bits: the first and last eighth of the layers and every
 * third one between them get the bigger type in the _M mixes. */
static int more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* The type llama-quantize gives a matrix. role: 'o' output (or the tied embedding),
 * 'v' attn_v, 'd' ffn_down (dense or experts), 0 any other; layer -1 outside blocks. */
static uint32_t mat_type(int ftype, char role, int layer, int n_layers, int64_t ncols) {
    uint32_t base = ftypes[ftype].base, t = base;
    int kmix = ftypes[ftype].file_type == 15 || ftypes[ftype].file_type == 17;
    if (role == 'o' && !is_float(base) && base != QT_Q8_0) t = QT_Q6_K;
    if (kmix && (role == 'v' || role == 'd') && more_bits(layer, n_layers)) t = QT_Q6_K;
    if (ncols % 256) { /* a K-quant needs rows of whole super-blocks */
        if (t == QT_Q4_K) t = QT_Q5_0;
        else if (t == QT_Q5_K) t = QT_Q5_1;
        else if (t == QT_Q6_K) t = QT_Q8_0;
    }
    return t;
}

typedef struct {
    shape_tensor *out;
    int cap, n, ftype, layers;
} planner;

static void add(planner *p, int kind, char role, int layer, int n_dims, int64_t ne0, int64_t ne1,
                int64_t ne2, const char *fmt, ...) {
    if (p->n < p->cap) {
        shape_tensor *t = &p->out[p->n];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(t->name, sizeof t->name, fmt, ap);
        va_end(ap);
        t->n_dims = n_dims;
        t->ne[0] = ne0, t->ne[1] = ne1, t->ne[2] = ne2;
        t->kind = kind;
        t->type = kind == SHAPE_MAT ? mat_type(p->ftype, role, layer, p->layers, ne0) : QT_F32;
    }
    p->n++;
}

int shape_plan(const shape_def *s, int ftype, shape_tensor *out, int cap) {
    planner p = {out, cap, 0, ftype, s->layers};
    int hd = head_dim(s), qd = s->heads * hd, kd = s->kv * hd, d = s->d, f = s->ffn;
    int qk_norm = !strcmp(s->arch, "qwen3") || !strcmp(s->arch, "qwen3moe") || !strcmp(s->arch, "gemma3");
    int post_norms = !strcmp(s->arch, "gemma3");
    add(&p, SHAPE_MAT, s->tied ? 'o' : 0, -1, 2, d, s->vocab, 1, "token_embd.weight");
    for (int l = 0; l < s->layers; l++) {
        add(&p, SHAPE_NORM, 0, l, 1, d, 1, 1, "blk.%d.attn_norm.weight", l);
        add(&p, SHAPE_MAT, 0, l, 2, d, qd, 1, "blk.%d.attn_q.weight", l);
        add(&p, SHAPE_MAT, 0, l, 2, d, kd, 1, "blk.%d.attn_k.weight", l);
        add(&p, SHAPE_MAT, 'v', l, 2, d, kd, 1, "blk.%d.attn_v.weight", l);
        if (s->bias) {
            add(&p, SHAPE_BIAS, 0, l, 1, qd, 1, 1, "blk.%d.attn_q.bias", l);
            add(&p, SHAPE_BIAS, 0, l, 1, kd, 1, 1, "blk.%d.attn_k.bias", l);
            add(&p, SHAPE_BIAS, 0, l, 1, kd, 1, 1, "blk.%d.attn_v.bias", l);
        }
        if (qk_norm) {
            add(&p, SHAPE_NORM, 0, l, 1, hd, 1, 1, "blk.%d.attn_q_norm.weight", l);
            add(&p, SHAPE_NORM, 0, l, 1, hd, 1, 1, "blk.%d.attn_k_norm.weight", l);
        }
        add(&p, SHAPE_MAT, 0, l, 2, qd, d, 1, "blk.%d.attn_output.weight", l);
        if (post_norms) add(&p, SHAPE_NORM, 0, l, 1, d, 1, 1, "blk.%d.post_attention_norm.weight", l);
        add(&p, SHAPE_NORM, 0, l, 1, d, 1, 1, "blk.%d.ffn_norm.weight", l);
        if (s->experts[0]) {
            int ne = s->experts[0], fe = s->experts[2];
            add(&p, SHAPE_ROUTER, 0, l, 2, d, ne, 1, "blk.%d.ffn_gate_inp.weight", l);
            add(&p, SHAPE_MAT, 0, l, 3, d, fe, ne, "blk.%d.ffn_gate_exps.weight", l);
            add(&p, SHAPE_MAT, 0, l, 3, d, fe, ne, "blk.%d.ffn_up_exps.weight", l);
            add(&p, SHAPE_MAT, 'd', l, 3, fe, d, ne, "blk.%d.ffn_down_exps.weight", l);
        } else {
            add(&p, SHAPE_MAT, 0, l, 2, d, f, 1, "blk.%d.ffn_gate.weight", l);
            add(&p, SHAPE_MAT, 0, l, 2, d, f, 1, "blk.%d.ffn_up.weight", l);
            add(&p, SHAPE_MAT, 'd', l, 2, f, d, 1, "blk.%d.ffn_down.weight", l);
        }
        if (post_norms) add(&p, SHAPE_NORM, 0, l, 1, d, 1, 1, "blk.%d.post_ffw_norm.weight", l);
    }
    add(&p, SHAPE_NORM, 0, -1, 1, d, 1, 1, "output_norm.weight");
    if (!s->tied) add(&p, SHAPE_MAT, 'o', -1, 2, d, s->vocab, 1, "output.weight");
    if (s->llama3[0] > 0) add(&p, SHAPE_ROPE, 0, -1, 1, hd / 2, 1, 1, "rope_freqs.weight");
    return p.n;
}

/* ------------------------------------------------------------------ the header */

typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
} sbuf;

static void put(sbuf *b, const void *src, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(sbuf *b, uint32_t v) { put(b, &v, 4); } /* GGUF is little-endian, as x86 */
static void put_u64(sbuf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(sbuf *b, const char *s, size_t n) { put_u64(b, n), put(b, s, n); }
static void put_key(sbuf *b, const char *key, uint32_t type) { put_str(b, key, strlen(key)), put_u32(b, type); }
static void kv_str(sbuf *b, const char *key, const char *v) { put_key(b, key, GGUF_STR), put_str(b, v, strlen(v)); }
static void kv_u32(sbuf *b, const char *key, uint32_t v) { put_key(b, key, GGUF_U32), put_u32(b, v); }
static void kv_f32(sbuf *b, const char *key, float v) { put_key(b, key, GGUF_F32), put(b, &v, 4); }

/* "{arch}.{name}" */
static const char *ak(const shape_def *s, const char *name) {
    static char key[96];
    snprintf(key, sizeof key, "%s.%s", s->arch, name);
    return key;
}

static int model_keys(sbuf *b, const shape_def *s, int ftype) {
    char name[96];
    int n = 0, hd = head_dim(s);
    snprintf(name, sizeof name, "random %s (shape only)", s->name);
    kv_str(b, "general.architecture", s->arch), n++;
    kv_str(b, "general.type", "model"), n++;
    kv_str(b, "general.name", name), n++;
    kv_u32(b, "general.file_type", ftypes[ftype].file_type), n++;
    if (!is_float(ftypes[ftype].base)) kv_u32(b, "general.quantization_version", 2), n++;
    kv_u32(b, ak(s, "context_length"), (uint32_t)s->ctx), n++;
    kv_u32(b, ak(s, "embedding_length"), (uint32_t)s->d), n++;
    kv_u32(b, ak(s, "block_count"), (uint32_t)s->layers), n++;
    kv_u32(b, ak(s, "feed_forward_length"), (uint32_t)s->ffn), n++;
    kv_u32(b, ak(s, "attention.head_count"), (uint32_t)s->heads), n++;
    kv_u32(b, ak(s, "attention.head_count_kv"), (uint32_t)s->kv), n++;
    kv_u32(b, ak(s, "rope.dimension_count"), (uint32_t)hd), n++;
    if (hd * s->heads != s->d) {
        kv_u32(b, ak(s, "attention.key_length"), (uint32_t)hd), n++;
        kv_u32(b, ak(s, "attention.value_length"), (uint32_t)hd), n++;
    }
    if (s->experts[0]) {
        kv_u32(b, ak(s, "expert_count"), (uint32_t)s->experts[0]), n++;
        kv_u32(b, ak(s, "expert_used_count"), (uint32_t)s->experts[1]), n++;
        kv_u32(b, ak(s, "expert_feed_forward_length"), (uint32_t)s->experts[2]), n++;
    }
    kv_f32(b, ak(s, "rope.freq_base"), s->theta), n++;
    if (s->swa[0]) {
        kv_u32(b, ak(s, "attention.sliding_window"), (uint32_t)s->swa[0]), n++;
        kv_u32(b, ak(s, "attention.sliding_window_pattern"), (uint32_t)s->swa[1]), n++;
        kv_f32(b, ak(s, "rope.freq_base_swa"), s->swa_base), n++;
    }
    kv_f32(b, ak(s, "attention.layer_norm_rms_epsilon"), s->eps), n++;
    kv_u32(b, ak(s, "vocab_size"), (uint32_t)s->vocab), n++;
    return n;
}

#define PAD_PREFIX "<|reserved_"

/* Every tokenizer.* key of t, byte for byte, except that the token list (and its types
 * and scores) grow to the shape's vocabulary with control tokens <|reserved_N|>. */
static int tokenizer_keys(sbuf *b, const gguf_file *t, const shape_def *s, int *n_kv,
                          char *err, size_t n) {
    const gguf_kv *toks = gguf_find(t, "tokenizer.ggml.tokens");
    if (!toks || toks->type != GGUF_ARR || toks->arr_type != GGUF_STR)
        return snprintf(err, n, "shape: the tokenizer file has no token list"), -EINVAL;
    if (toks->arr_n > (uint64_t)s->vocab)
        return snprintf(err, n, "shape: the tokenizer has %llu tokens, more than %s's %d",
                        (unsigned long long)toks->arr_n, s->name, s->vocab), -EINVAL;
    uint64_t pad = (uint64_t)s->vocab - toks->arr_n;
    for (uint64_t i = 0; i < t->n_kv; i++) {
        const gguf_kv *kv = &t->kv[i];
        if (kv->key.len < 10 || memcmp(kv->key.ptr, "tokenizer.", 10)) continue;
        put_str(b, kv->key.ptr, kv->key.len);
        put_u32(b, kv->type);
        int grow = kv->type == GGUF_ARR && kv->arr_n == toks->arr_n &&
                   (kv == toks || gguf_str_eq(kv->key, "tokenizer.ggml.token_type") ||
                    gguf_str_eq(kv->key, "tokenizer.ggml.scores"));
        if (kv->type == GGUF_ARR) put_u32(b, kv->arr_type), put_u64(b, kv->arr_n + (grow ? pad : 0));
        put(b, kv->val, kv->val_size);
        for (uint64_t j = 0; grow && j < pad; j++) {
            char name[32];
            int len = snprintf(name, sizeof name, PAD_PREFIX "%llu|>", (unsigned long long)j);
            int32_t control = 3; /* llama.cpp's LLAMA_TOKEN_TYPE_CONTROL */
            float zero = 0;
            if (kv == toks) put_str(b, name, (size_t)len);
            else if (kv->arr_type == GGUF_I32) put(b, &control, 4);
            else if (kv->arr_type == GGUF_F32) put(b, &zero, 4);
            else return snprintf(err, n, "shape: tokenizer array '%.*s' has an unexpected type",
                                 (int)kv->key.len, kv->key.ptr), -EINVAL;
        }
        (*n_kv)++;
    }
    /* the padding names must be new: a tokenizer that has them already is not padded */
    gguf_str *names = malloc(toks->arr_n * sizeof *names);
    if (!names) return snprintf(err, n, "shape: out of memory"), -ENOMEM;
    int rc = gguf_arr_strs(t, toks, names, toks->arr_n);
    for (uint64_t i = 0; !rc && pad && i < toks->arr_n; i++)
        if (names[i].len >= strlen(PAD_PREFIX) && !memcmp(names[i].ptr, PAD_PREFIX, strlen(PAD_PREFIX)))
            rc = -EEXIST;
    free(names);
    if (rc) return snprintf(err, n, "shape: the tokenizer's token list %s", rc == -EEXIST ?
                            "already has " PAD_PREFIX "N|> tokens" : "is malformed"), rc;
    return 0;
}

static uint64_t tensor_bytes(const shape_tensor *t) {
    return quant_row_size(t->type, t->ne[0]) * (uint64_t)(t->ne[1] * t->ne[2]);
}

#define ALIGN 32
static uint64_t align_up(uint64_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

static void tensor_infos(sbuf *b, const shape_tensor *ts, int nt) {
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        put_str(b, ts[i].name, strlen(ts[i].name));
        put_u32(b, (uint32_t)ts[i].n_dims);
        for (int k = 0; k < ts[i].n_dims; k++) put_u64(b, (uint64_t)ts[i].ne[k]);
        put_u32(b, ts[i].type);
        put_u64(b, off);
        off = align_up(off + tensor_bytes(&ts[i]));
    }
    static const uint8_t zeros[ALIGN];
    put(b, zeros, align_up(b->n) - b->n);
}

/* ------------------------------------------------------------------ the weights */

static uint64_t mix64(uint64_t x) { /* splitmix64's finalizer */
    x ^= x >> 30, x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27, x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* Row r of a tensor: normal(0, 0.02) approximated by a sum of four 16-bit uniforms
 * (unit variance after scaling, within ±3.5 sigma), one 64-bit draw per value. */
static void random_row(float *x, int64_t n, uint64_t seed, uint64_t r, int kind) {
    uint64_t st = mix64(seed ^ mix64(r + 0x9e3779b97f4a7c15ull));
    const float scale = 0.02f / 37837.6f; /* the sum's sd: sqrt(4 * (65536^2 - 1) / 12) */
    float base = kind == SHAPE_NORM ? 1.0f : 0.0f;
    for (int64_t i = 0; i < n; i++) {
        uint64_t v = mix64(st += 0x9e3779b97f4a7c15ull);
        int64_t sum = (int64_t)(v & 0xffff) + ((v >> 16) & 0xffff) + ((v >> 32) & 0xffff) + (v >> 48);
        x[i] = base + (float)(sum - 131070) * scale;
    }
}

/* Llama 3.1's per-pair RoPE divisors, as its rope_scaling "llama3" defines them. */
static void llama3_factors(const shape_def *s, float *out) {
    int hd = head_dim(s);
    double factor = s->llama3[0], low = s->llama3[1], high = s->llama3[2], old = s->llama3[3];
    for (int i = 0; i < hd / 2; i++) {
        double wavelen = 2 * M_PI / pow(s->theta, -2.0 * i / hd);
        if (wavelen < old / high) out[i] = 1.0f;
        else if (wavelen > old / low) out[i] = (float)factor;
        else {
            double smooth = (old / wavelen - low) / (high - low);
            out[i] = (float)(1.0 / ((1 - smooth) / factor + smooth));
        }
    }
}

typedef struct {
    const shape_def *s;
    const shape_tensor *t;
    int fd, rows_per_task;
    int64_t rows;
    uint64_t off, seed;
    atomic_int err;
} fill_job;

static void fill_task(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    fill_job *j = ctx;
    const shape_tensor *t = j->t;
    int64_t r0 = (int64_t)task * j->rows_per_task, r1 = r0 + j->rows_per_task;
    if (r1 > j->rows) r1 = j->rows;
    size_t rs = quant_row_size(t->type, t->ne[0]);
    float *x = malloc((size_t)t->ne[0] * sizeof *x);
    uint8_t *out = malloc(rs * (size_t)(r1 - r0));
    if (!x || !out) {
        atomic_store(&j->err, -ENOMEM);
    } else {
        for (int64_t r = r0; r < r1; r++) {
            if (t->kind == SHAPE_ROPE) llama3_factors(j->s, x);
            else random_row(x, t->ne[0], j->seed, (uint64_t)r, t->kind);
            quant_quantize_ref(t->type, x, out + rs * (size_t)(r - r0), t->ne[0]);
        }
        size_t len = rs * (size_t)(r1 - r0);
        off_t at = (off_t)(j->off + rs * (uint64_t)r0);
        for (size_t done = 0; done < len;) {
            ssize_t w = pwrite(j->fd, out + done, len - done, at + (off_t)done);
            if (w <= 0) {
                atomic_store(&j->err, w < 0 ? -errno : -EIO);
                break;
            }
            done += (size_t)w;
        }
    }
    free(x);
    free(out);
}

static int fill(thr_pool *pool, const shape_def *s, const shape_tensor *t, int fd, uint64_t off,
                uint64_t seed) {
    fill_job j = {.s = s, .t = t, .fd = fd, .off = off, .rows = t->ne[1] * t->ne[2],
                  .seed = mix64(seed) ^ name_hash(t->name)};
    atomic_init(&j.err, 0);
    int64_t per = (int64_t)(1 << 18) / t->ne[0]; /* ~1 MB of floats a task */
    j.rows_per_task = (int)(per < 1 ? 1 : per > j.rows ? j.rows : per);
    int64_t n_tasks = (j.rows + j.rows_per_task - 1) / j.rows_per_task;
    thr_run(pool, fill_task, &j, (int)n_tasks);
    return atomic_load(&j.err);
}

/* ------------------------------------------------------------------ the file */

static int write_all(int fd, const uint8_t *p, size_t n) {
    for (size_t done = 0; done < n;) {
        ssize_t w = pwrite(fd, p + done, n - done, (off_t)done);
        if (w <= 0) return w < 0 ? -errno : -EIO;
        done += (size_t)w;
    }
    return 0;
}

static int header(sbuf *b, const shape_def *s, int ftype, const shape_tensor *ts, int nt,
                  const shape_opts *o, char *err, size_t n) {
    gguf_file t;
    int rc = gguf_open(&t, o->tokenizer);
    if (rc) return snprintf(err, n, "shape: tokenizer %s: %s", o->tokenizer, t.err), rc;
    sbuf kv = {0};
    int n_kv = model_keys(&kv, s, ftype);
    rc = tokenizer_keys(&kv, &t, s, &n_kv, err, n);
    gguf_close(&t);
    if (!rc) {
        put(b, "GGUF", 4);
        put_u32(b, 3);
        put_u64(b, (uint64_t)nt);
        put_u64(b, (uint64_t)n_kv);
        put(b, kv.p, kv.n);
        tensor_infos(b, ts, nt);
        if (b->oom || kv.oom) rc = -ENOMEM, snprintf(err, n, "shape: out of memory");
    }
    free(kv.p);
    return rc;
}

static int write_model(int fd, const shape_def *s, int ftype, const shape_tensor *ts, int nt,
                       const shape_opts *o, uint64_t *bytes, char *err, size_t n) {
    sbuf b = {0};
    int rc = header(&b, s, ftype, ts, nt, o, err, n);
    uint64_t off = b.n;
    for (int i = 0; i < nt; i++) off = align_up(off + tensor_bytes(&ts[i]));
    *bytes = off;
    if (!rc && ftruncate(fd, (off_t)off) != 0) rc = -errno, snprintf(err, n, "shape: %s", strerror(errno));
    if (!rc && (rc = write_all(fd, b.p, b.n))) snprintf(err, n, "shape: write: %s", strerror(-rc));
    thr_pool *pool = rc ? NULL : thr_pool_new(o->threads > 0 ? o->threads : 1);
    if (!rc && !pool) rc = -ENOMEM, snprintf(err, n, "shape: no threads");
    off = b.n;
    for (int i = 0; !rc && i < nt; i++) {
        if ((rc = fill(pool, s, &ts[i], fd, off, o->seed)))
            snprintf(err, n, "shape: writing %s: %s", ts[i].name, strerror(-rc));
        off = align_up(off + tensor_bytes(&ts[i]));
    }
    if (pool) thr_pool_free(pool);
    free(b.p);
    return rc;
}

int shape_write(const shape_def *s, int ftype, const char *path, const shape_opts *o,
                uint64_t *bytes, char *err, size_t n) {
    if (ftype < 0 || ftype >= N_FTYPES) return snprintf(err, n, "shape: unknown file type"), -EINVAL;
    int nt = shape_plan(s, ftype, NULL, 0);
    shape_tensor *ts = calloc((size_t)nt, sizeof *ts);
    if (!ts) return snprintf(err, n, "shape: out of memory"), -ENOMEM;
    shape_plan(s, ftype, ts, nt);
    char part[4096];
    if (snprintf(part, sizeof part, "%s.part", path) >= (int)sizeof part) {
        free(ts);
        return snprintf(err, n, "shape: the output path is too long"), -ENAMETOOLONG;
    }
    int fd = open(part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), rc;
    if (fd < 0) {
        rc = -errno;
        snprintf(err, n, "shape: %s: %s", part, strerror(errno));
    } else {
        rc = write_model(fd, s, ftype, ts, nt, o, bytes, err, n);
        if (close(fd) != 0 && !rc) rc = -errno, snprintf(err, n, "shape: %s: %s", part, strerror(errno));
        if (!rc && rename(part, path) != 0) rc = -errno, snprintf(err, n, "shape: %s: %s", path, strerror(errno));
        if (rc) unlink(part);
    }
    free(ts);
    return rc;
}
