/* bench_engine: `kilnd bench-engine`, the offline driver. Requests go through the real
 * scheduler (continuous batching, chunked prefill, prefix cache, preemption) without
 * the network; it reports aggregate throughput and latency percentiles.
 *
 *   kilnd bench-engine --model PATH [--threads N] [--requests N] [--concurrency C]
 *       [--prompt-tokens P | --prompt-file FILE] [--gen-tokens G] [--max-batch B]
 *       [--max-batched-tokens T] [--kv-blocks N] [--prefix-caching 0|1]
 *       [--free-windows 0|1] [--json] [--config kiln.ini]
 *
 * --config takes the model and the engine knobs from kiln.ini ([model] path,
 * [engine] threads, block_size, kv_pool_mb, max_batch_size, max_batched_tokens,
 * prefix_caching, max_queued_tokens); flags given after it override them. The
 * driver keeps exactly `concurrency` requests queued, so it sets max_queued_requests
 * to that.
 * C requests are kept in flight until N have been sent (closed loop, like a load
 * generator with C users). Synthetic prompts are token ids spread over the
 * vocabulary; with --prompt-file each line is a prompt (tokenized, cycled).
 * --free-windows 0 keeps sliding-window layers' KV behind every window (the pool as
 * before windows were freed), for measuring what freeing it gives; the report's
 * kv_peak_blocks is the most blocks in use (not free, cached or spare) after a step. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/config.h"
#include "core/chat.h"
#include "core/model.h"
#include "core/prompt.h"
#include "core/tokenizer.h"
#include "mm/kv.h"
#include "sched/drive.h"
#include "sched/engine.h"
#include "sched/loop.h"
#include "kilnd/kilnd.h"

typedef struct {
    const char *model, *prompt_file;
    int threads, requests, concurrency, prompt_tokens, gen_tokens, backend;
    int max_batch, max_batched_tokens, kv_blocks, prefix, json;
    int block_size, kv_pool_mb, max_queued_tokens, free_windows;
    kiln_config cfg; /* --config: where model points */
} be_opts;

typedef struct {
    double t_submit, t_last;
    int n_tok;
} be_req;

typedef struct {
    be_req *reqs;
    double *ttft;   /* [requests] */
    double *itl;    /* [requests * gen_tokens] gaps between consecutive tokens */
    int n_ttft, n_itl, cap_itl;
    int64_t tokens;
    int finished, failed;
    /* Decode phase: steps that started with every submitted request past its first
     * token and preempted nothing (so no prompt, or recomputed prompt, in the step).
     * Their tokens over their wall time (submit to sampled) is decode_tok_s. */
    int64_t dec_tokens;
    double dec_s;
} be_run;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static be_run *g_run; /* the callbacks' view of the run (one run per process) */

static void on_token(void *ud, int64_t id, int sample, int32_t tok, const char *t, int len,
                     float lp) {
    (void)id, (void)sample, (void)t, (void)len, (void)lp;
    be_req *r = ud;
    if (tok < 0) return;
    double now = now_s();
    if (r->n_tok == 0) g_run->ttft[g_run->n_ttft++] = now - r->t_submit;
    else if (g_run->n_itl < g_run->cap_itl) g_run->itl[g_run->n_itl++] = now - r->t_last;
    r->t_last = now;
    r->n_tok++;
    g_run->tokens++;
}

static void on_finish(void *ud, int64_t id, int sample, int reason, const eng_usage *u,
                      const char *msg) {
    (void)id, (void)sample, (void)u;
    (void)ud;
    g_run->finished++;
    if (reason == EF_ERROR) {
        g_run->failed++;
        fprintf(stderr, "kilnd: request failed: %s\n", msg ? msg : "?");
    }
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p) {
    if (n == 0) return 0.0;
    int i = (int)(p / 100.0 * (n - 1) + 0.5);
    return v[i];
}

