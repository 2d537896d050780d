/* prompt: a request's text to the token ids the engine runs, the one path every caller
 * takes (the server's GEN, kilnd generate, bench-engine's prompt files), so they cannot
 * disagree on the template or on which text may name special tokens.
 *
 * With chat on, the system message (if any) and the user text are rendered through the
 * model's chat template (core/chat.h) and the result is tokenized with special-token
 * texts parsed where the template wrote them and nowhere in the messages' own texts, so
 * "<|im_end|>" typed by a user stays text and cannot open a turn of another role. Plain
 * text parses them only when the caller asks (kilnd tokenize --special, generate
 * --special). A prompt
 * builder owns its scratch: nothing is allocated per request. */
#ifndef KILN_PROMPT_H
#define KILN_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "core/chat.h"
#include "core/gguf.h"
#include "core/tokenizer.h"

#define PROMPT_TEMPLATE_MAX 4096 /* bytes a chat template adds around the messages */

enum { PROMPT_ETEMPLATE = -1, PROMPT_ESPACE = -2, PROMPT_ETOKENIZE = -3 };

typedef struct {
    const tok_t *tok;
    int chat_kind;   /* CHAT_* the template requests render with */
    char *text;      /* [text_cap] the rendered conversation */
    size_t text_cap;
    int32_t *ids;    /* [ids_cap] the last prompt_build's ids */
    int ids_cap;
    size_t *spans;   /* [2 * max_spans] the caller texts' byte ranges in text */
    int max_spans;
    char *tmpl;      /* the model's chat template, when it sets a default system message
                      * (chat_default_system), else NULL */
    size_t tmpl_len;
    char *dflt;      /* [dflt_cap] that message, evaluated per request (its date) */
    size_t dflt_cap;
} prompt_builder;

typedef struct {
    const char *system; /* NUL-terminated; NULL: none (chat only) */
    const char *user;   /* NUL-terminated UTF-8 (any bytes without chat) */
    size_t user_len;
    int chat;           /* render through the chat template */
    int special;        /* plain text: special-token texts become their ids */
    const chat_msg *msgs; /* with chat: a whole conversation (role-tagged turns) rendered
                           * instead of system + user; NULL: system + user */
    int n_msgs;
} prompt_req;

/* The template kind for [model] chat_template (CFG_TEMPLATE_*): the configured one, or
 * with `auto` the one the GGUF's tokenizer.chat_template names. */
int prompt_chat_kind(const gguf_file *f, int cfg_template);
/* The line to warn the operator with when chat_kind is no template kiln knows (the
 * model's template unrecognised, and [model] chat_template not set): chat requests then
 * get an error. NULL for a known kind. */
const char *prompt_chat_warning(int chat_kind);
/* Scratch for prompts whose system and user texts (or messages: their contents and
 * roles, plus PROMPT_MSG_OVERHEAD each) add up to max_input bytes. 0 or -ENOMEM. */
#define PROMPT_MSG_OVERHEAD 64 /* bytes a template adds around one more message, at most */
int prompt_init(prompt_builder *pb, const tok_t *tok, int chat_kind, size_t max_input);
/* After prompt_init: conversations without a system message get the default one the
 * GGUF's chat template sets (Mistral's [SYSTEM_PROMPT] kinds), read from the template at
 * each request, with room for it added. 0 or -ENOMEM. */
int prompt_template(prompt_builder *pb, const gguf_file *f);
void prompt_free(prompt_builder *pb);
/* The prompt's ids in pb->ids: their count, or PROMPT_E* (an input over max_input is
 * PROMPT_ESPACE). */
int prompt_build(prompt_builder *pb, const prompt_req *r);
/* One line for a PROMPT_E* code. */
const char *prompt_strerror(int code);

#endif
