/* isa: the instruction-set level the CPU kernels run at, and how each kernel family
 * picks its path by it.
 *
 * The level is detected once (CPUID through the compiler's builtins, AMX-INT8 through
 * CPUID leaf 7 and the kernel's permission). KILN_SIMD=scalar|avx2|avx512|amx caps it
 * (avx512 means without AMX), so a host computes exactly what a smaller machine would;
 * tests lower it to compare each level with the C reference. A set never goes above
 * the machine's level or the cap and returns what is now in force.
 *
 * Dispatch, the same in quant, qpack, attn and vmath: each family has one table of
 * ISA_SLOTS entries (function pointers, the best implementation at each slot) and
 * looks the entry in force up with ISA_PICK once per call, never per row. */
#ifndef KILN_ISA_H
#define KILN_ISA_H

#include <stdatomic.h>

enum isa_level { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };
int isa_level(void);
int isa_max(void);
int isa_set(int level);
/* "scalar", "avx2", "avx512": the names KILN_SIMD takes; "?" for another number */
const char *isa_name(int level);

/* AMX-INT8 tiles on top of the AVX-512 level (their own arithmetic), in force only
 * while the level is ISA_AVX512: off, Q4_1 only (the default where the CPU and kernel
 * allow it and KILN_SIMD does not cap it), or Q8_0 too (KILN_AMX=all; not the
 * default: it flips a near-tie in tests/ref/tiny_parity.py, see BENCHMARKS.md).
 * Both AMX uses also run the packed Q8_0, Q4_0, Q5_0 and K-quant matrices on tiles
 * (core/cpu/qpack.h), which compute the AVX-512 kernels' bits. KILN_AMX=0 turns it off. */
enum isa_amx_use { ISA_AMX_OFF = 0, ISA_AMX_Q4_1 = 1, ISA_AMX_ALL = 2 };
int isa_amx(void);
int isa_amx_max(void);
int isa_set_amx(int use);

/* 1 where the AVX-512 level's BF16 kernel takes vdpbf16ps (by default where the CPU has
 * AVX512_BF16 and issues it as fast as an FMA: AMD), 0 where it takes FMAs; the same
 * bits (qpack.h). A set (tests) turns it on only where the CPU has the instruction. */
int isa_dpbf16(void);
int isa_set_dpbf16(int use);

/* The 64-byte line at p into L2 (prefetcht1), as an asm statement: GCC 12 at -O2 deleted
 * every _mm_prefetch and __builtin_prefetch of the packed kernels' loops (qpack_x86.h
 * says why L2, not L1). Never faults. */
static inline void isa_prefetch_l2(const void *p) {
#if defined(__x86_64__)
    __asm__ volatile("prefetcht1 %0" : : "m"(*(const char *)p));
#else
    __builtin_prefetch(p, 0, 2);
#endif
}

/* The dispatch slots: the three levels, then AVX-512 with AMX for Q4_1 and for all.
 * A family without AMX kernels puts its AVX-512 entry in the AMX slots too. */
enum isa_slot { ISA_SLOT_AMX_Q4_1 = ISA_AVX512 + 1, ISA_SLOT_AMX_ALL, ISA_SLOTS };

/* The slot in force, ISA_SLOTS until the first call detects the level: one load on
 * every later call, so a dispatch costs no function call. */
extern _Atomic int isa_slot_cur;
int isa_slot_detect(void);
static inline int isa_slot(void) {
    int s = atomic_load_explicit(&isa_slot_cur, memory_order_relaxed);
    return s < ISA_SLOTS ? s : isa_slot_detect();
}

/* The entry in force of a family's table[ISA_SLOTS], as a pointer. */
#define ISA_PICK(table) (&(table)[isa_slot()])

#endif
