/* TensorProto -> gp_tensor: data from raw_data, from the typed repeated
 * fields, or from external files. */
#ifndef GP_ONNX_TENSOR_PROTO_H
#define GP_ONNX_TENSOR_PROTO_H

#include "graph/graph.h"
#include "onnx.pb-c.h"

/* Decodes `tp` into a tensor owned by `g` (arena, or a mapping for external
 * data). With `borrow`, raw_data lies in memory the graph keeps mapped
 * (g->mappings) and the tensor becomes a view of it instead of a copy. Every
 * size is checked against the shape: a tensor whose data does not match its
 * dims is an error naming it. */
gp_status gp_onnx_tensor(struct gp_graph *g, const Onnx__TensorProto *tp, bool borrow,
                         struct gp_tensor **out, struct gp_error *err);

#endif
