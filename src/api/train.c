/* The public API: training, running the model forward, saving it
 * (include/gpipe_onnx.h). Training writes the trained model into a
 * temporary file of the context, which then holds those weights; in a job
 * of several processes api/job.c trains this rank's stage through the
 * same steps (gpo_train_resolve, gpo_train_resolved). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/api.h"
#include "backend/backends.h"
#include "data/dataset.h"
#include "data/npy.h"
#include "onnx/save.h"
#include "partitioner/run.h"
#include "train/predict.h"
#include "train/state.h"
#include "train/trainer.h"
#include "util/atomic_file.h"

void gpo_train_config_init(struct gpo_train_config *c)
{
    memset(c, 0, sizeof *c);
    c->batch = 32;
    c->chunks = 1;
    c->epochs = 1;
    c->weight_decay = -1;
    c->dropout = -1;
    c->checkpoint = GPO_CHECKPOINT_EXCEPT_LAST;
    c->keep = 2;
    c->beta1 = 0.9;
    c->beta2 = 0.999;
    c->eps = 1e-8;
    c->step_size = 30;
    c->gamma = 0.1;
    c->class_axis = GPO_CLASS_AXIS_AUTO;
    c->cuda_graph = -1;
}

void gpo_predict_options_init(struct gpo_predict_options *o)
{
    memset(o, 0, sizeof *o);
    o->batch = 32;
}

void gpo_tensor_free(struct gpo_tensor *t)
{
    if (!t) return;
    free(t->data);
    memset(t, 0, sizeof *t);
}

/* ---- callbacks: the trainer's reports in the public types ---- */

struct relay {
    const struct gpo_train_callbacks *cb;
    struct gpo_train_result *result;
};

static void relay_start(void *user, int64_t total, int64_t per_epoch, const char *summary)
{
    struct relay *r = user;
    if (r->cb && r->cb->on_start) r->cb->on_start(r->cb->user, total, per_epoch, summary);
}

static void relay_step(void *user, const struct gp_step_report *s)
{
    struct relay *r = user;
    r->result->steps = s->step + 1;
    r->result->last_loss = s->loss;
    if (!r->cb || !r->cb->on_step) return;
    struct gpo_step_info info = {.step = s->step, .total_steps = s->total_steps, .epoch = s->epoch,
                                 .first_step = s->first_step, .loss = s->loss,
                                 .lr = s->lr, .seconds = s->seconds, .elapsed = s->elapsed, .samples = s->samples};
    r->cb->on_step(r->cb->user, &info);
}

static void relay_epoch(void *user, const struct gp_epoch_report *e)
{
    struct relay *r = user;
    if (e->has_val) {
        r->result->has_val = 1;
        r->result->val_loss = e->val_loss;
        r->result->val_accuracy = e->val_accuracy;
    }
    if (!r->cb || !r->cb->on_epoch) return;
    struct gpo_epoch_info info = {.epoch = e->epoch, .step = e->step, .train_loss = e->train_loss,
                                  .has_val = e->has_val, .val_loss = e->val_loss, .val_accuracy = e->val_accuracy};
    r->cb->on_epoch(r->cb->user, &info);
}

static void relay_note(void *user, const char *message)
{
    struct relay *r = user;
    if (r->cb && r->cb->on_note) r->cb->on_note(r->cb->user, message);
}

static void relay_memory(void *user, const struct gp_stage_memory_report *m)
{
    struct relay *r = user;
    if (!r->cb || !r->cb->on_memory) return;
    struct gpo_stage_memory info = {.stage = m->stage, .first_layer = m->first_layer, .last_layer = m->last_layer - 1,
                                    .backend = m->backend ? m->backend : "cpu", .device = m->device,
                                    .param_bytes = m->param_bytes, .optimizer_bytes = m->optim_bytes,
                                    .activation_bytes = m->activation_bytes,
                                    .activation_peak_bytes = m->activation_peak, .planned_bytes = m->planned_bytes};
    r->cb->on_memory(r->cb->user, &info);
}

static void relay_state(void *user, const char *path, int64_t step)
{
    struct relay *r = user;
    if (r->cb && r->cb->on_state) r->cb->on_state(r->cb->user, path, step);
}

