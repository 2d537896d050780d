/* arch/cc.h: lwIP port header for kiln (Linux userland and the image, gcc or musl-gcc).
 *
 * Provisional: scripts/deps.sh installs it into build/<toolchain>/deps/include/ next to
 * lwipopts.h; the network server may replace both (liblwip.a is rebuilt when they change).
 *
 * A program that links liblwip.a (NO_SYS=1) provides two functions:
 *   u32_t    sys_now(void);         monotonic milliseconds (declared in lwip/sys.h)
 *   uint32_t kiln_lwip_rand(void);  random 32 bits (getrandom-backed), used for TCP ISNs,
 *                                   ephemeral ports, DHCP xids and IPv6 ND timers
 */
#ifndef KILN_LWIP_ARCH_CC_H
#define KILN_LWIP_ARCH_CC_H

#include <stdint.h>

/* Build and run on x86-64: little endian, libc's <stdint.h>/<inttypes.h>/<limits.h>. */
#ifndef BYTE_ORDER
#define BYTE_ORDER LITTLE_ENDIAN
#endif

uint32_t kiln_lwip_rand(void);
#define LWIP_RAND() ((u32_t)kiln_lwip_rand())

#endif /* KILN_LWIP_ARCH_CC_H */
