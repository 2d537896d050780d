/* engine: request lifecycle, continuous batching, chunked prefill, preemption. */
#include "sched/engine.h"

#include "sched/cost.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ENG_MAX_N 8       /* parallel samples per request */
/* Text scratch: a decoded piece (≤ TOK_STREAM_CAP), then what the stop-string matcher
 * releases from it (≤ the piece + its held-back bytes), then a flush. */
#define ENG_TEXT_CAP(tok) (2 * TOK_STREAM_CAP(tok) + 4 * STOPPER_MAX_LEN)

enum { SQ_FREE = 0, SQ_WAIT, SQ_RUN, SQ_PARKED };

typedef struct eng_req eng_req;

/* One sequence: a token list (prompt, then what it generated) of which the first
 * n_computed positions have K/V in its page table. */
typedef struct {
    eng_req *req;
    int sample;
    int state;          /* SQ_* */
    kv_seq *kv;         /* NULL unless running */
    int32_t *toks;      /* [max_seq_len] */
    int n_toks, n_computed, n_gen, max_gen;
    sampler smp;
    int smp_ok;
    stopper st;
    tok_stream ts;
    uint64_t order;     /* admission order of the request: youngest = largest */
    int in_step;        /* tokens of this sequence in the step in flight */
    int logit_row;      /* its row of logits in that step, or -1 */
    int64_t last_step;  /* step of its previous token */
    int seen_cache;     /* cached_tokens recorded (first admission only) */
    eng_usage usage;
} eng_seq;

struct eng_req {
    int64_t id;
    int n, n_live, forked, cancelled, ignore_eog, logprobs, top_logprobs;
    int paused;          /* eng_pause: not scheduled; keeps its blocks unless preempted */
    int client;          /* eng_params.client */
    eng_seq *seqs[ENG_MAX_N];
    void *ud;
    float *first_logits; /* eng_params.first_logits */
    double t_arrival;
};

struct engine {
    eng_config cfg;
    /* the step's most likely tokens of the sequence being advanced (eng_token_top) */
    int32_t top_id[SAMPLER_MAX_TOP];
    float top_lp[SAMPLER_MAX_TOP];
    int n_top;
    const model *m;
    const tok_t *tok;
    kv_pool *kv;
    backend *be;
    eng_callbacks cb;
    eng_seq *seqs;          /* [max_seqs] */
    int32_t *tok_slab;      /* [max_seqs][max_seq_len] */
    eng_req *reqs;          /* [max_queued_requests] */
    int64_t next_id;
    uint64_t next_order;
    int64_t step;
    int busy;
    int max_batch;          /* effective: eng_set_max_batch (the ladder), else the config's */
    int kv8;                /* eng_set_kv8: turn full blocks to 8 bits before each step */
    int kv8_last;           /* blocks the last such pass turned */
    int kv8_fresh;          /* switched on, no pass run since */
    /* the step in flight */
    int32_t *b_tokens, *b_pos; /* [max_batched_tokens] */
    kv_seq **b_seq;            /* [max_batched_tokens] */
    int32_t *b_rows;           /* [max_batch_size] */
    eng_seq **b_members;       /* [max_batch_size] sequences in the step */
    eng_seq **cand;            /* [max_seqs] scratch for ordering */
    int *cand_load;            /* [max_seqs] scratch: each candidate's client load */
    eng_seq **plan;            /* [max_batch_size] scratch: this step's prefill candidates */
    int *plan_need, *plan_share; /* [max_batch_size] their tokens left / granted */
    int fair_kv;               /* the last admission stopped, for want of KV blocks, at a
                                * client with nothing running (fair_preempt's cue) */
    int share_seqs, share_toks; /* this step's bound per client (fair_batch); 0: none */
    cost_model cost;           /* what steps cost (itl_target_ms) */
    int itl_cap;               /* this step's prefills are cut for a client waiting on it */
    int itl_client;            /* that client, or -1: several (itl_plan) */
    double itl_ms;             /* what the cut prefills may still add to the step (ms) */
    double t_submit;           /* when the step in flight was submitted (s) */
    int b_n_tok, b_n_seq, b_n_logit;
    model_batch batch;
    float *scratch;            /* [n_vocab] logits the sampler may modify */
    sampler_scratch smp_scratch; /* every sampler's: they sample on this thread, in turn */
    sampler_hist *smp_hist;    /* [max_seqs] sequence slot i's penalty history, max_seq_len tokens */
    char *text;                /* [TOK_STREAM_CAP] */
    eng_stats stats;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------ setup */

engine *eng_new(const eng_config *cfg, const model *m, const tok_t *tok, kv_pool *kv,
                backend *be, const eng_callbacks *cb, char *err, size_t errlen) {
    if (cfg->max_batch_size < 1 || cfg->max_batched_tokens < cfg->max_batch_size ||
        kv->cfg.max_seqs < cfg->max_seqs ||
        cfg->max_seq_len < 2 || cfg->max_seqs < 1 || cfg->max_queued_requests < 1) {
        snprintf(err, errlen, "engine: invalid limits (batch %d, tokens %d, seq_len %d, seqs %d)",
                 cfg->max_batch_size, cfg->max_batched_tokens, cfg->max_seq_len, cfg->max_seqs);
        return NULL;
    }
    engine *e = calloc(1, sizeof *e);
    if (!e) goto oom;
    e->cfg = *cfg, e->m = m, e->tok = tok, e->kv = kv, e->be = be, e->cb = *cb;
    e->max_batch = cfg->max_batch_size;
    e->next_id = 1;
    cost_init(&e->cost);
    size_t ms = (size_t)cfg->max_seqs, bt = (size_t)cfg->max_batched_tokens;
    e->seqs = calloc(ms, sizeof *e->seqs);
    e->tok_slab = malloc(ms * (size_t)cfg->max_seq_len * sizeof(int32_t));
    e->reqs = calloc((size_t)cfg->max_queued_requests, sizeof *e->reqs);
    e->b_tokens = malloc(bt * sizeof(int32_t));
    e->b_pos = malloc(bt * sizeof(int32_t));
    e->b_seq = malloc(bt * sizeof(kv_seq *));
    e->b_rows = malloc((size_t)cfg->max_batch_size * sizeof(int32_t));
    e->b_members = malloc((size_t)cfg->max_batch_size * sizeof(eng_seq *));
    e->cand = malloc(ms * sizeof(eng_seq *));
    e->cand_load = malloc(ms * sizeof(int));
    e->plan = malloc((size_t)cfg->max_batch_size * sizeof(eng_seq *));
    e->plan_need = malloc((size_t)cfg->max_batch_size * sizeof(int));
    e->plan_share = malloc((size_t)cfg->max_batch_size * sizeof(int));
    e->scratch = malloc((size_t)m->cfg.n_vocab * sizeof(float));
    e->text = malloc((size_t)ENG_TEXT_CAP(tok));
    e->smp_hist = calloc(ms, sizeof *e->smp_hist);
    if (!e->seqs || !e->tok_slab || !e->reqs || !e->b_tokens || !e->b_pos || !e->b_seq ||
        !e->b_rows || !e->b_members || !e->cand || !e->cand_load || !e->plan || !e->plan_need ||
        !e->plan_share || !e->scratch || !e->text ||
        !e->smp_hist || sampler_scratch_init(&e->smp_scratch, m->cfg.n_vocab) < 0)
        goto oom;
    /* Samplers allocate nothing per request: each slot has its history for a whole
     * sequence (ring and generated tokens are at most max_seq_len) */
    for (size_t i = 0; i < ms; i++)
        if (sampler_hist_init(&e->smp_hist[i], cfg->max_seq_len) < 0) goto oom;
    for (size_t i = 0; i < ms; i++) e->seqs[i].toks = e->tok_slab + i * (size_t)cfg->max_seq_len;
    return e;
oom:
    snprintf(err, errlen, "engine: out of memory for %d sequences of %d tokens", cfg->max_seqs,
             cfg->max_seq_len);
    eng_free(e);
    return NULL;
}

void eng_free(engine *e) {
    if (!e) return;
    if (e->busy) e->be->ops->wait(e->be);
    for (int i = 0; e->seqs && i < e->cfg.max_seqs; i++) {
        eng_seq *s = &e->seqs[i];
        if (s->kv) kv_seq_release(e->kv, s->kv);
        if (s->smp_ok) sampler_free(&s->smp);
    }
    for (int i = 0; e->smp_hist && i < e->cfg.max_seqs; i++) sampler_hist_free(&e->smp_hist[i]);
    sampler_scratch_free(&e->smp_scratch);
    free(e->smp_hist);
    free(e->seqs), free(e->tok_slab), free(e->reqs), free(e->b_tokens), free(e->b_pos);
    free(e->b_seq), free(e->b_rows), free(e->b_members), free(e->cand), free(e->cand_load), free(e->scratch), free(e->text);
    free(e->plan), free(e->plan_need), free(e->plan_share);
    free(e);
}

/* ------------------------------------------------------------------ submit / cancel */

static eng_seq *seq_slot(engine *e) {
    for (int i = 0; i < e->cfg.max_seqs; i++)
        if (e->seqs[i].state == SQ_FREE) return &e->seqs[i];
    return NULL;
}

static int free_seq_slots(const engine *e) {
    int n = 0;
    for (int i = 0; i < e->cfg.max_seqs; i++) n += e->seqs[i].state == SQ_FREE;
    return n;
}

/* Tokens still to compute for waiting sequences (each request's prompt counted once). */
static int queued_tokens(const engine *e) {
    int n = 0;
    for (int i = 0; i < e->cfg.max_seqs; i++) {
        const eng_seq *s = &e->seqs[i];
        if (s->state == SQ_WAIT) n += s->n_toks - s->n_computed;
    }
    return n;
}

/* Tokens one sequence can hold: the pool's f16 blocks, or about twice that with kv8 (a
 * sequence that outgrows the f16 pool alone is compacted: make_room). */
static int seq_room(const engine *e) {
    long long n = kv_seq_max_blocks(e->kv->cfg.n_blocks, e->kv->cfg.kv8) * e->kv->cfg.block_size;
    return n > INT_MAX ? INT_MAX : n < 0 ? 0 : (int)n;
}

static int check_params(const engine *e, const eng_params *p, char *err, size_t errlen) {
    int pool_tokens = seq_room(e);
    if (!p->prompt || p->n_prompt < 1) {
        snprintf(err, errlen, "the prompt is empty");
        return -EINVAL;
    }
    if (p->n < 1 || p->n > ENG_MAX_N) {
        snprintf(err, errlen, "n = %d: must be 1..%d", p->n, ENG_MAX_N);
        return -EINVAL;
    }
    if (p->top_logprobs < 0 || p->top_logprobs > SAMPLER_MAX_TOP) {
        snprintf(err, errlen, "top_logprobs = %d: must be 0..%d", p->top_logprobs, SAMPLER_MAX_TOP);
        return -EINVAL;
    }
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= e->m->cfg.n_vocab) {
            snprintf(err, errlen, "prompt token %d is out of range", p->prompt[i]);
            return -EINVAL;
        }
    if (p->n_prompt >= e->cfg.max_seq_len) {
        snprintf(err, errlen, "prompt of %d tokens exceeds max_seq_len %d (prompt + output)",
                 p->n_prompt, e->cfg.max_seq_len);
        return -E2BIG;
    }
    if (p->n_prompt + 1 > pool_tokens) {
        snprintf(err, errlen, "prompt of %d tokens does not fit the KV pool (%d tokens)",
                 p->n_prompt, pool_tokens);
        return -E2BIG;
    }
    return 0;
}

