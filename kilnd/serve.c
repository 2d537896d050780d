/* serve: `kilnd serve` (the appliance's main job) and `kilnd check-config`.
 *
 *   kilnd serve [--config kiln.ini] [--model PATH] [--threads N] [--set section.key=value]...
 *               [--control PATH]       (the control socket for kiln-init: net/ctl.h)
 *               [--faults]             (tests: the admin verb FAULT)
 *               [--update-slot S:PATH] (kiln-init: the inactive slot S and its partition,
 *                                       which the admin verb UPDATE writes; net/update.h)
 *   kilnd check-config [the same flags]   (exit 0, or 1 with one line saying what is wrong)
 *
 * serve loads the model, carves the KV pool, starts the CPU backend, brings up the
 * transport ([net] driver) and the server, prints one line "kilnd: serving ..." on
 * stdout once it accepts connections, and runs the loop until SIGTERM/SIGINT (drain:
 * running requests finish, a second signal stops at once) or an admin's RESTART
 * (exit status 75, for the supervisor). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/config.h"
#include "core/cpu/isa.h"
#include "core/model.h"
#include "core/prompt.h"
#include "core/tokenizer.h"
#include "mm/kv.h"
#include "mm/pool.h"
#include "net/net.h"
#include "net/ctl.h"
#include "net/server.h"
#include "net/tls.h"
#include "sched/loop.h"
#include "kilnd/kilnd.h"

static int g_faults; /* --faults: the admin verb FAULT (tests) */
static const char *g_update_slot; /* --update-slot b:/dev/vda3 (kiln-init) */

static int parse(int argc, char **argv, kiln_config *c, int *threads, const char **control) {
    char err[512];
    cfg_defaults(c);
    *threads = 0;
    *control = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--faults")) { g_faults = 1; continue; }
        if (!v) { fprintf(stderr, "kilnd: %s needs a value\n", a); return -1; }
        i++;
        if (!strcmp(a, "--control")) {
            *control = v;
        } else if (!strcmp(a, "--update-slot")) {
            g_update_slot = v;
        } else if (!strcmp(a, "--config")) {
            if (cfg_load_file(c, v, err, sizeof err) < 0) { fprintf(stderr, "kilnd: %s\n", err); return -1; }
        } else if (!strcmp(a, "--model")) {
            if (cfg_set(c, "model", "path", v, err, sizeof err) < 0) { fprintf(stderr, "kilnd: %s\n", err); return -1; }
        } else if (!strcmp(a, "--threads")) {
            if (cfg_set(c, "engine", "threads", v, err, sizeof err) < 0) { fprintf(stderr, "kilnd: %s\n", err); return -1; }
        } else if (!strcmp(a, "--set")) {
            char sec[32];
            const char *dot = strchr(v, '.'), *eq = strchr(v, '=');
            if (!dot || !eq || dot > eq || (size_t)(dot - v) >= sizeof sec) {
                fprintf(stderr, "kilnd: --set wants section.key=value, not '%s'\n", v);
                return -1;
            }
            char key[64];
            if ((size_t)(eq - dot - 1) >= sizeof key) { fprintf(stderr, "kilnd: --set: key too long\n"); return -1; }
            memcpy(sec, v, (size_t)(dot - v)), sec[dot - v] = 0;
            memcpy(key, dot + 1, (size_t)(eq - dot - 1)), key[eq - dot - 1] = 0;
            if (cfg_set(c, sec, key, eq + 1, err, sizeof err) < 0) { fprintf(stderr, "kilnd: --set: %s\n", err); return -1; }
        } else {
            fprintf(stderr, "kilnd: unknown flag '%s'\n", a);
            return -1;
        }
    }
    if (cfg_validate(c, err, sizeof err) < 0) { fprintf(stderr, "kilnd: %s\n", err); return -1; }
    *threads = c->engine.threads > 0 ? c->engine.threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (*threads < 1) *threads = 1;
    return 0;
}

/* The name the box serves under: [model] served_model_name, else the model's own name
 * (general.name), else the file's base name. */
