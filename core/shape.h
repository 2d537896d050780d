/* shape: random-weight GGUF models of real models' shapes, quantized by kiln's own
 * quantizers, written in seconds on many cores.
 *
 * The cost of a forward pass depends on the shape and the tensor types, not on the
 * weights, so a seeded random model of a published model's exact dimensions, in the
 * type mix a quantizer gives it, measures what that model would. This writer exists
 * for machines a multi-GB model cannot travel to (the GPU machine) and for benchmarks;
 * tests/shapes/gen_shape.py + llama.cpp's llama-quantize remain the peer's own route.
 *
 * The type mix follows llama-quantize's choices for the same file type (recorded from
 * it in tests/shapes/ref/ and compared by `make test`): Q4_K_M / Q5_K_M put the output
 * matrix (the embedding when tied), and attn_v / ffn_down on the "more bits" layers, in
 * Q6_K; the other quantized types put the output matrix in Q6_K too (Q8_0 keeps Q8_0);
 * a K-quant on rows that are not a multiple of 256 falls back (Q4_K to Q5_0, Q5_K to
 * Q5_1, Q6_K to Q8_0). Weights: matrices ~ normal(0, 0.02) (a sum of four uniforms),
 * norms 1 + that, seeded per tensor name and row, so the bytes do not depend on the
 * thread count. The tokenizer is copied from a GGUF and padded to the shape's vocabulary
 * with <|reserved_N|> control tokens, so the embedding and output have the real size. */
#ifndef KILN_SHAPE_H
#define KILN_SHAPE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *name, *arch;
    int d, layers, heads, kv, hd, ffn, vocab; /* hd 0: d / heads */
    int tied, bias, ctx;                      /* bias: q/k/v biases (Qwen2) */
    float theta, eps;
    float llama3[4];    /* rope_scaling "llama3": factor, low, high, original ctx; 0: none */
    int experts[3];     /* count, used per token, expert ffn; 0: dense */
    int swa[2];         /* sliding window, pattern (every pattern-th layer global); 0: none */
    float swa_base;     /* the windowed layers' RoPE base */
} shape_def;

/* The known shapes, in a fixed order: shape_at(i) for i = 0.. until NULL. */
const shape_def *shape_at(int i);
const shape_def *shape_find(const char *name);

/* A file type by llama-quantize's name (F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K_M
 * Q5_K_M Q6_K); -1 for an unknown one. shape_ftype_name(i) lists them (NULL past). */
int shape_ftype(const char *name);
const char *shape_ftype_name(int ftype);

enum { SHAPE_MAT, SHAPE_NORM, SHAPE_BIAS, SHAPE_ROUTER, SHAPE_ROPE };

typedef struct {
    char name[48];
    int n_dims;
    int64_t ne[3];  /* ne[0] is the row length */
    uint32_t type;  /* enum qtype */
    int kind;       /* SHAPE_* */
} shape_tensor;

/* The tensors of shape s in file type ftype, in file order, into out[0..cap); returns
 * how many there are (call with cap 0 to count). */
int shape_plan(const shape_def *s, int ftype, shape_tensor *out, int cap);

typedef struct {
    const char *tokenizer; /* a GGUF whose tokenizer.* keys are copied */
    uint64_t seed;
    int threads;
} shape_opts;

/* Writes the model to path (through path.part, renamed when complete). Returns 0, or a
 * negative errno-style code with err set. *bytes: the file's size. */
int shape_write(const shape_def *s, int ftype, const char *path, const shape_opts *o,
                uint64_t *bytes, char *err, size_t n);

#endif
