/* CPU kernels: the reductions (ReduceSum, Mean, Max, Min, Prod, SumSquare,
 * L2), forward and backward, and ArgMax/ArgMin.
 *
 * Threads split the output cells and each sums within its cell in a fixed
 * order, in double, so results do not depend on the thread count. */
#include <string.h>
#include <tgmath.h>

#include "backend/cpu/kernel_util.h"
#include "ops/fold_util.h"

/* ---- reductions ---- */

enum rkind { R_SUM, R_MEAN, R_MAX, R_MIN, R_PROD, R_SUM_SQUARE, R_L2 };

static enum rkind rkind_of(const char *op)
{
    static const char *const names[] = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin",
                                        "ReduceProd", "ReduceSumSquare", "ReduceL2"};
    for (int k = 0; k < 7; k++)
        if (strcmp(op, names[k]) == 0) return (enum rkind)k;
    return R_SUM;
}

/* The input's axes split into kept ones (one output cell per index) and
 * reduced ones (summed over within a cell), with the input's strides. */
struct rplan {
    int nk, nr;
    int64_t kdims[GP_MAX_RANK], kst[GP_MAX_RANK]; /* kept: sizes, input strides */
    int64_t rdims[GP_MAX_RANK], rst[GP_MAX_RANK]; /* reduced */
    int64_t cells, count;                         /* output cells, inputs per cell */
};

/* Axes from the attribute (opsets before 13 / 18) or the constant input 1;
 * none given reduces all, or nothing with noop_with_empty_axes (then each
 * cell holds one element: Sum is a copy, SumSquare a square). */
static gp_status reduce_plan(struct gp_cpu_ctx *c, struct gp_error *err, struct rplan *p)
{
    struct gp_infer_ctx ic = gp_cpu_infer_ctx(c, err);
    const struct gp_shape *xs = gp_cpu_in_shape(c, 0);
    int r = xs->rank, n = 0;
    int64_t axes[GP_MAX_RANK];
    if (c->node->def->max_inputs >= 2) {
        if (c->node->n_inputs > 1 && c->node->inputs[1] >= 0)
            GP_TRY(gp_const_ints(&ic, 1, "axes", axes, GP_MAX_RANK, &n));
    } else {
        const int64_t *a;
        int64_t count = gp_node_attr_ints(c->node, "axes", &a);
        for (int64_t k = 0; k < count && k < GP_MAX_RANK; k++) axes[n++] = a[k];
    }
    bool noop = n == 0 && gp_node_attr_int(c->node, "noop_with_empty_axes", 0) != 0;
    bool red[GP_MAX_RANK];
    for (int d = 0; d < r; d++) red[d] = n == 0 && !noop;
    for (int k = 0; k < n; k++) {
        int d;
        GP_TRY(gp_norm_axis(&ic, axes[k], r, &d));
        red[d] = true;
    }
    int64_t st[GP_MAX_RANK];
    gp_shape_strides(xs, st);
    p->nk = p->nr = 0;
    p->cells = p->count = 1;
    for (int d = 0; d < r; d++) {
        if (red[d]) {
            p->rdims[p->nr] = xs->dims[d], p->rst[p->nr++] = st[d];
            p->count *= xs->dims[d];
        } else {
            p->kdims[p->nk] = xs->dims[d], p->kst[p->nk++] = st[d];
            p->cells *= xs->dims[d];
        }
    }
    return GP_OK;
}

static inline int64_t cell_base(const struct rplan *p, int64_t cell)
{
    int64_t base = 0;
    for (int q = p->nk - 1; q >= 0; q--) {
        base += cell % p->kdims[q] * p->kst[q];
        cell /= p->kdims[q];
    }
    return base;
}

/* Steps the reduced multi-index idx and the input offset *off; false once
 * every position of the cell has been visited. */
static inline bool cell_next(const struct rplan *p, int64_t *idx, int64_t *off)
{
    for (int q = p->nr - 1; q >= 0; q--) {
        *off += p->rst[q];
        if (++idx[q] < p->rdims[q]) return true;
        *off -= p->rst[q] * p->rdims[q];
        idx[q] = 0;
    }
    return false;
}

