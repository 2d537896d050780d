/* ini: see ini.h. The syntax followed is kilnd's (core/config.c): "[section]" lines,
 * "key = value" lines starting in column 0, comments are lines starting with ; or # and
 * " ;" / " #" after a value. */
#include "boot/ini.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "boot/util.h"

static char in_buf[INI_MAX_BYTES];
static char out_buf[INI_MAX_BYTES + 1024];

static int name_ok(const char *s) {
    if (!*s) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_')) return 0;
    return 1;
}

int ini_split_name(const char *name, char *sec, size_t scap, char *key, size_t kcap) {
    const char *dot = strchr(name, '.');
    if (!dot) return -EINVAL;
    size_t sl = (size_t)(dot - name), kl = strlen(dot + 1);
    if (sl == 0 || sl >= scap || kl == 0 || kl >= kcap) return -EINVAL;
    memcpy(sec, name, sl), sec[sl] = 0;
    memcpy(key, dot + 1, kl + 1);
    return name_ok(sec) && name_ok(key) ? 0 : -EINVAL;
}

/* The section a "[name]" line opens, into sec; 0 if the line is not a section line. */
static int section_of(const char *line, size_t len, char *sec, size_t cap) {
    if (len < 2 || line[0] != '[') return 0;
    const char *end = memchr(line, ']', len);
    if (!end || (size_t)(end - line - 1) >= cap) return 0;
    memcpy(sec, line + 1, (size_t)(end - line - 1));
    sec[end - line - 1] = 0;
    return 1;
}

/* Where the value of "key = value" starts, or NULL if the line is not that key. */
static const char *value_of(const char *line, size_t len, const char *key) {
    size_t kl = strlen(key);
    if (len <= kl || strncmp(line, key, kl)) return NULL;
    const char *p = line + kl, *end = line + len;
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    if (p == end || *p != '=') return NULL;
    p++;
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    return p;
}

/* Where the value ends: at an inline comment (" ;", " #") or the line's end; trailing
 * blanks excluded. */
static const char *value_end(const char *v, const char *end) {
    const char *p = v;
    for (; p < end; p++)
        if ((*p == ';' || *p == '#') && p > v && (p[-1] == ' ' || p[-1] == '\t')) break;
    while (p > v && (p[-1] == ' ' || p[-1] == '\t' || p[-1] == '\r')) p--;
    return p;
}

int ini_get(const char *path, const char *section, const char *key, char *out, size_t cap) {
    ssize_t n = util_read_file(path, in_buf, sizeof in_buf);
    if (n < 0) return (int)n;
    char cur[64] = "";
    for (const char *line = in_buf; *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        const char *v;
        if (section_of(line, len, cur, sizeof cur)) {
        } else if (!strcmp(cur, section) && (v = value_of(line, len, key))) {
            const char *ve = value_end(v, line + len);
            size_t vl = (size_t)(ve - v);
            if (vl >= cap) return -ENOSPC;
            memcpy(out, v, vl), out[vl] = 0;
            return 0;
        }
        if (!nl) break;
        line = nl + 1;
    }
    return -ENOENT;
}

static int put(size_t *used, const char *s, size_t n) {
    if (*used + n > sizeof out_buf) return -EFBIG;
    memcpy(out_buf + *used, s, n);
    *used += n;
    return 0;
}

