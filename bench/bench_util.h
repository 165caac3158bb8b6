/* bench_util.h - what the bench programs share: the monotonic clock they time with, and xorshift64
 * (Marsaglia's shifts 13, 7, 17) for their random inputs, its state the caller's. */
#ifndef LMX_BENCH_UTIL_H
#define LMX_BENCH_UTIL_H

#include <stdint.h>
#include <time.h>

/* seconds on the monotonic clock */
static inline double bench_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* the next value of xorshift64 from the state *s (nonzero), which it advances */
static inline uint64_t bench_xorshift64(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

/* a uniform value in [-0.5, 0.5) from the top 24 bits of the next value */
static inline float bench_uniform(uint64_t *s) { return (float)(bench_xorshift64(s) >> 40) / 16777216.0f - 0.5f; }

#endif
