/* kiln-flash: puts kiln on a disk (a block device or a disk image file: the same code on a
 * file descriptor). docs/IMAGE.md.
 *
 *   kiln-flash install DISK_IMAGE TARGET [--identity DIR]
 *                                               first install: the whole disk; with DIR's
 *                                               TLS key, certificate chain and tokens file
 *                                               on its data partition for the box to seal
 *                                               (tokens alone: the box makes its key)
 *   kiln-flash identity DIR TARGET              DIR's identity onto an installed disk
 *   kiln-flash update BUNDLE TARGET [--tries N] the inactive slot, tried N times (default 3)
 *   kiln-flash status TARGET                    slots, versions, the ESP's boot entries
 *
 * Nothing is written before the signature (the key built in from BUILD/keys/pubkey.h) and
 * every hash have been checked, and the UKI's Secure Boot signature too: sbverify (Debian's
 * sbsigntool) against the db certificate built in from BUILD/keys/sbcert.h, so a bundle
 * the manifest key signed whose UKI the firmware would refuse is never written; what was written is read back and compared. An update goes
 * into the slot that is not the one systemd-boot boots now, and its UKI onto the ESP as
 * EFI/Linux/kiln-<slot>+N.efi: systemd-boot's boot counting tries it N times, and kiln-init
 * blesses it (renames it to kiln-<slot>.efi) once the box is healthy; when the tries run out
 * systemd-boot boots the other slot again. The ESP (FAT) is edited with mtools at the
 * partition's offset, without mounting. Exit status: 0 done, 1 refused, 2 usage or I/O. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "image/bundle.h"
#include "image/manifest.h"
#include "mbedtls/pk.h"
#include "mbedtls/x509_crt.h"
#include "psa/crypto.h"
#include "pubkey.h" /* BUILD/keys/pubkey.h: IMG_PUBKEY_BYTES */
#include "sbcert.h" /* BUILD/keys/sbcert.h: IMG_SB_DB_CERT, the Secure Boot db certificate (PEM) */

static const uint8_t pubkey[MAN_PUB_LEN] = IMG_PUBKEY_BYTES;
static char err[512];

#define SECTOR 512

static int usage(void) {
    fprintf(stderr, "usage: kiln-flash install DISK_IMAGE TARGET [--identity DIR]\n"
                    "       kiln-flash identity DIR TARGET   (DIR: server.key, server.crt, tokens.txt)\n"
                    "       kiln-flash update BUNDLE TARGET [--tries N]\n"
                    "       kiln-flash status TARGET\n");
    return 2;
}

/* ------------------------------------------------------------------ GPT */

typedef struct {
    char name[40];
    uint64_t off, len; /* bytes */
} part;

typedef struct {
    part p[16];
    int n;
} table;

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

static int pread_full(int fd, void *buf, size_t n, uint64_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return r < 0 ? -errno : -ENODATA;
        got += (size_t)r;
    }
    return 0;
}

/* The kiln partitions (by GPT name) of the disk on fd. */
static int read_gpt(int fd, uint64_t disk_size, table *t, const char *what) {
    uint8_t h[SECTOR];
    memset(t, 0, sizeof *t);
    if (pread_full(fd, h, sizeof h, SECTOR) < 0 || memcmp(h, "EFI PART", 8))
        return fprintf(stderr, "kiln-flash: %s: no GPT header (not a kiln disk)\n", what), -1;
    uint64_t entries = le64(h + 72);
    uint32_t count = le32(h + 80), esize = le32(h + 84);
    if (esize < 128 || esize > 1024 || count > 256 || entries == 0 || entries > disk_size / SECTOR)
        return fprintf(stderr, "kiln-flash: %s: GPT header out of range\n", what), -1;
    uint8_t e[1024];
    for (uint32_t i = 0; i < count; i++) {
        if (pread_full(fd, e, esize, entries * SECTOR + (uint64_t)i * esize) < 0)
            return fprintf(stderr, "kiln-flash: %s: GPT entries unreadable\n", what), -1;
        uint64_t first = le64(e + 32), last = le64(e + 40);
        int used = 0;
        for (int j = 0; j < 16; j++) used |= e[j];
        if (!used || t->n == 16) continue;
        if (last < first || last >= disk_size / SECTOR) return fprintf(stderr, "kiln-flash: %s: a partition outside the disk\n", what), -1;
        part *p = &t->p[t->n++];
        for (int j = 0; j < 36 && j < (int)sizeof p->name - 1; j++) {
            uint16_t c = (uint16_t)(e[56 + 2 * j] | e[57 + 2 * j] << 8);
            if (!c) break;
            p->name[j] = c < 128 ? (char)c : '?';
        }
        p->off = first * SECTOR;
        p->len = (last - first + 1) * SECTOR;
    }
    return 0;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> 8 * i);
}

