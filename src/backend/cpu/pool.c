/* CPU kernels: MaxPool, AveragePool, GlobalAveragePool and GlobalMaxPool,
 * forward and backward.
 *
 * Every (sample, channel) plane is independent: the parallel loops split
 * planes, and a plane's outputs and gradients are computed in one fixed
 * order, so results do not depend on the thread count. MaxPool's forward
 * saves each window's argmax (int32, an output's worth: the CUDA kernels'
 * state too), and its backward reads that alone: neither X nor Y need be
 * kept for it (ops/backward_reads.c), where X is often a large activation
 * nothing else reads back (ResNet's stem, 4 x the pooled output).
 * Window geometry comes from gp_window_resolve, as in shape inference; up to
 * 3 spatial axes. */
#include <math.h>
#include <string.h>

#include "backend/cpu/kernel.h"
#include "ops/window.h"

#define MAX_AXES 3
/* Below this many elements read (global pools) or output cells written
 * (each a window's work) a parallel region costs more than it saves. */
#define PAR_MIN 32768
#define PAR_MIN_CELLS 4096

/* The window over exactly 3 spatial axes, fewer padded in front with axes
 * of size 1: output cell o's taps read input cells o * s - p + t * d,
 * t < k; cells outside [0, in) are padding. */
struct pool_plan {
    int64_t planes;                 /* N * C */
    int64_t in[MAX_AXES], out[MAX_AXES];
    int64_t k[MAX_AXES], s[MAX_AXES], d[MAX_AXES], p[MAX_AXES];
    int64_t pad_end[MAX_AXES];
    int64_t in_size, out_size;
};

static gp_status pool_plan(const struct gp_cpu_ctx *c, struct pool_plan *pp, struct gp_error *err)
{
    const struct gp_value *x = gp_cpu_in_value(c, 0);
    /* gp_window_resolve only reads the node's attributes; its context type
     * is the (mutable) inference one. */
    struct gp_infer_ctx ic = {(struct gp_graph *)c->graph, (struct gp_node *)c->node, err};
    struct gp_window w;
    GP_TRY(gp_window_resolve(&ic, GP_WINDOW_POOL, &x->shape, NULL, &w));
    if (w.n_spatial > MAX_AXES)
        return gp_cpu_error(c, err, GP_ERR_UNSUPPORTED,
                            "the CPU backend pools over up to %d spatial axes, not %d", MAX_AXES,
                            w.n_spatial);
    if (!gp_dtype_is_float(x->dtype))
        return gp_cpu_error(c, err, GP_ERR_UNSUPPORTED, "the CPU backend pools float tensors, "
                            "not %s", gp_dtype_name(x->dtype));
    pp->planes = x->shape.dims[0] * x->shape.dims[1];
    pp->in_size = pp->out_size = 1;
    int pad = MAX_AXES - w.n_spatial;
    for (int i = 0; i < MAX_AXES; i++) {
        int j = i - pad;
        bool ax = j >= 0;
        pp->in[i] = ax ? w.in[j] : 1;
        pp->out[i] = ax ? w.out[j] : 1;
        pp->k[i] = ax ? w.kernel[j] : 1;
        pp->s[i] = ax ? w.stride[j] : 1;
        pp->d[i] = ax ? w.dilation[j] : 1;
        pp->p[i] = ax ? w.pad_begin[j] : 0;
        pp->pad_end[i] = ax ? w.pad_end[j] : 0;
        pp->in_size *= pp->in[i];
        pp->out_size *= pp->out[i];
    }
    return GP_OK;
}

/* Along one axis, the taps of output cell o: the first inside the input
 * (*t0), one past the last (*t1), and how many lie inside the padded input
 * [-pad_begin, in + pad_end) (*padded): a ceil_mode window may run past
 * its end. */
static void taps(const struct pool_plan *pp, int a, int64_t o, int64_t *t0, int64_t *t1,
                 int64_t *padded)
{
    int64_t start = o * pp->s[a] - pp->p[a], d = pp->d[a], k = pp->k[a];
    int64_t lo = start >= 0 ? 0 : (-start + d - 1) / d;
    int64_t hi = pp->in[a] - start <= 0 ? 0 : (pp->in[a] - start + d - 1) / d;
    int64_t hp = pp->in[a] + pp->pad_end[a] - start <= 0
                     ? 0 : (pp->in[a] + pp->pad_end[a] - start + d - 1) / d;
    if (hi > k) hi = k;
    if (hp > k) hp = k;
    if (lo > hi) lo = hi;
    *t0 = lo;
    *t1 = hi;
    *padded = hp;
}

