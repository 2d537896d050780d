/* manifest: see manifest.h. ECDSA P-256 and SHA-256 from mbedTLS (libmbedcrypto only). */
#include "image/manifest.h"
#include "image/img_err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include <mbedtls/bignum.h>
#include <mbedtls/ecdsa.h>
#include <mbedtls/ecp.h>
#include <mbedtls/sha256.h>

_Static_assert(sizeof(mbedtls_sha256_context) <= sizeof(((man_sha *)0)->ctx), "man_sha too small");

/* ------------------------------------------------------------------ hashing, hex */

void man_sha_init(man_sha *s) {
    mbedtls_sha256_context *c = (mbedtls_sha256_context *)s->ctx;
    mbedtls_sha256_init(c);
    mbedtls_sha256_starts(c, 0);
}

void man_sha_update(man_sha *s, const void *p, size_t n) {
    mbedtls_sha256_update((mbedtls_sha256_context *)s->ctx, p, n);
}

void man_sha_final(man_sha *s, uint8_t out[32]) {
    mbedtls_sha256_context *c = (mbedtls_sha256_context *)s->ctx;
    mbedtls_sha256_finish(c, out);
    mbedtls_sha256_free(c);
}

void man_hex(const uint8_t *p, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * n] = 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1; /* upper case is refused: one spelling per value */
}

/* Exactly 2n lowercase hex digits in s[0..len) into out. */
static int unhex(const char *s, size_t len, uint8_t *out, size_t n) {
    if (len != 2 * n) return -1;
    for (size_t i = 0; i < n; i++) {
        int a = hexval(s[2 * i]), b = hexval(s[2 * i + 1]);
        if (a < 0 || b < 0) return -1;
        out[i] = (uint8_t)(a << 4 | b);
    }
    return 0;
}

/* A decimal without sign or leading zeros ("0" itself is allowed), at most max. */
static int parse_dec(const char *s, size_t len, uint64_t max, uint64_t *v) {
    if (len == 0 || len > 20 || (len > 1 && s[0] == '0')) return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        unsigned d = (unsigned)(s[i] - '0');
        if (x > (UINT64_MAX - d) / 10) return -1;
        x = x * 10 + d;
    }
    if (x > max) return -1;
    *v = x;
    return 0;
}

