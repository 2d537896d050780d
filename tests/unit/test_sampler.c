/* test_sampler: greedy, reproducibility, top_k/top_p/min_p, the distribution itself,
 * penalties, sampler_init_with's memory made beforehand, logprobs, stop ids / max_tokens,
 * and stop strings across token splits. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/sampler.h"
#include "tests/unit/check.h"

#define NV 49152

static float logits[NV], work[NV];

/* Deterministic pseudo-logits with a realistic spread. */
static void fill_logits(float *x, int n, uint32_t seed) {
    uint32_t h = seed * 2654435761u + 1;
    for (int i = 0; i < n; i++) {
        h ^= h << 13, h ^= h >> 17, h ^= h << 5;
        x[i] = (float)(h % 20000) / 1000.0f - 10.0f; /* [-10, 10) */
    }
}

static int32_t sample_copy(sampler *s, const float *x, int n, float *lp) {
    memcpy(work, x, (size_t)n * sizeof *x);
    return sampler_sample(s, work, lp);
}

/* ---------------------------------------------------------------- greedy */

static void test_greedy(void) {
    sampler s;
    sampler_params p;
    sampler_params_default(&p);
    p.temperature = 0;
    CHECK(sampler_init(&s, &p, NV) == 0, "init");
    fill_logits(logits, NV, 1);
    int32_t best = 0;
    for (int i = 1; i < NV; i++)
        if (logits[i] > logits[best]) best = i;
    CHECK(sample_copy(&s, logits, NV, NULL) == best, "argmax");

    float t[6] = {1, 5, 2, 5, 5, -1};
    sampler_free(&s);
    CHECK(sampler_init(&s, &p, 6) == 0, "init 6");
    memcpy(work, t, sizeof t);
    CHECK(sampler_sample(&s, work, NULL) == 1, "tie via the sampler");
    float u[3] = {-INFINITY, -INFINITY, -INFINITY};
    sampler_free(&s);
    p.temperature = 0.8f;
    CHECK(sampler_init(&s, &p, 3) == 0, "init 3");
    CHECK(sampler_sample(&s, u, NULL) == 0, "all -inf: no crash, index 0");
    sampler_free(&s);

    /* top_k = 1 is greedy, whatever the temperature and seed. */
    p.temperature = 1.5f;
    p.top_k = 1;
    p.seed = 99;
    CHECK(sampler_init(&s, &p, NV) == 0, "init");
    for (int r = 0; r < 20; r++) {
        fill_logits(logits, NV, 100 + (uint32_t)r);
        logits[777] = logits[555] = 50; /* tie at the top */
        CHECK(sample_copy(&s, logits, NV, NULL) == 555, "top_k=1 round %d", r);
    }
    sampler_free(&s);
}

/* ---------------------------------------------------------------- seeds */

static void run_seq(const sampler_params *p, int32_t *out, int n) {
    sampler s;
    CHECK(sampler_init(&s, p, NV) == 0, "init");
    for (int i = 0; i < n; i++) {
        fill_logits(logits, NV, 7 + (uint32_t)i);
        for (int j = 0; j < NV; j++) logits[j] *= 0.3f; /* flatter: many candidates */
        out[i] = sample_copy(&s, logits, NV, NULL);
        sampler_accept(&s, out[i], 0);
    }
    sampler_free(&s);
}

static void test_seed(void) {
    sampler_params p;
    sampler_params_default(&p);
    p.seed = 12345;
    p.top_p = 0.95f;
    p.repeat_penalty = 1.1f;
    p.repeat_last_n = 64;
    p.frequency_penalty = 0.2f;
    int32_t a[64], b[64], c[64];
    run_seq(&p, a, 64);
    run_seq(&p, b, 64);
    CHECK(memcmp(a, b, sizeof a) == 0, "same seed, same tokens");
    p.seed = 12346;
    run_seq(&p, c, 64);
    CHECK(memcmp(a, c, sizeof a) != 0, "another seed, other tokens");

    sampler s1, s2;
    p.seed = 0;
    CHECK(sampler_init(&s1, &p, 10) == 0 && s1.seed != 0, "random seed recorded");
    p.seed = s1.seed;
    CHECK(sampler_init(&s2, &p, 10) == 0 && memcmp(s1.rng, s2.rng, sizeof s1.rng) == 0,
          "the recorded seed reproduces the run");
    sampler_free(&s1);
    sampler_free(&s2);
}

