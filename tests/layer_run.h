/* One layer of a loaded graph run forward and backward on any backend (its
 * device and compute ops) in any precision, from host data, the way the
 * executor runs it: storage types as the stage plan gives them (bf16:
 * activations, their gradients and the weights matrix products read in
 * bfloat16; parameters' gradients float32), kernels without bfloat16
 * support staged through float32 (backend/mixed_call.h). For comparing a
 * precision with another and a backend with another, layer by layer. */
#ifndef GP_TESTS_LAYER_RUN_H
#define GP_TESTS_LAYER_RUN_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/compute.h"
#include "backend/device.h"
#include "graph/graph.h"

#define LAYER_RUN_MAX_IO 16

/* Host data, float32 for every float tensor. Inputs are drawn once
 * (layer_run_inputs) and used by every run; results are the run's. */
struct layer_io {
    void *in[LAYER_RUN_MAX_IO];     /* inputs: activations random, initializers the model's */
    float *dout[LAYER_RUN_MAX_IO];  /* incoming gradients, random; NULL for non-float outputs */
    float *din0[LAYER_RUN_MAX_IO];  /* what the input gradients hold before backward */
    bool want_din[LAYER_RUN_MAX_IO];
    bool backward;                  /* the node has a backward and something to differentiate */
    uint32_t din_overwrite;         /* gp_layer_call.din_overwrite of the backward (0: add into din0) */
    /* Results. */
    void *out[LAYER_RUN_MAX_IO];
    float *din[LAYER_RUN_MAX_IO];
};

/* Inputs for layer `layer` of g: floats uniform in [-2, 2), integer data
 * below index_bound, initializers as the model has them. Fixed seed. */
void layer_run_inputs(const struct gp_graph *g, int layer, int64_t index_bound, struct layer_io *io);
/* The same, with element i of a graph input `name` from gen when it gives
 * a number (not NAN): the op tests' generators (indices, positive-only). */
void layer_run_inputs_gen(const struct gp_graph *g, int layer, int64_t index_bound,
                          double (*gen)(const char *name, int64_t i, void *user), void *user,
                          struct layer_io *io);

/* Runs it on device `index` of ops in precision p: fills io->out and
 * io->din (float32 on the host, bfloat16 results widened). Fails the test
 * with `label` on any error. */
void layer_run(const struct gp_device_ops *ops, int index, enum gp_precision p, const struct gp_graph *g,
               int layer, const char *label, struct layer_io *io);

void layer_run_free_results(const struct gp_graph *g, int layer, struct layer_io *io);
void layer_run_free(const struct gp_graph *g, int layer, struct layer_io *io);

/* Compares a run's float tensor with a reference's: element i agrees when
 * |a - b| <= rel * (|b| + rms(b)) (rms over the tensor); at most
 * `flips` of the elements, plus one, may disagree (a rounded input moved an argmax or
 * a kink: MaxPool, ReLU at 0). Returns the worst |a - b| / (|b| + rms(b));
 * fails the test naming the tensor and element when the bound is broken. */
double layer_compare(const char *label, const char *tensor, int index, const float *a, const float *b, int64_t n,
                     double rel, double flips);

/* Compares every float output and input gradient of two runs (a against
 * the reference b); integer outputs (argmax, comparisons, casts) exactly
 * but for the same share of flips. Returns the worst relative distance. */
double layer_compare_all(const struct gp_graph *g, int layer, const char *label, const struct layer_io *a,
                         const struct layer_io *b, double rel, double flips);

/* Every layer of g, from the same inputs (layer_run_inputs_gen), run on
 * ops_a in precision a and on the reference ops_b in precision b, compared
 * with layer_compare_all; labels start with `name`. Returns the worst
 * relative distance, and its layer in *worst_layer (-1 when all equal). */
double layer_run_compare_graph(const struct gp_graph *g, const char *name, int64_t index_bound,
                               double (*gen)(const char *name, int64_t i, void *user), void *user,
                               const struct gp_device_ops *ops_a, enum gp_precision a,
                               const struct gp_device_ops *ops_b, enum gp_precision b, double rel, double flips,
                               int *worst_layer);

#endif
