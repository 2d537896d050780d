/* ini: see ini.h. The file is parsed by inih, built as kilnd's is (scripts/deps.sh), so
 * kiln-init reads a key exactly as kilnd does (core/config.c): "[section]" lines,
 * "key = value" (or "key: value") lines, comments are lines starting with ; or # and
 * " ;" after a value.
 *
 * inih hands us neither line numbers nor section lines (built without INI_HANDLER_LINENO
 * or INI_CALL_HANDLER_ON_NEW_SECTION), so it reads through our own reader, which knows
 * where in the file each line it gives out lies and notes "[section]" lines itself (a
 * missing key is added after its section's last line, even in a section with no key). A
 * key is ours only when it starts in column 0: an indented line after a key is inih's
 * continuation line, which kilnd refuses. Lines inih cannot parse are skipped, as kilnd's
 * check-config reports them. */
#include "boot/ini.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <ini.h>

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

/* ------------------------------------------------------------------ one pass of inih */

typedef struct {
    const char *buf;       /* the file (in_buf), len bytes */
    size_t len, off;       /* off: where the next line starts */
    size_t line, line_end; /* the line inih is on: its start, and past its '\n' */
    const char *copy;      /* inih's copy of that line (its line buffer) */
    int truncated;         /* the line did not fit inih's buffer */
    const char *section, *key;
    int in_sec;            /* the last "[name]" line opened section */
    size_t sec_end;        /* just past section's last non-blank line; 0: no such section */
    int found;             /* the key's first line in section, if found: */
    size_t key_line;       /*   its start */
    size_t key_end;        /*   its end before "\r\n" or "\n" */
    size_t key_eol;        /*   past its "\n" */
    size_t rest;           /*   where the trailing comment starts (key_end: none) */
    char *out;             /* ini_get: the value, into cap bytes; err: -ENOSPC */
    size_t cap;
    int err;
} scan;

static int blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

/* fgets for inih over the buffer. A line too long for inih's buffer is cut to what fits
 * (it stays whole in the file): its key's value is not read (-ENOSPC), and a rewrite
 * replaces the whole line. kilnd refuses such a line anyway. */
static char *reader(char *str, int num, void *stream) {
    scan *s = stream;
    if (num < 3 || s->off >= s->len) return NULL;
    const char *p = s->buf + s->off, *nl = memchr(p, '\n', s->len - s->off);
    size_t n = nl ? (size_t)(nl - p) + 1 : s->len - s->off;
    s->line = s->off, s->line_end = s->off + n, s->off += n;
    s->truncated = n > (size_t)num - 1;
    if (s->truncated) {
        memcpy(str, p, (size_t)num - 2);
        str[num - 2] = '\n', str[num - 1] = 0;
    } else {
        memcpy(str, p, n);
        str[n] = 0;
    }
    s->copy = str;
    const char *q = p, *end = p + n;
    if (s->line == 0 && n >= 3 && !memcmp(q, "\xEF\xBB\xBF", 3)) q += 3;
    const char *close = *q == '[' ? memchr(q, ']', (size_t)(end - q)) : NULL;
    if (close) {
        size_t sl = (size_t)(close - q - 1);
        s->in_sec = sl == strlen(s->section) && !memcmp(q + 1, s->section, sl);
    }
    if (s->in_sec)
        for (const char *c = q; c < end; c++)
            if (!blank(*c)) {
                s->sec_end = s->line_end;
                break;
            }
    return str;
}

static int handler(void *user, const char *section, const char *name, const char *value) {
    scan *s = user;
    const char *raw = s->buf + s->line;
    if (s->found || blank(*raw) || strcmp(section, s->section) || strcmp(name, s->key)) return 1;
    s->found = 1;
    s->key_line = s->line, s->key_end = s->key_eol = s->line_end;
    if (s->key_end > s->line && s->buf[s->key_end - 1] == '\n') s->key_end--;
    if (s->key_end > s->line && s->buf[s->key_end - 1] == '\r') s->key_end--;
    /* inih cut the value off at its comment and trailing blanks, in place in its copy. */
    size_t vl = strlen(value), r = s->line + (size_t)(value - s->copy) + vl;
    while (r < s->key_end && (s->buf[r] == ' ' || s->buf[r] == '\t')) r++;
    s->rest = r < s->key_end && !s->truncated ? r : s->key_end; /* a cut line is replaced whole */
    if (s->out) {
        if (s->truncated || vl >= s->cap) s->err = -ENOSPC;
        else memcpy(s->out, value, vl + 1);
    }
    return 1;
}

