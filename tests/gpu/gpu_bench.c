/* gpu_bench: the CUDA backend's speed on one GPU, printed as a table (and written to
 * --out): the device's own copy bandwidth first (the ceiling decode is measured
 * against), then for 1, 16 and 64 concurrent streams of 128-token prompts and 128
 * generated tokens: prefill tok/s, decode tok/s, and decode's bytes read per second
 * (weights once per step plus each stream's KV) as a share of that bandwidth. Steps
 * run through the real backend interface (submit, wait, logits to the host, greedy pick
 * on the host), as the engine drives it. Also: prefill through cuBLAS instead of kiln's
 * kernels, decode without CUDA graphs, and kiln's CPU backend on this machine's cores
 * for one stream, measured in the same run.
 *
 *   gpu_bench --model M [--out FILE] [--threads N] */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/threads.h"
#include "core/tokenizer.h"
#include <math.h>
#include "cuda/cu.h"
#include "cuda/kern.h"
#include "tests/kl.h"
#include "tests/parity_prompts.h"

#define PROMPT 128
#define GEN 128
#define MAX_STEP 2048 /* prefill tokens per step */
#define MAX_STREAMS 64

static FILE *g_out;

static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
    if (g_out) {
        va_start(ap, fmt);
        vfprintf(g_out, fmt, ap);
        va_end(ap);
        fflush(g_out);
    }
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- copy bandwidth */

/* Bytes moved (read + written) per second by a 1 GiB device-to-device copy, best of 5. */
static double copy_bandwidth(void) {
    char err[256];
    const cu_api *cu = cu_load(err, sizeof err);
    if (!cu) return 0;
    CUdevice dev;
    CUcontext ctx;
    if (cu->cuDeviceGet(&dev, 0) || cu->cuDevicePrimaryCtxRetain(&ctx, dev) || cu->cuCtxSetCurrent(ctx))
        return 0;
    size_t n = 1u << 30;
    CUdeviceptr a = 0, b = 0;
    CUevent e0, e1;
    double best = 0;
    if (cu->cuMemAlloc(&a, n) || cu->cuMemAlloc(&b, n)) goto out;
    cu->cuEventCreate(&e0, 0), cu->cuEventCreate(&e1, 0);
    cu->cuMemsetD8Async(a, 1, n, NULL);
    for (int i = 0; i < 6; i++) {
        cu->cuEventRecord(e0, NULL);
        cu->cuMemcpyDtoDAsync(b, a, n, NULL);
        cu->cuEventRecord(e1, NULL);
        cu->cuEventSynchronize(e1);
        float ms = 0;
        cu->cuEventElapsedTime(&ms, e0, e1);
        double bw = 2.0 * (double)n / (ms * 1e-3);
        if (i > 0 && bw > best) best = bw; /* the first is a warm-up */
    }
    cu->cuEventDestroy(e0), cu->cuEventDestroy(e1);
out:
    if (a) cu->cuMemFree(a);
    if (b) cu->cuMemFree(b);
    cu->cuDevicePrimaryCtxRelease(dev);
    return best;
}

/* ---------------------------------------------------------------- logits: down or argmax */

/* What the engine's sampling costs in transfers: S logit rows downloaded into pinned
 * memory, against a greedy argmax on the device and S ints down. Mean of 20 each. */
