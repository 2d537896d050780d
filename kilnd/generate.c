/* generate: `kilnd generate`, one request from the command line, its text streamed to
 * stdout (or its ids, --ids) and its speed to stderr. The request takes the server's
 * path: its prompt is built by core/prompt, and it runs in the engine (sched/engine)
 * on the loop through the driver (sched/drive), so what generate prints is what a
 * client of `kilnd serve` gets, and the parity tests that run generate test that path.
 * --dump-prompt-logits is the exception: every prompt position's logits (the engine
 * asks for the last one only) come from the prompt run first straight through the same
 * backend (kilnd/direct) in the engine's prefill steps (--chunk tokens each), every
 * row's logits asked for; then the request runs as above. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/prompt.h"
#include "kilnd/direct.h"
#include "sched/drive.h"
#include "sched/engine.h"

/* ------------------------------------------------------------------ the prompt */

/* --prompt-ids 1,2,3 into ids (cap entries): the count, or -1 with the reason said. */
static int parse_ids(const char *s, const tok_t *tok, int32_t *ids, int cap) {
    int k = 0;
    for (const char *p = s; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= tok_n_vocab(tok) || k == cap) {
            fprintf(stderr, "kilnd: bad --prompt-ids near '%s'\n", p);
            return -1;
        }
        ids[k++] = (int32_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    return k;
}

/* The prompt's ids in pb->ids: explicit ids, or the text through core/prompt (the
 * template [model] chat_template = auto picks, as the server does by default). */
static int build_prompt(const dr_runner *e, const dr_opts *o, prompt_builder *pb) {
    if (!o->prompt_ids && !o->prompt) {
        fprintf(stderr, "kilnd: --prompt or --prompt-ids is required\n");
        return -1;
    }
    const char *text = o->prompt ? o->prompt : "";
    size_t in = o->prompt_ids ? strlen(o->prompt_ids) : strlen(text) + (o->system ? strlen(o->system) : 0);
    if (prompt_init(pb, &e->tok, prompt_chat_kind(&e->m.gguf, CFG_TEMPLATE_AUTO), in) < 0 ||
        prompt_template(pb, &e->m.gguf) < 0) {
        fprintf(stderr, "kilnd: out of memory\n");
        return -1;
    }
    if (o->prompt_ids) return parse_ids(o->prompt_ids, &e->tok, pb->ids, pb->ids_cap);
    prompt_req r = {.system = o->system, .user = text, .user_len = strlen(text), .chat = o->chat, .special = o->special};
    int n = prompt_build(pb, &r);
    if (n < 0) fprintf(stderr, "kilnd: %s\n", prompt_strerror(n));
    return n < 0 ? -1 : n;
}

/* ------------------------------------------------------------------ the request */

typedef struct {
    const dr_opts *o;
    loop_t *lp;
    int n_out;            /* ids printed */
    int finished, reason; /* enum eng_finish */
    eng_usage usage;
    char msg[256];        /* EF_ERROR's explanation */
} gen_run;

static void on_token(void *ud, int64_t id, int sample, int32_t tok, const char *text, int len,
                     float lp) {
    (void)id, (void)sample, (void)lp;
    gen_run *g = ud;
    if (g->o->ids) {
        if (tok >= 0) printf(g->n_out++ ? " %d" : "%d", tok);
    } else if (len > 0) {
        fwrite(text, 1, (size_t)len, stdout);
    }
    fflush(stdout);
}

static void on_finish(void *ud, int64_t id, int sample, int reason, const eng_usage *u,
                      const char *msg) {
    (void)id, (void)sample;
    gen_run *g = ud;
    g->finished = 1, g->reason = reason, g->usage = *u;
    snprintf(g->msg, sizeof g->msg, "%s", msg ? msg : "");
}

static void on_idle(void *ud, int pending) {
    gen_run *g = ud;
    if (pending) fprintf(stderr, "kilnd: the engine cannot schedule the request\n");
    loop_stop(g->lp);
}

static void on_log(void *ud, int level, const char *msg) {
    gen_run *g = ud;
    fprintf(stderr, "kilnd: %s\n", msg);
    if (level == DRIVE_LOG_ERROR) loop_stop(g->lp);
}

static int write_logits(const char *path, const float *lg, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(lg, sizeof(float), n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "kilnd: cannot write logits to %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* One engine with room for exactly this request (the prompt and what it may generate:
 * the backend started for that by dr_start) on a loop, the request submitted, the loop
 * run until the engine is idle. */
static int run_request(dr_runner *e, const dr_opts *o, const int32_t *prompt, int n_prompt,
                       int total, float *logits, gen_run *g) {
    char err[512];
    eng_config ec = {.max_batch_size = 1, .max_batched_tokens = o->chunk, .max_seq_len = total,
                     .max_seqs = 1, .max_queued_requests = 1};
    eng_callbacks cb = {on_token, on_finish};
    engine *eng = eng_new(&ec, &e->m, &e->tok, &e->kv, e->be, &cb, err, sizeof err);
    loop_t *lp = eng ? loop_new(1024, 8) : NULL;
    drive d = {0};
    drive_hooks dh = {.idle = on_idle, .log = on_log, .ud = g};
    int rc = -1;
    if (!eng) {
        fprintf(stderr, "kilnd: %s\n", err);
        goto out;
    }
    if (!lp || drive_init(&d, lp, eng, e->be, &e->kv, &dh) < 0) {
        fprintf(stderr, "kilnd: cannot set up the event loop\n");
        goto out;
    }
    g->lp = lp;
    eng_params ep = {.prompt = prompt, .n_prompt = n_prompt, .sp = o->sp, .n = 1,
                     .stops = o->stops, .n_stops = o->n_stops, .ud = g, .first_logits = logits};
    ep.sp.max_tokens = o->max_tokens;
    if (eng_submit(eng, &ep, err, sizeof err) < 0) {
        fprintf(stderr, "kilnd: %s\n", err);
        goto out;
    }
    drive_kick(&d);
    if (loop_run(lp) == 0 && g->finished) rc = 0;
out:
    drive_free(&d);
    if (lp) loop_free(lp);
    eng_free(eng);
    return rc;
}

int kd_generate(int argc, char **argv) {
    dr_opts o;
    if (dr_parse(argc, argv, &o) < 0) { kd_usage(); return 2; }
    stopper st; /* the engine's own check of the stop strings, before the model loads */
    if (stopper_init(&st, o.stops, o.n_stops) < 0) {
        fprintf(stderr, "kilnd: each --stop must be 1..%d bytes\n", STOPPER_MAX_LEN);
        return 2;
    }
    if (o.max_tokens == 0 && o.dump_logits) {
        fprintf(stderr, "kilnd: --dump-logits needs --max-tokens of at least 1\n");
        return 2;
    }
    dr_runner e;
    if (dr_load(&e, o.model) < 0) return 1;
    int ctx = o.ctx > 0 ? o.ctx : e.m.cfg.n_ctx_train;
    model_set_context(&e.m, ctx); /* the context asked for, not this request's length */
    prompt_builder pb = {0};
    float *logits = NULL, *prompt_logits = NULL;
    gen_run g = {.o = &o};
    int rc = 1;
    int n_prompt = build_prompt(&e, &o, &pb);
    if (n_prompt < 0) goto out;
    if (n_prompt == 0) { fprintf(stderr, "kilnd: the prompt is empty\n"); goto out; }
    int total = n_prompt + o.max_tokens;
    if (total > ctx) {
        fprintf(stderr, "kilnd: prompt (%d tokens) + max_tokens (%d) exceeds the context (%d)\n",
                n_prompt, o.max_tokens, ctx);
        goto out;
    }
    size_t n_vocab = (size_t)e.m.cfg.n_vocab;
    if ((o.dump_logits && !(logits = calloc(n_vocab, sizeof *logits))) ||
        (o.dump_prompt_logits && !(prompt_logits = malloc((size_t)n_prompt * n_vocab * sizeof *prompt_logits)))) {
        fprintf(stderr, "kilnd: out of memory\n");
        goto out;
    }
    /* every prompt row's logits: as many logit rows per step as tokens */
    int max_logits = o.dump_prompt_logits ? o.chunk : 1;
    if ((o.max_tokens > 0 || o.dump_prompt_logits) &&
        dr_start(&e, o.backend, o.threads, total, o.chunk, max_logits, o.exact) < 0) goto out;
    if (o.dump_prompt_logits && (dr_prompt_logits(&e, pb.ids, n_prompt, prompt_logits) < 0 ||
                                 write_logits(o.dump_prompt_logits, prompt_logits, (size_t)n_prompt * n_vocab) < 0))
        goto out;
    /* nothing to generate: the engine is not started (as the server answers at once) */
    if (o.max_tokens > 0 && run_request(&e, &o, pb.ids, n_prompt, total, logits, &g) < 0) goto out;
    if (g.finished && g.reason == EF_ERROR) {
        fprintf(stderr, "kilnd: step failed: %s\n", g.msg);
        goto out;
    }
    if (logits && write_logits(o.dump_logits, logits, n_vocab) < 0) goto out;
    printf("\n");
    fflush(stdout);
    const eng_usage *u = &g.usage;
    int n_gen = u->completion_tokens;
    double dec_s = u->e2e_s - u->ttft_s;
    fprintf(stderr, "kilnd: prompt %d tokens in %.3f s (%.1f tok/s), generated %d tokens in %.3f s "
            "(%.1f tok/s), finish=%s\n", n_prompt, u->ttft_s, u->ttft_s > 0 ? n_prompt / u->ttft_s : 0.0,
            n_gen, dec_s, n_gen > 1 && dec_s > 0 ? (n_gen - 1) / dec_s : 0.0,
            o.max_tokens == 0 || g.reason == EF_LENGTH ? "length" : "stop");
    rc = 0;
out:
    free(logits);
    free(prompt_logits);
    prompt_free(&pb);
    dr_close(&e);
    return rc;
}
