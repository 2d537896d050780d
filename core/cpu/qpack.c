/* qpack: the packed Q4_1, Q8_0, Q4_0, Q5_0, Q5_1, F16, BF16, Q4_K, Q5_K and Q6_K layouts, their packer, the C reference and the
 * dispatcher (see qpack.h for the layouts and the arithmetic). */
#include "core/cpu/qpack.h"

#include <math.h>
#include <string.h>

#include "core/cpu/isa.h"
#include "core/cpu/quant.h"
#include "core/cpu/quant_kern.h"

/* Each packed type: its block, its group-block size, the packer of one row's block
 * into a lane of a group-block, and the reference for one (lane, column) pair. */
typedef struct {
    int block;       /* elements per block (and per group-block) */
    size_t gblk;     /* bytes per group-block */
    int64_t max_n;   /* widest row packed (0: any) */
    void (*pack)(uint8_t *gb, int lane, const uint8_t *blk);
    float (*pair)(int64_t nb, const uint8_t *g, int lane, const uint8_t *xr);
} qp_fmt;

static const qp_fmt *fmt_of(uint32_t type);

/* Bytes per group-block, 0 for a type (or width) without a packed layout. */
static size_t gblk(uint32_t type, int64_t n) {
    const qp_fmt *f = fmt_of(type);
    if (!f || n <= 0 || n % f->block || (f->max_n && n > f->max_n)) return 0;
    return f->gblk;
}

size_t qp_bytes(uint32_t type, int64_t n, int nr) {
    size_t gb = gblk(type, n);
    if (!gb || nr <= 0) return 0;
    size_t groups = ((size_t)nr + QP_ROWS - 1) / QP_ROWS;
    return groups * (size_t)(n / fmt_of(type)->block) * gb;
}

/* ---------------------------------------------------------------- packers */

static inline uint32_t ld32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline void or32(uint8_t *p, uint32_t v) { v |= ld32(p); memcpy(p, &v, 4); }

/* Row `lane` of one group-block from its row-major block. */
static void pack_q41(uint8_t *gb, int lane, const uint8_t *blk) {
    const blk_q4_1 *b = (const blk_q4_1 *)blk;
    memcpy(gb + 2 * lane, &b->d, 2);
    memcpy(gb + 2 * QP_ROWS + 2 * lane, &b->m, 2);
    for (int k = 0; k < 4; k++) memcpy(gb + 4 * QP_ROWS * (1 + k) + 4 * lane, b->qs + 4 * k, 4);
}

static void pack_q80(uint8_t *gb, int lane, const uint8_t *blk) {
    const blk_q8_0 *b = (const blk_q8_0 *)blk;
    memcpy(gb + 2 * lane, &b->d, 2);
    memset(gb + 2 * QP_ROWS + 2 * lane, 0, 2); /* the padding */
    for (int k = 0; k < 8; k++)
        for (int e = 0; e < 4; e++)
            gb[4 * QP_ROWS * (1 + k) + 4 * lane + e] = (uint8_t)(b->qs[4 * k + e] + 128);
}

/* Q4_K, and Q5_K (q5: its qh bytes too, which already hold the 8 sub-blocks' 5th
 * bits of one element each, so they keep their order). */
/* Q4_0: a group-block is two GGUF blocks, so that it is 576 bytes (9 lines) with no
 * padding (one block's 288 would not stay 64-byte aligned). */
static void pack_q40(uint8_t *gb, int lane, const uint8_t *blk) {
    for (int h = 0; h < 2; h++) {
        const blk_q4_0 *b = (const blk_q4_0 *)(blk + h * sizeof(blk_q4_0));
        memcpy(gb + 2 * QP_ROWS * h + 2 * lane, &b->d, 2);
        for (int k = 0; k < 4; k++) memcpy(gb + 64 + 256 * h + 64 * k + 4 * lane, b->qs + 4 * k, 4);
    }
}

/* GGUF's qh (bit j: element j's 5th bit) as qpack.h's per-chunk bytes: byte k holds
 * elements 4k..4k+3 in bits 0-3 and 16+4k..16+4k+3 in bits 4-7. */
