/* qpack: the packed Q4_1 and Q8_0 layouts, their packer, the C reference and the
 * dispatcher (see qpack.h for the layouts and the arithmetic). */
#include "core/cpu/qpack.h"

#include <math.h>
#include <string.h>

#include "core/cpu/isa.h"
#include "core/cpu/quant.h"
#include "core/cpu/quant_kern.h"

#define Q41_GBLK (QP_ROWS * sizeof(blk_q4_1))     /* 320 */
#define Q80_GBLK (QP_ROWS * (sizeof(blk_q8_0) + 2)) /* 576 */

/* Bytes per group-block, 0 for a type (or width) without a packed layout. */
static size_t gblk(uint32_t type, int64_t n) {
    if (n <= 0 || n % QK4) return 0;
    if (type == QT_Q4_1) return Q41_GBLK;
    if (type == QT_Q8_0 && n <= QP_MAX_N) return Q80_GBLK;
    return 0;
}

size_t qp_bytes(uint32_t type, int64_t n, int nr) {
    size_t gb = gblk(type, n);
    if (!gb || nr <= 0) return 0;
    size_t groups = ((size_t)nr + QP_ROWS - 1) / QP_ROWS;
    return groups * (size_t)(n / QK4) * gb;
}

/* Row `lane` of one group-block from its row-major block. */
static void pack_q41(uint8_t *gb, int lane, const blk_q4_1 *b) {
    memcpy(gb + 2 * lane, &b->d, 2);
    memcpy(gb + 2 * QP_ROWS + 2 * lane, &b->m, 2);
    for (int k = 0; k < 4; k++) memcpy(gb + 4 * QP_ROWS * (1 + k) + 4 * lane, b->qs + 4 * k, 4);
}

static void pack_q80(uint8_t *gb, int lane, const blk_q8_0 *b) {
    memcpy(gb + 2 * lane, &b->d, 2);
    memset(gb + 2 * QP_ROWS + 2 * lane, 0, 2); /* the padding */
    for (int k = 0; k < 8; k++)
        for (int e = 0; e < 4; e++)
            gb[4 * QP_ROWS * (1 + k) + 4 * lane + e] = (uint8_t)(b->qs[4 * k + e] + 128);
}

void qp_pack(uint32_t type, int64_t n, const void *w, size_t ws, int nr, void *dst) {
    size_t bytes = qp_bytes(type, n, nr), gb = gblk(type, n);
    if (!bytes) return;
    const int64_t nb = n / QK4;
    const size_t rb = quant_traits_of(type)->bytes, group = (size_t)nb * gb;
    if (nr % QP_ROWS) memset((uint8_t *)dst + bytes - group, 0, group); /* missing rows */
    /* row by row: the reads run front to back, and the 16 rows of a group write into
     * the same few KB (one group: nb * gb bytes), which stay in cache */
    for (int r = 0; r < nr; r++) {
        const uint8_t *row = (const uint8_t *)w + (size_t)r * ws;
        uint8_t *g = (uint8_t *)dst + (size_t)(r / QP_ROWS) * group;
        int lane = r % QP_ROWS;
        if (type == QT_Q4_1)
            for (int64_t b = 0; b < nb; b++) pack_q41(g + b * gb, lane, (const blk_q4_1 *)(row + b * rb));
        else
            for (int64_t b = 0; b < nb; b++) pack_q80(g + b * gb, lane, (const blk_q8_0 *)(row + b * rb));
    }
}

/* One (row lane, column) pair of a group, exactly as qpack.h defines it. */
static float q41_pair_ref(int64_t nb, const uint8_t *g, int lane, const uint8_t *xr) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = g + b * Q41_GBLK;
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
        const uint8_t *gb = g + b * Q80_GBLK;
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

void qp_tile_ref(uint32_t type, int64_t n, const void *wp, int r0, int nr, const void *xq,
                 size_t xs, int nc, float *out, size_t os) {
    size_t gb = gblk(type, n);
    if (!qp_bytes(type, n, r0 + nr) || r0 % QP_ROWS) return;
    const int64_t nb = n / QK4;
    for (int c = 0; c < nc; c++) {
        const uint8_t *x = (const uint8_t *)xq + (size_t)c * xs;
        for (int r = 0; r < nr; r++) {
            int row = r0 + r;
            const uint8_t *g = (const uint8_t *)wp + (size_t)(row / QP_ROWS) * nb * gb;
            out[(size_t)c * os + r] = type == QT_Q4_1 ? q41_pair_ref(nb, g, row % QP_ROWS, x)
                                                      : q80_pair_ref(nb, g, row % QP_ROWS, x);
        }
    }
}

/* ---------------------------------------------------------------- dispatch */

typedef void (*qp_tile_fn)(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                           int nc, float *out, size_t os);
typedef struct {
    qp_tile_fn q41, q80; /* the tile of each packed type */
    int want_q41, want_q80; /* qp_wanted: the packed layout beats row-major quant_dot_tile */
} qp_path;

static void q41_tile_ref(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                         int nc, float *out, size_t os) {
    qp_tile_ref(QT_Q4_1, n, wp, r0, nr, xq, xs, nc, out, os);
}
static void q80_tile_ref(int64_t n, const void *wp, int r0, int nr, const void *xq, size_t xs,
                         int nc, float *out, size_t os) {
    qp_tile_ref(QT_Q8_0, n, wp, r0, nr, xq, xs, nc, out, os);
}

/* Per dispatch slot (isa.h). Q8_0 has no AVX2 kernel (qpack.h); AMX, where in force,
 * has its own tiles over the row-major layout, so it wants no packed copy of its types. */
static const qp_path paths[ISA_SLOTS] = {
    [ISA_SCALAR] = {q41_tile_ref, q80_tile_ref, 0, 0},
#if defined(__x86_64__)
    [ISA_AVX2] = {qp_q41_tile_avx2, q80_tile_ref, 1, 0},
    [ISA_AVX512] = {qp_q41_tile_avx512, qp_q80_tile_avx512, 1, 1},
    [ISA_SLOT_AMX_Q4_1] = {qp_q41_tile_avx512, qp_q80_tile_avx512, 0, 1},
    [ISA_SLOT_AMX_ALL] = {qp_q41_tile_avx512, qp_q80_tile_avx512, 0, 0},
#endif
};

int qp_wanted(uint32_t type) {
    const qp_path *p = ISA_PICK(paths);
    return type == QT_Q4_1 ? p->want_q41 : type == QT_Q8_0 ? p->want_q80 : 0;
}

void qp_tile(uint32_t type, int64_t n, const void *wp, int r0, int nr, const void *xq,
             size_t xs, int nc, float *out, size_t os) {
    if (!qp_bytes(type, n, r0 + nr) || r0 % QP_ROWS) return;
    const qp_path *p = ISA_PICK(paths);
    (type == QT_Q4_1 ? p->q41 : p->q80)(n, wp, r0, nr, xq, xs, nc, out, os);
}
