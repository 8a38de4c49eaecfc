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

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/build.h"

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
    /* The BatchNorms with a residual Add fused (graph/fuse.c) compared as
     * the unfused nodes, whose bits they give (test_pipeline.c,
     * test_fused_residual): alone on this test's random inputs, a fused
     * Relu's kink sits under the sums of the scale's and bias's gradients,
     * where each mask flip that bf16's rounding makes moves a whole
     * channel's sum; between its own nodes the Add's flips stay elementwise. */
    setenv("GP_FUSE_BN_ADD", "0", 1);
    for (size_t f = 0; f < sizeof list / sizeof *list; f++) check_fixture(list[f].name, list[f].batch);
    unsetenv("GP_FUSE_BN_ADD");
}

/* Round to bfloat16, nearest even (finite values). */
static float bf16_round(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* A Linear's bias fused into its MatMul (graph/fuse.c), in bf16: b is
 * read through its bfloat16 copy, as autocast rounds a Linear's bias, and
 * added to the float32 product before the one rounding of Y, as cuBLASLt's
 * bias epilogue does: y = bf16(x W + bf16(b)), not bf16(x W + b). The
 * products here are exact, and b = 2^-8 + 2^-20 tells the two apart: after
 * a product of 1, bf16(1 + 2^-8) is a tie to 1, while 1 + 2^-8 + 2^-20
 * rounds up to 1 + 2^-7. b's gradient stays float32: the column sums of
 * the (bfloat16) dY added to what it held. */
static void test_fused_bias_rounded(void **state)
{
    (void)state;
    struct gp_graph g;
    struct gp_error err = {0};
    assert_int_equal(gp_graph_init(&g, 2, 17, 64, 32, &err), GP_OK);
    struct gp_shape xs = {.rank = 2, .dims = {2, 4}}, ws = {.rank = 2, .dims = {4, 3}}, bs = {.rank = 1, .dims = {3}};
    assert_int_equal(gp_graph_add_input(&g, "x", GP_DTYPE_FLOAT32, &xs, &err), GP_OK);
    const float w[12] = {1, 1, 0, 0, 1, 1, 0.5f, 0, 0.25f, 0, 2, 0};
    const float b[3] = {0x1p-8f + 0x1p-20f, 0x1p-8f + 0x1p-20f, 0.1f};
    assert_int_equal(gp_graph_add_const_f32(&g, "w", &ws, w, &err), GP_OK);
    assert_int_equal(gp_graph_add_const_f32(&g, "b", &bs, b, &err), GP_OK);
    if (gp_graph_add_node(&g, "MatMul", "", "mm", 2, (const char *const[]){"x", "w"}, 1, (const char *const[]){"p"},
                          &err) < 0 ||
        gp_graph_add_node(&g, "Add", "", "add", 2, (const char *const[]){"p", "b"}, 1, (const char *const[]){"y"},
                          &err) < 0)
        fail_msg("%s", err.msg);
    assert_int_equal(gp_graph_add_output(&g, "y", &err), GP_OK);
    if (gp_graph_finalize(&g, &err) != GP_OK) fail_msg("%s", err.msg);
    assert_int_equal(g.n_nodes, 1);
    assert_true(g.nodes[0].fused_bias);
    struct layer_io io;
    layer_run_inputs(&g, 0, 0, &io);
    const float x[8] = {1, 0, 0, 0, 0, 1, 0, 0};
    memcpy(io.in[0], x, sizeof x);
    layer_run(&gp_cpu_device_ops, 0, GP_PRECISION_BF16, &g, 0, "MatMul+bias (bf16)", &io);
    const float *y = io.out[0];
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 3; j++) {
            float p = 0;
            for (int k = 0; k < 4; k++) p += x[r * 4 + k] * w[k * 3 + j];
            float want = bf16_round(p + bf16_round(b[j]));
            if (y[r * 3 + j] != want)
                fail_msg("y[%d][%d] = %.9g, not bf16(%g + bf16(b)) = %.9g", r, j, (double)y[r * 3 + j], (double)p,
                         (double)want);
        }
    /* The case tells the roundings apart: y[0][0] = bf16(1 + 2^-8) = 1. */
    assert_true(y[0] == 1.0f && bf16_round(1.0f + b[0]) != 1.0f);
    assert_non_null(io.din[2]);
    for (int j = 0; j < 3; j++) {
        double sum = 0;
        for (int r = 0; r < 2; r++) sum += (double)bf16_round(io.dout[0][r * 3 + j]);
        float want = io.din0[2][j] + (float)sum;
        if (!(fabsf(io.din[2][j] - want) <= 1e-6f * (fabsf(want) + 1)))
            fail_msg("db[%d] = %.9g, not %.9g", j, (double)io.din[2][j], (double)want);
    }
    printf("MatMul+bias (bf16): y = bf16(x W + bf16(b)), b's gradient float32\n");
    layer_run_free(&g, 0, &io);
    gp_graph_free(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fixtures), cmocka_unit_test(test_fused_bias_rounded)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
