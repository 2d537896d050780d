/* test_cuda_plan: the CUDA backend's host-side arithmetic (core/cuda_plan.c), which needs no
 * GPU: the staging layout, batch packing (checked against page tables of a real KV pool
 * in external-data mode), the attention geometry, graph keys and their LRU cache, and
 * the KV sizing. Also the external-data mode of mm/kv itself: no host block data, and
 * copy-on-write through its kv_ext copy (units are blocks without kv8). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda_plan.h"
#include "mm/kv.h"
#include "tests/unit/check.h"

#define BS 16
static const kv_config CFG = {
    .n_layers = 2, .n_kv_heads = 3, .head_dim = 64, .block_size = BS,
    .n_blocks = 64, .max_seqs = 8, .max_blocks_per_seq = 12, .external_data = 1,
};

/* ---------------------------------------------------------------- helpers */

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint32_t rnd(uint32_t n) { /* xorshift64*, fixed seed */
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32) % n;
}

/* kv_ext copy calls, recorded in order. */
#define MAX_COPIES 16
static struct {
    int n;
    int32_t dst[MAX_COPIES], src[MAX_COPIES];
} copies;

static void record_copy(void *ctx, int32_t dst, int32_t src, int n) {
    CHECK(ctx == &copies && n == 1, "copy got ctx %p, %d units", ctx, n);
    if (copies.n < MAX_COPIES) copies.dst[copies.n] = dst, copies.src[copies.n] = src;
    copies.n++;
}

static int pool_open(kv_pool *p) {
    int r = kv_pool_init(p, &CFG, NULL);
    CHECK(r == 0, "kv_pool_init (external data): %d", r);
    p->ext = (kv_ext){.ctx = &copies, .copy = record_copy};
    copies.n = 0;
    return r;
}

static void check_pool(const kv_pool *p, const char *when) {
    char err[200] = "";
    int rc = kv_check(p, err, sizeof err);
    CHECK(rc == 0, "kv_check %s: %s", when, err);
}

/* ---------------------------------------------------------------- layout */

typedef struct {
    size_t off, len;
    const char *name;
} span;

static void check_layout(int max_tokens, int max_logits, int tstride) {
    cplan_layout L;
    CHECK(cplan_layout_init(&L, max_tokens, max_logits, tstride) == 0, "layout %d/%d/%d",
          max_tokens, max_logits, tstride);
    size_t T = (size_t)max_tokens;
    span s[] = {
        {L.tokens, T, "tokens"},       {L.pos, T, "pos"},
        {L.slot, T, "slot"},           {L.tiles, 3 * T, "tiles"},
        {L.rows, (size_t)max_logits, "rows"}, {L.tables, T * (size_t)tstride, "tables"},
    };
    int n = (int)(sizeof s / sizeof s[0]);
    size_t sum = 0;
    for (int i = 0; i < n; i++) {
        sum += s[i].len;
        CHECK(s[i].off + s[i].len <= L.total, "%s [%zu,+%zu) past total %zu", s[i].name, s[i].off,
              s[i].len, L.total);
        for (int j = i + 1; j < n; j++)
            CHECK(s[i].off + s[i].len <= s[j].off || s[j].off + s[j].len <= s[i].off,
                  "%s [%zu,+%zu) overlaps %s [%zu,+%zu)", s[i].name, s[i].off, s[i].len, s[j].name,
                  s[j].off, s[j].len);
    }
    CHECK(L.total == sum, "total %zu, regions %zu: no waste expected", L.total, sum);
    CHECK(L.max_tokens == max_tokens && L.max_logits == max_logits && L.tstride == tstride,
          "limits kept");
}

static void test_layout(void) {
    check_layout(1, 1, 1);
    check_layout(1, 0, 1);
    check_layout(7, 3, 5);
    check_layout(512, 64, 128);
    check_layout(8192, 256, 2048);
    cplan_layout L;
    CHECK(cplan_layout_init(&L, 0, 1, 1) == -EINVAL, "max_tokens 0");
    CHECK(cplan_layout_init(&L, 4, -1, 1) == -EINVAL, "max_logits -1");
    CHECK(cplan_layout_init(&L, 4, 1, 0) == -EINVAL, "tstride 0");
}

