/* CUDA kernels: InstanceNormalization, twin of backend/cpu/instance_norm.c,
 * forward and backward, with the CPU's (PyTorch's) formulas: biased
 * variance, epsilon inside the square root. One block per plane, moving
 * runs of up to 8 values per access.
 *
 * Statistics are accumulated in double, as the CPU does: the mean first,
 * then the sum of squared deviations from it (two passes), so the float
 * results agree with the CPU's to an ulp. Every reduction runs in a fixed
 * order (per-thread strided sums, then a shuffle/shared-memory tree of a
 * fixed block size; a channel's parameter gradients add its planes' sums in
 * sample order), so results are identical run to run; no atomics anywhere.
 *
 * Rounding: nvcc contracts a * b + c into FMAs, the CPU build does not;
 * where a product feeds a sum the operations are spelled with the _rn
 * intrinsics (never contracted), in float and in double, in the CPU's order
 * of operations.
 *
 * bfloat16 (gp_cuda_kernel.bf16_any): every float tensor may be stored as
 * bfloat16 or float32, as ctx->*_dt says. Loads widen exactly and every
 * stored value is rounded once (to nearest even), a gradient after its
 * float32 term is added to the widened old value: the results of the
 * float32 kernel on widened copies, rounded back (the staged call,
 * backend/mixed_call.h). Statistics, saved state and scratch stay float32
 * / double. */
#include <initializer_list>
#include <math.h>
#include <string.h>

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/norm_storage.cuh"

/* ---- storage: IO of norm_storage.cuh for the plane kernels; the
 * parameter gradients are accumulated with gp_acc whatever the call (C
 * values). */

/* ---- InstanceNormalization ---- */

/* X [N, C, D...]: each (sample, channel) plane of S cells normalized by its
 * own mean and biased variance. One block per plane. */
struct in_plan {
    int64_t n, c, s;
    double eps;
};

static void in_plan_of(const struct gp_cuda_ctx *ctx, struct in_plan *p)
{
    const struct gp_shape *x = &gp_cuda_in_value(ctx, 0)->shape;
    p->n = x->dims[0];
    p->c = x->dims[1];
    p->s = 1;
    for (int i = 2; i < x->rank; i++) p->s *= x->dims[i];
    p->eps = gp_node_attr_float(ctx->node, "epsilon", 1e-5f);
}

/* ctx->saved: mean [N C] and inverse standard deviation [N C] (float). */
static size_t in_saved(const struct gp_graph *g, const struct gp_node *node)
{
    const struct gp_shape *x = &gp_node_input(g, node, 0)->shape;
    return 2 * sizeof(float) * (size_t)(x->dims[0] * x->dims[1]);
}

/* Scratch: per-plane sums of dy and dy xhat (doubles) for backward. */
static size_t in_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    const struct gp_shape *x = &gp_node_input(g, node, 0)->shape;
    return 2 * sizeof(double) * (size_t)(x->dims[0] * x->dims[1]);
}

/* The passes over a plane move runs of VEC consecutive values as one access
 * (io_vec_for: VEC divides the plane and the tensors' alignment allows it),
 * the loops unrolled 4 times so their loads are in flight together: one
 * value per access at a time leaves most of the bandwidth unused. A
 * thread adds its values in run order, then the fixed tree. */

/* The mean and biased variance of the n values of x from `base` (two
 * passes, in double). */
template <class IO, int VEC>
__device__ static inline void in_block_moments(gp_fptr x, int64_t base, int64_t n, double *sh, double *mean,
                                               double *var)
{
    const int64_t runs = n / VEC;
    double s = 0;
#pragma unroll 4
    for (int64_t r = threadIdx.x; r < runs; r += blockDim.x) {
        float v[VEC];
        IO::template acts<VEC>(x, base + r * VEC, v);
#pragma unroll
        for (int k = 0; k < VEC; k++) s = DADD(s, (double)v[k]);
    }
    s = gp_dev_block_sum(s, sh);
    double m = n > 0 ? s / (double)n : 0.0;
    double q = 0;
#pragma unroll 4
    for (int64_t r = threadIdx.x; r < runs; r += blockDim.x) {
        float v[VEC];
        IO::template acts<VEC>(x, base + r * VEC, v);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            double d = DSUB((double)v[k], m);
            q = DADD(q, DMUL(d, d));
        }
    }
    q = gp_dev_block_sum(q, sh);
    *mean = m;
    *var = n > 0 ? q / (double)n : 0.0;
}

