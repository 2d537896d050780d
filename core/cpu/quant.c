/* quant: type traits, fp16/bf16 conversion, plain C references for dequantize,
 * quantize and dot of every type, and the run-time SIMD dispatch (by isa.h's slot).
 *
 * The references are the readable definition of each format (bit-exact with GGUF /
 * ggml block layouts, see quant_kern.h) and are never removed: the SIMD paths in
 * quant_avx2.c / quant_avx512.c are tested against them. Dots use the integer
 * formulation (sum of q_w*q_x per block, then scales), which is what the SIMD paths
 * compute too, so they agree up to float summation order. */
#include "core/cpu/quant_kern.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#include "core/cpu/isa.h"

/* ---------------------------------------------------------------- traits */

/* qtypes.h's numbers are GGUF's, carried by every model file; cuda/kernels.cu takes
 * them from the same header. */
_Static_assert(QT_F32 == 0 && QT_F16 == 1 && QT_Q4_0 == 2 && QT_Q4_1 == 3 && QT_Q5_0 == 6 &&
                   QT_Q5_1 == 7 && QT_Q8_0 == 8 && QT_Q8_1 == 9 && QT_Q4_K == 12 &&
                   QT_Q5_K == 13 && QT_Q6_K == 14 && QT_Q8_K == 15 && QT_BF16 == 30 &&
                   QT_COUNT == 31,
               "ggml_type numbering");

static const quant_traits traits[QT_COUNT] = {
    [QT_F32]  = {"F32", 1, 4, QT_F32},
    [QT_F16]  = {"F16", 1, 2, QT_F32},
    [QT_BF16] = {"BF16", 1, 2, QT_BF16}, /* bf16 products are exact: qpack.h */
    [QT_Q4_0] = {"Q4_0", QK4, sizeof(blk_q4_0), QT_Q8_0},
    [QT_Q4_1] = {"Q4_1", QK4, sizeof(blk_q4_1), QT_Q8_1},
    [QT_Q5_0] = {"Q5_0", QK4, sizeof(blk_q5_0), QT_Q8_0},
    [QT_Q5_1] = {"Q5_1", QK4, sizeof(blk_q5_1), QT_Q8_1},
    [QT_Q8_0] = {"Q8_0", QK4, sizeof(blk_q8_0), QT_Q8_0},
    /* Dot-only types; dotting them with themselves is defined for completeness. */
    [QT_Q8_1] = {"Q8_1", QK4, sizeof(blk_q8_1), QT_Q8_1},
    [QT_Q4_K] = {"Q4_K", QKK, sizeof(blk_q4_k), QT_Q8_K},
    [QT_Q5_K] = {"Q5_K", QKK, sizeof(blk_q5_k), QT_Q8_K},
    [QT_Q6_K] = {"Q6_K", QKK, sizeof(blk_q6_k), QT_Q8_K},
    [QT_Q8_K] = {"Q8_K", QKK, sizeof(blk_q8_k), QT_Q8_K},
};

const quant_traits *quant_traits_of(uint32_t type) {
    if (type >= QT_COUNT || !traits[type].name) return NULL;
    return &traits[type];
}

const char *quant_type_name(uint32_t type) {
    static const char *ggml[] = {
        [0] = "F32", [1] = "F16", [2] = "Q4_0", [3] = "Q4_1", [6] = "Q5_0", [7] = "Q5_1",
        [8] = "Q8_0", [9] = "Q8_1", [10] = "Q2_K", [11] = "Q3_K", [12] = "Q4_K", [13] = "Q5_K",
        [14] = "Q6_K", [15] = "Q8_K", [16] = "IQ2_XXS", [17] = "IQ2_XS", [18] = "IQ3_XXS",
        [19] = "IQ1_S", [20] = "IQ4_NL", [21] = "IQ3_S", [22] = "IQ2_S", [23] = "IQ4_XS",
        [24] = "I8", [25] = "I16", [26] = "I32", [27] = "I64", [28] = "F64", [29] = "IQ1_M",
        [30] = "BF16", [34] = "TQ1_0", [35] = "TQ2_0", [39] = "MXFP4",
    };
    return type < sizeof ggml / sizeof ggml[0] ? ggml[type] : NULL;
}

