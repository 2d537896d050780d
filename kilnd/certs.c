/* certs: `kilnd certs --dir DIR [--hosts h1,h2] [--force]`, a development CA with a
 * server and a client certificate signed by it (net/tls.h). */
#include <stdio.h>
#include <string.h>

#include "kilnd/kilnd.h"
#include "net/tls.h"

int kd_certs(int argc, char **argv) {
    const char *dir = NULL, *hosts = "";
    int force = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--force")) { force = 1; continue; }
        if (i + 1 >= argc) { fprintf(stderr, "kilnd: %s needs a value\n", argv[i]); return 2; }
        if (!strcmp(argv[i], "--dir")) dir = argv[++i];
        else if (!strcmp(argv[i], "--hosts")) hosts = argv[++i];
        else { fprintf(stderr, "kilnd: unknown flag '%s'\n", argv[i]); return 2; }
    }
    if (!dir) { fprintf(stderr, "kilnd: certs needs --dir DIR\n"); return 2; }
    char err[512];
    if (tls_certs_create(dir, hosts, force, err, sizeof err) < 0) {
        fprintf(stderr, "kilnd: certs: %s\n", err);
        return 1;
    }
    printf("kilnd: development CA and certificates in %s (ca.crt, server.crt/key, client.crt/key)\n", dir);
    return 0;
}
