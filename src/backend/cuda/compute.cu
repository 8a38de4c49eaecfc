/* The CUDA backend's compute ops (backend/compute.h): a stage's context is
 * its cuBLAS and cuDNN handles bound to its compute stream; every operation
 * launches onto the stream of the task that calls it and returns. */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "backend/cuda/convert.h"
#include "backend/cuda/device.h"
#include "backend/cuda/kernel.h"
#include "backend/cuda/train_kernels.h"

extern "C" {
#include "backend/compute.h"
#include "util/env.h"
}

struct stage_ctx {
    cudaStream_t stream;
    struct gp_cuda_libs libs;
    bool tf32, fast_conv;
};

static gp_status context_create(struct gp_device *dev, struct gp_stream *compute,
                                const struct gp_compute_options *opts, void *workspace, void **out,
                                struct gp_error *err)
{
    /* TF32 in tf32, and in bf16 for what bf16 still runs on float32 copies
     * (a mixed-type call staged by the executor): those copies hold
     * bfloat16 values (8 significant bits), which TF32's 10-bit inputs hold
     * exactly, so TF32 gives float32 accumulation of exact products, as a
     * bfloat16 GEMM does. */
    bool tf32 = opts->precision == GP_PRECISION_TF32 || opts->precision == GP_PRECISION_BF16;
    *out = NULL;
    cudaError_t e = cudaSetDevice(gp_cuda_device_index(dev));
    if (e != cudaSuccess)
        return gp_error_set(err, GP_ERR_DEVICE, "cuda:%d: cudaSetDevice: %s", gp_cuda_device_index(dev),
                            cudaGetErrorString(e));
    struct stage_ctx *c = (struct stage_ctx *)calloc(1, sizeof *c);
    if (!c) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    c->stream = gp_cuda_stream_of(compute);
    c->tf32 = tf32;
    c->fast_conv = opts->fast_conv;
    gp_status st = gp_cuda_libs_create(c->stream, tf32, workspace, &c->libs, err);
    if (st != GP_OK) {
        free(c);
        gp_error_prefix(err, "cuda:%d: ", gp_cuda_device_index(dev));
        return st;
    }
    *out = c;
    return GP_OK;
}

static void context_destroy(void *ctx)
{
    struct stage_ctx *c = (struct stage_ctx *)ctx;
    if (!c) return;
    gp_cuda_libs_destroy(&c->libs);
    free(c);
}

static bool has_kernel(const struct gp_node *node, bool *trainable)
{
    const struct gp_cuda_kernel *k = gp_cuda_kernel_for(node);
    if (trainable) *trainable = k && k->backward;
    return k != NULL;
}

static const void *kernel_for(const struct gp_node *node) { return gp_cuda_kernel_for(node); }

static size_t saved_bytes(const struct gp_graph *g, const struct gp_node *node)
{
    const struct gp_cuda_kernel *k = gp_cuda_kernel_for(node);
    return k && k->saved_bytes ? k->saved_bytes(g, node) : 0;
}

extern "C" bool gp_cuda_overwrites_input0(const struct gp_graph *g, const struct gp_node *node, int k)
{
    (void)g, (void)node;
    return k == 0;
}

/* First writers (backend/compute.h): the kernels that write a gradient
 * whole say so (the GPU suite runs them: tests/cuda/test_cuda_first_writers.c
 * and test_cuda_train both ways); GP_CUDA_FIRST_WRITERS=0 turns it off, to
 * measure what it saves. The environment is read once. */
static bool first_writers_on(void)
{
    static int on = -1; /* every thread computes the same value */
    if (on < 0) {
        on = gp_env_flag("GP_CUDA_FIRST_WRITERS", true);
    }
    return on != 0;
}

static bool overwrites(const struct gp_graph *g, const struct gp_node *node, int k)
{
    if (!first_writers_on()) return false;
    const struct gp_cuda_kernel *kern = gp_cuda_kernel_for(node);
    return kern && kern->overwrites && kern->overwrites(g, node, k);
}

