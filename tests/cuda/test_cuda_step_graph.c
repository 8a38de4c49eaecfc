/* The whole training step, optimizer included, as one CUDA graph launch:
 * replayed steps give exactly what eager issuing gives (--cuda-graph off),
 * with a learning rate that changes at every step (warmup then cosine:
 * a rate baked into the graph at its capture would show from the third
 * step on) and gradient clipping (its coefficient computed on the device
 * by the guard, every step's own), SGD and AdamW, one stage, stages sharing
 * the GPU and stages over two GPUs where there are two (norms gathered and
 * scalars handed back by peer copies inside the graph), deferred
 * BatchNorm, and a parameter tied between stages (its holders' gradients
 * summed by copies inside the graph).
 *
 * Against the sequence it replaced (gp_pipeline_step, then
 * gp_pipeline_optimize with the clipping coefficient and the guard
 * computed on the host), the graphed step also gives the same parameters,
 * buffers, optimizer state and gradient norms bit for bit, and a step
 * whose loss is not finite changes nothing inside the graph.
 *
 * Without a CUDA device the test prints why and exits 77 (a skip). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/device.h"
#include "data/dataset.h"
#include "fixtures.h"
#include "onnx/load.h"
#include "pipeline/pipeline.h"
#include "train/loss.h"
#include "train/trainer.h"

#define STEPS 6

static char tmp[256];
static int n_runs;

struct setup {
    const char *fixture;   /* under models/, without .onnx */
    int64_t batch;
    int chunks, stages;
    const int *balance;    /* NULL: the trainer's even split */
    bool spread;           /* stage k on GPU k modulo the GPUs visible (else all on cuda:0) */
    bool adamw, deferred_bn;
    double clip;
};

/* ---- through the trainer: graph on against --cuda-graph off ---- */

struct result {
    double loss[STEPS];
    struct gp_graph saved;
    char note[1024];
};

static void on_step(void *user, const struct gp_step_report *r) { ((struct result *)user)->loss[r->step] = r->loss; }

static void on_note(void *user, const char *message)
{
    /* The CUDA graph's notes only (not the layout's). */
    if (!strstr(message, "channels-last")) snprintf(((struct result *)user)->note, 1024, "%s", message);
}

static int gpus(void)
{
    int n = 1;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) n = 1;
    return n;
}

static void train(const struct setup *s, bool graph, struct result *res)
{
    char model[4096], name[256], saved[512];
    snprintf(name, sizeof name, "%s.onnx", s->fixture);
    fixture_path(name, model, sizeof model);
    struct gp_error err = {0};
    struct gp_dataset ds;
    if (gp_dataset_synthetic(model, s->batch * STEPS, 11, &ds, &err) != GP_OK) fail_msg("%s", err.msg);
    struct gp_train_config cfg;
    gp_train_config_defaults(&cfg);
    cfg.model_path = model;
    cfg.batch = s->batch;
    cfg.chunks = s->chunks;
    cfg.steps = STEPS;
    cfg.shuffle = false;
    cfg.optimizer = s->adamw ? GP_OPT_ADAMW : GP_OPT_SGD;
    cfg.lr = s->adamw ? 2e-3 : 0.05;
    cfg.momentum = s->adamw ? 0 : 0.9;
    cfg.weight_decay = s->adamw ? 0.01 : 1e-3;
    /* A new rate at every step: 2 of warmup, then cosine to a tenth. */
    cfg.schedule = GP_SCHED_COSINE;
    cfg.warmup_steps = 2;
    cfg.min_lr = cfg.lr / 10;
    cfg.clip_norm = s->clip;
    cfg.deferred_batch_norm = s->deferred_bn;
    cfg.n_stages = s->stages;
    for (int k = 0; k < s->stages; k++) {
        cfg.stage_cuda[k] = true;
        cfg.stage_device[k] = s->spread ? k % gpus() : 0;
        if (s->balance) cfg.balance[k] = s->balance[k];
    }
    cfg.cuda_graph = graph ? GP_CUDA_GRAPH_ON : GP_CUDA_GRAPH_OFF;
    snprintf(saved, sizeof saved, "%s/%d.onnx", tmp, n_runs++);
    cfg.save_path = saved;
    memset(res, 0, sizeof *res);
    struct gp_train_callbacks cb = {.user = res, .on_step = on_step, .on_note = on_note};
    if (gp_train(&cfg, &ds, NULL, &cb, &err) != GP_OK)
        fail_msg("%s %s: %s", s->fixture, graph ? "graphed" : "eager", err.msg);
    gp_dataset_free(&ds);
    if (gp_onnx_load(saved, 1, &res->saved, &err) != GP_OK) fail_msg("%s", err.msg);
}

