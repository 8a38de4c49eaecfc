/* CPU kernels: the shape family. Reshape, Flatten, Squeeze, Unsqueeze,
 * Transpose, Concat, Split, Slice, Tile, Trilu, and the shape producers
 * (Shape, Size, ConstantOfShape, Range) that loading normally folds away.
 * Gather is in gather.c, Pad in pad.c.
 *
 * Forward moves elements by their size, so every dtype works. Transpose,
 * Concat, Split and Slice move each element once between two strided views
 * of the same index space (copy_view); their backward is the same move with
 * the roles swapped, adding gradients. Plans (permutation, split sizes,
 * slice starts and steps) come from the op layer's helpers, so kernels and
 * shape inference agree by construction. */
#include <string.h>

#include "backend/cpu/kernel_util.h"
#include "ops/fold_util.h"

/* ---- strided views ---- */

/* Moves the elements of an index space `shape` from src to dst, element
 * idx at base + sum(idx[d] * st[d]) on either side, `es` bytes each; with
 * `add`, dst (real) += src (real) instead. Both views must visit distinct
 * elements, so rows can go to different threads. */
static void copy_view(void *dst, const int64_t *dst_st, int64_t dst_base, const void *src,
                      const int64_t *src_st, int64_t src_base, const struct gp_shape *shape,
                      size_t es, bool add)
{
    int r = shape->rank;
    int64_t n = gp_shape_numel(shape);
    if (n == 0) return;
    if (r == 0) {
        if (add) ((real *)dst)[dst_base] += ((const real *)src)[src_base];
        else memcpy((char *)dst + dst_base * (int64_t)es, (const char *)src + src_base * (int64_t)es, es);
        return;
    }
    int64_t inner = shape->dims[r - 1], rows = n / inner, ds = dst_st[r - 1], ss = src_st[r - 1];
#pragma omp parallel for if (n > GP_CPU_PAR_MIN) schedule(static)
    for (int64_t row = 0; row < rows; row++) {
        int64_t d0 = dst_base, s0 = src_base, rem = row;
        for (int d = r - 2; d >= 0; d--) {
            int64_t x = rem % shape->dims[d];
            rem /= shape->dims[d];
            d0 += x * dst_st[d];
            s0 += x * src_st[d];
        }
        if (add) {
            real *D = (real *)dst + d0;
            const real *Sr = (const real *)src + s0;
            for (int64_t j = 0; j < inner; j++) D[j * ds] += Sr[j * ss];
        } else if (ds == 1 && ss == 1) {
            memcpy((char *)dst + d0 * (int64_t)es, (const char *)src + s0 * (int64_t)es,
                   (size_t)inner * es);
        } else {
            char *D = (char *)dst;
            const char *Sr = (const char *)src;
            for (int64_t j = 0; j < inner; j++)
                memcpy(D + (d0 + j * ds) * (int64_t)es, Sr + (s0 + j * ss) * (int64_t)es, es);
        }
    }
}

static void contiguous(const struct gp_shape *s, int64_t *st) { gp_shape_strides(s, st); }

/* dst [n] += src [n]. */
static void add_into(real *dst, const real *src, int64_t n)
{
#pragma omp parallel for if (n > GP_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

/* ---- Reshape, Flatten, Squeeze, Unsqueeze ---- */

/* X -> Y with the same elements in the same order. */
static gp_status copy_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    memcpy(c->out[0], c->in[0], (size_t)gp_shape_numel(gp_cpu_in_shape(c, 0)) * gp_cpu_in_esize(c, 0));
    return GP_OK;
}

static gp_status copy_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    if (c->din[0] && c->dout[0])
        add_into(c->din[0], c->dout[0], gp_shape_numel(gp_cpu_in_shape(c, 0)));
    return GP_OK;
}

/* ---- Transpose ---- */

/* X [D0..Dr-1] -> Y [D(perm[0])..]: output axis d walks input axis perm[d]. */
static gp_status transpose_view(struct gp_cpu_ctx *c, struct gp_error *err, int64_t *x_st)
{
    struct gp_infer_ctx ic = gp_cpu_infer_ctx(c, err);
    return gp_transpose_view(&ic, gp_cpu_in_shape(c, 0), x_st);
}

static gp_status transpose_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    int64_t x_st[GP_MAX_RANK], y_st[GP_MAX_RANK];
    GP_TRY(transpose_view(c, err, x_st));
    const struct gp_shape *ys = gp_cpu_out_shape(c, 0);
    contiguous(ys, y_st);
    copy_view(c->out[0], y_st, 0, c->in[0], x_st, 0, ys, gp_cpu_in_esize(c, 0), false);
    return GP_OK;
}

