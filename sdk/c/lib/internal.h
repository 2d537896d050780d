/* libkiln internals shared by the files of sdk/c/lib; not installed, not part of the API.
 *
 * Split: tls.c (TCP connect with timeout, TLS setup/handshake, record I/O with
 * deadlines), lines.c (the line buffer, time, errors, backoff), client.c (options,
 * connect/failover/HELLO, close, accessors), request.c (GEN, TOK/END/ERR dispatch,
 * pump, cancel, retries, generate), verbs.c (HEALTH, STATS, METRICS, admin commands):
 * raw.c (kiln_raw_open's byte streams): all of one connection, a kl_one. pool.c is the
 * kiln_client of the API: several kl_one (boxes x connections_per_host) and the routing
 * of each call to one of them; a raw client is a pool of exactly one raw kl_one. */
#ifndef KILN_SDK_INTERNAL_H
#define KILN_SDK_INTERNAL_H

#include <stdint.h>

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>
#include <mbedtls/pk.h>
#include <mbedtls/ssl.h>
#include <mbedtls/x509_crt.h>

#include "kiln.h"
#include "net/proto.h"

/* The server reads lines up to [net] max_line_bytes (1 MiB by default) and writes far
 * shorter ones; a server line longer than this is treated as a protocol error so that
 * a broken or hostile server cannot make us buffer without bound. */
#define KL_LINE_MAX ((size_t)(1u << 20) + 4096)
/* Largest multi-line body (METRICS, CONFIG) we accept. */
#define KL_BODY_MAX ((size_t)64 << 20)
#define KL_DEFAULT_PORT "8443"

/* One connection (with failover over the box list) and the requests on it: what a
 * kiln_client was before it balanced. pool.c makes a kiln_client of one or more. */
typedef struct kl_one kl_one;

typedef struct {
    char host[256]; /* without brackets for IPv6 literals */
    char port[8];
    char name[272]; /* "host:port" as written, for messages and kiln_server */
} kl_box;

enum { KL_SENT = 1, KL_WAIT_RETRY = 2 };

/* One request of kiln_submit, alive until its last END or its error. */
typedef struct kl_req {
    struct kl_req *next;
    kiln_req h;         /* the caller's handle */
    char id[24];        /* id of the current attempt on the wire: "k<n>" */
    char *args;         /* the GEN line after "GEN id=...", without '\n' (owned) */
    size_t args_len;
    kiln_callbacks cb;
    void *ud;
    int state;          /* KL_SENT or KL_WAIT_RETRY */
    int64_t due_ms;     /* KL_WAIT_RETRY: when to send again */
    int attempts;       /* retries used so far */
    int delivered;      /* TOK lines delivered: no transparent retry after one */
    int samples, ended; /* n, and ENDs seen */
    int cancelled;      /* cancel asked: CANCEL sent, further TOKs not delivered */
    int retry_on_close; /* kiln_generate's: resend after a reconnect */
} kl_req;

struct kl_one {
    kiln_options o; /* string members point at the copies below */
    char *s_hosts, *s_token, *s_ca, *s_name, *s_crt, *s_key;
    kl_box *boxes;
    int n_boxes;

    /* TLS material, loaded once per client and reused by every reconnect */
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg;
    mbedtls_x509_crt ca, crt;
    mbedtls_pk_context key;
    mbedtls_ssl_config conf;
    int suites[16]; /* zero-ended, referenced by conf */

    /* the connection */
    int fd;            /* -1 when none */
    int ssl_live;      /* ssl was set up and must be freed */
    mbedtls_ssl_context ssl;
    int up;            /* connected (HELLO done) and not broken */
    int broken;        /* a write or read failed: drop at the next safe point */
    kiln_error broke;  /* why */
    char *rbuf;        /* bytes received, rbuf[rpos..rlen) not yet consumed */
    size_t rpos, rlen, rcap;
    int64_t last_rx_ms;

    /* the HELLO reply */
    char model[256], role[16], server[272];
    long ctx, session;

    /* a session-level "ERR - code" (408, 413, 503 ...), blamed for a close that follows */
    int conn_err;
    char conn_msg[KILN_MSG_MAX];

    /* "GOAWAY" (the box is draining): once nothing sent waits for an answer, the
     * connection is closed and the next one starts at the box after it */
    int box_i;         /* the box connected to */
    int home_box;      /* the box kl1_reconnect_home dials (pool.c spreads them) */
    int first_box;     /* where the next connect starts in the list */
    int going_away;

    kl_req *reqs;
    uint64_t next_h, next_wire;

    /* kiln_raw_open: a byte stream for another protocol (HTTP): no HELLO, and with
     * plain no TLS either (fd alone) */
    int raw, plain;
};

/* The kiln_* calls of one connection (client.c, request.c, verbs.c); pool.c routes the
 * public ones to them. */
/* A connection, not connected yet, whose home is box `home` of the list. */
kl_one *kl1_new(const kiln_options *o, int home, kiln_error *err);
/* A raw connection (kiln_raw_open's): no HELLO, so no token; plain: TCP without TLS, so
 * no CA either. Not connected yet; kl1_reconnect connects it (failover, rounds). */
kl_one *kl1_new_raw(const kiln_options *o, int plain, kiln_error *err);
/* Connect when down: failover over the list from where it stands, with rounds (as
 * every call does by itself). 0 or a code. */
