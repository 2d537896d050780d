/* config: kiln.ini read through inih, every knob range-checked (docs/CONFIG.md).
 *
 * A load goes into a copy and lands in *c only when every key and every cross-key rule
 * passed: on error *c is untouched and err holds one line naming the place, the key,
 * the value and what is allowed ("kiln.ini:12: [engine] max_batch_size = 0: must be
 * 1..1024"). Unknown sections and keys, duplicate keys and indented continuation lines
 * are errors. Strings live in fixed arrays: nothing here allocates. Functions return 0
 * or a negative errno (-EINVAL bad config, -ENOSPC short buffer, fopen/read errno). */
#ifndef KILN_CONFIG_H
#define KILN_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "core/chat.h"

#define CFG_NAME_MAX 128   /* served_model_name: a name clients type */
#define CFG_NAME_MAX_S "128"
#define CFG_STR_MAX 4000   /* longest path (bytes): a "key = value" line fits inih's 4096 */
#define CFG_HOST_MAX 16    /* dotted-quad IPv4 and its NUL */
#define CFG_DUMP_MAX 32768 /* cfg_dump never needs more */

/* [model] chat_template: auto (detect from the GGUF) or a CHAT_* kind by its name
 * (chat_template_names) */
enum { CFG_TEMPLATE_AUTO = 0, CFG_TEMPLATE_CHATML = CHAT_CHATML, CFG_TEMPLATE_LLAMA3 = CHAT_LLAMA3 };
enum { CFG_BACKEND_AUTO, CFG_BACKEND_CPU, CFG_BACKEND_CUDA };
enum { CFG_PREFILL_KILN, CFG_PREFILL_CUBLAS };
enum { CFG_DRIVER_HOST, CFG_DRIVER_TAP, CFG_DRIVER_PACKET };
enum { CFG_LOG_ERROR, CFG_LOG_WARN, CFG_LOG_INFO, CFG_LOG_DEBUG };

typedef struct kiln_config {
    struct {
        char path[CFG_STR_MAX + 1];  /* GGUF file */
        int chat_template;           /* CFG_TEMPLATE_AUTO or a CHAT_* kind */
        char served_model_name[CFG_STR_MAX + 1]; /* "": general.name, else the file's name */
    } model;
    struct {
        int backend;                 /* CFG_BACKEND_* */
        int threads;                 /* CPU workers; 0: one per CPU */
        int block_size;              /* tokens per KV block, power of two */
        int kv_pool_mb;              /* MiB; 0: max_batch_size * max_seq_len tokens */
        double gpu_memory_utilization; /* fraction of device memory kilnd may hold */
        int cuda_prefill;            /* CFG_PREFILL_*: who multiplies long steps on the GPU */
        int cuda_graphs;             /* 0/1: decode steps replayed as CUDA graphs */
        int max_batch_size;          /* sequences per step */
        int max_batched_tokens;      /* tokens per step (prefill chunks + decodes) */
        int max_seq_len;             /* prompt + generated tokens per sequence */
        int prefix_caching;          /* 0/1 */
        int fair_batch;              /* 0/1: an even share of each step per client */
        int itl_target_ms;           /* under fair_batch, the time target of a step a
                                      * client waits on for a token (0: 2x the balanced
                                      * step) */
        int kv_8bit;                 /* 0/1: the ladder's rung 2 may turn KV to 8 bits (CPU) */
        int max_queued_requests, max_queued_tokens; /* admission limits (waiting) */
        int default_max_tokens;      /* when a request names none */
        int step_timeout_ms;         /* a longer step restarts kilnd */
        int drain_timeout_ms;        /* DRAIN/SIGTERM: running requests get this long,
                                      * then end with ERR 503 draining */
        double ladder_high, ladder_low; /* degrade ladder: climb above high, step down
                                         * after ladder_hold_ms below low */
        int ladder_hold_ms, ladder_tick_ms;
    } engine;
    struct {                         /* request defaults; see core/sampler.h */
        double temperature, top_p, min_p, repeat_penalty;
        int top_k;                   /* 0: off */
        uint64_t seed;               /* 0: random */
    } sampling;
    struct {
        int driver;                  /* CFG_DRIVER_* */
        char listen_host[CFG_HOST_MAX];
        int listen_port, metrics_port; /* metrics_port 0: no /metrics listener */
        char cert[CFG_STR_MAX + 1], key[CFG_STR_MAX + 1];
        char client_ca[CFG_STR_MAX + 1]; /* "": no client certificates */
        char tokens_file[CFG_STR_MAX + 1];
        int max_connections, idle_timeout_ms, handshake_timeout_ms;
        int max_pending_connections; /* not yet through TLS + HELLO: the oldest goes first */
        int max_pending_per_address; /* ... the same, from one client address */
        int max_connections_per_token; /* greeted connections per token; 0: no cap */
        int max_requests_per_token;  /* requests in flight per token; 0: no cap */
        int max_line_bytes;          /* longest protocol line */
        int max_requests_per_conn;   /* requests in flight per connection */
        int max_output_bytes;        /* unsent output per connection before its
                                      * requests pause */
        int max_http_head_bytes;     /* HTTP (the OpenAI API): request line + headers */
        int max_http_body_bytes;     /* HTTP: one request's body (its JSON) */
        char interface[CFG_STR_MAX + 1]; /* tap / packet: the device */
        char address[CFG_STR_MAX + 1];   /* tap / packet: "dhcp" or a.b.c.d/len */
        char gateway[CFG_STR_MAX + 1];   /* "" or a.b.c.d */
        char dns[CFG_STR_MAX + 1];       /* "" or a.b.c.d[,a.b.c.d]: lwIP's DNS servers */
        char mac[CFG_STR_MAX + 1];       /* "" or aa:bb:cc:dd:ee:ff */
        char hostname[CFG_STR_MAX + 1];  /* the box's name (kiln-init, DHCP); "": the system's */
    } net;
    struct {
        int level;                   /* CFG_LOG_* */
    } log;
} kiln_config;

void cfg_defaults(kiln_config *c);
/* Apply a file or a NUL-terminated string over *c (start from cfg_defaults), then
 * cfg_validate; all or nothing. Messages start "path:line: " or "<string>:line: ". */
int cfg_load_file(kiln_config *c, const char *path, char *err, size_t errlen);
int cfg_load_string(kiln_config *c, const char *text, char *err, size_t errlen);
/* One key, checked alone (no cross-key rules: set on a copy, cfg_validate, swap). */
int cfg_set(kiln_config *c, const char *section, const char *key, const char *value,
            char *err, size_t errlen);
/* One key's value as cfg_dump writes it; the length, or -EINVAL / -ENOSPC. */
int cfg_get(const kiln_config *c, const char *section, const char *key, char *out,
            size_t cap);
int cfg_validate(const kiln_config *c, char *err, size_t errlen);
/* Checks against the loaded model: max_seq_len <= n_ctx, and the KV pool (kv_pool_mb,
 * or the auto size) holds one max_seq_len sequence at kv_bytes_per_token; sets
 * *pool_bytes. -EINVAL, or -EOVERFLOW when the auto size does not fit a size_t. */
int cfg_check_model(const kiln_config *c, int n_ctx, size_t kv_bytes_per_token,
                    size_t *pool_bytes, char *err, size_t errlen);
/* The whole config in ini form (every key); the length, or -ENOSPC (out holds a
 * truncated, NUL-terminated prefix). cfg_load_string of it gives back an equal config. */
int cfg_dump(const kiln_config *c, char *out, size_t cap);
int cfg_equal(const kiln_config *a, const kiln_config *b); /* 1 when every key matches */

#endif
