/* Linear algebra, softmax and reductions. Shape inference only; kernels live
 * with the backends. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/families.h"
#include "ops/fold_util.h"

#define SHAPE_BUF 160

static const char *fmt(const struct gp_shape *s, char *buf)
{
    return gp_shape_format(s, buf, SHAPE_BUF);
}

/* Gemm, MatMul: float, or the integer types ONNX allows there. */
static gp_status want_matmul_dtype(struct gp_infer_ctx *ctx, int i)
{
    struct gp_value *v = gp_in(ctx, i);
    if (!v || gp_dtype_is_float(v->dtype)) return GP_OK;
    switch (v->dtype) {
    case GP_DTYPE_INT32: case GP_DTYPE_INT64: case GP_DTYPE_UINT32: case GP_DTYPE_UINT64:
        return GP_OK;
    default:
        return gp_op_error(ctx, GP_ERR_INVALID, "input %d ('%s') is %s, but this op takes float "
                           "or 32/64-bit integer tensors", i, v->name, gp_dtype_name(v->dtype));
    }
}

/* ---- Gemm and MatMul ---- */

/* Gemm: Y [M, N] = alpha * A' B' + beta * C, where A' is A [M, K] (A^T of a
 * [K, M] A when transA) and B' is B [K, N] (B^T when transB); C broadcasts
 * unidirectionally to [M, N]. C is required in opset 7, optional since 11. */
static gp_status gemm_infer(struct gp_infer_ctx *ctx)
{
    struct gp_value *a, *b;
    GP_TRY(gp_req_in(ctx, 0, &a));
    GP_TRY(gp_req_in(ctx, 1, &b));
    GP_TRY(want_matmul_dtype(ctx, 0));
    GP_TRY(gp_same_dtype(ctx, 0, 2));
    char sa[SHAPE_BUF], sb[SHAPE_BUF], sc[SHAPE_BUF];
    if (a->shape.rank != 2 || b->shape.rank != 2)
        return gp_op_error(ctx, GP_ERR_SHAPE, "A %s and B %s must both be matrices (rank 2)",
                           fmt(&a->shape, sa), fmt(&b->shape, sb));
    int64_t ta = gp_node_attr_int(ctx->node, "transA", 0) != 0;
    int64_t tb = gp_node_attr_int(ctx->node, "transB", 0) != 0;
    int64_t m = a->shape.dims[ta], ka = a->shape.dims[1 - ta];
    int64_t kb = b->shape.dims[tb], n = b->shape.dims[1 - tb];
    if (ka != kb)
        return gp_op_error(ctx, GP_ERR_SHAPE,
                           "A is %s (transA=%lld) and B is %s (transB=%lld): inner dimensions "
                           "%lld and %lld differ",
                           fmt(&a->shape, sa), (long long)ta, fmt(&b->shape, sb), (long long)tb,
                           (long long)ka, (long long)kb);
    struct gp_shape y = {.rank = 2, .dims = {m, n}};
    struct gp_value *c = gp_in(ctx, 2);
    if (c) {
        bool ok = c->shape.rank <= 2;
        for (int i = 0; ok && i < c->shape.rank; i++) {
            int64_t d = c->shape.dims[c->shape.rank - 1 - i];
            ok = d == 1 || d == y.dims[1 - i];
        }
        if (!ok)
            return gp_op_error(ctx, GP_ERR_SHAPE, "C has shape %s, which does not broadcast to "
                               "the output [%lld, %lld] (A %s, B %s)",
                               fmt(&c->shape, sc), (long long)m, (long long)n,
                               fmt(&a->shape, sa), fmt(&b->shape, sb));
    } else if (ctx->node->def->since_version < 11) {
        return gp_op_error(ctx, GP_ERR_INVALID, "input C is required before opset 11");
    }
    gp_set_out(ctx, 0, a->dtype, &y);
    return GP_OK;
}

/* MatMul, numpy semantics: A [..., M, K] x B [..., K, N] -> [..., M, N] with
 * the leading (batch) axes broadcast. A 1-D A is [1, K] and a 1-D B is
 * [K, 1] for the product, and that axis is dropped from the result. */
