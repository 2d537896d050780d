/* test_metrics: net/metrics. Name, label and bucket validation; -EEXIST/-EINVAL/-ENOSPC;
 * update rules (negative counter increments, bad handles); exact output for a small
 * registry; number and le formatting; family grouping when series are registered
 * interleaved; met_render at every too-small capacity. Every rendered text also goes
 * through an independent line-by-line validator of the 0.0.4 text format, which is
 * itself shown to reject broken texts. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/metrics.h"
#include "tests/unit/check.h"

static char out[1 << 16];

/* ---------------------------------------------------------------- the validator */

/* Independent of net/metrics.c on purpose: it reads the text as a scraper would. */

#define V_FAMS 64
#define V_HSER 64

typedef struct {
    char name[160];
    char type[16];
    int help, typed, samples, closed;
} vfam;

typedef struct {
    char key[320]; /* family name + labels other than le, as printed */
    double last_le;
    double last_cnt, inf_cnt;
    int nb, has_inf;
} vhist;

static vfam vf[V_FAMS];
static vhist vh[V_HSER];
static int nvf, nvh;
static char vwhy[1024];

static int v_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int v_digit(char c) { return c >= '0' && c <= '9'; }

/* Metric name at s (length n)? */
static int v_name(const char *s, size_t n) {
    if (!n) return 0;
    for (size_t i = 0; i < n; i++)
        if (!(v_alpha(s[i]) || s[i] == ':' || (i && v_digit(s[i])))) return 0;
    return 1;
}

/* A sample value or le: Prometheus float syntax as the clients print it. */
static int v_float(const char *s, size_t n, double *v) {
    char tmp[64];
    if (!n || n >= sizeof tmp) return 0;
    memcpy(tmp, s, n);
    tmp[n] = '\0';
    if (!strcmp(tmp, "NaN")) return *v = NAN, 1;
    if (!strcmp(tmp, "+Inf")) return *v = INFINITY, 1;
    if (!strcmp(tmp, "-Inf")) return *v = -INFINITY, 1;
    for (size_t i = 0; i < n; i++)
        if (!(v_digit(tmp[i]) || strchr(".eE+-", tmp[i]))) return 0;
    char *end;
    *v = strtod(tmp, &end);
    return *end == '\0';
}

static vfam *v_family(const char *name, size_t n, int create) {
    for (int i = 0; i < nvf; i++)
        if (strlen(vf[i].name) == n && !memcmp(vf[i].name, name, n)) return &vf[i];
    if (!create || nvf == V_FAMS || n >= sizeof vf[0].name) return NULL;
    vfam *f = &vf[nvf++];
    memset(f, 0, sizeof *f);
    memcpy(f->name, name, n);
    return f;
}

#define VFAIL(...) return snprintf(vwhy, sizeof vwhy, __VA_ARGS__), -1

/* "# HELP name text" or "# TYPE name type" (s is the line without its newline). */
static int v_comment(const char *s, size_t n) {
    int help = n > 7 && !memcmp(s, "# HELP ", 7);
    int type = n > 7 && !memcmp(s, "# TYPE ", 7);
    if (!help && !type) return 0; /* other comments are allowed and ignored */
    const char *name = s + 7, *e = s + n;
    const char *sp = memchr(name, ' ', (size_t)(e - name));
    size_t nl = (size_t)((sp ? sp : e) - name);
    if (!v_name(name, nl)) VFAIL("bad name in '%.*s'", (int)n, s);
    vfam *f = v_family(name, nl, 1);
    if (!f) VFAIL("too many families");
    if (f->samples) VFAIL("%s after samples of %s", help ? "HELP" : "TYPE", f->name);
    const char *text = sp ? sp + 1 : e;
    if (help) {
        if (f->help++) VFAIL("second HELP for %s", f->name);
        for (const char *p = text; p < e; p++)
            if (*p == '\\' && (++p == e || (*p != '\\' && *p != 'n'))) VFAIL("bad escape in HELP");
    } else {
        size_t tl = (size_t)(e - text);
        if (f->typed++) VFAIL("second TYPE for %s", f->name);
        if (tl >= sizeof f->type) VFAIL("bad type");
        memcpy(f->type, text, tl);
        f->type[tl] = '\0';
        if (strcmp(f->type, "counter") && strcmp(f->type, "gauge") && strcmp(f->type, "histogram") &&
            strcmp(f->type, "summary") && strcmp(f->type, "untyped"))
            VFAIL("bad type '%s'", f->type);
    }
    return 0;
}

