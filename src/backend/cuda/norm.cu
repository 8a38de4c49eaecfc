/* CUDA kernels: the norm family, twin of backend/cpu/norm.c:
 * BatchNormalization, InstanceNormalization and LayerNormalization, forward
 * and backward, with the CPU's (PyTorch's) formulas: biased variance,
 * epsilon inside the square root, y = (x - mean) * invstd * scale + bias.
 *
 * Statistics are accumulated in double, as the CPU does: the mean first,
 * then the sum of squared deviations from it (two passes), so the float
 * results agree with the CPU's to an ulp. Every reduction runs in a fixed
 * order (per-thread strided sums, then a shuffle/shared-memory tree of a
 * fixed block size, then partial sums added in chunk order), so results are
 * identical run to run; no atomics anywhere.
 *
 * BatchNormalization splits each channel's N * S values into P chunks (a
 * function of the shape only): a grid of C x P blocks writes per-chunk
 * partial sums to scratch, one thread per channel adds them in chunk order
 * and finishes the statistics (saved mean / inverse std, the optional
 * outputs, the running statistics or the deferred sums), and an elementwise
 * pass applies them. Backward mirrors it. InstanceNormalization and
 * LayerNormalization use one block per plane / row; rows of LayerNorm up
 * to 4096 values (backward: 2048) stay in registers, so a row is read
 * once. LayerNormalization's parameter gradients sum over rows in a fixed
 * number of blocks / chunks (partials in scratch, then added per column in
 * a fixed order).
 *
 * Rounding: nvcc contracts a * b + c into FMAs, the CPU build does not;
 * where a product feeds a sum the operations are spelled with the _rn
 * intrinsics (never contracted), in float and in double, in the CPU's order
 * of operations. */
#include <math.h>
#include <string.h>

#include "backend/cuda/kernel_util.cuh"

#define FADD __fadd_rn
#define FSUB __fsub_rn
#define FMUL __fmul_rn
#define DADD __dadd_rn
#define DSUB __dsub_rn
#define DMUL __dmul_rn

/* ---- shared helpers ---- */

/* a / b for a, b >= 0: 32-bit division when both fit. */
__device__ static inline int64_t fdiv(int64_t a, int64_t b)
{
    return ((a | b) >> 32) == 0 ? (int64_t)((uint32_t)a / (uint32_t)b) : a / b;
}

/* The channel of element i of [N, C, S]. */
__device__ static inline int64_t chan_of(int64_t i, int64_t s, int64_t c)
{
    int64_t q = fdiv(i, s);
    return q - fdiv(q, c) * c;
}

/* ---- BatchNormalization ---- */

/* X [N, C, D...]: statistics per channel over N and the spatial cells S.
 * Each channel's count = N * S values, in (n, i) order, split into P
 * chunks of L values (the last one shorter). */
struct bn_plan {
    int64_t n, c, s, count;
    int64_t p, l; /* chunks per channel, values per chunk */
    double eps, momentum;
};

#define BN_THREADS 256
#define BN_MAX_CHUNKS 64

static void bn_plan_of(const struct gp_graph *g, const struct gp_node *node, struct bn_plan *p)
{
    const struct gp_shape *x = &gp_node_input(g, node, 0)->shape;
    p->n = x->dims[0];
    p->c = x->rank > 1 ? x->dims[1] : 1;
    p->s = 1;
    for (int i = 2; i < x->rank; i++) p->s *= x->dims[i];
    p->count = p->n * p->s;
    /* About 2048 blocks in all, at least 2048 values per chunk. */
    int64_t chunks = (2048 + p->c - 1) / (p->c > 0 ? p->c : 1);
    int64_t by_size = (p->count + 2047) / 2048;
    if (chunks > by_size) chunks = by_size;
    if (chunks > BN_MAX_CHUNKS) chunks = BN_MAX_CHUNKS;
    if (chunks < 1) chunks = 1;
    p->l = (p->count + chunks - 1) / chunks;
    if (p->l < 1) p->l = 1;
    p->p = (p->count + p->l - 1) / p->l;
    if (p->p < 1) p->p = 1;
    p->eps = gp_node_attr_float(node, "epsilon", 1e-5f);
    p->momentum = gp_node_attr_float(node, "momentum", 0.9f);
}

/* ctx->saved: the mean [C] and inverse standard deviation [C] (float) that
 * normalized the forward, as on the CPU. */
static size_t bn_saved(const struct gp_graph *g, const struct gp_node *node)
{
    return 2 * sizeof(float) * (size_t)gp_node_input(g, node, 0)->shape.dims[1];
}

/* Scratch (doubles): forward partials psum, psq_raw, psq [C * P] each;
 * backward partials [2 C P] and per-channel coefficients [5 C]. */
static size_t bn_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    struct bn_plan p;
    bn_plan_of(g, node, &p);
    return sizeof(double) * (size_t)(3 * p.c * p.p + 5 * p.c);
}

/* Walks values j0, j0 + step, ... < j1 of channel c: offset (n C + c) S + i
 * for j = n S + i, kept incrementally (no division per value). */
#define BN_CHUNK_LOOP(p, c, j0, j1, off, ...)                                          \
    do {                                                                              \
        int64_t j_ = (j0) + threadIdx.x, step_ = blockDim.x;                          \
        int64_t n_ = j_ / (p).s, i_ = j_ - n_ * (p).s;                                \
        int64_t dn_ = step_ / (p).s, di_ = step_ - dn_ * (p).s;                       \
        for (; j_ < (j1); j_ += step_) {                                              \
            int64_t off = (n_ * (p).c + (c)) * (p).s + i_;                            \
            __VA_ARGS__;                                                              \
            i_ += di_;                                                                \
            n_ += dn_;                                                                \
            if (i_ >= (p).s) i_ -= (p).s, n_++;                                       \
        }                                                                             \
    } while (0)

/* Block (c, k): chunk k of channel c: sum and sum of squares of x. */
__global__ static void bn_sums_kernel(struct bn_plan p, const float *x, double *psum, double *psq_raw)
{
    __shared__ double sh[32];
    int64_t c = blockIdx.x, k = blockIdx.y;
    int64_t j0 = k * p.l, j1 = j0 + p.l < p.count ? j0 + p.l : p.count;
    double s = 0, q = 0;
    BN_CHUNK_LOOP(p, c, j0, j1, off, {
        double v = x[off];
        s = DADD(s, v);
        q = DADD(q, DMUL(v, v));
    });
    s = gp_dev_block_sum(s, sh);
    q = gp_dev_block_sum(q, sh);
    if (threadIdx.x == 0) psum[c * p.p + k] = s, psq_raw[c * p.p + k] = q;
}

