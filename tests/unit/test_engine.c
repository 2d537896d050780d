/* test_engine: the scheduler's promises.
 *
 * Part A runs the engine over a fake backend that computes no model: it writes each
 * token's id into its KV slot and derives the next token from a hash of everything
 * the sequence's page table holds, so any paging fault (a wrong block, a missed
 * copy-on-write, a bad prefix-cache hit, a lost preemption) changes the output. It
 * checks batch invariance and page accounting over 10,000 randomized requests.
 * Part B runs the real model (MODEL): batch invariance among 31 other requests with
 * prefix caching on and off and with forced preemption, the prefix-cache reuse of a
 * 512-token prefix, and the stall bound of a 2,000-token prompt arriving among 16
 * decoding streams, counted in steps. */
#include <errno.h>
#include <limits.h>
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

#if defined(__SANITIZE_ADDRESS__)
#define SLOW 1 /* sanitizer builds run fewer and shorter requests on the real model */
#else
#define SLOW 0
#endif

#define MAX_REQ 64
#define MAX_N 4
#define MAX_OUT 64

/* ------------------------------------------------------------------ fake backend */

typedef struct {
    backend be;
    const kv_pool *kv;
    int g_layer, w_layer; /* a global and a windowed layer of the model, -1 if none */
    int window;           /* the windowed layers' swa_window */
    int n_vocab;
    int32_t eog;
    int fail_next;  /* the next step fails (a device error) */
    float *logits; /* [max_logits][n_vocab] */
    int last_seqs;  /* sequences in the last step */
    int last_tokens; /* tokens in the last step */
    double last_ms;  /* what the last step "took": FAKE_MS */
} fake_backend;

/* The fake's step time: 2 ms a step, 0.5 a token, 1 per thousand keys read (a CPU's
 * shape, and cost.h's model exactly). */
#define FAKE_MS(tokens, positions) (2.0 + 0.5 * (tokens) + 1.0 * (positions) * 1e-3)

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

static uint16_t *fake_slot(const kv_pool *kv, const kv_seq *s, int layer, int pos) {
    int bs = kv->cfg.block_size;
    return kv_k(kv, s->blocks[pos / bs], layer, 0) + kv_k_index(kv, pos % bs, 0);
}

static int fake_submit(backend *be, const model_batch *b) {
    fake_backend *f = (fake_backend *)be;
    f->last_seqs = 0;
    double pos = 0;
    for (int t = 0; t < b->n_tokens; t++) f->last_seqs += t == 0 || b->seq[t] != b->seq[t - 1];
    for (int t = 0; t < b->n_tokens; t++) pos += b->pos[t];
    f->last_tokens = b->n_tokens;
    f->last_ms = FAKE_MS(b->n_tokens, pos);
    for (int t = 0; t < b->n_tokens; t++) { /* "write the KV": the token id */
        if (f->g_layer >= 0) *fake_slot(f->kv, b->seq[t], f->g_layer, b->pos[t]) = (uint16_t)b->tokens[t];
        if (f->w_layer >= 0) *fake_slot(f->kv, b->seq[t], f->w_layer, b->pos[t]) = (uint16_t)b->tokens[t];
    }
    for (int i = 0; i < b->n_logits; i++) { /* "attend": the whole context, as a model's */
        int t = b->logit_rows[i];   /* global layer reads it, and the window, as its */
        uint64_t h = 1;             /* windowed layers read it (freed KV would show) */
        for (int p = 0; p <= b->pos[t]; p++) {
            if (f->g_layer >= 0) h = mix(h, *fake_slot(f->kv, b->seq[t], f->g_layer, p));
            if (f->w_layer >= 0 && p >= kv_swa_first(f->window, b->pos[t]))
                h = mix(h, *fake_slot(f->kv, b->seq[t], f->w_layer, p));
        }
        float *lg = f->logits + (size_t)i * f->n_vocab;
        for (int v = 0; v < f->n_vocab; v++) lg[v] = (float)((h >> (v % 48)) & 7) * 0.01f;
        int32_t best = (int32_t)((100 + h % 20000) % (uint64_t)f->n_vocab); /* any vocabulary */
        if (h % 29 == 0) best = f->eog;      /* some sequences end early */
        lg[best] = 5.0f;
        lg[(best + 1) % f->n_vocab] = 4.8f;  /* a close runner-up for sampling */
    }
    return 0;
}
static int fake_wait(backend *be) {
    fake_backend *f = (fake_backend *)be;
    if (!f->fail_next) return 1;
    f->fail_next = 0;
    snprintf(be->err, sizeof be->err, "fake device error");
    return -EIO;
}
static int fake_fd(backend *be) { (void)be; return -1; }
static const float *fake_logits(backend *be) { return ((fake_backend *)be)->logits; }
static void fake_destroy(backend *be) { (void)be; }
static double fake_step_ms(backend *be) { return ((fake_backend *)be)->last_ms; }
static const backend_ops fake_ops = {"fake", fake_submit, fake_wait, fake_wait, fake_fd,
                                     fake_logits, fake_destroy, fake_step_ms, NULL};

/* ------------------------------------------------------------------ results */

typedef struct {
    int32_t out[MAX_N][MAX_OUT];
    int n_out[MAX_N];
    int finished[MAX_N];
    int reason[MAX_N];
    eng_usage usage[MAX_N];
} req_result;

static void on_token(void *ud, int64_t req, int sample, int32_t tok, const char *text, int len,
                     float lp) {
    (void)req, (void)text, (void)len, (void)lp;
    req_result *r = ud;
    if (tok >= 0 && r->n_out[sample] < MAX_OUT) r->out[sample][r->n_out[sample]++] = tok;
}

static void on_finish(void *ud, int64_t req, int sample, int reason, const eng_usage *u,
                      const char *msg) {
    (void)req, (void)msg;
    req_result *r = ud;
    r->finished[sample]++;
    r->reason[sample] = reason;
    r->usage[sample] = *u;
}

/* ------------------------------------------------------------------ a rig */

static int rig_fair; /* eng_config.fair_batch of the next rig_open */
static int rig_whole; /* 1: the next rig_open's pool frees no windowed KV */
/* 1: the next fake rig's pool has every layer but the last windowed (one global of four
 * or more: a gone block keeps a quarter, mm/kv.h) whatever the model says */
static int rig_quarters;
static int rig_itl;  /* its itl_target_ms (0: the default, 4x the step without the prefill) */

typedef struct {
    kv_pool kv;
    backend *be;
    fake_backend fake;
    engine *eng;
    int is_fake;
} rig;

