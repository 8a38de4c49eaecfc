/* A training run saved and continued (train/resume.h). */
#include "train/resume.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/xxh64.h"

/* The shortest of 15 or 17 significant digits that reads back exactly. */
static const char *fmt_double(double v, char *buf, size_t size)
{
    snprintf(buf, size, "%.15g", v);
    if (strtod(buf, NULL) != v) snprintf(buf, size, "%.17g", v);
    return buf;
}

static gp_status hash_file(const char *path, int64_t *bytes, uint64_t *digest, struct gp_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return gp_error_set(err, GP_ERR_IO, "cannot read '%s' to identify it", path);
    unsigned char *buf = malloc(1 << 20);
    if (!buf) {
        fclose(f);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    }
    struct gp_xxh64 h;
    gp_xxh64_init(&h, 0);
    size_t n;
    *bytes = 0;
    while ((n = fread(buf, 1, 1 << 20, f)) > 0) {
        gp_xxh64_update(&h, buf, n);
        *bytes += (int64_t)n;
    }
    bool bad = ferror(f);
    fclose(f);
    free(buf);
    if (bad) return gp_error_set(err, GP_ERR_IO, "cannot read '%s' to identify it", path);
    *digest = gp_xxh64_digest(&h);
    return GP_OK;
}

/* "1437 samples of [1, 8, 8] float32, xxh64 ..." for one array of the data. */
static void data_setting(struct gp_state_meta *m, const char *key, const char *label, const struct gp_tensor *t,
                         int64_t n, const char *source)
{
    struct gp_shape row = t->shape;
    row.rank = row.rank > 0 ? row.rank - 1 : 0;
    memmove(row.dims, t->shape.dims + 1, sizeof(int64_t) * (size_t)row.rank);
    char shape[160], hex[17];
    gp_shape_format(&row, shape, sizeof shape);
    gp_xxh64_hex(gp_xxh64(t->data, gp_dataset_row_bytes(t) * (size_t)n, 0), hex);
    gp_state_set(m, key, label, GP_STATE_MATCH, source ? source : "(synthetic)", "%lld samples of %s %s, xxh64 %s",
                 (long long)n, shape, gp_dtype_name(t->dtype), hex);
}

