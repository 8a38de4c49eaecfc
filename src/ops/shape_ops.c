/* Shape ops: Shape, Size, Reshape, Flatten, Transpose, Squeeze, Unsqueeze,
 * Concat, Split, Slice, Gather, ScatterND, ConstantOfShape, Range, Constant,
 * Tile and Trilu.
 *
 * Exporters compute reshape targets at run time from Shape(x); once the
 * batch axis is bound, Shape folds from shapes alone (GP_FOLD_SHAPES) and
 * the arithmetic after it folds from constants, so every "must be known at
 * load time" input below (targets, axes, starts, repeats) is usually the
 * result of such a chain. Folds move elements by their byte size, so they
 * work for every dtype. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ops/families.h"
#include "ops/fold_util.h"

static unsigned char *bytes(const struct gp_tensor *t) { return (unsigned char *)t->data; }

/* Ops whose output holds the input's elements in the same order. */
static gp_status fold_copy(struct gp_infer_ctx *ctx)
{
    const struct gp_tensor *x = gp_in(ctx, 0)->constant;
    struct gp_tensor *o = gp_fold_out(ctx, 0);
    if (!o) return GP_ERR_NOMEM;
    memcpy(o->data, x->data, o->nbytes);
    return GP_OK;
}

/* ---- Shape, Size ---- */

/* Shape-15's start/end: negative counts from the back, both clamp to [0, rank]. */
static void shape_window(const struct gp_node *node, int rank, int64_t *start, int64_t *end)
{
    int64_t s = gp_node_attr_int(node, "start", 0), e = gp_node_attr_int(node, "end", rank);
    if (s < 0) s += rank;
    if (e < 0) e += rank;
    s = s < 0 ? 0 : s > rank ? rank : s;
    e = e < 0 ? 0 : e > rank ? rank : e;
    *start = s;
    *end = e < s ? s : e;
}

static gp_status infer_shape(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    int64_t s, e;
    shape_window(ctx->node, x->shape.rank, &s, &e);
    struct gp_shape out = {.rank = 1, .dims = {e - s}};
    gp_set_out(ctx, 0, GP_DTYPE_INT64, &out);
    return GP_OK;
}

static gp_status fold_shape(struct gp_infer_ctx *ctx)
{
    const struct gp_value *x = gp_in(ctx, 0);
    struct gp_tensor *o = gp_fold_out(ctx, 0);
    if (!o) return GP_ERR_NOMEM;
    int64_t s, e;
    shape_window(ctx->node, x->shape.rank, &s, &e);
    for (int64_t i = s; i < e; i++) gp_tensor_set_i64(o, i - s, x->shape.dims[i]);
    return GP_OK;
}

static gp_status infer_size(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    struct gp_shape out = {.rank = 0};
    gp_set_out(ctx, 0, GP_DTYPE_INT64, &out);
    return GP_OK;
}

static gp_status fold_size(struct gp_infer_ctx *ctx)
{
    struct gp_tensor *o = gp_fold_out(ctx, 0);
    if (!o) return GP_ERR_NOMEM;
    gp_tensor_set_i64(o, 0, gp_shape_numel(&gp_in(ctx, 0)->shape));
    return GP_OK;
}

/* ---- Reshape, Flatten ---- */

#define BATCH_HINT                                                                         \
    "the target shape may bake in the batch size used at export: export with a dynamic " \
    "batch axis (dynamic_axes={'input': {0: 'batch'}})"

static gp_status reshape_mismatch(struct gp_infer_ctx *ctx, const struct gp_shape *in,
                                  const int64_t *target, int n, bool has_wild, int64_t known)
{
    char si[160], st[160], batch[160] = "";
    gp_shape_format(in, si, sizeof si);
    gp_ints_format(target, n, st, sizeof st);
    const struct gp_graph *g = ctx->graph;
    if (g->export_batch > 0 && g->export_batch != g->batch)
        snprintf(batch, sizeof batch,
                 " (the model was exported with batch size %lld and is loaded with %lld)",
                 (long long)g->export_batch, (long long)g->batch);
    long long total = (long long)gp_shape_numel(in);
    if (has_wild)
        return gp_op_error(ctx, GP_ERR_SHAPE,
                           "Reshape target %s cannot hold the %lld elements of the input %s: "
                           "%lld is not a multiple of %lld, the product of the other target "
                           "dimensions%s; %s",
                           st, total, si, total, (long long)known, batch, BATCH_HINT);
    return gp_op_error(ctx, GP_ERR_SHAPE,
                       "Reshape target %s has %lld elements but the input %s has %lld%s; %s", st,
                       (long long)known, si, total, batch, BATCH_HINT);
}

