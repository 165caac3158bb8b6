/* cpu_backward.c - the cpu backend's backward ops (backward.h): vector-Jacobian products of the
 * forward ops, accumulated into the input gradients.
 *
 * Matrix products go through OpenBLAS sgemm: a frozen weight is widened a tile of rows at a time
 * (cpu_row_to_f32: dense, MLX or GGUF), never whole.  Element-wise ops are plain loops; attention
 * recomputes each query row's probabilities from q and k (one row of scores at a time) through the
 * kernel table's dot / axpy kernels, a task per (sequence, kv head) on the pool.
 * Each op's working memory is allocated per call and counted against the backend's memory. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../act_grad.h"
#include "../backward.h"
#include "cpu_backend.h"

#define BWD_TILE_BYTES (4u << 20) /* f32 weight rows widened at once in matmul_bwd */

static void zero_tensor(lmx_tensor *d) { memset(d->data, 0, (size_t)lmx_tensor_nelem(d) * lmx_dtype_size(d->dtype)); }

/* A fresh gradient (backward.h): zeros, then added to as any other */
static void fresh_zero(lmx_tensor *d, unsigned fresh, unsigned bit) {
    if (d && (fresh & bit)) zero_tensor(d);
}

static lmx_status cpu_rmsnorm_bwd(lmx_backend *be, lmx_tensor *dx, const lmx_tensor *dy, const lmx_tensor *x,
                                  const lmx_tensor *w, int rows, int n, float eps, float add_one, unsigned fresh) {
    fresh_zero(dx, fresh, 1);
    float *g = cpu_work(be, (size_t)n, "rmsnorm backward");
    if (!g) return be->err.status;
    cpu_row_to_f32((const cpu_backend *)be, g, w, 0, n);
    for (int i = 0; i < n; i++) g[i] += add_one;
    for (int r = 0; r < rows; r++) {
        const float *xr = (const float *)x->data + (int64_t)r * n, *dyr = (const float *)dy->data + (int64_t)r * n;
        float *dxr = (float *)dx->data + (int64_t)r * n;
        double ss = 0, dot = 0;
        for (int i = 0; i < n; i++) {
            ss += (double)xr[i] * xr[i];
            dot += (double)dyr[i] * g[i] * xr[i];
        }
        /* y_i = x_i inv g_i with inv = (ss/n + eps)^-1/2: dx_i = inv g_i dy_i - x_i inv^3 dot / n */
        const double inv = 1.0 / sqrt(ss / n + eps), c = inv * inv * inv * dot / n;
        for (int i = 0; i < n; i++) dxr[i] += (float)(inv * g[i] * dyr[i] - xr[i] * c);
    }
    cpu_work_free(be, g, (size_t)n);
    return LMX_OK;
}

static lmx_status cpu_matmul_bwd(lmx_backend *be, lmx_tensor *dx, const lmx_tensor *dy, const lmx_tensor *w, int M,
                                 unsigned fresh) {
    const int64_t N = w->shape[0], K = w->shape[1];
    if (fresh & 1) memset(dx->data, 0, (size_t)M * K * sizeof(float));
    int64_t rows = BWD_TILE_BYTES / (K * 4);
    rows = rows < 16 ? 16 : rows > N ? N : rows;
    float *tile = cpu_work(be, (size_t)(rows * K), "matmul backward");
    if (!tile) return be->err.status;
    for (int64_t n0 = 0; n0 < N; n0 += rows) { /* dx += dy[:, n0:n1] W[n0:n1, :] */
        const int64_t nb = N - n0 < rows ? N - n0 : rows;
        cpu_widen_rows((cpu_backend *)be, w, n0, nb, tile);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, (int)K, (int)nb, 1.0f, (const float *)dy->data + n0,
                    (int)N, tile, (int)K, 1.0f, (float *)dx->data, (int)K);
    }
    cpu_work_free(be, tile, (size_t)(rows * K));
    return LMX_OK;
}

