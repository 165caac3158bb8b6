/* cuda_gemv.cu - y[M, N] = x[M, K] @ w[N, K]^T (+ bias) for few rows (decode): every weight byte is
 * read once, with 16-byte loads, f32 accumulation and the bias fused.
 *
 * Three kernel families:
 *   k_gemv1  one input row (the decode step of one sequence), every vector format: x staged in
 *            shared memory, optionally as the RMSNorm of x (the norm op folded in), the result
 *            optionally added into the residual (the add op folded in); see its section;
 *   k_gemv   dense, 2 to 8 input rows (batched decode): a warp takes R consecutive output rows (each
 *            x vector it loads serves R rows), lanes stride over the rows' 16-byte vectors;
 *   k_qgemv  MLX 4 / 8 bit, 2 to 8 input rows: the same with lanes on consecutive packed words.
 * k_gemv1 and the launches are here; k_gemv and k_qgemv are in cuda_gemv_rows.cu.
 * One launch may cover up to 3 weights of the same input (fused q/k/v or gate/up in decode graphs;
 * blockIdx.y picks the weight, or in k_gemv1 the weights' blocks follow one another), and gate/up may end
 * in the GLU (a warp takes row n of both and writes act(gate . x) * (up . x)).  Under programmatic
 * dependent launch a warp loads its first weight vectors (k_gemv1: two steps of them where that is its whole
 * row) before it waits for the kernel that writes x, so weight streaming starts while the previous kernel
 * drains.
 *
 * Formats: dense bf16 / f16 / f32 (K a multiple of the vector), MLX affine 4 and 8 bit (groups of
 * whole words); GGUF blocks go to cuda_ggml.cu.  Everything else (2-bit, odd shapes) takes
 * k_gemv_any (cuda_gemv_any.cu), one element at a time. */
#include "cuda_gemv.h"

/* ---- one input row (decode, M = 1) ------------------------------------------------------------- */
/* One kernel for every format.  The block stages x in shared memory, 4 floats of padding after
 * every 32 so that lanes reading the x under consecutive 16-byte vectors meet no bank conflict;
 * with NORM it stages rmsnorm(x) instead (the norm op folded in, the arithmetic of k_rmsnorm_block
 * and k_rmsnorm_warp), and for quantized weights also the sum of every 16 values.  Lane l takes the
 * 16-byte vectors l, l + 32, ... of each of the warp's R rows, U of them per row and step, the next
 * step's (and their raw scales and biases) in flight while the current ones are used.  When the rows
 * alone would not fill the GPU, KS warps share each row, warp k taking the vectors 32 k + l,
 * 32 (KS + k) + l, ...; their sums meet in shared memory (KS depends only on the weight's shape, so
 * a weight gives the same bits in any launch).  Results are stored, or go through the GLU (the
 * gate/up pair), or with RESID are added into y (the residual add folded in: y += W x + b). */

#define G1_PAD(k) ((k) + ((k) >> 5) * 4)

template <int KIND> struct g1 {
    static constexpr bool Q = KIND == GV_Q4 || KIND == GV_Q8;
    static constexpr int E = KIND == GV_Q4 ? 32 : KIND == GV_Q8 ? 16 : KIND == GV_F32 ? 4 : 8; /* per vector */
    static constexpr int BYTES_PER_8 = KIND == GV_Q4 ? 4 : KIND == GV_Q8 ? 8 : KIND == GV_F32 ? 32 : 16;
    static constexpr int R = 2, U = 2; /* rows per warp, vectors per row and step */
};
template <int KIND> struct g1_wt { typedef __nv_bfloat16 T; };
template <> struct g1_wt<GV_F16> { typedef __half T; };
template <> struct g1_wt<GV_F32> { typedef float T; };

static size_t g1_smem(int kind, int64_t K) {
    return ((size_t)G1_PAD(K) + (kind == GV_Q4 || kind == GV_Q8 ? (size_t)K / 16 : 0)) * sizeof(float);
}

/* w . x over one vector (quantized: sum(code * x) with the codes decode_word leaves), in independent
 * partial sums so that the FMA latency overlaps (one chain per word, or per half vector). */
