/* args.c: flag iteration and strict value parsing for the kiln CLI.
 * Numbers are checked whole and against their range here, so a typo is a usage error
 * (exit 2) with one line saying which flag, rather than a server-side 400 later. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

void cli_err(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "kiln: %s\n", buf);
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int parse_long(const char *s, long lo, long hi, long *out) {
    if (!s || !*s) return -1;
    /* strtol accepts leading spaces and '+'; the CLI does not */
    if (!(s[0] == '-' || (s[0] >= '0' && s[0] <= '9'))) return -1;
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int parse_u64(const char *s, uint64_t *out) {
    if (!s || !(s[0] >= '0' && s[0] <= '9')) return -1; /* strtoull takes "-1" */
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return -1;
    *out = (uint64_t)v;
    return 0;
}

int parse_double(const char *s, double *out) {
    if (!s || !*s) return -1;
    /* decimal only: no spaces, '+', hex floats, inf or nan (the protocol refuses them) */
    for (const char *c = s; *c; c++)
        if (!strchr("0123456789.-eE+", *c)) return -1;
    if (s[0] == '+') return -1;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

void argp_init(argp *p, int argc, char **argv, const char *cmd) {
    memset(p, 0, sizeof *p);
    p->argc = argc, p->argv = argv, p->i = 0, p->cmd = cmd;
}

int argp_next(argp *p) {
    for (;;) {
        if (++p->i >= p->argc) return 0;
        p->arg = p->argv[p->i];
        p->inl = NULL;
        if (!p->only_pos && strcmp(p->arg, "--") == 0) {
            p->only_pos = 1;
            continue;
        }
        const char *eq = strchr(p->arg, '=');
        p->name_len = eq && !argp_pos(p) ? (size_t)(eq - p->arg) : strlen(p->arg);
        if (eq && !argp_pos(p)) p->inl = eq + 1;
        return 1;
    }
}

int argp_pos(const argp *p) {
    return p->only_pos || p->arg[0] != '-' || p->arg[1] == '\0';
}

int argp_is(argp *p, const char *name) {
    return !argp_pos(p) && strlen(name) == p->name_len && memcmp(p->arg, name, p->name_len) == 0;
}

/* The flag's name for messages (without any "=value"). */
static void flag_name(const argp *p, char *out, size_t cap) {
    size_t n = p->name_len < cap - 1 ? p->name_len : cap - 1;
    memcpy(out, p->arg, n);
    out[n] = '\0';
}

int argp_str(argp *p, const char **out) {
    if (p->inl) {
        *out = p->inl;
        return 0;
    }
    if (p->i + 1 >= p->argc) {
        char n[64];
        flag_name(p, n, sizeof n);
        cli_err("%s: %s needs a value", p->cmd, n);
        return -1;
    }
    *out = p->argv[++p->i];
    return 0;
}

static int bad_value(const argp *p, const char *v, const char *want) {
    char n[64];
    flag_name(p, n, sizeof n);
    cli_err("%s: %s: expected %s, got '%.64s'", p->cmd, n, want, v);
    return -1;
}

int argp_int(argp *p, int *out, long lo, long hi) {
    const char *v;
    long x;
    if (argp_str(p, &v) < 0) return -1;
    if (parse_long(v, lo, hi, &x) < 0) {
        char want[96];
        snprintf(want, sizeof want, "an integer in [%ld, %ld]", lo, hi);
        return bad_value(p, v, want);
    }
    *out = (int)x;
    return 0;
}

int argp_u64(argp *p, uint64_t *out) {
    const char *v;
    if (argp_str(p, &v) < 0) return -1;
    if (parse_u64(v, out) < 0) return bad_value(p, v, "an integer in [0, 18446744073709551615]");
    return 0;
}

int argp_double(argp *p, double *out, double lo, double hi, int lo_open) {
    const char *v;
    double x;
    if (argp_str(p, &v) < 0) return -1;
    if (parse_double(v, &x) < 0 || x > hi || x < lo || (lo_open && x == lo)) {
        char want[96];
        snprintf(want, sizeof want, "a number in %c%g, %g]", lo_open ? '(' : '[', lo, hi);
        return bad_value(p, v, want);
    }
    *out = x;
    return 0;
}

int argp_no_value(argp *p) {
    if (!p->inl) return 0;
    char n[64];
    flag_name(p, n, sizeof n);
    cli_err("%s: %s takes no value", p->cmd, n);
    return -1;
}

int argp_unknown(const argp *p) {
    if (argp_pos(p))
        cli_err("%s: unexpected argument '%.64s' (see kiln %s --help)", p->cmd, p->arg, p->cmd);
    else
        cli_err("%s: unknown flag %.64s (see kiln %s --help)", p->cmd, p->arg, p->cmd);
    return EXIT_USAGE;
}