/* 0 copies the input's dimension (unless allowzero), one -1 takes what is left. */
static gp_status infer_reshape(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    int64_t t[GP_MAX_RANK];
    int n;
    GP_TRY(gp_const_ints(ctx, 1, "shape", t, GP_MAX_RANK, &n));
    if (gp_in(ctx, 1)->constant->shape.rank != 1)
        return gp_op_error(ctx, GP_ERR_INVALID, "the target shape (input 1) must be 1-D");
    bool allowzero = gp_node_attr_int(ctx->node, "allowzero", 0) != 0;
    char st[160];
    struct gp_shape out = {.rank = n};
    int wild = -1;
    bool has_zero = false;
    int64_t known = 1;
    for (int d = 0; d < n; d++) {
        int64_t v = t[d];
        if (v == -1) {
            if (wild >= 0)
                return gp_op_error(ctx, GP_ERR_SHAPE, "Reshape target %s has more than one -1",
                                   gp_ints_format(t, n, st, sizeof st));
            wild = d;
            continue;
        }
        if (v < -1)
            return gp_op_error(ctx, GP_ERR_SHAPE,
                               "Reshape target %s has the invalid dimension %lld",
                               gp_ints_format(t, n, st, sizeof st), (long long)v);
        if (v == 0 && !allowzero) {
            if (d >= x->shape.rank) {
                char si[160];
                return gp_op_error(ctx, GP_ERR_SHAPE,
                                   "Reshape target %s copies dimension %d (a 0), but the input %s "
                                   "has rank %d",
                                   gp_ints_format(t, n, st, sizeof st), d,
                                   gp_shape_format(&x->shape, si, sizeof si), x->shape.rank);
            }
            v = x->shape.dims[d];
        } else if (v == 0) {
            has_zero = true;
        }
        if (v != 0 && known > INT64_MAX / v)
            return gp_op_error(ctx, GP_ERR_SHAPE, "Reshape target %s is too large",
                               gp_ints_format(t, n, st, sizeof st));
        out.dims[d] = v;
        known *= v;
    }
    if (wild >= 0 && has_zero)
        return gp_op_error(ctx, GP_ERR_SHAPE,
                           "Reshape target %s has both -1 and a literal 0 (allowzero=1), which "
                           "leaves the -1 undetermined",
                           gp_ints_format(t, n, st, sizeof st));
    int64_t total = gp_shape_numel(&x->shape);
    if (wild >= 0) {
        if (known == 0 || total % known != 0)
            return reshape_mismatch(ctx, &x->shape, t, n, true, known);
        out.dims[wild] = total / known;
    } else if (known != total) {
        return reshape_mismatch(ctx, &x->shape, t, n, false, known);
    }
    gp_set_out(ctx, 0, x->dtype, &out);
    return GP_OK;
}

static gp_status infer_flatten(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    int r = x->shape.rank;
    int64_t axis = gp_node_attr_int(ctx->node, "axis", 1);
    if (axis < -r || axis > r) /* axis == rank is valid: [numel, 1] */
        return gp_op_error(ctx, GP_ERR_INVALID, "axis %lld is out of range for rank %d",
                           (long long)axis, r);
    if (axis < 0) axis += r;
    struct gp_shape out = {.rank = 2, .dims = {1, 1}};
    for (int d = 0; d < r; d++) out.dims[d < axis ? 0 : 1] *= x->shape.dims[d];
    gp_set_out(ctx, 0, x->dtype, &out);
    return GP_OK;
}

/* ---- Transpose ---- */

static gp_status infer_transpose(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    int perm[GP_MAX_RANK];
    GP_TRY(gp_transpose_perm(ctx, x->shape.rank, perm));
    struct gp_shape out = {.rank = x->shape.rank};
    for (int d = 0; d < out.rank; d++) out.dims[d] = x->shape.dims[perm[d]];
    gp_set_out(ctx, 0, x->dtype, &out);
    return GP_OK;
}

static gp_status fold_transpose(struct gp_infer_ctx *ctx)
{
    const struct gp_tensor *x = gp_in(ctx, 0)->constant;
    struct gp_tensor *o = gp_fold_out(ctx, 0);
    if (!o) return GP_ERR_NOMEM;
    int64_t strides[GP_MAX_RANK];
    GP_TRY(gp_transpose_view(ctx, &x->shape, strides));
    gp_copy_strided(o->data, x->data, gp_dtype_size(x->dtype), &o->shape, strides, 0);
    return GP_OK;
}

/* ---- Squeeze, Unsqueeze ---- */

/* Axes from input 1 (version 13) or the attribute (version 1); -1 when
 * neither is present. */
static gp_status read_axes(struct gp_infer_ctx *ctx, int64_t *axes, int *n)
{
    if (gp_in(ctx, 1)) return gp_const_ints(ctx, 1, "axes", axes, GP_MAX_RANK, n);
    const int64_t *a;
    int64_t count = gp_node_attr_ints(ctx->node, "axes", &a);
    if (count > GP_MAX_RANK)
        return gp_op_error(ctx, GP_ERR_UNSUPPORTED, "%lld axes; at most %d are supported",
                           (long long)count, GP_MAX_RANK);
    for (int64_t i = 0; i < count; i++) axes[i] = a[i];
    *n = (int)count;
    return GP_OK;
}

/* Normalizes axes against `rank` into a mask, rejecting repeats. */
static gp_status axes_mask(struct gp_infer_ctx *ctx, const int64_t *axes, int n, int rank,
                           bool *mask)
{
    memset(mask, 0, GP_MAX_RANK * sizeof *mask);
    for (int i = 0; i < n; i++) {
        int a;
        GP_TRY(gp_norm_axis(ctx, axes[i], rank, &a));
        if (mask[a]) return gp_op_error(ctx, GP_ERR_INVALID, "axis %d is listed twice", a);
        mask[a] = true;
    }
    return GP_OK;
}

static gp_status infer_squeeze(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    int64_t axes[GP_MAX_RANK];
    int n = -1;
    GP_TRY(read_axes(ctx, axes, &n));
    const struct gp_shape *in = &x->shape;
    bool mask[GP_MAX_RANK];
    if (n > 0) {
        GP_TRY(axes_mask(ctx, axes, n, in->rank, mask));
    } else { /* no axes (or an empty list, as onnxruntime reads it): every size-1 axis goes */
        for (int d = 0; d < in->rank; d++) mask[d] = in->dims[d] == 1;
    }
    struct gp_shape out = {.rank = 0};
    for (int d = 0; d < in->rank; d++) {
        if (!mask[d]) {
            out.dims[out.rank++] = in->dims[d];
        } else if (in->dims[d] != 1) {
            char s[160];
            return gp_op_error(ctx, GP_ERR_SHAPE, "cannot squeeze axis %d of size %lld (input %s)",
                               d, (long long)in->dims[d], gp_shape_format(in, s, sizeof s));
        }
    }
    gp_set_out(ctx, 0, x->dtype, &out);
    return GP_OK;
}

