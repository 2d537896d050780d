/* gpu_test: the CUDA backend on a real device, checked against the CPU references.
 *
 *   gpu_test --model PATH [--out FILE] [--only GROUP[,GROUP...]] [--timeout-scale F]
 *
 * One line per check, "PASS name: figures" or "FAIL name: why, with numbers", then
 * "gpu_test: N passed, M failed" (INFO lines describe the device and are not counted).
 * Exit status: 0 all passed, 1 a check failed, 2 no usable device (or bad usage).
 *
 * Groups (all run by default, in this order):
 *   quant   kern_dq_f16, kern_embed, kern_mm (all 11 weight types; batch invariance)
 *   kernels kern_rmsnorm, kern_swiglu, kern_argmax
 *   rope    kern_rope_store: rotation and the f16 cache slots written
 *   attn    kern_attn over random page tables (prefill and decode mixed, three head
 *           shapes; batch invariance), kern_kv_to_fp8 and attention over fp8 blocks,
 *           also from a kv8 pool's second halves, and kern_kv_expand; a slab with
 *           f16 infinities and a NaN converted as the CPU's int8 does (saturated)
 *   model   the whole model: greedy tokens and logits of the CUDA backend against the
 *           CPU backend; CUDA graphs on/off bit-identical; the cuBLAS prefill path
 *   batch   the CUDA backend's batch invariance: every sequence's logits bit-identical
 *           alone, batched, and with its prefill chunked among others' decodes
 *   kv8     a kv8 pool (fp8 halves): f16 results until a block converts, conversion
 *           frees half blocks, compaction's moves change no bit, fp8 decode near f16
 *
 * Each group runs in a child process with its own CUDA context, so a kernel that
 * faults (a sticky context error) or crashes fails its own group only; the parent
 * (which never touches CUDA, so fork is safe) collects the lines through a pipe, kills
 * a group that runs past its time, and counts. Random data come from fixed seeds. */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/cpu/attn.h"
#include "core/backend.h"
#include "core/cuda_plan.h"
#include "core/model.h"
#include "core/cpu/quant.h"
#include "core/tokenizer.h"
#include "cuda/cu.h"
#include "cuda/kern.h"
#include "mm/kv.h"
#include "tests/kl.h"
#include "tests/parity_prompts.h"

#define FMT(a, b) __attribute__((format(printf, a, b)))

typedef struct {
    const char *model, *out, *only;
    double timeout_scale; /* e.g. 20 under compute-sanitizer */
} opts;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ================================================================ reporting (child side) */

static int g_fd = 1; /* the pipe to the parent */

static void put_all(const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(g_fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        s += w, n -= (size_t)w;
    }
}

/* One line, one write: under PIPE_BUF, so lines never interleave. */
static void vline(const char *tag, const char *name, const char *fmt, va_list ap) {
    char line[1024];
    int n = name ? snprintf(line, sizeof line, "%s %s: ", tag, name)
                 : snprintf(line, sizeof line, "%s ", tag);
    if (n < 0 || (size_t)n >= sizeof line) n = 0;
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    size_t len = strlen(line);
    for (size_t i = 0; i < len; i++)
        if (line[i] == '\n') line[i] = ' ';
    if (len > sizeof line - 2) len = sizeof line - 2;
    line[len++] = '\n';
    put_all(line, len);
}

static void report(int ok, const char *name, const char *fmt, ...) FMT(3, 4);
static void report(int ok, const char *name, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vline(ok ? "PASS" : "FAIL", name, fmt, ap);
    va_end(ap);
}

static void info(const char *fmt, ...) FMT(1, 2);
static void info(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vline("INFO", NULL, fmt, ap);
    va_end(ap);
}

/* No device at all: the parent stops and exits 2. */
static void no_device(const char *fmt, ...) FMT(1, 2);
static void no_device(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vline("NODEV", NULL, fmt, ap);
    va_end(ap);
    _exit(2);
}

/* Host memory: a test machine that cannot give a few hundred MB fails the group. */
static void *xmalloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        report(0, "host_memory", "calloc of %zu bytes failed", n);
        _exit(1);
    }
    return p;
}

/* ================================================================ random numbers */

static uint64_t g_rng = 1;
static void rng_seed(uint64_t s) { /* spread small seeds over the state */
    g_rng = (s + 1) * 0x9e3779b97f4a7c15ull;
    if (!g_rng) g_rng = 1;
}
static uint32_t rnd_u32(void) { /* xorshift64* */
    g_rng ^= g_rng >> 12, g_rng ^= g_rng << 25, g_rng ^= g_rng >> 27;
    return (uint32_t)((g_rng * 0x2545f4914f6cdd1dull) >> 32);
}
static uint32_t rnd_below(uint32_t n) { return n ? rnd_u32() % n : 0; }
static float rnd_sym(float a) { /* uniform in [-a, a) */
    return a * (2.0f * (float)(rnd_u32() >> 8) / 16777216.0f - 1.0f);
}
static void shuffle_i32(int32_t *v, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)rnd_below((uint32_t)i + 1);
        int32_t t = v[i];
        v[i] = v[j], v[j] = t;
    }
}

/* ================================================================ the device */

typedef struct {
    const cu_api *cu;
    CUdevice dev;
    CUcontext ctx;
    CUstream st;
    kern k;
    int have_ctx, have_k;
} gpu;

static gpu G;
static char g_cuerr[320]; /* why the last device call failed */

static int cu_ok(CUresult r, const char *what) {
    if (r == CUDA_SUCCESS) return 1;
    cu_fail(G.cu, r, what, g_cuerr, sizeof g_cuerr);
    return 0;
}

/* Device buffers of a group, freed together. */
#define MAX_ALLOCS 128
static CUdeviceptr g_allocs[MAX_ALLOCS];
static int g_nallocs;

static CUdeviceptr dalloc(size_t bytes) {
    CUdeviceptr p = 0;
    if (g_nallocs == MAX_ALLOCS) {
        snprintf(g_cuerr, sizeof g_cuerr, "more than %d device buffers", MAX_ALLOCS);
        return 0;
    }
    if (!cu_ok(G.cu->cuMemAlloc(&p, bytes ? bytes : 1), "cuMemAlloc")) return 0;
    g_allocs[g_nallocs++] = p;
    return p;
}

static void dfree_all(void) {
    for (int i = 0; i < g_nallocs; i++) G.cu->cuMemFree(g_allocs[i]);
    g_nallocs = 0;
}

static int dput(CUdeviceptr d, const void *h, size_t n) {
    return cu_ok(G.cu->cuMemcpyHtoD(d, h, n), "cuMemcpyHtoD");
}
static int dget(void *h, CUdeviceptr d, size_t n) {
    return cu_ok(G.cu->cuMemcpyDtoH(h, d, n), "cuMemcpyDtoH");
}
/* A launch's own error, then the kernel's (a fault surfaces at the synchronize). */
static int ran(CUresult launch, const char *what) {
    return cu_ok(launch, what) && cu_ok(G.cu->cuStreamSynchronize(G.st), what);
}

/* Context, stream (CU_STREAM_DEFAULT: ordered with the synchronous copies) and the
 * kernels. Exits 2 through no_device when there is no driver or device. */
static int gpu_open(const char *group) {
    char err[256];
    memset(&G, 0, sizeof G);
    G.cu = cu_load(err, sizeof err);
    if (!G.cu) no_device("%s", err);
    const cu_api *cu = G.cu;
    if (!cu_ok(cu->cuDeviceGet(&G.dev, 0), "cuDeviceGet") ||
        !cu_ok(cu->cuDevicePrimaryCtxRetain(&G.ctx, G.dev), "cuDevicePrimaryCtxRetain"))
        goto fail;
    G.have_ctx = 1;
    if (!cu_ok(cu->cuCtxSetCurrent(G.ctx), "cuCtxSetCurrent") ||
        !cu_ok(cu->cuStreamCreate(&G.st, CU_STREAM_DEFAULT), "cuStreamCreate"))
        goto fail;
    if (kern_load(&G.k, cu, g_cuerr, sizeof g_cuerr) < 0) goto fail;
    G.have_k = 1;
    return 0;
fail:
    report(0, group, "device setup: %s", g_cuerr);
    return -1;
}

static void gpu_close(void) {
    if (!G.cu) return;
    dfree_all();
    if (G.have_k) kern_unload(&G.k);
    if (G.st) G.cu->cuStreamDestroy(G.st);
    if (G.have_ctx) G.cu->cuDevicePrimaryCtxRelease(G.dev);
    memset(&G, 0, sizeof G);
}

/* ================================================================ small host helpers */

static int argmax_first(const float *x, int n) { /* lowest index on ties, as the sampler */
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* top-1 minus top-2 */
static float top2_gap(const float *x, int n) {
    float a = -INFINITY, b = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (x[i] > a) b = a, a = x[i];
        else if (x[i] > b) b = x[i];
    }
    return a - b;
}

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* fp8 e4m3 (bias 7, no infinities, S.1111.111 NaN) to float. */
static float e4m3_to_f32(uint8_t b) {
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    float v = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return s ? -v : v;
}

/* ================================================================ group quant */

/* Weight types and where a block keeps its f16 scales (random-byte rows rewrite them
 * with small finite values). fma: the dequantization is a product and a sum, which
 * nvcc may fuse into one FMA: the GPU may then differ from the CPU in the last bit. */
typedef struct {
    int type;
    const char *name;
    int fma;
    int n_f16; /* f16 fields per block; -1: no random-byte rows (float types) */
    int f16_off[2];
} qinfo;

static const qinfo QINFO[] = {
    {QT_F32, "F32", 0, -1, {0, 0}},  {QT_F16, "F16", 0, -1, {0, 0}},
    {QT_BF16, "BF16", 0, -1, {0, 0}}, {QT_Q4_0, "Q4_0", 0, 1, {0, 0}},
    {QT_Q4_1, "Q4_1", 1, 2, {0, 2}}, {QT_Q5_0, "Q5_0", 0, 1, {0, 0}},
    {QT_Q5_1, "Q5_1", 1, 2, {0, 2}}, {QT_Q8_0, "Q8_0", 0, 1, {0, 0}},
    {QT_Q4_K, "Q4_K", 1, 2, {0, 2}}, {QT_Q5_K, "Q5_K", 1, 2, {0, 2}},
    {QT_Q6_K, "Q6_K", 0, 1, {208, 0}},
};

#define Q_IN 1280 /* 5 super-blocks; 160 slices of 8: 5 per lane */
#define Q_OUT 67  /* not a multiple of the 4 rows a matmul block takes */
#define MM_T 64
#define MM_XS (Q_IN + 8) /* padded strides: the kernels must honour them */
#define MM_OS (Q_OUT + 5)

typedef struct {
    const qinfo *qi;
    size_t rb;
    uint8_t *w;      /* [Q_OUT][rb] */
    float *deq;      /* [Q_OUT][Q_IN] quant_dequant_ref */
    float rowmax[Q_OUT];
    kern_mat m;      /* on the device */
} qmat;

/* Even rows: random floats (a few outliers) through quant_quantize_ref. Odd rows of the
 * block types: random bytes, scales rewritten as small finite f16, so every bit pattern
 * of the packed quants and 6-bit scales is exercised. */
static void make_row(const qinfo *qi, uint8_t *wr, size_t rb, int r, float *tmp) {
    const quant_traits *tr = quant_traits_of((uint32_t)qi->type);
    if (qi->n_f16 < 0 || !(r & 1)) {
        for (int i = 0; i < Q_IN; i++) tmp[i] = rnd_sym(1.0f) * (rnd_below(64) == 0 ? 8.0f : 1.0f);
        quant_quantize_ref((uint32_t)qi->type, tmp, wr, Q_IN);
        return;
    }
    for (size_t i = 0; i < rb; i++) wr[i] = (uint8_t)rnd_u32();
    for (size_t b = 0; b < rb / tr->bytes; b++)
        for (int j = 0; j < qi->n_f16; j++) {
            uint16_t h = quant_f32_to_f16(rnd_sym(0.05f));
            memcpy(wr + b * tr->bytes + qi->f16_off[j], &h, 2);
        }
}

static int qmat_make(qmat *q, const qinfo *qi) {
    memset(q, 0, sizeof *q);
    q->qi = qi;
    q->rb = quant_row_size((uint32_t)qi->type, Q_IN);
    q->w = xmalloc(q->rb * Q_OUT);
    q->deq = xmalloc(sizeof(float) * Q_IN * Q_OUT);
    float *tmp = xmalloc(sizeof(float) * Q_IN);
    for (int r = 0; r < Q_OUT; r++) {
        make_row(qi, q->w + r * q->rb, q->rb, r, tmp);
        quant_dequant_ref((uint32_t)qi->type, q->w + r * q->rb, q->deq + (size_t)r * Q_IN, Q_IN);
        float mx = 0;
        for (int i = 0; i < Q_IN; i++) mx = fmaxf(mx, fabsf(q->deq[(size_t)r * Q_IN + i]));
        q->rowmax[r] = mx;
    }
    free(tmp);
    q->m = (kern_mat){0, qi->type, Q_IN, Q_OUT, (long long)q->rb, 0};
    q->m.w = dalloc(q->rb * Q_OUT);
    return q->m.w && dput(q->m.w, q->w, q->rb * Q_OUT) ? 0 : -1;
}

static void qmat_free(qmat *q) {
    free(q->w);
    free(q->deq);
}

/* Bound on the GPU's f32 dequantized value vs the CPU's: 0 where no FMA can form, else
 * a few ulps of the row's largest value (a fused d*q+m rounds once, the CPU twice). */
static double fma_tol(const qmat *q, int r) {
    return q->qi->fma ? ldexp((double)q->rowmax[r], -20) : 0.0;
}

static void check_dq_f16(const qmat *q, const char *name) {
    char chk[48];
    snprintf(chk, sizeof chk, "dq_f16[%s]", name);
    size_t n = (size_t)Q_IN * Q_OUT;
    uint16_t *h = xmalloc(n * 2);
    CUdeviceptr d = dalloc(n * 2);
    if (!d || !ran(kern_dq_f16(&G.k, G.st, d, &q->m), "kern_dq_f16") || !dget(h, d, n * 2)) {
        report(0, chk, "%s", g_cuerr);
        free(h);
        return;
    }
    /* within f16 rounding: half an f16 ulp of the value (2^-11 relative, 2^-25 in the
     * subnormal range) plus the f32 difference fma_tol */
    double worst = -1, wgot = 0, wwant = 0;
    size_t wi = 0;
    for (size_t i = 0; i < n; i++) {
        double want = q->deq[i], got = quant_f16_to_f32(h[i]);
        double bound = ldexp(fabs(want), -11) * 1.0001 + ldexp(1.0, -25) +
                       fma_tol(q, (int)(i / Q_IN)) * 1.01;
        double ratio = fabs(got - want) / bound;
        if (!(ratio <= worst)) worst = ratio, wi = i, wgot = got, wwant = want;
    }
    report(worst <= 1.0, chk,
           "%zu values: worst |err| = %.3g of the f16 rounding bound (row %zu col %zu: got %.8g, "
           "want %.8g)",
           n, worst, wi / Q_IN, wi % Q_IN, wgot, wwant);
    free(h);
}

