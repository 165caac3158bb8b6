/* cuda_repack.cu - GGUF 4-bit and 8-bit blocks rewritten on upload as MLX affine groups of 32.
 *
 * Every Q4_0, Q4_1, Q4_K and Q8_0 group of 32 weights is an affine map of its codes, w = scale * q + bias:
 * Q4_0 d (q - 8), Q4_1 d q + m, Q4_K (d sc) q - (dmin m) with the sub-block's 6-bit sc and m, Q8_0 d q
 * (q + 128 unsigned, bias -128 d).  The MLX kernels (cuda_gemv_tc.cu, cuda_gstream.cu, cuda_ggml.cu's MLX
 * rows) read that layout with far fewer instructions a weight than the GGUF ones decode the blocks: the
 * codes in order, eight 4-bit (four 8-bit) to a word, one 16-byte load a lane a step, and the scale and
 * bias of the group as two 16-bit loads, nothing to unpack.  So on upload the cuda backend writes such a
 * weight as MLX [N, K] with groups of 32 and f16 scales and biases: Q4_0, Q4_1 and Q8_0 exactly (their d
 * and m are f16 already, and 8 d, 128 d too unless they overflow), Q4_K within f16's rounding of d sc and
 * dmin m (relative 2^-12; the tensor-core GEMV decodes f16-scaled groups in f16, cuda_gemv_tc.cu, so
 * nothing rounds them further).  The cost is bytes: Q4_K 4.5 -> 5 bits a weight (+11%), Q4_0 4.5 -> 5, Q8_0 8.5 -> 9; Q4_1 is 5
 * either way.  A group whose values q s + b leave f16's range keeps the weight in its GGUF blocks.
 *
 * The source blocks go up in chunks of rows through a staging buffer of at most 64 MB, converted by one
 * thread a group.
 *
 * Q6_K keeps its blocks but not their spacing: a 210-byte block is only 2-byte aligned in a row, so a lane
 * read its codes as words joined by funnel shifts (30 loads for 128 elements), and the one-row GEMV over a
 * Q4_K_M file's Q6_K head was bound by its load queue at under half the bandwidth.  On upload each block
 * moves to a 224-byte slot (LMX_GGML_Q6_K_A16, +6.7% bytes) where its fields are 16-byte aligned. */
#include "cuda_repack.h"

#include "../../formats/ggml_types.h"

#define REPACK_STAGE (64u << 20)

static __device__ __forceinline__ float rp_half(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

/* Group gk of the row at row (type T): its 32 codes, scale and bias. */
template <int T> static __device__ void rp_group(const uint8_t *row, int gk, uint8_t (&q)[32], float &s, float &b) {
    if constexpr (T == LMX_GGML_Q4_K) { /* d, dmin, scales[12], qs[128]: element 64 c + 32 h + l is nibble h of qs[32 c + l] */
        const uint8_t *blk = row + (int64_t)(gk / 8) * 144, *sc = blk + 4, *qs = blk + 16;
        const int j = gk % 8;
        int s6, m6;
        lmx_ggml_k4_scale_min(sc, j, &s6, &m6);
        s = rp_half(blk) * (float)s6, b = -(rp_half(blk + 2) * (float)m6);
        for (int e = 0; e < 32; e++) q[e] = (qs[32 * (j / 2) + e] >> (4 * (j % 2))) & 15;
    } else if constexpr (T == LMX_GGML_Q8_0) { /* d, int8 qs[32] */
        const uint8_t *blk = row + (int64_t)gk * 34;
        s = rp_half(blk), b = -128.0f * s;
        for (int e = 0; e < 32; e++) q[e] = (uint8_t)((int)(int8_t)blk[2 + e] + 128);
    } else { /* Q4_0: d, qs[16]; Q4_1: d, m, qs[16]: element l low nibble of qs[l], 16 + l its high nibble */
        constexpr int BY = T == LMX_GGML_Q4_0 ? 18 : 20;
        const uint8_t *blk = row + (int64_t)gk * BY, *qs = blk + BY - 16;
        s = rp_half(blk), b = T == LMX_GGML_Q4_0 ? -8.0f * s : rp_half(blk + 2);
        for (int e = 0; e < 16; e++) q[e] = qs[e] & 15, q[16 + e] = qs[e] >> 4;
    }
}

/* groups [N rows, G a row] of src (rows of row_bytes) -> MLX words (BITS 4: 4 a group, 8: 8), f16 scale and
 * bias a group; *bad |= 1 where a group's values leave f16's range. */
template <int T, int BITS>
__global__ void k_repack(const uint8_t *__restrict__ src, int64_t row_bytes, int G, int64_t groups, uint32_t *__restrict__ w,
                         __half *__restrict__ sc, __half *__restrict__ bi, int *bad) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= groups) return;
    uint8_t q[32];
    float s, b;
    rp_group<T>(src + (i / G) * row_bytes, (int)(i % G), q, s, b);
    constexpr int PER = 32 / BITS, WORDS = 32 / PER; /* codes a word, words a group */
