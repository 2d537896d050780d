/* test_cost: the step cost model (sched/cost.h): it recovers a + b·tokens +
 * c·positions from steps of a known cost, exactly and through noise, the short steps
 * as closely as the long; it follows a machine that slows down; a long run of
 * identical steps (nothing to learn from) leaves what it knew of the rest; no
 * coefficient goes below 0 however the steps fall; it ignores steps that are not
 * steps; and cost_chunk is the largest chunk within the time asked, checked against
 * counting. */
#include <math.h>
#include <stdint.h>

#include "sched/cost.h"
#include "tests/unit/check.h"

typedef struct {
    double a, b, c;
} machine;

static double truth(machine k, int tokens, double pos) { return k.a + k.b * tokens + k.c * pos * 1e-3; }

static uint64_t rng = 88172645463325252ull;
static double unif(void) { /* [0, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* A mix a server sees: decodes alone (one or a few sequences, deep or shallow), prompt
 * chunks, both together. */
static void step_mix(int i, int *tokens, double *pos) {
    int dec = 1 + i % 5, chunk = i % 3 == 0 ? 16 + i % 48 : 0;
    int depth = 50 + (i * 37) % 900, start = (i * 53) % 700;
    *tokens = dec + chunk;
    *pos = (double)dec * depth + (double)chunk * start + (double)chunk * (chunk - 1) / 2;
}

static void feed(cost_model *m, machine k, int from, int to, double noise) {
    for (int i = from; i < to; i++) {
        int t;
        double p;
        step_mix(i, &t, &p);
        cost_observe(m, t, p, truth(k, t, p) * (1 - noise + 2 * noise * unif()), 0);
    }
}

static const machine M = {2.0, 0.3, 4.0};

static void recovers_exactly(void) {
    cost_model m;
    cost_init(&m);
    feed(&m, M, 0, 60, 0);
    CHECK(cost_ready(&m), "ready after 60 steps");
    CHECK(fabs(m.w[0] - M.a) < 0.01 && fabs(m.w[1] - M.b) < 0.001 && fabs(m.w[2] - M.c) < 0.01,
          "fit %g %g %g, want 2 0.3 4", m.w[0], m.w[1], m.w[2]);
    double want = truth(M, 33, 33 * 900 + 528);
    CHECK(fabs(cost_step(&m, 33, 33 * 900 + 528) - want) < 0.01 * want, "predicts %g, want %g",
          cost_step(&m, 33, 33 * 900 + 528), want);
    /* a one-token step, the kind a target is taken from, as close as a long one */
    CHECK(fabs(cost_step(&m, 1, 40) - truth(M, 1, 40)) < 0.01 * truth(M, 1, 40), "a decode: %g, want %g",
          cost_step(&m, 1, 40), truth(M, 1, 40));
}

static void through_noise(void) {
    cost_model m;
    cost_init(&m);
    feed(&m, (machine){5.0, 0.4, 2.0}, 0, 400, 0.15); /* ±15% */
    double worst = 0;
    for (int i = 400; i < 440; i++) { /* steps it has not seen */
        int t;
        double p;
        step_mix(i * 7, &t, &p);
        double want = truth((machine){5.0, 0.4, 2.0}, t, p);
        double err = fabs(cost_step(&m, t, p) - want) / want;
        worst = err > worst ? err : worst;
    }
    CHECK(worst < 0.2, "through ±15%% noise, a prediction off by %.0f%%", worst * 100);
}

static void follows_a_slower_machine(void) {
    cost_model m;
    cost_init(&m);
    feed(&m, M, 0, 200, 0);
    feed(&m, (machine){2 * M.a, 2 * M.b, 2 * M.c}, 200, 400, 0); /* half the machine */
    double want = 2 * truth(M, 20, 20 * 500);
    CHECK(fabs(cost_step(&m, 20, 20 * 500) - want) < 0.05 * want, "after the slow-down: %g, want %g",
          cost_step(&m, 20, 20 * 500), want);
}

/* 5,000 one-token steps at one position teach nothing about b or c apart: the fit must
 * still predict a chunk as it did before them. */
static void identical_steps(void) {
    cost_model m;
    cost_init(&m);
    feed(&m, M, 0, 60, 0);
    for (int i = 0; i < 5000; i++) cost_observe(&m, 1, 100, truth(M, 1, 100), 0);
    double want = truth(M, 33, 32 * 400);
    CHECK(fabs(cost_step(&m, 33, 32 * 400) - want) < 0.1 * want, "a chunk after them: %g, want %g",
          cost_step(&m, 33, 32 * 400), want);
    CHECK(fabs(cost_step(&m, 1, 100) - truth(M, 1, 100)) < 0.01, "the step they were: %g",
          cost_step(&m, 1, 100));
}

/* Costs that fall with more work (noise, a machine that got faster mid-run) must not
 * give a negative coefficient: a negative one would make a longer chunk look cheaper. */
static void never_negative(void) {
    cost_model m;
    cost_init(&m);
    int neg = 0;
    for (int i = 0; i < 300; i++) {
        int t;
        double p;
        step_mix(i, &t, &p);
        cost_observe(&m, t, p, 50.0 / t + 10 * unif(), 0); /* more tokens, less time */
        for (int j = 0; j < COST_N; j++) neg += m.w[j] < 0 || !isfinite(m.w[j]);
    }
    CHECK(neg == 0, "%d negative or infinite coefficients", neg);
    CHECK(cost_step(&m, 1, 0) >= 0 && cost_tokens(&m, 100, 10) >= 0, "predictions are never negative");
}

static void readiness(void) {
    cost_model m;
    cost_init(&m);
    for (int i = 0; i < COST_MIN_STEPS - 1; i++) cost_observe(&m, 1 + i, 10.0 * i, 1.0 + i, 0);
    CHECK(!cost_ready(&m), "not ready before %d steps", COST_MIN_STEPS);
    cost_observe(&m, 3, 30, NAN, 0);
    cost_observe(&m, 3, 30, INFINITY, 0);
    cost_observe(&m, 0, 0, 5.0, 0);
    cost_observe(&m, 2, 0, -1.0, 0);
    cost_observe(&m, 2, -5, 1.0, 0);
    CHECK(m.n == COST_MIN_STEPS - 1, "NaN, infinite, empty and negative steps are not observed (%d)", m.n);
    cost_observe(&m, 2, 0, 1.0, 0);
    CHECK(cost_ready(&m), "ready at %d", COST_MIN_STEPS);
    cost_model z;
    cost_init(&z);
    for (int i = 0; i < 50; i++) cost_observe(&z, 1 + i % 7, 100.0 * i, 3.0, 0); /* free tokens */
    CHECK(cost_chunk(&z, 500, 64, 0.5) == 64, "tokens that cost nothing: no chunk is cut (%d)",
          cost_chunk(&z, 500, 64, 0.5));
}

/* Decode-only steps as measured: the smallest steps of a loaded machine cost more than
 * the line through the rest (here 4 ms where the fit says about 2.4); cost_decodes
 * gives what they took, for widths seen lately, and the fit otherwise (a width never
 * seen, or not for COST_RECENT steps). */
static void decodes_as_measured(void) {
    cost_model m;
    cost_init(&m);
    feed(&m, M, 0, 60, 0);
    for (int i = 0; i < 5; i++) {
        cost_observe(&m, 1, 40, 4.0, 1);
        feed(&m, M, 60 + 10 * i, 70 + 10 * i, 0);
    }
    CHECK(fabs(cost_decodes(&m, 1, 40) - 4.0) < 1e-9, "one decode: %g, as measured", cost_decodes(&m, 1, 40));
    CHECK(fabs(cost_decodes(&m, 3, 120) - cost_step(&m, 3, 120)) < 1e-9, "three, never seen alone: the fit");
    cost_observe(&m, 1, 41, 6.0, 1);
    CHECK(fabs(cost_decodes(&m, 1, 41) - 4.5) < 1e-9, "a moving average: %g", cost_decodes(&m, 1, 41));
    cost_observe(&m, 1, 41, 3.0, 0); /* a one-token prefill chunk: not a decode */
    CHECK(fabs(cost_decodes(&m, 1, 41) - 4.5) < 1e-9, "steps not all decodes are not counted");
    feed(&m, M, 200, 200 + COST_RECENT, 0);
    CHECK(fabs(cost_decodes(&m, 1, 40) - cost_step(&m, 1, 40)) < 1e-9, "stale after %d steps: the fit",
          COST_RECENT);
}

static void chunk_is_largest(void) {
    cost_model m;
    cost_init(&m);
    feed(&m, M, 0, 60, 0);
    int bad = 0;
    for (int pos = 0; pos < 3000; pos += 97)
        for (double ms = 0.1; ms < 60; ms *= 1.7)
            for (int most = 1; most <= 512; most *= 3) {
                int k = cost_chunk(&m, pos, most, ms), want = 0;
                while (want < most && cost_tokens(&m, pos, want + 1) <= ms) want++;
                bad += k != want;
            }
    CHECK(bad == 0, "%d chunks differ from counting", bad);
    CHECK(cost_chunk(&m, 0, 0, 100) == 0 && cost_chunk(&m, 0, 10, -1) == 0, "nothing asked, no time");
    double one = cost_tokens(&m, 900, 1), ten = cost_tokens(&m, 900, 10);
    CHECK(ten > one && one > cost_tokens(&m, 0, 1) && cost_tokens(&m, 5, 0) == 0,
          "deeper tokens cost more (%g, %g)", one, ten);
}

int main(void) {
    recovers_exactly();
    through_noise();
    follows_a_slower_machine();
    identical_steps();
    never_negative();
    readiness();
    decodes_as_measured();
    chunk_is_largest();
    return check_done("test_cost");
}
