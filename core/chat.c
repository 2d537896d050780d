/* chat.c: chat templates rendered in C, byte for byte what the Jinja template gives. */
#include "core/chat.h"

#include <string.h>

/* ------------------------------------------------------------------ detection */

/* ChatML templates that add a system message when the first message is not one: the
 * marker identifies the template, sys is the text it inserts. */
static const struct {
    int kind;
    const char *marker, *sys;
} defaults[] = {
    {CHAT_SMOLLM, "named SmolLM", "You are a helpful AI assistant named SmolLM, trained by Hugging Face"},
    {CHAT_QWEN25, "You are Qwen, created by Alibaba Cloud.",
     "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."},
    {CHAT_QWEN2, "system\\nYou are a helpful assistant.<|im_end|>", "You are a helpful assistant."},
};

static int contains(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; k <= n && i <= n - k; i++)
        if (memcmp(s + i, needle, k) == 0) return 1;
    return 0;
}

int chat_detect_text(const char *t, size_t n) {
    if (!t) return CHAT_UNKNOWN;
    if (contains(t, n, "<|start_header_id|>")) return CHAT_LLAMA3;
    if (contains(t, n, "<|im_start|>")) {
        for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
            if (contains(t, n, defaults[i].marker)) return defaults[i].kind;
        return CHAT_CHATML;
    }
    return CHAT_UNKNOWN;
}

int chat_detect(const gguf_file *f) {
    gguf_str s;
    if (gguf_get_str(f, "tokenizer.chat_template", &s) != 0) return CHAT_CHATML;
    return chat_detect_text(s.ptr, (size_t)s.len);
}

const char *chat_name(int kind) {
    switch (kind) {
    case CHAT_CHATML: return "chatml";
    case CHAT_SMOLLM: return "smollm";
    case CHAT_QWEN2: return "qwen2";
    case CHAT_QWEN25: return "qwen2.5";
    case CHAT_LLAMA3: return "llama3";
    default: return "unknown";
    }
}

/* ------------------------------------------------------------------ rendering */

typedef struct {
    char *out;
    size_t cap, n;
} sbuf;

static void put(sbuf *b, const char *s, size_t k) {
    if (b->n + k < b->cap) memcpy(b->out + b->n, s, k);
    b->n += k;
}
static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

/* Jinja's trim is Python's str.strip(): the characters str.isspace() accepts */
static size_t space_at(const unsigned char *s, size_t n, int end) {
    static const char *const multi[] = {"\xC2\x85", "\xC2\xA0", "\xE1\x9A\x80", "\xE2\x80\xA8",
                                        "\xE2\x80\xA9", "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80"};
    if (n == 0) return 0;
    unsigned char c = end ? s[n - 1] : s[0];
    if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20)) return 1;
    for (size_t i = 0; i < sizeof multi / sizeof multi[0]; i++) {
        size_t k = strlen(multi[i]);
        if (k <= n && memcmp(end ? s + n - k : s, multi[i], k) == 0) return k;
    }
    if (n >= 3) { /* U+2000..U+200A */
        const unsigned char *p = end ? s + n - 3 : s;
        if (p[0] == 0xE2 && p[1] == 0x80 && p[2] >= 0x80 && p[2] <= 0x8A) return 3;
    }
    return 0;
}

static void put_trimmed(sbuf *b, const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s), k;
    while ((k = space_at(p, n, 0)) > 0) p += k, n -= k;
    while ((k = space_at(p, n, 1)) > 0) n -= k;
    put(b, (const char *)p, n);
}

int chat_format(int kind, const chat_msg *msgs, int n, int add_generation_prompt, char *out, size_t cap) {
    if (n < 0 || (n > 0 && !msgs) || (!out && cap > 0)) return CHAT_EINVAL;
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content) return CHAT_EINVAL;
    sbuf b = {out, cap, 0};
    switch (kind) {
    case CHAT_CHATML:
    case CHAT_SMOLLM:
    case CHAT_QWEN2:
    case CHAT_QWEN25:
        for (int i = 0; i < n; i++) {
            if (i == 0 && kind != CHAT_CHATML && strcmp(msgs[0].role, "system") != 0) {
                for (size_t d = 0; d < sizeof defaults / sizeof defaults[0]; d++)
                    if (defaults[d].kind == kind) {
                        puts_(&b, "<|im_start|>system\n");
                        puts_(&b, defaults[d].sys);
                        puts_(&b, "<|im_end|>\n");
                    }
            }
            puts_(&b, "<|im_start|>");
            puts_(&b, msgs[i].role);
            puts_(&b, "\n");
            puts_(&b, msgs[i].content);
            puts_(&b, "<|im_end|>\n");
        }
        if (add_generation_prompt) puts_(&b, "<|im_start|>assistant\n");
        break;
    case CHAT_LLAMA3:
        for (int i = 0; i < n; i++) {
            if (i == 0) puts_(&b, "<|begin_of_text|>");
            puts_(&b, "<|start_header_id|>");
            puts_(&b, msgs[i].role);
            puts_(&b, "<|end_header_id|>\n\n");
            put_trimmed(&b, msgs[i].content);
            puts_(&b, "<|eot_id|>");
        }
        if (add_generation_prompt) puts_(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    default:
        return CHAT_EINVAL;
    }
    if (b.n >= cap || b.n > 0x7FFFFFFF) return CHAT_ESPACE;
    out[b.n] = 0;
    return (int)b.n;
}
