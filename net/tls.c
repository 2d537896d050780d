/* tls: the server side of TLS 1.3 and 1.2 on mbedTLS 3.6, over the caller's BIO.
 *
 * One tls_server holds everything shared by its sessions: the mbedtls_ssl_config, the
 * certificate chain and key, the client CA, and the RNG (CTR_DRBG over the entropy
 * pool). One tls_conn is little more than an mbedtls_ssl_context; its record buffers
 * are allocated by mbedtls_ssl_setup in tls_conn_new, so the data path allocates
 * nothing of ours. After tls_use_heap (kilnd's loop) all of a session's memory, mbedTLS's
 * included, comes from the caller's heap instead of malloc (see "memory" below). Nothing
 * here is thread-safe: a server and its sessions belong to
 * one loop (the DRBG is shared by the sessions without a lock).
 *
 * mbedTLS is driven through mbedtls_ssl_set_bio; the callbacks turn -EAGAIN from the
 * caller's BIO into WANT_READ/WANT_WRITE and remember any other errno for the message.
 *
 * The write path has one subtlety. After WANT_WRITE, mbedTLS holds a half-sent record
 * and expects the same mbedtls_ssl_write call again; a write while any output is
 * still queued only flushes and then reports the length it was given. So tls_write
 * remembers the length it passed and passes exactly that again, and it looks at the
 * context's out_left (private in mbedTLS 3.6, read in one helper) to tell whether a
 * queued record is ours, someone else's (an alert), or already gone (an alert send
 * flushes a queued record first). Without that look a refused renegotiation on TLS 1.2
 * could duplicate or drop application data.
 *
 * TLS 1.3 KeyUpdate (RFC 8446 §4.6.3) is done inside mbedTLS, by kiln's patch to it
 * (scripts/deps/mbedtls/keyupdate.patch; upstream 3.6 has no KeyUpdate code): a
 * client's KeyUpdate is processed within mbedtls_ssl_read, and when it asks for ours,
 * ours goes out before our next record of data. That KeyUpdate can be the record queued
 * after WANT_WRITE; the patched mbedtls_ssl_write tells it from our data, and so does
 * tls_write (the key_update_queued field, read in one helper). A malformed KeyUpdate
 * fails the session with the alert mbedTLS sent; tls_read names it (in_msg, read in
 * got_key_update). */
#include "net/tls.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>
#include <mbedtls/error.h>
#include <mbedtls/oid.h>
#include <mbedtls/pk.h>
#include <mbedtls/platform.h>
#include <mbedtls/ssl.h>
#include <mbedtls/ssl_ciphersuites.h>
#include <mbedtls/x509_crt.h>
#include <psa/crypto.h>

#include "mm/heap.h"

#if !defined(MBEDTLS_SSL_SRV_C) || !defined(MBEDTLS_SSL_PROTO_TLS1_2) ||                  \
    !defined(MBEDTLS_SSL_PROTO_TLS1_3) || !defined(MBEDTLS_SSL_KEEP_PEER_CERTIFICATE)
#error "mbedTLS must be built with the TLS server, TLS 1.2 + 1.3 and KEEP_PEER_CERTIFICATE"
#endif
#if !defined(MBEDTLS_SSL_TLS1_3_KEY_UPDATE_KILN)
#error "mbedTLS without kiln's KeyUpdate patch (scripts/deps/mbedtls/keyupdate.patch, applied by scripts/deps.sh)"
#endif
#if !defined(MBEDTLS_ECP_HAVE_CURVE25519) || !defined(MBEDTLS_ECP_HAVE_SECP256R1) ||      \
    !defined(MBEDTLS_ECP_HAVE_SECP384R1)
#error "mbedTLS must be built with X25519, P-256 and P-384 (tls_groups)"
#endif

/* Our own codes for the BIO callbacks, in mbedTLS's NET range so mbedtls_strerror
 * still names them; net_sockets.c itself is not used. */
#define TLS_ERR_RECV (-0x004C) /* MBEDTLS_ERR_NET_RECV_FAILED */
#define TLS_ERR_SEND (-0x004E) /* MBEDTLS_ERR_NET_SEND_FAILED */

#define TLS_MAX_SUITES 12
#define TLS_CN_MAX 64 /* ub-common-name in RFC 5280 */

struct tls_server {
    mbedtls_ssl_config conf;
    mbedtls_x509_crt cert;
    mbedtls_pk_context key;
    mbedtls_x509_crt client_ca;
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg;
    int suites[TLS_MAX_SUITES + 1]; /* 0-terminated; conf keeps a pointer to it */
};

