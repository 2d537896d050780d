/* util: see util.h. */
#include "boot/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

double util_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail for CLOCK_MONOTONIC */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

ssize_t util_read_file(const char *path, char *buf, size_t cap) {
    if (cap == 0) return -EINVAL;
    int fd;
    do fd = open(path, O_RDONLY | O_CLOEXEC); while (fd < 0 && errno == EINTR);
    if (fd < 0) return -errno;
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { int e = errno; close(fd); return -e; }
        if (r == 0) break;
        n += (size_t)r;
    }
    buf[n] = 0;
    close(fd);
    return (ssize_t)n;
}

int util_write_all(int fd, const char *buf, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -errno;
        buf += w, n -= (size_t)w;
    }
    return 0;
}

int util_write_file(const char *path, const char *text) {
    int fd;
    do fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC); while (fd < 0 && errno == EINTR);
    if (fd < 0) return -errno;
    int r = util_write_all(fd, text, strlen(text));
    if (close(fd) < 0 && r == 0 && errno != EINTR) r = -errno;
    return r;
}

int util_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -errno;
    return 0;
}

int util_join(char *out, size_t cap, const char *root, const char *rel) {
    int n = snprintf(out, cap, "%s%s", root ? root : "", rel);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

char *util_trim(char *s) {
    while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n') s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n')) s[--n] = 0;
    return s;
}

int util_starts(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

void util_sleep(double seconds) {
    if (seconds <= 0) return;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
}

const char *util_exit_text(int status, char *buf, size_t cap) {
    if (WIFEXITED(status)) snprintf(buf, cap, "exit status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status)) snprintf(buf, cap, "killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else snprintf(buf, cap, "wait status 0x%x", (unsigned)status);
    return buf;
}
