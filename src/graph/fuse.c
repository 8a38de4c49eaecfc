/* Fusion of op chains that exporters spell out into the one op that does
 * the same, after folding (graph/build.h, gp_graph_finalize's last step).
 *
 * Today one chain: the exact GELU that PyTorch's F.gelu / nn.GELU becomes
 * below opset 20,
 *     y = Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5)
 * (either operand order of the commutative ops), which becomes Gelu(x).
 * Five layers forward and five backward, each a pass over the [batch,
 * tokens, 4 * width] activation and four of them keeping that activation
 * for backward, become one layer that keeps only x. Gelu computes PyTorch's
 * own formula, 0.5 x (1 + erf(x / sqrt 2)), and its exact derivative, so
 * the result is closer to PyTorch's training than the chain's rounding.
 *
 * A chain fuses only when each of its intermediate values has one consumer
 * (the next op of the chain) and is not a graph output, x is float32, and
 * the constants are the scalars above. The saved model is unaffected: it is
 * written from the original file (onnx/save.c), not from this IR. */
#include "graph/build.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/registry.h"

/* The scalar float constant value v holds, or NAN when it is not one. */
static double scalar_const(const struct gp_graph *g, int v)
{
    if (v < 0) return NAN;
    const struct gp_value *val = &g->values[v];
    if (!val->constant || val->kind == GP_VALUE_PARAMETER || gp_shape_numel(&val->shape) != 1 ||
        !gp_dtype_is_float(val->dtype))
        return NAN;
    return gp_tensor_get_f64(val->constant, 0);
}

static bool near(double a, double b) { return fabs(a - b) <= 1e-6 * fabs(b); }

static bool is_op(const struct gp_node *n, const char *op)
{
    return (!*n->domain || !strcmp(n->domain, "ai.onnx")) && !strcmp(n->op_type, op);
}

/* The node consuming value v when it has exactly one consumer and is not a
 * graph output; -1 otherwise. */
static int sole_consumer(const struct gp_graph *g, const int *uses, const int *user, int v)
{
    if (v < 0 || uses[v] != 1 || g->values[v].is_output) return -1;
    return user[v];
}

/* For a binary node with value `a` as one operand: the other operand, or
 * -2 when neither operand is `a`. */
static int other_operand(const struct gp_node *n, int a)
{
    if (n->n_inputs != 2 || n->n_outputs != 1) return -2;
    if (n->inputs[0] == a) return n->inputs[1];
    if (n->inputs[1] == a) return n->inputs[0];
    return -2;
}

/* The chain starting at the Div node d, as node indices div, erf, add,
 * mul, half; false when it is not a GELU. */
static bool match_gelu(const struct gp_graph *g, const int *uses, const int *user, int d, int chain[5])
{
    const struct gp_node *div = &g->nodes[d];
    if (!is_op(div, "Div") || div->n_inputs != 2 || div->n_outputs != 1) return false;
    int x = div->inputs[0];
    if (x < 0 || g->values[x].dtype != GP_DTYPE_FLOAT32 || !near(scalar_const(g, div->inputs[1]), M_SQRT2))
        return false;
    int e = sole_consumer(g, uses, user, div->outputs[0]);
    if (e < 0 || !is_op(&g->nodes[e], "Erf") || g->nodes[e].n_outputs != 1) return false;
    int a = sole_consumer(g, uses, user, g->nodes[e].outputs[0]);
    if (a < 0 || !is_op(&g->nodes[a], "Add") ||
        !near(scalar_const(g, other_operand(&g->nodes[a], g->nodes[e].outputs[0])), 1.0))
        return false;
    int m = sole_consumer(g, uses, user, g->nodes[a].outputs[0]);
    if (m < 0 || !is_op(&g->nodes[m], "Mul") || other_operand(&g->nodes[m], g->nodes[a].outputs[0]) != x)
        return false;
    int h = sole_consumer(g, uses, user, g->nodes[m].outputs[0]);
    if (h < 0 || !is_op(&g->nodes[h], "Mul") ||
        !near(scalar_const(g, other_operand(&g->nodes[h], g->nodes[m].outputs[0])), 0.5))
        return false;
    const struct gp_value *xv = &g->values[x], *yv = &g->values[g->nodes[h].outputs[0]];
    if (!gp_shape_equal(&xv->shape, &yv->shape) || yv->dtype != GP_DTYPE_FLOAT32) return false;
    chain[0] = d, chain[1] = e, chain[2] = a, chain[3] = m, chain[4] = h;
    return true;
}

/* "<folder of the Div's name>/Gelu" (the exporter's module path), or
 * "Gelu_<index>" for names without one. */
static const char *gelu_name(struct gp_graph *g, const struct gp_node *div, int index)
{
    char buf[512];
    const char *slash = strrchr(div->name, '/');
    if (slash && slash - div->name < 400)
        snprintf(buf, sizeof buf, "%.*s/Gelu", (int)(slash - div->name), div->name);
    else
        snprintf(buf, sizeof buf, "Gelu_%d", index);
    return gp_arena_strdup(&g->arena, buf);
}

gp_status gp_graph_fuse(struct gp_graph *g, struct gp_error *err)
{
    bool known = false;
    const struct gp_op_def *gelu = gp_op_lookup("", "Gelu", 20, &known);
    int *uses = calloc((size_t)g->n_values + 1, sizeof(int));
    int *user = malloc(sizeof(int) * ((size_t)g->n_values + 1));
    bool *drop = calloc((size_t)g->n_nodes + 1, sizeof(bool));
    int *input = gp_arena_alloc(&g->arena, sizeof(int) * ((size_t)g->n_nodes + 1));
    if (!uses || !user || !drop || !input) {
        free(uses);
        free(user);
        free(drop);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory fusing the graph");
    }
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_inputs; k++) {
            int v = g->nodes[i].inputs[k];
            if (v >= 0) uses[v]++, user[v] = i;
        }
    int fused = 0;
    for (int i = 0; gelu && i < g->n_nodes; i++) {
        int chain[5];
        if (drop[i] || !match_gelu(g, uses, user, i, chain)) continue;
        /* The last Mul becomes Gelu(x); the other four go, their outputs
         * left without producer or consumer. */
        struct gp_node *last = &g->nodes[chain[4]];
        input[fused] = g->nodes[chain[0]].inputs[0];
        last->name = gelu_name(g, &g->nodes[chain[0]], fused);
        last->op_type = "Gelu";
        last->domain = "";
        last->def = gelu;
        last->n_inputs = 1;
        last->inputs = &input[fused];
        last->n_attrs = 0;
        last->attrs = NULL;
        for (int k = 0; k < 4; k++) {
            drop[chain[k]] = true;
            g->values[g->nodes[chain[k]].outputs[0]].producer = -1;
        }
        fused++;
    }
    if (fused) {
        int count = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            if (drop[i]) continue;
            g->nodes[count] = g->nodes[i];
            for (int k = 0; k < g->nodes[count].n_outputs; k++)
                if (g->nodes[count].outputs[k] >= 0) g->values[g->nodes[count].outputs[k]].producer = count;
            count++;
        }
        g->n_fused += g->n_nodes - count;
        g->n_fusions += fused;
        g->n_nodes = count;
    }
    free(uses);
    free(user);
    free(drop);
    return GP_OK;
}
