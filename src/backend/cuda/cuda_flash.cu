/* cuda_flash.cu - causal prefill attention on the tensor cores (flash-attention style).
 *
 * Block = 64 query rows of one sequence and one query head, 4 warps of 16 rows each.  Key/value
 * tiles of KT positions stream through shared memory (bf16, two stages filled by cp.async while
 * the previous tile is used); S = Q K^T and O += P V run as bf16 mma.sync m16n8k16 with f32
 * accumulators; the softmax is online, in registers, per row (FlashAttention-2's layout).  Scores
 * never leave registers, so no T x T matrix exists.  Cached positions come from the sequence's bf16
 * KV cache (slot p % cap), this call's new rows from k, v narrowed to bf16 in scratch.  Query row
 * t (position n_past + t, t < n_new) sees positions p <= n_past + t still held by the cache and,
 * with a window W, p > n_past + t - W; soft-capping applies to the scaled scores.  Padding rows
 * (t >= n_new) get zeros.  Operands are bf16 like HF's bf16 attention; accumulation is f32. */
#include <math.h>

#include "cuda_attention.h"
#include "cuda_mma.h"

#define FA_ROWS 64             /* query rows per block */
#define FA_THREADS 128

/* Shared memory: Q [64][D+8], K [2][KT][D+8], V [2][KT][D+8] (bf16; the 8-element pad puts the
 * rows of every 8x8 ldmatrix tile in different banks). */
template <int D, int KT> constexpr size_t flash_smem() { return (size_t)2 * (D + 8) * (FA_ROWS + 4 * KT); }

/* STATS (training, cuda_flash_bwd.cu): instead of O, row t of head h of sequence b writes the row's
 * log-sum-exp of its scaled (soft-capped) scores to lse[(b H + h) T + t] and dO . O to dsum there (0 for
 * padding rows), with dO = dout [B*T, H*D] f32.  Without STATS, lse (when not NULL) gets the same beside O. */
