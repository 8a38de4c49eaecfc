/* Layer calls with bfloat16 storage for float32 kernels, and channels-last
 * storage for kernels that read [N, C, H, W] (mixed_call.h). */
#include "backend/mixed_call.h"

#include <string.h>

#include "graph/layout.h"
#include "ops/backward_reads.h"

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static bool is_bf16(const enum gp_dtype *dt, int k) { return dt && dt[k] == GP_DTYPE_BFLOAT16; }

static int64_t numel_of(const struct gp_graph *g, int v) { return gp_shape_numel(&g->values[v].shape); }

/* What a backward reads of the node's inputs and outputs, given the input
 * gradients it writes. */
static void backward_reads(const struct gp_node *node, uint32_t din_wanted, uint32_t *reads_in,
                           uint32_t *reads_out)
{
    *reads_in = *reads_out = 0;
    gp_backward_reads(node, din_wanted, reads_in, reads_out);
}

static bool bit(uint32_t mask, int k) { return k >= 32 || ((mask >> k) & 1); }

/* No float tensor stored as float32 among the inputs, outputs and incoming
 * gradients (input gradients may be float32: a parameter's). */
static bool all_bf16(const struct gp_node *n, const enum gp_dtype *in_dt, const enum gp_dtype *out_dt,
                     const enum gp_dtype *dout_dt, bool backward)
{
    for (int k = 0; k < n->n_inputs; k++)
        if (n->inputs[k] >= 0 && in_dt && in_dt[k] == GP_DTYPE_FLOAT32) return false;
    for (int k = 0; k < n->n_outputs; k++) {
        if (n->outputs[k] < 0) continue;
        if (out_dt && out_dt[k] == GP_DTYPE_FLOAT32) return false;
        if (backward && dout_dt && dout_dt[k] == GP_DTYPE_FLOAT32) return false;
    }
    return true;
}

/* A value the node reads twice: its two input gradients are one tensor,
 * which a float32 copy accumulates into once and rounds once; a kernel
 * accumulating into bfloat16 directly would round after each term. */
static bool reads_twice(const struct gp_node *n)
{
    for (int k = 0; k < n->n_inputs; k++)
        for (int q = 0; q < k; q++)
            if (n->inputs[k] >= 0 && n->inputs[q] == n->inputs[k]) return true;
    return false;
}

/* Whether the kernel is called as it is. GP_BF16_ANY: always (each tensor
 * read as its type says), except for a node that reads a value twice in
 * backward; GP_BF16_UNIFORM: when its tensors are bfloat16 throughout (the
 * matrix products and convolutions of a bf16 stage), while a mix (a
 * once-per-step product whose gradient is float32) goes through float32
 * copies like any other kernel. */
static bool native_bf16(const struct gp_compute_ops *ops, const void *kernel, const struct gp_node *n,
                        const enum gp_dtype *in_dt, const enum gp_dtype *out_dt, const enum gp_dtype *dout_dt,
                        bool backward)
{
    if (!in_dt && !out_dt && !dout_dt) return true; /* float32 throughout */
    enum gp_bf16_calls calls = ops->kernel_bf16 && kernel ? ops->kernel_bf16(kernel, backward) : GP_BF16_STAGED;
    if (calls == GP_BF16_ANY) return !(backward && reads_twice(n));
    return calls == GP_BF16_UNIFORM && all_bf16(n, in_dt, out_dt, dout_dt, backward);
}

/* A call's channels-last tensors (graph/layout.h): bit k of in / out. */
struct layouts {
    uint32_t in, out;
};

static struct layouts layouts_of(const struct gp_graph *g, const struct gp_node *n)
{
    return (struct layouts){gp_layout_in_mask(g, n), gp_layout_out_mask(g, n)};
}

/* Whether the kernel runs the call's layouts as they lie: none is
 * channels-last, the op is neutral to them, or the kernel says it reads
 * them. */
static bool native_layout(const struct gp_compute_ops *ops, const void *kernel, const struct gp_graph *g,
                          const struct gp_node *n, struct layouts l, bool backward)
{
    if (gp_layout_neutral_call(g, n, l.in, l.out)) return true;
    return ops->layout_native && kernel && ops->layout_native(kernel, g, n, l.in, l.out, backward);
}

