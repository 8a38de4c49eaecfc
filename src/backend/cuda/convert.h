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
 * sides are read and written in whole rows. */
gp_status gp_cuda_relayout(cudaStream_t stream, void *dst, enum gp_dtype dst_type, bool dst_nhwc, const void *src,
                           enum gp_dtype src_type, bool src_nhwc, int64_t n, int64_t c, int64_t hw,
                           bool accumulate, struct gp_error *err);

#ifdef __cplusplus
}
#endif

#endif
