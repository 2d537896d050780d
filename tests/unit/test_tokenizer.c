/* test_tokenizer: the tokenizer on the real model (known encodings from Hugging Face
 * `tokenizers`, round trips, streaming decode, invalid UTF-8), synthetic byte-level and
 * SentencePiece vocabularies built in C, and the chat templates. MODEL overrides the
 * model path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/chat.h"
#include "core/gguf.h"
#include "core/prompt.h"
#include "core/tokenizer.h"
#include "tests/unit/check.h"

#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int ids_eq(const int32_t *a, int na, const int32_t *b, int nb) {
    return na == nb && memcmp(a, b, sizeof *a * (size_t)na) == 0;
}

/* all bytes of the ids, through tok_decode (raw, may split characters) */
static int decode_all(const tok_t *t, const int32_t *ids, int n, int special, char *out, int cap) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        int r = tok_decode(t, ids[i], special, out + k, cap - k);
        if (r < 0) return r;
        k += r;
    }
    return k;
}

/* through the incremental detokenizer; checks each push emits whole UTF-8 characters */
static int stream_all(const tok_t *t, const int32_t *ids, int n, char *out, int cap, int *partial_seen) {
    tok_stream s;
    tok_stream_init(&s, t, 0);
    char piece[1024];
    int k = 0;
    *partial_seen = 0;
    for (int i = 0; i < n; i++) {
        int r = tok_stream_push(&s, ids[i], piece, (int)sizeof piece);
        if (r < 0 || k + r > cap) return -1;
        char raw[256];
        int rl = tok_decode(t, ids[i], 0, raw, (int)sizeof raw);
        if (rl > 0 && r == 0) *partial_seen = 1; /* held back a partial character */
        if (r > 0) {
            unsigned char last = (unsigned char)piece[r - 1];
            CHECK(last < 0x80 || (last & 0xC0) == 0x80, "push %d ended with a lead byte 0x%02x", i, last);
        }
        memcpy(out + k, piece, (size_t)r);
        k += r;
    }
    int r = tok_stream_flush(&s, piece, (int)sizeof piece);
    if (r < 0 || k + r > cap) return -1;
    memcpy(out + k, piece, (size_t)r);
    return k + r;
}

/* ------------------------------------------------------------------ the real model */