/* ---------------------------------------------------------------- pack */

#define MAXT 256
typedef struct {
    int32_t tokens[MAXT], pos[MAXT], rows[MAXT];
    kv_seq *seq[MAXT];
    model_batch b;
} batch_buf;

static void batch_reset(batch_buf *bb) {
    memset(bb, 0, sizeof *bb);
    bb->b.tokens = bb->tokens, bb->b.pos = bb->pos, bb->b.seq = bb->seq;
    bb->b.logit_rows = bb->rows;
}

/* Appends positions [p0, p0+n) of s, token ids derived from (seq, pos). */
static void batch_run(batch_buf *bb, kv_seq *s, int p0, int n) {
    for (int i = 0; i < n && bb->b.n_tokens < MAXT; i++) {
        int t = bb->b.n_tokens++;
        bb->tokens[t] = 1000 * s->id + p0 + i, bb->pos[t] = p0 + i, bb->seq[t] = s;
    }
}

static void batch_logit(batch_buf *bb, int row) { bb->rows[bb->b.n_logits++] = row; }

/* The pool's loc while a kv8 pool's batches are packed (its blocks' first units), else
 * NULL: ids are units. */
static const int32_t *g_loc;
static int32_t unit_of(int32_t b) { return g_loc ? g_loc[b] : b; }

/* Everything cplan_pack promises about a packed step, from the batch alone. */
static void verify_pack(const cplan_layout *L, const model_batch *b, int qt, const int32_t *st,
                        const cplan_step *sp, const char *what) {
    int T = b->n_tokens, bad = 0;
    for (int t = 0; t < T && !bad; t++) {
        const kv_seq *s = b->seq[t];
        int p = b->pos[t];
        int32_t want = unit_of(s->blocks[p / BS]) * BS + p % BS;
        bad = st[L->tokens + t] != b->tokens[t] || st[L->pos + t] != p || st[L->slot + t] != want;
        CHECK(!bad, "%s: token %d: tok %d pos %d slot %d, want %d %d %d", what, t,
              st[L->tokens + t], st[L->pos + t], st[L->slot + t], b->tokens[t], p, want);
    }
    /* Tiles cover the tokens in order, one sequence each, at most qt, and a tile's table
     * row holds its sequence's page-table prefix through the run's last position. */
    int next = 0, rows_seen = 0, prev_row = -1;
    CHECK(sp->n_tokens == T && sp->n_logits == b->n_logits, "%s: counts %d/%d", what,
          sp->n_tokens, sp->n_logits);
    for (int i = 0; i < sp->n_tiles; i++) {
        const int32_t *tl = st + L->tiles + 3 * i;
        int row = tl[0], t0 = tl[1], n = tl[2];
        if (!(t0 == next && n >= 1 && n <= qt && t0 + n <= T && row >= 0 && row < sp->n_rows)) {
            CHECK(0, "%s: tile %d = {row %d, first %d, n %d}, expected first %d, n in 1..%d", what,
                  i, row, t0, n, next, qt);
            return;
        }
        for (int t = t0 + 1; t < t0 + n; t++)
            CHECK(b->seq[t] == b->seq[t0], "%s: tile %d mixes sequences at token %d", what, i, t);
        CHECK(row == prev_row || row == prev_row + 1, "%s: tile %d row %d after row %d", what, i,
              row, prev_row);
        if (row != prev_row) {
            CHECK(t0 == 0 || b->seq[t0 - 1] != b->seq[t0], "%s: new row %d mid-run at token %d",
                  what, row, t0);
            rows_seen++;
        } else {
            CHECK(b->seq[t0 - 1] == b->seq[t0], "%s: tile %d shares row %d across sequences",
                  what, i, row);
        }
        prev_row = row;
        const kv_seq *s = b->seq[t0];
        int maxpos = 0;
        for (int t = t0; t < t0 + n; t++) maxpos = b->pos[t] > maxpos ? b->pos[t] : maxpos;
        const int32_t *tab = st + L->tables + (size_t)row * (size_t)L->tstride;
        for (int k = 0; k <= maxpos / BS; k++)
            CHECK(tab[k] == unit_of(s->blocks[k]), "%s: table row %d [%d] = %d, seq has %d at %d",
                  what, row, k, tab[k], s->blocks[k], unit_of(s->blocks[k]));
        next = t0 + n;
    }
    CHECK(next == T, "%s: tiles cover %d of %d tokens", what, next, T);
    CHECK(rows_seen == sp->n_rows, "%s: %d rows used, step says %d", what, rows_seen, sp->n_rows);
    CHECK(sp->upload == L->tables + (size_t)sp->n_rows * (size_t)L->tstride,
          "%s: upload %zu int32s", what, sp->upload);
    for (int i = 0; i < b->n_logits; i++)
        CHECK(st[L->rows + i] == b->logit_rows[i], "%s: logit row %d = %d, want %d", what, i,
              st[L->rows + i], b->logit_rows[i]);
}

