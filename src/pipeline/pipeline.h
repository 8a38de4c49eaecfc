/* The pipeline executor: a model's layer list cut into stages, one per
 * device, trained GPipe-style on micro-batches with checkpointed
 * recomputation, as torchgpipe does, with every dependency an event so the
 * host never waits inside a step's forward and backward.
 *
 * Each stage owns its parameters, gradients and optimizer state on its
 * device (a parameter read by several stages is held by each, its
 * gradients summed between them before the step); a stage boundary moves
 * the whole frontier at its cut (skip connections included) on a copy
 * stream of its own. All memory is planned
 * at creation from the static shapes; nothing is allocated while training. */
#ifndef GP_PIPELINE_PIPELINE_H
#define GP_PIPELINE_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/compute.h"
#include "backend/device.h"
#include "graph/graph.h"
#include "pipeline/schedule.h"
#include "train/optim.h"

struct gp_pipeline;

/* A pipeline spread over processes: this process runs stage `stage` only,
 * the other stages run in other processes (one each), and frontiers reach
 * them through these calls. Each blocks until the message went or came
 * (bytes known to both sides), fails rather than waiting forever, and must
 * let sends and receives of different threads run at once: a stage
 * receives on its receive streams while its copy streams send. Messages of
 * one tag from one stage to another arrive in the order sent. A stage on
 * a device that computes on host memory (a CPU device) sends and receives
 * its buffers through these from its stream tasks; one on a device with
 * memory of its own (a GPU) through the device links below.
 *
 * Data parallelism: `replicas` copies of the whole pipeline (0 or 1: one),
 * this process's stage being in copy `replica`. send and recv reach the
 * stages of the same replica. A mini-batch is replicas x n_micro
 * micro-batches, replica r's being numbers r x n_micro .. (r+1) x n_micro - 1
 * (their rows of the batch, their dropout masks): the same micro-batches as
 * one pipeline with replicas x n_micro of them. sum_f32 and sum_f64 (only
 * called when replicas > 1) replace data[n] by the sum over the replicas of
 * this stage of their data[n], in replica order ((r0 + r1) + r2) + ..., the
 * same bits on each; every replica of a stage makes the same calls in the
 * same order. */
struct gp_pipe_remote {
    int stage;
    int replica, replicas;
    void *ctx;
    gp_status (*send)(void *ctx, int to_stage, int tag, const void *buf, size_t bytes, struct gp_error *err);
    gp_status (*recv)(void *ctx, int from_stage, int tag, void *buf, size_t bytes, struct gp_error *err);
    gp_status (*sum_f32)(void *ctx, float *data, size_t n, struct gp_error *err);
    gp_status (*sum_f64)(void *ctx, double *data, size_t n, struct gp_error *err);
    /* Replicas: the stage's parameter gradients are summed in buckets of
     * about this many bytes (whole parameters; 0: GP_PIPE_BUCKET_BYTES),
     * each as soon as the last micro-batch's backward has made it final,
     * by a thread of the pipeline while the backward goes on (sum_f32 is
     * then called from that thread, one sum at a time, while the stage's
     * streams send and receive). The same bits however they are cut; every
     * replica of a stage must cut alike. */
    size_t bucket_bytes;
    /* Stages on GPUs (NULL for CPU stages): the frontiers, device memory,
     * go through device_send and device_recv, called from inside the
     * frontier task, which enqueue the transfer on that task's stream (a
     * copy stream for sends, a receive stream for receives) rather than
     * move it at once; the replicas' sums of device memory (gradients,
     * deferred BatchNorm statistics) through device_sum_f32/f64, which
     * return once done. Everything else (losses, reads, norms, tied
     * gradients) goes through host memory and send/recv. */
    gp_status (*device_send)(void *ctx, int to_stage, const void *buf, size_t bytes, struct gp_error *err);
    gp_status (*device_recv)(void *ctx, int from_stage, void *buf, size_t bytes, struct gp_error *err);
    gp_status (*device_sum_f32)(void *ctx, float *data, size_t n, struct gp_error *err);
    gp_status (*device_sum_f64)(void *ctx, double *data, size_t n, struct gp_error *err);
};

#define GP_PIPE_BUCKET_BYTES ((size_t)1 << 20)

