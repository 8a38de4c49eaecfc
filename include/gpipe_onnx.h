/* gpipe-onnx: train ONNX models with GPipe pipeline parallelism, from C.
 *
 * The library behind the `gpipe-onnx` program: load a model exported to
 * ONNX, read its sequential layer list and the frontier at every cut,
 * profile its layers and split them across devices, train it (one device or
 * a pipeline of stages), run it forward, save the trained model as ONNX.
 *
 *     #include <gpipe_onnx.h>          cc app.c $(pkg-config --cflags --libs gpipe-onnx)
 *
 *     gpo_model *m = NULL;
 *     if (gpo_open("model.onnx", NULL, &m) != GPO_OK) {
 *         fprintf(stderr, "%s\n", gpo_last_error(m));
 *         gpo_close(m);
 *         return 1;
 *     }
 *     ... gpo_layer_count(m), gpo_balance(m, ...), gpo_train(m, ...), gpo_save(m, "out.onnx") ...
 *     gpo_close(m);
 *
 * Conventions.
 *  - Every function that can fail returns a gpo_status; on failure the
 *    model's gpo_last_error() holds one line naming the file, node, layer
 *    or stage at fault. The library never exits and prints nothing (but
 *    cuDNN's algorithm choices on stderr when GP_CONV_VERBOSE=1 asks).
 *  - A gpo_model is one context: it owns the loaded graph, the last balance
 *    report and the trained weights. Nothing is shared between contexts
 *    except what the notes below list, so several threads may each use
 *    their own context at once. One context must not be used by two threads
 *    at the same time (calls on it are not locked).
 *  - Strings and arrays the library returns belong to the context and stay
 *    valid until the call that replaces them (said at each) or gpo_close().
 *  - Options structs are initialized with their *_init() function, then
 *    changed field by field: fields added in later versions get defaults.
 *  - Devices are named as on the command line: "cpu:0,cpu:1" (a CPU device
 *    is a worker thread with its share of the cores), "cuda:0,cuda:1" or
 *    "0,1" (GPUs of a CUDA build), one per pipeline stage.
 *  - Outputs (saved models, reports) appear whole or not at all: written
 *    beside the target, then renamed over it.
 *
 * State shared by the whole process (not per context):
 *  - The attention fusion switch: the loader reads the environment variable
 *    GP_FUSE_ATTENTION ("0" turns the fusion of exported attention into one
 *    layer off) at every load; gpo_open_options.fuse_attention = 0 sets it
 *    for the process (setenv: do it before other threads load models).
 *    Contexts opened with different settings at once see whichever was set
 *    last.
 *  - A table of the memory-mapped model files (for naming a file truncated
 *    while in use), locked: safe from any thread.
 *  - OpenBLAS is set to one thread per call (its own setting is global);
 *    each CPU device and the profiler set OpenMP's thread count for their
 *    own threads only.
 *  - CUDA builds: the cuDNN algorithm choices measured in the process are
 *    cached process-wide (locked), peer access between GPUs is enabled once
 *    per pair, and GP_CONV_API, GP_CONV_VERBOSE and a few kernel tuning
 *    variables are read from the environment.
 *  - Models (and their external data) are read through memory maps: a file
 *    truncated while a context uses it raises SIGBUS in the process.
 *    Replace a model by renaming a new file over it. (The program names
 *    the file from its SIGBUS handler; a library user may install one.)
 *  - Training runs each CPU device as a worker thread with its share of the
 *    machine's cores: contexts training at once share the cores too.
 *  - Training without a save_path writes the trained model to a temporary
 *    file (in $TMPDIR, else /tmp) that the context owns and removes at
 *    gpo_close().
 */
#ifndef GPIPE_ONNX_H
#define GPIPE_ONNX_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GPO_VERSION_MAJOR 0
#define GPO_VERSION_MINOR 1
#define GPO_VERSION_PATCH 0

/* "0.1.0": the library's version (may differ from the header's above when
 * a program runs against a newer shared library). */
const char *gpo_version(void);

/* ---- the machine ---- */

struct gpo_system {
    int cpu_cores;                 /* cores this process may use (its affinity mask, at most
                                      OMP_NUM_THREADS): CPU devices share them */
    int cuda;                      /* 1: built with the CUDA backend */
    int cuda_runtime, cuda_driver, cublas; /* versions (CUDA builds; 0 when unknown) */
    int64_t cudnn;
};
void gpo_system_info(struct gpo_system *out);

