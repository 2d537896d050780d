/* api: OpenAI request bodies to GEN's request (net/api.h).
 *
 * Each top-level field is looked up in one table per endpoint: what it is and how it
 * lands in the request. Numbers are read as their raw text (YYJSON_READ_NUMBER_AS_RAW)
 * and handed to proto_gen_set as GEN would see them in a line, so "temperature": 1e400
 * or "n": 2.5 get GEN's own refusal, with the field named. JSON null means "not given"
 * for every optional field, as OpenAI treats it. */
#include "net/api.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yyjson.h>

/* ---------------------------------------------------------------- errors */

__attribute__((format(printf, 4, 5)))
static int api_fail(api_err *e, int status, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    e->status = status;
    return status;
}

/* ---------------------------------------------------------------- parser memory */

int api_parser_init(api_parser *p, size_t max_body) {
    memset(p, 0, sizeof *p);
    p->max_body = max_body;
    p->pool_cap = yyjson_read_max_memory_usage(max_body, YYJSON_READ_NUMBER_AS_RAW);
    if (!p->pool_cap) return -ENOMEM;
    p->pool = malloc(p->pool_cap);
    p->joined = malloc(max_body + 1);
    if (!p->pool || !p->joined) {
        api_parser_free(p);
        return -ENOMEM;
    }
    return 0;
}

void api_parser_free(api_parser *p) {
    free(p->pool);
    free(p->joined);
    memset(p, 0, sizeof *p);
}

/* ---------------------------------------------------------------- values */

/* An object's key (yyjson keys are always strings; "" keeps the compiler sure of it). */
static const char *api_key(yyjson_val *k) {
    const char *s = yyjson_get_str(k);
    return s ? s : "";
}

/* A JSON string without NUL inside (the prompt path takes C strings), or NULL. */
static const char *api_str(yyjson_val *v) {
    if (!yyjson_is_str(v)) return NULL;
    const char *s = yyjson_get_str(v);
    return strlen(s) == yyjson_get_len(v) ? s : NULL;
}

static int api_bad_str(api_err *e, const char *param, yyjson_val *v) {
    if (yyjson_is_str(v)) return api_fail(e, 400, param, "%s: strings cannot hold NUL (\\u0000)", param);
    return api_fail(e, 400, param, "%s must be a string", param);
}

/* A GEN key from a JSON number (raw text) or, for booleans, true/false. */
static int api_gen_set(api_req *r, const char *key, const char *param, yyjson_val *v, api_err *e) {
    proto_str s = {0};
    char tf[2];
    int boolean = !strcmp(key, "logprobs") || !strcmp(key, "ignore_eos");
    if (boolean != yyjson_is_bool(v))
        return api_fail(e, 400, param, "%s must be a %s", param, boolean ? "boolean" : "number");
    if (yyjson_is_bool(v)) {
        tf[0] = yyjson_get_bool(v) ? '1' : '0', tf[1] = 0;
        s.s = tf, s.len = 1;
    } else if (yyjson_is_raw(v)) {
        s.s = (char *)yyjson_get_raw(v), s.len = yyjson_get_len(v);
    } else {
        return api_fail(e, 400, param, "%s must be a number", param);
    }
    char err[160];
    if (proto_gen_set(&r->g, key, &s, err, sizeof err) < 0) {
        /* GEN's message names its own key; say the field's name instead */
        const char *tail = !strncmp(err, key, strlen(key)) ? err + strlen(key) : err;
        return api_fail(e, 400, param, "%s%s%s", param, tail == err ? ": " : "", tail);
    }
    return 0;
}

/* A non-negative integer that must be at most hi (top_logprobs, logprobs of completions). */
static int api_small_int(yyjson_val *v, int hi, int *out) {
    if (!yyjson_is_raw(v)) return -1;
    const char *s = yyjson_get_raw(v);
    size_t n = yyjson_get_len(v);
    if (n == 0 || n > 3) return -1;
    int x = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        x = x * 10 + (s[i] - '0');
    }
    if (x > hi) return -1;
    *out = x;
    return 0;
}