static void relay_resume(void *user, const char *path, int64_t step, int64_t total)
{
    struct relay *r = user;
    if (r->cb && r->cb->on_resume) r->cb->on_resume(r->cb->user, path, step, total);
}

static void relay_measure(void *user, int problems, double seconds, bool done)
{
    struct relay *r = user;
    if (r->cb && r->cb->on_measure) r->cb->on_measure(r->cb->user, problems, seconds, done);
}

/* The trainer's callbacks, each relaying to r's. */
static struct gp_train_callbacks relay_callbacks(struct relay *r)
{
    return (struct gp_train_callbacks){.user = r, .on_start = relay_start, .on_step = relay_step,
                                       .on_epoch = relay_epoch, .on_note = relay_note, .on_memory = relay_memory,
                                       .on_state = relay_state, .on_resume = relay_resume,
                                       .on_measure = r->cb && r->cb->on_measure ? relay_measure : NULL};
}

/* ---- training ---- */

/* "4,4,5": layers per stage. */
static gpo_status parse_balance(gpo_model *m, const char *list, int *counts, int *n_out)
{
    int n = 0;
    const char *p = list;
    while (*p) {
        char *end = NULL;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 1000000 || n >= GPO_MAX_STAGES || (*end && *end != ','))
            return gpo_fail(m, GPO_ERR_ARGUMENT, "balance needs positive layer counts such as 4,4,5, not '%s'", list);
        counts[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (!n) return gpo_fail(m, GPO_ERR_ARGUMENT, "balance needs positive layer counts such as 4,4,5");
    *n_out = n;
    return GPO_OK;
}

/* A path from the model's metadata, in the model's folder (never outside it). */
static char *metadata_path(const struct gp_graph *g, const char *model, const char *key)
{
    const char *rel = gp_graph_metadata(g, key);
    if (!rel || !*rel || rel[0] == '/' || strstr(rel, "..")) return NULL;
    const char *slash = strrchr(model, '/');
    size_t dir = slash ? (size_t)(slash - model + 1) : 0;
    char *p = malloc(dir + strlen(rel) + 1);
    if (!p) return NULL;
    memcpy(p, model, dir);
    strcpy(p + dir, rel);
    return p;
}

/* A fresh file for the trained model, in $TMPDIR or /tmp. */
static char *temp_model(gpo_model *m)
{
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    size_t len = strlen(dir) + 32;
    char *path = malloc(len);
    if (!path) return NULL;
    snprintf(path, len, "%s/gpipe-onnx-XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0) {
        free(path);
        return NULL;
    }
    close(fd);
    return path;
}

static gpo_status set_devices(gpo_model *m, const struct gpo_train_config *c, struct gp_train_config *t,
                              int n_balance)
{
    if (c->devices) return gpo_parse_devices(m, c->devices, &t->n_stages, t->stage_cuda, t->stage_device);
    /* As the command line: the GPUs when there are any, else CPU devices,
     * one stage each. */
    int gpus = gpo_gpu_count();
    t->n_stages = n_balance ? n_balance : 1;
    for (int k = 0; k < t->n_stages; k++) {
        t->stage_cuda[k] = gpus > 0;
        t->stage_device[k] = gpus > 0 ? k % gpus : k;
    }
    return GPO_OK;
}

static gpo_status load_data(gpo_model *m, const char *const paths[4], bool synthetic, int64_t n_synthetic,
                            uint64_t seed, struct gp_dataset *train, struct gp_dataset *val)
{
    if (synthetic)
        return gpo_status_of(gp_dataset_synthetic(m->current, n_synthetic, seed, train, &m->err));
    static const char *what[4] = {"data", "labels", "val_data", "val_labels"};
    struct gp_npy arrays[4] = {0};
    gp_status st = GP_OK;
    for (int k = 0; k < 4 && st == GP_OK; k++)
        if (paths[k] && (st = gp_npy_read(paths[k], &arrays[k], &m->err)) != GP_OK)
            gp_error_prefix(&m->err, "%s: ", what[k]);
    if (st == GP_OK)
        st = gp_dataset_from_arrays(m->current, &arrays[0], paths[1] ? &arrays[1] : NULL, train, &m->err);
    if (st == GP_OK && paths[2])
        st = gp_dataset_from_arrays(m->current, &arrays[2], paths[3] ? &arrays[3] : NULL, val, &m->err);
    for (int k = 0; k < 4; k++) gp_npy_free(&arrays[k]);
    train->x_source = paths[0];
    train->y_source = paths[1];
    val->x_source = paths[2];
    val->y_source = paths[3];
    return gpo_status_of(st);
}

gpo_status gpo_train_resolve(gpo_model *m, const struct gpo_train_config *c, struct gp_train_config *t,
                             const char **auto_balance)
{
    gp_train_config_defaults(t);
    t->model_path = m->current;
    t->batch = c->batch;
    t->chunks = c->chunks;
    t->epochs = c->epochs;
    t->steps = c->steps > 0 ? c->steps : 0;
    t->shuffle = !c->no_shuffle;
    t->seed = c->seed;
    t->dropout_ratio = c->dropout;
    t->optimizer = c->optimizer == GPO_OPTIMIZER_ADAMW ? GP_OPT_ADAMW : GP_OPT_SGD;
    t->lr = c->lr > 0 ? c->lr : t->optimizer == GP_OPT_ADAMW ? 1e-3 : 0.01;
    t->momentum = c->momentum;
    t->nesterov = c->nesterov;
    t->weight_decay = c->weight_decay >= 0 ? c->weight_decay : t->optimizer == GP_OPT_ADAMW ? 0.01 : 0;
    t->clip_norm = c->clip_norm;
    t->beta1 = c->beta1;
    t->beta2 = c->beta2;
    t->eps = c->eps;
    t->schedule = c->lr_schedule == GPO_LR_COSINE ? GP_SCHED_COSINE
                  : c->lr_schedule == GPO_LR_STEP ? GP_SCHED_STEP
                                                  : GP_SCHED_CONSTANT;
    t->warmup_steps = c->warmup_steps;
    t->step_size = c->step_size;
    t->gamma = c->gamma;
    t->min_lr = c->min_lr;
    t->loss_auto = c->loss == GPO_LOSS_AUTO;
    t->loss = c->loss == GPO_LOSS_MSE ? GP_LOSS_MSE : c->loss == GPO_LOSS_OUTPUT ? GP_LOSS_OUTPUT : GP_LOSS_CROSS_ENTROPY;
    t->fast_conv = c->fast_conv;
    t->remake_norm = c->recompute_norm == GPO_RECOMPUTE_ALWAYS  ? GP_REMAKE_ALWAYS
                     : c->recompute_norm == GPO_RECOMPUTE_NEVER ? GP_REMAKE_NEVER
                                                                : GP_REMAKE_AUTO;
    t->memory_limit = c->memory_limit > 0 ? c->memory_limit : 0;
    t->class_axis = c->class_axis == GPO_CLASS_AXIS_AUTO ? GP_CLASS_AXIS_AUTO : c->class_axis;
    t->torch_1_13 = c->torch_1_13;
    t->cuda_graph = c->cuda_graph < 0 ? GP_CUDA_GRAPH_AUTO : c->cuda_graph ? GP_CUDA_GRAPH_ON : GP_CUDA_GRAPH_OFF;
    t->choices_path = c->algorithms_path;
    t->save_every_seconds = c->save_every_seconds;
    t->pipeline_schedule = gpo_schedule_of(c->pipeline_schedule);
    t->checkpoint = gpo_checkpoint_of(c->checkpoint);
    t->deferred_batch_norm = c->deferred_batch_norm;
    t->precision = gpo_precision_of(c->precision);
    t->layout = gpo_layout_of(c->layout);
    t->trace_path = c->trace_path;
    t->save_path = c->save_path;
    t->state_dir = c->state_dir;
    t->save_every = c->save_every;
    t->keep = c->keep > 0 ? c->keep : 2;
    t->resume_path = c->resume;
    /* (That chunks divide the batch the trainer checks, saying so.) */
    if (t->batch < 1 || t->chunks < 1 || t->epochs < 1)
        return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_train: batch %lld, chunks %lld, epochs %lld: all must be positive",
                        (long long)t->batch, (long long)t->chunks, (long long)t->epochs);
    if (c->dropout >= 1) return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_train: dropout must be below 1");
    if (t->step_size < 1 || t->warmup_steps < 0 || t->save_every < 0)
        return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_train: step_size must be positive, warmup_steps and save_every "
                        "not negative");

    /* The pipeline: devices and the split. */
    int n_balance = 0;
    gpo_status st = GPO_OK;
    *auto_balance = NULL;
    if (c->balance && (!strcmp(c->balance, "time") || !strcmp(c->balance, "memory"))) *auto_balance = c->balance;
    else if (c->balance && (st = parse_balance(m, c->balance, t->balance, &n_balance)) != GPO_OK) return st;
    if ((st = set_devices(m, c, t, n_balance)) != GPO_OK) return st;
    if (n_balance && n_balance != t->n_stages)
        return gpo_fail(m, GPO_ERR_ARGUMENT, "the balance has %d stages but the devices %d", n_balance, t->n_stages);
    return GPO_OK;
}