static void describe(const struct setup *s, char *buf, size_t size)
{
    snprintf(buf, size, "%s, %d stage%s on %s x %d micro-batches, %s%s%s", s->fixture, s->stages,
             s->stages > 1 ? "s" : "", s->stages > 1 && s->spread && gpus() > 1 ? "2 GPUs" : "1 GPU", s->chunks,
             s->adamw ? "AdamW" : "SGD", s->clip > 0 ? ", clipped" : "", s->deferred_bn ? ", deferred BatchNorm" : "");
}

/* Graphed against eager: the losses and every saved value bit for bit,
 * and the graph really ran (no note). */
static bool check_trainer(struct setup s)
{
    char what[256];
    describe(&s, what, sizeof what);
    struct result eager, graph;
    train(&s, false, &eager);
    train(&s, true, &graph);
    bool ok = true;
    if (graph.note[0]) {
        printf("MISMATCH %s: no graph: %s\n", what, graph.note);
        ok = false;
    }
    for (int k = 0; k < STEPS; k++)
        if (memcmp(&graph.loss[k], &eager.loss[k], sizeof(double)) != 0) {
            printf("MISMATCH %s: step %d loss %.17g replayed, %.17g eager\n", what, k + 1, graph.loss[k],
                   eager.loss[k]);
            ok = false;
        }
    int64_t values = 0;
    for (int v = 0; v < eager.saved.n_values; v++) {
        const struct gp_value *w = &eager.saved.values[v];
        if (!w->is_initializer || !gp_dtype_is_float(w->dtype)) continue;
        const struct gp_tensor *x = graph.saved.values[gp_graph_find_value(&graph.saved, w->name)].constant;
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < gp_shape_numel(&w->shape); i++) {
            double a = gp_tensor_get_f64(x, i), b = gp_tensor_get_f64(w->constant, i);
            if (memcmp(&a, &b, sizeof a) != 0 && bad++ == 0) first = i;
        }
        values += gp_shape_numel(&w->shape);
        if (bad) {
            printf("MISMATCH %s: '%s': %lld elements differ, the first [%lld] %.9g replayed, %.9g eager\n", what,
                   w->name, (long long)bad, (long long)first, gp_tensor_get_f64(x, first),
                   gp_tensor_get_f64(w->constant, first));
            ok = false;
        }
    }
    printf("%-72s losses %.6f .. %.6f, %lld values%s\n", what, graph.loss[0], graph.loss[STEPS - 1],
           (long long)values, ok ? " equal bit for bit" : "  MISMATCH");
    gp_graph_free(&eager.saved);
    gp_graph_free(&graph.saved);
    return ok;
}