static bool remakes(const struct gp_graph *g, const struct gp_node *node)
{
    const struct gp_cuda_kernel *kern = gp_cuda_kernel_for(node);
    return kern && kern->remakes && kern->remakes(g, node);
}

static bool staged_backward(const struct gp_cuda_kernel *k)
{
    return k->bf16_staged_backward && gp_cuda_conv_backward_staged();
}

static bool layout_native(const void *kernel, const struct gp_graph *g, const struct gp_node *node,
                          uint32_t in_nhwc, uint32_t out_nhwc, bool backward)
{
    const struct gp_cuda_kernel *k = (const struct gp_cuda_kernel *)kernel;
    return k && k->layout_native && k->layout_native(g, node, in_nhwc, out_nhwc, backward);
}

static enum gp_bf16_calls kernel_bf16(const void *kernel, bool backward)
{
    const struct gp_cuda_kernel *k = (const struct gp_cuda_kernel *)kernel;
    if (!k || (backward && staged_backward(k))) return GP_BF16_STAGED;
    return k->bf16_any ? GP_BF16_ANY : k->bf16 ? GP_BF16_UNIFORM : GP_BF16_STAGED;
}

/* A convolution's workspace is its algorithm's for exactly this precision
 * and policy; other kernels' do not depend on them. */
static size_t scratch_bytes(const struct gp_graph *g, const struct gp_node *node,
                            const struct gp_compute_options *opts, uint32_t din)
{
    return gp_cuda_conv_scratch_bytes(g, node, opts, din);
}

static struct gp_cuda_ctx cuda_ctx(const struct stage_ctx *s, const struct gp_layer_call *c)
{
    struct gp_cuda_ctx k;
    memset(&k, 0, sizeof k);
    k.graph = c->graph;
    k.node = c->node;
    k.in = c->in;
    k.out = c->out;
    k.din = c->din;
    k.din_overwrite = c->din_overwrite;
    k.in_nhwc = c->in_nhwc;
    k.held_grad_nhwc = c->held_grad_nhwc;
    k.out_nhwc = c->out_nhwc;
    k.dout = c->dout;
    k.dout_addend = c->dout_addend;
    k.in_dt = c->in_dt;
    k.out_dt = c->out_dt;
    k.din_dt = c->din_dt;
    k.dout_dt = c->dout_dt;
    k.saved = c->saved;
    k.scratch = c->scratch;
    k.stream = s->stream;
    k.cublas = s->libs.cublas;
    k.cublas_workspace = s->libs.cublas_workspace;
    k.cudnn = s->libs.cudnn;
    k.tf32 = s->tf32;
    k.fast_conv = s->fast_conv;
    k.training = c->training;
    k.update_state = c->update_state;
    k.seed = c->seed;
    k.step = c->step;
    k.step_dev = c->step_dev;
    k.sample_offset = c->sample_offset;
    k.dropout_ratio = c->dropout_ratio;
    k.deferred_stats = c->deferred_stats;
    k.remake = c->remake;
    k.stored_out_dt = c->stored_out_dt;
    return k;
}

static gp_status forward(void *ctx, const struct gp_layer_call *c, struct gp_error *err)
{
    struct gp_cuda_ctx k = cuda_ctx((const struct stage_ctx *)ctx, c);
    return ((const struct gp_cuda_kernel *)c->kernel)->forward(&k, err);
}

static bool is_batch_norm(const struct gp_node *node) { return strcmp(node->op_type, "BatchNormalization") == 0; }

static gp_status backward(void *ctx, const struct gp_layer_call *c, struct gp_error *err)
{
    struct gp_cuda_ctx k = cuda_ctx((const struct stage_ctx *)ctx, c);
    /* Output 0's gradient's second term (grad_addend): BatchNorm adds it
     * as it reads; any other kernel finds it added in place first. */
    if (k.dout_addend && !is_batch_norm(c->node)) {
        if (c->dout[0]) {
            enum gp_dtype dt = c->dout_dt ? c->dout_dt[0] : GP_DTYPE_FLOAT32;
            GP_TRY(gp_cuda_convert(((const struct stage_ctx *)ctx)->stream, c->dout[0], dt, k.dout_addend, dt,
                                   gp_shape_numel(&c->graph->values[c->node->outputs[0]].shape), true, err));
        }
        k.dout_addend = NULL;
    }
    return ((const struct gp_cuda_kernel *)c->kernel)->backward(&k, err);
}

