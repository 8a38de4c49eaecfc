#include "ops/window.h"

#include <string.h>

#include "ops/fold_util.h"

/* Attribute values above this are refused, so that the window arithmetic
 * below (products of two of them, plus an input size) cannot overflow. */
#define WINDOW_ATTR_MAX ((int64_t)1 << 31)

enum auto_pad { PAD_NOTSET, PAD_SAME_UPPER, PAD_SAME_LOWER, PAD_VALID };

static gp_status read_auto_pad(struct gp_infer_ctx *ctx, enum auto_pad *out)
{
    const char *s = gp_node_attr_string(ctx->node, "auto_pad", "NOTSET");
    if (strcmp(s, "NOTSET") == 0) *out = PAD_NOTSET;
    else if (strcmp(s, "SAME_UPPER") == 0) *out = PAD_SAME_UPPER;
    else if (strcmp(s, "SAME_LOWER") == 0) *out = PAD_SAME_LOWER;
    else if (strcmp(s, "VALID") == 0) *out = PAD_VALID;
    else
        return gp_op_error(ctx, GP_ERR_INVALID,
                           "auto_pad '%s' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID", s);
    return GP_OK;
}

/* Reads an ints attribute of exactly n entries, each in [lo, WINDOW_ATTR_MAX];
 * fills `dflt` when the attribute is absent. */
static gp_status read_ints(struct gp_infer_ctx *ctx, const char *name, int n, int64_t lo,
                           int64_t dflt, int64_t *out)
{
    const int64_t *v;
    int64_t count = gp_node_attr_ints(ctx->node, name, &v);
    if (count < 0) {
        for (int i = 0; i < n; i++) out[i] = dflt;
        return GP_OK;
    }
    if (count != n) {
        char s[256];
        return gp_op_error(ctx, GP_ERR_INVALID, "%s %s has %lld entries, expected %d (%s)", name,
                           gp_ints_format(v, (int)(count < 32 ? count : 32), s, sizeof s),
                           (long long)count, n,
                           strcmp(name, "pads") == 0 ? "begin and end of each spatial axis"
                                                     : "one per spatial axis");
    }
    for (int i = 0; i < n; i++) {
        if (v[i] < lo || v[i] > WINDOW_ATTR_MAX)
            return gp_op_error(ctx, GP_ERR_INVALID, "%s[%d] is %lld; it must be in [%lld, %lld]",
                               name, i, (long long)v[i], (long long)lo,
                               (long long)WINDOW_ATTR_MAX);
        out[i] = v[i];
    }
    return GP_OK;
}

static int64_t ceil_div(int64_t a, int64_t b) /* a >= 0, b > 0 */
{
    return (a + b - 1) / b;
}

/* Conv and pools: out = floor or ceil((in + pads - extent) / stride) + 1. */
static gp_status resolve_forward(struct gp_infer_ctx *ctx, enum gp_window_kind kind,
                                 enum auto_pad pad, struct gp_window *w)
{
    bool ceil_mode = kind == GP_WINDOW_POOL && gp_node_attr_int(ctx->node, "ceil_mode", 0) != 0;
    for (int i = 0; i < w->n_spatial; i++) {
        int64_t in = w->in[i], s = w->stride[i];
        int64_t extent = (w->kernel[i] - 1) * w->dilation[i] + 1;
        if (pad == PAD_SAME_UPPER || pad == PAD_SAME_LOWER) {
            /* Pad so that out = ceil(in / stride); an odd total puts the extra
             * cell at the end (UPPER) or the beginning (LOWER). ceil_mode
             * does not change this (onnxruntime and ONNX agree). */
            int64_t out = ceil_div(in, s);
            int64_t total = (out - 1) * s + extent - in;
            if (total < 0) total = 0;
            w->pad_begin[i] = pad == PAD_SAME_UPPER ? total / 2 : total - total / 2;
            w->pad_end[i] = total - w->pad_begin[i];
            w->out[i] = out;
            continue;
        }
        if (pad == PAD_VALID) w->pad_begin[i] = w->pad_end[i] = 0;
        int64_t span = in + w->pad_begin[i] + w->pad_end[i] - extent;
        if (span < 0)
            return gp_op_error(ctx, GP_ERR_SHAPE,
                               "spatial axis %d: the window extent %lld (kernel %lld, dilation "
                               "%lld) exceeds the padded input size %lld (%lld + pads %lld, %lld)",
                               i, (long long)extent, (long long)w->kernel[i],
                               (long long)w->dilation[i],
                               (long long)(in + w->pad_begin[i] + w->pad_end[i]), (long long)in,
                               (long long)w->pad_begin[i], (long long)w->pad_end[i]);
        int64_t out = (ceil_mode ? ceil_div(span, s) : span / s) + 1;
        /* ceil_mode may add a last window; like PyTorch and onnxruntime (but
         * not ONNX's own shape inference), drop it when it would start in the
         * end padding and so cover no input cell. */
        if (ceil_mode && (out - 1) * s >= in + w->pad_begin[i]) out--;
        w->out[i] = out;
    }
    return GP_OK;
}

/* ConvTranspose: the full output is stride * (in - 1) + extent +
 * output_padding cells; pads crop it. With output_shape or SAME_* the pads
 * are derived from the requested size. Since opset 11 an odd total puts the
 * extra crop at the end for SAME_UPPER and at the beginning otherwise; opset
 * 1 wrote the opposite. (onnxruntime follows neither exactly for SAME_*;
 * PyTorch never exports these.) */
