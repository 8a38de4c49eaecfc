/* CPU kernels: BatchNormalization, forward and backward, with PyTorch's
 * formulas: biased variance, epsilon inside the square root,
 * y = (x - mean) * invstd * scale + bias. Also the deferred update of its
 * running statistics (gp_cpu_bn_stats_len, gp_cpu_bn_commit).
 *
 * A fused Relu (gp_node.fused_relu, graph/fuse.c): y = Relu's max(y, 0),
 * and the backward masks dY where that output is not positive, which is
 * where Relu's input was not: the unfused pair's results, bit for bit.
 * A fused residual Add (gp_node.fused_add): r (input 5) is added before
 * the Relu to the normalized value as stored (rounded to bfloat16 where
 * the output is bfloat16), and r's gradient is the masked dY: the unfused
 * nodes' bits.
 *
 * Statistics and parameter gradients are sums over many elements: each is
 * accumulated in double by one thread, in a fixed order, and added to its
 * gradient buffer once. The parallel loops split channels, so results do
 * not depend on the thread count. */
#include <math.h>
#include <string.h>

#include "backend/cpu/kernel_util.h"

/* ---- BatchNormalization ---- */

/* X [N, C, D...] (no spatial axes allowed): statistics per channel over N
 * and the spatial axes. */
struct bn_plan {
    int64_t n, c, s;   /* batch, channels, spatial cells per plane */
    int64_t count;     /* N * S: values per channel */
    double eps, momentum;
    int version;
};

static void bn_plan(const struct gp_cpu_ctx *ctx, struct bn_plan *p)
{
    const struct gp_shape *x = &gp_cpu_in_value(ctx, 0)->shape;
    p->n = x->dims[0];
    p->c = x->dims[1];
    p->s = 1;
    for (int i = 2; i < x->rank; i++) p->s *= x->dims[i];
    p->count = p->n * p->s;
    p->eps = gp_node_attr_float(ctx->node, "epsilon", 1e-5f);
    p->momentum = gp_node_attr_float(ctx->node, "momentum", 0.9f);
    p->version = ctx->node->def ? ctx->node->def->since_version : 15;
}

/* ctx->saved: the mean [C] and inverse standard deviation [C] that
 * normalized the forward (the batch's in training, the running ones in
 * evaluation). */
static size_t bn_saved(const struct gp_graph *g, const struct gp_node *node)
{
    return 2 * sizeof(real) * (size_t)gp_node_input(g, node, 0)->shape.dims[1];
}

/* A fused residual Add (gp_node.fused_add): r, input 5, and whether the
 * normalized value is rounded to bfloat16 before r is added (the output is
 * stored so: the unfused BatchNorm's output was, and the Add read it). */
struct bn_residual {
    const real *r;
    bool round_bf16;
};

static struct bn_residual bn_residual_of(const struct gp_cpu_ctx *ctx)
{
    struct bn_residual res = {NULL, false};
    if (!ctx->node->fused_add) return res;
    res.r = ctx->in[5];
    res.round_bf16 = ctx->stored_out_dt && ctx->stored_out_dt[0] == GP_DTYPE_BFLOAT16;
    return res;
}

/* PyTorch's transform, x alpha + beta: one function for the forward and
 * for the backward's Relu mask (bn_stored_positive), so that both compute
 * the same numbers. alpha = invstd scale, beta = bias - mean alpha. */
static inline real bn_affine(real x, real alpha, real beta) { return x * alpha + beta; }

static inline void bn_alpha_beta(real invstd, real scale, real bias, real mean, real *alpha, real *beta)
{
    *alpha = invstd * scale;
    *beta = bias - mean * *alpha;
}

/* Whether Relu(t), stored as the output is (rounded to bfloat16 when
 * `bf16`), is > 0: the fused Relu's mask, where its output was positive,
 * told without the output. A positive t below bfloat16's least subnormal
 * rounds to 0; NaN fails. */
static inline bool bn_stored_positive(real t, bool bf16)
{
    return bf16 ? gp_bf16_to_float(gp_float_to_bf16((float)t)) > 0 : t > 0;
}

/* Channel c of y = x * alpha + beta (bn_affine), plus a fused residual
 * (the Add's float32 sum of the two stored operands), then a fused Relu by
 * Relu's own formula (NaN passes). */
