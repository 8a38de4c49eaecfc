/* The CPU backend's compute ops (backend/compute.h): the float kernels and
 * the training step's other work, run on the stage's worker thread. */
#include "backend/compute.h"

#include <string.h>

#include "backend/cpu/kernel.h"

static gp_status context_create(struct gp_device *dev, struct gp_stream *compute,
                                const struct gp_compute_options *opts, void *workspace, void **ctx,
                                struct gp_error *err)
{
    (void)dev, (void)compute, (void)opts, (void)workspace, (void)err;
    *ctx = NULL; /* nothing to hold */
    return GP_OK;
}

static void context_destroy(void *ctx) { (void)ctx; }

static bool has_kernel(const struct gp_node *node, bool *trainable)
{
    const struct gp_cpu_kernel *k = gp_cpu_kernel_for_f32(node);
    if (trainable) *trainable = k && k->backward;
    return k != NULL;
}

static const void *kernel_for(const struct gp_node *node) { return gp_cpu_kernel_for_f32(node); }

static bool overwrites(const struct gp_graph *g, const struct gp_node *node, int k)
{
    const struct gp_cpu_kernel *kern = gp_cpu_kernel_for_f32(node);
    return kern && kern->overwrites && kern->overwrites(g, node, k);
}

static bool remakes(const struct gp_graph *g, const struct gp_node *node)
{
    const struct gp_cpu_kernel *kern = gp_cpu_kernel_for_f32(node);
    return kern && kern->remakes && kern->remakes(g, node);
}

/* Only with GP_GRAD_ADDENDS=all, for tests: the backward adds the term in
 * place before the kernel runs (no pass saved), float32 terms only (a
 * bfloat16 writer's term rounded apart would round twice). */
static bool grad_addend(const struct gp_graph *g, const struct gp_node *producer, const struct gp_node *writer,
                        int slot, enum gp_dtype dt)
{
    (void)g, (void)producer, (void)writer, (void)slot;
    return dt == GP_DTYPE_FLOAT32 && gp_grad_addends() == GP_GRAD_ADDENDS_ALL;
}

static size_t saved_bytes(const struct gp_graph *g, const struct gp_node *node)
{
    const struct gp_cpu_kernel *k = gp_cpu_kernel_for_f32(node);
    return k && k->saved_bytes ? k->saved_bytes(g, node) : 0;
}

/* Every CPU kernel computes in float32 on float32 copies (mixed_call.h). */
/* Every CPU kernel computes in float32 on staged copies: the reference the
 * CUDA kernels that read bfloat16 themselves are compared with. */
static enum gp_bf16_calls kernel_bf16(const void *kernel, bool backward)
{
    (void)kernel;
    (void)backward;
    return GP_BF16_STAGED;
}

static size_t scratch_bytes(const struct gp_graph *g, const struct gp_node *node,
                            const struct gp_compute_options *opts, uint32_t din)
{
    (void)opts;
    (void)din;
    const struct gp_cpu_kernel *k = gp_cpu_kernel_for_f32(node);
    return k && k->scratch_bytes ? k->scratch_bytes(g, node) : 0;
}

static struct gp_cpu_ctx cpu_ctx(const struct gp_layer_call *c)
{
    return (struct gp_cpu_ctx){
        .graph = c->graph, .node = c->node, .in = c->in, .out = c->out, .din = c->din, .dout = c->dout,
        .din_overwrite = c->din_overwrite, .saved = c->saved, .scratch = c->scratch, .training = c->training,
        .update_state = c->update_state, .seed = c->seed, .step = c->step,
        .sample_offset = c->sample_offset, .dropout_ratio = c->dropout_ratio,
        .deferred_stats = c->deferred_stats, .remake = c->remake, .stored_out_dt = c->stored_out_dt,
    };
}

static gp_status forward(void *ctx, const struct gp_layer_call *c, struct gp_error *err)
{
    (void)ctx;
    struct gp_cpu_ctx cc = cpu_ctx(c);
    return ((const struct gp_cpu_kernel *)c->kernel)->forward(&cc, err);
}

static gp_status backward(void *ctx, const struct gp_layer_call *c, struct gp_error *err)
{
    (void)ctx;
    /* Output 0's gradient's second term (gp_layer_call.dout_addend: float32
     * here, grad_addend) added in place first, as its writer would have. */
    if (c->dout_addend && c->dout[0]) {
        const float *a = c->dout_addend;
        float *d = c->dout[0];
        int64_t n = gp_shape_numel(&c->graph->values[c->node->outputs[0]].shape);
        for (int64_t i = 0; i < n; i++) d[i] = d[i] + a[i];
    }
    struct gp_cpu_ctx cc = cpu_ctx(c);
    return ((const struct gp_cpu_kernel *)c->kernel)->backward(&cc, err);
}

static gp_status zero(void *ctx, void *ptr, size_t bytes, struct gp_error *err)
{
    (void)ctx, (void)err;
    memset(ptr, 0, bytes);
    return GP_OK;
}

static gp_status convert(void *ctx, void *dst, enum gp_dtype dst_type, const void *src, enum gp_dtype src_type,
                         int64_t n, bool accumulate, struct gp_error *err)
{
    (void)ctx;
    bool f32_in = src_type == GP_DTYPE_FLOAT32, f32_out = dst_type == GP_DTYPE_FLOAT32;
    if ((!f32_in && src_type != GP_DTYPE_BFLOAT16) || (!f32_out && dst_type != GP_DTYPE_BFLOAT16))
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "convert: %s to %s", gp_dtype_name(src_type),
                            gp_dtype_name(dst_type));
    const float *fs = src;
    const uint16_t *bs = src;
    float *fd = dst;
    uint16_t *bd = dst;
    /* Same arithmetic as the CUDA kernel: float32 sum, one rounding. */
    for (int64_t i = 0; i < n; i++) {
        float x = f32_in ? fs[i] : gp_bf16_to_float(bs[i]);
        if (accumulate) x = (f32_out ? fd[i] : gp_bf16_to_float(bd[i])) + x;
        if (f32_out)
            fd[i] = x;
        else
            bd[i] = gp_float_to_bf16(x);
    }
    return GP_OK;
}

