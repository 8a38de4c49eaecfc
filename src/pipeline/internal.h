/* The pipeline executor's internals, shared by its files: the stage and
 * pipeline structures, where a value lives, and the functions one part
 * calls in another.
 *   stage.c     a stage's plan, device memory, streams, events, optimizer
 *   tasks.c     what runs inside a task: layers forward and backward, the
 *               loss, the optimizer step
 *   graph.c     the step captured as one CUDA graph and replayed
 *   optimizer.c the optimizer part of a step: scalars, the guard, clipping,
 *               tied sums on the devices, or through the host
 *   remote.c    stages in other processes: frontiers, losses and reads
 *               sent and received (cfg.remote)
 *   tied.c      parameters held by several stages: their gradients summed
 *   buckets.c   replicas' gradient sums overlapped with the backward
 *   pipeline.c  creation, and issuing steps, evaluation and reads */
#ifndef GP_PIPELINE_INTERNAL_H
#define GP_PIPELINE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/compute.h"
#include "graph/layers.h"
#include "ops/registry.h"
#include "pipeline/pipeline.h"
#include "pipeline/plan.h"
#include "pipeline/slots.h"

/* Host buffers a pipeline hands out (gp_pipeline_host_alloc): a trainer
 * double-buffers its batch and targets. */
#define GP_PIPE_MAX_HOST_BUFS 8

enum task_kind {
    TASK_FORWARD, TASK_RECOMPUTE, TASK_BACKWARD, TASK_OPTIMIZE, TASK_NORMS, TASK_EVAL,
    /* The optimizer on the devices (optimizer.c): another holder's gradient
     * of tied parameter `micro` added into its first holder's; the guard. */
    TASK_TIED_ADD, TASK_GUARD,
    /* A frontier to or from a stage in another process (remote.c). */
    TASK_SEND_ACTIVATIONS, TASK_RECV_ACTIVATIONS, TASK_SEND_GRADIENTS, TASK_RECV_GRADIENTS,
};

struct task {
    struct gp_pipeline *p;
    int stage, micro;
    enum task_kind kind;
};

struct stage {
    struct gp_stage_plan plan;
    const struct gp_device_ops *ops;
    const struct gp_compute_ops *cops;
    void *cctx;                    /* the backend's per-stage context */
    struct gp_device *dev;
    int device;
    struct gp_stream *compute, *copy_next, *copy_prev;
    /* Receives from a stage in another process (remote.c), on streams of
     * their own so that a transfer overlaps the compute stream's work: the
     * previous stage's activations into micro-batch j's box on recv_prev,
     * then act_in[j]; the next stage's gradients into j's inbox on
     * recv_next, then grad_in[j]. NULL where that neighbour is local (or
     * absent). */
    struct gp_stream *recv_prev, *recv_next;
    struct gp_event **act_in, **grad_in; /* per micro-batch */
    unsigned char *static_block, *param_grads, *boxes, *locals, *grads, *inboxes, *scratch;
    /* Last stage: the mini-batch's targets (per micro-batch) and the loss
     * sums the backend writes (doubles, per micro-batch). Every stage:
     * its parameters' gradient norms (floats), for clipping. */
    unsigned char *targets, *loss_sums, *norms;
    unsigned char *inputs;         /* first stage: the mini-batch's data, as the host gave it */
    bool inputs_inside;            /* inputs lie in the arena's block (stage.c, inputs_in_block) */
    unsigned char *step_dev;       /* the step number (uint64) the dropout masks are keyed by, for graphs */
    /* The step's optimizer scalars (struct gp_optim_scalars) its optimizer
     * kernels read; the last stage's are the guard's (optimizer.c). */
    unsigned char *scalars;
    /* Last stage, optimizer on the devices: every stage's parameter norms
     * gathered (floats, stage k's at norm_base[k]) and the order the guard
     * reads them in (int32, n_norms). First holder of tied parameters:
     * another holder's gradient, copied here to be added. Their bytes. */
    unsigned char *norms_all, *norm_order, *tied_scratch;
    size_t optimizer_bytes;
    /* The optimizer on the devices: the stage's gradients are final (tied
     * parameters), the tied sums it makes are done, the stage is ready for
     * the guard, the guard is done (the last stage's). */
    struct gp_event *grads_final, *tied_done, *ready, *guard_done;
    unsigned char *libs;           /* the backend's library workspace (cuBLAS) */
    unsigned char *arena;          /* forward-only activations, shared by the micro-batches */
    unsigned char *step_block, *step_grads; /* values made once per step, and their gradients */
    unsigned char *shadows;        /* bf16: bfloat16 copies of the weights matrix products read */
    unsigned char *filters;        /* channels-last float32 copies of convolution filters (plan.h) */
    unsigned char *filter_grads;   /* and of their gradients */
    unsigned char *inputs_ahead;   /* stage 0: the next step's inputs, uploaded during this step */
    unsigned char *staging;        /* bf16: float32 copies for kernels that compute in float32 */
    bool once_valid;               /* the once-per-step layers have run for this step (or evaluation) */
    int backwards_done;            /* micro-batches' backwards of this step so far */
    unsigned char *optim_state;
    /* Which box, inbox and activation set each micro-batch uses, how many
     * of each there are, and what reusing one waits for (slots.h). */
    struct gp_stage_slots slots;
    struct gp_event **fwd_done, **fwd_copied, **bwd_done, **bwd_copied; /* per micro-batch */
    double **bn_stats;             /* per layer of the stage: deferred BatchNorm sums, or NULL */
    struct gp_optim *opt;
    struct gp_param *params;
    int n_params;
    /* Kernel argument arrays, reused: a stage's tasks run one at a time. */
    void **in, **out;
    float **din, **dout;
    const float **param_grad_ptrs; /* per parameter, for norms */
    int *param_values;             /* per parameter: its value id */
    int64_t *param_numels;
    int width;
    int64_t live, peak;            /* activation bytes in use, and the most at once */
    double *fwd_ms, *bwd_ms;       /* time_layers: per layer of the stage, summed over a step */
    const void **kernels;          /* per layer of the stage: the backend's kernel */
    size_t optim_bytes_planned;
    /* --recompute-norm: the values the plan remakes in the backward
     * (plan.h) and the activation bytes that saves on this stage. */
    int remade_values;
    size_t remade_saved_bytes;
};

