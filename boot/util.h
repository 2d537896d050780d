/* util: small helpers kiln-init's modules share: monotonic time, bounded file reads and
 * writes, path joining, string trimming. No allocation anywhere: PID 1 keeps everything in
 * static or caller-owned buffers. Errors are negative errno values. */
#ifndef KILN_BOOT_UTIL_H
#define KILN_BOOT_UTIL_H

#include <stddef.h>
#include <sys/types.h>

#define UTIL_PATH_MAX 256 /* bytes, every path kiln-init builds (ROOT + a fixed suffix) */

double util_now(void);                          /* CLOCK_MONOTONIC, seconds */
ssize_t util_read_file(const char *path, char *buf, size_t cap); /* NUL-terminated, <= cap-1 */
int util_write_file(const char *path, const char *text);        /* whole text, O_TRUNC */
int util_write_all(int fd, const char *buf, size_t n);         /* retries EINTR/short writes */
int util_nonblock(int fd);
int util_join(char *out, size_t cap, const char *root, const char *rel); /* root + rel */
char *util_trim(char *s);                       /* strips blanks both ends, in place */
int util_starts(const char *s, const char *prefix);
void util_sleep(double seconds);                /* EINTR-safe */
const char *util_exit_text(int status, char *buf, size_t cap); /* "exit status 1", "signal 9 (Killed)" */

#endif
