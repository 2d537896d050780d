/* kbench: the packed CPU kernels' speed on this machine, one thread, beside the rate of
 * the multiply instruction each stands on, measured in the same run: where a kernel
 * stands against its ceiling before anyone reads a model-level figure.
 *
 *   make bench-kernels                      (part of make bench)
 *   build/gnu/kbench [--n N] [--ms M]       (KILN_SIMD=avx2 etc.: another SIMD level)
 *
 * Per type the loader packs at this level (qp_wanted): 32 random rows of N elements
 * (default 2048) through the reference quantizer, packed once, then qp_tile timed at two
 * shapes with the weights in cache: a prefill task (the 32 rows x 512 tokens of one task
 * of a 512-token step, model.c's MM_CHUNK_BATCH) and a decode column (the 32 rows x 1
 * token). Each figure is the best of repeated batches of calls over M ms (default 300):
 * the VMs these run on have noisy neighbours, and the best batch is the kernel's own
 * speed.
 * The instruction rates: 12 independent chains of one instruction (vpdpbusd zmm: 64
 * products; vfmadd231ps zmm: 16; vdpbf16ps zmm: 32), where the CPU has it. The int8
 * types' kernels stand on vpdpbusd, F16 on the FMA, BF16 on whichever isa_dpbf16()
 * picks (where that is vdpbf16ps, BF16's FMA kernel is timed after the rest as well);
 * at AVX2 no share is printed (those kernels stand on vpmaddubsw pairs).
 * A K-quant's ceiling is below 100%: its sub-block scales and mins take multiply-pipe
 * instructions of their own (qpack.h's arithmetic; BENCHMARKS.md counts them). Where AMX
 * runs a type's prefill tile (isa.h), its share is still of vpdpbusd's rate.
 *
 * Then decode from memory (--stream-mib M, default 256; 0: off): 64 packed groups of
 * the type's rows laid out in a random order to M MiB (on huge pages where the kernel
 * gives them, as the loader's packed weights are), far past the caches, streamed by
 * decode's own arrangement (core/threads' pool, --threads, default 2; matrices of 8,192
 * rows, two tasks a thread each, one column), against a plain vector read of the same
 * buffer by the same tasks,
 * the two alternating, best of 5 each: whether a type's decode reads at the memory's
 * rate, or its kernel (its prefetches, its work per byte) holds it below, on a machine
 * whose read rate moves from minute to minute.
 *
 * Prints: kbench: isa=L dpbusd_gmac_s=X fma_gmac_s=Y dpbf16_gmac_s=Z
 *         kbench: type=T n=N prefill_gmac_s=A prefill_pct=P decode_gmac_s=B decode_pct=Q
 *         kbench: type=T stream_mib=M threads=H decode_gb_s=D read_gb_s=R stream_pct=S */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <immintrin.h>

#include "core/cpu/isa.h"
#include "core/cpu/qpack.h"
#include "core/cpu/quant.h"
#include "core/threads.h"

#define ROWS 32
#define PREFILL_COLS 512

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- instruction rates */

#define CHAINS12(op)                                                                        \
    op " %%zmm20,%%zmm21,%%zmm0\n" op " %%zmm20,%%zmm21,%%zmm1\n" op " %%zmm20,%%zmm21,%%zmm2\n" \
    op " %%zmm20,%%zmm21,%%zmm3\n" op " %%zmm20,%%zmm21,%%zmm4\n" op " %%zmm20,%%zmm21,%%zmm5\n" \
    op " %%zmm20,%%zmm21,%%zmm6\n" op " %%zmm20,%%zmm21,%%zmm7\n" op " %%zmm20,%%zmm21,%%zmm8\n" \
    op " %%zmm20,%%zmm21,%%zmm9\n" op " %%zmm20,%%zmm21,%%zmm10\n" op " %%zmm20,%%zmm21,%%zmm11\n"
/* the chains start at zero: no stale denormal or NaN may slow an FMA */
#define ZERO12                                                                              \
    "vpxord %%zmm0,%%zmm0,%%zmm0\n vpxord %%zmm1,%%zmm1,%%zmm1\n vpxord %%zmm2,%%zmm2,%%zmm2\n"  \
    "vpxord %%zmm3,%%zmm3,%%zmm3\n vpxord %%zmm4,%%zmm4,%%zmm4\n vpxord %%zmm5,%%zmm5,%%zmm5\n"  \
    "vpxord %%zmm6,%%zmm6,%%zmm6\n vpxord %%zmm7,%%zmm7,%%zmm7\n vpxord %%zmm8,%%zmm8,%%zmm8\n"  \
    "vpxord %%zmm9,%%zmm9,%%zmm9\n vpxord %%zmm10,%%zmm10,%%zmm10\n vpxord %%zmm11,%%zmm11,%%zmm11\n"