template <class IO, int VEC>
__global__ static void in_forward_kernel(struct in_plan p, gp_fptr x, gp_fptr scale, gp_fptr bias, gp_fptr y,
                                         float *mean, float *invstd)
{
    __shared__ double sh[32];
    const int64_t runs = p.s / VEC;
    for (int64_t pl = blockIdx.x; pl < p.n * p.c; pl += gridDim.x) {
        int64_t base = pl * p.s;
        double m, var;
        in_block_moments<IO, VEC>(x, base, p.s, sh, &m, &var);
        float mr = (float)m, is = (float)(1.0 / sqrt(DADD(var, p.eps)));
        if (threadIdx.x == 0) mean[pl] = mr, invstd[pl] = is;
        float a = FMUL(is, IO::par(scale, pl % p.c)), b = IO::par(bias, pl % p.c);
#pragma unroll 4
        for (int64_t r = threadIdx.x; r < runs; r += blockDim.x) {
            float v[VEC];
            IO::template acts<VEC>(x, base + r * VEC, v);
#pragma unroll
            for (int k = 0; k < VEC; k++) v[k] = FADD(FMUL(FSUB(v[k], mr), a), b);
            IO::template set_acts<VEC>(y, base + r * VEC, v);
        }
    }
}

static gp_status in_forward(struct gp_cuda_ctx *ctx, struct gp_error *err)
{
    for (int i = 0; i < 3; i++) GP_TRY(gp_cuda_want_f32(ctx, i, err));
    struct in_plan p;
    in_plan_of(ctx, &p);
    if (p.n * p.c == 0) return GP_OK;
    float *mean = (float *)ctx->saved, *invstd = mean + p.n * p.c;
    gp_fptr x = gp_cuda_in_f(ctx, 0), scale = gp_cuda_in_f(ctx, 1), bias = gp_cuda_in_f(ctx, 2);
    gp_fptr y = gp_cuda_out_f(ctx, 0);
    enum io_kind kind = io_kind_of({x, y}, {scale, bias});
    unsigned grid = gp_cuda_capped_grid(p.n * p.c, 1 << 20), threads = gp_cuda_row_threads(p.s);
    int vec = io_vec_for(kind, p.s, {x, y});
    IO_DISPATCH(kind, IO_VEC_DISPATCH(vec, in_forward_kernel<IO, VEC><<<grid, threads, 0, ctx->stream>>>(
                                               p, x, scale, bias, y, mean, invstd)));
    return gp_cuda_check_launch(ctx, "InstanceNormalization forward", err);
}

/* One block per plane: its sums of dy and dy xhat (to scratch) and, when
 * dx is wanted, dx += scale invstd (dy - mean(dy) - xhat mean(dy xhat)). */
template <class IO, int VEC>
__global__ static void in_bwd_plane_kernel(struct in_plan p, gp_fptr x, gp_fptr scale, gp_fptr dy,
                                           const float *mean, const float *invstd, double *sums, gp_fptr dx)
{
    __shared__ double sh[32];
    const int64_t runs = p.s / VEC;
    for (int64_t pl = blockIdx.x; pl < p.n * p.c; pl += gridDim.x) {
        int64_t base = pl * p.s;
        float m = mean[pl], is = invstd[pl];
        double s = 0, sx = 0;
#pragma unroll 4
        for (int64_t r = threadIdx.x; r < runs; r += blockDim.x) {
            float g[VEC], xv[VEC];
            IO::template acts<VEC>(dy, base + r * VEC, g);
            IO::template acts<VEC>(x, base + r * VEC, xv);
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                s = DADD(s, (double)g[k]);
                sx = DADD(sx, DMUL((double)g[k], (double)FMUL(FSUB(xv[k], m), is)));
            }
        }
        s = gp_dev_block_sum(s, sh);
        sx = gp_dev_block_sum(sx, sh);
        if (threadIdx.x == 0) sums[2 * pl] = s, sums[2 * pl + 1] = sx;
        if (!dx.p) continue;
        double a = DMUL((double)IO::par(scale, pl % p.c), (double)is), mdy = s / (double)p.s;
        double mdyx = sx / (double)p.s;
#pragma unroll 4
        for (int64_t r = threadIdx.x; r < runs; r += blockDim.x) {
            float g[VEC], xv[VEC], d[VEC];
            IO::template acts<VEC>(dy, base + r * VEC, g);
            IO::template acts<VEC>(x, base + r * VEC, xv);
            IO::template acts<VEC>(dx, base + r * VEC, d);
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                double xhat = (double)FMUL(FSUB(xv[k], m), is);
                double v = DMUL(a, DSUB(DSUB((double)g[k], mdy), DMUL(xhat, mdyx)));
                d[k] = FADD(d[k], (float)v);
            }
            IO::template set_acts<VEC>(dx, base + r * VEC, d);
        }
    }
}