static int pack(const cplan_layout *L, const model_batch *b, int qt, int32_t *st, cplan_step *sp,
                char *err, size_t n) {
    for (size_t i = 0; i < L->total; i++) st[i] = -7777; /* stale data must not leak through */
    return cplan_pack(L, b, g_loc, BS, qt, st, sp, err, n);
}

static void test_pack_fixed(kv_pool *p) {
    /* Interleaved reservations so page tables are not runs of consecutive blocks. */
    kv_seq *a = kv_seq_new(p), *b = kv_seq_new(p), *c = kv_seq_new(p);
    CHECK(a && b && c, "three sequences");
    if (!a || !b || !c) return;
    CHECK(kv_seq_reserve(p, a, 16) == 0 && kv_seq_reserve(p, c, 20) == 0 &&
              kv_seq_reserve(p, b, 5) == 0 && kv_seq_reserve(p, a, 40) == 0 &&
              kv_seq_reserve(p, c, 70) == 0,
          "reserve");
    cplan_layout L;
    cplan_layout_init(&L, 128, 8, CFG.max_blocks_per_seq);
    int32_t *st = malloc(L.total * sizeof *st);
    batch_buf bb;
    cplan_step sp;
    char err[160] = "";
    int qt = 21; /* head_dim 64, group 3 */

    batch_reset(&bb);
    batch_run(&bb, a, 39, 1); /* decode */
    batch_run(&bb, c, 0, 70); /* prefill: tiles of 21, 21, 21, 7 */
    batch_run(&bb, b, 2, 3);  /* a short chunk */
    batch_run(&bb, a, 38, 1); /* a again, a separate run: its own row */
    batch_logit(&bb, 0), batch_logit(&bb, 70), batch_logit(&bb, 73), batch_logit(&bb, 72);
    int r = pack(&L, &bb.b, qt, st, &sp, err, sizeof err);
    CHECK(r == 0, "pack: %s", err);
    if (r == 0) {
        verify_pack(&L, &bb.b, qt, st, &sp, "fixed");
        CHECK(sp.n_tiles == 1 + 4 + 1 + 1 && sp.n_rows == 4, "tiles %d rows %d", sp.n_tiles,
              sp.n_rows);
        CHECK(st[L.tiles + 3 * 4 + 2] == 7, "last prefill tile holds %d", st[L.tiles + 3 * 4 + 2]);
        /* the slot formula by hand for one token: c's position 37 */
        CHECK(st[L.slot + 1 + 37] == c->blocks[2] * BS + 5, "slot of c:37 = %d",
              st[L.slot + 1 + 37]);
    }
    /* qt 1: a tile per token (head_dim 256, group 16) */
    r = pack(&L, &bb.b, 1, st, &sp, err, sizeof err);
    CHECK(r == 0 && sp.n_tiles == bb.b.n_tokens, "qt 1: %d tiles for %d tokens", sp.n_tiles,
          bb.b.n_tokens);
    if (r == 0) verify_pack(&L, &bb.b, 1, st, &sp, "qt 1");

    /* errors */
    batch_reset(&bb);
    batch_run(&bb, b, 16, 1); /* b holds one block: positions 0..15 */
    err[0] = 0;
    CHECK(pack(&L, &bb.b, qt, st, &sp, err, sizeof err) == -EINVAL && err[0],
          "position without a block: '%s'", err);
    batch_reset(&bb);
    batch_run(&bb, a, -1, 1);
    CHECK(pack(&L, &bb.b, qt, st, &sp, err, sizeof err) == -EINVAL, "negative position");
    batch_reset(&bb);
    CHECK(pack(&L, &bb.b, qt, st, &sp, err, sizeof err) == -EINVAL, "empty batch");
    for (int i = 0; i < 3; i++) batch_run(&bb, c, 0, 50);
    CHECK(pack(&L, &bb.b, qt, st, &sp, err, sizeof err) == -EINVAL, "150 tokens > 128");
    batch_reset(&bb);
    batch_run(&bb, a, 0, 4);
    batch_logit(&bb, 4);
    CHECK(pack(&L, &bb.b, qt, st, &sp, err, sizeof err) == -EINVAL, "logit row = n_tokens");
    bb.rows[0] = -1;
    CHECK(pack(&L, &bb.b, qt, st, &sp, err, sizeof err) == -EINVAL, "logit row -1");
    bb.rows[0] = 3;
    for (int i = 0; i < 8; i++) batch_logit(&bb, 0);
    CHECK(pack(&L, &bb.b, qt, st, &sp, err, sizeof err) == -EINVAL, "9 logit rows > 8");
    bb.b.n_logits = 1;
    CHECK(pack(&L, &bb.b, qt, st, &sp, err, sizeof err) == 0, "the same batch, fixed: %s", err);
    CHECK(pack(&L, &bb.b, 0, st, &sp, err, sizeof err) == -EINVAL, "qt 0");
    CHECK(cplan_pack(&L, &bb.b, NULL, 0, qt, st, &sp, err, sizeof err) == -EINVAL, "block_size 0");
    /* a sequence longer than the layout's page-table row */
    cplan_layout small;
    cplan_layout_init(&small, 128, 8, 2);
    int32_t *st2 = malloc(small.total * sizeof *st2);
    batch_reset(&bb);
    batch_run(&bb, c, 40, 1); /* block 2: needs a row of 3 */
    CHECK(st2 && cplan_pack(&small, &bb.b, NULL, BS, qt, st2, &sp, err, sizeof err) == -EINVAL,
          "row longer than tstride");
    free(st2);
    free(st);
    kv_seq_release(p, a), kv_seq_release(p, b), kv_seq_release(p, c);
}