static lmx_status cpu_lora_bwd(lmx_backend *be, lmx_tensor *dx, lmx_tensor *const *da, lmx_tensor *const *db,
                               const lmx_tensor *dy, const lmx_tensor *x, int B, int T, const lmx_lora_pair *const *pairs,
                               unsigned fresh, const lmx_tensor *xa, lmx_tensor *uo) {
    const int64_t K = x->shape[x->ndim - 1], N = dy->shape[dy->ndim - 1];
    if (dx && (fresh & 1)) memset(dx->data, 0, (size_t)B * T * K * sizeof(float));
    for (int b = 0; uo && b < B; b++)
        if (pairs[b] != pairs[0] || !pairs[0] || uo->shape[uo->ndim - 1] != pairs[0]->a.shape[0] ||
            lmx_tensor_nelem(uo) != (int64_t)B * T * pairs[0]->a.shape[0])
            return lmx_err_set(&be->err, LMX_ERR_SHAPE, "lora backward: u for rows of more than one pair or rank");
    for (int b = 0; b < B; b++) {
        const lmx_lora_pair *p = pairs[b];
        if (!p) continue;
        if (!lmx_lora_pair_fits(p, K, N))
            return lmx_err_set(&be->err, LMX_ERR_SHAPE, "lora backward: pair of sequence %d does not fit [%lld -> %lld]", b,
                               (long long)K, (long long)N);
        if (xa && xa->shape[xa->ndim - 1] != p->a.shape[0])
            return lmx_err_set(&be->err, LMX_ERR_SHAPE, "lora backward: x A^T of rank %lld for a pair of rank %lld",
                               (long long)xa->shape[xa->ndim - 1], (long long)p->a.shape[0]);
    }
    for (int b0 = 0; b0 < B;) { /* segments: consecutive sequences with one pair and one gradient */
        int b1 = b0 + 1;
        while (b1 < B && pairs[b1] == pairs[b0] && da[b1] == da[b0] && db[b1] == db[b0]) b1++;
        const int b = b0; /* the segment: sequences [b, b1), their pair and gradients those of b */
        const lmx_lora_pair *p = pairs[b];
        const int64_t r0 = (int64_t)b * T;
        const int rows = (b1 - b) * T;
        b0 = b1;
        if (!p) continue;
        const int r = (int)p->a.shape[0];
        const float *A = p->a.data, *Bm = p->b.data, *xs = (const float *)x->data + r0 * K;
        const float *dys = (const float *)dy->data + r0 * N;
        float *t = cpu_work(be, (size_t)2 * rows * r, "lora backward");
        if (!t) return be->err.status;
        float *u = uo ? (float *)uo->data + r0 * r : t + (size_t)rows * r;
        /* t = x A^T [rows, r] (xa's rows, where given), u = s dy B [rows, r] */
        if (xa) memcpy(t, (const float *)xa->data + r0 * r, (size_t)rows * r * sizeof(float));
        else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, r, (int)K, 1.0f, xs, (int)K, A, (int)K, 0.0f, t, r);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, r, (int)N, p->scale, dys, (int)N, Bm, r, 0.0f, u, r);
        /* dB += s dy^T t [N, r]; dA += u^T x [r, K]; dx += u A [rows, K] */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)N, r, rows, p->scale, dys, (int)N, t, r, 1.0f,
                    (float *)db[b]->data, r);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, (int)K, rows, 1.0f, u, r, xs, (int)K, 1.0f,
                    (float *)da[b]->data, (int)K);
        if (dx)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, (int)K, r, 1.0f, u, r, A, (int)K, 1.0f,
                        (float *)dx->data + r0 * K, (int)K);
        cpu_work_free(be, t, (size_t)2 * rows * r);
    }
    return LMX_OK;
}

