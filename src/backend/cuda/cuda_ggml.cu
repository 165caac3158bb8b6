/* cuda_ggml.cu - GGUF block weights on the GPU: y[M, N] = x[M, K] @ w[N, K]^T (+ bias) for few
 * rows (decode, M <= 8; MLX 4- and 8-bit rows too, as the pseudo block types GQ_MLX4 and GQ_MLX8), and
 * the bf16 dequantization of blocks of rows for prefill's cuBLAS GEMM.
 *
 * Activations in int16: x is quantized per 32 values (a part), x ~ d * qx with d = max|x| / 32767,
 * and a part of a weight row decodes (cuda_ggml.h) to 8-bit codes q with per-16 pairs (sc, mn), so
 * that over the part
 *
 *     w . x = sum over halves h:  d * (sc_h * (q . qx)_h  -  mn_h * sum_h(qx))
 *
 * with (q . qx) by two-way 16 x 8-bit integer dot products (dp2a), exact in int32: the result is the
 * dot product of the dequantized weights with the rounded x, which differs from x by at most 1/65534
 * of each part's largest value (bf16 would round each value by up to 1/512 of itself).  int8 (as
 * llama.cpp's MMVQ kernels take x) measured up to 2.4x the bf16 criterion on the GGUF fixtures.
 *
 * Several rows: k_gquant_x quantizes x once per launch into scratch, before the GEMV kernel reads it.
 * One row of up to GQ_XS_MAX_K values: each GEMV block quantizes x itself into shared memory once its
 * first weight loads are in flight (XS), with the RMSNorm folded in when the decode graph asks.  Weights of
 * one input in two types (a Q4_K_M file's Q4_K q and k with a Q6_K v) take one launch (k_ggemv_mix),
 * x quantized in the layout of each type's units.  A warp takes two
 * weight rows (the GLU pair: row n of gate and of up), lane l the units l, l + 32, ... of them (a
 * unit: the parts that share code bytes, gq_unit: 64 elements of Q4_K / Q5_K, 128 of Q6_K, else 32);
 * when the rows alone would not fill the GPU, KS warps share each row (warp k the units 32 k + l,
 * 32 (KS + k) + l, ...; KS a function of the type and shape, so a weight gives the same bits in every
 * launch).  Results are stored, or go through the GLU, or (one row) are added into y, with the
 * bias and the LoRA expand (cuda_gemv.h) as the dense one-row kernel does them. */
#include "cuda_ggml_x.h"
#include "cuda_moe_mma.h"

/* MLX rows of BITS 4 or 8: 32 elements in BITS / 4 16-byte vectors, the group's scale and bias raw
 * (raw_at, converted when used).  4-bit words hold even elements in the low nibbles and odd ones in the
 * high, interleaved back to element order; 8-bit codes are read as signed bytes less 128 for dp2a. */
template <int BITS> struct gq_unit_mlx {
    static constexpr int UP = 1, V = BITS / 4;
    uint4 w[V];
    uint32_t s, b;
    lmx_dtype t;
    __device__ __forceinline__ void load_mlx(const uint8_t *p, uint32_t s_raw, uint32_t b_raw, lmx_dtype dt) {
#pragma unroll
        for (int v = 0; v < V; v++) w[v] = __ldcs((const uint4 *)p + v);
        s = s_raw, b = b_raw, t = dt;
    }
    template <bool PAIRED = false> /* as gq_unit's */
    __device__ __forceinline__ void part(int, uint32_t (&q)[8], float (&sc)[2], float (&mn)[2]) const {
#pragma unroll
        for (int v = 0; v < V; v++) {
            const uint32_t ws[4] = {w[v].x, w[v].y, w[v].z, w[v].w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                if constexpr (BITS == 4) {
                    const uint32_t lo = ws[i] & 0x0F0F0F0Fu, hi = (ws[i] >> 4) & 0x0F0F0F0Fu;
                    q[2 * i] = __byte_perm(lo, hi, 0x5140u), q[2 * i + 1] = __byte_perm(lo, hi, 0x7362u);
                } else {
                    q[4 * v + i] = ws[i] ^ 0x80808080u;
                }
            }
        }
        const float sv = raw_val(s, t);
        sc[0] = sc[1] = sv; /* s q + b, and for 8 bits s (q - 128) + (b + 128 s) */
        mn[0] = mn[1] = BITS == 8 ? -(raw_val(b, t) + 128.0f * sv) : -raw_val(b, t);
    }
};
template <> struct gq_unit<GQ_MLX4> : gq_unit_mlx<4> {};
template <> struct gq_unit<GQ_MLX8> : gq_unit_mlx<8> {};

/* Block (bx, m) of x's quantization: its 32 parts of row m, normalised where nm.w. */
static __device__ __forceinline__ void gquant_x_block(const float *__restrict__ x, const gq_xq &o, const gq_xq &o1,
                                                      int K, const cuda_row_norm &nm, int m, int bx) {
    __shared__ float part[8];
    const float inv = nm.w ? cuda_rms_inv256(x + (size_t)m * K, K, nm.eps, part) : 1.0f;
    gquant_x_parts(x, o, o1, K, nm, inv, m, bx);
}

__global__ void __launch_bounds__(256) k_gquant_x(const float *__restrict__ x, const gq_xq o, const gq_xq o1, int K,
                                                  const cuda_row_norm nm) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    gquant_x_block(x, o, o1, K, nm, blockIdx.y, blockIdx.x);
}

/* A mixture of experts' first launch for GGUF experts (cuda_moe.cu): blocks (x, m < M) quantize row m as
 * k_gquant_x does, and the first warp of block (0, M + i) routes row i (cuda_moe_route_row): one
 * dependent launch fewer in each layer of a decode step. */
__global__ void __launch_bounds__(256) k_moe_quant_route(const float *__restrict__ x, const gq_xq o, int K,
                                                         const cuda_row_norm nm, const __grid_constant__ cuda_moe_router rt) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    const int M = gridDim.y / 2;
    if ((int)blockIdx.y < M) gquant_x_block(x, o, gq_xq{}, K, nm, blockIdx.y, blockIdx.x);
    else if (blockIdx.x == 0 && threadIdx.x < 32) cuda_moe_route_row(rt, blockIdx.y - M, threadIdx.x);
}

