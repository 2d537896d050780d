/* identity: see identity.h. */
#include "boot/identity.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "boot/ini.h"
#include "boot/logring.h"
#include "boot/tpm.h"
#include "image/manifest.h"
#include "mbedtls/ecp.h"
#include "mbedtls/entropy.h"
#include "mbedtls/gcm.h"
#include "mbedtls/pk.h"
#include "mbedtls/x509_crt.h"
#include "psa/crypto.h"

#define ENC_MAGIC "KID1"
#define IV_LEN 12
#define TAG_LEN 16
#define PLAIN_MAX (8 + 2 * ID_FILE_MAX)
#define ENC_MAX (4 + IV_LEN + TAG_LEN + 4 + PLAIN_MAX)

/* The files sealed (paths[0], paths[1]), and the certificate, kept beside them in plain
 * (public; renewing it needs no TPM): their names in ID_RUN, ID_PROV and ID_DIR. */
static const char *const names[3] = {"server.key", "tokens.txt", "server.crt"};

/* PID 1: the buffers are static, not on the stack; one boot at a time uses them. */
static uint8_t plain[PLAIN_MAX], enc[ENC_MAX + 1], cmp[2][ID_FILE_MAX + 1];

/* ------------------------------------------------------------------ small helpers */

static int fail(ident *id, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(ident *id, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(id->why, sizeof id->why, fmt, ap);
    va_end(ap);
    id->state = ID_FAILED;
    logring_say("kiln: IDENTITY: %s", id->why);
    return -EPERM;
}

static void put32(uint8_t *p, uint32_t v) { p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v; }
static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

/* A whole file of at most max bytes into buf; its length, or -errno (-EFBIG: larger). */
static ssize_t read_bin(const char *path, uint8_t *buf, size_t max) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, max + 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            return -e;
        }
        if (r == 0) break;
        n += (size_t)r;
        if (n > max) {
            close(fd);
            return -EFBIG;
        }
    }
    close(fd);
    return (ssize_t)n;
}

