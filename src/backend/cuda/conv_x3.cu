/* The operand splits of float32 convolutions in 3xTF32 (conv_x3.h). */
#include <stdint.h>

#include "backend/cuda/conv_x3.h"
#include "backend/cuda/kernel_util.cuh"

/* x = hi + lo: hi x rounded to TF32 (to nearest, ties away from zero, as
 * cvt.rna: half a TF32 last place added to the bits, then truncated), lo
 * = x - hi (exact in float32) rounded the same way. Where rounding up would
 * overflow hi to an infinity it truncates instead; a NaN or an infinity is
 * its own hi, with lo 0. */
__device__ static inline void tf32_split(float x, float &hi, float &lo)
{
    uint32_t b = __float_as_uint(x);
    if ((b & 0x7f800000u) == 0x7f800000u) {
        hi = x;
        lo = 0.0f;
        return;
    }
    uint32_t r = (b + 0x1000u) & 0xffffe000u;
    if ((r & 0x7f800000u) == 0x7f800000u) r = b & 0xffffe000u;
    hi = __uint_as_float(r);
    float rest = __fsub_rn(x, hi);
    lo = __uint_as_float((__float_as_uint(rest) + 0x1000u) & 0xffffe000u);
}

__device__ static inline float part(float hi, float lo, unsigned lo_parts, int j)
{
    return (lo_parts >> j) & 1u ? lo : hi;
}

/* Where copy 0 of channel c of outer index o goes, in units of `inner`:
 * channel COPIES c (copy j next to it, at COPIES c + j). */
template <int COPIES>
__device__ static inline int64_t copy0_row(int64_t o, int64_t c, int64_t ch)
{
    return (o * ch + c) * COPIES;
}

/* Each kernel also stores the hi parts in src's own layout into `hi`
 * where it is not NULL (gp_cuda_conv_x3_split). */

/* inner a multiple of 4 ([N, C, H, W] tensors): a thread splits 4
 * consecutive cells of one channel into COPIES float4 stores. */
template <int COPIES>
__global__ static void split_planes_kernel(float4 *dst, float4 *hi, const float4 *src, int64_t ch, int64_t inner4,
                                           int64_t quads, unsigned lo_parts)
{
    GP_GRID_STRIDE(q, quads) {
        int64_t i = q % inner4, oc = q / inner4, c = oc % ch, o = oc / ch;
        float4 v = src[q], h, l;
        tf32_split(v.x, h.x, l.x);
        tf32_split(v.y, h.y, l.y);
        tf32_split(v.z, h.z, l.z);
        tf32_split(v.w, h.w, l.w);
        if (hi) hi[q] = h;
        float4 *d = dst + (copy0_row<COPIES>(o, c, ch) * inner4 + i);
#pragma unroll
        for (int j = 0; j < COPIES; j++) d[j * inner4] = (lo_parts >> j) & 1u ? l : h;
    }
}

/* inner 1, ch a multiple of 4 (channels-last tensors, filters): a thread
 * splits 4 consecutive channels into 4 COPIES values, COPIES consecutive
 * float4 stores. */
template <int COPIES>
__global__ static void split_channels_kernel(float4 *dst, float4 *hi, const float4 *src, int64_t quads,
                                             unsigned lo_parts)
{
    GP_GRID_STRIDE(q, quads) {
        float4 v = src[q];
        float x[4] = {v.x, v.y, v.z, v.w}, h[4], l[4];
#pragma unroll
        for (int k = 0; k < 4; k++) tf32_split(x[k], h[k], l[k]);
        if (hi) hi[q] = make_float4(h[0], h[1], h[2], h[3]);
        float out[4 * COPIES];
#pragma unroll
        for (int k = 0; k < 4; k++)
#pragma unroll
            for (int j = 0; j < COPIES; j++) out[COPIES * k + j] = part(h[k], l[k], lo_parts, j);
        float4 *d = dst + COPIES * q;
#pragma unroll
        for (int s = 0; s < COPIES; s++)
            d[s] = make_float4(out[4 * s], out[4 * s + 1], out[4 * s + 2], out[4 * s + 3]);
    }
}

/* Any shape: one value a thread. */
template <int COPIES>
__global__ static void split_any_kernel(float *dst, float *hi, const float *src, int64_t ch, int64_t inner,
                                        int64_t n, unsigned lo_parts)
{
    GP_GRID_STRIDE(e, n) {
        int64_t i = e % inner, oc = e / inner, c = oc % ch, o = oc / ch;
        float h, l;
        tf32_split(src[e], h, l);
        if (hi) hi[e] = h;
        float *d = dst + (copy0_row<COPIES>(o, c, ch) * inner + i);
#pragma unroll
        for (int j = 0; j < COPIES; j++) d[j * inner] = part(h, l, lo_parts, j);
    }
}

