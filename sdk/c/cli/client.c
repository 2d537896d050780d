/* client.c: the CLI's glue to libkiln: connecting with the resolved settings, error
 * lines, Ctrl-C, and streaming one generation (generate and chat share it). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

volatile sig_atomic_t cli_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    cli_interrupted = 1;
}

static struct sigaction saved_sigint; /* what SIGINT did before cli_sigint_arm */
static int sigint_armed;

void cli_sigint_arm(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    /* SA_RESETHAND: the second Ctrl-C gets the default action and ends us at once
     * (status 130 via the signal), for when the server never sends the END */
    sa.sa_flags = SA_RESETHAND;
    cli_interrupted = 0;
    if (sigaction(SIGINT, &sa, sigint_armed ? NULL : &saved_sigint) == 0) sigint_armed = 1;
}

void cli_sigint_disarm(void) {
    /* back to what it was (an ignored SIGINT stays ignored, as the caller wanted) */
    if (sigint_armed) sigaction(SIGINT, &saved_sigint, NULL);
    sigint_armed = 0;
}

/* Short words for the library's own codes, as the first part of an error line. */
static const char *local_label(int code) {
    switch (code) {
    case KILN_ECONNECT: return "connect";
    case KILN_ETLS: return "TLS";
    case KILN_ETIMEOUT: return "timeout";
    case KILN_ECLOSED: return "connection closed";
    case KILN_EPROTO: return "protocol";
    case KILN_EINVAL: return "invalid argument";
    case KILN_ENOMEM: return "out of memory";
    default: return kiln_strerror(code);
    }
}

void cli_kiln_err(const kiln_error *e) {
    const char *msg = e->message[0] ? e->message : NULL;
    if (e->code > 0) {
        if (msg) cli_err("%d %s: %s", e->code, kiln_strerror(e->code), msg);
        else cli_err("%d %s", e->code, kiln_strerror(e->code));
    } else {
        cli_err("%s: %s", local_label(e->code), msg ? msg : kiln_strerror(e->code));
    }
}

/* --verbose: say why the library waits before trying again. */
static void on_retry(void *ud, int status, int attempt, int delay_ms, const char *message) {
    (void)ud;
    fprintf(stderr, "kiln: retry %d in %d ms after %d %s%s%s\n", attempt, delay_ms, status,
            status > 0 ? kiln_strerror(status) : local_label(status),
            message && *message ? ": " : "", message ? message : "");
}

/* The hosts as the comma list libkiln takes. */
static void join_hosts(const conf_conn *c, char *out, size_t cap) {
    size_t pos = 0;
    out[0] = '\0';
    for (int i = 0; i < c->n_hosts; i++) {
        int n = snprintf(out + pos, cap - pos, "%s%s", i ? "," : "", c->hosts[i]);
        if (n < 0 || (size_t)n >= cap - pos) break; /* cannot happen: cap fits all */
        pos += (size_t)n;
    }
}

static conf_conn cf; /* the settings in force (large: paths); one per process */
static int retries_in_force;

int cli_retries(void) {
    return retries_in_force;
}

