/* The training step as one CUDA graph: captured at the second step (the
 * first runs eagerly, so lazy initializations stay outside), every stream
 * forked from the first stage's compute stream and joined back to it, and
 * replayed after with what changes between steps (the batch, its targets,
 * the step number the dropout masks are keyed by, and the optimizer's
 * scalars: learning rate, bias corrections, max_norm) copied from pinned
 * staging into the fixed device buffers the graph reads. With
 * gp_pipeline_train_step the graph holds the optimizer too (optimizer.c):
 * tied sums, norms, the guard that computes the clipping coefficient and
 * whether the step diverged, the updates, the gradients cleared; one
 * launch per step, and only the losses and the guard's result come back. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/internal.h"

/* CUDA graphs where every stage's backend can capture and nothing needs
 * the host inside the step (timelines, layer timing): pinned staging and
 * the fork and join events. Without them the pipeline runs eagerly and
 * graph_note says why. */
gp_status gp_pipe_setup_graphs(struct gp_pipeline *p, struct gp_error *err)
{
    if (!p->cfg.cuda_graph) return GP_OK;
    const char *why = NULL;
    /* Messages between processes wait on the host inside the step, and
     * the optimizer's sums over replicas and tied holders, and the norms,
     * go through it: neither the step nor the optimizer can be captured. */
    if (p->cfg.remote)
        why = "stages in other processes exchange frontiers, sums and norms through the host, so the step and "
              "its optimizer run eagerly";
    for (int k = 0; k < p->K && !why; k++)
        if (!p->stages[k].ops->capture_begin || !p->stages[k].ops->host_alloc)
            why = "a stage's backend has no graphs";
    if (!why && p->cfg.trace) why = "--trace records each step as it runs";
    if (!why && p->cfg.time_layers) why = "layer timing waits for each layer";
    if (why) {
        snprintf(p->graph_note, sizeof p->graph_note, "CUDA graphs are off: %s", why);
        return GP_OK;
    }
    const struct gp_device_ops *ops = p->stages[0].ops;
    p->x_host = ops->host_alloc(p->input_bytes * (size_t)p->M);
    p->t_host = p->target_bytes ? ops->host_alloc(p->target_bytes * (size_t)p->M) : NULL;
    p->loss_host = ops->host_alloc(sizeof(double) * (size_t)p->M);
    p->step_host = ops->host_alloc(sizeof(uint64_t));
    if (!p->x_host || (p->target_bytes && !p->t_host) || !p->loss_host || !p->step_host)
        return gp_error_set(err, GP_ERR_NOMEM, "out of pinned host memory for the CUDA graph's staging");
    GP_TRY(ops->event_create(p->stages[0].dev, &p->fork, err));
    p->joins = calloc((size_t)(STAGE_STREAMS * p->K), sizeof *p->joins);
    if (!p->joins) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    for (int k = 0; k < p->K; k++) {
        struct stage *s = &p->stages[k];
        struct gp_stream *list[STAGE_STREAMS];
        int n = gp_pipe_stage_streams(s, list, NULL);
        for (int q = 0; q < n; q++) GP_TRY(s->ops->event_create(s->dev, &p->joins[p->n_joins++], err));
    }
    p->graph_ok = true;
    return GP_OK;
}

/* Every stream of every stage (with its stage), for forking a capture out
 * of the origin and joining it back. */
static int all_streams(struct gp_pipeline *p, struct gp_stream **out, struct stage **owner)
{
    int n = 0;
    for (int k = 0; k < p->K; k++) {
        struct stage *s = &p->stages[k];
        struct gp_stream *list[STAGE_STREAMS];
        int m = gp_pipe_stage_streams(s, list, NULL);
        for (int q = 0; q < m; q++) owner[n] = s, out[n++] = list[q];
    }
    return n;
}

/* Records the step's actions (and the optimizer after them) as one graph:
 * every stream joins the capture from the first stage's compute stream (the
 * origin) and joins back at the end. On failure the streams are left usable
 * and the reason is kept. */
static gp_status capture_step(struct gp_pipeline *p, bool optimizer, struct gp_error *err)
{
    struct stage *fs = &p->stages[0];
    struct gp_stream **streams = malloc(sizeof *streams * (size_t)(STAGE_STREAMS * p->K));
    struct stage **owner = malloc(sizeof *owner * (size_t)(STAGE_STREAMS * p->K));
    if (!streams || !owner) {
        free(streams);
        free(owner);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    }
    int n = all_streams(p, streams, owner);
    gp_status st = fs->ops->capture_begin(fs->compute, err);
    if (st != GP_OK) {
        free(streams);
        free(owner);
        return st;
    }
    fs->ops->event_record(p->fork, fs->compute);
    for (int i = 0; i < n; i++)
        if (streams[i] != fs->compute) owner[i]->ops->stream_wait(streams[i], p->fork);
    gp_pipe_issue_actions(p);
    if (optimizer) gp_pipe_issue_optimizer(p);
    for (int i = 0; i < n; i++) {
        if (streams[i] == fs->compute) continue;
        owner[i]->ops->event_record(p->joins[i], streams[i]);
        fs->ops->stream_wait(fs->compute, p->joins[i]);
    }
    st = fs->ops->capture_end(fs->compute, &p->graph, err);
    if (st != GP_OK) {
        /* Clear what the failed capture left on the streams. */
        struct gp_error ignored = {0};
        for (int i = 0; i < n; i++) (void)owner[i]->ops->stream_synchronize(streams[i], &ignored);
    }
    free(streams);
    free(owner);
    if (st != GP_OK) return st;
    p->graph_seed = p->opts.seed;
    p->graph_ratio = p->opts.dropout_ratio;
    p->graph_denominator = p->denominator;
    p->graph_optimizer = optimizer;
    p->graph_clip = optimizer && p->scalars_host->max_norm > 0;
    return GP_OK;
}