/* stop: a string or a list of strings, each a GEN stop string. */
static int api_stop(api_req *r, yyjson_val *v, api_err *e) {
    char err[160];
    if (yyjson_is_str(v) || yyjson_is_arr(v)) {
        size_t n = yyjson_is_str(v) ? 1 : yyjson_arr_size(v);
        for (size_t i = 0; i < n; i++) {
            yyjson_val *it = yyjson_is_str(v) ? v : yyjson_arr_get(v, i);
            const char *s = api_str(it);
            if (!s) return api_bad_str(e, "stop", it);
            proto_str ps = {(char *)s, strlen(s), 1};
            if (proto_gen_set(&r->g, "stop", &ps, err, sizeof err) < 0)
                return api_fail(e, 400, "stop", "%s", err);
        }
        return 0;
    }
    return api_fail(e, 400, "stop", "stop must be a string or a list of strings");
}

/* ---------------------------------------------------------------- messages */

static const char *api_role(const char *role) {
    if (!strcmp(role, "system") || !strcmp(role, "developer")) return "system";
    if (!strcmp(role, "user")) return "user";
    if (!strcmp(role, "assistant")) return "assistant";
    return NULL;
}

/* content as a list of parts: the text parts joined into the parser's buffer (their
 * total is below the body's size, so it always fits). */
static int api_parts(api_parser *p, yyjson_val *arr, int i, const char **out, api_err *e) {
    char param[80];
    const char *start = p->joined + p->joined_len;
    size_t j, max;
    yyjson_val *part;
    yyjson_arr_foreach(arr, j, max, part) {
        snprintf(param, sizeof param, "messages[%d].content[%zu]", i, j);
        if (!yyjson_is_obj(part)) return api_fail(e, 400, param, "%s must be an object", param);
        yyjson_val *type = yyjson_obj_get(part, "type"), *text = yyjson_obj_get(part, "text");
        if (!yyjson_equals_str(type, "text") || yyjson_obj_size(part) != 2)
            return api_fail(e, 400, param, "%s: only {\"type\": \"text\", \"text\": ...} parts are supported", param);
        const char *t = api_str(text);
        if (!t) return api_bad_str(e, param, text);
        size_t n = strlen(t);
        if (p->joined_len + n + 1 > p->max_body + 1) return api_fail(e, 413, param, "content too long");
        memcpy(p->joined + p->joined_len, t, n);
        p->joined_len += n;
    }
    p->joined[p->joined_len++] = '\0';
    *out = start;
    return 0;
}

static int api_message(api_parser *p, api_req *r, yyjson_val *m, int i, api_err *e) {
    char param[80];
    snprintf(param, sizeof param, "messages[%d]", i);
    if (!yyjson_is_obj(m)) return api_fail(e, 400, param, "%s must be an object", param);
    const char *role = NULL, *content = NULL;
    size_t k, max;
    yyjson_val *key, *v;
    yyjson_obj_foreach(m, k, max, key, v) {
        const char *name = api_key(key);
        snprintf(param, sizeof param, "messages[%d].%.40s", i, name);
        if (!strcmp(name, "role")) {
            const char *s = api_str(v);
            if (!s || !(role = api_role(s)))
                return api_fail(e, 400, param, "%s must be \"system\", \"developer\", \"user\" or \"assistant\"", param);
        } else if (!strcmp(name, "content")) {
            if (yyjson_is_null(v)) content = "";
            else if (yyjson_is_arr(v)) {
                int rc = api_parts(p, v, i, &content, e);
                if (rc) return rc;
            } else if (!(content = api_str(v))) {
                return api_bad_str(e, param, v);
            }
        } else {
            return api_fail(e, 400, param, "%s is not supported by kiln", param);
        }
    }
    snprintf(param, sizeof param, "messages[%d]", i);
    if (!role) return api_fail(e, 400, param, "%s has no role", param);
    if (!content) return api_fail(e, 400, param, "%s has no content", param);
    r->msgs[r->n_msgs++] = (chat_msg){role, content};
    return 0;
}

static int api_messages(api_parser *p, api_req *r, yyjson_val *v, api_err *e) {
    if (!yyjson_is_arr(v)) return api_fail(e, 400, "messages", "messages must be a list");
    size_t n = yyjson_arr_size(v);
    if (n == 0) return api_fail(e, 400, "messages", "messages must not be empty");
    if (n > API_MAX_MESSAGES) return api_fail(e, 400, "messages", "at most %d messages", API_MAX_MESSAGES);
    size_t i, max;
    yyjson_val *m;
    yyjson_arr_foreach(v, i, max, m) {
        int rc = api_message(p, r, m, (int)i, e);
        if (rc) return rc;
    }
    return 0;
}