struct tls_conn {
    mbedtls_ssl_context ssl;
    tls_bio bio;
    int state;        /* 0 handshaking, 1 established, < 0 failed (returned again) */
    int closing;      /* close_notify: 0 not yet, 1 queued (WANT_WRITE), 2 sent */
    int eof;          /* the peer closed: reads return 0 from now on */
    int io_errno;     /* the BIO's last errno other than EAGAIN, for the message */
    int not_tls;      /* the first byte was no TLS handshake record */
    int alerted;      /* the failure was told to the peer by a fatal alert we sent */
    size_t nread;     /* bytes read from the stream so far */
    size_t nwritten;  /* bytes written to the stream so far */
    size_t wpending;  /* length given to the mbedtls_ssl_write that said WANT_WRITE */
    int wpending_ku;  /* and what it left queued was our KeyUpdate, not those bytes */
    int cn_len;       /* verified client certificate's CN, -ENOENT without one */
    char cn[TLS_CN_MAX + 1];
    unsigned char head[16]; /* the first bytes, quoted when they are not TLS */
    size_t head_len;
    char err[200];
};

/* ---------------------------------------------------------------- errors */

static void fmt_err(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fmt_err(char *buf, size_t cap, const char *fmt, ...) {
    if (!buf || !cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    /* One line, whatever mbedTLS or a file name put in. */
    for (char *p = buf; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
}

static const char *mbed_str(int ret, char *buf, size_t cap) {
    mbedtls_strerror(ret, buf, cap);
    return buf;
}

/* Certificate verification flags as one line: "not trusted; expired". */
static void verify_text(uint32_t flags, char *buf, size_t cap) {
    char tmp[512];
    if (mbedtls_x509_crt_verify_info(tmp, sizeof tmp, "", flags) <= 0) {
        snprintf(buf, cap, "flags 0x%08x", (unsigned)flags);
        return;
    }
    size_t o = 0;
    for (const char *p = tmp; *p && o + 3 < cap; p++) {
        if (*p == '\n') {
            if (p[1] && o + 3 < cap) {
                buf[o++] = ';';
                buf[o++] = ' ';
            }
        } else {
            buf[o++] = *p;
        }
    }
    buf[o] = '\0';
}

/* The stream's first bytes, printable, for "not TLS" messages. */
static void quote_head(const tls_conn *t, char *buf, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < t->head_len && o + 5 < cap; i++) {
        unsigned char c = t->head[i];
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
            buf[o++] = (char)c;
        else
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
    }
    buf[o < cap ? o : cap - 1] = '\0';
}

/* Marks the session failed with a negative errno-style code and a message saying
 * what, built from the mbedTLS error and what we know beside it. */
static int fail(tls_conn *t, const char *what, int ret) {
    char m[120], extra[160];
    int code = -EPROTO;
    if (t->not_tls) {
        char q[64];
        quote_head(t, q, sizeof q);
        fmt_err(t->err, sizeof t->err, "%s: not TLS (plaintext? the stream starts \"%s\")",
                what, q);
    } else if ((ret == TLS_ERR_RECV || ret == TLS_ERR_SEND) && t->io_errno) {
        fmt_err(t->err, sizeof t->err, "%s: %s: %s", what,
                ret == TLS_ERR_RECV ? "read" : "write", strerror(t->io_errno));
        code = -t->io_errno;
    } else if (ret == MBEDTLS_ERR_SSL_CONN_EOF) {
        fmt_err(t->err, sizeof t->err, "%s: the peer closed the connection", what);
        code = -ECONNRESET;
    } else {
        uint32_t flags = mbedtls_ssl_get_verify_result(&t->ssl);
        int bad_cert = ret == MBEDTLS_ERR_X509_CERT_VERIFY_FAILED ||
                       ret == MBEDTLS_ERR_SSL_BAD_CERTIFICATE;
        if (bad_cert || ret == MBEDTLS_ERR_SSL_NO_CLIENT_CERTIFICATE)
            code = -EACCES;
        else if (ret == MBEDTLS_ERR_SSL_ALLOC_FAILED)
            code = -ENOMEM;
        if (bad_cert && flags != 0 && flags != 0xFFFFFFFFu) {
            /* The flags say why; mbedTLS's text for the code says only "failed". */
            verify_text(flags, extra, sizeof extra);
            fmt_err(t->err, sizeof t->err, "%s: client certificate rejected: %s", what, extra);
        } else {
            fmt_err(t->err, sizeof t->err, "%s: %s (-0x%04x)", what, mbed_str(ret, m, sizeof m),
                    (unsigned)-ret);
        }
    }
    /* -EAGAIN means "again later" to the caller: never use it for a failure. */
    if (code == -EAGAIN || code >= 0)
        code = -EIO;
    t->state = code;
    return code;
}

/* ---------------------------------------------------------------- BIO */

static int bio_send(void *ctx, const unsigned char *buf, size_t len) {
    tls_conn *t = ctx;
    if (len > INT_MAX)
        len = INT_MAX;
    ssize_t n = t->bio.write(t->bio.ctx, buf, len);
    /* 0 breaks the contract (> 0 or -EAGAIN); treat it as "no room" rather than
     * letting mbedTLS read it as progress. */
    if (n == -EAGAIN || n == -EWOULDBLOCK || n == 0)
        return MBEDTLS_ERR_SSL_WANT_WRITE;
    if (n < 0 || (size_t)n > len) {
        t->io_errno = n < 0 ? (int)-n : EIO;
        return TLS_ERR_SEND;
    }
    t->nwritten += (size_t)n;
    return (int)n;
}

static int bio_recv(void *ctx, unsigned char *buf, size_t len) {
    tls_conn *t = ctx;
    if (len > INT_MAX)
        len = INT_MAX;
    ssize_t n = t->bio.read(t->bio.ctx, buf, len);
    if (n == -EAGAIN || n == -EWOULDBLOCK)
        return MBEDTLS_ERR_SSL_WANT_READ;
    if (n == 0)
        return 0; /* mbedTLS turns it into MBEDTLS_ERR_SSL_CONN_EOF */
    if (n < 0 || (size_t)n > len) {
        t->io_errno = n < 0 ? (int)-n : EIO;
        return TLS_ERR_RECV;
    }
    if (t->head_len < sizeof t->head) {
        size_t k = sizeof t->head - t->head_len;
        if (k > (size_t)n)
            k = (size_t)n;
        memcpy(t->head + t->head_len, buf, k);
        t->head_len += k;
    }
    /* A client speaks first and its first record is a handshake record (22); SSLv2
     * hellos are not supported by mbedTLS either. Decide on the first byte, so that a
     * plaintext client sending a short line ("HELLO kiln/1\n" or less than a record
     * header) fails now instead of when the handshake times out. */
    if (t->nread == 0 && buf[0] != MBEDTLS_SSL_MSG_HANDSHAKE) {
        t->not_tls = 1;
        return MBEDTLS_ERR_SSL_INVALID_RECORD;
    }
    t->nread += (size_t)n;
    return (int)n;
}

/* Whether mbedTLS holds output not yet on the stream (see the top of the file). */
static int out_pending(const tls_conn *t) {
    return t->ssl.MBEDTLS_PRIVATE(out_left) != 0;
}

/* Whether the output mbedTLS holds is its own KeyUpdate rather than our data (the
 * patch's key_update_queued, private like out_left). */
static int ku_queued(const tls_conn *t) {
    return out_pending(t) && t->ssl.MBEDTLS_PRIVATE(key_update_queued);
}

/* Whether the message mbedTLS just failed on is a TLS 1.3 KeyUpdate. It is still in
 * in_msg then (private in mbedTLS 3.6, like out_left: read here only). */
static int got_key_update(const tls_conn *t) {
    const mbedtls_ssl_context *ssl = &t->ssl;
    return mbedtls_ssl_get_version_number(ssl) == MBEDTLS_SSL_VERSION_TLS1_3 &&
           ssl->MBEDTLS_PRIVATE(in_msgtype) == MBEDTLS_SSL_MSG_HANDSHAKE &&
           ssl->MBEDTLS_PRIVATE(in_msg) && ssl->MBEDTLS_PRIVATE(in_msglen) >= 1 &&
           ssl->MBEDTLS_PRIVATE(in_msg)[0] == MBEDTLS_SSL_HS_KEY_UPDATE;
}

/* A KeyUpdate the patched mbedTLS refused: it has sent the fatal alert that says why
 * (RFC 8446 §4.6.3, §5.1), flushing what was queued before it; on the stream unless
 * something is still queued. The caller closes gracefully then (tls_alerted). */
static int bad_key_update(tls_conn *t, int ret) {
    const mbedtls_ssl_context *ssl = &t->ssl;
    char many[96];
    snprintf(many, sizeof many, "more than %d in a row with no data between (unexpected_message)",
             MBEDTLS_SSL_TLS1_3_MAX_KEY_UPDATES_IN_A_ROW);
    const char *why = ret == MBEDTLS_ERR_SSL_DECODE_ERROR ? "its body is not one byte (decode_error)"
                      : ret == MBEDTLS_ERR_SSL_ILLEGAL_PARAMETER
                          ? "request_update is neither 0 nor 1 (illegal_parameter)"
                      : ssl->MBEDTLS_PRIVATE(in_msglen) > ssl->MBEDTLS_PRIVATE(in_hslen)
                          ? "it does not end its record (unexpected_message)"
                          : many;
    t->alerted = !out_pending(t);
    int code = fail(t, "read", ret);
    fmt_err(t->err, sizeof t->err, "read: bad TLS 1.3 KeyUpdate from the client: %s; alert %s",
            why, t->alerted ? "sent" : "not sent (output blocked)");
    return code;
}

/* A message after the handshake that mbedTLS cannot take: as a server, a TLS 1.3
 * NewSessionTicket or an unknown type (mbedtls_ssl_read returns UNEXPECTED_MESSAGE
 * without telling the peer). Say so in the log and to the client (a fatal
 * unexpected_message alert), and let the caller close gracefully (tls_alerted). */
static int refuse_unexpected(tls_conn *t, int ret) {
    int r = mbedtls_ssl_send_alert_message(&t->ssl, MBEDTLS_SSL_ALERT_LEVEL_FATAL,
                                           MBEDTLS_SSL_ALERT_MSG_UNEXPECTED_MESSAGE);
    /* 0 with nothing left queued: the whole alert is on the stream. A record of ours
     * still half-sent makes mbedTLS flush it instead; then the peer learns nothing. */
    t->alerted = r == 0 && !out_pending(t);
    return fail(t, "read", ret);
}

/* ---------------------------------------------------------------- server */

static int file_readable(const char *what, const char *path, char *err, size_t errlen) {
    if (access(path, R_OK) == 0)
        return 0;
    fmt_err(err, errlen, "%s %s: %s", what, path, strerror(errno));
    return -1;
}

static int load_crt(mbedtls_x509_crt *crt, const char *what, const char *path, char *err,
                    size_t errlen) {
    char m[120];
    if (file_readable(what, path, err, errlen))
        return -1;
    int r = mbedtls_x509_crt_parse_file(crt, path);
    if (r < 0) {
        fmt_err(err, errlen, "%s %s: %s", what, path, mbed_str(r, m, sizeof m));
        return -1;
    }
    if (r > 0) { /* some blocks parsed, r did not: a damaged file, not a partial chain */
        fmt_err(err, errlen, "%s %s: %d certificate(s) could not be parsed", what, path, r);
        return -1;
    }
    return 0;
}

/* The AEAD suites of our policy, in preference order, less those this build lacks.
 * ECDHE only for TLS 1.2: no DHE-RSA suite, since a finite-field exchange costs the
 * loop far more CPU than an elliptic-curve one (see tls_groups). */
static void pick_suites(int *out) {
    static const int want[] = {
        MBEDTLS_TLS1_3_AES_128_GCM_SHA256,
        MBEDTLS_TLS1_3_AES_256_GCM_SHA384,
        MBEDTLS_TLS1_3_CHACHA20_POLY1305_SHA256,
        MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        MBEDTLS_TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        MBEDTLS_TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        MBEDTLS_TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        MBEDTLS_TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    };
    int n = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0] && n < TLS_MAX_SUITES; i++)
        if (mbedtls_ssl_ciphersuite_from_id(want[i]))
            out[n++] = want[i];
    out[n] = 0;
}

