/* Planning a stage: which values it holds where, and how many bytes each
 * part takes. Internal to the pipeline executor. */
#ifndef GP_PIPELINE_PLAN_H
#define GP_PIPELINE_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "graph/graph.h"
#include "backend/compute.h"
#include "graph/layers.h"

/* Where a value lives on a stage. */
enum gp_home {
    GP_HOME_NONE,   /* not used by this stage */
    GP_HOME_STATIC, /* parameters, buffers, constants: one copy */
    GP_HOME_BOX,    /* the input frontier: one box per micro-batch */
    GP_HOME_LOCAL,  /* made by this stage: one activation set per kept micro-batch */
    GP_HOME_ARENA,  /* made by this stage and read by no backward (or remade for it, remade_off):
                       the forward's arena */
    GP_HOME_STEP,   /* made from static values only: once per step, not per micro-batch */
};

struct gp_stage_plan {
    int first, last;          /* layers [first, last) */
    enum gp_precision precision;
    enum gp_home *home;       /* per value */
    /* Per value: how the stage stores it and its gradient. Float values are
     * GP_DTYPE_FLOAT32, or GP_DTYPE_BFLOAT16 for activations (boxes, sets,
     * arena, once-per-step values) in bf16 precision; others their dtype.
     * Parameters' and once-per-step values' gradients are float32 always. */
    enum gp_dtype *dt;
    /* Per value: offset of its bfloat16 copy in the shadow block, or
     * SIZE_MAX. In bf16, every float static value (weights, biases,
     * constants) that a matrix product or convolution reads has one,
     * refreshed from the float32 master once per step; those layers read
     * it instead of the master. */
    size_t *shadow_off;
    size_t shadow_bytes;
    int *shadowed, n_shadowed; /* the value ids that have a shadow */
    /* Channels-last filter copies (GP_CHANNELS_LAST_FILTERS=1; off by
     * default: +0.3% on ResNet-50, -1.1 to -1.7% on the U-Net, and the gradients'
     * float32 copies cost memory, README): a Conv's filter W [M, C/g, kh, kw],
     * a static value no other node reads, also held as [M, kh, kw, C/g], as
     * cuDNN's channels-last kernels read it, where the kernel says it reads
     * it so (gp_compute_ops.layout_native with bit 1): made from the master
     * once per step (before the step's first forward, as the shadows)
     * instead of relaid on every call, forward and data gradient alike. In
     * bf16 the value's bfloat16 shadow is that copy (relaid as it is
     * rounded); otherwise a float32 copy at filter_off[v] in the filter
     * block. A parameter's gradient has a float32 channels-last copy too
     * (filter_grad_off in the filter gradient block), which its Conv's
     * backward accumulates into over the micro-batches and the executor
     * writes over the gradient, relaid, once the step's backward is done
     * (it holds the gradient's whole sum: the filter has no other reader),
     * and clears with the gradients at the optimizer step. */
    bool *filter_nhwc;        /* per value: its copy (shadow or filter block) lies channels-last */
    size_t *filter_off;       /* per value: offset in the filter block, or SIZE_MAX */
    size_t filter_bytes;
    size_t *filter_grad_off;  /* per value: offset in the filter gradient block, or SIZE_MAX */
    size_t filter_grad_bytes;
    int *filtered, n_filtered; /* the value ids with a channels-last copy */
    /* With the setting on: every bfloat16 shadow made in the filter
     * copies' launches (a flat tensor relaid is itself), not one launch
     * each. */
    bool batch_shadows;
    uint32_t *call_held;      /* per layer: inputs read through a channels-last copy (bit k) */
    /* bf16: per layer of the stage, its call's storage types (gp_layer_call's
     * in_dt, out_dt, din_dt and dout_dt, in that order, n_inputs + 1,
     * n_outputs + 1, n_inputs + 1 and n_outputs + 1 long: kernels may look one
     * past their inputs, at an omitted optional one, which reads float32) at
     * call_dt + call_dt_off[layer - first],
     * and which of its inputs it reads through a shadow (bit k); NULL in fp32
     * and tf32, where every float tensor is float32. A value read through its
     * shadow is bfloat16, a parameter's or once-per-step value's gradient
     * float32, the rest as dt says. */
    enum gp_dtype *call_dt;
    size_t *call_dt_off;
    uint32_t *call_shadowed;
    size_t *step_grad_off;    /* per once-per-step value: its gradient's offset */
    size_t step_grad_bytes;
    /* Float32 copies for kernels that compute in float32 on bfloat16 values
     * (backend/mixed_call.h): the most any layer call or the loss needs. */
    size_t staging_bytes;
    size_t *off;              /* per value: offset in its home's block */
    size_t *grad_off;         /* per value: offset in the gradient set, SIZE_MAX: none */
    size_t *inbox_off;        /* per value: offset in a gradient inbox, SIZE_MAX: none */
    size_t *saved_off;        /* per layer of the stage: offset of its saved state in a set */
    size_t static_bytes, param_bytes, box_bytes, local_bytes, grad_bytes, inbox_bytes,
        scratch_bytes, arena_bytes, step_bytes;
    int scratch_layer; /* the node whose workspace is scratch_bytes (-1: none needs any) */
    /* The gradient set lives in the forward arena's memory (one block of
     * the larger of the two): the arena is written and read only inside a
     * forward task (forward, recompute, evaluation), the gradient set only
     * inside a backward task, and a stage's tasks run one after another on
     * its compute stream, so one never meets the other, whatever the
     * schedule or checkpointing. Set by the pipeline for stage 0, whose
     * gradient set nothing reads after its backward task; a later stage's
     * input gradients are copied out of its set on another stream after
     * the task, which the next forward would have to wait for. The two
     * blocks' bytes together: gp_plan_shared_bytes. */
    bool grads_share_arena;
    /* Per layer of the stage: true when it reads static values only (a
     * weight's Transpose, positions' embedding): it runs forward once per
     * step and backward once, after the step's last micro-batch. */
    bool *once;
    int *frontier_in, n_frontier_in;   /* value ids at cut `first` */
    int *frontier_out, n_frontier_out; /* value ids at cut `last` */
    int max_inputs, max_outputs;
    /* Gradient regions to zero as the backward reaches them, by time t
     * (0: the start of the backward, t >= 1: before layer last - t):
     * born[born_start[t] .. born_start[t + 1]) are value ids. */
    int *born_start, *born;
    /* The same as merged byte ranges of the gradient set, for clearing:
     * zeros[zero_start[t] .. zero_start[t + 1]); not the output frontier's,
     * which the backward copies whole from the inbox, nor those below. */
    int *zero_start;
    struct gp_byte_range {
        size_t off, bytes;
        bool in_set; /* in the micro-batch's activation set (grad_in_set) */
    } *zeros;
    /* Per layer of the stage: the inputs whose gradient its backward writes
     * whole (gp_layer_call.din_overwrite, bit k): this layer is the first to
     * write it and its kernel can, so the region is not in `zeros`. */
    uint32_t *din_overwrite;
    /* Remade activations (gp_compute_options.remake_norm): a value some
     * backward reads that its layer can write again from its kept inputs and
     * saved state (gp_compute_ops.remakes: a BatchNormalization's output,
     * from its input and the batch's statistics) is not kept in the
     * activation set: the forward holds it in the arena like a forward-only
     * value, and the backward writes it again (gp_layer_call.remake) into
     * the gradient set, at remade_off[v] (SIZE_MAX: not remade), just
     * before the first backward that reads it, where it stays until its
     * own layer's backward is done. remade[remade_start[t] ..
     * remade_start[t + 1]) are the values remade at backward time t (as
     * born). The same bits as keeping it; one more pass over it. */
    size_t *remade_off;
    int *remade_start, *remade;
    /* Gradients in the activation set's dead bytes (plan.c): a gradient
     * region (or remade value) born when part of the micro-batch's set is
     * read by nothing to come (kept values past their last backward reader,
     * layers' saved state past their backward) lies there where it fits
     * rather than in the gradient set: grad_off[v] (remade_off[v]) then
     * counts from the start of that micro-batch's set when grad_in_set[v]
     * (remade_in_set[v]). Never the input frontier's gradients (copied out
     * after the backward, when the set may be reused) nor the output
     * frontier's (born before anything is dead). GP_GRADIENTS_IN_SETS=0:
     * every one in the gradient set, for comparisons. */
    bool *grad_in_set, *remade_in_set;
    /* Gradient addends (plan.c, plan_addends): where several layers add
     * into a value's gradient and the kernel of the layer that made it can
     * read that gradient as two terms (gp_compute_ops.grad_addend), the
     * last term, its first reader's (addend_writer[v]; INT_MIN: none),
     * goes to a region of its own, written whole (din_overwrite), which the
     * producer's backward adds as it reads the rest
     * (gp_layer_call.dout_addend): the add's pass over the sum goes (its
     * write, and the read of it back). ResNet: a block's first
     * convolution's data gradient, which the previous block's BatchNorm
     * adds to the residual path's. The region, at addend_off[v] (in the
     * micro-batch's activation set when addend_in_set[v], as grad_in_set),
     * lives from the writer's backward to the producer's. The same bits
     * as adding in place (the backend says where). GP_GRAD_ADDENDS=0:
     * none, for comparisons. */
    int *addend_writer;
    size_t *addend_off;
    bool *addend_in_set;
    /* Backward workspaces (plan.c, plan_scratch): a layer's backward call
     * needs bwd_scratch_bytes[layer - first] of workspace only while it
     * runs, so it lies, where it fits, in the micro-batch's activation
     * set's dead bytes at bwd_scratch_off (counted from the set's start,
     * 256-byte aligned; SIZE_MAX: in the kernel workspace block, which
     * holds the loss's, the remakes' and the once-per-step layers'
     * workspaces and the others that find no place). A
     * convolution's backward asks far more than its forward (a data
     * gradient's accumulation buffer, the weight gradient's algorithm).
     * GP_SCRATCH_IN_SETS=0: every workspace in the block, for comparisons
     * (the forwards' too, below). */
    size_t *bwd_scratch_bytes, *bwd_scratch_off;
    /* Forward workspaces alike, in the forward arena's timeline (plan.c,
     * plan_arena): a layer's forward call's workspace lies in the arena at
     * fwd_scratch_off[layer - first] (256-byte aligned; SIZE_MAX: in the
     * block), alive during that call only. Not a once-per-step layer's
     * nor one whose output is remade (its remake runs in the backward,
     * when the arena is not the forward's). */
    size_t *fwd_scratch_bytes, *fwd_scratch_off;
};

