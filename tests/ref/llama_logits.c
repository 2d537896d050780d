/* llama_logits: llama.cpp's logits for fixed prompts, recorded for tests/ref/llama_parity.py.
 *
 *   llama_logits --model PATH [--top-k 32] [--threads 1] [--flash-attn auto|on|off]
 *                [--override KEY=STRING]... [--meta KEY=VALUE]...
 *                --prompt NAME=ID,ID,... [--prompt ...]
 *
 * Links against the peer's static libraries (build/peer/cmake, tests/bench/peer.sh);
 * tests/ref/record_logits.sh builds and runs it. Not part of make test: CI never builds
 * llama.cpp, it reads the JSON this prints (tests/ref/logits/<model>.json).
 *
 * Each prompt is one llama_decode of one batch, every position's logits requested, on
 * the CPU, from an empty KV cache, positions 0..n-1 in sequence 0, no BOS added (the ids
 * are what the model sees). Per position it writes the top-K ids by logit (ties by id)
 * with their log-softmax over the whole vocabulary (computed in double from llama.cpp's
 * f32 logits) and the raw margin logit[top1] - logit[top2]. An id out of the vocabulary
 * or an end-of-generation id in a prompt is refused (a reference must be for positions
 * a generation can reach). --override sets a string metadata key as llama.cpp reads it
 * (llama_model_kv_override), e.g. a pre-tokenizer name it spells differently; --meta
 * pairs are copied into the JSON as strings. Output: JSON on stdout, one line per
 * position; llama.cpp's warnings and errors go to stderr. Exit 0, 1 on a failure (said
 * on stderr), 2 on usage. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

#define MAX_PROMPTS 64
#define MAX_META 16
#define MAX_OVERRIDES 8
#define MAX_TOP_K 256

typedef struct {
    char name[64];
    llama_token *ids; /* [n] */
    int n;
} prompt;

typedef struct {
    const char *model, *flash_attn;
    int top_k, threads;
    const char *meta[MAX_META]; /* "KEY=VALUE" */
    int n_meta;
    struct llama_model_kv_override ov[MAX_OVERRIDES + 1]; /* the last one's key empty */
    int n_ov;
    prompt prompts[MAX_PROMPTS];
    int n_prompts;
} opts;

/* ------------------------------------------------------------------ arguments */

static void usage(void) {
    fprintf(stderr,
            "usage: llama_logits --model PATH [--top-k 32] [--threads 1] [--flash-attn auto|on|off]\n"
            "                    [--override KEY=STRING]... [--meta KEY=VALUE]...\n"
            "                    --prompt NAME=ID,ID,... [--prompt ...]\n");
}

/* "NAME=1,2,3" into p: 0, or -1 with the reason said. Range checks against the
 * vocabulary come later, once the model is loaded. */
static int parse_prompt(const char *s, prompt *p) {
    const char *eq = strchr(s, '=');
    size_t nl = eq ? (size_t)(eq - s) : 0;
    if (!eq || nl == 0 || nl >= sizeof p->name) {
        fprintf(stderr, "llama_logits: --prompt wants NAME=ID,ID,... (NAME 1..63 chars): '%s'\n", s);
        return -1;
    }
    for (size_t i = 0; i < nl; i++)
        if (!(s[i] == '-' || s[i] == '_' || (s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'z') ||
              (s[i] >= 'A' && s[i] <= 'Z'))) {
            fprintf(stderr, "llama_logits: prompt name '%.*s': letters, digits, '-' and '_' only\n", (int)nl, s);
            return -1;
        }
    memcpy(p->name, s, nl);
    p->name[nl] = 0;
    size_t cap = 1;
    for (const char *c = eq + 1; *c; c++) cap += *c == ',';
    p->ids = malloc(cap * sizeof *p->ids);
    if (!p->ids) { fprintf(stderr, "llama_logits: out of memory\n"); return -1; }
    p->n = 0;
    for (const char *c = eq + 1;;) {
        char *end;
        errno = 0;
        long v = strtol(c, &end, 10);
        if (end == c || errno || v < 0 || v > 0x7fffffffL || (*end && *end != ',')) {
            fprintf(stderr, "llama_logits: prompt %s: bad id near '%s'\n", p->name, c);
            return -1;
        }
        p->ids[p->n++] = (llama_token)v;
        if (!*end) break;
        c = end + 1;
    }
    return 0;
}

