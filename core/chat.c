/* chat.c: chat templates rendered in C, byte for byte what the Jinja template gives. */
#include "core/chat.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

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

/* all of the markers, none of the excluded */
static int has_all(const char *t, size_t n, const char *const *yes, const char *const *no) {
    for (; *yes; yes++)
        if (!contains(t, n, *yes)) return 0;
    for (; no && *no; no++)
        if (contains(t, n, *no)) return 0;
    return 1;
}

int chat_detect_text(const char *t, size_t n) {
    if (!t) return CHAT_UNKNOWN;
    if (contains(t, n, "<|start_header_id|>")) {
        if (!contains(t, n, "Cutting Knowledge Date: December 2023") || !contains(t, n, "Today Date: \" + date_string"))
            return CHAT_LLAMA3;
        return contains(t, n, "strftime_now") ? CHAT_LLAMA32 : CHAT_LLAMA31;
    }
    if (contains(t, n, "<start_of_turn>")) return CHAT_GEMMA;
    /* Gemma 4: the plain one merges an assistant turn into the one before it, the
     * interleaved one keeps tool turns */
    static const char *const gemma4[] = {"'<|turn>' + role", "<turn|>", "strip_thinking", NULL};
    if (has_all(t, n, gemma4, NULL))
        return contains(t, n, "continue_same_model_turn") ? CHAT_GEMMA4
             : contains(t, n, "ns.last_user_message") ? CHAT_GEMMA4_INTERLEAVED : CHAT_UNKNOWN;
    if (contains(t, n, "[SYSTEM_PROMPT]")) {
        static const char *const small3[] = {"'[SYSTEM_PROMPT]' + system_prompt + '[/SYSTEM_PROMPT]'",
                                             "conversation roles must alternate user/assistant", "[CALL_ID]", NULL};
        static const char *const devstral[] = {"'[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]'",
                                               "\"[TOOL_RESULTS]\" + content|string", NULL};
        static const char *const devstral_not[] = {"must alternate", NULL};
        static const char *const ministral3[] = {"{{- '[SYSTEM_PROMPT]' -}}", "roles must alternate user and assistant",
                                                 "Assistant message must have", "'[TOOL_RESULTS]' + message['content']|string",
                                                 NULL};
        if (has_all(t, n, small3, NULL)) return CHAT_MISTRAL_SMALL3;
        if (has_all(t, n, devstral, devstral_not)) return CHAT_DEVSTRAL;
        if (has_all(t, n, ministral3, NULL)) return CHAT_MINISTRAL3;
        return CHAT_UNKNOWN;
    }
    static const char *const granite3[] = {"<|start_of_role|>", "Knowledge Cutoff Date: April 2024. Today's Date: ",
                                           "You are Granite, developed by IBM.", NULL};
    if (has_all(t, n, granite3, NULL)) return CHAT_GRANITE3;
    static const char *const phi3[] = {"<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "add_generation_prompt",
                                       "eos_token", NULL};
    static const char *const phi3_legacy[] = {"bos_token", "<|user|>", "<|assistant|>", "<|end|>", NULL};
    static const char *const phi3_legacy_not[] = {"<|system|>", "add_generation_prompt", "tool", NULL};
    static const char *const phi3_not[] = {"tool", NULL}; /* Apriel's tool-calling one */
    if (has_all(t, n, phi3, phi3_not)) return CHAT_PHI3;
    if (has_all(t, n, phi3_legacy, phi3_legacy_not)) return CHAT_PHI3_LEGACY;
    /* v3-tekken: no space after [INST], the system message before the last user turn */
    static const char *const tekken[] = {"[INST]\" + system_message", "loop.last and system_message is defined", NULL};
    static const char *const tekken_not[] = {"[SYSTEM_PROMPT]", NULL};
    if (has_all(t, n, tekken, tekken_not)) return CHAT_MISTRAL_TEKKEN;
    if (contains(t, n, "<|im_sep|>")) { /* Phi-4's; any other is no ChatML */
        static const char *const phi4[] = {"<|im_start|>user<|im_sep|>", "<|im_end|><|im_start|>assistant<|im_sep|>", NULL};
        return has_all(t, n, phi4, NULL) ? CHAT_PHI4 : CHAT_UNKNOWN;
    }
    if (contains(t, n, "<|im_start|>")) {
        /* Qwen3's own (Qwen3.5's and MiniCPM5's reuse the markers around more) */
        static const char *const qwen3[] = {"reasoning_content", "enable_thinking", "ns.last_query_index", NULL};
        static const char *const qwen3_not[] = {"bos_token", "render_content", NULL};
        if (has_all(t, n, qwen3, qwen3_not)) return CHAT_QWEN3;
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

const char *const chat_template_names[CHAT_NKINDS + 1] = {
    [0] = "auto", /* kiln.ini: detect */
    [CHAT_CHATML] = "chatml",
    [CHAT_SMOLLM] = "smollm",
    [CHAT_QWEN2] = "qwen2",
    [CHAT_QWEN25] = "qwen2.5",
    [CHAT_LLAMA3] = "llama3",
    [CHAT_QWEN3] = "qwen3",
    [CHAT_QWEN3_NOTHINK] = "qwen3-nothink",
    [CHAT_GEMMA] = "gemma",
    [CHAT_PHI3] = "phi3",
    [CHAT_PHI3_LEGACY] = "phi3-legacy",
    [CHAT_MISTRAL_TEKKEN] = "mistral-tekken",
    [CHAT_GRANITE3] = "granite3",
    [CHAT_LLAMA31] = "llama3.1",
    [CHAT_LLAMA32] = "llama3.2",
    [CHAT_PHI4] = "phi4",
    [CHAT_MISTRAL_SMALL3] = "mistral-small3",
    [CHAT_DEVSTRAL] = "devstral",
    [CHAT_MINISTRAL3] = "ministral3",
    [CHAT_GEMMA4] = "gemma4",
    [CHAT_GEMMA4_INTERLEAVED] = "gemma4-interleaved",
    [CHAT_NKINDS] = NULL,
};

const char *chat_name(int kind) {
    return kind > 0 && kind < CHAT_NKINDS ? chat_template_names[kind] : "unknown";
}

/* ------------------------------------------------------------------ rendering */

/* The output, and the byte ranges the caller's texts (contents, roles) landed in:
 * spans[2i], spans[2i + 1] (chat_format_spans). */
typedef struct {
    char *out;
    size_t cap, n;
    size_t *spans;
    int n_spans, max_spans, spans_over;
} sbuf;

static void put(sbuf *b, const char *s, size_t k) {
    if (b->n + k < b->cap) memcpy(b->out + b->n, s, k);
    b->n += k;
}
static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

/* Caller text: its bytes are a span, so that a special-token text inside it stays text
 * when the prompt is tokenized (only the template's own markup names special tokens). */
static void span_close(sbuf *b, size_t from) {
    if (!b->spans || b->n == from) return;
    if (b->n_spans && b->spans[2 * b->n_spans - 1] == from) { /* adjoining: one span */
        b->spans[2 * b->n_spans - 1] = b->n;
        return;
    }
    if (b->n_spans == b->max_spans) {
        b->spans_over = 1;
        return;
    }
    b->spans[2 * b->n_spans] = from, b->spans[2 * b->n_spans + 1] = b->n;
    b->n_spans++;
}
static void uput(sbuf *b, const char *s, size_t k) {
    size_t from = b->n;
    put(b, s, k);
    span_close(b, from);
}
static void uputs(sbuf *b, const char *s) { uput(b, s, strlen(s)); }

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

/* s[0..*n) trimmed: its first byte left, *n its length */
static const char *trimmed(const char *s, size_t *n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t k;
    while ((k = space_at(p, *n, 0)) > 0) p += k, *n -= k;
    while ((k = space_at(p, *n, 1)) > 0) *n -= k;
    return (const char *)p;
}

static void put_trimmed(sbuf *b, const char *s) { /* caller text */
    size_t n = strlen(s);
    const char *p = trimmed(s, &n);
    uput(b, p, n);
}

static int is(const char *a, const char *b) { return strcmp(a, b) == 0; }

/* s[0..n) without leading / trailing '\n' (Python's lstrip('\n'), rstrip('\n')) */
static const char *lstrip_nl(const char *s, size_t *n) {
    while (*n > 0 && *s == '\n') s++, (*n)--;
    return s;
}
static size_t rstrip_nl(const char *s, size_t n) {
    while (n > 0 && s[n - 1] == '\n') n--;
    return n;
}

/* first / last occurrence of needle in s[0..n), or NULL */
static const char *find(const char *s, size_t n, const char *needle, int last) {
    size_t k = strlen(needle);
    const char *hit = NULL;
    for (size_t i = 0; k <= n && i <= n - k; i++)
        if (memcmp(s + i, needle, k) == 0) {
            hit = s + i;
            if (!last) break;
        }
    return hit;
}

static int starts(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }
static int ends(const char *s, const char *p) {
    size_t n = strlen(s), k = strlen(p);
    return n >= k && memcmp(s + n - k, p, k) == 0;
}

/* Qwen2.5/Qwen3: a run of tool results is one user turn of <tool_response> blocks */
static void qwen_tool(sbuf *b, const chat_msg *m, int n, int i) {
    if (i == 0 || !is(m[i - 1].role, "tool")) puts_(b, "<|im_start|>user");
    puts_(b, "\n<tool_response>\n");
    uputs(b, m[i].content);
    puts_(b, "\n</tool_response>");
    if (i == n - 1 || !is(m[i + 1].role, "tool")) puts_(b, "<|im_end|>\n");
}

/* ChatML with an optional default system message (SmolLM2, Qwen2, Qwen2.5) */
static void render_chatml(sbuf *b, int kind, const chat_msg *m, int n, int agp) {
    for (int i = 0; i < n; i++) {
        if (kind == CHAT_QWEN25 && is(m[i].role, "tool")) {
            qwen_tool(b, m, n, i);
            continue;
        }
        if (i == 0 && kind != CHAT_CHATML && !is(m[0].role, "system")) {
            for (size_t d = 0; d < sizeof defaults / sizeof defaults[0]; d++)
                if (defaults[d].kind == kind) {
                    puts_(b, "<|im_start|>system\n");
                    puts_(b, defaults[d].sys);
                    puts_(b, "<|im_end|>\n");
                }
        }
        puts_(b, "<|im_start|>");
        uputs(b, m[i].role);
        puts_(b, "\n");
        uputs(b, m[i].content);
        puts_(b, "<|im_end|>\n");
    }
    if (agp) puts_(b, "<|im_start|>assistant\n");
}

static void render_llama3(sbuf *b, const chat_msg *m, int n, int agp) {
    for (int i = 0; i < n; i++) {
        if (i == 0) puts_(b, "<|begin_of_text|>");
        puts_(b, "<|start_header_id|>");
        uputs(b, m[i].role);
        puts_(b, "<|end_header_id|>\n\n");
        put_trimmed(b, m[i].content);
        puts_(b, "<|eot_id|>");
    }
    if (agp) puts_(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* a JSON string literal (Jinja's tojson on a string, as json.dumps: non-ASCII kept) */
static void put_json_str(sbuf *b, const char *s) { /* caller text */
    size_t from = b->n;
    puts_(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        char u[8];
        if (!esc && c < 0x20) snprintf(u, sizeof u, "\\u%04x", c), esc = u;
        if (esc) puts_(b, esc);
        else put(b, s, 1);
    }
    puts_(b, "\"");
    span_close(b, from);
}

/* Llama 3.1-3.3: a system turn always, opening with the knowledge cutoff and a date;
 * texts trimmed; tool results ("tool"/"ipython") are ipython turns, as JSON strings */
static void render_llama31(sbuf *b, const chat_msg *m, int n, int agp, const char *date) {
    const char *sys = n > 0 && is(m[0].role, "system") ? m[0].content : "";
    puts_(b, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n");
    puts_(b, "Today Date: ");
    puts_(b, date);
    puts_(b, "\n\n");
    put_trimmed(b, sys);
    puts_(b, "<|eot_id|>");
    for (int i = n > 0 && is(m[0].role, "system"); i < n; i++) {
        if (is(m[i].role, "tool") || is(m[i].role, "ipython")) {
            puts_(b, "<|start_header_id|>ipython<|end_header_id|>\n\n");
            put_json_str(b, m[i].content);
        } else {
            puts_(b, "<|start_header_id|>");
            uputs(b, m[i].role);
            puts_(b, "<|end_header_id|>\n\n");
            put_trimmed(b, m[i].content);
        }
        puts_(b, "<|eot_id|>");
    }
    if (agp) puts_(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* today's date in local time, strftime's format; "" when the clock cannot say */
static void date_of(int64_t now, const char *fmt, char *out, size_t cap) {
    time_t t = (time_t)now;
    struct tm tm;
    if (!localtime_r(&t, &tm) || strftime(out, cap, fmt, &tm) == 0) out[0] = 0;
}

/* Qwen3: an assistant turn's "<think>reasoning</think>answer" is split; the reasoning is
 * kept only for turns after the last real user query (a user turn that is not wholly a
 * <tool_response>), and there always for the final turn. Tool results are user turns. */
static void qwen3_assistant(sbuf *b, const chat_msg *m, int after_query, int last) {
    const char *c = m->content, *ans = c, *why = "";
    size_t cn = strlen(c), an = cn, wn = 0;
    const char *close = find(c, cn, "</think>", 1);
    if (close) {
        an = cn - (size_t)(close + 8 - c);
        ans = lstrip_nl(close + 8, &an);
        size_t pn = rstrip_nl(c, (size_t)(find(c, cn, "</think>", 0) - c));
        const char *open = find(c, pn, "<think>", 1);
        why = open ? open + 7 : c;
        wn = pn - (size_t)(why - c);
        why = lstrip_nl(why, &wn);
    }
    puts_(b, "<|im_start|>");
    uputs(b, m->role);
    if (after_query && (last || wn > 0)) {
        puts_(b, "\n<think>\n");
        why = lstrip_nl(why, &wn);
        uput(b, why, rstrip_nl(why, wn));
        puts_(b, "\n</think>\n\n");
        ans = lstrip_nl(ans, &an);
    } else {
        puts_(b, "\n");
    }
    uput(b, ans, an);
    puts_(b, "<|im_end|>\n");
}

static void render_qwen3(sbuf *b, const chat_msg *m, int n, int agp, int think) {
    if (n > 0 && is(m[0].role, "system")) {
        puts_(b, "<|im_start|>system\n");
        uputs(b, m[0].content);
        puts_(b, "<|im_end|>\n");
    }
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--)
        if (is(m[i].role, "user") && !(starts(m[i].content, "<tool_response>") && ends(m[i].content, "</tool_response>"))) {
            last_query = i;
            break;
        }
    for (int i = 0; i < n; i++) {
        if (is(m[i].role, "user") || (is(m[i].role, "system") && i > 0)) {
            puts_(b, "<|im_start|>");
            uputs(b, m[i].role);
            puts_(b, "\n");
            uputs(b, m[i].content);
            puts_(b, "<|im_end|>\n");
        } else if (is(m[i].role, "assistant")) {
            qwen3_assistant(b, &m[i], i > last_query, i == n - 1);
        } else if (is(m[i].role, "tool")) {
            qwen_tool(b, m, n, i);
        } /* any other role: the template renders nothing */
    }
    if (agp) puts_(b, think ? "<|im_start|>assistant\n" : "<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

/* Gemma 2/3: user and model turns alternate after an optional system message, which
 * Gemma 3's template puts before the first turn's text (Gemma 2's refuses it; kiln
 * renders it the Gemma 3 way). Turn texts are trimmed, the system text is not. */
static int render_gemma(sbuf *b, const chat_msg *m, int n, int agp) {
    const char *sys = n > 0 && is(m[0].role, "system") ? m[0].content : NULL;
    const chat_msg *loop = sys ? m + 1 : m;
    int ln = sys ? n - 1 : n;
    for (int k = 0; k < ln; k++)
        if (is(loop[k].role, "user") != (k % 2 == 0)) return CHAT_EINVAL;
    puts_(b, "<bos>");
    for (int k = 0; k < ln; k++) {
        puts_(b, "<start_of_turn>");
        uputs(b, is(loop[k].role, "assistant") ? "model" : loop[k].role);
        puts_(b, "\n");
        if (k == 0 && sys) {
            uputs(b, sys);
            puts_(b, "\n\n");
        }
        put_trimmed(b, loop[k].content);
        puts_(b, "<end_of_turn>\n");
    }
    if (agp) puts_(b, "<start_of_turn>model\n");
    return 0;
}

static void render_phi3(sbuf *b, const chat_msg *m, int n, int agp) {
    for (int i = 0; i < n; i++) {
        const char *tag = is(m[i].role, "system") && m[i].content[0] ? "<|system|>\n"
                        : is(m[i].role, "user")                      ? "<|user|>\n"
                        : is(m[i].role, "assistant")                 ? "<|assistant|>\n"
                                                                     : NULL;
        if (!tag) continue;
        puts_(b, tag);
        uputs(b, m[i].content);
        puts_(b, "<|end|>\n");
    }
    puts_(b, agp ? "<|assistant|>\n" : "<|endoftext|>");
}

static void render_phi4(sbuf *b, const chat_msg *m, int n) {
    for (int i = 0; i < n; i++) {
        if (is(m[i].role, "system") || is(m[i].role, "user")) {
            puts_(b, "<|im_start|>");
            uputs(b, m[i].role);
            puts_(b, "<|im_sep|>");
            uputs(b, m[i].content);
            puts_(b, is(m[i].role, "user") ? "<|im_end|><|im_start|>assistant<|im_sep|>" : "<|im_end|>");
        } else if (is(m[i].role, "assistant")) {
            uputs(b, m[i].content);
            puts_(b, "<|im_end|>");
        }
    }
}

static void render_phi3_legacy(sbuf *b, const chat_msg *m, int n) {
    puts_(b, "<s>");
    for (int i = 0; i < n; i++) {
        if (is(m[i].role, "user")) {
            puts_(b, "<|user|>\n");
            uputs(b, m[i].content);
            puts_(b, "<|end|>\n<|assistant|>\n");
        } else if (is(m[i].role, "assistant")) {
            uputs(b, m[i].content);
            puts_(b, "<|end|>\n");
        }
    }
}

/* Mistral v3-tekken: user/assistant alternate after an optional system message, which
 * goes before the last turn when that is the user's (and nowhere otherwise). */
static int render_mistral_tekken(sbuf *b, const chat_msg *m, int n) {
    const char *sys = n > 0 && is(m[0].role, "system") ? m[0].content : NULL;
    const chat_msg *loop = sys ? m + 1 : m;
    int ln = sys ? n - 1 : n;
    for (int k = 0; k < ln; k++) /* tool turns need tool_call ids kiln's messages lack */
        if (is(loop[k].role, "user") != (k % 2 == 0) || (!is(loop[k].role, "user") && !is(loop[k].role, "assistant")))
            return CHAT_EINVAL;
    puts_(b, "<s>");
    for (int k = 0; k < ln; k++) {
        if (is(loop[k].role, "user")) {
            puts_(b, "[INST]");
            if (k == ln - 1 && sys) {
                uputs(b, sys);
                puts_(b, "\n\n");
            }
            uputs(b, loop[k].content);
            puts_(b, "[/INST]");
        } else {
            uputs(b, loop[k].content);
            puts_(b, "</s>");
        }
    }
    return 0;
}

/* Mistral's [SYSTEM_PROMPT] templates: the first system message (or the template's default,
 * when there is one) in a system block, then [INST]user[/INST], assistant</s>, later system
 * messages in system blocks, tool results in [TOOL_RESULTS] blocks. Mistral Small 3 and
 * Ministral 3 require user/assistant to alternate (Small 3 counting every turn but tool
 * results, Ministral 3 only user and assistant turns); Small 3's tool results need call
 * ids kiln's messages lack; Ministral 3 refuses later system messages and empty answers. */
static int render_mistral_sp(sbuf *b, int kind, const char *dflt, const chat_msg *m, int n) {
    int sys = n > 0 && is(m[0].role, "system");
    if (n == 0 && kind != CHAT_MISTRAL_SMALL3) return CHAT_EINVAL; /* messages[0] undefined */
    const chat_msg *loop = sys ? m + 1 : m;
    int ln = sys ? n - 1 : n;
    for (int k = 0, turn = 0; k < ln; k++) {
        const char *r = loop[k].role;
        int user = is(r, "user"), asst = is(r, "assistant"), tool = is(r, "tool"), later_sys = is(r, "system");
        if (!user && !asst && !tool && !later_sys) return CHAT_EINVAL; /* a role it has no place for */
        if ((tool && kind == CHAT_MISTRAL_SMALL3) || (kind == CHAT_MINISTRAL3 && (later_sys || (asst && !loop[k].content[0]))))
            return CHAT_EINVAL;
        int counted = kind == CHAT_MISTRAL_SMALL3 ? !tool : kind == CHAT_MINISTRAL3 && (user || asst);
        if (counted && user != (turn++ % 2 == 0)) return CHAT_EINVAL;
    }
    puts_(b, "<s>");
    if (sys || (dflt && dflt[0])) {
        puts_(b, "[SYSTEM_PROMPT]");
        if (sys) uputs(b, m[0].content);
        else puts_(b, dflt); /* the template's own text */
        puts_(b, "[/SYSTEM_PROMPT]");
    }
    for (int k = 0; k < ln; k++) {
        const char *r = loop[k].role;
        const char *open = is(r, "user") ? "[INST]" : is(r, "system") ? "[SYSTEM_PROMPT]" : is(r, "tool") ? "[TOOL_RESULTS]" : "";
        const char *close = is(r, "user") ? "[/INST]" : is(r, "system") ? "[/SYSTEM_PROMPT]" : is(r, "tool") ? "[/TOOL_RESULTS]" : "</s>";
        puts_(b, open);
        uputs(b, loop[k].content);
        puts_(b, close);
    }
    return 0;
}

/* Gemma 4's strip_thinking: the text with each <|channel>...<channel|> thought cut out
 * (everything from a <|channel> to the next <channel|>), trimmed; caller text */
static void put_gemma4_answer(sbuf *b, const char *s) {
    size_t n = strlen(s), from = b->n;
    if (b->n + n >= b->cap) { /* cannot fit: only the length counts (CHAT_ESPACE) */
        b->n += n;
        return;
    }
    for (size_t pos = 0;;) {
        const char *end = find(s + pos, n - pos, "<channel|>", 0);
        size_t pn = end ? (size_t)(end - (s + pos)) : n - pos;
        const char *cut = find(s + pos, pn, "<|channel>", 0);
        put(b, s + pos, cut ? (size_t)(cut - (s + pos)) : pn);
        if (!end) break;
        pos += pn + 10;
    }
    size_t k = b->n - from;
    const char *p = trimmed(b->out + from, &k);
    memmove(b->out + from, p, k);
    b->n = from + k;
    span_close(b, from);
}

/* Gemma 4: a system turn for a first system (or developer) message, trimmed texts, 'model'
 * for assistant. The plain template drops tool turns and continues an assistant turn
 * that follows another; the interleaved one renders tool turns as turns. */
static int render_gemma4(sbuf *b, const chat_msg *m, int n, int agp, int interleaved) {
    if (n == 0) return CHAT_EINVAL; /* messages[0] undefined */
    int first = is(m[0].role, "system") || is(m[0].role, "developer");
    puts_(b, "<bos>");
    if (first) {
        puts_(b, "<|turn>system\n");
        put_trimmed(b, m[0].content);
        puts_(b, "<turn|>\n");
    }
    const char *prev = NULL; /* the role of the turn before, tool turns aside */
    for (int i = first; i < n; i++) {
        int model = is(m[i].role, "assistant");
        if (!interleaved && is(m[i].role, "tool")) continue;
        if (interleaved || !model || !prev || !is(prev, "assistant")) {
            puts_(b, "<|turn>");
            if (model) puts_(b, "model");
            else uputs(b, m[i].role);
            puts_(b, "\n");
        }
        if (model) put_gemma4_answer(b, m[i].content);
        else put_trimmed(b, m[i].content);
        puts_(b, "<turn|>\n");
        prev = m[i].role;
    }
    if (agp) puts_(b, "<|turn>model\n<|channel>thought\n<channel|>");
    return 0;
}

/* Granite 3.x: a system turn always, the default one naming today's date */
static void render_granite3(sbuf *b, const chat_msg *m, int n, int agp, int64_t now) {
    const char *sys = n > 0 && is(m[0].role, "system") ? m[0].content : NULL;
    puts_(b, "<|start_of_role|>system<|end_of_role|>");
    if (sys) {
        uputs(b, sys);
    } else {
        char date[64];
        date_of(now, "%B %d, %Y", date, sizeof date);
        puts_(b, "Knowledge Cutoff Date: April 2024. Today's Date: ");
        puts_(b, date);
        puts_(b, ". You are Granite, developed by IBM. You are a helpful AI assistant.");
    }
    puts_(b, "<|end_of_text|>\n");
    const chat_msg *loop = sys ? m + 1 : m;
    int ln = sys ? n - 1 : n;
    for (int k = 0; k < ln; k++) {
        puts_(b, "<|start_of_role|>");
        uputs(b, loop[k].role);
        puts_(b, "<|end_of_role|>");
        uputs(b, loop[k].content);
        puts_(b, "<|end_of_text|>\n");
        if (k == ln - 1 && agp) puts_(b, "<|start_of_role|>assistant<|end_of_role|>");
    }
}

int chat_format_dflt(int kind, const char *dflt, const chat_msg *msgs, int n, int add_generation_prompt,
                     int64_t now, char *out, size_t cap, size_t *spans, int max_spans, int *n_spans) {
    if (n < 0 || (n > 0 && !msgs) || (!out && cap > 0) || (spans && (!n_spans || max_spans < 0)))
        return CHAT_EINVAL;
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content) return CHAT_EINVAL;
    sbuf b = {out, cap, 0, spans, 0, spans ? max_spans : 0, 0};
    int agp = add_generation_prompt, rc = 0;
    switch (kind) {
    case CHAT_CHATML:
    case CHAT_SMOLLM:
    case CHAT_QWEN2:
    case CHAT_QWEN25: render_chatml(&b, kind, msgs, n, agp); break;
    case CHAT_LLAMA3: render_llama3(&b, msgs, n, agp); break;
    case CHAT_QWEN3:
    case CHAT_QWEN3_NOTHINK: render_qwen3(&b, msgs, n, agp, kind == CHAT_QWEN3); break;
    case CHAT_GEMMA: rc = render_gemma(&b, msgs, n, agp); break;
    case CHAT_PHI3: render_phi3(&b, msgs, n, agp); break;
    case CHAT_PHI3_LEGACY: render_phi3_legacy(&b, msgs, n); break;
    case CHAT_PHI4: render_phi4(&b, msgs, n); break;
    case CHAT_MISTRAL_TEKKEN: rc = render_mistral_tekken(&b, msgs, n); break;
    case CHAT_GRANITE3: render_granite3(&b, msgs, n, agp, now); break;
    case CHAT_MISTRAL_SMALL3:
    case CHAT_DEVSTRAL:
    case CHAT_MINISTRAL3: rc = render_mistral_sp(&b, kind, dflt, msgs, n); break;
    case CHAT_GEMMA4:
    case CHAT_GEMMA4_INTERLEAVED: rc = render_gemma4(&b, msgs, n, agp, kind == CHAT_GEMMA4_INTERLEAVED); break;
    case CHAT_LLAMA31: render_llama31(&b, msgs, n, agp, "26 Jul 2024"); break;
    case CHAT_LLAMA32: {
        char date[64];
        date_of(now, "%d %b %Y", date, sizeof date);
        render_llama31(&b, msgs, n, agp, date);
        break;
    }
    default: return CHAT_EINVAL;
    }
    if (rc < 0) return rc;
    if (b.n >= cap || b.n > 0x7FFFFFFF || b.spans_over) return CHAT_ESPACE;
    out[b.n] = 0;
    if (n_spans) *n_spans = b.n_spans;
    return (int)b.n;
}

int chat_format_spans(int kind, const chat_msg *msgs, int n, int add_generation_prompt, int64_t now,
                      char *out, size_t cap, size_t *spans, int max_spans, int *n_spans) {
    return chat_format_dflt(kind, NULL, msgs, n, add_generation_prompt, now, out, cap, spans, max_spans, n_spans);
}

int chat_format_at(int kind, const chat_msg *msgs, int n, int add_generation_prompt, int64_t now, char *out,
                   size_t cap) {
    return chat_format_spans(kind, msgs, n, add_generation_prompt, now, out, cap, NULL, 0, NULL);
}

int chat_format(int kind, const chat_msg *msgs, int n, int add_generation_prompt, char *out, size_t cap) {
    return chat_format_at(kind, msgs, n, add_generation_prompt, (int64_t)time(NULL), out, cap);
}

/* ------------------------------------------------------------------ default system message */

static int hexdig(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static void put_utf8(sbuf *b, unsigned long c) {
    char u[4];
    size_t k = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
    static const unsigned char lead[] = {0, 0, 0xC0, 0xE0, 0xF0};
    for (size_t i = k - 1; i > 0; i--) u[i] = (char)(0x80 | (c & 0x3F)), c >>= 6;
    u[0] = (char)(k == 1 ? c : (lead[k] | c));
    put(b, u, k);
}

/* The Jinja string literal at s (its quote s[0]) into b, unescaped as Jinja's lexer does
 * (newlines normalized, then Python's unicode-escape); the byte after it, or NULL. */
static const char *jinja_string(sbuf *b, const char *s, const char *end) {
    static const char simple[] = "\\\\''\"\"a\ab\bf\fn\nr\rt\tv\v";
    char q = *s++;
    while (s < end && *s != q) {
        if (*s == '\r') { /* \r\n and \r are \n */
            s += s + 1 < end && s[1] == '\n' ? 2 : 1;
            put(b, "\n", 1);
            continue;
        }
        if (*s != '\\' || s + 1 >= end) {
            put(b, s++, 1);
            continue;
        }
        char c = s[1];
        const char *e = NULL;
        for (size_t i = 0; simple[i]; i += 2)
            if (simple[i] == c) e = &simple[i + 1];
        int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
        if (e) {
            put(b, e, 1), s += 2;
        } else if (c == '\n') { /* a line continuation */
            s += 2;
        } else if (digits && s + 2 + digits <= end) {
            unsigned long v = 0;
            for (int i = 0; i < digits; i++) {
                int d = hexdig((unsigned char)s[2 + i]);
                if (d < 0) return NULL; /* Python refuses it */
                v = v << 4 | (unsigned long)d;
            }
            if (v > 0x10FFFF) return NULL;
            put_utf8(b, v), s += 2 + digits;
        } else if (c >= '0' && c <= '7') {
            unsigned long v = 0;
            int i = 1;
            for (; i <= 3 && s + i < end && s[i] >= '0' && s[i] <= '7'; i++) v = v << 3 | (unsigned long)(s[i] - '0');
            put_utf8(b, v), s += i;
        } else { /* not an escape: kept as it is */
            put(b, s, 2), s += 2;
        }
    }
    return s < end ? s + 1 : NULL;
}

static const char *skip_space(const char *s, const char *end) {
    while (s < end && (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')) s++;
    return s;
}

/* `set NAME = strftime_now("FMT")` in the template: today's date in FMT into b */
static int put_date_var(sbuf *b, const char *t, size_t n, const char *name, size_t name_len, int64_t now) {
    char pat[80], fmt[64], date[128];
    if (name_len > 40) return -1;
    snprintf(pat, sizeof pat, "set %.*s = strftime_now(", (int)name_len, name);
    const char *p = find(t, n, pat, 0);
    if (!p) return -1;
    p += strlen(pat);
    if (p >= t + n || (*p != '"' && *p != '\'')) return -1;
    sbuf fb = {fmt, sizeof fmt, 0, NULL, 0, 0, 0};
    if (!jinja_string(&fb, p, t + n) || fb.n >= sizeof fmt) return -1;
    fmt[fb.n] = 0;
    date_of(now, fmt, date, sizeof date);
    puts_(b, date);
    return 0;
}

int chat_default_system(const char *t, size_t n, int64_t now, char *out, size_t cap) {
    static const char key[] = "set default_system_message =";
    const char *p = t ? find(t, n, key, 0) : NULL, *end = t + n;
    if (!out || cap == 0) return CHAT_ESPACE;
    out[0] = 0;
    if (!p) return 0;
    sbuf b = {out, cap, 0, NULL, 0, 0, 0};
    for (p = skip_space(p + sizeof key - 1, end);; p = skip_space(p + 1, end)) {
        if (p < end && (*p == '"' || *p == '\'')) {
            if (!(p = jinja_string(&b, p, end))) goto none;
        } else {
            const char *id = p;
            while (p < end && (*p == '_' || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9')))
                p++;
            if (p == id || put_date_var(&b, t, n, id, (size_t)(p - id), now) < 0) goto none;
        }
        p = skip_space(p, end);
        if (p < end && *p == '+') continue;
        if (p < end && (*p == '%' || *p == '-')) break; /* %} or -%}: the end of the set */
        goto none; /* an expression kiln does not evaluate */
    }
    if (b.n >= cap || b.n > 0x7FFFFFFF) {
        out[0] = 0;
        return CHAT_ESPACE;
    }
    if (memchr(out, 0, b.n)) goto none; /* a NUL (raw or \x00) would cut the C string short */
    out[b.n] = 0;
    return (int)b.n;
none: /* what was written of an expression kiln cannot read is not a default */
    out[0] = 0;
    return 0;
}
