/* server: kilnd serving the line protocol (docs/PROTOCOL.md), the OpenAI API and HTTP /metrics.
 *
 * One cooperative loop carries everything: the transport (net.h) hands bytes to a
 * session, TLS (tls.h) decrypts them, a line becomes a request (proto.h) that the
 * engine schedules; each token the engine streams becomes a TOK line in the session's
 * output buffer, flushed through TLS as the transport takes it. A session's unsent
 * output is bounded: past [net] max_output_bytes its requests pause (eng_pause) until
 * the client reads, so a slow reader costs memory for its own bounded buffer only.
 * A disconnect cancels its requests; their KV blocks return to the pool.
 *
 * The server owns the engine (created over the caller's model, tokenizer, KV pool and
 * backend); the driver (sched/drive.h) runs it on the loop and ticks the degrade ladder.
 * The same TLS port speaks HTTP/1.1 with the OpenAI-compatible API to clients that ask
 * for it by ALPN (http/1.1) or start with an HTTP method: a generation there is a GEN in
 * another framing, through the same admission, engine and metrics.
 *
 * The server's files: server.c (setup, health, stats, metrics, the sweep), srv_sess.c
 * (tokens, output, connections, telling the protocols apart, line input), srv_verbs.c
 * (the verb table), srv_gen.c (the submit path, GEN, CANCEL), srv_api.c (HTTP and the
 * OpenAI API), srv_update.c (UPDATE, REBOOT), srv_fault.c (FAULT), srv_debug.c (DEBUG), srv_http.c (the
 * metrics_port listener); srv_int.h is their private header. */
#ifndef KILN_SERVER_H
#define KILN_SERVER_H

#include <stddef.h>

#include "core/backend.h"
#include "core/config.h"
#include "core/model.h"
#include "core/tokenizer.h"
#include "mm/kv.h"
#include "net/net.h"
#include "net/proto.h"
#include "sched/loop.h"

typedef struct srv srv;

typedef struct {
    const kiln_config *cfg;
    loop_t *loop;
    net_stack *net;
    const model *m;
    const tok_t *tok;
    kv_pool *kv;
    backend *be;
    const char *model_name;
    int max_seq_len; /* in force: the config's, capped by the model's context */
    int faults;      /* allow the admin verb FAULT (tests: kilnd serve --faults) */
    const char *update_slot; /* "b:/dev/vda3": the slot UPDATE writes (kiln-init says); NULL none */
    const char *version;     /* kilnd's, for kiln_build_info; NULL: "unknown" */
    const char *backend_note; /* why this backend, when not the one asked for ("no GPU (...)"); NULL: none */
} srv_env;

/* Loads the TLS files and the tokens file, creates the engine, registers the
 * listeners ([net] listen, metrics_port) and the backend's event fd. NULL with err. */
srv *srv_new(const srv_env *env, char *err, size_t errlen);
/* Cancels what runs (waiting for a step in flight), closes every connection. */
void srv_free(srv *s);

/* One log line on stderr at level (CFG_LOG_*; dropped above [log] level), timestamped as
 * every line of the server's is: for kilnd's own messages about the server it runs. */
void srv_log(const srv *s, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Stop taking requests; once none is left, stop the loop. restart: the exit asks the
 * supervisor for a restart (srv_exit_code 75) rather than a stop (0). */
void srv_drain(srv *s, int restart);
int srv_exit_code(const srv *s);
/* A step overran [engine] step_timeout_ms: clients were told `ERR id 503 restarting`
 * and the loop stopped; the backend may never return, so the caller must not wait for
 * it (no srv_free): flush the network briefly and _exit(srv_exit_code). */
int srv_hung(const srv *s);

/* For the control socket (net/ctl.h) and the protocol's verbs alike. The HEALTH and
 * STATS lines (docs/PROTOCOL.md) without a newline; snprintf's result. */
int srv_health(const srv *s, char *out, size_t cap);
int srv_stats(const srv *s, char *out, size_t cap);
/* "section.name": 0, -EINVAL (malformed), -ENOENT (no such key). */
int srv_config_get(const srv *s, const char *key, char *out, size_t cap);
/* Checked like the config file. Request defaults and per-connection limits apply at
 * once (0); keys that shape what was set up at start give -EAGAIN (err says so), bad
 * values -EINVAL. */
int srv_config_set(srv *s, const char *key, const char *value, char *err, size_t errlen);
void srv_set_draining(srv *s, int on);
/* What RELOAD does: re-read [net] tokens_file. The number of tokens, or -1 with err (the
 * tokens in force stay). */
int srv_reload(srv *s, char *err, size_t errlen);
int srv_is_ready(const srv *s);
double srv_loop_max_ms(const srv *s); /* the longest event-loop pass of the last 10-20 s */
long long srv_served(const srv *s); /* samples finished by stop or length since start */
double srv_uptime_s(const srv *s);
const char *srv_model_name(const srv *s);
const char *srv_backend_name(const srv *s);
const char *srv_backend_note(const srv *s); /* "" when the backend is the one asked for */

/* DEBUG (docs/PROTOCOL.md): the diagnostics an admin may run while the debug window is
 * open (at most an hour, opened and closed by DEBUG open / close; every use is logged).
 * The answer goes to io: a line (the window's state, a probe), a body (net, kmsg, gpu:
 * lines ending in \n) or an error. */
typedef struct {
    void (*line)(void *ud, const char *text);
    void (*body)(void *ud, const char *text, size_t len);
    void (*err)(void *ud, int code, const char *slug, const char *msg);
    void (*done)(void *ud); /* after an answer that came later; NULL: nothing to do */
    void *ud;
} srv_debug_io;
/* l: a DEBUG line (proto_split); who: the caller in the log ("session 3 (1.2.3.4:5)",
 * "console"). 0: answered. 1: the answer comes later through io, from the loop (a
 * probe), unless srv_debug_forget(s, io->ud) is called first: the caller then keeps io's
 * ud valid until the answer or the forget. */
int srv_debug(srv *s, const proto_line *l, const char *who, const srv_debug_io *io);
void srv_debug_forget(srv *s, void *ud);

/* kiln-init, through the control socket: fn sends it one line ("ASK ...", boot/initctl.h) and
 * returns how many listeners got it. The network update and REBOOT need one. */
typedef int (*srv_notify_fn)(void *ud, const char *line);
void srv_set_notify(srv *s, srv_notify_fn fn, void *ud);
/* kiln-init's answer to an ASK of the update ("update ready|done|refused <slot> ..."):
 * 0, or -ENOENT when no update waits for it. */
int srv_update_answer(srv *s, const char *line);

#endif
