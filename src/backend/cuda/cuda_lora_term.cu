/* cuda_lora_term.cu - a projection's LoRA expand added by the op that reads the projection next: the GLU
 * over gate and up, and the residual add of the o and down projections.  Training's recorded forward
 * hands the expands over as terms (backward.h's lmx_lora_term: glu_keep, which also writes the keeps, and
 * the lora_add backward op); prefill and training's unrecorded forward call the lora_glu and lora_add ops
 * (backend.h), which shrink first and then run the same kernels.
 *
 * The expand y += s (x A^T) B^T on its own is a read and a write of y in f32 (1.4 GB a layer of an 8B
 * model at 4,096 rows, 5% of its training step); inside the op that reads y anyway it costs only the
 * products: each value is y[m, n] + sum_j xa[m, j] (s b[n, j]), rank R multiply-adds in f32 beside
 * loads that the op makes anyway.  A block takes 256 columns (one a thread, its row of s B in
 * registers) and TERM_ROWS rows (their xa in shared memory, read by every thread at once); up to rank 16
 * in 64 registers, four blocks a multiprocessor (at three, 80 registers, the 8B's training step was 0.9%
 * slower).  The GLU's terms of ranks 8 and 16 over columns in multiples of 32 run on tensor cores instead
 * (k_glu_terms_tc, below).  Ranks other than 8, 16 and 32 take the expand as a GEMM first (cuBLAS, TF32 as
 * the lora op), then the op.  The GLU's gate and up are f32, or bf16 where a checkpointed training step asks
 * (model.h mlp16: the GEMMs' products rounded as HF's bf16 Linear rounds them); the kernels read either. */
#include "cuda_mma.h"

extern "C" {
#include "../act_grad.h"
#include "../backward.h"
}

#define TERM_ROWS 32
#define TERM_COLS 256
#define TERM_BATCH 8 /* rows a thread loads at once */

/* b = s * B[c, :] (B [N, R] f32, rows 16-byte aligned) */
template <int R> static __device__ __forceinline__ void term_row(float (&b)[R], const float *B, int64_t c, float s) {
    const float4 *p = (const float4 *)(B + c * R);
#pragma unroll
    for (int j = 0; j < R / 4; j++) {
        const float4 v = __ldg(p + j);
        b[4 * j] = s * v.x, b[4 * j + 1] = s * v.y, b[4 * j + 2] = s * v.z, b[4 * j + 3] = s * v.w;
    }
}

/* sum_j xa[j] b[j] (xa: a row in shared memory, the same for every thread) */
template <int R> static __device__ __forceinline__ float term_dot(const float (&b)[R], const float *xa) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < R / 4; j++) {
        const float4 x = ((const float4 *)xa)[j];
        acc = __fmaf_rn(x.x, b[4 * j], acc);
        acc = __fmaf_rn(x.y, b[4 * j + 1], acc);
        acc = __fmaf_rn(x.z, b[4 * j + 2], acc);
        acc = __fmaf_rn(x.w, b[4 * j + 3], acc);
    }
    return acc;
}

/* The block's rows of xa [rows, R] into sx [TERM_ROWS * R] (nr rows from r0) */
template <int R> static __device__ __forceinline__ void term_rows(float *sx, const float *xa, int64_t r0, int nr) {
    for (int i = threadIdx.x; i < nr * R; i += blockDim.x) sx[i] = xa[r0 * R + i];
}

/* One term as the kernels read it: xa [rows, R], B [N, R], scale (xa NULL: none) */
struct term_arg {
    const float *xa, *b;
    float s;
};

/* g' = g + term_g, u' = u + term_u; o = act(g') u' (o may be g; NULL: none); keeps of g', u' (gk non-NULL;
 * and of o: ok, or o's bf16 values alone where o is NULL); g and u f32, or bf16 (G: model.h mlp16) */
template <int R, typename G>
__global__ void __launch_bounds__(TERM_COLS, R <= 16 ? 4 : 2) k_glu_terms(float *o, __nv_bfloat16 *gk, __nv_bfloat16 *uk,
                                                         __nv_bfloat16 *ok, const G *g, const G *u,
                                                         int64_t rows, int64_t N, int act, term_arg tg, term_arg tu) {
    __shared__ __align__(16) float sx[2][TERM_ROWS * R];
    const int64_t r0 = (int64_t)blockIdx.y * TERM_ROWS, c = (int64_t)blockIdx.x * TERM_COLS + threadIdx.x;
    const int nr = (int)(rows - r0 < TERM_ROWS ? rows - r0 : TERM_ROWS);
    if (tg.xa) term_rows<R>(sx[0], tg.xa, r0, nr);
    if (tu.xa) term_rows<R>(sx[1], tu.xa, r0, nr);
    float bg[R], bu[R];
    if (c < N && tg.xa) term_row<R>(bg, tg.b, c, tg.s);
    if (c < N && tu.xa) term_row<R>(bu, tu.b, c, tu.s);
    __syncthreads();
    if (c >= N) return;
    for (int i0 = 0; i0 < nr; i0 += TERM_BATCH) { /* the batch's loads all out before its stores (o may be g) */
        float gv[TERM_BATCH], uv[TERM_BATCH];
#pragma unroll
        for (int k = 0; k < TERM_BATCH; k++)
            if (i0 + k < nr) gv[k] = (float)g[(r0 + i0 + k) * N + c], uv[k] = (float)u[(r0 + i0 + k) * N + c];
#pragma unroll
        for (int k = 0; k < TERM_BATCH; k++) {
            if (i0 + k >= nr) break;
            const int64_t e = (r0 + i0 + k) * N + c;
            const float gi = tg.xa ? gv[k] + term_dot<R>(bg, sx[0] + (i0 + k) * R) : gv[k];
            const float ui = tu.xa ? uv[k] + term_dot<R>(bu, sx[1] + (i0 + k) * R) : uv[k];
            const float oi = glu_act(gi, act) * ui;
            if (gk) gk[e] = __float2bfloat16(gi), uk[e] = __float2bfloat16(ui);
            if (o) o[e] = oi;
            if (ok) ok[e] = __float2bfloat16(oi);
        }
    }
}

