/* test_tls: net/tls and net/tls_certs. Development certificates into a temporary
 * directory; a tls_server over them; an mbedTLS client written here. The two talk
 * through a pair of in-memory ring buffers of small capacity, so every WANT_READ and
 * WANT_WRITE path runs, and both sides are stepped by hand (no threads, no sockets).
 *
 * Covers: TLS 1.3 and forced TLS 1.2 (AEAD suites, a client offering CBC only is
 * refused), EC and RSA server keys, 1 MiB each way through 7-byte and 4 KiB pipes,
 * close_notify and EOF, plaintext garbage, mTLS (required, optional, wrong CA), the
 * SANs from `hosts`, bad server configurations, and tls_certs_create's keep / force /
 * fill-in rules and file modes; the key-exchange groups (X25519, P-256, P-384 only) and
 * no DHE suite; TLS 1.3 KeyUpdate (kiln's mbedTLS patch): rounds of updates both ways
 * with data between them, byte for byte, through a wide and a 7-byte pipe; requests
 * while output waits making one update; the limit of updates in a row; two mbedTLS
 * endpoints each starting updates; out of memory during one; malformed updates ending
 * the session with the alert RFC 8446 names. */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>
#include <mbedtls/error.h>
#include <mbedtls/pk.h>
#include <mbedtls/ssl.h>
#include <mbedtls/ssl_ciphersuites.h>
#include <mbedtls/x509_crt.h>

#include "mm/heap.h"
#include "net/tls.h"
#include "tests/unit/check.h"

static char err[512];
static char dir1[64], dir2[64], path[256];
static mbedtls_entropy_context entropy;
static mbedtls_ctr_drbg_context drbg;

static const char *p1(const char *name) {
    snprintf(path, sizeof path, "%s/%s", dir1, name);
    return path;
}

/* A self-signed RSA-2048 certificate for localhost (valid until 2126) and its key:
 * RSA key generation at test time would cost seconds. Made with
 * openssl req -x509 -newkey rsa:2048 -nodes -days 36500 -subj /CN=localhost
 *     -addext subjectAltName=DNS:localhost */
static const char rsa_crt[] =
    "-----BEGIN CERTIFICATE-----\n"
    "MIIDITCCAgmgAwIBAgIUHZZcWZZiD8pze5U1CYQTfy596acwDQYJKoZIhvcNAQEL\n"
    "BQAwFDESMBAGA1UEAwwJbG9jYWxob3N0MCAXDTI2MTEyOTIxMTcwMFoYDzIxMjYx\n"
    "MTA1MjExNzAwWjAUMRIwEAYDVQQDDAlsb2NhbGhvc3QwggEiMA0GCSqGSIb3DQEB\n"
    "AQUAA4IBDwAwggEKAoIBAQCcH63X4ZjTgkLCO9/T0l+7bxjchv/UZFL3L3Oo1rmk\n"
    "FOKOZ/78Nut5c2QdvlppCINmROEDHhsH1P1MfdiCPAdEPguI+LkPyc1CnT6ES+8O\n"
    "BP22DrunwO4H303iaB4ThCpvZWbtC7QCgQtNUehAMAOhSOm61RkPdQKYwm4Vy9fw\n"
    "op/dTVTB6swrh1wQOv91fas13DgW7bKYDpcRDl8DrSlckM/9InT6lu6J9okFvB9o\n"
    "ZtL0F+6+KHWhuYQzigJa7z3arcBtlvTN+I+TwCuDJnq07erwnxLRDlHqc4SilyU4\n"
    "CBTDBgvr3lCyNoAccgLtskklVeatMfe60jdbA8lsPiMRAgMBAAGjaTBnMB0GA1Ud\n"
    "DgQWBBQ6ClY/6u64Ci7gZOav9NWhoiOm3zAfBgNVHSMEGDAWgBQ6ClY/6u64Ci7g\n"
    "ZOav9NWhoiOm3zAPBgNVHRMBAf8EBTADAQH/MBQGA1UdEQQNMAuCCWxvY2FsaG9z\n"
    "dDANBgkqhkiG9w0BAQsFAAOCAQEAj/qnerf3sC3PS6iQsC2Ipxb4m3E3uLfq9Pq/\n"
    "70F+q3wJG0E8v2flqx/Aq8mvEt9upDX+n5q/8GtwH8kA4ZNyqy87K5whxEe4Ysi0\n"
    "WC2d82+mUJm30hxNxgZN0QAK2dnhTs5XiUw/vm7nfpbgYeoEq5KhpvD0a7eGp70j\n"
    "KeZVdOTY9X8A/KeDIdREDYEs6xtYXph/cvz/RLvsn0ehgB5Co+a3Gw6ukSfLknFo\n"
    "WmuHwdDZn0xIP5qcIP0olXKS8jCRT1TF4vP5tSPpFLZ1MbMzn750Knmi9BvA7L/A\n"
    "JdJixmwahJruds7/xLfLJl8szgsmcGKejkxZfeQ0uZOA6ehqNw==\n"
    "-----END CERTIFICATE-----\n";
static const char rsa_key[] =
    "-----BEGIN PRIVATE KEY-----\n"
    "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQCcH63X4ZjTgkLC\n"
    "O9/T0l+7bxjchv/UZFL3L3Oo1rmkFOKOZ/78Nut5c2QdvlppCINmROEDHhsH1P1M\n"
    "fdiCPAdEPguI+LkPyc1CnT6ES+8OBP22DrunwO4H303iaB4ThCpvZWbtC7QCgQtN\n"
    "UehAMAOhSOm61RkPdQKYwm4Vy9fwop/dTVTB6swrh1wQOv91fas13DgW7bKYDpcR\n"
    "Dl8DrSlckM/9InT6lu6J9okFvB9oZtL0F+6+KHWhuYQzigJa7z3arcBtlvTN+I+T\n"
    "wCuDJnq07erwnxLRDlHqc4SilyU4CBTDBgvr3lCyNoAccgLtskklVeatMfe60jdb\n"
    "A8lsPiMRAgMBAAECggEAE0z/St8C67MA2c5ZH3C0kRFs+2ZdHj7A2voszESvco96\n"
    "aqyEo12Owtb3G4460x1QUUZWovIH2XIFVn2AVKljJJafCnHlPwRtsbyKzAQvK4aG\n"
    "bwlnPZfmVWbP1BuXDEackGTy0n9N47lcUlS756OH71p6OrS5gmWuyn/O6DbpHUBs\n"
    "FzrlAMQyUIw0gaFfmi3qsslWqUyi42uezU8GhmNE2n9qxSQEm56pQAWo+8bS953u\n"
    "A0vyBDT/3YDBUFdqRa3t2fz6oLcl2opXlAcJ2sMzqa0f13wUux/zYXCXBhZTlxjX\n"
    "3dGo1iOQ3+tpjrkvP4lINQcHhpZW1SeT91DLxTQ8uQKBgQDP1oSPWbU0NYcAJ0ay\n"
    "0MQa/oFVSMWmOf/gn7LtsIK/wi/JUGjnm0l95G21RA45Od024jciQq6SHj/jELLh\n"
    "argYJefoAeHCKEkh7a85HL4lID6VZJYVYMS7sHoROy+83JjEm83AoVAlYIjWn/F7\n"
    "CTDctPp5YNakpIcHAq5B7OOgmwKBgQDATVdUfVdue2NZ5JkCBnA68edCBNd4PP2k\n"
    "p+Y4+V+FCWcdqOiDdlQMRcQysTERI9RRJVfg46bBHrlNr1yDK7zxw1gvEdpGX6jq\n"
    "YexcckE0H4+gOTCbIihk0+qmEHgZ41oc0Yse/5gfM7cYMstKYb1nLxoA3ndWg/xp\n"
    "0tf9u+S3wwKBgCH2JsEZ4o8+c+nlgRr1HCZhEhcyhgGMlrBIyD8oyaS2AYL+3bWC\n"
    "3XZx3i9xiHV3bBtsyZ+Sj94WjU/4SZKmEqD3iLaToCVO2exuX2SQus1sQG2++vtR\n"
    "TbRxuPCZ4EoXLetqnits8KC67oFLr3TwYoieFhPBbDGJJPtTR9BD+kojAoGBAK4g\n"
    "mjZANP4urjzEuSPTTqahSqVGGxGeMJJ7EgV/EVY2uG9r9fasG9jtB4ZbWjHJ/sPn\n"
    "i5ZwrRtrxaEpbBy+ax2DpAMjKEHW9u4c81iWgKJA/d24S2H94RPDrFLo0MeoTX2Q\n"
    "5GeSS13dhypbPCdDL60SQnqM9wSZCOON7tSr4aPfAoGAepVoN91ta5yKHgfCvfGq\n"
    "pjL/QAOjGQOAuZHQZ3vKrMLjrfr8V+r4Pd+90HTP6cBnEFI61c8bEjA5LIXM6jcw\n"
    "/O1FqCxqZ7XEbGsDnoy5TDy71nshg9VL9X+dExWl4d3sL+XsFgDeaM7zCM/H+UFn\n"
    "57cPam/rR8BsUppTFemXtGQ=\n"
    "-----END PRIVATE KEY-----\n";

/* ---------------------------------------------------------------- the pipe */

typedef struct {
    unsigned char data[4096];
    size_t cap, head, len; /* cap: the pipe's capacity, 1..4096 */
    int closed;            /* the writer is gone: empty means end of stream */
    size_t moved;          /* bytes written, for progress detection */
} ring;

static ssize_t ring_read(ring *r, void *buf, size_t cap) {
    if (r->len == 0)
        return r->closed ? 0 : -EAGAIN;
    size_t n = 0;
    unsigned char *b = buf;
    while (n < cap && r->len) {
        b[n++] = r->data[r->head];
        r->head = (r->head + 1) % r->cap;
        r->len--;
    }
    return (ssize_t)n;
}

static ssize_t ring_write(ring *r, const void *buf, size_t len) {
    if (r->closed)
        return -EPIPE;
    if (r->len == r->cap)
        return -EAGAIN;
    size_t n = 0;
    const unsigned char *b = buf;
    while (n < len && r->len < r->cap) {
        r->data[(r->head + r->len) % r->cap] = b[n++];
        r->len++;
    }
    r->moved += n;
    return (ssize_t)n;
}

typedef struct {
    ring c2s, s2c;
    /* the client */
    mbedtls_ssl_config conf;
    mbedtls_ssl_context ssl;
    mbedtls_x509_crt ca, crt;
    mbedtls_pk_context key;
    int suites[2];
    size_t cw_pending;
    /* the server's session */
    tls_conn *sv;
} pair;

