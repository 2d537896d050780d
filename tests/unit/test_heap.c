/* test_heap: the bounded buddy allocator: alignment, split and merge back to one block,
 * exhaustion, realloc, the fail hook, and a random churn checked block by block. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mm/heap.h"
#include "tests/unit/check.h"

static void test_basic(void) {
    mm_heap h;
    CHECK(mm_heap_init(&h, 0) == -EINVAL, "size 0");
    CHECK(mm_heap_init(&h, 1000000) == 0, "init");
    CHECK(h.size == (size_t)1 << 20, "rounded to a power of two: %zu", h.size);
    size_t whole = mm_heap_largest(&h);
    void *p[64];
    for (int i = 0; i < 64; i++) {
        p[i] = mm_heap_alloc(&h, (size_t)i * 37 + 1);
        CHECK(p[i] && (uintptr_t)p[i] % 16 == 0, "alloc %d aligned: %p", i, p[i]);
        if (p[i]) memset(p[i], i, (size_t)i * 37 + 1);
        CHECK(mm_heap_owns(&h, p[i]), "owns %d", i);
    }
    CHECK(mm_heap_check(&h) == 0, "consistent after allocs");
    for (int i = 0; i < 64; i += 2) mm_heap_free(&h, p[i]);
    for (int i = 1; i < 64; i += 2) {
        unsigned char *c = p[i];
        int ok = 1;
        for (int j = 0; j < i * 37 + 1; j++) ok &= c[j] == (unsigned char)i;
        CHECK(ok, "contents of %d kept", i);
        mm_heap_free(&h, p[i]);
    }
    CHECK(mm_heap_check(&h) == 0 && h.used == 0, "all freed: used %zu", h.used);
    CHECK(mm_heap_largest(&h) == whole, "merged back to one block: %zu", mm_heap_largest(&h));
    CHECK(!mm_heap_owns(&h, &h), "not ours");
    mm_heap_free(&h, NULL);
    mm_heap_free_all(&h);
    mm_heap_free_all(&h);
}

static void test_exhaustion_realloc(void) {
    mm_heap h;
    CHECK(mm_heap_init(&h, 1 << 16) == 0, "init");
    CHECK(mm_heap_alloc(&h, 1 << 16) == NULL, "over the arena (its header)");
    CHECK(mm_heap_alloc(&h, SIZE_MAX) == NULL, "SIZE_MAX");
    CHECK(mm_heap_calloc(&h, SIZE_MAX / 2, 4) == NULL, "calloc overflow");
    void *a = mm_heap_alloc(&h, (1 << 15) - 16), *b = mm_heap_alloc(&h, (1 << 15) - 16);
    CHECK(a && b, "two halves");
    CHECK(mm_heap_alloc(&h, 1) == NULL && h.fails > 0, "full: refused");
    mm_heap_free(&h, b);
    char *r = mm_heap_realloc(&h, NULL, 10);
    CHECK(r != NULL, "realloc NULL");
    memcpy(r, "0123456789", 10);
    CHECK(mm_heap_realloc(&h, r, 40) == r, "fits its block: kept");
    char *r2 = mm_heap_realloc(&h, r, 5000);
    CHECK(r2 && !memcmp(r2, "0123456789", 10), "moved, contents kept");
    CHECK(mm_heap_realloc(&h, r2, 1 << 15) == NULL, "no room: NULL");
    CHECK(!memcmp(r2, "0123456789", 10), "failed realloc leaves the block");
    mm_heap_free(&h, r2), mm_heap_free(&h, a);
    CHECK(mm_heap_check(&h) == 0 && h.used == 0, "empty again");
    mm_heap_free_all(&h);
}

static void test_fail_hook(void) {
    mm_heap h;
    CHECK(mm_heap_init(&h, 1 << 16) == 0, "init");
    mm_heap_fail_after(&h, 2);
    void *a = mm_heap_alloc(&h, 8), *b = mm_heap_alloc(&h, 8), *c = mm_heap_alloc(&h, 8);
    CHECK(a && !b && c, "the 2nd fails only: %p %p %p", a, b, c);
    mm_heap_fail_from(&h, 1);
    CHECK(!mm_heap_alloc(&h, 8) && !mm_heap_alloc(&h, 8), "sticky");
    mm_heap_fail_from(&h, 0);
    void *d = mm_heap_alloc(&h, 8);
    CHECK(d != NULL, "off again");
    mm_heap_free(&h, a), mm_heap_free(&h, c), mm_heap_free(&h, d);
    CHECK(mm_heap_check(&h) == 0 && h.used == 0, "empty");
    mm_heap_free_all(&h);
}

static void test_churn(void) {
    mm_heap h;
    CHECK(mm_heap_init(&h, 1 << 22) == 0, "init");
    enum { N = 512 };
    void *p[N] = {0};
    srand(7);
    int bad = 0;
    for (int it = 0; it < 20000; it++) {
        int i = rand() % N;
        if (p[i]) mm_heap_free(&h, p[i]), p[i] = NULL;
        else p[i] = mm_heap_alloc(&h, (size_t)(rand() % 4) == 0 ? (size_t)(rand() % 40000) : (size_t)(rand() % 300));
        if (it % 1000 == 0) bad |= mm_heap_check(&h);
    }
    CHECK(!bad, "consistent through the churn");
    for (int i = 0; i < N; i++) mm_heap_free(&h, p[i]);
    CHECK(mm_heap_check(&h) == 0 && h.used == 0 && mm_heap_largest(&h) == h.size - 16, "one block again");
    mm_heap_free_all(&h);
}

int main(void) {
    test_basic();
    test_exhaustion_realloc();
    test_fail_hook();
    test_churn();
    return check_done("heap");
}
