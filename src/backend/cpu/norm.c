/* CPU kernels: BatchNormalization, InstanceNormalization and
 * LayerNormalization, forward and backward, with PyTorch's formulas: biased
 * variance, epsilon inside the square root, y = (x - mean) * invstd * scale
 * + bias.
 *
 * Statistics and parameter gradients are sums over many elements: each is
 * accumulated in double by one thread, in a fixed order, and added to its
 * gradient buffer once. The parallel loops split channels, planes or rows
 * (or fixed column blocks), so results do not depend on the thread count. */
#include <math.h>
#include <string.h>

#include "backend/cpu/kernel.h"

#define PAR_MIN 32768

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
#pragma omp parallel for if (p.n * p.c * p.s > PAR_MIN)
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
        /* PyTorch's transform: y = x * alpha + beta. */
        real alpha = is * scale[c], beta = bias[c] - mean[c] * alpha;
        for (int64_t n = 0; n < p.n; n++) {
            const real *xs = x + (n * p.c + c) * p.s;
            real *ys = y + (n * p.c + c) * p.s;
            for (int64_t i = 0; i < p.s; i++) ys[i] = xs[i] * alpha + beta;
        }
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
    const real *x = ctx->in[0], *scale = ctx->in[1], *dy = ctx->dout[0];
    const real *mean = ctx->saved, *invstd = mean + p.c;
    real *dx = ctx->din[0], *dscale = ctx->din[1], *dbias = ctx->din[2];
    const real *d_rmean = ctx->node->n_outputs > 1 ? ctx->dout[1] : NULL;
    const real *d_rvar = ctx->node->n_outputs > 2 ? ctx->dout[2] : NULL;
    const real *d_mean = ctx->node->n_outputs > 3 ? ctx->dout[3] : NULL;
    const real *d_var = ctx->node->n_outputs > 4 ? ctx->dout[4] : NULL;
    bool training = ctx->training;
#pragma omp parallel for if (p.n * p.c * p.s > PAR_MIN)
    for (int64_t c = 0; c < p.c; c++) {
        double sum_dy = 0, sum_dy_xhat = 0;
        real m = mean[c], is = invstd[c];
        if (dy)
            for (int64_t n = 0; n < p.n; n++)
                for (int64_t i = 0; i < p.s; i++) {
                    int64_t k = (n * p.c + c) * p.s + i;
                    sum_dy += dy[k];
                    sum_dy_xhat += (double)dy[k] * ((x[k] - m) * is);
                }
        if (dscale) dscale[c] += (real)sum_dy_xhat;
        if (dbias) dbias[c] += (real)sum_dy;
        if (!dx) continue;
        if (!training) {
            if (!dy) continue;
            real k = scale[c] * is;
            for (int64_t n = 0; n < p.n; n++) {
                int64_t o = (n * p.c + c) * p.s;
                for (int64_t i = 0; i < p.s; i++) dx[o + i] += dy[o + i] * k;
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
                double xc = x[k] - m, xhat = xc * is, g = dy ? dy[k] : 0;
                dx[k] += (real)(a * (g - mdy - xhat * mdyx) + cm + cv * xc);
            }
    }
    return GP_OK;
}

/* ---- InstanceNormalization ---- */

/* X [N, C, D...], scale [C], B [C] -> Y like X: each (sample, channel)
 * plane normalized by its own mean and biased variance. */
struct in_plan {
    int64_t n, c, s;
    double eps;
};

static void in_plan(const struct gp_cpu_ctx *ctx, struct in_plan *p)
{
    const struct gp_shape *x = &gp_cpu_in_value(ctx, 0)->shape;
    p->n = x->dims[0];
    p->c = x->dims[1];
    p->s = 1;
    for (int i = 2; i < x->rank; i++) p->s *= x->dims[i];
    p->eps = gp_node_attr_float(ctx->node, "epsilon", 1e-5f);
}

/* ctx->saved: mean [N * C] and inverse standard deviation [N * C]. */
static size_t in_saved(const struct gp_graph *g, const struct gp_node *node)
{
    const struct gp_shape *x = &gp_node_input(g, node, 0)->shape;
    return 2 * sizeof(real) * (size_t)(x->dims[0] * x->dims[1]);
}

