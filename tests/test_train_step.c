/* The whole training step as one piece of work (gp_pipeline_train_step:
 * forward, backward, tied sums, clipping, optimizer, with the step's
 * scalars in device memory and the clipping coefficient and the divergence
 * guard computed on the last stage's device) gives the bits of the
 * sequence it replaces, gp_pipeline_step then gp_pipeline_optimize (whose
 * coefficient and guard are computed on the host): losses, parameters,
 * buffers, optimizer state and step counts, with a learning rate that
 * changes every step, SGD and AdamW, with and without clipping, 1 to 3
 * stages (on separate CPU devices and sharing one), deferred BatchNorm, and
 * a parameter tied between stages.
 *
 * A step that diverges changes nothing: a loss that is not finite, or with
 * clipping a gradient norm that is not, leaves every parameter, buffer and
 * optimizer state as the step before left it, and the step uncounted; the
 * trainer stops with an error and saves nothing. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixtures.h"
#include "onnx/load.h"
#include "pipeline_bench.h"
#include "train/trainer.h"

#define STEPS 4

static char tmp[256];

struct setup {
    const char *fixture;   /* under models/, without .onnx */
    int64_t batch;
    int stages, micro_batches;
    const int *balance;    /* NULL: an even split */
    bool share_device;     /* every stage on cpu:0 (else stage k on cpu:k) */
    bool adamw, deferred_bn;
    double clip;
    bool constant_lr;      /* the base rate every step, not the schedule */
};

static void open_cpu(const struct setup *su, struct pipe_bench *b)
{
    struct pipe_bench_setup bs = {.fixture = su->fixture, .batch = su->batch, .batches = STEPS, .stages = su->stages,
                                  .chunks = su->micro_batches, .balance = su->balance, .ops = &gp_cpu_device_ops,
                                  .adamw = su->adamw, .deferred_bn = su->deferred_bn};
    for (int k = 0; k < su->stages; k++) bs.device[k] = su->share_device ? 0 : k;
    pipe_bench_open(&bs, b);
}

/* A schedule that changes the rate at every step (linear warmup over the
 * first two, cosine decay after), so a rate baked in anywhere shows. */
static double lr_of(const struct setup *su, int s)
{
    double base = su->adamw ? 2e-3 : 0.05;
    if (su->constant_lr) return base;
    struct gp_schedule sc = {.kind = GP_SCHEDULE_COSINE, .base_lr = base, .warmup_steps = 2,
                             .total_steps = STEPS + 1, .min_lr = base / 10};
    return gp_schedule_lr(&sc, s);
}

/* Everything training keeps (pipe_bench_keep). */
struct kept {
    float *v;
    size_t n;
};

static void keep(struct pipe_bench *b, struct kept *out) { out->v = pipe_bench_keep(b, &out->n); }

struct result {
    double loss[STEPS];
    float grad_norm[STEPS];
    bool applied[STEPS];
    int64_t optim_steps;
    struct kept kept;
};

/* One step of b through the combined entry point or the old sequence. */
static void step(struct pipe_bench *b, bool combined, int s, double lr, double clip, struct gp_step_outcome *out)
{
    struct gp_error err = {0};
    const void *x = pipe_bench_x(b, s), *y = pipe_bench_y(b, s);
    struct gp_step_opts so = {.seed = 3, .step = (uint64_t)s, .dropout_ratio = -1};
    double den = pipe_bench_denominator(b, y);
    memset(out, 0, sizeof *out);
    gp_status st = combined ? gp_pipeline_train_step(b->p, x, y, &so, den, lr, clip, out, &err)
                            : gp_pipeline_step(b->p, x, y, &so, den, &out->loss_sum, &err);
    if (st == GP_OK && !combined) st = gp_pipeline_optimize(b->p, lr, clip, out, &err);
    if (st != GP_OK) fail_msg("%s, step %d: %s", b->su.fixture, s + 1, err.msg);
}

/* STEPS steps through the combined entry point or the old sequence. */
static void run(const struct setup *su, bool combined, struct result *r)
{
    struct pipe_bench b;
    open_cpu(su, &b);
    memset(r, 0, sizeof *r);
    for (int s = 0; s < STEPS; s++) {
        struct gp_step_outcome out;
        step(&b, combined, s, lr_of(su, s), su->clip, &out);
        r->loss[s] = out.loss_sum;
        r->grad_norm[s] = out.grad_norm;
        r->applied[s] = out.applied;
    }
    r->optim_steps = gp_pipeline_optim_steps(b.p);
    keep(&b, &r->kept);
    pipe_bench_close(&b);
}

