/* threads: a fixed pool of compute threads running parallel-for jobs.
 *
 * A forward pass runs a few parallel steps per layer (≈150 per token), so the hand-off
 * must cost about a microsecond: workers spin on a generation counter while jobs are
 * coming and fall back to a futex sleep when the pool has been idle for a while. The
 * caller of thr_run works on the job too and returns when every task is done. */
#ifndef KILN_THREADS_H
#define KILN_THREADS_H

/* fn runs once per task index in [0, n_tasks), on any thread of the pool. */
typedef void (*thr_fn)(void *ctx, int task, int n_tasks);

typedef struct thr_pool thr_pool;

/* n_threads counts the caller: n_threads - 1 workers are started. NULL on failure. */
thr_pool *thr_pool_new(int n_threads);
void thr_pool_free(thr_pool *p);
int thr_pool_size(const thr_pool *p);
/* Run fn over n_tasks tasks and wait for all of them. Only one thread calls thr_run. */
void thr_run(thr_pool *p, thr_fn fn, void *ctx, int n_tasks);

#endif
