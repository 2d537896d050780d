/* model: the Llama-family transformer (Llama 2/3.x, SmolLM2, Mistral, Qwen2/2.5, Qwen3,
 * Granite, Gemma 2/3, Phi-3/4, Ministral 3) and its mixture-of-experts form (Mixtral,
 * Qwen2-MoE, Qwen3-MoE).
 *
 * Three structs split by lifetime, as in llama2.c: the hyperparameters, the read-only
 * weights (pointers into the GGUF mapping: quantized matrices stay quantized), and the
 * per-step scratch (model_state, sized once for the largest batch). model_forward runs
 * one step over a batch of tokens from many sequences, reading and writing K/V through
 * the sequences' page tables in mm/kv. */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "core/cpu/attn.h"
#include "core/gguf.h"
#include "mm/kv.h"

typedef struct thr_pool thr_pool;

typedef struct {
    int n_layers;
    int d_model;     /* embedding width */
    int n_heads;     /* query heads */
    int n_kv_heads;  /* key/value heads (GQA when fewer than n_heads) */
    int head_dim;    /* d_model / n_heads */
    int ffn_dim;     /* SwiGLU hidden width */
    int n_vocab;
    int n_ctx_train; /* context length the model was trained for */
    int rope_dim;    /* dimensions rotated per head (≤ head_dim) */
    int rope_neox;   /* 1: rotate halves (NeoX, Qwen2); 0: adjacent pairs (Llama) */
    float rope_base;
    /* RoPE scaling as llama.cpp applies it: dimension pair i turns by pos * rope_freq[i],
     * rope_freq[i] = base^(-2i/rope_dim) / factor_i * s_i, where factor_i comes from a
     * rope_freqs tensor (Llama 3.1+), s_i is the linear scale 1/rope.scaling.factor, or
     * for YaRN a ramp between 1/factor and 1 over the dimensions; cos and sin are then
     * multiplied by rope_mscale (YaRN's magnitude correction, else 1). */
    int rope_scaling;         /* MODEL_ROPE_NONE, _LINEAR, _YARN */
    float rope_mscale;
    double rope_freq[ATTN_MAX_DIM / 2]; /* [rope_dim / 2] */
    int rope_orig_ctx;        /* rope.scaling.original_context_length (or the trained one) */
    float rms_eps;
    /* Granite's multipliers: 1 (0 for attn_scale: 1/sqrt(head_dim)) when absent */
    float embd_scale;  /* token embeddings *= */
    float resid_scale; /* attention and FFN outputs *= before the residual add */
    float attn_scale;  /* q·k scale */
    float logit_scale; /* logits /= */
    int qk_norm;       /* Qwen3: RMSNorm over each q and k head before RoPE */
    /* Mixture of experts (0 experts: a dense SwiGLU FFN): a router picks n_expert_used
     * of n_expert SwiGLU experts of ffn_exp_dim per token (softmax over all, top-k,
     * the k weights renormalized to sum 1 when expert_norm, Qwen2-MoE keeps the plain
     * probabilities), their outputs summed by those weights; Qwen2-MoE adds a shared
     * expert of ffn_shexp_dim (0: none) gated by sigmoid(x . shexp_gate). */
    int n_expert, n_expert_used, ffn_exp_dim, expert_norm, ffn_shexp_dim;
    /* Gemma 3: GeGLU, RMSNorm on the attention and FFN outputs before their residual
     * adds, logits soft-capped (cap * tanh(logit / cap), when > 0), and sliding-window
     * layers: layer.swa ones attend to the last swa_window positions only, with their
     * own RoPE (rope_freq_swa: rope.freq_base_swa, unscaled). */
    int ffn_gelu, post_norms;
    float final_softcap;
    float attn_softcap; /* Gemma 2: attention scores soft-capped the same way, when > 0 */
    int swa_window;
    int swa_rope; /* the windowed layers have their own RoPE, rope_freq_swa (Gemma) */
    double rope_freq_swa[ATTN_MAX_DIM / 2];
    char arch[32];
} model_config;

enum { MODEL_ROPE_NONE = 0, MODEL_ROPE_LINEAR = 1, MODEL_ROPE_YARN = 2 };

/* A weight matrix: n_out rows of n_in elements, row-major, of quant type `type`.
 * packed: the same rows in core/cpu/qpack's layout, or NULL; only a model_state's copy of
 * the weights has it (the model's own, shared with other backends, never does). */
typedef struct {
    const void *data;
    uint32_t type;
    int n_in, n_out;
    size_t row_bytes;
    const void *packed;
} model_mat;