gp_status gp_resume_settings(const struct gp_resume_run *r, struct gp_state_meta *m, struct gp_error *err)
{
    const struct gp_train_config *c = r->cfg;
    char a[64], hex[17];
    int64_t bytes = 0;
    uint64_t digest = 0;
    GP_TRY(hash_file(c->model_path, &bytes, &digest, err));
    gp_xxh64_hex(digest, hex);
    gp_state_set(m, "model", "the model", GP_STATE_MATCH, c->model_path, "%lld bytes, xxh64 %s", (long long)bytes, hex);
    data_setting(m, "data", "--data", &r->train->x, r->train->n, r->train->x_source);
    if (r->train->y.dtype != GP_DTYPE_UNDEFINED)
        data_setting(m, "labels", "--labels", &r->train->y, r->train->n, r->train->y_source);
    gp_state_set(m, "batch", "--batch", GP_STATE_MATCH, NULL, "%lld", (long long)c->batch);
    gp_state_set(m, "chunks", "--chunks", GP_STATE_MATCH, NULL, "%lld", (long long)c->chunks);
    gp_state_set(m, "shuffle", "shuffling", GP_STATE_MATCH, NULL, "%s", c->shuffle ? "on" : "off (--no-shuffle)");
    gp_state_set(m, "seed", "--seed", GP_STATE_MATCH, NULL, "%llu", (unsigned long long)c->seed);
    static const char *const losses[] = {[GP_LOSS_CROSS_ENTROPY] = "cross-entropy", [GP_LOSS_MSE] = "mse",
                                         [GP_LOSS_OUTPUT] = "output"};
    gp_state_set(m, "loss", "--loss", GP_STATE_MATCH, NULL, "%s", losses[r->loss]);
    if (r->loss == GP_LOSS_CROSS_ENTROPY)
        gp_state_set(m, "class_axis", "--class-axis", GP_STATE_MATCH, NULL, "%d", r->class_axis);
    if (c->dropout_ratio < 0) gp_state_set(m, "dropout", "--dropout", GP_STATE_MATCH, NULL, "%s", "(the model's ratios)");
    else gp_state_set(m, "dropout", "--dropout", GP_STATE_MATCH, NULL, "%s", fmt_double(c->dropout_ratio, a, sizeof a));
    bool adamw = c->optimizer == GP_OPT_ADAMW;
    gp_state_set(m, "optimizer", "--optimizer", GP_STATE_MATCH, NULL, "%s", adamw ? "adamw" : "sgd");
    gp_state_set(m, "lr", "--lr", GP_STATE_MATCH, NULL, "%s", fmt_double(c->lr, a, sizeof a));
    gp_state_set(m, "weight_decay", "--weight-decay", GP_STATE_MATCH, NULL, "%s", fmt_double(c->weight_decay, a, sizeof a));
    if (adamw) {
        gp_state_set(m, "beta1", "--beta1", GP_STATE_MATCH, NULL, "%s", fmt_double(c->beta1, a, sizeof a));
        gp_state_set(m, "beta2", "--beta2", GP_STATE_MATCH, NULL, "%s", fmt_double(c->beta2, a, sizeof a));
        gp_state_set(m, "eps", "--eps", GP_STATE_MATCH, NULL, "%s", fmt_double(c->eps, a, sizeof a));
        gp_state_set(m, "torch_arithmetic", "--torch-arithmetic", GP_STATE_MATCH, NULL, "%s", c->torch_1_13 ? "1.13" : "2");
    } else {
        gp_state_set(m, "momentum", "--momentum", GP_STATE_MATCH, NULL, "%s", fmt_double(c->momentum, a, sizeof a));
        gp_state_set(m, "nesterov", "--nesterov", GP_STATE_MATCH, NULL, "%s", c->nesterov ? "on" : "off");
    }
    static const char *const schedules[] = {"constant", "step", "cosine"};
    gp_state_set(m, "schedule", "--schedule", GP_STATE_MATCH, NULL, "%s", schedules[c->schedule]);
    if (c->schedule == GP_SCHED_STEP) {
        gp_state_set(m, "step_size", "--step-size", GP_STATE_MATCH, NULL, "%lld", (long long)c->step_size);
        gp_state_set(m, "gamma", "--gamma", GP_STATE_MATCH, NULL, "%s", fmt_double(c->gamma, a, sizeof a));
    } else if (c->schedule == GP_SCHED_COSINE) {
        gp_state_set(m, "warmup_steps", "--warmup-steps", GP_STATE_MATCH, NULL, "%lld", (long long)c->warmup_steps);
        gp_state_set(m, "min_lr", "--min-lr", GP_STATE_MATCH, NULL, "%s", fmt_double(c->min_lr, a, sizeof a));
        gp_state_set(m, "schedule_steps", "a cosine schedule over", GP_STATE_MATCH, NULL, "%lld steps",
                     (long long)r->total_steps);
    }
    if (c->clip_norm > 0) gp_state_set(m, "clip_norm", "--clip-norm", GP_STATE_MATCH, NULL, "%s", fmt_double(c->clip_norm, a, sizeof a));
    else gp_state_set(m, "clip_norm", "--clip-norm", GP_STATE_MATCH, NULL, "%s", "(none)");
    gp_state_set(m, "precision", "--precision", GP_STATE_MATCH, NULL, "%s", gp_precision_name(c->precision));
    gp_state_set(m, "deferred_batch_norm", "--deferred-batch-norm", GP_STATE_MATCH, NULL, "%s",
                 c->deferred_batch_norm ? "on" : "off");

    /* What changes the last bits but not what is trained: noted. */
    int n_stages = c->n_stages > 0 ? c->n_stages : 1;
    bool cpu = false, cuda = false;
    char devices[64 * 12] = "";
    size_t len = 0;
    for (int k = 0; k < n_stages && len < sizeof devices; k++) {
        cuda |= c->stage_cuda[k];
        cpu |= !c->stage_cuda[k];
        len += (size_t)snprintf(devices + len, sizeof devices - len, "%s%s:%d", k ? "," : "",
                                c->stage_cuda[k] ? "cuda" : "cpu", c->stage_device[k]);
    }
    gp_state_set(m, "backend", "stages on", GP_STATE_NOTE, NULL, "%s", cpu && cuda ? "CPUs and GPUs" : cuda ? "GPUs" : "CPUs");
    gp_state_set(m, "fast_conv", "--fast-conv", GP_STATE_NOTE, NULL, "%s", cuda && c->fast_conv ? "on" : "off");

    /* What does not change the result. */
    gp_state_set(m, "steps", "--steps", GP_STATE_FREE, NULL, "%lld", (long long)r->total_steps);
    gp_state_set(m, "devices", "--devices", GP_STATE_FREE, NULL, "%s", devices);
    char balance[64 * 12] = "";
    len = 0;
    for (int k = 0; k < n_stages && c->balance[0] && len < sizeof balance; k++)
        len += (size_t)snprintf(balance + len, sizeof balance - len, "%s%d", k ? "," : "", c->balance[k]);
    gp_state_set(m, "balance", "--balance", GP_STATE_FREE, NULL, "%s", balance[0] ? balance : "(even)");
    /* GPipe and 1F1B run every backward in micro-batch order, so parameter
     * gradients are summed in the same order: the same arithmetic, bit for
     * bit (tests/test_pipeline.c checks it), only the timing differs. */
    gp_state_set(m, "pipeline_schedule", "--pipeline-schedule", GP_STATE_FREE, NULL, "%s",
                 gp_pipe_schedule_name(c->pipeline_schedule));
    gp_state_set(m, "checkpoint", "--checkpoint", GP_STATE_FREE, NULL, "%s", gp_checkpoint_name(c->checkpoint));
    /* Stages as processes compute one process's bits; data-parallel
     * replicas sum each gradient in another order (README, "Several
     * processes"), so a state continued with another number of them is
     * noted. Recorded only where there are replicas: a state of one
     * replica reads as before. */
    if (c->remote && c->remote->replicas > 1)
        gp_state_set(m, "replicas", "data-parallel replicas", GP_STATE_NOTE, NULL, "%d", c->remote->replicas);
    return GP_OK;
}

