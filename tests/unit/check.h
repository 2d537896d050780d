/* check.h: the whole unit-test harness. Each tests/unit/test_*.c is a program; CHECK
 * prints one line per failed check, SKIP one line per check (or group of checks) this
 * run cannot make, with the reason (a SIMD level or AMX the CPU lacks, or KILN_SIMD
 * caps). check_done() prints "NAME: N checks passed, N failed, N skipped" and gives
 * main's exit status:
 *   1                 some check failed;
 *   CHECK_SKIPPED 77  nothing failed and nothing passed, something was skipped (the
 *                     automake convention: tests/run.sh counts the program as skipped);
 *   0                 otherwise (skipped checks next to passed ones are still a pass;
 *                     run.sh shows their SKIP lines and names the program as partly
 *                     skipped).
 * tests/run.sh runs them all. */
#ifndef KILN_CHECK_H
#define KILN_CHECK_H
#include <stdio.h>

enum { CHECK_SKIPPED = 77 };

static int check_pass, check_fail, check_skip;

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

/* SKIP(fmt, ...): what is not checked and why, on one line starting "SKIP " (run.sh
 * looks for it); counts one skip. Call it once per thing skipped (a level, a kernel),
 * not once per iteration of the loop that would have checked it. */
#define SKIP(...)                                                               \
    do {                                                                        \
        check_skip++;                                                           \
        printf("SKIP %s:%d: ", __FILE__, __LINE__);                             \
        printf(__VA_ARGS__);                                                    \
        putchar('\n');                                                          \
    } while (0)

/* SKIP_SIMD_ABOVE(who, max): one SKIP per SIMD level above max (isa_max(): what the
 * CPU has, lowered by KILN_SIMD), for a test that loops over the levels up to max.
 * Where it is used, core/cpu/isa.h must be included. */
#define SKIP_SIMD_ABOVE(who, max)                                               \
    do {                                                                        \
        static const char *const level_names_[] = {"scalar", "avx2", "avx512"}; \
        for (int l_ = (max) + 1; l_ <= ISA_AVX512; l_++)                         \
            SKIP("%s: level %s: not on this CPU (or KILN_SIMD caps it)", who,   \
                 level_names_[l_]);                                             \
    } while (0)

static inline int check_done(const char *name) {
    printf("%s: %d checks passed, %d failed, %d skipped\n", name, check_pass, check_fail,
           check_skip);
    if (check_fail) return 1;
    return check_pass == 0 && check_skip > 0 ? CHECK_SKIPPED : 0;
}
#endif
