/* The loader on every fixture, against what the export script recorded
 * (models/manifest.json, written from onnxruntime's run of each file). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "graph/layers.h"
#include "onnx/load.h"
#include "util/json_parse.h"

static struct gp_json_doc manifest;

static int setup(void **state)
{
    (void)state;
    char path[4096];
    struct gp_error err = {0};
    if (gp_json_parse_file(fixture_path("manifest.json", path, sizeof path), &manifest, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    gp_json_doc_free(&manifest);
    return 0;
}

static void load_fixture(const char *file, int64_t batch, struct gp_graph *g)
{
    char path[4096];
    struct gp_error err = {0};
    gp_status st = gp_onnx_load(fixture_path(file, path, sizeof path), batch, g, &err);
    if (st != GP_OK) fail_msg("%s: %s", file, err.msg);
}

static void assert_shape(const char *what, const struct gp_shape *s, const struct gp_jvalue *dims)
{
    assert_non_null(dims);
    if ((size_t)s->rank != dims->count) fail_msg("%s: rank %d, recorded %zu", what, s->rank, dims->count);
    for (int i = 0; i < s->rank; i++)
        if (s->dims[i] != gp_jarray_at(dims, (size_t)i)->i)
            fail_msg("%s: axis %d is %lld, recorded %lld", what, i, (long long)s->dims[i],
                     (long long)gp_jarray_at(dims, (size_t)i)->i);
}

/* Checks a named map {value: [dims]} against the graph's values. */
static void check_shapes(const struct gp_graph *g, const char *file, const struct gp_jvalue *map)
{
    assert_non_null(map);
    for (size_t i = 0; i < map->count; i++) {
        int id = gp_graph_find_value(g, map->keys[i]);
        char what[512];
        snprintf(what, sizeof what, "%s: value '%s'", file, map->keys[i]);
        if (id < 0) fail_msg("%s is missing from the graph", what);
        assert_true(g->values[id].has_shape);
        assert_shape(what, &g->values[id].shape, &map->items[i]);
    }
}

static void test_every_fixture_matches_manifest(void **state)
{
    (void)state;
    const struct gp_jvalue *fixtures = gp_jobject_get(manifest.root, "fixtures");
    assert_non_null(fixtures);
    assert_true(fixtures->count >= 12);
    for (size_t f = 0; f < fixtures->count; f++) {
        const char *file = fixtures->keys[f];
        const struct gp_jvalue *rec = &fixtures->items[f];
        struct gp_graph g;
        load_fixture(file, 3, &g);

        assert_int_equal(g.opset, gp_jobject_get(rec, "opset")->i);
        assert_int_equal(g.ir_version, gp_jobject_get(rec, "ir_version")->i);
        assert_string_equal(g.producer_version, gp_jobject_get(rec, "producer_version")->str);
        assert_int_equal(g.n_source_nodes, gp_jobject_get(rec, "node_count")->i);
        assert_int_equal(g.n_nodes + g.n_folded + g.n_fused, g.n_source_nodes);

        const struct gp_jvalue *b3 = gp_jobject_get(rec, "batch3");
        check_shapes(&g, file, gp_jobject_get(b3, "input_shapes"));
        check_shapes(&g, file, gp_jobject_get(b3, "output_shapes"));
        /* Every intermediate value, folded or not, has the shape onnxruntime saw. */
        const struct gp_jvalue *values = gp_jobject_get(b3, "value_shapes");
        assert_true(values->count >= (size_t)g.n_nodes);
        check_shapes(&g, file, values);

        /* All float initializers together are the recorded parameter count;
         * the trainable ones are a non-empty part of it. */
        int64_t float_init = 0, params = 0;
        for (int i = 0; i < g.n_values; i++) {
            const struct gp_value *v = &g.values[i];
            if (v->is_initializer && gp_dtype_is_float(v->dtype)) float_init += gp_shape_numel(&v->shape);
            if (v->kind == GP_VALUE_PARAMETER) {
                params += gp_shape_numel(&v->shape);
                assert_true(v->is_initializer);
                assert_true(gp_dtype_is_float(v->dtype));
            }
        }
        int64_t recorded = gp_jobject_get(rec, "param_count")->i;
        assert_int_equal(float_init, recorded);
        assert_true(params > 0 && params <= recorded);
        assert_int_equal(params, gp_graph_param_count(&g));
        gp_graph_free(&g);

        /* The batch axis binds to any size. */
        load_fixture(file, 5, &g);
        check_shapes(&g, file, gp_jobject_get(gp_jobject_get(rec, "batch5"), "output_shapes"));
        gp_graph_free(&g);
    }
}

static int kind_of(const struct gp_graph *g, const char *name)
{
    int id = gp_graph_find_value(g, name);
    if (id < 0) fail_msg("no value '%s'", name);
    return (int)g->values[id].kind;
}

static void test_value_kinds(void **state)
{
    (void)state;
    struct gp_graph g;
    load_fixture("digits_cnn_op17.onnx", 4, &g);
    assert_int_equal(kind_of(&g, "conv1.weight"), GP_VALUE_PARAMETER);
    assert_int_equal(kind_of(&g, "bn1.weight"), GP_VALUE_PARAMETER);
    assert_int_equal(kind_of(&g, "bn1.running_mean"), GP_VALUE_BUFFER);
    assert_int_equal(kind_of(&g, "bn1.running_var"), GP_VALUE_BUFFER);
    assert_int_equal(kind_of(&g, "input"), GP_VALUE_INPUT);
    gp_graph_free(&g);

    /* The opset 13 export has BatchNormalization-9 with five outputs. */
    load_fixture("digits_cnn_op13.onnx", 4, &g);
    assert_int_equal(kind_of(&g, "bn2.running_var"), GP_VALUE_BUFFER);
    assert_int_equal(kind_of(&g, "fc1.weight"), GP_VALUE_PARAMETER);
    gp_graph_free(&g);
}