static void test_model(const char *path) {
    gguf_file f;
    tok_t t;
    char err[256];
    if (gguf_open(&f, path) != 0) {
        CHECK(0, "cannot open %s: %s (set MODEL)", path, f.err);
        return;
    }
    int r = tok_init_gguf(&t, &f, err, sizeof err);
    CHECK(r == 0, "tok_init_gguf: %s", err);
    if (r != 0) {
        gguf_close(&f);
        return;
    }
    CHECK(tok_n_vocab(&t) == 49152, "n_vocab %d", tok_n_vocab(&t));
    CHECK(t.model == TOK_BPE && t.pre == TOK_PRE_SMOLLM, "model %d pre %d", t.model, t.pre);
    CHECK(tok_bos(&t) == 1 && tok_eos(&t) == 2, "bos %d eos %d", tok_bos(&t), tok_eos(&t));
    CHECK(t.add_bos == 0 && t.add_space_prefix == 0, "flags");
    CHECK(tok_is_eog(&t, 2) && tok_is_eog(&t, 0) && !tok_is_eog(&t, 1) && !tok_is_eog(&t, 198), "eog");

    /* known encodings: Hugging Face tokenizers with the GGUF's vocab (tok_parity.py) */
    static const struct {
        const char *text;
        int special;
        int32_t ids[40];
        int n;
    } known[] = {
        {"Hello world! It's 2024, I'M here.   x  1", 1,
         {19556, 905, 17, 657, 506, 216, 34, 32, 34, 36, 28, 339, 23, 61, 1535, 30, 256, 1792, 256, 33}, 20},
        {"<|im_start|>user\nHi<|im_end|>", 1, {1, 4093, 198, 26843, 2}, 5},
        {"<|im_start|>user\nHi<|im_end|>", 0,
         {44, 108, 306, 79, 3738, 108, 46, 4093, 198, 26843, 44, 108, 306, 79, 486, 108, 46}, 17},
        {"\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xef\xbc\x81\xf0\x9f\x91\xa8\xe2\x80\x8d"
         "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7\xe2\x80\x8d\xf0\x9f\x91\xa6 caf\xc3\xa9", 1,
         {18645, 250, 48392, 138, 12831, 7906, 240, 178, 239, 230, 8083, 219, 10813, 235, 118, 321,
          231, 10813, 235, 119, 321, 231, 10813, 235, 117, 321, 231, 10813, 235, 116, 37366}, 31},
        {"def f(x):\n    return x**2\n", 1, {1604, 275, 24, 104, 727, 472, 1003, 1792, 828, 34, 198}, 11},
        {" \t\n  \xc3\xbcn\xc3\xaf", 1, {216, 197, 3805, 5549, 137, 94, 25972}, 7},
        {"<|im_start", 1, {44, 108, 306, 79, 3738}, 5},
        {"", 1, {0}, 0},
    };
    int32_t ids[4096];
    char buf[8192];
    for (int i = 0; i < NELEM(known); i++) {
        int n = tok_encode(&t, known[i].text, strlen(known[i].text), known[i].special, ids, NELEM(ids));
        CHECK(ids_eq(ids, n, known[i].ids, known[i].n), "known encoding %d: got %d ids (first %d)", i, n,
              n > 0 ? ids[0] : -1);
    }

    /* round trips: raw bytes and the stream give back the text (no specials inside) */
    static const char *rt[] = {
        "The quick brown fox jumps over the lazy dog.",
        "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88",
        "\xf0\x9f\x91\x8b\xf0\x9f\x8f\xbd \xf0\x9f\x8f\xb3\xef\xb8\x8f\xe2\x80\x8d\xf0\x9f\x8c\x88 emoji",
        "    indented\n\t\ttabs\r\n\n  ",
        "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87",
        "9876543210123456789 + 3.14159 = ?!?!",
    };
    for (int i = 0; i < NELEM(rt); i++) {
        size_t len = strlen(rt[i]);
        int n = tok_encode(&t, rt[i], len, 1, ids, NELEM(ids));
        CHECK(n > 0, "encode rt %d", i);
        int k = decode_all(&t, ids, n, 0, buf, (int)sizeof buf);
        CHECK(k == (int)len && memcmp(buf, rt[i], len) == 0, "raw round trip %d", i);
        int partial;
        k = stream_all(&t, ids, n, buf, (int)sizeof buf, &partial);
        CHECK(k == (int)len && memcmp(buf, rt[i], len) == 0, "stream round trip %d", i);
        if (i == 1 || i == 2) CHECK(partial, "rt %d: expected a character split across tokens", i);
    }

    /* the stream on a character split across tokens: emoji 👨 is "ðŁ" "ĳ" "¨" */
    {
        int n = tok_encode(&t, "\xf0\x9f\x91\xa8", 4, 0, ids, NELEM(ids));
        CHECK(n == 3, "emoji tokens %d", n);
        tok_stream s;
        tok_stream_init(&s, &t, 0);
        char p[256];
        int a = tok_stream_push(&s, ids[0], p, (int)sizeof p);
        int b = tok_stream_push(&s, ids[1], p, (int)sizeof p);
        int c = tok_stream_push(&s, ids[2], p, (int)sizeof p);
        CHECK(a == 0 && b == 0 && c == 4 && memcmp(p, "\xf0\x9f\x91\xa8", 4) == 0, "split emoji %d %d %d", a, b, c);
        /* an incomplete leftover flushes as U+FFFD */
        tok_stream_init(&s, &t, 0);
        a = tok_stream_push(&s, ids[0], p, (int)sizeof p);
        b = tok_stream_flush(&s, p, (int)sizeof p);
        CHECK(a == 0 && b == 3 && memcmp(p, "\xef\xbf\xbd", 3) == 0, "flush leftover %d %d", a, b);
        CHECK(tok_stream_flush(&s, p, (int)sizeof p) == 0, "second flush is empty");
        /* a partial character interrupted by ASCII: U+FFFD, then the ASCII */
        tok_stream_init(&s, &t, 0);
        int32_t x = tok_find(&t, "x", 1);
        a = tok_stream_push(&s, ids[0], p, (int)sizeof p);
        b = tok_stream_push(&s, x, p, (int)sizeof p);
        CHECK(a == 0 && b == 4 && memcmp(p, "\xef\xbf\xbdx", 4) == 0, "interrupted %d %d", a, b);
        /* control tokens: hidden by default, rendered on request */
        tok_stream_init(&s, &t, 0);
        CHECK(tok_stream_push(&s, 1, p, (int)sizeof p) == 0, "control hidden");
        tok_stream_init(&s, &t, 1);
        a = tok_stream_push(&s, 1, p, (int)sizeof p);
        CHECK(a == 12 && memcmp(p, "<|im_start|>", 12) == 0, "control rendered %d", a);
        CHECK(tok_decode(&t, 2, 0, p, (int)sizeof p) == 0 && tok_decode(&t, 2, 1, p, (int)sizeof p) == 10,
              "tok_decode special flag");
        CHECK(tok_stream_push(&s, 49152, p, (int)sizeof p) == TOK_EINVAL, "bad id");
        CHECK(tok_stream_push(&s, 1, p, 4) == TOK_ESPACE, "small cap");
    }

    /* invalid UTF-8: no crash, every byte survives the raw round trip, the stream repairs */
    {
        static const char bad[] = "a\xff\xfe b\xc3 \xe2\x82x \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf\x80" "end\xf0\x9f";
        size_t len = sizeof bad - 1;
        for (int sp = 0; sp < 2; sp++) {
            int n = tok_encode(&t, bad, len, sp, ids, NELEM(ids));
            CHECK(n > 0 && n <= (int)len, "invalid utf8 encode %d", n);
            int k = decode_all(&t, ids, n, 0, buf, (int)sizeof buf);
            /* bytes the vocabulary lacks (0xC0, 0xFE, 0xFF, ...) are dropped, as HF does */
            char kept[64];
            int nk = 0;
            for (size_t i = 0; i < len; i++)
                if (t.byte_tok[(unsigned char)bad[i]] >= 0) kept[nk++] = bad[i];
            CHECK(nk < (int)len && k == nk && memcmp(buf, kept, (size_t)nk) == 0, "invalid utf8 raw round trip");
        }
        int n = tok_encode(&t, "!\x04!", 3, 0, ids, NELEM(ids));
        CHECK(n == 1 && ids[0] == 10095, "missing byte dropped, neighbours merge (%d)", n);
        n = tok_encode(&t, "\xe2\x82x\x80", 4, 0, ids, NELEM(ids));
        int partial;
        int k = stream_all(&t, ids, n, buf, (int)sizeof buf, &partial);
        CHECK(k == 7 && memcmp(buf, "\xef\xbf\xbdx\xef\xbf\xbd", 7) == 0, "stream repairs bad bytes (%d)", k);
    }

    /* out too small; NULL text with len 0 */
    CHECK(tok_encode(&t, "hello world", 11, 0, ids, 1) == TOK_ESPACE, "ESPACE");
    CHECK(tok_encode(&t, NULL, 0, 0, ids, 4) == 0, "empty");
    /* a pre-token longer than TOK_WORD_MAX (heap scratch path) */
    {
        static char longw[4000];
        memset(longw, ' ', 3000);
        memcpy(longw + 3000, "ab", 3);
        int n = tok_encode(&t, longw, strlen(longw), 0, ids, NELEM(ids));
        int k = decode_all(&t, ids, n, 0, buf, (int)sizeof buf);
        CHECK(n > 0 && k == 3002 && memcmp(buf, longw, 3002) == 0, "long word %d %d", n, k);
    }
    /* speed: a ~2,000-token prompt well under 10 ms (loose bound: sanitizer builds) */
    {
        static char big[16384];
        size_t k = 0;
        while (k + 200 < sizeof big) {
            for (int i = 0; i < NELEM(rt) && k + 200 < sizeof big; i++) {
                size_t l = strlen(rt[i]);
                memcpy(big + k, rt[i], l);
                k += l;
            }
        }
        static int32_t many[16384];
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        int n = tok_encode(&t, big, k, 1, many, NELEM(many));
        clock_gettime(CLOCK_MONOTONIC, &b);
        double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
        printf("tokenizer: %zu bytes -> %d tokens in %.2f ms\n", k, n, ms);
        CHECK(n > 2000 && ms < 100.0, "speed: %d tokens in %.2f ms", n, ms);
    }

    /* chat template of the model */
    CHECK(chat_detect(&f) == CHAT_SMOLLM, "chat_detect %d", chat_detect(&f));
    tok_free(&t);
    gguf_close(&f);
}

