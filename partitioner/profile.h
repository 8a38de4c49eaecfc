/* The per-layer profile the balancer splits by: each layer of the list run
 * alone, forward and backward, with its real inputs (whatever its position:
 * the whole model runs once first, so skip connections carry real values),
 * on the target device type, at the real micro-batch size. */
#ifndef GP_PARTITIONER_PROFILE_H
#define GP_PARTITIONER_PROFILE_H

#include <stdint.h>

#include "backend/compute.h"
#include "graph/graph.h"
#include "util/error.h"

struct gp_layer_profile {
    char op[32];
    double forward_ms, backward_ms; /* medians over the timed repeats */
    int64_t param_bytes;            /* parameters the layer owns (first reader) */
    /* Tied parameters: those it reads that an earlier layer owns. A stage
     * holding this layer but not `tied_prev` (the latest earlier layer
     * reading one of them; -1: none) holds a copy of them (pipeline/tied.c).
     * From the model, never from a saved profile. */
    int64_t tied_bytes;
    int tied_prev;
    int64_t activation_bytes;       /* what it keeps for backward: the outputs some backward reads
                                       (gp_plan_backward_kept) and its saved state */
    int64_t frontier_bytes;         /* at the cut after it, per micro-batch */
    /* What lives only while it runs: its inputs and outputs that no
     * backward keeps (its forward), or the gradients of its outputs and
     * activation inputs (its backward), the larger. A stage's one block for
     * such values (pipeline/plan.c: the forward-only arena, the gradients
     * its sets' dead bytes cannot hold) is about its largest layer's, not
     * the sum over its layers. */
    int64_t peak_bytes;
};

struct gp_profile {
    char model[256];
    char device[32];                /* "cpu" */
    char precision[8];              /* "fp32", "tf32", "bf16": what times and bytes were measured in */
    bool fast_conv;                 /* timed with cuDNN's fastest convolution algorithms (GPU) */
    int64_t micro_batch;
    int n_layers;
    int64_t input_frontier_bytes;   /* at the cut before layer 0 */
    /* The data input's rows per micro-batch in the model's own type (float
     * images: 4 bytes an element), as the first stage receives them; from
     * the model, never from a saved profile. */
    int64_t input_bytes;
    double copy_gbps;               /* measured bandwidth of a frontier copy between devices */
    struct gp_layer_profile *layers;
};

/* Profiles every layer of g (loaded at the micro-batch size) on the CPU:
 * `warmup` untimed runs, then the median of `repeats`, with `threads`
 * kernel threads: those a CPU device of the pipeline will have (the cores
 * shared among the devices), or the times would not be the stage's.
 * `progress` (may be NULL) is called after each pass over the model. */
gp_status gp_profile_cpu(const struct gp_graph *g, const char *model_name, int threads, int warmup,
                         int repeats,
                         void (*progress)(void *user, int done, int total), void *user,
                         struct gp_profile *out, struct gp_error *err);

/* Saved as JSON so balancing is repeatable without the hardware; loading
 * checks the layer count and ops against the model. */
gp_status gp_profile_save(const struct gp_profile *p, const char *path, struct gp_error *err);
gp_status gp_profile_load(const char *path, const struct gp_graph *g, struct gp_profile *out,
                          struct gp_error *err);

/* The same measured on a device of a backend (CUDA: the GPU itself): the
 * model as one pipeline stage on device `index`, every layer's forward and
 * backward timed inside whole training steps with the device waited for
 * after each layer. copy_gbps is measured from device `index` to device
 * `peer` (the same device when peer < 0). */
struct gp_device_ops;
struct gp_compute_options;
gp_status gp_profile_device(const struct gp_graph *g, const char *model_name, const struct gp_device_ops *ops,
                            int index, int peer, const struct gp_compute_options *compute, int warmup, int repeats,
                            void (*progress)(void *user, int done, int total), void *user,
                            struct gp_profile *out, struct gp_error *err);

void gp_profile_free(struct gp_profile *p);

/* For profilers: each layer's op and bytes (parameters, what it keeps with
 * saved_bytes its kernels' saved state, frontier) as stored in `precision`
 * (bf16: float activations and frontiers take 2 bytes an element), and the
 * median of v[n] (v is reordered). */
struct gp_layers;
void gp_profile_fill_bytes(const struct gp_graph *g, const struct gp_layers *l,
                           size_t (*saved_bytes)(const struct gp_graph *, const struct gp_node *),
                           enum gp_precision precision, struct gp_profile *out);
double gp_profile_median(double *v, int n);

/* The profile of a training that remakes normalization outputs in the
 * backward (train --recompute-norm always; `remakes` the stages' kernels'
 * gp_compute_ops.remakes): each output a stage holding the whole graph
 * would remake (gp_plan_backward_kept) leaves its layer's activation
 * bytes, and the layer's backward gains its forward's time. An output a
 * cut sends to the next stage is kept there after all (the stage then
 * holds a little more than counted). Left unchanged when out of memory. */
void gp_profile_remake(const struct gp_graph *g, size_t (*saved_bytes)(const struct gp_graph *, const struct gp_node *),
                       bool (*remakes)(const struct gp_graph *, const struct gp_node *), enum gp_precision precision,
                       struct gp_profile *prof);

#endif
