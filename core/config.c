/* config: kiln.ini through inih. One table describes every key (section, name, type,
 * field, range); parsing, cfg_set, cfg_get, cfg_dump and cfg_equal all walk it, so a
 * new knob is a new row plus its line in docs/CONFIG.md.
 *
 * inih (built without INI_HANDLER_LINENO) does not tell the handler the line number, so
 * we feed it through our own reader, which counts lines, keeps a pointer to the raw
 * line (to tell an indented continuation line from a key), and checks [section] lines
 * itself (inih does not call the handler for an empty section). Floats are read with
 * strtod after a strict syntax scan; kilnd never calls setlocale, so '.' is the point. */
#include "core/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <ini.h>

#include "mm/kv.h"

#define CFG_LINE_MAX 4096 /* INI_MAX_LINE in scripts/deps.sh; inih keeps 3 bytes for \r\n\0 */

/* ---------------------------------------------------------------- the key table */

enum { T_INT, T_U64, T_DBL, T_BOOL, T_ENUM, T_STR, T_LISTEN };
enum { F_POW2 = 1, F_SIZE = 2, F_REQ = 4, F_NAME = 8 };

typedef struct {
    const char *sec, *name;
    int type, flags;
    size_t off;               /* offsetof(kiln_config, field) */
    int64_t lo, hi;           /* T_INT */
    double dlo, dhi;          /* T_DBL */
    int64_t unit;             /* T_INT with F_SIZE: bytes per unit of the plain number */
    const char *const *names; /* T_ENUM, indexed by value; NULL-terminated */
} cfg_key;

static const char *const backends[] = {"auto", "cpu", "cuda", NULL};
static const char *const prefills[] = {"kiln", "cublas", NULL};
static const char *const drivers[] = {"host", "tap", "packet", NULL};
static const char *const levels[] = {"error", "warn", "info", "debug", NULL};
static const char *const sections[] = {"model", "engine", "sampling", "net", "log", NULL};

#define OFF(f) offsetof(kiln_config, f)
#define INT(s, n, f, l, h, fl, u) {s, n, T_INT, fl, OFF(f), l, h, 0, 0, u, NULL}
#define DBL(s, n, f, l, h) {s, n, T_DBL, 0, OFF(f), 0, 0, l, h, 0, NULL}
#define ENUM(s, n, f, v) {s, n, T_ENUM, 0, OFF(f), 0, 0, 0, 0, 0, v}
#define STR(s, n, f, fl) {s, n, T_STR, fl, OFF(f), 0, 0, 0, 0, 0, NULL}

static const cfg_key keys[] = {
    STR("model", "path", model.path, F_REQ),
    ENUM("model", "chat_template", model.chat_template, chat_template_names),
    STR("model", "served_model_name", model.served_model_name, F_NAME),
    ENUM("engine", "backend", engine.backend, backends),
    INT("engine", "threads", engine.threads, 0, 1024, 0, 1),
    INT("engine", "block_size", engine.block_size, 8, 256, F_POW2, 1),
    INT("engine", "kv_pool_mb", engine.kv_pool_mb, 0, 1048576, F_SIZE, 1 << 20),
    DBL("engine", "gpu_memory_utilization", engine.gpu_memory_utilization, 0.1, 0.99),
    ENUM("engine", "cuda_prefill", engine.cuda_prefill, prefills),
    {"engine", "cuda_graphs", T_BOOL, 0, OFF(engine.cuda_graphs), 0, 0, 0, 0, 0, NULL},
    INT("engine", "max_batch_size", engine.max_batch_size, 1, 1024, 0, 1),
    INT("engine", "max_batched_tokens", engine.max_batched_tokens, 1, 131072, 0, 1),
    INT("engine", "max_seq_len", engine.max_seq_len, 16, 1048576, 0, 1),
    {"engine", "prefix_caching", T_BOOL, 0, OFF(engine.prefix_caching), 0, 0, 0, 0, 0, NULL},
    {"engine", "fair_batch", T_BOOL, 0, OFF(engine.fair_batch), 0, 0, 0, 0, 0, NULL},
    INT("engine", "itl_target_ms", engine.itl_target_ms, 0, 60000, 0, 1),
    {"engine", "kv_8bit", T_BOOL, 0, OFF(engine.kv_8bit), 0, 0, 0, 0, 0, NULL},
    INT("engine", "max_queued_requests", engine.max_queued_requests, 1, 65536, 0, 1),
    INT("engine", "max_queued_tokens", engine.max_queued_tokens, 1, 16777216, 0, 1),
    INT("engine", "default_max_tokens", engine.default_max_tokens, 1, 1048576, 0, 1),
    INT("engine", "step_timeout_ms", engine.step_timeout_ms, 100, 600000, 0, 1),
    INT("engine", "drain_timeout_ms", engine.drain_timeout_ms, 0, 3600000, 0, 1),
    DBL("engine", "ladder_high", engine.ladder_high, 0.05, 1),
    DBL("engine", "ladder_low", engine.ladder_low, 0, 0.99),
    INT("engine", "ladder_hold_ms", engine.ladder_hold_ms, 0, 600000, 0, 1),
    INT("engine", "ladder_tick_ms", engine.ladder_tick_ms, 10, 10000, 0, 1),
    DBL("sampling", "temperature", sampling.temperature, 0, 10),
    DBL("sampling", "top_p", sampling.top_p, 0, 1),
    INT("sampling", "top_k", sampling.top_k, 0, 1048576, 0, 1),
    DBL("sampling", "min_p", sampling.min_p, 0, 1),
    DBL("sampling", "repeat_penalty", sampling.repeat_penalty, 0.1, 10),
    {"sampling", "seed", T_U64, 0, OFF(sampling.seed), 0, 0, 0, 0, 0, NULL},
    ENUM("net", "driver", net.driver, drivers),
    {"net", "listen", T_LISTEN, 0, OFF(net.listen_host), 0, 0, 0, 0, 0, NULL},
    INT("net", "metrics_port", net.metrics_port, 0, 65535, 0, 1),
    STR("net", "cert", net.cert, F_REQ),
    STR("net", "key", net.key, F_REQ),
    STR("net", "client_ca", net.client_ca, 0),
    STR("net", "tokens_file", net.tokens_file, F_REQ),
    INT("net", "max_connections", net.max_connections, 1, 65536, 0, 1),
    INT("net", "idle_timeout_ms", net.idle_timeout_ms, 1000, 86400000, 0, 1),
    INT("net", "handshake_timeout_ms", net.handshake_timeout_ms, 100, 300000, 0, 1),
    INT("net", "max_pending_connections", net.max_pending_connections, 1, 65536, 0, 1),
    INT("net", "max_pending_per_address", net.max_pending_per_address, 1, 65536, 0, 1),
    INT("net", "max_connections_per_token", net.max_connections_per_token, 0, 65536, 0, 1),
    INT("net", "max_requests_per_token", net.max_requests_per_token, 0, 1048576, 0, 1),
    INT("net", "max_line_bytes", net.max_line_bytes, 4096, 67108864, F_SIZE, 1),
    INT("net", "max_requests_per_conn", net.max_requests_per_conn, 1, 4096, 0, 1),
    INT("net", "max_output_bytes", net.max_output_bytes, 16384, 1073741824, F_SIZE, 1),
    INT("net", "max_http_head_bytes", net.max_http_head_bytes, 1024, 1048576, F_SIZE, 1),
    INT("net", "max_http_body_bytes", net.max_http_body_bytes, 16384, 67108864, F_SIZE, 1),
    STR("net", "interface", net.interface, 0),
    STR("net", "address", net.address, F_REQ),
    STR("net", "gateway", net.gateway, 0),
    STR("net", "dns", net.dns, 0),
    STR("net", "mac", net.mac, 0),
    STR("net", "hostname", net.hostname, 0),
    ENUM("log", "level", log.level, levels),
};
#define N_KEYS ((int)(sizeof keys / sizeof keys[0]))

