/* metrics: the registry and its Prometheus text rendering (exposition format 0.0.4).
 *
 * Everything is allocated by met_new: a table of families (name, help, type) and a
 * table of series (labels, value, histogram buckets), both max_series long, since each
 * family has at least one series. Strings are copied into fixed fields, so callers may
 * pass labels built in a stack buffer; the limits below are generous for metric names
 * and are checked at registration (-EINVAL), never at render time.
 *
 * Rendering walks families in the order their first series was registered, and each
 * family's series through a linked chain in registration order, so series added
 * interleaved with other families still print grouped under one HELP/TYPE pair, as
 * the format requires. met_render allocates nothing: numbers go through snprintf into
 * small stack buffers and the output through a clipped appender. */
#include "net/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MET_NAME_LEN 128           /* bytes of a metric name, without the NUL */
#define MET_LABELS_LEN 256         /* bytes of a label string */
#define MET_HELP_LEN 512           /* bytes of help text (unescaped) */
#define MET_SERIES_LIMIT (1 << 20) /* keeps the table sizes far from overflow */

typedef struct {
    int type;
    int first, last; /* series chain, in registration order */
    char name[MET_NAME_LEN + 1];
    char help[MET_HELP_LEN + 1];
} met_family;

typedef struct {
    int fam;  /* index into metrics.f */
    int next; /* next series of the same family, -1 at the end */
    int nb;   /* histogram: number of finite bounds */
    char labels[MET_LABELS_LEN + 1];
    double v;       /* counter or gauge value; histogram sum */
    uint64_t count; /* histogram: observations */
    double le[MET_MAX_BUCKETS];
    uint64_t hits[MET_MAX_BUCKETS + 1]; /* per bucket, not cumulative; [nb] is above le[nb-1] */
} met_series;

struct metrics {
    int cap, n, nfam;
    met_series *s;
    met_family *f;
};

metrics *met_new(int max_series) {
    if (max_series < 0 || max_series > MET_SERIES_LIMIT) return NULL;
    metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    /* +1: calloc(0) may return NULL, which would read as out of memory. */
    m->s = calloc((size_t)max_series + 1, sizeof *m->s);
    m->f = calloc((size_t)max_series + 1, sizeof *m->f);
    if (!m->s || !m->f) {
        met_free(m);
        return NULL;
    }
    m->cap = max_series;
    return m;
}

void met_free(metrics *m) {
    if (!m) return;
    free(m->s);
    free(m->f);
    free(m);
}

/* ---------------------------------------------------------------- validation */

/* ASCII classes by hand: the C library's are locale-dependent. */
static int met_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int met_digit(char c) { return c >= '0' && c <= '9'; }

/* strlen(s) > max, without reading past s[max] (strnlen is POSIX, not C11). */
static int met_longer(const char *s, size_t max) {
    for (size_t i = 0; i <= max; i++)
        if (!s[i]) return 0;
    return 1;
}

/* [a-zA-Z_:][a-zA-Z0-9_:]*, at most MET_NAME_LEN bytes. */
static int met_name_ok(const char *s) {
    if (!s || !*s) return 0;
    for (size_t i = 0; s[i]; i++) {
        if (i >= MET_NAME_LEN) return 0;
        if (!(met_alpha(s[i]) || s[i] == ':' || (i > 0 && met_digit(s[i])))) return 0;
    }
    return 1;
}

/* Parses one k="v" pair at p: sets the key and the (still escaped) value spans and
 * returns the position just past the closing quote, or NULL when p does not start a
 * well-formed pair. The value may hold any byte but a raw newline; a backslash must
 * start one of \" \\ \n, the only escapes the format defines. */
static const char *met_pair(const char *p, const char **k, size_t *kl, const char **v, size_t *vl) {
    const char *q = p;
    if (!met_alpha(*q)) return NULL;
    while (met_alpha(*q) || met_digit(*q)) q++;
    *k = p;
    *kl = (size_t)(q - p);
    if (q[0] != '=' || q[1] != '"') return NULL;
    q += 2;
    *v = q;
    for (;;) {
        if (*q == '\0' || *q == '\n') return NULL;
        if (*q == '"') break;
        if (*q == '\\') {
            if (q[1] != '\\' && q[1] != '"' && q[1] != 'n') return NULL;
            q += 2;
        } else {
            q++;
        }
    }
    *vl = (size_t)(q - *v);
    return q + 1;
}

