/* kv: the KV block pool (see kv.h). */
#include "mm/kv.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- sizes */

static int cfg_valid(const kv_config *c) {
    return c->n_layers > 0 && c->n_kv_heads > 0 && c->head_dim > 0 && c->block_size > 0 &&
           c->n_blocks > 0 && c->max_seqs > 0 && c->max_blocks_per_seq > 0;
}

/* f16 elements of one block; 0 on overflow. */
static size_t block_elems(const kv_config *c) {
    size_t n = 2;
    if (__builtin_mul_overflow(n, (size_t)c->n_layers, &n) ||
        __builtin_mul_overflow(n, (size_t)c->n_kv_heads, &n) ||
        __builtin_mul_overflow(n, (size_t)c->block_size, &n) ||
        __builtin_mul_overflow(n, (size_t)c->head_dim, &n) || n > SIZE_MAX / 2)
        return 0;
    return n;
}

size_t kv_block_bytes(const kv_config *cfg) {
    if (!cfg_valid(cfg)) return 0;
    return block_elems(cfg) * sizeof(uint16_t);
}

/* Blocks needed for positions [0, n): ceil without overflowing n + block_size. */
static int blocks_for(const kv_pool *p, int n) {
    int bs = p->cfg.block_size;
    return n / bs + (n % bs != 0);
}

/* Byte offsets of every array inside the one allocation; the data comes first so it
 * gets the allocation's page alignment. Returns the total, 0 on overflow. */
typedef struct {
    size_t data, refcount, free_ids, scratch, hash, seqs, tables, total;
} kv_layout;

static size_t align_up(size_t x, size_t a) { return (x + a - 1) & ~(a - 1); }

static size_t layout_of(const kv_config *c, kv_layout *l) {
    size_t nb = (size_t)c->n_blocks, ms = (size_t)c->max_seqs, data, tables;
    size_t be = block_elems(c);
    if (be == 0 || __builtin_mul_overflow(nb, be * sizeof(uint16_t), &data) ||
        __builtin_mul_overflow(ms, (size_t)c->max_blocks_per_seq * sizeof(int32_t), &tables) ||
        data > SIZE_MAX / 2 || tables > SIZE_MAX / 4 || nb > SIZE_MAX / 64 || ms > SIZE_MAX / 64)
        return 0;
    size_t off = 0;
    l->data = off, off = align_up(off + data, 64);
    l->refcount = off, off = align_up(off + nb * sizeof(int32_t), 64);
    l->free_ids = off, off = align_up(off + nb * sizeof(int32_t), 64);
    l->scratch = off, off = align_up(off + nb * sizeof(int32_t), 64);
    l->hash = off, off = align_up(off + nb * sizeof(uint64_t), 64);
    l->seqs = off, off = align_up(off + ms * sizeof(kv_seq), 64);
    l->tables = off, off = align_up(off + tables, 64);
    if (off > SIZE_MAX / 2) return 0;
    l->total = off;
    return off;
}

size_t kv_pool_bytes(const kv_config *cfg) {
    kv_layout l;
    if (!cfg_valid(cfg) || layout_of(cfg, &l) == 0) return 0;
    return align_up(l.total, 4096) + 4096; /* slack for the arena's alignment of the base */
}

/* ---------------------------------------------------------------- init / free */

int kv_pool_init(kv_pool *p, const kv_config *cfg, mm_pool *arena) {
    memset(p, 0, sizeof *p);
    if (!cfg_valid(cfg)) return -EINVAL;
    kv_layout l;
    if (layout_of(cfg, &l) == 0) return -E2BIG;

    unsigned char *mem;
    if (arena) {
        mem = mm_pool_alloc(arena, l.total, 4096);
        if (!mem) return -ENOMEM;
    } else {
        size_t bytes = align_up(l.total, 4096);
        mem = aligned_alloc(4096, bytes);
        if (!mem) return -ENOMEM;
        memset(mem, 0, bytes); /* touch it now, at boot, not on the first request */
        p->mem = mem;
        p->mem_bytes = bytes;
    }
    p->cfg = *cfg;
    p->block_elems = block_elems(cfg);
    p->head_elems = (size_t)cfg->block_size * (size_t)cfg->head_dim;
    p->data = (uint16_t *)(mem + l.data);
    p->refcount = (int32_t *)(mem + l.refcount);
    p->free_ids = (int32_t *)(mem + l.free_ids);
    p->scratch = (int32_t *)(mem + l.scratch);
    p->hash = (uint64_t *)(mem + l.hash);
    p->seqs = (kv_seq *)(mem + l.seqs);
    p->tables = (int32_t *)(mem + l.tables);
    /* An arena need not hand out zeroed memory (cuMemHostAlloc); the metadata must be. */
    memset(mem + l.refcount, 0, l.total - l.refcount);

    /* Pushed high to low so block 0 is handed out first: deterministic for tests. */
    for (int i = cfg->n_blocks - 1; i >= 0; i--) p->free_ids[p->n_free++] = i;
    for (int i = 0; i < cfg->max_seqs; i++) {
        p->seqs[i].blocks = p->tables + (size_t)i * (size_t)cfg->max_blocks_per_seq;
        p->seqs[i].id = i;
    }
    return 0;
}

