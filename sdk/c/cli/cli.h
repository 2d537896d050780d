/* cli.h: private to the `kiln` command-line tool (the .c files of sdk/c/cli); not part of libkiln.
 *
 * The pieces that do not touch the network live in their own files so they can be read
 * (and checked) on their own: flag parsing (args.c), connection settings from file, env
 * and flags (conf.c), percentiles (pct.c), the progress bar (progress.c), bench reports
 * (report.c) and the chat history (history.c). The commands are cmd_*.c. */
#ifndef KILN_CLI_H
#define KILN_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CLI_VERSION "0.1.0"

/* Exit statuses: the issue fixes 0/1/2 and 130 for an interrupted generate. */
enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2, EXIT_INTERRUPTED = 130 };

/* One error line on stderr: "kiln: ..." (a newline is added). */
void cli_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

double cli_now(void); /* monotonic seconds */

/* ------------------------------------------------------------------ args.c: flags
 * Iterates argv in order. Flags are "--name value" or "--name=value"; "--" ends flags;
 * anything not starting with '-' (and a lone "-") is a positional. Usage:
 *   argp p; argp_init(&p, argc, argv, "generate");
 *   while (argp_next(&p)) {
 *       if (argp_pos(&p)) ... p.arg is the positional
 *       else if (argp_is(&p, "--max-tokens")) { if (argp_int(&p, &v, 0, 1000000)) return 2; }
 *       else return argp_unknown(&p);
 *   }
 * The value getters print one usage error line and return -1. */
typedef struct {
    int argc;
    char **argv;
    int i;              /* index of the current argument */
    const char *arg;    /* the current argument */
    const char *inl;    /* the value after '=' of "--name=value", else NULL */
    size_t name_len;    /* bytes of the flag name (before any '=') */
    int only_pos;       /* after "--" */
    const char *cmd;    /* for messages: "generate" */
} argp;

void argp_init(argp *p, int argc, char **argv, const char *cmd);
int argp_next(argp *p);                      /* 1 while there is an argument */
int argp_pos(const argp *p);                 /* the current one is a positional */
int argp_is(argp *p, const char *name);      /* the current one is flag name */
int argp_str(argp *p, const char **out);     /* its value */
int argp_int(argp *p, int *out, long lo, long hi);
int argp_u64(argp *p, uint64_t *out);
int argp_double(argp *p, double *out, double lo, double hi, int lo_open);
int argp_no_value(argp *p);                  /* a switch: refuses "--chat=1" */
int argp_unknown(const argp *p);             /* prints the error; returns EXIT_USAGE */

/* Strict number parsing shared with conf.c (whole string, range-checked): 0 or -1. */
int parse_long(const char *s, long lo, long hi, long *out);
int parse_u64(const char *s, uint64_t *out);
int parse_double(const char *s, double *out);

/* ------------------------------------------------------------------ conf.c: connection */
#define CONF_MAX_HOSTS 8
#define CONF_HOST_MAX 262 /* "[v6 address]:port" or "name:port" */
#define CONF_PATH_MAX 1024
#define CONF_TOKEN_MAX 256
#define CONF_NAME_MAX 256

/* Which settings a layer gives: a later layer overrides only what it sets. */
enum {
    CS_HOSTS = 1 << 0, CS_TOKEN = 1 << 1, CS_CA = 1 << 2, CS_CERT = 1 << 3, CS_KEY = 1 << 4,
    CS_SERVER_NAME = 1 << 5, CS_TIMEOUT = 1 << 6, CS_RETRIES = 1 << 7, CS_PER_HOST = 1 << 8,
};

typedef struct {
    char hosts[CONF_MAX_HOSTS][CONF_HOST_MAX]; /* failover order */
    int n_hosts;
    char token[CONF_TOKEN_MAX];
    char ca[CONF_PATH_MAX], cert[CONF_PATH_MAX], key[CONF_PATH_MAX];
    char server_name[CONF_NAME_MAX];
    int timeout_ms; /* 0: the library's default */
    int retries;    /* -1: the library's default */
    int per_host;   /* connections to each host; 0: the library's default (1) */
    unsigned set;   /* CS_* */
} conf_conn;

/* Global options: the connection layer from flags plus the config file path. */
typedef struct {
    conf_conn flags;
    const char *config;  /* --config FILE (must exist) or NULL for the default file */
    int verbose;
} cli_global;