/* ---- the GLU's terms on tensor cores ------------------------------------------------------------------
 * k_glu_terms above spends ~2 R multiply-adds and R / 2 shared loads on each value for its two terms: the
 * 8B's training step ran it at 2.2-3.0 TB/s, held by instructions rather than bytes.  Here the terms are
 * mma.sync m16n8k8 in TF32 (the precision of the lora op's expand, cuBLAS TF32), with the accumulators
 * starting from gate and up themselves, so that each value's own work is the GLU and its stores.
 *
 * A warp takes 32 columns and walks the block's rows 16 at a time; lane (g = lane / 4, t = lane % 4)
 * holds rows g and g + 8 of columns 4 t .. 4 t + 3 and 16 + 4 t .. 16 + 4 t + 3: the mma's columns are
 * permuted (its column n of tile j is the warp's column 16 (j / 2) + 4 (n / 2) + 2 (j % 2) + n % 2), so
 * that a lane loads and stores four neighbours at once and the four lanes of a row whole sectors (the
 * mma's own layout, two neighbours a lane, lost 1% of the 8B's step: bench/tried/glu_terms_tc.patch).
 * B's fragments (s B, tf32) stay in registers; xa's rows are staged in shared memory (rows R + 4 apart:
 * the fragments' loads without bank conflicts).  Two blocks a multiprocessor: sixteen columns a warp at
 * four (64 registers) was 2% slower (bench/tried/glu_tc_sixteen_columns.patch). */
#define TC_ROWS 128

static __device__ __forceinline__ uint32_t tf32_of(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

/* c += a b (m16n8k8, tf32 in, f32 accumulate) */
static __device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* One term's pieces for a warp: the fragments of s M for its 32 columns (from col0), M [N, R] with its value
 * (n, k) at m[n * R + k] (a pair's B) or [R, N] at m[k * N + n] (kn: a pair's A); the block's rows of the
 * R-wide factor are staged in shared memory */
template <int R> struct tc_term {
    uint32_t b[4][R / 8][2];
    __device__ __forceinline__ void load_b(const float *m, float s, int64_t col0, int lane, int64_t kn = 0) {
        const int g = lane >> 2, q = lane & 3;
        const int64_t sn = kn ? 1 : R, sk = kn ? kn : 1;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float *col = m + (col0 + (j >> 1) * 16 + (g >> 1) * 4 + (j & 1) * 2 + (g & 1)) * sn;
#pragma unroll
            for (int k = 0; k < R / 8; k++)
                b[j][k][0] = tf32_of(s * __ldg(col + (8 * k + q) * sk)),
                b[j][k][1] = tf32_of(s * __ldg(col + (8 * k + q + 4) * sk));
        }
    }
    /* c[j] += the term's rows i0 .. i0 + 15 (staged in sx, rows R + 4 apart) */
    __device__ __forceinline__ void add(float (&c)[4][4], const uint32_t *sx, int i0, int lane) const {
        const int g = lane >> 2, q = lane & 3;
#pragma unroll
        for (int k = 0; k < R / 8; k++) {
            const uint32_t *p = sx + (i0 + g) * (R + 4) + 8 * k + q;
            const uint32_t a[4] = {p[0], p[8 * (R + 4)], p[4], p[8 * (R + 4) + 4]};
#pragma unroll
            for (int j = 0; j < 4; j++) mma_tf32(c[j], a, b[j][k][0], b[j][k][1]);
        }
    }
};

/* a row's 8 values (4 from column c, 4 from c + 16; 16-byte aligned) into the accumulators' half h (0: row g,
 * 1: row g + 8) */
static __device__ __forceinline__ void tc_load8(float (&c)[4][4], const float *p, int h) {
    const float4 v0 = cuda_ld4(p), v1 = cuda_ld4(p + 16);
    c[0][2 * h] = v0.x, c[0][2 * h + 1] = v0.y, c[1][2 * h] = v0.z, c[1][2 * h + 1] = v0.w;
    c[2][2 * h] = v1.x, c[2][2 * h + 1] = v1.y, c[3][2 * h] = v1.z, c[3][2 * h + 1] = v1.w;
}
/* a row's 8 bf16 values as tc_load8 reads f32 ones (8-byte aligned), widened */
static __device__ __forceinline__ void tc_load8(float (&c)[4][4], const __nv_bfloat16 *p, int h) {
    const uint2 v0 = *(const uint2 *)p, v1 = *(const uint2 *)(p + 16);
    const uint32_t w[4] = {v0.x, v0.y, v1.x, v1.y};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&w[j]);
        c[j][2 * h] = f.x, c[j][2 * h + 1] = f.y;
    }
}