static ssize_t srv_read(void *ctx, void *buf, size_t cap) {
    return ring_read(&((pair *)ctx)->c2s, buf, cap);
}
static ssize_t srv_write(void *ctx, const void *buf, size_t len) {
    return ring_write(&((pair *)ctx)->s2c, buf, len);
}
static int cli_send(void *ctx, const unsigned char *buf, size_t len) {
    ssize_t n = ring_write(&((pair *)ctx)->c2s, buf, len);
    return n == -EAGAIN ? MBEDTLS_ERR_SSL_WANT_WRITE : n < 0 ? MBEDTLS_ERR_SSL_INTERNAL_ERROR
                                                               : (int)n;
}
static int cli_recv(void *ctx, unsigned char *buf, size_t len) {
    ssize_t n = ring_read(&((pair *)ctx)->s2c, buf, len);
    return n == -EAGAIN ? MBEDTLS_ERR_SSL_WANT_READ : (int)n;
}

typedef struct {
    const char *ca;        /* trust anchor file (default: dir1/ca.crt) */
    const char *crt, *key; /* client certificate, or none */
    const char *host;      /* default "localhost" */
    int tls12;             /* force TLS 1.2 */
    int suite;             /* offer only this suite */
    const uint16_t *groups; /* offer only these key-exchange groups (0-terminated) */
    size_t cap;            /* pipe capacity */
} copts;

static int pair_open(pair *p, tls_server *s, const copts *o) {
    memset(p, 0, sizeof *p);
    p->c2s.cap = p->s2c.cap = o->cap ? o->cap : 4096;
    mbedtls_ssl_config_init(&p->conf);
    mbedtls_ssl_init(&p->ssl);
    mbedtls_x509_crt_init(&p->ca);
    mbedtls_x509_crt_init(&p->crt);
    mbedtls_pk_init(&p->key);
    int r = mbedtls_ssl_config_defaults(&p->conf, MBEDTLS_SSL_IS_CLIENT,
                                        MBEDTLS_SSL_TRANSPORT_STREAM,
                                        MBEDTLS_SSL_PRESET_DEFAULT);
    if (!r)
        r = mbedtls_x509_crt_parse_file(&p->ca, o->ca ? o->ca : p1("ca.crt"));
    if (r)
        return r;
    mbedtls_ssl_conf_rng(&p->conf, mbedtls_ctr_drbg_random, &drbg);
    mbedtls_ssl_conf_ca_chain(&p->conf, &p->ca, NULL);
    mbedtls_ssl_conf_authmode(&p->conf, MBEDTLS_SSL_VERIFY_REQUIRED);
    if (o->tls12)
        mbedtls_ssl_conf_max_tls_version(&p->conf, MBEDTLS_SSL_VERSION_TLS1_2);
    if (o->suite) {
        p->suites[0] = o->suite;
        mbedtls_ssl_conf_ciphersuites(&p->conf, p->suites);
    }
    if (o->groups)
        mbedtls_ssl_conf_groups(&p->conf, o->groups);
    if (o->crt) {
        if ((r = mbedtls_x509_crt_parse_file(&p->crt, o->crt)) ||
            (r = mbedtls_pk_parse_keyfile(&p->key, o->key, NULL, mbedtls_ctr_drbg_random,
                                          &drbg)) ||
            (r = mbedtls_ssl_conf_own_cert(&p->conf, &p->crt, &p->key)))
            return r;
    }
    if ((r = mbedtls_ssl_setup(&p->ssl, &p->conf)) ||
        (r = mbedtls_ssl_set_hostname(&p->ssl, o->host ? o->host : "localhost")))
        return r;
    mbedtls_ssl_set_bio(&p->ssl, p, cli_send, cli_recv, NULL);
    tls_bio bio = {p, srv_read, srv_write};
    p->sv = tls_conn_new(s, &bio, err, sizeof err);
    return p->sv ? 0 : -1;
}

static void pair_close(pair *p) {
    tls_conn_free(p->sv);
    mbedtls_ssl_free(&p->ssl);
    mbedtls_ssl_config_free(&p->conf);
    mbedtls_x509_crt_free(&p->ca);
    mbedtls_x509_crt_free(&p->crt);
    mbedtls_pk_free(&p->key);
}

static int want(int r) {
    return r == MBEDTLS_ERR_SSL_WANT_READ || r == MBEDTLS_ERR_SSL_WANT_WRITE;
}

typedef struct {
    int srv;   /* tls_handshake's last result */
    int cli;   /* the client's: 0 done, 1 in progress, < 0 failed */
    int steps; /* rounds taken */
} hs_result;

/* Steps both sides until both are done, one failed and the other can get no further,
 * or nothing moves. */
static hs_result handshake(pair *p) {
    hs_result h = {0, 1, 0};
    int idle = 0;
    while (h.steps < 100000 && idle < 3) {
        size_t moved = p->c2s.moved + p->s2c.moved;
        int before_srv = h.srv, before_cli = h.cli;
        h.steps++;
        if (h.cli == 1) {
            int r = mbedtls_ssl_handshake(&p->ssl);
            h.cli = r == 0 ? 0 : want(r) ? 1 : r;
        }
        if (h.srv == 0)
            h.srv = tls_handshake(p->sv);
        if (h.srv == 1 && h.cli == 0)
            break;
        if (h.srv < 0 && h.cli != 1)
            break;
        idle = (moved == p->c2s.moved + p->s2c.moved && before_srv == h.srv &&
                before_cli == h.cli) ? idle + 1 : 0;
    }
    return h;
}

static int is_aead(const char *suite) {
    return strstr(suite, "GCM") || strstr(suite, "CHACHA20-POLY1305");
}

/* ---------------------------------------------------------------- data */

static unsigned char pattern(size_t i, unsigned seed) {
    uint32_t x = (uint32_t)i * 2654435761u ^ seed;
    return (unsigned char)(x >> 13 ^ x);
}

static long srv_write_again; /* tls_write's -EAGAIN answers, to see the retry path run */
static int transfer_quiet;    /* failures expected (an OOM loop): transfer says nothing */
#define TLOG(...) (transfer_quiet ? 0 : fprintf(stderr, __VA_ARGS__))

/* total bytes each way at once; verifies every byte. 0 on success. */
static int transfer(pair *p, size_t total, size_t srv_chunk) {
    static unsigned char out_c[1 << 20], out_s[1 << 20], buf[20000];
    if (total > sizeof out_c)
        return -1;
    for (size_t i = 0; i < total; i++) {
        out_c[i] = pattern(i, 1);
        out_s[i] = pattern(i, 2);
    }
    size_t cs = 0, cr = 0, ss = 0, sr = 0;
    long idle = 0, rounds = 0;
    while ((cs < total || cr < total || ss < total || sr < total) && idle < 5) {
        size_t before = cs + cr + ss + sr + p->c2s.moved + p->s2c.moved;
        rounds++;
        if (cs < total) { /* the client keeps the same-length-after-WANT rule itself */
            size_t n = p->cw_pending ? p->cw_pending : total - cs;
            int r = mbedtls_ssl_write(&p->ssl, out_c + cs, n);
            if (r > 0) {
                cs += (size_t)r;
                p->cw_pending = 0;
            } else if (want(r)) {
                p->cw_pending = n;
            } else {
                TLOG("client write %d\n", r);
                return -2;
            }
        }
        for (;;) { /* the server reads until -EAGAIN */
            ssize_t n = tls_read(p->sv, buf, srv_chunk);
            if (n == -EAGAIN)
                break;
            if (n <= 0) {
                TLOG("server read %zd: %s\n", n, tls_error(p->sv));
                return -3;
            }
            for (ssize_t i = 0; i < n; i++)
                if (buf[i] != pattern(sr + (size_t)i, 1)) {
                    TLOG("server got a bad byte at %zu\n", sr + (size_t)i);
                    return -4;
                }
            sr += (size_t)n;
        }
        if (ss < total) {
            ssize_t n = tls_write(p->sv, out_s + ss, total - ss);
            if (n > 0)
                ss += (size_t)n;
            else if (n == -EAGAIN)
                srv_write_again++;
            else {
                TLOG("server write %zd: %s\n", n, tls_error(p->sv));
                return -5;
            }
        }
        for (;;) {
            int n = mbedtls_ssl_read(&p->ssl, buf, sizeof buf);
            if (want(n))
                break;
            if (n <= 0) {
                TLOG("client read %d\n", n);
                return -6;
            }
            for (int i = 0; i < n; i++)
                if (buf[i] != pattern(cr + (size_t)i, 2)) {
                    TLOG("client got a bad byte at %zu\n", cr + (size_t)i);
                    return -7;
                }
            cr += (size_t)n;
        }
        idle = before == cs + cr + ss + sr + p->c2s.moved + p->s2c.moved ? idle + 1 : 0;
    }
    if (cs != total || cr != total || ss != total || sr != total) {
        TLOG("stalled: cs %zu cr %zu ss %zu sr %zu after %ld rounds\n", cs, cr, ss,
                sr, rounds);
        return -8;
    }
    return 0;
}

/* ---------------------------------------------------------------- tests */

static tls_server *server(const char *cert, const char *key, const char *ca, int require) {
    char c[256], k[256], a[256];
    snprintf(c, sizeof c, "%s", cert);
    snprintf(k, sizeof k, "%s", key);
    snprintf(a, sizeof a, "%s", ca ? ca : "");
    tls_config cfg = {c, k, a, require};
    err[0] = '\0';
    return tls_server_new(&cfg, err, sizeof err);
}

static char crt1[256], key1[256], ca1[256], ccrt1[256], ckey1[256], ccrt2[256], ckey2[256];