struct gpo_gpu {
    char name[256];
    int major, minor;              /* compute capability */
    int multiprocessors;
    int64_t total_bytes, free_bytes;
};
/* The GPUs visible to this build: up to `max` into out[]; returns how many
 * there are (0 without CUDA, a driver or a GPU), or -1 with the reason in
 * errbuf (of errsize bytes, may be NULL). */
int gpo_gpus(struct gpo_gpu *out, int max, char *errbuf, size_t errsize);

/* Devices are named as on the command line (see the conventions above).
 * A list holds one device per pipeline stage, GPO_MAX_STAGES at most. */
#define GPO_MAX_STAGES 64

struct gpo_device {
    int cuda;                      /* 1: a GPU, 0: a CPU device (a worker thread) */
    int index;                     /* cuda:index, cpu:index */
};
/* Parses a device list ("cuda:0,cuda:1", "0,1", "cuda", "cpu:0,cpu:1",
 * "cpu,cpu") into out[] (`max` entries); returns how many, or -1 with the
 * reason in errbuf (of errsize bytes, may be NULL). */
int gpo_devices_parse(const char *list, struct gpo_device *out, int max, char *errbuf, size_t errsize);
/* The list's one spelling, "cuda:0,cpu:1", into buf (cut to fit);
 * returns buf. gpo_devices_parse reads it back. */
const char *gpo_devices_format(const struct gpo_device *d, int n, char *buf, size_t size);

/* ---- status ---- */

typedef enum gpo_status {
    GPO_OK = 0,
    GPO_ERR_IO = 1,          /* a file could not be read or written */
    GPO_ERR_PARSE = 2,       /* malformed input: protobuf, .npy, JSON */
    GPO_ERR_UNSUPPORTED = 3, /* valid input this library does not handle (an op, a device) */
    GPO_ERR_SHAPE = 4,       /* inconsistent or unknowable shapes */
    GPO_ERR_INVALID = 5,     /* a structural error in the model or the data */
    GPO_ERR_NOMEM = 6,       /* out of host or device memory */
    GPO_ERR_DEVICE = 7,      /* a device (CUDA, cuBLAS, cuDNN) call failed */
    GPO_ERR_COMM = 8,        /* another process of a job failed or could not be reached */
    GPO_ERR_ARGUMENT = 100,  /* a call's arguments are wrong (an index out of range, no report yet...) */
} gpo_status;

/* "GPO_ERR_IO"... */
const char *gpo_status_name(gpo_status status);

/* ---- a model ---- */

typedef struct gpo_model gpo_model;

struct gpo_open_options {
    int64_t batch;       /* bound to axis 0 of every input (default 1): the shapes gpo_layer reports */
    int channels_last;   /* 1: run the layout pass (activations stored [N, H, W, C] after 2-D
                            convolutions) and report it per layer; default 0 */
    int fuse_attention;  /* 1 (default): exported attention becomes one Attention layer;
                            0: as the model spells it (process-wide: see above) */
};
void gpo_open_options_init(struct gpo_open_options *o);

/* Loads `path` (opts NULL: the defaults). Whatever the result, *out gets a
 * context (NULL only when even that could not be allocated): on failure it
 * holds only the error, for gpo_last_error(); gpo_close() it either way. */
gpo_status gpo_open(const char *path, const struct gpo_open_options *opts, gpo_model **out);

/* Frees the context and everything it returned; removes its temporary
 * files; ends the job it joined (see gpo_job_join: after a failure of
 * this rank's alone it aborts the job and does not return). NULL is
 * allowed. */
void gpo_close(gpo_model *m);

/* The last failure's message, one line ("" when none yet; "out of memory"
 * for a NULL context). Valid until the next call on the context. */
const char *gpo_last_error(const gpo_model *m);

/* ---- what was loaded ---- */