/* Random batches over sequences of random lengths: every packing verified. */
static void test_pack_random(kv_pool *p) {
    cplan_layout L;
    cplan_layout_init(&L, MAXT, 32, CFG.max_blocks_per_seq);
    int32_t *st = malloc(L.total * sizeof *st);
    kv_seq *s[6];
    int len[6];
    for (int i = 0; i < 6; i++) {
        s[i] = kv_seq_new(p);
        len[i] = 1 + (int)rnd(CFG.max_blocks_per_seq * BS / 2);
        CHECK(s[i] && kv_seq_reserve(p, s[i], len[i]) == 0, "seq %d of %d", i, len[i]);
    }
    for (int trial = 0; trial < 300 && st; trial++) {
        batch_buf bb;
        batch_reset(&bb);
        int runs = 1 + (int)rnd(8);
        for (int r = 0; r < runs; r++) {
            int i = (int)rnd(6), n = 1 + (int)rnd((uint32_t)len[i]);
            if (rnd(2)) n = 1; /* decode-like */
            batch_run(&bb, s[i], len[i] - n, n);
        }
        for (int i = 0; i < 4; i++) batch_logit(&bb, (int)rnd((uint32_t)bb.b.n_tokens));
        int qt = 1 + (int)rnd(24);
        cplan_step sp;
        char err[160] = "";
        int r = pack(&L, &bb.b, qt, st, &sp, err, sizeof err);
        CHECK(r == 0, "random batch %d: %s", trial, err);
        char what[32];
        snprintf(what, sizeof what, "random %d", trial);
        if (r == 0) verify_pack(&L, &bb.b, qt, st, &sp, what);
    }
    for (int i = 0; i < 6; i++) kv_seq_release(p, s[i]);
    free(st);
}

/* ---------------------------------------------------------------- attention geometry */