/* The key-exchange groups, in preference order, for TLS 1.3 and TLS 1.2's ECDHE alike.
 * mbedTLS's default list also has X448, P-521, the brainpool curves and FFDHE 2048 to
 * 8192: a handshake over ffdhe8192 takes about 0.75 s of CPU, all of it on the one
 * loop every session shares, so any client could stall the others at will. These
 * three cost a few milliseconds at most, and every TLS 1.3 client offers one of them
 * (RFC 8446 §9.1 makes P-256 mandatory, X25519 recommended). */
static const uint16_t tls_groups[] = {
    MBEDTLS_SSL_IANA_TLS_GROUP_X25519,
    MBEDTLS_SSL_IANA_TLS_GROUP_SECP256R1,
    MBEDTLS_SSL_IANA_TLS_GROUP_SECP384R1,
    MBEDTLS_SSL_IANA_TLS_GROUP_NONE,
};

tls_server *tls_server_new(const tls_config *cfg, char *err, size_t errlen) {
    char m[120];
    int r;
    if (err && errlen)
        err[0] = '\0';
    if (!cfg || !cfg->cert || !cfg->cert[0] || !cfg->key || !cfg->key[0]) {
        fmt_err(err, errlen, "tls: no certificate or key file given");
        return NULL;
    }
    tls_server *s = calloc(1, sizeof *s);
    if (!s) {
        fmt_err(err, errlen, "tls: out of memory");
        return NULL;
    }
    mbedtls_ssl_config_init(&s->conf);
    mbedtls_x509_crt_init(&s->cert);
    mbedtls_pk_init(&s->key);
    mbedtls_x509_crt_init(&s->client_ca);
    mbedtls_entropy_init(&s->entropy);
    mbedtls_ctr_drbg_init(&s->drbg);

    /* TLS 1.3 in mbedTLS 3.6 does its key schedule and key exchange through PSA.
     * psa_crypto_init is idempotent, and never undone: other servers may share it. */
    psa_status_t ps = psa_crypto_init();
    if (ps != PSA_SUCCESS) {
        fmt_err(err, errlen, "tls: PSA crypto init failed (%d)", (int)ps);
        goto fail;
    }
    static const unsigned char pers[] = "kiln tls server";
    r = mbedtls_ctr_drbg_seed(&s->drbg, mbedtls_entropy_func, &s->entropy, pers,
                              sizeof pers - 1);
    if (r) {
        fmt_err(err, errlen, "tls: seeding the RNG: %s", mbed_str(r, m, sizeof m));
        goto fail;
    }

    if (load_crt(&s->cert, "certificate", cfg->cert, err, errlen))
        goto fail;
    if (file_readable("key", cfg->key, err, errlen))
        goto fail;
    r = mbedtls_pk_parse_keyfile(&s->key, cfg->key, NULL, mbedtls_ctr_drbg_random, &s->drbg);
    if (r) {
        fmt_err(err, errlen, "key %s: %s", cfg->key, mbed_str(r, m, sizeof m));
        goto fail;
    }
    if (!mbedtls_pk_can_do(&s->key, MBEDTLS_PK_ECKEY) &&
        !mbedtls_pk_can_do(&s->key, MBEDTLS_PK_RSA)) {
        fmt_err(err, errlen, "key %s: %s keys are not supported (EC or RSA only)", cfg->key,
                mbedtls_pk_get_name(&s->key));
        goto fail;
    }
    /* mbedtls_ssl_conf_own_cert does not check the pair; a mismatch would only show
     * as every handshake failing at the client. */
    r = mbedtls_pk_check_pair(&s->cert.pk, &s->key, mbedtls_ctr_drbg_random, &s->drbg);
    if (r) {
        fmt_err(err, errlen, "key %s does not match the certificate %s", cfg->key, cfg->cert);
        goto fail;
    }
    int want_client = cfg->client_ca && cfg->client_ca[0];
    if (want_client && load_crt(&s->client_ca, "client CA", cfg->client_ca, err, errlen))
        goto fail;

    r = mbedtls_ssl_config_defaults(&s->conf, MBEDTLS_SSL_IS_SERVER,
                                    MBEDTLS_SSL_TRANSPORT_STREAM, MBEDTLS_SSL_PRESET_DEFAULT);
    if (r) {
        fmt_err(err, errlen, "tls: config defaults: %s", mbed_str(r, m, sizeof m));
        goto fail;
    }
    mbedtls_ssl_conf_rng(&s->conf, mbedtls_ctr_drbg_random, &s->drbg);
    mbedtls_ssl_conf_min_tls_version(&s->conf, MBEDTLS_SSL_VERSION_TLS1_2);
    mbedtls_ssl_conf_max_tls_version(&s->conf, MBEDTLS_SSL_VERSION_TLS1_3);
    pick_suites(s->suites);
    mbedtls_ssl_conf_ciphersuites(&s->conf, s->suites);
    mbedtls_ssl_conf_groups(&s->conf, tls_groups); /* static: conf keeps the pointer */
    /* Full handshakes only: no PSK, no tickets (no ticket callbacks are set, and TLS
     * 1.3 is told to send none), no renegotiation (mbedTLS's default). */
    mbedtls_ssl_conf_tls13_key_exchange_modes(&s->conf,
                                              MBEDTLS_SSL_TLS1_3_KEY_EXCHANGE_MODE_EPHEMERAL);
#if defined(MBEDTLS_SSL_SESSION_TICKETS)
    mbedtls_ssl_conf_new_session_tickets(&s->conf, 0);
    /* One port, two protocols (DESIGN.md §6): an HTTP client says so by ALPN; a client
     * offering neither gets the handshake refused (no_application_protocol), one
     * offering none is told apart by its first bytes (net/srv_sess.c). */
    static const char *alpn[] = {"http/1.1", "kiln/1", NULL};
    r = mbedtls_ssl_conf_alpn_protocols(&s->conf, alpn);
    if (r) {
        fmt_err(err, errlen, "tls: ALPN: %s", mbed_str(r, m, sizeof m));
        goto fail;
    }
#endif
    if (want_client) {
        mbedtls_ssl_conf_ca_chain(&s->conf, &s->client_ca, NULL);
        mbedtls_ssl_conf_authmode(&s->conf, cfg->require_client_cert
                                                ? MBEDTLS_SSL_VERIFY_REQUIRED
                                                : MBEDTLS_SSL_VERIFY_OPTIONAL);
    } else {
        mbedtls_ssl_conf_authmode(&s->conf, MBEDTLS_SSL_VERIFY_NONE);
    }
    r = mbedtls_ssl_conf_own_cert(&s->conf, &s->cert, &s->key);
    if (r) {
        fmt_err(err, errlen, "tls: own certificate: %s", mbed_str(r, m, sizeof m));
        goto fail;
    }
    return s;
fail:
    tls_server_free(s);
    return NULL;
}