/* The output budget: max_tokens, the sequence limit, and what the whole pool holds. */
static int output_budget(const engine *e, const eng_params *p) {
    int pool_tokens = seq_room(e);
    int lim = e->cfg.max_seq_len < pool_tokens ? e->cfg.max_seq_len : pool_tokens;
    int room = lim - p->n_prompt;
    return p->sp.max_tokens > 0 && p->sp.max_tokens < room ? p->sp.max_tokens : room;
}

static int init_seq(engine *e, eng_seq *s, eng_req *r, int sample, const eng_params *p) {
    int32_t *toks = s->toks; /* the slab row survives the reset */
    memset(s, 0, sizeof *s);
    s->toks = toks;
    s->req = r, s->sample = sample;
    s->n_toks = p->n_prompt;
    memcpy(s->toks, p->prompt, (size_t)p->n_prompt * sizeof(int32_t));
    s->max_gen = output_budget(e, p);
    sampler_params sp = p->sp;
    sp.max_tokens = 0; /* the engine counts the output itself */
    if (sp.seed) sp.seed += (uint64_t)sample;
    if (sampler_init_with(&s->smp, &sp, e->m->cfg.n_vocab, &e->smp_scratch, &e->smp_hist[s - e->seqs]) < 0)
        return -EINVAL;
    s->smp_ok = 1;
    for (int i = 0; i < p->n_prompt; i++) sampler_accept(&s->smp, p->prompt[i], 1);
    if (stopper_init(&s->st, p->stops, p->n_stops) < 0) return -EINVAL;
    tok_stream_init(&s->ts, e->tok, 0);
    s->order = e->next_order;
    s->logit_row = -1;
    s->usage.prompt_tokens = p->n_prompt;
    s->usage.first_step = -1;
    s->usage.queue_s = -1;
    s->state = sample == 0 ? SQ_WAIT : SQ_PARKED; /* samples > 0 wait for the fork */
    return 0;
}

static void release_seq(engine *e, eng_seq *s) {
    if (s->kv) kv_seq_release(e->kv, s->kv);
    if (s->smp_ok) sampler_free(&s->smp);
    int32_t *toks = s->toks;
    memset(s, 0, sizeof *s);
    s->toks = toks;
}

