/* isa: CPU feature detection, the level and AMX use in force, and the dispatch slot
 * they make (see isa.h). */
#include "core/cpu/isa.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

static int level_max, level_cur, amx_max, amx_cur, dpbf16_has, dpbf16_cur;
_Atomic int isa_slot_cur = ISA_SLOTS;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* CPUID.(7,0):EDX bits 24 (AMX-TILE) and 25 (AMX-INT8); clang's __builtin_cpu_supports
 * does not know them. */
static int amx_cpu(void) {
#if defined(__x86_64__)
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 3) == 3;
#else
    return 0;
#endif
}

/* CPUID.(7,1):EAX bit 5, AVX512_BF16 (vdpbf16ps). */
static int dpbf16_cpu(void) {
#if defined(__x86_64__)
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1);
#else
    return 0;
#endif
}

/* vdpbf16ps pays for BF16 weights where it issues as fast as an FMA with twice its
 * products: AMD's (measured on a Zen 5). Intel's parts issue it at a quarter of an FMA's rate
 * (measured on a Sapphire Rapids Xeon), so there FMAs are faster. */
static int amd_cpu(void) {
#if defined(__x86_64__)
    unsigned a, b, c, d;
    return __get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541; /* "Auth"enticAMD */
#else
    return 0;
#endif
}

/* Linux hands out AMX tile state only on request (it enlarges every context switch's
 * save area); the permission is per process, so once here covers every thread. */
static int amx_permit(void) {
#if defined(__x86_64__) && defined(SYS_arch_prctl)
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
#else
    return 0;
#endif
}

/* AMX is a slot of its own only at AVX-512. */
static void set_slot(void) {
    int s = level_cur != ISA_AVX512 || !amx_cur ? level_cur
          : amx_cur == ISA_AMX_ALL ? ISA_SLOT_AMX_ALL : ISA_SLOT_AMX_Q4_1;
    atomic_store_explicit(&isa_slot_cur, s, memory_order_relaxed);
}

static void detect(void) {
    int max = ISA_SCALAR;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        max = ISA_AVX2;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
            __builtin_cpu_supports("avx512vnni"))
            max = ISA_AVX512;
    }
    int amx = max == ISA_AVX512 && amx_cpu();
    dpbf16_has = max == ISA_AVX512 && dpbf16_cpu();
    dpbf16_cur = dpbf16_has && amd_cpu();
#else
    int amx = 0;
#endif
    /* KILN_SIMD=scalar|avx2|avx512 caps the level: a host can then compute exactly what
     * a machine with less (a TCG guest: AVX2, no AVX-512; no AMX) computes. Any value
     * but amx turns AMX off; KILN_AMX=0|all picks what AMX does (isa.h). */
    const char *cap = getenv("KILN_SIMD");
    if (cap && !strcmp(cap, "scalar")) max = ISA_SCALAR;
    else if (cap && !strcmp(cap, "avx2") && max > ISA_AVX2) max = ISA_AVX2;
    if (cap && strcmp(cap, "amx")) amx = 0;
    amx = amx && amx_permit();
    const char *use = getenv("KILN_AMX"); /* 0 | all; else Q4_1 only */
    level_max = level_cur = max;
    amx_max = amx ? ISA_AMX_ALL : ISA_AMX_OFF;
    amx_cur = !amx ? ISA_AMX_OFF : use && !strcmp(use, "0") ? ISA_AMX_OFF
            : use && !strcmp(use, "all") ? ISA_AMX_ALL : ISA_AMX_Q4_1;
    set_slot();
}

int isa_level(void) { pthread_once(&once, detect); return level_cur; }
int isa_max(void) { pthread_once(&once, detect); return level_max; }
int isa_set(int level) {
    pthread_once(&once, detect);
    level_cur = level < ISA_SCALAR ? ISA_SCALAR : level > level_max ? level_max : level;
    set_slot();
    return level_cur;
}

int isa_amx(void) { pthread_once(&once, detect); return amx_cur; }
int isa_amx_max(void) { pthread_once(&once, detect); return amx_max; }
int isa_set_amx(int use) {
    pthread_once(&once, detect);
    amx_cur = use < ISA_AMX_OFF ? ISA_AMX_OFF : use > amx_max ? amx_max : use;
    set_slot();
    return amx_cur;
}

int isa_dpbf16(void) { pthread_once(&once, detect); return dpbf16_cur; }
int isa_set_dpbf16(int use) {
    pthread_once(&once, detect);
    return dpbf16_cur = use && dpbf16_has;
}

int isa_slot_detect(void) {
    pthread_once(&once, detect);
    return atomic_load_explicit(&isa_slot_cur, memory_order_relaxed);
}

const char *isa_name(int level) {
    static const char *const names[] = {"scalar", "avx2", "avx512"};
    return level >= ISA_SCALAR && level <= ISA_AVX512 ? names[level] : "?";
}
