/* act.h - gated activations out[i] = act(gate[i]) * up[i] on the cpu (SiLU and GELU-tanh).
 *
 * The AVX-512 versions (act_avx512.c; call only after a CPU check) evaluate
 *     silu(g)      = g / (1 + exp(-g))
 *     gelu_tanh(g) = g / (1 + exp(-2u)),  u = sqrt(2/pi) * (g + 0.044715 g^3)
 * the second being 0.5 g (1 + tanh(u)) rewritten without the cancellation of 1 + tanh(u) for
 * negative u.  exp is computed to within 2 ulp of float32 (Cody-Waite reduction, degree-7
 * polynomial, scaling by 2^n with vscalefps); tests/test_kernels.c checks it against expf. */
#ifndef LMX_BACKEND_CPU_ACT_H
#define LMX_BACKEND_CPU_ACT_H

#include <stdint.h>

void lmx_glu_silu_avx512(float *out, const float *gate, const float *up, int64_t n);
void lmx_glu_gelu_avx512(float *out, const float *gate, const float *up, int64_t n);
/* dst[i] = exp(src[i]) (exposed for tests). */
void lmx_exp_avx512(float *dst, const float *src, int64_t n);
/* The kernel table's attn_exp (kernels.h). */
double lmx_attn_exp_avx512(float *x, float *e, int n, float scale, float cap);

#endif
