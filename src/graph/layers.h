/* The sequential layer list and its frontiers.
 *
 * Layer i is node i of the finalized graph (topological order). The cut c
 * (0 <= c <= n_layers) lies before layer c; its frontier is every runtime
 * value (graph input or activation) made before the cut and still needed at
 * or after it, plus graph outputs made before it. A pipeline stage boundary
 * at cut c moves exactly that frontier, which is how skip connections cross
 * stages without annotations. */
#ifndef GP_GRAPH_LAYERS_H
#define GP_GRAPH_LAYERS_H

#include <stdint.h>

#include "graph/graph.h"

struct gp_layers {
    int n_layers;
    /* Per value: the cut range [born, dies) over which it is in the frontier;
     * born > dies (empty) for values never in any frontier (parameters, constants). */
    int *born, *dies;
    /* frontier_bytes[c]: bytes per micro-batch crossing cut c, c in [0, n_layers]. */
    int64_t *frontier_bytes;
    int *frontier_count;
    /* Parameter elements read by each layer; a parameter shared by several
     * layers counts at its first reader, so the column sums to the total. */
    int64_t *layer_params;
};

gp_status gp_layers_build(const struct gp_graph *g, struct gp_layers *out, struct gp_error *err);

/* Writes the value indices in the frontier of cut `cut` into ids (room for
 * frontier_count[cut]); returns their number, in value order. */
int gp_layers_frontier(const struct gp_layers *l, const struct gp_graph *g, int cut, int *ids);

void gp_layers_free(struct gp_layers *l);

#endif
