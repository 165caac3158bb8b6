/* cuda_gemv_mq.cu - decode GEMVs of several rows (batched decode) of dense GGUF Q4_K / Q6_K weights on the integer
 * tensor cores: y_i [M, N_i] = x [M, K] @ w_i^T (+ b_i) for 8..32 rows (cb->gemv_mq) and K up to 4,096, with x
 * quantized a super-block at a time as the experts of cuda_moe_mma.cu take it (the arithmetic: cuda_mq.h).
 *
 * Block (bx, i, z) takes rows [grp 128, grp 128 + 128) of segment i (8 warps of 16 rows, lane (g, t) rows g and g +
 * 8) against rows [8 z, 8 z + 8) of x (the mma's n), over the super-blocks of its K part kq of kp.  Each tile of 8
 * rows of x is a block of its own: a warp taking all four tiles of 32 rows (each weight read once by the block) ran
 * slower, its chain of instructions four times as long (H200, Qwen3-30B-A3B Q4_K_M batch 32: the q / k / v launch
 * 15.2 us with four tiles a block, 18.7 with one, but the layer's launches together 3,220-3,240 against 3,244-3,250
 * tok/s).  x's slice of the part is staged in shared memory by cp.async, all at once, after the first super-block's
 * weights are in flight.  The parts meet as k_gemv_tc's do (gv_parts_meet): each leaves its sums in scratch and
 * the last block of a row block adds them in part order, so a weight gives the same bits in any launch of the same shapes.
 *
 * Measured (H200, tok/s, against k_gemv_tc with x in bf16): Qwen3-30B-A3B Q4_K_M batch 8 / 32 1,435 / 3,059 ->
 * 1,504 / 3,343 (with the attention's short-context rule, cuda_attention.cu); Qwen3-0.6B Q4_K_M 6,823 / 15,654 ->
 * 7,080 / 15,978; Llama-3.1-8B Q4_K_M (its Q4_K rewritten as MLX groups, cuda_repack.cu; Q6_K v here) unchanged. */
#include "cuda_mq.h"

/* K up to 16 super-blocks: the 8B's down projection (K 14,336) in parts of at most 4 ran slower than k_gemv_tc (H200,
 * Llama-3.1-8B Q4_K_M batch 8: 2,635-2,670 -> 2,573-2,585 tok/s), and in fewer, longer parts slower at 32 rows
 * (5,503-5,548 -> 5,001-5,036) */
#define MQ_GEMV_K 4096
#define MQ_GEMV_COST 1  /* a part's own cost (its staging, its sums in scratch), in super-blocks of its loop */