/* ---------------------------------------------------------------- distribution */

/* Draw N from softmax(x / T) with filters; compare counts with the expected
 * probabilities q (already filtered and renormalized): each within 5 standard errors,
 * and tokens with q = 0 never drawn. */
static void check_freq(const sampler_params *p, const float *x, const double *q, int n,
                       const char *what) {
    enum { N = 20000 };
    int count[16] = {0};
    sampler s;
    CHECK(sampler_init(&s, p, n) == 0, "init");
    for (int i = 0; i < N; i++) {
        float w[16];
        memcpy(w, x, (size_t)n * sizeof *x);
        int32_t t = sampler_sample(&s, w, NULL);
        CHECK(t >= 0 && t < n, "token %d in range", t);
        if (t >= 0 && t < n) count[t]++;
    }
    for (int i = 0; i < n; i++) {
        double want = q[i] * N, se = sqrt(N * q[i] * (1 - q[i]));
        if (q[i] == 0)
            CHECK(count[i] == 0, "%s: token %d drawn %d times, excluded", what, i, count[i]);
        else
            CHECK(fabs(count[i] - want) <= 5 * se + 1,
                  "%s: token %d: %d drawn, %.0f expected (se %.1f)", what, i, count[i], want, se);
    }
    sampler_free(&s);
}

static void softmax(const float *x, int n, float t, double *q) {
    double z = 0, m = x[0];
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int i = 0; i < n; i++) z += q[i] = exp((x[i] - m) / t);
    for (int i = 0; i < n; i++) q[i] /= z;
}

/* Keep only mask[i] tokens and renormalize. */
static void restrict_to(double *q, const int *keep, int n) {
    double z = 0;
    for (int i = 0; i < n; i++) z += q[i] = keep[i] ? q[i] : 0;
    for (int i = 0; i < n; i++) q[i] /= z;
}

static void test_distribution(void) {
    /* At T=1, sorted: token 1 .393, 3 .238, 7 .145, 0 .088, 4 .053, 2 .032, ... */
    const float x[10] = {0.5f, 2.0f, -0.5f, 1.5f, 0.0f, -1.0f, -1.5f, 1.0f, -1.5f, -2.0f};
    double q[10];
    sampler_params p;
    sampler_params_default(&p);
    p.seed = 42;
    softmax(x, 10, 1.0f, q);
    check_freq(&p, x, q, 10, "T=1");

    p.temperature = 0.5f;
    softmax(x, 10, 0.5f, q);
    check_freq(&p, x, q, 10, "T=0.5");

    /* top_k = 3: tokens 1, 3, 7 only. */
    p.temperature = 1.0f;
    p.top_k = 3;
    softmax(x, 10, 1.0f, q);
    int k3[10] = {[1] = 1, [3] = 1, [7] = 1};
    restrict_to(q, k3, 10);
    check_freq(&p, x, q, 10, "top_k=3");

    /* top_p = 0.8: cumulative .393 .632 .777 (< .8) .865 -> nucleus {1, 3, 7, 0}. */
    p.top_k = 0;
    p.top_p = 0.8f;
    softmax(x, 10, 1.0f, q);
    int np[10] = {[0] = 1, [1] = 1, [3] = 1, [7] = 1};
    restrict_to(q, np, 10);
    check_freq(&p, x, q, 10, "top_p=0.8");

    /* min_p = 0.3: keep p >= 0.3 * p_max, i.e. logit >= 2 + ln 0.3 = 0.796: {1, 3, 7}. */
    p.top_p = 1.0f;
    p.min_p = 0.3f;
    softmax(x, 10, 1.0f, q);
    restrict_to(q, k3, 10);
    check_freq(&p, x, q, 10, "min_p=0.3");

    /* top_k = 5, then top_p = 0.9 of the renormalized five: cumulative .429 .689 .847
     * (< .9) .942 -> {1, 3, 7, 0}; then min_p = 0.25 drops 0 (e^-1.5 = .22 < .25). */
    p.min_p = 0;
    p.top_k = 5;
    p.top_p = 0.9f;
    softmax(x, 10, 1.0f, q);
    restrict_to(q, np, 10);
    check_freq(&p, x, q, 10, "top_k=5 top_p=0.9");
    p.min_p = 0.25f;
    softmax(x, 10, 1.0f, q);
    restrict_to(q, k3, 10);
    check_freq(&p, x, q, 10, "top_k=5 top_p=0.9 min_p=0.25");
}

