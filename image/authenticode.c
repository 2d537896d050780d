/* authenticode: see authenticode.h. */
#include "image/authenticode.h"
#include "image/img_err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mbedtls/asn1.h>
#include <mbedtls/pk.h>
#include <mbedtls/sha256.h>
#include <mbedtls/x509_crt.h>

#define HEAD_MAX (64u << 10)  /* the PE headers and section table must fit here */
#define CERTS_MAX (64u << 10) /* the certificate table */
#define CHUNK (1u << 20)
#define MAX_SECTIONS 96

static uint32_t le16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t le32(const uint8_t *p) { return le16(p) | le16(p + 2) << 16; }

static int pread_full(int fd, void *buf, size_t n, uint64_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -errno;
        if (r == 0) return -ENODATA;
        got += (size_t)r;
    }
    return 0;
}

/* [a, b) of the image (at base in fd) into the hash. */
static int hash_range(int fd, uint64_t base, uint64_t a, uint64_t b, mbedtls_sha256_context *s, uint8_t *buf) {
    while (a < b) {
        size_t k = b - a < CHUNK ? (size_t)(b - a) : CHUNK;
        int r = pread_full(fd, buf, k, base + a);
        if (r < 0) return r;
        mbedtls_sha256_update(s, buf, k);
        a += k;
    }
    return 0;
}

/* ------------------------------------------------------------------ the PE image's hash */

typedef struct {
    uint64_t ptr, size;
} sect;

/* The Authenticode SHA-256 of the image, and where its certificate table is. */
static int pe_hash(int fd, uint64_t off, uint64_t n, uint8_t out[32], uint64_t *coff, uint64_t *clen, char *err, size_t cap) {
    size_t hlen = n < HEAD_MAX ? (size_t)n : HEAD_MAX;
    uint8_t *h = malloc(hlen > CHUNK ? hlen : CHUNK);
    if (!h) return img_fail(err, cap, -ENOMEM, "out of memory");
    int r = pread_full(fd, h, hlen, off);
    if (r < 0) {
        free(h);
        return img_fail(err, cap, r, "read: %s", strerror(-r));
    }
    r = -EINVAL;
    uint64_t pe = hlen >= 64 && h[0] == 'M' && h[1] == 'Z' ? le32(h + 0x3c) : hlen;
    if (pe + 24 > hlen || memcmp(h + pe, "PE\0\0", 4)) {
        img_fail(err, cap, r, "not a PE image");
        goto out;
    }
    uint64_t nsec = le16(h + pe + 6), optsz = le16(h + pe + 20), opt = pe + 24;
    uint64_t dd, nrva;
    if (opt + 2 > hlen) goto bad;
    if (le16(h + opt) == 0x20b) dd = opt + 112, nrva = opt + 108; /* PE32+ */
    else if (le16(h + opt) == 0x10b) dd = opt + 96, nrva = opt + 92;
    else goto bad;
    uint64_t sects = opt + optsz, cks = opt + 64, certdir = dd + 4 * 8, soh;
    if (sects + nsec * 40 > hlen || certdir + 8 > sects || nsec > MAX_SECTIONS) goto bad;
    if (le32(h + nrva) < 5 || !le32(h + certdir + 4)) {
        r = img_fail(err, cap, -EPERM, "not signed (no certificate table)");
        goto out;
    }
    soh = le32(h + opt + 60);
    *coff = le32(h + certdir), *clen = le32(h + certdir + 4);
    if (soh < certdir + 8 || soh > n || *coff < soh || *coff > n || *clen > n - *coff) goto bad;
    sect s[MAX_SECTIONS];
    int k = 0;
    for (uint64_t i = 0; i < nsec; i++) { /* by PointerToRawData, as the spec and EDK2 do */
        const uint8_t *e = h + sects + i * 40;
        sect x = {le32(e + 20), le32(e + 16)};
        if (!x.size) continue;
        if (x.ptr > n || x.size > n - x.ptr) goto bad;
        int j = k++;
        while (j > 0 && s[j - 1].ptr > x.ptr) s[j] = s[j - 1], j--;
        s[j] = x;
    }
    mbedtls_sha256_context c;
    mbedtls_sha256_init(&c);
    mbedtls_sha256_starts(&c, 0);
    uint64_t sum = soh;
    r = hash_range(fd, off, 0, cks, &c, h);
    if (!r) r = hash_range(fd, off, cks + 4, certdir, &c, h);
    if (!r) r = hash_range(fd, off, certdir + 8, soh, &c, h);
    for (int i = 0; i < k && !r; i++) r = hash_range(fd, off, s[i].ptr, s[i].ptr + s[i].size, &c, h), sum += s[i].size;
    if (!r && n > sum + *clen) r = hash_range(fd, off, sum, n - *clen, &c, h);
    mbedtls_sha256_finish(&c, out);
    mbedtls_sha256_free(&c);
    if (r < 0) img_fail(err, cap, r, "read: %s", strerror(-r));
    goto out;
bad:
    img_fail(err, cap, r, "malformed PE headers");
out:
    free(h);
    return r;
}

