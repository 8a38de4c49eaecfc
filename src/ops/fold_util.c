#include "ops/fold_util.h"

#include <stdio.h>
#include <string.h>

gp_status gp_req_in(struct gp_infer_ctx *ctx, int i, struct gp_value **out)
{
    struct gp_value *v = gp_in(ctx, i);
    if (!v) return gp_op_error(ctx, GP_ERR_INVALID, "input %d is required but omitted", i);
    if (!v->has_shape)
        return gp_op_error(ctx, GP_ERR_SHAPE, "input %d ('%s') has no known shape", i, v->name);
    *out = v;
    return GP_OK;
}

gp_status gp_const_ints(struct gp_infer_ctx *ctx, int i, const char *what, int64_t *out, int max,
                        int *n)
{
    const struct gp_tensor *t;
    GP_TRY(gp_need_const(ctx, i, &t));
    if (!gp_dtype_is_integer(t->dtype))
        return gp_op_error(ctx, GP_ERR_INVALID, "%s (input %d) must be an integer tensor, not %s",
                           what, i, gp_dtype_name(t->dtype));
    if (t->shape.rank > 1) {
        char s[160];
        return gp_op_error(ctx, GP_ERR_INVALID, "%s (input %d) must be 1-D, but its shape is %s",
                           what, i, gp_shape_format(&t->shape, s, sizeof s));
    }
    int64_t count = gp_shape_numel(&t->shape);
    if (count > max)
        return gp_op_error(ctx, GP_ERR_UNSUPPORTED,
                           "%s (input %d) has %lld entries; at most %d are supported", what, i,
                           (long long)count, max);
    for (int64_t k = 0; k < count; k++) out[k] = gp_tensor_get_i64(t, k);
    *n = (int)count;
    return GP_OK;
}

static gp_status want(struct gp_infer_ctx *ctx, int i, bool ok, const char *kind)
{
    struct gp_value *v = gp_in(ctx, i);
    if (!v || ok) return GP_OK;
    return gp_op_error(ctx, GP_ERR_INVALID, "input %d ('%s') is %s, but this op takes %s", i,
                       v->name, gp_dtype_name(v->dtype), kind);
}

gp_status gp_want_float(struct gp_infer_ctx *ctx, int i)
{
    struct gp_value *v = gp_in(ctx, i);
    return want(ctx, i, v && gp_dtype_is_float(v->dtype), "floating-point tensors");
}

gp_status gp_want_numeric(struct gp_infer_ctx *ctx, int i)
{
    struct gp_value *v = gp_in(ctx, i);
    return want(ctx, i, v && (gp_dtype_is_float(v->dtype) || gp_dtype_is_integer(v->dtype)),
                "numeric tensors");
}

gp_status gp_want_bool(struct gp_infer_ctx *ctx, int i)
{
    struct gp_value *v = gp_in(ctx, i);
    return want(ctx, i, v && v->dtype == GP_DTYPE_BOOL, "bool tensors");
}

gp_status gp_want_int_index(struct gp_infer_ctx *ctx, int i)
{
    struct gp_value *v = gp_in(ctx, i);
    return want(ctx, i, v && (v->dtype == GP_DTYPE_INT32 || v->dtype == GP_DTYPE_INT64),
                "int32 or int64 indices");
}

char *gp_ints_format(const int64_t *v, int n, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < n && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "", (long long)v[i]);
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}

void gp_shape_strides(const struct gp_shape *shape, int64_t *strides)
{
    int64_t s = 1;
    for (int d = shape->rank - 1; d >= 0; d--) {
        strides[d] = s;
        s *= shape->dims[d];
    }
}

void gp_bcast_strides(const struct gp_shape *in, const struct gp_shape *out, int64_t *strides)
{
    int64_t own[GP_MAX_RANK];
    gp_shape_strides(in, own);
    int lead = out->rank - in->rank;
    for (int d = 0; d < out->rank; d++) {
        int k = d - lead;
        strides[d] = (k < 0 || in->dims[k] == 1) ? 0 : own[k];
    }
}

void gp_iter_init(struct gp_iter *it, const struct gp_shape *shape)
{
    memset(it, 0, sizeof *it);
    it->rank = shape->rank;
    for (int d = 0; d < shape->rank; d++) it->dims[d] = shape->dims[d];
}

int gp_iter_add(struct gp_iter *it, const int64_t *strides, int64_t base)
{
    int k = it->n++;
    for (int d = 0; d < it->rank; d++) it->strides[k][d] = strides[d];
    it->off[k] = base;
    return k;
}

