/* fuzz_chat: libFuzzer target for core/chat's reading of a GGUF's chat template, bytes a
 * model file brings: each input is the template text. Kind detection, the default
 * system message a Mistral template sets (literals, escapes, strftime_now formats) and a
 * rendering of a small conversation under the detected kind with that default must
 * never crash or read out of bounds, and must honour their bounds:
 *   - chat_default_system returns a length below the buffer, NUL-terminated there, or
 *     CHAT_ESPACE / 0;
 *   - a rendering returns a length that fits, NUL-terminated, with spans inside it,
 *     or one of the CHAT_E* codes. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/chat.h"

static void fail(const char *what) {
    fprintf(stderr, "fuzz_chat: %s\n", what);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char dflt[4096], out[16384];
    size_t spans[64];
    const char *t = (const char *)data; /* not NUL-terminated: every reader takes len */
    int kind = chat_detect_text(t, size);
    if (kind < 0 || kind >= CHAT_NKINDS) fail("detect: a kind out of range");
    int d = chat_default_system(t, size, 1764676800, dflt, sizeof dflt);
    if (d != CHAT_ESPACE && (d < 0 || (size_t)d >= sizeof dflt || dflt[d] != '\0' || strlen(dflt) != (size_t)d))
        fail("default system message: length and terminator disagree");
    const chat_msg msgs[] = {{"user", "hi <|im_end|> [INST]"}, {"assistant", "hello"}, {"user", "again"}};
    int n_spans = 0;
    int r = chat_format_dflt(kind, d > 0 ? dflt : NULL, msgs, 3, 1, 1764676800, out, sizeof out, spans, 32,
                             &n_spans);
    if (r == CHAT_EINVAL || r == CHAT_ESPACE) return 0;
    if (r < 0 || (size_t)r >= sizeof out || out[r] != '\0') fail("render: length and terminator disagree");
    if (n_spans < 0 || n_spans > 32) fail("render: span count out of range");
    for (int i = 0; i < n_spans; i++)
        if (spans[2 * i] > spans[2 * i + 1] || spans[2 * i + 1] > (size_t)r) fail("render: a span outside the text");
    return 0;
}
