/* image_test: the signed manifest and the bundle (image/manifest.h, image/bundle.h).
 * Round trip, deterministic signatures, a wrong key, every single-byte change and every
 * truncation of a signed manifest refused, strict parsing of odd manifests and keys, and a
 * bundle with a flipped byte in a part. Built with ASan+UBSan; prints one line per check. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "image/bundle.h"
#include "image/manifest.h"

static int failed, passed;
static char err[512];

#define CHECK(cond, ...)                                                            \
    do {                                                                            \
        if (cond) passed++;                                                         \
        else {                                                                      \
            failed++;                                                               \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                    \
            fprintf(stderr, __VA_ARGS__);                                           \
            fprintf(stderr, " (%s)\n", err);                                        \
        }                                                                           \
    } while (0)

static uint8_t priv_a[MAN_PRIV_LEN], pub_a[MAN_PUB_LEN], priv_b[MAN_PRIV_LEN], pub_b[MAN_PUB_LEN];

static void example(man_manifest *m) {
    memset(m, 0, sizeof *m);
    m->version = 7;
    m->build_time = 1700000000;
    m->nparts = 2;
    strcpy(m->parts[0].name, "uki");
    m->parts[0].size = 12345;
    memset(m->parts[0].sha256, 0xab, 32);
    strcpy(m->parts[1].name, "extra-2");
    m->parts[1].size = 0;
    memset(m->parts[1].sha256, 0x01, 32);
}

/* parse + verify with pub: 0 only if both pass */
static int accept(const char *text, size_t len, const uint8_t *pub) {
    man_manifest m;
    int r = man_parse(text, len, &m, err, sizeof err);
    if (r < 0) return r;
    return man_verify(&m, text, pub, err, sizeof err);
}

static void test_roundtrip(void) {
    man_manifest m, p;
    char a[MAN_MAX + 1], b[MAN_MAX + 1];
    example(&m);
    int n = man_sign(&m, priv_a, a, sizeof a, err, sizeof err);
    CHECK(n > 0, "sign");
    example(&m);
    int n2 = man_sign(&m, priv_a, b, sizeof b, err, sizeof err);
    CHECK(n == n2 && !memcmp(a, b, (size_t)n), "deterministic signature: same key, same text, same bytes");
    CHECK(man_parse(a, (size_t)n, &p, err, sizeof err) == 0, "parse signed");
    CHECK(p.version == 7 && p.build_time == 1700000000 && p.nparts == 2 && p.parts[0].size == 12345 &&
              !strcmp(p.parts[1].name, "extra-2") && p.parts[0].sha256[31] == 0xab,
          "fields survive");
    CHECK(man_verify(&p, a, pub_a, err, sizeof err) == 0, "good signature");
    CHECK(man_verify(&p, a, pub_b, err, sizeof err) == -EPERM, "another key's signature refused");
    CHECK(man_find(&p, "uki") == &p.parts[0] && !man_find(&p, "nope"), "find");

    /* every single-byte change and every truncation is refused */
    int changed_ok = 0, trunc_ok = 0;
    for (int i = 0; i < n; i++) {
        char t[MAN_MAX + 1];
        memcpy(t, a, (size_t)n);
        t[i] ^= (t[i] == '\n') ? 0x01 : 0x04;
        if (accept(t, (size_t)n, pub_a) < 0) changed_ok++;
        else fprintf(stderr, "byte %d changed and accepted\n", i);
        if (accept(a, (size_t)i, pub_a) < 0) trunc_ok++;
    }
    CHECK(changed_ok == n, "each of %d one-byte changes refused", n);
    CHECK(trunc_ok == n, "each of %d truncations refused", n);
    char t[MAN_MAX + 2];
    memcpy(t, a, (size_t)n);
    t[n] = '\n';
    CHECK(accept(t, (size_t)n + 1, pub_a) < 0, "a byte after the sig line refused");
}