static __device__ __forceinline__ void tc_zero(float (&c)[4][4], int h) {
#pragma unroll
    for (int j = 0; j < 4; j++) c[j][2 * h] = c[j][2 * h + 1] = 0.0f;
}
/* half h of the accumulators from row `row` of m [rows, N] at column col (tc_load8), or zeros past the last row */
template <class T>
static __device__ __forceinline__ void tc_row(float (&c)[4][4], const T *m, int64_t row, int64_t rows, int64_t N,
                                              int64_t col, int h) {
    if (row < rows) tc_load8(c, m + row * N + col, h);
    else tc_zero(c, h);
}
/* half h of the accumulators as tc_load8 reads them, as bf16 at p (8-byte aligned) */
static __device__ __forceinline__ void tc_store8_bf16(__nv_bfloat16 *p, const float (&c)[4][4], int h) {
    *(uint2 *)p = make_uint2(pack_bf16(c[0][2 * h], c[0][2 * h + 1]), pack_bf16(c[1][2 * h], c[1][2 * h + 1]));
    *(uint2 *)(p + 16) = make_uint2(pack_bf16(c[2][2 * h], c[2][2 * h + 1]), pack_bf16(c[3][2 * h], c[3][2 * h + 1]));
}
static __device__ __forceinline__ void tc_store8(float *p, const float (&c)[4][4], int h) {
    cuda_st4(p, make_float4(c[0][2 * h], c[0][2 * h + 1], c[1][2 * h], c[1][2 * h + 1]));
    cuda_st4(p + 16, make_float4(c[2][2 * h], c[2][2 * h + 1], c[3][2 * h], c[3][2 * h + 1]));
}

/* the rows [r0, r0 + nr) of x [rows, R] as tf32 into sx (rows R + 4 apart), zeros to TC_ROWS, by a block of
 * TERM_COLS threads: four values a load (x 16-byte aligned: tc_fits), each thread's loads all out before its
 * stores (a value a load in a loop left one load in flight a thread, the block waiting on each in turn) */
template <int R> static __device__ __forceinline__ void tc_stage(uint32_t *sx, const float *x, int64_t r0, int nr) {
    constexpr int Q = R / 4, PER = TC_ROWS * Q / TERM_COLS; /* float4s a row, a thread's */
    float4 v[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int i = threadIdx.x + k * TERM_COLS, row = i / Q;
        v[k] = row < nr ? *(const float4 *)(x + (r0 + row) * R + 4 * (i % Q)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int i = threadIdx.x + k * TERM_COLS;
        *(uint4 *)(sx + (i / Q) * (R + 4) + 4 * (i % Q)) =
            make_uint4(tf32_of(v[k].x), tf32_of(v[k].y), tf32_of(v[k].z), tf32_of(v[k].w));
    }
}

/* ---- a warp's bf16 slabs through shared memory ----------------------------------------------------
 * Over bf16 gate, up and dy (model.h mlp16) each warp copies its next slabs (16 rows x its 32 columns of each
 * of M matrices, 1 KB each) into a ring of RING_STAGES in shared memory with cp.async, RING_STAGES - 1 slabs
 * ahead of the one it works on: no registers hold the loads in flight.  Loads into registers one slab ahead
 * (the kernels' bf16 form before) ran the 8B's GLU forward at 0.290 ms a layer and its backward at 0.341 ms;
 * so 0.268 and 0.305 (a read of the layer's products alone, a write of h: 2.6 TB/s; four stages no faster).
 * A slab's chunk k (16 bytes) of row r lies at r * 4 + (k ^ (r & 2)): the lanes' 8-byte reads of rows g and
 * g + 2 fall in other banks.  Rows past the block's are zeros. */
#define RING_STAGES 3

static __device__ __forceinline__ int ring_chunk(int r, int k) { return r * 4 + (k ^ (r & 2)); }

template <int M> struct tc_ring {
    uint4 *st;                /* this warp's RING_STAGES stages of M slabs of 64 chunks */
    const __nv_bfloat16 *m[M]; /* the matrices [rows, N] */
    int64_t end, N, col0;     /* the block's end row, the columns, the warp's first */
    /* slab of rows row0 .. row0 + 15 into stage `stage`, one commit group (empty past the block's rows) */
    __device__ __forceinline__ void load(int64_t row0, int stage, int lane) const {
        if (row0 < end)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = (lane >> 2) + 8 * h, k = lane & 3;
                const int64_t row = row0 + r;
                const int in = row < end;
#pragma unroll
                for (int i = 0; i < M; i++)
                    cp_async16_or_zeros(smem_addr(st + (stage * M + i) * 64 + ring_chunk(r, k)),
                                        m[i] + (in ? row : 0) * N + col0 + 8 * k, in ? 16 : 0);
            }
        cp_async_commit();
    }
    /* matrix i's slab in stage `stage` into c as tc_load8 lays it out (rows g and g + 8 of the lane) */
    __device__ __forceinline__ void read(float (&c)[4][4], int stage, int i, int lane) const {
        const uint2 *p = (const uint2 *)(st + (stage * M + i) * 64);
        const int q = lane & 3;
#pragma unroll
        for (int h = 0; h < 2; h++) { /* values 4q .. 4q + 3: chunk q / 2, its half q % 2; 16 + 4q ..: chunk 2 + q / 2 */
            const int r = (lane >> 2) + 8 * h;
            const uint2 a = p[2 * ring_chunk(r, q >> 1) + (q & 1)], b = p[2 * ring_chunk(r, 2 + (q >> 1)) + (q & 1)];
            const uint32_t w[4] = {a.x, a.y, b.x, b.y};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&w[j]);
                c[j][2 * h] = f.x, c[j][2 * h + 1] = f.y;
            }
        }
    }
};

/* The ring of the warp: the block's shared memory past `before` 16-byte words; the first RING_STAGES - 1 slabs
 * of the block's rows [r0, end) asked for */
template <int M>
static __device__ __forceinline__ tc_ring<M> ring_start(uint4 *smem, int before, const __nv_bfloat16 *const (&m)[M],
                                                        int64_t r0, int64_t end, int64_t N, int64_t col0, int lane) {
    tc_ring<M> ring;
    ring.st = smem + before + (threadIdx.x >> 5) * RING_STAGES * M * 64;
#pragma unroll
    for (int i = 0; i < M; i++) ring.m[i] = m[i];
    ring.end = end, ring.N = N, ring.col0 = col0;
#pragma unroll
    for (int s = 0; s < RING_STAGES - 1; s++) ring.load(r0 + 16 * s, s, lane);
    return ring;
}

