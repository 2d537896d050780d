/* loop: the cooperative event loop (see loop.h).
 *
 * Three sources feed one iteration: a task ring, an epoll set and a timer heap. The fd
 * table is indexed by fd, like ae's; each registration carries a generation in its
 * epoll data so an event fired for an fd that was deleted (and maybe reopened under the
 * same number) earlier in the same iteration is dropped. Timers live in fixed slots; the
 * heap orders slot indices by (deadline, arm sequence), and an id is (slot generation,
 * slot) so a stale id is detected in O(1). */
#include "sched/loop.h"

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- state */

#define WAKE_TAG UINT64_MAX /* epoll data of the wake eventfd: no fd is 0xffffffff */
#define MAX_DELAY_MS (INT64_MAX / 4000)

typedef struct {
    int mask;     /* LOOP_READ|LOOP_WRITE registered with epoll */
    uint32_t gen; /* bumped at each EPOLL_CTL_ADD; fired events carry it */
    loop_fd_fn rfn, wfn;
    void *rud, *wud;
} loop_fd;

typedef struct {
    int64_t when;     /* deadline, us on CLOCK_MONOTONIC */
    uint64_t seq;     /* arm order: breaks ties FIFO, and bounds one timer pass */
    loop_timer_fn fn; /* NULL: the slot is free */
    void *ud;
    uint32_t gen;     /* upper half of the id, 1..INT32_MAX */
    int hpos;         /* index in heap, -1 while out of it */
    unsigned char deleted, running;
} loop_timer;

typedef struct {
    loop_task_fn fn;
    void *ud;
} loop_task;

struct loop {
    int epfd, wakefd;
    int max_fds, max_timers;
    loop_fd *fds;              /* [max_fds], indexed by fd */
    struct epoll_event *fired; /* [max_fds + 1]: the wake fd has no table slot */
    loop_timer *timers;        /* [max_timers] slots */
    int *heap;                 /* [max_timers] slot indices, min-heap on (when, seq) */
    int nheap;
    int *free_slots;           /* [max_timers] stack of free slot indices */
    int nfree;
    int *dead;                 /* [max_timers] slots deleted but not yet swept */
    int ndead;
    uint64_t seq;              /* next arm sequence */
    loop_task *tasks;          /* [task_cap] ring */
    int task_cap, task_head, task_len;
    loop_task_fn before_sleep;
    void *before_sleep_ud;
    loop_pass_fn pass_fn;
    void *pass_ud;
    int in_iter;               /* inside loop_run_once: re-entry is refused */
    atomic_int stop;
};

/* ---------------------------------------------------------------- time */

int64_t loop_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t loop_now_ms(void) { return loop_now_us() / 1000; }

/* ---------------------------------------------------------------- create, free */

loop_t *loop_new(int max_fds, int max_timers) {
    if (max_fds <= 0 || max_timers < 0 || max_fds == INT_MAX ||
        (int64_t)max_fds + max_timers > INT_MAX) {
        errno = EINVAL;
        return NULL;
    }
    loop_t *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    l->epfd = l->wakefd = -1;
    l->max_fds = max_fds;
    l->max_timers = max_timers;
    l->task_cap = max_fds + max_timers;
    size_t nt = max_timers ? (size_t)max_timers : 1;
    l->fds = calloc((size_t)max_fds, sizeof *l->fds);
    l->fired = calloc((size_t)max_fds + 1, sizeof *l->fired);
    l->timers = calloc(nt, sizeof *l->timers);
    l->heap = calloc(nt, sizeof *l->heap);
    l->free_slots = calloc(nt, sizeof *l->free_slots);
    l->dead = calloc(nt, sizeof *l->dead);
    l->tasks = calloc((size_t)l->task_cap, sizeof *l->tasks);
    if (!l->fds || !l->fired || !l->timers || !l->heap || !l->free_slots || !l->dead ||
        !l->tasks)
        goto err;
    /* Slot 0 on top of the stack: ids come out in a predictable order. */
    for (int i = 0; i < max_timers; i++) l->free_slots[i] = max_timers - 1 - i;
    l->nfree = max_timers;
    atomic_init(&l->stop, 0);

    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (l->epfd < 0) goto err;
    l->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (l->wakefd < 0) goto err;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = WAKE_TAG};
    if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->wakefd, &ev) < 0) goto err;
    return l;

err:;
    int saved = errno;
    loop_free(l);
    errno = saved;
    return NULL;
}