/* A parameter held by several stages (tied.c): its holders in stage order. */
struct gp_pipe_tied {
    int value, n;
    int *holders;
    int64_t numel;
};

/* Message tags between stages of one replica (remote.c, tied.c). */
enum {
    GP_PIPE_TAG_ACTIVATIONS = 1,
    GP_PIPE_TAG_GRADIENTS = 2,
    GP_PIPE_TAG_LOSSES = 3,
    GP_PIPE_TAG_READ = 4,
    GP_PIPE_TAG_TIED = 5,
    GP_PIPE_TAG_NORMS = 6,
    GP_PIPE_TAG_OUTPUTS = 7,
    GP_PIPE_TAG_REPORT = 8,
    GP_PIPE_TAG_TEXT = 9,
};

struct gp_pipeline {
    struct gp_pipeline_config cfg;
    const struct gp_graph *g;
    struct gp_layers layers;
    bool *needs_grad;
    int K, M;
    int64_t micro;                 /* rows per micro-batch */
    int input, output;             /* the data input and the loss's output */
    struct stage *stages;
    struct gp_pipe_schedule sched;
    struct task *tasks;            /* one per action, then per-stage optimizer and eval tasks, then
                                      remote frontiers' (4 per micro-batch) */
    int *last_backward, *next_copy; /* per stage, while issuing: the latest backward, the next forward copy in */
    size_t target_bytes;           /* per micro-batch; 0 without targets */
    size_t input_bytes;            /* per micro-batch */
    bool convert_input;            /* the first stage's box stores another type than the data (bf16) */
    /* The step being run. */
    struct gp_step_opts opts;
    double denominator;
    double *loss_parts;            /* per micro-batch, copied back from the last stage */
    int64_t steps_done;
    int64_t optim_steps;           /* optimizer steps taken (for a process whose stage has no optimizer) */
    /* CUDA graphs (cfg.cuda_graph): the captured step, the events that fork
     * every stream from the first stage's compute stream and join them back,
     * pinned staging for what changes between replays, and what the graph
     * baked in. */
    bool graph_ok;
    struct gp_step_graph *graph;
    bool graph_optimizer, graph_clip; /* the graph holds the optimizer (clipping) */
    bool optimizer_warm;           /* the optimizer ran on the devices once, eagerly, before any capture */
    struct gp_event *fork, **joins;
    int n_joins;
    void *x_host, *t_host;
    /* Host buffers the caller took from gp_pipeline_host_alloc: pinned
     * where the first stage's backend has pinned memory, so a step whose
     * batch lies in one copies from it directly, at the link's speed and
     * without staging it through x_host first. */
    struct { void *ptr; size_t bytes; bool pinned; } host_bufs[GP_PIPE_MAX_HOST_BUFS];
    double *loss_host;
    uint64_t *step_host;
    /* The next step's inputs uploaded during this step (inputs_ahead.c):
     * the bytes of the first stage's buffer for them (stage.inputs_ahead;
     * 0: the setting is off), its stream, the events marking the upload
     * done and the buffer read, and the host batch it holds (NULL: none);
     * the bytes of the buffer given up where the first stage had no room
     * for it (stage.c). */
    size_t ahead_bytes, ahead_given_up;
    struct gp_stream *ahead_stream;
    struct gp_event *ahead_done, *ahead_free;
    const void *ahead_x;
    int64_t ahead_taken;           /* steps whose inputs came from the upload */
    /* The upload crosses as bfloat16 (inputs_ahead.c, ahead_bf16_wanted):
     * its rows rounded on the host into ahead_host (pinned where the
     * backend has it; made at the first upload), the device buffer half
     * of ahead_bytes. */
    bool ahead_bf16;
    void *ahead_host;
    uint64_t graph_seed;
    double graph_ratio, graph_denominator;
    char graph_note[2304];
    float *norms_host;             /* per parameter (all stages), copied back for clipping */
    bool eval;
    bool eval_batch_stats;         /* evaluation with BatchNorm's batch statistics (predict --mode train) */
    /* The optimizer (optimizer.c): the step's scalars as the host computes
     * them and the guard's as read back (pinned where stage 0's backend
     * has it); where stage k's norms lie among all stages' (norm_base[k],
     * n_norm_slots in all) and which of them the model's parameters' are,
     * in its order (norm_order, n_norms: a tied parameter once); the tasks
     * of tied sums (one per tied parameter) and of the guard (last). */
    struct gp_optim_scalars *scalars_host, *scalars_out;
    bool scalars_pinned;
    int *norm_base, n_norm_slots, n_norms;
    int32_t *norm_order;
    struct task *optimizer_tasks;
    /* Parameters held by several stages, in value order, and host room
     * for summing their gradients (tied.c). */
    struct gp_pipe_tied *tied;
    int n_tied;
    float *tied_acc, *tied_tmp;
    /* Replicas: the parameter gradients summed in buckets during the
     * backward (buckets.c); NULL where they are not. */
    struct gp_pipe_buckets *buckets;
};

