/* test_quant: every type at every SIMD level the machine has, against the plain C
 * references; the references against gguf's NumPy implementation (vectors made by
 * tests/ref/quant_vectors.py into $QUANT_VECTORS or build/quant_vectors.bin; a missing
 * file is a failure); fp16/bf16 edge cases. QUANT_BENCH=1 also prints dot timings (ns per row). */
#include "core/cpu/isa.h"
#include "core/cpu/quant.h"
#include "core/cpu/quant_kern.h" /* block layouts, for the AMX arithmetic's C mirror */
#include "tests/unit/check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- helpers */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}
static float frand(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; }
/* Roughly Gaussian, with a rare outlier as real weights and activations have. */
static void fill(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) {
        float v = (frand() + frand() + frand()) * scale;
        if (rnd() % 97 == 0) v *= 8;
        x[i] = v;
    }
}
static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static const uint32_t all_types[] = {QT_F32, QT_F16, QT_BF16, QT_Q4_0, QT_Q4_1, QT_Q5_0,
                                     QT_Q5_1, QT_Q8_0, QT_Q8_1, QT_Q4_K, QT_Q5_K,
                                     QT_Q6_K, QT_Q8_K};
#define NTYPES (int)(sizeof all_types / sizeof all_types[0])

/* ---------------------------------------------------------------- fp16 / bf16 */

static void test_half(void) {
    /* every finite half survives f16 -> f32 -> f16; nans stay nans */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quant_f16_to_f32((uint16_t)h);
        uint16_t back = quant_f32_to_f16(f);
        int isnan_h = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (isnan_h ? !isnan(f) || (back & 0x7fff) <= 0x7c00 : back != h) bad++;
    }
    CHECK(bad == 0, "%d halves do not round-trip", bad);
    CHECK(quant_f16_to_f32(0x3c00) == 1.0f, "1.0");
    CHECK(quant_f16_to_f32(0xc000) == -2.0f, "-2.0");
    CHECK(quant_f16_to_f32(0x7bff) == 65504.0f, "max half");
    CHECK(quant_f16_to_f32(0x0001) == ldexpf(1, -24), "min subnormal");
    CHECK(quant_f16_to_f32(0x03ff) == ldexpf(1023, -24), "max subnormal");
    CHECK(isinf(quant_f16_to_f32(0x7c00)) && quant_f16_to_f32(0xfc00) < 0, "inf");
    CHECK(quant_f32_to_f16(65519.0f) == 0x7bff, "65519 -> max");
    CHECK(quant_f32_to_f16(65520.0f) == 0x7c00, "65520 -> inf (tie to even)");
    CHECK(quant_f32_to_f16(1e9f) == 0x7c00 && quant_f32_to_f16(-INFINITY) == 0xfc00, "inf");
    CHECK(quant_f32_to_f16(ldexpf(1, -25)) == 0, "2^-25 ties to 0");
    CHECK(quant_f32_to_f16(ldexpf(1.0000001f, -25)) == 1, "just above 2^-25 -> 1");
    CHECK(quant_f32_to_f16(ldexpf(3, -25)) == 2, "1.5 ulp ties to even 2");
    CHECK(quant_f32_to_f16(-0.0f) == 0x8000, "-0");
    CHECK(quant_f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3c00, "tie to even down");
    CHECK(quant_f32_to_f16(1.0f + 3 * ldexpf(1, -11)) == 0x3c02, "tie to even up");
    CHECK(quant_f32_to_f16(ldexpf(2047, -25)) == 0x0400, "subnormal rounds up to normal");
    CHECK((quant_f32_to_f16(NAN) & 0x7e00) == 0x7e00, "nan stays quiet nan");
    /* against the compiler's own (libgcc, round-to-nearest-even) conversion */
    bad = 0;
    for (int i = 0; i < 200000; i++) {
        float f = u2f(rnd());
        if (isnan(f)) continue;
        _Float16 ref = (_Float16)f;
        uint16_t rb;
        memcpy(&rb, &ref, 2);
        if (quant_f32_to_f16(f) != rb) bad++;
    }
    CHECK(bad == 0, "%d random floats differ from (_Float16) cast", bad);

    CHECK(quant_bf16_to_f32(0x3f80) == 1.0f, "bf16 1.0");
    CHECK(quant_f32_to_bf16(1.0f) == 0x3f80, "bf16 of 1.0");
    CHECK(quant_f32_to_bf16(u2f(0x3f808000)) == 0x3f80, "bf16 tie to even down");
    CHECK(quant_f32_to_bf16(u2f(0x3f818000)) == 0x3f82, "bf16 tie to even up");
    CHECK(quant_f32_to_bf16(u2f(0x3f808001)) == 0x3f81, "bf16 above tie");
    CHECK(quant_f32_to_bf16(INFINITY) == 0x7f80, "bf16 inf");
    CHECK(quant_f32_to_bf16(u2f(0x7f7fffff)) == 0x7f80, "bf16 max float rounds to inf");
    CHECK(quant_f32_to_bf16(u2f(0x7f800001)) == 0x7fc0, "bf16 signalling nan -> quiet");
    CHECK(quant_f32_to_bf16(u2f(0x00000001)) == 0x0000, "bf16 tiny subnormal -> 0");
    CHECK(f2u(quant_bf16_to_f32(0x8001)) == 0x80010000u, "bf16 subnormal exact");
}