/* ---- MaxPool ---- */

/* The offset within the plane of the first maximum of output cell o
 * (o0, o1, o2), NaN winning as in PyTorch; -1 when the window holds no
 * input cell (possible only with dilations). */
static int64_t window_argmax(const struct pool_plan *pp, const real *x, int64_t o0, int64_t o1,
                             int64_t o2)
{
    int64_t a[MAX_AXES], b[MAX_AXES], unused, o[MAX_AXES] = {o0, o1, o2};
    for (int i = 0; i < MAX_AXES; i++) taps(pp, i, o[i], &a[i], &b[i], &unused);
    int64_t best = -1;
    real max = -INFINITY;
    for (int64_t t0 = a[0]; t0 < b[0]; t0++) {
        int64_t i0 = o0 * pp->s[0] - pp->p[0] + t0 * pp->d[0];
        for (int64_t t1 = a[1]; t1 < b[1]; t1++) {
            int64_t i1 = o1 * pp->s[1] - pp->p[1] + t1 * pp->d[1];
            int64_t row = (i0 * pp->in[1] + i1) * pp->in[2];
            for (int64_t t2 = a[2]; t2 < b[2]; t2++) {
                int64_t idx = row + o2 * pp->s[2] - pp->p[2] + t2 * pp->d[2];
                real v = x[idx];
                /* PyTorch's rule: start at the first cell (so an all -inf
                 * window still has one), move on a strictly larger value or
                 * any NaN. */
                if (best < 0) best = idx;
                if (v > max || isnan(v)) {
                    max = v;
                    best = idx;
                }
            }
        }
    }
    return best;
}

/* ONNX's Indices: an offset into the whole of X ([N, C, D...] flattened),
 * with the spatial axes in row-major order, or column-major when
 * storage_order is 1. */
static int64_t onnx_index(const struct pool_plan *pp, int64_t plane, int64_t off, bool col_major)
{
    if (!col_major) return plane * pp->in_size + off;
    int64_t i2 = off % pp->in[2], i1 = (off / pp->in[2]) % pp->in[1];
    int64_t i0 = off / (pp->in[2] * pp->in[1]);
    /* Axes padded in front have size 1, so they add nothing. */
    return plane * pp->in_size + (i2 * pp->in[1] + i1) * pp->in[0] + i0;
}

/* ctx->saved: the argmax of every output cell, its offset within its
 * plane (int32; -1: a window without input cells). */
static size_t maxpool_saved(const struct gp_graph *g, const struct gp_node *node)
{
    const struct gp_value *y = gp_node_output(g, node, 0);
    return y ? sizeof(int32_t) * (size_t)gp_shape_numel(&y->shape) : 0;
}

/* X [N, C, D...] -> Y [N, C, O...], optional Indices (int64, Y's shape),
 * and the argmax saved for the backward (when there is a saved block). */
static gp_status maxpool_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    struct pool_plan pp;
    GP_TRY(pool_plan(c, &pp, err));
    if (pp.in_size > INT32_MAX)
        return gp_cpu_error(c, err, GP_ERR_UNSUPPORTED, "a plane of %lld cells exceeds int32 argmax offsets",
                            (long long)pp.in_size);
    const real *x = c->in[0];
    real *y = c->out[0];
    int64_t *ind = c->node->n_outputs > 1 ? c->out[1] : NULL;
    int32_t *saved = c->saved;
    bool col_major = gp_node_attr_int(c->node, "storage_order", 0) != 0;
#pragma omp parallel for if (pp.planes * pp.out_size > PAR_MIN_CELLS)
    for (int64_t pl = 0; pl < pp.planes; pl++) {
        const real *xp = x + pl * pp.in_size;
        int64_t o = pl * pp.out_size;
        for (int64_t o0 = 0; o0 < pp.out[0]; o0++)
            for (int64_t o1 = 0; o1 < pp.out[1]; o1++)
                for (int64_t o2 = 0; o2 < pp.out[2]; o2++, o++) {
                    int64_t arg = window_argmax(&pp, xp, o0, o1, o2);
                    y[o] = arg >= 0 ? xp[arg] : -INFINITY;
                    if (ind) ind[o] = arg >= 0 ? onnx_index(&pp, pl, arg, col_major) : -1;
                    if (saved) saved[o] = (int32_t)arg;
                }
    }
    return GP_OK;
}