static void pack_qh5(uint8_t *dst, const uint8_t *qh) {
    uint32_t h = ld32(qh);
    for (int k = 0; k < 4; k++)
        dst[k] = (uint8_t)(((h >> (4 * k)) & 15) | (((h >> (16 + 4 * k)) & 15) << 4));
}

static void pack_q51(uint8_t *gb, int lane, const uint8_t *blk) {
    const blk_q5_1 *b = (const blk_q5_1 *)blk;
    memcpy(gb + 2 * lane, &b->d, 2);
    memcpy(gb + 2 * QP_ROWS + 2 * lane, &b->m, 2);
    pack_qh5(gb + 64 + 4 * lane, b->qh);
    for (int k = 0; k < 4; k++) memcpy(gb + 128 + 64 * k + 4 * lane, b->qs + 4 * k, 4);
}

static void pack_q50(uint8_t *gb, int lane, const uint8_t *blk) {
    for (int h = 0; h < 2; h++) {
        const blk_q5_0 *b = (const blk_q5_0 *)(blk + h * sizeof(blk_q5_0));
        memcpy(gb + 2 * QP_ROWS * h + 2 * lane, &b->d, 2);
        pack_qh5(gb + 64 + 64 * h + 4 * lane, b->qh);
        for (int k = 0; k < 4; k++) memcpy(gb + 192 + 256 * h + 64 * k + 4 * lane, b->qs + 4 * k, 4);
    }
}

/* Byte offset in an F16 group-block of row `lane`'s element k (k < 32): chunks of 4. */
static size_t h16_at(int lane, int k) { return (size_t)(k / 4 * 8 * QP_ROWS + 8 * lane + 2 * (k % 4)); }
/* The same for BF16, chunks of 8 (4 pairs). */
static size_t bf16_at(int lane, int k) { return (size_t)(k / 8 * 16 * QP_ROWS + 16 * lane + 2 * (k % 8)); }

/* F16: 16-bit values as they are, 16 rows side by side per chunk of 4 elements. */
static void pack_h16(uint8_t *gb, int lane, const uint8_t *blk) {
    for (int k = 0; k < QP_H16_BLOCK; k += 4) memcpy(gb + h16_at(lane, k), blk + 2 * k, 8);
}

/* BF16: 16 rows side by side per chunk of 4 pairs, magnitudes under QUANT_BF16_FLOOR
 * (2^-48) to zero (qpack.h). */
static void pack_bf16(uint8_t *gb, int lane, const uint8_t *blk) {
    for (int k = 0; k < QP_H16_BLOCK; k++) {
        uint16_t h;
        memcpy(&h, blk + 2 * k, 2);
        if ((h & 0x7fff) < QUANT_BF16_FLOOR >> 16) h &= 0x8000;
        memcpy(gb + bf16_at(lane, k), &h, 2);
    }
}

static void pack_k45(const int q5, uint8_t *gb, int lane, const uint8_t *blk) {
    const blk_q4_k *b4 = (const blk_q4_k *)blk;
    const blk_q5_k *b5 = (const blk_q5_k *)blk;
    const uint8_t *scales = q5 ? b5->scales : b4->scales, *qs = q5 ? b5->qs : b4->qs;
    memcpy(gb + 2 * lane, q5 ? &b5->d : &b4->d, 2);
    memcpy(gb + 2 * QP_ROWS + 2 * lane, q5 ? &b5->dmin : &b4->dmin, 2);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        quant_scale_min_k4(j, scales, &sc, &m);
        gb[QP_Q4K_SC + QP_ROWS * j + lane] = sc;
        gb[QP_Q4K_MN + 2 * QP_ROWS * (j / 2) + 2 * lane + (j & 1)] = m;
    }
    for (int c = 0; c < 4; c++)
        for (int k = 0; k < 8; k++)
            memcpy(gb + QP_Q4K_Q + 64 * (8 * c + k) + 4 * lane, qs + 32 * c + 4 * k, 4);
    if (q5)
        for (int k = 0; k < 8; k++) memcpy(gb + QP_Q5K_QH + 64 * k + 4 * lane, b5->qh + 4 * k, 4);
}
static void pack_q4k(uint8_t *gb, int lane, const uint8_t *blk) { pack_k45(0, gb, lane, blk); }
static void pack_q5k(uint8_t *gb, int lane, const uint8_t *blk) { pack_k45(1, gb, lane, blk); }

