/* tokenize: `kilnd tokenize` and `kilnd detokenize` from the command line, for people and
 * for the tokenizer parity tests (tests/ref/tok_parity.py, vocab_parity.py), which drive
 * the --hex forms, and `kilnd tokenize --chat`: conversations through core/chat (what the
 * model sees for a chat request), which tests/ref/chat_parity.py drives. */
#include "kilnd/kilnd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/chat.h"
#include "core/gguf.h"
#include "core/tokenizer.h"

typedef struct {
    const char *model, *text, *ids;
    int hex, special;
    /* --chat: stdin lines are conversations */
    int chat, render, detect, no_gen;
    const char *tmpl, *tmpl_file; /* a kind by name; a Jinja file to detect the kind from */
    long long now;                /* --now: Unix seconds for templates that print the date */
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
        else if (strcmp(a, "--chat") == 0 && tokenize) o->chat = 1;
        else if (strcmp(a, "--render") == 0 && tokenize) o->render = 1;
        else if (strcmp(a, "--detect") == 0 && tokenize) o->detect = 1;
        else if (strcmp(a, "--no-generation-prompt") == 0 && tokenize) o->no_gen = 1;
        else if (strcmp(a, "--template") == 0 && has_val && tokenize) o->tmpl = argv[++i];
        else if (strcmp(a, "--template-file") == 0 && has_val && tokenize) o->tmpl_file = argv[++i];
        else if (strcmp(a, "--now") == 0 && has_val && tokenize) o->now = strtoll(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "%s: unknown or incomplete flag '%s'\n", argv[0], a);
            return -1;
        }
    }
    int no_model_ok = o->chat && (o->render || o->detect) && (o->tmpl || o->tmpl_file);
    if (!o->model && !no_model_ok) {
        fprintf(stderr, "%s: --model PATH is required\n", argv[0]);
        return -1;
    }
    return 0;
}

