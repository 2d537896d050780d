/* drive: the engine on the loop, one driver for every caller (kilnd serve's server,
 * bench-engine, generate).
 *
 * drive_kick starts a step when work is pending and none runs; the backend's event fd
 * says when it finished, and the engine then samples and streams through the caller's
 * eng_callbacks. The caller hears of each step's start and end and of going idle, and
 * flushes what the callbacks buffered from the loop's before-sleep hook, so a step's
 * output leaves in one write per connection. A step that cannot start (an allocation
 * failed) is retried after DRIVE_RETRY_MS. The degrade ladder's driver lives here too:
 * every tick the KV pool's use goes to the ladder (sched/ladder.h), and what it decides
 * goes to the engine (effective batch, 8-bit KV). Test faults that act on steps (a lost
 * completion, a slow device) are here because they stand in for the backend. */
#ifndef KILN_SCHED_DRIVE_H
#define KILN_SCHED_DRIVE_H

#include <stdint.h>

#include "core/backend.h"
#include "mm/kv.h"
#include "sched/engine.h"
#include "sched/ladder.h"
#include "sched/loop.h"

#define DRIVE_RETRY_MS 100   /* a step that failed to start is tried again after this */
#define DRIVE_SHED_MIN_MS 500 /* retry_after_ms bounds for shed clients */
#define DRIVE_SHED_MAX_MS 60000

enum { DRIVE_LOG_ERROR, DRIVE_LOG_WARN }; /* = CFG_LOG_ERROR, CFG_LOG_WARN */

typedef struct {
    void (*before_step)(void *ud); /* no step runs: the caller may submit (bench-engine) */
    void (*after_step)(void *ud);  /* a step's results were delivered */
    /* No step could start: nothing left (pending 0) or work that cannot run now
     * (pending 1: paused, or waiting for KV blocks). */
    void (*idle)(void *ud, int pending);
    void (*log)(void *ud, int level, const char *msg); /* DRIVE_LOG_* */
    /* After each ladder tick; moved: the level or the batch changed (d->lad says how). */
    void (*ladder_tick)(void *ud, int moved);
    void *ud;
} drive_hooks;

typedef struct {
    loop_t *loop;
    engine *eng;
    backend *be;
    const kv_pool *kv;
    drive_hooks h;
    int64_t step_start_ms;  /* when the step in flight was submitted */
    int64_t retry_timer, slow_timer, ladder_timer;
    int fd_added;
    /* test faults (kilnd serve --faults) */
    int fault_drop_step;    /* the next completion is lost: the engine stays busy */
    int fault_slow_ms, fault_slow_n; /* the next n completions come ms late */
    /* the degrade ladder (drive_ladder_start) */
    ladder lad;
    int ladder_tick_ms;
    double finish_rate;     /* requests finished per second, smoothed (retry_after) */
    int64_t finished_total, finished_seen, rate_ms;
} drive;

/* Watches the backend's event fd on l. 0, or a negative errno. */
int drive_init(drive *d, loop_t *l, engine *e, backend *be, const kv_pool *kv,
               const drive_hooks *h);
void drive_free(drive *d); /* the fd and timers off the loop */
void drive_kick(drive *d);
/* How long the step in flight has run (ms); 0 when none runs. */
int64_t drive_step_age_ms(const drive *d);

/* The ladder, ticking every tick_ms from now. 0, or -EINVAL (bad thresholds), -ENOMEM. */
int drive_ladder_start(drive *d, const ladder_config *lc, int tick_ms);
/* Pin (0..3) or unpin (-1) the level and act on it: 1 changed, 0 not, -EINVAL. */
int drive_ladder_pin(drive *d, int level);
void drive_ladder_restart(drive *d); /* level 4: a hung step, the process will exit */
/* What the ladder acts on: the share of KV blocks in use (cached blocks count as free),
 * or the backend's mem_pressure when larger (a GPU's device memory). */
double drive_pressure(const drive *d);
/* A request ended: counted for the finishing rate behind drive_retry_after_ms. */
void drive_note_finished(drive *d);
/* What a shed client should wait: the work ahead at the rate requests finish. */
int drive_retry_after_ms(const drive *d);

/* FAULT drop_step / slow_step (tests). */
void drive_fault_drop(drive *d);
void drive_fault_slow(drive *d, int ms, int n);

#endif
