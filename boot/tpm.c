/* tpm: see tpm.h. Names and numbers are the TPM 2.0 Library specification's (Part 2: the
 * structures, Part 3: the commands). Everything on the wire is big-endian.
 *
 * This file needs libc and mbedTLS's SHA-256 (a policy digest) only: the unit test and the
 * fuzz target include it whole. */
#include "boot/tpm.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "mbedtls/sha256.h"

/* ------------------------------------------------------------------ the numbers */

#define TPM_ST_NO_SESSIONS 0x8001
#define TPM_ST_SESSIONS 0x8002
#define TPM_CC_STARTUP 0x00000144
#define TPM_CC_PCR_EXTEND 0x00000182
#define TPM_CC_PCR_READ 0x0000017E
#define TPM_CC_CREATE_PRIMARY 0x00000131
#define TPM_CC_CREATE 0x00000153
#define TPM_CC_LOAD 0x00000157
#define TPM_CC_UNSEAL 0x0000015E
#define TPM_CC_FLUSH_CONTEXT 0x00000165
#define TPM_CC_START_AUTH_SESSION 0x00000176
#define TPM_CC_POLICY_PCR 0x0000017F
#define TPM_CC_POLICY_GET_DIGEST 0x00000189
#define TPM_RH_OWNER 0x40000001
#define TPM_RH_NULL 0x40000007
#define TPM_SE_POLICY 0x01
#define TPM_ALG_NULL 0x0010
#define TPM_ALG_KEYEDHASH 0x0008
#define TPM_ALG_ECC 0x0023
#define TPM_ALG_AES 0x0006
#define TPM_ALG_CFB 0x0043
#define TPM_ECC_NIST_P256 0x0003
/* objectAttributes bits (Part 2, TPMA_OBJECT) */
#define TPMA_FIXED_TPM 0x00000002
#define TPMA_FIXED_PARENT 0x00000010
#define TPMA_SENSITIVE_DATA_ORIGIN 0x00000020
#define TPMA_USER_WITH_AUTH 0x00000040
#define TPMA_NO_DA 0x00000400
#define TPMA_RESTRICTED 0x00010000
#define TPMA_DECRYPT 0x00020000
#define TPM_SU_CLEAR 0x0000
#define TPM_RS_PW 0x40000009 /* the password session: empty auth, no HMAC */
#define TPM_ALG_SHA256 0x000B
#define TPM_PCR_COUNT 24     /* PCRs 0..23 on every PC-client TPM */
#define TPM_PCR_SELECT 3     /* bytes of a PCR bitmap for 24 PCRs */
#define TPM_HEADER 10        /* tag u16, size u32, code u32 */

#define TPM_RC_SUCCESS 0x000
#define TPM_RC_INITIALIZE 0x100 /* Startup on a started TPM */
#define TPM_RC_FAILURE 0x101
#define TPM_RC_YIELDED 0x908    /* the warnings that mean "send it again" */
#define TPM_RC_TESTING 0x90A
#define TPM_RC_RETRY 0x922
#define TPM_RETRIES 5
#define TPM_RC_POLICY_FAIL 0x09D /* format one: with the session's number in bits 8..11 */
#define TPM_RC_INTEGRITY 0x09F
#define TPM_RC_FMT1_MASK 0x0BF  /* a format-one code without which handle/session/parameter */

/* ------------------------------------------------------------------ writing a command */

/* A command under construction: a put past cap marks it bad instead of writing. */
typedef struct {
    uint8_t *p;
    size_t cap, at;
    int bad;
} wr;

static void put(wr *w, const void *src, size_t n) {
    if (w->bad || w->cap - w->at < n) {
        w->bad = 1;
        return;
    }
    memcpy(w->p + w->at, src, n);
    w->at += n;
}

