/* libkiln transport: TCP connect bounded by a deadline (non-blocking connect + poll),
 * the mbedTLS client (TLS 1.3 and 1.2 with AEAD suites only, the server verified
 * against the caller's CA and name, optional client certificate), and record I/O on
 * a non-blocking socket where every wait is a poll bounded by a deadline. Our own BIO
 * callbacks use send(MSG_NOSIGNAL) so a closed peer never raises SIGPIPE. A plain client
 * (kiln_raw_open's, for an http:// server) uses the same socket calls without TLS. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mbedtls/error.h>
#include <mbedtls/net_sockets.h> /* only for the MBEDTLS_ERR_NET_* codes */
#include <mbedtls/ssl_ciphersuites.h>
#include <psa/crypto.h>

#include "internal.h"

/* The same policy as the server (net/tls.c): AEAD only, TLS 1.3 first. Zero-ended;
 * suites this mbedTLS build lacks are dropped at init. */
static const int kl_want_suites[] = {
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

static void mbed_msg(int ret, char *buf, size_t cap) {
    mbedtls_strerror(ret, buf, cap);
}

/* mbedTLS's multi-line verify info as one line: "a; b". */
static void verify_text(uint32_t flags, char *buf, size_t cap) {
    char tmp[512];
    if (mbedtls_x509_crt_verify_info(tmp, sizeof tmp, "", flags) <= 0) {
        snprintf(buf, cap, "flags 0x%08x", (unsigned)flags);
        return;
    }
    size_t o = 0;
    for (const char *p = tmp; *p && o + 3 < cap; p++) {
        if (*p != '\n')
            buf[o++] = *p;
        else if (p[1]) {
            buf[o++] = ';';
            buf[o++] = ' ';
        }
    }
    buf[o] = '\0';
}

static int bio_send(void *ctx, const unsigned char *buf, size_t len) {
    kl_one *c = ctx;
    ssize_t n = send(c->fd, buf, len, MSG_NOSIGNAL);
    if (n >= 0)
        return (int)n;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
        return MBEDTLS_ERR_SSL_WANT_WRITE;
    return errno == EPIPE || errno == ECONNRESET ? MBEDTLS_ERR_NET_CONN_RESET
                                                 : MBEDTLS_ERR_NET_SEND_FAILED;
}

static int bio_recv(void *ctx, unsigned char *buf, size_t len) {
    kl_one *c = ctx;
    ssize_t n = recv(c->fd, buf, len, 0);
    if (n >= 0)
        return (int)n; /* 0: EOF, which mbedTLS reports as a closed connection */
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
        return MBEDTLS_ERR_SSL_WANT_READ;
    return errno == ECONNRESET ? MBEDTLS_ERR_NET_CONN_RESET : MBEDTLS_ERR_NET_RECV_FAILED;
}

/* Waits for fd to become ready for events until deadline: 1 ready, 0 deadline. */
static int wait_fd(int fd, short events, int64_t deadline_ms) {
    for (;;) {
        int64_t left = deadline_ms - kl_now_ms();
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, left > 1000000 ? 1000000 : (int)left);
        if (r > 0)
            return 1; /* errors and hangups too: the next call reports them */
        if (r < 0 && errno != EINTR)
            return 1;
    }
}

static int load_files(kl_one *c, kiln_error *err) {
    char m[128];
    int r = mbedtls_x509_crt_parse_file(&c->ca, c->o.ca_file);
    if (r) {
        mbed_msg(r, m, sizeof m);
        kl_err(err, KILN_EINVAL, "CA file %s: %s", c->o.ca_file, m);
        return KILN_EINVAL;
    }
    if (!c->o.cert_file)
        return 0;
    r = mbedtls_x509_crt_parse_file(&c->crt, c->o.cert_file);
    if (r) {
        mbed_msg(r, m, sizeof m);
        kl_err(err, KILN_EINVAL, "client certificate %s: %s", c->o.cert_file, m);
        return KILN_EINVAL;
    }
    r = mbedtls_pk_parse_keyfile(&c->key, c->o.key_file, NULL, mbedtls_ctr_drbg_random,
                                 &c->drbg);
    if (r) {
        mbed_msg(r, m, sizeof m);
        kl_err(err, KILN_EINVAL, "client key %s: %s", c->o.key_file, m);
        return KILN_EINVAL;
    }
    r = mbedtls_ssl_conf_own_cert(&c->conf, &c->crt, &c->key);
    if (r) {
        mbed_msg(r, m, sizeof m);
        kl_err(err, KILN_EINVAL, "client certificate and key: %s", m);
        return KILN_EINVAL;
    }
    return 0;
}

