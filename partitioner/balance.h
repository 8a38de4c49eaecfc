/* Balancing: from a per-layer profile to stages, by time or by memory, and
 * the figures that explain the choice (per-stage load, imbalance, predicted
 * step time and throughput, bubble), with the even split and torchgpipe's
 * heuristic beside the optimum.
 *
 * The model follows the schedule the run will use (pipeline/slots.h): a
 * stage's activations count once per activation set it holds, its input
 * frontier once per box and the gradients for it once per inbox of the
 * stage before, and its recomputation for the micro-batches it recomputes.
 * Under 1F1B these depend on the stage (stage k holds min(M, K-k)
 * micro-batches), so the partition weighs layers by stage. */
#ifndef GP_PARTITIONER_BALANCE_H
#define GP_PARTITIONER_BALANCE_H

#include <stdbool.h>
#include <stdint.h>

#include "partitioner/partition.h"
#include "partitioner/profile.h"
#include "pipeline/schedule.h"

enum gp_balance_by { GP_BALANCE_TIME, GP_BALANCE_MEMORY };

struct gp_balance_config {
    enum gp_balance_by by;
    int n_stages;
    int64_t batch;           /* mini-batch */
    int n_micro;             /* micro-batches per mini-batch */
    enum gp_pipe_schedule_kind schedule; /* GPipe (default) or 1F1B: what a stage holds at once */
    enum gp_checkpoint checkpoint;
    int optim_state_floats;  /* per parameter: 0 plain SGD, 1 momentum, 2 AdamW */
    bool inputs_ahead;       /* the first stage also holds the next step's rows (pipeline/inputs_ahead.c) */
};

struct gp_stage_figures {
    int first_layer, last_layer;   /* layers [first, last) */
    double time_ms;                /* per micro-batch: forward, backward, recompute, receive */
    int64_t memory_bytes;          /* parameters, gradients, optimizer state, activations, and the
                                      first stage's inputs (kernel workspaces and the last stage's
                                      targets are left out) */
    int64_t frontier_in_bytes, frontier_out_bytes;
};

struct gp_split_report {
    int k;
    struct gp_stage_figures stages[GP_MAX_STAGES];
    double max_time_ms, mean_time_ms, imbalance; /* imbalance = max / mean of the objective */
    int64_t max_memory_bytes;
    double predicted_step_ms, throughput;        /* samples per second */
};

struct gp_balance_report {
    struct gp_balance_config cfg;
    struct gp_split_report optimal, even, heuristic;
    double bubble;            /* (K - 1) / (M + K - 1) */
    int suggested_chunks;     /* smallest M dividing the batch with bubble <= 10% */
};

gp_status gp_balance(const struct gp_profile *prof, const struct gp_balance_config *cfg,
                     struct gp_balance_report *out, struct gp_error *err);

/* The report's optimal split as layers per stage (the --balance list). */
void gp_balance_counts(const struct gp_split_report *r, int *counts);

#endif
