/* model_load: reading a GGUF into a model, strictly.
 *
 * A GGUF says what to compute through its metadata and its tensors. A reader that
 * skips what it does not know computes some other model without a word (Llama 3.1's
 * rope_freqs, Granite's multipliers), so here every "<arch>." key must be one this file
 * reads or one listed as harmless, and every tensor must be one the forward pass uses;
 * anything else fails the load with its name. */
#include "core/model.h"
#include "core/model_int.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/quant.h"

typedef struct {
    model *m;
    uint8_t *used;  /* [n_tensors]: consumed by the loader */
    float *spill;   /* next free float of m->f32_copies */
    char *err;
    size_t en;
} loader;

int model_fail(char *err, size_t n, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && n) vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return code;
}

/* ------------------------------------------------------------------ metadata */

typedef struct {
    const char *name;   /* after "<arch>." */
    const char *archs;  /* NULL: every architecture; else a space-separated list */
    int must_be;        /* ANY, or the one integer value kiln implements */
} meta_key;
#define ANY (-1)

/* Everything kiln accepts in an architecture's namespace; the first entry whose name
 * and architectures match applies. Keys that must be 0 turn on a feature kiln lacks
 * when set (sliding windows, experts where not implemented, DeepSeek's YaRN variant). */
static const meta_key known_keys[] = {
    {"vocab_size", NULL, ANY},
    {"context_length", NULL, ANY},
    {"embedding_length", NULL, ANY},
    {"block_count", NULL, ANY},
    {"feed_forward_length", NULL, ANY},
    {"attention.head_count", NULL, ANY},
    {"attention.head_count_kv", NULL, ANY},
    {"attention.key_length", NULL, ANY},
    {"attention.value_length", NULL, ANY},
    {"attention.layer_norm_rms_epsilon", NULL, ANY},
    {"rope.dimension_count", NULL, ANY},
    {"rope.freq_base", NULL, ANY},
    {"rope.scale_linear", NULL, ANY},
    {"rope.scaling.type", NULL, ANY},
    {"rope.scaling.factor", NULL, ANY},
    {"rope.scaling.attn_factor", NULL, ANY},
    {"rope.scaling.original_context_length", NULL, ANY},
    {"rope.scaling.finetuned", NULL, ANY},
    {"rope.scaling.yarn_beta_fast", NULL, ANY},
    {"rope.scaling.yarn_beta_slow", NULL, ANY},
    {"rope.scaling.yarn_log_multiplier", NULL, ANY},
    {"attention.temperature_scale", NULL, 0},
    {"attention.sliding_window", "gemma2 gemma3 phi3", ANY},
    {"attention.sliding_window_pattern", "gemma2 gemma3", ANY},
    {"rope.freq_base_swa", "gemma2 gemma3", ANY},
    {"final_logit_softcapping", "gemma2 gemma3", ANY},
    {"attn_logit_softcapping", "gemma2", ANY},
    {"attention.sliding_window", NULL, 0},
    {"expert_count", "llama mistral qwen2moe qwen3moe", ANY},
    {"expert_count", NULL, 0},
    {"expert_used_count", "llama mistral qwen2moe qwen3moe", ANY},
    {"expert_used_count", NULL, 0},
    {"expert_feed_forward_length", "qwen2moe qwen3moe", ANY},
    {"expert_shared_feed_forward_length", "qwen2moe", ANY},
    {"expert_gating_func", "llama mistral qwen2moe qwen3moe", 1}, /* softmax */
    {"logit_scale", "granite", ANY},
    {"residual_scale", "granite", ANY},
    {"embedding_scale", "granite", ANY},
    {"attention.scale", "granite", ANY},
};

static int word_in(const char *list, const char *w) {
    size_t n = strlen(w);
    for (const char *p = list; (p = strstr(p, w)); p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == 0 || p[n] == ' ')) return 1;
    return 0;
}

static int kv_is(const gguf_file *f, const char *key, int want) {
    uint32_t v;
    int b;
    if (gguf_get_u32(f, key, &v) == 0) return (int64_t)v == want;
    if (gguf_get_bool(f, key, &b) == 0) return b == want;
    float x;
    return gguf_get_f32(f, key, &x) == 0 && x == (float)want;
}