/* Slab j of the block's (rows r0 + 16 j ..) into c[0 .. M-1] once its copies are in, and slab j + RING_STAGES - 1
 * asked for in the stage slab j - 1 left (every lane of the warp read it before the barrier) */
template <int M>
static __device__ __forceinline__ void ring_next(const tc_ring<M> &ring, float (*c)[4][4], int j, int64_t r0, int lane) {
    cp_async_wait<RING_STAGES - 2>();
    __syncwarp();
    const int s = j % RING_STAGES;
#pragma unroll
    for (int i = 0; i < M; i++) ring.read(c[i], s, i, lane);
    ring.load(r0 + 16 * (j + RING_STAGES - 1), (j + RING_STAGES - 1) % RING_STAGES, lane);
}

/* The bytes of shared memory of the kernels below: the staged rows of `terms` terms of rank R, and the warps'
 * rings of M matrices where the values are bf16 (M 0: none) */
static size_t tc_smem(int R, int terms, int M) {
    return (size_t)terms * TC_ROWS * (R + 4) * 4 + (size_t)(TERM_COLS / 32) * RING_STAGES * M * 64 * 16;
}

/* One 16-row slab of k_glu_terms_tc (rows ra and rb = ra + 8 of the lane, from i0 of the block's): the terms
 * added to gate's and up's values cg, cu, the GLU, the stores */
template <int R>
static __device__ __forceinline__ void tc_glu_slab(float (&cg)[4][4], float (&cu)[4][4], const tc_term<R> &ag,
                                                   const tc_term<R> &au, const uint32_t *sg, const uint32_t *su,
                                                   int i0, int lane, int64_t ra, int64_t rows, int64_t N, int64_t c,
                                                   int act, float *o, __nv_bfloat16 *gk, __nv_bfloat16 *uk,
                                                   __nv_bfloat16 *ok, int with_g, int with_u) {
    if (with_g) ag.add(cg, sg, i0, lane);
    if (with_u) au.add(cu, su, i0, lane);
    float co[4][4];
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) co[j][e] = glu_act(cg[j][e], act) * cu[j][e];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int64_t row = ra + 8 * h, e = row * N + c;
        if (row >= rows) break;
        if (gk) tc_store8_bf16(gk + e, cg, h), tc_store8_bf16(uk + e, cu, h);
        if (o) tc_store8(o + e, co, h);
        if (ok) tc_store8_bf16(ok + e, co, h);
    }
}

/* k_glu_terms's work (the same pointers and terms), N a multiple of 32 and every pointer 16-byte aligned; over
 * bf16 gate and up (model.h mlp16) through the warps' rings.  Shared memory: tc_smem(R, 2, bf16 ? 2 : 0). */
template <int R, typename G>
__global__ void __launch_bounds__(TERM_COLS, 2) k_glu_terms_tc(float *o, __nv_bfloat16 *gk, __nv_bfloat16 *uk,
                                                               __nv_bfloat16 *ok, const G *g, const G *u,
                                                               int64_t rows, int64_t N, int act, term_arg tg, term_arg tu) {
    extern __shared__ __align__(16) uint4 tc_shared[];
    uint32_t *sg = (uint32_t *)tc_shared, *su = sg + TC_ROWS * (R + 4);
    const int64_t r0 = (int64_t)blockIdx.y * TC_ROWS;
    const int nr = (int)(rows - r0 < TC_ROWS ? rows - r0 : TC_ROWS), lane = threadIdx.x & 31;
    const int64_t col0 = (int64_t)blockIdx.x * TERM_COLS + (threadIdx.x & ~31);
    tc_ring<2> ring;
    if constexpr (sizeof(G) == 2)
        if (col0 < N) ring = ring_start<2>(tc_shared, TC_ROWS * (R + 4) / 2, {g, u}, r0, r0 + nr, N, col0, lane);
    if (tg.xa) tc_stage<R>(sg, tg.xa, r0, nr);
    if (tu.xa) tc_stage<R>(su, tu.xa, r0, nr);
    tc_term<R> ag, au;
    if (col0 < N && tg.xa) ag.load_b(tg.b, tg.s, col0, lane);
    if (col0 < N && tu.xa) au.load_b(tu.b, tu.s, col0, lane);
    __syncthreads();
    if (col0 >= N) return;
    const int64_t c = col0 + 4 * (lane & 3), ra0 = r0 + (lane >> 2);
    for (int i0 = 0; i0 < nr; i0 += 16) {
        const int64_t ra = ra0 + i0, rb = ra + 8; /* the lane's rows */
        float cgu[2][4][4];
        if constexpr (sizeof(G) == 2) ring_next<2>(ring, cgu, i0 / 16, r0, lane);
        else
            tc_row(cgu[0], g, ra, rows, N, c, 0), tc_row(cgu[1], u, ra, rows, N, c, 0),
                tc_row(cgu[0], g, rb, rows, N, c, 1), tc_row(cgu[1], u, rb, rows, N, c, 1);
        tc_glu_slab<R>(cgu[0], cgu[1], ag, au, sg, su, i0, lane, ra, rows, N, c, act, o, gk, uk, ok, tg.xa != NULL,
                       tu.xa != NULL);
    }
}

/* The GLU's backward into bf16 gradients (glu_bwd's fresh 3) with the down projection's LoRA input gradient
 * added to dy first: dy' = dy + u A (u [rows, R] f32 from lora_bwd, A [R, N] the pair's), as k_glu_terms_tc
 * adds the forward's terms: the accumulators start from dy, A's fragments stay in registers.  From a bf16 dy
 * (the tape's, model.h mlp16) through the warps' rings.  Shared memory: tc_smem(R, 1, D bf16 ? 3 : 0). */
