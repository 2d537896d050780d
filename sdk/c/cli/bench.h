/* bench.h: private to `kiln bench` (cmd_bench.c: flags, prompts, the line protocol's
 * workers, the run and its report; bench_oai.c: --openai's HTTP clients). Both kinds of
 * worker take requests from the same counter and add to the same report, so the two
 * protocols are measured by the same client code. */
#ifndef KILN_CLI_BENCH_H
#define KILN_CLI_BENCH_H

#include <pthread.h>

#include "cli.h"

#define BENCH_OAI_EXTRA_DEFAULT "\"ignore_eos\":true"

typedef struct {
    /* settings */
    int concurrency, connections, json, csv, progress, verbose;
    long requests;   /* 0: time-bound */
    double duration; /* 0: count-bound */
    int prompt_tokens;
    gen_opts gen;
    char **prompts;  /* --prompt-file lines (NULL: synthetic) */
    long n_prompts;
    char *file_buf;
    char *synth;     /* the synthetic body, ~prompt_tokens words */
    unsigned nonce;  /* per run, in front of each synthetic prompt (see make_synthetic) */
    const char *openai;     /* --openai URL, or NULL: the line protocol */
    const char *oai_extra;  /* --openai-extra: body fields after the standard ones */
    const char *oai_model;  /* --openai-model, or NULL: the first of GET /v1/models */
    /* shared, under mu */
    pthread_mutex_t mu;
    long next;       /* requests claimed */
    int stop;        /* Ctrl-C: submit nothing more, cancel what is in flight */
    int workers_done;
    double t_start, t_last_end;
    bench_report rep;
} bench;

/* cmd_bench.c */
long bench_claim(bench *b);            /* the next request's index, or -1: no more */
int bench_stopping(bench *b);          /* Ctrl-C: stop sending */
void bench_worker_done(bench *b);      /* a worker thread's last act */
/* Request idx's prompt: a --prompt-file line, or the synthetic one written into buf. */
const char *bench_prompt(const bench *b, long idx, char *buf, size_t cap);
size_t bench_prompt_cap(const bench *b); /* buf's size for bench_prompt */

/* bench_oai.c: C HTTP clients against --openai's URL; the same run and report. An exit
 * status (the report is then filled). */
int oai_bench(bench *b, cli_global *g);
/* The pieces bench_oai.c's clients share with cmd_bench.c's run. */
typedef void *(*bench_thread_fn)(void *);
void bench_run(bench *b, int n, bench_thread_fn fn, void *args, size_t stride);

#endif
