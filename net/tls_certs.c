/* tls_certs: development certificates (`kilnd certs`).
 *
 * A CA (EC P-256, 10 years, basicConstraints CA with path length 0: it signs leaves
 * only), a server certificate (CN kiln, serverAuth, 2 years) with the SANs clients
 * check, and a client certificate (CN kiln-client, clientAuth, 2 years) for mTLS.
 * Serial numbers are 16 random bytes; validity starts an hour back so a peer with a
 * slightly slow clock accepts a fresh certificate. Every file is written to a temporary
 * name in the same directory and renamed over the target, so a reader never sees half a
 * PEM; keys are 0600, certificates 0644, a directory we create 0700.
 *
 * Without force, existing files are kept: with both leaf pairs there nothing is done
 * (the CA key need not be), missing leaf pairs are issued by the CA already there, and
 * anything else (half a pair, leaves kept beside a CA that would be new) is refused
 * rather than guessed at. */
#include "net/tls.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/ecp.h>
#include <mbedtls/entropy.h>
#include <mbedtls/error.h>
#include <mbedtls/oid.h>
#include <mbedtls/pk.h>
#include <mbedtls/platform_util.h>
#include <mbedtls/x509_crt.h>
#include <psa/crypto.h>

#if !defined(MBEDTLS_X509_CRT_WRITE_C) || !defined(MBEDTLS_PEM_WRITE_C) ||               \
    !defined(MBEDTLS_PK_WRITE_C) || !defined(MBEDTLS_ECP_DP_SECP256R1_ENABLED)
#error "mbedTLS must be built with X509_CRT_WRITE, PEM_WRITE, PK_WRITE and P-256"
#endif

#define CA_DAYS 3652   /* 10 years */
#define LEAF_DAYS 730  /* 2 years */
#define MAX_SANS 32
#define PEM_MAX 8192

enum { F_CA_CRT, F_CA_KEY, F_SRV_CRT, F_SRV_KEY, F_CLI_CRT, F_CLI_KEY, F_COUNT };
static const char *const fname[F_COUNT] = {"ca.crt",     "ca.key",     "server.crt",
                                           "server.key", "client.crt", "client.key"};

typedef struct {
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg;
} certs_rng;

typedef struct {
    mbedtls_x509_san_list node[MAX_SANS];
    unsigned char ip[MAX_SANS][16];
    int n;
} san_set;

/* The large working buffers of one tls_certs_create, on the heap. */
typedef struct {
    san_set sans;
    unsigned char pem[PEM_MAX], keypem[PEM_MAX];
} certs_work;

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    for (char *p = err; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
}

static const char *mbed_str(int ret, char *buf, size_t cap) {
    mbedtls_strerror(ret, buf, cap);
    return buf;
}

/* ---------------------------------------------------------------- files */

static int join(char *out, size_t cap, const char *dir, const char *name) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

/* mkdir -p with mode 0700 for what we create; an existing directory is left as is. */
static int make_dir(const char *dir, char *err, size_t errlen) {
    char path[4096];
    size_t len = strlen(dir);
    if (len == 0 || len >= sizeof path) {
        set_err(err, errlen, "certs: bad directory name '%s'", dir);
        return -EINVAL;
    }
    memcpy(path, dir, len + 1);
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        if (mkdir(path, 0700) != 0 && errno != EEXIST) {
            int e = errno;
            set_err(err, errlen, "certs: mkdir %s: %s", path, strerror(e));
            return -e;
        }
        *p = c;
        if (c == '\0')
            break;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        set_err(err, errlen, "certs: %s is not a directory", dir);
        return -ENOTDIR;
    }
    return 0;
}

/* Writes data to dir/name through a temporary file and rename: a reader sees the old
 * file or the new one, never a torn one. */
