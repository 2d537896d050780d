/* chat: render a conversation the way the model's tokenizer.chat_template (Jinja) would,
 * for the template families kiln knows. The output holds special-token texts
 * ("<|im_start|>", "<bos>"): tokenize it with parse_special=1 and without adding BOS.
 * Where a template refuses a conversation (raise_exception: roles that do not alternate,
 * a role it has no place for), chat_format refuses it too (CHAT_EINVAL). */
#ifndef KILN_CHAT_H
#define KILN_CHAT_H
#include <stddef.h>
#include <stdint.h>
#include "core/gguf.h"

enum {
    CHAT_UNKNOWN = 0,  /* a template kind cannot render */
    CHAT_CHATML = 1,   /* <|im_start|>role\n...<|im_end|>\n, no default system message */
    CHAT_SMOLLM = 2,   /* ChatML + SmolLM2's default system message */
    CHAT_QWEN2 = 3,    /* ChatML + "You are a helpful assistant." */
    CHAT_QWEN25 = 4,   /* ChatML + "You are Qwen, created by Alibaba Cloud. ..." */
    CHAT_LLAMA3 = 5,   /* <|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\n... */
    CHAT_QWEN3 = 6,    /* ChatML; assistant turns after the last user turn keep their
                        * <think> block, earlier ones lose it (enable_thinking undefined) */
    CHAT_QWEN3_NOTHINK = 7, /* Qwen3 with enable_thinking=false: an empty <think> block
                             * after the generation prompt */
    CHAT_GEMMA = 8,    /* <bos><start_of_turn>user\n...<end_of_turn>\n, 'model' for assistant,
                        * a system message folded into the first user turn (Gemma 2 and 3) */
    CHAT_PHI3 = 9,     /* <|system|>\n...<|end|>\n<|user|>\n...<|end|>\n<|assistant|>\n (Phi-3.5) */
    CHAT_PHI3_LEGACY = 10, /* Phi-3-mini's first template: <s>, no system turn, the
                            * assistant prompt after every user turn */
    CHAT_MISTRAL_TEKKEN = 11, /* <s>[INST]...[/INST]...</s>, system before the last user
                               * turn (Mistral Nemo, mistralai's v3-tekken) */
    CHAT_GRANITE3 = 12, /* <|start_of_role|>role<|end_of_role|>...<|end_of_text|>\n and the
                         * default system message with today's date (Granite 3.x) */
    CHAT_LLAMA31 = 13, /* Llama 3.1/3.3: always a system turn opening with "Cutting Knowledge
                        * Date: December 2023\nToday Date: 26 Jul 2024\n\n"; tool results
                        * as ipython turns */
    CHAT_LLAMA32 = 14, /* Llama 3.2: the same with today's date */
    CHAT_PHI4 = 15,    /* <|im_start|>role<|im_sep|>...<|im_end|>, the assistant's opening
                        * after every user turn (Phi-4) */
    CHAT_MISTRAL_SMALL3 = 16, /* <s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...[/INST]...</s>,
                               * user/assistant alternating, tool turns refused (they need
                               * call ids); the system block always (Mistral Small 3.x) */
    CHAT_DEVSTRAL = 17, /* the same markup, no alternation check, tool results as
                         * [TOOL_RESULTS]...[/TOOL_RESULTS] (Devstral) */
    CHAT_MINISTRAL3 = 18, /* the same, alternating, no system message after the first, no
                           * empty assistant text (Ministral 3, Magistral) */
    CHAT_GEMMA4 = 19,  /* <bos><|turn>role\n...<turn|>\n, 'model' for assistant, the model's
                        * <|channel>thoughts<channel|> dropped, tool turns dropped, an empty
                        * thought channel after the generation prompt (Gemma 4) */
    CHAT_GEMMA4_INTERLEAVED = 20, /* Gemma 4's interleaved-thinking template: tool turns kept */
    CHAT_NKINDS = 21
};
enum { CHAT_EINVAL = -1, CHAT_ESPACE = -2 };

typedef struct {
    const char *role;    /* "system", "user", "assistant", ... (NUL-terminated) */
    const char *content; /* NUL-terminated UTF-8 */
} chat_msg;

/* Names by kind, for kiln.ini's [model] chat_template: [0] is "auto" (detect), [k] the
 * name of kind k; NULL-terminated. */
extern const char *const chat_template_names[CHAT_NKINDS + 1];

/* Kind from the GGUF's tokenizer.chat_template; a file without one gets CHAT_CHATML. */
int chat_detect(const gguf_file *f);
int chat_detect_text(const char *tmpl, size_t len);
const char *chat_name(int kind); /* "unknown" for CHAT_UNKNOWN and out-of-range kinds */
/* Renders msgs into out (NUL-terminated). Returns the length, CHAT_ESPACE when cap is too
 * small, CHAT_EINVAL for an unknown kind, a NULL role/content or a conversation the
 * template refuses. */
int chat_format(int kind, const chat_msg *msgs, int n, int add_generation_prompt, char *out,
                size_t cap);
/* chat_format_at, and the byte ranges of the output that hold the caller's texts (the
 * messages' contents and roles) as [spans[2i], spans[2i + 1]) pairs, at most max_spans of
 * them (more: CHAT_ESPACE), their count in *n_spans: a prompt is tokenized with special
 * tokens parsed outside them only, so user text cannot write the template's markup. */
int chat_format_spans(int kind, const chat_msg *msgs, int n, int add_generation_prompt, int64_t now,
                      char *out, size_t cap, size_t *spans, int max_spans, int *n_spans);
/* The default system message a template sets for conversations that open without one
 * (Mistral's `set default_system_message = ...`: string literals and strftime_now dates
 * joined by +), evaluated at now into out (NUL-terminated): its length, 0 when the template
 * sets none kiln can read, CHAT_ESPACE when cap is too small. kiln keeps no copy of these
 * texts: they come from the model's own template. */
int chat_default_system(const char *tmpl, size_t len, int64_t now, char *out, size_t cap);
/* chat_format_spans with that default (the Mistral [SYSTEM_PROMPT] kinds render it, as the
 * template's text, where the conversation has no system message; NULL: none). */
int chat_format_dflt(int kind, const char *default_system, const chat_msg *msgs, int n, int add_generation_prompt,
                     int64_t now, char *out, size_t cap, size_t *spans, int max_spans, int *n_spans);
/* The same with the time templates print as today's date (Granite, Llama 3.2): Unix seconds, shown
 * in local time as strftime_now does. chat_format uses the clock. */
int chat_format_at(int kind, const chat_msg *msgs, int n, int add_generation_prompt, int64_t now,
                   char *out, size_t cap);

#endif
