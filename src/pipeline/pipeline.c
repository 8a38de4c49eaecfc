/* The pipeline executor: plans every stage's memory, issues a step's
 * actions (from the schedule) onto the stages' streams with events between
 * them, and runs each stage's backend kernels (backend/compute.h) inside
 * the tasks. The host touches device memory only through copies. */
#include "pipeline/pipeline.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/compute.h"
#include "ops/registry.h"
#include "pipeline/plan.h"
#include "pipeline/trace.h"

enum task_kind { TASK_FORWARD, TASK_RECOMPUTE, TASK_BACKWARD, TASK_OPTIMIZE, TASK_NORMS, TASK_EVAL };

struct task {
    struct gp_pipeline *p;
    int stage, micro;
    enum task_kind kind;
};

struct stage {
    struct gp_stage_plan plan;
    const struct gp_device_ops *ops;
    const struct gp_compute_ops *cops;
    void *cctx;                    /* the backend's per-stage context */
    struct gp_device *dev;
    int device;
    struct gp_stream *compute, *copy_next, *copy_prev;
    unsigned char *static_block, *param_grads, *boxes, *locals, *grads, *inboxes, *scratch;
    /* Last stage: the mini-batch's targets (per micro-batch) and the loss
     * sums the backend writes (doubles, per micro-batch). Every stage:
     * its parameters' gradient norms (floats), for clipping. */
    unsigned char *targets, *loss_sums, *norms;
    unsigned char *inputs;         /* first stage: the mini-batch's data, as the host gave it */
    unsigned char *step_dev;       /* the step number (uint64) the dropout masks are keyed by, for graphs */
    unsigned char *libs;           /* the backend's library workspace (cuBLAS) */
    unsigned char *optim_state;
    int n_sets;                    /* activation sets: one per micro-batch without checkpointing */
    struct gp_event **fwd_done, **fwd_copied, **bwd_done, **bwd_copied; /* per micro-batch */
    double **bn_stats;             /* per layer of the stage: deferred BatchNorm sums, or NULL */
    struct gp_optim *opt;
    struct gp_param *params;
    int n_params;
    /* Kernel argument arrays, reused: a stage's tasks run one at a time. */
    void **in, **out;
    float **din, **dout;
    const float **param_grad_ptrs; /* per parameter, for norms */
    int *param_values;             /* per parameter: its value id */
    int64_t *param_numels;
    int width;
    int64_t live, peak;            /* activation bytes in use, and the most at once */
    double *fwd_ms, *bwd_ms;       /* time_layers: per layer of the stage, summed over a step */
    const void **kernels;          /* per layer of the stage: the backend's kernel */
    size_t optim_bytes_planned;
};

struct gp_pipeline {
    struct gp_pipeline_config cfg;
    const struct gp_graph *g;
    struct gp_layers layers;
    bool *needs_grad;
    int K, M;
    int64_t micro;                 /* rows per micro-batch */
    int input, output;             /* the data input and the loss's output */
    struct stage *stages;
    struct gp_pipe_schedule sched;
    struct task *tasks;            /* one per action, then per-stage optimizer and eval tasks */
    size_t target_bytes;           /* per micro-batch; 0 without targets */
    size_t input_bytes;            /* per micro-batch */
    /* The step being run. */
    struct gp_step_opts opts;
    double denominator;
    double *loss_parts;            /* per micro-batch, copied back from the last stage */
    int64_t steps_done;
    /* CUDA graphs (cfg.cuda_graph): the captured step, the events that fork
     * every stream from the first stage's compute stream and join them back,
     * pinned staging for what changes between replays, and what the graph
     * baked in. */
    bool graph_ok;
    struct gp_step_graph *graph;
    struct gp_event *fork, **joins;
    int n_joins;
    void *x_host, *t_host;
    double *loss_host;
    uint64_t *step_host;
    uint64_t graph_seed;
    double graph_ratio, graph_denominator;
    char graph_note[2304];
    float *norms_host;             /* per parameter (all stages), copied back for clipping */
    bool eval;
    float clip_coef;
    double lr;
};

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Address of value v on stage s for micro-batch j. */
static void *addr(struct gp_pipeline *p, struct stage *s, int v, int j)
{
    switch (s->plan.home[v]) {
    case GP_HOME_STATIC: return s->static_block + s->plan.off[v];
    case GP_HOME_BOX: return s->boxes + (size_t)j * s->plan.box_bytes + s->plan.off[v];
    case GP_HOME_LOCAL: {
        int set = s->n_sets > 1 ? j : 0;
        return s->locals + (size_t)set * s->plan.local_bytes + s->plan.off[v];
    }
    default: (void)p; return NULL;
    }
}

static float *grad_addr(struct stage *s, const struct gp_value *val, int v)
{
    if (s->plan.home[v] == GP_HOME_STATIC)
        return val->kind == GP_VALUE_PARAMETER ? (float *)(s->param_grads + s->plan.off[v]) : NULL;
    return s->plan.grad_off[v] == SIZE_MAX ? NULL : (float *)(s->grads + s->plan.grad_off[v]);
}

static bool nondiff(const struct gp_node *n, int k)
{
    return k < 32 && ((n->def->nondiff_inputs >> k) & 1);
}

