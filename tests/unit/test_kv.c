/* test_kv: the KV block pool. A shadow model remembers which tag each sequence wrote at
 * each position; randomized new/fork/append/overwrite/truncate/release sequences check
 * every sequence's data against it (so a write that leaks into a sibling through a
 * shared block is caught), with kv_check along the way; then OOM loops and exhaustion.
 * The prefix cache runs the same randomized mix with tokens from a small alphabet
 * (commit, match, LRU, eviction; cached blocks' data checked against the tokens they were
 * indexed under), then deterministic prompt-reuse, COW/truncate, OOM and key tests. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/quant.h"
#include "mm/kv.h"
#include "tests/unit/check.h"

static const kv_config CFG = {
    .n_layers = 2, .n_kv_heads = 2, .head_dim = 4, .block_size = 4,
    .n_blocks = 48, .max_seqs = 8, .max_blocks_per_seq = 12,
};
static const kv_config CFG_P = { /* the same with the prefix cache on */
    .n_layers = 2, .n_kv_heads = 2, .head_dim = 4, .block_size = 4,
    .n_blocks = 48, .max_seqs = 8, .max_blocks_per_seq = 12, .prefix_cache = 1,
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
                kv_k(p, b, l, h)[kv_k_index(p, slot, d)] = val(tag, l, 0, h, d);
                kv_v(p, b, l, h)[slot * hd + d] = val(tag, l, 1, h, d);
            }
}

