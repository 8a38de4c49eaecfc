/* Neural-network layers: convolution, pooling, normalization, dropout,
 * resizing and padding. Shape inference only; kernels live with the
 * backends. Tensors are [N, C, D1, ..., Dk] unless said otherwise. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ops/families.h"
#include "ops/fold_util.h"
#include "ops/window.h"

#define SHAPE_BUF 160

static const char *fmt(const struct gp_shape *s, char *buf)
{
    return gp_shape_format(s, buf, SHAPE_BUF);
}

/* x must be [N, C, ...] with at least `min_rank` axes. */
static gp_status want_rank(struct gp_infer_ctx *ctx, const struct gp_value *x, int min_rank,
                           const char *layout)
{
    if (x->shape.rank >= min_rank) return GP_OK;
    char s[SHAPE_BUF];
    return gp_op_error(ctx, GP_ERR_SHAPE, "input '%s' has shape %s; expected %s", x->name,
                       fmt(&x->shape, s), layout);
}

/* Input i, when present, must be the 1-D vector [n] ("one per channel"). */
static gp_status want_vector(struct gp_infer_ctx *ctx, int i, const char *what, int64_t n,
                             const char *per)
{
    struct gp_value *v = gp_in(ctx, i);
    if (!v) return GP_OK;
    if (v->shape.rank == 1 && v->shape.dims[0] == n) return GP_OK;
    char s[SHAPE_BUF];
    return gp_op_error(ctx, GP_ERR_SHAPE, "%s '%s' has shape %s; expected [%lld] (one per %s)",
                       what, v->name, fmt(&v->shape, s), (long long)n, per);
}

/* One of the comma-separated `allowed` words, or an error naming them. */
static gp_status want_choice(struct gp_infer_ctx *ctx, const char *attr, const char *dflt,
                             const char *allowed, const char **out)
{
    const char *s = gp_node_attr_string(ctx->node, attr, dflt);
    size_t len = strlen(s);
    for (const char *p = allowed; *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == len && strncmp(p, s, n) == 0) {
            *out = s;
            return GP_OK;
        }
        if (!end) break;
        p = end + 1;
    }
    return gp_op_error(ctx, GP_ERR_INVALID, "%s '%s' is not one of %s", attr, s, allowed);
}

static gp_status want_flag(struct gp_infer_ctx *ctx, const char *attr)
{
    int64_t v = gp_node_attr_int(ctx->node, attr, 0);
    if (v == 0 || v == 1) return GP_OK;
    return gp_op_error(ctx, GP_ERR_INVALID, "%s must be 0 or 1, not %lld", attr, (long long)v);
}

/* ---- convolution ---- */

/* Conv: X [N, C, D1..Dk], W [M, C/group, k1..kk], optional B [M]
 * -> Y [N, M, O1..Ok]. */
static gp_status conv_infer(struct gp_infer_ctx *ctx)
{
    struct gp_value *x, *w;
    GP_TRY(gp_req_in(ctx, 0, &x));
    GP_TRY(gp_req_in(ctx, 1, &w));
    GP_TRY(gp_want_float(ctx, 0));
    GP_TRY(gp_same_dtype(ctx, 0, 2));
    GP_TRY(want_rank(ctx, x, 3, "[N, C, D1, ...] with at least one spatial axis"));
    char sx[SHAPE_BUF], sw[SHAPE_BUF];
    if (w->shape.rank != x->shape.rank)
        return gp_op_error(ctx, GP_ERR_SHAPE,
                           "weight has shape %s but the input %s: expected a weight of rank %d, "
                           "[M, C/group, k1, ...]",
                           fmt(&w->shape, sw), fmt(&x->shape, sx), x->shape.rank);
    int64_t group = gp_node_attr_int(ctx->node, "group", 1);
    int64_t c = x->shape.dims[1], m = w->shape.dims[0];
    if (group < 1 || group > c)
        return gp_op_error(ctx, GP_ERR_INVALID, "group %lld must be in [1, %lld] (the input "
                           "channels)", (long long)group, (long long)c);
    if (c % group)
        return gp_op_error(ctx, GP_ERR_SHAPE, "input has %lld channels, which group %lld does "
                           "not divide", (long long)c, (long long)group);
    int64_t expects;
    if (__builtin_mul_overflow(w->shape.dims[1], group, &expects))
        return gp_op_error(ctx, GP_ERR_SHAPE, "weight %s times group %lld overflows",
                           fmt(&w->shape, sw), (long long)group);
    if (expects != c)
        return gp_op_error(ctx, GP_ERR_SHAPE,
                           "input has %lld channels but the weight %s expects %lld (group %lld)",
                           (long long)c, fmt(&w->shape, sw), (long long)expects, (long long)group);
    if (m % group)
        return gp_op_error(ctx, GP_ERR_SHAPE, "weight has %lld output channels, which group %lld "
                           "does not divide", (long long)m, (long long)group);
    GP_TRY(want_vector(ctx, 2, "bias", m, "output channel"));
    struct gp_window win;
    GP_TRY(gp_window_resolve(ctx, GP_WINDOW_CONV, &x->shape, &w->shape.dims[2], &win));
    struct gp_shape y = {.rank = x->shape.rank, .dims = {x->shape.dims[0], m}};
    for (int i = 0; i < win.n_spatial; i++) y.dims[i + 2] = win.out[i];
    GP_TRY(gp_check_shape(ctx, &y));
    gp_set_out(ctx, 0, x->dtype, &y);
    return GP_OK;
}

