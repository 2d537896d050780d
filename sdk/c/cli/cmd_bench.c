/* cmd_bench.c: `kiln bench` - keep C requests in flight over K connections and measure
 * what the client sees: request throughput, output tokens/s, time to first token,
 * inter-token latency, errors by code, and lost requests (submitted but never ended,
 * which must be 0). With --openai URL the same load goes to any OpenAI-compatible server
 * as streaming chat over HTTP (bench_oai.c), measured and reported the same way.
 *
 * One thread per connection: a kiln_client belongs to one thread at a time, and a
 * thread blocked in kiln_pump (poll) costs no CPU, where one thread round-robining K
 * clients with zero timeouts would spin on the 2 cores the server also needs. Shared
 * counters and samples are under one mutex; the critical sections are a few adds. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

#define MAX_CONCURRENCY 4096
#define MAX_CONNECTIONS 256
#define SERVER_PER_CONN 64        /* kilnd's default [net] max_requests_per_conn */
#define PROMPT_FILE_MAX (64u << 20)
#define PROMPT_FILE_LINES 1000000
#define SAMPLES_CAP (1u << 20)    /* latency samples kept exactly per kind */

typedef struct worker worker;

typedef struct {
    worker *w;
    int busy, cancel_sent;
    kiln_req h;
    double t_submit, t_last;
    int got_first;
} slot;


struct worker {
    bench *b;
    int k;
    kiln_client *c;
    int n_slots, inflight;
    slot *slots;
    char *prompt_buf; /* the synthetic prompt being sent (libkiln copies it) */
    size_t prompt_cap;
};

static void bench_help(void) {
    printf("usage: kiln bench [flags]\n"
           "Keeps C generation requests in flight over K connections until N requests\n"
           "were sent (or S seconds passed), then reports what the client measured:\n"
           "request throughput, output tokens/s, time to first token (TTFT: submit to\n"
           "first text), inter-token latency (ITL: between consecutive token lines of a\n"
           "request), end-to-end latency, errors by code, and lost requests (submitted but\n"
           "never ended; always 0 unless something is broken). Requests use ignore_eos, so\n"
           "each makes exactly --max-tokens tokens (unless a --stop string matches).\n\n"
           "  --concurrency C     requests in flight (default 8, at most %d)\n"
           "  --requests N        requests to send (default 100)\n"
           "  --duration S        send for S seconds instead, then let those finish\n"
           "  --prompt-tokens P   synthetic prompt of about P tokens (default 128): the\n"
           "                      request number, then repeated common words (unique\n"
           "                      starts, so the prefix cache does not serve them)\n"
           "  --prompt-file F     one prompt per line (empty lines skipped), cycled\n"
           "  --max-tokens G      tokens per request (default 128)\n"
           "  --connections K     clients to spread C over (default min(C, 4), more\n"
           "                      when C/K would exceed the server's %d per connection);\n"
           "                      each holds a connection per host (x --connections-per-host)\n"
           "                      and sends each request over its least busy one\n"
           "  --json              one JSON object on stdout\n"
           "  --csv               a CSV header and one row on stdout\n"
           "  --no-progress       no progress bar (drawn on stderr only when a terminal)\n"
           "  -v, --verbose       connection details and retries on stderr\n"
           "  --openai URL        drive an OpenAI-compatible server instead (kilnd's\n"
           "                      https://host:8443, llama-server's http://host:8080; a\n"
           "                      path such as /v1 is the API base): C connections (not\n"
           "                      --connections/--connections-per-host), each\n"
           "                      one streaming POST .../chat/completions at a time\n"
           "                      (keep-alive), the prompt as one user message, stream_options\n"
           "                      include_usage, temperature 0 unless --temperature; tokens\n"
           "                      from the usage chunk, TTFT to the first content delta.\n"
           "                      --token is sent as a Bearer token, --ca checks https\n"
           "  --openai-extra J    body fields added to each request, as JSON members\n"
           "                      (default '\"ignore_eos\":true'; '' for none)\n"
           "  --openai-model M    the request's model (default: the first of GET /v1/models)\n"
           "                      (other sampling flags are not sent: use --openai-extra)\n"
           "Sampling flags as for generate (--temperature, --top-k, ...); chat mode is off\n"
           "unless --chat. Ctrl-C stops sending, cancels what is in flight and reports.\n"
           "Exit status 1 when requests were lost or none completed.\n\n",
           MAX_CONCURRENCY, SERVER_PER_CONN);
    fputs(conf_flags_help, stdout);
}

