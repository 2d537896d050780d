/* bench: `kilnd bench`, single-stream prefill and decode straight through the backend. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kilnd/direct.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Prefill of prompt_tokens and single-stream decode of gen_tokens, best of `repeat`,
 * on token ids spread over the vocabulary (content does not change the cost). */
int kd_bench(int argc, char **argv) {
    dr_opts o;
    if (dr_parse(argc, argv, &o) < 0) { kd_usage(); return 2; }
    if (o.prompt_tokens < 1 || o.gen_tokens < 1 || o.repeat < 1) { fprintf(stderr, "kilnd: bad bench sizes\n"); return 2; }
    int ctx = o.prompt_tokens + o.gen_tokens;
    if (o.chunk < o.prompt_tokens) o.chunk = o.prompt_tokens > 4096 ? 4096 : o.prompt_tokens;
    dr_runner e;
    if (dr_load(&e, o.model) < 0) return 1;
    model_set_context(&e.m, ctx);
    if (dr_start(&e, o.backend, o.threads, ctx, o.chunk, 1, o.exact) < 0) {
        dr_close(&e);
        return 1;
    }
    int32_t *toks = malloc((size_t)ctx * sizeof *toks);
    if (!toks) { dr_close(&e); return 1; }
    for (int i = 0; i < ctx; i++) toks[i] = (int32_t)((1000 + 7919u * (unsigned)i) % (unsigned)e.m.cfg.n_vocab);
    double best_pp = 0, best_tg = 0;
    int rc = 0;
    for (int r = 0; r < o.repeat && rc == 0; r++) {
        kv_seq *seq = kv_seq_new(&e.kv);
        if (!seq || kv_seq_reserve(&e.kv, seq, ctx) < 0) { rc = 1; break; }
        double t0 = now_s();
        if (!dr_feed(&e, seq, toks, o.prompt_tokens, 0)) rc = 1;
        double t1 = now_s();
        for (int i = 0; i < o.gen_tokens && rc == 0; i++)
            if (!dr_feed(&e, seq, toks + o.prompt_tokens + i, 1, o.prompt_tokens + i)) rc = 1;
        double t2 = now_s();
        kv_seq_release(&e.kv, seq);
        double pp = o.prompt_tokens / (t1 - t0), tg = o.gen_tokens / (t2 - t1);
        fprintf(stderr, "kilnd bench: run %d: prefill %.1f tok/s, decode %.1f tok/s\n", r + 1, pp, tg);
        if (pp > best_pp) best_pp = pp;
        if (tg > best_tg) best_tg = tg;
    }
    if (rc == 0)
        printf("bench: threads=%d prompt_tokens=%d gen_tokens=%d prefill_tok_s=%.1f decode_tok_s=%.1f\n",
               o.threads, o.prompt_tokens, o.gen_tokens, best_pp, best_tg);
    free(toks);
    dr_close(&e);
    return rc;
}

