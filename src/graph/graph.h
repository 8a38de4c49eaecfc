/* The graph IR: values (tensors by name), nodes in topological order, and
 * the attributes and constants they carry.
 *
 * After loading (onnx/load.h) the graph is static: every value has a dtype and
 * a shape with the batch axis bound to the micro-batch size, constant
 * subgraphs are folded into GP_VALUE_CONSTANT values, and `nodes` holds only
 * the nodes that run at training time, in topological order. That order is
 * the sequential layer list (graph/layers.h). */
#ifndef GP_GRAPH_GRAPH_H
#define GP_GRAPH_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "graph/tensor.h"
#include "util/arena.h"
#include "util/error.h"
#include "util/strmap.h"

struct gp_op_def;

enum gp_value_kind {
    GP_VALUE_ACTIVATION, /* computed per micro-batch by a node */
    GP_VALUE_INPUT,      /* a graph input fed with data (axis 0 is the batch) */
    GP_VALUE_PARAMETER,  /* a trainable initializer: gets a gradient */
    GP_VALUE_BUFFER,     /* a float initializer without a gradient that a node
                            reads as state (BatchNorm running statistics) */
    GP_VALUE_CONSTANT,   /* known at load time: initializer or folded result */
};

const char *gp_value_kind_name(enum gp_value_kind kind);

struct gp_value {
    const char *name;
    enum gp_value_kind kind;
    enum gp_dtype dtype;
    struct gp_shape shape;
    bool has_shape;           /* false until shape inference reaches it */
    int producer;             /* index into gp_graph.nodes, -1 for none */
    struct gp_tensor *constant; /* data of PARAMETER, BUFFER and CONSTANT values */
    bool is_output;           /* listed in the graph's outputs */
    bool is_initializer;      /* came from graph.initializer (or a Constant
                                 node): the save path writes these back */
    /* Stored channels-last (graph/layout.h): a rank-4 activation whose shape
     * says [N, C, H, W] lies in memory as [N, H, W, C], and so does its
     * gradient. Set by the layout pass only; false everywhere by default. */
    bool channels_last;
    /* The layout pass's record of why it is not channels-last: the layer
     * whose reading it refused it or withdrew it (-1: none; graph/layout.h,
     * gp_layout_why_not). Meaningful only after the pass. */
    int layout_blocker;
};

enum gp_attr_type {
    GP_ATTR_UNDEFINED = 0,
    GP_ATTR_FLOAT = 1,
    GP_ATTR_INT = 2,
    GP_ATTR_STRING = 3,
    GP_ATTR_TENSOR = 4,
    GP_ATTR_GRAPH = 5,
    GP_ATTR_FLOATS = 6,
    GP_ATTR_INTS = 7,
    GP_ATTR_STRINGS = 8,
    GP_ATTR_OTHER = 99, /* sparse tensors, type protos, tensor lists: kept by
                           name so the error can say what was refused */
};

struct gp_attr {
    const char *name;
    enum gp_attr_type type;
    float f;
    int64_t i;
    const char *s;            /* NUL-terminated copy of the bytes */
    struct gp_tensor *t;
    int64_t count;            /* elements of floats / ints / strings */
    float *floats;
    int64_t *ints;
    const char **strings;
};

struct gp_node {
    const char *name;     /* never NULL: "<op_type>_<index>" when the file has none */
    const char *op_type;
    const char *domain;   /* "" for the default ONNX domain */
    int n_inputs, n_outputs;
    int *inputs;          /* value indices; -1 for an omitted optional input */
    int *outputs;
    int n_attrs;
    struct gp_attr *attrs;
    const struct gp_op_def *def; /* resolved by (domain, op_type, opset) */
    int source_index;     /* position in the file, for messages */
    /* A Relu fused into this node (graph/fuse.c: a BatchNormalization, or
     * an Add without broadcasting, whose output only a Relu read): output 0
     * is the Relu's, max(y, 0), and the backward masks dY by output 0 > 0.
     * Set by fusion only, never read from a file. */
    bool fused_relu;
    /* A BatchNormalization that adds a residual to its result (graph/fuse.c:
     * the same-shape Add reading its output absorbed, that Add's Relu
     * too): input 5 is the Add's other operand r, output 0 the Add's
     * output, y = BN(x) + r (then Relu's max if fused_relu), where BN(x)
     * is rounded to the output's storage type first, as the unfused BN
     * stored it; in backward r's gradient is dY (masked by a fused Relu),
     * as the Add's was. Set by fusion only. */
    bool fused_add;
    /* A MatMul whose B is a 2-D parameter stored transposed, [N, K] (the
     * exporter's Transpose of the weight absorbed, graph/fuse.c): the
     * product is A B^T and B's gradient is dY^T A. Set by fusion only. */
    bool trans_b;
    /* A MatMul that adds a bias to its product (graph/fuse.c: the Add after
     * it absorbed): input 2 is b, [N] or [1, ..., N] with N the product's
     * last axis, added to every row of the product in float32 before the
     * product is stored (in bf16, b's bfloat16 copy, as autocast rounds a
     * Linear's bias); b's gradient is the column sums of dY. Set by
     * fusion only. */
    bool fused_bias;
    /* A 3-D Attention whose Q, K and V were the equal thirds of one Split
     * along the last axis (graph/fuse_attention.c): input 0 is the packed
     * [B, T, 3 * C] tensor, inputs 1 and 2 are omitted, and the kernels
     * read Q, K, V at its offsets 0, C, 2 * C (ops/attention.h) and write
     * their gradients into its gradient. Set by fusion only. */
    bool packed_qkv;
};