static void test_strict(void) {
    static const char *bad[] = {
        "",
        "kiln-manifest 2\nversion 1\nbuild-time 0\npart uki 1 " "0000000000000000000000000000000000000000000000000000000000000000\nsig ",
        "kiln-manifest 1\nversion 0\nbuild-time 0\n",
        "kiln-manifest 1\nversion 01\nbuild-time 0\n",
        "kiln-manifest 1\nversion 4294967296\nbuild-time 0\n",
        "kiln-manifest 1\nversion 1\nbuild-time -1\n",
        "kiln-manifest 1\nversion 1\nbuild-time 99999999999999999999999\n",
        "kiln-manifest 1\r\nversion 1\n",
        "kiln-manifest 1\nversion 1\nbuild-time 0\nsig 00\n",
        "kiln-manifest 1\nversion 1\nbuild-time 0\npart UKI 1 0000000000000000000000000000000000000000000000000000000000000000\n",
        "kiln-manifest 1\nversion 1\nbuild-time 0\npart uki 1 00000000000000000000000000000000000000000000000000000000000000\n",
        "kiln-manifest 1\nversion 1\nbuild-time 0\npart uki  1 0000000000000000000000000000000000000000000000000000000000000000\n",
        "kiln-manifest 1\nversion 1\nbuild-time 0\npart uki 1 0000000000000000000000000000000000000000000000000000000000000000",
        "kiln-manifest 1\nversion 1\nbuild-time 0\nnote hi\n",
    };
    man_manifest m;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(man_parse(bad[i], strlen(bad[i]), &m, err, sizeof err) < 0 && err[0], "bad manifest %zu refused with a message", i);
    /* a NUL inside */
    char nul[] = "kiln-manifest 1\nversion 1\0build-time 0\n";
    CHECK(man_parse(nul, sizeof nul - 1, &m, err, sizeof err) < 0, "NUL refused");
    /* duplicate part names; too many parts; too large */
    char big[MAN_MAX * 2];
    int n = snprintf(big, sizeof big, "kiln-manifest 1\nversion 1\nbuild-time 0\n");
    for (int i = 0; i < 2; i++)
        n += snprintf(big + n, sizeof big - (size_t)n, "part a 1 %064d\n", 0);
    CHECK(man_parse(big, (size_t)n, &m, err, sizeof err) < 0 && strstr(err, "twice"), "duplicate part refused");
    n = snprintf(big, sizeof big, "kiln-manifest 1\nversion 1\nbuild-time 0\n");
    for (int i = 0; i < MAN_PARTS + 1; i++)
        n += snprintf(big + n, sizeof big - (size_t)n, "part p%d 1 %064d\n", i, 0);
    CHECK(man_parse(big, (size_t)n, &m, err, sizeof err) < 0 && strstr(err, "more than"), "too many parts refused");
    memset(big, 'a', sizeof big);
    CHECK(man_parse(big, MAN_MAX + 1, &m, err, sizeof err) == -E2BIG, "oversized refused");
    /* formatting refuses what parsing would */
    man_manifest f;
    example(&f);
    strcpy(f.parts[1].name, "uki");
    char out[MAN_MAX + 1];
    CHECK(man_sign(&f, priv_a, out, sizeof out, err, sizeof err) < 0, "sign refuses duplicate names");
    example(&f);
    f.version = 0;
    CHECK(man_sign(&f, priv_a, out, sizeof out, err, sizeof err) < 0, "sign refuses version 0");
}

static void test_keys(void) {
    char text[MAN_KEY_TEXT_MAX];
    uint8_t k[MAN_PUB_LEN];
    int n = man_key_format(1, priv_a, text, sizeof text);
    CHECK(n > 0 && man_key_parse(1, text, (size_t)n, k, err, sizeof err) == 0 && !memcmp(k, priv_a, MAN_PRIV_LEN), "private key round trip");
    n = man_key_format(0, pub_a, text, sizeof text);
    CHECK(n > 0 && man_key_parse(0, text, (size_t)n, k, err, sizeof err) == 0 && !memcmp(k, pub_a, MAN_PUB_LEN), "public key round trip");
    CHECK(man_key_parse(1, text, (size_t)n, k, err, sizeof err) < 0, "a public key is not a private one");
    text[30] = text[30] == '0' ? '1' : '0'; /* a point off the curve */
    CHECK(man_key_parse(0, text, (size_t)n, k, err, sizeof err) < 0, "a point off the curve refused");
    uint8_t zero[MAN_PRIV_LEN] = {0};
    n = man_key_format(1, zero, text, sizeof text);
    CHECK(man_key_parse(1, text, (size_t)n, k, err, sizeof err) < 0, "private key 0 refused");
    CHECK(man_key_parse(0, "garbage", 7, k, err, sizeof err) < 0, "garbage key refused");
}

