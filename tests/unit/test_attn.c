/* test_attn: the SIMD attention blocks against the plain C reference, and the
 * reference against a direct two-pass softmax over all keys; the int8 blocks (8-bit KV)
 * against the f16 reference over the same values, and their SIMD paths against theirs.
 * ATTN_BENCH=1 also prints the time of one decode token's attention per path. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "core/cpu/attn.h"
#include "core/cpu/isa.h"
#include "core/cpu/quant.h"

static uint64_t rng = 88172645463325252ull;
static float frand(void) { /* xorshift64: uniform in [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) / (double)(1ull << 23)) - 1.0f;
}

/* softmax(q·K) · V over all n keys at once, in double: the definition. */
static void direct_capped(const float *q, const uint16_t *K, const uint16_t *V, int n, int hd,
                          double cap, float *out) {
    double *s = malloc(sizeof(double) * (size_t)n), mx = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++) {
        double d = 0;
        for (int k = 0; k < hd; k++) d += (double)q[k] * quant_f16_to_f32(K[i * hd + k]);
        if (cap > 0) d = cap * tanh(d / cap); /* Gemma 2's soft-capped scores */
        s[i] = d;
        if (d > mx) mx = d;
    }
    for (int i = 0; i < n; i++) sum += (s[i] = exp(s[i] - mx));
    for (int k = 0; k < hd; k++) {
        double a = 0;
        for (int i = 0; i < n; i++) a += s[i] * quant_f16_to_f32(V[i * hd + k]);
        out[k] = (float)(a / sum);
    }
    free(s);
}

static void direct(const float *q, const uint16_t *K, const uint16_t *V, int n, int hd, float *out) {
    direct_capped(q, K, V, n, hd, 0, out);
}

/* Block p's K in attn.h's layout, from the test's rows K [n][hd]: dimension-major with
 * a row stride of bs + 3, its keys from column (p / bs) % 4 on, as a pool's slab seen
 * past a window's first rows; the allocation ends at its last key, so a read past it
 * trips ASan. The caller frees *base. */
static const void *k_block(const void *K, size_t el, int p, int m, int hd, int bs, size_t *kstride,
                           void **base) {
    int off = p / bs % 4;
    *kstride = (size_t)bs + 3;
    char *b = malloc(el * ((size_t)(hd - 1) * *kstride + (size_t)off + (size_t)m));
    for (int i = 0; i < m; i++)
        for (int d = 0; d < hd; d++)
            memcpy(b + el * ((size_t)d * *kstride + (size_t)off + (size_t)i),
                   (const char *)K + el * ((size_t)(p + i) * hd + (size_t)d), el);
    *base = b;
    return b + el * (size_t)off;
}

/* Run n keys through attention in blocks of bs with the given block function. */
typedef void (*block_fn)(attn_state *, const float *, const uint16_t *, size_t, const uint16_t *, int);
static float g_softcap; /* what blocked() sets on its state */
static void blocked(block_fn fn, const float *q, int g, int hd, const uint16_t *K,
                    const uint16_t *V, int n, int bs, float *out) {
    static attn_state st;
    attn_init(&st, g, hd);
    attn_set_softcap(&st, g_softcap);
    for (int p = 0; p < n; p += bs) {
        int m = n - p < bs ? n - p : bs;
        size_t ks;
        void *base;
        const uint16_t *Kb = k_block(K, sizeof *K, p, m, hd, bs, &ks, &base);
        fn(&st, q, Kb, ks, V + (size_t)p * hd, m);
        free(base);
    }
    attn_finish(&st, out, (size_t)hd);
}

typedef void (*block_q8_fn)(attn_state *, const float *, const int8_t *, size_t, float,
                            const int8_t *, float, int);
static void blocked_q8(block_q8_fn fn, const float *q, int g, int hd, const int8_t *K, float ks,
                       const int8_t *V, float vs, int n, int bs, float *out) {
    static attn_state st;
    attn_init(&st, g, hd);
    for (int p = 0; p < n; p += bs) {
        int m = n - p < bs ? n - p : bs;
        size_t kst;
        void *base;
        const int8_t *Kb = k_block(K, 1, p, m, hd, bs, &kst, &base);
        fn(&st, q, Kb, kst, ks, V + (size_t)p * hd, vs, m);
        free(base);
    }
    attn_finish(&st, out, (size_t)hd);
}

