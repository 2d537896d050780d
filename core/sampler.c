/* sampler: logits -> next token; stopper: stop strings (see sampler.h). */
#include "core/sampler.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h> /* malloc at init only */
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- RNG: xoshiro256** */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t r[4]) {
    uint64_t out = rotl(r[1] * 5, 7) * 9, t = r[1] << 17;
    r[2] ^= r[0];
    r[3] ^= r[1];
    r[1] ^= r[2];
    r[0] ^= r[3];
    r[2] ^= t;
    r[3] = rotl(r[3], 45);
    return out;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t r[4]) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

/* A seed for seed=0: clocks and an address mixed, never 0 (0 means "random"). */
static uint64_t seed_from_time(const void *salt) {
    struct timespec a, b;
    clock_gettime(CLOCK_REALTIME, &a);
    clock_gettime(CLOCK_MONOTONIC, &b);
    uint64_t x = (uint64_t)a.tv_sec * 1000000007ull ^ (uint64_t)a.tv_nsec ^
                 ((uint64_t)b.tv_nsec << 21) ^ (uint64_t)(uintptr_t)salt;
    uint64_t z = splitmix64(&x);
    return z ? z : 1;
}

/* ---------------------------------------------------------------- init / free */

void sampler_params_default(sampler_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->repeat_penalty = 1.0f;
}

static int params_valid(const sampler_params *p) {
    return !isnan(p->temperature) && !isnan(p->top_p) && p->top_p > 0 && p->min_p >= 0 &&
           p->min_p <= 1 && p->repeat_penalty > 0 && isfinite(p->repeat_penalty) &&
           p->repeat_last_n >= 0 && p->repeat_last_n <= (1 << 20) &&
           isfinite(p->presence_penalty) && isfinite(p->frequency_penalty) &&
           p->n_stop_ids >= 0 && p->n_stop_ids <= SAMPLER_MAX_STOP_IDS;
}

static int repeat_on(const sampler_params *p) { return p->repeat_penalty != 1.0f && p->repeat_last_n > 0; }
static int gen_on(const sampler_params *p) { return p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f; }

/* What sampler_init and sampler_init_with share: everything but the arrays. */
static int setup(sampler *s, const sampler_params *p, int n_vocab) {
    memset(s, 0, sizeof *s);
    if (n_vocab < 1 || !params_valid(p)) return -EINVAL;
    s->par = *p;
    s->n_vocab = n_vocab;
    s->seed = p->seed ? p->seed : seed_from_time(s);
    uint64_t x = s->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    return 0;
}

int sampler_scratch_init(sampler_scratch *sc, int n_vocab) {
    memset(sc, 0, sizeof *sc);
    if (n_vocab < 1) return -EINVAL;
    size_t nv = (size_t)n_vocab;
    sc->n_vocab = n_vocab;
    sc->cand = malloc((nv + 1) * sizeof *sc->cand); /* + a spare slot, see nucleus() */
    sc->prob = malloc(nv * sizeof *sc->prob);
    sc->mark = calloc(nv, sizeof *sc->mark);
    if (!sc->cand || !sc->prob || !sc->mark) {
        sampler_scratch_free(sc);
        return -ENOMEM;
    }
    return 0;
}

void sampler_scratch_free(sampler_scratch *sc) {
    free(sc->cand);
    free(sc->prob);
    free(sc->mark);
    memset(sc, 0, sizeof *sc);
}

int sampler_hist_init(sampler_hist *h, int cap) {
    memset(h, 0, sizeof *h);
    if (cap < 1) return -EINVAL;
    int32_t *m = malloc(3 * (size_t)cap * sizeof *m); /* one block: ring, gen_seen, gen_n */
    if (!m) return -ENOMEM;
    h->cap = cap;
    h->ring = m, h->gen_seen = m + cap, h->gen_n = m + 2 * (size_t)cap;
    return 0;
}

