#include "graph/layers.h"

#include <stdlib.h>
#include <string.h>

static bool is_runtime(const struct gp_value *v)
{
    return v->kind == GP_VALUE_INPUT || v->kind == GP_VALUE_ACTIVATION;
}

gp_status gp_layers_build(const struct gp_graph *g, struct gp_layers *out, struct gp_error *err)
{
    memset(out, 0, sizeof *out);
    int n = g->n_nodes;
    out->n_layers = n;
    out->born = malloc(sizeof(int) * ((size_t)g->n_values + 1));
    out->dies = malloc(sizeof(int) * ((size_t)g->n_values + 1));
    out->frontier_bytes = calloc((size_t)n + 2, sizeof(int64_t));
    out->frontier_count = calloc((size_t)n + 2, sizeof(int));
    int64_t *delta_bytes = calloc((size_t)n + 2, sizeof(int64_t));
    int *delta_count = calloc((size_t)n + 2, sizeof(int));
    out->layer_params = calloc((size_t)n + 1, sizeof(int64_t));
    if (!out->layer_params || !out->born || !out->dies || !out->frontier_bytes || !out->frontier_count || !delta_bytes ||
        !delta_count) {
        free(delta_bytes);
        free(delta_count);
        gp_layers_free(out);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory building the layer list");
    }
    /* A value made by layer p is born at cut p+1 (inputs at cut 0) and
     * stays through the cut of its last reader r (cut r); graph outputs
     * stay to the end (cut n). */
    for (int v = 0; v < g->n_values; v++) {
        const struct gp_value *val = &g->values[v];
        out->born[v] = val->kind == GP_VALUE_INPUT ? 0 : val->producer + 1;
        out->dies[v] = val->is_output ? n + 1 : -1;
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < g->nodes[i].n_inputs; k++) {
            int v = g->nodes[i].inputs[k];
            if (v < 0) continue;
            const struct gp_value *val = &g->values[v];
            /* dies == -1 until the first reader: that reader owns a parameter. */
            if (val->kind == GP_VALUE_PARAMETER && out->dies[v] < 0)
                out->layer_params[i] += gp_shape_numel(&val->shape);
            if (out->dies[v] < i + 1) out->dies[v] = i + 1;
        }
    for (int v = 0; v < g->n_values; v++) {
        const struct gp_value *val = &g->values[v];
        if (!is_runtime(val) || (val->kind == GP_VALUE_ACTIVATION && val->producer < 0) ||
            out->dies[v] <= out->born[v]) {
            out->born[v] = 1;
            out->dies[v] = 0;
            continue;
        }
        /* In the frontier of cuts born .. dies-1. */
        int64_t bytes = gp_value_bytes(val);
        delta_bytes[out->born[v]] += bytes;
        delta_bytes[out->dies[v]] -= bytes;
        delta_count[out->born[v]]++;
        delta_count[out->dies[v]]--;
    }
    int64_t bytes = 0;
    int count = 0;
    for (int c = 0; c <= n; c++) {
        bytes += delta_bytes[c];
        count += delta_count[c];
        out->frontier_bytes[c] = bytes;
        out->frontier_count[c] = count;
    }
    free(delta_bytes);
    free(delta_count);
    return GP_OK;
}

int gp_layers_frontier(const struct gp_layers *l, const struct gp_graph *g, int cut, int *ids)
{
    int k = 0;
    for (int v = 0; v < g->n_values; v++)
        if (l->born[v] <= cut && cut < l->dies[v]) ids[k++] = v;
    return k;
}

void gp_layers_free(struct gp_layers *l)
{
    free(l->born);
    free(l->dies);
    free(l->frontier_bytes);
    free(l->frontier_count);
    free(l->layer_params);
    memset(l, 0, sizeof *l);
}
