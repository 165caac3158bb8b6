/* cuda_moe_rows.cu - a mixture's many rows (prefill, long batches) of GGUF experts on the integer tensor cores, grouped
 * by expert: each chosen expert's weights read once a round of rows, whatever the spread of its rows.
 *
 * cuda_moe_grouped.cu routes a round's rows; k_moe_plan counts the pairs that chose each expert, places them in
 * expert order (pairs of one expert consecutive) and cuts each expert's places into tiles, on the device.  Here each
 * projection is one launch over tiles of places: block (bx, i) takes weight rows [bx R, (bx + 1) R) (as k_moe_mma: gate
 * / up R = 64 of gate beside the same 64 of up, four warps each; down R = 128, eight warps) of tile i's expert against
 * the tile's up to 8 NT places (NT passes of the mma's n = 8).  It walks K a super-block at a time: x's super-block of
 * the tile's places staged by cp.async (two stages, the next in flight while the mma take the current), each warp's 16
 * rows of the super-block loaded into registers a super-block ahead, once for the NT passes (each pass decodes them:
 * mq_rows::sum).  The arithmetic is cuda_mq.h's (mq_rows::sum), so a place's values are the bits k_moe_mma gives the
 * same pair.
 *
 * Gate / up store h [places, F] = act(gate x) (up x), x's row of place s being src[s] (its row in the round); the
 * down projection takes h quantized (k_mq_quant, a place a row) and stores y [places, C], which the combine reads
 * through slot.  Where the grouped GEMMs dequantize the chosen experts to bf16 and multiply them in cuBLAS, and the
 * runs of 64 rows of the decode kernels this replaced read every chosen expert again a run, one launch a projection
 * reads each expert once.  (Tried, and no faster: each sub-block's codes
 * decoded once for the NT passes, with the weights staged through shared memory beside x; sixteen warps a block, x
 * staged once for twice the rows.) */
#include "cuda_moe_mma.h"
#include "cuda_mq.h"

/* Passes of 8 places a block.  H200, Qwen3-30B-A3B Q4_K_M (random_gguf.py --spread), prefill 2048 / 512 tok/s, 48
 * layers: 4 passes 19,152-19,316 / 15,407-15,547, 8 (one block a multiprocessor, its registers) 16,680-16,903 /
 * 12,976-13,222. */
#define ROWS_NT 4

/* uint4s of a pass of 8 places' staged super-block (mq_stage_bytes(1)): codes [8 parts][8][4], sums [8 SUMS][8],
 * scales [8] */
template <int T> static __host__ __device__ constexpr int rows_group_u4() {
    return 256 + (64 * mq_t<T>::SUMS * 4 + 8 * 4) / 16;
}
template <int T, int NT> static inline size_t rows_smem() { return (size_t)2 * NT * rows_group_u4<T>() * 16; }

/* Block (bx, i): tile i = {expert e, first place s0, places n <= 8 NT} (tiles, on the device), y[s, n] for its places s
 * and rows n of weight rows bx R ..; x's row of place s: src[s] (gate / up), or s (src NULL). */