/* A bfloat16 BatchNormalization's output read by a convolution first
 * (ResNet's block outputs: the next block's first convolution, then its
 * residual path): the convolution's data gradient, rounded to bfloat16
 * before it is added anyway, is added by the BatchNorm's backward as it
 * reads the gradient (batch_norm.cu), not by a pass over both: the bits
 * of the graph API's add in place (result rounded, then the sum), as
 * PyTorch's autograd adds two bfloat16 gradients. Where the legacy API's
 * own add (one rounding, another algorithm) was measured faster for the
 * added call, adding in place would have given other bits; the addend
 * gives these, whatever was measured (test_cuda_train's addend runs take
 * the graph API's adds to compare; the GPU suite, 2026-12-07). */
static bool grad_addend(const struct gp_graph *g, const struct gp_node *producer, const struct gp_node *writer,
                        int slot, enum gp_dtype dt)
{
    (void)g;
    return dt == GP_DTYPE_BFLOAT16 && is_batch_norm(producer) && strcmp(writer->op_type, "Conv") == 0 && slot == 0 &&
           gp_cuda_conv_rounds_added_terms();
}

static gp_status zero(void *ctx, void *ptr, size_t bytes, struct gp_error *err)
{
    const struct stage_ctx *s = (const struct stage_ctx *)ctx;
    cudaError_t e = cudaMemsetAsync(ptr, 0, bytes, s->stream);
    if (e != cudaSuccess)
        return gp_error_set(err, GP_ERR_DEVICE, "cudaMemsetAsync of %zu bytes: %s", bytes, cudaGetErrorString(e));
    return GP_OK;
}

static gp_status convert(void *ctx, void *dst, enum gp_dtype dst_type, const void *src, enum gp_dtype src_type,
                         int64_t n, bool accumulate, struct gp_error *err)
{
    return gp_cuda_convert(((const struct stage_ctx *)ctx)->stream, dst, dst_type, src, src_type, n, accumulate,
                           err);
}

static gp_status relayout(void *ctx, void *dst, enum gp_dtype dst_type, bool dst_nhwc, const void *src,
                          enum gp_dtype src_type, bool src_nhwc, const struct gp_shape *shape, bool accumulate,
                          struct gp_error *err)
{
    if (dst_nhwc != src_nhwc && shape->rank != 4)
        return gp_error_set(err, GP_ERR_INVALID, "relayout: a tensor of rank %d is not [N, C, H, W]", shape->rank);
    int64_t n = shape->rank == 4 ? shape->dims[0] : 1, c = shape->rank == 4 ? shape->dims[1] : 1;
    int64_t hw = shape->rank == 4 ? shape->dims[2] * shape->dims[3] : gp_shape_numel(shape);
    return gp_cuda_relayout(((const struct stage_ctx *)ctx)->stream, dst, dst_type, dst_nhwc, src, src_type, src_nhwc,
                            n, c, hw, accumulate, err);
}

/* The output and its gradient as they are stored (gp_loss_call.dt): the
 * kernels read and write bfloat16 themselves (loss_bf16 below). */
static gp_status loss(void *ctx, const struct gp_loss_call *c, struct gp_error *err)
{
    cudaStream_t st = ((const struct stage_ctx *)ctx)->stream;
    const struct gp_loss_spec *s = c->spec;
    int64_t n = gp_shape_numel(c->out_shape);
    enum gp_dtype dt = c->dt == GP_DTYPE_UNDEFINED ? GP_DTYPE_FLOAT32 : c->dt;
    switch (s->kind) {
    case GP_LOSS_CROSS_ENTROPY:
        return gp_cuda_cross_entropy(st, c->out, dt, c->out_shape, s->class_axis, (const int64_t *)c->target,
                                     s->ignore_index, c->denominator, c->dout, c->loss_sum, c->scratch, err);
    case GP_LOSS_MSE:
        return gp_cuda_mse_loss(st, c->out, dt, (const float *)c->target, n, c->denominator, c->dout, c->loss_sum,
                                c->scratch, err);
    case GP_LOSS_OUTPUT:
        return gp_cuda_output_loss(st, c->out, dt, n, c->denominator, c->dout, c->loss_sum, c->scratch, err);
    }
    return gp_error_set(err, GP_ERR_INVALID, "unknown loss kind %d", (int)s->kind);
}

