/* proto: the kiln line protocol (net/proto.h, docs/PROTOCOL.md).
 *
 * proto_split works in place with two cursors over the caller's buffer: r reads the
 * input, w writes the results (words, keys, unescaped strings, each NUL-terminated).
 * The verb is copied into proto_line.verb, so its bytes and the space after it are free
 * and w starts at least two bytes behind r. A bare word or a key=value pair writes one
 * byte more than it reads (its NUL), a quoted string at least one byte less, and every
 * separating space gives a byte back; so w stays behind r, nothing is written before it
 * is read, and nothing at or past len is ever touched (not even for the last NUL). */
#include "net/proto.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- errors */

__attribute__((format(printf, 3, 0)))
static void proto_vmsg(char *err, size_t errlen, const char *fmt, va_list ap) {
    if (err && errlen) vsnprintf(err, errlen, fmt, ap);
}

__attribute__((format(printf, 3, 4)))
static int proto_fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    proto_vmsg(err, errlen, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

/* ---------------------------------------------------------------- UTF-8 */

/* An incremental UTF-8 checker. After a lead byte, [lo, hi] is the range the next byte
 * must fall in: narrowing it for E0, ED, F0 and F4 rejects overlong forms, surrogates
 * and code points above U+10FFFF at the byte where they go wrong. */
typedef struct {
    int need;                /* continuation bytes still expected */
    unsigned char lo, hi;
} proto_utf8;

/* 0, or -1 when c cannot come next. */
static int proto_utf8_step(proto_utf8 *u, unsigned char c) {
    if (u->need) {
        if (c < u->lo || c > u->hi) return -1;
        u->need--;
        u->lo = 0x80, u->hi = 0xbf;
        return 0;
    }
    if (c < 0x80) return 0;
    u->lo = 0x80, u->hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) u->need = 1;
    else if (c >= 0xe0 && c <= 0xef) {
        u->need = 2;
        if (c == 0xe0) u->lo = 0xa0;      /* below: overlong */
        else if (c == 0xed) u->hi = 0x9f; /* above: surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        u->need = 3;
        if (c == 0xf0) u->lo = 0x90;      /* below: overlong */
        else if (c == 0xf4) u->hi = 0x8f; /* above: past U+10FFFF */
    } else {
        return -1; /* a stray continuation byte, C0/C1 (overlong), F5..FF */
    }
    return 0;
}

