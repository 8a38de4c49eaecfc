/* The optimizer part of a training step: tied parameters' gradient sums,
 * gradient clipping, the updates and the step's guard against divergence.
 *
 * Scalars. Everything an update reads besides the tensors is one struct,
 * gp_optim_scalars (train/optim.h), in each stage's device memory
 * (stage.scalars). The host fills it for each step (gp_pipe_scalars_begin:
 * gp_optim_scalars_for, the double and float arithmetic of the updates on
 * the CPU, bias corrections included) in p->scalars_host, pinned where the
 * first stage's backend has pinned memory, and a copy takes it to the
 * device with the step's batch. The kernels read it when they run, not
 * when they are issued: a CUDA graph captured once replays every step with
 * that step's learning rate, bias corrections and clipping.
 *
 * The guard. The clipping coefficient is the one scalar made on the
 * device: gp_optim_guard's arithmetic (the backend's optim_guard) takes
 * the norm of every stage's per-parameter norms in the model's parameter
 * order, each parameter once (a tied one from its first holder), then
 * gp_clip_coef, and writes the coefficient into the scalars. It also
 * decides whether the step is applied at all, from the step's loss (the
 * loss sums of the last stage, added in micro-batch order and divided by
 * the denominator, as the host computes the loss it reports) and the norm:
 *
 * Divergence. Before, the trainer read the loss, refused to call the
 * optimizer on a loss that was not finite and stopped. With the optimizer
 * inside the step the update would have happened by the time the host sees
 * the loss, so the decision moved to the device: a step whose loss is not
 * finite (or, when clipping, whose gradient norm is not: PyTorch's
 * error_if_nonfinite) sets `skip`, and then the optimizer kernels change no
 * parameter and no optimizer state, and the deferred BatchNorm commit no
 * running statistic; the gradients are cleared as after any step, and the
 * host does not count the step (gp_pipe_optimizer_end). The pipeline's
 * weights stay those of the last finite step, which is what the old code
 * left, so whatever a caller reads or saves after a divergence holds no
 * NaN the old sequence would not have held; the trainer still stops there
 * with an error (train/trainer.c), saving nothing.
 *
 * Two routes, one arithmetic:
 *   on the devices (every stage in this process, gp_pipeline_train_step):
 *     issued onto the stages' compute streams right after the backward,
 *     inside the step's CUDA graph where there is one. Tied gradients are
 *     summed by copies: each other holder's gradient is copied to its
 *     first holder and added there, in stage order, and the sum copied
 *     back (tied.c's host sum, the same float additions). Each stage's
 *     norms are copied to the last stage, where the guard runs (the loss
 *     sums are there), and the guard's scalars are copied back to every
 *     stage before its update;
 *   through the host (gp_pipeline_optimize; across processes always): the
 *     replicas' and tied holders' sums over messages (buckets.c, tied.c),
 *     the norms gathered on the host (remote.c), gp_optim_guard there, and
 *     the scalars copied to each stage's device. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/internal.h"

static bool is_param(const struct gp_pipeline *p, int k, int v)
{
    return p->stages[k].plan.home[v] == GP_HOME_STATIC && p->g->values[v].kind == GP_VALUE_PARAMETER;
}

/* Stage k's norms are its parameters' in value order (stage.c), at
 * norm_base[k] among all stages'; the model's parameters in value order
 * read theirs from their first holder. */
static gp_status plan_norms(struct gp_pipeline *p, struct gp_error *err)
{
    const struct gp_graph *g = p->g;
    p->norm_base = calloc((size_t)p->K + 1, sizeof(int));
    p->norm_order = calloc((size_t)g->n_values + 1, sizeof(int32_t));
    int *where = malloc(sizeof(int) * ((size_t)g->n_values + 1));
    if (!p->norm_base || !p->norm_order || !where) {
        free(where);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    }
    int total = 0;
    for (int k = 0; k < p->K; k++) {
        p->norm_base[k] = total;
        for (int v = 0; v < g->n_values; v++) total += is_param(p, k, v);
    }
    p->n_norm_slots = total;
    for (int v = 0; v < g->n_values; v++) where[v] = -1;
    for (int k = p->K - 1; k >= 0; k--)
        for (int v = 0, i = p->norm_base[k]; v < g->n_values; v++)
            if (is_param(p, k, v)) where[v] = i++;
    for (int v = 0; v < g->n_values; v++)
        if (where[v] >= 0) p->norm_order[p->n_norms++] = where[v];
    free(where);
    return GP_OK;
}