static void test_graph_vs_eager(void **state)
{
    (void)state;
    const char *tied = "../tests/data/tied_gpt_op17";
    const struct setup setups[] = {
        {.fixture = "mlp_op17", .batch = 16, .chunks = 2, .stages = 1, .clip = 0.05},
        {.fixture = "mlp_op17", .batch = 16, .chunks = 2, .stages = 1, .adamw = true, .clip = 0.05},
        {.fixture = "mlp_op17", .batch = 16, .chunks = 4, .stages = 2, .spread = true},
        {.fixture = "gpt_op17", .batch = 8, .chunks = 4, .stages = 2, .spread = true, .adamw = true, .clip = 0.5},
        {.fixture = "gpt_op17", .batch = 8, .chunks = 4, .stages = 3, .clip = 0.5},
        {.fixture = "resnet_op17", .batch = 8, .chunks = 2, .stages = 2, .spread = true, .clip = 0.1,
         .deferred_bn = true},
        {.fixture = tied, .batch = 8, .chunks = 4, .stages = 2, .balance = (const int[]){17, 16}, .spread = true,
         .clip = 0.05},
        {.fixture = tied, .batch = 8, .chunks = 2, .stages = 3, .balance = (const int[]){11, 11, 11}, .adamw = true,
         .clip = 0.05},
    };
    int failed = 0, n = (int)(sizeof setups / sizeof *setups);
    for (int i = 0; i < n; i++) failed += !check_trainer(setups[i]);
    if (failed) fail_msg("%d of %d graphed runs differ from eager ones (MISMATCH lines above)", failed, n);
}

/* ---- the pipeline itself: the graphed step against the old sequence ---- */

struct bench {
    struct gp_graph g;
    struct gp_dataset ds;
    struct gp_pipeline *p;
    size_t x_row, y_row;
    int64_t terms;        /* loss terms per batch (cross-entropy's labels: none ignored here) */
};

static void bench_open(const struct setup *su, bool graph, struct bench *b)
{
    char model[4096], name[256];
    snprintf(name, sizeof name, "%s.onnx", su->fixture);
    fixture_path(name, model, sizeof model);
    struct gp_error err = {0};
    memset(b, 0, sizeof *b);
    if (gp_dataset_synthetic(model, su->batch * STEPS, 11, &b->ds, &err) != GP_OK) fail_msg("%s", err.msg);
    int64_t micro = su->batch / su->chunks;
    if (gp_onnx_load(model, micro, &b->g, &err) != GP_OK) fail_msg("%s", err.msg);
    if (b->ds.y.dtype != GP_DTYPE_INT64) fail_msg("%s: the test expects class labels", su->fixture);
    b->x_row = gp_dataset_row_bytes(&b->ds.x);
    b->y_row = gp_dataset_row_bytes(&b->ds.y);
    b->terms = gp_shape_numel(&b->ds.y.shape) / b->ds.n * su->batch;
    const struct gp_value *o = &b->g.values[b->g.outputs[0]];
    struct gp_loss_spec loss = {.kind = GP_LOSS_CROSS_ENTROPY, .ignore_index = GP_LOSS_IGNORE_INDEX,
                                .target_dtype = GP_DTYPE_INT64, .target_shape = b->ds.y.shape};
    loss.target_shape.dims[0] = micro;
    if (gp_loss_class_axis(&o->shape, &loss.target_shape, GP_CLASS_AXIS_AUTO, &loss.class_axis, &err) != GP_OK)
        fail_msg("%s", err.msg);
    struct gp_optim_config oc = su->adamw ? gp_adamw_defaults(2e-3) : gp_sgd_defaults(0.05);
    if (!su->adamw) oc.momentum = 0.9;
    const struct gp_device_ops *ops[8];
    int index[8];
    for (int k = 0; k < su->stages; k++) {
        ops[k] = &gp_cuda_device_ops;
        index[k] = su->spread ? k % gpus() : 0;
    }
    struct gp_pipeline_config pc = {
        .graph = &b->g,
        .n_stages = su->stages,
        .balance = su->balance,
        .device_ops = ops,
        .device_index = index,
        .n_micro = su->chunks,
        .schedule = GP_PIPE_GPIPE,
        .checkpoint = GP_CHECKPOINT_EXCEPT_LAST,
        .optim = oc,
        .deferred_batch_norm = su->deferred_bn,
        .loss = loss,
        .cuda_graph = graph,
    };
    if (gp_pipeline_create(&pc, &b->p, &err) != GP_OK) fail_msg("%s: %s", su->fixture, err.msg);
    if (graph && gp_pipeline_graph_note(b->p)) fail_msg("%s: no graph: %s", su->fixture, gp_pipeline_graph_note(b->p));
}