/* One thread per channel: dscale, dB add the channel's planes in sample
 * order, as the CPU does. */
__global__ static void in_bwd_params_kernel(struct in_plan p, const double *sums, gp_fptr dscale,
                                            gp_fptr dbias)
{
    GP_GRID_STRIDE(c, p.c) {
        double sc = 0, sb = 0;
        for (int64_t n = 0; n < p.n; n++) {
            int64_t pl = n * p.c + c;
            sc = DADD(sc, sums[2 * pl + 1]);
            sb = DADD(sb, sums[2 * pl]);
        }
        if (dscale.p) gp_acc(dscale, c, (float)sc);
        if (dbias.p) gp_acc(dbias, c, (float)sb);
    }
}

static gp_status in_backward(struct gp_cuda_ctx *ctx, struct gp_error *err)
{
    for (int i = 0; i < 3; i++) GP_TRY(gp_cuda_want_f32(ctx, i, err));
    struct in_plan p;
    in_plan_of(ctx, &p);
    gp_fptr none = {NULL, false};
    gp_fptr x = gp_cuda_in_f(ctx, 0), scale = gp_cuda_in_f(ctx, 1);
    gp_fptr dy = ctx->dout[0] ? gp_cuda_dout_f(ctx, 0) : none;
    gp_fptr dx = ctx->din[0] ? gp_cuda_din_f(ctx, 0) : none;
    gp_fptr dscale = ctx->din[1] ? gp_cuda_din_f(ctx, 1) : none;
    gp_fptr dbias = ctx->din[2] ? gp_cuda_din_f(ctx, 2) : none;
    if (!dy.p || p.n * p.c == 0 || (!dx.p && !dscale.p && !dbias.p)) return GP_OK;
    const float *mean = (const float *)ctx->saved, *invstd = mean + p.n * p.c;
    double *sums = (double *)ctx->scratch;
    enum io_kind kind = io_kind_of({x, dy, dx}, {scale});
    unsigned grid = gp_cuda_capped_grid(p.n * p.c, 1 << 20), threads = gp_cuda_row_threads(p.s);
    int vec = io_vec_for(kind, p.s, {x, dy, dx});
    IO_DISPATCH(kind, IO_VEC_DISPATCH(vec, in_bwd_plane_kernel<IO, VEC><<<grid, threads, 0, ctx->stream>>>(
                                               p, x, scale, dy, mean, invstd, sums, dx)));
    GP_TRY(gp_cuda_check_launch(ctx, "InstanceNormalization backward", err));
    if (!dscale.p && !dbias.p) return GP_OK;
    in_bwd_params_kernel<<<gp_cuda_blocks_for(p.c), GP_CUDA_THREADS, 0, ctx->stream>>>(p, sums, dscale,
                                                                                      dbias);
    return gp_cuda_check_launch(ctx, "InstanceNormalization parameter gradients", err);
}

/* ---- the table ---- */

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_instance_norm[] = {
    {"InstanceNormalization", in_saved, in_scratch, in_forward, in_backward, false, true},
    {NULL, NULL, NULL, NULL, NULL},
};