/* Builds the new file in out_buf; returns its length or -errno. */
static ssize_t rewrite(size_t in_len, const char *section, const char *key, const char *value) {
    char line_new[512];
    int ln = snprintf(line_new, sizeof line_new, "%s = %s", key, value);
    if (ln < 0 || (size_t)ln >= sizeof line_new) return -E2BIG;
    size_t used = 0;
    char cur[64] = "";
    int in_sec = 0, done = 0;
    size_t sec_end = 0; /* out_buf offset just past the section's last non-blank line */
    for (size_t off = 0; off < in_len;) {
        const char *line = in_buf + off, *nl = memchr(line, '\n', in_len - off);
        size_t len = nl ? (size_t)(nl - line) : in_len - off, adv = nl ? len + 1 : len;
        const char *v;
        if (section_of(line, len, cur, sizeof cur)) {
            in_sec = !strcmp(cur, section);
        } else if (in_sec && !done && (v = value_of(line, len, key))) {
            /* Keep the key's trailing comment, aligned as it was when it fits. */
            const char *ve = value_end(v, line + len), *rest = ve;
            while (rest < line + len && (*rest == ' ' || *rest == '\t')) rest++;
            size_t col = (size_t)(rest - line), restn = (size_t)(line + len - rest);
            if (put(&used, line_new, (size_t)ln) < 0) return -EFBIG;
            if (restn > 0) {
                size_t pad = col > (size_t)ln + 1 ? col - (size_t)ln : 1;
                for (size_t i = 0; i < pad; i++)
                    if (put(&used, " ", 1) < 0) return -EFBIG;
                if (put(&used, rest, restn) < 0) return -EFBIG;
            }
            if (put(&used, "\n", 1) < 0) return -EFBIG;
            done = 1;
            off += adv;
            continue;
        }
        if (put(&used, line, adv) < 0) return -EFBIG;
        if (!nl && put(&used, "\n", 1) < 0) return -EFBIG;
        int blank = 1;
        for (size_t i = 0; i < len; i++)
            if (line[i] != ' ' && line[i] != '\t' && line[i] != '\r') blank = 0;
        if (in_sec && !blank) sec_end = used;
        off += adv;
    }
    if (done) return (ssize_t)used;
    if (sec_end > 0) { /* the section exists without the key: add it at the section's end */
        size_t tail = used - sec_end;
        if (used + (size_t)ln + 1 > sizeof out_buf) return -EFBIG;
        memmove(out_buf + sec_end + ln + 1, out_buf + sec_end, tail);
        memcpy(out_buf + sec_end, line_new, (size_t)ln);
        out_buf[sec_end + ln] = '\n';
        return (ssize_t)(used + (size_t)ln + 1);
    }
    char sec_line[96];
    int sn = snprintf(sec_line, sizeof sec_line, "\n[%s]\n", section);
    if (put(&used, sec_line, (size_t)sn) < 0 || put(&used, line_new, (size_t)ln) < 0 || put(&used, "\n", 1) < 0) return -EFBIG;
    return (ssize_t)used;
}

static int write_atomic(const char *path, const char *buf, size_t n) {
    char tmp[UTIL_PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return -ENAMETOOLONG;
    int fd;
    do fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644); while (fd < 0 && errno == EINTR);
    if (fd < 0) return -errno;
    int r = util_write_all(fd, buf, n);
    if (r == 0 && fsync(fd) < 0 && errno != EINVAL) r = -errno; /* EINVAL: tmpfs-like, no sync */
    if (close(fd) < 0 && r == 0 && errno != EINTR) r = -errno;
    if (r == 0 && rename(tmp, path) < 0) r = -errno;
    if (r < 0) unlink(tmp);
    return r;
}

int ini_set(const char *path, const char *section, const char *key, const char *value, char *err, size_t cap) {
    if (!name_ok(section) || !name_ok(key)) return snprintf(err, cap, "bad name %s.%s", section, key), -EINVAL;
    for (const char *p = value; *p; p++)
        if (*p == '\n' || *p == '\r' || (unsigned char)*p < 0x20) return snprintf(err, cap, "the value has a control character"), -EINVAL;
    ssize_t n = util_read_file(path, in_buf, sizeof in_buf);
    if (n < 0) return snprintf(err, cap, "read %s: %s", path, strerror((int)-n)), (int)n;
    if ((size_t)n == sizeof in_buf - 1) return snprintf(err, cap, "%s is over %zu bytes", path, sizeof in_buf - 1), -EFBIG;
    ssize_t m = rewrite((size_t)n, section, key, value);
    if (m < 0) return snprintf(err, cap, "rewriting %s: %s", path, strerror((int)-m)), (int)m;
    int r = write_atomic(path, out_buf, (size_t)m);
    if (r < 0) snprintf(err, cap, "write %s: %s", path, strerror(-r));
    return r;
}
