/* cuda_gemv_f32.cu - y [M, N] = x [M, K] @ w [N, K]^T for f32 weights of few rows (a mixture of experts' router,
 * 128 x 2048) and 2..32 rows of x (batched decode), on the CUDA cores in f32.
 *
 * cuBLAS's SIMT GEMM took these in two launches, the product and its split-K reduction (H200, Qwen3-30B-A3B batch
 * 32: 5.7 + 2.4 us a layer; here 5.5 us).  Block (bx, kq) takes weight rows [8 bx, 8 bx + 8) (a warp each, its
 * lanes along K) over K part kq of kp, parts chosen so that the blocks fill the GPU about twice.  The parts meet as
 * k_gemv_tc's do (gv_parts_meet): each leaves its 256 sums in the K parts' scratch and the last block of a row block
 * adds them in part order, so a weight gives the same bits in any launch of the same shapes. */
#include "cuda_gemv.h"

#define F32R_PARTS_MAX 16 /* K parts at most */
#define F32R_PART_MIN 128 /* values a part at least: a warp's float4 load */

/* Block (bx, kq): warp w takes weight row n = 8 bx + w against the MM (8, 16, 32) rows of x over K part kq, its
 * lanes along K, in steps of 128 values: the step's rows of x staged in shared memory by the block, then a float4 of
 * w and of each row a lane.  (Lanes across the rows of x took 32 L1 wavefronts a load: 13.2 us a launch at 32 rows;
 * every warp reading x itself, from L2 as the warps missed L1 together: 11.8 us.) */
template <int MM>
__global__ void __launch_bounds__(256) k_gemv_f32_rows(const float *__restrict__ x, const float *__restrict__ w,
                                                       float *__restrict__ y, int M, int N, int K, int per,
                                                       float *__restrict__ part, int *__restrict__ ticket) {
    __shared__ float4 xs[MM][32]; /* [row of x, float4 of the step] */
    cuda_pdl_trigger();
    cuda_pdl_wait();
    const int lane = threadIdx.x % 32, n = blockIdx.x * 8 + threadIdx.x / 32, kp = gridDim.y;
    const float4 *wr = (const float4 *)(w + (int64_t)(n < N ? n : N - 1) * K); /* clamped: loads stay inside */
    const int v0 = blockIdx.y * per / 4, v1 = min(K, ((int)blockIdx.y + 1) * per) / 4; /* this part's float4s */
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float a[MM] = {}; /* row m of x: a[m] */
    for (int vb = v0; vb < v1; vb += 32) {
        const int v = vb + lane;
        const float4 wv = v < v1 ? __ldg(wr + v) : zero;
#pragma unroll
        for (int j = 0; j < MM / 8; j++) { /* rows past M and values past the part: zeros */
            const int r = j * 8 + threadIdx.x / 32;
            xs[r][lane] = r < M && v < v1 ? __ldg((const float4 *)(x + (int64_t)r * K) + v) : zero;
        }
        __syncthreads();
#pragma unroll
        for (int m = 0; m < MM; m++) {
            const float4 xv = xs[m][lane];
            a[m] += xv.x * wv.x + xv.y * wv.y + xv.z * wv.z + xv.w * wv.w;
        }
        __syncthreads();
    }
    cuda_warp_sums_scattered<16, MM>(a, lane);
    float s[1] = {a[0]}; /* row lane % MM of x */
    const int64_t first = (int64_t)blockIdx.x * kp; /* the row block's first cell */
    if (kp > 1 && !gv_parts_meet<1, F32R_PARTS_MAX>(s, part, first + blockIdx.y, first, ticket + blockIdx.x, kp))
        return;
    if (lane < M && n < N) y[(int64_t)lane * N + n] = s[0];
}

int cuda_gemv_f32_takes(const cuda_backend *cb, const lmx_tensor *w, const lmx_tensor *x, int M) {
    const int64_t N = w->shape[0], K = w->shape[1];
    return cb->gemv_variant != 7 && w->ndim == 2 && w->dtype == LMX_DTYPE_F32 && !w->q.bits && !w->q.ggml_type &&
           x->dtype == LMX_DTYPE_F32 && M >= 2 && M <= 32 && K % 4 == 0 && K <= (1 << 24) &&
           N <= (int64_t)16 * cb->sm_count && (uintptr_t)w->data % 16 == 0 && (uintptr_t)x->data % 16 == 0;
}

lmx_status cuda_gemv_f32(cuda_backend *cb, const lmx_tensor *w, const float *x, float *y, int M) {
    const int N = (int)w->shape[0], K = (int)w->shape[1], groups = (N + 7) / 8;
    /* about two blocks a multiprocessor, parts of at least F32R_PART_MIN values (a multiple of 4) */
    int kp = (2 * cb->sm_count + groups - 1) / groups;
    kp = kp > F32R_PARTS_MAX ? F32R_PARTS_MAX : kp;
    if (kp > K / F32R_PART_MIN) kp = K / F32R_PART_MIN > 1 ? K / F32R_PART_MIN : 1;
    float *part = NULL;
    int *ticket = kp > 1 ? cuda_gemv_tc_scratch(cb, &part) : NULL;
    if (!ticket) kp = 1; /* groups <= 2 SMs (takes): within the scratch's tickets and cells */
    const int per = ((K + kp - 1) / kp + F32R_PART_MIN - 1) / F32R_PART_MIN * F32R_PART_MIN; /* whole steps */
    kp = (K + per - 1) / per;
    const auto k = M <= 8 ? k_gemv_f32_rows<8> : M <= 16 ? k_gemv_f32_rows<16> : k_gemv_f32_rows<32>;
    cuda_launch(cb, k, dim3((unsigned)groups, (unsigned)kp), 256, 0, x, (const float *)w->data, y, M, N, K, per, part,
                ticket);
    return cuda_check_launch(cb, "matmul (f32, few rows)");
}
