/* CUDA kernels: Dropout, twin of backend/cpu/dropout.c. It draws the CPU's
 * mask: the counter-based Philox of backend/cpu/rng.h, compiled for the
 * device too, keyed by seed, step, the node's source_index and the
 * element's global index in the mini-batch. Backward draws it again.
 *
 * bfloat16 (bf16_any): X, Y, dY, dX and a float mask (opset 7) each float32
 * or bfloat16; loads widen, every stored value is rounded once, so results
 * equal those of float32 copies; a bool mask stays bool.
 *
 * Channels-last (gp_cuda_kernel.layout_native): X, Y, dY and dX [N, H, W,
 * C] for the graph's [N, C, H, W]; each element keeps the draw of its
 * [N, C, H, W] position, and the mask is stored [N, C, H, W], so the
 * results are the NCHW kernels' (and the CPU's) in either layout. */
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

/* DP, GP: the storage of dY and dX; ow: dX written whole (0 + the
 * gradient), not read. */
template <typename DP, typename GP>
__global__ static void dropout_backward_kernel(struct dropout d, DP dY, GP dX, int64_t n, bool ow)
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
            st(dX, i, FADD(ow ? 0.0f : ld(dX, i), g));
        }
    }
}

/* ---- channels-last ---- */

/* [N, C, H, W] as [N, H, W, C] storage: a thread takes VEC consecutive
 * channels (one run) of 4 consecutive cells of a row, w .. w + 3, whose
 * [N, C, H, W] positions are 4 consecutive indices per channel: one
 * Philox block each (gp_rng_uniform4) when the key's global index of w is
 * a multiple of 4 (W and the mini-batch offset of the first element
 * multiples of 4: dropout_nhwc_quads). Threads of a warp take consecutive
 * runs of the same cells, so loads and stores are whole rows of C. Any
 * other shape draws a block per element (dropout_nhwc_any_kernel). */
struct dropout_nhwc {
    int64_t n, c, h, w;
    int vec;    /* channels per run */
    int64_t cr; /* runs per row */
};

static bool dropout_nhwc_quads(const struct dropout &d, const struct dropout_nhwc &g)
{
    return g.w % 4 == 0 && d.first % 4 == 0;
}

/* VEC values at i .. i + VEC - 1 of a typed tensor (a run: aligned, in one
 * row), or of a mix one at a time. */
template <int VEC> __device__ static inline void run_ld(const float *p, int64_t i, float (&v)[VEC])
{
    gp_run<float, VEC>::load(p, i, v);
}
template <int VEC> __device__ static inline void run_ld(const bf16_t *p, int64_t i, float (&v)[VEC])
{
    gp_run<bf16_t, VEC>::load(p, i, v);
}
template <int VEC> __device__ static inline void run_ld(gp_fptr p, int64_t i, float (&v)[VEC])
{
#pragma unroll
    for (int k = 0; k < VEC; k++) v[k] = gp_ld(p, i + k);
}
template <int VEC> __device__ static inline void run_st(float *p, int64_t i, const float (&v)[VEC])
{
    gp_run<float, VEC>::store(p, i, v);
}
template <int VEC> __device__ static inline void run_st(bf16_t *p, int64_t i, const float (&v)[VEC])
{
    gp_run<bf16_t, VEC>::store(p, i, v);
}
template <int VEC> __device__ static inline void run_st(gp_fptr p, int64_t i, const float (&v)[VEC])
{
#pragma unroll
    for (int k = 0; k < VEC; k++) gp_st(p, i + k, v[k]);
}

/* The mask's element i (bool, bfloat16 or float, as the NCHW kernel). */
__device__ static inline void mask_set(void *mask, bool mask_bool, bool mask_b16, int64_t i, bool keep)
{
    if (mask_bool) ((uint8_t *)mask)[i] = keep;
    else if (mask_b16) ((bf16_t *)mask)[i] = __float2bfloat16_rn(keep ? 1.0f : 0.0f);
    else ((float *)mask)[i] = keep ? 1.0f : 0.0f;
}

/* Forward (BACKWARD false: Y from X, the mask when asked) or backward
 * (dX = (ow ? 0 : dX) + dY masked and scaled; A is dY, B is dX), over
 * cells w .. w + 3 of a row by a run of channels, a thread each. */