/* The length of the valid UTF-8 sequence at p[0..n), or 0. */
static size_t proto_utf8_len(const unsigned char *p, size_t n) {
    proto_utf8 u = {0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        if (proto_utf8_step(&u, p[i]) < 0) return 0;
        if (!u.need) return i + 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- splitting */

typedef struct {
    unsigned char *b;
    size_t len;  /* without the ignored trailing '\r' */
    size_t r, w; /* read and write cursors, w < r while a token is being read */
    char *err;
    size_t errlen;
} proto_sp;

/* Every splitter error names the column (1-based byte offset) of the byte at fault. */
__attribute__((format(printf, 3, 4)))
static int proto_at(proto_sp *sp, size_t i, const char *fmt, ...) {
    if (sp->err && sp->errlen) {
        int n = snprintf(sp->err, sp->errlen, "col %zu: ", i + 1);
        if (n > 0 && (size_t)n < sp->errlen) {
            va_list ap;
            va_start(ap, fmt);
            proto_vmsg(sp->err + n, sp->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return -EINVAL;
}

/* A byte that does not belong where it is, outside a quoted string. Only printable
 * ASCII is ever copied into the message. */
static int proto_bad_byte(proto_sp *sp, size_t i, const char *where) {
    unsigned c = sp->b[i];
    if (c < 0x20 || c == 0x7f) return proto_at(sp, i, "control byte 0x%02x", c);
    if (c >= 0x80) return proto_at(sp, i, "non-ASCII byte 0x%02x outside a quoted string", c);
    return proto_at(sp, i, "unexpected '%c' %s", (int)c, where);
}

static void proto_skip_spaces(proto_sp *sp) {
    while (sp->r < sp->len && sp->b[sp->r] == ' ') sp->r++;
}

static int proto_end_of_word(const proto_sp *sp) {
    return sp->r == sp->len || sp->b[sp->r] == ' ';
}

static int proto_verb(proto_sp *sp, proto_line *out) {
    size_t n = 0;
    for (; !proto_end_of_word(sp); sp->r++) {
        unsigned char c = sp->b[sp->r];
        if (c >= 'a' && c <= 'z') return proto_at(sp, sp->r, "verb must be upper case");
        if (c < 'A' || c > 'Z') return proto_bad_byte(sp, sp->r, "in verb (letters A-Z only)");
        if (n == PROTO_VERB_MAX)
            return proto_at(sp, sp->r, "verb too long (max %d letters)", PROTO_VERB_MAX);
        out->verb[n++] = (char)c;
    }
    out->verb[n] = '\0';
    return 0;
}

static int proto_hex(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The value of ndig hex digits at b[i..), or -1 (also when the line ends first). */
static long proto_hex_at(const proto_sp *sp, size_t i, int ndig) {
    long v = 0;
    if (sp->len - i < (size_t)ndig) return -1;
    for (int k = 0; k < ndig; k++) {
        int d = proto_hex(sp->b[i + (size_t)k]);
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Decodes the escape whose backslash is at r into out[], moves r past it; the number of
 * bytes (1..3), or -EINVAL. open is the string's opening quote, for the message. */
static int proto_escape(proto_sp *sp, size_t open, unsigned char out[3]) {
    size_t at = sp->r;
    if (at + 1 == sp->len) return proto_at(sp, open, "unterminated string");
    unsigned char c = sp->b[at + 1];
    long v;
    sp->r = at + 2;
    switch (c) {
    case '"': out[0] = '"'; return 1;
    case '\\': out[0] = '\\'; return 1;
    case 'n': out[0] = '\n'; return 1;
    case 'r': out[0] = '\r'; return 1;
    case 't': out[0] = '\t'; return 1;
    case 'x':
        if ((v = proto_hex_at(sp, at + 2, 2)) < 0)
            return proto_at(sp, at, "bad escape \\x (needs two hex digits)");
        if (v == 0) return proto_at(sp, at, "\\x00 is not allowed (strings cannot hold NUL)");
        sp->r = at + 4;
        out[0] = (unsigned char)v;
        return 1;
    case 'u':
        if ((v = proto_hex_at(sp, at + 2, 4)) < 0)
            return proto_at(sp, at, "bad escape \\u (needs four hex digits)");
        if (v == 0) return proto_at(sp, at, "\\u0000 is not allowed (strings cannot hold NUL)");
        if (v >= 0xd800 && v <= 0xdfff)
            return proto_at(sp, at, "\\u%04lX is a surrogate (write the character as UTF-8)", v);
        sp->r = at + 6;
        if (v < 0x80) {
            out[0] = (unsigned char)v;
            return 1;
        }
        if (v < 0x800) {
            out[0] = (unsigned char)(0xc0 | (v >> 6));
            out[1] = (unsigned char)(0x80 | (v & 0x3f));
            return 2;
        }
        out[0] = (unsigned char)(0xe0 | (v >> 12));
        out[1] = (unsigned char)(0x80 | ((v >> 6) & 0x3f));
        out[2] = (unsigned char)(0x80 | (v & 0x3f));
        return 3;
    default:
        if (c > 0x20 && c < 0x7f) return proto_at(sp, at, "bad escape \\%c", (int)c);
        return proto_at(sp, at, "bad escape (byte 0x%02x after \\)", c);
    }
}

/* The quoted string whose opening quote is at r: unescaped to w, checked as UTF-8. */
static int proto_quoted(proto_sp *sp, proto_str *s) {
    size_t open = sp->r++, w0 = sp->w, seq = open;
    proto_utf8 u = {0, 0, 0};
    for (;;) {
        if (sp->r == sp->len) return proto_at(sp, open, "unterminated string");
        size_t at = sp->r;
        unsigned char c = sp->b[at], buf[3];
        int n;
        if (c == '"') break;
        if (c == '\\') {
            if ((n = proto_escape(sp, open, buf)) < 0) return n;
        } else if (c < 0x20 || c == 0x7f) {
            return proto_at(sp, at, "control byte 0x%02x in string (escape it)", c);
        } else {
            buf[0] = c, n = 1;
            sp->r++;
        }
        /* Escaped bytes are checked too: "\xc3\xa9" is fine, "\xff" is not. */
        for (int k = 0; k < n; k++) {
            if (!u.need) seq = at;
            if (proto_utf8_step(&u, buf[k]) < 0)
                return proto_at(sp, seq, "invalid UTF-8 in string");
            sp->b[sp->w++] = buf[k];
        }
    }
    if (u.need) return proto_at(sp, seq, "invalid UTF-8 in string (truncated sequence)");
    sp->r++;
    if (!proto_end_of_word(sp)) return proto_at(sp, sp->r, "expected a space after the closing quote");
    sp->b[sp->w] = '\0';
    s->s = (char *)sp->b + w0;
    s->len = sp->w - w0;
    s->quoted = 1;
    sp->w++;
    return 0;
}

/* The bare word at r (a positional word or a value), copied to w. */
static int proto_bare(proto_sp *sp, proto_str *s) {
    size_t w0 = sp->w;
    for (; !proto_end_of_word(sp); sp->r++) {
        unsigned char c = sp->b[sp->r];
        if (c == '"') return proto_at(sp, sp->r, "'\"' inside a bare word (quote the whole value)");
        if (c == '=') return proto_at(sp, sp->r, "'=' inside a bare value (quote the value)");
        if (c < 0x21 || c > 0x7e) return proto_bad_byte(sp, sp->r, "in word");
        sp->b[sp->w++] = c;
    }
    sp->b[sp->w] = '\0';
    s->s = (char *)sp->b + w0;
    s->len = sp->w - w0;
    s->quoted = 0;
    sp->w++;
    return 0;
}

/* The key b[r..eq) of a key=value pair, copied to w; leaves r after the '='. */
static int proto_key(proto_sp *sp, size_t eq, proto_str *k) {
    size_t w0 = sp->w;
    if (sp->r == eq) return proto_at(sp, eq, "empty key");
    for (; sp->r < eq; sp->r++) {
        unsigned char c = sp->b[sp->r];
        int first = sp->w == w0;
        if (sp->w - w0 == PROTO_KEY_MAX)
            return proto_at(sp, sp->r, "key too long (max %d bytes)", PROTO_KEY_MAX);
        if (c >= 'A' && c <= 'Z') return proto_at(sp, sp->r, "key must be lower case");
        if (first && ((c >= '0' && c <= '9') || c == '_'))
            return proto_at(sp, sp->r, "key must start with a letter a-z");
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'))
            return proto_bad_byte(sp, sp->r, "in key");
        sp->b[sp->w++] = c;
    }
    sp->b[sp->w] = '\0';
    k->s = (char *)sp->b + w0;
    k->len = sp->w - w0;
    k->quoted = 0;
    sp->w++;
    sp->r = eq + 1;
    return 0;
}

/* One word or key=value pair starting at r (not a space, not the end). */
static int proto_token(proto_sp *sp, proto_line *out) {
    size_t start = sp->r, e = sp->r;
    /* key=value when an '=' comes before any quote or space. */
    while (e < sp->len && sp->b[e] != ' ' && sp->b[e] != '"' && sp->b[e] != '=') e++;
    if (e < sp->len && sp->b[e] == '=') {
        if (out->n_kv == PROTO_MAX_KV)
            return proto_at(sp, start, "too many key=value pairs (max %d)", PROTO_MAX_KV);
        proto_kv *kv = &out->kv[out->n_kv];
        int rc = proto_key(sp, e, &kv->key);
        if (rc < 0) return rc;
        if (proto_end_of_word(sp)) return proto_at(sp, e, "empty value (write \"\" for an empty string)");
        rc = sp->b[sp->r] == '"' ? proto_quoted(sp, &kv->val) : proto_bare(sp, &kv->val);
        if (rc < 0) return rc;
        out->n_kv++;
        return 0;
    }
    if (out->n_pos == PROTO_MAX_POS)
        return proto_at(sp, start, "too many positional words (max %d)", PROTO_MAX_POS);
    proto_str *p = &out->pos[out->n_pos];
    int rc = sp->b[sp->r] == '"' ? proto_quoted(sp, p) : proto_bare(sp, p);
    if (rc < 0) return rc;
    out->n_pos++;
    return 0;
}

static int proto_split_line(proto_sp *sp, proto_line *out) {
    proto_skip_spaces(sp);
    if (sp->r == sp->len) return proto_fail(sp->err, sp->errlen, "empty line");
    int rc = proto_verb(sp, out);
    if (rc < 0) return rc;
    for (;;) {
        proto_skip_spaces(sp);
        if (sp->r == sp->len) return 0;
        if ((rc = proto_token(sp, out)) < 0) return rc;
    }
}

int proto_split(char *line, size_t len, proto_line *out, char *err, size_t errlen) {
    proto_sp sp = {(unsigned char *)line, len, 0, 0, err, errlen};
    if (err && errlen) err[0] = '\0';
    out->verb[0] = '\0';
    out->n_pos = out->n_kv = 0;
    if (len && line[len - 1] == '\r') sp.len--;
    int rc = proto_split_line(&sp, out);
    if (rc < 0) {
        /* A caller that forgets the return value still sees an empty line. */
        out->verb[0] = '\0';
        out->n_pos = out->n_kv = 0;
    }
    return rc;
}

const proto_str *proto_get(const proto_line *l, const char *key) {
    for (int i = 0; i < l->n_kv; i++)
        if (!strcmp(l->kv[i].key.s, key)) return &l->kv[i].val;
    return NULL;
}

int proto_id_ok(const char *s, size_t len) {
    if (!s || len < 1 || len > PROTO_ID_MAX) return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == ':' || c == '-'))
            return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- HELLO */

/* "kiln/N": N (1..999999999), or -1 when the word has another shape. */
static long proto_version(const proto_str *p) {
    static const char pre[] = "kiln/";
    size_t np = sizeof pre - 1;
    if (p->len <= np || p->len > np + 9 || memcmp(p->s, pre, np)) return -1;
    long v = 0;
    for (size_t i = np; i < p->len; i++) {
        if (p->s[i] < '0' || p->s[i] > '9') return -1;
        v = v * 10 + (p->s[i] - '0');
    }
    return v;
}

int proto_hello_parse(const proto_line *l, proto_hello *h, char *err, size_t errlen) {
    h->version = 0;
    h->token = NULL;
    if (strcmp(l->verb, "HELLO")) return proto_fail(err, errlen, "expected HELLO");
    if (l->n_pos == 0) return proto_fail(err, errlen, "missing protocol version (HELLO kiln/1)");
    if (l->n_pos > 1) return proto_fail(err, errlen, "unexpected word after the protocol version");
    long v = proto_version(&l->pos[0]);
    if (v < 0) return proto_fail(err, errlen, "expected kiln/1 as the protocol version");
    if (v != 1) return proto_fail(err, errlen, "unsupported protocol version (this server speaks kiln/1)");
    for (int i = 0; i < l->n_kv; i++) {
        const proto_kv *kv = &l->kv[i];
        if (strcmp(kv->key.s, "token")) return proto_fail(err, errlen, "unknown key %s", kv->key.s);
        if (h->token) return proto_fail(err, errlen, "duplicate key token");
        h->token = kv->val.s;
    }
    h->version = 1;
    return 0;
}

/* ---------------------------------------------------------------- GEN */

/* PGK_MSG: a message of the conversation form (user=, assistant=; they may repeat). */
enum { PGK_ID, PGK_PROMPT, PGK_SYSTEM, PGK_MSG, PGK_STOP, PGK_BOOL, PGK_INT, PGK_FLOAT, PGK_U64 };

/* The keys of GEN. Numeric ranges are inclusive except that lo_open excludes lo. */
typedef struct {
    const char *name;
    int kind;
    int lo_open;
    unsigned bit; /* PG_* for the keys whose default the server supplies */
    double lo, hi;
    size_t off; /* the int or float field of proto_gen */
} proto_gkey;

#define PGF(f) offsetof(proto_gen, f)
static const proto_gkey proto_gkeys[] = {
    {"id", PGK_ID, 0, 0, 0, 0, 0},
    {"prompt", PGK_PROMPT, 0, 0, 0, 0, 0},
    {"system", PGK_SYSTEM, 0, 0, 0, 0, 0},
    {"user", PGK_MSG, 0, 0, 0, 0, 0},
    {"assistant", PGK_MSG, 0, 0, 0, 0, 0},
    {"stop", PGK_STOP, 0, 0, 0, 0, 0},
    {"chat", PGK_BOOL, 0, 0, 0, 1, PGF(chat)},
    {"logprobs", PGK_BOOL, 0, 0, 0, 1, PGF(logprobs)},
    {"ignore_eos", PGK_BOOL, 0, 0, 0, 1, PGF(ignore_eos)},
    {"n", PGK_INT, 0, 0, 1, 8, PGF(n)},
    {"max_tokens", PGK_INT, 0, PG_MAX_TOKENS, 0, 1000000, PGF(max_tokens)},
    {"top_k", PGK_INT, 0, PG_TOP_K, 0, 1000000, PGF(top_k)},
    {"repeat_last_n", PGK_INT, 0, PG_REPEAT_LAST_N, 0, 1000000, PGF(repeat_last_n)},
    {"temperature", PGK_FLOAT, 0, PG_TEMPERATURE, 0, 100, PGF(temperature)},
    {"top_p", PGK_FLOAT, 1, PG_TOP_P, 0, 1, PGF(top_p)},
    {"min_p", PGK_FLOAT, 0, PG_MIN_P, 0, 1, PGF(min_p)},
    {"repeat_penalty", PGK_FLOAT, 1, PG_REPEAT_PENALTY, 0, 10, PGF(repeat_penalty)},
    {"presence_penalty", PGK_FLOAT, 0, PG_PRESENCE, -2, 2, PGF(presence_penalty)},
    {"frequency_penalty", PGK_FLOAT, 0, PG_FREQUENCY, -2, 2, PGF(frequency_penalty)},
    {"seed", PGK_U64, 0, PG_SEED, 0, 0, PGF(seed)},
};
#undef PGF
#define PROTO_NGKEYS ((int)(sizeof proto_gkeys / sizeof proto_gkeys[0]))
#define PROTO_STOP_MAX 64 /* bytes in one stop string */

/* Unsigned decimal digits only (no sign, no spaces), overflow checked. */
static int proto_u64(const proto_str *v, uint64_t *out) {
    uint64_t x = 0;
    if (v->len == 0) return -1;
    for (size_t i = 0; i < v->len; i++) {
        unsigned d = (unsigned)(unsigned char)v->s[i] - '0';
        if (d > 9 || x > (UINT64_MAX - d) / 10) return -1;
        x = x * 10 + d;
    }
    *out = x;
    return 0;
}

/* A decimal integer in [lo, hi]; '-' only where lo < 0, never '+'. */
static int proto_int(const proto_str *v, long long lo, long long hi, long long *out) {
    proto_str mag = *v;
    int neg = v->len && v->s[0] == '-';
    uint64_t m;
    if (neg) {
        if (lo >= 0) return -1;
        mag.s++, mag.len--;
    }
    if (proto_u64(&mag, &m) < 0 || m > (uint64_t)LLONG_MAX) return -1;
    long long x = neg ? -(long long)m : (long long)m;
    if (x < lo || x > hi) return -1;
    *out = x;
    return 0;
}

/* A finite decimal float as strtod reads it, on a bounded NUL-terminated copy: only
 * digits, '.', 'e'/'E' and signs get there, which keeps out hex floats, inf, nan and
 * leading spaces; the mantissa may have '-' but not '+'. Assumes the C locale. */
static int proto_double(const proto_str *v, double *out) {
    char buf[64];
    if (v->len == 0 || v->len >= sizeof buf || v->s[0] == '+') return -1;
    for (size_t i = 0; i < v->len; i++)
        if (!v->s[i] || !strchr("0123456789.eE+-", v->s[i])) return -1;
    memcpy(buf, v->s, v->len);
    buf[v->len] = '\0';
    char *end;
    double d = strtod(buf, &end);
    if (end != buf + v->len || !isfinite(d)) return -1; /* ERANGE underflow is fine */
    *out = d;
    return 0;
}

static int proto_gen_value(const proto_gkey *k, const proto_str *v, proto_gen *g, char *err,
                           size_t errlen) {
    char *field = (char *)g + k->off;
    long long i;
    double d;
    if (k->kind >= PGK_BOOL && v->quoted)
        return proto_fail(err, errlen, "%s: numbers are written without quotes", k->name);
    switch (k->kind) {
    case PGK_PROMPT:
        g->prompt = v->s, g->prompt_len = v->len;
        return 0;
    case PGK_SYSTEM:
    case PGK_MSG:
        /* system goes to msgs too: whether it is the conversation's first message or the
         * prompt form's system message is known once the whole line is read */
        if (g->n_msgs == PROTO_MAX_MSGS)
            return proto_fail(err, errlen, "too many messages (max %d)", PROTO_MAX_MSGS);
        g->msgs[g->n_msgs++] = (proto_msg){k->name, v->s, v->len};
        if (k->kind == PGK_SYSTEM) g->system = v->s, g->system_len = v->len;
        return 0;
    case PGK_STOP:
        if (g->n_stops == PROTO_MAX_STOPS)
            return proto_fail(err, errlen, "too many stop strings (max %d)", PROTO_MAX_STOPS);
        if (v->len < 1 || v->len > PROTO_STOP_MAX)
            return proto_fail(err, errlen, "stop must be 1..%d bytes", PROTO_STOP_MAX);
        g->stops[g->n_stops++] = v->s;
        return 0;
    case PGK_BOOL:
        if (v->len != 1 || (v->s[0] != '0' && v->s[0] != '1'))
            return proto_fail(err, errlen, "%s must be 0 or 1", k->name);
        *(int *)field = v->s[0] - '0';
        return 0;
    case PGK_INT:
        if (proto_int(v, (long long)k->lo, (long long)k->hi, &i) < 0)
            return proto_fail(err, errlen, "%s must be an integer in %lld..%lld", k->name,
                              (long long)k->lo, (long long)k->hi);
        *(int *)field = (int)i;
        return 0;
    case PGK_U64:
        if (proto_u64(v, (uint64_t *)field) < 0)
            return proto_fail(err, errlen, "%s must be an integer in 0..%llu", k->name,
                              (unsigned long long)UINT64_MAX);
        return 0;
    case PGK_FLOAT:
        /* Range-check the double before narrowing it (an out-of-range conversion is
         * undefined), and the open bound after (1e-300 > 0, but not as a float). */
        if (proto_double(v, &d) == 0 && d >= k->lo && d <= k->hi) {
            float f = (float)d + 0.0f; /* + 0.0f: -0 becomes 0 */
            if (!k->lo_open || f > (float)k->lo) {
                *(float *)field = f;
                return 0;
            }
        }
        return proto_fail(err, errlen, "%s must be a number in %c%g, %g]", k->name,
                          k->lo_open ? '(' : '[', k->lo, k->hi);
    }
    return proto_fail(err, errlen, "internal: key kind"); /* not reached */
}

static const proto_gkey *proto_gkey_find(const char *name) {
    for (int i = 0; i < PROTO_NGKEYS; i++)
        if (!strcmp(proto_gkeys[i].name, name)) return &proto_gkeys[i];
    return NULL;
}

static void proto_gen_defaults(proto_gen *g) {
    memset(g, 0, sizeof *g);
    g->n = 1;
    g->max_tokens = -1;
    g->temperature = 1.0f;
    g->top_p = 1.0f;
    g->repeat_penalty = 1.0f;
    g->repeat_last_n = 64;
}

void proto_gen_init(proto_gen *g) { proto_gen_defaults(g); }

int proto_gen_set(proto_gen *g, const char *key, const proto_str *val, char *err, size_t errlen) {
    const proto_gkey *k = proto_gkey_find(key);
    if (!k || k->kind == PGK_ID || k->kind == PGK_PROMPT || k->kind == PGK_SYSTEM || k->kind == PGK_MSG)
        return proto_fail(err, errlen, "unknown key %s", key);
    int rc = proto_gen_value(k, val, g, err, errlen);
    if (rc == 0) g->set |= k->bit;
    return rc;
}

/* The conversation form's rules, once user= or assistant= came: no prompt, chat=1,
 * system first, a user message last. */
static int proto_gen_conversation(proto_gen *g, char *err, size_t errlen) {
    if (g->prompt)
        return proto_fail(err, errlen, "prompt and user=/assistant= messages exclude each other");
    if (!g->chat) return proto_fail(err, errlen, "user= and assistant= messages need chat=1");
    for (int i = 1; i < g->n_msgs; i++)
        if (!strcmp(g->msgs[i].role, "system"))
            return proto_fail(err, errlen, "system must be the first message");
    if (strcmp(g->msgs[g->n_msgs - 1].role, "user"))
        return proto_fail(err, errlen, "the last message must be a user message");
    g->system = NULL, g->system_len = 0; /* it is msgs[0] */
    return 0;
}

int proto_gen_parse(const proto_line *l, proto_gen *g, char *err, size_t errlen) {
    unsigned seen = 0; /* bit i: proto_gkeys[i] was given */
    proto_gen_defaults(g);
    if (strcmp(l->verb, "GEN")) return proto_fail(err, errlen, "expected GEN");
    /* The id first, so that the server can name the request in any later error. */
    const proto_str *id = proto_get(l, "id");
    if (!id) return proto_fail(err, errlen, "missing id");
    if (!proto_id_ok(id->s, id->len))
        return proto_fail(err, errlen, "bad id (1..%d of A-Z a-z 0-9 _ . : -)", PROTO_ID_MAX);
    g->id = id->s;
    if (l->n_pos) return proto_fail(err, errlen, "GEN takes no positional words (write key=value)");
    for (int i = 0; i < l->n_kv; i++) {
        const proto_kv *kv = &l->kv[i];
        const proto_gkey *k = proto_gkey_find(kv->key.s);
        if (!k) return proto_fail(err, errlen, "unknown key %s", kv->key.s);
        unsigned bit = 1u << (k - proto_gkeys);
        if ((seen & bit) && k->kind != PGK_STOP && k->kind != PGK_MSG)
            return proto_fail(err, errlen, "duplicate key %s", k->name);
        seen |= bit;
        if (k->kind == PGK_ID) continue; /* taken above */
        int rc = proto_gen_value(k, &kv->val, g, err, errlen);
        if (rc < 0) return rc;
        g->set |= k->bit;
    }
    if (g->n_msgs > (g->system ? 1 : 0)) return proto_gen_conversation(g, err, errlen);
    g->n_msgs = 0; /* the prompt form: system (if any) is g->system alone */
    if (!g->prompt) return proto_fail(err, errlen, "missing prompt (or user= messages with chat=1)");
    if (g->system && !g->chat) return proto_fail(err, errlen, "system needs chat=1");
    if (!g->prompt_len && !(g->chat && g->system_len))
        return proto_fail(err, errlen, "empty prompt (allowed only with chat=1 and a system message)");
    return 0;
}

/* ---------------------------------------------------------------- quoting */

int proto_quote(char *out, size_t cap, const char *s, size_t len) {
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0;
    /* Room for n more bytes plus the closing quote and the NUL. */
#define PROTO_ROOM(n) (cap - o >= (size_t)(n) + 2)
    if (cap < 3) goto nospace;
    out[o++] = '"';
    for (size_t i = 0; i < len;) {
        unsigned char c = p[i];
        const char *esc = NULL;
        size_t n;
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        }
        if (esc) {
            if (!PROTO_ROOM(2)) goto nospace;
            out[o++] = esc[0], out[o++] = esc[1];
            i++;
        } else if (c >= 0x20 && c < 0x7f) {
            if (!PROTO_ROOM(1)) goto nospace;
            out[o++] = (char)c;
            i++;
        } else if (c >= 0x80 && (n = proto_utf8_len(p + i, len - i)) > 0) {
            if (!PROTO_ROOM(n)) goto nospace;
            memcpy(out + o, p + i, n);
            o += n, i += n;
        } else { /* control bytes, 0x7f and bytes that are not UTF-8 */
            if (!PROTO_ROOM(4)) goto nospace;
            snprintf(out + o, 5, "\\x%02x", c);
            o += 4, i++;
        }
    }
#undef PROTO_ROOM
    out[o++] = '"';
    out[o] = '\0';
    if (o > INT_MAX) goto nospace;
    return (int)o;
nospace:
    if (cap) out[0] = '\0';
    return -ENOSPC;
}

/* ---------------------------------------------------------------- UPDATE */

static int proto_hexval(char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; }

int proto_update_parse(const proto_line *l, proto_update *u, char *err, size_t errlen) {
    memset(u, 0, sizeof *u);
    u->tries = 3;
    if (strcmp(l->verb, "UPDATE")) return proto_fail(err, errlen, "expected UPDATE");
    if (l->n_pos) return proto_fail(err, errlen, "UPDATE takes no positional words (UPDATE size=N sha256=HEX)");
    unsigned seen = 0;
    for (int i = 0; i < l->n_kv; i++) {
        const proto_str *k = &l->kv[i].key, *v = &l->kv[i].val;
        unsigned bit = !strcmp(k->s, "size") ? 1u : !strcmp(k->s, "sha256") ? 2u : !strcmp(k->s, "tries") ? 4u : 0u;
        if (!bit) return proto_fail(err, errlen, "unknown key %s", k->s);
        if (seen & bit) return proto_fail(err, errlen, "duplicate key %s", k->s);
        seen |= bit;
        long long x;
        if (bit == 1 && (proto_int(v, 1, 1LL << 40, &x) < 0 || v->quoted))
            return proto_fail(err, errlen, "size must be an integer in [1, 2^40]");
        if (bit == 1) u->size = (uint64_t)x;
        if (bit == 4 && (proto_int(v, 1, 9, &x) < 0 || v->quoted)) return proto_fail(err, errlen, "tries must be an integer in [1, 9]");
        if (bit == 4) u->tries = (int)x;
        if (bit == 2) {
            if (v->len != 64) return proto_fail(err, errlen, "sha256 must be 64 lower-case hex digits");
            for (int j = 0; j < 32; j++) {
                int hi = proto_hexval(v->s[2 * j]), lo = proto_hexval(v->s[2 * j + 1]);
                if (hi < 0 || lo < 0) return proto_fail(err, errlen, "sha256 must be 64 lower-case hex digits");
                u->sha256[j] = (uint8_t)(hi << 4 | lo);
            }
        }
    }
    if ((seen & 3u) != 3u) return proto_fail(err, errlen, "usage: UPDATE size=N sha256=HEX [tries=1..9]");
    return 0;
}
