/* cmd_info.c: the one-shot verbs: `kiln stats`, `kiln metrics`, `kiln health`, and the
 * admin's `kiln update` (a network update). */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* The flags these commands share: connection flags, --json, --help.
 * EXIT_OK to go on, -1 after --help, else the exit status. */
static int info_args(int argc, char **argv, cli_global *g, const char *help, int *json) {
    argp p;
    argp_init(&p, argc, argv, argv[0]);
    while (argp_next(&p)) {
        int k;
        if (argp_is(&p, "--help") || argp_is(&p, "-h")) {
            fputs(help, stdout);
            fputs(conf_flags_help, stdout);
            return -1;
        }
        if (json && argp_is(&p, "--json")) {
            if (argp_no_value(&p) < 0) return EXIT_USAGE;
            *json = 1;
        } else if ((k = conf_flag(&p, g)) != 0) {
            if (k < 0) return EXIT_USAGE;
        } else {
            return argp_unknown(&p);
        }
    }
    return EXIT_OK;
}

/* JSON's number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? (".5" is not). */
static int json_number(const char *s) {
    if (*s == '-') s++;
    if (*s == '0') s++;
    else if (*s >= '1' && *s <= '9') while (*s >= '0' && *s <= '9') s++;
    else return 0;
    if (*s == '.') {
        if (!(*++s >= '0' && *s <= '9')) return 0;
        while (*s >= '0' && *s <= '9') s++;
    }
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-') s++;
        if (!(*s >= '0' && *s <= '9')) return 0;
        while (*s >= '0' && *s <= '9') s++;
    }
    return *s == '\0';
}

/* A STATS value as JSON: numbers bare (they are bare words on the wire), the rest as
 * strings. */
static void json_value(const char *v) {
    if (json_number(v)) {
        fputs(v, stdout);
        return;
    }
    putchar('"');
    for (const char *c = v; *c; c++) {
        if (*c == '"' || *c == '\\') putchar('\\');
        if ((unsigned char)*c >= 0x20) putchar(*c);
    }
    putchar('"');
}

int cmd_stats(int argc, char **argv, cli_global *g) {
    int json = 0, rc;
    rc = info_args(argc, argv, g,
                   "usage: kiln stats [--json] [connection flags]\n"
                   "Prints the server's STATS counters, one key=value per line (--json: one\n"
                   "object). Keys include uptime_s requests_total running waiting\n"
                   "kv_blocks_used kv_blocks_total kv_usage prefix_hit_rate ...\n\n",
                   &json);
    if (rc != EXIT_OK) return rc < 0 ? EXIT_OK : rc;
    kiln_client *c = cli_connect(g, &rc);
    if (!c) return rc;
    static kiln_stats_info s;
    kiln_error err = {0};
    if (kiln_stats(c, &s, &err) != 0) {
        cli_kiln_err(&err);
        kiln_close(c);
        return EXIT_FAIL;
    }
    if (json) putchar('{');
    for (int i = 0; i < s.n && i < KILN_STATS_MAX; i++) {
        if (json) {
            printf("%s\"%s\":", i ? "," : "", s.kv[i].key);
            json_value(s.kv[i].value);
        } else {
            printf("%s=%s\n", s.kv[i].key, s.kv[i].value);
        }
    }
    if (json) puts("}");
    kiln_close(c);
    return EXIT_OK;
}

int cmd_metrics(int argc, char **argv, cli_global *g) {
    int rc = info_args(argc, argv, g,
                       "usage: kiln metrics [connection flags]\n"
                       "Prints the server's metrics in the Prometheus text format (the METRICS\n"
                       "verb over the protocol connection; the same text as GET /metrics).\n\n",
                       NULL);
    if (rc != EXIT_OK) return rc < 0 ? EXIT_OK : rc;
    kiln_client *c = cli_connect(g, &rc);
    if (!c) return rc;
    kiln_error err = {0};
    size_t len = 0;
    char *body = kiln_metrics(c, &len, &err);
    kiln_close(c);
    if (!body) {
        cli_kiln_err(&err);
        return EXIT_FAIL;
    }
    fwrite(body, 1, len, stdout);
    free(body);
    return fflush(stdout) == 0 ? EXIT_OK : EXIT_FAIL;
}

