/* identity_test: how kiln-init destroys a provisioned identity's plaintext once it is sealed
 * (boot/identity.c id_wipe_dir), on the host: each file is overwritten with zeros in place
 * (a second hard link, made before, reads back as zeros of the same length: the blocks
 * were rewritten, not released), then unlinked, and the folder removed; a file that is
 * absent is not an error; a symlink in a file's place is not followed (what it points to
 * is untouched) and the wipe says so; an extra file keeps the folder and says so. And
 * the key made on the box (keygen): its certificate's, naming kiln.ini's address, the
 * fingerprint printed that of the certificate kept. The folders are under /tmp. Built
 * with ASan+UBSan; run by init_test.sh. */
#include "boot/identity.c"

#include <stdlib.h>

static int failed, passed;
#define CHECK(cond, what)                                                            \
    do {                                                                             \
        if (cond) passed++;                                                          \
        else failed++, fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, what); \
    } while (0)

static char base[64], prov[96], keep[96];

static void put(const char *dir, const char *name, const char *text) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) perror(p), exit(2);
    close(fd);
}

/* 1 when path holds n bytes, all zero */
static int zeros(const char *path, size_t n) {
    uint8_t b[256];
    ssize_t got = read_bin(path, b, sizeof b - 1);
    if (got != (ssize_t)n) return 0;
    for (size_t i = 0; i < n; i++)
        if (b[i]) return 0;
    return 1;
}

static int gone(const char *dir, const char *name) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) < 0 && errno == ENOENT;
}

static void fresh(void) {
    mkdir(prov, 0700);
    mkdir(keep, 0700);
}

static void links(void) {
    for (int i = 0; i < 3; i++) {
        char a[256], b[256];
        snprintf(a, sizeof a, "%s/%s", prov, names[i]);
        snprintf(b, sizeof b, "%s/%s", keep, names[i]);
        unlink(b);
        if (link(a, b) < 0) perror(b), exit(2);
    }
}

int main(void) {
    char why[200], p[256];
    snprintf(base, sizeof base, "/tmp/kiln-identity-test.%d", (int)getpid());
    snprintf(prov, sizeof prov, "%s/provision", base);
    snprintf(keep, sizeof keep, "%s/links", base);
    mkdir(base, 0700);

    /* the three files: zeros in place, then gone, the folder too */
    fresh();
    static const char *const text[3] = {"-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIFejkskBCBSKguj\n-----END EC PRIVATE KEY-----\n",
                                        "user user-0123456789abcdef\nadmin admin-0123456789abcdef\n",
                                        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"};
    for (int i = 0; i < 3; i++) put(prov, names[i], text[i]);
    links();
    int e = id_wipe_dir(prov, base, why, sizeof why);
    CHECK(e == 0, "wipe of three files succeeds");
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", keep, names[i]);
        CHECK(zeros(p, strlen(text[i])), "the file's blocks hold zeros of its length (its other hard link reads them)");
        CHECK(gone(prov, names[i]), "its name in the provision folder is gone");
    }
    CHECK(access(prov, F_OK) < 0 && errno == ENOENT, "the provision folder is removed");

    /* a file missing: not an error */
    fresh();
    put(prov, "server.key", "key");
    put(prov, "tokens.txt", "tokens");
    CHECK(id_wipe_dir(prov, base, why, sizeof why) == 0, "no server.crt: still wiped and removed");
    CHECK(access(prov, F_OK) < 0, "the folder is gone");

    /* a symlink where the key was: not followed, said */
    fresh();
    put(keep, "outside", "not to be touched");
    snprintf(p, sizeof p, "%s/outside", keep);
    char k[256];
    snprintf(k, sizeof k, "%s/server.key", prov);
    if (symlink(p, k) < 0) perror(k), exit(2);
    e = id_wipe_dir(prov, base, why, sizeof why);
    CHECK(e == -ELOOP && strstr(why, "server.key"), "a symlink in the key's place is refused, named");
    char b[64] = {0};
    CHECK(read_bin(p, (uint8_t *)b, sizeof b - 1) == 17 && !strcmp(b, "not to be touched"), "what it points to is untouched");
    unlink(k);

    /* an extra file: the three wiped, the folder kept, said */
    put(prov, "server.key", "key");
    put(prov, "notes", "the operator's");
    e = id_wipe_dir(prov, base, why, sizeof why);
    CHECK(e == -ENOTEMPTY && strstr(why, "rmdir"), "an extra file keeps the folder, the error says rmdir");
    CHECK(gone(prov, "server.key") && !gone(prov, "notes"), "the key is gone, the other file stays");
    snprintf(p, sizeof p, "%s/notes", prov);
    unlink(p);
    rmdir(prov);

    /* no folder at all */
    CHECK(id_wipe_dir(prov, base, why, sizeof why) == -ENOENT, "no folder: -ENOENT");

    /* keygen: a key that is its certificate's, the address kiln.ini gives as the
     * certificate's IP name, the fingerprint of the certificate kept */
    char ini[256], kp[256], cp[256], fp[100], why2[200];
    snprintf(ini, sizeof ini, "%s/kiln.ini", base);
    put(base, "kiln.ini", "[net]\naddress = 10.0.2.15/24\n");
    snprintf(kp, sizeof kp, "%s/made.key", base);
    snprintf(cp, sizeof cp, "%s/made.crt", base);
    CHECK(keygen(ini, kp, cp, fp, sizeof fp, why2, sizeof why2) == 0, "keygen succeeds");
    mbedtls_pk_context pk;
    mbedtls_x509_crt crt;
    mbedtls_pk_init(&pk);
    mbedtls_x509_crt_init(&crt);
    CHECK(mbedtls_pk_parse_keyfile(&pk, kp, NULL, kg_rng, NULL) == 0, "the key parses (PEM)");
    CHECK(mbedtls_x509_crt_parse_file(&crt, cp) == 0, "the certificate parses (PEM)");
    CHECK(mbedtls_pk_check_pair(&crt.pk, &pk, kg_rng, NULL) == 0, "the key is the certificate's");
    uint8_t h[32];
    char want[100];
    man_sha sh;
    man_sha_init(&sh);
    man_sha_update(&sh, crt.raw.p, crt.raw.len);
    man_sha_final(&sh, h);
    size_t at = 0;
    for (int i = 0; i < 32; i++) at += (size_t)snprintf(want + at, sizeof want - at, "%s%02X", i ? ":" : "", h[i]);
    CHECK(!strcmp(fp, want) && strlen(fp) == 95, "the fingerprint is the certificate's SHA-256, AA:BB:...");
    const unsigned char ip[4] = {10, 0, 2, 15};
    int has_ip = 0;
    for (const mbedtls_x509_sequence *q = &crt.subject_alt_names; q && q->buf.p; q = q->next)
        if (q->buf.len == 4 && !memcmp(q->buf.p, ip, 4)) has_ip = 1;
    CHECK(has_ip, "the certificate names 10.0.2.15 (kiln.ini's address)");
    struct stat kst;
    CHECK(stat(kp, &kst) == 0 && (kst.st_mode & 0777) == 0600, "the key is 0600");
    mbedtls_pk_free(&pk);
    mbedtls_x509_crt_free(&crt);
    unlink(kp), unlink(cp), unlink(ini);

    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", keep, names[i]);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/outside", keep);
    unlink(p);
    rmdir(keep);
    rmdir(base);
    printf("identity_test: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
