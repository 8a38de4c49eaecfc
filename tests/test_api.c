/* The public C API (include/gpipe_onnx.h), used as a program outside the
 * tree uses it: errors with messages, the layer list and frontiers against
 * the engine's own, balance reports (struct, JSON, SVG), training with
 * callbacks, predict and save, and contexts used from several threads at
 * once giving the bits of one used alone. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "gpipe_onnx.h"
#include "graph/layers.h"
#include "onnx/load.h"

static char tmp[256];

static gpo_model *open_fixture(const char *name, int64_t batch)
{
    char path[1024];
    struct gpo_open_options o;
    gpo_open_options_init(&o);
    o.batch = batch;
    gpo_model *m = NULL;
    if (gpo_open(fixture_path(name, path, sizeof path), &o, &m) != GPO_OK) fail_msg("%s", gpo_last_error(m));
    return m;
}

static void test_errors(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/missing.onnx", tmp);
    gpo_model *m = NULL;
    gpo_status st = gpo_open(path, NULL, &m);
    assert_int_equal(st, GPO_ERR_IO);
    assert_non_null(m);
    assert_non_null(strstr(gpo_last_error(m), "missing.onnx"));
    assert_int_equal(gpo_layer_count(m), 0);
    gpo_close(m);

    m = open_fixture("mlp_op17.onnx", 1);
    struct gpo_layer l;
    assert_int_equal(gpo_layer(m, gpo_layer_count(m), &l), GPO_ERR_ARGUMENT);
    assert_non_null(strstr(gpo_last_error(m), "layer"));
    char *json = NULL;
    assert_int_equal(gpo_balance_json(m, &json), GPO_ERR_ARGUMENT);
    assert_non_null(strstr(gpo_last_error(m), "gpo_balance"));
    /* A successful call clears the message. */
    assert_int_equal(gpo_layer(m, 0, &l), GPO_OK);
    assert_string_equal(gpo_last_error(m), "");
    struct gpo_balance_options bo;
    gpo_balance_options_init(&bo);
    bo.devices = "tpu:0";
    assert_int_equal(gpo_balance(m, &bo, NULL), GPO_ERR_ARGUMENT);
    assert_non_null(strstr(gpo_last_error(m), "tpu:0"));
    assert_string_equal(gpo_status_name(GPO_ERR_IO), "GPO_ERR_IO");
    struct gpo_system sys;
    gpo_system_info(&sys);
    assert_true(sys.cpu_cores >= 1);
    char why[256];
    int gpus = gpo_gpus(NULL, 0, why, sizeof why);
    assert_true(gpus >= 0 && (sys.cuda || gpus == 0));
    gpo_close(m);
    gpo_close(NULL);
}

