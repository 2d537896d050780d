/* membw: the machine's memory read bandwidth, the ceiling for single-stream decode.
 *
 *   membw [--threads N] [--mib M] [--repeat R]
 *
 * N threads (default 2) each sum their own slice of one M MiB buffer (default 1024, far
 * past any cache; first-touched by the thread that reads it; no two words alike) with
 * 64-bit adds the compiler vectorizes; R timed passes (default 8) after one untimed, the
 * best kept. The buffer asks for huge pages, as kilnd's packed weights do (core/model.c):
 * on 4 KB pages a VM's nested page walks cost this read ~7% (Zen 4 VM, 2026-12-07), and
 * the ceiling would sit below what decode can reach.
 * Prints: membw: threads=N buffer_mib=M repeat=R read_gb_s=X   (GB = 1e9 bytes)
 * Built by tests/bench/bench_shapes.sh: gcc -O3 -march=native -pthread. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef struct {
    const uint64_t *p; /* this thread's slice */
    size_t n;          /* words in it */
    uint64_t sum;      /* kept, so the reads cannot be dropped */
    double t0, t1;     /* this pass's read, timed by the reader itself */
} slice;

static pthread_barrier_t go, done;
static int passes;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *worker(void *arg) {
    slice *s = arg;
    /* first touch, so the pages are local to their reader; distinct words on every page,
     * or page deduplication (KSM and the like) can fold the buffer into a few cached pages */
    uint64_t *w = (uint64_t *)s->p;
    for (size_t i = 0; i < s->n; i++) w[i] = ((uintptr_t)(w + i)) * 0x9E3779B97F4A7C15ull;
    for (int r = 0; r < passes; r++) {
        pthread_barrier_wait(&go);
        s->t0 = now_s();
        uint64_t a = 0;
        for (size_t i = 0; i < s->n; i++) a += s->p[i];
        s->sum += a;
        s->t1 = now_s();
        pthread_barrier_wait(&done);
    }
    return NULL;
}

static int arg_int(int argc, char **argv, int i, int *out) {
    if (i + 1 >= argc) return -1;
    char *end;
    long v = strtol(argv[i + 1], &end, 10);
    if (*end || v < 1 || v > 1 << 20) return -1;
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv) {
    int threads = 2, mib = 1024, repeat = 8;
    for (int i = 1; i < argc; i += 2) {
        int *dst = !strcmp(argv[i], "--threads") ? &threads : !strcmp(argv[i], "--mib") ? &mib
                 : !strcmp(argv[i], "--repeat")  ? &repeat  : NULL;
        if (!dst || arg_int(argc, argv, i, dst) < 0) {
            fprintf(stderr, "usage: membw [--threads N] [--mib M] [--repeat R]\n");
            return 2;
        }
    }
    if (threads > 1024) threads = 1024;
    size_t bytes = (size_t)mib << 20, words = bytes / sizeof(uint64_t);
    size_t huge = 2u << 20;
    uint64_t *buf = aligned_alloc(huge, (bytes + huge - 1) / huge * huge);
    if (buf) madvise(buf, bytes, MADV_HUGEPAGE); /* advice; THP may be off */
    slice *sl = calloc((size_t)threads, sizeof *sl);
    pthread_t *tid = calloc((size_t)threads, sizeof *tid);
    if (!buf || !sl || !tid) {
        fprintf(stderr, "membw: out of memory for %d MiB\n", mib);
        return 1;
    }
    passes = repeat + 1;
    pthread_barrier_init(&go, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&done, NULL, (unsigned)threads + 1);
    size_t per = (words / (size_t)threads) & ~(size_t)7;
    for (int t = 0; t < threads; t++) {
        sl[t].p = buf + (size_t)t * per;
        sl[t].n = t == threads - 1 ? words - (size_t)t * per : per;
        if (pthread_create(&tid[t], NULL, worker, &sl[t]) != 0) {
            fprintf(stderr, "membw: pthread_create failed\n");
            return 1;
        }
    }
    /* A pass runs from the first reader's start to the last one's end. Timed here
     * instead, it came out far too short whenever this thread, one more than the
     * cores, got its turn only after the readers had done (6,000 "GB/s" over 100 MiB
     * on 2 vCPUs). */
    double best = 0;
    for (int r = 0; r < passes; r++) {
        pthread_barrier_wait(&go);
        pthread_barrier_wait(&done);
        double t0 = sl[0].t0, t1 = sl[0].t1;
        for (int t = 1; t < threads; t++) {
            if (sl[t].t0 < t0) t0 = sl[t].t0;
            if (sl[t].t1 > t1) t1 = sl[t].t1;
        }
        double gbs = (double)bytes / (t1 - t0) / 1e9;
        if (r > 0 && gbs > best) best = gbs; /* pass 0 is the warm-up */
    }
    uint64_t sum = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        sum += sl[t].sum;
    }
    printf("membw: threads=%d buffer_mib=%d repeat=%d read_gb_s=%.1f\n", threads, mib, repeat, best);
    fprintf(stderr, "membw: checksum %llu\n", (unsigned long long)sum);
    free(tid), free(sl), free(buf);
    return 0;
}