int64_t eng_submit(engine *e, const eng_params *p, char *err, size_t errlen) {
    int rc = check_params(e, p, err, errlen);
    if (rc < 0) return rc;
    eng_req *r = NULL;
    for (int i = 0; i < e->cfg.max_queued_requests && !r; i++)
        if (!e->reqs[i].id) r = &e->reqs[i];
    if (!r || free_seq_slots(e) < p->n) {
        snprintf(err, errlen, "the engine is full (%d requests, %d sequences)",
                 e->cfg.max_queued_requests, e->cfg.max_seqs);
        return -EAGAIN;
    }
    int queued = queued_tokens(e);
    if (e->cfg.max_queued_tokens > 0 && queued + p->n_prompt > e->cfg.max_queued_tokens) {
        snprintf(err, errlen, "the queue holds %d prompt tokens; %d more exceed max_queued_tokens %d",
                 queued, p->n_prompt, e->cfg.max_queued_tokens);
        return -EAGAIN;
    }
    memset(r, 0, sizeof *r);
    r->id = e->next_id++, r->n = p->n, r->ud = p->ud, r->t_arrival = now_s();
    r->ignore_eog = p->ignore_eog;
    r->logprobs = p->logprobs, r->top_logprobs = p->logprobs ? p->top_logprobs : 0;
    r->first_logits = p->first_logits;
    r->client = p->client;
    e->next_order++;
    for (int i = 0; i < p->n; i++) {
        eng_seq *s = seq_slot(e);
        r->seqs[i] = s;
        s->state = SQ_PARKED; /* claim the slot before the next seq_slot() */
        if (init_seq(e, s, r, i, p) < 0) {
            for (int j = 0; j <= i; j++) release_seq(e, r->seqs[j]);
            memset(r, 0, sizeof *r);
            snprintf(err, errlen, "invalid sampling parameters or stop strings");
            return -EINVAL;
        }
    }
    r->n_live = p->n;
    e->stats.prompt_tokens += p->n_prompt;
    return r->id;
}

static eng_req *find_req(engine *e, int64_t id) {
    for (int i = 0; i < e->cfg.max_queued_requests; i++)
        if (e->reqs[i].id == id) return &e->reqs[i];
    return NULL;
}

/* ------------------------------------------------------------------ finishing */

static void emit(engine *e, eng_seq *s, int32_t tok, const char *text, int len, float lp) {
    if (e->cb.on_token) e->cb.on_token(s->req->ud, s->req->id, s->sample, tok, text, len, lp);
}

int eng_token_top(const engine *e, const int32_t **ids, const float **lps) {
    if (ids) *ids = e->top_id;
    if (lps) *lps = e->top_lp;
    return e->n_top;
}

static void finish_seq(engine *e, eng_seq *s, int reason, const char *msg) {
    eng_req *r = s->req;
    if (s->sample == 0 && !r->forked) /* samples waiting for a fork that will not come */
        for (int i = 1; i < r->n; i++)
            if (r->seqs[i] && r->seqs[i]->state == SQ_PARKED) finish_seq(e, r->seqs[i], reason, msg);
    if (reason != EF_CANCELLED && reason != EF_ERROR) { /* let held-back text out */
        int k = tok_stream_flush(&s->ts, e->text, TOK_STREAM_CAP(e->tok));
        int stopped = 0;
        if (k < 0) k = 0;
        size_t cap = (size_t)ENG_TEXT_CAP(e->tok) - (size_t)k;
        size_t n = k > 0 ? stopper_feed(&s->st, e->text, (size_t)k, e->text + k, cap, &stopped) : 0;
        if (!stopped) n += stopper_flush(&s->st, e->text + k + n, cap - n);
        if (n > 0) emit(e, s, -1, e->text + k, (int)n, 0.0f);
    }
    if (s->kv && e->cfg.prefix_caching) kv_seq_commit(e->kv, s->kv, s->toks, s->n_computed);
    s->usage.completion_tokens = s->n_gen;
    s->usage.e2e_s = now_s() - r->t_arrival;
    if (s->usage.queue_s < 0) s->usage.queue_s = s->usage.e2e_s;
    eng_usage u = s->usage;
    int sample = s->sample;
    release_seq(e, s);
    r->seqs[sample] = NULL;
    if (e->cb.on_finish) e->cb.on_finish(r->ud, r->id, sample, reason, &u, msg);
    if (--r->n_live == 0) memset(r, 0, sizeof *r);
}

int eng_cancel(engine *e, int64_t id) {
    eng_req *r = find_req(e, id);
    if (!r) return -ENOENT;
    r->cancelled = 1;
    for (int i = 0; i < r->n && r->id == id; i++) {
        eng_seq *s = r->seqs[i];
        if (s && !s->in_step) finish_seq(e, s, EF_CANCELLED, "cancelled");
    }
    return 0; /* sequences in the step in flight finish when it completes */
}

int eng_pause(engine *e, int64_t id, int paused) {
    eng_req *r = find_req(e, id);
    if (!r) return -ENOENT;
    r->paused = paused != 0;
    return 0;
}

/* ------------------------------------------------------------------ building a step */

/* Live sequences of a state, oldest request first (insertion sort: tens of entries). */
static int collect(engine *e, int state, eng_seq **out) {
    int n = 0;
    for (int i = 0; i < e->cfg.max_seqs; i++) {
        eng_seq *s = &e->seqs[i];
        if (s->state != state) continue;
        int j = n++;
        while (j > 0 && (out[j - 1]->order > s->order ||
                         (out[j - 1]->order == s->order && out[j - 1]->sample > s->sample))) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = s;
    }
    return n;
}

static void preempt(engine *e, eng_seq *s) {
    kv_seq_release(e->kv, s->kv);
    s->kv = NULL;
    s->n_computed = 0;
    s->state = SQ_WAIT;
    s->usage.preemptions++;
    e->stats.preemptions++;
}

/* The running sequence to preempt, not in the step being built, or NULL: a paused one
 * first (its client is not reading; it must not hold memory others could run in),
 * else the youngest. */
static eng_seq *victim(engine *e) {
    eng_seq *v = NULL;
    for (int i = 0; i < e->cfg.max_seqs; i++) {
        eng_seq *s = &e->seqs[i];
        if (s->state != SQ_RUN || s->in_step) continue;
        if (v && v->req->paused != s->req->paused) {
            if (s->req->paused) v = s;
            continue;
        }
        if (!v || s->order > v->order || (s->order == v->order && s->sample > v->sample)) v = s;
    }
    return v;
}

enum { ROOM_NO_PREEMPT, ROOM_PREEMPT, ROOM_PREEMPT_PAUSED };

/* Capacity for positions [0, upto) and a private block at n_computed (forks share
 * their last partial block). ROOM_PREEMPT may preempt paused or younger sequences, or
 * s itself when it is the youngest (then returns -1 and s is waiting again);
 * ROOM_PREEMPT_PAUSED (admission) only paused ones. */