void cfg_defaults(kiln_config *c) {
    memset(c, 0, sizeof *c);
    strcpy(c->model.path, "models/SmolLM2-135M-Instruct.Q4_1.gguf");
    c->model.chat_template = CFG_TEMPLATE_AUTO;
    c->engine.backend = CFG_BACKEND_AUTO;
    c->engine.threads = 0;
    c->engine.block_size = 16;
    c->engine.kv_pool_mb = 0;
    c->engine.gpu_memory_utilization = 0.9;
    c->engine.cuda_prefill = CFG_PREFILL_KILN;
    c->engine.cuda_graphs = 1;
    c->engine.max_batch_size = 32;
    c->engine.max_batched_tokens = 512;
    c->engine.max_seq_len = 4096;
    c->engine.prefix_caching = 1;
    c->engine.fair_batch = 1;
    c->engine.kv_8bit = 1;
    c->engine.max_queued_requests = 256;
    c->engine.max_queued_tokens = 262144;
    c->engine.default_max_tokens = 256;
    c->engine.step_timeout_ms = 60000;
    c->engine.drain_timeout_ms = 30000;
    c->engine.ladder_high = 0.9;
    c->engine.ladder_low = 0.8;
    c->engine.ladder_hold_ms = 5000;
    c->engine.ladder_tick_ms = 250;
    c->sampling.temperature = 0.7;
    c->sampling.top_p = 0.9;
    c->sampling.top_k = 0;
    c->sampling.min_p = 0;
    c->sampling.repeat_penalty = 1.0;
    c->sampling.seed = 0;
    c->net.driver = CFG_DRIVER_HOST;
    strcpy(c->net.listen_host, "0.0.0.0");
    c->net.listen_port = 8443;
    c->net.metrics_port = 9100;
    strcpy(c->net.cert, "tls/server.crt");
    strcpy(c->net.key, "tls/server.key");
    strcpy(c->net.tokens_file, "tokens.txt");
    c->net.max_connections = 256;
    c->net.idle_timeout_ms = 300000;
    c->net.handshake_timeout_ms = 5000;
    c->net.max_pending_connections = 64;
    c->net.max_pending_per_address = 32;
    c->net.max_line_bytes = 1048576;
    c->net.max_requests_per_conn = 64;
    c->net.max_output_bytes = 1048576;
    c->net.max_http_head_bytes = 16384;
    c->net.max_http_body_bytes = 1048576;
    strcpy(c->net.interface, "eth0");
    strcpy(c->net.address, "dhcp");
    c->log.level = CFG_LOG_INFO;
}

static int find_key(const char *sec, const char *name) {
    for (int i = 0; i < N_KEYS; i++)
        if (!strcmp(keys[i].sec, sec) && !strcmp(keys[i].name, name)) return i;
    return -1;
}

