/* tokenize: `kilnd tokenize` and `kilnd detokenize` from the command line, for people and
 * for the tokenizer parity test (tests/ref/tok_parity.py), which drives the --hex forms. */
#include "kilnd/kilnd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/gguf.h"
#include "core/tokenizer.h"

typedef struct {
    const char *model, *text, *ids;
    int hex, special;
} cli_opts;

static int parse(int argc, char **argv, cli_opts *o, int tokenize) {
    memset(o, 0, sizeof *o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (strcmp(a, "--model") == 0 && has_val) o->model = argv[++i];
        else if (strcmp(a, "--text") == 0 && has_val && tokenize) o->text = argv[++i];
        else if (strcmp(a, "--ids") == 0 && has_val && !tokenize) o->ids = argv[++i];
        else if (strcmp(a, "--hex") == 0) o->hex = 1;
        else if (strcmp(a, "--special") == 0) o->special = 1;
        else {
            fprintf(stderr, "%s: unknown or incomplete flag '%s'\n", argv[0], a);
            return -1;
        }
    }
    if (!o->model) {
        fprintf(stderr, "%s: --model PATH is required\n", argv[0]);
        return -1;
    }
    return 0;
}

static void usage(const char *cmd) {
    fprintf(stderr,
            "usage: kilnd tokenize --model PATH (--text TEXT | --hex) [--special]\n"
            "       kilnd detokenize --model PATH [--hex] [--special] [--ids \"1 2 3\"]\n"
            "(%s) --hex: stdin lines of hex-encoded text (tokenize) or of ids (detokenize)\n",
            cmd);
}

static int load(const char *cmd, const char *path, gguf_file *f, tok_t *t) {
    char err[512];
    int r = gguf_open(f, path);
    if (r < 0) {
        fprintf(stderr, "%s: cannot open %s: %s\n", cmd, path, f->err);
        return -1;
    }
    if (tok_init_gguf(t, f, err, sizeof err) < 0) {
        fprintf(stderr, "%s: %s: %s\n", cmd, path, err);
        gguf_close(f);
        return -1;
    }
    return 0;
}

/* Both commands' end: stdout flushed (a write error is a failure), the model closed. */
static int finish(const char *cmd, gguf_file *f, tok_t *t, int rc) {
    if (fflush(stdout) != 0) {
        perror(cmd);
        rc = 1;
    }
    tok_free(t);
    gguf_close(f);
    return rc;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static size_t chomp(char *line, size_t n) {
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    return n;
}

/* encode text and print the ids on one line; returns 0 or -1 */
static int print_ids(const char *cmd, const tok_t *t, const char *text, size_t len, int special,
                     int32_t **ids, size_t *cap) {
    if (*cap < len + 2) {
        int32_t *p = realloc(*ids, (len + 2) * sizeof *p);
        if (!p) {
            fprintf(stderr, "%s: out of memory\n", cmd);
            return -1;
        }
        *ids = p, *cap = len + 2;
    }
    int n = tok_encode(t, text, len, special, *ids, (int)*cap);
    if (n < 0) {
        fprintf(stderr, "%s: encoding failed (%d)\n", cmd, n);
        return -1;
    }
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", (*ids)[i]);
    putchar('\n');
    return 0;
}

int kd_tokenize(int argc, char **argv) {
    const char *cmd = argc > 0 ? argv[0] : "tokenize";
    cli_opts o;
    if (parse(argc, argv, &o, 1) < 0 || (!o.hex && !o.text) || (o.hex && o.text)) {
        usage(cmd);
        return 2;
    }
    gguf_file f;
    tok_t t;
    if (load(cmd, o.model, &f, &t) < 0) return 1;
    int rc = 0;
    int32_t *ids = NULL;
    size_t idcap = 0;
    if (!o.hex) {
        rc = print_ids(cmd, &t, o.text, strlen(o.text), o.special, &ids, &idcap) < 0;
    } else {
        char *line = NULL;
        size_t lcap = 0;
        ssize_t got;
        for (long ln = 1; rc == 0 && (got = getline(&line, &lcap, stdin)) >= 0; ln++) {
            size_t n = chomp(line, (size_t)got);
            if (n % 2) {
                fprintf(stderr, "%s: line %ld: odd number of hex digits\n", cmd, ln);
                rc = 1;
                break;
            }
            for (size_t i = 0; i < n / 2; i++) {
                int hi = hexval((unsigned char)line[2 * i]), lo = hexval((unsigned char)line[2 * i + 1]);
                if (hi < 0 || lo < 0) {
                    fprintf(stderr, "%s: line %ld: bad hex digit\n", cmd, ln);
                    rc = 1;
                    break;
                }
                line[i] = (char)(hi << 4 | lo); /* decode in place */
            }
            if (rc == 0 && print_ids(cmd, &t, line, n / 2, o.special, &ids, &idcap) < 0) rc = 1;
        }
        free(line);
    }
    free(ids);
    return finish(cmd, &f, &t, rc);
}

/* decode one line of ids through the incremental detokenizer; returns 0 or -1 */
static int detok_line(const char *cmd, const tok_t *t, const char *s, int hex, int special, char *piece, long ln) {
    tok_stream st;
    tok_stream_init(&st, t, special);
    int cap = TOK_STREAM_CAP(t);
    for (const char *p = s;;) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        if (!*p) break;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= tok_n_vocab(t)) {
            fprintf(stderr, "%s: line %ld: bad token id near '%.20s'\n", cmd, ln, p);
            return -1;
        }
        p = end;
        int k = tok_stream_push(&st, (int32_t)v, piece, cap);
        if (k < 0) {
            fprintf(stderr, "%s: decoding failed (%d)\n", cmd, k);
            return -1;
        }
        for (int i = 0; i < k; i++) hex ? printf("%02x", (unsigned char)piece[i]) : putchar(piece[i]);
    }
    int k = tok_stream_flush(&st, piece, cap);
    for (int i = 0; i < k; i++) hex ? printf("%02x", (unsigned char)piece[i]) : putchar(piece[i]);
    putchar('\n');
    return 0;
}

int kd_detokenize(int argc, char **argv) {
    const char *cmd = argc > 0 ? argv[0] : "detokenize";
    cli_opts o;
    if (parse(argc, argv, &o, 0) < 0) {
        usage(cmd);
        return 2;
    }
    gguf_file f;
    tok_t t;
    if (load(cmd, o.model, &f, &t) < 0) return 1;
    int rc = 0;
    char *piece = malloc((size_t)TOK_STREAM_CAP(&t));
    if (!piece) {
        fprintf(stderr, "%s: out of memory\n", cmd);
        rc = 1;
    } else if (o.ids) {
        rc = detok_line(cmd, &t, o.ids, o.hex, o.special, piece, 1) < 0;
    } else {
        char *line = NULL;
        size_t lcap = 0;
        ssize_t got;
        for (long ln = 1; rc == 0 && (got = getline(&line, &lcap, stdin)) >= 0; ln++) {
            chomp(line, (size_t)got);
            if (detok_line(cmd, &t, line, o.hex, o.special, piece, ln) < 0) rc = 1;
        }
        free(line);
    }
    free(piece);
    return finish(cmd, &f, &t, rc);
}
