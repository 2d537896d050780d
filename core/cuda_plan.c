/* cuda_plan: the CUDA backend's host-side arithmetic (see cuda_plan.h). */
#include "core/cuda_plan.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "mm/kv.h"

int cplan_layout_init(cplan_layout *L, int max_tokens, int max_logits, int tstride) {
    memset(L, 0, sizeof *L);
    if (max_tokens < 1 || max_logits < 0 || tstride < 1) return -EINVAL;
    size_t T = (size_t)max_tokens, off = 0;
    L->tokens = off, off += T;
    L->pos = off, off += T;
    L->slot = off, off += T;
    L->tiles = off, off += 3 * T; /* at most one tile per token */
    L->rows = off, off += (size_t)max_logits;
    L->tables = off, off += T * (size_t)tstride; /* at most one run per token */
    L->total = off;
    L->max_tokens = max_tokens, L->max_logits = max_logits, L->tstride = tstride;
    return 0;
}

static int fail(char *err, size_t n, const char *msg, int a, int b) {
    if (err && n) snprintf(err, n, msg, a, b);
    return -EINVAL;
}

int cplan_pack(const cplan_layout *L, const model_batch *b, const int32_t *loc, int block_size,
               int qt, int32_t *stage, cplan_step *out, char *err, size_t errlen) {
    int T = b->n_tokens;
    memset(out, 0, sizeof *out);
    if (T < 1 || T > L->max_tokens || b->n_logits < 0 || b->n_logits > L->max_logits || qt < 1 ||
        block_size < 1)
        return fail(err, errlen, "cuda: batch of %d tokens / %d logits does not fit the step limits",
                    T, b->n_logits);
    int32_t *tiles = stage + L->tiles;
    int n_tiles = 0, n_rows = 0;
    for (int t = 0; t < T;) {
        const kv_seq *s = b->seq[t];
        int run = 1, maxpos = b->pos[t];
        while (t + run < T && b->seq[t + run] == s) maxpos = b->pos[t + run] > maxpos ? b->pos[t + run] : maxpos, run++;
        for (int i = 0; i < run; i++) /* before any size is derived from them */
            if (b->pos[t + i] < 0)
                return fail(err, errlen, "cuda: negative position %d at token %d", b->pos[t + i], t + i);
        int need = maxpos / block_size + 1;
        if (need > s->n_blocks || need > L->tstride)
            return fail(err, errlen, "cuda: position %d has no KV block reserved (%d blocks)", maxpos,
                        s->n_blocks);
        int32_t *row = stage + L->tables + (size_t)n_rows * (size_t)L->tstride;
        for (int i = 0; i < need; i++) {
            row[i] = loc && s->blocks[i] >= 0 ? loc[s->blocks[i]] : s->blocks[i];
            if (row[i] < 0) /* a hole, or a block holding no memory */
                return fail(err, errlen, "cuda: page %d of a sequence has no KV block (%d)", i, row[i]);
        }
        for (int i = 0; i < run; i++) {
            int p = b->pos[t + i];
            stage[L->tokens + t + i] = b->tokens[t + i];
            stage[L->pos + t + i] = p;
            stage[L->slot + t + i] = row[p / block_size] * block_size + p % block_size;
        }
        for (int i = 0; i < run; i += qt) {
            tiles[3 * n_tiles] = n_rows;
            tiles[3 * n_tiles + 1] = t + i;
            tiles[3 * n_tiles + 2] = run - i < qt ? run - i : qt;
            n_tiles++;
        }
        n_rows++;
        t += run;
    }
    for (int i = 0; i < b->n_logits; i++) {
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= T)
            return fail(err, errlen, "cuda: logit row %d out of range (%d tokens)", b->logit_rows[i], T);
        stage[L->rows + i] = b->logit_rows[i];
    }
    out->n_tokens = T, out->n_tiles = n_tiles, out->n_logits = b->n_logits, out->n_rows = n_rows;
    out->upload = L->tables + (size_t)n_rows * (size_t)L->tstride;
    return 0;
}

int cplan_attn_geom(int head_dim, int group, cplan_attn *a) {
    memset(a, 0, sizeof *a);
    int pairs_cap = CPLAN_ATT_WARPS * CPLAN_ATT_PAIRS_WARP;
    /* k_attn moves K and V in 8-element (16-byte) pieces */
    if (head_dim < 8 || head_dim % 8 || head_dim > CPLAN_ATT_MAX_HD || group < 1) return -EINVAL;
    a->kt = 2048 / head_dim < 32 ? 2048 / head_dim : 32;
    a->pairs_max = 4096 / head_dim < pairs_cap ? 4096 / head_dim : pairs_cap;
    if (group > a->pairs_max) return -EINVAL;
    a->qt = a->pairs_max / group;
    a->threads = 32 * CPLAN_ATT_WARPS;
    a->smem = (size_t)(2 * a->kt * (head_dim + 1) + a->qt * group * head_dim) * sizeof(float);
    return 0;
}

uint64_t cplan_graph_key(const cplan_step *s, int gemm_path) {
    /* 20 bits each for the counts (steps stay far below a million tokens: cplan_graph_wanted
     * admits only small ones), 4 for the path; never 0, which marks an empty slot. */
    uint64_t k = (uint64_t)(s->n_tokens & 0xFFFFF) << 44 | (uint64_t)(s->n_tiles & 0xFFFFF) << 24 |
                 (uint64_t)(s->n_logits & 0xFFFFF) << 4 | (uint64_t)(gemm_path & 0xF);
    return k + 1 ? k + 1 : 1;
}

int cplan_graph_wanted(const cplan_step *s, int max_tokens) {
    return s->n_tokens <= max_tokens && s->n_tiles == s->n_tokens; /* decode: a token per tile */
}

int cplan_graph_find(cplan_graphs *g, uint64_t key) {
    for (int i = 0; i < CPLAN_GRAPHS; i++)
        if (g->key[i] == key) {
            g->used[i] = ++g->clock;
            return i;
        }
    return -1;
}

int cplan_graph_put(cplan_graphs *g, uint64_t key, int *evicted) {
    int best = 0;
    for (int i = 0; i < CPLAN_GRAPHS; i++) {
        if (!g->key[i]) {
            best = i;
            break;
        }
        if (g->used[i] < g->used[best]) best = i;
    }
    *evicted = g->key[best] != 0;
    g->key[best] = key;
    g->used[best] = ++g->clock;
    return best;
}

long cplan_kv_blocks(size_t total, size_t free_now, double util, size_t weights, size_t scratch,
                     size_t block_bytes, long max_blocks) {
    if (!block_bytes || free_now > total || util <= 0.0 || util > 1.0) return 0;
    double budget = (double)total * util - (double)(total - free_now) - (double)weights - (double)scratch;
    if (budget < (double)block_bytes) return 0;
    double n = budget / (double)block_bytes;
    long blocks = n > 2e9 ? 2000000000L : (long)n;
    return max_blocks > 0 && blocks > max_blocks ? max_blocks : blocks;
}

double cplan_mem_pressure(size_t free_now, size_t headroom) {
    if (headroom == 0 || free_now >= headroom) return 0.0;
    return 1.0 - (double)free_now / (double)headroom;
}
