/* test_loop: timers (order, repeat, deletion from callbacks, a 1000-timer heap), fds on
 * pipes (readiness, deletion inside callbacks, stale events), tasks, the before-sleep
 * hook, the wake from another thread, and stop. Delays are a few ms; only lower bounds
 * on time are asserted. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "sched/loop.h"
#include "tests/unit/check.h"

/* ---------------------------------------------------------------- helpers */

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* Runs iterations until *done reaches want or budget_ms passes. */
static void run_until(loop_t *l, const int *done, int want, int budget_ms) {
    int64_t end = loop_now_ms() + budget_ms;
    while (*done < want && loop_now_ms() < end) loop_run_once(l, 50);
}

/* ---------------------------------------------------------------- clock */

static void test_clock(void) {
    int64_t a = loop_now_us(), b = loop_now_us();
    CHECK(a > 0 && b >= a, "now_us %lld then %lld", (long long)a, (long long)b);
    int64_t ms = loop_now_ms();
    CHECK(ms >= a / 1000 && ms - a / 1000 < 1000, "now_ms %lld vs us %lld", (long long)ms,
          (long long)a);
    sleep_ms(2);
    CHECK(loop_now_us() - b >= 2000, "2 ms sleep measured %lld us",
          (long long)(loop_now_us() - b));
}

/* ---------------------------------------------------------------- timers */

typedef struct {
    int order[16], n;
    int64_t at[16]; /* us when each fired */
} fire_log;

typedef struct {
    fire_log *log;
    int tag;
} fire_arg;

static int64_t log_timer(loop_t *l, int64_t id, void *ud) {
    (void)l, (void)id;
    fire_arg *a = ud;
    if (a->log->n < 16) {
        a->log->at[a->log->n] = loop_now_us();
        a->log->order[a->log->n++] = a->tag;
    }
    return LOOP_NOMORE;
}

static void test_timer_order(void) {
    loop_t *l = loop_new(8, 8);
    CHECK(l != NULL, "loop_new");
    if (!l) return;
    static const int delays[] = {20, 5, 10, 1, 15, 0};
    fire_log log = {0};
    fire_arg args[6];
    int64_t t0 = loop_now_us();
    for (int i = 0; i < 6; i++) {
        args[i] = (fire_arg){&log, delays[i]};
        int64_t id = loop_timer_add(l, delays[i], log_timer, &args[i]);
        CHECK(id > 0, "timer_add %d: %lld", i, (long long)id);
    }
    run_until(l, &log.n, 6, 1000);
    CHECK(log.n == 6, "fired %d of 6", log.n);
    static const int want[] = {0, 1, 5, 10, 15, 20};
    for (int i = 0; i < log.n && i < 6; i++) {
        CHECK(log.order[i] == want[i], "fire %d: delay %d, want %d", i, log.order[i], want[i]);
        CHECK(log.at[i] - t0 >= (int64_t)log.order[i] * 1000, "delay %d fired after %lld us",
              log.order[i], (long long)(log.at[i] - t0));
    }
    /* Fired one-shot timers are gone. */
    CHECK(loop_timer_add(l, 1, log_timer, &args[0]) > 0, "slot reuse");
    loop_free(l);
}

typedef struct {
    int n, stop_after;
    int64_t at[8];
} repeat_arg;

static int64_t repeat_timer(loop_t *l, int64_t id, void *ud) {
    (void)l, (void)id;
    repeat_arg *r = ud;
    if (r->n < 8) r->at[r->n] = loop_now_us();
    return ++r->n < r->stop_after ? 3 : LOOP_NOMORE;
}