static int parse(int argc, char **argv, be_opts *o) {
    memset(o, 0, sizeof *o);
    o->threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    o->requests = 32, o->concurrency = 32, o->prompt_tokens = 128, o->gen_tokens = 128;
    o->max_batch = 32, o->max_batched_tokens = 512, o->prefix = 1, o->block_size = 16;
    o->free_windows = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *ip = NULL;
        if (!strcmp(a, "--json")) { o->json = 1; continue; }
        if (!v) { fprintf(stderr, "kilnd: %s needs a value\n", a); return -1; }
        i++;
        if (!strcmp(a, "--config")) {
            char err[512];
            cfg_defaults(&o->cfg);
            if (cfg_load_file(&o->cfg, v, err, sizeof err) < 0) {
                fprintf(stderr, "kilnd: %s\n", err);
                return -1;
            }
            o->model = o->cfg.model.path;
            if (o->cfg.engine.threads > 0) o->threads = o->cfg.engine.threads;
            o->block_size = o->cfg.engine.block_size;
            o->kv_pool_mb = o->cfg.engine.kv_pool_mb;
            o->max_batch = o->cfg.engine.max_batch_size;
            o->max_batched_tokens = o->cfg.engine.max_batched_tokens;
            o->prefix = o->cfg.engine.prefix_caching;
            o->max_queued_tokens = o->cfg.engine.max_queued_tokens;
            o->backend = o->cfg.engine.backend;
        } else if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--prompt-file")) o->prompt_file = v;
        else if (!strcmp(a, "--backend")) {
            o->backend = !strcmp(v, "cpu") ? CFG_BACKEND_CPU : !strcmp(v, "cuda") ? CFG_BACKEND_CUDA
                       : !strcmp(v, "auto") ? CFG_BACKEND_AUTO : -1;
            if (o->backend < 0) { fprintf(stderr, "kilnd: --backend is auto, cpu or cuda\n"); return -1; }
        }
        else if (!strcmp(a, "--threads")) ip = &o->threads;
        else if (!strcmp(a, "--requests")) ip = &o->requests;
        else if (!strcmp(a, "--concurrency")) ip = &o->concurrency;
        else if (!strcmp(a, "--prompt-tokens")) ip = &o->prompt_tokens;
        else if (!strcmp(a, "--gen-tokens")) ip = &o->gen_tokens;
        else if (!strcmp(a, "--max-batch")) ip = &o->max_batch;
        else if (!strcmp(a, "--max-batched-tokens")) ip = &o->max_batched_tokens;
        else if (!strcmp(a, "--kv-blocks")) ip = &o->kv_blocks;
        else if (!strcmp(a, "--prefix-caching")) ip = &o->prefix;
        else if (!strcmp(a, "--free-windows")) ip = &o->free_windows;
        else { fprintf(stderr, "kilnd: unknown flag '%s'\n", a); return -1; }
        if (ip) {
            char *end;
            long x = strtol(v, &end, 10);
            if (*end || x < 0 || x > 1000000) { fprintf(stderr, "kilnd: bad value for %s: '%s'\n", a, v); return -1; }
            *ip = (int)x;
        }
    }
    if (!o->model) { fprintf(stderr, "kilnd: --model PATH is required\n"); return -1; }
    if (o->threads < 1 || o->requests < 1 || o->concurrency < 1 || o->prompt_tokens < 1 ||
        o->gen_tokens < 1 || o->max_batch < 1 || o->max_batched_tokens < o->max_batch) {
        fprintf(stderr, "kilnd: bench-engine sizes must be positive (max-batched-tokens >= max-batch)\n");
        return -1;
    }
    if (o->concurrency > o->requests) o->concurrency = o->requests;
    return 0;
}

/* Prompts: from a file (one per line, tokenized) or synthetic. */
typedef struct {
    int32_t *toks;
    int *off, *len;
    int n;
} be_prompts;

