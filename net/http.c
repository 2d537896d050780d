/* http: request-head parser and response-head writer for the metrics/health port.
 *
 * http_parse walks the buffer line by line (LF ends a line, an optional CR before it is
 * dropped) and never looks past min(len, HTTP_HEAD_MAX). Each complete line is checked
 * as soon as it is seen, so a bad head is refused without waiting for the rest; the
 * trailing incomplete line is checked only for bytes that no completion could make
 * valid (control bytes, a leading fold). Every check of a complete line starts with
 * that same byte scan, so a prefix of any input parses either to 0 ("need more") or to
 * exactly what the whole input parses to: the answer does not depend on how the bytes
 * were split across reads. tests/fuzz/fuzz_http.c checks that property.
 *
 * The request target is kept byte for byte (no percent-decoding, no dot-segment
 * removal): handlers compare it with fixed paths, so "/metrics/../x" simply matches
 * nothing. Host is not required, so a bare `printf 'GET /healthz HTTP/1.1\r\n\r\n'`
 * probe works. */
#include "net/http.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* RFC 9110 tchar: ALPHA / DIGIT / one of !#$%&'*+-.^_`|~ */
static int http_tchar(unsigned char c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return 1;
    return c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* Bytes a request line may hold: visible ASCII and SP. */
static int http_line_byte(unsigned char c) { return c >= 0x20 && c <= 0x7e; }

/* Bytes a header line may hold: VCHAR, obs-text, SP, HTAB (RFC 9110 field-value). */
static int http_field_byte(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); }

/* Case-insensitive compare of s[0..n) with a lower-case literal. */
static int http_name_is(const char *s, size_t n, const char *lit) {
    if (strlen(lit) != n) return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 'A' && c <= 'Z') c = (unsigned char)(c + 32);
        if (c != (unsigned char)lit[i]) return 0;
    }
    return 1;
}

/* "HTTP/1.0" or "HTTP/1.1" sets minor; another well-formed version ("HTTP/2",
 * "HTTP/1.2", "HTTP/3.0") is -505; anything else is not a version at all: -400. */
static int http_version(const char *v, size_t n, int *minor) {
    if (n == 8 && !memcmp(v, "HTTP/1.", 7) && (v[7] == '0' || v[7] == '1')) {
        *minor = v[7] - '0';
        return 0;
    }
    if (n < 6 || memcmp(v, "HTTP/", 5)) return -400;
    size_t i = 5, d = 0;
    while (i < n && v[i] >= '0' && v[i] <= '9') i++, d++;
    if (!d) return -400;
    if (i < n) {
        if (v[i] != '.') return -400;
        i++;
        d = 0;
        while (i < n && v[i] >= '0' && v[i] <= '9') i++, d++;
        if (!d || i != n) return -400;
    }
    return -505;
}

/* METHOD SP request-target SP HTTP-version, without its line end: the method token
 * (its length in *ml), the path and the version. Checks in this order: bytes, shape and
 * method token (-400), version (-400/-505), target (-400), path length (-414). */
static int http_line_parts(const char *s, size_t n, size_t *ml, char *path, int *minor) {
    for (size_t i = 0; i < n; i++)
        if (!http_line_byte((unsigned char)s[i])) return -400;
    const char *end = s + n;
    const char *sp1 = memchr(s, ' ', n);
    if (!sp1 || sp1 == s) return -400;
    for (const char *p = s; p < sp1; p++)
        if (!http_tchar((unsigned char)*p)) return -400;
    const char *t = sp1 + 1;
    const char *sp2 = memchr(t, ' ', (size_t)(end - t));
    if (!sp2 || sp2 == t) return -400;
    const char *v = sp2 + 1;
    if (memchr(v, ' ', (size_t)(end - v))) return -400;
    int rc = http_version(v, (size_t)(end - v), minor);
    if (rc < 0) return rc;
    /* origin-form only: absolute-form ("http://h/x") and "*" are not for us. The byte
     * scan above already kept the target to visible ASCII, and SP splits it off. */
    if (*t != '/') return -400;
    const char *q = memchr(t, '?', (size_t)(sp2 - t));
    size_t pl = (size_t)((q ? q : sp2) - t);
    if (pl > HTTP_PATH_MAX) return -414;
    memcpy(path, t, pl);
    path[pl] = '\0';
    *ml = (size_t)(sp1 - s);
    return 0;
}

/* The request line for http_parse: http_line_parts' checks, and last the method (-405),
 * so that 405 means "a fine request for a method we do not serve". */