int man_name_ok(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n >= MAN_NAME_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------ parsing */

typedef struct {
    const char *p, *end;
    int lineno;
} cursor;

/* The next line without its "\n" (required); NULL at the end or on a line without one. */
static const char *next_line(cursor *c, size_t *len) {
    if (c->p >= c->end) return NULL;
    const char *nl = memchr(c->p, '\n', (size_t)(c->end - c->p));
    if (!nl) return NULL;
    const char *l = c->p;
    *len = (size_t)(nl - l);
    c->p = nl + 1;
    c->lineno++;
    return l;
}

/* line == "key " + value: the value's start and length. */
static int keyed(const char *l, size_t len, const char *key, const char **v, size_t *vlen) {
    size_t k = strlen(key);
    if (len <= k + 1 || memcmp(l, key, k) || l[k] != ' ') return 0;
    *v = l + k + 1;
    *vlen = len - k - 1;
    return 1;
}

int man_parse(const char *text, size_t len, man_manifest *m, char *err, size_t cap) {
    memset(m, 0, sizeof *m);
    if (len > MAN_MAX) return img_fail(err, cap, -E2BIG, "manifest: %zu bytes, more than the %d allowed", len, MAN_MAX);
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)text[i];
        if (ch != '\n' && (ch < 0x20 || ch > 0x7e))
            return img_fail(err, cap, -EINVAL, "manifest: byte %zu is 0x%02x (only printable ASCII and LF)", i, ch);
    }
    cursor c = {text, text + len, 0};
    const char *l, *v;
    size_t n, vn;
    uint64_t x;

    l = next_line(&c, &n);
    if (!l || n != 15 || memcmp(l, "kiln-manifest 1", 15))
        return img_fail(err, cap, -EINVAL, "manifest: line 1 is not `kiln-manifest 1` (not a kiln manifest, or a newer format)");
    l = next_line(&c, &n);
    if (!l || !keyed(l, n, "version", &v, &vn) || parse_dec(v, vn, UINT32_MAX, &x) < 0 || x == 0)
        return img_fail(err, cap, -EINVAL, "manifest: line 2 must be `version N` (1..4294967295)");
    m->version = (uint32_t)x;
    l = next_line(&c, &n);
    if (!l || !keyed(l, n, "build-time", &v, &vn) || parse_dec(v, vn, UINT64_MAX, &m->build_time) < 0)
        return img_fail(err, cap, -EINVAL, "manifest: line 3 must be `build-time SECONDS`");

    for (;;) {
        const char *start = c.p;
        l = next_line(&c, &n);
        if (!l) return img_fail(err, cap, -EINVAL, "manifest: ends after line %d without a `sig` line", c.lineno);
        if (keyed(l, n, "sig", &v, &vn)) {
            if (m->nparts == 0) return img_fail(err, cap, -EINVAL, "manifest: no `part` lines");
            if (unhex(v, vn, m->sig, MAN_SIG_LEN) < 0)
                return img_fail(err, cap, -EINVAL, "manifest: line %d: the signature must be %d lowercase hex digits",
                            c.lineno, 2 * MAN_SIG_LEN);
            if (c.p != c.end) return img_fail(err, cap, -EINVAL, "manifest: bytes after the `sig` line");
            m->signed_len = (size_t)(start - text);
            return 0;
        }
        if (!keyed(l, n, "part", &v, &vn))
            return img_fail(err, cap, -EINVAL, "manifest: line %d: expected `part NAME SIZE SHA256` or `sig HEX`", c.lineno);
        if (m->nparts == MAN_PARTS) return img_fail(err, cap, -EINVAL, "manifest: more than %d parts", MAN_PARTS);
        man_part *p = &m->parts[m->nparts];
        const char *sp1 = memchr(v, ' ', vn);
        const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(v + vn - sp1 - 1)) : NULL;
        if (!sp1 || !sp2 || (size_t)(sp1 - v) >= MAN_NAME_MAX)
            return img_fail(err, cap, -EINVAL, "manifest: line %d: expected `part NAME SIZE SHA256`", c.lineno);
        memcpy(p->name, v, (size_t)(sp1 - v));
        p->name[sp1 - v] = 0;
        if (!man_name_ok(p->name))
            return img_fail(err, cap, -EINVAL, "manifest: line %d: part name must be 1..%d of [a-z0-9-]", c.lineno, MAN_NAME_MAX - 1);
        if (man_find(m, p->name)) return img_fail(err, cap, -EINVAL, "manifest: line %d: part `%s` twice", c.lineno, p->name);
        if (parse_dec(sp1 + 1, (size_t)(sp2 - sp1 - 1), UINT64_MAX, &p->size) < 0)
            return img_fail(err, cap, -EINVAL, "manifest: line %d: bad size", c.lineno);
        if (unhex(sp2 + 1, (size_t)(v + vn - sp2 - 1), p->sha256, 32) < 0)
            return img_fail(err, cap, -EINVAL, "manifest: line %d: the sha256 must be 64 lowercase hex digits", c.lineno);
        m->nparts++;
    }
}

const man_part *man_find(const man_manifest *m, const char *name) {
    for (int i = 0; i < m->nparts; i++)
        if (!strcmp(m->parts[i].name, name)) return &m->parts[i];
    return NULL;
}

/* ------------------------------------------------------------------ formatting, signing */

int man_format_body(const man_manifest *m, char *out, size_t cap, char *err, size_t errcap) {
    if (m->version == 0) return img_fail(err, errcap, -EINVAL, "manifest: version must be at least 1");
    if (m->nparts < 1 || m->nparts > MAN_PARTS) return img_fail(err, errcap, -EINVAL, "manifest: 1..%d parts", MAN_PARTS);
    size_t off = 0;
    int w = snprintf(out, cap, "kiln-manifest 1\nversion %u\nbuild-time %llu\n", (unsigned)m->version,
                     (unsigned long long)m->build_time);
    if (w < 0 || (size_t)w >= cap) return img_fail(err, errcap, -E2BIG, "manifest: too long");
    off = (size_t)w;
    for (int i = 0; i < m->nparts; i++) {
        const man_part *p = &m->parts[i];
        if (!man_name_ok(p->name)) return img_fail(err, errcap, -EINVAL, "manifest: bad part name `%.40s`", p->name);
        for (int j = 0; j < i; j++)
            if (!strcmp(m->parts[j].name, p->name)) return img_fail(err, errcap, -EINVAL, "manifest: part `%s` twice", p->name);
        char hex[65];
        man_hex(p->sha256, 32, hex);
        w = snprintf(out + off, cap - off, "part %s %llu %s\n", p->name, (unsigned long long)p->size, hex);
        if (w < 0 || (size_t)w >= cap - off) return img_fail(err, errcap, -E2BIG, "manifest: too long");
        off += (size_t)w;
    }
    return (int)off;
}

