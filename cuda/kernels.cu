/* kernels: the CUDA backend's device code, compiled by nvcc into one fatbin that kilnd
 * embeds (cuda/fatbin.S) and loads with cuModuleLoadData. Every kernel is extern "C" so
 * the host looks it up by its plain name; cuda/kern.h has the launch wrappers and
 * cuda/kern.c the geometry. Each kernel has a CPU reference in core/ (model.c; cpu/attn.c,
 * quant.c) that tests/gpu/gpu_test.c compares it with.
 *
 * Batch invariance (tests/gpu): every per-token result is computed by the same threads
 * in the same order whatever else is in the batch: the matmul reduces each (row, token)
 * pair over a fixed lane partition, attention visits a sequence's keys in fixed tiles of
 * positions, norms reduce one row per block. So a request's tokens never depend on its
 * neighbours, as on the CPU. */
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#ifdef __CUDACC_RTC__
/* NVRTC (the GPU image's CUDA 12.4 build, scripts/cuda_fatbin.py) has no C library
 * headers; these widths hold on every CUDA target (char 8, short 16, int 32 bits). */
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
#define INFINITY __int_as_float(0x7f800000) /* math.h's, the float +inf */
#else
#include <stdint.h>
#endif

#include "core/cpu/qtypes.h" /* QT_*: the type numbers, the CPU side's own definition */

#define ATT_WARPS 8      /* warps per attention block */
#define ATT_PAIRS_WARP 8 /* (token, head) pairs one warp carries at most */
#define ATT_MAX_HD 256
#define MM_TOKENS 8      /* tokens one matmul pass holds in registers */

