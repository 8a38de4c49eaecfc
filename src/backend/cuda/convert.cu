/* float32 <-> bfloat16 conversion and accumulation on the device, the CUDA
 * twin of the CPU's convert (backend/cpu/compute.c): the executor's bf16
 * precision stages tensors through it (backend/mixed_call.h) and makes the
 * weights' bfloat16 copies with it. Rounding is the CPU's gp_float_to_bf16
 * bit for bit (nearest even; NaN stays a quiet NaN of the same sign and
 * payload top bits: bf16.cuh's, which the losses share), so both backends
 * store the same bits. */
#include <stdint.h>
#include <string.h>

#include <cuda_runtime.h>

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/convert.h"
#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/train_kernels.h"
#include "util/env.h"

template <bool SRC_BF16, bool DST_BF16, bool ACC>
__global__ void convert_kernel(void *dst, const void *src, int64_t n)
{
    GP_GRID_STRIDE(i, n)
    {
        float x = SRC_BF16 ? gp_bf16_bits_to_f32(((const uint16_t *)src)[i]) : ((const float *)src)[i];
        if (ACC) x = (DST_BF16 ? gp_bf16_bits_to_f32(((uint16_t *)dst)[i]) : ((float *)dst)[i]) + x;
        if (DST_BF16)
            ((uint16_t *)dst)[i] = gp_f32_to_bf16_bits(x);
        else
            ((float *)dst)[i] = x;
    }
}

/* The same on runs of 8 values: one 16-byte access per run of bfloat16,
 * two per run of float32, two runs per thread and pass. One 2-byte access
 * per thread at a time kept too few bytes in flight: seeding GPT-2's
 * logits' gradient ([16, 1024, 50304] bfloat16 += bfloat16, 4.95 GB moved)
 * ran at 2.0 TB/s. Each value is computed as above, so the bits are the
 * same. Needs both pointers 16-byte aligned; the caller does n % 8. */
#define RUN 8

template <bool BF16> struct run8;
template <> struct run8<true> {
    /* Little-endian: value 2k is the low half of word k. */
    __device__ static void load(const void *p, int64_t r, float (&v)[RUN])
    {
        uint4 q = ((const uint4 *)p)[r];
        uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[2 * k] = gp_bf16_bits_to_f32((uint16_t)(w[k] & 0xffffu));
            v[2 * k + 1] = gp_bf16_bits_to_f32((uint16_t)(w[k] >> 16));
        }
    }
    __device__ static void store(void *p, int64_t r, const float (&v)[RUN])
    {
        uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            w[k] = (uint32_t)gp_f32_to_bf16_bits(v[2 * k]) | (uint32_t)gp_f32_to_bf16_bits(v[2 * k + 1]) << 16;
        ((uint4 *)p)[r] = make_uint4(w[0], w[1], w[2], w[3]);
    }
};
template <> struct run8<false> {
    __device__ static void load(const void *p, int64_t r, float (&v)[RUN])
    {
        float4 a = ((const float4 *)p)[2 * r], b = ((const float4 *)p)[2 * r + 1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    }
    __device__ static void store(void *p, int64_t r, const float (&v)[RUN])
    {
        ((float4 *)p)[2 * r] = make_float4(v[0], v[1], v[2], v[3]);
        ((float4 *)p)[2 * r + 1] = make_float4(v[4], v[5], v[6], v[7]);
    }
};

template <bool SRC_BF16, bool DST_BF16, bool ACC>
__global__ void convert_runs_kernel(void *dst, const void *src, int64_t runs)
{
    const int64_t st = (int64_t)gridDim.x * blockDim.x;
    for (int64_t r0 = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r0 < runs; r0 += 2 * st) {
        float x[2][RUN], d[2][RUN];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int64_t r = r0 + u * st;
            if (r >= runs) continue;
            run8<SRC_BF16>::load(src, r, x[u]);
            if (ACC) run8<DST_BF16>::load(dst, r, d[u]);
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int64_t r = r0 + u * st;
            if (r >= runs) continue;
            if (ACC)
#pragma unroll
                for (int k = 0; k < RUN; k++) x[u][k] = d[u][k] + x[u][k];
            run8<DST_BF16>::store(dst, r, x[u]);
        }
    }
}