/* dY -> dX += dY at each window's (first) maximum, as the forward saved
 * it; each plane's outputs in order. */
static gp_status maxpool_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    struct pool_plan pp;
    GP_TRY(pool_plan(c, &pp, err));
    const real *dy = c->dout[0];
    const int32_t *saved = c->saved;
    real *dx = c->din[0];
    if (!dy || !dx) return GP_OK;
    if (!saved)
        return gp_cpu_error(c, err, GP_ERR_UNSUPPORTED, "MaxPool backward needs the argmax saved by forward");
#pragma omp parallel for if (pp.planes * pp.out_size > PAR_MIN_CELLS)
    for (int64_t pl = 0; pl < pp.planes; pl++) {
        real *dxp = dx + pl * pp.in_size;
        for (int64_t o = pl * pp.out_size; o < (pl + 1) * pp.out_size; o++)
            if (saved[o] >= 0) dxp[saved[o]] += dy[o];
    }
    return GP_OK;
}

/* ---- AveragePool ---- */

/* The divisor of output cell o: the taps inside the input, or with
 * count_include_pad those inside the padded input (so a ceil_mode window
 * hanging past the end pads counts only up to there, as PyTorch and
 * onnxruntime divide). 0 only for a window without cells. */
static int64_t avg_divisor(const struct pool_plan *pp, const int64_t *o, bool include_pad)
{
    int64_t n = 1;
    for (int i = 0; i < MAX_AXES; i++) {
        int64_t t0, t1, padded;
        taps(pp, i, o[i], &t0, &t1, &padded);
        n *= include_pad ? padded : t1 - t0;
    }
    return n;
}

/* Visits the input cells of output cell o: calls body with `idx` set. */
#define FOR_TAPS(pp, o, idx, body)                                                        \
    do {                                                                                  \
        int64_t a_[MAX_AXES], b_[MAX_AXES], u_;                                           \
        for (int i_ = 0; i_ < MAX_AXES; i_++) taps(pp, i_, (o)[i_], &a_[i_], &b_[i_], &u_); \
        for (int64_t t0 = a_[0]; t0 < b_[0]; t0++) {                                      \
            int64_t i0 = (o)[0] * (pp)->s[0] - (pp)->p[0] + t0 * (pp)->d[0];              \
            for (int64_t t1 = a_[1]; t1 < b_[1]; t1++) {                                  \
                int64_t i1 = (o)[1] * (pp)->s[1] - (pp)->p[1] + t1 * (pp)->d[1];          \
                int64_t row_ = (i0 * (pp)->in[1] + i1) * (pp)->in[2];                     \
                for (int64_t t2 = a_[2]; t2 < b_[2]; t2++) {                              \
                    int64_t idx = row_ + (o)[2] * (pp)->s[2] - (pp)->p[2] + t2 * (pp)->d[2]; \
                    body;                                                                 \
                }                                                                         \
            }                                                                             \
        }                                                                                 \
    } while (0)

/* X [N, C, D...] -> Y [N, C, O...]: each window's sum over its input cells
 * divided by avg_divisor. */
static gp_status avgpool_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    struct pool_plan pp;
    GP_TRY(pool_plan(c, &pp, err));
    const real *x = c->in[0];
    real *y = c->out[0];
    bool include_pad = gp_node_attr_int(c->node, "count_include_pad", 0) != 0;
#pragma omp parallel for if (pp.planes * pp.out_size > PAR_MIN_CELLS)
    for (int64_t pl = 0; pl < pp.planes; pl++) {
        const real *xp = x + pl * pp.in_size;
        int64_t out = pl * pp.out_size;
        int64_t o[MAX_AXES];
        for (o[0] = 0; o[0] < pp.out[0]; o[0]++)
            for (o[1] = 0; o[1] < pp.out[1]; o[1]++)
                for (o[2] = 0; o[2] < pp.out[2]; o[2]++, out++) {
                    real sum = 0;
                    FOR_TAPS(&pp, o, idx, sum += xp[idx]);
                    int64_t div = avg_divisor(&pp, o, include_pad);
                    y[out] = div > 0 ? sum / (real)div : 0;
                }
    }
    return GP_OK;
}

