/* Loading an ONNX model file into the static graph IR (graph/graph.h). */
#ifndef GP_ONNX_LOAD_H
#define GP_ONNX_LOAD_H

#include <stddef.h>
#include <stdint.h>

#include "graph/graph.h"

/* Reads `path`, binds axis 0 of every graph input to `batch` (0 keeps the
 * sizes the file declares: for models with fully static shapes), folds
 * constant subgraphs and infers every shape. On failure the graph is left
 * empty (nothing to free) and err names the file and the cause. */
gp_status gp_onnx_load(const char *path, int64_t batch, struct gp_graph *g, struct gp_error *err);

/* The same from bytes in memory; `dir` is the folder that external data
 * must stay inside (NULL refuses all external data). For tests and fuzzing. */
gp_status gp_onnx_load_buffer(const void *data, size_t size, const char *dir, int64_t batch,
                              struct gp_graph *g, struct gp_error *err);

#endif
