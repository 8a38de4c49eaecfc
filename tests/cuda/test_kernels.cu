/* Kernels for the CUDA test programs (test_cuda_device.c and, for
 * gp_fast_exp, test_cuda_train_kernels.c, which declare the launchers).
 * Each launcher returns the launch's error, except the one whose point is
 * to fail unchecked. */
#include <stddef.h>

#include <cuda_runtime.h>

/* Thread 0 of each block spins, the block waits for it, then writes: the
 * whole grid finishes no earlier than `spin` cycles after it starts. */
__device__ static void spin_block(long long spin)
{
    if (threadIdx.x == 0) {
        long long t0 = clock64();
        while (clock64() - t0 < spin) {
        }
    }
    __syncthreads();
}

__global__ static void add_one_kernel(float *x, size_t n, long long spin)
{
    spin_block(spin);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] += 1.0f;
}

__global__ static void fill_kernel(float *x, size_t n, float value, long long spin)
{
    spin_block(spin);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = value;
}

static unsigned blocks_for(size_t n)
{
    size_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > 1024 ? 1024 : b);
}

/* x[i] += 1 for i < n, after spinning `spin` GPU clock cycles, so that work
 * which wrongly overlaps it (a missing event wait) finds it unfinished. */
extern "C" cudaError_t gp_test_add_one(float *x, size_t n, long long spin, cudaStream_t s)
{
    add_one_kernel<<<blocks_for(n), 256, 0, s>>>(x, n, spin);
    return cudaGetLastError();
}

/* x[i] = value for i < n, after spinning as above. */
extern "C" cudaError_t gp_test_fill(float *x, size_t n, float value, long long spin, cudaStream_t s)
{
    fill_kernel<<<blocks_for(n), 256, 0, s>>>(x, n, value, spin);
    return cudaGetLastError();
}

/* A launch with zero blocks: an invalid configuration, left unchecked. */
extern "C" void gp_test_bad_launch(cudaStream_t s)
{
    add_one_kernel<<<0, 256, 0, s>>>(NULL, 0, 0);
}

/* ---- gp_fast_exp (for test_cuda_train_kernels.c) ---- */

#include "backend/cuda/fast_exp.cuh"

__global__ static void fast_exp_kernel(const double *d, double *fast, double *ref, size_t n)
{
    __shared__ double tab[GP_FAST_EXP_TABLE];
    gp_fast_exp_load(tab);
    __syncthreads();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        fast[i] = gp_fast_exp(d[i], tab);
        ref[i] = exp(d[i]);
    }
}

/* fast[i] = gp_fast_exp(d[i]), ref[i] = CUDA's exp(d[i]), i < n. */
extern "C" cudaError_t gp_test_fast_exp(const double *d, double *fast, double *ref, size_t n, cudaStream_t s)
{
    fast_exp_kernel<<<blocks_for(n), 256, 0, s>>>(d, fast, ref, n);
    return cudaGetLastError();
}
