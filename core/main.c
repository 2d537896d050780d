/* kilnd: the kiln engine. `kilnd serve` is the appliance's main job (core/cli_serve.c);
 * the other subcommands run the engine core from the command line:
 *   kilnd serve [--config kiln.ini] [--set section.key=value]...
 *   kilnd certs --dir DIR
 *   kilnd generate --model PATH --prompt TEXT [--chat] [sampling flags]
 *   kilnd bench    --model PATH [--threads N] [--prompt-tokens N] [--gen-tokens N]
 *   kilnd tokenize / detokenize --model PATH ...   (see core/cli_tok.c) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/chat.h"
#include "core/cli_engine.h"
#include "core/cli_serve.h"
#include "core/cli_tok.h"
#include "core/model.h"
#include "core/sampler.h"
#include "core/tokenizer.h"
#include "mm/kv.h"

#define KILN_VERSION "0.1.0"
#define BLOCK_SIZE 16
#define MAX_STOPS 8

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------ one request, no scheduler */

/* Everything one generation needs: the model, the tokenizer, the pinned arena holding
 * the KV pool, and a backend. */
typedef struct {
    model m;
    tok_t tok;
    mm_pool arena;
    kv_pool kv;
    backend *be;
    int chunk;          /* prefill tokens per step */
    int32_t *positions; /* [chunk] step scratch */
    kv_seq **seqs;      /* [chunk] */
    int loaded_tok, loaded_kv;
} runner;

static void runner_close(runner *e) {
    if (e->be) e->be->ops->destroy(e->be);
    if (e->loaded_kv) kv_pool_free(&e->kv);
    mm_pool_free(&e->arena);
    if (e->loaded_tok) tok_free(&e->tok);
    free(e->positions);
    free(e->seqs);
    model_free(&e->m);
    memset(e, 0, sizeof *e);
}

/* Map the model and build its tokenizer. */
static int runner_load(runner *e, const char *path) {
    char err[512];
    memset(e, 0, sizeof *e);
    if (model_load(&e->m, path, err, sizeof err) < 0) {
        fprintf(stderr, "kilnd: %s\n", err);
        return -1;
    }
    if (tok_init_gguf(&e->tok, &e->m.gguf, err, sizeof err) < 0) {
        fprintf(stderr, "kilnd: tokenizer: %s\n", err);
        runner_close(e);
        return -1;
    }
    e->loaded_tok = 1;
    return 0;
}

/* The backend (CPU, or CUDA per --backend) and a KV pool for one sequence of up to ctx
 * positions, with prefill steps of up to chunk tokens. */
static int runner_start(runner *e, int kind, int threads, int ctx, int chunk, int exact) {
    char err[512];
    kv_config kc = {0};
    model_kv_shape(&e->m, &kc);
    kc.block_size = BLOCK_SIZE;
    kc.max_blocks_per_seq = (ctx + BLOCK_SIZE - 1) / BLOCK_SIZE;
    kc.n_blocks = kc.max_blocks_per_seq;
    kc.max_seqs = 1;
    size_t bytes = (size_t)kc.n_blocks * kv_block_bytes(&kc);
    backend_want w = {kind, threads, chunk, 1, ctx, exact, bytes, bytes, 0.9, 0, 1};
    e->be = backend_open(&e->m, &w, &kc, &e->arena, &e->kv, err, sizeof err);
    if (!e->be) {
        fprintf(stderr, "kilnd: %s\n", err);
        return -1;
    }
    e->loaded_kv = 1;
    e->chunk = chunk;
    e->positions = malloc((size_t)chunk * sizeof *e->positions);
    e->seqs = malloc((size_t)chunk * sizeof *e->seqs);
    if (!e->positions || !e->seqs) {
        fprintf(stderr, "kilnd: out of memory\n");
        return -1;
    }
    return 0;
}

/* Run n tokens of seq starting at position pos in steps of e->chunk; returns the logits
 * of the last token (owned by the backend) or NULL. */
static const float *runner_feed(runner *e, kv_seq *seq, const int32_t *toks, int n, int pos) {
    int32_t *positions = e->positions;
    kv_seq **seqs = e->seqs;
    for (int i = 0; i < n; i += e->chunk) {
        int len = n - i < e->chunk ? n - i : e->chunk;
        for (int t = 0; t < len; t++) positions[t] = pos + i + t, seqs[t] = seq;
        int32_t last = len - 1;
        int is_last = i + len == n;
        model_batch b = {len, toks + i, positions, seqs, is_last ? 1 : 0, &last};
        if (backend_run(e->be, &b) < 0) {
            fprintf(stderr, "kilnd: step failed: %s\n", e->be->err);
            return NULL;
        }
    }
    seq->n_tokens = pos + n;
    return e->be->ops->logits(e->be);
}

