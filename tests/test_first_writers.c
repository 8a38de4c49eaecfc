/* First writers (gp_layer_call.din_overwrite): a kernel that says it can
 * write an input's gradient whole (gp_compute_ops.overwrites) must give,
 * with NaN in that gradient beforehand, the very bits of the ordinary call,
 * which adds into zeros: 0 + x is what it writes. Every such layer of every
 * fixture model, each such input alone and all at once, in fp32 and bf16,
 * on the CPU backend (the CUDA suite does the same for the GPU's kernels
 * once they write first). A kernel that leaves an element unwritten leaves
 * its NaN; one that adds to what is there turns every element to NaN. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/compute.h"
#include "fixtures.h"
#include "layer_run.h"
#include "onnx/load.h"

/* Runs layer `layer` with every gradient in `mask` overwritten (NaN before)
 * and the others added into zeros; its input gradients go to io->din. */
static void run_masked(const struct gp_graph *g, int layer, enum gp_precision p, uint32_t mask, const char *label,
                       struct layer_io *io)
{
    const struct gp_node *n = &g->nodes[layer];
    for (int k = 0; k < n->n_inputs && k < LAYER_RUN_MAX_IO; k++) {
        if (!io->din0[k]) continue;
        int64_t e = gp_shape_numel(&g->values[n->inputs[k]].shape);
        float fill = (mask >> k) & 1 ? NAN : 0.0f;
        for (int64_t i = 0; i < e; i++) io->din0[k][i] = fill;
    }
    io->din_overwrite = mask;
    layer_run(&gp_cpu_device_ops, 0, p, g, layer, label, io);
}

/* The input gradients of two runs agree bit for bit. */
static void same_bits(const struct gp_graph *g, int layer, const char *label, const struct layer_io *want,
                      const struct layer_io *got)
{
    const struct gp_node *n = &g->nodes[layer];
    for (int k = 0; k < n->n_inputs && k < LAYER_RUN_MAX_IO; k++) {
        if (!want->din[k]) continue;
        int64_t e = gp_shape_numel(&g->values[n->inputs[k]].shape);
        for (int64_t i = 0; i < e; i++)
            if (memcmp(&want->din[k][i], &got->din[k][i], sizeof(float)) != 0)
                fail_msg("%s: gradient of input %d, element %lld: %.9g written whole, %.9g added into zeros", label,
                         k, (long long)i, (double)got->din[k][i], (double)want->din[k][i]);
    }
}

static int check_fixture(const char *name, int64_t batch)
{
    char path[4096], file[256];
    snprintf(file, sizeof file, "%s.onnx", name);
    fixture_path(file, path, sizeof path);
    struct gp_graph g;
    struct gp_error err = {0};
    if (gp_onnx_load(path, batch, &g, &err) != GP_OK) fail_msg("%s: %s", name, err.msg);
    const struct gp_compute_ops *cops = gp_cpu_device_ops.compute;
    int checked = 0;
    for (int layer = 0; layer < g.n_nodes; layer++) {
        const struct gp_node *n = &g.nodes[layer];
        uint32_t all = 0;
        for (int k = 0; k < n->n_inputs && k < 32 && k < LAYER_RUN_MAX_IO; k++)
            if (n->inputs[k] >= 0 && cops->overwrites && cops->overwrites(&g, n, k)) all |= 1u << k;
        if (!all) continue;
        struct layer_io io;
        layer_run_inputs(&g, layer, 16, &io);
        if (!io.backward) {
            layer_run_free(&g, layer, &io);
            continue;
        }
        static const enum gp_precision precisions[] = {GP_PRECISION_FP32, GP_PRECISION_BF16};
        for (int q = 0; q < 2; q++) {
            char label[512];
            snprintf(label, sizeof label, "%s layer %d (%s, %s)", name, layer, n->op_type,
                     gp_precision_name(precisions[q]));
            run_masked(&g, layer, precisions[q], 0, label, &io);
            struct layer_io want = io;
            memset(io.out, 0, sizeof io.out);
            memset(io.din, 0, sizeof io.din);
            /* Each input alone (the others added into zeros), then all. */
            for (int k = 0; k <= n->n_inputs && k < 32; k++) {
                uint32_t mask = k < n->n_inputs ? all & (1u << k) : all;
                if (!mask || (k == n->n_inputs && !(all & (all - 1)))) continue;
                run_masked(&g, layer, precisions[q], mask, label, &io);
                same_bits(&g, layer, label, &want, &io);
                layer_run_free_results(&g, layer, &io);
                checked++;
            }
            layer_run_free_results(&g, layer, &want);
        }
        layer_run_free(&g, layer, &io);
    }
    printf("%-20s %3d calls written whole, the bits of adding into zeros\n", name, checked);
    gp_graph_free(&g);
    return checked;
}

static void test_fixtures(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        int64_t batch;
    } list[] = {
        {"mlp_op17", 16}, {"digits_cnn_op17", 16}, {"resnet_op17", 8}, {"unet_op17", 4},
        {"gpt_op17", 8},  {"gpt_torch2_op17", 8},
    };
    int total = 0;
    for (size_t f = 0; f < sizeof list / sizeof *list; f++) total += check_fixture(list[f].name, list[f].batch);
    /* ReLU, BatchNorm, Add and GELU's Mul are all among them. */
    if (total < 20) fail_msg("only %d layer calls wrote a gradient whole", total);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fixtures)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
