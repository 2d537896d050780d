/* test_kv: the KV block pool. A shadow model remembers which tag each sequence wrote at
 * each position; randomized new/fork/append/overwrite/truncate/release sequences check
 * every sequence's data against it (so a write that leaks into a sibling through a
 * shared block is caught), with kv_check along the way; then OOM loops and exhaustion. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mm/kv.h"
#include "tests/unit/check.h"

static const kv_config CFG = {
    .n_layers = 2, .n_kv_heads = 2, .head_dim = 4, .block_size = 4,
    .n_blocks = 48, .max_seqs = 8, .max_blocks_per_seq = 12,
};
#define MAX_POS 48 /* block_size * max_blocks_per_seq */

/* ---------------------------------------------------------------- helpers */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(uint32_t n) { /* xorshift64*, fixed seed */
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32) % n;
}

/* The value a tag puts at (layer, K|V, head, d): recognizable, distinct per element. */
static uint16_t val(uint16_t tag, int layer, int kv, int head, int d) {
    return (uint16_t)(tag * 131u + (unsigned)(((layer * 2 + kv) * 8 + head) * 8 + d));
}

static void write_pos(kv_pool *p, const kv_seq *s, int pos, uint16_t tag) {
    int32_t b = s->blocks[pos / p->cfg.block_size];
    int slot = pos % p->cfg.block_size, hd = p->cfg.head_dim;
    for (int l = 0; l < p->cfg.n_layers; l++)
        for (int h = 0; h < p->cfg.n_kv_heads; h++)
            for (int d = 0; d < hd; d++) {
                kv_k(p, b, l, h)[slot * hd + d] = val(tag, l, 0, h, d);
                kv_v(p, b, l, h)[slot * hd + d] = val(tag, l, 1, h, d);
            }
}

static int read_ok(const kv_pool *p, const kv_seq *s, int pos, uint16_t tag) {
    int32_t b = s->blocks[pos / p->cfg.block_size];
    int slot = pos % p->cfg.block_size, hd = p->cfg.head_dim;
    for (int l = 0; l < p->cfg.n_layers; l++)
        for (int h = 0; h < p->cfg.n_kv_heads; h++)
            for (int d = 0; d < hd; d++)
                if (kv_k(p, b, l, h)[slot * hd + d] != val(tag, l, 0, h, d) ||
                    kv_v(p, b, l, h)[slot * hd + d] != val(tag, l, 1, h, d))
                    return 0;
    return 1;
}

static void check_pool(const kv_pool *p, const char *when) {
    char err[200] = "";
    int rc = kv_check(p, err, sizeof err);
    CHECK(rc == 0, "kv_check %s: %s", when, err);
}

/* A snapshot to prove a failed call left everything as it was. */
typedef struct {
    int n_free, n_blocks, n_tokens;
    int32_t blocks[MAX_POS];
    int32_t refcount[64];
    int32_t free_ids[64];
} snap;

static void take(const kv_pool *p, const kv_seq *s, snap *z) {
    memset(z, 0, sizeof *z);
    z->n_free = kv_free_blocks(p);
    z->n_blocks = s->n_blocks;
    z->n_tokens = s->n_tokens;
    memcpy(z->blocks, s->blocks, (size_t)s->n_blocks * sizeof(int32_t));
    memcpy(z->refcount, p->refcount, (size_t)p->cfg.n_blocks * sizeof(int32_t));
    memcpy(z->free_ids, p->free_ids, (size_t)p->n_free * sizeof(int32_t));
}

static int same(const kv_pool *p, const kv_seq *s, const snap *z) {
    snap now;
    take(p, s, &now);
    return memcmp(&now, z, sizeof now) == 0;
}

/* ---------------------------------------------------------------- layout and basics */