/* Device memory of stage s for the optimizer, counted in its report. */
static gp_status stage_buffer(struct stage *s, int k, size_t bytes, const char *what, unsigned char **out,
                              struct gp_error *err)
{
    *out = s->ops->alloc(s->dev, bytes ? bytes : 64);
    if (!*out)
        return gp_error_set(err, GP_ERR_NOMEM, "stage %d: out of memory on %s:%d for %s (%.1f MiB)", k, s->ops->name,
                            s->device, what, (double)bytes / (1 << 20));
    s->optimizer_bytes += align64(bytes ? bytes : 64);
    return GP_OK;
}

gp_status gp_pipe_optimizer_plan(struct gp_pipeline *p, struct gp_error *err)
{
    GP_TRY(plan_norms(p, err));
    const struct gp_device_ops *ops0 = p->stages[0].ops;
    size_t bytes = sizeof(struct gp_optim_scalars);
    p->scalars_pinned = ops0->host_alloc != NULL && stage_local(p, 0);
    p->scalars_host = p->scalars_pinned ? ops0->host_alloc(bytes) : malloc(bytes);
    p->scalars_out = p->scalars_pinned ? ops0->host_alloc(bytes) : malloc(bytes);
    p->optimizer_tasks = calloc((size_t)p->n_tied + 1, sizeof *p->optimizer_tasks);
    if (!p->scalars_host || !p->scalars_out || !p->optimizer_tasks)
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory for the optimizer's scalars");
    memset(p->scalars_host, 0, bytes);
    memset(p->scalars_out, 0, bytes);
    /* Across processes the optimizer goes through the host. */
    if (p->cfg.remote) return GP_OK;

    int R = p->K - 1;
    struct stage *root = &p->stages[R];
    GP_TRY(stage_buffer(root, R, sizeof(float) * (size_t)p->n_norm_slots, "the gathered gradient norms",
                        &root->norms_all, err));
    GP_TRY(stage_buffer(root, R, sizeof(int32_t) * (size_t)p->n_norms, "the gradient norms' order",
                        &root->norm_order, err));
    struct gp_task_tag tag = tag_of(GP_TASK_COPY, R, -1, "load the gradient norms' order");
    if (p->n_norms) {
        root->ops->copy(root->compute, root->norm_order, p->norm_order, sizeof(int32_t) * (size_t)p->n_norms, &tag);
        GP_TRY(root->ops->stream_synchronize(root->compute, err));
    }
    for (int k = 0; k < p->K; k++) {
        struct stage *s = &p->stages[k];
        int64_t most = 0;
        for (int t = 0; t < p->n_tied; t++)
            if (p->tied[t].holders[0] == k && p->tied[t].numel > most) most = p->tied[t].numel;
        if (most)
            GP_TRY(stage_buffer(s, k, sizeof(float) * (size_t)most, "summing tied parameters' gradients",
                                &s->tied_scratch, err));
        struct gp_event **events[4] = {&s->grads_final, &s->tied_done, &s->ready, &s->guard_done};
        for (int e = 0; e < 4; e++) GP_TRY(s->ops->event_create(s->dev, events[e], err));
    }
    return GP_OK;
}

void gp_pipe_optimizer_free(struct gp_pipeline *p)
{
    if (p->stages && p->K > 0 && p->stages[0].ops) {
        const struct gp_device_ops *ops0 = p->stages[0].ops;
        if (p->scalars_pinned) {
            ops0->host_free(p->scalars_host);
            ops0->host_free(p->scalars_out);
        } else {
            free(p->scalars_host);
            free(p->scalars_out);
        }
    }
    p->scalars_host = p->scalars_out = NULL;
    free(p->norm_base);
    free(p->norm_order);
    free(p->optimizer_tasks);
    p->norm_base = NULL;
    p->norm_order = NULL;
    p->optimizer_tasks = NULL;
}

