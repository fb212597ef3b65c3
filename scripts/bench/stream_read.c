/* Memory read bandwidth probe for scripts/bench-cpu.sh: every thread sums its share of a
 * 1 GiB float array (far larger than any cache), best of N passes, printed as GB/s.
 *
 *   gcc -O3 -march=native -ffast-math -fopenmp stream_read.c -o stream_read && ./stream_read [passes]
 *
 * The sum is printed so the compiler cannot drop the reads. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    int passes = argc > 1 ? atoi(argv[1]) : 6;
    size_t n = (size_t)1 << 28; /* 2^28 floats = 1 GiB */
    float *a = aligned_alloc(64, n * sizeof(float));
    if (!a) { fprintf(stderr, "stream_read: cannot allocate 1 GiB\n"); return 1; }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = (float)(i & 1023) * 1e-3f;
    double best = 0, sink = 0;
    for (int p = 0; p < passes; p++) {
        double t0 = omp_get_wtime();
        float s = 0;
        /* -ffast-math lets the compiler keep several vector accumulators per thread */
#pragma omp parallel for schedule(static) reduction(+ : s)
        for (size_t i = 0; i < n; i++) s += a[i];
        double gbs = n * sizeof(float) / (omp_get_wtime() - t0) / 1e9;
        if (gbs > best) best = gbs;
        sink += s;
    }
    printf("{\"read_gb_s\": %.2f, \"threads\": %d, \"passes\": %d, \"sink\": %.1f}\n", best,
           omp_get_max_threads(), passes, sink);
    free(a);
    return 0;
}
