/* Training on one device: mini-batches split into micro-batches that run
 * one after another, gradients accumulated over them, one optimizer step per
 * mini-batch; validation per epoch; the trained model saved back to ONNX.
 * (The pipeline executor runs the same micro-batches across stages.) */
#ifndef GP_TRAIN_TRAINER_H
#define GP_TRAIN_TRAINER_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/compute.h"
#include "data/dataset.h"
#include "graph/layout.h"
#include "pipeline/schedule.h"
#include "train/loss.h"
#include "util/error.h"

struct gp_pipe_remote;

enum gp_optimizer_kind { GP_OPT_SGD, GP_OPT_ADAMW };
enum gp_schedule_kind { GP_SCHED_CONSTANT, GP_SCHED_STEP, GP_SCHED_COSINE };

/* Whether training steps are replayed as CUDA graphs. AUTO (the default):
 * when every stage is on a GPU and no --trace asks for each step's own
 * timeline; ON: the same, with a note saying why when it cannot be; OFF:
 * every step issued eagerly. */
enum gp_cuda_graph_mode { GP_CUDA_GRAPH_AUTO, GP_CUDA_GRAPH_ON, GP_CUDA_GRAPH_OFF };

struct gp_train_config {
    const char *model_path;
    int64_t batch;            /* mini-batch size */
    int64_t chunks;           /* micro-batches per mini-batch (divides batch) */
    int64_t steps;            /* optimizer steps; 0: epochs decide */
    int64_t epochs;
    bool shuffle;
    uint64_t seed;
    bool loss_auto;           /* integer labels: cross-entropy; float targets: MSE;
                                 no labels: the output is the loss */
    enum gp_loss_kind loss;   /* when !loss_auto */
    int class_axis;           /* GP_CLASS_AXIS_AUTO: inferred from the label shape */
    double dropout_ratio;     /* < 0: the model's own ratios */

    enum gp_optimizer_kind optimizer;
    double lr, momentum, weight_decay, beta1, beta2, eps;
    bool nesterov;
    enum gp_schedule_kind schedule;
    int64_t warmup_steps, step_size;
    double gamma, min_lr;
    double clip_norm;         /* <= 0: no clipping */
    bool torch_1_13;          /* AdamW arithmetic of PyTorch 1.13 instead of 2.x */

    const char *save_path;    /* NULL: do not save */

    /* The pipeline: stages on devices, cut by a balance (layers per stage). */
    int n_stages;             /* 1: one device */
    int stage_device[64];     /* device index per stage (of its backend) */
    bool stage_cuda[64];      /* the stage runs on a CUDA GPU, not a CPU device */
    enum gp_precision precision; /* fp32 (default), tf32, bf16 (backend/compute.h) */
    bool fast_conv;           /* CUDA: cuDNN's fastest convolution algorithms, even
                                 non-deterministic ones (default: deterministic) */
    /* BatchNormalization outputs remade in the backward (pipeline/plan.h):
     * only on a stage that would not fit otherwise (auto, the default),
     * always, or never. */
    enum gp_remake_policy { GP_REMAKE_AUTO, GP_REMAKE_ALWAYS, GP_REMAKE_NEVER } remake_norm;
    int64_t memory_limit; /* > 0: bytes each stage may plan (--memory-limit) */
    enum gp_layout_policy layout; /* channels-last activations (graph/layout.h); auto: on GPUs */
    enum gp_cuda_graph_mode cuda_graph; /* replay each step as a captured CUDA graph */
    int balance[64];          /* layers per stage; all 0: an even split */
    enum gp_pipe_schedule_kind pipeline_schedule; /* GPipe (default) or 1F1B: the same gradients */
    enum gp_checkpoint checkpoint;
    bool deferred_batch_norm; /* running statistics from the whole mini-batch */
    const char *trace_path;   /* Chrome trace of the last step; NULL: none */