template <int D, int KT, bool STATS>
__global__ void __launch_bounds__(FA_THREADS) k_flash(const float *__restrict__ q, const __nv_bfloat16 *__restrict__ k16,
                                                      const __nv_bfloat16 *__restrict__ v16, float *__restrict__ out,
                                                      const att_arg a, const float *__restrict__ dout,
                                                      float *__restrict__ lse, float *__restrict__ dsum) {
    constexpr int LD = D + 8, NS = KT / 8, ND = D / 8;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)fa_smem;   /* [64][LD] */
    __nv_bfloat16 *Ks = Qs + FA_ROWS * LD;            /* [2][KT][LD] */
    __nv_bfloat16 *Vs = Ks + 2 * KT * LD;             /* [2][KT][LD] */
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
    const int t0 = (gridDim.x - 1 - blockIdx.x) * FA_ROWS; /* the longest tiles first */
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / a.G;
    const att_seq S = a.s[b];
    const int64_t HD = (int64_t)a.H * D, KD = (int64_t)a.Hk * D;
    const int n_past = S.n_past, window = S.window;
    const int held = S.rotating ? (n_past < S.cap ? n_past : S.cap) : n_past;
    const int tmax = t0 + FA_ROWS - 1 < S.n_new - 1 ? t0 + FA_ROWS - 1 : S.n_new - 1;

    /* Q tile, scaled, as bf16 */
    for (int i = tid; i < FA_ROWS * D / 4; i += FA_THREADS) {
        const int r = i / (D / 4), c = (i % (D / 4)) * 4, t = t0 + r;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t < a.T) v = __ldg((const float4 *)(q + ((int64_t)b * a.T + t) * HD + (int64_t)h * D + c));
        uint2 pk = make_uint2(pack_bf16(v.x * a.scale, v.y * a.scale), pack_bf16(v.z * a.scale, v.w * a.scale));
        *(uint2 *)(Qs + r * LD + c) = pk;
    }

    /* positions [pmin, pmax] are visible to some row of the tile */
    int pmin = n_past - held, pmax = n_past + tmax;
    if (window > 0 && n_past + t0 - window + 1 > pmin) pmin = n_past + t0 - window + 1;
    if (pmin < 0) pmin = 0;
    const int ntiles = tmax >= t0 && pmax >= pmin ? (pmax - pmin) / KT + 1 : 0;

    auto load_tile = [&](int p0, int stage) {
        __nv_bfloat16 *ks = Ks + stage * KT * LD, *vs = Vs + stage * KT * LD;
        for (int i = tid; i < KT * D / 8; i += FA_THREADS) {
            const int r = i / (D / 8), c = (i % (D / 8)) * 8;
            const int p = p0 + r < pmax ? p0 + r : pmax; /* rows past pmax are masked; keep them finite */
            const __nv_bfloat16 *kp, *vp;
            if (p < n_past) {
                const int64_t o = (int64_t)(p % S.cap) * KD + (int64_t)kvh * D + c;
                kp = S.kc + o;
                vp = S.vc + o;
            } else {
                const int64_t o = ((int64_t)b * a.T + (p - n_past)) * KD + (int64_t)kvh * D + c;
                kp = k16 + o;
                vp = v16 + o;
            }
            cp_async16(smem_addr(ks + r * LD + c), kp);
            cp_async16(smem_addr(vs + r * LD + c), vp);
        }
        cp_async_commit();
    };

    /* this thread's two rows: g and g + 8 of the warp's 16 */
    const int wrow = t0 + warp * 16;
    const int pos0 = n_past + wrow + g, pos1 = pos0 + 8;
    const bool ok0 = wrow + g < S.n_new, ok1 = wrow + g + 8 < S.n_new;
    const int wlast = n_past + (wrow + 15 < S.n_new - 1 ? wrow + 15 : S.n_new - 1); /* last position of the warp */
    float o[ND][4], m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
    acc_zero(o);

    if (ntiles > 0) load_tile(pmin, 0);
    for (int it = 0; it < ntiles; it++) {
        const int p0 = pmin + it * KT;
        cp_async_turn(it + 1 < ntiles, [&] { load_tile(p0 + KT, (it + 1) & 1); }); /* tile it (and Q) */
        const __nv_bfloat16 *ks = Ks + (it & 1) * KT * LD, *vs = Vs + (it & 1) * KT * LD;
        const bool live = wrow < S.n_new && p0 <= wlast && (window <= 0 || p0 + KT - 1 > n_past + wrow - window);
        if (live) {
            float s[NS][4];
            mma_abt<D, NS>(s, Qs, warp * 16, ks, LD);
            /* mask, soft-cap, online softmax (rows g and g + 8; a row's 4 threads share it) */
#pragma unroll
            for (int j = 0; j < NS; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int row = e / 2, p = p0 + 8 * j + 2 * tq + (e & 1);
                    const int pos = row ? pos1 : pos0;
                    float x = s[j][e];
                    if (a.softcap > 0) x = a.softcap * tanhf(x / a.softcap);
                    const bool vis = (row ? ok1 : ok0) && att_sees(pos, p, window);
                    s[j][e] = vis ? x : -INFINITY;
                }
            att_softmax_step(s, m_r, l_r, o);
            /* O += P V: the score accumulators of two key octets are the A operand of one k-step */
            mma_acc_pt<KT, ND>(o, s, vs, LD);
        }
        __syncthreads(); /* every warp is done with this stage before it is refilled */
    }

    float inv[2], ls[2];
    att_softmax_end(l_r, m_r, inv, ls);
    const int r0 = wrow + g, r1 = r0 + 8;
    if (lse) { /* the row's log-sum-exp: one thread of the row's four */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int t = r ? r1 : r0;
            if (tq == 0 && t < a.T) lse[((int64_t)b * a.H + h) * a.T + t] = ls[r];
        }
    }
    if (STATS) {
        const float *d0 = dout + ((int64_t)b * a.T + r0) * HD + (int64_t)h * D + 2 * tq, *d1 = d0 + 8 * HD;
        float dot[2] = {0.f, 0.f};
#pragma unroll
        for (int j = 0; j < ND; j++) {
            if (r0 < a.T) {
                const float2 d = *(const float2 *)(d0 + 8 * j);
                dot[0] += o[j][0] * d.x + o[j][1] * d.y;
            }
            if (r1 < a.T) {
                const float2 d = *(const float2 *)(d1 + 8 * j);
                dot[1] += o[j][2] * d.x + o[j][3] * d.y;
            }
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            dot[r] += __shfl_xor_sync(0xffffffffu, dot[r], 1);
            dot[r] += __shfl_xor_sync(0xffffffffu, dot[r], 2);
            const int t = r ? r1 : r0;
            if (tq == 0 && t < a.T) {
                const bool ok = (r ? ok1 : ok0) && l_r[r] > 0.f;
                dsum[((int64_t)b * a.H + h) * a.T + t] = ok ? dot[r] * inv[r] : 0.f;
            }
        }
        return;
    }
    float *o0 = out + ((int64_t)b * a.T + r0) * HD + (int64_t)h * D + 2 * tq;
    float *o1 = o0 + 8 * HD;