/* The channel's mean: its chunks' sums added in chunk order. */
__device__ static double bn_channel_mean(const struct bn_plan &p, const double *psum, int64_t c)
{
    double s = 0;
    for (int64_t k = 0; k < p.p; k++) s = DADD(s, psum[c * p.p + k]);
    return s / (double)p.count;
}

/* Block (c, k): sum over chunk k of (x - mean)^2, mean the channel's. */
__global__ static void bn_sq_kernel(struct bn_plan p, const float *x, const double *psum, double *psq)
{
    __shared__ double sh[32];
    __shared__ double mean_sh;
    int64_t c = blockIdx.x, k = blockIdx.y;
    if (threadIdx.x == 0) mean_sh = bn_channel_mean(p, psum, c);
    __syncthreads();
    double m = mean_sh;
    int64_t j0 = k * p.l, j1 = j0 + p.l < p.count ? j0 + p.l : p.count;
    double q = 0;
    BN_CHUNK_LOOP(p, c, j0, j1, off, {
        double d = DSUB((double)x[off], m);
        q = DADD(q, DMUL(d, d));
    });
    q = gp_dev_block_sum(q, sh);
    if (threadIdx.x == 0) psq[c * p.p + k] = q;
}

struct bn_outs {
    float *rmean, *rvar;                   /* inputs 3 and 4, updated in place */
    float *out_rmean, *out_rvar, *out_mean, *out_var;
    float *mean, *invstd;                  /* saved */
    double *deferred;
};

/* One thread per channel: the statistics (the batch's in training, the
 * running ones in evaluation), saved mean and inverse std, the optional
 * outputs, and the running statistics (in place) or the deferred sums. */
__global__ static void bn_finish_kernel(struct bn_plan p, bool training, bool update,
                                        const double *psum, const double *psq_raw,
                                        const double *psq, struct bn_outs o)
{
    GP_GRID_STRIDE(c, p.c) {
        double m, var, sum = 0, sumsq = 0;
        if (training) {
            double q = 0;
            for (int64_t k = 0; k < p.p; k++) {
                sum = DADD(sum, psum[c * p.p + k]);
                sumsq = DADD(sumsq, psq_raw[c * p.p + k]);
                q = DADD(q, psq[c * p.p + k]);
            }
            m = sum / (double)p.count;
            var = q / (double)p.count;
        } else {
            m = o.rmean[c];
            var = o.rvar[c];
        }
        float is = (float)(1.0 / sqrt(DADD(var, p.eps)));
        o.mean[c] = (float)m;
        o.invstd[c] = is;
        float rm = o.rmean[c], rv = o.rvar[c], new_mean = rm, new_var = rv;
        if (training) {
            double unbiased = DMUL(var, (double)p.count) / (double)(p.count - 1);
            new_mean = (float)DADD(DMUL(p.momentum, (double)rm), DMUL(DSUB(1.0, p.momentum), m));
            new_var = (float)DADD(DMUL(p.momentum, (double)rv), DMUL(DSUB(1.0, p.momentum), unbiased));
        }
        if (o.out_rmean) o.out_rmean[c] = new_mean;
        if (o.out_rvar) o.out_rvar[c] = new_var;
        if (o.out_mean) o.out_mean[c] = (float)m;
        if (o.out_var) o.out_var[c] = (float)var;
        if (update && o.deferred) {
            o.deferred[c] = DADD(o.deferred[c], sum);
            o.deferred[p.c + c] = DADD(o.deferred[p.c + c], sumsq);
            if (c == 0) o.deferred[2 * p.c] = DADD(o.deferred[2 * p.c], (double)p.count);
        } else if (update) {
            o.rmean[c] = new_mean;
            o.rvar[c] = new_var;
        }
    }
}

/* y = x * alpha + beta, alpha = invstd * scale, beta = bias - mean * alpha
 * (PyTorch's transform, as the CPU computes it). Planes of S >= 128 cells:
 * blocks over (cells, planes); smaller: one flat grid-stride loop. */
__global__ static void bn_apply_planes_kernel(struct bn_plan p, const float *x, const float *scale,
                                              const float *bias, const float *mean,
                                              const float *invstd, float *y)
{
    for (int64_t pl = blockIdx.y; pl < p.n * p.c; pl += gridDim.y) {
        int64_t c = pl % p.c;
        float alpha = FMUL(invstd[c], scale[c]), beta = FSUB(bias[c], FMUL(mean[c], alpha));
        const float *xs = x + pl * p.s;
        float *ys = y + pl * p.s;
        for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < p.s;
             i += (int64_t)gridDim.x * blockDim.x)
            ys[i] = FADD(FMUL(xs[i], alpha), beta);
    }
}

__global__ static void bn_apply_flat_kernel(struct bn_plan p, const float *x, const float *scale,
                                            const float *bias, const float *mean,
                                            const float *invstd, float *y)
{
    GP_GRID_STRIDE(i, p.n * p.c * p.s) {
        int64_t c = chan_of(i, p.s, p.c);
        float alpha = FMUL(invstd[c], scale[c]), beta = FSUB(bias[c], FMUL(mean[c], alpha));
        y[i] = FADD(FMUL(x[i], alpha), beta);
    }
}

static void bn_elementwise_grid(const struct bn_plan &p, dim3 *grid, bool *planes)
{
    *planes = p.s >= 128;
    if (*planes) {
        int64_t bx = (p.s + GP_CUDA_THREADS - 1) / GP_CUDA_THREADS;
        *grid = dim3(gp_cuda_capped_grid(bx, 64), gp_cuda_capped_grid(p.n * p.c, 65535), 1);
    } else {
        *grid = dim3(gp_cuda_blocks_for(p.n * p.c * p.s), 1, 1);
    }
}

static float *opt_out(const struct gp_cuda_ctx *c, int i)
{
    return c->node->n_outputs > i ? (float *)c->out[i] : NULL;
}

static const float *opt_dout(const struct gp_cuda_ctx *c, int i)
{
    return c->node->n_outputs > i ? c->dout[i] : NULL;
}

/* Inputs X [N, C, D...], scale [C], B [C], mean [C], var [C] -> Y like X;
 * optional outputs [C]: running mean and var as updated by this batch, and
 * (opsets 7, 9) the batch's mean and biased variance. Training updates the
 * running statistics in place (ctx->update_state) with ONNX's momentum and
 * the unbiased batch variance, or adds the batch's sums to
 * ctx->deferred_stats; evaluation uses the running statistics. */
