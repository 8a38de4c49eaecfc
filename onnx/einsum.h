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

/* Adds the nodes computing np's Einsum to g (instead of np itself); an
 * equation outside what is supported is an error naming the node, its
 * equation and what in it is not supported. */
gp_status gp_onnx_lower_einsum(struct gp_graph *g, const Onnx__NodeProto *np, struct gp_error *err);

#endif