static gp_status matmul_infer(struct gp_infer_ctx *ctx)
{
    struct gp_value *a, *b;
    GP_TRY(gp_req_in(ctx, 0, &a));
    GP_TRY(gp_req_in(ctx, 1, &b));
    GP_TRY(want_matmul_dtype(ctx, 0));
    GP_TRY(gp_same_dtype(ctx, 0, 1));
    const struct gp_shape *sa = &a->shape, *sb = &b->shape;
    char fa[SHAPE_BUF], fb[SHAPE_BUF];
    if (sa->rank < 1 || sb->rank < 1)
        return gp_op_error(ctx, GP_ERR_SHAPE, "A %s and B %s must have rank 1 or more",
                           fmt(sa, fa), fmt(sb, fb));
    int64_t m = sa->rank >= 2 ? sa->dims[sa->rank - 2] : 1, ka = sa->dims[sa->rank - 1];
    int64_t kb = sb->rank >= 2 ? sb->dims[sb->rank - 2] : sb->dims[0];
    int64_t n = sb->rank >= 2 ? sb->dims[sb->rank - 1] : 1;
    if (ctx->node->trans_b && sb->rank == 2) /* a weight stored [N, K] (graph/fuse.c) */
        kb = sb->dims[1], n = sb->dims[0];
    if (ka != kb)
        return gp_op_error(ctx, GP_ERR_SHAPE,
                           "A is %s and B is %s: inner dimensions %lld and %lld differ",
                           fmt(sa, fa), fmt(sb, fb), (long long)ka, (long long)kb);
    /* Batch axes: everything before the last two (none for 1-D inputs). */
    int ba = sa->rank > 2 ? sa->rank - 2 : 0, bb = sb->rank > 2 ? sb->rank - 2 : 0;
    int batch = ba > bb ? ba : bb;
    struct gp_shape y = {.rank = 0};
    for (int i = 0; i < batch; i++) {
        int ia = i - (batch - ba), ib = i - (batch - bb);
        int64_t da = ia >= 0 ? sa->dims[ia] : 1, db = ib >= 0 ? sb->dims[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return gp_op_error(ctx, GP_ERR_SHAPE,
                               "A is %s and B is %s: batch dimensions %lld and %lld do not "
                               "broadcast",
                               fmt(sa, fa), fmt(sb, fb), (long long)da, (long long)db);
        y.dims[y.rank++] = da == 1 ? db : da;
    }
    if (sa->rank >= 2) y.dims[y.rank++] = m;
    if (sb->rank >= 2) y.dims[y.rank++] = n;
    GP_TRY(gp_check_shape(ctx, &y));
    gp_set_out(ctx, 0, a->dtype, &y);
    return GP_OK;
}

/* ---- softmax ---- */

/* Softmax, LogSoftmax: output like input. Before opset 13 the input is
 * viewed as a matrix [D0*..*D(axis-1), D(axis)*..*D(r-1)] (axis defaults to
 * 1) and each row normalized; since 13 only along `axis` (default -1). The
 * shape is the same either way; kernels tell them apart by since_version. */
static gp_status softmax_infer(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    GP_TRY(gp_want_float(ctx, 0));
    bool coerce = ctx->node->def->since_version < 13;
    int axis, r = x->shape.rank;
    if (r < 1) return gp_op_error(ctx, GP_ERR_SHAPE, "input '%s' is a scalar", x->name);
    GP_TRY(gp_norm_axis(ctx, gp_node_attr_int(ctx->node, "axis", coerce ? 1 : -1), r, &axis));
    gp_set_out(ctx, 0, x->dtype, &x->shape);
    return GP_OK;
}

/* ---- reductions ---- */

/* Reads the axes to reduce into `reduce` (flags per axis of a rank-r input).
 * Empty or absent axes reduce everything, or nothing when
 * noop_with_empty_axes is set; *noop reports the latter. */
static gp_status reduce_axes(struct gp_infer_ctx *ctx, int r, bool *reduce, bool *noop)
{
    int64_t axes[GP_MAX_RANK];
    int n = 0;
    /* Entries with an axes input (ReduceSum-13, the others since 18) have a
     * second input slot; the older ones an attribute. */
    if (ctx->node->def->max_inputs >= 2) {
        if (gp_in(ctx, 1)) {
            GP_TRY(gp_want_int_index(ctx, 1));
            GP_TRY(gp_const_ints(ctx, 1, "axes", axes, GP_MAX_RANK, &n));
        }
    } else {
        const int64_t *v;
        int64_t count = gp_node_attr_ints(ctx->node, "axes", &v);
        if (count > GP_MAX_RANK)
            return gp_op_error(ctx, GP_ERR_INVALID, "axes has %lld entries for rank %d",
                               (long long)count, r);
        if (count > 0) memcpy(axes, v, sizeof *v * (size_t)count);
        n = count > 0 ? (int)count : 0;
    }
    *noop = n == 0 && gp_node_attr_int(ctx->node, "noop_with_empty_axes", 0) != 0;
    for (int i = 0; i < r; i++) reduce[i] = n == 0 && !*noop;
    for (int k = 0; k < n; k++) {
        int d;
        GP_TRY(gp_norm_axis(ctx, axes[k], r, &d));
        if (reduce[d])
            return gp_op_error(ctx, GP_ERR_INVALID, "axis %d is repeated in axes", d);
        reduce[d] = true;
    }
    return GP_OK;
}

/* ReduceMean, ReduceSum, ReduceMax, ReduceMin, ReduceProd, ReduceSumSquare,
 * ReduceL2: data [D0..Dr-1] -> the reduced axes become 1 (keepdims, the
 * default) or are removed. */
static gp_status reduce_infer(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    const char *op = ctx->node->op_type;
    /* ReduceMax/Min-20 also take bool. */
    bool logical = strcmp(op, "ReduceMax") == 0 || strcmp(op, "ReduceMin") == 0;
    if (!(logical && x->dtype == GP_DTYPE_BOOL)) GP_TRY(gp_want_numeric(ctx, 0));
    int r = x->shape.rank;
    bool reduce[GP_MAX_RANK], noop;
    GP_TRY(reduce_axes(ctx, r, reduce, &noop));
    bool keep = gp_node_attr_int(ctx->node, "keepdims", 1) != 0;
    struct gp_shape y = {.rank = 0};
    for (int i = 0; i < r; i++) {
        if (!reduce[i]) y.dims[y.rank++] = x->shape.dims[i];
        else if (keep) y.dims[y.rank++] = 1;
        /* Max and Min of nothing have no identity element. */
        if (reduce[i] && x->shape.dims[i] == 0 && logical) {
            char s[SHAPE_BUF];
            return gp_op_error(ctx, GP_ERR_SHAPE, "cannot reduce the empty axis %d of %s", i,
                               fmt(&x->shape, s));
        }
    }
    gp_set_out(ctx, 0, x->dtype, &y);
    return GP_OK;
}

enum reduce_kind { R_SUM, R_MEAN, R_MAX, R_MIN, R_PROD, R_SUM_SQUARE, R_L2 };

static enum reduce_kind reduce_kind_of(const char *op)
{
    static const char *const names[] = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin",
                                        "ReduceProd", "ReduceSumSquare", "ReduceL2"};
    for (int k = 0; k < 7; k++)
        if (strcmp(op, names[k]) == 0) return (enum reduce_kind)k;
    return R_SUM;
}