/* EXIT_OK to go on, -1 after --help, else the exit status. */
static int bench_args(int argc, char **argv, cli_global *g, bench *b, const char **file) {
    argp p;
    argp_init(&p, argc, argv, "bench");
    b->concurrency = 8, b->connections = 0, b->progress = 1;
    gen_opts_init(&b->gen);
    b->gen.p.chat = 0;   /* a raw prompt: its token count is what --prompt-tokens says */
    b->gen.p.ignore_eos = 1;
    b->gen.p.max_tokens = 128;
    while (argp_next(&p)) {
        int k = 0;
        if (argp_is(&p, "--help") || argp_is(&p, "-h")) return bench_help(), -1;
        else if (argp_is(&p, "--concurrency")) k = argp_int(&p, &b->concurrency, 1, MAX_CONCURRENCY);
        else if (argp_is(&p, "--connections")) k = argp_int(&p, &b->connections, 1, MAX_CONNECTIONS);
        else if (argp_is(&p, "--requests")) {
            int n;
            k = argp_int(&p, &n, 1, 1000000000L);
            b->requests = n;
        } else if (argp_is(&p, "--duration")) k = argp_double(&p, &b->duration, 0, 7 * 86400, 1);
        else if (argp_is(&p, "--prompt-tokens")) k = argp_int(&p, &b->prompt_tokens, 1, 1000000);
        else if (argp_is(&p, "--prompt-file")) k = argp_str(&p, file);
        else if (argp_is(&p, "--json")) k = argp_no_value(&p), b->json = 1;
        else if (argp_is(&p, "--csv")) k = argp_no_value(&p), b->csv = 1;
        else if (argp_is(&p, "--no-progress")) k = argp_no_value(&p), b->progress = 0;
        else if (argp_is(&p, "--openai")) k = argp_str(&p, &b->openai);
        else if (argp_is(&p, "--openai-extra")) k = argp_str(&p, &b->oai_extra);
        else if (argp_is(&p, "--openai-model")) k = argp_str(&p, &b->oai_model);
        else if ((k = gen_flag(&p, &b->gen)) != 0 || (k = conf_flag(&p, g)) != 0) k = k < 0 ? -1 : 0;
        else return argp_unknown(&p);
        if (k < 0) return EXIT_USAGE;
    }
    if (b->requests && b->duration > 0) {
        cli_err("bench: --requests and --duration exclude each other");
        return EXIT_USAGE;
    }
    if (b->json && b->csv) {
        cli_err("bench: --json and --csv exclude each other");
        return EXIT_USAGE;
    }
    if (*file && b->prompt_tokens) {
        cli_err("bench: --prompt-tokens and --prompt-file exclude each other");
        return EXIT_USAGE;
    }
    if (!b->openai && (b->oai_extra || b->oai_model)) {
        cli_err("bench: --openai-extra and --openai-model need --openai URL");
        return EXIT_USAGE;
    }
    if (b->openai && b->connections) {
        cli_err("bench: --openai opens one connection per client (--concurrency), not --connections");
        return EXIT_USAGE;
    }
    if (b->openai && (g->flags.set & CS_PER_HOST) && g->flags.per_host > 1) {
        /* kiln_raw_open's client is one connection: each HTTP client is its own */
        cli_err("bench: --openai opens one connection per client (--concurrency), not "
                "--connections-per-host");
        return EXIT_USAGE;
    }
    if (!b->oai_extra) b->oai_extra = BENCH_OAI_EXTRA_DEFAULT;
    if (!b->requests && !(b->duration > 0)) b->requests = 100;
    if (!*file && !b->prompt_tokens) b->prompt_tokens = 128;
    return gen_check(&b->gen, "bench") < 0 ? EXIT_USAGE : EXIT_OK;
}

/* The connection count: min(C, 4) unless given, and enough that no connection carries
 * more than the server's per-connection limit. */
static void pick_connections(bench *b) {
    int need = (b->concurrency + SERVER_PER_CONN - 1) / SERVER_PER_CONN;
    if (b->connections == 0) {
        b->connections = b->concurrency < 4 ? b->concurrency : 4;
        if (b->connections < need) b->connections = need;
    } else if (b->connections < need) {
        fprintf(stderr, "kiln: warning: %d in flight per connection exceeds kilnd's default "
                        "limit of %d (expect 429 too_many)\n",
                (b->concurrency + b->connections - 1) / b->connections, SERVER_PER_CONN);
    }
    if (b->connections > b->concurrency) b->connections = b->concurrency;
}

