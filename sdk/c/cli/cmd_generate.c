/* cmd_generate.c: `kiln generate` - one GEN, its text streamed to stdout.
 * Also the sampling flags (gen_flag), which `kiln chat` and `kiln bench` share. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define PROMPT_MAX (16u << 20) /* far above the server's default line limit (1 MiB) */

const char gen_flags_help[] =
    "sampling (absent: the server's configured default):\n"
    "  --max-tokens N          tokens to generate, 0..1000000\n"
    "  --temperature F         0..100, 0 = greedy\n"
    "  --top-p F               (0, 1]; 1 = off\n"
    "  --top-k N               0..1000000; 0 = off\n"
    "  --min-p F               0..1; 0 = off\n"
    "  --repeat-penalty F      (0, 10]; 1 = off\n"
    "  --repeat-last-n N       tokens the penalties look at, 0..1000000\n"
    "  --presence-penalty F    -2..2\n"
    "  --frequency-penalty F   -2..2\n"
    "  --seed N                0..2^64-1; 0 = random\n"
    "  --stop TEXT             stop when the output contains TEXT (1..64 bytes; up to 4)\n"
    "  --system TEXT           system message (chat mode)\n"
    "  --chat / --no-chat      apply the model's chat template (default: on)\n"
    "  --ignore-eos            keep going past the end-of-generation token\n";

void gen_opts_init(gen_opts *o) {
    memset(o, 0, sizeof *o);
    kiln_gen_init(&o->p);
    o->p.chat = 1; /* the issue: chat on by default (instruct models) */
}

/* A flag that takes a double into a kiln_gen field. */
static int gen_double(argp *p, double *dst, double lo, double hi, int lo_open) {
    return argp_double(p, dst, lo, hi, lo_open) < 0 ? -1 : 1;
}

static int gen_int(argp *p, int *dst, long lo, long hi) {
    return argp_int(p, dst, lo, hi) < 0 ? -1 : 1;
}

int gen_flag(argp *p, gen_opts *o) {
    kiln_gen *g = &o->p;
    if (argp_is(p, "--max-tokens")) return gen_int(p, &g->max_tokens, 0, 1000000);
    if (argp_is(p, "--temperature")) return gen_double(p, &g->temperature, 0, 100, 0);
    if (argp_is(p, "--top-p")) return gen_double(p, &g->top_p, 0, 1, 1);
    if (argp_is(p, "--top-k")) return gen_int(p, &g->top_k, 0, 1000000);
    if (argp_is(p, "--min-p")) return gen_double(p, &g->min_p, 0, 1, 0);
    if (argp_is(p, "--repeat-penalty")) return gen_double(p, &g->repeat_penalty, 0, 10, 1);
    if (argp_is(p, "--repeat-last-n")) return gen_int(p, &g->repeat_last_n, 0, 1000000);
    if (argp_is(p, "--presence-penalty")) return gen_double(p, &g->presence_penalty, -2, 2, 0);
    if (argp_is(p, "--frequency-penalty")) return gen_double(p, &g->frequency_penalty, -2, 2, 0);
    if (argp_is(p, "--seed")) {
        g->has_seed = 1;
        return argp_u64(p, &g->seed) < 0 ? -1 : 1;
    }
    if (argp_is(p, "--stop")) {
        const char *v;
        if (argp_str(p, &v) < 0) return -1;
        size_t len = strlen(v);
        if (len < 1 || len > 64) {
            cli_err("%s: --stop: 1..64 bytes, got %zu", p->cmd, len);
            return -1;
        }
        if (g->n_stops == KILN_MAX_STOPS) {
            cli_err("%s: --stop: at most %d", p->cmd, KILN_MAX_STOPS);
            return -1;
        }
        g->stops[g->n_stops++] = v; /* argv outlives the request */
        return 1;
    }
    if (argp_is(p, "--system")) return argp_str(p, &g->system) < 0 ? -1 : 1;
    if (argp_is(p, "--chat")) return argp_no_value(p) < 0 ? -1 : (g->chat = 1);
    if (argp_is(p, "--no-chat")) return argp_no_value(p) < 0 ? -1 : (g->chat = 0, 1);
    if (argp_is(p, "--ignore-eos")) return argp_no_value(p) < 0 ? -1 : (g->ignore_eos = 1);
    return 0;
}

/* A --system without chat mode is refused by the server; say so before connecting. */
int gen_check(const gen_opts *o, const char *cmd) {
    if (o->p.system && o->p.chat == 0) {
        cli_err("%s: --system needs chat mode (--chat, not --no-chat)", cmd);
        return -1;
    }
    return 0;
}

/* Reads all of stdin (bounded) and drops trailing newlines, so `echo hi | kiln
 * generate` sends "hi" as `kiln generate hi` does. malloc'd, or NULL (message printed). */
char *read_stdin_prompt(void) {
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    for (;;) {
        if (len + 1 == cap) {
            if (cap >= PROMPT_MAX) {
                cli_err("prompt on stdin is longer than %u bytes", PROMPT_MAX);
                free(buf);
                return NULL;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                cli_err("out of memory reading stdin");
                return NULL;
            }
            buf = nb, cap *= 2;
        }
        ssize_t n = read(0, buf + len, cap - 1 - len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            cli_err("reading stdin: %s", strerror(errno));
            free(buf);
            return NULL;
        }
        if (n == 0) break;
        len += (size_t)n;
    }
    while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) len--;
    buf[len] = '\0';
    return buf;
}

