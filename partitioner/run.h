/* Profiling and balancing in one call, as `balance` and `train --balance`
 * (and the library's gpo_balance) do it: the model loaded at the
 * micro-batch size in the layout the stages will train in, its layers timed
 * on the stages' device type (the first GPU of the list when there is one,
 * copies timed to the next distinct GPU; else the CPU, each device with its
 * share of the cores) or a saved profile read, then the exact split. */
#ifndef GP_PARTITIONER_RUN_H
#define GP_PARTITIONER_RUN_H

#include <stdbool.h>

#include "backend/compute.h"
#include "graph/layout.h"
#include "partitioner/balance.h"

struct gp_balance_run {
    const char *model;                  /* the .onnx file */
    const struct gp_balance_config *cfg;
    int repeats;                        /* timed runs per layer */
    const bool *cuda;                   /* [cfg->n_stages]: the stage's device is a GPU */
    const int *device;                  /* [cfg->n_stages]: its index */
    enum gp_precision precision;
    enum gp_layout_policy layout;
    bool fast_conv;                     /* GPU: cuDNN's fastest convolution algorithms (compute.h) */
    bool remake_norm;                   /* train --recompute-norm always: gp_profile_remake */
    const char *profile_in;             /* read this profile instead of timing (NULL: time) */
    const char *profile_out;            /* save the profile here (NULL: not saved) */
    void (*progress)(void *user, int done, int total); /* after each pass over the model; may be NULL */
    void *user;
};

/* On success *prof holds the profile (gp_profile_free) and *rep the report. */
gp_status gp_balance_run(const struct gp_balance_run *run, struct gp_profile *prof, struct gp_balance_report *rep,
                         struct gp_error *err);

#endif