static void check_embed(const qmat *q, const char *name) {
    char chk[48];
    snprintf(chk, sizeof chk, "embed[%s]", name);
    enum { T = 13 };
    int32_t tok[T] = {0, Q_OUT - 1, 5, 5, 1};
    for (int t = 5; t < T; t++) tok[t] = (int32_t)rnd_below(Q_OUT);
    float *x = xmalloc(sizeof(float) * T * Q_IN);
    CUdeviceptr td = dalloc(sizeof tok), xd = dalloc(sizeof(float) * T * Q_IN);
    if (!td || !xd || !dput(td, tok, sizeof tok) ||
        !ran(kern_embed(&G.k, G.st, xd, &q->m, td, T), "kern_embed") ||
        !dget(x, xd, sizeof(float) * T * Q_IN)) {
        report(0, chk, "%s", g_cuerr);
        free(x);
        return;
    }
    size_t exact = 0, n = (size_t)T * Q_IN, bad = 0, first = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        int t = (int)(i / Q_IN), r = tok[t];
        float want = q->deq[(size_t)r * Q_IN + i % Q_IN];
        double err = fabs((double)x[i] - want);
        if (memcmp(&x[i], &want, 4) == 0) exact++;
        else if (!(err <= fma_tol(q, r)) && !bad++) first = i;
        if (err > worst) worst = err;
    }
    if (bad)
        report(0, chk, "%zu of %zu values off (first: token %zu row %d col %zu: got %.9g, want %.9g)",
               bad, n, first / Q_IN, tok[first / Q_IN], first % Q_IN, x[first],
               q->deq[(size_t)tok[first / Q_IN] * Q_IN + first % Q_IN]);
    else
        report(1, chk, "%zu/%zu values bit-exact%s, max |err| %.3g", exact, n,
               q->qi->fma ? " (the rest within the FMA bound)" : "", worst);
    free(x);
}

/* kern_mm for T in MM_TS (T = 64 first: the others are compared with it bit for bit),
 * with and without add and bias; then single tokens at offsets into the batch. */
static const int MM_TS[] = {MM_T, 1, 3, 8, 13};
static const int MM_OFFS[] = {7, 8, 9, 63};

typedef struct {
    float *x, *base, *bias, *got, *ref64; /* x [T][XS], base/got/ref64 [T][OS], bias [Q_OUT] */
    double *dot, *mag;                    /* [T][Q_OUT]: exact dot, sum |w||x| */
    CUdeviceptr xd, od, bd;
} mm_fx;

static int mm_setup(mm_fx *f, const qmat *q) {
    f->x = xmalloc(sizeof(float) * MM_T * MM_XS);
    f->base = xmalloc(sizeof(float) * MM_T * MM_OS);
    f->got = xmalloc(sizeof(float) * MM_T * MM_OS);
    f->ref64 = xmalloc(sizeof(float) * MM_T * MM_OS);
    f->bias = xmalloc(sizeof(float) * Q_OUT);
    f->dot = xmalloc(sizeof(double) * MM_T * Q_OUT);
    f->mag = xmalloc(sizeof(double) * MM_T * Q_OUT);
    for (int i = 0; i < MM_T * MM_XS; i++) f->x[i] = rnd_sym(1.0f) * (rnd_below(50) ? 1.0f : 10.0f);
    for (int i = 0; i < MM_T * MM_OS; i++) f->base[i] = rnd_sym(4.0f);
    for (int i = 0; i < Q_OUT; i++) f->bias[i] = rnd_sym(2.0f);
    for (int t = 0; t < MM_T; t++)
        for (int r = 0; r < Q_OUT; r++) {
            double s = 0, a = 0;
            const float *w = q->deq + (size_t)r * Q_IN, *x = f->x + (size_t)t * MM_XS;
            for (int i = 0; i < Q_IN; i++) s += (double)w[i] * x[i], a += fabs((double)w[i] * x[i]);
            f->dot[t * Q_OUT + r] = s, f->mag[t * Q_OUT + r] = a;
        }
    f->xd = dalloc(sizeof(float) * MM_T * MM_XS);
    f->od = dalloc(sizeof(float) * MM_T * MM_OS);
    f->bd = dalloc(sizeof(float) * Q_OUT);
    return f->xd && f->od && f->bd && dput(f->xd, f->x, sizeof(float) * MM_T * MM_XS) &&
                   dput(f->bd, f->bias, sizeof(float) * Q_OUT)
               ? 0
               : -1;
}

static void mm_free(mm_fx *f) {
    free(f->x), free(f->base), free(f->got), free(f->ref64), free(f->bias), free(f->dot),
        free(f->mag);
}

/* One launch over T tokens starting at token t0; out rows t0.. into f->got. */
static int mm_launch(mm_fx *f, const qmat *q, int t0, int T, int add, int bias) {
    size_t ob = sizeof(float) * MM_T * MM_OS;
    return dput(f->od, f->base, ob) &&
           ran(kern_mm(&G.k, G.st, &q->m, f->xd + (size_t)t0 * MM_XS * 4, MM_XS,
                       f->od + (size_t)t0 * MM_OS * 4, MM_OS, T, add, bias ? f->bd : 0),
               "kern_mm") &&
           dget(f->got, f->od, ob);
}

typedef struct {
    double worst; /* relative error, of sum |w||x| (+ |bias| + |base|) */
    int wt, wr, wT, wv;
    long untouched_bad, inv_bad;
    char inv_first[160];
} mm_res;

static const char *MM_VARIANT[] = {"store", "add", "bias", "add+bias"};

/* Compares f->got of a T-token launch at t0 with the reference (and, when inv, bit for
 * bit with the T = 64 result of the same variant). */
static void mm_compare(const mm_fx *f, int t0, int T, int v, mm_res *res) {
    int add = v & 1, bias = v >> 1;
    for (int t = 0; t < MM_T; t++)
        for (int r = 0; r < MM_OS; r++) {
            size_t i = (size_t)t * MM_OS + r;
            if (t < t0 || t >= t0 + T || r >= Q_OUT) { /* outside the launch: untouched */
                if (memcmp(&f->got[i], &f->base[i], 4)) res->untouched_bad++;
                continue;
            }
            double want = f->dot[t * Q_OUT + r] + (add ? f->base[i] : 0) + (bias ? f->bias[r] : 0);
            double scale = f->mag[t * Q_OUT + r] + (add ? fabs(f->base[i]) : 0) +
                           (bias ? fabs(f->bias[r]) : 0) + 1e-30;
            double e = fabs(f->got[i] - want) / scale;
            if (!(e <= res->worst)) res->worst = e, res->wt = t, res->wr = r, res->wT = T, res->wv = v;
            if (T != MM_T && memcmp(&f->got[i], &f->ref64[i], 4) && !res->inv_bad++)
                snprintf(res->inv_first, sizeof res->inv_first,
                         "T=%d at token %d: token %d row %d = %.9g, with T=64 %.9g (%s)", T, t0, t,
                         r, f->got[i], f->ref64[i], MM_VARIANT[v]);
        }
}

static void check_mm(const qmat *q, const char *name) {
    char chk[48], chk2[48];
    snprintf(chk, sizeof chk, "mm[%s]", name);
    snprintf(chk2, sizeof chk2, "mm_batch_invariance[%s]", name);
    mm_fx f;
    mm_res res;
    memset(&f, 0, sizeof f);
    memset(&res, 0, sizeof res);
    res.worst = -1;
    int ok = mm_setup(&f, q) == 0, launches = 0;
    for (int v = 0; v < 4 && ok; v++) {
        for (size_t k = 0; k < sizeof MM_TS / sizeof MM_TS[0] && ok; k++) {
            int T = MM_TS[k];
            if (!(ok = mm_launch(&f, q, 0, T, v & 1, v >> 1))) break;
            launches++;
            mm_compare(&f, 0, T, v, &res);
            if (T == MM_T) memcpy(f.ref64, f.got, sizeof(float) * MM_T * MM_OS);
        }
        for (size_t k = 0; k < sizeof MM_OFFS / sizeof MM_OFFS[0] && ok; k++) {
            if (!(ok = mm_launch(&f, q, MM_OFFS[k], 1, v & 1, v >> 1))) break;
            launches++;
            mm_compare(&f, MM_OFFS[k], 1, v, &res);
        }
    }
    if (!ok) {
        report(0, chk, "%s", g_cuerr);
        report(0, chk2, "not run: %s", g_cuerr);
    } else {
        int pass = res.worst <= 1e-4 && res.untouched_bad == 0;
        report(pass, chk,
               "%d launches (T=64,1,3,8,13 and single tokens at 7,8,9,63; store/add/bias/add+bias): "
               "max rel err %.3g of sum|w||x| (tol 1e-4) at T=%d %s token %d row %d; %ld cells "
               "outside the launch changed",
               launches, res.worst, res.wT, MM_VARIANT[res.wv], res.wt, res.wr, res.untouched_bad);
        if (res.inv_bad)
            report(0, chk2, "%ld values differ from the T=64 launch; first: %s", res.inv_bad,
                   res.inv_first);
        else
            report(1, chk2, "every token's row bit-identical for T=1,3,8,13,64 and at offsets");
    }
    mm_free(&f);
}

static void group_quant(const opts *o) {
    (void)o;
    if (gpu_open("quant") < 0) return;
    char name[96] = "";
    G.cu->cuDeviceGetName(name, sizeof name, G.dev);
    size_t tot = 0;
    G.cu->cuDeviceTotalMem(&tot, G.dev);
    info("device 0: %s, %zu MiB, driver API %d", name, tot >> 20, G.cu->driver_version);
    for (size_t i = 0; i < sizeof QINFO / sizeof QINFO[0]; i++) {
        rng_seed(0x51u + i);
        qmat q;
        if (qmat_make(&q, &QINFO[i]) < 0) {
            char chk[48];
            snprintf(chk, sizeof chk, "upload[%s]", QINFO[i].name);
            report(0, chk, "uploading the weights: %s", g_cuerr);
        } else {
            check_dq_f16(&q, QINFO[i].name);
            check_embed(&q, QINFO[i].name);
            check_mm(&q, QINFO[i].name);
        }
        qmat_free(&q);
        dfree_all();
    }
    gpu_close();
}

/* ================================================================ group kernels */

static void check_rmsnorm(int d, int use_rows) {
    char chk[48];
    snprintf(chk, sizeof chk, "rmsnorm[d=%d%s]", d, use_rows ? ",rows" : "");
    enum { NSRC = 7 };
    int32_t rows[] = {6, 0, 3, 3, 1};
    int n = use_rows ? 5 : NSRC;
    float *x = xmalloc(sizeof(float) * NSRC * d), *w = xmalloc(sizeof(float) * d);
    float *out = xmalloc(sizeof(float) * NSRC * d);
    for (int r = 0; r < NSRC; r++) {
        float mag = powf(10.0f, (float)(r % 5) - 2.0f); /* 0.01 .. 100 */
        for (int i = 0; i < d; i++) x[r * d + i] = rnd_sym(mag);
    }
    for (int i = 0; i < d; i++) w[i] = rnd_sym(2.0f);
    float eps = 1e-5f;
    CUdeviceptr xd = dalloc(sizeof(float) * NSRC * d), wd = dalloc(sizeof(float) * d);
    CUdeviceptr od = dalloc(sizeof(float) * NSRC * d), rd = dalloc(sizeof rows);
    if (!xd || !wd || !od || !rd || !dput(xd, x, sizeof(float) * NSRC * d) ||
        !dput(wd, w, sizeof(float) * d) || !dput(rd, rows, sizeof rows) ||
        !ran(kern_rmsnorm(&G.k, G.st, od, xd, wd, d, eps, use_rows ? rd : 0, n), "kern_rmsnorm") ||
        !dget(out, od, sizeof(float) * n * d)) {
        report(0, chk, "%s", g_cuerr);
    } else {
        double worst = 0;
        int wi = 0;
        for (int i = 0; i < n; i++) {
            const float *xr = x + (use_rows ? rows[i] : i) * d;
            double ss = 0;
            for (int k = 0; k < d; k++) ss += (double)xr[k] * xr[k];
            double sc = 1.0 / sqrt(ss / d + eps);
            for (int k = 0; k < d; k++) {
                double want = xr[k] * sc * w[k], e = fabs(out[i * d + k] - want) / (fabs(want) + 1e-30);
                if (!(e <= worst)) worst = e, wi = i * d + k;
            }
        }
        report(worst <= 1e-5, chk, "%d rows: max rel err %.3g (tol 1e-5) at row %d col %d", n, worst,
               wi / d, wi % d);
    }
    free(x), free(w), free(out);
}

static void check_swiglu(void) {
    const long long n = 100003; /* not a multiple of the 256 threads */
    float *g = xmalloc(sizeof(float) * n), *u = xmalloc(sizeof(float) * n);
    float *h = xmalloc(sizeof(float) * n);
    for (long long i = 0; i < n; i++) g[i] = rnd_sym(15.0f), u[i] = rnd_sym(3.0f);
    CUdeviceptr gd = dalloc(sizeof(float) * n), ud = dalloc(sizeof(float) * n);
    /* in place (h = g), as the backend calls it */
    if (!gd || !ud || !dput(gd, g, sizeof(float) * n) || !dput(ud, u, sizeof(float) * n) ||
        !ran(kern_swiglu(&G.k, G.st, gd, gd, ud, n), "kern_swiglu") ||
        !dget(h, gd, sizeof(float) * n)) {
        report(0, "swiglu", "%s", g_cuerr);
    } else {
        double worst = 0;
        long long wi = 0;
        for (long long i = 0; i < n; i++) {
            double want = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
            double e = fabs(h[i] - want) / (fabs(want) + 1e-37);
            if (!(e <= worst)) worst = e, wi = i;
        }
        report(worst <= 1e-5, "swiglu",
               "%lld values in place: max rel err %.3g (tol 1e-5) at g=%.6g u=%.6g", n, worst, g[wi],
               u[wi]);
    }
    free(g), free(u), free(h);
}