static void bn_normalize_channel(const struct bn_plan *p, int64_t c, const real *x, real *y, real alpha, real beta,
                                 struct bn_residual res, bool relu)
{
    for (int64_t n = 0; n < p->n; n++) {
        const real *xs = x + (n * p->c + c) * p->s;
        real *ys = y + (n * p->c + c) * p->s;
        for (int64_t i = 0; i < p->s; i++) ys[i] = bn_affine(xs[i], alpha, beta);
        if (res.r) {
            const real *rs = res.r + (n * p->c + c) * p->s;
            for (int64_t i = 0; i < p->s; i++) {
                real t = res.round_bf16 ? (real)gp_bf16_to_float(gp_float_to_bf16((float)ys[i])) : ys[i];
                ys[i] = t + rs[i];
            }
        }
        if (relu)
            for (int64_t i = 0; i < p->s; i++) ys[i] = ys[i] > 0 || ys[i] != ys[i] ? ys[i] : 0;
    }
}

/* Y again (gp_cpu_ctx.remake) from the mean and inverse standard deviation
 * the forward saved, which it normalized with: the same transform on the
 * same numbers, so the same bits. */
static gp_status bn_remake(struct gp_cpu_ctx *ctx)
{
    struct bn_plan p;
    bn_plan(ctx, &p);
    const real *x = ctx->in[0], *scale = ctx->in[1], *bias = ctx->in[2];
    const real *mean = ctx->saved, *invstd = mean + p.c;
    real *y = ctx->out[0];
#pragma omp parallel for if (p.n * p.c * p.s > GP_CPU_PAR_MIN)
    for (int64_t c = 0; c < p.c; c++) {
        real alpha, beta;
        bn_alpha_beta(invstd[c], scale[c], bias[c], mean[c], &alpha, &beta);
        bn_normalize_channel(&p, c, x, y, alpha, beta, bn_residual_of(ctx), ctx->node->fused_relu);
    }
    return GP_OK;
}

/* Inputs X [N, C, D...], scale [C], B [C], mean [C], var [C] -> Y like X.
 * Optional outputs, all [C]: running mean and running var as updated by
 * this batch (every version), and in opsets 7 and 9 the batch's mean and
 * biased variance. Training uses the batch's statistics and, when
 * ctx->update_state, updates mean and var IN PLACE as PyTorch does:
 * running = momentum * running + (1 - momentum) * batch, with ONNX's
 * momentum (PyTorch's 1 - momentum) and the unbiased batch variance for the
 * running variance. Evaluation uses the running statistics. */
static gp_status bn_forward(struct gp_cpu_ctx *ctx, struct gp_error *err)
{
    if (ctx->remake) return bn_remake(ctx);
    struct bn_plan p;
    bn_plan(ctx, &p);
    const real *x = ctx->in[0], *scale = ctx->in[1], *bias = ctx->in[2];
    real *rmean = ctx->in[3], *rvar = ctx->in[4], *y = ctx->out[0];
    real *out_rmean = ctx->node->n_outputs > 1 ? ctx->out[1] : NULL;
    real *out_rvar = ctx->node->n_outputs > 2 ? ctx->out[2] : NULL;
    real *out_mean = ctx->node->n_outputs > 3 ? ctx->out[3] : NULL;
    real *out_var = ctx->node->n_outputs > 4 ? ctx->out[4] : NULL;
    real *mean = ctx->saved, *invstd = mean + p.c;
    if (ctx->training && p.count < 2)
        return gp_cpu_error(ctx, err, GP_ERR_SHAPE,
                            "training needs more than one value per channel to estimate the "
                            "variance (input [%lld, %lld, ...]; PyTorch refuses this too)",
                            (long long)p.n, (long long)p.c);
    bool training = ctx->training, update = ctx->training && ctx->update_state;
    bool relu = ctx->node->fused_relu;
    struct bn_residual res = bn_residual_of(ctx);
#pragma omp parallel for if (p.n * p.c * p.s > GP_CPU_PAR_MIN)
    for (int64_t c = 0; c < p.c; c++) {
        double m, var;
        if (training) {
            double sum = 0, sq = 0;
            for (int64_t n = 0; n < p.n; n++)
                for (int64_t i = 0; i < p.s; i++) sum += x[(n * p.c + c) * p.s + i];
            m = sum / (double)p.count;
            for (int64_t n = 0; n < p.n; n++)
                for (int64_t i = 0; i < p.s; i++) {
                    double d = x[(n * p.c + c) * p.s + i] - m;
                    sq += d * d;
                }
            var = sq / (double)p.count;
        } else {
            m = rmean[c];
            var = rvar[c];
        }
        real is = (real)(1.0 / sqrt(var + p.eps));
        mean[c] = (real)m;
        invstd[c] = is;
        real alpha, beta;
        bn_alpha_beta(is, scale[c], bias[c], mean[c], &alpha, &beta);
        bn_normalize_channel(&p, c, x, y, alpha, beta, res, relu);
        real new_mean = rmean[c], new_var = rvar[c];
        if (training) {
            double unbiased = var * (double)p.count / (double)(p.count - 1);
            new_mean = (real)(p.momentum * rmean[c] + (1 - p.momentum) * m);
            new_var = (real)(p.momentum * rvar[c] + (1 - p.momentum) * unbiased);
        }
        if (out_rmean) out_rmean[c] = new_mean;
        if (out_rvar) out_rvar[c] = new_var;
        if (out_mean) out_mean[c] = (real)m;
        if (out_var) out_var[c] = (real)var;
        if (update && ctx->deferred_stats) {
            double sum = 0, sumsq = 0;
            for (int64_t n = 0; n < p.n; n++)
                for (int64_t i = 0; i < p.s; i++) {
                    double v = x[(n * p.c + c) * p.s + i];
                    sum += v;
                    sumsq += v * v;
                }
            ctx->deferred_stats[c] += sum;
            ctx->deferred_stats[p.c + c] += sumsq;
        } else if (update) {
            rmean[c] = new_mean;
            rvar[c] = new_var;
        }
    }
    if (update && ctx->deferred_stats) ctx->deferred_stats[2 * p.c] += (double)p.count;
    return GP_OK;
}

