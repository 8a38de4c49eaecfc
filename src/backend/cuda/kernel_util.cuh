/* Helpers shared by the CUDA kernel family files (src/backend/cuda/<family>.cu)
 * and the training kernels (loss.cu, optim.cu): launch geometry, grid-stride
 * loops, element access by dtype, arithmetic that is never contracted, block
 * sums in a fixed order, error messages naming the node or the call. */
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

/* Grid-stride loops that keep GP_ILP independent elements in flight per
 * thread (each pass loads them all, then computes and stores): coalesced,
 * and latency hidden even for long formulas. */
#define GP_ILP 4
#define GP_GRID_STRIDE_ILP(i0, st, n)                                                \
    for (int64_t st = (int64_t)gridDim.x * blockDim.x,                               \
                 i0 = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;                \
         i0 < (n); i0 += GP_ILP * st)

static inline unsigned gp_cuda_blocks_ilp(int64_t n) { return gp_cuda_blocks_for((n + GP_ILP - 1) / GP_ILP); }

/* Rounding: nvcc contracts a * b + c into one FMA, which the CPU build does
 * not; where a product feeds a sum, kernels spell the operations with these
 * _rn intrinsics, which are never contracted. */
#define FADD __fadd_rn
#define FSUB __fsub_rn
#define FMUL __fmul_rn
#define DADD __dadd_rn
#define DSUB __dsub_rn
#define DMUL __dmul_rn

/* a / b for a, b >= 0: 32-bit division when both fit (a fraction of the
 * 64-bit one's instructions), which index decompositions nearly always
 * allow. */
__device__ static inline int64_t gp_dev_fdiv(int64_t a, int64_t b)
{
    return ((a | b) >> 32) == 0 ? (int64_t)((uint32_t)a / (uint32_t)b) : a / b;
}

static inline const struct gp_value *gp_cuda_in_value(const struct gp_cuda_ctx *c, int i)
{
    return gp_node_input(c->graph, c->node, i);
}

static inline const struct gp_value *gp_cuda_out_value(const struct gp_cuda_ctx *c, int i)
{
    return gp_node_output(c->graph, c->node, i);
}

static inline const struct gp_shape *gp_cuda_in_shape(const struct gp_cuda_ctx *c, int i)
{
    return &gp_cuda_in_value(c, i)->shape;
}

static inline const struct gp_shape *gp_cuda_out_shape(const struct gp_cuda_ctx *c, int i)
{
    return &gp_cuda_out_value(c, i)->shape;
}

/* Bytes per element on the device: float dtypes are float32. */
static inline size_t gp_cuda_esize(enum gp_dtype dt)
{
    return gp_dtype_is_float(dt) ? sizeof(float) : gp_dtype_size(dt);
}

static inline size_t gp_cuda_in_esize(const struct gp_cuda_ctx *c, int i)
{
    return gp_cuda_esize(gp_cuda_in_value(c, i)->dtype);
}

/* Output i, or NULL when the node does not have it (optional outputs). */
static inline float *gp_cuda_opt_out(const struct gp_cuda_ctx *c, int i)
{
    return c->node->n_outputs > i ? (float *)c->out[i] : NULL;
}

static inline const float *gp_cuda_opt_dout(const struct gp_cuda_ctx *c, int i)
{
    return c->node->n_outputs > i ? c->dout[i] : NULL;
}

/* The op layer's view of a node, so kernels reuse its plan helpers
 * (gp_norm_axis, gp_const_ints, ...; the CPU's gp_cpu_infer_ctx) and their
 * messages name the node the same way. Those helpers only read the graph. */
static inline struct gp_infer_ctx gp_cuda_infer_ctx(const struct gp_graph *g, const struct gp_node *node,
                                                    struct gp_error *err)
{
    struct gp_infer_ctx ic;
    ic.graph = (struct gp_graph *)g;
    ic.node = (struct gp_node *)node;
    ic.err = err;
    return ic;
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

/* A launch's error, naming the function and the kernel (the training
 * kernels, which have no node to name). */
static inline gp_status gp_cuda_launched(const char *fn, const char *kernel, struct gp_error *err)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return GP_OK;
    return gp_error_set(err, GP_ERR_DEVICE, "%s: launching %s: %s (%s)", fn, kernel,
                        cudaGetErrorString(e), cudaGetErrorName(e));
}

/* Elements of `es` bytes: the sizes the moving kernels handle. */
static inline gp_status gp_cuda_check_esize(const struct gp_cuda_ctx *c, size_t es, struct gp_error *err)
{
    if (es == 1 || es == 2 || es == 4 || es == 8) return GP_OK;
    return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "elements of %zu bytes", es);
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

/* Threads per block for rows / planes of `len` values (a multiple of 32). */
static inline unsigned gp_cuda_row_threads(int64_t len)
{
    return len <= 64 ? 32 : len <= 512 ? 128 : len <= 4096 ? 256 : 512;
}

/* Whether float4 loads and stores may use p. */
static inline bool gp_cuda_aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

/* Offsets into scratch memory rounded up to 256 bytes. */
static inline size_t gp_cuda_align256(size_t x) { return (x + 255) & ~(size_t)255; }

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

/* The warp's sum in lane 0 (shuffles down), and the block's sum in thread 0
 * only (the same fixed tree as gp_dev_block_sum, without handing the
 * result to every thread): the training kernels' sums. blockDim.x is a
 * multiple of 32; every thread of the block calls gp_dev_block_sum0. */
__device__ static inline double gp_dev_warp_sum0(double v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

__device__ static inline double gp_dev_block_sum0(double v, double *sh /* [32] */)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = gp_dev_warp_sum0(v);
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) v = gp_dev_warp_sum0(lane < nw ? sh[lane] : 0.0);
    return v;
}

/* Mean and biased variance of v [n] by the block, two passes in double
 * (the CPU's gp_cpu_moments); every thread gets both. sh: as for
 * gp_dev_block_sum. Instance and layer normalization. */
__device__ static inline void gp_dev_block_moments(const float *v, int64_t n, double *sh, double *mean,
                                                   double *var)
{
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s = DADD(s, (double)v[i]);
    s = gp_dev_block_sum(s, sh);
    double m = n > 0 ? s / (double)n : 0.0;
    double q = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        double d = DSUB((double)v[i], m);
        q = DADD(q, DMUL(d, d));
    }
    q = gp_dev_block_sum(q, sh);
    *mean = m;
    *var = n > 0 ? q / (double)n : 0.0;
}

#endif