template <int T>
__global__ void __launch_bounds__(256) k_gemv_mq(const mq_x x, int M, const gv_segs sg, int K, int kp,
                                                 float *__restrict__ part, int *__restrict__ ticket) {
    extern __shared__ uint4 mq_sm[]; /* x's codes [per * 8 parts][8][4], sums [per * 8 S][8], scales [per][8] */
    constexpr int S = mq_t<T>::SUMS;
    cuda_pdl_trigger();
    const gv_seg G = seg_pick(sg, blockIdx.y);
    const int tid = threadIdx.x, warp = tid / 32, g = (tid % 32) / 4, t = tid % 4;
    const int grp = blockIdx.x / kp, kq = blockIdx.x % kp, n0 = grp * 128 + 16 * warp, m0 = 8 * blockIdx.z;
    if (grp * 128 >= G.N) { /* the whole block past this segment's rows */
        cuda_pdl_wait();
        return;
    }
    const bool live = n0 < G.N; /* a dead warp still meets the block's barriers */
    const int NP = K / 32, SB = K / 256, per = (SB + kp - 1) / kp;
    const int sb0 = kq * per < SB ? kq * per : SB, nsb = (sb0 + per < SB ? sb0 + per : SB) - sb0;
    const int64_t rb = (int64_t)SB * gq_traits<T>::BYTES;
    const uint8_t *wr[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int n = n0 + g + 8 * h;
        wr[h] = (const uint8_t *)G.w + (n < G.N ? n : G.N - 1) * rb;
    }
    mq_rows<T> cur, next;
    if (live && nsb > 0) cur.load(wr, sb0, t); /* weights: no kernel writes them */
    uint4 *sx = mq_sm;
    int *sxs = (int *)(sx + per * 256);
    float *sxd = (float *)(sxs + per * 64 * S);
    cuda_pdl_wait(); /* x comes from the launch before */
    /* x's rows m0 + slot (zeros past M), laid out as k_moe_mma's staging lays a pass */
    for (int r = tid; r < nsb * 256; r += blockDim.x) { /* codes: entry r is lane r % 4 of pair slot r / 4 % 8 */
        const int m = m0 + r / 4 % 8;
        cp_async16_or_zeros(smem_addr(sx + r), x.q + ((size_t)(m < M ? m : 0) * NP + sb0 * 8 + r / 32) * 4 + r % 4,
                            m < M ? 16 : 0);
    }
    for (int r = tid; r < nsb * 64 * S; r += blockDim.x) { /* sums: [index][pair slot] */
        const int m = m0 + r % 8;
        cp_async4_or_zeros(smem_addr(sxs + r), x.s + (size_t)(m < M ? m : 0) * NP * S + sb0 * 8 * S + r / 8,
                           m < M ? 4 : 0);
    }
    for (int r = tid; r < nsb * 8; r += blockDim.x) { /* scales: [super-block][pair slot] */
        const int m = m0 + r % 8;
        cp_async4_or_zeros(smem_addr(sxd + r), x.d + (size_t)(m < M ? m : 0) * SB + sb0 + r / 8, m < M ? 4 : 0);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (live)
        for (int b = 0; b < nsb; b++) {
            if (b + 1 < nsb) next.load(wr, sb0 + b + 1, t);
            cur.sum(b, sx, sxs, sxd, g, t, acc);
            cur = next;
        }
    if (kp > 1) { /* scratch cell (tile, segment) of gmax row blocks, kp parts each */
        const int64_t cell = (int64_t)blockIdx.z * gridDim.y + blockIdx.y, row0 = cell * gridDim.x;
        if (!gv_parts_meet<4, 16>(acc, part, row0 + blockIdx.x, row0 + (int64_t)grp * kp,
                                  ticket + cell * (gridDim.x / kp) + grp, kp))
            return;
    }
    /* acc[o]: row n0 + g + 8 (o / 2), x's row m0 + 2 t + o % 2 */
#pragma unroll
    for (int o = 0; o < 4; o++) {
        const int m = m0 + 2 * t + o % 2, n = n0 + g + 8 * (o / 2);
        if (live && m < M && n < G.N) G.y[(int64_t)m * G.N + n] = acc[o] + bias_at(G.bias, G.bt, n);
    }
}

/* K parts for SB super-blocks and row blocks of gmax (the largest segment's) and groups (all of them) a tile: of the
 * counts 1, 2, 4, .. 16 within the scratch's 4 SMs of cells a segment whose parts hold at most cap super-blocks, the
 * one whose waves of blocks take the least time, a block counted as its super-blocks and MQ_GEMV_COST, the fewer parts
 * where two cost the same; 0: none.  A launch's parts may hold all of K (MQ_GEMV_K: x's slice up to 16 x 4.6 KB,
 * Q6_K): with parts of at most 4 super-blocks, Qwen3-30B-A3B's q / k / v (K 2,048) ran in four parts where one takes
 * the same one wave of blocks, and then met (its 48 layers at batch 32 3,444-3,446 -> 3,485-3,491 tok/s in one part,
 * H200).  Which matrices take the kernel is still decided with parts of at most MQ_TAKES_SB, the shapes measured. */
#define MQ_TAKES_SB 4
static int mq_gemv_parts(const cuda_backend *cb, int slots, int groups, int gmax, int SB, int cap) {
    int kp = 0;
    int64_t best = -1;
    for (int p = 1; p <= 16 && (int64_t)gmax * p <= 4 * cb->sm_count; p *= 2) {
        if ((SB + p - 1) / p > cap) continue;
        const int64_t waves = ((int64_t)groups * p + slots - 1) / slots, c = waves * ((SB + p - 1) / p + MQ_GEMV_COST);
        if (best < 0 || c < best) best = c, kp = p;
    }
    return kp;
}

void cuda_gemv_mq_init(cuda_backend *cb) {
    const void *fn[2] = {(const void *)k_gemv_mq<LMX_GGML_Q4_K>, (const void *)k_gemv_mq<LMX_GGML_Q6_K_A16>};
    /* x's slice of a K part, up to all of K (Q6_K's the larger) */
    cb->gemv_mq_smem = (int)mq_stage_bytes<LMX_GGML_Q6_K_A16>(MQ_GEMV_K / 256);
    for (int i = 0; i < 2; i++)
        if (cudaFuncSetAttribute(fn[i], cudaFuncAttributeMaxDynamicSharedMemorySize, cb->gemv_mq_smem) != cudaSuccess)
            cb->gemv_mq_smem = 0;
    cudaGetLastError();
}

int cuda_gemv_mq_takes(const cuda_backend *cb, const lmx_tensor *const *ws, int n, int M, int glu) {
    const int type = ws[0]->q.ggml_type;
    const int64_t K = ws[0]->shape[1];
    if (cb->gemv_mq <= 0 || cb->gemv_mq_smem <= 0 || M < cb->gemv_mq || M > 32 || glu >= 0 || K % 256 ||
        K > MQ_GEMV_K || (type != LMX_GGML_Q4_K && type != LMX_GGML_Q6_K_A16))
        return 0;
    int gmax = 1;
    for (int i = 0; i < n; i++) {
        if ((uintptr_t)ws[i]->data % 16) return 0;
        const int gi = (int)((ws[i]->shape[0] + 127) / 128);
        gmax = gi > gmax ? gi : gmax;
    }
    const int z = (M + 7) / 8;
    return mq_gemv_parts(cb, 2 * cb->sm_count, gmax * z, gmax * z, (int)(K / 256), MQ_TAKES_SB) > 0;
}

template <int T> static lmx_status mq_gemv(cuda_backend *cb, int n, const gv_segs *sg, const float *x, int M, int K) {
    mq_x xo;
    if (!cuda_mq_quant(cb, T, x, M, K, NULL, &xo)) return cb->base.err.status;
    int groups = 0, gmax = 1;
    for (int i = 0; i < n; i++) {
        const int gi = (sg->s[i].N + 127) / 128;
        groups += gi;
        gmax = gi > gmax ? gi : gmax;
    }
    const int SB = K / 256, z = (M + 7) / 8;
    int per_sm = cuda_fit_blocks(cb, (const void *)k_gemv_mq<T>);
    per_sm = per_sm > 2 ? 2 : per_sm;
    const int want = mq_gemv_parts(cb, cb->sm_count * per_sm, groups * z, gmax * z, SB, SB);
    float *part = NULL;
    int *ticket = want > 1 ? cuda_gemv_tc_scratch(cb, &part) : NULL;
    const int kp = ticket ? want : 1, per = (SB + kp - 1) / kp; /* no scratch (a graph capturing): one part */
    const dim3 grid((unsigned)(gmax * kp), (unsigned)n, (unsigned)z);
    cuda_launch(cb, k_gemv_mq<T>, grid, 256, mq_stage_bytes<T>(per), xo, M, *sg, K, kp, part, ticket);
    return cuda_check_launch(cb, "matmul (integer tensor cores)");
}

lmx_status cuda_gemv_mq(cuda_backend *cb, int n, const gv_segs *sg, int type, const float *x, int M, int K) {
    return type == LMX_GGML_Q4_K ? mq_gemv<LMX_GGML_Q4_K>(cb, n, sg, x, M, K)
                                 : mq_gemv<LMX_GGML_Q6_K_A16>(cb, n, sg, x, M, K);
}