static int make_room(engine *e, eng_seq *s, int upto, int may_preempt) {
    for (;;) {
        int r = kv_seq_reserve(e->kv, s->kv, upto);
        if (r == 0) r = kv_seq_cow(e->kv, s->kv, s->n_computed);
        if (r == 0) return 0;
        if (r != -ENOMEM || may_preempt == ROOM_NO_PREEMPT) return -1;
        eng_seq *v = victim(e);
        /* longer than the whole pool holds in f16 (kv8 pools allow it, mm/kv.h
         * kv_seq_max_blocks): its own written blocks to 8 bits, with or without the
         * ladder, rather than recompute it forever */
        int bs = e->kv->cfg.block_size;
        if ((upto + bs - 1) / bs > e->kv->cfg.n_blocks &&
            kv_seq_to_q8(e->kv, s->kv, s->n_computed, INT_MAX) > 0)
            continue;
        if (may_preempt == ROOM_PREEMPT_PAUSED) {
            if (!v || v == s || !v->req->paused) return -1;
            preempt(e, v);
            continue;
        }
        if (!v || v == s || (!v->req->paused && (v->order < s->order ||
                                                 (v->order == s->order && v->sample < s->sample)))) {
            if (s->state == SQ_RUN) preempt(e, s); /* s is the youngest: it yields */
            return -1;
        }
        preempt(e, v);
    }
}

/* A sequence longer than the pool holds in f16 (kv8) prefills in chunks that fit: its
 * written blocks go to 8 bits first, then the chunk is cut to the room left, so it never
 * asks for more than the pool can give and recomputes forever. */
static int fit_chunk(engine *e, eng_seq *s, int chunk) {
    int bs = e->kv->cfg.block_size;
    if (!e->kv->cfg.kv8 || (s->n_toks + bs - 1) / bs <= e->kv->cfg.n_blocks) return chunk;
    kv_seq_to_q8(e->kv, s->kv, s->n_computed, INT_MAX);
    long long room = (long long)s->kv->n_blocks * bs - s->n_computed +
                     (long long)kv_free_blocks(e->kv) * bs;
    return chunk < room ? chunk : room > 1 ? (int)room : 1;
}

static void add_to_step(engine *e, eng_seq *s, int n, int want_logits) {
    for (int i = 0; i < n; i++) {
        int t = e->b_n_tok++;
        e->b_tokens[t] = s->toks[s->n_computed + i];
        e->b_pos[t] = s->n_computed + i;
        e->b_seq[t] = s->kv;
    }
    s->in_step = n;
    s->logit_row = -1;
    if (s->usage.queue_s < 0) s->usage.queue_s = now_s() - s->req->t_arrival;
    if (want_logits) {
        s->logit_row = e->b_n_logit;
        e->b_rows[e->b_n_logit++] = e->b_n_tok - 1;
    }
    e->b_members[e->b_n_seq++] = s;
}

/* Admit a waiting sequence: a page table, the cached prefix if any. */
static int admit(engine *e, eng_seq *s) {
    s->kv = kv_seq_new(e->kv);
    if (!s->kv) return -1;
    s->n_computed = 0;
    if (e->cfg.prefix_caching) {
        int hit = kv_seq_match(e->kv, s->kv, s->toks, s->n_toks);
        if (hit > 0) s->n_computed = hit;
        if (!s->seen_cache) s->usage.cached_tokens = hit > 0 ? hit : 0;
        e->stats.prefix_queries += s->n_toks;
        e->stats.prefix_hits += hit > 0 ? hit : 0;
    }
    s->seen_cache = 1;
    s->state = SQ_RUN;
    return 0;
}

int eng_set_max_batch(engine *e, int n) {
    e->max_batch = n < 1 ? 1 : n > e->cfg.max_batch_size ? e->cfg.max_batch_size : n;
    return e->max_batch;
}

int eng_set_kv8(engine *e, int on) {
    int was = e->kv8;
    e->kv8 = on && e->kv->cfg.kv8;
    if (e->kv8 && !was) e->kv8_fresh = 1, e->kv8_last = 0;
    return e->kv8;
}

/* Rung 2's work, between steps (no step reads the pool): cached blocks first, as no
 * request is using them, then the running sequences' full, written, cold blocks. */
static void kv8_pass(engine *e) {
    int left = ENG_KV8_PER_STEP - kv_cached_to_q8(e->kv, ENG_KV8_PER_STEP);
    for (int i = 0; i < e->cfg.max_seqs && left > 0; i++) {
        eng_seq *s = &e->seqs[i];
        int cold = s->n_computed - ENG_KV8_HOT_BLOCKS * e->kv->cfg.block_size;
        if (s->state == SQ_RUN && s->kv && cold > 0) left -= kv_seq_to_q8(e->kv, s->kv, cold, left);
    }
    e->kv8_last = ENG_KV8_PER_STEP - left;
    e->kv8_fresh = 0;
}

/* A step in flight when rung 2 came on (a long prefill) has not let it act yet; an idle
 * engine runs no pass, so there is nothing to wait for. */
int eng_kv8_working(const engine *e) {
    return e->kv8 && (e->kv8_fresh ? e->busy : e->kv8_last > 0);
}

/* Running sequences beyond the effective batch give their blocks back, youngest first. */
static void shrink_running(engine *e) {
    int running = 0;
    for (int i = 0; i < e->cfg.max_seqs; i++) running += e->seqs[i].state == SQ_RUN;
    for (eng_seq *v; running > e->max_batch && (v = victim(e)); running--) preempt(e, v);
}

/* Whether s counts as work of its client: running or waiting, and with `unpaused`, not
 * paused (a slow reader's request asks nothing of the next step). */
static int at_work(const eng_seq *s, int unpaused) {
    return (s->state == SQ_RUN || s->state == SQ_WAIT) && s->req->client && !(unpaused && s->req->paused);
}

/* Distinct clients (not 0) with running or waiting sequences (unpaused ones only, with
 * `unpaused`). */
static int active_clients(const engine *e, int unpaused) {
    int n = 0;
    for (int i = 0; i < e->cfg.max_seqs; i++) {
        const eng_seq *s = &e->seqs[i];
        if (!at_work(s, unpaused)) continue;
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = at_work(&e->seqs[j], unpaused) && e->seqs[j].req->client == s->req->client;
        n += !seen;
    }
    return n;
}

/* fair_batch: while two or more clients have work, one step gives each at most the batch
 * and the token budget over their number. A client that filled the batch alone would
 * otherwise make every step of a newcomer's request cost a full batch: its 8 tokens took
 * 4x their time on an idle box, however soon it was admitted. The sequences over the
 * share keep their blocks and sit the step out (the longest-waiting go first: by_wait),
 * so the tokens unused by a light client are left unused: a step the size of the light
 * client's need is the point. */
static void step_shares(engine *e) {
    int n = e->cfg.fair_batch ? active_clients(e, 1) : 0;
    e->share_seqs = e->share_toks = 0;
    if (n < 2) return;
    e->share_seqs = e->max_batch / n > 1 ? e->max_batch / n : 1;
    e->share_toks = e->cfg.max_batched_tokens / n > 1 ? e->cfg.max_batched_tokens / n : 1;
}

/* Sequences and tokens of `client` in the step so far and in the first np planned
 * prefills (their needs as capped by prefill_candidates). */
