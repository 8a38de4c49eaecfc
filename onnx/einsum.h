/* Einsum lowered at load into Transpose / MatMul / ReduceSum (onnx/einsum.c
 * says which equations and why). */
#ifndef GP_ONNX_EINSUM_H
#define GP_ONNX_EINSUM_H

#include <stdbool.h>

#include "graph/graph.h"
#include "onnx.pb-c.h"

/* Nodes and values one Einsum may add beyond its own node and output. */
#define GP_EINSUM_EXTRA_NODES 3
#define GP_EINSUM_EXTRA_VALUES 5

bool gp_onnx_is_einsum(const Onnx__NodeProto *np);

/* An operand's rank as its equation term says: shapes are known only after
 * the graph is finalized, and the lowered ops alone would broadcast an
 * operand of another rank instead of refusing it. */
struct gp_einsum_check {
    const char *node, *equation, *value; /* in the graph's arena */
    int rank;
};

/* Adds the nodes computing np's Einsum to g (instead of np itself) and one
 * check per operand to checks[*n_checks...] (room for 2); an equation
 * outside what is supported is an error naming the node, its equation and
 * what in it is not supported. */
gp_status gp_onnx_lower_einsum(struct gp_graph *g, const Onnx__NodeProto *np, struct gp_einsum_check *checks,
                               int *n_checks, struct gp_error *err);

/* After gp_graph_finalize: every operand has its term's rank, else an error
 * naming the node, the equation, the operand and both ranks. */
gp_status gp_onnx_einsum_verify(const struct gp_graph *g, const struct gp_einsum_check *checks, int n,
                                struct gp_error *err);

#endif
