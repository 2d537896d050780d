/* deps_smoke.c: link test for the third-party libraries built by scripts/deps.sh.
 *
 * Uses each library a little (mbedTLS: version, PSA init with the OS entropy source, a TLS
 * server config; lwIP: init and a TCP pcb; inih: parse a string; yyjson: parse a document
 * inside a fixed pool, refuse a trailing comma) and prints the versions.
 * Exit status 0 when all worked. deps.sh builds it per toolchain (static for musl):
 *   cc -Ibuild/<tc>/deps/include deps_smoke.c -Lbuild/<tc>/deps/lib \
 *      -lmbedtls -lmbedx509 -lmbedcrypto -llwip -linih -lyyjson
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mbedtls/ssl.h"
#include "mbedtls/version.h"
#include "psa/crypto.h"

#include "lwip/init.h"
#include "lwip/sys.h"
#include "lwip/tcp.h"

#include "ini.h"

#include "yyjson.h"

#ifndef KILN_INIH_VERSION
#define KILN_INIH_VERSION "?"
#endif

/* ---------------------------------------------------------------- lwIP port (NO_SYS=1) */
u32_t sys_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (u32_t)((uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u);
}

uint32_t kiln_lwip_rand(void)
{
    static uint32_t x = 2463534242u; /* xorshift32: enough for a link test */
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return x;
}

int kiln_lwip_tcp_in(const struct tcp_pcb *pcb, const struct tcp_hdr *hdr)
{
    (void)pcb;
    (void)hdr;
    return 0; /* ERR_OK: lwIP goes on with the segment */
}

/* ---------------------------------------------------------------- inih */
struct smoke_ini {
    int port;  /* [server] port */
    int names; /* name = value pairs seen */
};

static int on_ini(void *user, const char *section, const char *name, const char *value)
{
    struct smoke_ini *c = user;
    c->names++;
    if (strcmp(section, "server") == 0 && strcmp(name, "port") == 0)
        c->port = (int)strtol(value, NULL, 10);
    return 1;
}

int main(void)
{
    int fails = 0;

    /* mbedTLS */
    char mver[32] = {0};
    mbedtls_version_get_string(mver);
    psa_status_t ps = psa_crypto_init();
    if (ps != PSA_SUCCESS) {
        fprintf(stderr, "deps_smoke: psa_crypto_init: %d\n", (int)ps);
        fails++;
    }
    mbedtls_ssl_config conf;
    mbedtls_ssl_config_init(&conf);
    int rc = mbedtls_ssl_config_defaults(&conf, MBEDTLS_SSL_IS_SERVER,
                                         MBEDTLS_SSL_TRANSPORT_STREAM,
                                         MBEDTLS_SSL_PRESET_DEFAULT);
    if (rc != 0) {
        fprintf(stderr, "deps_smoke: mbedtls_ssl_config_defaults: -0x%04x\n", (unsigned)-rc);
        fails++;
    }
    mbedtls_ssl_config_free(&conf);
    mbedtls_psa_crypto_free();

    /* lwIP */
    lwip_init();
    struct tcp_pcb *pcb = tcp_new_ip_type(IPADDR_TYPE_ANY);
    if (pcb == NULL) {
        fprintf(stderr, "deps_smoke: tcp_new_ip_type failed\n");
        fails++;
    } else if (tcp_close(pcb) != ERR_OK) {
        fprintf(stderr, "deps_smoke: tcp_close failed\n");
        fails++;
    }

    /* inih */
    struct smoke_ini ini = {0};
    rc = ini_parse_string("; kiln\n[server]\nport = 8443\n[model]\npath = m.gguf\n", on_ini, &ini);
    if (rc != 0 || ini.port != 8443 || ini.names != 2) {
        fprintf(stderr, "deps_smoke: ini_parse_string: rc=%d port=%d names=%d\n", rc, ini.port,
                ini.names);
        fails++;
    }

    /* yyjson: on a fixed pool (how the server reads request bodies), strict RFC 8259 */
    static char pool[4096];
    yyjson_alc alc;
    char js[] = "{\"model\":\"m\",\"n\":2}", bad[] = "{\"n\":2,}";
    yyjson_doc *doc = yyjson_alc_pool_init(&alc, pool, sizeof pool)
                          ? yyjson_read_opts(js, strlen(js), 0, &alc, NULL) : NULL;
    if (!doc || yyjson_get_int(yyjson_obj_get(yyjson_doc_get_root(doc), "n")) != 2) {
        fprintf(stderr, "deps_smoke: yyjson_read_opts failed\n");
        fails++;
    }
    yyjson_doc_free(doc);
    if ((doc = yyjson_read_opts(bad, strlen(bad), 0, &alc, NULL)) != NULL) {
        fprintf(stderr, "deps_smoke: yyjson took a trailing comma\n");
        yyjson_doc_free(doc);
        fails++;
    }

    printf("mbedtls %s, lwip %s, inih r%s, yyjson %s: %s\n", mver, LWIP_VERSION_STRING,
           KILN_INIH_VERSION, YYJSON_VERSION_STRING, fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