static gp_status infer_unsqueeze(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    int64_t axes[GP_MAX_RANK];
    int n = -1;
    GP_TRY(read_axes(ctx, axes, &n));
    if (n < 0) return gp_op_error(ctx, GP_ERR_INVALID, "axes are required");
    int rank = x->shape.rank + n;
    if (rank > GP_MAX_RANK)
        return gp_op_error(ctx, GP_ERR_UNSUPPORTED, "output rank %d exceeds the supported %d",
                           rank, GP_MAX_RANK);
    bool mask[GP_MAX_RANK];
    GP_TRY(axes_mask(ctx, axes, n, rank, mask)); /* axes index the output */
    struct gp_shape out = {.rank = rank};
    for (int d = 0, k = 0; d < rank; d++) out.dims[d] = mask[d] ? 1 : x->shape.dims[k++];
    gp_set_out(ctx, 0, x->dtype, &out);
    return GP_OK;
}

/* ---- Concat ---- */

static gp_status infer_concat(struct gp_infer_ctx *ctx)
{
    struct gp_value *first;
    GP_TRY(gp_req_in(ctx, 0, &first));
    const struct gp_shape *s0 = &first->shape;
    if (s0->rank == 0)
        return gp_op_error(ctx, GP_ERR_SHAPE, "cannot concatenate scalars (rank 0)");
    if (!gp_node_attr(ctx->node, "axis"))
        return gp_op_error(ctx, GP_ERR_INVALID, "attribute 'axis' is required");
    int axis;
    GP_TRY(gp_norm_axis(ctx, gp_node_attr_int(ctx->node, "axis", 0), s0->rank, &axis));
    GP_TRY(gp_same_dtype(ctx, 0, ctx->node->n_inputs - 1));
    struct gp_shape out = *s0;
    for (int i = 1; i < ctx->node->n_inputs; i++) {
        struct gp_value *v;
        GP_TRY(gp_req_in(ctx, i, &v));
        bool ok = v->shape.rank == s0->rank;
        for (int d = 0; ok && d < s0->rank; d++) ok = d == axis || v->shape.dims[d] == s0->dims[d];
        if (!ok) {
            char a[160], b[160];
            return gp_op_error(ctx, GP_ERR_SHAPE,
                               "input %d has shape %s, which differs from input 0's %s outside "
                               "axis %d",
                               i, gp_shape_format(&v->shape, a, sizeof a),
                               gp_shape_format(s0, b, sizeof b), axis);
        }
        out.dims[axis] += v->shape.dims[axis];
    }
    GP_TRY(gp_check_shape(ctx, &out));
    gp_set_out(ctx, 0, first->dtype, &out);
    return GP_OK;
}

static gp_status fold_concat(struct gp_infer_ctx *ctx)
{
    struct gp_tensor *o = gp_fold_out(ctx, 0);
    if (!o) return GP_ERR_NOMEM;
    int axis;
    GP_TRY(gp_norm_axis(ctx, gp_node_attr_int(ctx->node, "axis", 0), o->shape.rank, &axis));
    size_t es = gp_dtype_size(o->dtype);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= o->shape.dims[d];
    for (int d = axis + 1; d < o->shape.rank; d++) inner *= o->shape.dims[d];
    /* Row `r` of the output ([outer, sum of axis dims, inner]) is input 0's
     * row r, then input 1's, and so on. */
    unsigned char *dst = o->data;
    for (int64_t r = 0; r < outer; r++) {
        for (int i = 0; i < ctx->node->n_inputs; i++) {
            const struct gp_tensor *t = gp_in(ctx, i)->constant;
            size_t chunk = (size_t)(t->shape.dims[axis] * inner) * es;
            memcpy(dst, bytes(t) + (size_t)r * chunk, chunk);
            dst += chunk;
        }
    }
    return GP_OK;
}

/* ---- Split ---- */

/* One size per output; load-time arena memory, freed with the graph. */
static int64_t *split_buffer(struct gp_infer_ctx *ctx)
{
    int64_t *sizes = gp_arena_alloc(&ctx->graph->arena, (size_t)ctx->node->n_outputs * 8);
    if (!sizes) gp_op_error(ctx, GP_ERR_NOMEM, "out of memory");
    return sizes;
}

static gp_status infer_split(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    int axis;
    GP_TRY(gp_norm_axis(ctx, gp_node_attr_int(ctx->node, "axis", 0), x->shape.rank, &axis));
    int64_t *sizes = split_buffer(ctx);
    if (!sizes) return GP_ERR_NOMEM;
    GP_TRY(gp_split_sizes(ctx, x->shape.dims[axis], sizes));
    for (int k = 0; k < ctx->node->n_outputs; k++) {
        struct gp_shape s = x->shape;
        s.dims[axis] = sizes[k];
        gp_set_out(ctx, k, x->dtype, &s);
    }
    return GP_OK;
}

static gp_status fold_split(struct gp_infer_ctx *ctx)
{
    const struct gp_tensor *x = gp_in(ctx, 0)->constant;
    int axis;
    GP_TRY(gp_norm_axis(ctx, gp_node_attr_int(ctx->node, "axis", 0), x->shape.rank, &axis));
    int64_t *sizes = split_buffer(ctx), strides[GP_MAX_RANK], base = 0;
    if (!sizes) return GP_ERR_NOMEM;
    GP_TRY(gp_split_sizes(ctx, x->shape.dims[axis], sizes));
    gp_shape_strides(&x->shape, strides);
    for (int k = 0; k < ctx->node->n_outputs; base += sizes[k], k++) {
        if (!gp_out(ctx, k)) continue;
        struct gp_tensor *o = gp_fold_out(ctx, k);
        if (!o) return GP_ERR_NOMEM;
        gp_copy_strided(o->data, x->data, gp_dtype_size(x->dtype), &o->shape, strides,
                        base * strides[axis]);
    }
    return GP_OK;
}

/* ---- Slice ---- */

static gp_status infer_slice(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    struct gp_slice_plan p;
    GP_TRY(gp_slice_plan(ctx, &x->shape, &p));
    gp_set_out(ctx, 0, x->dtype, &p.out);
    return GP_OK;
}