/* ------------------------------------------------------------------ flags */

typedef struct {
    const char *model, *prompt, *prompt_ids, *system, *dump_logits;
    int chat, ids, threads, max_tokens, ctx, chunk, special, exact, backend;
    int prompt_tokens, gen_tokens, repeat;
    sampler_params sp;
    const char *stops[MAX_STOPS];
    int n_stops;
} opts;

static void usage(void) {
    fprintf(stderr,
            "kilnd " KILN_VERSION " - the kiln inference engine\n"
            "usage:\n"
            "  kilnd serve [--config kiln.ini] [--model PATH] [--threads N]\n"
            "      [--set section.key=value]... [--control PATH]\n"
            "      serve the line protocol over TLS (PATH: kiln-init's control socket)\n"
            "  kilnd check-config [the same flags]   check config, model and TLS files\n"
            "  kilnd certs --dir DIR [--hosts h1,h2] [--force]\n"
            "      development CA, server and client certificates\n"
            "  kilnd generate --model PATH (--prompt TEXT | --prompt-ids 1,2,3) [options]\n"
            "      --chat              wrap the prompt in the model's chat template\n"
            "      --system TEXT       system message (with --chat)\n"
            "      --max-tokens N      tokens to generate (default 128)\n"
            "      --temperature F --top-k N --top-p F --min-p F --seed N\n"
            "      --repeat-penalty F --repeat-last-n N --presence-penalty F\n"
            "      --frequency-penalty F --stop TEXT (up to 8)\n"
            "      --threads N --ctx N --chunk N (prefill tokens per step)\n"
            "      --backend auto|cpu|cuda (auto: the GPU when this kilnd has CUDA and one)\n"
            "      --ids               print generated token ids instead of text\n"
            "      --dump-logits FILE  write the last prompt position's logits (f32)\n"
            "      --exact             f32 activations, no 8-bit rounding (slow; for\n"
            "                          comparing with an f32 reference)\n"
            "  kilnd bench --model PATH [--threads N] [--prompt-tokens 512] [--gen-tokens 128]\n"
            "      [--repeat 3]\n"
            "  kilnd bench-engine --model PATH [--requests N] [--concurrency C]\n"
            "      [--prompt-tokens P | --prompt-file F] [--gen-tokens G] [--max-batch B]\n"
            "      [--max-batched-tokens T] [--kv-blocks N] [--prefix-caching 0|1] [--backend B] [--json]\n"
            "  kilnd tokenize --model PATH (--text TEXT | --hex) [--special]\n"
            "  kilnd detokenize --model PATH --hex\n"
            "  kilnd version\n");
}

