#include "train/trainer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backends.h"
#include "backend/device.h"
#include "pipeline/pipeline.h"
#include "graph/graph.h"
#include "onnx/load.h"
#include "onnx/save.h"
#include "train/optim.h"
#include "train/prefetch.h"
#include "train/resume.h"
#include "util/atomic_file.h"

void gp_train_config_defaults(struct gp_train_config *c)
{
    memset(c, 0, sizeof *c);
    c->batch = 32;
    c->chunks = 1;
    c->epochs = 1;
    c->shuffle = true;
    c->loss_auto = true;
    c->class_axis = GP_CLASS_AXIS_AUTO;
    c->dropout_ratio = -1;
    c->optimizer = GP_OPT_SGD;
    c->lr = 0.01;
    c->beta1 = 0.9;
    c->beta2 = 0.999;
    c->eps = 1e-8;
    c->step_size = 30;
    c->gamma = 0.1;
    c->n_stages = 1;
    c->checkpoint = GP_CHECKPOINT_EXCEPT_LAST;
    c->keep = 2;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Everything a training run holds; freed in one place. */
struct run {
    const struct gp_train_config *cfg;
    struct gp_graph g;
    struct gp_pipeline *pipe;
    int input, output;          /* value ids */
    enum gp_loss_kind loss;
    int class_axis;
    int64_t micro;              /* rows per micro-batch */
    void *x;                    /* one micro-batch of inputs (validation) */
    void *labels;               /* one mini-batch of labels / targets (validation) */
    float *out;                 /* one micro-batch of outputs (validation) */
    float *scratch;             /* validation's unused loss gradient */
    int64_t *eval_rows;         /* one validation chunk's sample indices */
    int channels_last;          /* activations stored channels-last (graph/layout.h) */
};

static void run_free(struct run *s)
{
    gp_pipeline_free(s->pipe);
    gp_graph_free(&s->g);
    free(s->x);
    free(s->out);
    free(s->labels);
    free(s->scratch);
    free(s->eval_rows);
}

/* The label tensor's shape for `rows` samples. */
static struct gp_shape label_shape(const struct gp_dataset *d, int64_t rows)
{
    struct gp_shape s = d->y.shape;
    s.dims[0] = rows;
    return s;
}

static struct gp_shape rows_shape(const struct gp_shape *s, int64_t rows)
{
    struct gp_shape r = *s;
    r.dims[0] = rows;
    return r;
}

/* Loss over the first `rows` rows of the output buffer against labels;
 * writes the gradient (scaled by 1/denominator) into dout when non-NULL. */
static gp_status apply_loss(struct run *s, const struct gp_dataset *d, const float *out,
                            const void *labels, int64_t rows, double denominator, float *dout,
                            double *sum, int64_t *correct, int64_t *counted, struct gp_error *err)
{
    const struct gp_value *o = &s->g.values[s->output];
    struct gp_shape os = rows_shape(&o->shape, rows);
    float *grad = dout ? dout : s->scratch;
    *sum = 0;
    switch (s->loss) {
    case GP_LOSS_CROSS_ENTROPY: {
        struct gp_shape ls = label_shape(d, rows);
        int64_t terms = 0;
        GP_TRY(gp_cross_entropy(out, &os, labels, &ls, s->class_axis, GP_LOSS_IGNORE_INDEX,
                                denominator, grad, sum, &terms, err));
        if (correct)
            GP_TRY(gp_accuracy(out, &os, labels, &ls, s->class_axis, GP_LOSS_IGNORE_INDEX, correct,
                               counted, err));
        return GP_OK;
    }
    case GP_LOSS_MSE: {
        struct gp_shape ts = label_shape(d, rows);
        return gp_mse_loss(out, labels, &os, &ts, denominator, grad, sum, err);
    }
    case GP_LOSS_OUTPUT:
        return gp_output_loss(out, &os, denominator, grad, sum, err);
    }
    return GP_OK;
}

/* Loss terms in `rows` samples of labels: the mean's denominator. */
static double loss_terms(const struct run *s, const struct gp_dataset *d, const void *labels,
                         int64_t rows)
{
    const struct gp_value *o = &s->g.values[s->output];
    switch (s->loss) {
    case GP_LOSS_CROSS_ENTROPY: {
        struct gp_shape ls = label_shape(d, rows);
        return (double)gp_loss_count_targets(labels, gp_shape_numel(&ls), GP_LOSS_IGNORE_INDEX);
    }
    case GP_LOSS_MSE:
    case GP_LOSS_OUTPUT:
        return (double)(gp_shape_numel(&o->shape) / s->micro * rows);
    }
    return 1;
}

/* Integer data that index a table directly (token ids into an embedding:
 * a Gather whose indices are the data input) must lie in the table, as
 * ONNX's Gather asks ([-rows, rows)). Checked once over the whole dataset
 * here, so a bad id is an error naming the sample, not a kernel's silent
 * zeros on a GPU or a failure in the middle of a step. */
/* --recompute-norm: how many BatchNorm outputs this process's stages remake
 * in the backward and what that saves (a stage keeps them where remaking
 * would cost it memory, and under auto where it fits without: pipeline/
 * stage.c); under auto, nothing when no stage needed it. */
static void remade_note(const struct run *s, const struct gp_train_config *cfg, const struct gp_train_callbacks *cb)
{
    int values = 0;
    int64_t saved = 0;
    for (int k = 0; k < gp_pipeline_stages(s->pipe); k++) {
        if (cfg->remote && k != cfg->remote->stage) continue;
        struct gp_stage_report r;
        gp_pipeline_report(s->pipe, k, &r);
        values += r.remade_values;
        saved += r.remade_saved_bytes;
    }
    char note[240];
    if (!values && cfg->remake_norm == GP_REMAKE_AUTO) return;
    if (values)
        snprintf(note, sizeof note,
                 "--recompute-norm: %d BatchNormalization output%s written again in the backward instead of kept: "
                 "%.1f MiB of activations less%s",
                 values, values == 1 ? "" : "s", (double)saved / (1 << 20),
                 cfg->remake_norm == GP_REMAKE_AUTO
                     ? " (auto: a stage did not fit with them kept; the fewest that fit, largest first)"
                     : "");
    else
        snprintf(note, sizeof note, "--recompute-norm: every BatchNormalization output kept (none would save memory)");
    cb->on_note(cb->user, note);
}

static gp_status check_indices(const struct run *s, const struct gp_dataset *d, const char *which,
                               struct gp_error *err)
{
    const struct gp_graph *g = &s->g;
    enum gp_dtype dt = d->x.dtype;
    if (dt != GP_DTYPE_INT64 && dt != GP_DTYPE_INT32) return GP_OK;
    int64_t per = d->n > 0 ? gp_shape_numel(&d->x.shape) / d->n : 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct gp_node *n = &g->nodes[i];
        if (strcmp(n->op_type, "Gather") != 0 || n->n_inputs < 2 || n->inputs[1] != s->input) continue;
        const struct gp_shape *table = &g->values[n->inputs[0]].shape;
        int64_t axis = gp_node_attr_int(n, "axis", 0);
        if (axis < 0) axis += table->rank;
        if (axis < 0 || axis >= table->rank) continue;
        int64_t rows = table->dims[axis];
        for (int64_t e = 0; e < gp_shape_numel(&d->x.shape); e++) {
            int64_t v = dt == GP_DTYPE_INT64 ? ((const int64_t *)d->x.data)[e] : ((const int32_t *)d->x.data)[e];
            if (v < -rows || v >= rows)
                return gp_error_set(err, GP_ERR_INVALID,
                                    "%s data: index %lld in sample %lld (position %lld) is outside [-%lld, %lld): "
                                    "layer %d ('%s') gathers from a table of %lld rows",
                                    which, (long long)v, (long long)(per ? e / per : 0),
                                    (long long)(per ? e % per : e), (long long)rows, (long long)rows, i, n->name,
                                    (long long)rows);
        }
    }
    return GP_OK;
}