void gp_pipe_scalars_begin(struct gp_pipeline *p, double lr, double clip_norm, double denominator)
{
    gp_optim_scalars_for(&p->cfg.optim, lr, gp_pipeline_optim_steps(p) + 1, p->scalars_host);
    p->scalars_host->max_norm = clip_norm > 0 ? clip_norm : 0;
    p->scalars_host->denominator = denominator;
}

void gp_pipe_optimizer_end(struct gp_pipeline *p, struct gp_step_outcome *out)
{
    const struct gp_optim_scalars *s = p->scalars_out;
    if (out) {
        out->applied = !s->skip;
        out->grad_norm = s->total_norm;
    }
    if (s->skip) return;
    p->optim_steps++;
    for (int k = 0; k < p->K; k++)
        if (stage_local(p, k) && p->stages[k].opt) p->stages[k].opt->steps++;
}

/* The per-stage task slots of the optimizer and of the norms (pipeline.c
 * lays out p->tasks: actions, then K optimizer, K evaluation, K norms). */
static struct task *stage_task(struct gp_pipeline *p, int k, enum task_kind kind)
{
    int slot = p->sched.n_actions + (kind == TASK_OPTIMIZE ? 0 : 2 * p->K) + k;
    struct task *t = &p->tasks[slot];
    *t = (struct task){.p = p, .stage = k, .micro = -1, .kind = kind};
    return t;
}

static float *param_grad(struct stage *s, int v) { return (float *)(s->param_grads + s->plan.off[v]); }

/* Tied parameters' gradients summed on the devices: every holder records
 * that its gradients are final; each first holder copies the others'
 * gradient of each of its tied parameters, in stage order, into its
 * scratch and adds it to its own (g0 + g1) + g2 ...; the other holders
 * copy the sum back once their first holder is done. Every wait is on an
 * event recorded in an earlier phase, so no stream waits on one that waits
 * on it. A holder's gradient is read by its first holder before the holder
 * overwrites it with the sum, and the sum is read before its first holder
 * scales or clears it (the guard waits for every stage: below). */
static void issue_tied_sums(struct gp_pipeline *p)
{
    for (int k = 0; k < p->K; k++) p->stages[k].ops->event_record(p->stages[k].grads_final, p->stages[k].compute);
    for (int t = 0; t < p->n_tied; t++) {
        const struct gp_pipe_tied *tp = &p->tied[t];
        int h0 = tp->holders[0];
        struct stage *first = &p->stages[h0];
        struct task *add = &p->optimizer_tasks[t];
        *add = (struct task){.p = p, .stage = h0, .micro = t, .kind = TASK_TIED_ADD};
        struct gp_task_tag ctag = tag_of(GP_TASK_COPY, h0, -1, "gather tied gradient");
        struct gp_task_tag atag = tag_of(GP_TASK_OPTIMIZER, h0, -1, "sum tied gradients");
        for (int i = 1; i < tp->n; i++) {
            struct stage *h = &p->stages[tp->holders[i]];
            first->ops->stream_wait(first->compute, h->grads_final);
            first->ops->copy(first->compute, first->tied_scratch, param_grad(h, tp->value),
                             sizeof(float) * (size_t)tp->numel, &ctag);
            first->ops->enqueue(first->compute, gp_pipe_task_run, add, &atag);
        }
    }
    for (int k = 0; k < p->K; k++) p->stages[k].ops->event_record(p->stages[k].tied_done, p->stages[k].compute);
    for (int t = 0; t < p->n_tied; t++) {
        const struct gp_pipe_tied *tp = &p->tied[t];
        struct stage *first = &p->stages[tp->holders[0]];
        for (int i = 1; i < tp->n; i++) {
            struct stage *h = &p->stages[tp->holders[i]];
            struct gp_task_tag tag = tag_of(GP_TASK_COPY, tp->holders[i], -1, "tied gradient sum back");
            h->ops->stream_wait(h->compute, first->tied_done);
            h->ops->copy(h->compute, param_grad(h, tp->value), param_grad(first, tp->value),
                         sizeof(float) * (size_t)tp->numel, &tag);
        }
    }
}