static int rig_open(rig *g, const model *m, const tok_t *tok, int n_blocks, int max_seqs,
                    int max_seq_len, int batch, int tokens, int prefix, int fake) {
    char err[256];
    memset(g, 0, sizeof *g);
    kv_config kc = {0};
    model_kv_shape(m, &kc);
    if (rig_whole) kc.swa_window = 0;
    if (rig_quarters && fake) {
        memset(kc.swa_layers, 0, sizeof kc.swa_layers);
        for (int l = 0; l < m->cfg.n_layers - 1; l++) kc.swa_layers[l / 64] |= 1ull << (l % 64);
    }
    kc.block_size = 16;
    kc.n_blocks = n_blocks;
    kc.max_seqs = max_seqs;
    kc.max_blocks_per_seq = (max_seq_len + 15) / 16;
    kc.prefix_cache = prefix;
    if (kv_pool_init(&g->kv, &kc, NULL) < 0) return -1;
    g->is_fake = fake;
    if (fake) {
        g->fake.be.ops = &fake_ops;
        g->fake.kv = &g->kv;
        g->fake.n_vocab = m->cfg.n_vocab;
        g->fake.g_layer = g->fake.w_layer = -1;
        g->fake.window = m->cfg.swa_window;
        for (int l = m->cfg.n_layers - 1; l >= 0; l--) { /* the pool's layers, as it frees them */
            if (kc.swa_window && (kc.swa_layers[l / 64] >> (l % 64) & 1)) g->fake.w_layer = l;
            else g->fake.g_layer = l;
        }
        g->fake.eog = tok_eos(tok);
        g->fake.logits = malloc((size_t)batch * m->cfg.n_vocab * sizeof(float));
        g->be = &g->fake.be;
    } else {
        backend_cpu_config bc = {2, tokens, batch, max_seq_len, 0};
        g->be = backend_cpu_new(m, &g->kv, &bc, err, sizeof err);
        if (!g->be) {
            fprintf(stderr, "backend: %s\n", err);
            return -1;
        }
    }
    eng_config ec = {.max_batch_size = batch, .max_batched_tokens = tokens,
                     .max_seq_len = max_seq_len, .max_seqs = max_seqs,
                     .max_queued_requests = 1024, .prefix_caching = prefix, .fair_batch = rig_fair,
                     .itl_target_ms = rig_itl};
    eng_callbacks cb = {on_token, on_finish};
    g->eng = eng_new(&ec, m, tok, &g->kv, g->be, &cb, err, sizeof err);
    if (!g->eng) fprintf(stderr, "eng_new: %s\n", err);
    return g->eng ? 0 : -1;
}

static void rig_close(rig *g) {
    eng_free(g->eng);
    if (g->is_fake) free(g->fake.logits);
    else g->be->ops->destroy(g->be);
    kv_pool_free(&g->kv);
}

static int pool_ok(rig *g, const char *what) {
    char err[256] = "";
    int c = kv_check(&g->kv, err, sizeof err);
    CHECK(c == 0, "%s: kv_check: %s", what, err);
    CHECK(kv_free_blocks(&g->kv) == g->kv.cfg.n_blocks, "%s: %d of %d blocks free", what,
          kv_free_blocks(&g->kv), g->kv.cfg.n_blocks);
    return c == 0;
}

/* ------------------------------------------------------------------ workloads */

static uint64_t rng_state = 12345;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

typedef struct {
    int32_t toks[2100];
    int n;
} prompt;

static uint32_t n_ids = 15000; /* prompt ids are 200 .. 200 + n_ids - 1: set by main to the vocabulary */

static void make_prompt(prompt *p, int n, uint32_t seed) {
    p->n = n;
    for (int i = 0; i < n; i++) p->toks[i] = (int32_t)(200 + (seed * 2654435761u + i * 40503u) % n_ids);
}

static int64_t submit(rig *g, const prompt *p, int max_tokens, int n, float temp,
                      req_result *res) {
    char err[256];
    eng_params ep = {0};
    ep.prompt = p->toks, ep.n_prompt = p->n, ep.n = n, ep.ud = res;
    sampler_params_default(&ep.sp);
    ep.sp.temperature = temp;
    ep.sp.seed = 1234;
    ep.sp.max_tokens = max_tokens;
    int64_t id = eng_submit(g->eng, &ep, err, sizeof err);
    if (id < 0) fprintf(stderr, "submit: %s\n", err);
    return id;
}

static int same_outputs(const req_result *a, const req_result *b, int n) {
    for (int s = 0; s < n; s++)
        if (a->n_out[s] != b->n_out[s] ||
            memcmp(a->out[s], b->out[s], sizeof(int32_t) * (size_t)a->n_out[s]))
            return 0;
    return 1;
}

/* Each request alone, then all together in configurations that change batching,
 * caching and paging; every request's greedy tokens must not change. */
static void invariance(const model *m, const tok_t *tok, int fake, int n_req, int n_alone,
                       int max_len, int max_tokens, int small_pool) {
    static prompt P[MAX_REQ];
    static req_result alone[MAX_REQ], together[MAX_REQ];
    const char *kind = fake ? "fake" : "model";
    for (int i = 0; i < n_req; i++) make_prompt(&P[i], 1 + (int)((i * 37u + 5) % (unsigned)max_len), 77u + (uint32_t)i);
    rig g;
    memset(alone, 0, sizeof alone);
    if (rig_open(&g, m, tok, 256, 64, 1024, 32, 256, 0, fake) < 0) { CHECK(0, "rig"); return; }
    for (int i = 0; i < n_alone; i++) { /* the first n_alone requests, one at a time */
        submit(&g, &P[i], max_tokens, 1, 0.0f, &alone[i]);
        CHECK(eng_run_sync(g.eng) == 0, "%s: alone %d", kind, i);
    }
    pool_ok(&g, "alone");
    rig_close(&g);
    /* batch of 32 (prefix cache on, off), and a pool too small for all the requests at
     * once, which forces preemption */
    const struct { int blocks, prefix; const char *name; } cfgs[] = {
        {256, 1, "batched, prefix cache"}, {256, 0, "batched"}, {small_pool, 1, "small pool"}};
    for (int c = 0; c < 3; c++) {
        memset(together, 0, sizeof together);
        if (rig_open(&g, m, tok, cfgs[c].blocks, 64, 1024, 32, 256, cfgs[c].prefix, fake) < 0) {
            CHECK(0, "rig");
            return;
        }
        for (int i = 0; i < n_req; i++) submit(&g, &P[i], max_tokens, 1, 0.0f, &together[i]);
        CHECK(eng_run_sync(g.eng) == 0, "%s: %s run", kind, cfgs[c].name);
        int same = 0, pre = 0;
        for (int i = 0; i < n_req; i++) {
            if (i < n_alone) same += same_outputs(&alone[i], &together[i], 1);
            pre += together[i].usage[0].preemptions;
            CHECK(together[i].finished[0] == 1, "%s: request %d finished %d times", kind, i,
                  together[i].finished[0]);
        }
        CHECK(same == n_alone, "%s, %s: %d of %d requests identical to running alone", kind,
              cfgs[c].name, same, n_alone);
        /* with windows freed the small pool may hold them all (a sequence keeps its
         * window's KV, and the global layers' half): main runs the fake again with
         * whole pools, which preempt */
        if (c == 2 && g.kv.swa == KV_SWA_NONE) CHECK(pre > 0, "%s: the small pool preempted nothing", kind);
        printf("%s invariance (%s, %d requests): %d/%d identical to alone, %d preemptions\n",
               kind, cfgs[c].name, n_req, same, n_alone, pre);
        pool_ok(&g, cfgs[c].name);
        rig_close(&g);
    }
}

/* 10,000 requests of random shapes through a small pool: random cancels, n > 1,
 * preemptions. Every sample finishes exactly once and every block comes back. */