static int known_section(const char *sec) {
    for (int i = 0; sections[i]; i++)
        if (!strcmp(sections[i], sec)) return 1;
    return 0;
}

/* ---------------------------------------------------------------- messages */

static void emsg(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* A value as it appears in a message: at most 60 bytes, control bytes shown as '?'. */
static const char *echo(const char *v, char buf[72]) {
    size_t n = 0;
    for (; v[n] && n < 60; n++) buf[n] = (unsigned char)v[n] < 0x20 || v[n] == 0x7f ? '?' : v[n];
    if (v[n]) memcpy(buf + n, "...", 3), n += 3;
    buf[n] = '\0';
    return buf;
}

/* Levenshtein distance of two short names, capped: names longer than 31 bytes get 99. */
static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 31 || lb > 31) return 99;
    int row[32];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            if (up + 1 < best) best = up + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* "did you mean" text for an unknown key or section, or "". */
static void suggest_key(const char *sec, const char *name, char *out, size_t cap) {
    out[0] = '\0';
    for (int i = 0; i < N_KEYS; i++)
        if (!strcmp(keys[i].name, name)) {
            snprintf(out, cap, " (it belongs in [%s])", keys[i].sec);
            return;
        }
    int best = 3, bi = -1;
    for (int i = 0; i < N_KEYS; i++) {
        if (strcmp(keys[i].sec, sec)) continue;
        int d = edit_distance(name, keys[i].name);
        if (d < best) best = d, bi = i;
    }
    if (bi >= 0) snprintf(out, cap, " (did you mean %s?)", keys[bi].name);
}

static void suggest_section(const char *sec, char *out, size_t cap) {
    int best = 3, bi = -1;
    for (int i = 0; sections[i]; i++) {
        int d = edit_distance(sec, sections[i]);
        if (d < best) best = d, bi = i;
    }
    if (bi >= 0)
        snprintf(out, cap, "did you mean [%s]?", sections[bi]);
    else
        snprintf(out, cap, "sections are [model] [engine] [sampling] [net] [log]");
}

/* ---------------------------------------------------------------- value parsers */

/* Strict decimal integer: optional '-', digits, and when size is set one of K M G T
 * (powers of 1024, either case). The result is in units of unit bytes; a suffixed value
 * that is not a whole number of units is rejected. 0 ok, -1 junk, -2 out of range, -3
 * not a whole unit. */
static int parse_int(const char *v, int size, int64_t unit, int64_t *out) {
    const char *p = v;
    int neg = *p == '-';
    if (neg) p++;
    if (!isdigit((unsigned char)*p)) return -1;
    uint64_t m = 0;
    int big = 0;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (m > (UINT64_MAX - d) / 10) big = 1;
        else m = m * 10 + d;
    }
    if (*p) {
        static const char sfx[] = "KMGT";
        const char *s = size ? strchr(sfx, toupper((unsigned char)*p)) : NULL;
        if (!s || p[1]) return -1;
        for (int k = 0; k <= (int)(s - sfx); k++) {
            if (m > UINT64_MAX / 1024) big = 1;
            else m *= 1024;
        }
        if (!big && m % (uint64_t)unit) return -3;
        m /= (uint64_t)unit;
    }
    if (big || m > INT64_MAX) return -2;
    if (neg) return -2; /* every integer key is >= 0, and "-0" is not written */
    *out = (int64_t)m;
    return 0;
}

static int parse_u64(const char *v, uint64_t *out) {
    if (!isdigit((unsigned char)*v)) return -1;
    uint64_t m = 0;
    for (; isdigit((unsigned char)*v); v++) {
        unsigned d = (unsigned)(*v - '0');
        if (m > (UINT64_MAX - d) / 10) return -2;
        m = m * 10 + d;
    }
    if (*v) return -1;
    *out = m;
    return 0;
}

/* Decimal float: [-]digits[.digits][e[+-]digits] (".5" and "5." too); no hex, inf or
 * nan. 0 ok, -1 junk, -2 not finite. */
static int parse_dbl(const char *v, double *out) {
    const char *p = v;
    int digits = 0;
    if (*p == '-') p++;
    while (isdigit((unsigned char)*p)) p++, digits++;
    if (*p == '.') {
        p++;
        while (isdigit((unsigned char)*p)) p++, digits++;
    }
    if (!digits) return -1;
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (!isdigit((unsigned char)*p)) return -1;
        while (isdigit((unsigned char)*p)) p++;
    }
    if (*p) return -1;
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (end != p) return -1;
    if (!isfinite(d)) return -2;
    *out = d;
    return 0;
}

static int parse_bool(const char *v, int *out) {
    static const char *const t[] = {"true", "yes", "on", "1"}, *const f[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(v, t[i])) return *out = 1, 0;
        if (!strcasecmp(v, f[i])) return *out = 0, 0;
    }
    return -1;
}

/* Dotted-quad IPv4 ("0".."255" each, no leading zeros) ':' port 1..65535. */
static int parse_listen(const char *v, char host[CFG_HOST_MAX], int *port) {
    const char *colon = strrchr(v, ':');
    if (!colon || colon - v >= CFG_HOST_MAX) return -1;
    const char *p = v;
    for (int part = 0; part < 4; part++) {
        if (part && *p++ != '.') return -1;
        if (!isdigit((unsigned char)*p)) return -1;
        int n = 0, len = 0;
        for (; isdigit((unsigned char)*p) && len < 4; p++, len++) n = n * 10 + (*p - '0');
        if (len > 3 || n > 255 || (len > 1 && p[-len] == '0')) return -1;
    }
    if (p != colon) return -1;
    int64_t pn;
    if (parse_int(colon + 1, 0, 1, &pn) || pn < 1 || pn > 65535) return -1;
    memcpy(host, v, (size_t)(colon - v));
    host[colon - v] = '\0';
    *port = (int)pn;
    return 0;
}

