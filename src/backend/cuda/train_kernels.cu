/* Device-side pieces of a training step that are not layers: the losses
 * (twins of train/loss.c), the optimizer updates (twins of train/optim.c)
 * and buffer operations (accumulate, per-tensor norms). See
 * cuda/train_kernels.h for the contracts.
 *
 * Losses. Each launch computes the loss terms and writes the gradient in
 * one kernel; every block leaves one double partial sum in `scratch` (at most
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
 * Optimizer. One fused kernel per optimizer kind over all parameter tensors
 * (multi-tensor: a list of up to MT_TENSORS tensors goes by value as the
 * kernel's argument, one block per chunk of MT_CHUNK elements, a block
 * finding its tensor by binary search; more tensors take more launches:
 * ResNet-50's 161 take three). Per element it does exactly the float32 operations of
 * gp_sgd_update / gp_adamw_update: the CPU's fmaf are __fmaf_rn here, every
 * other product, sum, quotient and square root is spelled __fmul_rn,
 * __fadd_rn, __fsub_rn, __fdiv_rn, __fsqrt_rn, which nvcc never contracts or
 * approximates, so parameters and state are bit-identical to the CPU build's
 * (gcc -std=c11 does not contract either; its fmaf is exact). The scalars
 * (bias corrections, decay factors) are computed on the host in double
 * exactly as optim.c computes them. With clip_coef below 1 (or NaN, which
 * gp_clip_coef can return) the gradient is first multiplied by it in float32,
 * gp_scale_grads' operation, and the clipped gradient is stored back, as
 * clip_grad_norm_ leaves it; clip_coef >= 1 leaves gradients untouched.
 *
 * Norms: `tensors` and `numels` are host arrays (of device pointers), `out`
 * device memory. One thread block cluster (Hopper) of NORM_CLUSTER blocks
 * per tensor, double sums in a fixed order, so large tensors are read by
 * several multiprocessors without scratch memory.
 *
 * No function synchronizes or allocates; every launch is checked and a
 * failure names the function and the kernel. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/train_kernels.h"

namespace cg = cooperative_groups;

/* ---- shared helpers ---- */

#define LOSS_THREADS 256
#define LOSS_PARTIALS 4096 /* per-block partial sums at most (scratch doubles) */
#define REDUCE_THREADS 1024

static gp_status launched(const char *fn, const char *kernel, struct gp_error *err)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return GP_OK;
    return gp_error_set(err, GP_ERR_DEVICE, "%s: launching %s: %s (%s)", fn, kernel,
                        cudaGetErrorString(e), cudaGetErrorName(e));
}

static bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

static unsigned loss_blocks(int64_t n)
{
    int64_t b = (n + LOSS_THREADS - 1) / LOSS_THREADS;
    return (unsigned)(b < 1 ? 1 : b > LOSS_PARTIALS ? LOSS_PARTIALS : b);
}

__device__ static inline double warp_sum(double v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

/* The block's sum in a fixed tree, valid in thread 0. blockDim.x is a
 * multiple of 32; every thread calls it. */
__device__ static double block_sum(double v, double *sh /* [32] */)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) v = warp_sum(lane < nw ? sh[lane] : 0.0);
    return v;
}

