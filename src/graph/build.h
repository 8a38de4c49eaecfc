/* Building a graph: the loader (onnx/load.c) and tests add values, nodes and
 * attributes through these, then call gp_graph_finalize to resolve ops,
 * sort, infer shapes and fold constants. */
#ifndef GP_GRAPH_BUILD_H
#define GP_GRAPH_BUILD_H

#include "graph/graph.h"

/* Empty graph whose inputs' axis 0 will be bound to `batch` (0: keep the
 * sizes the model declares, which must then be numbers); `opset` is the
 * default domain's version. `max_values` bounds the number of values (the
 * loader knows it from the file; tests pass a generous number). */
gp_status gp_graph_init(struct gp_graph *g, int64_t batch, int64_t opset, int max_values,
                        int max_nodes, struct gp_error *err);

/* Index of the value named `name`, created (as an ACTIVATION with no shape)
 * when new. -1 with err set when the table is full. */
int gp_graph_value(struct gp_graph *g, const char *name, struct gp_error *err);
/* -1 when no value has this name. */
int gp_graph_lookup(const struct gp_graph *g, const char *name);

/* A graph input fed with data: shape as written in the model, axis 0 is
 * rebound to the batch at finalize. */
gp_status gp_graph_add_input(struct gp_graph *g, const char *name, enum gp_dtype dtype,
                             const struct gp_shape *shape, struct gp_error *err);
/* An initializer: the tensor is owned by the graph (arena or mapping). */
gp_status gp_graph_add_initializer(struct gp_graph *g, const char *name, struct gp_tensor *t,
                                   struct gp_error *err);
gp_status gp_graph_add_output(struct gp_graph *g, const char *name, struct gp_error *err);

/* Appends a node. Empty names in `inputs` are omitted optional inputs. A
 * value produced twice is an error naming it. Returns the node index or -1. */
int gp_graph_add_node(struct gp_graph *g, const char *op_type, const char *domain,
                      const char *name, int n_inputs, const char *const *inputs, int n_outputs,
                      const char *const *outputs, struct gp_error *err);
/* Adds an attribute slot to node `node` (reserve with `max_attrs` on the
 * first call for that node); the caller fills the returned struct. */
struct gp_attr *gp_graph_add_attr(struct gp_graph *g, int node, const char *name,
                                  enum gp_attr_type type, int max_attrs, struct gp_error *err);

/* Convenience for tests: a constant float32 / int64 initializer. */
gp_status gp_graph_add_const_f32(struct gp_graph *g, const char *name, const struct gp_shape *shape,
                                 const float *data, struct gp_error *err);
gp_status gp_graph_add_const_i64(struct gp_graph *g, const char *name, const struct gp_shape *shape,
                                 const int64_t *data, struct gp_error *err);

/* Resolves every node's op (reporting all unsupported ops at once), sorts
 * the nodes topologically (cycles and dangling inputs are errors naming the
 * value), decides which initializers are trainable, binds the batch axis,
 * infers shapes and folds constant subgraphs. After this the graph is the
 * static IR described in graph/graph.h. */
gp_status gp_graph_finalize(struct gp_graph *g, struct gp_error *err);

/* Replaces op chains that exporters spell out by the single op computing
 * the same (scaled dot-product attention -> Attention, the GELU chains ->
 * Gelu, Relu into BatchNormalization or Add); graph/fuse.c.
 * gp_graph_finalize's last step. */
gp_status gp_graph_fuse(struct gp_graph *g, struct gp_error *err);

/* The attention fusion (graph/fuse_attention.c), gp_graph_fuse's first
 * pass: marks the nodes that go in drop[] (indexed like g->nodes, which
 * the caller compacts) and counts the fused ops into *fused. Off when the
 * environment sets GP_FUSE_ATTENTION=0. */
gp_status gp_graph_fuse_attention(struct gp_graph *g, bool *drop, int *fused, struct gp_error *err);

#endif