/* ConvTranspose: X [N, C, D1..Dk], W [C, M/group, k1..kk], optional B [M]
 * -> Y [N, M, O1..Ok]. */
static gp_status conv_transpose_infer(struct gp_infer_ctx *ctx)
{
    struct gp_value *x, *w;
    GP_TRY(gp_req_in(ctx, 0, &x));
    GP_TRY(gp_req_in(ctx, 1, &w));
    GP_TRY(gp_want_float(ctx, 0));
    GP_TRY(gp_same_dtype(ctx, 0, 2));
    GP_TRY(want_rank(ctx, x, 3, "[N, C, D1, ...] with at least one spatial axis"));
    char sx[SHAPE_BUF], sw[SHAPE_BUF];
    if (w->shape.rank != x->shape.rank)
        return gp_op_error(ctx, GP_ERR_SHAPE,
                           "weight has shape %s but the input %s: expected a weight of rank %d, "
                           "[C, M/group, k1, ...]",
                           fmt(&w->shape, sw), fmt(&x->shape, sx), x->shape.rank);
    int64_t group = gp_node_attr_int(ctx->node, "group", 1);
    int64_t c = x->shape.dims[1];
    if (group < 1 || group > c)
        return gp_op_error(ctx, GP_ERR_INVALID, "group %lld must be in [1, %lld] (the input "
                           "channels)", (long long)group, (long long)c);
    if (w->shape.dims[0] != c)
        return gp_op_error(ctx, GP_ERR_SHAPE,
                           "input has %lld channels but the weight %s expects %lld (its axis 0)",
                           (long long)c, fmt(&w->shape, sw), (long long)w->shape.dims[0]);
    if (c % group)
        return gp_op_error(ctx, GP_ERR_SHAPE, "input has %lld channels, which group %lld does "
                           "not divide", (long long)c, (long long)group);
    int64_t m;
    if (__builtin_mul_overflow(w->shape.dims[1], group, &m))
        return gp_op_error(ctx, GP_ERR_SHAPE, "weight %s times group %lld overflows",
                           fmt(&w->shape, sw), (long long)group);
    GP_TRY(want_vector(ctx, 2, "bias", m, "output channel"));
    struct gp_window win;
    GP_TRY(gp_window_resolve(ctx, GP_WINDOW_CONV_TRANSPOSE, &x->shape, &w->shape.dims[2], &win));
    struct gp_shape y = {.rank = x->shape.rank, .dims = {x->shape.dims[0], m}};
    for (int i = 0; i < win.n_spatial; i++) y.dims[i + 2] = win.out[i];
    GP_TRY(gp_check_shape(ctx, &y));
    gp_set_out(ctx, 0, x->dtype, &y);
    return GP_OK;
}

/* ---- pooling ---- */

/* MaxPool / AveragePool: X [N, C, D1..Dk] -> Y [N, C, O1..Ok]; MaxPool's
 * optional Indices has Y's shape, int64 offsets into X. */
static gp_status pool_infer(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    bool is_max = strcmp(ctx->node->op_type, "MaxPool") == 0;
    /* MaxPool-12 also takes 8-bit integers (quantized models). */
    if (!(is_max && (x->dtype == GP_DTYPE_INT8 || x->dtype == GP_DTYPE_UINT8)))
        GP_TRY(gp_want_float(ctx, 0));
    GP_TRY(want_rank(ctx, x, 3, "[N, C, D1, ...] with at least one spatial axis"));
    GP_TRY(want_flag(ctx, "ceil_mode"));
    GP_TRY(want_flag(ctx, "count_include_pad"));
    GP_TRY(want_flag(ctx, "storage_order"));
    struct gp_window win;
    GP_TRY(gp_window_resolve(ctx, GP_WINDOW_POOL, &x->shape, NULL, &win));
    /* Explicit pads must leave every window an input cell (derived SAME
     * pads always do). */
    const char *auto_pad = gp_node_attr_string(ctx->node, "auto_pad", "NOTSET");
    bool explicit_pads = strcmp(auto_pad, "NOTSET") == 0;
    for (int i = 0; explicit_pads && i < win.n_spatial; i++)
        if (win.pad_begin[i] >= win.kernel[i] || win.pad_end[i] >= win.kernel[i])
            return gp_op_error(ctx, GP_ERR_INVALID,
                               "spatial axis %d: pads %lld, %lld must be smaller than the kernel "
                               "size %lld",
                               i, (long long)win.pad_begin[i], (long long)win.pad_end[i],
                               (long long)win.kernel[i]);
    struct gp_shape y = x->shape;
    for (int i = 0; i < win.n_spatial; i++) y.dims[i + 2] = win.out[i];
    GP_TRY(gp_check_shape(ctx, &y));
    gp_set_out(ctx, 0, x->dtype, &y);
    gp_set_out(ctx, 1, GP_DTYPE_INT64, &y);
    return GP_OK;
}