static gp_status bn_forward(struct gp_cuda_ctx *ctx, struct gp_error *err)
{
    for (int i = 0; i < 5; i++) GP_TRY(gp_cuda_want_f32(ctx, i, err));
    struct bn_plan p;
    bn_plan_of(ctx->graph, ctx->node, &p);
    if (ctx->training && p.count < 2)
        return gp_cuda_error(ctx, err, GP_ERR_SHAPE,
                             "training needs more than one value per channel to estimate the "
                             "variance (input [%lld, %lld, ...]; PyTorch refuses this too)",
                             (long long)p.n, (long long)p.c);
    if (p.c == 0) return GP_OK;
    bool training = ctx->training, update = ctx->training && ctx->update_state;
    const float *x = (const float *)ctx->in[0];
    double *psum = (double *)ctx->scratch, *psq_raw = psum + p.c * p.p, *psq = psq_raw + p.c * p.p;
    if (training) {
        dim3 grid((unsigned)p.c, (unsigned)p.p, 1);
        bn_sums_kernel<<<grid, BN_THREADS, 0, ctx->stream>>>(p, x, psum, psq_raw);
        GP_TRY(gp_cuda_check_launch(ctx, "BatchNormalization sums", err));
        bn_sq_kernel<<<grid, BN_THREADS, 0, ctx->stream>>>(p, x, psum, psq);
        GP_TRY(gp_cuda_check_launch(ctx, "BatchNormalization variance", err));
    }
    struct bn_outs o;
    o.rmean = (float *)ctx->in[3];
    o.rvar = (float *)ctx->in[4];
    o.out_rmean = opt_out(ctx, 1);
    o.out_rvar = opt_out(ctx, 2);
    o.out_mean = opt_out(ctx, 3);
    o.out_var = opt_out(ctx, 4);
    o.mean = (float *)ctx->saved;
    o.invstd = o.mean + p.c;
    o.deferred = ctx->deferred_stats;
    bn_finish_kernel<<<gp_cuda_blocks_for(p.c), GP_CUDA_THREADS, 0, ctx->stream>>>(
        p, training, update, psum, psq_raw, psq, o);
    GP_TRY(gp_cuda_check_launch(ctx, "BatchNormalization statistics", err));
    if (p.n * p.s == 0) return GP_OK;
    dim3 grid;
    bool planes;
    bn_elementwise_grid(p, &grid, &planes);
    const float *scale = (const float *)ctx->in[1], *bias = (const float *)ctx->in[2];
    if (planes)
        bn_apply_planes_kernel<<<grid, GP_CUDA_THREADS, 0, ctx->stream>>>(
            p, x, scale, bias, o.mean, o.invstd, (float *)ctx->out[0]);
    else
        bn_apply_flat_kernel<<<grid, GP_CUDA_THREADS, 0, ctx->stream>>>(
            p, x, scale, bias, o.mean, o.invstd, (float *)ctx->out[0]);
    return gp_cuda_check_launch(ctx, "BatchNormalization normalize", err);
}

/* Deferred statistics: 2C + 1 doubles, as on the CPU. */
extern "C" size_t gp_cuda_bn_stats_len(const struct gp_graph *g, const struct gp_node *node)
{
    return 2 * (size_t)gp_node_input(g, node, 0)->shape.dims[1] + 1;
}

__global__ static void bn_commit_kernel(int64_t c_n, double momentum, float *rmean, float *rvar,
                                        const double *stats)
{
    double count = stats[2 * c_n];
    if (count < 2) return;
    GP_GRID_STRIDE(c, c_n) {
        double m = stats[c] / count;
        double var = DSUB(stats[c_n + c] / count, DMUL(m, m));
        if (var < 0) var = 0;
        double unbiased = DMUL(var, count) / DSUB(count, 1.0);
        rmean[c] = (float)DADD(DMUL(momentum, (double)rmean[c]), DMUL(DSUB(1.0, momentum), m));
        rvar[c] = (float)DADD(DMUL(momentum, (double)rvar[c]), DMUL(DSUB(1.0, momentum), unbiased));
    }
}

/* The running statistics from the mini-batch's accumulated sums (when it
 * counted at least 2 values per channel), then the sums cleared. */
extern "C" gp_status gp_cuda_bn_commit(cudaStream_t stream, const struct gp_graph *g,
                                       const struct gp_node *node, float *rmean, float *rvar,
                                       double *stats, struct gp_error *err)
{
    int64_t c_n = gp_node_input(g, node, 0)->shape.dims[1];
    double momentum = gp_node_attr_float(node, "momentum", 0.9f);
    if (c_n > 0) {
        bn_commit_kernel<<<gp_cuda_blocks_for(c_n), GP_CUDA_THREADS, 0, stream>>>(c_n, momentum, rmean,
                                                                                  rvar, stats);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            return gp_error_set(err, GP_ERR_DEVICE, "node '%s' (%s): deferred statistics commit: %s",
                                node->name, node->op_type, cudaGetErrorString(e));
    }
    cudaError_t e = cudaMemsetAsync(stats, 0, sizeof(double) * (size_t)(2 * c_n + 1), stream);
    if (e != cudaSuccess)
        return gp_error_set(err, GP_ERR_DEVICE,
                            "node '%s' (%s): clearing the deferred statistics (cudaMemsetAsync): %s",
                            node->name, node->op_type, cudaGetErrorString(e));
    return GP_OK;
}

/* Block (c, k): sums over chunk k of dy and dy * xhat, xhat = (x - mean) *
 * invstd in float as on the CPU. */
__global__ static void bn_bwd_sums_kernel(struct bn_plan p, const float *x, const float *dy,
                                          const float *mean, const float *invstd, double *pdy,
                                          double *pdyx)
{
    __shared__ double sh[32];
    int64_t c = blockIdx.x, k = blockIdx.y;
    int64_t j0 = k * p.l, j1 = j0 + p.l < p.count ? j0 + p.l : p.count;
    float m = mean[c], is = invstd[c];
    double s = 0, sx = 0;
    BN_CHUNK_LOOP(p, c, j0, j1, off, {
        float g = dy[off];
        s = DADD(s, (double)g);
        sx = DADD(sx, DMUL((double)g, (double)FMUL(FSUB(x[off], m), is)));
    });
    s = gp_dev_block_sum(s, sh);
    sx = gp_dev_block_sum(sx, sh);
    if (threadIdx.x == 0) pdy[c * p.p + k] = s, pdyx[c * p.p + k] = sx;
}

struct bn_grads {
    const float *scale, *invstd;
    const float *d_rmean, *d_rvar, *d_mean, *d_var;
    float *dscale, *dbias;
    double *coef; /* [5 C]: a, mdy, mdyx, cm, cv per channel */
};