/* BF16 as a dot type: the floor (magnitudes under 2^-48 to a signed zero, qpack.h) in the
 * reference, and every level's quantizer giving its bits, edge values included. */
static void test_bf16_dot_type(void) {
    const float floor48 = 0x1p-48f;
    float f[37] = {0.0f, -0.0f, floor48, -floor48, nextafterf(floor48, 0), -nextafterf(floor48, 0),
                   0x1p-49f, 1e-39f, -1e-39f, u2f(0x3f808000), u2f(0x3f818000), u2f(0x3f808001),
                   INFINITY, -INFINITY, u2f(0x7f800001), u2f(0xffc00000), u2f(0x7f7fffff), -3.5f};
    for (int i = 18; i < 37; i++) f[i] = ldexpf((float)(i * 37 % 23) - 11.0f, i % 13 - 55);
    uint16_t want[37], got[37];
    quant_quantize_ref(QT_BF16, f, want, 37);
    CHECK(want[2] == 0x2780 && want[3] == 0xa780, "bf16 dot type: 2^-48 itself is kept");
    CHECK(want[4] == 0 && want[5] == 0x8000 && want[6] == 0 && want[7] == 0 && want[8] == 0x8000,
          "bf16 dot type: under 2^-48 (and denormals) to a signed zero");
    CHECK(want[9] == 0x3f80 && want[12] == 0x7f80 && want[14] == 0x7fc0, "bf16 dot type: ties, inf, nan");
    int max = isa_max();
    for (int level = ISA_SCALAR; level <= max; level++) {
        isa_set(level);
        quant_quantize(QT_BF16, f, got, 37);
        CHECK(memcmp(got, want, sizeof want) == 0, "bf16 dot type at L%d: the reference's bits", level);
    }
    isa_set(max);
}

/* ---------------------------------------------------------------- traits */

static void test_traits(void) {
    CHECK(quant_row_size(QT_Q4_1, 576) == 18 * 20, "q4_1 row");
    CHECK(quant_row_size(QT_Q8_0, 576) == 18 * 34, "q8_0 row");
    CHECK(quant_row_size(QT_Q4_K, 4096) == 16 * 144, "q4_k row");
    CHECK(quant_row_size(QT_Q6_K, 256) == 210, "q6_k row");
    CHECK(quant_row_size(QT_Q8_K, 256) == 292, "q8_k row");
    CHECK(quant_row_size(QT_Q4_0, 33) == 0, "partial block");
    CHECK(quant_row_size(4, 32) == 0 && quant_traits_of(4) == NULL, "unknown type 4");
    CHECK(quant_traits_of(1000) == NULL, "out of range type");
    CHECK(quant_traits_of(QT_Q4_1)->dot_type == QT_Q8_1, "q4_1 dot type");
    CHECK(quant_traits_of(QT_Q5_0)->dot_type == QT_Q8_0, "q5_0 dot type");
    CHECK(quant_traits_of(QT_Q6_K)->dot_type == QT_Q8_K, "q6_k dot type");
    CHECK(quant_traits_of(QT_BF16)->dot_type == QT_BF16, "bf16 dot type: bf16 activations");
}

