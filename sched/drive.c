/* drive: the engine on the loop (sched/drive.h). */
#include "sched/drive.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void dlog(drive *d, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void dlog(drive *d, int level, const char *fmt, ...) {
    if (!d->h.log) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    d->h.log(d->h.ud, level, msg);
}

/* ------------------------------------------------------------------ steps */

static int64_t retry_step(loop_t *l, int64_t id, void *ud) {
    (void)l, (void)id;
    drive *d = ud;
    d->retry_timer = 0;
    drive_kick(d);
    return LOOP_NOMORE;
}

void drive_kick(drive *d) {
    if (eng_busy(d->eng)) return;
    if (d->h.before_step) d->h.before_step(d->h.ud);
    if (!eng_pending(d->eng)) {
        if (d->h.idle) d->h.idle(d->h.ud, 0);
        return;
    }
    int r = eng_step_begin(d->eng);
    if (r == 1) {
        d->step_start_ms = loop_now_ms();
        return;
    }
    if (r == 0) {
        if (d->h.idle) d->h.idle(d->h.ud, 1);
        return;
    }
    if (!d->retry_timer) {
        dlog(d, DRIVE_LOG_ERROR, "step failed to start (%d); retrying", r);
        d->retry_timer = loop_timer_add(d->loop, DRIVE_RETRY_MS, retry_step, d);
        if (d->retry_timer < 0) d->retry_timer = 0;
    }
}

/* The step's results: sample, stream, retire, start the next. */
static void step_finished(drive *d) {
    if (eng_step_end(d->eng) < 0) dlog(d, DRIVE_LOG_ERROR, "step failed: %s", d->be->err);
    if (d->h.after_step) d->h.after_step(d->h.ud);
    drive_kick(d);
}

static int64_t slow_step_done(loop_t *l, int64_t id, void *ud) {
    (void)l, (void)id;
    drive *d = ud;
    d->slow_timer = 0;
    step_finished(d);
    return LOOP_NOMORE;
}

static void on_step_done(loop_t *l, int fd, void *ud, int mask) {
    (void)l, (void)fd, (void)mask;
    drive *d = ud;
    if (d->slow_timer) return; /* a slowed step is already done, its results held back */
    if (d->be->ops->poll(d->be) == 0) return; /* a stale wakeup */
    if (d->fault_drop_step) { /* as if the step never ended: the engine stays busy */
        dlog(d, DRIVE_LOG_WARN, "fault: a step's completion dropped");
        return;
    }
    if (d->fault_slow_n > 0) { /* as a slow device: the results come fault_slow_ms late */
        d->fault_slow_n--;
        d->slow_timer = loop_timer_add(d->loop, d->fault_slow_ms, slow_step_done, d);
        if (d->slow_timer > 0) return;
        d->slow_timer = 0;
    }
    step_finished(d);
}

int drive_init(drive *d, loop_t *l, engine *e, backend *be, const kv_pool *kv,
               const drive_hooks *h) {
    memset(d, 0, sizeof *d);
    d->loop = l, d->eng = e, d->be = be, d->kv = kv;
    if (h) d->h = *h;
    d->lad.level = LADDER_NORMAL, d->lad.pinned = -1;
    int r = loop_fd_add(l, be->ops->event_fd(be), LOOP_READ, on_step_done, d);
    if (r < 0) return r;
    d->fd_added = 1;
    return 0;
}

void drive_free(drive *d) {
    if (!d->loop) return;
    if (d->ladder_timer > 0) loop_timer_del(d->loop, d->ladder_timer);
    if (d->slow_timer > 0) loop_timer_del(d->loop, d->slow_timer);
    if (d->retry_timer > 0) loop_timer_del(d->loop, d->retry_timer);
    if (d->fd_added) loop_fd_del(d->loop, d->be->ops->event_fd(d->be), LOOP_READ);
    memset(d, 0, sizeof *d);
}

int64_t drive_step_age_ms(const drive *d) {
    return eng_busy(d->eng) ? loop_now_ms() - d->step_start_ms : 0;
}

void drive_fault_drop(drive *d) { d->fault_drop_step = 1; }
void drive_fault_slow(drive *d, int ms, int n) { d->fault_slow_ms = ms, d->fault_slow_n = n; }

/* ------------------------------------------------------------------ the degrade ladder */

