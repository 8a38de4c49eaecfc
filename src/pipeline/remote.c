/* Stages in other processes (cfg.remote): the frontier copies of the
 * in-process pipeline become messages, sent and received by tasks on the
 * local stage's own streams at the points where the copies and their waits
 * would be issued (pipeline.c):
 *
 *   forward   stage k's copy stream to the next sends micro-batch j's output
 *             frontier once its forward is done (fwd_done[j]); stage k+1's
 *             compute stream receives it into j's box right before its
 *             forward of j (the backward that last read that box ran
 *             before it on the same stream);
 *   backward  stage k's copy stream to the previous sends the input
 *             frontier's gradients once its backward of j is done; stage
 *             k-1's compute stream receives them into j's inbox right
 *             before its backward of j.
 *
 * Both sides walk the same lists in the same order: the sender's frontier
 * (its plan and the receiver's are both known here: every process plans
 * every stage, and allocates only its own), each value one message of its
 * stored bytes. A stage's sends and receives of one kind run on one stream
 * each, in micro-batch order on both sides, so one tag per kind suffices:
 * messages of one tag between two stages arrive in the order sent.
 *
 * Data-parallel replicas (r->replicas > 1) are whole copies of this
 * exchange, each among its own replica's stages; they meet only in the
 * sums over a stage's replicas (the losses here, gradients and deferred
 * BatchNorm statistics in pipeline.c). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/internal.h"

enum {
    TAG_ACTIVATIONS = GP_PIPE_TAG_ACTIVATIONS,
    TAG_GRADIENTS = GP_PIPE_TAG_GRADIENTS,
    TAG_LOSSES = GP_PIPE_TAG_LOSSES,
    TAG_READ = GP_PIPE_TAG_READ,
    TAG_NORMS = GP_PIPE_TAG_NORMS,
    TAG_OUTPUTS = GP_PIPE_TAG_OUTPUTS,
    TAG_REPORT = GP_PIPE_TAG_REPORT,
    TAG_TEXT = GP_PIPE_TAG_TEXT,
};

static gp_status send_to(struct gp_pipeline *p, int to, int tag, const void *buf, size_t bytes, struct gp_error *err)
{
    const struct gp_pipe_remote *r = p->cfg.remote;
    return r->send(r->ctx, to, tag, buf, bytes, err);
}

static gp_status recv_from(struct gp_pipeline *p, int from, int tag, void *buf, size_t bytes, struct gp_error *err)
{
    const struct gp_pipe_remote *r = p->cfg.remote;
    return r->recv(r->ctx, from, tag, buf, bytes, err);
}

/* A frontier value: on GPU stages the device link enqueues it on the
 * running task's stream; on CPU stages the message moves now. */
static gp_status frontier_send(struct gp_pipeline *p, int to, int tag, const void *buf, size_t bytes,
                               struct gp_error *err)
{
    const struct gp_pipe_remote *r = p->cfg.remote;
    if (r->device_send) return r->device_send(r->ctx, to, buf, bytes, err);
    return send_to(p, to, tag, buf, bytes, err);
}

static gp_status frontier_recv(struct gp_pipeline *p, int from, int tag, void *buf, size_t bytes,
                               struct gp_error *err)
{
    const struct gp_pipe_remote *r = p->cfg.remote;
    if (r->device_recv) return r->device_recv(r->ctx, from, buf, bytes, err);
    return recv_from(p, from, tag, buf, bytes, err);
}