template <int KIND>
static __device__ __forceinline__ float g1_dot(const uint4 &w, const float *xp) {
    if constexpr (g1<KIND>::Q) {
        constexpr int BITS = KIND == GV_Q4 ? 4 : 8, PER = 32 / BITS;
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
        float d[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float qf[PER];
            decode_word<BITS>(words[i], qf);
            d[i] = 0.0f;
#pragma unroll
            for (int e = 0; e < PER; e += 4) {
                const float4 t = *(const float4 *)(xp + i * PER + e);
                d[i] = fmaf(qf[e], t.x, d[i]);
                d[i] = fmaf(qf[e + 1], t.y, d[i]);
                d[i] = fmaf(qf[e + 2], t.z, d[i]);
                d[i] = fmaf(qf[e + 3], t.w, d[i]);
            }
        }
        return (d[0] + d[1]) + (d[2] + d[3]);
    } else {
        constexpr int E = g1<KIND>::E;
        float wf[E], d[2] = {0.0f, 0.0f};
        vec_traits<typename g1_wt<KIND>::T>::unpack(w, wf);
#pragma unroll
        for (int e = 0; e < E; e += 4) {
            const float4 t = *(const float4 *)(xp + e);
            float &a = d[(e / 4) & 1];
            a = fmaf(wf[e], t.x, a);
            a = fmaf(wf[e + 1], t.y, a);
            a = fmaf(wf[e + 2], t.z, a);
            a = fmaf(wf[e + 3], t.w, a);
        }
        return d[0] + d[1];
    }
}

/* Whether the lanes of a warp's slice kslice of a row of nv vectors (vectors 32 kslice + lane, + vstride a step of
 * u) all have exactly two steps: gemv1_body's TWO loads both before its wait; the host picks that instance where
 * some warp does (g1_two). */
static __host__ __device__ __forceinline__ bool g1_two_steps(int nv, int kslice, int vstride, int u) {
    return 32 * kslice + 31 + vstride * u < nv && 32 * kslice + 2 * vstride * u >= nv;
}

/* The block's work: weight S (PAIR: sg.s[0] and sg.s[1]) over x; k_gemv1 and k_moe_gemv1 around it. */
template <int KIND, int PAIR, int NORM, int RESID, int LORA, int UW = g1<KIND>::U, int TWO = 0>
static __device__ __forceinline__ void gemv1_body(const float *__restrict__ x, const gv_segs &sg, const gv_seg &S, int K,
                                                  int act, const cuda_row_norm &nm, int bx) {
    extern __shared__ float xsm[]; /* [G1_PAD(K)] x; quantized: then [K / 16] sums */
    __shared__ float part[8];
    constexpr bool Q = g1<KIND>::Q;
    constexpr int E = g1<KIND>::E, R = g1<KIND>::R, U = UW, RO = PAIR ? R / 2 : R;
    __shared__ float red[8][R];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, KS = S.ks, kslice = warp % KS;
    const int n0 = (bx * (8 / KS) + warp / KS) * RO;
    const bool active = n0 < S.N; /* a warp past the end still helps to stage x */
    const int nv = K / E, vstride = 32 * KS; /* a warp's vectors: 32 kslice + lane + vstride * i */
    const int64_t row_bytes = (int64_t)K * g1<KIND>::BYTES_PER_8 / 8;
    const int vpg = Q ? sg.group / E : 1, gpr = Q ? K / sg.group : 1, lvpg = __ffs(vpg) - 1;
    /* row r: weight row n0 + r (the pair: rows n0 + r % RO of gate, then of up), clamped at the end */
    const uint4 *wp[R];
    int gi[R]; /* first group of row r */
    const void *sp[2] = {PAIR ? sg.s[0].scales : S.scales, PAIR ? sg.s[1].scales : S.scales};
    const void *bp[2] = {PAIR ? sg.s[0].biases : S.biases, PAIR ? sg.s[1].biases : S.biases};
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int sel = PAIR && r >= RO;
        const int n = n0 + (PAIR ? r % RO : r), row = n < S.N ? n : S.N - 1;
        wp[r] = (const uint4 *)((const char *)(PAIR ? sg.s[sel].w : S.w) + row * row_bytes);
        gi[r] = row * gpr;
    }
    uint4 cw[U][R];
    uint32_t cs[U][R], cb[U][R];
    auto load = [&](uint4 (&w)[U][R], uint32_t (&sc)[U][R], uint32_t (&bi)[U][R], int v) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int vu = v + vstride * u < nv ? v + vstride * u : nv - 1;
#pragma unroll
            for (int r = 0; r < R; r++) {
                w[u][r] = __ldcs(wp[r] + vu);
                if constexpr (Q) {
                    const int sel = PAIR && r >= RO, g = gi[r] + (vu >> lvpg);
                    sc[u][r] = raw_at(sp[sel], sg.sdt, g);
                    bi[u][r] = raw_at(bp[sel], sg.sdt, g);
                }
            }
        }
    };
    int v = 32 * kslice + lane;
    if (active && v < nv) load(cw, cs, cb, v);
    /* TWO (dense), where every lane of the warp has exactly two steps of vectors: the second step's are loaded
     * before the wait too, so that they arrive while the block stages x (and computes the norm) instead of after.
     * The same vectors in the same order: the same bits.  Qwen3-0.6B bf16 one row on an H100: its q/k/v,
     * gate/up and head (rows of 1,024) +1-3%, and its down projection (3,072, wide) 3-6% more: bench/RESULTS.md. */
    const bool two = TWO != 0 && !Q && active && g1_two_steps(nv, kslice, vstride, U);
    uint4 w2[U][R];
    uint32_t s2[U][R], b2[U][R];
    if (two) load(w2, s2, b2, v + vstride * U);
    if constexpr (LORA != 0) /* the expand's rows of B, read in the epilogue: into L2 meanwhile (no registers held) */
        if (lane < RO && active)
