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
#include "fixtures.h"
#include "onnx/load.h"
#include "pipeline_bench.h"
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

static void open_gpu(const struct setup *su, bool graph, struct pipe_bench *b)
{
    struct pipe_bench_setup bs = {.fixture = su->fixture, .batch = su->batch, .batches = STEPS, .stages = su->stages,
                                  .chunks = su->chunks, .balance = su->balance, .ops = &gp_cuda_device_ops,
                                  .adamw = su->adamw, .deferred_bn = su->deferred_bn, .graph = graph};
    for (int k = 0; k < su->stages; k++) bs.device[k] = su->spread ? k % gpus() : 0;
    pipe_bench_open(&bs, b);
    if (graph && gp_pipeline_graph_note(b->p)) fail_msg("%s: no graph: %s", su->fixture, gp_pipeline_graph_note(b->p));
}

static double lr_of(const struct setup *su, int s)
{
    double base = su->adamw ? 2e-3 : 0.05;
    struct gp_schedule sc = {.kind = GP_SCHEDULE_COSINE, .base_lr = base, .warmup_steps = 2,
                             .total_steps = STEPS + 1, .min_lr = base / 10};
    return gp_schedule_lr(&sc, s);
}

/* One step of b: through gp_pipeline_train_step (graphed where b is), or
 * the old sequence. */
static void step(struct pipe_bench *b, bool combined, int s, double lr, double clip, struct gp_step_outcome *out)
{
    struct gp_error err = {0};
    const void *x = pipe_bench_x(b, s), *y = pipe_bench_y(b, s);
    struct gp_step_opts so = {.seed = 5, .step = (uint64_t)s, .dropout_ratio = -1};
    double den = pipe_bench_denominator(b, y);
    memset(out, 0, sizeof *out);
    gp_status st = combined ? gp_pipeline_train_step(b->p, x, y, &so, den, lr, clip, out, &err)
                            : gp_pipeline_step(b->p, x, y, &so, den, &out->loss_sum, &err);
    if (st == GP_OK && !combined) st = gp_pipeline_optimize(b->p, lr, clip, out, &err);
    if (st != GP_OK) fail_msg("%s, step %d: %s", b->su.fixture, s + 1, err.msg);
}

static void check_sequence(struct setup su)
{
    char what[256];
    describe(&su, what, sizeof what);
    struct pipe_bench graph, old;
    open_gpu(&su, true, &graph);
    open_gpu(&su, false, &old);
    for (int s = 0; s < STEPS; s++) {
        struct gp_step_outcome a, b;
        step(&graph, true, s, lr_of(&su, s), su.clip, &a);
        step(&old, false, s, lr_of(&su, s), su.clip, &b);
        if (memcmp(&a.loss_sum, &b.loss_sum, sizeof(double)) != 0 ||
            memcmp(&a.grad_norm, &b.grad_norm, sizeof(float)) != 0 || a.applied != b.applied || !a.applied)
            fail_msg("%s, step %d: graphed loss %.17g norm %.9g applied %d, step then optimize %.17g %.9g %d", what,
                     s + 1, a.loss_sum, (double)a.grad_norm, a.applied, b.loss_sum, (double)b.grad_norm, b.applied);
    }
    if (!gp_pipeline_graphed(graph.p)) fail_msg("%s: the last step was not a graph", what);
    assert_int_equal(gp_pipeline_optim_steps(graph.p), STEPS);
    assert_int_equal(gp_pipeline_optim_steps(old.p), STEPS);
    size_t na = 0, nb = 0;
    float *ka = pipe_bench_keep(&graph, &na), *kb = pipe_bench_keep(&old, &nb);
    assert_int_equal(na, nb);
    for (size_t i = 0; i < na; i++)
        if (memcmp(&ka[i], &kb[i], sizeof(float)) != 0)
            fail_msg("%s: kept value %zu is %.9g graphed, %.9g by step then optimize", what, i, (double)ka[i],
                     (double)kb[i]);
    printf("%-72s graphed step = step + optimize, %zu values and state\n", what, na);
    free(ka);
    free(kb);
    pipe_bench_close(&graph);
    pipe_bench_close(&old);
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
    struct pipe_bench b;
    open_gpu(&su, true, &b);
    int diverged = -1;
    for (int s = 0; s < 40 && diverged < 0; s++) {
        size_t nb = 0, na = 0;
        float *before = pipe_bench_keep(&b, &nb);
        int64_t steps = gp_pipeline_optim_steps(b.p);
        struct gp_step_outcome out;
        step(&b, true, s, s < 2 ? 0.05 : 1e4, 0, &out);
        double loss = out.loss_sum / pipe_bench_denominator(&b, pipe_bench_y(&b, s));
        if (out.applied != isfinite(loss))
            fail_msg("step %d: loss %g %s applied", s + 1, loss, out.applied ? "was" : "was not");
        if (!isfinite(loss)) {
            diverged = s;
            if (!gp_pipeline_graphed(b.p)) fail_msg("the diverged step %d was not a graph", s + 1);
            float *after = pipe_bench_keep(&b, &na);
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
    pipe_bench_close(&b);
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
