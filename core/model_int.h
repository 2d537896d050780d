/* model_int: what core/model.c (the forward pass) and core/model_load.c (the loader) share.
 * Nothing outside those two files includes it. */
#ifndef KILN_MODEL_INT_H
#define KILN_MODEL_INT_H

#include <stddef.h>

/* Formats the message into err (when given) and returns code: `return model_fail(...)`. */
int model_fail(char *err, size_t n, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
