/* engine: the request lifecycle and iteration-level (continuous) batching.
 *
 * Every step takes the running decodes first, then prefill chunks of waiting or
 * partially computed sequences, within max_batch_size sequences and max_batched_tokens
 * tokens, so a long prompt never stalls running streams for more than one chunk. The
 * tokens the decodes leave are shared over the sequences that want prefill (running
 * prefills, then waiting ones in admission order): one that needs no more than an even
 * share is served whole, the oldest of the others gets an even share, and the rest goes
 * shortest remaining first, so a short prompt is prefilled in the step it is admitted
 * however long the prompt beside it, a burst of long prompts is prefilled one after
 * another, none starves, and a lone prefill still gets the whole rest. A waiting one whose prefill would span steps is
 * admitted only if the pool holds the rest of its prompt besides what the other
 * spanning prefills still need, so a shared budget does not start more long prefills
 * than the pool can finish. Each sequence is a token list plus how much of it has KV
 * computed; decode is the case of one token left. When the KV pool runs out, the
 * youngest sequence is preempted (its blocks freed, recomputed later), never dropped.
 * Clients (eng_params.client) share the batch: when a client with nothing running waits
 * because the batch (or the pool) is full, the client holding the most running
 * sequences, if more than its fair share (the batch over the active clients), gives up
 * its youngest, at most one per step. n > 1 samples fork the prompt's page table
 * (copy-on-write). Kernels give each token the same arithmetic whatever its batch, so greedy
 * output does not depend on what else runs (batch invariance), on prefix-cache hits or
 * on preemption.
 *
 * The engine is driven by eng_step_begin (build and submit a step; returns at once)
 * and eng_step_end (after the backend finished: sample, stream, retire). It is used
 * from one thread (the loop's). Memory for sequences is carved at eng_new, their samplers'
 * included (one scratch shared by all, a penalty history per sequence slot), so neither
 * a request nor a step allocates (tests/unit/test_alloc.c counts). */
#ifndef KILN_ENGINE_H
#define KILN_ENGINE_H

#include <stdint.h>

#include "core/backend.h"
#include "core/sampler.h"
#include "core/tokenizer.h"
#include "mm/kv.h"

typedef struct {
    int max_batch_size;      /* sequences per step */
    int max_batched_tokens;  /* tokens per step: decodes + prefill chunks */
    int max_seq_len;         /* prompt + output, per sequence */
    int max_seqs;            /* live sequences (all requests, all samples) */
    int max_queued_requests; /* requests waiting or running */
    int max_queued_tokens;   /* prompt tokens of waiting sequences; 0: no limit */
    int prefix_caching;      /* reuse cached full blocks of identical prefixes */
    int fair_batch;          /* while clients (not 0) share the engine, each step holds
                              * at most an even share of sequences and tokens per client */
    int itl_target_ms;       /* under fair_batch, a step some client waits on for a
                              * token (a decode, or a prompt its share takes whole) is
                              * first built balanced (each client's decodes no more than
                              * the fewest any has), then takes more decodes and other
                              * clients' prefill only while its predicted time
                              * (sched/cost.h) stays within this many ms, so a long
                              * prompt or a wide client beside a stream stretch its
                              * inter-token time boundedly (Sarathi-Serve's budget from
                              * a latency target); 0: 2x the predicted balanced step;
                              * negative: no target */
} eng_config;

enum eng_finish { EF_STOP = 0, EF_LENGTH, EF_CANCELLED, EF_ERROR };

typedef struct {
    int prompt_tokens;
    int completion_tokens;
    int cached_tokens;     /* prompt tokens taken from the prefix cache */
    int preemptions;
    double queue_s;        /* arrival to its first step (vLLM's queue time); never
                            * scheduled: all of e2e_s */
    double ttft_s;         /* arrival to first token */
    double e2e_s;          /* arrival to finish */
    int64_t first_step;    /* engine step that produced the first token */
    int max_step_gap;      /* most steps between two consecutive tokens */
} eng_usage;

typedef struct {
    /* token id, its text now safe to show (may be empty: held back for UTF-8 or a
     * possible stop string), and its logprob; token -1 carries only text released
     * at the end */
    void (*on_token)(void *ud, int64_t req, int sample, int32_t token, const char *text,
                     int len, float logprob);
    /* once per sample; reason is enum eng_finish; msg explains EF_ERROR */
    void (*on_finish)(void *ud, int64_t req, int sample, int reason, const eng_usage *u,
                      const char *msg);
} eng_callbacks;

