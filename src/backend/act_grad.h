/* act_grad.h - what the training ops of every backend compute alike (the cpu's C and the cuda kernels
 * compile the same arithmetic): a GLU activation and its derivative, and dropout's keep mask. */
#ifndef LMX_BACKEND_ACT_GRAD_H
#define LMX_BACKEND_ACT_GRAD_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define LMX_HOST_DEVICE __host__ __device__
#else
#define LMX_HOST_DEVICE
#endif

/* 1 / (1 + e^-x).  On the gpu the hardware's approximate exp and reciprocal (__expf, __fdividef: a few
 * ulp, far under the bf16 rounding every training value meets): the IEEE expf and division took half of
 * the instructions of the GLU's tensor-core kernels, which their instructions held more than their bytes
 * (at the 8B's shape on the H200: forward 0.334 -> 0.289 ms a layer, backward 0.364 -> 0.341 ms).  Large
 * |x| give 0 and 1. */
static inline LMX_HOST_DEVICE float lmx_sigmoid(float x) {
#ifdef __CUDA_ARCH__
    return __fdividef(1.0f, 1.0f + __expf(-x));
#else
    return 1.0f / (1.0f + expf(-x));
#endif
}

/* *a = act(x), *da = act'(x) for SiLU (silu != 0) or GELU with the tanh approximation */
static inline LMX_HOST_DEVICE void lmx_act_grad(float x, int silu, float *a, float *da) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    if (silu) {
        const float sg = lmx_sigmoid(x);
        *a = x * sg;
        *da = sg * (1.0f + x * (1.0f - sg));
    } else {
        const float th = tanhf(k * (x + 0.044715f * x * x * x));
        *a = 0.5f * x * (1.0f + th);
        *da = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * k * (1.0f + 3.0f * 0.044715f * x * x);
    }
}

/* Whether dropout with probability p keeps element i under seed: a counter-based hash (splitmix64's
 * finaliser) of (seed, i), its top 32 bits against p * 2^32. */
static inline LMX_HOST_DEVICE int lmx_dropout_keep(uint64_t seed, int64_t i, float p) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 32) >= (double)p * 4294967296.0;
}

#endif