static float max_rel(const float *a, const float *b, int n) {
    float e = 0, mag = 1e-6f;
    for (int i = 0; i < n; i++) {
        e = fmaxf(e, fabsf(a[i] - b[i]));
        mag = fmaxf(mag, fabsf(b[i]));
    }
    return e / mag;
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* One token's pass over n keys in blocks of bs as the pool holds them: each block's K
 * [hd][bs] (the values' order is not the point here). f16 K/V through f16, else q8. */
static void timed(block_fn f16, block_q8_fn q8, const float *q, int g, int hd, const void *K,
                  const void *V, int n, int bs, float *out) {
    static attn_state st;
    attn_init(&st, g, hd);
    for (int p = 0; p < n; p += bs) {
        size_t at = (size_t)p * hd;
        if (f16) f16(&st, q, (const uint16_t *)K + at, (size_t)bs, (const uint16_t *)V + at, bs);
        else q8(&st, q, (const int8_t *)K + at, (size_t)bs, 0.01f, (const int8_t *)V + at, 0.01f, bs);
    }
    attn_finish(&st, out, (size_t)hd);
}

/* One decode token of SmolLM2-135M per KV head: 3 queries, head_dim 64, 192 positions
 * in blocks of 16; ns per call of a whole pass, best of 5 runs. */
static void bench(void) {
    enum { G = 3, HD = 64, N = 192, BS = 16, REPS = 2000 };
    static float q[G * HD], out[G * HD];
    static uint16_t K[N * HD], V[N * HD];
    static int8_t K8[N * HD], V8[N * HD];
    for (int i = 0; i < G * HD; i++) q[i] = frand() / 8;
    for (int i = 0; i < N * HD; i++)
        K[i] = quant_f32_to_f16(frand()), V[i] = quant_f32_to_f16(frand()),
        K8[i] = (int8_t)(frand() * 127), V8[i] = (int8_t)(frand() * 127);
    struct { const char *name; block_fn f16; block_q8_fn q8; int level; } paths[] = {
        {"ref", attn_block_ref, attn_block_q8_ref, ISA_SCALAR},
        {"avx2", attn_block_avx2, attn_block_q8_avx2, ISA_AVX2},
        {"avx512", attn_block_avx512, attn_block_q8_avx512, ISA_AVX512},
    };
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        if (isa_max() < paths[p].level) continue;
        double best = 1e30, best8 = 1e30;
        for (int run = 0; run < 5; run++) {
            double t0 = now_ns();
            for (int r = 0; r < REPS; r++) timed(paths[p].f16, NULL, q, G, HD, K, V, N, BS, out);
            double t1 = now_ns();
            for (int r = 0; r < REPS; r++) timed(NULL, paths[p].q8, q, G, HD, K8, V8, N, BS, out);
            double t2 = now_ns();
            best = fmin(best, (t1 - t0) / REPS), best8 = fmin(best8, (t2 - t1) / REPS);
        }
        printf("attn bench %-6s g %d hd %d n %d: f16 %8.0f ns  int8 %8.0f ns\n", paths[p].name, G, HD, N, best, best8);
    }
}

int main(void) {
    const int dims[] = {16, 64, 128}, groups[] = {1, 3, 5, 8}, lens[] = {1, 7, 16, 33, 300};
    const int bss[] = {16, 32};
    int levels = isa_max();
    SKIP_SIMD_ABOVE("attn (f16 and int8 K/V)", levels);
    for (size_t di = 0; di < 3; di++)
        for (size_t gi = 0; gi < 4; gi++)
            for (size_t li = 0; li < 5; li++)
                for (size_t bi = 0; bi < 2; bi++) {
                    int hd = dims[di], g = groups[gi], n = lens[li], bs = bss[bi];
                    float *q = malloc(sizeof(float) * (size_t)(g * hd));
                    uint16_t *K = malloc(2 * (size_t)(n * hd)), *V = malloc(2 * (size_t)(n * hd));
                    float *ref = malloc(sizeof(float) * (size_t)(g * hd));
                    float *got = malloc(sizeof(float) * (size_t)(g * hd));
                    float want[256];
                    /* scores of a few units, like scaled q·k in a real model */
                    for (int i = 0; i < g * hd; i++) q[i] = frand() * 3.0f / sqrtf((float)hd) * 4;
                    for (int i = 0; i < n * hd; i++) K[i] = quant_f32_to_f16(frand());
                    for (int i = 0; i < n * hd; i++) V[i] = quant_f32_to_f16(frand() * 2);
                    blocked(attn_block_ref, q, g, hd, K, V, n, bs, ref);
                    for (int j = 0; j < g; j++) {
                        direct(q + j * hd, K, V, n, hd, want);
                        CHECK(max_rel(ref + j * hd, want, hd) < 1e-4f,
                              "reference vs direct: hd %d g %d n %d bs %d err %g", hd, g, n, bs,
                              max_rel(ref + j * hd, want, hd));
                    }
                    /* soft-capped scores (cap 2: well inside the scores' range): the
                     * reference and each SIMD level against the definition */
                    block_fn capped[] = {attn_block_ref,
#if defined(__x86_64__)
                                         levels >= ISA_AVX2 ? attn_block_avx2 : NULL,
                                         levels >= ISA_AVX512 ? attn_block_avx512 : NULL
#endif
                    };
                    for (size_t ci = 0; ci < sizeof capped / sizeof capped[0]; ci++) {
                        if (!capped[ci]) continue;
                        g_softcap = 2.0f;
                        blocked(capped[ci], q, g, hd, K, V, n, bs, got);
                        g_softcap = 0.0f;
                        for (int j = 0; j < g; j++) {
                            direct_capped(q + j * hd, K, V, n, hd, 2.0, want);
                            CHECK(max_rel(got + j * hd, want, hd) < 1e-4f,
                                  "soft-capped vs direct, path %zu: hd %d g %d n %d bs %d err %g", ci,
                                  hd, g, n, bs, max_rel(got + j * hd, want, hd));
                        }
                    }
                    /* Each SIMD level against the reference: a polynomial exp and FMA
                     * ordering give ~1e-6 relative differences; 1e-4 leaves margin. */
                    if (levels >= ISA_AVX2) {
                        blocked(attn_block_avx2, q, g, hd, K, V, n, bs, got);
                        CHECK(max_rel(got, ref, g * hd) < 1e-4f, "avx2: hd %d g %d n %d err %g",
                              hd, g, n, max_rel(got, ref, g * hd));
                    }
                    if (levels >= ISA_AVX512) {
                        blocked(attn_block_avx512, q, g, hd, K, V, n, bs, got);
                        CHECK(max_rel(got, ref, g * hd) < 1e-4f, "avx512: hd %d g %d n %d err %g",
                              hd, g, n, max_rel(got, ref, g * hd));
                    }
                    /* int8 K/V with a scale each: the reference against the f16 path
                     * over the same values (exact in f16), then each SIMD level */
                    int8_t *K8 = malloc((size_t)(n * hd)), *V8 = malloc((size_t)(n * hd));
                    float ks = 1.0f / 64, vs = 1.0f / 32;
                    for (int i = 0; i < n * hd; i++) {
                        K8[i] = (int8_t)((int)(frand() * 127.0f)), V8[i] = (int8_t)((int)(frand() * 127.0f));
                        K[i] = quant_f32_to_f16(K8[i] * ks), V[i] = quant_f32_to_f16(V8[i] * vs);
                    }
                    blocked(attn_block_ref, q, g, hd, K, V, n, bs, ref);
                    blocked_q8(attn_block_q8_ref, q, g, hd, K8, ks, V8, vs, n, bs, got);
                    CHECK(max_rel(got, ref, g * hd) < 1e-5f, "q8 ref vs f16 ref: hd %d g %d n %d err %g",
                          hd, g, n, max_rel(got, ref, g * hd));
                    float *simd = malloc(sizeof(float) * (size_t)(g * hd));
                    if (levels >= ISA_AVX2) {
                        blocked_q8(attn_block_q8_avx2, q, g, hd, K8, ks, V8, vs, n, bs, simd);
                        CHECK(max_rel(simd, got, g * hd) < 1e-4f, "q8 avx2: hd %d g %d n %d err %g",
                              hd, g, n, max_rel(simd, got, g * hd));
                    }
                    if (levels >= ISA_AVX512) {
                        blocked_q8(attn_block_q8_avx512, q, g, hd, K8, ks, V8, vs, n, bs, simd);
                        CHECK(max_rel(simd, got, g * hd) < 1e-4f, "q8 avx512: hd %d g %d n %d err %g",
                              hd, g, n, max_rel(simd, got, g * hd));
                    }
                    free(K8), free(V8), free(simd);
                    free(q), free(K), free(V), free(ref), free(got);
                }
    const char *b = getenv("ATTN_BENCH");
    if (b && *b == '1') bench();
    return check_done("attn");
}