/* Rows of planted maxima and ties (the lowest index must win, as the CPU sampler's). */
static void make_argmax_row(float *r, int nv, int kind) {
    for (int i = 0; i < nv; i++) r[i] = rnd_sym(10.0f);
    int a = (int)rnd_below((uint32_t)nv), b = (int)rnd_below((uint32_t)nv);
    if (a > b) { int t = a; a = b; b = t; }
    switch (kind) {
    case 1: r[a] = r[b] = 20.0f; break;                        /* tie anywhere */
    case 2: if (a + 256 < nv) r[a] = r[a + 256] = 20.0f; break; /* tie in one thread */
    case 3: for (int i = 0; i < nv; i++) r[i] = 1.5f; break;  /* all equal: 0 */
    case 4: r[nv - 1] = 20.0f; break;                          /* the last */
    case 5: r[0] = r[nv - 1] = 20.0f; break;                   /* first and last */
    case 6: r[b] = r[a] = r[(a + b) / 2] = 20.0f; break;       /* three-way */
    case 7: for (int i = 0; i < nv; i++) if (i % 3) r[i] = -INFINITY; break;
    default: break;                                            /* plain random */
    }
}

static void check_argmax(void) {
    static const int NV[] = {49152, 1000, 257, 256, 7};
    enum { ROWS = 8 };
    int bad = 0, rows = 0;
    char first[160] = "";
    for (size_t k = 0; k < sizeof NV / sizeof NV[0]; k++) {
        int nv = NV[k];
        float *x = xmalloc(sizeof(float) * ROWS * nv);
        int32_t got[ROWS];
        for (int r = 0; r < ROWS; r++) make_argmax_row(x + (size_t)r * nv, nv, r);
        CUdeviceptr xd = dalloc(sizeof(float) * ROWS * nv), od = dalloc(sizeof got);
        if (!xd || !od || !dput(xd, x, sizeof(float) * ROWS * nv) ||
            !ran(kern_argmax(&G.k, G.st, od, xd, nv, ROWS), "kern_argmax") ||
            !dget(got, od, sizeof got)) {
            report(0, "argmax", "n_vocab %d: %s", nv, g_cuerr);
            free(x);
            return;
        }
        for (int r = 0; r < ROWS; r++, rows++) {
            int want = argmax_first(x + (size_t)r * nv, nv);
            if (got[r] != want && !bad++)
                snprintf(first, sizeof first, "n_vocab %d row kind %d: got %d (%.6g), want %d (%.6g)",
                         nv, r, got[r], got[r] >= 0 && got[r] < nv ? x[(size_t)r * nv + got[r]] : NAN,
                         want, x[(size_t)r * nv + want]);
        }
        free(x);
    }
    if (bad) report(0, "argmax", "%d of %d rows wrong; first: %s", bad, rows, first);
    else
        report(1, "argmax", "%d rows (n_vocab 49152, 1000, 257, 256, 7; ties -> lowest index) exact",
               rows);
}

static void group_kernels(const opts *o) {
    (void)o;
    if (gpu_open("kernels") < 0) return;
    rng_seed(0x4b);
    check_rmsnorm(576, 0);
    check_rmsnorm(576, 1);
    check_rmsnorm(4096, 0);
    check_rmsnorm(4096, 1);
    dfree_all();
    check_swiglu();
    dfree_all();
    check_argmax();
    gpu_close();
}

/* ================================================================ group rope */

/* factor: the last pair's angle divided by it, the first's by 1, a ramp between (as
 * Llama 3.1's rope_freqs or a linear/YaRN scale fold into model_config.rope_freq);
 * mscale: cos and sin times it (YaRN's magnitude). */
typedef struct {
    int nh, nkv, hd, rd, neox;
    float base, factor, mscale;
} rope_case;

static const rope_case ROPE[] = {
    {9, 3, 64, 64, 0, 10000.0f, 1, 1},     /* SmolLM2 */
    {9, 3, 64, 64, 1, 100000.0f, 1, 1},    /* NeoX pairing */
    {8, 2, 128, 128, 0, 500000.0f, 1, 1},  /* Llama-3 */
    {4, 2, 64, 32, 1, 10000.0f, 1, 1},     /* partial rotation */
    {8, 2, 128, 128, 0, 500000.0f, 8, 1},  /* Llama-3.1's RoPE factors */
    {4, 2, 64, 64, 1, 1000000.0f, 4, 1.1386f}, /* YaRN factor 4 */
};

/* The case's angle per position of each pair: model_config.rope_freq. */
static void rope_freqs(const rope_case *c, double *freq) {
    int half = c->rd / 2;
    for (int i = 0; i < half; i++)
        freq[i] = pow((double)c->base, -2.0 * i / c->rd) / (1.0 + (c->factor - 1.0) * i / (half - 1));
}

/* core/model.c rope_table + rope_apply for one vector of n heads at position p. */
static void rope_ref(const rope_case *c, float *vec, int n, int p) {
    int half = c->rd / 2;
    double freq[ATTN_MAX_DIM / 2];
    rope_freqs(c, freq);
    for (int i = 0; i < half; i++) {
        double theta = (double)p * freq[i];
        float co = (float)cos(theta) * c->mscale, si = (float)sin(theta) * c->mscale;
        for (int h = 0; h < n; h++) {
            float *v = vec + h * c->hd;
            int a = c->neox ? i : 2 * i, b = c->neox ? i + half : 2 * i + 1;
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * co - x1 * si;
            v[b] = x0 * si + x1 * co;
        }
    }
}

/* Worst |got - want| of rotated elements over |x0| + |x1| of their pair (the rounding of
 * two products and a sum, maybe fused); unrotated elements must be exact. */
static double rope_err(const rope_case *c, const float *orig, const float *got, const float *want,
                       int n, int *unrot_bad) {
    int half = c->rd / 2;
    double worst = 0;
    for (int h = 0; h < n; h++)
        for (int i = 0; i < c->hd; i++) {
            int k = h * c->hd + i, rot = i < c->rd, j;
            if (!rot) {
                *unrot_bad += memcmp(&got[k], &orig[k], 4) != 0;
                continue;
            }
            if (c->neox) j = i < half ? i + half : i - half;
            else j = i ^ 1;
            double mag = fabs(orig[k]) + fabs(orig[h * c->hd + j]) + 1e-30;
            double e = fabs((double)got[k] - want[k]) / mag;
            if (!(e <= worst)) worst = e;
        }
    return worst;
}

/* A block's first slot written at layer 0 makes it f16 again (a reused 8-bit block):
 * with every flag set, a launch at layer 1 clears none, one at layer 0 exactly the
 * blocks some token writes at offset 0. */
static void check_rope_flags(const rope_case *rc, const kern_heads *c, kern_kv kv, CUdeviceptr q,
                             CUdeviceptr k, CUdeviceptr v, CUdeviceptr pos, CUdeviceptr slot_d,
                             const int32_t *slot, int T, int nb, int bs) {
    char chk[80];
    snprintf(chk, sizeof chk, "rope_fp8_flags[neox=%d hd=%d rope_dim=%d]", rc->neox, rc->hd, rc->rd);
    uint8_t ones[64], got1[64], got0[64], want[64];
    memset(ones, 1, sizeof ones);
    memset(want, 1, sizeof want);
    for (int t = 0; t < T; t++)
        if (slot[t] % bs == 0) want[slot[t] / bs] = 0;
    kv.fp8 = dalloc((size_t)nb);
    if (nb > 64 || !kv.fp8 || !dput(kv.fp8, ones, (size_t)nb) ||
        !ran(kern_rope_store(&G.k, G.st, c, &kv, q, k, v, pos, slot_d, 1, T), "kern_rope_store") ||
        !dget(got1, kv.fp8, (size_t)nb) ||
        !ran(kern_rope_store(&G.k, G.st, c, &kv, q, k, v, pos, slot_d, 0, T), "kern_rope_store") ||
        !dget(got0, kv.fp8, (size_t)nb)) {
        report(0, chk, "%s", nb > 64 ? "too many blocks" : g_cuerr);
        return;
    }
    int bad1 = 0, bad0 = 0, cleared = 0;
    for (int b = 0; b < nb; b++) bad1 += got1[b] != 1, bad0 += got0[b] != want[b], cleared += !want[b];
    report(!bad1 && !bad0, chk,
           "flags all set: layer 1 changed %d (want 0); layer 0 cleared the %d blocks written at "
           "offset 0 with %d flags wrong",
           bad1, cleared, bad0);
}

static void check_rope(const rope_case *rc) {
    char chk[128], chk2[80];
    snprintf(chk, sizeof chk, "rope[neox=%d hd=%d rope_dim=%d base=%g factor=%g mscale=%g]", rc->neox,
             rc->hd, rc->rd, (double)rc->base, (double)rc->factor, (double)rc->mscale);
    snprintf(chk2, sizeof chk2, "rope_store[neox=%d hd=%d rope_dim=%d]", rc->neox, rc->hd, rc->rd);
    enum { T = 37, NB = 32, BS = 16, LAYERS = 2, LAYER = 1 };
    int qd = rc->nh * rc->hd, kd = rc->nkv * rc->hd;
    long long be = (long long)LAYERS * 2 * rc->nkv * BS * rc->hd;
    size_t pool_n = (size_t)NB * (size_t)be;
    int32_t pos[T], slot[T], perm[NB * BS];
    int fixed[] = {0, 1, 2, 4000, 3999, 1023};
    for (int t = 0; t < T; t++) pos[t] = t < 6 ? fixed[t] : (int32_t)rnd_below(4001);
    for (int i = 0; i < NB * BS; i++) perm[i] = i;
    shuffle_i32(perm, NB * BS);
    memcpy(slot, perm, sizeof slot); /* distinct slots */
    int any0 = 0;
    for (int t = 0; t < T; t++) any0 |= slot[t] % BS == 0;
    if (!any0) slot[0] -= slot[0] % BS; /* some block's first slot (free: no slot has offset 0) */
    float *q0 = xmalloc(sizeof(float) * T * qd), *k0 = xmalloc(sizeof(float) * T * kd);
    float *v0 = xmalloc(sizeof(float) * T * kd), *q = xmalloc(sizeof(float) * T * qd);
    float *k = xmalloc(sizeof(float) * T * kd), *qr = xmalloc(sizeof(float) * T * qd);
    float *kr = xmalloc(sizeof(float) * T * kd);
    uint16_t *pool0 = xmalloc(pool_n * 2), *pool = xmalloc(pool_n * 2), *want = xmalloc(pool_n * 2);
    for (int i = 0; i < T * qd; i++) q0[i] = rnd_sym(2.0f);
    for (int i = 0; i < T * kd; i++) k0[i] = rnd_sym(2.0f), v0[i] = rnd_sym(2.0f);
    for (size_t i = 0; i < pool_n; i++) pool0[i] = quant_f32_to_f16(rnd_sym(2.0f));
    CUdeviceptr qd_ = dalloc(sizeof(float) * T * qd), kd_ = dalloc(sizeof(float) * T * kd);
    CUdeviceptr vd = dalloc(sizeof(float) * T * kd), pd = dalloc(sizeof pos), sd = dalloc(sizeof slot);
    CUdeviceptr kvd = dalloc(pool_n * 2), fd = dalloc(sizeof(double) * (ATTN_MAX_DIM / 2));
    double freq[ATTN_MAX_DIM / 2];
    rope_freqs(rc, freq);
    kern_heads c = {rc->nh, rc->nkv, rc->hd, rc->rd, rc->neox, fd, rc->mscale};
    kern_kv kv = {kvd, 0, 0, LAYERS, rc->nkv, rc->hd, BS, be, be};
    if (!qd_ || !kd_ || !vd || !pd || !sd || !kvd || !fd ||
        !dput(fd, freq, sizeof(double) * (size_t)(rc->rd / 2)) || !dput(qd_, q0, sizeof(float) * T * qd) ||
        !dput(kd_, k0, sizeof(float) * T * kd) || !dput(vd, v0, sizeof(float) * T * kd) ||
        !dput(pd, pos, sizeof pos) || !dput(sd, slot, sizeof slot) || !dput(kvd, pool0, pool_n * 2) ||
        !ran(kern_rope_store(&G.k, G.st, &c, &kv, qd_, kd_, vd, pd, sd, LAYER, T), "kern_rope_store") ||
        !dget(q, qd_, sizeof(float) * T * qd) || !dget(k, kd_, sizeof(float) * T * kd) ||
        !dget(pool, kvd, pool_n * 2)) {
        report(0, chk, "%s", g_cuerr);
        report(0, chk2, "not run: %s", g_cuerr);
        report(0, "rope_fp8_flags", "not run: %s", g_cuerr);
        goto out;
    }
    memcpy(qr, q0, sizeof(float) * T * qd);
    memcpy(kr, k0, sizeof(float) * T * kd);
    double worst = 0;
    int unrot_bad = 0;
    for (int t = 0; t < T; t++) {
        rope_ref(rc, qr + t * qd, rc->nh, pos[t]);
        rope_ref(rc, kr + t * kd, rc->nkv, pos[t]);
        worst = fmax(worst, rope_err(rc, q0 + t * qd, q + t * qd, qr + t * qd, rc->nh, &unrot_bad));
        worst = fmax(worst, rope_err(rc, k0 + t * kd, k + t * kd, kr + t * kd, rc->nkv, &unrot_bad));
    }
    report(worst <= 1e-6 && unrot_bad == 0, chk,
           "%d tokens at positions 0..4000: max err %.3g of |x0|+|x1| (tol 1e-6), %d unrotated "
           "elements changed",
           T, worst, unrot_bad);
    /* The cache: exactly f16 of the kernel's own rotated k, and of v, at each slot of
     * layer LAYER; every other element as it was. */
    memcpy(want, pool0, pool_n * 2);
    long long he = (long long)BS * rc->hd;
    for (int t = 0; t < T; t++) {
        long long blk = slot[t] / BS, off = slot[t] % BS;
        for (int h = 0; h < rc->nkv; h++)
            for (int i = 0; i < rc->hd; i++) {
                long long kb = blk * be + ((long long)LAYER * 2 * rc->nkv + h) * he + off * rc->hd + i;
                want[kb] = quant_f32_to_f16(k[t * kd + h * rc->hd + i]);
                want[kb + rc->nkv * he] = quant_f32_to_f16(v0[t * kd + h * rc->hd + i]);
            }
    }
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < pool_n; i++)
        if (pool[i] != want[i] && !bad++) first = i;
    if (bad)
        report(0, chk2,
               "%zu of %zu cache elements wrong; first: block %zu elem %zu = 0x%04x, want 0x%04x", bad,
               pool_n, first / (size_t)be, first % (size_t)be, pool[first], want[first]);
    else
        report(1, chk2, "%d tokens into random slots of layer %d: K = f16(rotated k), V = f16(v), the "
               "other %zu elements untouched", T, LAYER, pool_n - (size_t)T * 2 * kd);
    check_rope_flags(rc, &c, kv, qd_, kd_, vd, pd, sd, slot, T, NB, BS); /* last: it rewrites */