#define RATE_LOOP(op)                                                                       \
    __asm__ volatile(ZERO12 "vpxord %%zmm20,%%zmm20,%%zmm20\n vpxord %%zmm21,%%zmm21,%%zmm21\n" \
                     "1:\n" CHAINS12(op) "dec %0\n jnz 1b\n"                               \
                     : "+r"(n)                                                             \
                     :                                                                     \
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",     \
                       "xmm8", "xmm9", "xmm10", "xmm11", "xmm20", "xmm21", "memory")

__attribute__((target("avx512f,avx512vnni"))) static void loop_dpbusd(long n) { RATE_LOOP("vpdpbusd"); }
__attribute__((target("avx512f"))) static void loop_fma(long n) { RATE_LOOP("vfmadd231ps"); }
__attribute__((target("avx512f,avx512bf16"))) static void loop_dpbf16(long n) { RATE_LOOP("vdpbf16ps"); }

/* Products per second of `loop` at its best over a few passes. */
static double rate(void (*loop)(long), int products) {
    const long iters = 2000000; /* 24M instructions, ~10 ms */
    double best = 1e30;
    for (int pass = 0; pass < 7; pass++) {
        double t0 = now_s();
        loop(iters);
        double t = now_s() - t0;
        if (t < best) best = t;
    }
    return 12.0 * iters * products / best;
}

/* ---------------------------------------------------------------- the kernels */

static const uint32_t types[] = {QT_Q4_1, QT_Q5_1, QT_Q8_0, QT_Q4_0, QT_Q5_0,
                                 QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_F16, QT_BF16};

static float frand(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 16777216.0f - 0.5f;
}

/* Best products per second of qp_tile over ROWS rows x nc columns for about ms, timed
 * in batches of calls of >= 50 us each (a decode column's call is about a microsecond:
 * alone, the clock reads would be a few percent of it). */
static double tile_rate(uint32_t type, int64_t n, const void *wp, const void *x, size_t xs, int nc,
                        float *out, double ms) {
    double best = 1e30, end = now_s() + ms * 1e-3;
    int calls = 1;
    do {
        double t0 = now_s();
        for (int i = 0; i < calls; i++) qp_tile(type, n, wp, 0, ROWS, x, xs, nc, out, ROWS);
        double t = now_s() - t0;
        if (t < 50e-6 && calls < 1 << 20) calls *= 2; /* a batch too short to time: longer */
        else if (t / calls < best) best = t / calls;
    } while (now_s() < end || best == 1e30);
    return (double)n * ROWS * nc / best;
}

/* The rate the type's kernel stands on at this level, 0 when none is printed. */
static double ceiling(uint32_t type, double dpbusd, double fma, double dpbf16) {
    if (isa_level() < ISA_AVX512) return 0;
    if (type == QT_F16) return fma;
    if (type == QT_BF16) return isa_dpbf16() ? dpbf16 : fma;
    return dpbusd;
}

static int bench_type(uint32_t type, int64_t n, double ms, double peak) {
    const quant_traits *t = quant_traits_of(type);
    if (!qp_wanted(type)) { /* the loader keeps it row-major here: not these kernels */
        printf("kbench: type=%s not packed at this level\n", t->name);
        return 0;
    }
    size_t rs = quant_row_size(type, n), xsz = quant_row_size((uint32_t)t->dot_type, n);
    size_t pb = qp_bytes(type, n, ROWS);
    if (!rs || !xsz || !pb) {
        fprintf(stderr, "kbench: %s: no packed layout at n=%lld\n", t->name, (long long)n);
        return 1;
    }
    float *f = malloc((size_t)n * sizeof *f), *out = malloc(sizeof(float) * ROWS * PREFILL_COLS);
    uint8_t *w = malloc(rs * ROWS), *x = malloc(xsz * PREFILL_COLS);
    void *wp = aligned_alloc(64, (pb + 63) / 64 * 64);
    if (!f || !out || !w || !x || !wp) {
        fprintf(stderr, "kbench: out of memory\n");
        return 1;
    }
    uint32_t seed = 1;
    for (int r = 0; r < ROWS; r++) {
        for (int64_t i = 0; i < n; i++) f[i] = frand(&seed);
        quant_quantize_ref(type, f, w + r * rs, n);
    }
    for (int c = 0; c < PREFILL_COLS; c++) {
        for (int64_t i = 0; i < n; i++) f[i] = frand(&seed);
        quant_quantize((uint32_t)t->dot_type, f, x + c * xsz, n);
    }
    qp_pack(type, n, w, rs, ROWS, wp);
    double pre = tile_rate(type, n, wp, x, xsz, PREFILL_COLS, out, ms);
    double dec = tile_rate(type, n, wp, x, xsz, 1, out, ms);
    printf("kbench: type=%s n=%lld prefill_gmac_s=%.1f", t->name, (long long)n, pre * 1e-9);
    if (peak > 0) printf(" prefill_pct=%.0f", 100 * pre / peak);
    printf(" decode_gmac_s=%.1f", dec * 1e-9);
    if (peak > 0) printf(" decode_pct=%.0f", 100 * dec / peak);
    printf("\n");
    fflush(stdout);
    free(f), free(out), free(w), free(x), free(wp);
    return 0;
}

/* ---------------------------------------------------------------- decode from memory */

#define STREAM_MAT_ROWS 8192 /* an FFN matrix of the 1B shape: decode's barrier per matrix */
#define STREAM_PASSES 5
#define STREAM_GROUPS 64      /* distinct groups in a random order: pages seldom alike, so
                               * a host that merges like pages has next to none to fold */
#define HUGE_PAGE (2u << 20)

typedef struct {
    uint32_t type;
    int64_t n;
    const uint8_t *wp, *x; /* packed rows; one column of activations */
    size_t row_bytes;      /* packed bytes per row (a group's over QP_ROWS) */
    int r0, rows, per;     /* this matrix's first row and rows; rows per task */
    float *out;
    uint64_t sink;         /* the plain reads' sums, kept so their loads stay */
} stream_job;

static void stream_decode_task(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    const stream_job *j = ctx;
    int a = task * j->per, nr = j->rows - a < j->per ? j->rows - a : j->per;
    qp_tile(j->type, j->n, j->wp, j->r0 + a, nr, j->x, 0, 1, j->out + a, 0);
}

/* The same rows' bytes summed 128 bytes a step: what the memory gives a task that does
 * nothing else (AVX2 loads are enough to reach it). */
__attribute__((target("avx2"))) static void stream_read_task(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    stream_job *j = ctx;
    int a = task * j->per, nr = j->rows - a < j->per ? j->rows - a : j->per;
    const uint8_t *p = j->wp + (size_t)(j->r0 + a) * j->row_bytes;
    const uint8_t *e = p + (size_t)nr * j->row_bytes;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (; p + 128 <= e; p += 128) {
        s0 = _mm256_add_epi64(s0, _mm256_load_si256((const __m256i *)p));
        s1 = _mm256_add_epi64(s1, _mm256_load_si256((const __m256i *)(p + 32)));
        s2 = _mm256_add_epi64(s2, _mm256_load_si256((const __m256i *)(p + 64)));
        s3 = _mm256_add_epi64(s3, _mm256_load_si256((const __m256i *)(p + 96)));
    }
    __m256i v = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
    __atomic_fetch_xor(&j->sink, (uint64_t)_mm256_extract_epi64(v, 0), __ATOMIC_RELAXED);
}

/* Seconds for one pass over every matrix of the buffer, a pool job per matrix. */
static double stream_pass(thr_pool *tp, thr_fn fn, stream_job *j, int rows) {
    int per = STREAM_MAT_ROWS / (2 * thr_pool_size(tp));
    double t0 = now_s();
    for (int r = 0; r < rows; r += STREAM_MAT_ROWS) {
        j->r0 = r;
        j->rows = rows - r < STREAM_MAT_ROWS ? rows - r : STREAM_MAT_ROWS;
        j->per = per;
        thr_run(tp, fn, j, (j->rows + per - 1) / per);
    }
    return now_s() - t0;
}

static int stream_type(uint32_t type, int64_t n, size_t mib, thr_pool *tp) {
    const quant_traits *t = quant_traits_of(type);
    if (!qp_wanted(type)) return 0;
    size_t rs = quant_row_size(type, n), xsz = quant_row_size((uint32_t)t->dot_type, n);
    size_t gb = qp_bytes(type, n, QP_ROWS);
    if (gb % 128) { /* the plain read's steps stay inside a task's rows */
        fprintf(stderr, "kbench: %s: a group of %zu bytes is no multiple of 128\n", t->name, gb);
        return 1;
    }
    int groups = (int)((mib << 20) / gb), rows = groups * QP_ROWS;
    size_t wbytes = ((size_t)groups * gb + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    float *f = malloc((size_t)n * sizeof *f), *out = malloc((size_t)rows * sizeof *out);
    uint8_t *w = malloc(rs * QP_ROWS), *x = malloc(xsz), *pool = malloc(STREAM_GROUPS * gb);
    uint8_t *wp = aligned_alloc(HUGE_PAGE, wbytes);
    if (!f || !out || !w || !x || !pool || !wp || groups < 1) {
        fprintf(stderr, "kbench: %s: no room for %zu MiB of its groups\n", t->name, mib);
        free(f), free(out), free(w), free(x), free(pool), free(wp);
        return 1;
    }
    madvise(wp, wbytes, MADV_HUGEPAGE); /* advice: without it the figures are 4 KB pages' */
    uint32_t seed = 7;
    for (int g = 0; g < STREAM_GROUPS; g++) {
        for (int r = 0; r < QP_ROWS; r++) {
            for (int64_t i = 0; i < n; i++) f[i] = frand(&seed);
            quant_quantize_ref(type, f, w + r * rs, n);
        }
        qp_pack(type, n, w, rs, QP_ROWS, pool + (size_t)g * gb);
    }
    for (int64_t i = 0; i < n; i++) f[i] = frand(&seed);
    quant_quantize((uint32_t)t->dot_type, f, x, n);
    for (int g = 0; g < groups; g++) {
        seed = seed * 1664525u + 1013904223u;
        memcpy(wp + (size_t)g * gb, pool + (size_t)(seed >> 26) * gb, gb); /* 64 = 2^6 */
    }
    stream_job j = {.type = type, .n = n, .wp = wp, .x = x, .row_bytes = gb / QP_ROWS, .out = out};
    double dec = 1e30, rd = 1e30;
    stream_pass(tp, stream_decode_task, &j, rows); /* untimed: pages and pool warm */
    for (int pass = 0; pass < STREAM_PASSES; pass++) {
        double a = stream_pass(tp, stream_decode_task, &j, rows);
        double b = stream_pass(tp, stream_read_task, &j, rows);
        if (a < dec) dec = a;
        if (b < rd) rd = b;
    }
    double bytes = (double)groups * gb;
    printf("kbench: type=%s stream_mib=%zu threads=%d decode_gb_s=%.1f read_gb_s=%.1f "
           "stream_pct=%.0f\n", t->name, mib, thr_pool_size(tp), bytes / dec * 1e-9,
           bytes / rd * 1e-9, 100 * rd / dec);
    fflush(stdout);
    free(f), free(out), free(w), free(x), free(pool), free(wp);
    return 0;
}

int main(int argc, char **argv) {
    int64_t n = 2048;
    double ms = 300;
    long mib = 256, threads = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc) n = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--ms") && i + 1 < argc) ms = atof(argv[++i]);
        else if (!strcmp(argv[i], "--stream-mib") && i + 1 < argc) mib = atol(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atol(argv[++i]);
        else {
            fprintf(stderr, "usage: kbench [--n N] [--ms M] [--stream-mib M] [--threads T]\n");
            return 2;
        }
    }
    if (n <= 0 || n % 256 || n > QP_MAX_N || ms <= 0 || mib < 0 || mib > 65536 || threads < 1 ||
        threads > 256) {
        fprintf(stderr, "kbench: --n must be a positive multiple of 256 up to %d, --ms positive, "
                        "--stream-mib 0..65536, --threads 1..256\n", QP_MAX_N);
        return 2;
    }
    __builtin_cpu_init();
    double dpbusd = __builtin_cpu_supports("avx512vnni") ? rate(loop_dpbusd, 64) : 0;
    double fma = __builtin_cpu_supports("avx512f") ? rate(loop_fma, 16) : 0;
    double dpbf16 = __builtin_cpu_supports("avx512bf16") ? rate(loop_dpbf16, 32) : 0;
    printf("kbench: isa=%s dpbusd_gmac_s=%.1f fma_gmac_s=%.1f dpbf16_gmac_s=%.1f\n", isa_name(isa_level()),
           dpbusd * 1e-9, fma * 1e-9, dpbf16 * 1e-9);
    int bad = 0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        bad |= bench_type(types[i], n, ms, ceiling(types[i], dpbusd, fma, dpbf16));
    if (isa_level() >= ISA_AVX512 && isa_dpbf16()) { /* the FMA kernel too: Intel's CPUs run it */
        isa_set_dpbf16(0);
        printf("kbench: BF16 on FMAs (where vdpbf16ps is slow):\n");
        bad |= bench_type(QT_BF16, n, ms, ceiling(QT_BF16, dpbusd, fma, dpbf16));
        isa_set_dpbf16(1);
    }
    if (mib > 0 && !__builtin_cpu_supports("avx2")) { /* the plain read's loads */
        printf("kbench: no AVX2: no decode from memory\n");
        mib = 0;
    }
    if (mib > 0) {
        thr_pool *tp = thr_pool_new((int)threads);
        if (!tp) {
            fprintf(stderr, "kbench: cannot start %ld threads\n", threads);
            return 1;
        }
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
            bad |= stream_type(types[i], n, (size_t)mib, tp);
        thr_pool_free(tp);
    }
    return bad;
}