/* Integer data: sums wrap in uint64, Mean truncates. */
static void reduce_forward_int(struct gp_cpu_ctx *c, const struct rplan *p, enum rkind kind)
{
    enum gp_dtype dt = gp_cpu_in_value(c, 0)->dtype;
    for (int64_t cell = 0; cell < p->cells; cell++) {
        int64_t off = cell_base(p, cell), idx[GP_MAX_RANK] = {0};
        uint64_t acc = kind == R_PROD ? 1 : 0;
        int64_t best = 0;
        bool first = true;
        do {
            int64_t v = gp_cpu_load_i64(c->in[0], dt, off);
            switch (kind) {
            case R_MAX: if (first || v > best) best = v; break;
            case R_MIN: if (first || v < best) best = v; break;
            case R_PROD: acc *= (uint64_t)v; break;
            case R_SUM_SQUARE: case R_L2: acc += (uint64_t)v * (uint64_t)v; break;
            default: acc += (uint64_t)v; break;
            }
            first = false;
        } while (cell_next(p, idx, &off));
        int64_t out = kind == R_MAX || kind == R_MIN ? best : (int64_t)acc;
        if (kind == R_MEAN) out = p->count ? out / p->count : 0;
        if (kind == R_L2) out = (int64_t)sqrt((double)out);
        gp_cpu_store_i64(c->out[0], dt, cell, out);
    }
}

/* X [..] -> Y [kept axes, reduced ones as 1 (keepdims) or gone]: the
 * output's cells are the kept indices in row-major order either way. */
static gp_status reduce_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    struct rplan p;
    GP_TRY(reduce_plan(c, err, &p));
    enum rkind kind = rkind_of(c->node->op_type);
    if (!gp_dtype_is_float(gp_cpu_in_value(c, 0)->dtype)) {
        reduce_forward_int(c, &p, kind);
        return GP_OK;
    }
    const real *X = c->in[0];
    real *Y = c->out[0];
    if (p.count == 0) { /* an empty reduction: the identity element */
        for (int64_t cell = 0; cell < p.cells; cell++) Y[cell] = kind == R_PROD ? 1 : 0;
        return GP_OK;
    }
#pragma omp parallel for if (p.cells * p.count > GP_CPU_PAR_MIN) schedule(static)
    for (int64_t cell = 0; cell < p.cells; cell++) {
        int64_t off = cell_base(&p, cell), idx[GP_MAX_RANK] = {0};
        double acc = kind == R_PROD ? 1 : 0;
        real best = X[off];
        do {
            real v = X[off];
            switch (kind) {
            case R_MAX: if (v > best || v != v) best = best != best ? best : v; break;
            case R_MIN: if (v < best || v != v) best = best != best ? best : v; break;
            case R_PROD: acc *= v; break;
            case R_SUM_SQUARE: case R_L2: acc += (double)v * v; break;
            default: acc += v; break;
            }
        } while (cell_next(&p, idx, &off));
        switch (kind) {
        case R_MAX: case R_MIN: Y[cell] = best; break;
        case R_MEAN: Y[cell] = (real)(acc / (double)p.count); break;
        case R_L2: Y[cell] = (real)sqrt(acc); break;
        default: Y[cell] = (real)acc; break;
        }
    }
    return GP_OK;
}

/* dX within each cell: Sum dY; Mean dY / count; SumSquare 2 X dY; L2
 * X dY / Y (0 where Y = 0); Max/Min dY split evenly among the elements
 * equal to Y (torch.amax's rule); Prod dY times the product of the other
 * elements (exact when some are zero). */
static gp_status reduce_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    const real *X = c->in[0], *Y = c->out[0], *dY = c->dout[0];
    real *dX = c->din[0];
    if (!dY || !dX) return GP_OK;
    struct rplan p;
    GP_TRY(reduce_plan(c, err, &p));
    enum rkind kind = rkind_of(c->node->op_type);
    if (p.count == 0) return GP_OK;
