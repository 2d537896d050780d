/* test_qpack: the packed Q4_1, Q8_0, Q4_0, Q5_0, Q5_1, F16, BF16, Q4_K, Q5_K and Q6_K kernels (core/cpu/qpack) against their C reference, bit for
 * bit, at every SIMD level the machine has, over row counts on and off a 16-row group,
 * row offsets, column counts on and off the 8- and 16-column passes, and widths from
 * one block to SmolLM2's 1536 (K-quants: one super-block to Llama-3's 2048, with every
 * scale and quant byte random, so negative Q6_K scales and extreme values are in); the reference against the row-major quant_dot_ref (the same dot up
 * to rounding); no store past the rows asked for; batch invariance (a column alone
 * gives its bits in a tile), and the AMX tiles where the CPU has AMX. QPACK_BENCH=1 also
 * times the packed tile beside the row-major quant_dot_tile on the shapes of a forward
 * pass. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "core/cpu/isa.h"
#include "core/cpu/qpack.h"
#include "core/cpu/quant.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static float frand(void) { /* [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) / (double)(1ull << 23)) - 1.0f;
}

/* BF16 weights and activations at the edges: in some rows and columns the first 8
 * elements around the 2^-48 floor; in others all of them near 2^-70 or 2^-40, so that
 * a tiny row meets a tiny column: without the floor their products and sums would be
 * denormal, which vdpbf16ps flushes and an FMA keeps; and one f32 denormal. */
static void bf16_edges(float *f, int64_t n, int k) {
    if (k % 3 == 0)
        for (int i = 0; i < 8 && i < n; i++) f[i] = ldexpf(f[i] < 0 ? -1.0f : 1.0f, -47 - i % 4) * (1.0f + 0.25f * (float)(i % 3));
    if (k % 5 == 0 || k % 7 == 0)
        for (int64_t i = 0; i < n; i++) f[i] = ldexpf(f[i], k % 5 == 0 ? -70 : -40);
    if (n > 9 && k % 2 == 0) f[9] = 1e-39f;
}

/* nr rows of n of `type`, each with its own scale and offset (weights of a real layer
 * differ row to row), row-major with stride rs. */
static void make_rows(uint32_t type, uint8_t *w, size_t rs, int nr, int64_t n) {
    float *f = malloc((size_t)n * sizeof(float));
    for (int r = 0; r < nr; r++) {
        float sc = 0.01f + 0.2f * fabsf(frand()), off = 0.05f * frand();
        for (int64_t i = 0; i < n; i++) f[i] = off + sc * frand();
        if (type == QT_BF16) bf16_edges(f, n, r);
        quant_quantize_ref(type, f, w + (size_t)r * rs, n);
    }
    free(f);
}

/* K-quant blocks with every byte but the f16 scales random: a quantizer never makes
 * some of these (negative or extreme Q6_K scales, full-range Q4_K 6-bit fields), a
 * GGUF may hold them all. */
static uint8_t rbyte(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint8_t)(rng >> 33);
}
static void scramble_k(uint32_t type, uint8_t *w, size_t bytes) {
    size_t bb = quant_traits_of(type)->bytes;
    for (size_t at = 0; at + bb <= bytes; at += bb) {
        if (type == QT_Q4_K || type == QT_Q5_K) /* d, dmin first */
            for (size_t i = 4; i < bb; i++) w[at + i] = rbyte();
        else if (type == QT_Q6_K) /* d last */
            for (size_t i = 0; i < bb - 2; i++) w[at + i] = rbyte();
    }
}

static void make_cols(uint32_t dt, uint8_t *x, size_t xs, int nc, int64_t n) {
    float *f = malloc((size_t)n * sizeof(float));
    for (int c = 0; c < nc; c++) {
        float sc = 0.1f + 3.0f * fabsf(frand());
        for (int64_t i = 0; i < n; i++) f[i] = sc * frand();
        if (dt == QT_BF16) bf16_edges(f, n, c + 1);
        quant_quantize_ref(dt, f, x + (size_t)c * xs, n);
    }
    free(f);
}