void tls_server_free(tls_server *s) {
    if (!s)
        return;
    mbedtls_ssl_config_free(&s->conf);
    mbedtls_x509_crt_free(&s->cert);
    mbedtls_pk_free(&s->key);
    mbedtls_x509_crt_free(&s->client_ca);
    mbedtls_ctr_drbg_free(&s->drbg);
    mbedtls_entropy_free(&s->entropy);
    free(s);
}

/* ---------------------------------------------------------------- memory
 * mbedTLS's calloc/free hooks are process-wide, so they route by thread: the loop's (the
 * one that called tls_use_heap) allocates from its heap, any other (a certificate worker,
 * tls_certs.c) from libc. Free goes by address: a block inside the heap's range is the
 * heap's, anything else libc's; so objects made before tls_use_heap (the server's
 * certificate, key and config) are freed where they came from. mbedTLS allocates many
 * sizes (record buffers of ~16.7 KB, handshake state of a few hundred bytes to a few KB):
 * the heap's power-of-two blocks with their free lists serve them all, merging back when
 * a session ends. */

static _Thread_local mm_heap *heap_here;  /* this thread's heap, or NULL: libc */
static mm_heap *heap_owner;                /* the heap whose blocks free() gives back */
static const unsigned char *heap_lo, *heap_hi; /* its range, kept once it is let go */