struct gpo_model_info {
    const char *path;              /* as given to gpo_open */
    const char *producer_name, *producer_version;
    int64_t ir_version, opset;
    int64_t batch;                 /* bound to axis 0 of the inputs */
    int n_inputs, n_outputs;       /* graph inputs (data, not weights) and outputs */
    int64_t parameters, parameter_bytes;
    int parameter_tensors;
    int64_t buffers, buffer_bytes; /* state without gradients: BatchNorm running statistics */
    int buffer_tensors;
    int source_nodes;              /* nodes in the file */
    int folded_nodes;              /* constant subgraphs folded at load time */
    int fused_nodes, fusions;      /* nodes merged away by fusion, and the layers they merged
                                      into: fused_nodes + fusions nodes became fusions layers */
    int n_layers;                  /* = source_nodes - folded_nodes - fused_nodes */
    int64_t input_frontier_bytes;  /* the inputs: the frontier before layer 0 */
    int channels_last_activations; /* with channels_last: the activations stored so */
    int n_tied;                    /* parameters read by several layers (gpo_tied) */
    const char *export_note;       /* a known exporter problem and its fix, or NULL */
};
void gpo_model_info(const gpo_model *m, struct gpo_model_info *out);

struct gpo_value {
    const char *name;
    const char *dtype;             /* "float32", "int64"... */
    int rank;                      /* -1: an optional value left out */
    const int64_t *dims;           /* [rank] */
};
/* Graph input / output k (k < n_inputs / n_outputs). */
gpo_status gpo_input(gpo_model *m, int k, struct gpo_value *out);
gpo_status gpo_output(gpo_model *m, int k, struct gpo_value *out);

/* The value of the model's metadata_props entry `key` ("gpipe-onnx.lr"...),
 * NULL when absent. */
const char *gpo_metadata(const gpo_model *m, const char *key);

/* The op type of folded node k (k < folded_nodes), in load order. */
const char *gpo_folded_op(const gpo_model *m, int k);

/* A parameter read by several layers (a GPT's embedding and its head): a
 * pipeline cut between its readers gives each stage a copy, gradients summed. */
struct gpo_tied {
    const char *name;
    int n_readers;
    const int *readers;            /* layer indices, ascending */
};
gpo_status gpo_tied(gpo_model *m, int k, struct gpo_tied *out);

/* ---- the sequential layer list and its frontiers ---- */

/* Layers are the nodes that run, in order: index i of gpo_layer is the
 * index `gpipe-onnx inspect` prints and --balance counts. The cut c
 * (0 <= c <= n_layers) lies before layer c; its frontier is every value
 * made before it and used at or after it (skip connections included): what
 * a pipeline stage boundary there moves. */
int gpo_layer_count(const gpo_model *m);

struct gpo_layer {
    int index;
    const char *op;                /* ONNX op type, "Conv" */
    const char *domain;            /* "" for the standard domain */
    int since_version;             /* of the op definition that runs it */
    int fused_relu;                /* a Relu fused into it (BatchNormalization, Add) */
    int trans_b;                   /* MatMul: B is a weight read transposed (its Transpose absorbed) */
    const char *name;              /* the node's name */
    int n_inputs, n_outputs;
    int64_t params;                /* parameter elements it reads (a shared one counts at its first reader) */
    int64_t frontier_bytes;        /* per batch, at the cut after it */
    int frontier_count;            /* values in that frontier */
    int channels_last;             /* its output 0 is stored [N, H, W, C] */
    int packed_qkv;                /* Attention: Q, K, V read from one packed input (its Split absorbed) */
    int fused_bias;                /* MatMul: adds a bias (input 2) to its product (the Add after it absorbed) */
    int fused_add;                 /* BatchNormalization: adds a residual (input 5) to its result (the
                                      Add after it absorbed, that Add's Relu as fused_relu) */
};
gpo_status gpo_layer(gpo_model *m, int i, struct gpo_layer *out);
/* Input k of layer i by name ("" for an optional input left out), NULL when
 * out of range. */
const char *gpo_layer_input(const gpo_model *m, int i, int k);
/* Output k of layer i: name, dtype, shape. */
gpo_status gpo_layer_output(gpo_model *m, int i, int k, struct gpo_value *out);
/* With the layout pass run (the channels_last load option): 1 when layer
 * i could write its output channels-last but it stays [N, C, H, W], the
 * reason written into buf as one line ("read by Softmax 'sm' (input 0),
 * which reads [N, C, H, W]"); 0 otherwise. */
int gpo_layer_layout_note(const gpo_model *m, int i, char *buf, size_t size);

/* The summary and the layer list (with every layer's outputs, parameters
 * and frontier) as JSON: what `gpipe-onnx inspect --json` prints. A
 * malloc'd string for the caller to gpo_free. */
