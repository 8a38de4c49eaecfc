/* The note on optimized dynamo exports (graph/exporter.h), on hand-made
 * graphs that mimic the exporter's two settings: optimize=True (BatchNorm
 * folded into a convolution's bias, equal LayerNorm weights merged into one
 * initializer) says what was lost; optimize=False (BatchNormalization and
 * separate weights kept), a weight tied on purpose, the TorchScript
 * exporter's names and older producers say nothing. Then on the real files:
 * the fixtures torch 2.11's dynamo exporter wrote with both settings, and
 * every fixture of the TorchScript exporters. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "fixtures.h"
#include "graph/build.h"
#include "graph/exporter.h"
#include "onnx/load.h"

#define S(...) ((const char *const[]){__VA_ARGS__})

static struct gp_shape shape(int rank, const int64_t *dims)
{
    struct gp_shape s = {.rank = rank};
    for (int i = 0; i < rank; i++) s.dims[i] = dims[i];
    return s;
}

/* A ramp of distinct values, or all ones (a fresh LayerNorm weight). */
static void weight_filled(struct gp_graph *g, const char *name, int rank, const int64_t *dims, bool ones)
{
    struct gp_error err = {0};
    struct gp_shape s = shape(rank, dims);
    float data[64] = {0};
    for (int i = 0; i < 64; i++) data[i] = ones ? 1.0f : 0.01f * (float)(i + 1);
    assert_int_equal(gp_graph_add_const_f32(g, name, &s, data, &err), GP_OK);
}

static void weight(struct gp_graph *g, const char *name, int rank, const int64_t *dims)
{
    weight_filled(g, name, rank, dims, false);
}

static void add_node(struct gp_graph *g, const char *op, const char *name, int ni, const char *const *in,
                     const char *out)
{
    struct gp_error err = {0};
    const char *outs[1] = {out};
    if (gp_graph_add_node(g, op, "", name, ni, in, 1, outs, &err) < 0) fail_msg("%s", err.msg);
}

/* Conv [1, 2, 4, 4] -> [1, 2, 4, 4] (1x1), then two LayerNorms over the last
 * axis. `folded`: the convolution has a bias and no BatchNormalization
 * follows (optimize=True), else BatchNormalization is there. `merged`:
 * both LayerNorms read one weight. `dynamo`: dynamo's names. */
static void build_ln(struct gp_graph *g, const char *producer, const char *version, bool folded,
                     bool merged, bool dynamo, bool ones)
{
    struct gp_error err = {0};
    assert_int_equal(gp_graph_init(g, 1, 18, 128, 64, &err), GP_OK);
    g->producer_name = producer;
    g->producer_version = version;
    struct gp_shape xs = shape(4, (const int64_t[]){1, 2, 4, 4});
    assert_int_equal(gp_graph_add_input(g, "x", GP_DTYPE_FLOAT32, &xs, &err), GP_OK);
    weight(g, "conv1.weight", 4, (const int64_t[]){2, 2, 1, 1});
    const char *conv = dynamo ? "node_Conv_0" : "/conv1/Conv";
    const char *c_out = dynamo ? "val_0" : "/conv1/Conv_output_0";
    const char *ln_in = c_out;
    if (folded) {
        weight(g, "bn1.bias", 1, (const int64_t[]){2}); /* the bias the folding made */
        add_node(g, "Conv", conv, 3, S("x", "conv1.weight", "bn1.bias"), c_out);
    } else {
        add_node(g, "Conv", conv, 2, S("x", "conv1.weight"), c_out);
        weight(g, "bn1.weight", 1, (const int64_t[]){2});
        weight(g, "bn1.bias", 1, (const int64_t[]){2});
        weight(g, "bn1.running_mean", 1, (const int64_t[]){2});
        weight(g, "bn1.running_var", 1, (const int64_t[]){2});
        add_node(g, "BatchNormalization", dynamo ? "node_BatchNormalization_1" : "/bn1/BatchNormalization", 5,
                 S(c_out, "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var"),
                 dynamo ? "val_1" : "/bn1/BatchNormalization_output_0");
        ln_in = dynamo ? "val_1" : "/bn1/BatchNormalization_output_0";
    }
    weight_filled(g, "norm1.weight", 1, (const int64_t[]){4}, ones);
    if (!merged) weight_filled(g, "norm2.weight", 1, (const int64_t[]){4}, ones);
    add_node(g, "LayerNormalization", dynamo ? "node_LayerNormalization_2" : "/norm1/LayerNormalization", 2,
             S(ln_in, "norm1.weight"), "y1");
    add_node(g, "LayerNormalization", dynamo ? "node_LayerNormalization_3" : "/norm2/LayerNormalization", 2,
             S(ln_in, merged ? "norm1.weight" : "norm2.weight"), "y2");
    add_node(g, "Add", dynamo ? "node_Add_4" : "/Add", 2, S("y1", "y2"), "y");
    assert_int_equal(gp_graph_add_output(g, "y", &err), GP_OK);
    if (gp_graph_finalize(g, &err) != GP_OK) fail_msg("%s", err.msg);
}

static void build(struct gp_graph *g, const char *producer, const char *version, bool folded, bool merged,
                  bool dynamo)
{
    build_ln(g, producer, version, folded, merged, dynamo, true);
}