static __device__ __forceinline__ void gq_prefetch(const void *p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/* Lanes that share a row: a warp's 32, or, for a row of NU < 32 units and one warp a row (KS 1), the
 * fewest (a power of two) that hold a unit each, so that a warp takes 32 / lanes rows at once (a
 * mixture of experts' down projection of K = 768 is 6 Q6_K units: 26 of 32 lanes were idle). */
static __host__ __device__ __forceinline__ int gq_lanes(int NU, int KS) {
    int n = 1;
    while (n < NU && n < 32) n *= 2;
    return KS == 1 ? n : 32;
}

/* The block's work: weight S (PAIR: sg.s[0] and sg.s[1]) over the M rows of quantized x; k_ggemv and
 * k_moe_ggemv around it.  MM: the most input rows (M <= MM); U: units per lane in flight (a unit: UP
 * parts, gq_unit).  resid (one row, one weight): y += W x + b.  XS (one row): the block quantizes x
 * itself (xf [K], nm's norm where nm.w, as k_gquant_x) into shared memory at xq / xm, after its first
 * weight loads are in flight: no launch of its own before the GEMV.  TL: the weights in tiles of 16 rows
 * (LMX_GGML_Q4_K_T16 / Q6_K_T16 as T's blocks: a mixture's experts, cuda_moe_mma.cu). */
template <int T, int MM, int PAIR, int XS = 0, int TL = 0>
static __device__ __forceinline__ void ggemv_body(const int4 *__restrict__ xq, const float4 *__restrict__ xm,
                                                  const gv_segs &sg, const gv_seg &S, int K, int PR, int M, int act,
                                                  int resid, const float *xf = NULL, const cuda_row_norm *nm = NULL) {
    constexpr int UP = gq_unit<T>::UP, R = 2, RO = PAIR ? 1 : 2, U = MM <= 2 && UP == 1 ? 2 : 1;
    constexpr int BYTES = gq_traits<T>::BYTES, UPB = gq_traits<T>::PARTS / UP; /* units per block */
    __shared__ float red[8][R * MM];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, KS = S.ks, kslice = warp % KS;
    const int P = K / 32, NU = P / UP, LG = gq_lanes(NU, KS), l = lane % LG, vstride = LG * KS;
    const int n0 = ((blockIdx.x * (8 / KS) + warp / KS) * (32 / LG) + lane / LG) * RO; /* this lane group's */
    const bool active = n0 < S.N;
    if (blockIdx.x * (8 / KS) * (32 / LG) * RO >= S.N) return; /* a block past this segment's rows (a wider one's grid) */
    const int64_t row_bytes = (int64_t)(K / gq_traits<T>::ELEMS) * BYTES;
    const uint8_t *wr[R]; /* row r: weight row n0 + r (the pair: row n0 of gate, then of up), clamped; TL: its tile row */
    int r16[R];           /* TL: the row's place in its tiles */
    const void *sp[R], *bp[R]; /* MLX: its scales and biases, from group gi[r] */
    int64_t gi[R];
    const int lg = GQ_IS_MLX(T) ? __ffs(sg.group / 32) - 1 : 0; /* units per group: 1 << lg */
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int n = n0 + (PAIR ? 0 : r), row = n < S.N ? n : S.N - 1;
        const gv_seg &W = PAIR ? (r ? sg.s[1] : sg.s[0]) : S;
        wr[r] = (const uint8_t *)W.w + (TL ? row / 16 * 16 : row) * row_bytes;
        r16[r] = row % 16;
        sp[r] = W.scales, bp[r] = W.biases;
        gi[r] = GQ_IS_MLX(T) ? (int64_t)row * (K / sg.group) : 0;
    }
    int p = LG * kslice + l; /* this lane's first unit */
    gq_unit<T> wu[U][R];
    auto load = [&]() { /* units p, p + vstride, ... (clamped to p past the row), every one before any use */
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int pu = p + vstride * u < NU ? p + vstride * u : p;
            const int64_t boff = (int64_t)(pu / UPB) * BYTES;
#pragma unroll
            for (int r = 0; r < R; r++)
                if constexpr (GQ_IS_MLX(T))
                    wu[u][r].load_mlx(wr[r] + boff, raw_at(sp[r], sg.sdt, gi[r] + (pu >> lg)),
                                      raw_at(bp[r], sg.sdt, gi[r] + (pu >> lg)), sg.sdt);
                else if constexpr (TL)
                    wu[u][r].load_tiled(wr[r] + 16 * boff, r16[r], pu % UPB);
                else
                    wu[u][r].load(wr[r] + boff, pu % UPB);
        }
    };
    /* the first units before the wait (weights, which no kernel writes): GGUF types load them (Qwen3-0.6B Q4_K_M
     * decode on an H200 1,128 -> 1,178 tok/s), MLX rows only prefetch them to L2 (loaded, the one-row pair held
     * them across the wait and spilled: 8B MLX 4-bit 442 -> 388) */
    constexpr bool EARLY = !GQ_IS_MLX(T);
    if (active && p < NU) {
        if constexpr (EARLY) {
            load();
        } else {
#pragma unroll
            for (int u = 0; u < U; u++)
                if (p + vstride * u < NU)
#pragma unroll
                    for (int r = 0; r < R; r++) gq_prefetch(wr[r] + (int64_t)((p + vstride * u) / UPB) * BYTES);
        }
    }
    cuda_pdl_wait(); /* x is ready */
    if constexpr (XS) {
        __shared__ float part[8];
        const gq_xq o = {(int4 *)xq, (float4 *)xm, PR, gq_ul(UP)};
        const float inv = nm->w ? cuda_rms_inv256(xf, K, nm->eps, part) : 1.0f;
        /* a pass at a time: gquant_x_row's batched loads, beside the units held across, measured slower here (8B
         * Q4_K_M decode 329 -> 312 tok/s) */
        for (int b = 0; b * 32 < P; b++) gquant_x_parts(xf, o, gq_xq{}, K, *nm, inv, 0, b);
        __syncthreads();
    }

    float acc[R][MM];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MM; m++) acc[r][m] = 0.0f;
    if (active)
        for (bool first = true; p < NU; p += vstride * U, first = false) {
            if (!EARLY || !first) load();
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int pu = p + vstride * u;
                if (pu >= NU) break;
#pragma unroll
                for (int k = 0; k < UP; k++) {
                    const int xi = ((pu >> 5) * UP + k) * 32 + (pu & 31); /* the part's place in x (gq_xpart) */
                    uint32_t q[R][8];
                    float sc[R][2], mn[R][2];
#pragma unroll
                    for (int r = 0; r < R; r++) wu[u][r].template part<!XS>(k, q[r], sc[r], mn[r]);
#pragma unroll
                    for (int m = 0; m < MM; m++) {
                        if (m >= M) break;
                        const int4 *xv = xq + (size_t)m * PR * 4 + (xi - (pu & 31)) * 4 + (pu & 31);
                        const int4 X[4] = {gq_ldx<XS>(xv), gq_ldx<XS>(xv + 32), gq_ldx<XS>(xv + 64),
                                           gq_ldx<XS>(xv + 96)};
                        const float4 xs = gq_ldx<XS>(xm + (size_t)m * PR + xi);
#pragma unroll
                        for (int r = 0; r < R; r++) acc[r][m] = gq_part_acc<!XS>(q[r], sc[r], mn[r], X, xs, acc[r][m]);
                    }
                }
            }
        }
    /* the sums of each row: the group's lanes, then the KS warps sharing it (in order) */
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MM; m++)
            for (int o = 16; o > 0; o >>= 1)
                if (o < LG) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);
    if (KS > 1) {
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int m = 0; m < MM; m++) red[warp][r * MM + m] = acc[r][m];
        __syncthreads();
        if (kslice != 0) return;
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int m = 0; m < MM; m++) {
                float t = red[warp][r * MM + m];
                for (int k = 1; k < KS; k++) t += red[warp + k][r * MM + m];
                acc[r][m] = t;
            }
    }
    if (l != 0 || !active) return;
