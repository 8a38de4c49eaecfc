/* The op families' tables, each terminated by an entry with op_type NULL.
 * One file per family under src/ops/. */
#ifndef GP_OPS_FAMILIES_H
#define GP_OPS_FAMILIES_H

#include "ops/registry.h"

extern const struct gp_op_def gp_ops_elementwise[]; /* unary, binary, Where, Cast, Expand, Clip */
extern const struct gp_op_def gp_ops_shape[];       /* Shape, Reshape, Transpose, Concat, Slice, Gather... */
extern const struct gp_op_def gp_ops_nn[];          /* Conv, pooling, normalization, Dropout, Resize */
extern const struct gp_op_def gp_ops_math[];        /* Gemm, MatMul, Softmax, reductions */
extern const struct gp_op_def gp_ops_attention[];   /* Attention (ops/attention.h) */

#endif