/* Data-parallel copies of the pipeline: 1 in one process. */
static int64_t replicas_of(const struct gp_train_config *cfg)
{
    return cfg->remote && cfg->remote->replicas > 1 ? cfg->remote->replicas : 1;
}

static gp_status setup(struct run *s, const struct gp_train_config *cfg,
                       const struct gp_dataset *train, struct gp_error *err)
{
    s->cfg = cfg;
    if (cfg->chunks < 1 || cfg->batch % cfg->chunks != 0)
        return gp_error_set(err, GP_ERR_INVALID,
                            "the batch of %lld cannot be split into %lld equal micro-batches: "
                            "choose --chunks dividing --batch",
                            (long long)cfg->batch, (long long)cfg->chunks);
    /* Data-parallel replicas share the mini-batch: each cuts its share into
     * --chunks micro-batches. */
    int64_t replicas = replicas_of(cfg);
    if (cfg->batch % (replicas * cfg->chunks) != 0)
        return gp_error_set(err, GP_ERR_INVALID,
                            "the batch of %lld cannot be shared by %lld replicas in %lld equal micro-batches "
                            "each: --batch must be a multiple of %lld",
                            (long long)cfg->batch, (long long)replicas, (long long)cfg->chunks,
                            (long long)(replicas * cfg->chunks));
    s->micro = cfg->batch / (replicas * cfg->chunks);
    if (train->n < cfg->batch)
        return gp_error_set(err, GP_ERR_INVALID,
                            "the training data has %lld samples, fewer than one batch of %lld",
                            (long long)train->n, (long long)cfg->batch);
    GP_TRY(gp_onnx_load(cfg->model_path, s->micro, &s->g, err));
    bool all_gpus = cfg->n_stages > 0;
    for (int k = 0; k < cfg->n_stages; k++) all_gpus &= cfg->stage_cuda[k];
    if (gp_layout_policy_on(cfg->layout, all_gpus)) s->channels_last = gp_graph_channels_last(&s->g);
    s->input = -1;
    for (int i = 0; i < s->g.n_inputs; i++)
        if (!s->g.values[s->g.inputs[i]].is_initializer) s->input = s->g.inputs[i];
    s->output = s->g.outputs[0];
    const struct gp_value *o = &s->g.values[s->output];
    if (!gp_dtype_is_float(o->dtype))
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "%s: the first output '%s' is %s, not float",
                            cfg->model_path, o->name, gp_dtype_name(o->dtype));

    bool has_labels = train->y.dtype != GP_DTYPE_UNDEFINED;
    if (cfg->loss_auto)
        s->loss = !has_labels ? GP_LOSS_OUTPUT
                  : gp_dtype_is_float(train->y.dtype) ? GP_LOSS_MSE : GP_LOSS_CROSS_ENTROPY;
    else
        s->loss = cfg->loss;
    if (s->loss != GP_LOSS_OUTPUT && !has_labels)
        return gp_error_set(err, GP_ERR_INVALID, "the %s loss needs labels (--labels)",
                            gp_loss_kind_name(s->loss));
    if (s->loss == GP_LOSS_CROSS_ENTROPY) {
        if (train->y.dtype != GP_DTYPE_INT64)
            return gp_error_set(err, GP_ERR_INVALID, "cross-entropy needs integer class labels");
        struct gp_shape ls = label_shape(train, s->micro);
        GP_TRY(gp_loss_class_axis(&o->shape, &ls, cfg->class_axis, &s->class_axis, err));
    } else if (s->loss == GP_LOSS_MSE) {
        struct gp_shape ts = label_shape(train, s->micro);
        if (train->y.dtype != GP_DTYPE_FLOAT32 || !gp_shape_equal(&ts, &o->shape)) {
            char a[160], b[160];
            return gp_error_set(err, GP_ERR_SHAPE,
                                "mean squared error needs float targets shaped like the output "
                                "%s per micro-batch, got %s %s",
                                gp_shape_format(&o->shape, a, sizeof a), gp_dtype_name(train->y.dtype),
                                gp_shape_format(&ts, b, sizeof b));
        }
    }

    GP_TRY(check_indices(s, train, "training", err));

    struct gp_optim_config oc = {
        .kind = cfg->optimizer == GP_OPT_ADAMW ? GP_OPTIM_ADAMW : GP_OPTIM_SGD,
        .lr = cfg->lr,
        .momentum = cfg->momentum,
        .nesterov = cfg->nesterov,
        .weight_decay = cfg->weight_decay,
        .beta1 = cfg->beta1,
        .beta2 = cfg->beta2,
        .eps = cfg->eps,
        .arith = cfg->torch_1_13 ? GP_TORCH_1_13 : GP_TORCH_2,
    };
    GP_TRY(gp_optim_check(&oc, err));
    int n_stages = cfg->n_stages > 0 ? cfg->n_stages : 1;
    const struct gp_device_ops *ops[64];
    bool balanced = false;
    for (int k = 0; k < n_stages; k++) {
        ops[k] = &gp_cpu_device_ops;
        if (cfg->stage_cuda[k] && !(ops[k] = gp_backend_find("cuda")))
            return gp_error_set(err, GP_ERR_UNSUPPORTED,
                                "stage %d: this build has no CUDA backend (rebuild with CUDA, or use cpu:N)", k);
        balanced |= cfg->balance[k] != 0;
    }
    /* Graphs by default where they can be: every stage on a GPU, no trace. */
    bool all_cuda = true;
    for (int k = 0; k < n_stages; k++) all_cuda &= cfg->stage_cuda[k];
    bool use_graph = cfg->cuda_graph == GP_CUDA_GRAPH_ON ||
                     (cfg->cuda_graph == GP_CUDA_GRAPH_AUTO && all_cuda && !cfg->trace_path);
    struct gp_loss_spec loss = {.kind = s->loss, .class_axis = s->class_axis,
                                .ignore_index = GP_LOSS_IGNORE_INDEX,
                                .target_dtype = s->loss == GP_LOSS_OUTPUT ? GP_DTYPE_UNDEFINED : train->y.dtype};
    if (s->loss != GP_LOSS_OUTPUT) loss.target_shape = label_shape(train, s->micro);
    struct gp_pipeline_config pc = {
        .graph = &s->g,
        .n_stages = n_stages,
        .balance = balanced ? cfg->balance : NULL,
        .device_ops = ops,
        .device_index = cfg->stage_device,
        .n_micro = (int)cfg->chunks,
        .schedule = cfg->pipeline_schedule,
        .checkpoint = cfg->checkpoint,
        .optim = oc,
        .trace = cfg->trace_path != NULL,
        .deferred_batch_norm = cfg->deferred_batch_norm,
        .loss = loss,
        .compute = {.precision = cfg->precision, .fast_conv = cfg->fast_conv,
                    .remake_norm = cfg->remake_norm == GP_REMAKE_ALWAYS},
        .remake_norm_if_short = cfg->remake_norm == GP_REMAKE_AUTO,
        .memory_limit = cfg->memory_limit > 0 ? (size_t)cfg->memory_limit : 0,
        .cuda_graph = use_graph,
        .remote = cfg->remote,
    };
    GP_TRY(gp_pipeline_create(&pc, &s->pipe, err));

    size_t label_row = has_labels ? gp_dataset_row_bytes(&train->y) : 0;
    s->labels = malloc(label_row * (size_t)cfg->batch + 64);
    s->scratch = malloc(sizeof(float) * (size_t)gp_shape_numel(&o->shape) + 64);
    s->eval_rows = malloc(sizeof(int64_t) * (size_t)(s->micro + 1));
    s->x = malloc(gp_dataset_row_bytes(&train->x) * (size_t)cfg->batch + 64);
    s->out = malloc(sizeof(float) * (size_t)gp_shape_numel(&o->shape) + 64);
    if (!s->labels || !s->scratch || !s->eval_rows || !s->x || !s->out)
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    return GP_OK;
}