typedef struct {
    const float *attn_norm;  /* [d_model] */
    model_mat wq;            /* [n_heads*head_dim][d_model] */
    model_mat wk, wv;        /* [n_kv_heads*head_dim][d_model] */
    const float *bq, *bk, *bv; /* optional biases (Qwen2), NULL otherwise */
    const float *q_norm, *k_norm; /* [head_dim] per-head RMSNorm (Qwen3), NULL otherwise */
    model_mat wo;            /* [d_model][n_heads*head_dim] */
    const float *ffn_norm;   /* [d_model] */
    model_mat w_gate, w_up;  /* [ffn_dim][d_model]; unused (NULL data) with experts */
    model_mat w_down;        /* [d_model][ffn_dim] */
    model_mat router;        /* [n_expert][d_model] (ffn_gate_inp) */
    const float *attn_post_norm, *ffn_post_norm; /* [d_model] (Gemma), NULL otherwise */
    int swa;                 /* a sliding-window layer (model_config.swa_window) */
    model_mat *exp_gate, *exp_up, *exp_down; /* [n_expert] each: slices of the 3-D tensors */
    model_mat sh_gate_inp, sh_gate, sh_up, sh_down; /* the shared expert (Qwen2-MoE) */
} model_layer;

#define MODEL_MAX_EXPERTS 256

typedef struct {
    model_mat tok_embd;      /* [n_vocab][d_model] */
    model_layer *layers;     /* [n_layers] */
    const float *out_norm;   /* [d_model] */
    model_mat output;        /* [n_vocab][d_model]; the embedding when tied */
} model_weights;

typedef struct {
    model_config cfg;
    model_weights w;
    gguf_file gguf;
    float *f32_copies;       /* norms/biases stored as F16/BF16 in the file, widened once */
    model_mat *experts;      /* every layer's exp_gate/up/down, one allocation */
    int has_rope_freqs;      /* cfg.rope_freq holds a rope_freqs tensor's factors */
    /* Phi-3's LongRoPE divisors (NULL when absent): cfg.rope_freq is rope_freq_plain
     * divided by the long ones when the context the model runs at exceeds
     * cfg.rope_orig_ctx, else by the short ones (model_set_context) */
    const float *rope_long, *rope_short;
    double rope_freq_plain[ATTN_MAX_DIM / 2];
} model;

/* One step: n_tokens tokens, each belonging to a sequence (a page table in kv) at a
 * position. Every sequence's page table must already have capacity for pos+1
 * (kv_seq_reserve) and its block for pos must be private (kv_seq_cow). Logits are
 * produced for the tokens listed in logit_rows, in that order. */
typedef struct {
    int n_tokens;
    const int32_t *tokens;     /* [n_tokens] */
    const int32_t *pos;        /* [n_tokens] position of the token in its sequence */
    kv_seq *const *seq;        /* [n_tokens] the token's sequence */
    int n_logits;
    const int32_t *logit_rows; /* [n_logits] indexes into the batch */
} model_batch;

typedef struct model_state model_state;

/* Loads a GGUF strictly: every tensor in the file must be one the forward pass uses, and
 * every "<arch>." metadata key one it implements (or one that does not change results,
 * like context_length), else the load fails naming the tensor or key. */
int model_load(model *m, const char *path, char *err, size_t errlen);
/* The context (positions per sequence) the model will run at, for what depends on it:
 * LongRoPE's choice of factors, made as llama.cpp makes it (long beyond the original
 * context). model_load assumes the trained context; call this before creating states. */
void model_set_context(model *m, int n_ctx);
/* What a model needs beyond the Llama/Qwen2/Qwen3 forward pass with cfg.rope_freq's
 * angles (MoE, Gemma's and Granite's extras, LongRoPE's context-dependent factors), as a comma-separated list for an error message, or "" and 0 when nothing:
 * for backends (CUDA) that implement only that pass. */
int model_extras(const model *m, char *buf, size_t n);
void model_free(model *m);
/* Scratch for batches of up to max_tokens tokens and max_logits logit rows over
 * contexts of up to max_ctx positions, and the CPU kernels' view of the weights: the
 * matrices whose type has a packed layout at the current SIMD level (qp_wanted) are
 * copied into it once here (as many bytes as in the file; Q8_0 6% more, Q4_K, Q5_K and
 * Q6_K 1-3%), and their pages in the file's mapping dropped from the resident set.
 * NULL on allocation failure. */
model_state *model_state_new(const model *m, int max_tokens, int max_logits, int max_ctx);
/* The matrices that will run the slower row-major kernels at the current SIMD level
 * (their type has no packed layout there), as one line for the log, e.g. "model: 113
 * of 113 matrices (F16 x 112, F32 x 1) have no packed kernel at avx512: the row-major
 * ones run them (slower)"; returns how many, 0 (and "") when none. */
int model_unpacked_note(const model *m, char *buf, size_t n);
void model_state_free(model_state *s);
/* Verification mode: matmuls dequantize weight rows and multiply by f32 activations
 * instead of 8-bit quantized ones (slow). Used to compare with an f32 reference, where
 * the production path's activation rounding would blur the comparison. */
int model_state_set_exact(model_state *s, const model *m, int on);
/* Runs the step; returns logits [n_logits][n_vocab] owned by s, or NULL with err set. */
const float *model_forward(const model *m, model_state *s, kv_pool *kv, thr_pool *tp,
                           const model_batch *b, char *err, size_t errlen);
/* The KV shape this model needs, its windowed layers included (block_size, n_blocks
 * etc. left for the caller; a device pool clears swa_window). */
void model_kv_shape(const model *m, kv_config *kc);

#endif