/* Every key under "<arch>." is known (and zero where it must be); split files refused. */
static int check_keys(const model *m, char *err, size_t n) {
    const gguf_file *f = &m->gguf;
    size_t al = strlen(m->cfg.arch);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        char key[160];
        if (kv->key.len >= sizeof key) { /* no known key is that long: refused if it is ours */
            if (kv->key.len > al && !memcmp(kv->key.ptr, m->cfg.arch, al) && kv->key.ptr[al] == '.')
                return model_fail(err, n, -ENOTSUP, "model: metadata key '%.100s...' is not implemented",
                                  kv->key.ptr);
            continue;
        }
        memcpy(key, kv->key.ptr, kv->key.len);
        key[kv->key.len] = 0;
        if (!strcmp(key, "split.count")) {
            uint32_t c = 0;
            if (gguf_get_u32(f, key, &c) != 0 || c > 1)
                return model_fail(err, n, -ENOTSUP, "model: a split GGUF (split.count %u): merge the "
                            "parts into one file (llama-gguf-split --merge)", c);
        }
        if (strncmp(key, m->cfg.arch, al) || key[al] != '.') continue;
        const char *name = key + al + 1;
        const meta_key *k = NULL;
        for (size_t j = 0; j < sizeof known_keys / sizeof known_keys[0] && !k; j++)
            if (!strcmp(known_keys[j].name, name) &&
                (!known_keys[j].archs || word_in(known_keys[j].archs, m->cfg.arch)))
                k = &known_keys[j];
        if (!k)
            return model_fail(err, n, -ENOTSUP, "model: metadata key '%s' is not implemented "
                        "(it may change the results, so the file is refused)", key);
        if (k->must_be != ANY && !kv_is(f, key, k->must_be))
            return model_fail(err, n, -ENOTSUP, k->must_be ? "model: metadata key '%s' is not %d: "
                        "other values are not implemented" : "model: metadata key '%s' is set: "
                        "that feature is not implemented", key, k->must_be);
    }
    return 0;
}

static int meta_u32(const gguf_file *f, const char *arch, const char *key, uint32_t *out,
                    int required, char *err, size_t n) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    int r = gguf_get_u32(f, full, out);
    if (r == 0) return 0;
    if (r == -ENOENT && !required) return 1;
    return model_fail(err, n, -EINVAL, "model: metadata key '%s' is %s", full,
                r == -ENOENT ? "missing" : "not a single integer in range");
}

/* 0 found, 1 absent, <0 present but not a number */
static int meta_f32(const gguf_file *f, const char *arch, const char *key, float *out,
                    char *err, size_t n) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    int r = gguf_get_f32(f, full, out);
    if (r == 0) return isfinite(*out) ? 0 : model_fail(err, n, -EINVAL, "model: '%s' is not finite", full);
    if (r == -ENOENT) return 1;
    return model_fail(err, n, -EINVAL, "model: metadata key '%s' is not a float", full);
}

static const char *const known_archs[] = {"llama", "mistral", "granite", "qwen2", "qwen3",
                                          "qwen2moe", "qwen3moe", "gemma2", "gemma3", "phi3", "mistral3",
                                          NULL};

static int read_arch(model_config *c, const gguf_file *f, char *err, size_t n) {
    gguf_str a;
    if (gguf_get_str(f, "general.architecture", &a) != 0 || a.len >= sizeof c->arch)
        return model_fail(err, n, -EINVAL, "model: no general.architecture in the file");
    memcpy(c->arch, a.ptr, a.len);
    c->arch[a.len] = 0;
    for (int i = 0; known_archs[i]; i++)
        if (!strcmp(c->arch, known_archs[i])) return 0;
    return model_fail(err, n, -ENOTSUP, "model: architecture '%s' is not supported (llama, mistral, "
                "granite, qwen2, qwen2moe, qwen3, qwen3moe, gemma2, gemma3, phi3, mistral3)", c->arch);
}

static int read_experts(model_config *c, const gguf_file *f, char *err, size_t n) {
    uint32_t ne = 0, nu = 0, ff = (uint32_t)c->ffn_dim, fs = 0;
    int r, q2 = !strcmp(c->arch, "qwen2moe");
    if ((r = meta_u32(f, c->arch, "expert_count", &ne, 0, err, n)) < 0 ||
        (r = meta_u32(f, c->arch, "expert_used_count", &nu, 0, err, n)) < 0 ||
        (r = meta_u32(f, c->arch, "expert_feed_forward_length", &ff, 0, err, n)) < 0)
        return r;
    /* Qwen2-MoE: a shared expert (as wide as the dense FFN unless said) beside the routed
     * ones, whose probabilities are not renormalized over the top k (llama.cpp: norm_w false) */
    fs = q2 ? (uint32_t)c->ffn_dim : 0;
    if (q2 && (r = meta_u32(f, c->arch, "expert_shared_feed_forward_length", &fs, 0, err, n)) < 0) return r;
    if (fs > (1u << 22)) return model_fail(err, n, -EINVAL, "model: shared expert width %u", fs);
    c->ffn_shexp_dim = (int)fs, c->expert_norm = !q2;
    if (!ne && (q2 || !strcmp(c->arch, "qwen3moe")))
        return model_fail(err, n, -EINVAL, "model: qwen3moe without %s.expert_count", c->arch);
    if (ne && (ne > MODEL_MAX_EXPERTS || nu < 1 || nu > ne || ff < 1 || ff > (1u << 22)))
        return model_fail(err, n, -EINVAL, "model: bad experts (%u of %u, width %u; at most %d experts)",
                    nu, ne, ff, MODEL_MAX_EXPERTS);
    c->n_expert = (int)ne, c->n_expert_used = ne ? (int)nu : 0, c->ffn_exp_dim = ne ? (int)ff : 0;
    return 0;
}