#pragma unroll
    for (int k = 0; k < WORDS; k++) {
        uint32_t v = 0;
#pragma unroll
        for (int e = 0; e < PER; e++) v |= (uint32_t)q[PER * k + e] << (BITS * e);
        w[i * WORDS + k] = v;
    }
    const __half hs = __float2half_rn(s), hb = __float2half_rn(b);
    /* the tensor-core GEMV forms q s + b in f16 (cuda_gemv_tc.cu): a finite scale is not enough */
    if (!cuda_f16_affine_fits((float)((1 << BITS) - 1), __half2float(hs), __half2float(hb))) atomicOr(bad, 1);
    sc[i] = hs, bi[i] = hb;
}

int cuda_repack_bits(const cuda_backend *cb, const lmx_tensor *w) {
    /* a mixture model's weights keep their blocks: the GGUF mixture kernels (cuda_moe.cu) fold the router's norm
     * and the routing in, the MLX ones do not (measured on an H100, Qwen3-30B-A3B Q4_K_M, 12 layers: 1,430 -> 273
     * tok/s); its attention rewritten, one row decodes slower too (H200, 12 / 48 layers: 1,599-1,604 / 483-488
     * -> 1,556-1,568 / 476-477 tok/s; batch 8 2-3% faster) */
    if (!cb->gguf_repack || w->ndim != 2 || w->shape[1] % 32 || w->q.experts) return 0;
    switch (w->q.ggml_type) {
    case LMX_GGML_Q4_0:
    case LMX_GGML_Q4_1:
    case LMX_GGML_Q4_K: return 4;
    case LMX_GGML_Q8_0: return 8;
    default: return 0;
    }
}

typedef void (*repack_fn)(const uint8_t *, int64_t, int, int64_t, uint32_t *, __half *, __half *, int *);