/* GlobalAveragePool / GlobalMaxPool: [N, C, D1..Dk] -> [N, C, 1..1]. */
static gp_status global_pool_infer(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    GP_TRY(gp_want_float(ctx, 0));
    GP_TRY(want_rank(ctx, x, 3, "[N, C, D1, ...] with at least one spatial axis"));
    struct gp_shape y = x->shape;
    for (int i = 2; i < y.rank; i++) y.dims[i] = 1;
    gp_set_out(ctx, 0, x->dtype, &y);
    return GP_OK;
}

/* ---- normalization ---- */

/* BatchNormalization: X [N, C, D1..Dk] (k may be 0), scale, B, mean, var [C]
 * -> Y like X. The optional outputs are all [C]: opsets 7 and 9 list
 * running mean, running var, saved mean, saved var (what PyTorch exports in
 * training mode); opset 14 only the running pair, and only in training mode.
 * Opsets 7-9 use one dtype throughout; 14 lets mean/var differ from X, 15
 * also scale/B. */
static gp_status batch_norm_infer(struct gp_infer_ctx *ctx)
{
    struct gp_value *x, *in[5];
    for (int i = 0; i < 5; i++) GP_TRY(gp_req_in(ctx, i, &in[i]));
    x = in[0];
    int version = ctx->node->def->since_version;
    for (int i = 0; i < 5; i++) GP_TRY(gp_want_float(ctx, i));
    if (version < 14) {
        GP_TRY(gp_same_dtype(ctx, 0, 4));
    } else {
        GP_TRY(gp_same_dtype(ctx, version >= 15 ? 1 : 0, 2));
        GP_TRY(gp_same_dtype(ctx, 3, 4));
    }
    if (version < 9 && gp_node_attr_int(ctx->node, "spatial", 1) != 1)
        return gp_op_error(ctx, GP_ERR_UNSUPPORTED,
                           "spatial=0 (statistics per activation, not per channel) is not "
                           "supported");
    GP_TRY(want_rank(ctx, x, 2, "[N, C, ...]"));
    int64_t c = x->shape.dims[1];
    static const char *const names[5] = {"X", "scale", "B", "mean", "var"};
    for (int i = 1; i < 5; i++) GP_TRY(want_vector(ctx, i, names[i], c, "channel"));
    if (version >= 14) {
        GP_TRY(want_flag(ctx, "training_mode"));
        bool training = gp_node_attr_int(ctx->node, "training_mode", 0) != 0;
        if (!training && (gp_out(ctx, 1) || gp_out(ctx, 2)))
            return gp_op_error(ctx, GP_ERR_INVALID,
                               "outputs running_mean and running_var need training_mode=1");
    }
    float momentum = gp_node_attr_float(ctx->node, "momentum", 0.9f);
    if (!(momentum >= 0.0f && momentum <= 1.0f))
        return gp_op_error(ctx, GP_ERR_INVALID, "momentum %g is outside [0, 1]",
                           (double)momentum);
    if (!(gp_node_attr_float(ctx->node, "epsilon", 1e-5f) >= 0.0f))
        return gp_op_error(ctx, GP_ERR_INVALID, "epsilon must not be negative");
    gp_set_out(ctx, 0, x->dtype, &x->shape);
    struct gp_shape stat = {.rank = 1, .dims = {c}};
    for (int i = 1; i < 5; i++) gp_set_out(ctx, i, in[3]->dtype, &stat);
    return GP_OK;
}

/* InstanceNormalization: X [N, C, D1..Dk], scale [C], B [C] -> like X. */
static gp_status instance_norm_infer(struct gp_infer_ctx *ctx)
{
    struct gp_value *x, *scale, *bias;
    GP_TRY(gp_req_in(ctx, 0, &x));
    GP_TRY(gp_req_in(ctx, 1, &scale));
    GP_TRY(gp_req_in(ctx, 2, &bias));
    GP_TRY(gp_want_float(ctx, 0));
    GP_TRY(gp_same_dtype(ctx, 0, 2));
    GP_TRY(want_rank(ctx, x, 3, "[N, C, D1, ...] with at least one spatial axis"));
    GP_TRY(want_vector(ctx, 1, "scale", x->shape.dims[1], "channel"));
    GP_TRY(want_vector(ctx, 2, "B", x->shape.dims[1], "channel"));
    gp_set_out(ctx, 0, x->dtype, &x->shape);
    return GP_OK;
}

/* LayerNormalization: X [D0..Dr-1] normalized over axes [axis, r); Scale and
 * optional B broadcast (unidirectionally) to [D_axis..Dr-1]. Y is like X;
 * Mean and InvStdDev are X's shape with the normalized axes set to 1, in
 * the stash_type precision. */
