/* fuzz_http: libFuzzer target for net/http. Each input goes to http_parse from a heap
 * copy of exactly its size (so ASan catches a read past len), then again cut at a few
 * points. Invariants that abort on failure:
 *   - the answer is a head length in 1..min(len, HTTP_HEAD_MAX) ending in LF, 0 (only
 *     below HTTP_HEAD_MAX), or one of -400 -405 -413 -414 -505;
 *   - on success the request is sane: GET or HEAD, HTTP/1.0 or 1.1, a NUL-terminated
 *     path of 1..HTTP_PATH_MAX visible ASCII bytes starting with '/' and holding no '?',
 *     and the head alone (no bytes after it) parses to the same;
 *   - every cut parses to 0 or to the whole input's answer, and to 0 before a complete
 *     head ends: the answer does not depend on how the bytes arrive.
 * The input also drives http_head (status, body length, capacity and content type from
 * its bytes): an exact-size output, NUL-terminated, and no header injection. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/http.h"

static void fail(const char *what, int rc) {
    fprintf(stderr, "fuzz_http: %s (rc %d)\n", what, rc);
    abort();
}

/* http_parse over an exact-size heap copy of data[0..n). */
static int parse(const uint8_t *data, size_t n, http_req *r) {
    char *b = malloc(n ? n : 1);
    if (!b) abort();
    memcpy(b, data, n);
    int rc = http_parse(b, n, r);
    if (rc > 0 && b[rc - 1] != '\n') fail("head does not end in LF", rc);
    free(b);
    return rc;
}

static void check_req(const http_req *r, int rc) {
    if (r->method != HTTP_GET && r->method != HTTP_HEAD) fail("method", rc);
    if (r->minor != 0 && r->minor != 1) fail("minor", rc);
    const char *nul = memchr(r->path, '\0', sizeof r->path);
    if (!nul) fail("path not NUL-terminated", rc);
    size_t pl = (size_t)(nul - r->path);
    if (pl < 1 || pl > HTTP_PATH_MAX || r->path[0] != '/') fail("path length or start", rc);
    for (size_t i = 0; i < pl; i++) {
        unsigned char c = (unsigned char)r->path[i];
        if (c <= 0x20 || c >= 0x7f || c == '?') fail("path byte", rc);
    }
}

static void check_cut(const uint8_t *data, size_t cut, int whole) {
    http_req r;
    int rc = parse(data, cut, &r);
    if (rc != 0 && rc != whole) fail("a cut answers differently", rc);
    if (whole > 0 && cut < (size_t)whole && rc != 0) fail("a cut before the head's end", rc);
}

static void fuzz_head(const uint8_t *data, size_t size) {
    if (size < 4) return;
    static const int statuses[] = {200, 204, 400, 404, 405, 408, 413, 414, 429, 500, 503, 505, 100, 999, 0, 1000};
    int status = statuses[data[0] % 16];
    size_t body = (size_t)data[1] << (data[2] % 57);
    size_t cap = data[3];
    char ct[41];
    size_t cl = size - 4 < sizeof ct - 1 ? size - 4 : sizeof ct - 1;
    memcpy(ct, data + 4, cl);
    ct[cl] = '\0';
    const char *type = (data[0] & 0x80) ? NULL : ct;
    char *out = cap ? malloc(cap) : NULL;
    /* Refused exactly when the status is not three digits or the type is empty or
     * holds a control byte (a CR or LF there would inject headers). */
    int bad = status < 100 || status > 999 || (type && !*type);
    for (const char *p = type ? type : ""; *p; p++) bad |= ((unsigned char)*p < 0x20 && *p != '\t') || *p == 0x7f;
    int rc = http_head(out, cap, status, type, body);
    if ((rc == -EINVAL) != bad) fail("http_head: wrong refusal", rc);
    if (rc == -ENOSPC) {
        if (cap && out[cap - 1] != '\0') fail("http_head: truncated output not NUL-terminated", rc);
    } else if (rc != -EINVAL) {
        if (rc < 0 || (size_t)rc >= cap || out[rc] != '\0' || strlen(out) != (size_t)rc) fail("http_head length", rc);
        const char *end = strstr(out, "\r\n\r\n");
        if (!end || end + 4 != out + rc) fail("http_head: blank line not at the end", rc);
        for (const char *p = out; p < out + rc; p++)
            if ((*p == '\n' && (p == out || p[-1] != '\r')) || (*p == '\r' && p[1] != '\n')) fail("http_head: bare CR or LF", rc);
    }
    free(out);
}