template <int R, typename D>
__global__ void __launch_bounds__(TERM_COLS, 2) k_glu_bwd_tc(__nv_bfloat16 *dg, __nv_bfloat16 *du, const D *dy,
                                                             const __nv_bfloat16 *g, const __nv_bfloat16 *u,
                                                             const float *ut, const float *a, int64_t rows, int64_t N,
                                                             int silu) {
    extern __shared__ __align__(16) uint4 tc_shared[];
    uint32_t *sx = (uint32_t *)tc_shared;
    const int64_t r0 = (int64_t)blockIdx.y * TC_ROWS;
    const int nr = (int)(rows - r0 < TC_ROWS ? rows - r0 : TC_ROWS), lane = threadIdx.x & 31;
    const int64_t col0 = (int64_t)blockIdx.x * TERM_COLS + (threadIdx.x & ~31);
    tc_ring<3> ring;
    if constexpr (sizeof(D) == 2)
        if (col0 < N) ring = ring_start<3>(tc_shared, TC_ROWS * (R + 4) / 4, {dy, g, u}, r0, r0 + nr, N, col0, lane);
    tc_stage<R>(sx, ut, r0, nr);
    tc_term<R> at;
    if (col0 < N) at.load_b(a, 1.0f, col0, lane, N);
    __syncthreads();
    if (col0 >= N) return;
    const int64_t c = col0 + 4 * (lane & 3);
    for (int i0 = 0; i0 < nr; i0 += 16) {
        const int64_t ra = r0 + i0 + (lane >> 2), rb = ra + 8;
        float cdgu[3][4][4]; /* dy, then gate and up, which become the gradients */
        if constexpr (sizeof(D) == 2) ring_next<3>(ring, cdgu, i0 / 16, r0, lane);
        else
#pragma unroll
            for (int h = 0; h < 2; h++)
                tc_row(cdgu[0], dy, h ? rb : ra, rows, N, c, h), tc_row(cdgu[1], g, h ? rb : ra, rows, N, c, h),
                    tc_row(cdgu[2], u, h ? rb : ra, rows, N, c, h);
        at.add(cdgu[0], sx, i0, lane);
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) { /* gate's and up's values become their gradients */
                float av, dav;
                lmx_act_grad(cdgu[1][j][e], silu, &av, &dav);
                cdgu[1][j][e] = cdgu[0][j][e] * cdgu[2][j][e] * dav, cdgu[2][j][e] = cdgu[0][j][e] * av;
            }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t e = (h ? rb : ra) * N + c;
            if ((h ? rb : ra) >= rows) break;
            tc_store8_bf16(dg + e, cdgu[1], h), tc_store8_bf16(du + e, cdgu[2], h);
        }
    }
}

/* The tensor-core kernels' shared memory, fixed by their rank and types: k_glu_terms_tc over gate / up of type G,
 * k_glu_bwd_tc over dy of type D; allowed once, by cuda_lora_term_init */
template <int R, typename G> static size_t terms_tc_smem() { return tc_smem(R, 2, sizeof(G) == 2 ? 2 : 0); }
template <int R, typename D> static size_t bwd_tc_smem() { return tc_smem(R, 1, sizeof(D) == 2 ? 3 : 0); }

template <int R, typename T> static void tc_allow() {
    cudaFuncSetAttribute(k_glu_terms_tc<R, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)terms_tc_smem<R, T>());
    cudaFuncSetAttribute(k_glu_bwd_tc<R, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bwd_tc_smem<R, T>());
}

/* the kernels' dynamic shared memory (past 48 KB) allowed, once (cuda_backend.cu, at creation) */
void cuda_lora_term_init(void) {
    tc_allow<8, float>();
    tc_allow<8, __nv_bfloat16>();
    tc_allow<16, float>();
    tc_allow<16, __nv_bfloat16>();
    cudaGetLastError();
}

/* Whether the tensor-core kernels take a term of rank R over rows x N values: ranks 8 and 16, whole warps of
 * columns, the grid's rows of blocks, every pointer (or-ed into ptrs) 16-byte aligned */
static int tc_fits(int64_t R, int64_t N, int64_t rows, uintptr_t ptrs) {
    return (R == 8 || R == 16) && N % 32 == 0 && rows <= 65535LL * TC_ROWS && !(ptrs & 15);
}

/* k_glu_bwd_tc of rank R over dy of type D, with the shared memory it asks for (bwd_tc_smem) */
template <int R, typename D>
static void glu_bwd_tc_go(cuda_backend *cb, dim3 grid, __nv_bfloat16 *dg, __nv_bfloat16 *du, const void *dy,
                          const __nv_bfloat16 *g, const __nv_bfloat16 *u, const float *ut, const float *a, int64_t rows,
                          int64_t N, int silu) {
    k_glu_bwd_tc<R, D><<<grid, TERM_COLS, bwd_tc_smem<R, D>(), cb->stream>>>(dg, du, (const D *)dy, g, u, ut, a, rows,
                                                                             N, silu);
}

