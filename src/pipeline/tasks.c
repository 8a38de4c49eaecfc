/* What runs inside the pipeline's tasks: a stage's layers forward (the
 * loss after the last stage's) and backward for one micro-batch,
 * recomputation, and the optimizer's pieces (optimizer.c), through the
 * stage backend's compute ops. With layer timing on, each layer is waited
 * for and timed. */
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/mixed_call.h"
#include "pipeline/internal.h"

static bool nondiff(const struct gp_node *n, int k)
{
    return k < 32 && ((n->def->nondiff_inputs >> k) & 1);
}

/* Where value v is for a call: in the backward (with_grads), a value
 * remade there is where the plan put it (plan.h, remade_off: the gradient
 * set, or the micro-batch's activation set's dead bytes). */
static void *call_addr(struct stage *s, int v, int box, int set, bool with_grads)
{
    if (with_grads && s->plan.remade_off[v] != SIZE_MAX)
        return grad_place(s, s->plan.remade_in_set[v], s->plan.remade_off[v], set);
    return addr(s, v, box, set);
}

/* Layer `layer` of stage s on micro-batch j (its box), its activations in
 * set `set`; with_grads: a backward's call (the gradients, and values
 * remade for the backward where they were remade). */
static struct gp_layer_call layer_call(struct gp_pipeline *p, struct stage *s, int layer, int j, int set,
                                       bool training, bool update_state, bool with_grads)
{
    const struct gp_graph *g = p->g;
    const struct gp_node *n = &g->nodes[layer];
    /* Kernels may look one past their node's inputs (an omitted optional
     * bias): the arrays are shared by the stage's layers, so clear them. */
    memset(s->in, 0, sizeof(void *) * (size_t)s->width);
    memset(s->out, 0, sizeof(void *) * (size_t)s->width);
    memset(s->din, 0, sizeof(float *) * (size_t)s->width);
    memset(s->dout, 0, sizeof(float *) * (size_t)s->width);
    /* Storage types (bf16, as planned): a matrix product or convolution
     * reads its weights' bfloat16 shadows. */
    const enum gp_dtype *in_dt = s->plan.call_dt ? s->plan.call_dt + s->plan.call_dt_off[layer - s->plan.first] : NULL;
    const enum gp_dtype *out_dt = in_dt ? in_dt + n->n_inputs + 1 : NULL;
    const enum gp_dtype *din_dt = in_dt ? out_dt + n->n_outputs + 1 : NULL;
    const enum gp_dtype *dout_dt = in_dt ? din_dt + n->n_inputs + 1 : NULL;
    uint32_t shadowed = in_dt ? s->plan.call_shadowed[layer - s->plan.first] : 0;
    /* Channels-last filter copies (plan.h): the shadow in bf16, else the
     * filter block's; their gradients' copies where they have one (not
     * while replicas sum the gradients during the backward: buckets.c). */
    uint32_t held = s->plan.call_held ? s->plan.call_held[layer - s->plan.first] : 0, held_grad = 0;
    int box = s->slots.box[j];
    for (int k = 0; k < n->n_inputs; k++) {
        int v = n->inputs[k];
        bool shadow = k < 32 && ((shadowed >> k) & 1), held_k = k < 32 && ((held >> k) & 1);
        bool copy = !shadow && held_k; /* in bf16 the shadow is the copy */
        s->in[k] = v < 0    ? NULL
                   : shadow ? s->shadows + s->plan.shadow_off[v]
                   : copy   ? s->filters + s->plan.filter_off[v]
                            : call_addr(s, v, box, set, with_grads);
        s->din[k] = v >= 0 && with_grads && !nondiff(n, k) ? grad_addr(s, &g->values[v], v, set) : NULL;
        /* The last term of v's gradient, apart (plan.h, addend_off). */
        if (s->din[k] && s->plan.addend_writer && s->plan.addend_writer[v] == layer)
            s->din[k] = (float *)grad_place(s, s->plan.addend_in_set[v], s->plan.addend_off[v], set);
        if (held_k && s->din[k] && s->plan.filter_grad_off[v] != SIZE_MAX && !gp_pipe_buckets_on(p)) {
            s->din[k] = (float *)(s->filter_grads + s->plan.filter_grad_off[v]);
            held_grad |= 1u << k;
        }
    }
    for (int k = 0; k < n->n_outputs; k++) {
        int v = n->outputs[k];
        s->out[k] = v >= 0 ? call_addr(s, v, box, set, with_grads) : NULL;
        s->dout[k] = v >= 0 && with_grads ? grad_addr(s, &g->values[v], v, set) : NULL;
    }
    int y = n->n_outputs ? n->outputs[0] : -1;
    bool addend = with_grads && y >= 0 && s->plan.addend_writer && s->plan.addend_writer[y] != INT_MIN;
    return (struct gp_layer_call){
        .graph = g,
        .node = n,
        .kernel = s->kernels[layer - s->plan.first],
        .in = s->in,
        .out = s->out,
        .din = s->din,
        .dout = s->dout,
        .dout_addend = addend ? grad_place(s, s->plan.addend_in_set[y], s->plan.addend_off[y], set) : NULL,
        .in_dt = in_dt,
        .out_dt = out_dt,
        .din_dt = din_dt,
        .dout_dt = dout_dt,
        .held_nhwc = held,
        .held_grad_nhwc = held_grad,
        .saved = s->locals + (size_t)set * s->plan.local_bytes + s->plan.saved_off[layer - s->plan.first],
        .scratch = s->scratch,
        .training = training,
        .update_state = update_state,
        .seed = p->opts.seed,
        .step = p->opts.step,
        .step_dev = p->graph_ok ? (const uint64_t *)s->step_dev : NULL,
        /* Replica r's micro-batch j is the mini-batch's r x M + j: its
         * dropout masks are those of one pipeline over every replica's. */
        .sample_offset = ((p->cfg.remote ? (int64_t)p->cfg.remote->replica * p->M : 0) + j) * p->micro,
        .dropout_ratio = p->opts.dropout_ratio,
        .deferred_stats = s->bn_stats ? s->bn_stats[layer - s->plan.first] : NULL,
    };
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

/* Adds the time since *t0 (after the device finished) to *acc. */
static gp_status lap(struct stage *s, double *t0, double *acc, struct gp_error *err)
{
    GP_TRY(s->cops->synchronize(s->cctx, err));
    double t = now_ms();
    *acc += t - *t0;
    *t0 = t;
    return GP_OK;
}

/* The stage's filter copies from their masters (to_nhwc; with
 * plan.batch_shadows every other bfloat16 shadow too, as a flat tensor,
 * which relaying leaves as it is), or their gradients' copies written
 * over the gradients, in as few launches as the backend can: they are
 * many and mostly small. A copy holds its gradient's whole sum since the
 * last optimizer step (the filter has no other reader, tied sums come
 * later), so writing it, not adding it, keeps the gradients of several
 * steps before one update right and their bits those of the sum in place.
 * dt: the copies' storage (to_nhwc), float32 throughout otherwise. */
static gp_status relay_filters(struct gp_pipeline *p, struct stage *s, bool to_nhwc, enum gp_dtype dt,
                               struct gp_error *err)
{
    const struct gp_graph *g = p->g;
    enum { CHUNK = 64 };
    void *dst[CHUNK];
    const float *src[CHUNK];
    const struct gp_shape *shapes[CHUNK];
    struct gp_shape flat[CHUNK];
    int n_shadows = to_nhwc && s->plan.batch_shadows ? s->plan.n_shadowed : 0;
    int items = s->plan.n_filtered + n_shadows, m = 0;
    for (int q = 0; q <= items; q++) {
        if (q < s->plan.n_filtered) {
            int v = s->plan.filtered[q];
            if (to_nhwc) {
                if ((s->plan.filter_off[v] == SIZE_MAX) != (dt == GP_DTYPE_BFLOAT16))
                    return gp_error_set(err, GP_ERR_INVALID, "filter copy of '%s': not of the stage's precision",
                                        g->values[v].name);
                dst[m] = s->plan.filter_off[v] == SIZE_MAX ? s->shadows + s->plan.shadow_off[v]
                                                            : s->filters + s->plan.filter_off[v];
                src[m] = (const float *)(s->static_block + s->plan.off[v]);
            } else {
                if (s->plan.filter_grad_off[v] == SIZE_MAX) continue;
                dst[m] = s->param_grads + s->plan.off[v];
                src[m] = (const float *)(s->filter_grads + s->plan.filter_grad_off[v]);
            }
            shapes[m++] = &g->values[v].shape;
        } else if (q < items) {
            int v = s->plan.shadowed[q - s->plan.n_filtered];
            if (s->plan.filter_nhwc[v]) continue; /* above */
            dst[m] = s->shadows + s->plan.shadow_off[v];
            src[m] = (const float *)(s->static_block + s->plan.off[v]);
            flat[m] = (struct gp_shape){.rank = 4, .dims = {1, 1, 1, gp_shape_numel(&g->values[v].shape)}};
            shapes[m] = &flat[m];
            m++;
        }
        if (m < CHUNK && q < items) continue;
        if (s->cops->relayout_many) {
            GP_TRY(s->cops->relayout_many(s->cctx, m, dst, dt, to_nhwc, src, shapes, false, err));
        } else {
            for (int t = 0; t < m; t++)
                GP_TRY(s->cops->relayout(s->cctx, dst[t], dt, to_nhwc, src[t], GP_DTYPE_FLOAT32, !to_nhwc, shapes[t],
                                         false, err));
        }
        m = 0;
    }
    return GP_OK;
}

/* The weights' copies from their float32 masters, once per step (before
 * its first forward, after the last optimizer step): bf16's bfloat16
 * shadows, and the channels-last filter copies (plan.h), a shadow that is
 * one relaid as it is rounded. */
static gp_status refresh_copies(struct gp_pipeline *p, struct stage *s, struct gp_error *err)
{
    const struct gp_graph *g = p->g;
    for (int q = 0; q < s->plan.n_shadowed && !s->plan.batch_shadows; q++) {
        int v = s->plan.shadowed[q];
        if (s->plan.filter_nhwc[v]) continue; /* a filter copy, below */
        GP_TRY(s->cops->convert(s->cctx, s->shadows + s->plan.shadow_off[v], GP_DTYPE_BFLOAT16,
                                s->static_block + s->plan.off[v], GP_DTYPE_FLOAT32,
                                gp_shape_numel(&g->values[v].shape), false, err));
    }
    /* The filter copies (all bfloat16 shadows in bf16, all float32
     * otherwise), and with them the other shadows where batched. */
    enum gp_dtype dt = p->cfg.compute.precision == GP_PRECISION_BF16 ? GP_DTYPE_BFLOAT16 : GP_DTYPE_FLOAT32;
    return relay_filters(p, s, true, dt, err);
}

/* The first stage's data input, when its box stores another type than the
 * host gave (bf16: float32 data into a bfloat16 box): micro-batch j's, or
 * where the inputs lie in the arena's block (stage.c, inputs_in_block)
 * every micro-batch's at the step's first forward, before anything else
 * writes that block. */
static gp_status load_input(struct gp_pipeline *p, struct stage *s, int j, bool training, struct gp_error *err)
{
    const struct gp_value *x = &p->g->values[p->input];
    int from = j, to = j + 1;
    if (s->inputs_inside && training) {
        if (j != 0) return GP_OK; /* converted with micro-batch 0's */
        to = p->M;
    }
    for (int q = from; q < to; q++)
        GP_TRY(s->cops->convert(s->cctx, addr(s, p->input, s->slots.box[q], 0), s->plan.dt[p->input],
                                s->inputs + (size_t)q * p->input_bytes, GP_DTYPE_FLOAT32, gp_shape_numel(&x->shape),
                                false, err));
    return GP_OK;
}

/* The stage's layers forward on micro-batch j, into activation set `set`. */
static gp_status run_forward(struct gp_pipeline *p, struct stage *s, int j, int set, bool training,
                             bool update_state, bool recompute, struct gp_error *err)
{
    /* Timing counts first forwards only (update_state), not recomputations. */
    bool timed = p->cfg.time_layers && update_state;
    double t0 = timed ? now_ms() : 0;
    if (timed) GP_TRY(lap(s, &t0, &(double){0}, err));
    /* Layers of static values only run in the step's first forward here. */
    bool once = !s->once_valid;
    s->once_valid = true;
    if (once && (s->plan.shadow_bytes || s->plan.n_filtered)) GP_TRY(refresh_copies(p, s, err));
    /* A recomputation finds the input converted in its box (kept until the
     * backward), and the float32 rows may be gone (stage.c, inputs_in_block). */
    if (s == &p->stages[0] && p->convert_input && !recompute) GP_TRY(load_input(p, s, j, update_state, err));
    for (int i = s->plan.first; i < s->plan.last; i++) {
        if (s->plan.once[i - s->plan.first] && !once) continue;
        struct gp_layer_call c = layer_call(p, s, i, j, set, training, update_state, false);
        /* Its workspace where the plan put it: the arena (plan.h). */
        size_t ws_off = s->plan.fwd_scratch_off ? s->plan.fwd_scratch_off[i - s->plan.first] : SIZE_MAX;
        if (ws_off != SIZE_MAX) c.scratch = s->arena + ws_off;
        GP_TRY(gp_mixed_forward(s->cops, s->cctx, &c, s->staging, err));
        if (timed) GP_TRY(lap(s, &t0, &s->fwd_ms[i - s->plan.first], err));
    }
    return GP_OK;
}

/* Zeroes the gradient regions born at backward time t (plan.h) of the
 * micro-batch in activation set `set`. */
static gp_status zero_born(struct stage *s, int t, int set, struct gp_error *err)
{
    for (int q = s->plan.zero_start[t]; q < s->plan.zero_start[t + 1]; q++) {
        const struct gp_byte_range *z = &s->plan.zeros[q];
        GP_TRY(s->cops->zero(s->cctx, grad_place(s, z->in_set, z->off, set), z->bytes, err));
    }
    return GP_OK;
}

/* The once-per-step layers' backward, after the step's last micro-batch:
 * their outputs' gradients have accumulated over every micro-batch. */
static gp_status run_once_backward(struct gp_pipeline *p, struct stage *s, struct gp_error *err)
{
    for (int i = s->plan.last - 1; i >= s->plan.first; i--) {
        if (!s->plan.once[i - s->plan.first]) continue;
        const struct gp_node *n = &p->g->nodes[i];
        struct gp_layer_call c = layer_call(p, s, i, 0, 0, true, false, true);
        bool any_in = false, any_out = false;
        for (int k = 0; k < n->n_inputs; k++) any_in |= s->din[k] != NULL;
        for (int k = 0; k < n->n_outputs; k++) any_out |= s->dout[k] != NULL;
        if (any_in && any_out) GP_TRY(gp_mixed_backward(s->cops, s->cctx, &c, s->staging, err));
    }
    return GP_OK;
}

/* A layer whose backward does not run still owes the gradients it was to
 * write first (plan.h, din_overwrite) their zeros. */
static gp_status zero_unwritten(const struct gp_graph *g, struct stage *s, const struct gp_node *n, uint32_t overwrite,
                                struct gp_error *err)
{
    for (int k = 0; k < n->n_inputs && k < 32; k++)
        if (((overwrite >> k) & 1) && s->din[k])
            GP_TRY(s->cops->zero(s->cctx, s->din[k], gp_plan_value_bytes(g, &s->plan, n->inputs[k]), err));
    return GP_OK;
}

/* Writes the values remade at backward time t (plan.h) where the plan put
 * them: each one's layer forward in remake mode, from its kept inputs and
 * the saved state of micro-batch j's set, only its output 0. */
static gp_status remake_values(struct gp_pipeline *p, struct stage *s, int j, int t, struct gp_error *err)
{
    for (int q = s->plan.remade_start[t]; q < s->plan.remade_start[t + 1]; q++) {
        const struct gp_node *n = &p->g->nodes[p->g->values[s->plan.remade[q]].producer];
        struct gp_layer_call c = layer_call(p, s, (int)(n - p->g->nodes), j, s->slots.bwd_set[j], true, false, true);
        memset(s->din, 0, sizeof(float *) * (size_t)s->width);
        memset(s->dout, 0, sizeof(float *) * (size_t)s->width);
        for (int k = 1; k < n->n_outputs; k++) s->out[k] = NULL;
        c.dout_addend = NULL;
        c.remake = true;
        GP_TRY(gp_mixed_forward(s->cops, s->cctx, &c, s->staging, err));
    }
    return GP_OK;
}

static gp_status run_backward(struct gp_pipeline *p, struct stage *s, int j, struct gp_error *err)
{
    const struct gp_graph *g = p->g;
    /* Gradient regions start at zero when their value's gradient begins
     * (the set is shared over time: plan.c), or are written whole by their
     * first writer; the gradients that arrived for the output frontier are
     * copied into theirs, which plan.c leaves uncleared: a copy, not an
     * add onto zeros: the bits the sending layer wrote, where 0 + x
     * made a -0 +0 (and, on the GPU, every NaN the one canonical NaN).
     * Kernels accumulate. */
    int set = s->slots.bwd_set[j];
    GP_TRY(zero_born(s, 0, set, err));
    const unsigned char *inbox = inbox_of(s, j);
    for (int k = 0; k < s->plan.n_frontier_out; k++) {
        int v = s->plan.frontier_out[k];
        if (s->plan.inbox_off[v] == SIZE_MAX) continue;
        GP_TRY(s->cops->convert(s->cctx, grad_addr(s, &g->values[v], v, set), s->plan.dt[v],
                                inbox + s->plan.inbox_off[v], s->plan.dt[v], gp_shape_numel(&g->values[v].shape),
                                false, err));
    }
    bool timed = p->cfg.time_layers;
    double t0 = timed ? now_ms() : 0;
    if (timed) GP_TRY(lap(s, &t0, &(double){0}, err));
    /* The last micro-batch: parameters whose readers are all done are
     * final, and their replicas' sums may start (buckets.c). */
    bool final = j == p->M - 1 && gp_pipe_buckets_on(p);
    for (int i = s->plan.last - 1; i >= s->plan.first; i--) {
        if (final) gp_pipe_buckets_progress(p, s->plan.last - 1 - i);
        if (timed && i + 1 < s->plan.last) GP_TRY(lap(s, &t0, &s->bwd_ms[i + 1 - s->plan.first], err));
        GP_TRY(zero_born(s, s->plan.last - i, set, err));
        GP_TRY(remake_values(p, s, j, s->plan.last - i, err));
        if (s->plan.once[i - s->plan.first]) continue;
        const struct gp_node *n = &g->nodes[i];
        struct gp_layer_call c = layer_call(p, s, i, j, set, true, false, true);
        c.din_overwrite = s->plan.din_overwrite ? s->plan.din_overwrite[i - s->plan.first] : 0;
        /* Its workspace where the plan put it: the set's dead bytes (plan.h). */
        size_t ws_off = s->plan.bwd_scratch_off ? s->plan.bwd_scratch_off[i - s->plan.first] : SIZE_MAX;
        if (ws_off != SIZE_MAX) c.scratch = grad_place(s, true, ws_off, set);
        bool any_in = false, any_out = false;
        for (int k = 0; k < n->n_inputs; k++) any_in |= s->din[k] != NULL;
        for (int k = 0; k < n->n_outputs; k++) any_out |= s->dout[k] != NULL;
        if (!any_in || !any_out) {
            GP_TRY(zero_unwritten(g, s, n, c.din_overwrite, err));
            continue;
        }
        GP_TRY(gp_mixed_backward(s->cops, s->cctx, &c, s->staging, err));
    }
    if (timed) GP_TRY(lap(s, &t0, &s->bwd_ms[0], err));
    if (final) gp_pipe_buckets_progress(p, s->plan.last - s->plan.first);
    return GP_OK;
}

gp_status gp_pipe_task_run(void *arg, struct gp_error *err)
{
    struct task *t = arg;
    struct gp_pipeline *p = t->p;
    struct stage *s = &p->stages[t->stage];
    int j = t->micro;
    bool last = t->stage == p->K - 1;
    switch (t->kind) {
    case TASK_FORWARD: {
        bool kept = !s->slots.checkpointed[j];
        s->live += (int64_t)s->plan.box_bytes + (int64_t)s->plan.local_bytes;
        if (s->live > s->peak) s->peak = s->live;
        GP_TRY(run_forward(p, s, j, s->slots.fwd_set[j], true, true, false, err));
        if (last) {
            void *dout = s->plan.inbox_off[p->output] == SIZE_MAX ? NULL : inbox_of(s, j) + s->plan.inbox_off[p->output];
            if (!dout)
                return gp_error_set(err, GP_ERR_INVALID,
                                    "the output '%s' does not depend on any parameter: nothing to train",
                                    p->g->values[p->output].name);
            const struct gp_value *o = &p->g->values[p->output];
            struct gp_loss_call lc = {
                .spec = &p->cfg.loss,
                .out_shape = &o->shape,
                .out = addr(s, p->output, s->slots.box[j], s->slots.fwd_set[j]),
                .target = p->target_bytes ? s->targets + (size_t)j * p->target_bytes : NULL,
                .dout = dout,
                .denominator = p->denominator,
                .loss_sum = (double *)s->loss_sums + j,
                .scratch = s->scratch,
            };
            enum gp_dtype odt = s->plan.dt[p->output];
            GP_TRY(gp_mixed_loss(s->cops, s->cctx, &lc, odt, odt, s->staging, err));
        }
        /* A checkpointed micro-batch keeps only its input frontier (box). */
        if (!kept) s->live -= (int64_t)s->plan.local_bytes;
        return GP_OK;
    }
    case TASK_RECOMPUTE:
        s->live += (int64_t)s->plan.local_bytes;
        if (s->live > s->peak) s->peak = s->live;
        /* Same dropout key, running statistics untouched: the recomputed
         * activations are the ones the first forward made. */
        return run_forward(p, s, j, s->slots.bwd_set[j], true, false, true, err);
    case TASK_BACKWARD: {
        /* A gradient set in the arena's block is counted with it (gp_pipeline_report). */
        int64_t grads = s->plan.grads_share_arena ? 0 : (int64_t)s->plan.grad_bytes;
        s->live += grads;
        if (s->live > s->peak) s->peak = s->live;
        GP_TRY(run_backward(p, s, j, err));
        if (++s->backwards_done == p->M) {
            /* The filter gradients' copies into the gradients (plan.h). */
            if (s->plan.filter_grad_bytes && !gp_pipe_buckets_on(p))
                GP_TRY(relay_filters(p, s, false, GP_DTYPE_FLOAT32, err));
            GP_TRY(run_once_backward(p, s, err));
            /* The once-per-step layers' output gradients, summed over the
             * micro-batches, are in the parameters' gradients now: cleared
             * for the next step's, whether or not an update comes between. */
            if (s->plan.step_grad_bytes)
                GP_TRY(s->cops->zero(s->cctx, s->step_grads, s->plan.step_grad_bytes, err));
            gp_pipe_buckets_progress(p, s->plan.last - s->plan.first + 1);
        }
        s->live -= grads + (int64_t)s->plan.local_bytes + (int64_t)s->plan.box_bytes;
        return GP_OK;
    }
    case TASK_OPTIMIZE: {
        /* Everything that changes from step to step is read from the
         * stage's scalars in device memory (optimizer.c): this runs once
         * when a step is captured as a graph. */
        const struct gp_optim_scalars *scalars = (const struct gp_optim_scalars *)s->scalars;
        const int32_t *skip = (const int32_t *)(s->scalars + offsetof(struct gp_optim_scalars, skip));
        /* Deferred BatchNorm: the whole mini-batch's statistics, once. */
        for (int i = s->plan.first; s->bn_stats && i < s->plan.last; i++) {
            if (!s->bn_stats[i - s->plan.first]) continue;
            const struct gp_node *n = &p->g->nodes[i];
            GP_TRY(s->cops->bn_commit(s->cctx, p->g, n, addr(s, n->inputs[3], 0, 0), addr(s, n->inputs[4], 0, 0),
                                      s->bn_stats[i - s->plan.first], skip, err));
        }
        if (s->opt) GP_TRY(s->cops->optim_step(s->cctx, s->opt, scalars, err));
        if (s->plan.filter_grad_bytes)
            GP_TRY(s->cops->zero(s->cctx, s->filter_grads, s->plan.filter_grad_bytes, err));
        return s->cops->zero(s->cctx, s->param_grads, s->plan.param_bytes, err);
    }
    case TASK_NORMS:
        return s->cops->norms(s->cctx, s->param_grad_ptrs, s->param_numels, s->n_params,
                              (float *)s->norms, err);
    case TASK_TIED_ADD: {
        /* Another holder's gradient, copied into the scratch, added. */
        const struct gp_pipe_tied *tp = &p->tied[j];
        return s->cops->convert(s->cctx, s->param_grads + s->plan.off[tp->value], GP_DTYPE_FLOAT32, s->tied_scratch,
                                GP_DTYPE_FLOAT32, tp->numel, true, err);
    }
    case TASK_GUARD:
        return s->cops->optim_guard(s->cctx, (const float *)s->norms_all, (const int32_t *)s->norm_order, p->n_norms,
                                    (const double *)s->loss_sums, p->M, (struct gp_optim_scalars *)s->scalars, err);
    case TASK_EVAL: {
        /* Evaluation runs as micro-batch 0, in its box and set. */
        /* A bfloat16 output is copied back as it is and widened on the
         * host (gp_pipeline_eval): no float32 copy on the device. */
        return run_forward(p, s, 0, s->slots.fwd_set[0], p->eval_batch_stats, false, false, err);
    }
    case TASK_SEND_ACTIVATIONS:
    case TASK_RECV_ACTIVATIONS:
    case TASK_SEND_GRADIENTS:
    case TASK_RECV_GRADIENTS:
        return gp_pipe_remote_task(t, err);
    }
    return GP_OK;
}

/* ---- creation ---- */