#pragma unroll
    for (int m = 0; m < MM; m++) {
        if (m >= M) break;
        if constexpr (PAIR != 0) {
            const int n = n0;
            if (n < S.N) {
                float g = acc[0][m] + bias_at(sg.s[0].bias, sg.s[0].bt, n);
                float u = acc[1][m] + bias_at(sg.s[1].bias, sg.s[1].bt, n);
                if (sg.s[0].lb) g = g + gv_lora_term(sg.s[0], n); /* as the lora op adds it, before the GLU */
                if (sg.s[1].lb) u = u + gv_lora_term(sg.s[1], n);
                sg.s[0].y[(size_t)m * S.N + n] = glu_act(g, act) * u;
                sg.s[1].y[(size_t)m * S.N + n] = u;
            }
        } else {
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int n = n0 + r;
                if (n < S.N) {
                    float o = acc[r][m] + bias_at(S.bias, S.bt, n);
                    if (S.lb) o = o + gv_lora_term(S, n);
                    float *y = S.y + (size_t)m * S.N + n;
                    *y = resid ? *y + o : o;
                }
            }
        }
    }
}

/* XS: the one row xf, quantized by each block (ggemv_body) into gq_xs; else x quantized before (xq, xm). */
template <int T, int MM, int PAIR, int XS>
__global__ void __launch_bounds__(256) k_ggemv(const int4 *__restrict__ xq, const float4 *__restrict__ xm,
                                               const gv_segs sg, int K, int PR, int M, int act, int resid,
                                               const float *__restrict__ xf, const cuda_row_norm nm) {
    cuda_pdl_trigger();
    if constexpr (XS)
        ggemv_body<T, 1, PAIR, 1>(gq_xs, (const float4 *)(gq_xs + PR * 4), sg, seg_pick(sg, blockIdx.y), K, PR, 1, act,
                                  resid, xf, &nm);
    else
        ggemv_body<T, MM, PAIR>(xq, xm, sg, seg_pick(sg, blockIdx.y), K, PR, M, act, resid);
}

/* Weights of two types in one launch (no GLU): segment y = gridDim.y - 1 - blockIdx.y (the last first: a
 * Q4_K_M file's Q6_K v, whose few blocks take twice a q block's parts and a slower decode, then ended the launch,
 * dispatched after q's and k's) is of type T2 where bit y of alt is set, on x in its own layout (x2, PR2: T2's
 * units), else of type T.  Q4_K_M and Q5_K_M files store some layers'
 * attn_v as Q6_K beside Q4_K / Q5_K q and k: q/k/v stay one launch after one quantization of x.  One row (XS) is
 * held to three blocks a multiprocessor (80 registers, 104 unbounded: two), so that a q/k/v launch of Qwen3-30B-A3B's
 * shape (304 blocks with rows) runs in one wave: H200, its 48 layers in Q4_K_M 534-539 -> 559-560 tok/s, Qwen3-0.6B
 * Q4_K_M (MLX-rewritten q / k beside Q6_K v) 1,442-1,455 -> 1,466-1,479. */
template <int T, int T2, int MM, int XS>
__global__ void __launch_bounds__(256, XS ? 3 : 0)
    k_ggemv_mix(const int4 *__restrict__ xq, const float4 *__restrict__ xm, const int4 *__restrict__ xq2,
                const float4 *__restrict__ xm2, const gv_segs sg, int alt, int K, int PR, int PR2, int M,
                const float *__restrict__ xf, const cuda_row_norm nm) {
    cuda_pdl_trigger();
    const int y = gridDim.y - 1 - blockIdx.y;
    const gv_seg S = seg_pick(sg, y);
    if constexpr (XS) { /* each block's x in its own type's layout */
        if ((alt >> y) & 1)
            ggemv_body<T2, 1, 0, 1>(gq_xs, (const float4 *)(gq_xs + PR2 * 4), sg, S, K, PR2, 1, 0, 0, xf, &nm);
        else
            ggemv_body<T, 1, 0, 1>(gq_xs, (const float4 *)(gq_xs + PR * 4), sg, S, K, PR, 1, 0, 0, xf, &nm);
    } else {
        if ((alt >> y) & 1) ggemv_body<T2, MM, 0>(xq2, xm2, sg, S, K, PR2, M, 0, 0);
        else ggemv_body<T, MM, 0>(xq, xm, sg, S, K, PR, M, 0, 0);
    }
}

/* A mixture of experts' chosen experts (cuda_moe.cu), as k_moe_gemv1 does it for the other types: blockIdx.y
 * is pair p = row i * kused + choice, on expert pick[p]'s weights (the table mo) and on row i of the
 * quantized x (gate/up) or row p (down), writing row p of the results.  Q4_K's down projection is held to
 * 64 registers, four blocks a multiprocessor (76 unbounded, three: 9.8 -> 8.6 us a layer of Qwen3-30B-A3B's
 * shape; the other types spill so held, or gain nothing). */
template <int T, int PAIR, int XS, int TL = 0>
__global__ void __launch_bounds__(256, !PAIR && T == LMX_GGML_Q4_K ? 4 : 0)
    k_moe_ggemv(const int4 *__restrict__ xq, const float4 *__restrict__ xm, const gv_segs sg,
                const __grid_constant__ gv_moe mo, const int *pick, int kused, int K, int PR, int act,
                const float *__restrict__ xf, const gv_moe_sum cs) {
    /* pick comes from the launch before gate/up (volatile reads: k_moe_gemv1), and gate/up lets its dependents
     * launch only once past its wait: the down projection reads pick before its own wait, and so loads its
     * first weights while gate/up finishes (ggemv_body's EARLY) */
    if constexpr (PAIR) cuda_pdl_wait();
    cuda_pdl_trigger();
    const int p = blockIdx.y, e = *(volatile const int *)(pick + p), row = PAIR ? p / kused : p;
    gv_segs s = sg;
#pragma unroll
    for (int j = 0; j < (PAIR ? 2 : 1); j++) {
        s.s[j].w = mo.w[j][e];
        s.s[j].y = sg.s[j].y + (int64_t)p * sg.s[j].N;
    }
    if constexpr (XS) { /* the down projection: h's row p quantized here */
        const cuda_row_norm none = {};
        ggemv_body<T, 1, PAIR, 1, TL>(gq_xs, (const float4 *)(gq_xs + PR * 4), s, s.s[0], K, PR, 1, act, 0,
                                      xf + (size_t)row * K, &none);
    } else {
        ggemv_body<T, 1, PAIR, 0, TL>(xq + (size_t)row * PR * 4, xm + (size_t)row * PR, s, s.s[0], K, PR, 1, act, 0);
    }
    if constexpr (!PAIR)
        if (cs.out) moe_sum_tail(cs, sg.s[0].y, kused, sg.s[0].N);
}

/* ---- one row's gate / up experts staged in shared memory -------------------------------------------
 * k_moe_ggemv's gate/up launch for one row holds each lane's units in registers, so a multiprocessor keeps about
 * two thirds of its share of the chosen experts' bytes in flight and the blocks run in two waves, each paying
 * the pick read and the DRAM latency (H100 / H200, Qwen3-30B-A3B's shape: ~10 us for 14.2 MB).  Here block b
 * takes rows [b R, (b + 1) R) of the pairs' rows (pair p's row n is row p N + n, gate and up both) and copies
 * them whole into shared memory by cp.async in up to four groups (a warp a row, with x's quantized row in the
 * first), then its warps take the staged row pairs as k_moe_ggemv's do (lane l the units l, l + 32, ...; the
 * same sums in the same order: the same bits where that launch gives a row one warp), each group as it lands:
 * every byte is requested at once, and the sums of a group overlap the next's copies.  H200, 48 layers of
 * Qwen3-30B-A3B's shape in Q4_K_M: the launch 9.8 -> 8.5 us, decode +6%.  Q4_K / Q5_K (16-byte blocks: 144 / 176
 * bytes), one row of x quantized before (k_moe_quant_route). */