size_t quant_row_size(uint32_t type, int64_t n) {
    const quant_traits *t = quant_traits_of(type);
    if (!t || n < 0 || n % t->block) return 0;
    return (size_t)(n / t->block) * t->bytes;
}

/* ---------------------------------------------------------------- fp16 / bf16 */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float quant_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f) return bits_f32(sign | 0x7f800000 | (m << 13)); /* inf / nan */
    if (e == 0) {
        if (m == 0) return bits_f32(sign);
        /* subnormal: m * 2^-24, exact in f32 */
        float v = (float)m * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t quant_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    x &= 0x7fffffff;
    if (x > 0x7f800000) /* nan: keep it quiet and the top payload bits, as F16C does */
        return (uint16_t)(sign | 0x7e00 | ((x >> 13) & 0x3ff));
    if (x >= 0x47800000) return sign | 0x7c00; /* >= 65536 (or inf): infinity */
    if (x < 0x38800000) {                      /* below 2^-14: half subnormal or 0 */
        if (x < 0x33000000) return sign;       /* <= 2^-25 rounds to zero (even) */
        uint32_t e = x >> 23, m = (x & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* units of 2^-24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    /* normal: rebias the exponent, round the 13 dropped bits to nearest even; a carry
     * out of the mantissa correctly bumps the exponent (up to infinity). */
    uint32_t h = (x >> 13) - (112u << 10), rem = x & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

float quant_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t quant_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

#define H2F quant_f16_to_f32
#define F2H quant_f32_to_f16

/* ---------------------------------------------------------------- dequant refs */

static void dq_f32(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}
static void dq_f16(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = H2F(s[i]);
}
static void dq_bf16(const void *src, float *dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = quant_bf16_to_f32(s[i]);
}
static void dq_q4_0(const void *src, float *dst, int64_t n) {
    const blk_q4_0 *b = src;
    for (int64_t i = 0; i < n / QK4; i++, dst += QK4) {
        float d = H2F(b[i].d);
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)((b[i].qs[j] & 0xF) - 8);
            dst[j + 16] = d * (float)((b[i].qs[j] >> 4) - 8);
        }
    }
}
static void dq_q4_1(const void *src, float *dst, int64_t n) {
    const blk_q4_1 *b = src;
    for (int64_t i = 0; i < n / QK4; i++, dst += QK4) {
        float d = H2F(b[i].d), m = H2F(b[i].m);
        for (int j = 0; j < 16; j++) {
            dst[j] = d * (float)(b[i].qs[j] & 0xF) + m;
            dst[j + 16] = d * (float)(b[i].qs[j] >> 4) + m;
        }
    }
}
/* 5-bit value j (0..31) of a Q5 block: low nibble from qs, 5th bit from qh. */
static inline int q5_get(const uint8_t *qs, const uint8_t *qh, int j) {
    uint32_t h;
    memcpy(&h, qh, 4); /* little-endian: bit j is element j */
    int lo = j < 16 ? (qs[j] & 0xF) : (qs[j - 16] >> 4);
    return lo | (int)(((h >> j) & 1) << 4);
}
static void dq_q5_0(const void *src, float *dst, int64_t n) {
    const blk_q5_0 *b = src;
    for (int64_t i = 0; i < n / QK4; i++, dst += QK4) {
        float d = H2F(b[i].d);
        for (int j = 0; j < 32; j++) dst[j] = d * (float)(q5_get(b[i].qs, b[i].qh, j) - 16);
    }
}
static void dq_q5_1(const void *src, float *dst, int64_t n) {
    const blk_q5_1 *b = src;
    for (int64_t i = 0; i < n / QK4; i++, dst += QK4) {
        float d = H2F(b[i].d), m = H2F(b[i].m);
        for (int j = 0; j < 32; j++) dst[j] = d * (float)q5_get(b[i].qs, b[i].qh, j) + m;
    }
}
static void dq_q8_0(const void *src, float *dst, int64_t n) {
    const blk_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK4; i++, dst += QK4) {
        float d = H2F(b[i].d);
        for (int j = 0; j < 32; j++) dst[j] = d * (float)b[i].qs[j];
    }
}
static void dq_q8_1(const void *src, float *dst, int64_t n) {
    const blk_q8_1 *b = src;
    for (int64_t i = 0; i < n / QK4; i++, dst += QK4) {
        float d = H2F(b[i].d);
        for (int j = 0; j < 32; j++) dst[j] = d * (float)b[i].qs[j];
    }
}
static void dq_q4_k(const void *src, float *dst, int64_t n) {
    const blk_q4_k *b = src;
    for (int64_t i = 0; i < n / QKK; i++, dst += QKK) {
        float d = H2F(b[i].d), dmin = H2F(b[i].dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            quant_scale_min_k4(j, b[i].scales, &sc, &m);
            float ds = d * sc, dm = dmin * m;
            const uint8_t *q = b[i].qs + (j / 2) * 32;
            int shift = (j & 1) * 4;
            for (int l = 0; l < 32; l++) dst[j * 32 + l] = ds * (float)((q[l] >> shift) & 0xF) - dm;
        }
    }
}
static void dq_q5_k(const void *src, float *dst, int64_t n) {
    const blk_q5_k *b = src;
    for (int64_t i = 0; i < n / QKK; i++, dst += QKK) {
        float d = H2F(b[i].d), dmin = H2F(b[i].dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            quant_scale_min_k4(j, b[i].scales, &sc, &m);
            float ds = d * sc, dm = dmin * m;
            const uint8_t *q = b[i].qs + (j / 2) * 32;
            int shift = (j & 1) * 4;
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> shift) & 0xF) | (((b[i].qh[l] >> j) & 1) << 4);
                dst[j * 32 + l] = ds * (float)v - dm;
            }
        }
    }
}
static void dq_q6_k(const void *src, float *dst, int64_t n) {
    const blk_q6_k *b = src;
    for (int64_t i = 0; i < n / QKK; i++, dst += QKK) {
        float d = H2F(b[i].d);
        for (int e = 0; e < QKK; e++) dst[e] = d * (float)b[i].scales[e / 16] * (float)quant_q6k_get(&b[i], e);
    }
}
static void dq_q8_k(const void *src, float *dst, int64_t n) {
    const blk_q8_k *b = src;
    for (int64_t i = 0; i < n / QKK; i++, dst += QKK)
        for (int j = 0; j < QKK; j++) dst[j] = b[i].d * (float)b[i].qs[j];
}