static void put_u8(wr *w, uint8_t v) { put(w, &v, 1); }
static void put_u16(wr *w, uint16_t v) { put(w, (uint8_t[]){(uint8_t)(v >> 8), (uint8_t)v}, 2); }
static void put_u32(wr *w, uint32_t v) {
    put(w, (uint8_t[]){(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v}, 4);
}

/* The header with a size to be filled in by done(). */
static wr begin(uint8_t *buf, size_t cap, uint16_t tag, uint32_t code) {
    wr w = {buf, cap, 0, 0};
    put_u16(&w, tag);
    put_u32(&w, 0);
    put_u32(&w, code);
    return w;
}

/* The command's length with its size field set, or 0 when it did not fit. */
static size_t done(wr *w) {
    if (w->bad || w->at > UINT32_MAX) return 0;
    uint32_t n = (uint32_t)w->at;
    uint8_t *s = w->p + 2;
    s[0] = (uint8_t)(n >> 24), s[1] = (uint8_t)(n >> 16), s[2] = (uint8_t)(n >> 8), s[3] = (uint8_t)n;
    return w->at;
}

/* The authorization area of a command with one handle that needs auth: the password
 * session TPM_RS_PW with an empty password (a PCR's, the owner hierarchy's and our primary
 * key's authValue), or a policy session, whose policy is all the authorization there is (no
 * PolicyAuthValue: no HMAC). continueSession stays clear: the TPM ends a policy session after
 * the command that used it. */
static void put_auth(wr *w, uint32_t session) {
    put_u32(w, 4 + 2 + 1 + 2); /* authorizationSize */
    put_u32(w, session);
    put_u16(w, 0); /* nonceCaller: empty */
    put_u8(w, 0);  /* sessionAttributes */
    put_u16(w, 0); /* hmac: the empty password, or none */
}
static void put_pw_auth(wr *w) { put_auth(w, TPM_RS_PW); }

/* A TPM2B's size, once its body is written: the u16 at at counts what follows it. */
static void patch_size(wr *w, size_t at) {
    if (w->bad) return;
    size_t n = w->at - at - 2;
    if (n > 0xffff) {
        w->bad = 1;
        return;
    }
    w->p[at] = (uint8_t)(n >> 8), w->p[at + 1] = (uint8_t)n;
}

/* A TPMS_PCR_SELECTION of the SHA-256 bank with one PCR. */
static void put_pcr_select(wr *w, int pcr) {
    uint8_t sel[TPM_PCR_SELECT] = {0};
    sel[pcr / 8] = (uint8_t)(1u << (pcr % 8));
    put_u16(w, TPM_ALG_SHA256);
    put_u8(w, TPM_PCR_SELECT);
    put(w, sel, sizeof sel);
}

size_t tpm_cmd_startup(uint8_t *buf, size_t cap) {
    wr w = begin(buf, cap, TPM_ST_NO_SESSIONS, TPM_CC_STARTUP);
    put_u16(&w, TPM_SU_CLEAR);
    return done(&w);
}

size_t tpm_cmd_pcr_extend(uint8_t *buf, size_t cap, int pcr, const uint8_t digest[TPM_DIGEST_LEN]) {
    if (pcr < 0 || pcr >= TPM_PCR_COUNT) return 0;
    wr w = begin(buf, cap, TPM_ST_SESSIONS, TPM_CC_PCR_EXTEND);
    put_u32(&w, (uint32_t)pcr); /* pcrHandle: a PCR's handle is its number */
    put_pw_auth(&w);
    put_u32(&w, 1); /* TPML_DIGEST_VALUES: one bank */
    put_u16(&w, TPM_ALG_SHA256);
    put(&w, digest, TPM_DIGEST_LEN);
    return done(&w);
}

size_t tpm_cmd_pcr_read(uint8_t *buf, size_t cap, int pcr) {
    if (pcr < 0 || pcr >= TPM_PCR_COUNT) return 0;
    wr w = begin(buf, cap, TPM_ST_NO_SESSIONS, TPM_CC_PCR_READ);
    put_u32(&w, 1); /* TPML_PCR_SELECTION: one bank */
    put_pcr_select(&w, pcr);
    return done(&w);
}

/* ------------------------------------------------------------------ reading a response */

/* A response being read: a read past the end marks it bad and yields zeros, so a parser
 * checks once at the end instead of at every field (at <= n always holds). */
typedef struct {
    const uint8_t *p;
    size_t n, at;
    int bad;
} rd;

static const uint8_t *take(rd *r, size_t k) {
    if (r->bad || r->n - r->at < k) {
        r->bad = 1;
        r->at = r->n;
        return NULL;
    }
    const uint8_t *s = r->p + r->at;
    r->at += k;
    return s;
}

static uint8_t get_u8(rd *r) {
    const uint8_t *s = take(r, 1);
    return s ? s[0] : 0;
}
static uint16_t get_u16(rd *r) {
    const uint8_t *s = take(r, 2);
    return s ? (uint16_t)(s[0] << 8 | s[1]) : 0;
}
static uint32_t get_u32(rd *r) {
    const uint8_t *s = take(r, 4);
    return s ? (uint32_t)s[0] << 24 | (uint32_t)s[1] << 16 | (uint32_t)s[2] << 8 | s[3] : 0;
}

int tpm_rsp_header(const uint8_t *rsp, size_t n, uint32_t *rc) {
    rd r = {rsp, n, 0, 0};
    uint16_t tag = get_u16(&r);
    uint32_t size = get_u32(&r);
    *rc = get_u32(&r);
    if (r.bad || size != n || (tag != TPM_ST_NO_SESSIONS && tag != TPM_ST_SESSIONS)) return -EPROTO;
    /* An error response is the header alone, tagged without sessions. */
    if (*rc != TPM_RC_SUCCESS && (n != TPM_HEADER || tag != TPM_ST_NO_SESSIONS)) return -EPROTO;
    return 0;
}

/* A success response cut into its parts: nh handles into h, and params, a reader over
 * exactly the parameter area. A response with sessions has parameterSize before the
 * parameters and one session's reply after them (we send one session at most), checked
 * here. A response without has its parameters up to the end. */
static int rsp_split(const uint8_t *rsp, size_t n, int nh, uint32_t *h, rd *params, uint32_t *rc) {
    int e = tpm_rsp_header(rsp, n, rc);
    if (e < 0 || *rc != TPM_RC_SUCCESS) return e;
    rd r = {rsp, n, TPM_HEADER, 0};
    for (int i = 0; i < nh; i++) h[i] = get_u32(&r);
    int sessions = (rsp[0] << 8 | rsp[1]) == TPM_ST_SESSIONS;
    size_t plen = sessions ? get_u32(&r) : r.n - r.at;
    if (r.bad || plen > r.n - r.at) return -EPROTO;
    *params = (rd){rsp + r.at, plen, 0, 0};
    r.at += plen;
    if (sessions) {
        take(&r, get_u16(&r)); /* nonceTPM */
        get_u8(&r);            /* sessionAttributes */
        take(&r, get_u16(&r)); /* hmac */
    }
    return r.bad || r.at != n ? -EPROTO : 0;
}

/* The parameters were read to their end, and no further. */
static int params_done(const rd *p) { return !p->bad && p->at == p->n ? 0 : -EPROTO; }

/* A response with no handles and no parameters (Startup, PCR_Extend, PolicyPCR, FlushContext). */
static int rsp_empty(const uint8_t *rsp, size_t n, uint32_t *rc) {
    rd p = {0};
    int e = rsp_split(rsp, n, 0, NULL, &p, rc);
    if (e < 0 || *rc != TPM_RC_SUCCESS) return e;
    return p.n == 0 ? 0 : -EPROTO;
}

int tpm_rsp_pcr_read(const uint8_t *rsp, size_t n, int pcr, uint8_t out[TPM_DIGEST_LEN], uint32_t *rc) {
    int e = tpm_rsp_header(rsp, n, rc);
    if (e < 0 || *rc != TPM_RC_SUCCESS) return e;
    if (pcr < 0 || pcr >= TPM_PCR_COUNT) return -EINVAL;
    rd r = {rsp, n, TPM_HEADER, 0};
    get_u32(&r); /* pcrUpdateCounter */
    /* pcrSelectionOut: what the TPM read. We asked for one PCR of one bank, so the answer
     * is exactly that one, or nothing at all when the SHA-256 bank is not allocated. */
    uint32_t banks = get_u32(&r);
    int ours = 0, others = 0;
    for (uint32_t i = 0; i < banks && !r.bad; i++) {
        uint16_t alg = get_u16(&r);
        uint8_t sz = get_u8(&r);
        const uint8_t *sel = take(&r, sz);
        for (unsigned b = 0; sel && b < (unsigned)sz * 8; b++) {
            if (!(sel[b / 8] >> (b % 8) & 1)) continue;
            if (alg == TPM_ALG_SHA256 && b == (unsigned)pcr) ours++;
            else others++;
        }
    }
    uint32_t values = get_u32(&r); /* pcrValues: one TPM2B_DIGEST per selected PCR */
    if (r.bad) return -EPROTO;
    if (ours == 0 && others == 0 && values == 0) return r.at == n ? -ENOENT : -EPROTO;
    if (ours != 1 || others != 0 || values != 1) return -EPROTO;
    uint16_t len = get_u16(&r);
    const uint8_t *v = take(&r, len);
    if (r.bad || len != TPM_DIGEST_LEN || r.at != n) return -EPROTO;
    memcpy(out, v, TPM_DIGEST_LEN);
    return 0;
}

const char *tpm_rc_text(uint32_t rc, char *buf, size_t cap) {
    static const struct {
        uint32_t rc;
        const char *name;
    } names[] = {
        {TPM_RC_SUCCESS, "TPM_RC_SUCCESS"}, {TPM_RC_INITIALIZE, "TPM_RC_INITIALIZE"}, {TPM_RC_FAILURE, "TPM_RC_FAILURE"},
        {0x143, "TPM_RC_COMMAND_CODE"},     {0x907, "TPM_RC_LOCALITY"},               {TPM_RC_YIELDED, "TPM_RC_YIELDED"},
        {TPM_RC_TESTING, "TPM_RC_TESTING"}, {TPM_RC_RETRY, "TPM_RC_RETRY"},           {0x921, "TPM_RC_LOCKOUT"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].rc == rc) return snprintf(buf, cap, "%s (0x%03x)", names[i].name, (unsigned)rc), buf;
    /* Format-one codes (bit 7) carry which handle, session or parameter was wrong. */
    if (rc & 0x80) {
        const char *what = rc & 0x40 ? "parameter" : rc & 0x800 ? "session" : "handle";
        unsigned which = rc & 0x40 ? (rc >> 8) & 0xf : (rc >> 8) & 0x7;
        snprintf(buf, cap, "TPM error 0x%03x (0x%02x on %s %u)", (unsigned)rc, (unsigned)(rc & 0x3f) | 0x80, what, which);
    } else {
        snprintf(buf, cap, "TPM error 0x%03x", (unsigned)rc);
    }
    return buf;
}

/* ------------------------------------------------------------------ the device */

int tpm_open(tpm_dev *t, const char *path) {
    static const char *const devs[] = {"/dev/tpmrm0", "/dev/tpm0"};
    memset(t, 0, sizeof *t);
    t->fd = -1;
    int e = ENOENT;
    for (size_t i = 0; i < 2 && t->fd < 0; i++) {
        /* The resource manager (tpmrm0) first: it flushes what a command leaves loaded. */
        const char *p = path ? path : devs[i];
        do t->fd = open(p, O_RDWR | O_CLOEXEC); while (t->fd < 0 && errno == EINTR);
        if (t->fd >= 0) snprintf(t->path, sizeof t->path, "%s", p);
        else if (errno != ENOENT || path) e = errno; /* EBUSY (tpm0 in use) says more than ENOENT */
        if (path) break;
    }
    return t->fd < 0 ? -e : 0;
}

void tpm_use_fd(tpm_dev *t, int fd) {
    memset(t, 0, sizeof *t);
    t->fd = fd;
}

void tpm_close(tpm_dev *t) {
    if (t->fd >= 0 && t->path[0]) close(t->fd);
    t->fd = -1;
}

static int write_all(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? -errno : -EIO;
        p += w, n -= (size_t)w;
    }
    return 0;
}

