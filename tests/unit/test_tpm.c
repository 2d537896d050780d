/* test_tpm: boot/tpm, kiln-init's TPM 2.0 client. The commands' bytes as the specification
 * lays them out; recorded responses, good and bad, cut at every length (a bad one is refused,
 * none crashes); the transport over a socket (a response in pieces, bytes after it, the other
 * end closing); and, where swtpm is installed (Debian package swtpm; make test's tools
 * install it), the real thing: Startup before and after the TPM is started, PCR_Read,
 * PCR_Extend and the value it leaves, SHA-256(old || digest), computed here with mbedTLS. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "boot/tpm.c"
#include "mbedtls/sha256.h"
#include "tests/unit/check.h"

static void extend_ref(uint8_t pcr[32], const uint8_t digest[32]) {
    uint8_t both[64];
    memcpy(both, pcr, 32);
    memcpy(both + 32, digest, 32);
    mbedtls_sha256(both, sizeof both, pcr, 0);
}

static void hex(const uint8_t *p, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", p[i]);
}

/* ---------------------------------------------------------------- commands */

static void test_commands(void) {
    uint8_t b[128], d[32];
    memset(d, 0xab, sizeof d);
    static const uint8_t startup[] = {0x80, 0x01, 0, 0, 0, 12, 0, 0, 0x01, 0x44, 0, 0};
    CHECK(tpm_cmd_startup(b, sizeof b) == sizeof startup && !memcmp(b, startup, sizeof startup), "Startup(CLEAR) bytes");
    static const uint8_t read15[] = {0x80, 0x01, 0, 0, 0, 20, 0, 0, 0x01, 0x7e, 0, 0, 0, 1, 0, 0x0b, 3, 0x00, 0x80, 0x00};
    CHECK(tpm_cmd_pcr_read(b, sizeof b, 15) == sizeof read15 && !memcmp(b, read15, sizeof read15), "PCR_Read(15) bytes");
    size_t n = tpm_cmd_pcr_extend(b, sizeof b, 15, d);
    static const uint8_t ext_head[] = {0x80, 0x02, 0, 0, 0, 65, 0, 0, 0x01, 0x82, 0, 0, 0, 15, /* handle */
                                       0, 0, 0, 9, 0x40, 0, 0, 0x09, 0, 0, 0, 0, 0,             /* TPM_RS_PW */
                                       0, 0, 0, 1, 0, 0x0b};                                  /* 1 digest */
    CHECK(n == 65 && !memcmp(b, ext_head, sizeof ext_head) && !memcmp(b + sizeof ext_head, d, 32), "PCR_Extend(15) bytes (%zu)", n);
    CHECK(tpm_cmd_pcr_extend(b, 64, 15, d) == 0, "a command that does not fit is refused");
    CHECK(tpm_cmd_startup(b, 11) == 0, "Startup in 11 bytes");
    CHECK(tpm_cmd_pcr_read(b, sizeof b, 24) == 0 && tpm_cmd_pcr_read(b, sizeof b, -1) == 0, "PCR numbers past 0..23");
    CHECK(tpm_cmd_pcr_extend(b, sizeof b, 24, d) == 0, "extend of PCR 24");
}

/* ---------------------------------------------------------------- recorded responses */

/* A PCR_Read(15) response as swtpm gives it: counter 0x2a, the selection echoed, one value. */
static size_t pcr_read_rsp(uint8_t *r, const uint8_t value[32]) {
    static const uint8_t head[] = {0x80, 0x01, 0, 0, 0, 0,    0, 0, 0, 0,         /* header, size below */
                                   0,    0,    0, 0x2a,                           /* pcrUpdateCounter */
                                   0,    0,    0, 1, 0, 0x0b, 3, 0x00, 0x80, 0x00, /* pcrSelectionOut */
                                   0,    0,    0, 1, 0, 32};                      /* pcrValues: 1 of 32 bytes */
    memcpy(r, head, sizeof head);
    memcpy(r + sizeof head, value, 32);
    size_t n = sizeof head + 32;
    r[5] = (uint8_t)n;
    return n;
}