/* ---------------------------------------------------------------- quantize refs */

/* ggml's rounding: to nearest, ties away from zero. */
static inline int round_i(float x) { return (int)roundf(x); }
static inline float amax_of(const float *x, int n) {
    float a = 0;
    for (int j = 0; j < n; j++) a = fmaxf(a, fabsf(x[j]));
    return a;
}

static void q_f32(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }
static void q_f16(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = F2H(src[i]);
}
/* Magnitudes under 2^-48 become zero: as BF16's dot type that keeps every product and
 * sum of the dot clear of the denormals, which vdpbf16ps flushes and an FMA does not
 * (qpack.h); as weights, nothing a model holds. */
static void q_bf16(const float *src, void *dst, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++)
        d[i] = (f32_bits(src[i]) & 0x7fffffff) < QUANT_BF16_FLOOR ? (uint16_t)(f32_bits(src[i]) >> 16 & 0x8000)
                                                                  : quant_f32_to_bf16(src[i]);
}
/* Q8_0 / Q8_1: d = amax/127, q = round(x/d). Q8_1 also stores s = d*sum(q). */
static void q_q8_0(const float *src, void *dst, int64_t n) {
    blk_q8_0 *b = dst;
    for (int64_t i = 0; i < n / QK4; i++, src += QK4) {
        float d = amax_of(src, QK4) / 127.0f, id = d ? 1.0f / d : 0.0f;
        b[i].d = F2H(d);
        for (int j = 0; j < QK4; j++) b[i].qs[j] = (int8_t)round_i(src[j] * id);
    }
}
static void q_q8_1(const float *src, void *dst, int64_t n) {
    blk_q8_1 *b = dst;
    for (int64_t i = 0; i < n / QK4; i++, src += QK4) {
        float d = amax_of(src, QK4) / 127.0f, id = d ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK4; j++) {
            b[i].qs[j] = (int8_t)round_i(src[j] * id);
            sum += b[i].qs[j];
        }
        b[i].d = F2H(d);
        b[i].s = F2H((float)sum * d);
    }
}
/* Q8_K: per 256 block, d = amax/127 kept in f32, q in [-127, 127], plus the 16-element
 * sums the K-quant dots use for their min terms. */
