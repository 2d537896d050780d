/* alloc_count: an LD_PRELOAD shim that counts the heap allocations kilnd's loop thread
 * (its main thread: serve runs the loop there) makes through libc, for
 * tests/net/alloc_test.py.
 *
 * malloc, calloc, realloc, the aligned allocators and free are replaced by counting
 * wrappers around glibc's own (__libc_*; glibc routes its internal callers, strdup and
 * stdio included, through these too). Only the main thread's calls count; other threads
 * (the CPU backend's workers, certificate workers) do as they please. A helper thread
 * answers on the unix socket $KILN_ALLOC_SOCK, one command per connection:
 *   "count"    -> "allocs=N frees=N\n" (the main thread's, since start)
 *   "trace 1"  -> from now on every main-thread allocation prints its backtrace to
 *                 stderr (to find one the count caught); "trace 0" stops.
 * glibc only (the gnu build): ASan's runtime insists on being first, so the sanitizer
 * builds are not run under it. */
#define _GNU_SOURCE
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

static atomic_ulong n_allocs, n_frees;
static atomic_int tracing;
/* 0 not known yet, 1 the main thread, 2 another */
static __thread int tl_kind __attribute__((tls_model("initial-exec")));
static __thread int tl_busy __attribute__((tls_model("initial-exec"))); /* in a backtrace */

static int on_main(void) {
    if (!tl_kind) tl_kind = syscall(SYS_gettid) == getpid() ? 1 : 2;
    return tl_kind == 1;
}

static void counted(void) {
    if (!on_main() || tl_busy) return;
    atomic_fetch_add(&n_allocs, 1);
    if (atomic_load(&tracing)) {
        tl_busy = 1;
        void *pcs[24];
        int n = backtrace(pcs, 24);
        static const char hdr[] = "alloc_count: loop-thread allocation:\n";
        (void)!write(2, hdr, sizeof hdr - 1);
        backtrace_symbols_fd(pcs, n, 2);
        tl_busy = 0;
    }
}

void *malloc(size_t n) { counted(); return __libc_malloc(n); }
void *calloc(size_t a, size_t b) { counted(); return __libc_calloc(a, b); }
void *realloc(void *p, size_t n) {
    if (n) counted();
    else if (p && on_main()) atomic_fetch_add(&n_frees, 1);
    return __libc_realloc(p, n);
}
void free(void *p) {
    if (p && on_main() && !tl_busy) atomic_fetch_add(&n_frees, 1);
    __libc_free(p);
}
void *memalign(size_t al, size_t n) { counted(); return __libc_memalign(al, n); }
void *aligned_alloc(size_t al, size_t n) { counted(); return __libc_memalign(al, n); }
void *valloc(size_t n) { counted(); return __libc_memalign((size_t)sysconf(_SC_PAGESIZE), n); }
int posix_memalign(void **out, size_t al, size_t n) {
    if (al < sizeof(void *) || (al & (al - 1))) return EINVAL;
    counted();
    void *p = __libc_memalign(al, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}

static void *serve(void *arg) {
    int fd = (int)(intptr_t)arg;
    for (;;) {
        int c = accept(fd, NULL, NULL);
        if (c < 0) continue;
        char cmd[64] = {0}, out[96];
        ssize_t n = read(c, cmd, sizeof cmd - 1);
        if (n > 0 && !strncmp(cmd, "trace", 5)) {
            atomic_store(&tracing, strchr(cmd, '1') != NULL);
            snprintf(out, sizeof out, "ok\n");
        } else {
            snprintf(out, sizeof out, "allocs=%lu frees=%lu\n", atomic_load(&n_allocs), atomic_load(&n_frees));
        }
        (void)!write(c, out, strlen(out));
        close(c);
    }
    return NULL;
}

__attribute__((constructor)) static void start(void) {
    void *warm[2];
    tl_busy = 1;
    backtrace(warm, 2); /* loads the unwinder now, not inside a traced allocation */
    tl_busy = 0;
    const char *path = getenv("KILN_ALLOC_SOCK");
    if (!path || !*path) return;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    unlink(path);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 4) < 0) {
        fprintf(stderr, "alloc_count: %s: %s\n", path, strerror(errno));
        return;
    }
    /* the helper takes no signals: kilnd reads its own through a signalfd, which works
     * only while every thread blocks them */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &at, serve, (void *)(intptr_t)fd) != 0) fprintf(stderr, "alloc_count: no thread\n");
    pthread_attr_destroy(&at);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}
