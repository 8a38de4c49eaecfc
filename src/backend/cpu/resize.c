/* CPU kernels: Resize (opsets 10 to 19) and Upsample (7, 9), modes nearest
 * and linear (n-linear over every resized axis), forward and backward.
 *
 * Each axis gets a table from output position to source position(s) and
 * weights, computed in single precision as onnxruntime does: the
 * coordinate transformation (half_pixel, half_pixel_symmetric,
 * pytorch_half_pixel, align_corners, asymmetric, tf_half_pixel_for_nn,
 * tf_crop_and_resize), then nearest_mode's rounding or linear's two
 * neighbours, clamped into the axis. PyTorch's nn.Upsample / interpolate
 * export as asymmetric + floor (nearest) and half_pixel or align_corners
 * (linear), which give PyTorch's values.
 *
 * Work splits over the slices of the leading axes that are not resized (N
 * and C, typically). Backward scatters each output's gradient to its
 * sources, many outputs to one input when upsampling, so it runs each slice
 * in order on one thread: sums do not depend on the thread count. Cubic
 * mode and antialiased downsampling are refused with a message. */
#include <string.h>
#include <tgmath.h>

#include "backend/cpu/kernel_util.h"
#include "ops/fold_util.h"

enum coords {
    CT_HALF_PIXEL, CT_HALF_PIXEL_SYMMETRIC, CT_PYTORCH_HALF_PIXEL, CT_ALIGN_CORNERS,
    CT_ASYMMETRIC, CT_TF_HALF_PIXEL_FOR_NN, CT_TF_CROP_AND_RESIZE,
};
enum nearest { N_ROUND_PREFER_FLOOR, N_ROUND_PREFER_CEIL, N_FLOOR, N_CEIL, N_SIMPLE };

static int choice(const char *s, const char *const *names, int n, int dflt)
{
    for (int k = 0; k < n; k++)
        if (strcmp(s, names[k]) == 0) return k;
    return dflt;
}

/* Per axis, per output position o: sources i0[o] and i1[o] with weights
 * w0[o] and w1[o] (nearest: i1 = i0, w1 = 0); i0[o] = -1 where
 * tf_crop_and_resize falls outside the input (extrapolation_value). */
struct axis_map {
    int64_t *i0, *i1;
    real *w0, *w1;
};

struct resize_plan {
    bool linear;
    int lead; /* axes before this map every position to itself */
    real extrapolation;
    struct axis_map ax[GP_MAX_RANK];
};

/* Tables for every axis of the output: 2 int64 and 2 real per position. */
static size_t resize_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    const struct gp_value *y = gp_node_output(g, node, 0);
    size_t n = 0;
    for (int d = 0; d < y->shape.rank; d++) n += (size_t)y->shape.dims[d];
    return n * (2 * sizeof(int64_t) + 2 * sizeof(real));
}

/* The source coordinate of output position x on an axis of `in` -> `out`. */
static float source_coord(enum coords m, float x, float scale, int64_t in, int64_t out,
                          float roi_start, float roi_end)
{
    float fin = (float)in, fout = (float)out;
    switch (m) {
    case CT_HALF_PIXEL: return (x + 0.5f) / scale - 0.5f;
    case CT_HALF_PIXEL_SYMMETRIC: {
        float adjustment = fout / (scale * fin), center = fin / 2;
        return center * (1 - adjustment) + (x + 0.5f) / scale - 0.5f;
    }
    case CT_PYTORCH_HALF_PIXEL: return out > 1 ? (x + 0.5f) / scale - 0.5f : 0.0f;
    case CT_ALIGN_CORNERS: return out == 1 ? 0.0f : x * (fin - 1) / (fout - 1);
    case CT_ASYMMETRIC: return x / scale;
    case CT_TF_HALF_PIXEL_FOR_NN: return (x + 0.5f) / scale;
    case CT_TF_CROP_AND_RESIZE:
        return out > 1 ? roi_start * (fin - 1) + x * (roi_end - roi_start) * (fin - 1) / (fout - 1)
                       : 0.5f * (roi_start + roi_end) * (fin - 1);
    }
    return x;
}

static int64_t round_nearest(enum nearest m, float x, float scale)
{
    switch (m) {
    case N_ROUND_PREFER_FLOOR: return x == floorf(x) + 0.5f ? (int64_t)floorf(x) : (int64_t)roundf(x);
    case N_ROUND_PREFER_CEIL: return (int64_t)roundf(x);
    case N_FLOOR: return (int64_t)floorf(x);
    case N_CEIL: return (int64_t)ceilf(x);
    case N_SIMPLE: return scale < 1 ? (int64_t)ceilf(x) : (int64_t)x; /* opsets before 11 */
    }
    return 0;
}