out:
    free(q0), free(k0), free(v0), free(q), free(k), free(qr), free(kr);
    free(pool0), free(pool), free(want);
}

static void group_rope(const opts *o) {
    (void)o;
    if (gpu_open("rope") < 0) return;
    for (size_t i = 0; i < sizeof ROPE / sizeof ROPE[0]; i++) {
        rng_seed(0x70 + i);
        check_rope(&ROPE[i]);
        dfree_all();
    }
    gpu_close();
}

/* ================================================================ group attn */

/* A paged KV pool on the device, sequences with random page tables, and one batch
 * mixing decode tokens and causal prefill runs, packed by cplan_pack as the backend. */
typedef struct {
    int hd, g, nkv, max_len;
} attn_case;

static const attn_case ATTN[] = {
    {64, 3, 3, 300},  /* SmolLM2 */
    {128, 4, 2, 300}, /* Llama-3 8B */
    {256, 16, 1, 160}, /* the widest head and group k_attn takes: a tile per token */
};

#define A_LAYERS 2
#define A_BS 16
#define A_BLOCKS 64
#define A_SEQS 10
#define A_TSTRIDE 20
#define A_MAXT (A_SEQS * 300)

typedef struct {
    attn_case ac;
    int nh, qd, T, n_decode, n_prefill, n_tiles; /* n_tiles: of the whole batch */
    long long be, he;
    uint16_t *pool;                 /* host copy, [A_BLOCKS][be] f16 */
    int32_t tables[A_SEQS][A_TSTRIDE];
    kv_seq seqs[A_SEQS];
    int32_t tok[A_MAXT], pos[A_MAXT];
    kv_seq *seq[A_MAXT];
    float *q;                       /* [T][qd] */
    float *out[A_LAYERS];           /* the GPU's f16-cache outputs per layer */
    kern_heads c;
    kern_kv kv;
    cplan_attn geom;
    kern_attn_geom kag; /* geom's launch numbers */
    cplan_layout L;
    int32_t *stage;
    CUdeviceptr pool_d, q_d, out_d, stage_d;
    const int32_t *loc; /* packing: blocks' first units (a kv8 pool's halves), NULL = ids */
} attn_fx;

static void attn_free(attn_fx *f) {
    free(f->pool), free(f->q), free(f->stage);
    for (int l = 0; l < A_LAYERS; l++) free(f->out[l]);
}

/* Sequence i's length and batch part: decode = its last position alone, else the
 * positions [start, len) as one prefill run. */
static void attn_seq_plan(const attn_fx *f, int i, int *len, int *start) {
    int m = f->ac.max_len;
    static const int fixed_len[A_SEQS] = {1, 16, 17, 0, 0, 0, 0, 0, 32, 0};
    *len = fixed_len[i] ? fixed_len[i] : i == 3 ? m : 1 + (int)rnd_below((uint32_t)m);
    switch (i) {
    case 1: case 3: *start = 0; break;                          /* whole prefills */
    case 5: case 7: *start = (int)rnd_below((uint32_t)*len); break; /* later chunks */
    default: *start = *len - 1; break;                          /* decode */
    }
}