static void bench_close(struct bench *b)
{
    gp_pipeline_free(b->p);
    gp_graph_free(&b->g);
    gp_dataset_free(&b->ds);
}

static double lr_of(const struct setup *su, int s)
{
    double base = su->adamw ? 2e-3 : 0.05;
    struct gp_schedule sc = {.kind = GP_SCHEDULE_COSINE, .base_lr = base, .warmup_steps = 2,
                             .total_steps = STEPS + 1, .min_lr = base / 10};
    return gp_schedule_lr(&sc, s);
}

/* Every float parameter and buffer, and every optimizer slot of every
 * parameter, in value order, as one array. */
static float *keep(struct bench *b, size_t *count)
{
    struct gp_error err = {0};
    int slots = gp_pipeline_optim_slots(b->p);
    size_t n = 0;
    for (int pass = 0; pass < 2; pass++) {
        float *out = pass ? malloc(sizeof(float) * (n + 1)) : NULL;
        float *at = out;
        for (int v = 0; v < b->g.n_values; v++) {
            const struct gp_value *val = &b->g.values[v];
            if (!val->is_initializer || !gp_dtype_is_float(val->dtype)) continue;
            if (val->kind != GP_VALUE_PARAMETER && val->kind != GP_VALUE_BUFFER) continue;
            int64_t numel = gp_shape_numel(&val->shape);
            int tensors = 1 + (val->kind == GP_VALUE_PARAMETER ? slots : 0);
            if (!pass) {
                n += (size_t)numel * (size_t)tensors;
                continue;
            }
            if (gp_pipeline_read(b->p, v, at, &err) != GP_OK) fail_msg("%s", err.msg);
            for (int q = 0; q + 1 < tensors; q++)
                if (gp_pipeline_read_optim(b->p, v, q, at + (size_t)(q + 1) * (size_t)numel, &err) != GP_OK)
                    fail_msg("%s", err.msg);
            at += (size_t)numel * (size_t)tensors;
        }
        if (pass) {
            *count = n;
            return out;
        }
    }
    return NULL;
}

/* One step of `b`: graphed through gp_pipeline_train_step, or the old
 * sequence; lr and the outcome. */
static void step(const struct setup *su, struct bench *b, bool combined, int s, double lr, struct gp_step_outcome *out)
{
    struct gp_error err = {0};
    const void *x = (const char *)b->ds.x.data + (size_t)((s % STEPS) * su->batch) * b->x_row;
    const void *y = (const char *)b->ds.y.data + (size_t)((s % STEPS) * su->batch) * b->y_row;
    struct gp_step_opts so = {.seed = 5, .step = (uint64_t)s, .dropout_ratio = -1};
    double den = (double)b->terms;
    memset(out, 0, sizeof *out);
    gp_status st = combined ? gp_pipeline_train_step(b->p, x, y, &so, den, lr, su->clip, out, &err)
                            : gp_pipeline_step(b->p, x, y, &so, den, &out->loss_sum, &err);
    if (st == GP_OK && !combined) st = gp_pipeline_optimize(b->p, lr, su->clip, out, &err);
    if (st != GP_OK) fail_msg("%s, step %d: %s", su->fixture, s + 1, err.msg);
}