static void scan_file(scan *s, size_t len, const char *section, const char *key) {
    memset(s, 0, sizeof *s);
    s->buf = in_buf, s->len = len;
    s->section = section, s->key = key;
}

int ini_get(const char *path, const char *section, const char *key, char *out, size_t cap) {
    ssize_t n = util_read_file(path, in_buf, sizeof in_buf);
    if (n < 0) return (int)n;
    scan s;
    scan_file(&s, (size_t)n, section, key);
    s.out = out, s.cap = cap;
    ini_parse_stream(reader, &s, handler, &s); /* bad lines: see the top */
    if (s.err) return s.err;
    return s.found ? 0 : -ENOENT;
}

/* ------------------------------------------------------------------ rewriting */

static int put(size_t *used, const char *s, size_t n) {
    if (*used + n > sizeof out_buf) return -EFBIG;
    memcpy(out_buf + *used, s, n);
    *used += n;
    return 0;
}

/* in_buf[from, to) into out_buf, with a '\n' after a last line that has none. */
static int put_lines(size_t *used, size_t from, size_t to) {
    if (put(used, in_buf + from, to - from) < 0) return -EFBIG;
    if (to > from && in_buf[to - 1] != '\n' && put(used, "\n", 1) < 0) return -EFBIG;
    return 0;
}

/* Builds the new file in out_buf from s's pass over in_buf; returns its length or -errno. */
static ssize_t rewrite(const scan *s, const char *value) {
    char line_new[512];
    int ln = snprintf(line_new, sizeof line_new, "%s = %s", s->key, value);
    if (ln < 0 || (size_t)ln >= sizeof line_new) return -E2BIG;
    size_t used = 0;
    if (s->found) { /* in place, keeping the key's trailing comment, aligned as it was when it fits */
        size_t col = s->rest - s->key_line, restn = s->key_end - s->rest;
        if (put(&used, in_buf, s->key_line) < 0 || put(&used, line_new, (size_t)ln) < 0) return -EFBIG;
        if (restn > 0) {
            size_t pad = col > (size_t)ln + 1 ? col - (size_t)ln : 1;
            for (size_t i = 0; i < pad; i++)
                if (put(&used, " ", 1) < 0) return -EFBIG;
            if (put(&used, in_buf + s->rest, restn) < 0) return -EFBIG;
        }
        /* the line's own end ("\r\n" stays), then the lines after it */
        const char *eol = s->key_eol > s->key_end ? in_buf + s->key_end : "\n";
        size_t eoln = s->key_eol > s->key_end ? s->key_eol - s->key_end : 1;
        if (put(&used, eol, eoln) < 0 || put_lines(&used, s->key_eol, s->len) < 0) return -EFBIG;
        return (ssize_t)used;
    }
    if (s->sec_end > 0) { /* the section exists without the key: add it at the section's end */
        if (put_lines(&used, 0, s->sec_end) < 0 || put(&used, line_new, (size_t)ln) < 0 || put(&used, "\n", 1) < 0 ||
            put_lines(&used, s->sec_end, s->len) < 0)
            return -EFBIG;
        return (ssize_t)used;
    }
    char sec_line[96];
    int sn = snprintf(sec_line, sizeof sec_line, "\n[%s]\n", s->section);
    if (put_lines(&used, 0, s->len) < 0 || put(&used, sec_line, (size_t)sn) < 0 || put(&used, line_new, (size_t)ln) < 0 ||
        put(&used, "\n", 1) < 0)
        return -EFBIG;
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
    scan s;
    scan_file(&s, (size_t)n, section, key);
    ini_parse_stream(reader, &s, handler, &s);
    ssize_t m = rewrite(&s, value);
    if (m < 0) return snprintf(err, cap, "rewriting %s: %s", path, strerror((int)-m)), (int)m;
    int r = write_atomic(path, out_buf, (size_t)m);
    if (r < 0) snprintf(err, cap, "write %s: %s", path, strerror(-r));
    return r;
}