static void model_name(const kiln_config *c, const model *m, char *out, size_t cap) {
    const char *path = c->model.path;
    gguf_str s;
    if (c->model.served_model_name[0]) {
        snprintf(out, cap, "%.*s", CFG_NAME_MAX, c->model.served_model_name); /* cfg checked it */
        return;
    }
    if (gguf_get_str(&m->gguf, "general.name", &s) == 0 && s.len > 0) {
        snprintf(out, cap, "%.*s", (int)(s.len < cap ? s.len : cap - 1), s.ptr);
        return;
    }
    const char *b = strrchr(path, '/');
    snprintf(out, cap, "%.200s", b ? b + 1 : path);
}

/* SIGTERM/SIGINT through a signalfd on the loop: the first drains, the second stops.
 * SIGHUP reloads, as the admin verb RELOAD does, plus the log level. */
typedef struct {
    srv *s;
    loop_t *l;
    int fd, count;
    int argc;
    char **argv; /* serve's own, parsed again on SIGHUP */
} sig_watch;

static int parse(int argc, char **argv, kiln_config *c, int *threads, const char **control);

/* SIGHUP: the tokens file again, and [log] level from the command line and config file
 * read afresh (parse reports what is wrong with them; the running settings then stay). */
static void on_sighup(sig_watch *w) {
    static kiln_config nc;
    int threads;
    const char *control;
    char err[256], level[32];
    srv_log(w->s, CFG_LOG_INFO, "SIGHUP: reloading the tokens and the log level");
    srv_reload(w->s, err, sizeof err);
    if (parse(w->argc, w->argv, &nc, &threads, &control) < 0) return;
    if (cfg_get(&nc, "log", "level", level, sizeof level) >= 0 &&
        srv_config_set(w->s, "log.level", level, err, sizeof err) < 0)
        srv_log(w->s, CFG_LOG_WARN, "SIGHUP: log.level: %s", err);
}

static void on_signal(loop_t *l, int fd, void *ud, int mask) {
    (void)mask;
    sig_watch *w = ud;
    struct signalfd_siginfo si;
    while (read(fd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGHUP) {
            on_sighup(w);
        } else if (w->count++ == 0) {
            srv_log(w->s, CFG_LOG_INFO, "signal %u: draining (again to stop now)", si.ssi_signo);
            srv_drain(w->s, 0);
        } else {
            loop_stop(l);
        }
    }
}

