/* What the exporter did to a model that training cannot undo. PyTorch's
 * dynamo exporter (torch.onnx.export(..., dynamo=True), the default from
 * torch 2.9) optimizes by default: it folds BatchNormalization into the
 * convolutions before it, even for a model in train() exported for
 * training, and merges initializers that hold equal values, so separate
 * parameters come out as one tensor read by several nodes. Such a model
 * loads and trains, only not as the PyTorch model did; this says so. */
#ifndef GP_GRAPH_EXPORTER_H
#define GP_GRAPH_EXPORTER_H

#include <stdbool.h>
#include <stddef.h>

#include "graph/graph.h"

/* True when `g` looks like an optimized dynamo export (producer "pytorch"
 * 2.5 or later, dynamo's node and value names, and a BatchNormalization
 * folded away, or a parameter of equal elements, as fresh LayerNorm weights
 * are, read by several nodes); then `note` holds one
 * paragraph for people: what was lost and the export line that keeps it. */
bool gp_graph_exporter_note(const struct gp_graph *g, char *note, size_t size);

#endif