static int http_request_line(const char *s, size_t n, http_req *r) {
    char path[HTTP_PATH_MAX + 1];
    size_t ml = 0;
    int minor = 0;
    int rc = http_line_parts(s, n, &ml, path, &minor);
    if (rc < 0) return rc;
    int method;
    if (ml == 3 && !memcmp(s, "GET", 3))
        method = HTTP_GET;
    else if (ml == 4 && !memcmp(s, "HEAD", 4))
        method = HTTP_HEAD;
    else
        return -405;
    r->method = method;
    r->minor = minor;
    memcpy(r->path, path, strlen(path) + 1);
    return 0;
}

/* A header line (non-empty, without its line end): field-name ":" OWS value OWS. */
static int http_header(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!http_field_byte((unsigned char)s[i])) return -400;
    if (s[0] == ' ' || s[0] == '\t') return -400; /* obs-fold, deprecated: refuse (RFC 9112 5.2) */
    const char *colon = memchr(s, ':', n);
    if (!colon || colon == s) return -400;
    size_t nl = (size_t)(colon - s);
    for (size_t i = 0; i < nl; i++) /* also refuses "Name :" (RFC 9112 5.1) */
        if (!http_tchar((unsigned char)s[i])) return -400;
    const char *v = colon + 1, *end = s + n;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t')) end--;
    if (http_name_is(s, nl, "transfer-encoding")) return -413; /* we take no bodies */
    if (http_name_is(s, nl, "content-length")) {
        if (v == end) return -400;
        int nonzero = 0;
        for (const char *p = v; p < end; p++) {
            if (*p < '0' || *p > '9') return -400; /* also "0, 0" lists: be strict */
            nonzero |= *p != '0';
        }
        if (nonzero) return -413;
    }
    return 0;
}

/* The incomplete last line s[0..n) can no longer become valid: it holds a byte its kind
 * of line never may (a CR is fine only as the last byte, where LF may follow), or it is
 * a header line that starts a fold. */
static int http_partial_bad(const char *s, size_t n, int request_line) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\r' && i + 1 == n) continue;
        if (request_line ? !http_line_byte(c) : !http_field_byte(c)) return 1;
    }
    return !request_line && n > 0 && (s[0] == ' ' || s[0] == '\t');
}

int http_parse(const char *buf, size_t len, http_req *r) {
    if (!r || (!buf && len)) return -400;
    size_t lim = len < HTTP_HEAD_MAX ? len : HTTP_HEAD_MAX;
    size_t pos = 0;
    for (int line = 0;; line++) {
        const char *nl = pos < lim ? memchr(buf + pos, '\n', lim - pos) : NULL;
        if (!nl) {
            if (http_partial_bad(buf + pos, lim - pos, line == 0)) return -400;
            return len >= HTTP_HEAD_MAX ? -413 : 0;
        }
        size_t end = (size_t)(nl - buf);
        size_t n = end - pos;
        if (n > 0 && buf[end - 1] == '\r') n--;
        if (line == 0) {
            /* An empty request line is refused rather than skipped (RFC 9112 2.2 allows
             * either): the server answers one request per connection anyway. */
            int rc = n ? http_request_line(buf + pos, n, r) : -400;
            if (rc < 0) return rc;
        } else if (n == 0) {
            return (int)(end + 1);
        } else {
            int rc = http_header(buf + pos, n);
            if (rc < 0) return rc;
        }
        pos = end + 1;
    }
}

/* ---------------------------------------------------------------- the API's requests */

/* Does the comma-separated list v[0..n) hold tok (case-insensitive, OWS trimmed)? */
static int http_list_has(const char *v, size_t n, const char *tok) {
    const char *p = v, *end = v + n;
    while (p < end) {
        const char *c = memchr(p, ',', (size_t)(end - p));
        const char *e = c ? c : end, *a = p;
        while (a < e && (*a == ' ' || *a == '\t')) a++;
        while (e > a && (e[-1] == ' ' || e[-1] == '\t')) e--;
        if (http_name_is(a, (size_t)(e - a), tok)) return 1;
        p = c ? c + 1 : end;
    }
    return 0;
}

/* A header line of a request to the API: http_header's checks of bytes and shape, then
 * the few fields the server acts on. */