/* Folds a reduction of a constant (exporters' shape arithmetic uses
 * ReduceProd and ReduceSum). One pass over the input in row-major order; the
 * output cell advances with the input except along reduced axes (stride 0).
 * Floats accumulate in double; integers in uint64 so that overflow wraps as
 * the kernels' would instead of being undefined. */
static gp_status reduce_fold(struct gp_infer_ctx *ctx)
{
    const struct gp_tensor *x = gp_in(ctx, 0)->constant;
    struct gp_tensor *y = gp_fold_out(ctx, 0);
    if (!y) return GP_ERR_NOMEM;
    enum reduce_kind kind = reduce_kind_of(ctx->node->op_type);
    bool reduce[GP_MAX_RANK], noop;
    GP_TRY(reduce_axes(ctx, x->shape.rank, reduce, &noop));
    struct gp_shape kept = x->shape;
    for (int d = 0; d < kept.rank; d++)
        if (reduce[d]) kept.dims[d] = 1;
    int64_t strides[GP_MAX_RANK];
    gp_shape_strides(&kept, strides);
    for (int d = 0; d < kept.rank; d++)
        if (reduce[d]) strides[d] = 0;

    int64_t n_in = gp_shape_numel(&x->shape), n_out = gp_shape_numel(&y->shape);
    if (n_out == 0) return GP_OK;
    bool fp = gp_dtype_is_float(x->dtype);
    double *acc = malloc(sizeof *acc * (size_t)n_out);
    uint64_t *iacc = malloc(sizeof *iacc * (size_t)n_out);
    if (!acc || !iacc) {
        free(acc);
        free(iacc);
        return gp_op_error(ctx, GP_ERR_NOMEM, "out of memory folding a reduction");
    }
    for (int64_t o = 0; o < n_out; o++) {
        acc[o] = kind == R_PROD ? 1.0 : kind == R_MAX ? -INFINITY : kind == R_MIN ? INFINITY : 0.0;
        iacc[o] = kind == R_PROD ? 1u : kind == R_MAX ? (uint64_t)INT64_MIN
                : kind == R_MIN ? (uint64_t)INT64_MAX : 0u;
    }
    struct gp_iter it;
    gp_iter_init(&it, &x->shape);
    gp_iter_add(&it, strides, 0);
    for (int64_t i = 0; i < n_in; i++, gp_iter_next(&it)) {
        int64_t o = it.off[0];
        if (fp) {
            double v = gp_tensor_get_f64(x, i);
            switch (kind) {
            case R_SUM: case R_MEAN: acc[o] += v; break;
            case R_SUM_SQUARE: case R_L2: acc[o] += v * v; break;
            case R_PROD: acc[o] *= v; break;
            case R_MAX: acc[o] = v > acc[o] || v != v ? v : acc[o]; break;
            case R_MIN: acc[o] = v < acc[o] || v != v ? v : acc[o]; break;
            }
        } else {
            int64_t v = gp_tensor_get_i64(x, i);
            uint64_t u = (uint64_t)v;
            switch (kind) {
            case R_SUM: case R_MEAN: iacc[o] += u; break;
            case R_SUM_SQUARE: case R_L2: iacc[o] += u * u; break;
            case R_PROD: iacc[o] *= u; break;
            case R_MAX: if (v > (int64_t)iacc[o]) iacc[o] = u; break;
            case R_MIN: if (v < (int64_t)iacc[o]) iacc[o] = u; break;
            }
        }
    }
    int64_t count = n_in / n_out;
    for (int64_t o = 0; o < n_out; o++) {
        if (fp) {
            double v = acc[o];
            if (kind == R_MEAN) v /= (double)count;
            if (kind == R_L2) v = sqrt(v);
            gp_tensor_set_f64(y, o, v);
        } else {
            int64_t v = (int64_t)iacc[o];
            if (kind == R_MEAN) v = count ? v / count : 0;
            if (kind == R_L2) v = (int64_t)sqrt((double)v);
            gp_tensor_set_i64(y, o, v);
        }
    }
    free(acc);
    free(iacc);
    return GP_OK;
}

