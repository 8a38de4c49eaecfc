/* CPU kernels: Softmax and LogSoftmax, forward and backward.
 *
 * Threads split the vectors (one softmax each) and each sums within its
 * vector in a fixed order, in double, so results do not depend on the
 * thread count. */
#include <string.h>
#include <tgmath.h>

#include "backend/cpu/kernel_util.h"
#include "ops/fold_util.h"

/* ---- Softmax, LogSoftmax ---- */

/* The input as `count` vectors of `len` elements `stride` apart: vector v
 * starts at (v / stride) * len * stride + v % stride. Before opset 13 the
 * input is the matrix [D0*..*D(axis-1), D(axis)*..] and each row one
 * vector (stride 1); since 13 the vectors run along `axis` alone. */
struct vecs {
    int64_t count, len, stride;
};

static gp_status softmax_vecs(struct gp_cpu_ctx *c, struct gp_error *err, struct vecs *v)
{
    struct gp_infer_ctx ic = gp_cpu_infer_ctx(c, err);
    const struct gp_shape *xs = gp_cpu_in_shape(c, 0);
    bool coerce = c->node->def->since_version < 13;
    int axis;
    GP_TRY(gp_norm_axis(&ic, gp_node_attr_int(c->node, "axis", coerce ? 1 : -1), xs->rank, &axis));
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= xs->dims[d];
    for (int d = axis + 1; d < xs->rank; d++) inner *= xs->dims[d];
    if (coerce) *v = (struct vecs){outer, xs->dims[axis] * inner, 1};
    else *v = (struct vecs){outer * inner, xs->dims[axis], inner};
    return GP_OK;
}

static inline int64_t vec_start(const struct vecs *v, int64_t k)
{
    return k / v->stride * v->len * v->stride + k % v->stride;
}

/* X [..] -> Y [..]: exp(x - max) / sum, or x - max - log(sum) for
 * LogSoftmax, per vector. */
static gp_status softmax_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    struct vecs v;
    GP_TRY(softmax_vecs(c, err, &v));
    bool log_out = strcmp(c->node->op_type, "LogSoftmax") == 0;
    const real *X = c->in[0];
    real *Y = c->out[0];
#pragma omp parallel for if (v.count * v.len > GP_CPU_PAR_MIN) schedule(static)
    for (int64_t k = 0; k < v.count; k++) {
        const real *x = X + vec_start(&v, k);
        real *y = Y + vec_start(&v, k);
        int64_t s = v.stride;
        real m = -INFINITY;
        for (int64_t j = 0; j < v.len; j++)
            if (x[j * s] > m || x[j * s] != x[j * s]) m = x[j * s];
        if (m == -INFINITY) m = 0; /* all -inf: keeps exp finite (NaN, as PyTorch gives) */
        double sum = 0;
        for (int64_t j = 0; j < v.len; j++) {
            real e = exp(x[j * s] - m);
            if (!log_out) y[j * s] = e;
            sum += e;
        }
        if (log_out) { /* (x - max) - log(sum): exact where x - max is, for large x */
            real ls = (real)log(sum);
            for (int64_t j = 0; j < v.len; j++) y[j * s] = (x[j * s] - m) - ls;
        } else {
            real inv = (real)(1 / sum);
            for (int64_t j = 0; j < v.len; j++) y[j * s] *= inv;
        }
    }
    return GP_OK;
}

/* Softmax: dX = Y * (dY - sum(dY * Y)); LogSoftmax: dX = dY - exp(Y) *
 * sum(dY), per vector. */
static gp_status softmax_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    const real *Y = c->out[0], *dY = c->dout[0];
    real *dX = c->din[0];
    if (!dY || !dX) return GP_OK;
    struct vecs v;
    GP_TRY(softmax_vecs(c, err, &v));
    bool log_out = strcmp(c->node->op_type, "LogSoftmax") == 0;
#pragma omp parallel for if (v.count * v.len > GP_CPU_PAR_MIN) schedule(static)
    for (int64_t k = 0; k < v.count; k++) {
        int64_t o = vec_start(&v, k), s = v.stride;
        const real *y = Y + o, *dy = dY + o;
        real *dx = dX + o;
        double dot = 0;
        for (int64_t j = 0; j < v.len; j++) dot += log_out ? dy[j * s] : dy[j * s] * y[j * s];
        real d = (real)dot;
        for (int64_t j = 0; j < v.len; j++)
            dx[j * s] += log_out ? dy[j * s] - exp(y[j * s]) * d : y[j * s] * (dy[j * s] - d);
    }
    return GP_OK;
}

/* ---- the table ---- */

const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_softmax)[] = {
    {"Softmax", NULL, NULL, softmax_forward, softmax_backward},
    {"LogSoftmax", NULL, NULL, softmax_forward, softmax_backward},
    {0},
};