#pragma unroll
    for (int j = 0; j < ND; j++) {
        if (r0 < a.T) *(float2 *)(o0 + 8 * j) = make_float2(o[j][0] * inv[0], o[j][1] * inv[0]);
        if (r1 < a.T) *(float2 *)(o1 + 8 * j) = make_float2(o[j][2] * inv[1], o[j][3] * inv[1]);
    }
}

template <int D, int KT, bool STATS>
static lmx_status launch_flash(cuda_backend *cb, const att_arg &a, const float *q, const __nv_bfloat16 *k16,
                               const __nv_bfloat16 *v16, float *out, const float *dout, float *lse, float *dsum) {
    const size_t sm = flash_smem<D, KT>(); /* allowed by cuda_flash_init */
    dim3 grid((unsigned)((a.T + FA_ROWS - 1) / FA_ROWS), (unsigned)a.H, (unsigned)a.B);
    k_flash<D, KT, STATS><<<grid, FA_THREADS, sm, cb->stream>>>(q, k16, v16, out, a, dout, lse, dsum);
    return cuda_check_launch(cb, "attention");
}

/* The key tile of head dim D: 32 rows for 256 (shared memory), else 64. */
template <int D> constexpr int flash_kt() { return D == 256 ? 32 : 64; }

/* launch_flash for a.D (the STATS form has no kernel for 256) */
template <bool STATS>
static lmx_status flash_by_dim(cuda_backend *cb, const att_arg &a, const float *q, const __nv_bfloat16 *k16,
                               const __nv_bfloat16 *v16, float *out, const float *dout, float *lse, float *dsum) {
    switch (a.D) {
    case 32: return launch_flash<32, flash_kt<32>(), STATS>(cb, a, q, k16, v16, out, dout, lse, dsum);
    case 64: return launch_flash<64, flash_kt<64>(), STATS>(cb, a, q, k16, v16, out, dout, lse, dsum);
    case 128: return launch_flash<128, flash_kt<128>(), STATS>(cb, a, q, k16, v16, out, dout, lse, dsum);
    case 256:
        return STATS ? LMX_ERR_UNSUPPORTED : launch_flash<256, flash_kt<256>(), false>(cb, a, q, k16, v16, out, dout, lse, dsum);
    default: return LMX_ERR_UNSUPPORTED;
    }
}

template <int D, bool STATS> static void flash_allow() {
    cudaFuncSetAttribute(k_flash<D, flash_kt<D>(), STATS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)flash_smem<D, flash_kt<D>()>());
}
void cuda_flash_init(void) { /* every instance flash_by_dim launches */
    flash_allow<32, false>(), flash_allow<64, false>(), flash_allow<128, false>(), flash_allow<256, false>();
    flash_allow<32, true>(), flash_allow<64, true>(), flash_allow<128, true>();
    cudaGetLastError();
}

lmx_status cuda_flash_attention(cuda_backend *cb, const att_arg &a, const float *q, const float *k, const float *v,
                                float *out, float *lse) {
    if (a.D != 32 && a.D != 64 && a.D != 128 && a.D != 256) return LMX_ERR_UNSUPPORTED;
    const int64_t n = (int64_t)a.B * a.T * a.Hk * a.D; /* elements of k (and of v) */
    __nv_bfloat16 *k16 = (__nv_bfloat16 *)cuda_scratch(cb, CUDA_SCRATCH_KV16, (size_t)n * 4);
    if (!k16) return cb->base.err.status;
    __nv_bfloat16 *v16 = k16 + n;
    lmx_status st;
    if ((st = cuda_narrow_bf16(cb, k16, k, n)) || (st = cuda_narrow_bf16(cb, v16, v, n))) return st;
    st = cuda_flash_wg(cb, a, q, k16, v16, out, lse); /* Hopper, sequences from position 0 */
    if (st != LMX_ERR_UNSUPPORTED) return st;
    return flash_by_dim<false>(cb, a, q, k16, v16, out, NULL, lse, NULL);
}

lmx_status cuda_flash_stats(cuda_backend *cb, const att_arg &a, const float *q, const __nv_bfloat16 *k16,
                            const __nv_bfloat16 *v16, const float *dout, float *lse, float *dsum) {
    return flash_by_dim<true>(cb, a, q, k16, v16, NULL, dout, lse, dsum);
}
