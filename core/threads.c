/* threads: spin-then-sleep parallel-for pool. See threads.h for why it spins. */
#include "core/threads.h"

#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define THR_SPIN_ROUNDS 200000 /* ≈ a few ms of spinning before a worker sleeps */
/* A claim is one fetch_add on a 64-bit word holding (n_tasks << 32 | next index), so
 * a thread learns from a single atomic read both its index and whether it is valid
 * for the job it belongs to. Between jobs the word is 0 (n_tasks 0): a worker that
 * wakes late claims nothing. A separate n_tasks field would let a late claim of the
 * previous job be checked against the next job's size and run a task twice. */
#define THR_CLAIM(n) ((uint64_t)(uint32_t)(n) << 32)

struct thr_pool {
    int n_threads;
    pthread_t *workers;       /* [n_threads - 1] */
    _Atomic unsigned gen;     /* bumped for each job; workers wait on it */
    _Atomic uint64_t next;    /* THR_CLAIM(n_tasks) + next task index */
    _Atomic int done_tasks;   /* tasks finished in the current job */
    _Atomic int sleepers;     /* workers in futex wait: the caller must wake them */
    _Atomic int stop;
    thr_fn fn;
    void *ctx;
};

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void futex_wait(_Atomic unsigned *addr, unsigned val) {
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic unsigned *addr) {
    syscall(SYS_futex, (unsigned *)addr, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

/* Take tasks until none are left. */
static void run_tasks(thr_pool *p) {
    for (;;) {
        uint64_t v = atomic_fetch_add_explicit(&p->next, 1, memory_order_acq_rel);
        uint32_t t = (uint32_t)v, n = (uint32_t)(v >> 32);
        if (t >= n) return;
        /* a valid claim keeps its job running, so fn and ctx are still this job's */
        p->fn(p->ctx, (int)t, (int)n);
        atomic_fetch_add_explicit(&p->done_tasks, 1, memory_order_release);
    }
}

static void *worker_main(void *arg) {
    thr_pool *p = arg;
    unsigned seen = atomic_load_explicit(&p->gen, memory_order_acquire);
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (atomic_load_explicit(&p->stop, memory_order_relaxed)) return NULL;
            if (++spins < THR_SPIN_ROUNDS) {
                cpu_relax();
                continue;
            }
            atomic_fetch_add(&p->sleepers, 1);
            /* Re-check after announcing ourselves, so a bump in between is not lost. */
            if (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) futex_wait(&p->gen, seen);
            atomic_fetch_sub(&p->sleepers, 1);
            spins = 0;
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_relaxed)) return NULL;
        run_tasks(p);
    }
}

thr_pool *thr_pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    thr_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    atomic_init(&p->next, 0);
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    if (!p->workers) {
        free(p);
        return NULL;
    }
    /* Explicit stacks: musl's default (128 KiB) is too small for the matmul tiles. */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 4u << 20);
    for (int i = 0; i < n_threads - 1; i++) {
        if (pthread_create(&p->workers[i], &attr, worker_main, p) != 0) {
            p->n_threads = i + 1; /* keep the ones that started */
            break;
        }
    }
    pthread_attr_destroy(&attr);
    return p;
}

void thr_pool_free(thr_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->gen, 1);
    futex_wake_all(&p->gen);
    for (int i = 0; i < p->n_threads - 1; i++) pthread_join(p->workers[i], NULL);
    free(p->workers);
    free(p);
}

int thr_pool_size(const thr_pool *p) { return p->n_threads; }

void thr_run(thr_pool *p, thr_fn fn, void *ctx, int n_tasks) {
    if (n_tasks <= 0) return;
    if (p->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, n_tasks);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->done_tasks, 0, memory_order_relaxed);
    atomic_store_explicit(&p->next, THR_CLAIM(n_tasks), memory_order_release);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: pairs with the sleepers check in workers */
    if (atomic_load(&p->sleepers) > 0) futex_wake_all(&p->gen);
    run_tasks(p);
    while (atomic_load_explicit(&p->done_tasks, memory_order_acquire) < n_tasks) cpu_relax();
    atomic_store_explicit(&p->next, 0, memory_order_release);
}