    /* Saved training states (train/state.h says the format, train/resume.h
     * what a resume may change). */
    const char *state_dir;    /* states written here; NULL: none */
    int64_t save_every;       /* a state every this many steps; 0: by time only */
    double save_every_seconds; /* > 0: at the first step boundary this long after the last state */
    int keep;                 /* the newest states kept (default 2) */
    const char *resume_path;  /* continue from this state, or the newest whole one in this folder */
    /* The backends' measured kernel choices (cuDNN's algorithms): read from
     * this file before any are measured when it exists, and the run's
     * written into it once the pipeline is planned, so that runs sharing it
     * compute alike. NULL: none. */
    const char *choices_path;
    /* NULL: every stage in this process. Otherwise this process runs one
     * stage of one replica of a pipeline spread over processes
     * (pipeline.h): every one of them calls gp_train alike, each replica
     * computing its share of every mini-batch (--batch stays the whole
     * mini-batch, cut into replicas x --chunks micro-batches), and stage 0
     * of replica 0 writes --save and the training states of state_dir
     * (its replica's other stages' weights and optimizer state sent to
     * it; resume_path must then name one state folder every process can
     * read, each taking its own stage's part); trace_path is each
     * process's own file (its stage's timeline); save_every_seconds is
     * refused (the processes must save at the same steps). */
    const struct gp_pipe_remote *remote;
};

/* Per-stage memory, reported once the pipeline is planned and after training. */
struct gp_stage_memory_report {
    int stage, first_layer, last_layer, device;
    const char *backend;      /* "cpu", "cuda" */
    int64_t param_bytes, optim_bytes, activation_bytes, activation_peak, frontier_in_bytes,
        planned_bytes;
    /* Per micro-batch: a box of its input frontier, a set of its
     * activations, an inbox of its gradients; and how many of each the
     * schedule holds at once. */
    int64_t box_bytes, set_bytes, inbox_bytes;
    int frontier_boxes, activation_sets, gradient_inboxes;
    /* The forward's arena and the gradient set; sharing one block, the
     * larger of the two (stage 0), else side by side. */
    int64_t arena_bytes, gradient_set_bytes;
    bool gradients_in_arena;
    /* --recompute-norm: BatchNorm outputs remade in the backward, and the
     * activation bytes that saves on the stage. */
    int remade_values;
    int64_t remade_saved_bytes;
    /* Gradients whose last term their producer adds as it reads them
     * (pipeline/plan.h, addend_off). */
    int gradient_addends;
};

/* Defaults: batch 32, 1 chunk, 1 epoch, shuffle, SGD lr 0.01... */
void gp_train_config_defaults(struct gp_train_config *c);

struct gp_step_report {
    int64_t step, total_steps, epoch;
    double loss;              /* this step's mean training loss */
    double lr;
    double seconds;           /* wall time of this step */
    double elapsed;           /* since training began */
    int64_t samples;          /* samples in this step */
    int64_t first_step;       /* where this run began (a resumed run: the state's step) */
};

struct gp_epoch_report {
    int64_t epoch, step;
    bool has_val;
    double val_loss, val_accuracy; /* accuracy < 0 when the loss has no classes */
    double train_loss;        /* mean of this epoch's step losses */
};

struct gp_train_callbacks {
    void *user;
    void (*on_start)(void *user, int64_t total_steps, int64_t steps_per_epoch, const char *summary);
    void (*on_step)(void *user, const struct gp_step_report *r);
    void (*on_epoch)(void *user, const struct gp_epoch_report *r);
    /* After training: one call per stage with its planned and peak memory. */
    void (*on_memory)(void *user, const struct gp_stage_memory_report *r);
    /* Something the user asked for that training does otherwise (a CUDA
     * graph that could not be made, say), once. */
    void (*on_note)(void *user, const char *message);
    /* A training state was written to `path`, `step` steps done. */
    void (*on_state)(void *user, const char *path, int64_t step);
    /* Training continues from the state at `path`: `step` of `total` steps done. */
    void (*on_resume)(void *user, const char *path, int64_t step, int64_t total);
    /* Kernel choices measured while the pipeline is made (cuDNN's
     * convolution algorithms, not in the algorithms file or the state):
     * after each, the count and seconds so far, on the thread measuring;
     * once more with `done` after the last, on the caller's thread. */
    void (*on_measure)(void *user, int problems, double seconds, bool done);
};

/* Trains the model on `train`, validating on `val` (may be NULL) after each
 * epoch and at the end. Errors name the model, the data or the node. */
gp_status gp_train(const struct gp_train_config *cfg, const struct gp_dataset *train,
                   const struct gp_dataset *val, const struct gp_train_callbacks *cb,
                   struct gp_error *err);

#endif
