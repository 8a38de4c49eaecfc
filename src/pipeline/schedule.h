/* A pipeline schedule as data: the actions of one training step, in the
 * order the host issues them. Each action runs on its stage's device; the
 * executor derives sends and receives of frontiers from the dependencies
 * (a forward needs the previous stage's forward of the same micro-batch, a
 * backward the next stage's backward), so a generator only orders work.
 *
 * Two generators: GPipe's fill-drain and 1F1B (PipeDream-flush). Both run
 * every stage's backwards in micro-batch order 0..M-1, so parameter
 * gradients (which backward kernels accumulate with +=) are summed in the
 * same order by both: the schedules give the same gradients bit for bit,
 * and differ only in when work runs and in how many micro-batches'
 * activations a stage holds at once (slots.h derives that from the list).
 *
 * The executor does not know which generator made a schedule. */
#ifndef GP_PIPELINE_SCHEDULE_H
#define GP_PIPELINE_SCHEDULE_H

#include <stdbool.h>

#include "util/error.h"

enum gp_checkpoint {
    GP_CHECKPOINT_NEVER,       /* keep every micro-batch's activations */
    GP_CHECKPOINT_EXCEPT_LAST, /* recompute all but a micro-batch whose backward follows its forward (default) */
    GP_CHECKPOINT_ALWAYS,      /* recompute every micro-batch */
};

const char *gp_checkpoint_name(enum gp_checkpoint c);

/* Which generator orders the step (`--pipeline-schedule`). */
enum gp_pipe_schedule_kind {
    GP_PIPE_GPIPE, /* fill-drain: every forward, then every backward (default) */
    GP_PIPE_1F1B,  /* PipeDream-flush: after a warm-up, one forward then one backward */
};

const char *gp_pipe_schedule_name(enum gp_pipe_schedule_kind kind); /* "gpipe", "1f1b" */
bool gp_pipe_schedule_parse(const char *name, enum gp_pipe_schedule_kind *out);

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
    enum gp_pipe_schedule_kind kind;
    enum gp_checkpoint checkpoint;
    int n_stages, n_micro;
    int n_actions;
    struct gp_action *actions; /* in issue order */
};

/* Checkpointing, for every generator: `never` keeps each micro-batch's
 * activations until its backward, `always` keeps only its input frontier
 * and recomputes the rest right before the backward. `except_last` is
 * torchgpipe's rule by its reason: a micro-batch whose backward is the very
 * next action of its stage after its forward is not recomputed (its
 * activations are still in the one working set: recomputing them would buy
 * no memory), every other one is. That was GPipe's last micro-batch while
 * its backward ran last micro-batch first; with the backward in micro-batch
 * order it holds for none when M > 1 (so except_last then recomputes as
 * always does, in the same memory), and under 1F1B for every micro-batch of
 * the last stage (which then recomputes nothing, still in one set). */

/* Every stage's actions are issued clock by clock (at most one forward or
 * backward per stage per clock, an action at the first clock after what it
 * waits for), so everything an action waits for was issued before it.
 * Within a clock the later stages come first: under GPipe the next stage's
 * backward of micro-batch j is then issued before this stage's of j - 1, so
 * the gradients it sends find a free inbox (this stage holds two) instead of
 * waiting for that backward. A recomputation is issued right before its
 * backward, at its clock. */

/* GPipe's fill-drain: at forward clock c stage k runs micro-batch c - k;
 * the backward diagonal follows from the last stage, micro-batch 0 first. */
gp_status gp_pipe_schedule_gpipe(int n_stages, int n_micro, enum gp_checkpoint mode,
                                 struct gp_pipe_schedule *out, struct gp_error *err);

/* 1F1B (PipeDream-flush, Narayanan et al. 2021): stage k runs
 * w = min(M, K-1-k) warm-up forwards, then alternates the forward of
 * micro-batch w+i with the backward of micro-batch i, then the remaining
 * backwards. Stage k holds at most min(M, K-k) micro-batches between their
 * forward and their backward, where GPipe holds M; the bubble is GPipe's. */
gp_status gp_pipe_schedule_1f1b(int n_stages, int n_micro, enum gp_checkpoint mode,
                                struct gp_pipe_schedule *out, struct gp_error *err);

/* The generator of `kind`. */
gp_status gp_pipe_schedule_make(enum gp_pipe_schedule_kind kind, int n_stages, int n_micro,
                                enum gp_checkpoint mode, struct gp_pipe_schedule *out, struct gp_error *err);

void gp_pipe_schedule_free(struct gp_pipe_schedule *s);

#endif
