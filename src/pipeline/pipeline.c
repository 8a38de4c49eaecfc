/* The pipeline executor: creates the stages, issues a step's actions (from
 * the schedule) onto the stages' streams with events between them (and the
 * optimizer after them, optimizer.c), and evaluation and reads. The host
 * touches device memory only through copies; the work itself runs in tasks
 * (tasks.c). */
#include "pipeline/pipeline.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/internal.h"
#include "util/env.h"
#include "pipeline/trace.h"
#include "util/cpu_cores.h"

void gp_pipeline_free(struct gp_pipeline *p)
{
    if (!p) return;
    gp_pipe_buckets_free(p);
    gp_pipe_inputs_ahead_free(p); /* its upload may read a host buffer */
    gp_pipe_free_host_bufs(p);
    gp_pipe_free_graphs(p);
    gp_pipe_optimizer_free(p);
    gp_pipe_free_stages(p);
    gp_pipe_tied_free(p);
    gp_layers_free(&p->layers);
    gp_pipe_schedule_free(&p->sched);
    free(p->needs_grad);
    free(p->tasks);
    free(p->last_backward);
    free(p->next_copy);
    free(p->loss_parts);
    free(p->norms_host);
    free(p);
}

gp_status gp_pipeline_create(const struct gp_pipeline_config *cfg, struct gp_pipeline **out,
                             struct gp_error *err)
{
    *out = NULL;
    const struct gp_graph *g = cfg->graph;
    if (cfg->n_stages < 1 || cfg->n_micro < 1)
        return gp_error_set(err, GP_ERR_INVALID, "a pipeline needs at least one stage and one micro-batch");
    if (cfg->n_stages > g->n_nodes)
        return gp_error_set(err, GP_ERR_INVALID, "%d stages for %d layers: every stage needs a layer",
                            cfg->n_stages, g->n_nodes);
    const struct gp_pipe_remote *r = cfg->remote;
    if (r && (r->stage < 0 || r->stage >= cfg->n_stages || !r->send || !r->recv))
        return gp_error_set(err, GP_ERR_INVALID, "stage %d of %d stages cannot be this process's", r->stage,
                            cfg->n_stages);
    if (r && r->replicas > 1 && (r->replica < 0 || r->replica >= r->replicas || !r->sum_f32 || !r->sum_f64))
        return gp_error_set(err, GP_ERR_INVALID, "replica %d of %d replicas cannot be this process's", r->replica,
                            r->replicas);
    if (r && cfg->time_layers)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "layer timing runs every stage in one process");
    struct gp_pipeline *p = calloc(1, sizeof *p);
    if (!p) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    p->cfg = *cfg;
    p->g = g;
    p->K = cfg->n_stages;
    p->M = cfg->n_micro;
    gp_status st = GP_OK;
    int n_inputs = 0;
    p->input = gp_graph_data_inputs(g, &n_inputs);
    if (n_inputs > 1) {
        st = gp_error_set(err, GP_ERR_UNSUPPORTED, "the model has several data inputs; training feeds one");
        goto fail;
    }
    if (p->input < 0) {
        st = gp_error_set(err, GP_ERR_UNSUPPORTED, "the model has no data input");
        goto fail;
    }
    p->micro = g->values[p->input].shape.dims[0];
    p->input_bytes = (size_t)gp_shape_numel(&g->values[p->input].shape) * gp_dtype_size(g->values[p->input].dtype);
    p->output = g->outputs[0];
    /* The first stage's buffer of the next step's inputs (inputs_ahead.c),
     * planned with its blocks. */
    if (gp_pipeline_inputs_ahead_on(cfg->remote != NULL)) p->ahead_bytes = p->input_bytes * (size_t)p->M;
    if ((st = gp_layers_build(g, &p->layers, err)) != GP_OK) goto fail;
    p->needs_grad = calloc((size_t)g->n_values + 1, sizeof(bool));
    p->stages = calloc((size_t)p->K, sizeof *p->stages);
    /* Every replica's micro-batches' loss sums, in the mini-batch's order. */
    p->loss_parts = calloc((size_t)p->M * (size_t)gp_pipe_replicas(p), sizeof(double));
    /* Every stage's parameter norms (a tied parameter once per holder). */
    p->norms_host = calloc((size_t)g->n_values * (size_t)p->K + 1, sizeof(float));
    if (cfg->loss.target_dtype != GP_DTYPE_UNDEFINED)
        p->target_bytes = (size_t)gp_shape_numel(&cfg->loss.target_shape) *
                          (gp_dtype_is_float(cfg->loss.target_dtype) ? sizeof(float)
                                                                     : gp_dtype_size(cfg->loss.target_dtype));
    if (!p->needs_grad || !p->stages || !p->loss_parts || !p->norms_host) {
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    gp_plan_needs_grad(g, p->needs_grad);

    /* The schedule first: the stages' memory follows from it. */
    if ((st = gp_pipe_schedule_make(cfg->schedule, p->K, p->M, cfg->checkpoint, &p->sched, err)) != GP_OK) goto fail;
    struct gp_stage_slots *slots = calloc((size_t)p->K, sizeof *slots);
    p->last_backward = calloc((size_t)p->K, sizeof(int));
    p->next_copy = calloc((size_t)p->K, sizeof(int));
    if (!slots || !p->last_backward || !p->next_copy) {
        free(slots);
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    st = gp_pipe_slots_plan(&p->sched, slots, err);
    for (int k = 0; k < p->K; k++) p->stages[k].slots = slots[k];
    free(slots);
    if (st != GP_OK) goto fail;

    /* Stage boundaries from the balance (or an even split by layer count). */
    int first = 0;
    for (int k = 0; k < p->K; k++) {
        int count = cfg->balance ? cfg->balance[k] : (g->n_nodes * (k + 1)) / p->K - (g->n_nodes * k) / p->K;
        if (count < 1 || first + count > g->n_nodes) {
            st = gp_error_set(err, GP_ERR_INVALID,
                              "the balance must give every stage at least one layer and sum to the "
                              "model's %d layers",
                              g->n_nodes);
            goto fail;
        }
        if ((st = gp_pipe_create_stage(p, k, first, first + count, err)) != GP_OK) {
            gp_error_prefix(err, "stage %d: ", k);
            goto fail;
        }
        first += count;
    }
    if (first != g->n_nodes) {
        st = gp_error_set(err, GP_ERR_INVALID, "the balance covers %d of the model's %d layers", first,
                          g->n_nodes);
        goto fail;
    }
    if ((st = gp_pipe_tied_plan(p, err)) != GP_OK) goto fail;
    if ((st = gp_pipe_optimizer_plan(p, err)) != GP_OK) goto fail;
    /* Frontier messages go from the stage's own memory: through send and
     * recv where it is the host's (CPU devices), through the device links
     * where it is a device's (a backend with pinned host memory: CUDA, over
     * NCCL), as are the replicas' sums of its gradients. */
    if (r && p->stages[r->stage].ops->host_alloc &&
        (!r->device_send || !r->device_recv ||
         (r->replicas > 1 && (!r->device_sum_f32 || !r->device_sum_f64)))) {
        st = gp_error_set(err, GP_ERR_UNSUPPORTED,
                          "stage %d: a stage on a %s device in another process needs device links between the "
                          "processes (NCCL), and this job has none",
                          r->stage, p->stages[r->stage].ops->name);
        goto fail;
    }
    /* bf16: float32 data is rounded into a bfloat16 box by the first forward. */
    p->convert_input = g->values[p->input].dtype == GP_DTYPE_FLOAT32 &&
                       p->stages[0].plan.dt[p->input] != GP_DTYPE_FLOAT32;
    if (r && (st = gp_pipe_buckets_plan(p, r->bucket_bytes ? r->bucket_bytes : GP_PIPE_BUCKET_BYTES, err)) != GP_OK)
        goto fail;
    p->tasks = calloc((size_t)p->sched.n_actions + 3 * (size_t)p->K + 4 * (size_t)p->M + 1, sizeof *p->tasks);
    if (!p->tasks) {
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = gp_pipe_setup_graphs(p, err)) != GP_OK) goto fail;
    /* OpenMP threads per device: the cores shared among the devices. */
    long cores = gp_cpu_cores();
    int devices = 0;
    for (int k = 0; k < p->K; k++) {
        bool seen = !stage_local(p, k);
        for (int q = 0; q < k; q++) seen |= p->stages[q].dev == p->stages[k].dev;
        devices += !seen;
    }
    for (int k = 0; k < p->K; k++)
        if (stage_local(p, k))
            p->stages[k].ops->set_threads(p->stages[k].dev, (int)(cores / devices > 1 ? cores / devices : 1));
    *out = p;
    return GP_OK;
fail:
    gp_pipeline_free(p);
    return st;
}



