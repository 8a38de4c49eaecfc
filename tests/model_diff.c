/* How far apart two trained copies of one model are: for test_mpi.sh, which
 * compares a model trained by data-parallel replicas with the one process
 * that computes the same micro-batches (equal up to the rounding of the
 * gradients' sums, README "Several processes").
 *
 *   model_diff [--params] [--abs ABS] A.onnx B.onnx REL
 *
 * For every float parameter and buffer (by name, both files must have the
 * same ones; --params: parameters only): the largest |a - b| over its
 * elements, relative to its largest |a| (a tensor's scale, so that
 * elements near zero do not blow the figure up). A tensor passes when that
 * is at most REL, or its largest |a - b| at most ABS (0 unless given).
 * Prints the worst tensor and the count of elements that differ at all;
 * exit 0 when every tensor passes, 1 when one does not, 2 on bad input. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/graph.h"
#include "onnx/load.h"

static const struct gp_value *find(const struct gp_graph *g, const char *name)
{
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].is_initializer && !strcmp(g->values[v].name, name)) return &g->values[v];
    return NULL;
}

static bool params_only;

static bool compared(const struct gp_value *v)
{
    return v->is_initializer && (v->kind == GP_VALUE_PARAMETER || (v->kind == GP_VALUE_BUFFER && !params_only)) &&
           v->constant && v->constant->dtype == GP_DTYPE_FLOAT32;
}

int main(int argc, char **argv)
{
    double abs_tol = 0;
    int at = 1;
    for (; at < argc && !strncmp(argv[at], "--", 2); at++) {
        if (!strcmp(argv[at], "--params")) params_only = true;
        else if (!strcmp(argv[at], "--abs") && at + 1 < argc) abs_tol = atof(argv[++at]);
        else break;
    }
    if (argc - at != 3) {
        fprintf(stderr, "usage: model_diff [--params] [--abs ABS] A.onnx B.onnx REL\n");
        return 2;
    }
    argv += at - 1;
    double tolerance = atof(argv[3]);
    struct gp_graph a, b;
    struct gp_error err = {0};
    if (gp_onnx_load(argv[1], 1, &a, &err) != GP_OK) {
        fprintf(stderr, "model_diff: %s\n", err.msg);
        return 2;
    }
    if (gp_onnx_load(argv[2], 1, &b, &err) != GP_OK) {
        fprintf(stderr, "model_diff: %s\n", err.msg);
        gp_graph_free(&a);
        return 2;
    }
    int status = 0, tensors = 0, failed = 0;
    long long elements = 0, differ = 0;
    double worst = 0, worst_abs = 0;
    const char *worst_name = "(none)";
    for (int v = 0; v < a.n_values && status != 2; v++) {
        const struct gp_value *va = &a.values[v];
        if (!compared(va)) continue;
        const struct gp_value *vb = find(&b, va->name);
        if (!vb || !compared(vb) || vb->constant->nbytes != va->constant->nbytes) {
            fprintf(stderr, "model_diff: '%s' is not in %s alike\n", va->name, argv[2]);
            status = 2;
            break;
        }
        const float *x = va->constant->data, *y = vb->constant->data;
        size_t n = va->constant->nbytes / sizeof(float);
        double scale = 0, diff = 0;
        for (size_t i = 0; i < n; i++) {
            if (fabs(x[i]) > scale) scale = fabs(x[i]);
            double d = fabs((double)x[i] - (double)y[i]);
            /* NaN against a number is as far apart as it gets. */
            if (isnan(x[i]) != isnan(y[i])) d = INFINITY;
            if (d > diff) diff = d;
            differ += memcmp(&x[i], &y[i], sizeof(float)) != 0;
        }
        double rel = diff == 0 ? 0 : scale > 0 ? diff / scale : INFINITY;
        if (!(rel <= tolerance || diff <= abs_tol)) {
            printf("model_diff: '%s': max |a - b| %.3g, %.3g of its largest |a|: above the bounds\n", va->name, diff,
                   rel);
            failed++;
        }
        if (rel > worst || (rel == worst && tensors == 0)) {
            worst = rel;
            worst_abs = diff;
            worst_name = va->name;
        }
        tensors++;
        elements += (long long)n;
    }
    if (status != 2) {
        printf("model_diff: %d tensors, %lld of %lld elements differ; worst '%s': max |a - b| %.3g, %.3g of its "
               "largest |a|\n",
               tensors, differ, elements, worst_name, worst_abs, worst);
        if (tensors == 0) {
            fprintf(stderr, "model_diff: no float parameters to compare\n");
            status = 2;
        } else if (failed) {
            status = 1;
        }
    }
    gp_graph_free(&a);
    gp_graph_free(&b);
    return status;
}
