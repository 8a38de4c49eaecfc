/* CPU kernels: InstanceNormalization, forward and backward, with
 * PyTorch's formulas: biased variance, epsilon inside the square root.
 *
 * Statistics and parameter gradients are sums over many elements: each is
 * accumulated in double by one thread, in a fixed order, and added to its
 * gradient buffer once. The parallel loops split planes (forward) or
 * channels (backward, a channel's planes in sample order), so results do
 * not depend on the thread count. */
#include <math.h>
#include <string.h>

#include "backend/cpu/kernel_util.h"

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

static gp_status in_forward(struct gp_cpu_ctx *ctx, struct gp_error *err)
{
    (void)err;
    struct in_plan p;
    in_plan(ctx, &p);
    const real *x = ctx->in[0], *scale = ctx->in[1], *bias = ctx->in[2];
    real *y = ctx->out[0], *mean = ctx->saved, *invstd = mean + p.n * p.c;
#pragma omp parallel for if (p.n * p.c * p.s > GP_CPU_PAR_MIN)
    for (int64_t pl = 0; pl < p.n * p.c; pl++) {
        double m, var;
        gp_cpu_moments(x + pl * p.s, p.s, &m, &var);
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
#pragma omp parallel for if (p.n * p.c * p.s > GP_CPU_PAR_MIN)
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

/* ---- the table ---- */

const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_instance_norm)[] = {
    {"InstanceNormalization", in_saved, NULL, in_forward, in_backward},
    {0},
};
