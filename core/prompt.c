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

const char *prompt_chat_warning(int chat_kind) {
    if (chat_kind != CHAT_UNKNOWN) return NULL;
    return "the model's chat template is not one kiln knows: chat requests (GEN chat=1, "
           "/v1/chat/completions) get an error until [model] chat_template names one";
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

int prompt_template(prompt_builder *pb, const gguf_file *f) {
    gguf_str s;
    if (!f || gguf_get_str(f, "tokenizer.chat_template", &s) != 0) return 0;
    char probe[1];
    int k = chat_default_system(s.ptr, (size_t)s.len, (int64_t)time(NULL), probe, sizeof probe);
    if (k == 0) return 0; /* none */
    /* room for it as it reads now, and for a date that prints longer another day */
    for (size_t cap = 4096; k == CHAT_ESPACE && cap <= ((size_t)1 << 24); cap *= 2) {
        char *p = realloc(pb->dflt, cap);
        if (!p) return -ENOMEM;
        pb->dflt = p, pb->dflt_cap = cap;
        k = chat_default_system(s.ptr, (size_t)s.len, (int64_t)time(NULL), pb->dflt, pb->dflt_cap);
    }
    if (k <= 0) return 0;
    size_t room = (size_t)k + 256, text_cap = pb->text_cap + room;
    char *t = realloc(pb->text, text_cap), *tmpl = malloc((size_t)s.len + 1), *d = realloc(pb->dflt, room);
    int32_t *ids = t ? realloc(pb->ids, (text_cap + 2) * sizeof *ids) : NULL;
    if (t) pb->text = t;
    if (d) pb->dflt = d, pb->dflt_cap = room;
    if (ids) pb->ids = ids;
    if (!t || !tmpl || !d || !ids || text_cap + 2 > (size_t)INT32_MAX) {
        free(tmpl);
        return -ENOMEM;
    }
    memcpy(tmpl, s.ptr, (size_t)s.len);
    tmpl[s.len] = 0;
    pb->tmpl = tmpl, pb->tmpl_len = (size_t)s.len;
    pb->text_cap = text_cap, pb->ids_cap = (int)text_cap + 2;
    return 0;
}

void prompt_free(prompt_builder *pb) {
    free(pb->text);
    free(pb->ids);
    free(pb->spans);
    free(pb->tmpl);
    free(pb->dflt);
    memset(pb, 0, sizeof *pb);
}

/* msgs through the template into pb->text, the caller texts' ranges into pb->spans */
static int render(prompt_builder *pb, const chat_msg *msgs, int n, size_t *len, int *n_spans) {
    int64_t now = (int64_t)time(NULL);
    const char *dflt = NULL;
    if (pb->tmpl && chat_default_system(pb->tmpl, pb->tmpl_len, now, pb->dflt, pb->dflt_cap) > 0) dflt = pb->dflt;
    int k = chat_format_dflt(pb->chat_kind, dflt, msgs, n, 1, now, pb->text, pb->text_cap, pb->spans, pb->max_spans,
                             n_spans);
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