void sampler_hist_free(sampler_hist *h) {
    free(h->ring);
    memset(h, 0, sizeof *h);
}

int sampler_init(sampler *s, const sampler_params *p, int n_vocab) {
    int r = setup(s, p, n_vocab);
    if (r < 0) return r;
    s->owned = 1;
    if (sampler_scratch_init(&s->sc, n_vocab) < 0) goto oom;
    if (repeat_on(p)) {
        s->ring_cap = p->repeat_last_n;
        if (!(s->ring = malloc((size_t)s->ring_cap * sizeof *s->ring))) goto oom;
    }
    if (gen_on(p)) {
        s->gen_cap = n_vocab; /* distinct tokens */
        s->gen_seen = malloc((size_t)n_vocab * sizeof *s->gen_seen);
        s->gen_n = malloc((size_t)n_vocab * sizeof *s->gen_n);
        if (!s->gen_seen || !s->gen_n) goto oom;
    }
    return 0;
oom:
    sampler_free(s);
    return -ENOMEM;
}

int sampler_init_with(sampler *s, const sampler_params *p, int n_vocab, const sampler_scratch *sc,
                      const sampler_hist *h) {
    int r = setup(s, p, n_vocab);
    if (r < 0) return r;
    int need_h = repeat_on(p) || gen_on(p);
    if (!sc || sc->n_vocab < n_vocab || !sc->cand || !sc->prob || !sc->mark || (need_h && (!h || h->cap < 1))) {
        memset(s, 0, sizeof *s);
        return -EINVAL;
    }
    s->sc = *sc;
    if (repeat_on(p)) {
        s->ring = h->ring;
        s->ring_cap = p->repeat_last_n < h->cap ? p->repeat_last_n : h->cap;
    }
    if (gen_on(p)) {
        s->gen_seen = h->gen_seen, s->gen_n = h->gen_n;
        s->gen_cap = n_vocab < h->cap ? n_vocab : h->cap;
    }
    return 0;
}

