/* A pipeline stage: its plan (which values it holds where), its device
 * memory planned once and checked against what the device has free before
 * anything is allocated, its streams and events, its parameters (uploaded
 * once) and optimizer, and their release. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/internal.h"
#include "util/env.h"

/* The stage's device memory, all planned here: what each block holds and
 * its bytes. Checked against what the device has free before anything is
 * allocated, so a model that cannot fit says so with the whole account. */
struct block_plan {
    const char *what;
    size_t bytes;
    unsigned char **at;
};

/* The first stage's float32 inputs inside its arena-and-gradients block
 * (GP_INPUTS_IN_BLOCK=0: a block of their own). Where the stage stores its
 * data input in another type (bf16), the step's first forward converts
 * every micro-batch's rows into its box (tasks.c), which holds them until
 * that micro-batch's backward (a recomputation reads the box): the float32
 * rows are dead before any layer runs, so the forward's arena and the
 * backward's gradient set may take their place. That needs a box per
 * micro-batch, none reused in the step, and the stage's first forward to
 * be micro-batch 0's (GPipe and 1F1B both start so). The next step's rows
 * arrive after this step's last task, on the same stream. */
static bool inputs_in_block(const struct gp_pipeline *p, const struct stage *s, int k)
{
    if (k != 0 || !s->plan.grads_share_arena || !gp_env_flag("GP_INPUTS_IN_BLOCK", true)) return false;
    if (p->g->values[p->input].dtype != GP_DTYPE_FLOAT32 || s->plan.dt[p->input] == GP_DTYPE_FLOAT32) return false;
    const struct gp_stage_slots *sl = &s->slots;
    if (sl->n_boxes < p->M) return false;
    for (int j = 0; j < p->M; j++)
        if (sl->box[j] != j || sl->box_after[j] >= 0) return false;
    for (int a = 0; a < p->sched.n_actions; a++) {
        const struct gp_action *act = &p->sched.actions[a];
        if (act->stage == 0 && act->kind == GP_ACT_FORWARD) return act->microbatch == 0;
    }
    return false;
}

/* The arena-and-gradients block of a stage where they share one, at
 * least the inputs' where they lie there (s->inputs_inside). */
static size_t shared_block_bytes(const struct gp_pipeline *p, const struct stage *s)
{
    size_t bytes = gp_plan_shared_bytes(&s->plan), in_bytes = p->input_bytes * (size_t)p->M;
    return s->inputs_inside && in_bytes > bytes ? in_bytes : bytes;
}