/* ---------------------------------------------------------------- gguf vectors */

static void test_vectors(const char *path) {
    FILE *fp = fopen(path, "rb");
    /* Missing is a failure, not a skip: the file is made from the venv every test run
     * has (tests/run.sh runs ref/quant-vectors first, and whenever it runs test_quant). */
    CHECK(fp, "%s: cannot open (make it with build/venv/bin/python tests/ref/quant_vectors.py)",
          path);
    if (!fp) return;
    uint32_t hdr[4];
    int nrec = 0;
    while (fread(hdr, 4, 4, fp) == 4) {
        uint32_t kind = hdr[0], type = hdr[1], n = hdr[2], nbytes = hdr[3];
        unsigned char *raw = malloc(nbytes), *mine = malloc(nbytes);
        float *f = malloc((size_t)n * 4), *g = malloc((size_t)n * 4);
        int ok = kind == 0 ? fread(raw, 1, nbytes, fp) == nbytes && fread(f, 4, n, fp) == n
                           : fread(f, 4, n, fp) == n && fread(raw, 1, nbytes, fp) == nbytes;
        CHECK(ok, "short record in %s", path);
        CHECK(quant_row_size(type, n) == nbytes, "type %u n %u: size %zu vs %u", type, n,
              quant_row_size(type, n), nbytes);
        if (!ok || quant_row_size(type, n) != nbytes) {
            free(raw), free(mine), free(f), free(g);
            break;
        }
        if (kind == 0) {
            quant_dequant_ref(type, raw, g, n);
            int bad = 0;
            for (uint32_t i = 0; i < n; i++) bad += f2u(f[i]) != f2u(g[i]) && f[i] != g[i];
            CHECK(bad == 0, "%s dequant: %d of %u differ from gguf",
                  quant_traits_of(type)->name, bad, n);
        } else {
            quant_quantize_ref(type, f, mine, n);
            CHECK(memcmp(mine, raw, nbytes) == 0, "%s quantize differs from gguf",
                  quant_traits_of(type)->name);
        }
        nrec++;
        free(raw), free(mine), free(f), free(g);
    }
    fclose(fp);
    CHECK(nrec >= 18, "only %d gguf records", nrec);
}

/* ---------------------------------------------------------------- per level */

/* Sum |w_i * x_i| of the dequantized rows: the scale of the dot's rounding error. */
static double abs_dot(uint32_t type, int64_t n, const void *w, const void *xq, float *tw,
                      float *tx) {
    quant_dequant_ref(type, w, tw, n);
    quant_dequant_ref(quant_traits_of(type)->dot_type, xq, tx, n);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += fabs((double)tw[i] * tx[i]);
    return s;
}

/* Dot tolerance: SIMD and reference compute the same integer block sums and differ
 * only in float summation order (and FMA), so 1e-4 of sum|w*x| is generous. */
#define DOT_TOL 1e-4

static int close_dot(float got, float ref, double scale) {
    return fabs((double)got - ref) <= DOT_TOL * scale + 1e-6;
}