/* completions: a string, or a list holding one string (the client's batch form). */
static int api_prompt(api_req *r, yyjson_val *v, api_err *e) {
    if (yyjson_is_arr(v)) {
        if (yyjson_arr_size(v) != 1 || !yyjson_is_str(yyjson_arr_get_first(v)))
            return api_fail(e, 400, "prompt", "prompt must be a string (or a list of exactly one; "
                            "several prompts or token ids are not supported)");
        v = yyjson_arr_get_first(v);
    }
    const char *s = api_str(v);
    if (!s) return api_bad_str(e, "prompt", v);
    r->g.prompt = s, r->g.prompt_len = strlen(s);
    return 0;
}

/* ---------------------------------------------------------------- the field table */

enum {
    AF_MODEL, AF_MESSAGES, AF_PROMPT, AF_STREAM, AF_STREAM_OPTIONS, AF_GEN, AF_MAX_TOKENS,
    AF_MAX_COMPLETION, AF_STOP, AF_TOP_LOGPROBS, AF_LOGPROBS_N, AF_USER, AF_FALSE, AF_EMPTY,
    AF_ONE, AF_UNSUPPORTED,
};

typedef struct {
    const char *name;
    int how;
    const char *gen_key; /* AF_GEN: the GEN key it sets */
    unsigned kinds;      /* 1 << API_CHAT | 1 << API_COMPLETIONS */
} api_field;

#define CH (1u << API_CHAT)
#define CO (1u << API_COMPLETIONS)
static const api_field api_fields[] = {
    {"model", AF_MODEL, NULL, CH | CO},
    {"messages", AF_MESSAGES, NULL, CH},
    {"prompt", AF_PROMPT, NULL, CO},
    {"stream", AF_STREAM, NULL, CH | CO},
    {"stream_options", AF_STREAM_OPTIONS, NULL, CH | CO},
    {"max_tokens", AF_MAX_TOKENS, NULL, CH | CO},
    {"max_completion_tokens", AF_MAX_COMPLETION, NULL, CH},
    {"temperature", AF_GEN, "temperature", CH | CO},
    {"top_p", AF_GEN, "top_p", CH | CO},
    {"n", AF_GEN, "n", CH | CO},
    {"seed", AF_GEN, "seed", CH | CO},
    {"presence_penalty", AF_GEN, "presence_penalty", CH | CO},
    {"frequency_penalty", AF_GEN, "frequency_penalty", CH | CO},
    {"logprobs", AF_GEN, "logprobs", CH},
    {"logprobs", AF_LOGPROBS_N, NULL, CO},
    {"top_logprobs", AF_TOP_LOGPROBS, NULL, CH},
    {"stop", AF_STOP, NULL, CH | CO},
    {"user", AF_USER, NULL, CH | CO},       /* an end-user id for the caller's records */
    {"echo", AF_FALSE, NULL, CO},
    {"suffix", AF_EMPTY, NULL, CO},
    {"logit_bias", AF_EMPTY, NULL, CH | CO},
    {"best_of", AF_ONE, NULL, CO},
    /* kiln's extras, as vLLM and llama.cpp's server name them */
    {"top_k", AF_GEN, "top_k", CH | CO},
    {"min_p", AF_GEN, "min_p", CH | CO},
    {"repetition_penalty", AF_GEN, "repeat_penalty", CH | CO},
    {"ignore_eos", AF_GEN, "ignore_eos", CH | CO},
};
#undef CH
#undef CO

/* OpenAI's fields that kiln knows of and does not implement: refused as such, with the
 * same 400 and param as an unknown field, but a message that says which it is. */
static int api_openai_only(const char *name) {
    static const char *const names[] = {
        "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call", "response_format",
        "audio", "modalities", "prediction", "reasoning_effort", "service_tier", "store", "metadata",
        "web_search_options", "verbosity", "safety_identifier", "prompt_cache_key", NULL};
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], name)) return 1;
    return 0;
}

static const api_field *api_field_find(int kind, const char *name) {
    for (size_t i = 0; i < sizeof api_fields / sizeof api_fields[0]; i++)
        if ((api_fields[i].kinds & (1u << kind)) && !strcmp(api_fields[i].name, name)) return &api_fields[i];
    return NULL;
}

/* Fields whose value is a feature kiln does not have (only the "not given" forms pass:
 * false, "", {}, 1). */
