/* attn: the inner loop of attention over one KV block, for the query heads that share
 * one KV head (GQA), with an online softmax (running max and sum per query), so a
 * sequence's blocks can be visited one at a time through its page table.
 *
 * V is f16 rows [n][head_dim]; K is f16 dimension-major, key i's element d at
 * K[d * kstride + i] (mm/kv.h's K slab, kstride its block_size): a block's keys sit in a
 * vector's lanes, so each score is a chain of FMAs with no sum across lanes. Or both
 * int8 in the same layouts, one scale for all of K and one for all of V (8-bit KV
 * blocks, the degrade ladder's rung 2). A plain C reference sits
 * beside SIMD paths (AVX2, AVX-512) picked at run time by the level in force
 * (core/cpu/isa.h); tests/unit/test_attn.c compares them. */
#ifndef KILN_ATTN_H
#define KILN_ATTN_H

#include <stddef.h>
#include <stdint.h>

#define ATTN_MAX_GROUP 16  /* query heads per KV head */
#define ATTN_MAX_BLOCK 256 /* keys per call */
#define ATTN_MAX_DIM 256   /* head_dim */

/* Running softmax state of g queries: max score m, sum of exp(score - m) l, and the
 * unnormalized output acc [g][hd]. */
typedef struct {
    int g, hd;
    float softcap; /* > 0: scores become softcap * tanh(score / softcap) first (Gemma 2) */
    float m[ATTN_MAX_GROUP];
    float l[ATTN_MAX_GROUP];
    float acc[ATTN_MAX_GROUP * ATTN_MAX_DIM];
} attn_state;

void attn_init(attn_state *st, int g, int hd);
/* Soft-capped scores from now on (0: none; Gemma 2 has them). Every level caps each
 * score with tanhf, as the reference does. */
void attn_set_softcap(attn_state *st, float softcap);
/* Fold n keys/values into the state. q: [g][hd] f32, already scaled by 1/sqrt(hd). */
void attn_block(attn_state *st, const float *q, const uint16_t *K, size_t kstride,
                const uint16_t *V, int n);
void attn_block_ref(attn_state *st, const float *q, const uint16_t *K, size_t kstride,
                    const uint16_t *V, int n);
/* The same over int8 K and V: key i is ks * K[i], value i is vs * V[i]. */
void attn_block_q8(attn_state *st, const float *q, const int8_t *K, size_t kstride, float ks,
                   const int8_t *V, float vs, int n);
void attn_block_q8_ref(attn_state *st, const float *q, const int8_t *K, size_t kstride,
                       float ks, const int8_t *V, float vs, int n);
/* out + j*out_stride receives query j's attention output. */
void attn_finish(const attn_state *st, float *out, size_t out_stride);

/* SIMD variants (core/cpu/attn_avx2.c, core/cpu/attn_avx512.c); hd must be a multiple of 8/16,
 * attn_block falls back to the reference otherwise. */
void attn_block_avx2(attn_state *st, const float *q, const uint16_t *K, size_t kstride,
                     const uint16_t *V, int n);
void attn_block_avx512(attn_state *st, const float *q, const uint16_t *K, size_t kstride,
                       const uint16_t *V, int n);
void attn_block_q8_avx2(attn_state *st, const float *q, const int8_t *K, size_t kstride, float ks,
                        const int8_t *V, float vs, int n);
void attn_block_q8_avx512(attn_state *st, const float *q, const int8_t *K, size_t kstride,
                          float ks, const int8_t *V, float vs, int n);

#endif
