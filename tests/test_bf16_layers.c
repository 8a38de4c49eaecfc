/* Every layer of every fixture model, at the shapes it trains with, in bf16
 * on the CPU against its own fp32 result: outputs and every input gradient.
 *
 * bf16 rounds each stored tensor (inputs, weights read by matrix products,
 * outputs, gradients) to 8 significant bits (relative 2^-9), and a sum of K
 * such products carries about 2^-8 of the sum's scale. So an element agrees
 * when it is within 3% of (|fp32| + rms of the tensor), and at most 0.5% of
 * a tensor's elements (plus one: a random divisor near 0) may break that (a rounded input can move a max or a
 * kink: MaxPool's argmax, ReLU at 0, a Where). The worst distance of each
 * model is printed. The CUDA suite compares the GPU's bf16 with this. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "fixtures.h"
#include "layer_run.h"
#include "onnx/load.h"

#define REL 0.03
#define FLIPS 0.005

static void check_fixture(const char *name, int64_t batch)
{
    char path[4096], file[256];
    snprintf(file, sizeof file, "%s.onnx", name);
    fixture_path(file, path, sizeof path);
    struct gp_graph g;
    struct gp_error err = {0};
    if (gp_onnx_load(path, batch, &g, &err) != GP_OK) fail_msg("%s: %s", name, err.msg);
    char label[256];
    snprintf(label, sizeof label, "%s (batch %lld)", name, (long long)batch);
    int worst_layer;
    double worst = layer_run_compare_graph(&g, label, 16, NULL, NULL, &gp_cpu_device_ops, GP_PRECISION_BF16,
                                           &gp_cpu_device_ops, GP_PRECISION_FP32, REL, FLIPS, &worst_layer);
    printf("%-20s batch %-3lld %3d layers: bf16 within %.2g of fp32 (worst: layer %d, %s)\n", name,
           (long long)batch, g.n_nodes, worst, worst_layer, worst_layer >= 0 ? g.nodes[worst_layer].op_type : "-");
    gp_graph_free(&g);
}

static void test_fixtures(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        int64_t batch;
    } list[] = {
        {"mlp_op17", 16}, {"digits_cnn_op17", 16}, {"resnet_op17", 8},     {"unet_op17", 4},
        {"gpt_op17", 8},  {"gpt_torch2_op17", 8},  {"mlp_torch2_op17", 16}, {"gpt_op13", 8},
    };
    for (size_t f = 0; f < sizeof list / sizeof *list; f++) check_fixture(list[f].name, list[f].batch);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fixtures)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
