/* progress.c: a one-line progress bar on stderr for `kiln bench`.
 * Drawn only when stderr is a terminal (a log file should not fill with \r frames), at
 * most 10 times a second so it costs nothing next to the run it measures. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

#define BAR_WIDTH 30

void progress_init(progress *pg, int enabled, long total, double duration) {
    memset(pg, 0, sizeof *pg);
    pg->on = enabled;
    pg->total = total;
    pg->duration = duration;
    pg->start = pg->last = cli_now();
}

void progress_update(progress *pg, long done, long errors, long tokens, int force) {
    if (!pg->on) return;
    double now = cli_now();
    if (!force && pg->drawn && now - pg->last < 0.1) return;
    pg->last = now;
    double t = now - pg->start;
    double frac = pg->total > 0 ? (double)done / (double)pg->total
                                : (pg->duration > 0 ? t / pg->duration : 0);
    if (frac > 1) frac = 1;
    if (frac < 0) frac = 0;
    char bar[BAR_WIDTH + 1];
    int fill = (int)(frac * BAR_WIDTH + 0.5);
    for (int i = 0; i < BAR_WIDTH; i++) bar[i] = i < fill ? '#' : '.';
    bar[BAR_WIDTH] = '\0';
    char count[64];
    if (pg->total > 0) snprintf(count, sizeof count, "%ld/%ld", done, pg->total);
    else snprintf(count, sizeof count, "%.0f/%.0fs %ld", t, pg->duration, done);
    /* \r then erase-to-end-of-line: shorter frames leave no stale characters */
    fprintf(stderr, "\r[%s] %s req  %.1f req/s  %.0f tok/s  errors %ld\033[K", bar, count,
            t > 0 ? done / t : 0.0, t > 0 ? tokens / t : 0.0, errors);
    fflush(stderr);
    pg->drawn = 1;
}

void progress_done(progress *pg) {
    if (!pg->on || !pg->drawn) return;
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
}