#pragma unroll
            for (int j = 0; j < (PAIR ? 2 : 1); j++) {
                const gv_seg &L = PAIR ? sg.s[j] : S;
                const int n = n0 + lane;
                if (L.lb && n < S.N) asm volatile("prefetch.global.L2 [%0];" ::"l"(L.lb + (int64_t)n * L.lr));
            }
    if constexpr (NORM != 0) /* the norm's weights + add_one, a weight read before the wait (each thread its own) */
        for (int i = tid; i < K; i += 256) xsm[G1_PAD(i)] = cuda_elem(nm.w, nm.wt, i) + nm.add_one;
    cuda_pdl_wait(); /* x is ready */

    if constexpr (NORM != 0) { /* rmsnorm(x), as the norm kernels compute it */
        const float inv = cuda_rms_inv256(x, K, nm.eps, part);
        for (int i = tid; i < K; i += 256) xsm[G1_PAD(i)] = x[i] * inv * xsm[G1_PAD(i)];
    } else {
        for (int i = tid; i < K / 4; i += 256) *(float4 *)(xsm + G1_PAD(4 * i)) = __ldg((const float4 *)x + i);
    }
    float *sums = xsm + G1_PAD(K);
    if constexpr (Q) {
        __syncthreads();
        for (int c = tid; c < K / 16; c += 256) {
            const float *p = xsm + G1_PAD(16 * c);
            float t = 0.0f;
#pragma unroll
            for (int j = 0; j < 16; j++) t += p[j];
            sums[c] = t;
        }
    }
    __syncthreads();

    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    auto step = [&](const uint4 (&w)[U][R], const uint32_t (&sc)[U][R], const uint32_t (&bi)[U][R], int v0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int vu = v0 + vstride * u;
            if (vu >= nv) break;
            const float *xp = xsm + G1_PAD(vu * E);
            if constexpr (Q) {
                const float xsum = KIND == GV_Q4 ? sums[2 * vu] + sums[2 * vu + 1] : sums[vu];
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const float d = g1_dot<KIND>(w[u][r], xp);
                    acc[r] = KIND == GV_Q4 ? qacc<4>(acc[r], sc[u][r], bi[u][r], sg.sdt, d, xsum)
                                           : qacc<8>(acc[r], sc[u][r], bi[u][r], sg.sdt, d, xsum);
                }
            } else {
#pragma unroll
                for (int r = 0; r < R; r++) acc[r] += g1_dot<KIND>(w[u][r], xp);
            }
        }
    };
    if (two) {
        step(cw, cs, cb, v);
        step(w2, s2, b2, v + vstride * U);
    }
    for (; active && !two && v < nv; v += vstride * U) {
        const bool more = v + vstride * U < nv;
        uint4 nw[U][R];
        uint32_t ns[U][R], nb[U][R];
        if (more) load(nw, ns, nb, v + vstride * U);
        step(cw, cs, cb, v);
        if (more)
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < R; r++) {
                    cw[u][r] = nw[u][r];
                    cs[u][r] = ns[u][r];
                    cb[u][r] = nb[u][r];
                }
    }
    /* the sums of each row: lanes, then the KS warps sharing it (in order) */
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = cuda_warp_sum(acc[r]);
    if (KS > 1) {
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < R; r++) red[warp][r] = acc[r];
        __syncthreads();
        if (kslice != 0) return;
