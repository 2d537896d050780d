/* libkiln: the C client of the kiln line protocol (docs/PROTOCOL.md is the contract).
 *
 * A kiln_client holds connections_per_host TLS connections to each kilnd box of its
 * list (one, with one box and the default of 1). Each new request or verb goes to the
 * connection with the fewest requests in flight (ties in turn); one whose box said
 * GOAWAY gets none. Many generation requests can be in flight at once; their
 * TOK/END/ERR lines are dispatched to per-request callbacks while the caller "pumps"
 * the connections (kiln_pump, or inside any blocking call of this API).
 *
 * Threads: the library starts none and holds no locks of its own. A kiln_client must be
 * used by one thread at a time; different clients may run on different threads, since
 * the mbedTLS that scripts/deps.sh builds has MBEDTLS_THREADING_C (its process-wide PSA
 * crypto state is locked). Linked against an mbedTLS without it, use all clients from
 * one thread or serialise every kiln_* call with one lock. Callbacks run on the
 * calling thread, from inside kiln_pump / kiln_generate / the verb calls / kiln_close;
 * from a callback only kiln_submit and kiln_cancel may be called on the same client.
 *
 * Blocking: every call that waits is bounded. Connecting is bounded by connect_timeout_ms
 * per box (TCP connect, then TLS handshake + HELLO); any later wait for the server is
 * bounded by io_timeout_ms without a byte received (then KILN_ETIMEOUT and the
 * connection is dropped, because a late reply could no longer be matched to its
 * request). kiln_pump is additionally bounded by its own timeout_ms.
 *
 * Global state: only PSA crypto's once-per-process initialisation (psa_crypto_init,
 * idempotent, never undone), done by kiln_connect. Nothing else is shared between
 * clients. SIGPIPE is never raised (sends use MSG_NOSIGNAL).
 *
 * Strings given to the library are copied when it needs them after the call returns;
 * strings the library hands out are owned by it and valid as stated per call. */
#ifndef KILN_H
#define KILN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Public symbols; the library is built with -fvisibility=hidden. */
#define KILN_API __attribute__((visibility("default")))

/* ------------------------------------------------------------------ errors
 * A status is 0 (success), a protocol status as a positive number (the code of an ERR
 * line: 400, 401, 403, 404, 408, 409, 413, 429, 500, 501, 503), or one of the library's
 * negative codes below. */
enum {
    KILN_OK = 0,
    KILN_ECONNECT = -1, /* no box could be reached (TCP refused, unreachable, DNS) */
    KILN_ETLS = -2,     /* TLS handshake or record error; untrusted server certificate */
    KILN_ETIMEOUT = -3, /* connect_timeout_ms / io_timeout_ms elapsed */
    KILN_ECLOSED = -4,  /* the connection closed (or was dropped) under a request */
    KILN_EPROTO = -5,   /* the server sent something this library cannot understand */
    KILN_EINVAL = -6,   /* a bad argument (message says which) */
    KILN_ENOMEM = -7,   /* out of memory */
};

#define KILN_MSG_MAX 256
typedef struct {
    int code;                   /* as above; 0 when no error */
    char message[KILN_MSG_MAX]; /* for people: the server's msg, or the library's words */
} kiln_error;

/* A short static description of a code: "unauthorized", "TLS error", ... Never NULL. */
KILN_API const char *kiln_strerror(int code);

/* ------------------------------------------------------------------ options */
typedef struct {
    /* "host:port[,host:port...]": boxes tried in this order; the first that completes
     * TCP + TLS + HELLO is used. Port defaults to 8443; IPv6 literals as [::1]:8443. */
    const char *hosts;
    const char *token;   /* the HELLO token (required) */
    const char *ca_file; /* PEM CA file the server certificate must chain to (required) */
    /* Name checked against the server certificate's SAN/CN. NULL: the host part of
     * each box as written in hosts (an IP literal is matched against IP SANs). */
    const char *server_name;
    const char *cert_file; /* mTLS client certificate (PEM), or NULL */
    const char *key_file;  /* its key (PEM, unencrypted), or NULL; both or neither */
    int connect_timeout_ms; /* per box: TCP connect, and TLS handshake + HELLO. 5000 */
    int io_timeout_ms;      /* longest wait with no byte from the server. 30000 */
    int retries;       /* extra attempts: reconnect rounds, 503 retries, resends. 2 */
    int backoff_ms;    /* first backoff; doubles per attempt. 200 */
    int backoff_max_ms; /* cap of the backoff. 5000 */
    /* Called before each retry wait (503 or reconnect), for logging; may be NULL.
     * status: why (503, KILN_ECLOSED, ...); attempt: 1-based; delay_ms: the wait. */
    void (*on_retry)(void *ud, int status, int attempt, int delay_ms, const char *message);
    void *retry_ud;
    /* Connections to each box of hosts (1..64 in all): more let one balancer address
     * (HAProxy in TCP mode balances connections) reach several boxes. 1 (0 reads 1). */
    int connections_per_host;
} kiln_options;

