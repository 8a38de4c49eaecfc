/* A pipeline schedule as data: the actions of one training step, in the
 * order the host issues them. Each action runs on its stage's device; the
 * executor derives sends and receives of frontiers from the dependencies
 * (a forward needs the previous stage's forward of the same micro-batch, a
 * backward the next stage's backward), so a generator only orders work.
 *
 * The executor does not know which generator made a schedule. */
#ifndef GP_PIPELINE_SCHEDULE_H
#define GP_PIPELINE_SCHEDULE_H

#include "util/error.h"

enum gp_checkpoint {
    GP_CHECKPOINT_NEVER,       /* keep every micro-batch's activations */
    GP_CHECKPOINT_EXCEPT_LAST, /* recompute all but the last micro-batch (default) */
    GP_CHECKPOINT_ALWAYS,      /* recompute every micro-batch */
};

const char *gp_checkpoint_name(enum gp_checkpoint c);

enum gp_action_kind {
    GP_ACT_FORWARD,   /* forward of a stage for a micro-batch (the last stage adds the loss) */
    GP_ACT_RECOMPUTE, /* forward again from the kept input frontier, before backward */
    GP_ACT_BACKWARD,
};

struct gp_action {
    enum gp_action_kind kind;
    int stage, microbatch;
    int clock; /* the clock cycle, for reports */
};

struct gp_pipe_schedule {
    int n_stages, n_micro;
    int n_actions;
    struct gp_action *actions; /* in issue order */
};

/* Whether micro-batch j of an M-micro-batch step is checkpointed (its
 * activations are dropped after forward and recomputed before backward). */
int gp_checkpointed(enum gp_checkpoint mode, int j, int n_micro);

/* GPipe's fill-drain: at forward clock c stage k runs micro-batch c - k;
 * the backward mirrors it, last micro-batch first, each checkpointed one
 * preceded by its recomputation. */
gp_status gp_pipe_schedule_gpipe(int n_stages, int n_micro, enum gp_checkpoint mode,
                            struct gp_pipe_schedule *out, struct gp_error *err);

void gp_pipe_schedule_free(struct gp_pipe_schedule *s);

#endif