static void test_layout(void) {
    kv_pool p;
    CHECK(kv_block_bytes(&CFG) == 2u * 2 * 2 * 4 * 4 * 2, "block bytes %zu", kv_block_bytes(&CFG));
    CHECK(kv_pool_init(&p, &CFG, NULL) == 0, "init");
    size_t be = kv_block_bytes(&CFG) / 2, slab = 4 * 4;
    CHECK(kv_k(&p, 3, 0, 0) == p.data + 3 * be, "K of layer 0 head 0 opens the block");
    CHECK(kv_k(&p, 3, 0, 1) == p.data + 3 * be + slab, "K heads adjacent");
    CHECK(kv_v(&p, 3, 0, 0) == p.data + 3 * be + 2 * slab, "V after all K heads of a layer");
    CHECK(kv_k(&p, 3, 1, 0) == p.data + 3 * be + 4 * slab, "next layer");
    CHECK(kv_v(&p, 3, 1, 1) + slab == p.data + 4 * be, "last V slab ends the block");
    CHECK(kv_free_blocks(&p) == CFG.n_blocks, "all free");
    CHECK(kv_refcount(&p, -1) == -1 && kv_refcount(&p, CFG.n_blocks) == -1, "refcount range");
    check_pool(&p, "fresh");
    kv_pool_free(&p);

    kv_config bad = CFG;
    bad.block_size = 0;
    CHECK(kv_pool_init(&p, &bad, NULL) == -EINVAL, "block_size 0");
    CHECK(kv_block_bytes(&bad) == 0, "bytes of a bad config");
    bad = CFG;
    bad.n_blocks = -1;
    CHECK(kv_pool_init(&p, &bad, NULL) == -EINVAL, "n_blocks -1");
    bad = CFG;
    bad.n_layers = bad.n_kv_heads = bad.head_dim = bad.block_size = 1 << 30;
    CHECK(kv_pool_init(&p, &bad, NULL) == -E2BIG, "overflowing shape");
    kv_pool_free(&p);
}

static void test_seqs(void) {
    kv_pool p;
    CHECK(kv_pool_init(&p, &CFG, NULL) == 0, "init");
    kv_seq *s[8];
    for (int i = 0; i < 8; i++) {
        s[i] = kv_seq_new(&p);
        CHECK(s[i] && s[i]->in_use && s[i]->n_blocks == 0, "seq %d", i);
    }
    CHECK(kv_seq_new(&p) == NULL, "9th page table");
    CHECK(kv_seq_fork(&p, s[0]) == NULL, "fork with no page table");
    kv_seq_release(&p, s[3]);
    kv_seq_release(&p, s[3]); /* double release is harmless */
    CHECK(kv_seq_new(&p) == s[3], "page table reused");

    CHECK(kv_seq_reserve(&p, s[0], 0) == 0 && s[0]->n_blocks == 0, "reserve 0");
    CHECK(kv_seq_reserve(&p, s[0], 1) == 0 && s[0]->n_blocks == 1, "reserve 1");
    CHECK(kv_seq_reserve(&p, s[0], 4) == 0 && s[0]->n_blocks == 1, "reserve 4 = 1 block");
    CHECK(kv_seq_reserve(&p, s[0], 5) == 0 && s[0]->n_blocks == 2, "reserve 5 = 2 blocks");
    CHECK(kv_seq_reserve(&p, s[0], 2) == 0 && s[0]->n_blocks == 2, "reserve never shrinks");
    CHECK(s[0]->n_tokens == 0, "reserve leaves n_tokens");
    CHECK(kv_seq_reserve(&p, s[0], MAX_POS) == 0 && s[0]->n_blocks == 12, "reserve max");
    CHECK(kv_seq_reserve(&p, s[0], MAX_POS + 1) == -E2BIG, "reserve past max");
    CHECK(kv_seq_reserve(&p, s[0], 1 << 30) == -E2BIG, "reserve far past max");
    CHECK(kv_seq_reserve(&p, s[0], 0x7fffffff) == -E2BIG, "reserve INT_MAX");
    CHECK(kv_seq_reserve(&p, s[0], -1) == -EINVAL, "reserve -1");
    CHECK(kv_free_blocks(&p) == 36, "free %d", kv_free_blocks(&p));
    CHECK(kv_seq_cow(&p, s[0], MAX_POS) == -EINVAL, "cow past capacity");
    CHECK(kv_seq_cow(&p, s[0], -1) == -EINVAL, "cow -1");
    CHECK(kv_seq_cow(&p, s[0], 0) == 0 && kv_free_blocks(&p) == 36, "cow unshared is a no-op");

    s[0]->n_tokens = 10;
    kv_seq_release(&p, s[7]);
    kv_seq *f = kv_seq_fork(&p, s[0]);
    CHECK(f && f->n_tokens == 10 && f->n_blocks == 12, "fork copies");
    for (int i = 0; i < 12; i++)
        CHECK(f->blocks[i] == s[0]->blocks[i] && kv_refcount(&p, f->blocks[i]) == 2, "shared %d",
              i);
    check_pool(&p, "after fork");
    CHECK(kv_seq_truncate(&p, f, 5) == 0 && f->n_blocks == 2 && f->n_tokens == 5, "truncate");
    CHECK(kv_refcount(&p, s[0]->blocks[2]) == 1, "truncated block unshared");
    CHECK(kv_seq_truncate(&p, f, 8) == 0 && f->n_tokens == 5, "truncate up keeps n_tokens");
    CHECK(kv_seq_truncate(&p, f, -1) == -EINVAL, "truncate -1");
    CHECK(kv_seq_cow(&p, f, 4) == 0 && f->blocks[1] != s[0]->blocks[1], "cow copies");
    CHECK(kv_refcount(&p, s[0]->blocks[1]) == 1 && kv_refcount(&p, f->blocks[1]) == 1, "cow refs");
    CHECK(kv_free_blocks(&p) == 35, "free after cow %d", kv_free_blocks(&p));
    check_pool(&p, "after cow");
    kv_seq_release(&p, s[0]);
    CHECK(kv_refcount(&p, f->blocks[0]) == 1, "sibling keeps the shared block");
    kv_seq_release(&p, f);
    for (int i = 1; i < 7; i++) kv_seq_release(&p, s[i]);
    CHECK(kv_free_blocks(&p) == CFG.n_blocks, "all back: %d", kv_free_blocks(&p));
    check_pool(&p, "all released");
    kv_pool_free(&p);
}