static int attn_setup(attn_fx *f, const attn_case *ac, char *why, size_t wn) {
    memset(f, 0, sizeof *f);
    f->ac = *ac;
    f->nh = ac->g * ac->nkv, f->qd = f->nh * ac->hd;
    f->he = (long long)A_BS * ac->hd, f->be = (long long)A_LAYERS * 2 * ac->nkv * f->he;
    size_t pool_n = (size_t)A_BLOCKS * (size_t)f->be;
    f->pool = xmalloc(pool_n * 2);
    for (size_t i = 0; i < pool_n; i++) f->pool[i] = quant_f32_to_f16(rnd_sym(2.0f));
    /* one all-zero slab (block 2, layer 0, K, head 0): fp8's scale must stay finite */
    memset(f->pool + 2 * f->be, 0, (size_t)f->he * 2);
    int order[A_SEQS];
    for (int i = 0; i < A_SEQS; i++) order[i] = i;
    for (int i = A_SEQS - 1; i > 0; i--) {
        int j = (int)rnd_below((uint32_t)i + 1), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    for (int k = 0; k < A_SEQS; k++) {
        int i = order[k], len, start;
        attn_seq_plan(f, i, &len, &start);
        int32_t perm[A_BLOCKS];
        for (int b = 0; b < A_BLOCKS; b++) perm[b] = b;
        shuffle_i32(perm, A_BLOCKS);
        memcpy(f->tables[i], perm, sizeof f->tables[i]);
        f->seqs[i].blocks = f->tables[i];
        f->seqs[i].n_blocks = (len + A_BS - 1) / A_BS;
        f->seqs[i].id = i;
        for (int p = start; p < len; p++) {
            f->tok[f->T] = 0, f->pos[f->T] = p, f->seq[f->T] = &f->seqs[i];
            f->T++;
        }
        if (len - start == 1) f->n_decode++;
        else f->n_prefill++;
    }
    f->q = xmalloc(sizeof(float) * (size_t)f->T * f->qd);
    for (size_t i = 0; i < (size_t)f->T * f->qd; i++) f->q[i] = rnd_sym(3.0f);
    f->c = (kern_heads){f->nh, ac->nkv, ac->hd, 0, 0, 0, 0.0f};
    if (cplan_attn_geom(ac->hd, ac->g, &f->geom) < 0) {
        snprintf(why, wn, "cplan_attn_geom(%d, %d) refused", ac->hd, ac->g);
        return -1;
    }
    f->kag = (kern_attn_geom){f->geom.kt, f->geom.threads, f->geom.smem};
    cplan_layout_init(&f->L, f->T, 1, A_TSTRIDE);
    f->stage = xmalloc(f->L.total * sizeof(int32_t));
    f->pool_d = dalloc(pool_n * 2);
    f->q_d = dalloc(sizeof(float) * (size_t)f->T * f->qd);
    f->out_d = dalloc(sizeof(float) * (size_t)f->T * f->qd);
    f->stage_d = dalloc(f->L.total * sizeof(int32_t));
    if (!f->pool_d || !f->q_d || !f->out_d || !f->stage_d || !dput(f->pool_d, f->pool, pool_n * 2) ||
        !dput(f->q_d, f->q, sizeof(float) * (size_t)f->T * f->qd)) {
        snprintf(why, wn, "%s", g_cuerr);
        return -1;
    }
    f->kv = (kern_kv){f->pool_d, 0, 0, A_LAYERS, ac->nkv, ac->hd, A_BS, f->be, f->be};
    return 0;
}

/* Packs a batch (the whole one, or one token of it) into layout L, uploads it, runs
 * kern_attn over kv for one layer and downloads n rows of output into out. */
static int attn_launch(attn_fx *f, const kern_kv *kv, const cplan_layout *L, int32_t *stage,
                       CUdeviceptr stage_d, CUdeviceptr q_d, CUdeviceptr out_d, int t0, int n,
                       int layer, float *out, char *why, size_t wn) {
    model_batch b = {n, f->tok + t0, f->pos + t0, f->seq + t0, 0, NULL};
    cplan_step sp;
    if (cplan_pack(L, &b, f->loc, A_BS, f->geom.qt, stage, &sp, why, wn) < 0) return -1;
    if (n == f->T) f->n_tiles = sp.n_tiles;
    size_t ob = sizeof(float) * (size_t)n * f->qd;
    if (!dput(stage_d, stage, sp.upload * sizeof(int32_t)) ||
        !ran(kern_attn(&G.k, G.st, &f->c, kv, &f->kag, q_d, out_d, stage_d + L->tiles * 4,
                       stage_d + L->pos * 4, stage_d + L->tables * 4, L->tstride, layer, sp.n_tiles),
             "kern_attn") ||
        !dget(out, out_d, ob)) {
        snprintf(why, wn, "%s", g_cuerr);
        return -1;
    }
    return 0;
}

/* core/cpu/attn.h's reference for token t, all heads: q scaled by 1/sqrt(hd) as the CPU's
 * att_task, then the sequence's blocks through its page table, block_size keys at a
 * time up to the token's position. */
static void attn_ref_f16(const attn_fx *f, int t, int layer, float *out) {
    int hd = f->ac.hd, g = f->ac.g, nkv = f->ac.nkv, npos = f->pos[t] + 1;
    const int32_t *table = f->seq[t]->blocks;
    float scale = 1.0f / sqrtf((float)hd);
    static attn_state st;
    static float qs[ATTN_MAX_GROUP * ATTN_MAX_DIM];
    static uint16_t kt[ATTN_MAX_DIM * A_BS];
    for (int h = 0; h < nkv; h++) {
        const float *src = f->q + (size_t)t * f->qd + (size_t)h * g * hd;
        for (int i = 0; i < g * hd; i++) qs[i] = src[i] * scale;
        attn_init(&st, g, hd);
        for (int p0 = 0; p0 < npos; p0 += A_BS) {
            const uint16_t *blk = f->pool + (size_t)table[p0 / A_BS] * (size_t)f->be;
            const uint16_t *K = blk + ((size_t)layer * 2 * nkv + h) * (size_t)f->he;
            const uint16_t *V = blk + (((size_t)layer * 2 + 1) * nkv + h) * (size_t)f->he;
            int m = npos - p0 < A_BS ? npos - p0 : A_BS;
            /* the device's K rows are slot-major, the reference takes the CPU pool's
             * dimension-major slab */
            for (int i = 0; i < m; i++)
                for (int d = 0; d < hd; d++) kt[(size_t)d * A_BS + (size_t)i] = K[(size_t)i * hd + (size_t)d];
            attn_block_ref(&st, qs, kt, A_BS, V, m);
        }
        attn_finish(&st, out + (size_t)h * g * hd, (size_t)hd);
    }
}

/* The same in double over a float copy of the pool (for fp8 blocks, whose values f16
 * cannot hold). */
static void attn_ref_float(const attn_fx *f, const float *poolf, int t, int layer, float *out) {
    int hd = f->ac.hd, g = f->ac.g, nkv = f->ac.nkv, npos = f->pos[t] + 1;
    const int32_t *table = f->seq[t]->blocks;
    double scale = 1.0 / sqrt((double)hd), s[A_TSTRIDE * A_BS];
    for (int h = 0; h < f->nh; h++) {
        int kvh = h / g;
        const float *qv = f->q + (size_t)t * f->qd + (size_t)h * hd;
        double mx = -INFINITY, sum = 0;
        for (int p = 0; p < npos; p++) {
            const float *K = poolf + (size_t)table[p / A_BS] * (size_t)f->be +
                             ((size_t)layer * 2 * nkv + kvh) * (size_t)f->he +
                             (size_t)(p % A_BS) * hd;
            double d = 0;
            for (int i = 0; i < hd; i++) d += (double)qv[i] * K[i];
            s[p] = d * scale;
            mx = fmax(mx, s[p]);
        }
        double acc[ATTN_MAX_DIM] = {0};
        for (int p = 0; p < npos; p++) {
            const float *V = poolf + (size_t)table[p / A_BS] * (size_t)f->be +
                             (((size_t)layer * 2 + 1) * nkv + kvh) * (size_t)f->he +
                             (size_t)(p % A_BS) * hd;
            double e = exp(s[p] - mx);
            sum += e;
            for (int i = 0; i < hd; i++) acc[i] += e * V[i];
        }
        for (int i = 0; i < hd; i++) out[h * hd + i] = (float)(acc[i] / sum);
    }
}

static void check_attn_f16(attn_fx *f, const char *tag) {
    char chk[64], why[400] = "";
    snprintf(chk, sizeof chk, "attn[%s]", tag);
    float *ref = xmalloc(sizeof(float) * f->qd);
    double worst = 0;
    int wt = 0, wl = 0, nonfinite = 0;
    for (int l = 0; l < A_LAYERS; l++) {
        f->out[l] = xmalloc(sizeof(float) * (size_t)f->T * f->qd);
        if (attn_launch(f, &f->kv, &f->L, f->stage, f->stage_d, f->q_d, f->out_d, 0, f->T, l, f->out[l],
                        why, sizeof why) < 0) {
            report(0, chk, "layer %d: %s", l, why);
            free(ref);
            return;
        }
        for (int t = 0; t < f->T; t++) {
            const float *got = f->out[l] + (size_t)t * f->qd;
            attn_ref_f16(f, t, l, ref);
            nonfinite += !all_finite(got, (size_t)f->qd);
            for (int i = 0; i < f->qd; i++) {
                double e = fabs((double)got[i] - ref[i]);
                if (!(e <= worst)) worst = e, wt = t, wl = l;
            }
        }
    }
    report(worst <= 2e-3 && !nonfinite, chk,
           "%d tokens (%d decode, %d prefill runs, up to %d positions), %d tiles of <= %d tokens, "
           "2 layers: max |err| %.3g (tol 2e-3) at token %d (pos %d) layer %d; %d rows non-finite",
           f->T, f->n_decode, f->n_prefill, f->ac.max_len, f->n_tiles, f->geom.qt, worst, wt,
           f->pos[wt], wl, nonfinite);
    free(ref);
}

/* Every token packed alone must give the row it gave in the full batch, bit for bit. */
static void check_attn_invariance(attn_fx *f, const char *tag) {
    char chk[64], why[400] = "";
    snprintf(chk, sizeof chk, "attn_batch_invariance[%s]", tag);
    cplan_layout L1;
    cplan_layout_init(&L1, 1, 1, A_TSTRIDE);
    int32_t *st1 = xmalloc(L1.total * sizeof(int32_t));
    float *row = xmalloc(sizeof(float) * f->qd);
    CUdeviceptr sd = dalloc(L1.total * 4), q1 = dalloc(sizeof(float) * f->qd);
    CUdeviceptr o1 = dalloc(sizeof(float) * f->qd);
    int layer = A_LAYERS - 1, bad = 0, t = 0;
    char first[160] = "";
    for (; t < f->T && sd && q1 && o1; t++) {
        if (!dput(q1, f->q + (size_t)t * f->qd, sizeof(float) * f->qd) ||
            attn_launch(f, &f->kv, &L1, st1, sd, q1, o1, t, 1, layer, row, why, sizeof why) < 0)
            break;
        const float *full = f->out[layer] + (size_t)t * f->qd;
        if (memcmp(row, full, sizeof(float) * f->qd) && !bad++) {
            double mx = 0;
            for (int i = 0; i < f->qd; i++) mx = fmax(mx, fabs((double)row[i] - full[i]));
            snprintf(first, sizeof first, "token %d (pos %d): max |alone - batched| %.3g", t,
                     f->pos[t], mx);
        }
    }
    if (t < f->T)
        report(0, chk, "token %d: %s", t, why[0] ? why : g_cuerr);
    else if (bad)
        report(0, chk, "%d of %d tokens differ alone vs in the batch; first %s", bad, f->T, first);
    else
        report(1, chk, "all %d tokens bit-identical packed alone and in the %d-token batch", f->T,
               f->T);
    free(st1), free(row);
}

/* fp8: kern_kv_to_fp8 on the even blocks, read back and decoded on the host; then
 * attention over the mix of fp8 and f16 blocks. */
typedef struct {
    int n_slabs, n_conv;
    int32_t conv[A_BLOCKS];
    uint8_t flags[A_BLOCKS], got_flags[A_BLOCKS]; /* expected; as the kernel left them */
    float *scale;  /* [A_BLOCKS][n_slabs] from the device */
    float *poolf;  /* [A_BLOCKS][be] the values attention should see */
    CUdeviceptr flags_d, scale_d;
} fp8_fx;

/* Scale absmax/448 (1 for an all-zero slab, which must stay finite); each value within
 * e4m3's rounding: y = x/scale has |y| <= 448; e4m3 keeps 3 mantissa bits, so a normal
 * y (|y| >= 2^-6) is off by at most 2^-4 |y|, a subnormal one by half the 2^-9 spacing;
 * back in x units |err| <= |x|/16 + scale * 2^-10 (plus f32 rounding: 1e-4 slack). */
static void check_fp8_convert(attn_fx *f, fp8_fx *e, const uint16_t *after, const char *tag) {
    char chk[64];
    snprintf(chk, sizeof chk, "fp8_convert[%s]", tag);
    long untouched_bad = 0, scale_bad = 0, val_bad = 0, flag_bad = 0;
    double worst = 0;
    char first[200] = "";
    for (int b = 0; b < A_BLOCKS; b++) {
        flag_bad += e->got_flags[b] != e->flags[b]; /* the kernel flags what it converted */
        const uint16_t *orig = f->pool + (size_t)b * f->be, *now = after + (size_t)b * f->be;
        float *pf = e->poolf + (size_t)b * f->be;
        if (!e->flags[b]) {
            untouched_bad += memcmp(orig, now, (size_t)f->be * 2) != 0;
            for (long long i = 0; i < f->be; i++) pf[i] = quant_f16_to_f32(orig[i]);
            continue;
        }
        const uint8_t *b8 = (const uint8_t *)now;
        for (int sl = 0; sl < e->n_slabs; sl++) {
            float mx = 0, sc = e->scale[b * e->n_slabs + sl];
            for (long long i = 0; i < f->he; i++)
                mx = fmaxf(mx, fabsf(quant_f16_to_f32(orig[sl * f->he + i])));
            float want_sc = mx > 0 ? mx / 448.0f : 1.0f;
            if (sc != want_sc && !scale_bad++ && !first[0])
                snprintf(first, sizeof first, "block %d slab %d: scale %.9g, want %.9g", b, sl, sc,
                         want_sc);
            for (long long i = 0; i < f->he; i++) {
                float x = quant_f16_to_f32(orig[sl * f->he + i]);
                float y = e4m3_to_f32(b8[sl * f->he + i]) * sc;
                pf[sl * f->he + i] = y;
                double bound = (fabs(x) / 16 + ldexp(sc, -10)) * 1.0001;
                double r = fabs((double)y - x) / bound;
                if (!(r <= 1.0) && !val_bad++ && !first[0])
                    snprintf(first, sizeof first, "block %d slab %d elem %lld: %.6g decoded as %.6g", b,
                             sl, i, x, y);
                if (r > worst || r != r) worst = r;
            }
        }
    }
    report(!untouched_bad && !scale_bad && !val_bad && !flag_bad, chk,
           "%d blocks x %d slabs: worst error %.3g of the e4m3 bound |x|/16 + scale*2^-10; %ld "
           "scales wrong, %ld values out of bound, %ld other blocks changed, %ld fp8 flags wrong%s%s",
           e->n_conv, e->n_slabs, worst, scale_bad, val_bad, untouched_bad, flag_bad,
           first[0] ? "; first: " : "", first);
}

/* The fp8 checks in order; a stage that cannot run fails itself and the ones after it. */
static const char *FP8_CHECKS[] = {"fp8_flags_off", "fp8_convert", "fp8_attn", "fp8_vs_f16",
                                   "fp8_units", "fp8_expand"};
#define N_FP8_CHECKS (int)(sizeof FP8_CHECKS / sizeof FP8_CHECKS[0])

static void fp8_not_run(int from, const char *tag, const char *why) {
    for (int i = from; i < N_FP8_CHECKS; i++) {
        char chk[64];
        snprintf(chk, sizeof chk, "%s[%s]", FP8_CHECKS[i], tag);
        report(0, chk, i == from ? "%s" : "not run: %s", why);
    }
}

/* A kv8 pool's layout (mm/kv.h's units; core/backend_cuda.c): an fp8 block takes half a
 * slot and compaction moves it, so it may start at a slot's second unit. Each converted
 * block's fp8 half goes to its slot's second unit with its flag and scales, the first
 * unit is spoilt (0xff bytes, a stale flag, NaN scales): attention through the units
 * must give check_fp8's fp8 output bit for bit. Then kern_kv_expand of one such block
 * into another slot: f16 of its decoded values, exactly, and the slot flagged f16. */
static void check_fp8_units(attn_fx *f, const fp8_fx *e, const uint16_t *after, const float *out8,
                            const char *tag) {
    char chk[64], why[400] = "";
    int nu = 2 * A_BLOCKS, ns = e->n_slabs;
    size_t ue = (size_t)f->be / 2, pool_n = (size_t)A_BLOCKS * (size_t)f->be;
    size_t ob = sizeof(float) * (size_t)f->T * f->qd;
    uint16_t *up = xmalloc(pool_n * 2), *got = xmalloc((size_t)f->be * 2);
    uint8_t *uflags = xmalloc((size_t)nu), flag2 = 9;
    float *uscale = xmalloc(sizeof(float) * (size_t)nu * ns), *out = xmalloc(ob);
    int32_t loc[A_BLOCKS];
    memcpy(up, after, pool_n * 2);
    for (int b = 0; b < A_BLOCKS; b++) {
        int q8 = e->flags[b];
        loc[b] = 2 * b + q8;
        uflags[2 * b] = 1, uflags[2 * b + 1] = 1; /* stale unless the block starts there */
        uflags[loc[b]] = (uint8_t)q8;
        for (int k = 0; k < ns; k++) {
            uscale[(size_t)(2 * b) * ns + k] = NAN, uscale[(size_t)(2 * b + 1) * ns + k] = NAN;
            uscale[(size_t)loc[b] * ns + k] = e->scale[b * ns + k];
        }
        if (q8) {
            memcpy(up + (size_t)(2 * b + 1) * ue, up + (size_t)(2 * b) * ue, ue * 2);
            memset(up + (size_t)(2 * b) * ue, 0xff, ue * 2);
        }
    }
    CUdeviceptr flags_d = dalloc((size_t)nu), scale_d = dalloc(sizeof(float) * (size_t)nu * ns);
    kern_kv kvu = f->kv;
    kvu.fp8 = flags_d, kvu.scale = scale_d, kvu.unit_elems = (long long)ue;
    snprintf(chk, sizeof chk, "fp8_units[%s]", tag);
    if (!flags_d || !scale_d || !dput(flags_d, uflags, (size_t)nu) ||
        !dput(scale_d, uscale, sizeof(float) * (size_t)nu * ns) || !dput(f->pool_d, up, pool_n * 2)) {
        fp8_not_run(4, tag, g_cuerr);
        goto out;
    }
    f->loc = loc;
    int diff_l = -1;
    for (int l = 0; l < A_LAYERS && diff_l < 0; l++) {
        int r = attn_launch(f, &kvu, &f->L, f->stage, f->stage_d, f->q_d, f->out_d, 0, f->T, l, out,
                            why, sizeof why);
        if (r < 0) {
            f->loc = NULL;
            fp8_not_run(4, tag, why);
            goto out;
        }
        if (memcmp(out, out8 + (size_t)l * f->T * f->qd, ob)) diff_l = l;
    }
    f->loc = NULL;
    report(diff_l < 0, chk, "%d fp8 blocks read from second halves, first halves spoilt: output %s",
           e->n_conv, diff_l < 0 ? "bit-identical to the block-addressed run" : "DIFFERS");
    /* expand block 0 (fp8, at unit 1) into block 1's slot (units 2 and 3) */
    snprintf(chk, sizeof chk, "fp8_expand[%s]", tag);
    uint8_t stale = 1;
    if (!dput(flags_d + 2, &stale, 1) || !ran(kern_kv_expand(&G.k, G.st, &kvu, 2, loc[0]), "kern_kv_expand") ||
        !dget(got, f->pool_d + 2 * ue * 2, (size_t)f->be * 2) || !dget(&flag2, flags_d + 2, 1)) {
        fp8_not_run(5, tag, g_cuerr);
        goto out;
    }
    long bad = 0;
    for (long long i = 0; i < f->be; i++) bad += got[i] != quant_f32_to_f16(e->poolf[i]);
    report(!bad && flag2 == 0, chk,
           "fp8 block to f16 in another slot: %ld of %lld values differ from f16 of the decoded "
           "values; the slot's flag %d (want 0)", bad, f->be, flag2);
out:
    free(up), free(got), free(uflags), free(uscale), free(out);
}

static void check_fp8(attn_fx *f, const char *tag) {
    char chk[64], why[400] = "";
    fp8_fx e;
    memset(&e, 0, sizeof e);
    e.n_slabs = A_LAYERS * 2 * f->ac.nkv;
    size_t pool_n = (size_t)A_BLOCKS * (size_t)f->be, ob = sizeof(float) * (size_t)f->T * f->qd;
    float *scale0 = xmalloc(sizeof(float) * A_BLOCKS * e.n_slabs);
    e.scale = xmalloc(sizeof(float) * A_BLOCKS * e.n_slabs);
    e.poolf = xmalloc(sizeof(float) * pool_n);
    uint16_t *after = xmalloc(pool_n * 2);
    float *out = xmalloc(ob), *ref = xmalloc(sizeof(float) * f->qd), *out8 = xmalloc(ob * A_LAYERS);
    CUdeviceptr blocks_d = dalloc(sizeof e.conv);
    e.flags_d = dalloc(A_BLOCKS), e.scale_d = dalloc(sizeof(float) * A_BLOCKS * e.n_slabs);
    kern_kv kv8 = f->kv;
    kv8.fp8 = e.flags_d, kv8.scale = e.scale_d;
    /* 1. flags present but all 0: the f16 path, bit for bit */
    snprintf(chk, sizeof chk, "fp8_flags_off[%s]", tag);
    if (!blocks_d || !e.flags_d || !e.scale_d || !dput(e.flags_d, e.flags, A_BLOCKS) ||
        !dput(e.scale_d, scale0, sizeof(float) * A_BLOCKS * e.n_slabs) ||
        attn_launch(f, &kv8, &f->L, f->stage, f->stage_d, f->q_d, f->out_d, 0, f->T, 1, out, why,
                    sizeof why) < 0) {
        fp8_not_run(0, tag, why[0] ? why : g_cuerr);
        goto out;
    }
    report(memcmp(out, f->out[1], ob) == 0, chk, "flags array of zeros: output %s the f16 run's",
           memcmp(out, f->out[1], ob) ? "DIFFERS from" : "bit-identical to");
    /* 2. convert the even blocks */
    snprintf(chk, sizeof chk, "fp8_convert[%s]", tag);
    for (int b = 0; b < A_BLOCKS; b += 2) e.conv[e.n_conv++] = b, e.flags[b] = 1;
    if (!dput(blocks_d, e.conv, sizeof e.conv) ||
        !ran(kern_kv_to_fp8(&G.k, G.st, &kv8, blocks_d, 0, e.n_conv), "kern_kv_to_fp8") ||
        !dget(e.got_flags, e.flags_d, A_BLOCKS) || !dput(e.flags_d, e.flags, A_BLOCKS) ||
        !dget(after, f->pool_d, pool_n * 2) ||
        !dget(e.scale, e.scale_d, sizeof(float) * A_BLOCKS * e.n_slabs)) {
        fp8_not_run(1, tag, g_cuerr);
        goto restore;
    }
    check_fp8_convert(f, &e, after, tag);
    /* 3. attention over the mix vs the double reference on the decoded values, and how
     * far fp8 moves the output from the all-f16 run (the 8-bit KV accuracy) */
    snprintf(chk, sizeof chk, "fp8_attn[%s]", tag);
    double worst = 0, vs16 = 0, sum16 = 0, outmax = 0;
    int wt = 0, wl = 0;
    for (int l = 0; l < A_LAYERS; l++) {
        if (attn_launch(f, &kv8, &f->L, f->stage, f->stage_d, f->q_d, f->out_d, 0, f->T, l, out, why,
                        sizeof why) < 0) {
            fp8_not_run(2, tag, why);
            goto restore;
        }
        memcpy(out8 + (size_t)l * f->T * f->qd, out, ob);
        for (int t = 0; t < f->T; t++) {
            attn_ref_float(f, e.poolf, t, l, ref);
            for (int i = 0; i < f->qd; i++) {
                size_t k = (size_t)t * f->qd + i;
                double err = fabs((double)out[k] - ref[i]), d16 = fabs((double)out[k] - f->out[l][k]);
                if (!(err <= worst)) worst = err, wt = t, wl = l;
                vs16 = fmax(vs16, d16), sum16 += d16, outmax = fmax(outmax, fabs(f->out[l][k]));
            }
        }
    }
    report(worst <= 2e-3, chk,
           "%d of %d blocks fp8, %d tokens, 2 layers: max |err| vs the reference on the decoded "
           "values %.3g (tol 2e-3) at token %d layer %d",
           e.n_conv, A_BLOCKS, f->T, worst, wt, wl);
    snprintf(chk, sizeof chk, "fp8_vs_f16[%s]", tag);
    report(isfinite(vs16), chk,
           "8-bit KV accuracy at the kernel: max |fp8 - f16 output| %.3g (%.2f%% of max |out| %.3g), "
           "mean %.3g",
           vs16, outmax > 0 ? 100 * vs16 / outmax : 0.0, outmax, sum16 / (double)(A_LAYERS * ob / 4));
    check_fp8_units(f, &e, after, out8, tag);
restore:
    dput(f->pool_d, f->pool, pool_n * 2); /* back to f16 for whatever follows */
out:
    free(scale0), free(e.scale), free(e.poolf), free(after), free(out), free(out8), free(ref);
}

/* A slab holding +inf, -inf and NaN (a KV that overflowed f16) through kern_kv_to_fp8
 * alone: as mm/kv8.c's int8, its absmax is capped at 65504 so the scale stays finite,
 * the infinities saturate to +-448 (e4m3 0x7e, 0xfe) and the NaN becomes 0; its other
 * values and the block's other slabs convert as usual. */
static void check_fp8_nonfinite(const attn_fx *f, const char *tag) {
    char chk[64], first[160] = "";
    snprintf(chk, sizeof chk, "fp8_nonfinite[%s]", tag);
    int n_slabs = A_LAYERS * 2 * f->ac.nkv;
    long long he = f->he, be = f->be;
    uint16_t *blk = xmalloc((size_t)be * 2), *back = xmalloc((size_t)be * 2);
    float *sc = xmalloc(sizeof(float) * (size_t)n_slabs);
    memcpy(blk, f->pool, (size_t)be * 2); /* block 0's random values */
    blk[0] = 0x7c00, blk[1] = 0xfc00, blk[2] = 0x7e00;
    kern_kv kv = f->kv;
    kv.unit_elems = be;
    kv.data = dalloc((size_t)be * 2), kv.fp8 = dalloc(1), kv.scale = dalloc(sizeof(float) * (size_t)n_slabs);
    uint8_t flag = 0;
    if (!kv.data || !kv.fp8 || !kv.scale || !dput(kv.data, blk, (size_t)be * 2) ||
        !dput(kv.fp8, &flag, 1) || !ran(kern_kv_to_fp8(&G.k, G.st, &kv, 0, 0, 1), "kern_kv_to_fp8") ||
        !dget(back, kv.data, (size_t)be * 2) || !dget(sc, kv.scale, sizeof(float) * (size_t)n_slabs) ||
        !dget(&flag, kv.fp8, 1)) {
        report(0, chk, "not run: %s", g_cuerr);
        goto out;
    }
    const uint8_t *b8 = (const uint8_t *)back;
    long bad = 0;
    for (int sl = 0; sl < n_slabs; sl++) {
        float mx = 0;
        for (long long i = 0; i < he; i++)
            mx = fmaxf(mx, fminf(fabsf(quant_f16_to_f32(blk[sl * he + i])), 65504.0f));
        float want = mx > 0 ? mx / 448.0f : 1.0f;
        if (sc[sl] != want && !bad++)
            snprintf(first, sizeof first, "slab %d: scale %.9g, want %.9g", sl, sc[sl], want);
        for (long long i = sl ? 0 : 3; i < he; i++) {
            float x = quant_f16_to_f32(blk[sl * he + i]), y = e4m3_to_f32(b8[sl * he + i]) * sc[sl];
            if (!(fabs((double)y - x) <= (fabs(x) / 16 + ldexp(sc[sl], -10)) * 1.0001) && !bad++)
                snprintf(first, sizeof first, "slab %d elem %lld: %.6g decoded as %.6g", sl, i, x, y);
        }
    }
    report(!bad && b8[0] == 0x7e && b8[1] == 0xfe && b8[2] == 0 && flag == 1, chk,
           "+inf, -inf, NaN as e4m3 %02x %02x %02x (want 7e fe 00), their slab's scale %.9g "
           "(want 65504/448 = %.9g), %ld other values or scales wrong, flag %d (want 1)%s%s",
           b8[0], b8[1], b8[2], sc[0], 65504.0f / 448.0f, bad, flag, first[0] ? "; first: " : "",
           first);
out:
    free(blk), free(back), free(sc);
}

/* Every fp8 check of the attn group, when its fixture could not be set up. */
static void fp8_all_not_run(const char *tag, const char *why) {
    char chk[64];
    fp8_not_run(0, tag, why);
    snprintf(chk, sizeof chk, "fp8_nonfinite[%s]", tag);
    report(0, chk, "%s", why);
}

static void group_attn(const opts *o) {
    (void)o;
    if (gpu_open("attn") < 0) return;
    for (size_t i = 0; i < sizeof ATTN / sizeof ATTN[0]; i++) {
        char tag[32], why[400] = "";
        snprintf(tag, sizeof tag, "hd=%d g=%d", ATTN[i].hd, ATTN[i].g);
        rng_seed(0xa7 + i);
        attn_fx f;
        if (attn_setup(&f, &ATTN[i], why, sizeof why) < 0) {
            char chk[64];
            snprintf(chk, sizeof chk, "attn[%s]", tag);
            report(0, chk, "setup: %s", why);
            snprintf(chk, sizeof chk, "attn_batch_invariance[%s]", tag);
            report(0, chk, "not run: setup failed");
            if (i == 0) fp8_all_not_run(tag, "not run: setup failed");
        } else {
            check_attn_f16(&f, tag);
            if (f.out[A_LAYERS - 1]) {
                check_attn_invariance(&f, tag);
                if (i == 0) check_fp8(&f, tag), check_fp8_nonfinite(&f, tag);
            } else {
                char chk[64];
                snprintf(chk, sizeof chk, "attn_batch_invariance[%s]", tag);
                report(0, chk, "not run: the batch launch failed");
                if (i == 0) fp8_all_not_run(tag, "not run: the batch launch failed");
            }
        }
        attn_free(&f);
        dfree_all();
    }
    gpu_close();
}

/* ================================================================ the model: engines */

#define N_GEN 32      /* greedy tokens per prompt */
#define MAX_STEP 512  /* tokens per step */
#define MAX_LOGITS 64 /* logit rows per step */
#define CTX 2048
#define BLOCK 16

/* tests/parity_prompts.h's seven, and an eighth for the batch group. */
static const parity_prompt STORY = {"story", "Once upon a time, in a small village by the sea, there lived", 0};
#define N_PARITY N_PARITY_PROMPTS
#define N_ALL (N_PARITY_PROMPTS + 1)
static const parity_prompt *prompt_at(int i) { return i < N_PARITY ? &PARITY_PROMPTS[i] : &STORY; }

typedef struct {
    int n;
    int32_t ids[1024];
} prompt_ids;

/* Token ids as `kilnd tokenize --special` gives them (no BOS), the chat prompts in
 * ChatML with SmolLM2's system message, exactly as ref_llama.chatml writes it. */
static int encode_prompt(const tok_t *tok, const parity_prompt *p, prompt_ids *out) {
    char buf[2048];
    int n = parity_text(p, buf, sizeof buf);
    int cap = (int)(sizeof out->ids / sizeof out->ids[0]);
    out->n = n < 0 ? -1 : tok_encode(tok, buf, (size_t)n, 1, out->ids, cap);
    return out->n > 0 ? 0 : -1;
}

/* A backend with its KV pool. */
typedef struct {
    backend *be;
    kv_pool kv;
    int kv_ok, n_vocab;
    char what[64];
} engine;

static void engine_close(engine *e) {
    if (e->be) e->be->ops->destroy(e->be);
    if (e->kv_ok) kv_pool_free(&e->kv);
    e->be = NULL, e->kv_ok = 0;
}

static void kv_shape(const model *m, kv_config *kc, int n_blocks, int max_seqs) {
    memset(kc, 0, sizeof *kc);
    model_kv_shape(m, kc);
    kc->block_size = BLOCK, kc->max_blocks_per_seq = CTX / BLOCK;
    kc->n_blocks = n_blocks, kc->max_seqs = max_seqs;
}

static int engine_cpu(engine *e, const model *m, int exact, char *err, size_t n) {
    memset(e, 0, sizeof *e);
    snprintf(e->what, sizeof e->what, "cpu%s", exact ? " exact" : "");
    e->n_vocab = m->cfg.n_vocab;
    kv_config kc;
    kv_shape(m, &kc, 2 * CTX / BLOCK, 8);
    int r = kv_pool_init(&e->kv, &kc, NULL);
    if (r < 0) {
        snprintf(err, n, "kv_pool_init: %s", strerror(-r));
        return -1;
    }
    e->kv_ok = 1;
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);
    backend_cpu_config bc = {nproc > 0 ? (int)nproc : 1, MAX_STEP, MAX_LOGITS, CTX, exact};
    e->be = backend_cpu_new(m, &e->kv, &bc, err, n);
    if (!e->be) engine_close(e);
    return e->be ? 0 : -1;
}