static void q_q8_k(const float *src, void *dst, int64_t n) {
    blk_q8_k *b = dst;
    for (int64_t i = 0; i < n / QKK; i++, src += QKK) {
        float amax = amax_of(src, QKK);
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        b[i].d = d;
        for (int j = 0; j < QKK; j++) b[i].qs[j] = (int8_t)round_i(src[j] * id);
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += b[i].qs[j * 16 + l];
            b[i].bsums[j] = (int16_t)s;
        }
    }
}
/* Weight quantizers: ggml's reference rules for the 32-blocks (same bytes as gguf's
 * quantize). Used to make test data and for completeness; models come pre-quantized. */
static void q_q4_0(const float *src, void *dst, int64_t n) {
    blk_q4_0 *b = dst;
    for (int64_t i = 0; i < n / QK4; i++, src += QK4) {
        float amax = 0, max = 0;
        for (int j = 0; j < QK4; j++)
            if (fabsf(src[j]) > amax) amax = fabsf(src[j]), max = src[j];
        float d = max / -8, id = d ? 1.0f / d : 0.0f;
        b[i].d = F2H(d);
        for (int j = 0; j < 16; j++) {
            int a = (int)(src[j] * id + 8.5f), c = (int)(src[j + 16] * id + 8.5f);
            a = a > 15 ? 15 : a;
            c = c > 15 ? 15 : c;
            b[i].qs[j] = (uint8_t)(a | (c << 4));
        }
    }
}
static void q_q4_1(const float *src, void *dst, int64_t n) {
    blk_q4_1 *b = dst;
    for (int64_t i = 0; i < n / QK4; i++, src += QK4) {
        float mn = src[0], mx = src[0];
        for (int j = 1; j < QK4; j++) mn = fminf(mn, src[j]), mx = fmaxf(mx, src[j]);
        float d = (mx - mn) / 15, id = d ? 1.0f / d : 0.0f;
        b[i].d = F2H(d);
        b[i].m = F2H(mn);
        for (int j = 0; j < 16; j++) {
            int a = (int)((src[j] - mn) * id + 0.5f), c = (int)((src[j + 16] - mn) * id + 0.5f);
            a = a > 15 ? 15 : a;
            c = c > 15 ? 15 : c;
            b[i].qs[j] = (uint8_t)(a | (c << 4));
        }
    }
}
/* Pack 32 five-bit values into Q5 qs/qh. */
static void q5_pack(const int *q, uint8_t *qs, uint8_t *qh) {
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
    for (int j = 0; j < 32; j++) h |= (uint32_t)((q[j] >> 4) & 1) << j;
    memcpy(qh, &h, 4);
}
static void q_q5_0(const float *src, void *dst, int64_t n) {
    blk_q5_0 *b = dst;
    for (int64_t i = 0; i < n / QK4; i++, src += QK4) {
        float amax = 0, max = 0;
        for (int j = 0; j < QK4; j++)
            if (fabsf(src[j]) > amax) amax = fabsf(src[j]), max = src[j];
        float d = max / -16, id = d ? 1.0f / d : 0.0f;
        int q[32];
        for (int j = 0; j < QK4; j++) {
            int v = (int)(src[j] * id + 16.5f);
            q[j] = v > 31 ? 31 : v;
        }
        b[i].d = F2H(d);
        q5_pack(q, b[i].qs, b[i].qh);
    }
}
static void q_q5_1(const float *src, void *dst, int64_t n) {
    blk_q5_1 *b = dst;
    for (int64_t i = 0; i < n / QK4; i++, src += QK4) {
        float mn = src[0], mx = src[0];
        for (int j = 1; j < QK4; j++) mn = fminf(mn, src[j]), mx = fmaxf(mx, src[j]);
        float d = (mx - mn) / 31, id = d ? 1.0f / d : 0.0f;
        int q[32];
        for (int j = 0; j < QK4; j++) {
            int v = (int)((src[j] - mn) * id + 0.5f);
            q[j] = v > 31 ? 31 : v;
        }
        b[i].d = F2H(d);
        b[i].m = F2H(mn);
        q5_pack(q, b[i].qs, b[i].qh);
    }
}
/* Q4_K / Q5_K, a simple (not error-optimal) rule: per sub-block of 32, range
 * [min(0, lo), hi]; 6-bit scales/mins relative to the block's f16 d/dmin; values
 * rounded against the scales as stored. nmax is 15 (Q4_K) or 31 (Q5_K). */
