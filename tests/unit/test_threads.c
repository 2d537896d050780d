/* test_threads: the compute pool runs every task of every job exactly once, across
 * many short jobs of varying sizes (the hand-off race a forward pass hits ~150 times
 * per token), and after its workers fell asleep. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/threads.h"

#define MAX_TASKS 97

typedef struct {
    _Atomic int hits[MAX_TASKS];
    int job;
    _Atomic int wrong_job;
} job_ctx;

static int current_job;

static void task(void *ctx, int t, int n) {
    job_ctx *j = ctx;
    if (t < 0 || t >= n || n > MAX_TASKS) {
        atomic_fetch_add(&j->wrong_job, 1);
        return;
    }
    if (j->job != current_job) atomic_fetch_add(&j->wrong_job, 1);
    atomic_fetch_add(&j->hits[t], 1);
}

static int run_jobs(thr_pool *p, int jobs, int sleep_every) {
    static job_ctx ctx[2];
    int bad = 0;
    for (int k = 0; k < jobs; k++) {
        job_ctx *j = &ctx[k & 1]; /* alternate contexts, like consecutive matmuls */
        memset(j, 0, sizeof *j);
        j->job = current_job = k;
        int n = 1 + (k * 7919) % MAX_TASKS;
        thr_run(p, task, j, n);
        for (int t = 0; t < n; t++) bad += atomic_load(&j->hits[t]) != 1;
        bad += atomic_load(&j->wrong_job) != 0;
        if (sleep_every && k % sleep_every == 0) usleep(3000); /* let workers doze off */
    }
    return bad;
}

int main(void) {
    for (int threads = 1; threads <= 4; threads++) {
        thr_pool *p = thr_pool_new(threads);
        CHECK(p != NULL, "pool of %d", threads);
        if (!p) continue;
        int bad = run_jobs(p, 200000, 0);
        CHECK(bad == 0, "%d threads: %d tasks run other than once in back-to-back jobs", threads, bad);
        bad = run_jobs(p, 300, 25);
        CHECK(bad == 0, "%d threads: %d tasks run other than once across sleeps", threads, bad);
        thr_pool_free(p);
    }
    return check_done("threads");
}
