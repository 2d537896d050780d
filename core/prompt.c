/* prompt: a request's text to token ids (core/prompt.h). */
#include "core/prompt.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/chat.h"
#include "core/config.h"

int prompt_chat_kind(const gguf_file *f, int cfg_template) {
    if (cfg_template > CFG_TEMPLATE_AUTO && cfg_template < CHAT_NKINDS) return cfg_template;
    return chat_detect(f);
}

int prompt_init(prompt_builder *pb, const tok_t *tok, int chat_kind, size_t max_input) {
    memset(pb, 0, sizeof *pb);
    if (max_input > (size_t)INT32_MAX / 2) return -ENOMEM;
    pb->tok = tok, pb->chat_kind = chat_kind;
    pb->text_cap = max_input + PROMPT_TEMPLATE_MAX;
    pb->ids_cap = (int)pb->text_cap + 2; /* tok_encode needs at most len + 2 */
    pb->text = malloc(pb->text_cap);
    pb->ids = malloc((size_t)pb->ids_cap * sizeof *pb->ids);
    /* a message is at least PROMPT_MSG_OVERHEAD of the budget and leaves at most 4 spans
     * (its role, its text; Qwen3's assistant turns split reasoning from answer) */
    pb->max_spans = (int)(pb->text_cap / PROMPT_MSG_OVERHEAD) * 4 + 16;
    pb->spans = malloc((size_t)pb->max_spans * 2 * sizeof *pb->spans);
    if (!pb->text || !pb->ids || !pb->spans) {
        prompt_free(pb);
        return -ENOMEM;
    }
    return 0;
}

void prompt_free(prompt_builder *pb) {
    free(pb->text);
    free(pb->ids);
    free(pb->spans);
    memset(pb, 0, sizeof *pb);
}

/* msgs through the template into pb->text, the caller texts' ranges into pb->spans */
static int render(prompt_builder *pb, const chat_msg *msgs, int n, size_t *len, int *n_spans) {
    int k = chat_format_spans(pb->chat_kind, msgs, n, 1, (int64_t)time(NULL), pb->text, pb->text_cap,
                              pb->spans, pb->max_spans, n_spans);
    if (k == CHAT_ESPACE) return PROMPT_ESPACE;
    if (k < 0) return PROMPT_ETEMPLATE;
    *len = (size_t)k;
    return 0;
}

int prompt_build(prompt_builder *pb, const prompt_req *r) {
    const char *text = r->user;
    size_t len = r->user_len;
    int n_spans = 0, rc;
    size_t sys_len = r->chat && r->system ? strlen(r->system) : 0;
    if (len + sys_len + PROMPT_TEMPLATE_MAX > pb->text_cap) return PROMPT_ESPACE;
    if (r->chat && r->msgs) {
        size_t need = PROMPT_TEMPLATE_MAX;
        for (int i = 0; i < r->n_msgs; i++)
            need += strlen(r->msgs[i].role) + strlen(r->msgs[i].content) + PROMPT_MSG_OVERHEAD;
        if (r->n_msgs < 1 || need > pb->text_cap) return r->n_msgs < 1 ? PROMPT_ETEMPLATE : PROMPT_ESPACE;
        if ((rc = render(pb, r->msgs, r->n_msgs, &len, &n_spans)) < 0) return rc;
        text = pb->text;
    } else if (r->chat) {
        chat_msg msgs[2];
        int n = 0;
        if (r->system) msgs[n++] = (chat_msg){"system", r->system};
        /* a system message alone is a conversation too; an empty user turn is not added */
        if (len || !r->system) msgs[n++] = (chat_msg){"user", r->user};
        if ((rc = render(pb, msgs, n, &len, &n_spans)) < 0) return rc;
        text = pb->text;
    }
    int n = r->chat ? tok_encode_plain(pb->tok, text, len, pb->spans, n_spans, pb->ids, pb->ids_cap)
                    : tok_encode(pb->tok, text, len, r->special, pb->ids, pb->ids_cap);
    return n < 0 ? PROMPT_ETOKENIZE : n;
}

const char *prompt_strerror(int code) {
    switch (code) {
    case PROMPT_ETEMPLATE: return "cannot apply the chat template";
    case PROMPT_ESPACE: return "the prompt is too long";
    case PROMPT_ETOKENIZE: return "tokenizing the prompt failed";
    default: return "cannot build the prompt";
    }
}