static void test_timer_repeat(void) {
    loop_t *l = loop_new(8, 4);
    CHECK(l != NULL, "loop_new");
    if (!l) return;
    repeat_arg r = {.stop_after = 5};
    int64_t t0 = loop_now_us();
    int64_t id = loop_timer_add(l, 2, repeat_timer, &r);
    CHECK(id > 0, "timer_add %lld", (long long)id);
    run_until(l, &r.n, 5, 1000);
    for (int i = 0; i < 5 && i < r.n; i++) {
        int64_t prev = i ? r.at[i - 1] : t0, gap = i ? 3000 : 2000;
        CHECK(r.at[i] - prev >= gap, "repeat %d: gap %lld us", i, (long long)(r.at[i] - prev));
    }
    /* LOOP_NOMORE ended it: no sixth run, and the id is dead. */
    for (int i = 0; i < 3; i++) loop_run_once(l, 5);
    CHECK(r.n == 5, "repeat ran %d times, want 5", r.n);
    CHECK(loop_timer_del(l, id) == -ENOENT, "del after NOMORE");
    loop_free(l);
}

/* A deletes itself, B (due in the same pass) and C (later), and asks to repeat. */
typedef struct {
    int64_t self, b, c;
    int runs, del_self, del_b, del_c, del_again;
} killer_arg;

static int64_t killer_timer(loop_t *l, int64_t id, void *ud) {
    killer_arg *k = ud;
    k->runs++;
    k->del_self = loop_timer_del(l, id);
    k->del_again = loop_timer_del(l, id);
    k->del_b = loop_timer_del(l, k->b);
    k->del_c = loop_timer_del(l, k->c);
    return 1;
}

static int64_t count_timer(loop_t *l, int64_t id, void *ud) {
    (void)l, (void)id;
    ++*(int *)ud;
    return 1;
}

static void test_timer_del_in_callback(void) {
    loop_t *l = loop_new(8, 4);
    CHECK(l != NULL, "loop_new");
    if (!l) return;
    killer_arg k = {0};
    int b_runs = 0, c_runs = 0;
    k.self = loop_timer_add(l, 1, killer_timer, &k);
    k.b = loop_timer_add(l, 1, count_timer, &b_runs);
    k.c = loop_timer_add(l, 10, count_timer, &c_runs);
    CHECK(k.self > 0 && k.b > 0 && k.c > 0, "ids %lld %lld %lld", (long long)k.self,
          (long long)k.b, (long long)k.c);
    sleep_ms(3); /* A and B both due: one pass sees both */
    int n = loop_run_once(l, 0);
    CHECK(n == 1, "one callback ran, got %d", n);
    CHECK(k.runs == 1, "killer ran %d", k.runs);
    CHECK(k.del_self == 0 && k.del_b == 0 && k.del_c == 0, "dels %d %d %d", k.del_self,
          k.del_b, k.del_c);
    CHECK(k.del_again == -ENOENT, "second del of self: %d", k.del_again);
    int64_t end = loop_now_ms() + 20;
    while (loop_now_ms() < end) loop_run_once(l, 5);
    CHECK(k.runs == 1 && b_runs == 0 && c_runs == 0, "after: killer %d b %d c %d", k.runs,
          b_runs, c_runs);
    /* All four slots are free again; a fifth timer does not fit. */
    int64_t ids[5];
    for (int i = 0; i < 5; i++) ids[i] = loop_timer_add(l, 1000, count_timer, &b_runs);
    CHECK(ids[0] > 0 && ids[1] > 0 && ids[2] > 0 && ids[3] > 0, "refill %lld %lld %lld %lld",
          (long long)ids[0], (long long)ids[1], (long long)ids[2], (long long)ids[3]);
    CHECK(ids[4] == -ENOSPC, "fifth timer: %lld", (long long)ids[4]);
    /* Old ids never name the new timers. */
    CHECK(loop_timer_del(l, k.b) == -ENOENT, "stale id deleted a live timer");
    /* A deleted timer's slot comes back on the next add, even before a sweep. */
    CHECK(loop_timer_del(l, ids[2]) == 0, "del");
    int64_t again = loop_timer_add(l, 1000, count_timer, &b_runs);
    CHECK(again > 0 && again != ids[2], "add after del when full: %lld", (long long)again);
    CHECK(loop_timer_add(l, -1, count_timer, NULL) == -EINVAL, "negative delay");
    CHECK(loop_timer_add(l, 1, NULL, NULL) == -EINVAL, "NULL fn");
    CHECK(loop_timer_del(l, 0) == -ENOENT && loop_timer_del(l, -5) == -ENOENT &&
              loop_timer_del(l, (int64_t)1 << 32 | 77) == -ENOENT,
          "bad ids");
    loop_free(l);
}

