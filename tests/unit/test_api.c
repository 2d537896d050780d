/* test_api: net/api, the OpenAI request bodies. A full chat and completions body and where
 * each field lands in GEN's request; null as "not given"; every refusal class with the
 * field it names (unknown, unimplemented, wrong type, out of GEN's range, repeated, bad
 * messages and parts, NUL in a string, bad JSON, not an object); the body limit at and
 * just past it; api_json_escape's output and its bound. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/api.h"
#include "tests/unit/check.h"

#define MAX_BODY 4096

static api_parser P;
static api_req R;
static api_err E;

/* api_parse over an exact-size heap copy (ASan sees any read past the body). */
static int parse(int kind, const char *s) {
    size_t n = strlen(s);
    char *b = malloc(n ? n : 1);
    memcpy(b, s, n);
    int rc = api_parse(&P, kind, b, n, &R, &E);
    free(b);
    return rc;
}

/* The body is refused with status and names param. */
#define REFUSED(kind, body, status, want)                                                         \
    do {                                                                                          \
        int rc_ = parse(kind, body);                                                              \
        CHECK(rc_ == (status) && !strcmp(E.param, want), "%s: rc %d param \"%s\" (%s)", body, rc_, \
              E.param, E.msg);                                                                    \
    } while (0)

#define CHAT(rest) "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]" rest "}"

static void test_chat(void) {
    int rc = parse(API_CHAT, "{\"model\":\"kiln-m\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
                             "{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":null},"
                             "{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                             "{\"type\":\"text\",\"text\":\"b\\u00e9\"}]}],"
                             "\"temperature\":0.5,\"top_p\":0.9,\"n\":2,\"seed\":7,\"max_tokens\":9,"
                             "\"presence_penalty\":-1.5,\"frequency_penalty\":1,\"stop\":[\"x\",\"yy\"],"
                             "\"logprobs\":true,\"top_logprobs\":0,\"stream\":true,"
                             "\"stream_options\":{\"include_usage\":true},\"user\":\"u1\","
                             "\"top_k\":40,\"min_p\":0.05,\"repetition_penalty\":1.1,\"logit_bias\":{}}");
    CHECK(rc == 0, "full chat: %d %s (%s)", rc, E.msg, E.param);
    CHECK(R.kind == API_CHAT && R.g.chat == 1 && !strcmp(R.model, "kiln-m"), "kind, model");
    CHECK(R.n_msgs == 4 && !strcmp(R.msgs[0].role, "system") && !strcmp(R.msgs[0].content, "be brief") &&
              !strcmp(R.msgs[2].role, "assistant") && !strcmp(R.msgs[2].content, "") &&
              !strcmp(R.msgs[3].role, "system") && !strcmp(R.msgs[3].content, "ab\xc3\xa9"),
          "messages");
    CHECK(R.g.temperature == 0.5f && R.g.top_p == 0.9f && R.g.n == 2 && R.g.seed == 7 && R.g.max_tokens == 9 &&
              R.g.presence_penalty == -1.5f && R.g.frequency_penalty == 1.0f && R.g.top_k == 40 &&
              R.g.min_p == 0.05f && R.g.repeat_penalty == 1.1f && R.g.logprobs == 1,
          "sampling fields");
    unsigned want = PG_TEMPERATURE | PG_TOP_P | PG_SEED | PG_MAX_TOKENS | PG_PRESENCE | PG_FREQUENCY | PG_TOP_K |
                    PG_MIN_P | PG_REPEAT_PENALTY;
    CHECK((R.g.set & want) == want, "set bits 0x%x", R.g.set);
    CHECK(R.g.n_stops == 2 && !strcmp(R.g.stops[0], "x") && !strcmp(R.g.stops[1], "yy"), "stops");
    CHECK(R.stream && R.include_usage, "stream");

    /* null is "not given"; the defaults are GEN's */
    CHECK(parse(API_CHAT, CHAT(",\"temperature\":null,\"stop\":null,\"stream\":null,\"max_tokens\":null,"
                               "\"n\":null,\"seed\":null,\"logprobs\":null")) == 0 &&
              R.g.set == 0 && R.g.n == 1 && !R.stream && R.g.n_stops == 0,
          "nulls: %s", E.msg);
    CHECK(parse(API_CHAT, CHAT(",\"stop\":\"end\"")) == 0 && R.g.n_stops == 1 && !strcmp(R.g.stops[0], "end"),
          "stop as a string");
    CHECK(parse(API_CHAT, CHAT(",\"max_completion_tokens\":5,\"max_tokens\":7")) == 0 && R.g.max_tokens == 5,
          "max_completion_tokens wins");
    CHECK(parse(API_CHAT, CHAT(",\"max_tokens\":0")) == 0 && R.g.max_tokens == 0 && (R.g.set & PG_MAX_TOKENS),
          "max_tokens 0");
    CHECK(parse(API_CHAT, CHAT(",\"ignore_eos\":true")) == 0 && R.g.ignore_eos == 1, "ignore_eos");
    CHECK(parse(API_CHAT, CHAT(",\"top_logprobs\":20,\"logprobs\":true")) == 0 && R.g.top_logprobs == 20 &&
              R.g.logprobs == 1, "top_logprobs 20 with logprobs (either order): %s", E.msg);
    CHECK(parse(API_CHAT, " \n" CHAT("") "\n ") == 0, "whitespace around the object");
}