/* One thread per channel: the parameter gradients and dx's coefficients. */
__global__ static void bn_bwd_finish_kernel(struct bn_plan p, bool have_dy, const double *pdy,
                                            const double *pdyx, struct bn_grads g)
{
    GP_GRID_STRIDE(c, p.c) {
        double sum_dy = 0, sum_dy_xhat = 0;
        if (have_dy)
            for (int64_t k = 0; k < p.p; k++) {
                sum_dy = DADD(sum_dy, pdy[c * p.p + k]);
                sum_dy_xhat = DADD(sum_dy_xhat, pdyx[c * p.p + k]);
            }
        if (g.dscale) g.dscale[c] = FADD(g.dscale[c], (float)sum_dy_xhat);
        if (g.dbias) g.dbias[c] = FADD(g.dbias[c], (float)sum_dy);
        if (!g.coef) continue;
        double one_m = DSUB(1.0, p.momentum), count = (double)p.count;
        double g_mean = 0, g_var = 0;
        if (g.d_rmean) g_mean = DADD(g_mean, DMUL(one_m, (double)g.d_rmean[c]));
        if (g.d_mean) g_mean = DADD(g_mean, (double)g.d_mean[c]);
        if (g.d_rvar)
            g_var = DADD(g_var, DMUL(DMUL(one_m, count) / (double)(p.count - 1), (double)g.d_rvar[c]));
        if (g.d_var) g_var = DADD(g_var, (double)g.d_var[c]);
        double *k = g.coef + 5 * c;
        k[0] = DMUL((double)g.scale[c], (double)g.invstd[c]);
        k[1] = sum_dy / count;
        k[2] = sum_dy_xhat / count;
        k[3] = g_mean / count;
        k[4] = DMUL(2.0, g_var) / count;
    }
}

/* Training: dx += a (dy - mdy - xhat mdyx) + cm + cv (x - mean), in
 * double, xc = x - mean in float as on the CPU. */
__global__ static void bn_bwd_dx_train_kernel(struct bn_plan p, const float *x, const float *dy,
                                              const float *mean, const float *invstd,
                                              const double *coef, float *dx)
{
    GP_GRID_STRIDE(i, p.n * p.c * p.s) {
        int64_t c = chan_of(i, p.s, p.c);
        const double *k = coef + 5 * c;
        double xc = (double)FSUB(x[i], mean[c]), xhat = DMUL(xc, (double)invstd[c]);
        double g = dy ? (double)dy[i] : 0.0;
        double v = DMUL(k[0], DSUB(DSUB(g, k[1]), DMUL(xhat, k[2])));
        v = DADD(DADD(v, k[3]), DMUL(k[4], xc));
        dx[i] = FADD(dx[i], (float)v);
    }
}

/* Evaluation: dx += dy * (scale * invstd). */
__global__ static void bn_bwd_dx_eval_kernel(struct bn_plan p, const float *dy, const float *scale,
                                             const float *invstd, float *dx)
{
    GP_GRID_STRIDE(i, p.n * p.c * p.s) {
        int64_t c = chan_of(i, p.s, p.c);
        dx[i] = FADD(dx[i], FMUL(dy[i], FMUL(scale[c], invstd[c])));
    }
}

/* dY (and the gradients of the optional [C] outputs) -> dX, dscale, dB, as
 * on the CPU: in training the batch statistics depend on X,
 *   dx = scale invstd (dy - sum(dy) / count - xhat sum(dy xhat) / count)
 * plus what flows back through the statistics' outputs; in evaluation
 * dx = dy scale invstd. */
static gp_status bn_backward(struct gp_cuda_ctx *ctx, struct gp_error *err)
{
    for (int i = 0; i < 5; i++) GP_TRY(gp_cuda_want_f32(ctx, i, err));
    struct bn_plan p;
    bn_plan_of(ctx->graph, ctx->node, &p);
    if (p.c == 0) return GP_OK;
    const float *x = (const float *)ctx->in[0], *dy = ctx->dout[0];
    const float *mean = (const float *)ctx->saved, *invstd = mean + p.c;
    float *dx = ctx->din[0];
    double *pdy = (double *)ctx->scratch, *pdyx = pdy + p.c * p.p, *coef = pdyx + p.c * p.p;
    bool have_dy = dy && p.count > 0;
    if (have_dy && (ctx->din[1] || ctx->din[2] || (dx && ctx->training))) {
        dim3 grid((unsigned)p.c, (unsigned)p.p, 1);
        bn_bwd_sums_kernel<<<grid, BN_THREADS, 0, ctx->stream>>>(p, x, dy, mean, invstd, pdy, pdyx);
        GP_TRY(gp_cuda_check_launch(ctx, "BatchNormalization backward sums", err));
    } else {
        have_dy = false;
    }
    struct bn_grads g;
    g.scale = (const float *)ctx->in[1];
    g.invstd = invstd;
    g.d_rmean = opt_dout(ctx, 1);
    g.d_rvar = opt_dout(ctx, 2);
    g.d_mean = opt_dout(ctx, 3);
    g.d_var = opt_dout(ctx, 4);
    g.dscale = ctx->din[1];
    g.dbias = ctx->din[2];
    g.coef = dx && ctx->training ? coef : NULL;
    if (g.dscale || g.dbias || g.coef) {
        bn_bwd_finish_kernel<<<gp_cuda_blocks_for(p.c), GP_CUDA_THREADS, 0, ctx->stream>>>(
            p, have_dy, pdy, pdyx, g);
        GP_TRY(gp_cuda_check_launch(ctx, "BatchNormalization backward statistics", err));
    }
    int64_t n = p.n * p.c * p.s;
    if (!dx || n == 0) return GP_OK;
    if (ctx->training) {
        bn_bwd_dx_train_kernel<<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, ctx->stream>>>(
            p, x, dy, mean, invstd, coef, dx);
    } else {
        if (!dy) return GP_OK;
        bn_bwd_dx_eval_kernel<<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, ctx->stream>>>(
            p, dy, g.scale, invstd, dx);
    }
    return gp_cuda_check_launch(ctx, "BatchNormalization backward dx", err);
}

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

/* Threads per block for rows / planes of `len` values (a multiple of 32). */
static unsigned row_threads(int64_t len)
{
    return len <= 64 ? 32 : len <= 512 ? 128 : len <= 4096 ? 256 : 512;
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

/* Mean and biased variance of v [n] by the block, two passes in double
 * (the CPU's moments()); every thread gets both. */
__device__ static void block_moments(const float *v, int64_t n, double *sh, double *mean, double *var)
{
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s = DADD(s, (double)v[i]);
    s = gp_dev_block_sum(s, sh);
    double m = n > 0 ? s / (double)n : 0.0;
    double q = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        double d = DSUB((double)v[i], m);
        q = DADD(q, DMUL(d, d));
    }
    q = gp_dev_block_sum(q, sh);
    *mean = m;
    *var = n > 0 ? q / (double)n : 0.0;
}

