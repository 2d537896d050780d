/* test_kv8: what 8-bit KV (the ladder's rung 2, mm/kv.h kv8) costs in accuracy, on the
 * real model (MODEL). The seven parity prompts of tests/ref/parity.py run twice side by
 * side: over an f16 pool, and over a kv8 pool where every full block is turned to 8 bits
 * as soon as it is full (all of the cache but the block being written: rung 2 at its
 * harshest). Both are teacher-forced on the f16 run's greedy tokens, so the step where
 * the 8-bit run's argmax first differs is where its own greedy output would first
 * differ. Prints the mean and max KL divergence of the next-token distribution and, per
 * prompt, how many greedy tokens agree; checks them against bounds set from measured
 * figures with room (BENCHMARKS.md records the figures). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model_fixture.h"
#include "core/backend.h"
#include "core/model.h"
#include "core/tokenizer.h"
#include "mm/kv.h"
#include "sched/engine.h"
#include "tests/kl.h"
#include "tests/parity_prompts.h"

#if defined(__SANITIZE_ADDRESS__)
#define SLOW 1 /* the sanitizer build runs two prompts for a few steps */
#else
#define SLOW 0
#endif

#define N_GEN 32   /* teacher-forced steps per prompt */
#define AGREE 16   /* the acceptance's horizon: greedy tokens that must agree */
#define MAX_CTX 192

/* One side: a pool, its backend, one sequence. */
typedef struct {
    kv_pool kv;
    backend *be;
    kv_seq *s;
} side;

static int side_open(side *d, const model *m, int kv8) {
    char err[256];
    kv_config kc = {0};
    model_kv_shape(m, &kc);
    kc.block_size = 16;
    kc.n_blocks = 2 * MAX_CTX / 16;
    kc.max_seqs = 1;
    kc.max_blocks_per_seq = MAX_CTX / 16;
    kc.kv8 = kv8;
    if (kv_pool_init(&d->kv, &kc, NULL) < 0) return -1;
    backend_cpu_config bc = {2, MAX_CTX, 1, MAX_CTX, 0};
    d->be = backend_cpu_new(m, &d->kv, &bc, err, sizeof err);
    if (!d->be) fprintf(stderr, "test_kv8: backend: %s\n", err);
    return d->be ? 0 : -1;
}

static void side_close(side *d) {
    if (d->be) d->be->ops->destroy(d->be);
    kv_pool_free(&d->kv);
}

/* Positions [n0, n0 + n) of d's sequence from toks; the logits of the last one. Then
 * every full block but the last `hot` ones turns to 8 bits (a no-op on the f16 side). */