#pragma unroll
        for (int r = 0; r < R; r++) {
            acc[r] = red[warp][r];
            for (int k = 1; k < KS; k++) acc[r] += red[warp + k][r];
        }
    }
    /* the value of row r (lane 0) as the result leaves it in y */
    auto row_out = [&](int r, int n) {
        float o = acc[r] + bias_at(S.bias, S.bt, n);
        if constexpr (LORA != 0)
            if (S.lb) o = o + gv_lora_term(S, n);
        return RESID ? S.y[n] + o : o;
    };
    if constexpr (PAIR == 0) {
        if (S.ym) { /* y also into host memory (read_ahead; ks 1): the block's rows as one write, not one a warp */
            if (lane == 0 && active)
#pragma unroll
                for (int r = 0; r < R; r++)
                    if (n0 + r < S.N) S.y[n0 + r] = red[warp][r] = row_out(r, n0 + r);
            __syncthreads();
            const int b0 = bx * 8 * R, cnt = S.N - b0 < 8 * R ? S.N - b0 : 8 * R;
            if (tid < cnt) S.ym[b0 + tid] = red[tid / R][tid % R];
            return;
        }
    }
    if (lane != 0 || !active) return;
    if constexpr (PAIR != 0) {
#pragma unroll
        for (int o = 0; o < RO; o++) {
            const int n = n0 + o;
            if (n < S.N) {
                float g = acc[o] + bias_at(sg.s[0].bias, sg.s[0].bt, n);
                float u = acc[o + RO] + bias_at(sg.s[1].bias, sg.s[1].bt, n);
                if constexpr (LORA != 0) { /* as the lora op then adds to each, before the GLU */
                    if (sg.s[0].lb) g = g + gv_lora_term(sg.s[0], n);
                    if (sg.s[1].lb) u = u + gv_lora_term(sg.s[1], n);
                }
                sg.s[0].y[n] = glu_act(g, act) * u;
                sg.s[1].y[n] = u;
            }
        }
    } else {
#pragma unroll
        for (int r = 0; r < R; r++)
            if (n0 + r < S.N) S.y[n0 + r] = row_out(r, n0 + r);
    }
}

/* k_gemv1's grid: the blocks of its weights one after another (sg.b1, sg.b2 the first of weights 1 and 2).  The
 * weight of this block, and the block's index among that weight's (bx). */
static __device__ __forceinline__ int g1_seg(const gv_segs &sg, int &bx) {
    const int b = (int)blockIdx.x, i = b >= sg.b2 ? 2 : b >= sg.b1;
    bx = b - (i == 2 ? sg.b2 : i ? sg.b1 : 0);
    return i;
}

template <int KIND, int PAIR, int NORM, int RESID, int LORA, int TWO>
__global__ void __launch_bounds__(256, g1<KIND>::Q ? 2 : 4) k_gemv1(const float *__restrict__ x, const gv_segs sg, int K, int act,
                                               const cuda_row_norm nm) {
    cuda_pdl_trigger();
    int bx;
    const int i = g1_seg(sg, bx);
    gemv1_body<KIND, PAIR, NORM, RESID, LORA, g1<KIND>::U, TWO>(x, sg, seg_pick(sg, i), K, act, nm, bx);
}

/* A dense weight whose blocks are at most one a multiprocessor (the o and down projections of a small model:
 * N = 1024, 128 blocks) streams only what eight warps keep in flight: two 16-byte vectors a row and lane, 16 KB
 * a multiprocessor.  With the registers the GPU has to spare at one block a multiprocessor (k_gemv1's 64 are
 * for four), this form keeps four in flight and loads four before its wait (where K splits into four vectors a
 * lane: all of a row), or two steps of four where a lane's row is two (TWO: the 0.6B's down projection, K =
 * 3,072).  Its vectors are taken in the same order, so its bits are k_gemv1's (Qwen3-0.6B bf16 one row +1.5% on
 * an H100, and 3-6% more with the second step: bench/RESULTS.md). */
#define G1_WIDE_U 4 /* k_gemv1_wide's vectors a lane and row in flight */
template <int KIND, int NORM, int RESID>
__global__ void __launch_bounds__(256, 2) k_gemv1_wide(const float *__restrict__ x, const gv_segs sg, int K, int act,
                                                      const cuda_row_norm nm) {
    cuda_pdl_trigger();
    int bx;
    const int i = g1_seg(sg, bx);
    gemv1_body<KIND, 0, NORM, RESID, 0, G1_WIDE_U, 1>(x, sg, seg_pick(sg, i), K, act, nm, bx);
}

/* ---- mixture of experts: the chosen experts of a few rows (decode) ------------------------------- */
/* One launch runs the gate/up pair (with the GLU) or the down projection of every (row, choice) pair:
 * blockIdx.y is pair p = row i * kused + choice, whose expert pick[p] the routing kernel wrote, and the
 * block does k_gemv1's work on that expert's weights (read through the pointer tables mo, a kernel
 * parameter read in place) and on row i of x (gate/up) or row p (down), writing row p of the results.
 * Only the chosen experts' bytes are read, and the routing never goes through the host. */