static void logits_transfer(int n_vocab) {
    char err[256];
    const cu_api *cu = cu_load(err, sizeof err);
    CUdevice dev;
    CUcontext ctx;
    kern k;
    if (!cu || cu->cuDeviceGet(&dev, 0) || cu->cuDevicePrimaryCtxRetain(&ctx, dev) || cu->cuCtxSetCurrent(ctx))
        return;
    if (kern_load(&k, cu, err, sizeof err) < 0) {
        say("logits transfer: %s\n", err);
        return;
    }
    size_t bytes = (size_t)MAX_STREAMS * n_vocab * 4;
    CUdeviceptr lg = 0, ids = 0;
    void *host = NULL;
    CUevent e0, e1;
    cu->cuEventCreate(&e0, 0), cu->cuEventCreate(&e1, 0);
    if (!cu->cuMemAlloc(&lg, bytes) && !cu->cuMemAlloc(&ids, MAX_STREAMS * 4) &&
        !cu->cuMemHostAlloc(&host, bytes, 0)) {
        cu->cuMemsetD8Async(lg, 0x3c, bytes, NULL);
        static const int rows[] = {1, 16, 64};
        for (int i = 0; i < 3; i++) {
            float down = 0, arg = 0, ms;
            for (int rep = 0; rep < 21; rep++) {
                cu->cuEventRecord(e0, NULL);
                cu->cuMemcpyDtoHAsync(host, lg, (size_t)rows[i] * n_vocab * 4, NULL);
                cu->cuEventRecord(e1, NULL);
                cu->cuEventSynchronize(e1);
                cu->cuEventElapsedTime(&ms, e0, e1);
                if (rep) down += ms;
                cu->cuEventRecord(e0, NULL);
                kern_argmax(&k, NULL, ids, lg, n_vocab, rows[i]);
                cu->cuMemcpyDtoHAsync(host, ids, (size_t)rows[i] * 4, NULL);
                cu->cuEventRecord(e1, NULL);
                cu->cuEventSynchronize(e1);
                cu->cuEventElapsedTime(&ms, e0, e1);
                if (rep) arg += ms;
            }
            say("logits for %2d rows: download %.3f ms, device argmax + ids down %.3f ms\n", rows[i],
                down / 20, arg / 20);
        }
    }
    if (host) cu->cuMemFreeHost(host);
    if (lg) cu->cuMemFree(lg);
    if (ids) cu->cuMemFree(ids);
    cu->cuEventDestroy(e0), cu->cuEventDestroy(e1);
    kern_unload(&k);
    cu->cuDevicePrimaryCtxRelease(dev);
}

/* ---------------------------------------------------------------- one run */

typedef struct {
    double prefill_tps, decode_tps, decode_step_ms;
    int ok;
} run_result;

typedef struct {
    const model *m;
    backend *be;
    kv_pool *kv;
    int32_t tok[MAX_STEP], pos[MAX_STEP], rows[MAX_STREAMS];
    kv_seq *seqv[MAX_STEP];
} rig;

static int greedy(const float *lg, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (lg[i] > lg[best]) best = i;
    return best;
}

/* S streams: all prompts prefilled in steps of up to MAX_STEP tokens, then GEN decode
 * steps of S tokens. Token ids are synthetic but fixed. */
static run_result run_streams(rig *r, int S) {
    run_result res = {0};
    kv_seq *seq[MAX_STREAMS];
    int32_t next[MAX_STREAMS];
    int n_vocab = r->m->cfg.n_vocab;
    for (int s = 0; s < S; s++) {
        seq[s] = kv_seq_new(r->kv);
        if (!seq[s] || kv_seq_reserve(r->kv, seq[s], PROMPT + GEN) < 0) {
            say("bench: cannot reserve KV for %d streams\n", S);
            return res;
        }
    }
    double t0 = now();
    int n = 0, n_logits = 0, owner[MAX_STREAMS]; /* owner[i]: the stream of logit row i */
    for (int s = 0; s < S; s++)
        for (int p = 0; p < PROMPT; p++) {
            r->tok[n] = (int32_t)((s * 7919 + p * 104729) % (n_vocab - 1000) + 500);
            r->pos[n] = p, r->seqv[n] = seq[s];
            if (p == PROMPT - 1) owner[n_logits] = s, r->rows[n_logits++] = n;
            if (++n == MAX_STEP || (s == S - 1 && p == PROMPT - 1)) {
                model_batch b = {n, r->tok, r->pos, r->seqv, n_logits, r->rows};
                if (backend_run(r->be, &b) < 0) {
                    say("bench: prefill step failed: %s\n", r->be->err);
                    return res;
                }
                const float *lg = r->be->ops->logits(r->be);
                for (int i = 0; i < n_logits; i++) next[owner[i]] = greedy(lg + (size_t)i * n_vocab, n_vocab);
                n = 0, n_logits = 0;
            }
        }
    double t1 = now();
    for (int g = 0; g < GEN; g++) {
        for (int s = 0; s < S; s++) r->tok[s] = next[s], r->pos[s] = PROMPT + g, r->seqv[s] = seq[s], r->rows[s] = s;
        model_batch b = {S, r->tok, r->pos, r->seqv, S, r->rows};
        if (backend_run(r->be, &b) < 0) {
            say("bench: decode step failed: %s\n", r->be->err);
            return res;
        }
        const float *lg = r->be->ops->logits(r->be);
        for (int s = 0; s < S; s++) next[s] = greedy(lg + (size_t)s * n_vocab, n_vocab);
    }
    double t2 = now();
    for (int s = 0; s < S; s++) kv_seq_release(r->kv, seq[s]);
    res.prefill_tps = (double)S * PROMPT / (t1 - t0);
    res.decode_tps = (double)S * GEN / (t2 - t1);
    res.decode_step_ms = (t2 - t1) * 1e3 / GEN;
    res.ok = 1;
    return res;
}