static gp_status layer_norm_infer(struct gp_infer_ctx *ctx)
{
    struct gp_value *x, *scale;
    GP_TRY(gp_req_in(ctx, 0, &x));
    GP_TRY(gp_req_in(ctx, 1, &scale));
    GP_TRY(gp_want_float(ctx, 0));
    GP_TRY(gp_same_dtype(ctx, 0, 2));
    int r = x->shape.rank, axis;
    if (r < 1) return gp_op_error(ctx, GP_ERR_SHAPE, "input '%s' is a scalar", x->name);
    GP_TRY(gp_norm_axis(ctx, gp_node_attr_int(ctx->node, "axis", -1), r, &axis));
    struct gp_shape normalized = {.rank = r - axis};
    for (int i = axis; i < r; i++) normalized.dims[i - axis] = x->shape.dims[i];
    for (int k = 1; k <= 2; k++) {
        struct gp_value *p = gp_in(ctx, k);
        if (!p) continue;
        bool ok = p->shape.rank <= normalized.rank;
        for (int i = 0; ok && i < p->shape.rank; i++) {
            int64_t d = p->shape.dims[p->shape.rank - 1 - i];
            ok = d == 1 || d == normalized.dims[normalized.rank - 1 - i];
        }
        if (!ok) {
            char sp[SHAPE_BUF], sn[SHAPE_BUF];
            return gp_op_error(ctx, GP_ERR_SHAPE,
                               "%s '%s' has shape %s, which does not broadcast to the normalized "
                               "shape %s (axis %d)",
                               k == 1 ? "Scale" : "B", p->name, fmt(&p->shape, sp),
                               fmt(&normalized, sn), axis);
        }
    }
    int64_t stash = gp_node_attr_int(ctx->node, "stash_type", 1);
    if (stash != GP_DTYPE_FLOAT32 && stash != GP_DTYPE_BFLOAT16)
        return gp_op_error(ctx, GP_ERR_INVALID,
                           "stash_type %lld is not float32 (1) or bfloat16 (16)", (long long)stash);
    gp_set_out(ctx, 0, x->dtype, &x->shape);
    struct gp_shape stat = x->shape;
    for (int i = axis; i < r; i++) stat.dims[i] = 1;
    gp_set_out(ctx, 1, (enum gp_dtype)stash, &stat);
    gp_set_out(ctx, 2, (enum gp_dtype)stash, &stat);
    return GP_OK;
}

/* ---- dropout ---- */

/* Dropout: data -> output like data, optional mask like data (dtype of data
 * in opset 7, bool since 10). Opset 12 moved ratio and training_mode from
 * attributes to scalar inputs; the ratio must be a load-time constant since
 * it fixes the kernel's scale 1 / (1 - ratio). */
static gp_status dropout_infer(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    GP_TRY(gp_want_float(ctx, 0));
    int version = ctx->node->def->since_version;
    double ratio = 0.5;
    if (version < 12) {
        ratio = gp_node_attr_float(ctx->node, "ratio", 0.5f);
    } else if (gp_in(ctx, 1)) {
        const struct gp_tensor *t;
        GP_TRY(gp_want_float(ctx, 1));
        GP_TRY(gp_need_const(ctx, 1, &t));
        if (gp_shape_numel(&t->shape) != 1) {
            char s[SHAPE_BUF];
            return gp_op_error(ctx, GP_ERR_SHAPE, "ratio has shape %s; expected a scalar",
                               fmt(&t->shape, s));
        }
        ratio = gp_tensor_get_f64(t, 0);
    }
    if (!(ratio >= 0.0 && ratio < 1.0))
        return gp_op_error(ctx, GP_ERR_INVALID, "ratio %g is outside [0, 1)", ratio);
    struct gp_value *mode = gp_in(ctx, 2);
    if (mode) {
        GP_TRY(gp_want_bool(ctx, 2));
        if (gp_shape_numel(&mode->shape) != 1) {
            char s[SHAPE_BUF];
            return gp_op_error(ctx, GP_ERR_SHAPE, "training_mode has shape %s; expected a scalar",
                               fmt(&mode->shape, s));
        }
    }
    gp_set_out(ctx, 0, x->dtype, &x->shape);
    gp_set_out(ctx, 1, version < 10 ? x->dtype : GP_DTYPE_BOOL, &x->shape);
    return GP_OK;
}

/* ---- resizing ---- */

/* Reads constant float scales (input i) into out[0..*n); an empty tensor
 * gives *n = 0 (opset 11's placeholder when sizes is used). */
static gp_status const_scales(struct gp_infer_ctx *ctx, int i, float *out, int max, int *n)
{
    const struct gp_tensor *t;
    GP_TRY(gp_need_const(ctx, i, &t));
    if (!gp_dtype_is_float(t->dtype) || t->shape.rank > 1) {
        char s[SHAPE_BUF];
        return gp_op_error(ctx, GP_ERR_INVALID, "scales must be a 1-D float tensor, not %s %s",
                           gp_dtype_name(t->dtype), fmt(&t->shape, s));
    }
    int64_t count = gp_shape_numel(&t->shape);
    if (count > max)
        return gp_op_error(ctx, GP_ERR_SHAPE, "scales has %lld entries; the input has rank %d",
                           (long long)count, max);
    for (int64_t k = 0; k < count; k++) out[k] = (float)gp_tensor_get_f64(t, k);
    *n = (int)count;
    return GP_OK;
}

/* out[d] = floor(in[d] * scale), in single precision as onnxruntime and ONNX's
 * shape inference compute it (so 10 * 0.7f gives 7, not 6). ONNX's text
 * multiplies by the roi extent for tf_crop_and_resize; neither
 * implementation does, nor do we. */
