/* act_grad.h - a GLU activation and its derivative, for the backward ops of every backend (the cpu's C
 * and the cuda kernels compile the same arithmetic). */
#ifndef LMX_BACKEND_ACT_GRAD_H
#define LMX_BACKEND_ACT_GRAD_H

#include <math.h>

#ifdef __CUDACC__
#define LMX_HOST_DEVICE __host__ __device__
#else
#define LMX_HOST_DEVICE
#endif

/* *a = act(x), *da = act'(x) for SiLU (silu != 0) or GELU with the tanh approximation */
static inline LMX_HOST_DEVICE void lmx_act_grad(float x, int silu, float *a, float *da) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    if (silu) {
        const float sg = 1.0f / (1.0f + expf(-x));
        *a = x * sg;
        *da = sg * (1.0f + x * (1.0f - sg));
    } else {
        const float th = tanhf(k * (x + 0.044715f * x * x * x));
        *a = 0.5f * x * (1.0f + th);
        *da = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * k * (1.0f + 3.0f * 0.044715f * x * x);
    }
}

#endif