/* Four elements at a time: GGUF keeps element 128h + 32t + l's low 4 bits in nibble
 * t/2 of ql[64h + 32(t & 1) + l] and its high 2 bits at bit 2t of qh[32h + l], so four
 * consecutive l are four consecutive bytes of each, i.e. one packed chunk. */
static void pack_q6k(uint8_t *gb, int lane, const uint8_t *blk) {
    const blk_q6_k *b = (const blk_q6_k *)blk;
    memcpy(gb + 2 * lane, &b->d, 2);
    memset(gb + 2 * QP_ROWS + 2 * lane, 0, 2); /* the padding */
    for (int j = 0; j < 16; j++) gb[QP_Q6K_SC + QP_ROWS * j + lane] = (uint8_t)b->scales[j];
    for (int v = 0; v < 32; v++) memset(gb + QP_Q6K_QL + 64 * v + 4 * lane, 0, 4);
    for (int h = 0; h < 16; h++) memset(gb + QP_Q6K_QH + 64 * h + 4 * lane, 0, 4);
    for (int hh = 0; hh < 2; hh++)
        for (int t = 0; t < 4; t++)
            for (int m = 0; m < 8; m++) {
                uint32_t lo = (ld32(b->ql + 64 * hh + 32 * (t & 1) + 4 * m) >> (4 * (t >> 1))) & 0x0F0F0F0Fu;
                uint32_t hi = (ld32(b->qh + 32 * hh + 4 * m) >> (2 * t)) & 0x03030303u;
                int ch = 32 * hh + 8 * t + m; /* u = lo | hi << 4 for its 4 elements (qpack.h) */
                int v = (ch & 15) + 16 * ((ch >> 4) & 1);
                or32(gb + QP_Q6K_QL + 64 * v + 4 * lane, lo << (4 * (ch >= 32)));
                or32(gb + QP_Q6K_QH + 64 * (ch & 15) + 4 * lane, hi << (2 * (ch >> 4)));
            }
}

void qp_pack(uint32_t type, int64_t n, const void *w, size_t ws, int nr, void *dst) {
    size_t bytes = qp_bytes(type, n, nr), gb = gblk(type, n);
    if (!bytes) return;
    const qp_fmt *f = fmt_of(type);
    const int64_t nb = n / f->block;
    const size_t rb = quant_row_size(type, f->block), group = (size_t)nb * gb;
    if (nr % QP_ROWS) memset((uint8_t *)dst + bytes - group, 0, group); /* missing rows */
    /* row by row: the reads run front to back, and the 16 rows of a group write into
     * the same few KB (one group: nb * gb bytes), which stay in cache */
    for (int r = 0; r < nr; r++) {
        const uint8_t *row = (const uint8_t *)w + (size_t)r * ws;
        uint8_t *g = (uint8_t *)dst + (size_t)(r / QP_ROWS) * group;
        for (int64_t b = 0; b < nb; b++) f->pack(g + b * gb, r % QP_ROWS, row + b * rb);
    }
}

/* ---------------------------------------------------------------- references */

/* One (row lane, column) pair of a group, exactly as qpack.h defines it. */
static float q41_pair_ref(int64_t nb, const uint8_t *g, int lane, const uint8_t *xr) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = g + b * QP_Q41_GBLK;
        const blk_q8_1 *x = (const blk_q8_1 *)(xr + b * sizeof(blk_q8_1));
        uint16_t dh, mh;
        memcpy(&dh, gb + 2 * lane, 2);
        memcpy(&mh, gb + 2 * QP_ROWS + 2 * lane, 2);
        int32_t i = 0;
        for (int k = 0; k < 4; k++) {
            const uint8_t *q = gb + 4 * QP_ROWS * (1 + k) + 4 * lane;
            for (int e = 0; e < 4; e++) {
                i += (q[e] & 0x0F) * x->qs[4 * k + e];
                i += (q[e] >> 4) * x->qs[16 + 4 * k + e];
            }
        }
        float dw = quant_f16_to_f32(dh), mw = quant_f16_to_f32(mh);
        float dx = quant_f16_to_f32(x->d), sx = quant_f16_to_f32(x->s);
        acc = fmaf((float)i, dw * dx, acc);
        acc = fmaf(mw, sx, acc);
    }
    return acc;
}