static gp_status apply_scales(struct gp_infer_ctx *ctx, const struct gp_shape *x,
                              const int *axes, int n, const float *scales, bool at_least_one,
                              struct gp_shape *y)
{
    for (int k = 0; k < n; k++) {
        int d = axes[k];
        if (!(scales[k] > 0.0f) || (at_least_one && scales[k] < 1.0f) || !isfinite(scales[k]))
            return gp_op_error(ctx, GP_ERR_INVALID, "scale %g for axis %d must be %s",
                               (double)scales[k], d, at_least_one ? "at least 1" : "positive");
        float v = floorf((float)x->dims[d] * scales[k]);
        if (v > 9.0e15f)
            return gp_op_error(ctx, GP_ERR_SHAPE, "scale %g makes axis %d too large",
                               (double)scales[k], d);
        y->dims[d] = (int64_t)v;
    }
    return GP_OK;
}

/* Resize: X [D0..Dr-1] -> Y with the axes named by `axes` (all by default)
 * scaled. Opset 10: (X, scales). 11: (X, roi, scales[, sizes]) where one of
 * scales/sizes may be an empty tensor. 13: roi and scales may be omitted.
 * 18: axes, keep_aspect_ratio_policy, antialias. 19: half_pixel_symmetric. */
static gp_status resize_infer(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    int version = ctx->node->def->since_version, r = x->shape.rank;
    const char *s;
    GP_TRY(want_choice(ctx, "mode", "nearest", version >= 11 ? "nearest,linear,cubic"
                                                             : "nearest,linear", &s));
    if (version >= 11) {
        const char *coords = version >= 19 ? "half_pixel,half_pixel_symmetric,pytorch_half_pixel,"
                                             "align_corners,asymmetric,tf_crop_and_resize"
                             : version >= 13 ? "half_pixel,pytorch_half_pixel,align_corners,"
                                               "asymmetric,tf_crop_and_resize"
                                             : "half_pixel,pytorch_half_pixel,align_corners,"
                                               "asymmetric,tf_half_pixel_for_nn,"
                                               "tf_crop_and_resize";
        GP_TRY(want_choice(ctx, "coordinate_transformation_mode", "half_pixel", coords, &s));
        bool crop = strcmp(s, "tf_crop_and_resize") == 0;
        GP_TRY(want_choice(ctx, "nearest_mode", "round_prefer_floor",
                           "round_prefer_floor,round_prefer_ceil,floor,ceil", &s));
        GP_TRY(want_flag(ctx, "exclude_outside"));
        GP_TRY(want_flag(ctx, "antialias"));
        if (version < 13 && (!gp_in(ctx, 1) || !gp_in(ctx, 2)))
            return gp_op_error(ctx, GP_ERR_INVALID, "inputs roi and scales are required before "
                               "opset 13 (give an empty tensor for the one not used)");
        /* roi only matters for tf_crop_and_resize, where the kernel needs it. */
        if (crop) {
            const struct gp_tensor *roi;
            if (!gp_in(ctx, 1))
                return gp_op_error(ctx, GP_ERR_INVALID, "tf_crop_and_resize needs the roi input");
            GP_TRY(gp_need_const(ctx, 1, &roi));
        }
    }

    /* Axes that scales/sizes refer to: all, or the axes attribute (18+). */
    int axes[GP_MAX_RANK], n_axes = r;
    for (int i = 0; i < r; i++) axes[i] = i;
    const int64_t *ax;
    int64_t n_ax = gp_node_attr_ints(ctx->node, "axes", &ax);
    if (n_ax >= 0) {
        if (n_ax > r)
            return gp_op_error(ctx, GP_ERR_INVALID, "axes has %lld entries for rank %d",
                               (long long)n_ax, r);
        n_axes = (int)n_ax;
        for (int k = 0; k < n_axes; k++) {
            GP_TRY(gp_norm_axis(ctx, ax[k], r, &axes[k]));
            for (int j = 0; j < k; j++)
                if (axes[j] == axes[k])
                    return gp_op_error(ctx, GP_ERR_INVALID, "axis %d is repeated in axes", axes[k]);
        }
    }

    float scales[GP_MAX_RANK];
    int n_scales = 0;
    int scales_at = version >= 11 ? 2 : 1;
    if (gp_in(ctx, scales_at)) GP_TRY(const_scales(ctx, scales_at, scales, GP_MAX_RANK, &n_scales));
    int64_t sizes[GP_MAX_RANK];
    int n_sizes = 0;
    bool have_sizes = version >= 11 && gp_in(ctx, 3);
    if (have_sizes) GP_TRY(gp_const_ints(ctx, 3, "sizes", sizes, GP_MAX_RANK, &n_sizes));
    if (n_scales && n_sizes)
        return gp_op_error(ctx, GP_ERR_INVALID, "both scales and sizes are given; only one may be");
    if (!n_scales && !n_sizes)
        return gp_op_error(ctx, GP_ERR_INVALID, "neither scales nor sizes is given (or both are "
                           "empty)");
    int n_given = n_scales ? n_scales : n_sizes;
    if (n_given != n_axes) {
        char sx[SHAPE_BUF];
        if (n_ax >= 0)
            return gp_op_error(ctx, GP_ERR_SHAPE, "%s has %d entries but the axes attribute "
                               "lists %d", n_scales ? "scales" : "sizes", n_given, n_axes);
        return gp_op_error(ctx, GP_ERR_SHAPE, "%s has %d entries but the input %s has %d axes",
                           n_scales ? "scales" : "sizes", n_given, fmt(&x->shape, sx), n_axes);
    }

    struct gp_shape y = x->shape;
    if (n_scales) {
        GP_TRY(apply_scales(ctx, &x->shape, axes, n_axes, scales, false, &y));
    } else {
        GP_TRY(want_choice(ctx, "keep_aspect_ratio_policy", "stretch",
                           "stretch,not_larger,not_smaller", &s));
        for (int k = 0; k < n_axes; k++)
            if (sizes[k] < 0)
                return gp_op_error(ctx, GP_ERR_INVALID, "sizes[%d] is %lld", k,
                                   (long long)sizes[k]);
        if (strcmp(s, "stretch") == 0) {
            for (int k = 0; k < n_axes; k++) y.dims[axes[k]] = sizes[k];
        } else {
            /* One scale for all listed axes, the smallest (not_larger) or
             * largest (not_smaller) of sizes/in, then rounded half up; in
             * single precision like onnxruntime. */
            bool larger = strcmp(s, "not_smaller") == 0;
            float scale = larger ? 0.0f : INFINITY;
            for (int k = 0; k < n_axes; k++) {
                int64_t in = x->shape.dims[axes[k]];
                if (in == 0)
                    return gp_op_error(ctx, GP_ERR_SHAPE, "axis %d has size 0", axes[k]);
                float f = (float)sizes[k] / (float)in;
                scale = larger ? fmaxf(scale, f) : fminf(scale, f);
            }
            for (int k = 0; k < n_axes; k++)
                y.dims[axes[k]] = (int64_t)roundf(scale * (float)x->shape.dims[axes[k]]);
        }
    }
    GP_TRY(gp_check_shape(ctx, &y));
    gp_set_out(ctx, 0, x->dtype, &y);
    return GP_OK;
}

