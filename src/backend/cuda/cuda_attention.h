/* cuda_attention.h - what the decode attention (cuda_attention.cu) and the tensor-core prefill
 * attention (cuda_flash.cu) share: the per-launch description of a batch of sequences. */
#ifndef LMX_BACKEND_CUDA_ATTENTION_H
#define LMX_BACKEND_CUDA_ATTENTION_H

#include "cuda_internal.h"

#define ATT_SEQ_MAX 48         /* sequences per launch (parameters stay under 4 KB) */

typedef struct att_seq {
    const __nv_bfloat16 *kc, *vc; /* cache [cap, Hk*D] */
    int n_past, n_new, cap, rotating, window;
} att_seq;

typedef struct att_arg {
    int B, T, H, Hk, D, G, hchunks, splits;
    float scale, softcap;
    const int *dyn;          /* non-NULL: n_past / n_new from this device array (decode graphs) */
    att_seq s[ATT_SEQ_MAX];
} att_arg;

/* Prefill attention on tensor cores for the a.B sequences of a (T rows each): q, out [B*T, H*D]
 * f32; k, v [B*T, Hk*D] f32 new rows (narrowed to bf16 in scratch first).  LMX_ERR_UNSUPPORTED
 * (nothing launched) for head dims other than 32, 64, 128 and 256. */
lmx_status cuda_flash_attention(cuda_backend *cb, const att_arg &a, const float *q, const float *k, const float *v,
                                float *out);

#endif