static int write_atomic(const char *dir, const char *name, const void *data, size_t len,
                        mode_t mode, char *err, size_t errlen) {
    char path[4096], tmp[4096];
    if (join(path, sizeof path, dir, name) ||
        snprintf(tmp, sizeof tmp, "%s/.%s.XXXXXX", dir, name) >= (int)sizeof tmp) {
        set_err(err, errlen, "certs: path too long in %s", dir);
        return -ENAMETOOLONG;
    }
    int fd = mkstemp(tmp); /* 0600 from the start: a key is never readable by others */
    if (fd < 0) {
        int e = errno;
        set_err(err, errlen, "certs: create %s: %s", tmp, strerror(e));
        return -e;
    }
    int e = 0;
    const char *p = data;
    size_t left = len;
    while (left && !e) {
        ssize_t n = write(fd, p, left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            e = n < 0 ? errno : EIO;
        else
            p += n, left -= (size_t)n;
    }
    if (!e && fchmod(fd, mode) != 0)
        e = errno;
    if (!e && fsync(fd) != 0)
        e = errno;
    if (close(fd) != 0 && !e)
        e = errno;
    if (!e && rename(tmp, path) != 0)
        e = errno;
    if (e) {
        unlink(tmp);
        set_err(err, errlen, "certs: write %s: %s", path, strerror(e));
        return -e;
    }
    return 0;
}

static void sync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd); /* the renames survive a power cut; best effort */
        close(fd);
    }
}

/* ---------------------------------------------------------------- SANs */

static int add_san(san_set *s, int type, const void *p, size_t len) {
    for (int i = 0; i < s->n; i++) { /* skip duplicates */
        const mbedtls_x509_buf *b = &s->node[i].node.san.unstructured_name;
        if (s->node[i].node.type == type && b->len == len &&
            (type == MBEDTLS_X509_SAN_DNS_NAME ? !strncasecmp((const char *)b->p, p, len)
                                               : !memcmp(b->p, p, len)))
            return 0;
    }
    if (s->n == MAX_SANS)
        return -E2BIG;
    mbedtls_x509_san_list *n = &s->node[s->n];
    memset(n, 0, sizeof *n);
    n->node.type = type;
    if (type == MBEDTLS_X509_SAN_IP_ADDRESS) { /* raw address bytes, kept in the set */
        memcpy(s->ip[s->n], p, len);
        p = s->ip[s->n];
    }
    n->node.san.unstructured_name.tag = MBEDTLS_ASN1_CONTEXT_SPECIFIC | type;
    n->node.san.unstructured_name.p = (unsigned char *)(uintptr_t)p;
    n->node.san.unstructured_name.len = len;
    s->n++;
    return 0;
}

/* The list for mbedTLS, linked last to first: it writes the extension from the end of
 * its buffer backwards, so this order puts the names in the certificate as given. */
static const mbedtls_x509_san_list *san_head(san_set *s) {
    for (int i = 0; i < s->n; i++)
        s->node[i].next = i > 0 ? &s->node[i - 1] : NULL;
    return s->n ? &s->node[s->n - 1] : NULL;
}

/* A host name as RFC 1123 allows it: labels of letters, digits and inner hyphens. */
static int valid_dns(const char *h, size_t len) {
    if (len == 0 || len > 253)
        return 0;
    size_t lab = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)h[i];
        if (c == '.') {
            if (lab == 0 || h[i - 1] == '-')
                return 0;
            lab = 0;
        } else if (isalnum(c) || c == '-') {
            if (c == '-' && lab == 0)
                return 0;
            if (++lab > 63)
                return 0;
        } else {
            return 0;
        }
    }
    return lab > 0 && h[len - 1] != '-';
}

/* One name or address from `hosts`. The strings live in the caller's copy of hosts. */
static int add_host(san_set *s, char *h, char *err, size_t errlen) {
    unsigned char a[16];
    int r;
    if (inet_pton(AF_INET, h, a) == 1)
        r = add_san(s, MBEDTLS_X509_SAN_IP_ADDRESS, a, 4);
    else if (inet_pton(AF_INET6, h, a) == 1)
        r = add_san(s, MBEDTLS_X509_SAN_IP_ADDRESS, a, 16);
    else if (valid_dns(h, strlen(h)))
        r = add_san(s, MBEDTLS_X509_SAN_DNS_NAME, h, strlen(h));
    else {
        set_err(err, errlen, "certs: hosts: '%s' is neither a host name nor an IP address", h);
        return -EINVAL;
    }
    if (r)
        set_err(err, errlen, "certs: hosts: more than %d names", MAX_SANS);
    return r;
}

static int build_sans(san_set *s, char *hosts, char *err, size_t errlen) {
    static char localhost[] = "localhost", v4[] = "127.0.0.1", v6[] = "::1";
    int r;
    s->n = 0;
    if ((r = add_host(s, localhost, err, errlen)) || (r = add_host(s, v4, err, errlen)) ||
        (r = add_host(s, v6, err, errlen)))
        return r;
    for (char *save = NULL, *tok = hosts ? strtok_r(hosts, ",", &save) : NULL; tok;
         tok = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*tok))
            tok++;
        char *end = tok + strlen(tok);
        while (end > tok && isspace((unsigned char)end[-1]))
            *--end = '\0';
        if (*tok && (r = add_host(s, tok, err, errlen)))
            return r;
    }
    return 0;
}

