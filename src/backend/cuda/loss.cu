/* Device-side losses of a training step, twins of train/loss.c (see
 * cuda/train_kernels.h for the contracts).
 *
 * Each launch computes the loss terms and writes the gradient in one
 * kernel; every block leaves one double partial sum in `scratch` (at most
 * LOSS_PARTIALS of them, the grid depending on the shape alone), then one
 * block adds the partials in a fixed tree into *loss_sum: the same bits run
 * to run. The per-element arithmetic is the CPU's: log-sum-exp in double
 * with the maximum subtracted, the gradient (exp(x - lse) - onehot) * inv in
 * double rounded once to float; mse's gradient is the CPU's float32
 * scale * (pred - target). Only the order of the double sums differs from
 * the CPU's (so losses agree to ~1e-15 relative, gradients to an ulp).
 *   Cross-entropy along a contiguous class axis ([N, C] or [N, T, C]; rows
 *   of up to GPT-2's 50304 classes) runs one block of up to 256 threads per
 *   row, float4 loads when the row allows, the next group of loads in
 *   flight while a group's exponentials are computed: pass 1 folds max and
 *   sum of exponentials online (each thread a running (max, sum), rescaled
 *   at most once per group of 8 elements, merged in a fixed tree), pass 2
 *   writes the gradient, so logits are read twice (the second time mostly
 *   from L2) and the gradient written once. Along a strided class axis ([N, C, H, W]) one
 *   thread takes a row (neighbouring threads read neighbouring pixels, so
 *   loads coalesce) and follows the CPU's three loops exactly; few rows with
 *   many classes go to the block-per-row kernel with a stride instead.
 *   Labels must be valid (the trainer checks them on the host); a label that
 *   is neither ignore_index nor in [0, C) is never used as an index: its row
 *   adds a NaN to the loss, so the mistake shows.
 *
 * No function synchronizes or allocates; every launch is checked and a
 * failure names the function and the kernel. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cuda_runtime.h>

#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/train_kernels.h"

/* ---- shared helpers ---- */

#define LOSS_THREADS 256
#define LOSS_PARTIALS 4096 /* per-block partial sums at most (scratch doubles) */
#define REDUCE_THREADS 1024

static unsigned loss_blocks(int64_t n)
{
    int64_t b = (n + LOSS_THREADS - 1) / LOSS_THREADS;
    return (unsigned)(b < 1 ? 1 : b > LOSS_PARTIALS ? LOSS_PARTIALS : b);
}

