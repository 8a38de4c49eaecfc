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
 * an activation (X, Y, dY, dX); par loads a parameter. */
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
};

struct io_mixed {
    __device__ static float act(gp_fptr t, int64_t i) { return gp_ld(t, i); }
    __device__ static void set_act(gp_fptr t, int64_t i, float v) { gp_st(t, i, v); }
    __device__ static void add_act(gp_fptr t, int64_t i, float v) { gp_acc(t, i, v); }
    __device__ static float par(gp_fptr t, int64_t i) { return gp_ld(t, i); }
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