/* --prompt-file: the whole file (bounded), split into non-empty lines in place. */
static int load_prompt_file(bench *b, const char *path) {
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > PROMPT_FILE_MAX) {
        cli_err("bench: --prompt-file %s: %s", path,
                !f ? strerror(errno) : "not a regular file of at most 64 MiB");
        if (f) fclose(f);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    b->file_buf = malloc(size + 1);
    b->prompts = malloc(sizeof *b->prompts * PROMPT_FILE_LINES);
    if (!b->file_buf || !b->prompts || fread(b->file_buf, 1, size, f) != size) {
        cli_err("bench: --prompt-file %s: cannot read it", path);
        fclose(f);
        return -1;
    }
    fclose(f);
    b->file_buf[size] = '\0';
    for (char *s = b->file_buf; s < b->file_buf + size && b->n_prompts < PROMPT_FILE_LINES;) {
        char *nl = memchr(s, '\n', (size_t)(b->file_buf + size - s));
        char *end = nl ? nl : b->file_buf + size;
        *end = '\0';
        if (end > s && end[-1] == '\r') end[-1] = '\0';
        if (*s) b->prompts[b->n_prompts++] = s;
        s = end + 1;
    }
    if (b->n_prompts == 0) {
        cli_err("bench: --prompt-file %s has no prompts", path);
        return -1;
    }
    return 0;
}

/* The synthetic body: common words that are one token each in BPE vocabularies. Each
 * prompt starts "<nonce>-<request number>: ", so no two requests (of this run or an
 * earlier one) share more than a few tokens of prefix and the prefix cache cannot
 * serve them. With the BOS token that start takes ~8 tokens (digits are single tokens in
 * SmolLM2's vocabulary), so the body is that much shorter. */
static int make_synthetic(bench *b) {
    b->nonce = (unsigned)(time(NULL) ^ getpid()) % 100000u;
    static const char *words[] = {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy",
                                  "dog", "and", "then", "runs", "into", "the", "old", "house"};
    int n = b->prompt_tokens > 9 ? b->prompt_tokens - 8 : 1;
    size_t cap = (size_t)n * 7 + 1, pos = 0;
    b->synth = malloc(cap);
    if (!b->synth) return -1;
    for (int i = 0; i < n; i++) {
        const char *w = words[i % (int)(sizeof words / sizeof *words)];
        size_t l = strlen(w);
        if (i) b->synth[pos++] = ' ';
        memcpy(b->synth + pos, w, l);
        pos += l;
    }
    b->synth[pos] = '\0';
    return 0;
}

/* ------------------------------------------------------------------ callbacks */

static int on_token(void *ud, const char *text, size_t len, int sample, int token_id,
                    double logprob) {
    (void)text, (void)len, (void)sample, (void)token_id, (void)logprob;
    slot *s = ud;
    bench *b = s->w->b;
    double now = cli_now();
    pthread_mutex_lock(&b->mu);
    if (!s->got_first) pct_add(&b->rep.ttft_ms, (now - s->t_submit) * 1e3);
    else pct_add(&b->rep.itl_ms, (now - s->t_last) * 1e3);
    pthread_mutex_unlock(&b->mu);
    s->got_first = 1;
    s->t_last = now;
    return 0;
}

static void on_end(void *ud, int sample, int status, const kiln_usage *u, const char *message) {
    (void)sample;
    slot *s = ud;
    bench *b = s->w->b;
    double now = cli_now();
    pthread_mutex_lock(&b->mu);
    b->rep.ended++;
    b->t_last_end = now;
    if (status == 0) {
        if (strcmp(u->reason, "cancelled") == 0) b->rep.cancelled++;
        else b->rep.completed++;
        b->rep.prompt_tokens += (uint64_t)u->prompt_tokens;
        b->rep.output_tokens += (uint64_t)u->completion_tokens;
        b->rep.cached_tokens += (uint64_t)u->cached_tokens;
        pct_add(&b->rep.e2e_ms, (now - s->t_submit) * 1e3);
    } else {
        report_add_error(&b->rep, status);
    }
    pthread_mutex_unlock(&b->mu);
    if (status != 0 && b->verbose)
        fprintf(stderr, "kiln: request failed: %d %s%s%s\n", status, kiln_strerror(status),
                message && *message ? ": " : "", message ? message : "");
    s->busy = 0;
    s->w->inflight--;
}

/* ------------------------------------------------------------------ workers */

long bench_claim(bench *b) {
    long idx = -1;
    pthread_mutex_lock(&b->mu);
    int more = !b->stop && (b->requests ? b->next < b->requests
                                        : cli_now() - b->t_start < b->duration);
    if (more) idx = b->next++;
    pthread_mutex_unlock(&b->mu);
    return idx;
}

