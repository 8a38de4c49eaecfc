/* Planning a stage: which values it holds where, and how many bytes each
 * part takes. Internal to the pipeline executor. */
#ifndef GP_PIPELINE_PLAN_H
#define GP_PIPELINE_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "graph/graph.h"
#include "graph/layers.h"

/* Where a value lives on a stage. */
enum gp_home {
    GP_HOME_NONE,   /* not used by this stage */
    GP_HOME_STATIC, /* parameters, buffers, constants: one copy */
    GP_HOME_BOX,    /* the input frontier: one box per micro-batch */
    GP_HOME_LOCAL,  /* made by this stage: one activation set per kept micro-batch */
    GP_HOME_ARENA,  /* made by this stage and read by no backward: the forward's arena */
    GP_HOME_STEP,   /* made from static values only: once per step, not per micro-batch */
};

struct gp_stage_plan {
    int first, last;          /* layers [first, last) */
    enum gp_home *home;       /* per value */
    size_t *off;              /* per value: offset in its home's block */
    size_t *grad_off;         /* per value: offset in the gradient set, SIZE_MAX: none */
    size_t *inbox_off;        /* per value: offset in a gradient inbox, SIZE_MAX: none */
    size_t *saved_off;        /* per layer of the stage: offset of its saved state in a set */
    size_t static_bytes, param_bytes, box_bytes, local_bytes, grad_bytes, inbox_bytes,
        scratch_bytes, arena_bytes, step_bytes;
    /* Per layer of the stage: true when it reads static values only (a
     * weight's Transpose, positions' embedding): it runs forward once per
     * step and backward once, after the step's last micro-batch. */
    bool *once;
    int *frontier_in, n_frontier_in;   /* value ids at cut `first` */
    int *frontier_out, n_frontier_out; /* value ids at cut `last` */
    int max_inputs, max_outputs;
    /* Gradient regions to zero as the backward reaches them, by time t
     * (0: the start of the backward, t >= 1: before layer last - t):
     * born[born_start[t] .. born_start[t + 1]) are value ids. */
    int *born_start, *born;
    /* The same as merged byte ranges of the gradient set, for clearing:
     * zeros[zero_start[t] .. zero_start[t + 1]). */
    int *zero_start;
    struct gp_byte_range {
        size_t off, bytes;
    } *zeros;
};

struct gp_compute_ops;

/* Plans stage [first, last) of g for a backend's kernels (their saved and
 * scratch bytes). `needs_grad` marks values that carry gradients
 * (gp_plan_needs_grad). Fails naming every layer the backend has no kernel
 * (or no backward) for, and when a parameter or buffer is read by layers of
 * another stage too (it must live in one place). */
gp_status gp_plan_stage(const struct gp_graph *g, const struct gp_layers *l, const bool *needs_grad,
                        const struct gp_compute_ops *ops, const char *backend, int first, int last,
                        struct gp_stage_plan *out, struct gp_error *err);
void gp_plan_free(struct gp_stage_plan *p);

/* Values that carry gradients: float parameters and every float output of
 * a node with such an input in a differentiable slot. */
void gp_plan_needs_grad(const struct gp_graph *g, bool *needs);

#endif