static int read_shape(model_config *c, const gguf_file *f, char *err, size_t n) {
    uint32_t v[6];
    const char *keys[6] = {"block_count", "embedding_length", "attention.head_count",
                           "feed_forward_length", "context_length", "attention.head_count_kv"};
    for (int i = 0; i < 6; i++) {
        int r = meta_u32(f, c->arch, keys[i], &v[i], i < 5, err, n);
        if (r < 0) return r;
        if (r > 0) v[i] = v[2]; /* no head_count_kv: multi-head attention */
    }
    c->n_layers = (int)v[0], c->d_model = (int)v[1], c->n_heads = (int)v[2];
    c->ffn_dim = (int)v[3], c->n_ctx_train = (int)v[4], c->n_kv_heads = (int)v[5];
    if (c->n_layers < 1 || c->n_layers > 1024 || c->d_model < 1 || c->n_heads < 1 ||
        c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads || c->ffn_dim < 1 ||
        (int64_t)v[1] > (1 << 20) || (int64_t)v[3] > (1 << 22))
        return model_fail(err, n, -EINVAL, "model: inconsistent shape (layers %d, d %d, heads %d/%d)",
                    c->n_layers, c->d_model, c->n_heads, c->n_kv_heads);
    uint32_t u;
    int r;
    c->head_dim = c->d_model % c->n_heads ? 0 : c->d_model / c->n_heads;
    if ((r = meta_u32(f, c->arch, "attention.key_length", &u, 0, err, n)) < 0) return r;
    if (r == 0) c->head_dim = (int)u;
    if ((r = meta_u32(f, c->arch, "attention.value_length", &u, 0, err, n)) < 0) return r;
    if (r == 0 && (int)u != c->head_dim)
        return model_fail(err, n, -ENOTSUP, "model: value heads of %u differ from key heads of %d "
                    "(not implemented)", u, c->head_dim);
    c->rope_dim = c->head_dim;
    if ((r = meta_u32(f, c->arch, "rope.dimension_count", &u, 0, err, n)) < 0) return r;
    if (r == 0) c->rope_dim = (int)u;
    if ((r = read_experts(c, f, err, n)) < 0) return r;
    if (c->head_dim < 2 || c->head_dim > ATTN_MAX_DIM || c->head_dim % 2 || c->rope_dim < 2 ||
        c->rope_dim > c->head_dim || c->rope_dim % 2 || c->n_heads / c->n_kv_heads > ATTN_MAX_GROUP)
        return model_fail(err, n, -EINVAL, "model: head_dim %d / rope_dim %d / %d heads per KV head "
                    "not supported", c->head_dim, c->rope_dim, c->n_heads / c->n_kv_heads);
    return 0;
}

/* YaRN's correction range: the dimension pair whose wavelength fits n_rot turns in the
 * original context (ggml's rope_yarn_corr_dim). */
static double yarn_corr_dim(int rope_dim, int orig_ctx, float n_rot, float base) {
    return rope_dim * log(orig_ctx / (n_rot * 2 * 3.14159265358979323846)) / (2 * log(base));
}