kiln_client *cli_connect(const cli_global *g, int *rc) {
    static char hosts[CONF_MAX_HOSTS * (CONF_HOST_MAX + 1)];
    *rc = EXIT_USAGE;
    if (conf_resolve(g, &cf) < 0) return NULL;
    if (!cf.token[0]) {
        cli_err("no token: give --token, KILN_TOKEN or `token =` in the config file");
        return NULL;
    }
    if (!cf.ca[0]) {
        cli_err("no CA to check the server certificate against: give --ca FILE, KILN_CA "
                "or `ca =` in the config file");
        return NULL;
    }
    /* the library would say "PK - Read/write of file failed"; name the file instead */
    const char *files[] = {cf.ca, cf.cert, cf.key}, *what[] = {"CA", "certificate", "key"};
    for (int i = 0; i < 3; i++)
        if (files[i][0] && access(files[i], R_OK) < 0) {
            cli_err("%s file %s: %s", what[i], files[i], strerror(errno));
            return NULL;
        }
    join_hosts(&cf, hosts, sizeof hosts);
    kiln_options o;
    kiln_options_init(&o);
    o.hosts = hosts;
    o.token = cf.token;
    o.ca_file = cf.ca;
    o.server_name = cf.server_name[0] ? cf.server_name : NULL;
    o.cert_file = cf.cert[0] ? cf.cert : NULL;
    o.key_file = cf.key[0] ? cf.key : NULL;
    if (cf.set & CS_TIMEOUT) o.connect_timeout_ms = o.io_timeout_ms = cf.timeout_ms;
    if (cf.set & CS_RETRIES) o.retries = cf.retries;
    if (cf.set & CS_PER_HOST) o.connections_per_host = cf.per_host;
    if (g->verbose) o.on_retry = on_retry;
    retries_in_force = o.retries;
    kiln_error err = {0};
    kiln_client *c = kiln_connect(&o, &err);
    *rc = EXIT_FAIL;
    if (!c) {
        cli_kiln_err(&err);
        return NULL;
    }
    if (g->verbose)
        fprintf(stderr, "kiln: connected to %s: model \"%s\", ctx %ld, session %ld, role %s\n",
                kiln_server(c), kiln_model(c), kiln_ctx(c), kiln_session(c), kiln_role(c));
    *rc = EXIT_OK;
    return c;
}

/* A raw stream to one host:port (bench --openai's HTTP): the resolved settings' CA,
 * client certificate, server name, timeout and retries, but not their hosts. plain: an
 * http:// server, no TLS. The token is the caller's (an Authorization header). */
kiln_client *cli_connect_raw(const cli_global *g, const char *hostport, int plain, int *rc) {
    *rc = EXIT_USAGE;
    if (conf_resolve(g, &cf) < 0) return NULL;
    if (!plain && !cf.ca[0]) {
        cli_err("no CA to check the server certificate against: give --ca FILE, KILN_CA "
                "or `ca =` in the config file (or use an http:// URL)");
        return NULL;
    }
    const char *files[] = {cf.ca, cf.cert, cf.key}, *what[] = {"CA", "certificate", "key"};
    for (int i = plain ? 3 : 0; i < 3; i++)
        if (files[i][0] && access(files[i], R_OK) < 0) {
            cli_err("%s file %s: %s", what[i], files[i], strerror(errno));
            return NULL;
        }
    kiln_options o;
    kiln_options_init(&o);
    o.hosts = hostport;
    o.ca_file = cf.ca;
    o.server_name = cf.server_name[0] ? cf.server_name : NULL;
    o.cert_file = cf.cert[0] ? cf.cert : NULL;
    o.key_file = cf.key[0] ? cf.key : NULL;
    if (cf.set & CS_TIMEOUT) o.connect_timeout_ms = o.io_timeout_ms = cf.timeout_ms;
    if (cf.set & CS_RETRIES) o.retries = cf.retries;
    if (g->verbose) o.on_retry = on_retry;
    retries_in_force = o.retries;
    kiln_error err = {0};
    kiln_client *c = kiln_raw_open(&o, plain, &err);
    *rc = EXIT_FAIL;
    if (!c) {
        cli_kiln_err(&err);
        return NULL;
    }
    *rc = EXIT_OK;
    return c;
}

/* The token in force (flags > env > file), "" when none; after cli_connect_raw. */
const char *cli_token(void) { return cf.token; }

/* ------------------------------------------------------------------ streaming */

/* Appends text to a malloc'd buffer of at most max bytes (NUL-terminated). -1 when it
 * could not all fit (what fits is kept). */
static int buf_append(char **buf, size_t *len, size_t max, const char *s, size_t n) {
    if (*len >= max) return n ? -1 : 0;
    size_t take = n < max - *len ? n : max - *len;
    char *nb = realloc(*buf, *len + take + 1);
    if (!nb) return -1;
    memcpy(nb + *len, s, take);
    *len += take;
    nb[*len] = '\0';
    *buf = nb;
    return take == n ? 0 : -1;
}

