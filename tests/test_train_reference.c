/* Training reproduces PyTorch: every fixture trained 20 steps with SGD
 * (momentum, weight decay) and with AdamW against the runs that
 * models/make_reference.py recorded with PyTorch from the same initial
 * weights and data (see models/reference/README.md for the contract).
 * The dynamo exporter's fixtures (torch 2.11, optimize=False) hold the
 * torch 1.13 fixtures' weights, so they must reproduce the same runs. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/npy.h"
#include "fixtures.h"
#include "onnx/load.h"
#include "train/trainer.h"
#include "util/json_parse.h"

static const char *const fixtures[] = {"mlp_op17", "digits_cnn_op17", "resnet_op17",
                                       "unet_op17", "gpt_op17", "gpt_op13"};
static char tmp[256];

static void collect_loss(void *user, const struct gp_step_report *r)
{
    ((double *)user)[r->step] = r->loss;
}

static double num(const struct gp_jvalue *obj, const char *key)
{
    const struct gp_jvalue *v = gp_jobject_get(obj, key);
    if (!v || v->type != GP_JNUMBER) fail_msg("reference config lacks '%s'", key);
    return v->num;
}

/* True when element i of tensor `name` is listed as noise-driven. */
static bool noise_driven(const struct gp_jvalue *noise, const char *name, int64_t i)
{
    const struct gp_jvalue *list = gp_jobject_get(noise, name);
    for (size_t k = 0; list && k < list->count; k++)
        if (list->items[k].i == i) return true;
    return false;
}

static void check_bf16_run(const char *fixture, const char *run, const double *ours, int64_t steps);

/* What `model`'s initial tensor `name` adds to the reference's final one:
 * nothing where its initial values are the reference model's (every
 * parameter must be), and for a BatchNorm running statistic that starts
 * elsewhere m^steps times the difference, m the node's momentum: training
 * reads only the batch's statistics, and each step's r <- m r + (1 - m) s
 * carries a difference in r over scaled by m. The dynamo exporter writes
 * the fresh statistics (0 and 1); the torch 1.13 fixtures hold them after
 * one update, from the training-mode run the TorchScript exporter traces.
 * False, with `why` set, for any other difference. */
static bool start_shift(const struct gp_graph *model, const struct gp_graph *ref, const char *name, int64_t steps,
                        double *shift, int64_t n, char *why, size_t why_size)
{
    int a = gp_graph_find_value(model, name), b = gp_graph_find_value(ref, name);
    if (a < 0 || b < 0 || !model->values[a].constant ||
        !gp_shape_equal(&model->values[a].constant->shape, &ref->values[b].constant->shape)) {
        snprintf(why, why_size, "'%s' is not in the model as in the reference's", name);
        return false;
    }
    bool differs = false;
    for (int64_t i = 0; i < n; i++) {
        shift[i] = gp_tensor_get_f64(model->values[a].constant, i) - gp_tensor_get_f64(ref->values[b].constant, i);
        differs |= shift[i] != 0;
    }
    if (!differs) return true;
    for (int k = 0; k < model->n_nodes; k++) {
        const struct gp_node *nd = &model->nodes[k];
        if (strcmp(nd->op_type, "BatchNormalization") || nd->n_inputs < 5 ||
            (nd->inputs[3] != a && nd->inputs[4] != a))
            continue;
        double scale = pow(gp_node_attr_float(nd, "momentum", 0.9f), (double)steps);
        for (int64_t i = 0; i < n; i++) shift[i] *= scale;
        return true;
    }
    snprintf(why, why_size, "initial '%s' differs from the reference's and is no BatchNorm running statistic",
             name);
    return false;
}

