/* test_http: net/http. Good requests (CRLF, bare LF, mixed, HEAD, HTTP/1.0, queries,
 * pipelined bytes after the head); each error class with several inputs; the size
 * limits at and just past them; every cut point of good and bad heads (0 until complete,
 * then the same answer as the whole, each cut in a malloc'd buffer of exactly that many
 * bytes so ASan sees any over-read); http_head's exact output and every short capacity;
 * http_reason. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/http.h"
#include "tests/unit/check.h"

static http_req R;

/* http_parse over an exact-size heap copy of s[0..n). */
static int parse_n(const char *s, size_t n) {
    char *b = malloc(n ? n : 1);
    memcpy(b, s, n);
    memset(&R, 0x5a, sizeof R);
    int rc = http_parse(b, n, &R);
    free(b);
    return rc;
}

static int parse(const char *s) { return parse_n(s, strlen(s)); }

#define PARSES_TO(s, want)                                                           \
    do {                                                                             \
        int rc_ = parse(s);                                                          \
        CHECK(rc_ == (want), "%s: got %d want %d", #s, rc_, (int)(want));            \
    } while (0)

/* Every prefix of s[0..n) parses to 0 or to the whole's answer, and every prefix shorter
 * than a complete head to 0. Returns the number of bad cut points. */
static int cuts(const char *s, size_t n) {
    int whole = parse_n(s, n), bad = 0;
    for (size_t k = 0; k < n; k++) {
        int rc = parse_n(s, k);
        if (rc != 0 && rc != whole) bad++;
        if (whole > 0 && k < (size_t)whole && rc != 0) bad++;
        if (whole > 0 && k >= (size_t)whole && rc != whole) bad++;
    }
    return bad;
}

/* ---------------------------------------------------------------- good requests */

static void test_good(void) {
    static const char *get = "GET /metrics HTTP/1.1\r\nHost: kiln:9100\r\nUser-Agent: Prometheus/2.53\r\n"
                             "Accept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n"
                             "X-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n";
    int n = (int)strlen(get);
    CHECK(parse(get) == n, "scrape: %d", parse(get));
    CHECK(R.method == HTTP_GET && R.minor == 1 && !strcmp(R.path, "/metrics"), "scrape fields %d %d %s",
          R.method, R.minor, R.path);
    CHECK(cuts(get, (size_t)n) == 0, "scrape cuts");

    static const char *lf = "HEAD /healthz HTTP/1.0\nHost: x\n\n";
    CHECK(parse(lf) == (int)strlen(lf), "bare LF");
    CHECK(R.method == HTTP_HEAD && R.minor == 0 && !strcmp(R.path, "/healthz"), "HEAD fields");
    CHECK(cuts(lf, strlen(lf)) == 0, "LF cuts");

    static const char *mixed = "GET / HTTP/1.1\nA: b\r\nC:d\n\r\n";
    CHECK(parse(mixed) == (int)strlen(mixed) && !strcmp(R.path, "/"), "mixed line ends");
    CHECK(cuts(mixed, strlen(mixed)) == 0, "mixed cuts");

    PARSES_TO("GET / HTTP/1.1\r\n\r\n", 18);
    PARSES_TO("GET / HTTP/1.1\n\n", 16);
    PARSES_TO("GET /a HTTP/1.1\r\n\n", 18);

    /* The query string goes; the path stays byte for byte. */
    PARSES_TO("GET /metrics?name[]=x&y=%20 HTTP/1.1\r\n\r\n", 40);
    CHECK(!strcmp(R.path, "/metrics"), "query stripped: %s", R.path);
    PARSES_TO("GET /? HTTP/1.1\r\n\r\n", 19);
    CHECK(!strcmp(R.path, "/"), "empty query: %s", R.path);
    PARSES_TO("GET /a%2Fb/../c;x=1#f HTTP/1.1\r\n\r\n", 34);
    CHECK(!strcmp(R.path, "/a%2Fb/../c;x=1#f"), "raw path: %s", R.path);
    PARSES_TO("GET /a?b?c HTTP/1.1\r\n\r\n", 23);
    CHECK(!strcmp(R.path, "/a"), "first ? ends the path: %s", R.path);

    /* Header details that are fine. */
    PARSES_TO("GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 37);
    PARSES_TO("GET / HTTP/1.1\r\ncontent-length:\t 00 \t\r\n\r\n", 41);
    PARSES_TO("GET / HTTP/1.1\r\nX-Empty:\r\nX-Sp:   \r\n\r\n", 38);
    PARSES_TO("GET / HTTP/1.1\r\nX-Utf8: caf\xc3\xa9\r\nX-Tab: a\tb\r\n\r\n", 45);
    PARSES_TO("GET / HTTP/1.1\r\n!#$%&'*+-.^_`|~09az: x\r\n\r\n", 42);

    /* Bytes after the head (a pipelined request, a body we will not read) are not ours. */
    static const char *two = "GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n";
    CHECK(parse(two) == 19 && !strcmp(R.path, "/a"), "pipelined");
    PARSES_TO("GET / HTTP/1.1\r\n\r\n\x01\x02garbage", 18);

    /* A path of exactly HTTP_PATH_MAX bytes, with a long query after it. */
    char buf[HTTP_HEAD_MAX + 64];
    char path[HTTP_PATH_MAX + 1];
    memset(path, 'p', sizeof path);
    path[0] = '/';
    path[HTTP_PATH_MAX] = '\0';
    int len = snprintf(buf, sizeof buf, "GET %s?%0500d HTTP/1.1\r\n\r\n", path, 7);
    CHECK(parse(buf) == len && strlen(R.path) == HTTP_PATH_MAX && !strcmp(R.path, path), "path at limit");
}

/* ---------------------------------------------------------------- errors */

static void test_errors(void) {
    /* 405: a well-formed method we do not serve (methods are case-sensitive). */
    PARSES_TO("POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", -405);
    PARSES_TO("PUT / HTTP/1.1\r\n\r\n", -405);
    PARSES_TO("DELETE / HTTP/1.1\r\n\r\n", -405);
    PARSES_TO("OPTIONS / HTTP/1.1\r\n\r\n", -405);
    PARSES_TO("get / HTTP/1.1\r\n\r\n", -405);
    PARSES_TO("GETS / HTTP/1.1\r\n\r\n", -405);
    PARSES_TO("X-Custom! / HTTP/1.1\r\n\r\n", -405);

    /* 400: a malformed request line. */
    PARSES_TO("GE(T / HTTP/1.1\r\n\r\n", -400);
    PARSES_TO("G\"T / HTTP/1.1\r\n\r\n", -400);
    PARSES_TO(" GET / HTTP/1.1\r\n\r\n", -400);
    PARSES_TO("GET  / HTTP/1.1\r\n\r\n", -400);
    PARSES_TO("GET /  HTTP/1.1\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/1.1 \r\n\r\n", -400);
    PARSES_TO("GET\t/ HTTP/1.1\r\n\r\n", -400);
    PARSES_TO("GET /\r\n\r\n", -400);
    PARSES_TO("GET\r\n\r\n", -400);
    PARSES_TO("GET / \r\n\r\n", -400);
    PARSES_TO("\r\nGET / HTTP/1.1\r\n\r\n", -400);
    PARSES_TO("\n\n", -400);
    PARSES_TO("GET http://kiln/metrics HTTP/1.1\r\n\r\n", -400);
    PARSES_TO("GET * HTTP/1.1\r\n\r\n", -400);
    PARSES_TO("GET metrics HTTP/1.1\r\n\r\n", -400);
    PARSES_TO("GET ?a HTTP/1.1\r\n\r\n", -400);
    PARSES_TO("GET /a\x01 HTTP/1.1\r\n\r\n", -400);
    PARSES_TO("GET /a\x7f HTTP/1.1\r\n\r\n", -400);
    PARSES_TO("GET /caf\xc3\xa9 HTTP/1.1\r\n\r\n", -400);
    PARSES_TO("GET /a?\xff HTTP/1.1\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/1.1\r\r\n\r\n", -400);
    PARSES_TO("GET /\r HTTP/1.1\r\n\r\n", -400);
    CHECK(parse_n("GET /\0 HTTP/1.1\r\n\r\n", 19) == -400, "NUL in the path");
    PARSES_TO("GET / http/1.1\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/1.x\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/1.\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/.1\r\n\r\n", -400);
    PARSES_TO("GET / HTTPS/1.1\r\n\r\n", -400);
    PARSES_TO("GET / FOO\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/1.1.1\r\n\r\n", -400);

    /* 505: a version, but not one we speak. */
    PARSES_TO("GET / HTTP/2\r\n\r\n", -505);
    PARSES_TO("GET / HTTP/2.0\r\n\r\n", -505);
    PARSES_TO("GET / HTTP/3\r\n\r\n", -505);
    PARSES_TO("GET / HTTP/1.2\r\n\r\n", -505);
    PARSES_TO("GET / HTTP/0.9\r\n\r\n", -505);
    PARSES_TO("GET / HTTP/1.10\r\n\r\n", -505);
    PARSES_TO("POST / HTTP/2\r\n\r\n", -505); /* version before method */

    /* 414: the path (not the query) over HTTP_PATH_MAX. */
    char buf[HTTP_HEAD_MAX * 2];
    char path[HTTP_PATH_MAX + 2];
    memset(path, 'p', sizeof path);
    path[0] = '/';
    path[HTTP_PATH_MAX + 1] = '\0';
    snprintf(buf, sizeof buf, "GET %s HTTP/1.1\r\n\r\n", path);
    CHECK(parse(buf) == -414, "path of 257");
    snprintf(buf, sizeof buf, "GET %s?q=1 HTTP/1.1\r\n\r\n", path);
    CHECK(parse(buf) == -414, "path of 257 with a query");
    snprintf(buf, sizeof buf, "POST %s HTTP/1.1\r\n\r\n", path);
    CHECK(parse(buf) == -414, "414 before 405");
    snprintf(buf, sizeof buf, "GET %s\x01 HTTP/1.1\r\n\r\n", path);
    CHECK(parse(buf) == -400, "bad byte before length");

    /* 413: a body announced, or a head too long. */
    PARSES_TO("GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\n", -413);
    PARSES_TO("GET / HTTP/1.1\r\ncontent-LENGTH: 01\r\n\r\n", -413);
    PARSES_TO("GET / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", -413);
    PARSES_TO("GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", -413);
    PARSES_TO("GET / HTTP/1.1\r\ntransfer-encoding: identity\r\n\r\n", -413);
    PARSES_TO("GET / HTTP/1.1\r\nTransfer-Encoding:\r\n\r\n", -413);

    /* 400: a malformed header line. */
    PARSES_TO("GET / HTTP/1.1\r\nHost: a\r\n b\r\n\r\n", -400);   /* obs-fold */
    PARSES_TO("GET / HTTP/1.1\r\nHost: a\r\n\tb\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/1.1\r\n Host: a\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/1.1\r\nHost\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/1.1\r\n: x\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/1.1\r\nHost : x\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/1.1\r\nHo(st: x\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/1.1\r\nX: a\x01z\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/1.1\r\nX: a\x7fz\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/1.1\r\nX: a\rz\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/1.1\r\nX: a\r\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/1.1\r\n\r\r\n", -400);
    CHECK(parse_n("GET / HTTP/1.1\r\nX: a\0b\r\n\r\n", 26) == -400, "NUL in a header");
    PARSES_TO("GET / HTTP/1.1\r\nContent-Length:\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/1.1\r\nContent-Length: 0, 0\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/1.1\r\nContent-Length: +0\r\n\r\n", -400);
    PARSES_TO("GET / HTTP/1.1\r\nContent-Length: 0x0\r\n\r\n", -400);
    /* The first bad line decides. */
    PARSES_TO("GET / HTTP/1.1\r\nContent-Length: 5\r\nX\r\n\r\n", -413);
    PARSES_TO("GET / HTTP/1.1\r\nX\r\nContent-Length: 5\r\n\r\n", -400);

    /* Not HTTP at all, refused at once: a TLS ClientHello, a NUL. */
    CHECK(parse_n("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11) == -400, "TLS hello");
    CHECK(parse_n("\x16", 1) == -400, "one TLS byte");
    CHECK(parse_n("", 1) == -400, "one NUL");
    CHECK(parse_n("GET / HTTP/1.1\r\nX: \x01", 20) == -400, "bad byte in a partial header");
    CHECK(parse_n("GET / HTTP/1.1\r\n ", 17) == -400, "partial fold");
    CHECK(parse_n("GET / HTTP/1.1\r\nX: a\rb", 22) == -400, "bare CR in a partial header");

    /* NULL arguments. */
    CHECK(http_parse(NULL, 0, &R) == 0, "NULL, 0");
    CHECK(http_parse(NULL, 5, &R) == -400, "NULL, 5");
    CHECK(http_parse("GET / HTTP/1.1\r\n\r\n", 18, NULL) == -400, "NULL req");
}

/* ---------------------------------------------------------------- limits and cuts */

static void test_limits(void) {
    static char buf[HTTP_HEAD_MAX * 2];
    /* A head of exactly HTTP_HEAD_MAX bytes, then one byte more. */
    const char *line = "GET / HTTP/1.1\r\n";
    size_t ll = strlen(line);
    size_t fill = HTTP_HEAD_MAX - ll - 2 - 5; /* "X: " + value + "\r\n" and the final "\r\n" */
    memcpy(buf, line, ll);
    memcpy(buf + ll, "X: ", 3);
    memset(buf + ll + 3, 'v', fill);
    memcpy(buf + ll + 3 + fill, "\r\n\r\n", 4);
    size_t n = ll + 3 + fill + 4;
    CHECK(n == HTTP_HEAD_MAX, "setup %zu", n);
    CHECK(parse_n(buf, n) == HTTP_HEAD_MAX, "head of HTTP_HEAD_MAX: %d", parse_n(buf, n));
    CHECK(parse_n(buf, n - 1) == 0, "one short");
    CHECK(cuts(buf, n) == 0, "cuts of the largest head");
    memmove(buf + ll + 1, buf + ll, n - ll);
    buf[ll] = 'Y';
    CHECK(parse_n(buf, n + 1) == -413, "head of HTTP_HEAD_MAX + 1");
    CHECK(parse_n(buf, n) == -413, "no blank line in HTTP_HEAD_MAX bytes");
    CHECK(parse_n(buf, n - 1) == 0, "not yet");

    /* A request line that never ends. */
    memcpy(buf, "GET /", 5);
    memset(buf + 5, 'a', sizeof buf - 5);
    CHECK(parse_n(buf, HTTP_HEAD_MAX - 1) == 0, "long line, below the limit");
    CHECK(parse_n(buf, HTTP_HEAD_MAX) == -413, "long line at the limit");
    CHECK(parse_n(buf, sizeof buf) == -413, "long line past the limit");
    /* ... and a complete one over the limit: 413, the line is never judged. */
    memcpy(buf + HTTP_HEAD_MAX + 100, " HTTP/1.1\r\n\r\n", 13);
    CHECK(parse_n(buf, HTTP_HEAD_MAX + 113) == -413, "complete but too long");

    /* Many small headers up to the limit. */
    size_t p = (size_t)snprintf(buf, sizeof buf, "GET / HTTP/1.1\r\n");
    while (p + 6 + 2 <= HTTP_HEAD_MAX) p += (size_t)snprintf(buf + p, sizeof buf - p, "A: b\r\n");
    memcpy(buf + p, "\r\n", 2);
    CHECK(parse_n(buf, p + 2) == (int)p + 2, "many headers that fit: %d", parse_n(buf, p + 2));
    p += (size_t)snprintf(buf + p, sizeof buf - p, "A: b\r\n\r\n") - 2;
    CHECK(p + 2 > HTTP_HEAD_MAX && parse_n(buf, p + 2) == -413, "many headers: %d", parse_n(buf, p + 2));
    CHECK(parse_n(buf, HTTP_HEAD_MAX - 1) == 0, "many headers, partial");

    /* Every cut of every kind of answer: 0 until the answer is known, then that answer. */
    static const char *const heads[] = {
        "GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n",
        "HEAD /healthz?x HTTP/1.0\n\n",
        "POST / HTTP/1.1\r\n\r\n",
        "GET / HTTP/2.0\r\n\r\n",
        "GET / HTTP/1.1\r\nContent-Length: 10\r\n\r\n",
        "GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        "GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n",
        "GET / HTTP/1.1\r\nA: b\rc\r\n\r\n",
        "GET / HTTP/1.1\r\r\n\r\n",
        "GET /\x01 HTTP/1.1\r\n\r\n",
        "GE(T / HTTP/1.1\r\n\r\n",
        "\x16\x03\x01\x00\x10",
        "GET / HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof heads / sizeof *heads; i++)
        CHECK(cuts(heads[i], strlen(heads[i])) == 0, "cuts of head %zu", i);
}

/* ---------------------------------------------------------------- responses */

static void test_head(void) {
    char out[512];
    const char *want200 = "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                          "Content-Length: 1234\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n";
    int n = http_head(out, sizeof out, 200, "text/plain; version=0.0.4; charset=utf-8", 1234);
    CHECK(n == (int)strlen(want200) && !strcmp(out, want200), "200: %d\n%s", n, out);
    const char *want404 = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n"
                          "Cache-Control: no-store\r\n\r\n";
    n = http_head(out, sizeof out, 404, NULL, 0);
    CHECK(n == (int)strlen(want404) && !strcmp(out, want404), "404:\n%s", out);
    const char *want405 = "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n"
                          "Cache-Control: no-store\r\nAllow: GET, HEAD\r\n\r\n";
    n = http_head(out, sizeof out, 405, NULL, 0);
    CHECK(n == (int)strlen(want405) && !strcmp(out, want405), "405:\n%s", out);
    const char *want204 = "HTTP/1.1 204 No Content\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n";
    n = http_head(out, sizeof out, 204, NULL, 0);
    CHECK(n == (int)strlen(want204) && !strcmp(out, want204), "204:\n%s", out);
    n = http_head(out, sizeof out, 599, NULL, (size_t)-1);
    CHECK(n > 0 && strstr(out, "HTTP/1.1 599 Unknown\r\n") && strstr(out, "Content-Length: 18446744073709551615\r\n"),
          "599:\n%s", out);

    CHECK(http_head(out, sizeof out, 99, NULL, 0) == -EINVAL, "status 99");
    CHECK(http_head(out, sizeof out, 1000, NULL, 0) == -EINVAL, "status 1000");
    CHECK(http_head(out, sizeof out, -404, NULL, 0) == -EINVAL, "status -404");
    CHECK(http_head(out, sizeof out, 200, "text/plain\r\nSet-Cookie: x", 0) == -EINVAL, "CRLF in type");
    CHECK(http_head(out, sizeof out, 200, "a\nb", 0) == -EINVAL, "LF in type");
    CHECK(http_head(out, sizeof out, 200, "", 0) == -EINVAL, "empty type");
    CHECK(http_head(NULL, 10, 200, NULL, 0) == -EINVAL, "NULL out");
    CHECK(http_head(NULL, 0, 200, NULL, 0) == -ENOSPC, "NULL out, cap 0");

    /* Every short capacity: -ENOSPC and a NUL-terminated prefix, never a byte past cap. */
    int len = (int)strlen(want200), bad = 0;
    for (int cap = 0; cap <= len + 1; cap++) {
        char *b = cap ? malloc((size_t)cap) : NULL;
        int rc = http_head(b, (size_t)cap, 200, "text/plain; version=0.0.4; charset=utf-8", 1234);
        if (cap <= len) {
            if (rc != -ENOSPC || (cap && (b[cap - 1] != '\0' || memcmp(b, want200, (size_t)cap - 1)))) bad++;
        } else if (rc != len || strcmp(b, want200)) {
            bad++;
        }
        free(b);
    }
    CHECK(bad == 0, "%d capacities wrong", bad);

    /* A response head fed back to the parser is refused, not taken for a request. */
    CHECK(parse(want200) == -400, "response is not a request");
}

static void test_reason(void) {
    static const struct {
        int s;
        const char *r;
    } t[] = {
        {200, "OK"}, {204, "No Content"}, {400, "Bad Request"}, {404, "Not Found"},
        {405, "Method Not Allowed"}, {408, "Request Timeout"}, {413, "Content Too Large"},
        {414, "URI Too Long"}, {429, "Too Many Requests"}, {500, "Internal Server Error"},
        {503, "Service Unavailable"}, {505, "HTTP Version Not Supported"},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        CHECK(!strcmp(http_reason(t[i].s), t[i].r), "%d: %s", t[i].s, http_reason(t[i].s));
    CHECK(!strcmp(http_reason(0), "Unknown") && !strcmp(http_reason(-404), "Unknown") &&
              !strcmp(http_reason(302), "Unknown"),
          "unknown");
    /* Every status http_parse can return has a reason. */
    int errs[] = {400, 405, 413, 414, 505};
    for (size_t i = 0; i < sizeof errs / sizeof *errs; i++)
        CHECK(strcmp(http_reason(errs[i]), "Unknown"), "reason for %d", errs[i]);
}

/* ---------------------------------------------------------------- http_parse_msg */

static http_msg M;

static int msg_n(const char *s, size_t n, size_t max_head) {
    char *b = malloc(n ? n : 1);
    memcpy(b, s, n);
    memset(&M, 0x5a, sizeof M);
    int rc = http_parse_msg(b, n, max_head, &M);
    free(b);
    return rc;
}

static int msg(const char *s) { return msg_n(s, strlen(s), 16384); }

/* As cuts(), for http_parse_msg. */
static int msg_cuts(const char *s, size_t max_head) {
    size_t n = strlen(s);
    int whole = msg_n(s, n, max_head), bad = 0;
    for (size_t k = 0; k < n; k++) {
        int rc = msg_n(s, k, max_head);
        if (rc != 0 && rc != whole) bad++;
        if (whole > 0 && k < (size_t)whole && rc != 0) bad++;
    }
    return bad;
}

static void test_msg(void) {
    static const char *post = "POST /v1/chat/completions HTTP/1.1\r\nHost: kiln\r\nAuthorization:  Bearer abc.def \r\n"
                              "Content-Type: application/json\r\nContent-Length: 42\r\nExpect: 100-continue\r\n"
                              "Connection: Keep-Alive, TE\r\n\r\n{\"body\"";
    int hl = msg(post);
    CHECK(hl > 0 && (size_t)hl == strlen(post) - 7, "post: %d", hl);
    CHECK(!strcmp(M.method, "POST") && !strcmp(M.path, "/v1/chat/completions") && M.minor == 1, "post fields %s %s",
          M.method, M.path);
    CHECK(M.content_length == 42 && M.expect_continue && M.conn_keep_alive && !M.conn_close, "post headers");
    CHECK(M.auth_set && !M.auth_too_long && !strcmp(M.auth, "Bearer abc.def"), "auth \"%s\"", M.auth);
    CHECK(msg_cuts(post, 16384) == 0, "post cuts");
    CHECK(msg("GET /v1/models?x=1 HTTP/1.0\nConnection: close\n\n") > 0 && M.content_length == -1 && M.conn_close &&
              M.minor == 0 && !strcmp(M.path, "/v1/models") && !M.auth_set,
          "get 1.0 close");
    CHECK(msg("DELETE /x HTTP/1.1\r\n\r\n") > 0 && !strcmp(M.method, "DELETE"), "any method token");
    CHECK(msg("POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n") == -400, "two lengths");
    CHECK(msg("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n") == -400, "negative length");
    CHECK(msg("POST / HTTP/1.1\r\nContent-Length: 1099511627776\r\n\r\n") > 0 && M.content_length == 1LL << 40,
          "2^40 is the limit itself");
    CHECK(msg("POST / HTTP/1.1\r\nContent-Length: 1099511627777\r\n\r\n") == -413, "past 2^40");
    CHECK(msg("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n") == -413, "huge length");
    CHECK(msg("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n") == -501, "chunked body");
    CHECK(msg("POST / HTTP/1.1\r\nExpect: 200-ok\r\n\r\n") == -417, "other expectation");
    CHECK(msg("POST / HTTP/1.1\r\nAuthorization: a\r\nAuthorization: b\r\n\r\n") == -400, "two auths");
    CHECK(msg("GET / HTTP/2\r\n\r\n") == -505, "version");
    CHECK(msg("GET  / HTTP/1.1\r\n\r\n") == -400 && msg("GET /\x01 HTTP/1.1\r\n\r\n") == -400, "bad lines");
    CHECK(msg("ABCDEFGHIJKLMNOPQ / HTTP/1.1\r\n\r\n") == -501, "method over HTTP_METHOD_MAX");
    CHECK(msg("ABCDEFGHIJKLMNOP / HTTP/1.1\r\n\r\n") > 0, "method at HTTP_METHOD_MAX");
    /* the Authorization value at and past its limit */
    char big[HTTP_AUTH_MAX + 64];
    for (int extra = 0; extra <= 1; extra++) {
        int k = snprintf(big, sizeof big, "GET / HTTP/1.1\r\nAuthorization: ");
        memset(big + k, 'a', HTTP_AUTH_MAX + (size_t)extra);
        snprintf(big + k + HTTP_AUTH_MAX + extra, sizeof big - (size_t)k - HTTP_AUTH_MAX - (size_t)extra, "\r\n\r\n");
        CHECK(msg(big) > 0 && M.auth_set && M.auth_too_long == extra, "auth of %d bytes", HTTP_AUTH_MAX + extra);
    }
    /* max_head: a head of exactly max_head bytes parses, one byte more is -431 */
    static const char *h = "GET / HTTP/1.1\r\nX: yyyy\r\n\r\n";
    size_t n = strlen(h);
    CHECK(msg_n(h, n, n + 1) == (int)n, "head under max_head");
    CHECK(msg_n(h, n, n) == (int)n, "head of exactly max_head");
    CHECK(msg_n(h, n, n - 1) == -431, "head one byte over max_head: -431");
    CHECK(msg_n(h, n - 1, n) == 0, "a prefix under max_head: 0");
    CHECK(msg_cuts(h, n) == 0 && msg_cuts(h, n - 1) == 0, "cuts at max_head");
}

int main(void) {
    test_msg();
    test_good();
    test_errors();
    test_limits();
    test_head();
    test_reason();
    return check_done("test_http");
}