static void quant_k_sub(const float *x, int nmax, uint16_t *pd, uint16_t *pdmin,
                        uint8_t scales[12], int q[256]) {
    float sub_scale[8], sub_min[8], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float lo = 0, hi = x[j * 32];
        for (int l = 0; l < 32; l++) lo = fminf(lo, x[j * 32 + l]), hi = fmaxf(hi, x[j * 32 + l]);
        sub_scale[j] = (hi - lo) / (float)nmax;
        sub_min[j] = -lo;
        max_scale = fmaxf(max_scale, sub_scale[j]);
        max_min = fmaxf(max_min, sub_min[j]);
    }
    *pd = F2H(max_scale / 63);
    *pdmin = F2H(max_min / 63);
    float d = H2F(*pd), dmin = H2F(*pdmin);
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) {
        int s = d ? round_i(sub_scale[j] / d) : 0, m = dmin ? round_i(sub_min[j] / dmin) : 0;
        sc[j] = (uint8_t)(s > 63 ? 63 : s);
        mn[j] = (uint8_t)(m > 63 ? 63 : m);
        float ds = d * sc[j], dm = dmin * mn[j];
        for (int l = 0; l < 32; l++) {
            int v = ds ? round_i((x[j * 32 + l] + dm) / ds) : 0;
            q[j * 32 + l] = v < 0 ? 0 : v > nmax ? nmax : v;
        }
    }
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        scales[j + 4] = (uint8_t)((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
        scales[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
    }
}
static void q_q4_k(const float *src, void *dst, int64_t n) {
    blk_q4_k *b = dst;
    for (int64_t i = 0; i < n / QKK; i++, src += QKK) {
        int q[256];
        quant_k_sub(src, 15, &b[i].d, &b[i].dmin, b[i].scales, q);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                b[i].qs[c * 32 + l] = (uint8_t)(q[c * 64 + l] | (q[c * 64 + 32 + l] << 4));
    }
}
static void q_q5_k(const float *src, void *dst, int64_t n) {
    blk_q5_k *b = dst;
    for (int64_t i = 0; i < n / QKK; i++, src += QKK) {
        int q[256];
        quant_k_sub(src, 31, &b[i].d, &b[i].dmin, b[i].scales, q);
        memset(b[i].qh, 0, 32);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                b[i].qs[c * 32 + l] = (uint8_t)((q[c * 64 + l] & 0xF) | ((q[c * 64 + 32 + l] & 0xF) << 4));
        for (int j = 0; j < 8; j++)
            for (int l = 0; l < 32; l++) b[i].qh[l] |= (uint8_t)(((q[j * 32 + l] >> 4) & 1) << j);
    }
}
/* Q6_K: per sub-block of 16, scale = amax/31; 8-bit scales relative to f16 d. */
static void q_q6_k(const float *src, void *dst, int64_t n) {
    blk_q6_k *b = dst;
    for (int64_t i = 0; i < n / QKK; i++, src += QKK) {
        float sub[16], maxs = 0;
        for (int j = 0; j < 16; j++) maxs = fmaxf(maxs, sub[j] = amax_of(src + j * 16, 16) / 31);
        b[i].d = F2H(maxs / 127);
        float d = H2F(b[i].d);
        memset(b[i].ql, 0, sizeof b[i].ql);
        memset(b[i].qh, 0, sizeof b[i].qh);
        for (int j = 0; j < 16; j++) {
            int s = d ? round_i(sub[j] / d) : 0;
            b[i].scales[j] = (int8_t)(s > 127 ? 127 : s);
        }
        for (int e = 0; e < QKK; e++) {
            float ds = d * b[i].scales[e / 16];
            int v = ds ? round_i(src[e] / ds) : 0;
            v = (v < -32 ? -32 : v > 31 ? 31 : v) + 32;
            int h = e / 128, t = (e % 128) / 32, l = e % 32;
            b[i].ql[h * 64 + (t & 1) * 32 + l] |= (uint8_t)((v & 0xF) << ((t >> 1) * 4));
            b[i].qh[h * 32 + l] |= (uint8_t)((v >> 4) << (2 * t));
        }
    }
}

/* ---------------------------------------------------------------- dot refs */

static float dot_f32(int64_t n, const void *w, const void *xq) {
    const float *a = w, *x = xq;
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * x[i];
    return s;
}
static float dot_f16(int64_t n, const void *w, const void *xq) {
    const uint16_t *a = w;
    const float *x = xq;
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += H2F(a[i]) * x[i];
    return s;
}
static float dot_bf16(int64_t n, const void *w, const void *xq) {
    const uint16_t *a = w, *x = xq;
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += quant_bf16_to_f32(a[i]) * quant_bf16_to_f32(x[i]);
    return s;
}
/* sum_b d_w*d_x * sum_j (q_w - 8) * q_x */
static float dot_q4_0(int64_t n, const void *w, const void *xq) {
    const blk_q4_0 *a = w;
    const blk_q8_0 *x = xq;
    float s = 0;
    for (int64_t i = 0; i < n / QK4; i++) {
        int sum = 0;
        for (int j = 0; j < 16; j++)
            sum += ((a[i].qs[j] & 0xF) - 8) * x[i].qs[j] + ((a[i].qs[j] >> 4) - 8) * x[i].qs[j + 16];
        s += H2F(a[i].d) * H2F(x[i].d) * (float)sum;
    }
    return s;
}
/* sum_b d_w*d_x * sum_j q_w*q_x + m_w * s_x, s_x = d_x * sum_j q_x */
static float dot_q4_1(int64_t n, const void *w, const void *xq) {
    const blk_q4_1 *a = w;
    const blk_q8_1 *x = xq;
    float s = 0;
    for (int64_t i = 0; i < n / QK4; i++) {
        int sum = 0;
        for (int j = 0; j < 16; j++)
            sum += (a[i].qs[j] & 0xF) * x[i].qs[j] + (a[i].qs[j] >> 4) * x[i].qs[j + 16];
        s += H2F(a[i].d) * H2F(x[i].d) * (float)sum + H2F(a[i].m) * H2F(x[i].s);
    }
    return s;
}
static float dot_q5_0(int64_t n, const void *w, const void *xq) {
    const blk_q5_0 *a = w;
    const blk_q8_0 *x = xq;
    float s = 0;
    for (int64_t i = 0; i < n / QK4; i++) {
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += (q5_get(a[i].qs, a[i].qh, j) - 16) * x[i].qs[j];
        s += H2F(a[i].d) * H2F(x[i].d) * (float)sum;
    }
    return s;
}
static float dot_q5_1(int64_t n, const void *w, const void *xq) {
    const blk_q5_1 *a = w;
    const blk_q8_1 *x = xq;
    float s = 0;
    for (int64_t i = 0; i < n / QK4; i++) {
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += q5_get(a[i].qs, a[i].qh, j) * x[i].qs[j];
        s += H2F(a[i].d) * H2F(x[i].d) * (float)sum + H2F(a[i].m) * H2F(x[i].s);
    }
    return s;
}
static float dot_q8_0(int64_t n, const void *w, const void *xq) {
    const blk_q8_0 *a = w, *x = xq;
    float s = 0;
    for (int64_t i = 0; i < n / QK4; i++) {
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += a[i].qs[j] * x[i].qs[j];
        s += H2F(a[i].d) * H2F(x[i].d) * (float)sum;
    }
    return s;
}
static float dot_q8_1(int64_t n, const void *w, const void *xq) {
    const blk_q8_1 *a = w, *x = xq;
    float s = 0;
    for (int64_t i = 0; i < n / QK4; i++) {
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += a[i].qs[j] * x[i].qs[j];
        s += H2F(a[i].d) * H2F(x[i].d) * (float)sum;
    }
    return s;
}
/* K-quants against Q8_K: per sub-block integer sums times the 6-bit scale; the min
 * term uses the activation's bsums: sum_j m_j * sum(q_x over sub-block j). */
static float dot_q4_k(int64_t n, const void *w, const void *xq) {
    const blk_q4_k *a = w;
    const blk_q8_k *x = xq;
    float s = 0;
    for (int64_t i = 0; i < n / QKK; i++) {
        int sumq = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            quant_scale_min_k4(j, a[i].scales, &sc, &m);
            const uint8_t *q = a[i].qs + (j / 2) * 32;
            int shift = (j & 1) * 4, sum = 0;
            for (int l = 0; l < 32; l++) sum += ((q[l] >> shift) & 0xF) * x[i].qs[j * 32 + l];
            sumq += sc * sum;
            summ += m * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
        }
        s += x[i].d * (H2F(a[i].d) * (float)sumq - H2F(a[i].dmin) * (float)summ);
    }
    return s;
}
static float dot_q5_k(int64_t n, const void *w, const void *xq) {
    const blk_q5_k *a = w;
    const blk_q8_k *x = xq;
    float s = 0;
    for (int64_t i = 0; i < n / QKK; i++) {
        int sumq = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            quant_scale_min_k4(j, a[i].scales, &sc, &m);
            const uint8_t *q = a[i].qs + (j / 2) * 32;
            int shift = (j & 1) * 4, sum = 0;
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> shift) & 0xF) | (((a[i].qh[l] >> j) & 1) << 4);
                sum += v * x[i].qs[j * 32 + l];
            }
            sumq += sc * sum;
            summ += m * (x[i].bsums[2 * j] + x[i].bsums[2 * j + 1]);
        }
        s += x[i].d * (H2F(a[i].d) * (float)sumq - H2F(a[i].dmin) * (float)summ);
    }
    return s;
}
static float dot_q6_k(int64_t n, const void *w, const void *xq) {
    const blk_q6_k *a = w;
    const blk_q8_k *x = xq;
    float s = 0;
    for (int64_t i = 0; i < n / QKK; i++) {
        int sumq = 0;
        for (int j = 0; j < 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += quant_q6k_get(&a[i], j * 16 + l) * x[i].qs[j * 16 + l];
            sumq += a[i].scales[j] * sum;
        }
        s += x[i].d * H2F(a[i].d) * (float)sumq;
    }
    return s;
}
static float dot_q8_k(int64_t n, const void *w, const void *xq) {
    const blk_q8_k *a = w, *x = xq;
    float s = 0;
    for (int64_t i = 0; i < n / QKK; i++) {
        int sum = 0;
        for (int j = 0; j < QKK; j++) sum += a[i].qs[j] * x[i].qs[j];
        s += a[i].d * x[i].d * (float)sum;
    }
    return s;
}