/* A 0 ms repeating timer runs once per iteration and does not starve fds. */
static int64_t zero_timer(loop_t *l, int64_t id, void *ud) {
    (void)l, (void)id;
    ++*(int *)ud;
    return 0;
}

static void test_timer_zero_repeat(void) {
    loop_t *l = loop_new(8, 4);
    CHECK(l != NULL, "loop_new");
    if (!l) return;
    int runs = 0;
    CHECK(loop_timer_add(l, 0, zero_timer, &runs) > 0, "add");
    for (int i = 0; i < 5; i++) {
        int n = loop_run_once(l, 1000);
        CHECK(n == 1, "iteration %d ran %d callbacks", i, n);
    }
    CHECK(runs == 5, "zero timer ran %d times in 5 iterations", runs);
    loop_free(l);
}

/* 1000 timers, random delays, every third deleted: the rest fire once, by deadline. */
#define NHEAP 1000

typedef struct {
    int delay, idx, fired;
    int64_t added;
} heap_item;

static struct {
    heap_item items[NHEAP];
    int order[NHEAP], n;
    int64_t fired_at[NHEAP];
} H;

static int64_t heap_timer(loop_t *l, int64_t id, void *ud) {
    (void)l, (void)id;
    heap_item *it = ud;
    it->fired++;
    if (H.n < NHEAP) {
        H.fired_at[H.n] = loop_now_us();
        H.order[H.n++] = it->idx;
    }
    return LOOP_NOMORE;
}

static void test_timer_heap_1000(void) {
    loop_t *l = loop_new(8, NHEAP);
    CHECK(l != NULL, "loop_new");
    if (!l) return;
    memset(&H, 0, sizeof H);
    static int64_t ids[NHEAP];
    uint32_t rng = 12345;
    int64_t t0 = loop_now_us();
    for (int i = 0; i < NHEAP; i++) {
        rng = rng * 1664525u + 1013904223u;
        H.items[i] = (heap_item){.delay = (int)(rng >> 16) % 20, .idx = i};
        H.items[i].added = loop_now_us();
        ids[i] = loop_timer_add(l, H.items[i].delay, heap_timer, &H.items[i]);
    }
    int64_t span_us = loop_now_us() - t0;
    int ok = 1;
    for (int i = 0; i < NHEAP; i++) ok &= ids[i] > 0;
    CHECK(ok, "1000 adds");
    CHECK(loop_timer_add(l, 1, heap_timer, &H.items[0]) == -ENOSPC, "1001st add");
    int want = 0;
    for (int i = 0; i < NHEAP; i++) {
        if (i % 3 == 0) ok &= loop_timer_del(l, ids[i]) == 0;
        else want++;
    }
    CHECK(ok, "deletes");
    run_until(l, &H.n, want, 1000);
    for (int i = 0; i < 3; i++) loop_run_once(l, 1);
    CHECK(H.n == want, "fired %d, want %d", H.n, want);

    /* Deadlines are (add time + delay); adds spread over span_us, so when the span is
     * under 1 ms the order is exactly by (delay, add order); otherwise allow the slack. */
    int slack = (int)((span_us + 999) / 1000);
    int bad_order = 0, early = 0, twice = 0, deleted_fired = 0;
    for (int i = 0; i < H.n; i++) {
        const heap_item *it = &H.items[H.order[i]];
        if (H.fired_at[i] - it->added < (int64_t)it->delay * 1000) early++;
        if (i == 0) continue;
        const heap_item *pv = &H.items[H.order[i - 1]];
        if (slack == 0 ? (pv->delay > it->delay || (pv->delay == it->delay && pv->idx > it->idx))
                       : pv->delay > it->delay + slack)
            bad_order++;
    }
    for (int i = 0; i < NHEAP; i++) {
        if (H.items[i].fired > 1) twice++;
        if (i % 3 == 0 && H.items[i].fired) deleted_fired++;
    }
    CHECK(bad_order == 0, "%d out-of-order fires (span %lld us)", bad_order, (long long)span_us);
    CHECK(early == 0, "%d timers fired early", early);
    CHECK(twice == 0 && deleted_fired == 0, "twice %d, deleted fired %d", twice, deleted_fired);
    loop_free(l);
}