/* Looks key k up among the pairs of the (valid) label string l that start before
 * stop (NULL: the whole string); on a hit sets its value span. */
static int met_find(const char *l, const char *stop, const char *k, size_t kl, const char **v,
                    size_t *vl) {
    const char *p = l;
    while (*p && (!stop || p < stop)) {
        const char *pk, *pv;
        size_t pkl, pvl;
        const char *q = met_pair(p, &pk, &pkl, &pv, &pvl);
        if (!q) return 0;
        if (pkl == kl && !memcmp(pk, k, kl)) {
            *v = pv;
            *vl = pvl;
            return 1;
        }
        p = *q == ',' ? q + 1 : q;
    }
    return 0;
}

/* A label string as printed inside {}: "" or pairs joined by single commas (no trailing
 * comma: met_render may append `,le="..."`), no reserved __ names, no key twice, and
 * no "le" on histograms (it is the bucket label). The count of pairs, or -1. */
static int met_labels_check(const char *l, int histogram) {
    if (met_longer(l, MET_LABELS_LEN)) return -1;
    int n = 0;
    const char *p = l;
    while (*p) {
        const char *k, *v, *ov;
        size_t kl, vl, ovl;
        const char *q = met_pair(p, &k, &kl, &v, &vl);
        if (!q) return -1;
        if (kl >= 2 && k[0] == '_' && k[1] == '_') return -1;
        if (histogram && kl == 2 && k[0] == 'l' && k[1] == 'e') return -1;
        if (met_find(l, p, k, kl, &ov, &ovl)) return -1;
        n++;
        if (*q == '\0') break;
        if (*q != ',' || q[1] == '\0') return -1;
        p = q + 1;
    }
    return n;
}

/* Same label set, in any order: a="1",b="2" names the series b="2",a="1" does. Values
 * compare escaped, which is exact since each byte has one spelling (\ and " must be
 * escaped, a newline must be, and no other escape exists). */
static int met_same_labels(const char *a, int na, const char *b, int nb) {
    if (na != nb) return 0;
    const char *p = a;
    while (*p) {
        const char *k, *v, *bv;
        size_t kl, vl, bvl;
        const char *q = met_pair(p, &k, &kl, &v, &vl);
        if (!q || !met_find(b, NULL, k, kl, &bv, &bvl)) return 0;
        if (bvl != vl || memcmp(bv, v, vl)) return 0;
        p = *q == ',' ? q + 1 : q;
    }
    return 1;
}

/* name is base followed by one of the suffixes a histogram's samples use. */
static int met_derived(const char *base, const char *name) {
    static const char *const suf[] = {"_bucket", "_sum", "_count"};
    size_t bl = strlen(base);
    if (strncmp(base, name, bl)) return 0;
    for (int i = 0; i < 3; i++)
        if (!strcmp(name + bl, suf[i])) return 1;
    return 0;
}

static int met_family_find(const metrics *m, const char *name) {
    for (int i = 0; i < m->nfam; i++)
        if (!strcmp(m->f[i].name, name)) return i;
    return -1;
}

/* ---------------------------------------------------------------- registration */

static int met_add(metrics *m, int type, const char *name, const char *help, const char *labels,
                   const double *b, int nb) {
    if (!m || !met_name_ok(name)) return -EINVAL;
    if (!help) help = "";
    if (!labels) labels = "";
    if (met_longer(help, MET_HELP_LEN)) return -EINVAL;
    int nl = met_labels_check(labels, type == MET_HISTOGRAM);
    if (nl < 0) return -EINVAL;
    if (type == MET_HISTOGRAM) {
        if (!b || nb < 1 || nb > MET_MAX_BUCKETS) return -EINVAL;
        for (int i = 0; i < nb; i++)
            if (!isfinite(b[i]) || (i > 0 && !(b[i] > b[i - 1]))) return -EINVAL;
    }
    int fi = met_family_find(m, name);
    if (fi >= 0) {
        met_family *f = &m->f[fi];
        if (f->type != type || strcmp(f->help, help)) return -EINVAL;
        for (int i = f->first; i >= 0; i = m->s[i].next) {
            const char *ol = m->s[i].labels;
            if (met_same_labels(ol, met_labels_check(ol, type == MET_HISTOGRAM), labels, nl))
                return -EEXIST;
        }
    } else {
        /* A histogram "x" prints x_bucket, x_sum and x_count: a family by one of those
         * names would have its samples read as the histogram's, or the other way. */
        for (int i = 0; i < m->nfam; i++) {
            if (m->f[i].type == MET_HISTOGRAM && met_derived(m->f[i].name, name)) return -EINVAL;
            if (type == MET_HISTOGRAM && met_derived(name, m->f[i].name)) return -EINVAL;
        }
    }
    if (m->n >= m->cap) return -ENOSPC;
    if (fi < 0) {
        fi = m->nfam++; /* nfam <= n < cap: there is room */
        met_family *f = &m->f[fi];
        f->type = type;
        f->first = f->last = -1;
        memcpy(f->name, name, strlen(name) + 1);
        memcpy(f->help, help, strlen(help) + 1);
    }
    int h = m->n++;
    met_series *s = &m->s[h];
    memset(s, 0, sizeof *s);
    s->fam = fi;
    s->next = -1;
    memcpy(s->labels, labels, strlen(labels) + 1);
    if (type == MET_HISTOGRAM) {
        s->nb = nb;
        memcpy(s->le, b, (size_t)nb * sizeof *b);
    }
    met_family *f = &m->f[fi];
    if (f->last >= 0)
        m->s[f->last].next = h;
    else
        f->first = h;
    f->last = h;
    return h;
}