/* CRC-32 (IEEE 802.3, reflected), what the GPT header and entry array carry. */
static uint32_t crc32(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c >> 1 ^ (0xEDB88320u & (0u - (c & 1)));
    }
    return ~c;
}

/* A GPT header (hs bytes, at LBA my) naming entries at LBA el, its CRC set. */
static void gpt_header(uint8_t *h, uint32_t hs, uint64_t my, uint64_t alt, uint64_t el) {
    put64(h + 24, my);
    put64(h + 32, alt);
    put64(h + 72, el);
    put32(h + 16, 0);
    put32(h + 16, crc32(h, hs));
}

/* The install target is larger than the image: the GPT is made to span it (the backup
 * entries and header at the target's end, as the standard puts them) and kiln-data,
 * the last partition, to end at the last usable MiB, so the box's file system grows into
 * it at boot (kiln-init: ext4's online resize). *grew: the bytes kiln-data gained (0: the
 * image already spans the target). 0; 1 when the table is not one to grow (said: the
 * installed disk keeps the image's table and works as it is); -1 on a write error (said;
 * the backup goes first, so a table torn before the primary is the image's, intact). */
static int grow_gpt(int fd, uint64_t size, uint64_t *grew, const char *what) {
    enum { MIB = 1 << 20 };
    static uint8_t ents[256 * 1024];
    uint8_t h[SECTOR], mbr[SECTOR];
    *grew = 0;
    if (pread_full(fd, h, SECTOR, SECTOR) < 0 || pread_full(fd, mbr, SECTOR, 0) < 0) goto bad;
    uint32_t hs = le32(h + 12), count = le32(h + 80), esize = le32(h + 84);
    uint64_t el = le64(h + 72), total = size / SECTOR, n = (uint64_t)count * esize;
    if (hs < 92 || hs > SECTOR || esize < 128 || n > sizeof ents || n % SECTOR || el < 2) goto bad;
    if (pread_full(fd, ents, n, el * SECTOR) < 0 || crc32(ents, n) != le32(h + 88)) goto bad;
    uint8_t *data = NULL;
    uint64_t end_max = 0;
    for (uint32_t i = 0; i < count; i++) { /* kiln-data must be the last partition */
        uint8_t *e = ents + (size_t)i * esize;
        uint64_t last = le64(e + 40);
        int used = 0;
        for (int j = 0; j < 16; j++) used |= e[j];
        if (!used) continue;
        if (last > end_max) end_max = last, data = e;
    }
    const char *name = "kiln-data";
    for (int j = 0; data && j < 10; j++)
        if (data[56 + 2 * j] != (j < 9 ? (uint8_t)name[j] : 0) || data[57 + 2 * j]) data = NULL;
    if (!data) return fprintf(stderr, "kiln-flash: %s: warning: kiln-data is not the last partition: not grown\n", what), 1;
    uint64_t back_el = total - 1 - n / SECTOR, usable = back_el - 1;
    uint64_t end = (usable + 1) / (MIB / SECTOR) * (MIB / SECTOR) - 1; /* a whole MiB */
    if (end <= le64(data + 40)) return 0;
    uint64_t old_alt = le64(h + 32);
    *grew = (end - le64(data + 40)) * SECTOR;
    put64(data + 40, end);
    put32(h + 88, crc32(ents, n));
    put64(h + 48, usable);
    uint8_t bh[SECTOR];
    memcpy(bh, h, SECTOR);
    gpt_header(h, hs, 1, total - 1, el);
    gpt_header(bh, hs, total - 1, 1, back_el);
    uint64_t mbr_len = total - 1 > 0xFFFFFFFFu ? 0xFFFFFFFFu : total - 1; /* the protective entry */
    put32(mbr + 446 + 12, (uint32_t)mbr_len);
    static const uint8_t zero[SECTOR];
    if (bun_write(fd, ents, n, back_el * SECTOR) < 0 || bun_write(fd, bh, SECTOR, (total - 1) * SECTOR) < 0 ||
        fsync(fd) < 0 || bun_write(fd, ents, n, el * SECTOR) < 0 || bun_write(fd, h, SECTOR, SECTOR) < 0 ||
        bun_write(fd, mbr, SECTOR, 0) < 0 ||
        (old_alt < total - 1 && bun_write(fd, zero, SECTOR, old_alt * SECTOR) < 0) || fsync(fd) < 0)
        return fprintf(stderr, "kiln-flash: %s: writing the grown GPT: %s\n", what, strerror(errno)), -1;
    return 0;
bad:
    return fprintf(stderr, "kiln-flash: %s: warning: the image's GPT does not check out: not grown\n", what), 1;
}

