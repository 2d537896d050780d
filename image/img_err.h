/* img_err: the one error helper image/ shares (manifests, bundles, Authenticode): the
 * message into err (when there is room for it) and the code back, so a check reads
 * `return img_fail(err, cap, -EINVAL, "...")`. Header-only: the fuzzers build each of
 * those files alone. */
#ifndef KILN_IMG_ERR_H
#define KILN_IMG_ERR_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

static inline int img_fail(char *err, size_t cap, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline int img_fail(char *err, size_t cap, int code, const char *fmt, ...) {
    if (err && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, cap, fmt, ap);
        va_end(ap);
    }
    return code;
}

#endif