static void test_type_level(uint32_t type, int64_t n, int level) {
    const quant_traits *t = quant_traits_of(type);
    uint32_t dt = t->dot_type;
    size_t rs = quant_row_size(type, n), xs = quant_row_size(dt, n);
    enum { NR = 9, NC = 5 };
    size_t wstride = rs + 64, xstride = xs + 32; /* padded strides catch stride bugs */
    float *f = malloc((size_t)n * NR * 4), *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
    float *tw = malloc((size_t)n * 4), *tx = malloc((size_t)n * 4);
    unsigned char *w = calloc(NR, wstride), *x = calloc(NC, xstride), *xr = malloc(xs);
    float out[NR], tile[NC * (NR + 3)];

    fill(f, n * NR, 0.05f);
    for (int r = 0; r < NR; r++) quant_quantize_ref(type, f + r * n, w + r * wstride, n);

    /* dequant: same arithmetic as the reference, bit-exact */
    quant_dequant_ref(type, w, a, n);
    quant_dequant(type, w, b, n);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) bad += f2u(a[i]) != f2u(b[i]);
    CHECK(bad == 0, "L%d %s n=%lld dequant: %d differ", level, t->name, (long long)n, bad);

    /* quantize the activations to the dot type: bit-exact with the reference */
    for (int c = 0; c < NC; c++) {
        fill(a, n, 1.0f);
        if (c == 1) memset(a, 0, 32 * sizeof(float)); /* an all-zero block */
        quant_quantize(dt, a, x + c * xstride, n);
        quant_quantize_ref(dt, a, xr, n);
        CHECK(memcmp(xr, x + c * xstride, xs) == 0, "L%d %s n=%lld quantize differs",
              level, quant_traits_of(dt)->name, (long long)n);
    }

    /* dot, rows, tile against the reference dot */
    float ref[NC][NR];
    double scale[NC][NR];
    for (int c = 0; c < NC; c++)
        for (int r = 0; r < NR; r++) {
            ref[c][r] = quant_dot_ref(type, n, w + r * wstride, x + c * xstride);
            scale[c][r] = abs_dot(type, n, w + r * wstride, x + c * xstride, tw, tx);
        }
    for (int r = 0; r < NR; r++) {
        float got = quant_dot(type, n, w + r * wstride, x);
        CHECK(close_dot(got, ref[0][r], scale[0][r]), "L%d %s n=%lld dot row %d: %g vs %g",
              level, t->name, (long long)n, r, got, ref[0][r]);
    }
    for (int nr = 1; nr <= NR; nr++) {
        memset(out, 0, sizeof out);
        quant_dot_rows(type, n, w, wstride, nr, x + 2 * xstride, out);
        bad = 0;
        for (int r = 0; r < nr; r++) bad += !close_dot(out[r], ref[2][r], scale[2][r]);
        CHECK(bad == 0, "L%d %s n=%lld rows nr=%d: %d wrong", level, t->name, (long long)n,
              nr, bad);
    }
    for (int nc = 1; nc <= NC; nc++)
        for (int nr = 1; nr <= NR; nr += (nr < 5 ? 1 : 4)) {
            size_t ostride = NR + 3;
            for (size_t i = 0; i < sizeof tile / sizeof tile[0]; i++) tile[i] = -12345.0f;
            quant_dot_tile(type, n, w, wstride, nr, x, xstride, nc, tile, ostride);
            bad = 0;
            for (int c = 0; c < nc; c++)
                for (int r = 0; r < (int)ostride; r++) {
                    float v = tile[c * ostride + r];
                    bad += r < nr ? !close_dot(v, ref[c][r], scale[c][r]) : v != -12345.0f;
                }
            CHECK(bad == 0, "L%d %s n=%lld tile %dx%d: %d wrong", level, t->name,
                  (long long)n, nr, nc, bad);
        }
    free(f), free(a), free(b), free(tw), free(tx), free(w), free(x), free(xr);
}

/* Batch invariance: the value for a (row, column) pair must not depend on how many
 * rows and columns share the call nor on the pair's place in the tile (a sequence's
 * output is then bit-identical alone or in a batch). quant_dot_tile with every
 * nr, nc in 1..9 at every (r, c), quant_dot_rows with every nr and quant_dot all equal,
 * bit for bit, quant_dot_tile of that one pair. */