int kl1_reconnect(kl_one *c, kiln_error *err);
/* Connect when down, to its home box only, once. 0 or a code. */
int kl1_reconnect_home(kl_one *c, kiln_error *err);
/* 1 when up on a box that is not its home (it failed over there). */
int kl1_away(const kl_one *c);
/* Up away from home and idle: when the home box takes a TCP connection again, move
 * back to it (the away connection is closed first). 0 once home, a code otherwise
 * (still away when the home box refused; down when it accepted but then failed). */
int kl1_go_home(kl_one *c, kiln_error *err);
/* Close it when its box said GOAWAY and nothing (not even a retry) waits on it. */
void kl1_drop_idle_draining(kl_one *c);
int kl1_n_boxes(const kl_one *c);
void kl1_close(kl_one *c);
const char *kl1_model(const kl_one *c);
long kl1_ctx(const kl_one *c);
long kl1_session(const kl_one *c);
const char *kl1_role(const kl_one *c);
const char *kl1_server(const kl_one *c);
int kl1_connected(const kl_one *c);
/* 1 when the box said GOAWAY (no new requests should go there). */
int kl1_going_away(const kl_one *c);
/* 1 when a read or write failed and the connection awaits its teardown. */
int kl1_broken(const kl_one *c);
/* The socket to poll for the next line, -1 when down. kl1_pump(c, 0) reads all that
 * has arrived, so a poll after it sees only what is new. */
int kl1_fd(const kl_one *c);
kiln_req kl1_submit(kl_one *c, const kiln_gen *p, const kiln_callbacks *cb, void *ud,
                    kiln_error *err);
int kl1_pump(kl_one *c, int timeout_ms, kiln_error *err);
int kl1_pending(const kl_one *c);
int kl1_cancel(kl_one *c, kiln_req h, kiln_error *err);
int kl1_generate(kl_one *c, const kiln_gen *p, kiln_on_token on_token, void *ud,
                 kiln_usage *usage, kiln_error *err);
int kl1_health(kl_one *c, kiln_health_info *h, kiln_error *err);
int kl1_stats(kl_one *c, kiln_stats_info *s, kiln_error *err);
char *kl1_metrics(kl_one *c, size_t *len, kiln_error *err);
int kl1_command(kl_one *c, const char *line, char *reply, size_t cap, kiln_error *err);
char *kl1_command_body(kl_one *c, const char *line, size_t *len, kiln_error *err);
int kl1_update(kl_one *c, const char *path, int tries, kiln_on_progress on_progress, void *ud,
               char *reply, size_t cap, kiln_error *err);
/* raw.c: kiln_raw_write/read/hangup on the pool's one connection (EINVAL unless raw). */
int kl1_raw_write(kl_one *c, const void *buf, size_t len, kiln_error *err);
long kl1_raw_read(kl_one *c, void *buf, size_t cap, int timeout_ms, kiln_error *err);
void kl1_raw_hangup(kl_one *c);

/* lines.c */
int64_t kl_now_ms(void);
void kl_err(kiln_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int kl_backoff_ms(const kl_one *c, int attempt);
void kl_sleep_ms(int ms);
/* The next server line: 1 with *line (NUL-terminated, '\r' stripped, valid until the
 * next read) and *len; 0 when deadline_ms passed first; < 0 a library code (err set). */
int kl_line(kl_one *c, int64_t deadline_ms, char **line, size_t *len, kiln_error *err);
void kl_buf_reset(kl_one *c);
/* Write a whole line (adds '\n'); marks the connection broken on failure. */
int kl_send_line(kl_one *c, const char *s, size_t len, kiln_error *err);

/* tls.c */
/* Contexts, RNG and the config (before the options are known), then the files. */
int kl_tls_init(kl_one *c, kiln_error *err);
int kl_tls_init_files(kl_one *c, kiln_error *err);
void kl_tls_free(kl_one *c);
int kl_tls_open(kl_one *c, const kl_box *b, int64_t deadline_ms, kiln_error *err);
void kl_tls_close(kl_one *c, int polite);
/* 0 when box b accepts a TCP connection before the deadline (closed at once), else a code. */
int kl_tcp_probe(const kl_box *b, int64_t deadline_ms, kiln_error *err);
/* Append what arrives to rbuf: > 0 bytes, 0 deadline passed, < 0 code (err set). */
int kl_tls_read(kl_one *c, int64_t deadline_ms, kiln_error *err);
int kl_tls_write(kl_one *c, const char *buf, size_t len, int64_t deadline_ms,
                 kiln_error *err);

/* client.c */
/* Connect (failover over the boxes, rounds with backoff) when not up. 0 or a code. */
int kl_ensure(kl_one *c, kiln_error *err);
/* "ERR <id> <code> <slug> [msg=...]" into err: the code, or KILN_EPROTO. */
int kl_err_line(const proto_line *l, kiln_error *err);
/* Tear the connection down and end (or reschedule) the requests on it. */
void kl_drop(kl_one *c, int code, const char *msg);

/* request.c */
/* Route one server line: 1 it was a request's line (dispatched), 0 it was not (left
 * untouched for a verb's reply). */
int kl_dispatch(kl_one *c, char *line, size_t len);
/* Read what is already there without waiting; drop the connection if it broke. */
void kl_drain(kl_one *c);
/* End every request with code (final: all; else kiln_generate's unsent-to requests
 * may be rescheduled for a resend after a reconnect). */
void kl_fail_all(kl_one *c, int code, const char *msg, int final);
int kl_in_flight(const kl_one *c, int sent_only);

#endif