static float q80_pair_ref(int64_t nb, const uint8_t *g, int lane, const uint8_t *xr) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = g + b * QP_Q80_GBLK;
        const blk_q8_0 *x = (const blk_q8_0 *)(xr + b * sizeof(blk_q8_0));
        uint16_t dh;
        memcpy(&dh, gb + 2 * lane, 2);
        int32_t i = 0;
        for (int k = 0; k < 8; k++) {
            const uint8_t *q = gb + 4 * QP_ROWS * (1 + k) + 4 * lane;
            for (int e = 0; e < 4; e++) i += (q[e] - 128) * x->qs[4 * k + e];
        }
        acc = fmaf((float)i, quant_f16_to_f32(dh) * quant_f16_to_f32(x->d), acc);
    }
    return acc;
}

/* The 32 products of one 32-element block: nibbles q (Q4_1's chunk order) with, for
 * Q5, the 5th bits from qpack.h's per-chunk bytes h5 (NULL: none). */
static int32_t nib_dot(const uint8_t *q, size_t qstep, const uint8_t *h5, const int8_t *x) {
    int32_t i = 0;
    for (int k = 0; k < 4; k++, q += qstep)
        for (int e = 0; e < 4; e++) {
            int lo = q[e] & 0x0F, hi = q[e] >> 4;
            if (h5) lo |= ((h5[k] >> e) & 1) << 4, hi |= ((h5[k] >> (4 + e)) & 1) << 4;
            i += lo * x[4 * k + e] + hi * x[16 + 4 * k + e];
        }
    return i;
}

static float q51_pair_ref(int64_t nb, const uint8_t *g, int lane, const uint8_t *xr) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = g + b * QP_Q51_GBLK;
        const blk_q8_1 *x = (const blk_q8_1 *)(xr + b * sizeof(blk_q8_1));
        uint16_t dh, mh;
        memcpy(&dh, gb + 2 * lane, 2);
        memcpy(&mh, gb + 2 * QP_ROWS + 2 * lane, 2);
        int32_t i = nib_dot(gb + 128 + 4 * lane, 64, gb + 64 + 4 * lane, x->qs);
        acc = fmaf((float)i, quant_f16_to_f32(dh) * quant_f16_to_f32(x->d), acc);
        acc = fmaf(quant_f16_to_f32(mh), quant_f16_to_f32(x->s), acc);
    }
    return acc;
}

/* Q4_0 and Q5_0 (q5): two GGUF blocks per group-block, unsigned values less the bias
 * (8, 16) times the activation block's sum. */
static float q450_pair_ref(const int q5, int64_t nb, const uint8_t *g, int lane, const uint8_t *xr) {
    const size_t gbb = q5 ? QP_Q50_GBLK : QP_Q40_GBLK, qat = q5 ? 192 : 64;
    float acc = 0.0f;
    for (int64_t b = 0; b < 2 * nb; b++) { /* GGUF blocks, two per group-block */
        const uint8_t *gb = g + b / 2 * gbb;
        int h = (int)(b & 1);
        const blk_q8_0 *x = (const blk_q8_0 *)(xr + b * sizeof(blk_q8_0));
        uint16_t dh;
        memcpy(&dh, gb + 2 * QP_ROWS * h + 2 * lane, 2);
        int32_t i = nib_dot(gb + qat + 256 * h + 4 * lane, 64, q5 ? gb + 64 + 64 * h + 4 * lane : NULL, x->qs);
        int32_t sum = 0;
        for (int e = 0; e < 32; e++) sum += x->qs[e];
        acc = fmaf((float)(i - (q5 ? 16 : 8) * sum), quant_f16_to_f32(dh) * quant_f16_to_f32(x->d), acc);
    }
    return acc;
}
static float q40_pair_ref(int64_t nb, const uint8_t *g, int lane, const uint8_t *xr) {
    return q450_pair_ref(0, nb, g, lane, xr);
}
static float q50_pair_ref(int64_t nb, const uint8_t *g, int lane, const uint8_t *xr) {
    return q450_pair_ref(1, nb, g, lane, xr);
}

