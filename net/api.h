/* api: the OpenAI-compatible API's request bodies (POST /v1/chat/completions and
 * /v1/completions) read into GEN's own request (proto_gen), and JSON string output.
 *
 * A body is parsed by yyjson inside one pool sized at init for the largest body the
 * server takes, so no request allocates. Strict: RFC 8259 JSON, valid UTF-8, no NUL
 * inside strings, an object at the top; a field kiln does not know or does not
 * implement is refused by name (never silently ignored), as is a value of the wrong
 * type or out of GEN's range: the sampling fields go through proto_gen_set, so the two
 * doors share every key's parsing and limits. The result points into the parser's
 * memory until the next api_parse. */
#ifndef KILN_API_H
#define KILN_API_H

#include <stddef.h>

#include "core/chat.h"
#include "net/proto.h"

#define API_MAX_MESSAGES 256 /* turns in one chat request */

enum { API_CHAT = 1, API_COMPLETIONS = 2 };

typedef struct {
    int kind;              /* API_CHAT / API_COMPLETIONS */
    proto_gen g;           /* GEN's view: sampling keys, n, stop, logprobs, max_tokens;
                            * g.prompt for completions; g.chat for chat */
    chat_msg msgs[API_MAX_MESSAGES]; /* chat: the conversation, roles system|user|assistant */
    int n_msgs;
    const char *model;     /* as the client named it (NUL-terminated) */
    int stream;            /* server-sent events */
    int include_usage;     /* stream_options.include_usage */
} api_req;

/* Why a body was refused: the HTTP status (400 or 413), a message, and the field at
 * fault as OpenAI's error.param names it ("messages[2].role"; "" when none). */
typedef struct {
    int status;
    char msg[256];
    char param[80];
} api_err;

struct yyjson_doc;
typedef struct {
    size_t max_body;
    void *pool;            /* [pool_cap] yyjson's memory for one document */
    size_t pool_cap;
    char *joined;          /* [max_body + 1] message contents given as lists of parts */
    size_t joined_len;
    struct yyjson_doc *doc; /* the last api_parse's document, freed by the next */
} api_parser;

/* For bodies of up to max_body bytes. 0 or -ENOMEM. */
int api_parser_init(api_parser *p, size_t max_body);
void api_parser_free(api_parser *p);
/* Parse body[0..len) as a request of kind. 0 with *r set, or the HTTP status (400, 413)
 * with *e set. */
int api_parse(api_parser *p, int kind, const char *body, size_t len, api_req *r, api_err *e);

/* s[0..n) as the inside of a JSON string (no quotes): ", \ and control bytes escaped,
 * invalid UTF-8 bytes as \ufffd. The bytes written (out is not NUL-terminated), or
 * -ENOSPC; API_JSON_ESCAPED_MAX(n) bytes always suffice. */
#define API_JSON_ESCAPED_MAX(n) (6 * (size_t)(n))
long api_json_escape(char *out, size_t cap, const char *s, size_t n);

#endif
