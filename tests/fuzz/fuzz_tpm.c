/* fuzz_tpm: libFuzzer target for boot/tpm's response parsing (a TPM's answer is outside
 * input to kiln-init: a device, a bus, an emulator). The first byte picks the PCR the
 * response is read for; the rest is the response. Invariants that abort on failure:
 *   - nothing reads outside the bytes given (ASan);
 *   - an accepted PCR_Read response holds exactly the bytes its size field says, and the
 *     value returned is its last 32 bytes;
 *   - an accepted error response is the 10-byte header alone;
 *   - the socket path (read_rsp) takes the same bytes without crashing and accepts only a
 *     response whose size field matches what arrived. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "boot/tpm.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int pcr = data[0] % 26 - 1; /* -1..24: past both ends too */
    const uint8_t *rsp = data + 1;
    size_t n = size - 1;
    uint32_t rc = 0;
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
    /* The transport: the bytes as a TPM on a socket would send them. */
    int sv[2];
    if (n <= TPM_BUF_MAX && socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0) {
        static uint8_t got[TPM_BUF_MAX];
        size_t k = 0;
        if (write(sv[1], rsp, n) == (ssize_t)n) {
            close(sv[1]);
            if (read_rsp(sv[0], got, sizeof got, &k) == 0 && (k != n || memcmp(got, rsp, n)))
                fprintf(stderr, "read_rsp accepted %zu bytes of %zu\n", k, n), abort();
        } else {
            close(sv[1]);
        }
        close(sv[0]);
    }
    return 0;
}
