/* fuzz_manifest: libFuzzer target for image/manifest (a manifest is outside input: from a
 * disk, a file, the network). Invariants that abort on failure:
 *   - a refused input has a message;
 *   - an accepted one formats back to exactly the bytes its signature covers (one spelling
 *     per manifest), and checking its signature against a fixed key does not crash;
 *   - key parsing of the same bytes does not crash. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image/manifest.c"

/* The generator of P-256: a valid point, so verification runs to the end. */
static const uint8_t g_pub[MAN_PUB_LEN] = {
    0x04, 0x6b, 0x17, 0xd1, 0xf2, 0xe1, 0x2c, 0x42, 0x47, 0xf8, 0xbc, 0xe6, 0xe5, 0x63, 0xa4, 0x40, 0xf2, 0x77,
    0x03, 0x7d, 0x81, 0x2d, 0xeb, 0x33, 0xa0, 0xf4, 0xa1, 0x39, 0x45, 0xd8, 0x98, 0xc2, 0x96, 0x4f, 0xe3, 0x42,
    0xe2, 0xfe, 0x1a, 0x7f, 0x9b, 0x8e, 0xe7, 0xeb, 0x4a, 0x7c, 0x0f, 0x9e, 0x16, 0x2b, 0xce, 0x33, 0x57, 0x6b,
    0x31, 0x5e, 0xce, 0xcb, 0xb6, 0x40, 0x68, 0x37, 0xbf, 0x51, 0xf5};

static char g_body[MAN_MAX + 1];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    man_manifest m;
    err[0] = 0;
    const char *text = (const char *)data;
    if (man_parse(text, size, &m, err, sizeof err) < 0) {
        if (!err[0]) fprintf(stderr, "refused without a message\n"), abort();
    } else {
        int n = man_format_body(&m, g_body, sizeof g_body, err, sizeof err);
        if (n < 0 || (size_t)n != m.signed_len || memcmp(g_body, text, (size_t)n)) {
            fprintf(stderr, "accepted manifest does not format back to its signed bytes (%s)\n", err);
            abort();
        }
        if (man_verify(&m, text, g_pub, err, sizeof err) == 0) fprintf(stderr, "note: a signature by the generator's key?\n");
    }
    uint8_t key[MAN_PUB_LEN];
    (void)man_key_parse(size % 2, text, size, key, err, sizeof err);
    return 0;
}