/* One response: a character device gives it whole to one read; a socket may give it in
 * pieces, so read until the header's size has arrived. Never more than cap, never a wait
 * longer than TPM_TIMEOUT_MS for the next piece. */
static int read_rsp(int fd, uint8_t *rsp, size_t cap, size_t *got) {
    size_t have = 0, need = TPM_HEADER;
    while (have < need) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, TPM_TIMEOUT_MS);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -errno;
        if (r == 0) return -ETIMEDOUT;
        ssize_t k = read(fd, rsp + have, cap - have);
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (k < 0) return -errno;
        if (k == 0) return -EPIPE; /* the other end closed mid-response */
        have += (size_t)k;
        if (need == TPM_HEADER && have >= TPM_HEADER) {
            uint32_t size = (uint32_t)rsp[2] << 24 | (uint32_t)rsp[3] << 16 | (uint32_t)rsp[4] << 8 | rsp[5];
            if (size < TPM_HEADER || size > cap) return -EPROTO;
            need = size;
        }
    }
    if (have != need) return -EPROTO; /* bytes after the response */
    *got = have;
    return 0;
}

/* Sends cmd and reads its response into rsp; a TPM asking to be asked again is. */
static int xfer(tpm_dev *t, const uint8_t *cmd, size_t n, uint8_t *rsp, size_t *got) {
    if (t->fd < 0) return -EBADF;
    if (!n) return -EINVAL;
    for (int i = 0;; i++) {
        int e = write_all(t->fd, cmd, n);
        if (e == 0) e = read_rsp(t->fd, rsp, TPM_BUF_MAX, got);
        if (e < 0) return e;
        uint32_t rc = *got >= TPM_HEADER ? (uint32_t)rsp[6] << 24 | (uint32_t)rsp[7] << 16 | (uint32_t)rsp[8] << 8 | rsp[9] : 0;
        if (i + 1 >= TPM_RETRIES || (rc != TPM_RC_YIELDED && rc != TPM_RC_TESTING && rc != TPM_RC_RETRY)) return 0;
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000 << i}, NULL);
    }
}