/* Mean and biased variance of v [n], two passes in double. */
static void moments(const real *v, int64_t n, double *mean, double *var)
{
    double s = 0, q = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    double m = n > 0 ? s / (double)n : 0;
    for (int64_t i = 0; i < n; i++) {
        double d = v[i] - m;
        q += d * d;
    }
    *mean = m;
    *var = n > 0 ? q / (double)n : 0;
}

static gp_status in_forward(struct gp_cpu_ctx *ctx, struct gp_error *err)
{
    (void)err;
    struct in_plan p;
    in_plan(ctx, &p);
    const real *x = ctx->in[0], *scale = ctx->in[1], *bias = ctx->in[2];
    real *y = ctx->out[0], *mean = ctx->saved, *invstd = mean + p.n * p.c;
#pragma omp parallel for if (p.n * p.c * p.s > PAR_MIN)
    for (int64_t pl = 0; pl < p.n * p.c; pl++) {
        double m, var;
        moments(x + pl * p.s, p.s, &m, &var);
        real mr = (real)m, is = (real)(1.0 / sqrt(var + p.eps));
        mean[pl] = mr;
        invstd[pl] = is;
        real a = is * scale[pl % p.c], b = bias[pl % p.c];
        for (int64_t i = 0; i < p.s; i++) y[pl * p.s + i] = (x[pl * p.s + i] - mr) * a + b;
    }
    return GP_OK;
}

/* dY like X -> per plane dx = scale * invstd * (dy - mean(dy) - xhat *
 * mean(dy xhat)); dscale, dB sum over samples and cells, per channel. */
static gp_status in_backward(struct gp_cpu_ctx *ctx, struct gp_error *err)
{
    (void)err;
    struct in_plan p;
    in_plan(ctx, &p);
    const real *x = ctx->in[0], *scale = ctx->in[1], *dy = ctx->dout[0];
    const real *mean = ctx->saved, *invstd = mean + p.n * p.c;
    real *dx = ctx->din[0], *dscale = ctx->din[1], *dbias = ctx->din[2];
    if (!dy) return GP_OK;
    /* A channel's planes in sample order, so its parameter sums are fixed. */
#pragma omp parallel for if (p.n * p.c * p.s > PAR_MIN)
    for (int64_t c = 0; c < p.c; c++) {
        double sc = 0, sb = 0;
        for (int64_t n = 0; n < p.n; n++) {
            int64_t pl = n * p.c + c;
            const real *xs = x + pl * p.s, *dys = dy + pl * p.s;
            real m = mean[pl], is = invstd[pl];
            double sum_dy = 0, sum_dy_xhat = 0;
            for (int64_t i = 0; i < p.s; i++) {
                sum_dy += dys[i];
                sum_dy_xhat += (double)dys[i] * ((xs[i] - m) * is);
            }
            sc += sum_dy_xhat;
            sb += sum_dy;
            if (!dx) continue;
            double a = (double)scale[c] * is, mdy = sum_dy / (double)p.s;
            double mdyx = sum_dy_xhat / (double)p.s;
            for (int64_t i = 0; i < p.s; i++) {
                double xhat = (xs[i] - m) * is;
                dx[pl * p.s + i] += (real)(a * (dys[i] - mdy - xhat * mdyx));
            }
        }
        if (dscale) dscale[c] += (real)sc;
        if (dbias) dbias[c] += (real)sb;
    }
    return GP_OK;
}

/* ---- LayerNormalization ---- */

/* X viewed as [rows, cols]: rows = D0 * .. * D(axis-1), cols = the
 * normalized axes. Scale and B broadcast to the normalized shape; `full`
 * when each has one entry per column (then indexed by column directly). */
struct ln_plan {
    int64_t rows, cols;
    double eps;
    int axis, rank;
    int64_t dims[GP_MAX_RANK];                          /* normalized shape */
    int64_t sstride[GP_MAX_RANK], bstride[GP_MAX_RANK]; /* Scale's, B's strides over it */
    bool sfull, bfull;
};