/* ---------------------------------------------------------------- fds */

typedef struct {
    int calls, last_mask, last_fd;
} fd_log;

static void log_fd(loop_t *l, int fd, void *ud, int mask) {
    (void)l;
    fd_log *f = ud;
    f->calls++;
    f->last_mask = mask;
    f->last_fd = fd;
}

static void test_fd_readiness(void) {
    loop_t *l = loop_new(64, 4);
    CHECK(l != NULL, "loop_new");
    if (!l) return;
    int p[2];
    CHECK(pipe(p) == 0, "pipe");
    fd_log r = {0}, w = {0};
    CHECK(loop_fd_add(l, p[0], LOOP_READ, log_fd, &r) == 0, "add read");
    CHECK(loop_fd_mask(l, p[0]) == LOOP_READ, "mask %d", loop_fd_mask(l, p[0]));
    CHECK(loop_run_once(l, 0) == 0 && r.calls == 0, "empty pipe fired %d", r.calls);

    CHECK(write(p[1], "x", 1) == 1, "write");
    CHECK(loop_run_once(l, 100) == 1, "readable");
    CHECK(r.calls == 1 && r.last_mask == LOOP_READ && r.last_fd == p[0], "calls %d mask %d fd %d",
          r.calls, r.last_mask, r.last_fd);
    loop_run_once(l, 0); /* level-triggered: still readable */
    CHECK(r.calls == 2, "level-triggered: calls %d", r.calls);
    char c;
    CHECK(read(p[0], &c, 1) == 1, "read");
    loop_run_once(l, 0);
    CHECK(r.calls == 2, "drained pipe fired: calls %d", r.calls);

    CHECK(loop_fd_add(l, p[1], LOOP_WRITE, log_fd, &w) == 0, "add write");
    CHECK(loop_run_once(l, 100) == 1 && w.calls == 1 && w.last_mask == LOOP_WRITE,
          "writable: calls %d mask %d", w.calls, w.last_mask);
    CHECK(loop_fd_del(l, p[1], LOOP_WRITE) == 0 && loop_fd_mask(l, p[1]) == LOOP_NONE, "del");
    loop_run_once(l, 0);
    CHECK(w.calls == 1, "deleted fd fired");
    CHECK(loop_fd_del(l, p[1], LOOP_WRITE) == 0, "second del is a no-op");

    close(p[0]);
    close(p[1]);

    /* One fn for both directions: one call with both bits. Different fns: two calls. */
    int sp[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sp) == 0, "socketpair");
    CHECK(write(sp[1], "x", 1) == 1, "write");
    fd_log both = {0}, rd = {0}, wr = {0};
    CHECK(loop_fd_add(l, sp[0], LOOP_READ | LOOP_WRITE, log_fd, &both) == 0, "add rw");
    CHECK(loop_run_once(l, 100) == 1, "one call");
    CHECK(both.calls == 1 && both.last_mask == (LOOP_READ | LOOP_WRITE), "calls %d mask %d",
          both.calls, both.last_mask);
    CHECK(loop_fd_add(l, sp[0], LOOP_READ, log_fd, &rd) == 0, "replace read");
    CHECK(loop_fd_add(l, sp[0], LOOP_WRITE, log_fd, &wr) == 0, "replace write");
    CHECK(loop_fd_mask(l, sp[0]) == (LOOP_READ | LOOP_WRITE), "mask");
    CHECK(loop_run_once(l, 100) == 2, "two calls");
    CHECK(rd.calls == 1 && rd.last_mask == LOOP_READ && wr.calls == 1 &&
              wr.last_mask == LOOP_WRITE && both.calls == 1,
          "rd %d/%d wr %d/%d both %d", rd.calls, rd.last_mask, wr.calls, wr.last_mask,
          both.calls);
    CHECK(loop_fd_del(l, sp[0], LOOP_READ) == 0 && loop_fd_mask(l, sp[0]) == LOOP_WRITE, "del r");
    loop_run_once(l, 100);
    CHECK(rd.calls == 1 && wr.calls == 2, "after del read: rd %d wr %d", rd.calls, wr.calls);
    loop_fd_del(l, sp[0], LOOP_READ | LOOP_WRITE);

    /* Peer hangup fires every registered direction. */
    close(sp[1]);
    fd_log hup = {0};
    CHECK(loop_fd_add(l, sp[0], LOOP_READ, log_fd, &hup) == 0, "add");
    loop_run_once(l, 100);
    CHECK(hup.calls == 1 && hup.last_mask == LOOP_READ, "hangup: calls %d mask %d", hup.calls,
          hup.last_mask);
    loop_fd_del(l, sp[0], LOOP_READ);
    close(sp[0]);

    /* Bad arguments. */
    CHECK(loop_fd_add(l, -1, LOOP_READ, log_fd, &r) == -EBADF, "negative fd");
    CHECK(loop_fd_add(l, 64, LOOP_READ, log_fd, &r) == -ERANGE, "fd >= max_fds");
    CHECK(loop_fd_add(l, 0, 0, log_fd, &r) == -EINVAL, "empty mask");
    CHECK(loop_fd_add(l, 0, LOOP_READ, NULL, &r) == -EINVAL, "NULL fn");
    CHECK(loop_fd_mask(l, 1000) == LOOP_NONE && loop_fd_del(l, 1000, LOOP_READ) == 0, "range");
    loop_free(l);
}