static int load_prompts(const be_opts *o, const tok_t *tok, int n_vocab, be_prompts *p) {
    memset(p, 0, sizeof *p);
    if (!o->prompt_file) {
        p->n = 1;
        p->toks = malloc((size_t)o->prompt_tokens * o->requests * sizeof(int32_t));
        p->off = malloc(sizeof(int)), p->len = malloc(sizeof(int));
        if (!p->toks || !p->off || !p->len) return -1;
        p->off[0] = 0, p->len[0] = o->prompt_tokens;
        /* each request gets its own ids so the prefix cache does not flatter the result */
        for (int i = 0; i < o->prompt_tokens * o->requests; i++)
            p->toks[i] = (int32_t)(1000 + (7919u * (unsigned)i) % (unsigned)(n_vocab - 1000));
        return 0;
    }
    FILE *f = fopen(o->prompt_file, "r");
    if (!f) { fprintf(stderr, "kilnd: cannot open %s: %s\n", o->prompt_file, strerror(errno)); return -1; }
    char line[65536];
    size_t cap = 1 << 16, used = 0;
    int ncap = 64;
    prompt_builder pb; /* plain text, as a GEN with chat=0 */
    if (prompt_init(&pb, tok, CHAT_CHATML, sizeof line) < 0) { fclose(f); return -1; }
    p->toks = malloc(cap * sizeof(int32_t));
    p->off = malloc((size_t)ncap * sizeof(int)), p->len = malloc((size_t)ncap * sizeof(int));
    while (p->toks && p->off && p->len && fgets(line, sizeof line, f)) {
        size_t l = strcspn(line, "\n");
        if (l == 0) continue;
        line[l] = 0;
        prompt_req r = {.user = line, .user_len = l};
        int k = prompt_build(&pb, &r);
        if (k <= 0) continue;
        if (used + (size_t)k > cap) { cap = (used + (size_t)k) * 2; p->toks = realloc(p->toks, cap * sizeof(int32_t)); }
        if (p->n == ncap) { ncap *= 2; p->off = realloc(p->off, (size_t)ncap * sizeof(int)); p->len = realloc(p->len, (size_t)ncap * sizeof(int)); }
        if (!p->toks || !p->off || !p->len) break;
        memcpy(p->toks + used, pb.ids, (size_t)k * sizeof(int32_t));
        p->off[p->n] = (int)used, p->len[p->n] = k, p->n++;
        used += (size_t)k;
    }
    fclose(f);
    prompt_free(&pb);
    if (p->n == 0) { fprintf(stderr, "kilnd: no prompts in %s\n", o->prompt_file); return -1; }
    return 0;
}

/* ------------------------------------------------------------------ driving on the loop */

/* The engine runs on the cooperative loop through the server's driver (sched/drive.h):
 * a step is submitted and the loop sleeps in epoll until the backend's eventfd says it
 * finished. */
typedef struct {
    engine *eng;
    const kv_pool *kv;
    const be_opts *o;
    const be_prompts *pr;
    be_run *run;
    int kv_peak; /* most blocks in use after a step */
    loop_t *lp;
    int sent, err;
    /* the step in flight: start time, tokens and preemptions before it, decode only? */
    double t_step;
    int64_t tok0, pre0;
    int dec;
} bench_drv;

/* Before each step: keep `concurrency` requests in flight. */
static void before_step(void *ud) {
    bench_drv *d = ud;
    const be_opts *o = d->o;
    char err[256];
    while (!d->err && d->sent < o->requests && d->sent - d->run->finished < o->concurrency) {
        eng_params ep = {0};
        int pi = d->sent % d->pr->n;
        ep.prompt = d->pr->toks + (o->prompt_file ? d->pr->off[pi] : d->sent * o->prompt_tokens);
        ep.n_prompt = o->prompt_file ? d->pr->len[pi] : o->prompt_tokens;
        ep.n = 1, ep.ud = &d->run->reqs[d->sent], ep.ignore_eog = 1;
        sampler_params_default(&ep.sp);
        ep.sp.temperature = 0.0f;
        ep.sp.max_tokens = o->gen_tokens;
        d->run->reqs[d->sent].t_submit = now_s();
        if (eng_submit(d->eng, &ep, err, sizeof err) < 0) {
            fprintf(stderr, "kilnd: %s\n", err);
            d->err = 1;
            loop_stop(d->lp);
            return;
        }
        d->sent++;
    }
    eng_stats st;
    eng_get_stats(d->eng, &st);
    d->t_step = now_s(), d->tok0 = d->run->tokens, d->pre0 = st.preemptions;
    d->dec = d->run->n_ttft == d->sent; /* nobody still waits for a first token */
}