static int api_field_neutral(const api_field *f, yyjson_val *v) {
    switch (f->how) {
    case AF_FALSE: return yyjson_is_false(v);
    case AF_EMPTY: return (yyjson_is_str(v) && !yyjson_get_len(v)) || (yyjson_is_obj(v) && !yyjson_obj_size(v));
    case AF_ONE: return yyjson_is_raw(v) && yyjson_get_len(v) == 1 && yyjson_get_raw(v)[0] == '1';
    }
    return 0;
}

static int api_stream_options(api_req *r, yyjson_val *v, api_err *e) {
    if (!yyjson_is_obj(v)) return api_fail(e, 400, "stream_options", "stream_options must be an object");
    size_t k, max;
    yyjson_val *key, *val;
    yyjson_obj_foreach(v, k, max, key, val) {
        if (strcmp(api_key(key), "include_usage"))
            return api_fail(e, 400, "stream_options", "stream_options.%.40s is not supported by kiln",
                            api_key(key));
        if (yyjson_is_null(val)) continue;
        if (!yyjson_is_bool(val))
            return api_fail(e, 400, "stream_options", "stream_options.include_usage must be a boolean");
        r->include_usage = yyjson_get_bool(val);
    }
    return 0;
}

static int api_field_apply(api_parser *p, api_req *r, const api_field *f, yyjson_val *v, api_err *e,
                           yyjson_val **max_tok, yyjson_val **max_comp, int *has_stream_opts) {
    int x;
    switch (f->how) {
    case AF_MODEL:
        if (!(r->model = api_str(v))) return api_bad_str(e, "model", v);
        return 0;
    case AF_MESSAGES: return api_messages(p, r, v, e);
    case AF_PROMPT: return api_prompt(r, v, e);
    case AF_STREAM:
        if (!yyjson_is_bool(v)) return api_fail(e, 400, "stream", "stream must be a boolean");
        r->stream = yyjson_get_bool(v);
        return 0;
    case AF_STREAM_OPTIONS:
        *has_stream_opts = 1;
        return api_stream_options(r, v, e);
    case AF_GEN: return api_gen_set(r, f->gen_key, f->name, v, e);
    case AF_MAX_TOKENS: *max_tok = v; return 0;
    case AF_MAX_COMPLETION: *max_comp = v; return 0;
    case AF_STOP: return api_stop(r, v, e);
    case AF_TOP_LOGPROBS:
        if (api_small_int(v, 20, &x) < 0)
            return api_fail(e, 400, "top_logprobs", "top_logprobs must be an integer in 0..20");
        r->g.top_logprobs = (int)x; /* needs logprobs: true, checked once all fields are read */
        return 0;
    case AF_LOGPROBS_N: /* completions: the sampled token's logprob and the N most likely */
        if (api_small_int(v, 5, &x) < 0)
            return api_fail(e, 400, "logprobs", "logprobs must be an integer in 0..5");
        r->g.logprobs = 1, r->g.top_logprobs = (int)x;
        return 0;
    case AF_USER:
        if (!yyjson_is_str(v)) return api_fail(e, 400, "user", "user must be a string");
        return 0;
    default:
        if (api_field_neutral(f, v)) return 0;
        return api_fail(e, 400, f->name, "%s is not supported by kiln", f->name);
    }
}

static int api_max_tokens(api_req *r, yyjson_val *v, const char *param, api_err *e) {
    if (!v) return 0;
    if (!yyjson_is_raw(v)) return api_fail(e, 400, param, "%s must be an integer", param);
    return api_gen_set(r, "max_tokens", param, v, e);
}

static int api_fields_of(api_parser *p, api_req *r, yyjson_val *root, api_err *e) {
    yyjson_val *max_tok = NULL, *max_comp = NULL, *key, *v;
    int has_stream_opts = 0, rc;
    unsigned seen = 0;
    size_t k, max;
    _Static_assert(sizeof api_fields / sizeof api_fields[0] <= 32, "seen is 32 bits");
    yyjson_obj_foreach(root, k, max, key, v) {
        const char *name = api_key(key);
        char param[64];
        snprintf(param, sizeof param, "%.60s", name);
        const api_field *f = api_field_find(r->kind, name);
        if (!f && api_openai_only(name)) return api_fail(e, 400, param, "%s is not supported by kiln", param);
        if (!f) return api_fail(e, 400, param, "unrecognized request argument supplied: %s", param);
        unsigned bit = 1u << (f - api_fields); /* JSON allows a repeated key; a request should not */
        if (seen & bit) return api_fail(e, 400, param, "%s is given twice", param);
        seen |= bit;
        if (yyjson_is_null(v) && f->how != AF_MODEL && f->how != AF_MESSAGES && f->how != AF_PROMPT) continue;
        if ((rc = api_field_apply(p, r, f, v, e, &max_tok, &max_comp, &has_stream_opts))) return rc;
    }
    if ((rc = api_max_tokens(r, max_tok, "max_tokens", e)) || (rc = api_max_tokens(r, max_comp, "max_completion_tokens", e)))
        return rc;
    if (has_stream_opts && !r->stream)
        return api_fail(e, 400, "stream_options", "stream_options is only allowed with stream: true");
    return 0;
}