/* ---------------------------------------------------------------- one key */

/* Parse value for key k into c, or write "[sec] key = value: what is allowed" after
 * prefix into err. 0 or -EINVAL; c is untouched on error. */
/* A name clients type and match byte for byte (the OpenAI API's `model`, a metric
 * label, the line protocol's INFO): what model hubs use in repository names, nothing a
 * JSON string, a label or a quoted value would need to escape. NULL when it is fine. */
static const char *name_bad(const char *v, size_t n) {
    if (n > CFG_NAME_MAX) return "longer than " CFG_NAME_MAX_S " bytes";
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)v[i]) && !strchr("._-/:@+", v[i]))
            return "only letters, digits and . _ - / : @ + are allowed";
    return NULL;
}

static int set_key(kiln_config *c, int k, const char *value, const char *prefix, char *err,
                   size_t errlen) {
    const cfg_key *K = &keys[k];
    char *field = (char *)c + K->off;
    char eb[72];
    const char *ev = echo(value, eb);
#define BAD(...)                                                                        \
    do {                                                                                \
        char why_[288];                                                                 \
        snprintf(why_, sizeof why_, __VA_ARGS__);                                       \
        emsg(err, errlen, "%s[%s] %s = %s: %s", prefix, K->sec, K->name, ev, why_);     \
        return -EINVAL;                                                                 \
    } while (0)
    switch (K->type) {
    case T_INT: {
        int64_t n;
        int r = parse_int(value, K->flags & F_SIZE, K->unit, &n);
        const char *kind = K->flags & F_POW2 ? "a power of two " : "";
        const char *sfx = K->flags & F_SIZE ? (K->unit > 1 ? " MiB (or with K/M/G/T)" : " bytes (or with K/M/G/T)") : "";
        if (r == -1) BAD("not an integer: must be %s%lld..%lld%s", kind, (long long)K->lo, (long long)K->hi, sfx);
        if (r == -3) BAD("not a whole number of MiB: must be %lld..%lld%s", (long long)K->lo, (long long)K->hi, sfx);
        if (r == -2 || n < K->lo || n > K->hi || ((K->flags & F_POW2) && (n & (n - 1))))
            BAD("must be %s%lld..%lld%s", kind, (long long)K->lo, (long long)K->hi, sfx);
        *(int *)field = (int)n;
        return 0;
    }
    case T_U64: {
        uint64_t n;
        int r = parse_u64(value, &n);
        if (r == -1) BAD("not an integer: must be 0..%llu", (unsigned long long)UINT64_MAX);
        if (r == -2) BAD("must be 0..%llu", (unsigned long long)UINT64_MAX);
        memcpy(field, &n, sizeof n);
        return 0;
    }
    case T_DBL: {
        double d;
        int r = parse_dbl(value, &d);
        if (r == -1) BAD("not a decimal number: must be %g..%g", K->dlo, K->dhi);
        if (r == -2 || d < K->dlo || d > K->dhi) BAD("must be %g..%g", K->dlo, K->dhi);
        memcpy(field, &d, sizeof d);
        return 0;
    }
    case T_BOOL: {
        int b;
        if (parse_bool(value, &b)) BAD("must be true|false|yes|no|on|off|1|0");
        *(int *)field = b;
        return 0;
    }
    case T_ENUM: {
        for (int i = 0; K->names[i]; i++)
            if (!strcasecmp(value, K->names[i])) {
                *(int *)field = i;
                return 0;
            }
        /* every choice, '|'-separated; bounded to fit BAD's reason (cut, never overrun) */
        char all[256];
        size_t k = 0;
        all[0] = 0;
        for (int i = 0; K->names[i] && k < sizeof all; i++)
            k += (size_t)snprintf(all + k, sizeof all - k, "%s%s", i ? "|" : "", K->names[i]);
        BAD("must be %s", all);
    }
    case T_STR: {
        size_t n = strnlen(value, CFG_STR_MAX + 1);
        if (n > CFG_STR_MAX) BAD("longer than %d bytes", CFG_STR_MAX);
        if (!n && (K->flags & F_REQ)) BAD("must not be empty");
        for (size_t i = 0; i < n; i++) {
            unsigned char ch = (unsigned char)value[i];
            if (ch < 0x20 || ch == 0x7f) BAD("contains a control character");
            if (ch == ';' && (!i || isspace((unsigned char)value[i - 1])))
                BAD("';' at the start or after a space begins a comment");
        }
        if (n && (isspace((unsigned char)value[0]) || isspace((unsigned char)value[n - 1])))
            BAD("must not begin or end with a space");
        if (value[0] == '"' || value[0] == '\'') BAD("write it without quotes");
        if ((K->flags & F_NAME) && name_bad(value, n)) BAD("%s", name_bad(value, n));
        memset(field, 0, CFG_STR_MAX + 1);
        memcpy(field, value, n);
        return 0;
    }
    case T_LISTEN: {
        char host[CFG_HOST_MAX];
        int port;
        if (parse_listen(value, host, &port)) BAD("must be IPv4:port, e.g. 0.0.0.0:8443 (port 1..65535)");
        memset(c->net.listen_host, 0, sizeof c->net.listen_host);
        strcpy(c->net.listen_host, host);
        c->net.listen_port = port;
        return 0;
    }
    }
#undef BAD
    emsg(err, errlen, "%s[%s] %s: internal error: bad key type", prefix, K->sec, K->name);
    return -EINVAL;
}