gpo_status gpo_model_json(gpo_model *m, char **json);

/* Bytes per batch crossing cut c; -1 when c is out of range. */
int64_t gpo_frontier_bytes(const gpo_model *m, int cut);
/* The names of the values in the frontier of cut c: the first `cap` into
 * names[]; returns how many there are (-1: c out of range). */
int gpo_frontier(gpo_model *m, int cut, const char **names, int cap);

/* ---- profile and balance ---- */

enum gpo_balance_by { GPO_BALANCE_TIME = 0, GPO_BALANCE_MEMORY = 1 };
enum gpo_checkpoint { GPO_CHECKPOINT_EXCEPT_LAST = 0, GPO_CHECKPOINT_ALWAYS = 1, GPO_CHECKPOINT_NEVER = 2 };
enum gpo_pipeline_schedule { GPO_PIPELINE_GPIPE = 0, GPO_PIPELINE_1F1B = 1 };
enum gpo_recompute { GPO_RECOMPUTE_AUTO = 0, GPO_RECOMPUTE_ALWAYS = 1, GPO_RECOMPUTE_NEVER = 2 };
enum gpo_precision { GPO_PRECISION_FP32 = 0, GPO_PRECISION_TF32 = 1, GPO_PRECISION_BF16 = 2 };
enum gpo_layout { GPO_LAYOUT_AUTO = 0, GPO_LAYOUT_NCHW = 1, GPO_LAYOUT_NHWC = 2 };
enum gpo_optimizer { GPO_OPTIMIZER_SGD = 0, GPO_OPTIMIZER_ADAMW = 1 };
enum gpo_lr_schedule { GPO_LR_CONSTANT = 0, GPO_LR_STEP = 1, GPO_LR_COSINE = 2 };
enum gpo_loss { GPO_LOSS_AUTO = 0, GPO_LOSS_CROSS_ENTROPY = 1, GPO_LOSS_MSE = 2, GPO_LOSS_OUTPUT = 3 };

/* Names as the command line spells them ("fp32", "tf32", "bf16"; "auto",
 * "nchw", "nhwc"; "always", "except_last", "never"; "gpipe", "1f1b"):
 * 1 and *out set when known, else 0. */
int gpo_precision_parse(const char *name, enum gpo_precision *out);
int gpo_layout_parse(const char *name, enum gpo_layout *out);
int gpo_checkpoint_parse(const char *name, enum gpo_checkpoint *out);
int gpo_pipeline_schedule_parse(const char *name, enum gpo_pipeline_schedule *out);
const char *gpo_checkpoint_name(enum gpo_checkpoint c);
const char *gpo_pipeline_schedule_name(enum gpo_pipeline_schedule s);

/* Called after each pass over the model while profiling. */
typedef void (*gpo_progress_fn)(void *user, int done, int total);

struct gpo_balance_options {
    const char *devices;           /* one per stage: "cpu:0,cpu:1" (required) */
    enum gpo_balance_by by;        /* default time */
    int64_t batch;                 /* mini-batch, default 32 */
    int chunks;                    /* micro-batches per mini-batch, default 1; divides batch */
    enum gpo_checkpoint checkpoint;
    enum gpo_pipeline_schedule schedule; /* what each stage holds at once */
    enum gpo_optimizer optimizer;  /* optimizer state in the memory figures */
    double momentum;               /* SGD: > 0 keeps a momentum buffer */
    enum gpo_precision precision;
    enum gpo_layout layout;
    int fast_conv;                 /* nonzero: GPU convolutions timed on cuDNN's fastest algorithms,
                                      as training with fast_conv runs them (default 0) */
    int recompute_norm;            /* nonzero: BatchNorm outputs remade in the backward, as training
                                      with recompute_norm GPO_RECOMPUTE_ALWAYS (their bytes not kept,
                                      their layers' backward also runs the forward; default 0) */
    int repeats;                   /* timed runs per layer (median), default 5 */
    const char *profile_in;        /* reuse a saved profile (no timing); NULL: time the layers */
    const char *profile_out;       /* save the profile; NULL: not saved */
    gpo_progress_fn progress;      /* may be NULL */
    void *user;
    /* GPU profiles: kernel choices measured before the first pass (cuDNN's
     * convolution algorithms), as gpo_train_callbacks.on_measure; may be
     * NULL. */
    void (*measure)(void *user, int problems, double seconds, int done);
};
void gpo_balance_options_init(struct gpo_balance_options *o);