static int parse_opts(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    o->threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (o->threads < 1) o->threads = 1;
    o->max_tokens = 128, o->chunk = 256, o->prompt_tokens = 512, o->gen_tokens = 128;
    o->repeat = 3;
    sampler_params_default(&o->sp);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define FLAG(name) (strcmp(a, name) == 0)
#define NEED_ARG() do { if (!v) { fprintf(stderr, "kilnd: %s needs a value\n", a); return -1; } i++; } while (0)
        if (FLAG("--chat")) o->chat = 1;
        else if (FLAG("--ids")) o->ids = 1;
        else if (FLAG("--special")) o->special = 1;
        else if (FLAG("--exact")) o->exact = 1;
        else if (FLAG("--model")) { NEED_ARG(); o->model = v; }
        else if (FLAG("--prompt")) { NEED_ARG(); o->prompt = v; }
        else if (FLAG("--prompt-ids")) { NEED_ARG(); o->prompt_ids = v; }
        else if (FLAG("--system")) { NEED_ARG(); o->system = v; }
        else if (FLAG("--dump-logits")) { NEED_ARG(); o->dump_logits = v; }
        else if (FLAG("--threads")) { NEED_ARG(); o->threads = atoi(v); }
        else if (FLAG("--backend")) {
            NEED_ARG();
            o->backend = !strcmp(v, "cpu") ? CFG_BACKEND_CPU : !strcmp(v, "cuda") ? CFG_BACKEND_CUDA
                       : !strcmp(v, "auto") ? CFG_BACKEND_AUTO : -1;
            if (o->backend < 0) { fprintf(stderr, "kilnd: --backend is auto, cpu or cuda\n"); return -1; }
        }
        else if (FLAG("--max-tokens")) { NEED_ARG(); o->max_tokens = atoi(v); }
        else if (FLAG("--ctx")) { NEED_ARG(); o->ctx = atoi(v); }
        else if (FLAG("--chunk")) { NEED_ARG(); o->chunk = atoi(v); }
        else if (FLAG("--prompt-tokens")) { NEED_ARG(); o->prompt_tokens = atoi(v); }
        else if (FLAG("--gen-tokens")) { NEED_ARG(); o->gen_tokens = atoi(v); }
        else if (FLAG("--repeat")) { NEED_ARG(); o->repeat = atoi(v); }
        else if (FLAG("--temperature")) { NEED_ARG(); o->sp.temperature = strtof(v, NULL); }
        else if (FLAG("--top-k")) { NEED_ARG(); o->sp.top_k = atoi(v); }
        else if (FLAG("--top-p")) { NEED_ARG(); o->sp.top_p = strtof(v, NULL); }
        else if (FLAG("--min-p")) { NEED_ARG(); o->sp.min_p = strtof(v, NULL); }
        else if (FLAG("--seed")) { NEED_ARG(); o->sp.seed = strtoull(v, NULL, 10); }
        else if (FLAG("--repeat-penalty")) { NEED_ARG(); o->sp.repeat_penalty = strtof(v, NULL); }
        else if (FLAG("--repeat-last-n")) { NEED_ARG(); o->sp.repeat_last_n = atoi(v); }
        else if (FLAG("--presence-penalty")) { NEED_ARG(); o->sp.presence_penalty = strtof(v, NULL); }
        else if (FLAG("--frequency-penalty")) { NEED_ARG(); o->sp.frequency_penalty = strtof(v, NULL); }
        else if (FLAG("--stop")) {
            NEED_ARG();
            if (o->n_stops == MAX_STOPS) { fprintf(stderr, "kilnd: at most %d --stop\n", MAX_STOPS); return -1; }
            o->stops[o->n_stops++] = v;
        } else {
            fprintf(stderr, "kilnd: unknown flag '%s'\n", a);
            return -1;
        }
#undef FLAG
#undef NEED_ARG
    }
    if (!o->model) { fprintf(stderr, "kilnd: --model PATH is required\n"); return -1; }
    if (o->threads < 1 || o->threads > 256) { fprintf(stderr, "kilnd: --threads must be 1..256\n"); return -1; }
    if (o->max_tokens < 0) { fprintf(stderr, "kilnd: --max-tokens must be >= 0\n"); return -1; }
    if (o->chunk < 1 || o->chunk > 4096) { fprintf(stderr, "kilnd: --chunk must be 1..4096\n"); return -1; }
    return 0;
}

/* ------------------------------------------------------------------ prompt */

/* Token ids of the prompt: explicit ids, or the text (chat-formatted when asked). */
static int build_prompt(const runner *e, const opts *o, int32_t **out) {
    if (o->prompt_ids) {
        size_t n = strlen(o->prompt_ids) / 2 + 2;
        int32_t *ids = malloc(n * sizeof *ids);
        int k = 0;
        for (const char *p = o->prompt_ids; ids && *p;) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v >= tok_n_vocab(&e->tok)) {
                fprintf(stderr, "kilnd: bad --prompt-ids near '%s'\n", p);
                free(ids);
                return -1;
            }
            ids[k++] = (int32_t)v;
            p = *end == ',' ? end + 1 : end;
        }
        *out = ids;
        return ids ? k : -1;
    }
    if (!o->prompt) { fprintf(stderr, "kilnd: --prompt or --prompt-ids is required\n"); return -1; }
    const char *text = o->prompt;
    char *formatted = NULL;
    if (o->chat) {
        size_t cap = strlen(o->prompt) + (o->system ? strlen(o->system) : 0) + 4096;
        formatted = malloc(cap);
        chat_msg msgs[2];
        int n = 0;
        if (o->system) msgs[n++] = (chat_msg){"system", o->system};
        msgs[n++] = (chat_msg){"user", o->prompt};
        int kind = chat_detect(&e->m.gguf);
        int len = formatted ? chat_format(kind, msgs, n, 1, formatted, cap) : -1;
        if (len < 0) {
            fprintf(stderr, "kilnd: cannot apply the chat template\n");
            free(formatted);
            return -1;
        }
        text = formatted;
    }
    size_t len = strlen(text);
    int32_t *ids = malloc((len + 2) * sizeof *ids);
    int n = ids ? tok_encode(&e->tok, text, len, o->chat || o->special, ids, (int)len + 2) : -1;
    free(formatted);
    if (n < 0) {
        fprintf(stderr, "kilnd: tokenizing the prompt failed\n");
        free(ids);
        return -1;
    }
    *out = ids;
    return n;
}