lmx_status cuda_glu_bwd_dx(lmx_backend *be, lmx_tensor *dgate, lmx_tensor *dup, const lmx_tensor *dy,
                           const lmx_tensor *gate, const lmx_tensor *up, int64_t n, lmx_act act, int count,
                           const lmx_tensor *ut, const lmx_lora_pair *const *pairs) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    if (st || n <= 0) return st;
    const int64_t R = count == 1 ? pairs[0]->a.shape[0] : 0, N = count == 1 ? pairs[0]->a.shape[1] : 0;
    const int takes = count == 1 && N && n % N == 0 && lmx_tensor_nelem(&ut[0]) == n / N * R &&
                      tc_fits(R, N, n / N, (uintptr_t)dgate->data | (uintptr_t)dup->data | (uintptr_t)dy->data |
                                               (uintptr_t)gate->data | (uintptr_t)up->data | (uintptr_t)ut[0].data) &&
                      dgate->dtype == LMX_DTYPE_BF16 && dup->dtype == LMX_DTYPE_BF16 &&
                      (dy->dtype == LMX_DTYPE_F32 || dy->dtype == LMX_DTYPE_BF16) &&
                      gate->dtype == LMX_DTYPE_BF16 && up->dtype == LMX_DTYPE_BF16;
    if (!takes) return LMX_ERR_UNSUPPORTED; /* no message: the caller adds the terms first */
    const int64_t rows = n / N;
    const dim3 grid((unsigned)((N + TERM_COLS - 1) / TERM_COLS), (unsigned)((rows + TC_ROWS - 1) / TC_ROWS));
    __nv_bfloat16 *g16 = (__nv_bfloat16 *)dgate->data, *u16 = (__nv_bfloat16 *)dup->data;
    const float *t = (const float *)ut[0].data, *a = (const float *)pairs[0]->a.data;
    const __nv_bfloat16 *g = (const __nv_bfloat16 *)gate->data, *u = (const __nv_bfloat16 *)up->data;
    const int silu = act == LMX_ACT_SILU, dy16 = dy->dtype == LMX_DTYPE_BF16; /* bf16: the tape's (model.h mlp16) */
    const auto go = R == 8 ? (dy16 ? glu_bwd_tc_go<8, __nv_bfloat16> : glu_bwd_tc_go<8, float>)
                           : (dy16 ? glu_bwd_tc_go<16, __nv_bfloat16> : glu_bwd_tc_go<16, float>);
    go(cb, grid, g16, u16, dy->data, g, u, t, a, rows, N, silu);
    return cuda_check_launch(cb, "glu backward with a lora term");
}

/* y += x + term (x NULL: y += term) */
template <int R>
__global__ void __launch_bounds__(TERM_COLS, R <= 16 ? 4 : 3)
    k_add_term(float *y, const float *x, int64_t rows, int64_t N, term_arg t) {
    __shared__ __align__(16) float sx[TERM_ROWS * R];
    const int64_t r0 = (int64_t)blockIdx.y * TERM_ROWS, c = (int64_t)blockIdx.x * TERM_COLS + threadIdx.x;
    const int nr = (int)(rows - r0 < TERM_ROWS ? rows - r0 : TERM_ROWS);
    term_rows<R>(sx, t.xa, r0, nr);
    float b[R];
    if (c < N) term_row<R>(b, t.b, c, t.s);
    __syncthreads();
    if (c >= N) return;
    for (int i0 = 0; i0 < nr; i0 += TERM_BATCH) { /* loads before stores, as k_glu_terms */
        float yv[TERM_BATCH], xv[TERM_BATCH];
#pragma unroll
        for (int k = 0; k < TERM_BATCH; k++)
            if (i0 + k < nr) yv[k] = y[(r0 + i0 + k) * N + c], xv[k] = x ? x[(r0 + i0 + k) * N + c] : 0.0f;
#pragma unroll
        for (int k = 0; k < TERM_BATCH; k++)
            if (i0 + k < nr) y[(r0 + i0 + k) * N + c] = yv[k] + (xv[k] + term_dot<R>(b, sx + (i0 + k) * R));
    }
}

/* ---- host ----------------------------------------------------------------------------------------- */

/* The term's rank where the kernels take it (8, 16, 32; xa and B 16-byte aligned), else 0; *N its
 * columns.  LMX_ERR_SHAPE where it does not cover n values. */
static lmx_status term_rank(cuda_backend *cb, const lmx_lora_term *t, int64_t n, int *rank, int64_t *N) {
    const int64_t r = t->pair->a.shape[0], cols = t->pair->b.shape[0], rows = t->xa->shape[0];
    if (t->xa->dtype != LMX_DTYPE_F32 || t->xa->shape[t->xa->ndim - 1] != r || rows * cols != n)
        return lmx_err_set(&cb->base.err, LMX_ERR_SHAPE, "lora term: x A^T [%lld, %lld] does not cover %lld values of %lld columns",
                           (long long)rows, (long long)t->xa->shape[t->xa->ndim - 1], (long long)n, (long long)cols);
    const int aligned = (((uintptr_t)t->xa->data | (uintptr_t)t->pair->b.data) & 15) == 0;
    const int fits = rows <= 65535LL * TERM_ROWS; /* the grid's rows of blocks */
    *rank = aligned && fits && (r == 8 || r == 16 || r == 32) ? (int)r : 0;
    *N = cols;
    return LMX_OK;
}

/* y += term as a GEMM: y [rows, N] += s xa B^T (TF32, as the lora op's expand) */
static lmx_status term_gemm(cuda_backend *cb, float *y, const lmx_lora_term *t) {
    const cublasStatus_t st =
        cuda_lora_expand(cb, y, (const float *)t->xa->data, t->xa->shape[0], t->pair->b.shape[0], t->pair);
    return cuda_blas(cb, st, "lora term");
}

static term_arg term_of(const lmx_lora_term *t) {
    return t ? term_arg{(const float *)t->xa->data, (const float *)t->pair->b.data, t->pair->scale}
             : term_arg{NULL, NULL, 0.0f};
}

static dim3 term_grid(int64_t rows, int64_t N) {
    return dim3((unsigned)((N + TERM_COLS - 1) / TERM_COLS), (unsigned)((rows + TERM_ROWS - 1) / TERM_ROWS));
}