/* ------------------------------------------------------------------ synthetic byte-level BPE */

static int bl_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

static void test_synthetic_bpe(void) {
    static char bytes[256][4];
    const char *toks[300];
    int32_t types[300];
    int n = 0, extra = 0;
    for (int b = 0; b < 256; b++) {
        unsigned cp = (unsigned)b;
        if (!bl_printable(b)) {
            cp = 256;
            for (int x = 0; x < b; x++) cp += !bl_printable(x);
        }
        if (cp < 0x80) bytes[b][0] = (char)cp;
        else bytes[b][0] = (char)(0xC0 | (cp >> 6)), bytes[b][1] = (char)(0x80 | (cp & 0x3F));
        toks[n] = bytes[b], types[n++] = TOK_NORMAL;
    }
    const char *more[] = {"he", "ll", "hell", "hello", "\xc4\xa0w", "or", "\xc4\xa0wor", "ld", "\xc4\xa0world",
                          "<|im_start|>", "<|im_end|>", "<think>"};
    for (int i = 0; i < NELEM(more); i++) toks[n] = more[i], types[n++] = i >= 11 ? TOK_USER : i >= 9 ? TOK_CONTROL : TOK_NORMAL, extra++;
    const char *merges[] = {"h e", "l l", "he ll", "hell o", "\xc4\xa0 w", "o r", "\xc4\xa0w or", "l d", "\xc4\xa0wor ld",
                            "x y" /* not in vocab: ignored */};
    tok_spec s = {TOK_BPE, "gpt2", n, NELEM(merges), toks, types, NULL, merges, -1, 256 + 10, -1, 0, 0};
    tok_t t;
    char err[128];
    CHECK(tok_init(&t, &s, err, sizeof err) == 0, "tok_init bpe: %s", err);
    CHECK(t.n_merges == 9, "merges %d", t.n_merges);
    int32_t ids[64];
    int k = tok_encode(&t, "hello world", 11, 0, ids, 64);
    int32_t want[] = {256 + 3, 256 + 8};
    CHECK(ids_eq(ids, k, want, 2), "hello world -> %d ids", k);
    k = tok_encode(&t, "<|im_start|>hello<think>", 24, 1, ids, 64);
    int32_t want2[] = {256 + 9, 256 + 3, 256 + 11};
    CHECK(ids_eq(ids, k, want2, 3), "specials -> %d ids", k);
    k = tok_encode(&t, "<think>", 7, 0, ids, 64);
    CHECK(k == 7, "user token as text without parse_special: %d", k);
    CHECK(tok_is_eog(&t, 256 + 10), "eog by eos id");
    char p[64];
    CHECK(tok_decode(&t, 256 + 11, 0, p, 64) == 7, "user tokens always render");
    tok_free(&t);
}

/* ------------------------------------------------------------------ synthetic SentencePiece */