static void test_batch_invariance(uint32_t type, int64_t n, int level) {
    enum { N = 9 };
    const quant_traits *t = quant_traits_of(type);
    uint32_t dt = t->dot_type;
    size_t rs = quant_row_size(type, n), xs = quant_row_size(dt, n);
    size_t wstride = rs + 16, xstride = xs + 48, ostride = N + 2;
    float *f = malloc((size_t)n * 4);
    unsigned char *w = calloc(N, wstride), *x = calloc(N, xstride);
    float one[N][N], tile[N * (N + 2)], rows[N];
    for (int r = 0; r < N; r++) {
        fill(f, n, 0.05f);
        quant_quantize_ref(type, f, w + r * wstride, n);
    }
    for (int c = 0; c < N; c++) {
        fill(f, n, 1.0f);
        quant_quantize(dt, f, x + c * xstride, n);
    }
    for (int c = 0; c < N; c++)
        for (int r = 0; r < N; r++)
            quant_dot_tile(type, n, w + r * wstride, wstride, 1, x + c * xstride, xstride, 1,
                           &one[c][r], 1);
    int bad = 0;
    for (int c = 0; c < N; c++)
        for (int r = 0; r < N; r++) {
            float d = quant_dot(type, n, w + r * wstride, x + c * xstride);
            bad += memcmp(&d, &one[c][r], sizeof d) != 0;
        }
    CHECK(bad == 0, "batch invariance: L%d %s n=%lld: %d dots differ from the 1x1 tile",
          level, t->name, (long long)n, bad);
    for (int nr = 1; nr <= N; nr++) {
        bad = 0;
        for (int c = 0; c < N; c++) {
            quant_dot_rows(type, n, w, wstride, nr, x + c * xstride, rows);
            for (int r = 0; r < nr; r++) bad += memcmp(&rows[r], &one[c][r], sizeof(float)) != 0;
        }
        CHECK(bad == 0, "batch invariance: L%d %s n=%lld rows nr=%d: %d differ from the 1x1 tile",
              level, t->name, (long long)n, nr, bad);
    }
    for (int nc = 1; nc <= N; nc++)
        for (int nr = 1; nr <= N; nr++) {
            /* start the tile at row/column 9-nr, 9-nc too, so every pair is seen at
             * several positions */
            for (int off = 0; off < 2; off++) {
                int r0 = off ? N - nr : 0, c0 = off ? N - nc : 0;
                memset(tile, 0, sizeof tile);
                quant_dot_tile(type, n, w + r0 * wstride, wstride, nr, x + c0 * xstride,
                               xstride, nc, tile, ostride);
                bad = 0;
                for (int c = 0; c < nc; c++)
                    for (int r = 0; r < nr; r++)
                        bad += memcmp(&tile[c * ostride + r], &one[c0 + c][r0 + r],
                                      sizeof(float)) != 0;
                CHECK(bad == 0, "batch invariance: L%d %s n=%lld tile %dx%d at (%d,%d): %d "
                      "differ from the 1x1 tile", level, t->name, (long long)n, nr, nc, r0, c0,
                      bad);
            }
        }
    free(f), free(w), free(x);
}

/* The AMX arithmetic in plain C (core/cpu/quant_amx_avx512.c): per block, the exact int
 * dot, then s = fma(i, d_w*d_x, s), and for Q4_1 s = fma(m_w, s_x, s). fmaf is exact
 * (one rounding) however the compiler provides it, so these must match bit for bit. */
static float q41_amx_mirror(int64_t n, const void *w, const void *x) {
    const blk_q4_1 *a = w;
    const blk_q8_1 *b = x;
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; i++) {
        int d = 0;
        for (int k = 0; k < 16; k++)
            d += (a[i].qs[k] & 15) * b[i].qs[k] + (a[i].qs[k] >> 4) * b[i].qs[k + 16];
        float p = quant_f16_to_f32(a[i].d) * quant_f16_to_f32(b[i].d);
        s = fmaf((float)d, p, s);
        s = fmaf(quant_f16_to_f32(a[i].m), quant_f16_to_f32(b[i].s), s);
    }
    return s;
}
static float q80_amx_mirror(int64_t n, const void *w, const void *x) {
    const blk_q8_0 *a = w, *b = x;
    float s = 0.0f;
    for (int64_t i = 0; i < n / 32; i++) {
        int d = 0;
        for (int k = 0; k < 32; k++) d += a[i].qs[k] * b[i].qs[k];
        s = fmaf((float)d, quant_f16_to_f32(a[i].d) * quant_f16_to_f32(b[i].d), s);
    }
    return s;
}

/* The AMX paths of a type (one-column AVX-512 below AMX_MIN_NC tokens, AMX tiles of
 * 16 tokens x 16 rows above, blocks in chunks of 32) for shapes past every edge: rows
 * 1..40 (whole row groups of 16 and partial ones), tokens 1..40 (the one-column path,
 * whole and partial 16-token tiles), block counts across the 32-block chunk. Every
 * value equals the C mirror bit for bit (so also every other shape's value for that
 * pair) and the reference dot within the usual tolerance. */