/* the kernels over gate and up of type G (f32, or bf16: model.h mlp16) */
template <typename G>
static lmx_status glu_terms_of(cuda_backend *cb, float *out, const G *gate, const G *up, int64_t rows, int64_t N, int R,
                               int act, __nv_bfloat16 *gk, __nv_bfloat16 *uk, __nv_bfloat16 *ok, term_arg ag, term_arg au) {
    if (tc_fits(R, N, rows, (uintptr_t)out | (uintptr_t)gate | (uintptr_t)up | (uintptr_t)gk | (uintptr_t)uk |
                                (uintptr_t)ok)) {
        const dim3 grid((unsigned)((N + TERM_COLS - 1) / TERM_COLS), (unsigned)((rows + TC_ROWS - 1) / TC_ROWS));
        const auto k = R == 8 ? k_glu_terms_tc<8, G> : k_glu_terms_tc<16, G>;
        const size_t sm = R == 8 ? terms_tc_smem<8, G>() : terms_tc_smem<16, G>();
        k<<<grid, TERM_COLS, sm, cb->stream>>>(out, gk, uk, ok, gate, up, rows, N, act, ag, au);
        return cuda_check_launch(cb, "glu with lora terms");
    }
    const dim3 grid = term_grid(rows, N);
    switch (R) {
    case 8: k_glu_terms<8, G><<<grid, TERM_COLS, 0, cb->stream>>>(out, gk, uk, ok, gate, up, rows, N, act, ag, au); break;
    case 16: k_glu_terms<16, G><<<grid, TERM_COLS, 0, cb->stream>>>(out, gk, uk, ok, gate, up, rows, N, act, ag, au); break;
    default: k_glu_terms<32, G><<<grid, TERM_COLS, 0, cb->stream>>>(out, gk, uk, ok, gate, up, rows, N, act, ag, au); break;
    }
    return cuda_check_launch(cb, "glu with lora terms");
}

/* bf16 gate and up [rows, N] with terms the kernels do not take: f32 copies of both, the terms added to them by
 * GEMMs, then the plain pass over the copies */
static lmx_status glu_terms_widened(cuda_backend *cb, float *out, const void *gate, const void *up, int64_t rows,
                                    int64_t N, int act, __nv_bfloat16 *gk, __nv_bfloat16 *uk, __nv_bfloat16 *ok,
                                    const lmx_lora_term *tg, const lmx_lora_term *tu) {
    const lmx_tensor g16 = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {rows, N}, .data = (void *)gate};
    const lmx_tensor u16 = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {rows, N}, .data = (void *)up};
    lmx_tensor gw = {}, uw = {};
    lmx_status st = cuda_widen(cb, &gw, &g16);
    if (!st) st = cuda_widen(cb, &uw, &u16);
    if (!st && tg) st = term_gemm(cb, (float *)gw.data, tg);
    if (!st && tu) st = term_gemm(cb, (float *)uw.data, tu);
    if (!st) /* rank 8 with no terms: the plain pass */
        st = glu_terms_of(cb, out, (const float *)gw.data, (const float *)uw.data, rows, N, 8, act, gk, uk, ok,
                          term_of(NULL), term_of(NULL));
    if (gw.data) cb->base.ops->release(&cb->base, &gw);
    if (uw.data) cb->base.ops->release(&cb->base, &uw);
    return st;
}

lmx_status cuda_glu_terms(cuda_backend *cb, float *out, const void *gate, const void *up, int in16, int64_t n, int act,
                          __nv_bfloat16 *gk, __nv_bfloat16 *uk, __nv_bfloat16 *ok, const lmx_lora_term *tg,
                          const lmx_lora_term *tu, int *done) {
    int rg = 0, ru = 0;
    int64_t N = 0, Nu = 0;
    lmx_status st = tg ? term_rank(cb, tg, n, &rg, &N) : LMX_OK;
    if (!st && tu) st = term_rank(cb, tu, n, &ru, &Nu);
    if (st) return st;
    const int R = tg ? rg : ru;
    *done = 0;
    if (!R || (tg && tu && (rg != ru || N != Nu))) { /* the GEMMs into gate and up, then the plain kernel */
        if (in16) { /* into f32 copies of them */
            *done = 1;
            return glu_terms_widened(cb, out, gate, up, n / (tg ? N : Nu), tg ? N : Nu, act, gk, uk, ok, tg, tu);
        }
        if (tg && (st = term_gemm(cb, (float *)gate, tg))) return st;
        if (tu) st = term_gemm(cb, (float *)up, tu);
        return st;
    }
    if (!tg) N = Nu;
    const int64_t rows = n / N;
    *done = 1;
    if (in16)
        return glu_terms_of(cb, out, (const __nv_bfloat16 *)gate, (const __nv_bfloat16 *)up, rows, N, R, act, gk, uk, ok,
                            term_of(tg), term_of(tu));
    return glu_terms_of(cb, out, (const float *)gate, (const float *)up, rows, N, R, act, gk, uk, ok, term_of(tg),
                        term_of(tu));
}