static void *tls_calloc(size_t n, size_t size) {
    mm_heap *h = heap_here;
    return h ? mm_heap_calloc(h, n, size) : calloc(n, size);
}

static void tls_free(void *p) {
    const unsigned char *c = p;
    if (!p) return;
    if (c >= heap_lo && c < heap_hi) {
        /* after tls_use_heap(NULL) the heap may be gone: such a block is dropped */
        if (heap_owner) mm_heap_free(heap_owner, p);
        return;
    }
    free(p);
}

/* PSA's key store (MBEDTLS_PSA_KEY_STORE_DYNAMIC) grows by slices of 16, 32, 64, ...
 * slots that it keeps until psa_crypto_free, which kilnd never calls. A slice first needed
 * during a handshake would come from the heap and outlive every session (and the heap).
 * So the store is grown here, from libc, to what n sessions' handshakes can hold at once
 * (TLS_PSA_KEYS per session: the ephemeral key exchange's keys), by importing that many
 * throwaway keys and destroying them: the slices stay. */
#define TLS_PSA_KEYS 2

static void psa_keys_reserve(size_t n) {
    mbedtls_svc_key_id_t *ids = calloc(n, sizeof *ids);
    if (!ids) return; /* best effort: a slice needed later comes from the heap */
    psa_key_attributes_t at = PSA_KEY_ATTRIBUTES_INIT;
    psa_set_key_type(&at, PSA_KEY_TYPE_RAW_DATA);
    static const uint8_t raw[16];
    size_t made = 0;
    while (made < n && psa_import_key(&at, raw, sizeof raw, &ids[made]) == PSA_SUCCESS) made++;
    for (size_t i = 0; i < made; i++) psa_destroy_key(ids[i]);
    psa_reset_key_attributes(&at);
    free(ids);
}

