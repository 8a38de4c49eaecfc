/* Helpers shared by the CUDA kernel family files (src/backend/cuda/<family>.cu):
 * launch geometry, grid-stride loops, error messages naming the node. */
#ifndef GP_CUDA_KERNEL_UTIL_CUH
#define GP_CUDA_KERNEL_UTIL_CUH

#include <stdint.h>

#include <cuda_runtime.h>

#include "backend/cuda/kernel.h"

extern "C" {
#include "util/error.h"
}

#define GP_CUDA_THREADS 256
#define GP_CUDA_MAX_BLOCKS 4096 /* grid-stride: more elements loop, fewer idle */

static inline unsigned gp_cuda_blocks_for(int64_t n)
{
    int64_t b = (n + GP_CUDA_THREADS - 1) / GP_CUDA_THREADS;
    return (unsigned)(b < 1 ? 1 : b > GP_CUDA_MAX_BLOCKS ? GP_CUDA_MAX_BLOCKS : b);
}

#define GP_GRID_STRIDE(i, n)                                                         \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n);        \
         i += (int64_t)gridDim.x * blockDim.x)

static inline const struct gp_value *gp_cuda_in_value(const struct gp_cuda_ctx *c, int i)
{
    return gp_node_input(c->graph, c->node, i);
}

static inline const struct gp_value *gp_cuda_out_value(const struct gp_cuda_ctx *c, int i)
{
    return gp_node_output(c->graph, c->node, i);
}

/* ---- element access by dtype on the device (the CPU's gp_cpu_load/store_*
 * in backend/cpu/kernel_util.h): every float dtype is held as float32,
 * integers as their own type, bool as uint8. dt is uniform across a grid,
 * so the switches do not diverge. ---- */

__device__ static inline bool gp_dev_dtype_is_float(int dt)
{
    return dt == GP_DTYPE_FLOAT32 || dt == GP_DTYPE_FLOAT16 || dt == GP_DTYPE_FLOAT64 ||
           dt == GP_DTYPE_BFLOAT16;
}

/* Element i as int64: floats truncate toward zero and saturate, NaN gives
 * 0, uint64 wraps. */
__device__ static inline int64_t gp_dev_load_i64(const void *p, int dt, int64_t i)
{
    switch (dt) {
    case GP_DTYPE_UINT8: return ((const uint8_t *)p)[i];
    case GP_DTYPE_BOOL: return ((const uint8_t *)p)[i] != 0;
    case GP_DTYPE_INT8: return ((const int8_t *)p)[i];
    case GP_DTYPE_UINT16: return ((const uint16_t *)p)[i];
    case GP_DTYPE_INT16: return ((const int16_t *)p)[i];
    case GP_DTYPE_INT32: return ((const int32_t *)p)[i];
    case GP_DTYPE_UINT32: return ((const uint32_t *)p)[i];
    case GP_DTYPE_INT64: return ((const int64_t *)p)[i];
    case GP_DTYPE_UINT64: return (int64_t)((const uint64_t *)p)[i];
    default: {
        double v = (double)((const float *)p)[i];
        if (v != v) return 0;
        if (v >= 9.2233720368547758e18) return INT64_MAX;
        if (v <= -9.2233720368547758e18) return INT64_MIN;
        return (int64_t)v;
    }
    }
}

__device__ static inline double gp_dev_load_f64(const void *p, int dt, int64_t i)
{
    if (gp_dev_dtype_is_float(dt)) return (double)((const float *)p)[i];
    if (dt == GP_DTYPE_UINT64) return (double)((const uint64_t *)p)[i];
    return (double)gp_dev_load_i64(p, dt, i);
}

/* Narrower integers wrap as a C cast does; bool stores v != 0. */
__device__ static inline void gp_dev_store_i64(void *p, int dt, int64_t i, int64_t v)
{
    switch (dt) {
    case GP_DTYPE_UINT8: ((uint8_t *)p)[i] = (uint8_t)v; return;
    case GP_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0; return;
    case GP_DTYPE_INT8: ((int8_t *)p)[i] = (int8_t)v; return;
    case GP_DTYPE_UINT16: ((uint16_t *)p)[i] = (uint16_t)v; return;
    case GP_DTYPE_INT16: ((int16_t *)p)[i] = (int16_t)v; return;
    case GP_DTYPE_INT32: ((int32_t *)p)[i] = (int32_t)v; return;
    case GP_DTYPE_UINT32: ((uint32_t *)p)[i] = (uint32_t)v; return;
    case GP_DTYPE_INT64: ((int64_t *)p)[i] = v; return;
    case GP_DTYPE_UINT64: ((uint64_t *)p)[i] = (uint64_t)v; return;
    default: ((float *)p)[i] = (float)v; return;
    }
}

/* Floats into integers truncate toward zero and saturate (NaN gives 0). */
__device__ static inline void gp_dev_store_f64(void *p, int dt, int64_t i, double v)
{
    if (gp_dev_dtype_is_float(dt)) {
        ((float *)p)[i] = (float)v;
    } else if (dt == GP_DTYPE_BOOL) {
        ((uint8_t *)p)[i] = v != 0;
    } else if (dt == GP_DTYPE_UINT64 && v >= 9.2233720368547758e18) {
        ((uint64_t *)p)[i] = v >= 1.8446744073709552e19 ? UINT64_MAX : (uint64_t)v;
    } else {
        int64_t iv = v != v ? 0
                     : v >= 9.2233720368547758e18 ? INT64_MAX
                     : v <= -9.2233720368547758e18 ? INT64_MIN
                                                  : (int64_t)v;
        gp_dev_store_i64(p, dt, i, iv);
    }
}

/* ---- host helpers ---- */

/* A CUDA runtime call's error, naming the node and the call. */
static inline gp_status gp_cuda_call(const struct gp_cuda_ctx *c, cudaError_t e, const char *what,
                                     struct gp_error *err)
{
    if (e == cudaSuccess) return GP_OK;
    return gp_cuda_error(c, err, GP_ERR_DEVICE, "%s: %s", what, cudaGetErrorString(e));
}

/* Input i (when present) must be float32: the CUDA kernels' float type. */
static inline gp_status gp_cuda_want_f32(const struct gp_cuda_ctx *c, int i, struct gp_error *err)
{
    const struct gp_value *v = gp_cuda_in_value(c, i);
    if (!v || v->dtype == GP_DTYPE_FLOAT32) return GP_OK;
    return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "input %d is %s; the CUDA kernel takes float32", i,
                         gp_dtype_name(v->dtype));
}

/* n blocks, at least 1 and at most cap. */
static inline unsigned gp_cuda_capped_grid(int64_t n, int64_t cap)
{
    return (unsigned)(n < 1 ? 1 : n > cap ? cap : n);
}

/* The sum of v over the block, in double, in a fixed order (warp
 * shuffles, then the warps' sums in warp order): the same result run to
 * run. sh holds blockDim.x / 32 doubles of shared memory; every thread of
 * the block must call it, and gets the sum. */
__device__ static inline double gp_dev_block_sum(double v, double *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_down_sync(0xffffffffu, v, o));
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_down_sync(0xffffffffu, v, o));
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

#endif