/* The positionals joined with single spaces (`kiln generate What is kiln?`). */
static char *join_args(const char **words, int n) {
    size_t need = 1;
    for (int i = 0; i < n; i++) need += strlen(words[i]) + 1;
    char *s = malloc(need);
    if (!s) return NULL;
    size_t pos = 0;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(words[i]);
        if (i) s[pos++] = ' ';
        memcpy(s + pos, words[i], l);
        pos += l;
    }
    s[pos] = '\0';
    return s;
}

static void generate_help(void) {
    printf("usage: kiln generate [flags] [PROMPT...]\n"
           "Sends one generation request and streams the text to stdout as it arrives,\n"
           "with a newline at the end. The prompt is the arguments joined by spaces, or\n"
           "stdin (read to EOF, trailing newlines dropped) when there are none or it is -.\n"
           "Ctrl-C cancels the request on the server and exits with status 130 once the\n"
           "server confirmed (a second Ctrl-C exits at once).\n\n");
    fputs(gen_flags_help, stdout);
    printf("  --n N                   independent samples, 1..8: sample 0 streams, the\n"
           "                          others follow under `--- sample i ---` lines\n"
           "  --logprobs              instead of the text, one JSON object per token line:\n"
           "                          {\"sample\":0,\"token\":ID,\"logprob\":F,\"text\":\"...\"}\n"
           "  -v, --verbose           the usage summary (END line) and connection on stderr\n\n");
    fputs(conf_flags_help, stdout);
}

/* Samples 1..n-1 after sample 0 (they cannot share a terminal line while streaming). */
static void print_extra_samples(const stream_req *s, int n) {
    for (int i = 1; i < n && i < 8; i++) {
        printf("--- sample %d ---\n", i);
        if (s->extra[i]) fwrite(s->extra[i], 1, s->extra_len[i], stdout);
        putchar('\n');
    }
}

void print_usage_line(kiln_client *c, const kiln_usage *u) {
    fprintf(stderr,
            "kiln: reason=%s prompt_tokens=%ld completion_tokens=%ld cached_tokens=%ld "
            "ttft_ms=%.1f tpot_ms=%.2f e2e_ms=%.1f server=%s\n",
            u->reason[0] ? u->reason : "-", u->prompt_tokens, u->completion_tokens,
            u->cached_tokens, u->ttft_ms, u->tpot_ms, u->e2e_ms, c ? kiln_server(c) : "-");
}

/* Parses generate's flags into o and the prompt: EXIT_OK to go on, -1 after --help,
 * else the exit status. */
static int generate_args(int argc, char **argv, cli_global *g, gen_opts *o, char **prompt) {
    argp p;
    argp_init(&p, argc, argv, "generate");
    const char **words = calloc((size_t)argc + 1, sizeof *words);
    int n_words = 0;
    if (!words) return EXIT_FAIL;
    int r = EXIT_OK;
    while (r == EXIT_OK && argp_next(&p)) {
        int k;
        if (argp_pos(&p)) words[n_words++] = p.arg;
        else if (argp_is(&p, "--help") || argp_is(&p, "-h")) generate_help(), r = -1;
        else if (argp_is(&p, "--n")) r = argp_int(&p, &o->p.n, 1, 8) < 0 ? EXIT_USAGE : EXIT_OK;
        else if (argp_is(&p, "--logprobs")) r = argp_no_value(&p) < 0 ? EXIT_USAGE : (o->p.logprobs = 1, EXIT_OK);
        else if ((k = gen_flag(&p, o)) != 0 || (k = conf_flag(&p, g)) != 0) r = k < 0 ? EXIT_USAGE : EXIT_OK;
        else r = argp_unknown(&p);
    }
    if (r == EXIT_OK && gen_check(o, "generate") < 0) r = EXIT_USAGE;
    if (r == EXIT_OK) {
        if (n_words == 0 || (n_words == 1 && strcmp(words[0], "-") == 0)) {
            if (isatty(0)) fprintf(stderr, "kiln: reading the prompt from stdin (end with Ctrl-D)\n");
            *prompt = read_stdin_prompt();
        } else {
            *prompt = join_args(words, n_words);
        }
        if (!*prompt) r = EXIT_FAIL;
    }
    free(words);
    return r; /* -1: --help was printed */
}

int cmd_generate(int argc, char **argv, cli_global *g) {
    gen_opts o;
    gen_opts_init(&o);
    char *prompt = NULL;
    int r = generate_args(argc, argv, g, &o, &prompt);
    if (r < 0) return EXIT_OK; /* --help */
    if (r != EXIT_OK) return r;
    o.p.prompt = prompt;
    kiln_client *c = cli_connect(g, &r);
    if (!c) {
        free(prompt);
        return r;
    }
    int n = o.p.n > 0 ? o.p.n : 1;
    stream_req s;
    memset(&s, 0, sizeof s);
    s.out = stdout, s.n = n, s.logprobs = o.p.logprobs == 1;
    if (n > 1 && !s.logprobs) printf("--- sample 0 ---\n");
    cli_sigint_arm();
    int st = stream_run(c, &o.p, &s, cli_retries(), g->verbose);
    cli_sigint_disarm();
    if (!s.logprobs && (s.any_token || st == 0)) putchar('\n');
    if (n > 1 && !s.logprobs && st == 0) print_extra_samples(&s, n);
    fflush(stdout);
    if (st == 0 && g->verbose) print_usage_line(c, &s.usage);
    if (st != 0) cli_kiln_err(&s.err);
    if (s.oom) cli_err("out of memory: some sample text was dropped");
    int interrupted = s.cancelled || cli_interrupted;
    stream_free(&s);
    kiln_close(c);
    free(prompt);
    if (interrupted) return EXIT_INTERRUPTED;
    return st == 0 ? EXIT_OK : EXIT_FAIL;
}