static double planned_mib(const struct run *s)
{
    int64_t total = 0;
    for (int k = 0; k < gp_pipeline_stages(s->pipe); k++) {
        struct gp_stage_report r;
        gp_pipeline_report(s->pipe, k, &r);
        total += r.planned_bytes;
    }
    return (double)total / (1024.0 * 1024.0);
}

static double lr_at(const struct gp_train_config *c, int64_t step, int64_t total)
{
    struct gp_schedule sc = {
        .kind = c->schedule == GP_SCHED_COSINE ? GP_SCHEDULE_COSINE
                : c->schedule == GP_SCHED_STEP ? GP_SCHEDULE_STEP : GP_SCHEDULE_CONSTANT,
        .base_lr = c->lr,
        .warmup_steps = c->warmup_steps,
        .total_steps = total,
        .step_size = c->step_size,
        .gamma = c->gamma,
        .min_lr = c->min_lr,
    };
    return gp_schedule_lr(&sc, step);
}

/* Mean loss (and accuracy) over every sample of d, in evaluation mode. The
 * last chunk is padded by repeating a sample; padded rows are not counted. */
static gp_status evaluate(struct run *s, const struct gp_dataset *d, double *loss, double *acc,
                          struct gp_error *err)
{
    double sum = 0, terms = 0;
    int64_t correct = 0, counted = 0;
    for (int64_t i = 0; i < d->n; i += s->micro) {
        int64_t rows = d->n - i < s->micro ? d->n - i : s->micro;
        int64_t *idx = s->eval_rows;
        for (int64_t k = 0; k < s->micro; k++) idx[k] = i + (k < rows ? k : rows - 1);
        gp_dataset_gather(&d->x, idx, s->micro, 0, s->micro, s->x);
        if (d->y.dtype != GP_DTYPE_UNDEFINED) gp_dataset_gather(&d->y, idx, s->micro, 0, s->micro, s->labels);
        GP_TRY(gp_pipeline_eval(s->pipe, s->x, false, s->out, err));
        double part = 0, n_terms = loss_terms(s, d, s->labels, rows);
        int64_t hit = 0, seen = 0;
        GP_TRY(apply_loss(s, d, s->out, s->labels, rows, 1.0, NULL, &part,
                          s->loss == GP_LOSS_CROSS_ENTROPY ? &hit : NULL, &seen, err));
        sum += part;
        terms += n_terms;
        correct += hit;
        counted += seen;
    }
    *loss = terms > 0 ? sum / terms : 0;
    *acc = s->loss == GP_LOSS_CROSS_ENTROPY && counted > 0 ? (double)correct / (double)counted : -1;
    return GP_OK;
}