static void check_geom(int hd, int g, int kt, int qt) {
    cplan_attn a;
    int r = cplan_attn_geom(hd, g, &a);
    CHECK(r == 0, "geom %d/%d: %d", hd, g, r);
    if (r) return;
    CHECK(a.kt == kt && a.qt == qt, "geom %d/%d: kt %d qt %d, want %d %d", hd, g, a.kt, a.qt, kt,
          qt);
    /* k_attn: a lane per key of a tile, at most 8 pairs per warp, one block of threads */
    CHECK(a.kt >= 1 && a.kt <= 32, "geom %d/%d: kt %d", hd, g, a.kt);
    CHECK(a.qt >= 1 && a.qt * g <= a.pairs_max &&
              a.pairs_max <= CPLAN_ATT_WARPS * CPLAN_ATT_PAIRS_WARP,
          "geom %d/%d: qt %d pairs_max %d", hd, g, a.qt, a.pairs_max);
    CHECK(a.threads == 32 * CPLAN_ATT_WARPS, "geom %d/%d: threads %d", hd, g, a.threads);
    size_t want = (size_t)(2 * a.kt * (hd + 1) + a.qt * g * hd) * sizeof(float);
    CHECK(a.smem == want && a.smem <= 96 * 1024, "geom %d/%d: smem %zu, want %zu (<= 96 KiB)", hd,
          g, a.smem, want);
}

static void test_geom(void) {
    check_geom(64, 3, 32, 21);   /* SmolLM2 */
    check_geom(128, 4, 16, 8);   /* Llama-3 8B */
    check_geom(128, 8, 16, 4);
    check_geom(256, 16, 8, 1);
    check_geom(64, 1, 32, 64);
    cplan_attn a;
    CHECK(cplan_attn_geom(0, 3, &a) == -EINVAL, "head_dim 0");
    CHECK(cplan_attn_geom(512, 3, &a) == -EINVAL, "head_dim 512");
    CHECK(cplan_attn_geom(257, 1, &a) == -EINVAL, "head_dim 257");
    CHECK(cplan_attn_geom(60, 1, &a) == -EINVAL, "head_dim 60: k_attn moves 8-element pieces");
    CHECK(cplan_attn_geom(4, 1, &a) == -EINVAL, "head_dim 4");
    CHECK(cplan_attn_geom(64, 0, &a) == -EINVAL, "group 0");
    CHECK(cplan_attn_geom(256, 17, &a) == -EINVAL, "group 17 at head_dim 256");
}

/* ---------------------------------------------------------------- graphs */

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void test_graph_keys(void) {
    static const int toks[] = {1, 2, 3, 8, 64, 512, 4096, (1 << 20) - 1};
    static const int tiles[] = {0, 1, 2, 7, 64, 4096};
    static const int logits[] = {0, 1, 2, 64, 512};
    enum { NT = 8, NI = 6, NL = 5, NP = 3 };
    static uint64_t keys[NT * NI * NL * NP];
    int n = 0, zero = 0;
    for (int a = 0; a < NT; a++)
        for (int b = 0; b < NI; b++)
            for (int c = 0; c < NL; c++)
                for (int path = 0; path < NP; path++) {
                    cplan_step s = {.n_tokens = toks[a], .n_tiles = tiles[b], .n_logits = logits[c]};
                    keys[n] = cplan_graph_key(&s, path);
                    zero += keys[n] == 0;
                    n++;
                }
    CHECK(zero == 0, "%d keys are 0", zero);
    qsort(keys, (size_t)n, sizeof keys[0], cmp_u64);
    int dup = 0;
    for (int i = 1; i < n; i++) dup += keys[i] == keys[i - 1];
    CHECK(dup == 0, "%d duplicate keys among %d", dup, n);
    cplan_step empty = {0};
    CHECK(cplan_graph_key(&empty, 0) != 0, "key of an empty step");
    /* only the counts and the path matter */
    cplan_step x = {.n_tokens = 8, .n_tiles = 8, .n_logits = 8, .n_rows = 3, .upload = 99};
    cplan_step y = {.n_tokens = 8, .n_tiles = 8, .n_logits = 8, .n_rows = 8, .upload = 7};
    CHECK(cplan_graph_key(&x, 1) == cplan_graph_key(&y, 1), "rows and upload are not in the key");

    cplan_step dec = {.n_tokens = 8, .n_tiles = 8, .n_logits = 8};
    cplan_step pre = {.n_tokens = 8, .n_tiles = 1, .n_logits = 1};
    CHECK(cplan_graph_wanted(&dec, 64) == 1, "decode step of 8 wanted");
    CHECK(cplan_graph_wanted(&dec, 8) == 1, "at the limit");
    CHECK(cplan_graph_wanted(&dec, 7) == 0, "past the limit");
    CHECK(cplan_graph_wanted(&pre, 64) == 0, "prefill not wanted");
}