static void describe(const struct setup *su, char *buf, size_t size)
{
    snprintf(buf, size, "%s, %d stage%s%s x %d micro-batches, %s%s%s", su->fixture, su->stages,
             su->stages > 1 ? "s" : "", su->share_device ? " on one device" : "", su->micro_batches,
             su->adamw ? "AdamW" : "SGD", su->clip > 0 ? ", clipped" : "", su->deferred_bn ? ", deferred BatchNorm" : "");
}

/* The combined step against the old sequence, bit for bit. */
static void check(struct setup su)
{
    char what[256];
    describe(&su, what, sizeof what);
    struct result a, b;
    run(&su, true, &a);
    run(&su, false, &b);
    for (int s = 0; s < STEPS; s++) {
        if (memcmp(&a.loss[s], &b.loss[s], sizeof(double)) != 0)
            fail_msg("%s: step %d loss %.17g, step then optimize %.17g", what, s + 1, a.loss[s], b.loss[s]);
        if (memcmp(&a.grad_norm[s], &b.grad_norm[s], sizeof(float)) != 0)
            fail_msg("%s: step %d gradient norm %.9g, step then optimize %.9g", what, s + 1, (double)a.grad_norm[s],
                     (double)b.grad_norm[s]);
        if (!a.applied[s] || !b.applied[s]) fail_msg("%s: step %d was not applied", what, s + 1);
    }
    assert_int_equal(a.optim_steps, STEPS);
    assert_int_equal(b.optim_steps, STEPS);
    assert_int_equal(a.kept.n, b.kept.n);
    for (size_t i = 0; i < a.kept.n; i++)
        if (memcmp(&a.kept.v[i], &b.kept.v[i], sizeof(float)) != 0)
            fail_msg("%s: kept value %zu is %.9g, step then optimize %.9g", what, i, (double)a.kept.v[i],
                     (double)b.kept.v[i]);
    /* Clipping must have clipped, or the coefficient went untested. */
    if (su.clip > 0) {
        bool clipped = false;
        for (int s = 0; s < STEPS; s++) clipped |= a.grad_norm[s] > su.clip;
        if (!clipped) fail_msg("%s: no step's norm exceeded --clip-norm %g: nothing was clipped", what, su.clip);
    } else {
        for (int s = 0; s < STEPS; s++) assert_true(a.grad_norm[s] == 0.0f);
    }
    printf("%-70s losses %.6f .. %.6f, %zu values equal\n", what, a.loss[0], a.loss[STEPS - 1], a.kept.n);
    free(a.kept.v);
    free(b.kept.v);
}

static void test_mlp(void **state)
{
    (void)state;
    for (int adamw = 0; adamw < 2; adamw++)
        for (int clip = 0; clip < 2; clip++) {
            double c = clip ? 0.05 : 0;
            check((struct setup){.fixture = "mlp_op17", .batch = 16, .stages = 1, .micro_batches = 2,
                                 .adamw = adamw, .clip = c});
            check((struct setup){.fixture = "mlp_op17", .batch = 16, .stages = 2, .micro_batches = 4,
                                 .adamw = adamw, .clip = c});
        }
    check((struct setup){.fixture = "mlp_op17", .batch = 16, .stages = 3, .micro_batches = 4, .share_device = true,
                         .adamw = true, .clip = 0.05});
}

/* BatchNorm (deferred: its commit is part of the optimizer task) and
 * Dropout, two stages. */
static void test_cnn(void **state)
{
    (void)state;
    check((struct setup){.fixture = "digits_cnn_op17", .batch = 8, .stages = 2, .micro_batches = 2,
                         .adamw = true, .clip = 0.1, .deferred_bn = true});
    check((struct setup){.fixture = "digits_cnn_op17", .batch = 8, .stages = 1, .micro_batches = 2,
                         .clip = 0.1, .deferred_bn = true});
}

/* The GPT whose head reads its token embedding: on the devices its
 * holders' gradients meet by copies, through the host in the old
 * sequence; clipping counts it once. */
static void test_tied(void **state)
{
    (void)state;
    const char *tied = "../tests/data/tied_gpt_op17";
    check((struct setup){.fixture = tied, .batch = 8, .stages = 2, .micro_batches = 4,
                         .balance = (const int[]){17, 16}, .clip = 0.05});
    check((struct setup){.fixture = tied, .batch = 8, .stages = 3, .micro_batches = 2,
                         .balance = (const int[]){11, 11, 11}, .adamw = true, .clip = 0.05});
    check((struct setup){.fixture = tied, .batch = 8, .stages = 2, .micro_batches = 2, .share_device = true,
                         .balance = (const int[]){17, 16}, .adamw = true});
}

