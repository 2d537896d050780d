/* qpack_x86.h: what the x86 packed kernels (qpack_avx2.c, qpack_avx512.c) share: the
 * prefetch ahead of the weights, and the per-column table of Q8_0 activation blocks
 * that the Q8_0, Q4_0 and Q5_0 tiles take their weights' bias back off with. AVX2
 * instructions only, so both files can include it, but for the nibble and 5th-bit
 * helpers the AVX-512 files (qpack_avx512.c, qpack_amx_avx512.c) share. */
#ifndef KILN_QPACK_X86_H
#define KILN_QPACK_X86_H

#include <immintrin.h>

#include "core/cpu/isa.h"
#include "core/cpu/qpack.h"
#include "core/cpu/quant_kern.h"

/* A decode step streams the packed weights from memory with little work per byte, and
 * the hardware prefetcher alone keeps a core well under its read rate (one core, Q4_K
 * matrices streamed from memory: 45.7 GMAC/s without software prefetch, 71.0 with). Each group-block of
 * the small types (5 to 11 lines) asks at its start for the lines QP_PF_AHEAD bytes
 * further on: the rest of its group, then the next group, which the same task reads
 * next. Past a mapping's end a prefetch does nothing. */
#define QP_PF_AHEAD 4096

/* prefetcht1 (to L2, not L1) as an asm statement (isa.h): GCC 12 at -O2 deleted every
 * _mm_prefetch (and __builtin_prefetch) of these loops, so the packed kernels had run
 * with none at all. Into L1 (prefetcht0) each prefetch held one of the core's few L1
 * miss buffers until its line came, so on the Intel AMX VM decode stalled on the
 * prefetch instructions themselves (80% of the Q4_K kernel's samples) and a core
 * streamed ~10 GB/s; into L2 the decode of the 1B Q4_K_M shape went from 24.6 to 30.5
 * tok/s, Q6_K 16.3 to 24.9, Q4_0 25.3 to 33.3, F16 9.4 to 10.6 (prefill and 32 streams
 * unchanged). The kernels' own loads then hit L2. */
static inline void qp_pf(const uint8_t *p) { isa_prefetch_l2(p); }

static inline void qp_prefetch(const uint8_t *gb, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) qp_pf(gb + QP_PF_AHEAD + o);
}

/* The K-quants' and F16's group-blocks are 16 to 53 lines. Asked for in one burst at
 * the block's start, that many prefetches fill the core's miss buffers and the block's
 * own loads of the activations wait behind them: a 32-column step then streamed its
 * weights at a sixth of the read rate (4 of 25 GB/s) and ran at a third of the kernel's
 * in-cache speed. Their kernels ask for one slice per part of the block's work instead,
 * QP_PF_SPREAD bytes ahead (tried: 4 to 16 KB; 4 and 8 were best, 8 for one column). */
#define QP_PF_SPREAD 8192
static inline void qp_prefetch_part_at(const uint8_t *gb, size_t bytes, int part, int parts,
                                       size_t ahead) {
    size_t lines = (bytes + 63) / 64, lo = lines * (size_t)part / (size_t)parts;
    size_t hi = lines * (size_t)(part + 1) / (size_t)parts;
    for (size_t l = lo; l < hi; l++) qp_pf(gb + ahead + 64 * l);
}
static inline void qp_prefetch_part(const uint8_t *gb, size_t bytes, int part, int parts) {
    qp_prefetch_part_at(gb, bytes, part, parts, QP_PF_SPREAD);
}

/* F16's and BF16's 1 KB group-blocks are asked for one block ahead instead. On the Zen 4
 * VM (BENCHMARKS.md 2026-12-07, the F16 entry) 8 KB ahead held a core's decode of them
 * to 64-71% of a plain read of the same bytes, one block ahead 85-100% (no prefetch at
 * all 79-93%); 1B decode at one thread 8.3-9.0 -> 9.2-11.8 tok/s (F16), 8.1-8.8 ->
 * 10.6-11.7 (BF16). The K-quants' larger blocks lost at short distances (Q6_K 77 ->
 * 40%) and keep QP_PF_SPREAD. */