gp_status gp_pipe_remote_task(struct task *t, struct gp_error *err)
{
    struct gp_pipeline *p = t->p;
    const struct gp_graph *g = p->g;
    int k = t->stage, j = t->micro;
    struct stage *s = &p->stages[k];
    gp_status st = GP_OK;
    switch (t->kind) {
    case TASK_SEND_ACTIVATIONS:
        for (int q = 0; q < s->plan.n_frontier_out && st == GP_OK; q++) {
            int v = s->plan.frontier_out[q];
            st = frontier_send(p, k + 1, TAG_ACTIVATIONS, addr(s, v, s->slots.box[j], s->slots.fwd_set[j]),
                         gp_plan_value_bytes(g, &s->plan, v), err);
        }
        break;
    case TASK_RECV_ACTIVATIONS: {
        const struct stage *from = &p->stages[k - 1];
        for (int q = 0; q < from->plan.n_frontier_out && st == GP_OK; q++) {
            int v = from->plan.frontier_out[q];
            st = frontier_recv(p, k - 1, TAG_ACTIVATIONS, addr(s, v, s->slots.box[j], 0),
                           gp_plan_value_bytes(g, &from->plan, v), err);
        }
        break;
    }
    case TASK_SEND_GRADIENTS: {
        const struct stage *to = &p->stages[k - 1];
        for (int q = 0; q < s->plan.n_frontier_in && st == GP_OK; q++) {
            int v = s->plan.frontier_in[q];
            if (to->plan.inbox_off[v] == SIZE_MAX) continue;
            /* A gradient is stored as its value. */
            st = frontier_send(p, k - 1, TAG_GRADIENTS, s->grads + s->plan.grad_off[v], gp_plan_value_bytes(g, &s->plan, v),
                         err);
        }
        break;
    }
    case TASK_RECV_GRADIENTS: {
        const struct stage *from = &p->stages[k + 1];
        for (int q = 0; q < from->plan.n_frontier_in && st == GP_OK; q++) {
            int v = from->plan.frontier_in[q];
            if (s->plan.inbox_off[v] == SIZE_MAX) continue;
            st = frontier_recv(p, k + 1, TAG_GRADIENTS, inbox_of(s, j) + s->plan.inbox_off[v],
                           gp_plan_value_bytes(g, &from->plan, v), err);
        }
        break;
    }
    default:
        return gp_error_set(err, GP_ERR_INVALID, "stage %d: not a frontier task", k);
    }
    if (st != GP_OK) gp_error_prefix(err, "stage %d, micro-batch %d: ", k, j);
    return st;
}

/* With replicas, the last stages first exchange their micro-batches' loss
 * sums: each holds its own M at its share's place and zeros elsewhere, and
 * the sum over replicas (x + 0 is x, exactly) leaves every one holding all
 * replicas x M of them, in the mini-batch's order. */
gp_status gp_pipe_remote_losses(struct gp_pipeline *p, struct gp_error *err)
{
    const struct gp_pipe_remote *r = p->cfg.remote;
    int me = r->stage, last = p->K - 1, replicas = r->replicas > 1 ? r->replicas : 1;
    size_t n = (size_t)p->M * (size_t)replicas, bytes = sizeof(double) * n;
    if (me != last) return recv_from(p, last, TAG_LOSSES, p->loss_parts, bytes, err);
    if (replicas > 1) {
        size_t from = (size_t)r->replica * (size_t)p->M, to = from + (size_t)p->M;
        for (size_t i = 0; i < n; i++)
            if (i < from || i >= to) p->loss_parts[i] = 0;
        gp_status st = r->sum_f64(r->ctx, p->loss_parts, n, err);
        if (st != GP_OK) {
            gp_error_prefix(err, "stage %d, replica %d: gathering the replicas' losses: ", me, r->replica);
            return st;
        }
    }
    for (int k = 0; k < last; k++) GP_TRY(send_to(p, k, TAG_LOSSES, p->loss_parts, bytes, err));
    return GP_OK;
}