static struct gp_layer_call layer_call(struct gp_pipeline *p, struct stage *s, int layer, int j,
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
    for (int k = 0; k < n->n_inputs; k++) {
        int v = n->inputs[k];
        s->in[k] = v >= 0 ? addr(p, s, v, j) : NULL;
        s->din[k] = v >= 0 && with_grads && !nondiff(n, k) ? grad_addr(s, &g->values[v], v) : NULL;
    }
    for (int k = 0; k < n->n_outputs; k++) {
        int v = n->outputs[k];
        s->out[k] = v >= 0 ? addr(p, s, v, j) : NULL;
        s->dout[k] = v >= 0 && with_grads ? grad_addr(s, &g->values[v], v) : NULL;
    }
    int set = s->n_sets > 1 ? j : 0;
    return (struct gp_layer_call){
        .graph = g,
        .node = n,
        .kernel = s->kernels[layer - s->plan.first],
        .in = s->in,
        .out = s->out,
        .din = s->din,
        .dout = s->dout,
        .saved = s->locals + (size_t)set * s->plan.local_bytes + s->plan.saved_off[layer - s->plan.first],
        .scratch = s->scratch,
        .training = training,
        .update_state = update_state,
        .seed = p->opts.seed,
        .step = p->opts.step,
        .step_dev = p->graph_ok ? (const uint64_t *)s->step_dev : NULL,
        .sample_offset = (int64_t)j * p->micro,
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

static gp_status run_forward(struct gp_pipeline *p, struct stage *s, int j, bool training,
                             bool update_state, struct gp_error *err)
{
    /* Timing counts first forwards only (update_state), not recomputations. */
    bool timed = p->cfg.time_layers && update_state;
    double t0 = timed ? now_ms() : 0;
    if (timed) GP_TRY(lap(s, &t0, &(double){0}, err));
    for (int i = s->plan.first; i < s->plan.last; i++) {
        struct gp_layer_call c = layer_call(p, s, i, j, training, update_state, false);
        GP_TRY(s->cops->forward(s->cctx, &c, err));
        if (timed) GP_TRY(lap(s, &t0, &s->fwd_ms[i - s->plan.first], err));
    }
    return GP_OK;
}

/* Zeroes the gradient regions born at backward time t (plan.h). */
static gp_status zero_born(struct gp_pipeline *p, struct stage *s, int t, struct gp_error *err)
{
    for (int q = s->plan.born_start[t]; q < s->plan.born_start[t + 1]; q++) {
        int v = s->plan.born[q];
        GP_TRY(s->cops->zero(s->cctx, s->grads + s->plan.grad_off[v],
                             sizeof(float) * (size_t)gp_shape_numel(&p->g->values[v].shape), err));
    }
    return GP_OK;
}

static gp_status run_backward(struct gp_pipeline *p, struct stage *s, int j, struct gp_error *err)
{
    const struct gp_graph *g = p->g;
    /* Gradient regions start at zero when their value's gradient begins
     * (the set is shared over time: plan.c); the gradients that arrived for
     * the output frontier seed theirs. Kernels accumulate. */
    GP_TRY(zero_born(p, s, 0, err));
    const unsigned char *inbox = s->inboxes + (size_t)j * s->plan.inbox_bytes;
    for (int k = 0; k < s->plan.n_frontier_out; k++) {
        int v = s->plan.frontier_out[k];
        if (s->plan.inbox_off[v] == SIZE_MAX) continue;
        GP_TRY(s->cops->accumulate(s->cctx, (float *)(s->grads + s->plan.grad_off[v]),
                                   (const float *)(inbox + s->plan.inbox_off[v]),
                                   gp_shape_numel(&g->values[v].shape), err));
    }
    bool timed = p->cfg.time_layers;
    double t0 = timed ? now_ms() : 0;
    if (timed) GP_TRY(lap(s, &t0, &(double){0}, err));
    for (int i = s->plan.last - 1; i >= s->plan.first; i--) {
        if (timed && i + 1 < s->plan.last) GP_TRY(lap(s, &t0, &s->bwd_ms[i + 1 - s->plan.first], err));
        GP_TRY(zero_born(p, s, s->plan.last - i, err));
        const struct gp_node *n = &g->nodes[i];
        struct gp_layer_call c = layer_call(p, s, i, j, true, false, true);
        bool any_in = false, any_out = false;
        for (int k = 0; k < n->n_inputs; k++) any_in |= s->din[k] != NULL;
        for (int k = 0; k < n->n_outputs; k++) any_out |= s->dout[k] != NULL;
        if (!any_in || !any_out) continue;
        GP_TRY(s->cops->backward(s->cctx, &c, err));
    }
    if (timed) GP_TRY(lap(s, &t0, &s->bwd_ms[0], err));
    return GP_OK;
}

static gp_status task_run(void *arg, struct gp_error *err)
{
    struct task *t = arg;
    struct gp_pipeline *p = t->p;
    struct stage *s = &p->stages[t->stage];
    int j = t->micro;
    bool last = t->stage == p->K - 1;
    switch (t->kind) {
    case TASK_FORWARD: {
        bool kept = !gp_checkpointed(p->cfg.checkpoint, j, p->M);
        s->live += (int64_t)s->plan.box_bytes + (int64_t)s->plan.local_bytes;
        if (s->live > s->peak) s->peak = s->live;
        GP_TRY(run_forward(p, s, j, true, true, err));
        if (last) {
            void *dout = s->plan.inbox_off[p->output] == SIZE_MAX
                             ? NULL
                             : s->inboxes + (size_t)j * s->plan.inbox_bytes + s->plan.inbox_off[p->output];
            if (!dout)
                return gp_error_set(err, GP_ERR_INVALID,
                                    "the output '%s' does not depend on any parameter: nothing to train",
                                    p->g->values[p->output].name);
            const struct gp_value *o = &p->g->values[p->output];
            struct gp_loss_call lc = {
                .spec = &p->cfg.loss,
                .out_shape = &o->shape,
                .out = addr(p, s, p->output, j),
                .target = p->target_bytes ? s->targets + (size_t)j * p->target_bytes : NULL,
                .dout = dout,
                .denominator = p->denominator,
                .loss_sum = (double *)s->loss_sums + j,
                .scratch = s->scratch,
            };
            GP_TRY(s->cops->loss(s->cctx, &lc, err));
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
        return run_forward(p, s, j, true, false, err);
    case TASK_BACKWARD:
        s->live += (int64_t)s->plan.grad_bytes;
        if (s->live > s->peak) s->peak = s->live;
        GP_TRY(run_backward(p, s, j, err));
        s->live -= (int64_t)s->plan.grad_bytes + (int64_t)s->plan.local_bytes + (int64_t)s->plan.box_bytes;
        return GP_OK;
    case TASK_OPTIMIZE:
        /* Deferred BatchNorm: the whole mini-batch's statistics, once. */
        for (int i = s->plan.first; s->bn_stats && i < s->plan.last; i++) {
            if (!s->bn_stats[i - s->plan.first]) continue;
            const struct gp_node *n = &p->g->nodes[i];
            GP_TRY(s->cops->bn_commit(s->cctx, p->g, n, addr(p, s, n->inputs[3], 0),
                                      addr(p, s, n->inputs[4], 0), s->bn_stats[i - s->plan.first], err));
        }
        if (s->opt) GP_TRY(s->cops->optim_step(s->cctx, s->opt, p->lr, p->clip_coef, err));
        return s->cops->zero(s->cctx, s->param_grads, s->plan.param_bytes, err);
    case TASK_NORMS:
        return s->cops->norms(s->cctx, s->param_grad_ptrs, s->param_numels, s->n_params,
                              (float *)s->norms, err);
    case TASK_EVAL:
        return run_forward(p, s, 0, false, false, err);
    }
    return GP_OK;
}

/* ---- creation ---- */

void gp_pipeline_free(struct gp_pipeline *p)
{
    if (!p) return;
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
    for (int k = 0; p->stages && k < p->K; k++) {
        struct stage *s = &p->stages[k];
        const struct gp_device_ops *ops = s->ops;
        if (ops) {
            if (s->compute) ops->stream_destroy(s->compute);
            if (s->copy_next) ops->stream_destroy(s->copy_next);
            if (s->copy_prev) ops->stream_destroy(s->copy_prev);
            struct gp_event **lists[4] = {s->fwd_done, s->fwd_copied, s->bwd_done, s->bwd_copied};
            for (int e = 0; e < 4; e++) {
                for (int j = 0; lists[e] && j < p->M; j++)
                    if (lists[e][j]) ops->event_destroy(lists[e][j]);
                free(lists[e]);
            }
            if (s->cops && s->cctx) s->cops->context_destroy(s->cctx);
            unsigned char *blocks[14] = {s->static_block, s->param_grads, s->boxes,       s->locals,
                                         s->grads,        s->inboxes,     s->scratch,     s->targets,
                                         s->loss_sums,    s->norms,       s->optim_state, s->inputs,
                                         s->libs,         s->step_dev};
            for (int b = 0; b < 14; b++)
                if (blocks[b]) ops->free(s->dev, blocks[b]);
            for (int i = 0; s->bn_stats && i < s->plan.last - s->plan.first; i++)
                if (s->bn_stats[i]) ops->free(s->dev, s->bn_stats[i]);
            /* Devices shared by several stages close with their first stage. */
            bool first_user = true;
            for (int q = 0; q < k; q++)
                if (p->stages[q].dev == s->dev) first_user = false;
            if (s->dev && first_user) ops->close(s->dev);
        }
        gp_optim_free(s->opt);
        free(s->bn_stats);
        free(s->param_grad_ptrs);
        free(s->param_numels);
        free(s->param_values);
        free(s->fwd_ms);
        free(s->bwd_ms);
        free(s->kernels);
        free(s->params);
        free(s->in);
        free(s->out);
        free(s->din);
        free(s->dout);
        gp_plan_free(&s->plan);
    }
    free(p->stages);
    gp_layers_free(&p->layers);
    gp_pipe_schedule_free(&p->sched);
    free(p->needs_grad);
    free(p->tasks);
    free(p->loss_parts);
    free(p->norms_host);
    free(p);
}

static gp_status alloc_block(struct stage *s, int k, const char *what, size_t bytes,
                             unsigned char **out, struct gp_error *err)
{
    *out = s->ops->alloc(s->dev, bytes ? bytes : 64);
    if (!*out)
        return gp_error_set(err, GP_ERR_NOMEM, "%s:%d: out of memory allocating %.1f MiB for %s (stage %d)",
                            s->ops->name, s->device, (double)bytes / (1 << 20), what, k);
    return GP_OK;
}

/* The stage's device memory, all planned here: what each block holds and
 * its bytes. Checked against what the device has free before anything is
 * allocated, so a model that cannot fit says so with the whole account. */
struct block_plan {
    const char *what;
    size_t bytes;
    unsigned char **at;
};

static int stage_blocks(struct gp_pipeline *p, struct stage *s, int k, struct block_plan *b)
{
    bool last = k == p->K - 1;
    size_t loss_scratch = last ? s->cops->loss_scratch_bytes(&p->g->values[p->output].shape) : 0;
    size_t scratch = s->plan.scratch_bytes > loss_scratch ? s->plan.scratch_bytes : loss_scratch;
    int n = 0;
    b[n++] = (struct block_plan){"parameters and constants", s->plan.static_bytes, &s->static_block};
    b[n++] = (struct block_plan){"parameter gradients", s->plan.param_bytes, &s->param_grads};
    b[n++] = (struct block_plan){"optimizer state", s->optim_bytes_planned, &s->optim_state};
    b[n++] = (struct block_plan){"input frontiers", s->plan.box_bytes * (size_t)p->M, &s->boxes};
    b[n++] = (struct block_plan){"activations", s->plan.local_bytes * (size_t)s->n_sets, &s->locals};
    b[n++] = (struct block_plan){"activation gradients", s->plan.grad_bytes, &s->grads};
    b[n++] = (struct block_plan){"gradient inboxes", s->plan.inbox_bytes * (size_t)p->M, &s->inboxes};
    b[n++] = (struct block_plan){"kernel workspace", scratch, &s->scratch};
    b[n++] = (struct block_plan){"library workspace", s->cops->context_bytes, &s->libs};
    b[n++] = (struct block_plan){"targets", last ? p->target_bytes * (size_t)p->M : 0, &s->targets};
    b[n++] = (struct block_plan){"inputs", k == 0 ? p->input_bytes * (size_t)p->M : 0, &s->inputs};
    b[n++] = (struct block_plan){"step number", sizeof(uint64_t), &s->step_dev};
    b[n++] = (struct block_plan){"loss sums", last ? sizeof(double) * (size_t)p->M : 0, &s->loss_sums};
    b[n++] = (struct block_plan){"gradient norms", sizeof(float) * (size_t)(s->n_params + 1), &s->norms};
    return n;
}

static gp_status allocate_stage(struct gp_pipeline *p, struct stage *s, int k, struct gp_error *err)
{
    struct block_plan b[16];
    int n = stage_blocks(p, s, k, b);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += align64(b[i].bytes ? b[i].bytes : 64);
    /* Stages sharing a device: the earlier ones' memory is already taken,
     * so the device's free bytes are what this stage can have. */
    size_t avail = s->ops->mem_available ? s->ops->mem_available(s->dev) : SIZE_MAX;
    if (avail && total > avail) {
        char account[1024];
        size_t len = 0;
        for (int i = 0; i < n && len < sizeof account; i++)
            if (b[i].bytes)
                len += (size_t)snprintf(account + len, sizeof account - len, "%s%s %.1f MiB",
                                        len ? ", " : "", b[i].what, (double)b[i].bytes / (1 << 20));
        return gp_error_set(err, GP_ERR_NOMEM,
                            "layers %d-%d need %.1f MiB on %s:%d but only %.1f MiB are free (%s): use "
                            "more stages or devices, a smaller --batch, more --chunks, or --checkpoint "
                            "always",
                            s->plan.first, s->plan.last - 1, (double)total / (1 << 20), s->ops->name,
                            s->device, (double)avail / (1 << 20), account);
    }
    for (int i = 0; i < n; i++) GP_TRY(alloc_block(s, k, b[i].what, b[i].bytes, b[i].at, err));
    return GP_OK;
}

/* Static values start from the model (floats become float32), written on
 * the host and copied to the device once. */
static gp_status upload_static(struct gp_pipeline *p, struct stage *s, struct gp_error *err)
{
    const struct gp_graph *g = p->g;
    if (!s->plan.static_bytes) return GP_OK;
    unsigned char *host = calloc(1, s->plan.static_bytes);
    if (!host) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    for (int v = 0; v < g->n_values; v++) {
        if (s->plan.home[v] != GP_HOME_STATIC) continue;
        const struct gp_value *val = &g->values[v];
        void *dst = host + s->plan.off[v];
        int64_t n = gp_shape_numel(&val->shape);
        if (gp_dtype_is_float(val->dtype))
            for (int64_t e = 0; e < n; e++) ((float *)dst)[e] = (float)gp_tensor_get_f64(val->constant, e);
        else
            memcpy(dst, val->constant->data, (size_t)n * gp_dtype_size(val->dtype));
    }
    struct gp_task_tag tag = {.kind = GP_TASK_COPY, .stage = -1, .microbatch = -1, .name = "load parameters"};
    s->ops->copy(s->compute, s->static_block, host, s->plan.static_bytes, &tag);
    gp_status st = s->ops->stream_synchronize(s->compute, err);
    free(host);
    return st;
}

static gp_status create_stage(struct gp_pipeline *p, int k, int first, int last, struct gp_error *err)
{
    const struct gp_graph *g = p->g;
    struct stage *s = &p->stages[k];
    s->ops = p->cfg.device_ops[k];
    s->cops = s->ops->compute;
    s->device = p->cfg.device_index[k];
    if (!s->cops)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "the %s backend cannot run kernels in this build",
                            s->ops->name);
    GP_TRY(gp_plan_stage(g, &p->layers, p->needs_grad, s->cops, s->ops->name, first, last, &s->plan, err));
    for (int q = 0; q < k; q++)
        if (p->stages[q].ops == s->ops && p->stages[q].device == s->device) s->dev = p->stages[q].dev;
    if (!s->dev) GP_TRY(s->ops->open(s->device, &s->dev, err));
    char name[64];
    snprintf(name, sizeof name, "compute s%d", k);
    GP_TRY(s->ops->stream_create(s->dev, name, &s->compute, err));
    if (k + 1 < p->K) {
        snprintf(name, sizeof name, "copy s%d->s%d", k, k + 1);
        GP_TRY(s->ops->stream_create(s->dev, name, &s->copy_next, err));
    }
    if (k > 0) {
        snprintf(name, sizeof name, "copy s%d->s%d", k, k - 1);
        GP_TRY(s->ops->stream_create(s->dev, name, &s->copy_prev, err));
    }
    s->n_sets = p->cfg.checkpoint == GP_CHECKPOINT_NEVER ? p->M : 1;

    /* Parameters in value order, which is the model's initializer order:
     * the order PyTorch's parameters() has, which gradient clipping's norm
     * of norms depends on. Their addresses are set once memory exists. */
    s->params = calloc((size_t)g->n_values + 1, sizeof *s->params);
    s->param_values = calloc((size_t)g->n_values + 1, sizeof(int));
    if (!s->params || !s->param_values) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    for (int v = 0; v < g->n_values; v++) {
        if (s->plan.home[v] != GP_HOME_STATIC || g->values[v].kind != GP_VALUE_PARAMETER) continue;
        s->param_values[s->n_params] = v;
        s->params[s->n_params++] = (struct gp_param){
            .name = g->values[v].name,
            .numel = gp_shape_numel(&g->values[v].shape),
        };
    }
    s->optim_bytes_planned = s->n_params ? gp_optim_state_bytes_for(&p->cfg.optim, s->params, s->n_params) : 0;
    GP_TRY(allocate_stage(p, s, k, err));
    GP_TRY(s->cops->context_create(s->dev, s->compute, p->cfg.tf32, s->libs, &s->cctx, err));
    for (int i = 0; i < s->n_params; i++) {
        s->params[i].data = (float *)(s->static_block + s->plan.off[s->param_values[i]]);
        s->params[i].grad = (float *)(s->param_grads + s->plan.off[s->param_values[i]]);
    }
    s->param_grad_ptrs = calloc((size_t)s->n_params + 1, sizeof *s->param_grad_ptrs);
    s->param_numels = calloc((size_t)s->n_params + 1, sizeof *s->param_numels);
    if (!s->param_grad_ptrs || !s->param_numels) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < s->n_params; i++) {
        s->param_grad_ptrs[i] = s->params[i].grad;
        s->param_numels[i] = s->params[i].numel;
    }
    if (s->n_params)
        GP_TRY(gp_optim_create_in(&p->cfg.optim, s->params, s->n_params, s->optim_state, &s->opt, err));
    GP_TRY(upload_static(p, s, err));

    struct gp_event ***lists[4] = {&s->fwd_done, &s->fwd_copied, &s->bwd_done, &s->bwd_copied};
    for (int e = 0; e < 4; e++) {
        *lists[e] = calloc((size_t)p->M, sizeof(struct gp_event *));
        if (!*lists[e]) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
        for (int j = 0; j < p->M; j++) GP_TRY(s->ops->event_create(s->dev, &(*lists[e])[j], err));
    }
    s->kernels = calloc((size_t)(last - first) + 1, sizeof *s->kernels);
    if (!s->kernels) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    for (int i = first; i < last; i++) s->kernels[i - first] = s->cops->kernel_for(&g->nodes[i]);
    s->fwd_ms = calloc((size_t)(last - first) + 1, sizeof(double));
    s->bwd_ms = calloc((size_t)(last - first) + 1, sizeof(double));
    if (!s->fwd_ms || !s->bwd_ms) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    s->width = (s->plan.max_inputs > s->plan.max_outputs ? s->plan.max_inputs : s->plan.max_outputs) + 1;
    s->in = calloc((size_t)s->width, sizeof(void *));
    s->out = calloc((size_t)s->width, sizeof(void *));
    s->din = calloc((size_t)s->width, sizeof(float *));
    s->dout = calloc((size_t)s->width, sizeof(float *));
    if (!s->in || !s->out || !s->din || !s->dout) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    if (p->cfg.deferred_batch_norm) {
        s->bn_stats = calloc((size_t)(last - first) + 1, sizeof(double *));
        if (!s->bn_stats) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
        for (int i = first; i < last; i++) {
            if (strcmp(g->nodes[i].op_type, "BatchNormalization") != 0) continue;
            size_t bytes = sizeof(double) * s->cops->bn_stats_len(g, &g->nodes[i]);
            s->bn_stats[i - first] = s->ops->alloc(s->dev, bytes);
            if (!s->bn_stats[i - first])
                return gp_error_set(err, GP_ERR_NOMEM, "%s:%d: out of memory for BatchNorm statistics",
                                    s->ops->name, s->device);
        }
    }
    if (p->cfg.trace) {
        s->ops->trace_enable(s->compute, 1);
        if (s->copy_next) s->ops->trace_enable(s->copy_next, 1);
        if (s->copy_prev) s->ops->trace_enable(s->copy_prev, 1);
    }
    return GP_OK;
}

/* CUDA graphs where every stage's backend can capture and nothing needs
 * the host inside the step (timelines, layer timing): pinned staging and
 * the fork and join events. Without them the pipeline runs eagerly and
 * graph_note says why. */
static gp_status setup_graphs(struct gp_pipeline *p, struct gp_error *err)
{
    if (!p->cfg.cuda_graph) return GP_OK;
    const char *why = NULL;
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
    p->joins = calloc((size_t)(3 * p->K), sizeof *p->joins);
    if (!p->joins) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    for (int k = 0; k < p->K; k++) {
        struct stage *s = &p->stages[k];
        struct gp_stream *list[3] = {s->compute, s->copy_next, s->copy_prev};
        for (int q = 0; q < 3; q++)
            if (list[q]) GP_TRY(s->ops->event_create(s->dev, &p->joins[p->n_joins++], err));
    }
    p->graph_ok = true;
    return GP_OK;
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
    struct gp_pipeline *p = calloc(1, sizeof *p);
    if (!p) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    p->cfg = *cfg;
    p->g = g;
    p->K = cfg->n_stages;
    p->M = cfg->n_micro;
    gp_status st = GP_OK;
    p->input = -1;
    for (int i = 0; i < g->n_inputs; i++)
        if (!g->values[g->inputs[i]].is_initializer) {
            if (p->input >= 0) {
                st = gp_error_set(err, GP_ERR_UNSUPPORTED, "the model has several data inputs; training feeds one");
                goto fail;
            }
            p->input = g->inputs[i];
        }
    if (p->input < 0) {
        st = gp_error_set(err, GP_ERR_UNSUPPORTED, "the model has no data input");
        goto fail;
    }
    p->micro = g->values[p->input].shape.dims[0];
    p->input_bytes = (size_t)gp_shape_numel(&g->values[p->input].shape) * gp_dtype_size(g->values[p->input].dtype);
    p->output = g->outputs[0];
    if ((st = gp_layers_build(g, &p->layers, err)) != GP_OK) goto fail;
    p->needs_grad = calloc((size_t)g->n_values + 1, sizeof(bool));
    p->stages = calloc((size_t)p->K, sizeof *p->stages);
    p->loss_parts = calloc((size_t)p->M, sizeof(double));
    p->norms_host = calloc((size_t)g->n_values + 1, sizeof(float));
    if (cfg->loss.target_dtype != GP_DTYPE_UNDEFINED)
        p->target_bytes = (size_t)gp_shape_numel(&cfg->loss.target_shape) *
                          (gp_dtype_is_float(cfg->loss.target_dtype) ? sizeof(float)
                                                                     : gp_dtype_size(cfg->loss.target_dtype));
    if (!p->needs_grad || !p->stages || !p->loss_parts || !p->norms_host) {
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    gp_plan_needs_grad(g, p->needs_grad);

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
        if ((st = create_stage(p, k, first, first + count, err)) != GP_OK) {
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
    if ((st = gp_pipe_schedule_gpipe(p->K, p->M, cfg->checkpoint, &p->sched, err)) != GP_OK) goto fail;
    p->tasks = calloc((size_t)p->sched.n_actions + 3 * (size_t)p->K + 1, sizeof *p->tasks);
    if (!p->tasks) {
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = setup_graphs(p, err)) != GP_OK) goto fail;
    /* OpenMP threads per device: the cores shared among the devices. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int devices = 0;
    for (int k = 0; k < p->K; k++) {
        bool seen = false;
        for (int q = 0; q < k; q++) seen |= p->stages[q].dev == p->stages[k].dev;
        devices += !seen;
    }
    for (int k = 0; k < p->K; k++)
        p->stages[k].ops->set_threads(p->stages[k].dev, (int)(cores / devices > 1 ? cores / devices : 1));
    *out = p;
    return GP_OK;
fail:
    gp_pipeline_free(p);
    return st;
}

/* ---- issuing a step ---- */

static struct gp_task_tag tag_of(enum gp_task_kind kind, int stage, int micro, const char *name)
{
    return (struct gp_task_tag){.kind = kind, .stage = stage, .microbatch = micro, .name = name};
}

/* Moves micro-batch j's output frontier of stage k into stage k+1's box. */
static void issue_forward_copy(struct gp_pipeline *p, int k, int j)
{
    struct stage *s = &p->stages[k], *t = &p->stages[k + 1];
    struct gp_task_tag tag = tag_of(GP_TASK_COPY, k, j, "send activations");
    s->ops->stream_wait(s->copy_next, s->fwd_done[j]);
    for (int q = 0; q < s->plan.n_frontier_out; q++) {
        int v = s->plan.frontier_out[q];
        size_t bytes = (size_t)gp_shape_numel(&p->g->values[v].shape) *
                       (gp_dtype_is_float(p->g->values[v].dtype) ? sizeof(float) : gp_dtype_size(p->g->values[v].dtype));
        s->ops->copy(s->copy_next, addr(p, t, v, j), addr(p, s, v, j), bytes, &tag);
    }
    s->ops->event_record(s->fwd_copied[j], s->copy_next);
}

/* Moves micro-batch j's input-frontier gradients of stage k into stage k-1's inbox. */
static void issue_backward_copy(struct gp_pipeline *p, int k, int j)
{
    struct stage *s = &p->stages[k], *t = &p->stages[k - 1];
    struct gp_task_tag tag = tag_of(GP_TASK_COPY, k, j, "send gradients");
    s->ops->stream_wait(s->copy_prev, s->bwd_done[j]);
    for (int q = 0; q < s->plan.n_frontier_in; q++) {
        int v = s->plan.frontier_in[q];
        if (t->plan.inbox_off[v] == SIZE_MAX) continue;
        size_t bytes = (size_t)gp_shape_numel(&p->g->values[v].shape) * sizeof(float);
        s->ops->copy(s->copy_prev, t->inboxes + (size_t)j * t->plan.inbox_bytes + t->plan.inbox_off[v],
                     s->grads + s->plan.grad_off[v], bytes, &tag);
    }
    s->ops->event_record(s->bwd_copied[j], s->copy_prev);
}

static gp_status sync_all(struct gp_pipeline *p, struct gp_error *err)
{
    gp_status first = GP_OK;
    for (int k = 0; k < p->K; k++) {
        struct stage *s = &p->stages[k];
        struct gp_stream *streams[3] = {s->compute, s->copy_next, s->copy_prev};
        for (int q = 0; q < 3; q++) {
            if (!streams[q]) continue;
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
        struct gp_stream *streams[3] = {s->compute, s->copy_next, s->copy_prev};
        for (int q = 0; q < 3; q++)
            if (streams[q]) s->ops->trace_enable(streams[q], 1); /* restarts the recording */
    }
}

/* Every action of the schedule, in order, onto the stages' streams: the
 * step's whole forward and backward, with an event for each dependency. */
static void issue_actions(struct gp_pipeline *p)
{
    size_t in_bytes = p->input_bytes;
    for (int a = 0; a < p->sched.n_actions; a++) {
        const struct gp_action *act = &p->sched.actions[a];
        int k = act->stage, j = act->microbatch;
        struct stage *s = &p->stages[k];
        struct task *t = &p->tasks[a];
        *t = (struct task){.p = p, .stage = k, .micro = j};
        switch (act->kind) {
        case GP_ACT_FORWARD: {
            t->kind = TASK_FORWARD;
            if (k == 0) {
                struct gp_task_tag tag = tag_of(GP_TASK_COPY, 0, j, "input to its box");
                s->ops->copy(s->compute, addr(p, s, p->input, j), s->inputs + (size_t)j * in_bytes, in_bytes,
                             &tag);
            } else {
                s->ops->stream_wait(s->compute, p->stages[k - 1].fwd_copied[j]);
            }
            /* A shared activation set is overwritten only after the previous
             * micro-batch's outputs left it. */
            if (s->n_sets == 1 && j > 0 && k + 1 < p->K) s->ops->stream_wait(s->compute, s->fwd_copied[j - 1]);
            struct gp_task_tag tag = tag_of(GP_TASK_FORWARD, k, j, "forward");
            s->ops->enqueue(s->compute, task_run, t, &tag);
            s->ops->event_record(s->fwd_done[j], s->compute);
            if (k + 1 < p->K) issue_forward_copy(p, k, j);
            break;
        }
        case GP_ACT_RECOMPUTE: {
            t->kind = TASK_RECOMPUTE;
            /* Recomputation rewrites the shared activation set, which the
             * copy stream may still be reading a forward's outputs from:
             * wait until every forward copy of this stage is done (they run
             * in order, so the last one's event covers them all). */
            if (k + 1 < p->K) s->ops->stream_wait(s->compute, s->fwd_copied[p->M - 1]);
            struct gp_task_tag tag = tag_of(GP_TASK_RECOMPUTE, k, j, "recompute");
            s->ops->enqueue(s->compute, task_run, t, &tag);
            break;
        }
        case GP_ACT_BACKWARD: {
            t->kind = TASK_BACKWARD;
            if (k + 1 < p->K) s->ops->stream_wait(s->compute, p->stages[k + 1].bwd_copied[j]);
            /* The gradient set is reused: the previous micro-batch's input
             * gradients must have left it. */
            if (k > 0 && j + 1 < p->M) s->ops->stream_wait(s->compute, s->bwd_copied[j + 1]);
            struct gp_task_tag tag = tag_of(GP_TASK_BACKWARD, k, j, "backward");
            s->ops->enqueue(s->compute, task_run, t, &tag);
            s->ops->event_record(s->bwd_done[j], s->compute);
            if (k > 0) issue_backward_copy(p, k, j);
            break;
        }
        }
    }
}

/* Every stream of every stage but `origin`, for joining a capture. */
static int all_streams(struct gp_pipeline *p, struct gp_stream **out, struct stage **owner)
{
    int n = 0;
    for (int k = 0; k < p->K; k++) {
        struct stage *s = &p->stages[k];
        struct gp_stream *list[3] = {s->compute, s->copy_next, s->copy_prev};
        for (int q = 0; q < 3; q++)
            if (list[q]) owner[n] = s, out[n++] = list[q];
    }
    return n;
}

/* Records the step's actions as one graph: every stream joins the capture
 * from the first stage's compute stream (the origin) and joins back at the
 * end. On failure the streams are left usable and the reason is kept. */
static gp_status capture_step(struct gp_pipeline *p, struct gp_error *err)
{
    struct stage *fs = &p->stages[0];
    struct gp_stream **streams = malloc(sizeof *streams * (size_t)(3 * p->K));
    struct stage **owner = malloc(sizeof *owner * (size_t)(3 * p->K));
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
    issue_actions(p);
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
    return GP_OK;
}

/* The step as a replayed graph: the batch, its targets and the step number
 * copied from pinned staging into the fixed device buffers the graph reads,
 * the graph launched on the origin stream, the losses copied back. What the
 * graph bakes in (the dropout seed and ratio, the loss's denominator) makes
 * a new capture when it changes. false when the graph could not be made
 * (p->graph_note says why): the caller runs the step eagerly. */
static bool step_graph(struct gp_pipeline *p, const void *x, const void *targets, gp_status *st,
                       struct gp_error *err)
{
    struct stage *fs = &p->stages[0], *ls = &p->stages[p->K - 1];
    const struct gp_device_ops *ops = fs->ops;
    memcpy(p->x_host, x, p->input_bytes * (size_t)p->M);
    if (p->target_bytes) memcpy(p->t_host, targets, p->target_bytes * (size_t)p->M);
    *p->step_host = p->opts.step;
    struct gp_task_tag tag = tag_of(GP_TASK_COPY, 0, -1, "load inputs");
    ops->copy(fs->compute, fs->inputs, p->x_host, p->input_bytes * (size_t)p->M, &tag);
    if (p->target_bytes) ops->copy(fs->compute, ls->targets, p->t_host, p->target_bytes * (size_t)p->M, &tag);
    for (int k = 0; k < p->K; k++) ops->copy(fs->compute, p->stages[k].step_dev, p->step_host, sizeof(uint64_t), &tag);
    if (p->graph && (p->graph_seed != p->opts.seed || p->graph_ratio != p->opts.dropout_ratio ||
                     p->graph_denominator != p->denominator)) {
        ops->graph_destroy(p->graph);
        p->graph = NULL;
    }
    if (!p->graph) {
        struct gp_error cerr = {0};
        if (capture_step(p, &cerr) != GP_OK) {
            snprintf(p->graph_note, sizeof p->graph_note, "the step could not be captured as a CUDA graph (%s): "
                     "running it eagerly", cerr.msg);
            p->graph_ok = false;
            return false;
        }
    }
    ops->graph_launch(p->graph, fs->compute);
    tag = tag_of(GP_TASK_COPY, p->K - 1, -1, "read losses");
    ops->copy(fs->compute, p->loss_host, ls->loss_sums, sizeof(double) * (size_t)p->M, &tag);
    *st = sync_all(p, err);
    if (*st == GP_OK) memcpy(p->loss_parts, p->loss_host, sizeof(double) * (size_t)p->M);
    return true;
}

gp_status gp_pipeline_step(struct gp_pipeline *p, const void *x, const void *targets, const struct gp_step_opts *o,
                           double denominator, double *loss_sum, struct gp_error *err)
{
    p->opts = *o;
    p->denominator = denominator;
    p->eval = false;
    clear_traces(p);
    for (int k = 0; p->cfg.time_layers && k < p->K; k++) {
        struct stage *st = &p->stages[k];
        memset(st->fwd_ms, 0, sizeof(double) * (size_t)(st->plan.last - st->plan.first));
        memset(st->bwd_ms, 0, sizeof(double) * (size_t)(st->plan.last - st->plan.first));
    }
    gp_status st = GP_OK;
    /* The first step runs eagerly: lazy initializations (library handles'
     * first calls, events) happen outside the capture. */
    bool graphed = p->graph_ok && p->steps_done > 0 && step_graph(p, x, targets, &st, err);
    if (!graphed) {
        struct stage *fs = &p->stages[0], *ls = &p->stages[p->K - 1];
        /* The mini-batch's data and targets reach the devices in one copy
         * each, before any work of the step (pageable host memory may make
         * a copy wait for its stream: here the streams are idle). */
        struct gp_task_tag itag = tag_of(GP_TASK_COPY, 0, -1, "load inputs");
        fs->ops->copy(fs->compute, fs->inputs, x, p->input_bytes * (size_t)p->M, &itag);
        if (p->target_bytes) {
            struct gp_task_tag ttag = tag_of(GP_TASK_COPY, p->K - 1, -1, "load targets");
            ls->ops->copy(ls->compute, ls->targets, targets, p->target_bytes * (size_t)p->M, &ttag);
        }
        /* With graphs on, kernels read the step from the device: set it. */
        if (p->graph_ok) *p->step_host = p->opts.step;
        for (int k = 0; p->graph_ok && k < p->K; k++)
            p->stages[k].ops->copy(p->stages[k].compute, p->stages[k].step_dev, p->step_host, sizeof(uint64_t),
                                   &itag);
        issue_actions(p);
        /* The micro-batches' loss sums come back with the step's one wait. */
        struct gp_task_tag tag = tag_of(GP_TASK_COPY, p->K - 1, -1, "read losses");
        ls->ops->copy(ls->compute, p->loss_parts, ls->loss_sums, sizeof(double) * (size_t)p->M, &tag);
        st = sync_all(p, err);
    }
    GP_TRY(st);
    p->steps_done++;
    double sum = 0;
    for (int j = 0; j < p->M; j++) sum += p->loss_parts[j];
    *loss_sum = sum;
    return GP_OK;
}

const char *gp_pipeline_graph_note(const struct gp_pipeline *p) { return p->graph_note[0] ? p->graph_note : NULL; }

bool gp_pipeline_graphed(const struct gp_pipeline *p) { return p->graph != NULL; }

/* clip_grad_norm_'s coefficient: the norm of the per-tensor norms, in the
 * model's parameter order (value order), each computed on its stage. */
static gp_status clip_coefficient(struct gp_pipeline *p, double clip_norm, float *coef, struct gp_error *err)
{
    int base = 0;
    for (int k = 0; k < p->K; k++) {
        struct stage *s = &p->stages[k];
        struct task *t = &p->tasks[p->sched.n_actions + 2 * p->K + k];
        *t = (struct task){.p = p, .stage = k, .micro = -1, .kind = TASK_NORMS};
        struct gp_task_tag tag = tag_of(GP_TASK_OPTIMIZER, k, -1, "gradient norms");
        s->ops->enqueue(s->compute, task_run, t, &tag);
        struct gp_task_tag ctag = tag_of(GP_TASK_COPY, k, -1, "read gradient norms");
        s->ops->copy(s->compute, p->norms_host + base, s->norms, sizeof(float) * (size_t)s->n_params, &ctag);
        base += s->n_params;
    }
    GP_TRY(sync_all(p, err));
    float *ordered = malloc(sizeof(float) * (size_t)(base + 1));
    if (!ordered) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    int n = 0;
    for (int v = 0; v < p->g->n_values; v++) {
        int offset = 0;
        for (int k = 0; k < p->K; k++) {
            struct stage *s = &p->stages[k];
            for (int i = 0; i < s->n_params; i++)
                if (s->param_values[i] == v) ordered[n++] = p->norms_host[offset + i];
            offset += s->n_params;
        }
    }
    *coef = gp_clip_coef(gp_norm2_f32(ordered, n), clip_norm);
    free(ordered);
    return GP_OK;
}

gp_status gp_pipeline_optimize(struct gp_pipeline *p, double lr, double clip_norm, struct gp_error *err)
{
    p->lr = lr;
    p->clip_coef = 1.0f;
    if (clip_norm > 0) GP_TRY(clip_coefficient(p, clip_norm, &p->clip_coef, err));
    for (int k = 0; k < p->K; k++) {
        struct stage *s = &p->stages[k];
        struct task *t = &p->tasks[p->sched.n_actions + k];
        *t = (struct task){.p = p, .stage = k, .micro = -1, .kind = TASK_OPTIMIZE};
        struct gp_task_tag tag = tag_of(GP_TASK_OPTIMIZER, k, -1, "optimizer");
        s->ops->enqueue(s->compute, task_run, t, &tag);
    }
    return sync_all(p, err);
}

gp_status gp_pipeline_eval(struct gp_pipeline *p, const void *x, float *out, struct gp_error *err)
{
    p->opts = (struct gp_step_opts){.dropout_ratio = -1};
    size_t in_bytes = p->input_bytes;
    for (int k = 0; k < p->K; k++) {
        struct stage *s = &p->stages[k];
        struct task *t = &p->tasks[p->sched.n_actions + p->K + k];
        *t = (struct task){.p = p, .stage = k, .micro = 0, .kind = TASK_EVAL};
        if (k == 0) {
            struct gp_task_tag tag = tag_of(GP_TASK_COPY, 0, 0, "load inputs");
            s->ops->copy(s->compute, addr(p, s, p->input, 0), x, in_bytes, &tag);
        } else {
            s->ops->stream_wait(s->compute, p->stages[k - 1].fwd_copied[0]);
        }
        struct gp_task_tag tag = tag_of(GP_TASK_FORWARD, k, 0, "evaluate");
        s->ops->enqueue(s->compute, task_run, t, &tag);
        s->ops->event_record(s->fwd_done[0], s->compute);
        if (k + 1 < p->K) {
            issue_forward_copy(p, k, 0);
        } else {
            const struct gp_value *o = &p->g->values[p->output];
            struct gp_task_tag ctag = tag_of(GP_TASK_COPY, k, 0, "read outputs");
            s->ops->copy(s->compute, out, addr(p, s, p->output, 0),
                         sizeof(float) * (size_t)gp_shape_numel(&o->shape), &ctag);
        }
    }
    return sync_all(p, err);
}

gp_status gp_pipeline_read(struct gp_pipeline *p, int value, float *out, struct gp_error *err)
{
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
    r->static_bytes = (int64_t)(s->plan.static_bytes - s->plan.param_bytes);
    r->activation_bytes = (int64_t)(s->plan.box_bytes * (size_t)p->M + s->plan.local_bytes * (size_t)s->n_sets +
                                    s->plan.grad_bytes + s->plan.inbox_bytes * (size_t)p->M);
    r->activation_peak = s->peak + (int64_t)s->plan.inbox_bytes * p->M;
    for (int q = 0; q < s->plan.n_frontier_in; q++) r->frontier_in_bytes += gp_value_bytes(&p->g->values[s->plan.frontier_in[q]]);
    for (int q = 0; q < s->plan.n_frontier_out; q++) r->frontier_out_bytes += gp_value_bytes(&p->g->values[s->plan.frontier_out[q]]);
    r->planned_bytes = r->param_bytes * 2 + r->optim_bytes + r->static_bytes + r->activation_bytes +
                       (int64_t)align64(s->plan.scratch_bytes);
}

gp_status gp_pipeline_write_trace(struct gp_pipeline *p, const char *path, struct gp_error *err)
{
    if (!p->cfg.trace) return gp_error_set(err, GP_ERR_INVALID, "the timeline was not recorded");
    struct gp_trace_stream streams[3 * 64];
    int n = 0;
    for (int k = 0; k < p->K && n + 3 <= (int)(sizeof streams / sizeof *streams); k++) {
        struct stage *s = &p->stages[k];
        struct gp_stream *list[3] = {s->compute, s->copy_next, s->copy_prev};
        static const char *const names[3] = {"compute", "copy to next stage", "copy to previous stage"};
        for (int q = 0; q < 3; q++) {
            if (!list[q]) continue;
            int count = 0;
            const struct gp_trace_span *spans = s->ops->trace_spans(list[q], &count);
            streams[n++] = (struct gp_trace_stream){.device = s->device, .device_name = s->ops->name,
                                                    .stream_name = names[q], .spans = spans, .count = count};
        }
    }
    return gp_trace_write(path, streams, n, err);
}