/* Upsample (deprecated for Resize in opset 10): X -> floor(X.dims * scales),
 * scales >= 1, one per axis; an attribute in opset 7, a constant input in 9. */
static gp_status upsample_infer(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    const char *mode;
    GP_TRY(want_choice(ctx, "mode", "nearest", "nearest,linear", &mode));
    int r = x->shape.rank, n = 0;
    float scales[GP_MAX_RANK];
    if (ctx->node->def->since_version >= 9) {
        GP_TRY(const_scales(ctx, 1, scales, GP_MAX_RANK, &n));
    } else {
        const struct gp_attr *a = gp_node_attr(ctx->node, "scales");
        if (!a) return gp_op_error(ctx, GP_ERR_INVALID, "the scales attribute is required");
        if (a->count > GP_MAX_RANK)
            return gp_op_error(ctx, GP_ERR_SHAPE, "scales has %lld entries; the input has rank %d",
                               (long long)a->count, r);
        n = (int)a->count;
        for (int k = 0; k < n; k++) scales[k] = a->floats[k];
    }
    if (n != r) {
        char sx[SHAPE_BUF];
        return gp_op_error(ctx, GP_ERR_SHAPE, "scales has %d entries but the input %s has rank %d",
                           n, fmt(&x->shape, sx), r);
    }
    int axes[GP_MAX_RANK];
    for (int i = 0; i < r; i++) axes[i] = i;
    struct gp_shape y = x->shape;
    GP_TRY(apply_scales(ctx, &x->shape, axes, r, scales, true, &y));
    GP_TRY(gp_check_shape(ctx, &y));
    gp_set_out(ctx, 0, x->dtype, &y);
    return GP_OK;
}

/* ---- padding ---- */

/* Pad: data [D0..Dr-1] -> [D0 + begin0 + end0, ...]. pads is [begins...,
 * ends...] over all axes (or over `axes` since opset 18); negative entries
 * crop. An attribute in opset 2, a constant int64 input since 11. */