void gp_iter_next(struct gp_iter *it)
{
    for (int d = it->rank - 1; d >= 0; d--) {
        if (++it->idx[d] < it->dims[d]) {
            for (int k = 0; k < it->n; k++) it->off[k] += it->strides[k][d];
            return;
        }
        /* Axis d wraps to 0: undo its whole run and carry into d - 1. */
        for (int k = 0; k < it->n; k++) it->off[k] -= it->strides[k][d] * (it->dims[d] - 1);
        it->idx[d] = 0;
    }
}

void gp_copy_strided(void *dst, const void *src, size_t esize, const struct gp_shape *shape,
                     const int64_t *strides, int64_t base)
{
    int64_t n = gp_shape_numel(shape);
    struct gp_iter it;
    gp_iter_init(&it, shape);
    gp_iter_add(&it, strides, base);
    unsigned char *d = dst;
    const unsigned char *s = src;
    for (int64_t i = 0; i < n; i++, gp_iter_next(&it))
        memcpy(d + (size_t)i * esize, s + (size_t)it.off[0] * esize, esize);
}

/* ---- plans shared by shape ops' infer, fold and kernels ---- */

gp_status gp_transpose_perm(struct gp_infer_ctx *ctx, int rank, int *perm)
{
    const int64_t *p;
    int64_t n = gp_node_attr_ints(ctx->node, "perm", &p);
    if (n < 0) { /* default: reverse the axes */
        for (int d = 0; d < rank; d++) perm[d] = rank - 1 - d;
        return GP_OK;
    }
    bool seen[GP_MAX_RANK] = {0};
    bool ok = n == rank;
    for (int d = 0; ok && d < rank; d++) {
        ok = p[d] >= 0 && p[d] < rank && !seen[p[d]];
        if (ok) seen[p[d]] = true, perm[d] = (int)p[d];
    }
    if (!ok) {
        char s[160];
        return gp_op_error(ctx, GP_ERR_INVALID, "perm %s is not a permutation of the %d axes",
                           gp_ints_format(p, n > GP_MAX_RANK ? GP_MAX_RANK : (int)n, s, sizeof s),
                           rank);
    }
    return GP_OK;
}

gp_status gp_split_sizes(struct gp_infer_ctx *ctx, int64_t dim, int64_t *sizes)
{
    int n_out = ctx->node->n_outputs;
    const struct gp_tensor *st = NULL;
    const int64_t *sa = NULL;
    int64_t count = -1;
    if (gp_in(ctx, 1)) {
        GP_TRY(gp_need_const(ctx, 1, &st));
        if (!gp_dtype_is_integer(st->dtype) || st->shape.rank > 1)
            return gp_op_error(ctx, GP_ERR_INVALID, "split (input 1) must be a 1-D integer tensor");
        count = gp_shape_numel(&st->shape);
    } else {
        count = gp_node_attr_ints(ctx->node, "split", &sa);
    }
    int64_t num = gp_node_attr_int(ctx->node, "num_outputs", -1);
    if (count >= 0) {
        if (count != n_out)
            return gp_op_error(ctx, GP_ERR_INVALID, "split has %lld entries for %d outputs",
                               (long long)count, n_out);
        int64_t sum = 0;
        for (int k = 0; k < n_out; k++) {
            sizes[k] = st ? gp_tensor_get_i64(st, k) : sa[k];
            if (sizes[k] < 0 || sizes[k] > dim)
                return gp_op_error(ctx, GP_ERR_INVALID, "split size %lld is out of range",
                                   (long long)sizes[k]);
            sum += sizes[k];
        }
        if (sum != dim)
            return gp_op_error(ctx, GP_ERR_SHAPE, "split sizes sum to %lld, but the axis has %lld",
                               (long long)sum, (long long)dim);
    } else if (num >= 0) {
        if (num != n_out)
            return gp_op_error(ctx, GP_ERR_INVALID,
                               "num_outputs is %lld but the node has %d outputs", (long long)num,
                               n_out);
        int64_t chunk = (dim + num - 1) / num;
        for (int k = 0; k < n_out; k++) {
            int64_t left = dim - chunk * k;
            sizes[k] = left < chunk ? left : chunk;
            if (sizes[k] < 0 || (sizes[k] == 0 && dim > 0))
                return gp_op_error(ctx, GP_ERR_SHAPE,
                                   "an axis of size %lld cannot be split into %lld chunks of %lld",
                                   (long long)dim, (long long)num, (long long)chunk);
        }
    } else {
        if (dim % n_out != 0)
            return gp_op_error(ctx, GP_ERR_SHAPE,
                               "an axis of size %lld does not split evenly into %d outputs",
                               (long long)dim, n_out);
        for (int k = 0; k < n_out; k++) sizes[k] = dim / n_out;
    }
    return GP_OK;
}

