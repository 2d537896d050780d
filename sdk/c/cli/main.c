/* kiln: the command-line client of kilnd (docs/PROTOCOL.md), on libkiln (sdk/c/kiln.h).
 *   kiln [connection flags] <command> [flags]
 * Commands: generate, chat, bench, stats, metrics, health, update (cmd_*.c). Connection flags
 * may come before or after the command. Exit status: 0 ok, 1 failure, 2 usage error,
 * 130 generate interrupted by Ctrl-C. */
#include <string.h>

#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "kiln " CLI_VERSION " - command-line client of the kiln inference server\n"
            "usage: kiln [connection flags] <command> [flags]\n"
            "commands:\n"
            "  generate [PROMPT...]   generate text; prompt from the arguments or stdin\n"
            "  chat                   interactive chat: lines from stdin, answers streamed\n"
            "  bench                  load test: throughput, TTFT, inter-token latency\n"
            "  stats                  server counters (STATS), one key=value per line\n"
            "  metrics                the Prometheus metrics text (METRICS)\n"
            "  health                 HEALTH; exit status 0 when live and ready, else 1\n"
            "  update BUNDLE          an admin's network update: a signed image bundle into\n"
            "                         the box's inactive slot (then --reboot, or REBOOT)\n"
            "  help [COMMAND]         this text, or a command's flags\n"
            "  version                print the version\n"
            "`kiln COMMAND --help` lists a command's flags.\n\n");
    fputs(conf_flags_help, f);
    fputs("\nexit status: 0 ok, 1 failure (one line on stderr says why), 2 usage error,\n"
          "130 generate interrupted by Ctrl-C (after the server confirmed the cancel).\n",
          f);
}

typedef int (*cmd_fn)(int, char **, cli_global *);
static const struct {
    const char *name;
    cmd_fn fn;
} commands[] = {
    {"generate", cmd_generate}, {"chat", cmd_chat}, {"bench", cmd_bench},
    {"stats", cmd_stats},       {"metrics", cmd_metrics}, {"health", cmd_health},
    {"update", cmd_update},
};

static cmd_fn find_cmd(const char *name) {
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (strcmp(commands[i].name, name) == 0) return commands[i].fn;
    return NULL;
}

/* `kiln help generate` is `kiln generate --help`. */
static int help_cmd(const char *name, cli_global *g) {
    cmd_fn fn = name ? find_cmd(name) : NULL;
    if (!name || !fn) {
        if (name) {
            cli_err("unknown command '%.40s'", name);
            usage(stderr);
            return EXIT_USAGE;
        }
        usage(stdout);
        return EXIT_OK;
    }
    char *argv[] = {(char *)name, "--help", NULL};
    return fn(2, argv, g);
}

int main(int argc, char **argv) {
    static cli_global g; /* static: large (paths), and zeroed */
    conf_init(&g.flags);
    /* connection flags before the command; the command parses the rest (argv[i] is its
     * name, so argp's argv[0] convention holds) */
    argp p;
    argp_init(&p, argc, argv, "kiln");
    while (argp_next(&p)) {
        if (argp_pos(&p)) break;
        if (argp_is(&p, "--help") || argp_is(&p, "-h")) {
            usage(stdout);
            return EXIT_OK;
        }
        if (argp_is(&p, "--version")) {
            printf("kiln %s\n", CLI_VERSION);
            return EXIT_OK;
        }
        int r = conf_flag(&p, &g);
        if (r < 0) return EXIT_USAGE;
        if (r == 0) {
            cli_err("unknown flag %.64s before the command (see kiln --help)", p.arg);
            return EXIT_USAGE;
        }
    }
    if (p.i >= argc) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *name = argv[p.i];
    if (strcmp(name, "help") == 0) return help_cmd(p.i + 1 < argc ? argv[p.i + 1] : NULL, &g);
    if (strcmp(name, "version") == 0) {
        printf("kiln %s\n", CLI_VERSION);
        return EXIT_OK;
    }
    cmd_fn fn = find_cmd(name);
    if (!fn) {
        cli_err("unknown command '%.40s' (commands: generate chat bench stats metrics health)",
                name);
        return EXIT_USAGE;
    }
    return fn(argc - p.i, argv + p.i, &g);
}
