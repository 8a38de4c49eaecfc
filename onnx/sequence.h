/* SplitToSequence read by SequenceAt at constant positions, lowered at load
 * into Slice (onnx/sequence.c says why and what is refused). */
#ifndef GP_ONNX_SEQUENCE_H
#define GP_ONNX_SEQUENCE_H

#include <stdbool.h>
#include <stdint.h>

#include "graph/graph.h"
#include "onnx.pb-c.h"

/* Nodes and values one SequenceAt may add beyond its own node and output:
 * a Squeeze after the Slice, the Slice's starts, ends and axes, the sliced
 * value and the Squeeze's axes. */
#define GP_SEQUENCE_EXTRA_NODES 1
#define GP_SEQUENCE_EXTRA_VALUES 5

/* SplitToSequence or SequenceAt of the default domain. */
bool gp_onnx_is_sequence_op(const Onnx__NodeProto *np);

/* What a lowered SequenceAt needs of its tensor once shapes are known: the
 * position is a chunk that exists, and an explicit split covers the axis. */
struct gp_sequence_check {
    const char *node, *value; /* in the graph's arena */
    int64_t axis, position, start;
    int64_t total; /* the split's sum; -1 for equal chunks of `chunk` */
    int64_t chunk;
};

/* Before any node is added: every sequence in `gp` is a SplitToSequence's
 * output read only by SequenceAt nodes, with a constant split and constant
 * positions; else an error naming the node and what it does with a sequence
 * that is not supported. */
gp_status gp_onnx_check_sequences(const Onnx__GraphProto *gp, struct gp_error *err);

/* Adds to g what np computes: nothing for a SplitToSequence, a Slice (and a
 * Squeeze where SplitToSequence's keepdims=0 asks for it) for a SequenceAt,
 * and its check to checks[(*n_checks)++]. gp_onnx_check_sequences has
 * passed. */
gp_status gp_onnx_lower_sequence_op(struct gp_graph *g, const Onnx__GraphProto *gp, const Onnx__NodeProto *np,
                                    struct gp_sequence_check *checks, int *n_checks, struct gp_error *err);

/* After gp_graph_finalize: each SequenceAt's chunk exists in its tensor,
 * else an error naming the node, the position and the tensor's size. */
gp_status gp_onnx_sequence_verify(const struct gp_graph *g, const struct gp_sequence_check *checks, int n,
                                  struct gp_error *err);

#endif