void conf_init(conf_conn *c);
/* Adds "h:p" or "h1:p,h2:p" to c->hosts (failover order). 0 or -1 (message printed). */
int conf_add_hosts(conf_conn *c, const char *list, const char *what);
/* Reads `key = value` lines (keys: host token ca cert key server_name timeout_ms
 * retries; '#' or ';' comments). must_exist: an absent file is an error. 0 or -1. */
int conf_load_file(conf_conn *c, const char *path, int must_exist);
int conf_load_env(conf_conn *c); /* KILN_HOST KILN_TOKEN KILN_CA KILN_CERT KILN_KEY */
void conf_merge(conf_conn *dst, const conf_conn *src); /* what src sets wins */
/* The settings in force: file < env < flags, defaults where nothing is set. */
int conf_resolve(const cli_global *g, conf_conn *out);
/* A connection flag (--host --token --ca --cert --key --server-name --timeout-ms
 * --retries --config --verbose): 1 consumed, 0 not one, -1 bad value. */
int conf_flag(argp *p, cli_global *g);
extern const char conf_flags_help[];

/* ------------------------------------------------------------------ pct.c: percentiles
 * Samples kept exactly up to cap, then a uniform reservoir (memory stays bounded on long
 * benches); count, sum, min and max are always exact. */
typedef struct {
    double *v;
    size_t n, cap;   /* kept, room */
    uint64_t seen;   /* offered */
    double sum, min, max;
    uint64_t rng;
    int sorted;
} pct_set;

int pct_init(pct_set *s, size_t cap); /* 0 or -1 (out of memory) */
void pct_free(pct_set *s);
void pct_add(pct_set *s, double x);
/* The p-th percentile (0..100), linear between closest ranks; NAN when empty. */
double pct_get(pct_set *s, double p);
double pct_mean(const pct_set *s);

/* ------------------------------------------------------------------ progress.c */
typedef struct {
    int on;            /* stderr is a terminal and not --quiet */
    double start, last;
    long total;        /* requests, or 0 for a time-bound run */
    double duration;   /* seconds for a time-bound run */
    int drawn;
} progress;

void progress_init(progress *pg, int enabled, long total, double duration);
/* Redraws at most 10 times a second (force: now). */
void progress_update(progress *pg, long done, long errors, long tokens, int force);
void progress_done(progress *pg); /* clears the line */

/* ------------------------------------------------------------------ report.c: bench */
#define REPORT_MAX_CODES 16
typedef struct {
    /* the run */
    int concurrency, connections, max_tokens, prompt_tokens_target;
    long requests_target;   /* 0 with --duration */
    double duration_target; /* 0 with --requests */
    /* outcomes */
    long submitted;     /* GENs sent (kiln_submit gave a handle) */
    long submit_failed; /* kiln_submit refused or could not reconnect (also in errors) */
    long ended;         /* submitted requests that got their final on_end */
    long completed;     /* ... with an END (status 0) other than reason=cancelled */
    long cancelled;     /* ... with END reason=cancelled (Ctrl-C) */
    long errors;        /* ... with an error, plus submit_failed */
    double elapsed_s;
    uint64_t prompt_tokens, output_tokens, cached_tokens;
    int codes[REPORT_MAX_CODES];
    long code_counts[REPORT_MAX_CODES];
    int n_codes;
    pct_set ttft_ms, itl_ms, e2e_ms;
} bench_report;

void report_add_error(bench_report *r, int code);
void report_text(bench_report *r, FILE *f);
void report_json(bench_report *r, FILE *f);
void report_csv(bench_report *r, FILE *f);

/* ------------------------------------------------------------------ history.c: chat
 * `kiln chat` sends the conversation so far as GEN's messages (kiln_gen.msgs), which the
 * server renders through the model's chat template. Bounded: the oldest turns are
 * dropped past HIST_MAX_TURNS or HIST_MAX_BYTES. */
#define HIST_MAX_TURNS 64
#define HIST_MAX_BYTES (48 * 1024)

typedef struct {
    char *text[HIST_MAX_TURNS]; /* alternating: even = user, odd = assistant */
    size_t len[HIST_MAX_TURNS];
    int n;
    size_t bytes;
} history;

void history_init(history *h);
void history_free(history *h);
void history_reset(history *h);
/* Appends one exchange (user line and the answer); drops old exchanges to stay within
 * the bounds. 0 or -1 (out of memory: history unchanged). */