void tls_use_heap(mm_heap *h, int sessions) {
    if (h && sessions > 0 && psa_crypto_init() == PSA_SUCCESS) psa_keys_reserve((size_t)sessions * TLS_PSA_KEYS);
    heap_here = h;
    heap_owner = h;
    if (h) heap_lo = h->base, heap_hi = h->base + h->size;
    mbedtls_platform_set_calloc_free(tls_calloc, tls_free);
}

/* ---------------------------------------------------------------- sessions */

tls_conn *tls_conn_new(tls_server *s, const tls_bio *bio, char *err, size_t errlen) {
    char m[120];
    if (err && errlen)
        err[0] = '\0';
    if (!s || !bio || !bio->read || !bio->write) {
        fmt_err(err, errlen, "tls: no server or BIO");
        return NULL;
    }
    tls_conn *t = tls_calloc(1, sizeof *t);
    if (!t) {
        fmt_err(err, errlen, "tls: out of memory");
        return NULL;
    }
    mbedtls_ssl_init(&t->ssl);
    int r = mbedtls_ssl_setup(&t->ssl, &s->conf); /* allocates both record buffers */
    if (r) {
        fmt_err(err, errlen, "tls: session setup: %s", mbed_str(r, m, sizeof m));
        mbedtls_ssl_free(&t->ssl);
        tls_free(t);
        return NULL;
    }
    t->bio = *bio;
    t->cn_len = -ENOENT;
    mbedtls_ssl_set_bio(&t->ssl, t, bio_send, bio_recv, NULL);
    return t;
}

void tls_conn_free(tls_conn *t) {
    if (!t)
        return;
    mbedtls_ssl_free(&t->ssl);
    tls_free(t);
}

const char *tls_alpn(const tls_conn *t) { return mbedtls_ssl_get_alpn_protocol(&t->ssl); }

size_t tls_plain_head(const tls_conn *t, char *buf, size_t cap) {
    if (!t->not_tls) return 0;
    size_t n = t->head_len < cap ? t->head_len : cap;
    memcpy(buf, t->head, n);
    return n;
}

/* The subject CN of a verified peer certificate into t->cn. A CN with control bytes or
 * NUL is not returned: the caller compares it as a C string. */
static void keep_peer_cn(tls_conn *t, const mbedtls_x509_crt *crt) {
    for (const mbedtls_x509_name *n = &crt->subject; n; n = n->next) {
        if (!n->oid.p || MBEDTLS_OID_CMP(MBEDTLS_OID_AT_CN, &n->oid) != 0)
            continue;
        if (n->val.len == 0 || n->val.len > TLS_CN_MAX)
            return;
        for (size_t i = 0; i < n->val.len; i++)
            if (n->val.p[i] < 0x20 || n->val.p[i] == 0x7f)
                return;
        memcpy(t->cn, n->val.p, n->val.len);
        t->cn[n->val.len] = '\0';
        t->cn_len = (int)n->val.len;
        return;
    }
}