/* Whether [ptr, ptr + bytes) lies in a pinned gp_pipeline_host_alloc buffer. */
/* inputs_ahead.c: the first stage's inputs of this step into its inputs
 * block on its compute stream, from the batch uploaded ahead when it is
 * x's, else from x (xs: where x's bytes are, a pinned staging copy when x
 * is not pinned); then the next step's (p->opts.next_inputs), when given,
 * uploaded on their own stream. */
void gp_pipe_inputs_load(struct gp_pipeline *p, const void *x, const void *xs, size_t bytes,
                         const struct gp_task_tag *tag);
void gp_pipe_inputs_ahead(struct gp_pipeline *p, size_t bytes);
void gp_pipe_inputs_ahead_free(struct gp_pipeline *p);
/* Whether the first stage `s` (its plan made) takes the upload as
 * bfloat16: its inputs' box is bfloat16 and the data float32. */
bool gp_pipe_ahead_bf16_wanted(const struct gp_pipeline *p, const struct stage *s);
/* The bytes of the first stage's buffer for the upload (0: none). */
size_t gp_pipe_ahead_device_bytes(const struct gp_pipeline *p);
bool gp_pipe_pinned(const struct gp_pipeline *p, const void *ptr, size_t bytes);
void gp_pipe_free_host_bufs(struct gp_pipeline *p);