/* Two readable pipes; whichever fires first deletes itself and the other. The second
 * event of the same epoll_wait must not reach its callback. */
typedef struct {
    int *calls;
    int self, other;
} del_arg;

static void del_both_fd(loop_t *l, int fd, void *ud, int mask) {
    (void)fd, (void)mask;
    del_arg *a = ud;
    ++*a->calls;
    loop_fd_del(l, a->self, LOOP_READ);
    loop_fd_del(l, a->other, LOOP_READ);
}

/* Deletes and closes the other pipe, then opens a fresh (empty) pipe that usually takes
 * the same fd number and registers it: the stale event must not reach the new fd. */
typedef struct {
    int *calls, *fresh_calls;
    int self, other, other_w, fresh[2];
} reopen_arg;

static void count_fd(loop_t *l, int fd, void *ud, int mask) {
    (void)l, (void)fd, (void)mask;
    ++*(int *)ud;
}

static void reopen_fd(loop_t *l, int fd, void *ud, int mask) {
    (void)fd, (void)mask;
    reopen_arg *a = ud;
    ++*a->calls;
    if (a->fresh[0] >= 0) return;
    loop_fd_del(l, a->other, LOOP_READ);
    close(a->other);
    close(a->other_w);
    if (pipe(a->fresh) == 0) loop_fd_add(l, a->fresh[0], LOOP_READ, count_fd, a->fresh_calls);
    loop_fd_del(l, a->self, LOOP_READ);
}