struct gp_pipeline_config {
    const struct gp_graph *graph; /* loaded with batch = the micro-batch size */
    int n_stages;
    const int *balance;           /* layers per stage (sums to the layer count); NULL: even */
    const struct gp_device_ops *const *device_ops; /* per stage */
    const int *device_index;      /* per stage; stages may share a device */
    int n_micro;                  /* micro-batches per mini-batch */
    enum gp_pipe_schedule_kind schedule; /* the order of the step's work (schedule.h) */
    enum gp_checkpoint checkpoint;
    struct gp_optim_config optim;
    bool trace;                   /* record the timeline */
    /* BatchNorm running statistics updated once per mini-batch from all its
     * micro-batches (as one batch would), not once per micro-batch. */
    bool deferred_batch_norm;
    struct gp_loss_spec loss;     /* on the graph's first output, on the last stage */
    /* Precision (fp32, tf32, bf16: backend/compute.h) and the convolution
     * algorithm policy, for every stage. */
    struct gp_compute_options compute;
    /* --recompute-norm auto (compute.remake_norm is `always`): a stage
     * that would not fit on its device is planned again with its
     * BatchNorm outputs remade in the backward (pipeline/stage.c) before
     * the out-of-memory refusal. */
    bool remake_norm_if_short;
    /* > 0: bytes each stage may plan on its device, its free memory when
     * less (train --memory-limit): the fit check and auto's remaking
     * take it for the device's free memory. */
    size_t memory_limit;
    /* Profiling: every layer's forward and backward timed on its own (the
     * device waited for after each), for gp_pipeline_layer_times. Slows
     * the step; the balancer's profiler uses it. */
    bool time_layers;
    /* CUDA: capture the step (every stage's forward and backward, copies,
     * losses; with gp_pipeline_train_step the optimizer too: tied sums,
     * clipping, updates) as one CUDA graph at the second step and replay
     * it after, capturing again when what it baked in changes. Ignored
     * (with a note) where a backend cannot, with trace or time_layers, or
     * with stages in other processes (remote). */
    bool cuda_graph;
    /* NULL: every stage in this process. Otherwise this process runs one
     * stage (above) and its calls below are collective: every stage's
     * process makes the same calls in the same order. gp_pipeline_step
     * gives every process the loss (of every replica's micro-batches);
     * gp_pipeline_optimize first sums each stage's gradients (and deferred
     * BatchNorm statistics) over its replicas, then tied parameters'
     * gradients over their holders, and clips by the norm over every
     * stage; gp_pipeline_read (and gp_pipeline_read_optim) gives the
     * value to stage 0's process of replica 0 (and its holder's); writes
     * set the local stage's copy (every process writes every value); the
     * timeline is the local stage's, written by its process. Layer timing
     * is refused. */
    const struct gp_pipe_remote *remote;
};

/* How many steps took their inputs from an upload during the step before
 * (gp_step_opts.next_inputs). */
int64_t gp_pipeline_inputs_taken_ahead(const struct gp_pipeline *p);
/* The bytes of the first stage's buffer for uploads ahead that it gave up
 * to fit (its steps then copy their inputs at their start); 0 when none. */
size_t gp_pipeline_inputs_ahead_given_up(const struct gp_pipeline *p);
/* Whether a pipeline uploads the next step's inputs ahead (its first
 * stage then holds a second mini-batch of rows): by default in one
 * process, never with stages in other processes; GP_INPUTS_AHEAD=0 off. */
bool gp_pipeline_inputs_ahead_on(bool remote);

/* Per-step settings: the dropout key, and whether running statistics move;
 * and the next step's batch, when the caller has it already. */
struct gp_step_opts {
    uint64_t seed, step;
    double dropout_ratio;         /* < 0: the model's own */
    /* The next step's inputs (its x, in memory from gp_pipeline_host_alloc,
     * complete when this step is called and unchanged until the next has
     * run: not a buffer still being filled; NULL: not known): with
     * uploads ahead on when the pipeline was made (the default;
     * GP_INPUTS_AHEAD=0 turns them off), they are copied to the
     * first stage's device on a stream of their own while this step
     * computes (inputs_ahead.c), and the next step given the same x takes
     * them from there. */
    const void *next_inputs;
};

gp_status gp_pipeline_create(const struct gp_pipeline_config *cfg, struct gp_pipeline **out,
                             struct gp_error *err);
void gp_pipeline_free(struct gp_pipeline *p);

/* One mini-batch: x holds n_micro * micro-batch rows of the graph's data
 * input (in its dtype), targets as many rows of the loss's targets (NULL
 * for the output loss; labels already checked to be in range); with
 * replicas (remote), replicas times as many, of which this process's
 * replica takes its share. Runs every
 * forward (with the loss, its gradient scaled by 1/denominator) and
 * backward of the schedule; parameter gradients are left accumulated for
 * gp_pipeline_optimize. *loss_sum gets the sum of the loss terms. Both host
 * buffers may be reused once this returns. */
