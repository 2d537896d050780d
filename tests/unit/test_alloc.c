/* test_alloc: the engine allocates nothing per request or per step on its loop thread
 * (STYLE.md habit 1: all allocation at init).
 *
 * malloc, calloc, realloc, free and the aligned allocators are counted on the thread
 * that drives the engine (the CPU backend's compute threads are not the loop thread
 * and are left out): in glibc builds by defining them here, forwarding to glibc's
 * __libc_* entry points; under ASan, which owns malloc, through its allocation hooks
 * (elsewhere, e.g. musl, nothing is counted and the test says so).
 * The real model (MODEL) runs: warm-up requests until they decode, then, counted, more
 * requests of every kind the engine handles (n > 1 samples forking the prompt,
 * temperature with top_k / top_p / min_p, repetition, presence and frequency
 * penalties, logprobs, stop strings, a cancel, a pause) submitted while the first ones
 * run, stepped to completion. Every count must be 0. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model_fixture.h"
#include "core/backend.h"
#include "core/model.h"
#include "core/tokenizer.h"
#include "mm/kv.h"
#include "sched/engine.h"

#if defined(__GLIBC__)
#include <execinfo.h>
#define HAVE_BACKTRACE 1
#else
#define HAVE_BACKTRACE 0
#endif

/* ------------------------------------------------------------------ counting */

#define N_WHERE 8

static volatile int counting;
static pthread_t counted;     /* the loop thread */
static volatile int n_allocs, n_frees;
static void *where[N_WHERE];  /* the first counted allocations' callers */

static inline void note(int is_free, void *caller) {
    if (!counting || !pthread_equal(pthread_self(), counted)) return;
    if (is_free) {
        n_frees++;
        return;
    }
    if (n_allocs < N_WHERE) where[n_allocs] = caller;
    n_allocs++;
}

#if defined(__SANITIZE_ADDRESS__)
/* From <sanitizer/allocator_interface.h>, which gcc does not install; libasan has it. */
int __sanitizer_install_malloc_and_free_hooks(void (*on_malloc)(const volatile void *, size_t),
                                              void (*on_free)(const volatile void *));

static void on_malloc(const volatile void *p, size_t n) { (void)p, (void)n, note(0, NULL); }
static void on_free(const volatile void *p) {
    if (p) note(1, NULL);
}
static void hooks_install(void) {
    CHECK(__sanitizer_install_malloc_and_free_hooks(on_malloc, on_free) != 0, "ASan hooks installed");
}
#define HOW "ASan allocation hooks"
#define COUNTS 1
#elif defined(__GLIBC__)
/* glibc's own allocator under the standard names: every malloc of the program and of
 * libc itself comes here first. */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

