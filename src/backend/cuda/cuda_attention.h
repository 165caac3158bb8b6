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
    int B, T, H, Hk, D, G, gmax, hchunks, splits; /* gmax: query heads a decode block takes */
    float scale, softcap;
    const int *dyn;          /* non-NULL: n_past / n_new from this device array (decode graphs) */
    __nv_bfloat16 *o16;      /* non-NULL (decode): the output also rounded to bf16 here, [rows, H * D] */
    int fresh;               /* backward (k_wg_dq, k_wg_dkdv): bits 0, 1, 2: dq, dk, dv written, not added to */
    att_seq s[ATT_SEQ_MAX];
} att_arg;

/* Sequence b of a decode launch (k_attention, k_flash_decode), with a graph's per-step n_past / n_new from a.dyn
 * (read before the wait, cuda_pdl_wait). */
static __device__ __forceinline__ att_seq att_seq_at(const att_arg &a, int b) {
    att_seq S = a.s[b];
    if (a.dyn) {
        S.n_past = a.dyn[CUDA_DYN_PAST + b];
        S.n_new = a.dyn[CUDA_DYN_NEW + b];
    }
    return S;
}

/* A decode graph's per-head q / k RMSNorm and RoPE, and its kv append, done by the attention launch
 * (cuda_attention_fused; k_attention or k_flash_decode): one token a sequence, heads of 32 * DPL values all
 * rotated.  A lane holds dims lane + 32 jj; the rotate-half pairs (d, d + D / 2) are its values jj and
 * jj + DPL / 2, the interleaved pairs (2 i, 2 i + 1) are a value of lanes 2 l and 2 l + 1 (a shuffle apart).
 * The arithmetic is k_norm_rope's, value for value, so graphs with and without the fold agree bit for bit. */
#define ATT_PRE_HALF 128
typedef struct att_pre {
    const void *qw, *kw;     /* norm weights [D]; NULL: none */
    lmx_dtype qwt, kwt;
    float qeps, keps, qone, kone, attn_factor;
    int interleaved;
    float inv_freq[ATT_PRE_HALF];
} att_pre;

/* x: a lane's DPL values of one head: RMSNorm with weights w (already + add_one) when norm, then the rotation
 * by the angles of (c, s): rotate-half, c[jj] for pair (jj, jj + DPL / 2), jj < DPL / 2; interleaved, c[jj]
 * for the pair of value jj. */
template <int DPL>
__device__ __forceinline__ void att_pre_head(float (&x)[DPL], bool norm, const float (&w)[DPL], float eps, int D,
                                             bool inter, const float (&c)[DPL], const float (&s)[DPL]) {
    if (norm) {
        float ss = 0.0f;
#pragma unroll
        for (int jj = 0; jj < DPL; jj++) ss += x[jj] * x[jj];
        ss = cuda_warp_sum(ss);
        const float inv = rsqrtf(ss / D + eps);
#pragma unroll
        for (int jj = 0; jj < DPL; jj++) x[jj] = x[jj] * inv * w[jj];
    }
    if (inter) {
        const bool odd = threadIdx.x & 1;
#pragma unroll
        for (int jj = 0; jj < DPL; jj++) {
            const float other = __shfl_xor_sync(0xffffffffu, x[jj], 1);
            float ya, yb;
            cuda_rope_pair(odd ? other : x[jj], odd ? x[jj] : other, c[jj], s[jj], ya, yb);
            x[jj] = odd ? yb : ya;
        }
    } else {
#pragma unroll
        for (int jj = 0; jj < DPL / 2; jj++)
            cuda_rope_pair(x[jj], x[jj + DPL / 2], c[jj], s[jj], x[jj], x[jj + DPL / 2]);
    }
}

/* Before the wait (what no kernel writes): a lane's rotation at position pos, (c, s) as att_pre_head takes them,
 * and the q / k norm weights of its dims lane + 32 jj (already + add_one; 0 without a norm). */
template <int DPL>
__device__ __forceinline__ void att_pre_load(const att_pre &p, int pos, float (&pc)[DPL], float (&ps)[DPL],
                                             float (&wq)[DPL], float (&wk)[DPL]) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int jj = 0; jj < DPL; jj++) { /* the angle of pair i: rotate-half lane + 32 jj, interleaved its half */
        const int i = p.interleaved ? (lane + 32 * jj) / 2 : lane + 32 * jj;
        if (!p.interleaved && jj >= DPL / 2) break;
        const float2 r = cuda_rope_angle(NULL, 0, 0, i, pos, p.inv_freq[i], p.attn_factor);
        pc[jj] = r.x, ps[jj] = r.y;
    }