static void test_synthetic_spm(void) {
    static char bytes[256][8];
    const char *toks[300];
    int32_t types[300];
    float scores[300];
    int n = 0;
    toks[n] = "<unk>", types[n] = TOK_UNKNOWN, scores[n++] = 0;
    toks[n] = "<s>", types[n] = TOK_CONTROL, scores[n++] = 0;
    toks[n] = "</s>", types[n] = TOK_CONTROL, scores[n++] = 0;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[n] = bytes[b], types[n] = TOK_BYTE, scores[n++] = 0;
    }
    /* id 259.. */
    static const struct { const char *s; float sc; } v[] = {
        {"\xe2\x96\x81", -1}, {"h", -2}, {"e", -2}, {"l", -2}, {"o", -2}, {"w", -2}, {"r", -2}, {"d", -2},
        {"he", -3}, {"ll", -4}, {"llo", -5}, {"hello", -6}, {"\xe2\x96\x81hello", -7}, {"or", -3},
        {"\xe2\x96\x81w", -4}, {"\xe2\x96\x81wor", -5}, {"ld", -6}, {"\xe2\x96\x81world", -7},
        {"\xe2\x96\x81\xe2\x96\x81", -8},
    };
    for (int i = 0; i < NELEM(v); i++) toks[n] = v[i].s, types[n] = TOK_NORMAL, scores[n++] = v[i].sc;
    enum { SP = 259, H, E, L, O, W, R, D, HE, LL, LLO, HELLO, SPHELLO, OR, SPW, SPWOR, LD, SPWORLD, SPSP };
    tok_spec s = {TOK_SPM, NULL, n, 0, toks, types, scores, NULL, 1, 2, 0, 1, 1};
    tok_t t;
    char err[128];
    CHECK(tok_init(&t, &s, err, sizeof err) == 0, "tok_init spm: %s", err);
    CHECK(t.byte_tok[0x41] == 3 + 0x41 && !t.spm_whole, "byte tokens");
    int32_t ids[64];
    int k = tok_encode(&t, "hello world", 11, 0, ids, 64);
    int32_t w1[] = {SPHELLO, SPWORLD};
    CHECK(ids_eq(ids, k, w1, 2), "spm hello world: %d ids, %d %d", k, ids[0], ids[1]);
    /* byte fallback: é and ! are not in the vocabulary */
    k = tok_encode(&t, "he\xc3\xa9!", 5, 0, ids, 64);
    int32_t w2[] = {SP, HE, 3 + 0xC3, 3 + 0xA9, 3 + '!'};
    CHECK(ids_eq(ids, k, w2, 5), "spm byte fallback: %d ids", k);
    /* runs of spaces, and the prefix after a special token */
    k = tok_encode(&t, "hello  world", 12, 0, ids, 64);
    int32_t w3[] = {SPHELLO, SP, SPWORLD};
    CHECK(ids_eq(ids, k, w3, 3), "spm double space: %d ids", k);
    k = tok_encode(&t, "hello<s>world", 13, 1, ids, 64);
    int32_t w4[] = {SPHELLO, 1, SPWORLD};
    CHECK(ids_eq(ids, k, w4, 3), "spm prefix after special: %d ids", k);
    /* decoding: ▁ is a space, <0xXX> a byte, the stream drops the first leading space */
    char p[64], out[256];
    CHECK(tok_decode(&t, SPHELLO, 0, p, 64) == 6 && memcmp(p, " hello", 6) == 0, "spm piece");
    CHECK(tok_decode(&t, 3 + 0xC3, 0, p, 64) == 1 && (unsigned char)p[0] == 0xC3, "spm byte piece");
    int32_t seq[] = {SPHELLO, SP, HE, 3 + 0xC3, 3 + 0xA9, SPWORLD, 2};
    int partial;
    k = stream_all(&t, seq, NELEM(seq), out, (int)sizeof out, &partial);
    CHECK(k == 16 && memcmp(out, "hello he\xc3\xa9 world", 16) == 0 && partial, "spm stream (%d)", k);
    CHECK(tok_is_eog(&t, 2) && !tok_is_eog(&t, 1), "spm eog");
    tok_free(&t);

    /* a piece with '▁' after another character: fragments are not split into words */
    const char *extra[] = {"a", "b", "a\xe2\x96\x81", ("a\xe2\x96\x81" "b")};
    n = 3 + 256 + 1;
    for (int i = 0; i < NELEM(extra); i++) toks[n] = extra[i], types[n] = TOK_NORMAL, scores[n++] = -(float)(4 - i);
    tok_spec s2 = {TOK_SPM, NULL, n, 0, toks, types, scores, NULL, 1, 2, 0, 1, 0};
    CHECK(tok_init(&t, &s2, err, sizeof err) == 0 && t.spm_whole, "spm_whole: %s", err);
    k = tok_encode(&t, "a b", 3, 0, ids, 64);
    CHECK(k == 1 && ids[0] == n - 1, "spm merge across a space: %d ids", k);
    (void)H, (void)E, (void)L, (void)O, (void)W, (void)R, (void)D, (void)LL, (void)LLO, (void)HELLO;
    (void)OR, (void)SPW, (void)SPWOR, (void)LD, (void)SPSP;
    tok_free(&t);
}

/* ------------------------------------------------------------------ synthetic Gemma 4 */

/* BPE over characters with ' ' read as '▁', words split only at newline runs, <0xXX>
 * bytes for characters the vocabulary lacks (llama.cpp's ggml-vocab-gemma-4 shape) */
static void test_synthetic_gemma4(void) {
    static char bytes[256][8];
    const char *toks[300];
    int32_t types[300];
    int n = 0;
    toks[n] = "<pad>", types[n++] = TOK_CONTROL;
    toks[n] = "<eos>", types[n++] = TOK_CONTROL;
    toks[n] = "<bos>", types[n++] = TOK_CONTROL;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[n] = bytes[b], types[n++] = TOK_BYTE;
    }
    const char *v[] = {"\xe2\x96\x81", "h", "i", "hi", "\xe2\x96\x81hi", "\n", "\n\n", "\xc3\xa9", "\xe2\x96\x81\xe2\x96\x81"};
    for (int i = 0; i < NELEM(v); i++) toks[n] = v[i], types[n++] = TOK_NORMAL;
    enum { SP = 259, H, I, HI, SPHI, NL, NL2, EACUTE, SPSP };
    const char *merges[] = {"h i", "\xe2\x96\x81 hi", "\xe2\x96\x81 \xe2\x96\x81"};
    tok_spec s = {TOK_BPE, "gemma4", n, NELEM(merges), toks, types, NULL, merges, 2, 1, -1, 1, 0};
    tok_t t;
    char err[128];
    CHECK(tok_init(&t, &s, err, sizeof err) == 0, "tok_init gemma4: %s", err);
    CHECK(t.pre == TOK_PRE_GEMMA4 && t.byte_tok['x'] == 3 + 'x', "gemma4 byte tokens are <0xXX>");
    int32_t ids[64];
    /* merges run across spaces (no word split); "\n\n\n" is no token: one per character */
    const char *text = "hi hi\n\n\n  x\xe2\x82\xac\n\n\xc3\xa9";
    int k = tok_encode(&t, text, strlen(text), 0, ids, 64);
    int32_t w1[] = {HI, SPHI, NL, NL, NL, SPSP, 3 + 'x', 3 + 0xE2, 3 + 0x82, 3 + 0xAC, NL2, EACUTE};
    CHECK(ids_eq(ids, k, w1, NELEM(w1)), "gemma4 encode: %d ids", k);
    /* an invalid byte is a character of its own: its byte token */
    k = tok_encode(&t, "h\xffi", 3, 0, ids, 64);
    int32_t w2[] = {H, 3 + 0xFF, I};
    CHECK(ids_eq(ids, k, w2, NELEM(w2)), "gemma4 invalid byte: %d ids", k);
    char p[64];
    CHECK(tok_decode(&t, SPHI, 0, p, 64) == 3 && memcmp(p, " hi", 3) == 0, "gemma4 piece: '▁' is a space");
    CHECK(tok_decode(&t, 3 + 0xE2, 0, p, 64) == 1 && (unsigned char)p[0] == 0xE2, "gemma4 byte piece");
    char out[256];
    int32_t seq[] = {HI, SPHI, SPSP, 3 + 0xE2, 3 + 0x82, 3 + 0xAC};
    int partial;
    k = stream_all(&t, seq, NELEM(seq), out, (int)sizeof out, &partial);
    CHECK(k == 10 && memcmp(out, "hi hi  \xe2\x82\xac", 10) == 0, "gemma4 stream keeps the first space (%d)", k);
    (void)SP;
    tok_free(&t);
}