static const part *find(const table *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->p[i].name, name)) return &t->p[i];
    return NULL;
}

static int open_target(const char *path, int flags, uint64_t *size) {
    int fd = open(path, flags | O_CLOEXEC);
    if (fd < 0) return fprintf(stderr, "kiln-flash: open %s: %s\n", path, strerror(errno)), -1;
    off_t end = lseek(fd, 0, SEEK_END); /* a block device's size, too */
    if (end < 0) return fprintf(stderr, "kiln-flash: %s: %s\n", path, strerror(errno)), close(fd), -1;
    *size = (uint64_t)end;
    return fd;
}

/* ------------------------------------------------------------------ the ESP through mtools */

/* argv's stdout into out (its length into *got when got); its stderr to ours, or to
 * /dev/null when quiet. 0 when it exits 0. */
static int run_q(char *const argv[], char *out, size_t cap, int quiet, size_t *got) {
    int pfd[2];
    if (pipe(pfd) < 0) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]), close(pfd[1]);
        int nul = quiet ? open("/dev/null", O_WRONLY) : -1;
        if (nul >= 0) dup2(nul, 2), close(nul);
        setenv("MTOOLS_SKIP_CHECK", "1", 1);
        execvp(argv[0], argv);
        if (!quiet) fprintf(stderr, "kiln-flash: %s: %s (mtools is needed for the ESP)\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    size_t n = 0;
    for (;;) {
        char tmp[4096];
        ssize_t r = read(pfd[0], tmp, sizeof tmp);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        if (out && n + 1 < cap) {
            size_t k = (size_t)r < cap - 1 - n ? (size_t)r : cap - 1 - n;
            memcpy(out + n, tmp, k);
            n += k;
        }
    }
    if (out) out[n] = 0;
    if (got) *got = n;
    close(pfd[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}
static int run(char *const argv[], char *out, size_t cap) { return run_q(argv, out, cap, 0, NULL); }

/* ------------------------------------------------------------------ Secure Boot */

static int have_cmd(const char *name) {
    const char *p = getenv("PATH");
    char path[4096];
    for (p = p ? p : "/usr/bin:/bin"; *p;) {
        size_t n = strcspn(p, ":");
        if (n && snprintf(path, sizeof path, "%.*s/%s", (int)n, p, name) < (int)sizeof path && access(path, X_OK) == 0) return 1;
        p += n + (p[n] == ':');
    }
    return 0;
}

/* 0 when the UKI at [off, off+size) of fd carries an Authenticode signature by the db
 * certificate: what the firmware checks before systemd-boot may start it. The part goes
 * to a temporary file (bun_copy: read back and compared) for sbverify. */
static int sb_check(int fd, uint64_t off, uint64_t size, char *why, size_t cap) {
    char uki[] = "/tmp/kiln-flash-sb-uki.XXXXXX", crt[] = "/tmp/kiln-flash-sb-db.XXXXXX";
    int uf = mkstemp(uki), cf = mkstemp(crt), rc = -1;
    if (uf < 0 || cf < 0) {
        snprintf(why, cap, "mkstemp: %s", strerror(errno));
        goto out;
    }
    static const char cert[] = IMG_SB_DB_CERT;
    if (write(cf, cert, sizeof cert - 1) != (ssize_t)(sizeof cert - 1)) {
        snprintf(why, cap, "write %s: %s", crt, strerror(errno));
        goto out;
    }
    if (bun_copy(fd, off, uf, 0, size, err, sizeof err)) {
        snprintf(why, cap, "uki: %s", err);
        goto out;
    }
    char *argv[] = {"sbverify", "--cert", crt, uki, NULL}, o[512];
    if (!have_cmd("sbverify")) {
        snprintf(why, cap, "cannot check the UKI's Secure Boot signature: no sbverify (apt-get install sbsigntool)");
        goto out;
    }
    if (run_q(argv, o, sizeof o, 1, NULL) < 0) {
        snprintf(why, cap, "the UKI is not signed by the Secure Boot db key (sbverify --cert db.crt fails): the firmware would refuse it");
        goto out;
    }
    rc = 0;
out:
    if (uf >= 0) close(uf), unlink(uki);
    if (cf >= 0) close(cf), unlink(crt);
    return rc;
}

typedef struct {
    char file[2][64];  /* [slot]: EFI/Linux name, "" if none */
} esp_state;

/* mtools's image@@offset */
static void esp_spec(char *out, size_t cap, const char *target, const part *esp) {
    snprintf(out, cap, "%s@@%llu", target, (unsigned long long)esp->off);
}

static int esp_list(const char *spec, esp_state *s) {
    char out[8192];
    memset(s, 0, sizeof *s);
    char *argv[] = {"mdir", "-b", "-i", (char *)spec, "::/EFI/Linux", NULL};
    if (run(argv, out, sizeof out) < 0) return fprintf(stderr, "kiln-flash: cannot list the ESP's EFI/Linux (mdir)\n"), -1;
    for (char *l = out, *nl; l && *l; l = nl) {
        if ((nl = strchr(l, '\n'))) *nl++ = 0;
        const char *b = strrchr(l, '/');
        b = b ? b + 1 : l;
        for (int i = 0; i < 2; i++) {
            char pre[8];
            snprintf(pre, sizeof pre, "kiln-%c", 'a' + i);
            if (!strncmp(b, pre, 6) && (b[6] == '.' || b[6] == '+') && strlen(b) < sizeof s->file[i])
                snprintf(s->file[i], sizeof s->file[i], "%s", b);
        }
    }
    return 0;
}

/* A boot-counted name's tries left, or -1 for a blessed (uncounted) one. */
static int tries_left(const char *name) {
    const char *plus = strchr(name, '+');
    return plus ? atoi(plus + 1) : -1;
}

/* ------------------------------------------------------------------ the identity (--identity DIR) */

/* The operator's identity goes onto the data partition (ext4), in ID_PROV_DIR, where kiln-init
 * finds it at the next boot, seals it to the TPM and destroys the plaintext (docs/IMAGE.md,
 * boot/identity.h). debugfs (e2fsprogs) writes it at the partition's offset, without mounting,
 * as mtools does for the ESP. Only what the box needs goes there: no CA key, nothing else of DIR. */
#define ID_PROV_DIR "provision"        /* /data/provision on the box */
#define ID_FILE_MAX 16384              /* what kiln-init seals of each file (boot/identity.h) */
enum { IDF_KEY, IDF_CRT, IDF_TOK, IDF_N };
static const char *const id_names[IDF_N] = {"server.key", "server.crt", "tokens.txt"};

typedef struct {
    unsigned char b[IDF_N][ID_FILE_MAX + 2]; /* each file, NUL-terminated for mbedTLS's PEM parser */
    size_t n[IDF_N];                         /* its length, bytes */
} ident_files;

static int id_rng(void *ctx, unsigned char *buf, size_t n) {
    (void)ctx;
    for (size_t at = 0; at < n;) {
        ssize_t r = getrandom(buf + at, n - at, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        at += (size_t)r;
    }
    return 0;
}

/* DIR's three files into f, checked: sizes kiln-init takes, a private key that is the
 * certificate's (the box could not serve with another), a tokens file of text. Neither
 * key nor certificate (tokens.txt alone): the box makes its own key at its first boot. */
static int id_read(const char *dir, ident_files *f, char *why, size_t cap) {
    memset(f->n, 0, sizeof f->n);
    for (int i = 0; i < IDF_N; i++) {
        char path[4096];
        struct stat st;
        if (snprintf(path, sizeof path, "%s/%s", dir, id_names[i]) >= (int)sizeof path) return snprintf(why, cap, "%s: path too long", dir), -1;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT && i != IDF_TOK) continue;
        if (fd < 0 || fstat(fd, &st) < 0) {
            snprintf(why, cap, "%.400s: %s (DIR holds server.key, server.crt, tokens.txt)", path, strerror(errno));
            if (fd >= 0) close(fd);
            return -1;
        }
        if (!S_ISREG(st.st_mode) || st.st_size < 1 || st.st_size > ID_FILE_MAX) {
            close(fd);
            return snprintf(why, cap, "%.400s: not a file of 1..%d bytes", path, ID_FILE_MAX), -1;
        }
        int e = pread_full(fd, f->b[i], (size_t)st.st_size, 0);
        close(fd);
        if (e < 0) return snprintf(why, cap, "read %.400s: %s", path, strerror(-e)), -1;
        f->n[i] = (size_t)st.st_size;
        f->b[i][f->n[i]] = 0;
    }
    if (memchr(f->b[IDF_TOK], 0, f->n[IDF_TOK])) return snprintf(why, cap, "%s/tokens.txt: not text (a NUL byte)", dir), -1;
    if (!f->n[IDF_KEY] != !f->n[IDF_CRT])
        return snprintf(why, cap, "%s: server.key and server.crt go together (or neither: the box makes its own key)", dir), -1;
    if (!f->n[IDF_KEY]) return 0;
    mbedtls_pk_context key;
    mbedtls_x509_crt crt;
    mbedtls_pk_init(&key);
    mbedtls_x509_crt_init(&crt);
    int rc = -1;
    /* the PEM parsers want the terminating NUL counted; DER does not have one */
    size_t kn = f->n[IDF_KEY] + (strstr((char *)f->b[IDF_KEY], "-----BEGIN") != NULL);
    size_t cn = f->n[IDF_CRT] + (strstr((char *)f->b[IDF_CRT], "-----BEGIN") != NULL);
    if (psa_crypto_init() != PSA_SUCCESS) snprintf(why, cap, "psa_crypto_init failed");
    else if (mbedtls_pk_parse_key(&key, f->b[IDF_KEY], kn, NULL, 0, id_rng, NULL)) snprintf(why, cap, "%s/server.key: not a private key (PEM or DER)", dir);
    else if (mbedtls_x509_crt_parse(&crt, f->b[IDF_CRT], cn)) snprintf(why, cap, "%s/server.crt: not a certificate chain (PEM or DER)", dir);
    else if (mbedtls_pk_check_pair(&crt.pk, &key, id_rng, NULL)) snprintf(why, cap, "%s/server.key is not the key of server.crt's first certificate", dir);
    else rc = 0;
    mbedtls_pk_free(&key);
    mbedtls_x509_crt_free(&crt);
    return rc;
}

static int find_debugfs(char *out, size_t cap) {
    static const char *const at[] = {"/sbin/debugfs", "/usr/sbin/debugfs"};
    if (have_cmd("debugfs")) return snprintf(out, cap, "debugfs"), 0;
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++)
        if (access(at[i], X_OK) == 0) return snprintf(out, cap, "%s", at[i]), 0;
    return -1;
}

/* Zeros over a temporary copy of a secret before it goes: /tmp may be a disk. */
static void wipe_unlink(const char *path, size_t n) {
    static const unsigned char zero[4096];
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    for (size_t at = 0; fd >= 0 && at < n; at += sizeof zero)
        if (pwrite(fd, zero, n - at < sizeof zero ? n - at : sizeof zero, (off_t)at) < 0) break;
    if (fd >= 0) fsync(fd), close(fd);
    unlink(path);
}

/* f into ID_PROV_DIR of the ext4 data partition at data->off of target, then read back
 * through debugfs and compared. Whatever was there before under those names is replaced. */
static int id_write(const char *target, const part *data, const ident_files *f) {
    char dbg[64], spec[4200], tmp[] = "/tmp/kiln-flash-id.XXXXXX", paths[IDF_N][64] = {{0}}, cmds[96];
    static char back[ID_FILE_MAX + 2];
    if (find_debugfs(dbg, sizeof dbg) < 0)
        return fprintf(stderr, "kiln-flash: --identity needs debugfs (e2fsprogs) to write the data partition\n"), 2;
    snprintf(spec, sizeof spec, "%s?offset=%llu", target, (unsigned long long)data->off);
    if (!mkdtemp(tmp)) return fprintf(stderr, "kiln-flash: mkdtemp: %s\n", strerror(errno)), 2;
    int rc = 0;
    snprintf(cmds, sizeof cmds, "%s/cmds", tmp);
    FILE *c = fopen(cmds, "w");
    if (!c) rc = (fprintf(stderr, "kiln-flash: %s: %s\n", cmds, strerror(errno)), 2);
    if (c) fprintf(c, "mkdir " ID_PROV_DIR "\nsif " ID_PROV_DIR " mode 040700\n");
    for (int i = 0; i < IDF_N && !rc; i++) {
        /* an old provisioned file of this name goes, whether DIR has one or not */
        fprintf(c, "rm " ID_PROV_DIR "/%s\n", id_names[i]);
        if (!f->n[i]) continue;
        snprintf(paths[i], sizeof paths[i], "%s/%d", tmp, i);
        int fd = open(paths[i], O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 || write(fd, f->b[i], f->n[i]) != (ssize_t)f->n[i]) rc = (fprintf(stderr, "kiln-flash: %s: %s\n", paths[i], strerror(errno)), 2);
        if (fd >= 0) close(fd);
        /* debugfs's write does not replace: the rm above (an error when absent, ignored) */
        fprintf(c, "write %s " ID_PROV_DIR "/%s\nsif " ID_PROV_DIR "/%s mode 0100600\n", paths[i], id_names[i], id_names[i]);
    }
    if (c && fclose(c) != 0 && !rc) rc = (fprintf(stderr, "kiln-flash: %s: %s\n", cmds, strerror(errno)), 2);
    char *w[] = {dbg, "-w", "-f", cmds, spec, NULL};
    if (!rc && run_q(w, NULL, 0, 1, NULL) < 0) rc = (fprintf(stderr, "kiln-flash: debugfs -w on the data partition failed\n"), 2);
    /* debugfs exits 0 when one of its commands fails: what counts is what reads back */
    for (int i = 0; i < IDF_N && !rc; i++) {
        char req[96];
        size_t n = 0;
        snprintf(req, sizeof req, "cat " ID_PROV_DIR "/%s", id_names[i]);
        char *r[] = {dbg, "-R", req, spec, NULL};
        /* an absent file reads back empty */
        if (run_q(r, back, sizeof back, 1, &n) < 0 || n != f->n[i] || memcmp(back, f->b[i], n))
            rc = (fprintf(stderr, "kiln-flash: the data partition's %s/%s reads back different\n", ID_PROV_DIR, id_names[i]), 2);
    }
    memset(back, 0, sizeof back);
    for (int i = 0; i < IDF_N; i++)
        if (paths[i][0]) wipe_unlink(paths[i], f->n[i]);
    unlink(cmds);
    rmdir(tmp);
    return rc;
}

/* ------------------------------------------------------------------ commands */

static int slot_version(int fd, const part *p, uint32_t *v) {
    man_manifest m;
    char text[MAN_MAX + 1];
    if (bun_read_manifest(fd, p->off, &m, text, err, sizeof err) < 0) return -1;
    *v = m.version;
    return 0;
}

static int cmd_status(const char *target) {
    uint64_t size;
    int fd = open_target(target, O_RDONLY, &size);
    if (fd < 0) return 2;
    table t;
    if (read_gpt(fd, size, &t, target) < 0) return close(fd), 2;
    const part *esp = find(&t, "kiln-esp");
    esp_state es = {0};
    char spec[4200];
    if (esp) esp_spec(spec, sizeof spec, target, esp), esp_list(spec, &es);
    for (int i = 0; i < 2; i++) {
        char name[16];
        snprintf(name, sizeof name, "kiln-%c", 'a' + i);
        const part *p = find(&t, name);
        uint32_t v;
        man_manifest m;
        int good = p && bun_verify(fd, p->off, p->len, pubkey, &m, err, sizeof err) == 0;
        if (!p) printf("slot %c: no partition\n", 'a' + i);
        else if (slot_version(fd, p, &v) < 0) printf("slot %c: empty\n", 'a' + i);
        else printf("slot %c: version %u, %s; boot entry %s\n", 'a' + i, (unsigned)v, good ? "signature good" : "BAD signature or hash",
                    es.file[i][0] ? es.file[i] : "(none)");
    }
    close(fd);
    return 0;
}

/* bun_copy (read back and compared), saying what failed */
static int copy_verified(int src, uint64_t soff, int dst, uint64_t doff, uint64_t n, const char *what) {
    int rc = bun_copy(src, soff, dst, doff, n, err, sizeof err);
    if (rc) fprintf(stderr, "kiln-flash: %s: %s\n", what, err);
    return rc;
}

static ident_files idf; /* static: 48 KiB */

static int cmd_install(const char *image, const char *target, const char *id_dir) {
    uint64_t isize, tsize;
    int in = open_target(image, O_RDONLY, &isize);
    if (in < 0) return 2;
    table t;
    if (read_gpt(in, isize, &t, image) < 0) return 1;
    const part *a = find(&t, "kiln-a");
    man_manifest m;
    if (!a || !find(&t, "kiln-esp") || !find(&t, "kiln-data"))
        return fprintf(stderr, "kiln-flash: %s: REFUSED: not a kiln disk image (partitions kiln-esp, kiln-a, kiln-data)\n", image), 1;
    if (bun_verify(in, a->off, a->len, pubkey, &m, err, sizeof err) < 0)
        return fprintf(stderr, "kiln-flash: %s: REFUSED, nothing written: slot a: %s\n", image, err), 1;
    char why[640];
    for (int i = 0; i < m.nparts; i++)
        if (!strcmp(m.parts[i].name, "uki") && sb_check(in, a->off + bun_part_offset(&m, i), m.parts[i].size, why, sizeof why))
            return fprintf(stderr, "kiln-flash: %s: REFUSED, nothing written: slot a: %s\n", image, why), 1;
    if (id_dir && id_read(id_dir, &idf, why, sizeof why) < 0)
        return fprintf(stderr, "kiln-flash: --identity: REFUSED, nothing written: %s\n", why), 1;
    int out = open(target, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (out < 0) return fprintf(stderr, "kiln-flash: open %s: %s\n", target, strerror(errno)), 2;
    off_t end = lseek(out, 0, SEEK_END);
    tsize = end < 0 ? 0 : (uint64_t)end;
    struct stat st;
    if (fstat(out, &st) == 0 && S_ISREG(st.st_mode) && tsize < isize && ftruncate(out, (off_t)isize) < 0)
        return fprintf(stderr, "kiln-flash: %s: %s\n", target, strerror(errno)), 2;
    else if (fstat(out, &st) == 0 && !S_ISREG(st.st_mode) && tsize < isize)
        return fprintf(stderr, "kiln-flash: %s: REFUSED: %llu bytes, the image needs %llu\n", target, (unsigned long long)tsize,
                       (unsigned long long)isize), 1;
    if (copy_verified(in, 0, out, 0, isize, target) < 0) return 2;
    printf("kiln-flash: %s: installed version %u in slot a (%llu bytes written and read back)\n", target, (unsigned)m.version,
           (unsigned long long)isize);
    uint64_t grew = 0;
    if (tsize > isize && grow_gpt(out, tsize, &grew, target) < 0) return 2;
    if (grew)
        printf("kiln-flash: %s: kiln-data now reaches the end of the target (%llu MiB more): the box grows its "
               "file system into it at its first boot\n", target, (unsigned long long)(grew >> 20));
    if (!id_dir) return 0;
    int rc = id_write(target, find(&t, "kiln-data"), &idf), has_key = idf.n[IDF_KEY] != 0;
    memset(&idf, 0, sizeof idf);
    if (rc) return rc;
    printf("kiln-flash: %s: the identity of %s (%s) is on the data partition (" ID_PROV_DIR
           "/): the box seals it to its TPM at its first boot and destroys this plaintext\n",
           target, id_dir, has_key ? "server.key, server.crt, tokens.txt" : "tokens.txt; the box makes its own TLS key");
    return 0;
}

/* An installed disk's data partition gets a new identity (a re-provisioned or moved
 * disk): kiln-init seals it at the next boot when none is sealed, or on the console's
 * `identity enrol` (docs/IMAGE.md). */
static int cmd_identity(const char *dir, const char *target) {
    uint64_t size;
    char why[640];
    if (id_read(dir, &idf, why, sizeof why) < 0) return fprintf(stderr, "kiln-flash: REFUSED, nothing written: %s\n", why), 1;
    int fd = open_target(target, O_RDONLY, &size);
    if (fd < 0) return 2;
    table t;
    int e = read_gpt(fd, size, &t, target);
    close(fd);
    if (e < 0) return 2;
    const part *data = find(&t, "kiln-data");
    if (!data) return fprintf(stderr, "kiln-flash: %s: no kiln-data partition (not a kiln disk)\n", target), 2;
    int rc = id_write(target, data, &idf);
    memset(&idf, 0, sizeof idf);
    if (rc) return rc;
    printf("kiln-flash: %s: the identity of %s is on the data partition (" ID_PROV_DIR "/)\n", target, dir);
    return 0;
}

static int cmd_update(const char *bundle, const char *target, int tries) {
    uint64_t bsize, tsize;
    int in = open_target(bundle, O_RDONLY, &bsize);
    if (in < 0) return 2;
    man_manifest m;
    if (bun_verify(in, 0, bsize, pubkey, &m, err, sizeof err) < 0)
        return fprintf(stderr, "kiln-flash: %s: REFUSED, nothing written: %s\n", bundle, err), 1;
    if (bsize != bun_length(&m)) return fprintf(stderr, "kiln-flash: %s: REFUSED, nothing written: bytes after the last part\n", bundle), 1;
    int ui = -1;
    for (int i = 0; i < m.nparts; i++)
        if (!strcmp(m.parts[i].name, "uki")) ui = i;
    if (ui < 0) return fprintf(stderr, "kiln-flash: %s: REFUSED: no `uki` part\n", bundle), 1;
    char why[640];
    if (sb_check(in, bun_part_offset(&m, ui), m.parts[ui].size, why, sizeof why))
        return fprintf(stderr, "kiln-flash: %s: REFUSED, nothing written: %s\n", bundle, why), 1;

    int out = open_target(target, O_RDWR, &tsize);
    if (out < 0) return 2;
    table t;
    if (read_gpt(out, tsize, &t, target) < 0) return 2;
    const part *esp = find(&t, "kiln-esp"), *slots[2] = {find(&t, "kiln-a"), find(&t, "kiln-b")};
    if (!esp || !slots[0] || !slots[1]) return fprintf(stderr, "kiln-flash: %s: not a kiln disk (kiln-esp, kiln-a, kiln-b)\n", target), 2;
    char spec[4200];
    esp_spec(spec, sizeof spec, target, esp);
    esp_state es;
    if (esp_list(spec, &es) < 0) return 2;
    /* The slot systemd-boot boots now: of the entries it would try, the newest version. */
    int cur = -1;
    uint32_t best = 0;
    for (int i = 0; i < 2; i++) {
        uint32_t v;
        if (!es.file[i][0] || tries_left(es.file[i]) == 0 || slot_version(out, slots[i], &v) < 0) continue;
        if (cur < 0 || v > best) cur = i, best = v;
    }
    int dst = cur == 0 ? 1 : 0;
    if (cur < 0) dst = 0;
    if (bsize > slots[dst]->len) return fprintf(stderr, "kiln-flash: %s: REFUSED: larger than slot %c\n", bundle, 'a' + dst), 1;
    /* The old boot entry of the target slot goes first: no half-written slot is bootable. */
    if (es.file[dst][0]) {
        char path[128];
        snprintf(path, sizeof path, "::/EFI/Linux/%s", es.file[dst]);
        char *argv[] = {"mdel", "-i", spec, path, NULL};
        if (run(argv, NULL, 0) < 0) return fprintf(stderr, "kiln-flash: cannot remove %s from the ESP\n", es.file[dst]), 2;
    }
    if (copy_verified(in, 0, out, slots[dst]->off, bsize, "slot")) return 2;
    /* The UKI onto the ESP, boot-counted, then read back through mtools and compared. */
    char tmp[] = "/tmp/kiln-flash-uki.XXXXXX", back[] = "/tmp/kiln-flash-back.XXXXXX";
    int tf = mkstemp(tmp), bf = mkstemp(back);
    if (tf < 0 || bf < 0) return fprintf(stderr, "kiln-flash: mkstemp: %s\n", strerror(errno)), 2;
    close(bf);
    int rc = copy_verified(in, bun_part_offset(&m, ui), tf, 0, m.parts[ui].size, "uki");
    close(tf);
    char name[64], path[128];
    snprintf(name, sizeof name, "kiln-%c+%d.efi", 'a' + dst, tries);
    snprintf(path, sizeof path, "::/EFI/Linux/%s", name);
    char *cp[] = {"mcopy", "-o", "-i", spec, tmp, path, NULL};
    char *cpb[] = {"mcopy", "-o", "-n", "-i", spec, path, back, NULL};
    if (!rc && (run(cp, NULL, 0) < 0 || run(cpb, NULL, 0) < 0)) {
        fprintf(stderr, "kiln-flash: mcopy to the ESP failed\n");
        rc = -1;
    }
    if (!rc) {
        int b = open(back, O_RDONLY | O_CLOEXEC);
        uint8_t h[32];
        if (b < 0 || bun_hash_range(b, 0, m.parts[ui].size, h, err, sizeof err) < 0 || memcmp(h, m.parts[ui].sha256, 32)) {
            fprintf(stderr, "kiln-flash: the ESP's copy of the UKI reads back different\n");
            rc = -1;
        }
        if (b >= 0) close(b);
    }
    unlink(tmp), unlink(back);
    if (rc) return 2;
    if (fsync(out) < 0 && errno != EINVAL) return fprintf(stderr, "kiln-flash: fsync %s: %s\n", target, strerror(errno)), 2;
    printf("kiln-flash: %s: version %u in slot %c, boot entry %s (%d tries; kiln-init blesses it once healthy)\n", target,
           (unsigned)m.version, 'a' + dst, name, tries);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    if (!strcmp(argv[1], "install") && argc == 4) return cmd_install(argv[2], argv[3], NULL);
    if (!strcmp(argv[1], "install") && argc == 6 && !strcmp(argv[4], "--identity")) return cmd_install(argv[2], argv[3], argv[5]);
    if (!strcmp(argv[1], "identity") && argc == 4) return cmd_identity(argv[2], argv[3]);
    if (!strcmp(argv[1], "status") && argc == 3) return cmd_status(argv[2]);
    if (!strcmp(argv[1], "update") && (argc == 4 || argc == 6)) {
        int tries = 3;
        if (argc == 6) {
            char *end;
            long v = strtol(argv[5], &end, 10);
            if (strcmp(argv[4], "--tries") || *end || v < 1 || v > 9) return fprintf(stderr, "kiln-flash: --tries 1..9\n"), 2;
            tries = (int)v;
        }
        return cmd_update(argv[2], argv[3], tries);
    }
    return usage();
}
