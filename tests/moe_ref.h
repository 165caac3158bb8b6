/* moe_ref.h - a mixture of experts' routing in float64, as backend.h's lmx_moe_args defines it, for the tests'
 * references (test_cuda_ops.c, test_ggml_quant.c): the softmax of z [E] times scale, its K best (the lower index
 * first among equals) into pick [K], their probabilities into p [K]; returns their sum (for norm_topk). */
#ifndef LMX_TESTS_MOE_REF_H
#define LMX_TESTS_MOE_REF_H

#include <math.h>

static double moe_ref_route(const float *z, int E, int K, double scale, int *pick, double *p) {
    double mx = -INFINITY, sum = 0, ksum = 0;
    for (int e = 0; e < E; e++) mx = z[e] > mx ? z[e] : mx;
    for (int e = 0; e < E; e++) sum += exp((z[e] - mx) * scale);
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= pick[j] == e;
            if (!taken && (best < 0 || z[e] > z[best])) best = e;
        }
        pick[k] = best;
        p[k] = exp((z[best] - mx) * scale) / sum;
        ksum += p[k];
    }
    return ksum;
}

#endif