static int read_ok(const kv_pool *p, const kv_seq *s, int pos, uint16_t tag) {
    int32_t b = s->blocks[pos / p->cfg.block_size];
    int slot = pos % p->cfg.block_size, hd = p->cfg.head_dim;
    for (int l = 0; l < p->cfg.n_layers; l++)
        for (int h = 0; h < p->cfg.n_kv_heads; h++)
            for (int d = 0; d < hd; d++)
                if (kv_k(p, b, l, h)[kv_k_index(p, slot, d)] != val(tag, l, 0, h, d) ||
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
    int n_free, n_blocks, n_tokens, n_committed, n_lru, lru_head;
    int32_t blocks[MAX_POS];
    int32_t refcount[128];
    int32_t free_ids[128];
    uint64_t hash[128], evictions;
} snap;

static void take(const kv_pool *p, const kv_seq *s, snap *z) {
    memset(z, 0, sizeof *z);
    z->n_free = kv_free_blocks(p);
    z->n_blocks = s->n_blocks;
    z->n_tokens = s->n_tokens;
    z->n_committed = s->n_committed;
    z->n_lru = kv_cached_blocks(p);
    z->lru_head = p->lru_head;
    z->evictions = p->stats.evictions;
    memcpy(z->hash, p->hash, (size_t)p->cfg.n_blocks * sizeof(uint64_t));
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

#define N_ALPHA 4 /* token alphabet of the prefix run: prefixes repeat */
#define N_TMPL 3  /* prompt templates sequences follow, with deviations */

/* Prefix run: a position's data is a function of (position, token), so a block reused
 * through the cache can be checked against the tokens it was matched with. */
static uint16_t tok_tag(int pos, int32_t tok) { return (uint16_t)(1 + pos * N_ALPHA + tok); }

/* The pool's committed keys of s chain the test's tokens of s. */
static int keys_ok(const kv_pool *p, const kv_seq *s, const int32_t *toks) {
    uint64_t parent = KV_KEY_SEED;
    for (int j = 0; j < s->n_committed; j++) {
        uint64_t k = kv_block_key(parent, toks + j * p->cfg.block_size, p->cfg.block_size);
        if (s->keys[j] != k) return 0;
        parent = k;
    }
    return 1;
}

static void test_random(int n_ops, int check_every, int prefix) {
    const kv_config *cfg = prefix ? &CFG_P : &CFG;
    const int bs = cfg->block_size;
    kv_pool p;
    CHECK(kv_pool_init(&p, cfg, NULL) == 0, "init");
    static uint16_t shadow[8][MAX_POS]; /* tag written at each position, by seq id */
    static int32_t toks[8][MAX_POS];    /* token at each position (prefix run) */
    static int32_t tmpl[N_TMPL][MAX_POS];
    static uint64_t rec_key[128];       /* key each block was indexed under, as seen here */
    static int rec_depth[128];          /* its logical block number then */
    int seq_tmpl[8] = {0};
    memset(rec_key, 0, sizeof rec_key);
    for (int t = 0; t < N_TMPL; t++)
        for (int q = 0; q < MAX_POS; q++) tmpl[t][q] = (int32_t)rnd(N_ALPHA);
    uint16_t next_tag = 1;
    int n_fail = 0, n_cow = 0, n_e2big = 0, n_match = 0, n_hit_tok = 0, n_commit = 0;
    int n_expect = 0; /* matches of a live sequence's prompt with blocks known indexed */

    for (int op = 0; op < n_ops; op++) {
        kv_seq *s = &p.seqs[rnd((uint32_t)cfg->max_seqs)];
        int r = (int)rnd(100);
        if (!s->in_use) {
            if (r >= 50) continue;
            kv_seq *t = kv_seq_new(&p);
            CHECK(t != NULL, "new with a free table");
            if (!prefix || r < 15 || !t) continue;
            /* A prompt: a template with maybe one deviation, or a live sequence's tokens;
             * match it, check the reused data, then prefill the rest and commit. */
            int32_t prompt[MAX_POS];
            int len = 1 + (int)rnd(MAX_POS), tp = (int)rnd(N_TMPL), expect = 0;
            kv_seq *a = &p.seqs[rnd((uint32_t)cfg->max_seqs)];
            if (r < 30 && a->in_use && a != t && a->n_tokens > 0) {
                len = a->n_tokens;
                memcpy(prompt, toks[a->id], (size_t)len * sizeof(int32_t));
                tp = seq_tmpl[a->id];
                /* Its leading committed blocks still indexed under its keys must match. */
                int lim = (len - 1) / bs;
                while (expect < a->n_committed && expect < lim &&
                       p.hash[a->blocks[expect]] == a->keys[expect])
                    expect++;
            } else {
                memcpy(prompt, tmpl[tp], sizeof prompt);
                if (rnd(3) == 0) {
                    int q = (int)rnd((uint32_t)len);
                    prompt[q] = (prompt[q] + 1 + (int32_t)rnd(N_ALPHA - 1)) % N_ALPHA;
                }
            }
            uint64_t q0 = p.stats.prefix_queries, h0 = p.stats.prefix_hits;
            int m = kv_seq_match(&p, t, prompt, len);
            CHECK(m >= 0 && m % bs == 0 && m <= (len - 1) / bs * bs, "match %d of %d", m, len);
            CHECK(m >= expect * bs, "match %d, a live sequence has %d blocks indexed", m, expect);
            n_expect += expect > 0;
            CHECK(t->n_tokens == m && t->n_blocks == m / bs && t->n_committed == m / bs,
                  "matched seq: %d tokens %d blocks %d committed", t->n_tokens, t->n_blocks,
                  t->n_committed);
            CHECK(p.stats.prefix_queries == q0 + (uint64_t)len &&
                      p.stats.prefix_hits == h0 + (uint64_t)m, "match stats");
            n_match += m > 0;
            n_hit_tok += m;
            memcpy(toks[t->id], prompt, sizeof prompt);
            seq_tmpl[t->id] = tp;
            for (int q = 0; q < m; q++) {
                shadow[t->id][q] = tok_tag(q, prompt[q]);
                CHECK(read_ok(&p, t, q, shadow[t->id][q]), "matched data at %d", q);
            }
            if (kv_seq_reserve(&p, t, len) == 0) {
                for (int q = m; q < len; q++) {
                    CHECK(kv_seq_cow(&p, t, q) == 0, "fresh blocks need no copy");
                    write_pos(&p, t, q, shadow[t->id][q] = tok_tag(q, prompt[q]));
                }
                t->n_tokens = len;
                CHECK(kv_seq_commit(&p, t, toks[t->id], len) == len / bs - m / bs, "commit");
            }
            goto committed;
        }
        if (prefix && r >= 50 && r < 65 && rnd(4)) r = 20; /* fewer overwrites: deep chains */
        if (prefix && r >= 70 && r < 85 && rnd(2)) r = 95;  /* fewer idle reservations */
        if (r < 10) { /* fork */
            kv_seq *f = kv_seq_fork(&p, s);
            if (f) {
                memcpy(shadow[f->id], shadow[s->id], sizeof shadow[0]);
                memcpy(toks[f->id], toks[s->id], sizeof toks[0]);
                seq_tmpl[f->id] = seq_tmpl[s->id];
                CHECK(f->n_committed == s->n_committed, "fork keeps the committed blocks");
            }
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
            CHECK(rc == 0 && s->n_blocks * bs >= n + k, "reserve %d", rc);
            for (int pos = n; pos < n + k; pos++) {
                int32_t before = s->blocks[pos / bs];
                if (kv_seq_cow(&p, s, pos) != 0) {
                    CHECK(s->blocks[pos / bs] == before, "failed cow moved page");
                    n_fail++;
                    break;
                }
                n_cow += s->blocks[pos / bs] != before;
                CHECK(!p.hash[s->blocks[pos / bs]], "writing into an indexed block");
                if (prefix) {
                    int32_t tk = rnd(32) ? tmpl[seq_tmpl[s->id]][pos] : (int32_t)rnd(N_ALPHA);
                    toks[s->id][pos] = tk;
                    write_pos(&p, s, pos, shadow[s->id][pos] = tok_tag(pos, tk));
                } else {
                    write_pos(&p, s, pos, next_tag);
                    shadow[s->id][pos] = next_tag++;
                }
                s->n_tokens = pos + 1;
            }
            if (rnd(2)) {
                int before = s->n_committed, rc2 = kv_seq_commit(&p, s, toks[s->id], s->n_tokens);
                if (prefix) {
                    CHECK(rc2 == s->n_tokens / bs - before && s->n_committed == s->n_tokens / bs,
                          "commit %d: %d committed of %d tokens", rc2, s->n_committed,
                          s->n_tokens);
                    n_commit += rc2;
                } else {
                    CHECK(rc2 == 0 && s->n_committed == 0, "commit with the cache off");
                }
            }
        } else if (r < 65 && s->n_tokens > 0) { /* overwrite a written position */
            int pos = (int)rnd((uint32_t)s->n_tokens);
            int32_t old = s->blocks[pos / bs];
            int shared = kv_refcount(&p, old) > 1, was_indexed = p.hash[old] != 0;
            int rc = kv_seq_cow(&p, s, pos);
            if (rc == -ENOMEM) {
                CHECK(shared && s->blocks[pos / bs] == old, "cow ENOMEM");
                n_fail++;
                continue;
            }
            CHECK(rc == 0, "cow %d", rc);
            CHECK(s->n_committed <= pos / bs, "cow rewinds the committed blocks");
            CHECK(!p.hash[s->blocks[pos / bs]], "cow leaves the block to write unindexed");
            if (shared) {
                n_cow++;
                CHECK(!was_indexed || p.hash[old] != 0, "cow copy dropped the shared entry");
                /* The copy holds everything the shared block held. */
                int b0 = pos / bs * bs;
                for (int q = b0; q < b0 + bs && q < s->n_tokens; q++)
                    CHECK(read_ok(&p, s, q, shadow[s->id][q]), "cow lost pos %d", q);
            }
            if (prefix) {
                int32_t tk = (toks[s->id][pos] + 1 + (int32_t)rnd(N_ALPHA - 1)) % N_ALPHA;
                toks[s->id][pos] = tk;
                write_pos(&p, s, pos, shadow[s->id][pos] = tok_tag(pos, tk));
            } else {
                write_pos(&p, s, pos, next_tag);
                shadow[s->id][pos] = next_tag++;
            }
        } else if (r < 70) { /* truncate */
            int n = (int)rnd((uint32_t)s->n_tokens + 1), c0 = s->n_committed;
            CHECK(kv_seq_truncate(&p, s, n) == 0, "truncate");
            CHECK(s->n_tokens == n && s->n_blocks == (n + bs - 1) / bs,
                  "truncate to %d: %d tokens %d blocks", n, s->n_tokens, s->n_blocks);
            CHECK(s->n_committed == (c0 < n / bs ? c0 : n / bs), "truncate: %d committed",
                  s->n_committed);
            if (n % bs && kv_refcount(&p, s->blocks[n / bs]) == 1)
                CHECK(!p.hash[s->blocks[n / bs]], "a cut block of its own stays indexed");
        } else if (r < 85) { /* reserve ahead without writing */
            int n = s->n_tokens + (int)rnd(12);
            int rc = kv_seq_reserve(&p, s, n);
            CHECK(rc == 0 || rc == -ENOMEM || (rc == -E2BIG && n > MAX_POS), "reserve %d", rc);
        } else if (r < 89) { /* arm the fail hook: a later allocation fails */
            kv_fail_after(&p, 1 + (int)rnd(8));
        } else if (r < 92) { /* commit with the hook armed: commit never allocates */
            kv_fail_from(&p, 1);
            int rc = kv_seq_commit(&p, s, toks[s->id], s->n_tokens);
            CHECK(rc >= 0, "commit under a sticky fail hook: %d", rc);
            kv_fail_after(&p, 0);
        } else if (prefix || rnd(3) == 0) { /* release */
            kv_seq_release(&p, s);
        }
    committed:
        if (prefix) /* remember where each newly indexed block sits, to check its data */
            for (int i = 0; i < cfg->max_seqs; i++)
                for (int j = 0; p.seqs[i].in_use && j < p.seqs[i].n_committed; j++) {
                    int32_t b = p.seqs[i].blocks[j];
                    if (p.hash[b] && p.hash[b] == p.seqs[i].keys[j] && rec_key[b] != p.hash[b])
                        rec_key[b] = p.hash[b], rec_depth[b] = j;
                }
        if (op % check_every == 0) {
            check_pool(&p, "random");
            for (int i = 0; i < cfg->max_seqs; i++) {
                const kv_seq *q = &p.seqs[i];
                for (int k = 0; q->in_use && k < q->n_tokens; k++)
                    CHECK(read_ok(&p, q, k, shadow[i][k]), "seq %d pos %d", i, k);
                if (q->in_use) CHECK(keys_ok(&p, q, toks[i]), "seq %d keys", i);
            }
            /* Every indexed block, cached or in use, holds its tokens' data. */
            for (int32_t b = 0; prefix && b < cfg->n_blocks; b++) {
                if (!p.hash[b]) continue;
                CHECK(rec_key[b] == p.hash[b], "block %d indexed behind the test's back", b);
                kv_seq view = {.blocks = &b, .n_blocks = 1};
                for (int k = 0; k < bs; k++)
                    CHECK(read_ok(&p, &view, k, tok_tag(rec_depth[b] * bs + k, p.tok[b * bs + k])),
                          "indexed block %d slot %d", b, k);
            }
        }
    }
    CHECK(n_fail > 10 && n_cow > 10 && n_e2big > 0, "coverage: %d ENOMEM, %d cow, %d E2BIG",
          n_fail, n_cow, n_e2big);
    if (prefix) {
        CHECK(n_match > 500 && n_hit_tok > 5000 && n_commit > 1000 && n_expect > 100 &&
                  p.stats.evictions > 100,
              "prefix coverage: %d matches, %d tokens reused, %d blocks committed, %d live "
              "probes, %llu evictions", n_match, n_hit_tok, n_commit, n_expect,
              (unsigned long long)p.stats.evictions);
        printf("kv random prefix: %d matches, %d tokens reused, %d blocks committed, %d live "
               "probes, %llu evictions, %d ENOMEM, %d cow\n", n_match, n_hit_tok, n_commit,
               n_expect, (unsigned long long)p.stats.evictions, n_fail, n_cow);
    } else {
        CHECK(p.stats.prefix_queries == 0 && p.stats.evictions == 0 && kv_cached_blocks(&p) == 0,
              "cache off: no queries, no cached blocks");
    }
    for (int i = 0; i < cfg->max_seqs; i++) kv_seq_release(&p, &p.seqs[i]);
    CHECK(kv_free_blocks(&p) == cfg->n_blocks, "free %d after release all", kv_free_blocks(&p));
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

/* ---------------------------------------------------------------- prefix cache */

static int cmp_u64(const void *x, const void *y) {
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return (a > b) - (a < b);
}

static void test_block_key(void) {
    int32_t a[16], b[16];
    for (int i = 0; i < 16; i++) a[i] = b[i] = 1000 + i * 37;
    uint64_t k = kv_block_key(KV_KEY_SEED, a, 16);
    CHECK(k != 0 && k == kv_block_key(KV_KEY_SEED, b, 16), "deterministic");
    CHECK(k != kv_block_key(KV_KEY_SEED + 1, a, 16), "parent matters");
    CHECK(k != kv_block_key(KV_KEY_SEED, a, 15) &&
              kv_block_key(KV_KEY_SEED, a, 15) != kv_block_key(KV_KEY_SEED, a, 14),
          "length matters, odd lengths hash the tail");
    int bits = 0, n = 0;
    for (int i = 0; i < 16; i++)
        for (int bit = 0; bit < 32; bit++, n++) { /* each input bit flips about half */
            b[i] ^= (int32_t)(1u << bit);
            uint64_t k2 = kv_block_key(KV_KEY_SEED, b, 16);
            CHECK(k2 != k, "token %d bit %d changes the key", i, bit);
            bits += __builtin_popcountll(k ^ k2);
            b[i] = a[i];
        }
    CHECK(bits > n * 30 && bits < n * 34, "avalanche: %.2f bits of 64 flip", (double)bits / n);
    int32_t sw[16];
    memcpy(sw, a, sizeof sw);
    sw[0] = a[1], sw[1] = a[0];
    CHECK(kv_block_key(KV_KEY_SEED, sw, 16) != k, "order matters");
    /* No collisions among 2^18 keys of dense, structured inputs, chained and not. */
    enum { NK = 1 << 18 };
    static uint64_t keys[NK];
    uint64_t parent = KV_KEY_SEED;
    for (int i = 0; i < NK; i++) {
        int32_t t[4] = {i & 1, (i >> 1) & 1, i >> 2, 0};
        keys[i] = kv_block_key(i % 3 ? parent : (uint64_t)i, t, 4);
        parent = keys[i];
    }
    qsort(keys, NK, sizeof keys[0], cmp_u64);
    int dup = 0;
    for (int i = 1; i < NK; i++) dup += keys[i] == keys[i - 1];
    CHECK(dup == 0 && keys[0] != 0, "%d duplicate keys", dup);
}

/* Small shape, 16-token blocks: the vLLM-sized scenario. */
static const kv_config CFG_B = {
    .n_layers = 1, .n_kv_heads = 1, .head_dim = 2, .block_size = 16,
    .n_blocks = 80, .max_seqs = 4, .max_blocks_per_seq = 40, .prefix_cache = 1,
};

static uint16_t big_tag(int pos, int32_t tok) { return (uint16_t)(pos * 7 + tok * 3 + 1); }

static void fill(kv_pool *p, kv_seq *s, const int32_t *t, int from, int to) {
    for (int q = from; q < to; q++) {
        CHECK(kv_seq_cow(p, s, q) == 0, "cow");
        write_pos(p, s, q, big_tag(q, t[q]));
    }
    s->n_tokens = to;
}

static int data_ok(const kv_pool *p, const kv_seq *s, const int32_t *t, int n) {
    for (int q = 0; q < n; q++)
        if (!read_ok(p, s, q, big_tag(q, t[q]))) return 0;
    return 1;
}

static void test_prefix_prompt(void) {
    kv_pool p;
    CHECK(kv_pool_init(&p, &CFG_B, NULL) == 0, "init");
    int32_t t[640];
    for (int i = 0; i < 640; i++) t[i] = (int32_t)((i * 7919 + 13) % 32000);

    /* Request 1: 512 tokens prefilled, committed, released: 32 blocks cached. */
    kv_seq *a = kv_seq_new(&p);
    CHECK(kv_seq_match(&p, a, t, 512) == 0 && a->n_blocks == 0, "cold cache");
    CHECK(p.stats.prefix_queries == 512 && p.stats.prefix_hits == 0, "cold stats");
    CHECK(kv_seq_reserve(&p, a, 512) == 0, "reserve");
    fill(&p, a, t, 0, 500);
    CHECK(kv_seq_commit(&p, a, t, 500) == 31 && a->n_committed == 31, "commit 31 full blocks");
    CHECK(kv_seq_commit(&p, a, t, 513) == -EINVAL, "commit past the reserved capacity");
    CHECK(kv_seq_commit(&p, a, t, -1) == -EINVAL, "commit -1");
    fill(&p, a, t, 500, 512);
    a->n_tokens = 500; /* a caller that does not maintain n_tokens: commit raises it */
    CHECK(kv_seq_commit(&p, a, t, 512) == 1 && a->n_committed == 32 && a->n_tokens == 512,
          "commit the new block only, n_tokens raised");
    CHECK(kv_seq_commit(&p, a, t, 512) == 0, "commit again: nothing new");
    CHECK(p.n_indexed == 32 && kv_cached_blocks(&p) == 0, "32 indexed, none cached");
    check_pool(&p, "committed");
    kv_seq_release(&p, a);
    CHECK(kv_cached_blocks(&p) == 32 && kv_free_blocks(&p) == 80, "released: 32 cached, all free");
    check_pool(&p, "cached");

    /* What a match would reuse, asked first, changes nothing. */
    CHECK(kv_prefix_hits(&p, t, 532) == 512 && kv_prefix_hits(&p, t, 512) == 496 &&
              kv_prefix_hits(&p, t + 1, 532) == 0 && kv_prefix_hits(&p, t, 0) == 0,
          "peek: %d", kv_prefix_hits(&p, t, 532));
    CHECK(kv_cached_blocks(&p) == 32 && p.stats.prefix_queries == 512 && p.stats.prefix_hits == 0,
          "a peek moves no block and counts nothing");
    /* Request 2: the same 512 tokens + 20: all 32 blocks reused, data intact. */
    kv_seq *b = kv_seq_new(&p);
    CHECK(kv_seq_match(&p, b, t, 532) == 512, "512 + 20 reuses 512");
    CHECK(b->n_tokens == 512 && b->n_blocks == 32 && b->n_committed == 32, "matched seq");
    CHECK(kv_cached_blocks(&p) == 0 && kv_free_blocks(&p) == 48, "revived off the LRU");
    for (int i = 0; i < 32; i++) CHECK(kv_refcount(&p, b->blocks[i]) == 1, "ref %d", i);
    CHECK(data_ok(&p, b, t, 512), "reused data");
    CHECK(p.stats.prefix_queries == 1044 && p.stats.prefix_hits == 512, "stats");
    check_pool(&p, "matched");
    /* A concurrent identical request shares the blocks. */
    kv_seq *c = kv_seq_new(&p);
    CHECK(kv_seq_match(&p, c, t, 600) == 512, "shared match");
    CHECK(kv_refcount(&p, c->blocks[5]) == 2 && c->blocks[5] == b->blocks[5], "shared blocks");
    CHECK(kv_seq_match(&p, c, t, 600) == -EINVAL, "match on a non-empty seq");
    /* b prefills its 20 tokens and commits: the partial block is not indexed. */
    CHECK(kv_seq_reserve(&p, b, 532) == 0, "reserve the rest");
    fill(&p, b, t, 512, 532);
    CHECK(kv_seq_commit(&p, b, t, 532) == 1 && p.n_indexed == 33, "block 32 full, 33 partial");
    CHECK(p.hash[b->blocks[33]] == 0, "partial block unindexed");
    kv_seq_release(&p, c);
    kv_seq_release(&p, b);
    CHECK(kv_cached_blocks(&p) == 33 && kv_free_blocks(&p) == 80, "33 cached");
    check_pool(&p, "released twice");

    /* Exactly the 512-token prompt: the last token must be computed, so one block less. */
    kv_seq *d = kv_seq_new(&p);
    CHECK(kv_seq_match(&p, d, t, 512) == 496, "whole prompt cached: 496 reused");
    kv_seq_release(&p, d);
    d = kv_seq_new(&p);
    CHECK(kv_seq_match(&p, d, t, 513) == 512, "513: 512 reused");
    kv_seq_release(&p, d);
    int lens[][2] = {{0, 0}, {1, 0}, {16, 0}, {17, 16}, {33, 32}, {544, 528}, {545, 528}};
    for (int i = 0; i < 7; i++) {
        d = kv_seq_new(&p);
        int m = kv_seq_match(&p, d, t, lens[i][0]);
        CHECK(m == lens[i][1], "prompt of %d reuses %d, expected %d", lens[i][0], m, lens[i][1]);
        CHECK(data_ok(&p, d, t, m), "data of %d", lens[i][0]);
        kv_seq_release(&p, d);
    }
    /* A different first token: every chained key differs. */
    int32_t u[532];
    memcpy(u, t, sizeof u);
    u[0] = 31999;
    d = kv_seq_new(&p);
    CHECK(kv_seq_match(&p, d, u, 532) == 0 && d->n_blocks == 0, "other first token: 0");
    kv_seq_release(&p, d);
    /* A different token in block 3: blocks 0-2 reused. */
    memcpy(u, t, sizeof u);
    u[3 * 16 + 5] ^= 1;
    d = kv_seq_new(&p);
    CHECK(kv_seq_match(&p, d, u, 532) == 48, "divergence in block 3: 48 reused");
    kv_seq_release(&p, d);
    check_pool(&p, "probes");

    /* Pressure: 47 free blocks then 2 evictions, taken from the tail of the prompt
     * (released last block first), so the head stays matchable. */
    CHECK(kv_cached_blocks(&p) == 33 && p.n_free == 47, "33 cached, 47 free: %d", p.n_free);
    kv_seq *e = kv_seq_new(&p), *f = kv_seq_new(&p);
    CHECK(kv_seq_reserve(&p, e, 40 * 16) == 0 && p.n_free == 7 && p.stats.evictions == 0,
          "40 from the free stack");
    CHECK(kv_seq_reserve(&p, f, 9 * 16) == 0 && p.stats.evictions == 2, "7 free + 2 evicted");
    CHECK(kv_cached_blocks(&p) == 31 && kv_free_blocks(&p) == 31 && p.n_indexed == 31,
          "31 left cached");
    check_pool(&p, "evicted");
    d = kv_seq_new(&p);
    CHECK(kv_seq_match(&p, d, t, 532) == 31 * 16, "the 31 head blocks still match");
    CHECK(data_ok(&p, d, t, 31 * 16), "data after eviction");
    kv_seq_release(&p, d);
    snap z;
    d = kv_seq_new(&p);
    take(&p, d, &z);
    CHECK(kv_seq_reserve(&p, d, 32 * 16) == -ENOMEM && same(&p, d, &z),
          "32 with 31 evictable: all or nothing, nothing evicted");
    kv_seq_release(&p, d);
    CHECK(kv_seq_reserve(&p, f, 39 * 16) == 0 && kv_free_blocks(&p) == 1 &&
              kv_cached_blocks(&p) == 1 && p.stats.evictions == 32,
          "30 more: evicts all but one: %d free %d cached", kv_free_blocks(&p),
          kv_cached_blocks(&p));
    d = kv_seq_new(&p);
    CHECK(kv_seq_match(&p, d, t, 532) == 16, "only block 0 left");
    CHECK(kv_free_blocks(&p) == 0 && kv_cached_blocks(&p) == 0, "and it is in use again");
    check_pool(&p, "drained");
    kv_seq_release(&p, d);
    kv_seq_release(&p, e);
    kv_seq_release(&p, f);
    CHECK(kv_free_blocks(&p) == 80, "all back: %d", kv_free_blocks(&p));
    check_pool(&p, "end");
    kv_pool_free(&p);
}

/* COW and truncate against indexed blocks; the cache off; kv_check catching damage. */
static void test_prefix_cow(void) {
    kv_pool p;
    CHECK(kv_pool_init(&p, &CFG_P, NULL) == 0, "init");
    int32_t t[MAX_POS];
    for (int i = 0; i < MAX_POS; i++) t[i] = i % 5;
    kv_seq *a = kv_seq_new(&p);
    CHECK(kv_seq_reserve(&p, a, 10) == 0, "reserve");
    for (int q = 0; q < 10; q++) write_pos(&p, a, q, tok_tag(q, t[q]));
    a->n_tokens = 10;
    CHECK(kv_seq_commit(&p, a, t, 10) == 2, "2 full blocks committed");
    int32_t a0 = a->blocks[0], a1 = a->blocks[1], a2 = a->blocks[2];
    CHECK(p.hash[a0] && p.hash[a1] && !p.hash[a2], "full blocks indexed, partial not");
    kv_seq *b = kv_seq_fork(&p, a);
    CHECK(b && b->n_committed == 2 && b->keys[1] == a->keys[1], "fork keeps committed keys");

    /* b rewrites a position in shared, indexed block 0: copied, copy unindexed. */
    CHECK(kv_seq_cow(&p, b, 2) == 0 && b->blocks[0] != a0, "cow copies the shared block");
    CHECK(p.hash[a0] && !p.hash[b->blocks[0]], "original stays indexed, copy is not");
    CHECK(b->n_committed == 0 && a->n_committed == 2, "b rewound, a not");
    for (int q = 0; q < 4; q++) CHECK(read_ok(&p, b, q, tok_tag(q, t[q])), "copied %d", q);
    check_pool(&p, "cow shared indexed");
    /* b's commit with its new token: block 0 indexed anew, block 1 is shared and stays. */
    int32_t tb[MAX_POS];
    memcpy(tb, t, sizeof tb);
    tb[2] = 4;
    write_pos(&p, b, 2, tok_tag(2, 4));
    CHECK(kv_seq_commit(&p, b, tb, 10) == 2 && p.hash[b->blocks[0]] != 0, "b commits");
    CHECK(p.hash[a1] == a->keys[1] && b->keys[1] != a->keys[1], "shared block keeps its key");
    check_pool(&p, "b committed");

    /* a truncates into block 1, which b still shares: it stays indexed; a's cow copies. */
    CHECK(kv_seq_truncate(&p, a, 6) == 0 && a->n_committed == 1 && a->n_blocks == 2,
          "truncate to 6");
    CHECK(p.hash[a1] != 0 && kv_refcount(&p, a1) == 2, "shared cut block stays indexed");
    CHECK(kv_refcount(&p, a2) == 1, "a's partial block now b's alone");
    CHECK(kv_seq_cow(&p, a, 6) == 0 && a->blocks[1] != a1 && !p.hash[a->blocks[1]], "copy");
    check_pool(&p, "truncate shared");
    /* b truncates into block 1, now its alone: leaves the index in place, no copy. */
    CHECK(kv_seq_truncate(&p, b, 5) == 0 && b->blocks[1] == a1 && !p.hash[a1] &&
              b->n_committed == 1, "own cut block leaves the index");
    check_pool(&p, "truncate own");
    /* Unshared indexed block rewritten in place: dropped from the index, same block. */
    CHECK(kv_seq_reserve(&p, b, 8) == 0, "reserve");
    for (int q = 5; q < 8; q++) write_pos(&p, b, q, tok_tag(q, tb[q]));
    b->n_tokens = 8;
    CHECK(kv_seq_commit(&p, b, tb, 8) == 1 && p.hash[a1], "recommitted");
    CHECK(kv_seq_cow(&p, b, 1) == 0 && !p.hash[b->blocks[0]] && b->n_committed == 0,
          "in-place write unindexes block 0 and rewinds");
    CHECK(p.hash[a1] != 0, "block 1 keeps its old-prefix entry");
    check_pool(&p, "cow own indexed");

    /* Truncate releasing indexed blocks puts them on the LRU, tail first. */
    int32_t b1 = b->blocks[1];
    CHECK(kv_seq_truncate(&p, b, 0) == 0 && b->n_blocks == 0, "truncate to 0");
    CHECK(kv_cached_blocks(&p) == 1 && p.lru_head == b1, "indexed block 1 cached");
    check_pool(&p, "truncate to LRU");
    kv_seq_release(&p, a);
    kv_seq_release(&p, b);
    CHECK(kv_free_blocks(&p) == CFG_P.n_blocks, "all back");

    /* kv_check sees damage; a stored-token mismatch (a collision, as lookup sees it) is
     * never matched. */
    check_pool(&p, "before damage");
    char err[200];
    int32_t c0 = p.lru_tail; /* a's block 0, released last */
    CHECK(c0 == a0, "a's head block cached last");
    uint64_t ko = p.hash[c0];
    p.hash[c0] ^= 1;
    CHECK(kv_check(&p, err, sizeof err) == -EFAULT, "wrong key caught");
    p.hash[c0] = ko;
    int32_t sv = p.tok[c0 * 4];
    p.tok[c0 * 4] ^= 7;
    CHECK(kv_check(&p, err, sizeof err) == -EFAULT, "wrong stored tokens caught");
    kv_seq *m = kv_seq_new(&p);
    CHECK(kv_seq_match(&p, m, t, 10) == 0, "a key hit with other tokens is a miss");
    p.tok[c0 * 4] = sv;
    kv_seq_release(&p, m);
    uint64_t pa = p.parent[c0];
    p.parent[c0] ^= 1;
    CHECK(kv_check(&p, err, sizeof err) == -EFAULT, "wrong stored parent caught");
    m = kv_seq_new(&p);
    CHECK(kv_seq_match(&p, m, t, 10) == 0, "a key hit under another parent is a miss");
    kv_seq_release(&p, m);
    p.parent[c0] = pa;
    m = kv_seq_new(&p);
    CHECK(kv_seq_match(&p, m, t, 10) == 4, "repaired: block 0 matches");
    kv_seq_release(&p, m);
    int32_t pv = p.lru_prev[c0];
    p.lru_prev[c0] = 3;
    CHECK(kv_check(&p, err, sizeof err) == -EFAULT, "LRU link caught: %s", err);
    p.lru_prev[c0] = pv;
    p.hash[a2] = 5; /* a free block with a key */
    CHECK(kv_check(&p, err, sizeof err) == -EFAULT, "keyed free block caught: %s", err);
    p.hash[a2] = 0;
    p.n_lru++;
    CHECK(kv_check(&p, err, sizeof err) == -EFAULT, "LRU count caught: %s", err);
    p.n_lru--;
    check_pool(&p, "repaired");
    kv_pool_free(&p);

    /* Cache off: commit and match do nothing, indexed blocks never appear. */
    CHECK(kv_pool_init(&p, &CFG, NULL) == 0, "init off");
    a = kv_seq_new(&p);
    CHECK(kv_seq_reserve(&p, a, 10) == 0, "reserve");
    a->n_tokens = 10;
    CHECK(kv_seq_commit(&p, a, t, 10) == 0 && a->n_committed == 0 && p.n_indexed == 0, "off");
    kv_seq_release(&p, a);
    a = kv_seq_new(&p);
    CHECK(kv_seq_match(&p, a, t, 10) == 0 && p.stats.prefix_queries == 0, "match off");
    CHECK(kv_cached_blocks(&p) == 0 && p.n_free == CFG.n_blocks, "nothing cached");
    check_pool(&p, "off");
    kv_pool_free(&p);
}

/* Fail hooks across a prefix scenario: every step either completes or fails leaving the
 * pool consistent, match and commit never fail, and everything comes back. Even phases
 * grow one prompt (reusing the last phase's blocks), odd phases run a distractor prompt
 * that competes for the pool, so cached blocks get evicted. */
static int prefix_scenario(kv_pool *p, const int32_t *t, const int32_t *u, kv_seq **ps,
                           int *phase) {
    int rc;
    while (*phase < 6) {
        if (!*ps && !(*ps = kv_seq_new(p))) return -ENOSPC;
        kv_seq *s = *ps;
        const int32_t *tk = *phase % 2 ? u : t;
        int len = *phase % 2 ? 24 : 20 + 4 * *phase; /* 20, 24, 28, 24, 36, 24 */
        if (s->n_blocks == 0) {
            rc = kv_seq_match(p, s, tk, len);
            if (rc < 0 || rc % 4 || rc > (len - 1) / 4 * 4) return -EPROTO;
            for (int q = 0; q < rc; q++)
                if (!read_ok(p, s, q, tok_tag(q, tk[q]))) return -EPROTO;
        }
        if ((rc = kv_seq_reserve(p, s, len)) != 0) return rc;
        for (int q = s->n_tokens; q < len; q++) {
            if ((rc = kv_seq_cow(p, s, q)) != 0) return rc;
            write_pos(p, s, q, tok_tag(q, tk[q]));
            s->n_tokens = q + 1;
        }
        if ((rc = kv_seq_commit(p, s, tk, len)) < 0) return rc;
        if (*phase == 4) { /* a fork that rewrites a shared, indexed block: copies it */
            kv_seq *f = kv_seq_fork(p, s);
            if (!f) return -ENOSPC;
            rc = kv_seq_cow(p, f, len - 1);
            kv_seq_release(p, f);
            if (rc) return rc;
        }
        kv_seq_release(p, s);
        *ps = NULL;
        ++*phase;
    }
    return 0;
}

static void test_prefix_oom(void) {
    kv_config cfg = CFG_P;
    cfg.n_blocks = 14; /* 11 after the blocker: the distractor forces evictions */
    int32_t t[MAX_POS], u[MAX_POS];
    for (int i = 0; i < MAX_POS; i++) t[i] = u[i] = (i * 3) % 4;
    u[0] = 3;
    for (int sticky = 0; sticky < 2; sticky++) {
        int n, done = 0, n_failed = 0;
        for (n = 1; n < 80 && !done; n++) {
            kv_pool p;
            CHECK(kv_pool_init(&p, &cfg, NULL) == 0, "init");
            kv_seq *blocker = kv_seq_new(&p); /* holds 3 blocks throughout */
            CHECK(kv_seq_reserve(&p, blocker, 12) == 0, "blocker");
            kv_seq *s = NULL;
            int phase = 0;
            if (sticky) kv_fail_from(&p, n);
            else kv_fail_after(&p, n);
            int rc = prefix_scenario(&p, t, u, &s, &phase);
            CHECK(rc == 0 || rc == -ENOMEM, "n=%d: rc %d", n, rc);
            check_pool(&p, "after a failed prefix step");
            done = rc == 0;
            if (rc == -ENOMEM) {
                n_failed++;
                /* Retry the same request: one failure finishes; sticky fails again. */
                rc = prefix_scenario(&p, t, u, &s, &phase);
                CHECK(sticky ? rc == -ENOMEM : rc == 0, "n=%d: retry: %d", n, rc);
                check_pool(&p, "after the prefix retry");
            }
            kv_fail_after(&p, 0);
            if (!done) CHECK(prefix_scenario(&p, t, u, &s, &phase) == 0, "n=%d: finish", n);
            CHECK(p.stats.evictions > 0 && p.stats.prefix_hits > 0, "n=%d: evicts and reuses", n);
            kv_seq_release(&p, s);
            kv_seq_release(&p, blocker);
            CHECK(kv_free_blocks(&p) == cfg.n_blocks, "n=%d leak: %d free", n,
                  kv_free_blocks(&p));
            check_pool(&p, "after prefix release");
            kv_pool_free(&p);
        }
        CHECK(done && n_failed >= 10, "prefix OOM loop: %d failing rounds", n_failed);
        if (!sticky) printf("kv prefix OOM loop: %d allocations\n", n_failed);
    }
}

/* ---------------------------------------------------------------- 8-bit blocks */

/* kv8: real values (8-bit blocks are read back approximately), each a function of
 * (position, token, layer, K|V, head, dim) so a block's contents follow its tokens,
 * and exact in f16: (k % 29 - 14) / 8. */
static float q8_val(int pos, int32_t tok, int l, int kv, int h, int d) {
    unsigned k = (unsigned)(tok * 7 + pos * 3 + l * 5 + kv * 11 + h * 13 + d * 17);
    return (float)((int)(k % 29) - 14) / 8.0f;
}

/* A device for pools with external data, in C: the pool's block layout in a buffer of
 * its own, and an 8-bit flag and int8 scales per unit (the first unit of each block)
 * as the CUDA backend keeps them. Only the pool's kv_ext calls and the test's writes
 * touch it, and the writes act as the device's cache write does: a block's first
 * position clears its unit's flag. So reading a sequence back through the pool's loc
 * checks every move, copy and conversion the pool asked for. */
typedef struct {
    const kv_pool *p;
    uint16_t *mem;  /* [n_blocks * units][unit_elems] */
    uint8_t *flag;  /* [n_blocks * units] */
    float *scale;   /* [n_blocks * units][slabs] */
    int copies, to_q8s, expands;
} fake_dev;

static uint16_t *dev_unit(const fake_dev *dv, int32_t u) { return dv->mem + (size_t)u * dv->p->unit_elems; }
static int dev_slabs(const fake_dev *dv) { return 2 * dv->p->cfg.n_layers * dv->p->cfg.n_kv_heads; }

static void dev_copy(void *ctx, int32_t dst, int32_t src, int n) {
    fake_dev *dv = ctx;
    int un = dv->p->units * dv->p->cfg.n_blocks, sl = dev_slabs(dv);
    CHECK(n >= 1 && dst >= 0 && src >= 0 && dst + n <= un && src + n <= un &&
              (dst + n <= src || src + n <= dst), "copy of %d units %d -> %d", n, src, dst);
    memcpy(dev_unit(dv, dst), dev_unit(dv, src), (size_t)n * dv->p->unit_elems * sizeof(uint16_t));
    dv->flag[dst] = dv->flag[src];
    memcpy(dv->scale + (size_t)dst * sl, dv->scale + (size_t)src * sl, (size_t)sl * sizeof(float));
    dv->copies++;
}

/* int8 per slab, max |x| / 127, in place: slab k's bytes overlap f16 slabs <= k only. */
static void dev_to_q8(void *ctx, int32_t u) {
    fake_dev *dv = ctx;
    size_t he = dv->p->head_elems;
    CHECK(u % dv->p->units == 0 && !dv->flag[u], "to_q8 at unit %d (flag %d)", u, dv->flag[u]);
    float tmp[64];
    CHECK(he <= 64, "a slab fits the conversion buffer");
    for (int k = 0; k < dev_slabs(dv); k++) {
        float mx = 0.0f;
        for (size_t i = 0; i < he; i++) {
            tmp[i] = quant_f16_to_f32(dev_unit(dv, u)[(size_t)k * he + i]);
            mx = fabsf(tmp[i]) > mx ? fabsf(tmp[i]) : mx;
        }
        float sc = mx / 127.0f;
        dv->scale[(size_t)u * dev_slabs(dv) + k] = sc;
        for (size_t i = 0; i < he; i++)
            ((int8_t *)dev_unit(dv, u))[(size_t)k * he + i] = (int8_t)lrintf(sc > 0 ? tmp[i] / sc : 0.0f);
    }
    dv->flag[u] = 1;
    dv->to_q8s++;
}

static void dev_expand(void *ctx, int32_t dst, int32_t src) {
    fake_dev *dv = ctx;
    size_t he = dv->p->head_elems;
    int units = dv->p->units;
    CHECK(dst % units == 0 && (src < dst || src >= dst + units) && dv->flag[src],
          "expand %d -> %d (flag %d)", src, dst, dv->flag[src]);
    for (int k = 0; k < dev_slabs(dv); k++)
        for (size_t i = 0; i < he; i++)
            dev_unit(dv, dst)[(size_t)k * he + i] = quant_f32_to_f16(
                ((const int8_t *)dev_unit(dv, src))[(size_t)k * he + i] *
                dv->scale[(size_t)src * dev_slabs(dv) + k]);
    dv->flag[dst] = 0;
    dv->expands++;
}

static void dev_open(fake_dev *dv, kv_pool *p) {
    size_t un = (size_t)p->units * (size_t)p->cfg.n_blocks;
    memset(dv, 0, sizeof *dv);
    dv->p = p;
    dv->mem = calloc(un, p->unit_elems * sizeof(uint16_t));
    dv->flag = calloc(un, 1);
    dv->scale = calloc(un * (size_t)dev_slabs(dv), sizeof(float));
    CHECK(dv->mem && dv->flag && dv->scale, "fake device memory");
    memset(dv->flag, 1, un); /* stale flags: a fresh block must not be read by them */
    p->ext = (kv_ext){dv, dev_copy, dev_to_q8, dev_expand};
}

static void dev_close(fake_dev *dv) {
    free(dv->mem), free(dv->flag), free(dv->scale);
    memset(dv, 0, sizeof *dv);
}

/* K and V slabs of (block, layer, head): the pool's host data, or the fake device's. */
static uint16_t *slab_of(const kv_pool *p, int32_t b, int l, int is_v, int h) {
    if (p->data) return is_v ? kv_v(p, b, l, h) : kv_k(p, b, l, h);
    const fake_dev *dv = p->ext.ctx;
    return dev_unit(dv, p->loc[b]) + kv_slab(p, l, is_v, h) * p->head_elems;
}

static void q8_write(kv_pool *p, kv_seq *s, int pos, int32_t tok) {
    CHECK(kv_seq_cow(p, s, pos) == 0, "cow before writing %d", pos);
    int32_t b = s->blocks[pos / p->cfg.block_size];
    int slot = pos % p->cfg.block_size, hd = p->cfg.head_dim;
    CHECK(!kv_is_q8(p, b), "kv_seq_cow left block %d 8-bit", b);
    if (!p->data && slot == 0) ((fake_dev *)p->ext.ctx)->flag[p->loc[b]] = 0;
    for (int l = 0; l < p->cfg.n_layers; l++)
        for (int h = 0; h < p->cfg.n_kv_heads; h++)
            for (int d = 0; d < hd; d++) {
                slab_of(p, b, l, 0, h)[kv_k_index(p, slot, d)] = quant_f32_to_f16(q8_val(pos, tok, l, 0, h, d));
                slab_of(p, b, l, 1, h)[slot * hd + d] = quant_f32_to_f16(q8_val(pos, tok, l, 1, h, d));
            }
}

/* An 8-bit block's K and V slabs of (layer, head) as f16: the pool's, or the fake
 * device's after checking that its flag agrees with the pool. 0 when it does not. */
static int q8_slabs(const kv_pool *p, int32_t b, int l, int h, uint16_t *k, uint16_t *v) {
    if (p->data) {
        kv_q8_read(p, b, l, h, k, v);
        return 1;
    }
    const fake_dev *dv = p->ext.ctx;
    int32_t u = p->loc[b];
    if (!dv->flag[u]) return 0;
    for (int is_v = 0; is_v < 2; is_v++) {
        size_t sl = kv_slab(p, l, is_v, h);
        const int8_t *q = (const int8_t *)dev_unit(dv, u) + sl * p->head_elems;
        for (size_t i = 0; i < p->head_elems; i++)
            (is_v ? v : k)[i] = quant_f32_to_f16(q[i] * dv->scale[(size_t)u * dev_slabs(dv) + sl]);
    }
    return 1;
}

/* Is layer l of the pool's config windowed? */
static int windowed(const kv_pool *p, int l) {
    return p->cfg.swa_window > 0 && (p->cfg.swa_layers[l / 64] >> (l % 64) & 1);
}

/* Every written position of s that a layer still reads (a windowed layer only the window
 * of position n, the next one): exact in f16 blocks, within one int8 step (max 1.75 /
 * 127, plus f16 rounding of the result) in 8-bit ones. */
static int q8_read_lossy(const kv_pool *p, const kv_seq *s, const int32_t *toks, int n, int lossy) {
    int bs = p->cfg.block_size, hd = p->cfg.head_dim;
    int first = kv_swa_first(p->cfg.swa_window, n);
    uint16_t k[64], v[64];
    CHECK(p->head_elems <= 64, "a slab fits the read-back buffers");
    for (int pos = 0; pos < n; pos++) {
        int32_t b = s->blocks[pos / bs];
        int slot = pos % bs;
        for (int l = 0; l < p->cfg.n_layers; l++)
            for (int h = 0; h < p->cfg.n_kv_heads && !(windowed(p, l) && pos < first); h++) {
                const uint16_t *K = slab_of(p, b, l, 0, h), *V = slab_of(p, b, l, 1, h) + slot * hd;
                float tol = lossy ? 1.75f / 127.0f * 0.51f + 0.002f : 0.0f;
                if (!p->data && ((const fake_dev *)p->ext.ctx)->flag[p->loc[b]] != kv_is_q8(p, b))
                    return 0; /* the device would read it in the other format */
                if (kv_is_q8(p, b)) {
                    if (!q8_slabs(p, b, l, h, k, v)) return 0;
                    K = k, V = v + slot * hd;
                    tol = 1.75f / 127.0f * 0.51f + 0.002f;
                }
                for (int d = 0; d < hd; d++)
                    if (fabsf(quant_f16_to_f32(K[kv_k_index(p, slot, d)]) - q8_val(pos, toks[pos], l, 0, h, d)) > tol ||
                        fabsf(quant_f16_to_f32(V[d]) - q8_val(pos, toks[pos], l, 1, h, d)) > tol)
                        return 0;
            }
    }
    return 1;
}

static int q8_read_ok(const kv_pool *p, const kv_seq *s, const int32_t *toks, int n) {
    return q8_read_lossy(p, s, toks, n, 0);
}

/* The converters model_kv_shape passes: core's f16 kernels. */
static void to_f32(const uint16_t *src, float *dst, int64_t n) { quant_dequant(QT_F16, src, dst, n); }
static void to_f16(const float *src, uint16_t *dst, int64_t n) { quant_quantize(QT_F16, src, dst, n); }

static const kv_config CFG_Q8 = {
    .n_layers = 2, .n_kv_heads = 2, .head_dim = 4, .block_size = 4,
    .n_blocks = 24, .max_seqs = 8, .max_blocks_per_seq = 12, .prefix_cache = 1, .kv8 = 1,
    .f16 = {to_f32, to_f16},
};

/* Fill the pool, turn it to 8 bits: half the memory comes back, new f16 blocks are
 * made by joining lone halves (moves), data survives, a write into an 8-bit block goes
 * to a private f16 copy, and everything returns to the pool. */
static void test_q8_basic(int external) {
    kv_pool p;
    kv_config bad = CFG_Q8, cfg = CFG_Q8;
    if (!external) { /* the configs, once */
        bad.f16.to_f16 = NULL;
        CHECK(kv_pool_init(&p, &bad, NULL) == -EINVAL, "kv8 without an f16 converter refused");
        bad.f16 = (kv_f16_conv){NULL, to_f16};
        CHECK(kv_pool_init(&p, &bad, NULL) == -EINVAL, "kv8 without an f32 converter refused");
        bad.external_data = 1;
        CHECK(kv_pool_init(&p, &bad, NULL) == 0 && !p.data && !p.scale,
              "external data needs no converters and keeps no data or scales");
        kv_pool_free(&p);
        bad.kv8 = 0, bad.external_data = 0;
        CHECK(kv_pool_init(&p, &bad, NULL) == 0, "no converters needed without kv8");
        kv_pool_free(&p);
    }
    cfg.external_data = external;
    CHECK(kv_pool_init(&p, &cfg, NULL) == 0, "init kv8");
    fake_dev dv;
    if (external) dev_open(&dv, &p);
    CHECK(p.n_ids == 48 && kv_free_blocks(&p) == 24, "ids %d, free %d", p.n_ids, kv_free_blocks(&p));
    int32_t toks[6][48];
    kv_seq *s[6];
    for (int i = 0; i < 6; i++) { /* 6 x 16 positions: 24 blocks, the whole pool */
        s[i] = kv_seq_new(&p);
        CHECK(kv_seq_reserve(&p, s[i], 16) == 0, "reserve %d", i);
        for (int pos = 0; pos < 16; pos++) q8_write(&p, s[i], pos, toks[i][pos] = (int32_t)rnd(5));
    }
    CHECK(kv_free_blocks(&p) == 0, "pool full: %d free", kv_free_blocks(&p));
    kv_seq *x = kv_seq_new(&p);
    CHECK(kv_seq_reserve(&p, x, 1) == -ENOMEM, "no room before compaction");
    int conv = 0;
    for (int i = 0; i < 6; i++) conv += kv_seq_to_q8(&p, s[i], i == 5 ? 13 : 16, 100);
    CHECK(conv == 23, "converted %d of 23 full blocks (the last one is partial)", conv);
    CHECK(kv_q8_blocks(&p) == 23 && kv_free_blocks(&p) == 11, "8-bit %d, free %d",
          kv_q8_blocks(&p), kv_free_blocks(&p));
    check_pool(&p, "after conversion");
    for (int i = 0; i < 6; i++) CHECK(q8_read_ok(&p, s[i], toks[i], 16), "seq %d after conversion", i);
    uint64_t moves = p.stats.q8_moves;
    CHECK(kv_seq_reserve(&p, x, 44) == 0, "11 f16 blocks from the freed halves");
    CHECK(p.stats.q8_moves > moves, "joining halves moved 8-bit blocks");
    int32_t xt[48];
    for (int pos = 0; pos < 44; pos++) q8_write(&p, x, pos, xt[pos] = (int32_t)rnd(5));
    check_pool(&p, "after compaction");
    for (int i = 0; i < 6; i++) CHECK(q8_read_ok(&p, s[i], toks[i], 16), "seq %d after moves", i);
    CHECK(q8_read_ok(&p, x, xt, 44), "new seq");
    CHECK(kv_free_blocks(&p) == 0, "full again");
    /* a write into an 8-bit block needs a private f16 copy: no room, then room */
    CHECK(kv_seq_cow(&p, s[0], 3) == -ENOMEM, "cow of an 8-bit block without room");
    kv_seq_release(&p, x);
    CHECK(kv_is_q8(&p, s[0]->blocks[0]), "block 0 of seq 0 is 8-bit");
    q8_write(&p, s[0], 3, toks[0][3] = 4);
    /* the copy holds the 8-bit values, now in f16: close, not exact */
    CHECK(!kv_is_q8(&p, s[0]->blocks[0]) && q8_read_lossy(&p, s[0], toks[0], 16, 1), "rewritten");
    for (int i = 0; i < 6; i++) {
        CHECK(kv_seq_commit(&p, s[i], toks[i], 16) >= 0, "commit %d", i);
        kv_seq_release(&p, s[i]);
    }
    kv_seq_release(&p, x);
    CHECK(kv_cached_to_q8(&p, 100) > 0, "cached blocks converted");
    check_pool(&p, "cached 8-bit");
    CHECK(kv_free_blocks(&p) == 24, "all back: %d", kv_free_blocks(&p));
    kv_seq *y = kv_seq_new(&p);
    CHECK(kv_seq_match(&p, y, toks[1], 16) == 12, "8-bit prefix matched");
    CHECK(q8_read_ok(&p, y, toks[1], 12), "matched 8-bit data");
    CHECK(kv_seq_reserve(&p, y, 48) == 0 && kv_free_blocks(&p) >= 0, "grow past the match");
    check_pool(&p, "grown");
    kv_seq_release(&p, y);
    CHECK(kv_seq_reserve(&p, kv_seq_new(&p), 48) == 0 && kv_seq_reserve(&p, kv_seq_new(&p), 48) == 0,
          "the whole pool as f16 after evictions");
    check_pool(&p, "evicted all");
    if (external) {
        CHECK(dv.copies > 0 && dv.to_q8s > 0 && dv.expands > 0, "the device moved %d, converted %d, expanded %d",
              dv.copies, dv.to_q8s, dv.expands);
        dev_close(&dv);
    }
    kv_pool_free(&p);
}

/* Outside values: an f16 infinity or NaN in a block saturates or zeroes, never poisons
 * the slab's scale or the other values. */
static void test_q8_nonfinite(void) {
    kv_pool p;
    CHECK(kv_pool_init(&p, &CFG_Q8, NULL) == 0, "init kv8");
    kv_seq *s = kv_seq_new(&p);
    int32_t toks[4] = {1, 2, 3, 4};
    CHECK(kv_seq_reserve(&p, s, 4) == 0, "reserve");
    for (int pos = 0; pos < 4; pos++) q8_write(&p, s, pos, toks[pos]);
    int32_t b = s->blocks[0];
    kv_k(&p, b, 0, 0)[0] = 0x7c00; /* +inf */
    kv_k(&p, b, 0, 0)[1] = 0x7e00; /* NaN */
    CHECK(kv_block_to_q8(&p, b) == 1, "converted");
    uint16_t k[16], v[16];
    CHECK(p.head_elems <= 16, "a slab fits the read-back buffers");
    kv_q8_read(&p, b, 0, 0, k, v);
    float sc = kv_q8_scale(&p, b, 0, 0, 0);
    CHECK(sc > 0 && sc < 65505.0f / 127 * 1.001f, "finite scale %g", sc);
    CHECK(quant_f16_to_f32(k[0]) > 65000.0f && quant_f16_to_f32(k[1]) == 0.0f, "inf saturated, NaN zero: %g %g",
          quant_f16_to_f32(k[0]), quant_f16_to_f32(k[1]));
    int finite = 1;
    for (int i = 0; i < 16; i++) finite &= isfinite(quant_f16_to_f32(k[i])) && isfinite(quant_f16_to_f32(v[i]));
    CHECK(finite, "every value read back is finite");
    kv_seq_release(&p, s);
    check_pool(&p, "non-finite");
    kv_pool_free(&p);
}

/* The randomized mix of the 8-bit and window tests: new sequences (a prefix match), appends
 * (reserve, cow, write, commit, then kv_seq_slide as the engine does), forks, releases,
 * 8-bit conversions of sequences and cached blocks (with kv8), short rewinds (when asked:
 * refused where they would reach freed KV), OOM; kv_check after every operation, every
 * sequence's readable data every 16. Returns the ENOMEMs; *rewinds the rewinds done. */
static int random_mix(kv_pool *p, int n_ops, int rewind, int *rewinds, const char *what_mix) {
    kv_seq *s[8] = {0};
    int32_t toks[8][48];
    int n[8] = {0}, enomem = 0, kv8 = p->cfg.kv8;
    *rewinds = 0;
    for (int op = 0; op < n_ops; op++) {
        int i = (int)rnd(8), what = (int)rnd(12);
        if (!s[i]) {
            s[i] = kv_seq_new(p);
            int len = 1 + (int)rnd(40);
            for (int k = 0; k < len; k++) toks[i][k] = k < 12 ? i % 2 : (int32_t)rnd(3);
            n[i] = kv_seq_match(p, s[i], toks[i], len);
            if (n[i] < 0) n[i] = 0;
            CHECK(q8_read_ok(p, s[i], toks[i], n[i]), "%s: matched prefix data", what_mix);
            toks[i][47] = len; /* remembered: the prompt's length */
        } else if (what < 6 && n[i] < 47) { /* append up to 6 */
            int to = n[i] + 1 + (int)rnd(6), len = toks[i][47];
            if (to > 47) to = 47;
            if (kv_seq_reserve(p, s[i], to) < 0) {
                enomem++;
                continue;
            }
            int k = n[i];
            for (; k < to; k++) {
                if (k >= len) toks[i][k] = (int32_t)rnd(3);
                if (kv_seq_cow(p, s[i], k) < 0) break;
                q8_write(p, s[i], k, toks[i][k]);
            }
            enomem += k < to;
            n[i] = k;
            kv_seq_commit(p, s[i], toks[i], n[i]);
            kv_seq_slide(p, s[i], n[i]);
        } else if (what == 6 && kv8) {
            kv_seq_to_q8(p, s[i], n[i], 1 + (int)rnd(4));
        } else if (what == 7 && kv8) {
            kv_cached_to_q8(p, 1 + (int)rnd(4));
        } else if (what == 8) { /* fork into a free slot */
            int j = (int)rnd(8);
            if (!s[j]) {
                s[j] = kv_seq_fork(p, s[i]);
                memcpy(toks[j], toks[i], sizeof toks[i]);
                n[j] = n[i];
            }
        } else if (what == 9 && rewind && n[i] > 0) {
            int to = n[i] - 1 - (int)rnd(5);
            if (to < 0) to = 0;
            int r = kv_seq_truncate(p, s[i], to);
            CHECK(r == 0 || r == -EINVAL, "%s: truncate: %d", what_mix, r);
            if (r == 0) n[i] = to, ++*rewinds;
        } else {
            kv_seq_release(p, s[i]);
            s[i] = NULL, n[i] = 0;
        }
        check_pool(p, what_mix);
        if (op % 16 == 0)
            for (int j = 0; j < 8; j++)
                if (s[j]) CHECK(q8_read_ok(p, s[j], toks[j], n[j]), "%s: seq %d data, op %d", what_mix, j, op);
    }
    for (int j = 0; j < 8; j++) kv_seq_release(p, s[j]);
    check_pool(p, what_mix);
    CHECK(kv_free_blocks(p) == p->cfg.n_blocks, "%s: all blocks back: %d", what_mix, kv_free_blocks(p));
    return enomem;
}

static void test_q8_random(int n_ops, int external) {
    kv_pool p;
    kv_config cfg = CFG_Q8;
    cfg.external_data = external;
    CHECK(kv_pool_init(&p, &cfg, NULL) == 0, "init kv8");
    fake_dev dv;
    if (external) dev_open(&dv, &p);
    const char *what = external ? "random kv8, external data" : "random kv8";
    int rewinds, enomem = random_mix(&p, n_ops, 0, &rewinds, what);
    printf("%s: %llu conversions, %llu moves, %llu evictions, %d ENOMEM\n", what,
           (unsigned long long)p.stats.q8_conversions, (unsigned long long)p.stats.q8_moves,
           (unsigned long long)p.stats.evictions, enomem);
    CHECK(p.stats.q8_conversions > 100 && p.stats.q8_moves > 10, "the mix exercised kv8");
    if (external) {
        CHECK(dv.to_q8s == (int)p.stats.q8_conversions && dv.copies >= (int)p.stats.q8_moves,
              "device: %d conversions, %d copies", dv.to_q8s, dv.copies);
        dev_close(&dv);
    }
    kv_pool_free(&p);
}

/* ---------------------------------------------------------------- sliding windows */

/* Block_size 4, a window of 6 positions. HOLES: 4 layers, every one windowed; SHRINK: 4
 * layers, 0 and 2 windowed (1 and 3 global, stored first: a gone block keeps half);
 * QUARTERS: 8 layers, 3 and 7 global (a gone block keeps a quarter, as Gemma 3's). */
enum { SWA_HOLES, SWA_SHRINK, SWA_QUARTERS };
static kv_config swa_cfg(int kind, int kv8, int n_blocks) {
    kv_config c = {.n_layers = kind == SWA_QUARTERS ? 8 : 4, .n_kv_heads = 2, .head_dim = 4,
                   .block_size = 4, .n_blocks = n_blocks, .max_seqs = 8, .max_blocks_per_seq = 12,
                   .prefix_cache = 1, .kv8 = kv8, .f16 = {to_f32, to_f16}, .swa_window = 6};
    c.swa_layers[0] = kind == SWA_HOLES ? 0xf : kind == SWA_SHRINK ? 0x5 : 0x77;
    return c;
}

/* Write positions [from, to) of s with toks (cow first), then commit and slide as the
 * engine does after a step. */
static void swa_append(kv_pool *p, kv_seq *s, const int32_t *toks, int from, int to) {
    CHECK(kv_seq_reserve(p, s, to) == 0, "reserve %d", to);
    for (int pos = from; pos < to; pos++) q8_write(p, s, pos, toks[pos]);
    CHECK(kv_seq_commit(p, s, toks, to) >= 0, "commit %d", to);
    kv_seq_slide(p, s, to);
}

static void test_swa_config(void) {
    kv_pool p;
    kv_config c = swa_cfg(SWA_HOLES, 0, 16);
    CHECK(kv_pool_init(&p, &c, NULL) == 0 && p.swa == KV_SWA_HOLES && p.n_ids == 16,
          "every layer windowed: holes, no units (swa %d, ids %d)", p.swa, p.n_ids);
    kv_pool_free(&p);
    c = swa_cfg(SWA_SHRINK, 0, 16);
    CHECK(kv_pool_init(&p, &c, NULL) == 0 && p.swa == KV_SWA_SHRINK && p.n_ids == 32 && p.q8,
          "half the layers global: blocks halve, units without kv8 (swa %d, ids %d)", p.swa, p.n_ids);
    CHECK(p.lslot[1] == 0 && p.lslot[3] == 1 && p.lslot[0] == 2 && p.lslot[2] == 3,
          "global layers stored first: %d %d %d %d", p.lslot[0], p.lslot[1], p.lslot[2], p.lslot[3]);
    CHECK(kv_block_to_q8(&p, 0) == -EINVAL && kv_free_blocks(&p) == 16, "no 8 bits without kv8");
    kv_pool_free(&p);
    c.swa_layers[0] = 0x1; /* 3 global layers do not fit in half a block */
    CHECK(kv_pool_init(&p, &c, NULL) == 0 && p.swa == KV_SWA_NONE && p.n_ids == 16,
          "more global than windowed layers: nothing freed (swa %d)", p.swa);
    kv_pool_free(&p);
    c = swa_cfg(SWA_QUARTERS, 1, 16);
    CHECK(kv_pool_init(&p, &c, NULL) == 0 && p.swa == KV_SWA_SHRINK && p.units == 4 && p.n_ids == 64 &&
          p.lslot[3] == 0 && p.lslot[7] == 1 && p.lslot[0] == 2, "2 global layers of 8: quarter units (%d)", p.units);
    kv_pool_free(&p);
    c = swa_cfg(SWA_SHRINK, 0, 16);
    c.external_data = 1;
    CHECK(kv_pool_init(&p, &c, NULL) == -EINVAL, "windows with device data refused");
    c = swa_cfg(SWA_SHRINK, 0, 16);
    c.n_layers = KV_MAX_LAYERS + 1;
    CHECK(kv_pool_init(&p, &c, NULL) == -EINVAL, "more layers than the window mask refused");
}

/* Every layer windowed: pages behind the window become holes (cached while indexed), a
 * fork copies them, a match skips missing blocks behind its window but not in it. */
static void test_swa_holes(void) {
    kv_pool p;
    kv_config c = swa_cfg(SWA_HOLES, 0, 16);
    CHECK(kv_pool_init(&p, &c, NULL) == 0, "init");
    int32_t t[48];
    for (int i = 0; i < 48; i++) t[i] = (int32_t)rnd(5);
    kv_seq *a = kv_seq_new(&p);
    swa_append(&p, a, t, 0, 20); /* the window of position 20 is [15, 20]: pages 0-2 go */
    CHECK(a->swa_lo == 3 && a->blocks[0] == -1 && a->blocks[2] == -1 && a->blocks[3] >= 0,
          "pages 0-2 holes (swa_lo %d)", a->swa_lo);
    CHECK(kv_cached_blocks(&p) == 3 && kv_free_blocks(&p) == 16 - 2 + 0,
          "the 3 dropped blocks cached (%d), 2 held (%d free)", kv_cached_blocks(&p), kv_free_blocks(&p));
    CHECK(p.stats.swa_freed == 3, "3 freed: %llu", (unsigned long long)p.stats.swa_freed);
    CHECK(q8_read_ok(&p, a, t, 20), "the window's data");
    CHECK(kv_seq_cow(&p, a, 4) == -EINVAL, "a hole is never written");
    kv_seq *f = kv_seq_fork(&p, a);
    CHECK(f && f->swa_lo == 3 && f->blocks[1] == -1 && q8_read_ok(&p, f, t, 20), "fork keeps holes");
    check_pool(&p, "holes forked");
    swa_append(&p, f, t, 20, 28);
    CHECK(f->swa_lo == 5 && q8_read_ok(&p, f, t, 28) && q8_read_ok(&p, a, t, 20), "fork slid alone");
    kv_seq_release(&p, f);
    /* a new prompt with a's 20 tokens and more: pages 3-4 attached, 0-2 holes */
    kv_seq *b = kv_seq_new(&p);
    CHECK(kv_seq_match(&p, b, t, 24) == 20 && b->swa_lo == 3 && b->blocks[0] == -1 &&
          b->blocks[3] == a->blocks[3] && q8_read_ok(&p, b, t, 20), "match of 20 (swa_lo %d)", b->swa_lo);
    check_pool(&p, "matched");
    kv_seq_release(&p, a);
    kv_seq_release(&p, b);
    /* evict the oldest cached blocks (pages 0-2): the match still holds, they are behind it */
    kv_seq *x = kv_seq_new(&p);
    CHECK(kv_seq_reserve(&p, x, 4 * (16 - kv_cached_blocks(&p)) + 12) == 0, "fill with 3 evictions");
    CHECK(p.stats.evictions == 3, "evicted %llu", (unsigned long long)p.stats.evictions);
    b = kv_seq_new(&p);
    CHECK(kv_seq_match(&p, b, t, 24) == 20, "match past evicted pages: %d", b->n_tokens);
    kv_seq_release(&p, b);
    kv_seq_release(&p, x);
    check_pool(&p, "holes end");
    CHECK(kv_free_blocks(&p) == 16, "all back: %d", kv_free_blocks(&p));
    kv_pool_free(&p);
}

/* Some layers global: a block behind every window gives its second unit back (gone), or
 * when indexed goes spare first; the global layers' data stays, a match never ends
 * where its window would read a gone block, a rewind into one is refused. */
static void test_swa_shrink(void) {
    kv_pool p;
    kv_config c = swa_cfg(SWA_SHRINK, 0, 12);
    c.prefix_cache = 0;
    CHECK(kv_pool_init(&p, &c, NULL) == 0, "init");
    int32_t t[48];
    for (int i = 0; i < 48; i++) t[i] = (int32_t)rnd(5);
    kv_seq *a = kv_seq_new(&p);
    swa_append(&p, a, t, 0, 24); /* window of 24: [19, 24]: pages 0-3 behind it */
    CHECK(a->swa_lo == 4 && p.stats.swa_freed == 4, "4 pages behind the window (swa_lo %d)", a->swa_lo);
    CHECK(kv_free_blocks(&p) == 12 - 6 + 2, "4 halves back: %d free", kv_free_blocks(&p));
    CHECK(p.gone[a->blocks[0]] == KV_GONE && p.gone[a->blocks[4]] == KV_WHOLE, "gone and whole");
    CHECK(q8_read_ok(&p, a, t, 24), "global layers whole, windowed ones in the window");
    check_pool(&p, "shrunk");
    CHECK(kv_seq_truncate(&p, a, 23) == 0 && a->swa_lo == 4, "rewind within whole pages");
    CHECK(kv_seq_truncate(&p, a, 20) == -EINVAL && a->swa_lo == 4, "no rewind into gone pages");
    swa_append(&p, a, t, 23, 24);
    /* the freed halves make whole blocks again (moving one-unit blocks to join them) */
    kv_seq *x = kv_seq_new(&p);
    CHECK(kv_seq_reserve(&p, x, 4 * kv_free_blocks(&p)) == 0 && kv_free_blocks(&p) == 0, "refill");
    for (int pos = 0; pos < x->n_blocks * 4; pos++) q8_write(&p, x, pos, t[47 - pos % 48]);
    CHECK(q8_read_ok(&p, a, t, 24), "a's data after the halves were reused");
    check_pool(&p, "refilled");
    kv_seq_release(&p, x);
    kv_seq_release(&p, a);
    check_pool(&p, "released");
    CHECK(kv_free_blocks(&p) == 12, "all back: %d", kv_free_blocks(&p));
    kv_pool_free(&p);

    /* with the prefix cache: indexed pages go spare, counted free but still matchable */
    c.prefix_cache = 1;
    CHECK(kv_pool_init(&p, &c, NULL) == 0, "init");
    a = kv_seq_new(&p);
    swa_append(&p, a, t, 0, 24);
    CHECK(p.n_spare == 4 && kv_free_blocks(&p) == 8 && p.gone[a->blocks[0]] == KV_SPARE,
          "4 spare (%d), %d free", p.n_spare, kv_free_blocks(&p));
    kv_seq *b = kv_seq_new(&p);
    CHECK(kv_seq_match(&p, b, t, 20) == 16 && b->swa_lo == 2 && p.n_spare == 2 &&
          p.gone[a->blocks[2]] == KV_WHOLE && q8_read_ok(&p, b, t, 16),
          "a match that reads pages 2-3 again makes them whole (%d spare)", p.n_spare);
    check_pool(&p, "unspared");
    kv_seq_release(&p, b);
    CHECK(p.n_spare == 4, "b gone: pages 2-3 spare again? %d", p.n_spare);
    /* take every free unit: the spare halves go last, and then gone */
    x = kv_seq_new(&p);
    CHECK(kv_seq_reserve(&p, x, 4 * kv_free_blocks(&p)) == 0 && p.n_spare == 0, "spare taken");
    CHECK(p.gone[a->blocks[0]] == KV_GONE && q8_read_ok(&p, a, t, 24), "a reads its window");
    check_pool(&p, "spare taken");
    b = kv_seq_new(&p);
    CHECK(kv_seq_match(&p, b, t, 24) == 0, "no match can read gone pages in its window: %d", b->n_tokens);
    kv_seq_release(&p, b);
    kv_seq_release(&p, x);
    kv_seq_release(&p, a);
    b = kv_seq_new(&p);
    CHECK(kv_seq_match(&p, b, t, 30) == 24 && b->swa_lo == 4 && q8_read_ok(&p, b, t, 24),
          "a match whose window is past the gone pages: %d", b->n_tokens);
    kv_seq_release(&p, b);
    check_pool(&p, "prefix end");
    CHECK(kv_free_blocks(&p) == 12, "all back: %d", kv_free_blocks(&p));
    kv_pool_free(&p);
}

/* Two global layers of 8: a gone block keeps a quarter, and the freed quarters make whole
 * blocks again (one-unit blocks moved together, and with kv8 half-slot ones). */
static void test_swa_quarters(void) {
    kv_pool p;
    kv_config c = swa_cfg(SWA_QUARTERS, 1, 12);
    c.prefix_cache = 0;
    CHECK(kv_pool_init(&p, &c, NULL) == 0, "init");
    int32_t t[48], u[48];
    for (int i = 0; i < 48; i++) t[i] = (int32_t)rnd(5), u[i] = (int32_t)rnd(5);
    kv_seq *a = kv_seq_new(&p), *b = kv_seq_new(&p);
    swa_append(&p, a, t, 0, 24); /* pages 0-3 behind the window: 3 quarters back each */
    CHECK(kv_free_blocks(&p) == 12 - 6 + 3 && p.gone[a->blocks[1]] == KV_GONE, "4 pages gone: %d free",
          kv_free_blocks(&p));
    CHECK(kv_seq_to_q8(&p, a, 24, 100) == 2, "the 2 whole pages to 8 bits");
    CHECK(kv_free_blocks(&p) == 10 && q8_read_lossy(&p, a, t, 24, 1), "half of them back: %d free",
          kv_free_blocks(&p));
    CHECK(kv_seq_reserve(&p, b, 40) == 0, "10 whole blocks from 2 free slots and scattered quarters");
    for (int pos = 0; pos < 40; pos++) q8_write(&p, b, pos, u[pos]);
    CHECK(p.stats.q8_moves > 0 && kv_free_blocks(&p) == 0, "moved %llu, %d free",
          (unsigned long long)p.stats.q8_moves, kv_free_blocks(&p));
    CHECK(q8_read_lossy(&p, a, t, 24, 1) && q8_read_ok(&p, b, u, 40), "both sequences' data after the moves");
    check_pool(&p, "quarters");
    kv_seq_release(&p, a);
    kv_seq_release(&p, b);
    CHECK(kv_free_blocks(&p) == 12, "all back: %d", kv_free_blocks(&p));
    check_pool(&p, "quarters end");
    kv_pool_free(&p);
}

/* random_mix with windows sliding after every append, and rewinds (not with kv8, where
 * rewriting an 8-bit block's copy and converting it again adds a second rounding the
 * checks cannot tell from damage). */
static void test_swa_random(int kind, int kv8, int n_ops) {
    kv_pool p;
    kv_config c = swa_cfg(kind, kv8, 20);
    CHECK(kv_pool_init(&p, &c, NULL) == 0, "init");
    int rewinds, enomem = random_mix(&p, n_ops, !kv8, &rewinds,
                                     kind == SWA_HOLES ? "random holes" : kv8 ? "random shrink kv8" : "random shrink");
    printf("kv swa random (%s%s): %llu windows freed, %llu evictions, %llu conversions, %llu moves, "
           "%d rewinds, %d ENOMEM, prefix hits %llu/%llu\n",
           kind == SWA_HOLES ? "holes" : kind == SWA_SHRINK ? "halves" : "quarters", kv8 ? ", kv8" : "",
           (unsigned long long)p.stats.swa_freed, (unsigned long long)p.stats.evictions,
           (unsigned long long)p.stats.q8_conversions, (unsigned long long)p.stats.q8_moves, rewinds,
           enomem, (unsigned long long)p.stats.prefix_hits, (unsigned long long)p.stats.prefix_queries);
    CHECK(p.stats.swa_freed > 1000 && p.stats.evictions > 100 && p.stats.prefix_hits > 1000,
          "the mix exercised windows");
    kv_pool_free(&p);
}

int main(void) {
    test_layout();
    test_seqs();
    test_random(20000, 7, 0);
    test_random(40000, 7, 1);
    test_block_key();
    test_prefix_prompt();
    test_prefix_cow();
    test_prefix_oom();
    test_oom_loop();
    test_exhaustion();
    test_arena();
    test_q8_basic(0);
    test_q8_basic(1);
    test_q8_random(20000, 0);
    test_q8_random(20000, 1);
    test_q8_nonfinite();
    test_swa_config();
    test_swa_holes();
    test_swa_shrink();
    test_swa_quarters();
    test_swa_random(SWA_HOLES, 0, 20000);
    test_swa_random(SWA_SHRINK, 0, 20000);
    test_swa_random(SWA_SHRINK, 1, 20000);
    test_swa_random(SWA_QUARTERS, 0, 20000);
    test_swa_random(SWA_QUARTERS, 1, 20000);
    return check_done("kv");
}
