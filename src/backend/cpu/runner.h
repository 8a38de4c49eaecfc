/* Runs a finalized graph on the CPU, forward and backward, for one
 * micro-batch at a time: the reference executor, compiled once per `real`
 * type like the kernels (GP_CPU names the float or double build).
 *
 * All memory is planned at creation: one block holds every value (inputs,
 * activations, parameters, buffers, constants) and every gradient. Nothing
 * is allocated while running. */
#ifndef GP_BACKEND_CPU_RUNNER_H
#define GP_BACKEND_CPU_RUNNER_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/cpu/kernel.h"

struct gp_cpu_runner;

struct gp_run_opts {
    bool training;           /* batch statistics, dropout */
    bool update_state;       /* running statistics update (forward) */
    uint64_t seed, step;     /* dropout RNG key */
    int64_t sample_offset;   /* first sample of this micro-batch in the mini-batch */
    double dropout_ratio;    /* < 0: the model's own */
};

/* `grad_inputs`: also compute gradients for float graph inputs (tests). */
gp_status GP_CPU(gp_cpu_runner_create)(const struct gp_graph *g, bool grad_inputs,
                                       struct gp_cpu_runner **out, struct gp_error *err);
void GP_CPU(gp_cpu_runner_free)(struct gp_cpu_runner *r);

/* The buffer of value `id` (real for float dtypes, else the dtype's own
 * type); its gradient buffer or NULL when it needs none. */
void *GP_CPU(gp_cpu_runner_data)(struct gp_cpu_runner *r, int id);
real *GP_CPU(gp_cpu_runner_grad)(struct gp_cpu_runner *r, int id);
/* Total bytes planned. */
size_t GP_CPU(gp_cpu_runner_bytes)(const struct gp_cpu_runner *r);

/* Runs layers [first, last) forward. */
gp_status GP_CPU(gp_cpu_runner_forward)(struct gp_cpu_runner *r, const struct gp_run_opts *o,
                                        int first, int last, struct gp_error *err);
/* Zeroes every non-parameter gradient: call before writing the graph
 * outputs' gradients (the loss's) and running backward. */
void GP_CPU(gp_cpu_runner_zero_activation_grads)(struct gp_cpu_runner *r);
/* Zeroes parameter gradients: once per optimizer step. */
void GP_CPU(gp_cpu_runner_zero_param_grads)(struct gp_cpu_runner *r);
/* Runs layers [first, last) backward, in reverse, accumulating into
 * parameter gradients. */
gp_status GP_CPU(gp_cpu_runner_backward)(struct gp_cpu_runner *r, const struct gp_run_opts *o,
                                         int first, int last, struct gp_error *err);

/* Copies a tensor given in the graph's dtype (float32 for float values) into
 * value id's buffer, converting float32 -> real; and back. */
void GP_CPU(gp_cpu_runner_set)(struct gp_cpu_runner *r, int id, const void *data);
void GP_CPU(gp_cpu_runner_get)(struct gp_cpu_runner *r, int id, void *data);

#endif