static void check_sequence(struct setup su)
{
    char what[256];
    describe(&su, what, sizeof what);
    struct bench graph, old;
    bench_open(&su, true, &graph);
    bench_open(&su, false, &old);
    for (int s = 0; s < STEPS; s++) {
        struct gp_step_outcome a, b;
        step(&su, &graph, true, s, lr_of(&su, s), &a);
        step(&su, &old, false, s, lr_of(&su, s), &b);
        if (memcmp(&a.loss_sum, &b.loss_sum, sizeof(double)) != 0 ||
            memcmp(&a.grad_norm, &b.grad_norm, sizeof(float)) != 0 ||
            a.applied != b.applied || !a.applied)
            fail_msg("%s, step %d: graphed loss %.17g norm %.9g applied %d, step then optimize %.17g %.9g %d", what,
                     s + 1, a.loss_sum, (double)a.grad_norm, a.applied, b.loss_sum, (double)b.grad_norm, b.applied);
    }
    if (!gp_pipeline_graphed(graph.p)) fail_msg("%s: the last step was not a graph", what);
    assert_int_equal(gp_pipeline_optim_steps(graph.p), STEPS);
    assert_int_equal(gp_pipeline_optim_steps(old.p), STEPS);
    size_t na = 0, nb = 0;
    float *ka = keep(&graph, &na), *kb = keep(&old, &nb);
    assert_int_equal(na, nb);
    for (size_t i = 0; i < na; i++)
        if (memcmp(&ka[i], &kb[i], sizeof(float)) != 0)
            fail_msg("%s: kept value %zu is %.9g graphed, %.9g by step then optimize", what, i, (double)ka[i],
                     (double)kb[i]);
    printf("%-72s graphed step = step + optimize, %zu values and state\n", what, na);
    free(ka);
    free(kb);
    bench_close(&graph);
    bench_close(&old);
}

static void test_graph_vs_old_sequence(void **state)
{
    (void)state;
    check_sequence((struct setup){.fixture = "mlp_op17", .batch = 16, .chunks = 2, .stages = 2, .spread = true,
                                  .clip = 0.05});
    check_sequence((struct setup){.fixture = "gpt_op17", .batch = 8, .chunks = 4, .stages = 2, .adamw = true,
                                  .clip = 0.5});
    check_sequence((struct setup){.fixture = "../tests/data/tied_gpt_op17", .batch = 8, .chunks = 2, .stages = 2,
                                  .balance = (const int[]){17, 16}, .spread = true, .clip = 0.05});
}

/* A rate that makes the MLP diverge, graphed: the step whose loss is not
 * finite changes nothing on the GPU (the guard told the optimizer kernels
 * to skip) and is not counted. The first two steps (eager, then captured)
 * take an ordinary rate, so the divergence comes in a replay. */
static void test_graph_divergence(void **state)
{
    (void)state;
    struct setup su = {.fixture = "mlp_op17", .batch = 16, .chunks = 2, .stages = 2, .spread = true};
    struct bench b;
    bench_open(&su, true, &b);
    int diverged = -1;
    for (int s = 0; s < 40 && diverged < 0; s++) {
        size_t nb = 0, na = 0;
        float *before = keep(&b, &nb);
        int64_t steps = gp_pipeline_optim_steps(b.p);
        struct gp_step_outcome out;
        step(&su, &b, true, s, s < 2 ? 0.05 : 1e4, &out);
        bool finite = isfinite(out.loss_sum / (double)b.terms);
        if (out.applied != finite) fail_msg("step %d: loss %g, %s applied", s + 1, out.loss_sum, out.applied ? "" : "not");
        if (!finite) {
            diverged = s;
            if (!gp_pipeline_graphed(b.p)) fail_msg("the diverged step %d was not a graph", s + 1);
            float *after = keep(&b, &na);
            assert_int_equal(na, nb);
            if (memcmp(before, after, sizeof(float) * na) != 0)
                fail_msg("the diverged step %d changed parameters, buffers or optimizer state", s + 1);
            assert_int_equal(gp_pipeline_optim_steps(b.p), steps);
            free(after);
        } else {
            assert_int_equal(gp_pipeline_optim_steps(b.p), steps + 1);
        }
        free(before);
    }
    if (diverged < 2) fail_msg("lr 1e4 did not make the MLP diverge in 40 steps, or at step %d already", diverged + 1);
    printf("graphed: the loss diverged at step %d, which changed nothing\n", diverged + 1);
    bench_close(&b);
}

static int setup(void **state)
{
    (void)state;
    return temp_dir(tmp, sizeof tmp) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    remove_tree(tmp);
    return 0;
}

int main(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("skipped: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_graph_vs_eager),
        cmocka_unit_test(test_graph_vs_old_sequence),
        cmocka_unit_test(test_graph_divergence),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    printf("cuda_step_graph: %s, %d training runs\n", failed ? "FAILED" : "PASSED", n_runs);
    return failed ? 1 : 0;
}