static lmx_status cpu_lora_dx(lmx_backend *be, lmx_tensor *dx, int count, const lmx_tensor *u,
                              const lmx_lora_pair *const *pairs, unsigned fresh) {
    const int64_t K = dx->shape[dx->ndim - 1], rows = lmx_tensor_nelem(dx) / K;
    if (count < 1) return lmx_err_set(&be->err, LMX_ERR_INVALID_ARG, "lora dx: no terms");
    for (int i = 0; i < count; i++) {
        const int r = (int)pairs[i]->a.shape[0];
        if (pairs[i]->a.shape[1] != K || lmx_tensor_nelem(&u[i]) != rows * r)
            return lmx_err_set(&be->err, LMX_ERR_SHAPE, "lora dx: term %d does not fit [%lld, %lld]", i, (long long)rows,
                               (long long)K);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)K, r, 1.0f, (const float *)u[i].data, r,
                    (const float *)pairs[i]->a.data, (int)K, i == 0 && (fresh & 1) ? 0.0f : 1.0f, (float *)dx->data, (int)K);
    }
    return LMX_OK;
}

typedef struct glu_bwd_job {
    const float *g, *u, *d;
    float *dg, *du;
    int64_t n, per_task;
    int silu;
    unsigned fresh;
} glu_bwd_job;

static void glu_bwd_task(void *arg, int task, int thread) {
    (void)thread;
    const glu_bwd_job *j = arg;
    const int64_t i0 = task * j->per_task, i1 = i0 + j->per_task < j->n ? i0 + j->per_task : j->n;
    for (int64_t i = i0; i < i1; i++) {
        float a, da; /* act(x) and its derivative */
        lmx_act_grad(j->g[i], j->silu, &a, &da);
        j->dg[i] = (j->fresh & 1 ? 0.0f : j->dg[i]) + j->d[i] * j->u[i] * da;
        j->du[i] = (j->fresh & 2 ? 0.0f : j->du[i]) + j->d[i] * a;
    }
}

/* split over the pool in contiguous ranges (its exps are most of a step's elementwise work) */
static lmx_status cpu_glu_bwd(lmx_backend *be, lmx_tensor *dgate, lmx_tensor *dup, const lmx_tensor *dy,
                              const lmx_tensor *gate, const lmx_tensor *up, int64_t n, lmx_act act, unsigned fresh) {
    if (dgate->dtype != LMX_DTYPE_F32 || dup->dtype != LMX_DTYPE_F32) /* keeps are f32 here: never bf16 gradients */
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "cpu glu backward: f32 gradients only");
    cpu_backend *cb = (cpu_backend *)be;
    const int tasks = n >= 65536 ? lmx_pool_size(cb->pool) : 1;
    glu_bwd_job j = {gate->data, up->data, dy->data, dgate->data, dup->data, n, (n + tasks - 1) / tasks,
                     act == LMX_ACT_SILU, fresh};
    lmx_pool_run(cb->pool, tasks, glu_bwd_task, &j);
    return LMX_OK;
}

static lmx_status cpu_softcap_bwd(lmx_backend *be, lmx_tensor *dx, const lmx_tensor *dy, const lmx_tensor *y, int64_t n,
                                  float cap) {
    const float *yy = y->data, *d = dy->data;
    float *o = dx->data;
    for (int64_t i = 0; i < n; i++) {
        const float t = yy[i] / cap;
        o[i] += d[i] * (1.0f - t * t);
    }
    return LMX_OK;
}

/* The forward rotation is y_a = x_a c - x_b s, y_b = x_b c + x_a s (c, s with attn_factor, as cpu_rope
 * computes them); its transpose takes dy back. */