/* A handshake failed before we wrote a byte, so mbedTLS sent no alert: it sends none
 * when a TLS 1.3 client offers no group we take (ssl_tls13_server.c,
 * ssl_tls13_write_hrr_key_share_ext), where RFC 8446 §4.1.1 wants handshake_failure.
 * Without it the client reads only EOF ("unexpected eof"), which looks like a network
 * fault rather than a policy. Not for a stream that is not TLS or is gone. */
static void tell_refusal(tls_conn *t, int ret) {
    if (t->nwritten || out_pending(t) || t->not_tls || ret == MBEDTLS_ERR_SSL_CONN_EOF ||
        ret == TLS_ERR_RECV || ret == TLS_ERR_SEND)
        return;
    /* Best effort: the session is over either way. */
    (void)mbedtls_ssl_send_alert_message(&t->ssl, MBEDTLS_SSL_ALERT_LEVEL_FATAL,
                                         MBEDTLS_SSL_ALERT_MSG_HANDSHAKE_FAILURE);
}

int tls_handshake(tls_conn *t) {
    if (t->state)
        return t->state;
    int r = mbedtls_ssl_handshake(&t->ssl);
    if (r == MBEDTLS_ERR_SSL_WANT_READ || r == MBEDTLS_ERR_SSL_WANT_WRITE ||
        r == MBEDTLS_ERR_SSL_ASYNC_IN_PROGRESS || r == MBEDTLS_ERR_SSL_CRYPTO_IN_PROGRESS)
        return 0;
    if (r) {
        tell_refusal(t, r);
        return fail(t, "handshake", r);
    }
    const mbedtls_x509_crt *peer = mbedtls_ssl_get_peer_cert(&t->ssl);
    if (peer) {
        /* With VERIFY_OPTIONAL mbedTLS finishes the handshake over a certificate that
         * failed verification and only records the flags: a certificate presented
         * must be a good one, so refuse it here. */
        uint32_t flags = mbedtls_ssl_get_verify_result(&t->ssl);
        if (flags != 0) {
            char v[160];
            verify_text(flags, v, sizeof v);
            /* Best effort: the session is over either way. */
            mbedtls_ssl_send_alert_message(&t->ssl, MBEDTLS_SSL_ALERT_LEVEL_FATAL,
                                           (flags & MBEDTLS_X509_BADCERT_NOT_TRUSTED)
                                               ? MBEDTLS_SSL_ALERT_MSG_UNKNOWN_CA
                                               : MBEDTLS_SSL_ALERT_MSG_BAD_CERT);
            fmt_err(t->err, sizeof t->err, "handshake: client certificate rejected: %s", v);
            t->state = -EACCES;
            return t->state;
        }
        keep_peer_cn(t, peer);
    }
    t->state = 1;
    return 1;
}

/* The handshake on the way to a first read or write: 1 go on, else what to return. */
static int ensure_open(tls_conn *t, int *ret) {
    if (t->state == 1)
        return 1;
    int h = tls_handshake(t);
    if (h == 1)
        return 1;
    *ret = h < 0 ? h : -EAGAIN;
    return 0;
}

ssize_t tls_read(tls_conn *t, void *buf, size_t cap) {
    int ret;
    if (!ensure_open(t, &ret))
        return ret;
    if (t->eof)
        return 0;
    if (cap == 0)
        return -EINVAL; /* 0 would read as "closed" */
    size_t want = cap > INT_MAX ? INT_MAX : cap;
    /* Loop over the codes that only say "something else arrived, ask again"; bounded
     * so a peer cannot keep us here. */
    for (int i = 0; i < 16; i++) {
        int r = mbedtls_ssl_read(&t->ssl, buf, want);
        if (r > 0)
            return r;
        if (r == 0 || r == MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY || r == MBEDTLS_ERR_SSL_CONN_EOF) {
            t->eof = 1;
            return 0;
        }
        if (r == MBEDTLS_ERR_SSL_WANT_READ || r == MBEDTLS_ERR_SSL_WANT_WRITE ||
            r == MBEDTLS_ERR_SSL_ASYNC_IN_PROGRESS || r == MBEDTLS_ERR_SSL_CRYPTO_IN_PROGRESS)
            return -EAGAIN;
        if (r == MBEDTLS_ERR_SSL_RECEIVED_NEW_SESSION_TICKET ||
            r == MBEDTLS_ERR_SSL_RECEIVED_EARLY_DATA)
            continue;
        if ((r == MBEDTLS_ERR_SSL_UNEXPECTED_MESSAGE || r == MBEDTLS_ERR_SSL_DECODE_ERROR ||
             r == MBEDTLS_ERR_SSL_ILLEGAL_PARAMETER) && got_key_update(t))
            return bad_key_update(t, r);
        if (r == MBEDTLS_ERR_SSL_UNEXPECTED_MESSAGE)
            return refuse_unexpected(t, r);
        return fail(t, "read", r);
    }
    return -EAGAIN;
}

