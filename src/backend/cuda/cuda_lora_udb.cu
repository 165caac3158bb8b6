/* cuda_lora_udb.cu - LoRA backward's two products over dy in one read of it: u = s dy B [rows, r] and
 * dB += s dy^T t [N, r] (t = x A^T [rows, r]), dy bf16 [rows, N] (the tape's copy).  cuBLAS took two GEMMs,
 * each reading all of dy (the 8B's gate / up: 235 MB twice a projection), and narrowed B and t first.
 *
 * A block: 8 warps side by side over 512 columns of dy (a warp 64: two groups of 32) and a chunk of rows,
 * walked a 16-row slab (a turn) at a time.  Each warp copies its slabs of dy (16 rows x its 64 columns, 2 KB) by
 * cp.async into a ring of UDB_STAGES in shared memory, UDB_STAGES - 1 slabs ahead of the one it works on, and
 * the block's first threads copy t's 16 rows of the slab (which all its warps read) in the same commit groups.
 * (Loads into registers one slab ahead, the kernel before, read dy at 57% of DRAM's bandwidth at the 8B's
 * shapes, and every turn waited on its loads of t: its gate / up 90-100 us, the ring's 80-90; four or five stages
 * no faster.)  A slab's chunk c (16 bytes: columns 8c .. 8c + 7) of row r
 * lies at r * 8 + (c ^ 4 (r & 1)): a quarter-warp's reads of rows g and g + 1 fall in other banks; t's rows lie
 * R + 4 floats apart (the lanes' reads of rows 2q in other banks).  Rows past the chunk's are zeros.
 * Lane (g = lane / 4, q = lane % 4) reads rows g and g + 8 of the slab, 16 bytes a row a group: columns 8q ..
 * 8q + 7, register j holding columns 8q + 2j, 8q + 2j + 1.  Both products read those registers as they are,
 * by choosing the order of the sums (any order of k is the same product, with B's rows or t's rows taken in
 * that order too):
 *   u  (m16n8k16, M = rows, K = columns): k16 chunk c of a group takes registers 2c and 2c + 1 as the A
 *      fragment's k 2q.. and 2q + 8.. (columns 8q + 4c + {0, 1} and {2, 3});
 *   dB^T = t^T dy (M = ranks, K = rows, N = columns): register j of all lanes is the 8 x 8 matrix M_j
 *      [row g][columns 8q + 2j + e], whose transpose (movmatrix) is the B fragment of an n-tile of columns
 *      8 (n / 2) + 2j + n % 2.
 * u's partial sums over a block's columns meet in shared memory and go to upart [strip][rows][r] at the top of
 * the next turn (after its one barrier); dB's over a chunk's rows stay in registers and go to dbpart
 * [chunk][N][r]; k_udb_sum adds them up in a fixed order (the same bits every run).  Ranks 8 and 16, N a
 * multiple of 512. */
#include "cuda_mma.h"

#define UDB_WARPS 8
#define UDB_BN (UDB_WARPS * 64) /* columns a block */
#define UDB_ROWS 16             /* rows a turn: one slab */
#define UDB_STAGES 3
#define UDB_BLOCKS 2 /* blocks a multiprocessor */

static __device__ __forceinline__ uint32_t mov_trans(uint32_t a) {
    uint32_t d;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
    return d;
}

/* the bf16 pair (m[i0], m[i1]) */
static __device__ __forceinline__ uint32_t pair_of(const float *m, int64_t i0, int64_t i1) {
    return pack_bf16(__ldg(m + i0), __ldg(m + i1));
}

static __device__ __forceinline__ int udb_chunk(int r, int c) { return r * 8 + (c ^ ((r & 1) << 2)); }

/* The block's shared memory: the warps' rings of dy's slabs [UDB_STAGES][UDB_WARPS][128 chunks], t's rows
 * [UDB_STAGES][16][R + 4] f32, u's partial sums [2][UDB_WARPS][16 R] f32 */
template <int R> static constexpr size_t udb_smem() {
    return (size_t)UDB_STAGES * UDB_WARPS * 128 * 16 + (size_t)UDB_STAGES * UDB_ROWS * (R + 4) * 4 +
           (size_t)2 * UDB_WARPS * UDB_ROWS * R * 4;
}

/* The slab of rows rb .. rb + 15 (zeros past r1) into stage s: the warp's columns of dy from col0, and t's rows
 * by the block's first 4 R threads; one commit group (empty past r1) */