/* rope_freq[i] per pair and rope_mscale (see model.h). freq_factors: [rope_dim/2] or NULL. */
static int read_rope(model_config *c, const gguf_file *f, char *err, size_t n) {
    int r;
    c->rope_base = 10000.0f;
    if ((r = meta_f32(f, c->arch, "rope.freq_base", &c->rope_base, err, n)) < 0) return r;
    if (!(c->rope_base > 1.0f))
        return model_fail(err, n, -EINVAL, "model: rope.freq_base %g must be above 1", c->rope_base);
    /* llama.cpp's converters permute Q/K of llama-architecture models for adjacent-pair
     * RoPE; Qwen keeps the Hugging Face layout and rotates halves. */
    c->rope_neox = !strncmp(c->arch, "qwen", 4) || !strncmp(c->arch, "gemma", 5) ||
                   !strcmp(c->arch, "phi3");
    char type[16] = "linear"; /* llama.cpp's default when only a factor is given */
    char full[128];
    snprintf(full, sizeof full, "%s.rope.scaling.type", c->arch);
    gguf_str s;
    if (gguf_get_str(f, full, &s) == 0) {
        if (s.len >= sizeof type) s.len = sizeof type - 1;
        memcpy(type, s.ptr, s.len);
        type[s.len] = 0;
    }
    float factor = 0.0f, attn_factor = 1.0f, beta_fast = 32.0f, beta_slow = 1.0f, log_mul = 0.0f;
    if ((r = meta_f32(f, c->arch, "rope.scaling.factor", &factor, err, n)) < 0) return r;
    if (r > 0 && (r = meta_f32(f, c->arch, "rope.scale_linear", &factor, err, n)) < 0) return r;
    if ((r = meta_f32(f, c->arch, "rope.scaling.attn_factor", &attn_factor, err, n)) < 0) return r;
    if ((r = meta_f32(f, c->arch, "rope.scaling.yarn_beta_fast", &beta_fast, err, n)) < 0) return r;
    if ((r = meta_f32(f, c->arch, "rope.scaling.yarn_beta_slow", &beta_slow, err, n)) < 0) return r;
    if ((r = meta_f32(f, c->arch, "rope.scaling.yarn_log_multiplier", &log_mul, err, n)) < 0) return r;
    uint32_t orig = (uint32_t)c->n_ctx_train;
    if ((r = meta_u32(f, c->arch, "rope.scaling.original_context_length", &orig, 0, err, n)) < 0)
        return r;
    c->rope_orig_ctx = (int)(orig > (1u << 30) ? 1u << 30 : orig);
    if (factor < 0.0f || attn_factor <= 0.0f || orig < 1)
        return model_fail(err, n, -EINVAL, "model: bad RoPE scaling (factor %g, attn_factor %g, "
                    "original context %u)", factor, attn_factor, orig);
    float fscale = factor == 0.0f ? 1.0f : 1.0f / factor;
    if (!strcmp(type, "none")) c->rope_scaling = MODEL_ROPE_NONE, fscale = 1.0f;
    else if (!strcmp(type, "linear")) c->rope_scaling = fscale == 1.0f ? MODEL_ROPE_NONE : MODEL_ROPE_LINEAR;
    else if (!strcmp(type, "yarn")) c->rope_scaling = MODEL_ROPE_YARN;
    else
        return model_fail(err, n, -ENOTSUP, "model: RoPE scaling '%s' is not implemented", type);
    int half = c->rope_dim / 2;
    double lo = 0, hi = 0;
    if (c->rope_scaling == MODEL_ROPE_YARN) {
        lo = floor(yarn_corr_dim(c->rope_dim, (int)orig, beta_fast, c->rope_base));
        hi = ceil(yarn_corr_dim(c->rope_dim, (int)orig, beta_slow, c->rope_base));
        lo = lo < 0 ? 0 : lo, hi = hi > c->rope_dim - 1 ? c->rope_dim - 1 : hi;
    }
    for (int i = 0; i < half; i++) {
        double inv = pow(c->rope_base, -2.0 * i / c->rope_dim), s = fscale;
        if (c->rope_scaling == MODEL_ROPE_YARN) { /* extrapolate the fast pairs, interpolate the slow */
            double y = (i - lo) / (hi - lo > 0.001 ? hi - lo : 0.001);
            double mix = 1.0 - (y < 0 ? 0 : y > 1 ? 1 : y);
            s = fscale * (1.0 - mix) + mix;
        }
        c->rope_freq[i] = inv * s;
    }
    /* YaRN's magnitude gain 1 + 0.1 ln(factor), or with mscale_all_dim (the GGUF's
     * yarn_log_multiplier, Ministral 3) that gain over 1 + 0.1 * it * ln(factor), as
     * Hugging Face and llama.cpp compute it */
    c->rope_mscale = attn_factor;
    if (c->rope_scaling == MODEL_ROPE_YARN && factor > 1.0f) {
        float g = 1.0f + 0.1f * logf(factor);
        c->rope_mscale *= log_mul != 0.0f ? g / (1.0f + 0.1f * log_mul * logf(factor)) : g;
    }
    return 0;
}

/* Granite's multipliers (other architectures cannot have them: check_keys). */
static int read_scales(model_config *c, const gguf_file *f, char *err, size_t n) {
    struct { const char *key; float *out, dflt; } k[] = {
        {"embedding_scale", &c->embd_scale, 1.0f}, {"residual_scale", &c->resid_scale, 1.0f},
        {"attention.scale", &c->attn_scale, 0.0f}, {"logit_scale", &c->logit_scale, 1.0f}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        *k[i].out = k[i].dflt;
        int r = meta_f32(f, c->arch, k[i].key, k[i].out, err, n);
        if (r < 0) return r;
        if (r == 0 && *k[i].out == 0.0f && k[i].dflt != 0.0f) *k[i].out = k[i].dflt; /* llama.cpp: 0 = unset */
    }
    if (c->attn_scale == 0.0f) c->attn_scale = 1.0f / sqrtf((float)c->head_dim);
    if (!(c->logit_scale != 0.0f))
        return model_fail(err, n, -EINVAL, "model: %s.logit_scale is 0", c->arch);
    return 0;
}

/* Gemma 3's extras (read_config has read the shape): the embedding scale, the attention
 * scale gemma_pytorch uses, GeGLU and post-norms, soft-capping, the sliding windows.
 * Phi-3's window (mini-4k: 2047 on every layer; llama.cpp ignores it, the model was
 * trained with it). */