void gp_pipe_issue_optimizer(struct gp_pipeline *p)
{
    int R = p->K - 1;
    struct stage *root = &p->stages[R];
    bool clip = p->scalars_host->max_norm > 0;
    if (p->n_tied) issue_tied_sums(p);
    /* Clipping: each stage's norms (of its summed gradients) to the last
     * stage. The guard waits for every stage when it reads their norms, or
     * when tied sums read one stage's gradients from another (a first
     * holder's update must wait for the copies of its sum); otherwise only
     * for the last stage's own loss, and the other stages' updates start
     * as soon as their backward and the guard are done. */
    bool barrier = clip || p->n_tied;
    for (int k = 0; k < p->K; k++) {
        struct stage *s = &p->stages[k];
        if (clip && s->n_params) {
            struct gp_task_tag tag = tag_of(GP_TASK_OPTIMIZER, k, -1, "gradient norms");
            s->ops->enqueue(s->compute, gp_pipe_task_run, stage_task(p, k, TASK_NORMS), &tag);
            struct gp_task_tag ctag = tag_of(GP_TASK_COPY, k, -1, "gather gradient norms");
            s->ops->copy(s->compute, root->norms_all + sizeof(float) * (size_t)p->norm_base[k], s->norms,
                         sizeof(float) * (size_t)s->n_params, &ctag);
        }
        if (k != R && barrier) s->ops->event_record(s->ready, s->compute);
    }
    for (int k = 0; k < R && barrier; k++) root->ops->stream_wait(root->compute, p->stages[k].ready);
    struct task *guard = &p->optimizer_tasks[p->n_tied];
    *guard = (struct task){.p = p, .stage = R, .micro = -1, .kind = TASK_GUARD};
    struct gp_task_tag gtag = tag_of(GP_TASK_OPTIMIZER, R, -1, "clipping and divergence guard");
    root->ops->enqueue(root->compute, gp_pipe_task_run, guard, &gtag);
    if (R > 0) root->ops->event_record(root->guard_done, root->compute);
    for (int k = 0; k < p->K; k++) {
        struct stage *s = &p->stages[k];
        if (k != R) {
            struct gp_task_tag tag = tag_of(GP_TASK_COPY, k, -1, "the step's optimizer scalars");
            s->ops->stream_wait(s->compute, root->guard_done);
            s->ops->copy(s->compute, s->scalars, root->scalars, sizeof(struct gp_optim_scalars), &tag);
        }
        struct gp_task_tag tag = tag_of(GP_TASK_OPTIMIZER, k, -1, "optimizer");
        s->ops->enqueue(s->compute, gp_pipe_task_run, stage_task(p, k, TASK_OPTIMIZE), &tag);
    }
}

/* ---- through the host ---- */

/* Every stage's parameter norms (of its summed gradients) on the host,
 * stage k's at norm_base[k] of p->norms_host. Across processes every
 * stage's are gathered on each process (every rank computes the same
 * coefficient); replicas' gradients are already summed, so each replica
 * computes the same too. */
static gp_status host_norms(struct gp_pipeline *p, struct gp_error *err)
{
    int *count = calloc((size_t)p->K, sizeof(int));
    if (!count) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    for (int k = 0; k < p->K; k++) {
        count[k] = (k + 1 < p->K ? p->norm_base[k + 1] : p->n_norm_slots) - p->norm_base[k];
        if (!stage_local(p, k)) continue;
        struct stage *s = &p->stages[k];
        struct gp_task_tag tag = tag_of(GP_TASK_OPTIMIZER, k, -1, "gradient norms");
        s->ops->enqueue(s->compute, gp_pipe_task_run, stage_task(p, k, TASK_NORMS), &tag);
        struct gp_task_tag ctag = tag_of(GP_TASK_COPY, k, -1, "read gradient norms");
        s->ops->copy(s->compute, p->norms_host + p->norm_base[k], s->norms, sizeof(float) * (size_t)s->n_params,
                     &ctag);
    }
    gp_status st = gp_pipe_sync_all(p, err);
    if (st == GP_OK && p->cfg.remote) st = gp_pipe_remote_norms(p, p->norms_host, p->norm_base, count, err);
    free(count);
    return st;
}