/* ------------------------------------------------------------------ PKCS#7 SignedData */

static const uint8_t OID_SIGNED_DATA[] = {0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x07, 0x02};
static const uint8_t OID_SPC_INDIRECT[] = {0x2b, 0x06, 0x01, 0x04, 0x01, 0x82, 0x37, 0x02, 0x01, 0x04};
static const uint8_t OID_SHA256[] = {0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01};
static const uint8_t OID_MESSAGE_DIGEST[] = {0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x04};

#define SEQ (MBEDTLS_ASN1_CONSTRUCTED | MBEDTLS_ASN1_SEQUENCE)
#define SET (MBEDTLS_ASN1_CONSTRUCTED | MBEDTLS_ASN1_SET)
#define CTX0 (MBEDTLS_ASN1_CONTEXT_SPECIFIC | MBEDTLS_ASN1_CONSTRUCTED | 0)
#define CTX1 (MBEDTLS_ASN1_CONTEXT_SPECIFIC | MBEDTLS_ASN1_CONSTRUCTED | 1)

static int tag(unsigned char **p, const unsigned char *end, size_t *len, int t) { return mbedtls_asn1_get_tag(p, end, len, t); }

static int oid_is(unsigned char **p, const unsigned char *end, const uint8_t *oid, size_t n) {
    size_t len;
    if (tag(p, end, &len, MBEDTLS_ASN1_OID)) return 0;
    int ok = len == n && !memcmp(*p, oid, n);
    *p += len;
    return ok;
}

