/* test_config: core/config. Defaults, every key, each key at and just past its limits,
 * bad numbers, unknown names, inih corner cases (continuations, long lines, BOM, CRLF,
 * NUL), cross-key rules with their line numbers, the dump -> load round trip, files. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/config.h"
#include "tests/unit/check.h"

static char err[1024];
static kiln_config A, B; /* ~20 KiB each: keep them off the stack */

static int load(kiln_config *c, const char *text) {
    cfg_defaults(c);
    err[0] = '\0';
    return cfg_load_string(c, text, err, sizeof err);
}

/* text must fail to load with a message containing every non-NULL needle. */
#define LOAD_FAILS(text, ...)                                                           \
    do {                                                                                \
        const char *n_[] = {__VA_ARGS__, NULL};                                         \
        int r_ = load(&A, text);                                                        \
        CHECK(r_ == -EINVAL, "load of %s returned %d (err %s)", #text, r_, err);        \
        for (int i_ = 0; n_[i_]; i_++)                                                  \
            CHECK(strstr(err, n_[i_]), "load of %s: error '%s' lacks '%s'", #text, err, n_[i_]); \
    } while (0)

/* ---------------------------------------------------------------- defaults */

static void test_defaults(void) {
    kiln_config c;
    cfg_defaults(&c);
    CHECK(cfg_validate(&c, err, sizeof err) == 0, "defaults invalid: %s", err);
    CHECK(!strcmp(c.model.path, "models/SmolLM2-135M-Instruct.Q4_1.gguf"), "%s", c.model.path);
    CHECK(c.model.chat_template == CFG_TEMPLATE_AUTO, "template");
    CHECK(c.engine.backend == CFG_BACKEND_AUTO && c.engine.threads == 0, "backend/threads");
    CHECK(c.engine.block_size == 16 && c.engine.kv_pool_mb == 0, "block/pool");
    CHECK(c.engine.gpu_memory_utilization == 0.9, "gpu util");
    CHECK(c.engine.max_batch_size == 32 && c.engine.max_batched_tokens == 512, "batch");
    CHECK(c.engine.max_seq_len == 4096 && c.engine.prefix_caching == 1, "seq/prefix");
    CHECK(c.engine.kv_8bit == 1, "kv_8bit on by default");
    CHECK(c.engine.fair_batch == 1, "fair_batch on by default");
    CHECK(c.engine.itl_target_ms == 0, "itl_target_ms: 4x the decode step by default");
    CHECK(c.engine.max_queued_requests == 256 && c.engine.max_queued_tokens == 262144, "queue");
    CHECK(c.engine.default_max_tokens == 256 && c.engine.step_timeout_ms == 60000, "max tok");
    CHECK(c.sampling.temperature == 0.7 && c.sampling.top_p == 0.9 && c.sampling.top_k == 0, "samp");
    CHECK(c.sampling.min_p == 0 && c.sampling.repeat_penalty == 1.0 && c.sampling.seed == 0, "samp2");
    CHECK(c.net.driver == CFG_DRIVER_HOST && !strcmp(c.net.listen_host, "0.0.0.0"), "driver");
    CHECK(c.net.listen_port == 8443 && c.net.metrics_port == 9100, "ports");
    CHECK(c.net.client_ca[0] == '\0' && c.net.cert[0] && c.net.key[0] && c.net.tokens_file[0], "tls");
    CHECK(c.net.max_connections == 256 && c.net.idle_timeout_ms == 300000, "conns");
    CHECK(c.net.handshake_timeout_ms == 5000 && c.net.max_line_bytes == 1048576, "net limits");
    CHECK(c.log.level == CFG_LOG_INFO, "log");
    /* An empty file, comments only, and empty sections leave the defaults. */
    CHECK(load(&A, "") == 0 && cfg_equal(&A, &c), "empty: %s", err);
    CHECK(load(&A, "; c\n# c\n\n[engine]\n[net]\n  \n") == 0 && cfg_equal(&A, &c), "comments: %s", err);
}

/* ---------------------------------------------------------------- every key */

static const char *full =
    "[model]\n"
    "path = /data/models/m.gguf\n"
    "chat_template = llama3\n"
    "[engine]\n"
    "backend = cuda\n"
    "threads = 12\n"
    "block_size = 32\n"
    "kv_pool_mb = 2G\n"
    "gpu_memory_utilization = 0.85\n"
    "max_batch_size = 64\n"
    "max_batched_tokens = 2048\n"
    "max_seq_len = 8192\n"
    "prefix_caching = off\n"
    "fair_batch = off\n"
    "itl_target_ms = 25\n"
    "max_queued_requests = 1000\n"
    "max_queued_tokens = 1000000\n"
    "default_max_tokens = 1024\n"
    "step_timeout_ms = 30000\n"
    "[sampling]\n"
    "temperature = 0\n"
    "top_p = 0.95\n"
    "top_k = 40\n"
    "min_p = 0.05\n"
    "repeat_penalty = 1.1\n"
    "seed = 18446744073709551615\n"
    "[net]\n"
    "driver = tap\n"
    "listen = 10.0.2.15:443\n"
    "metrics_port = 0\n"
    "cert = /data/tls/c.pem\n"
    "key = /data/tls/k.pem\n"
    "client_ca = /data/tls/ca.pem\n"
    "tokens_file = /data/tokens\n"
    "max_connections = 1024\n"
    "idle_timeout_ms = 60000\n"
    "handshake_timeout_ms = 7000\n"
    "max_line_bytes = 64K\n"
    "[log]\n"
    "level = debug\n";

static void test_every_key(void) {
    kiln_config *c = &A;
    int r = load(c, full);
    CHECK(r == 0, "full config: %d %s", r, err);
    CHECK(!strcmp(c->model.path, "/data/models/m.gguf"), "path");
    CHECK(c->model.chat_template == CFG_TEMPLATE_LLAMA3, "template");
    CHECK(c->engine.backend == CFG_BACKEND_CUDA && c->engine.threads == 12, "backend");
    CHECK(c->engine.block_size == 32 && c->engine.kv_pool_mb == 2048, "pool %d", c->engine.kv_pool_mb);
    CHECK(c->engine.gpu_memory_utilization == 0.85, "util");
    CHECK(c->engine.max_batch_size == 64 && c->engine.max_batched_tokens == 2048, "batch");
    CHECK(c->engine.max_seq_len == 8192 && c->engine.prefix_caching == 0, "seq");
    CHECK(c->engine.fair_batch == 0, "fair_batch off");
    CHECK(c->engine.itl_target_ms == 25, "itl_target_ms");
    CHECK(c->engine.max_queued_requests == 1000 && c->engine.max_queued_tokens == 1000000, "q");
    CHECK(c->engine.default_max_tokens == 1024 && c->engine.step_timeout_ms == 30000, "dmt");
    CHECK(c->sampling.temperature == 0 && c->sampling.top_p == 0.95 && c->sampling.top_k == 40, "s");
    CHECK(c->sampling.min_p == 0.05 && c->sampling.repeat_penalty == 1.1, "s2");
    CHECK(c->sampling.seed == UINT64_MAX, "seed");
    CHECK(c->net.driver == CFG_DRIVER_TAP && !strcmp(c->net.listen_host, "10.0.2.15"), "listen");
    CHECK(c->net.listen_port == 443 && c->net.metrics_port == 0, "ports");
    CHECK(!strcmp(c->net.cert, "/data/tls/c.pem") && !strcmp(c->net.key, "/data/tls/k.pem"), "tls");
    CHECK(!strcmp(c->net.client_ca, "/data/tls/ca.pem") && !strcmp(c->net.tokens_file, "/data/tokens"), "ca");
    CHECK(c->net.max_connections == 1024 && c->net.idle_timeout_ms == 60000, "conn");
    CHECK(c->net.handshake_timeout_ms == 7000 && c->net.max_line_bytes == 65536, "line");
    CHECK(c->log.level == CFG_LOG_DEBUG, "level");
    /* Whitespace around '=', inline comments, "name: value", CRLF, a BOM. */
    r = load(c, "\xEF\xBB\xBF[engine]\r\nthreads=3 ; three\r\nblock_size :  64\r\n[log]\nlevel = WARN");
    CHECK(r == 0, "variants: %s", err);
    CHECK(c->engine.threads == 3 && c->engine.block_size == 64 && c->log.level == CFG_LOG_WARN,
          "variants %d %d %d", c->engine.threads, c->engine.block_size, c->log.level);
}

/* ---------------------------------------------------------------- boundaries */

typedef struct {
    const char *sec, *key;
    const char *ok[12]; /* accepted (limits and inside) */
    const char *bad[12]; /* rejected (just past the limits, junk) */
    const char *says;   /* the allowed range as the message gives it */
} bound;

static const bound bounds[] = {
    {"model", "chat_template", {"auto", "chatml", "llama3", "ChatML", "qwen3", "Qwen3-NoThink", "gemma", "granite3",
                                "mistral-small3", "devstral", "Ministral3", "gemma4-interleaved"},
     {"", "llama2", "chatml ", "unknown", "mistral", "gemma4-"},
     "auto|chatml|smollm|qwen2|qwen2.5|llama3|qwen3|qwen3-nothink|gemma|phi3|phi3-legacy|mistral-tekken|granite3|"
     "llama3.1|llama3.2|phi4|mistral-small3|devstral|ministral3|gemma4|gemma4-interleaved"},
    {"model", "served_model_name", {"", "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", "qwen3:8b", "a.b_c+d@e",
      "12345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678"},
     {"my model", "a\"b", "a\\b", "caf\xc3\xa9", "a,b", "a{b}",
      "123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789"},
     NULL},
    {"engine", "backend", {"auto", "cpu", "cuda", "CUDA"}, {"", "gpu", "cpu,cuda"}, "auto|cpu|cuda"},
    {"engine", "threads", {"0", "1", "1024"}, {"1025", "-1", "-0", "", "4x", "1K", "0x10", "4.0", "99999999999999999999999"}, "0..1024"},
    {"engine", "block_size", {"8", "16", "128", "256"}, {"4", "7", "12", "512", "255", "257", "0"}, "power of two 8..256"},
    {"engine", "kv_pool_mb", {"0", "1", "1048576", "1T", "1024K", "2g", "512M"}, {"1048577", "2T", "1536K", "1K", "-1", "1P", "1KB", "1 G", "18446744073709551616K"}, "0..1048576"},
    {"engine", "gpu_memory_utilization", {"0.1", "0.99", "0.5", ".5", "5e-1"}, {"0.0999", "0.991", "1", "0", "nan", "inf", "0x1p-1", "", "0.5.", "1e", "-", "."}, "0.1..0.99"},
    {"engine", "max_batch_size", {"1", "1024"}, {"0", "1025", "-0"}, "1..1024"},
    {"engine", "max_batched_tokens", {"1", "131072"}, {"0", "131073"}, "1..131072"},
    {"engine", "max_seq_len", {"16", "1048576"}, {"15", "1048577"}, "16..1048576"},
    {"engine", "prefix_caching", {"true", "false", "yes", "no", "on", "off", "1", "0"}, {"", "2", "y", "enabled", "truee"}, "true|false|yes|no|on|off|1|0"},
    {"engine", "kv_8bit", {"true", "false", "on", "off"}, {"", "2", "8"}, "true|false|yes|no|on|off|1|0"},
    {"engine", "itl_target_ms", {"0", "1", "60000"}, {"-1", "60001", "1.5"}, "0..60000"},
    {"engine", "max_queued_requests", {"1", "65536"}, {"0", "65537"}, "1..65536"},
    {"engine", "max_queued_tokens", {"1", "16777216"}, {"0", "16777217"}, "1..16777216"},
    {"engine", "default_max_tokens", {"1", "1048576"}, {"0", "1048577"}, "1..1048576"},
    {"engine", "step_timeout_ms", {"100", "600000"}, {"99", "600001"}, "100..600000"},
    {"sampling", "temperature", {"0", "10", "-0", "1e1", "0.000001"}, {"-0.0001", "10.0001", "1e999", "-1e999", "1,5"}, "0..10"},
    {"sampling", "top_p", {"0", "1", "1.0"}, {"-0.01", "1.01", "+0.5"}, "0..1"},
    {"sampling", "top_k", {"0", "1048576"}, {"-1", "1048577"}, "0..1048576"},
    {"sampling", "min_p", {"0", "1"}, {"-0.01", "1.01"}, "0..1"},
    {"sampling", "repeat_penalty", {"0.1", "10", "1"}, {"0.0999", "10.01", "0"}, "0.1..10"},
    {"sampling", "seed", {"0", "1", "18446744073709551615"}, {"18446744073709551616", "-1", "", "1e3", "+1"}, "0..18446744073709551615"},
    {"net", "driver", {"host", "tap", "packet"}, {"", "tun", "af_packet"}, "host|tap|packet"},
    {"net", "listen", {"0.0.0.0:8443", "127.0.0.1:1", "255.255.255.255:65535", "10.0.0.1:08443"},
     {"0.0.0.0", "0.0.0.0:", ":8443", "256.0.0.1:1", "1.2.3:1", "01.2.3.4:1", "1.2.3.4:0", "1.2.3.4:65536", "localhost:80", "1.2.3.4:80x", "1.2.3.4.5:1", "[::]:8443"}, "IPv4:port"},
    {"net", "metrics_port", {"0", "1", "65535"}, {"-1", "65536"}, "0..65535"},
    {"net", "max_connections", {"1", "65536"}, {"0", "65537"}, "1..65536"},
    {"net", "idle_timeout_ms", {"1000", "86400000"}, {"999", "86400001"}, "1000..86400000"},
    {"net", "handshake_timeout_ms", {"100", "300000"}, {"99", "300001"}, "100..300000"},
    {"net", "max_line_bytes", {"4096", "4K", "64M", "67108864"}, {"4095", "3K", "67108865", "65M", "1G", "1.5M"}, "4096..67108864"},
    {"log", "level", {"error", "warn", "info", "debug", "Info"}, {"", "trace", "warning"}, "error|warn|info|debug"},
    {"model", "path", {"a", "/x/y z.gguf", "a;b", "a=b:c#d"}, {"", " a", "a ", "a ;b", ";a", "\"a\"", "a\tb", "a\nb", "'a'"}, NULL},
    {"net", "cert", {"c"}, {""}, "must not be empty"},
    {"net", "key", {"k"}, {""}, "must not be empty"},
    {"net", "client_ca", {"", "ca.pem"}, {" x", "a\x01"}, NULL},
    {"net", "tokens_file", {"t"}, {""}, "must not be empty"},
};

static void test_bounds(void) {
    for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++) {
        const bound *b = &bounds[i];
        char want[128], got[CFG_STR_MAX + 1];
        snprintf(want, sizeof want, "[%s] %s = ", b->sec, b->key);
        for (int j = 0; j < (int)(sizeof b->ok / sizeof b->ok[0]) && b->ok[j]; j++) {
            kiln_config c;
            cfg_defaults(&c);
            int r = cfg_set(&c, b->sec, b->key, b->ok[j], err, sizeof err);
            CHECK(r == 0, "%s '%s' rejected: %s", want, b->ok[j], err);
            CHECK(cfg_get(&c, b->sec, b->key, got, sizeof got) >= 0, "get %s", b->key);
            /* What cfg_get shows reads back the same. */
            kiln_config d;
            cfg_defaults(&d);
            r = cfg_set(&d, b->sec, b->key, got, err, sizeof err);
            CHECK(r == 0 && cfg_equal(&c, &d), "%s '%s' shown as '%s' does not read back", want,
                  b->ok[j], got);
        }
        for (int j = 0; j < 12 && b->bad[j]; j++) {
            kiln_config c, before;
            cfg_defaults(&c);
            before = c;
            err[0] = '\0';
            int r = cfg_set(&c, b->sec, b->key, b->bad[j], err, sizeof err);
            CHECK(r == -EINVAL, "%s '%s' accepted", want, b->bad[j]);
            CHECK(strstr(err, want) == err, "%s '%s': message '%s'", want, b->bad[j], err);
            CHECK(!b->says || strstr(err, b->says), "%s '%s': message '%s' lacks '%s'", want,
                  b->bad[j], err, b->says);
            CHECK(cfg_equal(&c, &before), "%s '%s': failed set changed the config", want, b->bad[j]);
        }
    }
    /* The message the brief asks for, with file and line. */
    LOAD_FAILS("[engine]\n\nmax_batch_size = 0\n",
               "<string>:3: [engine] max_batch_size = 0: must be 1..1024");
    CHECK(!strcmp(err, "<string>:3: [engine] max_batch_size = 0: must be 1..1024"), "%s", err);
    /* Junk gets its own wording. */
    LOAD_FAILS("[engine]\nthreads = 4x\n", "<string>:2: [engine] threads = 4x: not an integer", "0..1024");
    LOAD_FAILS("[engine]\nthreads =\n", "<string>:2: [engine] threads = : not an integer");
    LOAD_FAILS("[engine]\nkv_pool_mb = 100K\n", "not a whole number of MiB");
    LOAD_FAILS("[engine]\nthreads = 4K\n", "not an integer"); /* no suffixes on counts */
    LOAD_FAILS("[sampling]\ntop_p = 0.5x\n", "not a decimal number: must be 0..1");
    /* Strings: at the length limit and one past it. */
    static char s[CFG_STR_MAX + 2], text[CFG_STR_MAX + 64];
    memset(s, 'p', CFG_STR_MAX);
    s[CFG_STR_MAX] = '\0';
    snprintf(text, sizeof text, "[model]\npath = %s\n", s);
    CHECK(load(&A, text) == 0 && strlen(A.model.path) == CFG_STR_MAX, "path at limit: %s", err);
    s[CFG_STR_MAX] = 'p';
    s[CFG_STR_MAX + 1] = '\0';
    CHECK(cfg_set(&A, "net", "cert", s, err, sizeof err) == -EINVAL && strstr(err, "longer than 4000"),
          "cert past limit: %s", err);
    snprintf(text, sizeof text, "[model]\npath = %s\n", s);
    LOAD_FAILS(text, "<string>:2: [model] path = pppp", "longer than 4000 bytes");
    /* Long values are shortened in messages. */
    CHECK(strlen(err) < 200, "message too long: %zu", strlen(err));
}

/* ---------------------------------------------------------------- names and syntax */

static void test_names_syntax(void) {
    LOAD_FAILS("[engine]\nthreds = 4\n", "<string>:2: [engine] threds: unknown key (did you mean threads?)");
    LOAD_FAILS("[engine]\ntemperature = 1\n", "[engine] temperature: unknown key (it belongs in [sampling])");
    LOAD_FAILS("[engine]\nzzzzzzzz = 1\n", "<string>:2: [engine] zzzzzzzz: unknown key");
    LOAD_FAILS("[engine]\nThreads = 4\n", "unknown key (did you mean threads?)"); /* names are case-sensitive */
    LOAD_FAILS("[engin]\nthreads = 4\n", "<string>:1: [engin]: unknown section; did you mean [engine]?");
    LOAD_FAILS("[log]\n[bogus]\n", "<string>:2: [bogus]: unknown section; sections are");
    LOAD_FAILS("threads = 4\n", "<string>:1: threads = 4: key outside any section");
    LOAD_FAILS("[engine]\n= 4\n", "<string>:2: [engine] (no name): unknown key");
    /* Duplicates are errors, naming both lines. */
    LOAD_FAILS("[engine]\nthreads = 4\n[log]\nlevel = info\n[engine]\nthreads = 5\n",
               "<string>:6: [engine] threads: set twice (first on line 2)");
    /* Indented continuation lines (inih's multi-line values) are refused. */
    LOAD_FAILS("[engine]\n  threads = 4\n  block_size = 16\n",
               "<string>:3: indented line continues [engine] threads");
    CHECK(load(&A, "[engine]\n  threads = 4\n[log]\n  level = warn\n") == 0, "indented keys: %s", err);
    /* Syntax errors from inih, with their line. */
    LOAD_FAILS("[engine]\nthreads 4\n", "<string>:2: syntax error");
    LOAD_FAILS("[engine\nthreads = 4\n", "<string>:1: syntax error");
    LOAD_FAILS("[log]\nlevel = info\n\n[engine]\nthreads = 4\nwhat\n", "<string>:6: syntax error");
    /* The earliest error wins, whoever saw it. */
    LOAD_FAILS("[engine]\nthreads 4\nblock_size = 3\n", "<string>:2: syntax error");
    LOAD_FAILS("[engine]\nblock_size = 3\nthreads 4\n", "<string>:2: [engine] block_size = 3");
    /* A line past inih's buffer; lines after it keep their numbers. */
    static char text[9000];
    int n = snprintf(text, sizeof text, "[model]\npath = ");
    memset(text + n, 'x', 5000);
    snprintf(text + n + 5000, sizeof text - (size_t)n - 5000, "\n[engine]\nthreads = 4\n");
    LOAD_FAILS(text, "<string>:2: line longer than 4093 bytes");
    snprintf(text + n + 5000, sizeof text - (size_t)n - 5000, "\n[engine]\nthreads = 4x\n");
    LOAD_FAILS(text, "<string>:2: line longer"); /* still the first error */
    /* inline comment needs a space before ';' */
    CHECK(load(&A, "[engine]\nthreads = 4;x\n") == -EINVAL && strstr(err, "4;x"), "%s", err);
    /* Unknown-section errors from cfg_set, too. */
    CHECK(cfg_set(&A, "engin", "threads", "4", err, sizeof err) == -EINVAL &&
          strstr(err, "[engin]: unknown section; did you mean [engine]?"), "%s", err);
    CHECK(cfg_set(&A, "engine", "thread", "4", err, sizeof err) == -EINVAL &&
          strstr(err, "[engine] thread: unknown key (did you mean threads?)"), "%s", err);
    /* Control bytes in names are not echoed raw. */
    LOAD_FAILS("[engine]\nthr\x01" "ds = 4\n", "thr?ds");
}

/* ---------------------------------------------------------------- cross-key rules */

static void test_cross(void) {
    LOAD_FAILS("[engine]\nmax_batch_size = 64\nmax_batched_tokens = 32\n",
               "<string>:3: [engine] max_batched_tokens = 32: must be >= max_batch_size (64)");
    /* The rule is reported at the later of the two lines, even the default's partner. */
    LOAD_FAILS("[engine]\nmax_batched_tokens = 16\nthreads = 1\n", "<string>:2: [engine] max_batched_tokens = 16");
    LOAD_FAILS("[engine]\nmax_batched_tokens = 64\nmax_batch_size = 65\n", "<string>:3: ");
    CHECK(load(&A, "[engine]\nmax_batch_size = 64\nmax_batched_tokens = 64\n") == 0, "equal ok: %s", err);
    LOAD_FAILS("[engine]\nmax_seq_len = 256\n", "<string>:2: [engine] default_max_tokens = 256: must be < max_seq_len (256)");
    CHECK(load(&A, "[engine]\nmax_seq_len = 257\n") == 0, "257 ok: %s", err);
    LOAD_FAILS("[engine]\nmax_seq_len = 300000\n",
               "[engine] max_queued_tokens = 262144: must be >= max_seq_len (300000)");
    CHECK(load(&A, "[engine]\nmax_seq_len = 262144\n") == 0, "queue = seq ok: %s", err);
    LOAD_FAILS("[net]\nhandshake_timeout_ms = 2000\nidle_timeout_ms = 1999\n",
               "<string>:3: [net] handshake_timeout_ms = 2000: must be <= idle_timeout_ms (1999)");
    CHECK(load(&A, "[net]\nhandshake_timeout_ms = 2000\nidle_timeout_ms = 2000\n") == 0, "%s", err);
    LOAD_FAILS("[net]\nlisten = 127.0.0.1:9100\n", "[net] metrics_port = 9100: must differ from the listen port");
    LOAD_FAILS("[net]\nmetrics_port = 8443\n", "<string>:2: [net] metrics_port = 8443");
    CHECK(load(&A, "[net]\naddress = 10.0.0.2/24\ngateway = 10.0.0.1\nmac = 02:00:aB:00:00:01\n") == 0,
          "static address: %s", err);
    LOAD_FAILS("[net]\naddress = 10.0.0.2\n", "<string>:2: [net] address = 10.0.0.2: must be dhcp or");
    LOAD_FAILS("[net]\naddress = 10.0.0.256/24\n", "[net] address = 10.0.0.256/24");
    LOAD_FAILS("[net]\naddress = 10.0.0.1/33\n", "[net] address = 10.0.0.1/33");
    LOAD_FAILS("[net]\ngateway = 10.0.0\n", "[net] gateway = 10.0.0: must be empty or");
    CHECK(load(&A, "[net]\ndns = 10.0.0.53\n") == 0 && !strcmp(A.net.dns, "10.0.0.53"), "dns: %s", err);
    CHECK(load(&A, "[net]\ndns = 10.0.0.53,10.0.1.53\n") == 0, "two dns: %s", err);
    LOAD_FAILS("[net]\ndns = 10.0.0.53,\n", "[net] dns = 10.0.0.53,: must be empty or one or two");
    LOAD_FAILS("[net]\ndns = 1.1.1.1,2.2.2.2,3.3.3.3\n", "[net] dns = 1.1.1.1,2.2.2.2,3.3.3.3: must be");
    LOAD_FAILS("[net]\ndns = resolver.lan\n", "[net] dns = resolver.lan: must be empty or");
    LOAD_FAILS("[net]\nmac = 02:00:00:00:00\n", "[net] mac = 02:00:00:00:00: must be empty or six");
    LOAD_FAILS("[net]\ndriver = tap\ninterface =\n", "[net] interface: must be set for driver = tap");
    CHECK(load(&A, "[net]\nhostname = kiln-07\n") == 0, "hostname: %s", err);
    LOAD_FAILS("[net]\nhostname = -kiln\n", "[net] hostname = -kiln: must be 1..63");
    LOAD_FAILS("[net]\nhostname = kiln.box\n", "[net] hostname = kiln.box: must be 1..63");
    /* A failed load leaves the struct alone. */
    cfg_defaults(&B);
    kiln_config before = B;
    CHECK(cfg_load_string(&B, "[engine]\nthreads = 7\nmax_batch_size = 0\n", err, sizeof err) == -EINVAL, "x");
    CHECK(cfg_equal(&B, &before) && B.engine.threads == 0, "partial load leaked");
    CHECK(cfg_load_string(&B, "[engine]\nthreads = 7\nmax_batched_tokens = 1\n", err, sizeof err) == -EINVAL, "x");
    CHECK(cfg_equal(&B, &before), "cross-failed load leaked");
    /* cfg_validate directly, and on a hand-broken struct. */
    cfg_defaults(&B);
    B.engine.max_batched_tokens = 8;
    CHECK(cfg_validate(&B, err, sizeof err) == -EINVAL &&
          !strncmp(err, "[engine] max_batched_tokens = 8: must be >= max_batch_size", 55), "%s", err);
    cfg_defaults(&B);
    B.engine.block_size = 24;
    CHECK(cfg_validate(&B, err, sizeof err) == -EINVAL && strstr(err, "[engine] block_size = 24: must be a power of two"), "%s", err);
    cfg_defaults(&B);
    B.net.driver = 7;
    CHECK(cfg_validate(&B, err, sizeof err) == -EINVAL && strstr(err, "[net] driver"), "%s", err);
    cfg_defaults(&B);
    memset(B.net.key, 'k', sizeof B.net.key);
    CHECK(cfg_validate(&B, err, sizeof err) == -EINVAL && strstr(err, "[net] key: not a NUL-terminated"), "%s", err);
    cfg_defaults(&B);
    B.sampling.top_p = 2;
    CHECK(cfg_validate(&B, err, sizeof err) == -EINVAL && strstr(err, "[sampling] top_p = 2: must be 0..1"), "%s", err);
    /* Layered loads: a later string overrides an earlier one (each validated). */
    CHECK(load(&A, "[engine]\nthreads = 2\n") == 0 &&
          cfg_load_string(&A, "[engine]\nthreads = 3\n", err, sizeof err) == 0 && A.engine.threads == 3, "layer");
}

static void test_model_check(void) {
    kiln_config c;
    size_t bytes = 0;
    cfg_defaults(&c);
    CHECK(cfg_check_model(&c, 8192, 1000, &bytes, err, sizeof err) == 0, "%s", err);
    CHECK(bytes == (size_t)32 * 4096 * 1000, "auto pool %zu", bytes);
    CHECK(cfg_check_model(&c, 4096, 1000, &bytes, err, sizeof err) == 0, "ctx = seq: %s", err);
    CHECK(cfg_check_model(&c, 4095, 1000, &bytes, err, sizeof err) == -EINVAL &&
          strstr(err, "[engine] max_seq_len = 4096: must be <= the model's context length (4095)"), "%s", err);
    /* max_seq_len not a multiple of block_size rounds up to whole blocks. */
    c.engine.max_seq_len = 100;
    c.engine.max_batch_size = 2;
    CHECK(cfg_check_model(&c, 8192, 10, &bytes, err, sizeof err) == 0 && bytes == 2 * 112 * 10, "%zu", bytes);
    /* A fixed pool: exactly one sequence fits, then one byte per token too many. */
    c.engine.max_seq_len = 4096;
    c.engine.kv_pool_mb = 1;
    CHECK(cfg_check_model(&c, 8192, 256, &bytes, err, sizeof err) == 0 && bytes == 1 << 20, "%s", err);
    c.engine.kv_8bit = 0;
    CHECK(cfg_check_model(&c, 8192, 257, &bytes, err, sizeof err) == -EINVAL &&
          strstr(err, "[engine] kv_pool_mb = 1: holds") && strstr(err, "max_seq_len = 4096 needs 4096"), "%s", err);
    /* with kv_8bit one sequence may hold twice the pool's f16 blocks, less 4 */
    c.engine.kv_8bit = 1;
    CHECK(cfg_check_model(&c, 8192, 257, &bytes, err, sizeof err) == 0, "%s", err);
    c.engine.max_seq_len = 8192; /* 1 MiB / (16 * 512) = 128 blocks: 252 in 8 bits, 256 asked */
    CHECK(cfg_check_model(&c, 8192, 512, &bytes, err, sizeof err) == -EINVAL &&
          strstr(err, "in 8 bits") && strstr(err, "needs 8192"), "%s", err);
    c.engine.max_seq_len = 4096;
    c.engine.kv_pool_mb = 0;
    c.engine.max_batch_size = 1024;
    c.engine.max_seq_len = 1048576;
    CHECK(cfg_check_model(&c, 1 << 21, SIZE_MAX / 4, &bytes, err, sizeof err) == -EOVERFLOW, "%s", err);
    CHECK(cfg_check_model(&c, 0, 1, &bytes, err, sizeof err) == -EINVAL, "n_ctx 0");
}

/* ---------------------------------------------------------------- dump and get */

static void round_trip(const kiln_config *c, const char *what) {
    static char d1[CFG_DUMP_MAX], d2[CFG_DUMP_MAX];
    int n = cfg_dump(c, d1, sizeof d1);
    CHECK(n > 0 && (size_t)n == strlen(d1), "%s: dump %d", what, n);
    cfg_defaults(&B);
    int r = cfg_load_string(&B, d1, err, sizeof err);
    CHECK(r == 0, "%s: dump does not load: %s", what, err);
    CHECK(cfg_equal(c, &B), "%s: round trip differs", what);
    CHECK(cfg_dump(&B, d2, sizeof d2) == n && !strcmp(d1, d2), "%s: second dump differs", what);
}

static void test_dump(void) {
    kiln_config c;
    cfg_defaults(&c);
    round_trip(&c, "defaults");
    CHECK(load(&A, full) == 0, "%s", err);
    round_trip(&A, "full");
    /* Awkward doubles and the largest strings. */
    CHECK(load(&A, "[sampling]\ntemperature = 0.1\ntop_p = 0.30000000000000004\nmin_p = 1e-300\n"
                   "repeat_penalty = 9.999999999999998\n") == 0, "%s", err);
    round_trip(&A, "doubles");
    cfg_defaults(&A);
    static char s[CFG_STR_MAX + 1];
    memset(s, 'q', CFG_STR_MAX);
    s[0] = '/';
    s[CFG_STR_MAX - 1] = ';'; /* ';' not after a space is plain text */
    const char *strs[] = {"path", "cert", "key", "client_ca", "tokens_file"};
    for (int i = 0; i < 5; i++)
        CHECK(cfg_set(&A, i ? "net" : "model", strs[i], s, err, sizeof err) == 0, "%s", err);
    round_trip(&A, "long strings");
    static char d[CFG_DUMP_MAX];
    int n = cfg_dump(&A, d, sizeof d);
    CHECK(n > 5 * CFG_STR_MAX && n < CFG_DUMP_MAX, "dump size %d", n);
    /* Too small a buffer: -ENOSPC and a terminated prefix. */
    char small[100];
    memset(small, 'z', sizeof small);
    CHECK(cfg_dump(&c, small, sizeof small) == -ENOSPC && small[99] == '\0' &&
          !strncmp(small, "# kiln", 6), "small dump");
    CHECK(cfg_dump(&c, small, 0) == -ENOSPC, "zero cap");
    /* cfg_get */
    char v[64];
    CHECK(cfg_get(&c, "net", "listen", v, sizeof v) == 12 && !strcmp(v, "0.0.0.0:8443"), "%s", v);
    CHECK(cfg_get(&c, "engine", "prefix_caching", v, sizeof v) == 4 && !strcmp(v, "true"), "%s", v);
    CHECK(cfg_get(&c, "engine", "gpu_memory_utilization", v, sizeof v) > 0 && !strcmp(v, "0.9"), "%s", v);
    CHECK(cfg_get(&c, "engine", "backend", v, sizeof v) > 0 && !strcmp(v, "auto"), "%s", v);
    CHECK(cfg_get(&c, "engine", "nope", v, sizeof v) == -EINVAL && !v[0], "unknown get");
    CHECK(cfg_get(&c, "model", "path", v, 5) == -ENOSPC && !v[0], "short get");
    /* cfg_equal sees every key */
    cfg_defaults(&B);
    B.sampling.seed = 1;
    CHECK(!cfg_equal(&c, &B), "seed");
    cfg_defaults(&B);
    B.net.listen_port = 1;
    CHECK(!cfg_equal(&c, &B), "port");
    cfg_defaults(&B);
    B.net.client_ca[0] = 'x';
    CHECK(!cfg_equal(&c, &B), "ca");
}

/* ---------------------------------------------------------------- files */

static void test_files(void) {
    char dir[] = "/tmp/kiln_cfg_XXXXXX", path[128];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/kiln.ini", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "create %s", path);
    if (!f) return;
    fputs("; test\n[engine]\nthreads = 6\n\n\n\n\n\n\n\n\nmax_batch_size = 0\n", f);
    fclose(f);
    char want[256];
    cfg_defaults(&A);
    CHECK(cfg_load_file(&A, path, err, sizeof err) == -EINVAL, "bad file loaded");
    snprintf(want, sizeof want, "%s:12: [engine] max_batch_size = 0: must be 1..1024", path);
    CHECK(!strcmp(err, want), "'%s' != '%s'", err, want);
    f = fopen(path, "w");
    fputs("[engine]\r\nthreads = 6\r\n[sampling]\nseed = 42", f);
    fclose(f);
    CHECK(cfg_load_file(&A, path, err, sizeof err) == 0 && A.engine.threads == 6 &&
          A.sampling.seed == 42, "good file: %s", err);
    /* NUL bytes in a file */
    f = fopen(path, "w");
    fwrite("[engine]\nthreads = 6\0\n", 1, 22, f);
    fclose(f);
    CHECK(cfg_load_file(&A, path, err, sizeof err) == -EINVAL && strstr(err, ":2: NUL byte"), "%s", err);
    /* A dumped config as a file */
    static char d[CFG_DUMP_MAX];
    CHECK(load(&B, full) == 0, "%s", err);
    cfg_dump(&B, d, sizeof d);
    f = fopen(path, "w");
    fputs(d, f);
    fclose(f);
    cfg_defaults(&A);
    CHECK(cfg_load_file(&A, path, err, sizeof err) == 0 && cfg_equal(&A, &B), "dump file: %s", err);
    unlink(path);
    /* Missing file: the path and strerror. */
    int r = cfg_load_file(&A, path, err, sizeof err);
    snprintf(want, sizeof want, "%s: cannot open: %s", path, strerror(ENOENT));
    CHECK(r == -ENOENT && !strcmp(err, want), "missing: %d '%s'", r, err);
    /* A directory opens but does not read. */
    r = cfg_load_file(&A, dir, err, sizeof err);
    CHECK(r == -EISDIR && strstr(err, dir) && strstr(err, strerror(EISDIR)), "dir: %d '%s'", r, err);
    rmdir(dir);
    /* The shipped example (run from the repo root) loads and spells out the defaults. */
    cfg_defaults(&A);
    r = cfg_load_file(&A, "kiln.ini.example", err, sizeof err);
    CHECK(r == 0 || r == -ENOENT, "kiln.ini.example: %s", err);
    cfg_defaults(&B);
    CHECK(r != 0 || cfg_equal(&A, &B), "kiln.ini.example is not the defaults");
    /* NULL / zero-length error buffers are fine; tiny ones truncate. */
    cfg_defaults(&A);
    CHECK(cfg_load_string(&A, "[x]\na=1\n", NULL, 0) == -EINVAL, "null err");
    char tiny[8];
    CHECK(cfg_load_string(&A, "[x]\na=1\n", tiny, sizeof tiny) == -EINVAL && strlen(tiny) == 7, "tiny");
}

int main(void) {
    test_defaults();
    test_every_key();
    test_bounds();
    test_names_syntax();
    test_cross();
    test_model_check();
    test_dump();
    test_files();
    return check_done("config");
}