lmx_status cuda_repack(cuda_backend *cb, const lmx_tensor *w, int bits, void *words, void *scales, void *biases,
                       int *ok) {
    *ok = 0;
    const int type = w->q.ggml_type;
    const int64_t N = w->shape[0], K = w->shape[1], G = K / 32, rb = (int64_t)lmx_ggml_row_bytes(type, K);
    repack_fn k = type == LMX_GGML_Q4_K   ? k_repack<LMX_GGML_Q4_K, 4>
                  : type == LMX_GGML_Q4_0 ? k_repack<LMX_GGML_Q4_0, 4>
                  : type == LMX_GGML_Q4_1 ? k_repack<LMX_GGML_Q4_1, 4>
                                          : k_repack<LMX_GGML_Q8_0, 8>;
    int64_t chunk = REPACK_STAGE / rb; /* rows a chunk */
    if (chunk < 1) chunk = 1;
    if (chunk > N) chunk = N;
    /* the staging buffer and the flag after it, from the stream's pool (reused by the next weight, then by
     * activations) */
    const size_t sbytes = ((size_t)(chunk * rb) + 15) / 16 * 16;
    uint8_t *stage = NULL;
    int flag = 0;
    lmx_status st = LMX_OK;
    int *bad = NULL;
    cudaError_t e = cudaMallocFromPoolAsync((void **)&stage, sbytes + 16, cb->pool, cb->stream);
    if (e == cudaSuccess) bad = (int *)(stage + sbytes), e = cudaMemsetAsync(bad, 0, sizeof(int), cb->stream);
    for (int64_t r0 = 0; e == cudaSuccess && r0 < N; r0 += chunk) {
        const int64_t n = N - r0 < chunk ? N - r0 : chunk, groups = n * G;
        /* (the copy into the staging buffer waits on the stream for the kernel that read it last) */
        e = cudaMemcpyAsync(stage, (const uint8_t *)w->data + r0 * rb, (size_t)(n * rb), cudaMemcpyHostToDevice, cb->stream);
        if (e != cudaSuccess) break;
        cuda_launch(cb, k, dim3((unsigned)((groups + 255) / 256)), 256, 0, (const uint8_t *)stage, rb, (int)G, groups,
                    (uint32_t *)words + r0 * G * bits /* bits words a group */, (__half *)scales + r0 * G,
                    (__half *)biases + r0 * G, bad);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaMemcpyAsync(&flag, bad, sizeof(int), cudaMemcpyDeviceToHost, cb->stream);
    if (stage) cudaFreeAsync(stage, cb->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cb->stream);
    if (e != cudaSuccess) st = cuda_fail(cb, e, "weight upload (GGUF repack)");
    if (!st) *ok = !flag;
    return st;
}

int cuda_stored_ggml(int type) { return type == LMX_GGML_Q6_K ? LMX_GGML_Q6_K_A16 : type; }

lmx_status cuda_upload_aligned(cuda_backend *cb, const lmx_tensor *w, void *dst) {
    const int from = lmx_ggml_block_bytes(w->q.ggml_type), to = lmx_ggml_block_bytes(cuda_stored_ggml(w->q.ggml_type));
    const int64_t blocks = (int64_t)(cuda_weight_bytes(w) / (size_t)to), chunk = REPACK_STAGE / from;
    uint8_t *stage = NULL;
    cudaError_t e = cudaMemsetAsync(dst, 0, (size_t)(blocks * to), cb->stream); /* the gaps */
    if (e == cudaSuccess && blocks > 0)
        e = cudaMallocFromPoolAsync((void **)&stage, (size_t)((blocks < chunk ? blocks : chunk) * from), cb->pool, cb->stream);
    for (int64_t b0 = 0; e == cudaSuccess && b0 < blocks; b0 += chunk) {
        const int64_t n = blocks - b0 < chunk ? blocks - b0 : chunk;
        e = cudaMemcpyAsync(stage, (const uint8_t *)w->data + b0 * from, (size_t)(n * from), cudaMemcpyHostToDevice, cb->stream);
        if (e == cudaSuccess)
            e = cudaMemcpy2DAsync((uint8_t *)dst + b0 * to, (size_t)to, stage, (size_t)from, (size_t)from, (size_t)n,
                                  cudaMemcpyDeviceToDevice, cb->stream);
    }
    if (stage) cudaFreeAsync(stage, cb->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cb->stream); /* the host blocks may go away */
    return e == cudaSuccess ? LMX_OK : cuda_fail(cb, e, "weight upload (Q6_K aligned)");
}

void cuda_host_aligned(const lmx_tensor *w, void *dst) {
    const int from = lmx_ggml_block_bytes(w->q.ggml_type), to = lmx_ggml_block_bytes(cuda_stored_ggml(w->q.ggml_type));
    const int64_t blocks = (int64_t)(cuda_weight_bytes(w) / (size_t)to);
    for (int64_t b = 0; b < blocks; b++) {
        memcpy((uint8_t *)dst + b * to, (const uint8_t *)w->data + b * from, (size_t)from);
        memset((uint8_t *)dst + b * to + from, 0, (size_t)(to - from));
    }
}