/* ------------------------------------------------------------------ generate */

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

static int cmd_generate(int argc, char **argv) {
    opts o;
    if (parse_opts(argc, argv, &o) < 0) { usage(); return 2; }
    runner e;
    if (runner_load(&e, o.model) < 0) return 1;
    int ctx = o.ctx > 0 ? o.ctx : e.m.cfg.n_ctx_train;
    int32_t *prompt = NULL;
    int n_prompt = build_prompt(&e, &o, &prompt);
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
    if (runner_start(&e, o.backend, o.threads, total, o.chunk, o.exact) < 0) goto out;
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
    const float *lg = runner_feed(&e, seq, prompt, n_prompt, 0);
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
        lg = runner_feed(&e, seq, &id, 1, n_prompt + n_gen - 1);
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
    runner_close(&e);
    return rc;
}

/* ------------------------------------------------------------------ bench */

/* Prefill of prompt_tokens and single-stream decode of gen_tokens, best of `repeat`,
 * on token ids spread over the vocabulary (content does not change the cost). */
static int cmd_bench(int argc, char **argv) {
    opts o;
    if (parse_opts(argc, argv, &o) < 0) { usage(); return 2; }
    if (o.prompt_tokens < 1 || o.gen_tokens < 1 || o.repeat < 1) { fprintf(stderr, "kilnd: bad bench sizes\n"); return 2; }
    int ctx = o.prompt_tokens + o.gen_tokens;
    if (o.chunk < o.prompt_tokens) o.chunk = o.prompt_tokens > 4096 ? 4096 : o.prompt_tokens;
    runner e;
    if (runner_load(&e, o.model) < 0) return 1;
    if (runner_start(&e, o.backend, o.threads, ctx, o.chunk, o.exact) < 0) {
        runner_close(&e);
        return 1;
    }
    int32_t *toks = malloc((size_t)ctx * sizeof *toks);
    if (!toks) { runner_close(&e); return 1; }
    for (int i = 0; i < ctx; i++) toks[i] = (int32_t)((1000 + 7919u * (unsigned)i) % (unsigned)e.m.cfg.n_vocab);
    double best_pp = 0, best_tg = 0;
    int rc = 0;
    for (int r = 0; r < o.repeat && rc == 0; r++) {
        kv_seq *seq = kv_seq_new(&e.kv);
        if (!seq || kv_seq_reserve(&e.kv, seq, ctx) < 0) { rc = 1; break; }
        double t0 = now_s();
        if (!runner_feed(&e, seq, toks, o.prompt_tokens, 0)) rc = 1;
        double t1 = now_s();
        for (int i = 0; i < o.gen_tokens && rc == 0; i++)
            if (!runner_feed(&e, seq, toks + o.prompt_tokens + i, 1, o.prompt_tokens + i)) rc = 1;
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
    runner_close(&e);
    return rc;
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv) {
    if (argc < 2) { usage(); return 2; }
    const char *cmd = argv[1];
    if (strcmp(cmd, "serve") == 0) return cli_serve(argc - 1, argv + 1);
    if (strcmp(cmd, "certs") == 0) return cli_certs(argc - 1, argv + 1);
    if (strcmp(cmd, "check-config") == 0) return cli_check_config(argc - 1, argv + 1);
    if (strcmp(cmd, "generate") == 0) return cmd_generate(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0) return cmd_bench(argc - 1, argv + 1);
    if (strcmp(cmd, "bench-engine") == 0) return cli_bench_engine(argc - 1, argv + 1);
    if (strcmp(cmd, "tokenize") == 0) return cli_tokenize(argc - 1, argv + 1);
    if (strcmp(cmd, "detokenize") == 0) return cli_detokenize(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("kilnd " KILN_VERSION "\n");
        return 0;
    }
    if (strcmp(cmd, "help") != 0 && strcmp(cmd, "--help") != 0 && strcmp(cmd, "-h") != 0)
        fprintf(stderr, "kilnd: unknown command '%s'\n", cmd);
    usage();
    return strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 ? 0 : 2;
}