void loop_free(loop_t *l) {
    if (!l) return;
    if (l->epfd >= 0) close(l->epfd);
    if (l->wakefd >= 0) close(l->wakefd);
    free(l->fds);
    free(l->fired);
    free(l->timers);
    free(l->heap);
    free(l->free_slots);
    free(l->dead);
    free(l->tasks);
    free(l);
}

/* ---------------------------------------------------------------- fd events */

static uint32_t epoll_bits(int mask) {
    return (mask & LOOP_READ ? EPOLLIN : 0) | (mask & LOOP_WRITE ? EPOLLOUT : 0);
}

int loop_fd_add(loop_t *l, int fd, int mask, loop_fd_fn fn, void *ud) {
    if (fd < 0) return -EBADF;
    if (fd >= l->max_fds) return -ERANGE;
    mask &= LOOP_READ | LOOP_WRITE;
    if (!mask || !fn) return -EINVAL;
    loop_fd *f = &l->fds[fd];
    int want = f->mask | mask;
    struct epoll_event ev = {.events = epoll_bits(want)};
    int rc = -1;
    if (f->mask) {
        ev.data.u64 = (uint64_t)f->gen << 32 | (uint32_t)fd;
        rc = epoll_ctl(l->epfd, EPOLL_CTL_MOD, fd, &ev);
        /* The fd was closed without loop_fd_del and the number reused: start afresh. */
        if (rc < 0 && errno == ENOENT) f->mask = 0;
    }
    if (!f->mask) {
        uint32_t gen = f->gen + 1;
        ev.data.u64 = (uint64_t)gen << 32 | (uint32_t)fd;
        rc = epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev);
        if (rc == 0) {
            f->gen = gen;
            f->rfn = f->wfn = NULL;
            f->rud = f->wud = NULL;
        }
        want = mask;
    }
    if (rc < 0) return -errno;
    f->mask = want;
    if (mask & LOOP_READ) {
        f->rfn = fn;
        f->rud = ud;
    }
    if (mask & LOOP_WRITE) {
        f->wfn = fn;
        f->wud = ud;
    }
    return 0;
}

int loop_fd_del(loop_t *l, int fd, int mask) {
    if (fd < 0 || fd >= l->max_fds) return 0;
    loop_fd *f = &l->fds[fd];
    int left = f->mask & ~mask;
    if (left == f->mask) return 0;
    int rc = 0;
    if (left) {
        struct epoll_event ev = {.events = epoll_bits(left),
                                 .data.u64 = (uint64_t)f->gen << 32 | (uint32_t)fd};
        if (epoll_ctl(l->epfd, EPOLL_CTL_MOD, fd, &ev) < 0) {
            if (errno == ENOENT || errno == EBADF) left = 0; /* closed already: gone */
            else rc = -errno;
        }
    } else if (epoll_ctl(l->epfd, EPOLL_CTL_DEL, fd, NULL) < 0 && errno != ENOENT &&
               errno != EBADF) {
        rc = -errno;
    }
    /* The table is updated even when epoll refused: no callback for a deleted direction. */
    f->mask = left;
    if (!(left & LOOP_READ)) {
        f->rfn = NULL;
        f->rud = NULL;
    }
    if (!(left & LOOP_WRITE)) {
        f->wfn = NULL;
        f->wud = NULL;
    }
    return rc;
}

int loop_fd_mask(const loop_t *l, int fd) {
    if (fd < 0 || fd >= l->max_fds) return LOOP_NONE;
    return l->fds[fd].mask;
}

/* Calls the callbacks of one fired event; returns how many ran. */
static int fd_dispatch(loop_t *l, const struct epoll_event *e) {
    int fd = (int)(uint32_t)e->data.u64;
    uint32_t gen = (uint32_t)(e->data.u64 >> 32);
    loop_fd *f = &l->fds[fd];
    int fired = 0;
    if (e->events & EPOLLIN) fired |= LOOP_READ;
    if (e->events & EPOLLOUT) fired |= LOOP_WRITE;
    if (e->events & (EPOLLERR | EPOLLHUP)) fired |= LOOP_READ | LOOP_WRITE;

    int n = 0, both = 0;
    if (f->gen == gen && (f->mask & fired & LOOP_READ)) {
        int m = f->mask & fired;
        both = (m & LOOP_WRITE) && f->rfn == f->wfn && f->rud == f->wud;
        f->rfn(l, fd, f->rud, both ? m : LOOP_READ);
        n++;
    }
    /* Re-read the table: the read callback may have deleted or replaced the fd. */
    if (!both && f->gen == gen && (f->mask & fired & LOOP_WRITE)) {
        f->wfn(l, fd, f->wud, LOOP_WRITE);
        n++;
    }
    return n;
}