#pragma unroll
    for (int jj = 0; jj < DPL; jj++) {
        wq[jj] = p.qw ? cuda_elem(p.qw, p.qwt, lane + 32 * jj) + p.qone : 0.0f;
        wk[jj] = p.kw ? cuda_elem(p.kw, p.kwt, lane + 32 * jj) + p.kone : 0.0f;
    }
}

/* Whether the query at position query sees the key at position key: causal, and inside a window of W
 * positions (W <= 0: none). */
static __device__ __forceinline__ bool att_sees(int query, int key, int window) {
    return key <= query && (window <= 0 || key > query - window);
}

/* Attention backward's dS of one score: p (dP - sum_j P_j dP_j), times the soft-cap's slope at the capped
 * score v (cap 0: none) */
static __device__ __forceinline__ float att_ds(float p, float dp, float dsum, float v, float cap) {
    float ds = p * (dp - dsum);
    if (cap > 0) {
        const float c = v / cap;
        ds *= 1.0f - c * c;
    }
    return ds;
}

/* One score's P and dS in place of its scaled score s (before soft-capping) and dP, given its visibility, the
 * row's log-sum-exp L and D = dO . O (the flash backward kernels). */
static __device__ __forceinline__ void att_grad(float &s, float &dp, bool vis, float L, float D, float cap) {
    const float x = cap > 0 ? cap * tanhf(s / cap) : s;
    const float p = vis ? __expf(x - L) : 0.0f;
    s = p;
    dp = vis ? att_ds(p, dp, D, x, cap) : 0.0f;
}

/* The online softmax's step for a thread's two rows (g and g + 8 of its warp's 16; a row's four threads
 * share it, cuda_mma.h's fragments): the tile's scores s [NS][4] (soft-capped, -inf where not visible) become
 * exp(s - the row's new max), the running max m and sum l move on, and the output's accumulators o [ND][4]
 * are rescaled (the prefill kernels). */
template <int NS, int ND>
static __device__ __forceinline__ void att_softmax_step(float (&s)[NS][4], float (&m)[2], float (&l)[2],
                                                        float (&o)[ND][4]) {
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int j = 0; j < NS; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) mx[e / 2] = fmaxf(mx[e / 2], s[j][e]);
    float base[2], corr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        base[r] = mx[r] == -INFINITY ? 0.f : mx[r];
        corr[r] = __expf(m[r] - base[r]);
        m[r] = mx[r];
        l[r] *= corr[r];
    }
#pragma unroll
    for (int j = 0; j < NS; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float pv = __expf(s[j][e] - base[e / 2]);
            s[j][e] = pv;
            l[e / 2] += pv;
        }
#pragma unroll
    for (int j = 0; j < ND; j++) {
        o[j][0] *= corr[0];
        o[j][1] *= corr[0];
        o[j][2] *= corr[1];
        o[j][3] *= corr[1];
    }
}

/* The softmax's end for the two rows: l summed over the row's four threads, inv = 1 / l (0 for a row that saw
 * nothing), and the row's log-sum-exp (0 there), what the forward keeps for the backward. */
static __device__ __forceinline__ void att_softmax_end(float (&l)[2], const float (&m)[2], float (&inv)[2],
                                                       float (&lse)[2]) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        inv[r] = l[r] > 0.f ? 1.f / l[r] : 0.f;
        lse[r] = l[r] > 0.f ? m[r] + logf(l[r]) : 0.f;
    }
}

/* row[8 j + 2 (lane % 4) + {0, 1}] += scale * acc[j][2 r + {0, 1}] for a thread's row r (0: g, 1: g + 8) of
 * accumulators acc [ND][4] (the backward kernels' one += of dq, dk, dv; add 0: = instead, row not read) */
template <int ND>
static __device__ __forceinline__ void att_add_row(float *row, const float (&acc)[ND][4], int r, float scale,
                                                   int add = 1) {
    row += 2 * (threadIdx.x % 4);
#pragma unroll
    for (int j = 0; j < ND; j++) {
        float2 *p = (float2 *)(row + 8 * j), v = add ? *p : make_float2(0.0f, 0.0f);
        *p = make_float2(v.x + scale * acc[j][2 * r], v.y + scale * acc[j][2 * r + 1]);
    }
}

/* Prefill attention on tensor cores for the a.B sequences of a (T rows each): q, out [B*T, H*D]
 * f32; k, v [B*T, Hk*D] f32 new rows (narrowed to bf16 in scratch first); lse NULL, or [a.B, H, T] f32
 * for each row's log-sum-exp (as cuda_flash_stats writes it).  LMX_ERR_UNSUPPORTED (nothing launched)
 * for head dims other than 32, 64, 128 and 256. */
lmx_status cuda_flash_attention(cuda_backend *cb, const att_arg &a, const float *q, const float *k, const float *v,
                                float *out, float *lse);

