/* Helpers shared by the CUDA kernel family files (src/cuda/<family>.cu):
 * launch geometry, grid-stride loops, error messages naming the node. */
#ifndef GP_CUDA_KERNEL_UTIL_CUH
#define GP_CUDA_KERNEL_UTIL_CUH

#include <stdint.h>

#include <cuda_runtime.h>

#include "cuda/kernel.h"

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

#endif
