#include "pipeline/plan.h"

#include <stdlib.h>
#include <string.h>

#include <stdio.h>

#include "backend/compute.h"
#include "ops/registry.h"

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Bytes of a value on a device: every float dtype is held as float32. */
static size_t value_bytes(const struct gp_value *v)
{
    size_t e = gp_dtype_is_float(v->dtype) ? sizeof(float) : gp_dtype_size(v->dtype);
    return (size_t)gp_shape_numel(&v->shape) * e;
}

static bool nondiff(const struct gp_node *n, int k)
{
    return k < 32 && ((n->def->nondiff_inputs >> k) & 1);
}

void gp_plan_needs_grad(const struct gp_graph *g, bool *needs)
{
    for (int v = 0; v < g->n_values; v++)
        needs[v] = gp_dtype_is_float(g->values[v].dtype) && g->values[v].kind == GP_VALUE_PARAMETER;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct gp_node *n = &g->nodes[i];
        bool any = false;
        for (int k = 0; k < n->n_inputs; k++)
            if (n->inputs[k] >= 0 && needs[n->inputs[k]] && !nondiff(n, k)) any = true;
        if (!any) continue;
        for (int k = 0; k < n->n_outputs; k++)
            if (n->outputs[k] >= 0 && gp_dtype_is_float(g->values[n->outputs[k]].dtype))
                needs[n->outputs[k]] = true;
    }
}

/* Every layer of [first, last) needs a kernel of the backend, and one with
 * a backward where gradients flow through it: all that lack one are named
 * in one message. */
static gp_status check_kernels(const struct gp_graph *g, const struct gp_compute_ops *ops,
                               const char *backend, const bool *needs_grad, int first, int last,
                               struct gp_error *err)
{
    char list[768] = "";
    size_t len = 0;
    int missing = 0;
    const char *reported[32];
    for (int i = first; i < last; i++) {
        const struct gp_node *n = &g->nodes[i];
        bool trainable = false, found = ops->has_kernel(n, &trainable);
        bool grads = false;
        for (int k = 0; k < n->n_outputs; k++) grads |= n->outputs[k] >= 0 && needs_grad[n->outputs[k]];
        if (found && (trainable || !grads)) continue;
        /* One entry per op type, with the first node that has it. */
        bool seen = false;
        for (int r = 0; r < missing && r < 32; r++) seen |= strcmp(reported[r], n->op_type) == 0;
        if (seen) continue;
        if (missing < 32) reported[missing] = n->op_type;
        missing++;
        if (len < sizeof list - 1)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s%s (layer %d, '%s')",
                                    missing > 1 ? ", " : "", n->op_type, found ? " backward" : "", i,
                                    n->name);
    }
    if (!missing) return GP_OK;
    return gp_error_set(err, GP_ERR_UNSUPPORTED, "the %s backend has no kernel for %s", backend, list);
}

gp_status gp_plan_stage(const struct gp_graph *g, const struct gp_layers *l, const bool *needs_grad,
                        const struct gp_compute_ops *ops, const char *backend, int first, int last,
                        struct gp_stage_plan *p, struct gp_error *err)
{
    memset(p, 0, sizeof *p);
    GP_TRY(check_kernels(g, ops, backend, needs_grad, first, last, err));
    int nv = g->n_values;
    p->first = first;
    p->last = last;
    p->home = calloc((size_t)nv + 1, sizeof *p->home);
    p->off = calloc((size_t)nv + 1, sizeof *p->off);
    p->grad_off = malloc(sizeof(size_t) * ((size_t)nv + 1));
    p->inbox_off = malloc(sizeof(size_t) * ((size_t)nv + 1));
    p->saved_off = calloc((size_t)(last - first) + 1, sizeof(size_t));
    p->frontier_in = malloc(sizeof(int) * ((size_t)nv + 1));
    p->frontier_out = malloc(sizeof(int) * ((size_t)nv + 1));
    if (!p->home || !p->off || !p->grad_off || !p->inbox_off || !p->saved_off || !p->frontier_in ||
        !p->frontier_out)
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory planning a stage");
    for (int v = 0; v < nv; v++) p->grad_off[v] = p->inbox_off[v] = SIZE_MAX;
    p->n_frontier_in = gp_layers_frontier(l, g, first, p->frontier_in);
    p->n_frontier_out = gp_layers_frontier(l, g, last, p->frontier_out);