/* ---------------------------------------------------------------- randomized */

static void test_random(int n_ops, int check_every) {
    kv_pool p;
    CHECK(kv_pool_init(&p, &CFG, NULL) == 0, "init");
    static uint16_t shadow[8][MAX_POS]; /* tag written at each position, by seq id */
    uint16_t next_tag = 1;
    int n_fail = 0, n_cow = 0, n_e2big = 0;

    for (int op = 0; op < n_ops; op++) {
        kv_seq *s = &p.seqs[rnd((uint32_t)CFG.max_seqs)];
        int r = (int)rnd(100);
        if (!s->in_use) {
            if (r < 50) CHECK(kv_seq_new(&p) != NULL, "new with a free table");
            continue;
        }
        if (r < 10) { /* fork */
            kv_seq *f = kv_seq_fork(&p, s);
            if (f) memcpy(shadow[f->id], shadow[s->id], sizeof shadow[0]);
        } else if (r < 50) { /* append k tokens: reserve, then cow + write each */
            int k = 1 + (int)rnd(6), n = s->n_tokens;
            snap z;
            take(&p, s, &z);
            int rc = kv_seq_reserve(&p, s, n + k);
            if (rc == -E2BIG) {
                CHECK(n + k > MAX_POS, "E2BIG at %d", n + k);
                CHECK(same(&p, s, &z), "E2BIG changed state");
                n_e2big++;
                continue;
            }
            if (rc == -ENOMEM) {
                CHECK(same(&p, s, &z), "ENOMEM reserve changed state");
                n_fail++;
                continue;
            }
            CHECK(rc == 0 && s->n_blocks * CFG.block_size >= n + k, "reserve %d", rc);
            for (int pos = n; pos < n + k; pos++) {
                int32_t before = s->blocks[pos / CFG.block_size];
                if (kv_seq_cow(&p, s, pos) != 0) {
                    CHECK(s->blocks[pos / CFG.block_size] == before, "failed cow moved page");
                    n_fail++;
                    break;
                }
                n_cow += s->blocks[pos / CFG.block_size] != before;
                write_pos(&p, s, pos, next_tag);
                shadow[s->id][pos] = next_tag++;
                s->n_tokens = pos + 1;
            }
        } else if (r < 65 && s->n_tokens > 0) { /* overwrite a written position */
            int pos = (int)rnd((uint32_t)s->n_tokens);
            int32_t old = s->blocks[pos / CFG.block_size];
            int shared = kv_refcount(&p, old) > 1;
            int rc = kv_seq_cow(&p, s, pos);
            if (rc == -ENOMEM) {
                CHECK(shared && s->blocks[pos / CFG.block_size] == old, "cow ENOMEM");
                n_fail++;
                continue;
            }
            CHECK(rc == 0, "cow %d", rc);
            if (shared) {
                n_cow++;
                /* The copy holds everything the shared block held. */
                int b0 = pos / CFG.block_size * CFG.block_size;
                for (int q = b0; q < b0 + CFG.block_size && q < s->n_tokens; q++)
                    CHECK(read_ok(&p, s, q, shadow[s->id][q]), "cow lost pos %d", q);
            }
            write_pos(&p, s, pos, next_tag);
            shadow[s->id][pos] = next_tag++;
        } else if (r < 70) { /* truncate */
            int n = (int)rnd((uint32_t)s->n_tokens + 1);
            CHECK(kv_seq_truncate(&p, s, n) == 0, "truncate");
            CHECK(s->n_tokens == n && s->n_blocks == (n + CFG.block_size - 1) / CFG.block_size,
                  "truncate to %d: %d tokens %d blocks", n, s->n_tokens, s->n_blocks);
        } else if (r < 88) { /* reserve ahead without writing */
            int n = s->n_tokens + (int)rnd(12);
            int rc = kv_seq_reserve(&p, s, n);
            CHECK(rc == 0 || rc == -ENOMEM || (rc == -E2BIG && n > MAX_POS), "reserve %d", rc);
        } else if (r < 92) { /* arm the fail hook: a later allocation fails */
            kv_fail_after(&p, 1 + (int)rnd(8));
        } else if (rnd(3) == 0) { /* release */
            kv_seq_release(&p, s);
        }
        if (op % check_every == 0) {
            check_pool(&p, "random");
            for (int i = 0; i < CFG.max_seqs; i++)
                for (int q = 0; p.seqs[i].in_use && q < p.seqs[i].n_tokens; q++)
                    CHECK(read_ok(&p, &p.seqs[i], q, shadow[i][q]), "seq %d pos %d", i, q);
        }
    }
    CHECK(n_fail > 10 && n_cow > 10 && n_e2big > 0, "coverage: %d ENOMEM, %d cow, %d E2BIG",
          n_fail, n_cow, n_e2big);
    for (int i = 0; i < CFG.max_seqs; i++) kv_seq_release(&p, &p.seqs[i]);
    CHECK(kv_free_blocks(&p) == CFG.n_blocks, "free %d after release all", kv_free_blocks(&p));
    check_pool(&p, "end");
    kv_pool_free(&p);
}