static gp_status fold_slice(struct gp_infer_ctx *ctx)
{
    const struct gp_tensor *x = gp_in(ctx, 0)->constant;
    int64_t strides[GP_MAX_RANK], base = 0;
    GP_TRY(gp_slice_view(ctx, &x->shape, strides, &base));
    struct gp_tensor *o = gp_fold_out(ctx, 0);
    if (!o) return GP_ERR_NOMEM;
    gp_copy_strided(o->data, x->data, gp_dtype_size(x->dtype), &o->shape, strides, base);
    return GP_OK;
}

/* ---- Gather ---- */

/* Index j of `idx` as a position on an axis of size `dim` (negative counts
 * from the end); fails naming the index when out of range. */
static gp_status gather_index(struct gp_infer_ctx *ctx, const struct gp_tensor *idx, int64_t j,
                              int axis, int64_t dim, int64_t *out)
{
    int64_t k = gp_tensor_get_i64(idx, j);
    if (k < -dim || k >= dim)
        return gp_op_error(ctx, GP_ERR_INVALID,
                           "index %lld is out of range for axis %d of size %lld", (long long)k,
                           axis, (long long)dim);
    *out = k < 0 ? k + dim : k;
    return GP_OK;
}

/* data [pre..., dim, post...], indices [q...] -> [pre..., q..., post...] */
static gp_status infer_gather(struct gp_infer_ctx *ctx)
{
    struct gp_value *x, *idx;
    GP_TRY(gp_req_in(ctx, 0, &x));
    GP_TRY(gp_req_in(ctx, 1, &idx));
    GP_TRY(gp_want_int_index(ctx, 1));
    const struct gp_shape *xs = &x->shape, *is = &idx->shape;
    if (xs->rank == 0) return gp_op_error(ctx, GP_ERR_SHAPE, "data must have rank >= 1");
    int axis;
    GP_TRY(gp_norm_axis(ctx, gp_node_attr_int(ctx->node, "axis", 0), xs->rank, &axis));
    int rank = xs->rank - 1 + is->rank;
    if (rank > GP_MAX_RANK)
        return gp_op_error(ctx, GP_ERR_UNSUPPORTED, "output rank %d exceeds the supported %d",
                           rank, GP_MAX_RANK);
    struct gp_shape out = {.rank = 0};
    for (int d = 0; d < axis; d++) out.dims[out.rank++] = xs->dims[d];
    for (int d = 0; d < is->rank; d++) out.dims[out.rank++] = is->dims[d];
    for (int d = axis + 1; d < xs->rank; d++) out.dims[out.rank++] = xs->dims[d];
    GP_TRY(gp_check_shape(ctx, &out));
    /* Constant indices into data (an embedding looked up at fixed
     * positions) are checked now even when the data is not folded. */
    if (idx->constant) {
        int64_t k, n = gp_shape_numel(is);
        for (int64_t j = 0; j < n; j++)
            GP_TRY(gather_index(ctx, idx->constant, j, axis, xs->dims[axis], &k));
    }
    gp_set_out(ctx, 0, x->dtype, &out);
    return GP_OK;
}

static gp_status fold_gather(struct gp_infer_ctx *ctx)
{
    const struct gp_tensor *x = gp_in(ctx, 0)->constant, *idx = gp_in(ctx, 1)->constant;
    struct gp_tensor *o = gp_fold_out(ctx, 0);
    if (!o) return GP_ERR_NOMEM;
    int axis;
    GP_TRY(gp_norm_axis(ctx, gp_node_attr_int(ctx->node, "axis", 0), x->shape.rank, &axis));
    int64_t outer = 1, inner = 1, dim = x->shape.dims[axis], n = gp_shape_numel(&idx->shape);
    for (int d = 0; d < axis; d++) outer *= x->shape.dims[d];
    for (int d = axis + 1; d < x->shape.rank; d++) inner *= x->shape.dims[d];
    size_t row = (size_t)inner * gp_dtype_size(x->dtype);
    unsigned char *dst = o->data;
    for (int64_t r = 0; r < outer; r++) {
        for (int64_t j = 0; j < n; j++, dst += row) {
            int64_t k = 0;
            GP_TRY(gather_index(ctx, idx, j, axis, dim, &k));
            memcpy(dst, bytes(x) + (size_t)(r * dim + k) * row, row);
        }
    }
    return GP_OK;
}

/* ---- ScatterND ----
 * out = data with updates written at indices: indices [..., k] address the
 * first k axes of data, updates [..., data.shape[k:]]. Exporters make it of
 * an indexed assignment (swin's shifted-window mask, `mask[h, w] = n`),
 * from shapes and constants, so it folds at load time. There is no kernel:
 * it must fold (GP_FOLD_REQUIRED), and one whose inputs depend on data or
 * trainable parameters is refused at load, naming the input. Reductions
 * (16+): none, add, mul, max, min. */

static gp_status infer_scatter_nd(struct gp_infer_ctx *ctx)
{
    struct gp_value *x, *idx, *upd;
    GP_TRY(gp_req_in(ctx, 0, &x));
    GP_TRY(gp_req_in(ctx, 1, &idx));
    GP_TRY(gp_req_in(ctx, 2, &upd));
    GP_TRY(gp_want_int_index(ctx, 1));
    const struct gp_shape *xs = &x->shape, *is = &idx->shape, *us = &upd->shape;
    if (is->rank == 0) return gp_op_error(ctx, GP_ERR_SHAPE, "indices must have rank >= 1");
    int64_t k = is->dims[is->rank - 1];
    if (k < 1 || k > xs->rank)
        return gp_op_error(ctx, GP_ERR_SHAPE, "indices address %lld axes of data of rank %d", (long long)k,
                           xs->rank);
    /* updates: indices' shape without its last axis, then data's from axis k. */
    int want = is->rank - 1 + xs->rank - (int)k;
    bool ok = us->rank == want;
    for (int d = 0; ok && d < is->rank - 1; d++) ok = us->dims[d] == is->dims[d];
    for (int d = (int)k; ok && d < xs->rank; d++) ok = us->dims[is->rank - 1 + d - (int)k] == xs->dims[d];
    if (!ok) return gp_op_error(ctx, GP_ERR_SHAPE, "updates have the wrong shape for these indices and data");
    if (upd->dtype != x->dtype)
        return gp_op_error(ctx, GP_ERR_INVALID, "updates are %s but data is %s", gp_dtype_name(upd->dtype),
                           gp_dtype_name(x->dtype));
    const char *red = gp_node_attr_string(ctx->node, "reduction", "none");
    if (strcmp(red, "none") && strcmp(red, "add") && strcmp(red, "mul") && strcmp(red, "max") && strcmp(red, "min"))
        return gp_op_error(ctx, GP_ERR_INVALID, "reduction '%s' is not none, add, mul, max or min", red);
    gp_set_out(ctx, 0, x->dtype, xs);
    return GP_OK;
}