static const quant_kernels ref_kernels[QT_COUNT] = {
    [QT_F32]  = {dq_f32, q_f32, dot_f32, NULL, NULL},
    [QT_F16]  = {dq_f16, q_f16, dot_f16, NULL, NULL},
    [QT_BF16] = {dq_bf16, q_bf16, dot_bf16, NULL, NULL},
    [QT_Q4_0] = {dq_q4_0, q_q4_0, dot_q4_0, NULL, NULL},
    [QT_Q4_1] = {dq_q4_1, q_q4_1, dot_q4_1, NULL, NULL},
    [QT_Q5_0] = {dq_q5_0, q_q5_0, dot_q5_0, NULL, NULL},
    [QT_Q5_1] = {dq_q5_1, q_q5_1, dot_q5_1, NULL, NULL},
    [QT_Q8_0] = {dq_q8_0, q_q8_0, dot_q8_0, NULL, NULL},
    [QT_Q8_1] = {dq_q8_1, q_q8_1, dot_q8_1, NULL, NULL},
    [QT_Q4_K] = {dq_q4_k, q_q4_k, dot_q4_k, NULL, NULL},
    [QT_Q5_K] = {dq_q5_k, q_q5_k, dot_q5_k, NULL, NULL},
    [QT_Q6_K] = {dq_q6_k, q_q6_k, dot_q6_k, NULL, NULL},
    [QT_Q8_K] = {dq_q8_k, q_q8_k, dot_q8_k, NULL, NULL},
};