void kv_pool_free(kv_pool *p) {
    free(p->mem); /* arena memory goes with the arena */
    memset(p, 0, sizeof *p);
}

/* ---------------------------------------------------------------- blocks */

static int fail_hook_fires(kv_pool *p) {
    if (p->fail_n <= 0) return 0;
    if (--p->fail_n > 0) return 0;
    if (p->fail_sticky) p->fail_n = 1;
    return 1;
}

/* A fresh block at refcount 1, or -1 when the pool is empty (or the hook fires). */
static int32_t block_get(kv_pool *p) {
    if (fail_hook_fires(p) || p->n_free == 0) return -1;
    int32_t b = p->free_ids[--p->n_free];
    assert(p->refcount[b] == 0);
    p->refcount[b] = 1;
    p->hash[b] = 0;
    return b;
}

static void block_put(kv_pool *p, int32_t b) {
    assert(b >= 0 && b < p->cfg.n_blocks && p->refcount[b] > 0);
    if (--p->refcount[b] == 0) p->free_ids[p->n_free++] = b;
}

int kv_free_blocks(const kv_pool *p) { return p->n_free; }

int kv_refcount(const kv_pool *p, int32_t block) {
    if (block < 0 || block >= p->cfg.n_blocks) return -1;
    return p->refcount[block];
}

void kv_fail_after(kv_pool *p, int n) {
    p->fail_n = n > 0 ? n : 0;
    p->fail_sticky = 0;
}

void kv_fail_from(kv_pool *p, int n) {
    p->fail_n = n > 0 ? n : 0;
    p->fail_sticky = n > 0;
}

/* ---------------------------------------------------------------- sequences */

kv_seq *kv_seq_new(kv_pool *p) {
    for (int i = 0; i < p->cfg.max_seqs; i++) {
        kv_seq *s = &p->seqs[i];
        if (s->in_use) continue;
        s->in_use = 1;
        s->n_blocks = 0;
        s->n_tokens = 0;
        p->n_seqs_used++;
        return s;
    }
    return NULL;
}

void kv_seq_release(kv_pool *p, kv_seq *s) {
    if (!s || !s->in_use) return;
    assert(s >= p->seqs && s < p->seqs + p->cfg.max_seqs);
    /* Last block first: a sequence released right after reserve leaves the free stack
     * as it found it. */
    while (s->n_blocks > 0) block_put(p, s->blocks[--s->n_blocks]);
    s->n_tokens = 0;
    s->in_use = 0;
    p->n_seqs_used--;
}

int kv_seq_reserve(kv_pool *p, kv_seq *s, int n_tokens) {
    assert(s && s->in_use);
    if (n_tokens < 0) return -EINVAL;
    int need = blocks_for(p, n_tokens);
    if (need > p->cfg.max_blocks_per_seq) return -E2BIG;
    if (need <= s->n_blocks) return 0;
    int have = s->n_blocks;
    if (need - have > p->n_free) return -ENOMEM;
    for (int i = have; i < need; i++) {
        int32_t b = block_get(p);
        if (b < 0) {
            /* All or nothing: give back what this call took, newest first, which
             * restores the free stack exactly. */
            while (i > have) block_put(p, s->blocks[--i]);
            return -ENOMEM;
        }
        s->blocks[i] = b;
    }
    s->n_blocks = need;
    return 0;
}