/* Class labels must lie in [0, C) or be ignored: checked here, on the host,
 * so that no backend meets a label it cannot index with. */
static gp_status check_labels(const struct run *s, const int64_t *labels, int64_t n, struct gp_error *err)
{
    if (s->loss != GP_LOSS_CROSS_ENTROPY) return GP_OK;
    int64_t classes = s->g.values[s->output].shape.dims[s->class_axis];
    for (int64_t i = 0; i < n; i++)
        if (labels[i] != GP_LOSS_IGNORE_INDEX && (labels[i] < 0 || labels[i] >= classes))
            return gp_error_set(err, GP_ERR_INVALID,
                                "label %lld at position %lld of the batch is outside [0, %lld) (the model "
                                "has %lld classes)",
                                (long long)labels[i], (long long)i, (long long)classes, (long long)classes);
    return GP_OK;
}

/* ---- saved states ---- */

static void note_through(void *user, const char *message)
{
    const struct gp_train_callbacks *cb = user;
    if (cb && cb->on_note) cb->on_note(cb->user, message);
}

/* Where a run is between steps, `done` steps done. */
struct position {
    int64_t done;
    double epoch_loss;   /* this epoch's step losses so far */
    int64_t epoch_steps;
};

static gp_status save_state(struct run *s, const struct gp_resume_run *rr, struct gp_state_meta *m,
                            const struct position *at, const struct gp_train_callbacks *cb, struct gp_error *err)
{
    const struct gp_train_config *cfg = s->cfg;
    m->step = at->done;
    m->epoch = at->done / rr->steps_per_epoch;
    m->next_sample = at->done % rr->steps_per_epoch * cfg->batch;
    m->steps_per_epoch = rr->steps_per_epoch;
    m->total_steps = rr->total_steps;
    m->optimizer_steps = gp_pipeline_optim_steps(s->pipe);
    m->next_lr = lr_at(cfg, at->done, rr->total_steps);
    m->epoch_loss_sum = at->epoch_loss;
    m->epoch_steps = at->epoch_steps;
    m->shuffle = cfg->shuffle;
    m->seed = cfg->seed;
    char *choices = gp_backend_choices_export();
    m->kernel_choices = choices;
    char path[4352];
    gp_status st = gp_resume_save(rr, m, path, sizeof path, err);
    m->kernel_choices = NULL;
    free(choices);
    if (st != GP_OK) {
        gp_error_prefix(err, "saving the training state at step %lld: ", (long long)at->done);
        return st;
    }
    if (path[0] && cb && cb->on_state) cb->on_state(cb->user, path, at->done); /* the writing process */
    return GP_OK;
}