#define MGU_STAGES 4
#define MGU_SMEM (46 << 10) /* a block's rows at most (within the 48 KB a launch takes without raising its limit) */

static __device__ __forceinline__ void mgu_copy16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src));
}
static __device__ __forceinline__ void mgu_wait(int pending) { /* cp.async groups still in flight at most */
    switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
    }
}

/* Unit u (of 64 elements) of a Q4_K / Q5_K block b in shared memory, as gq_unit_k4 loads it from global. */
template <int T> struct mgu_unit : gq_unit_k4<T> {
    __device__ __forceinline__ void load_shared(const uint8_t *b, int u) {
        this->c = u;
        const uint4 *v = (const uint4 *)(b + gq_unit_k4<T>::QS + 32 * u);
        const uint4 v0 = v[0], v1 = v[1];
        this->v[0] = v0.x, this->v[1] = v0.y, this->v[2] = v0.z, this->v[3] = v0.w;
        this->v[4] = v1.x, this->v[5] = v1.y, this->v[6] = v1.z, this->v[7] = v1.w;
        if constexpr (T == LMX_GGML_Q5_K) {
            const uint4 *h = (const uint4 *)(b + 16);
            const uint4 h0 = h[0], h1 = h[1];
            this->hb[0] = h0.x, this->hb[1] = h0.y, this->hb[2] = h0.z, this->hb[3] = h0.w;
            this->hb[4] = h1.x, this->hb[5] = h1.y, this->hb[6] = h1.z, this->hb[7] = h1.w;
        }
        const uint32_t *w = (const uint32_t *)b;
        this->dd = w[0], this->sw[0] = w[1], this->sw[1] = w[2], this->sw[2] = w[3];
    }
};