/* The schedule reaches the updates: the same run at a constant rate ends
 * elsewhere (a rate fixed at the first step would not). */
static void test_schedule_matters(void **state)
{
    (void)state;
    struct setup su = {.fixture = "mlp_op17", .batch = 16, .stages = 2, .micro_batches = 2, .clip = 0.05};
    struct result scheduled, constant;
    run(&su, true, &scheduled);
    su.constant_lr = true;
    run(&su, true, &constant);
    assert_int_equal(scheduled.kept.n, constant.kept.n);
    assert_true(memcmp(scheduled.kept.v, constant.kept.v, sizeof(float) * scheduled.kept.n) != 0);
    free(scheduled.kept.v);
    free(constant.kept.v);
}

/* ---- two steps' gradients, one update ---- */

/* Every parameter of b, in value order (malloc'd; *count floats). */
static float *read_params(struct pipe_bench *b, size_t *count)
{
    size_t n = 0;
    for (int v = 0; v < b->g.n_values; v++)
        if (b->g.values[v].kind == GP_VALUE_PARAMETER) n += (size_t)gp_shape_numel(&b->g.values[v].shape);
    float *w = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(w);
    size_t at = 0;
    for (int v = 0; v < b->g.n_values; v++) {
        if (b->g.values[v].kind != GP_VALUE_PARAMETER) continue;
        struct gp_error err = {0};
        if (gp_pipeline_read(b->p, v, w + at, &err) != GP_OK) fail_msg("%s", err.msg);
        at += (size_t)gp_shape_numel(&b->g.values[v].shape);
    }
    *count = n;
    return w;
}

/* From a fresh pipeline: gp_pipeline_step on each batch of `batches`
 * (-1 ends), then one gp_pipeline_optimize; the parameters after. */
static float *update_from(const struct setup *su, const int *batches, float **start, size_t *count)
{
    struct pipe_bench b;
    open_cpu(su, &b);
    if (start) *start = read_params(&b, count);
    for (const int *s = batches; *s >= 0; s++) {
        struct gp_error err = {0};
        const void *x = pipe_bench_x(&b, *s), *y = pipe_bench_y(&b, *s);
        struct gp_step_opts so = {.seed = 3, .step = 0, .dropout_ratio = 0};
        double loss = 0;
        if (gp_pipeline_step(b.p, x, y, &so, pipe_bench_denominator(&b, y), &loss, &err) != GP_OK)
            fail_msg("%s: %s", su->fixture, err.msg);
    }
    struct gp_error err = {0};
    struct gp_step_outcome out;
    if (gp_pipeline_optimize(b.p, 0.05, 0, &out, &err) != GP_OK) fail_msg("%s: %s", su->fixture, err.msg);
    assert_true(out.applied);
    float *w = read_params(&b, count);
    pipe_bench_close(&b);
    return w;
}

/* gp_pipeline_step leaves the gradients accumulated for
 * gp_pipeline_optimize: two steps before one update take both batches'
 * gradients, each once, also those that reach a parameter through a layer
 * run once per step (the tied GPT's head Transpose, whose gradient sums
 * its micro-batches before the Transpose's backward adds it in). SGD's
 * first update is lr (g + decay w), so the update from batches 0 and 1
 * moves each parameter by the moves of batch 0 alone and of batch 1 alone,
 * less one decay term, to float rounding. */
static void accumulated(const struct setup *su)
{
    size_t n = 0, na = 0, nb = 0;
    float *w0 = NULL;
    float *both = update_from(su, (const int[]){0, 1, -1}, &w0, &n);
    float *a = update_from(su, (const int[]){0, -1}, NULL, &na), *b = update_from(su, (const int[]){1, -1}, NULL, &nb);
    assert_true(n == na && n == nb && n > 0);
    const double lr = 0.05, decay = 1e-3; /* pipe_bench's SGD */
    double scale = 0, worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)w0[i] - a[i]) + fabs((double)w0[i] - b[i]));
    for (size_t i = 0; i < n; i++) {
        double expect = (double)w0[i] - ((double)w0[i] - a[i]) - ((double)w0[i] - b[i]) + lr * decay * w0[i];
        double off = fabs(both[i] - expect);
        if (off > worst) worst = off, at = i;
    }
    char what[256];
    describe(su, what, sizeof what);
    printf("%s: two steps, one update: largest difference %.3g (moves up to %.3g)\n", what, worst, scale);
    if (!(worst <= 1e-5 * scale + 1e-7))
        fail_msg("%s: parameter float %zu is %.9g after two steps and one update, %.9g expected (%.9g and %.9g "
                 "after each batch alone, %.9g before)",
                 what, at, (double)both[at], (double)w0[at] - ((double)w0[at] - a[at]) - ((double)w0[at] - b[at]) +
                 lr * decay * w0[at], (double)a[at], (double)b[at], (double)w0[at]);
    free(w0);
    free(both);
    free(a);
    free(b);
}