/* One element at a time through convert: a layer's staging copy, not a
 * hot path on the CPU (it reads no layout itself: nothing is tagged unless
 * asked). */
static gp_status relayout(void *ctx, void *dst, enum gp_dtype dst_type, bool dst_nhwc, const void *src,
                          enum gp_dtype src_type, bool src_nhwc, const struct gp_shape *shape, bool accumulate,
                          struct gp_error *err)
{
    if (dst_nhwc == src_nhwc) return convert(ctx, dst, dst_type, src, src_type, gp_shape_numel(shape), accumulate, err);
    if (shape->rank != 4)
        return gp_error_set(err, GP_ERR_INVALID, "relayout: a tensor of rank %d is not [N, C, H, W]", shape->rank);
    size_t des = dst_type == GP_DTYPE_FLOAT32 ? 4 : 2, ses = src_type == GP_DTYPE_FLOAT32 ? 4 : 2;
    int64_t n = shape->dims[0], c = shape->dims[1], hw = shape->dims[2] * shape->dims[3];
    for (int64_t b = 0; b < n; b++)
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t p = 0; p < hw; p++) {
                int64_t nchw = (b * c + ch) * hw + p, nhwc = (b * hw + p) * c + ch;
                int64_t d = dst_nhwc ? nhwc : nchw, s = src_nhwc ? nhwc : nchw;
                GP_TRY(convert(ctx, (char *)dst + (size_t)d * des, dst_type, (const char *)src + (size_t)s * ses,
                               src_type, 1, accumulate, err));
            }
    return GP_OK;
}

static size_t loss_scratch_bytes(const struct gp_shape *out_shape)
{
    (void)out_shape;
    return 0;
}

static gp_status loss(void *ctx, const struct gp_loss_call *c, struct gp_error *err)
{
    (void)ctx;
    const struct gp_loss_spec *s = c->spec;
    if (c->dt != GP_DTYPE_UNDEFINED && c->dt != GP_DTYPE_FLOAT32)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "the CPU loss reads float32 only, not %s (staged: mixed_call.h)",
                            gp_dtype_name(c->dt));
    switch (s->kind) {
    case GP_LOSS_CROSS_ENTROPY:
        return gp_cross_entropy(c->out, c->out_shape, c->target, &s->target_shape, s->class_axis,
                                s->ignore_index, c->denominator, c->dout, c->loss_sum, NULL, err);
    case GP_LOSS_MSE:
        return gp_mse_loss(c->out, c->target, c->out_shape, &s->target_shape, c->denominator, c->dout,
                           c->loss_sum, err);
    case GP_LOSS_OUTPUT:
        return gp_output_loss(c->out, c->out_shape, c->denominator, c->dout, c->loss_sum, err);
    }
    return gp_error_set(err, GP_ERR_INVALID, "unknown loss kind %d", (int)s->kind);
}

static gp_status bn_commit(void *ctx, const struct gp_graph *g, const struct gp_node *node, float *rmean,
                           float *rvar, double *stats, const int32_t *skip, struct gp_error *err)
{
    (void)ctx, (void)err;
    if (skip && *skip) {
        memset(stats, 0, sizeof(double) * gp_cpu_bn_stats_len_f32(g, node));
        return GP_OK;
    }
    gp_cpu_bn_commit_f32(g, node, rmean, rvar, stats);
    return GP_OK;
}

static gp_status optim_step(void *ctx, struct gp_optim *opt, const struct gp_optim_scalars *scalars,
                            struct gp_error *err)
{
    (void)ctx, (void)err;
    gp_optim_apply(opt, scalars);
    return GP_OK;
}

static gp_status optim_guard(void *ctx, const float *norms, const int32_t *order, int n, const double *loss_parts,
                             int m, struct gp_optim_scalars *scalars, struct gp_error *err)
{
    (void)ctx, (void)err;
    gp_optim_guard(norms, order, n, loss_parts, m, scalars);
    return GP_OK;
}

static gp_status synchronize(void *ctx, struct gp_error *err)
{
    (void)ctx, (void)err; /* CPU kernels have finished when they return */
    return GP_OK;
}

static gp_status norms(void *ctx, const float *const *tensors, const int64_t *numels, int count, float *out,
                       struct gp_error *err)
{
    (void)ctx, (void)err;
    for (int k = 0; k < count; k++) out[k] = gp_norm2_f32(tensors[k], numels[k]);
    return GP_OK;
}

const struct gp_compute_ops gp_cpu_compute_ops = {
    .context_bytes = 0,
    .context_create = context_create,
    .context_destroy = context_destroy,
    .has_kernel = has_kernel,
    .kernel_for = kernel_for,
    .overwrites = overwrites,
    .grad_addend = grad_addend,
    .saved_bytes = saved_bytes,
    .remakes = remakes,
    .kernel_bf16 = kernel_bf16,
    .scratch_bytes = scratch_bytes,
    .forward = forward,
    .backward = backward,
    .zero = zero,
    .convert = convert,
    .relayout = relayout,
    .loss_scratch_bytes = loss_scratch_bytes,
    .loss = loss,
    .loss_bf16 = false,
    .bn_stats_len = gp_cpu_bn_stats_len_f32,
    .bn_commit = bn_commit,
    .optim_step = optim_step,
    .optim_guard = optim_guard,
    .synchronize = synchronize,
    .norms = norms,
};