struct gpo_stage {
    int first_layer, last_layer;   /* inclusive */
    double time_ms;                /* per micro-batch: forward, backward, recompute, frontier received */
    int64_t memory_bytes;          /* parameters, gradients, optimizer state, activations in flight,
                                      the first stage's inputs (kernel workspaces left out) */
    int64_t frontier_in_bytes, frontier_out_bytes;
};

struct gpo_split {
    int n_stages;
    const struct gpo_stage *stages;
    const int *balance;            /* layers per stage: train's balance list */
    double imbalance;              /* max / mean of the objective */
    double predicted_step_ms, throughput; /* samples per second */
};

struct gpo_layer_profile {
    const char *op;
    double forward_ms, backward_ms; /* medians, per micro-batch */
    int64_t param_bytes, activation_bytes, frontier_bytes;
};

struct gpo_balance_report {
    const char *device;            /* what the layers were timed on: "cpu", a GPU's name */
    const char *precision;
    int64_t micro_batch;
    double copy_gbps;              /* frontier copies between devices */
    int n_layers;
    const struct gpo_layer_profile *layers;
    struct gpo_split optimal;      /* the exact minimum of the objective */
    struct gpo_split even;         /* equal layer counts */
    struct gpo_split heuristic;    /* torchgpipe's block partition */
    double bubble;                 /* (K - 1) / (M + K - 1) */
    int suggested_chunks;          /* smallest M dividing the batch with bubble <= 10% */
};

/* Profiles every layer on the devices' type (or reads opts->profile_in)
 * and finds the split. *out is valid until the next gpo_balance or
 * gpo_close. Profiling takes a while (seconds to minutes). */
gpo_status gpo_balance(gpo_model *m, const struct gpo_balance_options *opts, const struct gpo_balance_report **out);
/* The last report as JSON (the same as `balance --json`): a malloc'd
 * string for the caller to gpo_free. */
gpo_status gpo_balance_json(gpo_model *m, char **json);
/* The last report written to a file: JSON, or the SVG picture of `balance
 * --svg` (a bar per layer, the cuts, each stage's load). */
gpo_status gpo_balance_write_json(gpo_model *m, const char *path);
gpo_status gpo_balance_write_svg(gpo_model *m, const char *path);

/* ---- training ---- */

#define GPO_CLASS_AXIS_AUTO (-100)

struct gpo_train_config {
    /* Data: .npy files, one sample per row of axis 0. Integer labels train
     * with cross-entropy, float targets with MSE, none: the output is the
     * loss. No data and no synthetic: the files the model's metadata
     * names (gpipe-onnx.data ... in its folder), as `gpipe-onnx train
     * MODEL` finds them; its recipe (gpipe-onnx.epochs, .lr, .batch,
     * .optimizer) is not applied here: the fields below decide. */
    const char *data, *labels, *val_data, *val_labels;
    int64_t synthetic;             /* > 0: that many random samples shaped for the model instead */

    int64_t batch;                 /* default 32; the last incomplete batch of an epoch is dropped */
    int64_t chunks;                /* micro-batches per mini-batch, default 1 */
    int64_t epochs;                /* default 1 */
    int64_t steps;                 /* > 0: optimizer steps instead of epochs */
    int no_shuffle;                /* visit samples in file order */
    uint64_t seed;                 /* shuffling and dropout */

    enum gpo_optimizer optimizer;
    double lr;                     /* <= 0: 0.01 for SGD, 0.001 for AdamW */
    double momentum;               /* SGD */
    int nesterov;
    double weight_decay;           /* < 0 (default): 0 for SGD, 0.01 for AdamW */
    double clip_norm;              /* > 0: clip gradients to this global norm */
    double dropout;                /* >= 0: every Dropout's ratio; < 0 (default): the model's */
    double beta1, beta2, eps;      /* AdamW, defaults 0.9, 0.999, 1e-8 */
    enum gpo_lr_schedule lr_schedule; /* default constant */
    int64_t warmup_steps;          /* linear warm-up (cosine) */
    int64_t step_size;             /* step: lr *= gamma every step_size steps (defaults 30, 0.1) */
    double gamma, min_lr;          /* min_lr: the cosine floor */
    enum gpo_loss loss;            /* default auto: integer labels cross-entropy, float MSE, none the output */
    int class_axis;                /* cross-entropy's class axis of the logits; GPO_CLASS_AXIS_AUTO (default):
                                      1 for [N, C] and [N, C, H, W], the last for [N, T, C] */
    int torch_1_13;                /* AdamW's float32 operation order of PyTorch 1.13 (default: 2.x's) */