/* Shortest "%.*g" that reads back as the same double. */
static void fmt_double(double d, char *buf, size_t cap) {
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, d);
        if (strtod(buf, NULL) == d) return;
    }
}

static int get_key(const kiln_config *c, int k, char *out, size_t cap) {
    const cfg_key *K = &keys[k];
    const char *field = (const char *)c + K->off;
    char tmp[64] = "";
    const char *s = tmp;
    switch (K->type) {
    case T_INT: snprintf(tmp, sizeof tmp, "%d", *(const int *)field); break;
    case T_U64: {
        uint64_t u;
        memcpy(&u, field, sizeof u);
        snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)u);
        break;
    }
    case T_DBL: {
        double d;
        memcpy(&d, field, sizeof d);
        fmt_double(d, tmp, sizeof tmp);
        break;
    }
    case T_BOOL: s = *(const int *)field ? "true" : "false"; break;
    case T_ENUM: {
        int v = *(const int *)field, n = 0;
        while (K->names[n]) n++;
        s = v >= 0 && v < n ? K->names[v] : "?";
        break;
    }
    case T_STR:
        if (strnlen(field, CFG_STR_MAX + 1) > CFG_STR_MAX) goto bad; /* not NUL-terminated */
        s = field;
        break;
    case T_LISTEN:
        if (strnlen(c->net.listen_host, CFG_HOST_MAX) == CFG_HOST_MAX) goto bad;
        snprintf(tmp, sizeof tmp, "%s:%d", c->net.listen_host, c->net.listen_port);
        break;
    }
    size_t n = strlen(s);
    if (n >= cap) {
        if (cap) out[0] = '\0';
        return -ENOSPC;
    }
    memcpy(out, s, n + 1);
    return (int)n;
bad:
    if (cap) out[0] = '\0';
    return -EINVAL;
}

/* ---------------------------------------------------------------- cross-key rules */

typedef struct {
    const char *label;  /* file name for messages, or NULL (cfg_validate) */
    const int *lines;   /* [N_KEYS] line that set each key, 0 = not in the file */
    char *err;
    size_t errlen;
} vctx;

/* The message prefix for a rule on keys a and b of section sec: "label:line: " at the later
 * of their lines in the file, "label: " when neither came from it, "" for cfg_validate. */
static void rule_prefix(const vctx *v, const char *sec, const char *a, const char *b, char *pre,
                        size_t cap) {
    pre[0] = '\0';
    if (!v->label) return;
    int la = v->lines[find_key(sec, a)], lb = v->lines[find_key(sec, b)];
    int line = la > lb ? la : lb;
    if (line)
        snprintf(pre, cap, "%.60s:%d: ", v->label, line);
    else
        snprintf(pre, cap, "%.60s: ", v->label);
}

#define RULE(sec, a, b, ...)                                                            \
    do {                                                                                \
        char pre_[80], msg_[256];                                                       \
        rule_prefix(v, sec, a, b, pre_, sizeof pre_);                                   \
        snprintf(msg_, sizeof msg_, __VA_ARGS__);                                       \
        emsg(v->err, v->errlen, "%s%s", pre_, msg_);                                    \
        return -EINVAL;                                                                 \
    } while (0)

/* a.b.c.d, with "/len" (0..32) when with_len; no leading zeros beyond "0". */
static int ipv4_ok(const char *s, int with_len);

/* "a.b.c.d" or "a.b.c.d,a.b.c.d": lwIP keeps two DNS servers. */
static int dns_ok(const char *s) {
    char one[CFG_STR_MAX + 1];
    const char *comma = strchr(s, ',');
    if (!comma) return ipv4_ok(s, 0);
    size_t n = (size_t)(comma - s);
    if (n >= sizeof one) return 0;
    memcpy(one, s, n), one[n] = 0;
    return ipv4_ok(one, 0) && !strchr(comma + 1, ',') && ipv4_ok(comma + 1, 0);
}

static int ipv4_ok(const char *s, int with_len) {
    for (int part = 0; part < 4; part++) {
        int v = 0, digits = 0;
        while (isdigit((unsigned char)*s) && digits < 4) v = v * 10 + (*s++ - '0'), digits++;
        if (!digits || digits > 3 || v > 255) return 0;
        if (part < 3 && *s++ != '.') return 0;
    }
    if (!with_len) return *s == 0;
    if (*s++ != '/') return 0;
    int len = 0, digits = 0;
    while (isdigit((unsigned char)*s) && digits < 3) len = len * 10 + (*s++ - '0'), digits++;
    return digits && !*s && len <= 32;
}

static int hostname_ok(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > 63 || s[0] == '-' || s[n - 1] == '-') return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '-') return 0;
    return 1;
}

static int mac_ok(const char *s) {
    for (int i = 0; i < 6; i++) {
        if (!isxdigit((unsigned char)s[0]) || !isxdigit((unsigned char)s[1])) return 0;
        s += 2;
        if (i < 5 && *s++ != ':') return 0;
    }
    return *s == 0;
}