/* Fills o with the defaults above (hosts, token, ca_file NULL). */
KILN_API void kiln_options_init(kiln_options *o);

/* ------------------------------------------------------------------ connection */
typedef struct kiln_client kiln_client;

/* Connects to the first box of o->hosts that answers: TCP (non-blocking connect + poll),
 * TLS 1.3/1.2 with the server verified against o->ca_file, then HELLO with the token.
 * Boxes that fail with a network error are skipped; when all failed that way, the list
 * is tried again after a backoff, up to o->retries more rounds. A 401 (wrong token) or
 * an untrusted certificate stops at once (KILN_ETLS message: "server certificate not
 * trusted: ..."). Blocks at most about rounds * boxes * connect_timeout_ms plus backoffs.
 * Then the other connections (boxes x connections_per_host, the k-th at box k modulo
 * the list) are opened, one try each; one that fails is tried again, at its box, after
 * 1 s doubling to 30 s, when a request is routed. With nothing usable left, a request
 * reconnects one connection with failover, as above.
 * Returns a client (free it with kiln_close), or NULL with *err set (err may be NULL).
 * o and its strings are copied. */
KILN_API kiln_client *kiln_connect(const kiln_options *o, kiln_error *err);

/* A raw byte stream instead of a session: the same connect (failover, retries, TLS
 * verified against o->ca_file, mTLS) but no HELLO, for speaking another protocol, such
 * as HTTP/1.1 to kilnd's OpenAI API or to another server. plain: TCP without TLS (an
 * http:// server; ca_file is then not needed); o->token is not used. It is a kiln_client
 * of exactly one connection (o->connections_per_host is not read; failover over hosts
 * still applies when it reconnects). Free with kiln_close (which sends nothing). The
 * kiln_gen/verb calls must not be used on it, and kiln_raw_* only on such a client
 * (KILN_EINVAL on one from kiln_connect). */
KILN_API kiln_client *kiln_raw_open(const kiln_options *o, int plain, kiln_error *err);
/* Writes all of buf, reconnecting first when the connection is down (after a hangup or
 * an error). Bounded by io_timeout_ms. 0, or a code (the connection is then dropped). */
KILN_API int kiln_raw_write(kiln_client *c, const void *buf, size_t len, kiln_error *err);
/* Up to cap bytes that arrived, waiting at most timeout_ms: > 0 bytes, 0 nothing in
 * time, < 0 a code (KILN_ECLOSED when the server closed; the connection is dropped). */
KILN_API long kiln_raw_read(kiln_client *c, void *buf, size_t cap, int timeout_ms,
                            kiln_error *err);
/* Closes the connection (the server said Connection: close); c stays usable. */
KILN_API void kiln_raw_hangup(kiln_client *c);

/* Sends QUIT (best effort, waiting at most 200 ms to write it), closes the connection
 * and frees c. Requests still in flight (or waiting for a retry) get on_end with
 * KILN_ECLOSED ("client closed") from inside this call. c may be NULL. */
KILN_API void kiln_close(kiln_client *c);

/* The HELLO reply of the connection the last request went to (the first one before
 * any). Strings are owned by c and valid until the next reconnect or kiln_close. */
KILN_API const char *kiln_model(const kiln_client *c);  /* model="..." */
KILN_API long kiln_ctx(const kiln_client *c);           /* ctx=N: prompt + output limit */
KILN_API long kiln_session(const kiln_client *c);       /* session=N */
KILN_API const char *kiln_role(const kiln_client *c);   /* "user" or "admin" */
KILN_API const char *kiln_server(const kiln_client *c); /* the box used: "host:port" */
/* 1 while a connection is up; 0 after all broke (the next call reconnects). */
KILN_API int kiln_connected(const kiln_client *c);

/* ------------------------------------------------------------------ requests */
/* One message of a conversation (kiln_gen.msgs). */
#define KILN_MAX_MSGS 256
typedef struct {
    const char *role;    /* "system" (first only), "user" or "assistant" */
    const char *content; /* UTF-8, NUL-terminated */
} kiln_msg;

/* The keys of GEN. Fill with kiln_gen_init, which marks every key "server default"
 * (not sent): ints -1, floats NAN, has_seed 0, system NULL, n_stops 0, msgs NULL. */
