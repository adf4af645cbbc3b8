// panel_rates.c: the AVX2 float32 panel kernel itself (few_rows.c's panels_f32_256, included as it ships), with no
// Python, no model and no forward around it. Two measurements, the second after the first:
//   1. from cache: one 7 MB weight (3072 x 576, the built-in target's gate and up) in panels, read again and again by
//      1 and by 2 threads (each its half of the panels), 1-8 rows of x: GB/s of weights taken in, GFLOP/s;
//   2. from memory: 76 such weights (538 MB, a step's worth, random-free constants) in one parallel region with a
//      barrier after each product, as llama.c runs a forward; 1-8 rows of x under each prefetch setting, the settings
//      interleaved within each repetition: a call of m rows in one-row passes of the same repetition (a one-row call
//      never prefetches), the mean over repetitions after one untimed.
// What it measures is the kernel's arithmetic and its overlap with the memory; scripts/prefetch_costs.py measures
// the same settings in whole forwards of the model. A measuring program, not part of the package. BENCHMARKS.md,
// "The Zen 3, a tenth session".
//
//   gcc -O2 -fopenmp -ffp-contract=off scripts/panel_rates.c -o /tmp/panel_rates -lm
//   /tmp/panel_rates [repetitions, default 20]
#include "../specviz/csrc/few_rows.c"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define K 576
#define N 3072
#define P (N / 16)
#define LAYERS 76
static float x[8 * K], y[8 * N];

// Seconds of `layers` products of m rows, weights w (layers x P panels), threads threads, a barrier after each.
static double products(const float* w, int layers, int m, int threads) {
    double t0 = now();
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num();
        long c0 = P * t / threads, c1 = P * (t + 1) / threads;
        for (int l = 0; l < layers; l++) {
            panels_f32_256(w + (long)l * P * K * 16, x, m, K, N, y, c0, c1);
#pragma omp barrier
        }
    }
    return now() - t0;
}

int main(int argc, char** argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 20;
    if (few_rows_isa() < 1) {
        printf("this CPU has no AVX2 and FMA: the kernel does not run here\n");
        return 1;
    }
    float* w = aligned_alloc(64, (size_t)LAYERS * P * K * 16 * sizeof(float));
    for (size_t i = 0; i < (size_t)LAYERS * P * K * 16; i++) w[i] = (i % 7) * 0.01f;
    for (int i = 0; i < 8 * K; i++) x[i] = (i % 5) * 0.1f;
    double mb = P * K * 64.0 / 1e6;
    printf("1. from cache, one %.1f MB weight, the best of %d passes:\n", mb, 20 * reps);
    for (int threads = 1; threads <= 2; threads++) {
        printf("   %d thread%s, GB/s (GFLOP/s) for 1-8 rows:", threads, threads > 1 ? "s" : "");
        for (int m = 1; m <= 8; m++) {
            double best = 1e9;
            for (int r = 0; r < 20 * reps; r++) {
                double t = products(w, 1, m, threads);
                best = t < best ? t : best;
            }
            printf(" %.0f (%.0f)", mb / best / 1e3, 2.0 * m * P * K * 16 / best / 1e9);
        }
        printf("\n");
    }
    int rows[] = {0, 8, 16, 24, 32, 128}, level[] = {0, 0, 0, 0, 0, 1}, S = 6;  // none, L1:8 .. L1:32, L2:128
    double one = 0, cost[6][9] = {{0}};
    for (int r = 0; r <= reps; r++)
        for (int s = 0; s < S; s++) {
            few_rows_panel_ahead(rows[s], level[s]);  // the setting, as native.panel_prefetch sets it
            double t1 = products(w, LAYERS, 1, 2);
            for (int m = 2; m <= 8; m++) {
                double t = products(w, LAYERS, m, 2);
                if (r) cost[s][m] += t / t1 / reps;
            }
            if (r) one += t1 / reps / S;
        }
    printf("2. from memory, %d products (%.0f MB), 2 threads: a one-row call %.2f ms (%.1f GB/s);\n", LAYERS,
           LAYERS * mb, one * 1e3, LAYERS * mb / one / 1e3);
    printf("   2-8 rows in one-row calls, by prefetch setting:\n");
    for (int s = 0; s < S; s++) {
        if (rows[s]) printf("   L%d:%-4d:", level[s] + 1, rows[s]);
        else printf("   none   :");
        for (int m = 2; m <= 8; m++) printf(" %.3f", cost[s][m]);
        printf("\n");
    }
    free(w);
    return 0;
}