/* Training (cuda_flash_bwd.cu): for the sequences of a (n_past 0, no cache), each query row's log-sum-exp
 * of its scaled scores and dO . O, lse / dsum [a.B, H, T] f32, from q, dout [B*T, H*D] f32 and k16, v16
 * [B*T, Hk*D] bf16.  LMX_ERR_UNSUPPORTED for head dims other than 32, 64 and 128. */
lmx_status cuda_flash_stats(cuda_backend *cb, const att_arg &a, const float *q, const __nv_bfloat16 *k16,
                            const __nv_bfloat16 *v16, const float *dout, float *lse, float *dsum);

/* Attention backward on the tensor cores for the sequences of args (n_past 0; windows[b] or none):
 * dq, dk, dv += ... (f32, [B*T, H*D] / [B*T, Hk*D]) from dout [B*T, H*D]; fresh bits 0, 1, 2: dq, dk, dv
 * written instead (padding rows: zeros).  q, k, v f32; or, with args->lse and args->out (the forward's,
 * backward.h), f32 or bf16 (keeps read in place).  LMX_ERR_UNSUPPORTED (nothing launched) for head dims
 * other than 32, 64 and 128 and other dtypes. */
lmx_status cuda_flash_attention_bwd(cuda_backend *cb, const lmx_attn_args *args, const int *windows, const float *dout,
                                    float *dq, float *dk, float *dv, unsigned fresh);
/* Rows [r0, r1) of each fresh gradient among dq [rows, HD], dk and dv [rows, KD] (fresh bits 0, 1, 2) cleared: what
 * no kernel writes (padding rows), or all of it before a form that adds */
lmx_status cuda_attn_fresh_clear(cuda_backend *cb, float *dq, float *dk, float *dv, int64_t HD, int64_t KD, int64_t r0,
                                 int64_t r1, unsigned fresh);

/* The flash kernels' dynamic shared memory allowed once, at backend creation (cuda_flash.cu, cuda_flash_bwd.cu),
 * not at every launch: cudaFuncSetAttribute is a host call per layer otherwise.  A kernel the GPU cannot hold
 * then fails at its launch, which cuda_check_launch reports. */
void cuda_flash_init(void);

/* One decode row a sequence (a.T == 1) on the tensor cores (cuda_flash_decode.cu), a.splits splits of each row's keys:
 * q, out [a.B, H*D], k, v [a.B, Hk*D] f32 (this call's rows), part [a.B, H, splits, D + 2] for k_attention_merge
 * when a.splits > 1; pre: the q / k norm, RoPE and kv append folded in (q and k before them), or NULL; in blocks of
 * warps = cuda_flash_decode_warps(D, few rows or not), whose key tile is 16 warps keys (the fewest a split should
 * hold).  Only for a shape cuda_flash_decode_takes (heads of 64, 128 or 256, at most 16 query heads a kv head); the
 * caller checks the launch. */
int cuda_flash_decode_takes(int T, int D, int G);
int cuda_flash_decode_warps(int D, int few);
void cuda_flash_decode(cuda_backend *cb, const att_arg &a, const float *q, const float *k, const float *v, float *out,
                       float *part, const att_pre *pre, int warps);
void cuda_flash_decode_init(void);
void cuda_flash_bwd_init(void);
void cuda_flash_bwd_wg_init(void);
void cuda_flash_wg_init(void);

/* cuda_flash_attention's kernel on warpgroup MMA (cuda_flash_wg.cu) for k16, v16 already narrowed: the same
 * arguments and results.  LMX_ERR_UNSUPPORTED (nothing launched) without cb->wgmma, for head dims other than
 * 64 and 128, or when a sequence has cached positions (n_past > 0). */
lmx_status cuda_flash_wg(cuda_backend *cb, const att_arg &a, const float *q, const __nv_bfloat16 *k16,
                         const __nv_bfloat16 *v16, float *out, float *lse);

/* The backward's two passes (cuda_flash_bwd.cu's k_fa_dq / k_fa_dkdv) on warpgroup MMA
 * (cuda_flash_bwd_wg.cu): q16 (scaled), do16 [B*T, H*D], k16, v16 [B*T, Hk*D] bf16, lse / dsum [a.B, H, T];
 * dq, dk, dv += f32.  LMX_ERR_UNSUPPORTED (nothing launched) without cb->wgmma or for head dims other than 64
 * and 128. */
lmx_status cuda_flash_bwd_wg(cuda_backend *cb, const att_arg &a, const __nv_bfloat16 *q16, const __nv_bfloat16 *k16,
                             const __nv_bfloat16 *v16, const __nv_bfloat16 *do16, const float *lse, const float *dsum,
                             float *dq, float *dk, float *dv);

#endif
