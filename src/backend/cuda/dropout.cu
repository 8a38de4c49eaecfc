/* CUDA kernels: Dropout, twin of backend/cpu/dropout.c. It draws the CPU's
 * mask: the counter-based Philox of backend/cpu/rng.h, compiled for the
 * device too, keyed by seed, step, the node's source_index and the
 * element's global index in the mini-batch. Backward draws it again.
 *
 * bfloat16 (bf16_any): X, Y, dY, dX and a float mask (opset 7) each float32
 * or bfloat16; loads widen, every stored value is rounded once, so results
 * equal those of float32 copies; a bool mask stays bool. */
#include <string.h>

#include <initializer_list>

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/storage.cuh"

#include "backend/cpu/rng.h"

/* ---- Dropout ---- */

/* What decides the mask, as the CPU's dropout_of: the run's ratio when set,
 * else the node's (attribute before opset 12, the constant input since -
 * the loader requires it constant - or 0.5 when absent); training_mode from
 * input 2 (12+) when given, else the run's. A constant training_mode is
 * read here, a computed one (device memory) by the kernel itself, so
 * nothing waits for the device. */
struct dropout {
    bool training;
    double ratio;
    bool mode;               /* when mode_dev is NULL */
    const uint8_t *mode_dev; /* bool scalar on the device, or NULL */
    uint64_t seed, step;
    const uint64_t *step_dev; /* the step in device memory (replayed CUDA graphs), or NULL */
    uint32_t node;
    int64_t first; /* global index of element 0 */
};

/* Input i's first element from its constant data (floats as the CPU's
 * buffer holds them: rounded to float32), or false when not constant. */
static bool const_scalar(const struct gp_cuda_ctx *c, int i, double *v)
{
    const struct gp_value *val = gp_cuda_in_value(c, i);
    if (!val || !val->constant || gp_shape_numel(&val->constant->shape) < 1) return false;
    double x = gp_tensor_get_f64(val->constant, 0);
    *v = gp_dtype_is_float(val->dtype) ? (double)(float)x : x;
    return true;
}

static gp_status dropout_of(const struct gp_cuda_ctx *c, struct gp_error *err, struct dropout *d)
{
    const struct gp_node *n = c->node;
    int version = n->def->since_version;
    memset(d, 0, sizeof *d);
    d->training = c->training;
    d->ratio = 0.5;
    d->mode = true;
    if (c->dropout_ratio >= 0) {
        d->ratio = c->dropout_ratio;
    } else if (version < 12) {
        d->ratio = gp_node_attr_float(n, "ratio", 0.5f);
    } else if (n->n_inputs > 1 && c->in[1] && !const_scalar(c, 1, &d->ratio)) {
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "the ratio (input 1) is not a constant");
    }
    if (version >= 12 && n->n_inputs >= 3 && c->in[2]) {
        double m;
        if (const_scalar(c, 2, &m)) d->mode = m != 0;
        else d->mode_dev = (const uint8_t *)c->in[2];
    }
    const struct gp_shape *xs = &gp_cuda_in_value(c, 0)->shape;
    int64_t per_sample = xs->rank > 0 && xs->dims[0] ? gp_shape_numel(xs) / xs->dims[0]
                                                      : gp_shape_numel(xs);
    d->seed = c->seed;
    d->step = c->step;
    d->step_dev = c->step_dev;
    d->node = (uint32_t)n->source_index;
    d->first = c->sample_offset * per_sample;
    return GP_OK;
}

/* The per-thread decision: active, the ratio as float (the comparison is
 * in float on both backends) and the scale 1 / (1 - ratio). */
__device__ static inline bool dropout_setup(const struct dropout &d, float *ratio, float *scale)
{
    bool mode = d.mode_dev ? *d.mode_dev != 0 : d.mode;
    *ratio = (float)d.ratio;
    *scale = (float)(1.0 / (1.0 - d.ratio));
    return d.training && mode && d.ratio > 0;
}

/* Each thread takes the elements of one Philox block at a time (gp_rng_uniform4:
 * global indices 4q .. 4q + 3, those of them in this call's range), so one
 * block's arithmetic serves four elements. */
#define DROPOUT_QUADS(d, n, q, i0)                                                    \
    for (int64_t q = ((d).first >> 2) + blockIdx.x * (int64_t)blockDim.x + threadIdx.x,  \
                 q_end_ = ((d).first + (n) + 3) >> 2, i0 = 4 * q - (d).first;     \
         q < q_end_; q += (int64_t)gridDim.x * blockDim.x, i0 = 4 * q - (d).first)

static unsigned dropout_blocks(const struct dropout &d, int64_t n)
{
    return gp_cuda_blocks_for(((d.first + n + 3) >> 2) - (d.first >> 2));
}

/* The mask: bool, or float (opset 7) stored as mask_b16 says. XP, YP: the
 * storage of X and Y. */