struct gp_opset {
    const char *domain;
    int64_t version;
};

struct gp_mapping; /* a memory-mapped external data file (onnx/external_data.c) */

struct gp_graph {
    struct gp_arena arena;
    const char *path;          /* the model file */
    const char *dir;           /* its folder: external data must stay inside */
    const char *producer_name, *producer_version, *graph_name;
    int n_metadata;            /* the model's metadata_props */
    const char **metadata_keys, **metadata_values;
    int64_t ir_version;
    int64_t model_version;
    int64_t opset;             /* version of the default domain */
    int n_opsets;
    struct gp_opset *opsets;

    int64_t batch;             /* micro-batch size bound to axis 0 of inputs */
    int64_t export_batch;      /* axis 0 as the file wrote it when numeric, else 0 */

    int n_values, cap_values;
    struct gp_value *values;
    struct gp_strmap value_names; /* name -> index into values */
    int n_nodes, cap_nodes;    /* nodes that run: the layer list */
    struct gp_node *nodes;
    int n_source_nodes;        /* nodes in the file */
    int n_folded;              /* nodes folded into constants at load time */
    struct gp_node *folded;    /* those nodes, in order, for reports */
    int n_fused;               /* nodes merged away by fusion (graph/fuse.c) */
    int n_fusions;             /* the single ops they became (each also one of the nodes) */

    int n_inputs, n_outputs;
    int *inputs, *outputs;     /* value indices */

    struct gp_mapping *mappings;
};

/* Value lookup by name; -1 when absent. */
int gp_graph_find_value(const struct gp_graph *g, const char *name);

/* A fresh tensor of the given type and shape, zeroed, owned by the graph.
 * NULL when the shape is invalid or memory is exhausted. */
struct gp_tensor *gp_graph_new_tensor(struct gp_graph *g, enum gp_dtype dtype,
                                      const struct gp_shape *shape);

/* Attributes: NULL / the default when absent. The loader has already checked
 * every attribute's type against the op definition, so these never fail. */
const struct gp_attr *gp_node_attr(const struct gp_node *node, const char *name);
int64_t gp_node_attr_int(const struct gp_node *node, const char *name, int64_t dflt);
float gp_node_attr_float(const struct gp_node *node, const char *name, float dflt);
const char *gp_node_attr_string(const struct gp_node *node, const char *name, const char *dflt);
/* Number of ints (and *out set), or -1 when absent. */
int64_t gp_node_attr_ints(const struct gp_node *node, const char *name, const int64_t **out);

/* The value behind a node's input i, or NULL when omitted / out of range. */
struct gp_value *gp_node_input(const struct gp_graph *g, const struct gp_node *node, int i);
struct gp_value *gp_node_output(const struct gp_graph *g, const struct gp_node *node, int i);

/* Totals over PARAMETER values: element count and bytes. */
int64_t gp_graph_param_count(const struct gp_graph *g);
int64_t gp_graph_param_bytes(const struct gp_graph *g);
/* Bytes of a value's tensor at the bound batch size. */
int64_t gp_value_bytes(const struct gp_value *v);

/* The model's data inputs: its graph inputs that are not initializers.
 * Returns the first's value index (-1: none); *count (may be NULL) gets
 * how many there are (training feeds exactly one). */
int gp_graph_data_inputs(const struct gp_graph *g, int *count);
static inline int gp_graph_data_input(const struct gp_graph *g) { return gp_graph_data_inputs(g, NULL); }

/* The model's metadata_props value for key, or NULL. */
const char *gp_graph_metadata(const struct gp_graph *g, const char *key);

void gp_graph_free(struct gp_graph *g);

#endif
