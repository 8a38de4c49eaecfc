#include "train/loss.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

const char *gp_loss_kind_name(enum gp_loss_kind kind)
{
    switch (kind) {
    case GP_LOSS_CROSS_ENTROPY: return "cross_entropy";
    case GP_LOSS_MSE: return "mse";
    case GP_LOSS_OUTPUT: return "output";
    }
    return "unknown";
}

/* Does removing `axis` from `logits` leave `labels`? */
static int axis_fits(const struct gp_shape *logits, const struct gp_shape *labels, int axis)
{
    if (axis < 0 || axis >= logits->rank || labels->rank != logits->rank - 1) return 0;
    for (int i = 0, j = 0; i < logits->rank; i++) {
        if (i == axis) continue;
        if (logits->dims[i] != labels->dims[j++]) return 0;
    }
    return 1;
}

gp_status gp_loss_class_axis(const struct gp_shape *logits, const struct gp_shape *labels, int axis,
                             int *out, struct gp_error *err)
{
    char a[256], b[256];
    gp_shape_format(logits, a, sizeof a);
    gp_shape_format(labels, b, sizeof b);
    if (logits->rank < 1 || labels->rank != logits->rank - 1)
        return gp_error_set(err, GP_ERR_SHAPE,
                            "cross-entropy: labels %s must have one dimension fewer than logits %s",
                            b, a);
    if (axis != GP_CLASS_AXIS_AUTO) {
        int ax = axis < 0 ? axis + logits->rank : axis;
        if (!axis_fits(logits, labels, ax))
            return gp_error_set(err, GP_ERR_SHAPE,
                                "cross-entropy: class axis %d of logits %s does not leave the "
                                "labels' shape %s",
                                axis, a, b);
        *out = ax;
        return GP_OK;
    }
    if (logits->rank == 1) {
        *out = 0;
        return GP_OK;
    }
    int last = logits->rank - 1;
    int one = axis_fits(logits, labels, 1), end = axis_fits(logits, labels, last);
    if (one && end && last != 1)
        return gp_error_set(err, GP_ERR_SHAPE,
                            "cross-entropy: logits %s and labels %s fit both class axis 1 and the "
                            "last axis %d: give the class axis explicitly",
                            a, b, last);
    if (!one && !end)
        return gp_error_set(err, GP_ERR_SHAPE,
                            "cross-entropy: labels %s are not logits %s without axis 1 ([N, C, ...]) "
                            "or without the last axis ([N, T, C])",
                            b, a);
    *out = one ? 1 : last;
    return GP_OK;
}

int64_t gp_loss_count_targets(const int64_t *labels, int64_t n, int64_t ignore_index)
{
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) k += labels[i] != ignore_index;
    return k;
}

/* [N, C, H, W] viewed as outer x classes x inner: rows are (outer, inner)
 * pairs, a row's classes lie `inner` elements apart. */
struct class_layout {
    int64_t outer, classes, inner, rows;
};

static gp_status layout_of(const struct gp_shape *logits, const struct gp_shape *labels,
                           int class_axis, struct class_layout *l, int *axis, struct gp_error *err)
{
    GP_TRY(gp_loss_class_axis(logits, labels, class_axis, axis, err));
    l->outer = 1;
    l->inner = 1;
    for (int i = 0; i < *axis; i++) l->outer *= logits->dims[i];
    for (int i = *axis + 1; i < logits->rank; i++) l->inner *= logits->dims[i];
    l->classes = logits->dims[*axis];
    l->rows = l->outer * l->inner;
    if (l->classes < 1 && l->rows > 0)
        return gp_error_set(err, GP_ERR_SHAPE, "cross-entropy: the class axis has no classes");
    return GP_OK;
}

/* Every label in [0, C) or ignored; the first offender is named with its
 * position in the labels' shape. */
static gp_status check_labels(const int64_t *labels, const struct gp_shape *shape, int64_t n,
                              int64_t classes, int64_t ignore_index, struct gp_error *err)
{
    for (int64_t i = 0; i < n; i++) {
        int64_t y = labels[i];
        if (y == ignore_index || (y >= 0 && y < classes)) continue;
        char pos[256];
        int used = snprintf(pos, sizeof pos, "[");
        int64_t rest = i;
        int64_t idx[GP_MAX_RANK];
        for (int d = shape->rank - 1; d >= 0; d--) {
            idx[d] = shape->dims[d] ? rest % shape->dims[d] : 0;
            rest = shape->dims[d] ? rest / shape->dims[d] : 0;
        }
        for (int d = 0; d < shape->rank && used < (int)sizeof pos; d++)
            used += snprintf(pos + used, sizeof pos - (size_t)used, "%s%lld", d ? ", " : "",
                             (long long)idx[d]);
        if (used < (int)sizeof pos) snprintf(pos + used, sizeof pos - (size_t)used, "]");
        return gp_error_set(err, GP_ERR_INVALID,
                            "label %lld at position %s is outside the %lld classes [0, %lld) and "
                            "is not the ignore index %lld",
                            (long long)y, pos, (long long)classes, (long long)classes,
                            (long long)ignore_index);
    }
    return GP_OK;
}

static gp_status check_denominator(double d, const char *what, struct gp_error *err)
{
    if (!(d > 0) || !isfinite(d))
        return gp_error_set(err, GP_ERR_INVALID,
                            "%s: the denominator (loss terms in the mini-batch) must be positive, "
                            "not %g",
                            what, d);
    return GP_OK;
}

/* Rows are split into this many fixed blocks whatever the thread count, and
 * block sums are added in order: the loss is the same with any number of
 * threads. */
#define LOSS_BLOCKS 256