static int parse_args(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    o->top_k = 32, o->threads = 1, o->flash_attn = "auto";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "llama_logits: %s needs a value\n", a); return -1; }
        i++;
        if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--top-k")) o->top_k = atoi(v);
        else if (!strcmp(a, "--threads")) o->threads = atoi(v);
        else if (!strcmp(a, "--flash-attn")) o->flash_attn = v;
        else if (!strcmp(a, "--meta")) {
            const char *eq = strchr(v, '=');
            if (!eq || eq == v || o->n_meta == MAX_META) {
                fprintf(stderr, "llama_logits: --meta wants KEY=VALUE (at most %d)\n", MAX_META);
                return -1;
            }
            o->meta[o->n_meta++] = v;
        } else if (!strcmp(a, "--override")) {
            const char *eq = strchr(v, '=');
            struct llama_model_kv_override *ov = &o->ov[o->n_ov];
            if (!eq || eq == v || (size_t)(eq - v) >= sizeof ov->key || strlen(eq + 1) >= sizeof ov->val_str ||
                o->n_ov == MAX_OVERRIDES) {
                fprintf(stderr, "llama_logits: --override wants KEY=STRING (each < 128 bytes, at most %d)\n",
                        MAX_OVERRIDES);
                return -1;
            }
            ov->tag = LLAMA_KV_OVERRIDE_TYPE_STR;
            memcpy(ov->key, v, (size_t)(eq - v));
            strcpy(ov->val_str, eq + 1);
            o->n_ov++;
        } else if (!strcmp(a, "--prompt")) {
            if (o->n_prompts == MAX_PROMPTS) { fprintf(stderr, "llama_logits: at most %d prompts\n", MAX_PROMPTS); return -1; }
            if (parse_prompt(v, &o->prompts[o->n_prompts++]) < 0) return -1;
        } else {
            fprintf(stderr, "llama_logits: unknown flag '%s'\n", a);
            return -1;
        }
    }
    if (!o->model) { fprintf(stderr, "llama_logits: --model PATH is required\n"); return -1; }
    if (o->n_prompts == 0) { fprintf(stderr, "llama_logits: at least one --prompt\n"); return -1; }
    if (o->top_k < 2 || o->top_k > MAX_TOP_K) { fprintf(stderr, "llama_logits: --top-k must be 2..%d\n", MAX_TOP_K); return -1; }
    if (o->threads < 1 || o->threads > 64) { fprintf(stderr, "llama_logits: --threads must be 1..64\n"); return -1; }
    if (strcmp(o->flash_attn, "auto") && strcmp(o->flash_attn, "on") && strcmp(o->flash_attn, "off")) {
        fprintf(stderr, "llama_logits: --flash-attn is auto, on or off\n");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ output */

/* s as a JSON string (control characters escaped). */
static void json_str(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') printf("\\n");
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

/* Is logit a ranked above logit b (larger, or equal with the smaller id)? */
static int above(const float *lg, int a, int b) {
    return lg[a] > lg[b] || (lg[a] == lg[b] && a < b);
}

/* One position: top-k ids in top[] (insertion into a sorted list: k is small), the
 * log-softmax in double. -1 when a logit is not finite. */
static int position(const float *lg, int n_vocab, int k, int *top, const char *pname, int pos) {
    int n = 0;
    float mx = -INFINITY;
    for (int v = 0; v < n_vocab; v++) {
        if (!isfinite(lg[v])) {
            fprintf(stderr, "llama_logits: prompt %s position %d: logit of id %d is %g\n", pname, pos, v, lg[v]);
            return -1;
        }
        if (lg[v] > mx) mx = lg[v];
        if (n == k && !above(lg, v, top[k - 1])) continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && above(lg, v, top[j - 1])) top[j] = top[j - 1], j--;
        top[j] = v;
    }
    double sum = 0;
    for (int v = 0; v < n_vocab; v++) sum += exp((double)lg[v] - mx);
    double lse = mx + log(sum);
    printf("{\"margin\": %.6f, \"ids\": [", (double)lg[top[0]] - (double)lg[top[1]]);
    for (int j = 0; j < k; j++) printf(j ? ", %d" : "%d", top[j]);
    printf("], \"logprobs\": [");
    for (int j = 0; j < k; j++) printf(j ? ", %.6f" : "%.6f", (double)lg[top[j]] - lse);
    printf("]}");
    return 0;
}

static void quiet_log(enum ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    if (level >= GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_CONT) fputs(text, stderr);
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv) {
    opts o;
    if (parse_args(argc, argv, &o) < 0) { usage(); return 2; }
    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    int rc = 1, max_n = 0;
    struct llama_model *model = NULL;
    struct llama_context *ctx = NULL;
    struct llama_batch batch = {0};
    int have_batch = 0;
    int *top = malloc((size_t)o.top_k * sizeof *top);
    if (!top) { fprintf(stderr, "llama_logits: out of memory\n"); goto out; }

    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    if (o.n_ov) mp.kv_overrides = o.ov;
    model = llama_model_load_from_file(o.model, mp);
    if (!model) { fprintf(stderr, "llama_logits: llama.cpp cannot load %s (its log above says why)\n", o.model); goto out; }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    if (n_vocab < o.top_k) { fprintf(stderr, "llama_logits: vocabulary of %d < --top-k %d\n", n_vocab, o.top_k); goto out; }
    for (int p = 0; p < o.n_prompts; p++) {
        const prompt *pr = &o.prompts[p];
        for (int i = 0; i < pr->n; i++) {
            if (pr->ids[i] >= n_vocab) {
                fprintf(stderr, "llama_logits: prompt %s: id %d is outside the vocabulary (%d)\n", pr->name, pr->ids[i], n_vocab);
                goto out;
            }
            if (llama_vocab_is_eog(vocab, pr->ids[i])) {
                fprintf(stderr, "llama_logits: prompt %s: id %d is an end-of-generation id of %s\n", pr->name, pr->ids[i], o.model);
                goto out;
            }
        }
        if (pr->n > max_n) max_n = pr->n;
    }

    /* one context for all prompts, its KV cache cleared before each; a batch of the
     * longest prompt is one ubatch, so each prompt is one graph evaluation */
    struct llama_context_params cp = llama_context_default_params();
    uint32_t n_ctx = ((uint32_t)max_n + 255) / 256 * 256;
    cp.n_ctx = n_ctx, cp.n_batch = n_ctx, cp.n_ubatch = n_ctx, cp.n_seq_max = 1;
    cp.n_threads = o.threads, cp.n_threads_batch = o.threads;
    cp.flash_attn_type = !strcmp(o.flash_attn, "on")    ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                         : !strcmp(o.flash_attn, "off") ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                                        : LLAMA_FLASH_ATTN_TYPE_AUTO;
    cp.no_perf = 1;
    ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "llama_logits: llama.cpp cannot make a context for %s\n", o.model); goto out; }
    batch = llama_batch_init(max_n, 0, 1);
    have_batch = 1;

    printf("{\n");
    for (int m = 0; m < o.n_meta; m++) {
        const char *eq = strchr(o.meta[m], '=');
        printf("  ");
        json_str(o.meta[m], (size_t)(eq - o.meta[m]));
        printf(": ");
        json_str(eq + 1, strlen(eq + 1));
        printf(",\n");
    }
    printf("  \"llama_cpp_version\": ");
    json_str(llama_version(), strlen(llama_version()));
    printf(",\n  \"system_info\": ");
    json_str(llama_print_system_info(), strlen(llama_print_system_info()));
    printf(",\n  \"settings\": {\"threads\": %d, \"flash_attn\": \"%s\", \"n_ubatch\": %u, \"kv_type\": \"f16\", "
           "\"bos_added\": false, \"overrides\": [", o.threads, o.flash_attn, n_ctx);
    for (int i = 0; i < o.n_ov; i++) {
        char kv[300];
        int n = snprintf(kv, sizeof kv, "%s=%s", o.ov[i].key, o.ov[i].val_str);
        if (i) printf(", ");
        json_str(kv, (size_t)n);
    }
    printf("]},\n");
    printf("  \"n_vocab\": %d,\n  \"top_k\": %d,\n  \"prompts\": [\n", n_vocab, o.top_k);
    for (int p = 0; p < o.n_prompts; p++) {
        const prompt *pr = &o.prompts[p];
        llama_memory_clear(llama_get_memory(ctx), 1);
        batch.n_tokens = pr->n;
        for (int i = 0; i < pr->n; i++) {
            batch.token[i] = pr->ids[i];
            batch.pos[i] = i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = 1;
        }
        int32_t r = llama_decode(ctx, batch);
        if (r != 0) {
            fprintf(stderr, "llama_logits: prompt %s: llama_decode returned %d\n", pr->name, (int)r);
            goto out;
        }
        printf("    {\"name\": \"%s\", \"ids\": [", pr->name);
        for (int i = 0; i < pr->n; i++) printf(i ? ", %d" : "%d", pr->ids[i]);
        printf("], \"positions\": [\n");
        for (int i = 0; i < pr->n; i++) {
            const float *lg = llama_get_logits_ith(ctx, i);
            if (!lg) { fprintf(stderr, "llama_logits: prompt %s: no logits for position %d\n", pr->name, i); goto out; }
            printf("      ");
            if (position(lg, n_vocab, o.top_k, top, pr->name, i) < 0) goto out;
            printf(i + 1 < pr->n ? ",\n" : "\n");
        }
        printf(p + 1 < o.n_prompts ? "    ]},\n" : "    ]}\n");
    }
    printf("  ]\n}\n");
    if (fflush(stdout) != 0 || ferror(stdout)) { fprintf(stderr, "llama_logits: writing stdout: %s\n", strerror(errno)); goto out; }
    rc = 0;
out:
    if (have_batch) llama_batch_free(batch);
    if (ctx) llama_free(ctx);
    if (model) llama_model_free(model);
    llama_backend_free();
    for (int p = 0; p < o.n_prompts; p++) free(o.prompts[p].ids);
    free(top);
    return rc;
}
