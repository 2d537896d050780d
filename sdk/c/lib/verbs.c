/* libkiln verbs: one line out, one reply back (HEALTH, STATS, admin commands) or a
 * dot-terminated body (METRICS, CONFIG). Request lines (TOK/END/ERR with an id) that
 * arrive while waiting are dispatched to their callbacks; the first other line is the
 * reply. Verbs are never called from callbacks, so a broken connection can be torn
 * down right here. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "mbedtls/sha256.h"

/* Longest command line we send: admin verbs are short. */
#define KL_CMD_MAX 4096

static int fail_drop(kl_one *c, int code, const kiln_error *e, kiln_error *err) {
    if (c->up)
        kl_drop(c, code, e->message);
    if (err)
        *err = *e;
    return code;
}

/* Check the line, make sure we are connected, send it. 0 or a code. */
static int verb_send(kl_one *c, const char *line, kiln_error *err) {
    if (err)
        *err = (kiln_error){0, ""};
    size_t n = line ? strlen(line) : 0;
    if (n == 0 || n > KL_CMD_MAX || strpbrk(line, "\r\n")) {
        kl_err(err, KILN_EINVAL, "a command is one line of 1..%d bytes", KL_CMD_MAX);
        return KILN_EINVAL;
    }
    /* Their replies carry ids and would be taken for (unknown) requests' lines. */
    if (!strncmp(line, "GEN", 3) || !strncmp(line, "CANCEL", 6)) {
        kl_err(err, KILN_EINVAL, "use kiln_submit / kiln_cancel for GEN and CANCEL");
        return KILN_EINVAL;
    }
    kl_drain(c); /* a connection closed while idle shows up here, not as a lost reply */
    int r = kl_ensure(c, err);
    if (r)
        return r;
    kiln_error e;
    c->last_rx_ms = kl_now_ms(); /* the reply's wait starts now */
    r = kl_send_line(c, line, n, &e);
    if (r)
        return fail_drop(c, r, &e, err);
    return 0;
}

/* The next line whatever it is, waiting while bytes keep coming (each resets the io
 * timeout). 0, or a code with e set. */
static int raw_line(kl_one *c, char **line, size_t *len, kiln_error *e) {
    for (;;) {
        int r = kl_line(c, c->last_rx_ms + c->o.io_timeout_ms, line, len, e);
        if (r > 0)
            return 0;
        if (r < 0)
            return r;
        if (kl_now_ms() >= c->last_rx_ms + c->o.io_timeout_ms) {
            kl_err(e, KILN_ETIMEOUT, "%s: no reply for %d ms", c->server,
                   c->o.io_timeout_ms);
            return KILN_ETIMEOUT;
        }
    }
}

/* The next line that is not a request's: 0 with *line, or a code (the connection is
 * dropped then: a late reply could not be told from the next one). */
static int verb_line(kl_one *c, char **line, size_t *len, kiln_error *err) {
    for (;;) {
        kiln_error e;
        int r = raw_line(c, line, len, &e);
        if (r)
            return fail_drop(c, r, &e, err);
        if (!kl_dispatch(c, *line, *len))
            return 0;
        if (c->broken) {
            e = c->broke;
            return fail_drop(c, e.code, &e, err);
        }
    }
}

/* An "ERR ..." reply as the result: its code with err set. */
static int err_reply(char *line, size_t len, kiln_error *err) {
    proto_line l;
    char perr[96];
    if (proto_split(line, len, &l, perr, sizeof perr)) {
        kl_err(err, KILN_EPROTO, "bad ERR reply: %s", perr);
        return KILN_EPROTO;
    }
    return kl_err_line(&l, err);
}

static int is_err(const char *line, size_t len) {
    return len >= 4 && !memcmp(line, "ERR ", 4);
}

int kl1_command(kl_one *c, const char *line, char *reply, size_t cap,
                 kiln_error *err) {
    if (reply && cap)
        reply[0] = '\0';
    int r = verb_send(c, line, err);
    if (r)
        return r;
    char *got;
    size_t len;
    r = verb_line(c, &got, &len, err);
    if (r)
        return r;
    if (reply && cap)
        snprintf(reply, cap, "%s", got); /* before the split below rewrites got */
    return is_err(got, len) ? err_reply(got, len, err) : 0;
}

