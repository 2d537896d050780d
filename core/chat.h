/* chat: render a conversation the way the model's tokenizer.chat_template (Jinja) would,
 * for the template families kiln knows. The output holds special-token texts
 * ("<|im_start|>"): tokenize it with parse_special=1 and without adding BOS. */
#ifndef KILN_CHAT_H
#define KILN_CHAT_H
#include <stddef.h>
#include "core/gguf.h"

enum {
    CHAT_UNKNOWN = 0,  /* a template kiln cannot render */
    CHAT_CHATML = 1,   /* <|im_start|>role\n...<|im_end|>\n, no default system message */
    CHAT_SMOLLM = 2,   /* ChatML + SmolLM2's default system message */
    CHAT_QWEN2 = 3,    /* ChatML + "You are a helpful assistant." */
    CHAT_QWEN25 = 4,   /* ChatML + "You are Qwen, created by Alibaba Cloud. ..." */
    CHAT_LLAMA3 = 5,   /* <|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\n... */
};
enum { CHAT_EINVAL = -1, CHAT_ESPACE = -2 };

typedef struct {
    const char *role;    /* "system", "user", "assistant", ... (NUL-terminated) */
    const char *content; /* NUL-terminated UTF-8 */
} chat_msg;

/* Kind from the GGUF's tokenizer.chat_template; a file without one gets CHAT_CHATML. */
int chat_detect(const gguf_file *f);
int chat_detect_text(const char *tmpl, size_t len);
const char *chat_name(int kind);
/* Renders msgs into out (NUL-terminated). Returns the length, CHAT_ESPACE when cap is too
 * small, CHAT_EINVAL for an unknown kind or a NULL role/content. */
int chat_format(int kind, const chat_msg *msgs, int n, int add_generation_prompt, char *out,
                size_t cap);

#endif