kv_seq *kv_seq_fork(kv_pool *p, const kv_seq *src) {
    assert(src && src->in_use);
    kv_seq *s = kv_seq_new(p);
    if (!s) return NULL;
    for (int i = 0; i < src->n_blocks; i++) {
        s->blocks[i] = src->blocks[i];
        p->refcount[src->blocks[i]]++;
    }
    s->n_blocks = src->n_blocks;
    s->n_tokens = src->n_tokens;
    return s;
}

int kv_seq_cow(kv_pool *p, kv_seq *s, int pos) {
    assert(s && s->in_use);
    if (pos < 0 || pos / p->cfg.block_size >= s->n_blocks) return -EINVAL;
    int i = pos / p->cfg.block_size;
    int32_t old = s->blocks[i];
    if (p->refcount[old] <= 1) return 0;
    int32_t b = block_get(p);
    if (b < 0) return -ENOMEM;
    memcpy(p->data + (size_t)b * p->block_elems, p->data + (size_t)old * p->block_elems,
           p->block_elems * sizeof(uint16_t));
    p->refcount[old]--; /* was shared, so it stays >= 1 */
    s->blocks[i] = b;
    return 0;
}

int kv_seq_truncate(kv_pool *p, kv_seq *s, int n_tokens) {
    assert(s && s->in_use);
    if (n_tokens < 0) return -EINVAL;
    int keep = blocks_for(p, n_tokens);
    while (s->n_blocks > keep) block_put(p, s->blocks[--s->n_blocks]);
    if (n_tokens < s->n_tokens) s->n_tokens = n_tokens;
    return 0;
}

/* ---------------------------------------------------------------- consistency */

int kv_check(const kv_pool *p, char *err, size_t errlen) {
    const kv_config *c = &p->cfg;
    int32_t *refs = p->scratch; /* page-table references per block, then free-list marks */
    memset(refs, 0, (size_t)c->n_blocks * sizeof *refs);
    int used = 0;
    for (int i = 0; i < c->max_seqs; i++) {
        const kv_seq *s = &p->seqs[i];
        if (s->id != i || s->blocks != p->tables + (size_t)i * (size_t)c->max_blocks_per_seq) {
            snprintf(err, errlen, "seq %d: id %d or page table pointer corrupted", i, s->id);
            return -EFAULT;
        }
        if (!s->in_use) {
            if (s->n_blocks || s->n_tokens) {
                snprintf(err, errlen, "seq %d: free but holds %d blocks, %d tokens", i,
                         s->n_blocks, s->n_tokens);
                return -EFAULT;
            }
            continue;
        }
        used++;
        if (s->n_blocks < 0 || s->n_blocks > c->max_blocks_per_seq || s->n_tokens < 0 ||
            (long long)s->n_tokens > (long long)s->n_blocks * c->block_size) {
            snprintf(err, errlen, "seq %d: n_blocks %d, n_tokens %d out of range", i,
                     s->n_blocks, s->n_tokens);
            return -EFAULT;
        }
        for (int j = 0; j < s->n_blocks; j++) {
            int32_t b = s->blocks[j];
            if (b < 0 || b >= c->n_blocks) {
                snprintf(err, errlen, "seq %d: page %d -> block %d out of range", i, j, b);
                return -EFAULT;
            }
            refs[b]++;
        }
    }
    if (used != p->n_seqs_used) {
        snprintf(err, errlen, "%d seqs in use, counter says %d", used, p->n_seqs_used);
        return -EFAULT;
    }
    int n_zero = 0;
    for (int b = 0; b < c->n_blocks; b++) {
        if (p->refcount[b] != refs[b]) {
            snprintf(err, errlen, "block %d: refcount %d, %d page-table references", b,
                     p->refcount[b], refs[b]);
            return -EFAULT;
        }
        n_zero += refs[b] == 0;
    }
    if (p->n_free < 0 || p->n_free != n_zero) {
        snprintf(err, errlen, "free list holds %d, %d blocks at refcount 0", p->n_free, n_zero);
        return -EFAULT;
    }
    for (int k = 0; k < p->n_free; k++) {
        int32_t b = p->free_ids[k];
        if (b < 0 || b >= c->n_blocks || p->refcount[b] != 0 || refs[b] != 0) {
            snprintf(err, errlen, "free list[%d] = block %d: out of range, in use or twice", k, b);
            return -EFAULT;
        }
        refs[b] = -1;
    }
    return 0;
}