int kl_tls_init(kl_one *c, kiln_error *err) {
    char m[128];
    mbedtls_entropy_init(&c->entropy);
    mbedtls_ctr_drbg_init(&c->drbg);
    mbedtls_x509_crt_init(&c->ca);
    mbedtls_x509_crt_init(&c->crt);
    mbedtls_pk_init(&c->key);
    mbedtls_ssl_config_init(&c->conf);
    /* mbedTLS 3.x does its crypto through PSA, which must be initialised once per
     * process; the call is idempotent and never undone (others may share it). */
    if (psa_crypto_init() != PSA_SUCCESS) {
        kl_err(err, KILN_ETLS, "psa_crypto_init failed");
        return KILN_ETLS;
    }
    static const unsigned char pers[] = "libkiln";
    int r = mbedtls_ctr_drbg_seed(&c->drbg, mbedtls_entropy_func, &c->entropy, pers,
                                  sizeof pers - 1);
    if (!r)
        r = mbedtls_ssl_config_defaults(&c->conf, MBEDTLS_SSL_IS_CLIENT,
                                        MBEDTLS_SSL_TRANSPORT_STREAM,
                                        MBEDTLS_SSL_PRESET_DEFAULT);
    if (r) {
        mbed_msg(r, m, sizeof m);
        kl_err(err, KILN_ETLS, "TLS setup: %s", m);
        return KILN_ETLS;
    }
    /* mbedtls_ssl_conf_ciphersuites keeps the pointer: the list lives in c. */
    size_t n = 0;
    for (size_t i = 0; i < sizeof kl_want_suites / sizeof kl_want_suites[0] &&
                       n + 1 < sizeof c->suites / sizeof c->suites[0]; i++)
        if (mbedtls_ssl_ciphersuite_from_id(kl_want_suites[i]))
            c->suites[n++] = kl_want_suites[i];
    c->suites[n] = 0;
    mbedtls_ssl_conf_rng(&c->conf, mbedtls_ctr_drbg_random, &c->drbg);
    mbedtls_ssl_conf_min_tls_version(&c->conf, MBEDTLS_SSL_VERSION_TLS1_2);
    mbedtls_ssl_conf_max_tls_version(&c->conf, MBEDTLS_SSL_VERSION_TLS1_3);
    mbedtls_ssl_conf_ciphersuites(&c->conf, c->suites);
    mbedtls_ssl_conf_authmode(&c->conf, MBEDTLS_SSL_VERIFY_REQUIRED);
    return 0;
}

int kl_tls_init_files(kl_one *c, kiln_error *err) {
    int r = load_files(c, err);
    if (r)
        return r;
    mbedtls_ssl_conf_ca_chain(&c->conf, &c->ca, NULL);
    return 0;
}

void kl_tls_free(kl_one *c) {
    mbedtls_ssl_config_free(&c->conf);
    mbedtls_x509_crt_free(&c->ca);
    mbedtls_x509_crt_free(&c->crt);
    mbedtls_pk_free(&c->key);
    mbedtls_ctr_drbg_free(&c->drbg);
    mbedtls_entropy_free(&c->entropy);
}

/* One address: a non-blocking connect finished by poll. The fd, or a negative errno. */
static int tcp_try(const struct addrinfo *a, int64_t deadline_ms) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                    a->ai_protocol);
    if (fd < 0)
        return -errno;
    if (connect(fd, a->ai_addr, a->ai_addrlen) < 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        return -e;
    }
    if (!wait_fd(fd, POLLOUT, deadline_ms)) {
        close(fd);
        return -ETIMEDOUT;
    }
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
        soerr = errno;
    if (soerr) {
        close(fd);
        return -soerr;
    }
    /* Token lines are small and latency matters more than packet count. */
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* Every address of the box in turn, within the one deadline. The fd or a code. */
static int tcp_connect(const kl_box *b, int64_t deadline_ms, kiln_error *err) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    /* getaddrinfo cannot be bounded; numeric hosts resolve without any lookup. */
    int g = getaddrinfo(b->host, b->port, &hints, &res);
    if (g) {
        kl_err(err, KILN_ECONNECT, "%s: cannot resolve: %s", b->name, gai_strerror(g));
        return KILN_ECONNECT;
    }
    int e = ECONNREFUSED;
    for (const struct addrinfo *a = res; a; a = a->ai_next) {
        int fd = tcp_try(a, deadline_ms);
        if (fd >= 0) {
            freeaddrinfo(res);
            return fd;
        }
        e = -fd;
        if (e == ETIMEDOUT)
            break;
    }
    freeaddrinfo(res);
    if (e == ETIMEDOUT) {
        kl_err(err, KILN_ETIMEOUT, "%s: connect timed out", b->name);
        return KILN_ETIMEOUT;
    }
    kl_err(err, KILN_ECONNECT, "%s: connect: %s", b->name, strerror(e));
    return KILN_ECONNECT;
}