gp_status gp_pipeline_step(struct gp_pipeline *p, const void *x, const void *targets,
                           const struct gp_step_opts *o, double denominator, double *loss_sum,
                           struct gp_error *err);

/* Host memory for the batches and targets handed to gp_pipeline_step:
 * pinned where the first stage's backend has it (CUDA), so that a step
 * copies a batch lying in it to the device directly, at the link's speed,
 * and a caller can fill another batch while a step runs (not the one
 * given as gp_step_opts.next_inputs: that one is being read). Plain memory
 * otherwise (or when no page-locked memory is left). At most GP_PIPE_MAX_HOST_BUFS at a time (8); NULL when out of
 * memory or buffers. Freed by gp_pipeline_host_free or with the pipeline. */
void *gp_pipeline_host_alloc(struct gp_pipeline *p, size_t bytes);
void gp_pipeline_host_free(struct gp_pipeline *p, void *ptr);

/* Why the step is not a CUDA graph although cuda_graph asked for one, or
 * NULL; whether the last step ran as one. */
const char *gp_pipeline_graph_note(const struct gp_pipeline *p);
bool gp_pipeline_graphed(const struct gp_pipeline *p);

/* What a training step did. */
struct gp_step_outcome {
    double loss_sum;  /* the sum of the loss terms (every replica's micro-batches) */
    float grad_norm;  /* clipping: the gradients' total norm before clipping; 0 without */
    /* The optimizer step was taken. false: the step's loss, (sum of its
     * terms) / denominator, or the gradients' norm (when clipping) is not
     * finite, and the step changed no parameter, optimizer state or
     * deferred BatchNorm statistic (running statistics that the forward
     * itself updates have moved, as they would have before); the
     * gradients are cleared, and the optimizer's step count is unchanged. */
    bool applied;
};

/* Sums the gradients of parameters several stages hold (tied: each holder's
 * copy gets the sum, added in stage order), clips gradients to a global
 * norm over all stages, each parameter counted once (when clip_norm > 0),
 * and takes one optimizer step on every stage, unless the last
 * gp_pipeline_step's loss (or the norm) is not finite (out->applied).
 * The clipping coefficient and that decision are made on the host, from
 * the norms and losses copied there; the updates read their scalars from
 * device memory as gp_pipeline_train_step's do. out may be NULL; its
 * loss_sum is left alone. */
gp_status gp_pipeline_optimize(struct gp_pipeline *p, double lr, double clip_norm, struct gp_step_outcome *out,
                               struct gp_error *err);

/* gp_pipeline_step, then gp_pipeline_optimize with learning rate lr and
 * clip_norm, the same bits, as one piece of work: with every stage in this
 * process the optimizer runs on the devices right after the backward (tied
 * sums by copies between the holders, the clipping coefficient and the
 * decision to skip computed on the last stage's device from the norms
 * gathered there), so with CUDA graphs the whole step, optimizer included,
 * is one launch, and only the losses and the guard's result come back.
 * The learning rate and the step's other scalars go to the devices with
 * the batch, through device memory, so a schedule changes nothing in the
 * graph. Across processes (cfg.remote) it is gp_pipeline_step followed by
 * gp_pipeline_optimize, the sums going through the host. */
gp_status gp_pipeline_train_step(struct gp_pipeline *p, const void *x, const void *targets,
                                 const struct gp_step_opts *o, double denominator, double lr, double clip_norm,
                                 struct gp_step_outcome *out, struct gp_error *err);

/* Evaluation (no dropout) on one micro-batch: x has micro-batch rows; out
 * gets the graph's first output, float32. `batch_stats`: BatchNorm
 * normalizes by the micro-batch's own statistics (running ones otherwise,
 * never updated here). */
gp_status gp_pipeline_eval(struct gp_pipeline *p, const void *x, bool batch_stats, float *out,
                           struct gp_error *err);

/* The current value of a parameter or buffer, as float32. Remote stages
 * (cfg.remote): collective; out is filled on stage 0's process and on the
 * holder's, left alone elsewhere. */
gp_status gp_pipeline_read(struct gp_pipeline *p, int value, float *out, struct gp_error *err);

/* ---- what training keeps between steps (persist.c), for saved states ----
 * Called between steps only (after gp_pipeline_optimize or
 * gp_pipeline_train_step returned). */

/* Sets a parameter or buffer (float32 values [numel]) on every stage that
 * holds it. */