static inline size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Address of value v on stage s in box `box` and activation set `set`
 * (a micro-batch's slots: s->slots). */
static inline void *addr(struct stage *s, int v, int box, int set)
{
    switch (s->plan.home[v]) {
    case GP_HOME_STATIC: return s->static_block + s->plan.off[v];
    case GP_HOME_BOX: return s->boxes + (size_t)box * s->plan.box_bytes + s->plan.off[v];
    case GP_HOME_ARENA: return s->arena + s->plan.off[v];
    case GP_HOME_STEP: return s->step_block + s->plan.off[v];
    case GP_HOME_LOCAL: return s->locals + (size_t)set * s->plan.local_bytes + s->plan.off[v];
    default: return NULL;
    }
}

/* Micro-batch j's gradient inbox on stage s. */
static inline unsigned char *inbox_of(struct stage *s, int j)
{
    return s->inboxes + (size_t)s->slots.inbox[j] * s->plan.inbox_bytes;
}

/* Where the gradient set's bytes at `off` are for a micro-batch whose
 * activations are in set `set`: in that set's dead bytes when `in_set`
 * (plan.h, grad_in_set), else in the gradient set. */
static inline unsigned char *grad_place(struct stage *s, bool in_set, size_t off, int set)
{
    return in_set ? s->locals + (size_t)set * s->plan.local_bytes + off : s->grads + off;
}

/* Value v's gradient for the micro-batch in activation set `set`. */
static inline float *grad_addr(struct stage *s, const struct gp_value *val, int v, int set)
{
    if (s->plan.home[v] == GP_HOME_STATIC)
        return val->kind == GP_VALUE_PARAMETER ? (float *)(s->param_grads + s->plan.off[v]) : NULL;
    if (s->plan.home[v] == GP_HOME_STEP) return (float *)(s->step_grads + s->plan.step_grad_off[v]);
    if (s->plan.grad_off[v] == SIZE_MAX) return NULL;
    return (float *)grad_place(s, s->plan.grad_in_set[v], s->plan.grad_off[v], set);
}

static inline struct gp_task_tag tag_of(enum gp_task_kind kind, int stage, int micro, const char *name)
{
    return (struct gp_task_tag){.kind = kind, .stage = stage, .microbatch = micro, .name = name};
}

/* Data-parallel copies of the pipeline (pipeline.h): 1 without. */
static inline int gp_pipe_replicas(const struct gp_pipeline *p)
{
    return p->cfg.remote && p->cfg.remote->replicas > 1 ? p->cfg.remote->replicas : 1;
}

/* A local stage's streams (compute first; at most STAGE_STREAMS) and
 * their names in a timeline (names may be NULL): how many it has. */
#define STAGE_STREAMS 5
int gp_pipe_stage_streams(const struct stage *s, struct gp_stream **out, const char **names);

/* Whether stage k runs in this process (every stage does without cfg.remote). */
static inline bool stage_local(const struct gp_pipeline *p, int k)
{
    return !p->cfg.remote || p->cfg.remote->stage == k;
}

/* tasks.c: a task of the step (struct task as its argument). */
gp_status gp_pipe_task_run(void *arg, struct gp_error *err);

/* stage.c: stage k of layers [first, last) (its slots already set), and
 * every stage's release. */
gp_status gp_pipe_create_stage(struct gp_pipeline *p, int k, int first, int last, struct gp_error *err);
/* Every byte allocated for local stage k: its blocks' sum as allocated
 * (each aligned, an empty one taking 64 bytes), the figure the fit check
 * compares with the device's free memory. */
size_t gp_pipe_stage_allocated(const struct gp_pipeline *p, int k);
void gp_pipe_free_stages(struct gp_pipeline *p);

/* graph.c: set up at creation (a note when graphs are off); a step run as a
 * replayed graph, with the optimizer after its backward or not (false: it
 * must run eagerly, *st is untouched); release. */
gp_status gp_pipe_setup_graphs(struct gp_pipeline *p, struct gp_error *err);
bool gp_pipe_step_graph(struct gp_pipeline *p, const void *x, const void *targets, bool optimizer, gp_status *st,
                        struct gp_error *err);
void gp_pipe_free_graphs(struct gp_pipeline *p);

/* pipeline.c: every action of the schedule onto the streams; waiting for
 * every stream (the first error). */
void gp_pipe_issue_actions(struct gp_pipeline *p);
gp_status gp_pipe_sync_all(struct gp_pipeline *p, struct gp_error *err);

/* optimizer.c: its plan at creation (after the stages and tied.c's plan):
 * the norms' places and order, the host's scalars, and, with every stage
 * in this process, the devices' buffers and events; release (before the
 * stages). A step's scalars filled for learning rate lr (p->scalars_host);
 * the optimizer issued onto the streams after the step's backward (every
 * stage in this process: tied sums, norms, the guard, the updates); the
 * step counted where it was applied. */
gp_status gp_pipe_optimizer_plan(struct gp_pipeline *p, struct gp_error *err);
void gp_pipe_optimizer_free(struct gp_pipeline *p);
void gp_pipe_scalars_begin(struct gp_pipeline *p, double lr, double clip_norm, double denominator);
void gp_pipe_issue_optimizer(struct gp_pipeline *p);
void gp_pipe_optimizer_end(struct gp_pipeline *p, struct gp_step_outcome *out);

/* remote.c: a frontier task (TASK_SEND_* / TASK_RECV_*) of a stage whose
 * neighbour is in another process; after a step, every process gets the
 * last stage's loss parts (p->loss_parts); a value read to stage 0. */
gp_status gp_pipe_remote_task(struct task *t, struct gp_error *err);
gp_status gp_pipe_remote_losses(struct gp_pipeline *p, struct gp_error *err);
gp_status gp_pipe_remote_read(struct gp_pipeline *p, int value, float *out, struct gp_error *err);
/* remote.c, for saved states: optimizer state `slot` of parameter `value`
 * (its first holder's) read to stage 0's process of replica 0. */
gp_status gp_pipe_remote_read_optim(struct gp_pipeline *p, int value, int slot, float *out, struct gp_error *err);
/* remote.c, after an evaluation: the last stage's outputs (out, bytes)
 * sent to every other stage of its replica. */
gp_status gp_pipe_remote_outputs(struct gp_pipeline *p, float *out, size_t bytes, struct gp_error *err);
/* remote.c, for clipping: every stage's parameter norms (stage k's n[k] at
 * norms + base[k]) gathered on every process of the replica; each stage
 * fills its own part before. */
gp_status gp_pipe_remote_norms(struct gp_pipeline *p, float *norms, const int *base, const int *n,
                               struct gp_error *err);
/* remote.c, for the memory table: each stage's report (gp_pipeline_report,
 * in out[] already) sent to stage 0 of its replica, known[k] set for those
 * received, as gp_pipeline_reports says. */
gp_status gp_pipe_remote_reports(struct gp_pipeline *p, struct gp_stage_report *out, bool *known,
                                 struct gp_error *err);

/* buckets.c: with replicas (cfg.remote), the local stage's gradient
 * buckets and the thread that sums them (after the stages exist; nothing
 * when there is nothing to sum); a step's start, the last micro-batch's
 * backward progress (layers of the stage done; layers + 1 after the
 * once-per-step layers'), and waiting for the sums after the step
 * (`cancel`: the step failed here); how many buckets; release. */
struct gp_pipe_buckets;
gp_status gp_pipe_buckets_plan(struct gp_pipeline *p, size_t bucket_bytes, struct gp_error *err);
bool gp_pipe_buckets_on(const struct gp_pipeline *p);
void gp_pipe_buckets_begin(struct gp_pipeline *p);
void gp_pipe_buckets_progress(struct gp_pipeline *p, int progress);
gp_status gp_pipe_buckets_finish(struct gp_pipeline *p, bool cancel, struct gp_error *err);
int gp_pipe_buckets_count(const struct gp_pipeline *p);
void gp_pipe_buckets_free(struct gp_pipeline *p);

/* tied.c: the parameters several stages hold (after the stages are
 * created); their gradients summed between the holders (between steps,
 * before clipping and the optimizer); release. */
gp_status gp_pipe_tied_plan(struct gp_pipeline *p, struct gp_error *err);
gp_status gp_pipe_tied_sum(struct gp_pipeline *p, struct gp_error *err);
void gp_pipe_tied_free(struct gp_pipeline *p);

#endif