/* The task that sends or receives micro-batch j's frontier for stage k
 * (remote.c), in its slot after the actions' and the per-stage tasks. */
static struct task *remote_task(struct gp_pipeline *p, enum task_kind kind, int k, int j)
{
    size_t index = (size_t)p->sched.n_actions + 3 * (size_t)p->K +
                   (size_t)(kind - TASK_SEND_ACTIVATIONS) * (size_t)p->M + (size_t)j;
    struct task *t = &p->tasks[index];
    *t = (struct task){.p = p, .stage = k, .micro = j, .kind = kind};
    return t;
}

/* Moves micro-batch j's output frontier of stage k into stage k+1's box,
 * once the backward that last read that box there is done. */
static void issue_forward_copy(struct gp_pipeline *p, int k, int j)
{
    struct stage *s = &p->stages[k], *t = &p->stages[k + 1];
    struct gp_task_tag tag = tag_of(GP_TASK_COPY, k, j, "send activations");
    s->ops->stream_wait(s->copy_next, s->fwd_done[j]);
    if (!stage_local(p, k + 1)) {
        /* The receiver takes them on a stream of its own (issue_forward_receive). */
        s->ops->enqueue(s->copy_next, gp_pipe_task_run, remote_task(p, TASK_SEND_ACTIVATIONS, k, j), &tag);
        s->ops->event_record(s->fwd_copied[j], s->copy_next);
        return;
    }
    if (t->slots.box_after[j] >= 0) s->ops->stream_wait(s->copy_next, t->bwd_done[t->slots.box_after[j]]);
    for (int q = 0; q < s->plan.n_frontier_out; q++) {
        int v = s->plan.frontier_out[q];
        size_t bytes = gp_plan_value_bytes(p->g, &s->plan, v);
        s->ops->copy(s->copy_next, addr(t, v, t->slots.box[j], 0), addr(s, v, s->slots.box[j], s->slots.fwd_set[j]),
                     bytes, &tag);
    }
    s->ops->event_record(s->fwd_copied[j], s->copy_next);
}