struct gp_compute_ops;

/* Plans stage [first, last) of g for a backend's kernels (their saved and
 * scratch bytes). `needs_grad` marks values that carry gradients
 * (gp_plan_needs_grad). Fails naming every layer the backend has no kernel
 * (or no backward) for, and when a buffer is read by layers of another
 * stage too (it must live in one place). A parameter read by several stages
 * is planned on each as its own copy (pipeline/tied.c keeps them equal). */
gp_status gp_plan_stage(const struct gp_graph *g, const struct gp_layers *l, const bool *needs_grad,
                        const struct gp_compute_ops *ops, const struct gp_compute_options *opts,
                        const char *backend, int first, int last, struct gp_stage_plan *out,
                        struct gp_error *err);

/* Bytes of the arena and the gradient set together: the larger of them
 * when they share a block (grads_share_arena), else their sum. */
size_t gp_plan_shared_bytes(const struct gp_stage_plan *p);

/* How many values' gradients take their last term apart (addend_writer). */
int gp_plan_addends(const struct gp_graph *g, const struct gp_stage_plan *p);

/* Stored bytes of value v on the stage (its storage type). */
size_t gp_plan_value_bytes(const struct gp_graph *g, const struct gp_stage_plan *p, int v);

/* Whether a node type reads bfloat16 copies of its weights in bf16
 * precision (autocast's lower-precision list: matrix products and
 * convolutions). */
