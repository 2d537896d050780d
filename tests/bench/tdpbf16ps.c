/* tdpbf16ps: checks a C mirror of AMX-BF16's tile product against the CPU, the first
 * fact an AMX-BF16 F16/BF16 kernel would stand on (its reference must give its bits),
 * and of AVX512_BF16's vdpbf16ps, the instruction the BF16 kernel takes on AMD
 * (core/cpu/qpack.h).
 *
 *   gcc -O2 -march=native -std=c11 -D_GNU_SOURCE tests/bench/tdpbf16ps.c -lm -o build/tdpbf16ps
 *   build/tdpbf16ps [tiles per range]        (default 2000; 256 outputs a tile)
 *
 * The tile's mirror, per output element C[m][n] of one instruction over 16 pairs q:
 *   ev = 0, od = 0
 *   for q in 0..15: ev = fmaf(A[m][2q], B[q][2n], ev); od = fmaf(A[m][2q+1], B[q][2n+1], od)
 *   C[m][n] = C[m][n] + (ev + od)
 * vdpbf16ps's, per f32 lane i:  c = fmaf(a[2i+1], b[2i+1], c); c = fmaf(a[2i], b[2i], c)
 * every operation rounding to nearest even in f32, denormal inputs read as zero and
 * denormal results flushed to zero (the SDM's words for each FMA). Random operands over
 * several exponent ranges, the last reaching the denormals. Prints the outputs checked and
 * those that differ per range; exit status 1 if any differs; a check the CPU cannot run
 * (no AVX512_BF16; no AMX-BF16 or no tile state granted) prints a note instead. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cpuid.h>
#include <immintrin.h>

typedef struct {
    uint8_t palette, start, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double uniform(void) { /* [0, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1p-53;
}

static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t to_bf16(float f) { /* round to nearest even; operands here are finite */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

static float flush(float x) { return fabsf(x) < 0x1p-126f ? copysignf(0.0f, x) : x; }

/* A random bf16 of either sign with its exponent in [lo, hi). */
static uint16_t operand(int lo, int hi) {
    return to_bf16((float)((2 * uniform() - 1) * ldexp(1, lo + (int)(uniform() * (hi - lo)))));
}

static float mirror(const uint16_t A[16][32], const uint16_t B[16][32], float c, int m, int n) {
    float ev = 0, od = 0;
    for (int q = 0; q < 16; q++) {
        ev = flush(fmaf(flush(from_bf16(A[m][2 * q])), flush(from_bf16(B[q][2 * n])), ev));
        od = flush(fmaf(flush(from_bf16(A[m][2 * q + 1])), flush(from_bf16(B[q][2 * n + 1])), od));
    }
    return flush(flush(c) + flush(ev + od));
}

/* One vdpbf16ps lane: c + a[2i+1] b[2i+1], then + a[2i] b[2i]. */
static float mirror_vdp(const uint16_t *a, const uint16_t *b, float c, int i) {
    for (int e = 1; e >= 0; e--)
        c = flush(fmaf(flush(from_bf16(a[2 * i + e])), flush(from_bf16(b[2 * i + e])), flush(c)));
    return c;
}

__attribute__((target("avx512f,avx512bf16"))) static void vdp(const uint16_t *a, const uint16_t *b, float *c) {
    __m512 r = _mm512_dpbf16_ps(_mm512_loadu_ps(c), (__m512bh)_mm512_loadu_si512(a), (__m512bh)_mm512_loadu_si512(b));
    _mm512_storeu_ps(c, r);
}

/* vdpbf16ps against its mirror, 16 lanes a vector, `tiles` x 16 vectors per range. */
static long check_vdp(int tiles, const int (*ranges)[2], size_t nr) {
    long differ_all = 0;
    for (size_t r = 0; r < nr; r++) {
        int lo = ranges[r][0], hi = ranges[r][1];
        long checked = 0, differ = 0;
        for (int t = 0; t < tiles * 16; t++) {
            uint16_t a[32], b[32];
            float c[16], c0[16];
            for (int k = 0; k < 32; k++) a[k] = operand(lo, hi), b[k] = operand(lo, hi);
            for (int i = 0; i < 16; i++) c0[i] = c[i] = from_bf16(operand(2 * lo, 2 * hi));
            vdp(a, b, c);
            for (int i = 0; i < 16; i++) {
                float want = mirror_vdp(a, b, c0[i], i);
                checked++;
                differ += memcmp(&want, &c[i], 4) != 0;
            }
        }
        printf("vdpbf16ps: exponents %d..%d: %ld outputs, %ld differ from the mirror\n", lo, hi, checked, differ);
        differ_all += differ;
    }
    return differ_all;
}

static int has_avx512_bf16(void) {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1);
}

static int has_amx_bf16(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!(d & (1u << 22)) || !(d & (1u << 24))) return 0; /* AMX-BF16, AMX-TILE */
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}

int main(int argc, char **argv) {
    int tiles = argc > 1 ? atoi(argv[1]) : 2000;
    static const int ranges[][2] = {{-3, 3}, {-20, 20}, {-70, -55}, {-140, -100}};
    long vdp_differ = 0;
    if (has_avx512_bf16()) vdp_differ = check_vdp(tiles, ranges, sizeof ranges / sizeof ranges[0]);
    else puts("vdpbf16ps: no AVX512_BF16 here; not checked");
    if (!has_amx_bf16()) {
        puts("tdpbf16ps: no AMX-BF16 here (or no tile state granted); nothing checked");
        return vdp_differ != 0;
    }
    tile_config cfg = {.palette = 1};
    for (int t = 0; t < 3; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
    long differ_all = vdp_differ;
    for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
        int lo = ranges[r][0], hi = ranges[r][1];
        long checked = 0, differ = 0;
        for (int t = 0; t < tiles; t++) {
            static uint16_t A[16][32], B[16][32];
            static float C[16][16], C0[16][16];
            for (int i = 0; i < 16; i++)
                for (int k = 0; k < 32; k++) A[i][k] = operand(lo, hi), B[i][k] = operand(lo, hi);
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 16; j++) C0[i][j] = from_bf16(operand(2 * lo, 2 * hi));
            memcpy(C, C0, sizeof C);
            __asm__ volatile("tileloadd (%0,%1,1), %%tmm0\n\t"
                             "tileloadd (%2,%1,1), %%tmm1\n\t"
                             "tileloadd (%3,%1,1), %%tmm2\n\t"
                             "tdpbf16ps %%tmm2, %%tmm1, %%tmm0\n\t"
                             "tilestored %%tmm0, (%0,%1,1)" ::"r"(C), "r"(64L), "r"(A), "r"(B)
                             : "memory");
            for (int m = 0; m < 16; m++)
                for (int n = 0; n < 16; n++) {
                    float want = mirror((const uint16_t(*)[32])A, (const uint16_t(*)[32])B, C0[m][n], m, n);
                    checked++;
                    differ += memcmp(&want, &C[m][n], 4) != 0;
                }
        }
        printf("tdpbf16ps: exponents %d..%d: %ld outputs, %ld differ from the mirror\n", lo, hi, checked,
               differ);
        differ_all += differ;
    }
    __asm__ volatile("tilerelease");
    return differ_all != 0;
}