static void test_responses(void) {
    uint8_t r[256], v[32], out[32];
    uint32_t rc = 7;
    for (int i = 0; i < 32; i++) v[i] = (uint8_t)(i * 7 + 1);
    size_t n = pcr_read_rsp(r, v);
    CHECK(tpm_rsp_pcr_read(r, n, 15, out, &rc) == 0 && rc == 0 && !memcmp(out, v, 32), "a good PCR_Read response");
    CHECK(tpm_rsp_pcr_read(r, n, 14, out, &rc) == -EPROTO, "a response about another PCR than asked");
    /* Every cut: the size field no longer matches, or the body is short. */
    int cuts_ok = 1;
    for (size_t k = 0; k < n; k++) cuts_ok &= tpm_rsp_pcr_read(r, k, 15, out, &rc) == -EPROTO;
    CHECK(cuts_ok, "every cut of a good response is refused");
    /* The same cuts with a size field that agrees (a TPM that lies consistently). */
    cuts_ok = 1;
    for (size_t k = 10; k < n; k++) {
        uint8_t c[256];
        memcpy(c, r, k);
        c[5] = (uint8_t)k;
        cuts_ok &= tpm_rsp_pcr_read(c, k, 15, out, &rc) == -EPROTO;
    }
    CHECK(cuts_ok, "every shortened response with a matching size field is refused");
    uint8_t c[256];
    memcpy(c, r, n);
    c[n] = 0, c[5] = (uint8_t)(n + 1);
    CHECK(tpm_rsp_pcr_read(c, n + 1, 15, out, &rc) == -EPROTO, "a byte after the value");
    memcpy(c, r, n), c[29] = 20; /* the value says 20 bytes (a SHA-1 PCR) */
    CHECK(tpm_rsp_pcr_read(c, n, 15, out, &rc) == -EPROTO, "a value that is not 32 bytes");
    memcpy(c, r, n), c[20] = 0x04; /* a bank of SHA-1 */
    CHECK(tpm_rsp_pcr_read(c, n, 15, out, &rc) == -EPROTO, "a value from another bank");
    memcpy(c, r, n), c[23] = 0x81; /* PCR 8 too */
    CHECK(tpm_rsp_pcr_read(c, n, 15, out, &rc) == -EPROTO, "two PCRs selected, one value");
    memcpy(c, r, n), c[20] = 0xff; /* sizeofSelect 255: more bitmap than there are bytes */
    CHECK(tpm_rsp_pcr_read(c, n, 15, out, &rc) == -EPROTO, "a PCR bitmap longer than the response");
    memcpy(c, r, n), c[14] = 0xff; /* 0xff000001 banks */
    CHECK(tpm_rsp_pcr_read(c, n, 15, out, &rc) == -EPROTO, "a bank count past the response");
    memcpy(c, r, n), c[27] = 0xff;
    CHECK(tpm_rsp_pcr_read(c, n, 15, out, &rc) == -EPROTO, "a value count past the response");
    /* No SHA-256 bank: the TPM selects nothing and returns no value. */
    static const uint8_t none[] = {0x80, 0x01, 0, 0, 0, 22, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0};
    CHECK(tpm_rsp_pcr_read(none, sizeof none, 15, out, &rc) == -ENOENT, "no SHA-256 bank: -ENOENT");
    /* Errors: the header alone, without sessions. */
    static const uint8_t init[] = {0x80, 0x01, 0, 0, 0, 10, 0, 0, 0x01, 0x00};
    CHECK(tpm_rsp_pcr_read(init, sizeof init, 15, out, &rc) == 0 && rc == 0x100, "an error response gives its code");
    static const uint8_t err_long[] = {0x80, 0x01, 0, 0, 0, 12, 0, 0, 0x01, 0x00, 0, 0};
    CHECK(tpm_rsp_header(err_long, sizeof err_long, &rc) == -EPROTO, "an error response with a body");
    static const uint8_t err_sess[] = {0x80, 0x02, 0, 0, 0, 10, 0, 0, 0x09, 0x22};
    CHECK(tpm_rsp_header(err_sess, sizeof err_sess, &rc) == -EPROTO, "an error response tagged with sessions");
    static const uint8_t bad_tag[] = {0x00, 0xc4, 0, 0, 0, 10, 0, 0, 0, 0}; /* a TPM 1.2 response */
    CHECK(tpm_rsp_header(bad_tag, sizeof bad_tag, &rc) == -EPROTO, "a TPM 1.2 tag");
    /* PCR_Extend's answer: an empty parameter area and the password session's reply. */
    static const uint8_t ext_ok[] = {0x80, 0x02, 0, 0, 0, 19, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0};
    CHECK(rsp_empty(ext_ok, sizeof ext_ok, &rc) == 0 && rc == 0, "PCR_Extend's response");
    int ok = 1;
    for (size_t k = 0; k < sizeof ext_ok; k++) {
        memcpy(c, ext_ok, k);
        if (k > 5) c[5] = (uint8_t)k;
        ok &= rsp_empty(c, k, &rc) == -EPROTO;
    }
    CHECK(ok, "every cut of PCR_Extend's response is refused");
    static const uint8_t ext_nonce[] = {0x80, 0x02, 0, 0, 0, 19, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 1, 0, 0};
    CHECK(rsp_empty(ext_nonce, sizeof ext_nonce, &rc) == -EPROTO, "a nonce longer than the response");
    char t[80];
    CHECK(!strcmp(tpm_rc_text(0x100, t, sizeof t), "TPM_RC_INITIALIZE (0x100)"), "%s", t);
    CHECK(strstr(tpm_rc_text(0x9a2, t, sizeof t), "0x9a2") && strstr(t, "session 1"), "%s", t);
    CHECK(strstr(tpm_rc_text(0x1c4, t, sizeof t), "parameter 1"), "%s", t);
}