static void test_graph_lru(void) {
    cplan_graphs g;
    memset(&g, 0, sizeof g);
    int slot[CPLAN_GRAPHS + 1], ev = -1, seen[CPLAN_GRAPHS] = {0};
    CHECK(cplan_graph_find(&g, 5) == -1, "empty cache");
    for (int i = 0; i < CPLAN_GRAPHS; i++) {
        slot[i] = cplan_graph_put(&g, 100 + (uint64_t)i, &ev);
        CHECK(slot[i] >= 0 && slot[i] < CPLAN_GRAPHS && ev == 0, "put %d: slot %d evicted %d", i,
              slot[i], ev);
        if (slot[i] >= 0 && slot[i] < CPLAN_GRAPHS) seen[slot[i]]++;
    }
    for (int i = 0; i < CPLAN_GRAPHS; i++) CHECK(seen[i] == 1, "slot %d used %d times", i, seen[i]);
    for (int i = 0; i < CPLAN_GRAPHS; i++)
        CHECK(cplan_graph_find(&g, 100 + (uint64_t)i) == slot[i], "find %d", i);
    CHECK(cplan_graph_find(&g, 99) == -1, "missing key");
    /* ages now follow the finds above (0 oldest); refresh 0 and 1: 2 is the oldest */
    cplan_graph_find(&g, 100), cplan_graph_find(&g, 101);
    slot[CPLAN_GRAPHS] = cplan_graph_put(&g, 999, &ev);
    CHECK(ev == 1 && slot[CPLAN_GRAPHS] == slot[2], "33rd put: slot %d (evicted %d), want slot %d",
          slot[CPLAN_GRAPHS], ev, slot[2]);
    CHECK(cplan_graph_find(&g, 102) == -1, "LRU key gone");
    CHECK(cplan_graph_find(&g, 100) == slot[0] && cplan_graph_find(&g, 101) == slot[1],
          "refreshed keys kept");
    CHECK(cplan_graph_find(&g, 999) == slot[2], "new key found");
    int s2 = cplan_graph_put(&g, 1000, &ev);
    CHECK(ev == 1 && s2 == slot[3], "next eviction: slot %d, want %d", s2, slot[3]);
}

/* ---------------------------------------------------------------- KV sizing */

static void test_kv_blocks(void) {
    const size_t G = 1ull << 30, M = 1ull << 20;
    /* 80 GiB, 1 GiB used by others; 0.75 of it (exact in binary): 60 - 1 - 1 (weights)
     * - 0.5 (scratch) = 57.5 GiB */
    long n = cplan_kv_blocks(80 * G, 79 * G, 0.75, G, G / 2, M, 0);
    CHECK(n == (long)((60 * G - G - G - G / 2) / M), "blocks %ld", n);
    CHECK(cplan_kv_blocks(80 * G, 79 * G, 0.75, G, G / 2, M, 1000) == 1000, "max cap");
    CHECK(cplan_kv_blocks(80 * G, 79 * G, 0.75, G, G / 2, M, 1000000) == n, "cap above the budget");
    CHECK(cplan_kv_blocks(80 * G, 10 * G, 0.75, G, G / 2, M, 0) == 0, "others hold too much");
    CHECK(cplan_kv_blocks(80 * G, 79 * G, 0.75, 70 * G, G, M, 0) == 0, "weights fill the budget");
    CHECK(cplan_kv_blocks(8 * M, 8 * M, 1.0, 2 * M, 5 * M + 1, M, 0) == 0,
          "less than one block left");
    CHECK(cplan_kv_blocks(8 * M, 8 * M, 1.0, 2 * M, 5 * M, M, 0) == 1, "exactly one block");
    CHECK(cplan_kv_blocks(80 * G, 79 * G, 0.0, 0, 0, M, 0) == 0, "util 0");
    CHECK(cplan_kv_blocks(80 * G, 79 * G, -0.5, 0, 0, M, 0) == 0, "util < 0");
    CHECK(cplan_kv_blocks(80 * G, 79 * G, 1.5, 0, 0, M, 0) == 0, "util > 1");
    CHECK(cplan_kv_blocks(80 * G, 81 * G, 0.9, 0, 0, M, 0) == 0, "free > total");
    CHECK(cplan_kv_blocks(80 * G, 79 * G, 0.9, 0, 0, 0, 0) == 0, "block of 0 bytes");
}