/* Data parallelism: the local stage's parameter gradients, and its deferred
 * BatchNorm statistics, become their sums over the stage's replicas (the
 * same bits on each, so the replicas step alike and stay equal). Between
 * steps: the step waited for its streams, the optimizer is not yet issued.
 * The buffers are the stage's device memory, which for stages in other
 * processes is the host's (a CPU device). Each parameter's gradient is the
 * replicas' partial sums added in replica order, g = (G0 + G1) + ..., where
 * one pipeline over all the micro-batches accumulates them one after the
 * other: the same terms, another rounding (README, "Several processes"). */
static gp_status sum_replicas(struct gp_pipeline *p, struct gp_error *err)
{
    const struct gp_pipe_remote *r = p->cfg.remote;
    struct stage *s = &p->stages[r->stage];
    /* Every parameter gradient is float32 (fp32 master weights), padding
     * zero; already summed where buckets overlapped it with the backward. */
    /* GPU stages sum device memory over their own link (NCCL). */
    gp_status (*f32)(void *, float *, size_t, struct gp_error *) = r->device_sum_f32 ? r->device_sum_f32 : r->sum_f32;
    gp_status (*f64)(void *, double *, size_t, struct gp_error *) = r->device_sum_f64 ? r->device_sum_f64 : r->sum_f64;
    if (s->plan.param_bytes && !gp_pipe_buckets_on(p))
        GP_TRY(f32(r->ctx, (float *)s->param_grads, s->plan.param_bytes / sizeof(float), err));
    for (int i = s->plan.first; s->bn_stats && i < s->plan.last; i++) {
        double *stats = s->bn_stats[i - s->plan.first];
        if (stats) GP_TRY(f64(r->ctx, stats, s->cops->bn_stats_len(p->g, &p->g->nodes[i]), err));
    }
    return GP_OK;
}

gp_status gp_pipeline_optimize(struct gp_pipeline *p, double lr, double clip_norm, struct gp_step_outcome *out,
                               struct gp_error *err)
{
    gp_pipe_scalars_begin(p, lr, clip_norm, p->denominator);
    if (gp_pipe_replicas(p) > 1) {
        gp_status st = sum_replicas(p, err);
        if (st != GP_OK) {
            gp_error_prefix(err, "stage %d, replica %d: summing gradients over %d replicas: ", p->cfg.remote->stage,
                            p->cfg.remote->replica, gp_pipe_replicas(p));
            return st;
        }
    }
    /* Tied copies' gradients after the replicas' sums: each holder's own
     * gradient is whole (every replica's) before the holders add theirs. */
    if (p->n_tied) GP_TRY(gp_pipe_tied_sum(p, err));
    if (clip_norm > 0) GP_TRY(host_norms(p, err));
    /* Every process knows every replica's losses and every stage's norms:
     * all decide alike. */
    gp_optim_guard(p->norms_host, p->norm_order, p->n_norms, p->loss_parts, p->M * gp_pipe_replicas(p),
                   p->scalars_host);
    for (int k = 0; k < p->K; k++) {
        if (!stage_local(p, k)) continue;
        struct stage *s = &p->stages[k];
        struct gp_task_tag ctag = tag_of(GP_TASK_COPY, k, -1, "the step's optimizer scalars");
        s->ops->copy(s->compute, s->scalars, p->scalars_host, sizeof(struct gp_optim_scalars), &ctag);
        struct gp_task_tag tag = tag_of(GP_TASK_OPTIMIZER, k, -1, "optimizer");
        s->ops->enqueue(s->compute, gp_pipe_task_run, stage_task(p, k, TASK_OPTIMIZE), &tag);
    }
    GP_TRY(gp_pipe_sync_all(p, err));
    memcpy(p->scalars_out, p->scalars_host, sizeof *p->scalars_out);
    gp_pipe_optimizer_end(p, out);
    return GP_OK;
}