static gp_status bn_commit(void *ctx, const struct gp_graph *g, const struct gp_node *node, float *rmean,
                           float *rvar, double *stats, const int32_t *skip, struct gp_error *err)
{
    return gp_cuda_bn_commit(((const struct stage_ctx *)ctx)->stream, g, node, rmean, rvar, stats, skip, err);
}

static gp_status optim_step(void *ctx, struct gp_optim *opt, const struct gp_optim_scalars *scalars,
                            struct gp_error *err)
{
    return gp_cuda_optim_step(((const struct stage_ctx *)ctx)->stream, opt, scalars, err);
}

static gp_status optim_guard(void *ctx, const float *norms, const int32_t *order, int n, const double *loss_parts,
                             int m, struct gp_optim_scalars *scalars, struct gp_error *err)
{
    return gp_cuda_optim_guard(((const struct stage_ctx *)ctx)->stream, norms, order, n, loss_parts, m, scalars,
                               err);
}

static gp_status synchronize(void *ctx, struct gp_error *err)
{
    cudaError_t e = cudaStreamSynchronize(((const struct stage_ctx *)ctx)->stream);
    if (e != cudaSuccess)
        return gp_error_set(err, GP_ERR_DEVICE, "cudaStreamSynchronize: %s", cudaGetErrorString(e));
    return GP_OK;
}

static gp_status norms(void *ctx, const float *const *tensors, const int64_t *numels, int count, float *out,
                       struct gp_error *err)
{
    return gp_cuda_norms(((const struct stage_ctx *)ctx)->stream, tensors, numels, count, out, err);
}

/* The stage's filter copies and their gradients in launches of up to 32
 * (convert.cu). */
static gp_status relayout_many(void *ctx, int n, void *const *dst, enum gp_dtype dst_type, bool to_nhwc,
                               const float *const *src, const struct gp_shape *const *shapes, bool accumulate,
                               struct gp_error *err)
{
    enum { CHUNK = 64 };
    int64_t batch[CHUNK], channels[CHUNK], cells[CHUNK];
    for (int t0 = 0; t0 < n; t0 += CHUNK) {
        int m = n - t0 < CHUNK ? n - t0 : CHUNK;
        for (int t = 0; t < m; t++) {
            const struct gp_shape *s = shapes[t0 + t];
            if (s->rank != 4)
                return gp_error_set(err, GP_ERR_INVALID, "relayout_many: a tensor of rank %d is not [N, C, H, W]",
                                    s->rank);
            batch[t] = s->dims[0], channels[t] = s->dims[1], cells[t] = s->dims[2] * s->dims[3];
        }
        GP_TRY(gp_cuda_relayout_many(((const struct stage_ctx *)ctx)->stream, m, dst + t0, dst_type, to_nhwc, src + t0,
                                     batch, channels, cells, accumulate, err));
    }
    return GP_OK;
}

extern "C" const struct gp_compute_ops gp_cuda_compute_ops = {
    GP_CUDA_LIBS_WORKSPACE_BYTES,
    context_create,
    context_destroy,
    has_kernel,
    kernel_for,
    kernel_bf16,
    overwrites,
    layout_native,
    saved_bytes,
    remakes,
    scratch_bytes,
    forward,
    backward,
    zero,
    convert,
    relayout,
    gp_cuda_loss_scratch_bytes,
    loss,
    true, /* loss_bf16 */
    gp_cuda_bn_stats_len,
    bn_commit,
    optim_step,
    optim_guard,
    synchronize,
    norms,
    relayout_many,
    grad_addend,
};
