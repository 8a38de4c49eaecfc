#include "ops/registry.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ops/families.h"

/* Every op family's table; each ends with an entry whose op_type is NULL. */
static const struct gp_op_def *const families[] = {
    gp_ops_elementwise,
    gp_ops_shape,
    gp_ops_nn,
    gp_ops_math,
    gp_ops_attention,
};

#define N_FAMILIES (int)(sizeof families / sizeof families[0])

static bool same_domain(const char *a, const char *b)
{
    if (!a || strcmp(a, "ai.onnx") == 0) a = "";
    if (!b || strcmp(b, "ai.onnx") == 0) b = "";
    return strcmp(a, b) == 0;
}

const struct gp_op_def *gp_op_lookup(const char *domain, const char *op_type, int64_t opset,
                                     bool *known_op)
{
    const struct gp_op_def *best = NULL;
    bool known = false;
    for (int f = 0; f < N_FAMILIES; f++) {
        for (const struct gp_op_def *d = families[f]; d->op_type; d++) {
            if (strcmp(d->op_type, op_type) != 0 || !same_domain(d->domain, domain)) continue;
            known = true;
            if (d->since_version <= opset && (!best || d->since_version > best->since_version))
                best = d;
        }
    }
    if (known_op) *known_op = known;
    return best;
}

int gp_op_count(void)
{
    int n = 0;
    for (int f = 0; f < N_FAMILIES; f++)
        for (const struct gp_op_def *d = families[f]; d->op_type; d++) n++;
    return n;
}

const struct gp_op_def *gp_op_at(int i)
{
    for (int f = 0; f < N_FAMILIES; f++)
        for (const struct gp_op_def *d = families[f]; d->op_type; d++)
            if (i-- == 0) return d;
    return NULL;
}

struct gp_value *gp_in(struct gp_infer_ctx *ctx, int i)
{
    return gp_node_input(ctx->graph, ctx->node, i);
}

struct gp_value *gp_out(struct gp_infer_ctx *ctx, int i)
{
    return gp_node_output(ctx->graph, ctx->node, i);
}

void gp_set_out(struct gp_infer_ctx *ctx, int i, enum gp_dtype dtype, const struct gp_shape *shape)
{
    struct gp_value *v = gp_out(ctx, i);
    if (!v) return;
    v->dtype = dtype;
    v->shape = *shape;
    v->has_shape = true;
}

/* No real model folds a constant anywhere near this (GPT-2's largest
 * initializer is 155 MB): a larger one comes from a malformed model (a
 * Range or ConstantOfShape of absurd length) and is refused, not allocated.
 * 1 GiB, not 4: a 3.6 GB Range took 4 s to fold, over 10 s under the
 * sanitizers (tests/data/fuzz/range_3gib_fold.onnx, a fuzzer timeout). */
#define GP_MAX_FOLDED_BYTES ((int64_t)1 << 30)

struct gp_tensor *gp_fold_out(struct gp_infer_ctx *ctx, int i)
{
    struct gp_value *v = gp_out(ctx, i);
    if (!v) return NULL;
    int64_t n = gp_shape_numel(&v->shape), es = (int64_t)gp_dtype_size(v->dtype);
    if (n < 0 || (es > 0 && n > GP_MAX_FOLDED_BYTES / es)) {
        char s[160];
        gp_op_error(ctx, GP_ERR_UNSUPPORTED, "the constant '%s' it makes at load time, %s %s, would take more "
                    "than %lld GiB",
                    v->name, gp_dtype_name(v->dtype), gp_shape_format(&v->shape, s, sizeof s),
                    (long long)(GP_MAX_FOLDED_BYTES >> 30));
        return NULL;
    }
    v->constant = gp_graph_new_tensor(ctx->graph, v->dtype, &v->shape);
    if (!v->constant)
        gp_op_error(ctx, GP_ERR_NOMEM, "cannot allocate the folded constant '%s'", v->name);
    return v->constant;
}

gp_status gp_op_error(struct gp_infer_ctx *ctx, gp_status status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return gp_error_set(ctx->err, status, "node '%s' (%s): %s", ctx->node->name,
                        ctx->node->op_type, msg);
}

gp_status gp_need_const(struct gp_infer_ctx *ctx, int i, const struct gp_tensor **out)
{
    struct gp_value *v = gp_in(ctx, i);
    if (!v)
        return gp_op_error(ctx, GP_ERR_INVALID, "input %d is required", i);
    if (!v->constant || v->kind == GP_VALUE_PARAMETER)
        return gp_op_error(ctx, GP_ERR_UNSUPPORTED,
                           "input %d ('%s') must be known at load time (a constant or computed "
                           "from shapes), but it depends on data or trainable parameters",
                           i, v->name);
    *out = v->constant;
    return GP_OK;
}

gp_status gp_broadcast(struct gp_infer_ctx *ctx, const struct gp_shape *a,
                       const struct gp_shape *b, struct gp_shape *out)
{
    int rank = a->rank > b->rank ? a->rank : b->rank;
    struct gp_shape r = {.rank = rank};
    for (int i = 0; i < rank; i++) {
        int ia = i - (rank - a->rank), ib = i - (rank - b->rank);
        int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            char sa[128], sb[128];
            return gp_op_error(ctx, GP_ERR_SHAPE, "shapes %s and %s do not broadcast",
                               gp_shape_format(a, sa, sizeof sa), gp_shape_format(b, sb, sizeof sb));
        }
        r.dims[i] = da == 1 ? db : da;
    }
    *out = r;
    return GP_OK;
}

gp_status gp_norm_axis(struct gp_infer_ctx *ctx, int64_t axis, int rank, int *out)
{
    if (axis < -rank || axis >= rank)
        return gp_op_error(ctx, GP_ERR_INVALID, "axis %lld is out of range for rank %d",
                           (long long)axis, rank);
    *out = (int)(axis < 0 ? axis + rank : axis);
    return GP_OK;
}

gp_status gp_same_dtype(struct gp_infer_ctx *ctx, int first, int last)
{
    struct gp_value *ref = gp_in(ctx, first);
    if (!ref) return GP_OK;
    for (int i = first + 1; i <= last; i++) {
        struct gp_value *v = gp_in(ctx, i);
        if (v && v->dtype != ref->dtype)
            return gp_op_error(ctx, GP_ERR_INVALID, "input %d is %s but input %d is %s", i,
                               gp_dtype_name(v->dtype), first, gp_dtype_name(ref->dtype));
    }
    return GP_OK;
}

gp_status gp_check_shape(struct gp_infer_ctx *ctx, const struct gp_shape *shape)
{
    if (shape->rank > GP_MAX_RANK)
        return gp_op_error(ctx, GP_ERR_UNSUPPORTED, "rank %d exceeds the supported %d",
                           shape->rank, GP_MAX_RANK);
    if (!gp_shape_check(shape, 8)) {
        char s[160];
        return gp_op_error(ctx, GP_ERR_SHAPE, "invalid output shape %s (negative or too large)",
                           gp_shape_format(shape, s, sizeof s));
    }
    return GP_OK;
}
