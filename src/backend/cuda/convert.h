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

#ifdef __cplusplus
}
#endif

#endif