static gp_status pad_infer(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    int version = ctx->node->def->since_version, r = x->shape.rank;
    const char *mode;
    GP_TRY(want_choice(ctx, "mode", "constant",
                       version >= 19 ? "constant,reflect,edge,wrap" : "constant,reflect,edge",
                       &mode));
    int64_t pads[2 * GP_MAX_RANK];
    int n_pads = 0;
    if (version < 11) {
        GP_TRY(gp_want_float(ctx, 0));
        const int64_t *v;
        int64_t n = gp_node_attr_ints(ctx->node, "pads", &v);
        if (n < 0) return gp_op_error(ctx, GP_ERR_INVALID, "the pads attribute is required");
        if (n > 2 * GP_MAX_RANK)
            return gp_op_error(ctx, GP_ERR_SHAPE, "pads has %lld entries for rank %d",
                               (long long)n, r);
        n_pads = (int)n;
        memcpy(pads, v, sizeof *v * (size_t)n);
    } else {
        GP_TRY(gp_const_ints(ctx, 1, "pads", pads, 2 * GP_MAX_RANK, &n_pads));
        struct gp_value *cv = gp_in(ctx, 2);
        if (cv) {
            if (cv->dtype != x->dtype)
                return gp_op_error(ctx, GP_ERR_INVALID, "constant_value is %s but the data is %s",
                                   gp_dtype_name(cv->dtype), gp_dtype_name(x->dtype));
            if (gp_shape_numel(&cv->shape) != 1) {
                char s[SHAPE_BUF];
                return gp_op_error(ctx, GP_ERR_SHAPE,
                                   "constant_value has shape %s; expected a scalar",
                                   fmt(&cv->shape, s));
            }
        }
    }
    int axes[GP_MAX_RANK], n_axes = r;
    for (int i = 0; i < r; i++) axes[i] = i;
    if (version >= 18 && gp_in(ctx, 3)) {
        int64_t ax[GP_MAX_RANK];
        GP_TRY(gp_want_int_index(ctx, 3));
        GP_TRY(gp_const_ints(ctx, 3, "axes", ax, GP_MAX_RANK, &n_axes));
        for (int k = 0; k < n_axes; k++) {
            GP_TRY(gp_norm_axis(ctx, ax[k], r, &axes[k]));
            for (int j = 0; j < k; j++)
                if (axes[j] == axes[k])
                    return gp_op_error(ctx, GP_ERR_INVALID, "axis %d is repeated in axes", axes[k]);
        }
    }
    if (n_pads != 2 * n_axes) {
        char sx[SHAPE_BUF];
        return gp_op_error(ctx, GP_ERR_SHAPE, "pads has %d entries; the input %s needs %d (begin "
                           "and end of %d axes)",
                           n_pads, fmt(&x->shape, sx), 2 * n_axes, n_axes);
    }
    struct gp_shape y = x->shape;
    for (int k = 0; k < n_axes; k++) {
        int d = axes[k];
        int64_t in = x->shape.dims[d], b = pads[k], e = pads[n_axes + k];
        if (b < -in || e < -in || b > ((int64_t)1 << 40) || e > ((int64_t)1 << 40) ||
            in + b + e < 0)
            return gp_op_error(ctx, GP_ERR_SHAPE, "pads %lld, %lld on axis %d of size %lld leave "
                               "a negative size",
                               (long long)b, (long long)e, d, (long long)in);
        /* Reflection needs a source cell strictly inside the axis; edge and
         * wrap need at least one cell, wrap no more than one period. */
        int64_t most = b > e ? b : e;
        if (most > 0 && ((strcmp(mode, "reflect") == 0 && most >= in) ||
                         (strcmp(mode, "edge") == 0 && in == 0) ||
                         (strcmp(mode, "wrap") == 0 && most > in)))
            return gp_op_error(ctx, GP_ERR_SHAPE,
                               "%s padding of %lld on axis %d of size %lld is too large", mode,
                               (long long)most, d, (long long)in);
        y.dims[d] = in + b + e;
    }
    GP_TRY(gp_check_shape(ctx, &y));
    gp_set_out(ctx, 0, x->dtype, &y);
    return GP_OK;
}

/* ---- the table ---- */

#define CONV_ATTRS "auto_pad:s,dilations:I,group:i,kernel_shape:I,pads:I,strides:I"
#define CONVT_ATTRS CONV_ATTRS ",output_padding:I,output_shape:I"
#define POOL_ATTRS "auto_pad:s,kernel_shape:I,pads:I,strides:I"
#define RESIZE11_ATTRS                                                                     \
    "coordinate_transformation_mode:s,cubic_coeff_a:f,exclude_outside:i,"                  \
    "extrapolation_value:f,mode:s,nearest_mode:s"
#define RESIZE18_ATTRS RESIZE11_ATTRS ",antialias:i,axes:I,keep_aspect_ratio_policy:s"

#define BIT(i) (1u << (i))

/* Versions not listed differ from the one before only in the types they
 * allow (Conv-11, MaxPool-11/12, Pad-13/21, Dropout-13...), so the lookup's
 * "highest since_version not above the opset" covers them. Upsample-10 only
 * deprecates the op; the 9 entry keeps accepting it. */
