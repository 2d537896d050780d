/* tpm: a small TPM 2.0 client for kiln-init: the few commands measured boot needs, marshalled
 * by hand over the kernel's character device (/dev/tpmrm0, else /dev/tpm0) or any stream fd
 * that carries raw TPM commands (swtpm's --server socket in tests/unit/test_tpm.c).
 *
 * Why by hand: kiln-init is static musl; tpm2-tss is a glibc-shaped stack of shared libraries
 * (TCTI modules are dlopen'ed), and the kernel's trusted keys are off in the image's kernel
 * (CONFIG_TRUSTED_KEYS is not set). Startup, PCR_Extend and PCR_Read are a few dozen bytes;
 * sealing (CreatePrimary, Create, Load, a policy session, PolicyPCR, Unseal) a few hundred.
 *
 * Every response is outside input: its sizes and counts are checked against the bytes that
 * came back before anything is read (tests/fuzz/fuzz_tpm.c). Functions return 0 or a
 * negative errno: -EIO means the TPM answered with an error code, kept in t->rc
 * (tpm_rc_text names it); -EPROTO a response that does not parse; -ETIMEDOUT no answer. */
#ifndef KILN_BOOT_TPM_H
#define KILN_BOOT_TPM_H

#include <stddef.h>
#include <stdint.h>

#define TPM_DIGEST_LEN 32     /* SHA-256: the only bank kiln uses */
#define TPM_BUF_MAX 4096      /* bytes of one command or response (the kernel's TPM_BUFSIZE) */
#define TPM_TIMEOUT_MS 20000  /* a response's longest wait (a slow TPM, an emulator under TCG) */

typedef struct {
    int fd;                   /* -1: closed */
    uint32_t rc;              /* the last response code that was not success, 0 if none */
    char path[64];            /* the device node, "" for a caller's fd */
} tpm_dev;

/* Opens the first device of "/dev/tpmrm0", "/dev/tpm0" that exists (path NULL), or path.
 * -ENOENT: no TPM, a normal case. tpm_use_fd wraps an fd the caller owns (tests). */
int tpm_open(tpm_dev *t, const char *path);
void tpm_use_fd(tpm_dev *t, int fd);
void tpm_close(tpm_dev *t);

/* TPM2_Startup(CLEAR); a TPM already started (by the firmware or the kernel) is success. */
int tpm_startup(tpm_dev *t);
/* TPM2_PCR_Extend of the SHA-256 bank: PCR = SHA-256(PCR || digest). */
int tpm_pcr_extend(tpm_dev *t, int pcr, const uint8_t digest[TPM_DIGEST_LEN]);
/* TPM2_PCR_Read of one SHA-256 PCR. -ENOENT: the TPM has no SHA-256 bank allocated. */
int tpm_pcr_read(tpm_dev *t, int pcr, uint8_t out[TPM_DIGEST_LEN]);

/* Sealing: a secret of at most TPM_SEAL_MAX bytes becomes a keyed-hash object under the owner
 * hierarchy's storage primary key (ECC P-256, empty auth, made again from the same template
 * at each use: the TPM derives it from its owner seed, so it is the same key on this TPM and
 * no other). Its only authorization is a policy: PolicyPCR, "this SHA-256 PCR has this value"
 * (no password: userWithAuth clear). The blob (the TPM's encrypted private part and the
 * public part) can be stored anywhere; only this TPM, with the PCR at that value, unseals. */
#define TPM_SEAL_MAX 128      /* MAX_SYM_DATA: the most a keyed-hash object holds */
#define TPM_BLOB_PART 512     /* bytes for each of a blob's two parts (each ~100-200) */

typedef struct {
    uint16_t priv_len, pub_len;
    uint8_t priv[TPM_BLOB_PART];  /* TPM2B_PRIVATE's buffer */
    uint8_t pub[TPM_BLOB_PART];   /* TPM2B_PUBLIC's buffer */
} tpm_sealed;

/* The policy digest of PolicyPCR(pcr = value) from a fresh session, computed here: one can
 * seal to a value a PCR will have (the next image's), not only to the one it has now. */
void tpm_policy_pcr(int pcr, const uint8_t value[TPM_DIGEST_LEN], uint8_t policy[TPM_DIGEST_LEN]);
/* Seals data (n <= TPM_SEAL_MAX) under policy. */
int tpm_seal(tpm_dev *t, const uint8_t policy[TPM_DIGEST_LEN], const uint8_t *data, size_t n, tpm_sealed *out);
/* Unseals s if PCR pcr has the value it was sealed to: -EACCES when it does not (the TPM's
 * TPM_RC_POLICY_FAIL: another image, another boot path); -ENOKEY when the blob does not
 * load (made by another TPM: a moved disk; or damaged); -EIO for other refusals (t->rc).
 * out gets *n bytes, at most cap. */
int tpm_unseal(tpm_dev *t, const tpm_sealed *s, int pcr, uint8_t *out, size_t cap, size_t *n);
/* The blob as bytes, for a file: "KSL1", u16 priv_len, priv, u16 pub_len, pub. */
size_t tpm_sealed_save(const tpm_sealed *s, uint8_t *buf, size_t cap);
int tpm_sealed_load(tpm_sealed *s, const uint8_t *buf, size_t n);

/* The marshalling, apart from the device (tests and the fuzz target drive these). Builders
 * return the command's length (0: does not fit in cap). Parsers take a whole response. */
size_t tpm_cmd_startup(uint8_t *buf, size_t cap);
size_t tpm_cmd_pcr_extend(uint8_t *buf, size_t cap, int pcr, const uint8_t digest[TPM_DIGEST_LEN]);
size_t tpm_cmd_pcr_read(uint8_t *buf, size_t cap, int pcr);
int tpm_rsp_header(const uint8_t *rsp, size_t n, uint32_t *rc); /* 0 with *rc, or -EPROTO */
int tpm_rsp_pcr_read(const uint8_t *rsp, size_t n, int pcr, uint8_t out[TPM_DIGEST_LEN], uint32_t *rc);

/* "TPM_RC_INITIALIZE (0x100)"-style text for a response code, in buf. */
const char *tpm_rc_text(uint32_t rc, char *buf, size_t cap);

#endif