static gp_status transpose_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    if (!c->din[0] || !c->dout[0]) return GP_OK;
    int64_t x_st[GP_MAX_RANK], y_st[GP_MAX_RANK];
    GP_TRY(transpose_view(c, err, x_st));
    const struct gp_shape *ys = gp_cpu_out_shape(c, 0);
    contiguous(ys, y_st);
    copy_view(c->din[0], x_st, 0, c->dout[0], y_st, 0, ys, sizeof(real), true);
    return GP_OK;
}

/* ---- Concat, Split ---- */

/* Concat: X0..Xn-1 [.., Dk, ..] -> Y [.., sum Dk, ..] along axis; input k
 * is the view of Y starting at its offset along the axis. */
static gp_status concat_run(struct gp_cpu_ctx *c, struct gp_error *err, bool backward)
{
    struct gp_infer_ctx ic = gp_cpu_infer_ctx(c, err);
    const struct gp_shape *ys = gp_cpu_out_shape(c, 0);
    int axis;
    GP_TRY(gp_norm_axis(&ic, gp_node_attr_int(c->node, "axis", 0), ys->rank, &axis));
    int64_t y_st[GP_MAX_RANK], x_st[GP_MAX_RANK], at = 0;
    contiguous(ys, y_st);
    for (int k = 0; k < c->node->n_inputs; k++) {
        const struct gp_shape *xs = gp_cpu_in_shape(c, k);
        contiguous(xs, x_st);
        if (!backward)
            copy_view(c->out[0], y_st, at * y_st[axis], c->in[k], x_st, 0, xs, gp_cpu_in_esize(c, k), false);
        else if (c->din[k] && c->dout[0])
            copy_view(c->din[k], x_st, 0, c->dout[0], y_st, at * y_st[axis], xs, sizeof(real), true);
        at += xs->dims[axis];
    }
    return GP_OK;
}

static gp_status concat_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    return concat_run(c, err, false);
}

static gp_status concat_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    return concat_run(c, err, true);
}

/* Split: X [.., D, ..] -> Y0..Yn-1 [.., sizes[k], ..]: output k is the view
 * of X from the sum of the sizes before it. Sizes live in scratch. */
static size_t split_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    (void)g;
    return sizeof(int64_t) * (size_t)node->n_outputs;
}

static gp_status split_run(struct gp_cpu_ctx *c, struct gp_error *err, bool backward)
{
    struct gp_infer_ctx ic = gp_cpu_infer_ctx(c, err);
    const struct gp_shape *xs = gp_cpu_in_shape(c, 0);
    int axis;
    GP_TRY(gp_norm_axis(&ic, gp_node_attr_int(c->node, "axis", 0), xs->rank, &axis));
    int64_t *sizes = c->scratch;
    GP_TRY(gp_split_sizes(&ic, xs->dims[axis], sizes));
    int64_t x_st[GP_MAX_RANK], y_st[GP_MAX_RANK], at = 0;
    contiguous(xs, x_st);
    for (int k = 0; k < c->node->n_outputs; at += sizes[k], k++) {
        if (!c->out[k]) continue;
        struct gp_shape ys = *xs;
        ys.dims[axis] = sizes[k];
        contiguous(&ys, y_st);
        if (!backward)
            copy_view(c->out[k], y_st, 0, c->in[0], x_st, at * x_st[axis], &ys, gp_cpu_in_esize(c, 0), false);
        else if (c->din[0] && c->dout[k])
            copy_view(c->din[0], x_st, at * x_st[axis], c->dout[k], y_st, 0, &ys, sizeof(real), true);
    }
    return GP_OK;
}

static gp_status split_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    return split_run(c, err, false);
}

static gp_status split_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    return split_run(c, err, true);
}

/* ---- Slice ---- */

/* X [..] -> Y [plan.out]: output position i on axis d reads input position
 * start[d] + i * step[d] (steps may be negative). */
static gp_status slice_view(struct gp_cpu_ctx *c, struct gp_error *err, int64_t *x_st, int64_t *base)
{
    struct gp_infer_ctx ic = gp_cpu_infer_ctx(c, err);
    return gp_slice_view(&ic, gp_cpu_in_shape(c, 0), x_st, base);
}

static gp_status slice_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    int64_t x_st[GP_MAX_RANK], y_st[GP_MAX_RANK], base;
    GP_TRY(slice_view(c, err, x_st, &base));
    const struct gp_shape *ys = gp_cpu_out_shape(c, 0);
    contiguous(ys, y_st);
    copy_view(c->out[0], y_st, 0, c->in[0], x_st, base, ys, gp_cpu_in_esize(c, 0), false);
    return GP_OK;
}

