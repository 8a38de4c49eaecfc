/* float32 <-> bfloat16 conversion on the device (cuda/convert.cu). */
#ifndef GP_CUDA_CONVERT_H
#define GP_CUDA_CONVERT_H

#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "graph/tensor.h"
#include "util/error.h"

/* dst = src (accumulate: dst += src), n elements of float32 or bfloat16
 * each, launched on stream: float32 arithmetic, bfloat16 results rounded to
 * nearest even exactly as gp_float_to_bf16 does. */
gp_status gp_cuda_convert(cudaStream_t stream, void *dst, enum gp_dtype dst_type, const void *src,
                          enum gp_dtype src_type, int64_t n, bool accumulate, struct gp_error *err);

/* The same for a tensor of logical shape [n, c, hw] between layouts: dst
 * (laid out [n, hw, c] when dst_nhwc) = src (the same with src_nhwc), or
 * += with accumulate. Tiles of 32 x 32 through shared memory, so both
 * sides are read and written in whole rows; planes of at most 16 cells
 * (a filter's) by gp_cuda_relayout_channels's gather. */
gp_status gp_cuda_relayout(cudaStream_t stream, void *dst, enum gp_dtype dst_type, bool dst_nhwc, const void *src,
                           enum gp_dtype src_type, bool src_nhwc, int64_t n, int64_t c, int64_t hw,
                           bool accumulate, struct gp_error *err);

/* dst[t] (dst_type: [batch, cells, channels] when to_nhwc, else [batch,
 * channels, cells]) = src[t] (float32, laid out the other way), or +=
 * with accumulate, for t < n: up to 32 tensors a launch (a stage's filter
 * copies and their gradients, once per step). */
gp_status gp_cuda_relayout_many(cudaStream_t stream, int n, void *const *dst, enum gp_dtype dst_type, bool to_nhwc,
                                const float *const *src, const int64_t *batch, const int64_t *channels,
                                const int64_t *cells, bool accumulate, struct gp_error *err);

/* Between channel counts too: dst [n, dst_c, hw] (laid out [n, hw, dst_c]
 * when dst_nhwc) from src [n, src_c, hw] (likewise), channel for channel;
 * dst's channels from src_c on are zero (with accumulate: unchanged), and
 * src's from dst_c on are left out. A convolution with few input channels
 * convolves them padded to a whole 16-byte run (conv.cu). One thread per
 * destination element. */
gp_status gp_cuda_relayout_channels(cudaStream_t stream, void *dst, enum gp_dtype dst_type, bool dst_nhwc,
                                    int64_t dst_c, const void *src, enum gp_dtype src_type, bool src_nhwc,
                                    int64_t src_c, int64_t n, int64_t hw, bool accumulate, struct gp_error *err);

#ifdef __cplusplus
}
#endif

#endif