    /* Homes: the input frontier in boxes, what the stage makes in local
     * sets, and the static values its layers read. */
    for (int k = 0; k < p->n_frontier_in; k++) p->home[p->frontier_in[k]] = GP_HOME_BOX;
    for (int i = first; i < last; i++) {
        const struct gp_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_outputs; k++)
            if (n->outputs[k] >= 0) p->home[n->outputs[k]] = GP_HOME_LOCAL;
        for (int k = 0; k < n->n_inputs; k++) {
            int v = n->inputs[k];
            if (v < 0 || p->home[v] != GP_HOME_NONE) continue;
            const struct gp_value *val = &g->values[v];
            if (!val->constant)
                return gp_error_set(err, GP_ERR_INVALID,
                                    "layer %d ('%s') reads '%s', which is neither made before "
                                    "it nor known at load time",
                                    i, n->name, val->name);
            p->home[v] = GP_HOME_STATIC;
            if (val->kind == GP_VALUE_PARAMETER || val->kind == GP_VALUE_BUFFER) {
                /* One owner: a parameter updated on two devices would diverge. */
                for (int j = 0; j < g->n_nodes; j++) {
                    if (j >= first && j < last) continue;
                    for (int q = 0; q < g->nodes[j].n_inputs; q++)
                        if (g->nodes[j].inputs[q] == v)
                            return gp_error_set(err, GP_ERR_UNSUPPORTED,
                                                "%s '%s' is read by layer %d ('%s') and by layer %d "
                                                "('%s') in another stage: put both in one stage",
                                                gp_value_kind_name(val->kind), val->name, i,
                                                n->name, j, g->nodes[j].name);
                }
            }
        }
    }

    /* Offsets: static values (parameters first, so their gradients can
     * mirror them), boxes, local sets with each layer's saved state. */
    for (int pass = 0; pass < 2; pass++)
        for (int v = 0; v < nv; v++) {
            if (p->home[v] != GP_HOME_STATIC) continue;
            bool param = g->values[v].kind == GP_VALUE_PARAMETER;
            if (param != (pass == 0)) continue;
            p->off[v] = p->static_bytes;
            p->static_bytes += align64(value_bytes(&g->values[v]));
            if (param) p->param_bytes = p->static_bytes;
        }
    for (int v = 0; v < nv; v++) {
        if (p->home[v] == GP_HOME_BOX) {
            p->off[v] = p->box_bytes;
            p->box_bytes += align64(value_bytes(&g->values[v]));
        } else if (p->home[v] == GP_HOME_LOCAL) {
            p->off[v] = p->local_bytes;
            p->local_bytes += align64(value_bytes(&g->values[v]));
        }
    }
    for (int i = first; i < last; i++) {
        const struct gp_node *n = &g->nodes[i];
        p->saved_off[i - first] = p->local_bytes;
        p->local_bytes += align64(ops->saved_bytes(g, n));
        size_t scratch = ops->scratch_bytes(g, n);
        if (scratch > p->scratch_bytes) p->scratch_bytes = scratch;
        if (n->n_inputs > p->max_inputs) p->max_inputs = n->n_inputs;
        if (n->n_outputs > p->max_outputs) p->max_outputs = n->n_outputs;
    }
    /* One gradient set, reused by every micro-batch's backward: the stage's
     * values and its input frontier that carry gradients (parameters keep
     * theirs in the static gradient block, at their static offsets). */
    for (int v = 0; v < nv; v++) {
        if (!needs_grad[v] || (p->home[v] != GP_HOME_BOX && p->home[v] != GP_HOME_LOCAL)) continue;
        p->grad_off[v] = p->grad_bytes;
        p->grad_bytes += align64((size_t)gp_shape_numel(&g->values[v].shape) * sizeof(float));
    }
    /* Gradients arriving from the next stage for the output frontier. */
    for (int k = 0; k < p->n_frontier_out; k++) {
        int v = p->frontier_out[k];
        if (!needs_grad[v]) continue;
        p->inbox_off[v] = p->inbox_bytes;
        p->inbox_bytes += align64((size_t)gp_shape_numel(&g->values[v].shape) * sizeof(float));
    }
    return GP_OK;
}

void gp_plan_free(struct gp_stage_plan *p)
{
    free(p->home);
    free(p->off);
    free(p->grad_off);
    free(p->inbox_off);
    free(p->saved_off);
    free(p->frontier_in);
    free(p->frontier_out);
    memset(p, 0, sizeof *p);
}
