/* http: the small part of HTTP/1.1 a Prometheus scraper, a health probe and the OpenAI
 * API's clients need.
 *
 * Requests are parsed from a buffer that may hold a partial head: strict, bounded,
 * never reading past len. http_parse is the metrics port's: only GET and HEAD; bodies
 * are refused (Content-Length other than 0, Transfer-Encoding); responses are written
 * whole (the server closes after each: `Connection: close`). http_parse_msg is the API
 * port's: any method (the router answers 405), a body by Content-Length only, and the
 * headers the server acts on (Connection, Expect, Authorization). */
#ifndef KILN_HTTP_H
#define KILN_HTTP_H

#include <stddef.h>

#define HTTP_PATH_MAX 256
#define HTTP_HEAD_MAX 8192 /* request line + headers */

enum { HTTP_GET = 1, HTTP_HEAD = 2 };

typedef struct {
    int method;                    /* HTTP_GET / HTTP_HEAD */
    char path[HTTP_PATH_MAX + 1];  /* without the query string */
    int minor;                     /* HTTP/1.minor */
} http_req;

/* The head's length in bytes (through the blank line) when complete; 0 when more bytes
 * are needed (and len < HTTP_HEAD_MAX); otherwise a negative HTTP status to answer with
 * before closing: -400 malformed, -405 method, -413 body or head too large, -414 path
 * too long, -505 version. */
int http_parse(const char *buf, size_t len, http_req *r);

/* Writes the status line and headers for a body of body_len bytes of content_type
 * (NULL: none), NUL-terminated. The length, or -ENOSPC. */
int http_head(char *out, size_t cap, int status, const char *content_type, size_t body_len);
const char *http_reason(int status); /* "OK", "Not Found", ... */

#define HTTP_METHOD_MAX 16
#define HTTP_AUTH_MAX 512              /* Authorization's value; longer is auth_too_long */
#define HTTP_BODY_LIMIT (1LL << 40)    /* a larger Content-Length is -413 at once */

typedef struct {
    char method[HTTP_METHOD_MAX + 1];  /* the token as sent ("POST") */
    char path[HTTP_PATH_MAX + 1];      /* without the query string */
    int minor;                         /* HTTP/1.minor */
    long long content_length;          /* -1: no Content-Length */
    int conn_close, conn_keep_alive;   /* Connection: close / keep-alive */
    int expect_continue;               /* Expect: 100-continue */
    int auth_set, auth_too_long;
    char auth[HTTP_AUTH_MAX + 1];      /* Authorization's value, OWS trimmed */
} http_msg;

/* As http_parse, for heads of at most max_head bytes: the head's length when complete, 0
 * when more bytes are needed (and len < max_head), or a negative status: -400 malformed
 * (also a second Content-Length or Authorization), -413 a Content-Length over
 * HTTP_BODY_LIMIT, -414 path too long, -417 an Expect other than 100-continue, -431 head
 * over max_head, -501 Transfer-Encoding (bodies need a Content-Length) or a method over
 * HTTP_METHOD_MAX, -505 version. The answer does not depend on how the bytes were cut. */
int http_parse_msg(const char *buf, size_t len, size_t max_head, http_msg *m);

#endif
