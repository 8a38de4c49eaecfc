/* Storage of a launch's float tensors, for the elementwise and
 * broadcasting kernels that read and write bfloat16 themselves
 * (gp_cuda_kernel.bf16_any; elementwise.cu, binary.cu through
 * broadcast.cuh): each kernel is instantiated for float32 throughout, for
 * bfloat16 throughout, and for a mix, and the host picks one per launch. */
#ifndef GP_CUDA_ELEMENTWISE_STORAGE_CUH
#define GP_CUDA_ELEMENTWISE_STORAGE_CUH

#include <initializer_list>
#include <stdint.h>

#include "backend/cuda/bf16.cuh"

/* S: float (float32 throughout: the float32 path), __nv_bfloat16
 * (bfloat16 throughout) or stor_mix (a mix, each tensor a gp_fptr whose
 * type is read at run time, uniform across the launch). */
struct stor_mix {};
template <class S> struct stor { typedef S *ptr; };
template <> struct stor<stor_mix> { typedef gp_fptr ptr; };

__device__ static inline float ldf(const float *p, int64_t i) { return p[i]; }
__device__ static inline float ldf(const __nv_bfloat16 *p, int64_t i) { return __bfloat162float(p[i]); }
__device__ static inline float ldf(gp_fptr p, int64_t i) { return gp_ld(p, i); }
/* Stores round to nearest even where the tensor is bfloat16. */
__device__ static inline void stf(float *p, int64_t i, float v) { p[i] = v; }
__device__ static inline void stf(__nv_bfloat16 *p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
__device__ static inline void stf(gp_fptr p, int64_t i, float v) { gp_st(p, i, v); }

/* Device pointer p (bfloat16 or not) as a launch of storage S sees it. */
template <class S> static inline typename stor<S>::ptr stor_ptr(const void *p, bool bf16)
{
    (void)bf16;
    return (S *)p;
}
template <> inline gp_fptr stor_ptr<stor_mix>(const void *p, bool bf16)
{
    gp_fptr t = {(void *)p, bf16};
    return t;
}

/* Which instantiation a launch takes, from whether each float tensor it
 * touches is bfloat16. */
enum stor_kind { STOR_F32, STOR_BF16, STOR_MIX };

static inline enum stor_kind stor_of(std::initializer_list<bool> bf16)
{
    bool any16 = false, any32 = false;
    for (bool b : bf16) (b ? any16 : any32) = true;
    return any16 && any32 ? STOR_MIX : any16 ? STOR_BF16 : STOR_F32;
}

/* Runs the statements with S the storage type of `kind`. */
#define WITH_STOR(kind, ...)                                                                                  \
    do {                                                                                                      \
        if ((kind) == STOR_F32) {                                                                             \
            typedef float S;                                                                                  \
            __VA_ARGS__;                                                                                      \
        } else if ((kind) == STOR_BF16) {                                                                     \
            typedef __nv_bfloat16 S;                                                                          \
            __VA_ARGS__;                                                                                      \
        } else {                                                                                              \
            typedef stor_mix S;                                                                               \
            __VA_ARGS__;                                                                                      \
        }                                                                                                     \
    } while (0)

#endif
