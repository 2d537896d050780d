/* kiln-image: signing keys, signed slot bundles (image/bundle.h), their verification.
 *
 *   kiln-image keygen --key PRIV --pub PUB [--if-missing]
 *   kiln-image sign --key PRIV --version N [--build-time T] --part NAME=FILE... --out BUNDLE
 *                   [--manifest MANIFEST]
 *   kiln-image verify --pub PUB BUNDLE
 *   kiln-image show BUNDLE
 *   kiln-image pubkey-c --pub PUB --out HEADER     the key as C, for kiln-init and kiln-flash
 *   kiln-image sb-verify --cert DB.CRT EFI...      each PE image is signed for Secure Boot
 *                   by DB.CRT's key (image/authenticode.c: what kiln-init checks an update's
 *                   UKI with; sbverify is the independent check)
 *
 * --build-time defaults to $SOURCE_DATE_EPOCH, else 0: the same inputs give the same bytes
 * (the signature is deterministic). Exit status: 0 good, 1 refused (bad signature, hash,
 * format), 2 usage or I/O. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "image/authenticode.h"
#include "image/bundle.h"
#include "image/manifest.h"

#define MAX_ARGS 16

static char err[512];

static int usage(void) {
    fprintf(stderr, "usage: kiln-image keygen --key PRIV --pub PUB [--if-missing]\n"
                    "       kiln-image sign --key PRIV --version N [--build-time T] --part NAME=FILE... --out BUNDLE [--manifest FILE]\n"
                    "       kiln-image verify --pub PUB BUNDLE\n"
                    "       kiln-image show BUNDLE\n"
                    "       kiln-image pubkey-c --pub PUB --out HEADER\n"
                    "       kiln-image sb-verify --cert DB.CRT EFI...\n");
    return 2;
}

/* ------------------------------------------------------------------ files */

static int read_small(const char *path, char *buf, size_t cap, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fprintf(stderr, "kiln-image: open %s: %s\n", path, strerror(errno)), -1;
    ssize_t n = read(fd, buf, cap);
    int e = errno;
    close(fd);
    if (n < 0) return fprintf(stderr, "kiln-image: read %s: %s\n", path, strerror(e)), -1;
    if ((size_t)n == cap) return fprintf(stderr, "kiln-image: %s: too large for a key file\n", path), -1;
    *len = (size_t)n;
    return 0;
}