void quant_dequant_ref(uint32_t type, const void *src, float *dst, int64_t n) {
    if (quant_traits_of(type)) ref_kernels[type].dequant(src, dst, n);
}
void quant_quantize_ref(uint32_t type, const float *src, void *dst, int64_t n) {
    if (quant_traits_of(type)) ref_kernels[type].quantize(src, dst, n);
}
float quant_dot_ref(uint32_t type, int64_t n, const void *w, const void *xq) {
    return quant_traits_of(type) ? ref_kernels[type].dot(n, w, xq) : 0.0f;
}

/* ---------------------------------------------------------------- dispatch */

/* The kernel table: one row per dispatch slot (isa.h), filled once, bottom-up. */
static quant_kernels kernels[ISA_SLOTS][QT_COUNT];
static pthread_once_t kernels_once = PTHREAD_ONCE_INIT;

static void kernels_init(void) {
    memcpy(kernels[ISA_SCALAR], ref_kernels, sizeof ref_kernels);
    /* Only slots the CPU has: the register functions live in files compiled for
     * their ISA, so even calling one may execute instructions the CPU lacks. */
    int top = isa_amx_max() ? ISA_SLOT_AMX_ALL : isa_max();
    for (int sl = ISA_AVX2; sl <= top; sl++) {
        quant_kernels k[QT_COUNT];
        memset(k, 0, sizeof k);
        if (sl == ISA_AVX2) quant_register_avx2(k);
        else if (sl == ISA_AVX512) quant_register_avx512(k);
        else quant_register_amx(k, sl == ISA_SLOT_AMX_ALL);
        for (int t = 0; t < QT_COUNT; t++) {
            quant_kernels *dst = &kernels[sl][t];
            /* each AMX row builds on AVX-512's, not on the one before it */
            *dst = kernels[sl == ISA_SLOT_AMX_ALL ? ISA_AVX512 : sl - 1][t];
            if (k[t].dequant) dst->dequant = k[t].dequant;
            if (k[t].quantize) dst->quantize = k[t].quantize;
            /* A new dot makes the level below's rows/tile (built on the old dot)
             * stale; drop them unless this level brings its own. */
            if (k[t].dot) dst->dot = k[t].dot, dst->rows = NULL, dst->tile = NULL;
            if (k[t].rows) dst->rows = k[t].rows, dst->tile = NULL;
            if (k[t].tile) dst->tile = k[t].tile;
        }
    }
}

