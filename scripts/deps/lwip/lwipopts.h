/* lwipopts.h: lwIP configuration for kiln.
 *
 * The raw API with no OS layer (NO_SYS=1): one thread drives lwIP (input, timers, the TLS
 * BIO), so there are no sockets, netconns or locks. IPv4 + IPv6 over Ethernet, DHCP and
 * SLAAC. lwIP's memory is static: a heap of MEM_SIZE for PBUF_RAM and fixed pools for the
 * rest (net/net_lwip.c adds one malloc'd object and receive ring per connection).
 *
 * scripts/deps.sh installs this file into build/<toolchain>/deps/include/ and builds
 * liblwip.a with it; the network server may replace it (set LWIP_CONFIG_DIR for deps.sh).
 */
#ifndef KILN_LWIPOPTS_H
#define KILN_LWIPOPTS_H

/* ---- system */
#define NO_SYS                      1
#define SYS_LIGHTWEIGHT_PROT        0
#define LWIP_SOCKET                 0
#define LWIP_NETCONN                0
#define LWIP_ALTCP                  0

/* ---- memory: own heap + pools, 8-byte aligned on 64-bit. The heap is sized for 64
 * client connections plus a metrics listener, each with a full send buffer (tcp_write
 * copies) at once; past that, tcp_write answers ERR_MEM (backpressure). The pool only
 * holds frames in flight through lwIP and out-of-order segments: net_lwip.c copies
 * received data out of it at once (unread data lives in per-connection rings), so a
 * busy or hostile peer cannot pin it. When it is empty the drivers drop frames. */
#define MEM_LIBC_MALLOC             0
#define MEMP_MEM_MALLOC             0
#define MEM_ALIGNMENT               8
#define MEM_SIZE                    (6 * 1024 * 1024) /* bytes: PBUF_RAM (tcp_write copies) */
#define MEMP_NUM_PBUF               64     /* PBUF_ROM/REF */
#define MEMP_NUM_UDP_PCB            8      /* DHCP, DNS (up to 4 random source ports), spare */
#define MEMP_NUM_TCP_PCB            160    /* connections, closing ones and TIME_WAIT */
#define MEMP_NUM_TCP_PCB_LISTEN     8
#define MEMP_NUM_TCP_SEG            4096   /* queued segments, all connections */
#define PBUF_POOL_SIZE              1024   /* receive pbufs of PBUF_POOL_BUFSIZE */

/* ---- protocols */
#define LWIP_ETHERNET               1
#define LWIP_ARP                    1
#define LWIP_IPV4                   1
#define LWIP_IPV6                   1
#define IPV6_FRAG_COPYHEADER        1      /* required on 64-bit (see PLATFORM-NOTES) */
#define LWIP_IPV6_NUM_ADDRESSES     3      /* link-local + 2 SLAAC */
#define LWIP_IPV6_AUTOCONFIG        1
#define LWIP_IPV6_DHCP6             0
#define LWIP_ICMP                   1
#define LWIP_RAW                    0
#define LWIP_UDP                    1
#define LWIP_TCP                    1
#define LWIP_DHCP                   1
/* RFC 5227 conflict probing would delay every DHCP bind (and so boot) by 5-9 s; the DHCP
 * server owns the pool and checks it. */
#define LWIP_DHCP_DOES_ACD_CHECK    0
#define LWIP_AUTOIP                 0
#define LWIP_IGMP                   0
#define LWIP_DNS                    1      /* DEBUG probe host=NAME; servers from [net] dns or DHCP */

/* ---- netif */
#define LWIP_NETIF_HOSTNAME         1      /* sent in DHCP requests */
#define LWIP_NETIF_STATUS_CALLBACK  1      /* address bound/changed */
#define LWIP_NETIF_LINK_CALLBACK    1
#define LWIP_HAVE_LOOPIF            0
#define LWIP_NETIF_LOOPBACK         0

/* ---- TCP: MSS for a 1500-byte MTU; window and send buffer of 32 segments (46720 bytes,
 * larger than one 16 KiB TLS record plus overhead) without window scaling. */
#define TCP_MSS                     1460
#define TCP_WND                     (32 * TCP_MSS)
#define TCP_SND_BUF                 (32 * TCP_MSS)
#define TCP_SND_QUEUELEN            ((4 * TCP_SND_BUF) / TCP_MSS)
#define TCP_QUEUE_OOSEQ             1
#define TCP_LISTEN_BACKLOG          1
#define TCP_DEFAULT_LISTEN_BACKLOG  128    /* handshakes in progress per listener */
#define LWIP_TCP_KEEPALIVE          1
/* lwIP sends a delayed ACK on its next fast timer tick: with the default 250 ms that is
 * up to 250 ms after the data, past Linux's minimum RTO of 200 ms, so a Linux peer
 * resent ~3% of its segments on a loss-free link (the soak: TcpRetransSegs, all
 * TcpExtTCPTimeouts). 100 ms keeps every delayed ACK under it; the slow timer (RTO,
 * TIME_WAIT, keepalive: all given in ms) then ticks every 200 ms. */
#define TCP_TMR_INTERVAL            100
#define LWIP_WND_SCALE              0    /* net_lwip.c relies on it: queued input < 64 KiB */
#define SO_REUSE                    1    /* a listener can be re-made over TIME_WAIT pcbs */
/* lwIP's own ISN is a counter (predictable); use a random one per connection. */
#define LWIP_HOOK_TCP_ISN(lip, lport, rip, rport) ((u32_t)kiln_lwip_rand())

/* ---- checksums in software (the drivers complete offloaded ones) */
#define CHECKSUM_GEN_IP             1
#define CHECKSUM_GEN_TCP            1
#define CHECKSUM_GEN_UDP            1
#define CHECKSUM_CHECK_IP           1
#define CHECKSUM_CHECK_TCP          1
#define CHECKSUM_CHECK_UDP          1

/* ---- diagnostics: asserts stay on (they print and abort); no debug output. Counters on:
 * net_stats() (net/net_lwip.c) reads them for /metrics (kiln_net_*). 32-bit counters (the
 * default 16 wrap within seconds); net_lwip.c widens them to 64 bits. Nothing printed. */
#define LWIP_STATS                  1
#define LWIP_STATS_LARGE            1
#define LWIP_STATS_DISPLAY          0
#define LINK_STATS                  1
#define ETHARP_STATS                0
#define IP_STATS                    1
#define ICMP_STATS                  0
#define UDP_STATS                   0
#define TCP_STATS                   1      /* tcp.drop, tcp.memerr, tcp.chkerr, ... */
#define MEM_STATS                   1      /* mem.err: heap allocation failures */
#define MEMP_STATS                  1      /* memp[i]->err: pool allocation failures */
#define SYS_STATS                   0
#define IP6_STATS                   0
#define ICMP6_STATS                 0
#define ND6_STATS                   0
#define MLD6_STATS                  0
#define MIB2_STATS                  1      /* tcpoutsegs, tcpinsegs, tcpretranssegs, ... */
/* lwIP counts no SYN that it leaves unanswered because the listen backlog is full, nor
 * SYNs that meet a TIME_WAIT pcb: kiln counts them itself, on every segment before lwIP
 * acts on it (net_lwip.c; it only counts and never drops, so it always returns ERR_OK). */
#define LWIP_HOOK_TCP_INPACKET_PCB(pcb, hdr, optlen, opt1len, opt2, p) \
    ((err_t)kiln_lwip_tcp_in((pcb), (hdr)))

#endif /* KILN_LWIPOPTS_H */