static void accounting(const model *m, const tok_t *tok) {
    enum { TOTAL = 10000, INFLIGHT = 48 };
    static req_result res[INFLIGHT];
    static prompt P[INFLIGHT];
    int64_t ids[INFLIGHT] = {0};
    int n_of[INFLIGHT] = {0};
    rig g;
    if (rig_open(&g, m, tok, 64, 96, 512, 16, 128, 1, 1) < 0) { CHECK(0, "rig"); return; }
    int submitted = 0, done = 0, cancels = 0, bad = 0, steps = 0;
    eng_stats st;
    while (done < TOTAL) {
        for (int k = 0; k < INFLIGHT && submitted < TOTAL; k++) { /* refill free slots */
            if (ids[k] || rnd() % 4) continue;
            memset(&res[k], 0, sizeof res[k]);
            make_prompt(&P[k], 1 + (int)(rnd() % 200), rnd() % 50); /* shared prefixes */
            n_of[k] = rnd() % 8 == 0 ? 2 + (int)(rnd() % 3) : 1;
            ids[k] = submit(&g, &P[k], 1 + (int)(rnd() % 40), n_of[k], n_of[k] > 1 ? 0.8f : 0.0f, &res[k]);
            if (ids[k] < 0) { ids[k] = 0; continue; }
            submitted++;
        }
        for (int k = 0; k < INFLIGHT; k++)
            if (ids[k] && rnd() % 64 == 0) {
                eng_cancel(g.eng, ids[k]);
                cancels++;
            }
        if (eng_step_begin(g.eng) == 1) eng_step_end(g.eng);
        if (g.kv.swa && ++steps % 16 == 0) { /* windows freed mid-flight: pages, need, units */
            char err[256] = "";
            int c = kv_check(&g.kv, err, sizeof err);
            CHECK(c == 0, "accounting: kv_check: %s", err);
            bad += c != 0;
        }
        for (int k = 0; k < INFLIGHT; k++) { /* retire finished requests */
            if (!ids[k]) continue;
            int fin = 0;
            for (int s = 0; s < n_of[k]; s++) {
                fin += res[k].finished[s] > 0;
                bad += res[k].finished[s] > 1;
            }
            if (fin == n_of[k]) ids[k] = 0, done++;
        }
        if (submitted == TOTAL && !eng_pending(g.eng) && done < TOTAL) break;
    }
    eng_get_stats(g.eng, &st);
    CHECK(done == TOTAL, "accounting: %d of %d requests finished", done, TOTAL);
    CHECK(bad == 0, "accounting: %d samples finished more than once", bad);
    if (g.kv.swa == KV_SWA_NONE) CHECK(st.preemptions > 0, "accounting: no preemption happened");
    if (g.kv.swa) CHECK(g.kv.stats.swa_freed > 0, "accounting: no windowed KV was freed");
    printf("accounting: %d requests, %d cancels, %lld preemptions, %lld steps, prefix hits %lld/%lld tokens, "
           "%llu blocks' windowed KV freed\n", done, cancels, (long long)st.preemptions, (long long)st.steps,
           (long long)st.prefix_hits, (long long)st.prefix_queries, (unsigned long long)g.kv.stats.swa_freed);
    pool_ok(&g, "accounting");
    rig_close(&g);
}

/* n = 3 samples fork the prompt's page table; sample i (seed + i) must produce what a
 * single request seeded seed + i produces: the forks' copy-on-write keeps them apart. */
static void forks(const model *m, const tok_t *tok, int fake) {
    static prompt p;
    static req_result multi, single[3];
    make_prompt(&p, 40, 31); /* 40 tokens: the last block is partial and shared */
    rig g;
    if (rig_open(&g, m, tok, 64, 16, 256, 8, 128, 1, fake) < 0) { CHECK(0, "rig"); return; }
    memset(&multi, 0, sizeof multi), memset(single, 0, sizeof single);
    char err[256];
    for (int i = 0; i < 4; i++) {
        eng_params ep = {0};
        ep.prompt = p.toks, ep.n_prompt = p.n, ep.n = i == 0 ? 3 : 1;
        ep.ud = i == 0 ? &multi : &single[i - 1];
        sampler_params_default(&ep.sp);
        ep.sp.temperature = 1.0f;
        ep.sp.seed = 1000 + (uint64_t)(i == 0 ? 0 : i - 1);
        ep.sp.max_tokens = 24;
        CHECK(eng_submit(g.eng, &ep, err, sizeof err) > 0, "forks: submit: %s", err);
        CHECK(eng_run_sync(g.eng) == 0, "forks: run");
    }
    int differ = 0;
    for (int s = 0; s < 3; s++) {
        req_result one = {0};
        memcpy(one.out[0], multi.out[s], sizeof one.out[0]);
        one.n_out[0] = multi.n_out[s];
        CHECK(same_outputs(&one, &single[s], 1), "%s forks: sample %d differs from its single run",
              fake ? "fake" : "model", s);
        CHECK(multi.finished[s] == 1, "forks: sample %d finished %d times", s, multi.finished[s]);
        differ += s > 0 && !same_outputs(&multi, &one, 1);
    }
    CHECK(differ > 0, "forks: all samples identical (seeds not applied?)");
    printf("%s forks: 3 samples equal their single-request runs, %d differ from sample 0\n",
           fake ? "fake" : "model", differ);
    pool_ok(&g, "forks");
    rig_close(&g);
}

/* Admission: the queue limits and max_seq_len give clear errors and lose nothing. */
static void admission(const model *m, const tok_t *tok) {
    static prompt p;
    static req_result r[8];
    char err[256];
    rig g;
    if (rig_open(&g, m, tok, 64, 16, 256, 8, 64, 0, 1) < 0) { CHECK(0, "rig"); return; }
    eng_free(g.eng);
    eng_config ec = {.max_batch_size = 8, .max_batched_tokens = 64, .max_seq_len = 256,
                     .max_seqs = 16, .max_queued_requests = 4, .max_queued_tokens = 250};
    eng_callbacks cb = {on_token, on_finish};
    g.eng = eng_new(&ec, m, tok, &g.kv, g.be, &cb, err, sizeof err);
    memset(r, 0, sizeof r);
    make_prompt(&p, 100, 5);
    CHECK(submit(&g, &p, 4, 1, 0.0f, &r[0]) > 0, "admission: first");
    CHECK(submit(&g, &p, 4, 1, 0.0f, &r[1]) > 0, "admission: second");
    eng_params ep = {0};
    ep.prompt = p.toks, ep.n_prompt = p.n, ep.n = 1, ep.ud = &r[2];
    sampler_params_default(&ep.sp);
    CHECK(eng_submit(g.eng, &ep, err, sizeof err) == -EAGAIN && strstr(err, "max_queued_tokens"),
          "admission: 300 queued tokens passed a limit of 250 (%s)", err);
    /* a failing step ends every sample of its requests, forks not yet made included */
    static req_result rf;
    memset(&rf, 0, sizeof rf);
    CHECK(eng_run_sync(g.eng) == 0, "admission: drain");
    make_prompt(&p, 20, 6);
    CHECK(submit(&g, &p, 4, 3, 0.7f, &rf) > 0, "admission: n=3");
    g.fake.fail_next = 1;
    CHECK(eng_run_sync(g.eng) < 0, "admission: the failed step was not reported");
    CHECK(!eng_pending(g.eng), "admission: samples left behind after a failed step");
    for (int s = 0; s < 3; s++)
        CHECK(rf.finished[s] == 1 && rf.reason[s] == EF_ERROR, "admission: sample %d finished %d times, reason %d",
              s, rf.finished[s], rf.reason[s]);
    make_prompt(&p, 300, 5);
    ep.n_prompt = p.n;
    CHECK(eng_submit(g.eng, &ep, err, sizeof err) == -E2BIG && strstr(err, "max_seq_len"),
          "admission: a 300-token prompt passed max_seq_len 256 (%s)", err);
    CHECK(eng_run_sync(g.eng) == 0, "admission: run");
    CHECK(r[0].finished[0] == 1 && r[1].finished[0] == 1, "admission: accepted requests finished");
    pool_ok(&g, "admission");
    rig_close(&g);
}