__global__ static void in_forward_kernel(struct in_plan p, const float *x, const float *scale,
                                         const float *bias, float *y, float *mean, float *invstd)
{
    __shared__ double sh[32];
    for (int64_t pl = blockIdx.x; pl < p.n * p.c; pl += gridDim.x) {
        const float *xs = x + pl * p.s;
        float *ys = y + pl * p.s;
        double m, var;
        block_moments(xs, p.s, sh, &m, &var);
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
    in_forward_kernel<<<gp_cuda_capped_grid(p.n * p.c, 1 << 20), row_threads(p.s), 0, ctx->stream>>>(
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
    in_bwd_plane_kernel<<<gp_cuda_capped_grid(p.n * p.c, 1 << 20), row_threads(p.s), 0, ctx->stream>>>(
        p, (const float *)ctx->in[0], (const float *)ctx->in[1], dy, mean, invstd, sums, dx);
    GP_TRY(gp_cuda_check_launch(ctx, "InstanceNormalization backward", err));
    if (!dscale && !dbias) return GP_OK;
    in_bwd_params_kernel<<<gp_cuda_blocks_for(p.c), GP_CUDA_THREADS, 0, ctx->stream>>>(p, sums, dscale,
                                                                                      dbias);
    return gp_cuda_check_launch(ctx, "InstanceNormalization parameter gradients", err);
}

/* ---- LayerNormalization ---- */

/* X viewed as [rows, cols]: cols = the normalized axes. Scale and B
 * broadcast to the normalized shape; `full` when one has an entry per
 * column (indexed by column then), as on the CPU. */
struct ln_plan {
    int64_t rows, cols;
    double eps;
    int rank;
    int64_t dims[GP_MAX_RANK];                          /* normalized shape */
    int64_t sstride[GP_MAX_RANK], bstride[GP_MAX_RANK]; /* Scale's, B's strides over it */
    bool sfull, bfull;
    int64_t chunks; /* row chunks of the parameter-gradient partial sums */
    /* Rows of at most LN_REG_COLS (backward: LN_REG_BWD_COLS): a block
     * keeps its row in registers (reg_threads threads, LN_VPT values each)
     * and backward adds the parameter gradients' terms of its rows
     * (blocks: reg_blocks) in registers too. */
    bool reg, reg_bwd;
    int reg_threads;
    int64_t reg_blocks;
};

static bool ln_strides(const struct gp_value *v, const struct ln_plan *p, int64_t *st)
{
    for (int i = 0; i < GP_MAX_RANK; i++) st[i] = 0;
    if (!v) return true;
    int64_t acc = 1;
    for (int i = p->rank - 1; i >= 0; i--) {
        int j = v->shape.rank - (p->rank - i);
        int64_t d = j >= 0 ? v->shape.dims[j] : 1;
        st[i] = d == 1 ? 0 : acc;
        acc *= d;
    }
    return gp_shape_numel(&v->shape) == p->cols;
}

#define LN_TILE_COLS 32
#define LN_TILE_ROWS 8
#define LN_CHUNK_ROWS 32
#define LN_MAX_CHUNKS 128
#define LN_MAX_PARTIALS (4 << 20) /* doubles of partials at most (32 MiB) */
#define LN_VPT 8                  /* values per thread of a row kept in registers */
#define LN_REG_COLS 4096          /* rows up to this length: in registers */
#define LN_REG_BWD_COLS 2048      /* backward (512 threads of 118 registers ran slower) */
#define LN_REG_BLOCKS 1024        /* blocks of the register backward (fixed: partials) */
#define LN_FIN_LANES 32           /* partials each column's final sum splits over */

static void ln_plan_of(const struct gp_graph *g, const struct gp_node *node, struct ln_plan *p)
{
    memset(p, 0, sizeof *p);
    const struct gp_shape *x = &gp_node_input(g, node, 0)->shape;
    int64_t axis = gp_node_attr_int(node, "axis", -1);
    int ax = (int)(axis < 0 ? axis + x->rank : axis);
    p->rank = x->rank - ax;
    p->rows = p->cols = 1;
    for (int i = 0; i < ax; i++) p->rows *= x->dims[i];
    for (int i = ax; i < x->rank; i++) {
        p->dims[i - ax] = x->dims[i];
        p->cols *= x->dims[i];
    }
    p->eps = gp_node_attr_float(node, "epsilon", 1e-5f);
    p->sfull = ln_strides(gp_node_input(g, node, 1), p, p->sstride);
    p->bfull = ln_strides(node->n_inputs > 2 ? gp_node_input(g, node, 2) : NULL, p, p->bstride);
    int64_t ch = (p->rows + LN_CHUNK_ROWS - 1) / LN_CHUNK_ROWS;
    if (ch > LN_MAX_CHUNKS) ch = LN_MAX_CHUNKS;
    while (ch > 1 && 2 * ch * p->cols > LN_MAX_PARTIALS) ch /= 2;
    p->chunks = ch < 1 ? 1 : ch;
    p->reg = p->cols <= LN_REG_COLS;
    p->reg_bwd = p->cols <= LN_REG_BWD_COLS;
    p->reg_threads = p->cols <= 256 ? 32 : p->cols <= 1024 ? 128 : p->cols <= 2048 ? 256 : 512;
    p->reg_blocks = p->rows < LN_REG_BLOCKS ? (p->rows < 1 ? 1 : p->rows) : LN_REG_BLOCKS;
}

/* Offset into a broadcast parameter of column j. */
__device__ static inline int64_t ln_index(const struct ln_plan &p, const int64_t *st, bool full,
                                          int64_t j)
{
    if (full) return j;
    int64_t off = 0;
    for (int i = p.rank - 1; i >= 0; i--) {
        off += (j % p.dims[i]) * st[i];
        j /= p.dims[i];
    }
    return off;
}

/* ctx->saved: mean [rows] and inverse standard deviation [rows] (float). */
static size_t ln_saved(const struct gp_graph *g, const struct gp_node *node)
{
    struct ln_plan p;
    ln_plan_of(g, node, &p);
    return 2 * sizeof(float) * (size_t)p.rows;
}

/* Scratch: the parameter gradients' partial sums, [chunks, cols] twice
 * (or [reg_blocks, cols] twice on the register path). */
static size_t ln_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    struct ln_plan p;
    ln_plan_of(g, node, &p);
    return 2 * sizeof(double) * (size_t)((p.reg_bwd ? p.reg_blocks : p.chunks) * p.cols);
}

/* Rows of at most LN_REG_COLS: the row is read once into registers (thread
 * t holds columns t, t + blockDim, ...: the order block_moments sums in,
 * so the statistics are the same as the generic kernel's). */
__global__ static void ln_forward_reg_kernel(struct ln_plan p, const float *x, const float *scale,
                                             const float *bias, float *y, float *mean, float *invstd,
                                             float *out_mean, float *out_inv)
{
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
        const float *xs = x + r * p.cols;
        float *ys = y + r * p.cols;
        float v[LN_VPT];
        double s = 0;
#pragma unroll
        for (int k = 0; k < LN_VPT; k++) {
            int64_t j = threadIdx.x + (int64_t)k * blockDim.x;
            v[k] = j < p.cols ? xs[j] : 0.0f;
            if (j < p.cols) s = DADD(s, (double)v[k]);
        }
        s = gp_dev_block_sum(s, sh);
        double m = s / (double)p.cols, q = 0;
#pragma unroll
        for (int k = 0; k < LN_VPT; k++) {
            int64_t j = threadIdx.x + (int64_t)k * blockDim.x;
            if (j < p.cols) {
                double d = DSUB((double)v[k], m);
                q = DADD(q, DMUL(d, d));
            }
        }
        q = gp_dev_block_sum(q, sh);
        double var = q / (double)p.cols;
        float mr = (float)m, is = (float)(1.0 / sqrt(DADD(var, p.eps)));
        if (threadIdx.x == 0) {
            mean[r] = mr;
            invstd[r] = is;
            if (out_mean) out_mean[r] = mr;
            if (out_inv) out_inv[r] = is;
        }
#pragma unroll
        for (int k = 0; k < LN_VPT; k++) {
            int64_t j = threadIdx.x + (int64_t)k * blockDim.x;
            if (j < p.cols) {
                float o = FMUL(FMUL(FSUB(v[k], mr), is), scale[ln_index(p, p.sstride, p.sfull, j)]);
                ys[j] = bias ? FADD(o, bias[ln_index(p, p.bstride, p.bfull, j)]) : o;
            }
        }
    }
}

