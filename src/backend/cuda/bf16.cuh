/* bfloat16 storage for the CUDA kernels that read and write it themselves
 * (gp_cuda_kernel.bf16): loads widen to float, stores round to nearest even
 * (as the CPU's gp_float_to_bf16), so a kernel templated on its storage
 * types computes in float32 either way and rounds once per stored value. */
#ifndef GP_CUDA_BF16_CUH
#define GP_CUDA_BF16_CUH

#include <initializer_list>
#include <stdbool.h>
#include <stdint.h>

#include <cuda_bf16.h>

#include "backend/cuda/kernel.h"

__device__ static inline float gp_load(const float *p) { return *p; }
__device__ static inline float gp_load(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ static inline void gp_store(float *p, float v) { *p = v; }
__device__ static inline void gp_store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

/* bfloat16 as its 16 bits: widened exactly, and rounded from float32 to
 * nearest even bit for bit as the CPU's gp_float_to_bf16 (a NaN keeps its
 * sign and its payload's top bits, made quiet), which __float2bfloat16_rn
 * is not for NaN (it returns one canonical NaN). What the executor's
 * conversions store (convert.cu), and the losses that read and write
 * bfloat16 themselves (loss.cu), so both store the same bits. */
__device__ static inline float gp_bf16_bits_to_f32(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

__device__ static inline uint16_t gp_f32_to_bf16_bits(float f)
{
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* Whether entry i of a ctx's storage types (in_dt, out_dt, din_dt,
 * dout_dt; NULL: all float32) is bfloat16. */
static inline bool gp_cuda_is_bf16(const enum gp_dtype *dt, int i)
{
    return dt && dt[i] == GP_DTYPE_BFLOAT16;
}

/* A float tensor of either storage type, for kernels that take any mix
 * (gp_cuda_kernel.bf16_any: bfloat16 activations beside float32
 * parameters). The type is uniform across a launch, so the branch costs
 * no divergence; kernels whose big tensors share one type may instead be
 * templated on it (gp_load / gp_store above). */
struct gp_fptr {
    void *p;
    bool bf16;
};

__device__ static inline float gp_ld(gp_fptr t, int64_t i)
{
    return t.bf16 ? __bfloat162float(((const __nv_bfloat16 *)t.p)[i]) : ((const float *)t.p)[i];
}

/* Stores v, rounded to nearest even when the tensor is bfloat16. */
__device__ static inline void gp_st(gp_fptr t, int64_t i, float v)
{
    if (t.bf16) ((__nv_bfloat16 *)t.p)[i] = __float2bfloat16_rn(v);
    else ((float *)t.p)[i] = v;
}

/* t[i] += v with one rounding of the sum (a bfloat16 gradient widened,
 * added to in float32 and rounded back: what a staged float32 copy does
 * for a kernel that adds one term per element). */
__device__ static inline void gp_acc(gp_fptr t, int64_t i, float v) { gp_st(t, i, __fadd_rn(gp_ld(t, i), v)); }

/* Input k, output k, the gradient of input k, and the incoming gradient of
 * output k of a call, with their storage types. */
static inline gp_fptr gp_cuda_in_f(const struct gp_cuda_ctx *c, int k)
{
    gp_fptr t = {c->in[k], gp_cuda_is_bf16(c->in_dt, k)};
    return t;
}
static inline gp_fptr gp_cuda_out_f(const struct gp_cuda_ctx *c, int k)
{
    gp_fptr t = {c->out[k], gp_cuda_is_bf16(c->out_dt, k)};
    return t;
}
static inline gp_fptr gp_cuda_din_f(const struct gp_cuda_ctx *c, int k)
{
    gp_fptr t = {(void *)c->din[k], gp_cuda_is_bf16(c->din_dt, k)};
    return t;
}
static inline gp_fptr gp_cuda_dout_f(const struct gp_cuda_ctx *c, int k)
{
    gp_fptr t = {(void *)c->dout[k], gp_cuda_is_bf16(c->dout_dt, k)};
    return t;
}

/* A run of VEC consecutive values as one memory access (up to 16 bytes;
 * 32 as two): what keeps enough bytes in flight for the bandwidth-bound
 * passes, where one 2-byte load per thread at a time cannot. The caller
 * guarantees alignment to the run's bytes (at most 16 bytes). */
template <int BYTES> struct gp_raw;
template <> struct gp_raw<1> { typedef unsigned char t; };
template <> struct gp_raw<2> { typedef unsigned short t; };
template <> struct gp_raw<4> { typedef unsigned t; };
template <> struct gp_raw<8> { typedef uint2 t; };
template <> struct gp_raw<16> { typedef uint4 t; };
template <> struct gp_raw<32> { typedef struct { uint4 a, b; } t; };

template <typename A, int VEC> struct gp_run {
    typedef typename gp_raw<(int)sizeof(A) * VEC>::t raw;
    union u {
        raw r;
        A a[VEC];
    };
    __device__ static void load(const void *base, int64_t i, float (&v)[VEC])
    {
        u x;
        x.r = *(const raw *)((const A *)base + i);
#pragma unroll
        for (int k = 0; k < VEC; k++) v[k] = gp_load(&x.a[k]);
    }
    __device__ static void store(void *base, int64_t i, const float (&v)[VEC])
    {
        u x;
#pragma unroll
        for (int k = 0; k < VEC; k++) gp_store(&x.a[k], v[k]);
        *(raw *)((A *)base + i) = x.r;
    }
};

/* Whether n values of `elem` bytes split into runs of `vec` whose accesses
 * every pointer given aligns (NULL ones do not count): when the
 * elementwise passes may move runs (gp_run) instead of single values. */
static inline bool gp_runs_fit(int64_t n, int vec, size_t elem, std::initializer_list<const void *> ptrs)
{
    if (n % vec) return false;
    size_t align = elem * (size_t)vec > 16 ? 16 : elem * (size_t)vec;
    for (const void *p : ptrs)
        if (p && (uintptr_t)p % align) return false;
    return true;
}

/* Bytes of one element of a float tensor stored as bfloat16 or float32. */
static inline size_t gp_cuda_float_size(bool bf16) { return bf16 ? sizeof(__nv_bfloat16) : sizeof(float); }

#endif