template <int KIND, int PAIR>
__global__ void __launch_bounds__(256, g1<KIND>::Q ? 2 : 4)
    k_moe_gemv1(const float *__restrict__ x, const gv_segs sg, const __grid_constant__ gv_moe mo,
                const int *pick, int kused, int K, int act) {
    /* pick comes from the routing, the launch before gate/up, and gate/up lets its dependents launch only once
     * past its wait: the down projection reads pick before its own wait and so loads its first weights while
     * gate/up finishes (as k_moe_ggemv).  A volatile load: a read-only one (pick is restrict-free for this
     * reason) may be hoisted above gate/up's wait, which under programmatic launch starts before the routing
     * has written pick. */
    if constexpr (PAIR) cuda_pdl_wait();
    cuda_pdl_trigger();
    const int p = blockIdx.y, e = *(volatile const int *)(pick + p);
    gv_segs s = sg;
#pragma unroll
    for (int j = 0; j < (PAIR ? 2 : 1); j++) {
        s.s[j].w = mo.w[j][e];
        s.s[j].scales = mo.scales[j][e];
        s.s[j].biases = mo.biases[j][e];
        s.s[j].y = sg.s[j].y + (int64_t)p * sg.s[j].N;
    }
    gemv1_body<KIND, PAIR, 0, 0, 0>(x + (int64_t)(PAIR ? p / kused : p) * K, s, s.s[0], K, act, cuda_row_norm{}, blockIdx.x);
}

/* Warps sharing each row of an N x K weight whose unsplit blocks take rpb rows: the fewest (1, 2,
 * 4, 8) that give two blocks per multiprocessor, keeping two steps of vectors per warp.  A function
 * of the shape alone. */
static int g1_split(const cuda_backend *cb, int kind, int N, int K, int rpb) {
    const int Q = kind == GV_Q4 || kind == GV_Q8;
    const int E = kind == GV_Q4 ? 32 : kind == GV_Q8 ? 16 : kind == GV_F32 ? 4 : 8;
    const int U = Q ? g1<GV_Q4>::U : g1<GV_BF16>::U;
    const int blocks = (int)cuda_blocks(N, rpb), nv = K / E;
    int ks = 1;
    while (ks < 8 && blocks * ks < 2 * cb->sm_count && nv >= 2 * 32 * U * 2 * ks) ks *= 2;
    return ks;
}

/* Whether some warp of a one-row launch over rows of K values (KS warps a row) has exactly two steps of vectors
 * (gemv1_body's TWO). */
static int g1_two(int kind, int64_t K, int ks) {
    if (kind != GV_BF16 && kind != GV_F16 && kind != GV_F32) return 0;
    const int nv = (int)(K / (kind == GV_F32 ? 4 : 8));
    for (int k = 0; k < ks; k++)
        if (g1_two_steps(nv, k, 32 * ks, g1<GV_BF16>::U)) return 1;
    return 0;
}

/* The k_gemv1 instance for (kind, pair, norm, resid, lora, two); NULL for combinations never launched.  Two steps
 * before the wait (two) only with the norm folded in (the instances with the registers to spare: the others
 * spill) and without LoRA, and only where a launch can take them (g1_two), so that other launches keep the
 * plain loop's code. */
typedef void (*g1_fn)(const float *, gv_segs, int, int, cuda_row_norm);
template <int KIND, int LORA> static g1_fn g1_pick(int pair, int norm, int resid, int two) {
    constexpr int T2 = !g1<KIND>::Q && LORA == 0;
    if (pair)
        return resid ? (g1_fn)NULL
                     : norm ? (two && T2 ? k_gemv1<KIND, 1, 1, 0, LORA, T2> : k_gemv1<KIND, 1, 1, 0, LORA, 0>)
                            : k_gemv1<KIND, 1, 0, 0, LORA, 0>;
    if (resid) return norm ? (g1_fn)NULL : k_gemv1<KIND, 0, 0, 1, LORA, 0>;
    return norm ? (two && T2 ? k_gemv1<KIND, 0, 1, 0, LORA, T2> : k_gemv1<KIND, 0, 1, 0, LORA, 0>)
                : k_gemv1<KIND, 0, 0, 0, LORA, 0>;
}
template <int KIND> static g1_fn g1_pick(int pair, int norm, int resid, int lora, int two) {
    return lora ? g1_pick<KIND, 1>(pair, norm, resid, two) : g1_pick<KIND, 0>(pair, norm, resid, two);
}
static g1_fn g1_kernel(int kind, int pair, int norm, int resid, int lora, int two) {
    switch (kind) {
    case GV_BF16: return g1_pick<GV_BF16>(pair, norm, resid, lora, two);
    case GV_F16: return g1_pick<GV_F16>(pair, norm, resid, lora, two);
    case GV_F32: return g1_pick<GV_F32>(pair, norm, resid, lora, two);
    case GV_Q4: return g1_pick<GV_Q4>(pair, norm, resid, lora, two);
    default: return g1_pick<GV_Q8>(pair, norm, resid, lora, two);
    }
}