/* ---------------------------------------------------------------- timer heap */

static int timer_before(const loop_t *l, int a, int b) {
    const loop_timer *x = &l->timers[a], *y = &l->timers[b];
    return x->when < y->when || (x->when == y->when && x->seq < y->seq);
}

static void heap_set(loop_t *l, int i, int slot) {
    l->heap[i] = slot;
    l->timers[slot].hpos = i;
}

static void heap_up(loop_t *l, int i) {
    int s = l->heap[i];
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!timer_before(l, s, l->heap[p])) break;
        heap_set(l, i, l->heap[p]);
        i = p;
    }
    heap_set(l, i, s);
}

static void heap_down(loop_t *l, int i) {
    int s = l->heap[i];
    for (;;) {
        int c = 2 * i + 1;
        if (c >= l->nheap) break;
        if (c + 1 < l->nheap && timer_before(l, l->heap[c + 1], l->heap[c])) c++;
        if (!timer_before(l, l->heap[c], s)) break;
        heap_set(l, i, l->heap[c]);
        i = c;
    }
    heap_set(l, i, s);
}

static void heap_push(loop_t *l, int slot) {
    heap_set(l, l->nheap++, slot);
    heap_up(l, l->nheap - 1);
}

static void heap_remove(loop_t *l, int i) {
    int slot = l->heap[i];
    int last = l->heap[--l->nheap];
    l->timers[slot].hpos = -1;
    if (i == l->nheap) return;
    heap_set(l, i, last);
    heap_down(l, i);
    heap_up(l, l->timers[last].hpos);
}

/* ---------------------------------------------------------------- timers */

static int64_t timer_id(const loop_t *l, int slot) {
    return (int64_t)l->timers[slot].gen << 32 | slot;
}

static void slot_free(loop_t *l, int slot) {
    loop_timer *t = &l->timers[slot];
    t->fn = NULL;
    t->ud = NULL;
    t->deleted = 0;
    l->free_slots[l->nfree++] = slot;
}

/* The later pass of deferred deletion: frees every deleted slot not running now. */
static void timers_sweep(loop_t *l) {
    int keep = 0;
    for (int i = 0; i < l->ndead; i++) {
        int s = l->dead[i];
        loop_timer *t = &l->timers[s];
        if (t->running) {
            l->dead[keep++] = s;
            continue;
        }
        if (t->hpos >= 0) heap_remove(l, t->hpos);
        slot_free(l, s);
    }
    l->ndead = keep;
}

static void timer_arm(loop_t *l, int slot, int64_t delay_ms) {
    loop_timer *t = &l->timers[slot];
    if (delay_ms > MAX_DELAY_MS) delay_ms = MAX_DELAY_MS;
    t->when = loop_now_us() + delay_ms * 1000;
    t->seq = l->seq++;
    heap_push(l, slot);
}

int64_t loop_timer_add(loop_t *l, int64_t delay_ms, loop_timer_fn fn, void *ud) {
    if (delay_ms < 0 || !fn) return -EINVAL;
    if (!l->nfree) timers_sweep(l);
    if (!l->nfree) return -ENOSPC;
    int slot = l->free_slots[--l->nfree];
    loop_timer *t = &l->timers[slot];
    t->gen = (t->gen + 1) & INT32_MAX;
    if (!t->gen) t->gen = 1;
    t->fn = fn;
    t->ud = ud;
    t->deleted = t->running = 0;
    timer_arm(l, slot, delay_ms);
    return timer_id(l, slot);
}

int loop_timer_del(loop_t *l, int64_t id) {
    if (id <= 0) return -ENOENT;
    int64_t slot = id & 0xffffffff;
    if (slot >= l->max_timers) return -ENOENT;
    loop_timer *t = &l->timers[slot];
    if (!t->fn || t->deleted || t->gen != (uint32_t)(id >> 32)) return -ENOENT;
    t->deleted = 1;
    l->dead[l->ndead++] = (int)slot;
    return 0;
}

/* Runs the timers due now. Timers armed during this pass (new, or rearmed with a
 * short delay) wait for the next one, so a 0 ms repeating timer cannot starve the loop. */