template <int T>
__global__ void __launch_bounds__(256) k_moe_gu_staged(const int4 *__restrict__ xq, const float4 *__restrict__ xm,
                                                       const __grid_constant__ gv_moe mo, const int *pick, int kused,
                                                       int N, int K, int PR, int R, int act, float *y0, float *y1) {
    extern __shared__ __align__(16) uint8_t mgu_rows[]; /* [R][2][row bytes]: gate, then up; then x's codes, scales */
    __shared__ int e_of[32];
    cuda_pdl_wait(); /* pick and x come from the launch before; the trigger after it, as k_moe_ggemv's gate/up: */
    cuda_pdl_trigger(); /* the down projection reads pick before its own wait */
    constexpr int UP = 2, UPB = gq_traits<T>::PARTS / UP, BYTES = gq_traits<T>::BYTES;
    const int rb = K / gq_traits<T>::ELEMS * BYTES, cpr = rb / 16; /* row bytes, its 16-byte copies */
    const int r0 = blockIdx.x * R, nr = kused * N - r0 < R ? kused * N - r0 : R;
    if (threadIdx.x < (unsigned)kused) e_of[threadIdx.x] = *(volatile const int *)(pick + threadIdx.x);
    __syncthreads();
    const int S = nr < 8 * MGU_STAGES ? (nr + 7) / 8 : MGU_STAGES; /* groups of about 8 rows: a row pair a warp */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, NU = K / 64, W = blockDim.x / 32;
    int4 *sxq = (int4 *)(mgu_rows + (size_t)R * 2 * rb); /* x as gq_quant_x laid it out: [PR * 4], then [PR] */
    float4 *sxm = (float4 *)(sxq + PR * 4);
    for (int c = threadIdx.x; c < PR * 5; c += blockDim.x) /* with the first group */
        if (c < PR * 4) mgu_copy16(sxq + c, xq + c);
        else mgu_copy16(sxm + (c - PR * 4), xm + (c - PR * 4));
    for (int g = 0; g < S; g++) { /* a warp copies a row (gate or up) at a time, its lanes 16 bytes each */
        const int a = g * nr / S, b = (g + 1) * nr / S;
        for (int t = warp; t < (b - a) * 2; t += W) {
            const int lr = a + t / 2, j = t % 2, r = r0 + lr, p = r / N;
            const uint8_t *src = (const uint8_t *)mo.w[j][e_of[p]] + (int64_t)(r - p * N) * rb;
            uint8_t *dst = mgu_rows + ((size_t)lr * 2 + j) * rb;
            for (int c = lane; c < cpr; c += 32) mgu_copy16(dst + 16 * c, src + 16 * c);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    for (int g = 0; g < S; g++) {
        mgu_wait(S - 1 - g);
        __syncthreads();
        for (int lr = g * nr / S + warp; lr < (g + 1) * nr / S; lr += W) {
            float acc[2] = {0.0f, 0.0f};
            for (int pu = lane; pu < NU; pu += 32) {
                mgu_unit<T> wu[2];
#pragma unroll
                for (int j = 0; j < 2; j++)
                    wu[j].load_shared(mgu_rows + ((size_t)lr * 2 + j) * rb + (pu / UPB) * BYTES, pu % UPB);
#pragma unroll
                for (int k = 0; k < UP; k++) {
                    const int pp = pu * UP + k; /* the part, where gq_quant_x laid it out */
                    const int4 *xv = sxq + gq_xchunk(pp, gq_ul(UP));
                    const int4 X[4] = {xv[0], xv[32], xv[64], xv[96]};
                    gq_two_acc(wu, k, X, sxm[gq_xpart(pp, gq_ul(UP))], acc);
                }
            }
#pragma unroll
            for (int j = 0; j < 2; j++)
                for (int o = 16; o > 0; o >>= 1) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
            if (lane == 0) {
                const int r = r0 + lr; /* = p N + n: row n of pair p's results */
                y0[r] = glu_act(acc[0], act) * acc[1];
                y1[r] = acc[1];
            }
        }
    }
}

/* bf16 rows [n0, n0 + rows) of w [N, K] by warps of 256-thread blocks: a warp takes 32 parts (of 32 values) at a
 * time, parts i0 .. i0 + 31 from first (a multiple of 32) by step, lane l part i0 + l.  The warp's 2 KB of bf16 go
 * out through its 2 KB of shared memory (stage) as four 512-byte stores (a lane's own 64 bytes written as four
 * 16-byte stores 64 bytes apart moved half the bytes a request: 2.3 TB/s in all).  Q8_0's 34-byte blocks, 2-byte
 * aligned, come in the same way where rows start at multiples of 4 bytes: the warp's 1,088 bytes as word loads a
 * lane at a time into raw, then each lane's block from there (its own loads were 9 words 34 bytes apart).  TL: w
 * in tiles of 16 rows (LMX_GGML_Q4_K_T16 / Q6_K_T16 as T's blocks), each part decoded from its unit as the GEMVs
 * do. */
#define GDQ_RAW_WORDS(T) ((T) == LMX_GGML_Q8_0 ? 272 : 1) /* a warp's Q8_0 blocks in words: 32 x 34 / 4 */

template <int T, int TL>
static __device__ __forceinline__ void gdequant_rows(__nv_bfloat16 *__restrict__ dst, const uint8_t *__restrict__ w,
                                                     int K, int64_t n0, int64_t rows, int64_t first, int64_t step,
                                                     uint4 *stage, uint32_t *raw) {
    constexpr int BYTES = gq_traits<T>::BYTES, PPB = gq_traits<T>::PARTS;
    const int P = K / 32, lane = threadIdx.x & 31;
    const int64_t row_bytes = (int64_t)(K / gq_traits<T>::ELEMS) * BYTES, total = rows * P;
    const uint8_t *w0 = w + n0 * row_bytes; /* part i's block at w0 + i BYTES when not tiled (row_bytes = P BYTES) */
    const bool staged = T == LMX_GGML_Q8_0 && !TL && ((uintptr_t)w0 & 3) == 0;
    uint4 *o = (uint4 *)dst;
    for (int64_t i0 = first; i0 < total; i0 += step) {
        const int64_t i = i0 + lane, have = total - i0 < 32 ? total - i0 : 32;
        const int64_t n = n0 + i / P;
        const int p = (int)(i % P);
        uint32_t q[8];
        float sc[2], mn[2];
        __syncwarp(); /* the last round's reads of stage and raw are done */
        if (staged) {
            const uint32_t *src = (const uint32_t *)(w0 + i0 * BYTES);
            for (int k = lane; k < (have * BYTES + 3) / 4; k += 32) raw[k] = __ldg(src + k);
            __syncwarp();
            const uint32_t *r = raw + lane * BYTES / 4; /* d at byte 0 (even lanes) or 2 (odd) of r[0], codes after */
            uint32_t v[9];
#pragma unroll
            for (int k = 0; k < 9; k++) v[k] = i < total ? r[k] : 0u;
            const int odd = lane & 1;
#pragma unroll
            for (int k = 0; k < 8; k++) q[k] = odd ? v[k + 1] : __funnelshift_r(v[k], v[k + 1], 16);
            sc[0] = sc[1] = gq_half(v[0], odd), mn[0] = mn[1] = 0.0f;
        } else if (i < total) {
            if constexpr (TL) {
                constexpr int UP = gq_unit<T>::UP;
                gq_unit<T> u;
                u.load_tiled(w + (n / 16 * 16) * row_bytes + (int64_t)(p / PPB) * 16 * BYTES, (int)(n % 16),
                             p % PPB / UP);
                u.part(p % PPB % UP, q, sc, mn);
            } else {
                gq_part<T>(w + n * row_bytes + (int64_t)(p / PPB) * BYTES, p % PPB, q, sc, mn);
            }
        }
        if (i < total) {
            uint32_t out[16];
#pragma unroll
            for (int e = 0; e < 32; e += 2) {
                __nv_bfloat162 v = __floats2bfloat162_rn(gq_value(q, sc, mn, e, T == LMX_GGML_Q8_0),
                                                         gq_value(q, sc, mn, e + 1, T == LMX_GGML_Q8_0));
                out[e / 2] = *reinterpret_cast<uint32_t *>(&v);
            }
#pragma unroll /* chunk k of lane l at stage[4 l + (k ^ (l / 2 % 4))]: no two of a quarter warp's stores on a bank */
            for (int k = 0; k < 4; k++)
                stage[4 * lane + (k ^ (lane >> 1 & 3))] =
                    make_uint4(out[4 * k], out[4 * k + 1], out[4 * k + 2], out[4 * k + 3]);
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < 4; j++) { /* 16-byte chunk c of the warp's 2 KB: part c / 4's chunk c % 4 */
            const int c = lane + 32 * j, pl = c >> 2;
            if (pl < have) o[i0 * 4 + c] = stage[4 * pl + ((c & 3) ^ (pl >> 1 & 3))];
        }
    }
}

/* (blockDim.x 256) */
template <int T, int TL = 0>
__global__ void __launch_bounds__(256) k_gdequant_bf16(__nv_bfloat16 *__restrict__ dst, const uint8_t *__restrict__ w,
                                                       int K, int64_t n0, int64_t rows) {
    __shared__ uint4 stage[8][128];
    __shared__ uint32_t raw[8][GDQ_RAW_WORDS(T)];
    gdequant_rows<T, TL>(dst, w, K, n0, rows, (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) & ~(int64_t)31,
                         (int64_t)gridDim.x * blockDim.x, stage[threadIdx.x / 32], raw[threadIdx.x / 32]);
}

/* weight blockIdx.y of the list, whole, at dst + blockIdx.y stride (blockDim.x 256) */
template <int T, int TL = 0>
__global__ void __launch_bounds__(256) k_gdequant_list(__nv_bfloat16 *__restrict__ dst, int64_t stride,
                                                       const __grid_constant__ cuda_dq_list l, int K, int64_t rows) {
    __shared__ uint4 stage[8][128];
    __shared__ uint32_t raw[8][GDQ_RAW_WORDS(T)];
    gdequant_rows<T, TL>(dst + blockIdx.y * stride, (const uint8_t *)l.data[blockIdx.y], K, 0, rows,
                         (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) & ~(int64_t)31,
                         (int64_t)gridDim.x * blockDim.x, stage[threadIdx.x / 32], raw[threadIdx.x / 32]);
}

/* ---- launch ------------------------------------------------------------------------------------ */

/* The GEMV instances of type T. */
typedef void (*gq_fn)(const int4 *, const float4 *, gv_segs, int, int, int, int, int, const float *, cuda_row_norm);
template <int T> static gq_fn gq_kernel(int M, int pair, int xs) {
    if (xs) return pair ? k_ggemv<T, 1, 1, 1> : k_ggemv<T, 1, 0, 1>;
    if (M == 1) return pair ? k_ggemv<T, 1, 1, 0> : k_ggemv<T, 1, 0, 0>;
    if (M == 2) return pair ? k_ggemv<T, 2, 1, 0> : k_ggemv<T, 2, 0, 0>;
    if (M <= 4) return pair ? k_ggemv<T, 4, 1, 0> : k_ggemv<T, 4, 0, 0>;
    return pair ? k_ggemv<T, 8, 1, 0> : k_ggemv<T, 8, 0, 0>;
}

/* The type's kernels (xs: one row, x quantized in each block), or NULL for types without them. */
static gq_fn gq_pick(int type, int M, int pair, int xs = 0) {
    switch (type) {
#define GQ_PICK(t) case t: return gq_kernel<t>(M, pair, xs);
        GQ_TYPES(GQ_PICK)
#undef GQ_PICK
    case GQ_MLX4: return gq_kernel<GQ_MLX4>(M, pair, xs);
    case GQ_MLX8: return gq_kernel<GQ_MLX8>(M, pair, xs);
    default: return NULL;
    }
}

/* The two-type instances (k_ggemv_mix): the pairs k-quant files mix in one group of weights (X(T, T2)). */
#define GQ_MIXES(X) X(LMX_GGML_Q4_K, LMX_GGML_Q6_K_A16) X(LMX_GGML_Q5_K, LMX_GGML_Q6_K_A16) X(GQ_MLX4, LMX_GGML_Q6_K_A16)
typedef void (*gq_mix_fn)(const int4 *, const float4 *, const int4 *, const float4 *, gv_segs, int, int, int, int, int,
                          const float *, cuda_row_norm);
template <int T, int T2> static gq_mix_fn gq_mix_kernel(int M, int xs) {
    if (xs) return k_ggemv_mix<T, T2, 1, 1>;
    return M == 1   ? k_ggemv_mix<T, T2, 1, 0>
           : M == 2 ? k_ggemv_mix<T, T2, 2, 0>
           : M <= 4 ? k_ggemv_mix<T, T2, 4, 0>
                    : k_ggemv_mix<T, T2, 8, 0>;
}
static gq_mix_fn gq_mix_pick(int t, int t2, int M, int xs) {
#define GQ_MIX(a, b) if (t == a && t2 == b) return gq_mix_kernel<a, b>(M, xs);
    GQ_MIXES(GQ_MIX)
#undef GQ_MIX
    return NULL;
}

/* The block type these kernels take w as (its GGUF type, or GQ_MLX4 / GQ_MLX8: groups of 32, 64 or 128),
 * or 0. */
static int gq_type_of(const lmx_tensor *w) {
    if (w->q.ggml_type) return w->q.ggml_type;
    const int g = w->q.group;
    if ((w->q.bits != 4 && w->q.bits != 8) || (g != 32 && g != 64 && g != 128) || w->shape[1] % g) return 0;
    return w->q.bits == 4 ? GQ_MLX4 : GQ_MLX8;
}

int cuda_ggml_gemv_takes(const lmx_tensor *w, int M) {
    const int type = gq_type_of(w);
    if (w->ndim != 2 || !type || !gq_pick(type, M, 0) || w->shape[1] % (GQ_IS_MLX(type) ? 32 : lmx_ggml_block_elems(type)))
        return 0;
    return M >= 1 && M <= CUDA_GEMV_ROWS;
}

/* Warps sharing each row: the fewest (1, 2, 4, 8) that give two blocks per multiprocessor while
 * every lane keeps two units (UP parts each). */
static int gq_split(const cuda_backend *cb, int N, int K, int UP, int rows_per_block) {
    const int blocks = (int)cuda_blocks(N, rows_per_block), NU = K / 32 / UP;
    int ks = 1;
    while (ks < 8 && blocks * ks < 2 * cb->sm_count && NU >= 64 * ks) ks *= 2;
    return ks;
}

/* Parts of type's units (gq_unit). */
static int gq_unit_parts(int type) {
    switch (type) {
#define GQ_UP(t) case t: return gq_unit<t>::UP;
        GQ_TYPES(GQ_UP)
#undef GQ_UP
    default: return 1; /* GQ_MLX4 / 8 too */
    }
}

/* Output rows a block of type's GEMV takes: rpb (8 warps, rows unsplit) over ks warps a row, times the rows a
 * warp takes in lane groups (gq_lanes). */
static int gq_block_rows(int type, int K, int rpb, int ks) {
    return rpb / ks * (32 / gq_lanes(K / 32 / gq_unit_parts(type), ks));
}

/* Whether a GEMV of M rows of K values in `blocks` blocks quantizes x in each block (XS: one row, K <=
 * GQ_XS_MAX_K, at most four blocks a multiprocessor: beyond, the blocks' repeated quantization costs more than
 * the launch it saves (H100, a 151,936-row head: 2% of a 12-layer mixture of experts' step); LMX_CUDA_GEMV=4
 * turns it off), and the shared memory that takes for layout o. */
static int gq_xs_takes(const cuda_backend *cb, int M, int64_t K, int64_t blocks) {
    return M == 1 && K <= GQ_XS_MAX_K && blocks <= cb->xs_blocks && cb->gemv_variant != 4;
}
/* gq_quant_x (cuda_ggml_x.h) */
int gq_quant_x(cuda_backend *cb, const int *ups, int nl, const float *x, int M, int K, const cuda_row_norm &nm, gq_xq *xo,
               const cuda_moe_router *rt, int nib) {
    int64_t pr[2], room = 0; /* the room of a row of x in each layout, in all */
    for (int j = 0; j < nl; j++) room += pr[j] = gq_row_parts(K, ups[j]);
    float4 *xm = (float4 *)cuda_scratch(cb, CUDA_SCRATCH_XQ, (size_t)M * room * (sizeof(float4) + 64));
    if (!xm) return 0;
    int4 *xq = (int4 *)(xm + (size_t)M * room);
    for (int j = 0; j < nl; j++) {
        xo[j] = gq_xq{xq, xm, (int)pr[j], gq_ul(ups[j]), nib};
        xq += (size_t)M * pr[j] * 4, xm += (size_t)M * pr[j];
    }
    const gq_xq o1 = nl > 1 ? xo[1] : gq_xq{};
    const int64_t P = K / 32;
    if (rt)
        cuda_launch(cb, k_moe_quant_route, dim3(cuda_blocks(P, 32), 2 * M), 256, 0, x, xo[0], K, nm, *rt);
    else
        cuda_launch(cb, k_gquant_x, dim3(cuda_blocks(P, 32), M), 256, 0, x, xo[0], o1, K, nm);
    return 1;
}

lmx_status cuda_gemv_ggml(cuda_backend *cb, int n, const lmx_tensor *const *ws, const lmx_tensor *const *biases,
                          float *const *ys, const float *x, int M, int glu, const cuda_gemv_opts *opts) {
    const int64_t K = ws[0]->shape[1];
    /* the group's types (one, or for weights without GLU two: segment i's is types[ti[i]]) and the layouts of x
     * they read (ups: their units' parts; a type's layout is lay[its index]) */
    int types[3], ti[3], nt = 0, ups[3], lay[3], nl = 0;
    for (int i = 0; i < n; i++) {
        const int t = gq_type_of(ws[i]);
        if (!cuda_ggml_gemv_takes(ws[i], M) || ws[i]->shape[1] != K) return LMX_ERR_UNSUPPORTED;
        int k = 0;
        while (k < nt && types[k] != t) k++;
        if (k == nt) types[nt++] = t;
        ti[i] = k;
    }
    if (nt > 2 || (nt > 1 && glu >= 0)) return LMX_ERR_UNSUPPORTED;
    /* one row of MLX 4-bit goes to the stream (cuda_gstream below) where the launch has weights enough (at least
     * stream_min) and no combine to fold in.  Measured on an H100, tok/s, stream / int16: Qwen3-0.6B (launches
     * of 2-6M weights) MLX 4-bit 1,412-1,416 / 1,517-1,537, its GGUF Q4_0 as MLX groups 1,316-1,337 /
     * 1,476-1,491; Llama-3.1-8B Q4_K_M (17-117M) 367-372 / 334-337 */
    int64_t weights = 0;
    for (int i = 0; i < n; i++) weights += ws[i]->shape[0] * K;
    const int stream = M == 1 && weights >= cb->stream_min;
    /* MLX groups beside GGUF blocks (a Q4_K_M file's q and k as cuda_repack.cu rewrote them, its Q6_K v): one
     * launch where the MLX groups would not take the stream, else one each */
    if (nt > 1 && (GQ_IS_MLX(types[0]) || GQ_IS_MLX(types[1])) && stream) return LMX_ERR_UNSUPPORTED;
    for (int k = 0; k < nt; k++) {
        const int up = gq_unit_parts(types[k]);
        int j = 0;
        while (j < nl && ups[j] != up) j++;
        if (j == nl) ups[nl++] = up;
        lay[k] = j;
    }
    int norm, resid, lora;
    if (gv_opts_check(opts, M == 1, n, glu, K, &norm, &resid, &lora)) return LMX_ERR_UNSUPPORTED;
    gv_segs sg;
    memset(&sg, 0, sizeof sg);
    const lmx_tensor *mlx = NULL; /* the first MLX weight: the group size and scale dtype of all of them */
    for (int i = 0; i < n && !mlx; i++)
        if (!ws[i]->q.ggml_type) mlx = ws[i];
    sg.group = mlx ? mlx->q.group : 0;
    sg.sdt = mlx ? mlx->q.scale_dtype : LMX_DTYPE_F32;
    for (int i = 0; i < n; i++) {
        const lmx_tensor *w = ws[i];
        if (w->ndim != 2 || (!w->q.ggml_type && (w->q.group != sg.group || w->q.scale_dtype != sg.sdt)))
            return LMX_ERR_UNSUPPORTED;
        gv_seg_set(&sg.s[i], w, biases[i], ys[i], opts, i, lora);
    }
    if (glu >= 0 && sg.s[0].N != sg.s[1].N) return LMX_ERR_UNSUPPORTED;
    if (stream && nt == 1 && types[0] == GQ_MLX4 && cuda_gstream_takes(cb, ws[0]))
        return cuda_gstream(cb, n, sg, glu, x, (int)K, gv_row_norm(opts), resid);
    const int rpb = glu >= 0 ? 8 : 16; /* output rows of a block of 8 warps, unsplit */
    unsigned gx[2] = {1, 1}; /* blocks of each type's segments */
    int64_t busy = 0;        /* blocks with rows to compute */
    for (int i = 0; i < n; i++) {
        const int type = types[ti[i]], ks = gq_split(cb, sg.s[i].N, (int)K, gq_unit_parts(type), rpb);
        sg.s[i].ks = ks;
        const unsigned b = cuda_blocks(sg.s[i].N, gq_block_rows(type, (int)K, rpb, ks));
        if (b > gx[ti[i]]) gx[ti[i]] = b;
        if (glu < 0 || i == 0) busy += b;
    }
    const int act = glu < 0 ? 0 : glu;
    const cuda_row_norm nm = gv_row_norm(opts);
    /* one row: each block quantizes x itself (ggemv_body's XS) */
    const int xs = gq_xs_takes(cb, M, K, busy);
    gq_xq xo[2];
    for (int j = 0; xs && j < nl; j++) xo[j] = gq_xq{NULL, NULL, (int)gq_row_parts(K, ups[j]), 0};
    if (!xs && !gq_quant_x(cb, ups, nl, x, M, (int)K, nm, xo)) return cb->base.err.status;
    const char *what = glu >= 0 ? "matmul + glu" : "matmul";
    if (nt == 1) {
        /* one row of a long Q6_K row as a stream (cuda_gstream.cu; H100, Llama-3.1-8B Q4_K_M decode, its 16 Q6_K
         * down projections: 383 -> 393 tok/s) */
        if (stream && !xs && cuda_gstream6_takes(cb, types[0], n, glu, sg, K))
            return cuda_gstream6(cb, sg, xo[0], (int)K, resid);
        cuda_launch(cb, gq_pick(types[0], M, glu >= 0, xs), dim3(gx[0], glu >= 0 ? 1 : n), 256, gq_xs_bytes(xs, xo[0]),
                    (const int4 *)xo[0].xq, (const float4 *)xo[0].xm, sg, (int)K, xo[0].PR, M, act, resid, x, nm);
        return cuda_check_launch(cb, what);
    }
    /* two types: one launch where an instance takes the pair, else one launch of each type's segments */
    for (int f = 0; f < 2; f++) {
        const int a = f, b = 1 - f; /* a: the instance's T */
        gq_mix_fn k = gq_mix_pick(types[a], types[b], M, xs);
        if (!k) continue;
        int alt = 0;
        for (int i = 0; i < n; i++) alt |= (ti[i] == b) << i;
        const gq_xq &xa = xo[lay[a]], &xb = xo[lay[b]];
        const size_t smem = gq_xs_bytes(xs, xa.PR > xb.PR ? xa : xb);
        cuda_launch(cb, k, dim3(gx[0] > gx[1] ? gx[0] : gx[1], n), 256, smem, (const int4 *)xa.xq, (const float4 *)xa.xm,
                    (const int4 *)xb.xq, (const float4 *)xb.xm, sg, alt, (int)K, xa.PR, xb.PR, M, x, nm);
        return cuda_check_launch(cb, what);
    }
    for (int k = 0; k < nt; k++) {
        gv_segs sk = sg;
        int c = 0;
        for (int i = 0; i < n; i++)
            if (ti[i] == k) sk.s[c++] = sg.s[i];
        const gq_xq &xk = xo[lay[k]];
        cuda_launch(cb, gq_pick(types[k], M, 0, xs), dim3(gx[k], c), 256, gq_xs_bytes(xs, xk), (const int4 *)xk.xq,
                    (const float4 *)xk.xm, sk, (int)K, xk.PR, M, 0, 0, x, nm);
        lmx_status st = cuda_check_launch(cb, what);
        if (st) return st;
    }
    return LMX_OK;
}

/* ---- mixture of experts (cuda_moe.cu) ------------------------------------------------------------ */

typedef void (*gq_moe_fn)(const int4 *, const float4 *, gv_segs, gv_moe, const int *, int, int, int, int, const float *,
                          gv_moe_sum);
static gq_moe_fn gq_moe_pick(int type, int pair, int xs = 0) {
    switch (type) {
#define GQ_MOE(t) case t: return pair ? k_moe_ggemv<t, 1, 0> : xs ? k_moe_ggemv<t, 0, 1> : k_moe_ggemv<t, 0, 0>;
        GQ_TYPES(GQ_MOE)
#undef GQ_MOE
#define GQ_MOE_T(tt, t) case tt: return pair ? k_moe_ggemv<t, 1, 0, 1> : xs ? k_moe_ggemv<t, 0, 1, 1> : k_moe_ggemv<t, 0, 0, 1>;
        GQ_MOE_T(LMX_GGML_Q4_K_T16, LMX_GGML_Q4_K)
        GQ_MOE_T(LMX_GGML_Q6_K_T16, LMX_GGML_Q6_K_A16)
#undef GQ_MOE_T
    default: return NULL;
    }
}

int cuda_moe_ggemv_takes(const lmx_tensor *experts, int E) {
    if (E < 1 || E > GV_MOE_MAX) return 0;
    for (int j = 0; j < 3; j++) { /* every expert is stored as expert 0 (lmx_moe_args.alike); gate and up alike */
        const lmx_tensor *w = &experts[j];
        if (!w->q.ggml_type || w->q.ggml_type != experts[j == 2 ? 2 : 0].q.ggml_type || w->ndim != 2 ||
            !gq_moe_pick(w->q.ggml_type, 0) || w->shape[1] % lmx_ggml_block_elems(w->q.ggml_type))
            return 0;
    }
    return 1;
}

/* Rows a block of k_moe_gu_staged takes for one row's pairs of gate/up experts of type (N rows of K each, every
 * expert 16-byte aligned: al16), or 0 where it does not take them (another type, more than 32 pairs (its table of
 * their experts), a row pair beyond MGU_SMEM, or LMX_CUDA_MOE_STAGED=0): about three blocks a multiprocessor.  Its
 * rows are whole blocks (cuda_moe_ggemv_takes) of 144 (Q4_K) or 176 (Q5_K) bytes, so whole 16-byte copies.  (Experts
 * in tiles take cuda_moe_tiles_gu, cuda_moe_mma.cu.) */
static int mgu_rows_per_block(const cuda_backend *cb, int type, int N, int K, int pairs, int al16) {
    if (!cb->moe_staged || !al16 || (type != LMX_GGML_Q4_K && type != LMX_GGML_Q5_K) || pairs > 32) return 0;
    const int64_t rb = (int64_t)lmx_ggml_row_bytes(type, K);
    const int64_t xb = gq_xs_bytes(1, gq_xq{NULL, NULL, (int)gq_row_parts(K, 2), 0}); /* x staged beside the rows */
    if (2 * rb + xb > MGU_SMEM) return 0;
    const int64_t rows = (int64_t)pairs * N, fit = (MGU_SMEM - xb) / (2 * rb);
    int64_t R = (rows + 3 * cb->sm_count - 1) / (3 * cb->sm_count);
    return (int)(R < fit ? R : fit);
}

lmx_status cuda_moe_ggemv(cuda_backend *cb, const lmx_tensor *experts, int E, int down, const int *pick, int pairs,
                          int kused, const float *x, int rows, float *y0, float *y1, int act,
                          const cuda_moe_router *rt, const cuda_row_norm *nm, const gv_moe_sum *sum) {
    const lmx_tensor *w0 = &experts[down ? 2 : 0];
    const int stored = w0->q.ggml_type, N = (int)w0->shape[0], K = (int)w0->shape[1];
    const int type = cuda_moe_blocks(stored);
    gv_moe tab; /* 12 KiB of pointers, passed by value */
    gv_moe_fill(&tab, experts, E, down);
    int al16 = 1; /* every expert's rows 16-byte aligned (the staged copies) */
    for (int e = 0; e < E; e++)
        for (int j = 0; j < (down ? 1 : 2); j++) al16 &= (uintptr_t)tab.w[j][e] % 16 == 0;
    gv_segs sg;
    memset(&sg, 0, sizeof sg);
    const int rpb = down ? 16 : 8; /* output rows of a block of 8 warps, unsplit */
    const int ks = gq_split(cb, N * pairs, K, gq_unit_parts(type), rpb);
    for (int j = 0; j < 2; j++) {
        sg.s[j].N = N;
        sg.s[j].ks = ks;
        sg.s[j].bt = LMX_DTYPE_F32;
        sg.s[j].y = j ? y1 : y0;
    }
    const int block_rows = gq_block_rows(type, K, rpb, ks);
    const dim3 grid(cuda_blocks(N, block_rows), (unsigned)pairs);
    gv_moe_sum cs = {};
    if (down && sum) { /* tickets [CUDA_MOE_PAIRS, row blocks]: one size for every launch of these experts */
        cs = *sum;
        cs.rows = block_rows;
        cs.ticket = (int *)cuda_scratch(cb, CUDA_SCRATCH_MOE_TICKET, (size_t)CUDA_MOE_PAIRS * grid.x * sizeof(int));
        if (!cs.ticket) return cb->base.err.status;
    }
    const int up = gq_unit_parts(type), xs = down && gq_xs_takes(cb, 1, K, (int64_t)grid.x * grid.y); /* down: XS */
    gq_xq xo = {NULL, NULL, (int)gq_row_parts(K, up), 0};
    if (!xs && !gq_quant_x(cb, &up, 1, x, rows, K, nm ? *nm : cuda_row_norm{}, &xo, rt)) return cb->base.err.status;
    const int R = down || rows != 1 ? 0 : mgu_rows_per_block(cb, stored, N, K, pairs, al16);
    if (R) {
        cuda_launch(cb, type == LMX_GGML_Q4_K ? k_moe_gu_staged<LMX_GGML_Q4_K> : k_moe_gu_staged<LMX_GGML_Q5_K>,
                    dim3((unsigned)cuda_blocks((int64_t)pairs * N, R)), 256,
                    R * 2 * lmx_ggml_row_bytes(type, K) + gq_xs_bytes(1, xo),
                    (const int4 *)xo.xq, (const float4 *)xo.xm, tab, pick, kused, N, K, xo.PR, R, act, y0, y1);
        return cuda_check_launch(cb, "moe gate/up");
    }
    cuda_launch(cb, gq_moe_pick(stored, !down, xs), grid, 256, gq_xs_bytes(xs, xo), (const int4 *)xo.xq,
                (const float4 *)xo.xm, sg, tab, pick, kused, K, xo.PR, act, x, cs);
    return cuda_check_launch(cb, down ? "moe down" : "moe gate/up");
}

template <int T, int TL = 0>
static void gq_dequant_launch(cuda_backend *cb, __nv_bfloat16 *dst, const lmx_tensor *w, int64_t n0, int64_t rows) {
    const int64_t parts = rows * (w->shape[1] / 32), nb = (parts + 255) / 256;
    k_gdequant_bf16<T, TL><<<(unsigned)(nb < 16384 ? nb : 16384), 256, 0, cb->stream>>>(
        dst, (const uint8_t *)w->data, (int)w->shape[1], n0, rows);
}

template <int T, int TL = 0>
static void gq_dequant_list_launch(cuda_backend *cb, const lmx_tensor *w0, const cuda_dq_list &l, int n,
                                   __nv_bfloat16 *dst, int64_t stride) {
    const int64_t parts = w0->shape[0] * (w0->shape[1] / 32), nb = (parts + 255) / 256;
    k_gdequant_list<T, TL><<<dim3((unsigned)(nb < 4096 ? nb : 4096), (unsigned)n), 256, 0, cb->stream>>>(
        dst, stride, l, (int)w0->shape[1], w0->shape[0]);
}

lmx_status cuda_ggml_dequant_bf16(cuda_backend *cb, const lmx_tensor *w, int64_t n0, int64_t rows, __nv_bfloat16 *dst) {
    switch (w->q.ggml_type) {
#define GQ_DEQUANT(t) case t: gq_dequant_launch<t>(cb, dst, w, n0, rows); break;
        GQ_TYPES(GQ_DEQUANT)
#undef GQ_DEQUANT
    case LMX_GGML_Q4_K_T16: gq_dequant_launch<LMX_GGML_Q4_K, 1>(cb, dst, w, n0, rows); break;
    case LMX_GGML_Q6_K_T16: gq_dequant_launch<LMX_GGML_Q6_K_A16, 1>(cb, dst, w, n0, rows); break;
    default: return LMX_ERR_UNSUPPORTED;
    }
    return cuda_check_launch(cb, "dequantize");
}

lmx_status cuda_ggml_dequant_list(cuda_backend *cb, const lmx_tensor *w0, const cuda_dq_list &l, int n,
                                  __nv_bfloat16 *dst, int64_t stride) {
    switch (w0->q.ggml_type) {
#define GQ_DEQUANT(t) case t: gq_dequant_list_launch<t>(cb, w0, l, n, dst, stride); break;
        GQ_TYPES(GQ_DEQUANT)
#undef GQ_DEQUANT
    case LMX_GGML_Q4_K_T16: gq_dequant_list_launch<LMX_GGML_Q4_K, 1>(cb, w0, l, n, dst, stride); break;
    case LMX_GGML_Q6_K_T16: gq_dequant_list_launch<LMX_GGML_Q6_K_A16, 1>(cb, w0, l, n, dst, stride); break;
    default: return LMX_ERR_UNSUPPORTED;
    }
    return cuda_check_launch(cb, "dequantize");
}