/* ---------------------------------------------------------------- keys, certificates */

static int gen_key(mbedtls_pk_context *pk, certs_rng *rng) {
    int r = mbedtls_pk_setup(pk, mbedtls_pk_info_from_type(MBEDTLS_PK_ECKEY));
    if (r)
        return r;
    return mbedtls_ecp_gen_key(MBEDTLS_ECP_DP_SECP256R1, mbedtls_pk_ec(*pk),
                               mbedtls_ctr_drbg_random, &rng->drbg);
}

/* X.509 time, "YYYYMMDDhhmmss" in UTC, for now + secs. */
static int x509_time(char out[16], time_t now, long long secs) {
    time_t t = (time_t)(now + secs);
    struct tm tm;
    if (!gmtime_r(&t, &tm))
        return -1;
    return strftime(out, 16, "%Y%m%d%H%M%S", &tm) == 14 ? 0 : -1;
}

typedef enum { K_CA, K_SERVER, K_CLIENT } cert_kind;

typedef struct {
    cert_kind kind;
    const char *subject;    /* "CN=...,O=..." */
    const char *issuer;     /* the CA's subject */
    mbedtls_pk_context *key, *issuer_key;
    const mbedtls_x509_san_list *sans;
    int days;
} cert_req;

static int make_cert(const cert_req *q, certs_rng *rng, unsigned char *pem, size_t cap) {
    mbedtls_x509write_cert w;
    mbedtls_x509write_crt_init(&w);
    unsigned char serial[16];
    char nb[16], na[16];
    int r;
    time_t now = time(NULL);
    if (x509_time(nb, now, -3600) || x509_time(na, now, (long long)q->days * 86400)) {
        r = MBEDTLS_ERR_X509_BAD_INPUT_DATA;
        goto out;
    }
    if ((r = mbedtls_ctr_drbg_random(&rng->drbg, serial, sizeof serial)))
        goto out;
    serial[0] &= 0x7f; /* a positive INTEGER ... */
    if (serial[0] == 0)
        serial[0] = 0x01; /* ... in exactly 16 bytes, so none is ever 0 */

    mbedtls_x509write_crt_set_version(&w, MBEDTLS_X509_CRT_VERSION_3);
    mbedtls_x509write_crt_set_md_alg(&w, MBEDTLS_MD_SHA256);
    mbedtls_x509write_crt_set_subject_key(&w, q->key);
    mbedtls_x509write_crt_set_issuer_key(&w, q->issuer_key);
    if ((r = mbedtls_x509write_crt_set_serial_raw(&w, serial, sizeof serial)) ||
        (r = mbedtls_x509write_crt_set_subject_name(&w, q->subject)) ||
        (r = mbedtls_x509write_crt_set_issuer_name(&w, q->issuer)) ||
        (r = mbedtls_x509write_crt_set_validity(&w, nb, na)) ||
        (r = mbedtls_x509write_crt_set_basic_constraints(&w, q->kind == K_CA, 0)) ||
        (r = mbedtls_x509write_crt_set_subject_key_identifier(&w)) ||
        (r = mbedtls_x509write_crt_set_authority_key_identifier(&w)))
        goto out;
    if (q->kind == K_CA) {
        r = mbedtls_x509write_crt_set_key_usage(&w, MBEDTLS_X509_KU_KEY_CERT_SIGN |
                                                        MBEDTLS_X509_KU_CRL_SIGN);
    } else {
        /* ECDHE with an ECDSA key: the key only signs. */
        r = mbedtls_x509write_crt_set_key_usage(&w, MBEDTLS_X509_KU_DIGITAL_SIGNATURE);
        if (!r) {
            mbedtls_asn1_sequence eku;
            memset(&eku, 0, sizeof eku);
            eku.buf.tag = MBEDTLS_ASN1_OID;
            if (q->kind == K_SERVER) {
                eku.buf.p = (unsigned char *)MBEDTLS_OID_SERVER_AUTH;
                eku.buf.len = MBEDTLS_OID_SIZE(MBEDTLS_OID_SERVER_AUTH);
            } else {
                eku.buf.p = (unsigned char *)MBEDTLS_OID_CLIENT_AUTH;
                eku.buf.len = MBEDTLS_OID_SIZE(MBEDTLS_OID_CLIENT_AUTH);
            }
            r = mbedtls_x509write_crt_set_ext_key_usage(&w, &eku);
        }
        if (!r && q->sans)
            r = mbedtls_x509write_crt_set_subject_alternative_name(&w, q->sans);
    }
    if (r)
        goto out;
    r = mbedtls_x509write_crt_pem(&w, pem, cap, mbedtls_ctr_drbg_random, &rng->drbg);
out:
    mbedtls_x509write_crt_free(&w);
    return r;
}