/* Takes the choices of cfg->choices_path back when the file exists. */
static gp_status choices_read(const struct gp_train_config *cfg, const struct gp_train_callbacks *cb,
                              struct gp_error *err)
{
    FILE *f = fopen(cfg->choices_path, "rb");
    if (!f) {
        if (errno == ENOENT) return GP_OK; /* this run measures them and writes the file */
        return gp_error_set(err, GP_ERR_IO, "cannot read %s: %s", cfg->choices_path, strerror(errno));
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            char *grown = realloc(text, cap = 2 * cap + 8192);
            if (!grown) {
                free(text);
                fclose(f);
                return gp_error_set(err, GP_ERR_NOMEM, "out of memory reading %s", cfg->choices_path);
            }
            text = grown;
        }
        size_t r = fread(text + len, 1, cap - len - 1, f);
        len += r;
        if (r == 0) break;
    }
    bool failed = ferror(f);
    fclose(f);
    text[len] = '\0';
    gp_status st = failed ? gp_error_set(err, GP_ERR_IO, "cannot read %s", cfg->choices_path) : GP_OK;
    char note[1024] = "";
    if (st == GP_OK && (st = gp_backend_choices_import(text, note, sizeof note, err)) != GP_OK)
        gp_error_prefix(err, "%s: ", cfg->choices_path);
    free(text);
    if (st == GP_OK && note[0]) note_through((void *)cb, note);
    return st;
}

/* Writes the run's choices into cfg->choices_path (atomically). */
static gp_status choices_write(const struct gp_train_config *cfg, struct gp_error *err)
{
    char *text = gp_backend_choices_export();
    if (!text) return GP_OK; /* nothing measured (CPU devices) */
    struct gp_atomic_file a;
    gp_status st = gp_atomic_create(&a, cfg->choices_path, err);
    if (st == GP_OK) {
        gp_atomic_write(&a, text, strlen(text));
        st = gp_atomic_commit(&a, err);
    }
    free(text);
    return st;
}

/* Across processes each measured the convolutions of its own stage: the
 * writing process (stage 0 of replica 0) takes its replica's other
 * stages' choices too, so that the --algorithms file and the states it
 * writes hold every stage's, and every process, reading them back, gets
 * its own (replicas of a stage take replica 0's). Every stage's process
 * calls this at the same point. */
static gp_status gather_choices(struct run *s, const struct gp_train_config *cfg, const struct gp_train_callbacks *cb,
                                struct gp_error *err)
{
    if (!cfg->remote) return GP_OK;
    char *mine = gp_backend_choices_export(), *all = NULL;
    gp_status st = gp_pipeline_gather_texts(s->pipe, mine, &all, err);
    free(mine);
    if (st != GP_OK || !all) return st;
    /* Each stage's text begins with its backend's identity line (the CUDA
     * backend's: "cuda cudnn VERSION device NAME", conv_algos.cu); taken in
     * one by one (stage 0's own again: the same entries). */
    char note[1024];
    for (const char *at = all; *at && st == GP_OK;) {
        const char *next = strstr(at, "\ncuda cudnn ");
        size_t n = next ? (size_t)(next - at) + 1 : strlen(at);
        char *one = strndup(at, n);
        if (!one) {
            st = gp_error_set(err, GP_ERR_NOMEM, "out of memory");
            break;
        }
        st = gp_backend_choices_import(one, note, sizeof note, err);
        if (st == GP_OK && note[0]) note_through((void *)cb, note);
        free(one);
        at += n;
    }
    free(all);
    return st;
}

/* Opens the newest whole state of cfg->resume_path and takes back its
 * kernel choices: before the pipeline is made, which measures them (and
 * plans their workspaces) for whatever is not in the table. */
static gp_status resume_open(const struct gp_train_config *cfg, const struct gp_train_callbacks *cb,
                             struct gp_state **out, struct gp_error *err)
{
    GP_TRY(gp_state_open_latest(cfg->resume_path, note_through, (void *)cb, out, err));
    char note[1024];
    gp_status st = gp_backend_choices_import((*out)->meta.kernel_choices, note, sizeof note, err);
    if (st != GP_OK) {
        gp_error_prefix(err, "%s: ", (*out)->path);
        gp_state_close(*out);
        *out = NULL;
        return st;
    }
    if (note[0]) note_through((void *)cb, note);
    return GP_OK;
}

/* Puts the state into the pipeline; *at gets where it was. */
static gp_status resume(struct gp_state *state, const struct gp_resume_run *rr, const struct gp_state_meta *now,
                        const struct gp_train_callbacks *cb, struct position *at, struct gp_error *err)
{
    gp_status st = gp_resume_restore(rr, state, now, note_through, (void *)cb, err);
    if (st == GP_OK) {
        at->done = state->meta.step;
        at->epoch_loss = state->meta.epoch_loss_sum;
        at->epoch_steps = state->meta.epoch_steps;
        if (cb && cb->on_resume) cb->on_resume(cb->user, state->path, at->done, rr->total_steps);
    }
    return st;
}