template <int T, int PAIR, int TILED, int NT>
__global__ void __launch_bounds__(256, 2)
    k_moe_rows(const mq_x x, const int *__restrict__ src, const __grid_constant__ gv_moe mo,
               const int4 *__restrict__ tiles, int N, int K, int act, float *__restrict__ y) {
    extern __shared__ uint4 rs_sm[]; /* two stages of NT passes (rows_group_u4 each) */
    __shared__ int xrow[8 * NT];     /* x's row of each of the tile's places, -1 past n */
    __shared__ float up[PAIR ? 4 : 1][16][PAIR ? 8 * NT + 1 : 1]; /* PAIR: the up warps' sums, for the GLU */
    const int4 ti = tiles[blockIdx.y];
    const int e = ti.x, s0 = ti.y, n = ti.z;
    if (n == 0) return; /* past the round's tiles (k_moe_plan) */
    const int tid = threadIdx.x, warp = tid / 32, g = (tid % 32) / 4, t = tid % 4;
    for (int c = tid; c < 8 * NT; c += blockDim.x) xrow[c] = c < n ? (src ? src[s0 + c] : s0 + c) : -1;
    constexpr int S = mq_t<T>::SUMS, GU = rows_group_u4<T>();
    const int mat = PAIR ? warp / 4 : 0, n0 = PAIR ? blockIdx.x * 64 + 16 * (warp % 4) : blockIdx.x * 128 + 16 * warp;
    const uint8_t *wr[2], *tile; /* the warp's rows (TILED: its tiles) */
    mq_warp_rows<T>(mo.w[mat][e], n0, g, N, K, wr, tile);
    const int NP = K / 32, SB = K / 256;
    __syncthreads(); /* xrow */
    /* super-block b of the tile's places into stage q: pass j's codes (thread tid's entry of each pass: part tid / 32,
     * place 8 j + tid / 4 % 8, lane tid % 4), then its sums and scales; places past n zeros */
    auto stage = [&](int b, int q) {
        uint4 *st = rs_sm + (size_t)q * NT * GU;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const int m = xrow[8 * j + tid / 4 % 8];
            const uint4 *s = x.q + (size_t)(m < 0 ? 0 : m) * NP * 4 + (8 * b + tid / 32) * 4 + tid % 4;
            cp_async16_or_zeros(smem_addr(st + j * GU + tid), s, m < 0 ? 0 : 16);
        }
        for (int i = tid; i < NT * (64 * S + 8); i += blockDim.x) {
            const int j = i / (64 * S + 8), k = i % (64 * S + 8), c = k < 64 * S ? k % 8 : k - 64 * S;
            const int m = xrow[8 * j + c];
            const void *s = k < 64 * S ? (const void *)(x.s + (size_t)(m < 0 ? 0 : m) * NP * S + 8 * S * b + k / 8)
                                       : (const void *)(x.d + (size_t)(m < 0 ? 0 : m) * SB + b);
            cp_async4_or_zeros(smem_addr((int *)(st + j * GU + 256) + k), s, m < 0 ? 0 : 4);
        }
        cp_async_commit();
    };
    mq_rows<T> cur, next;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    stage(0, 0);
    if constexpr (TILED) cur.load_tiled(tile, tid % 32);
    else cur.load(wr, 0, t);
    for (int b = 0; b < SB; b++) {
        if (b + 1 < SB) {
            stage(b + 1, (b + 1) & 1);
            if constexpr (TILED) next.load_tiled(tile + (size_t)(b + 1) * mq_tile<T>::BYTES, tid % 32);
            else next.load(wr, b + 1, t);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads(); /* stage b is in */
        const uint4 *st = rs_sm + (size_t)(b & 1) * NT * GU;
#pragma unroll
        for (int j = 0; j < NT; j++)
            if (8 * j < n) {
                const uint4 *sx = st + j * GU;
                const int *sxs = (const int *)(sx + 256);
                cur.sum(0, sx, sxs, (const float *)(sxs + 64 * S), g, t, acc[j]);
            }
        __syncthreads(); /* stage b's reads are done before stage b + 2 lands there */
        cur = next;
    }
    /* acc[j][o]: row g + 8 (o / 2), place 8 j + 2 t + o % 2 */
    if (PAIR && mat == 1)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int o = 0; o < 4; o++) up[warp % 4][g + 8 * (o / 2)][8 * j + 2 * t + o % 2] = acc[j][o];
    if (PAIR) __syncthreads();
    if (mat == 0)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int o = 0; o < 4; o++) {
                const int r = g + 8 * (o / 2), c = 8 * j + 2 * t + o % 2, row = n0 + r;
                if (c >= n || row >= N) continue;
                const float v = PAIR ? glu_act(acc[j][o], act) * up[warp % 4][r][c] : acc[j][o];
                y[(size_t)(s0 + c) * N + row] = v;
            }
}


int cuda_moe_rows_takes(const cuda_backend *cb, const lmx_moe_args *a) {
    return cb->moe_rows && cuda_moe_routes(cb, a) && a->alike && cuda_moe_mma_fits(cb, a, 0) &&
           cuda_moe_mma_fits(cb, a, 1);
}

template <int T, int PAIR>
static lmx_status rows_launch(cuda_backend *cb, const lmx_moe_args *a, const mq_x &xo, const int *src, const int4 *tiles,
                              int ntiles, float *y) {
    const int j = PAIR ? 0 : 2, N = (int)a->experts[j].shape[0], K = (int)a->experts[j].shape[1];
    gv_moe tab;
    gv_moe_fill(&tab, a->experts, a->E, !PAIR);
    const dim3 grid((unsigned)cuda_blocks(N, PAIR ? 64 : 128), (unsigned)ntiles);
    const size_t smem = rows_smem<T, ROWS_NT>(); /* (under the 48 KB a launch takes without asking) */
    if (cuda_moe_tile_base(a->experts[j].q.ggml_type))
        k_moe_rows<T, PAIR, 1, ROWS_NT><<<grid, 256, smem, cb->stream>>>(xo, src, tab, tiles, N, K, (int)a->act, y);
    else
        k_moe_rows<T, PAIR, 0, ROWS_NT><<<grid, 256, smem, cb->stream>>>(xo, src, tab, tiles, N, K, (int)a->act, y);
    return cuda_check_launch(cb, PAIR ? "moe gate/up (rows)" : "moe down (rows)");
}