void sampler_free(sampler *s) {
    if (s->owned) {
        sampler_scratch_free(&s->sc);
        free(s->ring);
        free(s->gen_seen);
        free(s->gen_n);
    }
    memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------- history */

void sampler_accept(sampler *s, int32_t tok, int is_prompt) {
    if (tok < 0 || tok >= s->n_vocab) return;
    if (s->ring) {
        s->ring[s->ring_pos] = tok; /* over the oldest once full */
        if (s->ring_n < s->ring_cap) s->ring_n++;
        s->ring_pos = (s->ring_pos + 1) % s->ring_cap;
    }
    if (is_prompt) return;
    s->n_generated++;
    if (s->gen_seen) { /* a scan: at most the tokens generated, under a vocabulary-wide sample */
        int i = 0;
        while (i < s->n_gen_seen && s->gen_seen[i] != tok) i++;
        if (i < s->n_gen_seen) s->gen_n[i]++;
        else if (i < s->gen_cap) s->gen_seen[i] = tok, s->gen_n[i] = 1, s->n_gen_seen++;
    }
    for (int i = 0; i < s->par.n_stop_ids; i++)
        if (s->par.stop_ids[i] == tok) {
            s->stop = SAMPLER_STOP_TOKEN;
            return;
        }
    if (s->par.max_tokens > 0 && s->n_generated >= s->par.max_tokens) s->stop = SAMPLER_STOP_LENGTH;
}

int sampler_stopped(const sampler *s) { return s->stop; }

/* Each distinct token is penalized once, however often it occurs: the scratch's marks
 * say which are done, and are cleared again before returning. */
static void apply_penalties(sampler *s, float *logits) {
    if (s->ring) {
        float rp = s->par.repeat_penalty;
        uint8_t *done = s->sc.mark;
        for (int i = 0; i < s->ring_n; i++) {
            int32_t t = s->ring[i];
            if (done[t]) continue;
            logits[t] = logits[t] > 0 ? logits[t] / rp : logits[t] * rp;
            done[t] = 1;
        }
        for (int i = 0; i < s->ring_n; i++) done[s->ring[i]] = 0;
    }
    if (s->gen_seen) {
        float pp = s->par.presence_penalty, fp = s->par.frequency_penalty;
        for (int i = 0; i < s->n_gen_seen; i++) logits[s->gen_seen[i]] -= (float)s->gen_n[i] * fp + pp;
    }
}

/* ---------------------------------------------------------------- exp over the vocabulary */

/* Every non-greedy draw exponentiates the whole vocabulary, and libm's expf is scalar
 * and the sampler's largest cost. Four lanes with GCC/clang vector extensions (SSE2 on
 * x86-64, no ISA flags): x = n ln2 + f, |f| <= ln2/2, e^f by its degree-7 Taylor
 * polynomial (truncation < 5e-9 relative), 2^n through the exponent bits. Inputs are
 * <= 0 here; below -87 (2^-126) the result is 0, a -inf logit included. */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef double v2d __attribute__((vector_size(16)));

static inline __attribute__((always_inline)) v4f exp4(v4f x) {
    const v4f magic = {0x1.8p23f, 0x1.8p23f, 0x1.8p23f, 0x1.8p23f}; /* round to integer */
    v4i under = x < -87.0f;
    x = (v4f)(((v4i)x & ~under) | ((v4i)(x - x + -87.0f) & under)); /* clamp, NaN kept */
    v4f n = (x * 1.44269504088896341f + magic) - magic;
    v4f f = x - n * 0.693145751953125f - n * 1.42860682030941723212e-6f;
    v4f p = f * (1.0f / 5040) + 1.0f / 720;
    p = p * f + 1.0f / 120;
    p = p * f + 1.0f / 24;
    p = p * f + 1.0f / 6;
    p = p * f + 0.5f;
    p = p * f + 1.0f;
    p = p * f + 1.0f;
    v4i scale = (__builtin_convertvector(n, v4i) + 127) << 23;
    return (v4f)((v4i)(p * (v4f)scale) & ~under);
}

/* e[i] = exp((x[i] - m) * k) for i < n (e may be NULL: sum only); returns the sum,
 * accumulated in double. */
static double exp_shifted(const float *x, int n, float m, float k, float *e) {
    v2d acc0 = {0, 0}, acc1 = {0, 0};
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        v4f v;
        memcpy(&v, x + i, sizeof v);
        v4f r = exp4((v - m) * k);
        acc0 += (v2d){r[0], r[1]};
        acc1 += (v2d){r[2], r[3]};
        if (e) memcpy(e + i, &r, sizeof r);
    }
    double z = (acc0[0] + acc0[1]) + (acc1[0] + acc1[1]);
    for (; i < n; i++) {
        v4f r = exp4((v4f){x[i] - m, 0, 0, 0} * k);
        z += r[0];
        if (e) e[i] = r[0];
    }
    return z;
}

/* ---------------------------------------------------------------- selection */

/* Lowest index wins ties: strict >. The best value stays in a register; reloading
 * x[best] each step makes a load-compare chain three times slower. */
static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    float bv = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > bv) bv = x[i], best = i;
    return best;
}

/* a ranks below b: smaller value, or equal value and larger id. */
static int below(const sampler_cand *a, const sampler_cand *b) {
    return a->v < b->v || (a->v == b->v && a->id > b->id);
}

static void sift_down(sampler_cand *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && below(&h[l], &h[m])) m = l;
        if (r < n && below(&h[r], &h[m])) m = r;
        if (m == i) return;
        sampler_cand t = h[i];
        h[i] = h[m], h[m] = t;
        i = m;
    }
}

/* A min-heap (by below) sorted in place: popping the worst to the end leaves the
 * array best first. Heapsort rather than qsort: glibc's qsort may malloc. */
