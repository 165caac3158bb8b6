/* cuda_flash_wg.cu - prefill / training attention on Hopper's warpgroup MMA (wgmma), head dims 64 and 128,
 * for launches whose sequences all start at position 0 (no cached keys: training, and a prompt's first
 * prefill).  cuda_flash.cu's mma.sync kernel takes the rest, with the same arithmetic: Q scaled and rounded
 * to bf16, S = Qs K^T and O += P V from bf16 operands with f32 accumulators, the softmax online per row (a
 * row's four threads share it), masked where a key is not visible, soft-capped before the mask.
 *
 * A block is one warpgroup (4 warps, 64 query rows of one head and sequence); key and value tiles of 64 rows
 * stream through shared memory (cp.async, two stages) in the swizzled layout of cuda_wgmma.h.  For D = 128,
 * Q stays in registers as the A fragments of its eight k16 steps (each warp its 16 rows), so S is an m64n64
 * product with only K read from shared memory: one with both operands there reads 4 KB a k16 step, as much
 * as shared memory delivers while the tensor cores run (the kernel at 243 TFLOP/s; 360 with Q in registers,
 * three blocks a multiprocessor, H200).  For D = 64, Q is a shared tile too: the register form, its
 * fragments loaded once, gave wrong scores from the second key tile on (CUDA 13, H200; test_cuda_ops' head
 * dim 64 cases), and loaded again for each tile it was right but slower than the shared tile (193 -> 280 us
 * a launch); its 700-row case at D = 128 guards the form kept.  O += P V is an m64nD product with P from registers and V read transposed. */
#include <math.h>

#include "cuda_attention.h"
#include "cuda_wgmma.h"

/* Q's registers (D = 128) or tile (D = 64) */
template <int D> __host__ __device__ constexpr bool wf_qreg() { return D == 128; }
template <int D> constexpr size_t wf_smem() { return (size_t)2 * ((wf_qreg<D>() ? 0 : 1) + 4) * WB_TILE * D + 1024; }