/* ---------------------------------------------------------------- kv8 on the device */

/* The device's side of a kv8 pool, counted: the pool decides, packing must follow. */
static struct {
    int copy, to_q8, expand;
} dev_calls;
static void dev_copy(void *ctx, int32_t dst, int32_t src, int n) {
    (void)ctx, (void)dst, (void)src, (void)n;
    dev_calls.copy++;
}
static void dev_to_q8(void *ctx, int32_t u) {
    (void)ctx;
    CHECK(u % 2 == 0, "an f16 block starts a slot: unit %d", u);
    dev_calls.to_q8++;
}
static void dev_expand(void *ctx, int32_t dst, int32_t src) {
    (void)ctx, (void)src;
    CHECK(dst % 2 == 0, "an f16 copy starts a slot: unit %d", dst);
    dev_calls.expand++;
}

/* A kv8 pool with external data: 8-bit blocks in half slots, some moved by compaction
 * (second halves, odd units). Packing names every page and cache slot by the block's
 * first unit, never by its id. */
static void test_pack_units(void) {
    kv_config c = CFG;
    c.kv8 = 1;
    kv_pool p;
    CHECK(kv_pool_init(&p, &c, NULL) == 0 && p.units == 2 && p.n_ids == 2 * c.n_blocks,
          "kv8 external pool: %d units a slot", p.units);
    p.ext = (kv_ext){NULL, dev_copy, dev_to_q8, dev_expand};
    kv_seq *s[8];
    int len[8];
    for (int i = 0; i < 8; i++) { /* 8 x 8 blocks: every slot */
        s[i] = kv_seq_new(&p);
        len[i] = 8 * BS;
        CHECK(s[i] && kv_seq_reserve(&p, s[i], len[i]) == 0, "seq %d", i);
        if (!s[i]) return;
        CHECK(kv_seq_to_q8(&p, s[i], len[i], 100) == 8, "seq %d's 8 blocks to 8 bits", i);
    }
    kv_seq_release(&p, s[7]); /* 8 slots free again; 12 blocks need 4 joined from halves */
    s[7] = kv_seq_new(&p);
    len[7] = 12 * BS;
    CHECK(s[7] && kv_seq_reserve(&p, s[7], len[7]) == 0, "12 f16 blocks");
    CHECK(p.stats.q8_moves >= 4 && dev_calls.copy == (int)p.stats.q8_moves &&
              dev_calls.to_q8 == 64, "moves %llu, device copies %d, conversions %d",
          (unsigned long long)p.stats.q8_moves, dev_calls.copy, dev_calls.to_q8);
    check_pool(&p, "kv8 compacted");
    g_loc = p.loc;
    int odd = 0;
    for (int i = 0; i < 8; i++)
        for (int k = 0; k < s[i]->n_blocks; k++) odd += p.loc[s[i]->blocks[k]] % 2;
    CHECK(odd > 0, "some 8-bit blocks live in second halves: %d", odd);
    cplan_layout L;
    cplan_layout_init(&L, MAXT, 32, CFG.max_blocks_per_seq);
    int32_t *st = malloc(L.total * sizeof *st);
    for (int trial = 0; trial < 200 && st; trial++) {
        batch_buf bb;
        batch_reset(&bb);
        for (int r = 1 + (int)rnd(8); r > 0; r--) {
            int i = (int)rnd(8), n = rnd(2) ? 1 : 1 + (int)rnd((uint32_t)len[i]);
            batch_run(&bb, s[i], len[i] - n, n);
        }
        batch_logit(&bb, bb.b.n_tokens - 1);
        cplan_step sp;
        char err[160] = "", what[32];
        int qt = 1 + (int)rnd(24), r = pack(&L, &bb.b, qt, st, &sp, err, sizeof err);
        snprintf(what, sizeof what, "units %d", trial);
        CHECK(r == 0, "%s: %s", what, err);
        if (r == 0) verify_pack(&L, &bb.b, qt, st, &sp, what);
    }
    free(st);
    g_loc = NULL;
    for (int i = 0; i < 8; i++) kv_seq_release(&p, s[i]);
    check_pool(&p, "kv8 released");
    CHECK(kv_free_blocks(&p) == c.n_blocks, "all back: %d", kv_free_blocks(&p));
    kv_pool_free(&p);
}