/* ---------------------------------------------------------------- 8-bit KV accuracy */

#define KV8_STEPS 32
/* the parity prompts: tests/parity_prompts.h */

static int argmax_row(const float *x, int n) { return greedy(x, n); }

/* One step of tokens [pos0, pos0+n) of seq, logits of the last; NULL on failure. */
static const float *feed(rig *r, kv_seq *seq, const int32_t *toks, int n, int pos0) {
    for (int i = 0; i < n; i++) r->tok[i] = toks[i], r->pos[i] = pos0 + i, r->seqv[i] = seq;
    r->rows[0] = n - 1;
    model_batch b = {n, r->tok, r->pos, r->seqv, 1, r->rows};
    if (backend_run(r->be, &b) < 0) {
        say("kv8: step failed: %s\n", r->be->err);
        return NULL;
    }
    return r->be->ops->logits(r->be);
}

/* The parity prompts with f16 KV, then again with every full block turned to fp8 as
 * soon as it is full (the ladder's rung 2 at its harshest: all of the cache but the
 * block being written), teacher-forced on the f16 run's greedy tokens: the mean KL
 * divergence of the next-token distributions, and how long greedy output stays the
 * same. */
static void kv8_accuracy(rig *r, const tok_t *tok) {
    int nv = r->m->cfg.n_vocab, bs = r->kv->cfg.block_size, n_p = N_PARITY_PROMPTS;
    float *ref = malloc((size_t)(KV8_STEPS + 1) * nv * sizeof(float));
    int32_t ids[1024], gen[KV8_STEPS + 1], blocks[64];
    double kl_sum = 0, kl_max = 0;
    int kl_n = 0, same16 = 0;
    say("\n8-bit KV (fp8 e4m3, a scale per block, layer, K|V and head) against f16, %d steps per prompt:\n",
        KV8_STEPS);
    for (int p = 0; p < n_p && ref; p++) {
        char text[2048];
        int tn = parity_text(&PARITY_PROMPTS[p], text, sizeof text);
        int n = tn < 0 ? -1 : tok_encode(tok, text, (size_t)tn, 1, ids, 1024);
        kv_seq *seq = kv_seq_new(r->kv);
        if (n < 1 || n > 512 || !seq || kv_seq_reserve(r->kv, seq, n + KV8_STEPS + 1) < 0) {
            say("kv8: prompt %d: cannot tokenize or reserve\n", p);
            break;
        }
        const float *lg = feed(r, seq, ids, n, 0);
        for (int i = 0; lg && i <= KV8_STEPS; i++) { /* the f16 reference, greedy */
            memcpy(ref + (size_t)i * nv, lg, (size_t)nv * sizeof(float));
            gen[i] = argmax_row(lg, nv);
            if (i < KV8_STEPS) lg = feed(r, seq, &gen[i], 1, n + i);
        }
        kv_seq_release(r->kv, seq);
        seq = kv_seq_new(r->kv);
        if (!lg || !seq || kv_seq_reserve(r->kv, seq, n + KV8_STEPS + 1) < 0) break;
        lg = feed(r, seq, ids, n, 0);
        int nb = n / bs, same = -1;
        for (int b = 0; b < nb; b++) blocks[b] = seq->blocks[b];
        if (!lg || backend_cuda_kv8(r->be, blocks, nb) < 0) {
            say("kv8: %s\n", r->be->err);
            break;
        }
        double kl_p = 0;
        for (int i = 0; i < KV8_STEPS; i++) {
            lg = feed(r, seq, &gen[i], 1, n + i);
            if (!lg) break;
            double kl = kl_logits(ref + (size_t)(i + 1) * nv, lg, nv);
            kl_p += kl, kl_sum += kl, kl_n++;
            kl_max = kl > kl_max ? kl : kl_max;
            if (same < 0 && argmax_row(lg, nv) != gen[i + 1]) same = i + 1;
            int pos = n + i;
            if ((pos + 1) % bs == 0) { /* that block is full: 8 bits from now on */
                int32_t blk = seq->blocks[pos / bs];
                if (backend_cuda_kv8(r->be, &blk, 1) < 0) break;
            }
        }
        if (same < 0) same = KV8_STEPS + 1;
        same16 += same > 16;
        say("  prompt %d: %3d tokens, %2d blocks 8-bit at the start; mean KL %.5f; greedy identical for %d of %d tokens\n",
            p, n, nb, kl_p / KV8_STEPS, same > KV8_STEPS ? KV8_STEPS + 1 : same, KV8_STEPS + 1);
        kv_seq_release(r->kv, seq);
    }
    if (kl_n)
        say("8-bit KV: mean KL %.5f nats (max %.5f) over %d next-token distributions; greedy output "
            "identical for the first 16 tokens on %d of %d prompts\n", kl_sum / kl_n, kl_max, kl_n, same16, n_p);
    free(ref);
}