/* Sends verb and splits its one-line reply, which must start with want. */
static int verb_split(kl_one *c, const char *verb, const char *want, proto_line *l,
                      kiln_error *err) {
    int r = verb_send(c, verb, err);
    if (r)
        return r;
    char *got;
    size_t len;
    r = verb_line(c, &got, &len, err);
    if (r)
        return r;
    if (is_err(got, len))
        return err_reply(got, len, err);
    char perr[96];
    if (proto_split(got, len, l, perr, sizeof perr)) {
        kl_err(err, KILN_EPROTO, "bad %s reply: %s", verb, perr);
        return KILN_EPROTO;
    }
    if (strcmp(l->verb, want)) {
        kl_err(err, KILN_EPROTO, "%s answered with %s", verb, l->verb);
        return KILN_EPROTO;
    }
    return 0;
}

static int kv_int(const proto_line *l, const char *key) {
    const proto_str *v = proto_get(l, key);
    return v ? (int)strtol(v->s, NULL, 10) : 0;
}

int kl1_health(kl_one *c, kiln_health_info *h, kiln_error *err) {
    proto_line l;
    memset(h, 0, sizeof *h);
    int r = verb_split(c, "HEALTH", "HEALTH", &l, err);
    if (r)
        return r;
    h->live = kv_int(&l, "live");
    h->ready = kv_int(&l, "ready");
    h->level = kv_int(&l, "level");
    h->running = kv_int(&l, "running");
    h->waiting = kv_int(&l, "waiting");
    h->draining = kv_int(&l, "draining");
    return 0;
}

int kl1_stats(kl_one *c, kiln_stats_info *s, kiln_error *err) {
    proto_line l;
    memset(s, 0, sizeof *s);
    int r = verb_split(c, "STATS", "STATS", &l, err);
    if (r)
        return r;
    for (int i = 0; i < l.n_kv && s->n < KILN_STATS_MAX; i++) {
        snprintf(s->kv[s->n].key, sizeof s->kv[s->n].key, "%s", l.kv[i].key.s);
        snprintf(s->kv[s->n].value, sizeof s->kv[s->n].value, "%s", l.kv[i].val.s);
        s->n++;
    }
    return 0;
}

const char *kiln_stats_get(const kiln_stats_info *s, const char *key) {
    for (int i = 0; i < s->n && i < KILN_STATS_MAX; i++)
        if (!strcmp(s->kv[i].key, key))
            return s->kv[i].value;
    return NULL;
}

double kiln_stats_num(const kiln_stats_info *s, const char *key, double dflt) {
    const char *v = kiln_stats_get(s, key);
    if (!v || !*v)
        return dflt;
    char *end;
    double x = strtod(v, &end);
    return *end ? dflt : x;
}

/* Appends one body line, less one leading '.' (dot-stuffing), plus '\n'. */
static int body_add(char **buf, size_t *blen, size_t *bcap, const char *line, size_t len) {
    if (len > 0 && line[0] == '.')
        line++, len--;
    if (*blen + len + 2 > KL_BODY_MAX)
        return KILN_EPROTO;
    if (*bcap < *blen + len + 2) {
        size_t cap = *bcap ? *bcap : 65536;
        while (cap < *blen + len + 2)
            cap *= 2;
        char *nb = realloc(*buf, cap);
        if (!nb)
            return KILN_ENOMEM;
        *buf = nb;
        *bcap = cap;
    }
    memcpy(*buf + *blen, line, len);
    *blen += len;
    (*buf)[(*blen)++] = '\n';
    (*buf)[*blen] = '\0';
    return 0;
}