/* *out = the sum of part[0, n), in a fixed order. One block. */
__global__ void __launch_bounds__(REDUCE_THREADS) sum_partials_kernel(const double *part, int n, double *out)
{
    __shared__ double sh[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += part[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) *out = s;
}

static gp_status finish_loss(cudaStream_t stream, const char *fn, const double *part, unsigned n,
                             double *loss_sum, struct gp_error *err)
{
    sum_partials_kernel<<<1, REDUCE_THREADS, 0, stream>>>(part, (int)n, loss_sum);
    return launched(fn, "sum_partials_kernel", err);
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
    acc = block_sum(acc, sh);
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
        GP_TRY(launched(fn, "ce_cols_kernel", err));
    } else {
        const bool vec = a.S == 1 && a.C % 4 == 0 && aligned16(logits) && (!dlogits || aligned16(dlogits));
        const int64_t items = vec ? a.C / 4 : a.C;
        int threads = 32; /* about 16 items a thread or more */
        while (threads < CE_ROW_THREADS && (int64_t)threads * 16 < items) threads *= 2;
        blocks = (unsigned)(a.rows < 1 ? 1 : a.rows > LOSS_PARTIALS ? LOSS_PARTIALS : a.rows);
        if (vec) {
            ce_rows_kernel<true><<<blocks, threads, 0, stream>>>(a);
            GP_TRY(launched(fn, "ce_rows_kernel<vec>", err));
        } else {
            ce_rows_kernel<false><<<blocks, threads, 0, stream>>>(a);
            GP_TRY(launched(fn, "ce_rows_kernel", err));
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
    s = block_sum(s, sh);
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
    const bool vec = aligned16(pred) && aligned16(target) && (!dpred || aligned16(dpred));
    const unsigned blocks = loss_blocks(vec ? n / 4 : n);
    if (vec) {
        mse_kernel<true><<<blocks, LOSS_THREADS, 0, stream>>>(pred, target, n, scale, dpred, (double *)scratch);
        GP_TRY(launched(fn, "mse_kernel<vec>", err));
    } else {
        mse_kernel<false><<<blocks, LOSS_THREADS, 0, stream>>>(pred, target, n, scale, dpred, (double *)scratch);
        GP_TRY(launched(fn, "mse_kernel", err));
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
    s = block_sum(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

extern "C" gp_status gp_cuda_output_loss(cudaStream_t stream, const float *out, int64_t n, double denominator,
                                         float *dout, double *loss_sum, void *scratch, struct gp_error *err)
{
    static const char fn[] = "gp_cuda_output_loss";
    GP_TRY(check_loss_args(fn, denominator, loss_sum, scratch, err));
    if (n < 0) return gp_error_set(err, GP_ERR_INVALID, "%s: negative element count %lld", fn, (long long)n);
    const float gv = (float)(1.0 / denominator);
    const bool vec = aligned16(out) && (!dout || aligned16(dout));
    const unsigned blocks = loss_blocks(vec ? n / 4 : n);
    if (vec) {
        output_loss_kernel<true><<<blocks, LOSS_THREADS, 0, stream>>>(out, n, gv, dout, (double *)scratch);
        GP_TRY(launched(fn, "output_loss_kernel<vec>", err));
    } else {
        output_loss_kernel<false><<<blocks, LOSS_THREADS, 0, stream>>>(out, n, gv, dout, (double *)scratch);
        GP_TRY(launched(fn, "output_loss_kernel", err));
    }
    return finish_loss(stream, fn, (const double *)scratch, blocks, loss_sum, err);
}

/* ---- optimizers ---- */

#define MT_TENSORS 64
#define MT_CHUNK 16384 /* elements per block; a multiple of 4 */
#define MT_THREADS 256

/* The tensors of one launch, passed by value (kernel parameters are limited
 * to 4 KiB): tensor t takes blocks [first_block[t], first_block[t + 1]), one
 * chunk of MT_CHUNK elements each. */
struct mt_list {
    float *p[MT_TENSORS], *g[MT_TENSORS], *s0[MT_TENSORS], *s1[MT_TENSORS];
    int64_t n[MT_TENSORS];
    int32_t first_block[MT_TENSORS + 1];
    int32_t count;
    uint8_t vec[MT_TENSORS]; /* every pointer of the tensor 16-byte aligned */
};

/* optim.c's sgd_scalars and adamw_scalars, and the clipping. */
struct optim_scalars {
    float coef;
    bool clip;
    /* SGD */
    float wd, mom, damp1, neg_lr;
    bool has_wd, has_mom, nesterov, first;
    /* AdamW */
    float decay, b1, a1, a1m1, b2, a2, bc2_sqrt, neg_step, eps;
    bool lerp, lerp_small;
};

static_assert(sizeof(struct mt_list) + sizeof(struct optim_scalars) <= 4000,
              "multi-tensor kernel arguments must fit CUDA's 4 KiB parameter space");

/* gp_scale_grads' g * coef, stored back as clip_grad_norm_ does. */
__device__ static inline float clipped(const optim_scalars &s, float &g)
{
    if (s.clip) g = __fmul_rn(g, s.coef);
    return g;
}

/* optim.c's sgd_kernel, one element. */
__device__ static inline float sgd_elem(const optim_scalars &s, float p, float &g, float &buf)
{
    float d = clipped(s, g);
    if (s.has_wd) d = __fmaf_rn(p, s.wd, d);
    if (s.has_mom) {
        const float b = s.first ? d : __fmaf_rn(d, s.damp1, __fmul_rn(buf, s.mom));
        buf = b;
        d = s.nesterov ? __fmaf_rn(b, s.mom, d) : b;
    }
    return __fmaf_rn(d, s.neg_lr, p);
}

/* optim.c's adamw_kernel, one element. */
__device__ static inline float adamw_elem(const optim_scalars &s, float p, float &g, float &m, float &v)
{
    const float pi = __fmul_rn(p, s.decay);
    const float gi = clipped(s, g);
    float mi;
    if (s.lerp) {
        const float diff = __fsub_rn(gi, m);
        mi = s.lerp_small ? __fmaf_rn(s.a1, diff, m) : __fmaf_rn(s.a1m1, diff, gi);
    } else {
        mi = __fmaf_rn(gi, s.a1, __fmul_rn(m, s.b1));
    }
    const float vi = __fmaf_rn(__fmul_rn(s.a2, gi), gi, __fmul_rn(v, s.b2));
    m = mi;
    v = vi;
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bc2_sqrt), s.eps);
    return __fadd_rn(pi, __fdiv_rn(__fmul_rn(s.neg_step, mi), denom));
}

template <bool ADAMW>
__device__ static inline void optim_elem(const optim_scalars &s, float *p, float *g, float *s0, float *s1,
                                         int64_t i)
{
    float gi = g[i], pi = p[i];
    if (ADAMW) {
        float m = s0[i], v = s1[i];
        p[i] = adamw_elem(s, pi, gi, m, v);
        s0[i] = m;
        s1[i] = v;
    } else {
        float b = 0.0f;
        if (s.has_mom && !s.first) b = s0[i];
        p[i] = sgd_elem(s, pi, gi, b);
        if (s.has_mom) s0[i] = b;
    }
    if (s.clip) g[i] = gi;
}

template <bool ADAMW>
__global__ void __launch_bounds__(MT_THREADS) optim_kernel(const __grid_constant__ mt_list L,
                                                           const __grid_constant__ optim_scalars s)
{
    /* the tensor of this block: the last t with first_block[t] <= block */
    const int32_t b = (int32_t)blockIdx.x;
    int lo = 0, hi = L.count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (L.first_block[mid] <= b) lo = mid;
        else hi = mid - 1;
    }
    const int t = lo;
    const int64_t start = (int64_t)(b - L.first_block[t]) * MT_CHUNK;
    const int64_t rest = L.n[t] - start, len = rest < MT_CHUNK ? rest : MT_CHUNK;
    float *p = L.p[t] + start, *g = L.g[t] + start;
    float *s0 = L.s0[t] ? L.s0[t] + start : NULL, *s1 = L.s1[t] ? L.s1[t] + start : NULL;
    int64_t done = 0;
    if (L.vec[t]) {
        /* start is a multiple of 4: the chunk stays aligned */
        float4 *p4 = reinterpret_cast<float4 *>(p), *g4 = reinterpret_cast<float4 *>(g);
        float4 *a4 = reinterpret_cast<float4 *>(s0), *b4 = reinterpret_cast<float4 *>(s1);
        const int len4 = (int)(len >> 2);
#pragma unroll 4
        for (int j = threadIdx.x; j < len4; j += MT_THREADS) {
            float4 pv = p4[j], gv = g4[j];
            if (ADAMW) {
                float4 mv = a4[j], vv = b4[j];
                pv.x = adamw_elem(s, pv.x, gv.x, mv.x, vv.x);
                pv.y = adamw_elem(s, pv.y, gv.y, mv.y, vv.y);
                pv.z = adamw_elem(s, pv.z, gv.z, mv.z, vv.z);
                pv.w = adamw_elem(s, pv.w, gv.w, mv.w, vv.w);
                a4[j] = mv;
                b4[j] = vv;
            } else {
                float4 bv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (s.has_mom && !s.first) bv = a4[j];
                pv.x = sgd_elem(s, pv.x, gv.x, bv.x);
                pv.y = sgd_elem(s, pv.y, gv.y, bv.y);
                pv.z = sgd_elem(s, pv.z, gv.z, bv.z);
                pv.w = sgd_elem(s, pv.w, gv.w, bv.w);
                if (s.has_mom) a4[j] = bv;
            }
            p4[j] = pv;
            if (s.clip) g4[j] = gv;
        }
        done = (int64_t)len4 << 2;
    }
    for (int64_t i = done + threadIdx.x; i < len; i += MT_THREADS) optim_elem<ADAMW>(s, p, g, s0, s1, i);
}

static gp_status launch_optim(cudaStream_t stream, bool adamw, const mt_list &L, unsigned blocks,
                              const optim_scalars &s, struct gp_error *err)
{
    if (adamw) {
        optim_kernel<true><<<blocks, MT_THREADS, 0, stream>>>(L, s);
        return launched("gp_cuda_optim_step", "optim_kernel<adamw>", err);
    }
    optim_kernel<false><<<blocks, MT_THREADS, 0, stream>>>(L, s);
    return launched("gp_cuda_optim_step", "optim_kernel<sgd>", err);
}

extern "C" gp_status gp_cuda_optim_step(cudaStream_t stream, struct gp_optim *opt, double lr, float clip_coef,
                                        struct gp_error *err)
{
    static const char fn[] = "gp_cuda_optim_step";
    const struct gp_optim_config *c = &opt->cfg;
    if (c->kind != GP_OPTIM_SGD && c->kind != GP_OPTIM_ADAMW)
        return gp_error_set(err, GP_ERR_INVALID, "%s: unknown optimizer kind %d", fn, (int)c->kind);
    const bool adamw = c->kind == GP_OPTIM_ADAMW;
    opt->steps++;

    optim_scalars s;
    memset(&s, 0, sizeof s);
    /* gp_scale_grads multiplies unless coef is exactly 1; gp_clip_coef gives
     * at most 1 (or NaN, which must poison the gradients as on the CPU) */
    s.clip = !(clip_coef >= 1.0f);
    s.coef = clip_coef;
    if (!adamw) {
        /* gp_sgd_update's */
        s.wd = (float)c->weight_decay;
        s.mom = (float)c->momentum;
        s.damp1 = (float)(1.0 - c->dampening);
        s.neg_lr = (float)(-lr);
        s.has_wd = c->weight_decay != 0.0;
        s.has_mom = c->momentum != 0.0;
        s.nesterov = c->nesterov;
        s.first = opt->steps == 1;
    } else {
        /* gp_adamw_update's, in the same double operations */
        const double stepf = (double)(float)opt->steps;
        const double bc1 = 1.0 - pow(c->beta1, stepf);
        const double bc2 = 1.0 - pow(c->beta2, stepf);
        const double step_size = lr / bc1;
        const double bc2_sqrt = c->arith == GP_TORCH_2 ? pow(bc2, 0.5) : sqrt(bc2);
        const double wd_lr = lr * c->weight_decay;
        s.decay = (float)(1.0 - wd_lr);
        s.b1 = (float)c->beta1;
        s.a1 = (float)(1.0 - c->beta1);
        s.a1m1 = s.a1 - 1.0f;
        s.b2 = (float)c->beta2;
        s.a2 = (float)(1.0 - c->beta2);
        s.bc2_sqrt = (float)bc2_sqrt;
        s.neg_step = (float)(-step_size);
        s.eps = (float)c->eps;
        s.lerp = c->arith == GP_TORCH_2;
        s.lerp_small = fabsf(s.a1) < 0.5f;
    }
    const bool need0 = adamw || s.has_mom, need1 = adamw;

    mt_list L;
    memset(&L, 0, sizeof L);
    int nt = 0;
    int64_t nb = 0;
    for (int i = 0; i < opt->n_params; i++) {
        const struct gp_param *q = &opt->params[i];
        const int64_t n = q->numel;
        if (n <= 0) continue;
        float *s0 = need0 ? opt->state[0][i] : NULL, *s1 = need1 ? opt->state[1][i] : NULL;
        if (!q->data || !q->grad || (need0 && !s0) || (need1 && !s1))
            return gp_error_set(err, GP_ERR_INVALID, "%s: parameter '%s' has no %s", fn,
                                q->name ? q->name : "?",
                                !q->data ? "data" : !q->grad ? "gradient" : "optimizer state");
        const int64_t chunks = (n + MT_CHUNK - 1) / MT_CHUNK;
        if (chunks > INT32_MAX / 2)
            return gp_error_set(err, GP_ERR_UNSUPPORTED, "%s: parameter '%s' has too many elements (%lld)", fn,
                                q->name ? q->name : "?", (long long)n);
        if (nt == MT_TENSORS || nb + chunks > INT32_MAX) {
            L.count = nt;
            L.first_block[nt] = (int32_t)nb;
            GP_TRY(launch_optim(stream, adamw, L, (unsigned)nb, s, err));
            nt = 0;
            nb = 0;
        }
        L.p[nt] = q->data;
        L.g[nt] = q->grad;
        L.s0[nt] = s0;
        L.s1[nt] = s1;
        L.n[nt] = n;
        L.vec[nt] = aligned16(q->data) && aligned16(q->grad) && (!s0 || aligned16(s0)) && (!s1 || aligned16(s1));
        L.first_block[nt] = (int32_t)nb;
        nt++;
        nb += chunks;
    }
    if (nt > 0) {
        L.count = nt;
        L.first_block[nt] = (int32_t)nb;
        GP_TRY(launch_optim(stream, adamw, L, (unsigned)nb, s, err));
    }
    return GP_OK;
}

/* ---- buffers ---- */

template <bool VEC>
__global__ void __launch_bounds__(GP_CUDA_THREADS) accumulate_kernel(float *dst, const float *src, int64_t n)
{
    int64_t done = 0;
    if (VEC) {
        float4 *d4 = reinterpret_cast<float4 *>(dst);
        const float4 *s4 = reinterpret_cast<const float4 *>(src);
        const int64_t n4 = n >> 2;
        GP_GRID_STRIDE(j, n4) {
            float4 d = d4[j];
            const float4 v = s4[j];
            d.x = __fadd_rn(d.x, v.x);
            d.y = __fadd_rn(d.y, v.y);
            d.z = __fadd_rn(d.z, v.z);
            d.w = __fadd_rn(d.w, v.w);
            d4[j] = d;
        }
        done = n4 << 2;
    }
    GP_GRID_STRIDE(k, n - done) dst[done + k] = __fadd_rn(dst[done + k], src[done + k]);
}

extern "C" gp_status gp_cuda_accumulate(cudaStream_t stream, float *dst, const float *src, int64_t n,
                                        struct gp_error *err)
{
    static const char fn[] = "gp_cuda_accumulate";
    if (n < 0) return gp_error_set(err, GP_ERR_INVALID, "%s: negative element count %lld", fn, (long long)n);
    if (n == 0) return GP_OK;
    if (aligned16(dst) && aligned16(src)) {
        accumulate_kernel<true><<<gp_cuda_blocks_for(n / 4), GP_CUDA_THREADS, 0, stream>>>(dst, src, n);
        return launched(fn, "accumulate_kernel<vec>", err);
    }
    accumulate_kernel<false><<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, stream>>>(dst, src, n);
    return launched(fn, "accumulate_kernel", err);
}

#define NORM_TENSORS 192 /* per launch: 192 * 16 bytes of arguments */
#define NORM_CLUSTER 8    /* blocks per tensor, one thread block cluster */
#define NORM_THREADS 512
#define NORM_U 4          /* float4 loads in flight per thread */

struct norm_list {
    const float *x[NORM_TENSORS];
    int64_t n[NORM_TENSORS];
};

static_assert(sizeof(struct norm_list) + sizeof(float *) <= 4000,
              "norm kernel arguments must fit CUDA's 4 KiB parameter space");

/* One cluster of NORM_CLUSTER blocks per tensor (Hopper's thread block
 * clusters: the blocks' sums meet in distributed shared memory, so a large
 * tensor is read by several multiprocessors without a scratch buffer).
 * Each thread sums x*x in double over a fixed set of elements, each block
 * in a fixed tree, and the cluster's first block adds the blocks' sums in
 * rank order. */
__global__ void __cluster_dims__(NORM_CLUSTER, 1, 1) __launch_bounds__(NORM_THREADS)
    norms_kernel(const __grid_constant__ norm_list L, float *out)
{
    __shared__ double sh[32];
    __shared__ double block_total;
    cg::cluster_group cluster = cg::this_cluster();
    const int64_t rank = cluster.block_rank();
    const int t = blockIdx.x / NORM_CLUSTER;
    const float *x = L.x[t];
    const int64_t n = L.n[t], stride = (int64_t)NORM_CLUSTER * NORM_THREADS;
    const int64_t first = rank * NORM_THREADS + threadIdx.x;
    double s = 0.0;
    int64_t done = 0;
    if (((uintptr_t)x & 15u) == 0) {
        const float4 *x4 = reinterpret_cast<const float4 *>(x);
        const int64_t n4 = n >> 2;
        for (int64_t j0 = first; j0 < n4; j0 += NORM_U * stride) {
            float4 q[NORM_U];
#pragma unroll
            for (int u = 0; u < NORM_U; u++)
                q[u] = j0 + u * stride < n4 ? x4[j0 + u * stride] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int u = 0; u < NORM_U; u++) {
                s = fma((double)q[u].x, (double)q[u].x, s);
                s = fma((double)q[u].y, (double)q[u].y, s);
                s = fma((double)q[u].z, (double)q[u].z, s);
                s = fma((double)q[u].w, (double)q[u].w, s);
            }
        }
        done = n4 << 2;
    }
    for (int64_t i = done + first; i < n; i += stride) s = fma((double)x[i], (double)x[i], s);
    s = block_sum(s, sh);
    if (threadIdx.x == 0) block_total = s;
    cluster.sync();
    if (rank == 0 && threadIdx.x == 0) {
        double total = 0.0;
        for (unsigned k = 0; k < NORM_CLUSTER; k++) total += *cluster.map_shared_rank(&block_total, k);
        out[t] = (float)sqrt(total);
    }
    cluster.sync(); /* the other blocks' shared memory must outlive the reads */
}

extern "C" gp_status gp_cuda_norms(cudaStream_t stream, const float *const *tensors, const int64_t *numels,
                                   int count, float *out, struct gp_error *err)
{
    static const char fn[] = "gp_cuda_norms";
    if (count < 0) return gp_error_set(err, GP_ERR_INVALID, "%s: negative tensor count %d", fn, count);
    for (int base = 0; base < count; base += NORM_TENSORS) {
        const int m = count - base < NORM_TENSORS ? count - base : NORM_TENSORS;
        norm_list L;
        memset(&L, 0, sizeof L);
        for (int k = 0; k < m; k++) {
            const int64_t n = numels[base + k];
            if (n < 0 || (n > 0 && !tensors[base + k]))
                return gp_error_set(err, GP_ERR_INVALID, "%s: tensor %d has %s", fn, base + k,
                                    n < 0 ? "a negative element count" : "no data");
            L.x[k] = tensors[base + k];
            L.n[k] = n;
        }
        norms_kernel<<<m * NORM_CLUSTER, NORM_THREADS, 0, stream>>>(L, out + base);
        GP_TRY(launched(fn, "norms_kernel", err));
    }
    return GP_OK;
}
