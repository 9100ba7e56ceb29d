/* Streaming-read memory bandwidth, for the decode roofline (decode reads every weight once per token).
 *
 *   cc -O2 -march=native -pthread -o /tmp/kbench/membw bench/membw.c
 *   /tmp/kbench/membw [MiB per thread, default 512] [repetitions, default 7]
 *
 * For 1 and 2 threads: each thread owns a buffer of MiB (first touched by that thread, far larger
 * than the caches), and sums it as 64-bit integers with four independent accumulators (the loads
 * are what is measured; the sum is printed so the compiler cannot drop it). Threads start together
 * on a barrier; a repetition's time is from the barrier to the last thread's end. Reported: the
 * median and best GB/s (10^9 bytes/s) over the repetitions, and /proc/loadavg. One JSON line per
 * thread count. No stores in the timed loop, no non-temporal tricks: this is what a weight-streaming
 * kernel can expect to read.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    uint64_t *buf;
    size_t n;
    uint64_t sum;
    pthread_barrier_t *start;
    pthread_barrier_t *done;
    int reps;
} worker_t;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t sum_read(const uint64_t *p, size_t n) {
    uint64_t a = 0, b = 0, c = 0, d = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        a += p[i] + p[i + 4];
        b += p[i + 1] + p[i + 5];
        c += p[i + 2] + p[i + 6];
        d += p[i + 3] + p[i + 7];
    }
    for (; i < n; i++) a += p[i];
    return a + b + c + d;
}

static void *worker(void *arg) {
    worker_t *w = arg;
    w->buf = aligned_alloc(4096, w->n * sizeof(uint64_t));
    if (!w->buf) { perror("aligned_alloc"); exit(1); }
    for (size_t i = 0; i < w->n; i++) w->buf[i] = i * 2654435761u;  /* first touch: local pages */
    w->sum = 0;
    for (int r = 0; r < w->reps + 1; r++) {      /* +1: warm-up */
        pthread_barrier_wait(w->start);
        w->sum += sum_read(w->buf, w->n);
        pthread_barrier_wait(w->done);
    }
    free(w->buf);
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 512;
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    for (int nt = 1; nt <= 2; nt++) {
        pthread_barrier_t start, done;
        pthread_barrier_init(&start, NULL, nt + 1);
        pthread_barrier_init(&done, NULL, nt + 1);
        worker_t w[2];
        pthread_t th[2];
        for (int t = 0; t < nt; t++) {
            w[t] = (worker_t){.n = mib * 1024 * 1024 / 8, .start = &start, .done = &done, .reps = reps};
            pthread_create(&th[t], NULL, worker, &w[t]);
        }
        double gbs[64];
        char load[64] = "";
        FILE *f = fopen("/proc/loadavg", "r");
        if (f) { if (!fgets(load, sizeof load, f)) load[0] = 0; fclose(f); }
        load[strcspn(load, "\n")] = 0;
        for (int r = 0; r < reps + 1; r++) {
            pthread_barrier_wait(&start);
            double t0 = now();
            pthread_barrier_wait(&done);
            double dt = now() - t0;
            if (r > 0 && r - 1 < 64) gbs[r - 1] = (double)nt * mib * 1024 * 1024 / dt / 1e9;
        }
        uint64_t s = 0;
        for (int t = 0; t < nt; t++) { pthread_join(th[t], NULL); s += w[t].sum; }
        int m = reps < 64 ? reps : 64;
        qsort(gbs, m, sizeof gbs[0], cmp);
        printf("{\"threads\": %d, \"mib_per_thread\": %zu, \"reps\": %d, \"gb_per_s_median\": %.2f, "
               "\"gb_per_s_best\": %.2f, \"loadavg\": \"%s\", \"checksum\": %llu}\n",
               nt, mib, m, gbs[m / 2], gbs[m - 1], load, (unsigned long long)s);
        pthread_barrier_destroy(&start);
        pthread_barrier_destroy(&done);
    }
    return 0;
}
