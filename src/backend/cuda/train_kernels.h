/* Device-side pieces of a training step that are not layers: the losses
 * (cuda/loss.cu, twins of train/loss.h), the optimizer updates
 * (cuda/optim.cu, twins of train/optim.h, same float32 operation order),
 * and the small buffer operations the executor needs (zero, accumulate,
 * norms for gradient clipping; cuda/optim.cu).
 *
 * Every function launches onto `stream` and returns without waiting; none
 * allocates: scratch is planned by the caller from the *_scratch_bytes
 * functions. Errors (a failed launch) name the call. */
#ifndef GP_CUDA_TRAIN_KERNELS_H
#define GP_CUDA_TRAIN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "graph/tensor.h"
#include "train/optim.h"
#include "util/error.h"

/* ---- losses ----
 * As in train/loss.h: the gradient with respect to the model output is
 * WRITTEN (=), scaled by 1/denominator; the sum of the loss terms over the
 * micro-batch, accumulated in double in a fixed order (the same result run
 * to run), is written to *loss_sum (device memory). `scratch` holds
 * gp_cuda_loss_scratch_bytes(shape) bytes. Labels and targets are device
 * memory; labels must already be valid (in [0, C) or ignore_index: the
 * trainer checks them on the host).
 *   The output and its gradient are stored as `dtype`, float32 or bfloat16
 * (a bf16 stage's output, read and written in place: no float32 copies). A
 * bfloat16 output is widened exactly and the gradient computed as for
 * float32, then rounded once more, to nearest even (gp_float_to_bf16): the
 * loss and the gradient are bit for bit what the float32 call on a
 * widened, 16-byte aligned copy gives, its gradient then rounded. Except
 * cross-entropy, which computes a bfloat16 row's exponentials in float32
 * (loss.cu): its loss terms within ~2^-21 of the float32 call's where a
 * block takes a row, and a gradient value one bfloat16 ulp off where it
 * lies that close to a rounding boundary. MSE targets stay float32. */
size_t gp_cuda_loss_scratch_bytes(const struct gp_shape *output_shape);

gp_status gp_cuda_cross_entropy(cudaStream_t stream, const void *logits, enum gp_dtype dtype,
                                const struct gp_shape *shape, int class_axis, const int64_t *labels,
                                int64_t ignore_index, double denominator, void *dlogits, double *loss_sum,
                                void *scratch, struct gp_error *err);
/* target has pred's shape. */
gp_status gp_cuda_mse_loss(cudaStream_t stream, const void *pred, enum gp_dtype dtype, const float *target,
                           int64_t n, double denominator, void *dpred, double *loss_sum, void *scratch,
                           struct gp_error *err);
gp_status gp_cuda_output_loss(cudaStream_t stream, const void *out, enum gp_dtype dtype, int64_t n,
                              double denominator, void *dout, double *loss_sum, void *scratch,
                              struct gp_error *err);

/* ---- optimizers ----
 * One optimizer.step() of `opt`, whose parameters' data and grad and whose
 * state (opt->state) are device pointers: gp_optim_apply's twin, bit for
 * bit the float32 arithmetic of gp_sgd_update / gp_adamw_update, with the
 * step's scalars read from `scalars` (device memory) when the kernels run.
 * Gradients are first multiplied by scalars->coef when it is below 1
 * (clip_grad_norm_'s in-place scaling); nothing changes when
 * scalars->skip. opt->steps is left alone. */
gp_status gp_cuda_optim_step(cudaStream_t stream, const struct gp_optim *opt, const struct gp_optim_scalars *scalars,
                             struct gp_error *err);
/* gp_optim_guard on device memory (norms, order, loss_parts, scalars), bit
 * for bit: completes scalars' total_norm, coef and skip. */
gp_status gp_cuda_optim_guard(cudaStream_t stream, const float *norms, const int32_t *order, int n,
                              const double *loss_parts, int m, struct gp_optim_scalars *scalars,
                              struct gp_error *err);

/* ---- buffers ---- */
/* dst[i] += src[i], float32. */
gp_status gp_cuda_accumulate(cudaStream_t stream, float *dst, const float *src, int64_t n,
                             struct gp_error *err);
/* out[k] = the 2-norm of tensor k (float32 result, accumulated in double
 * in a fixed order), for k < count; out is device memory. */
gp_status gp_cuda_norms(cudaStream_t stream, const float *const *tensors, const int64_t *numels, int count,
                        float *out, struct gp_error *err);

#ifdef __cplusplus
}
#endif

#endif