static int validate(const kiln_config *c, const vctx *v) {
    /* Every field in range first: loads and cfg_set keep them so, a hand-built struct may not. */
    char buf[CFG_STR_MAX + 1];
    for (int k = 0; k < N_KEYS; k++) {
        kiln_config tmp;
        char pre[80] = "";
        if (v->label) {
            if (v->lines[k])
                snprintf(pre, sizeof pre, "%.60s:%d: ", v->label, v->lines[k]);
            else
                snprintf(pre, sizeof pre, "%.60s: ", v->label);
        }
        if (get_key(c, k, buf, sizeof buf) < 0) {
            emsg(v->err, v->errlen, "%s[%s] %s: not a NUL-terminated string", pre, keys[k].sec,
                 keys[k].name);
            return -EINVAL;
        }
        if (set_key(&tmp, k, buf, pre, v->err, v->errlen) < 0) return -EINVAL;
    }
    int mbs = c->engine.max_batch_size, mbt = c->engine.max_batched_tokens;
    int msl = c->engine.max_seq_len, dmt = c->engine.default_max_tokens;
    int mqt = c->engine.max_queued_tokens;
    int hto = c->net.handshake_timeout_ms, ito = c->net.idle_timeout_ms;
    if (mbt < mbs)
        RULE("engine", "max_batched_tokens", "max_batch_size",
             "[engine] max_batched_tokens = %d: must be >= max_batch_size (%d): one token per "
             "running sequence per step", mbt, mbs);
    if (dmt >= msl)
        RULE("engine", "default_max_tokens", "max_seq_len",
             "[engine] default_max_tokens = %d: must be < max_seq_len (%d), leaving room for the "
             "prompt", dmt, msl);
    if (mqt < msl)
        RULE("engine", "max_queued_tokens", "max_seq_len",
             "[engine] max_queued_tokens = %d: must be >= max_seq_len (%d), so that one "
             "full-length request can wait", mqt, msl);
    if (c->engine.ladder_low >= c->engine.ladder_high)
        RULE("engine", "ladder_low", "ladder_high",
             "[engine] ladder_low = %g: must be below ladder_high (%g), or the ladder would climb "
             "and step down at once", c->engine.ladder_low, c->engine.ladder_high);
    if (hto > ito)
        RULE("net", "handshake_timeout_ms", "idle_timeout_ms",
             "[net] handshake_timeout_ms = %d: must be <= idle_timeout_ms (%d)", hto, ito);
    if (strcmp(c->net.address, "dhcp") && !ipv4_ok(c->net.address, 1))
        RULE("net", "address", "address",
             "[net] address = %.64s: must be dhcp or an IPv4 address with its prefix length, "
             "e.g. 10.0.0.2/24", c->net.address);
    if (c->net.gateway[0] && !ipv4_ok(c->net.gateway, 0))
        RULE("net", "gateway", "gateway", "[net] gateway = %.64s: must be empty or an IPv4 address",
             c->net.gateway);
    if (c->net.dns[0] && !dns_ok(c->net.dns))
        RULE("net", "dns", "dns", "[net] dns = %.64s: must be empty or one or two IPv4 addresses, "
             "comma-separated", c->net.dns);
    if (c->net.mac[0] && !mac_ok(c->net.mac))
        RULE("net", "mac", "mac", "[net] mac = %.64s: must be empty or six hex bytes, "
             "e.g. 02:00:00:00:00:01", c->net.mac);
    if (c->net.hostname[0] && !hostname_ok(c->net.hostname))
        RULE("net", "hostname", "hostname", "[net] hostname = %.64s: must be 1..63 of a-z A-Z 0-9 and '-', "
             "not starting or ending with '-'", c->net.hostname);
    if (c->net.driver != CFG_DRIVER_HOST && !c->net.interface[0])
        RULE("net", "interface", "driver", "[net] interface: must be set for driver = %s",
             drivers[c->net.driver]);
    if (c->net.metrics_port == c->net.listen_port)
        RULE("net", "metrics_port", "listen",
             "[net] metrics_port = %d: must differ from the listen port (%s:%d)",
             c->net.metrics_port, c->net.listen_host, c->net.listen_port);
    return 0;
}
#undef RULE

int cfg_validate(const kiln_config *c, char *err, size_t errlen) {
    vctx v = {NULL, NULL, err, errlen};
    return validate(c, &v);
}