/* The data: the files given, synthetic samples, or the files the model's
 * metadata names. owned[] gets what the caller frees. */
static gpo_status gather_data(gpo_model *m, const struct gpo_train_config *c, char *owned[4], const char *paths[4],
                              struct gp_dataset *train_set, struct gp_dataset *val)
{
    paths[0] = c->data;
    paths[1] = c->labels;
    paths[2] = c->val_data;
    paths[3] = c->val_labels;
    bool synthetic = c->synthetic > 0;
    if (!c->data && !synthetic) {
        static const char *keys[4] = {"gpipe-onnx.data", "gpipe-onnx.labels", "gpipe-onnx.val_data",
                                      "gpipe-onnx.val_labels"};
        for (int k = 0; k < 4; k++) paths[k] = owned[k] = metadata_path(&m->g, m->path, keys[k]);
        if (!paths[0]) return gpo_fail(m, GPO_ERR_ARGUMENT, "no training data: give data (and labels) or synthetic");
    }
    if ((paths[1] && !paths[0]) || (paths[3] && !paths[2]))
        return gpo_fail(m, GPO_ERR_ARGUMENT, "labels given without their data");
    return load_data(m, paths, synthetic, c->synthetic, c->seed, train_set, val);
}

static gpo_status train(gpo_model *m, const struct gpo_train_config *c, const struct gpo_train_callbacks *cb,
                        struct gpo_train_result *out)
{
    if (!m) return GPO_ERR_ARGUMENT;
    gpo_begin(m);
    struct gpo_train_result result = {0};
    if (out) *out = result;
    if (!c) return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_train: no configuration");
    if (!m->loaded) return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_train: no model loaded");
    if (m->job) return gpo_job_train(m, c, cb, out);
    struct gp_train_config t;
    const char *auto_balance;
    gpo_status st = gpo_train_resolve(m, c, &t, &auto_balance);
    if (st != GPO_OK) return st;