static gp_status fold_scatter_nd(struct gp_infer_ctx *ctx)
{
    const struct gp_tensor *x = gp_in(ctx, 0)->constant, *idx = gp_in(ctx, 1)->constant,
                           *upd = gp_in(ctx, 2)->constant;
    struct gp_tensor *o = gp_fold_out(ctx, 0);
    if (!o) return GP_ERR_NOMEM;
    memcpy(o->data, x->data, x->nbytes);
    const struct gp_shape *xs = &x->shape, *is = &idx->shape;
    int k = (int)is->dims[is->rank - 1];
    int64_t slice = 1;
    for (int d = k; d < xs->rank; d++) slice *= xs->dims[d];
    int64_t n = gp_shape_numel(is) / k;
    const char *red = gp_node_attr_string(ctx->node, "reduction", "none");
    size_t es = gp_dtype_size(x->dtype);
    for (int64_t j = 0; j < n; j++) {
        int64_t at = 0;
        for (int d = 0; d < k; d++) {
            int64_t v = gp_tensor_get_i64(idx, j * k + d), dim = xs->dims[d];
            if (v < -dim || v >= dim)
                return gp_op_error(ctx, GP_ERR_INVALID, "index %lld is out of range for axis %d of size %lld",
                                   (long long)v, d, (long long)dim);
            at = at * dim + (v < 0 ? v + dim : v);
        }
        at *= slice;
        if (!strcmp(red, "none")) {
            memcpy(bytes(o) + (size_t)at * es, bytes(upd) + (size_t)(j * slice) * es, (size_t)slice * es);
            continue;
        }
        for (int64_t e = 0; e < slice; e++) {
            double a = gp_tensor_get_f64(o, at + e), b = gp_tensor_get_f64(upd, j * slice + e);
            double r = !strcmp(red, "add") ? a + b : !strcmp(red, "mul") ? a * b : !strcmp(red, "max") ? fmax(a, b)
                                                                                                      : fmin(a, b);
            gp_tensor_set_f64(o, at + e, r);
        }
    }
    return GP_OK;
}

/* ---- ConstantOfShape, Range, Constant ---- */

static gp_status infer_constant_of_shape(struct gp_infer_ctx *ctx)
{
    int64_t dims[GP_MAX_RANK];
    int n;
    GP_TRY(gp_const_ints(ctx, 0, "shape", dims, GP_MAX_RANK, &n));
    struct gp_shape out = {.rank = n};
    for (int d = 0; d < n; d++) out.dims[d] = dims[d];
    GP_TRY(gp_check_shape(ctx, &out));
    const struct gp_attr *a = gp_node_attr(ctx->node, "value");
    enum gp_dtype dtype = GP_DTYPE_FLOAT32; /* ONNX's default: float 0 */
    if (a) {
        if (!a->t || gp_shape_numel(&a->t->shape) != 1 || gp_dtype_size(a->t->dtype) == 0)
            return gp_op_error(ctx, GP_ERR_INVALID,
                               "attribute value must be a one-element numeric tensor");
        dtype = a->t->dtype;
    }
    gp_set_out(ctx, 0, dtype, &out);
    return GP_OK;
}

static gp_status fold_constant_of_shape(struct gp_infer_ctx *ctx)
{
    struct gp_tensor *o = gp_fold_out(ctx, 0);
    if (!o) return GP_ERR_NOMEM;
    const struct gp_attr *a = gp_node_attr(ctx->node, "value");
    if (!a) return GP_OK; /* zeroed already */
    size_t es = gp_dtype_size(o->dtype);
    int64_t n = gp_shape_numel(&o->shape);
    for (int64_t i = 0; i < n; i++) memcpy(bytes(o) + (size_t)i * es, a->t->data, es);
    return GP_OK;
}

/* Elements from start to limit (exclusive) by delta: max(ceil((limit -
 * start) / delta), 0) of them. Integers count exactly in uint64, since
 * limit - start can exceed int64. */
static gp_status range_length(struct gp_infer_ctx *ctx, const struct gp_tensor *const t[3],
                              int64_t *len)
{
    if (gp_dtype_is_float(t[0]->dtype)) {
        double s = gp_tensor_get_f64(t[0], 0), l = gp_tensor_get_f64(t[1], 0),
               d = gp_tensor_get_f64(t[2], 0);
        double n = d != 0 ? ceil((l - s) / d) : NAN;
        if (!(n < 9.0e18))
            return gp_op_error(ctx, GP_ERR_INVALID, "Range(%g, %g, %g) has no finite length", s,
                               l, d);
        *len = n > 0 ? (int64_t)n : 0;
        return GP_OK;
    }
    int64_t s = gp_tensor_get_i64(t[0], 0), l = gp_tensor_get_i64(t[1], 0),
            d = gp_tensor_get_i64(t[2], 0);
    if (d == 0) return gp_op_error(ctx, GP_ERR_INVALID, "Range delta is 0");
    uint64_t span, step;
    if (d > 0) span = l > s ? (uint64_t)l - (uint64_t)s : 0, step = (uint64_t)d;
    else span = s > l ? (uint64_t)s - (uint64_t)l : 0, step = (uint64_t)0 - (uint64_t)d;
    uint64_t n = span ? (span - 1) / step + 1 : 0;
    if (n > (uint64_t)INT64_MAX) return gp_op_error(ctx, GP_ERR_SHAPE, "Range is too long");
    *len = (int64_t)n;
    return GP_OK;
}

