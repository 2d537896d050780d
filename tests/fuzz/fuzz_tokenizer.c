/* fuzz_tokenizer: libFuzzer target for the tokenizer. Loads the model's tokenizer once
 * (KILN_FUZZ_MODEL, default models/SmolLM2-135M-Instruct.Q4_1.gguf; a small synthetic
 * byte-level vocabulary when that file is missing) plus a synthetic SentencePiece one and
 * a synthetic Gemma 4 one (BPE over '▁'-escaped characters, <0xXX> bytes), and the
 * synthetic byte-level one under each pre-tokenizer (GPT-2, Llama 3, Qwen2, Qwen3.5), then for each input: encode with parse_special 0 and 1, decode every id, and feed the
 * ids through the incremental detokenizer. Invariants that abort on failure:
 *   - plain-text encoding (parse_special=0) decodes back to the input bytes (BPE: less
 *     the bytes its vocabulary lacks; SPM: after the '▁' prefix; SPM and Gemma 4: with
 *     '▁' read as ' ');
 *   - the stream emits valid UTF-8 only. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/gguf.h"
#include "core/tokenizer.h"

static gguf_file g_file;
static tok_t g_bpe, g_spm, g_gem;
/* the synthetic byte-level vocabulary under each hand-written pre-tokenizer matcher */
static const char *const g_pres[] = {"gpt2", "llama-bpe", "qwen2", "qwen35"};
static tok_t g_pre[4];
static int g_ready;

static int bl_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

static void synth_bpe(tok_t *t, const char *pre) {
    static char bytes[256][4];
    static const char *toks[270];
    static int32_t types[270];
    int n = 0;
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
    static const char *more[] = {"he", "ll", "hell", "hello", "\xc4\xa0w", "\xc4\xa0\xc4\xa0", "<|im_start|>", "<|im_end|>"};
    for (int i = 0; i < 8; i++) toks[n] = more[i], types[n++] = i >= 6 ? TOK_CONTROL : TOK_NORMAL;
    static const char *merges[] = {"h e", "l l", "he ll", "hell o", "\xc4\xa0 w", "\xc4\xa0 \xc4\xa0"};
    tok_spec s = {TOK_BPE, pre, n, 6, toks, types, NULL, merges, -1, n - 1, -1, 0, 0};
    char err[128];
    if (tok_init(t, &s, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err);
        abort();
    }
}

static void synth_spm(tok_t *t) {
    static char bytes[256][8];
    static const char *toks[300];
    static int32_t types[300];
    static float scores[300];
    int n = 0;
    toks[n] = "<unk>", types[n] = TOK_UNKNOWN, scores[n++] = 0;
    toks[n] = "<s>", types[n] = TOK_CONTROL, scores[n++] = 0;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[n] = bytes[b], types[n] = TOK_BYTE, scores[n++] = 0;
    }
    static const char *v[] = {"\xe2\x96\x81", "a", "b", "ab", "\xe2\x96\x81" "a", "\xe2\x96\x81\xe2\x96\x81", "ba", "aba",
                              "\xc3\xa9", "\xe2\x96\x81" "ab"};
    for (int i = 0; i < 10; i++) toks[n] = v[i], types[n] = TOK_NORMAL, scores[n++] = -(float)(i % 4);
    tok_spec s = {TOK_SPM, NULL, n, 0, toks, types, scores, NULL, 1, 1, 0, 1, 1};
    char err[128];
    if (tok_init(t, &s, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err);
        abort();
    }
}

static void synth_gemma4(tok_t *t) {
    static char bytes[256][8];
    static const char *toks[300];
    static int32_t types[300];
    int n = 0;
    toks[n] = "<eos>", types[n++] = TOK_CONTROL;
    toks[n] = "<bos>", types[n++] = TOK_CONTROL;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[n] = bytes[b], types[n++] = TOK_BYTE;
    }
    static const char *v[] = {"\xe2\x96\x81", "a", "b", "ab", "\xe2\x96\x81" "a", "\xe2\x96\x81\xe2\x96\x81", "\n", "\n\n",
                              "\xc3\xa9", "\xe2\x96\x81" "ab"};
    for (int i = 0; i < 10; i++) toks[n] = v[i], types[n++] = TOK_NORMAL;
    static const char *merges[] = {"a b", "\xe2\x96\x81 a", "\xe2\x96\x81 \xe2\x96\x81", "\xe2\x96\x81 ab", "\n \n"};
    tok_spec s = {TOK_BPE, "gemma4", n, 5, toks, types, NULL, merges, 1, 0, -1, 1, 0};
    char err[128];
    if (tok_init(t, &s, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err);
        abort();
    }
}

