/* model: the Llama-family transformer (Llama, SmolLM2, Llama-3, Qwen2, Mistral-style).
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
    float rms_eps;
    char arch[32];
} model_config;

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
    model_mat wo;            /* [d_model][n_heads*head_dim] */
    const float *ffn_norm;   /* [d_model] */
    model_mat w_gate, w_up;  /* [ffn_dim][d_model] */
    model_mat w_down;        /* [d_model][ffn_dim] */
} model_layer;

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

int model_load(model *m, const char *path, char *err, size_t errlen);
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
/* The KV shape this model needs (block_size, n_blocks etc. left for the caller). */
void model_kv_shape(const model *m, kv_config *kc);

#endif