/* ---------------------------------------------------------------- the transport */

static void test_transport(void) {
    int sv[2];
    uint8_t r[256], v[32], out[32];
    memset(v, 0x5a, sizeof v);
    size_t n = pcr_read_rsp(r, v);
    tpm_dev t;
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0) {
        CHECK(0, "socketpair: %s", strerror(errno));
        return;
    }
    tpm_use_fd(&t, sv[0]);
    /* A response in two pieces, the second after the client has started reading. */
    pid_t pid = fork();
    if (pid == 0) {
        uint8_t cmd[64];
        if (read(sv[1], cmd, sizeof cmd) <= 0) _exit(1);
        if (write(sv[1], r, 7) != 7) _exit(1);
        usleep(50 * 1000);
        _exit(write(sv[1], r + 7, n - 7) == (ssize_t)(n - 7) ? 0 : 1);
    }
    CHECK(tpm_pcr_read(&t, 15, out) == 0 && !memcmp(out, v, 32), "a response in two pieces");
    int st;
    waitpid(pid, &st, 0);
    /* Bytes after the response: the stream is out of step, refused. */
    uint8_t two[512];
    memcpy(two, r, n), memcpy(two + n, r, n);
    CHECK(write(sv[1], two, 2 * n) == (ssize_t)(2 * n), "write");
    CHECK(tpm_pcr_read(&t, 15, out) == -EPROTO, "bytes after the response");
    uint8_t drain[512];
    while (recv(sv[0], drain, sizeof drain, MSG_DONTWAIT) > 0) {}
    /* A size field larger than any response. */
    uint8_t big[10] = {0x80, 0x01, 0x00, 0x01, 0x00, 0x00, 0, 0, 0, 0};
    CHECK(write(sv[1], big, sizeof big) == sizeof big, "write");
    CHECK(tpm_pcr_read(&t, 15, out) == -EPROTO, "a response longer than TPM_BUF_MAX");
    while (recv(sv[0], drain, sizeof drain, MSG_DONTWAIT) > 0) {}
    /* The other end closes mid-response. */
    CHECK(write(sv[1], r, 12) == 12, "write");
    close(sv[1]);
    int e = tpm_pcr_read(&t, 15, out);
    CHECK(e == -EPIPE, "a close mid-response: %d", e);
    close(sv[0]);
    tpm_close(&t);
    CHECK(tpm_pcr_read(&t, 15, out) == -EBADF, "a closed device");
    CHECK(tpm_open(&t, "/nonexistent/tpm0") == -ENOENT && t.fd == -1, "no such device: -ENOENT");
}

/* ---------------------------------------------------------------- swtpm */

static pid_t swtpm_pid = -1;

static int have_swtpm(void) { return system("command -v swtpm >/dev/null 2>&1") == 0; }

/* swtpm with its TPM commands on dir/sock (raw, as /dev/tpm0 takes them); connected fd. */
static int start_swtpm(const char *dir) {
    char state[300], sock[300], ctrl[300];
    snprintf(state, sizeof state, "dir=%s", dir);
    snprintf(sock, sizeof sock, "type=unixio,path=%s/sock", dir);
    snprintf(ctrl, sizeof ctrl, "type=unixio,path=%s/ctrl", dir);
    swtpm_pid = fork();
    if (swtpm_pid == 0) {
        execlp("swtpm", "swtpm", "socket", "--tpm2", "--tpmstate", state, "--server", sock, "--ctrl", ctrl, "--flags",
               "not-need-init", (char *)NULL);
        _exit(127);
    }
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s/sock", dir);
    for (int i = 0; i < 100 && swtpm_pid > 0; i++) { /* up to 5 s for it to listen */
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0) return fd;
        if (fd >= 0) close(fd);
        usleep(50 * 1000);
    }
    return -1;
}