/* Sends request idx on a free slot. 0, or -1 when the submit failed (counted). */
static int submit_one(worker *w, long idx) {
    bench *b = w->b;
    slot *s = NULL;
    for (int i = 0; i < w->n_slots && !s; i++)
        if (!w->slots[i].busy) s = &w->slots[i];
    if (!s) return -1; /* cannot happen: callers keep inflight < n_slots */
    kiln_gen p = b->gen.p;
    p.prompt = bench_prompt(b, idx, w->prompt_buf, w->prompt_cap);
    static const kiln_callbacks cb = {on_token, on_end};
    memset(s, 0, sizeof *s);
    s->w = w, s->busy = 1, s->t_submit = cli_now();
    w->inflight++;
    kiln_error err = {0};
    s->h = kiln_submit(w->c, &p, &cb, s, &err);
    pthread_mutex_lock(&b->mu);
    if (s->h) b->rep.submitted++;
    else b->rep.submit_failed++, report_add_error(&b->rep, err.code ? err.code : KILN_EINVAL);
    pthread_mutex_unlock(&b->mu);
    if (s->h) return 0;
    s->busy = 0;
    w->inflight--;
    if (b->verbose) cli_kiln_err(&err);
    return -1;
}

const char *bench_prompt(const bench *b, long idx, char *buf, size_t cap) {
    if (b->prompts) return b->prompts[idx % b->n_prompts];
    snprintf(buf, cap, "%u-%ld: %s", b->nonce, idx, b->synth);
    return buf;
}

size_t bench_prompt_cap(const bench *b) { return (b->synth ? strlen(b->synth) : 0) + 32; }

int bench_stopping(bench *b) {
    pthread_mutex_lock(&b->mu);
    int st = b->stop;
    pthread_mutex_unlock(&b->mu);
    return st;
}

/* After Ctrl-C: CANCEL every request in flight (once each); their ENDs still count. */
static void cancel_all(worker *w) {
    for (int i = 0; i < w->n_slots; i++) {
        slot *s = &w->slots[i];
        if (s->busy && !s->cancel_sent) {
            s->cancel_sent = 1;
            kiln_cancel(w->c, s->h, NULL);
        }
    }
}

static void *worker_main(void *arg) {
    worker *w = arg;
    bench *b = w->b;
    int exhausted = 0;
    for (;;) {
        while (!exhausted && w->inflight < w->n_slots) {
            long idx = bench_claim(b);
            if (idx < 0) {
                exhausted = 1;
                break;
            }
            if (submit_one(w, idx) < 0) {
                /* the connection is down and did not come back: do not spin through the
                 * remaining requests in microseconds */
                struct timespec ts = {0, 100 * 1000 * 1000};
                nanosleep(&ts, NULL);
                break;
            }
        }
        if (bench_stopping(b)) exhausted = 1, cancel_all(w);
        if (w->inflight == 0) {
            if (exhausted) break;
            continue;
        }
        kiln_pump(w->c, 50, NULL); /* a broken connection ends its requests via on_end */
    }
    bench_worker_done(b);
    return NULL;
}

void bench_worker_done(bench *b) {
    pthread_mutex_lock(&b->mu);
    b->workers_done++;
    pthread_mutex_unlock(&b->mu);
}

/* ------------------------------------------------------------------ the run */

static int workers_setup(bench *b, worker *ws, cli_global *g) {
    size_t pcap = bench_prompt_cap(b);
    for (int k = 0; k < b->connections; k++) {
        worker *w = &ws[k];
        int rc;
        w->b = b, w->k = k;
        /* C spread evenly: the first C % K connections take one more */
        w->n_slots = b->concurrency / b->connections + (k < b->concurrency % b->connections);
        w->slots = calloc((size_t)w->n_slots, sizeof *w->slots);
        w->prompt_buf = malloc(pcap);
        w->prompt_cap = pcap;
        if (!w->slots || !w->prompt_buf) {
            cli_err("out of memory");
            return EXIT_FAIL;
        }
        w->c = cli_connect(g, &rc);
        if (!w->c) return rc;
    }
    return EXIT_OK;
}

static void workers_free(bench *b, worker *ws) {
    for (int k = 0; k < b->connections; k++) {
        kiln_close(ws[k].c);
        free(ws[k].slots);
        free(ws[k].prompt_buf);
    }
}

/* --prompt-tokens + --max-tokens must fit the server's context; say so up front rather
 * than report every request as a 413. */
