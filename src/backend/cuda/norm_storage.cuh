/* Storage of the normalization kernels that read and write bfloat16
 * themselves (gp_cuda_kernel.bf16_any: BatchNormalization,
 * InstanceNormalization, LayerNormalization): their kernels are templates
 * over IO, the storage of one launch's tensors, chosen once on the host
 * (io_kind_of):
 *   io_typed<float>          all float32 (a float32 stage: the float32
 *                            code as it was),
 *   io_typed<__nv_bfloat16>  the activations bfloat16, the parameters
 *                            float32 (a bf16 stage's usual call),
 *   io_mixed                 any other mix, each tensor's type read at run
 *                            time (gp_fptr).
 * act / set_act / add_act load, store and accumulate into (one rounding)
 * an activation (X, Y, dY, dX); stored rounds a value as set_act would;
 * par loads a parameter. */
#ifndef GP_CUDA_NORM_STORAGE_CUH
#define GP_CUDA_NORM_STORAGE_CUH

#include <initializer_list>
#include <stdint.h>

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/kernel_util.cuh"

template <typename A> struct io_typed {
    __device__ static float act(gp_fptr t, int64_t i) { return gp_load((const A *)t.p + i); }
    __device__ static void set_act(gp_fptr t, int64_t i, float v) { gp_store((A *)t.p + i, v); }
    __device__ static void add_act(gp_fptr t, int64_t i, float v) { set_act(t, i, FADD(act(t, i), v)); }
    __device__ static float par(gp_fptr t, int64_t i) { return ((const float *)t.p)[i]; }
    /* v as set_act stores it into t, read back. */
    __device__ static float stored(gp_fptr t, float v)
    {
        (void)t;
        A a;
        gp_store(&a, v);
        return gp_load(&a);
    }
    /* Values i .. i + VEC - 1 (i a multiple of VEC). */
    template <int VEC> __device__ static void acts(gp_fptr t, int64_t i, float (&v)[VEC])
    {
        gp_run<A, VEC>::load(t.p, i, v);
    }
    template <int VEC> __device__ static void set_acts(gp_fptr t, int64_t i, const float (&v)[VEC])
    {
        gp_run<A, VEC>::store(t.p, i, v);
    }
};

struct io_mixed {
    __device__ static float act(gp_fptr t, int64_t i) { return gp_ld(t, i); }
    __device__ static void set_act(gp_fptr t, int64_t i, float v) { gp_st(t, i, v); }
    __device__ static void add_act(gp_fptr t, int64_t i, float v) { gp_acc(t, i, v); }
    __device__ static float par(gp_fptr t, int64_t i) { return gp_ld(t, i); }
    __device__ static float stored(gp_fptr t, float v)
    {
        return t.bf16 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
    }
    /* One value at a time (the run-time typed path is never vectorized). */
    template <int VEC> __device__ static void acts(gp_fptr t, int64_t i, float (&v)[VEC])
    {
#pragma unroll
        for (int k = 0; k < VEC; k++) v[k] = gp_ld(t, i + k);
    }
    template <int VEC> __device__ static void set_acts(gp_fptr t, int64_t i, const float (&v)[VEC])
    {
#pragma unroll
        for (int k = 0; k < VEC; k++) gp_st(t, i + k, v[k]);
    }
};


enum io_kind { IO_F32, IO_BF16, IO_MIXED };

/* The storage of a launch that reads or writes the activations `acts` and
 * the parameters `pars` (absent ones, p NULL, do not count). */
static enum io_kind io_kind_of(std::initializer_list<gp_fptr> acts, std::initializer_list<gp_fptr> pars)
{
    bool b16 = false, f32 = false;
    for (const gp_fptr &t : acts)
        if (t.p) (t.bf16 ? b16 : f32) = true;
    for (const gp_fptr &t : pars)
        if (t.p && t.bf16) return IO_MIXED;
    return b16 && f32 ? IO_MIXED : b16 ? IO_BF16 : IO_F32;
}

/* The longest run, 8, 4, 2 or 1 values, that divides `plane` (so a run
 * never leaves a plane, nor its channel) and whose bytes (16 at most)
 * align every tensor given; 1 for the run-time typed path. */
static inline int io_vec_for(enum io_kind kind, int64_t plane, std::initializer_list<gp_fptr> tensors)
{
    if (kind == IO_MIXED) return 1;
    size_t elem = kind == IO_BF16 ? 2 : 4;
    for (int vec = 8; vec > 1; vec /= 2) {
        if (plane % vec) continue;
        size_t align = elem * (size_t)vec > 16 ? 16 : elem * (size_t)vec;
        bool ok = true;
        for (const gp_fptr &t : tensors)
            if (t.p && (uintptr_t)t.p % align) ok = false;
        if (ok) return vec;
    }
    return 1;
}

/* Runs the statement(s) with IO the storage `kind` names. */
#define IO_DISPATCH(kind, ...)                                                        \
    do {                                                                              \
        if ((kind) == IO_F32) {                                                       \
            typedef io_typed<float> IO;                                               \
            __VA_ARGS__;                                                              \
        } else if ((kind) == IO_BF16) {                                               \
            typedef io_typed<__nv_bfloat16> IO;                                       \
            __VA_ARGS__;                                                              \
        } else {                                                                      \
            typedef io_mixed IO;                                                      \
            __VA_ARGS__;                                                              \
        }                                                                             \
    } while (0)

/* Runs the statement(s) with VEC the run length `vec` (8, 4, 2 or 1,
 * io_vec_for) as a constant. */
#define IO_VEC_DISPATCH(vec, ...)                                                     \
    do {                                                                              \
        switch (vec) {                                                                \
        case 8: { const int VEC = 8; __VA_ARGS__; } break;                            \
        case 4: { const int VEC = 4; __VA_ARGS__; } break;                            \
        case 2: { const int VEC = 2; __VA_ARGS__; } break;                            \
        default: { const int VEC = 1; __VA_ARGS__; } break;                           \
        }                                                                             \
    } while (0)

/* Output k, or its gradient, as a gp_fptr; p NULL when the node does not
 * have it (optional outputs). */
static inline gp_fptr opt_out_f(const struct gp_cuda_ctx *c, int k)
{
    gp_fptr none = {NULL, false};
    return c->node->n_outputs > k ? gp_cuda_out_f(c, k) : none;
}

static inline gp_fptr opt_dout_f(const struct gp_cuda_ctx *c, int k)
{
    gp_fptr none = {NULL, false};
    return c->node->n_outputs > k && c->dout[k] ? gp_cuda_dout_f(c, k) : none;
}

#endif