#define KILN_MAX_STOPS 4
typedef struct {
    const char *prompt; /* UTF-8, NUL-terminated; "" only with chat and system; NULL
                         * with msgs */
    const char *system; /* system message (needs chat=1), or NULL */
    int chat;           /* 0/1, or -1 */
    int max_tokens;     /* 0..1000000, or -1 */
    double temperature; /* 0..100 (0 greedy), or NAN */
    double top_p;       /* (0, 1], or NAN */
    int top_k;          /* 0..1000000, or -1 */
    double min_p;       /* 0..1, or NAN */
    double repeat_penalty;    /* (0, 10], or NAN */
    int repeat_last_n;        /* 0..1000000, or -1 */
    double presence_penalty;  /* -2..2, or NAN */
    double frequency_penalty; /* -2..2, or NAN */
    uint64_t seed;            /* sent only when has_seed; 0 = a random seed */
    int has_seed;
    int n;                    /* 1..8 samples, or -1 */
    const char *stops[KILN_MAX_STOPS]; /* 1..64 bytes each */
    int n_stops;
    int logprobs;   /* 0/1, or -1 */
    int ignore_eos; /* 0/1, or -1 */
    /* A conversation instead of prompt and system (both NULL then): msgs[0..n_msgs),
     * 1..KILN_MAX_MSGS, rendered by the server through the model's chat template (chat
     * is sent as 1; chat 0 is refused); a user message last. NULL: prompt. */
    const kiln_msg *msgs;
    int n_msgs;
} kiln_gen;

KILN_API void kiln_gen_init(kiln_gen *p);

/* What END reports. For a request that ended with an error, reason is "" and the
 * numbers are 0. */
typedef struct {
    char reason[16]; /* "stop", "length", "cancelled" */
    long prompt_tokens, completion_tokens, cached_tokens;
    double ttft_ms, tpot_ms, e2e_ms;
} kiln_usage;

/* One TOK: text[0..len) is UTF-8 (NUL-terminated too, valid only during the call).
 * sample is 0 unless n > 1. token_id is -1 and logprob 0 unless logprobs=1.
 * Return 0 to continue, nonzero to cancel the request (as kiln_cancel). */
typedef int (*kiln_on_token)(void *ud, const char *text, size_t len, int sample,
                             int token_id, double logprob);

/* The end of a sample (END, sample 0..n-1) or of the whole request (sample -1: an
 * error, or a cancel of a request that was waiting for a retry).
 * status: 0 for END (usage filled; usage->reason says why), else the ERR code
 * (e.g. 400, 413, 503 after the retries) or a library code (KILN_ECLOSED when the
 * connection broke, KILN_ETIMEOUT). message: the server's msg or the library's words,
 * "" when none; valid only during the call. With n > 1 the request is over after n
 * ENDs, or after one error; on_end is never called again for it after that. */
typedef void (*kiln_on_end)(void *ud, int sample, int status, const kiln_usage *usage,
                            const char *message);

typedef struct {
    kiln_on_token on_token; /* may be NULL */
    kiln_on_end on_end;     /* may be NULL */
} kiln_callbacks;

/* A request's handle: unique per client (never reused), 0 = none. */
typedef uint64_t kiln_req;

/* Sends a GEN for p (reconnecting first if the connection broke) and returns at once
 * without waiting for tokens: they arrive through cb during kiln_pump and the other
 * blocking calls. The request id on the wire is made by the library. p and its strings
 * are copied (the library keeps them to resend). An `ERR 503` that arrives before any
 * token is retried after its retry_after_ms (or the backoff), up to options.retries
 * times, then reported through on_end. Blocks only to write the line (io_timeout_ms)
 * and, when disconnected, to reconnect.
 * Returns the handle, or 0 with *err set (bad parameters: KILN_EINVAL; no callbacks
 * are called then). */
KILN_API kiln_req kiln_submit(kiln_client *c, const kiln_gen *p, const kiln_callbacks *cb,
                              void *ud, kiln_error *err);

/* Reads and dispatches server lines until nothing is in flight, or timeout_ms has
 * passed (timeout_ms < 0: no limit but the io timeout; 0: only what is already
 * readable). Also runs due 503 retries (reconnecting when needed). Returns the number
 * of requests still in flight (>= 0), or a negative code when a connection broke or
 * timed out, or no box could be reached for a retry: the requests lost have got on_end
 * by then, *err holds the reason (err may be NULL); kiln_pending tells what is left
 * (requests waiting for a retry), and the next call reconnects. */
KILN_API int kiln_pump(kiln_client *c, int timeout_ms, kiln_error *err);

/* Requests submitted and not over yet (on the server or waiting for a retry). */
KILN_API int kiln_pending(const kiln_client *c);

