/* The TF32 tensor-core Attention kernels (backend/cuda/attention_tf32.cu),
 * taken by attention.cu where the call allows TF32 (ctx->tf32) and cuDNN's
 * SDPA does not run it, and with x3 (3xTF32: each operand split in two
 * TF32 parts, float32's accuracy) for float32 calls. Head sizes up to 128 (dmax: 64 or 128, the
 * template the sizes pad to); any mask; the launchers enqueue on `stream`
 * and return what setting the kernels' shared memory returned (the
 * caller checks the launch itself). The backward needs a.dsum filled
 * (D_i = dY_i . Y_i) before it runs. */
#ifndef GP_CUDA_ATTENTION_TF32_H
#define GP_CUDA_ATTENTION_TF32_H

#include <cuda_runtime.h>

#include "backend/cuda/attention_args.cuh"

cudaError_t att_tf32_forward(const att_args &a, int dmax, bool x3, cudaStream_t stream);
cudaError_t att_tf32_backward(const att_args &a, int dmax, bool x3, cudaStream_t stream);

#endif