int kl_tcp_probe(const kl_box *b, int64_t deadline_ms, kiln_error *err) {
    int fd = tcp_connect(b, deadline_ms, err);
    if (fd < 0)
        return fd;
    close(fd);
    return 0;
}

/* The handshake failed with r: say why in words, with the verify info if it was the
 * certificate. */
static int handshake_error(kl_one *c, const kl_box *b, int r, kiln_error *err) {
    char m[200];
    if (r == MBEDTLS_ERR_X509_CERT_VERIFY_FAILED) {
        verify_text(mbedtls_ssl_get_verify_result(&c->ssl), m, sizeof m);
        kl_err(err, KILN_ETLS, "%s: server certificate not trusted: %s", b->name, m);
        return KILN_ETLS;
    }
    if (r == MBEDTLS_ERR_SSL_CONN_EOF || r == MBEDTLS_ERR_NET_CONN_RESET) {
        kl_err(err, KILN_ECLOSED, "%s: connection closed during the TLS handshake "
               "(a client certificate may be required)", b->name);
        return KILN_ECLOSED;
    }
    mbed_msg(r, m, sizeof m);
    kl_err(err, KILN_ETLS, "%s: TLS handshake failed: %s", b->name, m);
    return KILN_ETLS;
}

static int handshake(kl_one *c, const kl_box *b, int64_t deadline_ms,
                     kiln_error *err) {
    for (;;) {
        int r = mbedtls_ssl_handshake(&c->ssl);
        if (r == 0)
            return 0;
        short ev = r == MBEDTLS_ERR_SSL_WANT_READ    ? POLLIN
                   : r == MBEDTLS_ERR_SSL_WANT_WRITE ? POLLOUT
                                                     : 0;
        if (!ev)
            return handshake_error(c, b, r, err);
        if (!wait_fd(c->fd, ev, deadline_ms)) {
            kl_err(err, KILN_ETIMEOUT, "%s: TLS handshake timed out", b->name);
            return KILN_ETIMEOUT;
        }
    }
}

int kl_tls_open(kl_one *c, const kl_box *b, int64_t deadline_ms, kiln_error *err) {
    char m[128];
    int fd = tcp_connect(b, deadline_ms, err);
    if (fd < 0)
        return fd;
    c->fd = fd;
    if (c->plain) {
        kl_buf_reset(c);
        c->last_rx_ms = kl_now_ms();
        return 0;
    }
    mbedtls_ssl_init(&c->ssl);
    c->ssl_live = 1;
    const char *name = c->o.server_name ? c->o.server_name : b->host;
    int r = mbedtls_ssl_setup(&c->ssl, &c->conf);
    if (!r)
        r = mbedtls_ssl_set_hostname(&c->ssl, name);
    if (r) {
        mbed_msg(r, m, sizeof m);
        kl_err(err, KILN_ETLS, "%s: TLS setup: %s", b->name, m);
        kl_tls_close(c, 0);
        return KILN_ETLS;
    }
    mbedtls_ssl_set_bio(&c->ssl, c, bio_send, bio_recv, NULL);
    r = handshake(c, b, deadline_ms, err);
    if (r) {
        kl_tls_close(c, 0);
        return r;
    }
    kl_buf_reset(c);
    c->last_rx_ms = kl_now_ms();
    return 0;
}

void kl_tls_close(kl_one *c, int polite) {
    if (c->ssl_live) {
        /* close_notify is one small record: on a non-blocking socket it either goes
         * into the socket buffer at once or is given up. */
        if (polite)
            (void)mbedtls_ssl_close_notify(&c->ssl);
        mbedtls_ssl_free(&c->ssl);
        c->ssl_live = 0;
    }
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}

/* Room for one more read at the end of rbuf; consumed bytes are moved out first. */
static int buf_room(kl_one *c, size_t want, kiln_error *err) {
    if (c->rpos > 0) {
        memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
        c->rlen -= c->rpos;
        c->rpos = 0;
    }
    if (c->rcap - c->rlen >= want)
        return 0;
    size_t cap = c->rcap ? c->rcap : 16384;
    while (cap - c->rlen < want)
        cap *= 2;
    char *nb = realloc(c->rbuf, cap);
    if (!nb) {
        kl_err(err, KILN_ENOMEM, "out of memory for the receive buffer");
        return KILN_ENOMEM;
    }
    c->rbuf = nb;
    c->rcap = cap;
    return 0;
}

static int read_error(kl_one *c, int r, kiln_error *err) {
    char m[128];
    if (r == 0 || r == MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY || r == MBEDTLS_ERR_SSL_CONN_EOF ||
        r == MBEDTLS_ERR_NET_CONN_RESET) {
        if (c->conn_err) {
            kl_err(err, c->conn_err, "%s", c->conn_msg);
            return c->conn_err;
        }
        kl_err(err, KILN_ECLOSED, "%s closed the connection", c->server);
        return KILN_ECLOSED;
    }
    mbed_msg(r, m, sizeof m);
    kl_err(err, KILN_ETLS, "%s: TLS read: %s", c->server, m);
    return KILN_ETLS;
}