static const double *qsort_key;
static int by_q_desc(const void *a, const void *b) {
    double x = qsort_key[*(const int *)a], y = qsort_key[*(const int *)b];
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The big-vocabulary paths: a full-vocab top_p (threshold window) never picks outside
 * the true nucleus, and top_k never outside the true top k. */
static void test_big_vocab_filters(void) {
    sampler s;
    sampler_params p;
    sampler_params_default(&p);
    p.seed = 7;
    p.top_p = 0.9f;
    CHECK(sampler_init(&s, &p, NV) == 0, "init");
    static double q[NV];
    static int order[NV];
    for (int r = 0; r < 4; r++) {
        fill_logits(logits, NV, 300 + (uint32_t)r);
        float scale = r == 3 ? 0.05f : 0.6f; /* r=3: nearly flat, the window must widen */
        for (int i = 0; i < NV; i++) logits[i] *= scale;
        softmax(logits, NV, 1.0f, q);
        /* The reference nucleus by a full sort in double precision. */
        for (int i = 0; i < NV; i++) order[i] = i;
        qsort_key = q;
        qsort(order, NV, sizeof *order, by_q_desc);
        double acc = 0;
        int nn = 0;
        while (nn < NV && acc < 0.9) acc += q[order[nn++]];
        /* float vs double sums may move the edge by a few ranks; the tail stays out */
        int edge = nn + 50 < NV ? nn + 50 : NV;
        double qmin = q[order[edge - 1]];
        CHECK(edge < NV * 95 / 100, "round %d: the tail is a real test (%d of %d)", r, edge, NV);
        int bad = 0;
        for (int t = 0; t < (r == 3 ? 20 : 300); t++) {
            int32_t tok = sample_copy(&s, logits, NV, NULL);
            bad += q[tok] < qmin * 0.999999;
        }
        CHECK(bad == 0, "round %d: %d draws outside the nucleus of %d tokens", r, bad, nn);
    }
    sampler_free(&s);

    p.top_p = 1.0f;
    p.top_k = 40;
    p.temperature = 2.0f;
    CHECK(sampler_init(&s, &p, NV) == 0, "init");
    fill_logits(logits, NV, 999);
    float sorted[NV];
    memcpy(sorted, logits, sizeof sorted);
    /* 40th largest value */
    float kth = -INFINITY;
    for (int k = 0; k < 40; k++) {
        int bi = 0;
        for (int i = 1; i < NV; i++)
            if (sorted[i] > sorted[bi]) bi = i;
        kth = sorted[bi];
        sorted[bi] = -INFINITY;
    }
    int bad = 0, distinct = 0;
    static char seen[NV];
    for (int t = 0; t < 2000; t++) {
        int32_t tok = sample_copy(&s, logits, NV, NULL);
        bad += logits[tok] < kth;
        distinct += !seen[tok];
        seen[tok] = 1;
    }
    CHECK(bad == 0 && distinct > 20 && distinct <= 40, "top_k=40: %d outside, %d distinct", bad,
          distinct);
    sampler_free(&s);
}

/* The nucleus cut inside a run of equal logits keeps the lowest ids, like a stable
 * sort would; and a temperature too small for float is greedy. */
static void test_ties_and_tiny_t(void) {
    enum { V = 1000 };
    static float flat[V];
    sampler s;
    sampler_params p;
    sampler_params_default(&p);
    p.seed = 3;
    p.top_p = 0.0105f; /* 11 of 1000 equal tokens */
    CHECK(sampler_init(&s, &p, V) == 0, "init");
    int seen[V] = {0}, out = 0;
    for (int t = 0; t < 3000; t++) {
        memset(flat, 0, sizeof flat);
        int32_t tok = sampler_sample(&s, flat, NULL);
        if (tok > 10) out++;
        else seen[tok]++;
    }
    int all = 1;
    for (int i = 0; i <= 10; i++) all = all && seen[i] > 0;
    CHECK(out == 0 && all, "tied nucleus: %d draws outside tokens 0..10, all seen %d", out, all);
    sampler_free(&s);

    sampler_params_default(&p);
    p.temperature = 1e-40f;
    CHECK(sampler_init(&s, &p, 4) == 0, "init");
    float x[4] = {0.5f, 3, 3, 1};
    CHECK(sampler_sample(&s, x, NULL) == 1, "denormal temperature is greedy");
    sampler_free(&s);
}

/* ---------------------------------------------------------------- penalties, logprob */

static void test_penalties(void) {
    sampler s;
    sampler_params p;
    sampler_params_default(&p);
    p.temperature = 0;
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 4;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    CHECK(sampler_init(&s, &p, 8) == 0, "init");
    sampler_accept(&s, 1, 1); /* prompt: repetition only; will leave the window */
    sampler_accept(&s, 2, 1); /* prompt */
    sampler_accept(&s, 3, 0);
    sampler_accept(&s, 3, 0);
    sampler_accept(&s, 4, 0);
    sampler_accept(&s, 5, 1); /* prompt; the 4-token window is now 3 3 4 5 */
    float x[8] = {1, 2, 4, -2, 3, -1, 6, 0.5f};
    sampler_sample(&s, x, NULL);
    CHECK(x[0] == 1, "untouched: %g", x[0]);
    CHECK(x[1] == 2, "left the window, prompt so no presence: %g", x[1]);
    CHECK(x[2] == 4, "out of the 4-token window: %g", x[2]);
    /* token 3: window (negative: * 2 once, not per occurrence), presence .5, freq 2*.25 */
    CHECK(fabsf(x[3] - (-2 * 2 - 0.5f - 0.5f)) < 1e-6f, "token 3: %g", x[3]);
    CHECK(fabsf(x[4] - (3 / 2.0f - 0.5f - 0.25f)) < 1e-6f, "token 4: %g", x[4]);
    CHECK(fabsf(x[5] - (-1 * 2.0f)) < 1e-6f, "token 5 (prompt, in window): %g", x[5]);
    CHECK(x[6] == 6 && x[7] == 0.5f, "untouched");
    /* Penalties apply once per sample call: sampling again with fresh logits gives the
     * same result (the count marks were restored). */
    float y[8] = {1, 2, 4, -2, 3, -1, 6, 0.5f};
    sampler_sample(&s, y, NULL);
    CHECK(memcmp(x, y, sizeof x) == 0, "second sample same penalties");
    sampler_free(&s);

    /* The penalty can move the argmax. */
    p.repeat_penalty = 1;
    p.presence_penalty = 0;
    p.frequency_penalty = 1.0f;
    CHECK(sampler_init(&s, &p, 3) == 0, "init");
    sampler_accept(&s, 2, 0);
    sampler_accept(&s, 2, 0);
    float z[3] = {0, 1, 2.5f};
    CHECK(sampler_sample(&s, z, NULL) == 1, "frequency pushes token 2 below 1");
    sampler_free(&s);
}

/* ---------------------------------------------------------------- memory made beforehand */

/* sampler_init_with on a shared scratch and a per-sampler history gives sampler_init's
 * tokens and logits exactly, with two samplers taking turns on one scratch (nothing of
 * one leaks into the other; the marks are all clear between calls), and a history
 * shorter than the window (cap = the tokens a sequence will ever accept). */
static void test_init_with(void) {
    enum { SV = 4096, STEPS = 150, PROMPT = 20, CAP = PROMPT + STEPS };
    static float la[SV], lb[SV];
    sampler_params pa, pb;
    sampler_params_default(&pa);
    pa.seed = 5, pa.temperature = 0.9f, pa.top_p = 0.9f;
    pa.repeat_penalty = 1.3f, pa.repeat_last_n = 1 << 20; /* longer than CAP */
    pa.presence_penalty = 0.4f, pa.frequency_penalty = 0.3f;
    sampler_params_default(&pb);
    pb.seed = 6, pb.temperature = 1.2f, pb.top_k = 30, pb.min_p = 0.02f;
    pb.repeat_penalty = 1.5f, pb.repeat_last_n = 16;
    sampler_scratch sc;
    sampler_hist ha, hb;
    CHECK(sampler_scratch_init(&sc, SV) == 0 && sampler_hist_init(&ha, CAP) == 0 &&
          sampler_hist_init(&hb, CAP) == 0, "scratch and histories");
    sampler oa, ob, wa, wb;
    CHECK(sampler_init(&oa, &pa, SV) == 0 && sampler_init(&ob, &pb, SV) == 0, "owned");
    CHECK(sampler_init_with(&wa, &pa, SV, &sc, &ha) == 0 && sampler_init_with(&wb, &pb, SV, &sc, &hb) == 0,
          "on the shared memory");
    for (int i = 0; i < PROMPT; i++) {
        int32_t t = (int32_t)(i * 7 % 50);
        sampler_accept(&oa, t, 1), sampler_accept(&wa, t, 1);
        sampler_accept(&ob, t + 1, 1), sampler_accept(&wb, t + 1, 1);
    }
    int same = 0, same_logits = 0;
    for (int k = 0; k < STEPS; k++) {
        fill_logits(logits, SV, 40 + (uint32_t)k);
        for (int i = 0; i < 50; i++) logits[i] += 6; /* a few tokens the penalties fight over */
        memcpy(la, logits, sizeof la), memcpy(lb, logits, sizeof lb);
        int32_t a = sampler_sample(&oa, la, NULL), b = sampler_sample(&wa, lb, NULL);
        same += a == b, same_logits += !memcmp(la, lb, sizeof la);
        sampler_accept(&oa, a, 0), sampler_accept(&wa, b, 0);
        memcpy(la, logits, sizeof la), memcpy(lb, logits, sizeof lb);
        a = sampler_sample(&ob, la, NULL), b = sampler_sample(&wb, lb, NULL);
        same += a == b, same_logits += !memcmp(la, lb, sizeof la);
        sampler_accept(&ob, a, 0), sampler_accept(&wb, b, 0);
    }
    CHECK(same == 2 * STEPS && same_logits == 2 * STEPS, "%d and %d of %d samples the same",
          same, same_logits, 2 * STEPS);
    int marked = 0;
    for (int i = 0; i < SV; i++) marked += sc.mark[i] != 0;
    CHECK(marked == 0, "%d marks left set", marked);
    CHECK(wa.ring_cap == CAP && wb.ring_cap == 16, "windows %d, %d", wa.ring_cap, wb.ring_cap);
    sampler_free(&wa);
    CHECK(ha.ring != NULL && sc.cand != NULL, "sampler_free leaves memory made beforehand");
    sampler_free(&oa), sampler_free(&ob), sampler_free(&wb);

    /* What sampler_init_with refuses: a scratch for a smaller vocabulary; penalties with
     * no history. Without penalties no history is needed. */
    CHECK(sampler_init_with(&wa, &pa, SV + 1, &sc, &ha) == -EINVAL, "scratch too small");
    CHECK(sampler_init_with(&wa, &pa, SV, &sc, NULL) == -EINVAL, "penalties without a history");
    sampler_params plain;
    sampler_params_default(&plain);
    CHECK(sampler_init_with(&wa, &plain, SV, &sc, NULL) == 0, "no penalties, no history");
    sampler_free(&wa);
    plain.temperature = NAN;
    CHECK(sampler_init_with(&wa, &plain, SV, &sc, &ha) == -EINVAL, "bad params");
    sampler_hist_free(&ha), sampler_hist_free(&hb);
    sampler_scratch_free(&sc);
    sampler_scratch_free(&sc); /* twice: a no-op */
}

static void test_logprob(void) {
    sampler s;
    sampler_params p;
    sampler_params_default(&p);
    p.temperature = 0;
    CHECK(sampler_init(&s, &p, 4) == 0, "init");
    float x[4] = {1, 2, 3, 0}, lp = 0;
    double z = exp(1) + exp(2) + exp(3) + exp(0);
    CHECK(sampler_sample(&s, x, &lp) == 2, "greedy");
    CHECK(fabs(lp - (3 - log(z))) < 1e-5, "logprob %g vs %g", lp, 3 - log(z));
    sampler_free(&s);
    /* Before temperature: T=0.3 reports the same logprob for a token. */
    p.temperature = 0.3f;
    p.top_k = 2;
    p.seed = 5;
    CHECK(sampler_init(&s, &p, 4) == 0, "init");
    for (int i = 0; i < 10; i++) {
        float w[4] = {1, 2, 3, 0};
        int32_t t = sampler_sample(&s, w, &lp);
        CHECK(fabs(lp - (w[t] - log(z))) < 1e-5, "T=0.3 token %d logprob %g", t, lp);
    }
    sampler_free(&s);
}

/* The most likely tokens with their logprobs: against a sort of the whole vocabulary
 * (ties by the lower id), each logprob the same log-softmax as the sampled token's, and
 * a sampled token among them gets its own logprob bit for bit. */
static void test_top(void) {
    enum { TV = 5000 };
    static float x[TV], w[TV];
    sampler s;
    sampler_params p;
    sampler_params_default(&p);
    p.temperature = 0.8f, p.seed = 11;
    CHECK(sampler_init(&s, &p, TV) == 0, "init");
    uint64_t r = 7;
    for (int i = 0; i < TV; i++) r = r * 6364136223846793005ull + 1, x[i] = (float)((r >> 40) % 2000) / 100.0f;
    x[17] = x[4000] = 25.0f; /* a tie at the top: 17 before 4000 */
    double z = 0;
    for (int i = 0; i < TV; i++) z += exp((double)x[i] - 25.0);
    for (int round = 0; round < 20; round++) {
        memcpy(w, x, sizeof x);
        int32_t id[SAMPLER_MAX_TOP];
        float tl[SAMPLER_MAX_TOP], lp = 0;
        int n = -1;
        int32_t t = sampler_sample_top(&s, w, &lp, SAMPLER_MAX_TOP, id, tl, &n);
        CHECK(n == SAMPLER_MAX_TOP && id[0] == 17 && id[1] == 4000, "n %d, first %d %d", n, id[0], id[1]);
        for (int i = 0; i < n; i++) {
            int above = 0; /* tokens ranked before id[i] in the whole vocabulary */
            for (int j = 0; j < TV; j++) above += x[j] > x[id[i]] || (x[j] == x[id[i]] && j < id[i]);
            CHECK(above == i, "rank %d holds a token of rank %d", i, above);
            CHECK(fabs(tl[i] - (x[id[i]] - 25.0 - log(z))) < 1e-4, "logprob of %d: %g", id[i], tl[i]);
            if (id[i] == t) CHECK(tl[i] == lp, "the sampled token's logprob %g vs %g", tl[i], lp);
        }
    }
    int32_t id[3];
    float tl[3];
    int n = -1;
    memcpy(w, x, sizeof x);
    sampler_sample_top(&s, w, NULL, 0, id, tl, &n);
    CHECK(n == 0, "n_top 0: none (%d)", n);
    sampler_free(&s);
    CHECK(sampler_init(&s, &p, 2) == 0, "init 2");
    float two[2] = {0.5f, 1.5f};
    sampler_sample_top(&s, two, NULL, 3, id, tl, &n);
    CHECK(n == 2 && id[0] == 1 && id[1] == 0, "a vocabulary of 2: %d (%d %d)", n, id[0], id[1]);
    sampler_free(&s);
}

static void test_stops_and_params(void) {
    sampler s;
    sampler_params p;
    sampler_params_default(&p);
    p.max_tokens = 3;
    p.stop_ids[0] = 7;
    p.n_stop_ids = 1;
    CHECK(sampler_init(&s, &p, 10) == 0, "init");
    sampler_accept(&s, 7, 1);
    CHECK(sampler_stopped(&s) == SAMPLER_RUNNING, "stop id in the prompt does not stop");
    sampler_accept(&s, 1, 0);
    sampler_accept(&s, 2, 0);
    CHECK(sampler_stopped(&s) == SAMPLER_RUNNING, "2 of 3");
    sampler_accept(&s, 3, 0);
    CHECK(sampler_stopped(&s) == SAMPLER_STOP_LENGTH, "max_tokens");
    sampler_free(&s);
    CHECK(sampler_init(&s, &p, 10) == 0, "init");
    sampler_accept(&s, 7, 0);
    CHECK(sampler_stopped(&s) == SAMPLER_STOP_TOKEN, "stop id");
    sampler_accept(&s, -1, 0); /* out of range: ignored */
    sampler_accept(&s, 10, 0);
    sampler_free(&s);

    sampler_params bad = p;
    bad.top_p = 0;
    CHECK(sampler_init(&s, &bad, 10) == -EINVAL, "top_p 0");
    bad = p;
    bad.repeat_penalty = 0;
    CHECK(sampler_init(&s, &bad, 10) == -EINVAL, "repeat_penalty 0");
    bad = p;
    bad.temperature = NAN;
    CHECK(sampler_init(&s, &bad, 10) == -EINVAL, "temperature NaN");
    bad = p;
    bad.n_stop_ids = 9;
    CHECK(sampler_init(&s, &bad, 10) == -EINVAL, "9 stop ids");
    CHECK(sampler_init(&s, &p, 0) == -EINVAL, "empty vocab");
    sampler_free(&s);
}

/* ---------------------------------------------------------------- stop strings */

/* Feed text in pieces of `step` bytes (0: the whole), collect output. */
static size_t run_stopper(const char *const *stops, int n_stops, const char *text, size_t step,
                          char *out, int *stopped) {
    stopper st;
    CHECK(stopper_init(&st, stops, n_stops) == 0, "stopper_init");
    size_t len = strlen(text), w = 0;
    if (step == 0) step = len ? len : 1;
    *stopped = 0;
    for (size_t i = 0; i < len; i += step) {
        size_t k = len - i < step ? len - i : step;
        int sp = 0;
        w += stopper_feed(&st, text + i, k, out + w, k + STOPPER_MAX_LEN, &sp);
        if (sp) *stopped = 1;
    }
    w += stopper_flush(&st, out + w, STOPPER_MAX_LEN);
    out[w] = 0;
    return w;
}

static void expect_stop(const char *const *stops, int n, const char *text, const char *want,
                        int want_stop) {
    for (size_t step = 0; step <= 7; step++) {
        char out[512];
        int stopped;
        run_stopper(stops, n, text, step, out, &stopped);
        CHECK(strcmp(out, want) == 0 && stopped == want_stop,
              "'%s' step %zu: got '%s' stop %d, want '%s' stop %d", text, step, out, stopped,
              want, want_stop);
    }
}

static void test_stopper(void) {
    const char *s1[] = {"STOP"};
    expect_stop(s1, 1, "hello STOP world", "hello ", 1);
    expect_stop(s1, 1, "STOP", "", 1);
    expect_stop(s1, 1, "STOPafter", "", 1);
    expect_stop(s1, 1, "no stop here, ST", "no stop here, ST", 0);
    expect_stop(s1, 1, "STO STOPS", "STO ", 1);
    expect_stop(s1, 1, "SSSTOP", "SS", 1);
    expect_stop(s1, 1, "", "", 0);
    const char *s2[] = {"abab"};
    expect_stop(s2, 1, "ababab", "", 1);
    expect_stop(s2, 1, "xabababx", "x", 1);
    expect_stop(s2, 1, "abaabab", "aba", 1);
    expect_stop(s2, 1, "aba", "aba", 0);
    const char *s3[] = {"</s>", "\n\nUser:", "xyz"};
    expect_stop(s3, 3, "answer.\n\nUser: hi", "answer.", 1);
    expect_stop(s3, 3, "a\n\nUse b", "a\n\nUse b", 0);
    expect_stop(s3, 3, "one</s", "one</s", 0);
    expect_stop(s3, 3, "x<xy</s>", "x<xy", 1);
    /* The earliest-ending match wins; at one end, the longest. */
    const char *s4[] = {"bcd", "abcdef", "cd"};
    expect_stop(s4, 3, "zabcdef", "za", 1);
    const char *s5[] = {"cdef", "ab"};
    expect_stop(s5, 2, "xcdeab", "xcde", 1);
    /* UTF-8 split byte by byte. */
    const char *s6[] = {"\xe2\x80\x94" "end"};
    expect_stop(s6, 1, "caf\xc3\xa9 \xe2\x80\x94 \xe2\x80\x94" "end!",
                "caf\xc3\xa9 \xe2\x80\x94 ", 1);

    /* After a stop, feeding emits nothing. */
    stopper st;
    char out[128];
    int sp = 0;
    CHECK(stopper_init(&st, s1, 1) == 0, "init");
    CHECK(stopper_feed(&st, "aSTOPb", 6, out, sizeof out, &sp) == 1 && sp == 1, "stop");
    CHECK(stopper_feed(&st, "more", 4, out, sizeof out, &sp) == 0 && sp == 1, "after stop");
    CHECK(stopper_flush(&st, out, sizeof out) == 0, "flush after stop");
    /* No stop strings: everything passes through. */
    CHECK(stopper_init(&st, NULL, 0) == 0, "init none");
    CHECK(stopper_feed(&st, "abc", 3, out, sizeof out, NULL) == 3, "pass-through");
    /* Limits. */
    const char *empty[] = {""};
    CHECK(stopper_init(&st, empty, 1) == -EINVAL, "empty stop string");
    char longs[80];
    memset(longs, 'a', 65);
    longs[65] = 0;
    const char *lp[] = {longs};
    CHECK(stopper_init(&st, lp, 1) == -EINVAL, "65-byte stop string");
    longs[64] = 0;
    CHECK(stopper_init(&st, lp, 1) == 0, "64-byte stop string");
    const char *nine[9] = {"a", "b", "c", "d", "e", "f", "g", "h", "i"};
    CHECK(stopper_init(&st, nine, 9) == -EINVAL, "9 stop strings");
    /* A 64-byte stop string "a..ab" after 63 a's: the longest hold-back there is. */
    longs[63] = 'b';
    char text[200];
    snprintf(text, sizeof text, "%.63s%s", longs, longs);
    char want[80];
    snprintf(want, sizeof want, "%.63s", longs);
    const char *lp2[] = {longs};
    expect_stop(lp2, 1, text, want, 1);
}

int main(void) {
    test_greedy();
    test_seed();
    test_distribution();
    test_big_vocab_filters();
    test_ties_and_tiny_t();
    test_penalties();
    test_init_with();
    test_logprob();
    test_top();
    test_stops_and_params();
    test_stopper();
    return check_done("sampler");
}