static int stage_blocks(struct gp_pipeline *p, struct stage *s, int k, struct block_plan *b)
{
    bool last = k == p->K - 1;
    size_t loss_scratch = last ? s->cops->loss_scratch_bytes(&p->g->values[p->output].shape) : 0;
    size_t scratch = s->plan.scratch_bytes > loss_scratch ? s->plan.scratch_bytes : loss_scratch;
    int n = 0;
    b[n++] = (struct block_plan){"parameters and constants", s->plan.static_bytes, &s->static_block};
    b[n++] = (struct block_plan){"parameter gradients", s->plan.param_bytes, &s->param_grads};
    b[n++] = (struct block_plan){"optimizer state", s->optim_bytes_planned, &s->optim_state};
    /* Per-micro-batch blocks: as many as the schedule has in use at once (slots.h). */
    b[n++] = (struct block_plan){"input frontiers", s->plan.box_bytes * (size_t)s->slots.n_boxes, &s->boxes};
    b[n++] = (struct block_plan){"activations", s->plan.local_bytes * (size_t)s->slots.n_sets, &s->locals};
    /* The gradient set in the arena's block when they share it (plan.h). */
    bool inputs_inside = s->inputs_inside; /* decided with the plan (allocate_stage) */
    if (s->plan.grads_share_arena)
        b[n++] = (struct block_plan){inputs_inside ? "forward-only activations, activation gradients and the "
                                                     "float32 inputs (one block)"
                                                   : "forward-only activations and activation gradients (one block)",
                                     shared_block_bytes(p, s), &s->arena};
    else
        b[n++] = (struct block_plan){"forward-only activations", s->plan.arena_bytes, &s->arena};
    b[n++] = (struct block_plan){"values made once per step", s->plan.step_bytes, &s->step_block};
    b[n++] = (struct block_plan){"their gradients", s->plan.step_grad_bytes, &s->step_grads};
    b[n++] = (struct block_plan){"bfloat16 weight copies", s->plan.shadow_bytes, &s->shadows};
    b[n++] = (struct block_plan){"channels-last filter copies", s->plan.filter_bytes, &s->filters};
    b[n++] = (struct block_plan){"their gradients' copies", s->plan.filter_grad_bytes, &s->filter_grads};
    b[n++] = (struct block_plan){"float32 staging", s->plan.staging_bytes, &s->staging};
    if (!s->plan.grads_share_arena)
        b[n++] = (struct block_plan){"activation gradients", s->plan.grad_bytes, &s->grads};
    b[n++] = (struct block_plan){"gradient inboxes", s->plan.inbox_bytes * (size_t)s->slots.n_inboxes, &s->inboxes};
    b[n++] = (struct block_plan){"kernel workspace", scratch, &s->scratch};
    b[n++] = (struct block_plan){"library workspace", s->cops->context_bytes, &s->libs};
    b[n++] = (struct block_plan){"targets", last ? p->target_bytes * (size_t)p->M : 0, &s->targets};
    if (!inputs_inside)
        b[n++] = (struct block_plan){"inputs", k == 0 ? p->input_bytes * (size_t)p->M : 0, &s->inputs};
    if (k == 0) p->ahead_bf16 = gp_pipe_ahead_bf16_wanted(p, s);
    b[n++] = (struct block_plan){"the next step's inputs", k == 0 ? gp_pipe_ahead_device_bytes(p) : 0,
                                 &s->inputs_ahead};
    b[n++] = (struct block_plan){"step number", sizeof(uint64_t), &s->step_dev};
    b[n++] = (struct block_plan){"optimizer scalars", sizeof(struct gp_optim_scalars), &s->scalars};
    b[n++] = (struct block_plan){"loss sums", last ? sizeof(double) * (size_t)p->M : 0, &s->loss_sums};
    b[n++] = (struct block_plan){"gradient norms", sizeof(float) * (size_t)(s->n_params + 1), &s->norms};
    return n;
}

/* "what 1.2 MiB, what 3.4 MiB, ...": the blocks that take any bytes. */
static void block_account(const struct block_plan *b, int n, char *account, size_t size)
{
    size_t len = 0;
    account[0] = '\0';
    for (int i = 0; i < n && len < size; i++)
        if (b[i].bytes)
            len += (size_t)snprintf(account + len, size - len, "%s%s %.1f MiB", len ? ", " : "", b[i].what,
                                    (double)b[i].bytes / (1 << 20));
}

/* The refusal with the whole account: what the stage needs, block by
 * block, beside what the device has free. `failed` names the block whose
 * allocation failed after the check passed (NULL: the check refused), as
 * when a library took memory in between. */
static gp_status no_room(const struct stage *s, const struct block_plan *b, int n, size_t total, size_t avail,
                         bool limited, const char *failed, struct gp_error *err)
{
    char account[1024];
    block_account(b, n, account, sizeof account);
    char when[160] = "";
    if (failed) snprintf(when, sizeof when, " (allocating the %s failed)", failed);
    return gp_error_set(err, GP_ERR_NOMEM,
                        "layers %d-%d need %.1f MiB on %s:%d but only %.1f MiB %s%s (%s): use "
                        "more stages or devices, a smaller --batch, more --chunks, or --checkpoint "
                        "always",
                        s->plan.first, s->plan.last - 1, (double)total / (1 << 20), s->ops->name, s->device,
                        (double)avail / (1 << 20), limited ? "are allowed (--memory-limit)" : "are free", when,
                        account);
}

static size_t blocks_total(const struct block_plan *b, int n)
{
    size_t total = 0;
    for (int i = 0; i < n; i++) total += align64(b[i].bytes ? b[i].bytes : 64);
    return total;
}

/* The stage's blocks as now planned, into b (*n of them, *total bytes),
 * with where its inputs lie decided first (inputs_in_block). */
static void account_blocks(struct gp_pipeline *p, struct stage *s, int k, struct block_plan *b, int *n, size_t *total)
{
    s->inputs_inside = inputs_in_block(p, s, k);
    *n = stage_blocks(p, s, k, b);
    *total = blocks_total(b, *n);
}

static gp_status plan_stage(struct gp_pipeline *p, struct stage *s, int k, int first, int last, bool remake,
                            const bool *only, struct gp_error *err);