__global__ static void ln_forward_kernel(struct ln_plan p, const float *x, const float *scale,
                                         const float *bias, float *y, float *mean, float *invstd,
                                         float *out_mean, float *out_inv)
{
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
        const float *xs = x + r * p.cols;
        float *ys = y + r * p.cols;
        double m, var;
        block_moments(xs, p.cols, sh, &m, &var);
        float mr = (float)m, is = (float)(1.0 / sqrt(DADD(var, p.eps)));
        if (threadIdx.x == 0) {
            mean[r] = mr;
            invstd[r] = is;
            if (out_mean) out_mean[r] = mr;
            if (out_inv) out_inv[r] = is;
        }
        for (int64_t j = threadIdx.x; j < p.cols; j += blockDim.x) {
            float v = FMUL(FMUL(FSUB(xs[j], mr), is), scale[ln_index(p, p.sstride, p.sfull, j)]);
            ys[j] = bias ? FADD(v, bias[ln_index(p, p.bstride, p.bfull, j)]) : v;
        }
    }
}

/* X, Scale, optional B -> Y like X; optional Mean and InvStdDev per row. */
static gp_status ln_forward(struct gp_cuda_ctx *ctx, struct gp_error *err)
{
    for (int i = 0; i < ctx->node->n_inputs && i < 3; i++) GP_TRY(gp_cuda_want_f32(ctx, i, err));
    struct ln_plan p;
    ln_plan_of(ctx->graph, ctx->node, &p);
    if (p.rows == 0) return GP_OK;
    float *mean = (float *)ctx->saved, *invstd = mean + p.rows;
    const float *bias = ctx->node->n_inputs > 2 ? (const float *)ctx->in[2] : NULL;
    if (p.reg)
        ln_forward_reg_kernel<<<gp_cuda_capped_grid(p.rows, 1 << 20), p.reg_threads, 0, ctx->stream>>>(
            p, (const float *)ctx->in[0], (const float *)ctx->in[1], bias, (float *)ctx->out[0], mean,
            invstd, opt_out(ctx, 1), opt_out(ctx, 2));
    else
        ln_forward_kernel<<<gp_cuda_capped_grid(p.rows, 1 << 20), row_threads(p.cols), 0, ctx->stream>>>(
            p, (const float *)ctx->in[0], (const float *)ctx->in[1], bias, (float *)ctx->out[0], mean,
            invstd, opt_out(ctx, 1), opt_out(ctx, 2));
    return gp_cuda_check_launch(ctx, "LayerNormalization forward", err);
}

/* One block per row: with g = dy * scale (double),
 * dx += invstd (g - mean(g) - xhat mean(g xhat)) + d(Mean) / cols
 *       - d(InvStdDev) invstd^3 (x - mean) / cols. */
__global__ static void ln_bwd_dx_kernel(struct ln_plan p, const float *x, const float *scale,
                                        const float *dy, const float *mean, const float *invstd,
                                        const float *d_mean, const float *d_inv, float *dx)
{
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
        const float *xs = x + r * p.cols, *dys = dy ? dy + r * p.cols : NULL;
        float *dxs = dx + r * p.cols;
        float m = mean[r], is = invstd[r];
        double sg = 0, sgx = 0;
        if (dys) {
            for (int64_t j = threadIdx.x; j < p.cols; j += blockDim.x) {
                double g = DMUL((double)dys[j], (double)scale[ln_index(p, p.sstride, p.sfull, j)]);
                sg = DADD(sg, g);
                sgx = DADD(sgx, DMUL(g, (double)FMUL(FSUB(xs[j], m), is)));
            }
            sg = gp_dev_block_sum(sg, sh);
            sgx = gp_dev_block_sum(sgx, sh);
        }
        double n = (double)p.cols, mg = sg / n, mgx = sgx / n;
        double cm = d_mean ? (double)d_mean[r] / n : 0.0;
        double cv = d_inv ? DMUL(DMUL(DMUL(-(double)d_inv[r], (double)is), (double)is), (double)is) / n
                          : 0.0;
        for (int64_t j = threadIdx.x; j < p.cols; j += blockDim.x) {
            double xc = (double)FSUB(xs[j], m), xhat = DMUL(xc, (double)is);
            double v = DADD(cm, DMUL(cv, xc));
            if (dys) {
                double g = DMUL((double)dys[j], (double)scale[ln_index(p, p.sstride, p.sfull, j)]);
                v = DADD(v, DMUL((double)is, DSUB(DSUB(g, mg), DMUL(xhat, mgx))));
            }
            dxs[j] = FADD(dxs[j], (float)v);
        }
    }
}

/* Full parameters: block (column tile, row chunk) sums dy xhat and dy over
 * its rows for 32 columns; threads (tx, ty) take rows ty, ty + 8, ... and
 * the 8 lanes' sums are added in ty order. */