/* ---------------------------------------------------------------- the body */

int api_parse(api_parser *p, int kind, const char *body, size_t len, api_req *r, api_err *e) {
    memset(e, 0, sizeof *e);
    if (p->doc) yyjson_doc_free(p->doc), p->doc = NULL;
    memset(r, 0, offsetof(api_req, msgs));
    r->n_msgs = 0, r->model = NULL, r->stream = r->include_usage = 0;
    r->kind = kind;
    proto_gen_init(&r->g);
    r->g.chat = kind == API_CHAT;
    p->joined_len = 0;
    if (len > p->max_body) return api_fail(e, 413, "", "the body is over %zu bytes", p->max_body);
    yyjson_alc alc;
    if (!yyjson_alc_pool_init(&alc, p->pool, p->pool_cap)) return api_fail(e, 413, "", "no memory for the body");
    yyjson_read_err rerr;
    p->doc = yyjson_read_opts((char *)body, len, YYJSON_READ_NUMBER_AS_RAW, &alc, &rerr);
    if (!p->doc) {
        /* the pool holds any valid document of max_body bytes (yyjson's own bound), so
         * running out means a malformed one (e.g. thousands of unclosed brackets) */
        if (rerr.code == YYJSON_READ_ERROR_MEMORY_ALLOCATION)
            return api_fail(e, 400, "", "the body is not valid JSON (unbalanced or too deeply nested)");
        return api_fail(e, 400, "", "the body is not valid JSON: %s at byte %zu", rerr.msg, rerr.pos);
    }
    yyjson_val *root = yyjson_doc_get_root(p->doc);
    if (!yyjson_is_obj(root)) return api_fail(e, 400, "", "the body must be a JSON object");
    int rc = api_fields_of(p, r, root, e);
    if (rc) return rc;
    if (!r->model) return api_fail(e, 400, "model", "model is required");
    if (kind == API_CHAT && !r->n_msgs) return api_fail(e, 400, "messages", "messages is required");
    if (kind == API_CHAT && r->g.top_logprobs && !r->g.logprobs)
        return api_fail(e, 400, "top_logprobs", "top_logprobs needs logprobs: true");
    if (kind == API_COMPLETIONS && !r->g.prompt) return api_fail(e, 400, "prompt", "prompt is required");
    return 0;
}

/* ---------------------------------------------------------------- output */

/* The length of the valid UTF-8 sequence at p[0..n) (1..4), or 0. */
static size_t api_utf8_len(const unsigned char *p, size_t n) {
    unsigned char c = p[0];
    size_t k;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) k = 2;
    else if (c >= 0xe0 && c <= 0xef) k = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4) k = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    else return 0;
    if (n < k || p[1] < lo || p[1] > hi) return 0;
    for (size_t i = 2; i < k; i++)
        if (p[i] < 0x80 || p[i] > 0xbf) return 0;
    return k;
}

long api_json_escape(char *out, size_t cap, const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        char esc[8];
        const char *w = esc;
        size_t wl, adv = 1;
        if (c == '"') w = "\\\"", wl = 2;
        else if (c == '\\') w = "\\\\", wl = 2;
        else if (c == '\n') w = "\\n", wl = 2;
        else if (c == '\r') w = "\\r", wl = 2;
        else if (c == '\t') w = "\\t", wl = 2;
        else if (c < 0x20 || c == 0x7f) wl = (size_t)snprintf(esc, sizeof esc, "\\u%04x", c);
        else if (c < 0x80) w = (const char *)p + i, wl = 1;
        else if ((adv = api_utf8_len(p + i, n - i)) > 0) w = (const char *)p + i, wl = adv;
        else w = "\\ufffd", wl = 6, adv = 1;
        if (cap - o < wl) return -ENOSPC;
        memcpy(out + o, w, wl);
        o += wl, i += adv;
    }
    return (long)o;
}