/* *out = the sum of part[0, n), in a fixed order. One block. */
__global__ void __launch_bounds__(REDUCE_THREADS) sum_partials_kernel(const double *part, int n, double *out)
{
    __shared__ double sh[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += part[i];
    s = gp_dev_block_sum0(s, sh);
    if (threadIdx.x == 0) *out = s;
}

static gp_status finish_loss(cudaStream_t stream, const char *fn, const double *part, unsigned n,
                             double *loss_sum, struct gp_error *err)
{
    sum_partials_kernel<<<1, REDUCE_THREADS, 0, stream>>>(part, (int)n, loss_sum);
    return gp_cuda_launched(fn, "sum_partials_kernel", err);
}

static gp_status check_loss_args(const char *fn, double denominator, const double *loss_sum,
                                 const void *scratch, struct gp_error *err)
{
    if (!(denominator > 0) || !isfinite(denominator))
        return gp_error_set(err, GP_ERR_INVALID,
                            "%s: the denominator (loss terms in the mini-batch) must be positive, "
                            "not %g",
                            fn, denominator);
    if (!loss_sum || !scratch)
        return gp_error_set(err, GP_ERR_INVALID, "%s: no %s", fn, loss_sum ? "scratch" : "loss_sum");
    return GP_OK;
}

extern "C" size_t gp_cuda_loss_scratch_bytes(const struct gp_shape *output_shape)
{
    (void)output_shape; /* the grids are capped at LOSS_PARTIALS blocks whatever the shape */
    return LOSS_PARTIALS * sizeof(double);
}

/* ---- cross-entropy ---- */

struct ce_args {
    const float *x;
    const int64_t *labels;
    float *dx; /* or NULL */
    double *part;
    int64_t rows, C, S, ignore;
    double inv;
};

/* A group of K elements into a running (max m, sum s of exp(x - m)): one
 * rescale per group at most (when the group holds a new maximum), so the
 * warps do not diverge element by element. m never becomes NaN (fmaxf and >
 * skip NaN); a NaN element makes s NaN, as it makes the CPU's sum. A -inf
 * adds exp(-inf - m) = 0 on the CPU when m is finite; it adds nothing here,
 * so that a thread that has seen only -inf keeps s = 0 (a row of only -inf,
 * or one holding +inf, is made NaN at the end, as on the CPU). Padding
 * elements are -inf. */
template <int K>
__device__ static inline void ms_group(const float (&v)[K], float &m, double &s)
{
    float mx = v[0];
#pragma unroll
    for (int u = 1; u < K; u++) mx = fmaxf(mx, v[u]);
    if (mx > m) {
        s *= exp((double)m - (double)mx);
        m = mx;
    }
#pragma unroll
    for (int u = 0; u < K; u++) {
        const double e = exp((double)v[u] - (double)m);
        s += v[u] == -INFINITY ? 0.0 : e;
    }
}

__device__ static inline void ms_merge(float &m, double &s, float m2, double s2)
{
    const float M = m > m2 ? m : m2;
    const double a = (m == M || m == -INFINITY) ? s : s * exp((double)m - (double)M);
    const double b = (m2 == M || m2 == -INFINITY) ? s2 : s2 * exp((double)m2 - (double)M);
    m = M;
    s = a + b;
}

/* The block's (max, sum) in a fixed tree, valid in thread 0. */
__device__ static void block_ms(float &m, double &s, float *shm, double *shs)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_down_sync(0xffffffffu, m, o);
        double s2 = __shfl_down_sync(0xffffffffu, s, o);
        ms_merge(m, s, m2, s2);
    }
    __syncthreads();
    if (lane == 0) {
        shm[w] = m;
        shs[w] = s;
    }
    __syncthreads();
    if (w == 0) {
        m = lane < nw ? shm[lane] : -INFINITY;
        s = lane < nw ? shs[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) {
            float m2 = __shfl_down_sync(0xffffffffu, m, o);
            double s2 = __shfl_down_sync(0xffffffffu, s, o);
            ms_merge(m, s, m2, s2);
        }
    }
}

__device__ static inline float ce_grad(float v, double lse, bool hot, double inv)
{
    return (float)((exp((double)v - lse) - (hot ? 1.0 : 0.0)) * inv);
}

#define CE_ROW_THREADS 256 /* at most; fewer for short rows */
#ifndef CE_U
#define CE_U 2 /* float4 (or 2 * CE_U scalars) per thread and group; on an H200,
                  [8, 1024, 50304]: 2 (78 registers) 1.78 ms, 4 (128) 1.94 ms */
#endif

/* x4[j0 + u * bd] for u < CE_U, -inf past n4. */
__device__ static inline void load_group(float4 (&q)[CE_U], const float4 *x4, int64_t j0, int64_t bd, int64_t n4)
{
#pragma unroll
    for (int u = 0; u < CE_U; u++) {
        const int64_t j = j0 + u * bd;
        q[u] = j < n4 ? x4[j] : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
    }
}

/* One block per row (blocks loop over rows), classes `S` apart. VEC: S == 1,
 * C % 4 == 0 and x, dx 16-byte aligned: float4 loads and stores. Pass 1
 * takes the row's max and sum of exponentials in one read, pass 2 writes
 * the gradient (a second read, mostly from L2). */