size_t gp_pipe_stage_allocated(const struct gp_pipeline *p, int k)
{
    struct block_plan b[28];
    /* stage_blocks only reads (its block pointers are where allocation writes). */
    int n = stage_blocks((struct gp_pipeline *)p, (struct stage *)&p->stages[k], k, b);
    return blocks_total(b, n);
}

/* Plans the stage again (remaking the values marked in `only`, or every
 * one it can with NULL), its blocks into b. */
static gp_status replan(struct gp_pipeline *p, struct stage *s, int k, const bool *only, struct block_plan *b, int *n,
                        size_t *total, struct gp_error *err)
{
    int first = s->plan.first, last = s->plan.last;
    gp_plan_free(&s->plan);
    GP_TRY(plan_stage(p, s, k, first, last, true, only, err));
    account_blocks(p, s, k, b, n, total);
    return GP_OK;
}

struct remade_value {
    size_t bytes;
    int v;
};

/* The larger first, then the earlier value. */
static int remade_order(const void *x, const void *y)
{
    const struct remade_value *a = x, *b = y;
    if (a->bytes != b->bytes) return a->bytes > b->bytes ? -1 : 1;
    return (a->v > b->v) - (a->v < b->v);
}

/* --recompute-norm auto on a stage that does not fit as planned: the
 * fewest BatchNorm outputs remade, the largest first, that make it fit.
 * Each remade output costs one more pass over its bytes, so remaking only
 * the largest few saves the memory needed for a fraction of the time of
 * remaking all (a ResNet's largest are its first stages'). Planned with
 * every one remade first: where even that does not fit, that plan stays
 * and the refusal says what it needs; else a bisection on how many of the
 * largest are remade, each count planned (memory is not exactly monotone
 * in the count: the bisection ends on a count that fits). */
static gp_status fit_by_remaking(struct gp_pipeline *p, struct stage *s, int k, size_t avail, struct block_plan *b,
                                 int *n, size_t *total, struct gp_error *err)
{
    GP_TRY(replan(p, s, k, NULL, b, n, total, err));
    int nl = s->plan.last - s->plan.first;
    int all = s->remade_values ? s->plan.remade_start[nl + 1] : 0;
    if (all < 2 || *total > avail) return GP_OK;
    struct remade_value *order = malloc(sizeof *order * (size_t)all);
    bool *only = calloc((size_t)p->g->n_values + 1, sizeof(bool));
    if (!order || !only) {
        free(order);
        free(only);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory planning a stage");
    }
    for (int q = 0; q < all; q++) {
        int v = s->plan.remade[q];
        order[q] = (struct remade_value){gp_plan_value_bytes(p->g, &s->plan, v), v};
    }
    qsort(order, (size_t)all, sizeof *order, remade_order);
    int lo = 0, hi = all; /* none remade does not fit; all do */
    gp_status st = GP_OK;
    while (st == GP_OK && hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        memset(only, 0, sizeof(bool) * ((size_t)p->g->n_values + 1));
        for (int q = 0; q < mid; q++) only[order[q].v] = true;
        st = replan(p, s, k, only, b, n, total, err);
        if (st == GP_OK && *total <= avail) hi = mid;
        else lo = mid;
    }
    if (st == GP_OK) {
        memset(only, 0, sizeof(bool) * ((size_t)p->g->n_values + 1));
        for (int q = 0; q < hi; q++) only[order[q].v] = true;
        st = replan(p, s, k, hi == all ? NULL : only, b, n, total, err);
    }
    free(order);
    free(only);
    return st;
}

/* fit_by_remaking from the plan with none remade, which may fit now (the
 * first stage without its buffer of uploads ahead). */
static gp_status fit_anew(struct gp_pipeline *p, struct stage *s, int k, size_t avail, struct block_plan *b, int *n,
                          size_t *total, struct gp_error *err)
{
    bool *none = calloc((size_t)p->g->n_values + 1, sizeof(bool));
    if (!none) return gp_error_set(err, GP_ERR_NOMEM, "out of memory planning a stage");
    gp_status st = replan(p, s, k, none, b, n, total, err);
    free(none);
    GP_TRY(st);
    return *total > avail ? fit_by_remaking(p, s, k, avail, b, n, total, err) : GP_OK;
}

