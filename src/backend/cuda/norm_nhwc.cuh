/* Channels-last normalization: the reductions that BatchNormalization's
 * and InstanceNormalization's statistics passes share (batch_norm.cu,
 * instance_norm.cu). Their blocks are tx x ty threads, tx lanes across a
 * row's runs of channels and ty lanes down the rows; each lane holds VEC
 * sums of two kinds (a, b: a sum and a sum of squares, or of dy and
 * dy xhat). Every order below is fixed, so results are the same run to
 * run. */
#ifndef GP_CUDA_NORM_NHWC_CUH
#define GP_CUDA_NORM_NHWC_CUH

#include <stdint.h>

#include "backend/cuda/kernel_util.cuh"

/* a and b added over the block's ty lanes of a run (THREADS = tx ty), in
 * a fixed order; the totals land in the threadIdx.y == 0 lane's a and b.
 * A warp holds 32 / tx lanes of each of tx runs: first shuffles within
 * the warp, then the warps' partial sums through shared memory (sh: 2 VEC
 * doubles for each of the block's lanes), added in warp order by the
 * first row of lanes. One barrier: the tree of shared-memory levels, a
 * barrier each, that this replaced left BatchNorm's statistics passes
 * waiting on barriers (ncu, ResNet-50 bf16: 45% of the forward's stall
 * samples). Every thread of the block calls it. */
template <int THREADS, int VEC>
__device__ static inline void gp_nhwc_reduce_lanes(int tx, double (&a)[VEC], double (&b)[VEC], double *sh)
{
    const int t = threadIdx.y * tx + threadIdx.x, lane = t & 31, warp = t >> 5;
    for (int off = tx; off < 32; off *= 2)
#pragma unroll
        for (int i = 0; i < VEC; i++) {
            a[i] = DADD(a[i], __shfl_down_sync(0xffffffffu, a[i], off));
            b[i] = DADD(b[i], __shfl_down_sync(0xffffffffu, b[i], off));
        }
    if (lane < tx)
#pragma unroll
        for (int i = 0; i < VEC; i++) {
            sh[(warp * tx + lane) * 2 * VEC + i] = a[i];
            sh[(warp * tx + lane) * 2 * VEC + VEC + i] = b[i];
        }
    __syncthreads();
    if (threadIdx.y == 0)
        for (int w = 1; w < THREADS / 32; w++)
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                a[i] = DADD(a[i], sh[(w * tx + lane) * 2 * VEC + i]);
                b[i] = DADD(b[i], sh[(w * tx + lane) * 2 * VEC + VEC + i]);
            }
}

/* Warp-wide: row r's `parts` chunk sums of a and b (a[r parts + k]; one
 * chunk per lane in turn, then a fixed shuffle tree) into lane 0's sa,
 * sb. The finishing kernels' fold, a warp per channel (BatchNorm) or per
 * (sample, channel) plane (InstanceNorm). */
__device__ static inline void gp_nhwc_fold_parts(int64_t r, int64_t parts, const double *a, const double *b,
                                                 double &sa, double &sb)
{
    int lane = threadIdx.x & 31;
    sa = 0, sb = 0;
    for (int64_t k = lane; k < parts; k += 32) {
        sa = DADD(sa, a[r * parts + k]);
        sb = DADD(sb, b[r * parts + k]);
    }
    for (int off = 16; off > 0; off /= 2) {
        sa = DADD(sa, __shfl_down_sync(0xffffffffu, sa, off));
        sb = DADD(sb, __shfl_down_sync(0xffffffffu, sb, off));
    }
}

#endif