/* ---------------------------------------------------------------- main */

static backend *open_cuda(const model *m, kv_pool *kv, int cublas, int graphs);

/* One more configuration of the CUDA backend at 1, 16 and 64 streams (after a warm-up). */
static void other_config(rig *r, const char *label, int cublas, int graphs) {
    static const int streams[] = {1, 16, 64};
    kv_pool kv;
    backend *be = open_cuda(r->m, &kv, cublas, graphs);
    if (!be) return;
    r->be = be, r->kv = &kv;
    run_streams(r, 1);
    for (int i = 0; i < 3; i++) {
        run_result x = run_streams(r, streams[i]);
        if (x.ok)
            say("%-34s %8d %12.0f %12.0f %10.3f\n", label, streams[i], x.prefill_tps, x.decode_tps,
                x.decode_step_ms);
    }
    be->ops->destroy(be);
    kv_pool_free(&kv);
}

static size_t weight_bytes(const model *m) {
    size_t b = (size_t)m->w.output.n_out * m->w.output.row_bytes;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const model_layer *L = &m->w.layers[l];
        const model_mat *ms[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) b += (size_t)ms[i]->n_out * ms[i]->row_bytes;
    }
    return b;
}

static backend *open_cuda(const model *m, kv_pool *kv, int cublas, int graphs) {
    kv_config kc = {0};
    model_kv_shape(m, &kc);
    kc.block_size = 16, kc.max_seqs = MAX_STREAMS + 8;
    kc.max_blocks_per_seq = (PROMPT + GEN + 15) / 16 + 1;
    backend_cuda_config cc = {0, 0.9, MAX_STEP, MAX_STEP, PROMPT + GEN + 16, cublas, 64, graphs,
                              (size_t)2 << 30};
    char err[512];
    backend *be = backend_cuda_new(m, kv, &kc, &cc, err, sizeof err);
    if (!be) say("bench: CUDA backend: %s\n", err);
    return be;
}

