/* fuzz_api: libFuzzer target for the OpenAI API's request parsing: net/http's
 * http_parse_msg (the head) and net/api's api_parse (the JSON body), as the server runs
 * them on one input: the head, then the bytes after it as the body, against both
 * endpoints. Every input is parsed from a heap copy of exactly its size (ASan catches a
 * read past it); the parser's memory is made once, so any allocation inside a parse is
 * yyjson's pool (bounded by its size). Invariants that abort on failure:
 *   - http_parse_msg answers a head length in 1..min(len, max_head), 0 (only below
 *     max_head), or one of -400 -413 -414 -417 -431 -501 -505; on success the method and
 *     path are NUL-terminated and a Content-Length is in 0..HTTP_BODY_LIMIT; a few cuts
 *     parse to 0 or to the whole input's answer;
 *   - api_parse answers 0, 400 or 413; on 0 the request is within GEN's limits (n 1..8,
 *     at most PROTO_MAX_STOPS stops of 1..64 bytes, 1..API_MAX_MESSAGES messages whose
 *     roles are system/user/assistant for chat, a prompt for completions), and every string
 *     is NUL-terminated within the parser's memory; the error's param is NUL-terminated;
 *   - api_json_escape of the input stays within API_JSON_ESCAPED_MAX and writes no raw
 *     control byte or lone quote. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/api.h"
#include "net/http.h"

#define FUZZ_MAX_BODY 65536

static void fail(const char *what, int rc) {
    fprintf(stderr, "fuzz_api: %s (rc %d)\n", what, rc);
    abort();
}

static int head(const uint8_t *data, size_t n, size_t max_head, http_msg *m) {
    char *b = malloc(n ? n : 1);
    if (!b) abort();
    memcpy(b, data, n);
    int rc = http_parse_msg(b, n, max_head, m);
    if (rc > 0 && b[rc - 1] != '\n') fail("head does not end in LF", rc);
    free(b);
    return rc;
}

static void check_head(const uint8_t *data, size_t size, size_t max_head, int *hl) {
    http_msg m;
    int rc = head(data, size, max_head, &m);
    *hl = rc;
    if (rc > 0) {
        if ((size_t)rc > size || (size_t)rc > max_head) fail("head past the input or the limit", rc);
        if (!memchr(m.method, 0, sizeof m.method) || !memchr(m.path, 0, sizeof m.path) || m.path[0] != '/')
            fail("method or path", rc);
        if (m.content_length < -1 || m.content_length > HTTP_BODY_LIMIT) fail("content length", rc);
        if (m.auth_set && !m.auth_too_long && !memchr(m.auth, 0, sizeof m.auth)) fail("auth", rc);
    } else if (rc == 0) {
        if (size >= max_head) fail("0 at or past max_head", rc);
    } else if (rc != -400 && rc != -413 && rc != -414 && rc != -417 && rc != -431 && rc != -501 && rc != -505) {
        fail("unexpected head answer", rc);
    }
    size_t cuts[4] = {size / 2, size ? size - 1 : 0, rc > 0 ? (size_t)rc - 1 : 0, size / 3};
    for (int i = 0; i < 4; i++) {
        if (cuts[i] >= size) continue;
        int c = head(data, cuts[i], max_head, &m);
        if (c != 0 && c != rc) fail("a cut answers differently", c);
        if (rc > 0 && cuts[i] < (size_t)rc && c != 0) fail("a cut before the head's end", c);
    }
}

static void check_req(const api_parser *p, const api_req *r, int kind) {
    if (r->kind != kind || r->g.n < 1 || r->g.n > 8) fail("kind or n", 0);
    if (r->g.n_stops < 0 || r->g.n_stops > PROTO_MAX_STOPS) fail("stops", 0);
    for (int i = 0; i < r->g.n_stops; i++) {
        size_t l = strlen(r->g.stops[i]);
        if (l < 1 || l > 64) fail("stop length", 0);
    }
    if (!r->model || strlen(r->model) > p->max_body) fail("model", 0); /* ASan: within memory */
    if (kind == API_CHAT) {
        if (r->n_msgs < 1 || r->n_msgs > API_MAX_MESSAGES || !r->g.chat) fail("messages", r->n_msgs);
        for (int i = 0; i < r->n_msgs; i++) {
            const char *role = r->msgs[i].role;
            if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")) fail("role", i);
            if (strlen(r->msgs[i].content) > p->max_body) fail("content length", i);
        }
    } else {
        if (!r->g.prompt || strlen(r->g.prompt) != r->g.prompt_len || r->n_msgs) fail("prompt", 0);
    }
}

static void check_body(api_parser *p, const uint8_t *data, size_t n) {
    static api_req r;
    char *b = malloc(n ? n : 1);
    if (!b) abort();
    memcpy(b, data, n);
    for (int kind = API_CHAT; kind <= API_COMPLETIONS; kind++) {
        api_err e;
        int rc = api_parse(p, kind, b, n, &r, &e);
        if (rc == 0) check_req(p, &r, kind);
        else if (rc != 400 && rc != 413) fail("unexpected body answer", rc);
        else if (!memchr(e.param, 0, sizeof e.param) || !memchr(e.msg, 0, sizeof e.msg)) fail("error strings", rc);
        if (rc == 413 && n <= p->max_body) fail("413 for a body within the limit", rc);
    }
    free(b);
}

static void check_escape(const uint8_t *data, size_t n) {
    if (n > 4096) n = 4096;
    size_t cap = API_JSON_ESCAPED_MAX(n);
    char *out = malloc(cap ? cap : 1);
    if (!out) abort();
    long k = api_json_escape(out, cap, (const char *)data, n);
    if (k < 0 || (size_t)k > cap) fail("escape length", (int)k);
    for (long i = 0; i < k; i++) {
        unsigned char c = (unsigned char)out[i];
        if (c < 0x20 || c == 0x7f) fail("raw control byte in escaped output", (int)i);
        if (c == '"' && (i == 0 || out[i - 1] != '\\')) fail("lone quote in escaped output", (int)i);
    }
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static api_parser p;
    static int ready;
    if (!ready) {
        if (api_parser_init(&p, FUZZ_MAX_BODY) < 0) abort();
        ready = 1;
    }
    if (size < 1) return 0;
    /* byte 0 picks the head limit: small ones reach -431 within libFuzzer's input sizes */
    size_t max_head = (size_t)1024 << (data[0] % 5);
    const uint8_t *in = data + 1;
    size_t n = size - 1;
    int hl;
    check_head(in, n, max_head, &hl);
    /* the body: after a complete head, else the whole input (most inputs are JSON) */
    if (hl > 0) check_body(&p, in + hl, n - (size_t)hl);
    else check_body(&p, in, n);
    check_escape(in, n);
    return 0;
}