/* The step as a replayed graph: the batch, its targets, the step number
 * and (with the optimizer) the step's scalars copied from pinned staging
 * into the fixed device buffers the graph reads, the graph launched on the
 * origin stream, the losses (and the guard's result) copied back. What the
 * graph bakes in (the dropout seed and ratio, the loss's denominator,
 * whether it holds the optimizer and whether that clips) makes a new
 * capture when it changes; the learning rate and max_norm are read from
 * device memory. false when the graph could not be made (p->graph_note
 * says why): the caller runs the step eagerly. */
bool gp_pipe_step_graph(struct gp_pipeline *p, const void *x, const void *targets, bool optimizer, gp_status *st,
                        struct gp_error *err)
{
    struct stage *fs = &p->stages[0], *ls = &p->stages[p->K - 1];
    const struct gp_device_ops *ops = fs->ops;
    /* Pinned batches (gp_pipeline_host_alloc) are copied as they lie;
     * others through the staging buffers. */
    size_t xb = p->input_bytes * (size_t)p->M, tb = p->target_bytes * (size_t)p->M;
    const void *xs = x, *ts = targets;
    if (!gp_pipe_pinned(p, x, xb)) memcpy(p->x_host, x, xb), xs = p->x_host;
    if (tb && !gp_pipe_pinned(p, targets, tb)) memcpy(p->t_host, targets, tb), ts = p->t_host;
    *p->step_host = p->opts.step;
    struct gp_task_tag tag = tag_of(GP_TASK_COPY, 0, -1, "load inputs");
    gp_pipe_inputs_load(p, x, xs, xb, &tag);
    if (tb) ops->copy(fs->compute, ls->targets, ts, tb, &tag);
    for (int k = 0; k < p->K; k++) ops->copy(fs->compute, p->stages[k].step_dev, p->step_host, sizeof(uint64_t), &tag);
    /* The last stage's guard completes the scalars and hands them on. */
    if (optimizer) ops->copy(fs->compute, ls->scalars, p->scalars_host, sizeof(struct gp_optim_scalars), &tag);
    bool clip = optimizer && p->scalars_host->max_norm > 0;
    if (p->graph && (p->graph_seed != p->opts.seed || p->graph_ratio != p->opts.dropout_ratio ||
                     p->graph_denominator != p->denominator || p->graph_optimizer != optimizer ||
                     p->graph_clip != clip)) {
        ops->graph_destroy(p->graph);
        p->graph = NULL;
    }
    if (!p->graph) {
        struct gp_error cerr = {0};
        if (capture_step(p, optimizer, &cerr) != GP_OK) {
            snprintf(p->graph_note, sizeof p->graph_note, "the step could not be captured as a CUDA graph (%s): "
                     "running it eagerly", cerr.msg);
            p->graph_ok = false;
            return false;
        }
    }
    ops->graph_launch(p->graph, fs->compute);
    tag = tag_of(GP_TASK_COPY, p->K - 1, -1, "read losses");
    ops->copy(fs->compute, p->loss_host, ls->loss_sums, sizeof(double) * (size_t)p->M, &tag);
    if (optimizer) {
        tag = tag_of(GP_TASK_COPY, p->K - 1, -1, "read the guard's result");
        ops->copy(fs->compute, p->scalars_out, ls->scalars, sizeof(struct gp_optim_scalars), &tag);
    }
    /* The next step's inputs, once this step runs (the host may round
     * them first: inputs_ahead.c). */
    gp_pipe_inputs_ahead(p, xb);
    *st = gp_pipe_sync_all(p, err);
    if (*st == GP_OK) memcpy(p->loss_parts, p->loss_host, sizeof(double) * (size_t)p->M);
    return true;
}

void gp_pipe_free_graphs(struct gp_pipeline *p)
{
    if (p->stages && p->K > 0 && p->stages[0].ops) {
        const struct gp_device_ops *ops = p->stages[0].ops;
        if (p->graph) ops->graph_destroy(p->graph);
        if (ops->host_free) {
            ops->host_free(p->x_host);
            ops->host_free(p->t_host);
            ops->host_free(p->loss_host);
            ops->host_free(p->step_host);
        }
        if (p->fork) ops->event_destroy(p->fork);
    }
    for (int i = 0; p->joins && i < p->n_joins; i++)
        if (p->joins[i]) p->stages[0].ops->event_destroy(p->joins[i]);
    free(p->joins);
}