/* Moves micro-batch j's input-frontier gradients of stage k into stage k-1's
 * inbox, once the backward that last read that inbox there is done. */
static void issue_backward_copy(struct gp_pipeline *p, int k, int j)
{
    struct stage *s = &p->stages[k], *t = &p->stages[k - 1];
    struct gp_task_tag tag = tag_of(GP_TASK_COPY, k, j, "send gradients");
    s->ops->stream_wait(s->copy_prev, s->bwd_done[j]);
    if (!stage_local(p, k - 1)) {
        s->ops->enqueue(s->copy_prev, gp_pipe_task_run, remote_task(p, TASK_SEND_GRADIENTS, k, j), &tag);
        s->ops->event_record(s->bwd_copied[j], s->copy_prev);
        return;
    }
    if (t->slots.inbox_after[j] >= 0) s->ops->stream_wait(s->copy_prev, t->bwd_done[t->slots.inbox_after[j]]);
    for (int q = 0; q < s->plan.n_frontier_in; q++) {
        int v = s->plan.frontier_in[q];
        if (t->plan.inbox_off[v] == SIZE_MAX) continue;
        size_t bytes = gp_plan_value_bytes(p->g, &s->plan, v); /* a gradient is stored as its value */
        s->ops->copy(s->copy_prev, inbox_of(t, j) + t->plan.inbox_off[v], s->grads + s->plan.grad_off[v], bytes, &tag);
    }
    s->ops->event_record(s->bwd_copied[j], s->copy_prev);
}

/* Stage k (local) receives micro-batch j's activations from stage k-1 in
 * another process into j's box, on its recv_prev stream, once the
 * backward that last read that box is done: where the local copy would be
 * issued (the box free, the same order on both sides, so that the sender's
 * messages meet their receives); its forward waits for act_in[j]. */
static void issue_forward_receive(struct gp_pipeline *p, int k, int j)
{
    struct stage *s = &p->stages[k];
    /* Named as the copy it is: from stage k-1 (the span "copy s(k-1)->sk"). */
    struct gp_task_tag tag = tag_of(GP_TASK_COPY, k - 1, j, "receive activations");
    if (s->slots.box_after[j] >= 0) s->ops->stream_wait(s->recv_prev, s->bwd_done[s->slots.box_after[j]]);
    s->ops->enqueue(s->recv_prev, gp_pipe_task_run, remote_task(p, TASK_RECV_ACTIVATIONS, k, j), &tag);
    s->ops->event_record(s->act_in[j], s->recv_prev);
}

/* Stage k (local) receives micro-batch j's gradients from stage k+1 in
 * another process into j's inbox, on its recv_next stream, once the
 * backward that last read that inbox is done: issued where stage k+1's
 * backward of j is (its send follows it); k's backward waits for
 * grad_in[j]. */
static void issue_backward_receive(struct gp_pipeline *p, int k, int j)
{
    struct stage *s = &p->stages[k];
    struct gp_task_tag tag = tag_of(GP_TASK_COPY, k + 1, j, "receive gradients");
    if (s->slots.inbox_after[j] >= 0) s->ops->stream_wait(s->recv_next, s->bwd_done[s->slots.inbox_after[j]]);
    s->ops->enqueue(s->recv_next, gp_pipe_task_run, remote_task(p, TASK_RECV_GRADIENTS, k, j), &tag);
    s->ops->event_record(s->grad_in[j], s->recv_next);
}

gp_status gp_pipe_sync_all(struct gp_pipeline *p, struct gp_error *err)
{
    gp_status first = GP_OK;
    for (int k = 0; k < p->K; k++) {
        struct stage *s = &p->stages[k];
        struct gp_stream *streams[STAGE_STREAMS];
        int n = gp_pipe_stage_streams(s, streams, NULL);
        for (int q = 0; q < n; q++) {
            gp_status st = s->ops->stream_synchronize(streams[q], err);
            if (st != GP_OK && first == GP_OK) first = st;
        }
    }
    return first;
}