static void setup(void) {
    const char *path = getenv("KILN_FUZZ_MODEL");
    if (!path || !*path) path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    char err[256];
    if (gguf_open(&g_file, path) == 0 && tok_init_gguf(&g_bpe, &g_file, err, sizeof err) == 0) {
        fprintf(stderr, "fuzz_tokenizer: using %s\n", path);
    } else {
        fprintf(stderr, "fuzz_tokenizer: %s unusable, using a synthetic vocabulary\n", path);
        synth_bpe(&g_bpe, "smollm");
    }
    synth_spm(&g_spm);
    synth_gemma4(&g_gem);
    for (int i = 0; i < 4; i++) synth_bpe(&g_pre[i], g_pres[i]);
    g_ready = 1;
}

static int valid_utf8(const uint8_t *s, int n) {
    for (int i = 0; i < n;) {
        uint8_t b = s[i];
        int k = b < 0x80 ? 1 : b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
        if (!k || i + k > n) return 0;
        for (int j = 1; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return 0;
        if ((b == 0xE0 && s[i + 1] < 0xA0) || (b == 0xED && s[i + 1] > 0x9F) || (b == 0xF0 && s[i + 1] < 0x90) ||
            (b == 0xF4 && s[i + 1] > 0x8F))
            return 0;
        i += k;
    }
    return 1;
}

static void run(const tok_t *t, const uint8_t *data, size_t size, int32_t *ids, char *buf, char *piece) {
    for (int sp = 0; sp < 2; sp++) {
        int n = tok_encode(t, (const char *)data, size, sp, ids, (int)size + 2);
        if (n < 0) abort(); /* len + 2 always suffices */
        size_t k = 0;
        for (int i = 0; i < n; i++) {
            int r = tok_decode(t, ids[i], sp, buf + k, t->max_piece);
            if (r < 0) abort();
            k += (size_t)r;
        }
        if (!sp) { /* plain text decodes back to the input */
            size_t o = 0, j = 0;
            if (t->model == TOK_SPM && n > 0) {
                if (k == 0 || buf[0] != ' ') abort();
                o = 1;
            }
            for (size_t i = 0; i < size; i++) {
                uint8_t want = data[i];
                if (t->model == TOK_BPE && t->byte_tok[want] < 0) continue;
                if ((t->model == TOK_SPM || t->pre == TOK_PRE_GEMMA4) && i + 3 <= size &&
                    memcmp(data + i, "\xe2\x96\x81", 3) == 0)
                    want = ' ', i += 2; /* an input '▁' is a space to SentencePiece and Gemma 4 */
                if (o + j >= k || (uint8_t)buf[o + j] != want) abort();
                j++;
            }
            if (o + j != k) abort();
        }
        tok_stream s;
        tok_stream_init(&s, t, sp);
        for (int i = 0; i < n; i++) {
            int r = tok_stream_push(&s, ids[i], piece, TOK_STREAM_CAP(t));
            if (r < 0 || !valid_utf8((const uint8_t *)piece, r)) abort();
        }
        int r = tok_stream_flush(&s, piece, TOK_STREAM_CAP(t));
        if (r < 0 || !valid_utf8((const uint8_t *)piece, r)) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_ready) setup();
    if (size > 1 << 16) return 0;
    int32_t *ids = malloc((size + 2) * sizeof *ids);
    int maxp = g_bpe.max_piece > g_spm.max_piece ? g_bpe.max_piece : g_spm.max_piece;
    if (g_gem.max_piece > maxp) maxp = g_gem.max_piece;
    for (int i = 0; i < 4; i++)
        if (g_pre[i].max_piece > maxp) maxp = g_pre[i].max_piece;
    char *buf = malloc((size + 2) * (size_t)maxp + 16);
    char *piece = malloc((size_t)3 * ((size_t)maxp + 4));
    if (ids && buf && piece) {
        run(&g_bpe, data, size, ids, buf, piece);
        run(&g_spm, data, size, ids, buf, piece);
        run(&g_gem, data, size, ids, buf, piece);
        for (int i = 0; i < 4; i++) run(&g_pre[i], data, size, ids, buf, piece);
    }
    free(ids);
    free(buf);
    free(piece);
    return 0;
}