/* The plain twin of the TLS read loop below. */
static int plain_read(kl_one *c, int64_t deadline_ms, kiln_error *err) {
    for (;;) {
        ssize_t r = recv(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen, 0);
        if (r > 0) {
            c->rlen += (size_t)r;
            c->last_rx_ms = kl_now_ms();
            return (int)r;
        }
        if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return read_error(c, r == 0 || errno == ECONNRESET ? 0 : MBEDTLS_ERR_NET_RECV_FAILED,
                              err);
        if (!wait_fd(c->fd, POLLIN, deadline_ms))
            return 0;
    }
}

static int live(const kl_one *c, kiln_error *err) {
    if (c->ssl_live || (c->plain && c->fd >= 0))
        return 1;
    kl_err(err, KILN_ECLOSED, "not connected");
    return 0;
}

int kl_tls_read(kl_one *c, int64_t deadline_ms, kiln_error *err) {
    if (!live(c, err))
        return KILN_ECLOSED;
    int br = buf_room(c, 16384, err);
    if (br)
        return br;
    if (c->plain)
        return plain_read(c, deadline_ms, err);
    for (;;) {
        int r = mbedtls_ssl_read(&c->ssl, (unsigned char *)c->rbuf + c->rlen,
                                 c->rcap - c->rlen);
        if (r > 0) {
            c->rlen += (size_t)r;
            c->last_rx_ms = kl_now_ms();
            return r;
        }
        short ev = r == MBEDTLS_ERR_SSL_WANT_READ    ? POLLIN
                   : r == MBEDTLS_ERR_SSL_WANT_WRITE ? POLLOUT
                                                     : 0;
#ifdef MBEDTLS_ERR_SSL_RECEIVED_NEW_SESSION_TICKET
        if (r == MBEDTLS_ERR_SSL_RECEIVED_NEW_SESSION_TICKET)
            continue; /* TLS 1.3 housekeeping, not data */
#endif
        if (!ev)
            return read_error(c, r, err);
        if (!wait_fd(c->fd, ev, deadline_ms))
            return 0;
    }
}

/* The plain twin of the TLS write loop below. */
static int plain_write(kl_one *c, const char *buf, size_t len, int64_t deadline_ms,
                       kiln_error *err) {
    size_t off = 0;
    while (off < len) {
        ssize_t r = send(c->fd, buf + off, len - off, MSG_NOSIGNAL);
        if (r > 0) {
            off += (size_t)r;
            continue;
        }
        if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            kl_err(err, KILN_ECLOSED, "%s: connection lost while sending", c->server);
            return KILN_ECLOSED;
        }
        if (!wait_fd(c->fd, POLLOUT, deadline_ms)) {
            kl_err(err, KILN_ETIMEOUT, "%s: send timed out", c->server);
            return KILN_ETIMEOUT;
        }
    }
    return 0;
}

int kl_tls_write(kl_one *c, const char *buf, size_t len, int64_t deadline_ms,
                 kiln_error *err) {
    char m[128];
    if (!live(c, err))
        return KILN_ECLOSED;
    if (c->plain)
        return plain_write(c, buf, len, deadline_ms, err);
    size_t off = 0;
    while (off < len) {
        /* After WANT_*, mbedTLS expects the same call again: off only moves on
         * success, so the retry repeats it exactly. */
        int r = mbedtls_ssl_write(&c->ssl, (const unsigned char *)buf + off, len - off);
        if (r > 0) {
            off += (size_t)r;
            continue;
        }
        short ev = r == MBEDTLS_ERR_SSL_WANT_READ    ? POLLIN
                   : r == MBEDTLS_ERR_SSL_WANT_WRITE ? POLLOUT
                                                     : 0;
#ifdef MBEDTLS_ERR_SSL_RECEIVED_NEW_SESSION_TICKET
        if (r == MBEDTLS_ERR_SSL_RECEIVED_NEW_SESSION_TICKET)
            continue;
#endif
        if (!ev) {
            if (r == MBEDTLS_ERR_NET_CONN_RESET || r == MBEDTLS_ERR_NET_SEND_FAILED) {
                kl_err(err, KILN_ECLOSED, "%s: connection lost while sending", c->server);
                return KILN_ECLOSED;
            }
            mbed_msg(r, m, sizeof m);
            kl_err(err, KILN_ETLS, "%s: TLS write: %s", c->server, m);
            return KILN_ETLS;
        }
        if (!wait_fd(c->fd, ev, deadline_ms)) {
            kl_err(err, KILN_ETIMEOUT, "%s: send timed out", c->server);
            return KILN_ETIMEOUT;
        }
    }
    return 0;
}
