/* bench_sampler.c - the host sampler's time a token over a large vocabulary (lmx_sampler_sample with the
 * default settings: temperature, top-k 40, top-p 0.95, min-p 0.05), the path of the cpu backend and of a
 * GPU step whose settings need every logit (penalties).
 *
 * usage: bench_sampler [V] [REPS]
 *
 * Logits are spread evenly over 5 nats (the flat distribution of random weights, or of a real model at a
 * high temperature: every token within the gathering threshold), then at temperatures 0.8 and 1.5.  Prints
 * milliseconds a sample and the sum of the ids drawn (the same draws give the same sum). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "runtime/sampler.h"
#include "bench_util.h"

int main(int argc, char **argv) {
    const int V = argc > 1 ? atoi(argv[1]) : 151936, reps = argc > 2 ? atoi(argv[2]) : 20;
    float *logits = malloc((size_t)V * sizeof *logits), *work = malloc((size_t)V * sizeof *work);
    lmx_sampler s;
    if (V < 2 || reps < 1 || !logits || !work || lmx_sampler_init(&s, V)) {
        fprintf(stderr, "usage: bench_sampler [V >= 2] [REPS >= 1]\n");
        return 2;
    }
    unsigned x = 1;
    for (int i = 0; i < V; i++) {
        x = x * 1664525u + 1013904223u;
        logits[i] = (float)((x >> 8) % 10000) / 2000.0f;
    }
    lmx_sampler_params p = lmx_sampler_default_params();
    lmx_rng rng;
    lmx_rng_seed(&rng, 1);
    const float temps[] = {0.8f, 1.5f};
    for (int ti = 0; ti < 2; ti++) {
        p.temperature = temps[ti];
        long sum = 0;
        double t = 0;
        for (int r = 0; r < reps; r++) {
            for (int i = 0; i < V; i++) work[i] = logits[i];
            const double t0 = bench_now_s();
            sum += lmx_sampler_sample(&s, &p, &rng, work, NULL, 0);
            t += bench_now_s() - t0;
        }
        printf("V %d, temperature %.1f: %.3f ms a sample (ids drawn sum to %ld)\n", V, temps[ti], 1e3 * t / reps, sum);
    }
    lmx_sampler_free(&s);
    free(logits);
    free(work);
    return 0;
}