template <bool SRC_BF16, bool DST_BF16, bool ACC>
static void launch_as(cudaStream_t stream, void *dst, const void *src, int64_t n)
{
    const size_t ds = DST_BF16 ? 2 : 4, ss = SRC_BF16 ? 2 : 4;
    int64_t runs = 0;
    if (gp_cuda_aligned16(dst) && gp_cuda_aligned16(src)) {
        runs = n / RUN;
        if (runs > 0)
            convert_runs_kernel<SRC_BF16, DST_BF16, ACC><<<gp_cuda_blocks_for((runs + 1) / 2), GP_CUDA_THREADS, 0,
                                                           stream>>>(dst, src, runs);
    }
    /* The values after the last whole run (all of them when a pointer is
     * not aligned), one per thread. */
    int64_t done = runs * RUN;
    if (n > done)
        convert_kernel<SRC_BF16, DST_BF16, ACC><<<gp_cuda_blocks_for(n - done), GP_CUDA_THREADS, 0, stream>>>(
            (char *)dst + (size_t)done * ds, (const char *)src + (size_t)done * ss, n - done);
}

template <bool SRC_BF16, bool DST_BF16>
static void launch(cudaStream_t stream, void *dst, const void *src, int64_t n, bool acc)
{
    if (acc)
        launch_as<SRC_BF16, DST_BF16, true>(stream, dst, src, n);
    else
        launch_as<SRC_BF16, DST_BF16, false>(stream, dst, src, n);
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

/* ---- between layouts ----
 * One tile of 32 channels x 32 cells of one sample per block: read along
 * the source's contiguous axis, written along the destination's. */
#define TILE 32
#define TILE_ROWS 8

template <typename T> __device__ static inline float load_as_f32(const void *p, int64_t i);
template <> __device__ inline float load_as_f32<float>(const void *p, int64_t i) { return ((const float *)p)[i]; }
template <> __device__ inline float load_as_f32<uint16_t>(const void *p, int64_t i)
{
    return gp_bf16_bits_to_f32(((const uint16_t *)p)[i]);
}

template <typename T> __device__ static inline void store_f32(void *p, int64_t i, float x, bool acc);
template <> __device__ inline void store_f32<float>(void *p, int64_t i, float x, bool acc)
{
    float *d = (float *)p;
    d[i] = acc ? d[i] + x : x;
}
template <> __device__ inline void store_f32<uint16_t>(void *p, int64_t i, float x, bool acc)
{
    uint16_t *d = (uint16_t *)p;
    d[i] = gp_f32_to_bf16_bits(acc ? gp_bf16_bits_to_f32(d[i]) + x : x);
}

/* TO_NHWC: src [n, c, hw] -> dst [n, hw, c]; else the reverse. */
template <typename S, typename D, bool TO_NHWC>
__global__ void relayout_kernel(void *dst, const void *src, int64_t n, int64_t c, int64_t hw, bool acc)
{
    __shared__ float tile[TILE][TILE + 1];
    int64_t c0 = (int64_t)blockIdx.y * TILE, p0 = (int64_t)blockIdx.x * TILE;
    for (int64_t b = blockIdx.z; b < n; b += gridDim.z) {
        const int64_t base = b * c * hw;
        /* Read: along hw for NCHW sources, along c for NHWC ones. */
        for (int r = threadIdx.y; r < TILE; r += TILE_ROWS) {
            if (TO_NHWC) {
                int64_t ch = c0 + r, p = p0 + threadIdx.x;
                if (ch < c && p < hw) tile[r][threadIdx.x] = load_as_f32<S>(src, base + ch * hw + p);
            } else {
                int64_t p = p0 + r, ch = c0 + threadIdx.x;
                if (ch < c && p < hw) tile[threadIdx.x][r] = load_as_f32<S>(src, base + p * c + ch);
            }
        }
        __syncthreads();
        for (int r = threadIdx.y; r < TILE; r += TILE_ROWS) {
            if (TO_NHWC) {
                int64_t p = p0 + r, ch = c0 + threadIdx.x;
                if (ch < c && p < hw) store_f32<D>(dst, base + p * c + ch, tile[threadIdx.x][r], acc);
            } else {
                int64_t ch = c0 + r, p = p0 + threadIdx.x;
                if (ch < c && p < hw) store_f32<D>(dst, base + ch * hw + p, tile[r][threadIdx.x], acc);
            }
        }
        __syncthreads();
    }
}

template <typename S, typename D>
static void launch_relayout(cudaStream_t stream, void *dst, const void *src, bool to_nhwc, int64_t n, int64_t c,
                            int64_t hw, bool acc)
{
    dim3 block(TILE, TILE_ROWS);
    dim3 grid((unsigned)((hw + TILE - 1) / TILE), (unsigned)((c + TILE - 1) / TILE), (unsigned)(n < 65535 ? n : 65535));
    if (to_nhwc)
        relayout_kernel<S, D, true><<<grid, block, 0, stream>>>(dst, src, n, c, hw, acc);
    else
        relayout_kernel<S, D, false><<<grid, block, 0, stream>>>(dst, src, n, c, hw, acc);
}

/* One thread per destination element: dst [n, dst_c, hw] (in its layout)
 * = src's channel ch (in its layout) for ch < src_c, else 0. Where a
 * tile of 32 x 32 would be mostly idle (a filter's 3 x 3 cells, an
 * image's 3 channels) this gather reads each source line from L2 a few
 * times and still writes whole lines. I: the index type (32-bit
 * divisions where the tensor allows). */
template <typename S, typename D, typename I>
__global__ void relayout_gather_kernel(void *dst, bool dst_nhwc, I dst_c, const void *src, bool src_nhwc, I src_c,
                                       I hw, I total, bool acc)
{
    for (I e = (I)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (I)gridDim.x * blockDim.x) {
        I b, ch, p;
        if (dst_nhwc) {
            I bp = e / dst_c;
            ch = e - bp * dst_c;
            b = bp / hw;
            p = bp - b * hw;
        } else {
            I bc = e / hw;
            p = e - bc * hw;
            b = bc / dst_c;
            ch = bc - b * dst_c;
        }
        float v = 0.0f;
        if (ch < src_c) v = load_as_f32<S>(src, src_nhwc ? (b * hw + p) * src_c + ch : (b * src_c + ch) * hw + p);
        store_f32<D>(dst, e, v, acc);
    }
}

/* One thread per destination pixel, [n, c, hw] -> [n, hw, dst_c], dst_c a
 * 16-byte run (8 bfloat16, 4 float32): the pixel's src_c values, read
 * from their planes (a warp's 32 pixels are contiguous in each), zeros
 * beyond, stored as one 16-byte access. The padded image of a 3-channel
 * stem in channels-last: the element-per-thread gather, two divisions and
 * a 2-byte store an element, took 165 us for ResNet-50's 128 images in
 * bfloat16 on an H100 (0.8 TB/s), twice a step (the forward, and the
 * filter gradient's input); this one: ResNet-50 bf16 5091 -> 5117 and
 * 5126 samples/s, 5118 -> 5124 in another run (2026-12-07). */
template <typename S, typename D, typename I>
__global__ void relayout_pixels_kernel(void *dst, const void *src, I src_c, I hw, I pixels)
{
    constexpr int PIX = 16 / sizeof(D);
    for (I q = (I)blockIdx.x * blockDim.x + threadIdx.x; q < pixels; q += (I)gridDim.x * blockDim.x) {
        I b = q / hw, p = q - b * hw;
        union {
            uint4 v;
            D e[PIX];
        } out;
#pragma unroll
        for (int ch = 0; ch < PIX; ch++) {
            float v = (I)ch < src_c ? load_as_f32<S>(src, (b * src_c + (I)ch) * hw + p) : 0.0f;
            store_f32<D>(out.e, ch, v, false);
        }
        ((uint4 *)dst)[q] = out.v;
    }
}

/* GP_RELAYOUT_PIXELS=0: the element gather for those too (measurement). */
static bool relayout_pixels_on(void)
{
    static const bool on = gp_env_flag("GP_RELAYOUT_PIXELS", true);
    return on;
}

template <typename S, typename D>
static void launch_gather(cudaStream_t stream, void *dst, bool dst_nhwc, int64_t dst_c, const void *src,
                          bool src_nhwc, int64_t src_c, int64_t n, int64_t hw, bool acc)
{
    int64_t total = n * dst_c * hw, src_total = n * src_c * hw;
    if (dst_nhwc && !src_nhwc && !acc && dst_c * (int64_t)sizeof(D) == 16 && src_c <= dst_c &&
        ((uintptr_t)dst & 15) == 0 && relayout_pixels_on()) {
        int64_t pixels = n * hw;
        unsigned blocks = gp_cuda_blocks_for(pixels);
        if (total <= INT32_MAX && src_total <= INT32_MAX)
            relayout_pixels_kernel<S, D, uint32_t><<<blocks, GP_CUDA_THREADS, 0, stream>>>(
                dst, src, (uint32_t)src_c, (uint32_t)hw, (uint32_t)pixels);
        else
            relayout_pixels_kernel<S, D, int64_t><<<blocks, GP_CUDA_THREADS, 0, stream>>>(dst, src, src_c, hw, pixels);
        return;
    }
    unsigned blocks = gp_cuda_blocks_for(total);
    if (total <= INT32_MAX && src_total <= INT32_MAX)
        relayout_gather_kernel<S, D, uint32_t><<<blocks, GP_CUDA_THREADS, 0, stream>>>(
            dst, dst_nhwc, (uint32_t)dst_c, src, src_nhwc, (uint32_t)src_c, (uint32_t)hw, (uint32_t)total, acc);
    else
        relayout_gather_kernel<S, D, int64_t><<<blocks, GP_CUDA_THREADS, 0, stream>>>(
            dst, dst_nhwc, dst_c, src, src_nhwc, src_c, hw, total, acc);
}

/* Cells per plane below which a tile's threads would mostly idle. */
#define GATHER_MAX_CELLS 16

static gp_status check_relayout_types(const char *fn, enum gp_dtype dst_type, enum gp_dtype src_type,
                                      struct gp_error *err)
{
    bool sb = src_type == GP_DTYPE_BFLOAT16, db = dst_type == GP_DTYPE_BFLOAT16;
    if ((!sb && src_type != GP_DTYPE_FLOAT32) || (!db && dst_type != GP_DTYPE_FLOAT32))
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "%s: %s to %s", fn, gp_dtype_name(src_type),
                            gp_dtype_name(dst_type));
    return GP_OK;
}