static void client_step_use(const engine *e, int client, int np, int *seqs, int *toks) {
    *seqs = *toks = 0;
    for (int i = 0; i < e->b_n_seq; i++)
        if (e->b_members[i]->req->client == client) ++*seqs, *toks += e->b_members[i]->in_step;
    for (int i = 0; i < np; i++)
        if (e->plan[i]->req->client == client) ++*seqs, *toks += e->plan_need[i];
}

/* Tokens s may still have in this step under its client's share (planned prefills
 * 0..np-1 counted), at most `want`; `want` when no share applies, 0 when the share is
 * spent. */
static int share_room(const engine *e, const eng_seq *s, int np, int want) {
    if (!e->share_seqs || !s->req->client) return want;
    int seqs, toks;
    client_step_use(e, s->req->client, np, &seqs, &toks);
    if (seqs >= e->share_seqs || toks >= e->share_toks) return 0;
    return want < e->share_toks - toks ? want : e->share_toks - toks;
}

/* c in the order the running decodes are served under a share: the longest since its
 * last token first (ties: the given age order), so a client's sequences over its share
 * take turns instead of the youngest waiting for the others to end. */
static void by_wait(eng_seq **c, int n) {
    for (int i = 1; i < n; i++) {
        eng_seq *s = c[i];
        int j = i;
        for (; j > 0 && c[j - 1]->last_step > s->last_step; j--) c[j] = c[j - 1];
        c[j] = s;
    }
}

/* Running sequences of s's client (its share of the batch so far). */
static int client_load(const engine *e, const eng_seq *s) {
    int n = 0;
    if (!s->req->client) return 0;
    for (int i = 0; i < e->cfg.max_seqs; i++)
        n += e->seqs[i].state == SQ_RUN && e->seqs[i].req->client == s->req->client;
    return n;
}

/* The next waiting sequence to admit: its client has the fewest running sequences
 * (those admitted in this step included), then the oldest. c is in age order, load[i]
 * is c[i]'s client load and taken entries are NULL. -1 when none is left. With every
 * client 0 this is plain first come, first served. */
static int pick_fair(eng_seq **c, const int *load, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (c[i] && !c[i]->req->paused && (best < 0 || load[i] < load[best])) best = i;
    return best;
}

/* s of client `client` was admitted: every waiting sequence of that client now counts
 * one more running. */
static void add_load(eng_seq **c, int *load, int n, int client) {
    if (!client) return;
    for (int i = 0; i < n; i++)
        if (c[i] && c[i]->req->client == client) load[i]++;
}

/* Tokens granted if every candidate gets at most `level`. */
static long long filled(const int *need, int n, int level) {
    long long t = 0;
    for (int i = 0; i < n; i++) t += need[i] < level ? need[i] : level;
    return t;
}

/* The prefill budget over the candidates (in plan order: running prefills oldest
 * first, then waiting ones in admission order). L is the level an even split would give
 * (the largest whose water-filled total fits the budget). A candidate that needs no
 * more than L is served whole, so a short prompt never waits behind a long one; the
 * oldest of the others gets L, so none starves; the rest goes shortest remaining first
 * (ties: oldest), so a prompt a little over L (a small budget) still finishes soon, and
 * a burst of equal long prompts prefills one after another, not all together with
 * every first token at the end. A lone candidate gets min(need, budget); some may get 0. */
static void share_prefill(const int *need, int *share, int n, int budget) {
    int lo = 0, hi = 0, oldest = -1;
    for (int i = 0; i < n; i++) hi = need[i] > hi ? need[i] : hi;
    while (lo < hi) { /* the level is found by bisection: n is tens, needs ≤ max_seq_len */
        int mid = lo + (hi - lo + 1) / 2;
        if (filled(need, n, mid) <= budget) lo = mid;
        else hi = mid - 1;
    }
    long long left = budget; /* the short ones and the oldest's L fit: filled(lo) */
    for (int i = 0; i < n; i++) {
        share[i] = need[i] <= lo ? need[i] : 0;
        if (need[i] > lo && oldest < 0) share[i] = lo, oldest = i;
        left -= share[i];
    }
    while (left > 0) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (share[i] < need[i] && (best < 0 || need[i] - share[i] < need[best] - share[best])) best = i;
        if (best < 0) break;
        int more = need[best] - share[best] < left ? need[best] - share[best] : (int)left;
        share[best] += more, left -= more;
    }
}

/* The positions of the step's tokens, summed: the keys its attention reads. */
static double step_positions(const engine *e) {
    double pos = 0;
    for (int t = 0; t < e->b_n_tok; t++) pos += e->b_pos[t];
    return pos;
}

/* A client waiting on this step for a token: one of its sequences decodes in it, or a
 * prompt of its own that its share takes whole waits (its first token); what a waiting
 * prompt needs is counted after the prefix cache, as admission will find it, for at
 * most *peeks more of them (the hashing is bounded per step). */
#define ITL_PEEKS 8
static int wants_token(const engine *e, const eng_seq *s, int *peeks) {
    if (s->state == SQ_RUN && s->in_step == 1 && s->n_toks - s->n_computed == 1) return 1;
    if (!(s->state == SQ_WAIT || (s->state == SQ_RUN && !s->in_step)) || s->req->paused) return 0;
    int need = s->n_toks - s->n_computed;
    if (need > e->share_toks && s->state == SQ_WAIT && e->cfg.prefix_caching && *peeks > 0)
        --*peeks, need -= kv_prefix_hits(e->kv, s->toks, s->n_toks);
    return need <= e->share_toks;
}

/* itl_target_ms: under a share, once the step holds its decodes, the prefills of clients
 * other than those waiting on the step for a token (wants_token) may add to it the
 * target (or ITL_FACTOR x the predicted step so far) less the predicted step so far.
 * e->itl_client is the one client waiting, or -1 when several are (every prefill is then
 * another's); nothing is cut when none waits, under no share, or before the cost model
 * has seen enough steps. */
#define ITL_FACTOR 2
static void itl_plan(engine *e) {
    e->itl_cap = 0;
    if (!e->share_seqs || e->cfg.itl_target_ms < 0 || !cost_ready(&e->cost)) return;
    int who = -2, peeks = ITL_PEEKS; /* no one yet */
    for (int i = 0; i < e->cfg.max_seqs && who != -1; i++) {
        const eng_seq *s = &e->seqs[i];
        if (s->state == SQ_FREE || !wants_token(e, s, &peeks)) continue;
        who = who == -2 || who == s->req->client ? s->req->client : -1;
    }
    if (who == -2) return;
    e->itl_cap = 1, e->itl_client = who;
    /* a step of the decodes alone, or the least step (one token) when there are none */
    double base = e->b_n_tok ? cost_decodes(&e->cost, e->b_n_tok, step_positions(e))
                             : cost_decodes(&e->cost, 1, 0);
    e->itl_ms = (e->cfg.itl_target_ms > 0 ? e->cfg.itl_target_ms : ITL_FACTOR * base) - base;
}

/* Sequences of `client` in the step so far. */
static int client_in_step(const engine *e, int client) {
    int k = 0;
    for (int i = 0; i < e->b_n_seq; i++) k += e->b_members[i]->req->client == client;
    return k;
}