#ifndef QP_PF_H16
#define QP_PF_H16 1024
#endif

#define QP_XTAB_C 8 /* columns a table holds: the widest pass of either file */

/* Per column and block of a pass: d_x as f32 and bias * (sum of the block's quants),
 * the term unsigned weights q + bias add (qpack.h). Made once per pass, shared by its
 * groups. */
typedef struct {
    float dx[QP_XTAB_C][QP_MAX_N / QK4];
    int32_t corr[QP_XTAB_C][QP_MAX_N / QK4];
} qp_xtab;

static inline void qp_xtab_fill(qp_xtab *t, int bias, int C, int64_t nb, const uint8_t *x, size_t xs) {
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int c = 0; c < C; c++)
        for (int64_t b = 0; b < nb; b++) {
            const blk_q8_0 *xb = (const blk_q8_0 *)(x + c * xs + b * sizeof(blk_q8_0));
            /* the unsigned bytes q + 128 summed in four 64-bit lanes, then 32 * 128 off */
            __m256i q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)xb->qs), flip);
            __m256i s = _mm256_sad_epu8(q, _mm256_setzero_si256());
            __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            int32_t sum = (int32_t)(_mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1)) - 32 * 128;
            t->corr[c][b] = bias * sum;
            t->dx[c][b] = _cvtsh_ss(xb->d);
        }
}

#ifdef __AVX512BW__
/* Bit `bit` of each byte of v moved to bit 4 (the 5th bit of a Q5_K value): a 16-bit
 * shift never brings a neighbour byte's bit there for shifts of at most 4. */
static inline __attribute__((always_inline)) __m512i q5_bit4(__m512i v, const int bit) {
    const __m512i m10 = _mm512_set1_epi8(0x10);
    v = bit < 4 ? _mm512_slli_epi16(v, 4 - bit) : bit > 4 ? _mm512_srli_epi16(v, bit - 4) : v;
    return _mm512_and_si512(v, m10);
}

/* Chunk k's nibbles of a 64-byte load v in w[0] (low) and w[1] (high), with, for the
 * 5-bit types, the 5th bits from their per-chunk bytes h5 (qpack.h: byte k of each
 * row's dword) added at bit 4: byte k goes to all four bytes of its dword, then bit e
 * (low) or 4+e (high) picks byte e's. */
static inline __attribute__((always_inline)) void qp_nibbles(__m512i v, const int q5, __m512i h5, const int k, __m512i w[2]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    w[0] = _mm512_and_si512(v, m4);
    w[1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    if (q5) {
        const __m512i idx = _mm512_add_epi8(_mm512_set4_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0),
                                            _mm512_set1_epi8((char)k));
        const __m512i b = _mm512_shuffle_epi8(h5, idx), sixteen = _mm512_set1_epi8(16);
        __mmask64 lo = _mm512_test_epi8_mask(b, _mm512_set1_epi32(0x08040201));
        __mmask64 hi = _mm512_test_epi8_mask(b, _mm512_set1_epi32((int)0x80402010u));
        w[0] = _mm512_mask_add_epi8(w[0], lo, w[0], sixteen);
        w[1] = _mm512_mask_add_epi8(w[1], hi, w[1], sixteen);
    }
}

/* summ of qpack.h for one token's Q8_K block xb (a blk_q8_k) against a Q4_K/Q5_K group's
 * mins mn[4] (pairs of sub-blocks 2p, 2p + 1 as int16 per row): the block's sub-block
 * sums, as int16 pairs in the same order, each broadcast to a vpdpwssd. */
static inline __attribute__((always_inline)) __m512i qp_kmins(const int16_t *bsums, const __m512i *mn) {
    const __m128i *bs = (const __m128i *)bsums;
    __m512i s = _mm512_castsi128_si512(_mm_hadd_epi16(_mm_loadu_si128(bs), _mm_loadu_si128(bs + 1)));
    __m512i sm = _mm512_setzero_si512();
    for (int p = 0; p < 4; p++)
        sm = _mm512_dpwssd_epi32(sm, mn[p], _mm512_permutexvar_epi32(_mm512_set1_epi32(p), s));
    return sm;
}
#endif

#endif