static gp_status slice_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    if (!c->din[0] || !c->dout[0]) return GP_OK;
    int64_t x_st[GP_MAX_RANK], y_st[GP_MAX_RANK], base;
    GP_TRY(slice_view(c, err, x_st, &base));
    const struct gp_shape *ys = gp_cpu_out_shape(c, 0);
    contiguous(ys, y_st);
    copy_view(c->din[0], x_st, base, c->dout[0], y_st, 0, ys, sizeof(real), true);
    return GP_OK;
}

/* ---- Tile ---- */

/* X [D0..] -> Y [D0 * rep0, ..]: Y[idx] = X[idx mod D] per axis. */
static gp_status tile_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    const struct gp_shape *xs = gp_cpu_in_shape(c, 0), *ys = gp_cpu_out_shape(c, 0);
    int r = xs->rank;
    int64_t x_st[GP_MAX_RANK], n = gp_shape_numel(ys);
    size_t es = gp_cpu_in_esize(c, 0);
    contiguous(xs, x_st);
    if (n == 0) return GP_OK;
    if (r == 0) {
        memcpy(c->out[0], c->in[0], es);
        return GP_OK;
    }
    int64_t inner = ys->dims[r - 1], rows = n / inner, xin = xs->dims[r - 1];
    const char *x = c->in[0];
    char *y = c->out[0];
#pragma omp parallel for if (n > GP_CPU_PAR_MIN) schedule(static)
    for (int64_t row = 0; row < rows; row++) {
        int64_t src = 0, rem = row;
        for (int d = r - 2; d >= 0; d--) {
            src += rem % ys->dims[d] % xs->dims[d] * x_st[d];
            rem /= ys->dims[d];
        }
        for (int64_t j = 0; j < inner; j++)
            memcpy(y + (size_t)(row * inner + j) * es, x + (size_t)(src + j % xin) * es, es);
    }
    return GP_OK;
}

/* dX[idx] = sum over the repeats of dY[idx + k * D]: each input element
 * sums its own copies, in order. */
static gp_status tile_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    real *dx = c->din[0];
    const real *dy = c->dout[0];
    if (!dx || !dy) return GP_OK;
    const struct gp_shape *xs = gp_cpu_in_shape(c, 0), *ys = gp_cpu_out_shape(c, 0);
    int r = xs->rank;
    int64_t y_st[GP_MAX_RANK], rep[GP_MAX_RANK], n = gp_shape_numel(xs), copies = 1;
    contiguous(ys, y_st);
    for (int d = 0; d < r; d++) {
        rep[d] = xs->dims[d] ? ys->dims[d] / xs->dims[d] : 0;
        copies *= rep[d];
    }
#pragma omp parallel for if (n * copies > GP_CPU_PAR_MIN) schedule(static)
    for (int64_t e = 0; e < n; e++) {
        int64_t base = 0, rem = e, k[GP_MAX_RANK] = {0};
        for (int d = r - 1; d >= 0; d--) {
            base += rem % xs->dims[d] * y_st[d];
            rem /= xs->dims[d];
        }
        real acc = 0;
        for (int64_t m = 0; m < copies; m++) {
            int64_t off = base;
            for (int d = 0; d < r; d++) off += k[d] * xs->dims[d] * y_st[d];
            acc += dy[off];
            for (int d = r - 1; d >= 0 && ++k[d] == rep[d]; d--) k[d] = 0;
        }
        dx[e] += acc;
    }
    return GP_OK;
}

/* ---- Trilu ---- */

/* X [.., rows, cols] -> Y: keeps the elements on or above (upper) / on or
 * below (lower) diagonal k (input 1, an int64 scalar, default 0) of each
 * matrix, zeroes the rest. */
static inline bool trilu_keep(int64_t i, int64_t rows_cols, int64_t cols, int64_t k, bool upper)
{
    int64_t in_mat = i % rows_cols, diag = in_mat % cols - in_mat / cols;
    return upper ? diag >= k : diag <= k;
}

static gp_status trilu_run(struct gp_cpu_ctx *c, struct gp_error *err, bool backward)
{
    (void)err;
    const struct gp_shape *xs = gp_cpu_in_shape(c, 0);
    int64_t n = gp_shape_numel(xs), cols = xs->dims[xs->rank - 1];
    int64_t rc = cols * xs->dims[xs->rank - 2];
    int64_t k = c->node->n_inputs > 1 && c->in[1] ? *(const int64_t *)c->in[1] : 0;
    bool upper = gp_node_attr_int(c->node, "upper", 1) != 0;
    if (backward) {
        real *dx = c->din[0];
        const real *dy = c->dout[0];
        if (!dx || !dy) return GP_OK;
#pragma omp parallel for if (n > GP_CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            if (trilu_keep(i, rc, cols, k, upper)) dx[i] += dy[i];
        return GP_OK;
    }
    size_t es = gp_cpu_in_esize(c, 0);
    const char *x = c->in[0];
    char *y = c->out[0];
#pragma omp parallel for if (n > GP_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        if (trilu_keep(i, rc, cols, k, upper)) memcpy(y + (size_t)i * es, x + (size_t)i * es, es);
        else memset(y + (size_t)i * es, 0, es);
    }
    return GP_OK;
}