static gp_status allocate_stage(struct gp_pipeline *p, struct stage *s, int k, struct gp_error *err)
{
    struct block_plan b[28];
    int n;
    size_t total;
    account_blocks(p, s, k, b, &n, &total);
    /* Stages sharing a device: the earlier ones' memory is already taken,
     * so the device's free bytes are what this stage can have. */
    size_t avail = s->ops->mem_available ? s->ops->mem_available(s->dev) : SIZE_MAX;
    /* train --memory-limit: the stage plans as on a device with no more
     * free than that (auto below remakes what it must). */
    bool limited = p->cfg.memory_limit && p->cfg.memory_limit < avail;
    if (limited) avail = p->cfg.memory_limit;
    /* --recompute-norm auto: a stage that does not fit as planned is
     * planned again with the fewest BatchNorm outputs remade in the
     * backward that make it fit (fit_by_remaking). */
    bool auto_fit = p->cfg.remake_norm_if_short && !s->remade_values;
    if (avail && total > avail && auto_fit) GP_TRY(fit_by_remaking(p, s, k, avail, b, &n, &total, err));
    /* The next step's inputs uploaded ahead (inputs_ahead.c) are a speed-up
     * that a first stage which does not fit gives up before it is refused.
     * Remaking comes first: a remade output costs one more pass over its
     * bytes on the device, the upload given up a whole batch's crossing of
     * the host link every step (ResNet-50: 77 MB, 1.4 ms). Without the
     * buffer, auto plans again from none remade. */
    if (avail && total > avail && k == 0 && p->ahead_bytes) {
        p->ahead_given_up = gp_pipe_ahead_device_bytes(p);
        p->ahead_bytes = 0;
        if (auto_fit) {
            GP_TRY(fit_anew(p, s, k, avail, b, &n, &total, err));
        } else {
            account_blocks(p, s, k, b, &n, &total);
        }
    }
    /* GP_MEMORY_VERBOSE=1: every stage's account on stderr, block by block
     * (what the trainer's table sums into activations, workspace, ...). */
    if (gp_env_flag("GP_MEMORY_VERBOSE", false)) {
        char account[1024];
        block_account(b, n, account, sizeof account);
        fprintf(stderr, "memory: stage %d (layers %d-%d) on %s:%d: %.1f MiB: %s\n", k, s->plan.first,
                s->plan.last - 1, s->ops->name, s->device, (double)total / (1 << 20), account);
        int addends = gp_plan_addends(p->g, &s->plan);
        if (addends)
            fprintf(stderr, "memory: stage %d: %d gradients' last terms added as their producer reads them "
                    "(GP_GRAD_ADDENDS)\n", k, addends);
        /* Which layer the kernel workspace is sized for (one layer's
         * call sets it: the one to look at when it is large). */
        if (s->plan.scratch_layer >= 0) {
            const struct gp_node *nd = &p->g->nodes[s->plan.scratch_layer];
            fprintf(stderr, "memory: stage %d: its kernel workspace, %.1f MiB, is layer %d's ('%s', %s)\n", k,
                    (double)s->plan.scratch_bytes / (1 << 20), s->plan.scratch_layer, nd->name, nd->op_type);
        }
    }
    if (avail && total > avail) return no_room(s, b, n, total, avail, limited, NULL, err);
    for (int i = 0; i < n; i++) {
        *b[i].at = s->ops->alloc(s->dev, b[i].bytes ? b[i].bytes : 64);
        if (!*b[i].at)
            return no_room(s, b, n, total, s->ops->mem_available ? s->ops->mem_available(s->dev) : 0, false,
                           b[i].what, err);
    }
    /* The inputs at the shared block's start (inputs_in_block). */
    if (s->inputs_inside) s->inputs = s->arena;
    return GP_OK;
}

/* Static values start from the model (floats become float32), written on
 * the host a chunk at a time and copied to the device: the host holds one
 * chunk, not the whole block, beside the model's weights; and the pages of
 * weights that are views of the model file are given back once uploaded. */