/* name{k="v",...} value */
static int v_sample(const char *s, size_t n) {
    const char *e = s + n, *p = s;
    while (p < e && (v_alpha(*p) || v_digit(*p) || *p == ':')) p++;
    size_t nl = (size_t)(p - s);
    if (!v_name(s, nl)) VFAIL("bad sample name in '%.*s'", (int)n, s);
    /* The family: the name itself, or a histogram's base name. */
    vfam *f = v_family(s, nl, 0);
    const char *suffix = "";
    if (!f || !strcmp(f->type, "histogram")) {
        static const char *const suf[] = {"_bucket", "_sum", "_count"};
        f = NULL;
        for (int i = 0; i < 3 && !f; i++) {
            size_t sl = strlen(suf[i]);
            if (nl > sl && !memcmp(s + nl - sl, suf[i], sl)) {
                vfam *g = v_family(s, nl - sl, 0);
                if (g && !strcmp(g->type, "histogram")) f = g, suffix = suf[i];
            }
        }
    }
    if (!f) VFAIL("sample '%.*s' of no known family", (int)nl, s);
    if (!f->help || !f->typed) VFAIL("sample of %s before its HELP and TYPE", f->name);
    if (f->closed) VFAIL("family %s not grouped", f->name);
    for (int i = 0; i < nvf; i++)
        if (&vf[i] != f && vf[i].samples) vf[i].closed = 1;
    f->samples++;
    /* Labels; key = the family name plus every pair but le, for histogram series. */
    char key[320];
    size_t kl = (size_t)snprintf(key, sizeof key, "%s", f->name);
    double le = NAN;
    int has_le = 0;
    char seen[16][64];
    int nseen = 0;
    if (p < e && *p == '{') {
        p++;
        while (p < e && *p != '}') {
            const char *k = p;
            while (p < e && (v_alpha(*p) || (p > k && v_digit(*p)))) p++;
            size_t kn = (size_t)(p - k);
            if (!kn || kn >= 64 || p + 1 >= e || p[0] != '=' || p[1] != '"') VFAIL("bad label in '%.*s'", (int)n, s);
            if (kn >= 2 && k[0] == '_' && k[1] == '_') VFAIL("reserved label name");
            for (int i = 0; i < nseen; i++)
                if (strlen(seen[i]) == kn && !memcmp(seen[i], k, kn)) VFAIL("label twice in '%.*s'", (int)n, s);
            if (nseen == 16) VFAIL("too many labels");
            memcpy(seen[nseen], k, kn);
            seen[nseen++][kn] = '\0';
            p += 2;
            const char *v = p;
            while (p < e && *p != '"') {
                if (*p == '\n') VFAIL("raw newline");
                if (*p == '\\' && (++p == e || (*p != '\\' && *p != '"' && *p != 'n'))) VFAIL("bad escape");
                p++;
            }
            if (p == e) VFAIL("unterminated label value");
            size_t vn = (size_t)(p - v);
            p++;
            if (kn == 2 && !memcmp(k, "le", 2)) {
                if (!v_float(v, vn, &le)) VFAIL("bad le '%.*s'", (int)vn, v);
                has_le = 1;
            } else {
                kl += (size_t)snprintf(key + kl, kl < sizeof key ? sizeof key - kl : 0, ",%.*s=%.*s",
                                       (int)kn, k, (int)vn, v);
            }
            if (p < e && *p == ',') p++;
        }
        if (p == e) VFAIL("unterminated labels");
        p++;
    }
    if (kl >= sizeof key) VFAIL("key too long");
    if (p == e || *p != ' ') VFAIL("no space before the value in '%.*s'", (int)n, s);
    p++;
    double val;
    if (!v_float(p, (size_t)(e - p), &val)) VFAIL("bad value in '%.*s'", (int)n, s);
    if (*suffix) {
        vhist *h = NULL;
        for (int i = 0; i < nvh; i++)
            if (!strcmp(vh[i].key, key)) h = &vh[i];
        if (!h) {
            if (nvh == V_HSER) VFAIL("too many histogram series");
            h = &vh[nvh++];
            memset(h, 0, sizeof *h);
            memcpy(h->key, key, kl + 1);
        }
        if (!strcmp(suffix, "_bucket")) {
            if (!has_le) VFAIL("bucket without le");
            if (h->has_inf) VFAIL("bucket after +Inf");
            if (h->nb && !(le > h->last_le)) VFAIL("le not increasing in %s", key);
            if (h->nb && val < h->last_cnt) VFAIL("buckets not cumulative in %s", key);
            if (val != floor(val) || val < 0) VFAIL("bucket count not a count");
            h->nb++;
            h->last_le = le;
            h->last_cnt = val;
            if (isinf(le) && le > 0) h->has_inf = 1, h->inf_cnt = val;
        } else {
            if (has_le) VFAIL("le on %s", suffix);
            if (!h->has_inf) VFAIL("%s before the +Inf bucket of %s", suffix, key);
            if (!strcmp(suffix, "_count") && val != h->inf_cnt) VFAIL("count != +Inf bucket in %s", key);
        }
    }
    if (!strcmp(f->type, "counter") && !(val >= 0)) VFAIL("counter %s is %g", f->name, val);
    return 0;
}