/* Every layer, output shape and frontier as the engine computes them. */
static void test_layers(void **state)
{
    (void)state;
    char path[1024];
    struct gp_graph g;
    struct gp_layers ls;
    struct gp_error err = {0};
    fixture_path("unet_op17.onnx", path, sizeof path);
    assert_int_equal(gp_onnx_load(path, 3, &g, &err), GP_OK);
    assert_int_equal(gp_layers_build(&g, &ls, &err), GP_OK);
    gpo_model *m = open_fixture("unet_op17.onnx", 3);
    struct gpo_model_info info;
    gpo_model_info(m, &info);
    assert_int_equal(info.n_layers, g.n_nodes);
    assert_int_equal(gpo_layer_count(m), g.n_nodes);
    assert_int_equal(info.batch, 3);
    assert_int_equal(info.n_layers + info.folded_nodes + info.fused_nodes, info.source_nodes);
    assert_true(info.parameters > 0);
    assert_int_equal(info.input_frontier_bytes, ls.frontier_bytes[0]);
    struct gpo_value in;
    assert_int_equal(gpo_input(m, 0, &in), GPO_OK);
    assert_int_equal(in.dims[0], 3);
    int *ids = malloc(sizeof(int) * ((size_t)g.n_values + 1));
    const char **names = malloc(sizeof(char *) * ((size_t)g.n_values + 1));
    for (int i = 0; i < g.n_nodes; i++) {
        struct gpo_layer l;
        assert_int_equal(gpo_layer(m, i, &l), GPO_OK);
        assert_int_equal(l.index, i);
        assert_string_equal(l.op, g.nodes[i].op_type);
        assert_string_equal(l.name, g.nodes[i].name);
        assert_int_equal(l.params, ls.layer_params[i]);
        assert_int_equal(l.frontier_bytes, ls.frontier_bytes[i + 1]);
        assert_int_equal(gpo_frontier_bytes(m, i + 1), ls.frontier_bytes[i + 1]);
        for (int k = 0; k < l.n_inputs; k++) {
            int v = g.nodes[i].inputs[k];
            assert_string_equal(gpo_layer_input(m, i, k), v >= 0 ? g.values[v].name : "");
        }
        struct gpo_value out;
        assert_int_equal(gpo_layer_output(m, i, 0, &out), GPO_OK);
        const struct gp_value *v = &g.values[g.nodes[i].outputs[0]];
        assert_string_equal(out.name, v->name);
        assert_int_equal(out.rank, v->shape.rank);
        for (int d = 0; d < out.rank; d++) assert_int_equal(out.dims[d], v->shape.dims[d]);
        int n = gp_layers_frontier(&ls, &g, i + 1, ids);
        assert_int_equal(gpo_frontier(m, i + 1, names, g.n_values), n);
        assert_int_equal(l.frontier_count, n);
        for (int k = 0; k < n; k++) assert_string_equal(names[k], g.values[ids[k]].name);
    }
    assert_int_equal(gpo_frontier(m, g.n_nodes + 1, names, 0), -1);
    assert_int_equal(gpo_frontier_bytes(m, -1), -1);
    free(ids);
    free(names);
    gpo_close(m);
    gp_layers_free(&ls);
    gp_graph_free(&g);

    /* The dynamo exporter's GPT reads its embedding in its head too. */
    m = open_fixture("gpt_dynamo_opt.onnx", 1);
    gpo_model_info(m, &info);
    assert_true(info.n_tied >= 1);
    struct gpo_tied t;
    assert_int_equal(gpo_tied(m, 0, &t), GPO_OK);
    assert_true(t.n_readers >= 2 && t.readers[0] < t.readers[t.n_readers - 1]);
    gpo_close(m);
}

static int count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p++) n++;
    return n;
}

static void test_balance(void **state)
{
    (void)state;
    gpo_model *m = open_fixture("digits_cnn_op17.onnx", 1);
    struct gpo_balance_options bo;
    gpo_balance_options_init(&bo);
    bo.devices = "cpu:0,cpu:1,cpu:2";
    bo.batch = 8;
    bo.chunks = 4;
    bo.repeats = 1;
    const struct gpo_balance_report *r = NULL;
    if (gpo_balance(m, &bo, &r) != GPO_OK) fail_msg("%s", gpo_last_error(m));
    int n = gpo_layer_count(m);
    assert_int_equal(r->n_layers, n);
    assert_int_equal(r->micro_batch, 2);
    const struct gpo_split *splits[3] = {&r->optimal, &r->even, &r->heuristic};
    for (int k = 0; k < 3; k++) {
        const struct gpo_split *s = splits[k];
        assert_int_equal(s->n_stages, 3);
        assert_int_equal(s->stages[0].first_layer, 0);
        assert_int_equal(s->stages[2].last_layer, n - 1);
        for (int q = 0; q < 3; q++) {
            assert_int_equal(s->balance[q], s->stages[q].last_layer - s->stages[q].first_layer + 1);
            if (q) assert_int_equal(s->stages[q].first_layer, s->stages[q - 1].last_layer + 1);
        }
        assert_true(r->optimal.predicted_step_ms <= s->predicted_step_ms);
    }
    char *json = NULL;
    assert_int_equal(gpo_balance_json(m, &json), GPO_OK);
    assert_non_null(strstr(json, "\"stages\""));
    assert_non_null(strstr(json, "\"suggested_chunks\""));
    gpo_free(json);
    char path[512];
    snprintf(path, sizeof path, "%s/split.svg", tmp);
    assert_int_equal(gpo_balance_write_svg(m, path), GPO_OK);
    size_t size = 0;
    char *svg = (char *)read_whole(path, &size);
    assert_non_null(svg);
    svg = realloc(svg, size + 1);
    svg[size] = '\0';
    assert_int_equal(count(svg, "<g class=\"layer\""), n);
    assert_int_equal(count(svg, "<line class=\"cut\" data-cut"), 2);
    assert_int_equal(count(svg, "<g class=\"stage\""), 3);
    free(svg);
    /* An unwritable target fails naming it and writes nothing. */
    snprintf(path, sizeof path, "%s/no/such/folder/split.svg", tmp);
    assert_int_not_equal(gpo_balance_write_svg(m, path), GPO_OK);
    assert_non_null(strstr(gpo_last_error(m), "split.svg"));
    gpo_close(m);
}