/* ArgMax, ArgMin: data [D0..Dr-1] -> int64 indices along `axis` (default 0),
 * which becomes 1 (keepdims, the default) or is removed. */
static gp_status arg_reduce_infer(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    GP_TRY(gp_want_numeric(ctx, 0));
    int r = x->shape.rank, axis;
    if (r < 1) return gp_op_error(ctx, GP_ERR_SHAPE, "input '%s' is a scalar", x->name);
    GP_TRY(gp_norm_axis(ctx, gp_node_attr_int(ctx->node, "axis", 0), r, &axis));
    if (x->shape.dims[axis] == 0) {
        char s[SHAPE_BUF];
        return gp_op_error(ctx, GP_ERR_SHAPE, "cannot take the index along the empty axis %d of %s",
                           axis, fmt(&x->shape, s));
    }
    bool keep = gp_node_attr_int(ctx->node, "keepdims", 1) != 0;
    struct gp_shape y = {.rank = 0};
    for (int i = 0; i < r; i++) {
        if (i != axis) y.dims[y.rank++] = x->shape.dims[i];
        else if (keep) y.dims[y.rank++] = 1;
    }
    gp_set_out(ctx, 0, GP_DTYPE_INT64, &y);
    return GP_OK;
}

/* ---- the table ---- */