static void test_basic(tls_server *s) {
    pair p;
    copts o = {0};
    CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
    CHECK(!strcmp(tls_error(p.sv), ""), "fresh error '%s'", tls_error(p.sv));
    hs_result h = handshake(&p);
    CHECK(h.srv == 1 && h.cli == 0, "TLS 1.3 handshake srv %d cli %d: %s", h.srv, h.cli,
          tls_error(p.sv));
    CHECK(!strcmp(tls_version(p.sv), "TLSv1.3"), "version %s", tls_version(p.sv));
    CHECK(!strncmp(tls_suite(p.sv), "TLS1-3-", 7) && is_aead(tls_suite(p.sv)), "suite %s",
          tls_suite(p.sv));
    CHECK(tls_handshake(p.sv) == 1, "handshake again");
    char cn[80];
    CHECK(tls_peer_cn(p.sv, cn, sizeof cn) == -ENOENT, "no client cert, no CN");
    CHECK(transfer(&p, 1 << 20, 4096) == 0, "1 MiB each way, 4 KiB pipe");

    /* The client's close_notify: reads say 0, and keep saying it. */
    int r;
    while ((r = mbedtls_ssl_close_notify(&p.ssl)) && want(r)) {
        char b[16];
        (void)tls_read(p.sv, b, sizeof b);
    }
    CHECK(r == 0, "client close_notify %d", r);
    char b[64];
    ssize_t n = tls_read(p.sv, b, sizeof b);
    CHECK(n == 0, "read after close_notify %zd: %s", n, tls_error(p.sv));
    CHECK(tls_read(p.sv, b, sizeof b) == 0, "read after close_notify, again");
    /* Ours goes out too, and the client sees it. */
    int c = 0;
    for (int i = 0; i < 100 && (c = tls_close_notify(p.sv)) == 0; i++) {
        unsigned char d[16];
        (void)mbedtls_ssl_read(&p.ssl, d, sizeof d);
    }
    CHECK(c == 1, "tls_close_notify %d: %s", c, tls_error(p.sv));
    CHECK(tls_close_notify(p.sv) == 1, "close_notify twice");
    unsigned char d[16];
    r = mbedtls_ssl_read(&p.ssl, d, sizeof d);
    CHECK(r == MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY, "client saw %d", r);
    CHECK(tls_write(p.sv, "x", 1) < 0, "write after close_notify");
    pair_close(&p);
}

/* Sessions' memory from a heap (tls_use_heap, as kilnd's loop does): a handshake and a
 * transfer take it from there and give all of it back; then an OOM loop fails the heap's
 * K-th allocation, K from 1 until a handshake no longer reaches it: each attempt fails
 * cleanly (either side may be the one refused) and leaves nothing behind. */
static void test_heap(tls_server *s) {
    mm_heap h;
    CHECK(mm_heap_init(&h, 16u << 20) == 0, "heap");
    tls_use_heap(&h, 8);
    pair p;
    copts o = {0};
    CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
    hs_result r = handshake(&p);
    CHECK(r.srv == 1 && r.cli == 0, "handshake from the heap: srv %d cli %d %s", r.srv, r.cli, tls_error(p.sv));
    CHECK(h.allocs > 2 && h.used > 0, "the sessions' memory is the heap's: %llu allocations, %zu bytes",
          (unsigned long long)h.allocs, h.used);
    CHECK(transfer(&p, 1 << 16, 4096) == 0, "64 KiB each way");
    pair_close(&p);
    CHECK(h.used == 0, "all of it back: %zu bytes", h.used);
    int steps = 0, bad = 0, fired = 1, ok = 0;
    for (int k = 1; fired && k < 1000000; k = k < 24 ? k + 1 : k + k / 4, steps++) {
        mm_heap_fail_after(&h, k);
        ok = pair_open(&p, s, &o) == 0;
        if (ok) r = handshake(&p), ok = r.srv == 1 && r.cli == 0;
        fired = h.fail_n == 0;
        pair_close(&p);
        if (h.used != 0 || mm_heap_check(&h) != 0) bad++, h.used = 0;
    }
    mm_heap_fail_after(&h, 0);
    CHECK(!bad, "OOM loop: %d of %d steps left heap memory behind", bad, steps);
    CHECK(!fired && ok && steps > 24, "OOM loop: a handshake past every failure point (%d steps)", steps);
    tls_use_heap(NULL, 0);
    mm_heap_free_all(&h);
}

static void test_tiny_pipe(tls_server *s) {
    pair p;
    copts o = {.cap = 7};
    CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
    hs_result h = handshake(&p);
    CHECK(h.srv == 1 && h.cli == 0, "7-byte pipe handshake srv %d cli %d: %s", h.srv, h.cli,
          tls_error(p.sv));
    srv_write_again = 0;
    CHECK(transfer(&p, 1 << 20, 1000) == 0, "1 MiB each way, 7-byte pipe");
    CHECK(srv_write_again > 1000, "write retries %ld", srv_write_again);
    /* After -EAGAIN, a retry must offer at least what it offered before. */
    static unsigned char big[10000], rb[4096];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = pattern(i, 4);
    CHECK(tls_write(p.sv, big, sizeof big) == -EAGAIN, "7-byte pipe: -EAGAIN");
    CHECK(tls_write(p.sv, big, 5) == -EINVAL && strstr(tls_error(p.sv), "retry"), "short retry '%s'",
          tls_error(p.sv));
    ssize_t w = -EAGAIN;
    size_t got = 0;
    int bad = 0;
    for (int i = 0; i < 100000 && got < sizeof big; i++) {
        if (w == -EAGAIN)
            w = tls_write(p.sv, big, sizeof big);
        int n = mbedtls_ssl_read(&p.ssl, rb, sizeof rb);
        for (int j = 0; j < n; j++)
            bad += got + (size_t)j >= sizeof big || rb[j] != pattern(got + (size_t)j, 4);
        if (n > 0)
            got += (size_t)n;
    }
    CHECK(w == (ssize_t)sizeof big && got == sizeof big && !bad, "retried write %zd got %zu bad %d",
          w, got, bad);
    /* End of stream without close_notify, after the handshake: 0 too. */
    p.c2s.closed = 1;
    char b[64];
    ssize_t n = tls_read(p.sv, b, sizeof b);
    CHECK(n == 0, "read at EOF %zd: %s", n, tls_error(p.sv));
    pair_close(&p);

    /* One byte at a time. */
    o.cap = 1;
    CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
    h = handshake(&p);
    CHECK(h.srv == 1 && h.cli == 0, "1-byte pipe handshake srv %d cli %d: %s", h.srv, h.cli,
          tls_error(p.sv));
    CHECK(transfer(&p, 50000, 333) == 0, "50 KB each way, 1-byte pipe");
    pair_close(&p);
}

static void test_tls12(tls_server *s) {
    pair p;
    copts o = {.tls12 = 1, .cap = 100};
    CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
    hs_result h = handshake(&p);
    CHECK(h.srv == 1 && h.cli == 0, "TLS 1.2 handshake srv %d cli %d: %s", h.srv, h.cli,
          tls_error(p.sv));
    CHECK(!strcmp(tls_version(p.sv), "TLSv1.2"), "version %s", tls_version(p.sv));
    CHECK(is_aead(tls_suite(p.sv)) && strstr(tls_suite(p.sv), "ECDHE-ECDSA"), "suite %s",
          tls_suite(p.sv));
    CHECK(transfer(&p, 100000, 4096) == 0, "TLS 1.2 data");
    pair_close(&p);

    /* A client that offers CBC only finds nothing in common. */
    o.suite = MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256;
    CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
    h = handshake(&p);
    CHECK(h.srv < 0 && h.cli < 0, "CBC-only client srv %d cli %d", h.srv, h.cli);
    CHECK(strstr(tls_error(p.sv), "handshake: "), "error '%s'", tls_error(p.sv));
    pair_close(&p);

    /* Each TLS 1.2 AEAD suite the server lists works when it is the only one offered. */
    static const int suites[] = {MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
                                 MBEDTLS_TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256};
    for (size_t i = 0; i < 2; i++) {
        o.suite = suites[i];
        CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
        h = handshake(&p);
        CHECK(h.srv == 1 && h.cli == 0, "suite %s: srv %d cli %d: %s",
              mbedtls_ssl_get_ciphersuite_name(suites[i]), h.srv, h.cli, tls_error(p.sv));
        CHECK(!strcmp(tls_suite(p.sv), mbedtls_ssl_get_ciphersuite_name(suites[i])), "%s",
              tls_suite(p.sv));
        pair_close(&p);
    }
    /* And the TLS 1.3 ones. */
    static const int suites13[] = {MBEDTLS_TLS1_3_AES_256_GCM_SHA384,
                                   MBEDTLS_TLS1_3_CHACHA20_POLY1305_SHA256};
    for (size_t i = 0; i < 2; i++) {
        copts o13 = {.suite = suites13[i]};
        CHECK(pair_open(&p, s, &o13) == 0, "open: %s", err);
        h = handshake(&p);
        CHECK(h.srv == 1 && h.cli == 0 && !strcmp(tls_version(p.sv), "TLSv1.3"),
              "suite %s: srv %d cli %d: %s", mbedtls_ssl_get_ciphersuite_name(suites13[i]),
              h.srv, h.cli, tls_error(p.sv));
        CHECK(!strcmp(tls_suite(p.sv), mbedtls_ssl_get_ciphersuite_name(suites13[i])), "%s",
              tls_suite(p.sv));
        pair_close(&p);
    }
}

/* The key-exchange groups: X25519, P-256 and P-384 work, each alone; finite-field
 * groups (a stall of the whole loop per handshake) and the other curves are refused.
 * On TLS 1.2 the client's groups also bound the curve of an ECDSA certificate, so
 * there the test runs on the RSA server (test_rsa); and mbedTLS's client offers
 * neither finite-field groups with ECDHE suites on 1.2 nor brainpool on 1.3, so those
 * pairs are left out. On TLS 1.3 a refusal reaches the client as a handshake_failure
 * alert, which tls_handshake sends since mbedTLS leaves it out (tell_refusal). */
