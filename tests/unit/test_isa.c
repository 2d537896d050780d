/* test_isa: the level and AMX use in force stay within what the machine (and KILN_SIMD)
 * allow, and the dispatch slot every kernel family indexes by follows them: the level
 * itself, except AVX-512 with AMX on, which has a slot per AMX use. With KILN_SIMD set
 * (tests/run.sh does not), the cap is checked too. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/cpu/isa.h"

int main(void) {
    const char *cap = getenv("KILN_SIMD");
    int max = isa_max(), amx_max = isa_amx_max();
    printf("isa: max level %d, amx %d%s%s\n", max, amx_max, cap ? ", KILN_SIMD=" : "",
           cap ? cap : "");
    CHECK(max >= ISA_SCALAR && max <= ISA_AVX512, "max %d", max);
    CHECK(isa_level() == max, "starts at the max: %d", isa_level());
    CHECK(amx_max == ISA_AMX_OFF || amx_max == ISA_AMX_ALL, "amx max %d", amx_max);
    CHECK(!amx_max || max == ISA_AVX512, "AMX only on top of AVX-512");
    if (cap && strcmp(cap, "amx")) CHECK(!amx_max, "KILN_SIMD=%s turns AMX off", cap);
    if (cap && !strcmp(cap, "scalar")) CHECK(max == ISA_SCALAR, "capped to scalar: %d", max);
    if (cap && !strcmp(cap, "avx2")) CHECK(max <= ISA_AVX2, "capped to avx2: %d", max);

    /* sets clamp to [0, max] and report what is in force */
    CHECK(isa_set(-1) == ISA_SCALAR && isa_level() == ISA_SCALAR, "below 0");
    CHECK(isa_set(ISA_AVX512 + 5) == max && isa_level() == max, "above the max");
    CHECK(isa_set_amx(-1) == ISA_AMX_OFF && isa_amx() == ISA_AMX_OFF, "amx below 0");
    CHECK(isa_set_amx(ISA_AMX_ALL + 1) == amx_max && isa_amx() == amx_max, "amx above max");

    for (int lv = ISA_SCALAR; lv <= max; lv++)
        for (int use = ISA_AMX_OFF; use <= amx_max; use++) {
            CHECK(isa_set(lv) == lv && isa_set_amx(use) == use, "set %d, amx %d", lv, use);
            int want = lv != ISA_AVX512 || use == ISA_AMX_OFF ? lv
                     : use == ISA_AMX_Q4_1 ? ISA_SLOT_AMX_Q4_1 : ISA_SLOT_AMX_ALL;
            CHECK(isa_slot() == want, "level %d amx %d: slot %d, want %d", lv, use, isa_slot(),
                  want);
            CHECK(isa_slot() >= 0 && isa_slot() < ISA_SLOTS, "slot in range");
            static const int table[ISA_SLOTS] = {10, 11, 12, 13, 14};
            CHECK(*ISA_PICK(table) == 10 + want, "ISA_PICK: %d", *ISA_PICK(table));
        }
    isa_set(max);
    isa_set_amx(amx_max ? ISA_AMX_Q4_1 : ISA_AMX_OFF);
    return check_done("isa");
}