    const char *devices;           /* one per stage; NULL: one stage per balance entry (one when
                                      none), on the GPUs in turn when any is visible, else cpu:0, cpu:1... */
    const char *balance;           /* layers per stage "4,4,5", or "time" / "memory" (profile and
                                      balance first); NULL: an even split */
    enum gpo_pipeline_schedule pipeline_schedule;
    enum gpo_checkpoint checkpoint;
    int deferred_batch_norm;
    enum gpo_precision precision;
    enum gpo_layout layout;
    int fast_conv;                 /* GPUs: cuDNN's fastest convolutions, nondeterministic ones too */
    enum gpo_recompute recompute_norm; /* BatchNormalization outputs written again in the backward
                                      instead of kept (less memory, the same bits): only where a stage
                                      would not fit otherwise (AUTO, the default), ALWAYS or NEVER */
    int cuda_graph;                /* GPUs: 1 replay each step as a CUDA graph, 0 never,
                                      -1 (default) when every stage is on a GPU and no trace is asked */
    const char *algorithms_path;   /* GPUs: cuDNN's algorithm choices read from / written to this file */

    const char *save_path;         /* write the trained model here; NULL: a temporary file */
    int discard_weights;           /* 1: keep no trained weights (save_path only, when given); the
                                      context keeps the weights it had */
    const char *trace_path;        /* Chrome trace of the last step; NULL: none */
    const char *state_dir;         /* training states (resumable); NULL: none */
    int64_t save_every;            /* a state every this many steps; 0: once per epoch */
    double save_every_seconds;     /* > 0: a state at the first step this long after the last */
    int keep;                      /* states kept, default 2 */
    const char *resume;            /* continue from this state (folder) */
    int64_t memory_limit;          /* > 0: bytes each stage may plan on its device (its free memory
                                      when less); recompute_norm AUTO remakes what it must to fit
                                      (the fewest BatchNorm outputs, the largest first); 0: the
                                      device's free memory */
};
void gpo_train_config_init(struct gpo_train_config *c);

struct gpo_step_info {
    int64_t step, total_steps, epoch; /* step and epoch from 0 */
    int64_t first_step;            /* where this run began (a resumed run: its state's step) */
    double loss, lr;
    double seconds, elapsed;       /* this step, and since training began */
    int64_t samples;
};

struct gpo_epoch_info {
    int64_t epoch, step;
    double train_loss;
    int has_val;
    double val_loss, val_accuracy; /* accuracy < 0 when the loss has no classes */
};

/* A pipeline stage's memory once training is done: planned and at its peak. */
struct gpo_stage_memory {
    int stage, first_layer, last_layer; /* layers inclusive */
    const char *backend;           /* "cpu", "cuda" */
    int device;
    int64_t param_bytes, optimizer_bytes, activation_bytes, activation_peak_bytes, planned_bytes;
};

/* Called on the thread that called gpo_train; any may be NULL. */
struct gpo_train_callbacks {
    void *user;
    void (*on_start)(void *user, int64_t total_steps, int64_t steps_per_epoch, const char *summary);
    void (*on_step)(void *user, const struct gpo_step_info *s);   /* progress and metrics */
    void (*on_epoch)(void *user, const struct gpo_epoch_info *e); /* validation */
    void (*on_note)(void *user, const char *message);             /* something done otherwise than asked */
    gpo_progress_fn on_profile;    /* profiling passes of balance "time" / "memory" */
    void (*on_memory)(void *user, const struct gpo_stage_memory *s); /* per stage, after training */
    /* balance "time" / "memory": the report, before training starts. */
    void (*on_balance)(void *user, const struct gpo_balance_options *o, const struct gpo_balance_report *r);
    void (*on_state)(void *user, const char *path, int64_t step);   /* a training state written */
    void (*on_resume)(void *user, const char *path, int64_t step, int64_t total_steps);
    /* Before the first step, kernel choices measured (cuDNN's convolution
     * algorithms, seconds each on a large net; none where the algorithms
     * file or a resumed state has them): after each, the count and seconds
     * so far, on the thread measuring (a stage's, one call at a time);
     * then once with done = 1 after the last, on the calling thread. */
    void (*on_measure)(void *user, int problems, double seconds, int done);
};