size_t GP_CPU(gp_cpu_bn_stats_len)(const struct gp_graph *g, const struct gp_node *node)
{
    return 2 * (size_t)gp_node_input(g, node, 0)->shape.dims[1] + 1;
}

void GP_CPU(gp_cpu_bn_commit)(const struct gp_graph *g, const struct gp_node *node, real *rmean,
                              real *rvar, double *stats)
{
    int64_t c_n = gp_node_input(g, node, 0)->shape.dims[1];
    double count = stats[2 * c_n];
    double momentum = gp_node_attr_float(node, "momentum", 0.9f);
    if (count >= 2) {
        for (int64_t c = 0; c < c_n; c++) {
            double m = stats[c] / count;
            double var = stats[c_n + c] / count - m * m;
            if (var < 0) var = 0;
            double unbiased = var * count / (count - 1);
            rmean[c] = (real)(momentum * rmean[c] + (1 - momentum) * m);
            rvar[c] = (real)(momentum * rvar[c] + (1 - momentum) * unbiased);
        }
    }
    for (int64_t i = 0; i < 2 * c_n + 1; i++) stats[i] = 0;
}

/* dY like X (and the gradients of the optional [C] outputs) -> dX, dscale,
 * dB. In training the batch statistics depend on X: with xhat = (x - mean)
 * * invstd and sums over the channel's count values,
 *   dx = scale * invstd * (dy - sum(dy) / count - xhat * sum(dy xhat) / count)
 * plus what flows back through the statistics' own outputs. In evaluation
 * dx = dy * scale * invstd. */