/* The result of a parsed response: 0, -EIO with t->rc, or the parser's error. */
static int outcome(tpm_dev *t, int e, uint32_t rc) {
    if (e < 0) return e;
    if (rc != TPM_RC_SUCCESS) return t->rc = rc, -EIO;
    return 0;
}

int tpm_startup(tpm_dev *t) {
    uint8_t cmd[64], rsp[TPM_BUF_MAX];
    size_t got = 0;
    uint32_t rc = 0;
    int e = xfer(t, cmd, tpm_cmd_startup(cmd, sizeof cmd), rsp, &got);
    if (e < 0) return e;
    e = rsp_empty(rsp, got, &rc);
    if (e == 0 && rc == TPM_RC_INITIALIZE) return 0; /* the firmware or the kernel started it */
    return outcome(t, e, rc);
}

int tpm_pcr_extend(tpm_dev *t, int pcr, const uint8_t digest[TPM_DIGEST_LEN]) {
    uint8_t cmd[128], rsp[TPM_BUF_MAX];
    size_t got = 0;
    uint32_t rc = 0;
    int e = xfer(t, cmd, tpm_cmd_pcr_extend(cmd, sizeof cmd, pcr, digest), rsp, &got);
    if (e < 0) return e;
    e = rsp_empty(rsp, got, &rc);
    return outcome(t, e, rc);
}