/* A paused request gets no steps while another runs to the end; resumed, it finishes
 * with the same tokens it would have produced alone (a slow reader changes nothing but
 * timing). */
static void pausing(const model *m, const tok_t *tok) {
    static prompt pa, pb;
    static req_result ra, rb, alone;
    rig g;
    if (rig_open(&g, m, tok, 64, 8, 256, 8, 64, 0, 1) < 0) { CHECK(0, "rig"); return; }
    make_prompt(&pa, 30, 71), make_prompt(&pb, 40, 72);
    memset(&ra, 0, sizeof ra), memset(&rb, 0, sizeof rb), memset(&alone, 0, sizeof alone);
    submit(&g, &pa, 12, 1, 0.0f, &alone);
    CHECK(eng_run_sync(g.eng) == 0, "pause: alone");
    int64_t a = submit(&g, &pa, 12, 1, 0.0f, &ra);
    submit(&g, &pb, 12, 1, 0.0f, &rb);
    for (int i = 0; i < 3; i++) /* a has prefilled and produced a token or two */
        if (eng_step_begin(g.eng) == 1) eng_step_end(g.eng);
    int before = ra.n_out[0];
    CHECK(before > 0, "pause: a produced nothing before the pause");
    CHECK(eng_pause(g.eng, a, 1) == 0 && eng_pause(g.eng, 999999, 1) == -ENOENT, "pause: eng_pause");
    int steps = 0;
    while (eng_step_begin(g.eng) == 1) eng_step_end(g.eng), steps++;
    CHECK(rb.finished[0] == 1, "pause: the other request did not finish while a was paused");
    CHECK(ra.n_out[0] == before && !ra.finished[0], "pause: a ran while paused (%d -> %d tokens)",
          before, ra.n_out[0]);
    CHECK(eng_pending(g.eng), "pause: a paused request is still pending");
    CHECK(eng_pause(g.eng, a, 0) == 0 && eng_run_sync(g.eng) == 0, "pause: resume");
    CHECK(ra.finished[0] == 1 && same_outputs(&ra, &alone, 1), "pause: output changed by the pause");
    pool_ok(&g, "pause");
    rig_close(&g);

    /* A pool that holds one of them: the paused (older) request yields its blocks to
     * a newer one rather than blocking it, and recomputes when resumed. */
    if (rig_open(&g, m, tok, 4, 8, 256, 8, 64, 0, 1) < 0) { CHECK(0, "rig"); return; }
    memset(&ra, 0, sizeof ra), memset(&rb, 0, sizeof rb);
    a = submit(&g, &pa, 12, 1, 0.0f, &ra);
    for (int i = 0; i < 2; i++)
        if (eng_step_begin(g.eng) == 1) eng_step_end(g.eng);
    eng_pause(g.eng, a, 1);
    submit(&g, &pb, 12, 1, 0.0f, &rb);
    while (eng_step_begin(g.eng) == 1) eng_step_end(g.eng);
    CHECK(rb.finished[0] == 1, "pause: a paused request blocked a newer one from the pool");
    CHECK(eng_pause(g.eng, a, 0) == 0 && eng_run_sync(g.eng) == 0 && ra.finished[0] == 1 &&
          same_outputs(&ra, &alone, 1), "pause: preempted while paused, then resumed: output changed");
    pool_ok(&g, "pause (small pool)");
    rig_close(&g);
}

/* The ladder's first rung: eng_set_max_batch(1) preempts every running sequence but
 * one at the next step, their blocks go back, and every request still finishes with
 * the tokens it has alone (fake backend: deterministic per token). */
static void shrinking(const model *m, const tok_t *tok) {
    static prompt p[6];
    static req_result r[6], alone[6];
    rig g;
    if (rig_open(&g, m, tok, 64, 16, 256, 8, 128, 0, 1) < 0) { CHECK(0, "rig"); return; }
    for (int i = 0; i < 6; i++) {
        make_prompt(&p[i], 20 + 7 * i, 90 + (uint32_t)i);
        memset(&alone[i], 0, sizeof alone[i]);
        submit(&g, &p[i], 10, 1, 0.0f, &alone[i]);
        CHECK(eng_run_sync(g.eng) == 0, "shrink: alone %d", i);
    }
    memset(r, 0, sizeof r);
    for (int i = 0; i < 6; i++) submit(&g, &p[i], 10, 1, 0.0f, &r[i]);
    for (int i = 0; i < 3; i++)
        if (eng_step_begin(g.eng) == 1) eng_step_end(g.eng);
    int used_before = g.kv.cfg.n_blocks - kv_free_blocks(&g.kv);
    eng_stats st;
    eng_get_stats(g.eng, &st);
    int running = st.running;
    CHECK(eng_set_max_batch(g.eng, 0) == 1 && eng_set_max_batch(g.eng, 99) == 8, "shrink: clamped");
    CHECK(eng_set_max_batch(g.eng, 1) == 1, "shrink: set 1");
    eng_stats st0, st1;
    eng_get_stats(g.eng, &st0);
    CHECK(eng_step_begin(g.eng) == 1, "shrink: a step");
    CHECK(g.fake.last_seqs == 1, "shrink: %d sequences in a batch-1 step", g.fake.last_seqs);
    eng_step_end(g.eng);
    eng_get_stats(g.eng, &st1);
    int used_after = g.kv.cfg.n_blocks - kv_free_blocks(&g.kv);
    CHECK(running > 2 && st1.preemptions - st0.preemptions == running - 1 && used_after < used_before,
          "shrink: %lld preemptions, blocks in use %d -> %d", (long long)(st1.preemptions - st0.preemptions),
          used_before, used_after);
    eng_set_max_batch(g.eng, 8);
    CHECK(eng_run_sync(g.eng) == 0, "shrink: run");
    for (int i = 0; i < 6; i++)
        CHECK(r[i].finished[0] == 1 && same_outputs(&r[i], &alone[i], 1), "shrink: request %d changed", i);
    pool_ok(&g, "shrink");
    rig_close(&g);
}

/* Fairness: client 1 queues 6 requests before client 2's one; with room for 2 at a
 * time, client 2 is admitted with client 1's first, not after all six. */
static void fairness(const model *m, const tok_t *tok) {
    static prompt p;
    static req_result r[7];
    char err[256];
    rig g;
    if (rig_open(&g, m, tok, 64, 16, 256, 2, 128, 0, 1) < 0) { CHECK(0, "rig"); return; }
    memset(r, 0, sizeof r);
    make_prompt(&p, 16, 77);
    for (int i = 0; i < 7; i++) {
        eng_params ep = {0};
        ep.prompt = p.toks, ep.n_prompt = p.n, ep.n = 1, ep.ud = &r[i], ep.client = i < 6 ? 1 : 2;
        sampler_params_default(&ep.sp);
        ep.sp.temperature = 0, ep.sp.max_tokens = 4;
        CHECK(eng_submit(g.eng, &ep, err, sizeof err) > 0, "fair: submit %d: %s", i, err);
    }
    int steps = 0;
    while (!r[6].finished[0] && eng_step_begin(g.eng) == 1) eng_step_end(g.eng), steps++;
    int done1 = 0;
    for (int i = 0; i < 6; i++) done1 += r[i].finished[0];
    CHECK(r[6].finished[0] == 1 && done1 <= 1, "fair: client 2 finished after %d of client 1's (%d steps)",
          done1, steps);
    CHECK(eng_run_sync(g.eng) == 0, "fair: run");
    pool_ok(&g, "fair");
    rig_close(&g);
}