static void usage(const char *cmd) {
    fprintf(stderr,
            "usage: kilnd tokenize --model PATH (--text TEXT | --hex) [--special]\n"
            "       kilnd tokenize --chat [--model PATH] [--template NAME] [--template-file F]\n"
            "                      [--render] [--detect] [--no-generation-prompt] [--now SECONDS]\n"
            "       kilnd detokenize --model PATH [--hex] [--special] [--ids \"1 2 3\"]\n"
            "(%s) --hex: stdin lines of hex-encoded text (tokenize) or of ids (detokenize)\n"
            "--chat: stdin lines are conversations, ROLE=HEX items separated by spaces; each is\n"
            "rendered with the model's chat template (or --template, or the kind --template-file\n"
            "names) and tokenized, or printed in hex with --render ('!' when the template\n"
            "refuses it); --detect prints the template kind. A default system message the\n"
            "template sets (Mistral's) comes from --template-file or the model's template, also\n"
            "with --template\n",
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

/* encode text and print the ids on one line; returns 0 or -1. plain (n_plain ranges, a
 * chat prompt's caller texts): special tokens are parsed outside them only */
static int print_ids(const char *cmd, const tok_t *t, const char *text, size_t len, int special,
                     const size_t *plain, int n_plain, int32_t **ids, size_t *cap) {
    if (*cap < len + 2) {
        int32_t *p = realloc(*ids, (len + 2) * sizeof *p);
        if (!p) {
            fprintf(stderr, "%s: out of memory\n", cmd);
            return -1;
        }
        *ids = p, *cap = len + 2;
    }
    int n = plain ? tok_encode_plain(t, text, len, plain, n_plain, *ids, (int)*cap)
                  : tok_encode(t, text, len, special, *ids, (int)*cap);
    if (n < 0) {
        fprintf(stderr, "%s: encoding failed (%d)\n", cmd, n);
        return -1;
    }
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", (*ids)[i]);
    putchar('\n');
    return 0;
}

static int unhex(char *s, size_t n) { /* in place; returns the byte count or -1 */
    if (n % 2) return -1;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = hexval((unsigned char)s[2 * i]), lo = hexval((unsigned char)s[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        s[i] = (char)(hi << 4 | lo);
    }
    return (int)(n / 2);
}

/* the Jinja text of --template-file, else the model's chat template (*len 0: none) */
static const char *template_text(const cli_opts *o, const gguf_file *f, size_t *len) {
    static char text[1 << 20];
    gguf_str s;
    *len = 0;
    if (o->tmpl_file) {
        FILE *fp = fopen(o->tmpl_file, "rb");
        if (!fp) {
            perror(o->tmpl_file);
            return NULL;
        }
        *len = fread(text, 1, sizeof text, fp);
        fclose(fp);
        return text;
    }
    if (f && gguf_get_str(f, "tokenizer.chat_template", &s) == 0) {
        *len = (size_t)s.len;
        return s.ptr;
    }
    return NULL;
}

/* the kind --template, --template-file or the model names; CHAT_UNKNOWN (said) if none */
static int chat_kind_of(const char *cmd, const cli_opts *o, const gguf_file *f, const char *text, size_t len) {
    if (o->tmpl) {
        for (int k = 1; k < CHAT_NKINDS; k++)
            if (strcmp(o->tmpl, chat_template_names[k]) == 0) return k;
        fprintf(stderr, "%s: --template %s: not one of kiln's templates\n", cmd, o->tmpl);
        return CHAT_UNKNOWN;
    }
    if (o->tmpl_file) return text ? chat_detect_text(text, len) : CHAT_UNKNOWN;
    return chat_detect(f);
}

/* one conversation line: ROLE=HEX items; the roles and texts are decoded in place */
static int parse_conv(char *line, chat_msg *msgs, int max) {
    int n = 0;
    for (char *p = strtok(line, " "); p; p = strtok(NULL, " ")) {
        char *eq = strchr(p, '=');
        if (!eq || n == max) return -1;
        *eq = 0;
        char *hex = eq + 1;
        int k = unhex(hex, strlen(hex));
        if (k < 0) return -1;
        hex[k] = 0; /* a text with a NUL in it ends there */
        msgs[n++] = (chat_msg){p, hex};
    }
    return n;
}

static int chat_lines(const char *cmd, const cli_opts *o, const tok_t *t, int kind, const char *dflt) {
    enum { MAX_MSGS = 64, MAX_SPANS = 4 * MAX_MSGS + 16 };
    size_t spans[2 * MAX_SPANS];
    int n_spans = 0;
    size_t cap = 0;
    char *out = NULL, *line = NULL;
    int32_t *ids = NULL;
    size_t lcap = 0, idcap = 0;
    ssize_t got;
    int rc = 0;
    for (long ln = 1; rc == 0 && (got = getline(&line, &lcap, stdin)) >= 0; ln++) {
        chomp(line, (size_t)got);
        chat_msg msgs[MAX_MSGS];
        int n = parse_conv(line, msgs, MAX_MSGS);
        if (n < 0) {
            fprintf(stderr, "%s: line %ld: not ROLE=HEX items (at most %d)\n", cmd, ln, MAX_MSGS);
            rc = 1;
            break;
        }
        int k = CHAT_ESPACE;
        for (size_t want = (size_t)got * 2 + 65536; k == CHAT_ESPACE; want = cap * 2) {
            if (cap < want || !out) {
                char *p = realloc(out, want);
                if (!p) {
                    fprintf(stderr, "%s: out of memory\n", cmd);
                    rc = 1;
                    break;
                }
                out = p, cap = want;
            }
            k = chat_format_dflt(kind, dflt, msgs, n, !o->no_gen, o->now ? o->now : (long long)time(NULL), out, cap,
                                 spans, MAX_SPANS, &n_spans);
        }
        if (rc) break;
        if (k < 0) {
            printf("!\n");
        } else if (o->render) {
            for (int i = 0; i < k; i++) printf("%02x", (unsigned char)out[i]);
            putchar('\n');
        } else if (print_ids(cmd, t, out, (size_t)k, 1, spans, n_spans, &ids, &idcap) < 0) {
            rc = 1;
        }
    }
    free(out), free(line), free(ids);
    return rc;
}

static int kd_tokenize_chat(const char *cmd, const cli_opts *o) {
    gguf_file f;
    tok_t t;
    int have_model = o->model != NULL;
    if (have_model && load(cmd, o->model, &f, &t) < 0) return 1;
    size_t tlen;
    const char *text = template_text(o, have_model ? &f : NULL, &tlen);
    int kind = chat_kind_of(cmd, o, have_model ? &f : NULL, text, tlen);
    int rc = 0;
    /* the template's default system message (Mistral's), which kiln does not keep */
    static char dflt[1 << 16];
    if (chat_default_system(text, tlen, o->now ? o->now : (long long)time(NULL), dflt, sizeof dflt) < 0) dflt[0] = 0;
    if (o->detect) {
        printf("%s\n", chat_name(kind));
    } else if (kind == CHAT_UNKNOWN) {
        fprintf(stderr, "%s: kiln cannot render this chat template (set --template)\n", cmd);
        rc = 1;
    } else {
        rc = chat_lines(cmd, o, have_model ? &t : NULL, kind, dflt);
    }
    if (!have_model) return fflush(stdout) != 0 ? 1 : rc;
    return finish(cmd, &f, &t, rc);
}

int kd_tokenize(int argc, char **argv) {
    const char *cmd = argc > 0 ? argv[0] : "tokenize";
    cli_opts o;
    if (parse(argc, argv, &o, 1) < 0 || (!o.chat && ((!o.hex && !o.text) || (o.hex && o.text)))) {
        usage(cmd);
        return 2;
    }
    if (o.chat) return kd_tokenize_chat(cmd, &o);
    gguf_file f;
    tok_t t;
    if (load(cmd, o.model, &f, &t) < 0) return 1;
    int rc = 0;
    int32_t *ids = NULL;
    size_t idcap = 0;
    if (!o.hex) {
        rc = print_ids(cmd, &t, o.text, strlen(o.text), o.special, NULL, 0, &ids, &idcap) < 0;
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
            if (rc == 0 && print_ids(cmd, &t, line, n / 2, o.special, NULL, 0, &ids, &idcap) < 0) rc = 1;
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