int tpm_pcr_read(tpm_dev *t, int pcr, uint8_t out[TPM_DIGEST_LEN]) {
    uint8_t cmd[64], rsp[TPM_BUF_MAX];
    size_t got = 0;
    uint32_t rc = 0;
    int e = xfer(t, cmd, tpm_cmd_pcr_read(cmd, sizeof cmd, pcr), rsp, &got);
    if (e < 0) return e;
    e = tpm_rsp_pcr_read(rsp, got, pcr, out, &rc);
    return outcome(t, e, rc);
}

/* ------------------------------------------------------------------ sealing */

#define SEAL_ATTRS (TPMA_FIXED_TPM | TPMA_FIXED_PARENT | TPMA_NO_DA) /* no userWithAuth: policy only */
#define PRIMARY_ATTRS                                                                                                 \
    (TPMA_FIXED_TPM | TPMA_FIXED_PARENT | TPMA_SENSITIVE_DATA_ORIGIN | TPMA_USER_WITH_AUTH | TPMA_NO_DA | TPMA_RESTRICTED | \
     TPMA_DECRYPT)

void tpm_policy_pcr(int pcr, const uint8_t value[TPM_DIGEST_LEN], uint8_t policy[TPM_DIGEST_LEN]) {
    /* policyDigest' = H(policyDigest || TPM_CC_PolicyPCR || pcrs || H(values)), from zeros. */
    uint8_t buf[TPM_DIGEST_LEN + 4 + 4 + 2 + 1 + TPM_PCR_SELECT + TPM_DIGEST_LEN];
    wr w = {buf, sizeof buf, 0, 0};
    uint8_t zero[TPM_DIGEST_LEN] = {0}, hv[TPM_DIGEST_LEN];
    mbedtls_sha256(value, TPM_DIGEST_LEN, hv, 0);
    put(&w, zero, sizeof zero);
    put_u32(&w, TPM_CC_POLICY_PCR);
    put_u32(&w, 1);
    put_pcr_select(&w, pcr < 0 || pcr >= TPM_PCR_COUNT ? 0 : pcr);
    put(&w, hv, sizeof hv);
    mbedtls_sha256(buf, w.at, policy, 0);
}