static void test_groups(tls_server *s, const char *ca, int v12) {
    static const uint16_t good[] = {MBEDTLS_SSL_IANA_TLS_GROUP_X25519,
                                    MBEDTLS_SSL_IANA_TLS_GROUP_SECP256R1,
                                    MBEDTLS_SSL_IANA_TLS_GROUP_SECP384R1};
    static const uint16_t bad13[] = {MBEDTLS_SSL_IANA_TLS_GROUP_FFDHE2048,
                                     MBEDTLS_SSL_IANA_TLS_GROUP_FFDHE3072,
                                     MBEDTLS_SSL_IANA_TLS_GROUP_SECP521R1,
                                     MBEDTLS_SSL_IANA_TLS_GROUP_X448, 0};
    static const uint16_t bad12[] = {MBEDTLS_SSL_IANA_TLS_GROUP_SECP521R1,
                                     MBEDTLS_SSL_IANA_TLS_GROUP_BP256R1,
                                     MBEDTLS_SSL_IANA_TLS_GROUP_BP384R1,
                                     MBEDTLS_SSL_IANA_TLS_GROUP_X448, 0};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        uint16_t one[2] = {good[i], 0};
        pair p;
        copts o = {.ca = ca, .tls12 = v12, .groups = one};
        CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
        hs_result h = handshake(&p);
        CHECK(h.srv == 1 && h.cli == 0, "group 0x%04x alone (1.%d): srv %d cli %d '%s'",
              good[i], 3 - v12, h.srv, h.cli, tls_error(p.sv));
        pair_close(&p);
    }
    for (const uint16_t *g = v12 ? bad12 : bad13; *g; g++) {
        uint16_t one[2] = {*g, 0};
        pair p;
        copts o = {.ca = ca, .tls12 = v12, .groups = one};
        CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
        hs_result h = handshake(&p);
        CHECK(h.srv < 0 && h.cli != 0 && strstr(tls_error(p.sv), "handshake: "),
              "group 0x%04x alone (1.%d) refused: srv %d cli %d '%s'", *g, 3 - v12, h.srv,
              h.cli, tls_error(p.sv));
        if (!v12) /* (on 1.2 mbedTLS's server sends the alert, its client never reports it) */
            CHECK(h.cli == MBEDTLS_ERR_SSL_FATAL_ALERT_MESSAGE &&
                      p.ssl.MBEDTLS_PRIVATE(in_msg)[1] == MBEDTLS_SSL_ALERT_MSG_HANDSHAKE_FAILURE,
                  "group 0x%04x (1.3): the client reads %d, alert %u", *g, h.cli,
                  p.ssl.MBEDTLS_PRIVATE(in_msg)[1]);
        pair_close(&p);
    }
    if (v12)
        return;
    /* A first key share for a refused group: a HelloRetryRequest for one we take. */
    static const uint16_t retry[] = {MBEDTLS_SSL_IANA_TLS_GROUP_FFDHE2048,
                                     MBEDTLS_SSL_IANA_TLS_GROUP_SECP384R1, 0};
    pair p;
    copts o = {.ca = ca, .groups = retry};
    CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
    hs_result h = handshake(&p);
    CHECK(h.srv == 1 && h.cli == 0 && !strcmp(tls_version(p.sv), "TLSv1.3"),
          "ffdhe2048 share, P-384 after a retry: srv %d cli %d '%s'", h.srv, h.cli,
          tls_error(p.sv));
    pair_close(&p);
}

/* mbedTLS's record writer (library/ssl_misc.h, not installed). The client below uses it
 * to send handshake messages after the handshake that no public call sends (malformed
 * ones among them). */
int mbedtls_ssl_write_record(mbedtls_ssl_context *ssl, int force_flush);

/* The client sends msg (whole handshake messages, headers included) as one record under
 * its current keys. */
static int cli_send_record(pair *p, const unsigned char *msg, size_t len) {
    mbedtls_ssl_context *c = &p->ssl;
    memcpy(c->MBEDTLS_PRIVATE(out_msg), msg, len);
    c->MBEDTLS_PRIVATE(out_msgtype) = MBEDTLS_SSL_MSG_HANDSHAKE;
    c->MBEDTLS_PRIVATE(out_msglen) = len;
    return mbedtls_ssl_write_record(c, 1);
}

/* After a TLS 1.3 handshake and some data the client sends the handshake record `msg`,
 * which the server must refuse: the session fails, the client gets a fatal alert
 * `alert`, and the error says `why`. */
static void refused_record(tls_server *s, const unsigned char *msg, size_t len,
                           unsigned char alert, const char *why) {
    pair p;
    copts o = {0};
    CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
    hs_result h = handshake(&p);
    CHECK(h.srv == 1 && h.cli == 0 && !strcmp(tls_version(p.sv), "TLSv1.3"),
          "handshake srv %d cli %d", h.srv, h.cli);
    CHECK(transfer(&p, 5000, 4096) == 0, "data before %s", why);
    CHECK(tls_alerted(p.sv) == 0, "no alert while the session is up");
    CHECK(cli_send_record(&p, msg, len) == 0, "client sends %s", why);
    char b[64];
    ssize_t n = tls_read(p.sv, b, sizeof b);
    CHECK(n == -EPROTO && strstr(tls_error(p.sv), why), "%s: %zd '%s'", why, n,
          tls_error(p.sv));
    CHECK(tls_alerted(p.sv) == 1, "%s: the alert went out", why);
    CHECK(tls_read(p.sv, b, sizeof b) == n, "failure sticks");
    unsigned char cb[64];
    int r = mbedtls_ssl_read(&p.ssl, cb, sizeof cb);
    CHECK(r == MBEDTLS_ERR_SSL_FATAL_ALERT_MESSAGE && p.ssl.MBEDTLS_PRIVATE(in_msg)[1] == alert,
          "%s: the client reads %d (alert %u, want %u)", why, r,
          p.ssl.MBEDTLS_PRIVATE(in_msg)[1], alert);
    pair_close(&p);
}

/* Malformed KeyUpdates end the session with the alert RFC 8446 names; a message the
 * server does not take (a NewSessionTicket from a client) too. */
static void test_post_handshake(tls_server *s) {
    static const unsigned char empty[] = {24, 0, 0, 0},
                               two_bytes[] = {24, 0, 0, 2, 1, 0},
                               value2[] = {24, 0, 0, 1, 2},
                               value255[] = {24, 0, 0, 1, 255},
                               not_last[] = {24, 0, 0, 1, 0, 24, 0, 0, 1, 0},
                               nst[] = {MBEDTLS_SSL_HS_NEW_SESSION_TICKET, 0, 0, 4, 0, 0, 0, 0};
    refused_record(s, empty, sizeof empty, MBEDTLS_SSL_ALERT_MSG_DECODE_ERROR, "not one byte");
    refused_record(s, two_bytes, sizeof two_bytes, MBEDTLS_SSL_ALERT_MSG_DECODE_ERROR,
                   "not one byte");
    refused_record(s, value2, sizeof value2, MBEDTLS_SSL_ALERT_MSG_ILLEGAL_PARAMETER,
                   "neither 0 nor 1");
    refused_record(s, value255, sizeof value255, MBEDTLS_SSL_ALERT_MSG_ILLEGAL_PARAMETER,
                   "neither 0 nor 1");
    refused_record(s, not_last, sizeof not_last, MBEDTLS_SSL_ALERT_MSG_UNEXPECTED_MESSAGE,
                   "does not end its record");
    refused_record(s, nst, sizeof nst, MBEDTLS_SSL_ALERT_MSG_UNEXPECTED_MESSAGE, "unexpected");
}

/* ---------------------------------------------------------------- KeyUpdate */

static unsigned srv_updates(pair *p, unsigned *ours) { return tls_key_updates(p->sv, ours); }
static uint32_t cli_updates(pair *p, uint32_t *sent) {
    uint32_t got = 0;
    mbedtls_ssl_tls13_get_key_updates(&p->ssl, &got, sent);
    return got;
}

/* Reads on the server until -EAGAIN; 0, or the failing result. */
static ssize_t srv_drain(pair *p) {
    char b[256];
    ssize_t n;
    while ((n = tls_read(p->sv, b, sizeof b)) > 0)
        ;
    return n == -EAGAIN ? 0 : n == 0 ? -1 : n;
}

/* `rounds` KeyUpdates from the client (kiln's mbedtls_ssl_tls13_send_key_update), two of
 * three asking for the server's, each followed by `bytes` each way, checked byte for
 * byte: every update is taken, every request answered by exactly one KeyUpdate of the
 * server's, before its next data. Through a `cap`-byte pipe: at 7 bytes every KeyUpdate
 * record (37 bytes) is written in pieces, so each side's queued KeyUpdate meets the
 * caller's next write (and its WANT_WRITE retry). */
static void key_update_rounds(tls_server *s, size_t cap, int rounds, size_t bytes) {
    pair p;
    copts o = {.cap = cap};
    CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
    hs_result h = handshake(&p);
    CHECK(h.srv == 1 && h.cli == 0 && !strcmp(tls_version(p.sv), "TLSv1.3"),
          "handshake srv %d cli %d", h.srv, h.cli);
    int requested = 0, bad_send = 0, bad_data = -1, queued = 0;
    for (int i = 0; i < rounds && bad_data < 0; i++) {
        int req = i % 3 != 0;
        requested += req;
        bad_send += mbedtls_ssl_tls13_send_key_update(&p.ssl, req) != 0;
        queued += p.ssl.MBEDTLS_PRIVATE(key_update_queued); /* left for the next write */
        if (transfer(&p, bytes, 1000) != 0)
            bad_data = i;
    }
    CHECK(cap > 37 ? queued == 0 : queued == rounds, "%d-byte pipe: %d of %d KeyUpdates left queued",
          (int)cap, queued, rounds);
    CHECK(bad_send == 0 && bad_data < 0, "%d-byte pipe: %d sends failed, data failed in round %d",
          (int)cap, bad_send, bad_data);
    unsigned ours;
    uint32_t cli_sent;
    unsigned got = srv_updates(&p, &ours);
    uint32_t cli_got = cli_updates(&p, &cli_sent);
    CHECK(got == (unsigned)rounds && cli_sent == (uint32_t)rounds,
          "%d-byte pipe: the server took %u of the client's %u KeyUpdates (want %d)", (int)cap,
          got, (unsigned)cli_sent, rounds);
    CHECK(ours == (unsigned)requested && cli_got == (uint32_t)requested,
          "%d-byte pipe: %d requests, the server sent %u, the client took %u", (int)cap,
          requested, ours, (unsigned)cli_got);
    CHECK(tls_alerted(p.sv) == 0 && !strcmp(tls_error(p.sv), ""), "no failure: '%s'",
          tls_error(p.sv));
    pair_close(&p);
}

/* update_requested does not pile up output: while the server's output waits (the pipe
 * full, a record half-sent), ten requests make one KeyUpdate of the server's, sent after
 * the half-sent record (under the old keys) and before the next data. */