/* Pressure is the share of KV blocks in use, not the queue: shrinking the batch moves
 * demand from the pool to the queue, and a pressure that counted both would never fall,
 * locking the box at batch 1 and shedding (the soak saw it). So rung 3 is reached when
 * even one sequence at batch 1 fills the pool past the high mark (long contexts on a
 * small pool); plain overload is the queue limits' business (503 with retry_after_ms at
 * admission). The pinned staging pool is carved at start for the largest step and
 * cannot run short, so it adds nothing. A backend whose memory others can take (a
 * GPU's) says how close that is (mem_pressure), and the larger of the two counts. */
double drive_pressure(const drive *d) {
    int total = d->kv->cfg.n_blocks;
    double p = total ? (double)(total - kv_free_blocks(d->kv)) / total : 0.0;
    if (d->be && d->be->ops->mem_pressure) {
        double m = d->be->ops->mem_pressure(d->be);
        if (m > p) p = m;
    }
    return p;
}

void drive_note_finished(drive *d) { d->finished_total++; }

int drive_retry_after_ms(const drive *d) {
    if (d->finish_rate <= 0) return DRIVE_SHED_MIN_MS;
    eng_stats st;
    eng_get_stats(d->eng, &st);
    double ms = 1000.0 * (st.running + st.waiting) / d->finish_rate;
    return ms < DRIVE_SHED_MIN_MS ? DRIVE_SHED_MIN_MS : ms > DRIVE_SHED_MAX_MS ? DRIVE_SHED_MAX_MS : (int)ms;
}

/* The ladder decided: the engine acts. */
static void ladder_apply(drive *d) {
    eng_set_max_batch(d->eng, d->lad.batch);
    /* rung 2 and above: full blocks turn to 8 bits (shedding keeps compacting) */
    eng_set_kv8(d->eng, d->lad.level >= LADDER_COMPACT && d->lad.level < LADDER_RESTART);
}

static void ladder_moved(drive *d, int moved) {
    if (moved) ladder_apply(d);
    if (d->h.ladder_tick) d->h.ladder_tick(d->h.ud, moved);
    if (moved) drive_kick(d);
}

/* Every tick: the finishing rate, then the pressure. */
static int64_t ladder_tick_cb(loop_t *l, int64_t id, void *ud) {
    (void)l, (void)id;
    drive *d = ud;
    int64_t now = loop_now_ms();
    if (now - d->rate_ms >= 1000) { /* only busy seconds count: idling is not slowness */
        eng_stats st;
        eng_get_stats(d->eng, &st);
        double r = (double)(d->finished_total - d->finished_seen) * 1000.0 / (double)(now - d->rate_ms);
        if (r > 0 || st.running > 0)
            d->finish_rate = d->finish_rate > 0 ? 0.7 * d->finish_rate + 0.3 * r : r;
        d->finished_seen = d->finished_total, d->rate_ms = now;
    }
    double p = drive_pressure(d);
    /* rung 2 still turning blocks to 8 bits: hold there (no climb, no descent) until it
     * has freed what it can */
    double seen = d->lad.level == LADDER_COMPACT && eng_kv8_working(d->eng) && p > d->lad.cfg.up
                      ? d->lad.cfg.up : p;
    int moved = ladder_tick(&d->lad, seen, now);
    d->lad.pressure = p; /* shown as it is, whatever the hold */
    ladder_moved(d, moved);
    return d->ladder_tick_ms;
}

int drive_ladder_start(drive *d, const ladder_config *lc, int tick_ms) {
    if (ladder_init(&d->lad, lc) < 0) return -EINVAL;
    d->ladder_tick_ms = tick_ms;
    d->rate_ms = loop_now_ms();
    d->ladder_timer = loop_timer_add(d->loop, tick_ms, ladder_tick_cb, d);
    if (d->ladder_timer < 0) {
        d->ladder_timer = 0;
        return -ENOMEM;
    }
    return 0;
}

int drive_ladder_pin(drive *d, int level) {
    int r = ladder_pin(&d->lad, level);
    if (r < 0) return r;
    ladder_moved(d, 1);
    return r;
}

void drive_ladder_restart(drive *d) {
    ladder_restart(&d->lad);
    ladder_apply(d);
    if (d->h.ladder_tick) d->h.ladder_tick(d->h.ud, 1);
}
