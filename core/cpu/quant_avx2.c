/* quant_avx2: AVX2 + FMA + F16C kernels (maddubs/madd integer dots, 4x2 tiles). The
 * kernels live in quant_x86.h, shared with the AVX-512 build. */
#include "core/cpu/quant_x86.h"

void quant_register_avx2(quant_kernels k[QT_COUNT]) { qx_register(k); }