static int rng(void *ctx, unsigned char *buf, size_t n) {
    (void)ctx;
    while (n) {
        ssize_t r = getrandom(buf, n, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            return MBEDTLS_ERR_ECP_RANDOM_FAILED;
        }
        buf += r;
        n -= (size_t)r;
    }
    return 0;
}

int man_sign(man_manifest *m, const uint8_t priv[MAN_PRIV_LEN], char *out, size_t cap, char *err, size_t errcap) {
    size_t lim = cap < MAN_MAX + 1 ? cap : MAN_MAX + 1;
    int body = man_format_body(m, out, lim, err, errcap);
    if (body < 0) return body;
    if ((size_t)body + 5 + 2 * MAN_SIG_LEN + 1 > MAN_MAX || (size_t)body + 5 + 2 * MAN_SIG_LEN + 2 > cap)
        return img_fail(err, errcap, -E2BIG, "manifest: more than %d bytes", MAN_MAX);
    uint8_t hash[32];
    mbedtls_sha256((const unsigned char *)out, (size_t)body, hash, 0);

    mbedtls_ecp_group grp;
    mbedtls_mpi d, r, s;
    mbedtls_ecp_group_init(&grp);
    mbedtls_mpi_init(&d), mbedtls_mpi_init(&r), mbedtls_mpi_init(&s);
    int rc = mbedtls_ecp_group_load(&grp, MBEDTLS_ECP_DP_SECP256R1);
    if (!rc) rc = mbedtls_mpi_read_binary(&d, priv, MAN_PRIV_LEN);
    if (!rc) rc = mbedtls_ecp_check_privkey(&grp, &d);
    /* RFC 6979: the nonce comes from the key and the hash; rng only blinds the arithmetic. */
    if (!rc) rc = mbedtls_ecdsa_sign_det_ext(&grp, &r, &s, &d, hash, sizeof hash, MBEDTLS_MD_SHA256, rng, NULL);
    if (!rc) rc = mbedtls_mpi_write_binary(&r, m->sig, 32);
    if (!rc) rc = mbedtls_mpi_write_binary(&s, m->sig + 32, 32);
    mbedtls_mpi_free(&d), mbedtls_mpi_free(&r), mbedtls_mpi_free(&s);
    mbedtls_ecp_group_free(&grp);
    if (rc) return img_fail(err, errcap, -EINVAL, "manifest: signing failed (mbedTLS error -0x%04x; a bad private key?)", (unsigned)-rc);
    char hex[2 * MAN_SIG_LEN + 1];
    man_hex(m->sig, MAN_SIG_LEN, hex);
    int w = snprintf(out + body, cap - (size_t)body, "sig %s\n", hex);
    m->signed_len = (size_t)body;
    return body + w;
}

static int load_pub(mbedtls_ecp_group *grp, mbedtls_ecp_point *q, const uint8_t pub[MAN_PUB_LEN]) {
    int rc = mbedtls_ecp_group_load(grp, MBEDTLS_ECP_DP_SECP256R1);
    if (!rc) rc = mbedtls_ecp_point_read_binary(grp, q, pub, MAN_PUB_LEN);
    if (!rc) rc = mbedtls_ecp_check_pubkey(grp, q);
    return rc;
}

int man_verify(const man_manifest *m, const char *text, const uint8_t pub[MAN_PUB_LEN], char *err, size_t cap) {
    uint8_t hash[32];
    mbedtls_sha256((const unsigned char *)text, m->signed_len, hash, 0);
    mbedtls_ecp_group grp;
    mbedtls_ecp_point q;
    mbedtls_mpi r, s;
    mbedtls_ecp_group_init(&grp);
    mbedtls_ecp_point_init(&q);
    mbedtls_mpi_init(&r), mbedtls_mpi_init(&s);
    int bad_key = 0, rc = load_pub(&grp, &q, pub);
    if (rc) bad_key = 1;
    if (!rc) rc = mbedtls_mpi_read_binary(&r, m->sig, 32);
    if (!rc) rc = mbedtls_mpi_read_binary(&s, m->sig + 32, 32);
    if (!rc) rc = mbedtls_ecdsa_verify(&grp, hash, sizeof hash, &q, &r, &s);
    mbedtls_mpi_free(&r), mbedtls_mpi_free(&s);
    mbedtls_ecp_point_free(&q);
    mbedtls_ecp_group_free(&grp);
    if (bad_key) return img_fail(err, cap, -EINVAL, "manifest: the public key is not a valid P-256 point");
    if (rc) return img_fail(err, cap, -EPERM, "manifest: bad signature (not signed by this key, or changed after signing)");
    return 0;
}

