/* tls: the server side of TLS 1.3 and 1.2 (mbedTLS 3.6) over any byte stream.
 *
 * AEAD suites only (AES-GCM, ChaCha20-Poly1305; TLS 1.2 with ECDHE), key exchange over
 * X25519, P-256 or P-384 only (no finite-field DH: too slow for one loop), certificate and
 * key from PEM files, optional client certificates (mTLS) checked against a CA file.
 * A session does no I/O of its own: it reads and writes through the caller's BIO
 * (tls_bio), which returns -EAGAIN when the stream has nothing to give or no room, so
 * it runs on the cooperative loop over the lwIP raw API or a non-blocking socket
 * alike. Nothing here blocks.
 *
 * tls_certs_create writes a development CA and a server certificate signed by it, and
 * a client certificate for mTLS tests: enough for a first run (`kilnd certs`), not for
 * production. */
#ifndef KILN_TLS_H
#define KILN_TLS_H

#include <stddef.h>
#include <sys/types.h>

typedef struct tls_server tls_server;
typedef struct tls_conn tls_conn;

typedef struct {
    const char *cert;      /* PEM: the server certificate (chain) */
    const char *key;       /* PEM: its private key */
    const char *client_ca; /* PEM CA for client certificates; NULL or "": none asked */
    int require_client_cert; /* with client_ca: 1 = handshake fails without one,
                              * 0 = optional (verified when presented) */
} tls_config;

/* The byte stream under a session: read returns > 0 bytes, 0 at end of stream,
 * -EAGAIN when nothing is there yet, or another negative errno; write returns the
 * bytes taken (> 0), -EAGAIN when there is no room, or another negative errno. */
typedef struct {
    void *ctx;
    ssize_t (*read)(void *ctx, void *buf, size_t cap);
    ssize_t (*write)(void *ctx, const void *buf, size_t len);
} tls_bio;

/* Loads and checks the files (the key must match the certificate). NULL with err set. */
tls_server *tls_server_new(const tls_config *cfg, char *err, size_t errlen);
void tls_server_free(tls_server *s);

/* Sessions' memory from an arena: on the calling thread (the loop's), tls_conn_new and
 * everything mbedTLS allocates for them from then on (record buffers, handshake state;
 * PSA's global key store is grown first, from libc, for `sessions` at once) come from
 * h, so a full heap fails tls_conn_new or the handshake cleanly; other threads keep
 * libc's malloc. Memory of h is recognised when freed, on this thread, whatever the
 * order. h NULL: back to malloc (before h goes; blocks of it freed later are dropped).
 * Call it once the server's own objects (certificate, key, config) are loaded. */
struct mm_heap; /* mm/heap.h */
void tls_use_heap(struct mm_heap *h, int sessions); /* sessions: how many at once, at most */

/* A session for one accepted connection. NULL with err set (out of memory). */
tls_conn *tls_conn_new(tls_server *s, const tls_bio *bio, char *err, size_t errlen);
void tls_conn_free(tls_conn *t);

/* 1 handshake complete, 0 in progress (call again when the stream is readable or
 * writable), negative on failure (tls_error says why: not TLS, no shared suite, bad
 * client certificate, ...). */
int tls_handshake(tls_conn *t);
/* Plaintext: > 0 bytes, 0 the peer closed (close_notify or EOF), -EAGAIN nothing
 * decrypted yet, or negative on failure. Call until -EAGAIN: decrypted bytes may be
 * waiting inside the session with nothing new on the stream. */
ssize_t tls_read(tls_conn *t, void *buf, size_t cap);
/* Plaintext bytes taken (> 0), -EAGAIN, or negative on failure. After -EAGAIN, call
 * again with the same buf (at least as many bytes as before): mbedTLS resumes the
 * record it started, and tls_write passes it exactly what it was given then. */
ssize_t tls_write(tls_conn *t, const void *buf, size_t len);
/* Sends close_notify: 1 sent, 0 again later (-EAGAIN underneath), negative on error. */
int tls_close_notify(tls_conn *t);

const char *tls_error(const tls_conn *t);      /* the last failure, one line */
/* 1 when the session failed and told the peer why by a fatal alert now on the stream
 * (e.g. a malformed TLS 1.3 KeyUpdate): close gracefully rather than reset, or the
 * peer may never read the alert. */
int tls_alerted(const tls_conn *t);
/* TLS 1.3 KeyUpdates (RFC 8446 §4.6.3) so far: the count received from the client;
 * *sent (if not NULL): ours, each the answer to a client's update_requested. */
unsigned tls_key_updates(const tls_conn *t, unsigned *sent);
const char *tls_version(const tls_conn *t);    /* "TLSv1.3", after the handshake */
const char *tls_suite(const tls_conn *t);      /* the ciphersuite name */
/* The application protocol ALPN agreed on ("http/1.1" or "kiln/1", the server's two),
 * or NULL when the client offered none. */
const char *tls_alpn(const tls_conn *t);
/* After a handshake that failed because the stream is not TLS: its first bytes (up to
 * cap, at most 16) and their count, so the caller can answer a plaintext client in its
 * own terms; 0 when the stream was TLS. */
size_t tls_plain_head(const tls_conn *t, char *buf, size_t cap);
/* The verified client certificate's subject CN: its length, -ENOENT without one. */
int tls_peer_cn(const tls_conn *t, char *buf, size_t cap);

/* Development certificates in dir (created if missing, mode 0700; keys 0600):
 * ca.crt ca.key (EC P-256, 10 years), server.crt server.key (CN kiln, SAN: localhost,
 * 127.0.0.1, ::1 and each name or IPv4 in the comma-separated `hosts`), client.crt
 * client.key (CN kiln-client, clientAuth). Existing files are kept unless force.
 * 0 or a negative errno with err set. */
int tls_certs_create(const char *dir, const char *hosts, int force, char *err,
                     size_t errlen);

#endif