static void test_key_update_backlog(tls_server *s) {
    pair p;
    copts o = {0};
    CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
    hs_result h = handshake(&p);
    CHECK(h.srv == 1 && h.cli == 0, "handshake srv %d cli %d", h.srv, h.cli);
    static unsigned char big[20000], b[8192];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = pattern(i, 4);
    size_t sent = 0;
    ssize_t w;
    while ((w = tls_write(p.sv, big + sent, sizeof big - sent)) > 0)
        sent += (size_t)w;
    CHECK(w == -EAGAIN && p.s2c.len == p.s2c.cap && sent < sizeof big,
          "the server's output backs up: %zd, %zu sent", w, sent);
    int bad = 0;
    for (int i = 0; i < 10; i++)
        bad += mbedtls_ssl_tls13_send_key_update(&p.ssl, 1) != 0;
    CHECK(bad == 0 && srv_drain(&p) == 0, "ten requests: %d failed, read: %s", bad,
          tls_error(p.sv));
    unsigned ours, got = srv_updates(&p, &ours);
    CHECK(got == 10 && ours == 0, "taken: %u, answered while output waits: %u", got, ours);
    size_t rcv = 0;
    int n;
    for (int i = 0; i < 10000 && rcv < sizeof big; i++) {
        if (sent < sizeof big && (w = tls_write(p.sv, big + sent, sizeof big - sent)) > 0)
            sent += (size_t)w;
        else if (sent < sizeof big && w != -EAGAIN)
            break;
        while ((n = mbedtls_ssl_read(&p.ssl, b, sizeof b)) > 0) {
            for (int j = 0; j < n; j++)
                bad += b[j] != pattern(rcv + (size_t)j, 4);
            rcv += (size_t)n;
        }
        if (!want(n))
            break;
    }
    CHECK(rcv == sizeof big && bad == 0, "the client got %zu of %zu bytes, %d bad (%s)", rcv,
          sizeof big, bad, tls_error(p.sv));
    got = srv_updates(&p, &ours);
    CHECK(ours == 1 && cli_updates(&p, NULL) == 1, "one KeyUpdate for ten requests: %u sent, %u taken",
          ours, (unsigned)cli_updates(&p, NULL));
    CHECK(transfer(&p, 5000, 4096) == 0, "data after");
    pair_close(&p);
}

/* A client may send MBEDTLS_SSL_TLS1_3_MAX_KEY_UPDATES_IN_A_ROW KeyUpdates with no data
 * between them (each costs the server a key derivation); after data, as many again; one
 * more in a row ends the session with unexpected_message. */
static void test_key_update_limit(tls_server *s) {
    enum { MAX = MBEDTLS_SSL_TLS1_3_MAX_KEY_UPDATES_IN_A_ROW };
    pair p;
    copts o = {0};
    CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
    hs_result h = handshake(&p);
    CHECK(h.srv == 1 && h.cli == 0, "handshake srv %d cli %d", h.srv, h.cli);
    int bad = 0;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < MAX; i++) {
            bad += mbedtls_ssl_tls13_send_key_update(&p.ssl, i & 1) != 0;
            if (i % 16 == 15)
                bad += srv_drain(&p) != 0;
        }
        bad += srv_drain(&p) != 0;
        CHECK(!bad && srv_updates(&p, NULL) == (unsigned)(MAX * (round + 1)),
              "%d in a row: %d failures, %u taken (%s)", MAX, bad, srv_updates(&p, NULL),
              tls_error(p.sv));
        CHECK(transfer(&p, 3000, 4096) == 0, "data after %d in a row", MAX);
    }
    for (int i = 0; i < MAX; i++) {
        bad += mbedtls_ssl_tls13_send_key_update(&p.ssl, 0) != 0;
        if (i % 16 == 15)
            bad += srv_drain(&p) != 0;
    }
    bad += mbedtls_ssl_tls13_send_key_update(&p.ssl, 0) != 0;
    char sb[64];
    ssize_t n;
    while ((n = tls_read(p.sv, sb, sizeof sb)) > 0)
        ;
    CHECK(!bad && n == -EPROTO && strstr(tls_error(p.sv), "in a row") && tls_alerted(p.sv),
          "%d in a row: %zd '%s'", MAX + 1, n, tls_error(p.sv));
    unsigned char cb[64];
    int r;
    while ((r = mbedtls_ssl_read(&p.ssl, cb, sizeof cb)) > 0)
        ;
    CHECK(r == MBEDTLS_ERR_SSL_FATAL_ALERT_MESSAGE &&
              p.ssl.MBEDTLS_PRIVATE(in_msg)[1] == MBEDTLS_SSL_ALERT_MSG_UNEXPECTED_MESSAGE,
          "the client reads %d", r);
    pair_close(&p);
}

/* Two mbedTLS endpoints (kiln's patch on both), for what kilnd's server never does:
 * start a KeyUpdate itself, asking for the client's. */
typedef struct {
    ring *rx, *tx;
} ends;
static int end_send(void *ctx, const unsigned char *buf, size_t len) {
    ssize_t n = ring_write(((ends *)ctx)->tx, buf, len);
    return n == -EAGAIN ? MBEDTLS_ERR_SSL_WANT_WRITE : n < 0 ? MBEDTLS_ERR_SSL_INTERNAL_ERROR
                                                               : (int)n;
}
static int end_recv(void *ctx, unsigned char *buf, size_t len) {
    ssize_t n = ring_read(((ends *)ctx)->rx, buf, len);
    return n == -EAGAIN ? MBEDTLS_ERR_SSL_WANT_READ : (int)n;
}

/* total bytes each way between two mbedTLS contexts over the pipes a and b, byte for
 * byte (the same-length-after-WANT rule kept by each writer). 0 on success. */
static int duplex(mbedtls_ssl_context *e[2], const ring *a, const ring *b, size_t total,
                  unsigned seed) {
    static unsigned char out[2][1 << 14], buf[20000];
    if (total > sizeof out[0])
        return -1;
    for (size_t i = 0; i < total; i++)
        out[0][i] = pattern(i, seed), out[1][i] = pattern(i, seed + 1);
    size_t sent[2] = {0, 0}, got[2] = {0, 0}, pend[2] = {0, 0};
    for (int idle = 0, round = 0; idle < 5 && round < 100000; round++) {
        size_t before = sent[0] + sent[1] + got[0] + got[1] + a->moved + b->moved;
        for (int k = 0; k < 2; k++) {
            if (sent[k] < total) {
                size_t n = pend[k] ? pend[k] : total - sent[k];
                int r = mbedtls_ssl_write(e[k], out[k] + sent[k], n);
                if (r > 0)
                    sent[k] += (size_t)r, pend[k] = 0;
                else if (want(r))
                    pend[k] = n;
                else
                    return fprintf(stderr, "duplex: side %d write -0x%04x\n", k, (unsigned)-r), -2;
            }
            int r; /* side k reads what the other sent */
            while ((r = mbedtls_ssl_read(e[k], buf, sizeof buf)) > 0) {
                for (int i = 0; i < r; i++)
                    if (buf[i] != out[!k][got[k] + (size_t)i])
                        return fprintf(stderr, "duplex: side %d: bad byte at %zu\n", k, got[k] + (size_t)i), -3;
                got[k] += (size_t)r;
            }
            if (!want(r))
                return fprintf(stderr, "duplex: side %d read -0x%04x\n", k, (unsigned)-r), -4;
        }
        if (sent[0] == total && sent[1] == total && got[0] == total && got[1] == total)
            return 0;
        idle = before == sent[0] + sent[1] + got[0] + got[1] + a->moved + b->moved ? idle + 1 : 0;
    }
    fprintf(stderr, "duplex: stalled: sent %zu %zu, got %zu %zu\n", sent[0], sent[1], got[0], got[1]);
    return -5;
}

/* Reads on c until WANT_*, checking the bytes against pattern(., seed) from *got on. */
static int read_pattern(mbedtls_ssl_context *c, size_t *got, unsigned seed) {
    static unsigned char b[4096];
    int n;
    while ((n = mbedtls_ssl_read(c, b, sizeof b)) > 0)
        for (int i = 0; i < n; i++)
            if (b[i] != pattern((*got)++, seed))
                return -1;
    return want(n) ? 0 : n;
}

/* The client owes the server an answer (its request came while the client's data was
 * half-sent) and asks for an update of its own: two KeyUpdates, not one, the answer
 * (update_not_requested) first, then the client's data. */
static void key_update_owed_and_own(mbedtls_ssl_context *cs, mbedtls_ssl_context *ss) {
    static unsigned char big[1600];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = pattern(i, 9);
    uint32_t c_got0, c_sent0, s_got0, s_sent0, c_got, c_sent, s_got, s_sent;
    mbedtls_ssl_tls13_get_key_updates(cs, &c_got0, &c_sent0);
    mbedtls_ssl_tls13_get_key_updates(ss, &s_got0, &s_sent0);
    int r = mbedtls_ssl_tls13_send_key_update(ss, 1);
    int w = mbedtls_ssl_write(cs, big, 1500);
    CHECK(r == 0 && want(w), "the server asks (%d), the client's data waits (%d)", r, w);
    size_t s_rcv = 0, c_rcv = 0;
    int bad = read_pattern(cs, &c_rcv, 0) != 0;
    CHECK(cs->MBEDTLS_PRIVATE(key_update_pending) == 1, "an answer owed: %u",
          cs->MBEDTLS_PRIVATE(key_update_pending));
    CHECK(mbedtls_ssl_tls13_send_key_update(cs, 1) == 0 && cs->MBEDTLS_PRIVATE(key_update_pending) == 3,
          "and one of the client's own due: %u", cs->MBEDTLS_PRIVATE(key_update_pending));
    for (int i = 0; i < 10000 && w != 1500 && !bad; i++) { /* the half-sent record */
        w = mbedtls_ssl_write(cs, big, 1500);
        bad += read_pattern(ss, &s_rcv, 9) != 0 || (w < 0 && !want(w));
    }
    w = -1;
    for (int i = 0; i < 10000 && w != 100 && !bad; i++) { /* two KeyUpdates, then these */
        w = mbedtls_ssl_write(cs, big + 1500, 100);
        bad += read_pattern(ss, &s_rcv, 9) != 0 || (w < 0 && !want(w));
    }
    for (int i = 0; i < 100 && s_rcv < 1600 && !bad; i++)
        bad += read_pattern(ss, &s_rcv, 9) != 0;
    CHECK(!bad && s_rcv == 1600, "the server got %zu of 1600 bytes (%d bad)", s_rcv, bad);
    bad += read_pattern(cs, &c_rcv, 0) != 0; /* the server's answer: no data */
    mbedtls_ssl_tls13_get_key_updates(cs, &c_got, &c_sent);
    mbedtls_ssl_tls13_get_key_updates(ss, &s_got, &s_sent);
    CHECK(!bad && c_sent - c_sent0 == 2 && s_got - s_got0 == 2,
          "the client sent %u, the server took %u (want 2)", (unsigned)(c_sent - c_sent0),
          (unsigned)(s_got - s_got0));
    CHECK(s_sent - s_sent0 == 2 && c_got - c_got0 == 2 && ss->MBEDTLS_PRIVATE(key_update_pending) == 0,
          "the server asked and answered: %u sent, %u taken (want 2), %u due",
          (unsigned)(s_sent - s_sent0), (unsigned)(c_got - c_got0),
          ss->MBEDTLS_PRIVATE(key_update_pending));
}