/* ---- training ---- */

struct seen {
    int starts, steps, epochs, stages;
    double last_loss;
};

static void on_memory(void *user, const struct gpo_stage_memory *m)
{
    struct seen *s = user;
    assert_int_equal(m->stage, s->stages);
    assert_int_equal(m->first_layer, m->stage ? 4 : 0); /* the balance 4,6 */
    assert_true(m->planned_bytes > 0);
    s->stages++;
}

static void on_start(void *user, int64_t total, int64_t per_epoch, const char *summary)
{
    struct seen *s = user;
    s->starts++;
    assert_true(total > 0 && per_epoch > 0 && summary);
}

static void on_step(void *user, const struct gpo_step_info *i)
{
    struct seen *s = user;
    assert_int_equal(i->step, s->steps);
    s->steps++;
    s->last_loss = i->loss;
}

static void on_epoch(void *user, const struct gpo_epoch_info *e)
{
    struct seen *s = user;
    s->epochs++;
    assert_true(e->has_val && e->val_accuracy >= 0 && e->val_accuracy <= 1);
}

static void digits_config(struct gpo_train_config *c, char paths[4][1024])
{
    static const char *files[4] = {"digits_train_x.npy", "digits_train_y.npy", "digits_val_x.npy",
                                   "digits_val_y.npy"};
    for (int k = 0; k < 4; k++) fixture_path(files[k], paths[k], sizeof paths[k]);
    gpo_train_config_init(c);
    c->data = paths[0];
    c->labels = paths[1];
    c->val_data = paths[2];
    c->val_labels = paths[3];
    c->optimizer = GPO_OPTIMIZER_ADAMW;
    c->lr = 3e-3;
    c->seed = 7;
}

static void test_train_predict_save(void **state)
{
    (void)state;
    char paths[4][1024];
    struct gpo_train_config c;
    digits_config(&c, paths);
    c.devices = "cpu:0,cpu:1";
    c.balance = "4,6";
    c.chunks = 4;
    /* Under the sanitizers (~20x slower) a few steps: memory safety, not accuracy. */
    bool sanitized = getenv("GP_SANITIZED") && !strcmp(getenv("GP_SANITIZED"), "1");
    if (sanitized) c.steps = 8;
    gpo_model *m = open_fixture("digits_cnn_op17.onnx", 1);
    struct gpo_tensor before, after, reloaded;
    if (gpo_predict_file(m, paths[2], NULL, &before) != GPO_OK) fail_msg("%s", gpo_last_error(m));
    assert_int_equal(before.rank, 2);
    assert_int_equal(before.dims[1], 10);
    struct seen seen = {0};
    struct gpo_train_callbacks cb = {.user = &seen, .on_start = on_start, .on_step = on_step, .on_epoch = on_epoch,
                                  .on_memory = on_memory};
    struct gpo_train_result res;
    if (gpo_train(m, &c, &cb, &res) != GPO_OK) fail_msg("%s", gpo_last_error(m));
    assert_int_equal(seen.starts, 1);
    assert_int_equal(seen.epochs, 1);
    assert_int_equal(seen.stages, 2);
    assert_int_equal(res.steps, seen.steps);
    assert_true(res.last_loss == seen.last_loss);
    assert_true(res.has_val && res.val_accuracy > (sanitized ? 0.1 : 0.8));
    assert_int_equal(res.n_stages, 2);
    assert_int_equal(res.balance[0], 4);
    /* The context now runs the trained weights, and saves them. */
    if (gpo_predict_file(m, paths[2], NULL, &after) != GPO_OK) fail_msg("%s", gpo_last_error(m));
    assert_int_equal(after.dims[0], before.dims[0]);
    size_t bytes = (size_t)(after.dims[0] * after.dims[1]) * sizeof(float);
    assert_memory_not_equal(after.data, before.data, bytes);
    char saved[512];
    snprintf(saved, sizeof saved, "%s/trained.onnx", tmp);
    assert_int_equal(gpo_save(m, saved), GPO_OK);
    gpo_model *again = NULL;
    assert_int_equal(gpo_open(saved, NULL, &again), GPO_OK);
    assert_int_equal(gpo_predict_file(again, paths[2], NULL, &reloaded), GPO_OK);
    assert_memory_equal(reloaded.data, after.data, bytes);
    /* From memory: the same as from the file. */
    struct gpo_value in;
    assert_int_equal(gpo_input(again, 0, &in), GPO_OK);
    int64_t per = 1;
    for (int d = 1; d < in.rank; d++) per *= in.dims[d];
    size_t size = 0;
    unsigned char *npy = read_whole(paths[2], &size);
    assert_non_null(npy);
    size_t data_bytes = (size_t)(after.dims[0] * per) * sizeof(float);
    struct gpo_tensor mem;
    assert_int_equal(gpo_predict(again, (const float *)(npy + size - data_bytes), after.dims[0], in.dims + 1,
                                 in.rank - 1, NULL, &mem),
                     GPO_OK);
    assert_memory_equal(mem.data, after.data, bytes);
    free(npy);
    gpo_tensor_free(&mem);
    /* Training on, written straight to save_path: the context reads that file. */
    assert_string_equal(gpo_metadata(again, "gpipe-onnx.optimizer"), "adamw");
    assert_null(gpo_metadata(again, "no such key"));
    char direct[512];
    snprintf(direct, sizeof direct, "%s/direct.onnx", tmp);
    c.devices = NULL;
    c.balance = NULL;
    c.chunks = 1;
    c.steps = 3;
    c.save_path = direct;
    assert_int_equal(gpo_train(again, &c, NULL, &res), GPO_OK);
    assert_int_equal(res.steps, 3);
    gpo_model *direct_m = NULL;
    struct gpo_tensor from_ctx, from_file;
    assert_int_equal(gpo_open(direct, NULL, &direct_m), GPO_OK);
    assert_int_equal(gpo_predict_file(again, paths[2], NULL, &from_ctx), GPO_OK);
    assert_int_equal(gpo_predict_file(direct_m, paths[2], NULL, &from_file), GPO_OK);
    assert_memory_equal(from_ctx.data, from_file.data, bytes);
    assert_memory_not_equal(from_ctx.data, after.data, bytes);
    gpo_tensor_free(&from_ctx);
    gpo_tensor_free(&from_file);
    gpo_close(direct_m);
    gpo_tensor_free(&before);
    gpo_tensor_free(&after);
    gpo_tensor_free(&reloaded);
    gpo_close(again);
    gpo_close(m);
}