template <int VEC, bool BACKWARD, typename AP, typename BP>
__global__ static void dropout_nhwc_quads_kernel(struct dropout d, struct dropout_nhwc g, AP A, BP B, void *mask,
                                                 bool mask_bool, bool mask_b16, bool ow)
{
    float ratio, scale;
    bool active = dropout_setup(d, &ratio, &scale);
    const uint64_t step = d.step_dev ? *d.step_dev : d.step;
    const int64_t wq = g.w / 4, total = g.n * g.h * wq * g.cr;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.x * blockDim.x) {
        int64_t rest = gp_dev_fdiv(t, g.cr);
        const int64_t r = t - rest * g.cr;
        int64_t rest2 = gp_dev_fdiv(rest, wq);
        const int64_t w0 = (rest - rest2 * wq) * 4;
        const int64_t n = gp_dev_fdiv(rest2, g.h), h = rest2 - n * g.h;
        const int64_t row0 = (n * g.h + h) * g.w + w0; /* storage row of cell w0 */
        float u[VEC][4];
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            /* [N, C, H, W] index of (n, c, h, w0) */
            int64_t i0 = ((n * g.c + r * VEC + j) * g.h + h) * g.w + w0;
            u[j][0] = u[j][1] = u[j][2] = u[j][3] = 1.0f;
            if (active) gp_rng_uniform4(d.seed, step, d.node, (uint64_t)((d.first + i0) >> 2), u[j]);
        }
        float a[4][VEC], b[4][VEC];
#pragma unroll
        for (int l = 0; l < 4; l++) {
            run_ld<VEC>(A, (row0 + l) * g.c + r * VEC, a[l]);
            if (BACKWARD && !ow) run_ld<VEC>(B, (row0 + l) * g.c + r * VEC, b[l]);
        }
#pragma unroll
        for (int l = 0; l < 4; l++) {
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                bool keep = !active || u[j][l] >= ratio;
                float v = !active ? a[l][j] : keep ? FMUL(a[l][j], scale) : 0.0f;
                b[l][j] = BACKWARD ? FADD(ow ? 0.0f : b[l][j], v) : v;
                if (!BACKWARD && mask)
                    mask_set(mask, mask_bool, mask_b16, ((n * g.c + r * VEC + j) * g.h + h) * g.w + w0 + l, keep);
            }
            run_st<VEC>(B, (row0 + l) * g.c + r * VEC, b[l]);
        }
    }
}

/* Any shape: a thread per element in storage order, a Philox block each
 * (the one holding its [N, C, H, W] index). */
template <bool BACKWARD, typename AP, typename BP>
__global__ static void dropout_nhwc_any_kernel(struct dropout d, struct dropout_nhwc g, AP A, BP B, void *mask,
                                               bool mask_bool, bool mask_b16, bool ow)
{
    float ratio, scale;
    bool active = dropout_setup(d, &ratio, &scale);
    const uint64_t step = d.step_dev ? *d.step_dev : d.step;
    const int64_t total = g.n * g.h * g.w * g.c;
    for (int64_t s = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; s < total;
         s += (int64_t)gridDim.x * blockDim.x) {
        int64_t cell = gp_dev_fdiv(s, g.c);
        const int64_t c = s - cell * g.c;
        int64_t nh = gp_dev_fdiv(cell, g.w);
        const int64_t w = cell - nh * g.w, n = gp_dev_fdiv(nh, g.h), h = nh - n * g.h;
        const int64_t i = ((n * g.c + c) * g.h + h) * g.w + w;
        float u[4] = {1.0f, 1.0f, 1.0f, 1.0f};
        if (active) gp_rng_uniform4(d.seed, step, d.node, (uint64_t)((d.first + i) >> 2), u);
        bool keep = !active || u[(d.first + i) & 3] >= ratio;
        float a = ld(A, s), v = !active ? a : keep ? FMUL(a, scale) : 0.0f;
        if (BACKWARD) {
            st(B, s, FADD(ow ? 0.0f : ld(B, s), v));
        } else {
            st(B, s, v);
            if (mask) mask_set(mask, mask_bool, mask_b16, i, keep);
        }
    }
}