typedef struct {
    const int32_t *prompt; /* copied at submit */
    int n_prompt;
    sampler_params sp;     /* sp.max_tokens bounds the output (capped by max_seq_len) */
    int n;                 /* parallel samples (1..8); sample i uses seed sp.seed + i */
    const char *const *stops; /* stop strings (not emitted) */
    int n_stops;
    void *ud;              /* passed to the callbacks */
    int ignore_eog;        /* benchmarks: generate max_tokens whatever the model says */
    int logprobs;          /* report each token's logprob (a log-softmax over the
                            * vocabulary per token: skipped, and reported as 0, when off) */
    int top_logprobs;      /* 0..SAMPLER_MAX_TOP: also the most likely tokens at each
                            * step, for eng_token_top (needs logprobs) */
    int client;            /* who asked (the server's connection): waiting requests are
                            * admitted fewest-running-client first, and a client with
                            * nothing running that finds the batch or the pool full makes
                            * one holding more than its share (the batch over the clients
                            * with work) give up its youngest sequence (one per step), so
                            * one client with many requests cannot starve the others;
                            * 0 = anyone: FIFO, never preempted for fairness */
    float *first_logits;   /* NULL, or n_vocab floats that get the logits the first token
                            * is sampled from (the prompt's last position: kilnd generate
                            * --dump-logits, compared with a reference) */
} eng_params;

typedef struct engine engine;

typedef struct {
    int64_t steps, preemptions, prompt_tokens, generation_tokens;
    int64_t prefix_queries, prefix_hits; /* tokens looked up / reused */
    int running, waiting;                /* sequences */
    int waiting_tokens;                  /* tokens the waiting sequences must (re)compute */
} eng_stats;

/* The KV pool must have been initialised for this model; the backend runs steps of up
 * to max_batched_tokens tokens and max_batch_size logit rows. NULL with err set. */
engine *eng_new(const eng_config *cfg, const model *m, const tok_t *tok, kv_pool *kv,
                backend *be, const eng_callbacks *cb, char *err, size_t errlen);
void eng_free(engine *e);

/* Queue a request: its id (> 0), or negative with err set: -EINVAL (bad params),
 * -E2BIG (prompt ≥ max_seq_len, or larger than the whole KV pool), -EAGAIN (queue
 * full: max_queued_requests, max_seqs or max_queued_tokens). */
int64_t eng_submit(engine *e, const eng_params *p, char *err, size_t errlen);
/* Inside on_token for a sampled token of a request with top_logprobs: the most likely
 * tokens of that step, most likely first, and their logprobs (pointers valid until the
 * callback returns). Their count; 0 elsewhere. */
int eng_token_top(const engine *e, const int32_t **ids, const float **lps);
/* Cancel: every sample finishes with EF_CANCELLED; blocks are freed now, or when the
 * step in flight that uses them completes. 0 or -ENOENT. */
int eng_cancel(engine *e, int64_t id);

/* Pause (1) or resume (0) a request: a paused request is not scheduled (a slow reader
 * must not make the server buffer its output without bound); it keeps its KV blocks
 * until another sequence needs room: paused sequences are preempted first, whatever
 * their age, and recompute when resumed. 0 or -ENOENT. */
int eng_pause(engine *e, int64_t id, int paused);

/* Build and submit the next step: 1 submitted, 0 nothing to do, negative on error. */
int eng_step_begin(engine *e);
/* The degrade ladder's first rung: at most n sequences per step from now on (1 ..
 * max_batch_size; clamped). Running sequences beyond n, youngest first, are preempted
 * at the next step (their blocks freed, recomputed when they run again): that is what
 * relieves the KV pool. Returns the effective value. */
int eng_set_max_batch(engine *e, int n);
/* The degrade ladder's second rung. While on, each step first turns up to
 * ENG_KV8_PER_STEP full KV blocks to 8 bits, cached ones first (least recently used
 * first), then the written blocks of running sequences but their last
 * ENG_KV8_HOT_BLOCKS, each freeing half its memory (mm/kv.h); a block is born f16 and
 * turned once it is full and cold. Batch invariance is given up while it acts: attention reads
 * the 8-bit values. Does nothing on a pool made without kv8. Returns whether it is on. */
#define ENG_KV8_PER_STEP 64
/* Each sequence's last full blocks that stay f16 ("cold" blocks are the older ones):
 * attention leans on recent tokens, and measured on the parity prompts (test_kv8,
 * BENCHMARKS.md) the window is what keeps 8-bit output close to f16's. */
#define ENG_KV8_HOT_BLOCKS 2
int eng_set_kv8(engine *e, int on);
/* Is rung 2 still at work: switched on and not yet run (a step was in flight), or its
 * last pass found blocks to turn? The ladder waits for it before climbing to shed. */
int eng_kv8_working(const engine *e);
/* After the backend reported completion (poll/wait): sample, stream, retire. */
int eng_step_end(engine *e);
/* True while a step is in flight. */
int eng_busy(const engine *e);
/* Anything left to run (waiting or running sequences, paused ones included)? */
int eng_pending(const engine *e);
/* Run steps until nothing is pending, blocking on the backend (tests, offline use). */
int eng_run_sync(engine *e);

void eng_get_stats(const engine *e, eng_stats *st);

#endif