static void test_accumulated_steps(void **state)
{
    (void)state;
    const char *tied = "../tests/data/tied_gpt_op17";
    accumulated(&(struct setup){.fixture = tied, .batch = 8, .stages = 1, .micro_batches = 2});
    accumulated(&(struct setup){.fixture = tied, .batch = 8, .stages = 2, .micro_batches = 2,
                                .balance = (const int[]){17, 16}});
    accumulated(&(struct setup){.fixture = "mlp_op17", .batch = 16, .stages = 2, .micro_batches = 2});
}

static bool all_finite(const struct kept *k)
{
    for (size_t i = 0; i < k->n; i++)
        if (!isfinite(k->v[i])) return false;
    return true;
}

/* A rate that makes the MLP diverge: every step up to the one whose loss
 * is not finite is applied; that one changes nothing and is not counted,
 * through the combined step and the old sequence alike. */
static void test_divergence_changes_nothing(void **state)
{
    (void)state;
    for (int combined = 0; combined < 2; combined++) {
        struct setup su = {.fixture = "mlp_op17", .batch = 16, .stages = 2, .micro_batches = 2};
        struct pipe_bench b;
        open_cpu(&su, &b);
        int diverged = -1;
        for (int s = 0; s < 40 && diverged < 0; s++) {
            struct kept before;
            keep(&b, &before);
            int64_t steps_before = gp_pipeline_optim_steps(b.p);
            struct gp_step_outcome out;
            step(&b, combined, s, 1e4, 0, &out);
            double loss = out.loss_sum / pipe_bench_denominator(&b, pipe_bench_y(&b, s));
            if (out.applied != isfinite(loss))
                fail_msg("%s, step %d: loss %g %s applied", combined ? "train step" : "step + optimize", s + 1, loss,
                         out.applied ? "was" : "was not");
            if (!isfinite(loss)) {
                diverged = s;
                struct kept after;
                keep(&b, &after);
                assert_int_equal(after.n, before.n);
                if (memcmp(after.v, before.v, sizeof(float) * after.n) != 0)
                    fail_msg("the diverged step %d changed parameters, buffers or optimizer state", s + 1);
                if (!all_finite(&after)) fail_msg("the weights before the diverged step %d were not finite", s + 1);
                assert_int_equal(gp_pipeline_optim_steps(b.p), steps_before);
                free(after.v);
            } else {
                assert_int_equal(gp_pipeline_optim_steps(b.p), steps_before + 1);
            }
            free(before.v);
        }
        if (diverged < 0) fail_msg("lr 1e4 did not make the MLP diverge in 40 steps");
        printf("%s: the loss diverged at step %d, which changed nothing\n",
               combined ? "gp_pipeline_train_step" : "gp_pipeline_step + gp_pipeline_optimize", diverged + 1);
        pipe_bench_close(&b);
    }
}

/* With clipping, a gradient norm that is not finite while the loss is
 * (MSE against targets of 1e25: the loss sums in double, the gradients'
 * squares overflow float32) skips the step too, on both routes; without
 * clipping no norm is taken and the step is applied, as before. */
