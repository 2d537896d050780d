/* logring: the log kiln-init keeps in memory, the last LOGRING_LINES lines of kilnd's
 * output and of kiln-init's own messages, each stamped with seconds since kiln-init
 * started. The box has no disk log; `log [n]` on the console reads this ring. There is one
 * log per process, so the ring is a file-static singleton rather than an owner struct.
 *
 * Also here: the splitter that cuts a byte stream (a pipe, the control socket) into lines,
 * with a fixed buffer: a line longer than LOGRING_SPLIT_MAX is cut there. */
#ifndef KILN_BOOT_LOGRING_H
#define KILN_BOOT_LOGRING_H

#include <stddef.h>

#define LOGRING_LINES 256     /* lines kept */
#define LOGRING_WIDTH 256     /* bytes per stored line, timestamp and NUL included */
#define LOGRING_SPLIT_MAX 1024 /* bytes per line the splitter assembles */

/* Where echoed lines go (the console). */
typedef void (*logring_sink)(void *ctx, const char *line);

void logring_init(double t0, logring_sink sink, void *ctx);
void logring_add(const char *line, int echo); /* store; also to the sink when echo */
void logring_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));  /* store + echo */
void logring_note(const char *fmt, ...) __attribute__((format(printf, 1, 2))); /* store only */
int logring_count(void);
const char *logring_line(int i); /* 0 = oldest kept line */

typedef void (*logring_emit)(void *ctx, const char *line);
typedef struct {
    char buf[LOGRING_SPLIT_MAX]; /* the line being assembled, NUL-terminated on emit */
    size_t len;                  /* bytes in buf */
    int cut;                     /* the current line overflowed: drop bytes until '\n' */
} logring_splitter;

void logring_split(logring_splitter *sp, const char *data, size_t n, logring_emit emit, void *ctx);
void logring_split_flush(logring_splitter *sp, logring_emit emit, void *ctx); /* a last unterminated line */

#endif