static void test_key_update_both_mbedtls(void) {
    ring c2s = {.cap = 64}, s2c = {.cap = 64}; /* every record in pieces */
    ends ce = {&s2c, &c2s}, se = {&c2s, &s2c};
    mbedtls_ssl_config cc, sc;
    mbedtls_ssl_context cs, ss;
    mbedtls_x509_crt ca, crt;
    mbedtls_pk_context key;
    mbedtls_ssl_config_init(&cc), mbedtls_ssl_config_init(&sc);
    mbedtls_ssl_init(&cs), mbedtls_ssl_init(&ss);
    mbedtls_x509_crt_init(&ca), mbedtls_x509_crt_init(&crt);
    mbedtls_pk_init(&key);
    int r = mbedtls_ssl_config_defaults(&cc, MBEDTLS_SSL_IS_CLIENT, MBEDTLS_SSL_TRANSPORT_STREAM,
                                        MBEDTLS_SSL_PRESET_DEFAULT);
    if (!r)
        r = mbedtls_ssl_config_defaults(&sc, MBEDTLS_SSL_IS_SERVER, MBEDTLS_SSL_TRANSPORT_STREAM,
                                        MBEDTLS_SSL_PRESET_DEFAULT);
    if (!r && !(r = mbedtls_x509_crt_parse_file(&ca, ca1)) &&
        !(r = mbedtls_x509_crt_parse_file(&crt, crt1)) &&
        !(r = mbedtls_pk_parse_keyfile(&key, key1, NULL, mbedtls_ctr_drbg_random, &drbg))) {
        mbedtls_ssl_conf_rng(&cc, mbedtls_ctr_drbg_random, &drbg);
        mbedtls_ssl_conf_rng(&sc, mbedtls_ctr_drbg_random, &drbg);
        mbedtls_ssl_conf_ca_chain(&cc, &ca, NULL);
        mbedtls_ssl_conf_authmode(&cc, MBEDTLS_SSL_VERIFY_REQUIRED);
        mbedtls_ssl_conf_min_tls_version(&cc, MBEDTLS_SSL_VERSION_TLS1_3);
        mbedtls_ssl_conf_min_tls_version(&sc, MBEDTLS_SSL_VERSION_TLS1_3);
        r = mbedtls_ssl_conf_own_cert(&sc, &crt, &key);
    }
    if (!r && !(r = mbedtls_ssl_setup(&cs, &cc)) && !(r = mbedtls_ssl_setup(&ss, &sc)))
        r = mbedtls_ssl_set_hostname(&cs, "localhost");
    CHECK(r == 0, "two mbedTLS endpoints: -0x%04x", (unsigned)-r);
    mbedtls_ssl_set_bio(&cs, &ce, end_send, end_recv, NULL);
    mbedtls_ssl_set_bio(&ss, &se, end_send, end_recv, NULL);
    int hc = 1, hs = 1; /* still to go */
    for (int i = 0; i < 100000 && (hc || hs) && !r; i++) {
        int rc = hc ? mbedtls_ssl_handshake(&cs) : 0;
        int rs = hs ? mbedtls_ssl_handshake(&ss) : 0;
        hc = hc && rc != 0, hs = hs && rs != 0;
        r = rc && !want(rc) ? rc : rs && !want(rs) ? rs : 0;
    }
    CHECK(r == 0 && !hc && !hs, "handshake: -0x%04x, client %d server %d to go", (unsigned)-r, hc, hs);
    mbedtls_ssl_context *e[2] = {&cs, &ss};
    int bad_send = 0, bad_data = -1, asked[2] = {0, 0};
    enum { ROUNDS = 60 };
    for (int i = 0; i < ROUNDS && bad_data < 0 && r == 0; i++) {
        int k = i & 1, req = (i & 2) == 0; /* each side in turn, every other one asking */
        asked[k] += req;
        bad_send += mbedtls_ssl_tls13_send_key_update(e[k], req) != 0;
        /* The answer to a request goes before the answering side's next data: the
         * second exchange has it, if the first did not. */
        if (duplex(e, &c2s, &s2c, 1500, (unsigned)i) != 0 ||
            duplex(e, &c2s, &s2c, 700, (unsigned)i + 1000) != 0)
            bad_data = i;
    }
    CHECK(bad_send == 0 && bad_data < 0, "%d sends failed, data failed in round %d", bad_send, bad_data);
    uint32_t c_got, c_sent, s_got, s_sent;
    mbedtls_ssl_tls13_get_key_updates(&cs, &c_got, &c_sent);
    mbedtls_ssl_tls13_get_key_updates(&ss, &s_got, &s_sent);
    /* Each side started ROUNDS / 2 and answered each of the other's requests once. */
    CHECK(c_got == s_sent && s_got == c_sent, "every KeyUpdate taken: client %u of %u, server %u of %u",
          (unsigned)c_got, (unsigned)s_sent, (unsigned)s_got, (unsigned)c_sent);
    CHECK(c_sent == ROUNDS / 2 + (uint32_t)asked[1] && s_sent == ROUNDS / 2 + (uint32_t)asked[0],
          "both sides answered: client sent %u (%d asked of it), server %u (%d)", (unsigned)c_sent,
          asked[1], (unsigned)s_sent, asked[0]);
    key_update_owed_and_own(&cs, &ss);
    mbedtls_ssl_free(&cs), mbedtls_ssl_free(&ss);
    mbedtls_ssl_config_free(&cc), mbedtls_ssl_config_free(&sc);
    mbedtls_x509_crt_free(&ca), mbedtls_x509_crt_free(&crt);
    mbedtls_pk_free(&key);
}

/* Out of memory in a KeyUpdate (new keys mean new cipher contexts, from the sessions'
 * heap as kilnd's loop has it): after the handshake the heap's K-th allocation fails, K
 * from 1 until a round of updates both ways gets past every failure point. Each attempt
 * goes through or fails its session cleanly (either side may be the one refused), and
 * every block comes back. */
static void test_key_update_oom(tls_server *s) {
    mm_heap h;
    CHECK(mm_heap_init(&h, 16u << 20) == 0, "heap");
    tls_use_heap(&h, 8);
    int bad = 0, fired = 1, ok = 0, k = 1;
    transfer_quiet = 1;
    for (; fired && k < 500; k++) {
        pair p;
        copts o = {0};
        ok = pair_open(&p, s, &o) == 0;
        if (ok) {
            hs_result r = handshake(&p);
            ok = r.srv == 1 && r.cli == 0;
        }
        if (ok) {
            mm_heap_fail_after(&h, k);
            ok = mbedtls_ssl_tls13_send_key_update(&p.ssl, 1) == 0 && transfer(&p, 2000, 4096) == 0 &&
                 srv_updates(&p, NULL) == 1;
            fired = h.fail_n == 0;
            mm_heap_fail_after(&h, 0);
        }
        pair_close(&p);
        if (h.used != 0 || mm_heap_check(&h) != 0)
            bad++, h.used = 0;
    }
    transfer_quiet = 0;
    CHECK(!bad, "KeyUpdate OOM loop: %d of %d steps left heap memory behind", bad, k - 1);
    CHECK(!fired && ok && k > 2, "KeyUpdate OOM loop: a round past every failure point (%d steps)", k - 1);
    tls_use_heap(NULL, 0);
    mm_heap_free_all(&h);
}

static void test_key_update(tls_server *s) {
    key_update_rounds(s, 4096, 150, 3000);
    key_update_rounds(s, 7, 30, 200);
    test_key_update_backlog(s);
    test_key_update_limit(s);
    test_key_update_both_mbedtls();
    test_key_update_oom(s);
    /* A TLS 1.2 session has no KeyUpdate: the call says so and changes nothing. */
    pair p;
    copts o = {.tls12 = 1};
    CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
    hs_result h = handshake(&p);
    CHECK(h.srv == 1 && h.cli == 0, "TLS 1.2 handshake srv %d cli %d", h.srv, h.cli);
    CHECK(mbedtls_ssl_tls13_send_key_update(&p.ssl, 1) == MBEDTLS_ERR_SSL_BAD_INPUT_DATA,
          "no KeyUpdate in TLS 1.2");
    CHECK(transfer(&p, 3000, 4096) == 0, "TLS 1.2 data after");
    pair_close(&p);
}

/* A TLS 1.2 client asks to renegotiate while the server has a record half-sent. The
 * server refuses by alert, and mbedTLS flushes the queued record first, inside
 * tls_read: the retried tls_write must then report the bytes as taken without sending
 * them again. */
static void test_reneg(tls_server *s) {
    pair p;
    copts o = {.tls12 = 1, .cap = 4096};
    CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
    mbedtls_ssl_conf_renegotiation(&p.conf, MBEDTLS_SSL_RENEGOTIATION_ENABLED);
    hs_result h = handshake(&p);
    CHECK(h.srv == 1 && h.cli == 0, "handshake srv %d cli %d", h.srv, h.cli);
    static unsigned char big[9000], b[8192];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = pattern(i, 3);
    CHECK(tls_write(p.sv, big, 3000) == 3000, "first record");
    CHECK(tls_write(p.sv, big + 3000, 3000) == -EAGAIN, "second record half-sent");
    size_t got = 0;
    int bad = 0, n;
    while ((n = mbedtls_ssl_read(&p.ssl, b, sizeof b)) > 0) {
        for (int j = 0; j < n; j++)
            bad += got + (size_t)j >= sizeof big || b[j] != pattern(got + (size_t)j, 3);
        got += (size_t)n;
    }
    CHECK(got == 3000 && p.s2c.len == 0, "client drained: %zu", got);
    n = mbedtls_ssl_renegotiate(&p.ssl);
    CHECK(want(n), "renegotiate %d", n);
    char sb[64];
    CHECK(tls_read(p.sv, sb, sizeof sb) == -EAGAIN, "server read: %s", tls_error(p.sv));
    CHECK(tls_write(p.sv, big + 3000, 3000) == 3000, "retry reports the record taken");
    ssize_t w = -EAGAIN;
    for (int i = 0; i < 1000 && got < sizeof big + 100; i++) {
        if (w == -EAGAIN)
            w = tls_write(p.sv, big + 6000, 3000);
        n = mbedtls_ssl_read(&p.ssl, b, sizeof b);
        if (n > 0) {
            for (int j = 0; j < n; j++)
                bad += got + (size_t)j >= sizeof big || b[j] != pattern(got + (size_t)j, 3);
            got += (size_t)n;
        } else if (!want(n)) {
            break;
        }
    }
    CHECK(w == 3000 && got == sizeof big && bad == 0, "after renegotiation: w %zd got %zu bad %d",
          w, got, bad);
    pair_close(&p);

    /* The refusal alert itself stuck in a full pipe, with no record of ours queued: a
     * write must flush the alert first, not claim its bytes were sent with it. A
     * 35-byte record fills the 64-byte pipe exactly (29 bytes of GCM overhead). */
    copts o2 = {.tls12 = 1, .cap = 64, .suite = MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256};
    CHECK(pair_open(&p, s, &o2) == 0, "open: %s", err);
    p.c2s.cap = 4096; /* the ClientHello must get through whole */
    mbedtls_ssl_conf_renegotiation(&p.conf, MBEDTLS_SSL_RENEGOTIATION_ENABLED);
    h = handshake(&p);
    CHECK(h.srv == 1 && h.cli == 0, "handshake srv %d cli %d", h.srv, h.cli);
    n = mbedtls_ssl_renegotiate(&p.ssl);
    CHECK(want(n) || n == MBEDTLS_ERR_SSL_WAITING_SERVER_HELLO_RENEGO, "renegotiate %d", n);
    CHECK(tls_write(p.sv, big, 35) == 35 && p.s2c.len == 64, "pipe full: %zu", p.s2c.len);
    CHECK(tls_read(p.sv, sb, sizeof sb) == -EAGAIN, "server read: %s", tls_error(p.sv));
    CHECK(tls_write(p.sv, big + 35, 35) == -EAGAIN, "alert first");
    got = 0;
    bad = 0;
    w = -EAGAIN;
    for (int i = 0; i < 1000 && got < 70; i++) {
        if (w == -EAGAIN)
            w = tls_write(p.sv, big + 35, 35);
        bad += tls_read(p.sv, sb, sizeof sb) != -EAGAIN; /* nothing for it to read */
        n = mbedtls_ssl_read(&p.ssl, b, sizeof b);
        if (n > 0) {
            for (int j = 0; j < n; j++)
                bad += got + (size_t)j >= 70 || b[j] != pattern(got + (size_t)j, 3);
            got += (size_t)n;
        } else if (!want(n)) {
            fprintf(stderr, "client read %d\n", n);
            break;
        }
    }
    CHECK(w == 35 && got == 70 && bad == 0, "alert then data: w %zd got %zu bad %d", w, got, bad);
    pair_close(&p);
}

