/* CUDA kernels: InstanceNormalization, twin of backend/cpu/instance_norm.c,
 * forward and backward, with the CPU's (PyTorch's) formulas: biased
 * variance, epsilon inside the square root. One block per plane.
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
 * of operations. */
#include <math.h>
#include <string.h>

#include "backend/cuda/kernel_util.cuh"

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

__global__ static void in_forward_kernel(struct in_plan p, const float *x, const float *scale,
                                         const float *bias, float *y, float *mean, float *invstd)
{
    __shared__ double sh[32];
    for (int64_t pl = blockIdx.x; pl < p.n * p.c; pl += gridDim.x) {
        const float *xs = x + pl * p.s;
        float *ys = y + pl * p.s;
        double m, var;
        gp_dev_block_moments(xs, p.s, sh, &m, &var);
        float mr = (float)m, is = (float)(1.0 / sqrt(DADD(var, p.eps)));
        if (threadIdx.x == 0) mean[pl] = mr, invstd[pl] = is;
        float a = FMUL(is, scale[pl % p.c]), b = bias[pl % p.c];
        for (int64_t i = threadIdx.x; i < p.s; i += blockDim.x) ys[i] = FADD(FMUL(FSUB(xs[i], mr), a), b);
    }
}

static gp_status in_forward(struct gp_cuda_ctx *ctx, struct gp_error *err)
{
    for (int i = 0; i < 3; i++) GP_TRY(gp_cuda_want_f32(ctx, i, err));
    struct in_plan p;
    in_plan_of(ctx, &p);
    if (p.n * p.c == 0) return GP_OK;
    float *mean = (float *)ctx->saved, *invstd = mean + p.n * p.c;
    in_forward_kernel<<<gp_cuda_capped_grid(p.n * p.c, 1 << 20), gp_cuda_row_threads(p.s), 0, ctx->stream>>>(
        p, (const float *)ctx->in[0], (const float *)ctx->in[1], (const float *)ctx->in[2],
        (float *)ctx->out[0], mean, invstd);
    return gp_cuda_check_launch(ctx, "InstanceNormalization forward", err);
}

/* One block per plane: its sums of dy and dy xhat (to scratch) and, when
 * dx is wanted, dx += scale invstd (dy - mean(dy) - xhat mean(dy xhat)). */
__global__ static void in_bwd_plane_kernel(struct in_plan p, const float *x, const float *scale,
                                           const float *dy, const float *mean, const float *invstd,
                                           double *sums, float *dx)
{
    __shared__ double sh[32];
    for (int64_t pl = blockIdx.x; pl < p.n * p.c; pl += gridDim.x) {
        const float *xs = x + pl * p.s, *dys = dy + pl * p.s;
        float m = mean[pl], is = invstd[pl];
        double s = 0, sx = 0;
        for (int64_t i = threadIdx.x; i < p.s; i += blockDim.x) {
            s = DADD(s, (double)dys[i]);
            sx = DADD(sx, DMUL((double)dys[i], (double)FMUL(FSUB(xs[i], m), is)));
        }
        s = gp_dev_block_sum(s, sh);
        sx = gp_dev_block_sum(sx, sh);
        if (threadIdx.x == 0) sums[2 * pl] = s, sums[2 * pl + 1] = sx;
        if (!dx) continue;
        double a = DMUL((double)scale[pl % p.c], (double)is), mdy = s / (double)p.s;
        double mdyx = sx / (double)p.s;
        float *dxs = dx + pl * p.s;
        for (int64_t i = threadIdx.x; i < p.s; i += blockDim.x) {
            double xhat = (double)FMUL(FSUB(xs[i], m), is);
            double v = DMUL(a, DSUB(DSUB((double)dys[i], mdy), DMUL(xhat, mdyx)));
            dxs[i] = FADD(dxs[i], (float)v);
        }
    }
}

/* One thread per channel: dscale, dB add the channel's planes in sample
 * order, as the CPU does. */
__global__ static void in_bwd_params_kernel(struct in_plan p, const double *sums, float *dscale,
                                            float *dbias)
{
    GP_GRID_STRIDE(c, p.c) {
        double sc = 0, sb = 0;
        for (int64_t n = 0; n < p.n; n++) {
            int64_t pl = n * p.c + c;
            sc = DADD(sc, sums[2 * pl + 1]);
            sb = DADD(sb, sums[2 * pl]);
        }
        if (dscale) dscale[c] = FADD(dscale[c], (float)sc);
        if (dbias) dbias[c] = FADD(dbias[c], (float)sb);
    }
}

static gp_status in_backward(struct gp_cuda_ctx *ctx, struct gp_error *err)
{
    for (int i = 0; i < 3; i++) GP_TRY(gp_cuda_want_f32(ctx, i, err));
    struct in_plan p;
    in_plan_of(ctx, &p);
    const float *dy = ctx->dout[0];
    float *dx = ctx->din[0], *dscale = ctx->din[1], *dbias = ctx->din[2];
    if (!dy || p.n * p.c == 0 || (!dx && !dscale && !dbias)) return GP_OK;
    const float *mean = (const float *)ctx->saved, *invstd = mean + p.n * p.c;
    double *sums = (double *)ctx->scratch;
    in_bwd_plane_kernel<<<gp_cuda_capped_grid(p.n * p.c, 1 << 20), gp_cuda_row_threads(p.s), 0, ctx->stream>>>(
        p, (const float *)ctx->in[0], (const float *)ctx->in[1], dy, mean, invstd, sums, dx);
    GP_TRY(gp_cuda_check_launch(ctx, "InstanceNormalization backward", err));
    if (!dscale && !dbias) return GP_OK;
    in_bwd_params_kernel<<<gp_cuda_blocks_for(p.c), GP_CUDA_THREADS, 0, ctx->stream>>>(p, sums, dscale,
                                                                                      dbias);
    return gp_cuda_check_launch(ctx, "InstanceNormalization parameter gradients", err);
}

/* ---- the table ---- */

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_instance_norm[] = {
    {"InstanceNormalization", in_saved, in_scratch, in_forward, in_backward},
    {NULL, NULL, NULL, NULL, NULL},
};
