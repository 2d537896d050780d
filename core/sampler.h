/* sampler: logits -> next token, with its own RNG; and stopper: stop strings matched
 * across token boundaries.
 *
 * Order of one sampler_sample: penalties (repetition over the last repeat_last_n
 * tokens, prompt included; presence/frequency over generated tokens) -> greedy argmax
 * when temperature <= 0 -> logits / temperature -> top_k -> top_p -> min_p (both on the
 * tempered distribution, renormalized after each cut, as vLLM and HF do) -> draw.
 * The logprob reported is log_softmax over the whole vocabulary of the logits after
 * penalties and before temperature and truncation: the model's own belief, comparable
 * across sampling settings. Only sampler_init and the _init functions of the memory
 * below allocate; sampler_init_with runs on memory made beforehand (the engine makes it
 * once, at eng_new, for all its samplers). */
#ifndef KILN_SAMPLER_H
#define KILN_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#define SAMPLER_MAX_STOP_IDS 8

typedef struct {
    float temperature;       /* <= 0: greedy */
    int top_k;               /* <= 0 or >= n_vocab: off */
    float top_p;             /* >= 1: off */
    float min_p;             /* <= 0: off; keep p >= min_p * p_max */
    float repeat_penalty;    /* 1: off; llama.cpp-style, positive logits / it, negative * it */
    int repeat_last_n;       /* window for repeat_penalty, prompt included; 0: off */
    float presence_penalty;  /* OpenAI-style, over generated tokens: - presence if seen */
    float frequency_penalty; /* - frequency * count */
    uint64_t seed;           /* 0: random (from the clock); the seed used is in s->seed */
    int max_tokens;          /* generated tokens before SAMPLER_STOP_LENGTH; <= 0: no limit */
    int32_t stop_ids[SAMPLER_MAX_STOP_IDS]; /* e.g. the model's EOS/EOT */
    int n_stop_ids;
} sampler_params;

enum { SAMPLER_RUNNING = 0, SAMPLER_STOP_TOKEN = 1, SAMPLER_STOP_LENGTH = 2 };

typedef struct {
    int32_t id;
    float v; /* logit, then unnormalized probability */
} sampler_cand;

/* sampler_sample's scratch. Samplers that sample from one thread, one at a time (the
 * engine's loop), may share one: nothing in it outlives a call. */
typedef struct {
    int n_vocab;
    sampler_cand *cand;  /* [n_vocab + 1] */
    float *prob;         /* [n_vocab] */
    uint8_t *mark;       /* [n_vocab] 0 between calls: tokens already penalized */
} sampler_scratch;

/* One sampler's penalty history for sampler_init_with, for up to cap accepted tokens
 * (a sequence's length): the repetition window, and the distinct generated tokens with
 * their counts. A repeat_last_n over cap is cut to cap, which changes nothing while at
 * most cap tokens are accepted; distinct generated tokens past cap would go uncounted. */
typedef struct {
    int cap;
    int32_t *ring;       /* [cap] */
    int32_t *gen_seen;   /* [cap] */
    int32_t *gen_n;      /* [cap] */
} sampler_hist;

typedef struct {
    sampler_params par;
    int n_vocab;
    uint64_t seed;       /* the seed in force (reproduces this run) */
    uint64_t rng[4];     /* xoshiro256** */
    sampler_scratch sc;  /* its own (sampler_init) or shared (sampler_init_with) */
    int32_t *ring;       /* [ring_cap] last tokens, prompt included; NULL if off */
    int ring_cap, ring_pos, ring_n;
    int32_t *gen_seen;   /* [gen_cap] distinct generated tokens, first-seen order; NULL if off */
    int32_t *gen_n;      /* [gen_cap] occurrences of each */
    int gen_cap, n_gen_seen;
    int n_generated;     /* tokens accepted with is_prompt = 0 */
    int stop;            /* SAMPLER_* once a stop condition was accepted */
    int owned;           /* sampler_init: sampler_free frees the arrays */
} sampler;

/* Defaults: temperature 1, everything else off (top_p 1, repeat_penalty 1). */
void sampler_params_default(sampler_params *p);
/* 0, -EINVAL (bad params; n_vocab < 1) or -ENOMEM. */
int sampler_init(sampler *s, const sampler_params *p, int n_vocab);
/* The same sampler on memory made beforehand, allocating nothing: sc (n_vocab at least
 * s's) may be shared as said above; h is s's alone until sampler_free(s), which then
 * frees nothing. 0 or -EINVAL. */
int sampler_init_with(sampler *s, const sampler_params *p, int n_vocab, const sampler_scratch *sc,
                      const sampler_hist *h);
void sampler_free(sampler *s);
/* 0, -EINVAL or -ENOMEM; the _free functions take zeroed or failed ones too. */
int sampler_scratch_init(sampler_scratch *sc, int n_vocab);
void sampler_scratch_free(sampler_scratch *sc);
int sampler_hist_init(sampler_hist *h, int cap);
void sampler_hist_free(sampler_hist *h);
/* Next token from logits[n_vocab] (modified in place by the penalties). logprob may be
 * NULL. Does not record the token: call sampler_accept with it. */
int32_t sampler_sample(sampler *s, float *logits, float *logprob);
#define SAMPLER_MAX_TOP 20 /* the OpenAI API's top_logprobs at most */
/* The same, and the n_top (<= SAMPLER_MAX_TOP) most likely tokens under the distribution
 * the logprob is taken from, most likely first (ties: the lower id), with their
 * logprobs, into top_id and top_lp. Returns the token; *n_out gets how many were written
 * (fewer when the vocabulary is smaller). */
int32_t sampler_sample_top(sampler *s, float *logits, float *logprob, int n_top, int32_t *top_id,
                           float *top_lp, int *n_out);
/* Record a token: prompt tokens feed the repetition window only, generated ones also
 * the presence/frequency counts, max_tokens and the stop ids. */
void sampler_accept(sampler *s, int32_t tok, int is_prompt);
/* SAMPLER_RUNNING, or why generation should end after the last accepted token. */
int sampler_stopped(const sampler *s);

/* ---------------------------------------------------------------- stop strings */

#define STOPPER_MAX 8
#define STOPPER_MAX_LEN 64

typedef struct {
    char str[STOPPER_MAX][STOPPER_MAX_LEN];
    size_t len[STOPPER_MAX];
    int n;
    char held[STOPPER_MAX_LEN]; /* fed but not emitted: could begin a stop string */
    size_t n_held;
    int stopped;
} stopper;

/* Up to STOPPER_MAX strings, each 1..STOPPER_MAX_LEN bytes. 0 or -EINVAL. */
int stopper_init(stopper *st, const char *const *strs, int n);
/* Takes newly decoded text; writes to out the bytes safe to emit now and returns their
 * count. A suffix that could begin a stop string is held back. When a stop string
 * completes, the text before it is emitted, the stop string and anything after it are
 * not, and *stopped (may be NULL) is set; later feeds emit nothing. The earliest-ending
 * match wins (so the result does not depend on how the text was split).
 * out must have room for n + STOPPER_MAX_LEN bytes; it is never overrun. */
size_t stopper_feed(stopper *st, const char *text, size_t n, char *out, size_t cap, int *stopped);
/* At the end of generation: the held-back text (nothing after a stop). */
size_t stopper_flush(stopper *st, char *out, size_t cap);

#endif