/* Whether the call, with layouts l, runs as it is; otherwise every tensor
 * of it that is bfloat16 or channels-last goes through a float32
 * [N, C, H, W] copy. */
static bool native(const struct gp_compute_ops *ops, const void *kernel, const struct gp_graph *g,
                   const struct gp_node *n, struct layouts l, const enum gp_dtype *in_dt,
                   const enum gp_dtype *out_dt, const enum gp_dtype *dout_dt, bool backward)
{
    return native_bf16(ops, kernel, n, in_dt, out_dt, dout_dt, backward) &&
           native_layout(ops, kernel, g, n, l, backward);
}

size_t gp_mixed_staging_bytes(const struct gp_compute_ops *ops, const void *kernel, const struct gp_graph *g,
                              const struct gp_node *node, const enum gp_dtype *in_dt,
                              const enum gp_dtype *out_dt, const enum gp_dtype *din_dt,
                              const enum gp_dtype *dout_dt, bool backward, uint32_t din_wanted)
{
    struct layouts l = layouts_of(g, node);
    if (native(ops, kernel, g, node, l, in_dt, out_dt, dout_dt, backward)) return 0;
    uint32_t reads_in = ~0u, reads_out = ~0u;
    if (backward) backward_reads(node, din_wanted, &reads_in, &reads_out);
    size_t bytes = 0;
    /* One copy per distinct value (a node may read a value twice). */
    for (int k = 0; k < node->n_inputs; k++) {
        int v = node->inputs[k];
        if (v < 0) continue;
        bool seen = false;
        for (int q = 0; q < k; q++) seen |= node->inputs[q] == v;
        if (seen) continue;
        size_t one = align64((size_t)numel_of(g, v) * sizeof(float));
        bool nhwc = bit(l.in, k) && k < 32;
        if ((is_bf16(in_dt, k) || nhwc) && bit(reads_in, k)) bytes += one;
        if (backward && bit(din_wanted, k) && (is_bf16(din_dt, k) || nhwc)) bytes += one;
    }
    for (int k = 0; k < node->n_outputs; k++) {
        int v = node->outputs[k];
        if (v < 0) continue;
        size_t one = align64((size_t)numel_of(g, v) * sizeof(float));
        bool nhwc = bit(l.out, k) && k < 32;
        if ((is_bf16(out_dt, k) || nhwc) && bit(reads_out, k)) bytes += one;
        if (backward && (is_bf16(dout_dt, k) || nhwc)) bytes += one;
    }
    return bytes;
}

/* The staging area handed out in order; a pointer staged twice (a value a
 * node reads twice) gets one copy. */
#define MAX_STAGED 64
struct stager {
    unsigned char *next;
    int n;
    const void *orig[MAX_STAGED];
    float *copy[MAX_STAGED];
};

static float *find_staged(const struct stager *s, const void *orig)
{
    for (int i = 0; i < s->n; i++)
        if (s->orig[i] == orig) return s->copy[i];
    return NULL;
}

static enum gp_dtype dt_at(const enum gp_dtype *dt, int k) { return dt ? dt[k] : GP_DTYPE_FLOAT32; }

/* orig stored as (dt, nhwc) -> or <- its float32 [N, C, H, W] copy. */
static gp_status copy_in(const struct gp_compute_ops *ops, void *ctx, float *copy, const void *orig,
                         enum gp_dtype dt, bool nhwc, const struct gp_value *val, struct gp_error *err)
{
    if (nhwc) return ops->relayout(ctx, copy, GP_DTYPE_FLOAT32, false, orig, dt, true, &val->shape, false, err);
    return ops->convert(ctx, copy, GP_DTYPE_FLOAT32, orig, dt, gp_shape_numel(&val->shape), false, err);
}

static gp_status copy_out(const struct gp_compute_ops *ops, void *ctx, void *orig, enum gp_dtype dt, bool nhwc,
                          const float *copy, const struct gp_value *val, struct gp_error *err)
{
    if (nhwc) return ops->relayout(ctx, orig, dt, true, copy, GP_DTYPE_FLOAT32, false, &val->shape, false, err);
    return ops->convert(ctx, orig, dt, copy, GP_DTYPE_FLOAT32, gp_shape_numel(&val->shape), false, err);
}