typedef void (*moe_fn)(const float *, gv_segs, gv_moe, const int *, int, int, int);
template <int PAIR> static moe_fn moe_kernel(int kind) {
    switch (kind) {
    case GV_BF16: return k_moe_gemv1<GV_BF16, PAIR>;
    case GV_F16: return k_moe_gemv1<GV_F16, PAIR>;
    case GV_F32: return k_moe_gemv1<GV_F32, PAIR>;
    case GV_Q4: return k_moe_gemv1<GV_Q4, PAIR>;
    default: return k_moe_gemv1<GV_Q8, PAIR>;
    }
}

void cuda_gemv_init(void) {
    const int sm = (int)g1_smem(GV_Q4, G1_MAX_K);
    for (int kind = GV_BF16; kind <= GV_Q8; kind++) {
        for (int c = 0; c < 32; c++) {
            g1_fn f = g1_kernel(kind, c & 1, (c >> 1) & 1, (c >> 2) & 1, (c >> 3) & 1, (c >> 4) & 1);
            if (f) cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, sm);
        }
        cudaFuncSetAttribute(moe_kernel<0>(kind), cudaFuncAttributeMaxDynamicSharedMemorySize, sm);
        cudaFuncSetAttribute(moe_kernel<1>(kind), cudaFuncAttributeMaxDynamicSharedMemorySize, sm);
    }
    cudaFuncSetAttribute(k_gemv1_wide<GV_BF16, 0, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, sm);
    cudaFuncSetAttribute(k_gemv1_wide<GV_BF16, 1, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, sm);
    cudaFuncSetAttribute(k_gemv1_wide<GV_BF16, 0, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, sm);
    cudaGetLastError();
}

/* ---- launch ------------------------------------------------------------------------------------ */

/* The kernel family for weight w, or -1 when no vector kernel takes it. */
static int gv_kind(const lmx_tensor *w) {
    if (w->ndim != 2 || w->q.ggml_type) return -1;
    const int64_t K = w->shape[1];
    if (w->q.bits) {
        const int bits = w->q.bits;
        if ((bits != 4 && bits != 8) || w->q.group <= 0 || w->q.group % (32 / bits) || K % w->q.group) return -1;
        return bits == 4 ? GV_Q4 : GV_Q8;
    }
    switch (w->dtype) {
    case LMX_DTYPE_BF16: return K % 8 ? -1 : GV_BF16;
    case LMX_DTYPE_F16: return K % 8 ? -1 : GV_F16;
    case LMX_DTYPE_F32: return K % 4 ? -1 : GV_F32;
    default: return -1;
    }
}

/* Output rows of one block of 8 warps: k_gemv1 (one_row), or k_gemv / k_qgemv. */
static int gv_rows_per_block(int kind, int one_row, int M, int glu) {
    if (one_row) {
        const int R = kind == GV_Q4 || kind == GV_Q8 ? g1<GV_Q4>::R : g1<GV_BF16>::R;
        return 8 * (glu >= 0 ? R / 2 : R);
    }
    return cuda_gemv_rows_block(kind, M, glu);
}

int cuda_gemv_rows(const cuda_backend *cb, const lmx_tensor *w) {
    if (w->q.ggml_type) return cuda_gemv_tc_kind_gguf(cb, w, CUDA_GEMV_TC_ROWS) >= 0 ? CUDA_GEMV_TC_ROWS : CUDA_GEMV_ROWS;
    const int kind = gv_kind(w);
    /* f32 weights of fewer rows than k_gemv's blocks would fill the GPU with (a mixture of experts' router, 128 x
     * 2048: 8 blocks, each warp walking all of K; H200, 8 rows: 20 us): one row (k_gemv1 splits K), more through
     * cuBLAS's GEMM, which splits K (5.5 us) */
    if (kind == GV_F32 && w->shape[0] < (int64_t)cuda_gemv_rows_block(GV_F32, CUDA_GEMV_ROWS, -1) * cb->sm_count) return 1;
    return kind >= 0 && cuda_gemv_tc_takes(cb, kind, w, 2) ? cuda_gemv_tc_rows(kind) : CUDA_GEMV_ROWS;
}

int cuda_gemv_one_row(const cuda_backend *cb, const lmx_tensor *w, int M) {
    if (w->q.ggml_type) return M == 1 && cuda_ggml_gemv_takes(w, M); /* cuda_ggml.cu: any K */
    const int kind = gv_kind(w);
    if (kind < 0 || M != 1 || w->shape[1] > G1_MAX_K || cb->gemv_variant == 1) return 0;
    if (kind == GV_Q4 || kind == GV_Q8) { /* k_gemv1: groups of 1, 2, 4, ... 32 whole vectors */
        const int e = kind == GV_Q4 ? 32 : 16, g = w->q.group;
        if (g % e || 32 % (g / e)) return 0;
    }
    return 1;
}

