/* http: the small part of HTTP/1.1 a Prometheus scraper and a health probe need.
 *
 * Requests are parsed from a buffer that may hold a partial head: strict, bounded,
 * never reading past len. Only GET and HEAD; bodies are refused (Content-Length other
 * than 0, Transfer-Encoding). Responses are written whole (the server closes after
 * each: `Connection: close`). */
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

#endif
