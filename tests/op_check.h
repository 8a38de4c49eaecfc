/* Checks for ops and whole graphs on the CPU backend:
 *  - op_gradcheck: backward against central finite differences, both in
 *    double precision (the double build of the kernels), for every float
 *    graph input and parameter;
 *  - op_forward_f32_vs_f64: the float build against the double build;
 *  - op_bf16_vs_f32: every layer in bf16 against fp32 (the executor's way:
 *    bfloat16 storage, float32 kernels on staged copies), which op_gradcheck
 *    runs too, so every op case is also a bf16 case.
 * Failures go through cmocka with the value, element and both numbers. */
#ifndef GP_TESTS_OP_CHECK_H
#define GP_TESTS_OP_CHECK_H

#include <stdbool.h>
#include <stdint.h>

#include "graph/graph.h"

struct op_check_opts {
    double tol;      /* relative tolerance; 0 means 1e-6 */
    int max_elems;   /* elements probed per tensor; 0 means 64 */
    bool training;   /* training mode (batch statistics, dropout); default false */
    uint64_t seed;   /* inputs, loss weights and dropout key */
    /* Optional: the value of element i of graph input `name` (integer
     * inputs such as indices need it; positive-only ops may use it).
     * Return NAN to fall back to uniform(-1, 1). */
    double (*gen)(const char *name, int64_t i, void *user);
    void *user;
};

void op_gradcheck(const struct gp_graph *g, const struct op_check_opts *o);
void op_bf16_vs_f32(const struct gp_graph *g, const struct op_check_opts *o);
/* Runs forward in float and double on the same inputs; outputs must agree
 * within `tol` relative (0 means 1e-5). */
void op_forward_f32_vs_f64(const struct gp_graph *g, const struct op_check_opts *o);

/* Runs forward (float build) with the given input data in graph dtypes
 * (float32 for float values; NULL entries use the generator) and copies each
 * graph output, in float32 / its dtype, into outputs[k]. */
void op_forward_f32(const struct gp_graph *g, const void *const *inputs, void **outputs,
                    bool training);

#endif