/* Writes data to path through path.tmp + rename, with mode. */
static int write_file(const char *path, const void *data, size_t n, mode_t mode) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return fprintf(stderr, "kiln-image: %s: path too long\n", path), -1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0) return fprintf(stderr, "kiln-image: open %s: %s\n", tmp, strerror(errno)), -1;
    const char *p = data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            fprintf(stderr, "kiln-image: write %s: %s\n", tmp, strerror(errno));
            close(fd);
            unlink(tmp);
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    if (fchmod(fd, mode) < 0 || close(fd) < 0 || rename(tmp, path) < 0) {
        fprintf(stderr, "kiln-image: write %s: %s\n", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

static int load_key(int is_private, const char *path, uint8_t *key) {
    char buf[MAN_KEY_TEXT_MAX];
    size_t n;
    if (read_small(path, buf, sizeof buf, &n) < 0) return -1;
    if (man_key_parse(is_private, buf, n, key, err, sizeof err) < 0) return fprintf(stderr, "kiln-image: %s: %s\n", path, err), -1;
    return 0;
}

/* ------------------------------------------------------------------ options */

typedef struct {
    const char *key, *pub, *out, *manifest, *version, *build_time, *cert;
    const char *parts[MAN_PARTS];
    int nparts, if_missing;
    const char *pos[MAX_ARGS];
    int npos;
} opts;

static int parse_opts(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const char **slot = NULL;
        if (!strcmp(a, "--if-missing")) { o->if_missing = 1; continue; }
        if (!strcmp(a, "--key")) slot = &o->key;
        else if (!strcmp(a, "--pub")) slot = &o->pub;
        else if (!strcmp(a, "--out")) slot = &o->out;
        else if (!strcmp(a, "--manifest")) slot = &o->manifest;
        else if (!strcmp(a, "--version")) slot = &o->version;
        else if (!strcmp(a, "--build-time")) slot = &o->build_time;
        else if (!strcmp(a, "--cert")) slot = &o->cert;
        else if (!strcmp(a, "--part")) {
            if (o->nparts == MAN_PARTS) return fprintf(stderr, "kiln-image: at most %d parts\n", MAN_PARTS), -1;
            slot = &o->parts[o->nparts++];
        } else if (a[0] == '-') return fprintf(stderr, "kiln-image: unknown option %s\n", a), -1;
        else {
            if (o->npos == MAX_ARGS) return -1;
            o->pos[o->npos++] = a;
            continue;
        }
        if (!v) return fprintf(stderr, "kiln-image: %s needs a value\n", a), -1;
        *slot = v;
        i++;
    }
    return 0;
}

static int parse_u64(const char *s, uint64_t max, uint64_t *v) {
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-' || *s == '+') return -1;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno || *end || x > max) return -1;
    *v = x;
    return 0;
}

/* ------------------------------------------------------------------ commands */

static int cmd_keygen(opts *o) {
    if (!o->key || !o->pub || o->npos) return usage();
    if (o->if_missing && access(o->key, F_OK) == 0) {
        uint8_t priv[MAN_PRIV_LEN], pub[MAN_PUB_LEN];
        if (load_key(1, o->key, priv) < 0) return 2;
        if (man_pub_of(priv, pub, err, sizeof err) < 0) return fprintf(stderr, "kiln-image: %s\n", err), 2;
        char text[MAN_KEY_TEXT_MAX];
        int n = man_key_format(0, pub, text, sizeof text);
        return n < 0 || write_file(o->pub, text, (size_t)n, 0644) < 0 ? 2 : 0; /* the public half, always fresh */
    }
    uint8_t priv[MAN_PRIV_LEN], pub[MAN_PUB_LEN];
    if (man_keygen(priv, pub, err, sizeof err) < 0) return fprintf(stderr, "kiln-image: %s\n", err), 2;
    char text[MAN_KEY_TEXT_MAX];
    int n = man_key_format(1, priv, text, sizeof text);
    if (n < 0 || write_file(o->key, text, (size_t)n, 0600) < 0) return 2;
    n = man_key_format(0, pub, text, sizeof text);
    if (n < 0 || write_file(o->pub, text, (size_t)n, 0644) < 0) return 2;
    fprintf(stderr, "kiln-image: new P-256 key: %s (private), %s (public)\n", o->key, o->pub);
    return 0;
}

static int cmd_sign(opts *o) {
    if (!o->key || !o->version || !o->out || o->nparts == 0 || o->npos) return usage();
    man_manifest m;
    memset(&m, 0, sizeof m);
    uint64_t v;
    if (parse_u64(o->version, UINT32_MAX, &v) < 0 || v == 0)
        return fprintf(stderr, "kiln-image: --version must be 1..4294967295\n"), 2;
    m.version = (uint32_t)v;
    const char *bt = o->build_time ? o->build_time : getenv("SOURCE_DATE_EPOCH");
    if (bt && *bt && parse_u64(bt, UINT64_MAX, &m.build_time) < 0)
        return fprintf(stderr, "kiln-image: build time `%s` is not a number of seconds\n", bt), 2;
    int fds[MAN_PARTS];
    for (int i = 0; i < o->nparts; i++) {
        const char *eq = strchr(o->parts[i], '=');
        man_part *p = &m.parts[i];
        if (!eq || (size_t)(eq - o->parts[i]) >= MAN_NAME_MAX) return fprintf(stderr, "kiln-image: --part NAME=FILE\n"), 2;
        memcpy(p->name, o->parts[i], (size_t)(eq - o->parts[i]));
        p->name[eq - o->parts[i]] = 0;
        if (!man_name_ok(p->name)) return fprintf(stderr, "kiln-image: part name `%s`: 1..31 of [a-z0-9-]\n", p->name), 2;
        fds[i] = open(eq + 1, O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (fds[i] < 0 || fstat(fds[i], &st) < 0) return fprintf(stderr, "kiln-image: %s: %s\n", eq + 1, strerror(errno)), 2;
        p->size = (uint64_t)st.st_size;
        if (bun_hash_range(fds[i], 0, p->size, p->sha256, err, sizeof err) < 0) return fprintf(stderr, "kiln-image: %s: %s\n", eq + 1, err), 2;
    }
    m.nparts = o->nparts;
    uint8_t priv[MAN_PRIV_LEN];
    if (load_key(1, o->key, priv) < 0) return 2;
    static char text[MAN_MAX + 1];
    int n = man_sign(&m, priv, text, sizeof text, err, sizeof err);
    memset(priv, 0, sizeof priv);
    if (n < 0) return fprintf(stderr, "kiln-image: %s\n", err), 2;
    if (o->manifest && write_file(o->manifest, text, (size_t)n, 0644) < 0) return 2;

    /* The bundle: manifest block, then each part on its boundary. */
    uint64_t total = bun_length(&m);
    char *buf = calloc(1, (size_t)total);
    if (!buf) return fprintf(stderr, "kiln-image: out of memory for a %llu-byte bundle\n", (unsigned long long)total), 2;
    memcpy(buf, text, (size_t)n);
    for (int i = 0; i < m.nparts; i++) {
        uint64_t off = bun_part_offset(&m, i), got = 0;
        while (got < m.parts[i].size) {
            ssize_t r = pread(fds[i], buf + off + got, (size_t)(m.parts[i].size - got), (off_t)got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return fprintf(stderr, "kiln-image: part %s changed while signing\n", m.parts[i].name), 2;
            got += (uint64_t)r;
        }
        close(fds[i]);
    }
    /* The parts were hashed, then copied: hash the copy again so a file changed between the
     * two reads cannot give a bundle whose manifest lies. */
    for (int i = 0; i < m.nparts; i++) {
        uint8_t h[32];
        man_sha s;
        man_sha_init(&s);
        man_sha_update(&s, buf + bun_part_offset(&m, i), (size_t)m.parts[i].size);
        man_sha_final(&s, h);
        if (memcmp(h, m.parts[i].sha256, 32)) return fprintf(stderr, "kiln-image: part %s changed while signing\n", m.parts[i].name), 2;
    }
    int rc = write_file(o->out, buf, (size_t)total, 0644);
    free(buf);
    if (rc < 0) return 2;
    fprintf(stderr, "kiln-image: %s: version %u, %d part(s), %llu bytes, signed\n", o->out, (unsigned)m.version, m.nparts,
            (unsigned long long)total);
    return 0;
}

static void show(const man_manifest *m) {
    printf("version %u\nbuild-time %llu\n", (unsigned)m->version, (unsigned long long)m->build_time);
    for (int i = 0; i < m->nparts; i++) {
        char hex[65];
        man_hex(m->parts[i].sha256, 32, hex);
        printf("part %s %llu %s\n", m->parts[i].name, (unsigned long long)m->parts[i].size, hex);
    }
}

static int open_bundle(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) fprintf(stderr, "kiln-image: open %s: %s\n", path, strerror(errno));
    return fd;
}

static int cmd_verify(opts *o) {
    if (!o->pub || o->npos != 1) return usage();
    uint8_t pub[MAN_PUB_LEN];
    if (load_key(0, o->pub, pub) < 0) return 2;
    int fd = open_bundle(o->pos[0]);
    if (fd < 0) return 2;
    struct stat st;
    man_manifest m;
    int r = fstat(fd, &st) < 0 ? -errno : bun_verify(fd, 0, (uint64_t)st.st_size, pub, &m, err, sizeof err);
    close(fd);
    if (r < 0) return fprintf(stderr, "kiln-image: %s: REFUSED: %s\n", o->pos[0], err), 1;
    if ((uint64_t)st.st_size != bun_length(&m))
        return fprintf(stderr, "kiln-image: %s: REFUSED: %llu bytes after the last part\n", o->pos[0],
                       (unsigned long long)((uint64_t)st.st_size - bun_length(&m))), 1;
    printf("%s: good signature, %d part(s) match\n", o->pos[0], m.nparts);
    show(&m);
    return 0;
}

static int cmd_show(opts *o) {
    if (o->npos != 1) return usage();
    int fd = open_bundle(o->pos[0]);
    if (fd < 0) return 2;
    man_manifest m;
    char text[MAN_MAX + 1];
    int r = bun_read_manifest(fd, 0, &m, text, err, sizeof err);
    close(fd);
    if (r < 0) return fprintf(stderr, "kiln-image: %s: %s\n", o->pos[0], err), 1;
    show(&m);
    return 0;
}

static int cmd_pubkey_c(opts *o) {
    if (!o->pub || !o->out || o->npos) return usage();
    uint8_t pub[MAN_PUB_LEN];
    if (load_key(0, o->pub, pub) < 0) return 2;
    char text[1024];
    size_t n = (size_t)snprintf(text, sizeof text, "/* generated by kiln-image pubkey-c from %s: the image signing key */\n"
                                                   "#define IMG_PUBKEY_BYTES {", o->pub);
    for (int i = 0; i < MAN_PUB_LEN && n < sizeof text; i++)
        n += (size_t)snprintf(text + n, sizeof text - n, "%s0x%02x", i ? "," : "", pub[i]);
    if (n < sizeof text) n += (size_t)snprintf(text + n, sizeof text - n, "}\n");
    if (n >= sizeof text) return 2;
    /* Only rewritten when it changes: programs that include it rebuild only then. */
    char old[1024];
    size_t on;
    int fd = open(o->out, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t r = read(fd, old, sizeof old);
        close(fd);
        on = r > 0 ? (size_t)r : 0;
        if (on == n && !memcmp(old, text, n)) return 0;
    }
    return write_file(o->out, text, n, 0644) < 0 ? 2 : 0;
}

static int cmd_sb_verify(opts *o) {
    if (!o->cert || o->npos < 1) return usage();
    static unsigned char cert[64 << 10];
    size_t n;
    if (read_small(o->cert, (char *)cert, sizeof cert - 1, &n) < 0) return 2;
    cert[n++] = 0; /* PEM is parsed with its NUL */
    int bad = 0;
    for (int i = 0; i < o->npos; i++) {
        int fd = open(o->pos[i], O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0) {
            fprintf(stderr, "kiln-image: %s: %s\n", o->pos[i], strerror(errno));
            if (fd >= 0) close(fd);
            return 2;
        }
        int r = ac_verify(fd, 0, (uint64_t)st.st_size, cert, n, err, sizeof err);
        close(fd);
        if (r < 0) fprintf(stderr, "kiln-image: %s: REFUSED: %s\n", o->pos[i], err), bad = 1;
        else printf("%s: signed by %s's key\n", o->pos[i], o->cert);
    }
    return bad;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    opts o;
    if (parse_opts(argc, argv, &o) < 0) return usage();
    const char *c = argv[1];
    if (!strcmp(c, "keygen")) return cmd_keygen(&o);
    if (!strcmp(c, "sign")) return cmd_sign(&o);
    if (!strcmp(c, "verify")) return cmd_verify(&o);
    if (!strcmp(c, "show")) return cmd_show(&o);
    if (!strcmp(c, "pubkey-c")) return cmd_pubkey_c(&o);
    if (!strcmp(c, "sb-verify")) return cmd_sb_verify(&o);
    return usage();
}
