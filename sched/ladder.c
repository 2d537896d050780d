/* ladder: the degrade ladder's state machine (see ladder.h). */
#include "sched/ladder.h"

#include <errno.h>
#include <string.h>

const char *const ladder_names[LADDER_LEVELS] = {"normal", "shrink", "compact", "shed", "restart"};

int ladder_init(ladder *l, const ladder_config *c) {
    memset(l, 0, sizeof *l);
    if (c->max_batch < 1 || !(c->down >= 0 && c->down < c->up && c->up <= 1) || c->hold_ms < 0)
        return -EINVAL;
    l->cfg = *c;
    l->pinned = -1;
    l->batch = c->max_batch;
    l->below_since = -1;
    return 0;
}

static void go(ladder *l, int to) {
    l->transitions[l->level][to]++;
    l->level = to;
}

/* Climbing: one action per tick. */
static int climb(ladder *l) {
    switch (l->level) {
    case LADDER_NORMAL:
        go(l, LADDER_SHRINK);
        l->batch = l->batch / 2 > 1 ? l->batch / 2 : 1;
        return 1;
    case LADDER_SHRINK:
        if (l->batch > 1) {
            l->batch /= 2;
            return 1;
        }
        go(l, LADDER_COMPACT);
        if (!l->cfg.has_kv8) go(l, LADDER_SHED); /* nothing to compact: on to shedding */
        return 1;
    case LADDER_COMPACT:
        go(l, LADDER_SHED);
        return 1;
    default:
        return 0; /* shedding already, or restarting */
    }
}

/* Descending, once the hold has passed: one rung (or one batch doubling) per tick. */
static int descend(ladder *l, int64_t now) {
    if (l->level == LADDER_NORMAL || l->level == LADDER_RESTART) return 0;
    if (l->level == LADDER_SHRINK && l->batch < l->cfg.max_batch) {
        l->batch = l->batch * 2 < l->cfg.max_batch ? l->batch * 2 : l->cfg.max_batch;
        return 1; /* restoring the batch needs no new hold: pressure stays low */
    }
    int to = l->level - 1;
    if (to == LADDER_COMPACT && !l->cfg.has_kv8) to = LADDER_SHRINK;
    go(l, to);
    l->below_since = now; /* hold again before the next rung */
    return 1;
}

/* The batch a pinned level implies, reached one halving or doubling per tick. */
static int follow_pin(ladder *l) {
    int want = l->level == LADDER_NORMAL ? l->cfg.max_batch : 1;
    if (l->batch == want) return 0;
    if (l->batch > want) l->batch = l->batch / 2 > want ? l->batch / 2 : want;
    else l->batch = l->batch * 2 < want ? l->batch * 2 : want;
    return 1;
}

int ladder_tick(ladder *l, double pressure, int64_t now) {
    l->pressure = pressure;
    if (l->level == LADDER_RESTART) return 0;
    if (l->pinned >= 0) return follow_pin(l);
    if (pressure > l->cfg.up) {
        l->below_since = -1;
        return climb(l);
    }
    if (pressure >= l->cfg.down) {
        l->below_since = -1; /* between the thresholds: hold still */
        return 0;
    }
    if (l->below_since < 0) l->below_since = now;
    if (now - l->below_since < l->cfg.hold_ms) return 0;
    return descend(l, now);
}

int ladder_pin(ladder *l, int level) {
    if (level < -1 || level > LADDER_SHED || l->level == LADDER_RESTART) return -EINVAL;
    l->pinned = level;
    if (level >= 0 && level != l->level) go(l, level);
    l->below_since = -1;
    return 1;
}

void ladder_restart(ladder *l) {
    if (l->level != LADDER_RESTART) go(l, LADDER_RESTART);
}