/* Parameters and buffers (BatchNorm running statistics) a state holds: the
 * values --save writes back. */
static bool persistent(const struct gp_value *v)
{
    return v->is_initializer && (v->kind == GP_VALUE_PARAMETER || v->kind == GP_VALUE_BUFFER) &&
           gp_dtype_is_float(v->dtype);
}

static const char *role_of(const struct gp_value *v)
{
    return v->kind == GP_VALUE_PARAMETER ? "parameter" : "buffer";
}

gp_status gp_resume_save(const struct gp_resume_run *r, const struct gp_state_meta *m, char *path, size_t path_size,
                         struct gp_error *err)
{
    const struct gp_graph *g = r->g;
    int64_t largest = 1;
    for (int v = 0; v < g->n_values; v++)
        if (persistent(&g->values[v]) && gp_shape_numel(&g->values[v].shape) > largest)
            largest = gp_shape_numel(&g->values[v].shape);
    float *buf = malloc(sizeof(float) * (size_t)largest);
    if (!buf) return gp_error_set(err, GP_ERR_NOMEM, "out of memory saving the training state");
    /* Stages in other processes: every process takes part in the reads,
     * which gather each tensor to stage 0's process of replica 0; that one
     * alone writes, so a state folder is whole or absent whichever process
     * fails (a failed read aborts its writer, and the job ends). */
    const struct gp_pipe_remote *remote = r->cfg->remote;
    bool writer = !remote || (remote->stage == 0 && remote->replica == 0);
    struct gp_state_writer *w = NULL;
    gp_status st = writer ? gp_state_begin(r->cfg->state_dir, m->step, &w, err) : GP_OK;
    int slots = gp_pipeline_optim_slots(r->pipe);
    for (int v = 0; st == GP_OK && v < g->n_values; v++) {
        const struct gp_value *val = &g->values[v];
        if (!persistent(val)) continue;
        if ((st = gp_pipeline_read(r->pipe, v, buf, err)) == GP_OK && writer)
            st = gp_state_add(w, val->name, role_of(val), &val->shape, buf, err);
        for (int q = 0; st == GP_OK && val->kind == GP_VALUE_PARAMETER && q < slots; q++)
            if ((st = gp_pipeline_read_optim(r->pipe, v, q, buf, err)) == GP_OK && writer)
                st = gp_state_add(w, val->name, gp_pipeline_optim_slot_name(r->pipe, q), &val->shape, buf, err);
    }
    free(buf);
    if (!writer) {
        if (path_size) path[0] = '\0';
        return st;
    }
    if (st == GP_OK) return gp_state_commit(w, m, r->cfg->keep, path, path_size, err);
    gp_state_abort(w);
    return st;
}