/* The balanced step under a latency target: each client (0 aside) with decodes ready
 * among c[0..n) puts in at most as many as the one with the fewest (within its share),
 * so the step every one of them waits on is first one where none outweighs another;
 * itl_plan's target is taken from it, and the rest of each client's decodes go in only
 * within it (itl_fits). With two or more such clients, the fewest; else no limit. A box
 * of equal clients loses nothing; a client with 32 streams beside one with 1 no longer
 * makes that one's every step cost 16 of its own. */
static int balanced_decodes(const engine *e, eng_seq **c, int n) {
    if (!e->share_seqs || e->cfg.itl_target_ms < 0 || !cost_ready(&e->cost)) return INT_MAX;
    int least = INT_MAX, clients = 0;
    for (int i = 0; i < n; i++) {
        const eng_seq *s = c[i];
        if (!s->req->client || s->req->paused || s->n_toks - s->n_computed != 1) continue;
        int seen = 0, k = 0;
        for (int j = 0; j < n; j++) {
            const eng_seq *o = c[j];
            if (o->req->client != s->req->client || o->req->paused || o->n_toks - o->n_computed != 1)
                continue;
            seen |= j < i;
            k++;
        }
        if (seen) continue; /* its client was counted at its first sequence */
        clients++;
        k = k < e->share_seqs ? k : e->share_seqs;
        least = k < least ? k : least;
    }
    return clients >= 2 ? least : INT_MAX;
}

/* One more decode past the balanced step: 1 when the latency target still has room
 * for it (charged), or when no target applies. */
static int itl_fits(engine *e, const eng_seq *s) {
    if (!e->itl_cap) return 1;
    double more = cost_tokens(&e->cost, s->n_computed, 1);
    if (more > e->itl_ms) return 0;
    e->itl_ms -= more;
    return 1;
}

/* The most of `want` prefill tokens s may have in this step (planned prefills 0..np-1
 * counted): all of them unless itl_plan cuts the prefills of clients other than the
 * waiting one; then what the target still leaves (charged to it), but for the client's
 * first tokens in the step at least an eighth of its share, so its prompts advance
 * whatever the others do. A client with nothing running is not cut: its first request
 * is what fairness is for (a newcomer beside a full batch). */
static int itl_room(engine *e, const eng_seq *s, int np, int want) {
    if (!e->itl_cap || !s->req->client || want <= 0 ||
        (e->itl_client != -1 && e->itl_client == s->req->client) || client_load(e, s) == 0)
        return want;
    int seqs, toks, k = cost_chunk(&e->cost, s->n_computed, want, e->itl_ms);
    client_step_use(e, s->req->client, np, &seqs, &toks);
    int least = toks > 0 ? 0 : e->share_toks / 8 > 1 ? e->share_toks / 8 : 1;
    if (k < least) k = least < want ? least : want;
    e->itl_ms -= cost_tokens(&e->cost, s->n_computed, k);
    return k;
}

/* This step's prefill candidates into e->plan (tokens left in e->plan_need): the running
 * prefills, oldest first, then the waiting sequences in admission order (fewest-running
 * client, then oldest), at most `slots` and no more than `tokens` (one token each at
 * least). Returns the count; *n_run of them are running. */
static int prefill_candidates(engine *e, int slots, int tokens, int *n_run) {
    eng_seq **c = e->cand;
    int np = 0, n = collect(e, SQ_RUN, c);
    if (slots > tokens) slots = tokens;
    for (int i = 0; i < n && np < slots; i++) {
        eng_seq *s = c[i];
        int left = s->n_toks - s->n_computed;
        if (s->req->paused || s->in_step || left <= 1) continue;
        if ((left = itl_room(e, s, np, share_room(e, s, np, left))) > 0)
            e->plan[np] = s, e->plan_need[np++] = left;
    }
    *n_run = np;
    n = collect(e, SQ_WAIT, c);
    int *load = e->cand_load;
    for (int i = 0; i < n; i++) load[i] = client_load(e, c[i]);
    for (int i; np < slots && (i = pick_fair(c, load, n)) >= 0;) {
        eng_seq *s = c[i];
        c[i] = NULL;
        /* before admission: a prefix-cache hit may make it less (see top_up) */
        int want = itl_room(e, s, np, share_room(e, s, np, s->n_toks - s->n_computed));
        if (want <= 0) continue; /* its client's share of this step is taken */
        e->plan[np] = s, e->plan_need[np++] = want;
        add_load(c, load, n, s->req->client);
    }
    return np;
}

/* Reserve s's granted chunk (capped by fit_chunk); it is marked in_step so no
 * later make_room of this step takes it as victim. 0, or -1 when it got no room. */
static int reserve_chunk(engine *e, eng_seq *s, int share, int may_preempt) {
    int left = s->n_toks - s->n_computed;
    int chunk = fit_chunk(e, s, share < left ? share : left);
    if (make_room(e, s, s->n_computed + chunk, may_preempt) < 0) return -1;
    s->in_step = chunk;
    return 0;
}

/* Tokens the plan leaves unused (a candidate without room, a waiting one that was not
 * admitted, a prefix-cache hit) go to the planned sequences that want more, shared
 * again, where the pool has room without preempting: one candidate's misfortune does
 * not shrink the step. */
static void top_up(engine *e, int n, int tokens) {
    int used = 0;
    for (int i = 0; i < n; i++) {
        eng_seq *s = e->plan[i];
        used += s->in_step;
        e->plan_need[i] = s->in_step ? s->n_toks - s->n_computed - s->in_step : 0;
    }
    if (used >= tokens) return;
    share_prefill(e->plan_need, e->plan_share, n, tokens - used);
    for (int i = 0; i < n; i++) {
        eng_seq *s = e->plan[i];
        if (e->plan_share[i] <= 0) continue;
        int chunk = fit_chunk(e, s, s->in_step + e->plan_share[i]);
        if (chunk > s->in_step && make_room(e, s, s->n_computed + chunk, ROOM_NO_PREEMPT) == 0)
            s->in_step = chunk;
    }
}

/* Blocks s still needs for the rest of its tokens beyond those it holds. */
static int blocks_to_finish(const engine *e, const eng_seq *s) {
    int bs = e->kv->cfg.block_size, more = (s->n_toks + bs - 1) / bs - s->kv->n_blocks;
    return more > 0 ? more : 0;
}

/* A waiting sequence admitted for this step is not after all: back to waiting. If its
 * client has nothing running, fair_preempt hears of it at the next step. */
static void unadmit(engine *e, eng_seq *s) {
    kv_seq_release(e->kv, s->kv);
    s->kv = NULL, s->n_computed = 0, s->state = SQ_WAIT, s->in_step = 0;
    e->fair_kv |= s->req->client && client_load(e, s) == 0;
}

/* Blocks a new prefill may count on: the free ones, and those paused sequences hold
 * (admission preempts them: make_room). *others: whether anything else is running. */
