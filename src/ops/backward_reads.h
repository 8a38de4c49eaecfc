/* What an op's backward reads of its node's forward values: which inputs
 * and outputs (bit k each), given which input gradients are wanted. The
 * executor keeps after the forward only the activations some backward
 * reads (the rest share memory that the next layers reuse), so every
 * backend's backward kernel for an op listed here must read no more than
 * this says; ops not listed read everything (the safe default). Static
 * values (parameters, constants) are always there and do not count. */
#ifndef GP_OPS_BACKWARD_READS_H
#define GP_OPS_BACKWARD_READS_H

#include <stdint.h>

#include "graph/graph.h"

void gp_backward_reads(const struct gp_node *node, uint32_t din_wanted, uint32_t *inputs, uint32_t *outputs);

#endif