int kd_serve(int argc, char **argv) {
    static kiln_config c;
    int threads;
    const char *control;
    if (parse(argc, argv, &c, &threads, &control) < 0) return 2;
    /* Blocked before any thread starts (the backend's workers inherit the mask), so
     * the signals reach only the signalfd. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM), sigaddset(&set, SIGINT), sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    char err[512];
    static model m;
    static tok_t tok;
    if (model_load(&m, c.model.path, err, sizeof err) < 0) { fprintf(stderr, "kilnd: %s\n", err); return 1; }
    int rc = 1, tok_ok = 0, kv_ok = 0;
    mm_pool arena = {0};
    kv_pool kv;
    backend *be = NULL;
    loop_t *l = NULL;
    net_stack *net = NULL;
    srv *s = NULL;
    ctl *ctl = NULL;
    sig_watch sw = {0};
    sw.fd = -1;
    if (tok_init_gguf(&tok, &m.gguf, err, sizeof err) < 0) { fprintf(stderr, "kilnd: tokenizer: %s\n", err); goto out; }
    tok_ok = 1;

    /* the KV pool: [engine] kv_pool_mb, or room for max_batch_size full sequences */
    kv_config kc = {0};
    model_kv_shape(&m, &kc);
    kc.block_size = c.engine.block_size;
    kc.n_blocks = kc.max_seqs = kc.max_blocks_per_seq = 1; /* for kv_block_bytes' checks */
    size_t block_bytes = kv_block_bytes(&kc), pool_bytes = 0;
    if (cfg_check_model(&c, m.cfg.n_ctx_train, block_bytes / (size_t)kc.block_size, &pool_bytes, err,
                        sizeof err) < 0) {
        fprintf(stderr, "kilnd: %s\n", err);
        goto out;
    }
    int max_seq_len = c.engine.max_seq_len;
    model_set_context(&m, max_seq_len); /* before the backend's state: LongRoPE's factors */
    kc.max_seqs = c.engine.max_queued_requests;
    kc.max_blocks_per_seq = (max_seq_len + kc.block_size - 1) / kc.block_size;
    kc.n_blocks = (int)(pool_bytes / block_bytes);
    kc.prefix_cache = c.engine.prefix_caching;
    kc.kv8 = c.engine.kv_8bit; /* int8 halves on the CPU, fp8 halves on a GPU */
    /* CUDA (asked for, or auto with a usable GPU): the pool lives on the device, sized
     * by gpu_memory_utilization unless kv_pool_mb caps it; else the CPU's, in the arena */
    kd_backend_want w = {c.engine.backend, threads, c.engine.max_batched_tokens, c.engine.max_batch_size,
                      max_seq_len, 0, pool_bytes, c.engine.kv_pool_mb ? pool_bytes : 0,
                      c.engine.gpu_memory_utilization, c.engine.cuda_prefill == CFG_PREFILL_CUBLAS,
                      c.engine.cuda_graphs};
    if (!(be = kd_backend_open(&m, &w, &kc, &arena, &kv, err, sizeof err))) { fprintf(stderr, "kilnd: %s\n", err); goto out; }
    kv_ok = 1;
    if (kv_seq_max_blocks(kv.cfg.n_blocks, kv.cfg.kv8) < kc.max_blocks_per_seq) { /* a CUDA pool, sized by the device */
        fprintf(stderr, "kilnd: the KV pool holds %d tokens per sequence in f16; max_seq_len = %d needs more: "
                "raise kv_pool_mb or lower max_seq_len\n", kv.cfg.n_blocks * kc.block_size, max_seq_len);
        goto out;
    }
    if (!kc.external_data && !arena.locked)
        fprintf(stderr, "kilnd: warning: the KV pool is not pinned (mlock failed; RLIMIT_MEMLOCK)\n");
    if (kc.external_data) {
        char desc[256];
        backend_cuda_describe(be, desc, sizeof desc);
        fprintf(stderr, "kilnd: CUDA backend: %s\n", desc);
    }

    /* timers: the server's and the transport's few, and one per session (a read resumed
     * on the next pass, net/srv_sess.c) */
    if (!(l = loop_new(c.net.max_connections * 2 + 256, c.net.max_connections + 64))) { fprintf(stderr, "kilnd: cannot create the event loop\n"); goto out; }
    char host[64];
    if (c.net.hostname[0]) snprintf(host, sizeof host, "%.63s", c.net.hostname);
    else if (gethostname(host, sizeof host) < 0) strcpy(host, "kiln");
    host[sizeof host - 1] = 0;
    net_config nc = {.driver = c.net.driver, .ifname = c.net.interface, .address = c.net.address,
                     .gateway = c.net.gateway, .mac = c.net.mac, .hostname = host, .dns = c.net.dns,
                     .max_conns = c.net.max_connections + 64};
    err[0] = 0;
    if (!(net = net_new(l, &nc, err, sizeof err))) { fprintf(stderr, "kilnd: network: %s\n", err); goto out; }
    if (err[0]) fprintf(stderr, "kilnd: warning: network: %s\n", err);
    char name[256];
    model_name(&c, &m, name, sizeof name);
    srv_env env = {&c, l, net, &m, &tok, &kv, be, name, max_seq_len, g_faults, g_update_slot,
                   KILN_VERSION, kd_backend_note()};
    if (!(s = srv_new(&env, err, sizeof err))) { fprintf(stderr, "kilnd: %s\n", err); goto out; }

    sw.s = s, sw.l = l, sw.argc = argc, sw.argv = argv;
    sw.fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sw.fd < 0 || loop_fd_add(l, sw.fd, LOOP_READ, on_signal, &sw) < 0) {
        fprintf(stderr, "kilnd: cannot watch signals: %s\n", strerror(errno));
        goto out;
    }
    if (control && !(ctl = ctl_new(l, s, net, control, err, sizeof err))) {
        fprintf(stderr, "kilnd: %s\n", err);
        goto out;
    }
    char addr[64] = "";
    net_address(net, addr, sizeof addr);
    if (!addr[0]) snprintf(addr, sizeof addr, "%s", c.net.listen_host); /* host sockets */
    printf("kilnd: serving %s on %s %s:%d (TLS, backend %s, simd %s)", name, net_driver_name(net),
           addr, c.net.listen_port, be->ops->name, isa_name(isa_level()));
    if (c.net.metrics_port) printf(", metrics http://%s:%d/metrics", addr, c.net.metrics_port);
    printf("\n");
    fflush(stdout);
    int r = loop_run(l);
    rc = r < 0 ? 1 : srv_exit_code(s);
    /* Closing connections still have bytes in flight (lwIP sends them only while the
     * loop runs): give them a moment before everything is torn down. */
    int64_t until = loop_now_ms() + 1000;
    while (r >= 0 && sw.count < 2 && net_open_conns(net) > 0 && loop_now_ms() < until) loop_run_once(l, 50);
    if (srv_hung(s)) { /* the backend may never return: no teardown that waits for it */
        fprintf(stderr, "kilnd: the engine hung; exiting for a restart\n");
        fflush(stdout), fflush(stderr);
        _exit(rc);
    }
    srv_log(s, CFG_LOG_INFO, "stopped%s", rc == 75 ? " for a restart" : "");
