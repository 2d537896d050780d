/* generate: `kilnd generate`, one request from the command line, its text streamed to
 * stdout (or its ids, --ids) and its speed to stderr. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kilnd/direct.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int write_logits(const char *path, const float *lg, int n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(lg, sizeof(float), (size_t)n, f) != (size_t)n || fclose(f) != 0) {
        fprintf(stderr, "kilnd: cannot write logits to %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Print newly decoded text through the stop-string matcher. Returns 1 once stopped. */
static int emit_text(stopper *st, const char *piece, int n) {
    char out[1024];
    int stopped = 0;
    size_t k = stopper_feed(st, piece, (size_t)n, out, sizeof out, &stopped);
    fwrite(out, 1, k, stdout);
    fflush(stdout);
    return stopped;
}

int kd_generate(int argc, char **argv) {
    dr_opts o;
    if (dr_parse(argc, argv, &o) < 0) { kd_usage(); return 2; }
    dr_runner e;
    if (dr_load(&e, o.model) < 0) return 1;
    int ctx = o.ctx > 0 ? o.ctx : e.m.cfg.n_ctx_train;
    int32_t *prompt = NULL;
    int n_prompt = dr_prompt(&e, &o, &prompt);
    int rc = 1;
    sampler smp;
    int smp_ok = 0;
    kv_seq *seq = NULL;
    if (n_prompt < 0) goto out;
    if (n_prompt == 0) { fprintf(stderr, "kilnd: the prompt is empty\n"); goto out; }
    int total = n_prompt + o.max_tokens;
    if (total > ctx) {
        fprintf(stderr, "kilnd: prompt (%d tokens) + max_tokens (%d) exceeds the context (%d)\n",
                n_prompt, o.max_tokens, ctx);
        goto out;
    }
    /* The KV pool holds exactly this request: the prompt and what it may generate. */
    if (dr_start(&e, o.backend, o.threads, total, o.chunk, o.exact) < 0) goto out;
    if (sampler_init(&smp, &o.sp, e.m.cfg.n_vocab) < 0) { fprintf(stderr, "kilnd: bad sampling parameters\n"); goto out; }
    smp_ok = 1;
    for (int i = 0; i < n_prompt; i++) sampler_accept(&smp, prompt[i], 1);
    stopper st;
    if (stopper_init(&st, o.stops, o.n_stops) < 0) {
        fprintf(stderr, "kilnd: each --stop must be 1..%d bytes\n", STOPPER_MAX_LEN);
        goto out;
    }
    seq = kv_seq_new(&e.kv);
    if (!seq || kv_seq_reserve(&e.kv, seq, total) < 0) { fprintf(stderr, "kilnd: KV pool too small\n"); goto out; }

    double t0 = now_s();
    const float *lg = dr_feed(&e, seq, prompt, n_prompt, 0);
    if (!lg) goto out;
    double t1 = now_s();
    if (o.dump_logits && write_logits(o.dump_logits, lg, e.m.cfg.n_vocab) < 0) goto out;

    float *work = malloc((size_t)e.m.cfg.n_vocab * sizeof *work);
    tok_stream ts;
    tok_stream_init(&ts, &e.tok, 0);
    char *piece = malloc((size_t)TOK_STREAM_CAP(&e.tok));
    int n_gen = 0, stopped = 0;
    const char *reason = "length";
    while (work && piece && n_gen < o.max_tokens && !stopped) {
        memcpy(work, lg, (size_t)e.m.cfg.n_vocab * sizeof *work);
        int32_t id = sampler_sample(&smp, work, NULL);
        sampler_accept(&smp, id, 0);
        n_gen++;
        if (tok_is_eog(&e.tok, id)) { reason = "stop"; break; }
        if (o.ids) {
            printf(n_gen > 1 ? " %d" : "%d", id);
            fflush(stdout);
        } else {
            int k = tok_stream_push(&ts, id, piece, TOK_STREAM_CAP(&e.tok));
            if (k > 0 && emit_text(&st, piece, k)) { reason = "stop"; stopped = 1; break; }
        }
        if (n_gen == o.max_tokens) break;
        lg = dr_feed(&e, seq, &id, 1, n_prompt + n_gen - 1);
        if (!lg) goto out_free;
    }
    if (!o.ids && !stopped) {
        int k = tok_stream_flush(&ts, piece, TOK_STREAM_CAP(&e.tok));
        if (k > 0) emit_text(&st, piece, k);
        char rest[1024];
        size_t m = stopper_flush(&st, rest, sizeof rest);
        fwrite(rest, 1, m, stdout);
    }
    printf("\n");
    fflush(stdout);
    double t2 = now_s();
    fprintf(stderr, "kilnd: prompt %d tokens in %.3f s (%.1f tok/s), generated %d tokens in %.3f s "
            "(%.1f tok/s), finish=%s\n", n_prompt, t1 - t0, n_prompt / (t1 - t0), n_gen, t2 - t1,
            n_gen > 1 ? (n_gen - 1) / (t2 - t1) : 0.0, reason);
    rc = 0;
out_free:
    free(work);
    free(piece);
out:
    if (seq) kv_seq_release(&e.kv, seq);
    if (smp_ok) sampler_free(&smp);
    free(prompt);
    dr_close(&e);
    return rc;
}