static void test_optimized_export_noted(void **state)
{
    (void)state;
    struct gp_graph g;
    char note[2048];
    build(&g, "pytorch", "2.11.0+cu130", true, true, true);
    assert_true(gp_graph_exporter_note(&g, note, sizeof note));
    assert_non_null(strstr(note, "BatchNormalization was folded into the convolutions"));
    assert_non_null(strstr(note, "names such as 'bn1.bias'"));
    assert_non_null(strstr(note, "1 parameter is read by several nodes (such as 'norm1.weight' by "
                               "'node_LayerNormalization_2' and 'node_LayerNormalization_3', all its "
                               "elements equal)"));
    assert_non_null(strstr(note, "torch.onnx.export(..., dynamo=True, optimize=False)"));
    gp_graph_free(&g);

    /* Each sign alone is enough. */
    build(&g, "pytorch", "2.5.0", true, false, true);
    assert_true(gp_graph_exporter_note(&g, note, sizeof note));
    assert_non_null(strstr(note, "folded"));
    assert_null(strstr(note, "several nodes"));
    gp_graph_free(&g);
    build(&g, "pytorch", "2.9.1", false, true, true);
    assert_true(gp_graph_exporter_note(&g, note, sizeof note));
    assert_null(strstr(note, "folded"));
    assert_non_null(strstr(note, "several nodes"));
    gp_graph_free(&g);
}

static void test_other_exports_not_noted(void **state)
{
    (void)state;
    struct gp_graph g;
    char note[2048];
    /* dynamo=True, optimize=False: BatchNormalization and both weights kept. */
    build(&g, "pytorch", "2.11.0", false, false, true);
    assert_false(gp_graph_exporter_note(&g, note, sizeof note));
    gp_graph_free(&g);
    /* The TorchScript exporter's names, even with a bias and shared weights. */
    build(&g, "pytorch", "2.11.0", true, true, false);
    assert_false(gp_graph_exporter_note(&g, note, sizeof note));
    gp_graph_free(&g);
    /* A weight tied on purpose (random values) read by both: not a merge. */
    build_ln(&g, "pytorch", "2.11.0", false, true, true, false);
    assert_false(gp_graph_exporter_note(&g, note, sizeof note));
    gp_graph_free(&g);
    /* Before 2.5, or another producer. */
    build(&g, "pytorch", "2.4.1", true, true, true);
    assert_false(gp_graph_exporter_note(&g, note, sizeof note));
    gp_graph_free(&g);
    build(&g, "onnx.helper", "1.17", true, true, true);
    assert_false(gp_graph_exporter_note(&g, note, sizeof note));
    gp_graph_free(&g);
}

/* The note for models/<name>.onnx, loaded as `train` loads it; false
 * when there is none. */
static bool file_note(const char *name, char *note, size_t size)
{
    char file[256], path[4096];
    struct gp_error err = {0};
    struct gp_graph g;
    snprintf(file, sizeof file, "%s.onnx", name);
    if (gp_onnx_load(fixture_path(file, path, sizeof path), 1, &g, &err) != GP_OK) fail_msg("%s", err.msg);
    note[0] = '\0';
    bool noted = gp_graph_exporter_note(&g, note, size);
    gp_graph_free(&g);
    return noted;
}

/* torch 2.11 with optimize=True: ResNet's BatchNorms leave no parameter
 * behind (its convolutions have no bias), the digits CNN's convolutions
 * keep their own biases; in both the convolutions, renamed 'node_Conv_<n>',
 * write the values their BatchNorm wrote ('getitem', 'getitem_5', ...).
 * GPT has no BatchNorm: its LayerNorms read merged weights. */
static void test_dynamo_optimized_files(void **state)
{
    (void)state;
    char note[4096];
    assert_true(file_note("resnet_dynamo_opt", note, sizeof note));
    assert_non_null(strstr(note, "producer pytorch 2.11.0+cu130"));
    assert_non_null(strstr(note, "BatchNormalization was folded into the convolutions: none is left, and 8 of 8 "
                                 "convolutions write what dynamo names a BatchNorm's output (such as "
                                 "'node_Conv_110' writing 'getitem')"));
    assert_null(strstr(note, "several nodes"));
    assert_non_null(strstr(note, "dynamo=True, optimize=False"));

    assert_true(file_note("digits_cnn_dynamo_opt", note, sizeof note));
    assert_non_null(strstr(note, "2 of 2 convolutions write what dynamo names a BatchNorm's output (such as "
                                 "'node_Conv_18' writing 'getitem')"));
    assert_null(strstr(note, "several nodes"));

    assert_true(file_note("gpt_dynamo_opt", note, sizeof note));
    assert_null(strstr(note, "folded"));
    assert_non_null(strstr(note, "4 parameters are read by several nodes (such as 'h.0.ln_1.weight' by "
                                 "'node_layer_norm' and 'node_layer_norm_1', all its elements equal)"));
}

/* optimize=False keeps BatchNormalization (its outputs are the 'getitem's)
 * and separate LayerNorm weights; the TorchScript exporters' fixtures
 * (torch 1.13 at opsets 13 and 17, torch 2's at 17) are no dynamo exports. */
static void test_other_files_not_noted(void **state)
{
    (void)state;
    static const char *const names[] = {
        "resnet_dynamo", "digits_cnn_dynamo", "gpt_dynamo", "mlp_op13",     "mlp_op17",
        "digits_cnn_op13", "digits_cnn_op17", "resnet_op13", "resnet_op17", "unet_op13",
        "unet_op17",     "gpt_op13",          "gpt_op17",   "mlp_torch2_op17", "gpt_torch2_op17",
    };
    char note[4096];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (file_note(names[i], note, sizeof note)) fail_msg("%s: unexpected note: %s", names[i], note);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_optimized_export_noted),
        cmocka_unit_test(test_other_exports_not_noted),
        cmocka_unit_test(test_dynamo_optimized_files),
        cmocka_unit_test(test_other_files_not_noted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