int history_add(history *h, const char *user, size_t ulen, const char *answer, size_t alen);
void history_drop_oldest(history *h); /* one exchange */
/* ------------------------------------------------------------------ client.c: libkiln glue */
#include <signal.h>

#include "kiln.h"

/* (history.c) The conversation for a new line: the system message when given, the kept
 * turns, then line as the last user message, into out[0..HIST_MAX_TURNS + 2); their
 * count. The strings stay h's, system's and line's. */
int history_msgs(const history *h, const char *system, const char *line, kiln_msg *out);

/* Set by the SIGINT handler (cli_sigint_arm); the loops poll it between pumps. */
extern volatile sig_atomic_t cli_interrupted;
/* Catch one SIGINT (a second one kills at once, as the user expects of Ctrl-C twice). */
void cli_sigint_arm(void);
void cli_sigint_disarm(void); /* back to the action before cli_sigint_arm */

/* One error line for a libkiln failure: "kiln: 401 unauthorized: msg",
 * "kiln: TLS: server certificate not trusted: ...". */
void cli_kiln_err(const kiln_error *e);
/* Resolves the settings (file < env < flags) and connects. NULL with *rc set to the
 * exit status (1 failure, 2 bad settings) after printing why. */
kiln_client *cli_connect(const cli_global *g, int *rc);
/* A raw byte stream to hostport (TLS, or TCP when plain) with the resolved CA, client
 * certificate, timeouts and retries; for bench --openai. NULL with *rc as above. */
kiln_client *cli_connect_raw(const cli_global *g, const char *hostport, int plain, int *rc);
const char *cli_token(void); /* the resolved token ("" when none), after cli_connect_raw */
/* --retries in force (after cli_connect), for the CLI's own resends. */
int cli_retries(void);

/* One generation streamed to a FILE, for generate and chat. */
#define STREAM_SAMPLE_MAX (4u << 20) /* bytes kept per extra sample (n > 1) */
typedef struct {
    /* in */
    FILE *out;         /* sample 0's text as it arrives (NULL: not written) */
    int n;             /* samples asked for (1..8) */
    int logprobs;      /* write one JSON line per token instead of raw text */
    size_t keep_max;   /* bytes of sample 0 to keep in kept[] (0: none) */
    /* out */
    char *kept;        /* sample 0's text (malloc'd, NUL-terminated), up to keep_max */
    size_t kept_len;
    char *extra[8];    /* samples 1..n-1, printed after sample 0 */
    size_t extra_len[8];
    int any_token;     /* a TOK arrived (a resend would duplicate output) */
    int ended, done;   /* samples ended; the request is over */
    int status;        /* 0 END, else the ERR / library code */
    int cancelled;     /* Ctrl-C sent a CANCEL */
    kiln_usage usage;  /* the last END's, completion_tokens summed over samples */
    kiln_error err;    /* the error when status != 0 */
    int oom;           /* a buffer could not grow: text was dropped */
} stream_req;

/* Submits p and pumps until it is over; a Ctrl-C (cli_interrupted) sends CANCEL and
 * keeps pumping until the END. A connection that breaks before any token is retried
 * (resend, with failover) up to `retries` times. Returns s->status. */
int stream_run(kiln_client *c, const kiln_gen *p, stream_req *s, int retries, int verbose);
void stream_free(stream_req *s);

/* ------------------------------------------------------------------ cmd_generate.c: shared */
typedef struct {
    kiln_gen p; /* strings point into argv */
} gen_opts;
extern const char gen_flags_help[];
void gen_opts_init(gen_opts *o); /* server defaults, chat on */
/* A sampling flag (see gen_flags_help): 1 consumed, 0 not one, -1 bad value. */
int gen_flag(argp *p, gen_opts *o);
int gen_check(const gen_opts *o, const char *cmd); /* 0 or -1 (message printed) */
char *read_stdin_prompt(void);
void print_usage_line(kiln_client *c, const kiln_usage *u); /* --verbose summary */

/* ------------------------------------------------------------------ commands */
int cmd_generate(int argc, char **argv, cli_global *g);
int cmd_chat(int argc, char **argv, cli_global *g);
int cmd_stats(int argc, char **argv, cli_global *g);
int cmd_metrics(int argc, char **argv, cli_global *g);
int cmd_health(int argc, char **argv, cli_global *g);
int cmd_bench(int argc, char **argv, cli_global *g);
int cmd_update(int argc, char **argv, cli_global *g);

#endif