static void test_infinite_norm(void **state)
{
    (void)state;
    char model[4096];
    fixture_path("mlp_op17.onnx", model, sizeof model);
    struct gp_error err = {0};
    struct gp_graph g;
    if (gp_onnx_load(model, 8, &g, &err) != GP_OK) fail_msg("%s", err.msg);
    const struct gp_value *o = &g.values[g.outputs[0]];
    int64_t n_out = gp_shape_numel(&o->shape);
    float *targets = malloc(sizeof(float) * (size_t)(2 * n_out));
    for (int64_t i = 0; i < 2 * n_out; i++) targets[i] = 1e25f;
    struct gp_dataset ds;
    if (gp_dataset_synthetic(model, 16, 7, &ds, &err) != GP_OK) fail_msg("%s", err.msg);
    for (int clip = 0; clip < 2; clip++)
        for (int combined = 0; combined < 2; combined++) {
            const struct gp_device_ops *ops[2] = {&gp_cpu_device_ops, &gp_cpu_device_ops};
            int index[2] = {0, 1};
            struct gp_pipeline_config pc = {
                .graph = &g, .n_stages = 2, .device_ops = ops, .device_index = index, .n_micro = 2,
                .schedule = GP_PIPE_GPIPE, .checkpoint = GP_CHECKPOINT_EXCEPT_LAST, .optim = gp_sgd_defaults(0.1),
                .loss = {.kind = GP_LOSS_MSE, .target_dtype = GP_DTYPE_FLOAT32, .target_shape = o->shape},
            };
            struct gp_pipeline *p = NULL;
            if (gp_pipeline_create(&pc, &p, &err) != GP_OK) fail_msg("%s", err.msg);
            struct gp_step_opts so = {.seed = 1, .dropout_ratio = -1};
            double den = (double)(2 * n_out), max_norm = clip ? 1.0 : 0.0;
            struct gp_step_outcome out = {0};
            gp_status st = combined ? gp_pipeline_train_step(p, ds.x.data, targets, &so, den, 0.1, max_norm, &out, &err)
                                    : gp_pipeline_step(p, ds.x.data, targets, &so, den, &out.loss_sum, &err);
            if (st == GP_OK && !combined) st = gp_pipeline_optimize(p, 0.1, max_norm, &out, &err);
            if (st != GP_OK) fail_msg("%s", err.msg);
            if (!isfinite(out.loss_sum / den)) fail_msg("the loss is not finite: %g", out.loss_sum / den);
            if (clip && (out.applied || isfinite(out.grad_norm)))
                fail_msg("%s: norm %g, the step %s applied", combined ? "train step" : "step + optimize",
                         (double)out.grad_norm, out.applied ? "was" : "was not");
            if (!clip && !out.applied) fail_msg("without clipping the step was not applied");
            assert_int_equal(gp_pipeline_optim_steps(p), clip ? 0 : 1);
            gp_pipeline_free(p);
        }
    gp_dataset_free(&ds);
    free(targets);
    gp_graph_free(&g);
}

/* Through the trainer: a diverging run stops with the loss named and
 * writes neither the model nor a state. */
static void test_trainer_stops(void **state)
{
    (void)state;
    char model[4096], saved[512], states[512];
    fixture_path("mlp_op17.onnx", model, sizeof model);
    snprintf(saved, sizeof saved, "%s/diverged.onnx", tmp);
    snprintf(states, sizeof states, "%s/states", tmp);
    struct gp_error err = {0};
    struct gp_dataset ds;
    if (gp_dataset_synthetic(model, 16 * 40, 7, &ds, &err) != GP_OK) fail_msg("%s", err.msg);
    struct gp_train_config cfg;
    gp_train_config_defaults(&cfg);
    cfg.model_path = model;
    cfg.batch = 16;
    cfg.chunks = 2;
    cfg.n_stages = 2;
    cfg.stage_device[0] = 0;
    cfg.stage_device[1] = 1;
    cfg.steps = 40;
    cfg.lr = 1e4;
    cfg.save_path = saved;
    cfg.state_dir = states;
    cfg.save_every = 1000; /* only the last state, which a diverged run never reaches */
    gp_status st = gp_train(&cfg, &ds, NULL, NULL, &err);
    gp_dataset_free(&ds);
    assert_int_not_equal(st, GP_OK);
    if (!strstr(err.msg, "the training diverged")) fail_msg("not a divergence: %s", err.msg);
    if (access(saved, F_OK) == 0) fail_msg("a diverged run saved the model");
    DIR *d = opendir(states);
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.') fail_msg("a diverged run saved a state: %s/%s", states, e->d_name);
    if (d) closedir(d);
    printf("trainer: %s\n", err.msg);
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
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp),
        cmocka_unit_test(test_cnn),
        cmocka_unit_test(test_tied),
        cmocka_unit_test(test_schedule_matters),
        cmocka_unit_test(test_accumulated_steps),
        cmocka_unit_test(test_divergence_changes_nothing),
        cmocka_unit_test(test_infinite_norm),
        cmocka_unit_test(test_trainer_stops),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