struct gpo_train_result {
    int64_t steps;                 /* optimizer steps done (a resumed run counts its state's too) */
    double last_loss;              /* the last step's */
    int has_val;
    double val_loss, val_accuracy; /* the last validation */
    int n_stages;
    int balance[GPO_MAX_STAGES];   /* layers per stage used */
};

/* Trains the context's model (the file opened, or the weights of the last
 * gpo_train: training continues from them). On success the context holds
 * the trained weights: gpo_predict, gpo_balance and gpo_save use them, and
 * gpo_model_info and the layer list are those of the trained model. They
 * live in cfg->save_path when given (the context reads that file from then
 * on: replace it only by renaming a new file over it), else in a temporary
 * file of the context's, and the last balance report is dropped; with
 * discard_weights the context keeps what it had. In a context that joined
 * a job of several processes (gpo_job_join), this rank's part of the job
 * with the cfg the ranks agreed on; the context then keeps what it had
 * (rank 0 writes save_path). `cb` and `out` may be NULL. */
gpo_status gpo_train(gpo_model *m, const struct gpo_train_config *cfg, const struct gpo_train_callbacks *cb,
                     struct gpo_train_result *out);

/* ---- several processes: one rank of a job ----
 *
 * A pipeline whose stages are processes, launched by mpirun or srun (a
 * build with MPI: gpo_job_join says when this one has none). P stages x D
 * data-parallel replicas = N processes; rank r x P + k trains stage k of
 * replica r, on CPU devices (frontiers and gradient sums over MPI) or on
 * the GPU of its local rank (over NCCL). Every rank calls the same
 * functions with the same settings:
 *
 *     gpo_open(model, NULL, &m);
 *     gpo_job_join(m, &cfg, &job, NULL, &info);  the ranks meet and agree
 *     gpo_train(m, &cfg, &cb, &result);          this rank's stage, all at once
 *     gpo_close(m);                              ends the job (MPI_Finalize)
 *
 * Rank 0 reports (the job's progress is its callbacks' to show; the other
 * ranks' are called as their stages go) and writes the outputs: save_path, the training states
 * (state_dir: it gathers every stage's part), the balance report. Each rank
 * writes its own trace: trace_path with ".rank<R>" before its extension
 * (out.json: out.rank1.json). With balance "time" / "memory" rank 0
 * profiles every layer on its own device at the replicas' micro-batch, and
 * the others take its split.
 *
 * Failures. A failure every rank reaches alike (a launch that does not fit
 * the settings, settings that differ between ranks, what several processes
 * cannot do yet) is said by rank 0 alone: the other ranks get the same
 * status with gpo_last_error "" (print nothing then, so that a job says it
 * once). A failure only this rank knows of (a file it cannot read, a
 * broken link, its stage's training failing) leaves the others waiting on
 * it: gpo_close then ends the whole job (MPI_Abort, exit status 1) once the
 * caller has reported it, and does not return. Messages name settings as
 * the command line spells them (--lr, --batch...) and ranks by number. */

struct gpo_job_options {
    int pipeline;                  /* P: stages, each a process (1..GPO_MAX_STAGES); required */
    int64_t bucket_kib;            /* replicas sum a stage's gradients in buckets of about this
                                      many KiB, each during the backward of earlier layers;
                                      default 1024 (the same sums for any size) */
    double comm_timeout;           /* seconds a rank waits on another before every rank ends,
                                      naming the one not heard from; default 300 */
};
void gpo_job_options_init(struct gpo_job_options *o);

struct gpo_job_info {
    const char *launcher;          /* "Open MPI", "MPICH/PMI", "Slurm" */
    int rank, size;                /* this process among all of the job */
    int local_rank, local_size;    /* ... and among those of its host */
    int pipeline, replicas;        /* size = pipeline x replicas */
    int stage, replica;            /* rank = replica x pipeline + stage */
    int gpu;                       /* a GPU stage: cuda:gpu, its local rank's (NCCL linked);
                                      -1: CPU devices */
};