/* dY -> dX += dY / divisor at every input cell of the window. */
static gp_status avgpool_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    struct pool_plan pp;
    GP_TRY(pool_plan(c, &pp, err));
    const real *dy = c->dout[0];
    real *dx = c->din[0];
    if (!dy || !dx) return GP_OK;
    bool include_pad = gp_node_attr_int(c->node, "count_include_pad", 0) != 0;
#pragma omp parallel for if (pp.planes * pp.out_size > PAR_MIN_CELLS)
    for (int64_t pl = 0; pl < pp.planes; pl++) {
        real *dxp = dx + pl * pp.in_size;
        int64_t out = pl * pp.out_size;
        int64_t o[MAX_AXES];
        for (o[0] = 0; o[0] < pp.out[0]; o[0]++)
            for (o[1] = 0; o[1] < pp.out[1]; o[1]++)
                for (o[2] = 0; o[2] < pp.out[2]; o[2]++, out++) {
                    int64_t div = avg_divisor(&pp, o, include_pad);
                    if (div <= 0) continue;
                    real g = dy[out] / (real)div;
                    FOR_TAPS(&pp, o, idx, dxp[idx] += g);
                }
    }
    return GP_OK;
}

/* ---- global pools ---- */

/* X [N, C, D...]: planes and cells per plane. */
static void global_dims(const struct gp_cpu_ctx *c, int64_t *planes, int64_t *size)
{
    const struct gp_shape *s = &gp_cpu_in_value(c, 0)->shape;
    *planes = s->dims[0] * s->dims[1];
    *size = 1;
    for (int i = 2; i < s->rank; i++) *size *= s->dims[i];
}

/* X [N, C, D...] -> Y [N, C, 1...]: the plane's mean, summed in double. */
static gp_status global_avg_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    int64_t planes, size;
    global_dims(c, &planes, &size);
    const real *x = c->in[0];
    real *y = c->out[0];
#pragma omp parallel for if (planes * size > PAR_MIN)
    for (int64_t pl = 0; pl < planes; pl++) {
        double s = 0;
        for (int64_t i = 0; i < size; i++) s += x[pl * size + i];
        y[pl] = (real)(s / (double)size);
    }
    return GP_OK;
}

static gp_status global_avg_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    int64_t planes, size;
    global_dims(c, &planes, &size);
    const real *dy = c->dout[0];
    real *dx = c->din[0];
    if (!dy || !dx) return GP_OK;
#pragma omp parallel for if (planes * size > PAR_MIN)
    for (int64_t pl = 0; pl < planes; pl++) {
        real g = dy[pl] / (real)size;
        for (int64_t i = 0; i < size; i++) dx[pl * size + i] += g;
    }
    return GP_OK;
}

/* The maximum of a plane of `size` cells by window_argmax's rule, or -1
 * if empty. */
static int64_t plane_argmax(const real *x, int64_t size)
{
    int64_t best = size > 0 ? 0 : -1;
    real max = -INFINITY;
    for (int64_t i = 0; i < size; i++)
        if (x[i] > max || isnan(x[i])) {
            max = x[i];
            best = i;
        }
    return best;
}

/* X [N, C, D...] -> Y [N, C, 1...]: the plane's maximum. */
static gp_status global_max_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    int64_t planes, size;
    global_dims(c, &planes, &size);
    const real *x = c->in[0];
    real *y = c->out[0];
#pragma omp parallel for if (planes * size > PAR_MIN)
    for (int64_t pl = 0; pl < planes; pl++) {
        int64_t a = plane_argmax(x + pl * size, size);
        y[pl] = a >= 0 ? x[pl * size + a] : -INFINITY;
    }
    return GP_OK;
}

static gp_status global_max_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    int64_t planes, size;
    global_dims(c, &planes, &size);
    const real *x = c->in[0], *dy = c->dout[0];
    real *dx = c->din[0];
    if (!dy || !dx) return GP_OK;
#pragma omp parallel for if (planes * size > PAR_MIN)
    for (int64_t pl = 0; pl < planes; pl++) {
        int64_t a = plane_argmax(x + pl * size, size);
        if (a >= 0) dx[pl * size + a] += dy[pl];
    }
    return GP_OK;
}

const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_pool)[] = {
    {"MaxPool", maxpool_saved, NULL, maxpool_forward, maxpool_backward},
    {"AveragePool", NULL, NULL, avgpool_forward, avgpool_backward},
    {"GlobalAveragePool", NULL, NULL, global_avg_forward, global_avg_backward},
    {"GlobalMaxPool", NULL, NULL, global_max_forward, global_max_backward},
    {0},
};
