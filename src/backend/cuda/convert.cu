/* float32 <-> bfloat16 conversion and accumulation on the device, the CUDA
 * twin of the CPU's convert (backend/cpu/compute.c): the executor's bf16
 * precision stages tensors through it (backend/mixed_call.h) and makes the
 * weights' bfloat16 copies with it. Rounding is the CPU's gp_float_to_bf16
 * bit for bit (nearest even; NaN stays a quiet NaN of the same sign and
 * payload top bits), so both backends store the same bits. */
#include <stdint.h>

#include <cuda_runtime.h>

#include "backend/cuda/convert.h"
#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/train_kernels.h"

__device__ static inline float bf16_to_f32(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

__device__ static inline uint16_t f32_to_bf16(float f)
{
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

template <bool SRC_BF16, bool DST_BF16, bool ACC>
__global__ void convert_kernel(void *dst, const void *src, int64_t n)
{
    GP_GRID_STRIDE(i, n)
    {
        float x = SRC_BF16 ? bf16_to_f32(((const uint16_t *)src)[i]) : ((const float *)src)[i];
        if (ACC) x = (DST_BF16 ? bf16_to_f32(((uint16_t *)dst)[i]) : ((float *)dst)[i]) + x;
        if (DST_BF16)
            ((uint16_t *)dst)[i] = f32_to_bf16(x);
        else
            ((float *)dst)[i] = x;
    }
}

template <bool SRC_BF16, bool DST_BF16>
static void launch(cudaStream_t stream, void *dst, const void *src, int64_t n, bool acc)
{
    if (acc)
        convert_kernel<SRC_BF16, DST_BF16, true><<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, stream>>>(dst, src, n);
    else
        convert_kernel<SRC_BF16, DST_BF16, false><<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, stream>>>(dst, src, n);
}

extern "C" gp_status gp_cuda_convert(cudaStream_t stream, void *dst, enum gp_dtype dst_type, const void *src,
                                     enum gp_dtype src_type, int64_t n, bool accumulate, struct gp_error *err)
{
    bool sb = src_type == GP_DTYPE_BFLOAT16, db = dst_type == GP_DTYPE_BFLOAT16;
    if ((!sb && src_type != GP_DTYPE_FLOAT32) || (!db && dst_type != GP_DTYPE_FLOAT32))
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "gp_cuda_convert: %s to %s", gp_dtype_name(src_type),
                            gp_dtype_name(dst_type));
    if (n < 0) return gp_error_set(err, GP_ERR_INVALID, "gp_cuda_convert: negative element count");
    if (n == 0) return GP_OK;
    /* float32 += float32 keeps its vectorized kernel (the same sums). */
    if (!sb && !db && accumulate) return gp_cuda_accumulate(stream, (float *)dst, (const float *)src, n, err);
    if (!sb && !db) {
        cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, stream);
        if (e != cudaSuccess)
            return gp_error_set(err, GP_ERR_DEVICE, "gp_cuda_convert: cudaMemcpyAsync: %s", cudaGetErrorString(e));
        return GP_OK;
    }
    if (sb && db)
        launch<true, true>(stream, dst, src, n, accumulate);
    else if (sb)
        launch<true, false>(stream, dst, src, n, accumulate);
    else
        launch<false, true>(stream, dst, src, n, accumulate);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return gp_error_set(err, GP_ERR_DEVICE, "gp_cuda_convert: convert_kernel: %s", cudaGetErrorString(e));
    return GP_OK;
}