static gp_status upload_static(struct gp_pipeline *p, struct stage *s, struct gp_error *err)
{
    const struct gp_graph *g = p->g;
    if (!s->plan.static_bytes) return GP_OK;
    size_t chunk = s->plan.static_bytes < ((size_t)64 << 20) ? s->plan.static_bytes : (size_t)64 << 20;
    unsigned char *host = malloc(chunk);
    if (!host) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    struct gp_task_tag tag = {.kind = GP_TASK_COPY, .stage = -1, .microbatch = -1, .name = "load parameters"};
    gp_status st = GP_OK;
    for (int v = 0; v < g->n_values && st == GP_OK; v++) {
        if (s->plan.home[v] != GP_HOME_STATIC) continue;
        const struct gp_value *val = &g->values[v];
        bool f = gp_dtype_is_float(val->dtype);
        size_t es = f ? sizeof(float) : gp_dtype_size(val->dtype);
        int64_t n = gp_shape_numel(&val->shape), per = (int64_t)(chunk / es);
        for (int64_t e0 = 0; e0 < n && st == GP_OK; e0 += per) {
            int64_t e1 = n - e0 < per ? n : e0 + per;
            if (f)
                for (int64_t e = e0; e < e1; e++)
                    ((float *)host)[e - e0] = (float)gp_tensor_get_f64(val->constant, e);
            else
                memcpy(host, (const unsigned char *)val->constant->data + (size_t)e0 * es,
                       (size_t)(e1 - e0) * es);
            s->ops->copy(s->compute, (unsigned char *)s->static_block + s->plan.off[v] + (size_t)e0 * es,
                         host, (size_t)(e1 - e0) * es, &tag);
            /* The chunk is reused: the copy must have read it. */
            st = s->ops->stream_synchronize(s->compute, err);
        }
        if (st == GP_OK) gp_tensor_drop_view_pages(val->constant);
    }
    free(host);
    return st;
}

/* The activation memory a plan takes with the stage's slots: the sets,
 * the arena and the gradient set (boxes and inboxes do not depend on it). */
static size_t plan_activation_bytes(const struct stage *s, const struct gp_stage_plan *plan)
{
    return plan->local_bytes * (size_t)s->slots.n_sets + gp_plan_shared_bytes(plan);
}

/* The stage's plan. With `remake` (--recompute-norm always, or auto for a
 * stage that did not fit otherwise), BatchNorm outputs remade in the
 * backward (plan.h) unless that costs this stage memory: a remade value
 * also lives in the arena during the forward and in the gradient set
 * during the backward, which on a small stage (or with one set, when
 * checkpointing) can grow those by more than the set shrinks; so the
 * stage is planned both ways and keeps the smaller (the kept outputs on
 * a tie: no extra pass). */
static gp_status plan_stage(struct gp_pipeline *p, struct stage *s, int k, int first, int last, bool remake,
                            const bool *only, struct gp_error *err)
{
    const struct gp_graph *g = p->g;
    struct gp_compute_options opts = p->cfg.compute;
    opts.remake_norm = remake;
    opts.remake_only = only;
    s->remade_values = 0;
    s->remade_saved_bytes = 0;
    GP_TRY(gp_plan_stage(g, &p->layers, p->needs_grad, s->cops, &opts, s->ops->name, first, last, &s->plan, err));
    s->plan.grads_share_arena = k == 0;
    int remade = s->plan.remade_start ? s->plan.remade_start[last - first + 1] : 0;
    if (!remade) return GP_OK;
    struct gp_compute_options keep = p->cfg.compute;
    keep.remake_norm = false;
    struct gp_stage_plan kept;
    GP_TRY(gp_plan_stage(g, &p->layers, p->needs_grad, s->cops, &keep, s->ops->name, first, last, &kept, err));
    kept.grads_share_arena = s->plan.grads_share_arena;
    size_t with = plan_activation_bytes(s, &s->plan), without = plan_activation_bytes(s, &kept);
    if (with < without) {
        s->remade_values = remade;
        s->remade_saved_bytes = without - with;
        gp_plan_free(&kept);
    } else {
        gp_plan_free(&s->plan);
        s->plan = kept;
    }
    return GP_OK;
}