/* One command whose response has nh handles: sends it, splits the answer. */
static int call(tpm_dev *t, wr *w, uint8_t *rsp, int nh, uint32_t *h, rd *params) {
    size_t got = 0;
    uint32_t rc = 0;
    int e = xfer(t, w->p, done(w), rsp, &got);
    if (e < 0) return e;
    e = rsp_split(rsp, got, nh, h, params, &rc);
    return outcome(t, e, rc);
}

/* Skips a TPM2B in a response. */
static void skip_2b(rd *r) { take(r, get_u16(r)); }

/* The storage primary key: ECC P-256, restricted decrypt, AES-128-CFB for its children, no
 * unique data. The same template on the same TPM gives the same key. */
static int create_primary(tpm_dev *t, uint32_t *handle) {
    uint8_t cmd[256], rsp[TPM_BUF_MAX];
    wr w = begin(cmd, sizeof cmd, TPM_ST_SESSIONS, TPM_CC_CREATE_PRIMARY);
    put_u32(&w, TPM_RH_OWNER);
    put_pw_auth(&w);
    put_u16(&w, 4), put_u16(&w, 0), put_u16(&w, 0); /* inSensitive: no userAuth, no data */
    size_t at = w.at;
    put_u16(&w, 0); /* inPublic's size */
    put_u16(&w, TPM_ALG_ECC);
    put_u16(&w, TPM_ALG_SHA256);
    put_u32(&w, PRIMARY_ATTRS);
    put_u16(&w, 0); /* authPolicy: none */
    put_u16(&w, TPM_ALG_AES), put_u16(&w, 128), put_u16(&w, TPM_ALG_CFB); /* symmetric */
    put_u16(&w, TPM_ALG_NULL);                                            /* scheme */
    put_u16(&w, TPM_ECC_NIST_P256);
    put_u16(&w, TPM_ALG_NULL);      /* kdf */
    put_u16(&w, 0), put_u16(&w, 0); /* unique: an empty point */
    patch_size(&w, at);
    put_u16(&w, 0); /* outsideInfo */
    put_u32(&w, 0); /* creationPCR: none */
    rd p;
    int e = call(t, &w, rsp, 1, handle, &p);
    if (e < 0) return e;
    skip_2b(&p);                               /* outPublic */
    skip_2b(&p);                               /* creationData */
    skip_2b(&p);                               /* creationHash */
    get_u16(&p), get_u32(&p), skip_2b(&p);     /* creationTicket */
    skip_2b(&p);                               /* name */
    return params_done(&p);
}

static int flush(tpm_dev *t, uint32_t handle) {
    uint8_t cmd[32], rsp[TPM_BUF_MAX];
    wr w = begin(cmd, sizeof cmd, TPM_ST_NO_SESSIONS, TPM_CC_FLUSH_CONTEXT);
    put_u32(&w, handle);
    rd p;
    int e = call(t, &w, rsp, 0, NULL, &p);
    return e < 0 ? e : params_done(&p);
}

/* A TPM2B from a response into buf (cap bytes). */
static void get_2b(rd *r, uint8_t *buf, size_t cap, uint16_t *len) {
    uint16_t n = get_u16(r);
    const uint8_t *s = take(r, n);
    if (!s || n > cap) {
        r->bad = 1;
        *len = 0;
        return;
    }
    memcpy(buf, s, n);
    *len = n;
}

