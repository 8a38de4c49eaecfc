/* A training run saved and continued (train --save-state, --resume): the
 * run's settings a state records, the tensors it takes from the pipeline,
 * and what resuming checks and puts back, over the format in train/state.h.
 *
 * What may change on resume is what does not change the arithmetic: the
 * length of the run (--steps, --epochs; not under the cosine schedule,
 * whose shape depends on it), the stages and their devices, the balance
 * and the checkpoint mode (a pipeline gives one device's bits whatever
 * those), validation data, outputs and CUDA graphs. Moving between CPU and
 * GPU, or to --fast-conv, is allowed with a note: the run continues, but not
 * bit for bit. Everything else (model, data, batch, chunks, shuffling and
 * seed, loss, dropout, optimizer and its hyper-parameters, schedule,
 * clipping, precision, deferred BatchNorm) must be what it was. */
#ifndef GP_TRAIN_RESUME_H
#define GP_TRAIN_RESUME_H

#include <stddef.h>
#include <stdint.h>

#include "data/dataset.h"
#include "graph/graph.h"
#include "pipeline/pipeline.h"
#include "train/state.h"
#include "train/trainer.h"

/* What the trainer knows of its run. */
struct gp_resume_run {
    const struct gp_train_config *cfg;
    const struct gp_graph *g;
    struct gp_pipeline *pipe;
    const struct gp_dataset *train;
    enum gp_loss_kind loss;     /* resolved (not auto) */
    int class_axis;             /* resolved, for cross-entropy */
    int64_t steps_per_epoch, total_steps;
};

/* The run's settings into m (the model file and the data are hashed). */
gp_status gp_resume_settings(const struct gp_resume_run *r, struct gp_state_meta *m, struct gp_error *err);

/* Writes state m->step (the rest of m says where the run is) into
 * cfg->state_dir, keeping cfg->keep states; *path gets its folder. */
gp_status gp_resume_save(const struct gp_resume_run *r, const struct gp_state_meta *m, char *path, size_t path_size,
                         struct gp_error *err);

/* Checks that state s is of this model and a compatible run (settings
 * `now`) and puts its weights, buffers and optimizer state into the
 * pipeline. Notes (settings that may differ but did) go through note. */
gp_status gp_resume_restore(const struct gp_resume_run *r, struct gp_state *s, const struct gp_state_meta *now,
                            void (*note)(void *user, const char *message), void *user, struct gp_error *err);

#endif