template <int R>
static __device__ __forceinline__ void udb_stage(uint4 *ring, float *ts, const __nv_bfloat16 *dy, const float *t,
                                                 int64_t rb, int64_t r1, int64_t N, int64_t col0, int s, int lane) {
    if (rb < r1) {
        uint4 *w = ring + (s * UDB_WARPS + (threadIdx.x >> 5)) * 128;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int i = lane + 32 * k, r = i >> 3, c = i & 7;
            const int64_t row = rb + r;
            const int in = row < r1;
            cp_async16_or_zeros(smem_addr(w + udb_chunk(r, c)), dy + (in ? row : 0) * N + col0 + 8 * c, in ? 16 : 0);
        }
        if (threadIdx.x < UDB_ROWS * R / 4) {
            const int r = threadIdx.x / (R / 4), c = threadIdx.x % (R / 4);
            const int64_t row = rb + r;
            const int in = row < r1;
            cp_async16_or_zeros(smem_addr(ts + (s * UDB_ROWS + r) * (R + 4) + 4 * c), t + (in ? row : 0) * R + 4 * c,
                                in ? 16 : 0);
        }
    }
    cp_async_commit();
}

/* upart's rows rb .. rb + 15 (those before r1) of the block's strip: the warps' partial sums sw
 * [UDB_WARPS][16 R], added in warp order */
template <int R>
static __device__ __forceinline__ void udb_usum(float *upart, const float *sw, int64_t rb, int64_t r1, int64_t rows) {
    for (int i = threadIdx.x; i < UDB_ROWS * R; i += UDB_WARPS * 32) {
        const int64_t row = rb + i / R;
        if (row >= r1) break;
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < UDB_WARPS; k++) sum += sw[k * UDB_ROWS * R + i];
        upart[((int64_t)blockIdx.x * rows + row) * R + i % R] = sum;
    }
}

template <int R>
__global__ void __launch_bounds__(UDB_WARPS * 32, UDB_BLOCKS) k_lora_udb(float *upart, float *dbpart,
                                                                       const __nv_bfloat16 *dy, const float *B,
                                                                       const float *t, int64_t rows, int64_t N,
                                                                       int chunk) {
    constexpr int NT = R / 8, TS = R + 4, SU = UDB_WARPS * UDB_ROWS * R; /* u's n-tiles; t's row stride; su's half */
    extern __shared__ uint4 udb_sm[];
    uint4 *ring = udb_sm;
    float *ts = (float *)(ring + UDB_STAGES * UDB_WARPS * 128), *su = ts + UDB_STAGES * UDB_ROWS * TS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int64_t col0 = (int64_t)blockIdx.x * UDB_BN + warp * 64;
    const int64_t r0 = (int64_t)blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
#pragma unroll
    for (int s = 0; s < UDB_STAGES - 1; s++) udb_stage<R>(ring, ts, dy, t, r0 + UDB_ROWS * s, r1, N, col0, s, lane);
    uint32_t bu[2][2][NT][2]; /* u's B fragments: [group][chunk][n-tile] */
#pragma unroll
    for (int G = 0; G < 2; G++)
#pragma unroll
        for (int c = 0; c < 2; c++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int64_t col = col0 + 32 * G + 8 * q + 4 * c, rk = 8 * nt + g;
                bu[G][c][nt][0] = pair_of(B, col * R + rk, (col + 1) * R + rk);
                bu[G][c][nt][1] = pair_of(B, (col + 2) * R + rk, (col + 3) * R + rk);
            }
    float db[2][4][4] = {}; /* dB^T: [group][n-tile j] */
    const int turns = (int)((r1 - r0 + UDB_ROWS - 1) / UDB_ROWS);
    for (int turn = 0; turn < turns; turn++) {
        const int64_t rb = r0 + (int64_t)UDB_ROWS * turn;
        const int s = turn % UDB_STAGES;
        cp_async_wait<UDB_STAGES - 2>();
        __syncthreads(); /* stage s in for every thread; every warp past the last turn (its stage free, its u in su) */
        udb_stage<R>(ring, ts, dy, t, rb + UDB_ROWS * (UDB_STAGES - 1), r1, N, col0,
                     (turn + UDB_STAGES - 1) % UDB_STAGES, lane);
        if (turn) udb_usum<R>(upart, su + ((turn - 1) & 1) * SU, rb - UDB_ROWS, r1, rows);
        const uint4 *w = ring + (s * UDB_WARPS + warp) * 128;
        const float *tr = ts + s * UDB_ROWS * TS;
        uint32_t at[4]; /* t^T's A fragment: ranks g (g + 8), rows 2q, 2q + 1 (2q + 8, 2q + 9) of the slab */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int row = 2 * q + 8 * (i >> 1), rk = g + 8 * (i & 1);
            at[i] = rk < R ? pack_bf16(tr[row * TS + rk], tr[(row + 1) * TS + rk]) : 0u;
        }
        float u[NT][4] = {};
#pragma unroll
        for (int G = 0; G < 2; G++) {
            const uint4 v0 = w[udb_chunk(g, 4 * G + q)], v1 = w[udb_chunk(g + 8, 4 * G + q)];
            const uint32_t w0[4] = {v0.x, v0.y, v0.z, v0.w}, w1[4] = {v1.x, v1.y, v1.z, v1.w};
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const uint32_t a[4] = {w0[2 * c], w1[2 * c], w0[2 * c + 1], w1[2 * c + 1]};
#pragma unroll
                for (int nt = 0; nt < NT; nt++) mma_bf16(u[nt], a, bu[G][c][nt][0], bu[G][c][nt][1]);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) mma_bf16(db[G][j], at, mov_trans(w0[j]), mov_trans(w1[j]));
        }
        /* u's partial sums of the warp's columns, which the block adds up at the next turn's top */
        float *sw = su + (turn & 1) * SU + warp * UDB_ROWS * R;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int rk = 8 * nt + 2 * q;
            sw[g * R + rk] = u[nt][0], sw[g * R + rk + 1] = u[nt][1];
            sw[(g + 8) * R + rk] = u[nt][2], sw[(g + 8) * R + rk + 1] = u[nt][3];
        }
    }
    cp_async_wait<0>(); /* the empty groups past the chunk */
    __syncthreads();
    if (turns) udb_usum<R>(upart, su + ((turns - 1) & 1) * SU, r0 + (int64_t)UDB_ROWS * (turns - 1), r1, rows);
    /* dB^T's n-tile j of group G: lane (g, q) holds ranks g, g + 8 at columns 8q + 2j + {0, 1} */