gp_status gp_train(const struct gp_train_config *cfg, const struct gp_dataset *train,
                   const struct gp_dataset *val, const struct gp_train_callbacks *cb,
                   struct gp_error *err)
{
    /* Before any long work: the outputs can be written, the data are finite. */
    /* Stages in other processes: stage 0's process of replica 0 writes the outputs. */
    /* Each process writes its own stage's timeline (--trace FILE is then
     * each rank's own file, which the caller names). */
    bool writer = !cfg->remote || (cfg->remote->stage == 0 && cfg->remote->replica == 0);
    if (cfg->save_path && writer) GP_TRY(gp_atomic_check(cfg->save_path, err));
    if (cfg->trace_path) GP_TRY(gp_atomic_check(cfg->trace_path, err));
    if (cfg->state_dir && writer) GP_TRY(gp_state_check_dir(cfg->state_dir, err));
    /* Every process must save at the same steps: a period in seconds is
     * each process's own clock. */
    if (cfg->state_dir && cfg->remote && cfg->save_every_seconds > 0)
        return gp_error_set(err, GP_ERR_UNSUPPORTED,
                            "--save-every in seconds across processes: each would decide by its own clock; "
                            "give a number of steps");
    if (cfg->resume_path && access(cfg->resume_path, F_OK) != 0)
        return gp_error_set(err, GP_ERR_IO, "cannot resume from '%s': %s", cfg->resume_path, strerror(errno));
    GP_TRY(gp_dataset_check_finite(train, "training", err));
    /* An empty set would print a loss of 0 every epoch, as if measured. */
    if (val && val->n < 1)
        return gp_error_set(err, GP_ERR_INVALID, "the validation data has no samples");
    if (val) GP_TRY(gp_dataset_check_finite(val, "validation", err));
    if (cfg->choices_path) GP_TRY(gp_atomic_check(cfg->choices_path, err));
    /* A resumed run's choices are its state's, before the file's. */
    struct gp_state *state = NULL;
    if (cfg->resume_path) GP_TRY(resume_open(cfg, cb, &state, err));
    if (cfg->choices_path && !state) GP_TRY(choices_read(cfg, cb, err));
    struct run s;
    memset(&s, 0, sizeof s);
    /* The kernel choices measured while the pipeline is made (cuDNN's). */
    struct gp_measure_count meas = {.report = cb ? cb->on_measure : NULL, .user = cb ? cb->user : NULL};
    gp_measure_begin(&meas);
    gp_status st = setup(&s, cfg, train, err);
    gp_measure_end(&meas);
    if (st == GP_OK && s.channels_last && cb && cb->on_note) {
        char note[160];
        snprintf(note, sizeof note, "%d activations stored channels-last (--layout nchw keeps them as the model says)",
                 s.channels_last);
        cb->on_note(cb->user, note);
    }
    if (st == GP_OK && cfg->remake_norm != GP_REMAKE_NEVER && cb && cb->on_note) remade_note(&s, cfg, cb);
    size_t given_up = st == GP_OK ? gp_pipeline_inputs_ahead_given_up(s.pipe) : 0;
    if (given_up && cb && cb->on_note) {
        char note[240];
        bool mib = given_up >= (1 << 20);
        snprintf(note, sizeof note,
                 "the first stage had no room for the next step's inputs (%.1f %s), so they are not uploaded "
                 "during the step before: each step copies its own at its start",
                 (double)given_up / (mib ? 1 << 20 : 1 << 10), mib ? "MiB" : "KiB");
        cb->on_note(cb->user, note);
    }
    if (st == GP_OK && val) st = check_indices(&s, val, "validation", err);
    if (st == GP_OK) st = gather_choices(&s, cfg, cb, err);
    if (st == GP_OK && cfg->choices_path && writer) st = choices_write(cfg, err);
    if (st != GP_OK) {
        gp_state_close(state);
        run_free(&s);
        return st;
    }
    int64_t per_epoch = train->n / cfg->batch;
    int64_t total = cfg->steps > 0 ? cfg->steps : cfg->epochs * per_epoch;
    if (cb && cb->on_start) {
        char summary[512], shares[64] = "";
        if (replicas_of(cfg) > 1) snprintf(shares, sizeof shares, "%lld replicas x ", (long long)replicas_of(cfg));
        snprintf(summary, sizeof summary,
                 "training %s: %lld samples, batch %lld (%s%lld micro-batch%s of %lld), %lld steps "
                 "(%lld per epoch, last %lld samples of each epoch dropped), %s, %s, %lld parameters, "
                 "%.1f MiB planned (%d stage%s, %s schedule, checkpoint %s)",
                 cfg->model_path, (long long)train->n, (long long)cfg->batch, shares, (long long)cfg->chunks,
                 cfg->chunks == 1 ? "" : "es", (long long)s.micro, (long long)total,
                 (long long)per_epoch, (long long)(train->n % cfg->batch),
                 cfg->optimizer == GP_OPT_ADAMW ? "AdamW" : "SGD", gp_precision_name(cfg->precision),
                 (long long)gp_graph_param_count(&s.g), planned_mib(&s), gp_pipeline_stages(s.pipe),
                 gp_pipeline_stages(s.pipe) == 1 ? "" : "s", gp_pipe_schedule_name(cfg->pipeline_schedule),
                 gp_checkpoint_name(cfg->checkpoint));
        cb->on_start(cb->user, total, per_epoch, summary);
    }