/* Trains models/<model>.onnx as reference/<fixture>/<run>.json says. */
static void check_model_run(const char *model_name, const char *fixture, const char *run, bool bf16)
{
    char path[4096], name[512];
    struct gp_error err = {0};
    snprintf(name, sizeof name, "reference/%s/%s.json", fixture, run);
    struct gp_json_doc doc;
    if (gp_json_parse_file(fixture_path(name, path, sizeof path), &doc, &err) != GP_OK)
        fail_msg("%s", err.msg);
    const struct gp_jvalue *cfgj = gp_jobject_get(doc.root, "config");
    const struct gp_jvalue *losses = gp_jobject_get(doc.root, "losses");

    struct gp_train_config cfg;
    gp_train_config_defaults(&cfg);
    char model[4096], data[4096], labels[4096], saved[512];
    snprintf(name, sizeof name, "%s.onnx", model_name);
    cfg.model_path = fixture_path(name, model, sizeof model);
    cfg.batch = (int64_t)num(cfgj, "batch");
    cfg.steps = (int64_t)num(cfgj, "steps");
    cfg.shuffle = false;
    cfg.dropout_ratio = 0;
    cfg.loss_auto = false;
    cfg.loss = strcmp(gp_jobject_get(cfgj, "loss")->str, "mse") == 0 ? GP_LOSS_MSE
                                                                      : GP_LOSS_CROSS_ENTROPY;
    cfg.lr = num(cfgj, "lr");
    cfg.weight_decay = num(cfgj, "weight_decay");
    bool adamw = strcmp(run, "adamw") == 0;
    if (adamw) {
        cfg.optimizer = GP_OPT_ADAMW;
        cfg.beta1 = gp_jarray_at(gp_jobject_get(cfgj, "betas"), 0)->num;
        cfg.beta2 = gp_jarray_at(gp_jobject_get(cfgj, "betas"), 1)->num;
        cfg.eps = num(cfgj, "eps");
        cfg.torch_1_13 = true; /* the references come from PyTorch 1.13 */
    } else {
        cfg.optimizer = GP_OPT_SGD;
        cfg.momentum = num(cfgj, "momentum");
    }
    snprintf(saved, sizeof saved, "%s/%s_%s.onnx", tmp, model_name, run);
    cfg.save_path = saved;
    if (bf16) cfg.precision = GP_PRECISION_BF16;

    struct gp_npy x, y;
    snprintf(name, sizeof name, "reference/%s/data.npy", fixture);
    if (gp_npy_read(fixture_path(name, data, sizeof data), &x, &err) != GP_OK) fail_msg("%s", err.msg);
    snprintf(name, sizeof name, "reference/%s/labels.npy", fixture);
    if (gp_npy_read(fixture_path(name, labels, sizeof labels), &y, &err) != GP_OK) fail_msg("%s", err.msg);
    struct gp_dataset ds;
    if (gp_dataset_from_arrays(cfg.model_path, &x, &y, &ds, &err) != GP_OK) fail_msg("%s", err.msg);
    gp_npy_free(&x);
    gp_npy_free(&y);

    double *ours = calloc((size_t)cfg.steps, sizeof(double));
    struct gp_train_callbacks cb = {.user = ours, .on_step = collect_loss};
    if (gp_train(&cfg, &ds, NULL, &cb, &err) != GP_OK) fail_msg("%s %s: %s", model_name, run, err.msg);
    gp_dataset_free(&ds);

    assert_int_equal(losses->count, (size_t)cfg.steps);
    if (bf16) {
        check_bf16_run(fixture, run, ours, cfg.steps);
        free(ours);
        gp_json_doc_free(&doc);
        return;
    }
    double worst_loss = 0;
    for (int64_t s = 0; s < cfg.steps; s++) {
        double ref = losses->items[s].num, rel = fabs(ours[s] - ref) / fabs(ref);
        if (rel > worst_loss) worst_loss = rel;
        if (rel > 1e-5)
            fail_msg("%s %s step %lld: loss %.9g, PyTorch %.9g (relative %.2e)", model_name, run,
                     (long long)s + 1, ours[s], ref, rel);
    }

    /* Final weights: |ours - torch| <= 1e-3 max(1, |torch|), noise-driven
     * elements under AdamW within 2 lr steps (see the contract). */
    struct gp_graph got, want, start, ref_start;
    snprintf(name, sizeof name, "reference/%s/%s_final.onnx", fixture, run);
    if (gp_onnx_load(saved, 1, &got, &err) != GP_OK) fail_msg("%s", err.msg);
    if (gp_onnx_load(fixture_path(name, path, sizeof path), 1, &want, &err) != GP_OK) fail_msg("%s", err.msg);
    bool other = strcmp(model_name, fixture) != 0;
    if (other) {
        snprintf(name, sizeof name, "%s.onnx", fixture);
        if (gp_onnx_load(model, 1, &start, &err) != GP_OK) fail_msg("%s", err.msg);
        if (gp_onnx_load(fixture_path(name, path, sizeof path), 1, &ref_start, &err) != GP_OK)
            fail_msg("%s", err.msg);
    }
    int shifted = 0;
    const struct gp_jvalue *noise = gp_jobject_get(doc.root, "noise_driven_elements");
    double noise_tol = 2 * cfg.lr * (double)cfg.steps, worst_w = 0;
    int compared = 0;
    for (int v = 0; v < want.n_values; v++) {
        const struct gp_value *w = &want.values[v];
        if (!w->is_initializer || !gp_dtype_is_float(w->dtype)) continue;
        int id = gp_graph_find_value(&got, w->name);
        assert_true(id >= 0);
        const struct gp_tensor *a = got.values[id].constant, *b = w->constant;
        assert_true(gp_shape_equal(&a->shape, &b->shape));
        int64_t n = gp_shape_numel(&b->shape);
        double *shift = calloc((size_t)n + 1, sizeof *shift);
        char why[512];
        if (other && !start_shift(&start, &ref_start, w->name, cfg.steps, shift, n, why, sizeof why))
            fail_msg("%s against %s: %s", model_name, fixture, why);
        for (int64_t i = 0; other && i < n; i++)
            if (shift[i] != 0) {
                shifted++;
                break;
            }
        for (int64_t i = 0; i < n; i++) {
            double ga = gp_tensor_get_f64(a, i), wb = gp_tensor_get_f64(b, i) + shift[i];
            double tol = adamw && noise_driven(noise, w->name, i) ? noise_tol : 1e-3 * fmax(1, fabs(wb));
            double d = fabs(ga - wb) / fmax(1, fabs(wb));
            if (tol == noise_tol) d = 0; /* reported separately: not a precision measure */
            if (d > worst_w) worst_w = d;
            if (fabs(ga - wb) > tol)
                fail_msg("%s %s: '%s'[%lld] is %.9g, PyTorch %.9g", model_name, run, w->name,
                         (long long)i, ga, wb);
        }
        free(shift);
        compared++;
    }
    assert_true(compared > 0);
    printf("%-18s %-6s losses within %.1e, weights within %.1e of PyTorch (%d tensors", model_name, run,
           worst_loss, worst_w, compared);
    if (other) printf(", %d running statistics from other starting values", shifted);
    printf(")\n");
    if (other) {
        /* No parameter of the reference missing from the model, none extra. */
        int params = 0, ref_params = 0;
        for (int v = 0; v < start.n_values; v++) params += start.values[v].kind == GP_VALUE_PARAMETER;
        for (int v = 0; v < ref_start.n_values; v++) ref_params += ref_start.values[v].kind == GP_VALUE_PARAMETER;
        assert_int_equal(params, ref_params);
        gp_graph_free(&start);
        gp_graph_free(&ref_start);
    }
    gp_graph_free(&got);
    gp_graph_free(&want);
    free(ours);
    gp_json_doc_free(&doc);
}