int cfg_check_model(const kiln_config *c, int n_ctx, size_t kv_bytes_per_token,
                    size_t *pool_bytes, char *err, size_t errlen) {
    int msl = c->engine.max_seq_len, mbs = c->engine.max_batch_size, mb = c->engine.kv_pool_mb;
    if (n_ctx < 1 || !kv_bytes_per_token || msl < 1 || mbs < 1 || mb < 0 ||
        c->engine.block_size < 1) {
        emsg(err, errlen, "config: model check: n_ctx %d, %zu KV bytes per token, or the config, "
             "out of range", n_ctx, kv_bytes_per_token);
        return -EINVAL;
    }
    if (msl > n_ctx) {
        emsg(err, errlen, "[engine] max_seq_len = %d: must be <= the model's context length (%d)",
             msl, n_ctx);
        return -EINVAL;
    }
    size_t bs = (size_t)c->engine.block_size;
    size_t blocks_per_seq = ((size_t)msl + bs - 1) / bs;
    size_t bytes;
    if (kv_bytes_per_token > SIZE_MAX / bs) goto overflow;
    size_t block_bytes = bs * kv_bytes_per_token;
    if (mb) {
        if ((size_t)mb > SIZE_MAX >> 20) goto overflow;
        bytes = (size_t)mb << 20;
        size_t have = bytes / block_bytes;
        /* with kv_8bit a sequence may outgrow the f16 pool: its blocks turn to 8 bits */
        long long room = kv_seq_max_blocks((long long)have, c->engine.kv_8bit);
        if (room < (long long)blocks_per_seq) {
            emsg(err, errlen, "[engine] kv_pool_mb = %d: holds %zu tokens (%zu bytes each)%s; "
                 "max_seq_len = %d needs %zu: raise kv_pool_mb or lower max_seq_len",
                 mb, have * bs, kv_bytes_per_token,
                 c->engine.kv_8bit ? ", one sequence twice that less 4 blocks in 8 bits" : "", msl,
                 blocks_per_seq * bs);
            return -EINVAL;
        }
    } else {
        if (blocks_per_seq > SIZE_MAX / (size_t)mbs ||
            blocks_per_seq * (size_t)mbs > SIZE_MAX / block_bytes)
            goto overflow;
        bytes = blocks_per_seq * (size_t)mbs * block_bytes;
    }
    if (pool_bytes) *pool_bytes = bytes;
    return 0;
overflow:
    emsg(err, errlen, "[engine] kv_pool_mb = %d: a KV pool for max_batch_size = %d x max_seq_len = "
         "%d at %zu bytes per token does not fit in memory", mb, mbs, msl, kv_bytes_per_token);
    return -EOVERFLOW;
}

/* ---------------------------------------------------------------- loading */

typedef struct {
    kiln_config cfg;      /* the copy being built */
    const char *label;    /* file name or "<string>" */
    FILE *f;              /* source: a file, */
    const char *s;        /* or a NUL-terminated string */
    int lineno;           /* line of the last chunk handed to inih */
    int at_start;         /* the next chunk begins a line */
    const char *linebuf;  /* inih's buffer holding the current line's first chunk */
    int indent;           /* leading whitespace bytes of the current line */
    int err_line;         /* line of the first error we recorded; 0: none */
    int read_errno;       /* the file could not be read */
    char *err;
    size_t errlen;
    int lines[N_KEYS];    /* line that set each key */
} load_state;

static void load_err(load_state *st, int line, const char *fmt, ...) {
    if (st->err_line) return;
    st->err_line = line;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    emsg(st->err, st->errlen, "%s:%d: %s", st->label, line, msg);
}

static void unknown_section(load_state *st, const char *sec) {
    char hint[80], eb[72];
    suggest_section(sec, hint, sizeof hint);
    load_err(st, st->lineno, "[%s]: unknown section; %s", echo(sec, eb), hint);
}

/* Our section check: inih reports sections only through the keys under them. An indented
 * '[' after a key is a continuation line: the handler reports that. */
static void check_section_line(load_state *st, const char *line) {
    const char *p = line;
    if (st->lineno == 1 && !strncmp(p, "\xEF\xBB\xBF", 3)) p += 3;
    if (*p != '[') return;
    const char *end = strchr(p, ']');
    if (!end) return; /* inih reports the syntax error */
    char sec[64];
    size_t n = (size_t)(end - p - 1);
    if (n >= sizeof sec) n = sizeof sec - 1; /* long enough to be unknown */
    memcpy(sec, p + 1, n);
    sec[n] = '\0';
    if (!known_section(sec)) unknown_section(st, sec);
}

/* fgets for inih over st's file or string: counts lines and notes where each starts. */
static char *reader(char *str, int num, void *stream) {
    load_state *st = stream;
    int n = 0, ch = 0, nul = 0;
    if (num < 2 || st->read_errno) return NULL;
    while (n < num - 1) {
        if (st->f) {
            ch = getc(st->f);
            if (ch == EOF) break;
        } else {
            if (!*st->s) break;
            ch = (unsigned char)*st->s++;
        }
        if (!ch) nul = 1, ch = ' ';
        str[n++] = (char)ch;
        if (ch == '\n') break;
    }
    if (st->f && ferror(st->f)) {
        st->read_errno = errno ? errno : EIO;
        st->err_line = 0; /* this outranks anything else */
        load_err(st, st->lineno + st->at_start, "read error: %s", strerror(st->read_errno));
        return NULL;
    }
    if (!n) return NULL;
    str[n] = '\0';
    if (st->at_start) {
        st->lineno++;
        st->linebuf = str;
        st->indent = 0;
        while (st->indent < n && isspace((unsigned char)str[st->indent])) st->indent++;
        check_section_line(st, str);
    }
    if (nul) load_err(st, st->lineno, "NUL byte in the line");
    int more = st->f ? (ch = getc(st->f)) != EOF && ungetc(ch, st->f) != EOF : *st->s != '\0';
    if (st->at_start && n == num - 1 && str[n - 1] != '\n' && more)
        load_err(st, st->lineno, "line longer than %d bytes", CFG_LINE_MAX - 3);
    st->at_start = str[n - 1] == '\n';
    return str;
}