/* Sends CANCEL for the request; its END reason=cancelled (with the usage so far)
 * arrives later through on_end. A request waiting for a 503 retry ends at once (on_end
 * called from here, reason "cancelled"). 0, or KILN_EINVAL when h is not in flight,
 * or a write error code. Does not wait for the END. */
KILN_API int kiln_cancel(kiln_client *c, kiln_req h, kiln_error *err);

/* Blocking: kiln_submit + kiln_pump until this request is over (other requests in
 * flight on the same connection keep getting their callbacks meanwhile; those on the
 * client's other connections, at the next pump). Retries a 503 as kiln_submit does,
 * and, when the connection breaks before any token of this request was delivered,
 * reconnects (failover) and resends, within options.retries. on_token may be NULL.
 * *usage (may be NULL) gets the END's usage; with n > 1, completion_tokens is the sum
 * over samples and the rest is the last END's.
 * Returns 0 (END; usage->reason says which), else the status as for on_end, with *err
 * set (err may be NULL). A nonzero return from on_token cancels: the result is then 0
 * with reason "cancelled". */
KILN_API int kiln_generate(kiln_client *c, const kiln_gen *p, kiln_on_token on_token,
                           void *ud, kiln_usage *usage, kiln_error *err);

/* ------------------------------------------------------------------ verbs
 * Each sends one line and waits for its reply (bounded by io_timeout_ms), dispatching
 * TOK/END/ERR lines of requests in flight meanwhile. They reconnect first when the
 * connection broke. Return 0, or the ERR code / library code with *err set. */

typedef struct {
    int live, ready, level, running, waiting, draining;
} kiln_health_info;
KILN_API int kiln_health(kiln_client *c, kiln_health_info *h, kiln_error *err);

/* The STATS line as key=value strings (values as sent, NUL-terminated). */
#define KILN_STATS_MAX 32
typedef struct {
    int n;
    struct {
        char key[33];
        char value[64];
    } kv[KILN_STATS_MAX];
} kiln_stats_info;
KILN_API int kiln_stats(kiln_client *c, kiln_stats_info *s, kiln_error *err);
/* The value of key (a pointer into s), or NULL when absent. */
KILN_API const char *kiln_stats_get(const kiln_stats_info *s, const char *key);
/* The value of key as a number, or dflt when absent or not a number. */
KILN_API double kiln_stats_num(const kiln_stats_info *s, const char *key, double dflt);

/* METRICS: the Prometheus text, dot-unstuffed, lines ending in '\n', NUL-terminated.
 * Returns a malloc'd string the caller frees with free(), *len (may be NULL) its
 * length; NULL with *err set on failure. */
KILN_API char *kiln_metrics(kiln_client *c, size_t *len, kiln_error *err);

/* Any verb with a one-line reply (admin verbs: "LADDER level=3", "DRAIN", "DRAIN off",
 * "RELOAD", "CONFIG key=engine.max_seq_len", ...). line has no '\n'. The reply line
 * (without '\n') is copied into reply[0..cap) (truncated to cap-1 bytes, always
 * NUL-terminated; reply may be NULL with cap 0). Returns 0 when the reply is not an
 * ERR, else its code (403 for a user token, ...) with *err set (reply holds the ERR
 * line then too). GEN and CANCEL are refused (KILN_EINVAL): use kiln_submit and
 * kiln_cancel, whose replies are routed by id. */
KILN_API int kiln_command(kiln_client *c, const char *line, char *reply, size_t cap,
                          kiln_error *err);

/* UPDATE (admin; docs/PROTOCOL.md): streams the signed image bundle at path (kiln-image
 * sign's .kimg) into the box's inactive slot, to be tried `tries` times (1..9) once it
 * verifies; then REBOOT (kiln_command) boots it. on_progress (may be NULL) gets each
 * progress line's bytes and total. reply gets the last line ("OK update done slot=b
 * version=2 tries=3", or the ERR). Returns 0, the ERR's code (422: the bundle does not
 * verify or changed on the way; 409 another update runs; 403 ...) or a library code;
 * nothing is retried. Nothing else may be in flight on c. */
typedef void (*kiln_on_progress)(void *ud, uint64_t bytes, uint64_t total);
KILN_API int kiln_update(kiln_client *c, const char *path, int tries, kiln_on_progress on_progress,
                         void *ud, char *reply, size_t cap, kiln_error *err);

/* A verb whose reply is a multi-line body ending in "." ("CONFIG", "METRICS"): the body
 * dot-unstuffed as for kiln_metrics (malloc'd, caller frees). An ERR reply instead of a
 * body gives NULL with its code in *err. */
KILN_API char *kiln_command_body(kiln_client *c, const char *line, size_t *len,
                                 kiln_error *err);

#ifdef __cplusplus
}
#endif
#endif