static void clear_traces(struct gp_pipeline *p)
{
    if (!p->cfg.trace) return;
    for (int k = 0; k < p->K; k++) {
        struct stage *s = &p->stages[k];
        struct gp_stream *streams[STAGE_STREAMS];
        int n = gp_pipe_stage_streams(s, streams, NULL);
        for (int q = 0; q < n; q++) s->ops->trace_enable(streams[q], 1); /* restarts the recording */
    }
}

/* Every action of the schedule, in order, onto the stages' streams: the
 * step's whole forward and backward, with an event for each dependency and
 * each reuse of a buffer (the slots say which; every event waited for was
 * recorded by something issued before). */
void gp_pipe_issue_actions(struct gp_pipeline *p)
{
    size_t in_bytes = p->input_bytes;
    for (int k = 0; k < p->K; k++) p->last_backward[k] = -1, p->next_copy[k] = 0;
    for (int a = 0; a < p->sched.n_actions; a++) {
        const struct gp_action *act = &p->sched.actions[a];
        int k = act->stage, j = act->microbatch;
        struct stage *s = &p->stages[k];
        const struct gp_stage_slots *sl = &s->slots;
        struct task *t = &p->tasks[a];
        *t = (struct task){.p = p, .stage = k, .micro = j};
        /* Another process issues its stage's actions. */
        switch (stage_local(p, k) ? (int)act->kind : -1) {
        case GP_ACT_FORWARD: {
            t->kind = TASK_FORWARD;
            if (k == 0 && !p->convert_input) {
                struct gp_task_tag tag = tag_of(GP_TASK_COPY, 0, j, "input to its box");
                s->ops->copy(s->compute, addr(s, p->input, sl->box[j], 0), s->inputs + (size_t)j * in_bytes, in_bytes,
                             &tag);
            } else if (k > 0 && !stage_local(p, k - 1)) {
                s->ops->stream_wait(s->compute, s->act_in[j]);
            } else if (k > 0) {
                s->ops->stream_wait(s->compute, p->stages[k - 1].fwd_copied[j]);
            }
            /* An activation set is overwritten only after the outputs of
             * the forward that wrote it before left it. */
            if (k + 1 < p->K && sl->fwd_set_after[j] >= 0)
                s->ops->stream_wait(s->compute, s->fwd_copied[sl->fwd_set_after[j]]);
            struct gp_task_tag tag = tag_of(GP_TASK_FORWARD, k, j, "forward");
            s->ops->enqueue(s->compute, gp_pipe_task_run, t, &tag);
            s->ops->event_record(s->fwd_done[j], s->compute);
            break;
        }
        case GP_ACT_RECOMPUTE: {
            t->kind = TASK_RECOMPUTE;
            if (k + 1 < p->K && sl->bwd_set_after[j] >= 0)
                s->ops->stream_wait(s->compute, s->fwd_copied[sl->bwd_set_after[j]]);
            struct gp_task_tag tag = tag_of(GP_TASK_RECOMPUTE, k, j, "recompute");
            s->ops->enqueue(s->compute, gp_pipe_task_run, t, &tag);
            break;
        }
        case GP_ACT_BACKWARD: {
            t->kind = TASK_BACKWARD;
            if (k + 1 < p->K && !stage_local(p, k + 1)) {
                s->ops->stream_wait(s->compute, s->grad_in[j]);
            } else if (k + 1 < p->K) {
                s->ops->stream_wait(s->compute, p->stages[k + 1].bwd_copied[j]);
            }
            /* The gradient set is reused: the previous backward's input
             * gradients must have left it. */
            if (k > 0 && p->last_backward[k] >= 0) s->ops->stream_wait(s->compute, s->bwd_copied[p->last_backward[k]]);
            struct gp_task_tag tag = tag_of(GP_TASK_BACKWARD, k, j, "backward");
            s->ops->enqueue(s->compute, gp_pipe_task_run, t, &tag);
            s->ops->event_record(s->bwd_done[j], s->compute);
            p->last_backward[k] = j;
            if (k > 0) issue_backward_copy(p, k, j);
            break;
        }
        }
        /* Another process's backward of j sends its input gradients to
         * this process's stage: their receive is due now. */
        if (act->kind == GP_ACT_BACKWARD && !stage_local(p, k) && k > 0 && stage_local(p, k - 1))
            issue_backward_receive(p, k - 1, j);
        /* The forward copies due now: after the forward that made them and
         * the backward that freed their box (slots.h). */
        for (int r = 1; r < p->K; r++) {
            const struct gp_stage_slots *in = &p->stages[r].slots;
            while (p->next_copy[r] < p->M && in->copy_after[p->next_copy[r]] <= a) {
                if (stage_local(p, r - 1)) issue_forward_copy(p, r - 1, p->next_copy[r]);
                else if (stage_local(p, r)) issue_forward_receive(p, r, p->next_copy[r]);
                p->next_copy[r]++;
            }
        }
    }
}