static void test_fd_del_in_callback(void) {
    loop_t *l = loop_new(64, 4);
    CHECK(l != NULL, "loop_new");
    if (!l) return;
    int a[2], b[2], calls = 0;
    CHECK(pipe(a) == 0 && pipe(b) == 0, "pipes");
    CHECK(write(a[1], "x", 1) == 1 && write(b[1], "x", 1) == 1, "writes");
    del_arg da = {&calls, a[0], b[0]}, db = {&calls, b[0], a[0]};
    CHECK(loop_fd_add(l, a[0], LOOP_READ, del_both_fd, &da) == 0, "add a");
    CHECK(loop_fd_add(l, b[0], LOOP_READ, del_both_fd, &db) == 0, "add b");
    int n = loop_run_once(l, 100);
    CHECK(n == 1 && calls == 1, "both readable, one deleted both: n %d calls %d", n, calls);
    CHECK(loop_fd_mask(l, a[0]) == LOOP_NONE && loop_fd_mask(l, b[0]) == LOOP_NONE, "masks");
    loop_run_once(l, 0);
    CHECK(calls == 1, "deleted fds fired later: %d", calls);

    /* Re-adding after deletion works (a fresh registration). */
    CHECK(loop_fd_add(l, a[0], LOOP_READ, del_both_fd, &da) == 0, "re-add");
    loop_run_once(l, 100);
    CHECK(calls == 2, "re-added fd: calls %d", calls);
    close(a[0]), close(a[1]), close(b[0]), close(b[1]);

    /* Stale event on a reused fd number. */
    int c[2], d[2], rcalls = 0, fresh_calls = 0;
    CHECK(pipe(c) == 0 && pipe(d) == 0, "pipes");
    CHECK(write(c[1], "x", 1) == 1 && write(d[1], "x", 1) == 1, "writes");
    reopen_arg rc = {&rcalls, &fresh_calls, c[0], d[0], d[1], {-1, -1}};
    reopen_arg rd = {&rcalls, &fresh_calls, d[0], c[0], c[1], {-1, -1}};
    CHECK(loop_fd_add(l, c[0], LOOP_READ, reopen_fd, &rc) == 0, "add c");
    CHECK(loop_fd_add(l, d[0], LOOP_READ, reopen_fd, &rd) == 0, "add d");
    loop_run_once(l, 100);
    reopen_arg *won = rc.fresh[0] >= 0 ? &rc : &rd;
    CHECK(rcalls == 1, "reopen: calls %d", rcalls);
    CHECK(fresh_calls == 0, "stale event reached the reopened fd %d", won->fresh[0]);
    loop_run_once(l, 0);
    CHECK(fresh_calls == 0, "empty fresh pipe fired");
    CHECK(write(won->fresh[1], "y", 1) == 1, "write fresh");
    loop_run_once(l, 100);
    CHECK(fresh_calls == 1, "fresh pipe: calls %d", fresh_calls);
    loop_fd_del(l, won->fresh[0], LOOP_READ);
    close(won->fresh[0]), close(won->fresh[1]), close(won->self);
    close(won == &rc ? c[1] : d[1]);
    loop_free(l);
}

/* ---------------------------------------------------------------- tasks, hooks */

typedef struct {
    int log[64], n;
} task_log;

static task_log TL;
static int task_tags[64];

static void log_task(loop_t *l, void *ud) {
    (void)l;
    if (TL.n < 64) TL.log[TL.n++] = *(int *)ud;
}

static void repost_task(loop_t *l, void *ud) {
    log_task(l, ud);
    loop_task_post(l, log_task, &task_tags[2]);
}

static int64_t post_timer(loop_t *l, int64_t id, void *ud) {
    (void)id;
    loop_task_post(l, log_task, ud);
    return LOOP_NOMORE;
}

static void post_fd(loop_t *l, int fd, void *ud, int mask) {
    (void)mask;
    loop_fd_del(l, fd, LOOP_WRITE);
    loop_task_post(l, log_task, ud);
}

static void reenter_task(loop_t *l, void *ud) { *(int *)ud = loop_run_once(l, 0); }