/* Two whole blocks: b0[e], b1[e] copies 0 and 1 of src[e], 4 values a
 * thread (n a multiple of 4, 16-byte aligned). */
__global__ static void split_blocks4_kernel(float4 *b0, float4 *b1, const float4 *src, int64_t quads,
                                            unsigned lo_parts)
{
    GP_GRID_STRIDE(q, quads) {
        float4 v = src[q], h, l;
        tf32_split(v.x, h.x, l.x);
        tf32_split(v.y, h.y, l.y);
        tf32_split(v.z, h.z, l.z);
        tf32_split(v.w, h.w, l.w);
        b0[q] = lo_parts & 1u ? l : h;
        b1[q] = lo_parts & 2u ? l : h;
    }
}

__global__ static void split_blocks_kernel(float *b0, float *b1, const float *src, int64_t n, unsigned lo_parts)
{
    GP_GRID_STRIDE(e, n) {
        float h, l;
        tf32_split(src[e], h, l);
        b0[e] = part(h, l, lo_parts, 0);
        b1[e] = part(h, l, lo_parts, 1);
    }
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

extern "C" cudaError_t gp_cuda_conv_x3_split_blocks(cudaStream_t stream, float *dst, const float *src, int64_t n,
                                                    unsigned lo_parts)
{
    if (n == 0) return cudaSuccess;
    if (n % 4 == 0 && aligned16(dst) && aligned16(src))
        split_blocks4_kernel<<<gp_cuda_blocks_for(n / 4), GP_CUDA_THREADS, 0, stream>>>(
            (float4 *)dst, (float4 *)(dst + n), (const float4 *)src, n / 4, lo_parts);
    else
        split_blocks_kernel<<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, stream>>>(dst, dst + n, src, n, lo_parts);
    return cudaGetLastError();
}

template <int COPIES>
static cudaError_t split(cudaStream_t stream, float *dst, float *hi, const float *src, int64_t outer, int64_t ch,
                         int64_t inner, unsigned lo_parts)
{
    int64_t n = outer * ch * inner;
    if (n == 0) return cudaSuccess;
    bool vec = aligned16(dst) && aligned16(src) && (!hi || aligned16(hi));
    if (vec && inner % 4 == 0)
        split_planes_kernel<COPIES><<<gp_cuda_blocks_for(n / 4), GP_CUDA_THREADS, 0, stream>>>(
            (float4 *)dst, (float4 *)hi, (const float4 *)src, ch, inner / 4, n / 4, lo_parts);
    else if (vec && inner == 1 && ch % 4 == 0)
        split_channels_kernel<COPIES><<<gp_cuda_blocks_for(n / 4), GP_CUDA_THREADS, 0, stream>>>(
            (float4 *)dst, (float4 *)hi, (const float4 *)src, n / 4, lo_parts);
    else
        split_any_kernel<COPIES><<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, stream>>>(dst, hi, src, ch, inner, n,
                                                                                         lo_parts);
    return cudaGetLastError();
}

extern "C" cudaError_t gp_cuda_conv_x3_split(cudaStream_t stream, float *dst, float *hi, const float *src,
                                             int64_t outer, int64_t ch, int64_t inner, int copies, unsigned lo_parts)
{
    switch (copies) {
    case 1: return split<1>(stream, dst, hi, src, outer, ch, inner, lo_parts);
    case 2: return split<2>(stream, dst, hi, src, outer, ch, inner, lo_parts);
    default: return cudaErrorInvalidValue;
    }
}

/* One value of dW a thread: its hi hi, and its two small products summed
 * first (conv_x3.h). */
__global__ static void filter_sum_kernel(float *out, const float *a, const float *b, int64_t r, int64_t n, bool add)
{
    GP_GRID_STRIDE(e, n) {
        int64_t m = e / r, i = e - m * r;
        float hh = a[(2 * m + 1) * r + i], small = a[2 * m * r + i] + b[e];
        out[e] = add ? (out[e] + hh) + small : hh + small;
    }
}

extern "C" cudaError_t gp_cuda_conv_x3_filter_sum(cudaStream_t stream, float *out, const float *a, const float *b,
                                                  int64_t m, int64_t r, bool add)
{
    int64_t n = m * r;
    if (n == 0) return cudaSuccess;
    filter_sum_kernel<<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, stream>>>(out, a, b, r, n, add);
    return cudaGetLastError();
}