static void heap_sort_desc(sampler_cand *c, int n) {
    for (int end = n - 1; end > 0; end--) {
        sampler_cand t = c[0];
        c[0] = c[end], c[end] = t;
        sift_down(c, end, 0);
    }
}

static void sort_desc(sampler_cand *c, int n) {
    for (int i = n / 2 - 1; i >= 0; i--) sift_down(c, n, i);
    heap_sort_desc(c, n);
}

/* The k best logits into c[0..k), best first, in O(n log k): a min-heap of the best so
 * far whose root is the one to beat, then heapsort of the survivors. */
static int top_k_select(const float *x, int n, int k, sampler_cand *c) {
    for (int i = 0; i < k; i++) c[i] = (sampler_cand){i, x[i]};
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(c, k, i);
    for (int i = k; i < n; i++) {
        if (!(x[i] > c[0].v)) continue; /* a tie keeps the lower id already held */
        c[0] = (sampler_cand){i, x[i]};
        sift_down(c, k, 0);
    }
    heap_sort_desc(c, k);
    return k;
}

/* top_p without top_k, without sorting the vocabulary. Tokens are bucketed by
 * d = (max - logit) / T (bucket width: the logit range over NB, at most 32 nats
 * considered); bucket mass is summed top down until it reaches top_p. Buckets above
 * the boundary one are wholly in the nucleus, in any order; only the boundary
 * bucket's few tokens are sorted to find the exact cut. Same set as a full sort.
 * e[i] = exp(-d), z = sum of e. Candidates come back unsorted. */
#define NB 1024

static int bucket_of(float d, float scale) {
    float b = d * scale;
    return b < (float)(NB - 1) ? (int)b : NB - 1; /* NaN lands in the last bucket */
}

static int nucleus(sampler *s, const float *logits, const float *e, double z, float m,
                   float range, sampler_cand *c) {
    int n = s->n_vocab;
    float inv_t = 1.0f / s->par.temperature;
    float scale = range > 0 ? (float)NB / (range < 32 ? range : 32) : 1;
    double mass[NB] = {0};
    int count[NB] = {0};
    for (int i = 0; i < n; i++) {
        int b = bucket_of((m - logits[i]) * inv_t, scale);
        mass[b] += e[i];
        count[b]++;
    }
    double want = (double)s->par.top_p * z, acc = 0;
    int edge = 0, n_above = 0;
    while (edge < NB - 1 && acc + mass[edge] < want) {
        acc += mass[edge];
        n_above += count[edge++];
    }
    /* Branch-free: which side of the edge a token falls on is a coin flip to the
     * branch predictor. Tokens past the edge are written to the spare slot c[n]. */
    int nc = 0, ne = n_above;
    for (int i = 0; i < n; i++) {
        int b = bucket_of((m - logits[i]) * inv_t, scale);
        int above = b < edge, at = b == edge;
        c[above ? nc : at ? ne : n] = (sampler_cand){i, e[i]};
        nc += above;
        ne += at;
    }
    sort_desc(c + n_above, ne - n_above);
    for (int i = n_above; i < ne; i++)
        if ((acc += c[i].v) >= want) return i + 1;
    return ne;
}

static int32_t draw(sampler *s, const sampler_cand *c, int nc) {
    double total = 0, acc = 0;
    for (int i = 0; i < nc; i++) total += c[i].v;
    double u = rng_uniform(s->rng) * total;
    for (int i = 0; i < nc; i++) {
        acc += c[i].v;
        if (u < acc) return c[i].id;
    }
    return c[nc - 1].id;
}

static int32_t draw_all(sampler *s, const float *e, int n, double z) {
    double u = rng_uniform(s->rng) * z, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += e[i];
        if (u < acc) return i;
    }
    /* z was summed in another order: u may pass the end by a rounding error. */
    for (int i = n - 1; i > 0; i--)
        if (e[i] > 0) return i;
    return 0;
}

