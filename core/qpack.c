/* qpack: the packed Q4_1 layout, its packer, the C reference and the dispatcher (see
 * qpack.h for the layout and the arithmetic). */
#include "core/qpack.h"

#include <math.h>
#include <string.h>

#include "core/quant.h"
#include "core/quant_kern.h"

#define QP_GBLK (QP_ROWS * sizeof(blk_q4_1)) /* bytes of one group-block: 320 */

int qp_wanted(uint32_t type) {
#if defined(__x86_64__)
    /* AMX, where in force, has its own Q4_1 tiles over the row-major layout */
    return type == QT_Q4_1 && quant_simd() >= QS_AVX512 && quant_amx() < QA_Q4_1;
#else
    (void)type;
    return 0;
#endif
}

size_t qp_bytes(uint32_t type, int64_t n, int nr) {
    if (type != QT_Q4_1 || n <= 0 || n % QK4 || nr <= 0) return 0;
    size_t groups = ((size_t)nr + QP_ROWS - 1) / QP_ROWS;
    return groups * (size_t)(n / QK4) * QP_GBLK;
}

void qp_pack(uint32_t type, int64_t n, const void *w, size_t ws, int nr, void *dst) {
    size_t bytes = qp_bytes(type, n, nr);
    if (!bytes) return;
    memset(dst, 0, bytes); /* the last group's missing rows */
    const int64_t nb = n / QK4;
    for (int r = 0; r < nr; r++) {
        const blk_q4_1 *row = (const blk_q4_1 *)((const uint8_t *)w + (size_t)r * ws);
        uint8_t *g = (uint8_t *)dst + (size_t)(r / QP_ROWS) * nb * QP_GBLK;
        int lane = r % QP_ROWS;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *gb = g + b * QP_GBLK;
            memcpy(gb + 2 * lane, &row[b].d, 2);
            memcpy(gb + 2 * QP_ROWS + 2 * lane, &row[b].m, 2);
            for (int k = 0; k < 4; k++)
                memcpy(gb + 4 * QP_ROWS + k * 4 * QP_ROWS + 4 * lane, row[b].qs + 4 * k, 4);
        }
    }
}

/* One (row lane, column) pair of a group, exactly as qpack.h defines it. */
static float q41_pair_ref(int64_t nb, const uint8_t *g, int lane, const blk_q8_1 *x) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = g + b * QP_GBLK;
        uint16_t dh, mh;
        memcpy(&dh, gb + 2 * lane, 2);
        memcpy(&mh, gb + 2 * QP_ROWS + 2 * lane, 2);
        int32_t i = 0;
        for (int k = 0; k < 4; k++) {
            const uint8_t *q = gb + 4 * QP_ROWS + k * 4 * QP_ROWS + 4 * lane;
            for (int e = 0; e < 4; e++) {
                i += (q[e] & 0x0F) * x[b].qs[4 * k + e];
                i += (q[e] >> 4) * x[b].qs[16 + 4 * k + e];
            }
        }
        float dw = quant_f16_to_f32(dh), mw = quant_f16_to_f32(mh);
        float dx = quant_f16_to_f32(x[b].d), sx = quant_f16_to_f32(x[b].s);
        acc = fmaf((float)i, dw * dx, acc);
        acc = fmaf(mw, sx, acc);
    }
    return acc;
}

void qp_tile_ref(uint32_t type, int64_t n, const void *wp, int r0, int nr, const void *xq,
                 size_t xs, int nc, float *out, size_t os) {
    if (!qp_bytes(type, n, r0 + nr) || r0 % QP_ROWS) return;
    const int64_t nb = n / QK4;
    for (int c = 0; c < nc; c++) {
        const blk_q8_1 *x = (const blk_q8_1 *)((const uint8_t *)xq + (size_t)c * xs);
        for (int r = 0; r < nr; r++) {
            int row = r0 + r;
            const uint8_t *g = (const uint8_t *)wp + (size_t)(row / QP_ROWS) * nb * QP_GBLK;
            out[(size_t)c * os + r] = q41_pair_ref(nb, g, row % QP_ROWS, x);
        }
    }
}

void qp_tile(uint32_t type, int64_t n, const void *wp, int r0, int nr, const void *xq,
             size_t xs, int nc, float *out, size_t os) {
#if defined(__x86_64__)
    if (type == QT_Q4_1 && quant_simd() >= QS_AVX512 && qp_bytes(type, n, r0 + nr) &&
        r0 % QP_ROWS == 0) {
        qp_q41_tile_avx512(n, wp, r0, nr, xq, xs, nc, out, os);
        return;
    }
#endif
    qp_tile_ref(type, n, wp, r0, nr, xq, xs, nc, out, os);
}