void *malloc(size_t n) {
    note(0, __builtin_return_address(0));
    return __libc_malloc(n);
}
void *calloc(size_t k, size_t n) {
    note(0, __builtin_return_address(0));
    return __libc_calloc(k, n);
}
void *realloc(void *p, size_t n) {
    note(0, __builtin_return_address(0));
    return __libc_realloc(p, n);
}
void free(void *p) {
    if (p) note(1, NULL);
    __libc_free(p);
}
void *aligned_alloc(size_t a, size_t n) {
    note(0, __builtin_return_address(0));
    return __libc_memalign(a, n);
}
void *memalign(size_t a, size_t n) {
    note(0, __builtin_return_address(0));
    return __libc_memalign(a, n);
}
int posix_memalign(void **out, size_t a, size_t n) {
    note(0, __builtin_return_address(0));
    if (a < sizeof(void *) || (a & (a - 1))) return EINVAL;
    void *p = __libc_memalign(a, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}
static void hooks_install(void) {}
#define HOW "malloc, calloc, realloc, free, aligned_alloc, memalign, posix_memalign defined here"
#define COUNTS 1
#else
static void hooks_install(void) {}
#define HOW "nothing: neither glibc nor ASan, so the counts below are not checked"
#define COUNTS 0
#endif

static void count_start(void) {
    n_allocs = n_frees = 0;
    memset(where, 0, sizeof where);
    counted = pthread_self();
    counting = 1;
}

static void count_stop(const char *what) {
    counting = 0;
    if (!COUNTS) return;
    CHECK(n_allocs == 0 && n_frees == 0, "%s: %d allocations and %d frees on the loop thread", what,
          n_allocs, n_frees);
#if HAVE_BACKTRACE
    int k = n_allocs < N_WHERE ? n_allocs : N_WHERE;
    if (k > 0 && where[0]) {
        fprintf(stderr, "%s: the first allocations' callers (addr2line -e the test):\n", what);
        backtrace_symbols_fd(where, k, 2);
    }
#endif
}

/* ------------------------------------------------------------------ the engine */

#define MAX_REQ 16

typedef struct {
    int64_t id;
    int tokens, finished;
} result;

static result res[MAX_REQ];

/* The callbacks allocate nothing either: they count. */
static void on_token(void *ud, int64_t req, int sample, int32_t tok, const char *text, int len,
                     float lp) {
    (void)req, (void)sample, (void)tok, (void)text, (void)len, (void)lp;
    ((result *)ud)->tokens++;
}

static void on_finish(void *ud, int64_t req, int sample, int reason, const eng_usage *u,
                      const char *msg) {
    (void)req, (void)sample, (void)reason, (void)u, (void)msg;
    ((result *)ud)->finished++;
}

static int32_t prompt_toks[MAX_REQ][96];
static const char *const stops[] = {"\n\n", "zzz"};

/* Request i, of a kind chosen by i. */
static int64_t submit(engine *e, int i) {
    int n_prompt = 8 + (i * 29) % 80;
    for (int t = 0; t < n_prompt; t++) prompt_toks[i][t] = (int32_t)(200 + ((uint32_t)i * 2654435761u + (uint32_t)t * 40503u) % 15000);
    eng_params p = {0};
    p.prompt = prompt_toks[i], p.n_prompt = n_prompt, p.ud = &res[i];
    p.n = i % 3 == 1 ? 3 : 1;
    sampler_params_default(&p.sp);
    p.sp.seed = 100 + (uint64_t)i;
    p.sp.max_tokens = 12 + i % 7;
    switch (i % 4) {
    case 0: p.sp.temperature = 0; break;
    case 1: p.sp.temperature = 0.8f, p.sp.top_p = 0.9f, p.sp.repeat_penalty = 1.2f, p.sp.repeat_last_n = 64; break;
    case 2: p.sp.temperature = 1.1f, p.sp.top_k = 40, p.sp.presence_penalty = 0.5f, p.sp.frequency_penalty = 0.3f; break;
    case 3: p.sp.temperature = 0.7f, p.sp.min_p = 0.05f, p.sp.repeat_penalty = 1.1f, p.sp.repeat_last_n = 1 << 20; break;
    }
    p.logprobs = i % 2;
    p.stops = stops, p.n_stops = i % 2 ? 2 : 0;
    p.client = 1 + i % 3;
    char err[256];
    int64_t id = eng_submit(e, &p, err, sizeof err);
    CHECK(id > 0, "submit %d: %s", i, err);
    res[i].id = id;
    return id;
}

static int step(engine *e) {
    int r = eng_step_begin(e);
    if (r <= 0) return r;
    return eng_step_end(e) < 0 ? -1 : 1;
}

int main(void) {
    model m;
    tok_t tok;
    if (fixture_load(&m, &tok, "test_alloc") < 0) return 1;
    hooks_install();
    printf("test_alloc: counting through %s\n", HOW);
#if HAVE_BACKTRACE
    void *warm[1];
    backtrace(warm, 1); /* its first call loads libgcc (allocates): not while counting */
#endif

    enum { SEQS = 32, SEQ_LEN = 256, BATCH = 8, TOKENS = 64 };
    char err[256];
    kv_config kc = {0};
    model_kv_shape(&m, &kc);
    kc.block_size = 16;
    kc.n_blocks = 20; /* fewer than the running requests want at once: preemption too */
    kc.max_seqs = SEQS;
    kc.max_blocks_per_seq = SEQ_LEN / 16;
    kc.prefix_cache = 1;
    kv_pool kv;
    CHECK(kv_pool_init(&kv, &kc, NULL) == 0, "kv pool");
    backend_cpu_config bc = {2, TOKENS, BATCH, SEQ_LEN, 0};
    backend *be = backend_cpu_new(&m, &kv, &bc, err, sizeof err);
    CHECK(be != NULL, "backend: %s", err);
    eng_config ec = {.max_batch_size = BATCH, .max_batched_tokens = TOKENS, .max_seq_len = SEQ_LEN,
                     .max_seqs = SEQS, .max_queued_requests = MAX_REQ, .prefix_caching = 1};
    eng_callbacks cb = {on_token, on_finish};
    engine *e = be ? eng_new(&ec, &m, &tok, &kv, be, &cb, err, sizeof err) : NULL;
    CHECK(e != NULL, "eng_new: %s", err);
    if (!e) return check_done("test_alloc");

    /* Warm-up: one request of each kind, stepped until all decode; then to the end, so
     * every path (fork, stop strings, finish, prefix-cache commit) ran once uncounted. */
    for (int i = 0; i < 4; i++) submit(e, i);
    CHECK(eng_run_sync(e) == 0, "warm-up run");
    for (int i = 4; i < 6; i++) submit(e, i);
    for (int k = 0; k < 6; k++) CHECK(step(e) == 1, "warm-up step %d", k);

    /* Counted: more requests while those run, a cancel and a pause among them. */
    count_start();
    for (int i = 6; i < MAX_REQ; i++) submit(e, i);
    int steps = 0, r;
    while ((r = step(e)) == 1) {
        steps++;
        if (steps == 3) eng_cancel(e, res[7].id);
        if (steps == 4) eng_pause(e, res[8].id, 1);
        if (steps == 12) eng_pause(e, res[8].id, 0);
    }
    count_stop("submit and steps to the end");
    CHECK(r == 0 && !eng_pending(e), "the run ended (%d) with nothing pending", r);

    eng_stats st;
    eng_get_stats(e, &st);
    int fin = 0, toks = 0;
    for (int i = 0; i < MAX_REQ; i++) fin += res[i].finished, toks += res[i].tokens;
    int want = 0;
    for (int i = 0; i < MAX_REQ; i++) want += i % 3 == 1 ? 3 : 1;
    CHECK(fin == want, "%d of %d samples finished", fin, want);
    printf("test_alloc: %d counted steps, %d samples finished, %d tokens, %lld preemptions; "
           "loop-thread allocations: %d\n", steps, fin, toks, (long long)st.preemptions, n_allocs);

    eng_free(e);
    be->ops->destroy(be);
    kv_pool_free(&kv);
    model_free(&m);
    tok_free(&tok);
    return check_done("test_alloc");
}