/* ---------------------------------------------------------------- OOM loops */

/* A fixed scenario with several block allocations; returns 0 when all of it ran. */
static int scenario(kv_pool *p, kv_seq *a, kv_seq **pb) {
    int rc;
    if ((rc = kv_seq_reserve(p, a, 10)) != 0) return rc; /* 3 blocks */
    a->n_tokens = 10;
    if (!*pb && !(*pb = kv_seq_fork(p, a))) return -ENOSPC;
    kv_seq *b = *pb;
    for (int pos = 8; pos < 10; pos++)
        if ((rc = kv_seq_cow(p, b, pos)) != 0) return rc; /* 1 block */
    if ((rc = kv_seq_reserve(p, b, 30)) != 0) return rc;  /* 5 blocks */
    if ((rc = kv_seq_cow(p, b, 0)) != 0) return rc;       /* 1 block */
    return kv_seq_reserve(p, a, 20);                      /* 2 blocks */
}

static void test_oom_loop(void) {
    for (int sticky = 0; sticky < 2; sticky++) {
        int n, done = 0;
        for (n = 1; n < 40 && !done; n++) {
            kv_pool p;
            CHECK(kv_pool_init(&p, &CFG, NULL) == 0, "init");
            kv_seq *a = kv_seq_new(&p), *b = NULL;
            if (sticky) kv_fail_from(&p, n);
            else kv_fail_after(&p, n);
            int rc = scenario(&p, a, &b);
            CHECK(rc == 0 || rc == -ENOMEM, "n=%d: rc %d", n, rc);
            check_pool(&p, "after a failed step");
            done = rc == 0;
            if (rc == -ENOMEM) { /* one failure: the retry finishes; sticky: fails again */
                rc = scenario(&p, a, &b);
                CHECK(sticky ? rc == -ENOMEM : rc == 0, "n=%d: retry: %d", n, rc);
                check_pool(&p, "after the retry");
            }
            kv_seq_release(&p, a);
            kv_seq_release(&p, b);
            CHECK(kv_free_blocks(&p) == CFG.n_blocks, "n=%d leak: %d free", n, kv_free_blocks(&p));
            check_pool(&p, "after release");
            kv_pool_free(&p);
        }
        CHECK(done && n == 14, "OOM loop: 12 allocations, ended after %d rounds", n - 1);
    }
}

