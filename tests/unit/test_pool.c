/* test_pool: the pinned arena: alignment, exhaustion, the fail hook, custom ops, free. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mm/pool.h"
#include "tests/unit/check.h"

/* ---------------------------------------------------------------- counting ops */

static int n_map, n_unmap, map_fails;
static unsigned char fake_mem[1 << 16] __attribute__((aligned(64)));

static void *fake_map(size_t bytes, int *locked, char *err, size_t errlen) {
    n_map++;
    *locked = 1;
    if (map_fails || bytes > sizeof fake_mem) {
        snprintf(err, errlen, "fake: no memory for %zu bytes", bytes);
        return NULL;
    }
    /* Deliberately misaligned base: alloc must align addresses, not offsets. */
    return fake_mem + 8;
}
static void fake_unmap(void *base, size_t bytes) {
    (void)base, (void)bytes;
    n_unmap++;
}
static const mm_pool_ops fake_ops = {"fake", fake_map, fake_unmap};

/* ---------------------------------------------------------------- tests */

static void test_basic_and_alignment(void) {
    mm_pool p;
    int rc = mm_pool_init(&p, 1 << 20, NULL);
    CHECK(rc == 0, "init: %d %s", rc, p.err);
    CHECK(mm_pool_size(&p) == 1 << 20, "size %zu", mm_pool_size(&p));
    CHECK(mm_pool_used(&p) == 0, "used %zu", mm_pool_used(&p));
    CHECK(p.locked == 0 || p.locked == 1, "locked %d", p.locked);
    for (size_t a = 1; a <= MM_POOL_MAX_ALIGN; a *= 2) {
        for (size_t n = 1; n < 40; n += 13) {
            unsigned char *q = mm_pool_alloc(&p, n, a);
            CHECK(q && (uintptr_t)q % a == 0, "align %zu size %zu -> %p", a, n, (void *)q);
            if (!q) continue;
            CHECK(q >= p.base && q + n <= p.base + p.size, "alloc out of the arena");
            CHECK(q[0] == 0 && q[n - 1] == 0, "fresh host memory not zero");
            memset(q, 0xab, n);
        }
    }
    unsigned char *d = mm_pool_alloc(&p, 3, 0);
    CHECK(d && (uintptr_t)d % 16 == 0, "default alignment 16: %p", (void *)d);
    size_t used = mm_pool_used(&p);
    CHECK(mm_pool_alloc(&p, 8, 3) == NULL, "align 3 accepted");
    CHECK(mm_pool_alloc(&p, 8, 8192) == NULL, "align 8192 accepted");
    CHECK(mm_pool_used(&p) == used, "rejected alloc moved the cursor");
    mm_pool_free(&p);
    CHECK(p.base == NULL && mm_pool_size(&p) == 0, "free left state");
    mm_pool_free(&p); /* second free is a no-op */
}

static void test_exhaustion(void) {
    mm_pool p;
    CHECK(mm_pool_init(&p, 4096, NULL) == 0, "init %s", p.err);
    CHECK(mm_pool_alloc(&p, 4096, 4096) != NULL, "whole arena");
    CHECK(mm_pool_alloc(&p, 1, 1) == NULL, "alloc past the end");
    CHECK(mm_pool_alloc(&p, 0, 1) != NULL, "zero bytes at the end");
    CHECK(mm_pool_used(&p) == 4096, "used %zu", mm_pool_used(&p));
    mm_pool_free(&p);

    CHECK(mm_pool_init(&p, 1000, NULL) == 0, "init %s", p.err);
    CHECK(mm_pool_alloc(&p, 1001, 1) == NULL, "alloc bigger than arena");
    CHECK(mm_pool_alloc(&p, SIZE_MAX, 1) == NULL, "SIZE_MAX");
    CHECK(mm_pool_alloc(&p, 999, 1) != NULL, "999 of 1000");
    CHECK(mm_pool_alloc(&p, 1, 1) != NULL, "last byte");
    CHECK(mm_pool_alloc(&p, 1, 1) == NULL, "1 past");
    mm_pool_free(&p);

    CHECK(mm_pool_init(&p, 0, NULL) == -EINVAL, "size 0");
    mm_pool_free(&p);
}

static void test_fail_hook(void) {
    mm_pool p;
    CHECK(mm_pool_init(&p, 1 << 16, NULL) == 0, "init %s", p.err);
    mm_pool_fail_after(&p, 2);
    CHECK(mm_pool_alloc(&p, 8, 8) != NULL, "1st of fail_after(2)");
    CHECK(mm_pool_alloc(&p, 8, 8) == NULL, "2nd of fail_after(2)");
    CHECK(mm_pool_alloc(&p, 8, 8) != NULL, "3rd of fail_after(2): once only");
    mm_pool_fail_from(&p, 1);
    for (int i = 0; i < 5; i++) CHECK(mm_pool_alloc(&p, 8, 8) == NULL, "fail_from(1) #%d", i);
    mm_pool_fail_after(&p, -1);
    CHECK(mm_pool_alloc(&p, 8, 8) != NULL, "hook off");
    mm_pool_free(&p);

    /* OOM loop over an "operation" of 6 allocations: every failure point is clean,
     * and a failed allocation takes no space. */
    for (int sticky = 0; sticky < 2; sticky++) {
        int n, done = 0;
        for (n = 1; n < 20 && !done; n++) {
            CHECK(mm_pool_init(&p, 1 << 16, NULL) == 0, "init");
            if (sticky) mm_pool_fail_from(&p, n);
            else mm_pool_fail_after(&p, n);
            int ok = 0;
            for (int i = 0; i < 6; i++) {
                size_t before = mm_pool_used(&p);
                if (mm_pool_alloc(&p, 100, 64)) ok++;
                else CHECK(mm_pool_used(&p) == before, "failed alloc used space");
            }
            done = ok == 6;
            CHECK(done || ok == (sticky ? n - 1 : 5), "n=%d sticky=%d: %d succeeded", n, sticky,
                  ok);
            mm_pool_free(&p);
        }
        CHECK(n == 8, "OOM loop ended after %d rounds", n - 1);
    }
}

static void test_custom_ops(void) {
    mm_pool p;
    n_map = n_unmap = 0;
    map_fails = 1;
    int rc = mm_pool_init(&p, 4096, &fake_ops);
    CHECK(rc == -ENOMEM, "failing map: %d", rc);
    CHECK(strstr(p.err, "fake") != NULL, "err says why: '%s'", p.err);
    mm_pool_free(&p);
    CHECK(n_unmap == 0, "unmap after failed map");

    map_fails = 0;
    CHECK(mm_pool_init(&p, 4096, &fake_ops) == 0, "fake init: %s", p.err);
    CHECK(p.locked == 1, "locked from ops");
    for (size_t a = 16; a <= 4096; a *= 4) {
        void *q = mm_pool_alloc(&p, 10, a);
        CHECK(q == NULL || (uintptr_t)q % a == 0, "misaligned base, align %zu: %p", a, q);
    }
    mm_pool_free(&p);
    mm_pool_free(&p);
    CHECK(n_map == 2 && n_unmap == 1, "map %d unmap %d", n_map, n_unmap);
}

int main(void) {
    test_basic_and_alignment();
    test_exhaustion();
    test_fail_hook();
    test_custom_ops();
    return check_done("pool");
}