/* The exporter's shape plumbing (Shape, Gather, Unsqueeze, Concat, Range,
 * Cast, arithmetic on sizes) must fold away, leaving the ops that compute. */
static void test_gpt_folds_shape_plumbing(void **state)
{
    (void)state;
    const char *files[] = {"gpt_op13.onnx", "gpt_op17.onnx", "gpt_torch2_op17.onnx"};
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        struct gp_graph g;
        load_fixture(files[f], 2, &g);
        for (int i = 0; i < g.n_nodes; i++) {
            const char *op = g.nodes[i].op_type;
            if (strcmp(op, "Shape") == 0 || strcmp(op, "Constant") == 0 ||
                strcmp(op, "Unsqueeze") == 0 || strcmp(op, "Concat") == 0 ||
                strcmp(op, "Range") == 0 || strcmp(op, "Cast") == 0)
                fail_msg("%s: node '%s' (%s) was not folded", files[f], g.nodes[i].name, op);
            /* Every Reshape target became a constant. */
            if (strcmp(op, "Reshape") == 0) {
                const struct gp_value *target = gp_node_input(&g, &g.nodes[i], 1);
                assert_non_null(target->constant);
                assert_int_equal(gp_tensor_get_i64(target->constant, 0), 2);
            }
        }
        assert_true(g.n_folded > g.n_nodes);
        gp_graph_free(&g);
    }
}

static bool in_frontier(const struct gp_layers *l, int value, int cut)
{
    return l->born[value] <= cut && cut < l->dies[value];
}

/* A residual block's input is read again by its Add (fused into the
 * block's last BatchNorm): it must cross every cut inside the block, and
 * each frontier's bytes must count it. */
static void test_resnet_residual_in_frontiers(void **state)
{
    (void)state;
    struct gp_graph g;
    load_fixture("resnet_op17.onnx", 2, &g);
    struct gp_layers l;
    struct gp_error err = {0};
    assert_int_equal(gp_layers_build(&g, &l, &err), GP_OK);
    int adds = 0, *ids = malloc(sizeof(int) * (size_t)g.n_values);
    for (int i = 0; i < g.n_nodes; i++) {
        /* The residual Adds, fused into the BatchNorm before them
         * (gp_node.fused_add): the skip operand is the fused input 5. */
        if (!g.nodes[i].fused_add) continue;
        adds++;
        int skip = g.nodes[i].inputs[5];
        int from = g.values[skip].producer + 1;
        assert_true(i - from >= 2); /* a block has layers inside it */
        for (int cut = from; cut <= i; cut++) {
            assert_true(in_frontier(&l, skip, cut));
            int n = gp_layers_frontier(&l, &g, cut, ids);
            bool found = false;
            int64_t bytes = 0;
            for (int k = 0; k < n; k++) {
                found |= ids[k] == skip;
                bytes += gp_value_bytes(&g.values[ids[k]]);
            }
            assert_true(found);
            assert_int_equal(bytes, l.frontier_bytes[cut]);
            assert_true(n >= 2 || cut == from); /* skip plus the block's running value */
        }
        /* Once the Add has read it, the skip is gone. */
        assert_false(in_frontier(&l, skip, i + 1) && !g.values[skip].is_output);
    }
    assert_int_equal(adds, 3);
    /* The cut after the last layer carries exactly the graph output. */
    assert_int_equal(l.frontier_bytes[g.n_nodes], 2 * 10 * 4);
    /* The cut before the first layer carries exactly the input. */
    assert_int_equal(l.frontier_bytes[0], 2 * 3 * 16 * 16 * 4);
    free(ids);
    gp_layers_free(&l);
    gp_graph_free(&g);
}

/* U-Net long skips: an encoder output read by a decoder Concat stays in the
 * frontier across the whole bottleneck. */
static void test_unet_long_skip(void **state)
{
    (void)state;
    struct gp_graph g;
    load_fixture("unet_op13.onnx", 1, &g);
    struct gp_layers l;
    struct gp_error err = {0};
    assert_int_equal(gp_layers_build(&g, &l, &err), GP_OK);
    int longest = 0;
    for (int i = 0; i < g.n_nodes; i++) {
        if (strcmp(g.nodes[i].op_type, "Concat") != 0) continue;
        for (int k = 0; k < g.nodes[i].n_inputs; k++) {
            int v = g.nodes[i].inputs[k];
            int span = i - g.values[v].producer;
            if (span > longest) longest = span;
            for (int cut = g.values[v].producer + 1; cut <= i; cut++) assert_true(in_frontier(&l, v, cut));
        }
    }
    assert_true(longest >= 10);
    gp_layers_free(&l);
    gp_graph_free(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_fixture_matches_manifest),
        cmocka_unit_test(test_value_kinds),
        cmocka_unit_test(test_gpt_folds_shape_plumbing),
        cmocka_unit_test(test_resnet_residual_in_frontiers),
        cmocka_unit_test(test_unet_long_skip),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
