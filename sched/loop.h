/* loop: the single-threaded cooperative event loop kilnd runs on (after Redis ae).
 *
 * fd events (epoll, level-triggered), timers (CLOCK_MONOTONIC, a min-heap), posted tasks
 * and a hook before each sleep. Everything is allocated in loop_new; an iteration
 * allocates nothing. Callbacks may add or delete any fd, timer or task, their own
 * included; they must not call loop_run_once, loop_run or loop_free. Only loop_wake and
 * loop_stop may be called from other threads. Errors are negative errno codes; the loop
 * logs nothing. */
#ifndef KILN_SCHED_LOOP_H
#define KILN_SCHED_LOOP_H

#include <stdint.h>

#define LOOP_NONE 0
#define LOOP_READ 1
#define LOOP_WRITE 2
#define LOOP_NOMORE (-1) /* timer callback: do not run again */

typedef struct loop loop_t;
/* mask: what fired; an error or hangup fires every registered direction. */
typedef void (*loop_fd_fn)(loop_t *l, int fd, void *ud, int mask);
/* Returns the next delay in ms (0: next iteration), or LOOP_NOMORE. */
typedef int64_t (*loop_timer_fn)(loop_t *l, int64_t id, void *ud);
typedef void (*loop_task_fn)(loop_t *l, void *ud);

/* fds must be < max_fds; at most max_timers timers at once; the task ring holds
 * max_fds + max_timers entries. NULL with errno set on failure. */
loop_t *loop_new(int max_fds, int max_timers);
void loop_free(loop_t *l);

/* Adds mask to the fd's interest; fn and ud replace those of the directions in mask.
 * When both directions share fn and ud, one call gets both fired bits.
 * 0, -EBADF, -ERANGE (fd >= max_fds), -EINVAL, or epoll_ctl's error. */
int loop_fd_add(loop_t *l, int fd, int mask, loop_fd_fn fn, void *ud);
/* Removes mask from the fd's interest (unknown fds or bits: no-op). Call before close. */
int loop_fd_del(loop_t *l, int fd, int mask);
int loop_fd_mask(const loop_t *l, int fd); /* registered mask, LOOP_NONE if none */

/* Returns an id > 0, or -EINVAL / -ENOSPC. A deleted timer never runs again; its slot
 * is reclaimed by a later sweep, so deleting from any callback is safe. */
int64_t loop_timer_add(loop_t *l, int64_t delay_ms, loop_timer_fn fn, void *ud);
int loop_timer_del(loop_t *l, int64_t id); /* 0, or -ENOENT */

/* Runs fn at the start of the next iteration, which will not sleep. 0, -EINVAL, or
 * -ENOSPC when the ring is full. */
int loop_task_post(loop_t *l, loop_task_fn fn, void *ud);
void loop_set_before_sleep(loop_t *l, loop_task_fn fn, void *ud);
/* Called at the end of each iteration with how long it worked (tasks, before-sleep, fd
 * callbacks and timers; the wait excluded), in µs: a pass that runs long delays every
 * other connection, so the server shows the longest (its loop-lag gauge). */
typedef void (*loop_pass_fn)(void *ud, int64_t busy_us);
void loop_set_pass_hook(loop_t *l, loop_pass_fn fn, void *ud);

/* One iteration: queued tasks, before-sleep, wait (at most max_wait_ms, < 0: until
 * something happens), fd callbacks, due timers. Returns the callbacks run (a wake alone
 * returns 0), or -EBUSY from inside a callback, or epoll_wait's error. */
int loop_run_once(loop_t *l, int64_t max_wait_ms);
int loop_run(loop_t *l); /* until loop_stop: 0, or the error that ended it */
void loop_stop(loop_t *l);
int loop_wake(loop_t *l); /* interrupts a wait: 0 or -errno */

int64_t loop_now_ms(void); /* CLOCK_MONOTONIC */
int64_t loop_now_us(void);

#endif