template <typename XP, typename YP>
__global__ static void dropout_forward_kernel(struct dropout d, XP X, YP Y, void *mask, bool mask_bool,
                                              bool mask_b16, int64_t n)
{
    float ratio, scale;
    bool active = dropout_setup(d, &ratio, &scale);
    const uint64_t step = d.step_dev ? *d.step_dev : d.step;
    DROPOUT_QUADS(d, n, q, i0) {
        float u[4] = {1.0f, 1.0f, 1.0f, 1.0f};
        if (active) gp_rng_uniform4(d.seed, step, d.node, (uint64_t)q, u);
#pragma unroll
        for (int l = 0; l < 4; l++) {
            int64_t i = i0 + l;
            if (i < 0 || i >= n) continue;
            bool keep = !active || u[l] >= ratio;
            float x = ld(X, i);
            st(Y, i, !active ? x : keep ? FMUL(x, scale) : 0.0f);
            if (mask && mask_bool) ((uint8_t *)mask)[i] = keep;
            else if (mask && mask_b16) ((bf16_t *)mask)[i] = __float2bfloat16_rn(keep ? 1.0f : 0.0f);
            else if (mask) ((float *)mask)[i] = keep ? 1.0f : 0.0f;
        }
    }
}

/* DP, GP: the storage of dY and dX. */
template <typename DP, typename GP>
__global__ static void dropout_backward_kernel(struct dropout d, DP dY, GP dX, int64_t n)
{
    float ratio, scale;
    bool active = dropout_setup(d, &ratio, &scale);
    const uint64_t step = d.step_dev ? *d.step_dev : d.step;
    DROPOUT_QUADS(d, n, q, i0) {
        float u[4] = {1.0f, 1.0f, 1.0f, 1.0f};
        if (active) gp_rng_uniform4(d.seed, step, d.node, (uint64_t)q, u);
#pragma unroll
        for (int l = 0; l < 4; l++) {
            int64_t i = i0 + l;
            if (i < 0 || i >= n) continue;
            float g = ld(dY, i);
            if (active) g = u[l] >= ratio ? FMUL(g, scale) : 0.0f;
            st(dX, i, FADD(ld(dX, i), g));
        }
    }
}

/* X [N, ..] -> Y, optional mask (float in opset 7, bool since 10). */
static gp_status dropout_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    GP_TRY(gp_cuda_want_f32(c, 0, err));
    struct dropout d;
    GP_TRY(dropout_of(c, err, &d));
    int64_t n = gp_shape_numel(&gp_cuda_in_value(c, 0)->shape);
    if (n == 0) return GP_OK;
    void *mask = c->node->n_outputs > 1 ? c->out[1] : NULL;
    bool mask_bool = true;
    if (mask) {
        enum gp_dtype mt = gp_cuda_out_value(c, 1)->dtype;
        if (mt != GP_DTYPE_BOOL && mt != GP_DTYPE_FLOAT32)
            return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "a mask of type %s", gp_dtype_name(mt));
        mask_bool = mt == GP_DTYPE_BOOL;
    }
    bool mask_b16 = mask && !mask_bool && gp_cuda_is_bf16(c->out_dt, 1);
    gp_fptr xf = gp_cuda_in_f(c, 0), yf = gp_cuda_out_f(c, 0);
    cudaStream_t stream = c->stream;
    with_storage(storage_of({xf, yf}), [&](auto tag) {
        dropout_forward_kernel<<<dropout_blocks(d, n), GP_CUDA_THREADS, 0, stream>>>(
            d, in_as(tag, xf), out_as(tag, yf), mask, mask_bool, mask_b16, n);
    });
    return gp_cuda_check_launch(c, "Dropout forward", err);
}

/* dX += dY * mask * scale, the mask drawn again from the same key. */
static gp_status dropout_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->dout[0] || !c->din[0]) return GP_OK;
    GP_TRY(gp_cuda_want_f32(c, 0, err));
    struct dropout d;
    GP_TRY(dropout_of(c, err, &d));
    int64_t n = gp_shape_numel(&gp_cuda_in_value(c, 0)->shape);
    if (n == 0) return GP_OK;
    gp_fptr dyf = gp_cuda_dout_f(c, 0), dxf = gp_cuda_din_f(c, 0);
    cudaStream_t stream = c->stream;
    with_storage(storage_of({dyf, dxf}), [&](auto tag) {
        dropout_backward_kernel<<<dropout_blocks(d, n), GP_CUDA_THREADS, 0, stream>>>(d, in_as(tag, dyf),
                                                                                     out_as(tag, dxf), n);
    });
    return gp_cuda_check_launch(c, "Dropout backward", err);
}

/* ---- the table ---- */

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_dropout[] = {
    {"Dropout", NULL, NULL, dropout_forward, dropout_backward, false, true},
    {NULL, NULL, NULL, NULL, NULL, false, false},
};