static int64_t submit_as(rig *g, const prompt *p, int max_tokens, int client, req_result *res) {
    char err[256];
    eng_params ep = {0};
    ep.prompt = p->toks, ep.n_prompt = p->n, ep.n = 1, ep.ud = res, ep.client = client;
    ep.ignore_eog = 1; /* run to max_tokens: the long ones stay long */
    sampler_params_default(&ep.sp);
    ep.sp.temperature = 0, ep.sp.max_tokens = max_tokens;
    int64_t id = eng_submit(g->eng, &ep, err, sizeof err);
    if (id < 0) fprintf(stderr, "submit: %s\n", err);
    return id;
}

static int64_t steps_done(const rig *g) {
    eng_stats st;
    eng_get_stats(g->eng, &st);
    return st.steps;
}

/* Issue 24 (a): a prompt of 8 steps' budget is prefilling when a 4-token one arrives;
 * the short one shares the budget and has its first token within 2 steps instead of
 * after the long prefill, the long one still takes the rest of every step, and both
 * produce the tokens they produce alone (chunks of other sizes change nothing). */
static void prefill_share(const model *m, const tok_t *tok, int fake) {
    enum { T = 64, OUT = 8 };
    static prompt pl, ps;
    static req_result rl, rs, alone_l, alone_s;
    const char *kind = fake ? "fake" : "model";
    make_prompt(&pl, 8 * T, 601), make_prompt(&ps, 4, 602);
    rig g;
    if (rig_open(&g, m, tok, 64, 8, 640, 8, T, 0, fake) < 0) { CHECK(0, "rig"); return; }
    memset(&rl, 0, sizeof rl), memset(&rs, 0, sizeof rs);
    memset(&alone_l, 0, sizeof alone_l), memset(&alone_s, 0, sizeof alone_s);
    submit_as(&g, &pl, OUT, 0, &alone_l);
    CHECK(eng_run_sync(g.eng) == 0, "%s prefill share: long alone", kind);
    submit_as(&g, &ps, OUT, 0, &alone_s);
    CHECK(eng_run_sync(g.eng) == 0, "%s prefill share: short alone", kind);
    int64_t t0 = steps_done(&g);
    submit_as(&g, &pl, OUT, 0, &rl);
    if (eng_step_begin(g.eng) == 1) eng_step_end(g.eng); /* the long one is prefilling */
    int64_t t1 = steps_done(&g);
    submit_as(&g, &ps, OUT, 0, &rs);
    CHECK(eng_run_sync(g.eng) == 0, "%s prefill share: run", kind);
    int64_t wait = rs.usage[0].first_step - t1, long_first = rl.usage[0].first_step - t0;
    CHECK(rs.usage[0].first_step >= 0 && wait <= 2,
          "%s prefill share: the short prompt's first token came %lld steps after it", kind,
          (long long)wait);
    /* every step full: the long prefill plus the short one's tokens, at T a step */
    CHECK(long_first <= (pl.n + ps.n + OUT) / T + 2,
          "%s prefill share: the long prompt's first token at step %lld (budget unused?)", kind,
          (long long)long_first);
    CHECK(rl.finished[0] == 1 && rs.finished[0] == 1 && same_outputs(&rl, &alone_l, 1) &&
          same_outputs(&rs, &alone_s, 1), "%s prefill share: output differs from the solo runs", kind);
    printf("%s prefill share: %d-token prompt, then a 4-token one: its first token %lld step(s) later, "
           "the long one's at step %lld\n", kind, pl.n, (long long)wait, (long long)long_first);
    pool_ok(&g, "prefill share");
    rig_close(&g);
}

/* Issue 24 (b): client 1 fills the batch with long requests; client 2's one short
 * request gets its first token within 3 steps: client 1's youngest gives way once (and
 * only once: no thrash), recomputes, and every request produces its solo tokens. With
 * everyone client 0 ("anyone"), nothing is preempted and the newcomer waits (FIFO). */
static void batch_share(const model *m, const tok_t *tok, int fake) {
    enum { B = 4, OUT = 40 };
    static prompt p[B + 1];
    static req_result r[B + 1], alone[B + 1];
    const char *kind = fake ? "fake" : "model";
    rig g;
    if (rig_open(&g, m, tok, 128, 16, 256, B, 64, 0, fake) < 0) { CHECK(0, "rig"); return; }
    for (int i = 0; i <= B; i++) {
        make_prompt(&p[i], i < B ? 10 + i : 6, 700u + (uint32_t)i);
        memset(&alone[i], 0, sizeof alone[i]);
        submit_as(&g, &p[i], i < B ? OUT : 4, 0, &alone[i]);
        CHECK(eng_run_sync(g.eng) == 0, "%s batch share: alone %d", kind, i);
    }
    for (int anyone = 0; anyone < (fake ? 2 : 1); anyone++) {
        memset(r, 0, sizeof r);
        for (int i = 0; i < B; i++) submit_as(&g, &p[i], OUT, anyone ? 0 : 1, &r[i]);
        for (int s = 0; s < 3; s++) /* all B prefilled and decoding */
            if (eng_step_begin(g.eng) == 1) eng_step_end(g.eng);
        int64_t t1 = steps_done(&g);
        submit_as(&g, &p[B], 4, anyone ? 0 : 2, &r[B]);
        CHECK(eng_run_sync(g.eng) == 0, "%s batch share: run", kind);
        int same = 0, fin = 0, pre = 0;
        for (int i = 0; i <= B; i++) {
            same += same_outputs(&r[i], &alone[i], 1);
            fin += r[i].finished[0] == 1;
            pre += r[i].usage[0].preemptions;
        }
        int64_t wait = r[B].usage[0].first_step - t1;
        CHECK(same == B + 1 && fin == B + 1, "%s batch share%s: %d identical to alone, %d finished",
              kind, anyone ? " (client 0)" : "", same, fin);
        if (anyone) {
            CHECK(pre == 0 && wait > OUT - 3, "client 0: %d preemptions, first token after %lld steps",
                  pre, (long long)wait);
        } else {
            CHECK(wait <= 3, "%s batch share: client 2's first token came %lld steps after it", kind,
                  (long long)wait);
            CHECK(pre == 1 && r[B].usage[0].preemptions == 0,
                  "%s batch share: %d preemptions, not the one fairness preemption", kind, pre);
        }
        printf("%s batch share%s: %d long requests fill the batch, the next one's first token "
               "%lld step(s) later, %d preemption(s), all identical to alone\n", kind,
               anyone ? " (client 0)" : "", B, (long long)wait, pre);
    }
    pool_ok(&g, "batch share");
    rig_close(&g);
}

/* fair_batch: client 1 fills a batch of 8 with long requests; while client 2's 8-token
 * request runs, every step holds at most half the batch of client 1's sequences (the
 * step a newcomer pays for is its share, not the whole batch), client 1's sequences
 * take turns (none waits more than 2 steps between tokens), client 1 has the whole
 * batch again once client 2 is done, and every request produces its solo tokens.
 * Without fair_batch the same steps carry the whole batch. */
