/* CPU kernels: LayerNormalization, forward and backward, with PyTorch's
 * formulas: biased variance, epsilon inside the square root.
 *
 * Statistics and parameter gradients are sums over many elements: each is
 * accumulated in double by one thread, in a fixed order, and added to its
 * gradient buffer once. The parallel loops split rows (or fixed blocks of
 * columns), so results do not depend on the thread count. */
#include <math.h>
#include <string.h>

#include "backend/cpu/kernel_util.h"

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
#pragma omp parallel for if (p.rows * p.cols > GP_CPU_PAR_MIN)
    for (int64_t r = 0; r < p.rows; r++) {
        double m, var;
        const real *xs = x + r * p.cols;
        real *ys = y + r * p.cols;
        gp_cpu_moments(xs, p.cols, &m, &var);
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
    bool ow = gp_cpu_overwrite(ctx, 0); /* dx written whole: 0 + its gradient */
    if (dx) {
#pragma omp parallel for if (p.rows * p.cols > GP_CPU_PAR_MIN)
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
                dxs[j] = (ow ? (real)0 : dxs[j]) + (real)v;
            }
        }
    }
    if (!dy || (!dscale && !dbias)) return GP_OK;
    if (p.sfull && p.bfull) {
        int64_t blocks = (p.cols + LN_BLOCK - 1) / LN_BLOCK;
#pragma omp parallel for if (p.rows * p.cols > GP_CPU_PAR_MIN)
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

/* ---- the table ---- */

/* The backward writes dX whole when asked (every row, every column; the
 * scale's and bias's gradients are parameters': always added). */
static bool ln_overwrites(const struct gp_graph *g, const struct gp_node *node, int k)
{
    (void)g, (void)node;
    return k == 0;
}

const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_layer_norm)[] = {
    {"LayerNormalization", ln_saved, NULL, ln_forward, ln_backward, ln_overwrites},
    {0},
};