static gp_status trilu_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    return trilu_run(c, err, false);
}

static gp_status trilu_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    return trilu_run(c, err, true);
}

/* ---- Shape, Size, ConstantOfShape, Range ---- */

/* X -> int64 [end - start]: X's static dimensions start..end-1 (Shape-15's
 * window; negative counts from the back, both clamp to [0, rank]). */
static gp_status shape_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    const struct gp_shape *xs = gp_cpu_in_shape(c, 0);
    int64_t r = xs->rank, s = gp_node_attr_int(c->node, "start", 0);
    int64_t e = gp_node_attr_int(c->node, "end", r);
    if (s < 0) s += r;
    if (e < 0) e += r;
    s = s < 0 ? 0 : s > r ? r : s;
    e = e < s ? s : e > r ? r : e;
    int64_t *y = c->out[0];
    for (int64_t d = s; d < e; d++) y[d - s] = xs->dims[d];
    return GP_OK;
}

static gp_status size_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    *(int64_t *)c->out[0] = gp_shape_numel(gp_cpu_in_shape(c, 0));
    return GP_OK;
}

/* shape (int64 [r]) -> Y [shape] filled with the value attribute's one
 * element (float 0 by default). */
static gp_status constant_of_shape_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    const struct gp_value *y = gp_cpu_out_value(c, 0);
    int64_t n = gp_shape_numel(&y->shape);
    const struct gp_attr *a = gp_node_attr(c->node, "value");
    for (int64_t i = 0; i < n; i++) {
        if (!a || !a->t) gp_cpu_store_f64(c->out[0], y->dtype, i, 0);
        else if (gp_dtype_is_float(a->t->dtype)) gp_cpu_store_f64(c->out[0], y->dtype, i, gp_tensor_get_f64(a->t, 0));
        else gp_cpu_store_i64(c->out[0], y->dtype, i, gp_tensor_get_i64(a->t, 0));
    }
    return GP_OK;
}

/* start, limit, delta (scalars) -> Y [n] = start + i * delta; n is the
 * output's static length. Integers wrap like int64 arithmetic. */
static gp_status range_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    const struct gp_value *y = gp_cpu_out_value(c, 0);
    int64_t n = gp_shape_numel(&y->shape);
    if (gp_dtype_is_float(y->dtype)) {
        double s = gp_cpu_load_f64(c->in[0], y->dtype, 0), d = gp_cpu_load_f64(c->in[2], y->dtype, 0);
        for (int64_t i = 0; i < n; i++) gp_cpu_store_f64(c->out[0], y->dtype, i, s + (double)i * d);
    } else {
        uint64_t s = (uint64_t)gp_cpu_load_i64(c->in[0], y->dtype, 0);
        uint64_t d = (uint64_t)gp_cpu_load_i64(c->in[2], y->dtype, 0);
        for (int64_t i = 0; i < n; i++)
            gp_cpu_store_i64(c->out[0], y->dtype, i, (int64_t)(s + (uint64_t)i * d));
    }
    return GP_OK;
}

/* ---- the table ---- */

#define COPY(op) {op, NULL, NULL, copy_forward, copy_backward}
#define NO_GRAD(op, fwd) {op, NULL, NULL, fwd, NULL}

const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_shape)[] = {
    COPY("Reshape"), COPY("Flatten"), COPY("Squeeze"), COPY("Unsqueeze"),
    {"Transpose", NULL, NULL, transpose_forward, transpose_backward},
    {"Concat", NULL, NULL, concat_forward, concat_backward},
    {"Split", NULL, split_scratch, split_forward, split_backward},
    {"Slice", NULL, NULL, slice_forward, slice_backward},
    {"Tile", NULL, NULL, tile_forward, tile_backward},
    {"Trilu", NULL, NULL, trilu_forward, trilu_backward},
    NO_GRAD("Shape", shape_forward),
    NO_GRAD("Size", size_forward),
    NO_GRAD("ConstantOfShape", constant_of_shape_forward),
    NO_GRAD("Range", range_forward),
    {0},
};