static int blocks_available(const engine *e, const eng_seq *self, int *others) {
    int n = kv_free_blocks(e->kv);
    *others = 0;
    for (int i = 0; i < e->cfg.max_seqs; i++) {
        const eng_seq *s = &e->seqs[i];
        if (s->state != SQ_RUN || s == self) continue;
        *others = 1;
        if (s->req->paused) n += s->kv->n_blocks;
    }
    return n;
}

/* Steps 2 and 3: the tokens the decodes left are shared over the running prefills and
 * the waiting sequences that have a slot (share_prefill), so a short prompt is not
 * starved behind a long one that would take the whole budget; a waiting one given no
 * tokens this step is not admitted. Running prefills reserve first, oldest
 * first, and may preempt younger ones (make_room); waiting ones are admitted in fairness
 * order, preempt only paused sequences, and admission stops at one that does not fit.
 * A waiting one whose prefill spans steps (its share is less than its prompt) fits only
 * if the pool holds the rest of its prompt besides what the other spanning prefills
 * still need: a small first chunk always fits, and without this many long prefills
 * would start in a full pool, the youngest preempted and recomputed step after step.
 * Past the first spanning prefill one that does not fit is skipped, not stopped at, so
 * short ones behind it still come in; with nothing else running it is admitted anyway
 * (a prompt larger than the free pool, kv8) so it cannot wait forever. */
static void add_prefills(engine *e, int slots, int tokens) {
    int n_run, n = prefill_candidates(e, slots, tokens, &n_run);
    int committed = 0, spanning = 0; /* blocks the prefills spanning steps still need */
    share_prefill(e->plan_need, e->plan_share, n, tokens);
    for (int i = 0; i < n; i++) {
        eng_seq *s = e->plan[i];
        if (i >= n_run && e->plan_share[i] == 0) continue; /* its turn comes later */
        if (i >= n_run && admit(e, s) < 0) {
            n = i;
            break;
        }
        if (i < n_run) { /* a younger prefill may have been preempted by an older one's */
            if (s->state != SQ_RUN || reserve_chunk(e, s, e->plan_share[i], ROOM_PREEMPT) < 0)
                continue;
        } else if (reserve_chunk(e, s, e->plan_share[i], ROOM_PREEMPT_PAUSED) < 0) {
            unadmit(e, s);
            n = i;
            break;
        }
        if (s->in_step == s->n_toks - s->n_computed) continue; /* done this step */
        int more = blocks_to_finish(e, s), others;
        if (i >= n_run && committed + more > blocks_available(e, s, &others) &&
            (spanning || others)) {
            unadmit(e, s);
            if (spanning) continue; /* a long one is under way: shorter ones may pass */
            n = i;
            break;
        }
        committed += more, spanning = 1;
    }
    if (!e->share_seqs) top_up(e, n, tokens); /* under a share the rest is left unused */
    for (int i = 0; i < n; i++) {
        eng_seq *s = e->plan[i];
        int chunk = s->in_step;
        if (chunk > 0) add_to_step(e, s, chunk, chunk == s->n_toks - s->n_computed);
    }
}

/* The running sequence the client holding the most running sequences gives up, or NULL
 * when no client (0 excepted) holds more than `share`: its youngest unpaused one, as
 * that frees a batch slot (a paused one holds none, and admission has already taken
 * the blocks of any paused one in its way: make_room). */
static eng_seq *fair_victim(engine *e, int share) {
    eng_seq *heavy = NULL, *v = NULL;
    int most = share;
    for (int i = 0; i < e->cfg.max_seqs; i++) {
        eng_seq *s = &e->seqs[i];
        int load = s->state == SQ_RUN ? client_load(e, s) : 0;
        if (load > most) most = load, heavy = s;
    }
    for (int i = 0; heavy && i < e->cfg.max_seqs; i++) {
        eng_seq *s = &e->seqs[i];
        if (s->state != SQ_RUN || s->req->client != heavy->req->client) continue;
        if (v && v->req->paused != s->req->paused) {
            if (!s->req->paused) v = s;
            continue;
        }
        if (!v || s->order > v->order || (s->order == v->order && s->sample > v->sample)) v = s;
    }
    return v;
}

/* One client's many requests must not keep another's first one waiting until one of
 * them ends: when an unpaused waiting sequence whose client has nothing running finds
 * the batch full (or the last admission found the KV pool full for such a one), the
 * client holding the most running sequences gives up its youngest, if it holds more
 * than its fair share (the batch over the active clients, at least 1). At most one per
 * step, and the victim's client still has sequences running, so its own wait triggers
 * nothing: no thrash. The victim recomputes later, like any preempted sequence. */
static void fair_preempt(engine *e) {
    int kv_full = e->fair_kv, running = 0, unpaused = 0, starved = 0;
    e->fair_kv = 0;
    for (int i = 0; i < e->cfg.max_seqs; i++) {
        const eng_seq *s = &e->seqs[i];
        running += s->state == SQ_RUN;
        unpaused += s->state == SQ_RUN && !s->req->paused;
    }
    if (unpaused < e->max_batch && !kv_full) return;
    for (int i = 0; i < e->cfg.max_seqs && !starved; i++) {
        const eng_seq *s = &e->seqs[i];
        starved = s->state == SQ_WAIT && !s->req->paused && s->req->client && client_load(e, s) == 0;
    }
    if (!starved) return;
    int cap = running < e->max_batch ? running : e->max_batch; /* what the pool or batch holds */
    int share = cap / active_clients(e, 0);
    eng_seq *v = fair_victim(e, share > 1 ? share : 1);
    if (v) preempt(e, v);
}

int eng_step_begin(engine *e) {
    if (e->busy) return -EBUSY;
    e->b_n_tok = e->b_n_seq = e->b_n_logit = 0;
    int budget = e->cfg.max_batched_tokens, max_seq = e->max_batch;
    eng_seq **c = e->cand;
    if (e->kv8) kv8_pass(e);
    if (e->max_batch < e->cfg.max_batch_size) shrink_running(e);
    fair_preempt(e);
    step_shares(e);

    /* 1. running decodes (one token left to compute), oldest first; under a share, the
     * longest waiting first, and those over their client's share hold their slot; under
     * a latency target, a client's decodes past the balanced step go only within it */
    int n = collect(e, SQ_RUN, c), held = 0;
    if (e->share_seqs) by_wait(c, n);
    int m = balanced_decodes(e, c, n);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) itl_plan(e); /* the target, from the balanced step */
        for (int i = 0; i < n && e->b_n_seq < max_seq && e->b_n_tok < budget; i++) {
            eng_seq *s = c[i];
            if (s->in_step || s->state != SQ_RUN || s->req->paused || s->n_toks - s->n_computed != 1)
                continue;
            if (!share_room(e, s, 0, 1) || (pass == 1 && !itl_fits(e, s))) {
                held += pass; /* counted once, in the second pass */
                continue;
            }
            if (pass == 0 && s->req->client && client_in_step(e, s->req->client) >= m) continue;
            if (make_room(e, s, s->n_computed + 1, ROOM_PREEMPT) < 0) continue;
            add_to_step(e, s, 1, 1);
        }
    }
    /* 2. running prefills' next chunks and 3. waiting sequences, sharing what is left
     * (and what the latency target leaves) */
    if (e->b_n_seq + held < max_seq && e->b_n_tok < budget)
        add_prefills(e, max_seq - e->b_n_seq - held, budget - e->b_n_tok);
    if (e->b_n_tok == 0) return 0;
    e->batch = (model_batch){e->b_n_tok, e->b_tokens, e->b_pos, (kv_seq *const *)e->b_seq,
                             e->b_n_logit, e->b_rows};
    int r = e->be->ops->submit(e->be, &e->batch);
    if (r < 0) {
        for (int i = 0; i < e->b_n_seq; i++) e->b_members[i]->in_step = 0;
        return r;
    }
    e->busy = 1;
    e->t_submit = now_s();
    return 1;
}