/* A fresh key and certificate for one kind, both written to dir. */
static int issue(const char *dir, cert_req *q, int crt_file, certs_rng *rng,
                 certs_work *wk, char *err, size_t errlen) {
    char m[120];
    int r = gen_key(q->key, rng);
    if (r) {
        set_err(err, errlen, "certs: key for %s: %s", fname[crt_file], mbed_str(r, m, sizeof m));
        return -EIO;
    }
    if (q->kind == K_CA)
        q->issuer_key = q->key;
    r = make_cert(q, rng, wk->pem, sizeof wk->pem);
    if (r) {
        set_err(err, errlen, "certs: %s: %s", fname[crt_file], mbed_str(r, m, sizeof m));
        return -EIO;
    }
    r = mbedtls_pk_write_key_pem(q->key, wk->keypem, sizeof wk->keypem);
    if (r) {
        set_err(err, errlen, "certs: %s: %s", fname[crt_file + 1], mbed_str(r, m, sizeof m));
        return -EIO;
    }
    /* Key first: a crash in between leaves a key without its certificate, which the
     * next run reports instead of trusting. */
    r = write_atomic(dir, fname[crt_file + 1], wk->keypem, strlen((char *)wk->keypem), 0600,
                     err, errlen);
    mbedtls_platform_zeroize(wk->keypem, sizeof wk->keypem);
    if (r)
        return r;
    return write_atomic(dir, fname[crt_file], wk->pem, strlen((char *)wk->pem), 0644, err,
                        errlen);
}

/* The CA already in dir, to issue missing leaves with. */
static int load_ca(const char *dir, mbedtls_pk_context *key, char *subject, size_t cap,
                   certs_rng *rng, char *err, size_t errlen) {
    char crt_path[4096], key_path[4096], m[120];
    mbedtls_x509_crt crt;
    mbedtls_x509_crt_init(&crt);
    int r = -EINVAL;
    if (join(crt_path, sizeof crt_path, dir, fname[F_CA_CRT]) ||
        join(key_path, sizeof key_path, dir, fname[F_CA_KEY])) {
        set_err(err, errlen, "certs: path too long in %s", dir);
        r = -ENAMETOOLONG;
        goto out;
    }
    int e = mbedtls_x509_crt_parse_file(&crt, crt_path);
    if (e) {
        set_err(err, errlen, "certs: %s: %s", crt_path,
                e < 0 ? mbed_str(e, m, sizeof m) : "damaged certificate");
        goto out;
    }
    if ((e = mbedtls_pk_parse_keyfile(key, key_path, NULL, mbedtls_ctr_drbg_random,
                                      &rng->drbg))) {
        set_err(err, errlen, "certs: %s: %s", key_path, mbed_str(e, m, sizeof m));
        goto out;
    }
    if ((e = mbedtls_pk_check_pair(&crt.pk, key, mbedtls_ctr_drbg_random, &rng->drbg))) {
        set_err(err, errlen, "certs: %s does not match %s", key_path, crt_path);
        goto out;
    }
    if (mbedtls_x509_dn_gets(subject, cap, &crt.subject) < 0) {
        set_err(err, errlen, "certs: %s: subject too long", crt_path);
        goto out;
    }
    r = 0;
out:
    mbedtls_x509_crt_free(&crt);
    return r;
}