#define REDUCE_OLD(op)                                                                     \
    {"", op, 1, 1, 1, 1, 1, "axes:I,keepdims:i", 0, reduce_infer, GP_FOLD_CONSTANTS, reduce_fold}
#define REDUCE_NEW(op, since)                                                              \
    {"", op, since, 1, 2, 1, 1, "keepdims:i,noop_with_empty_axes:i", 1u << 1, reduce_infer, \
     GP_FOLD_CONSTANTS, reduce_fold}

/* Versions not listed differ from the one before only in the types they
 * allow (Gemm-9/13, MatMul-9/13, Softmax-11, ReduceMax-12/13/20...), so the
 * lookup's "highest since_version not above the opset" covers them. */
const struct gp_op_def gp_ops_math[] = {
    /* Gemm-1/6 (the broadcast attribute) are not supported. */
    {"", "Gemm", 7, 3, 3, 1, 1, "alpha:f,beta:f,transA:i,transB:i", 0, gemm_infer,
     GP_FOLD_NEVER, NULL},
    {"", "Gemm", 11, 2, 3, 1, 1, "alpha:f,beta:f,transA:i,transB:i", 0, gemm_infer,
     GP_FOLD_NEVER, NULL},
    {"", "MatMul", 1, 2, 2, 1, 1, "", 0, matmul_infer, GP_FOLD_NEVER, NULL},

    {"", "Softmax", 1, 1, 1, 1, 1, "axis:i", 0, softmax_infer, GP_FOLD_NEVER, NULL},
    {"", "Softmax", 13, 1, 1, 1, 1, "axis:i", 0, softmax_infer, GP_FOLD_NEVER, NULL},
    {"", "LogSoftmax", 1, 1, 1, 1, 1, "axis:i", 0, softmax_infer, GP_FOLD_NEVER, NULL},
    {"", "LogSoftmax", 13, 1, 1, 1, 1, "axis:i", 0, softmax_infer, GP_FOLD_NEVER, NULL},

    REDUCE_OLD("ReduceMean"),
    REDUCE_NEW("ReduceMean", 18),
    REDUCE_OLD("ReduceSum"),
    REDUCE_NEW("ReduceSum", 13),
    REDUCE_OLD("ReduceMax"),
    REDUCE_NEW("ReduceMax", 18),
    REDUCE_OLD("ReduceMin"),
    REDUCE_NEW("ReduceMin", 18),
    REDUCE_OLD("ReduceProd"),
    REDUCE_NEW("ReduceProd", 18),
    REDUCE_OLD("ReduceSumSquare"),
    REDUCE_NEW("ReduceSumSquare", 18),
    REDUCE_OLD("ReduceL2"),
    REDUCE_NEW("ReduceL2", 18),

    {"", "ArgMax", 1, 1, 1, 1, 1, "axis:i,keepdims:i", 0, arg_reduce_infer, GP_FOLD_NEVER, NULL},
    {"", "ArgMax", 12, 1, 1, 1, 1, "axis:i,keepdims:i,select_last_index:i", 0, arg_reduce_infer,
     GP_FOLD_NEVER, NULL},
    {"", "ArgMin", 1, 1, 1, 1, 1, "axis:i,keepdims:i", 0, arg_reduce_infer, GP_FOLD_NEVER, NULL},
    {"", "ArgMin", 12, 1, 1, 1, 1, "axis:i,keepdims:i,select_last_index:i", 0, arg_reduce_infer,
     GP_FOLD_NEVER, NULL},
    {0},
};