static void step_share(const model *m, const tok_t *tok, int fair) {
    enum { B = 8, OUT = 40, SHORT = 8 };
    static prompt p[B + 1];
    static req_result r[B + 1], alone[B + 1];
    const char *kind = fair ? "step share" : "step share (fair_batch off)";
    rig g;
    rig_fair = fair;
    int opened = rig_open(&g, m, tok, 128, 16, 256, B, 64, 0, 1);
    rig_fair = 0;
    if (opened < 0) { CHECK(0, "rig"); return; }
    for (int i = 0; i <= B; i++) {
        make_prompt(&p[i], i < B ? 10 + i : 6, 900u + (uint32_t)i);
        memset(&alone[i], 0, sizeof alone[i]), memset(&r[i], 0, sizeof r[i]);
        submit_as(&g, &p[i], i < B ? OUT : SHORT, 0, &alone[i]);
        CHECK(eng_run_sync(g.eng) == 0, "%s: alone %d", kind, i);
    }
    for (int i = 0; i < B; i++) submit_as(&g, &p[i], OUT, 1, &r[i]);
    for (int s = 0; s < 3; s++) /* all B prefilled and decoding */
        if (eng_step_begin(g.eng) == 1) eng_step_end(g.eng);
    int64_t t1 = steps_done(&g);
    submit_as(&g, &p[B], SHORT, 2, &r[B]);
    int widest = 0, after = 0, steps = 0;
    while (!r[B].finished[0] && eng_step_begin(g.eng) == 1) {
        eng_step_end(g.eng), steps++;
        if (g.fake.last_seqs > widest) widest = g.fake.last_seqs;
    }
    if (eng_step_begin(g.eng) == 1) eng_step_end(g.eng), after = g.fake.last_seqs;
    CHECK(eng_run_sync(g.eng) == 0, "%s: run", kind);
    int same = 0, fin = 0, gap = 0;
    for (int i = 0; i <= B; i++) {
        same += same_outputs(&r[i], &alone[i], 1);
        fin += r[i].finished[0] == 1;
        if (i < B && !r[i].usage[0].preemptions && r[i].usage[0].max_step_gap > gap)
            gap = r[i].usage[0].max_step_gap;
    }
    CHECK(same == B + 1 && fin == B + 1, "%s: %d identical to alone, %d finished", kind, same, fin);
    int64_t wait = r[B].usage[0].first_step - t1;
    if (fair) {
        CHECK(widest <= B / 2 + 1, "%s: a step held %d sequences while client 2 ran", kind, widest);
        CHECK(wait <= 3 && steps <= SHORT + 3, "%s: client 2's first token %lld steps later, done in %d",
              kind, (long long)wait, steps);
        CHECK(gap <= 2, "%s: a sequence of client 1 waited %d steps between tokens", kind, gap);
        CHECK(after == B - 1 || after == B, "%s: %d sequences in the step after, not the batch", kind, after);
    } else {
        CHECK(widest == B, "%s: the widest step held %d sequences, not the batch", kind, widest);
    }
    printf("%s: client 1 fills a batch of %d; while client 2's %d tokens ran (%d steps, first after "
           "%lld) steps held at most %d sequences; then %d; client 1's longest gap %d steps\n", kind, B,
           SHORT, steps, (long long)wait, widest, after, gap);
    pool_ok(&g, "step share");
    rig_close(&g);
}

/* A fake-backend rig with fair_batch and itl_target_ms = target (sequences of up to 256
 * tokens, no prefix cache); -1 (said) when it cannot be made. */
static int fair_rig(rig *g, const model *m, const tok_t *tok, int n_blocks, int max_seqs, int batch,
                    int tokens, int target) {
    rig_fair = 1, rig_itl = target;
    int r = rig_open(g, m, tok, n_blocks, max_seqs, 256, batch, tokens, 0, 1);
    rig_fair = 0, rig_itl = 0;
    if (r < 0) CHECK(0, "rig");
    return r;
}

/* itl_target_ms: client 1 decodes a short request; client 2 sends a 200-token prompt.
 * Its share of a step (32 of 64 tokens) deep in its prompt would make each of client
 * 1's steps cost several times a decode's; with the target (the default: 2x the step
 * without the prefill, predicted by the cost model the steps taught), every step that
 * carries both takes at most that (but the first: client 2 had nothing running), the
 * prompt still advancing by at least an eighth of its share (its last chunk is what is
 * left); with a target of 3 ms, at most 3 ms; with none, the whole share. Every output
 * equals its solo run: chunking changes no token. */
static void itl_share(const model *m, const tok_t *tok, int target) {
    enum { OUT = 64, LONG = 200, SHARE = 32 };
    static prompt p[2];
    static req_result r[2], alone[2];
    char kind[64];
    snprintf(kind, sizeof kind, "itl target %d", target);
    rig g;
    if (fair_rig(&g, m, tok, 128, 16, 8, 2 * SHARE, target) < 0) return;
    for (int i = 0; i < 2; i++) {
        make_prompt(&p[i], i ? LONG : 8, 700u + (uint32_t)i);
        memset(&alone[i], 0, sizeof alone[i]), memset(&r[i], 0, sizeof r[i]);
        submit_as(&g, &p[i], i ? 4 : OUT, 0, &alone[i]);
        CHECK(eng_run_sync(g.eng) == 0, "%s: alone %d", kind, i);
    }
    submit_as(&g, &p[0], OUT, 1, &r[0]);
    for (int s = 0; s < 12; s++) /* client 1 decoding, the cost model taught */
        if (eng_step_begin(g.eng) == 1) eng_step_end(g.eng);
    submit_as(&g, &p[1], 4, 2, &r[1]);
    int mixed = 0, over = 0, widest = 0, narrowest = INT_MAX, first = 0;
    double worst = 0;
    while (!r[1].n_out[0] && !r[0].finished[0] && eng_step_begin(g.eng) == 1) {
        eng_step_end(g.eng);
        int chunk = g.fake.last_tokens - 1; /* client 1's decode is the other token */
        if (chunk < 1) continue;
        if (!first) { /* client 2 had nothing running: its first chunk is not cut */
            first = chunk;
            continue;
        }
        int dec_pos = p[0].n + r[0].n_out[0] - 2; /* the decode's position (its token is out) */
        double alone_ms = FAKE_MS(1, dec_pos), lim = target > 0 ? target : 2 * alone_ms;
        double ratio = g.fake.last_ms / alone_ms;
        mixed++;
        worst = ratio > worst ? ratio : worst;
        over += g.fake.last_ms > lim * 1.02 && chunk > SHARE / 8;
        widest = chunk > widest ? chunk : widest;
        if (!r[1].n_out[0]) narrowest = chunk < narrowest ? chunk : narrowest; /* not the rest */
    }
    CHECK(eng_run_sync(g.eng) == 0, "%s: run", kind);
    CHECK(same_outputs(&r[0], &alone[0], 1) && same_outputs(&r[1], &alone[1], 1) &&
          r[0].finished[0] == 1 && r[1].finished[0] == 1, "%s: outputs equal their solo runs", kind);
    CHECK(r[1].n_out[0] == 4 && mixed >= LONG / SHARE - 1, "%s: %d steps carried both, the prompt done",
          kind, mixed);
    CHECK(first == SHARE, "%s: the newcomer's first chunk %d, not its share %d", kind, first, SHARE);
    if (target < 0) {
        CHECK(widest == SHARE && narrowest == SHARE, "%s: chunks of %d..%d tokens, not the share %d",
              kind, narrowest, widest, SHARE);
    } else {
        CHECK(over == 0, "%s: %d steps beside client 1's decode took more than the target", kind, over);
        CHECK(widest < SHARE && narrowest >= SHARE / 8, "%s: chunks of %d..%d tokens (share %d, floor %d)",
              kind, narrowest, widest, SHARE, SHARE / 8);
    }
    printf("%s: a %d-token prompt beside another client's decode in %d steps of %d..%d tokens, "
           "at most %.1fx the decode's step\n", kind, LONG, mixed, narrowest, widest, worst);
    pool_ok(&g, kind);
    rig_close(&g);
}