template <int D, bool CAP>
__global__ void __launch_bounds__(128, wf_qreg<D>() ? 3 : 2)
    k_wg_flash(const float *__restrict__ q, const __nv_bfloat16 *__restrict__ k16, const __nv_bfloat16 *__restrict__ v16,
               float *__restrict__ out, float *__restrict__ lse, const att_arg a) {
#ifdef CUDA_WGMMA
    extern __shared__ unsigned char wf_raw[];
    __nv_bfloat16 *Ks = (__nv_bfloat16 *)wb_smem_base(wf_raw); /* [2][64][D] */
    __nv_bfloat16 *Vs = Ks + 2 * WB_TILE * D;                   /* [2][64][D] */
    __nv_bfloat16 *Qs = Vs + 2 * WB_TILE * D;                   /* [64][D] where !wf_qreg */
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
    const int t0 = (gridDim.x - 1 - blockIdx.x) * WB_TILE; /* the longest tiles first */
    const int h = blockIdx.y, b = blockIdx.z, kvh = h / a.G;
    const int n = a.s[b].n_new, window = a.s[b].window;
    const int64_t HD = (int64_t)a.H * D, KD = (int64_t)a.Hk * D;
    const int tmax = t0 + WB_TILE - 1 < n - 1 ? t0 + WB_TILE - 1 : n - 1;
    const int64_t kvo = (int64_t)b * a.T * KD + (int64_t)kvh * D;

    /* keys [pmin, pmax] are visible to some row of the tile */
    const int pmin = window > 0 && t0 - window + 1 > 0 ? t0 - window + 1 : 0, pmax = tmax;
    const int ntiles = tmax >= t0 ? (pmax - pmin) / WB_TILE + 1 : 0;
    auto load_tile = [&](int p0, int st) {
        wb_load<D, WB_TILE, 128>(Ks + st * WB_TILE * D, k16 + kvo, KD, p0, pmax);
        wb_load<D, WB_TILE, 128>(Vs + st * WB_TILE * D, v16 + kvo, KD, p0, pmax);
        cp_async_commit();
    };

    const int wrow = t0 + 16 * warp, pos0 = wrow + g, pos1 = pos0 + 8; /* this thread's rows */
    const bool ok0 = pos0 < n, ok1 = pos1 < n;
    float o[D / 8][4], m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
    acc_zero(o);

    if (ntiles > 0) load_tile(pmin, 0);
    /* Q scaled, as bf16 (rows past T: zeros): the A fragments qf[kk] of columns 16 kk.. of rows pos0, pos1,
     * or the tile Qs */
    uint32_t qf[wf_qreg<D>() ? D / 16 : 1][4];
    if constexpr (wf_qreg<D>()) {
        const float *q0 = q + ((int64_t)b * a.T + pos0) * HD + (int64_t)h * D + 2 * tq, *q1 = q0 + 8 * HD;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float *src = (e & 1 ? q1 : q0) + 16 * kk + 8 * (e / 2);
                const float2 v = (e & 1 ? pos1 : pos0) < a.T ? __ldg((const float2 *)src) : make_float2(0.f, 0.f);
                qf[kk][e] = pack_bf16(v.x * a.scale, v.y * a.scale);
            }
    } else {
        for (int i = tid; i < WB_TILE * D / 4; i += 128) {
            const int r = i / (D / 4), c = (i % (D / 4)) * 4, t = t0 + r;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (t < a.T) v = __ldg((const float4 *)(q + ((int64_t)b * a.T + t) * HD + (int64_t)h * D + c));
            const uint2 pk = make_uint2(pack_bf16(v.x * a.scale, v.y * a.scale), pack_bf16(v.z * a.scale, v.w * a.scale));
            *(uint2 *)(Qs + (c / 64) * WB_TILE * 64 + wg_chunk(r, c % 64 / 8) + c % 8) = pk;
        }
    }
    for (int it = 0; it < ntiles; it++) {
        const int p0 = pmin + it * WB_TILE, st = it & 1;
        wb_turn(it + 1 < ntiles, [&] { load_tile(p0 + WB_TILE, st ^ 1); }); /* tile it (and Q) */
        const uint32_t ks = smem_addr(Ks + st * WB_TILE * D), vs = smem_addr(Vs + st * WB_TILE * D);
        float s[8][4];
        wg_fence();
        if constexpr (wf_qreg<D>()) { /* S = Qs K^T */
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                wg_rs_n64(s, qf[kk], wg_kmajor(ks + (kk / 4) * (WB_TILE * 128) + (kk % 4) * 32), kk > 0);
        } else {
            wb_abt<D>(s, smem_addr(Qs), WB_TILE * 128, ks, WB_TILE * 128);
        }
        wg_commit();
        wg_wait<0>();
        wg_hold(s);
        /* every score visible: the block's rows all exist, the tile's last key precedes its first row and its
         * first key sits in the last row's window */
        const bool masked = !(t0 + 63 < n && p0 + WB_TILE - 1 <= t0 && (window <= 0 || p0 > t0 + 63 - window));
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = e / 2, p = p0 + 8 * j + 2 * tq + (e & 1);
                float x = s[j][e];
                if constexpr (CAP) x = a.softcap * tanhf(x / a.softcap);
                if (masked && !((row ? ok1 : ok0) && att_sees(row ? pos1 : pos0, p, window))) x = -INFINITY;
                s[j][e] = x;
            }
        att_softmax_step(s, m_r, l_r, o);
        uint32_t pa[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; kk++) acc_to_a(pa[kk], s[2 * kk], s[2 * kk + 1]);
        wg_fence();
        wb_acc<D>(o, pa, vs); /* O += P V */
        wg_commit();
        wg_wait<0>();
        wg_hold(o);
        __syncthreads(); /* the stage is refilled next turn */
    }

    float inv[2], ls[2];
    att_softmax_end(l_r, m_r, inv, ls);
    if (lse) /* the row's log-sum-exp: one thread of the row's four */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int t = r ? pos1 : pos0;
            if (tq == 0 && t < a.T) lse[((int64_t)b * a.H + h) * a.T + t] = ls[r];
        }
    float *o0 = out + ((int64_t)b * a.T + pos0) * HD + (int64_t)h * D + 2 * tq, *o1 = o0 + 8 * HD;
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
        if (pos0 < a.T) *(float2 *)(o0 + 8 * j) = make_float2(o[j][0] * inv[0], o[j][1] * inv[0]);
        if (pos1 < a.T) *(float2 *)(o1 + 8 * j) = make_float2(o[j][2] * inv[1], o[j][3] * inv[1]);
    }
#endif
}

template <int D>
static lmx_status wf_launch(cuda_backend *cb, const att_arg &a, const float *q, const __nv_bfloat16 *k16,
                            const __nv_bfloat16 *v16, float *out, float *lse) {
    const dim3 grid((unsigned)((a.T + WB_TILE - 1) / WB_TILE), (unsigned)a.H, (unsigned)a.B);
    if (a.softcap > 0) k_wg_flash<D, true><<<grid, 128, wf_smem<D>(), cb->stream>>>(q, k16, v16, out, lse, a);
    else k_wg_flash<D, false><<<grid, 128, wf_smem<D>(), cb->stream>>>(q, k16, v16, out, lse, a);
    return cuda_check_launch(cb, "attention");
}

lmx_status cuda_flash_wg(cuda_backend *cb, const att_arg &a, const float *q, const __nv_bfloat16 *k16,
                         const __nv_bfloat16 *v16, float *out, float *lse) {
    if (!cb->wgmma || (a.D != 64 && a.D != 128)) return LMX_ERR_UNSUPPORTED;
    for (int b = 0; b < a.B; b++)
        if (a.s[b].n_past != 0) return LMX_ERR_UNSUPPORTED;
    return a.D == 128 ? wf_launch<128>(cb, a, q, k16, v16, out, lse) : wf_launch<64>(cb, a, q, k16, v16, out, lse);
}

template <int D, bool CAP> static void wf_allow() {
    cudaFuncSetAttribute(k_wg_flash<D, CAP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)wf_smem<D>());
}
void cuda_flash_wg_init(void) {
    wf_allow<64, false>(), wf_allow<64, true>(), wf_allow<128, false>(), wf_allow<128, true>();
    cudaGetLastError();
}