static gp_status range_inputs(struct gp_infer_ctx *ctx, const struct gp_tensor *t[3])
{
    static const char *const names[3] = {"start", "limit", "delta"};
    for (int i = 0; i < 3; i++) {
        GP_TRY(gp_need_const(ctx, i, &t[i]));
        if (gp_shape_numel(&t[i]->shape) != 1)
            return gp_op_error(ctx, GP_ERR_SHAPE, "%s (input %d) must be a scalar", names[i], i);
    }
    GP_TRY(gp_want_numeric(ctx, 0));
    return gp_same_dtype(ctx, 0, 2);
}

static gp_status infer_range(struct gp_infer_ctx *ctx)
{
    const struct gp_tensor *t[3];
    GP_TRY(range_inputs(ctx, t));
    struct gp_shape out = {.rank = 1};
    GP_TRY(range_length(ctx, t, &out.dims[0]));
    GP_TRY(gp_check_shape(ctx, &out));
    gp_set_out(ctx, 0, t[0]->dtype, &out);
    return GP_OK;
}

static gp_status fold_range(struct gp_infer_ctx *ctx)
{
    const struct gp_tensor *t[3];
    GP_TRY(range_inputs(ctx, t));
    struct gp_tensor *o = gp_fold_out(ctx, 0);
    if (!o) return GP_ERR_NOMEM;
    int64_t n = o->shape.dims[0];
    /* start + i * delta rather than a running sum, so float error does not
     * accumulate; integers wrap like the int64 arithmetic they stand for. */
    if (gp_dtype_is_float(o->dtype)) {
        double s = gp_tensor_get_f64(t[0], 0), d = gp_tensor_get_f64(t[2], 0);
        for (int64_t i = 0; i < n; i++) gp_tensor_set_f64(o, i, s + (double)i * d);
    } else {
        uint64_t s = (uint64_t)gp_tensor_get_i64(t[0], 0), d = (uint64_t)gp_tensor_get_i64(t[2], 0);
        for (int64_t i = 0; i < n; i++) gp_tensor_set_i64(o, i, (int64_t)(s + (uint64_t)i * d));
    }
    return GP_OK;
}

static const char *const constant_attrs[] = {
    "value", "value_float", "value_floats", "value_int", "value_ints",
    "value_string", "value_strings",
};

/* The one value attribute a Constant node carries (index into constant_attrs). */
static gp_status constant_attr(struct gp_infer_ctx *ctx, const struct gp_attr **out, int *which)
{
    int found = 0;
    for (int k = 0; k < 7; k++) {
        const struct gp_attr *a = gp_node_attr(ctx->node, constant_attrs[k]);
        if (a) *out = a, *which = k, found++;
    }
    if (found != 1)
        return gp_op_error(ctx, GP_ERR_INVALID, "needs exactly one value attribute, found %d",
                           found);
    if (*which >= 5)
        return gp_op_error(ctx, GP_ERR_UNSUPPORTED, "string constants are not supported");
    return GP_OK;
}

static gp_status infer_constant(struct gp_infer_ctx *ctx)
{
    const struct gp_attr *a;
    int which;
    GP_TRY(constant_attr(ctx, &a, &which));
    struct gp_shape s = {.rank = which == 2 || which == 4 ? 1 : 0, .dims = {a->count}};
    enum gp_dtype dtype = which == 1 || which == 2 ? GP_DTYPE_FLOAT32 : GP_DTYPE_INT64;
    if (which == 0) {
        if (!a->t || gp_dtype_size(a->t->dtype) == 0)
            return gp_op_error(ctx, GP_ERR_UNSUPPORTED, "value tensor of element type %s",
                               a->t ? gp_dtype_name(a->t->dtype) : "(none)");
        s = a->t->shape;
        dtype = a->t->dtype;
    }
    GP_TRY(gp_check_shape(ctx, &s));
    gp_set_out(ctx, 0, dtype, &s);
    return GP_OK;
}

static gp_status fold_constant(struct gp_infer_ctx *ctx)
{
    const struct gp_attr *a;
    int which;
    GP_TRY(constant_attr(ctx, &a, &which));
    struct gp_tensor *o = gp_fold_out(ctx, 0);
    if (!o) return GP_ERR_NOMEM;
    switch (which) {
    case 0: memcpy(o->data, a->t->data, o->nbytes); break;
    case 1: gp_tensor_set_f64(o, 0, a->f); break;
    case 2: for (int64_t i = 0; i < a->count; i++) gp_tensor_set_f64(o, i, a->floats[i]); break;
    case 3: gp_tensor_set_i64(o, 0, a->i); break;
    default: for (int64_t i = 0; i < a->count; i++) gp_tensor_set_i64(o, i, a->ints[i]); break;
    }
    return GP_OK;
}

/* ---- Tile, Trilu ---- */

static gp_status infer_tile(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    int64_t rep[GP_MAX_RANK];
    int n;
    GP_TRY(gp_const_ints(ctx, 1, "repeats", rep, GP_MAX_RANK, &n));
    char s[160];
    if (n != x->shape.rank)
        return gp_op_error(ctx, GP_ERR_SHAPE, "repeats %s has %d entries for an input of rank %d",
                           gp_ints_format(rep, n, s, sizeof s), n, x->shape.rank);
    struct gp_shape out = x->shape;
    for (int d = 0; d < n; d++) {
        if (rep[d] < 0 || (rep[d] && out.dims[d] > INT64_MAX / rep[d]))
            return gp_op_error(ctx, GP_ERR_SHAPE, "invalid repeats %s",
                               gp_ints_format(rep, n, s, sizeof s));
        out.dims[d] *= rep[d];
    }
    GP_TRY(gp_check_shape(ctx, &out));
    gp_set_out(ctx, 0, x->dtype, &out);
    return GP_OK;
}