int met_add_counter(metrics *m, const char *name, const char *help, const char *labels) {
    return met_add(m, MET_COUNTER, name, help, labels, NULL, 0);
}

int met_add_gauge(metrics *m, const char *name, const char *help, const char *labels) {
    return met_add(m, MET_GAUGE, name, help, labels, NULL, 0);
}

int met_add_histogram(metrics *m, const char *name, const char *help, const char *labels,
                      const double *buckets, int n_buckets) {
    return met_add(m, MET_HISTOGRAM, name, help, labels, buckets, n_buckets);
}

/* ---------------------------------------------------------------- updates */

/* The series behind handle h, when h is one and has the type wanted; bad handles are
 * ignored rather than trusted, as the header promises. */
static met_series *met_get(const metrics *m, int h, int type) {
    if (!m || h < 0 || h >= m->n) return NULL;
    met_series *s = &m->s[h];
    if (type >= 0 && m->f[s->fam].type != type) return NULL;
    return s;
}

void met_inc(metrics *m, int h, double v) {
    met_series *s = met_get(m, h, -1);
    if (!s) return;
    int t = m->f[s->fam].type;
    /* !(v >= 0) also refuses NaN: a counter must never go down or become NaN. */
    if (t == MET_GAUGE || (t == MET_COUNTER && v >= 0)) s->v += v;
}

void met_set(metrics *m, int h, double v) {
    met_series *s = met_get(m, h, MET_GAUGE);
    if (s) s->v = v;
}