/* What the tasks count per step (its once-per-step layers, its backwards),
 * from zero: before issuing or capturing the step, and again before
 * issuing it eagerly after a capture that failed half-way. */
static void step_counters_reset(struct gp_pipeline *p)
{
    for (int k = 0; k < p->K; k++) {
        p->stages[k].once_valid = false;
        p->stages[k].backwards_done = 0;
    }
}

/* A step's start: its settings, and what the tasks count per step. */
static void step_begin(struct gp_pipeline *p, const struct gp_step_opts *o, double denominator)
{
    p->opts = *o;
    p->denominator = denominator;
    p->eval = false;
    clear_traces(p);
    step_counters_reset(p);
    for (int k = 0; p->cfg.time_layers && k < p->K; k++) {
        struct stage *st = &p->stages[k];
        memset(st->fwd_ms, 0, sizeof(double) * (size_t)(st->plan.last - st->plan.first));
        memset(st->bwd_ms, 0, sizeof(double) * (size_t)(st->plan.last - st->plan.first));
    }
}

/* The step issued as it goes (no graph), with the optimizer after the
 * backward on the devices when `optimizer` (every stage in this process). */
static gp_status step_eager(struct gp_pipeline *p, const void *x, const void *targets, bool optimizer,
                            struct gp_error *err)
{
    struct stage *ls = &p->stages[p->K - 1];
    step_counters_reset(p);
    /* The mini-batch's data and targets reach the devices in one copy
     * each, before any work of the step (pageable host memory may make
     * a copy wait for its stream: here the streams are idle). */
    struct gp_task_tag itag = tag_of(GP_TASK_COPY, 0, -1, "load inputs");
    /* A replica's share: its M consecutive micro-batches. */
    size_t share = gp_pipe_replicas(p) > 1 ? (size_t)p->cfg.remote->replica * (size_t)p->M : 0;
    if (stage_local(p, 0)) {
        const char *xs = (const char *)x + share * p->input_bytes;
        gp_pipe_inputs_load(p, xs, xs, p->input_bytes * (size_t)p->M, &itag);
    }
    if (p->target_bytes && stage_local(p, p->K - 1)) {
        struct gp_task_tag ttag = tag_of(GP_TASK_COPY, p->K - 1, -1, "load targets");
        ls->ops->copy(ls->compute, ls->targets, (const char *)targets + share * p->target_bytes,
                      p->target_bytes * (size_t)p->M, &ttag);
    }
    /* With graphs on, kernels read the step from the device: set it. */
    if (p->graph_ok) *p->step_host = p->opts.step;
    for (int k = 0; p->graph_ok && k < p->K; k++)
        p->stages[k].ops->copy(p->stages[k].compute, p->stages[k].step_dev, p->step_host, sizeof(uint64_t),
                               &itag);
    /* The optimizer's scalars to the last stage, whose guard completes
     * them and hands them on (optimizer.c). */
    if (optimizer) {
        struct gp_task_tag stag = tag_of(GP_TASK_COPY, p->K - 1, -1, "the step's optimizer scalars");
        ls->ops->copy(ls->compute, ls->scalars, p->scalars_host, sizeof(struct gp_optim_scalars), &stag);
    }
    gp_pipe_buckets_begin(p);
    gp_pipe_issue_actions(p);
    /* The micro-batches' loss sums come back with the step's one wait. */
    struct gp_task_tag tag = tag_of(GP_TASK_COPY, p->K - 1, -1, "read losses");
    if (stage_local(p, p->K - 1))
        ls->ops->copy(ls->compute, p->loss_parts + share, ls->loss_sums, sizeof(double) * (size_t)p->M, &tag);
    if (optimizer) {
        gp_pipe_issue_optimizer(p);
        struct gp_task_tag gtag = tag_of(GP_TASK_COPY, p->K - 1, -1, "read the guard's result");
        ls->ops->copy(ls->compute, p->scalars_out, ls->scalars, sizeof(struct gp_optim_scalars), &gtag);
    }
    /* The next step's inputs, once this step's work is issued (the host
     * may round them first: inputs_ahead.c). */
    if (stage_local(p, 0)) gp_pipe_inputs_ahead(p, p->input_bytes * (size_t)p->M);
    gp_status st = gp_pipe_sync_all(p, err);
    /* The replicas' gradient sums end before anything else talks to
     * the replicas. */
    if (gp_pipe_buckets_on(p)) {
        struct gp_error berr = {0};
        gp_status bst = gp_pipe_buckets_finish(p, st != GP_OK, &berr);
        if (st == GP_OK && bst != GP_OK) {
            st = bst;
            *err = berr;
        }
    }
    /* Every process gets the loss (every replica's): they decide alike
     * what comes next. */
    if (st == GP_OK && p->cfg.remote) st = gp_pipe_remote_losses(p, err);
    if (st == GP_OK && optimizer) p->optimizer_warm = true;
    return st;
}

