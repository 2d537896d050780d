/* fuzz_proto: libFuzzer target for net/proto. Each input is one line, in a heap buffer
 * of exactly its size (so ASan catches any read or write past len), split in place.
 * Invariants that abort on failure:
 *   - a rejected line gives a one-line printable message and leaves no words behind;
 *   - every word, key and value of an accepted line lies inside the buffer, is
 *     NUL-terminated there and has no NUL before its length (len == strlen);
 *   - keys are [a-z][a-z0-9_]*, verbs are A-Z, counts are within the limits;
 *   - proto_hello_parse, proto_gen_parse and proto_update_parse either fail with a
 *     message or give values within the documented ranges (a GEN conversation: no
 *     prompt, chat=1, system only first, a user message last, at most PROTO_MAX_MSGS);
 *   - every string that is valid UTF-8 goes through proto_quote and splits back from
 *     `X <quoted>` to the same bytes. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/proto.h"

static void fail(const char *what, const char *detail) {
    fprintf(stderr, "fuzz_proto: %s: %s\n", what, detail);
    abort();
}

static int printable_line(const char *m) {
    for (; *m; m++)
        if (*m < 0x20 || *m > 0x7e) return 0;
    return 1;
}

static void check_msg(const char *err, size_t cap, const char *what) {
    if (!memchr(err, '\0', cap)) fail(what, "message not terminated");
    if (!err[0] || !printable_line(err)) fail(what, "message empty or not printable");
}

static void check_str(const proto_str *s, const char *buf, size_t size, const char *what) {
    if (s->s < buf || s->len >= size || s->s + s->len >= buf + size) fail(what, "outside the buffer");
    if (strlen(s->s) != s->len) fail(what, "len != strlen");
}

/* Strict UTF-8 as the protocol defines it (a separate, plain decoder on purpose). */
static int utf8_ok(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = p[i], cp, k;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xc2 && c <= 0xdf) k = 1, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef) k = 2, cp = c & 0x0f;
        else if (c >= 0xf0 && c <= 0xf4) k = 3, cp = c & 0x07;
        else return 0;
        if (n - i <= k) return 0;
        for (unsigned j = 1; j <= k; j++) {
            if ((p[i + j] & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (p[i + j] & 0x3f);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) || cp > 0x10ffff ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += k + 1;
    }
    return 1;
}

/* Quoted strings must be valid UTF-8 (the splitter's own rule, checked independently). */
static void check_utf8(const proto_str *s) {
    if (s->quoted && !utf8_ok((const unsigned char *)s->s, s->len)) fail("quoted string", "invalid UTF-8 accepted");
}

static void round_trip(const proto_str *s) {
    if (!utf8_ok((const unsigned char *)s->s, s->len)) return;
    size_t cap = PROTO_QUOTED_MAX(s->len) + 2;
    char *line = malloc(cap);
    if (!line) return;
    line[0] = 'X', line[1] = ' ';
    int q = proto_quote(line + 2, cap - 2, s->s, s->len);
    if (q < 0) fail("quote", "no room in PROTO_QUOTED_MAX");
    if ((size_t)q != strlen(line + 2)) fail("quote", "length differs from the string");
    /* Split an exact-size copy, so the NUL proto_quote wrote is not there to lean on. */
    char *exact = malloc((size_t)q + 2);
    if (!exact) {
        free(line);
        return;
    }
    memcpy(exact, line, (size_t)q + 2);
    proto_line l;
    char err[256];
    if (proto_split(exact, (size_t)q + 2, &l, err, sizeof err) != 0) fail("quoted does not split", err);
    if (l.n_pos != 1 || l.n_kv != 0 || !l.pos[0].quoted) fail("quoted splits into", line);
    if (l.pos[0].len != s->len || memcmp(l.pos[0].s, s->s, s->len)) fail("round trip differs", line);
    free(exact);
    free(line);
}