static lmx_status cpu_rope_bwd(lmx_backend *be, lmx_tensor *dx, const lmx_tensor *dy, const lmx_batch *bt, int nh,
                               int hd, const lmx_rope *rope, unsigned fresh) {
    if (dx->dtype != LMX_DTYPE_F32) /* keeps are f32 here: never bf16 gradients */
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "cpu rope backward: an f32 gradient only");
    fresh_zero(dx, fresh, 1);
    const int half = rope->rot_dim / 2;
    for (int b = 0; b < bt->B; b++)
        for (int t = 0; t < bt->n_new[b]; t++) {
            const int64_t row = ((int64_t)b * bt->T + t) * nh * hd;
            const float *d = (const float *)dy->data + row;
            float *o = (float *)dx->data + row;
            const double pos = (double)(bt->n_past[b] + t);
            for (int i = 0; i < half; i++) {
                const double ang = pos * rope->inv_freq[i];
                const float c = (float)cos(ang) * rope->attn_factor, s = (float)sin(ang) * rope->attn_factor;
                const int ia = rope->interleaved ? 2 * i : i, ib = rope->interleaved ? 2 * i + 1 : i + half;
                for (int h = 0; h < nh; h++) {
                    const float ya = d[h * hd + ia], yb = d[h * hd + ib];
                    o[h * hd + ia] += ya * c + yb * s;
                    o[h * hd + ib] += yb * c - ya * s;
                }
            }
            for (int h = 0; h < nh; h++) /* dims past rot_dim pass through */
                for (int i = rope->rot_dim; i < hd; i++) o[h * hd + i] += d[h * hd + i];
        }
    return LMX_OK;
}

/* One attention backward task: sequence b, kv head kvh and the query heads of its group (or a part of
 * them, job.parts); it alone writes those heads' dq rows and the kv head's dk / dv rows of the sequence
 * (a part: its own sums of them, added after), so tasks run in parallel and each sums in a fixed order.
 * As the forward (cpu_attention.c), the task takes its query vectors a
 * tile at a time (up to CPU_ATTN_LANES: its heads at a few positions) and walks their keys in the same
 * L1-sized chunks (cpu_backend.h): first each vector's scores and dP = dO . v over the chunks, then its softmax
 * and dS, then over the chunks again dq += dS K, and each key's dk += sum_v dS_v q_v and dv += sum_v
 * p_v dO_v over the tile's vectors at once (packed side by side). */
typedef struct attn_bwd_job {
    const cpu_backend *cb;
    const lmx_attn_args *a;
    const int *windows;
    const float *dout;
    float *dq, *dk, *dv;
    float *scratch; /* [threads][bwd_floats]: a tile's scores, probabilities and dP, K / V chunks, packed q / dO */
    int chunk;      /* keys a chunk */
    int parts;      /* tasks a kv head: its query heads split in this many parts, which then sum their dk / dv in */
    float *part;    /* parts > 1: [B][Hk][parts][2][T][D], each part's dk and dv */
} attn_bwd_job;

/* the first key that row t sees under a window of W keys (0: none) */
static int win_first(int t, int W) { return W > 0 && t - W + 1 > 0 ? t - W + 1 : 0; }

static size_t bwd_floats(int T, int D, int chunk) {
    return (size_t)3 * CPU_ATTN_LANES * (size_t)T + (size_t)2 * chunk * D + (size_t)2 * CPU_ATTN_LANES * D;
}