static gp_status fold_tile(struct gp_infer_ctx *ctx)
{
    const struct gp_tensor *x = gp_in(ctx, 0)->constant;
    struct gp_tensor *o = gp_fold_out(ctx, 0);
    if (!o) return GP_ERR_NOMEM;
    size_t es = gp_dtype_size(x->dtype);
    int64_t strides[GP_MAX_RANK], n = gp_shape_numel(&o->shape);
    gp_shape_strides(&x->shape, strides);
    struct gp_iter it;
    gp_iter_init(&it, &o->shape);
    for (int64_t i = 0; i < n; i++, gp_iter_next(&it)) {
        int64_t src = 0;
        for (int d = 0; d < it.rank; d++) src += (it.idx[d] % x->shape.dims[d]) * strides[d];
        memcpy(bytes(o) + (size_t)i * es, bytes(x) + (size_t)src * es, es);
    }
    return GP_OK;
}

static gp_status infer_trilu(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    if (x->shape.rank < 2) return gp_op_error(ctx, GP_ERR_SHAPE, "input must have rank >= 2");
    struct gp_value *k = gp_in(ctx, 1);
    if (k && (k->dtype != GP_DTYPE_INT64 || gp_shape_numel(&k->shape) != 1))
        return gp_op_error(ctx, GP_ERR_INVALID, "k (input 1) must be an int64 scalar");
    gp_set_out(ctx, 0, x->dtype, &x->shape);
    return GP_OK;
}

/* Keeps the triangle of the last two axes [.., rows, cols] on or above
 * (upper) / below (lower) diagonal k, zeroes the rest. */
static gp_status fold_trilu(struct gp_infer_ctx *ctx)
{
    const struct gp_tensor *x = gp_in(ctx, 0)->constant;
    struct gp_value *kv = gp_in(ctx, 1);
    struct gp_tensor *o = gp_fold_out(ctx, 0);
    if (!o) return GP_ERR_NOMEM;
    int64_t k = kv ? gp_tensor_get_i64(kv->constant, 0) : 0;
    bool upper = gp_node_attr_int(ctx->node, "upper", 1) != 0;
    size_t es = gp_dtype_size(x->dtype);
    int64_t n = gp_shape_numel(&o->shape);
    struct gp_iter it;
    gp_iter_init(&it, &o->shape);
    for (int64_t i = 0; i < n; i++, gp_iter_next(&it)) {
        int64_t diag = it.idx[it.rank - 1] - it.idx[it.rank - 2];
        if (upper ? diag >= k : diag <= k)
            memcpy(bytes(o) + (size_t)i * es, bytes(x) + (size_t)i * es, es);
    }
    return GP_OK;
}

/* ---- the table ---- */

#define FOLD GP_FOLD_CONSTANTS
#define MANY INT_MAX
#define OP(op, since, min_in, max_in, max_out, attrs, nondiff, infer, kind, fold) \
    {"", op, since, min_in, max_in, 1, max_out, attrs, nondiff, infer, kind, fold}
#define CONSTANT_ATTRS \
    "value:t,value_float:f,value_floats:F,value_int:i,value_ints:I,value_string:s,value_strings:S"

/* One entry per ONNX since-version through opset 21, so nodes resolve to
 * the version they were written for; versions that only widen the types
 * share the infer function. Constant's sparse_value (11+) is not listed:
 * sparse tensors are unsupported, and the loader says so by name. */