static gp_status relayout_launched(const char *fn, struct gp_error *err)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return gp_error_set(err, GP_ERR_DEVICE, "%s: %s", fn, cudaGetErrorString(e));
    return GP_OK;
}

extern "C" gp_status gp_cuda_relayout_channels(cudaStream_t stream, void *dst, enum gp_dtype dst_type,
                                               bool dst_nhwc, int64_t dst_c, const void *src,
                                               enum gp_dtype src_type, bool src_nhwc, int64_t src_c, int64_t n,
                                               int64_t hw, bool accumulate, struct gp_error *err)
{
    const char *fn = "gp_cuda_relayout_channels";
    GP_TRY(check_relayout_types(fn, dst_type, src_type, err));
    if (n < 0 || dst_c < 0 || src_c < 0 || hw < 0) return gp_error_set(err, GP_ERR_INVALID, "%s: negative size", fn);
    if (n == 0 || dst_c == 0 || hw == 0) return GP_OK;
    bool sb = src_type == GP_DTYPE_BFLOAT16, db = dst_type == GP_DTYPE_BFLOAT16;
    if (sb && db)
        launch_gather<uint16_t, uint16_t>(stream, dst, dst_nhwc, dst_c, src, src_nhwc, src_c, n, hw, accumulate);
    else if (sb)
        launch_gather<uint16_t, float>(stream, dst, dst_nhwc, dst_c, src, src_nhwc, src_c, n, hw, accumulate);
    else if (db)
        launch_gather<float, uint16_t>(stream, dst, dst_nhwc, dst_c, src, src_nhwc, src_c, n, hw, accumulate);
    else
        launch_gather<float, float>(stream, dst, dst_nhwc, dst_c, src, src_nhwc, src_c, n, hw, accumulate);
    return relayout_launched(fn, err);
}

