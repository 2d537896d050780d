/* arch/cc.h: lwIP port header for kiln (Linux userland and the image, gcc or musl-gcc).
 *
 * scripts/deps.sh installs it into build/<toolchain>/deps/include/ next to lwipopts.h
 * (liblwip.a is rebuilt when either changes).
 *
 * A program that links liblwip.a (NO_SYS=1) provides three functions (net/net_lwip.c does):
 *   u32_t    sys_now(void);         monotonic milliseconds (declared in lwip/sys.h)
 *   uint32_t kiln_lwip_rand(void);  random 32 bits (getrandom-backed), used for TCP ISNs
 *                                   (LWIP_HOOK_TCP_ISN in lwipopts.h), ephemeral ports,
 *                                   DHCP xids and IPv6 MLD timers
 *   int      kiln_lwip_tcp_in(pcb, hdr);  counts SYNs lwIP does not (see below)
 */
#ifndef KILN_LWIP_ARCH_CC_H
#define KILN_LWIP_ARCH_CC_H

#include <stdint.h>

/* Build and run on x86-64: little endian, libc's <stdint.h>/<inttypes.h>/<limits.h>. */
#ifndef BYTE_ORDER
#define BYTE_ORDER LITTLE_ENDIAN
#endif

/* libc has htons & co.: lwIP must not redefine them as macros, or <arpa/inet.h> and lwIP
 * headers could not meet in one file. lwIP's own lwip_htons & co. become builtins. */
#define LWIP_DONT_PROVIDE_BYTEORDER_FUNCTIONS 1
#define lwip_htons(x) ((u16_t)__builtin_bswap16((u16_t)(x)))
#define lwip_htonl(x) ((u32_t)__builtin_bswap32((u32_t)(x)))

uint32_t kiln_lwip_rand(void);
#define LWIP_RAND() ((u32_t)kiln_lwip_rand())

/* Sees every TCP segment that matched a pcb (a listener's or a TIME_WAIT one included)
 * before lwIP acts on it; only counts, returns 0 (LWIP_HOOK_TCP_INPACKET_PCB). */
struct tcp_pcb;
struct tcp_hdr;
int kiln_lwip_tcp_in(const struct tcp_pcb *pcb, const struct tcp_hdr *hdr);

#endif /* KILN_LWIP_ARCH_CC_H */
