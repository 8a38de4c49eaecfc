/* Running a model forward in evaluation mode (running statistics, no
 * dropout) over a dataset, in batches: what a trained model is for. */
#ifndef GP_TRAIN_PREDICT_H
#define GP_TRAIN_PREDICT_H

#include <stdbool.h>

#include "backend/compute.h"
#include "backend/device.h"
#include "data/dataset.h"
#include "util/error.h"

struct gp_predict_options {
    int64_t batch;               /* samples per forward pass */
    /* Batch statistics instead of running ones (each batch of `batch`
     * samples normalized by its own), dropout still off. */
    bool training;
    enum gp_precision precision;
    const struct gp_device_ops *device_ops; /* the backend (backend/backends.h) */
    int device_index;
    bool channels_last;          /* activations channels-last where they can be (graph/layout.h) */
};

/* The first graph output for every sample of `data` (in float32), in order;
 * the last batch is padded internally and the padding dropped. *out gets a
 * malloc'd tensor the caller frees with free(out->data). */
gp_status gp_predict(const char *model_path, const struct gp_dataset *data, const struct gp_predict_options *o,
                     struct gp_tensor *out, struct gp_error *err);

#endif