/* Qwen3.5's pre-tokenizer counts combining marks (\p{M}) as letters: "e" + U+0301 + "x"
 * is one word there, three pieces for Qwen2 (a merge across them shows which) */
static void test_qwen35_marks(void) {
    static char bytes[256][4];
    const char *toks[260];
    int n = 0;
    for (int b = 0; b < 256; b++) {
        unsigned cp = (unsigned)b;
        if (!bl_printable(b)) {
            cp = 256;
            for (int x = 0; x < b; x++) cp += !bl_printable(x);
        }
        if (cp < 0x80) bytes[b][0] = (char)cp;
        else bytes[b][0] = (char)(0xC0 | (cp >> 6)), bytes[b][1] = (char)(0x80 | (cp & 0x3F));
        toks[n++] = bytes[b];
    }
    toks[n++] = "e\xc3\x8c"; /* 'e' + the byte 0xCC (U+0301's lead byte, byte-level 'Ì') */
    const char *merges[] = {"e \xc3\x8c"};
    const char *text = "e\xcc\x81x";
    int32_t ids[16];
    const char *pres[] = {"qwen35", "qwen2"};
    for (int v = 0; v < 2; v++) {
        tok_spec s = {TOK_BPE, pres[v], n, 1, toks, NULL, NULL, merges, -1, -1, -1, 0, 0};
        tok_t t;
        char err[128];
        CHECK(tok_init(&t, &s, err, sizeof err) == 0, "tok_init %s: %s", pres[v], err);
        int k = tok_encode(&t, text, strlen(text), 0, ids, 16);
        int merged = k == 3 && ids[0] == 256;
        CHECK(v == 0 ? merged : k == 4, "%s: 'e' and the mark %s (%d ids)", pres[v], v == 0 ? "merge" : "do not", k);
        tok_free(&t);
    }
}

/* a BPE pre-tokenizer kiln does not implement is refused by name, not run as GPT-2's */
static void test_unknown_pre(void) {
    const char *toks[] = {"a", "b", "ab"};
    const char *merges[] = {"a b"};
    tok_spec s = {TOK_BPE, "falcon", 3, 1, toks, NULL, NULL, merges, -1, -1, -1, 0, 0};
    tok_t t;
    char err[256] = "";
    CHECK(tok_init(&t, &s, err, sizeof err) == TOK_EINVAL && strstr(err, "tokenizer.ggml.pre") && strstr(err, "falcon"),
          "unknown pre refused: %s", err);
    CHECK(t.mem == NULL, "nothing kept");
    s.pre = "gpt-2";
    CHECK(tok_init(&t, &s, err, sizeof err) == 0, "gpt-2 is GPT-2's: %s", err);
    tok_free(&t);
    const char *spm[] = {"<unk>", "a"};
    tok_spec s2 = {TOK_SPM, "default", 2, 0, spm, NULL, NULL, NULL, -1, -1, 0, 0, 1};
    CHECK(tok_init(&t, &s2, err, sizeof err) == 0, "SentencePiece ignores pre: %s", err);
    tok_free(&t);
}

/* ------------------------------------------------------------------ chat templates */

static void test_chat(void) {
    CHECK(chat_detect_text("{{'<|im_start|>' + m}}", 22) == CHAT_CHATML, "detect chatml");
    CHECK(chat_detect_text("<|start_header_id|>", 19) == CHAT_LLAMA3, "detect llama3");
    CHECK(chat_detect_text("[INST]", 6) == CHAT_UNKNOWN, "detect unknown");
    chat_msg a[] = {{"user", "Hello!"}, {"assistant", "Hi there."}, {"user", "  What is 2+2?\n\n"}};
    chat_msg b[] = {{"system", "Be terse.\n"}, {"user", "\t\xe3\x80\x80Why? \xc2\xa0"}};
    char out[2048];
    /* expected strings rendered by jinja2 from the real templates */
    int n = chat_format(CHAT_SMOLLM, a, 3, 1, out, sizeof out);
    const char *e1 = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                     "<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\nHi there.<|im_end|>\n"
                     "<|im_start|>user\n  What is 2+2?\n\n<|im_end|>\n<|im_start|>assistant\n";
    CHECK(n == (int)strlen(e1) && strcmp(out, e1) == 0, "smollm chat (%d): %s", n, out);
    n = chat_format(CHAT_SMOLLM, b, 2, 0, out, sizeof out);
    const char *e2 = "<|im_start|>system\nBe terse.\n<|im_end|>\n<|im_start|>user\n\t\xe3\x80\x80Why? \xc2\xa0<|im_end|>\n";
    CHECK(n == (int)strlen(e2) && strcmp(out, e2) == 0, "smollm with system (%d)", n);
    n = chat_format(CHAT_SMOLLM, a, 0, 1, out, sizeof out);
    CHECK(n > 0 && strcmp(out, "<|im_start|>assistant\n") == 0, "no messages");
    n = chat_format(CHAT_CHATML, a, 1, 1, out, sizeof out);
    CHECK(n > 0 && strcmp(out, "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n") == 0, "chatml");
    n = chat_format(CHAT_LLAMA3, a, 3, 1, out, sizeof out);
    const char *e3 = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\nHi there.<|eot_id|>"
                     "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
                     "<|start_header_id|>assistant<|end_header_id|>\n\n";
    CHECK(n == (int)strlen(e3) && strcmp(out, e3) == 0, "llama3 chat (%d): %s", n, out);
    n = chat_format(CHAT_LLAMA3, b, 2, 0, out, sizeof out);
    const char *e4 = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe terse.<|eot_id|>"
                     "<|start_header_id|>user<|end_header_id|>\n\nWhy?<|eot_id|>";
    CHECK(n == (int)strlen(e4) && strcmp(out, e4) == 0, "llama3 trim (%d): %s", n, out);
    CHECK(chat_format(CHAT_SMOLLM, a, 3, 1, out, 20) == CHAT_ESPACE, "chat ESPACE");
    CHECK(chat_format(CHAT_SMOLLM, a, 3, 1, out, strlen(e1)) == CHAT_ESPACE, "chat needs room for NUL");
    CHECK(chat_format(CHAT_UNKNOWN, a, 3, 1, out, sizeof out) == CHAT_EINVAL, "chat unknown kind");
}