/* buf into path through path.new, synced, renamed: a crash leaves the old file or the new. */
static int write_atomic(const char *path, const void *buf, size_t n) {
    char tmp[UTIL_PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.new", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -errno;
    int r = util_write_all(fd, buf, n);
    if (r == 0 && fsync(fd) < 0) r = -errno;
    close(fd);
    if (r == 0 && rename(tmp, path) < 0) r = -errno;
    if (r < 0) unlink(tmp);
    sync();
    return r;
}

static void slot_blob_path(char *out, size_t cap, int slot) { snprintf(out, cap, ID_DIR "/sealed-%c", 'a' + slot); }

/* SHA-256(32 zero bytes || digest): PCR 15 once a slot with this manifest digest booted. */
static void predict(const uint8_t digest[32], uint8_t pcr[32]) {
    uint8_t both[64] = {0};
    memcpy(both + 32, digest, 32);
    man_sha s;
    man_sha_init(&s);
    man_sha_update(&s, both, sizeof both);
    man_sha_final(&s, pcr);
}

/* ------------------------------------------------------------------ sealing K */

/* Once K is out of the TPM (unsealed, or made and sealed at enrolment), PCR 15 is extended
 * with SHA-256 of this text: it then has a value no sealed K was sealed to, so nothing
 * later in this boot (kilnd, anything with /dev/tpmrm0) can unseal K again. Sealing K for
 * another slot after an update still works: it predicts that slot's value from its
 * manifest and does not need PCR 15 to hold it now. */
#define ID_CAP_TEXT "kiln: identity: PCR 15 capped for this boot"

static void cap_pcr(ident *id) {
    uint8_t ev[32];
    char rc[80], hex[65];
    man_sha h;
    man_sha_init(&h);
    man_sha_update(&h, ID_CAP_TEXT, strlen(ID_CAP_TEXT));
    man_sha_final(&h, ev);
    tpm_dev t;
    int e = tpm_open(&t, NULL);
    if (e == 0 && (e = tpm_pcr_extend(&t, MEAS_PCR, ev)) == 0) e = tpm_pcr_read(&t, MEAS_PCR, id->cap_value);
    tpm_close(&t);
    if (e < 0) {
        logring_say("kiln: WARNING: identity: PCR %d NOT capped after the unseal (%s): something else in this boot could unseal "
                    "the identity again", MEAS_PCR, e == -EIO ? tpm_rc_text(t.rc, rc, sizeof rc) : strerror(-e));
        return;
    }
    id->capped = 1;
    man_hex(id->cap_value, 32, hex);
    logring_say("kiln: identity: PCR %d capped after the unseal (pcr%d=%.16s...): nothing else in this boot can unseal it",
                MEAS_PCR, MEAS_PCR, hex);
}

/* K sealed to PCR 15 = pcr, into ID_DIR/sealed-<slot>. */
static int seal_to(const ident *id, int slot, const uint8_t pcr[32], char *why, size_t cap) {
    tpm_dev t;
    tpm_sealed s;
    uint8_t policy[32], blob[2 * TPM_BLOB_PART + 8];
    char path[UTIL_PATH_MAX], rc[80];
    int e = tpm_open(&t, NULL);
    if (e < 0) return snprintf(why, cap, "open the TPM: %s", strerror(-e)), e;
    tpm_policy_pcr(MEAS_PCR, pcr, policy);
    e = tpm_seal(&t, policy, id->key, sizeof id->key, &s);
    tpm_close(&t);
    if (e < 0) return snprintf(why, cap, "seal: %s", e == -EIO ? tpm_rc_text(t.rc, rc, sizeof rc) : strerror(-e)), e;
    size_t n = tpm_sealed_save(&s, blob, sizeof blob);
    slot_blob_path(path, sizeof path, slot);
    if (!n) return snprintf(why, cap, "seal: the blob does not fit"), -EOVERFLOW;
    if ((e = write_atomic(path, blob, n)) < 0) return snprintf(why, cap, "write %s: %s", path, strerror(-e)), e;
    return 0;
}

/* ------------------------------------------------------------------ the files */

/* The two files to seal (src: the key, the tokens) into plain: u32 length, bytes, for
 * each. Its length, or < 0 (why). */
static ssize_t pack(char src[2][UTIL_PATH_MAX], char *why, size_t cap) {
    size_t at = 0;
    for (int i = 0; i < 2; i++) {
        ssize_t n = read_bin(src[i], plain + at + 4, ID_FILE_MAX);
        if (n < 0) return snprintf(why, cap, "read %.150s: %s", src[i], strerror((int)-n)), n;
        put32(plain + at, (uint32_t)n);
        at += 4 + (size_t)n;
    }
    return (ssize_t)at;
}

static int encrypt_files(const ident *id, size_t n, size_t *out_n) {
    mbedtls_gcm_context g;
    uint8_t *iv = enc + 4, *tag = enc + 4 + IV_LEN, *ct = enc + 4 + IV_LEN + TAG_LEN + 4;
    if (getrandom(iv, IV_LEN, 0) != IV_LEN) return -EIO;
    memcpy(enc, ENC_MAGIC, 4);
    put32(enc + 4 + IV_LEN + TAG_LEN, (uint32_t)n);
    mbedtls_gcm_init(&g);
    int r = mbedtls_gcm_setkey(&g, MBEDTLS_CIPHER_ID_AES, id->key, 256);
    if (r == 0) r = mbedtls_gcm_crypt_and_tag(&g, MBEDTLS_GCM_ENCRYPT, n, iv, IV_LEN, enc, 4, plain, ct, TAG_LEN, tag);
    mbedtls_gcm_free(&g);
    *out_n = (size_t)(ct - enc) + n;
    return r ? -EIO : 0;
}

/* identity.enc (n bytes in enc) into plain; its length, or -EBADMSG (damaged, or not K's). */
static ssize_t decrypt_files(const ident *id, size_t n) {
    const size_t head = 4 + IV_LEN + TAG_LEN + 4;
    if (n < head || memcmp(enc, ENC_MAGIC, 4)) return -EBADMSG;
    uint32_t len = get32(enc + head - 4);
    if (len != n - head || len > PLAIN_MAX) return -EBADMSG;
    mbedtls_gcm_context g;
    mbedtls_gcm_init(&g);
    int r = mbedtls_gcm_setkey(&g, MBEDTLS_CIPHER_ID_AES, id->key, 256);
    if (r == 0) r = mbedtls_gcm_auth_decrypt(&g, len, enc + 4, IV_LEN, enc, 4, enc + 4 + IV_LEN, TAG_LEN, enc + head, plain);
    mbedtls_gcm_free(&g);
    return r ? -EBADMSG : (ssize_t)len;
}

/* src bind-mounted over dst, the path kiln.ini names (made first: a mount needs a target,
 * and the image may not have the file). */
static int bind_over(const char *src, const char *dst, char *why, size_t cap) {
    int fd = open(dst, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
    if (mount(src, dst, NULL, MS_BIND, NULL) < 0) {
        int e = -errno;
        snprintf(why, cap, "bind %.100s on %.100s: %s", src, dst, strerror(-e));
        return e;
    }
    return 0;
}

/* The decrypted files into ID_RUN, each bind-mounted over the path kiln.ini names. */
static int put_in_place(ident *id, size_t n, char *why, size_t cap) {
    size_t at = 0;
    if (mkdir(ID_RUN, 0700) < 0 && errno != EEXIST) {
        int e = -errno;
        snprintf(why, cap, "mkdir " ID_RUN ": %s", strerror(-e));
        return e;
    }
    for (int i = 0; i < 2; i++) {
        if (n - at < 4 || get32(plain + at) > n - at - 4) return snprintf(why, cap, "identity.enc: its contents do not parse"), -EBADMSG;
        uint32_t len = get32(plain + at);
        char path[64];
        snprintf(path, sizeof path, ID_RUN "/%s", names[i]);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        int e = fd < 0 ? -errno : util_write_all(fd, (const char *)plain + at + 4, len);
        if (fd >= 0) close(fd);
        if (e < 0) return snprintf(why, cap, "write %s: %s", path, strerror(-e)), e;
        at += 4 + len;
        if ((e = bind_over(path, id->paths[i], why, cap)) < 0) return e;
    }
    memset(plain, 0, sizeof plain);
    return 0;
}

/* The certificate kept in ID_DIR (enrolled from a provisioned identity) over kiln.ini's
 * cert; none there (enrolled from the image's files): the image's serves. */
static int cert_in_place(const ident *id, char *why, size_t cap) {
    struct stat st;
    if (stat(ID_DIR "/server.crt", &st) < 0) return 0;
    return bind_over(ID_DIR "/server.crt", id->paths[2], why, cap);
}

/* ------------------------------------------------------------------ the provisioned plaintext */

/* Zeros over a file's bytes (in place: ext4 rewrites the same blocks), synced, then the
 * name unlinked; the caller syncs the directory. Nothing of the plaintext is left to read
 * on the partition. 0, or -errno. */
static int wipe_file(const char *path) {
    static const uint8_t zero[4096];
    int fd = open(path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return errno == ENOENT ? 0 : -errno;
    struct stat st;
    int e = fstat(fd, &st) < 0 ? -errno : 0;
    for (off_t at = 0; e == 0 && at < st.st_size;) {
        size_t n = st.st_size - at < (off_t)sizeof zero ? (size_t)(st.st_size - at) : sizeof zero;
        ssize_t w = pwrite(fd, zero, n, at);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) e = w < 0 ? -errno : -EIO;
        else at += w;
    }
    if (e == 0 && fsync(fd) < 0) e = -errno;
    close(fd);
    if (e == 0 && unlink(path) < 0) e = -errno;
    return e;
}

static int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int e = fsync(fd) < 0 ? -errno : 0;
    close(fd);
    return e;
}

/* dir's three files wiped (wipe_file), dir synced, removed, its parent synced. 0, or -errno
 * with what failed in why. */
int id_wipe_dir(const char *dir, const char *parent, char *why, size_t cap) {
    char path[UTIL_PATH_MAX];
    int e = 0;
    for (int i = 0; i < 3 && e == 0; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if ((e = wipe_file(path)) < 0) snprintf(why, cap, "overwrite and remove %s: %s", path, strerror(-e));
    }
    if (e == 0 && (e = fsync_dir(dir)) < 0) snprintf(why, cap, "fsync %s: %s", dir, strerror(-e));
    if (e == 0 && rmdir(dir) < 0) e = -errno, snprintf(why, cap, "rmdir %s: %s (other files in it?)", dir, strerror(-e));
    if (e == 0 && (e = fsync_dir(parent)) < 0) snprintf(why, cap, "fsync %s: %s", parent, strerror(-e));
    return e;
}

static void destroy_provisioned(void) {
    char why[200];
    if (id_wipe_dir(ID_PROV, DISK_DATA_DIR, why, sizeof why) < 0)
        logring_say("kiln: WARNING: identity: the provisioned plaintext is NOT all destroyed: %s", why);
    else logring_say("kiln: identity: the provisioned plaintext (" ID_PROV ") overwritten, synced and removed");
}

/* 1 when the files at a and b hold the same bytes (both readable, at most ID_FILE_MAX). */
static int same_file(const char *a, const char *b) {
    ssize_t na = read_bin(a, cmp[0], ID_FILE_MAX), nb = read_bin(b, cmp[1], ID_FILE_MAX);
    int same = na >= 0 && na == nb && !memcmp(cmp[0], cmp[1], (size_t)na);
    memset(cmp, 0, sizeof cmp);
    return same;
}

/* A key made on the box for a TPM to seal stays in tmpfs (ID_RUN/made.*): it never touches
 * the data partition in plaintext. */
static int key_in_run;

static void prov_paths(char out[3][UTIL_PATH_MAX]) {
    for (int i = 0; i < 3; i++) snprintf(out[i], UTIL_PATH_MAX, ID_PROV "/%s", names[i]);
    if (key_in_run) {
        snprintf(out[0], UTIL_PATH_MAX, ID_RUN "/made.key");
        snprintf(out[2], UTIL_PATH_MAX, ID_RUN "/made.crt");
    }
}

/* No TPM to seal to (or a slot that did not verify): the provisioned files serve as they
 * are, from the data partition, and the console says that they are not sealed. */
static void serve_provisioned_plain(ident *id, const char *reason) {
    char src[3][UTIL_PATH_MAX], why[240];
    prov_paths(src);
    for (int i = 0; i < 3; i++)
        if (bind_over(src[i], id->paths[i], why, sizeof why) < 0) {
            fail(id, "the provisioned identity (" ID_PROV "): %s: not serving", why);
            return;
        }
    id->state = ID_PLAIN;
    snprintf(id->why, sizeof id->why, "NOT sealed (%s): the TLS key and tokens are in plaintext on the data partition (" ID_PROV ")",
             reason);
    logring_say("kiln: WARNING: identity: %s", id->why);
}

/* ------------------------------------------------------------------ a key made on the box */

/* Tokens were provisioned but no TLS key (kiln-flash --identity with tokens.txt alone): the
 * box makes its own, so no one but this box ever held it. EC P-256 (what kilnd certs makes
 * too) and a self-signed certificate for the address kiln.ini gives; clients pin it by the
 * fingerprint the console prints. The validity is fixed and wide: a box may boot with its
 * clock at 1970. */
#define KG_PEM_MAX 4096

static int kg_rng(void *ctx, unsigned char *buf, size_t n) {
    (void)ctx;
    for (size_t at = 0; at < n;) {
        ssize_t r = getrandom(buf + at, n - at, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return MBEDTLS_ERR_ENTROPY_SOURCE_FAILED;
        at += (size_t)r;
    }
    return 0;
}

static int write_file(const char *path, const void *buf, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -errno;
    int e = util_write_all(fd, buf, n);
    if (e == 0 && fsync(fd) < 0) e = -errno;
    close(fd);
    return e;
}

/* The key and its certificate, PEM, written as key_path and crt_path (0600); the
 * certificate's SHA-256 (of its DER) as AA:BB:... into fp. 0, or < 0 with why. */
static int keygen(const char *ini, const char *key_path, const char *crt_path, char *fp, size_t fpcap, char *why, size_t cap) {
    static unsigned char kpem[KG_PEM_MAX], cpem[KG_PEM_MAX];
    mbedtls_pk_context pk;
    mbedtls_x509write_cert w;
    mbedtls_x509_san_list san[2];
    unsigned char serial[16], ip[4];
    char addr[64] = "";
    int r, nsan = 0;
    mbedtls_pk_init(&pk);
    mbedtls_x509write_crt_init(&w);
    memset(san, 0, sizeof san);
    /* The address kiln.ini gives ("10.0.2.15/24"), when it gives one, is the name clients use. */
    if (ini_get(ini, "net", "address", addr, sizeof addr) == 0) {
        addr[strcspn(addr, "/")] = 0;
        if (inet_pton(AF_INET, addr, ip) == 1) {
            san[nsan].node.type = MBEDTLS_X509_SAN_IP_ADDRESS;
            san[nsan].node.san.unstructured_name.p = ip;
            san[nsan].node.san.unstructured_name.len = sizeof ip;
            nsan++;
        }
    }
    san[nsan].node.type = MBEDTLS_X509_SAN_DNS_NAME;
    san[nsan].node.san.unstructured_name.p = (unsigned char *)"kiln";
    san[nsan].node.san.unstructured_name.len = 4;
    if (nsan) san[0].next = &san[1];
    if (psa_crypto_init() != PSA_SUCCESS) r = MBEDTLS_ERR_PK_BAD_INPUT_DATA;
    else if ((r = mbedtls_pk_setup(&pk, mbedtls_pk_info_from_type(MBEDTLS_PK_ECKEY))) == 0 &&
             (r = mbedtls_ecp_gen_key(MBEDTLS_ECP_DP_SECP256R1, mbedtls_pk_ec(pk), kg_rng, NULL)) == 0 &&
             (r = kg_rng(NULL, serial, sizeof serial)) == 0) {
        serial[0] = (unsigned char)((serial[0] & 0x7f) | 0x01); /* a positive INTEGER of 16 bytes */
        mbedtls_x509write_crt_set_version(&w, MBEDTLS_X509_CRT_VERSION_3);
        mbedtls_x509write_crt_set_md_alg(&w, MBEDTLS_MD_SHA256);
        mbedtls_x509write_crt_set_subject_key(&w, &pk);
        mbedtls_x509write_crt_set_issuer_key(&w, &pk);
        if ((r = mbedtls_x509write_crt_set_serial_raw(&w, serial, sizeof serial)) == 0 &&
            (r = mbedtls_x509write_crt_set_subject_name(&w, "CN=kiln,O=kiln appliance")) == 0 &&
            (r = mbedtls_x509write_crt_set_issuer_name(&w, "CN=kiln,O=kiln appliance")) == 0 &&
            (r = mbedtls_x509write_crt_set_validity(&w, "20240101000000", "20991231235959")) == 0 &&
            (r = mbedtls_x509write_crt_set_basic_constraints(&w, 0, -1)) == 0 &&
            (r = mbedtls_x509write_crt_set_subject_key_identifier(&w)) == 0 &&
            (r = mbedtls_x509write_crt_set_authority_key_identifier(&w)) == 0 &&
            (r = mbedtls_x509write_crt_set_key_usage(&w, MBEDTLS_X509_KU_DIGITAL_SIGNATURE)) == 0 &&
            (r = mbedtls_x509write_crt_set_subject_alternative_name(&w, san)) == 0 &&
            (r = mbedtls_pk_write_key_pem(&pk, kpem, sizeof kpem)) == 0)
            r = mbedtls_x509write_crt_pem(&w, cpem, sizeof cpem, kg_rng, NULL);
    }
    mbedtls_x509write_crt_free(&w);
    mbedtls_pk_free(&pk);
    if (r != 0) {
        memset(kpem, 0, sizeof kpem);
        return snprintf(why, cap, "mbedTLS: -0x%04x", (unsigned)-r), -EIO;
    }
    /* The fingerprint is of the DER inside the PEM kept (ECDSA is randomized: writing the
     * DER again would sign again). */
    mbedtls_x509_crt crt;
    mbedtls_x509_crt_init(&crt);
    uint8_t h[32];
    r = mbedtls_x509_crt_parse(&crt, cpem, strlen((char *)cpem) + 1);
    if (r == 0) {
        man_sha s;
        man_sha_init(&s);
        man_sha_update(&s, crt.raw.p, crt.raw.len);
        man_sha_final(&s, h);
    }
    mbedtls_x509_crt_free(&crt);
    int e = r ? -EIO : write_file(key_path, kpem, strlen((char *)kpem));
    if (e == 0) e = write_file(crt_path, cpem, strlen((char *)cpem));
    memset(kpem, 0, sizeof kpem);
    if (e < 0) return snprintf(why, cap, "write %.100s: %s", key_path, strerror(-e)), e;
    size_t at = 0;
    for (int i = 0; i < 32 && at + 3 < fpcap; i++) at += (size_t)snprintf(fp + at, fpcap - at, "%s%02X", i ? ":" : "", h[i]);
    return 0;
}

/* ------------------------------------------------------------------ boot */

/* Seals the key and the tokens (from the provisioned files when prov, else the image's) to
 * this TPM and the running slot; a provisioned identity is then put in place from memory
 * and its plaintext destroyed. */
static void enrol(ident *id, const dsk *d, const meas *m, int prov) {
    char why[240], src[3][UTIL_PATH_MAX];
    size_t n = 0;
    if (prov) prov_paths(src);
    else memcpy(src, id->paths, sizeof src);
    if (m->unverified) {
        if (prov) {
            serve_provisioned_plain(id, "the running slot did not verify");
            return;
        }
        id->state = ID_PLAIN;
        snprintf(id->why, sizeof id->why, "not sealed: the running slot did not verify");
        logring_say("kiln: WARNING: identity: %s; it serves as the image has it", id->why);
        return;
    }
    ssize_t pn = pack(src, why, sizeof why);
    if (pn < 0 || getrandom(id->key, sizeof id->key, 0) != (ssize_t)sizeof id->key) {
        id->state = ID_PLAIN;
        snprintf(id->why, sizeof id->why, "not sealed: %s", pn < 0 ? why : "getrandom failed");
        logring_say("kiln: WARNING: identity: %s", id->why);
        return;
    }
    id->have_key = 1;
    int e = encrypt_files(id, (size_t)pn, &n);
    ssize_t cn = 0;
    /* sealed-<slot> before identity.enc: identity.enc is what says "enrolled"; the
     * certificate before both, so an enrolled identity always has it. */
    if (e < 0) {
        snprintf(why, sizeof why, "encrypt: failed");
    } else if (mkdir(ID_DIR, 0700) < 0 && errno != EEXIST) {
        e = -errno;
        snprintf(why, sizeof why, "mkdir " ID_DIR ": %s", strerror(-e));
    } else if (prov && ((cn = read_bin(src[2], cmp[0], ID_FILE_MAX)) < 0 ||
                        (e = write_atomic(ID_DIR "/server.crt", cmp[0], (size_t)cn)) < 0)) {
        e = cn < 0 ? (int)cn : e;
        snprintf(why, sizeof why, "keep the certificate %.100s in " ID_DIR ": %s", src[2], strerror(-e));
    } else if ((e = seal_to(id, d->slot, m->value, why, sizeof why)) == 0 &&
               (e = write_atomic(ID_DIR "/identity.enc", enc, n)) < 0) {
        snprintf(why, sizeof why, "write identity.enc: %s", strerror(-e));
    }
    if (e < 0) {
        memset(plain, 0, sizeof plain);
        id->have_key = 0;
        if (prov) {
            logring_say("kiln: WARNING: identity: sealing the provisioned identity failed: %s", why);
            serve_provisioned_plain(id, "sealing it failed");
            return;
        }
        id->state = ID_PLAIN;
        snprintf(id->why, sizeof id->why, "not sealed: %s", why);
        logring_say("kiln: WARNING: identity: %s", id->why);
        return;
    }
    if (prov) {
        /* Served from memory (plain, into ID_RUN), not from the files about to go. */
        if ((e = put_in_place(id, (size_t)pn, why, sizeof why)) < 0 || (e = cert_in_place(id, why, sizeof why)) < 0) {
            memset(plain, 0, sizeof plain);
            fail(id, "%s: not serving", why);
            return;
        }
        logring_say("kiln: identity: the %s TLS key and tokens (" ID_PROV ") sealed to this TPM and slot %c's PCR %d (" ID_DIR
                    "): another image or another box cannot unseal them", key_in_run ? "made" : "provisioned", 'a' + d->slot, MEAS_PCR);
        if (key_in_run) unlink(src[0]), unlink(src[2]), key_in_run = 0;
        destroy_provisioned();
    } else {
        memset(plain, 0, sizeof plain);
        logring_say("kiln: identity: %s and %s sealed to this TPM and slot %c's PCR %d (" ID_DIR "): another image or another box "
                    "cannot unseal them", id->paths[0], id->paths[1], 'a' + d->slot, MEAS_PCR);
    }
    id->state = ID_ENROLLED;
    cap_pcr(id);
}

static void unseal(ident *id, const dsk *d, const meas *m) {
    char path[UTIL_PATH_MAX], why[200], rc[80];
    uint8_t blob[2 * TPM_BLOB_PART + 8];
    tpm_sealed s;
    int me = d->slot;
    slot_blob_path(path, sizeof path, me);
    ssize_t n = read_bin(path, blob, sizeof blob);
    if (n == -ENOENT) {
        fail(id, "slot %c has no sealed identity: its image was not installed by this box (kiln-flash, or a swapped disk?)", 'a' + me);
        return;
    }
    if (n < 0 || tpm_sealed_load(&s, blob, (size_t)n) < 0) {
        fail(id, "%s: %s", path, n < 0 ? strerror((int)-n) : "not a sealed blob");
        return;
    }
    tpm_dev t;
    size_t kn = 0;
    int e = tpm_open(&t, NULL);
    if (e == 0) e = tpm_unseal(&t, &s, MEAS_PCR, id->key, sizeof id->key, &kn);
    tpm_close(&t);
    if (e == -EACCES) {
        fail(id, "the sealed identity does NOT unseal for slot %c: PCR 15 is not the value it was sealed to (%s): not serving",
             'a' + me, m->unverified ? "the running slot did not verify" : "this is not the image it was sealed for");
        return;
    }
    if (e == -ENOKEY) {
        fail(id, "the sealed identity does NOT load on this TPM (a disk from another box?): not serving");
        return;
    }
    if (e < 0 || kn != sizeof id->key) {
        fail(id, "unseal: %s: not serving", e == -EIO ? tpm_rc_text(t.rc, rc, sizeof rc) : e < 0 ? strerror(-e) : "wrong length");
        return;
    }
    id->have_key = 1;
    ssize_t en = read_bin(ID_DIR "/identity.enc", enc, ENC_MAX);
    ssize_t pn = en < 0 ? en : decrypt_files(id, (size_t)en);
    if (pn < 0) {
        fail(id, "identity.enc: %s: not serving", pn == -EBADMSG ? "damaged, or not sealed with this key" : strerror((int)-pn));
        return;
    }
    if ((e = put_in_place(id, (size_t)pn, why, sizeof why)) < 0 || (e = cert_in_place(id, why, sizeof why)) < 0) {
        memset(plain, 0, sizeof plain);
        fail(id, "%s: not serving", why);
        return;
    }
    id->state = ID_UNSEALED;
    logring_say("kiln: identity: unsealed for slot %c (PCR %d): %s and %s from " ID_DIR, 'a' + me, MEAS_PCR, id->paths[0], id->paths[1]);
    cap_pcr(id);
}

/* Sealed and provisioned both: the same key and tokens (an enrolment cut short before it
 * destroyed the plaintext) finish that enrolment; others wait for the console. */
static void provisioned_too(const ident *id) {
    char src[3][UTIL_PATH_MAX], run[2][UTIL_PATH_MAX];
    prov_paths(src);
    for (int i = 0; i < 2; i++) snprintf(run[i], UTIL_PATH_MAX, ID_RUN "/%s", names[i]);
    if (id->state == ID_UNSEALED && same_file(src[0], run[0]) && same_file(src[1], run[1])) {
        logring_say("kiln: identity: " ID_PROV " holds the sealed identity in plaintext (an enrolment cut short)");
        destroy_provisioned();
        return;
    }
    logring_say("kiln: WARNING: identity: another identity is provisioned in " ID_PROV " (plaintext, NOT sealed, not used): "
                "console `identity enrol` seals it in place of the sealed one (a reboot never does)");
}

/* Tokens provisioned, no key: make one (keygen), in tmpfs when the TPM will seal it, else
 * beside the tokens on the data partition (it must survive a reboot; it is said to be
 * NOT sealed like them). 0, or -1 (id failed). */
static int make_key(ident *id, const meas *m, const char *ini) {
    char key[UTIL_PATH_MAX], crt[UTIL_PATH_MAX], why[200];
    int run = m->state == MEAS_DONE && !m->unverified;
    if (run && mkdir(ID_RUN, 0700) < 0 && errno != EEXIST) run = 0;
    snprintf(key, sizeof key, "%s/%s", run ? ID_RUN : ID_PROV, run ? "made.key" : "server.key");
    snprintf(crt, sizeof crt, "%s/%s", run ? ID_RUN : ID_PROV, run ? "made.crt" : "server.crt");
    if (keygen(ini, key, crt, id->fp, sizeof id->fp, why, sizeof why) < 0) {
        fail(id, "no TLS key was provisioned, and making one failed: %s: not serving", why);
        return -1;
    }
    if (!run) fsync_dir(ID_PROV);
    key_in_run = run;
    logring_say("kiln: identity: no TLS key was provisioned: made one on this box (EC P-256, a self-signed certificate): "
                "SHA-256 fingerprint %s", id->fp);
    return 0;
}

void id_boot(ident *id, const dsk *d, const meas *m, const char *ini, int test_mode) {
    memset(id, 0, sizeof *id);
    snprintf(id->ini, sizeof id->ini, "%s", ini);
    struct stat st;
    if (test_mode || !d->data_mounted || d->slot < 0) {
        id->state = ID_OFF;
        snprintf(id->why, sizeof id->why, test_mode ? "test mode" : "not booted from the A/B disk image");
        return;
    }
    int enrolled = stat(ID_DIR "/identity.enc", &st) == 0;
    int prov = stat(ID_PROV "/server.key", &st) == 0, prov_tokens = stat(ID_PROV "/tokens.txt", &st) == 0;
    static const char *const keys[3] = {"key", "tokens_file", "cert"};
    for (int i = 0; i < 3; i++) {
        if (ini_get(ini, "net", keys[i], id->paths[i], sizeof id->paths[i]) < 0 || id->paths[i][0] != '/' ||
            util_starts(id->paths[i], DISK_DATA_DIR "/")) {
            if (enrolled) {
                fail(id, "kiln.ini's [net] %s is not an absolute path outside " DISK_DATA_DIR ": not serving", keys[i]);
                return;
            }
            id->state = ID_PLAIN;
            snprintf(id->why, sizeof id->why, "not sealed: kiln.ini's [net] %s is not an absolute path outside " DISK_DATA_DIR, keys[i]);
            logring_say("kiln: identity: %s", id->why);
            return;
        }
    }
    if (!enrolled && !prov && prov_tokens) {
        if (make_key(id, m, ini) < 0) return;
        prov = 1;
    }
    if (!enrolled && !prov && stat(id->paths[0], &st) < 0) {
        fail(id, "no identity: none is sealed on this disk, none is provisioned (kiln-flash install --identity DIR, or kiln-flash "
                 "identity DIR DISK) and the image has no %s: not serving", id->paths[0]);
        return;
    }
    if (m->state != MEAS_DONE) {
        const char *no = m->state == MEAS_NO_TPM ? "no TPM" : "the boot was not measured";
        if (enrolled) {
            fail(id, "this box's identity is sealed, and %s: not serving",
                 m->state == MEAS_NO_TPM ? "there is no TPM (a disk from another box?)" : "the TPM did not measure this boot");
            return;
        }
        if (prov) {
            serve_provisioned_plain(id, no);
            return;
        }
        id->state = ID_PLAIN;
        snprintf(id->why, sizeof id->why, "not sealed (%s)", no);
        logring_note("kiln-init: identity: %s: the image's files serve", id->why);
        return;
    }
    if (enrolled) {
        unseal(id, d, m);
        if (prov || prov_tokens) provisioned_too(id);
    } else {
        enrol(id, d, m, prov);
    }
}

int id_enrol(ident *id, const dsk *d, const meas *m, char *out, size_t cap) {
    struct stat st;
    char path[UTIL_PATH_MAX];
    if (id->state == ID_OFF) return snprintf(out, cap, "identity: refused: %s", id->why), -ENODEV;
    if (m->state != MEAS_DONE) return snprintf(out, cap, "identity: refused: no TPM measured this boot: nothing to seal to"), -ENODEV;
    if (m->unverified) return snprintf(out, cap, "identity: refused: the running slot did not verify: nothing to seal to"), -EPERM;
    int key = stat(ID_PROV "/server.key", &st) == 0;
    if (!key && stat(ID_PROV "/tokens.txt", &st) < 0)
        return snprintf(out, cap, "identity: refused: nothing provisioned in " ID_PROV " (kiln-flash identity DIR DISK)"), -ENOENT;
    for (int i = 0; i < 3; i++)
        if (id->paths[i][0] != '/') return snprintf(out, cap, "identity: refused: kiln.ini's [net] paths are not usable (see `status`)"), -EINVAL;
    /* The old identity's bind mounts go first: the new files go in under the same names,
     * and a bind holds the inode it was made on. */
    for (int i = 0; i < 3; i++)
        if (umount2(id->paths[i], MNT_DETACH) < 0 && errno != EINVAL && errno != ENOENT)
            logring_note("kiln-init: identity: umount %s: %s", id->paths[i], strerror(errno));
    if (!key && make_key(id, m, id->ini) < 0) return snprintf(out, cap, "identity: NOT enrolled: %s", id->why), -EIO;
    enrol(id, d, m, 1);
    if (id->state != ID_ENROLLED) return snprintf(out, cap, "identity: NOT enrolled: %s", id->why), -EIO;
    /* The other slot's blob seals the old K, which no longer opens identity.enc. */
    slot_blob_path(path, sizeof path, !d->slot);
    if (unlink(path) == 0) fsync_dir(ID_DIR);
    snprintf(out, cap, "identity: the provisioned identity is sealed to this TPM and slot %c, its plaintext destroyed; slot %c "
                       "unseals it once kiln-init makes it bootable again (an update, `slot %c`)",
             'a' + d->slot, 'a' + !d->slot, 'a' + !d->slot);
    return 0;
}

int id_seal_slot(ident *id, int slot, char *out, size_t cap) {
    uint8_t digest[32], pcr[32];
    char err[300], hex[65];
    out[0] = 0;
    if (!id->have_key || (id->state != ID_ENROLLED && id->state != ID_UNSEALED)) return 0;
    int e = disk_manifest_digest(slot, digest, err, sizeof err);
    if (e < 0) return snprintf(out, cap, "identity: slot %c's manifest: %s", 'a' + slot, err), e;
    predict(digest, pcr);
    if ((e = seal_to(id, slot, pcr, err, sizeof err)) < 0) return snprintf(out, cap, "identity: %s", err), e;
    man_hex(pcr, 32, hex);
    logring_say("kiln: identity: sealed for slot %c too: it unseals there when PCR 15 is %.16s...", 'a' + slot, hex);
    return 0;
}

void id_describe(const ident *id, char *out, size_t cap) {
    char capped[100] = "; PCR 15 NOT capped";
    if (id->capped) {
        char hex[65];
        man_hex(id->cap_value, 32, hex);
        snprintf(capped, sizeof capped, "; PCR %d capped: pcr%d=%s", MEAS_PCR, MEAS_PCR, hex);
    }
    switch (id->state) {
    case ID_ENROLLED:
        snprintf(out, cap, "identity: sealed to this TPM and slot (enrolled at this boot%s%s%s)", capped,
                 id->fp[0] ? "; its TLS key made on the box, certificate sha256 " : "", id->fp);
        break;
    case ID_UNSEALED: snprintf(out, cap, "identity: unsealed (sealed to this TPM and this slot's PCR %d%s)", MEAS_PCR, capped); break;
    case ID_FAILED: snprintf(out, cap, "identity: FAILED: %s", id->why); break;
    default: snprintf(out, cap, "identity: %s", id->why); break;
    }
}