static gp_status bn_backward(struct gp_cpu_ctx *ctx, struct gp_error *err)
{
    (void)err;
    struct bn_plan p;
    bn_plan(ctx, &p);
    const real *x = ctx->in[0], *scale = ctx->in[1], *bias = ctx->in[2], *dy = ctx->dout[0];
    const real *mean = ctx->saved, *invstd = mean + p.c;
    real *dx = ctx->din[0], *dscale = ctx->din[1], *dbias = ctx->din[2];
    const real *d_rmean = ctx->node->n_outputs > 1 ? ctx->dout[1] : NULL;
    const real *d_rvar = ctx->node->n_outputs > 2 ? ctx->dout[2] : NULL;
    const real *d_mean = ctx->node->n_outputs > 3 ? ctx->dout[3] : NULL;
    const real *d_var = ctx->node->n_outputs > 4 ? ctx->dout[4] : NULL;
    bool training = ctx->training;
    bool ow = gp_cpu_overwrite(ctx, 0); /* dx written whole: 0 + its gradient */
    /* A fused Relu passes dY where its output is > 0 (where Relu's input
     * was), zero elsewhere: Relu's backward, as the unfused pair computes.
     * Without a fused residual that is told from X (bn_stored_positive on
     * the forward's transform: the output need not be kept,
     * ops/backward_reads.c); with one, from the output Y, the sum's sign. */
    const real *y = ctx->node->fused_relu && ctx->node->fused_add ? ctx->out[0] : NULL;
    bool mask_x = ctx->node->fused_relu && !ctx->node->fused_add;
    bool y_bf16 = ctx->stored_out_dt && ctx->stored_out_dt[0] == GP_DTYPE_BFLOAT16;
    /* A fused residual's gradient (input 5) is the (masked) dY, as the Add
     * wrote it: written whole when it is the first to write it. */
    real *dres = ctx->node->fused_add ? ctx->din[5] : NULL;
    bool ow_res = gp_cpu_overwrite(ctx, 5);
#define DY(k)                                                                                      \
    ((y && !(y[k] > 0)) || (mask_x && !bn_stored_positive(bn_affine(x[k], alpha, beta), y_bf16)) ? (real)0 \
                                                                                              : dy[k])
#pragma omp parallel for if (p.n * p.c * p.s > GP_CPU_PAR_MIN)
    for (int64_t c = 0; c < p.c; c++) {
        double sum_dy = 0, sum_dy_xhat = 0;
        real m = mean[c], is = invstd[c], alpha = 0, beta = 0;
        if (mask_x) bn_alpha_beta(is, scale[c], bias[c], m, &alpha, &beta);
        if (dy)
            for (int64_t n = 0; n < p.n; n++)
                for (int64_t i = 0; i < p.s; i++) {
                    int64_t k = (n * p.c + c) * p.s + i;
                    sum_dy += DY(k);
                    sum_dy_xhat += (double)DY(k) * ((x[k] - m) * is);
                }
        if (dres)
            for (int64_t n = 0; n < p.n; n++)
                for (int64_t i = 0; i < p.s; i++) {
                    int64_t k = (n * p.c + c) * p.s + i;
                    real base = ow_res ? 0 : dres[k];
                    dres[k] = dy ? base + DY(k) : base;
                }
        if (dscale) dscale[c] += (real)sum_dy_xhat;
        if (dbias) dbias[c] += (real)sum_dy;
        if (!dx) continue;
        if (!training) {
            real k = scale[c] * is;
            for (int64_t n = 0; n < p.n; n++) {
                int64_t o = (n * p.c + c) * p.s;
                for (int64_t i = 0; i < p.s; i++) {
                    real base = ow ? 0 : dx[o + i];
                    dx[o + i] = dy ? base + DY(o + i) * k : base;
                }
            }
            continue;
        }
        /* The statistics' outputs: d/dx of the batch mean is 1 / count, of
         * the biased variance 2 (x - mean) / count; the running ones weigh
         * them by (1 - momentum), the variance also by count / (count - 1). */
        double g_mean = 0, g_var = 0;
        if (d_rmean) g_mean += (1 - p.momentum) * d_rmean[c];
        if (d_mean) g_mean += d_mean[c];
        if (d_rvar) g_var += (1 - p.momentum) * (double)p.count / (double)(p.count - 1) * d_rvar[c];
        if (d_var) g_var += d_var[c];
        double a = (double)scale[c] * is, mdy = sum_dy / (double)p.count;
        double mdyx = sum_dy_xhat / (double)p.count;
        double cm = g_mean / (double)p.count, cv = 2 * g_var / (double)p.count;
        for (int64_t n = 0; n < p.n; n++)
            for (int64_t i = 0; i < p.s; i++) {
                int64_t k = (n * p.c + c) * p.s + i;
                double xc = x[k] - m, xhat = xc * is, g = dy ? DY(k) : 0;
                real base = ow ? 0 : dx[k];
                dx[k] = base + (real)(a * (g - mdy - xhat * mdyx) + cm + cv * xc);
            }
    }
    return GP_OK;
#undef DY
}

/* ---- the table ---- */

/* Y can be written again from X and the saved statistics (bn_remake). */
static bool bn_remakes(const struct gp_graph *g, const struct gp_node *node)
{
    (void)g, (void)node;
    return true;
}

/* The backward writes dX whole when asked, and a fused residual's
 * gradient (the scale's and bias's gradients are parameters': always
 * added). */
static bool bn_overwrites(const struct gp_graph *g, const struct gp_node *node, int k)
{
    (void)g;
    return k == 0 || (k == 5 && node->fused_add);
}

const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_batch_norm)[] = {
    {"BatchNormalization", bn_saved, NULL, bn_forward, bn_backward, bn_overwrites, bn_remakes},
    {0},
};