int tls_certs_create(const char *dir, const char *hosts, int force, char *err,
                     size_t errlen) {
    char m[120];
    if (err && errlen)
        err[0] = '\0';
    if (!dir || !dir[0]) {
        set_err(err, errlen, "certs: no directory given");
        return -EINVAL;
    }
    certs_work *wk = calloc(1, sizeof *wk);
    char *hcopy = hosts ? strdup(hosts) : NULL;
    if (!wk || (hosts && !hcopy)) {
        free(wk);
        free(hcopy);
        set_err(err, errlen, "certs: out of memory");
        return -ENOMEM;
    }
    int r = build_sans(&wk->sans, hcopy, err, errlen); /* before touching the disk */
    if (r)
        goto out_hosts;
    if ((r = make_dir(dir, err, errlen)))
        goto out_hosts;

    int have[F_COUNT];
    for (int i = 0; i < F_COUNT; i++) {
        char p[4096];
        if (join(p, sizeof p, dir, fname[i])) {
            set_err(err, errlen, "certs: path too long in %s", dir);
            r = -ENAMETOOLONG;
            goto out_hosts;
        }
        have[i] = !force && access(p, F_OK) == 0;
    }
    int need_srv = !have[F_SRV_CRT] || !have[F_SRV_KEY];
    int need_cli = !have[F_CLI_CRT] || !have[F_CLI_KEY];
    int need_ca = !have[F_CA_CRT] && !have[F_CA_KEY];
    /* Both leaf pairs there: kept, and the CA is not needed (its key may well have been
     * moved somewhere safer). */
    if (!need_srv && !need_cli)
        goto out_hosts;
    /* Half a pair, or leaves kept beside a new CA that did not sign them: refuse. */
    for (int i = 0; i < F_COUNT; i += 2)
        if (have[i] != have[i + 1]) {
            set_err(err, errlen, "certs: %s/%s exists without %s; remove it or use force",
                    dir, fname[have[i] ? i : i + 1], fname[have[i] ? i + 1 : i]);
            r = -EEXIST;
            goto out_hosts;
        }
    if (need_ca && (!need_srv || !need_cli)) {
        set_err(err, errlen, "certs: %s/%s exists without the CA that signed it; use force",
                dir, fname[!need_srv ? F_SRV_CRT : F_CLI_CRT]);
        r = -EEXIST;
        goto out_hosts;
    }

    certs_rng rng;
    mbedtls_pk_context ca_key, leaf_key;
    mbedtls_entropy_init(&rng.entropy);
    mbedtls_ctr_drbg_init(&rng.drbg);
    mbedtls_pk_init(&ca_key);
    mbedtls_pk_init(&leaf_key);
    static const char ca_subject[] = "CN=kiln development CA,O=kiln";
    char issuer[512];

    /* Key generation may go through PSA under some configurations; cheap when done. */
    psa_status_t ps = psa_crypto_init();
    if (ps != PSA_SUCCESS) {
        set_err(err, errlen, "certs: PSA crypto init failed (%d)", (int)ps);
        r = -EIO;
        goto out;
    }
    static const unsigned char pers[] = "kiln certs";
    if ((r = mbedtls_ctr_drbg_seed(&rng.drbg, mbedtls_entropy_func, &rng.entropy, pers,
                                   sizeof pers - 1))) {
        set_err(err, errlen, "certs: seeding the RNG: %s", mbed_str(r, m, sizeof m));
        r = -EIO;
        goto out;
    }
    if (need_ca) {
        cert_req q = {K_CA, ca_subject, ca_subject, &ca_key, NULL, NULL, CA_DAYS};
        if ((r = issue(dir, &q, F_CA_CRT, &rng, wk, err, errlen)))
            goto out;
        snprintf(issuer, sizeof issuer, "%s", ca_subject);
    } else if ((r = load_ca(dir, &ca_key, issuer, sizeof issuer, &rng, err, errlen))) {
        goto out;
    }
    if (need_srv) {
        cert_req q = {K_SERVER, "CN=kiln,O=kiln", issuer, &leaf_key, &ca_key,
                      san_head(&wk->sans), LEAF_DAYS};
        if ((r = issue(dir, &q, F_SRV_CRT, &rng, wk, err, errlen)))
            goto out;
        mbedtls_pk_free(&leaf_key);
        mbedtls_pk_init(&leaf_key);
    }
    if (need_cli) {
        cert_req q = {K_CLIENT, "CN=kiln-client,O=kiln", issuer, &leaf_key, &ca_key, NULL,
                      LEAF_DAYS};
        if ((r = issue(dir, &q, F_CLI_CRT, &rng, wk, err, errlen)))
            goto out;
    }
    sync_dir(dir);
out:
    mbedtls_pk_free(&leaf_key);
    mbedtls_pk_free(&ca_key);
    mbedtls_ctr_drbg_free(&rng.drbg);
    mbedtls_entropy_free(&rng.entropy);
out_hosts:
    free(hcopy);
    free(wk);
    return r;
}