__global__ static void ln_bwd_partial_kernel(struct ln_plan p, const float *x, const float *dy,
                                             const float *mean, const float *invstd, double *pss,
                                             double *psb)
{
    __shared__ double ss_sh[LN_TILE_ROWS][LN_TILE_COLS], sb_sh[LN_TILE_ROWS][LN_TILE_COLS];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t j = blockIdx.x * (int64_t)LN_TILE_COLS + tx, k = blockIdx.y;
    int64_t per = (p.rows + p.chunks - 1) / p.chunks;
    int64_t r0 = k * per, r1 = r0 + per < p.rows ? r0 + per : p.rows;
    double ss = 0, sb = 0;
    if (j < p.cols)
        for (int64_t r = r0 + ty; r < r1; r += LN_TILE_ROWS) {
            float g = dy[r * p.cols + j];
            float xhat = FMUL(FSUB(x[r * p.cols + j], mean[r]), invstd[r]);
            ss = DADD(ss, DMUL((double)g, (double)xhat));
            sb = DADD(sb, (double)g);
        }
    ss_sh[ty][tx] = ss;
    sb_sh[ty][tx] = sb;
    __syncthreads();
    if (ty == 0 && j < p.cols) {
        for (int t = 1; t < LN_TILE_ROWS; t++) {
            ss = DADD(ss, ss_sh[t][tx]);
            sb = DADD(sb, sb_sh[t][tx]);
        }
        pss[k * p.cols + j] = ss;
        psb[k * p.cols + j] = sb;
    }
}

/* One thread per column: the chunks' partials in chunk order. */
__global__ static void ln_bwd_params_kernel(struct ln_plan p, const double *pss, const double *psb,
                                            float *dscale, float *dbias)
{
    GP_GRID_STRIDE(j, p.cols) {
        double ss = 0, sb = 0;
        for (int64_t k = 0; k < p.chunks; k++) {
            ss = DADD(ss, pss[k * p.cols + j]);
            sb = DADD(sb, psb[k * p.cols + j]);
        }
        if (dscale) dscale[j] = FADD(dscale[j], (float)ss);
        if (dbias) dbias[j] = FADD(dbias[j], (float)sb);
    }
}

/* Broadcast parameters (the CPU's single-threaded path): float sums
 * straight into the gradient, in row-major (row, column) order. One thread
 * per parameter entry walks its columns in increasing order, which is the
 * order the CPU adds that entry's terms in, so the sums are the CPU's bit
 * for bit. is_scale: dScale (terms dy xhat) else dB (terms dy). */
__global__ static void ln_bwd_bcast_kernel(struct ln_plan p, bool is_scale, int64_t entries,
                                           const float *x, const float *dy, const float *mean,
                                           const float *invstd, float *dparam)
{
    const int64_t *st = is_scale ? p.sstride : p.bstride;
    bool full = is_scale ? p.sfull : p.bfull;
    GP_GRID_STRIDE(e, entries) {
        /* The entry's fixed coordinates and the column of the first one. */
        int64_t cst[GP_MAX_RANK], base = 0, acc = 1;
        for (int i = p.rank - 1; i >= 0; i--) {
            cst[i] = acc;
            acc *= p.dims[i];
        }
        int free_ax[GP_MAX_RANK], nf = 0;
        if (full) {
            base = e;
        } else {
            for (int i = 0; i < p.rank; i++) {
                if (st[i] != 0) base += (e / st[i]) % p.dims[i] * cst[i];
                else if (p.dims[i] > 1) free_ax[nf++] = i;
            }
        }
        float a = dparam[e];
        for (int64_t r = 0; r < p.rows; r++) {
            const float *xs = x + r * p.cols, *dys = dy + r * p.cols;
            float m = mean[r], is = invstd[r];
            int64_t idx[GP_MAX_RANK], j = base;
            for (int q = 0; q < nf; q++) idx[q] = 0;
            for (;;) {
                float term = is_scale ? FMUL(dys[j], FMUL(FSUB(xs[j], m), is)) : dys[j];
                a = FADD(a, term);
                int q = nf - 1;
                for (; q >= 0; q--) {
                    int ax = free_ax[q];
                    j += cst[ax];
                    if (++idx[q] < p.dims[ax]) break;
                    j -= cst[ax] * p.dims[ax];
                    idx[q] = 0;
                }
                if (q < 0) break;
            }
        }
        dparam[e] = a;
    }
}

/* Rows of at most LN_REG_COLS, reg_blocks blocks: each block takes rows
 * blockIdx.x, + gridDim.x, ... with x and dy in registers; dx as
 * ln_bwd_dx_kernel (same terms, same order), and with pss, psb the
 * block's sums of dy xhat and dy per column (its rows in order) into
 * partials [gridDim.x, cols], which ln_bwd_reg_final_kernel adds. */
__global__ static void ln_bwd_reg_kernel(struct ln_plan p, const float *x, const float *scale,
                                         const float *dy, const float *mean, const float *invstd,
                                         const float *d_mean, const float *d_inv, float *dx, double *pss,
                                         double *psb)
{
    __shared__ double sh[32];
    double ss[LN_VPT], sb[LN_VPT];
#pragma unroll
    for (int k = 0; k < LN_VPT; k++) ss[k] = sb[k] = 0;
    for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
        const float *xs = x + r * p.cols;
        float m = mean[r], is = invstd[r];
        float xv[LN_VPT], gv[LN_VPT];
#pragma unroll
        for (int k = 0; k < LN_VPT; k++) {
            int64_t j = threadIdx.x + (int64_t)k * blockDim.x;
            xv[k] = j < p.cols ? xs[j] : 0.0f;
            gv[k] = j < p.cols && dy ? dy[r * p.cols + j] : 0.0f;
        }
        if (dx) {
            double sg = 0, sgx = 0;
            if (dy) {
#pragma unroll
                for (int k = 0; k < LN_VPT; k++) {
                    int64_t j = threadIdx.x + (int64_t)k * blockDim.x;
                    if (j < p.cols) {
                        double g = DMUL((double)gv[k], (double)scale[ln_index(p, p.sstride, p.sfull, j)]);
                        sg = DADD(sg, g);
                        sgx = DADD(sgx, DMUL(g, (double)FMUL(FSUB(xv[k], m), is)));
                    }
                }
                sg = gp_dev_block_sum(sg, sh);
                sgx = gp_dev_block_sum(sgx, sh);
            }
            double n = (double)p.cols, mg = sg / n, mgx = sgx / n;
            double cm = d_mean ? (double)d_mean[r] / n : 0.0;
            double cv = d_inv ? DMUL(DMUL(DMUL(-(double)d_inv[r], (double)is), (double)is), (double)is) / n
                              : 0.0;
            float *dxs = dx + r * p.cols;
#pragma unroll
            for (int k = 0; k < LN_VPT; k++) {
                int64_t j = threadIdx.x + (int64_t)k * blockDim.x;
                if (j < p.cols) {
                    double xc = (double)FSUB(xv[k], m), xhat = DMUL(xc, (double)is);
                    double v = DADD(cm, DMUL(cv, xc));
                    if (dy) {
                        double g = DMUL((double)gv[k], (double)scale[ln_index(p, p.sstride, p.sfull, j)]);
                        v = DADD(v, DMUL((double)is, DSUB(DSUB(g, mg), DMUL(xhat, mgx))));
                    }
                    dxs[j] = FADD(dxs[j], (float)v);
                }
            }
        }
        if (pss) {
#pragma unroll
            for (int k = 0; k < LN_VPT; k++) {
                ss[k] = DADD(ss[k], DMUL((double)gv[k], (double)FMUL(FSUB(xv[k], m), is)));
                sb[k] = DADD(sb[k], (double)gv[k]);
            }
        }
    }
    if (pss) {
#pragma unroll
        for (int k = 0; k < LN_VPT; k++) {
            int64_t j = threadIdx.x + (int64_t)k * blockDim.x;
            if (j < p.cols) {
                pss[blockIdx.x * p.cols + j] = ss[k];
                psb[blockIdx.x * p.cols + j] = sb[k];
            }
        }
    }
}