#pragma omp parallel for if (p.cells * p.count > GP_CPU_PAR_MIN) schedule(static)
    for (int64_t cell = 0; cell < p.cells; cell++) {
        int64_t base = cell_base(&p, cell), off = base, idx[GP_MAX_RANK] = {0};
        real dy = dY[cell], y = Y[cell];
        /* Max/Min: ties; Prod: zeros and the product of the nonzero rest. */
        int64_t ties = 0, zeros = 0;
        double nonzero = 1;
        if (kind == R_MAX || kind == R_MIN || kind == R_PROD) {
            do {
                real v = X[off];
                if (kind == R_PROD) {
                    if (v == 0) zeros++;
                    else nonzero *= v;
                } else if (v == y || (v != v && y != y)) {
                    ties++;
                }
            } while (cell_next(&p, idx, &off));
        }
        off = base;
        do {
            real x = X[off], g;
            switch (kind) {
            case R_SUM: g = dy; break;
            case R_MEAN: g = dy / (real)p.count; break;
            case R_SUM_SQUARE: g = 2 * x * dy; break;
            case R_L2: g = y == 0 ? 0 : dy * x / y; break;
            case R_PROD:
                g = zeros == 0 ? (real)(dy * (nonzero / x))
                    : zeros == 1 && x == 0 ? (real)(dy * nonzero) : 0;
                break;
            default: g = x == y || (x != x && y != y) ? dy / (real)ties : 0; break;
            }
            dX[off] += g;
        } while (cell_next(&p, idx, &off));
    }
    return GP_OK;
}

/* ---- ArgMax, ArgMin ---- */

/* X [..] -> int64 indices along `axis` (the axis kept as 1 or dropped):
 * the first extreme element, or the last with select_last_index; a NaN
 * counts as the extreme, as in PyTorch. */
static gp_status arg_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    struct gp_infer_ctx ic = gp_cpu_infer_ctx(c, err);
    const struct gp_value *xv = gp_cpu_in_value(c, 0);
    const struct gp_shape *xs = &xv->shape;
    int axis;
    GP_TRY(gp_norm_axis(&ic, gp_node_attr_int(c->node, "axis", 0), xs->rank, &axis));
    bool is_max = strcmp(c->node->op_type, "ArgMax") == 0;
    bool last = gp_node_attr_int(c->node, "select_last_index", 0) != 0;
    int64_t outer = 1, inner = 1, dim = xs->dims[axis];
    for (int d = 0; d < axis; d++) outer *= xs->dims[d];
    for (int d = axis + 1; d < xs->rank; d++) inner *= xs->dims[d];
    bool fp = gp_dtype_is_float(xv->dtype);
    int64_t *Y = c->out[0];
#pragma omp parallel for if (outer * inner * dim > GP_CPU_PAR_MIN) schedule(static)
    for (int64_t k = 0; k < outer * inner; k++) {
        int64_t base = k / inner * dim * inner + k % inner, best = 0;
        for (int64_t j = 1; j < dim; j++) {
            int64_t a = base + j * inner, b = base + best * inner;
            bool better, equal;
            if (fp) {
                double x = gp_cpu_load_f64(c->in[0], xv->dtype, a);
                double y = gp_cpu_load_f64(c->in[0], xv->dtype, b);
                if (y != y) break; /* a NaN is already selected */
                better = x != x || (is_max ? x > y : x < y);
                equal = x == y;
            } else {
                int64_t x = gp_cpu_load_i64(c->in[0], xv->dtype, a);
                int64_t y = gp_cpu_load_i64(c->in[0], xv->dtype, b);
                better = is_max ? x > y : x < y;
                equal = x == y;
            }
            if (better || (last && equal)) best = j;
        }
        Y[k] = best;
    }
    return GP_OK;
}

/* ---- the table ---- */

#define REDUCE(op) {op, NULL, NULL, reduce_forward, reduce_backward}

const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_reduce)[] = {
    REDUCE("ReduceSum"), REDUCE("ReduceMean"), REDUCE("ReduceMax"), REDUCE("ReduceMin"),
    REDUCE("ReduceProd"), REDUCE("ReduceSumSquare"), REDUCE("ReduceL2"),
    {"ArgMax", NULL, NULL, arg_forward, NULL},
    {"ArgMin", NULL, NULL, arg_forward, NULL},
    {0},
};