static void after_step(void *ud) {
    bench_drv *d = ud;
    eng_stats st;
    eng_get_stats(d->eng, &st);
    int used = d->kv->cfg.n_blocks - kv_free_blocks(d->kv);
    if (used > d->kv_peak) d->kv_peak = used;
    if (d->dec && st.preemptions == d->pre0) {
        d->run->dec_tokens += d->run->tokens - d->tok0;
        d->run->dec_s += now_s() - d->t_step;
    }
}

static void on_idle(void *ud, int pending) {
    bench_drv *d = ud;
    if (pending) {
        fprintf(stderr, "kilnd: the engine cannot schedule the waiting requests\n");
        d->err = 1;
    }
    loop_stop(d->lp); /* done, or stuck */
}

static void on_log(void *ud, int level, const char *msg) {
    bench_drv *d = ud;
    fprintf(stderr, "kilnd: %s\n", msg);
    if (level == DRIVE_LOG_ERROR) { /* offline, a failed step is the end of the run */
        d->err = 1;
        loop_stop(d->lp);
    }
}

int kd_bench_engine(int argc, char **argv) {
    be_opts o;
    if (parse(argc, argv, &o) < 0) return 2;
    char err[512];
    static model m;
    static tok_t tok;
    if (model_load(&m, o.model, err, sizeof err) < 0) { fprintf(stderr, "kilnd: %s\n", err); return 1; }
    if (tok_init_gguf(&tok, &m.gguf, err, sizeof err) < 0) { fprintf(stderr, "kilnd: %s\n", err); model_free(&m); return 1; }
    be_prompts pr;
    int rc = 1;
    kv_pool kv;
    mm_pool arena = {0};
    int kv_ok = 0;
    backend *be = NULL;
    engine *eng = NULL;
    be_run run = {0};
    if (load_prompts(&o, &tok, m.cfg.n_vocab, &pr) < 0) goto out;
    int longest = 0;
    for (int i = 0; i < pr.n; i++) longest = pr.len[i] > longest ? pr.len[i] : longest;
    int seq_len = longest + o.gen_tokens + 1;
    model_set_context(&m, seq_len);
    kv_config kc = {0};
    model_kv_shape(&m, &kc);
    kc.block_size = o.block_size;
    kc.max_seqs = o.concurrency;
    kc.max_blocks_per_seq = (seq_len + o.block_size - 1) / o.block_size;
    kc.n_blocks = o.kv_blocks ? o.kv_blocks : kc.max_blocks_per_seq * o.concurrency;
    if (!o.kv_blocks && o.kv_pool_mb > 0) /* the configured pool size, in whole blocks */
        kc.n_blocks = (int)(((size_t)o.kv_pool_mb << 20) / kv_block_bytes(&kc));
    kc.prefix_cache = o.prefix;
    if (!o.free_windows) kc.swa_window = 0;
    size_t kv_bytes = (size_t)kc.n_blocks * kv_block_bytes(&kc);
    kd_backend_want w = {o.backend, o.threads, o.max_batched_tokens, o.max_batch, seq_len, 0, kv_bytes,
                      kv_bytes, 0.9, 0, 1};
    if (!(be = kd_backend_open(&m, &w, &kc, &arena, &kv, err, sizeof err))) { fprintf(stderr, "kilnd: %s\n", err); goto out; }
    kv_ok = 1;
    eng_config ec = {.max_batch_size = o.max_batch, .max_batched_tokens = o.max_batched_tokens,
                     .max_seq_len = seq_len, .max_seqs = o.concurrency,
                     .max_queued_requests = o.concurrency, .prefix_caching = o.prefix,
                     .max_queued_tokens = o.max_queued_tokens};
    eng_callbacks cb = {on_token, on_finish};
    if (!(eng = eng_new(&ec, &m, &tok, &kv, be, &cb, err, sizeof err))) { fprintf(stderr, "kilnd: %s\n", err); goto out; }
    run.reqs = calloc((size_t)o.requests, sizeof *run.reqs);
    run.ttft = calloc((size_t)o.requests, sizeof *run.ttft);
    run.cap_itl = o.requests * o.gen_tokens;
    run.itl = calloc((size_t)run.cap_itl, sizeof *run.itl);
    if (!run.reqs || !run.ttft || !run.itl) goto out;
    g_run = &run;

    bench_drv d = {.eng = eng, .kv = &kv, .o = &o, .pr = &pr, .run = &run};
    drive dv = {0};
    drive_hooks dh = {before_step, after_step, on_idle, on_log, NULL, &d};
    if (!(d.lp = loop_new(1024, 16)) || drive_init(&dv, d.lp, eng, be, &kv, &dh) < 0) {
        fprintf(stderr, "kilnd: cannot set up the event loop\n");
        if (d.lp) loop_free(d.lp);
        goto out;
    }
    double t0 = now_s();
    drive_kick(&dv);
    int lr = d.err ? 0 : loop_run(d.lp);
    drive_free(&dv);
    loop_free(d.lp);
    if (lr < 0 || d.err || run.failed) goto out;
    double el = now_s() - t0;
    eng_stats st;
    eng_get_stats(eng, &st);
    qsort(run.ttft, (size_t)run.n_ttft, sizeof(double), cmp_d);
    qsort(run.itl, (size_t)run.n_itl, sizeof(double), cmp_d);
    double tps = run.tokens / el;
    double dtps = run.dec_s > 0 ? run.dec_tokens / run.dec_s : 0.0;
    if (o.json)
        printf("{\"requests\":%d,\"concurrency\":%d,\"prompt_tokens\":%d,\"gen_tokens\":%d,"
               "\"threads\":%d,\"elapsed_s\":%.3f,\"output_tok_s\":%.1f,\"req_s\":%.3f,"
               "\"ttft_p50_ms\":%.1f,\"ttft_p90_ms\":%.1f,\"ttft_p99_ms\":%.1f,"
               "\"itl_p50_ms\":%.2f,\"itl_p99_ms\":%.2f,\"steps\":%lld,\"preemptions\":%lld,\"decode_tok_s\":%.1f,"
               "\"kv_blocks\":%d,\"kv_peak_blocks\":%d,\"kv_window_freed\":%llu}\n",
               o.requests, o.concurrency, o.prompt_tokens, o.gen_tokens, o.threads, el, tps,
               o.requests / el, pct(run.ttft, run.n_ttft, 50) * 1e3, pct(run.ttft, run.n_ttft, 90) * 1e3,
               pct(run.ttft, run.n_ttft, 99) * 1e3, pct(run.itl, run.n_itl, 50) * 1e3,
               pct(run.itl, run.n_itl, 99) * 1e3, (long long)st.steps, (long long)st.preemptions,
               dtps, kv.cfg.n_blocks, d.kv_peak, (unsigned long long)kv.stats.swa_freed);
    else
        printf("bench-engine: requests=%d concurrency=%d prompt=%d gen=%d threads=%d: "
               "output_tok_s=%.1f req_s=%.2f ttft_ms p50=%.1f p90=%.1f p99=%.1f "
               "itl_ms p50=%.2f p99=%.2f steps=%lld preemptions=%lld decode_tok_s=%.1f "
               "kv_blocks=%d kv_peak_blocks=%d kv_window_freed=%llu\n",
               o.requests, o.concurrency, o.prompt_tokens, o.gen_tokens, o.threads, tps,
               o.requests / el, pct(run.ttft, run.n_ttft, 50) * 1e3, pct(run.ttft, run.n_ttft, 90) * 1e3,
               pct(run.ttft, run.n_ttft, 99) * 1e3, pct(run.itl, run.n_itl, 50) * 1e3,
               pct(run.itl, run.n_itl, 99) * 1e3, (long long)st.steps, (long long)st.preemptions,
               dtps, kv.cfg.n_blocks, d.kv_peak, (unsigned long long)kv.stats.swa_freed);
    rc = 0;
out:
    eng_free(eng);
    if (be) be->ops->destroy(be);
    if (kv_ok) kv_pool_free(&kv);
    mm_pool_free(&arena);
    free(run.reqs), free(run.ttft), free(run.itl);
    free(pr.toks), free(pr.off), free(pr.len);
    tok_free(&tok);
    model_free(&m);
    return rc;
}