gp_status gp_pipe_create_stage(struct gp_pipeline *p, int k, int first, int last, struct gp_error *err)
{
    const struct gp_graph *g = p->g;
    struct stage *s = &p->stages[k];
    s->ops = p->cfg.device_ops[k];
    s->cops = s->ops->compute;
    s->device = p->cfg.device_index[k];
    if (!s->cops)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "the %s backend cannot run kernels in this build",
                            s->ops->name);
    GP_TRY(plan_stage(p, s, k, first, last, p->cfg.compute.remake_norm, NULL, err));
    /* A stage of another process: its plan says what crosses its
     * boundaries; its memory and streams are that process's. */
    if (!stage_local(p, k)) return GP_OK;
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
    if (k > 0 && !stage_local(p, k - 1)) {
        snprintf(name, sizeof name, "receive s%d->s%d", k - 1, k);
        GP_TRY(s->ops->stream_create(s->dev, name, &s->recv_prev, err));
    }
    if (k + 1 < p->K && !stage_local(p, k + 1)) {
        snprintf(name, sizeof name, "receive s%d->s%d", k + 1, k);
        GP_TRY(s->ops->stream_create(s->dev, name, &s->recv_next, err));
    }

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
    if (s->plan.grads_share_arena) s->grads = s->arena;
    GP_TRY(s->cops->context_create(s->dev, s->compute, &p->cfg.compute, s->libs, &s->cctx, err));
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

    struct gp_event ***lists[6] = {&s->fwd_done, &s->fwd_copied, &s->bwd_done, &s->bwd_copied, &s->act_in, &s->grad_in};
    for (int e = 0; e < 6; e++) {
        if ((e == 4 && !s->recv_prev) || (e == 5 && !s->recv_next)) continue;
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
        struct gp_stream *streams[STAGE_STREAMS];
        int n = gp_pipe_stage_streams(s, streams, NULL);
        for (int q = 0; q < n; q++) s->ops->trace_enable(streams[q], 1);
    }
    return GP_OK;
}

int gp_pipe_stage_streams(const struct stage *s, struct gp_stream **out, const char **names)
{
    struct gp_stream *all[STAGE_STREAMS] = {s->compute, s->copy_next, s->copy_prev, s->recv_prev, s->recv_next};
    static const char *const all_names[STAGE_STREAMS] = {"compute", "copy to next stage", "copy to previous stage",
                                                         "receive from previous stage", "receive from next stage"};
    int n = 0;
    for (int q = 0; q < STAGE_STREAMS; q++) {
        if (!all[q]) continue;
        if (names) names[n] = all_names[q];
        out[n++] = all[q];
    }
    return n;
}

void gp_pipe_free_stages(struct gp_pipeline *p)
{
    for (int k = 0; p->stages && k < p->K; k++) {
        struct stage *s = &p->stages[k];
        const struct gp_device_ops *ops = s->ops;
        if (ops) {
            struct gp_stream *streams[STAGE_STREAMS];
            int n = gp_pipe_stage_streams(s, streams, NULL);
            for (int q = 0; q < n; q++) ops->stream_destroy(streams[q]);
            struct gp_event **lists[6] = {s->fwd_done, s->fwd_copied, s->bwd_done, s->bwd_copied, s->act_in, s->grad_in};
            for (int e = 0; e < 6; e++) {
                for (int j = 0; lists[e] && j < p->M; j++)
                    if (lists[e][j]) ops->event_destroy(lists[e][j]);
                free(lists[e]);
            }
            struct gp_event *optimizer_events[4] = {s->grads_final, s->tied_done, s->ready, s->guard_done};
            for (int e = 0; e < 4; e++)
                if (optimizer_events[e]) ops->event_destroy(optimizer_events[e]);
            if (s->cops && s->cctx) s->cops->context_destroy(s->cctx);
            if (s->grads == s->arena) s->grads = NULL; /* one block (grads_share_arena) */
            if (s->inputs_inside) s->inputs = NULL; /* in the arena's block */
            unsigned char *blocks[26] = {s->static_block, s->param_grads,  s->boxes,       s->locals,
                                         s->grads,        s->inboxes,      s->scratch,     s->targets,
                                         s->loss_sums,    s->norms,        s->optim_state, s->inputs,
                                         s->libs,         s->step_dev,     s->arena,       s->step_block,
                                         s->step_grads,   s->shadows,      s->staging,     s->scalars,
                                         s->norms_all,    s->norm_order,   s->tied_scratch, s->filters,
                                         s->filter_grads,   s->inputs_ahead};
            for (int b = 0; b < 26; b++)
                if (blocks[b]) ops->free(s->dev, blocks[b]);
            for (int i = 0; s->bn_stats && i < s->plan.last - s->plan.first; i++)
                if (s->bn_stats[i]) ops->free(s->dev, s->bn_stats[i]);
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
        gp_stage_slots_free(&s->slots);
    }
    /* Devices close once every stage's memory on them is freed; a device
     * shared by several stages closes once. */
    for (int k = 0; p->stages && k < p->K; k++) {
        struct stage *s = &p->stages[k];
        bool first_user = true;
        for (int q = 0; q < k; q++)
            if (p->stages[q].dev == s->dev) first_user = false;
        if (s->ops && s->dev && first_user) s->ops->close(s->dev);
    }
    free(p->stages);
}