/* One signature (DER): 0 when it is over pe (the image hash) and by key. */
static int check_sig(unsigned char *p, const unsigned char *end, const uint8_t pe[32], mbedtls_pk_context *key, char *err, size_t cap) {
    size_t len;
    int v;
    const unsigned char *e1, *e2;
    if (tag(&p, end, &len, SEQ) || !oid_is(&p, p + len, OID_SIGNED_DATA, sizeof OID_SIGNED_DATA) || tag(&p, end, &len, CTX0) ||
        tag(&p, end, &len, SEQ))
        return img_fail(err, cap, -EINVAL, "not a PKCS#7 SignedData");
    end = p + len;
    if (mbedtls_asn1_get_int(&p, end, &v) || tag(&p, end, &len, SET)) goto bad;
    p += len;
    /* contentInfo: SpcIndirectDataContent { data, DigestInfo { sha256, the image hash } } */
    if (tag(&p, end, &len, SEQ)) goto bad;
    e1 = p + len;
    if (!oid_is(&p, e1, OID_SPC_INDIRECT, sizeof OID_SPC_INDIRECT) || tag(&p, e1, &len, CTX0) || tag(&p, e1, &len, SEQ))
        return img_fail(err, cap, -EINVAL, "not an Authenticode signature (no SpcIndirectDataContent)");
    const unsigned char *content = p;
    size_t content_len = len;
    e2 = p + len;
    if (tag(&p, e2, &len, SEQ)) goto bad;
    p += len;
    if (tag(&p, e2, &len, SEQ) || tag(&p, e2, &len, SEQ)) goto bad;
    const unsigned char *alg_end = p + len;
    if (!oid_is(&p, alg_end, OID_SHA256, sizeof OID_SHA256))
        return img_fail(err, cap, -EPERM, "signature: not a SHA-256 image hash");
    p = (unsigned char *)alg_end;
    if (tag(&p, e2, &len, MBEDTLS_ASN1_OCTET_STRING) || len != 32) goto bad;
    if (memcmp(p, pe, 32)) return img_fail(err, cap, -EPERM, "the image's hash is not the one signed (changed after signing)");
    p = (unsigned char *)e1;
    if (p < end && *p == CTX0) { /* certificates: not needed, the key is given */
        if (tag(&p, end, &len, CTX0)) goto bad;
        p += len;
    }
    if (p < end && *p == CTX1) {
        if (tag(&p, end, &len, CTX1)) goto bad;
        p += len;
    }
    /* the first SignerInfo { version, issuer+serial, digestAlg, [0] attrs, sigAlg, sig } */
    if (tag(&p, end, &len, SET) || tag(&p, end, &len, SEQ)) goto bad;
    end = p + len;
    if (mbedtls_asn1_get_int(&p, end, &v) || tag(&p, end, &len, SEQ)) goto bad;
    p += len;
    if (tag(&p, end, &len, SEQ)) goto bad;
    p += len;
    unsigned char *attrs = p;
    if (tag(&p, end, &len, CTX0)) return img_fail(err, cap, -EINVAL, "signature: no signed attributes");
    const unsigned char *attrs_end = p + len;
    uint8_t want[32], got[32];
    int have_md = 0;
    mbedtls_sha256(content, content_len, want, 0);
    while (p < attrs_end) {
        if (tag(&p, attrs_end, &len, SEQ)) goto bad;
        const unsigned char *a_end = p + len;
        if (oid_is(&p, a_end, OID_MESSAGE_DIGEST, sizeof OID_MESSAGE_DIGEST)) {
            if (tag(&p, a_end, &len, SET) || tag(&p, a_end, &len, MBEDTLS_ASN1_OCTET_STRING) || len != 32) goto bad;
            if (memcmp(p, want, 32)) return img_fail(err, cap, -EPERM, "signature: messageDigest is not the signed content's");
            have_md = 1;
        }
        p = (unsigned char *)a_end;
    }
    if (!have_md) return img_fail(err, cap, -EINVAL, "signature: no messageDigest attribute");
    /* The signature is over the attributes' DER as a SET (tag 0x31, not [0]). */
    mbedtls_sha256_context c;
    mbedtls_sha256_init(&c);
    mbedtls_sha256_starts(&c, 0);
    const uint8_t set = 0x31;
    mbedtls_sha256_update(&c, &set, 1);
    mbedtls_sha256_update(&c, attrs + 1, (size_t)(attrs_end - attrs - 1));
    mbedtls_sha256_finish(&c, got);
    mbedtls_sha256_free(&c);
    if (tag(&p, end, &len, SEQ)) goto bad;
    p += len;
    if (tag(&p, end, &len, MBEDTLS_ASN1_OCTET_STRING)) goto bad;
    if (mbedtls_pk_verify(key, MBEDTLS_MD_SHA256, got, 32, p, len))
        return img_fail(err, cap, -EPERM, "signed by another key (not the Secure Boot db certificate's)");
    return 0;
bad:
    return img_fail(err, cap, -EINVAL, "malformed signature (PKCS#7)");
}

int ac_verify(int fd, uint64_t off, uint64_t n, const unsigned char *cert, size_t len, char *err, size_t cap) {
    uint8_t pe[32];
    uint64_t coff = 0, clen = 0;
    int r = pe_hash(fd, off, n, pe, &coff, &clen, err, cap);
    if (r < 0) return r;
    if (clen > CERTS_MAX) return img_fail(err, cap, -EINVAL, "certificate table of %llu bytes", (unsigned long long)clen);
    uint8_t *t = malloc(clen);
    if (!t) return img_fail(err, cap, -ENOMEM, "out of memory");
    if ((r = pread_full(fd, t, clen, off + coff)) < 0) {
        free(t);
        return img_fail(err, cap, r, "read: %s", strerror(-r));
    }
    mbedtls_x509_crt crt;
    mbedtls_x509_crt_init(&crt);
    if (mbedtls_x509_crt_parse(&crt, cert, len)) {
        free(t);
        mbedtls_x509_crt_free(&crt);
        return img_fail(err, cap, -EINVAL, "the db certificate does not parse");
    }
    r = img_fail(err, cap, -EPERM, "not signed (an empty certificate table)");
    /* WIN_CERTIFICATE { dwLength, wRevision, wCertificateType (2: PKCS#7) }, each 8-aligned */
    for (uint64_t at = 0; at + 8 <= clen;) {
        uint32_t l = le32(t + at), type = le16(t + at + 6);
        if (l < 8 || l > clen - at) {
            r = img_fail(err, cap, -EINVAL, "malformed certificate table");
            break;
        }
        if (type == 2) {
            r = check_sig(t + at + 8, t + at + l, pe, &crt.pk, err, cap);
            if (r == 0) break;
        }
        at += (l + 7u) & ~7u;
    }
    mbedtls_x509_crt_free(&crt);
    free(t);
    return r;
}