static void stop_swtpm(void) {
    if (swtpm_pid <= 0) return;
    kill(swtpm_pid, SIGTERM);
    int st;
    waitpid(swtpm_pid, &st, 0);
    swtpm_pid = -1;
}

/* Sealing on a started TPM whose PCR 15 is v (updated as it extends). */
static void test_seal(tpm_dev *t, uint8_t v[32], tpm_sealed *keep) {
    uint8_t policy[32], tp[32], d[32], secret[32], out[TPM_SEAL_MAX], buf[2 * TPM_BLOB_PART + 8];
    size_t n = 0;
    uint32_t session = 0;
    char txt[80];
    for (int i = 0; i < 32; i++) secret[i] = (uint8_t)(0xc0 + i);
    /* Our policy digest is the one the TPM arrives at. */
    tpm_policy_pcr(15, v, policy);
    int e = start_policy_session(t, &session);
    CHECK(e == 0, "StartAuthSession: %d %s", e, tpm_rc_text(t->rc, txt, sizeof txt));
    if (e == 0) {
        CHECK((e = policy_pcr(t, session, 15)) == 0, "PolicyPCR: %d %s", e, tpm_rc_text(t->rc, txt, sizeof txt));
        CHECK((e = policy_get_digest(t, session, tp)) == 0 && !memcmp(tp, policy, 32),
              "tpm_policy_pcr's digest is the TPM's PolicyPCR digest (%d)", e);
        CHECK(flush(t, session) == 0, "FlushContext of the session");
    }
    tpm_sealed s, s2, moved;
    CHECK((e = tpm_seal(t, policy, secret, sizeof secret, &s)) == 0, "seal to PCR 15 now: %d %s", e, tpm_rc_text(t->rc, txt, sizeof txt));
    CHECK(s.priv_len > 0 && s.pub_len > 0, "a blob (%u, %u bytes)", s.priv_len, s.pub_len);
    size_t bn = tpm_sealed_save(&s, buf, sizeof buf);
    CHECK(bn == 8u + s.priv_len + s.pub_len && tpm_sealed_load(&s2, buf, bn) == 0 && s2.priv_len == s.priv_len &&
              !memcmp(s2.pub, s.pub, s.pub_len), "the blob as bytes and back");
    int ok = 1;
    for (size_t k = 0; k < bn; k++) ok &= tpm_sealed_load(&moved, buf, k) == -EINVAL;
    CHECK(ok, "every cut of a saved blob is refused");
    buf[4] = 0xff;
    CHECK(tpm_sealed_load(&moved, buf, bn) == -EINVAL, "a blob part longer than TPM_BLOB_PART");
    for (int i = 0; i < 4; i++) { /* a few times: nothing is left loaded (3 transient slots) */
        memset(out, 0, sizeof out);
        e = tpm_unseal(t, &s2, 15, out, sizeof out, &n);
        CHECK(e == 0 && n == 32 && !memcmp(out, secret, 32), "unseal %d with PCR 15 as sealed: %d %s", i, e, tpm_rc_text(t->rc, txt, sizeof txt));
    }
    /* Sealed to the value PCR 15 will have after one more extend: not yet, then yes. */
    mbedtls_sha256((const uint8_t *)"next image", 10, d, 0);
    uint8_t next[32];
    memcpy(next, v, 32);
    extend_ref(next, d);
    tpm_policy_pcr(15, next, policy);
    tpm_sealed ahead;
    CHECK(tpm_seal(t, policy, secret, 20, &ahead) == 0, "seal to a predicted value");
    e = tpm_unseal(t, &ahead, 15, out, sizeof out, &n);
    CHECK(e == -EACCES, "before the extend: -EACCES (policy fail): %d %s", e, tpm_rc_text(t->rc, txt, sizeof txt));
    CHECK(tpm_pcr_extend(t, 15, d) == 0, "extend");
    memcpy(v, next, 32);
    e = tpm_unseal(t, &ahead, 15, out, sizeof out, &n);
    CHECK(e == 0 && n == 20 && !memcmp(out, secret, 20), "after it: unsealed (%d)", e);
    e = tpm_unseal(t, &s2, 15, out, sizeof out, &n);
    CHECK(e == -EACCES && n == 0, "the first blob no longer unseals (PCR 15 moved on): %d", e);
    CHECK(tpm_unseal(t, &ahead, 15, out, 4, &n) == -EMSGSIZE, "a secret larger than the caller's buffer");
    CHECK(tpm_seal(t, policy, out, TPM_SEAL_MAX + 1, &moved) == -EMSGSIZE, "more than TPM_SEAL_MAX bytes");
    CHECK(tpm_seal(t, policy, out, TPM_SEAL_MAX, &moved) == 0, "TPM_SEAL_MAX bytes");
    moved = ahead;
    moved.priv[moved.priv_len / 2] ^= 1;
    e = tpm_unseal(t, &moved, 15, out, sizeof out, &n);
    CHECK(e == -ENOKEY, "a damaged blob does not load: %d %s", e, tpm_rc_text(t->rc, txt, sizeof txt));
    *keep = ahead;
}

