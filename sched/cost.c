/* cost: a step's time as a + b·tokens + c·positions, fit by non-negative least squares
 * over exponentially weighted steps. */
#include "sched/cost.h"

#include <math.h>
#include <string.h>

/* Each step weighs this much of the one after it: the fit is over about the last
 * 1 / (1 - λ) = 50 steps. */
#define COST_LAMBDA 0.98
/* A ridge toward the last fit, of about one step's weight (a step's normalized x is
 * near 1): where recent steps say nothing (no chunk for an hour), the last fit stands,
 * rather than noise's quotient. */
#define COST_RIDGE 0.5

void cost_init(cost_model *m) { memset(m, 0, sizeof *m); }

/* Solves the normal equations restricted to the features in `mask` (the others 0),
 * with the ridge toward the last fit, by Gaussian elimination with partial pivoting;
 * 0, or -1 when singular. */
static int solve(const cost_model *m, unsigned mask, double w[COST_N]) {
    double A[COST_N][COST_N + 1];
    int idx[COST_N], k = 0;
    for (int i = 0; i < COST_N; i++)
        if (mask >> i & 1) idx[k++] = i;
    for (int i = 0; i < k; i++) {
        for (int j = 0; j < k; j++) A[i][j] = m->S[idx[i]][idx[j]];
        A[i][i] += COST_RIDGE;
        A[i][k] = m->r[idx[i]] + COST_RIDGE * m->w[idx[i]];
    }
    for (int c = 0; c < k; c++) {
        int p = c;
        for (int i = c + 1; i < k; i++)
            if (fabs(A[i][c]) > fabs(A[p][c])) p = i;
        if (fabs(A[p][c]) < 1e-300) return -1;
        for (int j = 0; j <= k; j++) {
            double t = A[c][j];
            A[c][j] = A[p][j], A[p][j] = t;
        }
        for (int i = 0; i < k; i++) {
            if (i == c) continue;
            double f = A[i][c] / A[c][c];
            for (int j = c; j <= k; j++) A[i][j] -= f * A[c][j];
        }
    }
    for (int i = 0; i < COST_N; i++) w[i] = 0;
    for (int i = 0; i < k; i++) w[idx[i]] = A[i][k] / A[i][i];
    return 0;
}

/* The weighted squared error of w: Σ weight·(t − xᵀw)² from the kept sums. */
static double residual(const cost_model *m, const double w[COST_N]) {
    double e = m->tt;
    for (int i = 0; i < COST_N; i++) {
        e -= 2 * w[i] * m->r[i];
        for (int j = 0; j < COST_N; j++) e += w[i] * m->S[i][j] * w[j];
    }
    return e;
}

/* Non-negative least squares by enumeration: the best of the fits, over every subset of
 * the features, whose coefficients are all ≥ 0 (7 subsets of 3; the empty fit, all 0,
 * when none is). */
static void refit(cost_model *m) {
    double best_e = residual(m, (double[COST_N]){0}), w[COST_N], fit[COST_N] = {0};
    for (unsigned mask = 1; mask < 1u << COST_N; mask++) {
        if (solve(m, mask, w) < 0) continue;
        int ok = 1;
        for (int i = 0; i < COST_N; i++) ok &= w[i] >= 0 && isfinite(w[i]);
        double e = ok ? residual(m, w) : INFINITY;
        if (e >= best_e) continue;
        best_e = e;
        for (int i = 0; i < COST_N; i++) fit[i] = w[i];
    }
    for (int i = 0; i < COST_N; i++) m->w[i] = fit[i];
}

/* The moving average's weight of a new decode-only step. */
#define COST_WIDE_NEW 0.25

void cost_observe(cost_model *m, int tokens, double positions, double ms, int decodes) {
    if (!(ms >= 0) || !isfinite(ms) || tokens <= 0 || !(positions >= 0)) return;
    /* relative errors: each step weighs 1/t², so a 4 ms decode is fit as closely as a
     * 60 ms prefill chunk (plain least squares lets the long steps set the fixed cost,
     * and the short steps the target is taken from are then predicted 3x too long) */
    double u = 1.0 / (ms > 0.01 ? ms : 0.01);
    const double x[COST_N] = {u, tokens * u, positions * 1e-3 * u};
    for (int i = 0; i < COST_N; i++) {
        for (int j = 0; j < COST_N; j++) m->S[i][j] = COST_LAMBDA * m->S[i][j] + x[i] * x[j];
        m->r[i] = COST_LAMBDA * m->r[i] + x[i] * ms * u;
    }
    m->tt = COST_LAMBDA * m->tt + ms * u * ms * u;
    m->n++;
    refit(m);
    if (decodes && tokens <= COST_WIDE) {
        int k = tokens;
        m->wide_ms[k] = m->wide_at[k] ? m->wide_ms[k] + COST_WIDE_NEW * (ms - m->wide_ms[k]) : ms;
        m->wide_at[k] = m->n;
    }
}

int cost_ready(const cost_model *m) { return m->n >= COST_MIN_STEPS; }

double cost_step(const cost_model *m, int tokens, double positions) {
    return m->w[0] + m->w[1] * tokens + m->w[2] * positions * 1e-3;
}

double cost_decodes(const cost_model *m, int tokens, double positions) {
    if (tokens >= 1 && tokens <= COST_WIDE && m->wide_at[tokens] && m->n - m->wide_at[tokens] < COST_RECENT)
        return m->wide_ms[tokens];
    return cost_step(m, tokens, positions);
}

/* k·b + c·(k·pos + k(k-1)/2)/1000: increasing in k, so cost_chunk bisects. */
double cost_tokens(const cost_model *m, int pos, int k) {
    if (k <= 0) return 0;
    double kd = k;
    return kd * m->w[1] + m->w[2] * (kd * pos + kd * (kd - 1) / 2) * 1e-3;
}

int cost_chunk(const cost_model *m, int pos, int most, double ms) {
    if (most <= 0 || cost_tokens(m, pos, 1) > ms) return 0;
    int lo = 1, hi = most;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (cost_tokens(m, pos, mid) <= ms) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}
