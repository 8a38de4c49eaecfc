/* First writers (gp_layer_call.din_overwrite), checked layer by layer on
 * any backend (first_writers.h). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/compute.h"
#include "first_writers.h"
#include "fixtures.h"
#include "layer_run.h"
#include "onnx/load.h"

/* Runs layer `layer` with every gradient in `mask` overwritten (NaN before)
 * and the others added into zeros; its input gradients go to io->din. */
static void run_masked(const struct gp_device_ops *ops, const struct gp_graph *g, int layer, enum gp_precision p,
                       uint32_t mask, const char *label, struct layer_io *io)
{
    const struct gp_node *n = &g->nodes[layer];
    for (int k = 0; k < n->n_inputs && k < LAYER_RUN_MAX_IO; k++) {
        if (!io->din0[k]) continue;
        int64_t e = gp_shape_numel(&g->values[n->inputs[k]].shape);
        float fill = (mask >> k) & 1 ? NAN : 0.0f;
        for (int64_t i = 0; i < e; i++) io->din0[k][i] = fill;
    }
    io->din_overwrite = mask;
    layer_run(ops, 0, p, g, layer, label, io);
}

/* The input gradients of two runs agree bit for bit (`exact`), or as
 * values (a zero's sign aside: a library's beta = 0 writes x where adding
 * into zeros gives 0 + x, +0 for a -0). */
static void same_bits(const struct gp_graph *g, int layer, const char *label, const struct layer_io *want,
                      const struct layer_io *got, bool exact)
{
    const struct gp_node *n = &g->nodes[layer];
    for (int k = 0; k < n->n_inputs && k < LAYER_RUN_MAX_IO; k++) {
        if (!want->din[k]) continue;
        int64_t e = gp_shape_numel(&g->values[n->inputs[k]].shape);
        for (int64_t i = 0; i < e; i++)
            if (exact ? memcmp(&want->din[k][i], &got->din[k][i], sizeof(float)) != 0
                      : !(want->din[k][i] == got->din[k][i]) && !(isnan(want->din[k][i]) && isnan(got->din[k][i])))
                fail_msg("%s: gradient of input %d, element %lld: %.9g written whole, %.9g added into zeros", label,
                         k, (long long)i, (double)got->din[k][i], (double)want->din[k][i]);
    }
}

int first_writers_check(const struct gp_device_ops *ops, const char *name, int64_t batch, bool exact)
{
    char path[4096], file[256];
    snprintf(file, sizeof file, "%s.onnx", name);
    fixture_path(file, path, sizeof path);
    struct gp_graph g;
    struct gp_error err = {0};
    if (gp_onnx_load(path, batch, &g, &err) != GP_OK) fail_msg("%s: %s", name, err.msg);
    const struct gp_compute_ops *cops = ops->compute;
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
            run_masked(ops, &g, layer, precisions[q], 0, label, &io);
            struct layer_io want = io;
            memset(io.out, 0, sizeof io.out);
            memset(io.din, 0, sizeof io.din);
            /* Each input alone (the others added into zeros), then all. */
            for (int k = 0; k <= n->n_inputs && k < 32; k++) {
                uint32_t mask = k < n->n_inputs ? all & (1u << k) : all;
                if (!mask || (k == n->n_inputs && !(all & (all - 1)))) continue;
                run_masked(ops, &g, layer, precisions[q], mask, label, &io);
                same_bits(&g, layer, label, &want, &io, exact);
                layer_run_free_results(&g, layer, &io);
                checked++;
            }
            layer_run_free_results(&g, layer, &want);
        }
        layer_run_free(&g, layer, &io);
    }
    printf("%-20s %-4s %3d calls written whole, %s of adding into zeros\n", name, ops->name, checked,
           exact ? "the bits" : "the values");
    gp_graph_free(&g);
    return checked;
}