/* Strides of p [..] broadcast (aligned right) into the normalized shape. */
static bool ln_strides(const struct gp_value *v, const struct ln_plan *p, int64_t *st)
{
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

static void ln_plan(const struct gp_cpu_ctx *ctx, struct ln_plan *p)
{
    const struct gp_shape *x = &gp_cpu_in_value(ctx, 0)->shape;
    int64_t axis = gp_node_attr_int(ctx->node, "axis", -1);
    p->axis = (int)(axis < 0 ? axis + x->rank : axis);
    p->rank = x->rank - p->axis;
    p->rows = p->cols = 1;
    for (int i = 0; i < p->axis; i++) p->rows *= x->dims[i];
    for (int i = p->axis; i < x->rank; i++) {
        p->dims[i - p->axis] = x->dims[i];
        p->cols *= x->dims[i];
    }
    p->eps = gp_node_attr_float(ctx->node, "epsilon", 1e-5f);
    p->sfull = ln_strides(gp_cpu_in_value(ctx, 1), p, p->sstride);
    p->bfull = ln_strides(gp_cpu_in_value(ctx, 2), p, p->bstride);
}

/* Offset into a broadcast parameter of column j. */
static int64_t ln_index(const struct ln_plan *p, const int64_t *st, bool full, int64_t j)
{
    if (full) return j;
    int64_t off = 0;
    for (int i = p->rank - 1; i >= 0; i--) {
        off += (j % p->dims[i]) * st[i];
        j /= p->dims[i];
    }
    return off;
}

/* ctx->saved: mean [rows] and inverse standard deviation [rows]. */
static size_t ln_saved(const struct gp_graph *g, const struct gp_node *node)
{
    const struct gp_shape *x = &gp_node_input(g, node, 0)->shape;
    int64_t axis = gp_node_attr_int(node, "axis", -1), rows = 1;
    if (axis < 0) axis += x->rank;
    for (int i = 0; i < axis; i++) rows *= x->dims[i];
    return 2 * sizeof(real) * (size_t)rows;
}

/* X, Scale, optional B -> Y like X; optional Mean and InvStdDev, one per
 * row (X's shape with the normalized axes 1). */
static gp_status ln_forward(struct gp_cpu_ctx *ctx, struct gp_error *err)
{
    (void)err;
    struct ln_plan p;
    ln_plan(ctx, &p);
    const real *x = ctx->in[0], *scale = ctx->in[1];
    const real *bias = ctx->node->n_inputs > 2 ? ctx->in[2] : NULL;
    real *y = ctx->out[0], *mean = ctx->saved, *invstd = mean + p.rows;
    real *out_mean = ctx->node->n_outputs > 1 ? ctx->out[1] : NULL;
    real *out_inv = ctx->node->n_outputs > 2 ? ctx->out[2] : NULL;
#pragma omp parallel for if (p.rows * p.cols > PAR_MIN)
    for (int64_t r = 0; r < p.rows; r++) {
        double m, var;
        const real *xs = x + r * p.cols;
        real *ys = y + r * p.cols;
        moments(xs, p.cols, &m, &var);
        real mr = (real)m, is = (real)(1.0 / sqrt(var + p.eps));
        mean[r] = mr;
        invstd[r] = is;
        if (out_mean) out_mean[r] = mr;
        if (out_inv) out_inv[r] = is;
        for (int64_t j = 0; j < p.cols; j++) {
            real v = (xs[j] - mr) * is * scale[ln_index(&p, p.sstride, p.sfull, j)];
            ys[j] = bias ? v + bias[ln_index(&p, p.bstride, p.bfull, j)] : v;
        }
    }
    return GP_OK;
}

/* Columns per block of the parameter-gradient sums: fixed, so the sums do
 * not depend on how many threads share the blocks. */
#define LN_BLOCK 64

/* dY like X (and the gradients of Mean and InvStdDev) -> per row, with
 * g = dy * scale: dx = invstd * (g - mean(g) - xhat * mean(g xhat)) plus
 * d(Mean) / cols + d(InvStdDev) * (-invstd^3) (x - mean) / cols; dScale,
 * dB sum dy * xhat and dy over rows (and over broadcast columns). */
static gp_status ln_backward(struct gp_cpu_ctx *ctx, struct gp_error *err)
{
    (void)err;
    struct ln_plan p;
    ln_plan(ctx, &p);
    const real *x = ctx->in[0], *scale = ctx->in[1], *dy = ctx->dout[0];
    const real *mean = ctx->saved, *invstd = mean + p.rows;
    real *dx = ctx->din[0], *dscale = ctx->din[1];
    real *dbias = ctx->node->n_inputs > 2 ? ctx->din[2] : NULL;
    const real *d_mean = ctx->node->n_outputs > 1 ? ctx->dout[1] : NULL;
    const real *d_inv = ctx->node->n_outputs > 2 ? ctx->dout[2] : NULL;
    if (dx) {
#pragma omp parallel for if (p.rows * p.cols > PAR_MIN)
        for (int64_t r = 0; r < p.rows; r++) {
            const real *xs = x + r * p.cols, *dys = dy ? dy + r * p.cols : NULL;
            real *dxs = dx + r * p.cols;
            real m = mean[r], is = invstd[r];
            double sg = 0, sgx = 0;
            if (dys)
                for (int64_t j = 0; j < p.cols; j++) {
                    double g = (double)dys[j] * scale[ln_index(&p, p.sstride, p.sfull, j)];
                    sg += g;
                    sgx += g * ((xs[j] - m) * is);
                }
            double n = (double)p.cols, mg = sg / n, mgx = sgx / n;
            double cm = d_mean ? d_mean[r] / n : 0;
            double cv = d_inv ? -(double)d_inv[r] * is * is * is / n : 0;
            for (int64_t j = 0; j < p.cols; j++) {
                double xc = xs[j] - m, xhat = xc * is, v = cm + cv * xc;
                if (dys) {
                    double g = (double)dys[j] * scale[ln_index(&p, p.sstride, p.sfull, j)];
                    v += is * (g - mg - xhat * mgx);
                }
                dxs[j] += (real)v;
            }
        }
    }
    if (!dy || (!dscale && !dbias)) return GP_OK;
    if (p.sfull && p.bfull) {
        int64_t blocks = (p.cols + LN_BLOCK - 1) / LN_BLOCK;
#pragma omp parallel for if (p.rows * p.cols > PAR_MIN)
        for (int64_t b = 0; b < blocks; b++) {
            double ss[LN_BLOCK] = {0}, sb[LN_BLOCK] = {0};
            int64_t j0 = b * LN_BLOCK, j1 = j0 + LN_BLOCK < p.cols ? j0 + LN_BLOCK : p.cols;
            for (int64_t r = 0; r < p.rows; r++) {
                const real *xs = x + r * p.cols, *dys = dy + r * p.cols;
                real m = mean[r], is = invstd[r];
                for (int64_t j = j0; j < j1; j++) {
                    ss[j - j0] += (double)dys[j] * ((xs[j] - m) * is);
                    sb[j - j0] += dys[j];
                }
            }
            for (int64_t j = j0; j < j1; j++) {
                if (dscale) dscale[j] += (real)ss[j - j0];
                if (dbias) dbias[j] += (real)sb[j - j0];
            }
        }
        return GP_OK;
    }
    /* Broadcast parameters: several columns share an entry; one thread. */
    for (int64_t r = 0; r < p.rows; r++) {
        const real *xs = x + r * p.cols, *dys = dy + r * p.cols;
        real m = mean[r], is = invstd[r];
        for (int64_t j = 0; j < p.cols; j++) {
            if (dscale) dscale[ln_index(&p, p.sstride, p.sfull, j)] += dys[j] * ((xs[j] - m) * is);
            if (dbias) dbias[ln_index(&p, p.bstride, p.bfull, j)] += dys[j];
        }
    }
    return GP_OK;
}

const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_norm)[] = {
    {"BatchNormalization", bn_saved, NULL, bn_forward, bn_backward},
    {"InstanceNormalization", in_saved, NULL, in_forward, in_backward},
    {"LayerNormalization", ln_saved, NULL, ln_forward, ln_backward},
    {0},
};