/* 0 when text is a well-formed exposition, else -1 with the reason in vwhy. */
static int validate(const char *text) {
    nvf = nvh = 0;
    vwhy[0] = '\0';
    size_t len = strlen(text);
    if (len && text[len - 1] != '\n') VFAIL("no final newline");
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t n = (size_t)(nl - p);
        if (!n) VFAIL("empty line");
        int rc = *p == '#' ? v_comment(p, n) : v_sample(p, n);
        if (rc) return rc;
        p = nl + 1;
    }
    for (int i = 0; i < nvh; i++)
        if (!vh[i].has_inf) VFAIL("histogram %s has no +Inf bucket", vh[i].key);
    return 0;
}

static void test_validator(void) {
    static const char *const bad[] = {
        "a 1",                                       /* no final newline */
        "a 1\n",                                     /* no HELP/TYPE */
        "# TYPE a gauge\na 1\n",                     /* no HELP */
        "# HELP a x\n# TYPE a gauge\na x\n",         /* value */
        "# HELP a x\n# TYPE a gauge\na{b=\"1} 1\n",  /* unterminated */
        "# HELP a x\n# TYPE a gauge\na{b=\"1\",b=\"2\"} 1\n",
        "# HELP a x\n# TYPE a gauge\na 1\n# HELP b x\n# TYPE b gauge\nb 1\na 2\n", /* grouping */
        "# HELP a x\n# TYPE a gauge\na 1\n# HELP a y\n",
        "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
        "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 3\n",
        "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"2\"} 1\nh_bucket{le=\"1\"} 1\n",
        "# HELP h x\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n",
        "# HELP c x\n# TYPE c counter\nc -1\n",
        "# HELP a x\\q\n# TYPE a gauge\na 1\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(validate(bad[i]) < 0, "validator took bad text %zu", i);
    CHECK(validate("") == 0, "empty: %s", vwhy);
    CHECK(validate("# HELP h x\n# TYPE h histogram\nh_bucket{a=\"1\",le=\"1\"} 1\n"
                   "h_bucket{a=\"1\",le=\"+Inf\"} 2\nh_sum{a=\"1\"} 3.5\nh_count{a=\"1\"} 2\n") == 0,
          "good histogram: %s", vwhy);
}

/* ---------------------------------------------------------------- helpers */

static int render(const metrics *m) {
    memset(out, 0x55, sizeof out);
    return met_render(m, out, sizeof out);
}

/* Renders m and checks the text validates; returns the length. */
static int render_valid(const metrics *m, const char *what) {
    int n = render(m);
    CHECK(n >= 0 && (size_t)n == strlen(out), "%s: render %d", what, n);
    CHECK(validate(out) == 0, "%s: %s\n%s", what, vwhy, out);
    return n;
}

/* The sample line that starts with prefix, or NULL. */
static const char *line_of(const char *prefix) {
    size_t pl = strlen(prefix);
    for (const char *p = out; *p;) {
        if (!strncmp(p, prefix, pl)) return p;
        const char *nl = strchr(p, '\n');
        if (!nl) break;
        p = nl + 1;
    }
    return NULL;
}

/* The text of one gauge whose value is v, from a fresh registry. */
static const char *gauge_text(double v) {
    static char buf[256];
    metrics *m = met_new(1);
    int h = met_add_gauge(m, "g", "", NULL);
    met_set(m, h, v);
    met_render(m, buf, sizeof buf);
    met_free(m);
    const char *p = strstr(buf, "\ng ");
    return p ? p + 3 : "";
}

/* The le label of the first bucket of a histogram with bound b. */
static const char *le_text(double b) {
    static char buf[512], le[64];
    metrics *m = met_new(1);
    met_add_histogram(m, "h", "", NULL, &b, 1);
    met_render(m, buf, sizeof buf);
    met_free(m);
    const char *p = strstr(buf, "h_bucket{le=\"");
    le[0] = '\0';
    if (p) {
        p += 13;
        size_t n = strcspn(p, "\"");
        snprintf(le, sizeof le, "%.*s", (int)n, p);
    }
    return le;
}

/* ---------------------------------------------------------------- tests */

static void test_new(void) {
    CHECK(met_new(-1) == NULL, "negative size");
    met_free(NULL);
    metrics *m = met_new(0);
    CHECK(m != NULL, "size 0");
    CHECK(met_add_gauge(m, "g", "h", NULL) == -ENOSPC, "no room");
    CHECK(met_render(m, out, sizeof out) == 0 && out[0] == '\0', "empty render");
    CHECK(met_render(m, NULL, 0) == -ENOSPC, "cap 0");
    met_free(m);
}

static void test_names(void) {
    metrics *m = met_new(64);
    static const char *const good[] = {"a", "_x", ":x", "a:b_c1", "ABC_total", "x9"};
    static const char *const bad[] = {"", "1a", "a-b", "a b", "a.b", "caf\xc3\xa9", "a\n"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        CHECK(met_add_counter(m, good[i], "h", NULL) >= 0, "good name %s", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(met_add_counter(m, bad[i], "h", NULL) == -EINVAL, "bad name '%s'", bad[i]);
    CHECK(met_add_counter(m, NULL, "h", NULL) == -EINVAL, "NULL name");
    CHECK(met_add_counter(NULL, "n", "h", NULL) == -EINVAL, "NULL registry");
    char name[200];
    memset(name, 'n', sizeof name);
    name[128] = '\0';
    CHECK(met_add_gauge(m, name, "h", NULL) >= 0, "128-byte name");
    name[128] = 'n';
    name[129] = '\0';
    CHECK(met_add_gauge(m, name, "h", NULL) == -EINVAL, "129-byte name");
    char help[600];
    memset(help, 'h', sizeof help);
    help[512] = '\0';
    CHECK(met_add_gauge(m, "help512", help, NULL) >= 0, "512-byte help");
    help[512] = 'h';
    help[513] = '\0';
    CHECK(met_add_gauge(m, "help513", help, NULL) == -EINVAL, "513-byte help");
    render_valid(m, "names");
    met_free(m);
}

static void test_labels(void) {
    metrics *m = met_new(64);
    static const char *const good[] = {
        "a=\"1\"", "a=\"\",b=\"x\"", "_a=\"x\"", "a1=\"\\\"q\\\" \\\\ \\n\"", "le=\"0.5\"",
        "a=\"tab\there\"", "a=\"caf\xc3\xa9 {} = , \"", "quantile=\"1\"",
    };
    static const char *const bad[] = {
        "a=1", "a=\"1\",", ",a=\"1\"", "a=\"1\" ", " a=\"1\"", "__a=\"1\"", "a=\"x\\qy\"",
        "a=\"x\ny\"", "a=\"1\",a=\"2\"", "1a=\"x\"", "a=\"unterminated", "a=\"1\"b=\"2\"",
        "a-b=\"1\"", "a =\"1\"", "a=\"1\",,b=\"2\"", "a=\"x\\\"", "{a=\"1\"}", "=\"1\"",
    };
    char name[32];
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        snprintf(name, sizeof name, "good%zu", i);
        CHECK(met_add_gauge(m, name, "h", good[i]) >= 0, "good labels %s", good[i]);
    }
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(met_add_gauge(m, "bad", "h", bad[i]) == -EINVAL, "bad labels %s", bad[i]);
    double b[] = {1};
    CHECK(met_add_histogram(m, "h", "h", "le=\"1\"", b, 1) == -EINVAL, "le on a histogram");
    CHECK(met_add_histogram(m, "h", "h", "a=\"1\",le=\"1\"", b, 1) == -EINVAL, "le on a histogram 2");
    CHECK(met_add_histogram(m, "h", "h", "lex=\"1\"", b, 1) >= 0, "lex is fine");
    char big[300];
    memset(big, 0, sizeof big);
    memcpy(big, "a=\"", 3);
    memset(big + 3, 'v', 252);
    big[255] = '"';
    CHECK(strlen(big) == 256 && met_add_gauge(m, "big", "h", big) >= 0, "256-byte labels");
    big[255] = 'v';
    big[256] = '"';
    CHECK(met_add_gauge(m, "big2", "h", big) == -EINVAL, "257-byte labels");
    render_valid(m, "labels");
    met_free(m);
}

static void test_buckets(void) {
    metrics *m = met_new(64);
    double b[40];
    for (int i = 0; i < 40; i++) b[i] = i * 0.5;
    CHECK(met_add_histogram(m, "h", "h", NULL, b, 0) == -EINVAL, "0 buckets");
    CHECK(met_add_histogram(m, "h", "h", NULL, b, 33) == -EINVAL, "33 buckets");
    CHECK(met_add_histogram(m, "h", "h", NULL, NULL, 3) == -EINVAL, "NULL buckets");
    double eq[] = {1, 1}, dec[] = {2, 1}, nan_[] = {1, NAN}, inf[] = {1, INFINITY}, ninf[] = {-INFINITY, 1};
    CHECK(met_add_histogram(m, "h", "h", NULL, eq, 2) == -EINVAL, "equal bounds");
    CHECK(met_add_histogram(m, "h", "h", NULL, dec, 2) == -EINVAL, "decreasing");
    CHECK(met_add_histogram(m, "h", "h", NULL, nan_, 2) == -EINVAL, "NaN bound");
    CHECK(met_add_histogram(m, "h", "h", NULL, inf, 2) == -EINVAL, "+Inf bound");
    CHECK(met_add_histogram(m, "h", "h", NULL, ninf, 2) == -EINVAL, "-Inf bound");
    int h = met_add_histogram(m, "h", "h", NULL, b, 32);
    CHECK(h >= 0, "32 buckets");
    double neg[] = {-5, -1, 0};
    CHECK(met_add_histogram(m, "hn", "h", NULL, neg, 3) >= 0, "negative bounds");
    for (int i = 0; i < 100; i++) met_observe(m, h, i * 0.25);
    render_valid(m, "buckets");
    met_free(m);
}

static void test_register_rules(void) {
    metrics *m = met_new(8);
    int a = met_add_counter(m, "x_total", "X.", "a=\"1\",b=\"2\"");
    CHECK(a == 0, "first handle %d", a);
    CHECK(met_add_counter(m, "x_total", "X.", "a=\"1\",b=\"2\"") == -EEXIST, "same labels");
    CHECK(met_add_counter(m, "x_total", "X.", "b=\"2\",a=\"1\"") == -EEXIST, "reordered labels");
    CHECK(met_add_counter(m, "x_total", "X.", "a=\"1\"") == 1, "subset is another series");
    CHECK(met_add_counter(m, "x_total", "X.", "a=\"1\",b=\"3\"") == 2, "other value");
    CHECK(met_add_gauge(m, "x_total", "X.", "c=\"1\"") == -EINVAL, "other type");
    CHECK(met_add_counter(m, "x_total", "Y.", "c=\"1\"") == -EINVAL, "other help");
    CHECK(met_add_counter(m, "n", NULL, NULL) == 3, "NULL help");
    CHECK(met_add_counter(m, "n", "", "") == -EEXIST, "NULL help == \"\" and NULL labels == \"\"");
    double b[] = {1, 2};
    CHECK(met_add_histogram(m, "hist", "H.", NULL, b, 2) == 4, "histogram");
    CHECK(met_add_counter(m, "hist_count", "c", NULL) == -EINVAL, "clash with hist_count");
    CHECK(met_add_gauge(m, "hist_bucket", "c", NULL) == -EINVAL, "clash with hist_bucket");
    CHECK(met_add_gauge(m, "hist_sum", "c", NULL) == -EINVAL, "clash with hist_sum");
    CHECK(met_add_gauge(m, "hist_sum_x", "c", NULL) == 5, "no clash with hist_sum_x");
    CHECK(met_add_histogram(m, "hist_sum", "H.", NULL, b, 2) == -EINVAL, "histogram x_sum clashes");
    CHECK(met_add_gauge(m, "y_count", "c", NULL) == 6, "y_count");
    CHECK(met_add_histogram(m, "y", "H.", NULL, b, 2) == -EINVAL, "histogram over y_count");
    CHECK(met_add_histogram(m, "hist", "H.", "k=\"v\"", b, 1) == 7, "other buckets, same family");
    CHECK(met_add_gauge(m, "full", "c", NULL) == -ENOSPC, "full");
    /* Errors that say something about the call come before "full". */
    CHECK(met_add_counter(m, "x_total", "X.", "a=\"1\"") == -EEXIST, "EEXIST when full");
    CHECK(met_add_counter(m, "1", "X.", NULL) == -EINVAL, "EINVAL when full");
    render_valid(m, "rules");
    met_free(m);
}

static void test_updates(void) {
    metrics *m = met_new(8);
    int c = met_add_counter(m, "c_total", "C.", NULL);
    int g = met_add_gauge(m, "g", "G.", NULL);
    double b[] = {1, 5};
    int h = met_add_histogram(m, "h_seconds", "H.", NULL, b, 2);
    met_inc(m, c, 2);
    met_inc(m, c, 0.5);
    met_inc(m, c, -1);
    met_inc(m, c, NAN);
    met_set(m, c, 100);
    met_observe(m, c, 3);
    CHECK(met_value(m, c) == 2.5, "counter %g", met_value(m, c));
    met_inc(m, g, 3);
    met_inc(m, g, -5);
    CHECK(met_value(m, g) == -2, "gauge inc %g", met_value(m, g));
    met_set(m, g, 7.25);
    met_observe(m, g, 3);
    CHECK(met_value(m, g) == 7.25, "gauge set %g", met_value(m, g));
    met_observe(m, h, 0.5);
    met_observe(m, h, 1);   /* le="1" is inclusive */
    met_observe(m, h, 1.5);
    met_observe(m, h, 5);
    met_observe(m, h, 6);
    met_observe(m, h, -3);
    met_inc(m, h, 10);
    met_set(m, h, 10);
    CHECK(met_value(m, h) == 6, "histogram count %g", met_value(m, h));
    /* Bad handles and a NULL registry are ignored. */
    met_inc(m, -1, 1);
    met_inc(m, 3, 1);
    met_inc(m, 1 << 30, 1);
    met_set(m, -7, 1);
    met_observe(m, 99, 1);
    met_inc(NULL, 0, 1);
    met_set(NULL, 0, 1);
    met_observe(NULL, 0, 1);
    CHECK(met_value(m, -1) == 0 && met_value(m, 3) == 0 && met_value(NULL, 0) == 0, "bad handle values");
    render_valid(m, "updates");
    CHECK(line_of("c_total 2.5\n") != NULL, "counter line\n%s", out);
    CHECK(line_of("g 7.25\n") != NULL, "gauge line\n%s", out);
    CHECK(line_of("h_seconds_bucket{le=\"1\"} 3\n"), "le=1\n%s", out);
    CHECK(line_of("h_seconds_bucket{le=\"5\"} 5\n"), "le=5\n%s", out);
    CHECK(line_of("h_seconds_bucket{le=\"+Inf\"} 6\n"), "+Inf\n%s", out);
    CHECK(line_of("h_seconds_sum 11\n"), "sum\n%s", out);
    CHECK(line_of("h_seconds_count 6\n"), "count\n%s", out);
    met_observe(m, h, NAN);
    render_valid(m, "NaN observed");
    CHECK(line_of("h_seconds_bucket{le=\"5\"} 5\n") && line_of("h_seconds_bucket{le=\"+Inf\"} 7\n") &&
              line_of("h_seconds_sum NaN\n") && line_of("h_seconds_count 7\n"),
          "NaN goes to +Inf only\n%s", out);
    met_free(m);
}

static void test_golden(void) {
    metrics *m = met_new(16);
    double lat[] = {0.005, 0.25, 1, 2.5};
    int r0 = met_add_counter(m, "kiln_requests_total", "Requests.", "status=\"ok\"");
    int q = met_add_gauge(m, "kiln_queue_depth", "Waiting requests.\nSecond \\ line.", NULL);
    int h = met_add_histogram(m, "kiln_ttft_seconds", "Time to first token.", "model=\"a\\\"b\"", lat, 4);
    int r1 = met_add_counter(m, "kiln_requests_total", "Requests.", "status=\"error\"");
    int h2 = met_add_histogram(m, "kiln_ttft_seconds", "Time to first token.", NULL, lat, 4);
    met_inc(m, r0, 42);
    met_inc(m, r1, 1);
    met_set(m, q, -3);
    met_observe(m, h, 0.001);
    met_observe(m, h, 0.3);
    met_observe(m, h, 0.25);
    met_observe(m, h, 100);
    (void)h2;
    static const char *want =
        "# HELP kiln_requests_total Requests.\n"
        "# TYPE kiln_requests_total counter\n"
        "kiln_requests_total{status=\"ok\"} 42\n"
        "kiln_requests_total{status=\"error\"} 1\n"
        "# HELP kiln_queue_depth Waiting requests.\\nSecond \\\\ line.\n"
        "# TYPE kiln_queue_depth gauge\n"
        "kiln_queue_depth -3\n"
        "# HELP kiln_ttft_seconds Time to first token.\n"
        "# TYPE kiln_ttft_seconds histogram\n"
        "kiln_ttft_seconds_bucket{model=\"a\\\"b\",le=\"0.005\"} 1\n"
        "kiln_ttft_seconds_bucket{model=\"a\\\"b\",le=\"0.25\"} 2\n"
        "kiln_ttft_seconds_bucket{model=\"a\\\"b\",le=\"1\"} 3\n"
        "kiln_ttft_seconds_bucket{model=\"a\\\"b\",le=\"2.5\"} 3\n"
        "kiln_ttft_seconds_bucket{model=\"a\\\"b\",le=\"+Inf\"} 4\n"
        "kiln_ttft_seconds_sum{model=\"a\\\"b\"} 100.551\n"
        "kiln_ttft_seconds_count{model=\"a\\\"b\"} 4\n"
        "kiln_ttft_seconds_bucket{le=\"0.005\"} 0\n"
        "kiln_ttft_seconds_bucket{le=\"0.25\"} 0\n"
        "kiln_ttft_seconds_bucket{le=\"1\"} 0\n"
        "kiln_ttft_seconds_bucket{le=\"2.5\"} 0\n"
        "kiln_ttft_seconds_bucket{le=\"+Inf\"} 0\n"
        "kiln_ttft_seconds_sum 0\n"
        "kiln_ttft_seconds_count 0\n";
    int n = render_valid(m, "golden");
    CHECK(!strcmp(out, want), "golden output:\n%s", out);
    CHECK(n == (int)strlen(want), "length %d", n);
    CHECK(out[n] == '\0' && out[n + 1] == 0x55, "NUL and nothing after");

    /* Every too-small capacity: -ENOSPC, a NUL-terminated prefix, not one byte more
     * (each buffer is malloc'd to exactly cap bytes, so ASan sees any overrun). */
    int bad = 0;
    for (int cap = 0; cap <= n; cap++) {
        char *b = cap ? malloc((size_t)cap) : NULL;
        int rc = met_render(m, b, (size_t)cap);
        if (rc != -ENOSPC || (cap && (b[cap - 1] != '\0' || memcmp(b, want, (size_t)cap - 1)))) bad++;
        free(b);
    }
    CHECK(bad == 0, "%d capacities wrong", bad);
    char *b = malloc((size_t)n + 1);
    CHECK(met_render(m, b, (size_t)n + 1) == n && !strcmp(b, want), "exact capacity");
    free(b);
    met_free(m);
}

/* Families print grouped at their first position even when registered interleaved. */
static void test_grouping(void) {
    metrics *m = met_new(32);
    double b[] = {1};
    char l[32];
    for (int i = 0; i < 5; i++) {
        snprintf(l, sizeof l, "i=\"%d\"", i);
        CHECK(met_add_counter(m, "a_total", "A.", l) >= 0, "a %d", i);
        CHECK(met_add_gauge(m, "b", "B.", l) >= 0, "b %d", i);
        CHECK(met_add_histogram(m, "c", "C.", l, b, 1) >= 0, "c %d", i);
        if (i == 2) CHECK(met_add_gauge(m, "d", "D.", NULL) >= 0, "d");
    }
    render_valid(m, "grouping");
    const char *pa = strstr(out, "# HELP a_total"), *pb = strstr(out, "# HELP b "),
               *pc = strstr(out, "# HELP c "), *pd = strstr(out, "# HELP d ");
    CHECK(pa && pb && pc && pd && pa < pb && pb < pc && pc < pd, "family order\n%s", out);
    CHECK(pb && strstr(pb, "a_total{") == NULL, "a after b");
    /* Within a family, series in registration order. */
    const char *s0 = strstr(out, "b{i=\"0\"}"), *s4 = strstr(out, "b{i=\"4\"}");
    CHECK(s0 && s4 && s0 < s4 && s4 < pc, "series order");
    met_free(m);
}

static void test_numbers(void) {
    static const struct {
        double v;
        const char *want;
    } vals[] = {
        {42, "42"}, {-3, "-3"}, {0, "0"}, {-0.0, "0"}, {0.5, "0.5"}, {1e6, "1000000"},
        {9007199254740991.0, "9007199254740991"}, {9007199254740992.0, "9.007199254740992e+15"},
        {1e16, "1e+16"}, {0.1, "0.1"}, {1.0 / 3, "0.3333333333333333"}, {1e-7, "1e-07"},
        {123456.789, "123456.789"}, {1234567.5, "1.2345675e+06"}, {-2.5e-300, "-2.5e-300"},
        {0.0001, "0.0001"}, {0.00001, "1e-05"}, {1.7976931348623157e308, "1.7976931348623157e+308"},
        {5e-324, "5e-324"}, {NAN, "NaN"}, {INFINITY, "+Inf"}, {-INFINITY, "-Inf"},
    };
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) {
        const char *got = gauge_text(vals[i].v);
        size_t n = strcspn(got, "\n");
        CHECK(n == strlen(vals[i].want) && !memcmp(got, vals[i].want, n), "value %.17g: got '%.*s' want '%s'",
              vals[i].v, (int)n, got, vals[i].want);
    }
    /* le as the Go client prints it: strconv.FormatFloat(v, 'g', -1, 64). */
    static const struct {
        double v;
        const char *want;
    } les[] = {
        {0.005, "0.005"}, {0.01, "0.01"}, {0.025, "0.025"}, {0.05, "0.05"}, {0.1, "0.1"}, {0.25, "0.25"},
        {0.5, "0.5"}, {1, "1"}, {2.5, "2.5"}, {5, "5"}, {10, "10"}, {0, "0"}, {-1, "-1"},
        {100000, "100000"}, {1e6, "1e+06"}, {1.5e7, "1.5e+07"}, {1e-5, "1e-05"}, {0.0001, "0.0001"},
        {0.3, "0.3"}, {1.0 / 3, "0.3333333333333333"}, {123.456, "123.456"},
    };
    for (size_t i = 0; i < sizeof les / sizeof *les; i++) {
        const char *got = le_text(les[i].v);
        CHECK(!strcmp(got, les[i].want), "le %.17g: got '%s' want '%s'", les[i].v, got, les[i].want);
    }
    /* Every printed value reads back exactly. */
    unsigned x = 12345;
    int bad = 0;
    for (int i = 0; i < 2000; i++) {
        x = x * 1103515245u + 12345u;
        double v = ldexp((double)(x >> 8) / (1 << 24), (int)(x % 200) - 100) * ((x & 1) ? -1 : 1);
        const char *got = gauge_text(v);
        if (strtod(got, NULL) != v) bad++;
        if (strlen(got) > 26) bad++;
    }
    CHECK(bad == 0, "%d values do not round-trip", bad);
}

/* A registry like kilnd's, busy: still valid, every histogram consistent. */
static void test_busy(void) {
    metrics *m = met_new(64);
    double lat[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
    int hs[4], cs[4], gs[2];
    const char *models[] = {"model=\"smol\"", "model=\"big\\\\one\"", "model=\"x\\ny\"", ""};
    for (int i = 0; i < 4; i++) {
        cs[i] = met_add_counter(m, "kiln_tokens_total", "Tokens generated.", models[i]);
        hs[i] = met_add_histogram(m, "kiln_step_seconds", "Engine step time.", models[i], lat, 13);
    }
    gs[0] = met_add_gauge(m, "kiln_kv_blocks", "KV blocks.", "state=\"free\"");
    gs[1] = met_add_gauge(m, "kiln_kv_blocks", "KV blocks.", "state=\"used\"");
    unsigned x = 7;
    for (int i = 0; i < 5000; i++) {
        x = x * 1103515245u + 12345u;
        met_observe(m, hs[x % 4], (double)(x >> 12) / (1 << 20) * 0.3);
        met_inc(m, cs[(x >> 3) % 4], (double)(x % 7));
        met_set(m, gs[x & 1], (double)(x % 1000));
    }
    render_valid(m, "busy");
    double total = 0;
    for (int i = 0; i < 4; i++) total += met_value(m, hs[i]);
    CHECK(total == 5000, "observations %g", total);
    met_free(m);
}

int main(void) {
    test_validator();
    test_new();
    test_names();
    test_labels();
    test_buckets();
    test_register_rules();
    test_updates();
    test_golden();
    test_grouping();
    test_numbers();
    test_busy();
    return check_done("test_metrics");
}