static void test_bytes(void) {
    CHECK(qp_bytes(QT_Q4_1, 576, 16) == 16 * 18 * 20, "one group of 576");
    CHECK(qp_bytes(QT_Q4_1, 576, 17) == 2 * 16 * 18 * 20, "a partial group is padded");
    CHECK(qp_bytes(QT_Q4_1, 33, 16) == 0, "n off the block");
    CHECK(qp_bytes(QT_Q4_1, 576, 0) == 0, "no rows");
    CHECK(qp_bytes(QT_Q8_0, 576, 16) == 16 * 18 * 36, "Q8_0: 36 bytes per row and block");
    CHECK(qp_bytes(QT_Q8_0, QP_MAX_N, 1) > 0 && qp_bytes(QT_Q8_0, QP_MAX_N + 32, 1) == 0,
          "Q8_0 rows up to QP_MAX_N");
    CHECK(qp_bytes(QT_Q4_0, 576, 16) == 9 * 576 && qp_bytes(QT_Q4_0, 96, 16) == 0,
          "Q4_0: two blocks per group-block, 18 bytes per row and block");
    CHECK(qp_bytes(QT_Q5_0, 576, 16) == 9 * 704 && qp_bytes(QT_Q5_1, 576, 16) == 18 * 384,
          "Q5_0, Q5_1: 22 and 24 bytes per row and block");
    CHECK(qp_bytes(QT_F16, 576, 16) == 18 * 1024 && qp_bytes(QT_BF16, 64, 1) == 2048,
          "F16, BF16: 2 bytes per row and element");
    CHECK(qp_bytes(QT_F32, 576, 16) == 0 && !qp_wanted(QT_F32), "F32 has no packed layout");
    CHECK(qp_bytes(QT_Q4_K, 2048, 16) == 8 * 2368 && qp_bytes(QT_Q4_K, 2048, 17) == 2 * 8 * 2368,
          "Q4_K: 148 bytes per row and super-block");
    CHECK(qp_bytes(QT_Q5_K, 256, 1) == 2880, "Q5_K: 180 bytes per row and super-block");
    CHECK(qp_bytes(QT_Q6_K, 512, 16) == 2 * 3392, "Q6_K: 212 bytes per row and super-block");
    CHECK(qp_bytes(QT_Q4_K, 576, 16) == 0 && qp_bytes(QT_Q6_K, 32, 16) == 0, "K rows off the super-block");
}

/* One shape: NR rows packed, every (r0, nr) range and column count against the
 * reference at the current level, and the reference against quant_dot_ref. */