static int read_gemma(model *m, char *err, size_t n) {
    model_config *c = &m->cfg;
    const gguf_file *f = &m->gguf;
    int r;
    if (!strcmp(c->arch, "phi3")) { /* a window on every layer (0: Phi-4, none) */
        uint32_t win = 0;
        if ((r = meta_u32(f, c->arch, "attention.sliding_window", &win, 0, err, n)) < 0) return r;
        c->swa_window = (int)(win > (1u << 30) ? 1u << 30 : win);
        for (int l = 0; l < c->n_layers && win; l++) m->w.layers[l].swa = 1;
        return 0;
    }
    int g2 = !strcmp(c->arch, "gemma2");
    if (!g2 && strcmp(c->arch, "gemma3")) return 0;
    c->ffn_gelu = c->post_norms = 1;
    c->embd_scale = sqrtf((float)c->d_model);
    /* query_pre_attn_scalar: d / heads for the 27B (46 layers in Gemma 2, 62 in Gemma 3),
     * head_dim otherwise */
    c->attn_scale = 1.0f / sqrtf((float)(c->n_layers == (g2 ? 46 : 62) ? c->d_model / c->n_heads
                                                                         : c->head_dim));
    /* Gemma 2 always caps (llama.cpp's defaults when the keys are absent: 50 and 30) */
    c->attn_softcap = g2 ? 50.0f : 0.0f, c->final_softcap = g2 ? 30.0f : 0.0f;
    if ((r = meta_f32(f, c->arch, "final_logit_softcapping", &c->final_softcap, err, n)) < 0 ||
        (r = meta_f32(f, c->arch, "attn_logit_softcapping", &c->attn_softcap, err, n)) < 0)
        return r;
    if (c->final_softcap < 0 || c->attn_softcap < 0)
        return model_fail(err, n, -EINVAL, "model: negative logit soft-capping");
    uint32_t win = g2 ? 4096 : 0, pattern = g2 ? 2 : 6; /* Gemma 2: every other layer */
    if ((r = meta_u32(f, c->arch, "attention.sliding_window", &win, 0, err, n)) < 0) return r;
    if (!win) return 0;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", c->arch);
    const gguf_kv *pk = gguf_find(f, key);
    int per_layer = pk && pk->type == GGUF_ARR;
    if (per_layer && (pk->arr_type != GGUF_BOOL || pk->arr_n != (uint64_t)c->n_layers))
        return model_fail(err, n, -EINVAL, "model: %s must be %d booleans", key, c->n_layers);
    if (!per_layer && (r = meta_u32(f, c->arch, "attention.sliding_window_pattern", &pattern, 0, err, n)) < 0)
        return r;
    c->swa_window = (int)(win > (1u << 30) ? 1u << 30 : win);
    for (int l = 0; l < c->n_layers; l++) /* llama.cpp's rule: every pattern-th layer is global */
        m->w.layers[l].swa = per_layer ? pk->val[l] != 0
                                       : pattern == 0 || (uint32_t)l % pattern < pattern - 1;
    float base = 10000.0f;
    if ((r = meta_f32(f, c->arch, "rope.freq_base_swa", &base, err, n)) < 0) return r;
    c->swa_rope = !g2 || r == 0; /* Gemma 2's windowed layers share the global RoPE */
    if (!(base > 1.0f)) return model_fail(err, n, -EINVAL, "model: rope.freq_base_swa %g", base);
    for (int i = 0; i < c->rope_dim / 2; i++)
        c->rope_freq_swa[i] = pow(base, -2.0 * i / c->rope_dim);
    return 0;
}

static int read_config(model *m, char *err, size_t n) {
    model_config *c = &m->cfg;
    const gguf_file *f = &m->gguf;
    int r;
    if ((r = read_arch(c, f, err, n)) < 0 || (r = check_keys(m, err, n)) < 0 ||
        (r = read_shape(c, f, err, n)) < 0 || (r = read_rope(c, f, err, n)) < 0 ||
        (r = read_scales(c, f, err, n)) < 0)
        return r;
    c->rms_eps = 1e-5f;
    if ((r = meta_f32(f, c->arch, "attention.layer_norm_rms_epsilon", &c->rms_eps, err, n)) < 0)
        return r;
    if (!(c->rms_eps > 0.0f && c->rms_eps < 1.0f))
        return model_fail(err, n, -EINVAL, "model: %s.attention.layer_norm_rms_epsilon %g is not in (0, 1)",
                          c->arch, c->rms_eps);
    /* general.file_type only labels the file, but a value llama.cpp's enum does not hold
     * (0..41, or 1024 for "guessed") says the header is not what a converter wrote */
    uint32_t ft;
    int fr = gguf_get_u32(f, "general.file_type", &ft);
    if (fr == 0 ? ft > 41 && ft != 1024 : fr != -ENOENT)
        return model_fail(err, n, -EINVAL, "model: general.file_type is not a known file type");
    return 0;
}

/* ------------------------------------------------------------------ tensors */

static const gguf_tensor *take(loader *ld, const char *name) {
    const gguf_tensor *t = gguf_tensor_find(&ld->m->gguf, name);
    if (t) ld->used[t - ld->m->gguf.tensors] = 1;
    return t;
}