    /* Saved states: the run's settings, and where a resumed run is. */
    struct gp_resume_run rr = {.cfg = cfg, .g = &s.g, .pipe = s.pipe, .train = train, .loss = s.loss,
                               .class_axis = s.class_axis, .steps_per_epoch = per_epoch, .total_steps = total};
    struct gp_state_meta *meta = NULL;
    struct position at = {0};
    if (cfg->state_dir || cfg->resume_path) {
        meta = calloc(1, sizeof *meta);
        st = meta ? gp_resume_settings(&rr, meta, err) : gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    }
    if (st == GP_OK && state) st = resume(state, &rr, meta, cb, &at, err);
    gp_state_close(state);

    bool has_labels = train->y.dtype != GP_DTYPE_UNDEFINED;
    double start = now(), last_save = start, epoch_loss = at.epoch_loss;
    int64_t epoch = -1, epoch_steps = at.epoch_steps, first_step = at.done;
    /* States once per epoch unless a period was asked for. */
    int64_t every = cfg->save_every > 0 || cfg->save_every_seconds > 0 ? cfg->save_every : per_epoch;
    /* Each step's batch is gathered while the step before it runs. */
    struct gp_prefetch *batches = NULL;
    if (st == GP_OK)
        st = gp_prefetch_create(s.pipe, train, cfg->batch, per_epoch, cfg->shuffle, cfg->seed, &batches, err);
    for (int64_t step = first_step; step < total && st == GP_OK; step++) {
        double t0 = now();
        int64_t in_epoch = step % per_epoch;
        epoch = step / per_epoch;
        const void *bx = NULL, *by = NULL, *bnext = NULL;
        gp_prefetch_get(batches, step, step + 1 < total ? step + 1 : -1, step + 2 < total ? step + 2 : -1, &bx, &by,
                        &bnext);
        double denominator = loss_terms(&s, train, by, cfg->batch);
        if (has_labels &&
            (st = check_labels(&s, by, gp_shape_numel(&train->y.shape) / train->n * cfg->batch, err)) != GP_OK)
            break;
        struct gp_step_opts so = {.seed = cfg->seed, .step = (uint64_t)step,
                                  .dropout_ratio = cfg->dropout_ratio, .next_inputs = bnext};
        double lr = lr_at(cfg, step, total);
        /* The step and its optimizer as one piece of work (one CUDA graph
         * launch where graphs are on). */
        struct gp_step_outcome out;
        st = gp_pipeline_train_step(s.pipe, bx, s.loss == GP_LOSS_OUTPUT ? NULL : by, &so, denominator, lr,
                                    cfg->clip_norm, &out, err);
        if (st != GP_OK) break;
        double step_loss = out.loss_sum / denominator;
        if (step == first_step + 1 && cb && cb->on_note && gp_pipeline_graph_note(s.pipe))
            cb->on_note(cb->user, gp_pipeline_graph_note(s.pipe));
        /* A step whose loss (or clipped gradients' norm) is not finite was
         * not applied: the pipeline's weights and optimizer state are the
         * last finite step's (pipeline.h, gp_step_outcome). The data were
         * checked finite (CLI), so the weights diverged: stop, saving
         * nothing. */
        if (!isfinite(step_loss)) {
            st = gp_error_set(err, GP_ERR_INVALID,
                              "the loss became %g at step %lld: the training diverged; lower --lr or use "
                              "--clip-norm",
                              step_loss, (long long)step + 1);
            break;
        }
        if (!out.applied) {
            st = gp_error_set(err, GP_ERR_INVALID,
                              "the gradients' norm became %g at step %lld (loss %g): the training diverged; "
                              "lower --lr",
                              (double)out.grad_norm, (long long)step + 1, step_loss);
            break;
        }

        epoch_loss += step_loss;
        epoch_steps++;
        double t1 = now();
        if (cb && cb->on_step) {
            struct gp_step_report r = {.step = step, .total_steps = total, .epoch = epoch,
                                       .loss = step_loss, .lr = lr, .seconds = t1 - t0,
                                       .elapsed = t1 - start, .samples = cfg->batch,
                                       .first_step = first_step};
            cb->on_step(cb->user, &r);
        }
        bool epoch_end = in_epoch == per_epoch - 1 || step == total - 1;
        /* Across processes evaluation is collective: every rank takes part,
         * whether or not it reports. */
        if (epoch_end && ((cb && cb->on_epoch) || (val && cfg->remote))) {
            struct gp_epoch_report r = {.epoch = epoch, .step = step + 1,
                                        .train_loss = epoch_loss / (double)epoch_steps,
                                        .val_accuracy = -1};
            if (val && (st = evaluate(&s, val, &r.val_loss, &r.val_accuracy, err)) != GP_OK) break;
            r.has_val = val != NULL;
            if (cb && cb->on_epoch) cb->on_epoch(cb->user, &r);
        }
        /* A run that ends inside an epoch keeps its sums: a state saved
         * there continues them. */
        if (in_epoch == per_epoch - 1) {
            epoch_loss = 0;
            epoch_steps = 0;
        }
        int64_t done = step + 1;
        bool due = (every > 0 && done % every == 0) ||
                   (cfg->save_every_seconds > 0 && now() - last_save >= cfg->save_every_seconds);
        if (cfg->state_dir && due && done < total) {
            struct position here = {.done = done, .epoch_loss = epoch_loss, .epoch_steps = epoch_steps};
            if ((st = save_state(&s, &rr, meta, &here, cb, err)) != GP_OK) break;
            last_save = now();
        }
    }
    gp_prefetch_free(batches);
    /* The last state, where training ended (a resumed run that had nothing
     * left to do writes it again: the same state, and the folder pruned). */
    if (st == GP_OK && cfg->state_dir) {
        struct position here = {.done = total, .epoch_loss = epoch_loss, .epoch_steps = epoch_steps};
        st = save_state(&s, &rr, meta, &here, cb, err);
    }
    free(meta);