lmx_status cuda_bwd_lora_add(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int64_t n, const lmx_lora_term *term) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    if (st || n <= 0) return st;
    if (y->dtype != LMX_DTYPE_F32 || (x && x->dtype != LMX_DTYPE_F32))
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "add with a lora term: f32 only");
    int R = 0;
    int64_t N = 0;
    if ((st = term_rank(cb, term, n, &R, &N))) return st;
    if (!R) { /* the GEMM, then the add op */
        if ((st = term_gemm(cb, (float *)y->data, term))) return st;
        return x ? be->ops->add(be, y, x, n) : LMX_OK;
    }
    const int64_t rows = n / N;
    const dim3 grid = term_grid(rows, N);
    const term_arg a = term_of(term);
    float *yd = (float *)y->data;
    const float *xd = x ? (const float *)x->data : NULL;
    switch (R) {
    case 8: k_add_term<8><<<grid, TERM_COLS, 0, cb->stream>>>(yd, xd, rows, N, a); break;
    case 16: k_add_term<16><<<grid, TERM_COLS, 0, cb->stream>>>(yd, xd, rows, N, a); break;
    default: k_add_term<32><<<grid, TERM_COLS, 0, cb->stream>>>(yd, xd, rows, N, a); break;
    }
    return cuda_check_launch(cb, "add with a lora term");
}

/* ---- the lora_glu and lora_add ops (backend.h) ----------------------------------------------------- */

/* The pair every one of B sequences has, or NULL (none, or not one for all) */
static const lmx_lora_pair *one_pair(const lmx_lora_pair *const *pairs, int B) {
    for (int b = 0; b < B; b++)
        if (!pairs[b] || pairs[b] != pairs[0]) return NULL;
    return B > 0 ? pairs[0] : NULL;
}

static int any_pair(const lmx_lora_pair *const *pairs, int B) {
    for (int b = 0; b < B; b++)
        if (pairs[b]) return 1;
    return 0;
}

/* xa [rows, r] of x under pair p (the shrink alone) into room i of the scratch slot; its term in *t */
static lmx_status term_shrink(cuda_backend *cb, const lmx_tensor *x, int B, int T, const lmx_lora_pair *const *pairs,
                              float *room, lmx_tensor *xa, lmx_lora_term *t) {
    const lmx_lora_pair *p = pairs[0];
    *xa = (lmx_tensor){.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {(int64_t)B * T, p->a.shape[0]}, .data = room};
    *t = (lmx_lora_term){xa, p};
    return cuda_lora_xa(&cb->base, NULL, x, B, T, pairs, room);
}

lmx_status cuda_op_lora_glu(lmx_backend *be, lmx_tensor *out, lmx_tensor *gate, lmx_tensor *up, const lmx_tensor *x,
                            int B, int T, const lmx_lora_pair *const *pg, const lmx_lora_pair *const *pu, int64_t n,
                            lmx_act act) {
    cuda_backend *cb = (cuda_backend *)be;
    const int hg = any_pair(pg, B), hu = any_pair(pu, B);
    const lmx_lora_pair *p0 = one_pair(pg, B), *p1 = one_pair(pu, B);
    if (T > 1 && (!hg || p0) && (!hu || p1) && (hg || hu)) { /* prefill: one pair a projection for every row */
        lmx_status st = cuda_graph_flush(cb);
        if (st) return st;
        const int64_t rows = (int64_t)B * T, rg = p0 ? p0->a.shape[0] : 0, ru = p1 ? p1->a.shape[0] : 0;
        float *room = (float *)cuda_scratch(cb, CUDA_SCRATCH_TERM, (size_t)rows * (rg + ru + 4) * sizeof(float));
        if (!room) return cb->base.err.status;
        lmx_tensor xg, xu;
        lmx_lora_term tg, tu;
        if (p0) st = term_shrink(cb, x, B, T, pg, room, &xg, &tg);
        if (!st && p1) st = term_shrink(cb, x, B, T, pu, room + ((rows * rg + 3) & ~(int64_t)3), &xu, &tu);
        int done = 0;
        const int o16 = out->dtype == LMX_DTYPE_BF16; /* a prompt's bf16 activations (backend.h) */
        const int in16 = gate->dtype == LMX_DTYPE_BF16; /* training's (model.h mlp16) */
        if (!st && in16 != (up->dtype == LMX_DTYPE_BF16))
            st = lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "cuda lora_glu: gate and up of two dtypes");
        if (!st)
            st = cuda_glu_terms(cb, o16 ? NULL : (float *)out->data, gate->data, up->data, in16, n, (int)act, NULL, NULL,
                                o16 ? (__nv_bfloat16 *)out->data : NULL, p0 ? &tg : NULL, p1 ? &tu : NULL, &done);
        /* not done: a rank the kernel does not take, whose terms GEMMs added to gate and up */
        return st || done ? st : cuda_op_glu(be, out, gate, up, n, act);
    }
    lmx_status st = hg ? cuda_op_lora(be, gate, x, B, T, pg) : LMX_OK; /* decode (graphs) and mixed batches */
    if (!st && hu) st = cuda_op_lora(be, up, x, B, T, pu);
    return st ? st : cuda_op_glu(be, out, gate, up, n, act);
}

lmx_status cuda_op_lora_add(lmx_backend *be, lmx_tensor *y, lmx_tensor *proj, const lmx_tensor *x, int B, int T,
                            const lmx_lora_pair *const *pairs, int64_t n) {
    cuda_backend *cb = (cuda_backend *)be;
    const lmx_lora_pair *p = one_pair(pairs, B);
    if (T > 1 && p) {
        lmx_status st = cuda_graph_flush(cb);
        const size_t bytes = (size_t)B * T * p->a.shape[0] * sizeof(float);
        float *room = st ? NULL : (float *)cuda_scratch(cb, CUDA_SCRATCH_TERM, bytes);
        if (!room) return cb->base.err.status;
        lmx_tensor xa;
        lmx_lora_term t;
        st = term_shrink(cb, x, B, T, pairs, room, &xa, &t);
        return st ? st : cuda_bwd_lora_add(be, y, proj, n, &t);
    }
    lmx_status st = any_pair(pairs, B) ? cuda_op_lora(be, proj, x, B, T, pairs) : LMX_OK;
    return st ? st : cuda_op_add(be, y, proj, n);
}
