/* shape: `kilnd shape`, a random-weight GGUF of a real model's shape in a file type, by
 * kiln's own quantizers (core/shape.h). It needs nothing but core/, so the GPU machine's
 * programs link it too (tests/gpu/kiln_shape.c): real shapes are made where they run.
 *
 *   kilnd shape SHAPE OUT.gguf [--type Q4_K_M] [--tokenizer GGUF] [--seed N] [--threads N]
 *   kilnd shape SHAPE --plan [--type T]     the tensors, their types and sizes; no file
 *   kilnd shape --list */
#include "kilnd/kilnd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/cpu/quant.h"
#include "core/shape.h"

static void usage(void) {
    fprintf(stderr, "usage: kilnd shape SHAPE OUT.gguf [--type T] [--tokenizer GGUF] [--seed N] [--threads N]\n"
                    "       kilnd shape SHAPE --plan [--type T]\n"
                    "       kilnd shape --list\n"
                    "types:");
    for (int i = 0; shape_ftype_name(i); i++) fprintf(stderr, " %s", shape_ftype_name(i));
    fprintf(stderr, "\n");
}

static void list(void) {
    for (int i = 0; shape_at(i); i++) {
        const shape_def *s = shape_at(i);
        printf("%-18s %-8s d=%d layers=%d heads=%d kv=%d hd=%d ffn=%d vocab=%d%s%s", s->name,
               s->arch, s->d, s->layers, s->heads, s->kv, s->hd ? s->hd : s->d / s->heads,
               s->ffn, s->vocab, s->tied ? " tied" : "", s->bias ? " bias" : "");
        if (s->experts[0]) printf(" experts=%d/%d ffn_exp=%d", s->experts[0], s->experts[1], s->experts[2]);
        if (s->swa[0]) printf(" window=%d pattern=%d", s->swa[0], s->swa[1]);
        printf("\n");
    }
}

/* One line per tensor: name, type, dims; then the total. */
static int plan(const shape_def *s, int ft) {
    int nt = shape_plan(s, ft, NULL, 0);
    shape_tensor *ts = calloc((size_t)nt, sizeof *ts);
    if (!ts) return 1;
    shape_plan(s, ft, ts, nt);
    double total = 0;
    for (int i = 0; i < nt; i++) {
        printf("%s %s", ts[i].name, quant_type_name(ts[i].type));
        for (int k = 0; k < ts[i].n_dims; k++) printf(" %lld", (long long)ts[i].ne[k]);
        printf("\n");
        total += (double)quant_row_size(ts[i].type, ts[i].ne[0]) * (double)(ts[i].ne[1] * ts[i].ne[2]);
    }
    fprintf(stderr, "kilnd shape: %s %s: %d tensors, %.2f GiB of weights\n", s->name,
            shape_ftype_name(ft), nt, total / (1 << 30));
    free(ts);
    return 0;
}

int kd_shape(int argc, char **argv) {
    const char *name = NULL, *out = NULL, *type = "Q4_K_M";
    shape_opts o = {.tokenizer = "models/SmolLM2-135M-Instruct.Q4_1.gguf", .seed = 20241202,
                    .threads = (int)sysconf(_SC_NPROCESSORS_ONLN)};
    int want_plan = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(a, "--list")) { list(); return 0; }
        else if (!strcmp(a, "--plan")) want_plan = 1;
        else if (!strcmp(a, "--type") && has_val) type = argv[++i];
        else if (!strcmp(a, "--tokenizer") && has_val) o.tokenizer = argv[++i];
        else if (!strcmp(a, "--seed") && has_val) o.seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(a, "--threads") && has_val) o.threads = atoi(argv[++i]);
        else if (a[0] != '-' && !name) name = a;
        else if (a[0] != '-' && !out) out = a;
        else {
            fprintf(stderr, "kilnd shape: unknown or incomplete flag '%s'\n", a);
            usage();
            return 2;
        }
    }
    const shape_def *s = name ? shape_find(name) : NULL;
    int ft = shape_ftype(type);
    if (!s || ft < 0 || (!out && !want_plan) || o.threads < 1 || o.threads > 1024) {
        if (name && !s) fprintf(stderr, "kilnd shape: unknown shape '%s' (kilnd shape --list)\n", name);
        if (ft < 0) fprintf(stderr, "kilnd shape: unknown type '%s'\n", type);
        usage();
        return 2;
    }
    if (want_plan) return plan(s, ft);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char err[512];
    uint64_t bytes = 0;
    if (shape_write(s, ft, out, &o, &bytes, err, sizeof err) < 0) {
        fprintf(stderr, "kilnd %s\n", err);
        return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fprintf(stderr, "kilnd shape: %s %s -> %s: %.2f GiB in %.1f s (%d threads)\n", s->name, type, out,
            (double)bytes / (1 << 30), (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9,
            o.threads);
    return 0;
}