/* The state's parameters and buffers are this model's, by name and shape. */
static gp_status check_model(const struct gp_resume_run *r, const struct gp_state *s, struct gp_error *err)
{
    const struct gp_graph *g = r->g;
    const char *model = r->cfg->model_path;
    for (int v = 0; v < g->n_values; v++) {
        const struct gp_value *val = &g->values[v];
        if (!persistent(val)) continue;
        const struct gp_state_tensor *t = gp_state_find(s, val->name, role_of(val));
        char a[160], b[160];
        if (!t)
            return gp_error_set(err, GP_ERR_INVALID,
                                "%s is of another model: it has no %s '%s', which %s has", s->path, role_of(val),
                                val->name, model);
        if (!gp_shape_equal(&t->shape, &val->shape))
            return gp_error_set(err, GP_ERR_INVALID, "%s is of another model: '%s' is %s there, %s in %s", s->path,
                                val->name, gp_shape_format(&t->shape, a, sizeof a),
                                gp_shape_format(&val->shape, b, sizeof b), model);
    }
    for (int i = 0; i < s->n_tensors; i++) {
        const struct gp_state_tensor *t = &s->tensors[i];
        if (strcmp(t->role, "parameter") && strcmp(t->role, "buffer")) continue;
        int v = gp_graph_find_value(g, t->name);
        if (v < 0 || !persistent(&g->values[v]))
            return gp_error_set(err, GP_ERR_INVALID, "%s is of another model: it has a %s '%s', which %s has not",
                                s->path, t->role, t->name, model);
    }
    return GP_OK;
}

gp_status gp_resume_restore(const struct gp_resume_run *r, struct gp_state *s, const struct gp_state_meta *now,
                            void (*note)(void *user, const char *message), void *user, struct gp_error *err)
{
    const struct gp_graph *g = r->g;
    GP_TRY(check_model(r, s, err));
    if (gp_state_compare(&s->meta, now, note, user, err) != GP_OK) {
        gp_error_prefix(err, "cannot resume from %s: ", s->path);
        return err ? err->status : GP_ERR_INVALID;
    }
    if (s->meta.step > r->total_steps)
        return gp_error_set(err, GP_ERR_INVALID,
                            "cannot resume from %s: it is at step %lld, past this run's %lld steps (give more --steps "
                            "or --epochs)",
                            s->path, (long long)s->meta.step, (long long)r->total_steps);
    if (s->meta.steps_per_epoch != r->steps_per_epoch)
        return gp_error_set(err, GP_ERR_INVALID, "cannot resume from %s: it has %lld steps per epoch, this run %lld",
                            s->path, (long long)s->meta.steps_per_epoch, (long long)r->steps_per_epoch);
    int64_t largest = 1;
    for (int i = 0; i < s->n_tensors; i++)
        if (gp_shape_numel(&s->tensors[i].shape) > largest) largest = gp_shape_numel(&s->tensors[i].shape);
    float *buf = malloc(sizeof(float) * (size_t)largest);
    if (!buf) return gp_error_set(err, GP_ERR_NOMEM, "out of memory resuming");
    gp_status st = GP_OK;
    int slots = gp_pipeline_optim_slots(r->pipe);
    for (int v = 0; st == GP_OK && v < g->n_values; v++) {
        const struct gp_value *val = &g->values[v];
        if (!persistent(val)) continue;
        const struct gp_state_tensor *t = gp_state_find(s, val->name, role_of(val));
        if ((st = gp_state_read(s, t, buf, err)) == GP_OK) st = gp_pipeline_write(r->pipe, v, buf, err);
        for (int q = 0; st == GP_OK && val->kind == GP_VALUE_PARAMETER && q < slots; q++) {
            const char *slot = gp_pipeline_optim_slot_name(r->pipe, q);
            t = gp_state_find(s, val->name, slot);
            if (!t || !gp_shape_equal(&t->shape, &val->shape))
                st = gp_error_set(err, GP_ERR_INVALID, "cannot resume from %s: it has no optimizer state %s of '%s'%s",
                                  s->path, slot, val->name, t ? " of its shape" : "");
            else if ((st = gp_state_read(s, t, buf, err)) == GP_OK)
                st = gp_pipeline_write_optim(r->pipe, v, q, buf, err);
        }
    }
    free(buf);
    GP_TRY(st);
    gp_pipeline_set_optim_steps(r->pipe, s->meta.optimizer_steps);
    return GP_OK;
}