/* F16 against f32 activations: four partial sums by element index mod 4, added
 * pairwise at the end (four FMA chains, so one column is not one latency-bound chain). */
static float f16_pair_ref(int64_t nb, const uint8_t *g, int lane, const uint8_t *xr) {
    const float *x = (const float *)xr;
    float s[4] = {0, 0, 0, 0};
    for (int64_t k = 0; k < nb * QP_H16_BLOCK; k++) {
        uint16_t h;
        memcpy(&h, g + k / QP_H16_BLOCK * QP_H16_GBLK + h16_at(lane, (int)(k % QP_H16_BLOCK)), 2);
        s[k % 4] = fmaf(quant_f16_to_f32(h), x[k], s[k % 4]);
    }
    return (s[0] + s[1]) + (s[2] + s[3]);
}

/* BF16 against BF16 activations: four partial sums by pair index mod 4, each pair
 * the odd element's product first (vdpbf16ps's order); every product is exact. */
static float bf16_pair_ref(int64_t nb, const uint8_t *g, int lane, const uint8_t *xr) {
    const uint16_t *x = (const uint16_t *)xr;
    float s[4] = {0, 0, 0, 0};
    for (int64_t p = 0; p < nb * QP_H16_BLOCK / 2; p++) {
        uint16_t h[2];
        memcpy(h, g + p / 16 * QP_H16_GBLK + bf16_at(lane, (int)(2 * (p % 16))), 4);
        for (int e = 1; e >= 0; e--)
            s[p % 4] = fmaf(quant_bf16_to_f32(h[e]), quant_bf16_to_f32(x[2 * p + e]), s[p % 4]);
    }
    return (s[0] + s[1]) + (s[2] + s[3]);
}

/* K-quants against Q8_K: per super-block, the exact int32 sums of sub-block scale
 * times sub-block dot (Q4_K also the mins times the activation's sub-block sums),
 * then one or two FMAs in f32 (qpack.h). */
/* Q4_K, and Q5_K (q5) whose 5th bits come from its qh[8][16][4]. */
static float q45k_pair_ref(const int q5, int64_t nb, const uint8_t *g, int lane, const uint8_t *xr) {
    const size_t gbb = q5 ? QP_Q5K_GBLK : QP_Q4K_GBLK;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = g + b * gbb;
        const blk_q8_k *x = (const blk_q8_k *)(xr + b * sizeof(blk_q8_k));
        uint16_t dh, mh;
        memcpy(&dh, gb + 2 * lane, 2);
        memcpy(&mh, gb + 2 * QP_ROWS + 2 * lane, 2);
        int32_t sumq = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            int32_t i = 0;
            for (int k = 0; k < 8; k++) {
                const uint8_t *q = gb + QP_Q4K_Q + 64 * (8 * (j / 2) + k) + 4 * lane;
                const uint8_t *qh = gb + QP_Q5K_QH + 64 * k + 4 * lane;
                for (int e = 0; e < 4; e++) {
                    int v = (q[e] >> (4 * (j & 1))) & 15;
                    if (q5) v |= ((qh[e] >> j) & 1) << 4;
                    i += v * x->qs[32 * j + 4 * k + e];
                }
            }
            sumq += gb[QP_Q4K_SC + QP_ROWS * j + lane] * i;
            summ += gb[QP_Q4K_MN + 2 * QP_ROWS * (j / 2) + 2 * lane + (j & 1)] *
                    (x->bsums[2 * j] + x->bsums[2 * j + 1]);
        }
        acc = fmaf((float)sumq, quant_f16_to_f32(dh) * x->d, acc);
        acc = fmaf(-(float)summ, quant_f16_to_f32(mh) * x->d, acc);
    }
    return acc;
}
static float q4k_pair_ref(int64_t nb, const uint8_t *g, int lane, const uint8_t *xr) {
    return q45k_pair_ref(0, nb, g, lane, xr);
}
static float q5k_pair_ref(int64_t nb, const uint8_t *g, int lane, const uint8_t *xr) {
    return q45k_pair_ref(1, nb, g, lane, xr);
}