/* Float values of constant input i (scales, roi); 0 entries when omitted or
 * empty (opset 11's placeholder for the unused one of scales/sizes). */
static int const_floats(const struct gp_cpu_ctx *c, int i, float *out, int max)
{
    if (i >= c->node->n_inputs || c->node->inputs[i] < 0) return 0;
    const struct gp_tensor *t = gp_cpu_in_value(c, i)->constant;
    int64_t n = t ? gp_shape_numel(&t->shape) : 0;
    if (n > max) n = max;
    for (int64_t k = 0; k < n; k++) out[k] = (float)gp_tensor_get_f64(t, k);
    return (int)n;
}

static gp_status resize_plan(struct gp_cpu_ctx *c, struct gp_error *err, struct resize_plan *p)
{
    const struct gp_node *n = c->node;
    const struct gp_shape *xs = gp_cpu_in_shape(c, 0), *ys = gp_cpu_out_shape(c, 0);
    int r = xs->rank, version = n->def->since_version;
    bool upsample = strcmp(n->op_type, "Upsample") == 0, modern = !upsample && version >= 11;
    const char *mode = gp_node_attr_string(n, "mode", "nearest");
    if (strcmp(mode, "nearest") != 0 && strcmp(mode, "linear") != 0)
        return gp_cpu_error(c, err, GP_ERR_UNSUPPORTED,
                            "mode '%s' is not supported on the CPU (nearest and linear are)", mode);
    p->linear = strcmp(mode, "linear") == 0;
    static const char *const coord_names[] = {
        "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
        "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"};
    static const char *const nearest_names[] = {"round_prefer_floor", "round_prefer_ceil",
                                                "floor", "ceil"};
    enum coords cm = modern ? (enum coords)choice(gp_node_attr_string(n, "coordinate_transformation_mode",
                                                                       "half_pixel"), coord_names, 7, 0)
                            : CT_ASYMMETRIC;
    enum nearest nm = modern ? (enum nearest)choice(gp_node_attr_string(n, "nearest_mode",
                                                                        "round_prefer_floor"), nearest_names, 4, 0)
                             : N_SIMPLE;
    p->extrapolation = (real)gp_node_attr_float(n, "extrapolation_value", 0.0f);

    /* Axes that scales, sizes and roi list (Resize-18's axes attribute). */
    int axes[GP_MAX_RANK], n_axes = r;
    for (int d = 0; d < r; d++) axes[d] = d;
    const int64_t *ax;
    int64_t n_ax = gp_node_attr_ints(n, "axes", &ax);
    if (n_ax >= 0) {
        struct gp_infer_ctx ic = gp_cpu_infer_ctx(c, err);
        n_axes = (int)n_ax;
        for (int k = 0; k < n_axes; k++) GP_TRY(gp_norm_axis(&ic, ax[k], r, &axes[k]));
    }
    float given[GP_MAX_RANK], scale[GP_MAX_RANK], roi[2 * GP_MAX_RANK];
    float start[GP_MAX_RANK], end[GP_MAX_RANK];
    for (int d = 0; d < r; d++) scale[d] = 1, start[d] = 0, end[d] = 1;
    int n_given;
    if (upsample && version < 9) {
        const struct gp_attr *a = gp_node_attr(n, "scales");
        n_given = a ? (int)a->count : 0;
        for (int k = 0; k < n_given && k < GP_MAX_RANK; k++) given[k] = a->floats[k];
    } else {
        n_given = const_floats(c, modern ? 2 : 1, given, GP_MAX_RANK);
    }
    if (n_given) {
        for (int k = 0; k < n_axes && k < n_given; k++) scale[axes[k]] = given[k];
    } else {
        /* sizes: stretch scales each axis by output / input (the output's
         * static shape holds the sizes); not_larger / not_smaller use the
         * smallest / largest sizes[k] / input over the axes for all of them,
         * the scale the output was rounded from, so it comes from the sizes
         * input itself. */
        const char *policy = gp_node_attr_string(n, "keep_aspect_ratio_policy", "stretch");
        bool larger = strcmp(policy, "not_smaller") == 0, stretch = strcmp(policy, "stretch") == 0;
        const struct gp_tensor *sizes = gp_cpu_in_value(c, 3)->constant;
        float common = larger ? 0.0f : INFINITY;
        for (int k = 0; k < n_axes; k++) {
            int d = axes[k];
            scale[d] = (float)ys->dims[d] / (float)xs->dims[d];
            float f = (float)gp_tensor_get_i64(sizes, k) / (float)xs->dims[d];
            common = larger ? fmaxf(common, f) : fminf(common, f);
        }
        if (!stretch)
            for (int k = 0; k < n_axes; k++) scale[axes[k]] = common;
    }
    if (cm == CT_TF_CROP_AND_RESIZE) {
        /* roi: [starts of the listed axes..., their ends...], in [0, 1]. */
        if (const_floats(c, 1, roi, 2 * GP_MAX_RANK) >= 2 * n_axes)
            for (int k = 0; k < n_axes; k++) start[axes[k]] = roi[k], end[axes[k]] = roi[n_axes + k];
    }
    if (gp_node_attr_int(n, "antialias", 0) && p->linear)
        for (int d = 0; d < r; d++)
            if (scale[d] < 1)
                return gp_cpu_error(c, err, GP_ERR_UNSUPPORTED,
                                    "antialiased downsampling (axis %d, scale %g) is not "
                                    "supported on the CPU", d, (double)scale[d]);

    int64_t *ints = c->scratch, total = 0;
    for (int d = 0; d < r; d++) total += ys->dims[d];
    real *reals = (real *)(ints + 2 * total);
    p->lead = r;
    for (int d = 0; d < r; d++) {
        int64_t in = xs->dims[d], out = ys->dims[d];
        struct axis_map *m = &p->ax[d];
        m->i0 = ints, m->i1 = ints + out, m->w0 = reals, m->w1 = reals + out;
        ints += 2 * out;
        reals += 2 * out;
        bool identity = in == out;
        for (int64_t o = 0; o < out; o++) {
            float x = source_coord(cm, (float)o, scale[d], in, out, start[d], end[d]);
            if (cm == CT_TF_CROP_AND_RESIZE && (x < 0 || x > (float)(in - 1))) {
                m->i0[o] = m->i1[o] = -1, m->w0[o] = 1, m->w1[o] = 0;
            } else if (p->linear) {
                x = x < 0 ? 0 : x > (float)(in - 1) ? (float)(in - 1) : x;
                int64_t i = (int64_t)x;
                if (i > in - 1) i = in - 1;
                m->i0[o] = i;
                m->i1[o] = i < in - 1 ? i + 1 : i;
                m->w1[o] = (real)(x - (float)i);
                m->w0[o] = 1 - m->w1[o];
            } else {
                int64_t i = round_nearest(nm, x, scale[d]);
                m->i0[o] = m->i1[o] = i < 0 ? 0 : i > in - 1 ? in - 1 : i;
                m->w0[o] = 1, m->w1[o] = 0;
            }
            identity = identity && m->i0[o] == o && m->w1[o] == 0;
        }
        if (!identity && p->lead == r) p->lead = d;
    }
    return GP_OK;
}