static void garbage(tls_server *s, const char *text, size_t cap) {
    pair p;
    copts o = {.cap = cap};
    CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
    ssize_t w = ring_write(&p.c2s, text, strlen(text));
    CHECK(w > 0, "garbage in");
    int r = tls_handshake(p.sv);
    CHECK(r < 0 && r != -EAGAIN, "garbage '%s' (pipe %zu): %d", text, cap, r);
    CHECK(strstr(tls_error(p.sv), "not TLS"), "error '%s'", tls_error(p.sv));
    CHECK(tls_handshake(p.sv) == r, "failure sticks");
    char b[8];
    CHECK(tls_read(p.sv, b, sizeof b) == r && tls_write(p.sv, "x", 1) == r, "io after failure");
    pair_close(&p);
}

static void test_garbage(tls_server *s) {
    garbage(s, "GET / HTTP/1.0\r\n\r\n", 4096);
    garbage(s, "HELLO kiln/1\n", 4096);
    garbage(s, "HELLO kiln/1\n", 1);
    garbage(s, "hi", 4096);

    /* End of stream in the middle of the handshake: an error, not "closed". */
    pair p;
    copts o = {0};
    CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
    int r = mbedtls_ssl_handshake(&p.ssl); /* the ClientHello goes out */
    CHECK(want(r), "client hello %d", r);
    p.c2s.closed = 1;
    int h = 0;
    for (int i = 0; i < 10 && h == 0; i++)
        h = tls_handshake(p.sv);
    CHECK(h < 0 && strstr(tls_error(p.sv), "closed"), "EOF in handshake %d '%s'", h,
          tls_error(p.sv));
    pair_close(&p);

    /* A BIO error is reported with its errno. */
    CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
    p.s2c.closed = 1; /* the server's writes fail with EPIPE */
    for (int i = 0; i < 3; i++)
        (void)mbedtls_ssl_handshake(&p.ssl);
    h = 0;
    for (int i = 0; i < 10 && h == 0; i++)
        h = tls_handshake(p.sv);
    CHECK(h == -EPIPE && strstr(tls_error(p.sv), "write"), "BIO error %d '%s'", h,
          tls_error(p.sv));
    pair_close(&p);
}

static void test_mtls(void) {
    /* Required. */
    tls_server *s = server(crt1, key1, ca1, 1);
    CHECK(s, "mTLS server: %s", err);
    if (!s)
        return;
    pair p;
    for (int v12 = 0; v12 < 2; v12++) {
        copts none = {.tls12 = v12};
        CHECK(pair_open(&p, s, &none) == 0, "open: %s", err);
        hs_result h = handshake(&p);
        CHECK(h.srv < 0 && strstr(tls_error(p.sv), "client"), "no cert, required (1.%d): %d '%s'",
              3 - v12, h.srv, tls_error(p.sv));
        pair_close(&p);

        copts good = {.crt = ccrt1, .key = ckey1, .tls12 = v12, .cap = 64};
        CHECK(pair_open(&p, s, &good) == 0, "open: %s", err);
        h = handshake(&p);
        CHECK(h.srv == 1 && h.cli == 0, "client cert (1.%d): srv %d cli %d '%s'", 3 - v12, h.srv,
              h.cli, tls_error(p.sv));
        char cn[80] = "";
        int n = tls_peer_cn(p.sv, cn, sizeof cn);
        CHECK(n == 11 && !strcmp(cn, "kiln-client"), "peer CN %d '%s'", n, cn);
        CHECK(tls_peer_cn(p.sv, cn, 11) == -ERANGE, "CN into a short buffer");
        CHECK(transfer(&p, 20000, 4096) == 0, "mTLS data");
        pair_close(&p);

        copts other = {.crt = ccrt2, .key = ckey2, .tls12 = v12};
        CHECK(pair_open(&p, s, &other) == 0, "open: %s", err);
        h = handshake(&p);
        CHECK(h.srv == -EACCES && strstr(tls_error(p.sv), "trusted"),
              "other CA, required (1.%d): %d '%s'", 3 - v12, h.srv, tls_error(p.sv));
        pair_close(&p);
    }
    tls_server_free(s);

    /* Optional: none is fine, a bad one is not. */
    s = server(crt1, key1, ca1, 0);
    CHECK(s, "optional mTLS server: %s", err);
    if (!s)
        return;
    for (int v12 = 0; v12 < 2; v12++) {
        copts none = {.tls12 = v12};
        CHECK(pair_open(&p, s, &none) == 0, "open: %s", err);
        hs_result h = handshake(&p);
        char cn[80];
        CHECK(h.srv == 1 && h.cli == 0, "no cert, optional (1.%d): %d '%s'", 3 - v12, h.srv,
              tls_error(p.sv));
        CHECK(tls_peer_cn(p.sv, cn, sizeof cn) == -ENOENT, "no CN");
        pair_close(&p);

        copts good = {.crt = ccrt1, .key = ckey1, .tls12 = v12};
        CHECK(pair_open(&p, s, &good) == 0, "open: %s", err);
        h = handshake(&p);
        CHECK(h.srv == 1 && tls_peer_cn(p.sv, cn, sizeof cn) == 11 && !strcmp(cn, "kiln-client"),
              "good cert, optional (1.%d): %d '%s'", 3 - v12, h.srv, tls_error(p.sv));
        pair_close(&p);

        copts other = {.crt = ccrt2, .key = ckey2, .tls12 = v12};
        CHECK(pair_open(&p, s, &other) == 0, "open: %s", err);
        h = handshake(&p);
        CHECK(h.srv == -EACCES && strstr(tls_error(p.sv), "client certificate rejected"),
              "other CA, optional (1.%d): %d '%s'", 3 - v12, h.srv, tls_error(p.sv));
        CHECK(tls_peer_cn(p.sv, cn, sizeof cn) == -ENOENT, "no CN from a rejected cert");
        pair_close(&p);
    }
    tls_server_free(s);
}

static void test_server_errors(void) {
    tls_server *s = server(crt1, ckey1, NULL, 0);
    CHECK(!s && strstr(err, "does not match") && strstr(err, "client.key"),
          "mismatched key: '%s'", err);
    tls_server_free(s);
    char missing[256];
    snprintf(missing, sizeof missing, "%s/nope.crt", dir1);
    s = server(missing, key1, NULL, 0);
    CHECK(!s && strstr(err, missing) && strstr(err, "No such file"), "missing cert: '%s'", err);
    s = server(crt1, missing, NULL, 0);
    CHECK(!s && strstr(err, missing), "missing key: '%s'", err);
    s = server(crt1, key1, missing, 1);
    CHECK(!s && strstr(err, missing), "missing client CA: '%s'", err);
    s = server(key1, key1, NULL, 0); /* a key where the certificate should be */
    CHECK(!s && strstr(err, "server.key") && strstr(err, "certificate"), "key as cert: '%s'", err);
    s = server(crt1, crt1, NULL, 0);
    CHECK(!s && strstr(err, "key") && strstr(err, "server.crt"), "cert as key: '%s'", err);
    tls_config empty = {"", "", NULL, 0};
    s = tls_server_new(&empty, err, sizeof err);
    CHECK(!s && err[0], "empty config: '%s'", err);
}

static void test_rsa(void) {
    char c[256], k[256];
    snprintf(c, sizeof c, "%s/rsa.crt", dir2);
    snprintf(k, sizeof k, "%s/rsa.key", dir2);
    FILE *f = fopen(c, "w");
    fputs(rsa_crt, f);
    fclose(f);
    f = fopen(k, "w");
    fputs(rsa_key, f);
    fclose(f);
    tls_server *s = server(c, k, NULL, 0);
    CHECK(s, "RSA server: %s", err);
    if (!s)
        return;
    for (int v12 = 0; v12 < 2; v12++) {
        pair p;
        copts o = {.ca = c, .tls12 = v12, .cap = 300};
        CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
        hs_result h = handshake(&p);
        CHECK(h.srv == 1 && h.cli == 0, "RSA (1.%d): srv %d cli %d '%s'", 3 - v12, h.srv, h.cli,
              tls_error(p.sv));
        CHECK(is_aead(tls_suite(p.sv)) && (!v12 || strstr(tls_suite(p.sv), "ECDHE-RSA")),
              "RSA suite %s", tls_suite(p.sv));
        CHECK(transfer(&p, 30000, 4096) == 0, "RSA data");
        pair_close(&p);
    }
    test_groups(s, c, 1);
    test_groups(s, c, 0);
    /* An RSA key is what DHE-RSA needs: the suite is refused only because the server
     * does not list it (finite-field DH, as test_groups). */
    static const int dhe[] = {MBEDTLS_TLS_DHE_RSA_WITH_AES_128_GCM_SHA256,
                              MBEDTLS_TLS_DHE_RSA_WITH_AES_256_GCM_SHA384,
                              MBEDTLS_TLS_DHE_RSA_WITH_CHACHA20_POLY1305_SHA256};
    for (size_t i = 0; i < sizeof dhe / sizeof dhe[0]; i++) {
        pair p;
        copts o = {.ca = c, .tls12 = 1, .suite = dhe[i]};
        CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
        hs_result h = handshake(&p);
        CHECK(h.srv < 0 && h.cli < 0, "%s alone refused: srv %d cli %d",
              mbedtls_ssl_get_ciphersuite_name(dhe[i]), h.srv, h.cli);
        pair_close(&p);
    }
    tls_server_free(s);
}

