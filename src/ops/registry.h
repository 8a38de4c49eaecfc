/* The op registry: one entry per (domain, op_type, since_version).
 *
 * Loading resolves every node to the entry with the highest since_version
 * not above the model's opset for that domain. An entry validates the node's
 * arity and attributes, infers its outputs' dtypes and shapes once, and may
 * fold it into constants when its inputs are known at load time. Later
 * layers (backends) attach forward and backward kernels per entry. */
#ifndef GP_OPS_REGISTRY_H
#define GP_OPS_REGISTRY_H

#include <stdbool.h>
#include <stdint.h>

#include "graph/graph.h"

/* What an op's infer and fold functions see. */
struct gp_infer_ctx {
    struct gp_graph *graph;
    struct gp_node *node;
    struct gp_error *err;
};

typedef gp_status (*gp_infer_fn)(struct gp_infer_ctx *ctx);

enum gp_fold_kind {
    GP_FOLD_NEVER = 0,   /* random or stateful ops (Dropout), or no evaluator */
    GP_FOLD_CONSTANTS,   /* folds when every present input is a non-trainable constant */
    GP_FOLD_SHAPES,      /* folds from input shapes alone (Shape, Size) */
    GP_FOLD_REQUIRED,    /* as GP_FOLD_CONSTANTS, but there is no kernel: a node that
                          * cannot fold is a load-time error naming the input */
};

struct gp_op_def {
    const char *domain;      /* "" for the default ONNX domain */
    const char *op_type;
    int since_version;
    int min_inputs, max_inputs;
    int min_outputs, max_outputs;
    /* Attributes understood, comma-separated "name:type" with type one of
     * f (float), i (int), s (string), t (tensor), F (floats), I (ints),
     * S (strings). Any other attribute on a node is a load-time error. */
    const char *attrs;
    /* Bit i set: input i never carries a gradient (indices, shapes, axes,
     * running statistics). Decides which initializers are trainable. */
    uint32_t nondiff_inputs;
    gp_infer_fn infer;       /* sets dtype and shape of every present output */
    enum gp_fold_kind fold_kind;
    gp_infer_fn fold;        /* fills outputs' constant tensors (after infer) */
};

/* Highest since_version <= opset for (domain, op_type); NULL if none. The
 * domains "" and "ai.onnx" are the same. `*known_op` tells whether the op
 * type exists at all (for a better message when only the version is off). */
const struct gp_op_def *gp_op_lookup(const char *domain, const char *op_type, int64_t opset,
                                     bool *known_op);

/* Every registered entry, for `gpipe-onnx ops` and tests. */
int gp_op_count(void);
const struct gp_op_def *gp_op_at(int i);

/* ---- helpers for infer and fold functions ---- */

/* Present input i (NULL when omitted); output i. */
struct gp_value *gp_in(struct gp_infer_ctx *ctx, int i);
struct gp_value *gp_out(struct gp_infer_ctx *ctx, int i);
/* Sets output i's dtype and shape. */
void gp_set_out(struct gp_infer_ctx *ctx, int i, enum gp_dtype dtype, const struct gp_shape *shape);
/* Allocates output i's constant tensor from its inferred dtype and shape. */
struct gp_tensor *gp_fold_out(struct gp_infer_ctx *ctx, int i);

/* Errors that name the node: "node 'name' (OpType): <message>". */
gp_status gp_op_error(struct gp_infer_ctx *ctx, gp_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Input i must be a constant known at load time (a shape, axes, pads...);
 * fails with a message naming the input otherwise. */
gp_status gp_need_const(struct gp_infer_ctx *ctx, int i, const struct gp_tensor **out);

/* Numpy-style multidirectional broadcasting of a and b into out. */
gp_status gp_broadcast(struct gp_infer_ctx *ctx, const struct gp_shape *a,
                       const struct gp_shape *b, struct gp_shape *out);

/* Normalizes a possibly negative axis into [0, rank); fails naming the node. */
gp_status gp_norm_axis(struct gp_infer_ctx *ctx, int64_t axis, int rank, int *out);

/* Fails unless every present input in [first, last] has dtype equal to input first's. */
gp_status gp_same_dtype(struct gp_infer_ctx *ctx, int first, int last);

/* Checks a computed output shape (no negative dims, no overflow). */
gp_status gp_check_shape(struct gp_infer_ctx *ctx, const struct gp_shape *shape);

#endif
