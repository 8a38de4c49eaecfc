/* bfloat16 storage for the CUDA kernels that read and write it themselves
 * (gp_cuda_kernel.bf16): loads widen to float, stores round to nearest even
 * (as the CPU's gp_float_to_bf16), so a kernel templated on its storage
 * types computes in float32 either way and rounds once per stored value. */
#ifndef GP_CUDA_BF16_CUH
#define GP_CUDA_BF16_CUH

#include <stdbool.h>

#include <cuda_bf16.h>

#include "backend/cuda/kernel.h"

__device__ static inline float gp_load(const float *p) { return *p; }
__device__ static inline float gp_load(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ static inline void gp_store(float *p, float v) { *p = v; }
__device__ static inline void gp_store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

/* Whether entry i of a ctx's storage types (in_dt, out_dt, din_dt,
 * dout_dt; NULL: all float32) is bfloat16. */
static inline bool gp_cuda_is_bf16(const enum gp_dtype *dt, int i)
{
    return dt && dt[i] == GP_DTYPE_BFLOAT16;
}

/* Bytes of one element of a float tensor stored as bfloat16 or float32. */
static inline size_t gp_cuda_float_size(bool bf16) { return bf16 ? sizeof(__nv_bfloat16) : sizeof(float); }

#endif
