/* fuzz_tpm: libFuzzer target for boot/tpm's response parsing (a TPM's answer is outside
 * input to kiln-init: a device, a bus, an emulator). The first byte picks what is asked;
 * the rest is the TPM's answer. Invariants that abort on failure:
 *   - nothing reads outside the bytes given (ASan);
 *   - an accepted PCR_Read response holds exactly the bytes its size field says, and the
 *     value returned is its last 32 bytes; an accepted header's size is the length given;
 *   - every command kiln-init sends (Startup, PCR_Extend, PCR_Read, CreatePrimary, Create,
 *     Load, StartAuthSession, PolicyPCR, PolicyGetDigest, Unseal, FlushContext), asked of a
 *     "TPM" on a socket that answers with these bytes, returns without crashing and never
 *     hands back more than its buffer holds;
 *   - a saved sealed blob (tpm_sealed_load) of these bytes is refused or fits its buffers. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "boot/tpm.c"

static void parsers(int pcr, const uint8_t *rsp, size_t n) {
    uint32_t rc = 0, h[2];
    uint8_t out[TPM_DIGEST_LEN];
    int e = tpm_rsp_pcr_read(rsp, n, pcr, out, &rc);
    if (e == 0 && rc == 0 && (n < TPM_HEADER + TPM_DIGEST_LEN || memcmp(out, rsp + n - TPM_DIGEST_LEN, TPM_DIGEST_LEN)))
        fprintf(stderr, "accepted PCR value is not the response's last 32 bytes\n"), abort();
    if (e == 0 && rc != 0 && n != TPM_HEADER) fprintf(stderr, "an error response with a body was accepted\n"), abort();
    if (tpm_rsp_header(rsp, n, &rc) == 0) {
        uint32_t size_field = (uint32_t)rsp[2] << 24 | (uint32_t)rsp[3] << 16 | (uint32_t)rsp[4] << 8 | rsp[5];
        if (size_field != n) fprintf(stderr, "header accepted with size %u for %zu bytes\n", size_field, n), abort();
    }
    (void)rsp_empty(rsp, n, &rc);
    for (int nh = 0; nh < 3; nh++) {
        rd p = {0};
        if (rsp_split(rsp, n, nh, h, &p, &rc) == 0 && rc == 0 && (p.p < rsp || p.p + p.n > rsp + n))
            fprintf(stderr, "parameters outside the response\n"), abort();
    }
    tpm_sealed s;
    if (tpm_sealed_load(&s, rsp, n) == 0 && (s.priv_len > TPM_BLOB_PART || s.pub_len > TPM_BLOB_PART))
        fprintf(stderr, "a blob larger than its buffers\n"), abort();
}

/* One command to a "TPM" on a socket whose answer is rsp, already sent: the peer's write
 * side is shut, so a response shorter than its size field ends in EOF, not a wait. */
static void over_socket(int which, const uint8_t *rsp, size_t n) {
    int sv[2];
    if (n > TPM_BUF_MAX || socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0) return;
    if (write(sv[1], rsp, n) != (ssize_t)n || shutdown(sv[1], SHUT_WR) < 0) {
        close(sv[0]), close(sv[1]);
        return;
    }
    tpm_dev t;
    tpm_use_fd(&t, sv[0]);
    uint8_t d[TPM_DIGEST_LEN] = {1}, out[TPM_SEAL_MAX];
    uint32_t h = 0;
    size_t got = 0;
    static tpm_sealed s = {.priv_len = 16, .pub_len = 16};
    switch (which % 11) {
    case 0: (void)tpm_startup(&t); break;
    case 1: (void)tpm_pcr_extend(&t, 15, d); break;
    case 2: (void)tpm_pcr_read(&t, 15, d); break;
    case 3: (void)create_primary(&t, &h); break;
    case 4: (void)create_sealed(&t, 0x80000000, d, d, sizeof d, &s);
        if (s.priv_len > TPM_BLOB_PART || s.pub_len > TPM_BLOB_PART) fprintf(stderr, "Create overran the blob\n"), abort();
        break;
    case 5: (void)load(&t, 0x80000000, &s, &h); break;
    case 6: (void)start_policy_session(&t, &h); break;
    case 7: (void)policy_pcr(&t, 0x03000000, 15); break;
    case 8: (void)policy_get_digest(&t, 0x03000000, d); break;
    case 9:
        if (unseal_with(&t, 0x80000001, 0x03000000, out, 24, &got) == 0 && got > 24)
            fprintf(stderr, "Unseal gave %zu bytes into 24\n", got), abort();
        break;
    default: (void)flush(&t, 0x80000000); break;
    }
    close(sv[0]), close(sv[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int pcr = data[0] % 26 - 1; /* -1..24: past both ends too */
    parsers(pcr, data + 1, size - 1);
    over_socket(data[0], data + 1, size - 1);
    return 0;
}