/* Joins the job this process was launched into as one of pipeline x
 * replicas ranks, and checks with the others that every rank trains the
 * same model (its bytes), data and settings: cfg as gpo_train will get it,
 * whose devices name one per stage (pipeline of them; a GPU stage then
 * runs on this rank's GPU) and whose batch is the whole mini-batch, shared
 * by the replicas and each share cut into chunks. With cfg->resume every
 * rank finds the newest whole state there and they agree on its bytes
 * (states it skipped go to cb->on_note on rank 0; cb may be NULL). On
 * success *out says where this rank stands (out may be NULL) and the
 * context is in the job until gpo_close: one job per process (MPI starts
 * once and ends there). Status: GPO_ERR_UNSUPPORTED (a build without MPI,
 * or what several processes cannot do yet), GPO_ERR_ARGUMENT (not launched
 * by mpirun or srun, or a launch, batch or split that does not fit the
 * pipeline), GPO_ERR_INVALID (the launcher's settings malformed, or ranks
 * whose model, data or settings differ), GPO_ERR_COMM (MPI could not be
 * joined, or a rank not heard from). */
gpo_status gpo_job_join(gpo_model *m, const struct gpo_train_config *cfg, const struct gpo_job_options *opts,
                        const struct gpo_train_callbacks *cb, struct gpo_job_info *out);

/* After a failure of the caller's own on one rank (an output of its own it
 * cannot write): in a job of several processes, ends every one of them now
 * (MPI_Abort, exit status 1) and does not return; otherwise returns. */
void gpo_job_abort(gpo_model *m);

/* ---- running and saving ---- */

struct gpo_predict_options {
    int64_t batch;                 /* samples per forward pass, default 32 */
    const char *device;            /* one device; NULL: "cpu:0" */
    enum gpo_precision precision;
    enum gpo_layout layout;
    int batch_statistics;          /* 1: BatchNorm by each batch's statistics (dropout still off) */
};
void gpo_predict_options_init(struct gpo_predict_options *o);

/* A float32 tensor the library allocated: gpo_tensor_free. */
struct gpo_tensor {
    float *data;
    int rank;
    int64_t dims[8];
};
void gpo_tensor_free(struct gpo_tensor *t);

/* The first output for every sample, in evaluation mode (running
 * statistics, no dropout), in order: from a .npy file, or from n samples in
 * memory (float32, C order; `sample_dims` the shape of one sample, rank
 * `sample_rank`, as the model's first input without its batch axis). */
gpo_status gpo_predict_file(gpo_model *m, const char *npy_path, const struct gpo_predict_options *opts,
                            struct gpo_tensor *out);
gpo_status gpo_predict(gpo_model *m, const float *x, int64_t n, const int64_t *sample_dims, int sample_rank,
                       const struct gpo_predict_options *opts, struct gpo_tensor *out);

/* Writes t as a float32 .npy file (atomically). */
gpo_status gpo_tensor_write_npy(gpo_model *m, const struct gpo_tensor *t, const char *path);

/* Whether `path` can be written (not a folder; a file can be made beside
 * it): for checking outputs before long work. The message names the path. */
gpo_status gpo_check_output(gpo_model *m, const char *path);

/* A file of the caller's own that appears whole or not at all, as the
 * library's outputs: *stream writes into a temporary file beside `path`;
 * gpo_file_commit syncs it and renames it over `path`, gpo_file_abort
 * removes it; both close the stream and free the gpo_file. Messages name
 * the path. */
typedef struct gpo_file gpo_file;
gpo_status gpo_file_open(gpo_model *m, const char *path, gpo_file **out, FILE **stream);
gpo_status gpo_file_commit(gpo_model *m, gpo_file *o);
void gpo_file_abort(gpo_file *o);

/* Writes the model with its current weights (trained or as opened; BatchNorm
 * statistics included) as one self-contained .onnx file. */
gpo_status gpo_save(gpo_model *m, const char *path);

/* Frees what the library malloc'd for the caller (gpo_balance_json,
 * gpo_model_json). */
void gpo_free(void *p);

/* The model file mapped at `addr` (see "Models ... are read through memory
 * maps" above), NULL when none: for naming the file from a SIGBUS handler
 * (async-signal-safe: it only reads a table of atomics). */
const char *gpo_mapped_file(const void *addr);

#ifdef __cplusplus
}
#endif

#endif