char *kl1_command_body(kl_one *c, const char *line, size_t *len, kiln_error *err) {
    if (len)
        *len = 0;
    if (verb_send(c, line, err))
        return NULL;
    char *got, *buf = NULL;
    size_t glen, blen = 0, bcap = 0;
    if (verb_line(c, &got, &glen, err))
        return NULL;
    if (is_err(got, glen)) {
        err_reply(got, glen, err);
        return NULL;
    }
    /* The body is written in one piece by the server: the lines up to "." are ours. */
    for (;;) {
        if (glen == 1 && got[0] == '.')
            break;
        int r = body_add(&buf, &blen, &bcap, got, glen);
        kiln_error e;
        if (r) {
            free(buf);
            kl_err(&e, r, r == KILN_ENOMEM ? "out of memory" : "body over %zu bytes",
                   KL_BODY_MAX);
            fail_drop(c, r, &e, err);
            return NULL;
        }
        int lr = raw_line(c, &got, &glen, &e);
        if (lr) {
            free(buf);
            fail_drop(c, lr, &e, err);
            return NULL;
        }
    }
    if (!buf && !(buf = calloc(1, 1))) {
        kl_err(err, KILN_ENOMEM, "out of memory");
        return NULL;
    }
    if (len)
        *len = blen;
    return buf;
}

char *kl1_metrics(kl_one *c, size_t *len, kiln_error *err) {
    return kl1_command_body(c, "METRICS", len, err);
}

/* ------------------------------------------------------------------ UPDATE */

#define KL_UPD_CHUNK 65536

/* The file's size and sha256 as hex. 0, or KILN_EINVAL with err set. */
static int file_sha256(FILE *f, const char *path, uint64_t *size, char hex[65], kiln_error *err) {
    static char buf[KL_UPD_CHUNK];
    unsigned char h[32];
    mbedtls_sha256_context sha;
    mbedtls_sha256_init(&sha);
    mbedtls_sha256_starts(&sha, 0);
    size_t n;
    *size = 0;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        mbedtls_sha256_update(&sha, (const unsigned char *)buf, n);
        *size += n;
    }
    mbedtls_sha256_finish(&sha, h);
    mbedtls_sha256_free(&sha);
    if (ferror(f) || *size == 0) {
        kl_err(err, KILN_EINVAL, "%s: %s", path, ferror(f) ? strerror(errno) : "empty");
        return KILN_EINVAL;
    }
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", h[i]);
    return 0;
}

/* The file's bytes after "OK update": each write bounded by the io timeout. */
static int send_file(kl_one *c, FILE *f, kiln_error *err) {
    static char buf[KL_UPD_CHUNK];
    size_t n;
    rewind(f);
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        kiln_error e;
        int r = kl_tls_write(c, buf, n, kl_now_ms() + c->o.io_timeout_ms, &e);
        if (r < 0) return fail_drop(c, r, &e, err);
    }
    if (ferror(f)) {
        kl_err(err, KILN_EINVAL, "read the bundle: %s", strerror(errno));
        kl_drop(c, KILN_EINVAL, err->message); /* the server waits for bytes that never come */
        return KILN_EINVAL;
    }
    c->last_rx_ms = kl_now_ms();
    return 0;
}

int kl1_update(kl_one *c, const char *path, int tries, kiln_on_progress on_progress, void *ud,
                char *reply, size_t cap, kiln_error *err) {
    if (reply && cap) reply[0] = '\0';
    if (tries < 1 || tries > 9) {
        kl_err(err, KILN_EINVAL, "tries must be 1..9");
        return KILN_EINVAL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        kl_err(err, KILN_EINVAL, "%s: %s", path, strerror(errno));
        return KILN_EINVAL;
    }
    uint64_t size;
    char hex[65], line[160], *got;
    size_t len;
    int r = file_sha256(f, path, &size, hex, err);
    snprintf(line, sizeof line, "UPDATE size=%llu sha256=%s tries=%d", (unsigned long long)size, hex, tries);
    if (!r) r = kl1_command(c, line, reply, cap, err); /* "OK update slot=S max=N" */
    if (!r) r = send_file(c, f, err);
    fclose(f);
    while (!r) { /* progress lines, then OK update done or an ERR */
        if ((r = verb_line(c, &got, &len, err))) break;
        if (reply && cap) snprintf(reply, cap, "%s", got);
        if (is_err(got, len)) return err_reply(got, len, err);
        if (!strncmp(got, "OK update done", 14)) return 0;
        unsigned long long k, n;
        if (on_progress && sscanf(got, "UPDATE progress bytes=%llu total=%llu", &k, &n) == 2) on_progress(ud, k, n);
    }
    return r;
}