static void check_input(const uint8_t *data, size_t size) {
    http_req r;
    memset(&r, 0, sizeof r);
    int rc = parse(data, size, &r);
    size_t most = size < HTTP_HEAD_MAX ? size : HTTP_HEAD_MAX;
    if (rc > 0) {
        if ((size_t)rc > most) fail("head longer than the input or the limit", rc);
        check_req(&r, rc);
        http_req r2;
        memset(&r2, 0, sizeof r2);
        if (parse(data, (size_t)rc, &r2) != rc) fail("the head alone parses differently", rc);
        if (r2.method != r.method || r2.minor != r.minor || strcmp(r2.path, r.path)) fail("the head alone differs", rc);
    } else if (rc == 0) {
        if (size >= HTTP_HEAD_MAX) fail("0 at or past HTTP_HEAD_MAX", rc);
    } else if (rc != -400 && rc != -405 && rc != -413 && rc != -414 && rc != -505) {
        fail("unexpected answer", rc);
    }
    /* A bounded set of cuts: the edges, the middle, around the head's end and the
     * size limit, and two picked by the input's own bytes. */
    if (size) {
        size_t cuts[10] = {0, 1, size / 2, size - 1, HTTP_HEAD_MAX - 1, HTTP_HEAD_MAX};
        int nc = 6;
        if (rc > 0) cuts[nc++] = (size_t)rc - 1;
        cuts[nc++] = (data[0] * 131u + data[size - 1]) % size;
        cuts[nc++] = (data[size / 2] * 257u + size) % size;
        for (int i = 0; i < nc; i++)
            if (cuts[i] < size) check_cut(data, cuts[i], rc);
    }
}

/* libFuzzer keeps inputs to 4096 bytes unless told otherwise (and `make fuzz` does not
 * tell it), which never reaches HTTP_HEAD_MAX. So an input starting with 0xff is a
 * recipe: bytes 1 and 2 pick a segment of the rest, byte 3 a total length near
 * HTTP_HEAD_MAX, and the segment is repeated to reach it ("GET / HTTP/1.1\r\nX: a\r\n\r\n"
 * with its 'a' repeated makes a head just under, at or over the limit). */
static uint8_t g_big[HTTP_HEAD_MAX + 512];

static size_t expand(const uint8_t *data, size_t size) {
    const uint8_t *body = data + 4;
    size_t m = size - 4;
    size_t a = data[1] % (m + 1);
    if (a == m) return 0;
    size_t b = a + 1 + data[2] % (m - a);
    size_t seg = b - a, rest = m - seg;
    size_t want = HTTP_HEAD_MAX - 128 + data[3];
    size_t k = want > rest ? (want - rest + seg - 1) / seg : 1;
    if (rest + k * seg > sizeof g_big) k = (sizeof g_big - rest) / seg;
    size_t n = 0;
    memcpy(g_big, body, a);
    n += a;
    for (size_t i = 0; i < k; i++, n += seg) memcpy(g_big + n, body + a, seg);
    memcpy(g_big + n, body + b, m - b);
    return n + (m - b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check_input(data, size);
    if (size > 4 && data[0] == 0xff) {
        size_t n = expand(data, size);
        if (n) check_input(g_big, n);
    }
    fuzz_head(data, size);
    return 0;
}
