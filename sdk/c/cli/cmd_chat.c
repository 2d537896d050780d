/* cmd_chat.c: `kiln chat` - an interactive conversation. Each stdin line is a user
 * message; the answer streams to stdout. The conversation so far goes with each request
 * as GEN's messages (history.c), rendered by the server through the model's template. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define CHAT_LINE_MAX (256 * 1024)

static void chat_help(void) {
    printf("usage: kiln chat [flags]\n"
           "Reads user messages from stdin, one per line, and streams each answer to\n"
           "stdout. The conversation is kept: each request carries the earlier turns as\n"
           "user and assistant messages (and --system first), which the server renders\n"
           "through the model's chat template. The oldest turns are dropped past %d turns\n"
           "or %d KiB, or when the server says the prompt no longer fits its context.\n"
           "Lines: /reset clears the history, /quit (or end of input) exits; a line\n"
           "starting with // sends the rest with one / (\"//etc\" -> \"/etc\").\n"
           "Ctrl-C during an answer cancels it (it is not kept); at the prompt it exits.\n\n",
           HIST_MAX_TURNS, HIST_MAX_BYTES / 1024);
    fputs(gen_flags_help, stdout);
    printf("  -v, --verbose           usage summary after each answer on stderr\n\n");
    fputs(conf_flags_help, stdout);
}

/* EXIT_OK to go on, -1 after --help, else the exit status. */
static int chat_args(int argc, char **argv, cli_global *g, gen_opts *o) {
    argp p;
    argp_init(&p, argc, argv, "chat");
    while (argp_next(&p)) {
        int k;
        if (argp_is(&p, "--help") || argp_is(&p, "-h")) {
            chat_help();
            return -1;
        }
        if ((k = gen_flag(&p, o)) != 0 || (k = conf_flag(&p, g)) != 0) {
            if (k < 0) return EXIT_USAGE;
        } else {
            return argp_unknown(&p);
        }
    }
    if (o->p.chat == 0) {
        cli_err("chat: the conversation needs the chat template (--no-chat is for generate)");
        return EXIT_USAGE;
    }
    return gen_check(o, "chat") < 0 ? EXIT_USAGE : EXIT_OK;
}

/* One line from stdin into buf (without the newline). 1 a line, 0 EOF, -1 too long
 * (the rest of it is skipped). */
static int read_line(char *buf, size_t cap, size_t *len) {
    if (!fgets(buf, (int)cap, stdin)) return 0;
    size_t n = strlen(buf);
    if (n && buf[n - 1] == '\n') {
        buf[--n] = '\0';
    } else if (!feof(stdin)) {
        int ch;
        while ((ch = getchar()) != EOF && ch != '\n') {}
        return -1;
    }
    if (n && buf[n - 1] == '\r') buf[--n] = '\0';
    *len = n;
    return 1;
}

/* Sends line (NUL-terminated) after the history; drops the oldest exchanges while the
 * server says the prompt is too long (413). The stream's status. */
static int chat_turn(kiln_client *c, gen_opts *o, history *h, const char *line, stream_req *s,
                     int verbose) {
    const char *system = o->p.system; /* msgs[0] instead */
    kiln_msg msgs[HIST_MAX_TURNS + 2];
    for (;;) {
        o->p.system = o->p.prompt = NULL;
        o->p.msgs = msgs;
        o->p.n_msgs = history_msgs(h, system, line, msgs);
        memset(s, 0, sizeof *s);
        s->out = stdout, s->n = 1, s->keep_max = HIST_MAX_BYTES + 1;
        cli_sigint_arm();
        int st = stream_run(c, &o->p, s, cli_retries(), verbose);
        cli_sigint_disarm();
        o->p.system = system;
        o->p.msgs = NULL, o->p.n_msgs = 0;
        if (st != 413 || h->n == 0 || s->any_token) return st;
        fprintf(stderr, "kiln: the conversation no longer fits the context; dropping the "
                        "oldest exchange\n");
        history_drop_oldest(h);
        stream_free(s);
    }
}

int cmd_chat(int argc, char **argv, cli_global *g) {
    gen_opts o;
    gen_opts_init(&o);
    int rc = chat_args(argc, argv, g, &o);
    if (rc != EXIT_OK) return rc < 0 ? EXIT_OK : rc;
    kiln_client *c = cli_connect(g, &rc);
    if (!c) return rc;
    int tty = isatty(0);
    if (tty)
        fprintf(stderr, "kiln chat with %s on %s. /reset clears the history, /quit or Ctrl-D exits.\n",
                kiln_model(c), kiln_server(c));
    char *buf = malloc(CHAT_LINE_MAX);
    history h;
    history_init(&h);
    int failed = 0;
    while (buf) {
        if (tty) fputs("> ", stderr);
        size_t len = 0;
        int r = read_line(buf, CHAT_LINE_MAX, &len);
        if (r == 0) break;
        if (r < 0) {
            cli_err("line longer than %d bytes; skipped", CHAT_LINE_MAX - 2);
            continue;
        }
        const char *line = buf;
        if (len == 0) continue;
        if (strcmp(line, "/quit") == 0 || strcmp(line, "/exit") == 0) break;
        if (strcmp(line, "/reset") == 0) {
            history_reset(&h);
            if (tty) fprintf(stderr, "(history cleared)\n");
            continue;
        }
        if (line[0] == '/' && line[1] != '/') {
            cli_err("unknown command %.40s (/reset, /quit; // sends a line starting with /)", line);
            continue;
        }
        if (line[0] == '/') line++, len--;
        stream_req s;
        int st = chat_turn(c, &o, &h, line, &s, g->verbose);
        if (s.any_token || st == 0) putchar('\n');
        fflush(stdout);
        if (st == 0 && !s.cancelled && !cli_interrupted) {
            if (history_add(&h, line, len, s.kept ? s.kept : "", s.kept_len) < 0)
                cli_err("out of memory: the history was not extended");
            if (g->verbose) print_usage_line(c, &s.usage);
        } else if (s.cancelled || cli_interrupted) {
            fprintf(stderr, "(cancelled)\n");
        } else {
            cli_kiln_err(&s.err);
            failed = 1;
        }
        stream_free(&s);
    }
    if (!buf) cli_err("out of memory");
    history_free(&h);
    free(buf);
    kiln_close(c);
    return failed || !buf ? EXIT_FAIL : EXIT_OK;
}