/* kv8_blocks 0: an f16 pool of 256 MiB; else a kv8 pool (fp8 halves, mm's units) of that
 * many blocks. */
static int engine_cuda(engine *e, const model *m, int graphs, int cublas, int kv8_blocks, char *err,
                       size_t n) {
    memset(e, 0, sizeof *e);
    snprintf(e->what, sizeof e->what, "cuda graphs=%d cublas=%d%s", graphs, cublas, kv8_blocks ? " kv8" : "");
    e->n_vocab = m->cfg.n_vocab;
    kv_config kc;
    kv_shape(m, &kc, 0, 64);
    kc.kv8 = kv8_blocks > 0;
    kc.n_blocks = 1; /* for kv_block_bytes */
    size_t pool = kv8_blocks ? (size_t)kv8_blocks * kv_block_bytes(&kc) : 256u << 20;
    backend_cuda_config cc = {0, 0.9, MAX_STEP, MAX_LOGITS, CTX, cublas, 16, graphs, pool};
    e->be = backend_cuda_new(m, &e->kv, &kc, &cc, err, n);
    if (!e->be) return -1;
    e->kv_ok = 1;
    char d[256];
    backend_cuda_describe(e->be, d, sizeof d);
    info("%s: %s", e->what, d);
    return 0;
}

/* One step's batch, built by appending runs. */
typedef struct {
    int n, n_logits, overflow;
    int32_t tok[MAX_STEP], pos[MAX_STEP], rows[MAX_LOGITS];
    kv_seq *seq[MAX_STEP];
} step_t;

static void step_clear(step_t *s) { s->n = s->n_logits = s->overflow = 0; }

static void step_add(step_t *s, kv_seq *q, const int32_t *toks, int n, int pos0, int logit) {
    if (s->n + n > MAX_STEP || s->n_logits + !!logit > MAX_LOGITS) {
        s->overflow = 1;
        return;
    }
    for (int i = 0; i < n; i++) {
        s->tok[s->n] = toks[i], s->pos[s->n] = pos0 + i, s->seq[s->n] = q;
        s->n++;
    }
    if (logit) s->rows[s->n_logits++] = s->n - 1;
}

/* Reserves and privatizes each position's block (the model_batch contract), runs the
 * step, advances the sequences. The logits rows, or NULL with err set. */
static const float *step_run(engine *e, step_t *s, char *err, size_t n) {
    if (s->overflow) {
        snprintf(err, n, "%s: a step past %d tokens or %d logit rows", e->what, MAX_STEP, MAX_LOGITS);
        return NULL;
    }
    for (int t = 0; t < s->n; t++) {
        int r = kv_seq_reserve(&e->kv, s->seq[t], s->pos[t] + 1);
        if (r == 0) r = kv_seq_cow(&e->kv, s->seq[t], s->pos[t]);
        if (r < 0) {
            snprintf(err, n, "%s: KV for position %d: %s", e->what, s->pos[t], strerror(-r));
            return NULL;
        }
    }
    model_batch b = {s->n, s->tok, s->pos, s->seq, s->n_logits, s->rows};
    if (backend_run(e->be, &b) < 0) {
        snprintf(err, n, "%s: step of %d tokens: %s", e->what, s->n, e->be->err);
        return NULL;
    }
    for (int t = 0; t < s->n; t++)
        if (s->seq[t]->n_tokens < s->pos[t] + 1) s->seq[t]->n_tokens = s->pos[t] + 1;
    const float *lg = e->be->ops->logits(e->be);
    if (!lg) snprintf(err, n, "%s: no logits", e->what);
    return lg;
}

/* A greedy run: step 0 is the whole prompt, then one token per step; logits[i] is the
 * row gen[i] was picked from. */
typedef struct {
    int ok;
    char err[640];
    int32_t gen[N_GEN];
    float *logits; /* [N_GEN][n_vocab] */
} run_out;

static void greedy(engine *e, const prompt_ids *p, int n_gen, run_out *o) {
    static step_t st;
    size_t nv = (size_t)e->n_vocab;
    memset(o, 0, sizeof *o);
    o->logits = xmalloc(sizeof(float) * nv * (size_t)n_gen);
    kv_seq *s = kv_seq_new(&e->kv);
    if (!s) {
        snprintf(o->err, sizeof o->err, "%s: no free page table", e->what);
        return;
    }
    step_clear(&st);
    step_add(&st, s, p->ids, p->n, 0, 1);
    for (int i = 0; i < n_gen; i++) {
        const float *lg = step_run(e, &st, o->err, sizeof o->err);
        if (!lg) goto out;
        memcpy(o->logits + (size_t)i * nv, lg, sizeof(float) * nv);
        o->gen[i] = argmax_first(lg, (int)nv);
        step_clear(&st);
        step_add(&st, s, &o->gen[i], 1, p->n + i, 1);
    }
    o->ok = 1;
out:
    kv_seq_release(&e->kv, s);
}

typedef struct {
    model m;
    tok_t tok;
    int m_ok, tok_ok, nv;
    prompt_ids ids[N_ALL];
} model_fx;

static void model_close(model_fx *f) {
    if (f->tok_ok) tok_free(&f->tok);
    if (f->m_ok) model_free(&f->m);
}

/* A model group's start: no device ends the group (NODEV); the model, its tokenizer and
 * the prompts, or the group fails with nothing left open. */
static int model_open(model_fx *f, const opts *o, const char *group) {
    char err[512];
    if (!cu_load(err, sizeof err)) no_device("%s", err);
    memset(f, 0, sizeof *f);
    if (model_load(&f->m, o->model, err, sizeof err) < 0) {
        report(0, group, "model_load %s: %s", o->model, err);
        return -1;
    }
    f->m_ok = 1;
    f->nv = f->m.cfg.n_vocab;
    if (tok_init_gguf(&f->tok, &f->m.gguf, err, sizeof err) < 0) {
        report(0, group, "tokenizer: %s", err);
        model_close(f);
        return -1;
    }
    f->tok_ok = 1;
    for (int i = 0; i < N_ALL; i++)
        if (encode_prompt(&f->tok, prompt_at(i), &f->ids[i]) < 0) {
            report(0, group, "tokenizing prompt %s failed", prompt_at(i)->name);
            model_close(f);
            return -1;
        }
    info("model %s: %d layers, d_model %d, %d heads / %d KV heads of %d, vocab %d", o->model,
         f->m.cfg.n_layers, f->m.cfg.d_model, f->m.cfg.n_heads, f->m.cfg.n_kv_heads, f->m.cfg.head_dim,
         f->nv);
    return 0;
}