#pragma unroll
    for (int G = 0; G < 2; G++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int rk = g + 8 * (e >> 1);
                const int64_t col = col0 + 32 * G + 8 * q + 2 * j + (e & 1);
                if (rk < R) dbpart[((int64_t)blockIdx.y * N + col) * R + rk] = db[G][j][e];
            }
}

/* u = s sum of upart's strips; db += s sum of dbpart's chunks, each in order */
template <int R>
__global__ void k_udb_sum(float *u, float *db, const float *upart, const float *dbpart, int64_t rows, int64_t N,
                          int strips, int chunks, float s) {
    const int64_t nu = rows * R, n = nu + N * R;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float sum = 0.0f;
        if (i < nu) {
            for (int k = 0; k < strips; k++) sum += upart[k * nu + i];
            u[i] = s * sum;
        } else {
            const int64_t j = i - nu;
            for (int k = 0; k < chunks; k++) sum += dbpart[k * N * R + j];
            db[j] += s * sum;
        }
    }
}

/* u [rows, r] = s dy B and db [N, r] += s dy^T t by the kernels above, where they take the shapes (*done 1);
 * B [N, r], t [rows, r] f32, dy [rows, N] bf16 (dy and t 16-byte aligned) */
lmx_status cuda_lora_udb(cuda_backend *cb, float *u, float *db, const __nv_bfloat16 *dy, const float *B, const float *t,
                         int64_t rows, int64_t N, int r, float s, int *done) {
    *done = 0;
    if ((r != 8 && r != 16) || N % UDB_BN || rows < UDB_ROWS || ((uintptr_t)dy & 15) || ((uintptr_t)t & 15))
        return LMX_OK;
    const int strips = (int)(N / UDB_BN);
    /* chunks of rows: one wave of UDB_BLOCKS blocks a multiprocessor, each of at least 128 rows (dB's partial
     * sums stay small beside dy) */
    int chunks = UDB_BLOCKS * cb->sm_count / strips;
    if (chunks > rows / 128) chunks = (int)(rows / 128);
    if (chunks < 1) chunks = 1;
    const int chunk = (int)(((rows + chunks - 1) / chunks + UDB_ROWS - 1) / UDB_ROWS * UDB_ROWS);
    chunks = (int)((rows + chunk - 1) / chunk);
    const size_t nu = (size_t)strips * rows * r, nd = (size_t)chunks * N * r;
    float *part = (float *)cuda_scratch(cb, CUDA_SCRATCH_UDB, (nu + nd) * sizeof(float));
    if (!part) return cb->base.err.status;
    const dim3 grid((unsigned)strips, (unsigned)chunks);
    if (r == 8)
        k_lora_udb<8><<<grid, UDB_WARPS * 32, udb_smem<8>(), cb->stream>>>(part, part + nu, dy, B, t, rows, N, chunk);
    else
        k_lora_udb<16><<<grid, UDB_WARPS * 32, udb_smem<16>(), cb->stream>>>(part, part + nu, dy, B, t, rows, N, chunk);
    lmx_status st = cuda_check_launch(cb, "lora backward (u, dB)");
    if (!st) {
        const int64_t n = (rows + N) * r;
        const unsigned blocks = (unsigned)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
        if (r == 8) k_udb_sum<8><<<blocks, 256, 0, cb->stream>>>(u, db, part, part + nu, rows, N, strips, chunks, s);
        else k_udb_sum<16><<<blocks, 256, 0, cb->stream>>>(u, db, part, part + nu, rows, N, strips, chunks, s);
        st = cuda_check_launch(cb, "lora backward (u, dB sums)");
    }
    if (!st) *done = 1;
    return st;
}

/* the kernels' dynamic shared memory (past 48 KB) allowed, once (cuda_backend.cu, at creation) */
void cuda_lora_udb_init(void) {
    cudaFuncSetAttribute(k_lora_udb<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)udb_smem<8>());
    cudaFuncSetAttribute(k_lora_udb<16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)udb_smem<16>());
    cudaGetLastError();
}