static void test_exhaustion(void) {
    kv_pool p;
    CHECK(kv_pool_init(&p, &CFG, NULL) == 0, "init");
    kv_seq *s[4];
    for (int i = 0; i < 4; i++) {
        s[i] = kv_seq_new(&p);
        CHECK(kv_seq_reserve(&p, s[i], MAX_POS) == 0, "fill %d", i); /* 4 x 12 = 48 */
        s[i]->n_tokens = MAX_POS;
    }
    CHECK(kv_free_blocks(&p) == 0, "pool full");
    kv_seq *t = kv_seq_new(&p);
    snap z;
    take(&p, t, &z);
    CHECK(kv_seq_reserve(&p, t, 1) == -ENOMEM && same(&p, t, &z), "reserve on a full pool");
    kv_seq *f = kv_seq_fork(&p, s[0]);
    CHECK(f != NULL, "fork needs no blocks");
    take(&p, f, &z);
    CHECK(kv_seq_cow(&p, f, 5) == -ENOMEM && same(&p, f, &z), "cow on a full pool");
    check_pool(&p, "full");
    kv_seq_truncate(&p, s[1], 20); /* frees 7 */
    take(&p, t, &z);
    CHECK(kv_seq_reserve(&p, t, 8 * CFG.block_size) == -ENOMEM && same(&p, t, &z),
          "8 blocks with 7 free: all or nothing");
    CHECK(kv_seq_reserve(&p, t, 7 * CFG.block_size) == 0 && kv_free_blocks(&p) == 0, "7 of 7");
    for (int i = 0; i < 4; i++) kv_seq_release(&p, s[i]);
    kv_seq_release(&p, t);
    kv_seq_release(&p, f);
    CHECK(kv_free_blocks(&p) == CFG.n_blocks, "all back");
    check_pool(&p, "end");
    kv_pool_free(&p);
}

static void test_arena(void) {
    mm_pool a;
    CHECK(mm_pool_init(&a, 1 << 20, NULL) == 0, "arena %s", a.err);
    kv_pool p;
    mm_pool_fail_after(&a, 1);
    CHECK(kv_pool_init(&p, &CFG, &a) == -ENOMEM, "arena alloc fails");
    CHECK(kv_pool_init(&p, &CFG, &a) == 0, "from the arena");
    CHECK((uintptr_t)p.data % 4096 == 0, "data page-aligned");
    CHECK(mm_pool_used(&a) >= (size_t)CFG.n_blocks * kv_block_bytes(&CFG), "arena used");
    kv_seq *s = kv_seq_new(&p);
    CHECK(kv_seq_reserve(&p, s, 20) == 0, "reserve");
    write_pos(&p, s, 19, 7);
    CHECK(read_ok(&p, s, 19, 7), "arena data");
    check_pool(&p, "arena");
    kv_pool_free(&p);
    mm_pool small;
    CHECK(mm_pool_init(&small, 4096, NULL) == 0, "small arena");
    CHECK(kv_pool_init(&p, &CFG, &small) == -ENOMEM, "arena too small");
    mm_pool_free(&small);
    mm_pool_free(&a);
}

int main(void) {
    test_layout();
    test_seqs();
    test_random(20000, 7);
    test_oom_loop();
    test_exhaustion();
    test_arena();
    return check_done("kv");
}
