/* What a schedule asks of each stage's memory: how many input-frontier
 * boxes, gradient inboxes and activation sets a stage needs at once, which
 * of each every micro-batch uses, and what a write into a reused one waits
 * for. The stage allocates the per-micro-batch bytes of plan.h times these
 * counts, the executor addresses by these slots and issues by these waits,
 * and the balancer counts with them: all three follow the schedule,
 * whatever its generator.
 *
 * Everything is derived from the issue order. On stage k micro-batch j
 * occupies
 *   a box     from its forward to its backward (its in-flight time): the
 *             previous stage's copy fills it when the previous occupant's
 *             backward has been issued too, so a copy may be issued after
 *             the forward that made it (it then waits on the device for
 *             that backward);
 *   an inbox  from the next stage's backward (whose copy fills it; on the
 *             last stage its own forward, whose loss writes the gradient)
 *             to its backward;
 *   a set     from its forward to its backward when kept; when
 *             checkpointed, at its forward alone and again from its
 *             recomputation to its backward.
 * A slot is reused by an occupation that starts after the previous one
 * ended (strictly), lowest free slot first: for intervals that is optimal,
 * the count is the most occupied at once. Every wait the executor adds is
 * then on an event of something issued before the wait, which keeps a step
 * free of deadlocks and races (CUDA and the CPU devices ignore a wait on an
 * event not yet recorded), and the planning checks that a copy issued late
 * still finds its source in the sending stage.
 *
 * Stage k of K holds M micro-batches in flight under GPipe, min(M, K-k)
 * under 1F1B: that many boxes, and that many sets without checkpointing
 * (one with it). */
#ifndef GP_PIPELINE_SLOTS_H
#define GP_PIPELINE_SLOTS_H

#include <stdbool.h>

#include "pipeline/schedule.h"
#include "util/error.h"

struct gp_stage_slots {
    int n_micro;
    int n_boxes, n_inboxes, n_sets;
    int n_checkpointed;       /* micro-batches recomputed before their backward */
    /* Per micro-batch [n_micro]: */
    int *box, *inbox;         /* its box and gradient inbox */
    int *fwd_set, *bwd_set;   /* the set its forward writes; the one its recomputation and backward use */
    bool *checkpointed;       /* recomputed before its backward */
    /* The previous stage's forward copy of j into this stage's box is
     * issued right after action copy_after[j] of the schedule (-1 on stage
     * 0, whose forward loads its own box); non-decreasing in j. */
    int *copy_after;
    /* What a write into a reused slot waits for (-1: nothing): the
     * micro-batch whose backward on this stage last read that box or inbox
     * (its bwd_done event), and the one whose forward last wrote that set
     * when it was the set's previous occupant (its fwd_copied event: its
     * output frontier may still be leaving). */
    int *box_after, *inbox_after, *fwd_set_after, *bwd_set_after;
};

/* Every stage of schedule s, into out[0 .. s->n_stages). Checks the
 * schedule too: each micro-batch has one forward and one backward per
 * stage, at most one recomputation, between them, and every action comes
 * after what it waits for. */
gp_status gp_pipe_slots_plan(const struct gp_pipe_schedule *s, struct gp_stage_slots *out, struct gp_error *err);

void gp_stage_slots_free(struct gp_stage_slots *s);

#endif
