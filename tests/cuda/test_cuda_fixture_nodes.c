/* Every node of every fixture model, at the shapes it has in training (the
 * micro-batch bound), through the CPU and the CUDA kernels from the same
 * inputs: forward outputs and every input gradient compared. The op tests
 * cover each op's attributes on chosen shapes; this covers the shapes and
 * attribute combinations that real exports have, and names the layer when
 * a model trains differently on the GPU.
 *
 * Inputs are random (activations), the model's own (initializers), or
 * random token indices below 16 (integer data inputs). Tolerance: relative
 * 1e-4 plus 1e-5 of the tensor's largest magnitude: long sums
 * (convolutions, matrix products) are added in another order by cuDNN and
 * cuBLAS than by the CPU, and their small elements carry the rounding of
 * the large terms that cancelled in them.
 *
 * Without a CUDA device the test prints why and exits 77 (a skip). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "fixtures.h"
#include "onnx/load.h"
#include "op_compare.h"

static void check_fixture(const char *name, int64_t batch)
{
    char path[4096], file[256];
    snprintf(file, sizeof file, "%s.onnx", name);
    fixture_path(file, path, sizeof path);
    struct gp_graph g;
    struct gp_error err = {0};
    if (gp_onnx_load(path, batch, &g, &err) != GP_OK) fail_msg("%s: %s", name, err.msg);
    for (int i = 0; i < g.n_nodes; i++) {
        char label[256];
        snprintf(label, sizeof label, "%s (batch %lld), layer %d '%s' (%s)", name, (long long)batch, i,
                 g.nodes[i].name, g.nodes[i].op_type);
        op_compare_node(&g, i, &(struct op_compare){.label = label, .rel_tol = 1e-4, .abs_tol = 1e-5,
                                                    .scale_abs_tol = true, .index_bound = 16});
    }
    printf("%-20s batch %-3lld %3d layers match\n", name, (long long)batch, g.n_nodes);
    gp_graph_free(&g);
}

static void test_fixtures(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        int64_t batch;
    } list[] = {
        {"mlp_op17", 16},   {"digits_cnn_op17", 16}, {"resnet_op17", 8},     {"resnet_op17", 4},
        {"unet_op17", 4},   {"gpt_op17", 8},         {"gpt_torch2_op17", 8}, {"mlp_torch2_op17", 16},
        {"resnet_op13", 8}, {"unet_op13", 4},        {"gpt_op13", 8},        {"digits_cnn_op13", 16},
    };
    for (size_t f = 0; f < sizeof list / sizeof *list; f++) check_fixture(list[f].name, list[f].batch);
}

int main(void)
{
    op_compare_require_device();
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fixtures)};
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    printf("cuda_fixture_nodes: %s, %d ops (%d layers against the CPU kernels)\n", failed ? "FAILED" : "PASSED",
           op_compare_op_types(), op_compare_cases());
    return failed ? 1 : 0;
}