static const float *side_step(side *d, const int32_t *toks, int n0, int n, int hot) {
    if (kv_seq_reserve(&d->kv, d->s, n0 + n) < 0 || kv_seq_cow(&d->kv, d->s, n0) < 0) return NULL;
    int32_t pos[MAX_CTX];
    kv_seq *seqs[MAX_CTX];
    for (int i = 0; i < n; i++) pos[i] = n0 + i, seqs[i] = d->s;
    int32_t row = n - 1;
    model_batch b = {n, toks + n0, pos, (kv_seq *const *)seqs, 1, &row};
    if (backend_run(d->be, &b) <= 0) return NULL;
    kv_seq_to_q8(&d->kv, d->s, n0 + n - hot * d->kv.cfg.block_size, MAX_CTX);
    return d->be->ops->logits(d->be);
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int encode(const tok_t *tok, const parity_prompt *p, int32_t *ids, int cap) {
    char buf[1024];
    int n = parity_text(p, buf, sizeof buf);
    return n < 0 ? -1 : tok_encode(tok, buf, (size_t)n, 1, ids, cap);
}

/* The parity prompts side by side, the 8-bit side keeping its last `hot` full blocks in
 * f16 (0: rung 2 at its harshest; ENG_KV8_HOT_BLOCKS: what the engine's rung 2 does).
 * Prints the figures; checks them against bounds set from measured ones, with room. */
static void accuracy(const model *m, const tok_t *tok, int hot) {
    const int nv = m->cfg.n_vocab, n_prompts = SLOW ? 2 : N_PARITY_PROMPTS, n_gen = SLOW ? 8 : N_GEN;
    side f16 = {0}, q8 = {0};
    CHECK(side_open(&f16, m, 0) == 0 && side_open(&q8, m, 1) == 0, "two pools and backends");
    float *ref = malloc((size_t)nv * sizeof(float));
    double kl_sum = 0, kl_max = 0;
    int n_kl = 0, agree16 = 0;
    for (int pi = 0; pi < n_prompts && f16.be && q8.be; pi++) {
        const char *name = PARITY_PROMPTS[pi].name;
        int32_t toks[MAX_CTX];
        int n = encode(tok, &PARITY_PROMPTS[pi], toks, MAX_CTX - N_GEN - 1);
        CHECK(n > 0, "%s: tokenized", name);
        if (n <= 0) continue;
        f16.s = kv_seq_new(&f16.kv), q8.s = kv_seq_new(&q8.kv);
        int agree = -1; /* greedy tokens equal before the first difference */
        const float *la = side_step(&f16, toks, 0, n, 0), *lb = NULL;
        for (int g = 0; g <= n_gen && la; g++) {
            memcpy(ref, la, (size_t)nv * sizeof(float));
            lb = g == 0 ? side_step(&q8, toks, 0, n, hot) : side_step(&q8, toks, n + g - 1, 1, hot);
            CHECK(lb != NULL, "%s: 8-bit step %d", name, g);
            if (!lb) break;
            double kl = kl_logits(ref, lb, nv);
            kl_sum += kl, n_kl++;
            kl_max = fmax(kl_max, kl);
            toks[n + g] = argmax(ref, nv); /* teacher forcing: the f16 run's greedy token */
            if (agree < 0 && argmax(lb, nv) != toks[n + g]) agree = g;
            if (g < n_gen) la = side_step(&f16, toks, n + g, 1, 0);
        }
        if (agree < 0) agree = n_gen + 1;
        agree16 += agree >= AGREE;
        int q8_blocks = kv_q8_blocks(&q8.kv), want = (n + n_gen) / 16 - hot;
        printf("kv8 hot=%d %-15s prompt %3d tokens: greedy agrees for %2d of %d tokens, %d of %d blocks 8-bit\n",
               hot, name, n, agree, n_gen + 1, q8_blocks, q8.s->n_blocks);
        CHECK(q8_blocks == (want > 0 ? want : 0), "%s: every full block but %d 8-bit (%d)", name, hot, q8_blocks);
        kv_seq_release(&f16.kv, f16.s);
        kv_seq_release(&q8.kv, q8.s);
        char e[200] = "";
        CHECK(kv_check(&q8.kv, e, sizeof e) == 0 && kv_free_blocks(&q8.kv) == q8.kv.cfg.n_blocks,
              "8-bit pool back to empty: %s", e);
    }
    double mean = n_kl ? kl_sum / n_kl : INFINITY;
    printf("kv8 hot=%d: mean KL %.5f nats, max %.4f, over %d distributions; greedy identical for the "
           "first %d tokens on %d of %d prompts\n", hot, mean, kl_max, n_kl, AGREE, agree16, n_prompts);
    CHECK(mean < (hot ? 0.004 : 0.008), "hot=%d: mean KL %.5f", hot, mean);
    /* Greedy agreement is a knife edge (a prompt at 15 or 16 tokens moves with the last
     * bits of any kernel: 4 to 6 of 7 measured across SIMD levels and attention kernels);
     * the KL bound above is the sharp check, this one catches a path gone wrong (0-1). */
    if (!SLOW && hot) CHECK(agree16 >= 4, "greedy identical for %d tokens on %d of %d prompts", AGREE, agree16, n_prompts);
    free(ref);
    side_close(&f16);
    side_close(&q8);
}

/* ---------------------------------------------------------------- the engine */

typedef struct {
    int tokens[4], ends[4], reason[4];
} eng_out;

static void on_tok(void *ud, int64_t req, int sample, int32_t token, const char *text, int len,
                   float lp) {
    (void)req, (void)text, (void)len, (void)lp;
    if (token >= 0) ((eng_out *)ud)->tokens[sample]++;
}

static void on_end(void *ud, int64_t req, int sample, int reason, const eng_usage *u,
                   const char *msg) {
    (void)req, (void)u, (void)msg;
    eng_out *o = ud;
    o->ends[sample]++;
    o->reason[sample] = reason;
}

/* The engine over a kv8 pool of 12 blocks (192 tokens in f16): rung 2 switched on while
 * a dozen requests (n = 2 for some, two cancelled mid-way) preempt each other; then one
 * request longer than the whole pool in f16 (prompt 100 + 200 generated), which
 * completes because its own blocks turn to 8 bits. Every sample ends once, nothing is
 * left in the pool, and kv_check holds after every step. */
static void engine_kv8(const model *m, const tok_t *tok) {
    char err[256];
    kv_config kc = {0};
    model_kv_shape(m, &kc);
    kc.block_size = 16, kc.n_blocks = 12, kc.max_seqs = 32, kc.max_blocks_per_seq = 24;
    kc.prefix_cache = 1, kc.kv8 = 1;
    kv_pool kv;
    CHECK(kv_pool_init(&kv, &kc, NULL) == 0, "kv8 pool");
    backend_cpu_config bc = {2, 128, 8, 384, 0};
    backend *be = backend_cpu_new(m, &kv, &bc, err, sizeof err);
    eng_config ec = {.max_batch_size = 8, .max_batched_tokens = 128, .max_seq_len = 320,
                     .max_seqs = 32, .max_queued_requests = 64, .prefix_caching = 1};
    eng_callbacks cb = {on_tok, on_end};
    engine *e = be ? eng_new(&ec, m, tok, &kv, be, &cb, err, sizeof err) : NULL;
    CHECK(e != NULL, "engine: %s", err);
    if (!e) goto out;
    CHECK(eng_set_kv8(e, 1) == 1, "rung 2 on");
    enum { N = SLOW ? 8 : 12 };
    static eng_out out[N + 1];
    int32_t prompt[160];
    int64_t ids[N];
    for (int i = 0; i < N; i++) {
        eng_params ep = {0};
        for (int k = 0; k < 160; k++) prompt[k] = (int32_t)(300 + (k < 32 ? k : k * 7 + i * 131) % 9000);
        ep.prompt = prompt, ep.n_prompt = 60 + (i * 37) % 100, ep.n = i % 3 == 0 ? 2 : 1;
        ep.ud = &out[i], ep.ignore_eog = 1;
        sampler_params_default(&ep.sp);
        ep.sp.temperature = 0.7f, ep.sp.seed = 7, ep.sp.max_tokens = 40 + 5 * (i % 5);
        ids[i] = eng_submit(e, &ep, err, sizeof err);
        CHECK(ids[i] > 0, "submit %d: %s", i, err);
    }
    char e2[200] = "";
    for (int step = 0; eng_pending(e) && step < 5000; step++) {
        if (step == 6) eng_cancel(e, ids[1]), eng_cancel(e, ids[N - 1]);
        int r = eng_step_begin(e);
        CHECK(r >= 0, "step %d: %d", step, r);
        if (r <= 0) break;
        eng_step_end(e);
        if (kv_check(&kv, e2, sizeof e2) < 0) break;
    }
    CHECK(e2[0] == 0, "kv_check during the run: %s", e2);
    int ends = 0, want = 0;
    for (int i = 0; i < N; i++)
        for (int k = 0; k < (i % 3 == 0 ? 2 : 1); k++) want++, ends += out[i].ends[k] == 1;
    CHECK(ends == want, "every sample ended once: %d of %d", ends, want);
    eng_stats st;
    eng_get_stats(e, &st);
    printf("kv8 engine: %d samples, %lld preemptions, %llu blocks turned, %llu moves\n", want,
           (long long)st.preemptions, (unsigned long long)kv.stats.q8_conversions,
           (unsigned long long)kv.stats.q8_moves);
    CHECK(kv.stats.q8_conversions > 0 && st.preemptions > 0, "rung 2 turned blocks, and still preempted");
    /* one sequence longer than the f16 pool (192 tokens): 100 + 200, of the 320 a
     * sequence may hold in 8 bits */
    eng_set_kv8(e, 0);
    eng_params ep = {0};
    for (int k = 0; k < 100; k++) prompt[k] = (int32_t)(500 + k * 13 % 7000);
    ep.prompt = prompt, ep.n_prompt = 100, ep.n = 1, ep.ud = &out[N], ep.ignore_eog = 1;
    sampler_params_default(&ep.sp);
    ep.sp.temperature = 0.0f, ep.sp.max_tokens = SLOW ? 60 : 200;
    CHECK(eng_submit(e, &ep, err, sizeof err) > 0, "long: %s", err);
    CHECK(eng_run_sync(e) == 0, "long request ran");
    CHECK(out[N].ends[0] == 1 && out[N].reason[0] == EF_LENGTH && out[N].tokens[0] == ep.sp.max_tokens,
          "longer than the f16 pool: %d tokens, reason %d", out[N].tokens[0], out[N].reason[0]);
    CHECK(kv_check(&kv, e2, sizeof e2) == 0 && kv_free_blocks(&kv) == kc.n_blocks,
          "pool empty after: %s, %d free", e2, kv_free_blocks(&kv));
out:
    eng_free(e);
    if (be) be->ops->destroy(be);
    kv_pool_free(&kv);
}

int main(void) {
    static model m;
    static tok_t tok;
    if (fixture_load(&m, &tok, "test_kv8") < 0) return 1;
    accuracy(&m, &tok, 0);
    accuracy(&m, &tok, ENG_KV8_HOT_BLOCKS);
    engine_kv8(&m, &tok);
    tok_free(&tok);
    model_free(&m);
    return check_done("kv8");
}
