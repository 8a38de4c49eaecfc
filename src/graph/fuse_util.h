/* Helpers shared by the fusion passes (graph/fuse.c, fuse_attention.c):
 * reading scalar constants and following single-consumer chains. `uses[v]`
 * counts the nodes reading value v and `user[v]` is one of them (the only
 * one when uses[v] is 1). */
#ifndef GP_GRAPH_FUSE_UTIL_H
#define GP_GRAPH_FUSE_UTIL_H

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "graph/graph.h"

/* The scalar float constant value v holds, or NAN when it is not one
 * (parameters are not constants: they change while training). */
static inline double gp_fuse_scalar(const struct gp_graph *g, int v)
{
    if (v < 0) return NAN;
    const struct gp_value *val = &g->values[v];
    if (!val->constant || val->kind == GP_VALUE_PARAMETER || gp_shape_numel(&val->shape) != 1 ||
        !gp_dtype_is_float(val->dtype))
        return NAN;
    return gp_tensor_get_f64(val->constant, 0);
}

static inline bool gp_fuse_is_op(const struct gp_node *n, const char *op)
{
    return (!*n->domain || !strcmp(n->domain, "ai.onnx")) && !strcmp(n->op_type, op);
}

/* The node consuming value v when it has exactly one consumer and is not a
 * graph output; -1 otherwise. */
static inline int gp_fuse_sole_consumer(const struct gp_graph *g, const int *uses, const int *user, int v)
{
    if (v < 0 || uses[v] != 1 || g->values[v].is_output) return -1;
    return user[v];
}

/* For a binary node with value `a` as one operand: the other operand, or
 * -2 when neither operand is `a`. */
static inline int gp_fuse_other_operand(const struct gp_node *n, int a)
{
    if (n->n_inputs != 2 || n->n_outputs != 1) return -2;
    if (n->inputs[0] == a) return n->inputs[1];
    if (n->inputs[1] == a) return n->inputs[0];
    return -2;
}

#endif