/* A 1-D vector of n floats; F16/BF16 are widened into the spill area. */
static int load_vec(loader *ld, const char *name, int n, const float **out, int optional) {
    const gguf_tensor *t = take(ld, name);
    *out = NULL;
    if (!t) return optional ? 0 : model_fail(ld->err, ld->en, -EINVAL, "model: tensor '%s' is missing", name);
    if (t->ne[0] != n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
        return model_fail(ld->err, ld->en, -EINVAL, "model: tensor '%s' has shape [%lld], want [%d]",
                    name, (long long)t->ne[0], n);
    if (t->type == QT_F32) {
        *out = t->data;
        return 0;
    }
    if (t->type != QT_F16 && t->type != QT_BF16)
        return model_fail(ld->err, ld->en, -EINVAL, "model: vector '%s' has type %s (want F32/F16/BF16)",
                    name, quant_type_name(t->type));
    quant_dequant(t->type, t->data, ld->spill, n);
    *out = ld->spill;
    ld->spill += n;
    return 0;
}

/* n_mats matrices of n_out rows of n_in: a 2-D tensor (n_mats 1) or the experts' 3-D one,
 * each expert's rows contiguous after the previous one's. */
static int load_mats(loader *ld, const char *name, int n_in, int n_out, int n_mats,
                     model_mat *out, int optional) {
    const gguf_tensor *t = take(ld, name);
    memset(out, 0, (size_t)n_mats * sizeof *out);
    if (!t) return optional ? 0 : model_fail(ld->err, ld->en, -EINVAL, "model: tensor '%s' is missing", name);
    if (t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != n_mats || t->ne[3] != 1)
        return model_fail(ld->err, ld->en, -EINVAL, "model: tensor '%s' is [%lld x %lld x %lld], want "
                    "[%d x %d x %d]", name, (long long)t->ne[0], (long long)t->ne[1],
                    (long long)t->ne[2], n_in, n_out, n_mats);
    const quant_traits *qt = quant_traits_of(t->type);
    size_t rb = quant_row_size(t->type, n_in);
    if (!qt || !quant_traits_of((uint32_t)qt->dot_type) || rb == 0)
        return model_fail(ld->err, ld->en, -ENOTSUP, "model: tensor '%s' has unsupported type %s", name,
                    quant_type_name(t->type));
    for (int e = 0; e < n_mats; e++) /* gguf.c checked the whole tensor lies in the file */
        out[e] = (model_mat){(const uint8_t *)t->data + (size_t)e * n_out * rb, t->type, n_in,
                             n_out, rb, NULL};
    return 0;
}

static int load_mat(loader *ld, const char *name, int n_in, int n_out, model_mat *out, int optional) {
    return load_mats(ld, name, n_in, n_out, 1, out, optional);
}

/* Rows [r0, r0 + n) of a row-major matrix: one of the parts of a fused tensor. */
static model_mat mat_rows(const model_mat *w, int r0, int n) {
    model_mat m = *w;
    m.data = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    m.n_out = n;
    return m;
}

static int load_experts(loader *ld, const char *name, int n_in, int n_out, int n_exp, model_mat *out) {
    return load_mats(ld, name, n_in, n_out, n_exp, out, 0);
}

static int load_layer(loader *ld, int l) {
    const model_config *c = &ld->m->cfg;
    model_layer *L = &ld->m->w.layers[l];
    int d = c->d_model, qd = c->n_heads * c->head_dim, kd = c->n_kv_heads * c->head_dim;
    int hd = c->head_dim, qk_norm = !strncmp(c->arch, "qwen3", 5) || !strcmp(c->arch, "gemma3");
    char nm[96];
    int r = 0;
#define NAME(s) (snprintf(nm, sizeof nm, "blk.%d." s, l), nm)
    if (!r) r = load_vec(ld, NAME("attn_norm.weight"), d, &L->attn_norm, 0);
    model_mat fused;
    if (!r) r = load_mat(ld, NAME("attn_qkv.weight"), d, qd + 2 * kd, &fused, 1);
    if (!r && fused.data) { /* Phi-3: q, k and v rows in one tensor */
        L->wq = mat_rows(&fused, 0, qd), L->wk = mat_rows(&fused, qd, kd);
        L->wv = mat_rows(&fused, qd + kd, kd);
    } else {
        if (!r) r = load_mat(ld, NAME("attn_q.weight"), d, qd, &L->wq, 0);
        if (!r) r = load_mat(ld, NAME("attn_k.weight"), d, kd, &L->wk, 0);
        if (!r) r = load_mat(ld, NAME("attn_v.weight"), d, kd, &L->wv, 0);
    }
    if (!r) r = load_vec(ld, NAME("attn_q.bias"), qd, &L->bq, 1);
    if (!r) r = load_vec(ld, NAME("attn_k.bias"), kd, &L->bk, 1);
    if (!r) r = load_vec(ld, NAME("attn_v.bias"), kd, &L->bv, 1);
    if (!r) r = load_vec(ld, NAME("attn_q_norm.weight"), hd, &L->q_norm, !qk_norm);
    if (!r) r = load_vec(ld, NAME("attn_k_norm.weight"), hd, &L->k_norm, !qk_norm);
    if (!r) r = load_mat(ld, NAME("attn_output.weight"), qd, d, &L->wo, 0);
    if (!r && c->post_norms) r = load_vec(ld, NAME("post_attention_norm.weight"), d, &L->attn_post_norm, 0);
    if (!r) r = load_vec(ld, NAME("ffn_norm.weight"), d, &L->ffn_norm, 0);
    if (!r && c->post_norms) r = load_vec(ld, NAME("post_ffw_norm.weight"), d, &L->ffn_post_norm, 0);
    if (c->n_expert) {
        int ne = c->n_expert, fe = c->ffn_exp_dim;
        model_mat *x = ld->m->experts + (size_t)l * 3 * ne;
        L->exp_gate = x, L->exp_up = x + ne, L->exp_down = x + 2 * ne;
        if (!r) r = load_mat(ld, NAME("ffn_gate_inp.weight"), d, ne, &L->router, 0);
        if (!r) r = load_experts(ld, NAME("ffn_gate_exps.weight"), d, fe, ne, L->exp_gate);
        if (!r) r = load_experts(ld, NAME("ffn_up_exps.weight"), d, fe, ne, L->exp_up);
        if (!r) r = load_experts(ld, NAME("ffn_down_exps.weight"), fe, d, ne, L->exp_down);
        int fs = c->ffn_shexp_dim;
        if (!r && fs) r = load_mat(ld, NAME("ffn_gate_inp_shexp.weight"), d, 1, &L->sh_gate_inp, 0);
        if (!r && fs) r = load_mat(ld, NAME("ffn_gate_shexp.weight"), d, fs, &L->sh_gate, 0);
        if (!r && fs) r = load_mat(ld, NAME("ffn_up_shexp.weight"), d, fs, &L->sh_up, 0);
        if (!r && fs) r = load_mat(ld, NAME("ffn_down_shexp.weight"), fs, d, &L->sh_down, 0);
    } else if (!strcmp(c->arch, "phi3")) { /* gate rows then up rows in ffn_up */
        if (!r) r = load_mat(ld, NAME("ffn_up.weight"), d, 2 * c->ffn_dim, &fused, 0);
        if (!r) L->w_gate = mat_rows(&fused, 0, c->ffn_dim), L->w_up = mat_rows(&fused, c->ffn_dim, c->ffn_dim);
        if (!r) r = load_mat(ld, NAME("ffn_down.weight"), c->ffn_dim, d, &L->w_down, 0);
    } else {
        if (!r) r = load_mat(ld, NAME("ffn_gate.weight"), d, c->ffn_dim, &L->w_gate, 0);
        if (!r) r = load_mat(ld, NAME("ffn_up.weight"), d, c->ffn_dim, &L->w_up, 0);
        if (!r) r = load_mat(ld, NAME("ffn_down.weight"), c->ffn_dim, d, &L->w_down, 0);
    }
#undef NAME
    if (!r && (!L->q_norm) != (!L->k_norm))
        r = model_fail(ld->err, ld->en, -EINVAL, "model: layer %d has only one of attn_q_norm/attn_k_norm", l);
    return r;
}

/* Llama 3.1+'s per-pair frequency divisors (the converter's "llama3" RoPE scaling). */
static int load_rope_freqs(loader *ld) {
    model_config *c = &ld->m->cfg;
    const float *ff;
    int r = load_vec(ld, "rope_freqs.weight", c->rope_dim / 2, &ff, 1);
    if (r || !ff) return r;
    for (int i = 0; i < c->rope_dim / 2; i++) {
        if (!(ff[i] > 0.0f) || !isfinite(ff[i]))
            return model_fail(ld->err, ld->en, -EINVAL, "model: rope_freqs.weight[%d] is %g", i, ff[i]);
        c->rope_freq[i] /= ff[i];
    }
    ld->m->has_rope_freqs = 1;
    return 0;
}

static int load_tensors(loader *ld) {
    model *m = ld->m;
    model_config *c = &m->cfg;
    int r;
    if ((r = load_mat(ld, "token_embd.weight", c->d_model, c->n_vocab, &m->w.tok_embd, 0))) return r;
    for (int l = 0; l < c->n_layers; l++)
        if ((r = load_layer(ld, l))) return r;
    if ((r = load_vec(ld, "output_norm.weight", c->d_model, &m->w.out_norm, 0))) return r;
    /* Gemma 2 always ties (llama.cpp never reads an output.weight there: refused if present) */
    if (strcmp(c->arch, "gemma2") &&
        (r = load_mat(ld, "output.weight", c->d_model, c->n_vocab, &m->w.output, 1)))
        return r;
    if (!m->w.output.data) m->w.output = m->w.tok_embd; /* tied embeddings */
    if ((r = load_rope_freqs(ld))) return r;
    if ((r = load_vec(ld, "rope_factors_long.weight", c->rope_dim / 2, &m->rope_long, 1)) ||
        (r = load_vec(ld, "rope_factors_short.weight", c->rope_dim / 2, &m->rope_short, 1)))
        return r;
    if ((!m->rope_long) != (!m->rope_short))
        return model_fail(ld->err, ld->en, -EINVAL, "model: rope_factors_long without rope_factors_short or back");
    for (int i = 0; m->rope_long && i < c->rope_dim / 2; i++)
        if (!(m->rope_long[i] > 0.0f) || !(m->rope_short[i] > 0.0f) || !isfinite(m->rope_long[i]) ||
            !isfinite(m->rope_short[i]))
            return model_fail(ld->err, ld->en, -EINVAL, "model: rope_factors_long/short[%d] not positive", i);
    memcpy(m->rope_freq_plain, c->rope_freq, sizeof c->rope_freq);
    model_set_context(m, c->n_ctx_train);
    c->qk_norm = m->w.layers[0].q_norm != NULL;
    for (int l = 1; l < c->n_layers; l++)
        if ((m->w.layers[l].q_norm != NULL) != c->qk_norm)
            return model_fail(ld->err, ld->en, -EINVAL, "model: attn_q_norm on some layers only");
    for (uint64_t i = 0; i < m->gguf.n_tensors; i++)
        if (!ld->used[i]) {
            gguf_str s = m->gguf.tensors[i].name;
            return model_fail(ld->err, ld->en, -ENOTSUP, "model: tensor '%.*s' is not used by kiln's "
                        "%s forward pass (not implemented), so the file is refused",
                        (int)(s.len > 96 ? 96 : s.len), s.ptr, c->arch);
        }
    return 0;
}

int model_load(model *m, const char *path, char *err, size_t en) {
    memset(m, 0, sizeof *m);
    int r = gguf_open(&m->gguf, path);
    if (r < 0) return model_fail(err, en, r, "%s", m->gguf.err);
    loader ld = {m, NULL, NULL, err, en};
    if ((r = read_config(m, err, en)) < 0) goto bad;
    model_config *c = &m->cfg;
    const gguf_tensor *emb = gguf_tensor_find(&m->gguf, "token_embd.weight");
    if (!emb || emb->ne[1] < 1 || emb->ne[1] > (1 << 24)) {
        r = model_fail(err, en, -EINVAL, "model: token_embd.weight missing or has a bad vocab size");
        goto bad;
    }
    c->n_vocab = (int)emb->ne[1];
    uint32_t vs;
    if (meta_u32(&m->gguf, c->arch, "vocab_size", &vs, 0, err, en) == 0 && vs != (uint32_t)c->n_vocab) {
        r = model_fail(err, en, -EINVAL, "model: %s.vocab_size %u differs from token_embd.weight's %d rows",
                       c->arch, vs, c->n_vocab);
        goto bad;
    }
    /* Worst case every vector is widened: norms (post-norms too), biases and q/k norms
     * per layer, the final norm and the RoPE factors (three sets at most). */
    size_t spill_n = (size_t)c->n_layers * (4 * c->d_model + c->n_heads * c->head_dim +
                                            2 * c->n_kv_heads * c->head_dim + 2 * c->head_dim) +
                     c->d_model + 2 * c->rope_dim;
    m->f32_copies = malloc(spill_n * sizeof(float));
    m->w.layers = calloc((size_t)c->n_layers, sizeof *m->w.layers);
    ld.used = calloc(m->gguf.n_tensors ? m->gguf.n_tensors : 1, 1);
    if (c->n_expert) m->experts = calloc((size_t)c->n_layers * 3 * c->n_expert, sizeof *m->experts);
    if (!m->f32_copies || !m->w.layers || !ld.used || (c->n_expert && !m->experts)) {
        r = model_fail(err, en, -ENOMEM, "model: out of memory");
        goto bad;
    }
    ld.spill = m->f32_copies;
    if ((r = read_gemma(m, err, en)) < 0 || (r = load_tensors(&ld))) goto bad;
    free(ld.used);
    return 0;
bad:
    free(ld.used);
    model_free(m);
    return r;
}

void model_free(model *m) {
    free(m->w.layers);
    free(m->experts);
    free(m->f32_copies);
    gguf_close(&m->gguf);
    memset(m, 0, sizeof *m);
}

void model_set_context(model *m, int n_ctx) {
    model_config *c = &m->cfg;
    if (!m->rope_long) return;
    const float *ff = n_ctx > c->rope_orig_ctx ? m->rope_long : m->rope_short;
    for (int i = 0; i < c->rope_dim / 2; i++) c->rope_freq[i] = m->rope_freq_plain[i] / ff[i];
}

int model_extras(const model *m, char *buf, size_t n) {
    const model_config *c = &m->cfg;
    struct { int on; const char *what; } x[] = {
        {c->n_expert > 0, "mixture of experts"},
        {c->ffn_gelu || c->post_norms || c->final_softcap > 0 || c->attn_softcap > 0,
         "Gemma's GeGLU, post-norms and soft-capping"},
        {c->swa_window > 0, "sliding-window attention"},
        {m->rope_long != NULL, "LongRoPE factors (Phi-3)"},
        {!c->post_norms && (c->embd_scale != 1.0f || c->resid_scale != 1.0f || c->logit_scale != 1.0f ||
         fabsf(c->attn_scale * sqrtf((float)c->head_dim) - 1.0f) > 1e-6f), "Granite multipliers"},
    };
    int k = 0;
    size_t at = 0;
    if (n) buf[0] = 0;
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++)
        if (x[i].on) {
            if (at < n) at += (size_t)snprintf(buf + at, n - at, "%s%s", k ? ", " : "", x[i].what);
            k++;
        }
    return k;
}

/* The f16 row converters of the 8-bit KV blocks: the kernels' own (mm has none). */
static void kv_to_f32(const uint16_t *src, float *dst, int64_t n) { quant_dequant(QT_F16, src, dst, n); }
static void kv_to_f16(const float *src, uint16_t *dst, int64_t n) { quant_quantize(QT_F16, src, dst, n); }

void model_kv_shape(const model *m, kv_config *kc) {
    kc->n_layers = m->cfg.n_layers;
    kc->n_kv_heads = m->cfg.n_kv_heads;
    kc->head_dim = m->cfg.head_dim;
    kc->f16 = (kv_f16_conv){kv_to_f32, kv_to_f16};
    /* the windowed layers, so the pool can give back KV no window reads again */
    kc->swa_window = m->cfg.swa_window;
    memset(kc->swa_layers, 0, sizeof kc->swa_layers);
    for (int l = 0; l < m->cfg.n_layers && l < KV_MAX_LAYERS; l++)
        if (m->w.layers[l].swa) kc->swa_layers[l / 64] |= 1ull << (l % 64);
}