    /* Outputs are checked before anything long. */
    const char *outputs[2] = {c->save_path, c->trace_path};
    for (int k = 0; k < 2; k++)
        if (outputs[k] && gp_atomic_check(outputs[k], &m->err) != GP_OK) return gpo_status_of(m->err.status);
    if (t.state_dir && gp_state_check_dir(t.state_dir, &m->err) != GP_OK) return gpo_status_of(m->err.status);

    char *owned[4] = {0};
    const char *paths[4];
    struct gp_dataset train_set = {0}, val = {0};
    char *trained = NULL;
    st = gather_data(m, c, owned, paths, &train_set, &val);

    if (st == GPO_OK && auto_balance) {
        /* As gpo_balance does it; the report goes to on_balance. */
        char devices[GPO_MAX_STAGES * 16];
        struct gpo_balance_options bo;
        gpo_train_balance_options(c, cb,
                                  gpo_stage_devices(t.n_stages, t.stage_cuda, t.stage_device, devices, sizeof devices),
                                  t.batch, auto_balance, &bo);
        const struct gpo_balance_report *rep = NULL;
        st = gpo_balance(m, &bo, &rep);
        if (st == GPO_OK) {
            for (int s = 0; s < rep->optimal.n_stages; s++) t.balance[s] = rep->optimal.balance[s];
            if (cb && cb->on_balance) cb->on_balance(cb->user, &bo, rep);
        }
    }
    /* The trained model goes to save_path when given (written once), else
     * to a temporary file of the context's; or nowhere when the caller
     * discards it. */
    bool keep = !c->discard_weights, temporary = keep && !c->save_path;
    if (st == GPO_OK && keep && !(trained = temporary ? temp_model(m) : strdup(c->save_path)))
        st = gpo_fail(m, GPO_ERR_IO, "cannot make a temporary file for the trained model");
    if (st == GPO_OK) {
        if (keep) t.save_path = trained;
        struct relay relay = {.cb = cb, .result = &result};
        struct gp_train_callbacks tcb = relay_callbacks(&relay);
        st = gpo_status_of(gp_train(&t, &train_set, paths[2] ? &val : NULL, &tcb, &m->err));
    }
    if (st == GPO_OK) {
        result.n_stages = t.n_stages;
        for (int s = 0; s < t.n_stages; s++) result.balance[s] = t.balance[s];
        if (out) *out = result;
    }
    if (st == GPO_OK && keep) {
        /* The context now holds the trained weights. */
        if (m->tmp) unlink(m->tmp);
        free(m->tmp);
        free(m->saved);
        m->tmp = temporary ? trained : NULL;
        m->saved = temporary ? NULL : trained;
        m->current = trained;
        trained = NULL;
        gpo_report_free(m);
        st = gpo_reload(m);
    }
    if (trained) {
        if (temporary) unlink(trained);
        free(trained);
    }
    for (int k = 0; k < 4; k++) free(owned[k]);
    gp_dataset_free(&train_set);
    gp_dataset_free(&val);
    return st;
}