static int timers_run(loop_t *l) {
    int n = 0;
    int64_t now = loop_now_us();
    uint64_t seq_end = l->seq;
    timers_sweep(l);
    while (l->nheap > 0) {
        int slot = l->heap[0];
        loop_timer *t = &l->timers[slot];
        if (t->when > now || t->seq >= seq_end) break;
        heap_remove(l, 0);
        t->running = 1;
        int64_t next = t->fn(l, timer_id(l, slot), t->ud);
        t->running = 0;
        n++;
        if (t->deleted) {
            /* the sweep below frees it */
        } else if (next < 0) {
            slot_free(l, slot);
        } else {
            timer_arm(l, slot, next);
        }
        timers_sweep(l);
    }
    return n;
}

/* ---------------------------------------------------------------- tasks */

int loop_task_post(loop_t *l, loop_task_fn fn, void *ud) {
    if (!fn) return -EINVAL;
    if (l->task_len == l->task_cap) return -ENOSPC;
    int i = (l->task_head + l->task_len++) % l->task_cap;
    l->tasks[i] = (loop_task){fn, ud};
    return 0;
}

/* Runs the tasks queued before this call; those they post wait for the next iteration. */
static int tasks_run(loop_t *l) {
    int n = l->task_len;
    for (int i = 0; i < n; i++) {
        loop_task t = l->tasks[l->task_head];
        l->task_head = (l->task_head + 1) % l->task_cap;
        l->task_len--;
        t.fn(l, t.ud);
    }
    return n;
}

void loop_set_before_sleep(loop_t *l, loop_task_fn fn, void *ud) {
    l->before_sleep = fn;
    l->before_sleep_ud = ud;
}

/* ---------------------------------------------------------------- the loop */

/* epoll_wait's timeout: 0 while work waits, else the nearest deadline (rounded up, so
 * the wait never ends just before it) capped by max_wait_ms; -1 waits forever. */
static int wait_ms(loop_t *l, int64_t max_wait_ms) {
    if (l->task_len > 0 || atomic_load(&l->stop)) return 0;
    int64_t ms = max_wait_ms < 0 ? -1 : max_wait_ms;
    if (l->nheap > 0) {
        int64_t d = l->timers[l->heap[0]].when - loop_now_us();
        int64_t tms = d <= 0 ? 0 : (d + 999) / 1000;
        if (ms < 0 || tms < ms) ms = tms;
    }
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

static void wake_drain(loop_t *l) {
    uint64_t v;
    while (read(l->wakefd, &v, sizeof v) < 0 && errno == EINTR) {
    }
}

int loop_run_once(loop_t *l, int64_t max_wait_ms) {
    if (l->in_iter) return -EBUSY;
    l->in_iter = 1;
    int64_t t0 = l->pass_fn ? loop_now_us() : 0;
    int n = tasks_run(l);
    if (l->before_sleep) l->before_sleep(l, l->before_sleep_ud);
    timers_sweep(l); /* a deleted timer must not set the timeout */

    int64_t t1 = l->pass_fn ? loop_now_us() : 0;
    int nev = epoll_wait(l->epfd, l->fired, l->max_fds + 1, wait_ms(l, max_wait_ms));
    int64_t t2 = l->pass_fn ? loop_now_us() : 0;
    if (nev < 0) {
        if (errno != EINTR) {
            int rc = -errno;
            l->in_iter = 0;
            return rc;
        }
        nev = 0;
    }
    for (int i = 0; i < nev; i++) {
        if (l->fired[i].data.u64 == WAKE_TAG)
            wake_drain(l);
        else
            n += fd_dispatch(l, &l->fired[i]);
    }
    n += timers_run(l);
    l->in_iter = 0;
    if (l->pass_fn) l->pass_fn(l->pass_ud, (t1 - t0) + (loop_now_us() - t2));
    return n;
}

void loop_set_pass_hook(loop_t *l, loop_pass_fn fn, void *ud) {
    l->pass_fn = fn;
    l->pass_ud = ud;
}

int loop_run(loop_t *l) {
    int rc = 0;
    while (!atomic_load(&l->stop)) {
        rc = loop_run_once(l, -1);
        if (rc < 0) break;
        rc = 0;
    }
    atomic_store(&l->stop, 0);
    return rc;
}

void loop_stop(loop_t *l) {
    atomic_store(&l->stop, 1);
    loop_wake(l);
}

int loop_wake(loop_t *l) {
    uint64_t one = 1;
    for (;;) {
        if (write(l->wakefd, &one, sizeof one) == (ssize_t)sizeof one) return 0;
        if (errno == EAGAIN) return 0; /* the counter is full: a wake is pending anyway */
        if (errno != EINTR) return -errno;
    }
}