static void check_gen(const proto_gen *g) {
    if (!proto_id_ok(g->id, strlen(g->id))) fail("gen", "bad id accepted");
    if (g->n_msgs < 0 || g->n_msgs > PROTO_MAX_MSGS) fail("gen", "n_msgs");
    if (g->n_msgs) {
        /* the conversation form: no prompt, chat=1, system only first, a user message last */
        if (g->prompt || g->system || !g->chat) fail("gen", "conversation with prompt, system or chat=0");
        for (int i = 0; i < g->n_msgs; i++) {
            const proto_msg *m = &g->msgs[i];
            if (!m->role || !m->content || strlen(m->content) != m->len) fail("gen", "message");
            if (strcmp(m->role, "user") && strcmp(m->role, "assistant") && (i || strcmp(m->role, "system")))
                fail("gen", "message role");
        }
        if (strcmp(g->msgs[g->n_msgs - 1].role, "user")) fail("gen", "last message not user");
        return;
    }
    if (!g->prompt || strlen(g->prompt) != g->prompt_len) fail("gen", "prompt");
    if (g->system && strlen(g->system) != g->system_len) fail("gen", "system");
    if ((unsigned)g->chat > 1 || (unsigned)g->logprobs > 1 || (unsigned)g->ignore_eos > 1) fail("gen", "bool");
    if (g->n < 1 || g->n > 8) fail("gen", "n");
    if (g->max_tokens < -1 || g->max_tokens > 1000000) fail("gen", "max_tokens");
    if (g->top_k < 0 || g->top_k > 1000000 || g->repeat_last_n < 0 || g->repeat_last_n > 1000000) fail("gen", "int");
    if (!(g->temperature >= 0 && g->temperature <= 100)) fail("gen", "temperature");
    if (!(g->top_p > 0 && g->top_p <= 1) || !(g->min_p >= 0 && g->min_p <= 1)) fail("gen", "p");
    if (!(g->repeat_penalty > 0 && g->repeat_penalty <= 10)) fail("gen", "repeat_penalty");
    if (!(fabsf(g->presence_penalty) <= 2 && fabsf(g->frequency_penalty) <= 2)) fail("gen", "penalties");
    if (g->n_stops < 0 || g->n_stops > PROTO_MAX_STOPS) fail("gen", "n_stops");
    for (int i = 0; i < g->n_stops; i++) {
        size_t n = strlen(g->stops[i]);
        if (n < 1 || n > 64) fail("gen", "stop length");
    }
    if (g->prompt_len == 0 && !(g->chat && g->system_len)) fail("gen", "empty prompt accepted");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    proto_line l;
    char *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    memset(err, 'x', sizeof err);
    int r = proto_split(buf, size, &l, err, sizeof err);
    if (r < 0) {
        if (r != -EINVAL) fail("split", "error other than -EINVAL");
        check_msg(err, sizeof err, "split error");
        if (l.n_pos || l.n_kv || l.verb[0]) fail("split", "words left after an error");
        free(buf);
        return 0;
    }
    size_t nv = strlen(l.verb);
    if (nv < 1 || nv > PROTO_VERB_MAX || strspn(l.verb, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != nv) fail("verb", l.verb);
    if (l.n_pos < 0 || l.n_pos > PROTO_MAX_POS || l.n_kv < 0 || l.n_kv > PROTO_MAX_KV) fail("split", "counts");
    for (int i = 0; i < l.n_pos; i++) {
        check_str(&l.pos[i], buf, size, "positional");
        if (!l.pos[i].quoted && l.pos[i].len == 0) fail("positional", "empty bare word");
        check_utf8(&l.pos[i]);
    }
    for (int i = 0; i < l.n_kv; i++) {
        const proto_str *k = &l.kv[i].key;
        check_str(k, buf, size, "key");
        check_str(&l.kv[i].val, buf, size, "value");
        if (k->len < 1 || k->len > PROTO_KEY_MAX || k->s[0] < 'a' || k->s[0] > 'z' ||
            strspn(k->s, "abcdefghijklmnopqrstuvwxyz0123456789_") != k->len)
            fail("key", "bad key accepted");
        if (!l.kv[i].val.quoted && l.kv[i].val.len == 0) fail("value", "empty bare value");
        check_utf8(&l.kv[i].val);
        if (proto_get(&l, k->s) == NULL) fail("get", k->s);
    }

    proto_hello h;
    if (proto_hello_parse(&l, &h, err, sizeof err) == 0) {
        if (h.version != 1 || strcmp(l.verb, "HELLO")) fail("hello", "accepted");
    } else {
        check_msg(err, sizeof err, "hello error");
    }
    proto_gen g;
    if (proto_gen_parse(&l, &g, err, sizeof err) == 0) check_gen(&g);
    else check_msg(err, sizeof err, "gen error");

    proto_update u;
    if (proto_update_parse(&l, &u, err, sizeof err) == 0) {
        if (strcmp(l.verb, "UPDATE") || u.size < 1 || u.size > (1ull << 40) || u.tries < 1 || u.tries > 9 || l.n_pos)
            fail("update", "out of range accepted");
    } else {
        check_msg(err, sizeof err, "update error");
    }

    for (int i = 0; i < l.n_pos; i++) round_trip(&l.pos[i]);
    for (int i = 0; i < l.n_kv; i++) round_trip(&l.kv[i].val);
    free(buf);
    return 0;
}