const struct gp_op_def gp_ops_shape[] = {
    OP("Shape", 1, 1, 1, 1, "", 0x1, infer_shape, GP_FOLD_SHAPES, fold_shape),
    OP("Shape", 13, 1, 1, 1, "", 0x1, infer_shape, GP_FOLD_SHAPES, fold_shape),
    OP("Shape", 15, 1, 1, 1, "end:i,start:i", 0x1, infer_shape, GP_FOLD_SHAPES, fold_shape),
    OP("Shape", 19, 1, 1, 1, "end:i,start:i", 0x1, infer_shape, GP_FOLD_SHAPES, fold_shape),
    OP("Shape", 21, 1, 1, 1, "end:i,start:i", 0x1, infer_shape, GP_FOLD_SHAPES, fold_shape),
    OP("Size", 1, 1, 1, 1, "", 0x1, infer_size, GP_FOLD_SHAPES, fold_size),
    OP("Size", 13, 1, 1, 1, "", 0x1, infer_size, GP_FOLD_SHAPES, fold_size),
    OP("Size", 19, 1, 1, 1, "", 0x1, infer_size, GP_FOLD_SHAPES, fold_size),
    OP("Size", 21, 1, 1, 1, "", 0x1, infer_size, GP_FOLD_SHAPES, fold_size),
    OP("Reshape", 5, 2, 2, 1, "", 0x2, infer_reshape, FOLD, fold_copy),
    OP("Reshape", 13, 2, 2, 1, "", 0x2, infer_reshape, FOLD, fold_copy),
    OP("Reshape", 14, 2, 2, 1, "allowzero:i", 0x2, infer_reshape, FOLD, fold_copy),
    OP("Reshape", 19, 2, 2, 1, "allowzero:i", 0x2, infer_reshape, FOLD, fold_copy),
    OP("Reshape", 21, 2, 2, 1, "allowzero:i", 0x2, infer_reshape, FOLD, fold_copy),
    OP("Flatten", 1, 1, 1, 1, "axis:i", 0, infer_flatten, FOLD, fold_copy),
    OP("Flatten", 9, 1, 1, 1, "axis:i", 0, infer_flatten, FOLD, fold_copy),
    OP("Flatten", 11, 1, 1, 1, "axis:i", 0, infer_flatten, FOLD, fold_copy),
    OP("Flatten", 13, 1, 1, 1, "axis:i", 0, infer_flatten, FOLD, fold_copy),
    OP("Flatten", 21, 1, 1, 1, "axis:i", 0, infer_flatten, FOLD, fold_copy),
    OP("Transpose", 1, 1, 1, 1, "perm:I", 0, infer_transpose, FOLD, fold_transpose),
    OP("Transpose", 13, 1, 1, 1, "perm:I", 0, infer_transpose, FOLD, fold_transpose),
    OP("Transpose", 21, 1, 1, 1, "perm:I", 0, infer_transpose, FOLD, fold_transpose),
    OP("Squeeze", 1, 1, 1, 1, "axes:I", 0, infer_squeeze, FOLD, fold_copy),
    OP("Squeeze", 11, 1, 1, 1, "axes:I", 0, infer_squeeze, FOLD, fold_copy),
    OP("Squeeze", 13, 1, 2, 1, "", 0x2, infer_squeeze, FOLD, fold_copy),
    OP("Squeeze", 21, 1, 2, 1, "", 0x2, infer_squeeze, FOLD, fold_copy),
    OP("Unsqueeze", 1, 1, 1, 1, "axes:I", 0, infer_unsqueeze, FOLD, fold_copy),
    OP("Unsqueeze", 11, 1, 1, 1, "axes:I", 0, infer_unsqueeze, FOLD, fold_copy),
    OP("Unsqueeze", 13, 2, 2, 1, "", 0x2, infer_unsqueeze, FOLD, fold_copy),
    OP("Unsqueeze", 21, 2, 2, 1, "", 0x2, infer_unsqueeze, FOLD, fold_copy),
    OP("Concat", 4, 1, MANY, 1, "axis:i", 0, infer_concat, FOLD, fold_concat),
    OP("Concat", 11, 1, MANY, 1, "axis:i", 0, infer_concat, FOLD, fold_concat),
    OP("Concat", 13, 1, MANY, 1, "axis:i", 0, infer_concat, FOLD, fold_concat),
    OP("Split", 2, 1, 1, MANY, "axis:i,split:I", 0, infer_split, FOLD, fold_split),
    OP("Split", 11, 1, 1, MANY, "axis:i,split:I", 0, infer_split, FOLD, fold_split),
    OP("Split", 13, 1, 2, MANY, "axis:i", 0x2, infer_split, FOLD, fold_split),
    OP("Split", 18, 1, 2, MANY, "axis:i,num_outputs:i", 0x2, infer_split, FOLD, fold_split),
    OP("Slice", 1, 1, 1, 1, "axes:I,ends:I,starts:I", 0, infer_slice, FOLD, fold_slice),
    OP("Slice", 10, 3, 5, 1, "", 0x1e, infer_slice, FOLD, fold_slice),
    OP("Slice", 11, 3, 5, 1, "", 0x1e, infer_slice, FOLD, fold_slice),
    OP("Slice", 13, 3, 5, 1, "", 0x1e, infer_slice, FOLD, fold_slice),
    OP("Gather", 1, 2, 2, 1, "axis:i", 0x2, infer_gather, FOLD, fold_gather),
    OP("Gather", 11, 2, 2, 1, "axis:i", 0x2, infer_gather, FOLD, fold_gather),
    OP("Gather", 13, 2, 2, 1, "axis:i", 0x2, infer_gather, FOLD, fold_gather),
    OP("ScatterND", 11, 3, 3, 1, "", 0x2, infer_scatter_nd, GP_FOLD_REQUIRED, fold_scatter_nd),
    OP("ScatterND", 13, 3, 3, 1, "", 0x2, infer_scatter_nd, GP_FOLD_REQUIRED, fold_scatter_nd),
    OP("ScatterND", 16, 3, 3, 1, "reduction:s", 0x2, infer_scatter_nd, GP_FOLD_REQUIRED, fold_scatter_nd),
    OP("ScatterND", 18, 3, 3, 1, "reduction:s", 0x2, infer_scatter_nd, GP_FOLD_REQUIRED, fold_scatter_nd),
    OP("ConstantOfShape", 9, 1, 1, 1, "value:t", 0x1,
        infer_constant_of_shape, FOLD, fold_constant_of_shape),
    OP("ConstantOfShape", 20, 1, 1, 1, "value:t", 0x1,
        infer_constant_of_shape, FOLD, fold_constant_of_shape),
    OP("ConstantOfShape", 21, 1, 1, 1, "value:t", 0x1,
        infer_constant_of_shape, FOLD, fold_constant_of_shape),
    OP("Range", 11, 3, 3, 1, "", 0x7, infer_range, FOLD, fold_range),
    OP("Constant", 1, 0, 0, 1, "value:t", 0, infer_constant, FOLD, fold_constant),
    OP("Constant", 9, 0, 0, 1, "value:t", 0, infer_constant, FOLD, fold_constant),
    OP("Constant", 11, 0, 0, 1, "value:t", 0, infer_constant, FOLD, fold_constant),
    OP("Constant", 12, 0, 0, 1, CONSTANT_ATTRS, 0, infer_constant, FOLD, fold_constant),
    OP("Constant", 13, 0, 0, 1, CONSTANT_ATTRS, 0, infer_constant, FOLD, fold_constant),
    OP("Constant", 19, 0, 0, 1, CONSTANT_ATTRS, 0, infer_constant, FOLD, fold_constant),
    OP("Constant", 21, 0, 0, 1, CONSTANT_ATTRS, 0, infer_constant, FOLD, fold_constant),
    OP("Tile", 6, 2, 2, 1, "", 0x2, infer_tile, FOLD, fold_tile),
    OP("Tile", 13, 2, 2, 1, "", 0x2, infer_tile, FOLD, fold_tile),
    OP("Trilu", 14, 1, 2, 1, "upper:i", 0x2, infer_trilu, FOLD, fold_trilu),
    {0},
};