/* itl_target_ms and decodes: client 1 runs 32 streams in a batch of 32 (its share
 * beside another client: 16), client 2 one. Every step client 2 decodes in first takes
 * one of each (the balanced step), then client 1's others only while the step stays
 * within 2x that; without a target, client 1's whole share. Client 1's streams take
 * turns (none waits long), and every output equals its solo run. */
static void decode_balance(const model *m, const tok_t *tok, int target) {
    enum { B = 32, OUT = 40, SHORT = 12 };
    static prompt p[B + 1];
    static req_result r[B + 1], alone[B + 1];
    char kind[64];
    snprintf(kind, sizeof kind, "decode balance, target %d", target);
    rig g;
    if (fair_rig(&g, m, tok, 256, 64, B, 64, target) < 0) return;
    for (int i = 0; i <= B; i++) {
        make_prompt(&p[i], 6 + i % 5, 500u + (uint32_t)i);
        memset(&alone[i], 0, sizeof alone[i]), memset(&r[i], 0, sizeof r[i]);
        submit_as(&g, &p[i], i < B ? OUT : SHORT, 0, &alone[i]);
        CHECK(eng_run_sync(g.eng) == 0, "%s: alone %d", kind, i);
    }
    for (int i = 0; i < B; i++) submit_as(&g, &p[i], OUT, 1, &r[i]);
    for (int s = 0; s < 3; s++)
        if (eng_step_begin(g.eng) == 1) eng_step_end(g.eng);
    submit_as(&g, &p[B], SHORT, 2, &r[B]);
    int widest = 0, over = 0, steps = 0;
    while (!r[B].finished[0] && eng_step_begin(g.eng) == 1) {
        int before = r[B].n_out[0];
        eng_step_end(g.eng);
        if (!before || r[B].n_out[0] == before) continue; /* the steps client 2 decoded in */
        steps++;
        int heavy = g.fake.last_seqs - 1;
        widest = heavy > widest ? heavy : widest;
        /* the balanced step, one of each: at most this (client 1's streams are at most
         * 10 + OUT deep) */
        double balanced = FAKE_MS(2, p[B].n + r[B].n_out[0] + 10 + OUT);
        over += g.fake.last_ms > 2 * balanced;
    }
    CHECK(eng_run_sync(g.eng) == 0, "%s: run", kind);
    int same = 0, gap = 0;
    for (int i = 0; i <= B; i++) {
        same += same_outputs(&r[i], &alone[i], 1);
        if (i < B && !r[i].usage[0].preemptions && r[i].usage[0].max_step_gap > gap)
            gap = r[i].usage[0].max_step_gap;
    }
    CHECK(same == B + 1, "%s: %d of %d identical to alone", kind, same, B + 1);
    CHECK(steps >= SHORT - 2, "%s: client 2 decoded in %d steps", kind, steps);
    if (target < 0) {
        CHECK(widest == B / 2, "%s: client 1 had up to %d sequences in a step, not its share %d", kind,
              widest, B / 2);
    } else {
        CHECK(over == 0 && widest < B / 2 && widest >= 1, "%s: client 1 had up to %d in a step, %d steps "
              "over 2x the balanced one", kind, widest, over);
        CHECK(gap <= B / widest + 2, "%s: a stream of client 1 waited %d steps", kind, gap);
    }
    printf("%s: beside one stream, a client of %d held up to %d sequences a step; its streams' "
           "longest gap %d steps\n", kind, B, widest, gap);
    pool_ok(&g, kind);
    rig_close(&g);
}

/* itl_target_ms and a first token: client 1's 240-token prompt prefills alone (the whole
 * budget a step); client 2's 8-token prompt arrives. The step that prefills it also
 * carries a chunk of client 1's, cut to what 2x the least step leaves (without a target:
 * the share, 32); client 2's first token comes from that step. */
static void itl_first(const model *m, const tok_t *tok, int target) {
    enum { LONG = 240, SHARE = 32 };
    static prompt p[2];
    static req_result r[2], alone[2];
    char kind[64];
    snprintf(kind, sizeof kind, "itl first token, target %d", target);
    rig g;
    if (fair_rig(&g, m, tok, 128, 16, 8, 2 * SHARE, target) < 0) return;
    for (int i = 0; i < 2; i++) { /* also what teaches the cost model */
        make_prompt(&p[i], i ? 8 : LONG, 600u + (uint32_t)i);
        memset(&alone[i], 0, sizeof alone[i]), memset(&r[i], 0, sizeof r[i]);
        submit_as(&g, &p[i], 2, 0, &alone[i]);
        CHECK(eng_run_sync(g.eng) == 0, "%s: alone %d", kind, i);
    }
    submit_as(&g, &p[0], 2, 1, &r[0]);
    for (int s = 0; s < 2; s++)
        if (eng_step_begin(g.eng) == 1) eng_step_end(g.eng);
    int64_t t1 = steps_done(&g);
    submit_as(&g, &p[1], 2, 2, &r[1]);
    int other = -1;
    if (eng_step_begin(g.eng) == 1) eng_step_end(g.eng), other = g.fake.last_tokens - p[1].n;
    CHECK(eng_run_sync(g.eng) == 0, "%s: run", kind);
    CHECK(same_outputs(&r[0], &alone[0], 1) && same_outputs(&r[1], &alone[1], 1),
          "%s: outputs equal their solo runs", kind);
    CHECK(r[1].usage[0].first_step == t1 + 1, "%s: client 2's first token in step %lld after it came",
          kind, (long long)(r[1].usage[0].first_step - t1));
    if (target < 0) CHECK(other == SHARE, "%s: client 1 had %d tokens in that step, not %d", kind, other, SHARE);
    else CHECK(other >= SHARE / 8 && other < SHARE / 2, "%s: client 1 had %d tokens in that step", kind, other);
    printf("%s: an 8-token prompt beside a long one: its first token in the next step, which "
           "held %d of the long one's tokens\n", kind, other);
    pool_ok(&g, kind);
    rig_close(&g);
}

/* The same when the KV pool, not the batch, is what client 1 fills: 4 requests hold
 * all 20 blocks (5 each) of a batch of 8; client 2's arrival does not fit, so at the
 * next step client 1's youngest gives way, once, and client 2's first token comes
 * within 3 steps rather than when one of client 1's ends (11 steps later). */