static void attn_bwd_task(void *arg, int task, int thread) {
    const attn_bwd_job *j = arg;
    const lmx_attn_args *a = j->a;
    const lmx_cpu_kernels *kn = &j->cb->k;
    const int H = a->H, Hk = a->Hk, D = a->D, T = a->batch->T, G = H / Hk;
    const int part = task % j->parts, b = task / j->parts / Hk, kvh = task / j->parts % Hk;
    const int W = j->windows ? j->windows[b] : 0, n_new = a->batch->n_new[b];
    const int64_t qs = (int64_t)H * D, ks = (int64_t)Hk * D, base = (int64_t)b * T;
    const float cap = a->softcap;
    float *x = j->scratch + (size_t)thread * bwd_floats(T, D, j->chunk), *p = x + (size_t)CPU_ATTN_LANES * T;
    float *dp = p + (size_t)CPU_ATTN_LANES * T, *kb = dp + (size_t)CPU_ATTN_LANES * T, *vb = kb + (size_t)j->chunk * D;
    float *qp = vb + (size_t)j->chunk * D, *gp = qp + (size_t)CPU_ATTN_LANES * D;
    const float *K = (const float *)a->k->data + base * ks + (int64_t)kvh * D;
    const float *V = (const float *)a->v->data + base * ks + (int64_t)kvh * D;
    float *dK = j->dk + base * ks + (int64_t)kvh * D, *dV = j->dv + base * ks + (int64_t)kvh * D;
    int64_t kst = ks; /* dK / dV's row stride */
    if (j->parts > 1) {
        dK = j->part + (size_t)task * 2 * T * D, dV = dK + (size_t)T * D, kst = D;
        memset(dK, 0, (size_t)2 * T * D * sizeof(float));
    }
    const int Gp = G / j->parts, h_end = kvh * G + (part + 1) * Gp;
    const int hn = Gp < CPU_ATTN_LANES ? Gp : CPU_ATTN_LANES, rows = CPU_ATTN_LANES / hn;
    for (int hs = kvh * G + part * Gp; hs < h_end; hs += hn)
        for (int t0 = 0; t0 < n_new; t0 += rows) {
            /* the tile: positions t0 .. t1 - 1 x heads hs .. he - 1; vector v sees keys [first, last] */
            const int t1 = t0 + rows < n_new ? t0 + rows : n_new, he = hs + hn < h_end ? hs + hn : h_end;
            const int nh = he - hs, nv = (t1 - t0) * nh, p1 = t1 - 1;
            const int p0 = win_first(t0, W), span = p1 - p0 + 1;
            int first[CPU_ATTN_LANES];
            for (int v = 0; v < nv; v++) {
                const int t = t0 + v / nh, h = hs + v % nh;
                first[v] = win_first(t, W);
                memcpy(qp + (size_t)v * D, (const float *)a->q->data + (base + t) * qs + (int64_t)h * D, (size_t)D * sizeof(float));
                memcpy(gp + (size_t)v * D, j->dout + (base + t) * qs + (int64_t)h * D, (size_t)D * sizeof(float));
            }
            /* the forward's scores and dP = dO . v, each vector over its keys */
            for (int c0 = p0; c0 <= p1; c0 += j->chunk) {
                const int c1 = c0 + j->chunk - 1 < p1 ? c0 + j->chunk - 1 : p1, n = c1 - c0 + 1;
                cpu_attn_pack(kb, K + (int64_t)c0 * ks, ks, n, D);
                cpu_attn_pack(vb, V + (int64_t)c0 * ks, ks, n, D);
                for (int v = 0; v < nv; v++) {
                    const int t = t0 + v / nh, lo = c0 > first[v] ? c0 : first[v], hi = c1 < t ? c1 : t;
                    if (lo > hi) continue;
                    kn->dot_rows_f32(qp + (size_t)v * D, kb + (size_t)(lo - c0) * D, D, hi - lo + 1, D, x + (size_t)v * span + lo - p0);
                    kn->dot_rows_f32(gp + (size_t)v * D, vb + (size_t)(lo - c0) * D, D, hi - lo + 1, D, dp + (size_t)v * span + lo - p0);
                }
            }
            for (int v = 0; v < nv; v++) { /* softmax, then dS = p (dP - sum p dP) (times the soft cap's slope), scaled */
                const int t = t0 + v / nh, n = t - first[v] + 1;
                float *xv = x + (size_t)v * span, *pv = p + (size_t)v * span, *dpv = dp + (size_t)v * span;
                const int o = first[v] - p0;
                const double sum = kn->attn_exp(xv + o, pv + o, n, a->scale, cap);
                double dsum = 0;
                for (int i = o; i < o + n; i++) {
                    pv[i] = (float)(pv[i] / sum);
                    dsum += (double)pv[i] * dpv[i];
                }
                for (int i = 0; i < span; i++) {
                    if (i < o || i >= o + n) { /* keys the vector does not see */
                        xv[i] = pv[i] = 0.0f;
                        continue;
                    }
                    float ds = pv[i] * (float)(dpv[i] - dsum);
                    if (cap > 0) ds *= 1.0f - (xv[i] / cap) * (xv[i] / cap);
                    xv[i] = ds * a->scale;
                }
            }
            /* dq += dS K; each key's dk += sum_v dS_v q_v, dv += sum_v p_v dO_v (zero past a vector's keys) */
            for (int c0 = p0; c0 <= p1; c0 += j->chunk) {
                const int c1 = c0 + j->chunk - 1 < p1 ? c0 + j->chunk - 1 : p1, n = c1 - c0 + 1;
                cpu_attn_pack(kb, K + (int64_t)c0 * ks, ks, n, D);
                float wd[CPU_ATTN_LANES], wp[CPU_ATTN_LANES];
                for (int v = 0; v < nv; v++)
                    kn->axpy_rows_f32(j->dq + (base + t0 + v / nh) * qs + (int64_t)(hs + v % nh) * D, x + (size_t)v * span + c0 - p0, kb,
                                      D, n, D);
                for (int k = 0; k < n; k++) {
                    for (int v = 0; v < nv; v++) wd[v] = x[(size_t)v * span + c0 - p0 + k], wp[v] = p[(size_t)v * span + c0 - p0 + k];
                    kn->axpy_rows_f32(dK + (int64_t)(c0 + k) * kst, wd, qp, D, nv, D);
                    kn->axpy_rows_f32(dV + (int64_t)(c0 + k) * kst, wp, gp, D, nv, D);
                }
            }
        }
}

