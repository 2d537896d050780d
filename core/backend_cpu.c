/* backend_cpu: runs model_forward on a leader thread with a thread pool, so submit
 * returns at once and completion is signalled through an eventfd. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "core/backend.h"
#include "core/threads.h"

typedef struct {
    backend be;
    const model *m;
    kv_pool *kv;
    model_state *state;
    thr_pool *pool;
    pthread_t leader;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const model_batch *pending; /* set by submit, taken by the leader */
    int running;                /* a step was submitted and not yet reaped by poll/wait */
    int finished;               /* the leader finished the step */
    int result;                 /* 1 ok, negative failure */
    int stop;
    int efd;
    const float *logits;
    double step_ms;             /* the last step's compute time */
    char step_err[256];
} cpu_backend;

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static void *leader_main(void *arg) {
    cpu_backend *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->pending && !c->stop) pthread_cond_wait(&c->cv, &c->mu);
        if (c->stop) break;
        const model_batch *b = c->pending;
        c->pending = NULL;
        pthread_mutex_unlock(&c->mu);
        double t0 = mono_ms();
        const float *lg = model_forward(c->m, c->state, c->kv, c->pool, b, c->step_err,
                                        sizeof c->step_err);
        double t1 = mono_ms();
        pthread_mutex_lock(&c->mu);
        c->step_ms = t1 - t0;
        c->logits = lg;
        c->result = lg ? 1 : -EINVAL;
        c->finished = 1;
        pthread_cond_broadcast(&c->cv);
        uint64_t one = 1;
        if (write(c->efd, &one, sizeof one) < 0) { /* the waiter also uses the condvar */ }
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static int cpu_submit(backend *be, const model_batch *b) {
    cpu_backend *c = (cpu_backend *)be;
    pthread_mutex_lock(&c->mu);
    if (c->running) {
        pthread_mutex_unlock(&c->mu);
        snprintf(be->err, sizeof be->err, "cpu backend: a step is already running");
        return -EBUSY;
    }
    c->running = 1;
    c->finished = 0;
    c->pending = b;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

/* Called with mu held once the step finished: reap it. */
static int reap(cpu_backend *c) {
    uint64_t n;
    if (read(c->efd, &n, sizeof n) < 0) { /* nonblocking: nothing pending is fine */ }
    c->running = 0;
    if (c->result < 0) snprintf(c->be.err, sizeof c->be.err, "%s", c->step_err);
    return c->result;
}

static int cpu_poll(backend *be) {
    cpu_backend *c = (cpu_backend *)be;
    pthread_mutex_lock(&c->mu);
    int r = !c->running ? 1 : c->finished ? reap(c) : 0;
    pthread_mutex_unlock(&c->mu);
    return r;
}

static int cpu_wait(backend *be) {
    cpu_backend *c = (cpu_backend *)be;
    pthread_mutex_lock(&c->mu);
    if (!c->running) {
        pthread_mutex_unlock(&c->mu);
        return 1;
    }
    while (!c->finished) pthread_cond_wait(&c->cv, &c->mu);
    int r = reap(c);
    pthread_mutex_unlock(&c->mu);
    return r;
}

static int cpu_event_fd(backend *be) { return ((cpu_backend *)be)->efd; }
static const float *cpu_logits(backend *be) { return ((cpu_backend *)be)->logits; }
/* Read after poll or wait reaped the step (under the mutex): the leader writes it
 * before the next submit only. */
static double cpu_step_ms(backend *be) { return ((cpu_backend *)be)->step_ms; }

static void cpu_destroy(backend *be) {
    cpu_backend *c = (cpu_backend *)be;
    if (!c) return;
    cpu_wait(be);
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->leader, NULL);
    thr_pool_free(c->pool);
    model_state_free(c->state);
    close(c->efd);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

static const backend_ops cpu_ops = {"cpu", cpu_submit, cpu_poll, cpu_wait, cpu_event_fd,
                                    cpu_logits, cpu_destroy, cpu_step_ms,
                                    NULL /* mem_pressure: its memory is all taken at start */};

backend *backend_cpu_new(const model *m, kv_pool *kv, const backend_cpu_config *cfg, char *err,
                         size_t errlen) {
    cpu_backend *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "cpu backend: out of memory");
        return NULL;
    }
    c->be.ops = &cpu_ops;
    c->m = m, c->kv = kv, c->efd = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->state = model_state_new(m, cfg->max_batch_tokens, cfg->max_logits, cfg->max_ctx);
    if (c->state && model_state_set_exact(c->state, m, cfg->exact) < 0) {
        model_state_free(c->state);
        c->state = NULL;
    }
    c->pool = thr_pool_new(cfg->threads);
    c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    /* The leader runs the forward pass: give it the same roomy stack as the pool's. */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 4u << 20);
    int started = c->state && c->pool && c->efd >= 0 &&
                  pthread_create(&c->leader, &attr, leader_main, c) == 0;
    pthread_attr_destroy(&attr);
    if (!started) {
        snprintf(err, errlen, "cpu backend: cannot allocate scratch for %d tokens or start threads",
                 cfg->max_batch_tokens);
        thr_pool_free(c->pool);
        model_state_free(c->state);
        if (c->efd >= 0) close(c->efd);
        free(c);
        return NULL;
    }
    return &c->be;
}
