/* A dataset in memory: inputs and optional labels, one sample per row of
 * axis 0, and the per-epoch order in which the trainer visits them. */
#ifndef GP_DATA_DATASET_H
#define GP_DATA_DATASET_H

#include <stdbool.h>
#include <stdint.h>

#include "graph/tensor.h"
#include "util/error.h"

struct gp_dataset {
    struct gp_tensor x;   /* [n, ...] in the model input's dtype */
    struct gp_tensor y;   /* [n, ...] labels (int64) or targets (float32); dtype UNDEFINED when absent */
    int64_t n;
    void *owned_x, *owned_y; /* buffers this dataset frees */
    const char *x_source, *y_source; /* where x and y came from (files), for messages; NULL: unnamed */
};

/* Sample order for one epoch: 0..n-1, or a Fisher-Yates shuffle driven by
 * a counter-based generator keyed by (seed, epoch), so a run can resume at
 * any epoch and give the same order. */
void gp_dataset_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch, int64_t *order);

/* Copies rows order[first .. first+count) of t into dst (contiguous). Rows
 * past the end of `order` (count > available) are filled by repeating the
 * last available row: used to pad the last validation chunk, whose padded
 * rows the caller then ignores. */
void gp_dataset_gather(const struct gp_tensor *t, const int64_t *order, int64_t n_order,
                       int64_t first, int64_t count, void *dst);

/* Bytes of one row (sample) of t. */
size_t gp_dataset_row_bytes(const struct gp_tensor *t);

void gp_dataset_free(struct gp_dataset *d);

/* Refuses non-finite floats (NaN, infinities) in the inputs or targets,
 * before training rather than as a diverged loss: the message names the
 * source (x_source / y_source, else `what` data / targets), the sample and
 * its element. */
gp_status gp_dataset_check_finite(const struct gp_dataset *d, const char *what, struct gp_error *err);

struct gp_npy;

/* A dataset for the model at model_path from arrays read from .npy files:
 * x must have the model input's per-sample shape (it is converted to the
 * input's dtype); y (optional) must have as many rows, and becomes int64
 * labels when integer, float32 targets when floating. Takes over the
 * arrays' data (they are left empty). Errors name both shapes. */
gp_status gp_dataset_from_arrays(const char *model_path, struct gp_npy *x, struct gp_npy *y,
                                 struct gp_dataset *out, struct gp_error *err);

/* n random samples shaped for the model: float inputs uniform in [-1, 1),
 * integer inputs (token ids) uniform below the size of the table they index;
 * labels are classes below the output's class count for [N, C] and [N, T, C]
 * outputs, float targets otherwise. For benchmarks. */
gp_status gp_dataset_synthetic(const char *model_path, int64_t n, uint64_t seed,
                               struct gp_dataset *out, struct gp_error *err);

#endif
