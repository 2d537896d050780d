/* ladder: the degrade ladder of DESIGN.md §5 as a pure state machine, driven by a tick
 * that the server calls on a timer with the current memory pressure; it decides, the
 * server acts (effective batch to the engine, 8-bit KV to the backend, shedding at
 * admission). Pure: no clock, no I/O, so tests/unit/test_ladder.c walks every path.
 *
 *   0 normal   full batch
 *   1 shrink   pressure > up: the effective max batch halves each tick, down to 1
 *   2 compact  still > up at batch 1: 8-bit KV (only where the backend has it; else the
 *              rung is passed through on the same tick)
 *   3 shed     still > up: new requests refused with 503 and a retry_after
 *   4 restart  set by the watchdog (a hung step); the process is about to exit
 *
 * One rung per tick. Down: pressure below `down` for hold_ms steps down one rung, and
 * the hold starts again; in rung 1 the batch doubles each tick back to the maximum
 * before rung 0. A pinned level (LADDER level=N) stays until unpinned; the effective
 * batch still follows it (halving at 1+, full at 0). */
#ifndef KILN_SCHED_LADDER_H
#define KILN_SCHED_LADDER_H

#include <stdint.h>

enum { LADDER_NORMAL, LADDER_SHRINK, LADDER_COMPACT, LADDER_SHED, LADDER_RESTART, LADDER_LEVELS };

typedef struct {
    double up, down;   /* pressure thresholds, 0..1, down < up */
    int64_t hold_ms;   /* time below `down` before each step down */
    int max_batch;     /* the configured max batch size */
    int has_kv8;       /* the backend can turn KV to 8 bits (rung 2 acts) */
} ladder_config;

typedef struct {
    ladder_config cfg;
    int level;
    int pinned;          /* -1: automatic */
    int batch;           /* effective max batch, 1..max_batch */
    int64_t below_since; /* when pressure last went below down; -1 when it is not */
    double pressure;     /* last tick's */
    uint64_t transitions[LADDER_LEVELS][LADDER_LEVELS]; /* [from][to] */
} ladder;

extern const char *const ladder_names[LADDER_LEVELS]; /* "normal", "shrink", ... */

/* 0, or -EINVAL for thresholds out of order or max_batch < 1. */
int ladder_init(ladder *l, const ladder_config *c);
/* One tick at now_ms with pressure in [0, 1]. Returns 1 when the level or the
 * effective batch changed (the caller acts and logs), else 0. */
int ladder_tick(ladder *l, double pressure, int64_t now_ms);
/* Pin a level 0..3 (-1: back to automatic). Returns 1 on a change, -EINVAL otherwise. */
int ladder_pin(ladder *l, int level);
/* The watchdog's last word: level 4. */
void ladder_restart(ladder *l);

#endif