void met_observe(metrics *m, int h, double v) {
    met_series *s = met_get(m, h, MET_HISTOGRAM);
    if (!s) return;
    /* First bound >= v (le is "less or equal"); NaN compares false everywhere and so
     * lands in +Inf only, keeping the +Inf bucket equal to the count. */
    int lo = 0, hi = s->nb;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (v <= s->le[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    s->hits[lo]++;
    s->count++;
    s->v += v;
}

double met_value(const metrics *m, int h) {
    const met_series *s = met_get(m, h, -1);
    if (!s) return 0;
    return m->f[s->fam].type == MET_HISTOGRAM ? (double)s->count : s->v;
}

/* ---------------------------------------------------------------- numbers */

/* v as Go's strconv.FormatFloat(v, 'g', -1, 64), which the Prometheus Go client uses
 * for le labels: the fewest significant digits that read back as v, in exponent form
 * when the decimal exponent is < -4 or >= 6 (Go's rule for shortest 'g'), else plain
 * ("0.005", "2.5", "100000", "1e+06"). Fewest digits: the first %.*e that round-trips. */
static void met_fmt_short(char *buf, size_t cap, double v) {
    if (isnan(v)) {
        snprintf(buf, cap, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, cap, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    if (v == 0) { /* also -0, as the Go client prints it */
        snprintf(buf, cap, "0");
        return;
    }
    char e[40];
    int p;
    for (p = 1; p < 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, v);
        if (strtod(e, NULL) == v) break;
    }
    if (p == 17) snprintf(e, sizeof e, "%.16e", v); /* 17 digits always round-trip */
    const char *x = strchr(e, 'e');
    int exp = x ? atoi(x + 1) : 0;
    if (exp < -4 || exp >= 6)
        snprintf(buf, cap, "%s", e);
    else
        snprintf(buf, cap, "%.*f", p - 1 - exp > 0 ? p - 1 - exp : 0, v);
}

/* A sample value: an integer below 2^53 in magnitude (all exact there) prints in full,
 * "1000000" where Go would write "1e+06", which is easier to read in a scrape and to
 * grep; anything else as met_fmt_short. */
static void met_fmt_value(char *buf, size_t cap, double v) {
    if (v == trunc(v) && fabs(v) < 9007199254740992.0)
        snprintf(buf, cap, "%.0f", v == 0 ? 0.0 : v); /* -0 prints "0" */
    else
        met_fmt_short(buf, cap, v);
}

/* ---------------------------------------------------------------- rendering */

/* Appends into out[0..cap) and keeps counting past it, so the caller learns the full
 * length; nothing is ever written at or beyond cap. */
typedef struct {
    char *out;
    size_t cap, len;
} met_buf;

static void met_put(met_buf *b, const char *s, size_t n) {
    if (b->len < b->cap) {
        size_t room = b->cap - b->len;
        memcpy(b->out + b->len, s, n < room ? n : room);
    }
    b->len += n;
}

static void met_puts(met_buf *b, const char *s) { met_put(b, s, strlen(s)); }

/* HELP text escapes \ as \\ and newline as \n (format 0.0.4). */
static void met_put_help(met_buf *b, const char *s) {
    for (const char *p = s; *p; p++) {
        if (*p == '\\')
            met_put(b, "\\\\", 2);
        else if (*p == '\n')
            met_put(b, "\\n", 2);
        else
            met_put(b, p, 1);
    }
}

/* name+suffix{labels[,le="le"]} value */
static void met_sample(met_buf *b, const char *name, const char *suffix, const char *labels,
                       const char *le, const char *value) {
    met_puts(b, name);
    met_puts(b, suffix);
    if (*labels || le) {
        met_put(b, "{", 1);
        met_puts(b, labels);
        if (le) {
            if (*labels) met_put(b, ",", 1);
            met_puts(b, "le=\"");
            met_puts(b, le);
            met_put(b, "\"", 1);
        }
        met_put(b, "}", 1);
    }
    met_put(b, " ", 1);
    met_puts(b, value);
    met_put(b, "\n", 1);
}

static void met_render_series(met_buf *b, const met_family *f, const met_series *s) {
    char num[48], le[48];
    if (f->type != MET_HISTOGRAM) {
        met_fmt_value(num, sizeof num, s->v);
        met_sample(b, f->name, "", s->labels, NULL, num);
        return;
    }
    uint64_t cum = 0;
    for (int i = 0; i < s->nb; i++) {
        cum += s->hits[i];
        met_fmt_short(le, sizeof le, s->le[i]);
        snprintf(num, sizeof num, "%" PRIu64, cum);
        met_sample(b, f->name, "_bucket", s->labels, le, num);
    }
    snprintf(num, sizeof num, "%" PRIu64, s->count);
    met_sample(b, f->name, "_bucket", s->labels, "+Inf", num);
    met_fmt_value(num, sizeof num, s->v);
    met_sample(b, f->name, "_sum", s->labels, NULL, num);
    snprintf(num, sizeof num, "%" PRIu64, s->count);
    met_sample(b, f->name, "_count", s->labels, NULL, num);
}

int met_render(const metrics *m, char *out, size_t cap) {
    static const char *const types[] = {"counter", "gauge", "histogram"};
    met_buf b = {out, out ? cap : 0, 0};
    for (int fi = 0; m && fi < m->nfam; fi++) {
        const met_family *f = &m->f[fi];
        met_puts(&b, "# HELP ");
        met_puts(&b, f->name);
        met_put(&b, " ", 1);
        met_put_help(&b, f->help);
        met_puts(&b, "\n# TYPE ");
        met_puts(&b, f->name);
        met_put(&b, " ", 1);
        met_puts(&b, types[f->type]);
        met_put(&b, "\n", 1);
        for (int i = f->first; i >= 0; i = m->s[i].next) met_render_series(&b, f, &m->s[i]);
    }
    if (b.len < b.cap && b.len <= (size_t)0x7fffffff) {
        out[b.len] = '\0';
        return (int)b.len;
    }
    if (b.cap > 0) out[b.cap - 1] = '\0';
    return -ENOSPC;
}
