/* Layer calls with bfloat16 storage for kernels that compute in float32,
 * and with channels-last storage (graph/layout.h) for kernels that read
 * [N, C, H, W].
 *
 * In bf16 precision (backend/compute.h) a layer's float tensors may be
 * stored as bfloat16. A kernel that reads and writes bfloat16 itself
 * (gp_compute_ops.kernel_bf16) is called directly: a GP_BF16_ANY kernel
 * always (but for the backward of a node that reads one value twice, whose
 * gradient must be rounded once), a GP_BF16_UNIFORM one when its inputs,
 * outputs and incoming gradients are all bfloat16 (its input gradients may
 * be float32: a parameter's). Any other kernel, or call, gets
 * float32 copies: each bfloat16 input (and, in backward, each bfloat16
 * output it reads and each incoming gradient) is widened into a staging
 * area (exact), the kernel runs in float32, and each bfloat16 output is
 * rounded back once (to nearest even); a bfloat16 input gradient is widened,
 * accumulated into by the kernel, and rounded back. The result is the
 * kernel's float32 arithmetic on bfloat16 values with one rounding per
 * stored tensor: what a fused bfloat16 kernel computes, at the cost of the
 * copies. The CPU backend runs every kernel this way: it is the reference
 * the CUDA kernels are compared with in bf16.
 *
 * Channels-last: a call runs as it is when none of its tensors is
 * channels-last, when the op is layout-neutral and its layouts agree
 * (gp_layout_neutral_call), or when the kernel says it reads them
 * (gp_compute_ops.layout_native; it then gets gp_layer_call.in_nhwc and
 * out_nhwc). Otherwise the call is staged as above, and each channels-last
 * tensor's float32 copy is [N, C, H, W] (relaid: compute ops relayout),
 * written back channels-last. The CPU backend's kernels read no layout:
 * every CPU call of a tagged value goes through such copies, which are
 * exact, so a tagged graph trains there to the same bits.
 *
 * Backend-neutral: it uses only the compute ops' convert and relayout. */
#ifndef GP_BACKEND_MIXED_CALL_H
#define GP_BACKEND_MIXED_CALL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/compute.h"

/* Staging bytes the call needs (0 when nothing is bfloat16 or the kernel
 * reads bfloat16 itself): forward, or backward with the input gradients
 * `din_wanted` (bit k: din[k] present). The *_dt arrays are as in
 * gp_layer_call (din_dt and dout_dt may be NULL for forward). */
size_t gp_mixed_staging_bytes(const struct gp_compute_ops *ops, const void *kernel, const struct gp_graph *g,
                              const struct gp_node *node, const enum gp_dtype *in_dt,
                              const enum gp_dtype *out_dt, const enum gp_dtype *din_dt,
                              const enum gp_dtype *dout_dt, bool backward, uint32_t din_wanted);

/* The layer's forward or backward through ops, staged where needed into
 * `staging` (at least gp_mixed_staging_bytes; may be NULL when that is 0). */
gp_status gp_mixed_forward(const struct gp_compute_ops *ops, void *ctx, const struct gp_layer_call *c,
                           void *staging, struct gp_error *err);
gp_status gp_mixed_backward(const struct gp_compute_ops *ops, void *ctx, const struct gp_layer_call *c,
                            void *staging, struct gp_error *err);

/* The loss on a bfloat16 output and into a bfloat16 gradient: out_dt and
 * dout_dt say how c->out and c->dout are stored. A backend whose loss reads
 * and writes bfloat16 itself (gp_compute_ops.loss_bf16) gets them as they
 * are when both are bfloat16 (no copies, no staging); otherwise float32
 * copies are staged as above (staging: gp_mixed_loss_staging_bytes). */
size_t gp_mixed_loss_staging_bytes(const struct gp_compute_ops *ops, const struct gp_shape *out_shape,
                                   enum gp_dtype out_dt, enum gp_dtype dout_dt);
gp_status gp_mixed_loss(const struct gp_compute_ops *ops, void *ctx, const struct gp_loss_call *c,
                        enum gp_dtype out_dt, enum gp_dtype dout_dt, void *staging, struct gp_error *err);

#endif
