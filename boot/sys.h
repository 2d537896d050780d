/* sys: what PID 1 does to the system itself, once, at boot and at the end: filesystems,
 * the kernel command line, hostname, bringing interfaces up, IPv6 off on the NIC lwIP
 * drives, and reading facts for `status` (memory, uptime, interfaces). Every function
 * logs its own failures (call name and errno) and returns 0 or a negative errno. */
#ifndef KILN_BOOT_SYS_H
#define KILN_BOOT_SYS_H

#include <stddef.h>

int sys_mount_all(void);   /* proc, sysfs, devtmpfs, tmpfs /run and /tmp; returns failures */
int sys_cmdline_get(const char *cmdline, const char *key, char *out, size_t cap); /* 1 = found */
int sys_hostname_ok(const char *name);
int sys_set_hostname(const char *name);
int sys_if_up(const char *ifname);
int sys_ipv6_off(const char *ifname);
int sys_meminfo(long *total_kib, long *avail_kib);
double sys_uptime(void);  /* /proc/uptime, seconds; -1 if unreadable */
int sys_netifs(char *out, size_t cap); /* "eth0 52:54:00:12:34:56 up, lo ... unknown" */
void sys_kill_all(double grace_s);     /* SIGTERM everyone, reap, SIGKILL the rest */

#endif