/* ---------------------------------------------------------------- kv external data */

static void test_kv_external(void) {
    kv_config host = CFG;
    host.external_data = 0;
    CHECK(kv_pool_bytes(&CFG) + (size_t)CFG.n_blocks * kv_block_bytes(&CFG) <=
              kv_pool_bytes(&host),
          "external: %zu bytes, host data: %zu", kv_pool_bytes(&CFG), kv_pool_bytes(&host));
    kv_pool p;
    if (pool_open(&p) != 0) return;
    CHECK(p.data == NULL, "no host data");
    kv_seq *a = kv_seq_new(&p);
    CHECK(a && kv_seq_reserve(&p, a, 40) == 0, "reserve 3 blocks");
    if (!a) return;
    CHECK(kv_seq_cow(&p, a, 5) == 0 && copies.n == 0, "private block: %d copies", copies.n);
    kv_seq *b = kv_seq_fork(&p, a);
    CHECK(b != NULL, "fork");
    if (!b) return;
    int32_t old = a->blocks[1];
    CHECK(kv_seq_cow(&p, b, 20) == 0, "cow shared");
    CHECK(copies.n == 1 && copies.dst[0] == b->blocks[1] && copies.src[0] == old &&
              b->blocks[1] != old,
          "one copy (%d): dst %d src %d, want dst %d src %d", copies.n, copies.dst[0],
          copies.src[0], b->blocks[1], old);
    CHECK(kv_refcount(&p, old) == 1 && kv_refcount(&p, b->blocks[1]) == 1, "refs after cow");
    check_pool(&p, "after cow");
    CHECK(kv_seq_cow(&p, b, 21) == 0 && copies.n == 1, "b's copy is private: %d", copies.n);
    CHECK(kv_seq_cow(&p, a, 20) == 0 && copies.n == 1, "a's block is private again: %d",
          copies.n);
    old = a->blocks[2];
    CHECK(kv_seq_cow(&p, a, 35) == 0 && copies.n == 2 && copies.src[1] == old &&
              copies.dst[1] == a->blocks[2] && b->blocks[2] == old,
          "the other holder copies too: %d copies, src %d dst %d", copies.n, copies.src[1],
          copies.dst[1]);
    check_pool(&p, "after second cow");
    kv_seq_release(&p, a), kv_seq_release(&p, b);
    CHECK(kv_free_blocks(&p) == CFG.n_blocks && copies.n == 2, "all back");
    check_pool(&p, "released");
    kv_pool_free(&p);
}

int main(void) {
    test_layout();
    kv_pool p;
    if (pool_open(&p) == 0) {
        test_pack_fixed(&p);
        test_pack_random(&p);
        check_pool(&p, "after packing");
        CHECK(copies.n == 0, "packing copied %d blocks", copies.n);
        kv_pool_free(&p);
    }
    test_geom();
    test_graph_keys();
    test_graph_lru();
    test_kv_blocks();
    test_kv_external();
    test_pack_units();
    CHECK(cplan_mem_pressure(1000, 256) == 0.0 && cplan_mem_pressure(256, 256) == 0.0 &&
              cplan_mem_pressure(192, 256) == 0.25 && cplan_mem_pressure(0, 256) == 1.0 &&
              cplan_mem_pressure(0, 0) == 0.0,
          "device memory pressure: 0 with the headroom free, linear to 1 with none");
    return check_done("test_cuda_plan");
}