static int32_t sample_dist(sampler *s, const float *logits) {
    const sampler_params *p = &s->par;
    int n = s->n_vocab, nc;
    float inv_t = 1.0f / p->temperature;
    if (!isfinite(inv_t)) return argmax(logits, n); /* T below float range: greedy */
    sampler_cand *c = s->sc.cand;
    if (p->top_k > 0 && p->top_k < n) {
        /* c sorted best first: top_p and min_p are prefix cuts. */
        nc = top_k_select(logits, n, p->top_k, c);
        float m = c[0].v;
        if (!isfinite(m)) return c[0].id;
        double mass = 0, acc = 0;
        for (int i = 0; i < nc; i++) mass += c[i].v = expf((c[i].v - m) * inv_t); /* k exps */
        if (p->top_p < 1)
            for (int i = 0; i < nc; i++)
                if ((acc += c[i].v) >= (double)p->top_p * mass) {
                    nc = i + 1;
                    break;
                }
        int keep = 1; /* c[0].v == 1: the min_p cut is v >= min_p */
        while (keep < nc && c[keep].v >= p->min_p) keep++;
        return draw(s, c, keep);
    }
    float m = logits[0], lo = logits[0];
    for (int i = 1; i < n; i++) {
        m = logits[i] > m ? logits[i] : m;
        lo = logits[i] < lo ? logits[i] : lo;
    }
    if (!isfinite(m)) return argmax(logits, n);
    float *e = s->sc.prob;
    double z = exp_shifted(logits, n, m, inv_t, e);
    if (p->top_p < 1) {
        nc = nucleus(s, logits, e, z, m, (m - lo) * inv_t, c);
    } else if (p->min_p > 0) {
        nc = 0;
        for (int i = 0; i < n; i++)
            if (e[i] >= p->min_p) c[nc++] = (sampler_cand){i, e[i]};
        return draw(s, c, nc);
    } else {
        return draw_all(s, e, n, z);
    }
    if (p->min_p > 0) { /* the best token has e = 1, so the cut is e >= min_p */
        int k = 0;
        for (int i = 0; i < nc; i++)
            if (c[i].v >= p->min_p) c[k++] = c[i];
        nc = k;
    }
    return draw(s, c, nc);
}

/* log_softmax(logits)[tok] over the whole vocabulary. */
static float log_prob(const float *logits, int n, int32_t tok) {
    float m = logits[argmax(logits, n)];
    if (!isfinite(m)) return logits[tok] == m ? 0.0f : -INFINITY;
    double z = exp_shifted(logits, n, m, 1.0f, NULL);
    return (float)((double)logits[tok] - m - log(z));
}

/* The k largest of logits[0..n) by value (ties: the lower id first), largest first: an
 * insertion into k slots, one comparison for most of a vocabulary. */
static int top_k_ids(const float *logits, int n, int k, int32_t *id) {
    int have = 0;
    for (int32_t i = 0; i < n; i++) {
        float v = logits[i];
        if (have == k && !(v > logits[id[k - 1]])) continue;
        int at = have < k ? have++ : k - 1;
        while (at > 0 && v > logits[id[at - 1]]) id[at] = id[at - 1], at--;
        id[at] = i;
    }
    return have;
}

int32_t sampler_sample_top(sampler *s, float *logits, float *logprob, int n_top, int32_t *top_id,
                           float *top_lp, int *n_out) {
    apply_penalties(s, logits);
    int32_t tok;
    if (s->par.temperature <= 0 || s->par.top_k == 1) tok = argmax(logits, s->n_vocab);
    else tok = sample_dist(s, logits);
    if (logprob) *logprob = log_prob(logits, s->n_vocab, tok);
    if (n_out) *n_out = 0;
    if (n_top > 0 && top_id && top_lp && n_out) {
        int k = top_k_ids(logits, s->n_vocab, n_top < SAMPLER_MAX_TOP ? n_top : SAMPLER_MAX_TOP, top_id);
        float m = logits[top_id[0]]; /* the maximum, as log_prob takes it */
        double lz = isfinite(m) ? log(exp_shifted(logits, s->n_vocab, m, 1.0f, NULL)) : 0.0;
        for (int i = 0; i < k; i++) /* log_prob's arithmetic, the normalizer computed once */
            top_lp[i] = isfinite(m) ? (float)((double)logits[top_id[i]] - m - lz)
                                    : (logits[top_id[i]] == m ? 0.0f : -INFINITY);
        *n_out = k;
    }
    return tok;
}