/* Sequence b's kv head kvh (task b Hk + kvh): dk and dv += its parts' sums, in part order */
static void attn_bwd_sum_task(void *arg, int task, int thread) {
    (void)thread;
    const attn_bwd_job *j = arg;
    const lmx_attn_args *a = j->a;
    const int D = a->D, T = a->batch->T, b = task / a->Hk, kvh = task % a->Hk;
    const int64_t ks = (int64_t)a->Hk * D, at = (int64_t)b * T * ks + (int64_t)kvh * D;
    for (int p = 0; p < j->parts; p++) {
        const float *src = j->part + ((size_t)task * j->parts + p) * 2 * T * D;
        for (int t = 0; t < a->batch->n_new[b]; t++) { /* y += 1 x: the sum itself */
            j->cb->k.axpy_f32(j->dk + at + t * ks, 1.0f, src + (size_t)t * D, D);
            j->cb->k.axpy_f32(j->dv + at + t * ks, 1.0f, src + ((size_t)T + t) * D, D);
        }
    }
}

static lmx_status cpu_attention_bwd(lmx_backend *be, lmx_tensor *dq, lmx_tensor *dk, lmx_tensor *dv,
                                    const lmx_tensor *dout, const lmx_attn_args *a, const int *windows, unsigned fresh) {
    const cpu_backend *cb = (const cpu_backend *)be;
    lmx_status st = lmx_attention_bwd_check(be, a);
    if (st) return st;
    fresh_zero(dq, fresh, 1), fresh_zero(dk, fresh, 2), fresh_zero(dv, fresh, 4);
    const int threads = lmx_pool_size(cb->pool), T = a->batch->T > 0 ? a->batch->T : 1;
    const int chunk = cpu_attn_chunk(a->D);
    const size_t n = (size_t)threads * bwd_floats(T, a->D, chunk);
    attn_bwd_job j = {cb, a, windows, (const float *)dout->data, (float *)dq->data, (float *)dk->data,
                      (float *)dv->data, cpu_work(be, n, "attention backward"), chunk, 1, NULL};
    if (!j.scratch) return be->err.status;
    /* a kv head's query heads in parts where B Hk tasks would leave a thread idle (one sequence of a model with
     * one to three kv heads): each part sums its own dk / dv, added in part order after */
    const int B = a->batch->B, Hk = a->Hk, G = a->H / Hk;
    while (j.parts < G && (int64_t)B * Hk * j.parts < 2 * threads) {
        int p = j.parts + 1;
        while (G % p) p++;
        j.parts = p;
    }
    const size_t np = j.parts > 1 ? (size_t)B * Hk * j.parts * 2 * T * a->D : 0;
    if (np && !(j.part = cpu_work(be, np, "attention backward"))) {
        cpu_work_free(be, j.scratch, n);
        return be->err.status;
    }
    lmx_pool_run(cb->pool, B * Hk * j.parts, attn_bwd_task, &j);
    if (np) lmx_pool_run(cb->pool, B * Hk, attn_bwd_sum_task, &j);
    cpu_work_free(be, j.part, np);
    cpu_work_free(be, j.scratch, n);
    return LMX_OK;
}