bool gp_plan_autocast_op(const struct gp_node *n);
void gp_plan_free(struct gp_stage_plan *p);

/* Values that carry gradients: float parameters and every float output of
 * a node with such an input in a differentiable slot. */
void gp_plan_needs_grad(const struct gp_graph *g, bool *needs);

/* kept[v]: whether v is kept for the backward in a micro-batch's
 * activation set, as a stage holding the whole graph keeps values (its
 * kernels' saved_bytes decide which layers run once per step): some
 * backward reads v (gp_backward_reads, given the gradients it is asked
 * for), or v is a graph output, and no once-per-step layer makes it (those
 * live in the step's block). The rest live only through the forward, in
 * the arena. With `remakes` (gp_compute_ops.remakes; NULL: none), as
 * with gp_compute_options.remake_norm: a layer's output 0 that its kernel
 * can write again in the backward, made per micro-batch, not a graph
 * output, from inputs that stay (static, the stage's input or kept) is
 * remade, not kept (remakeable). What the balancer counts per layer
 * (partitioner/profile.c). False when out of memory. */
bool gp_plan_backward_kept(const struct gp_graph *g, const bool *needs_grad,
                           size_t (*saved_bytes)(const struct gp_graph *, const struct gp_node *),
                           bool (*remakes)(const struct gp_graph *, const struct gp_node *), bool *kept);

#endif