/* The step's loss terms summed in micro-batch order over the whole
 * mini-batch: the bits of one pipeline, whatever the number of replicas
 * (the guard adds them in this order too). */
static double loss_total(const struct gp_pipeline *p)
{
    double sum = 0;
    for (int j = 0; j < p->M * gp_pipe_replicas(p); j++) sum += p->loss_parts[j];
    return sum;
}

gp_status gp_pipeline_step(struct gp_pipeline *p, const void *x, const void *targets, const struct gp_step_opts *o,
                           double denominator, double *loss_sum, struct gp_error *err)
{
    step_begin(p, o, denominator);
    gp_status st = GP_OK;
    /* The first step runs eagerly: lazy initializations (library handles'
     * first calls, events) happen outside the capture. */
    bool graphed = p->graph_ok && p->steps_done > 0 && gp_pipe_step_graph(p, x, targets, false, &st, err);
    if (!graphed) st = step_eager(p, x, targets, false, err);
    GP_TRY(st);
    p->steps_done++;
    *loss_sum = loss_total(p);
    return GP_OK;
}

gp_status gp_pipeline_train_step(struct gp_pipeline *p, const void *x, const void *targets,
                                 const struct gp_step_opts *o, double denominator, double lr, double clip_norm,
                                 struct gp_step_outcome *out, struct gp_error *err)
{
    /* Across processes the replicas' and tied holders' sums, the norms and
     * the losses meet through the host (graph.c's note says so). */
    if (p->cfg.remote) {
        double loss_sum = 0;
        GP_TRY(gp_pipeline_step(p, x, targets, o, denominator, &loss_sum, err));
        GP_TRY(gp_pipeline_optimize(p, lr, clip_norm, out, err));
        out->loss_sum = loss_sum;
        return GP_OK;
    }
    step_begin(p, o, denominator);
    gp_pipe_scalars_begin(p, lr, clip_norm, denominator);
    gp_status st = GP_OK;
    /* Captured once the step, optimizer included, ran eagerly: lazy
     * initializations stay outside the capture. */
    bool graphed = p->graph_ok && p->steps_done > 0 && p->optimizer_warm &&
                   gp_pipe_step_graph(p, x, targets, true, &st, err);
    if (!graphed) st = step_eager(p, x, targets, true, err);
    GP_TRY(st);
    p->steps_done++;
    out->loss_sum = loss_total(p);
    gp_pipe_optimizer_end(p, out);
    return GP_OK;
}

const char *gp_pipeline_graph_note(const struct gp_pipeline *p) { return p->graph_note[0] ? p->graph_note : NULL; }

bool gp_pipeline_graphed(const struct gp_pipeline *p) { return p->graph != NULL; }

/* The n bfloat16 values at the start of out widened into n floats, in
 * place (exact): from the last to the first, value i's float covers
 * bfloat16 values 2i and 2i + 1, which are read before (i >= 1) or with
 * (i = 0) it is written. */
static void widen_in_place(float *out, int64_t n)
{
    unsigned char *bytes = (unsigned char *)out; /* byte copies: both views of one buffer */
    for (int64_t i = n - 1; i >= 0; i--) {
        uint16_t b;
        memcpy(&b, bytes + 2 * i, sizeof b);
        float f = gp_bf16_to_float(b);
        memcpy(bytes + 4 * i, &f, sizeof f);
    }
}