static void test_amx(uint32_t type, float (*mirror)(int64_t, const void *, const void *)) {
    if (!isa_amx_max()) {
        SKIP("quant: the AMX tile test of %s: no AMX-INT8 here (the CPU, the kernel's "
             "permission or KILN_SIMD)", quant_traits_of(type)->name);
        return;
    }
    int amx0 = isa_amx();
    isa_set(ISA_AVX512);
    isa_set_amx(ISA_AMX_ALL);
    enum { NR = 40, NC = 40 };
    int64_t blocks[] = {1, 18, 32, 33, 49};
    int nrs[] = {1, 2, 15, 16, 17, 33, 40}, ncs[] = {1, 2, 3, 15, 16, 17, 31, 32, 33, 40};
    for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
        int64_t n = blocks[bi] * 32;
        size_t rs = quant_row_size(type, n), xs = quant_row_size(quant_traits_of(type)->dot_type, n);
        size_t wstride = rs + 20, xstride = xs + 36, ostride = NR + 5;
        float *f = malloc((size_t)n * 4), *tw = malloc((size_t)n * 4), *tx = malloc((size_t)n * 4);
        unsigned char *w = calloc(NR, wstride), *x = calloc(NC, xstride);
        float *want = malloc(sizeof(float) * NR * NC), *out = malloc(sizeof(float) * NC * ostride);
        for (int r = 0; r < NR; r++) {
            fill(f, n, 0.05f);
            quant_quantize_ref(type, f, w + r * wstride, n);
        }
        for (int c = 0; c < NC; c++) {
            fill(f, n, 1.0f);
            quant_quantize(quant_traits_of(type)->dot_type, f, x + c * xstride, n);
        }
        int bad = 0, far = 0;
        for (int c = 0; c < NC; c++)
            for (int r = 0; r < NR; r++) {
                const void *wr = w + r * wstride, *xc = x + c * xstride;
                want[c * NR + r] = mirror(n, wr, xc);
                float d = quant_dot(type, n, wr, xc);
                bad += f2u(d) != f2u(want[c * NR + r]);
                far += !close_dot(d, quant_dot_ref(type, n, wr, xc),
                                  abs_dot(type, n, wr, xc, tw, tx));
            }
        CHECK(bad == 0 && far == 0, "amx %s n=%lld dot: %d differ from the mirror, %d far "
              "from the reference", quant_traits_of(type)->name, (long long)n, bad, far);
        for (size_t i = 0; i < sizeof nrs / sizeof nrs[0]; i++)
            for (size_t j = 0; j < sizeof ncs / sizeof ncs[0]; j++) {
                int nr = nrs[i], nc = ncs[j], r0 = NR - nr, c0 = NC - nc;
                for (size_t k = 0; k < (size_t)NC * ostride; k++) out[k] = -12345.0f;
                quant_dot_tile(type, n, w + r0 * wstride, wstride, nr, x + c0 * xstride,
                               xstride, nc, out, ostride);
                bad = 0;
                for (int c = 0; c < nc; c++)
                    for (int r = 0; r < (int)ostride; r++) {
                        float v = out[c * ostride + r];
                        bad += r < nr ? f2u(v) != f2u(want[(c0 + c) * NR + r0 + r])
                                      : v != -12345.0f; /* nothing written past nr */
                    }
                CHECK(bad == 0, "amx %s n=%lld tile %dx%d: %d differ from the mirror",
                      quant_traits_of(type)->name, (long long)n, nr, nc, bad);
            }
        free(f), free(tw), free(tx), free(w), free(x), free(want), free(out);
    }
    isa_set(isa_max());
    isa_set_amx(amx0);
}

/* Every level without AMX, then (where the machine has it) AVX-512 with AMX for Q4_1
 * and with AMX for all it covers. */