static inline const quant_kernels *kern(uint32_t type) {
    pthread_once(&kernels_once, kernels_init);
    return *ISA_PICK(kernels) + type; /* the slot's row, then the type */
}

void quant_dequant(uint32_t type, const void *src, float *dst, int64_t n) {
    if (quant_traits_of(type)) kern(type)->dequant(src, dst, n);
}
void quant_quantize(uint32_t type, const float *src, void *dst, int64_t n) {
    if (quant_traits_of(type)) kern(type)->quantize(src, dst, n);
}
float quant_dot(uint32_t type, int64_t n, const void *w, const void *xq) {
    return quant_traits_of(type) ? kern(type)->dot(n, w, xq) : 0.0f;
}
void quant_dot_rows(uint32_t type, int64_t n, const void *w, size_t wstride, int nr,
                    const void *xq, float *out) {
    if (!quant_traits_of(type)) return;
    const quant_kernels *k = kern(type);
    if (k->rows) {
        k->rows(n, w, wstride, nr, xq, out);
        return;
    }
    for (int r = 0; r < nr; r++) out[r] = k->dot(n, (const char *)w + (size_t)r * wstride, xq);
}
void quant_dot_tile(uint32_t type, int64_t n, const void *w, size_t wstride, int nr,
                    const void *xq, size_t xstride, int nc, float *out, size_t ostride) {
    if (!quant_traits_of(type)) return;
    const quant_kernels *k = kern(type);
    if (k->tile) {
        k->tile(n, w, wstride, nr, xq, xstride, nc, out, ostride);
        return;
    }
    for (int c = 0; c < nc; c++)
        quant_dot_rows(type, n, w, wstride, nr, (const char *)xq + (size_t)c * xstride,
                       out + (size_t)c * ostride);
}