int cmd_health(int argc, char **argv, cli_global *g) {
    int json = 0;
    int rc = info_args(argc, argv, g,
                       "usage: kiln health [--json] [connection flags]\n"
                       "Asks the server HEALTH and prints the reply:\n"
                       "  live=1 ready=1 level=0 running=N waiting=N draining=0\n"
                       "Exit status 0 when live and ready, 1 otherwise (including when the\n"
                       "server cannot be reached).\n\n",
                       &json);
    if (rc != EXIT_OK) return rc < 0 ? EXIT_OK : rc;
    kiln_client *c = cli_connect(g, &rc);
    if (!c) return rc;
    kiln_health_info h;
    kiln_error err = {0};
    int st = kiln_health(c, &h, &err);
    kiln_close(c);
    if (st != 0) {
        cli_kiln_err(&err);
        return EXIT_FAIL;
    }
    printf(json ? "{\"live\":%d,\"ready\":%d,\"level\":%d,\"running\":%d,\"waiting\":%d,"
                  "\"draining\":%d}\n"
                : "live=%d ready=%d level=%d running=%d waiting=%d draining=%d\n",
           h.live, h.ready, h.level, h.running, h.waiting, h.draining);
    return h.live && h.ready ? EXIT_OK : EXIT_FAIL;
}

static void update_progress(void *ud, uint64_t bytes, uint64_t total) {
    (void)ud;
    fprintf(stderr, "kiln: update: %llu of %llu bytes\n", (unsigned long long)bytes, (unsigned long long)total);
}

/* `kiln update BUNDLE [--tries N] [--reboot]`: the network update (admin). */
int cmd_update(int argc, char **argv, cli_global *g) {
    static const char help[] =
        "usage: kiln update BUNDLE [--tries N] [--reboot] [--quiet] [connection flags]\n"
        "Streams a signed image bundle (kiln-image sign's .kimg) into the box's inactive\n"
        "slot (UPDATE; an admin token is needed). The box's kiln-init verifies it with its\n"
        "built-in key before it becomes the next boot, tried N times (1..9, default 3).\n"
        "--reboot: then REBOOT the box into it. Progress on stderr; the result on stdout.\n\n";
    const char *bundle = NULL;
    int tries = 3, reboot = 0, quiet = 0, k, rc;
    argp p;
    argp_init(&p, argc, argv, argv[0]);
    while (argp_next(&p)) {
        if (argp_is(&p, "--help") || argp_is(&p, "-h")) {
            fputs(help, stdout);
            fputs(conf_flags_help, stdout);
            return EXIT_OK;
        }
        if (argp_pos(&p) && !bundle) bundle = p.arg;
        else if (argp_is(&p, "--tries")) { if (argp_int(&p, &tries, 1, 9)) return EXIT_USAGE; }
        else if (argp_is(&p, "--reboot")) { if (argp_no_value(&p) < 0) return EXIT_USAGE; reboot = 1; }
        else if (argp_is(&p, "--quiet")) { if (argp_no_value(&p) < 0) return EXIT_USAGE; quiet = 1; }
        else if ((k = conf_flag(&p, g)) != 0) { if (k < 0) return EXIT_USAGE; }
        else return argp_unknown(&p);
    }
    if (!bundle) {
        cli_err("update: which bundle? (kiln update BUNDLE)");
        return EXIT_USAGE;
    }
    kiln_client *c = cli_connect(g, &rc);
    if (!c) return rc;
    kiln_error err = {0};
    char reply[512], rb[128] = "";
    int st = kiln_update(c, bundle, tries, quiet ? NULL : update_progress, NULL, reply, sizeof reply, &err);
    if (st == 0) printf("%s\n", reply);
    if (st == 0 && reboot && (st = kiln_command(c, "REBOOT", rb, sizeof rb, &err)) == 0) printf("%s\n", rb);
    if (st != 0) {
        cli_kiln_err(&err);
        kiln_close(c);
        return EXIT_FAIL;
    }
    kiln_close(c);
    return EXIT_OK;
}