static int check_ctx(bench *b, kiln_client *c) {
    long ctx = kiln_ctx(c);
    if (b->synth && ctx > 0 && (long)b->prompt_tokens + b->gen.p.max_tokens > ctx) {
        cli_err("bench: --prompt-tokens %d + --max-tokens %d exceed the server's context (%ld)",
                b->prompt_tokens, b->gen.p.max_tokens, ctx);
        return -1;
    }
    return 0;
}

/* Starts n threads fn(args + k * stride), draws progress, handles Ctrl-C, waits for all
 * to finish. */
void bench_run(bench *b, int n, bench_thread_fn fn, void *args, size_t stride) {
    pthread_t *th = calloc((size_t)n, sizeof *th);
    char *ok = calloc((size_t)n, 1);
    if (!th || !ok) {
        cli_err("out of memory");
        free(th), free(ok);
        return;
    }
    progress pg;
    progress_init(&pg, b->progress && isatty(2), b->requests, b->duration);
    /* workers must not take the SIGINT: the main thread turns it into b->stop */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    b->t_start = b->t_last_end = cli_now();
    int started = 0;
    for (int k = 0; k < n; k++)
        if (pthread_create(&th[k], NULL, fn, (char *)args + (size_t)k * stride) == 0) ok[k] = 1, started++;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    for (;;) {
        pthread_mutex_lock(&b->mu);
        int done = b->workers_done >= started;
        if (cli_interrupted) b->stop = 1;
        long ended = b->rep.ended, errors = b->rep.errors;
        long toks = (long)b->rep.output_tokens;
        pthread_mutex_unlock(&b->mu);
        progress_update(&pg, ended, errors, toks, done);
        if (done) break;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    progress_done(&pg);
    for (int k = 0; k < n; k++)
        if (ok[k]) pthread_join(th[k], NULL);
    if (started < n) cli_err("bench: could only start %d of %d threads", started, n);
    b->rep.elapsed_s = b->t_last_end - b->t_start;
    free(th), free(ok);
}

static int report_init(bench *b) {
    bench_report *r = &b->rep;
    r->concurrency = b->concurrency, r->connections = b->connections;
    r->max_tokens = b->gen.p.max_tokens, r->prompt_tokens_target = b->prompt_tokens;
    r->requests_target = b->requests, r->duration_target = b->duration;
    if (pct_init(&r->ttft_ms, SAMPLES_CAP) < 0 || pct_init(&r->itl_ms, SAMPLES_CAP) < 0 ||
        pct_init(&r->e2e_ms, SAMPLES_CAP) < 0) {
        cli_err("out of memory");
        return -1;
    }
    return 0;
}

int cmd_bench(int argc, char **argv, cli_global *g) {
    static bench b; /* zeroed; large enough not to want it on the stack */
    const char *file = NULL;
    int rc = bench_args(argc, argv, g, &b, &file);
    if (rc != EXIT_OK) return rc < 0 ? EXIT_OK : rc;
    b.verbose = g->verbose;
    if (b.openai) b.connections = b.concurrency;
    else pick_connections(&b);
    if (file ? load_prompt_file(&b, file) < 0 : make_synthetic(&b) < 0) return EXIT_FAIL;
    if (report_init(&b) < 0) return EXIT_FAIL;
    pthread_mutex_init(&b.mu, NULL);
    worker *ws = NULL;
    if (b.openai) {
        rc = oai_bench(&b, g);
    } else {
        ws = calloc((size_t)b.connections, sizeof *ws);
        rc = ws ? workers_setup(&b, ws, g) : EXIT_FAIL;
        if (rc == EXIT_OK && check_ctx(&b, ws[0].c) < 0) rc = EXIT_USAGE;
        if (rc == EXIT_OK) {
            cli_sigint_arm();
            bench_run(&b, b.connections, worker_main, ws, sizeof *ws);
            cli_sigint_disarm();
        }
    }
    if (rc == EXIT_OK) {
        if (b.json) report_json(&b.rep, stdout);
        else if (b.csv) report_csv(&b.rep, stdout);
        else report_text(&b.rep, stdout);
        long lost = b.rep.submitted - b.rep.ended;
        if (lost) cli_err("bench: %ld request(s) lost (submitted, never ended)", lost);
        if (cli_interrupted) rc = EXIT_INTERRUPTED;
        else if (lost || b.rep.completed == 0) rc = EXIT_FAIL;
    }
    if (ws) workers_free(&b, ws);
    free(ws);
    free(b.prompts), free(b.file_buf), free(b.synth);
    pct_free(&b.rep.ttft_ms), pct_free(&b.rep.itl_ms), pct_free(&b.rep.e2e_ms);
    return rc;
}