__device__ __forceinline__ float ld_f16(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

__device__ __forceinline__ void scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Elements [8s, 8s+8) of a weight row of `type` into v: the one dequantizer every kernel
 * uses (eight never straddle a block: blocks are 32 or 256 elements). Inlined, so a
 * caller with a constant type (k_mm's instances) keeps only its case. */
__device__ __forceinline__ void dq8(int type, const uint8_t *row, int s, float v[8]) {
    int e0 = s * 8;
    switch (type) {
    case QT_Q4_1: { /* the default model's type: 20-byte blocks, 4-byte aligned loads */
        const uint8_t *b = row + (e0 / 32) * 20;
        uint32_t dm = *(const uint32_t *)b;
        float d = __half2float(__ushort_as_half((unsigned short)(dm & 0xffff)));
        float m = __half2float(__ushort_as_half((unsigned short)(dm >> 16)));
        int j0 = e0 % 32, shift = j0 < 16 ? 0 : 4;
        const uint32_t *qs = (const uint32_t *)(b + 4 + (j0 % 16));
        uint32_t w0 = qs[0], w1 = qs[1];
        for (int i = 0; i < 4; i++) {
            v[i] = d * (float)((w0 >> (8 * i + shift)) & 0xF) + m;
            v[4 + i] = d * (float)((w1 >> (8 * i + shift)) & 0xF) + m;
        }
        return;
    }
    case QT_Q8_0: { /* 34-byte blocks: 2-byte aligned loads */
        const uint8_t *b = row + (e0 / 32) * 34;
        float d = __half2float(__ushort_as_half(*(const unsigned short *)b));
        const unsigned short *qs = (const unsigned short *)(b + 2 + e0 % 32);
        for (int i = 0; i < 4; i++) {
            unsigned short w = qs[i];
            v[2 * i] = d * (float)(int8_t)(w & 0xff);
            v[2 * i + 1] = d * (float)(int8_t)(w >> 8);
        }
        return;
    }
    case QT_F32:
        for (int i = 0; i < 8; i++) v[i] = ((const float *)row)[e0 + i];
        return;
    case QT_F16:
        for (int i = 0; i < 8; i++) v[i] = ld_f16(row + 2 * (e0 + i));
        return;
    case QT_BF16:
        for (int i = 0; i < 8; i++) {
            const uint8_t *p = row + 2 * (e0 + i);
            v[i] = __uint_as_float((unsigned)(p[0] | (p[1] << 8)) << 16);
        }
        return;
    case QT_Q4_0: case QT_Q5_0: case QT_Q5_1: {
        int bsz = type == QT_Q4_0 ? 18 : type == QT_Q4_1 ? 20 : type == QT_Q5_0 ? 22 : 24;
        const uint8_t *b = row + (e0 / 32) * bsz;
        int j0 = e0 % 32;
        float d = ld_f16(b), m = 0.0f;
        const uint8_t *qs;
        uint32_t qh = 0;
        if (type == QT_Q4_1 || type == QT_Q5_1) m = ld_f16(b + 2);
        if (type == QT_Q4_0) qs = b + 2;
        else if (type == QT_Q4_1) qs = b + 4;
        else {
            const uint8_t *h = b + (type == QT_Q5_0 ? 2 : 4);
            qh = h[0] | (h[1] << 8) | (h[2] << 16) | ((uint32_t)h[3] << 24);
            qs = h + 4;
        }
        for (int i = 0; i < 8; i++) {
            int j = j0 + i;
            int q = j < 16 ? (qs[j] & 0xF) : (qs[j - 16] >> 4);
            if (type == QT_Q5_0 || type == QT_Q5_1) q |= ((qh >> j) & 1) << 4;
            v[i] = type == QT_Q4_0 ? d * (float)(q - 8)
                 : type == QT_Q5_0 ? d * (float)(q - 16)
                 : d * (float)q + m;
        }
        return;
    }
    case QT_Q4_K: case QT_Q5_K: {
        const uint8_t *b = row + (e0 / 256) * (type == QT_Q4_K ? 144 : 176);
        int e = e0 % 256, j = e / 32, l0 = e % 32, sc, mn;
        scale_min_k4(j, b + 4, &sc, &mn);
        float ds = ld_f16(b) * (float)sc, dm = ld_f16(b + 2) * (float)mn;
        const uint8_t *qh = b + 16; /* Q5_K only */
        const uint8_t *q = b + (type == QT_Q4_K ? 16 : 48) + (j / 2) * 32;
        int shift = (j & 1) * 4;
        for (int i = 0; i < 8; i++) {
            int l = l0 + i, x = (q[l] >> shift) & 0xF;
            if (type == QT_Q5_K) x |= ((qh[l] >> j) & 1) << 4;
            v[i] = ds * (float)x - dm;
        }
        return;
    }
    case QT_Q6_K: {
        const uint8_t *b = row + (e0 / 256) * 210;
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *scales = (const int8_t *)(b + 192);
        float d = ld_f16(b + 208);
        int e = e0 % 256, h = e / 128, t = (e % 128) / 32, l0 = e % 32;
        float ds = d * (float)scales[e / 16];
        for (int i = 0; i < 8; i++) {
            int l = l0 + i;
            int lo = (ql[h * 64 + (t & 1) * 32 + l] >> ((t >> 1) * 4)) & 0xF;
            int hi = (qh[h * 32 + l] >> (2 * t)) & 3;
            v[i] = ds * (float)((lo | (hi << 4)) - 32);
        }
        return;
    }
    default:
        for (int i = 0; i < 8; i++) v[i] = __int_as_float(0x7fc00000); /* NaN: caught by tests */
    }
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

extern "C" {

/* x[t] = row tokens[t] of the embedding matrix. grid (T), any block size. */
__global__ void k_embed(float *x, const uint8_t *w, int type, long long row_bytes,
                        const int *tokens, int d) {
    int t = blockIdx.x;
    const uint8_t *row = w + (long long)tokens[t] * row_bytes;
    for (int s = threadIdx.x; s < d / 8; s += blockDim.x) {
        float v[8];
        dq8(type, row, s, v);
        for (int i = 0; i < 8; i++) x[(long long)t * d + s * 8 + i] = v[i];
    }
}

/* out[i] = rmsnorm(x[rows ? rows[i] : i]) * w. grid (n), block 256. */
__global__ void k_rmsnorm(float *out, const float *x, const float *w, int d, float eps,
                          const int *rows) {
    __shared__ float part[32];
    int i = blockIdx.x, src = rows ? rows[i] : i;
    const float *xr = x + (long long)src * d;
    float ss = 0.0f;
    for (int k = threadIdx.x; k < d; k += blockDim.x) ss += xr[k] * xr[k];
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    float scale = rsqrtf(part[0] / (float)d + eps);
    for (int k = threadIdx.x; k < d; k += blockDim.x)
        out[(long long)i * d + k] = xr[k] * scale * w[k];
}

} /* extern "C": the matmul body is a template, one instance per weight type */

/* out[t][r] (=, or += with add) dot(W row r, x[t]) + bias[r], for T tokens.
 * grid (ceil(n_out / warps), ceil(T / MM_TOKENS)), block 32*warps: one warp per row and
 * tile of MM_TOKENS tokens, each lane a fixed set of 8-element slices. The same code and
 * order for every T, so a token's result never depends on the batch; the token tiles in
 * the grid's y keep every SM busy on long prefills. */
template <int TYPE>
__device__ __forceinline__ void mm_body(int type, const uint8_t *w, long long row_bytes, int n_in, int n_out,
                     const float *x, int xstride, float *out, int ostride, int T, int add,
                     const float *bias) {
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= n_out) return;
    const uint8_t *row = w + (long long)r * row_bytes;
    int n_s = n_in / 8, t0 = blockIdx.y * MM_TOKENS;
    int nt = T - t0 < MM_TOKENS ? T - t0 : MM_TOKENS;
    float acc[MM_TOKENS];
#pragma unroll
    for (int t = 0; t < MM_TOKENS; t++) acc[t] = 0.0f;
    for (int s = lane; s < n_s; s += 32) {
        float v[8];
        dq8(TYPE < 0 ? type : TYPE, row, s, v);
#pragma unroll
        for (int t = 0; t < MM_TOKENS; t++) {
            if (t < nt) {
                const float4 *xp = (const float4 *)(x + (long long)(t0 + t) * xstride + s * 8);
                float4 a = xp[0], b = xp[1];
                acc[t] += v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w +
                          v[4] * b.x + v[5] * b.y + v[6] * b.z + v[7] * b.w;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < MM_TOKENS; t++) {
        float sum = warp_sum(acc[t]);
        if (t < nt && lane == 0) {
            if (bias) sum += bias[r];
            float *o = out + (long long)(t0 + t) * ostride + r;
            *o = add ? *o + sum : sum;
        }
    }
}

extern "C" {

/* k_mm: mm_body for the weight type, known at compile time for the common ones. */
__global__ void k_mm(int type, const uint8_t *w, long long row_bytes, int n_in, int n_out,
                     const float *x, int xstride, float *out, int ostride, int T, int add,
                     const float *bias) {
#define MM_CASE(t) case t: mm_body<t>(type, w, row_bytes, n_in, n_out, x, xstride, out, ostride, T, add, bias); return;
    switch (type) {
    MM_CASE(QT_Q4_1) MM_CASE(QT_Q8_0) MM_CASE(QT_Q4_0) MM_CASE(QT_Q4_K) MM_CASE(QT_Q6_K)
    default: mm_body<-1>(type, w, row_bytes, n_in, n_out, x, xstride, out, ostride, T, add, bias);
    }
#undef MM_CASE
}

/* h = silu(g) * u over n floats. */
__global__ void k_swiglu(float *h, const float *g, const float *u, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) h[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* out[t][r] += bias[r] (the cuBLAS path's bias). */
__global__ void k_bias(float *out, int ostride, const float *bias, int n, int T) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * T) out[(long long)(i / n) * ostride + i % n] += bias[i % n];
}

/* RoPE on q and k of each token at its position, then k and v written as f16 into the
 * paged cache at slot[t] (= the block's first unit * block_size + offset; a unit is
 * ustride elements: a block, or half of one when the pool has 8-bit halves). grid (T),
 * block 128.
 * freq[i] is pair i's angle per position, the CPU's model_config.rope_freq (RoPE factors
 * and scaling folded in: core/model.h), and cos and sin are times mscale (YaRN's, else
 * 1): angles in double, as the CPU's rope_table, so both backends rotate alike. */
__global__ void k_rope_store(float *q, float *k, const float *v, const int *pos, const int *slot,
                             __half *kv, uint8_t *fp8, int layer, int n_heads, int n_kv, int hd,
                             int rope_dim, int neox, const double *freq, float mscale, int bs,
                             long long ustride) {
    __shared__ float cs[ATT_MAX_HD / 2][2]; /* cos, sin per rotated pair: once per token */
    int t = blockIdx.x, half = rope_dim / 2, p = pos[t];
    int qd = n_heads * hd, kd = n_kv * hd;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double theta = (double)p * freq[i];
        cs[i][0] = (float)cos(theta) * mscale;
        cs[i][1] = (float)sin(theta) * mscale;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < (n_heads + n_kv) * half; idx += blockDim.x) {
        int h = idx / half, i = idx % half;
        float *vec = h < n_heads ? q + (long long)t * qd + h * hd
                                 : k + (long long)t * kd + (h - n_heads) * hd;
        float co = cs[i][0], si = cs[i][1];
        int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float x0 = vec[a], x1 = vec[b];
        vec[a] = x0 * co - x1 * si;
        vec[b] = x0 * si + x1 * co;
    }
    __syncthreads();
    long long blk = slot[t] / bs, off = slot[t] % bs;
    long long head_elems = (long long)bs * hd;
    /* a block's first token makes it f16 again (it may be a freed 8-bit block reused) */
    if (fp8 && off == 0 && layer == 0 && threadIdx.x == 0) fp8[blk] = 0;
    for (int idx = threadIdx.x; idx < kd; idx += blockDim.x) {
        int h = idx / hd, i = idx % hd;
        long long kbase = blk * ustride + ((long long)layer * 2 * n_kv + h) * head_elems;
        long long vbase = kbase + (long long)n_kv * head_elems;
        kv[kbase + off * hd + i] = __float2half_rn(k[(long long)t * kd + idx]);
        kv[vbase + off * hd + i] = __float2half_rn(v[(long long)t * kd + idx]);
    }
}

/* Attention over the paged cache, prefill and decode alike, FlashAttention-style: a
 * block takes one query tile (up to n consecutive batch tokens of one sequence, from
 * tiles[3*i] = {table row, first token, n}) and one KV head; it streams the sequence's
 * keys through shared memory in tiles of kt positions, and each (token, query head)
 * pair keeps an online softmax in its warp's registers, skipping keys past its own
 * position (causal). The page tables hold each block's first unit (ustride elements
 * a unit). K/V come from f16 blocks, or fp8 e4m3 blocks with a scale per (block, layer,
 * K|V, head) where fp8[unit] is set; flags and scales are kept by unit.
 * grid (n_tiles, n_kv), block 32*ATT_WARPS, dynamic shared memory from kern.c. */
__global__ void k_attn(const float *q, float *out, const int *tiles, const int *pos,
                       const int *tables, int tstride, const __half *kv, const uint8_t *fp8,
                       const float *fp8_scale, int layer, int n_heads, int n_kv, int hd, int bs,
                       long long block_elems, long long ustride, int kt, float scale) {
    extern __shared__ float sm[];
    int tile = blockIdx.x, kvh = blockIdx.y, g = n_heads / n_kv;
    int trow = tiles[3 * tile], t0 = tiles[3 * tile + 1], nq = tiles[3 * tile + 2];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int pairs = nq * g, hpad = hd + 1;
    float *Ks = sm, *Vs = Ks + kt * hpad, *Qs = Vs + kt * hpad; /* Qs [pairs][hd] */
    const int *table = tables + (long long)trow * tstride;
    long long head_elems = (long long)bs * hd;
    int qd = n_heads * hd;
    for (int i = threadIdx.x; i < pairs * hd; i += blockDim.x) {
        int p = i / hd, dd = i % hd, tok = t0 + p / g, h = kvh * g + p % g;
        Qs[i] = q[(long long)tok * qd + h * hd + dd] * scale;
    }
    int maxpos = 0;
    for (int i = 0; i < nq; i++) maxpos = max(maxpos, pos[t0 + i]);
    float m[ATT_PAIRS_WARP], l[ATT_PAIRS_WARP], acc[ATT_PAIRS_WARP][ATT_MAX_HD / 32];
#pragma unroll
    for (int j = 0; j < ATT_PAIRS_WARP; j++) {
        m[j] = -INFINITY, l[j] = 0.0f;
#pragma unroll
        for (int c = 0; c < ATT_MAX_HD / 32; c++) acc[j][c] = 0.0f;
    }
    int ndim = (hd + 31) / 32;
    /* Each thread moves at most one 8-element piece of K and of V per key tile
     * (kt * hd <= 8 * blockDim, cplan_attn_geom): 16-byte loads, issued for the next
     * tile before this one is computed, so their latency hides behind the math. */
    int vec = hd / 8, item = threadIdx.x, have = 0;
    float kr[8], vr[8];
    long long kslab = ((long long)layer * 2 * n_kv + kvh) * head_elems;
    long long vslab = kslab + (long long)n_kv * head_elems;
    auto fetch = [&](int k0) {
        int nk = min(kt, maxpos + 1 - k0);
        have = item < nk * vec;
        if (!have) return;
        int j = item / vec, c8 = (item % vec) * 8, p = k0 + j;
        long long blk = table[p / bs], off = p % bs;
        long long e = off * hd + c8;
        if (fp8 && fp8[blk]) {
            const uint8_t *b8 = (const uint8_t *)(kv + blk * ustride);
            const float *sc8 = fp8_scale + blk * (block_elems / head_elems);
            uint2 kw = *(const uint2 *)(b8 + kslab + e), vw = *(const uint2 *)(b8 + vslab + e);
            float ks = sc8[kslab / head_elems], vs = sc8[vslab / head_elems];
            const uint8_t *kb = (const uint8_t *)&kw, *vb = (const uint8_t *)&vw;
            for (int i = 0; i < 8; i++) {
                __nv_fp8_e4m3 a, b;
                a.__x = kb[i], b.__x = vb[i];
                kr[i] = float(a) * ks, vr[i] = float(b) * vs;
            }
        } else {
            const __half *b = kv + blk * ustride;
            uint4 kw = *(const uint4 *)(b + kslab + e), vw = *(const uint4 *)(b + vslab + e);
            const __half *kh = (const __half *)&kw, *vh = (const __half *)&vw;
            for (int i = 0; i < 8; i++) kr[i] = __half2float(kh[i]), vr[i] = __half2float(vh[i]);
        }
    };
    fetch(0);
    for (int k0 = 0; k0 <= maxpos; k0 += kt) {
        int nk = min(kt, maxpos + 1 - k0);
        __syncthreads(); /* the previous tile is consumed (and Qs written, first time) */
        if (have) {
            int j = item / vec, c8 = (item % vec) * 8;
            for (int i = 0; i < 8; i++) Ks[j * hpad + c8 + i] = kr[i], Vs[j * hpad + c8 + i] = vr[i];
        }
        __syncthreads();
        if (k0 + kt <= maxpos) fetch(k0 + kt);
#pragma unroll
        for (int j = 0; j < ATT_PAIRS_WARP; j++) {
            int p = warp + j * ATT_WARPS;
            if (p >= pairs) break;
            int mypos = pos[t0 + p / g];
            int nvalid = min(nk, mypos + 1 - k0); /* keys this pair may see in this tile */
            if (nvalid <= 0) continue;
            const float *qv = Qs + p * hd;
            float s = -INFINITY;
            if (lane < nvalid) {
                float dot = 0.0f;
#pragma unroll 8
                for (int dd = 0; dd < hd; dd++) dot += qv[dd] * Ks[lane * hpad + dd];
                s = dot;
            }
            float mx = fmaxf(m[j], warp_max(s));
            float corr = expf(m[j] - mx);
            float pr = lane < nvalid ? expf(s - mx) : 0.0f;
            l[j] = l[j] * corr + warp_sum(pr);
            m[j] = mx;
#pragma unroll
            for (int c = 0; c < ATT_MAX_HD / 32; c++) {
                if (c < ndim) {
                    int dd = c * 32 + lane;
                    float a = acc[j][c] * corr;
                    for (int i = 0; i < nvalid; i++) {
                        float pi = __shfl_sync(0xffffffffu, pr, i);
                        if (dd < hd) a += pi * Vs[i * hpad + dd];
                    }
                    acc[j][c] = a;
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < ATT_PAIRS_WARP; j++) {
        int p = warp + j * ATT_WARPS;
        if (p >= pairs) break;
        int tok = t0 + p / g, h = kvh * g + p % g;
        float inv = l[j] > 0.0f ? 1.0f / l[j] : 0.0f;
#pragma unroll
        for (int c = 0; c < ATT_MAX_HD / 32; c++) {
            int dd = c * 32 + lane;
            if (c < ndim && dd < hd) out[(long long)tok * qd + h * hd + dd] = acc[j][c] * inv;
        }
    }
}

/* Turns whole KV blocks from f16 into fp8 e4m3 in place (the degrade ladder's 8-bit KV)
 * and flags them for attention:
 * each (layer, K|V, head) slab gets scale = absmax / 448 in scale[block][slab] (absmax
 * capped at 65504; an all-zero slab gets 1), and its
 * fp8 bytes go to byte offset slab*head_elems of the block, that is the block's first
 * half. Slabs are done in order by one CUDA block per KV block, each read whole before
 * it is written: slab i's bytes only overwrite f16 slab i/2, already consumed. Blocks
 * are given by their first unit: blocks[i], or `one` when blocks is NULL.
 * grid (n), block 256, shared memory head_elems * 4 bytes. */
__global__ void k_kv_to_fp8(__half *kv, float *scale, uint8_t *flags, const int *blocks, int one,
                            long long block_elems, long long ustride, int head_elems) {
    extern __shared__ float sm[];
    __shared__ float red[32];
    int blk = blocks ? blocks[blockIdx.x] : one;
    if (flags && flags[blk]) return; /* already 8-bit: its bytes are not f16 any more */
    __half *b = kv + (long long)blk * ustride;
    uint8_t *b8 = (uint8_t *)b;
    int n_slabs = (int)(block_elems / head_elems);
    for (int sl = 0; sl < n_slabs; sl++) {
        float mx = 0.0f;
        for (int i = threadIdx.x; i < head_elems; i += blockDim.x) {
            float v = __half2float(b[(long long)sl * head_elems + i]);
            sm[i] = v;
            /* an f16 infinity or NaN counts as the largest finite f16 (fminf drops a
             * NaN), as mm/kv8.c's int8 does: one broken value saturates, it does not
             * make the slab's scale infinite and every value of it NaN */
            mx = fmaxf(mx, fminf(fabsf(v), 65504.0f));
        }
        mx = warp_max(mx);
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
        __syncthreads();
        if (threadIdx.x == 0) {
            float v = 0.0f;
            for (int w = 0; w < (int)(blockDim.x >> 5); w++) v = fmaxf(v, red[w]);
            red[0] = v > 0.0f ? v / 448.0f : 1.0f;
            scale[(long long)blk * n_slabs + sl] = red[0];
        }
        __syncthreads();
        float inv = 1.0f / red[0];
        for (int i = threadIdx.x; i < head_elems; i += blockDim.x) {
            float y = sm[i] * inv; /* +-inf saturates to +-448 (the SATFINITE conversion) */
            __nv_fp8_e4m3 f(y == y ? y : 0.0f); /* a NaN to 0, as the CPU's int8 */
            b8[(long long)sl * head_elems + i] = *(uint8_t *)&f;
        }
        __syncthreads();
    }
    if (flags && threadIdx.x == 0) flags[blk] = 1; /* attention now reads it as fp8 */
}

/* The fp8 block at unit src as f16 into the free block at unit dst (copy-on-write of an
 * 8-bit block before a write: mm/kv.h's kv_ext expand), flagged f16. The two never
 * overlap. grid (slabs), block 256. */
__global__ void k_kv_expand(__half *kv, const float *scale, uint8_t *flags, int dst, int src,
                            long long block_elems, long long ustride, int head_elems) {
    int sl = blockIdx.x, n_slabs = (int)(block_elems / head_elems);
    const uint8_t *in = (const uint8_t *)(kv + (long long)src * ustride) + (long long)sl * head_elems;
    __half *out = kv + (long long)dst * ustride + (long long)sl * head_elems;
    float sc = scale[(long long)src * n_slabs + sl];
    for (int i = threadIdx.x; i < head_elems; i += blockDim.x) {
        __nv_fp8_e4m3 f;
        f.__x = in[i];
        out[i] = __float2half_rn(float(f) * sc);
    }
    if (sl == 0 && threadIdx.x == 0) flags[dst] = 0;
}

/* dst[r][i] = f16 of W row r (the cuBLAS path's weights). grid (n_rows), block 128. */
__global__ void k_dq_f16(__half *dst, const uint8_t *w, int type, long long row_bytes, int n_in) {
    int r = blockIdx.x;
    const uint8_t *row = w + (long long)r * row_bytes;
    for (int s = threadIdx.x; s < n_in / 8; s += blockDim.x) {
        float v[8];
        dq8(type, row, s, v);
        for (int i = 0; i < 8; i++) dst[(long long)r * n_in + s * 8 + i] = __float2half_rn(v[i]);
    }
}

/* dst[t][i] = f16 of x[t][i] (the cuBLAS path's activations). */
__global__ void k_f32_to_f16(__half *dst, const float *x, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = __float2half_rn(x[i]);
}

/* out[i] = argmax of logits row i (first index on ties, as the CPU sampler). grid (n),
 * block 256. The greedy fast path: 4 bytes down instead of a vocabulary row. */
__global__ void k_argmax(int *out, const float *logits, int n_vocab) {
    __shared__ float bv[256];
    __shared__ int bi[256];
    const float *row = logits + (long long)blockIdx.x * n_vocab;
    float best = -INFINITY;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < n_vocab; i += blockDim.x)
        if (row[i] > best) best = row[i], idx = i;
    bv[threadIdx.x] = best, bi[threadIdx.x] = idx;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            float ov = bv[threadIdx.x + s];
            int oi = bi[threadIdx.x + s];
            if (ov > bv[threadIdx.x] || (ov == bv[threadIdx.x] && oi < bi[threadIdx.x]))
                bv[threadIdx.x] = ov, bi[threadIdx.x] = oi;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = bi[0] == 0x7fffffff ? 0 : bi[0]; /* no finite max: 0 */
}

} /* extern "C" */