const struct gp_op_def gp_ops_nn[] = {
    {"", "Conv", 1, 2, 3, 1, 1, CONV_ATTRS, 0, conv_infer, GP_FOLD_NEVER, NULL},
    {"", "ConvTranspose", 1, 2, 3, 1, 1, CONVT_ATTRS, 0, conv_transpose_infer, GP_FOLD_NEVER, NULL},
    /* 11 swapped which side gets the odd cell of derived padding. */
    {"", "ConvTranspose", 11, 2, 3, 1, 1, CONVT_ATTRS, 0, conv_transpose_infer, GP_FOLD_NEVER,
     NULL},

    {"", "MaxPool", 1, 1, 1, 1, 1, POOL_ATTRS, 0, pool_infer, GP_FOLD_NEVER, NULL},
    {"", "MaxPool", 8, 1, 1, 1, 2, POOL_ATTRS ",storage_order:i", 0, pool_infer, GP_FOLD_NEVER,
     NULL},
    {"", "MaxPool", 10, 1, 1, 1, 2, POOL_ATTRS ",ceil_mode:i,dilations:I,storage_order:i", 0,
     pool_infer, GP_FOLD_NEVER, NULL},
    {"", "AveragePool", 1, 1, 1, 1, 1, POOL_ATTRS, 0, pool_infer, GP_FOLD_NEVER, NULL},
    {"", "AveragePool", 7, 1, 1, 1, 1, POOL_ATTRS ",count_include_pad:i", 0, pool_infer,
     GP_FOLD_NEVER, NULL},
    {"", "AveragePool", 10, 1, 1, 1, 1, POOL_ATTRS ",ceil_mode:i,count_include_pad:i", 0,
     pool_infer, GP_FOLD_NEVER, NULL},
    {"", "AveragePool", 19, 1, 1, 1, 1, POOL_ATTRS ",ceil_mode:i,count_include_pad:i,dilations:I",
     0, pool_infer, GP_FOLD_NEVER, NULL},
    {"", "GlobalAveragePool", 1, 1, 1, 1, 1, "", 0, global_pool_infer, GP_FOLD_NEVER, NULL},
    {"", "GlobalMaxPool", 1, 1, 1, 1, 1, "", 0, global_pool_infer, GP_FOLD_NEVER, NULL},

    /* Opsets 1 and 6 (consumed_inputs, is_test) are not supported. */
    {"", "BatchNormalization", 7, 5, 5, 1, 5, "epsilon:f,momentum:f,spatial:i", BIT(3) | BIT(4),
     batch_norm_infer, GP_FOLD_NEVER, NULL},
    {"", "BatchNormalization", 9, 5, 5, 1, 5, "epsilon:f,momentum:f", BIT(3) | BIT(4),
     batch_norm_infer, GP_FOLD_NEVER, NULL},
    {"", "BatchNormalization", 14, 5, 5, 1, 3, "epsilon:f,momentum:f,training_mode:i",
     BIT(3) | BIT(4), batch_norm_infer, GP_FOLD_NEVER, NULL},
    {"", "BatchNormalization", 15, 5, 5, 1, 3, "epsilon:f,momentum:f,training_mode:i",
     BIT(3) | BIT(4), batch_norm_infer, GP_FOLD_NEVER, NULL},
    {"", "InstanceNormalization", 6, 3, 3, 1, 1, "epsilon:f", 0, instance_norm_infer,
     GP_FOLD_NEVER, NULL},
    {"", "LayerNormalization", 17, 2, 3, 1, 3, "axis:i,epsilon:f,stash_type:i", 0,
     layer_norm_infer, GP_FOLD_NEVER, NULL},

    {"", "Dropout", 7, 1, 1, 1, 2, "ratio:f", 0, dropout_infer, GP_FOLD_NEVER, NULL},
    {"", "Dropout", 10, 1, 1, 1, 2, "ratio:f", 0, dropout_infer, GP_FOLD_NEVER, NULL},
    {"", "Dropout", 12, 1, 3, 1, 2, "seed:i", BIT(1) | BIT(2), dropout_infer, GP_FOLD_NEVER, NULL},

    {"", "Resize", 10, 2, 2, 1, 1, "mode:s", BIT(1), resize_infer, GP_FOLD_NEVER, NULL},
    {"", "Resize", 11, 3, 4, 1, 1, RESIZE11_ATTRS, BIT(1) | BIT(2) | BIT(3), resize_infer,
     GP_FOLD_NEVER, NULL},
    {"", "Resize", 13, 1, 4, 1, 1, RESIZE11_ATTRS, BIT(1) | BIT(2) | BIT(3), resize_infer,
     GP_FOLD_NEVER, NULL},
    {"", "Resize", 18, 1, 4, 1, 1, RESIZE18_ATTRS, BIT(1) | BIT(2) | BIT(3), resize_infer,
     GP_FOLD_NEVER, NULL},
    {"", "Resize", 19, 1, 4, 1, 1, RESIZE18_ATTRS, BIT(1) | BIT(2) | BIT(3), resize_infer,
     GP_FOLD_NEVER, NULL},
    {"", "Upsample", 7, 1, 1, 1, 1, "mode:s,scales:F", 0, upsample_infer, GP_FOLD_NEVER, NULL},
    {"", "Upsample", 9, 2, 2, 1, 1, "mode:s", BIT(1), upsample_infer, GP_FOLD_NEVER, NULL},

    {"", "Pad", 2, 1, 1, 1, 1, "mode:s,pads:I,value:f", 0, pad_infer, GP_FOLD_NEVER, NULL},
    {"", "Pad", 11, 2, 3, 1, 1, "mode:s", BIT(1) | BIT(2), pad_infer, GP_FOLD_NEVER, NULL},
    {"", "Pad", 18, 2, 4, 1, 1, "mode:s", BIT(1) | BIT(2) | BIT(3), pad_infer, GP_FOLD_NEVER,
     NULL},
    {"", "Pad", 19, 2, 4, 1, 1, "mode:s", BIT(1) | BIT(2) | BIT(3), pad_infer, GP_FOLD_NEVER,
     NULL},
    {0},
};