/* Per column, the reg_blocks partials: threads (tx, ty) of a 32 x 32
 * block add partials ty, ty + 32, ... of column tx; the 32 sums are added
 * in ty order. */
__global__ static void ln_bwd_reg_final_kernel(struct ln_plan p, const double *pss, const double *psb,
                                               float *dscale, float *dbias)
{
    __shared__ double ss_sh[LN_FIN_LANES][LN_TILE_COLS + 1], sb_sh[LN_FIN_LANES][LN_TILE_COLS + 1];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t j = blockIdx.x * (int64_t)LN_TILE_COLS + tx;
    double ss = 0, sb = 0;
    if (j < p.cols)
        for (int64_t k = ty; k < p.reg_blocks; k += LN_FIN_LANES) {
            ss = DADD(ss, pss[k * p.cols + j]);
            sb = DADD(sb, psb[k * p.cols + j]);
        }
    ss_sh[ty][tx] = ss;
    sb_sh[ty][tx] = sb;
    __syncthreads();
    if (ty == 0 && j < p.cols) {
        for (int t = 1; t < LN_FIN_LANES; t++) {
            ss = DADD(ss, ss_sh[t][tx]);
            sb = DADD(sb, sb_sh[t][tx]);
        }
        if (dscale) dscale[j] = FADD(dscale[j], (float)ss);
        if (dbias) dbias[j] = FADD(dbias[j], (float)sb);
    }
}

static gp_status ln_backward(struct gp_cuda_ctx *ctx, struct gp_error *err)
{
    for (int i = 0; i < ctx->node->n_inputs && i < 3; i++) GP_TRY(gp_cuda_want_f32(ctx, i, err));
    struct ln_plan p;
    ln_plan_of(ctx->graph, ctx->node, &p);
    if (p.rows == 0 || p.cols == 0) return GP_OK;
    const float *x = (const float *)ctx->in[0], *scale = (const float *)ctx->in[1];
    const float *dy = ctx->dout[0];
    const float *mean = (const float *)ctx->saved, *invstd = mean + p.rows;
    float *dx = ctx->din[0], *dscale = ctx->din[1];
    float *dbias = ctx->node->n_inputs > 2 ? ctx->din[2] : NULL;
    const float *d_mean = opt_dout(ctx, 1), *d_inv = opt_dout(ctx, 2);
    bool params = dy && (dscale || dbias);
    if (p.reg_bwd && (dx || (params && p.sfull && p.bfull))) {
        bool fused = params && p.sfull && p.bfull;
        double *pss = fused ? (double *)ctx->scratch : NULL;
        double *psb = fused ? pss + p.reg_blocks * p.cols : NULL;
        unsigned grid = fused ? (unsigned)p.reg_blocks : gp_cuda_capped_grid(p.rows, 1 << 20);
        ln_bwd_reg_kernel<<<grid, p.reg_threads, 0, ctx->stream>>>(p, x, scale, dy, mean, invstd, d_mean,
                                                                   d_inv, dx, pss, psb);
        GP_TRY(gp_cuda_check_launch(ctx, "LayerNormalization backward", err));
        if (fused) {
            dim3 fgrid((unsigned)((p.cols + LN_TILE_COLS - 1) / LN_TILE_COLS), 1, 1);
            ln_bwd_reg_final_kernel<<<fgrid, dim3(LN_TILE_COLS, LN_FIN_LANES, 1), 0, ctx->stream>>>(
                p, pss, psb, dscale, dbias);
            return gp_cuda_check_launch(ctx, "LayerNormalization parameter gradients", err);
        }
        dx = NULL; /* done */
    }
    if (dx) {
        ln_bwd_dx_kernel<<<gp_cuda_capped_grid(p.rows, 1 << 20), row_threads(p.cols), 0, ctx->stream>>>(
            p, x, scale, dy, mean, invstd, d_mean, d_inv, dx);
        GP_TRY(gp_cuda_check_launch(ctx, "LayerNormalization backward dx", err));
    }
    if (!dy || (!dscale && !dbias)) return GP_OK;
    if (p.sfull && p.bfull) {
        double *pss = (double *)ctx->scratch, *psb = pss + p.chunks * p.cols;
        dim3 grid((unsigned)((p.cols + LN_TILE_COLS - 1) / LN_TILE_COLS), (unsigned)p.chunks, 1);
        ln_bwd_partial_kernel<<<grid, dim3(LN_TILE_COLS, LN_TILE_ROWS, 1), 0, ctx->stream>>>(
            p, x, dy, mean, invstd, pss, psb);
        GP_TRY(gp_cuda_check_launch(ctx, "LayerNormalization backward partial sums", err));
        ln_bwd_params_kernel<<<gp_cuda_blocks_for(p.cols), GP_CUDA_THREADS, 0, ctx->stream>>>(
            p, pss, psb, dscale, dbias);
        return gp_cuda_check_launch(ctx, "LayerNormalization parameter gradients", err);
    }
    for (int t = 0; t < 2; t++) {
        float *dparam = t == 0 ? dscale : dbias;
        if (!dparam) continue;
        int64_t entries = gp_shape_numel(&gp_cuda_in_value(ctx, t == 0 ? 1 : 2)->shape);
        if (entries == 0) continue;
        ln_bwd_bcast_kernel<<<gp_cuda_blocks_for(entries), GP_CUDA_THREADS, 0, ctx->stream>>>(
            p, t == 0, entries, x, dy, mean, invstd, dparam);
        GP_TRY(gp_cuda_check_launch(ctx, t == 0 ? "LayerNormalization scale gradient (broadcast)"
                                                : "LayerNormalization bias gradient (broadcast)",
                                    err));
    }
    return GP_OK;
}

/* ---- the table ---- */

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_norm[] = {
    {"BatchNormalization", bn_saved, bn_scratch, bn_forward, bn_backward},
    {"InstanceNormalization", in_saved, in_scratch, in_forward, in_backward},
    {"LayerNormalization", ln_saved, ln_scratch, ln_forward, ln_backward},
    {NULL, NULL, NULL, NULL, NULL},
};