int main(int argc, char **argv) {
    const char *path = NULL, *out = NULL;
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: gpu_bench --model M [--out FILE] [--threads N]\n");
            return 2;
        }
    }
    if (!path) return fprintf(stderr, "gpu_bench: --model is required\n"), 2;
    if (out && !(g_out = fopen(out, "w"))) return perror(out), 2;
    static model m;
    char err[512];
    if (model_load(&m, path, err, sizeof err) < 0) return fprintf(stderr, "gpu_bench: %s\n", err), 1;
    if (!backend_cuda_probe(err, sizeof err)) return say("gpu_bench: no GPU: %s\n", err), 2;

    double bw = copy_bandwidth();
    size_t wb = weight_bytes(&m);
    size_t kv_tok = (size_t)2 * m.cfg.n_layers * m.cfg.n_kv_heads * m.cfg.head_dim * 2;
    say("device copy bandwidth: %.0f GB/s (read + written, 1 GiB device-to-device)\n", bw / 1e9);
    say("model: %s, %d layers, weights %.1f MB, KV %zu bytes per token\n", path, m.cfg.n_layers,
        wb / 1e6, kv_tok);
    logits_transfer(m.cfg.n_vocab);
    say("\n");

    kv_pool kv;
    backend *be = open_cuda(&m, &kv, 0, 1);
    if (!be) return 1;
    char desc[256];
    backend_cuda_describe(be, desc, sizeof desc);
    say("backend: %s\n\n", desc);
    static rig r;
    r.m = &m, r.be = be, r.kv = &kv;
    run_streams(&r, 1); /* warm-up: graphs captured, clocks up */
    say("%-34s %8s %12s %12s %10s %10s\n", "config", "streams", "prefill t/s", "decode t/s", "step ms",
        "bw share");
    static const int streams[] = {1, 16, 64};
    for (int i = 0; i < 3; i++) {
        run_result x = run_streams(&r, streams[i]);
        if (!x.ok) return 1;
        /* bytes per decode step: every weight once, plus each stream's KV so far (mean
         * context PROMPT + GEN/2), written back negligible */
        double bytes = (double)wb + (double)streams[i] * (PROMPT + GEN / 2.0) * (double)kv_tok;
        double share = bw > 0 ? bytes / (x.decode_step_ms * 1e-3) / bw : 0;
        say("%-34s %8d %12.0f %12.0f %10.3f %9.1f%%\n", "kiln kernels, graphs", streams[i], x.prefill_tps,
            x.decode_tps, x.decode_step_ms, 100 * share);
    }
    static tok_t tok;
    if (tok_init_gguf(&tok, &m.gguf, err, sizeof err) == 0) {
        kv8_accuracy(&r, &tok);
        tok_free(&tok);
    } else {
        say("kv8: tokenizer: %s\n", err);
    }
    be->ops->destroy(be);
    kv_pool_free(&kv);

    other_config(&r, "kiln kernels, no graphs", 0, 0);
    other_config(&r, "cuBLAS prefill (>= 64 tok), graphs", 1, 1);

    /* where a step's time goes: KILN_CUDA_PROFILE's per-kernel breakdown (stderr) */
    setenv("KILN_CUDA_PROFILE", "1", 1);
    for (int i = 0; i < 3; i += 2)
        if ((be = open_cuda(&m, &kv, 0, 0))) {
            r.be = be, r.kv = &kv;
            fprintf(stderr, "profile of %d stream(s):\n", streams[i]);
            run_streams(&r, streams[i]);
            be->ops->destroy(be); /* prints the profile */
            kv_pool_free(&kv);
        }
    unsetenv("KILN_CUDA_PROFILE");

    /* kiln's CPU backend on this machine, one stream, same shape */
    kv_config kc = {0};
    model_kv_shape(&m, &kc);
    kc.block_size = 16, kc.max_seqs = 4, kc.max_blocks_per_seq = (PROMPT + GEN + 15) / 16 + 1;
    kc.n_blocks = kc.max_blocks_per_seq * 2;
    if (kv_pool_init(&kv, &kc, NULL) == 0) {
        backend_cpu_config bc = {threads, MAX_STEP, MAX_STREAMS, PROMPT + GEN + 16, 0};
        if ((be = backend_cpu_new(&m, &kv, &bc, err, sizeof err))) {
            r.be = be, r.kv = &kv;
            run_result x = run_streams(&r, 1);
            if (x.ok)
                say("%-34s %8d %12.0f %12.0f %10.3f\n", "kiln CPU backend", 1, x.prefill_tps, x.decode_tps,
                    x.decode_step_ms);
            be->ops->destroy(be);
        }
        kv_pool_free(&kv);
    }
    model_free(&m);
    if (g_out) fclose(g_out);
    return 0;
}