static float q6k_pair_ref(int64_t nb, const uint8_t *g, int lane, const uint8_t *xr) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = g + b * QP_Q6K_GBLK;
        const blk_q8_k *x = (const blk_q8_k *)(xr + b * sizeof(blk_q8_k));
        uint16_t dh;
        memcpy(&dh, gb + 2 * lane, 2);
        int32_t sumq = 0;
        for (int j = 0; j < 16; j++) {
            int32_t i = 0;
            for (int ch = 4 * j; ch < 4 * j + 4; ch++) {
                const uint8_t *ql = gb + QP_Q6K_QL + 64 * ((ch & 15) + 16 * ((ch >> 4) & 1)) + 4 * lane;
                const uint8_t *qh = gb + QP_Q6K_QH + 64 * (ch & 15) + 4 * lane;
                for (int e = 0; e < 4; e++) {
                    int u = ((ql[e] >> (4 * (ch >= 32))) & 15) | (((qh[e] >> (2 * (ch >> 4))) & 3) << 4);
                    i += u * x->qs[4 * ch + e];
                }
            }
            sumq += (int8_t)gb[QP_Q6K_SC + QP_ROWS * j + lane] * (i - 32 * x->bsums[j]);
        }
        acc = fmaf((float)sumq, quant_f16_to_f32(dh) * x->d, acc);
    }
    return acc;
}

static const qp_fmt fmts[] = {
    {QK4, QP_Q41_GBLK, 0, pack_q41, q41_pair_ref},
    {QK4, QP_Q80_GBLK, QP_MAX_N, pack_q80, q80_pair_ref},
    {2 * QK4, QP_Q40_GBLK, QP_MAX_N, pack_q40, q40_pair_ref},
    {2 * QK4, QP_Q50_GBLK, QP_MAX_N, pack_q50, q50_pair_ref},
    {QK4, QP_Q51_GBLK, 0, pack_q51, q51_pair_ref},
    {QP_H16_BLOCK, QP_H16_GBLK, 0, pack_h16, f16_pair_ref},
    {QP_H16_BLOCK, QP_H16_GBLK, 0, pack_bf16, bf16_pair_ref},
    {QKK, QP_Q4K_GBLK, 0, pack_q4k, q4k_pair_ref},
    {QKK, QP_Q5K_GBLK, 0, pack_q5k, q5k_pair_ref},
    {QKK, QP_Q6K_GBLK, 0, pack_q6k, q6k_pair_ref},
};
enum { QPI_Q41, QPI_Q80, QPI_Q40, QPI_Q50, QPI_Q51, QPI_F16, QPI_BF16, QPI_Q4K, QPI_Q5K, QPI_Q6K, QPI_N }; /* rows of fmts and of a path */

static int index_of(uint32_t type) {
    switch (type) {
    case QT_Q4_1: return QPI_Q41;
    case QT_Q8_0: return QPI_Q80;
    case QT_Q4_0: return QPI_Q40;
    case QT_Q5_0: return QPI_Q50;
    case QT_Q5_1: return QPI_Q51;
    case QT_F16: return QPI_F16;
    case QT_BF16: return QPI_BF16;
    case QT_Q4_K: return QPI_Q4K;
    case QT_Q5_K: return QPI_Q5K;
    case QT_Q6_K: return QPI_Q6K;
    default: return -1;
    }
}

static const qp_fmt *fmt_of(uint32_t type) {
    int i = index_of(type);
    return i < 0 ? NULL : &fmts[i];
}

void qp_tile_ref(uint32_t type, int64_t n, const void *wp, int r0, int nr, const void *xq,
                 size_t xs, int nc, float *out, size_t os) {
    if (!qp_bytes(type, n, r0 + nr) || r0 % QP_ROWS) return;
    const qp_fmt *f = fmt_of(type);
    const int64_t nb = n / f->block;
    for (int c = 0; c < nc; c++) {
        const uint8_t *x = (const uint8_t *)xq + (size_t)c * xs;
        for (int r = 0; r < nr; r++) {
            int row = r0 + r;
            const uint8_t *g = (const uint8_t *)wp + (size_t)(row / QP_ROWS) * nb * f->gblk;
            out[(size_t)c * os + r] = f->pair(nb, g, row % QP_ROWS, x);
        }
    }
}