static int create_sealed(tpm_dev *t, uint32_t parent, const uint8_t policy[TPM_DIGEST_LEN], const uint8_t *data, size_t n,
                         tpm_sealed *out) {
    uint8_t cmd[512], rsp[TPM_BUF_MAX];
    wr w = begin(cmd, sizeof cmd, TPM_ST_SESSIONS, TPM_CC_CREATE);
    put_u32(&w, parent);
    put_pw_auth(&w);
    size_t at = w.at;
    put_u16(&w, 0); /* inSensitive's size */
    put_u16(&w, 0); /* userAuth: none (the policy is the only way in) */
    put_u16(&w, (uint16_t)n);
    put(&w, data, n);
    patch_size(&w, at);
    at = w.at;
    put_u16(&w, 0); /* inPublic's size */
    put_u16(&w, TPM_ALG_KEYEDHASH);
    put_u16(&w, TPM_ALG_SHA256);
    put_u32(&w, SEAL_ATTRS);
    put_u16(&w, TPM_DIGEST_LEN);
    put(&w, policy, TPM_DIGEST_LEN);
    put_u16(&w, TPM_ALG_NULL); /* scheme: a sealed data object, not an HMAC key */
    put_u16(&w, 0);            /* unique */
    patch_size(&w, at);
    put_u16(&w, 0); /* outsideInfo */
    put_u32(&w, 0); /* creationPCR */
    rd p;
    int e = call(t, &w, rsp, 0, NULL, &p);
    if (e < 0) return e;
    get_2b(&p, out->priv, sizeof out->priv, &out->priv_len);
    get_2b(&p, out->pub, sizeof out->pub, &out->pub_len);
    skip_2b(&p), skip_2b(&p);              /* creationData, creationHash */
    get_u16(&p), get_u32(&p), skip_2b(&p); /* creationTicket */
    return params_done(&p);
}

static int load(tpm_dev *t, uint32_t parent, const tpm_sealed *s, uint32_t *handle) {
    uint8_t cmd[64 + 2 * TPM_BLOB_PART], rsp[TPM_BUF_MAX];
    wr w = begin(cmd, sizeof cmd, TPM_ST_SESSIONS, TPM_CC_LOAD);
    put_u32(&w, parent);
    put_pw_auth(&w);
    put_u16(&w, s->priv_len), put(&w, s->priv, s->priv_len);
    put_u16(&w, s->pub_len), put(&w, s->pub, s->pub_len);
    rd p;
    int e = call(t, &w, rsp, 1, handle, &p);
    if (e < 0) return e;
    skip_2b(&p); /* name */
    return params_done(&p);
}

/* A policy session: unbound and unsalted (nothing secret is derived from it; the policy
 * alone decides), SHA-256, no parameter encryption. */