static void test_shape(uint32_t T, int64_t n, int NR, int level, int against_rowmajor) {
    enum { NC = 35, PAD = 4 }; /* past the AMX tiles' thresholds (13, 25 tokens) by a partial group */
    uint32_t dt = quant_traits_of(T)->dot_type;
    const char *tn = quant_traits_of(T)->name;
    size_t rs = quant_row_size(T, n), xs = quant_row_size(dt, n);
    size_t pb = qp_bytes(T, n, NR);
    uint8_t *w = malloc(rs * NR), *x = malloc(xs * NC);
    uint8_t *p = aligned_alloc(64, (pb + 63) & ~(size_t)63);
    float *got = malloc(sizeof(float) * NC * (NR + PAD)), *want = malloc(sizeof(float) * NC * (NR + PAD));
    float *full = malloc(sizeof(float) * NC * NR);
    make_rows(T, w, rs, NR, n);
    scramble_k(T, w, rs * NR);
    make_cols(dt, x, xs, NC, n);
    qp_pack(T, n, w, rs, NR, p);
    /* The reference once for the whole tile: it computes each (row, column) on its own,
     * so a sub-tile's wanted bits are this tile's (the scalar level's qp_tile, which
     * is the reference, checks that on every sub-tile) */
    qp_tile_ref(T, n, p, 0, NR, x, xs, NC, full, (size_t)NR);
    int r0s[] = {0, 16, 32};
    int ncs[] = {1, 2, 3, 7, 8, 9, 13, 16, 17, 25, 32, NC};
    for (size_t ri = 0; ri < sizeof r0s / sizeof r0s[0]; ri++) {
        int r0 = r0s[ri];
        if (r0 >= NR) continue;
        int nrs[] = {NR - r0, 1, 15, 16, 17};
        for (size_t ni = 0; ni < sizeof nrs / sizeof nrs[0]; ni++) {
            int nr = nrs[ni];
            if (r0 + nr > NR) continue;
            for (size_t ci = 0; ci < sizeof ncs / sizeof ncs[0]; ci++) {
                int nc = ncs[ci];
                size_t os = (size_t)nr + PAD; /* PAD sentinels after each column's rows */
                for (size_t i = 0; i < (size_t)NC * (NR + PAD); i++) got[i] = want[i] = -7.0f;
                for (int c = 0; c < nc; c++)
                    memcpy(want + (size_t)c * os, full + (size_t)c * NR + r0, sizeof(float) * (size_t)nr);
                qp_tile(T, n, p, r0, nr, x, xs, nc, got, os);
                CHECK(memcmp(got, want, sizeof(float) * (size_t)NC * (NR + PAD)) == 0,
                      "%s L%d n %lld rows [%d, %d) x %d columns: the reference's bits, nothing "
                      "stored past the rows", tn, level, (long long)n, r0, r0 + nr, nc);
            }
        }
    }
    /* batch invariance: each column alone gives its bits in the full tile */
    qp_tile(T, n, p, 0, NR, x, xs, NC, want, (size_t)NR);
    int same = 1;
    for (int c = 0; c < NC; c++) {
        qp_tile(T, n, p, 0, NR, x + (size_t)c * xs, xs, 1, got, (size_t)NR);
        same &= memcmp(got, want + (size_t)c * NR, sizeof(float) * NR) == 0;
    }
    CHECK(same, "%s L%d n %lld: a column alone gives its bits in a %d-column tile", tn, level, (long long)n,
          NC);
    if (against_rowmajor) { /* the same dot as the row-major reference, up to rounding:
                             * within 1e-5 of the sum of |w_i x_i| (cancellation makes a
                             * bound relative to the dot itself meaningless) */
        float *wf = malloc((size_t)n * sizeof(float)), *xf = malloc((size_t)n * sizeof(float));
        int bad = -1;
        double worst = 0.0;
        for (int c = 0; c < NC && bad < 0; c++)
            for (int r = 0; r < NR && bad < 0; r++) {
                quant_dequant_ref(T, w + (size_t)r * rs, wf, n);
                quant_dequant_ref(dt, x + (size_t)c * xs, xf, n);
                double mag = 1e-30;
                for (int64_t i = 0; i < n; i++) mag += fabs((double)wf[i] * xf[i]);
                float ref = quant_dot_ref(T, n, w + (size_t)r * rs, x + (size_t)c * xs);
                double err = fabs((double)want[(size_t)c * NR + r] - ref) / mag;
                if (err > worst) worst = err;
                if (err > 1e-5) bad = c * NR + r;
            }
        CHECK(bad < 0, "%s n %lld: packed reference within 1e-5 of quant_dot_ref (worst %.3g, at %d)",
              tn, (long long)n, worst, bad);
        free(wf), free(xf);
    }
    free(w), free(x), free(p), free(got), free(want), free(full);
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* As model.c runs them: CH-row tasks over a 4096-row matrix (16 for the layers, 64 for
 * the output matrix), decode (1 column, weights streamed from a 64 MiB buffer, past
 * the caches) and a batch (32 columns, one matrix). */
static void bench(uint32_t T, int64_t n, int CH) {
    enum { MROWS = 4096, NCB = 32 };
    uint32_t dt = quant_traits_of(T)->dot_type;
    size_t rs = quant_row_size(T, n), xs = quant_row_size(dt, n);
    int nmat = (int)((64u << 20) / (rs * MROWS)) + 1;
    size_t rows = (size_t)nmat * MROWS, pb = qp_bytes(T, n, (int)rows);
    uint8_t *w = malloc(rs * rows), *p = aligned_alloc(64, pb), *x = malloc(xs * NCB);
    float *out = malloc(sizeof(float) * MROWS * NCB);
    make_rows(T, w, rs, 64, n);
    for (size_t r = 64; r < rows; r++) memcpy(w + r * rs, w + (r % 64) * rs, rs);
    qp_pack(T, n, w, rs, (int)rows, p);
    make_cols(dt, x, xs, NCB, n);
    double best[4] = {1e30, 1e30, 1e30, 1e30};
    for (int it = 0; it < 15; it++) {
        double t[5];
        t[0] = now_ns();
        for (size_t r = 0; r < rows; r += CH)
            quant_dot_tile(T, n, w + r * rs, rs, CH, x, xs, 1, out + r % MROWS, CH);
        t[1] = now_ns();
        for (size_t r = 0; r < rows; r += CH) qp_tile(T, n, p, (int)r, CH, x, xs, 1, out + r % MROWS, CH);
        t[2] = now_ns();
        for (int r = 0; r < MROWS; r += CH)
            quant_dot_tile(T, n, w + (size_t)r * rs, rs, CH, x, xs, NCB, out + (size_t)r * NCB, CH);
        t[3] = now_ns();
        for (int r = 0; r < MROWS; r += CH) qp_tile(T, n, p, r, CH, x, xs, NCB, out + (size_t)r * NCB, CH);
        t[4] = now_ns();
        for (int k = 0; k < 4; k++)
            if (t[k + 1] - t[k] < best[k]) best[k] = t[k + 1] - t[k];
    }
    printf("bench L%d%s %s n=%-5lld decode: row-major %6.1f  packed %6.1f ns/row (%.2fx)   "
           "%d columns: row-major %5.2f  packed %5.2f ns/row/col (%.2fx)\n", isa_level(), isa_amx() ? "+amx" : "",
           quant_traits_of(T)->name, (long long)n,
           best[0] / rows, best[1] / rows, best[0] / best[1], NCB, best[2] / MROWS / NCB,
           best[3] / MROWS / NCB, best[2] / best[3]);
    free(w), free(p), free(x), free(out);
}

int main(void) {
    test_bytes();
    int max = isa_max(), amx0 = isa_amx();
    SKIP_SIMD_ABOVE("qpack", max);
    int64_t ns[] = {32, 64, 96, 576, 1536}, nks[] = {256, 512, 1536, 2048, 4352}; /* 4352: past the AMX tiles' 16-super-block chunks */
    int nrs[] = {1, 16, 40, 64};
    /* one level past AVX-512 where the CPU has AMX: the AMX tiles of Q8_0, Q4_0, Q5_0 and
     * the K-quants (qpack_amx_avx512.c), held to the same reference bits */
    for (int level = ISA_SCALAR; level <= max + (isa_amx_max() ? 1 : 0); level++) {
        isa_set(level > max ? max : level);
        isa_set_amx(level > ISA_AVX512 ? ISA_AMX_Q4_1 : ISA_AMX_OFF);
        for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
            for (size_t j = 0; j < sizeof nrs / sizeof nrs[0]; j++) {
                test_shape(QT_Q4_1, ns[i], nrs[j], level, level == ISA_SCALAR);
                test_shape(QT_Q8_0, ns[i], nrs[j], level, level == ISA_SCALAR);
                test_shape(QT_Q5_1, ns[i], nrs[j], level, level == ISA_SCALAR);
                test_shape(QT_F16, ns[i], nrs[j], level, level == ISA_SCALAR);
                test_shape(QT_BF16, ns[i], nrs[j], level, level == ISA_SCALAR);
                if (level == ISA_AVX512) { /* the other of its FMA and vdpbf16ps kernels */
                    int dp = isa_dpbf16();
                    if (isa_set_dpbf16(!dp) != dp) test_shape(QT_BF16, ns[i], nrs[j], level, 0);
                    isa_set_dpbf16(dp);
                }
                if (ns[i] % 64 == 0) test_shape(QT_Q4_0, ns[i], nrs[j], level, level == ISA_SCALAR);
                if (ns[i] % 64 == 0) test_shape(QT_Q5_0, ns[i], nrs[j], level, level == ISA_SCALAR);
            }
        for (size_t i = 0; i < sizeof nks / sizeof nks[0]; i++)
            for (size_t j = 0; j < sizeof nrs / sizeof nrs[0]; j++) {
                test_shape(QT_Q4_K, nks[i], nrs[j], level, level == ISA_SCALAR);
                test_shape(QT_Q5_K, nks[i], nrs[j], level, level == ISA_SCALAR);
                test_shape(QT_Q6_K, nks[i], nrs[j], level, level == ISA_SCALAR);
            }
    }
    isa_set(max);
    isa_set_amx(amx0);
    const char *b = getenv("QPACK_BENCH");
    if (b && *b == '1') {
        for (int level = ISA_AVX2; level <= max + (isa_amx_max() ? 1 : 0); level++) {
            isa_set(level > max ? max : level);
            isa_set_amx(level > ISA_AVX512 ? ISA_AMX_Q4_1 : ISA_AMX_OFF);
            bench(QT_Q4_1, 576, 16);
            bench(QT_Q4_1, 1536, 16);
            if (qp_wanted(QT_Q8_0)) bench(QT_Q8_0, 576, 64);
            bench(QT_F16, 2048, 16);
            bench(QT_BF16, 2048, 16);
            bench(QT_Q4_0, 2048, 16);
            bench(QT_Q5_0, 2048, 16);
            bench(QT_Q5_1, 2048, 16);
            bench(QT_Q4_K, 2048, 16);
            bench(QT_Q5_K, 2048, 16);
            bench(QT_Q6_K, 2048, 64);
        }
        isa_set(max);
        isa_set_amx(amx0);
    }
    return check_done("qpack");
}