static void test_swtpm(void) {
    if (!have_swtpm()) {
        SKIP("swtpm: not installed (Debian package swtpm): the commands were not run against a TPM");
        return;
    }
    char dir[] = "/tmp/kiln-test-tpm-XXXXXX", cmd[400];
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp: %s", strerror(errno));
        return;
    }
    int fd = start_swtpm(dir);
    CHECK(fd >= 0, "swtpm did not listen on %s/sock", dir);
    if (fd >= 0) {
        tpm_dev t;
        tpm_use_fd(&t, fd);
        uint8_t v[32], want[32] = {0}, d[32];
        char h[65], w[65], txt[80];
        int e = tpm_pcr_read(&t, 15, v);
        CHECK(e == -EIO && t.rc == 0x100, "before Startup the TPM says TPM_RC_INITIALIZE (%d, %s)", e, tpm_rc_text(t.rc, txt, sizeof txt));
        CHECK((e = tpm_startup(&t)) == 0, "Startup: %d %s", e, tpm_rc_text(t.rc, txt, sizeof txt));
        CHECK((e = tpm_startup(&t)) == 0, "Startup again (already started: success): %d", e);
        CHECK((e = tpm_pcr_read(&t, 15, v)) == 0 && !memcmp(v, want, 32), "PCR 15 starts at zero: %d", e);
        for (int i = 0; i < 3; i++) {
            memset(d, 0x11 * (i + 1), sizeof d);
            mbedtls_sha256((const uint8_t *)"kiln", 4 + (size_t)i, d, 0);
            CHECK((e = tpm_pcr_extend(&t, 15, d)) == 0, "PCR_Extend %d: %d %s", i, e, tpm_rc_text(t.rc, txt, sizeof txt));
            extend_ref(want, d);
            e = tpm_pcr_read(&t, 15, v);
            hex(v, 32, h), hex(want, 32, w);
            CHECK(e == 0 && !memcmp(v, want, 32), "after extend %d PCR 15 is %s, SHA-256(old || digest) is %s", i, h, w);
        }
        uint8_t z[32] = {0};
        CHECK(tpm_pcr_read(&t, 14, z) == 0 && !memcmp(z, (uint8_t[32]){0}, 32), "PCR 14 untouched");
        CHECK(tpm_pcr_extend(&t, 24, d) == -EINVAL, "PCR 24 is not sent");
        tpm_sealed blob;
        test_seal(&t, v, &blob);
        close(fd);
        stop_swtpm();
        /* Another TPM (a disk moved to another box): the blob does not load there. */
        char other[320];
        snprintf(other, sizeof other, "%s/other", dir);
        mkdir(other, 0700);
        if ((fd = start_swtpm(other)) >= 0) {
            tpm_use_fd(&t, fd);
            uint8_t out[TPM_SEAL_MAX];
            size_t n = 0;
            CHECK(tpm_startup(&t) == 0, "the other TPM starts");
            e = tpm_unseal(&t, &blob, 15, out, sizeof out, &n);
            CHECK(e == -ENOKEY, "a blob from another TPM does not load: %d %s", e, tpm_rc_text(t.rc, txt, sizeof txt));
            close(fd);
        } else {
            CHECK(0, "a second swtpm did not start");
        }
    }
    stop_swtpm();
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "rm %s", dir);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN); /* as in kiln-init: a closed peer is an EPIPE, not a death */
    test_commands();
    test_responses();
    test_transport();
    test_swtpm();
    return check_done("test_tpm");
}