gpo_status gpo_train(gpo_model *m, const struct gpo_train_config *c, const struct gpo_train_callbacks *cb,
                     struct gpo_train_result *out)
{
    return train(m, c, cb, out);
}

gpo_status gpo_train_resolved(gpo_model *m, const struct gpo_train_config *c, const struct gp_train_config *engine,
                              const struct gpo_train_callbacks *cb, struct gpo_train_result *out)
{
    struct gpo_train_result result = {0};
    if (out) *out = result;
    char *owned[4] = {0};
    const char *paths[4];
    struct gp_dataset train_set = {0}, val = {0};
    gpo_status st = gather_data(m, c, owned, paths, &train_set, &val);
    if (st == GPO_OK) {
        struct relay relay = {.cb = cb, .result = &result};
        struct gp_train_callbacks tcb = relay_callbacks(&relay);
        st = gpo_status_of(gp_train(engine, &train_set, paths[2] ? &val : NULL, &tcb, &m->err));
    }
    if (st == GPO_OK) {
        result.n_stages = engine->n_stages;
        for (int s = 0; s < engine->n_stages; s++) result.balance[s] = engine->balance[s];
        if (out) *out = result;
    }
    for (int k = 0; k < 4; k++) free(owned[k]);
    gp_dataset_free(&train_set);
    gp_dataset_free(&val);
    return st;
}

/* ---- predict and save ---- */

static gpo_status predict_dataset(gpo_model *m, struct gp_dataset *ds, const struct gpo_predict_options *opts,
                                  struct gpo_tensor *out)
{
    struct gpo_predict_options o;
    if (opts) o = *opts;
    else gpo_predict_options_init(&o);
    bool cuda[GPO_MAX_STAGES] = {0};
    int device[GPO_MAX_STAGES] = {0}, n = 0;
    gpo_status st = gpo_parse_devices(m, o.device ? o.device : "cpu:0", &n, cuda, device);
    if (st != GPO_OK) return st;
    if (n != 1) return gpo_fail(m, GPO_ERR_ARGUMENT, "predict runs on one device, not '%s'", o.device);
    const struct gp_device_ops *ops = gp_backend_find(cuda[0] ? "cuda" : "cpu");
    if (!ops)
        return gpo_fail(m, GPO_ERR_UNSUPPORTED, "this build has no CUDA backend (rebuild with CUDA, or use --device cpu)");
    if (o.batch < 1) return gpo_fail(m, GPO_ERR_ARGUMENT, "predict: batch must be at least 1");
    struct gp_predict_options po = {.batch = o.batch, .training = o.batch_statistics,
                                    .precision = gpo_precision_of(o.precision), .device_ops = ops,
                                    .device_index = device[0],
                                    .channels_last = gp_layout_policy_on(gpo_layout_of(o.layout), cuda[0])};
    struct gp_tensor y = {0};
    gp_status gst = gp_predict(m->current, ds, &po, &y, &m->err);
    if (gst != GP_OK) return gpo_status_of(gst);
    memset(out, 0, sizeof *out);
    out->data = y.data;
    out->rank = y.shape.rank;
    for (int k = 0; k < y.shape.rank && k < 8; k++) out->dims[k] = y.shape.dims[k];
    return GPO_OK;
}

