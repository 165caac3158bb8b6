/* cuda_lora_udb.cu - LoRA backward's two products over dy in one read of it: u = s dy B [rows, r] and
 * dB += s dy^T t [N, r] (t = x A^T [rows, r]), dy bf16 [rows, N] (the tape's copy).  cuBLAS took two GEMMs,
 * each reading all of dy (the 8B's gate / up: 235 MB twice a projection), and narrowed B and t first.
 *
 * A block: 8 warps side by side over 512 columns of dy (a warp 64: two groups of 32) and a chunk of rows,
 * walked a 16-row slab at a time, the next slab's loads on their way while the products take this one.
 * Lane (g = lane / 4, q = lane % 4) loads rows g and g + 8 of the slab, 16 bytes a row a group: columns
 * 8q .. 8q + 7, register j holding columns 8q + 2j, 8q + 2j + 1.  Both products read those registers as
 * they are, by choosing the order of the sums (any order of k is the same product, with B's rows or t's rows
 * taken in that order too):
 *   u  (m16n8k16, M = rows, K = columns): k16 chunk c of a group takes registers 2c and 2c + 1 as the A
 *      fragment's k 2q.. and 2q + 8.. (columns 8q + 4c + {0, 1} and {2, 3});
 *   dB^T = t^T dy (M = ranks, K = rows, N = columns): register j of all lanes is the 8 x 8 matrix M_j
 *      [row g][columns 8q + 2j + e], whose transpose (movmatrix) is the B fragment of an n-tile of columns
 *      8 (n / 2) + 2j + n % 2.
 * u's partial sums over a block's columns meet in shared memory and go to upart [strip][rows][r]; dB's over a
 * chunk's rows stay in registers and go to dbpart [chunk][N][r]; k_udb_sum adds them up in a fixed order
 * (the same bits every run).  Ranks 8 and 16, N a multiple of 512. */
#include "cuda_mma.h"

#define UDB_WARPS 8
#define UDB_BN (UDB_WARPS * 64) /* columns a block */
#define UDB_ROWS 16             /* rows a turn: one slab */

static __device__ __forceinline__ uint32_t mov_trans(uint32_t a) {
    uint32_t d;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
    return d;
}

/* the bf16 pair (m[i0], m[i1]) */
static __device__ __forceinline__ uint32_t pair_of(const float *m, int64_t i0, int64_t i1) {
    return pack_bf16(__ldg(m + i0), __ldg(m + i1));
}

/* lane (g, q)'s 16 bytes of rows g and g + 8 of the slab at row rb, both groups (zeros past r1) */
static __device__ __forceinline__ void udb_load(uint4 (&v)[2][2], const __nv_bfloat16 *dy, int64_t rb, int64_t r1,
                                                int64_t N, int64_t c) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int64_t row = rb + h * 8;
#pragma unroll
        for (int G = 0; G < 2; G++)
            v[G][h] = row < r1 ? *(const uint4 *)(dy + row * N + c + 32 * G) : make_uint4(0, 0, 0, 0);
    }
}