/* Visits every output element of slice `s` in row-major order with the
 * input offsets and weights of its sources: `corners` = 2^(axes after
 * lead) for linear, 1 for nearest; a corner of weight 0 is skipped, an
 * extrapolated element has offset -1. The statements in ... see o (the
 * output index), src and w. */
#define RESIZE_SLICE(p, xs, ys, x_st, s, ...)                                                \
    do {                                                                                     \
        int r_ = (xs)->rank, lead_ = (p)->lead;                                              \
        int64_t base_ = 0, rem_ = (s), slice_ = 1, idx_[GP_MAX_RANK] = {0};                  \
        for (int d_ = lead_ - 1; d_ >= 0; d_--) {                                            \
            base_ += rem_ % (ys)->dims[d_] * (x_st)[d_];                                     \
            rem_ /= (ys)->dims[d_];                                                          \
        }                                                                                    \
        for (int d_ = lead_; d_ < r_; d_++) slice_ *= (ys)->dims[d_];                        \
        int corners_ = (p)->linear ? 1 << (r_ - lead_) : 1;                                  \
        for (int64_t e_ = 0; e_ < slice_; e_++) {                                            \
            int64_t o = (s) * slice_ + e_;                                                   \
            for (int k_ = 0; k_ < corners_; k_++) {                                          \
                int64_t src = base_;                                                         \
                real w = 1;                                                                  \
                for (int d_ = lead_; d_ < r_ && src >= 0; d_++) {                            \
                    const struct axis_map *m_ = &(p)->ax[d_];                                \
                    bool hi_ = (k_ >> (d_ - lead_)) & 1;                                     \
                    int64_t i_ = hi_ ? m_->i1[idx_[d_]] : m_->i0[idx_[d_]];                 \
                    w *= hi_ ? m_->w1[idx_[d_]] : m_->w0[idx_[d_]];                          \
                    src = i_ < 0 ? -1 : src + i_ * (x_st)[d_];                               \
                }                                                                            \
                if (w == 0 && src >= 0) continue;                                            \
                __VA_ARGS__;                                                                     \
                if (src < 0) break;                                                          \
            }                                                                                \
            for (int d_ = r_ - 1; d_ >= lead_ && ++idx_[d_] == (ys)->dims[d_]; d_--) idx_[d_] = 0; \
        }                                                                                    \
    } while (0)

