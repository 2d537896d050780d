/* fuzz_config: libFuzzer target for core/config. Each input, NUL-terminated, goes to
 * cfg_load_string over the defaults. Invariants that abort on failure:
 *   - a rejected input leaves the config untouched and a non-empty message;
 *   - an accepted one validates, dumps, and the dump loads back to an equal config
 *     whose own dump is byte-identical. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"

static kiln_config g_a, g_b, g_def;
static char g_d1[CFG_DUMP_MAX], g_d2[CFG_DUMP_MAX];

static void fail(const char *what, const char *err) {
    fprintf(stderr, "fuzz_config: %s: %s\n", what, err);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    cfg_defaults(&g_def);
    cfg_defaults(&g_a);
    err[0] = '\0';
    int r = cfg_load_string(&g_a, text, err, sizeof err);
    free(text);
    if (r < 0) {
        if (!err[0] || !memchr(err, '\0', sizeof err)) fail("rejected without a message", "");
        if (!cfg_equal(&g_a, &g_def)) fail("rejected input changed the config", err);
        return 0;
    }
    if (cfg_validate(&g_a, err, sizeof err) < 0) fail("accepted config does not validate", err);
    int n = cfg_dump(&g_a, g_d1, sizeof g_d1);
    if (n < 0) fail("dump", "no room");
    cfg_defaults(&g_b);
    if (cfg_load_string(&g_b, g_d1, err, sizeof err) < 0) fail("dump does not load", err);
    if (!cfg_equal(&g_a, &g_b)) fail("round trip differs", g_d1);
    if (cfg_dump(&g_b, g_d2, sizeof g_d2) != n || strcmp(g_d1, g_d2)) fail("second dump differs", g_d2);
    return 0;
}