template <bool VEC>
__global__ void __launch_bounds__(CE_ROW_THREADS) ce_rows_kernel(const ce_args a)
{
    __shared__ float shm[32];
    __shared__ double shs[32];
    __shared__ double sh_lse;
    const int64_t C = a.C, S = a.S, C4 = C >> 2, bd = blockDim.x;
    double acc = 0.0; /* thread 0's: the block's rows in order */
    for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
        const int64_t o = r / S, i = r - o * S;
        const float *x = a.x + o * C * S + i;
        float *g = a.dx ? a.dx + o * C * S + i : NULL;
        const float4 *x4 = reinterpret_cast<const float4 *>(x);
        float4 *g4 = reinterpret_cast<float4 *>(g);
        const int64_t y = a.labels[r]; /* the same in every thread: the branches are uniform */
        if (y == a.ignore) {
            if (g) {
                if (VEC) {
                    for (int64_t j = threadIdx.x; j < C4; j += bd) g4[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                } else {
                    for (int64_t c = threadIdx.x; c < C; c += bd) g[c * S] = 0.0f;
                }
            }
            continue;
        }
        float m = -INFINITY;
        double s = 0.0;
        if (VEC) {
            /* the next group's loads are in flight while this one's
             * exponentials are computed */
            float4 q[CE_U];
            load_group(q, x4, threadIdx.x, bd, C4);
            for (int64_t j0 = threadIdx.x; j0 < C4; j0 += CE_U * bd) {
                float v[4 * CE_U];
#pragma unroll
                for (int u = 0; u < CE_U; u++) {
                    v[4 * u] = q[u].x;
                    v[4 * u + 1] = q[u].y;
                    v[4 * u + 2] = q[u].z;
                    v[4 * u + 3] = q[u].w;
                }
                load_group(q, x4, j0 + CE_U * bd, bd, C4);
                ms_group(v, m, s);
            }
        } else {
            for (int64_t c0 = threadIdx.x; c0 < C; c0 += 2 * CE_U * bd) {
                float v[2 * CE_U];
#pragma unroll
                for (int u = 0; u < 2 * CE_U; u++) {
                    const int64_t c = c0 + u * bd;
                    v[u] = c < C ? x[c * S] : -INFINITY;
                }
                ms_group(v, m, s);
            }
        }
        block_ms(m, s, shm, shs);
        if (threadIdx.x == 0) {
            /* the CPU's exp(x - m) is exp(inf - inf) = NaN at the maximum
             * when that is infinite (or all logits are -inf) */
            if (isinf(m)) s = NAN;
            const double lse = (double)m + log(s);
            sh_lse = lse;
            acc += (y >= 0 && y < C) ? lse - (double)x[y * S] : (double)NAN;
        }
        __syncthreads();
        const double lse = sh_lse;
        if (g) {
            if (VEC) {
                float4 q[CE_U];
                load_group(q, x4, threadIdx.x, bd, C4);
                for (int64_t j0 = threadIdx.x; j0 < C4; j0 += CE_U * bd) {
                    float4 cur[CE_U];
#pragma unroll
                    for (int u = 0; u < CE_U; u++) cur[u] = q[u];
                    load_group(q, x4, j0 + CE_U * bd, bd, C4);
#pragma unroll
                    for (int u = 0; u < CE_U; u++) {
                        const int64_t j = j0 + u * bd, c = j << 2;
                        if (j < C4)
                            g4[j] = make_float4(ce_grad(cur[u].x, lse, c == y, a.inv),
                                                ce_grad(cur[u].y, lse, c + 1 == y, a.inv),
                                                ce_grad(cur[u].z, lse, c + 2 == y, a.inv),
                                                ce_grad(cur[u].w, lse, c + 3 == y, a.inv));
                    }
                }
            } else {
                for (int64_t c = threadIdx.x; c < C; c += bd) g[c * S] = ce_grad(x[c * S], lse, c == y, a.inv);
            }
        }
        /* block_ms's first barrier keeps sh_lse until every thread has read it */
    }
    if (threadIdx.x == 0) a.part[blockIdx.x] = acc;
}

/* One thread per row, classes S apart (S > 1: neighbouring threads read
 * neighbouring addresses). The CPU's loops, term for term. */
__global__ void __launch_bounds__(LOSS_THREADS) ce_cols_kernel(const ce_args a)
{
    __shared__ double sh[32];
    const int64_t C = a.C, S = a.S;
    double acc = 0.0;
    GP_GRID_STRIDE(r, a.rows) {
        const int64_t o = r / S, i = r - o * S;
        const float *x = a.x + o * C * S + i;
        float *g = a.dx ? a.dx + o * C * S + i : NULL;
        const int64_t y = a.labels[r];
        if (y == a.ignore) {
            if (g)
                for (int64_t c = 0; c < C; c++) g[c * S] = 0.0f;
            continue;
        }
        double m = x[0];
        for (int64_t c = 1; c < C; c++)
            if (x[c * S] > m) m = x[c * S];
        double se = 0.0;
        for (int64_t c = 0; c < C; c++) se += exp((double)x[c * S] - m);
        const double lse = m + log(se);
        acc += (y >= 0 && y < C) ? lse - (double)x[y * S] : (double)NAN;
        if (g)
            for (int64_t c = 0; c < C; c++) g[c * S] = ce_grad(x[c * S], lse, c == y, a.inv);
    }
    acc = gp_dev_block_sum0(acc, sh);
    if (threadIdx.x == 0) a.part[blockIdx.x] = acc;
}