static int64_t outer_slices(const struct resize_plan *p, const struct gp_shape *ys)
{
    int64_t outer = 1;
    for (int d = 0; d < p->lead; d++) outer *= ys->dims[d];
    return outer;
}

/* X [D0..] -> Y [O0..]: nearest copies its source (any dtype); linear sums
 * its corners' weighted values (float). */
static gp_status resize_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    struct resize_plan p;
    GP_TRY(resize_plan(c, err, &p));
    const struct gp_shape *xs = gp_cpu_in_shape(c, 0), *ys = gp_cpu_out_shape(c, 0);
    enum gp_dtype dt = gp_cpu_in_value(c, 0)->dtype;
    int64_t x_st[GP_MAX_RANK], outer = outer_slices(&p, ys), n = gp_shape_numel(ys);
    gp_shape_strides(xs, x_st);
    if (n == 0) return GP_OK;
    if (p.linear && !gp_dtype_is_float(dt))
        return gp_cpu_error(c, err, GP_ERR_UNSUPPORTED, "linear resizing of %s data",
                            gp_dtype_name(dt));
    const real *X = c->in[0];
    real *Y = c->out[0];
    size_t es = gp_cpu_esize(dt);
#pragma omp parallel for if (n > GP_CPU_PAR_MIN) schedule(static)
    for (int64_t s = 0; s < outer; s++) {
        if (p.linear) {
            int64_t last = -1;
            double acc = 0;
            RESIZE_SLICE(&p, xs, ys, x_st, s, {
                if (o != last) {
                    if (last >= 0) Y[last] = (real)acc;
                    last = o, acc = 0;
                }
                acc = src < 0 ? (double)p.extrapolation : acc + (double)w * X[src];
            });
            Y[last] = (real)acc;
        } else if (gp_dtype_is_float(dt)) {
            RESIZE_SLICE(&p, xs, ys, x_st, s, Y[o] = src < 0 ? p.extrapolation : X[src]);
        } else {
            RESIZE_SLICE(&p, xs, ys, x_st, s, {
                if (src < 0) gp_cpu_store_f64(c->out[0], dt, o, (double)p.extrapolation);
                else memcpy((char *)c->out[0] + o * (int64_t)es, (const char *)c->in[0] + src * (int64_t)es, es);
            });
        }
    }
    return GP_OK;
}

/* dX[source] += weight * dY[o] for every source of every output element. */
static gp_status resize_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    real *dX = c->din[0];
    const real *dY = c->dout[0];
    if (!dX || !dY) return GP_OK;
    struct resize_plan p;
    GP_TRY(resize_plan(c, err, &p));
    const struct gp_shape *xs = gp_cpu_in_shape(c, 0), *ys = gp_cpu_out_shape(c, 0);
    int64_t x_st[GP_MAX_RANK], outer = outer_slices(&p, ys), n = gp_shape_numel(ys);
    gp_shape_strides(xs, x_st);
#pragma omp parallel for if (n > GP_CPU_PAR_MIN) schedule(static)
    for (int64_t s = 0; s < outer; s++)
        RESIZE_SLICE(&p, xs, ys, x_st, s, if (src >= 0) dX[src] += w * dY[o]);
    return GP_OK;
}

/* ---- the table ---- */

const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_resize)[] = {
    {"Resize", NULL, resize_scratch, resize_forward, resize_backward},
    {"Upsample", NULL, resize_scratch, resize_forward, resize_backward},
    {0},
};