/* Launches the channels-last pass over A -> B (see the kernels). */
template <bool BACKWARD>
static void dropout_nhwc_launch(const struct gp_cuda_ctx *c, const struct dropout &d, gp_fptr a, gp_fptr b,
                                void *mask, bool mask_bool, bool mask_b16, bool ow)
{
    const struct gp_shape *xs = &gp_cuda_in_value(c, 0)->shape;
    struct dropout_nhwc g = {xs->dims[0], xs->dims[1], xs->dims[2], xs->dims[3], 1, xs->dims[1]};
    enum storage st = storage_of({a, b});
    if (st != ST_MIX) {
        size_t elem = st == ST_BF16 ? sizeof(bf16_t) : sizeof(float);
        for (int vec = 4; vec > 1 && g.vec == 1; vec /= 2)
            if (gp_runs_fit(g.c, vec, elem, {a.p, b.p})) g.vec = vec;
    }
    g.cr = g.c / g.vec;
    cudaStream_t stream = c->stream;
    bool quads = dropout_nhwc_quads(d, g);
    int64_t threads = quads ? g.n * g.h * (g.w / 4) * g.cr : g.n * g.h * g.w * g.c;
    unsigned blocks = gp_cuda_blocks_for(threads);
    with_storage(st, [&](auto tag) {
        auto A = in_as(tag, a);
        auto B = out_as(tag, b);
        if (!quads) {
            dropout_nhwc_any_kernel<BACKWARD><<<blocks, GP_CUDA_THREADS, 0, stream>>>(d, g, A, B, mask, mask_bool,
                                                                                       mask_b16, ow);
            return;
        }
        switch (g.vec) {
        case 4:
            dropout_nhwc_quads_kernel<4, BACKWARD><<<blocks, GP_CUDA_THREADS, 0, stream>>>(d, g, A, B, mask,
                                                                                          mask_bool, mask_b16, ow);
            break;
        case 2:
            dropout_nhwc_quads_kernel<2, BACKWARD><<<blocks, GP_CUDA_THREADS, 0, stream>>>(d, g, A, B, mask,
                                                                                          mask_bool, mask_b16, ow);
            break;
        default:
            dropout_nhwc_quads_kernel<1, BACKWARD><<<blocks, GP_CUDA_THREADS, 0, stream>>>(d, g, A, B, mask,
                                                                                          mask_bool, mask_b16, ow);
        }
    });
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
    if (gp_cuda_nhwc(c->in_nhwc, 0)) {
        dropout_nhwc_launch<false>(c, d, xf, yf, mask, mask_bool, mask_b16, false);
        return gp_cuda_check_launch(c, "Dropout forward (channels-last)", err);
    }
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
    if (!c->din[0]) return GP_OK;
    GP_TRY(gp_cuda_want_f32(c, 0, err));
    int64_t n = gp_shape_numel(&gp_cuda_in_value(c, 0)->shape);
    bool ow = gp_cuda_overwrite(c, 0);
    gp_fptr dxf = gp_cuda_din_f(c, 0);
    if (!c->dout[0] || n == 0) /* nothing to add; written whole: zeros */
        return ow && n ? gp_cuda_call(c, cudaMemsetAsync(dxf.p, 0, (size_t)n * gp_cuda_float_size(dxf.bf16), c->stream),
                                      "cudaMemsetAsync", err)
                       : GP_OK;
    struct dropout d;
    GP_TRY(dropout_of(c, err, &d));
    gp_fptr dyf = gp_cuda_dout_f(c, 0);
    if (gp_cuda_nhwc(c->in_nhwc, 0)) {
        dropout_nhwc_launch<true>(c, d, dyf, dxf, NULL, false, false, ow);
        return gp_cuda_check_launch(c, "Dropout backward (channels-last)", err);
    }
    cudaStream_t stream = c->stream;
    with_storage(storage_of({dyf, dxf}), [&](auto tag) {
        dropout_backward_kernel<<<dropout_blocks(d, n), GP_CUDA_THREADS, 0, stream>>>(d, in_as(tag, dyf),
                                                                                     out_as(tag, dxf), n, ow);
    });
    return gp_cuda_check_launch(c, "Dropout backward", err);
}

/* X and Y channels-last, rank 4 (the layout pass tags both or neither;
 * the mask is never tagged). */
static bool dropout_layout_native(const struct gp_graph *g, const struct gp_node *node, uint32_t in_nhwc,
                                  uint32_t out_nhwc, bool backward)
{
    (void)backward;
    return in_nhwc == 1u && out_nhwc == 1u && gp_node_input(g, node, 0)->shape.rank == 4;
}

/* ---- the table ---- */

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_dropout[] = {
    {"Dropout", NULL, NULL, dropout_forward, dropout_backward, false, true, false, gp_cuda_overwrites_input0,
     dropout_layout_native},
    {NULL, NULL, NULL, NULL, NULL, false, false},
};