/* dx[rows[r]] += dout[r]: the forward's scatter-add with weight 1 */
static lmx_status cpu_gather_rows_bwd(lmx_backend *be, lmx_tensor *dx, const lmx_tensor *dout, const int *rows, int R,
                                      int64_t n) {
    const cpu_backend *cb = (const cpu_backend *)be;
    for (int r = 0; r < R; r++)
        cb->k.axpy_f32((float *)dx->data + (int64_t)rows[r] * n, 1.0f, (const float *)dout->data + (int64_t)r * n, n);
    return LMX_OK;
}

typedef struct xent_job {
    float *z;
    const int32_t *targets;
    const float *wt;
    double *row_loss;
    double c;
    int R, V, per_task;
} xent_job;

static void xent_task(void *arg, int task, int thread) {
    (void)thread;
    const xent_job *j = arg;
    const int V = j->V, r1 = (task + 1) * j->per_task < j->R ? (task + 1) * j->per_task : j->R;
    for (int r = task * j->per_task; r < r1; r++) {
        float *z = j->z + (int64_t)r * V;
        const float w = j->wt ? j->wt[r] : 1.0f;
        j->row_loss[r] = 0;
        if (w == 0.0f) {
            if (j->c != 0) memset(z, 0, (size_t)V * sizeof *z);
            continue;
        }
        float mx = z[0];
        for (int v = 1; v < V; v++) mx = z[v] > mx ? z[v] : mx;
        double se = 0;
        for (int v = 0; v < V; v++) se += exp((double)z[v] - mx);
        j->row_loss[r] = w * (log(se) + mx - z[j->targets[r]]);
        for (int v = 0; j->c != 0 && v < V; v++)
            z[v] = (float)(j->c * w * (exp((double)z[v] - mx) / se - (v == j->targets[r])));
    }
}

/* rows split over the pool; the loss summed in row order afterwards (the same sum on any pool) */
static lmx_status cpu_xent(lmx_backend *be, lmx_tensor *zt, const int32_t *targets, const float *wt, int R, int V,
                           double c, double *loss, lmx_tensor *g16) {
    cpu_backend *cb = (cpu_backend *)be;
    *loss = 0;
    if (g16) return LMX_ERR_UNSUPPORTED; /* its keeps are f32 */
    if (R <= 0) return LMX_OK;
    double *row_loss = malloc((size_t)R * sizeof *row_loss);
    if (!row_loss) return lmx_err_set(&be->err, LMX_ERR_NOMEM, "loss: out of memory");
    const int threads = lmx_pool_size(cb->pool), tasks = R < threads ? R : threads;
    xent_job j = {zt->data, targets, wt, row_loss, c, R, V, (R + tasks - 1) / tasks};
    lmx_pool_run(cb->pool, tasks, xent_task, &j);
    double sum = 0;
    for (int r = 0; r < R; r++) sum += row_loss[r];
    free(row_loss);
    *loss = sum;
    return LMX_OK;
}

static lmx_status cpu_sumsq(lmx_backend *be, const lmx_tensor *g, int count, double *out) {
    (void)be;
    double ss = 0;
    for (int t = 0; t < count; t++) {
        const float *x = g[t].data;
        const int64_t n = lmx_tensor_nelem(&g[t]);
        for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    }
    *out = ss;
    return LMX_OK;
}