gp_status gp_pipe_remote_read(struct gp_pipeline *p, int value, float *out, struct gp_error *err)
{
    const struct gp_value *v = &p->g->values[value];
    int holder = -1;
    for (int k = 0; k < p->K && holder < 0; k++)
        if (p->stages[k].plan.home[value] == GP_HOME_STATIC) holder = k;
    if (holder < 0) return gp_error_set(err, GP_ERR_INVALID, "value '%s' is not held by any stage", v->name);
    if (!gp_dtype_is_float(v->dtype))
        return gp_error_set(err, GP_ERR_INVALID, "value '%s' is %s, not float", v->name, gp_dtype_name(v->dtype));
    int me = p->cfg.remote->stage;
    /* Replicas hold the same parameters: replica 0's go to its stage 0.
     * BatchNorm's running statistics (without deferred statistics) are
     * each replica's own, from its own micro-batches: replica 0's are read. */
    if (p->cfg.remote->replica > 0) return GP_OK;
    size_t bytes = sizeof(float) * (size_t)gp_shape_numel(&v->shape);
    if (me == holder) {
        struct stage *s = &p->stages[me];
        struct gp_task_tag tag = tag_of(GP_TASK_COPY, me, -1, "read parameter");
        s->ops->copy(s->compute, out, s->static_block + s->plan.off[value], bytes, &tag);
        GP_TRY(s->ops->stream_synchronize(s->compute, err));
        if (me != 0) GP_TRY(send_to(p, 0, TAG_READ, out, bytes, err));
    } else if (me == 0) {
        GP_TRY(recv_from(p, holder, TAG_READ, out, bytes, err));
    }
    return GP_OK;
}

/* Saved states: a parameter's optimizer state, its first holder's (tied
 * copies step alike on the same summed gradients, so every holder has the
 * same bits), read to stage 0's process of replica 0 as values are. */
gp_status gp_pipe_remote_read_optim(struct gp_pipeline *p, int value, int slot, float *out, struct gp_error *err)
{
    const struct gp_value *v = &p->g->values[value];
    int holder = -1;
    for (int k = 0; k < p->K && holder < 0; k++)
        if (p->stages[k].plan.home[value] == GP_HOME_STATIC) holder = k;
    if (holder < 0 || v->kind != GP_VALUE_PARAMETER)
        return gp_error_set(err, GP_ERR_INVALID, "'%s' is not a parameter of any stage", v->name);
    int me = p->cfg.remote->stage;
    if (p->cfg.remote->replica > 0) return GP_OK;
    size_t bytes = sizeof(float) * (size_t)gp_shape_numel(&v->shape);
    if (me == holder) {
        struct stage *s = &p->stages[me];
        int i = 0;
        while (i < s->n_params && s->param_values[i] != value) i++;
        if (!s->opt || i == s->n_params)
            return gp_error_set(err, GP_ERR_INVALID, "stage %d holds no optimizer state of '%s'", me, v->name);
        struct gp_task_tag tag = tag_of(GP_TASK_COPY, me, -1, "read optimizer state");
        s->ops->copy(s->compute, out, s->opt->state[slot][i], bytes, &tag);
        GP_TRY(s->ops->stream_synchronize(s->compute, err));
        if (me != 0) GP_TRY(send_to(p, 0, TAG_READ, out, bytes, err));
    } else if (me == 0) {
        GP_TRY(recv_from(p, holder, TAG_READ, out, bytes, err));
    }
    return GP_OK;
}

/* Clipping across processes: every stage but the first sends its
 * parameters' norms to stage 0, which sends the whole list back to each.
 * Replicas hold the same summed gradients, so each replica gathers its
 * own, to the same bits. */
gp_status gp_pipe_remote_norms(struct gp_pipeline *p, float *norms, const int *base, const int *n,
                               struct gp_error *err)
{
    int me = p->cfg.remote->stage, total = base[p->K - 1] + n[p->K - 1];
    size_t all = sizeof(float) * (size_t)total;
    gp_status st = GP_OK;
    if (me != 0) {
        if (n[me]) st = send_to(p, 0, TAG_NORMS, norms + base[me], sizeof(float) * (size_t)n[me], err);
        if (st == GP_OK) st = recv_from(p, 0, TAG_NORMS, norms, all, err);
    } else {
        for (int k = 1; k < p->K && st == GP_OK; k++)
            if (n[k]) st = recv_from(p, k, TAG_NORMS, norms + base[k], sizeof(float) * (size_t)n[k], err);
        for (int k = 1; k < p->K && st == GP_OK; k++) st = send_to(p, k, TAG_NORMS, norms, all, err);
    }
    if (st != GP_OK) gp_error_prefix(err, "stage %d: gathering the gradient norms for clipping: ", me);
    return st;
}

