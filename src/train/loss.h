/* Loss functions on a micro-batch of float32 model outputs.
 *
 * Every loss returns the SUM of its per-element terms over the micro-batch
 * (in double) and writes the gradient with respect to the model output
 * scaled by 1/denominator, where the denominator is the number of loss terms
 * in the WHOLE mini-batch. Summed over micro-batches, the losses divided by
 * the denominator and the accumulated parameter gradients are then exactly
 * the mini-batch mean and its gradient, as PyTorch's reduction='mean' gives
 * for the whole mini-batch at once. The caller counts the terms (for
 * cross-entropy gp_loss_count_targets, which skips ignored labels).
 *
 * Gradients are written (=), not accumulated: they seed the backward pass.
 * A NULL gradient pointer computes the loss only (evaluation).
 *
 * Numerics follow PyTorch's (log-sum-exp with the maximum subtracted,
 * softmax - one-hot) but sums are taken in double, so losses agree with
 * PyTorch's float32 results to a few ulps, not bit for bit. */
#ifndef GP_TRAIN_LOSS_H
#define GP_TRAIN_LOSS_H

#include <limits.h>
#include <stdint.h>

#include "graph/tensor.h"
#include "util/error.h"

/* PyTorch's default ignore_index: labels equal to it add no loss and no
 * gradient and are not counted in the denominator. */
#define GP_LOSS_IGNORE_INDEX (-100)

/* Pass as class_axis to infer the class axis from the shapes. */
#define GP_CLASS_AXIS_AUTO INT_MIN

enum gp_loss_kind {
    GP_LOSS_CROSS_ENTROPY, /* softmax cross-entropy against int64 class labels */
    GP_LOSS_MSE,           /* mean squared error against a float target */
    GP_LOSS_OUTPUT,        /* the model's output is the loss: mean of its elements */
};

const char *gp_loss_kind_name(enum gp_loss_kind kind);

/* The class axis of `logits` for labels of shape `labels`.
 *
 * Labels always have one dimension fewer than logits: the class axis is the
 * one whose removal from the logits' shape leaves the labels' shape. With
 * `axis` = GP_CLASS_AXIS_AUTO the candidates are axis 1 (PyTorch's
 * convention: [N, C] with labels [N], [N, C, H, W] with labels [N, H, W])
 * and the last axis (language models: [N, T, C] with labels [N, T]); for
 * rank-1 logits [C] (one unbatched sample, label of rank 0) it is axis 0.
 * When both candidates fit and differ (for example [N, 16, 16] logits with
 * [N, 16] labels) the shapes cannot tell: that is an error asking for the
 * axis. An explicit `axis` may be negative (-1 is the last) and is checked
 * against the shapes the same way. */
gp_status gp_loss_class_axis(const struct gp_shape *logits, const struct gp_shape *labels, int axis,
                             int *out, struct gp_error *err);

/* Labels that count as loss terms (not equal to ignore_index). */
int64_t gp_loss_count_targets(const int64_t *labels, int64_t n, int64_t ignore_index);

/* Softmax cross-entropy, PyTorch's F.cross_entropy(reduction='sum') on one
 * micro-batch.
 *   logits  [..., C, ...]  float32, C along the class axis
 *   labels  logits' shape without the class axis, int64 in [0, C) or
 *           ignore_index
 *   dlogits like logits, or NULL: (softmax - one_hot(label)) / denominator,
 *           zero where the label is ignored
 * *loss_sum gets sum over counted positions of -log softmax(logits)[label];
 * *n_terms (may be NULL) the number of counted positions. A label outside
 * [0, C) other than ignore_index is an error naming the label and its
 * position, reported before anything is written. */
gp_status gp_cross_entropy(const float *logits, const struct gp_shape *logits_shape,
                           const int64_t *labels, const struct gp_shape *labels_shape,
                           int class_axis, int64_t ignore_index, double denominator, float *dlogits,
                           double *loss_sum, int64_t *n_terms, struct gp_error *err);

/* Squared error, F.mse_loss(reduction='sum'), against a target of the same
 * shape.
 *   pred, target, dpred  [shape]  float32
 * dpred = (2 / denominator) * (pred - target), the float32 arithmetic of
 * PyTorch's mse_loss_backward (bit-identical to it for one micro-batch). */
gp_status gp_mse_loss(const float *pred, const float *target, const struct gp_shape *pred_shape,
                      const struct gp_shape *target_shape, double denominator, float *dpred,
                      double *loss_sum, struct gp_error *err);

/* The model computes its own loss: the loss is the mean of the output's
 * elements over the mini-batch (denominator = their number over all
 * micro-batches), so *loss_sum = sum of out and dout = 1 / denominator. */
gp_status gp_output_loss(const float *out, const struct gp_shape *shape, double denominator,
                         float *dout, double *loss_sum, struct gp_error *err);

/* Classification accuracy: positions where argmax along the class axis
 * (the first maximum; a NaN counts as the maximum, as in torch.argmax)
 * equals the label, and the positions counted (labels not ignored).
 * Out-of-range labels are errors as for gp_cross_entropy. */
gp_status gp_accuracy(const float *logits, const struct gp_shape *logits_shape,
                      const int64_t *labels, const struct gp_shape *labels_shape, int class_axis,
                      int64_t ignore_index, int64_t *correct, int64_t *counted,
                      struct gp_error *err);

#endif