/* ================================================================ group model */

enum { R_CPU, R_EXACT, R_G1, R_G0, R_BLAS, N_RUNS };
static const char *RUN_NAME[N_RUNS] = {"cpu", "cpu exact", "cuda graphs=1", "cuda graphs=0",
                                       "cuda cublas=1"};

/* Runs every parity prompt through one engine configuration. */
static void run_all(model_fx *f, int which, run_out out[N_PARITY]) {
    char err[512] = "";
    engine e;
    int r = which == R_CPU || which == R_EXACT
                ? engine_cpu(&e, &f->m, which == R_EXACT, err, sizeof err)
                : engine_cuda(&e, &f->m, which != R_G0, which == R_BLAS, 0, err, sizeof err);
    for (int i = 0; i < N_PARITY; i++) {
        if (r < 0) {
            memset(&out[i], 0, sizeof out[i]);
            snprintf(out[i].err, sizeof out[i].err, "%s backend: %s", RUN_NAME[which], err);
            continue;
        }
        greedy(&e, &f->ids[i], N_GEN, &out[i]);
    }
    if (r == 0) engine_close(&e);
}

static int common_prefix(const int32_t *a, const int32_t *b, int n) {
    int k = 0;
    while (k < n && a[k] == b[k]) k++;
    return k;
}

/* max |a - b| / (max a - min a); also the same with the mean difference removed. */
static double logit_rel(const float *a, const float *b, int n, double *shifted) {
    double lo = INFINITY, hi = -INFINITY, mx = 0, mean = 0, mxc = 0;
    for (int i = 0; i < n; i++) lo = fmin(lo, a[i]), hi = fmax(hi, a[i]), mean += (double)b[i] - a[i];
    mean /= n;
    for (int i = 0; i < n; i++) {
        double d = (double)b[i] - a[i];
        mx = fmax(mx, fabs(d)), mxc = fmax(mxc, fabs(d - mean));
    }
    double range = hi - lo > 0 ? hi - lo : 1;
    *shifted = mxc / range;
    return mx / range;
}

/* Greedy tokens, CUDA vs CPU. Agreement with the fast CPU (8-bit activations) is
 * reported; the verdict is against the exact CPU (f32 activations, like the GPU): every
 * divergence must be a near tie there, the GPU's token within NEAR_TIE of its top-1. */
#define NEAR_TIE 0.05
static void check_greedy(const model_fx *f, int i, run_out r[N_RUNS][N_PARITY]) {
    char chk[64], cpu_part[200] = "";
    snprintf(chk, sizeof chk, "greedy[%s]", prompt_at(i)->name);
    const run_out *g = &r[R_G1][i], *c = &r[R_CPU][i], *x = &r[R_EXACT][i];
    if (!g->ok || !c->ok || !x->ok) {
        report(0, chk, "%s", !g->ok ? g->err : !c->ok ? c->err : x->err);
        return;
    }
    size_t nv = (size_t)f->nv;
    int mc = common_prefix(g->gen, c->gen, N_GEN), mx = common_prefix(g->gen, x->gen, N_GEN);
    if (mc < N_GEN)
        snprintf(cpu_part, sizeof cpu_part,
                 " (first difference at step %d: cpu %d, cuda %d; cpu top-2 gap there %.3g)", mc,
                 c->gen[mc], g->gen[mc], (double)top2_gap(c->logits + mc * nv, (int)nv));
    if (mc == N_GEN || mx == N_GEN) {
        report(1, chk, "%d prompt tokens: cuda = cpu %d/%d%s; cuda = exact cpu %d/%d", f->ids[i].n, mc,
               N_GEN, cpu_part, mx, N_GEN);
        return;
    }
    const float *L = x->logits + (size_t)mx * nv;
    double below = (double)L[x->gen[mx]] - L[g->gen[mx]];
    report(below <= NEAR_TIE, chk,
           "%d prompt tokens: cuda = cpu %d/%d%s; cuda = exact cpu %d/%d: at step %d cuda picked %d, "
           "exact cpu %d, %.4g above it in the exact logits (top-2 gap %.4g): %s",
           f->ids[i].n, mc, N_GEN, cpu_part, mx, N_GEN, mx, g->gen[mx], x->gen[mx], below,
           (double)top2_gap(L, (int)nv),
           below <= NEAR_TIE ? "a near tie (<= 0.05)" : "NOT a near tie (> 0.05)");
}

/* The logits at the last prompt position: within 2% of the exact CPU's range. */
static void check_logits(const model_fx *f, int i, run_out r[N_RUNS][N_PARITY]) {
    char chk[64];
    snprintf(chk, sizeof chk, "logits[%s]", prompt_at(i)->name);
    const run_out *g = &r[R_G1][i], *c = &r[R_CPU][i], *x = &r[R_EXACT][i];
    if (!g->ok || !c->ok || !x->ok) {
        report(0, chk, "%s", !g->ok ? g->err : !c->ok ? c->err : x->err);
        return;
    }
    double sx, sc, dx = logit_rel(x->logits, g->logits, f->nv, &sx);
    double dc = logit_rel(c->logits, g->logits, f->nv, &sc);
    int fin = all_finite(g->logits, (size_t)f->nv);
    report(fin && dx <= 0.02, chk,
           "last prompt position: max |cuda - exact cpu| = %.3f%% of the logit range (tol 2%%; "
           "%.3f%% shift removed); vs the 8-bit cpu %.3f%% (%.3f%% shift removed)%s",
           100 * dx, 100 * sx, 100 * dc, 100 * sc, fin ? "" : "; NON-FINITE logits");
}

/* graphs=0 must replay exactly what graphs=1 computes. */
static void check_graphs(const model_fx *f, int i, run_out r[N_RUNS][N_PARITY]) {
    char chk[64];
    snprintf(chk, sizeof chk, "graphs_off_identical[%s]", prompt_at(i)->name);
    const run_out *a = &r[R_G1][i], *b = &r[R_G0][i];
    if (!a->ok || !b->ok) {
        report(0, chk, "%s", !a->ok ? a->err : b->err);
        return;
    }
    size_t nv = (size_t)f->nv;
    for (int s = 0; s < N_GEN; s++)
        if (memcmp(a->logits + s * nv, b->logits + s * nv, nv * sizeof(float))) {
            double mx = 0;
            for (size_t k = 0; k < nv; k++)
                mx = fmax(mx, fabs((double)a->logits[s * nv + k] - b->logits[s * nv + k]));
            report(0, chk, "step %d: logits differ, max |graphs=1 - graphs=0| %.3g (tokens %d vs %d)", s,
                   mx, a->gen[s], b->gen[s]);
            return;
        }
    report(1, chk, "%d steps' logits bit-identical with and without CUDA graphs", N_GEN);
}

/* cuBLAS prefill (f16 weights and activations): agreement reported; a flip only fails
 * when it is not a near tie of the kernels' own logits (0.5: f16 rounding of the
 * activations moves logits by tenths on this model). Prompts under cublas_min_tokens
 * never reach cuBLAS, so they must be bit-identical. */
static void check_cublas(const model_fx *f, int i, run_out r[N_RUNS][N_PARITY]) {
    char chk[64];
    snprintf(chk, sizeof chk, "cublas[%s]", prompt_at(i)->name);
    const run_out *a = &r[R_G1][i], *b = &r[R_BLAS][i];
    if (!a->ok || !b->ok) {
        report(0, chk, "%s", !a->ok ? a->err : b->err);
        return;
    }
    size_t nv = (size_t)f->nv;
    int m = common_prefix(a->gen, b->gen, N_GEN), n = f->ids[i].n;
    int fin = all_finite(b->logits, nv * N_GEN);
    double sh, d = logit_rel(a->logits, b->logits, f->nv, &sh);
    if (n < 16) {
        int same = memcmp(a->logits, b->logits, nv * N_GEN * sizeof(float)) == 0;
        report(same, chk, "%d-token prompt (< 16: no cuBLAS step): logits %s", n,
               same ? "bit-identical to kiln's kernels" : "DIFFER from kiln's kernels");
        return;
    }
    double below = 0;
    char flip[160] = "";
    if (m < N_GEN) {
        below = (double)a->logits[m * nv + a->gen[m]] - a->logits[m * nv + b->gen[m]];
        snprintf(flip, sizeof flip, " (step %d: cuBLAS picked %d, %.4g below the kernels' top-1 %d: %s)",
                 m, b->gen[m], below, a->gen[m],
                 below <= 0.5 ? "a near tie, <= 0.5" : "NOT a near tie, > 0.5");
    }
    report(fin && d <= 0.05 && below <= 0.5, chk,
           "%d-token prompt: tokens = kiln kernels %d/%d%s; last prompt position max |diff| %.3f%% of "
           "the range (tol 5%%; %.3f%% shift removed)%s",
           n, m, N_GEN, flip, 100 * d, 100 * sh, fin ? "" : "; NON-FINITE logits");
}

static void group_model(const opts *o) {
    model_fx f;
    if (model_open(&f, o, "model") < 0) return;
    static run_out r[N_RUNS][N_PARITY];
    for (int k = 0; k < N_RUNS; k++) {
        double t0 = now_s();
        run_all(&f, k, r[k]);
        info("%s: %d prompts x %d greedy tokens in %.2f s", RUN_NAME[k], N_PARITY, N_GEN, now_s() - t0);
    }
    for (int i = 0; i < N_PARITY; i++) check_greedy(&f, i, r);
    for (int i = 0; i < N_PARITY; i++) check_logits(&f, i, r);
    for (int i = 0; i < N_PARITY; i++) check_graphs(&f, i, r);
    for (int i = 0; i < N_PARITY; i++) check_cublas(&f, i, r);
    for (int k = 0; k < N_RUNS; k++)
        for (int i = 0; i < N_PARITY; i++) free(r[k][i].logits);
    model_close(&f);
}

/* ================================================================ group kv8 */

#define KV8_POOL 132 /* blocks: one sequence's 128 (CTX) and a few more */

/* A prompt of 4+ full blocks: the parity prompts' ids one after another. */
static void kv8_prompt(const model_fx *f, prompt_ids *p) {
    p->n = 0;
    for (int i = 0; p->n < 4 * BLOCK + 7; i = (i + 1) % N_ALL)
        for (int k = 0; k < f->ids[i].n && p->n < 4 * BLOCK + 7; k++) p->ids[p->n++] = f->ids[i].ids[k];
}

/* The prompt in one step, its full blocks to fp8 through mm (rung 2's kv_seq_to_q8);
 * with squeeze, another sequence then takes every block the pool can give (compaction
 * moves fp8 halves together) and lets them go; then greedy decode. logits: [N_GEN][nv];
 * *freed: the units the conversion gave back; *moves: the compaction's moves. */
static int kv8_run(engine *e, const prompt_ids *p, int squeeze, float *logits, int *conv, int *freed,
                   long *moves, char *err, size_t n) {
    static step_t st;
    size_t nv = (size_t)e->n_vocab;
    kv_pool *kv = &e->kv;
    kv_seq *a = kv_seq_new(kv);
    if (!a) return snprintf(err, n, "no page table"), -1;
    step_clear(&st);
    step_add(&st, a, p->ids, p->n, 0, 1);
    int32_t tok = 0;
    for (int i = 0; i < N_GEN; i++) {
        const float *lg = step_run(e, &st, err, n);
        if (!lg) return kv_seq_release(kv, a), -1;
        memcpy(logits + (size_t)i * nv, lg, sizeof(float) * nv);
        tok = argmax_first(lg, (int)nv);
        if (i == 0) {
            int u0 = kv->n_units_free;
            *conv = kv_seq_to_q8(kv, a, p->n, 1 << 30);
            *freed = kv->n_units_free - u0;
            uint64_t m0 = kv->stats.q8_moves;
            if (squeeze) {
                kv_seq *b = kv_seq_new(kv);
                int want = kv_free_blocks(kv);
                if (want > kv->cfg.max_blocks_per_seq) want = kv->cfg.max_blocks_per_seq;
                int r = b ? kv_seq_reserve(kv, b, want * BLOCK) : -ENOMEM;
                kv_seq_release(kv, b);
                if (r < 0) return kv_seq_release(kv, a), snprintf(err, n, "squeeze: %s", strerror(-r)), -1;
            }
            *moves = (long)(kv->stats.q8_moves - m0);
            char why[200] = "";
            if (kv_check(kv, why, sizeof why) < 0)
                return kv_seq_release(kv, a), snprintf(err, n, "kv_check: %s", why), -1;
        }
        step_clear(&st);
        step_add(&st, a, &tok, 1, p->n + i, 1);
    }
    kv_seq_release(kv, a);
    return 0;
}

/* The ladder's 8-bit KV on the device: a kv8 pool (fp8 blocks in half a block, mm's
 * units) computes what an f16 pool does until a block turns to fp8; turning them gives
 * their second halves back; compaction's moves change no bit of what follows; and the
 * fp8 decode stays near the f16 one. */