    if (st == GP_OK && cfg->save_path) {
        /* Parameters and buffers (BatchNorm statistics) go back by name. */
        int n = 0;
        for (int v = 0; v < s.g.n_values; v++)
            n += s.g.values[v].is_initializer &&
                 (s.g.values[v].kind == GP_VALUE_PARAMETER || s.g.values[v].kind == GP_VALUE_BUFFER);
        struct gp_saved_tensor *out = calloc((size_t)n + 1, sizeof *out);
        float **bufs = calloc((size_t)n + 1, sizeof *bufs);
        int k = 0;
        for (int v = 0; out && bufs && v < s.g.n_values; v++) {
            const struct gp_value *val_ = &s.g.values[v];
            if (!val_->is_initializer ||
                (val_->kind != GP_VALUE_PARAMETER && val_->kind != GP_VALUE_BUFFER))
                continue;
            bufs[k] = malloc(sizeof(float) * (size_t)(gp_shape_numel(&val_->shape) + 1));
            if (!bufs[k]) break;
            if ((st = gp_pipeline_read(s.pipe, v, bufs[k], err)) != GP_OK) break;
            out[k] = (struct gp_saved_tensor){.name = val_->name, .data = bufs[k],
                                              .shape = val_->shape};
            k++;
        }
        if (st == GP_OK && (!out || !bufs || k != n)) st = gp_error_set(err, GP_ERR_NOMEM, "out of memory saving");
        else if (st == GP_OK && writer) st = gp_onnx_save(cfg->model_path, cfg->save_path, out, n, err);
        for (int i = 0; bufs && i < k; i++) free(bufs[i]);
        free(bufs);
        free(out);
    }
    if (st == GP_OK && cfg->trace_path) st = gp_pipeline_write_trace(s.pipe, cfg->trace_path, err);
    /* The memory table: across processes every stage's process takes part
     * (the stages' reports meet at stage 0's, which reports them all). */
    int n_stages = gp_pipeline_stages(s.pipe);
    struct gp_stage_report *reports = NULL;
    bool *known = NULL;
    if (st == GP_OK && ((cb && cb->on_memory) || cfg->remote)) {
        reports = calloc((size_t)n_stages, sizeof *reports);
        known = calloc((size_t)n_stages, sizeof *known);
        if (!reports || !known) st = gp_error_set(err, GP_ERR_NOMEM, "out of memory reporting the stages' memory");
        else st = gp_pipeline_reports(s.pipe, reports, known, err);
    }
    if (st == GP_OK && cb && cb->on_memory)
        for (int k = 0; k < n_stages; k++) {
            /* Another process's stage, reported from a process other than
             * stage 0's: its peak is that process's to know. */
            if (!known[k]) continue;
            const struct gp_stage_report r = reports[k];
            struct gp_stage_memory_report m = {
                .stage = k, .first_layer = r.first_layer, .last_layer = r.last_layer,
                .device = r.device, .backend = r.backend, .param_bytes = r.param_bytes, .optim_bytes = r.optim_bytes,
                .activation_bytes = r.activation_bytes, .activation_peak = r.activation_peak,
                .frontier_in_bytes = r.frontier_in_bytes, .planned_bytes = r.planned_bytes,
                .box_bytes = r.box_bytes, .set_bytes = r.set_bytes, .inbox_bytes = r.inbox_bytes,
                .frontier_boxes = r.frontier_boxes, .activation_sets = r.activation_sets,
                .gradient_inboxes = r.gradient_inboxes, .arena_bytes = r.arena_bytes,
                .gradient_set_bytes = r.gradient_set_bytes, .gradients_in_arena = r.gradients_in_arena,
                .remade_values = r.remade_values, .remade_saved_bytes = r.remade_saved_bytes,
                .gradient_addends = r.gradient_addends};
            cb->on_memory(cb->user, &m);
        }
    free(reports);
    free(known);
    run_free(&s);
    return st;
}