static void test_completions(void) {
    CHECK(parse(API_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"Once\",\"max_tokens\":3,\"logprobs\":0,"
                                 "\"echo\":false,\"suffix\":\"\",\"best_of\":1}") == 0 &&
              R.kind == API_COMPLETIONS && !R.g.chat && R.g.prompt && !strcmp(R.g.prompt, "Once") &&
              R.g.prompt_len == 4 && R.g.logprobs == 1 && R.n_msgs == 0,
          "completions: %s", E.msg);
    CHECK(parse(API_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[\"one\"]}") == 0 && !strcmp(R.g.prompt, "one"),
          "a list of one prompt");
    REFUSED(API_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[\"a\",\"b\"]}", 400, "prompt");
    REFUSED(API_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[1,2]}", 400, "prompt");
    CHECK(parse(API_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":5}") == 0 && R.g.logprobs == 1 &&
              R.g.top_logprobs == 5, "completions: logprobs 5 is the 5 most likely: %s", E.msg);
    REFUSED(API_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":6}", 400, "logprobs");
    REFUSED(API_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"x\",\"echo\":true}", 400, "echo");
    REFUSED(API_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"x\",\"suffix\":\"s\"}", 400, "suffix");
    REFUSED(API_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"x\",\"best_of\":3}", 400, "best_of");
    REFUSED(API_COMPLETIONS, "{\"model\":\"m\"}", 400, "prompt");
    REFUSED(API_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"x\",\"messages\":[]}", 400, "messages");
    REFUSED(API_CHAT, CHAT(",\"prompt\":\"x\""), 400, "prompt");
}

static void test_refusals(void) {
    REFUSED(API_CHAT, CHAT(",\"frobnicate\":1"), 400, "frobnicate");
    REFUSED(API_CHAT, CHAT(",\"tools\":[]"), 400, "tools");
    CHECK(strstr(E.msg, "not supported by kiln") != NULL, "tools: said to be unsupported: %s", E.msg);
    REFUSED(API_CHAT, CHAT(",\"frobnicate\":[]"), 400, "frobnicate");
    CHECK(strstr(E.msg, "unrecognized") != NULL, "an unknown field: said to be unknown: %s", E.msg);
    REFUSED(API_CHAT, CHAT(",\"response_format\":{\"type\":\"json_object\"}"), 400, "response_format");
    REFUSED(API_CHAT, CHAT(",\"logit_bias\":{\"1\":5}"), 400, "logit_bias");
    REFUSED(API_CHAT, CHAT(",\"top_logprobs\":2"), 400, "top_logprobs"); /* without logprobs: true */
    CHECK(strstr(E.msg, "logprobs: true") != NULL, "top_logprobs alone: says it needs logprobs: %s", E.msg);
    REFUSED(API_CHAT, CHAT(",\"logprobs\":true,\"top_logprobs\":21"), 400, "top_logprobs");
    REFUSED(API_CHAT, CHAT(",\"top_logprobs\":-1"), 400, "top_logprobs");
    REFUSED(API_CHAT, CHAT(",\"temperature\":101"), 400, "temperature");
    REFUSED(API_CHAT, CHAT(",\"temperature\":\"0.5\""), 400, "temperature");
    REFUSED(API_CHAT, CHAT(",\"temperature\":1e400"), 400, "temperature");
    REFUSED(API_CHAT, CHAT(",\"top_p\":0"), 400, "top_p");
    REFUSED(API_CHAT, CHAT(",\"n\":9"), 400, "n");
    REFUSED(API_CHAT, CHAT(",\"n\":1.5"), 400, "n");
    REFUSED(API_CHAT, CHAT(",\"seed\":-1"), 400, "seed");
    REFUSED(API_CHAT, CHAT(",\"max_tokens\":true"), 400, "max_tokens");
    REFUSED(API_CHAT, CHAT(",\"max_tokens\":1000001"), 400, "max_tokens");
    REFUSED(API_CHAT, CHAT(",\"logprobs\":1"), 400, "logprobs");
    REFUSED(API_CHAT, CHAT(",\"stream\":1"), 400, "stream");
    REFUSED(API_CHAT, CHAT(",\"stream_options\":{\"include_usage\":true}"), 400, "stream_options");
    REFUSED(API_CHAT, CHAT(",\"stream\":true,\"stream_options\":{\"x\":1}"), 400, "stream_options");
    REFUSED(API_CHAT, CHAT(",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]"), 400, "stop");
    REFUSED(API_CHAT, CHAT(",\"stop\":[\"\"]"), 400, "stop");
    REFUSED(API_CHAT, CHAT(",\"stop\":[1]"), 400, "stop");
    REFUSED(API_CHAT, CHAT(",\"stop\":5"), 400, "stop");
    REFUSED(API_CHAT, CHAT(",\"n\":2,\"n\":3"), 400, "n");
    REFUSED(API_CHAT, CHAT(",\"user\":5"), 400, "user");
    REFUSED(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 400, "model");
    REFUSED(API_CHAT, "{\"model\":5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 400, "model");
    REFUSED(API_CHAT, "{\"model\":\"m\"}", 400, "messages");
    REFUSED(API_CHAT, "{\"model\":\"m\",\"messages\":[]}", 400, "messages");
    REFUSED(API_CHAT, "{\"model\":\"m\",\"messages\":{}}", 400, "messages");
    REFUSED(API_CHAT, "{\"model\":\"m\",\"messages\":[1]}", 400, "messages[0]");
    REFUSED(API_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", 400, "messages[0].role");
    REFUSED(API_CHAT, "{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}", 400, "messages[0]");
    REFUSED(API_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}]}", 400, "messages[0]");
    REFUSED(API_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":\"n\"}]}", 400,
            "messages[0].name");
    REFUSED(API_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\","
                      "\"content\":null,\"tool_calls\":[]}]}", 400, "messages[1].tool_calls");
    REFUSED(API_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
                      "\"image_url\":{\"url\":\"x\"}}]}]}", 400, "messages[0].content[0]");
    REFUSED(API_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", 400,
            "messages[0].content");
    REFUSED(API_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400,
            "messages[0].content");
    /* not JSON, or not an object: no field to name */
    REFUSED(API_CHAT, "", 400, "");
    REFUSED(API_CHAT, "[]", 400, "");
    REFUSED(API_CHAT, CHAT(","), 400, "");
    REFUSED(API_CHAT, "{\"model\":\"m\",}", 400, "");
    REFUSED(API_CHAT, "{\"model\":'m'}", 400, "");
    REFUSED(API_CHAT, "{\"model\":\"m\"} {}", 400, "");
    REFUSED(API_CHAT, "{\"model\":\"\xff\"}", 400, "");
    REFUSED(API_CHAT, "{\"model\":\"m\" /* c */}", 400, "");
    REFUSED(API_CHAT, "{\"n\":NaN}", 400, "");
}

static void test_limits(void) {
    /* a body of exactly MAX_BODY bytes is read; one more byte is 413 */
    char *b = malloc(MAX_BODY + 2);
    const char *head = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"";
    const char *tail = "\"}]}";
    for (int extra = 0; extra <= 1; extra++) {
        size_t n = MAX_BODY + (size_t)extra, hl = strlen(head), tl = strlen(tail);
        memcpy(b, head, hl);
        memset(b + hl, 'a', n - hl - tl);
        memcpy(b + n - tl, tail, tl);
        int rc = api_parse(&P, API_CHAT, b, n, &R, &E);
        CHECK(rc == (extra ? 413 : 0), "a body of %zu bytes: %d %s", n, rc, E.msg);
    }
    /* the deepest nesting the pool allows fails cleanly (yyjson reads without recursion) */
    memset(b, '[', MAX_BODY);
    CHECK(api_parse(&P, API_CHAT, b, MAX_BODY, &R, &E) == 400, "deep nesting");
    /* the most messages, and one more */
    char *m = malloc(64 * 1024);
    api_parser big;
    CHECK(api_parser_init(&big, 64 * 1024) == 0, "big parser");
    for (int extra = 0; extra <= 1; extra++) {
        size_t o = (size_t)sprintf(m, "{\"model\":\"m\",\"messages\":[");
        for (int i = 0; i < API_MAX_MESSAGES + extra; i++)
            o += (size_t)sprintf(m + o, "%s{\"role\":\"user\",\"content\":\"%d\"}", i ? "," : "", i);
        o += (size_t)sprintf(m + o, "]}");
        int rc = api_parse(&big, API_CHAT, m, o, &R, &E);
        CHECK(extra ? rc == 400 && !strcmp(E.param, "messages") : rc == 0 && R.n_msgs == API_MAX_MESSAGES,
              "%d messages: %d %s", API_MAX_MESSAGES + extra, rc, E.msg);
    }
    api_parser_free(&big);
    free(m);
    free(b);
}

static void test_escape(void) {
    char out[64];
    static const struct {
        const char *in;
        size_t n;
        const char *want;
    } t[] = {
        {"plain", 5, "plain"},
        {"a\"b\\c", 5, "a\\\"b\\\\c"},
        {"\n\r\t\x01\x7f", 5, "\\n\\r\\t\\u0001\\u007f"},
        {"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"},
        {"\xff", 1, "\\ufffd"},
        {"\xc3", 1, "\\ufffd"},               /* truncated */
        {"\xed\xa0\x80", 3, "\\ufffd\\ufffd\\ufffd"}, /* a surrogate */
        {"\xc0\xaf", 2, "\\ufffd\\ufffd"},     /* overlong */
        {"a\0b", 3, "a\\u0000b"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        long n = api_json_escape(out, sizeof out, t[i].in, t[i].n);
        CHECK(n == (long)strlen(t[i].want) && !memcmp(out, t[i].want, (size_t)n), "escape %zu: %ld", i, n);
        CHECK((size_t)n <= API_JSON_ESCAPED_MAX(t[i].n), "escape %zu within its bound", i);
        if (n > 0) CHECK(api_json_escape(out, (size_t)n - 1, t[i].in, t[i].n) == -ENOSPC, "escape %zu short", i);
    }
}

int main(void) {
    if (api_parser_init(&P, MAX_BODY) < 0) {
        fprintf(stderr, "test_api: no memory\n");
        return 1;
    }
    test_chat();
    test_completions();
    test_refusals();
    test_limits();
    test_escape();
    api_parser_free(&P);
    return check_done("test_api");
}