ssize_t tls_write(tls_conn *t, const void *buf, size_t len) {
    int ret;
    if (!ensure_open(t, &ret))
        return ret;
    if (t->closing) {
        fmt_err(t->err, sizeof t->err, "write: after close_notify");
        return -EPIPE;
    }
    size_t n;
    int r;
    if (t->wpending) {
        n = t->wpending;
        if (len < n) {
            fmt_err(t->err, sizeof t->err,
                    "write: retry with %zu bytes after -EAGAIN on %zu (must be the same)",
                    len, n);
            return -EINVAL;
        }
        /* Another call (an alert's send) flushed our record already: it is taken. Not
         * when what was queued is mbedTLS's KeyUpdate: then ours was never written,
         * and the write below writes it. */
        if (!out_pending(t) && !t->wpending_ku) {
            t->wpending = 0;
            return (ssize_t)n;
        }
    } else {
        if (len == 0)
            return 0;
        if (out_pending(t)) {
            /* Output not ours is queued (an alert, or mbedTLS's KeyUpdate). A write now
             * could flush it and report our bytes as taken without sending them; a
             * write of 0 bytes only flushes. */
            r = mbedtls_ssl_write(&t->ssl, buf, 0);
            if (r == MBEDTLS_ERR_SSL_WANT_WRITE || r == MBEDTLS_ERR_SSL_WANT_READ)
                return -EAGAIN;
            if (r < 0)
                return fail(t, "write", r);
        }
        int max = mbedtls_ssl_get_max_out_record_payload(&t->ssl);
        if (max <= 0)
            return fail(t, "write", max < 0 ? max : MBEDTLS_ERR_SSL_INTERNAL_ERROR);
        n = len < (size_t)max ? len : (size_t)max;
    }
    r = mbedtls_ssl_write(&t->ssl, buf, n);
    if (r > 0) {
        t->wpending = 0;
        t->wpending_ku = 0;
        return r;
    }
    if (r == MBEDTLS_ERR_SSL_WANT_WRITE || r == MBEDTLS_ERR_SSL_WANT_READ ||
        r == MBEDTLS_ERR_SSL_ASYNC_IN_PROGRESS || r == MBEDTLS_ERR_SSL_CRYPTO_IN_PROGRESS) {
        t->wpending = n;
        t->wpending_ku = ku_queued(t); /* our KeyUpdate went first and is not out yet */
        return -EAGAIN;
    }
    return fail(t, "write", r ? r : MBEDTLS_ERR_SSL_INTERNAL_ERROR);
}

int tls_close_notify(tls_conn *t) {
    if (t->state < 0)
        return t->state;
    if (t->state == 0) {
        fmt_err(t->err, sizeof t->err, "close_notify: the handshake has not completed");
        return -ENOTCONN;
    }
    if (t->closing == 2)
        return 1;
    if (t->closing == 1 && !out_pending(t)) { /* another call flushed the alert */
        t->closing = 2;
        return 1;
    }
    int r;
    if (out_pending(t)) {
        /* With output queued, mbedTLS's close_notify only flushes it. */
        r = mbedtls_ssl_close_notify(&t->ssl);
        if (r == MBEDTLS_ERR_SSL_WANT_WRITE || r == MBEDTLS_ERR_SSL_WANT_READ)
            return 0;
        if (r)
            return fail(t, "close_notify", r);
        if (t->closing == 1) { /* that was the alert itself */
            t->closing = 2;
            return 1;
        }
        /* It was something else (a record of ours: tls_write reports it as taken). */
    }
    r = mbedtls_ssl_close_notify(&t->ssl);
    if (r == 0) {
        t->closing = 2;
        return 1;
    }
    if (r == MBEDTLS_ERR_SSL_WANT_WRITE || r == MBEDTLS_ERR_SSL_WANT_READ) {
        t->closing = 1;
        return 0;
    }
    return fail(t, "close_notify", r);
}

/* ---------------------------------------------------------------- accessors */

const char *tls_error(const tls_conn *t) {
    return t->err;
}

int tls_alerted(const tls_conn *t) {
    return t->state < 0 && t->alerted;
}

unsigned tls_key_updates(const tls_conn *t, unsigned *sent) {
    uint32_t rx = 0, tx = 0;
    mbedtls_ssl_tls13_get_key_updates(&t->ssl, &rx, &tx);
    if (sent)
        *sent = tx;
    return rx;
}

const char *tls_version(const tls_conn *t) {
    return mbedtls_ssl_get_version(&t->ssl);
}

const char *tls_suite(const tls_conn *t) {
    const char *s = mbedtls_ssl_get_ciphersuite(&t->ssl);
    return s ? s : "";
}

int tls_peer_cn(const tls_conn *t, char *buf, size_t cap) {
    if (t->state != 1 || t->cn_len < 0)
        return -ENOENT;
    if (!buf || cap <= (size_t)t->cn_len)
        return -ERANGE;
    memcpy(buf, t->cn, (size_t)t->cn_len + 1);
    return t->cn_len;
}