/* the families' templates: expected bytes are Jinja2's renderings of the real templates
 * (tests/ref/chat_parity.py checks many more conversations the same way) */
static void test_chat_families(void) {
    chat_msg c1[] = {{"system", "Be terse."}, {"user", " Hi\n"}, {"assistant", "<think>\nhm\n</think>\n\nHello."},
                     {"user", "2+2?"}};
    chat_msg c2[] = {{"user", " Hi\n"}, {"assistant", "<think>\nhm\n</think>\n\nHello."}};
    chat_msg c3[] = {{"system", " Be terse. "}, {"user", " Hi\n"}, {"assistant", " <|channel>thought\nhm<channel|>Hello. "},
                     {"tool", " 42 "}, {"assistant", "More."}};
    static const struct {
        int kind, conv; /* conv: 1 = c1, 2 = c2, 3 = c3 */
        const char *want; /* NULL: refused */
    } cases[] = {
        {CHAT_QWEN3, 1, "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\n Hi\n<|im_end|>\n<|im_start|>assistant\n"
                        "Hello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"},
        {CHAT_QWEN3, 2, "<|im_start|>user\n Hi\n<|im_end|>\n<|im_start|>assistant\n<think>\nhm\n</think>\n\nHello.<|im_end|>\n"
                        "<|im_start|>assistant\n"},
        {CHAT_QWEN3_NOTHINK, 2, "<|im_start|>user\n Hi\n<|im_end|>\n<|im_start|>assistant\n<think>\nhm\n</think>\n\nHello."
                                "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"},
        {CHAT_GEMMA, 1, "<bos><start_of_turn>user\nBe terse.\n\nHi<end_of_turn>\n<start_of_turn>model\n<think>\nhm\n</think>\n\n"
                        "Hello.<end_of_turn>\n<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n"},
        {CHAT_GEMMA, 2, "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n<think>\nhm\n</think>\n\nHello."
                        "<end_of_turn>\n<start_of_turn>model\n"},
        {CHAT_PHI3, 1, "<|system|>\nBe terse.<|end|>\n<|user|>\n Hi\n<|end|>\n<|assistant|>\n<think>\nhm\n</think>\n\nHello."
                       "<|end|>\n<|user|>\n2+2?<|end|>\n<|assistant|>\n"},
        {CHAT_PHI4, 1, "<|im_start|>system<|im_sep|>Be terse.<|im_end|><|im_start|>user<|im_sep|> Hi\n<|im_end|>"
                       "<|im_start|>assistant<|im_sep|><think>\nhm\n</think>\n\nHello.<|im_end|><|im_start|>user<|im_sep|>"
                       "2+2?<|im_end|><|im_start|>assistant<|im_sep|>"},
        {CHAT_PHI3_LEGACY, 2, "<s><|user|>\n Hi\n<|end|>\n<|assistant|>\n<think>\nhm\n</think>\n\nHello.<|end|>\n"},
        {CHAT_MISTRAL_TEKKEN, 1, "<s>[INST] Hi\n[/INST]<think>\nhm\n</think>\n\nHello.</s>[INST]Be terse.\n\n2+2?[/INST]"},
        {CHAT_MISTRAL_TEKKEN, 2, "<s>[INST] Hi\n[/INST]<think>\nhm\n</think>\n\nHello.</s>"},
        {CHAT_GRANITE3, 2, "<|start_of_role|>system<|end_of_role|>Knowledge Cutoff Date: April 2024. Today's Date: December 02, "
                           "2025. You are Granite, developed by IBM. You are a helpful AI assistant.<|end_of_text|>\n"
                           "<|start_of_role|>user<|end_of_role|> Hi\n<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>"
                           "<think>\nhm\n</think>\n\nHello.<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>"},
        {CHAT_LLAMA31, 1, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                          "Today Date: 26 Jul 2024\n\nBe terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                          "<|start_header_id|>assistant<|end_header_id|>\n\n<think>\nhm\n</think>\n\nHello.<|eot_id|>"
                          "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
        {CHAT_LLAMA32, 2, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                          "Today Date: 02 Dec 2025\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                          "<|start_header_id|>assistant<|end_header_id|>\n\n<think>\nhm\n</think>\n\nHello.<|eot_id|>"
                          "<|start_header_id|>assistant<|end_header_id|>\n\n"},
        {CHAT_MISTRAL_SMALL3, 1, "<s>[SYSTEM_PROMPT]Be terse.[/SYSTEM_PROMPT][INST] Hi\n[/INST]<think>\nhm\n</think>\n\nHello.</s>"
                                 "[INST]2+2?[/INST]"},
        {CHAT_MISTRAL_SMALL3, 3, NULL}, /* assistant twice (the tool turn aside), and tool results need ids */
        {CHAT_DEVSTRAL, 1, "<s>[SYSTEM_PROMPT]Be terse.[/SYSTEM_PROMPT][INST] Hi\n[/INST]<think>\nhm\n</think>\n\nHello.</s>"
                           "[INST]2+2?[/INST]"},
        {CHAT_DEVSTRAL, 3, "<s>[SYSTEM_PROMPT] Be terse. [/SYSTEM_PROMPT][INST] Hi\n[/INST] <|channel>thought\nhm<channel|>Hello. "
                           "</s>[TOOL_RESULTS] 42 [/TOOL_RESULTS]More.</s>"},
        {CHAT_MINISTRAL3, 1, "<s>[SYSTEM_PROMPT]Be terse.[/SYSTEM_PROMPT][INST] Hi\n[/INST]<think>\nhm\n</think>\n\nHello.</s>"
                             "[INST]2+2?[/INST]"},
        {CHAT_MINISTRAL3, 3, NULL}, /* assistant twice */
        {CHAT_GEMMA4, 1, "<bos><|turn>system\nBe terse.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n<think>\nhm\n</think>\n\n"
                         "Hello.<turn|>\n<|turn>user\n2+2?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"},
        {CHAT_GEMMA4, 3, "<bos><|turn>system\nBe terse.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello.<turn|>\nMore.<turn|>\n"
                         "<|turn>model\n<|channel>thought\n<channel|>"},
        {CHAT_GEMMA4_INTERLEAVED, 3, "<bos><|turn>system\nBe terse.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello.<turn|>\n"
                                     "<|turn>tool\n42<turn|>\n<|turn>model\nMore.<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"},
    };
    char out[2048];
    const int64_t noon = 1764676800; /* 2025-12-02 12:00 UTC */
    for (int i = 0; i < NELEM(cases); i++) {
        const chat_msg *m = cases[i].conv == 1 ? c1 : cases[i].conv == 2 ? c2 : c3;
        int nm = cases[i].conv == 1 ? NELEM(c1) : cases[i].conv == 2 ? NELEM(c2) : NELEM(c3);
        int n = chat_format_at(cases[i].kind, m, nm, 1, noon, out, sizeof out);
        const char *want = cases[i].want;
        CHECK(want ? n == (int)strlen(want) && strcmp(out, want) == 0 : n == CHAT_EINVAL, "%s conversation %d (%d): %s",
              chat_name(cases[i].kind), cases[i].conv, n, n > 0 ? out : "");
    }
    /* what the templates refuse, kiln refuses; Gemma 2's refusal of a system message is
     * the one kiln does not copy (Gemma 3 folds it, as above) */
    chat_msg two_users[] = {{"user", "a"}, {"user", "b"}};
    chat_msg tool[] = {{"user", "a"}, {"tool", "42"}};
    CHECK(chat_format(CHAT_GEMMA, two_users, 2, 1, out, sizeof out) == CHAT_EINVAL, "gemma: roles must alternate");
    CHECK(chat_format(CHAT_MISTRAL_TEKKEN, two_users, 2, 1, out, sizeof out) == CHAT_EINVAL, "mistral: roles alternate");
    CHECK(chat_format(CHAT_MISTRAL_TEKKEN, tool, 2, 1, out, sizeof out) == CHAT_EINVAL, "mistral: no tool ids");
    /* Qwen3/Qwen2.5 tool results: one user turn of <tool_response> blocks */
    chat_msg tools[] = {{"user", "a"}, {"tool", "1"}, {"tool", "2"}};
    const char *wt = "<|im_start|>user\na<|im_end|>\n<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n"
                     "2\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
    int n = chat_format(CHAT_QWEN3, tools, 3, 1, out, sizeof out);
    CHECK(n == (int)strlen(wt) && strcmp(out, wt) == 0, "qwen3 tool results (%d): %s", n, out);
    /* Llama 3.1 tool results are ipython turns holding a JSON string */
    chat_msg ipy[] = {{"tool", "say \"hi\"\n\x01"}};
    n = chat_format(CHAT_LLAMA31, ipy, 1, 0, out, sizeof out);
    CHECK(n > 0 && strstr(out, "<|start_header_id|>ipython<|end_header_id|>\n\n\"say \\\"hi\\\"\\n\\u0001\"<|eot_id|>"),
          "llama3.1 ipython json (%d): %s", n, out);
    CHECK(chat_format_at(CHAT_GRANITE3, c2, 2, 1, noon, out, 100) == CHAT_ESPACE, "granite ESPACE");
    CHECK(chat_format_at(CHAT_GEMMA4, c3, NELEM(c3), 1, noon, out, 60) == CHAT_ESPACE, "gemma4 ESPACE");
    CHECK(chat_format(CHAT_MINISTRAL3, c2, 0, 1, out, sizeof out) == CHAT_EINVAL, "ministral3: no messages");
    chat_msg later_sys[] = {{"user", "a"}, {"system", "s"}};
    chat_msg empty_answer[] = {{"user", "a"}, {"assistant", ""}};
    CHECK(chat_format(CHAT_MINISTRAL3, later_sys, 2, 1, out, sizeof out) == CHAT_EINVAL, "ministral3: one system message");
    CHECK(chat_format(CHAT_MINISTRAL3, empty_answer, 2, 1, out, sizeof out) == CHAT_EINVAL, "ministral3: empty answer");
    CHECK(chat_format(CHAT_DEVSTRAL, tool, 2, 1, out, sizeof out) > 0, "devstral: tool results");
    chat_msg odd_role[] = {{"user", "a"}, {"ipython", "b"}};
    CHECK(chat_format(CHAT_DEVSTRAL, odd_role, 2, 1, out, sizeof out) == CHAT_EINVAL, "devstral: no other roles");

    /* Mistral's default system message comes from the template's own text, the caller's
     * system message replaces it; its markup is the template's (no span), the caller's is */
    const char *tmpl = "{%- set today = strftime_now(\"%Y-%m-%d\") %}\n{%- set default_system_message = 'It\\'s '"
                       " + today + \".\\n\\\"q\\\" \\u00e9\\x21\\z\" %}";
    char dflt[128];
    n = chat_default_system(tmpl, strlen(tmpl), noon, dflt, sizeof dflt);
    const char *wd = "It's 2025-12-02.\n\"q\" \xc3\xa9!\\z";
    CHECK(n == (int)strlen(wd) && strcmp(dflt, wd) == 0, "default system (%d): %s", n, dflt);
    CHECK(chat_default_system(tmpl, strlen(tmpl), noon, dflt, 8) == CHAT_ESPACE, "default system ESPACE");
    const char *unread = "{%- set default_system_message = name | upper %}";
    CHECK(chat_default_system(unread, strlen(unread), noon, dflt, sizeof dflt) == 0 && !dflt[0], "default system unread");
    CHECK(chat_default_system("{{ bos_token }}", 15, noon, dflt, sizeof dflt) == 0, "no default system");
    chat_msg hi[] = {{"user", "Hi"}};
    size_t sp[8];
    int nsp = 0;
    n = chat_format_dflt(CHAT_MISTRAL_SMALL3, "[THINK]D", hi, 1, 1, noon, out, sizeof out, sp, 4, &nsp);
    CHECK(n > 0 && strcmp(out, "<s>[SYSTEM_PROMPT][THINK]D[/SYSTEM_PROMPT][INST]Hi[/INST]") == 0 && nsp == 1 &&
              sp[0] == strlen("<s>[SYSTEM_PROMPT][THINK]D[/SYSTEM_PROMPT][INST]") && sp[1] == sp[0] + 2,
          "mistral default system (%d, %d spans): %s", n, nsp, out);
    n = chat_format_dflt(CHAT_MINISTRAL3, "D", c1, NELEM(c1), 1, noon, out, sizeof out, NULL, 0, NULL);
    CHECK(n > 0 && strncmp(out, "<s>[SYSTEM_PROMPT]Be terse.[/SYSTEM_PROMPT]", 43) == 0, "the caller's system wins: %s", out);
    CHECK(chat_format(CHAT_MISTRAL_SMALL3, hi, 1, 1, out, sizeof out) > 0 && strcmp(out, "<s>[INST]Hi[/INST]") == 0,
          "no default known: no system block: %s", out);

    /* detection from the templates' own text; kiln.ini names */
    static const struct {
        const char *text;
        int kind;
    } det[] = {
        {"{%- if messages[0].role == 'system' %}<|im_start|>{% set reasoning_content = '' %}{% set ns.last_query_index %}"
         "{%- if enable_thinking is defined and enable_thinking is false %}", CHAT_QWEN3},
        {"{{ bos_token }}<|im_start|> reasoning_content enable_thinking ns.last_query_index", CHAT_CHATML},
        {"{{ '<start_of_turn>' + role + '\n' }}", CHAT_GEMMA},
        {"{{'<|system|>\n'}}<|user|><|assistant|><|end|>{% if add_generation_prompt %}{{ eos_token }}", CHAT_PHI3},
        {"{{ bos_token }}<|user|><|end|><|assistant|>", CHAT_PHI3_LEGACY},
        {"<|user|><|end|><|assistant|>{{ tools }}", CHAT_UNKNOWN},
        {"{%- if loop.last and system_message is defined %}{{- \"[INST]\" + system_message + \"\\n\\n\" }}", CHAT_MISTRAL_TEKKEN},
        {"[SYSTEM_PROMPT][INST]", CHAT_UNKNOWN},
        {"{{- '[SYSTEM_PROMPT]' + system_prompt + '[/SYSTEM_PROMPT]' }} conversation roles must alternate user/assistant"
         " [CALL_ID]", CHAT_MISTRAL_SMALL3},
        {"{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}{{- \"[TOOL_RESULTS]\" + content|string }}",
         CHAT_DEVSTRAL},
        {"'[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' \"[TOOL_RESULTS]\" + content|string must alternate",
         CHAT_UNKNOWN},
        {"{{- '[SYSTEM_PROMPT]' -}} roles must alternate user and assistant roles Assistant message must have "
         "'[TOOL_RESULTS]' + message['content']|string", CHAT_MINISTRAL3},
        {"{{- '<|turn>' + role + '\n' }}<turn|> strip_thinking continue_same_model_turn", CHAT_GEMMA4},
        {"{{- '<|turn>' + role + '\n' }}<turn|> strip_thinking ns.last_user_message", CHAT_GEMMA4_INTERLEAVED},
        {"{{- '<|turn>' + role + '\n' }}<turn|> strip_thinking", CHAT_UNKNOWN},
        {"{{'<|im_start|>user<|im_sep|>' + message['content'] + '<|im_end|><|im_start|>assistant<|im_sep|>'}}", CHAT_PHI4},
        {"<|im_start|>{{ role }}<|im_sep|>", CHAT_UNKNOWN},
        {"<|start_of_role|>Knowledge Cutoff Date: April 2024. Today's Date: You are Granite, developed by IBM.", CHAT_GRANITE3},
        {"<|start_of_role|>", CHAT_UNKNOWN},
        {"<|start_header_id|>Cutting Knowledge Date: December 2023\\n{{- \"Today Date: \" + date_string", CHAT_LLAMA31},
        {"<|start_header_id|>Cutting Knowledge Date: December 2023 strftime_now Today Date: \" + date_string", CHAT_LLAMA32},
        {"<|start_header_id|>Cutting Knowledge Date: December 2023\\n\\n", CHAT_LLAMA3},
    };
    for (int i = 0; i < NELEM(det); i++)
        CHECK(chat_detect_text(det[i].text, strlen(det[i].text)) == det[i].kind, "detect %d: %s, not %s", i,
              chat_name(chat_detect_text(det[i].text, strlen(det[i].text))), chat_name(det[i].kind));
    for (int k = 1; k < CHAT_NKINDS; k++)
        CHECK(chat_template_names[k] && strcmp(chat_name(k), chat_template_names[k]) == 0 &&
                  prompt_chat_kind(NULL, k) == k, "kind %d by name", k);
    CHECK(chat_template_names[CHAT_NKINDS] == NULL && strcmp(chat_name(CHAT_NKINDS), "unknown") == 0, "names end");
}

int main(void) {
    const char *model = getenv("MODEL");
    test_model(model && *model ? model : "models/SmolLM2-135M-Instruct.Q4_1.gguf");
    test_synthetic_bpe();
    test_synthetic_spm();
    test_synthetic_gemma4();
    test_unknown_pre();
    test_qwen35_marks();
    test_chat();
    test_chat_families();
    return check_done("tokenizer");
}