/* A float32 [N, C, H, W] copy of the tensor at orig, value val stored as
 * (dt, nhwc): loaded (widened, transposed) when `load`. */
static gp_status stage_one(const struct gp_compute_ops *ops, void *ctx, struct stager *s, const void *orig,
                           const struct gp_value *val, enum gp_dtype dt, bool nhwc, bool load, float **out,
                           struct gp_error *err)
{
    float *have = find_staged(s, orig);
    if (have) {
        *out = have;
        return GP_OK;
    }
    if (s->n == MAX_STAGED) return gp_error_set(err, GP_ERR_UNSUPPORTED, "more than %d staged tensors", MAX_STAGED);
    float *copy = (float *)s->next;
    s->next += align64((size_t)gp_shape_numel(&val->shape) * sizeof(float));
    s->orig[s->n] = orig;
    s->copy[s->n++] = copy;
    if (load) GP_TRY(copy_in(ops, ctx, copy, orig, dt, nhwc, val, err));
    *out = copy;
    return GP_OK;
}

/* Whether tensor k (stored as dt, channels-last per mask) needs a copy. */
static bool staged(const enum gp_dtype *dt, uint32_t nhwc_mask, int k)
{
    return is_bf16(dt, k) || (k < 32 && ((nhwc_mask >> k) & 1));
}

/* Writes the float32 copies back into their homes (rounded, transposed). */
static gp_status store_back(const struct gp_compute_ops *ops, void *ctx, const struct gp_graph *g,
                            const int *values, int count, void *const *orig, float *const *copies,
                            const enum gp_dtype *dt, uint32_t nhwc_mask, struct gp_error *err)
{
    for (int k = 0; k < count; k++) {
        if (!orig[k] || !staged(dt, nhwc_mask, k) || copies[k] == orig[k]) continue;
        bool done = false; /* a tensor given twice is written back once */
        for (int q = 0; q < k; q++) done |= orig[q] == orig[k];
        if (done) continue;
        bool nhwc = k < 32 && ((nhwc_mask >> k) & 1);
        GP_TRY(copy_out(ops, ctx, orig[k], dt_at(dt, k), nhwc, copies[k], &g->values[values[k]], err));
    }
    return GP_OK;
}

#define MAX_ARGS 64

static gp_status too_wide(const struct gp_node *n, struct gp_error *err)
{
    return gp_error_set(err, GP_ERR_UNSUPPORTED, "node '%s' (%s): more than %d inputs or outputs in bf16",
                        n->name, n->op_type, MAX_ARGS);
}

/* The call's layouts: the graph's, and the executor's channels-last
 * copies (gp_layer_call.held_nhwc). */
static struct layouts call_layouts(const struct gp_layer_call *c)
{
    struct layouts l = layouts_of(c->graph, c->node);
    l.in |= c->held_nhwc;
    return l;
}

static bool direct(const struct gp_compute_ops *ops, const struct gp_layer_call *c, bool backward)
{
    return native(ops, c->kernel, c->graph, c->node, call_layouts(c), c->in_dt, c->out_dt, c->dout_dt, backward);
}

/* The call as it is, with its layouts. */
static struct gp_layer_call as_it_lies(const struct gp_layer_call *c)
{
    struct gp_layer_call d = *c;
    struct layouts l = call_layouts(c);
    d.in_nhwc = l.in;
    d.out_nhwc = l.out;
    return d;
}

/* The planner gives channels-last copies only to calls that read them as
 * they lie (pipeline/plan.c): staging one would transpose its gradient
 * too, which lies otherwise. */
static gp_status held_not_read(const struct gp_layer_call *c, struct gp_error *err)
{
    return gp_error_set(err, GP_ERR_INVALID,
                        "node '%s' (%s): given a channels-last copy of an input that its kernel does not read so",
                        c->node->name, c->node->op_type);
}