gpo_status gpo_predict_file(gpo_model *m, const char *npy_path, const struct gpo_predict_options *opts,
                            struct gpo_tensor *out)
{
    if (!m) return GPO_ERR_ARGUMENT;
    gpo_begin(m);
    if (!npy_path || !out) return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_predict_file: no data or no output");
    struct gp_npy x = {0};
    struct gp_dataset ds = {0};
    gp_status gst = gp_npy_read(npy_path, &x, &m->err);
    if (gst == GP_OK) gst = gp_dataset_from_arrays(m->current, &x, NULL, &ds, &m->err);
    gpo_status st = gst == GP_OK ? predict_dataset(m, &ds, opts, out) : gpo_status_of(gst);
    gp_dataset_free(&ds);
    gp_npy_free(&x);
    return st;
}

gpo_status gpo_predict(gpo_model *m, const float *x, int64_t n, const int64_t *sample_dims, int sample_rank,
                       const struct gpo_predict_options *opts, struct gpo_tensor *out)
{
    if (!m) return GPO_ERR_ARGUMENT;
    gpo_begin(m);
    if (!x || !out || n < 1 || sample_rank < 0 || sample_rank + 1 > GP_MAX_RANK || (sample_rank && !sample_dims))
        return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_predict: no samples, or a sample of rank %d", sample_rank);
    /* As if read from a .npy file: float32, [n, sample_dims...]. */
    struct gp_npy a = {.dtype = GP_DTYPE_FLOAT32};
    a.shape.rank = sample_rank + 1;
    a.shape.dims[0] = n;
    size_t count = (size_t)n;
    for (int k = 0; k < sample_rank; k++) {
        if (sample_dims[k] < 1) return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_predict: dimension %d is %lld", k,
                                                (long long)sample_dims[k]);
        a.shape.dims[k + 1] = sample_dims[k];
        count *= (size_t)sample_dims[k];
    }
    a.nbytes = count * sizeof(float);
    a.data = aligned_alloc(64, (a.nbytes + 63) / 64 * 64);
    if (!a.data) return gpo_fail(m, GPO_ERR_NOMEM, "out of memory copying %lld samples", (long long)n);
    memcpy(a.data, x, a.nbytes);
    struct gp_dataset ds = {0};
    gp_status gst = gp_dataset_from_arrays(m->current, &a, NULL, &ds, &m->err);
    gpo_status st = gst == GP_OK ? predict_dataset(m, &ds, opts, out) : gpo_status_of(gst);
    gp_dataset_free(&ds);
    gp_npy_free(&a);
    return st;
}

gpo_status gpo_save(gpo_model *m, const char *path)
{
    if (!m) return GPO_ERR_ARGUMENT;
    gpo_begin(m);
    if (!m->current || !path) return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_save: no model or no path");
    return gpo_status_of(gp_onnx_save(m->current, path, NULL, 0, &m->err));
}

gpo_status gpo_tensor_write_npy(gpo_model *m, const struct gpo_tensor *t, const char *path)
{
    if (!m) return GPO_ERR_ARGUMENT;
    gpo_begin(m);
    if (!t || !path || (!t->data && t->rank) || t->rank < 0 || t->rank > GP_MAX_RANK)
        return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_tensor_write_npy: no tensor or no path");
    struct gp_shape shape = {.rank = t->rank};
    for (int k = 0; k < t->rank; k++) shape.dims[k] = t->dims[k];
    return gpo_status_of(gp_npy_write(path, GP_DTYPE_FLOAT32, &shape, t->data, &m->err));
}