static int http_msg_header(const char *s, size_t n, http_msg *m) {
    for (size_t i = 0; i < n; i++)
        if (!http_field_byte((unsigned char)s[i])) return -400;
    if (s[0] == ' ' || s[0] == '\t') return -400;
    const char *colon = memchr(s, ':', n);
    if (!colon || colon == s) return -400;
    size_t nl = (size_t)(colon - s);
    for (size_t i = 0; i < nl; i++)
        if (!http_tchar((unsigned char)s[i])) return -400;
    const char *v = colon + 1, *end = s + n;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t')) end--;
    size_t vl = (size_t)(end - v);
    if (http_name_is(s, nl, "transfer-encoding")) return -501; /* bodies come with a length */
    if (http_name_is(s, nl, "content-length")) {
        if (m->content_length >= 0 || vl == 0) return -400; /* a second one, or empty */
        long long x = 0;
        for (const char *p = v; p < end; p++) {
            if (*p < '0' || *p > '9') return -400;
            if (x > (HTTP_BODY_LIMIT - (*p - '0')) / 10) return -413;
            x = x * 10 + (*p - '0');
        }
        m->content_length = x;
    } else if (http_name_is(s, nl, "connection")) {
        m->conn_close |= http_list_has(v, vl, "close");
        m->conn_keep_alive |= http_list_has(v, vl, "keep-alive");
    } else if (http_name_is(s, nl, "expect")) {
        if (!http_name_is(v, vl, "100-continue")) return -417;
        m->expect_continue = 1;
    } else if (http_name_is(s, nl, "authorization")) {
        if (m->auth_set) return -400;
        m->auth_set = 1;
        if (vl > HTTP_AUTH_MAX) {
            m->auth_too_long = 1;
        } else {
            memcpy(m->auth, v, vl);
            m->auth[vl] = '\0';
        }
    }
    return 0;
}

static void http_msg_clear(http_msg *m) {
    memset(m, 0, sizeof *m);
    m->content_length = -1;
}

int http_parse_msg(const char *buf, size_t len, size_t max_head, http_msg *m) {
    if (!m || (!buf && len)) return -400;
    http_msg_clear(m);
    size_t lim = len < max_head ? len : max_head;
    size_t pos = 0;
    for (int line = 0;; line++) {
        const char *nl = pos < lim ? memchr(buf + pos, '\n', lim - pos) : NULL;
        if (!nl) {
            if (http_partial_bad(buf + pos, lim - pos, line == 0)) return -400;
            return len >= max_head ? -431 : 0;
        }
        size_t end = (size_t)(nl - buf);
        size_t n = end - pos;
        if (n > 0 && buf[end - 1] == '\r') n--;
        if (line == 0) {
            size_t ml = 0;
            int rc = n ? http_line_parts(buf + pos, n, &ml, m->path, &m->minor) : -400;
            if (rc < 0) return rc;
            if (ml > HTTP_METHOD_MAX) return -501; /* no method of ours is that long */
            memcpy(m->method, buf + pos, ml);
            m->method[ml] = '\0';
        } else if (n == 0) {
            return (int)(end + 1);
        } else {
            int rc = http_msg_header(buf + pos, n, m);
            if (rc < 0) return rc;
        }
        pos = end + 1;
    }
}

const char *http_reason(int status) {
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large"; /* RFC 9110's name; "Payload Too Large" in 7231 */
    case 414: return "URI Too Long";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

int http_head(char *out, size_t cap, int status, const char *content_type, size_t body_len) {
    if (status < 100 || status > 999 || (!out && cap)) return -EINVAL;
    /* A CR or LF in the type would let it write headers of its own. */
    if (content_type) {
        if (!*content_type) return -EINVAL;
        for (const char *p = content_type; *p; p++)
            if (!http_field_byte((unsigned char)*p)) return -EINVAL;
    }
    /* RFC 9110 8.6: no Content-Length on 1xx and 204; 15.5.6: a 405 MUST say Allow. */
    char cl[48] = "";
    if (status >= 200 && status != 204) snprintf(cl, sizeof cl, "Content-Length: %zu\r\n", body_len);
    int n = snprintf(out, cap,
                     "HTTP/1.1 %d %s\r\n%s%s%s%sConnection: close\r\nCache-Control: no-store\r\n%s\r\n",
                     status, http_reason(status), content_type ? "Content-Type: " : "",
                     content_type ? content_type : "", content_type ? "\r\n" : "", cl,
                     status == 405 ? "Allow: GET, HEAD\r\n" : "");
    if (n < 0) return -EINVAL;
    if ((size_t)n >= cap) return -ENOSPC;
    return n;
}
