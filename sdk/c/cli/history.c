/* history.c: the conversation kept by `kiln chat`.
 * GEN takes one user message (and a system message) per request, and a raw prompt with
 * chat=0 cannot carry the template's special tokens, so earlier turns travel inside the
 * user message as a plain transcript:
 *
 *   Conversation so far:
 *   User: <earlier line>
 *   Assistant: <earlier answer>
 *   ...
 *   Continue the conversation. My new message:
 *   <line>
 *
 * The model still gets its own chat template around that (chat=1), so it answers as
 * the assistant. The history is bounded (HIST_MAX_TURNS, HIST_MAX_BYTES): the oldest
 * exchanges go first. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char HEAD[] = "Conversation so far:\n";
static const char USER[] = "User: ";
static const char ASSISTANT[] = "Assistant: ";
static const char TAIL[] = "Continue the conversation. My new message:\n";

void history_init(history *h) {
    memset(h, 0, sizeof *h);
}

void history_reset(history *h) {
    for (int i = 0; i < h->n; i++) free(h->text[i]);
    memset(h, 0, sizeof *h);
}

void history_free(history *h) {
    history_reset(h);
}

void history_drop_oldest(history *h) {
    if (h->n < 2) return;
    h->bytes -= h->len[0] + h->len[1];
    free(h->text[0]);
    free(h->text[1]);
    memmove(h->text, h->text + 2, (size_t)(h->n - 2) * sizeof *h->text);
    memmove(h->len, h->len + 2, (size_t)(h->n - 2) * sizeof *h->len);
    h->n -= 2;
}

static char *dup_n(const char *s, size_t len) {
    char *d = malloc(len + 1);
    if (!d) return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

int history_add(history *h, const char *user, size_t ulen, const char *answer, size_t alen) {
    char *u = dup_n(user, ulen), *a = dup_n(answer, alen);
    if (!u || !a) {
        free(u);
        free(a);
        return -1;
    }
    if (h->n + 2 > HIST_MAX_TURNS) history_drop_oldest(h);
    h->text[h->n] = u, h->len[h->n++] = ulen;
    h->text[h->n] = a, h->len[h->n++] = alen;
    h->bytes += ulen + alen;
    /* an exchange larger than the whole budget goes too: an empty history is better
     * than one the server refuses as too long */
    while (h->n > 0 && h->bytes > HIST_MAX_BYTES) history_drop_oldest(h);
    return 0;
}

/* Appends s[0..len) at *pos in out (room was computed by the caller). */
static void put(char *out, size_t *pos, const char *s, size_t len) {
    memcpy(out + *pos, s, len);
    *pos += len;
}

char *history_render(const history *h, const char *line, size_t len, size_t *out_len) {
    size_t need = len + 1;
    if (h->n > 0) {
        need += sizeof HEAD + sizeof TAIL;
        for (int i = 0; i < h->n; i++) need += h->len[i] + sizeof ASSISTANT + 1;
    }
    char *out = malloc(need);
    if (!out) return NULL;
    size_t pos = 0;
    if (h->n > 0) {
        put(out, &pos, HEAD, sizeof HEAD - 1);
        for (int i = 0; i < h->n; i++) {
            if (i % 2 == 0) put(out, &pos, USER, sizeof USER - 1);
            else put(out, &pos, ASSISTANT, sizeof ASSISTANT - 1);
            put(out, &pos, h->text[i], h->len[i]);
            put(out, &pos, "\n", 1);
        }
        put(out, &pos, TAIL, sizeof TAIL - 1);
    }
    put(out, &pos, line, len);
    out[pos] = '\0';
    if (out_len) *out_len = pos;
    return out;
}