gp_status gp_pipeline_write(struct gp_pipeline *p, int value, const float *in, struct gp_error *err);
/* Optimizer state tensors per parameter (gp_optim_state_floats: SGD 1 with
 * momentum, else 0; AdamW 2), and their names in a saved state. */
int gp_pipeline_optim_slots(const struct gp_pipeline *p);
const char *gp_pipeline_optim_slot_name(const struct gp_pipeline *p, int slot);
/* Slot `slot` of parameter `value`'s optimizer state, [numel] float32. */
gp_status gp_pipeline_read_optim(struct gp_pipeline *p, int value, int slot, float *out, struct gp_error *err);
gp_status gp_pipeline_write_optim(struct gp_pipeline *p, int value, int slot, const float *in,
                                  struct gp_error *err);
/* Optimizer steps taken (PyTorch's state['step']: AdamW's bias corrections
 * and SGD's first-step momentum depend on it); the same on every stage.
 * A step that was not applied (gp_step_outcome) does not count. */
int64_t gp_pipeline_optim_steps(const struct gp_pipeline *p);
void gp_pipeline_set_optim_steps(struct gp_pipeline *p, int64_t steps);

struct gp_stage_report {
    int first_layer, last_layer;  /* layers [first, last) */
    int device;
    const char *backend;          /* "cpu", "cuda" */
    int64_t param_bytes, grad_bytes, optim_bytes, static_bytes; /* static: constants, buffers */
    int64_t activation_bytes;     /* planned: input frontiers, activation sets, gradients */
    /* Of those, per micro-batch: one box of its input frontier, one set of
     * its activations, one inbox of the gradients arriving for its output
     * frontier, and how many of each the schedule holds at once. */
    int64_t box_bytes, set_bytes, inbox_bytes;
    int frontier_boxes, activation_sets, gradient_inboxes;
    /* Of those too: the forward's arena and the gradient set, and whether
     * they share one block (the larger of the two; stage 0: plan.h). */
    int64_t arena_bytes, gradient_set_bytes;
    bool gradients_in_arena;
    /* --recompute-norm: values remade in the backward, and the activation
     * bytes that saves (the stage planned without them, less with). */
    int remade_values;
    int64_t remade_saved_bytes;
    /* Gradients whose last term their producer adds (plan.h, addend_off). */
    int gradient_addends;
    int64_t activation_peak;      /* the most in use at once, by the executor's accounting */
    int64_t frontier_in_bytes, frontier_out_bytes; /* per micro-batch */
    int64_t workspace_bytes;      /* kernel workspace and bf16's float32 staging */
    /* The first stage's blocks of data rows as they arrive: the step's
     * mini-batch (0 where the rows lie in its arena's block: stage.c,
     * inputs_in_block) and the next step's (inputs_ahead.c; also in
     * static_bytes; as bfloat16 where inputs_ahead_bf16). 0 on other
     * stages. */
    int64_t input_rows_bytes, inputs_ahead_bytes;
    bool inputs_ahead_bf16;
    int64_t planned_bytes;        /* everything allocated for the stage */
};

int gp_pipeline_stages(const struct gp_pipeline *p);

/* With time_layers: each layer's forward and backward milliseconds in the
 * last step, per micro-batch (the first forward, not a recomputation),
 * into fwd_ms[n_layers] and bwd_ms[n_layers]. */
void gp_pipeline_layer_times(const struct gp_pipeline *p, double *fwd_ms, double *bwd_ms);
void gp_pipeline_report(const struct gp_pipeline *p, int stage, struct gp_stage_report *out);
/* Every stage's report, out[K], known[K]. With stages in other processes
 * (cfg.remote) every stage's process must call it (its replica's stages
 * meet): stage 0's then knows them all, another's only its own (known[k]
 * false: the plan's figures, without that process's activation peak and
 * optimizer state). */
gp_status gp_pipeline_reports(struct gp_pipeline *p, struct gp_stage_report *out, bool *known, struct gp_error *err);

/* Stage 0 of each replica gets the texts of its replica's stages, `mine`
 * (may be NULL: none) first, then stage 1's and on, concatenated
 * (malloc'd into *out); every other stage's process sends its own and
 * gets *out NULL. With stages in other processes every stage's process
 * must call it at the same point; without, *out is a copy of mine. */
gp_status gp_pipeline_gather_texts(struct gp_pipeline *p, const char *mine, char **out, struct gp_error *err);

/* Writes the timeline of the last step as Chrome trace JSON (with stages
 * in other processes: this process's stage, trace.h's per-rank form). */
gp_status gp_pipeline_write_trace(struct gp_pipeline *p, const char *path, struct gp_error *err);

#endif