int32_t sampler_sample(sampler *s, float *logits, float *logprob) {
    return sampler_sample_top(s, logits, logprob, 0, NULL, NULL, NULL);
}

/* ---------------------------------------------------------------- stop strings */

int stopper_init(stopper *st, const char *const *strs, int n) {
    memset(st, 0, sizeof *st);
    if (n < 0 || n > STOPPER_MAX || (n > 0 && !strs)) return -EINVAL;
    for (int i = 0; i < n; i++) {
        size_t len = strs[i] ? strnlen(strs[i], STOPPER_MAX_LEN + 1) : 0;
        if (len == 0 || len > STOPPER_MAX_LEN) {
            memset(st, 0, sizeof *st);
            return -EINVAL;
        }
        memcpy(st->str[i], strs[i], len);
        st->len[i] = len;
    }
    st->n = n;
    return 0;
}

/* The text being scanned is held[] followed by text[]; at() reads it without a copy. */
typedef struct {
    const char *held, *text;
    size_t n_held, len;
} joined;

static char at(const joined *j, size_t i) {
    return i < j->n_held ? j->held[i] : j->text[i - j->n_held];
}

static int match_at(const joined *j, size_t from, const char *s, size_t len) {
    for (size_t k = 0; k < len; k++)
        if (at(j, from + k) != s[k]) return 0;
    return 1;
}

static size_t emit(const joined *j, size_t n, char *out, size_t cap) {
    if (n > cap) n = cap; /* a caller bug (see sampler.h); never overrun */
    for (size_t i = 0; i < n; i++) out[i] = at(j, i);
    return n;
}

size_t stopper_feed(stopper *st, const char *text, size_t n, char *out, size_t cap, int *stopped) {
    if (stopped) *stopped = st->stopped;
    if (st->stopped) return 0;
    joined j = {st->held, text, st->n_held, st->n_held + n};
    /* Ends inside the old held text were scanned by the previous feed. Earliest end
     * first, as a byte-at-a-time feed would see it; at one end the longest match. */
    for (size_t e = st->n_held + 1; e <= j.len; e++) {
        size_t best = 0;
        for (int k = 0; k < st->n; k++) {
            size_t len = st->len[k];
            if (len <= e && len > best && match_at(&j, e - len, st->str[k], len)) best = len;
        }
        if (best) {
            size_t w = emit(&j, e - best, out, cap);
            st->stopped = 1;
            st->n_held = 0;
            if (stopped) *stopped = 1;
            return w;
        }
    }
    /* Hold back the longest suffix that is a proper prefix of a stop string. */
    size_t keep = 0;
    for (size_t k = j.len < STOPPER_MAX_LEN - 1 ? j.len : STOPPER_MAX_LEN - 1; k > 0 && !keep; k--)
        for (int i = 0; i < st->n; i++)
            if (k < st->len[i] && match_at(&j, j.len - k, st->str[i], k)) {
                keep = k;
                break;
            }
    size_t w = emit(&j, j.len - keep, out, cap);
    char tail[STOPPER_MAX_LEN];
    for (size_t i = 0; i < keep; i++) tail[i] = at(&j, j.len - keep + i);
    memcpy(st->held, tail, keep);
    st->n_held = keep;
    return w;
}

size_t stopper_flush(stopper *st, char *out, size_t cap) {
    if (st->stopped) return 0;
    size_t n = st->n_held < cap ? st->n_held : cap;
    memcpy(out, st->held, n);
    st->n_held = 0;
    return n;
}
