/* fuzz_authenticode: libFuzzer target for image/authenticode (a UKI is outside input: a
 * network update's slot, a disk). The first byte picks the layer, so both are reached
 * without a valid outer one:
 *   0: the input is a PE image for ac_verify (headers, section table, certificate table);
 *   1: the input is one signature's DER for check_sig (PKCS#7 SignedData, Authenticode),
 *      then the 32-byte image hash it is checked against (the seed's own: the parse goes on
 *      past the digest, into the signer's attributes).
 * Invariants that abort on failure: nothing is accepted (no input carries a signature by
 * this certificate's key, whose private half nobody has), and every refusal has a message. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "image/authenticode.c"

/* A throwaway self-signed RSA 2048 certificate (its key was discarded). */
#define CERT_PEM \
    "-----BEGIN CERTIFICATE-----\n" \
    "MIIDDzCCAfegAwIBAgIUeLQ+NDrDTvADEC3mLz1IKchPPi4wDQYJKoZIhvcNAQEL\n" \
    "BQAwFzEVMBMGA1UEAwwMa2lsbiBmdXp6IGRiMB4XDTI2MTIwMjE3NDMzNVoXDTM2\n" \
    "MTEyOTE3NDMzNVowFzEVMBMGA1UEAwwMa2lsbiBmdXp6IGRiMIIBIjANBgkqhkiG\n" \
    "9w0BAQEFAAOCAQ8AMIIBCgKCAQEAv45S0oMctN/+zytMJg9yNnJVNUT/aC7iThRf\n" \
    "J+Q9nIVv4juLUfzsGBF+kekeatEmf6qpFp04iy0KeKaid+TW9gDeqzEQYsu1t8aB\n" \
    "gyOItzir8qN8ssFJ9Ij0o8LFFuql8U4/27ax1syfCrPbjuusUzJRxivUrAfyFrTe\n" \
    "zcFnCu4oj5Qr+5BnXzvAHMqBgFRTY0Iey45VkgAxy2csi3YpcHZR+hzBGQYVYGXy\n" \
    "yE50tKLsckP7eXVR7mxxUd53ZNWPZGyqJgkomjpLlw0DUw+K1tCRH7N2pnOb0ziZ\n" \
    "xciG6mKPqzgimaDJj8+mqq5m11uxgu65lKcOIRKYqkZ7Tgu33QIDAQABo1MwUTAd\n" \
    "BgNVHQ4EFgQUMlDWAT4/RkCCfUdSh4HyasexmscwHwYDVR0jBBgwFoAUMlDWAT4/\n" \
    "RkCCfUdSh4HyasexmscwDwYDVR0TAQH/BAUwAwEB/zANBgkqhkiG9w0BAQsFAAOC\n" \
    "AQEAPwiLvAcp94nV25LBEf1H6LE/lPOx6cnPzEuhB5b3/cBphVMkia2Z6R3GqT3e\n" \
    "HSwJZI3oTSYk8/gkpffuHzpSUj1yuwm65TN4pQbvV9LY8ZLzmZ1iWyi32/MqjRpF\n" \
    "0l4n1ix3njK2LMYPF9mjbe8gZ6XrFgNyE5BHnQ4hfqF+2sf/o5CoSlMzSs4UsjGn\n" \
    "j7S5rL7obLjYKZ4BE8DBuDzX5E4kMXn8tY3hMEZiz0t6QwRH5ONKup5VsOY+wiT/\n" \
    "u4sBrRMYgBmm4H8I/7c1z18kIPS5fsoxSnNFnlYX3Vm6I//Xg3P6uNWwNasN1Kvh\n" \
    "YP8kShiGjgJp66F12ORv3lTppA==\n" \
    "-----END CERTIFICATE-----\n"


static mbedtls_x509_crt g_crt;
static int g_fd = -1;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    if (g_fd < 0) {
        mbedtls_x509_crt_init(&g_crt);
        if (mbedtls_x509_crt_parse(&g_crt, (const unsigned char *)CERT_PEM, sizeof CERT_PEM)) fprintf(stderr, "cert\n"), abort();
        g_fd = memfd_create("fuzz-pe", 0);
        if (g_fd < 0) perror("memfd_create"), abort();
    }
    if (size < 1) return 0;
    err[0] = 0;
    int r;
    if (data[0] == 1) {
        if (size < 33) return 0;
        size_t n = size - 33;
        unsigned char *der = malloc(n ? n : 1);
        memcpy(der, data + 1, n);
        r = check_sig(der, der + n, data + 1 + n, &g_crt.pk, err, sizeof err);
        free(der);
    } else {
        if (ftruncate(g_fd, 0) < 0 || pwrite(g_fd, data + 1, size - 1, 0) != (ssize_t)(size - 1)) abort();
        r = ac_verify(g_fd, 0, size - 1, (const unsigned char *)CERT_PEM, sizeof CERT_PEM, err, sizeof err);
    }
    if (r == 0) fprintf(stderr, "accepted\n"), abort();
    if (!err[0]) fprintf(stderr, "refused without a message\n"), abort();
    return 0;
}
