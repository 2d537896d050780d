/* direct: one request straight through the backend (kilnd/direct.h). */
#include "kilnd/direct.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/model.h"
#include "mm/kv.h"

void dr_close(dr_runner *e) {
    if (e->be) e->be->ops->destroy(e->be);
    if (e->loaded_kv) kv_pool_free(&e->kv);
    mm_pool_free(&e->arena);
    if (e->loaded_tok) tok_free(&e->tok);
    free(e->positions);
    free(e->seqs);
    free(e->rows);
    model_free(&e->m);
    memset(e, 0, sizeof *e);
}

/* Map the model and build its tokenizer. */
int dr_load(dr_runner *e, const char *path) {
    char err[512];
    memset(e, 0, sizeof *e);
    if (model_load(&e->m, path, err, sizeof err) < 0) {
        fprintf(stderr, "kilnd: %s\n", err);
        return -1;
    }
    if (tok_init_gguf(&e->tok, &e->m.gguf, err, sizeof err) < 0) {
        fprintf(stderr, "kilnd: tokenizer: %s\n", err);
        dr_close(e);
        return -1;
    }
    e->loaded_tok = 1;
    return 0;
}

/* The backend (CPU, or CUDA per --backend) and a KV pool for one sequence of up to ctx
 * positions, with prefill steps of up to chunk tokens and max_logits logit rows. */
int dr_start(dr_runner *e, int kind, int threads, int ctx, int chunk, int max_logits, int exact) {
    char err[512];
    kv_config kc = {0};
    model_kv_shape(&e->m, &kc);
    kc.block_size = DR_BLOCK_SIZE;
    kc.max_blocks_per_seq = (ctx + DR_BLOCK_SIZE - 1) / DR_BLOCK_SIZE;
    kc.n_blocks = kc.max_blocks_per_seq;
    kc.max_seqs = 1;
    size_t bytes = (size_t)kc.n_blocks * kv_block_bytes(&kc);
    kd_backend_want w = {kind, threads, chunk, max_logits, ctx, exact, bytes, bytes, 0.9, 0, 1};
    e->be = kd_backend_open(&e->m, &w, &kc, &e->arena, &e->kv, err, sizeof err);
    if (!e->be) {
        fprintf(stderr, "kilnd: %s\n", err);
        return -1;
    }
    e->loaded_kv = 1;
    e->chunk = chunk;
    e->positions = malloc((size_t)chunk * sizeof *e->positions);
    e->seqs = malloc((size_t)chunk * sizeof *e->seqs);
    e->rows = malloc((size_t)chunk * sizeof *e->rows);
    if (!e->positions || !e->seqs || !e->rows) {
        fprintf(stderr, "kilnd: out of memory\n");
        return -1;
    }
    for (int t = 0; t < chunk; t++) e->rows[t] = t;
    return 0;
}

/* Run n tokens of seq starting at position pos in steps of e->chunk; returns the logits
 * of the last token (owned by the backend) or NULL. */
const float *dr_feed(dr_runner *e, kv_seq *seq, const int32_t *toks, int n, int pos) {
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

/* Every position's logits of a prompt: dr_feed's steps with every row asked for. */
int dr_prompt_logits(dr_runner *e, const int32_t *toks, int n, float *out) {
    size_t nv = (size_t)e->m.cfg.n_vocab;
    kv_seq *seq = kv_seq_new(&e->kv);
    if (!seq || kv_seq_reserve(&e->kv, seq, n) < 0) {
        fprintf(stderr, "kilnd: no KV room for the prompt's %d positions\n", n);
        if (seq) kv_seq_release(&e->kv, seq);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < n; i += e->chunk) {
        int len = n - i < e->chunk ? n - i : e->chunk;
        for (int t = 0; t < len; t++) e->positions[t] = i + t, e->seqs[t] = seq;
        model_batch b = {len, toks + i, e->positions, e->seqs, len, e->rows};
        if (backend_run(e->be, &b) < 0) {
            fprintf(stderr, "kilnd: step failed: %s\n", e->be->err);
            rc = -1;
            break;
        }
        seq->n_tokens = i + len;
        memcpy(out + (size_t)i * nv, e->be->ops->logits(e->be), (size_t)len * nv * sizeof *out);
    }
    kv_seq_release(&e->kv, seq);
    return rc;
}

int dr_parse(int argc, char **argv, dr_opts *o) {
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
        else if (FLAG("--dump-prompt-logits")) { NEED_ARG(); o->dump_prompt_logits = v; }
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
            if (o->n_stops == DR_MAX_STOPS) { fprintf(stderr, "kilnd: at most %d --stop\n", DR_MAX_STOPS); return -1; }
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