static void test_levels(void) {
    int max = isa_max(), amx = isa_amx_max(), amx0 = isa_amx();
    SKIP_SIMD_ABOVE("quant", max);
    if (!amx)
        SKIP("quant: levels avx512+amx(q4_1) and avx512+amx(all): no AMX-INT8 here (the CPU, "
             "the kernel's permission or KILN_SIMD)");
    for (int pass = ISA_SCALAR; pass <= max + amx; pass++) {
        int before = check_pass + check_fail, fail0 = check_fail;
        int level = pass > max ? max : pass, with_amx = pass > max ? pass - max : ISA_AMX_OFF;
        CHECK(isa_set(level) == level && isa_level() == level, "set level %d", level);
        CHECK(isa_set_amx(with_amx) == with_amx && isa_amx() == with_amx, "set amx %d",
              with_amx);
        for (int ti = 0; ti < NTYPES; ti++) {
            int blk = quant_traits_of(all_types[ti])->block;
            /* one block, odd block counts (tails), the model's widths, 4096+ */
            int64_t sizes[] = {1, 7, 9, 18, 48, 128, 130};
            for (int s = 0; s < 7; s++) {
                int64_t n = sizes[s] * blk;
                if (blk == 1) n = sizes[s] * 32 + (s & 1); /* F32/F16/BF16: odd n too */
                if (blk == 256 && s >= 5) n = sizes[s] / 8 * blk;
                test_type_level(all_types[ti], n, level);
            }
            /* even and odd block counts (the 512-bit Q4_1 kernel pairs blocks) */
            int64_t bsizes[] = {1, 2, 3, 18, 19, 48, 49};
            for (int s = 0; s < 7; s++) {
                int64_t n = bsizes[s] * blk;
                if (blk == 1) n = bsizes[s] * 32 + (s & 1);
                if (blk == 256 && s >= 3) n = (bsizes[s] / 8 + (s & 1)) * blk;
                test_batch_invariance(all_types[ti], n, level);
            }
        }
        printf("quant: level %d%s: %d checks, %d failed\n", level,
               with_amx == ISA_AMX_ALL ? "+amx(all)" : with_amx ? "+amx(q4_1)" : "",
               check_pass + check_fail - before, check_fail - fail0);
    }
    isa_set(max);
    isa_set_amx(amx0);
}

/* ---------------------------------------------------------------- bench */

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* Bench levels: 0..2, then 3 and 4 for AVX-512 with AMX for Q4_1 and for all. */
static void set_level(int level) {
    isa_set(level > ISA_AVX512 ? ISA_AVX512 : level);
    isa_set_amx(level > ISA_AVX512 ? level - ISA_AVX512 : ISA_AMX_OFF);
}

static void bench_one(uint32_t type, int64_t n, int level) {
    enum { ROWS = 256 };
    uint32_t dt = quant_traits_of(type)->dot_type;
    size_t rs = quant_row_size(type, n);
    float *f = malloc((size_t)n * 4), out[ROWS];
    unsigned char *w = malloc(rs * ROWS), *x = malloc(quant_row_size(dt, n) * 4);
    for (int r = 0; r < ROWS; r++) {
        fill(f, n, 0.05f);
        quant_quantize_ref(type, f, w + r * rs, n);
    }
    fill(f, n, 1.0f);
    set_level(level);
    quant_quantize(dt, f, x, n);
    double best_dot = 1e30, best_rows = 1e30;
    volatile float sink = 0;
    for (int it = 0; it < 50; it++) {
        double t0 = now_ns();
        for (int r = 0; r < ROWS; r++) sink += quant_dot(type, n, w + r * rs, x);
        double t1 = now_ns();
        quant_dot_rows(type, n, w, rs, ROWS, x, out);
        double t2 = now_ns();
        sink += out[0];
        if (t1 - t0 < best_dot) best_dot = t1 - t0;
        if (t2 - t1 < best_rows) best_rows = t2 - t1;
    }
    printf("bench L%d %-5s n=%-5lld dot %7.1f ns/row   dot_rows %7.1f ns/row\n", level,
           quant_traits_of(type)->name, (long long)n, best_dot / ROWS, best_rows / ROWS);
    free(f), free(w), free(x);
}

/* Decode and prefill as the forward pass runs them: quant_dot_tile on 16-row chunks
 * (model.c's MM_CHUNK). Decode (nc = 1) streams 4096-row matrices through a 64 MiB
 * buffer, twice the L3 here, so weights come from memory as in a real step; prefill
 * (nc = 64) reuses one 4096-row matrix. Prints ns per weight row (per row x column for
 * prefill) and, for decode, the weight bandwidth. */