/* Evaluation across processes: each replica evaluates the whole set (its
 * own running statistics without deferred BatchNorm: rank 0 reports
 * replica 0's), and its last stage sends each micro-batch's outputs to
 * the replica's other stages. */
gp_status gp_pipe_remote_outputs(struct gp_pipeline *p, float *out, size_t bytes, struct gp_error *err)
{
    int me = p->cfg.remote->stage, last = p->K - 1;
    gp_status st = GP_OK;
    if (me != last) st = recv_from(p, last, TAG_OUTPUTS, out, bytes, err);
    for (int k = 0; me == last && k < last && st == GP_OK; k++) st = send_to(p, k, TAG_OUTPUTS, out, bytes, err);
    if (st != GP_OK) gp_error_prefix(err, "stage %d: evaluating: ", me);
    return st;
}

/* The memory table across processes: a stage's activation peak (and its
 * optimizer's bytes) are known only to its own process, so every stage but
 * the first sends its report to stage 0 of its replica; the same binary
 * runs every rank, so the struct goes as it is, its one pointer (the
 * backend's name) replaced by the receiver's own plan's. out and known
 * come filled for the local stage (gp_pipeline_reports). */
gp_status gp_pipe_remote_reports(struct gp_pipeline *p, struct gp_stage_report *out, bool *known,
                                 struct gp_error *err)
{
    int me = p->cfg.remote->stage;
    gp_status st = GP_OK;
    if (me != 0) {
        struct gp_stage_report mine = out[me];
        mine.backend = NULL;
        st = send_to(p, 0, TAG_REPORT, &mine, sizeof mine, err);
    } else {
        for (int k = 1; k < p->K && st == GP_OK; k++) {
            const char *backend = out[k].backend;
            st = recv_from(p, k, TAG_REPORT, &out[k], sizeof out[k], err);
            out[k].backend = backend;
            known[k] = st == GP_OK;
        }
    }
    if (st != GP_OK) gp_error_prefix(err, "stage %d: gathering the stages' memory: ", me);
    return st;
}

gp_status gp_pipeline_gather_texts(struct gp_pipeline *p, const char *mine, char **out, struct gp_error *err)
{
    *out = NULL;
    const struct gp_pipe_remote *r = p->cfg.remote;
    int me = r ? r->stage : 0;
    size_t len = mine ? strlen(mine) : 0;
    gp_status st = GP_OK;
    if (me != 0) {
        /* Its length, then (if any) its bytes. */
        uint64_t n = len;
        st = send_to(p, 0, TAG_TEXT, &n, sizeof n, err);
        if (st == GP_OK && len) st = send_to(p, 0, TAG_TEXT, mine, len, err);
        if (st != GP_OK) gp_error_prefix(err, "stage %d: sending its kernel choices: ", me);
        return st;
    }
    size_t total = len, cap = len + 1;
    char *all = malloc(cap);
    if (!all) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    if (len) memcpy(all, mine, len);
    for (int k = 1; r && k < p->K && st == GP_OK; k++) {
        uint64_t n = 0;
        st = recv_from(p, k, TAG_TEXT, &n, sizeof n, err);
        if (st != GP_OK || !n) continue;
        char *grown = n < SIZE_MAX - total - 1 ? realloc(all, total + (size_t)n + 1) : NULL;
        if (!grown) {
            st = gp_error_set(err, GP_ERR_NOMEM, "out of memory for stage %d's kernel choices (%llu bytes)", k,
                              (unsigned long long)n);
            break;
        }
        all = grown;
        st = recv_from(p, k, TAG_TEXT, all + total, (size_t)n, err);
        total += (size_t)n;
    }
    if (st != GP_OK) {
        free(all);
        gp_error_prefix(err, "stage 0: gathering the stages' kernel choices: ");
        return st;
    }
    all[total] = '\0';
    *out = all;
    return GP_OK;
}