out:
    ctl_free(ctl);
    srv_free(s);
    if (sw.fd >= 0) {
        if (l) loop_fd_del(l, sw.fd, LOOP_READ);
        close(sw.fd);
    }
    net_free(net);
    if (l) loop_free(l);
    if (be) be->ops->destroy(be);
    if (kv_ok) kv_pool_free(&kv);
    mm_pool_free(&arena);
    if (tok_ok) tok_free(&tok);
    model_free(&m);
    return rc;
}

/* What kiln-init runs before each start: the config, the model file, the TLS files
 * and the tokens file, checked without binding a port or allocating the KV pool. */
int kd_check_config(int argc, char **argv) {
    static kiln_config c;
    int threads;
    const char *control;
    if (parse(argc, argv, &c, &threads, &control) < 0) return 1;
    static model m;
    char err[512];
    if (model_load(&m, c.model.path, err, sizeof err) < 0) { /* err names "model:" */
        fprintf(stderr, "kilnd: %s\n", err);
        return 1;
    }
    static tok_t tok; /* the tokenizer reads the file's own bytes too */
    if (tok_init_gguf(&tok, &m.gguf, err, sizeof err) < 0) {
        fprintf(stderr, "kilnd: %s\n", err);
        model_free(&m);
        return 1;
    }
    tok_free(&tok);
    const char *chat_note = prompt_chat_warning(prompt_chat_kind(&m.gguf, c.model.chat_template));
    if (chat_note) fprintf(stderr, "kilnd: warning: %s\n", chat_note);
    kv_config kc = {0};
    model_kv_shape(&m, &kc);
    kc.block_size = c.engine.block_size;
    kc.n_blocks = kc.max_seqs = kc.max_blocks_per_seq = 1;
    size_t bb = kv_block_bytes(&kc);
    int rc = cfg_check_model(&c, m.cfg.n_ctx_train, bb / (size_t)kc.block_size, NULL, err, sizeof err) < 0;
    model_free(&m);
    if (rc) { fprintf(stderr, "kilnd: %s\n", err); return 1; }
    tls_config tc = {c.net.cert, c.net.key, c.net.client_ca, c.net.client_ca[0] != 0};
    tls_server *ts = tls_server_new(&tc, err, sizeof err);
    if (!ts) { fprintf(stderr, "kilnd: TLS: %s\n", err); return 1; }
    tls_server_free(ts);
    FILE *f = fopen(c.net.tokens_file, "r");
    if (!f) { fprintf(stderr, "kilnd: tokens file %s: %s\n", c.net.tokens_file, strerror(errno)); return 1; }
    fclose(f);
    printf("kilnd: config ok\n");
    return 0;
}