static int handler(void *user, const char *section, const char *name, const char *value) {
    load_state *st = user;
    char eb[72], nb[72], sb[72], hint[80];
    if (st->err_line) return 1; /* the first error is the one reported */
    int line = st->lineno;
    if (st->indent && value == st->linebuf + st->indent) {
        load_err(st, line, "indented line continues [%s] %s; multi-line values are not "
                 "supported (remove the leading spaces)", echo(section, sb), echo(name, nb));
        return 0;
    }
    if (!*section) {
        load_err(st, line, "%s = %s: key outside any section (put it under [model], [engine], "
                 "[sampling], [net] or [log])", echo(name, nb), echo(value, eb));
        return 0;
    }
    if (!known_section(section)) {
        unknown_section(st, section);
        return 0;
    }
    int k = find_key(section, name);
    if (k < 0) {
        suggest_key(section, name, hint, sizeof hint);
        load_err(st, line, "[%s] %s: unknown key%s", section, *name ? echo(name, nb) : "(no name)",
                 hint);
        return 0;
    }
    if (st->lines[k]) {
        load_err(st, line, "[%s] %s: set twice (first on line %d)", section, name, st->lines[k]);
        return 0;
    }
    st->lines[k] = line;
    char pre[96];
    snprintf(pre, sizeof pre, "%.60s:%d: ", st->label, line);
    if (set_key(&st->cfg, k, value, pre, st->err, st->errlen) < 0) {
        st->err_line = line;
        return 0;
    }
    return 1;
}

static int load(kiln_config *c, load_state *st) {
    st->cfg = *c;
    st->at_start = 1;
    int r = ini_parse_stream(reader, st, handler, st);
    if (st->read_errno) return -st->read_errno;
    if (r > 0 && (!st->err_line || r < st->err_line)) {
        st->err_line = 0; /* inih saw a bad line before anything we reported */
        load_err(st, r, "syntax error: expected [section], key = value, or a ; or # comment");
    }
    if (r < 0 && !st->err_line) load_err(st, st->lineno, "inih error %d", r);
    if (st->err_line) return -EINVAL;
    vctx v = {st->label, st->lines, st->err, st->errlen};
    if (validate(&st->cfg, &v) < 0) return -EINVAL;
    *c = st->cfg;
    return 0;
}

int cfg_load_string(kiln_config *c, const char *text, char *err, size_t errlen) {
    load_state st;
    memset(&st, 0, sizeof st);
    st.label = "<string>";
    st.s = text;
    st.err = err;
    st.errlen = errlen;
    return load(c, &st);
}

int cfg_load_file(kiln_config *c, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) {
        int e = errno;
        emsg(err, errlen, "%s: cannot open: %s", path, strerror(e));
        return -e;
    }
    load_state st;
    memset(&st, 0, sizeof st);
    st.label = path;
    st.f = f;
    st.err = err;
    st.errlen = errlen;
    int r = load(c, &st);
    fclose(f);
    return r;
}

/* ---------------------------------------------------------------- set, get, dump */

int cfg_set(kiln_config *c, const char *section, const char *key, const char *value,
            char *err, size_t errlen) {
    char eb[72], hint[80];
    if (!known_section(section)) {
        suggest_section(section, hint, sizeof hint);
        emsg(err, errlen, "[%s]: unknown section; %s", echo(section, eb), hint);
        return -EINVAL;
    }
    int k = find_key(section, key);
    if (k < 0) {
        suggest_key(section, key, hint, sizeof hint);
        emsg(err, errlen, "[%s] %s: unknown key%s", section, echo(key, eb), hint);
        return -EINVAL;
    }
    return set_key(c, k, value, "", err, errlen);
}

int cfg_get(const kiln_config *c, const char *section, const char *key, char *out, size_t cap) {
    int k = find_key(section, key);
    if (k < 0) {
        if (cap) out[0] = '\0';
        return -EINVAL;
    }
    return get_key(c, k, out, cap);
}

int cfg_dump(const kiln_config *c, char *out, size_t cap) {
    size_t n = 0;
    int ok = 1;
    char val[CFG_STR_MAX + 1];
#define PUT(...)                                                                        \
    do {                                                                                \
        int w_ = snprintf(out + (n < cap ? n : 0), n < cap ? cap - n : 0, __VA_ARGS__); \
        n += (size_t)w_;                                                                \
    } while (0)
    PUT("# kiln effective configuration (cfg_dump)\n");
    for (int k = 0; k < N_KEYS; k++) {
        if (!k || strcmp(keys[k].sec, keys[k - 1].sec)) PUT("%s[%s]\n", k ? "\n" : "", keys[k].sec);
        if (get_key(c, k, val, sizeof val) < 0) ok = 0;
        PUT("%s = %s\n", keys[k].name, val);
    }
#undef PUT
    if (n >= cap || !ok) {
        if (cap) out[cap - 1] = '\0';
        return -ENOSPC;
    }
    return (int)n;
}

int cfg_equal(const kiln_config *a, const kiln_config *b) {
    char va[CFG_STR_MAX + 1], vb[CFG_STR_MAX + 1];
    for (int k = 0; k < N_KEYS; k++) {
        const cfg_key *K = &keys[k];
        if (K->type == T_DBL) { /* -0 and 0 differ in text but are the same setting */
            double x, y;
            memcpy(&x, (const char *)a + K->off, sizeof x);
            memcpy(&y, (const char *)b + K->off, sizeof y);
            if (x != y) return 0;
            continue;
        }
        if (get_key(a, k, va, sizeof va) < 0 || get_key(b, k, vb, sizeof vb) < 0 || strcmp(va, vb))
            return 0;
    }
    return 1;
}
