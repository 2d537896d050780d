/* report.c: the results of `kiln bench` as text (people), JSON (one object) or CSV
 * (a header and one row). JSON and CSV share one field table so their columns agree;
 * a value that does not exist (a percentile of no samples) is null / empty / "-". */
#include <math.h>
#include <string.h>

#include "cli.h"

void report_add_error(bench_report *r, int code) {
    r->errors++;
    for (int i = 0; i < r->n_codes; i++)
        if (r->codes[i] == code) {
            r->code_counts[i]++;
            return;
        }
    if (r->n_codes == REPORT_MAX_CODES) {
        /* more distinct codes than slots: fold into the last one rather than lose it */
        r->code_counts[REPORT_MAX_CODES - 1]++;
        return;
    }
    r->codes[r->n_codes] = code;
    r->code_counts[r->n_codes++] = 1;
}

typedef struct {
    const char *name;
    double v;
    int is_int;
} field;

#define N_FIELDS 29

/* Every number of the report, in column order. */
static int fields(bench_report *r, field *f) {
    double t = r->elapsed_s;
    int n = 0;
#define F(nm, val, isint) (f[n++] = (field){nm, (double)(val), isint})
    F("concurrency", r->concurrency, 1);
    F("connections", r->connections, 1);
    F("max_tokens", r->max_tokens, 1);
    F("prompt_tokens_target", r->prompt_tokens_target, 1);
    F("requests", r->submitted + r->submit_failed, 1);
    F("submitted", r->submitted, 1);
    F("completed", r->completed, 1);
    F("errors", r->errors, 1);
    F("cancelled", r->cancelled, 1);
    F("lost", r->submitted - r->ended, 1);
    F("duration_s", t, 0);
    F("request_throughput", t > 0 ? r->completed / t : NAN, 0);
    F("prompt_tokens", r->prompt_tokens, 1);
    F("cached_tokens", r->cached_tokens, 1);
    F("output_tokens", r->output_tokens, 1);
    F("output_tok_s", t > 0 ? (double)r->output_tokens / t : NAN, 0);
    F("ttft_ms_p50", pct_get(&r->ttft_ms, 50), 0);
    F("ttft_ms_p90", pct_get(&r->ttft_ms, 90), 0);
    F("ttft_ms_p99", pct_get(&r->ttft_ms, 99), 0);
    F("ttft_ms_mean", pct_mean(&r->ttft_ms), 0);
    F("itl_ms_p50", pct_get(&r->itl_ms, 50), 0);
    F("itl_ms_p90", pct_get(&r->itl_ms, 90), 0);
    F("itl_ms_p99", pct_get(&r->itl_ms, 99), 0);
    F("itl_ms_mean", pct_mean(&r->itl_ms), 0);
    F("e2e_ms_p50", pct_get(&r->e2e_ms, 50), 0);
    F("e2e_ms_p90", pct_get(&r->e2e_ms, 90), 0);
    F("e2e_ms_p99", pct_get(&r->e2e_ms, 99), 0);
    F("e2e_ms_mean", pct_mean(&r->e2e_ms), 0);
    F("itl_samples", r->itl_ms.seen, 1);
#undef F
    return n;
}

static void put_num(FILE *f, const field *x, const char *nan_text) {
    if (isnan(x->v) || isinf(x->v)) fputs(nan_text, f);
    else if (x->is_int) fprintf(f, "%.0f", x->v);
    else fprintf(f, "%.3f", x->v);
}

void report_json(bench_report *r, FILE *f) {
    field fs[N_FIELDS];
    int n = fields(r, fs);
    fputc('{', f);
    for (int i = 0; i < n; i++) {
        fprintf(f, "\"%s\":", fs[i].name);
        put_num(f, &fs[i], "null");
        fputc(',', f);
    }
    /* codes are numbers (negative: the library's), written as object keys */
    fputs("\"errors_by_code\":{", f);
    for (int i = 0; i < r->n_codes; i++)
        fprintf(f, "%s\"%d\":%ld", i ? "," : "", r->codes[i], r->code_counts[i]);
    fputs("}}\n", f);
}

void report_csv(bench_report *r, FILE *f) {
    field fs[N_FIELDS];
    int n = fields(r, fs);
    for (int i = 0; i < n; i++) fprintf(f, "%s,", fs[i].name);
    fputs("errors_by_code\n", f);
    for (int i = 0; i < n; i++) {
        put_num(f, &fs[i], "");
        fputc(',', f);
    }
    /* one cell, "code:count;code:count", so the column count never changes */
    for (int i = 0; i < r->n_codes; i++)
        fprintf(f, "%s%d:%ld", i ? ";" : "", r->codes[i], r->code_counts[i]);
    fputc('\n', f);
}

/* "12.3" or "-" for a missing value. */
static const char *fmt_ms(double v, char *buf, size_t cap) {
    if (isnan(v)) snprintf(buf, cap, "-");
    else snprintf(buf, cap, "%.2f", v);
    return buf;
}

void report_text(bench_report *r, FILE *f) {
    char a[32], b[32], c[32], d[32];
    double t = r->elapsed_s;
    fprintf(f, "requests      %ld submitted, %ld completed, %ld errors, %ld lost",
            r->submitted, r->completed, r->errors, r->submitted - r->ended);
    if (r->cancelled) fprintf(f, ", %ld cancelled", r->cancelled);
    fputc('\n', f);
    fprintf(f, "setup         concurrency %d over %d connection(s), max_tokens %d\n",
            r->concurrency, r->connections, r->max_tokens);
    fprintf(f, "duration      %.3f s\n", t);
    fprintf(f, "throughput    %.2f req/s, %.1f output tok/s\n", t > 0 ? r->completed / t : 0.0,
            t > 0 ? (double)r->output_tokens / t : 0.0);
    fprintf(f, "tokens        %llu prompt (%llu cached), %llu output\n",
            (unsigned long long)r->prompt_tokens, (unsigned long long)r->cached_tokens,
            (unsigned long long)r->output_tokens);
    fprintf(f, "TTFT ms       p50 %s  p90 %s  p99 %s  mean %s\n",
            fmt_ms(pct_get(&r->ttft_ms, 50), a, sizeof a), fmt_ms(pct_get(&r->ttft_ms, 90), b, sizeof b),
            fmt_ms(pct_get(&r->ttft_ms, 99), c, sizeof c), fmt_ms(pct_mean(&r->ttft_ms), d, sizeof d));
    fprintf(f, "ITL ms        p50 %s  p90 %s  p99 %s  mean %s\n",
            fmt_ms(pct_get(&r->itl_ms, 50), a, sizeof a), fmt_ms(pct_get(&r->itl_ms, 90), b, sizeof b),
            fmt_ms(pct_get(&r->itl_ms, 99), c, sizeof c), fmt_ms(pct_mean(&r->itl_ms), d, sizeof d));
    fprintf(f, "E2E ms        p50 %s  p90 %s  p99 %s  mean %s\n",
            fmt_ms(pct_get(&r->e2e_ms, 50), a, sizeof a), fmt_ms(pct_get(&r->e2e_ms, 90), b, sizeof b),
            fmt_ms(pct_get(&r->e2e_ms, 99), c, sizeof c), fmt_ms(pct_mean(&r->e2e_ms), d, sizeof d));
    if (r->n_codes) {
        fprintf(f, "errors        ");
        for (int i = 0; i < r->n_codes; i++)
            fprintf(f, "%s%d: %ld", i ? ", " : "", r->codes[i], r->code_counts[i]);
        fputc('\n', f);
    }
}