extern "C" gp_status gp_cuda_cross_entropy(cudaStream_t stream, const float *logits,
                                           const struct gp_shape *shape, int class_axis,
                                           const int64_t *labels, int64_t ignore_index,
                                           double denominator, float *dlogits, double *loss_sum,
                                           void *scratch, struct gp_error *err)
{
    static const char fn[] = "gp_cuda_cross_entropy";
    GP_TRY(check_loss_args(fn, denominator, loss_sum, scratch, err));
    char buf[256];
    int axis = class_axis < 0 ? class_axis + shape->rank : class_axis;
    if (shape->rank < 1 || axis < 0 || axis >= shape->rank)
        return gp_error_set(err, GP_ERR_INVALID, "%s: class axis %d does not fit logits %s", fn,
                            class_axis, gp_shape_format(shape, buf, sizeof buf));
    ce_args a;
    a.x = logits;
    a.labels = labels;
    a.dx = dlogits;
    a.part = (double *)scratch;
    a.C = shape->dims[axis];
    a.S = 1;
    int64_t outer = 1;
    for (int d = 0; d < axis; d++) outer *= shape->dims[d];
    for (int d = axis + 1; d < shape->rank; d++) a.S *= shape->dims[d];
    a.rows = outer * a.S;
    a.ignore = ignore_index;
    a.inv = 1.0 / denominator;
    if (a.rows > 0 && a.C < 1)
        return gp_error_set(err, GP_ERR_SHAPE, "%s: the class axis of logits %s has no classes", fn,
                            gp_shape_format(shape, buf, sizeof buf));
    if (a.rows > 0 && (!logits || !labels))
        return gp_error_set(err, GP_ERR_INVALID, "%s: no %s", fn, logits ? "labels" : "logits");

    unsigned blocks;
    if (a.S > 1 && (a.rows >= 16384 || a.C <= 256)) {
        blocks = loss_blocks(a.rows);
        ce_cols_kernel<<<blocks, LOSS_THREADS, 0, stream>>>(a);
        GP_TRY(gp_cuda_launched(fn, "ce_cols_kernel", err));
    } else {
        const bool vec = a.S == 1 && a.C % 4 == 0 && gp_cuda_aligned16(logits) &&
                         (!dlogits || gp_cuda_aligned16(dlogits));
        const int64_t items = vec ? a.C / 4 : a.C;
        int threads = 32; /* about 16 items a thread or more */
        while (threads < CE_ROW_THREADS && (int64_t)threads * 16 < items) threads *= 2;
        blocks = (unsigned)(a.rows < 1 ? 1 : a.rows > LOSS_PARTIALS ? LOSS_PARTIALS : a.rows);
        if (vec) {
            ce_rows_kernel<true><<<blocks, threads, 0, stream>>>(a);
            GP_TRY(gp_cuda_launched(fn, "ce_rows_kernel<vec>", err));
        } else {
            ce_rows_kernel<false><<<blocks, threads, 0, stream>>>(a);
            GP_TRY(gp_cuda_launched(fn, "ce_rows_kernel", err));
        }
    }
    return finish_loss(stream, fn, a.part, blocks, loss_sum, err);
}

/* ---- mse, output loss ---- */

__device__ static inline double sq_term(double s, float p, float t)
{
    const double d = (double)p - (double)t;
    return s + d * d;
}

__device__ static inline float mse_grad(float scale, float p, float t)
{
    return __fmul_rn(scale, __fsub_rn(p, t));
}

/* VEC: pred, target, dpred 16-byte aligned; the n % 4 tail goes to the
 * grid's first threads. */
