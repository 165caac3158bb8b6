/* cuda_wgmma.h - Hopper's warpgroup MMA (wgmma, sm_90a) for the kernels that use it (cuda_flash_wg.cu,
 * cuda_flash_bwd_wg.cu): shared-memory tiles in the 128-byte swizzled layout, their descriptors, and the fence /
 * commit / wait around the asynchronous products.  Outside an sm_90a device pass (CUDA_WGMMA undefined) every
 * helper is empty and the kernels are never launched (cuda_backend.wgmma is 0 there).
 *
 * Layout: a tile of R rows and a multiple of 64 bf16 columns is stored as column blocks of 64, each [R][64]
 * (128 bytes a row), the 16-byte chunk c of row r at chunk c ^ (r % 8); blocks 1024-byte aligned.  As a
 * K-major operand (rows = M or N, columns = K) a k16 step starts 32 bytes further into its block (LBO
 * unused, SBO 1024: eight rows); as an MN-major operand (rows = K, columns = N) a k16 step starts 16 rows
 * further (SBO 1024) and the next 64 columns of N are the next block (LBO: the block's bytes).
 * Accumulators d [N/8][4] of m64nNk16 are mma.sync's: warp w of the group holds rows 16w + g and 16w + g + 8
 * (g = lane / 4), columns 8j + 2 (lane % 4) + {0, 1} (cuda_mma.h). */
#ifndef LMX_BACKEND_CUDA_WGMMA_H
#define LMX_BACKEND_CUDA_WGMMA_H

#include "cuda_mma.h"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CUDA_WGMMA 1
#endif

/* The element offset of chunk c (8 bf16) of row r in a [R][64] swizzled block. */
static __device__ __forceinline__ int wg_chunk(int r, int c) { return r * 64 + ((c ^ (r & 7)) << 3); }

/* A shared-memory matrix descriptor: 128-byte swizzle, byte offsets lbo / sbo, start at shared address addr. */
static __device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(sbo >> 4) << 32 | 1ull << 62;
}
static __device__ __forceinline__ uint64_t wg_kmajor(uint32_t addr) { return wg_desc(addr, 16, 1024); }
static __device__ __forceinline__ uint64_t wg_mnmajor(uint32_t addr, uint32_t block_bytes) {
    return wg_desc(addr, block_bytes, 1024);
}

/* Before a group's first product and after other instructions touched its registers. */
static __device__ __forceinline__ void wg_fence() {
#ifdef CUDA_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
static __device__ __forceinline__ void wg_commit() {
#ifdef CUDA_WGMMA
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N> static __device__ __forceinline__ void wg_wait() {
#ifdef CUDA_WGMMA
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
/* Shared memory written by the threads (cp.async included) made visible to wgmma's reads: each writer
 * after its writes completed, before the barrier. */
static __device__ __forceinline__ void wg_proxy_fence() {
#ifdef CUDA_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
/* The accumulators read only after the wait: no use of them moved above it. */
template <int N> static __device__ __forceinline__ void wg_hold(float (&d)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[j][e])::"memory");
}

#include "cuda_wgmma_ops.h"

/* ---- tiles of the flash kernels (cuda_flash_wg.cu, cuda_flash_bwd_wg.cu): 64 rows a warpgroup ---------- */
#define WB_TILE 64 /* key / query rows a tile and a warpgroup */

static __device__ __forceinline__ __attribute__((unused)) unsigned char *wb_smem_base(unsigned char *raw) {
    return (unsigned char *)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023); /* swizzled blocks: 1024-aligned */
}

/* rows [0, R) x D of a [.., ld] bf16 matrix from row r0 (rows past last: row last) into a swizzled tile, by NT
 * threads: a thread copies the same chunk of every RS-th row, so its shared offsets (and swizzle) are fixed */
template <int D, int R, int NT>
static __device__ __forceinline__ void wb_load(__nv_bfloat16 *tile, const __nv_bfloat16 *src, int64_t ld, int r0,
                                               int last) {
    constexpr int CPR = D / 8, RS = NT / CPR; /* chunks a row, rows a pass */
    static_assert(NT % CPR == 0 && RS % 8 == 0 && R % RS == 0, "wb_load: a pass keeps each row's swizzle");
    const int c = threadIdx.x % CPR, rt = threadIdx.x / CPR;
    const uint32_t dst = smem_addr(tile + (c / 8) * R * 64 + wg_chunk(rt, c % 8));
    src += 8 * c;
#pragma unroll
    for (int k = 0; k < R / RS; k++) {
        const int row = r0 + rt + k * RS <= last ? r0 + rt + k * RS : last;
        cp_async16(dst + k * RS * 128, src + row * ld);
    }
}

/* A double-buffered loop's turn (cp_async_turn) whose tiles wgmma reads. */
template <class F> static __device__ __forceinline__ void wb_turn(bool more, F &&load_next) {
    if (more) {
        load_next();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    wg_proxy_fence();
    __syncthreads();
}

/* d = A B^T over D: A 64 rows of a K-major tile at shared address a (its column blocks ablk bytes apart), B a
 * K-major tile of 64 rows at b (blocks bblk bytes apart) */
template <int D>
static __device__ __forceinline__ void wb_abt(float (&d)[8][4], uint32_t a, uint32_t ablk, uint32_t b, uint32_t bblk) {
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const uint32_t o = (kk % 4) * 32; /* bytes: the k16 step inside its block */
        wg_ss_n64(d, wg_kmajor(a + (kk / 4) * ablk + o), wg_kmajor(b + (kk / 4) * bblk + o), kk > 0);
    }
}

/* d [64][D] += P T: P the bf16 A fragments p[4] of a 64 x 64 product, T a [64][D] tile read MN-major */
template <int D>
static __device__ __forceinline__ void wb_acc(float (&d)[D / 8][4], const uint32_t (&p)[4][4], uint32_t t) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const uint64_t db = wg_mnmajor(t + kk * 16 * 128, 64 * 128);
        if constexpr (D == 128) wg_rs_n128_t(d, p[kk], db, 1);
        else wg_rs_n64_t(d, p[kk], db, 1);
    }
}

#endif