gp_status gp_mixed_forward(const struct gp_compute_ops *ops, void *ctx, const struct gp_layer_call *c,
                           void *staging, struct gp_error *err)
{
    if (direct(ops, c, false)) {
        struct gp_layer_call d = as_it_lies(c);
        d.stored_out_dt = c->out_dt;
        return ops->forward(ctx, &d, err);
    }
    if (c->held_nhwc) return held_not_read(c, err);
    const struct gp_node *n = c->node;
    const struct gp_graph *g = c->graph;
    if (n->n_inputs > MAX_ARGS || n->n_outputs > MAX_ARGS) return too_wide(n, err);
    struct layouts l = layouts_of(g, n);
    struct stager s = {.next = staging};
    void *in[MAX_ARGS + 1] = {0}, *out[MAX_ARGS + 1] = {0};
    for (int k = 0; k < n->n_inputs; k++) {
        in[k] = c->in[k];
        if (c->in[k] && staged(c->in_dt, l.in, k))
            GP_TRY(stage_one(ops, ctx, &s, c->in[k], &g->values[n->inputs[k]], dt_at(c->in_dt, k),
                             bit(l.in, k) && k < 32, true, (float **)&in[k], err));
    }
    for (int k = 0; k < n->n_outputs; k++) {
        out[k] = c->out[k];
        if (c->out[k] && staged(c->out_dt, l.out, k))
            GP_TRY(stage_one(ops, ctx, &s, c->out[k], &g->values[n->outputs[k]], dt_at(c->out_dt, k),
                             bit(l.out, k) && k < 32, false, (float **)&out[k], err));
    }
    struct gp_layer_call f = *c;
    f.in = in;
    f.out = out;
    f.stored_out_dt = c->out_dt;
    f.in_dt = f.out_dt = f.din_dt = f.dout_dt = NULL;
    f.in_nhwc = f.out_nhwc = 0;
    GP_TRY(ops->forward(ctx, &f, err));
    return store_back(ops, ctx, g, n->outputs, n->n_outputs, c->out, (float *const *)out, c->out_dt, l.out, err);
}

gp_status gp_mixed_backward(const struct gp_compute_ops *ops, void *ctx, const struct gp_layer_call *c,
                            void *staging, struct gp_error *err)
{
    if (direct(ops, c, true)) {
        struct gp_layer_call d = as_it_lies(c);
        d.stored_out_dt = c->out_dt;
        return ops->backward(ctx, &d, err);
    }
    if (c->held_nhwc || c->held_grad_nhwc) return held_not_read(c, err);
    const struct gp_node *n = c->node;
    if (n->n_inputs > MAX_ARGS || n->n_outputs > MAX_ARGS) return too_wide(n, err);
    /* Output 0's gradient's second term (gp_layer_call.dout_addend) added
     * in place before dout[0] is staged: the add the kernel would have
     * made, the same bits. */
    if (c->dout_addend && c->dout[0])
        GP_TRY(ops->convert(ctx, c->dout[0], dt_at(c->dout_dt, 0), c->dout_addend, dt_at(c->dout_dt, 0),
                            numel_of(c->graph, n->outputs[0]), true, err));
    uint32_t din_wanted = 0;
    for (int k = 0; k < n->n_inputs && k < 32; k++)
        if (c->din[k]) din_wanted |= 1u << k;
    uint32_t reads_in, reads_out;
    backward_reads(n, din_wanted, &reads_in, &reads_out);
    struct stager s = {.next = staging};
    void *in[MAX_ARGS + 1] = {0}, *out[MAX_ARGS + 1] = {0};
    float *din[MAX_ARGS + 1] = {0}, *dout[MAX_ARGS + 1] = {0};
    const struct gp_graph *g = c->graph;
    struct layouts l = layouts_of(g, n);
    /* What the backward does not read stays where it is (unread; the
     * executor may already have reused that memory). */
    for (int k = 0; k < n->n_inputs; k++) {
        const struct gp_value *val = &g->values[n->inputs[k] < 0 ? 0 : n->inputs[k]];
        bool nhwc = bit(l.in, k) && k < 32;
        in[k] = c->in[k];
        if (c->in[k] && staged(c->in_dt, l.in, k) && bit(reads_in, k))
            GP_TRY(stage_one(ops, ctx, &s, c->in[k], val, dt_at(c->in_dt, k), nhwc, true, (float **)&in[k], err));
        din[k] = c->din[k];
        /* A gradient the kernel overwrites needs no widened copy of what is there. */
        bool overwritten = k < 32 && ((c->din_overwrite >> k) & 1);
        if (c->din[k] && staged(c->din_dt, l.in, k))
            GP_TRY(stage_one(ops, ctx, &s, c->din[k], val, dt_at(c->din_dt, k), nhwc, !overwritten, &din[k], err));
    }
    for (int k = 0; k < n->n_outputs; k++) {
        const struct gp_value *val = &g->values[n->outputs[k] < 0 ? 0 : n->outputs[k]];
        bool nhwc = bit(l.out, k) && k < 32;
        out[k] = c->out[k];
        if (c->out[k] && staged(c->out_dt, l.out, k) && bit(reads_out, k))
            GP_TRY(stage_one(ops, ctx, &s, c->out[k], val, dt_at(c->out_dt, k), nhwc, true, (float **)&out[k], err));
        dout[k] = c->dout[k];
        if (c->dout[k] && staged(c->dout_dt, l.out, k))
            GP_TRY(stage_one(ops, ctx, &s, c->dout[k], val, dt_at(c->dout_dt, k), nhwc, true, &dout[k], err));
    }
    struct gp_layer_call b = *c;
    b.in = in;
    b.out = out;
    b.din = din;
    b.dout = dout;
    b.dout_addend = NULL;
    b.stored_out_dt = c->out_dt;
    b.in_dt = b.out_dt = b.din_dt = b.dout_dt = NULL;
    b.in_nhwc = b.out_nhwc = 0;
    GP_TRY(ops->backward(ctx, &b, err));
    return store_back(ops, ctx, g, n->inputs, n->n_inputs, (void *const *)c->din, din, c->din_dt, l.in, err);
}

