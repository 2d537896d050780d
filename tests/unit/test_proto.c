/* test_proto: net/proto. Splitting (words, pairs, quoting, every escape, UTF-8 rules,
 * control bytes, limits, columns in the messages), HELLO, GEN with every key at and just
 * past its limits, ids, and proto_quote with its round trip through proto_split. Every
 * line is split from a heap buffer of exactly its length, so ASan sees any overread. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/proto.h"
#include "tests/unit/check.h"

static char err[256];
static char *g_buf; /* the line of the last split: the results point into it */
static proto_line L;

/* An error message is one line of printable ASCII. */
static int msg_ok(const char *m) {
    if (!m[0]) return 0;
    for (const char *p = m; *p; p++)
        if (*p < 0x20 || *p > 0x7e) return 0;
    return 1;
}

static int splitn(const char *text, size_t n) {
    free(g_buf);
    g_buf = malloc(n ? n : 1);
    if (!g_buf) abort();
    memcpy(g_buf, text, n);
    strcpy(err, "(unset)");
    return proto_split(g_buf, n, &L, err, sizeof err);
}
static int split(const char *text) { return splitn(text, strlen(text)); }

/* text must fail to split with a message containing every non-NULL needle. */
#define SPLIT_FAILS_N(text, n, ...)                                                      \
    do {                                                                                 \
        const char *n_[] = {__VA_ARGS__, NULL};                                          \
        int r_ = splitn(text, n);                                                        \
        CHECK(r_ == -EINVAL, "split of %s returned %d", #text, r_);                      \
        CHECK(msg_ok(err), "split of %s: message not printable: %s", #text, err);        \
        CHECK(L.n_pos == 0 && L.n_kv == 0 && !L.verb[0], "split of %s: output left", #text); \
        for (int i_ = 0; n_[i_]; i_++)                                                   \
            CHECK(strstr(err, n_[i_]), "split of %s: error '%s' lacks '%s'", #text, err, n_[i_]); \
    } while (0)
#define SPLIT_FAILS(text, ...) SPLIT_FAILS_N(text, strlen(text), __VA_ARGS__)

#define SPLIT_OK(text) CHECK(split(text) == 0, "split of %s: %s", #text, err)

static int streq(const proto_str *s, const char *want) {
    return s && s->len == strlen(want) && !memcmp(s->s, want, s->len) && s->s[s->len] == '\0';
}
static int memeq(const proto_str *s, const void *want, size_t n) {
    return s && s->len == n && !memcmp(s->s, want, n) && s->s[n] == '\0';
}

/* Every word, key and value lies inside the buffer of the last split. */
static int inside(size_t n) {
    for (int i = 0; i < L.n_pos; i++)
        if (L.pos[i].s < g_buf || L.pos[i].s + L.pos[i].len >= g_buf + n) return 0;
    for (int i = 0; i < L.n_kv; i++) {
        const proto_str *k = &L.kv[i].key, *v = &L.kv[i].val;
        if (k->s < g_buf || k->s + k->len >= g_buf + n) return 0;
        if (v->s < g_buf || v->s + v->len >= g_buf + n) return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- splitting */

static void test_basic(void) {
    SPLIT_OK("GEN id=r1 prompt=\"Hello, world\" temperature=0.5");
    CHECK(!strcmp(L.verb, "GEN") && L.n_pos == 0 && L.n_kv == 3, "%s %d %d", L.verb, L.n_pos, L.n_kv);
    CHECK(streq(&L.kv[0].key, "id") && streq(&L.kv[0].val, "r1") && !L.kv[0].val.quoted, "kv0");
    CHECK(streq(&L.kv[1].key, "prompt") && streq(&L.kv[1].val, "Hello, world") && L.kv[1].val.quoted, "kv1");
    CHECK(streq(&L.kv[2].key, "temperature") && streq(&L.kv[2].val, "0.5"), "kv2");
    CHECK(inside(strlen("GEN id=r1 prompt=\"Hello, world\" temperature=0.5")), "inside");

    /* Server lines: positionals and pairs mixed. */
    SPLIT_OK("TOK r1 \"text \\\"q\\\"\" sample=2");
    CHECK(!strcmp(L.verb, "TOK") && L.n_pos == 2 && L.n_kv == 1, "tok");
    CHECK(streq(&L.pos[0], "r1") && !L.pos[0].quoted && streq(&L.pos[1], "text \"q\"") && L.pos[1].quoted, "tok pos");
    SPLIT_OK("ERR - 401 unauthorized msg=\"bad token\"");
    CHECK(L.n_pos == 3 && streq(&L.pos[0], "-") && streq(&L.pos[1], "401") && streq(&L.pos[2], "unauthorized"), "err");
    CHECK(streq(proto_get(&L, "msg"), "bad token"), "msg");
    SPLIT_OK("END r1 reason=stop prompt_tokens=5 completion_tokens=7 ttft_ms=1.5");
    CHECK(L.n_pos == 1 && L.n_kv == 4 && streq(proto_get(&L, "ttft_ms"), "1.5"), "end");

    /* A verb alone; every letter; the longest verb. */
    SPLIT_OK("QUIT");
    CHECK(!strcmp(L.verb, "QUIT") && L.n_pos == 0 && L.n_kv == 0, "quit");
    SPLIT_OK("ABCDEFGHIJKLMNOP");
    CHECK(!strcmp(L.verb, "ABCDEFGHIJKLMNOP"), "16 letters");
    SPLIT_OK("QRSTUVWXYZ");
    SPLIT_FAILS("ABCDEFGHIJKLMNOPQ", "col 17:", "verb too long");

    /* Spaces: leading, trailing, repeated; CRLF. */
    SPLIT_OK("   CANCEL    abc     id=x   ");
    CHECK(!strcmp(L.verb, "CANCEL") && L.n_pos == 1 && streq(&L.pos[0], "abc") && streq(proto_get(&L, "id"), "x"), "spaces");
    SPLIT_OK("HEALTH\r");
    CHECK(!strcmp(L.verb, "HEALTH") && L.n_pos == 0, "crlf");
    SPLIT_OK("CANCEL r1\r");
    CHECK(streq(&L.pos[0], "r1"), "crlf word");
    SPLIT_OK("X k=\"v\"\r");
    CHECK(streq(proto_get(&L, "k"), "v"), "crlf string");
    SPLIT_OK("X k=v \r");
    CHECK(streq(proto_get(&L, "k"), "v"), "space crlf");
    SPLIT_FAILS("X a\r\r", "col 4:", "control byte 0x0d");
    SPLIT_FAILS("X a\rb", "col 4:", "control byte 0x0d");

    /* Empty lines. */
    SPLIT_FAILS("", "empty line");
    SPLIT_FAILS("    ", "empty line");
    SPLIT_FAILS("\r", "empty line");
    SPLIT_FAILS("  \r", "empty line");

    /* Empty strings, and strings that look like other things. */
    SPLIT_OK("X k=\"\" \"\" \"a=b\" \"\\\"\"");
    CHECK(memeq(proto_get(&L, "k"), "", 0) && proto_get(&L, "k")->quoted, "empty value");
    CHECK(L.n_pos == 3 && memeq(&L.pos[0], "", 0) && L.pos[0].quoted, "empty pos");
    CHECK(streq(&L.pos[1], "a=b") && streq(&L.pos[2], "\""), "a=b");
}

static void test_split_errors(void) {
    /* Verbs. */
    SPLIT_FAILS("gen id=1", "col 1:", "verb must be upper case");
    SPLIT_FAILS("GEn id=1", "col 3:", "verb must be upper case");
    SPLIT_FAILS("G1 x", "col 2:", "unexpected '1' in verb");
    SPLIT_FAILS("GEN\"x\"", "col 4:", "in verb");
    SPLIT_FAILS("\"GEN\"", "col 1:");
    SPLIT_FAILS("id=1", "col 1:", "verb must be upper case");
    SPLIT_FAILS("ID=1", "col 3:", "unexpected '=' in verb");
    SPLIT_FAILS("GEN\tid=1", "col 4:", "control byte 0x09");
    SPLIT_FAILS("  \tGEN", "col 3:", "control byte 0x09");
    SPLIT_FAILS("G\xc3\x89N", "col 2:", "non-ASCII byte 0xc3");

    /* Keys. */
    SPLIT_FAILS("X Key=1", "col 3:", "key must be lower case");
    SPLIT_FAILS("X 1key=1", "col 3:", "key must start with a letter");
    SPLIT_FAILS("X _key=1", "col 3:", "key must start with a letter");
    SPLIT_FAILS("X =1", "col 3:", "empty key");
    SPLIT_FAILS("X a-b=1", "col 4:", "unexpected '-' in key");
    SPLIT_FAILS("X a.b=1", "col 4:", "unexpected '.' in key");
    SPLIT_FAILS("X a\tb=1", "col 4:", "control byte 0x09");
    SPLIT_FAILS("X a\x7f=1", "col 4:", "control byte 0x7f");
    SPLIT_FAILS("X \xc3\xa9=1", "col 3:", "non-ASCII");
    SPLIT_OK("X abcdefghijklmnopqrstuvwxyz_01234=1");
    CHECK(L.n_kv == 1 && L.kv[0].key.len == PROTO_KEY_MAX, "32-byte key");
    SPLIT_FAILS("X abcdefghijklmnopqrstuvwxyz_012345=1", "col 35:", "key too long");
    SPLIT_OK("X a_9=1 z=2");

    /* Values. */
    SPLIT_FAILS("X k=", "col 4:", "empty value");
    SPLIT_FAILS("X k= j=1", "col 4:", "empty value");
    SPLIT_FAILS("X k=a=b", "col 6:", "'=' inside a bare value");
    SPLIT_FAILS("X k==", "col 5:", "'='");
    SPLIT_FAILS("X k=a\"b\"", "col 6:", "'\"' inside a bare word");
    SPLIT_FAILS("X k=\"a\"b", "col 8:", "expected a space after the closing quote");
    SPLIT_FAILS("X \"a\"\"b\"", "col 6:", "expected a space");
    SPLIT_FAILS("X k=\xc3\xa9", "col 5:", "non-ASCII byte 0xc3 outside a quoted string");
    SPLIT_FAILS("X k=a\tb", "col 6:", "control byte 0x09");
    SPLIT_FAILS("X ab\"c=d\"", "col 5:", "'\"' inside a bare word");
    SPLIT_FAILS("X word\x01", "col 7:", "control byte 0x01");

    /* Strings. */
    SPLIT_FAILS("X \"abc", "col 3:", "unterminated string");
    SPLIT_FAILS("X k=\"abc", "col 5:", "unterminated string");
    SPLIT_FAILS("X \"abc\\\"", "col 3:", "unterminated string");
    SPLIT_FAILS("X \"abc\\", "col 3:", "unterminated string");
    SPLIT_FAILS("X \"\r", "col 3:", "unterminated string"); /* the '\r' is the line end */
    SPLIT_FAILS("X \"a\tb\"", "col 5:", "control byte 0x09 in string (escape it)");
    SPLIT_FAILS("X \"a\nb\"", "col 5:", "control byte 0x0a in string");
    SPLIT_FAILS("X \"a\rb\"", "col 5:", "control byte 0x0d in string");
    SPLIT_FAILS("X \"a\x7f\"", "col 5:", "control byte 0x7f in string");
    SPLIT_FAILS("X \"\x1b[31m\"", "col 4:", "control byte 0x1b");

    /* NUL bytes: raw ones are control bytes everywhere. */
    SPLIT_FAILS_N("X \"a\0b\"", 7, "col 5:", "control byte 0x00");
    SPLIT_FAILS_N("X a\0b", 5, "col 4:", "control byte 0x00");
    SPLIT_FAILS_N("\0", 1, "col 1:", "control byte 0x00");
    SPLIT_FAILS_N("GEN\0", 4, "col 4:", "control byte 0x00");
    SPLIT_FAILS_N("X k=\0", 5, "col 5:", "control byte 0x00");
    SPLIT_FAILS_N("X \"\0", 4, "col 4:", "control byte 0x00");

    /* Limits. */
    SPLIT_OK("X a b c d");
    CHECK(L.n_pos == PROTO_MAX_POS, "4 positionals");
    SPLIT_FAILS("X a b c d e", "col 11:", "too many positional words (max 4)");
    SPLIT_FAILS("X a b c d \"e\"", "col 11:", "too many positional");
    char line[4096];
    int o = snprintf(line, sizeof line, "X");
    for (int i = 0; i < PROTO_MAX_KV; i++) o += snprintf(line + o, sizeof line - (size_t)o, " k%d=%d", i, i);
    SPLIT_OK(line);
    CHECK(PROTO_MAX_KV == 288 && L.n_kv == PROTO_MAX_KV && streq(&L.kv[287].key, "k287") &&
          streq(&L.kv[287].val, "287"), "288 pairs");
    snprintf(line + o, sizeof line - (size_t)o, " extra=1");
    SPLIT_FAILS(line, "too many key=value pairs (max 288)");
    snprintf(line + o, sizeof line - (size_t)o, " pos");
    SPLIT_OK(line);
    CHECK(L.n_kv == 288 && L.n_pos == 1 && streq(&L.pos[0], "pos"), "pairs and a word");

    /* No buffer for the message, or a tiny one: no crash, still an error. */
    char b[] = "gen";
    CHECK(proto_split(b, 3, &L, NULL, 0) == -EINVAL, "NULL err");
    char b2[] = "X \"unterminated";
    char tiny[6];
    CHECK(proto_split(b2, strlen(b2), &L, tiny, sizeof tiny) == -EINVAL && !strcmp(tiny, "col 3"), "tiny: %s", tiny);
    char b3[] = "";
    CHECK(proto_split(b3, 0, &L, tiny, 1) == -EINVAL && tiny[0] == '\0', "errlen 1");
}

static void test_escapes(void) {
    SPLIT_OK("X \"\\\" \\\\ \\n \\r \\t \\x41 \\x7e \\u0041 \\u00e9 \\u20AC \\u07ff \\u0800 \\uffff\"");
    const char want[] = "\" \\ \n \r \t A ~ A \xc3\xa9 \xe2\x82\xac \xdf\xbf \xe0\xa0\x80 \xef\xbf\xbf";
    CHECK(L.n_pos == 1 && memeq(&L.pos[0], want, sizeof want - 1), "escapes: %zu", L.pos[0].len);
    SPLIT_OK("X k=\"\\x01\\x1F\\x7f\\u0001\"");
    CHECK(memeq(proto_get(&L, "k"), "\x01\x1f\x7f\x01", 4), "control escapes");
    SPLIT_OK("X \"\\xc3\\xa9\" \"\\xC3\\xA9\" \"\\xc3\xa9\" \"\xc3\\xa9\"");
    CHECK(L.n_pos == 4, "n");
    for (int i = 0; i < 4; i++) CHECK(memeq(&L.pos[i], "\xc3\xa9", 2), "escaped e-acute %d", i);
    SPLIT_OK("X \"\\xf0\\x9f\\x98\\x80\" \"\xf0\x9f\x98\x80\"");
    CHECK(memeq(&L.pos[0], "\xf0\x9f\x98\x80", 4) && memeq(&L.pos[1], "\xf0\x9f\x98\x80", 4), "emoji");
    SPLIT_OK("X \"\\\\x41\"");
    CHECK(streq(&L.pos[0], "\\x41"), "escaped backslash");

    SPLIT_FAILS("X \"a\\qb\"", "col 5:", "bad escape \\q");
    SPLIT_FAILS("X \"\\a\"", "col 4:", "bad escape \\a");
    SPLIT_FAILS("X \"\\0\"", "col 4:", "bad escape \\0");
    SPLIT_FAILS("X \"\\'\"", "col 4:", "bad escape \\'");
    SPLIT_FAILS("X \"\\ \"", "col 4:", "bad escape (byte 0x20");
    SPLIT_FAILS("X \"\\\xc3\xa9\"", "col 4:", "bad escape (byte 0xc3");
    SPLIT_FAILS("X \"\\\t\"", "col 4:", "bad escape (byte 0x09");
    SPLIT_FAILS("X \"\\x4\"", "col 4:", "bad escape \\x");
    SPLIT_FAILS("X \"\\xg1\"", "col 4:", "bad escape \\x");
    SPLIT_FAILS("X \"\\x", "col 4:", "bad escape \\x");
    SPLIT_FAILS("X \"\\x4", "col 4:", "bad escape \\x");
    SPLIT_FAILS("X \"\\x00\"", "col 4:", "\\x00 is not allowed");
    SPLIT_FAILS("X \"\\u12\"", "col 4:", "bad escape \\u");
    SPLIT_FAILS("X \"\\u12g4\"", "col 4:", "bad escape \\u");
    SPLIT_FAILS("X \"\\u123", "col 4:", "bad escape \\u");
    SPLIT_FAILS("X \"\\U0041\"", "col 4:", "bad escape \\U");
    SPLIT_FAILS("X \"\\u0000\"", "col 4:", "\\u0000 is not allowed");
    SPLIT_FAILS("X \"\\ud800\"", "col 4:", "\\uD800 is a surrogate");
    SPLIT_FAILS("X \"\\uDFFF\"", "col 4:", "\\uDFFF is a surrogate");
    SPLIT_FAILS("X \"\\ud83d\\ude00\"", "col 4:", "surrogate");
    SPLIT_OK("X \"\\ud7ff\\ue000\"");
    CHECK(memeq(&L.pos[0], "\xed\x9f\xbf\xee\x80\x80", 6), "around the surrogates");
}

static void test_utf8(void) {
    /* Valid: 2, 3 and 4 bytes at their edges. */
    SPLIT_OK("X \"\xc2\x80 \xdf\xbf \xe0\xa0\x80 \xed\x9f\xbf \xee\x80\x80 \xef\xbf\xbf \xf0\x90\x80\x80 \xf4\x8f\xbf\xbf\"");
    CHECK(L.n_pos == 1 && L.pos[0].len == 2 + 2 + 3 + 3 + 3 + 3 + 4 + 4 + 7, "edges %zu", L.pos[0].len);

    SPLIT_FAILS("X \"\xff\"", "col 4:", "invalid UTF-8 in string");
    SPLIT_FAILS("X \"ab\xfe\"", "col 6:", "invalid UTF-8");
    SPLIT_FAILS("X \"\x80\"", "col 4:", "invalid UTF-8");           /* lone continuation */
    SPLIT_FAILS("X \"\xc0\x80\"", "col 4:", "invalid UTF-8");       /* overlong NUL */
    SPLIT_FAILS("X \"\xc1\xbf\"", "col 4:", "invalid UTF-8");       /* overlong */
    SPLIT_FAILS("X \"\xe0\x80\x80\"", "col 4:", "invalid UTF-8");   /* overlong 3 */
    SPLIT_FAILS("X \"\xe0\x9f\xbf\"", "col 4:", "invalid UTF-8");   /* overlong 3 */
    SPLIT_FAILS("X \"\xf0\x80\x80\x80\"", "col 4:", "invalid UTF-8"); /* overlong 4 */
    SPLIT_FAILS("X \"\xf0\x8f\xbf\xbf\"", "col 4:", "invalid UTF-8"); /* overlong 4 */
    SPLIT_FAILS("X \"\xed\xa0\x80\"", "col 4:", "invalid UTF-8");   /* U+D800 */
    SPLIT_FAILS("X \"\xed\xbf\xbf\"", "col 4:", "invalid UTF-8");   /* U+DFFF */
    SPLIT_FAILS("X \"\xf4\x90\x80\x80\"", "col 4:", "invalid UTF-8"); /* U+110000 */
    SPLIT_FAILS("X \"\xf5\x80\x80\x80\"", "col 4:", "invalid UTF-8");
    SPLIT_FAILS("X \"\xc3\"", "col 4:", "truncated");
    SPLIT_FAILS("X \"ab\xe2\x82\"", "col 6:", "truncated");
    SPLIT_FAILS("X \"\xf0\x9f\x98\"", "col 4:", "truncated");
    SPLIT_FAILS("X \"\xc3x\"", "col 4:", "invalid UTF-8");
    SPLIT_FAILS("X \"\xe2\x82 \"", "col 4:", "invalid UTF-8");
    /* Escaped bytes are checked the same way, alone and mixed with raw ones. */
    SPLIT_FAILS("X \"\\xff\"", "col 4:", "invalid UTF-8");
    SPLIT_FAILS("X \"\\xc3\"", "col 4:", "truncated");
    SPLIT_FAILS("X \"\\xc0\\x80\"", "col 4:", "invalid UTF-8");
    SPLIT_FAILS("X \"\\xed\\xa0\\x80\"", "col 4:", "invalid UTF-8");
    SPLIT_FAILS("X \"ok \\xc3\\u00e9\"", "col 7:", "invalid UTF-8");
    SPLIT_FAILS("X \"\\xc3\\\"\"", "col 4:", "invalid UTF-8");
    SPLIT_FAILS("X k=\"12345678901234\xff\"", "col 20:", "invalid UTF-8 in string");
}

static void test_long(void) {
    /* A 1 MiB prompt with escapes at both ends, and a 1 MiB bare word. */
    size_t n = 1 << 20;
    char *line = malloc(n + 64);
    if (!line) abort();
    int o = snprintf(line, 64, "GEN id=big prompt=\"\\u00e9");
    memset(line + o, 'a', n);
    memcpy(line + o + n, "\\n\" max_tokens=5", 17);
    size_t len = strlen(line);
    CHECK(splitn(line, len) == 0, "1 MiB string: %s", err);
    const proto_str *p = proto_get(&L, "prompt");
    CHECK(p && p->len == n + 3 && !memcmp(p->s, "\xc3\xa9", 2) && p->s[n + 2] == '\n' && strlen(p->s) == p->len, "big");
    CHECK(streq(proto_get(&L, "max_tokens"), "5") && inside(len), "after big");
    proto_gen g;
    CHECK(proto_gen_parse(&L, &g, err, sizeof err) == 0 && g.prompt_len == n + 3 && g.max_tokens == 5, "gen big: %s", err);

    memcpy(line, "X ", 2);
    memset(line + 2, 'w', n);
    CHECK(splitn(line, n + 2) == 0 && L.n_pos == 1 && L.pos[0].len == n, "1 MiB word: %s", err);
    CHECK(inside(n + 2), "inside");
    memcpy(line, "X k=", 4);
    CHECK(splitn(line, n + 2) == 0 && L.n_kv == 1 && L.kv[0].val.len == n - 2, "1 MiB value: %s", err);
    line[n / 2] = '\x01';
    CHECK(splitn(line, n + 2) == -EINVAL && strstr(err, "control byte 0x01"), "late control: %s", err);
    char want[32];
    snprintf(want, sizeof want, "col %zu:", (size_t)n / 2 + 1);
    CHECK(!strncmp(err, want, strlen(want)), "col: %s", err);
    /* An unterminated string running to the end of a long line. */
    memcpy(line, "X \"", 3);
    memset(line + 3, 'q', n);
    CHECK(splitn(line, n + 3) == -EINVAL && !strcmp(err, "col 3: unterminated string"), "%s", err);
    free(line);
}

static void test_get(void) {
    SPLIT_OK("X a=1 b=2 a=3 \"a=4\"");
    CHECK(streq(proto_get(&L, "a"), "1"), "first occurrence");
    CHECK(streq(proto_get(&L, "b"), "2"), "b");
    CHECK(!proto_get(&L, "c") && !proto_get(&L, "") && !proto_get(&L, "a=4"), "absent");
    CHECK(L.n_kv == 3 && L.n_pos == 1, "a=4 is a word");
}

/* ---------------------------------------------------------------- HELLO */

static proto_hello H;

static int hello(const char *text) {
    if (split(text) < 0) return -100;
    return proto_hello_parse(&L, &H, err, sizeof err);
}
#define HELLO_FAILS(text, needle)                                                        \
    do {                                                                                 \
        int r_ = hello(text);                                                            \
        CHECK(r_ == -EINVAL && strstr(err, needle) && msg_ok(err), "hello %s: %d %s", #text, r_, err); \
    } while (0)

static void test_hello(void) {
    CHECK(hello("HELLO kiln/1 token=s3cr3t") == 0 && H.version == 1 && !strcmp(H.token, "s3cr3t"), "%s", err);
    CHECK(hello("HELLO kiln/1 token=\"with space\"\r") == 0 && !strcmp(H.token, "with space"), "%s", err);
    CHECK(hello("HELLO kiln/1") == 0 && H.version == 1 && !H.token, "%s", err);
    CHECK(hello("  HELLO   token=x   kiln/1  ") == 0 && !strcmp(H.token, "x"), "%s", err);
    CHECK(hello("HELLO \"kiln/1\" token=t") == 0, "%s", err);
    HELLO_FAILS("HELLO kiln/2 token=x", "unsupported protocol version");
    HELLO_FAILS("HELLO kiln/10", "unsupported protocol version");
    HELLO_FAILS("HELLO kiln/0", "unsupported protocol version");
    HELLO_FAILS("HELLO kiln/", "expected kiln/1");
    HELLO_FAILS("HELLO kiln/1x", "expected kiln/1");
    HELLO_FAILS("HELLO kiln/-1", "expected kiln/1");
    HELLO_FAILS("HELLO kiln/99999999999999999999", "expected kiln/1");
    HELLO_FAILS("HELLO KILN/1", "expected kiln/1");
    HELLO_FAILS("HELLO http/1.1", "expected kiln/1");
    HELLO_FAILS("HELLO token=x", "missing protocol version");
    HELLO_FAILS("HELLO kiln/1 extra", "unexpected word");
    HELLO_FAILS("HELLO kiln/1 token=a token=b", "duplicate key token");
    HELLO_FAILS("HELLO kiln/1 tok=a", "unknown key tok");
    HELLO_FAILS("HELLO kiln/1 user=a token=b", "unknown key user");
    HELLO_FAILS("GEN kiln/1", "expected HELLO");
    HELLO_FAILS("HELLOX kiln/1", "expected HELLO");
    CHECK(hello("HELLO kiln/2") == -EINVAL && H.version == 0 && !H.token, "reset on error");
}

/* ---------------------------------------------------------------- GEN */

static proto_gen G;

static int gen(const char *text) {
    if (split(text) < 0) return -100;
    return proto_gen_parse(&L, &G, err, sizeof err);
}
#define GEN_OK(text) CHECK(gen(text) == 0, "gen %s: %s", #text, err)
#define GEN_FAILS(text, needle)                                                          \
    do {                                                                                 \
        int r_ = gen(text);                                                              \
        CHECK(r_ == -EINVAL && strstr(err, needle) && msg_ok(err), "gen %s: %d %s", #text, r_, err); \
    } while (0)

/* GEN id=t prompt=p key=val must parse (ok) or not. */
static void gen_key(const char *key, const char *val, int ok) {
    char line[256];
    snprintf(line, sizeof line, "GEN id=t prompt=p %s=%s", key, val);
    int r = gen(line);
    if (ok) CHECK(r == 0, "%s: %s", line, err);
    else CHECK(r == -EINVAL && strstr(err, key) && msg_ok(err), "%s: %d %s", line, r, err);
}

static void test_gen_defaults(void) {
    GEN_OK("GEN id=a1 prompt=\"Why is the sky blue?\"");
    CHECK(!strcmp(G.id, "a1") && !strcmp(G.prompt, "Why is the sky blue?") && G.prompt_len == 20, "id/prompt");
    CHECK(!G.system && G.system_len == 0 && G.chat == 0 && G.n == 1 && G.logprobs == 0 && G.ignore_eos == 0, "flags");
    CHECK(G.max_tokens == -1 && G.top_k == 0 && G.repeat_last_n == 64, "ints");
    CHECK(G.temperature == 1.0f && G.top_p == 1.0f && G.min_p == 0 && G.repeat_penalty == 1.0f, "floats");
    CHECK(G.presence_penalty == 0 && G.frequency_penalty == 0 && G.seed == 0, "pen/seed");
    CHECK(G.n_stops == 0 && G.set == 0, "stops/set");
    GEN_OK("GEN prompt=word id=\"q.1:x-y_Z\"");
    CHECK(!strcmp(G.id, "q.1:x-y_Z") && !strcmp(G.prompt, "word") && G.prompt_len == 4, "bare prompt, quoted id");
}

static void test_gen_all(void) {
    GEN_OK("GEN id=r7 prompt=\"Hi\" chat=1 system=\"Be brief.\" max_tokens=100 temperature=0.25 top_p=0.5 "
           "top_k=40 min_p=0.05 repeat_penalty=1.1 repeat_last_n=128 presence_penalty=-1.5 "
           "frequency_penalty=2 seed=18446744073709551615 n=8 stop=\"\\n\\n\" stop=END stop=\"a\" "
           "stop=\"\xc3\xa9\" logprobs=1 ignore_eos=1");
    CHECK(G.chat == 1 && !strcmp(G.system, "Be brief.") && G.system_len == 9, "system");
    CHECK(G.max_tokens == 100 && G.temperature == 0.25f && G.top_p == 0.5f && G.top_k == 40, "a");
    CHECK(G.min_p == 0.05f && G.repeat_penalty == 1.1f && G.repeat_last_n == 128, "b");
    CHECK(G.presence_penalty == -1.5f && G.frequency_penalty == 2.0f && G.seed == UINT64_MAX, "c");
    CHECK(G.n == 8 && G.logprobs == 1 && G.ignore_eos == 1, "d");
    CHECK(G.n_stops == 4 && !strcmp(G.stops[0], "\n\n") && !strcmp(G.stops[1], "END") &&
          !strcmp(G.stops[2], "a") && !strcmp(G.stops[3], "\xc3\xa9"), "stops");
    unsigned all = PG_MAX_TOKENS | PG_TEMPERATURE | PG_TOP_P | PG_TOP_K | PG_MIN_P | PG_REPEAT_PENALTY |
                   PG_REPEAT_LAST_N | PG_PRESENCE | PG_FREQUENCY | PG_SEED;
    CHECK(G.set == all, "set %#x", G.set);
    /* Each bit alone. */
    GEN_OK("GEN id=t prompt=p temperature=1");
    CHECK(G.set == PG_TEMPERATURE, "temp bit");
    GEN_OK("GEN id=t prompt=p seed=0");
    CHECK(G.set == PG_SEED && G.seed == 0, "seed bit");
    GEN_OK("GEN id=t prompt=p max_tokens=0 chat=0 n=1 logprobs=0");
    CHECK(G.set == PG_MAX_TOKENS && G.max_tokens == 0, "max bit");
    GEN_OK("GEN id=t prompt=p top_k=0 repeat_last_n=0");
    CHECK(G.set == (PG_TOP_K | PG_REPEAT_LAST_N) && G.repeat_last_n == 0, "k bits");
    GEN_OK("GEN id=t prompt=p top_p=1 min_p=0 repeat_penalty=1 presence_penalty=0 frequency_penalty=0");
    CHECK(G.set == (PG_TOP_P | PG_MIN_P | PG_REPEAT_PENALTY | PG_PRESENCE | PG_FREQUENCY), "float bits");
}

static void test_gen_ranges(void) {
    /* Integers. */
    gen_key("max_tokens", "0", 1);
    gen_key("max_tokens", "1000000", 1);
    gen_key("max_tokens", "1000001", 0);
    gen_key("max_tokens", "-1", 0);
    gen_key("max_tokens", "+5", 0);
    gen_key("max_tokens", "5.0", 0);
    gen_key("max_tokens", "1e3", 0);
    gen_key("max_tokens", "0x10", 0);
    gen_key("max_tokens", "99999999999999999999999", 0);
    gen_key("max_tokens", "18446744073709551616", 0);
    gen_key("max_tokens", "4294967296", 0);
    gen_key("max_tokens", "-0", 0);
    gen_key("max_tokens", "-", 0);
    gen_key("max_tokens", "\"5\"", 0);
    gen_key("max_tokens", "0005", 1);
    CHECK(G.max_tokens == 5, "leading zeros");
    gen_key("top_k", "0", 1);
    gen_key("top_k", "1000000", 1);
    gen_key("top_k", "1000001", 0);
    gen_key("top_k", "-1", 0);
    gen_key("repeat_last_n", "0", 1);
    gen_key("repeat_last_n", "1000000", 1);
    CHECK(G.repeat_last_n == 1000000, "rln");
    gen_key("repeat_last_n", "1000001", 0);
    gen_key("repeat_last_n", "-1", 0);
    gen_key("n", "1", 1);
    gen_key("n", "8", 1);
    CHECK(G.n == 8, "n");
    gen_key("n", "0", 0);
    gen_key("n", "9", 0);
    gen_key("n", "-1", 0);
    gen_key("seed", "0", 1);
    gen_key("seed", "18446744073709551615", 1);
    CHECK(G.seed == UINT64_MAX, "seed max");
    gen_key("seed", "18446744073709551616", 0);
    gen_key("seed", "99999999999999999999", 0);
    gen_key("seed", "-1", 0);
    gen_key("seed", "+1", 0);
    gen_key("seed", "1.5", 0);
    gen_key("seed", "12345678901234567890", 1);
    CHECK(G.seed == 12345678901234567890ull, "seed");

    /* Booleans. */
    static const char *bools[] = {"chat", "logprobs", "ignore_eos"};
    for (int i = 0; i < 3; i++) {
        gen_key(bools[i], "0", 1);
        gen_key(bools[i], "1", 1);
        gen_key(bools[i], "2", 0);
        gen_key(bools[i], "-1", 0);
        gen_key(bools[i], "01", 0);
        gen_key(bools[i], "true", 0);
        gen_key(bools[i], "\"1\"", 0);
    }

    /* Floats: bounds, forms, and what strtod would take but we do not. */
    gen_key("temperature", "0", 1);
    CHECK(G.temperature == 0, "t0");
    gen_key("temperature", "100", 1);
    CHECK(G.temperature == 100, "t100");
    gen_key("temperature", "100.0001", 0);
    gen_key("temperature", "-0.0001", 0);
    gen_key("temperature", "-0", 1);
    CHECK(G.temperature == 0 && !signbit(G.temperature), "-0 is 0");
    gen_key("temperature", "1e2", 1);
    gen_key("temperature", "1E-2", 1);
    CHECK(G.temperature == 0.01f, "1E-2");
    gen_key("temperature", "1e+1", 1);
    CHECK(G.temperature == 10, "1e+1");
    gen_key("temperature", ".5", 1);
    CHECK(G.temperature == 0.5f, ".5");
    gen_key("temperature", "5.", 1);
    gen_key("temperature", "1e-400", 1); /* underflows to 0: in range */
    gen_key("temperature", "1e999", 0);
    gen_key("temperature", "+1", 0);
    gen_key("temperature", "0x1p-2", 0);
    gen_key("temperature", "inf", 0);
    gen_key("temperature", "nan", 0);
    gen_key("temperature", "NAN", 0);
    gen_key("temperature", "infinity", 0);
    gen_key("temperature", "1.0.0", 0);
    gen_key("temperature", "1e", 0);
    gen_key("temperature", "e1", 0);
    gen_key("temperature", ".", 0);
    gen_key("temperature", "--1", 0);
    gen_key("temperature", "1-", 0);
    gen_key("temperature", "1,5", 0);
    gen_key("temperature", "\"0.5\"", 0);
    /* Numbers are read from a 64-byte copy: 63 characters is the most. */
    char num[80] = "0.";
    memset(num + 2, '0', 60);
    strcpy(num + 62, "5");
    gen_key("temperature", num, 1);
    strcpy(num + 62, "05");
    gen_key("temperature", num, 0);
    gen_key("top_p", "1", 1);
    gen_key("top_p", "0.000001", 1);
    gen_key("top_p", "0", 0);
    gen_key("top_p", "-0", 0);
    gen_key("top_p", "1e-300", 0); /* above 0 as a double, 0 as a float */
    gen_key("top_p", "1.0000001", 0);
    gen_key("min_p", "0", 1);
    gen_key("min_p", "1", 1);
    gen_key("min_p", "1.01", 0);
    gen_key("min_p", "-0.01", 0);
    gen_key("repeat_penalty", "10", 1);
    gen_key("repeat_penalty", "0.01", 1);
    gen_key("repeat_penalty", "0", 0);
    gen_key("repeat_penalty", "10.001", 0);
    gen_key("presence_penalty", "-2", 1);
    gen_key("presence_penalty", "2", 1);
    gen_key("presence_penalty", "-2.001", 0);
    gen_key("presence_penalty", "2.001", 0);
    gen_key("frequency_penalty", "-2", 1);
    gen_key("frequency_penalty", "2", 1);
    gen_key("frequency_penalty", "-2.5", 0);
    gen_key("frequency_penalty", "3", 0);
    GEN_FAILS("GEN id=t prompt=p top_p=0", "top_p must be a number in (0, 1]");
    GEN_FAILS("GEN id=t prompt=p temperature=101", "temperature must be a number in [0, 100]");
    GEN_FAILS("GEN id=t prompt=p max_tokens=x", "max_tokens must be an integer in 0..1000000");
    GEN_FAILS("GEN id=t prompt=p seed=x", "seed must be an integer in 0..18446744073709551615");
    GEN_FAILS("GEN id=t prompt=p temperature=\"1\"", "temperature: numbers are written without quotes");
}

static void test_gen_strings(void) {
    /* ids. */
    GEN_OK("GEN id=abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_. prompt=p");
    CHECK(strlen(G.id) == 64, "64-byte id");
    GEN_FAILS("GEN id=abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.: prompt=p", "bad id");
    GEN_FAILS("GEN id=\"\" prompt=p", "bad id");
    GEN_FAILS("GEN id=\"a b\" prompt=p", "bad id");
    GEN_FAILS("GEN id=a/b prompt=p", "bad id");
    GEN_FAILS("GEN id=\"\xc3\xa9\" prompt=p", "bad id");
    GEN_FAILS("GEN prompt=p", "missing id");
    GEN_FAILS("GEN id=a id=b prompt=p", "duplicate key id");
    CHECK(G.id && !strcmp(G.id, "a"), "first id kept for the reply");

    /* prompt and system. */
    GEN_FAILS("GEN id=t", "missing prompt");
    GEN_FAILS("GEN id=t prompt=\"\"", "empty prompt");
    GEN_FAILS("GEN id=t prompt=\"\" chat=1", "empty prompt");
    GEN_FAILS("GEN id=t prompt=\"\" chat=1 system=\"\"", "empty prompt");
    GEN_OK("GEN id=t prompt=\"\" chat=1 system=\"You are terse.\"");
    CHECK(G.prompt && G.prompt_len == 0 && G.system_len == 14, "empty prompt with system");
    GEN_FAILS("GEN id=t prompt=p system=s", "system needs chat=1");
    GEN_FAILS("GEN id=t prompt=p system=s chat=0", "system needs chat=1");
    GEN_OK("GEN id=t prompt=p chat=1");
    CHECK(!G.system && G.chat == 1, "chat without system");
    GEN_FAILS("GEN id=t prompt=a prompt=b", "duplicate key prompt");
    GEN_FAILS("GEN id=t prompt=a chat=1 system=a system=b", "duplicate key system");

    /* stop. */
    GEN_OK("GEN id=t prompt=p stop=a stop=b stop=c stop=d");
    CHECK(G.n_stops == 4 && !strcmp(G.stops[3], "d"), "4 stops");
    GEN_FAILS("GEN id=t prompt=p stop=a stop=b stop=c stop=d stop=e", "too many stop strings (max 4)");
    GEN_FAILS("GEN id=t prompt=p stop=\"\"", "stop must be 1..64 bytes");
    GEN_OK("GEN id=t prompt=p stop=\"1234567890123456789012345678901234567890123456789012345678901234\"");
    CHECK(G.n_stops == 1 && strlen(G.stops[0]) == 64, "64-byte stop");
    GEN_FAILS("GEN id=t prompt=p stop=\"12345678901234567890123456789012345678901234567890123456789012345\"", "stop must be 1..64 bytes");
    GEN_OK("GEN id=t prompt=p stop=\"\xe2\x82\xac\xe2\x82\xac\"");

    /* Duplicates, unknown keys, positionals, verb. */
    static const char *keys[] = {"chat=0", "max_tokens=1", "temperature=1", "top_p=1", "top_k=1", "min_p=0",
                                 "repeat_penalty=1", "repeat_last_n=1", "presence_penalty=0",
                                 "frequency_penalty=0", "seed=1", "n=1", "logprobs=0", "ignore_eos=0"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char line[128];
        snprintf(line, sizeof line, "GEN id=t prompt=p %s %s", keys[i], keys[i]);
        int r = gen(line);
        CHECK(r == -EINVAL && strstr(err, "duplicate key"), "%s: %d %s", line, r, err);
    }
    GEN_FAILS("GEN id=t prompt=p temp=1", "unknown key temp");
    GEN_FAILS("GEN id=t prompt=p top_n=1", "unknown key top_n");
    GEN_FAILS("GEN id=t prompt=p stream=1", "unknown key stream");
    GEN_FAILS("GEN id=t prompt=p extra", "no positional words");
    GEN_FAILS("GEN t prompt=p id=t", "no positional words");
    GEN_FAILS("GENERATE id=t prompt=p", "expected GEN");
    GEN_FAILS("HELLO id=t prompt=p", "expected GEN");
    /* Any error after a valid id still gives the id, for `ERR <id> 400`. */
    GEN_FAILS("GEN temperature=7000 id=req-9 prompt=p", "temperature");
    CHECK(G.id && !strcmp(G.id, "req-9"), "id on error");
    GEN_FAILS("GEN id=bad/id prompt=p", "bad id");
    CHECK(!G.id, "no id when invalid");
}

/* The conversation form: system= user= assistant= in wire order instead of prompt. */
static void test_gen_conversation(void) {
    GEN_OK("GEN id=c chat=1 system=\"Be brief.\" user=\"Hi\" assistant=\"Hello!\" max_tokens=4 "
           "user=\"And you?\"");
    CHECK(G.n_msgs == 4 && !G.prompt && !G.system && G.system_len == 0 && G.chat == 1, "4 messages");
    CHECK(!strcmp(G.msgs[0].role, "system") && !strcmp(G.msgs[0].content, "Be brief.") && G.msgs[0].len == 9 &&
          !strcmp(G.msgs[1].role, "user") && !strcmp(G.msgs[1].content, "Hi") &&
          !strcmp(G.msgs[2].role, "assistant") && !strcmp(G.msgs[2].content, "Hello!") &&
          !strcmp(G.msgs[3].role, "user") && !strcmp(G.msgs[3].content, "And you?") && G.msgs[3].len == 8,
          "roles and contents in wire order");
    CHECK(G.max_tokens == 4 && (G.set & PG_MAX_TOKENS), "other keys between the messages");
    GEN_OK("GEN id=c user=q chat=1");
    CHECK(G.n_msgs == 1 && !strcmp(G.msgs[0].role, "user") && !strcmp(G.msgs[0].content, "q"), "one user message");
    GEN_OK("GEN id=c chat=1 user=\"\"");
    CHECK(G.n_msgs == 1 && G.msgs[0].len == 0, "an empty user message (the template still has its turn)");
    GEN_OK("GEN id=c chat=1 user=a user=b");
    CHECK(G.n_msgs == 2, "two user messages in a row (the template judges)");
    /* The prompt form keeps system out of msgs. */
    GEN_OK("GEN id=c chat=1 system=s prompt=p");
    CHECK(G.n_msgs == 0 && G.system && !strcmp(G.system, "s") && !strcmp(G.prompt, "p"), "prompt form");
    GEN_OK("GEN id=c chat=1 prompt=p system=s");
    CHECK(G.n_msgs == 0 && G.system && !strcmp(G.system, "s"), "prompt form, system after prompt");

    /* Refusals. */
    GEN_FAILS("GEN id=c chat=1 prompt=p user=u", "prompt and user=/assistant= messages exclude each other");
    GEN_FAILS("GEN id=c chat=1 user=u prompt=p", "exclude each other");
    GEN_FAILS("GEN id=c chat=1 prompt=p assistant=a user=u", "exclude each other");
    GEN_FAILS("GEN id=c user=u", "need chat=1");
    GEN_FAILS("GEN id=c chat=0 system=s user=u", "need chat=1");
    GEN_FAILS("GEN id=c chat=1 user=u assistant=a", "the last message must be a user message");
    GEN_FAILS("GEN id=c chat=1 assistant=a", "the last message must be a user message");
    GEN_FAILS("GEN id=c chat=1 user=u system=s", "system must be the first message");
    GEN_FAILS("GEN id=c chat=1 user=u system=s user=v", "system must be the first message");
    GEN_FAILS("GEN id=c chat=1 system=s system=t user=u", "duplicate key system");
    GEN_FAILS("GEN id=c chat=1 system=s", "missing prompt");
    SPLIT_FAILS("GEN id=c chat=1 user=u User=v", "col 24:"); /* keys are lower case */
    GEN_FAILS("GEN id=c chat=1 usr=u", "unknown key usr");
    CHECK(G.id && !strcmp(G.id, "c"), "id on error");
    proto_str v = {"x", 1, 1};
    proto_gen g0;
    proto_gen_init(&g0);
    CHECK(proto_gen_set(&g0, "user", &v, err, sizeof err) == -EINVAL && strstr(err, "unknown key user"),
          "proto_gen_set takes no messages");
    CHECK(proto_gen_set(&g0, "assistant", &v, err, sizeof err) == -EINVAL, "nor assistant");

    /* PROTO_MAX_MSGS messages, and one more: system + 255 turns, then + 256. */
    static char big[8192];
    int o = snprintf(big, sizeof big, "GEN id=m chat=1 system=s");
    for (int i = 1; i < PROTO_MAX_MSGS; i++)
        o += snprintf(big + o, sizeof big - (size_t)o, i % 2 ? " user=u%d" : " assistant=a%d", i);
    GEN_OK(big);
    CHECK(PROTO_MAX_MSGS == 256 && G.n_msgs == 256 && !strcmp(G.msgs[255].content, "u255") &&
          !strcmp(G.msgs[254].role, "assistant"), "256 messages");
    snprintf(big + o, sizeof big - (size_t)o, " assistant=x user=y");
    GEN_FAILS(big, "too many messages (max 256)");
    o = snprintf(big, sizeof big, "GEN id=m chat=1 max_tokens=1 temperature=0 stop=a");
    for (int i = 0; i < PROTO_MAX_MSGS; i++) o += snprintf(big + o, sizeof big - (size_t)o, " user=%d", i);
    GEN_OK(big);
    CHECK(G.n_msgs == 256 && G.n_stops == 1 && G.max_tokens == 1, "256 user messages and other keys");
}

static void test_id_ok(void) {
    CHECK(proto_id_ok("a", 1) && proto_id_ok("A-z_0.9:", 8), "ok");
    CHECK(!proto_id_ok("", 0) && !proto_id_ok(NULL, 0), "empty");
    CHECK(!proto_id_ok("a b", 3) && !proto_id_ok("a/b", 3) && !proto_id_ok("a\"", 2), "chars");
    CHECK(!proto_id_ok("ab\0", 3) && proto_id_ok("ab\0", 2), "length is the count");
    char id[PROTO_ID_MAX + 1];
    memset(id, 'x', sizeof id);
    CHECK(proto_id_ok(id, PROTO_ID_MAX) && !proto_id_ok(id, PROTO_ID_MAX + 1), "max");
    for (int c = 0; c < 256; c++) {
        char s = (char)c;
        int want = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                   c == '.' || c == ':' || c == '-';
        CHECK(proto_id_ok(&s, 1) == want, "byte %d", c);
    }
}

/* ---------------------------------------------------------------- quoting */

/* proto_quote(s) must be want, and split back to s. */
static void quote_is(const char *s, size_t n, const char *want) {
    char out[256];
    int r = proto_quote(out, sizeof out, s, n);
    CHECK(r == (int)strlen(want) && !strcmp(out, want), "quote gave %d '%s', want '%s'", r, out, want);
}

/* Quote s, split `X <quoted>`, compare. s must be valid UTF-8 without NUL. */
static int round_trip(const char *s, size_t n) {
    size_t cap = PROTO_QUOTED_MAX(n) + 2;
    char *line = malloc(cap);
    if (!line) abort();
    line[0] = 'X', line[1] = ' ';
    int q = proto_quote(line + 2, cap - 2, s, n);
    int ok = q > 0 && splitn(line, (size_t)q + 2) == 0 && L.n_pos == 1 && L.pos[0].quoted &&
             L.pos[0].len == n && !memcmp(L.pos[0].s, s, n);
    free(line);
    return ok;
}

static void test_quote(void) {
    quote_is("", 0, "\"\"");
    quote_is("hello world", 11, "\"hello world\"");
    quote_is("a\"b\\c\nd\re\tf", 11, "\"a\\\"b\\\\c\\nd\\re\\tf\"");
    quote_is("\x01\x1f\x7f~", 4, "\"\\x01\\x1f\\x7f~\"");
    quote_is("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9, "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"");
    /* Invalid UTF-8 goes out byte by byte as \xHH; the valid part around it stays. */
    quote_is("\xff", 1, "\"\\xff\"");
    quote_is("a\xc3", 2, "\"a\\xc3\"");
    quote_is("\xc3(", 2, "\"\\xc3(\"");
    quote_is("\xc0\x80", 2, "\"\\xc0\\x80\"");
    quote_is("\xed\xa0\x80", 3, "\"\\xed\\xa0\\x80\"");
    quote_is("\xf4\x90\x80\x80", 4, "\"\\xf4\\x90\\x80\\x80\"");
    quote_is("\xe2\x82\xc3\xa9", 4, "\"\\xe2\\x82\xc3\xa9\"");
    quote_is("\x80\xc3\xa9", 3, "\"\\x80\xc3\xa9\"");
    quote_is("\0", 1, "\"\\x00\"");
    quote_is("=x y", 4, "\"=x y\"");

    /* Room: exactly enough works, one byte less does not, and never overflows. */
    char out[64];
    memset(out, '#', sizeof out);
    CHECK(proto_quote(out, 6, "abc", 3) == 5 && !strcmp(out, "\"abc\"") && out[6] == '#', "exact");
    memset(out, '#', sizeof out);
    CHECK(proto_quote(out, 5, "abc", 3) == -ENOSPC && out[0] == '\0' && out[5] == '#', "one short");
    CHECK(proto_quote(out, 2, "", 0) == -ENOSPC && proto_quote(out, 3, "", 0) == 2, "empty room");
    CHECK(proto_quote(out, 0, "a", 1) == -ENOSPC, "cap 0");
    CHECK(proto_quote(out, 8, "\xff", 1) == 6 && proto_quote(out, 7, "\xff", 1) == 6 &&
          proto_quote(out, 6, "\xff", 1) == -ENOSPC, "hex room");
    CHECK(proto_quote(out, 5, "\xc3\xa9", 2) == 4 && proto_quote(out, 4, "\xc3\xa9", 2) == -ENOSPC, "utf8 room");
    CHECK(proto_quote(out, 5, "\n", 1) == 4 && proto_quote(out, 4, "\n", 1) == -ENOSPC, "esc room");
    /* The worst case fits PROTO_QUOTED_MAX. */
    char worst[16], big[PROTO_QUOTED_MAX(16)];
    memset(worst, 0xff, sizeof worst);
    CHECK(proto_quote(big, sizeof big, worst, sizeof worst) == (int)sizeof big - 1, "worst case");

    /* Round trips. */
    static const char *fixed[] = {"", "plain", "\"", "\\", "\\\"", "a\nb\r\nc\td", "\x01\x02\x1f\x7f",
                                  "key=value \"quoted\"", "\xc3\xa9t\xc3\xa9", "\xef\xbf\xbf\xf4\x8f\xbf\xbf",
                                  "  spaces  ", "\xe2\x80\xa8\xe2\x80\xa9"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        CHECK(round_trip(fixed[i], strlen(fixed[i])), "round trip %zu: %s", i, err);
    /* Random valid UTF-8: code points from every length class, many ASCII specials. */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    char s[512];
    int bad = 0;
    for (int t = 0; t < 2000; t++) {
        size_t n = 0;
        int k = (int)(t % 100);
        for (int j = 0; j < k; j++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            uint32_t cp;
            switch (x % 5) {
            case 0: cp = 1 + (uint32_t)(x >> 8) % 0x7f; break;
            case 1: cp = "\"\\\n\r\t ="[(x >> 8) % 7]; break;
            case 2: cp = 0x80 + (uint32_t)(x >> 8) % (0x800 - 0x80); break;
            case 3: cp = 0x800 + (uint32_t)(x >> 8) % (0x10000 - 0x800); break;
            default: cp = 0x10000 + (uint32_t)(x >> 8) % (0x110000 - 0x10000); break;
            }
            if (cp >= 0xd800 && cp <= 0xdfff) cp = 0xfffd;
            if (cp < 0x80) s[n++] = (char)cp;
            else if (cp < 0x800) s[n++] = (char)(0xc0 | cp >> 6), s[n++] = (char)(0x80 | (cp & 0x3f));
            else if (cp < 0x10000)
                s[n++] = (char)(0xe0 | cp >> 12), s[n++] = (char)(0x80 | ((cp >> 6) & 0x3f)),
                s[n++] = (char)(0x80 | (cp & 0x3f));
            else
                s[n++] = (char)(0xf0 | cp >> 18), s[n++] = (char)(0x80 | ((cp >> 12) & 0x3f)),
                s[n++] = (char)(0x80 | ((cp >> 6) & 0x3f)), s[n++] = (char)(0x80 | (cp & 0x3f));
        }
        if (!round_trip(s, n)) bad++;
    }
    CHECK(bad == 0, "%d random round trips failed", bad);
    /* Invalid bytes are escaped, and the escape reads back as the same invalid byte,
     * which the splitter then refuses as UTF-8. */
    char line[32] = "X ";
    int q = proto_quote(line + 2, sizeof line - 2, "ok\xff", 3);
    CHECK(q == 8 && !strcmp(line + 2, "\"ok\\xff\""), "%s", line);
    CHECK(splitn(line, (size_t)q + 2) == -EINVAL && strstr(err, "col 6: invalid UTF-8"), "%s", err);
}

int main(void) {
    test_basic();
    test_split_errors();
    test_escapes();
    test_utf8();
    test_long();
    test_get();
    test_hello();
    test_gen_defaults();
    test_gen_all();
    test_gen_ranges();
    test_gen_strings();
    test_gen_conversation();
    test_id_ok();
    test_quote();
    free(g_buf);
    return check_done("test_proto");
}
