/* history.c: the conversation kept by `kiln chat`, sent as GEN's conversation form
 * (system= user= assistant= ... user=, docs/PROTOCOL.md): the server renders the turns
 * through the model's chat template, as the OpenAI API does with its messages. The
 * history is bounded (HIST_MAX_TURNS, HIST_MAX_BYTES): the oldest exchanges go first. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

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

int history_msgs(const history *h, const char *system, const char *line, kiln_msg *out) {
    int n = 0;
    if (system) out[n++] = (kiln_msg){"system", system};
    for (int i = 0; i < h->n; i++) out[n++] = (kiln_msg){i % 2 ? "assistant" : "user", h->text[i]};
    out[n++] = (kiln_msg){"user", line};
    return n;
}