/* ------------------------------------------------------------------ keys */

int man_pub_of(const uint8_t priv[MAN_PRIV_LEN], uint8_t pub[MAN_PUB_LEN], char *err, size_t cap) {
    mbedtls_ecp_group grp;
    mbedtls_ecp_point q;
    mbedtls_mpi d;
    mbedtls_ecp_group_init(&grp);
    mbedtls_ecp_point_init(&q);
    mbedtls_mpi_init(&d);
    size_t olen = 0;
    int rc = mbedtls_ecp_group_load(&grp, MBEDTLS_ECP_DP_SECP256R1);
    if (!rc) rc = mbedtls_mpi_read_binary(&d, priv, MAN_PRIV_LEN);
    if (!rc) rc = mbedtls_ecp_check_privkey(&grp, &d);
    if (!rc) rc = mbedtls_ecp_mul(&grp, &q, &d, &grp.G, rng, NULL);
    if (!rc) rc = mbedtls_ecp_point_write_binary(&grp, &q, MBEDTLS_ECP_PF_UNCOMPRESSED, &olen, pub, MAN_PUB_LEN);
    mbedtls_mpi_free(&d);
    mbedtls_ecp_point_free(&q);
    mbedtls_ecp_group_free(&grp);
    if (rc || olen != MAN_PUB_LEN) return img_fail(err, cap, -EINVAL, "key: not a valid P-256 private key");
    return 0;
}

int man_keygen(uint8_t priv[MAN_PRIV_LEN], uint8_t pub[MAN_PUB_LEN], char *err, size_t cap) {
    mbedtls_ecp_group grp;
    mbedtls_mpi d;
    mbedtls_ecp_group_init(&grp);
    mbedtls_mpi_init(&d);
    int rc = mbedtls_ecp_group_load(&grp, MBEDTLS_ECP_DP_SECP256R1);
    if (!rc) rc = mbedtls_ecp_gen_privkey(&grp, &d, rng, NULL);
    if (!rc) rc = mbedtls_mpi_write_binary(&d, priv, MAN_PRIV_LEN);
    mbedtls_mpi_free(&d);
    mbedtls_ecp_group_free(&grp);
    if (rc) return img_fail(err, cap, -EIO, "keygen: no key (mbedTLS error -0x%04x; getrandom?)", (unsigned)-rc);
    return man_pub_of(priv, pub, err, cap);
}

int man_key_format(int is_private, const uint8_t *key, char *out, size_t cap) {
    char hex[2 * MAN_PUB_LEN + 1];
    man_hex(key, is_private ? MAN_PRIV_LEN : MAN_PUB_LEN, hex);
    int w = snprintf(out, cap, "kiln-key p256 %s %s\n", is_private ? "private" : "public", hex);
    return w < 0 || (size_t)w >= cap ? -E2BIG : w;
}

int man_key_parse(int is_private, const char *text, size_t len, uint8_t *key, char *err, size_t cap) {
    const char *prefix = is_private ? "kiln-key p256 private " : "kiln-key p256 public ";
    size_t pl = strlen(prefix), n = is_private ? MAN_PRIV_LEN : MAN_PUB_LEN;
    if (len > 0 && text[len - 1] == '\n') len--;
    if (len < pl || memcmp(text, prefix, pl) || unhex(text + pl, len - pl, key, n) < 0)
        return img_fail(err, cap, -EINVAL, "key: not a kiln %s key (expected `%s<%zu hex digits>`)",
                    is_private ? "private" : "public", prefix, 2 * n);
    if (is_private) {
        uint8_t pub[MAN_PUB_LEN];
        return man_pub_of(key, pub, err, cap);
    }
    mbedtls_ecp_group grp;
    mbedtls_ecp_point q;
    mbedtls_ecp_group_init(&grp);
    mbedtls_ecp_point_init(&q);
    int rc = load_pub(&grp, &q, key);
    mbedtls_ecp_point_free(&q);
    mbedtls_ecp_group_free(&grp);
    if (rc) return img_fail(err, cap, -EINVAL, "key: the public key is not a valid P-256 point");
    return 0;
}
