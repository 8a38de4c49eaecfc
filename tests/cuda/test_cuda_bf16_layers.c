/* Every layer of every fixture model, at its training shapes, in bf16 on the
 * GPU against the CPU's bf16 (tests/test_bf16_layers.c compares that with
 * fp32): outputs and every input gradient, through the same staging as the
 * executor (float32 kernels on bfloat16 data; GEMMs and convolutions read
 * bfloat16 themselves).
 *
 * Both sides round the same float32 results to bfloat16, so they differ by
 * the order of long sums (cuBLAS, cuDNN, block reductions) and then by one
 * bfloat16 step (2^-8 relative) where that order moved a result across a
 * rounding boundary: an element agrees within 1% of (|cpu| + rms of the
 * tensor), and at most 0.2% of a tensor's elements (plus one) may not (a
 * max or kink moved by a rounding step).
 *
 * Without a CUDA device the test prints why and exits 77 (a skip). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/device.h"
#include "fixtures.h"
#include "layer_run.h"
#include "onnx/load.h"

#define REL 0.01
#define FLIPS 0.002

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
    double worst = layer_run_compare_graph(&g, label, 16, NULL, NULL, &gp_cuda_device_ops, GP_PRECISION_BF16,
                                           &gp_cpu_device_ops, GP_PRECISION_BF16, REL, FLIPS, &worst_layer);
    printf("%-20s batch %-3lld %3d layers: cuda bf16 within %.2g of cpu bf16 (worst: layer %d, %s)\n", name,
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
        {"mlp_op17", 16},   {"digits_cnn_op17", 16}, {"resnet_op17", 8},     {"resnet_op17", 4},
        {"unet_op17", 4},   {"gpt_op17", 8},         {"gpt_torch2_op17", 8}, {"mlp_torch2_op17", 16},
        {"resnet_op13", 8}, {"unet_op13", 4},        {"gpt_op13", 8},        {"digits_cnn_op13", 16},
    };
    for (size_t f = 0; f < sizeof list / sizeof *list; f++) check_fixture(list[f].name, list[f].batch);
}

int main(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("skipped: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fixtures)};
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    printf("cuda_bf16_layers: %s\n", failed ? "FAILED" : "PASSED");
    return failed ? 1 : 0;
}