/* bf16 (--precision bf16) against PyTorch's autocast run of the same
 * training (reference/<fixture>/<run>_bf16.json) and against PyTorch's
 * float32 run. Two correct bf16 trainings differ by about as much as either
 * differs from float32: rounding decides near-ties (ReLU kinks, argmax),
 * and small nets with BatchNorm amplify such differences within a few steps
 * (models/reference/README.md measures it). So every step's loss must be
 * within max(4 d, 1e-2) of both, relative, where d is the largest relative
 * distance of PyTorch's own bf16 losses from its float32 ones. */
static void check_run(const char *fixture, const char *run, bool bf16)
{
    check_model_run(fixture, fixture, run, bf16);
}

static void check_bf16_run(const char *fixture, const char *run, const double *ours, int64_t steps)
{
    char path[4096], name[512];
    struct gp_error err = {0};
    struct gp_json_doc bdoc, fdoc;
    snprintf(name, sizeof name, "reference/%s/%s_bf16.json", fixture, run);
    if (gp_json_parse_file(fixture_path(name, path, sizeof path), &bdoc, &err) != GP_OK) fail_msg("%s", err.msg);
    snprintf(name, sizeof name, "reference/%s/%s.json", fixture, run);
    if (gp_json_parse_file(fixture_path(name, path, sizeof path), &fdoc, &err) != GP_OK) fail_msg("%s", err.msg);
    const struct gp_jvalue *bl = gp_jobject_get(bdoc.root, "losses"), *fl = gp_jobject_get(fdoc.root, "losses");
    const struct gp_jvalue *dist = gp_jobject_get(bdoc.root, "float32_distance");
    assert_non_null(bl);
    assert_non_null(fl);
    assert_non_null(dist);
    assert_int_equal(bl->count, (size_t)steps);
    double d = num(dist, "max_loss_rel"), tol = fmax(4 * d, 1e-2);
    double worst_b = 0, worst_f = 0;
    for (int64_t s = 0; s < steps; s++) {
        double rb = fabs(ours[s] - bl->items[s].num) / fabs(bl->items[s].num);
        double rf = fabs(ours[s] - fl->items[s].num) / fabs(fl->items[s].num);
        worst_b = fmax(worst_b, rb);
        worst_f = fmax(worst_f, rf);
        if (rb > tol || rf > tol)
            fail_msg("%s %s bf16 step %lld: loss %.9g, PyTorch autocast %.9g, float32 %.9g (relative %.2e, %.2e; "
                     "allowed %.2e)",
                     fixture, run, (long long)s + 1, ours[s], bl->items[s].num, fl->items[s].num, rb, rf, tol);
    }
    printf("%-16s %-6s bf16 losses within %.1e of PyTorch autocast, %.1e of float32 (allowed %.1e; PyTorch's "
           "bf16 is %.1e from float32)\n",
           fixture, run, worst_b, worst_f, tol, d);
    gp_json_doc_free(&bdoc);
    gp_json_doc_free(&fdoc);
}

static void test_sgd(void **state)
{
    (void)state;
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) check_run(fixtures[f], "sgd", false);
}

static void test_adamw(void **state)
{
    (void)state;
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) check_run(fixtures[f], "adamw", false);
}

static void test_bf16(void **state)
{
    (void)state;
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        check_run(fixtures[f], "sgd", true);
        check_run(fixtures[f], "adamw", true);
    }
}

/* Both optimizers; the fixtures are small (20 steps of batch 8). */
static void test_dynamo_exports(void **state)
{
    (void)state;
    static const char *const pairs[][2] = {
        {"resnet_dynamo", "resnet_op17"}, {"digits_cnn_dynamo", "digits_cnn_op17"}, {"gpt_dynamo", "gpt_op17"}};
    for (size_t f = 0; f < sizeof pairs / sizeof *pairs; f++) {
        check_model_run(pairs[f][0], pairs[f][1], "sgd", false);
        check_model_run(pairs[f][0], pairs[f][1], "adamw", false);
    }
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_dynamo_exports),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