template <int R>
__global__ void __launch_bounds__(UDB_WARPS * 32, 2) k_lora_udb(float *upart, float *dbpart, const __nv_bfloat16 *dy,
                                                                const float *B, const float *t, int64_t rows,
                                                                int64_t N, int chunk) {
    constexpr int NT = R / 8; /* u's n-tiles */
    __shared__ __align__(16) float su[2][UDB_WARPS][UDB_ROWS * R];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int64_t col0 = (int64_t)blockIdx.x * UDB_BN + warp * 64;
    const int64_t r0 = (int64_t)blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
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
    uint4 v[2][2];          /* the slab's rows: [group][row g, g + 8]; the next slab's on their way meanwhile */
    udb_load(v, dy, r0 + g, r1, N, col0 + 8 * q);
    for (int64_t rb = r0, turn = 0; rb < r1; rb += UDB_ROWS, turn++) {
        uint4 vn[2][2];
        udb_load(vn, dy, rb + UDB_ROWS + g, r1, N, col0 + 8 * q);
        uint32_t at[4]; /* t^T's A fragment: ranks g (g + 8), rows 2q, 2q + 1 (2q + 8, 2q + 9) of the slab */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int64_t row = rb + 2 * q + 8 * (i >> 1);
            const int rk = g + 8 * (i & 1);
            at[i] = pack_bf16(rk < R && row < r1 ? __ldg(t + row * R + rk) : 0.0f,
                              rk < R && row + 1 < r1 ? __ldg(t + (row + 1) * R + rk) : 0.0f);
        }
        float u[NT][4] = {};
#pragma unroll
        for (int G = 0; G < 2; G++) {
            const uint32_t w[4] = {v[G][0].x, v[G][0].y, v[G][0].z, v[G][0].w};
            const uint32_t x[4] = {v[G][1].x, v[G][1].y, v[G][1].z, v[G][1].w};
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const uint32_t a[4] = {w[2 * c], x[2 * c], w[2 * c + 1], x[2 * c + 1]};
#pragma unroll
                for (int nt = 0; nt < NT; nt++) mma_bf16(u[nt], a, bu[G][c][nt][0], bu[G][c][nt][1]);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) mma_bf16(db[G][j], at, mov_trans(w[j]), mov_trans(x[j]));
        }
        /* u's partial sums of the warps' columns, added in warp order */
        float *sw = su[turn & 1][warp];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int rk = 8 * nt + 2 * q;
            sw[g * R + rk] = u[nt][0], sw[g * R + rk + 1] = u[nt][1];
            sw[(g + 8) * R + rk] = u[nt][2], sw[(g + 8) * R + rk + 1] = u[nt][3];
        }
        __syncthreads(); /* the turn before this one read the other buffer: one barrier a turn */
        for (int i = threadIdx.x; i < UDB_ROWS * R; i += UDB_WARPS * 32) {
            const int64_t row = rb + i / R;
            if (row >= r1) break;
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < UDB_WARPS; k++) sum += su[turn & 1][k][i];
            upart[((int64_t)blockIdx.x * rows + row) * R + i % R] = sum;
        }
#pragma unroll
        for (int G = 0; G < 2; G++) v[G][0] = vn[G][0], v[G][1] = vn[G][1];
    }
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
 * B [N, r], t [rows, r] f32, dy [rows, N] bf16 (16-byte aligned) */
lmx_status cuda_lora_udb(cuda_backend *cb, float *u, float *db, const __nv_bfloat16 *dy, const float *B, const float *t,
                         int64_t rows, int64_t N, int r, float s, int *done) {
    *done = 0;
    if ((r != 8 && r != 16) || N % UDB_BN || rows < UDB_ROWS || ((uintptr_t)dy & 15)) return LMX_OK;
    const int strips = (int)(N / UDB_BN);
    /* chunks of rows: one wave of two blocks a multiprocessor, each of at least 128 rows (dB's partial sums
     * stay small beside dy) */
    int chunks = 2 * cb->sm_count / strips;
    if (chunks > rows / 128) chunks = (int)(rows / 128);
    if (chunks < 1) chunks = 1;
    const int chunk = (int)(((rows + chunks - 1) / chunks + UDB_ROWS - 1) / UDB_ROWS * UDB_ROWS);
    chunks = (int)((rows + chunk - 1) / chunk);
    const size_t nu = (size_t)strips * rows * r, nd = (size_t)chunks * N * r;
    float *part = (float *)cuda_scratch(cb, CUDA_SCRATCH_UDB, (nu + nd) * sizeof(float));
    if (!part) return cb->base.err.status;
    const dim3 grid((unsigned)strips, (unsigned)chunks);
    if (r == 8) k_lora_udb<8><<<grid, UDB_WARPS * 32, 0, cb->stream>>>(part, part + nu, dy, B, t, rows, N, chunk);
    else k_lora_udb<16><<<grid, UDB_WARPS * 32, 0, cb->stream>>>(part, part + nu, dy, B, t, rows, N, chunk);
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