static void test_tasks(void) {
    loop_t *l = loop_new(8, 8); /* ring of 16 */
    CHECK(l != NULL, "loop_new");
    if (!l) return;
    for (int i = 0; i < 64; i++) task_tags[i] = i;
    memset(&TL, 0, sizeof TL);

    /* FIFO, full ring, and a task posted by a task waits one iteration. */
    for (int i = 0; i < 16; i++) CHECK(loop_task_post(l, log_task, &task_tags[i]) == 0, "%d", i);
    CHECK(loop_task_post(l, log_task, &task_tags[16]) == -ENOSPC, "17th post");
    CHECK(loop_task_post(l, NULL, NULL) == -EINVAL, "NULL fn");
    int n = loop_run_once(l, 0);
    CHECK(n == 16 && TL.n == 16, "ran %d (n %d)", TL.n, n);
    int fifo = 1;
    for (int i = 0; i < 16; i++) fifo &= TL.log[i] == i;
    CHECK(fifo, "FIFO order");

    TL.n = 0;
    CHECK(loop_task_post(l, repost_task, &task_tags[1]) == 0, "post");
    int64_t t0 = loop_now_ms();
    loop_run_once(l, 1000); /* runs 1, posts 2: this iteration must not sleep */
    CHECK(TL.n == 1 && TL.log[0] == 1, "first iteration ran %d", TL.n);
    CHECK(loop_now_ms() - t0 < 500, "pending task still slept %lld ms",
          (long long)(loop_now_ms() - t0));
    loop_run_once(l, 0);
    CHECK(TL.n == 2 && TL.log[1] == 2, "second iteration ran %d", TL.n);

    /* Posted from a timer and an fd callback: runs at the start of the next iteration. */
    TL.n = 0;
    int p[2];
    CHECK(pipe(p) == 0, "pipe");
    CHECK(loop_fd_add(l, p[1], LOOP_WRITE, post_fd, &task_tags[3]) == 0, "add");
    CHECK(loop_timer_add(l, 0, post_timer, &task_tags[4]) > 0, "timer");
    n = loop_run_once(l, 1000);
    CHECK(n == 2 && TL.n == 0, "callbacks %d, tasks ran early: %d", n, TL.n);
    n = loop_run_once(l, 0);
    CHECK(n == 2 && TL.n == 2 && TL.log[0] + TL.log[1] == 7, "next iteration ran %d tasks", TL.n);
    close(p[0]), close(p[1]);

    /* Wraparound: 10 + 10 through a ring of 16. */
    TL.n = 0;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 10; i++) loop_task_post(l, log_task, &task_tags[round * 10 + i]);
        loop_run_once(l, 0);
    }
    fifo = TL.n == 20;
    for (int i = 0; i < TL.n; i++) fifo &= TL.log[i] == i;
    CHECK(fifo, "wraparound: %d tasks", TL.n);

    /* A callback may not run the loop. */
    int inner = 0;
    loop_task_post(l, reenter_task, &inner);
    loop_run_once(l, 0);
    CHECK(inner == -EBUSY, "re-entry returned %d", inner);
    loop_free(l);
}

typedef struct {
    int calls, tasks_before; /* TL.n seen at each call */
    loop_t *l;
} sleep_arg;

static void before_sleep(loop_t *l, void *ud) {
    sleep_arg *s = ud;
    s->calls++;
    s->tasks_before = TL.n;
    if (s->calls == 2) loop_task_post(l, log_task, &task_tags[9]);
}

static void test_before_sleep(void) {
    loop_t *l = loop_new(8, 8);
    CHECK(l != NULL, "loop_new");
    if (!l) return;
    memset(&TL, 0, sizeof TL);
    sleep_arg s = {0};
    loop_set_before_sleep(l, before_sleep, &s);
    loop_task_post(l, log_task, &task_tags[5]);
    loop_run_once(l, 0);
    CHECK(s.calls == 1 && s.tasks_before == 1, "hook after tasks: calls %d saw %d", s.calls,
          s.tasks_before);
    /* The hook's task keeps the wait at 0 even with an hour allowed. */
    int64_t t0 = loop_now_ms();
    loop_run_once(l, 3600 * 1000);
    CHECK(s.calls == 2 && loop_now_ms() - t0 < 500, "hook's task slept");
    loop_run_once(l, 0);
    CHECK(TL.n == 2 && TL.log[1] == 9, "hook's task ran: %d", TL.n);
    loop_set_before_sleep(l, NULL, NULL);
    loop_run_once(l, 0);
    CHECK(s.calls == 3, "hook cleared: calls %d", s.calls);
    loop_free(l);
}