extern "C" gp_status gp_cuda_relayout(cudaStream_t stream, void *dst, enum gp_dtype dst_type, bool dst_nhwc,
                                      const void *src, enum gp_dtype src_type, bool src_nhwc, int64_t n, int64_t c,
                                      int64_t hw, bool accumulate, struct gp_error *err)
{
    if (dst_nhwc == src_nhwc)
        return gp_cuda_convert(stream, dst, dst_type, src, src_type, n * c * hw, accumulate, err);
    bool sb = src_type == GP_DTYPE_BFLOAT16, db = dst_type == GP_DTYPE_BFLOAT16;
    GP_TRY(check_relayout_types("gp_cuda_relayout", dst_type, src_type, err));
    if (n < 0 || c < 0 || hw < 0) return gp_error_set(err, GP_ERR_INVALID, "gp_cuda_relayout: negative size");
    if (n == 0 || c == 0 || hw == 0) return GP_OK;
    if (hw <= GATHER_MAX_CELLS)
        return gp_cuda_relayout_channels(stream, dst, dst_type, dst_nhwc, c, src, src_type, src_nhwc, c, n, hw,
                                         accumulate, err);
    if ((hw + TILE - 1) / TILE > INT32_MAX || (c + TILE - 1) / TILE > 65535)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "gp_cuda_relayout: %lld channels of %lld cells exceed the grid",
                            (long long)c, (long long)hw);
    if (sb && db)
        launch_relayout<uint16_t, uint16_t>(stream, dst, src, dst_nhwc, n, c, hw, accumulate);
    else if (sb)
        launch_relayout<uint16_t, float>(stream, dst, src, dst_nhwc, n, c, hw, accumulate);
    else if (db)
        launch_relayout<float, uint16_t>(stream, dst, src, dst_nhwc, n, c, hw, accumulate);
    else
        launch_relayout<float, float>(stream, dst, src, dst_nhwc, n, c, hw, accumulate);
    return relayout_launched("gp_cuda_relayout", err);
}