gp_status gp_pipeline_eval(struct gp_pipeline *p, const void *x, bool batch_stats, float *out,
                           struct gp_error *err)
{
    if (p->cfg.remote && batch_stats)
        return gp_error_set(err, GP_ERR_UNSUPPORTED,
                            "not yet implemented: evaluating with batch statistics across processes");
    /* Batch statistics come with training mode: dropout is then turned off by its ratio. */
    p->opts = (struct gp_step_opts){.dropout_ratio = batch_stats ? 0 : -1};
    p->eval_batch_stats = batch_stats;
    size_t in_bytes = p->input_bytes;
    const struct gp_value *o = &p->g->values[p->output];
    size_t out_bytes = sizeof(float) * (size_t)gp_shape_numel(&o->shape);
    bool out_bf16 = false; /* the last stage is local and keeps its output in bfloat16 */
    for (int k = 0; k < p->K; k++) p->stages[k].once_valid = false;
    for (int k = 0; k < p->K; k++) {
        /* Across processes each stage's process issues its own; the
         * activations travel as a training forward's do (remote.c). */
        if (!stage_local(p, k)) continue;
        struct stage *s = &p->stages[k];
        struct task *t = &p->tasks[p->sched.n_actions + p->K + k];
        *t = (struct task){.p = p, .stage = k, .micro = 0, .kind = TASK_EVAL};
        if (k == 0) {
            struct gp_task_tag tag = tag_of(GP_TASK_COPY, 0, 0, "load inputs");
            s->ops->copy(s->compute, p->convert_input ? s->inputs : addr(s, p->input, s->slots.box[0], 0), x, in_bytes,
                         &tag);
        } else if (!stage_local(p, k - 1)) {
            struct gp_task_tag rtag = tag_of(GP_TASK_COPY, k - 1, 0, "receive activations");
            s->ops->enqueue(s->compute, gp_pipe_task_run, remote_task(p, TASK_RECV_ACTIVATIONS, k, 0), &rtag);
        } else {
            s->ops->stream_wait(s->compute, p->stages[k - 1].fwd_copied[0]);
        }
        struct gp_task_tag tag = tag_of(GP_TASK_FORWARD, k, 0, "evaluate");
        s->ops->enqueue(s->compute, gp_pipe_task_run, t, &tag);
        s->ops->event_record(s->fwd_done[0], s->compute);
        if (k + 1 < p->K) {
            issue_forward_copy(p, k, 0);
        } else {
            struct gp_task_tag ctag = tag_of(GP_TASK_COPY, k, 0, "read outputs");
            /* A bfloat16 output comes back as it is, into the first half
             * of `out`, and is widened below. */
            out_bf16 = s->plan.dt[p->output] == GP_DTYPE_BFLOAT16;
            s->ops->copy(s->compute, out, addr(s, p->output, s->slots.box[0], s->slots.fwd_set[0]),
                         out_bf16 ? out_bytes / 2 : out_bytes, &ctag);
        }
    }
    GP_TRY(gp_pipe_sync_all(p, err));
    if (out_bf16) widen_in_place(out, gp_shape_numel(&o->shape));
    /* Every process gets the outputs: all compute the same figures. */
    return p->cfg.remote ? gp_pipe_remote_outputs(p, out, out_bytes, err) : GP_OK;
}

gp_status gp_pipeline_read(struct gp_pipeline *p, int value, float *out, struct gp_error *err)
{
    if (p->cfg.remote) return gp_pipe_remote_read(p, value, out, err);
    for (int k = 0; k < p->K; k++) {
        struct stage *s = &p->stages[k];
        if (s->plan.home[value] != GP_HOME_STATIC) continue;
        const struct gp_value *v = &p->g->values[value];
        if (!gp_dtype_is_float(v->dtype))
            return gp_error_set(err, GP_ERR_INVALID, "value '%s' is %s, not float", v->name,
                                gp_dtype_name(v->dtype));
        struct gp_task_tag tag = tag_of(GP_TASK_COPY, k, -1, "read parameter");
        s->ops->copy(s->compute, out, s->static_block + s->plan.off[value],
                     sizeof(float) * (size_t)gp_shape_numel(&v->shape), &tag);
        return s->ops->stream_synchronize(s->compute, err);
    }
    return gp_error_set(err, GP_ERR_INVALID, "value '%s' is not held by any stage",
                        p->g->values[value].name);
}

bool gp_pipeline_inputs_ahead_on(bool remote) { return !remote && gp_env_flag("GP_INPUTS_AHEAD", true); }

int gp_pipeline_stages(const struct gp_pipeline *p) { return p->K; }

void gp_pipeline_layer_times(const struct gp_pipeline *p, double *fwd_ms, double *bwd_ms)
{
    for (int k = 0; k < p->K; k++) {
        const struct stage *s = &p->stages[k];
        for (int i = s->plan.first; i < s->plan.last; i++) {
            fwd_ms[i] = s->fwd_ms[i - s->plan.first] / p->M;
            bwd_ms[i] = s->bwd_ms[i - s->plan.first] / p->M;
        }
    }
}

