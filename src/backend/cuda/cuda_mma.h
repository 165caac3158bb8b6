/* cuda_mma.h - the warp-level tensor-core pieces the flash-attention kernels share (cuda_flash.cu,
 * cuda_flash_bwd.cu): shared-memory addresses, ldmatrix, bf16 mma.sync m16n8k16 with f32
 * accumulators, cp.async and bf16 packing.
 *
 * Fragment layout of m16n8k16 (g = lane / 4, t = lane % 4): A (16 x 16, row-major) a0 = A[g][2t, 2t+1],
 * a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9]; B (16 x 8) b0 = B[2t, 2t+1][g],
 * b1 = B[2t+8, 2t+9][g]; C (16 x 8) c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1].  So the
 * accumulators of two adjacent n-tiles are the A operand of one k-step of a following product. */
#ifndef LMX_BACKEND_CUDA_MMA_H
#define LMX_BACKEND_CUDA_MMA_H

#include "cuda_internal.h"

static __device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

static __device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* c += a (16x16, row) * b (16x8, col), bf16 operands, f32 accumulators */
static __device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* the same in f16 */
static __device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
/* the same, zeros where bytes is 0 (src then unread) */
static __device__ __forceinline__ void cp_async16_or_zeros(uint32_t dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
/* 4 bytes, or 4 zeros where bytes is 0 (through L1: cp.async takes 4-byte copies only there) */
static __device__ __forceinline__ void cp_async4_or_zeros(uint32_t dst, const void *src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* A double-buffered loop's turn: start the next tile's copies (more: there is one; load_next issues and
 * commits them), wait for this tile's, and make them visible to the block. */
template <class F> static __device__ __forceinline__ void cp_async_turn(bool more, F &&load_next) {
    if (more) {
        load_next();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
}

static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* The A operand of 16 rows x 16 columns at (row0, col0) of a row-major bf16 tile with ld elements a row. */
static __device__ __forceinline__ void ldsm_a(uint32_t (&r)[4], const __nv_bfloat16 *tile, int ld, int row0, int col0) {
    const int lane = threadIdx.x % 32;
    ldsm_x4(r, smem_addr(tile + (row0 + (lane % 8) + 8 * ((lane / 8) % 2)) * ld + col0 + 8 * (lane / 16)));
}

/* The B operands of two n-tiles (n0..n0+15) for the k-step k0..k0+15 of a tile stored [n][k] (r[0..1]: n-tile
 * n0, r[2..3]: n0 + 8). */
static __device__ __forceinline__ void ldsm_b_nk(uint32_t (&r)[4], const __nv_bfloat16 *tile, int ld, int n0, int k0) {
    const int lane = threadIdx.x % 32;
    ldsm_x4(r, smem_addr(tile + (n0 + (lane % 8) + 8 * (lane / 16)) * ld + k0 + 8 * ((lane / 8) % 2)));
}

/* The same from a tile stored [k][n] (transposed by ldmatrix). */
static __device__ __forceinline__ void ldsm_b_kn(uint32_t (&r)[4], const __nv_bfloat16 *tile, int ld, int n0, int k0) {
    const int lane = threadIdx.x % 32;
    ldsm_x4_trans(r, smem_addr(tile + (k0 + (lane % 8) + 8 * ((lane / 8) % 2)) * ld + n0 + 8 * (lane / 16)));
}

/* The A operand of k-step kk made from the f32 accumulators of n-tiles 2kk and 2kk + 1, rounded to bf16. */
static __device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = pack_bf16(c0[0], c0[1]);
    a[1] = pack_bf16(c0[2], c0[3]);
    a[2] = pack_bf16(c1[0], c1[1]);
    a[3] = pack_bf16(c1[2], c1[3]);
}

/* c [N][4] = 0 */
template <int N> static __device__ __forceinline__ void acc_zero(float (&c)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;
}

/* One warp's c [N][4] = A B^T over K columns: A the 16 rows from row0 of a tile [rows][K], B the 8 N rows
 * of a tile [8 N][K] (both bf16, ld elements a row). */
template <int K, int N>
static __device__ __forceinline__ void mma_abt(float (&c)[N][4], const __nv_bfloat16 *a, int row0,
                                               const __nv_bfloat16 *b, int ld) {
    acc_zero(c);
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        uint32_t af[4];
        ldsm_a(af, a, ld, row0, kk * 16);
#pragma unroll
        for (int j = 0; j < N; j += 2) {
            uint32_t bf[4];
            ldsm_b_nk(bf, b, ld, 8 * j, kk * 16);
            mma_bf16(c[j], af, bf[0], bf[1]);
            mma_bf16(c[j + 1], af, bf[2], bf[3]);
        }
    }
}

/* One warp's c [N][4] += P T: P the accumulators p [K/8][4] of a 16 x K product (rounded to bf16 as the A
 * operand), T a tile [K][8 N] (bf16, ld elements a row). */
template <int K, int N>
static __device__ __forceinline__ void mma_acc_pt(float (&c)[N][4], const float (&p)[K / 8][4],
                                                  const __nv_bfloat16 *t, int ld) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        uint32_t af[4];
        acc_to_a(af, p[2 * kk], p[2 * kk + 1]);
#pragma unroll
        for (int j = 0; j < N; j += 2) {
            uint32_t bf[4];
            ldsm_b_kn(bf, t, ld, 8 * j, 16 * kk);
            mma_bf16(c[j], af, bf[0], bf[1]);
            mma_bf16(c[j + 1], af, bf[2], bf[3]);
        }
    }
}

#endif