gp_status gp_cross_entropy(const float *logits, const struct gp_shape *logits_shape,
                           const int64_t *labels, const struct gp_shape *labels_shape,
                           int class_axis, int64_t ignore_index, double denominator, float *dlogits,
                           double *loss_sum, int64_t *n_terms, struct gp_error *err)
{
    struct class_layout l;
    int axis;
    GP_TRY(layout_of(logits_shape, labels_shape, class_axis, &l, &axis, err));
    GP_TRY(check_denominator(denominator, "cross-entropy", err));
    GP_TRY(check_labels(labels, labels_shape, l.rows, l.classes, ignore_index, err));

    const double inv = 1.0 / denominator;
    double part[LOSS_BLOCKS];
    int64_t count[LOSS_BLOCKS];
    const int64_t C = l.classes, S = l.inner;
#pragma omp parallel for schedule(static) if (l.rows * C > (1 << 16))
    for (int b = 0; b < LOSS_BLOCKS; b++) {
        int64_t r0 = l.rows * b / LOSS_BLOCKS, r1 = l.rows * (b + 1) / LOSS_BLOCKS;
        double sum = 0;
        int64_t k = 0;
        for (int64_t r = r0; r < r1; r++) {
            int64_t o = r / S, i = r % S;
            const float *x = logits + o * C * S + i;
            float *g = dlogits ? dlogits + o * C * S + i : NULL;
            int64_t y = labels[r];
            if (y == ignore_index) {
                if (g)
                    for (int64_t c = 0; c < C; c++) g[c * S] = 0.0f;
                continue;
            }
            /* log-sum-exp with the maximum subtracted; a NaN logit makes the
             * loss NaN, as in PyTorch */
            double m = x[0];
            for (int64_t c = 1; c < C; c++)
                if (x[c * S] > m) m = x[c * S];
            double se = 0;
            for (int64_t c = 0; c < C; c++) se += exp((double)x[c * S] - m);
            double lse = m + log(se);
            sum += lse - (double)x[y * S];
            k++;
            if (g)
                for (int64_t c = 0; c < C; c++)
                    g[c * S] = (float)((exp((double)x[c * S] - lse) - (c == y ? 1.0 : 0.0)) * inv);
        }
        part[b] = sum;
        count[b] = k;
    }
    double total = 0;
    int64_t terms = 0;
    for (int b = 0; b < LOSS_BLOCKS; b++) {
        total += part[b];
        terms += count[b];
    }
    *loss_sum = total;
    if (n_terms) *n_terms = terms;
    return GP_OK;
}

gp_status gp_mse_loss(const float *pred, const float *target, const struct gp_shape *pred_shape,
                      const struct gp_shape *target_shape, double denominator, float *dpred,
                      double *loss_sum, struct gp_error *err)
{
    if (!gp_shape_equal(pred_shape, target_shape)) {
        char a[256], b[256];
        return gp_error_set(err, GP_ERR_SHAPE,
                            "mse: the target's shape %s differs from the output's %s",
                            gp_shape_format(target_shape, b, sizeof b),
                            gp_shape_format(pred_shape, a, sizeof a));
    }
    GP_TRY(check_denominator(denominator, "mse", err));
    const int64_t n = gp_shape_numel(pred_shape);
    /* PyTorch: grad = (float)(2 / numel) * (input - target) * grad_output,
     * with grad_output = 1 for the mean. */
    const float scale = (float)(2.0 / denominator);
    double part[LOSS_BLOCKS];
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int b = 0; b < LOSS_BLOCKS; b++) {
        int64_t i0 = n * b / LOSS_BLOCKS, i1 = n * (b + 1) / LOSS_BLOCKS;
        double sum = 0;
        for (int64_t i = i0; i < i1; i++) {
            double d = (double)pred[i] - (double)target[i];
            sum += d * d;
            if (dpred) dpred[i] = scale * (pred[i] - target[i]);
        }
        part[b] = sum;
    }
    double total = 0;
    for (int b = 0; b < LOSS_BLOCKS; b++) total += part[b];
    *loss_sum = total;
    return GP_OK;
}

gp_status gp_output_loss(const float *out, const struct gp_shape *shape, double denominator,
                         float *dout, double *loss_sum, struct gp_error *err)
{
    GP_TRY(check_denominator(denominator, "output loss", err));
    const int64_t n = gp_shape_numel(shape);
    const float g = (float)(1.0 / denominator);
    double total = 0;
    for (int64_t i = 0; i < n; i++) {
        total += out[i];
        if (dout) dout[i] = g;
    }
    *loss_sum = total;
    return GP_OK;
}

gp_status gp_accuracy(const float *logits, const struct gp_shape *logits_shape,
                      const int64_t *labels, const struct gp_shape *labels_shape, int class_axis,
                      int64_t ignore_index, int64_t *correct, int64_t *counted,
                      struct gp_error *err)
{
    struct class_layout l;
    int axis;
    GP_TRY(layout_of(logits_shape, labels_shape, class_axis, &l, &axis, err));
    GP_TRY(check_labels(labels, labels_shape, l.rows, l.classes, ignore_index, err));
    const int64_t C = l.classes, S = l.inner;
    int64_t hit = 0, seen = 0;
    for (int64_t r = 0; r < l.rows; r++) {
        if (labels[r] == ignore_index) continue;
        const float *x = logits + (r / S) * C * S + r % S;
        float best = x[0];
        int64_t arg = 0;
        for (int64_t c = 1; c < C && !isnan(best); c++) {
            float v = x[c * S];
            if (isnan(v) || v > best) {
                best = v;
                arg = c;
            }
        }
        hit += arg == labels[r];
        seen++;
    }
    *correct = hit;
    *counted = seen;
    return GP_OK;
}