/* Starts, ends, axes and steps from inputs 1..4 (Slice-10+) or from the
 * attributes (Slice-1). Rejects lists that disagree in length. */
static gp_status slice_args(struct gp_infer_ctx *ctx, int64_t v[4][GP_MAX_RANK], int n[4])
{
    static const char *const names[4] = {"starts", "ends", "axes", "steps"};
    for (int k = 0; k < 4; k++) {
        n[k] = -1;
        if (ctx->node->n_inputs >= 3) {
            if (gp_in(ctx, k + 1) || k < 2)
                GP_TRY(gp_const_ints(ctx, k + 1, names[k], v[k], GP_MAX_RANK, &n[k]));
        } else if (k < 3) {
            const int64_t *a;
            int64_t count = gp_node_attr_ints(ctx->node, names[k], &a);
            if (count < 0 && k < 2)
                return gp_op_error(ctx, GP_ERR_INVALID, "attribute '%s' is required", names[k]);
            if (count > GP_MAX_RANK)
                return gp_op_error(ctx, GP_ERR_UNSUPPORTED, "%s has %lld entries; at most %d "
                                   "are supported", names[k], (long long)count, GP_MAX_RANK);
            for (int64_t i = 0; i < count; i++) v[k][i] = a[i];
            n[k] = (int)count;
        }
        if (n[k] >= 0 && n[k] != n[0])
            return gp_op_error(ctx, GP_ERR_INVALID, "%s has %d entries but starts has %d",
                               names[k], n[k], n[0]);
    }
    return GP_OK;
}

gp_status gp_slice_plan(struct gp_infer_ctx *ctx, const struct gp_shape *in,
                            struct gp_slice_plan *p)
{
    int64_t v[4][GP_MAX_RANK];
    int n[4];
    GP_TRY(slice_args(ctx, v, n));
    p->out = *in;
    for (int d = 0; d < in->rank; d++) p->start[d] = 0, p->step[d] = 1;
    bool seen[GP_MAX_RANK] = {0};
    for (int i = 0; i < n[0]; i++) {
        int axis;
        GP_TRY(gp_norm_axis(ctx, n[2] >= 0 ? v[2][i] : i, in->rank, &axis));
        if (seen[axis]) return gp_op_error(ctx, GP_ERR_INVALID, "axis %d is sliced twice", axis);
        seen[axis] = true;
        int64_t dim = in->dims[axis], s = v[0][i], e = v[1][i], step = n[3] >= 0 ? v[3][i] : 1;
        if (step == 0) return gp_op_error(ctx, GP_ERR_INVALID, "step 0 on axis %d", axis);
        /* Negative positions count from the end (INT64_MIN + dim cannot
         * overflow); then clamp to the range a step direction can reach. */
        if (s < 0) s += dim;
        if (e < 0) e += dim;
        int64_t len;
        if (step > 0) {
            s = s < 0 ? 0 : s > dim ? dim : s;
            e = e < 0 ? 0 : e > dim ? dim : e;
            len = e > s ? (e - s - 1) / step + 1 : 0;
        } else {
            s = s < 0 ? 0 : s;
            s = s > dim - 1 ? dim - 1 : s;
            e = e < -1 ? -1 : e > dim - 1 ? dim - 1 : e;
            uint64_t back = (uint64_t)0 - (uint64_t)step; /* -step without overflow */
            len = s > e ? (int64_t)((uint64_t)(s - e - 1) / back) + 1 : 0;
        }
        p->start[axis] = len > 0 ? s : 0;
        /* The step only matters between two taken elements: with one or
         * none, a huge step would just overflow stride arithmetic. */
        p->step[axis] = len > 1 ? step : 1;
        p->out.dims[axis] = len;
    }
    return GP_OK;
}

gp_status gp_transpose_view(struct gp_infer_ctx *ctx, const struct gp_shape *in, int64_t *x_st)
{
    int perm[GP_MAX_RANK];
    GP_TRY(gp_transpose_perm(ctx, in->rank, perm));
    int64_t st[GP_MAX_RANK];
    gp_shape_strides(in, st);
    for (int d = 0; d < in->rank; d++) x_st[d] = st[perm[d]];
    return GP_OK;
}

gp_status gp_slice_view(struct gp_infer_ctx *ctx, const struct gp_shape *in, int64_t *x_st, int64_t *base)
{
    struct gp_slice_plan p;
    GP_TRY(gp_slice_plan(ctx, in, &p));
    gp_shape_strides(in, x_st);
    *base = 0;
    for (int d = 0; d < in->rank; d++) {
        *base += p.start[d] * x_st[d];
        x_st[d] *= p.step[d];
    }
    return GP_OK;
}