/* Whether the backend's loss takes the output and its gradient as stored. */
static bool loss_native(const struct gp_compute_ops *ops, enum gp_dtype out_dt, enum gp_dtype dout_dt)
{
    if (out_dt != GP_DTYPE_BFLOAT16 && dout_dt != GP_DTYPE_BFLOAT16) return true;
    return ops->loss_bf16 && out_dt == dout_dt;
}

size_t gp_mixed_loss_staging_bytes(const struct gp_compute_ops *ops, const struct gp_shape *out_shape,
                                   enum gp_dtype out_dt, enum gp_dtype dout_dt)
{
    if (loss_native(ops, out_dt, dout_dt)) return 0;
    size_t one = align64((size_t)gp_shape_numel(out_shape) * sizeof(float));
    return (out_dt == GP_DTYPE_BFLOAT16 ? one : 0) + (dout_dt == GP_DTYPE_BFLOAT16 ? one : 0);
}

gp_status gp_mixed_loss(const struct gp_compute_ops *ops, void *ctx, const struct gp_loss_call *c,
                        enum gp_dtype out_dt, enum gp_dtype dout_dt, void *staging, struct gp_error *err)
{
    struct gp_loss_call l = *c;
    if (loss_native(ops, out_dt, dout_dt)) {
        l.dt = out_dt == GP_DTYPE_BFLOAT16 ? GP_DTYPE_BFLOAT16 : GP_DTYPE_FLOAT32;
        return ops->loss(ctx, &l, err);
    }
    int64_t n = gp_shape_numel(c->out_shape);
    unsigned char *next = staging;
    l.dt = GP_DTYPE_FLOAT32;
    if (out_dt == GP_DTYPE_BFLOAT16) {
        l.out = next;
        next += align64((size_t)n * sizeof(float));
        GP_TRY(ops->convert(ctx, (void *)l.out, GP_DTYPE_FLOAT32, c->out, GP_DTYPE_BFLOAT16, n, false, err));
    }
    if (dout_dt == GP_DTYPE_BFLOAT16) l.dout = next;
    GP_TRY(ops->loss(ctx, &l, err));
    if (dout_dt == GP_DTYPE_BFLOAT16)
        GP_TRY(ops->convert(ctx, c->dout, GP_DTYPE_BFLOAT16, l.dout, GP_DTYPE_FLOAT32, n, false, err));
    return GP_OK;
}