/* JSON string with the escapes JSON requires; other bytes (UTF-8) pass through. */
static void json_str(FILE *f, const char *s, size_t len) {
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static int stream_on_token(void *ud, const char *text, size_t len, int sample, int token_id,
                           double logprob) {
    stream_req *s = ud;
    s->any_token = 1;
    if (s->logprobs && s->out) {
        /* one JSON object per line: a script can read it without our text framing */
        fprintf(s->out, "{\"sample\":%d,\"token\":%d,\"logprob\":%.6g,\"text\":", sample,
                token_id, logprob);
        json_str(s->out, text, len);
        fputs("}\n", s->out);
        fflush(s->out);
    } else if (sample == 0 && s->out) {
        fwrite(text, 1, len, s->out);
        fflush(s->out); /* streaming: show each piece as it comes */
    }
    if (sample == 0 && s->keep_max &&
        buf_append(&s->kept, &s->kept_len, s->keep_max, text, len) < 0)
        s->oom = 1;
    if (sample > 0 && sample < 8 && !s->logprobs &&
        buf_append(&s->extra[sample], &s->extra_len[sample], STREAM_SAMPLE_MAX, text, len) < 0)
        s->oom = 1;
    return 0;
}

static void stream_on_end(void *ud, int sample, int status, const kiln_usage *u,
                          const char *message) {
    stream_req *s = ud;
    if (status != 0 || sample < 0) {
        s->status = status ? status : KILN_EPROTO;
        s->err.code = s->status;
        snprintf(s->err.message, sizeof s->err.message, "%s", message ? message : "");
        s->done = 1;
        return;
    }
    long sum = s->usage.completion_tokens + u->completion_tokens;
    s->usage = *u;
    s->usage.completion_tokens = sum;
    if (++s->ended >= s->n) s->done = 1;
}

/* Forget what one attempt produced (before a resend). */
static void stream_reset(stream_req *s) {
    stream_free(s);
    s->any_token = s->ended = s->done = s->status = s->cancelled = s->oom = 0;
    memset(&s->usage, 0, sizeof s->usage);
    memset(&s->err, 0, sizeof s->err);
}

void stream_free(stream_req *s) {
    free(s->kept);
    s->kept = NULL, s->kept_len = 0;
    for (int i = 0; i < 8; i++) {
        free(s->extra[i]);
        s->extra[i] = NULL, s->extra_len[i] = 0;
    }
}

/* Pumps until the request is over, turning a Ctrl-C into a CANCEL. */
static void stream_pump(kiln_client *c, kiln_req h, stream_req *s) {
    kiln_error err = {0};
    while (!s->done) {
        if (cli_interrupted && !s->cancelled) {
            s->cancelled = 1;
            if (kiln_cancel(c, h, &err) < 0 && !s->done) {
                /* the CANCEL could not be written: the connection is gone, so is the request */
                s->status = err.code ? err.code : KILN_ECLOSED;
                s->err = err;
                s->done = 1;
                break;
            }
        }
        /* short waits so a Ctrl-C is noticed at once, not after the io timeout */
        int r = kiln_pump(c, 100, &err);
        if (r < 0 && !s->done) {
            s->status = r, s->err = err, s->done = 1;
        } else if (r == 0 && !s->done) {
            s->status = KILN_EPROTO, s->done = 1;
            snprintf(s->err.message, sizeof s->err.message, "request ended without an END");
            s->err.code = s->status;
        }
    }
}

int stream_run(kiln_client *c, const kiln_gen *p, stream_req *s, int retries, int verbose) {
    kiln_callbacks cb = {stream_on_token, stream_on_end};
    if (s->n < 1) s->n = 1;
    for (int attempt = 0;; attempt++) {
        stream_reset(s);
        kiln_req h = kiln_submit(c, p, &cb, s, &s->err);
        if (!h) {
            s->status = s->err.code ? s->err.code : KILN_EINVAL;
            return s->status;
        }
        stream_pump(c, h, s);
        /* a broken connection before any text: nothing was shown, so sending the request
         * again (kiln_submit reconnects, with failover) cannot duplicate output */
        int broke = s->status == KILN_ECLOSED || s->status == KILN_ETIMEOUT;
        if (!broke || s->any_token || s->cancelled || cli_interrupted || attempt >= retries)
            return s->status;
        if (verbose) {
            fprintf(stderr, "kiln: resend %d after: ", attempt + 1);
            fflush(stderr);
            cli_kiln_err(&s->err);
        }
    }
}
