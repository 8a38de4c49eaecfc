/* What an op's backward reads of its node's forward values: which inputs
 * and outputs (bit k each), given which input gradients are wanted. The
 * executor keeps after the forward only the activations some backward
 * reads (the rest share memory that the next layers reuse), so every
 * backend's backward kernel for an op listed here must read no more than
 * this says; ops not listed read everything (the safe default). Static
 * values (parameters, constants) are always there and do not count. */
#ifndef GP_OPS_BACKWARD_READS_H
#define GP_OPS_BACKWARD_READS_H

#include <stdbool.h>
#include <stdint.h>

#include "graph/graph.h"

void gp_backward_reads(const struct gp_node *node, uint32_t din_wanted, uint32_t *inputs, uint32_t *outputs);

/* The unary activations' backward (Relu, Sigmoid, Gelu, ...: one input,
 * one output): whether dX reads X, and Y. Both backends' kernels load
 * exactly these (so the executor need keep no more), gp_backward_reads
 * answers from them. Relu, and LeakyRelu of alpha >= 0, read Y alone: Y > 0
 * exactly where X > 0 (Y is X there; X <= 0 and NaN give Y <= 0 or NaN),
 * as PyTorch's relu backward reads its result; Sigmoid, Tanh, Sqrt, Exp
 * and Reciprocal read Y; Neg neither; the others X. Returns whether the
 * node is such an op (false, and false for both, when not). */
bool gp_unary_grad_reads(const struct gp_node *node, bool *x, bool *y);

#endif