/* ---------------------------------------------------------------- dispatch */

typedef void (*qp_tile_fn)(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                           int nc, float *out, size_t os);
typedef struct {
    qp_tile_fn tile[QPI_N]; /* the tile of each packed type */
    unsigned char want[QPI_N]; /* qp_wanted: the packed layout beats row-major quant_dot_tile */
} qp_path;

#define QP_REF_TILE(name, T)                                                                     \
    static void name(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,       \
                     int nc, float *out, size_t os) {                                           \
        qp_tile_ref(T, n, wp, r0, nr, xq, xs, nc, out, os);                                     \
    }
QP_REF_TILE(q41_tile_ref, QT_Q4_1)
QP_REF_TILE(q80_tile_ref, QT_Q8_0)
QP_REF_TILE(q40_tile_ref, QT_Q4_0)
QP_REF_TILE(q50_tile_ref, QT_Q5_0)
QP_REF_TILE(q51_tile_ref, QT_Q5_1)
QP_REF_TILE(f16_tile_ref, QT_F16)
QP_REF_TILE(bf16_tile_ref, QT_BF16)
QP_REF_TILE(q4k_tile_ref, QT_Q4_K)
QP_REF_TILE(q5k_tile_ref, QT_Q5_K)
QP_REF_TILE(q6k_tile_ref, QT_Q6_K)

/* Per dispatch slot (isa.h). AMX, where in force,
 * has its own tiles over the row-major layout for Q4_1 (and Q8_0 when all), so it wants
 * no packed copy of those. Q8_0 (where packed), Q4_0, Q5_0 and the K-quants have AMX
 * tiles on the packed layout in both AMX slots: they give the AVX-512 kernels' bits, so
 * unlike Q4_1's they change no result. */
static const qp_path paths[ISA_SLOTS] = {
    [ISA_SCALAR] = {{q41_tile_ref, q80_tile_ref, q40_tile_ref, q50_tile_ref, q51_tile_ref, f16_tile_ref,
                     bf16_tile_ref, q4k_tile_ref, q5k_tile_ref, q6k_tile_ref}, {0}},
#if defined(__x86_64__)
    [ISA_AVX2] = {{qp_q41_tile_avx2, qp_q80_tile_avx2, qp_q40_tile_avx2, qp_q50_tile_avx2, qp_q51_tile_avx2,
                   qp_f16_tile_avx2, qp_bf16_tile_avx2, qp_q4k_tile_avx2, qp_q5k_tile_avx2, qp_q6k_tile_avx2},
                  {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
#define QP_AVX512_TILES                                                                            \
    {qp_q41_tile_avx512, qp_q80_tile_avx512, qp_q40_tile_avx512, qp_q50_tile_avx512,               \
     qp_q51_tile_avx512, qp_f16_tile_avx512, qp_bf16_tile_avx512, qp_q4k_tile_avx512,              \
     qp_q5k_tile_avx512, qp_q6k_tile_avx512}
    [ISA_AVX512] = {QP_AVX512_TILES, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
#define QP_AMX_TILES                                                                               \
    {qp_q41_tile_avx512, qp_q80_tile_amx, qp_q40_tile_amx, qp_q50_tile_amx,                        \
     qp_q51_tile_avx512, qp_f16_tile_avx512, qp_bf16_tile_avx512, qp_q4k_tile_amx,                 \
     qp_q5k_tile_amx, qp_q6k_tile_amx}
    [ISA_SLOT_AMX_Q4_1] = {QP_AMX_TILES, {0, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
    [ISA_SLOT_AMX_ALL] = {QP_AMX_TILES, {0, 0, 1, 1, 1, 1, 1, 1, 1, 1}},
#endif
};

int qp_wanted(uint32_t type) {
    int i = index_of(type);
    return i >= 0 && ISA_PICK(paths)->want[i];
}

void qp_tile(uint32_t type, int64_t n, const void *wp, int r0, int nr, const void *xq,
             size_t xs, int nc, float *out, size_t os) {
    if (!qp_bytes(type, n, r0 + nr) || r0 % QP_ROWS) return;
    ISA_PICK(paths)->tile[index_of(type)](n, wp, r0, nr, xq, xs, nc, out, os);
}