/* ---------------------------------------------------------------- wake, stop */

typedef struct {
    loop_t *l;
    int ms, stop, rc;
} waker_arg;

static void *waker(void *p) {
    waker_arg *w = p;
    sleep_ms(w->ms);
    if (w->stop) loop_stop(w->l);
    else w->rc = loop_wake(w->l);
    return NULL;
}

static int64_t stop_timer(loop_t *l, int64_t id, void *ud) {
    (void)id;
    ++*(int *)ud;
    loop_stop(l);
    return 5;
}

static void test_wake_and_stop(void) {
    loop_t *l = loop_new(8, 4);
    CHECK(l != NULL, "loop_new");
    if (!l) return;

    /* A blocking run_once (no fds, no timers, no limit) ends on a wake from a thread. */
    waker_arg w = {l, 20, 0, -1};
    pthread_t th;
    int64_t t0 = loop_now_us();
    CHECK(pthread_create(&th, NULL, waker, &w) == 0, "thread");
    int n = loop_run_once(l, -1);
    int64_t took = loop_now_us() - t0;
    pthread_join(th, NULL);
    CHECK(n == 0 && w.rc == 0, "woken: n %d rc %d", n, w.rc);
    CHECK(took >= 15000, "woke after %lld us, before the wake", (long long)took);

    /* A wake before the wait is not lost; it is consumed by one iteration. */
    CHECK(loop_wake(l) == 0 && loop_wake(l) == 0, "wake");
    t0 = loop_now_ms();
    loop_run_once(l, 1000);
    CHECK(loop_now_ms() - t0 < 500, "pending wake slept");
    t0 = loop_now_ms();
    loop_run_once(l, 10);
    CHECK(loop_now_ms() - t0 >= 9, "wake was not drained");

    /* loop_stop from a timer callback. */
    int runs = 0;
    int64_t id = loop_timer_add(l, 5, stop_timer, &runs);
    CHECK(loop_run(l) == 0 && runs == 1, "stopped after %d timer runs", runs);
    loop_timer_del(l, id);

    /* loop_stop from another thread ends a loop_run blocked with nothing to do. */
    waker_arg ws = {l, 20, 1, 0};
    CHECK(pthread_create(&th, NULL, waker, &ws) == 0, "thread");
    CHECK(loop_run(l) == 0, "run");
    pthread_join(th, NULL);
    /* The stop was consumed: a later loop_run runs again until the next stop. */
    runs = 0;
    loop_timer_add(l, 1, stop_timer, &runs);
    CHECK(loop_run(l) == 0 && runs == 1, "second run: %d", runs);
    loop_free(l);
    loop_free(NULL);
}

static void test_new_args(void) {
    errno = 0;
    CHECK(loop_new(0, 4) == NULL && errno == EINVAL, "max_fds 0");
    CHECK(loop_new(8, -1) == NULL, "negative timers");
    loop_t *l = loop_new(1, 0);
    CHECK(l != NULL, "no timers");
    if (l) {
        CHECK(loop_timer_add(l, 1, count_timer, NULL) == -ENOSPC, "timer with 0 slots");
        CHECK(loop_run_once(l, 0) == 0, "empty loop");
        loop_free(l);
    }
}

int main(void) {
    alarm(20); /* a hang is a failure, not a stuck CI job */
    int64_t t0 = loop_now_ms();
    test_clock();
    test_new_args();
    test_timer_order();
    test_timer_repeat();
    test_timer_del_in_callback();
    test_timer_zero_repeat();
    test_timer_heap_1000();
    test_fd_readiness();
    test_fd_del_in_callback();
    test_tasks();
    test_before_sleep();
    test_wake_and_stop();
    CHECK(loop_now_ms() - t0 < 2000, "took %lld ms", (long long)(loop_now_ms() - t0));
    return check_done("loop");
}