static lmx_status cpu_adamw(lmx_backend *be, lmx_tensor *pt, const lmx_tensor *gt, lmx_tensor *m1t, lmx_tensor *m2t,
                            int64_t n, const lmx_adamw_step *s) {
    (void)be;
    float *p = pt->data, *m1 = m1t->data, *m2 = m2t->data;
    const float *g = gt->data;
    for (int64_t k = 0; k < n; k++) {
        const double gk = g[k] * s->clip;
        double pk = p[k] * (1.0 - s->lr * s->weight_decay);
        m1[k] = (float)(s->beta1 * m1[k] + (1.0 - s->beta1) * gk);
        m2[k] = (float)(s->beta2 * m2[k] + (1.0 - s->beta2) * gk * gk);
        pk -= s->lr / s->bc1 * m1[k] / (sqrt(m2[k]) / sqrt(s->bc2) + s->eps);
        p[k] = (float)pk;
    }
    return LMX_OK;
}

static lmx_status cpu_dropout(lmx_backend *be, lmx_tensor *yt, const lmx_tensor *xt, int64_t n, float p, uint64_t seed) {
    (void)be;
    const float *x = xt->data, s = 1.0f / (1.0f - p);
    float *y = yt->data;
    for (int64_t i = 0; i < n; i++) y[i] = lmx_dropout_keep(seed, i, p) ? x[i] * s : 0.0f;
    return LMX_OK;
}

static lmx_status cpu_keep(lmx_backend *be, lmx_tensor *dst, const lmx_tensor *x) {
    *dst = (lmx_tensor){.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {x->shape[0], x->shape[1]}};
    lmx_status st = be->ops->alloc(be, dst);
    if (!st) memcpy(dst->data, x->data, (size_t)lmx_tensor_nelem(dst) * sizeof(float));
    return st;
}

static lmx_dtype cpu_keep_dtype(const lmx_backend *be) {
    (void)be;
    return LMX_DTYPE_F32;
}

/* the values the tape computes again (keeps are f32 here): the forward ops themselves */
static lmx_status cpu_glu_redo(lmx_backend *be, lmx_tensor *out, const lmx_tensor *gate, const lmx_tensor *up, int64_t n,
                               lmx_act act) {
    return be->ops->glu(be, out, gate, up, n, act);
}
static lmx_status cpu_rmsnorm_redo(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int rows,
                                   int n, float eps, float add_one) {
    return be->ops->rmsnorm(be, out, x, w, rows, n, eps, add_one);
}

static lmx_status cpu_restore(lmx_backend *be, lmx_tensor *dst, const lmx_tensor *x) {
    (void)be;
    memcpy(dst->data, x->data, (size_t)lmx_tensor_nelem(x) * sizeof(float));
    return LMX_OK;
}

static lmx_status cpu_zero_many(lmx_backend *be, int count, lmx_tensor *g) {
    (void)be;
    for (int i = 0; i < count; i++) zero_tensor(&g[i]);
    return LMX_OK;
}

const lmx_backward_ops lmx_cpu_backward = {
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .matmul_bwd = cpu_matmul_bwd,
    .lora_bwd = cpu_lora_bwd,
    .lora_dx = cpu_lora_dx,
    .glu_bwd = cpu_glu_bwd,
    .softcap_bwd = cpu_softcap_bwd,
    .rope_bwd = cpu_rope_bwd,
    .attention_bwd = cpu_attention_bwd,
    .gather_rows_bwd = cpu_gather_rows_bwd,
    .xent = cpu_xent,
    .sumsq = cpu_sumsq,
    .adamw = cpu_adamw,
    .dropout = cpu_dropout,
    .keep = cpu_keep,
    .keep_dtype = cpu_keep_dtype,
    .glu_redo = cpu_glu_redo,
    .rmsnorm_redo = cpu_rmsnorm_redo,
    .restore = cpu_restore,
    .zero_many = cpu_zero_many,
};
