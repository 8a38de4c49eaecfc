/* A training run's mini-batches gathered ahead, on a worker thread, while
 * the steps run: gathering a shuffled batch is a host copy of the whole
 * batch (ResNet-50 at 128 samples: 77 MB, several milliseconds) that
 * otherwise leaves the device idle each step. Two steps ahead, so that the
 * next step's batch is whole while this step runs and its inputs can go to
 * the device meanwhile (gp_step_opts.next_inputs). The buffers come from
 * the pipeline (gp_pipeline_host_alloc: pinned on a GPU), so the steps copy
 * them to the device as they lie. */
#ifndef GP_TRAIN_PREFETCH_H
#define GP_TRAIN_PREFETCH_H

#include <stdbool.h>
#include <stdint.h>

#include "data/dataset.h"
#include "pipeline/pipeline.h"
#include "util/error.h"

struct gp_prefetch;

/* Batches of `batch` rows of d, step s taking rows [s % per_epoch * batch,
 * + batch) of epoch s / per_epoch's order (gp_dataset_order with shuffle
 * and seed): the trainer's visiting order. Buffers from pipe's host memory,
 * or plain memory when pipe is NULL. */
gp_status gp_prefetch_create(struct gp_pipeline *pipe, const struct gp_dataset *d, int64_t batch,
                             int64_t per_epoch, bool shuffle, uint64_t seed, struct gp_prefetch **out,
                             struct gp_error *err);

/* Step `step`'s inputs and labels (labels NULL without them), valid until
 * the next call, and step `next`'s inputs (*x_next; NULL when next < 0 or
 * x_next is NULL), valid until the call after it: both gathered by now,
 * waiting for the worker when it was gathering one, gathering here what it
 * was not. Then starts gathering step `after` (< 0: none) on the worker,
 * into the third buffers. */
void gp_prefetch_get(struct gp_prefetch *f, int64_t step, int64_t next, int64_t after, const void **x,
                     const void **labels, const void **x_next);

/* Waits for the worker and frees the buffers. */
void gp_prefetch_free(struct gp_prefetch *f);

#endif