lmx_status cuda_gemv(cuda_backend *cb, int n, const lmx_tensor *const *ws, const lmx_tensor *const *biases,
                     float *const *ys, const float *x, int M, int glu, const cuda_gemv_opts *opts) {
    if (n < 1 || n > 3 || M < 1 || M > CUDA_GEMV_TC_ROWS || (glu >= 0 && n != 2)) return LMX_ERR_UNSUPPORTED;
    if (ws[0]->q.ggml_type) {
        const int gk = opts ? -1 : cuda_gemv_tc_kind_gguf(cb, ws[0], M);
        if (gk < 0) return M > CUDA_GEMV_ROWS ? LMX_ERR_UNSUPPORTED : cuda_gemv_ggml(cb, n, ws, biases, ys, x, M, glu, opts);
        gv_segs sg;
        memset(&sg, 0, sizeof sg);
        for (int i = 0; i < n; i++) {
            if (ws[i]->q.ggml_type != ws[0]->q.ggml_type || ws[i]->shape[1] != ws[0]->shape[1]) return LMX_ERR_UNSUPPORTED;
            gv_seg_set(&sg.s[i], ws[i], biases[i], ys[i], NULL, i, 0);
        }
        if (glu >= 0 && sg.s[0].N != sg.s[1].N) return LMX_ERR_UNSUPPORTED;
        const int st_kp = cuda_gemv_st_takes(cb, ws, n, M, glu);
        if (st_kp) return cuda_gemv_st(cb, n, &sg, x, M, (int)ws[0]->shape[1], st_kp);
        if (cuda_gemv_mq_takes(cb, ws, n, M, glu))
            return cuda_gemv_mq(cb, n, &sg, ws[0]->q.ggml_type, x, M, (int)ws[0]->shape[1]);
        return cuda_gemv_tc(cb, gk, n, &sg, glu, x, M, (int)ws[0]->shape[1]);
    }
    const int kind = gv_kind(ws[0]);
    if (kind < 0) return LMX_ERR_UNSUPPORTED;
    const int tcore = cuda_gemv_tc_takes(cb, kind, ws[0], M);
    if (M > CUDA_GEMV_ROWS && !tcore) return LMX_ERR_UNSUPPORTED;
    const int64_t K = ws[0]->shape[1];
    const int one_row = cuda_gemv_one_row(cb, ws[0], M);
    /* MLX 4/8-bit with x in int16, as GGUF blocks (cuda_ggml.cu, which checks the weights and opts itself):
     * one row, and where it beats the tensor cores (8-bit as 4-bit: measured on an H100, 8B shapes, int16 /
     * tensor cores in us: 2 rows q/o 14.8 / 14.6, lm head 196 / 231; 4 rows gate/up 37.1 / 36.9, down 43.6 /
     * 28.9; 8 rows gate/up 53.7 / 29.4, lm head 393 / 213) */
    if ((kind == GV_Q4 || kind == GV_Q8) && cb->gemv_variant != 3 && cuda_ggml_gemv_takes(ws[0], M) &&
        (one_row || (M <= CUDA_GEMV_ROWS && cuda_ggml_beats_tc(M, K))))
        return cuda_gemv_ggml(cb, n, ws, biases, ys, x, M, glu, opts);
    int norm, resid, lora;
    if (gv_opts_check(opts, one_row, n, glu, K, &norm, &resid, &lora)) return LMX_ERR_UNSUPPORTED;
    gv_segs sg;
    memset(&sg, 0, sizeof sg);
    sg.group = ws[0]->q.group;
    sg.sdt = ws[0]->q.scale_dtype;
    for (int i = 0; i < n; i++) {
        const lmx_tensor *w = ws[i];
        if (gv_kind(w) != kind || w->shape[1] != K || w->dtype != ws[0]->dtype || w->q.group != sg.group ||
            w->q.scale_dtype != sg.sdt)
            return LMX_ERR_UNSUPPORTED;
        gv_seg_set(&sg.s[i], w, biases[i], ys[i], opts, i, lora);
    }
    if (glu >= 0 && sg.s[0].N != sg.s[1].N) return LMX_ERR_UNSUPPORTED;
    if (tcore) return cuda_gemv_tc(cb, kind, n, &sg, glu, x, M, (int)K);
    const int rpb = gv_rows_per_block(kind, one_row, M, glu);
    const unsigned gy = glu >= 0 ? 1 : n; /* weights with blocks of their own (the pair shares its blocks) */
    unsigned gx = 1, nb = 0; /* the most blocks of a weight (a plane each: k_gemv, k_qgemv); all, in a row (k_gemv1) */
    int first[3];
    for (int i = 0; i < n; i++) {
        sg.s[i].ks = one_row ? g1_split(cb, kind, sg.s[i].N, (int)K, rpb) : 1;
        const unsigned b = cuda_blocks(sg.s[i].N, rpb / sg.s[i].ks);
        if (b > gx) gx = b;
        first[i] = (int)nb;
        if (i < (int)gy) nb += b;
    }
    if (one_row) {
        sg.b1 = gy > 1 ? first[1] : (int)nb, sg.b2 = gy > 2 ? first[2] : (int)nb;
        int two = 0;
        for (int i = 0; i < n; i++) two |= g1_two(kind, K, sg.s[i].ks);
        g1_fn f = g1_kernel(kind, glu >= 0, norm, resid, lora, two);
        /* one block a multiprocessor at most, and G1_WIDE_U vectors a lane and row: the wide form */
        int wide = kind == GV_BF16 && glu < 0 && !lora && cb->gemv_variant != 6 && (int)nb <= cb->sm_count;
        for (int i = 0; wide && i < n; i++) wide = K / g1<GV_BF16>::E >= G1_WIDE_U * 32 * sg.s[i].ks;
        if (wide) f = resid ? k_gemv1_wide<GV_BF16, 0, 1> : norm ? k_gemv1_wide<GV_BF16, 1, 0> : k_gemv1_wide<GV_BF16, 0, 0>;
        /* while a decode graph is captured: a result that the step's announced read reads also goes into that
         * read's host memory (cb->mirror, cuda_graph.cu; the epilogue's block-wide write, so one weight of ks 1) */
        gv_seg *s0 = &sg.s[0];
        if (cb->dyn_on && cb->mirror.dptr && cb->mirror.y == s0->y && n == 1 && glu < 0 && !resid && s0->ks == 1 &&
            (size_t)s0->N * sizeof(float) == cb->mirror.n) {
            s0->ym = cb->mirror.dptr;
            cb->mirror.taken = 1;
        }
        cuda_launch(cb, f, dim3(nb), 256, g1_smem(kind, K), x, sg, (int)K, glu < 0 ? 0 : glu, gv_row_norm(opts));
        return cuda_check_launch(cb, glu >= 0 ? "matmul + glu" : "matmul");
    }
    cuda_gemv_rows_launch(cb, kind, M, gx, gy, x, sg, (int)K, glu);
    return cuda_check_launch(cb, glu >= 0 ? "matmul + glu" : "matmul");
}