/* Contexts on several threads at once train the bits one trains alone. */
struct job {
    double loss;
    float first[10];
    gpo_status st;
};

static void *train_job(void *arg)
{
    struct job *j = arg;
    char paths[4][1024];
    struct gpo_train_config c;
    digits_config(&c, paths);
    c.val_data = c.val_labels = NULL;
    c.steps = getenv("GP_SANITIZED") && !strcmp(getenv("GP_SANITIZED"), "1") ? 3 : 6;
    c.devices = "cpu:0";
    char path[1024];
    gpo_model *m = NULL;
    struct gpo_train_result res;
    struct gpo_tensor y = {0};
    j->st = gpo_open(fixture_path("digits_cnn_op17.onnx", path, sizeof path), NULL, &m);
    if (j->st == GPO_OK) j->st = gpo_train(m, &c, NULL, &res);
    if (j->st == GPO_OK) j->st = gpo_predict_file(m, paths[2], NULL, &y);
    if (j->st == GPO_OK) {
        j->loss = res.last_loss;
        memcpy(j->first, y.data, sizeof j->first);
    } else {
        print_error("%s\n", gpo_last_error(m));
    }
    gpo_tensor_free(&y);
    gpo_close(m);
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    struct job alone = {0}, jobs[3] = {{0}};
    train_job(&alone);
    assert_int_equal(alone.st, GPO_OK);
    pthread_t t[3];
    for (int k = 0; k < 3; k++) assert_int_equal(pthread_create(&t[k], NULL, train_job, &jobs[k]), 0);
    for (int k = 0; k < 3; k++) pthread_join(t[k], NULL);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(jobs[k].st, GPO_OK);
        assert_memory_equal(&jobs[k].loss, &alone.loss, sizeof alone.loss);
        assert_memory_equal(jobs[k].first, alone.first, sizeof alone.first);
    }
}

int main(void)
{
    temp_dir(tmp, sizeof tmp);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_layers),
        cmocka_unit_test(test_balance),
        cmocka_unit_test(test_train_predict_save),
        cmocka_unit_test(test_threads),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    remove_tree(tmp);
    return failed;
}