static void kv_share(const model *m, const tok_t *tok) {
    enum { N = 4, OUT = 60 };
    static prompt p[N + 1];
    static req_result r[N + 1], alone[N + 1];
    rig g;
    rig_whole = 1; /* windows would free blocks: the pool must fill */
    int r_open = rig_open(&g, m, tok, 20, 16, 256, 8, 64, 0, 1);
    rig_whole = 0;
    if (r_open < 0) { CHECK(0, "rig"); return; }
    for (int i = 0; i <= N; i++) {
        make_prompt(&p[i], i < N ? 16 : 20, 800u + (uint32_t)i);
        memset(&alone[i], 0, sizeof alone[i]), memset(&r[i], 0, sizeof r[i]);
        submit_as(&g, &p[i], i < N ? OUT : 4, 0, &alone[i]);
        CHECK(eng_run_sync(g.eng) == 0, "kv share: alone %d", i);
    }
    for (int i = 0; i < N; i++) submit_as(&g, &p[i], OUT, 1, &r[i]);
    for (int s = 0; s < 50; s++) /* 66 tokens each: 5 blocks, the whole pool */
        if (eng_step_begin(g.eng) == 1) eng_step_end(g.eng);
    CHECK(kv_free_blocks(&g.kv) == 0, "kv share: %d blocks free, not a full pool", kv_free_blocks(&g.kv));
    int64_t t1 = steps_done(&g);
    submit_as(&g, &p[N], 4, 2, &r[N]);
    CHECK(eng_run_sync(g.eng) == 0, "kv share: run");
    int same = 0, fin = 0, pre = 0;
    for (int i = 0; i <= N; i++) {
        same += same_outputs(&r[i], &alone[i], 1);
        fin += r[i].finished[0] == 1;
        pre += r[i].usage[0].preemptions;
    }
    int64_t wait = r[N].usage[0].first_step - t1;
    CHECK(same == N + 1 && fin == N + 1, "kv share: %d identical to alone, %d finished", same, fin);
    CHECK(wait <= 3 && pre == 1, "kv share: client 2's first token %lld steps later, %d preemptions",
          (long long)wait, pre);
    printf("kv share: %d requests fill the pool, the next one's first token %lld step(s) later, "
           "%d preemption(s), all identical to alone\n", N, (long long)wait, pre);
    pool_ok(&g, "kv share");
    rig_close(&g);
}

/* A 512-token prefix computed once is reused by the next request. */
static void prefix_reuse(const model *m, const tok_t *tok) {
    static prompt a, b;
    static req_result ra, rb;
    make_prompt(&a, 512, 9);
    make_prompt(&b, 532, 9); /* the same 512 tokens, then 20 more */
    rig g;
    if (rig_open(&g, m, tok, 128, 8, 1024, 8, 256, 1, 0) < 0) { CHECK(0, "rig"); return; }
    memset(&ra, 0, sizeof ra), memset(&rb, 0, sizeof rb);
    submit(&g, &a, 1, 1, 0.0f, &ra);
    CHECK(eng_run_sync(g.eng) == 0, "prefix: first");
    submit(&g, &b, 1, 1, 0.0f, &rb);
    CHECK(eng_run_sync(g.eng) == 0, "prefix: second");
    int cached = rb.usage[0].cached_tokens;
    CHECK(ra.usage[0].cached_tokens == 0, "prefix: the first request found %d cached", ra.usage[0].cached_tokens);
    CHECK(512 - cached <= 51, "prefix: the second request recomputed %d of 512 shared tokens", 512 - cached);
    printf("prefix cache: second request reused %d of 512 shared tokens\n", cached);
    pool_ok(&g, "prefix");
    rig_close(&g);
}

/* 16 streams decode; a long prompt arrives; no stream waits more than 2 steps. */
static void stall_bound(const model *m, const tok_t *tok, int long_len) {
    static prompt p[17];
    static req_result r[17];
    rig g;
    memset(r, 0, sizeof r);
    if (rig_open(&g, m, tok, 64 + (long_len + 64) / 16, 32, long_len + 64, 32, 256, 0, 0) < 0) {
        CHECK(0, "rig");
        return;
    }
    for (int i = 0; i < 16; i++) {
        make_prompt(&p[i], 8 + i, 500u + (uint32_t)i);
        submit(&g, &p[i], 40, 1, 0.0f, &r[i]);
    }
    for (int s = 0; s < 3; s++) /* all 16 prefilled and decoding */
        if (eng_step_begin(g.eng) == 1) eng_step_end(g.eng);
    make_prompt(&p[16], long_len, 4242);
    submit(&g, &p[16], 4, 1, 0.0f, &r[16]);
    CHECK(eng_run_sync(g.eng) == 0, "stall: run");
    int worst = 0;
    for (int i = 0; i < 16; i++)
        if (r[i].usage[0].max_step_gap > worst) worst = r[i].usage[0].max_step_gap;
    CHECK(worst <= 2, "stall: a stream waited %d steps between tokens", worst);
    CHECK(r[16].usage[0].first_step >= 3 + long_len / 256,
          "stall: the long prompt was not chunked (first token at step %lld)",
          (long long)r[16].usage[0].first_step);
    printf("stall bound: %d-token prompt among 16 streams: worst gap %d step(s), its first token at step %lld\n",
           long_len, worst, (long long)r[16].usage[0].first_step);
    pool_ok(&g, "stall");
    rig_close(&g);
}

int main(void) {
    static model m;
    static tok_t tok;
    if (fixture_load(&m, &tok, "test_engine") < 0) return 1;
    if (m.cfg.n_vocab < 200 + (int)n_ids) n_ids = (uint32_t)m.cfg.n_vocab - 200; /* a tiny model's */
    invariance(&m, &tok, 1, 32, 32, 300, 40, 40);
    accounting(&m, &tok);
    if (m.cfg.swa_window > 0) { /* and with pools that keep every block, as before windows */
        rig_whole = 1;
        invariance(&m, &tok, 1, 32, 32, 300, 40, 40);
        accounting(&m, &tok);
        rig_whole = 0;
        if (m.cfg.n_layers >= 4) { /* and a gone block keeping a quarter (Gemma 3's) */
            rig_quarters = 1;
            invariance(&m, &tok, 1, 32, 32, 300, 40, 40);
            accounting(&m, &tok);
            rig_quarters = 0;
        }
    }
    forks(&m, &tok, 1);
    admission(&m, &tok);
    rig_whole = 1; /* pausing's second half needs a pool that fills */
    pausing(&m, &tok);
    rig_whole = 0;
    shrinking(&m, &tok);
    fairness(&m, &tok);
    prefill_share(&m, &tok, 1);
    batch_share(&m, &tok, 1);
    kv_share(&m, &tok);
    step_share(&m, &tok, 1);
    step_share(&m, &tok, 0);
    itl_share(&m, &tok, 0);
    itl_share(&m, &tok, 3);
    itl_share(&m, &tok, -1);
    itl_first(&m, &tok, 0);
    itl_first(&m, &tok, -1);
    decode_balance(&m, &tok, 0);
    decode_balance(&m, &tok, -1);
    forks(&m, &tok, 0);
    prefill_share(&m, &tok, 0);
    if (!SLOW) batch_share(&m, &tok, 0);
    /* real model: 32 requests together, 8 of them also alone (the sanitizer build runs
     * a smaller set); pools of 40 / 12 blocks cannot hold them all at once */
    invariance(&m, &tok, 0, SLOW ? 8 : 32, SLOW ? 3 : 8, SLOW ? 48 : 96, SLOW ? 6 : 12,
               SLOW ? 12 : 40);
    prefix_reuse(&m, &tok);
    stall_bound(&m, &tok, SLOW ? 600 : 2000);
    tok_free(&tok);
    model_free(&m);
    return check_done("engine");
}
