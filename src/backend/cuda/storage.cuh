/* Storage dispatch for CUDA kernels that read and write bfloat16
 * themselves (gp_cuda_kernel.bf16_any), shared by the kernel families that
 * template their launches on the storage of their big tensors (softmax,
 * reductions, dropout, resize, pad).
 *
 * A call's big tensors are float32 alike (the float32 path, unchanged),
 * bfloat16 alike (the bf16 stage's activations), or a mix (a constant or a
 * parameter among activations). The kernels are templated on their pointer
 * types: const float * / float *, const bf16_t * / bf16_t *, or gp_fptr
 * for a mix, read with ld() and written with st() (one rounding to nearest
 * even into bfloat16). with_storage() instantiates a launcher written once
 * as a generic lambda for the call's storage. */
#ifndef GP_CUDA_STORAGE_CUH
#define GP_CUDA_STORAGE_CUH

#include <initializer_list>
#include <stdint.h>

#include "backend/cuda/bf16.cuh"

typedef __nv_bfloat16 bf16_t;

__device__ static inline float ld(const float *p, int64_t i) { return p[i]; }
__device__ static inline float ld(const bf16_t *p, int64_t i) { return __bfloat162float(p[i]); }
__device__ static inline float ld(gp_fptr t, int64_t i) { return gp_ld(t, i); }
__device__ static inline void st(float *p, int64_t i, float v) { p[i] = v; }
__device__ static inline void st(bf16_t *p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
__device__ static inline void st(gp_fptr t, int64_t i, float v) { gp_st(t, i, v); }

/* The tensor k elements on (pointers add as usual). */
__host__ __device__ static inline gp_fptr operator+(gp_fptr t, int64_t k)
{
    gp_fptr r = {(char *)t.p + k * (int64_t)(t.bf16 ? sizeof(bf16_t) : sizeof(float)), t.bf16};
    return r;
}

enum storage { ST_F32, ST_BF16, ST_MIX };

/* The storage of the tensors given (absent ones, p NULL, left out). */
static inline enum storage storage_of(std::initializer_list<gp_fptr> ts)
{
    int n16 = 0, n = 0;
    for (gp_fptr t : ts) n += t.p != NULL, n16 += t.p && t.bf16;
    return n16 == 0 ? ST_F32 : n16 == n ? ST_BF16 : ST_MIX;
}

/* f(tag): tag a float, a bf16_t or a gp_fptr value, for in_as / out_as. */
template <typename F>
static inline void with_storage(enum storage s, F &&f)
{
    if (s == ST_F32) f(0.0f);
    else if (s == ST_BF16) f(bf16_t());
    else f(gp_fptr());
}

/* A tensor as the kernels of storage `tag` take it (read; written). */
static inline const float *in_as(float, gp_fptr t) { return (const float *)t.p; }
static inline const bf16_t *in_as(bf16_t, gp_fptr t) { return (const bf16_t *)t.p; }
static inline gp_fptr in_as(gp_fptr, gp_fptr t) { return t; }
static inline float *out_as(float, gp_fptr t) { return (float *)t.p; }
static inline bf16_t *out_as(bf16_t, gp_fptr t) { return (bf16_t *)t.p; }
static inline gp_fptr out_as(gp_fptr, gp_fptr t) { return t; }

#endif