static void group_kv8(const opts *o) {
    char err[640] = "";
    model_fx f;
    if (model_open(&f, o, "kv8") < 0) return;
    size_t nv = (size_t)f.nv, lb = sizeof(float) * nv * N_GEN;
    float *l8 = xmalloc(lb), *l8m = xmalloc(lb);
    static prompt_ids p;
    kv8_prompt(&f, &p);
    run_out r16, r8;
    engine e;
    int conv = 0, freed = 0, conv2 = 0, freed2 = 0;
    long moves = 0, moves2 = 0;
    memset(&r16, 0, sizeof r16), memset(&r8, 0, sizeof r8);
    if (engine_cuda(&e, &f.m, 1, 0, 0, err, sizeof err) == 0) {
        greedy(&e, &p, N_GEN, &r16);
        engine_close(&e);
    } else {
        snprintf(r16.err, sizeof r16.err, "f16 pool: %s", err);
    }
    if (engine_cuda(&e, &f.m, 1, 0, KV8_POOL, err, sizeof err) == 0) {
        greedy(&e, &p, N_GEN, &r8);
        if (kv8_run(&e, &p, 0, l8, &conv, &freed, &moves, err, sizeof err) < 0 ||
            kv8_run(&e, &p, 1, l8m, &conv2, &freed2, &moves2, err, sizeof err) < 0)
            conv = -1;
        engine_close(&e);
    } else {
        snprintf(r8.err, sizeof r8.err, "kv8 pool: %s", err);
        conv = -1;
    }
    report(r16.ok && r8.ok && !memcmp(r16.logits, r8.logits, lb), "kv8_pool_f16",
           "%d-token prompt, %d greedy steps in a kv8 pool, nothing converted: logits %s the f16 pool's%s%s",
           p.n, N_GEN, !(r16.ok && r8.ok) ? "not compared" : memcmp(r16.logits, r8.logits, lb) ? "DIFFER from" : "bit-identical to",
           r16.ok && r8.ok ? "" : ": ", r16.ok ? r8.err : r16.err);
    if (conv < 0 || !r16.ok) {
        const char *why = conv < 0 ? err : r16.err;
        report(0, "kv8_frees", "not run: %s", why);
        report(0, "kv8_moves", "not run: %s", why);
        report(0, "kv8_decode", "not run: %s", why);
        goto out;
    }
    report(conv == p.n / BLOCK && freed == conv && conv2 == conv && freed2 == conv, "kv8_frees",
           "%d full blocks to fp8 (want %d), %d half-blocks given back (and %d, %d the second time)",
           conv, p.n / BLOCK, freed, conv2, freed2);
    report(moves == 0 && moves2 > 0 && !memcmp(l8, l8m, lb), "kv8_moves",
           "another sequence took every free block: %ld fp8 blocks moved; %d decode steps' logits %s "
           "the run without it", moves2, N_GEN, memcmp(l8, l8m, lb) ? "DIFFER from" : "bit-identical to");
    double kl = 0, klmax = 0;
    int same = 0;
    for (int i = 0; i < N_GEN; i++) {
        double k = kl_logits(r16.logits + (size_t)i * nv, l8 + (size_t)i * nv, (int)nv);
        kl += k, klmax = fmax(klmax, k);
        same += argmax_first(l8 + (size_t)i * nv, (int)nv) == r16.gen[i];
    }
    report(isfinite(kl) && kl / N_GEN < 0.05, "kv8_decode",
           "%d of the prompt's blocks fp8, %d steps: mean KL to the f16 run %.5f (max %.5f; tol "
           "0.05), greedy token equal on %d of %d", conv, N_GEN, kl / N_GEN, klmax, same, N_GEN);
out:
    free(r16.logits), free(r8.logits), free(l8), free(l8m);
    model_close(&f);
}

/* ================================================================ group batch */

#define N_DEC 16 /* decode steps after each prefill */

/* Each sequence's logit rows: [N_ALL][1 + N_DEC][n_vocab]; row 0 is the prefill's. */
typedef struct {
    float *solo;
    int32_t fed[N_ALL][N_DEC + 1]; /* fed[i][j]: the token decode step j feeds (j >= 1) */
    long bad;
    char first[200];
} batch_fx;

static float *solo_row(const batch_fx *b, int i, int j, int nv) {
    return b->solo + ((size_t)i * (N_DEC + 1) + (size_t)j) * (size_t)nv;
}

/* Alone: the prompt as one step, then N_DEC decode steps of its own greedy tokens. */
static int batch_solo(engine *e, const model_fx *f, batch_fx *b, char *err, size_t n) {
    static step_t st;
    for (int i = 0; i < N_ALL; i++) {
        kv_seq *s = kv_seq_new(&e->kv);
        if (!s) return snprintf(err, n, "no free page table"), -1;
        step_clear(&st);
        step_add(&st, s, f->ids[i].ids, f->ids[i].n, 0, 1);
        for (int j = 0; j <= N_DEC; j++) {
            const float *lg = step_run(e, &st, err, n);
            if (!lg) return kv_seq_release(&e->kv, s), -1;
            memcpy(solo_row(b, i, j, f->nv), lg, sizeof(float) * (size_t)f->nv);
            if (j == N_DEC) break;
            b->fed[i][j + 1] = argmax_first(lg, f->nv);
            step_clear(&st);
            step_add(&st, s, &b->fed[i][j + 1], 1, f->ids[i].n + j, 1);
        }
        kv_seq_release(&e->kv, s);
    }
    return 0;
}

static void batch_compare(batch_fx *b, const float *row, int i, int j, int nv, const char *mode,
                          int step) {
    const float *want = solo_row(b, i, j, nv);
    if (!memcmp(row, want, sizeof(float) * (size_t)nv)) return;
    if (!b->bad++) {
        double mx = 0;
        for (int k = 0; k < nv; k++) mx = fmax(mx, fabs((double)row[k] - want[k]));
        snprintf(b->first, sizeof b->first, "%s step %d: sequence %d (%s) row %d: max |diff| %.3g", mode,
                 step, i, prompt_at(i)->name, j, mx);
    }
}

/* chunk 0: every prefill whole in the first step; else prefills in chunks of `chunk`
 * tokens, each sequence decoding as soon as its own prompt is in. Every step carries
 * every sequence that still has work; each logit row is compared with the solo run. */
static int batch_mixed(engine *e, const model_fx *f, batch_fx *b, int chunk, int *steps, char *err,
                       size_t n) {
    static step_t st;
    kv_seq *s[N_ALL] = {0};
    int fed[N_ALL] = {0}, dec[N_ALL] = {0}, who[MAX_LOGITS], row_j[MAX_LOGITS], r = 0;
    for (int i = 0; i < N_ALL; i++)
        if (!(s[i] = kv_seq_new(&e->kv))) {
            snprintf(err, n, "no free page table");
            r = -1;
            goto out;
        }
    for (*steps = 0;; ++*steps) {
        step_clear(&st);
        for (int i = 0; i < N_ALL; i++) {
            int np = f->ids[i].n;
            if (fed[i] < np) {
                int c = chunk > 0 && np - fed[i] > chunk ? chunk : np - fed[i];
                int last = fed[i] + c == np;
                if (last) who[st.n_logits] = i, row_j[st.n_logits] = 0;
                step_add(&st, s[i], f->ids[i].ids + fed[i], c, fed[i], last);
                fed[i] += c;
            } else if (dec[i] < N_DEC) {
                dec[i]++;
                who[st.n_logits] = i, row_j[st.n_logits] = dec[i];
                step_add(&st, s[i], &b->fed[i][dec[i]], 1, np + dec[i] - 1, 1);
            }
        }
        if (st.n == 0) break;
        const float *lg = step_run(e, &st, err, n);
        if (!lg) {
            r = -1;
            goto out;
        }
        for (int k = 0; k < st.n_logits; k++)
            batch_compare(b, lg + (size_t)k * f->nv, who[k], row_j[k], f->nv,
                          chunk ? "chunked" : "together", *steps);
    }
out:
    for (int i = 0; i < N_ALL; i++)
        if (s[i]) kv_seq_release(&e->kv, s[i]);
    return r;
}

static void group_batch(const opts *o) {
    char err[512] = "";
    model_fx f;
    if (model_open(&f, o, "batch") < 0) return;
    static batch_fx b;
    b.solo = xmalloc(sizeof(float) * N_ALL * (N_DEC + 1) * (size_t)f.nv);
    engine e;
    int lo = 1 << 30, hi = 0, steps = 0;
    for (int i = 0; i < N_ALL; i++)
        lo = f.ids[i].n < lo ? f.ids[i].n : lo, hi = f.ids[i].n > hi ? f.ids[i].n : hi;
    if (engine_cuda(&e, &f.m, 1, 0, 0, err, sizeof err) < 0) {
        report(0, "batch_invariance[together]", "cuda backend: %s", err);
        report(0, "batch_invariance[chunked7]", "cuda backend: %s", err);
        goto out;
    }
    if (batch_solo(&e, &f, &b, err, sizeof err) < 0) {
        report(0, "batch_invariance[together]", "solo runs: %s", err);
        report(0, "batch_invariance[chunked7]", "solo runs: %s", err);
        goto out_e;
    }
    static const char *NAMES[2] = {"batch_invariance[together]", "batch_invariance[chunked7]"};
    for (int v = 0; v < 2; v++) {
        b.bad = 0, b.first[0] = 0;
        if (batch_mixed(&e, &f, &b, v ? 7 : 0, &steps, err, sizeof err) < 0)
            report(0, NAMES[v], "%s", err);
        else if (b.bad)
            report(0, NAMES[v], "%ld of %d logit rows differ from the solo runs; first: %s", b.bad,
                   N_ALL * (N_DEC + 1), b.first);
        else
            report(1, NAMES[v], "%d sequences (prompts of %d..%d tokens) x %d logit rows bit-identical to "
                   "each run alone, in %d steps", N_ALL, lo, hi, N_DEC + 1, steps);
    }
out_e:
    engine_close(&e);
out:
    free(b.solo);
    model_close(&f);
}

/* ================================================================ the parent */

typedef struct {
    const char *name;
    void (*fn)(const opts *);
    int timeout_s; /* run.sh gives the whole program 300 s: these add up to less */
} group;

static const group GROUPS[] = {
    {"quant", group_quant, 45},  {"kernels", group_kernels, 30}, {"rope", group_rope, 30},
    {"attn", group_attn, 60},    {"model", group_model, 75},     {"batch", group_batch, 50},
    {"kv8", group_kv8, 40},
};

typedef struct {
    int pass, fail, nodev;
    char nodev_why[512];
    FILE *out;
} tally;

static void emit_line(tally *t, const char *line) {
    if (!strncmp(line, "NODEV ", 6)) {
        t->nodev = 1;
        snprintf(t->nodev_why, sizeof t->nodev_why, "%s", line + 6);
        return;
    }
    if (!strncmp(line, "PASS ", 5)) t->pass++;
    else if (!strncmp(line, "FAIL ", 5)) t->fail++;
    printf("%s\n", line);
    fflush(stdout);
    if (t->out) fprintf(t->out, "%s\n", line), fflush(t->out);
}

static void parent_fail(tally *t, const char *fmt, ...) FMT(2, 3);
static void parent_fail(tally *t, const char *fmt, ...) {
    char line[600];
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(line, sizeof line, "FAIL ");
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    emit_line(t, line);
}

/* Reads the child's lines until EOF or the deadline; returns 1 on a timeout. */
static int pump(int fd, double deadline, tally *t, int *lines) {
    char buf[8192];
    size_t have = 0;
    for (;;) {
        int ms = (int)((deadline - now_s()) * 1000);
        if (ms <= 0) return 1;
        struct pollfd p = {fd, POLLIN, 0};
        int r = poll(&p, 1, ms);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        ssize_t n = read(fd, buf + have, sizeof buf - 1 - have);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        have += (size_t)n;
        char *s = buf, *nl;
        while ((nl = memchr(s, '\n', have - (size_t)(s - buf)))) {
            *nl = 0;
            emit_line(t, s);
            ++*lines;
            s = nl + 1;
        }
        have -= (size_t)(s - buf);
        memmove(buf, s, have);
        if (have == sizeof buf - 1) { /* a line too long: pass it on as it is */
            buf[have] = 0;
            emit_line(t, buf);
            have = 0;
        }
    }
    if (have) {
        buf[have] = 0;
        emit_line(t, buf);
    }
    return 0;
}

static void run_group(const group *g, const opts *o, tally *t) {
    int fds[2];
    if (pipe(fds) < 0) {
        parent_fail(t, "%s: pipe: %s", g->name, strerror(errno));
        return;
    }
    fflush(stdout);
    if (t->out) fflush(t->out);
    double t0 = now_s();
    pid_t pid = fork();
    if (pid < 0) {
        parent_fail(t, "%s: fork: %s", g->name, strerror(errno));
        close(fds[0]), close(fds[1]);
        return;
    }
    if (pid == 0) {
        close(fds[0]);
        g_fd = fds[1];
        g->fn(o);
        _exit(0);
    }
    close(fds[1]);
    double limit = g->timeout_s * o->timeout_scale;
    int lines = 0, timed_out = pump(fds[0], t0 + limit, t, &lines), status = 0;
    if (timed_out) kill(pid, SIGKILL);
    close(fds[0]);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (t->nodev) return;
    if (timed_out)
        parent_fail(t, "%s: timed out after %.0f s (%d lines reported; the rest of the group did not "
                    "run)", g->name, limit, lines);
    else if (WIFSIGNALED(status))
        parent_fail(t, "%s: crashed with signal %d (%s) after %d lines", g->name, WTERMSIG(status),
                    strsignal(WTERMSIG(status)), lines);
    else if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
        parent_fail(t, "%s: exited with status %d after %d lines", g->name, WEXITSTATUS(status), lines);
    else if (lines == 0)
        parent_fail(t, "%s: reported nothing", g->name);
    char line[96];
    snprintf(line, sizeof line, "INFO group %s: %.1f s", g->name, now_s() - t0);
    emit_line(t, line);
}

static int wanted(const opts *o, const char *name) {
    if (!o->only) return 1;
    size_t n = strlen(name);
    for (const char *p = o->only; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n)) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

static int usage(void) {
    fprintf(stderr, "usage: gpu_test --model PATH [--out FILE] [--only GROUP,...] [--timeout-scale F]\n"
                    "groups: quant kernels rope attn model batch\n");
    return 2;
}

int main(int argc, char **argv) {
    opts o = {0};
    o.timeout_scale = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--model") && v) o.model = v, i++;
        else if (!strcmp(a, "--out") && v) o.out = v, i++;
        else if (!strcmp(a, "--only") && v) o.only = v, i++;
        else if (!strcmp(a, "--timeout-scale") && v && atof(v) > 0) o.timeout_scale = atof(v), i++;
        else return usage();
    }
    if (!o.model) return usage();
    tally t = {0};
    if (o.out && !(t.out = fopen(o.out, "w"))) {
        fprintf(stderr, "gpu_test: cannot write %s: %s\n", o.out, strerror(errno));
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    for (size_t i = 0; i < sizeof GROUPS / sizeof GROUPS[0]; i++) {
        if (!wanted(&o, GROUPS[i].name)) continue;
        run_group(&GROUPS[i], &o, &t);
        if (t.nodev) {
            printf("gpu_test: %s\n", t.nodev_why);
            if (t.out) fprintf(t.out, "gpu_test: %s\n", t.nodev_why), fclose(t.out);
            return 2;
        }
    }
    printf("gpu_test: %d passed, %d failed\n", t.pass, t.fail);
    if (t.out) fprintf(t.out, "gpu_test: %d passed, %d failed\n", t.pass, t.fail), fclose(t.out);
    return t.fail || t.pass == 0 ? 1 : 0;
}