/* ------------------------------------------------------------------ finishing a step */

/* Give the parked samples of s's request their own page tables sharing s's blocks. */
static void fork_samples(engine *e, eng_seq *s) {
    eng_req *r = s->req;
    r->forked = 1;
    for (int i = 1; i < r->n; i++) {
        eng_seq *f = r->seqs[i];
        if (!f || f->state != SQ_PARKED) continue;
        memcpy(f->toks, s->toks, (size_t)s->n_toks * sizeof(int32_t));
        f->n_toks = s->n_toks;
        f->usage.cached_tokens = s->usage.cached_tokens;
        f->usage.queue_s = s->usage.queue_s;
        f->seen_cache = 1;
        f->kv = kv_seq_fork(e->kv, s->kv);
        if (f->kv) {
            f->n_computed = s->n_computed;
            f->state = SQ_RUN;
            f->logit_row = s->logit_row; /* samples from the same logits below */
        } else {
            f->state = SQ_WAIT; /* no page table free: it recomputes the prompt later */
        }
    }
}

/* Sample the next token of s from its logits row, stream it, retire s if done. */
static void advance(engine *e, eng_seq *s, const float *logits) {
    const int nv = e->m->cfg.n_vocab;
    if (s->n_gen == 0 && s->sample == 0 && s->req->first_logits)
        memcpy(s->req->first_logits, logits, (size_t)nv * sizeof(float));
    memcpy(e->scratch, logits, (size_t)nv * sizeof(float));
    float lp = 0.0f;
    int32_t tok = sampler_sample_top(&s->smp, e->scratch, s->req->logprobs ? &lp : NULL, s->req->top_logprobs,
                                     e->top_id, e->top_lp, &e->n_top);
    sampler_accept(&s->smp, tok, 0);
    s->toks[s->n_toks++] = tok;
    s->n_gen++;
    e->stats.generation_tokens++;
    if (s->usage.first_step < 0) {
        s->usage.first_step = e->step;
        s->usage.ttft_s = now_s() - s->req->t_arrival;
    } else if (e->step - s->last_step > s->usage.max_step_gap) {
        s->usage.max_step_gap = (int)(e->step - s->last_step);
    }
    s->last_step = e->step;
    if (tok_is_eog(e->tok, tok) && !s->req->ignore_eog) {
        e->n_top = 0; /* never emitted */
        finish_seq(e, s, EF_STOP, NULL);
        return;
    }
    int k = tok_stream_push(&s->ts, tok, e->text, TOK_STREAM_CAP(e->tok));
    int stopped = 0;
    size_t out = 0;
    char *o = e->text + (k > 0 ? k : 0);
    if (k > 0)
        out = stopper_feed(&s->st, e->text, (size_t)k, o,
                           (size_t)ENG_TEXT_CAP(e->tok) - (size_t)k, &stopped);
    emit(e, s, tok, o, (int)out, lp);
    e->n_top = 0; /* this token's alone */
    if (stopped) finish_seq(e, s, EF_STOP, NULL);
    else if (s->n_gen >= s->max_gen || s->n_toks >= e->cfg.max_seq_len)
        finish_seq(e, s, EF_LENGTH, NULL);
}

/* The step just done, for the cost model: its compute time as the backend measured it,
 * else from submit to now (which includes the loop's delay in noticing). */
static void observe_cost(engine *e) {
    double ms = e->be->ops->step_ms ? e->be->ops->step_ms(e->be) : (now_s() - e->t_submit) * 1e3;
    cost_observe(&e->cost, e->b_n_tok, step_positions(e), ms, e->b_n_tok == e->b_n_seq);
}

int eng_step_end(engine *e) {
    if (!e->busy) return 0;
    int r = e->be->ops->wait(e->be);
    e->busy = 0;
    e->step++;
    e->stats.steps++;
    if (r > 0) observe_cost(e);
    const float *lg = r > 0 ? e->be->ops->logits(e->be) : NULL;
    const int nv = e->m->cfg.n_vocab;
    for (int i = 0; i < e->b_n_seq; i++) {
        eng_seq *s = e->b_members[i];
        int did = s->in_step;
        s->in_step = 0;
        if (!lg) {
            finish_seq(e, s, EF_ERROR, e->be->err);
            continue;
        }
        s->n_computed += did;
        if (e->cfg.prefix_caching) kv_seq_commit(e->kv, s->kv, s->toks, s->n_computed);
        kv_seq_slide(e->kv, s->kv, s->n_computed); /* windowed KV no later position reads */
        if (s->req->cancelled) {
            finish_seq(e, s, EF_CANCELLED, "cancelled");
            continue;
        }
        if (s->logit_row < 0) continue;
        const float *row = lg + (size_t)s->logit_row * nv;
        eng_req *rq = s->req;
        if (rq->n > 1 && !rq->forked && s->sample == 0) {
            fork_samples(e, s);
            for (int j = 1; j < rq->n; j++) /* the forks sample from the same row */
                if (rq->seqs[j] && rq->seqs[j]->state == SQ_RUN && rq->seqs[j]->n_gen == 0)
                    advance(e, rq->seqs[j], row);
        }
        advance(e, s, row);
    }
    return r < 0 ? r : 0;
}

/* ------------------------------------------------------------------ driving */

int eng_busy(const engine *e) { return e->busy; }

int eng_pending(const engine *e) {
    for (int i = 0; i < e->cfg.max_seqs; i++)
        if (e->seqs[i].state != SQ_FREE) return 1;
    return 0;
}

int eng_run_sync(engine *e) {
    while (eng_pending(e)) {
        int r = eng_step_begin(e);
        if (r < 0) return r;
        if (r == 0) return -EDEADLK; /* work left that can never be scheduled */
        if ((r = eng_step_end(e)) < 0) return r;
    }
    return 0;
}

void eng_get_stats(const engine *e, eng_stats *st) {
    *st = e->stats;
    st->running = st->waiting = 0;
    for (int i = 0; i < e->cfg.max_seqs; i++) {
        st->running += e->seqs[i].state == SQ_RUN;
        st->waiting += e->seqs[i].state == SQ_WAIT || e->seqs[i].state == SQ_PARKED;
    }
    st->waiting_tokens = queued_tokens(e);
}