static int start_policy_session(tpm_dev *t, uint32_t *handle) {
    uint8_t cmd[64], rsp[TPM_BUF_MAX], nonce[16];
    if (getrandom(nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce) return -EIO;
    wr w = begin(cmd, sizeof cmd, TPM_ST_NO_SESSIONS, TPM_CC_START_AUTH_SESSION);
    put_u32(&w, TPM_RH_NULL); /* tpmKey: unsalted */
    put_u32(&w, TPM_RH_NULL); /* bind: unbound */
    put_u16(&w, sizeof nonce), put(&w, nonce, sizeof nonce);
    put_u16(&w, 0); /* encryptedSalt */
    put_u8(&w, TPM_SE_POLICY);
    put_u16(&w, TPM_ALG_NULL); /* symmetric: none */
    put_u16(&w, TPM_ALG_SHA256);
    rd p;
    int e = call(t, &w, rsp, 1, handle, &p);
    if (e < 0) return e;
    skip_2b(&p); /* nonceTPM */
    return params_done(&p);
}

/* PolicyPCR with no expected digest: the TPM takes its PCR's value now. */
static int policy_pcr(tpm_dev *t, uint32_t session, int pcr) {
    uint8_t cmd[64], rsp[TPM_BUF_MAX];
    if (pcr < 0 || pcr >= TPM_PCR_COUNT) return -EINVAL;
    wr w = begin(cmd, sizeof cmd, TPM_ST_NO_SESSIONS, TPM_CC_POLICY_PCR);
    put_u32(&w, session);
    put_u16(&w, 0); /* pcrDigest: empty */
    put_u32(&w, 1);
    put_pcr_select(&w, pcr);
    rd p;
    int e = call(t, &w, rsp, 0, NULL, &p);
    return e < 0 ? e : params_done(&p);
}

/* The session's policy digest so far (tests compare it with tpm_policy_pcr's). */
__attribute__((unused)) static int policy_get_digest(tpm_dev *t, uint32_t session, uint8_t out[TPM_DIGEST_LEN]) {
    uint8_t cmd[32], rsp[TPM_BUF_MAX], d[TPM_DIGEST_LEN];
    uint16_t n = 0;
    wr w = begin(cmd, sizeof cmd, TPM_ST_NO_SESSIONS, TPM_CC_POLICY_GET_DIGEST);
    put_u32(&w, session);
    rd p;
    int e = call(t, &w, rsp, 0, NULL, &p);
    if (e < 0) return e;
    get_2b(&p, d, sizeof d, &n);
    if ((e = params_done(&p)) < 0 || n != TPM_DIGEST_LEN) return e < 0 ? e : -EPROTO;
    memcpy(out, d, TPM_DIGEST_LEN);
    return 0;
}

static int unseal_with(tpm_dev *t, uint32_t item, uint32_t session, uint8_t *out, size_t cap, size_t *n) {
    uint8_t cmd[64], rsp[TPM_BUF_MAX], d[TPM_SEAL_MAX];
    uint16_t len = 0;
    wr w = begin(cmd, sizeof cmd, TPM_ST_SESSIONS, TPM_CC_UNSEAL);
    put_u32(&w, item);
    put_auth(&w, session);
    rd p;
    int e = call(t, &w, rsp, 0, NULL, &p);
    if (e < 0) return e;
    get_2b(&p, d, sizeof d, &len);
    if ((e = params_done(&p)) < 0) return e;
    if (len > cap) return -EMSGSIZE;
    memcpy(out, d, len);
    *n = len;
    memset(d, 0, sizeof d);
    return 0;
}

int tpm_seal(tpm_dev *t, const uint8_t policy[TPM_DIGEST_LEN], const uint8_t *data, size_t n, tpm_sealed *out) {
    uint32_t primary = 0;
    if (n > TPM_SEAL_MAX) return -EMSGSIZE;
    memset(out, 0, sizeof *out);
    int e = create_primary(t, &primary);
    if (e < 0) return e;
    e = create_sealed(t, primary, policy, data, n, out);
    int f = flush(t, primary);
    return e < 0 ? e : f;
}

int tpm_unseal(tpm_dev *t, const tpm_sealed *s, int pcr, uint8_t *out, size_t cap, size_t *n) {
    uint32_t primary = 0, item = 0, session = 0;
    *n = 0;
    int e = create_primary(t, &primary);
    if (e < 0) return e;
    e = load(t, primary, s, &item);
    uint32_t rc = t->rc;
    flush(t, primary); /* a loaded object outlives its parent's handle */
    t->rc = rc;
    if (e == -EIO && (t->rc & TPM_RC_FMT1_MASK) == TPM_RC_INTEGRITY) return -ENOKEY;
    if (e < 0) return e;
    if ((e = start_policy_session(t, &session)) == 0) {
        if ((e = policy_pcr(t, session, pcr)) == 0) {
            e = unseal_with(t, item, session, out, cap, n);
            if (e == -EIO && (t->rc & TPM_RC_FMT1_MASK) == TPM_RC_POLICY_FAIL) e = -EACCES;
        }
        if (e < 0) flush(t, session); /* a command that failed did not end it */
    }
    flush(t, item);
    return e;
}

size_t tpm_sealed_save(const tpm_sealed *s, uint8_t *buf, size_t cap) {
    wr w = {buf, cap, 0, 0};
    if (s->priv_len > TPM_BLOB_PART || s->pub_len > TPM_BLOB_PART) return 0;
    put(&w, "KSL1", 4);
    put_u16(&w, s->priv_len), put(&w, s->priv, s->priv_len);
    put_u16(&w, s->pub_len), put(&w, s->pub, s->pub_len);
    return w.bad ? 0 : w.at;
}

int tpm_sealed_load(tpm_sealed *s, const uint8_t *buf, size_t n) {
    rd r = {buf, n, 0, 0};
    memset(s, 0, sizeof *s);
    const uint8_t *magic = take(&r, 4);
    if (!magic || memcmp(magic, "KSL1", 4)) return -EINVAL;
    get_2b(&r, s->priv, sizeof s->priv, &s->priv_len);
    get_2b(&r, s->pub, sizeof s->pub, &s->pub_len);
    return r.bad || r.at != n || !s->priv_len || !s->pub_len ? -EINVAL : 0;
}
