/* check.h: the whole unit-test harness. Each tests/unit/test_*.c is a program; CHECK
 * prints one line per failed check, check_done() prints the tally and gives main's
 * exit status (0 only when every check passed). tests/run.sh runs them all. */
#ifndef KILN_CHECK_H
#define KILN_CHECK_H
#include <stdio.h>

static int check_pass, check_fail;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (cond) {                                                             \
            check_pass++;                                                       \
        } else {                                                                \
            check_fail++;                                                       \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

static inline int check_done(const char *name) {
    printf("%s: %d checks passed, %d failed\n", name, check_pass, check_fail);
    return check_fail ? 1 : 0;
}
#endif