template <bool VEC>
__global__ void __launch_bounds__(LOSS_THREADS) mse_kernel(const float *pred, const float *target, int64_t n,
                                                           float scale, float *dpred, double *part)
{
    __shared__ double sh[32];
    double s = 0.0;
    int64_t done = 0;
    if (VEC) {
        const float4 *p4 = reinterpret_cast<const float4 *>(pred);
        const float4 *t4 = reinterpret_cast<const float4 *>(target);
        const int64_t n4 = n >> 2;
        GP_GRID_STRIDE(j, n4) {
            const float4 p = p4[j], t = t4[j];
            s = sq_term(s, p.x, t.x);
            s = sq_term(s, p.y, t.y);
            s = sq_term(s, p.z, t.z);
            s = sq_term(s, p.w, t.w);
            if (dpred)
                reinterpret_cast<float4 *>(dpred)[j] =
                    make_float4(mse_grad(scale, p.x, t.x), mse_grad(scale, p.y, t.y),
                                mse_grad(scale, p.z, t.z), mse_grad(scale, p.w, t.w));
        }
        done = n4 << 2;
    }
    GP_GRID_STRIDE(k, n - done) {
        const int64_t i = done + k;
        s = sq_term(s, pred[i], target[i]);
        if (dpred) dpred[i] = mse_grad(scale, pred[i], target[i]);
    }
    s = gp_dev_block_sum0(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

extern "C" gp_status gp_cuda_mse_loss(cudaStream_t stream, const float *pred, const float *target, int64_t n,
                                      double denominator, float *dpred, double *loss_sum, void *scratch,
                                      struct gp_error *err)
{
    static const char fn[] = "gp_cuda_mse_loss";
    GP_TRY(check_loss_args(fn, denominator, loss_sum, scratch, err));
    if (n < 0) return gp_error_set(err, GP_ERR_INVALID, "%s: negative element count %lld", fn, (long long)n);
    /* the CPU's (float)(2.0 / denominator) */
    const float scale = (float)(2.0 / denominator);
    const bool vec = gp_cuda_aligned16(pred) && gp_cuda_aligned16(target) && (!dpred || gp_cuda_aligned16(dpred));
    const unsigned blocks = loss_blocks(vec ? n / 4 : n);
    if (vec) {
        mse_kernel<true><<<blocks, LOSS_THREADS, 0, stream>>>(pred, target, n, scale, dpred, (double *)scratch);
        GP_TRY(gp_cuda_launched(fn, "mse_kernel<vec>", err));
    } else {
        mse_kernel<false><<<blocks, LOSS_THREADS, 0, stream>>>(pred, target, n, scale, dpred, (double *)scratch);
        GP_TRY(gp_cuda_launched(fn, "mse_kernel", err));
    }
    return finish_loss(stream, fn, (const double *)scratch, blocks, loss_sum, err);
}

template <bool VEC>
__global__ void __launch_bounds__(LOSS_THREADS) output_loss_kernel(const float *out, int64_t n, float gv,
                                                                   float *dout, double *part)
{
    __shared__ double sh[32];
    double s = 0.0;
    int64_t done = 0;
    if (VEC) {
        const float4 *o4 = reinterpret_cast<const float4 *>(out);
        const int64_t n4 = n >> 2;
        GP_GRID_STRIDE(j, n4) {
            const float4 v = o4[j];
            s += (double)v.x;
            s += (double)v.y;
            s += (double)v.z;
            s += (double)v.w;
            if (dout) reinterpret_cast<float4 *>(dout)[j] = make_float4(gv, gv, gv, gv);
        }
        done = n4 << 2;
    }
    GP_GRID_STRIDE(k, n - done) {
        const int64_t i = done + k;
        s += (double)out[i];
        if (dout) dout[i] = gv;
    }
    s = gp_dev_block_sum0(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

extern "C" gp_status gp_cuda_output_loss(cudaStream_t stream, const float *out, int64_t n, double denominator,
                                         float *dout, double *loss_sum, void *scratch, struct gp_error *err)
{
    static const char fn[] = "gp_cuda_output_loss";
    GP_TRY(check_loss_args(fn, denominator, loss_sum, scratch, err));
    if (n < 0) return gp_error_set(err, GP_ERR_INVALID, "%s: negative element count %lld", fn, (long long)n);
    const float gv = (float)(1.0 / denominator);
    const bool vec = gp_cuda_aligned16(out) && (!dout || gp_cuda_aligned16(dout));
    const unsigned blocks = loss_blocks(vec ? n / 4 : n);
    if (vec) {
        output_loss_kernel<true><<<blocks, LOSS_THREADS, 0, stream>>>(out, n, gv, dout, (double *)scratch);
        GP_TRY(gp_cuda_launched(fn, "output_loss_kernel<vec>", err));
    } else {
        output_loss_kernel<false><<<blocks, LOSS_THREADS, 0, stream>>>(out, n, gv, dout, (double *)scratch);
        GP_TRY(gp_cuda_launched(fn, "output_loss_kernel", err));
    }
    return finish_loss(stream, fn, (const double *)scratch, blocks, loss_sum, err);
}