static void bench_tile(uint32_t type, int64_t n, int level) {
    enum { MROWS = 4096, CHUNK = 16, NCP = 64 };
    uint32_t dt = quant_traits_of(type)->dot_type;
    size_t rs = quant_row_size(type, n), xs = quant_row_size(dt, n);
    int nmat = (int)((64u << 20) / (rs * MROWS)) + 1;
    size_t total = (size_t)nmat * MROWS;
    float *f = malloc((size_t)n * 4), *out = malloc(sizeof(float) * MROWS * NCP);
    unsigned char *w = malloc(rs * total), *x = malloc(xs * NCP);
    for (int r = 0; r < 64; r++) {
        fill(f, n, 0.05f);
        quant_quantize_ref(type, f, w + r * rs, n);
    }
    for (size_t r = 64; r < total; r++) memcpy(w + r * rs, w + (r % 64) * rs, rs);
    set_level(level);
    for (int c = 0; c < NCP; c++) {
        fill(f, n, 1.0f);
        quant_quantize(dt, f, x + c * xs, n);
    }
    double best_dec = 1e30, best_rows = 1e30, best_pre = 1e30;
    for (int it = 0; it < 20; it++) {
        double t0 = now_ns();
        for (size_t r = 0; r < total; r += CHUNK)
            quant_dot_tile(type, n, w + r * rs, rs, CHUNK, x, xs, 1, out + r % MROWS, CHUNK);
        double t1 = now_ns();
        for (size_t r = 0; r < total; r += CHUNK)
            quant_dot_rows(type, n, w + r * rs, rs, CHUNK, x, out + r % MROWS);
        double t2 = now_ns();
        if (t1 - t0 < best_dec) best_dec = t1 - t0;
        if (t2 - t1 < best_rows) best_rows = t2 - t1;
    }
    for (int it = 0; it < 30; it++) {
        double t0 = now_ns();
        for (int r = 0; r < MROWS; r += CHUNK)
            quant_dot_tile(type, n, w + (size_t)r * rs, rs, CHUNK, x, xs, NCP, out + (size_t)r * NCP,
                           CHUNK);
        double t1 = now_ns();
        if (t1 - t0 < best_pre) best_pre = t1 - t0;
    }
    printf("bench L%d %-5s n=%-5lld decode tile %6.1f ns/row (%5.1f GB/s)  rows %6.1f ns/row"
           "   prefill nc=%d %6.2f ns/row/col\n", level, quant_traits_of(type)->name,
           (long long)n, best_dec / total, rs * total / best_dec, best_rows / total, NCP,
           best_pre / MROWS / NCP);
    free(f), free(out), free(w), free(x);
}

static void bench(void) {
    int max = isa_max(), amx0 = isa_amx();
    uint32_t ttypes[] = {QT_Q4_1, QT_Q4_0, QT_Q8_0};
    for (size_t i = 0; i < sizeof ttypes / sizeof ttypes[0]; i++)
        for (int level = ISA_AVX2; level <= max + isa_amx_max(); level++) {
            bench_tile(ttypes[i], 576, level);
            bench_tile(ttypes[i], 1536, level);
        }
    if (getenv("QUANT_BENCH_TILE_ONLY")) {
        set_level(max + amx0);
        return;
    }
    uint32_t types[] = {QT_Q4_1, QT_Q8_0, QT_F32, QT_F16, QT_Q4_0, QT_Q5_0, QT_Q5_1,
                        QT_Q4_K, QT_Q5_K, QT_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        for (int level = ISA_SCALAR; level <= max + isa_amx_max(); level++) {
            int64_t ns[] = {576, 1536};
            for (int k = 0; k < 2; k++)
                if (ns[k] % quant_traits_of(types[i])->block == 0) bench_one(types[i], ns[k], level);
        }
    set_level(max + amx0);
}

int main(void) {
    test_half();
    test_bf16_dot_type();
    test_traits();
    const char *vectors = getenv("QUANT_VECTORS"); /* tests/run.sh: $BUILD/quant_vectors.bin */
    test_vectors(vectors && *vectors ? vectors : "build/quant_vectors.bin");
    test_levels();
    test_amx(QT_Q4_1, q41_amx_mirror);
    test_amx(QT_Q8_0, q80_amx_mirror);
    const char *b = getenv("QUANT_BENCH");
    if (b && *b == '1') bench();
    return check_done("quant");
}