/* ---- mixture of experts (cuda_moe.cu) ------------------------------------------------------------ */

int cuda_moe_gemv_takes(const cuda_backend *cb, const lmx_tensor *experts, int E) {
    if (E < 1 || E > GV_MOE_MAX) return 0;
    const lmx_tensor *g = &experts[0]; /* every expert is stored as expert 0 (lmx_moe_args.alike) */
    for (int j = 0; j < 3; j++) {
        const lmx_tensor *w = &experts[j];
        if (!cuda_gemv_one_row(cb, w, 1) || w->q.ggml_type || gv_kind(w) != gv_kind(g) || w->dtype != g->dtype ||
            w->q.group != g->q.group || w->q.scale_dtype != g->q.scale_dtype)
            return 0;
    }
    return 1;
}

lmx_status cuda_moe_gemv(cuda_backend *cb, const lmx_tensor *experts, int E, int down, const int *pick, int pairs,
                         int kused, const float *x, float *y0, float *y1, int act) {
    const lmx_tensor *w0 = &experts[down ? 2 : 0];
    const int kind = gv_kind(w0), N = (int)w0->shape[0], K = (int)w0->shape[1];
    gv_moe tab; /* 12 KiB of pointers, passed by value (no allocation per step) */
    gv_moe *mo = &tab;
    gv_moe_fill(mo, experts, E, down);
    gv_segs sg;
    memset(&sg, 0, sizeof sg);
    sg.group = w0->q.group;
    sg.sdt = w0->q.scale_dtype;
    const int rpb = gv_rows_per_block(kind, 1, 1, down ? -1 : 0);
    const int ks = g1_split(cb, kind, N * pairs, K, rpb);
    for (int j = 0; j < 2; j++) {
        sg.s[j].N = N;
        sg.s[j].ks = ks;
        sg.s[j].bt = LMX_DTYPE_F32;
        sg.s[j].y = j ? y1 : y0;
    }
    const dim3 grid(cuda_blocks(N, rpb / ks), (unsigned)pairs);
    cuda_launch(cb, down ? moe_kernel<0>(kind) : moe_kernel<1>(kind), grid, 256, g1_smem(kind, K), x, sg, *mo, pick, kused,
                K, act);
    return cuda_check_launch(cb, down ? "moe down" : "moe gate/up");
}