/* A round's plan, one block (no host in the loop): count[e] pairs chose expert e, whose pairs take places off[e] ..
 * off[e] + count[e] - 1, slot[p] = p's place and src[place] = p / K (its row), then the tiles [tmax]: each expert's
 * places in tiles of up to 8 ROWS_NT, experts in order, and empty tiles (n = 0) to the end, which k_moe_rows's blocks
 * skip.  Within an expert the places come in no set order (shared-memory atomics): a place's values never depend on
 * the other places of its tile (each is its own columns of the mma), so the outputs' bits do not either. */
__global__ void __launch_bounds__(1024) k_moe_plan(const int *__restrict__ pick, int P, int E, int K,
                                                   int *__restrict__ slot, int *__restrict__ src,
                                                   int4 *__restrict__ tiles, int tmax) {
    constexpr int TILE = 8 * ROWS_NT, J = CUDA_MOE_E_MAX / 32;
    __shared__ int count[CUDA_MOE_E_MAX], off[CUDA_MOE_E_MAX], fill[CUDA_MOE_E_MAX], toff[CUDA_MOE_E_MAX + 1];
    cuda_pdl_trigger();
    cuda_pdl_wait(); /* pick comes from the routing */
    const int tid = threadIdx.x, lane = tid % 32;
    for (int e = tid; e < E; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int p = tid; p < P; p += blockDim.x) atomicAdd(&count[pick[p]], 1);
    __syncthreads();
    if (tid < 32) { /* exclusive sums of the counts and of the tiles: lane l takes experts J l .. J l + J - 1 */
        int c[J], tl[J], sc = 0, st = 0;
#pragma unroll
        for (int j = 0; j < J; j++) {
            const int e = J * lane + j;
            c[j] = e < E ? count[e] : 0, tl[j] = (c[j] + TILE - 1) / TILE;
            sc += c[j], st += tl[j];
        }
        int ic = sc, it = st; /* inclusive sums over the lanes */
#pragma unroll
        for (int d = 1; d < 32; d *= 2) {
            const int vc = __shfl_up_sync(0xffffffffu, ic, d), vt = __shfl_up_sync(0xffffffffu, it, d);
            if (lane >= d) ic += vc, it += vt;
        }
        ic -= sc, it -= st;
#pragma unroll
        for (int j = 0; j < J; j++) {
            const int e = J * lane + j;
            if (e < E) off[e] = fill[e] = ic, toff[e] = it;
            ic += c[j], it += tl[j];
        }
        if (lane == 31) toff[E] = it;
    }
    __syncthreads();
    for (int e = tid; e < E; e += blockDim.x)
        for (int c = 0; c < count[e]; c += TILE)
            tiles[toff[e] + c / TILE] = make_int4(e, off[e] + c, count[e] - c < TILE ? count[e] - c : TILE, 0);
    for (int i = toff[E] + tid; i < tmax; i += blockDim.x) tiles[i] = make_int4(0, 0, 0, 0);
    for (int p = tid; p < P; p += blockDim.x) {
        const int s = atomicAdd(&fill[pick[p]], 1);
        slot[p] = s;
        src[s] = p / K;
    }
}

lmx_status cuda_moe_rows_plan(cuda_backend *cb, const int *pick, int P, int E, int K, int *slot, int *src,
                              int4 *tiles) {
    cuda_launch(cb, k_moe_plan, 1, 1024, 0, pick, P, E, K, slot, src, tiles, cuda_moe_rows_tiles_max(P, E));
    return cuda_check_launch(cb, "moe plan");
}

int cuda_moe_rows_tiles_max(int P, int E) { return P / (8 * ROWS_NT) + E; }

lmx_status cuda_moe_rows(cuda_backend *cb, const lmx_moe_args *a, const float *x, int R, const int *src,
                         const int4 *tiles, float *h, float *y) {
    const int64_t F = a->experts[0].shape[0], C = a->experts[0].shape[1];
    const int P = R * a->K, ntiles = cuda_moe_rows_tiles_max(P, a->E); /* the round's places; its tiles' room */
    mq_x xo;
    if (!cuda_mq_quant(cb, LMX_GGML_Q4_K, x, R, (int)C, NULL, &xo)) return cb->base.err.status;
    lmx_status st = rows_launch<LMX_GGML_Q4_K, 1>(cb, a, xo, src, tiles, ntiles, h);
    if (st) return st;
    const int q6 = cuda_moe_blocks(a->experts[2].q.ggml_type) == LMX_GGML_Q6_K_A16;
    if (!cuda_mq_quant(cb, q6 ? LMX_GGML_Q6_K_A16 : LMX_GGML_Q4_K, h, P, (int)F, NULL, &xo)) return cb->base.err.status;
    return q6 ? rows_launch<LMX_GGML_Q6_K_A16, 0>(cb, a, xo, NULL, tiles, ntiles, y)
              : rows_launch<LMX_GGML_Q4_K, 0>(cb, a, xo, NULL, tiles, ntiles, y);
}