static gp_status resolve_transpose(struct gp_infer_ctx *ctx, enum auto_pad pad,
                                   struct gp_window *w)
{
    const int n = w->n_spatial;
    GP_TRY(read_ints(ctx, "output_padding", n, 0, 0, w->output_padding));
    const int64_t *req = NULL;
    int64_t n_req = gp_node_attr_ints(ctx->node, "output_shape", &req);
    if (n_req >= 0 && n_req != n)
        return gp_op_error(ctx, GP_ERR_INVALID,
                           "output_shape has %lld entries, expected %d (the spatial axes only)",
                           (long long)n_req, n);
    bool upper_first = ctx->node->def && ctx->node->def->since_version >= 11;
    for (int i = 0; i < n; i++) {
        int64_t s = w->stride[i], d = w->dilation[i], op = w->output_padding[i];
        if (op >= s && op >= d)
            return gp_op_error(ctx, GP_ERR_INVALID,
                               "output_padding[%d] is %lld; it must be smaller than the stride "
                               "(%lld) or the dilation (%lld)",
                               i, (long long)op, (long long)s, (long long)d);
        int64_t extent = (w->kernel[i] - 1) * d + 1, scaled;
        if (__builtin_mul_overflow(s, w->in[i] - 1, &scaled) || scaled > INT64_MAX / 4)
            return gp_op_error(ctx, GP_ERR_SHAPE, "spatial axis %d: the output size overflows", i);
        int64_t full = scaled + extent + op;
        int64_t target = -1;
        if (n_req >= 0) {
            if (req[i] < 1)
                return gp_op_error(ctx, GP_ERR_INVALID, "output_shape[%d] is %lld", i,
                                   (long long)req[i]);
            target = req[i];
        } else if (pad == PAD_SAME_UPPER || pad == PAD_SAME_LOWER) {
            target = w->in[i] * s;
        }
        if (target >= 0) {
            /* A requested size beyond the full output leaves the extra cells
             * to the bias alone (onnxruntime clamps the crop at 0 too). */
            int64_t total = full - target > 0 ? full - target : 0;
            bool extra_at_end = (pad == PAD_SAME_UPPER) == upper_first;
            w->pad_begin[i] = extra_at_end ? total / 2 : total - total / 2;
            w->pad_end[i] = total - w->pad_begin[i];
            w->out[i] = target;
            continue;
        }
        if (pad == PAD_VALID) w->pad_begin[i] = w->pad_end[i] = 0;
        w->out[i] = full - w->pad_begin[i] - w->pad_end[i];
        if (w->out[i] < 1)
            return gp_op_error(ctx, GP_ERR_SHAPE,
                               "spatial axis %d: pads %lld + %lld crop the whole output of %lld "
                               "cells",
                               i, (long long)w->pad_begin[i], (long long)w->pad_end[i],
                               (long long)full);
    }
    return GP_OK;
}

gp_status gp_window_resolve(struct gp_infer_ctx *ctx, enum gp_window_kind kind,
                            const struct gp_shape *x, const int64_t *kernel, struct gp_window *w)
{
    memset(w, 0, sizeof *w);
    if (x->rank < 3) {
        char s[160];
        return gp_op_error(ctx, GP_ERR_SHAPE,
                           "input has shape %s; expected [N, C, D1, ...] with at least one "
                           "spatial axis",
                           gp_shape_format(x, s, sizeof s));
    }
    const int n = x->rank - 2;
    w->n_spatial = n;
    for (int i = 0; i < n; i++) w->in[i] = x->dims[i + 2];

    const int64_t *ks;
    int64_t n_ks = gp_node_attr_ints(ctx->node, "kernel_shape", &ks);
    if (!kernel && n_ks < 0)
        return gp_op_error(ctx, GP_ERR_INVALID, "the kernel_shape attribute is required");
    GP_TRY(read_ints(ctx, "kernel_shape", n, 1, 1, w->kernel));
    if (kernel) {
        for (int i = 0; i < n; i++) {
            if (n_ks >= 0 && ks[i] != kernel[i]) {
                char a[256], b[256];
                return gp_op_error(ctx, GP_ERR_SHAPE,
                                   "kernel_shape %s disagrees with the weight's spatial shape %s",
                                   gp_ints_format(ks, n, a, sizeof a),
                                   gp_ints_format(kernel, n, b, sizeof b));
            }
            if (kernel[i] < 1 || kernel[i] > WINDOW_ATTR_MAX)
                return gp_op_error(ctx, GP_ERR_SHAPE, "the weight's spatial axis %d has size %lld",
                                   i, (long long)kernel[i]);
            w->kernel[i] = kernel[i];
        }
    }
    GP_TRY(read_ints(ctx, "strides", n, 1, 1, w->stride));
    GP_TRY(read_ints(ctx, "dilations", n, 1, 1, w->dilation));

    enum auto_pad pad = PAD_NOTSET;
    GP_TRY(read_auto_pad(ctx, &pad));
    /* Explicit pads are [begin of each axis..., end of each axis...]. With
     * auto_pad set they are ignored, as onnxruntime does. */
    int64_t pads[2 * GP_WINDOW_MAX_SPATIAL];
    GP_TRY(read_ints(ctx, "pads", 2 * n, 0, 0, pads));
    for (int i = 0; i < n; i++) {
        w->pad_begin[i] = pad == PAD_NOTSET ? pads[i] : 0;
        w->pad_end[i] = pad == PAD_NOTSET ? pads[n + i] : 0;
    }
    if (kind == GP_WINDOW_CONV_TRANSPOSE) return resolve_transpose(ctx, pad, w);
    return resolve_forward(ctx, kind, pad, w);
}
