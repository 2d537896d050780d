/* test_vmath: the SIMD SwiGLU, residual add and RMSNorm against the plain C references, over
 * lengths that end on and off a vector (the padded tail), inputs from tiny to past exp's
 * range, and the check that an element's result does not depend on its place in a row.
 * VMATH_BENCH=1 also prints ns per SwiGLU row of SmolLM2-135M (1536). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "core/cpu/isa.h"
#include "core/cpu/vmath.h"

typedef void (*swiglu_fn)(float *, const float *, const float *, int);
typedef void (*add_fn)(float *, const float *, int);
typedef void (*norm_fn)(float *, const float *, const float *, int, float);

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) / (double)(1ull << 23)) - 1.0f;
}

/* |got - want| within rel of |want| (plus a floor for values near 0) */
static int close_to(float got, float want, float rel) {
    return fabsf(got - want) <= rel * fabsf(want) + 1e-30f;
}

static void test_swiglu(const char *name, swiglu_fn fn) {
    enum { N = 1536 + 13 };
    static float g[N], u[N], want[N], got[N], alone[1];
    const float scales[] = {1e-3f, 1.0f, 8.0f, 40.0f, 120.0f};
    for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
        for (int i = 0; i < N; i++) g[i] = frand() * scales[si], u[i] = frand() * 3.0f;
        int lens[] = {1, 7, 8, 15, 16, 17, 576, 1536, N};
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int n = lens[li], bad = -1;
            vm_swiglu_ref(want, g, u, n);
            fn(got, g, u, n);
            for (int i = 0; i < n && bad < 0; i++) {
                /* past exp's range the reference gives -0 (x / inf), the SIMD path
                 * ~5e-37 * x (vmath_simd.h): both round to nothing next to anything */
                if (g[i] < -87.0f ? fabsf(got[i]) < 1e-30f : close_to(got[i], want[i], 2e-6f)) continue;
                bad = i;
            }
            CHECK(bad < 0, "%s swiglu: scale %g n %d: element %d: %g want %g", name, scales[si], n, bad,
                  bad < 0 ? 0.0 : got[bad], bad < 0 ? 0.0 : want[bad]);
        }
        /* each element alone (the padded tail) gives exactly what it gives in a row */
        fn(got, g, u, N);
        int same = 1;
        for (int i = 0; i < N; i += 37) {
            fn(alone, g + i, u + i, 1);
            same &= memcmp(alone, got + i, sizeof alone) == 0;
        }
        CHECK(same, "%s swiglu: scale %g: an element alone gives its bits in a row", name, scales[si]);
    }
    /* far past exp's range: silu(x) = x above, ~0 below (the reference's -0) */
    float x[2] = {1e30f, -1e30f}, one[2] = {1, 1}, o[2];
    fn(o, x, one, 2);
    CHECK(o[0] == 1e30f && fabsf(o[1]) < 1e-6f, "%s swiglu: silu(1e30) = 1e30, silu(-1e30) ~ 0: %g %g", name,
          o[0], o[1]);
}

static void test_add(const char *name, add_fn fn) {
    enum { N = 1536 + 5 };
    static float a[N], o1[N], o2[N];
    for (int i = 0; i < N; i++) a[i] = frand() * 100, o1[i] = o2[i] = frand();
    vm_add_ref(o1, a, N);
    fn(o2, a, N);
    CHECK(memcmp(o1, o2, sizeof o1) == 0, "%s add: the same bits as the reference", name);
}

