/* pct.c: latency samples and their percentiles for `kiln bench`.
 * A long --duration run can produce millions of inter-token gaps, so the kept samples
 * are capped: past cap, a uniform reservoir (Vitter's algorithm R) keeps a fair sample
 * of everything offered. Count, sum, min and max stay exact. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int pct_init(pct_set *s, size_t cap) {
    memset(s, 0, sizeof *s);
    if (cap == 0) cap = 1;
    s->v = malloc(cap * sizeof *s->v);
    if (!s->v) return -1;
    s->cap = cap;
    s->rng = 0x9e3779b97f4a7c15ull; /* fixed: a rerun keeps the same reservoir */
    s->min = INFINITY, s->max = -INFINITY;
    return 0;
}

void pct_free(pct_set *s) {
    free(s->v);
    memset(s, 0, sizeof *s);
}

/* xorshift64*: fast, good enough for picking reservoir slots */
static uint64_t rng_next(uint64_t *x) {
    *x ^= *x >> 12, *x ^= *x << 25, *x ^= *x >> 27;
    return *x * 2685821657736338717ull;
}

void pct_add(pct_set *s, double x) {
    if (!s->v || isnan(x)) return;
    s->seen++;
    s->sum += x;
    if (x < s->min) s->min = x;
    if (x > s->max) s->max = x;
    s->sorted = 0;
    if (s->n < s->cap) {
        s->v[s->n++] = x;
        return;
    }
    uint64_t j = rng_next(&s->rng) % s->seen; /* keep x with probability cap/seen */
    if (j < s->cap) s->v[j] = x;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double pct_get(pct_set *s, double p) {
    if (s->n == 0) return NAN;
    if (!s->sorted) {
        qsort(s->v, s->n, sizeof *s->v, cmp_double);
        s->sorted = 1;
    }
    if (p <= 0) return s->v[0];
    if (p >= 100) return s->v[s->n - 1];
    /* linear between closest ranks (numpy's default): rank = p/100 * (n-1) */
    double rank = p / 100.0 * (double)(s->n - 1);
    size_t lo = (size_t)rank;
    double frac = rank - (double)lo;
    if (lo + 1 >= s->n) return s->v[s->n - 1];
    return s->v[lo] + (s->v[lo + 1] - s->v[lo]) * frac;
}

double pct_mean(const pct_set *s) {
    return s->seen ? s->sum / (double)s->seen : NAN;
}