/* ---- many float32 tensors between layouts in one launch ----
 * A stage's filter copies and their gradients, once per step
 * (pipeline/plan.h): most are small, so one launch per tensor costs more
 * than the copying. Up to RELAY_LIST tensors go by value as the kernel's
 * argument (kernel parameters are limited to 4 KiB); each thread finds its
 * element's tensor by binary search over their first elements. */

#define RELAY_LIST 32

struct relay_list {
    void *dst[RELAY_LIST];
    const float *src[RELAY_LIST];
    int64_t c[RELAY_LIST], hw[RELAY_LIST];
    int64_t first[RELAY_LIST + 1]; /* tensor t: elements [first[t], first[t + 1]) of the launch */
    int count;
};

/* Element e of dst ([b, p, ch] when to_nhwc, else [b, ch, p]) from src,
 * which lies the other way. */
template <typename D>
__global__ void relay_many_kernel(const struct relay_list L, bool to_nhwc, bool acc)
{
    const int64_t total = L.first[L.count];
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int lo = 0, hi = L.count - 1; /* the last t with first[t] <= e */
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (L.first[mid] <= e) lo = mid;
            else hi = mid - 1;
        }
        const int64_t local = e - L.first[lo], c = L.c[lo], hw = L.hw[lo];
        int64_t b, ch, p;
        if (to_nhwc) {
            const int64_t bp = local / c;
            ch = local - bp * c, b = bp / hw, p = bp - b * hw;
        } else {
            const int64_t bc = local / hw;
            p = local - bc * hw, b = bc / c, ch = bc - b * c;
        }
        const int64_t from = to_nhwc ? (b * c + ch) * hw + p : (b * hw + p) * c + ch;
        store_f32<D>(L.dst[lo], local, L.src[lo][from], acc);
    }
}

extern "C" gp_status gp_cuda_relayout_many(cudaStream_t stream, int n, void *const *dst, enum gp_dtype dst_type,
                                           bool to_nhwc, const float *const *src, const int64_t *batch,
                                           const int64_t *channels, const int64_t *cells, bool accumulate,
                                           struct gp_error *err)
{
    const char *fn = "gp_cuda_relayout_many";
    GP_TRY(check_relayout_types(fn, dst_type, GP_DTYPE_FLOAT32, err));
    int t = 0;
    while (t < n) {
        struct relay_list L;
        memset(&L, 0, sizeof L);
        for (; t < n && L.count < RELAY_LIST; t++) {
            if (batch[t] < 0 || channels[t] < 0 || cells[t] < 0)
                return gp_error_set(err, GP_ERR_INVALID, "%s: negative size", fn);
            int64_t numel = batch[t] * channels[t] * cells[t];
            if (numel == 0) continue;
            L.dst[L.count] = dst[t];
            L.src[L.count] = src[t];
            L.c[L.count] = channels[t];
            L.hw[L.count] = cells[t];
            L.first[L.count + 1] = L.first[L.count] + numel;
            L.count++;
        }
        if (!L.count) continue;
        unsigned blocks = gp_cuda_blocks_for(L.first[L.count]);
        if (dst_type == GP_DTYPE_BFLOAT16)
            relay_many_kernel<uint16_t><<<blocks, GP_CUDA_THREADS, 0, stream>>>(L, to_nhwc, accumulate);
        else
            relay_many_kernel<float><<<blocks, GP_CUDA_THREADS, 0, stream>>>(L, to_nhwc, accumulate);
        GP_TRY(relayout_launched(fn, err));
    }
    return GP_OK;
}