/* vm_add_rows: each row as vm_add_ref gives it, nothing outside the rows touched */
static void test_add_rows(void) {
    enum { N = 16, ROWS = 9, OS = 40, AS = 21 };
    static float a[ROWS * AS], o1[ROWS * OS], o2[ROWS * OS];
    for (int i = 0; i < ROWS * AS; i++) a[i] = frand() * 100;
    for (int i = 0; i < ROWS * OS; i++) o1[i] = o2[i] = frand();
    for (int r = 0; r < ROWS; r++) vm_add_ref(o1 + r * OS, a + r * AS, N);
    vm_add_rows(o2, OS, a, AS, N, ROWS);
    CHECK(memcmp(o1, o2, sizeof o1) == 0, "add_rows: each row the reference's bits, the gaps untouched");
    /* vm_swiglu_rows: each row as vm_swiglu gives it at this level */
    static float g[ROWS * AS], u[ROWS * AS];
    for (int i = 0; i < ROWS * AS; i++) g[i] = frand() * 8, u[i] = frand();
    for (int i = 0; i < ROWS * OS; i++) o1[i] = o2[i] = frand();
    for (int r = 0; r < ROWS; r++) vm_swiglu(o1 + r * OS, g + r * AS, u + r * AS, N);
    vm_swiglu_rows(o2, OS, g, u, AS, N, ROWS);
    CHECK(memcmp(o1, o2, sizeof o1) == 0, "swiglu_rows: each row vm_swiglu's bits, the gaps untouched");
}

/* every path gives the reference's bits (one summation order, vmath.h), on lengths on
 * and off the 16 lanes, inputs from tiny to large */
static void test_rmsnorm(const char *name, norm_fn fn) {
    enum { N = 1536 + 13 };
    static float x[N], w[N], want[N], got[N];
    const float scales[] = {1e-6f, 1.0f, 300.0f};
    int lens[] = {1, 7, 15, 16, 17, 33, 576, 1536, N};
    for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++)
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int n = lens[li];
            for (int i = 0; i < n; i++) x[i] = frand() * scales[si], w[i] = 1.0f + frand();
            vm_rmsnorm_ref(want, x, w, n, 1e-5f);
            fn(got, x, w, n, 1e-5f);
            CHECK(memcmp(got, want, (size_t)n * sizeof(float)) == 0, "%s rmsnorm: scale %g n %d: the "
                  "reference's bits", name, scales[si], n);
        }
    /* and the reference is an RMSNorm: against a double-precision one */
    int n = 576;
    for (int i = 0; i < n; i++) x[i] = frand() * 3, w[i] = 1.0f + frand();
    fn(got, x, w, n, 1e-5f);
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    double sc = 1.0 / sqrt(ss / n + 1e-5);
    int bad = -1;
    for (int i = 0; i < n && bad < 0; i++)
        if (fabs(got[i] - x[i] * sc * w[i]) > 1e-6 * (fabs(x[i] * sc * w[i]) + 1e-6)) bad = i;
    CHECK(bad < 0, "%s rmsnorm: within 1e-6 of a double-precision RMSNorm (element %d)", name, bad);
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void bench(const char *name, swiglu_fn fn) {
    enum { N = 1536, REPS = 20000 };
    static float g[N], u[N], o[N];
    for (int i = 0; i < N; i++) g[i] = frand() * 4, u[i] = frand();
    double best = 1e30;
    for (int run = 0; run < 5; run++) {
        double t0 = now_ns();
        for (int r = 0; r < REPS; r++) fn(o, g, u, N);
        best = fmin(best, (now_ns() - t0) / REPS);
    }
    printf("vmath bench %-6s swiglu n %d: %7.0f ns\n", name, N, best);
}

int main(void) {
    int levels = isa_max();
    SKIP_SIMD_ABOVE("vmath (swiglu, add, rmsnorm)", levels);
    struct { const char *name; swiglu_fn sw; add_fn add; norm_fn norm; int level; } paths[] = {
        {"ref", vm_swiglu_ref, vm_add_ref, vm_rmsnorm_ref, ISA_SCALAR},
        {"avx2", vm_swiglu_avx2, vm_add_avx2, vm_rmsnorm_avx2, ISA_AVX2},
        {"avx512", vm_swiglu_avx512, vm_add_avx512, vm_rmsnorm_avx512, ISA_AVX512},
    };
    const char *b = getenv("VMATH_BENCH");
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        if (levels < paths[p].level) continue;
        test_swiglu(paths[p].name, paths[p].sw);
        test_add(paths[p].name, paths[p].add);
        test_rmsnorm(paths[p].name, paths[p].norm);
        if (b && *b == '1') bench(paths[p].name, paths[p].sw);
    }
    test_add_rows();
    return check_done("vmath");
}
