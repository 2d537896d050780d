/* direct: the model and tokenizer loaded from the command line, and one sequence run
 * straight through the backend with no scheduler: what `kilnd bench` measures (prefill
 * and decode alone). The flags `kilnd generate` and `kilnd bench` share are parsed
 * here too; generate runs the engine as the server does (kilnd/generate.c). */
#ifndef KILN_KILND_DIRECT_H
#define KILN_KILND_DIRECT_H

#include <stdint.h>

#include "core/sampler.h"
#include "core/tokenizer.h"
#include "kilnd/kilnd.h"

#define DR_BLOCK_SIZE 16
#define DR_MAX_STOPS 8

/* Everything one generation needs: the model, the tokenizer, the pinned arena holding
 * the KV pool, and a backend. */
typedef struct {
    model m;
    tok_t tok;
    mm_pool arena;
    kv_pool kv;
    backend *be;
    int chunk;          /* prefill tokens per step */
    int32_t *positions; /* [chunk] step scratch */
    kv_seq **seqs;      /* [chunk] */
    int32_t *rows;      /* [chunk] logit rows 0..chunk-1 (dr_prompt_logits) */
    int loaded_tok, loaded_kv;
} dr_runner;

typedef struct {
    const char *model, *prompt, *prompt_ids, *system, *dump_logits, *dump_prompt_logits;
    int chat, ids, threads, max_tokens, ctx, chunk, special, exact, backend;
    int prompt_tokens, gen_tokens, repeat;
    sampler_params sp;
    const char *stops[DR_MAX_STOPS];
    int n_stops;
} dr_opts;


void dr_close(dr_runner *e);
/* Map the model and build its tokenizer; 0, or -1 with the reason on stderr. */
int dr_load(dr_runner *e, const char *path);
/* The backend (CPU, or CUDA per --backend) and a KV pool for one sequence of up to ctx
 * positions, with prefill steps of up to chunk tokens and max_logits logit rows. */
int dr_start(dr_runner *e, int kind, int threads, int ctx, int chunk, int max_logits, int exact);
/* Run n tokens of seq starting at position pos in steps of e->chunk; returns the logits
 * of the last token (owned by the backend) or NULL. */
const float *dr_feed(dr_runner *e, kv_seq *seq, const int32_t *toks, int n, int pos);
/* Every position's logits of toks[0..n) on a fresh sequence (released after), in steps
 * of e->chunk with every row's logits asked for, into out [n][n_vocab]. Needs a backend
 * started with max_logits = chunk. 0, or -1 with the reason on stderr. */
int dr_prompt_logits(dr_runner *e, const int32_t *toks, int n, float *out);
/* argv from the subcommand's name on; 0, or -1 with the reason on stderr. */
int dr_parse(int argc, char **argv, dr_opts *o);
#endif