static void test_bundle(void) {
    char path[] = "/tmp/kiln-image-test.XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    unlink(path);
    man_manifest m;
    memset(&m, 0, sizeof m);
    m.version = 3;
    m.nparts = 2;
    strcpy(m.parts[0].name, "uki");
    strcpy(m.parts[1].name, "b");
    static uint8_t p0[10000], p1[5];
    for (size_t i = 0; i < sizeof p0; i++) p0[i] = (uint8_t)(i * 7);
    memcpy(p1, "hello", 5);
    m.parts[0].size = sizeof p0;
    m.parts[1].size = sizeof p1;
    man_sha s;
    man_sha_init(&s), man_sha_update(&s, p0, sizeof p0), man_sha_final(&s, m.parts[0].sha256);
    man_sha_init(&s), man_sha_update(&s, p1, sizeof p1), man_sha_final(&s, m.parts[1].sha256);
    char text[MAN_MAX + 1];
    int n = man_sign(&m, priv_a, text, sizeof text, err, sizeof err);
    CHECK(bun_part_offset(&m, 1) == BUN_HEAD + 12288 && bun_length(&m) == BUN_HEAD + 12288 + 5, "layout");
    static char buf[BUN_HEAD + 12288 + 5];
    memcpy(buf, text, (size_t)n);
    memcpy(buf + BUN_HEAD, p0, sizeof p0);
    memcpy(buf + bun_part_offset(&m, 1), p1, sizeof p1);
    /* at an offset, as in a disk image */
    CHECK(pwrite(fd, buf, sizeof buf, 8192) == (ssize_t)sizeof buf, "write");
    man_manifest v;
    CHECK(bun_verify(fd, 8192, sizeof buf, pub_a, &v, err, sizeof err) == 0 && v.version == 3, "bundle verifies");
    CHECK(bun_verify(fd, 8192, sizeof buf, pub_b, &v, err, sizeof err) == -EPERM, "bundle with another key refused");
    CHECK(bun_verify(fd, 8192, sizeof buf - 1, pub_a, &v, err, sizeof err) == -EFBIG, "bundle larger than its room refused");
    char x = buf[BUN_HEAD + 5000] ^ 1;
    CHECK(pwrite(fd, &x, 1, 8192 + BUN_HEAD + 5000) == 1, "flip");
    CHECK(bun_verify(fd, 8192, sizeof buf, pub_a, &v, err, sizeof err) == -EPERM && strstr(err, "`uki`"), "flipped byte in a part refused, named");
    CHECK(pwrite(fd, buf + BUN_HEAD + 5000, 1, 8192 + BUN_HEAD + 5000) == 1, "unflip");
    CHECK(ftruncate(fd, 8192 + (off_t)sizeof buf - 2) == 0, "truncate");
    CHECK(bun_verify(fd, 8192, 0, pub_a, &v, err, sizeof err) < 0 && strstr(err, "truncated"), "truncated bundle refused");
    CHECK(bun_verify(fd, 0, 0, pub_a, &v, err, sizeof err) < 0, "zeros are not a bundle");
    char junk = 'x';
    CHECK(pwrite(fd, &junk, 1, 8192 + BUN_HEAD - 1) == 1, "junk");
    CHECK(bun_verify(fd, 8192, 0, pub_a, &v, err, sizeof err) < 0 && strstr(err, "stray"), "junk in the manifest block refused");
    close(fd);

    /* a copy of a part (the ESP's UKI, which kiln-init's `slot` checks) */
    char cpath[] = "/tmp/kiln-image-copy.XXXXXX";
    int c = mkstemp(cpath);
    CHECK(c >= 0, "mkstemp");
    if (c < 0) return;
    unlink(cpath);
    CHECK(pwrite(c, p0, sizeof p0, 0) == (ssize_t)sizeof p0, "write copy");
    CHECK(bun_check_copy(c, &m.parts[0], err, sizeof err) == 0, "an exact copy of a part passes");
    CHECK(bun_check_copy(c, &m.parts[1], err, sizeof err) == -EPERM, "a copy of another part refused");
    x = (char)(p0[9999] ^ 0x40);
    CHECK(pwrite(c, &x, 1, 9999) == 1 && bun_check_copy(c, &m.parts[0], err, sizeof err) == -EPERM &&
          strstr(err, "sha256"), "a copy with a flipped byte refused");
    CHECK(pwrite(c, p0 + 9999, 1, 9999) == 1 && pwrite(c, "z", 1, sizeof p0) == 1 &&
          bun_check_copy(c, &m.parts[0], err, sizeof err) == -EPERM && strstr(err, "bytes"), "a longer copy refused");
    CHECK(ftruncate(c, sizeof p0 - 1) == 0 && bun_check_copy(c, &m.parts[0], err, sizeof err) == -EPERM, "a shorter copy refused");
    close(c);
}

int main(void) {
    CHECK(man_keygen(priv_a, pub_a, err, sizeof err) == 0, "keygen a");
    CHECK(man_keygen(priv_b, pub_b, err, sizeof err) == 0, "keygen b");
    test_roundtrip();
    test_strict();
    test_keys();
    test_bundle();
    printf("image_test: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