void gp_pipeline_report(const struct gp_pipeline *p, int k, struct gp_stage_report *r)
{
    const struct stage *s = &p->stages[k];
    memset(r, 0, sizeof *r);
    r->first_layer = s->plan.first;
    r->last_layer = s->plan.last;
    r->device = s->device;
    r->backend = s->ops->name;
    r->param_bytes = (int64_t)s->plan.param_bytes;
    r->grad_bytes = (int64_t)s->plan.param_bytes;
    r->optim_bytes = s->opt ? (int64_t)gp_optim_state_bytes(s->opt) : 0;
    /* The first stage's buffer of the next step's inputs (inputs_ahead.c) with its static blocks. */
    r->static_bytes = (int64_t)(k == 0 ? gp_pipe_ahead_device_bytes(p) : 0) +
                      (int64_t)(s->plan.static_bytes - s->plan.param_bytes + s->plan.step_bytes +
                                s->plan.step_grad_bytes + s->plan.shadow_bytes + s->plan.filter_bytes +
                                s->plan.filter_grad_bytes + s->optimizer_bytes);
    const struct gp_stage_slots *sl = &s->slots;
    r->frontier_boxes = sl->n_boxes;
    r->activation_sets = sl->n_sets;
    r->gradient_inboxes = sl->n_inboxes;
    r->arena_bytes = (int64_t)s->plan.arena_bytes;
    r->gradient_set_bytes = (int64_t)s->plan.grad_bytes;
    r->gradients_in_arena = s->plan.grads_share_arena;
    r->remade_values = s->remade_values;
    r->remade_saved_bytes = (int64_t)s->remade_saved_bytes;
    r->gradient_addends = gp_plan_addends(p->g, &s->plan);
    r->box_bytes = (int64_t)s->plan.box_bytes;
    r->set_bytes = (int64_t)s->plan.local_bytes;
    r->inbox_bytes = (int64_t)s->plan.inbox_bytes;
    r->activation_bytes = r->box_bytes * sl->n_boxes + r->set_bytes * sl->n_sets + r->inbox_bytes * sl->n_inboxes +
                          (int64_t)gp_plan_shared_bytes(&s->plan);
    /* The arena is held throughout; a gradient set sharing its block with it too. */
    r->activation_peak = s->peak + r->inbox_bytes * sl->n_inboxes +
                         (int64_t)(s->plan.grads_share_arena ? gp_plan_shared_bytes(&s->plan) : s->plan.arena_bytes);
    for (int q = 0; q < s->plan.n_frontier_in; q++)
        r->frontier_in_bytes += (int64_t)gp_plan_value_bytes(p->g, &s->plan, s->plan.frontier_in[q]);
    for (int q = 0; q < s->plan.n_frontier_out; q++)
        r->frontier_out_bytes += (int64_t)gp_plan_value_bytes(p->g, &s->plan, s->plan.frontier_out[q]);
    r->workspace_bytes = (int64_t)(align64(s->plan.scratch_bytes) + align64(s->plan.staging_bytes));
    r->input_rows_bytes = k == 0 && !s->inputs_inside ? (int64_t)(p->input_bytes * (size_t)p->M) : 0;
    r->inputs_ahead_bytes = k == 0 ? (int64_t)gp_pipe_ahead_device_bytes(p) : 0;
    r->inputs_ahead_bf16 = r->inputs_ahead_bytes && p->ahead_bf16;
    /* A local stage's: what was allocated, block by block (the figures
     * above leave out its targets, the libraries' workspace and the small
     * blocks); another process's: the sum of those figures. */
    r->planned_bytes = stage_local(p, k) && s->dev
                           ? (int64_t)gp_pipe_stage_allocated(p, k)
                           : r->param_bytes * 2 + r->optim_bytes + r->static_bytes + r->activation_bytes +
                                 r->workspace_bytes + r->input_rows_bytes;
}

gp_status gp_pipeline_reports(struct gp_pipeline *p, struct gp_stage_report *out, bool *known, struct gp_error *err)
{
    for (int k = 0; k < p->K; k++) {
        gp_pipeline_report(p, k, &out[k]);
        known[k] = stage_local(p, k);
    }
    return p->cfg.remote ? gp_pipe_remote_reports(p, out, known, err) : GP_OK;
}

gp_status gp_pipeline_write_trace(struct gp_pipeline *p, const char *path, struct gp_error *err)
{
    if (!p->cfg.trace) return gp_error_set(err, GP_ERR_INVALID, "the timeline was not recorded");
    struct gp_trace_stream streams[STAGE_STREAMS * 64];
    int n = 0;
    for (int k = 0; k < p->K && n + STAGE_STREAMS <= (int)(sizeof streams / sizeof *streams); k++) {
        if (!stage_local(p, k)) continue;
        struct stage *s = &p->stages[k];
        struct gp_stream *list[STAGE_STREAMS];
        const char *names[STAGE_STREAMS];
        int m = gp_pipe_stage_streams(s, list, names);
        for (int q = 0; q < m; q++) {
            int count = 0;
            const struct gp_trace_span *spans = s->ops->trace_spans(list[q], &count);
            streams[n++] = (struct gp_trace_stream){.device = s->device, .device_name = s->ops->name,
                                                    .stream_name = names[q], .spans = spans, .count = count};
        }
    }
    struct gp_trace_info info = {.pipeline_schedule = gp_pipe_schedule_name(p->sched.kind),
                                 .checkpoint = gp_checkpoint_name(p->sched.checkpoint),
                                 .stages = p->K,
                                 .micro_batches = p->M};
    /* Stages in other processes: this rank's own timeline (README, "Several
     * processes": one file per rank). */
    char rank_name[96];
    const struct gp_pipe_remote *r = p->cfg.remote;
    if (r) {
        info.rank = (r->replica > 0 ? r->replica : 0) * p->K + r->stage;
        snprintf(rank_name, sizeof rank_name, "rank %d (stage %d, replica %d)", info.rank, r->stage,
                 r->replica > 0 ? r->replica : 0);
        info.rank_name = rank_name;
    }
    return gp_trace_write_info(path, streams, n, &info, err);
}