static void test_hosts(void) {
    /* dir2 was made with hosts "kiln.local, 10.1.2.3": its server certificate matches
     * those, and not some other name. */
    char c[256], k[256], a[256];
    snprintf(c, sizeof c, "%s/server.crt", dir2);
    snprintf(k, sizeof k, "%s/server.key", dir2);
    snprintf(a, sizeof a, "%s/ca.crt", dir2);
    tls_server *s = server(c, k, NULL, 0);
    CHECK(s, "dir2 server: %s", err);
    if (!s)
        return;
    static const char *const ok[] = {"kiln.local", "KILN.local", "10.1.2.3", "127.0.0.1",
                                     "localhost", "::1"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        pair p;
        copts o = {.ca = a, .host = ok[i]};
        CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
        hs_result h = handshake(&p);
        CHECK(h.srv == 1 && h.cli == 0, "host %s: srv %d cli %d", ok[i], h.srv, h.cli);
        pair_close(&p);
    }
    pair p;
    copts o = {.ca = a, .host = "other.example"};
    CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
    hs_result h = handshake(&p);
    CHECK(h.cli == MBEDTLS_ERR_X509_CERT_VERIFY_FAILED, "wrong host: cli %d", h.cli);
    pair_close(&p);
    /* dir1's CA does not vouch for dir2's server. */
    copts o2 = {.host = "localhost"};
    CHECK(pair_open(&p, s, &o2) == 0, "open: %s", err);
    h = handshake(&p);
    CHECK(h.cli == MBEDTLS_ERR_X509_CERT_VERIFY_FAILED, "wrong CA: cli %d", h.cli);
    pair_close(&p);
    tls_server_free(s);
}

static int slurp(const char *file, char *buf, size_t cap) {
    FILE *f = fopen(file, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
    return (int)n;
}

static void test_certs_files(void) {
    struct stat st;
    CHECK(stat(dir1, &st) == 0 && (st.st_mode & 0777) == 0700, "dir mode %o", st.st_mode & 0777);
    static const char *const keys[] = {"ca.key", "server.key", "client.key"};
    static const char *const crts[] = {"ca.crt", "server.crt", "client.crt"};
    for (int i = 0; i < 3; i++) {
        CHECK(stat(p1(keys[i]), &st) == 0 && (st.st_mode & 0777) == 0600, "%s mode %o", keys[i],
              st.st_mode & 0777);
        CHECK(stat(p1(crts[i]), &st) == 0 && (st.st_mode & 0777) == 0644, "%s mode %o", crts[i],
              st.st_mode & 0777);
    }
    /* A nested directory is created whole. */
    char nested[128];
    snprintf(nested, sizeof nested, "%s/a/b", dir2);
    CHECK(tls_certs_create(nested, NULL, 0, err, sizeof err) == 0, "nested: %s", err);
    snprintf(path, sizeof path, "%s/client.key", nested);
    CHECK(access(path, R_OK) == 0, "nested files");

    /* force=0 keeps everything. */
    static char before[8192], after[8192];
    CHECK(slurp(p1("ca.crt"), before, sizeof before) > 0, "read ca.crt");
    CHECK(tls_certs_create(dir1, "", 0, err, sizeof err) == 0, "again: %s", err);
    CHECK(slurp(p1("ca.crt"), after, sizeof after) > 0 && !strcmp(before, after), "ca.crt kept");
    static char srv_before[8192];
    slurp(p1("server.crt"), srv_before, sizeof srv_before);

    /* A missing client pair is issued by the CA that is there. */
    unlink(p1("client.crt"));
    unlink(p1("client.key"));
    CHECK(tls_certs_create(dir1, NULL, 0, err, sizeof err) == 0, "fill in: %s", err);
    CHECK(slurp(p1("ca.crt"), after, sizeof after) > 0 && !strcmp(before, after), "CA kept");
    CHECK(slurp(p1("server.crt"), after, sizeof after) > 0 && !strcmp(srv_before, after),
          "server kept");
    tls_server *s = server(crt1, key1, ca1, 1);
    CHECK(s, "server: %s", err);
    if (s) {
        pair p;
        copts o = {.crt = ccrt1, .key = ckey1};
        CHECK(pair_open(&p, s, &o) == 0, "open: %s", err);
        hs_result h = handshake(&p);
        CHECK(h.srv == 1 && h.cli == 0, "new client cert: srv %d cli %d '%s'", h.srv, h.cli,
              tls_error(p.sv));
        pair_close(&p);
        tls_server_free(s);
    }

    /* Half a pair is refused, not guessed at. */
    unlink(p1("client.crt"));
    int r = tls_certs_create(dir1, NULL, 0, err, sizeof err);
    CHECK(r == -EEXIST && strstr(err, "client.key"), "half pair %d '%s'", r, err);
    /* With both leaf pairs there the CA key is not needed (moved offline, say). */
    snprintf(path, sizeof path, "%s/ca.key", nested);
    unlink(path);
    r = tls_certs_create(nested, NULL, 0, err, sizeof err);
    CHECK(r == 0 && access(path, F_OK) != 0, "no CA key needed %d '%s'", r, err);
    /* But a leaf cannot be issued without it... */
    snprintf(path, sizeof path, "%s/client.crt", nested);
    unlink(path);
    snprintf(path, sizeof path, "%s/client.key", nested);
    unlink(path);
    r = tls_certs_create(nested, NULL, 0, err, sizeof err);
    CHECK(r == -EEXIST && strstr(err, "ca.crt") && strstr(err, "ca.key"), "half CA %d '%s'", r,
          err);
    /* ...nor by a new CA beside leaves the old one signed. */
    snprintf(path, sizeof path, "%s/ca.crt", nested);
    unlink(path);
    r = tls_certs_create(nested, NULL, 0, err, sizeof err);
    CHECK(r == -EEXIST && strstr(err, "server.crt") && strstr(err, "CA"), "leaves without CA %d '%s'",
          r, err);
    /* force makes a new set. */
    CHECK(tls_certs_create(dir1, NULL, 1, err, sizeof err) == 0, "force: %s", err);
    CHECK(slurp(p1("ca.crt"), after, sizeof after) > 0 && strcmp(before, after), "ca.crt new");
    CHECK(access(p1("client.crt"), R_OK) == 0, "client.crt back");

    /* Bad host names are refused before anything is written. */
    char d3[128];
    snprintf(d3, sizeof d3, "%s/bad", dir2);
    r = tls_certs_create(d3, "ok.example,bad_name!", 0, err, sizeof err);
    CHECK(r == -EINVAL && strstr(err, "bad_name!"), "bad host %d '%s'", r, err);
    CHECK(access(d3, F_OK) != 0, "nothing made for a bad host");
    r = tls_certs_create(d3, "-x.example", 0, err, sizeof err);
    CHECK(r == -EINVAL, "leading hyphen %d", r);
    r = tls_certs_create("", NULL, 0, err, sizeof err);
    CHECK(r == -EINVAL && err[0], "no dir %d", r);
    /* No temporary files left behind: the directory holds the six files. */
    DIR *d = opendir(dir1);
    int files = 0, dots = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            *(e->d_name[0] == '.' ? &dots : &files) += 1;
    if (d)
        closedir(d);
    CHECK(files == 6 && dots == 0, "dir1 holds %d files and %d temporaries", files, dots);
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(p);
}

int main(void) {
    mbedtls_entropy_init(&entropy);
    mbedtls_ctr_drbg_init(&drbg);
    if (mbedtls_ctr_drbg_seed(&drbg, mbedtls_entropy_func, &entropy, NULL, 0)) {
        fprintf(stderr, "drbg seed failed\n");
        return 1;
    }
    snprintf(dir1, sizeof dir1, "/tmp/test_tls.XXXXXX");
    snprintf(dir2, sizeof dir2, "/tmp/test_tls.XXXXXX");
    if (!mkdtemp(dir1) || !mkdtemp(dir2)) {
        perror("mkdtemp");
        return 1;
    }
    /* mkdtemp made them; tls_certs_create must cope with a directory that exists. */
    chmod(dir1, 0700);
    int r = tls_certs_create(dir1, NULL, 0, err, sizeof err);
    CHECK(r == 0, "certs: %d %s", r, err);
    r = tls_certs_create(dir2, "kiln.local, 10.1.2.3", 0, err, sizeof err);
    CHECK(r == 0, "certs 2: %d %s", r, err);
    snprintf(crt1, sizeof crt1, "%s/server.crt", dir1);
    snprintf(key1, sizeof key1, "%s/server.key", dir1);
    snprintf(ca1, sizeof ca1, "%s/ca.crt", dir1);
    snprintf(ccrt1, sizeof ccrt1, "%s/client.crt", dir1);
    snprintf(ckey1, sizeof ckey1, "%s/client.key", dir1);
    snprintf(ccrt2, sizeof ccrt2, "%s/client.crt", dir2);
    snprintf(ckey2, sizeof ckey2, "%s/client.key", dir2);

    tls_server *s = server(crt1, key1, NULL, 0);
    CHECK(s, "server: %s", err);
    if (s) {
        test_basic(s);
        test_heap(s);
        test_tiny_pipe(s);
        test_tls12(s);
        test_reneg(s);
        test_garbage(s);
        test_groups(s, NULL, 0);
        test_post_handshake(s);
        test_key_update(s);
        tls_server_free(s);
    }
    test_mtls();
    test_server_errors();
    test_rsa();
    test_hosts();
    test_certs_files();

    nftw(dir1, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    nftw(dir2, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    mbedtls_ctr_drbg_free(&drbg);
    mbedtls_entropy_free(&entropy);
    return check_done("test_tls");
}
