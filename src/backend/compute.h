/* What a pipeline stage computes with, per backend: the layer kernels and
 * the other work of a training step (buffer zeroing and accumulation, the
 * loss, deferred BatchNorm statistics, the optimizer, gradient norms).
 *
 * The executor calls these only inside its tasks (gp_device_ops.enqueue),
 * with pointers into the stage's device memory. On the CPU backend they run
 * there and then; on CUDA they launch onto the task's stream and return, so
 * a whole step is issued without the host waiting. Each backend's device
 * ops point at their compute ops (gp_device_ops.compute). */
#ifndef GP_BACKEND_COMPUTE_H
#define GP_BACKEND_COMPUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "graph/graph.h"
#include "train/loss.h"
#include "train/optim.h"
#include "util/env.h"
#include "util/error.h"

struct gp_device;
struct gp_stream;

/* The arithmetic a stage trains in (README, "Precision"):
 *   FP32  float32 everywhere (the reference: CPU and GPU agree to rounding);
 *   TF32  float32 storage, matrix products and convolutions on TF32 tensor cores;
 *   BF16  as PyTorch's autocast: float32 parameters, their gradients and the
 *         optimizer state; activations, activation gradients and frontiers
 *         stored in bfloat16; matrix products and convolutions read a bfloat16
 *         copy of their weights and accumulate in float32; every other op
 *         computes in float32 from bfloat16 inputs and rounds its outputs (round
 *         to nearest even) once. */
enum gp_precision { GP_PRECISION_FP32, GP_PRECISION_TF32, GP_PRECISION_BF16 };
const char *gp_precision_name(enum gp_precision p); /* "fp32", "tf32", "bf16" */
/* "fp32" | "tf32" | "bf16" (also "float32", "bfloat16"); false otherwise. */
bool gp_precision_parse(const char *s, enum gp_precision *out);

/* What a stage's compute context is set up for. */
struct gp_compute_options {
    enum gp_precision precision;
    bool fast_conv; /* convolutions may use the fastest, non-deterministic algorithms
                       (as cudnn.benchmark picks); default: deterministic ones */
    /* The planner (pipeline/plan.h, remade_off; train --recompute-norm):
     * BatchNormalization outputs written again in the backward from the
     * kept input and the saved statistics instead of kept in the activation
     * set: less memory, one more pass over each (the same bits either way). */
    bool remake_norm;
    /* With remake_norm, only the values marked here (per value id; NULL:
     * every one the planner can remake): --recompute-norm auto remakes the
     * fewest that make a stage fit. */
    const bool *remake_only;
};

/* scratch_bytes's din bit for a layer with a call on float32 tensors in
 * bf16 (gp_compute_ops.scratch_bytes). */
#define GP_SCRATCH_FLOAT_CALL (1u << 31)
/* scratch_bytes's din bit asking for the backward call's workspace alone
 * (without it: the most of the forward's and the backward's). ~0u, every
 * bit, still asks for the most of every call: the callers that plan one
 * workspace for the whole layer pass it (gp_scratch_backward_only). A
 * workspace starts 256-byte aligned. */
#define GP_SCRATCH_BACKWARD (1u << 30)
#define GP_SCRATCH_ALIGN 256

static inline bool gp_scratch_backward_only(uint32_t din) { return din != ~0u && (din & GP_SCRATCH_BACKWARD); }

/* GP_GRAD_ADDENDS (pipeline/plan.h, addend_off): "on" (or 1), the
 * default, where a backend's kernel adds the term as it reads the gradient
 * (grad_addend: the GPU's); "off" (or 0), none; "all", the CPU backend's
 * kernels too, the term added before the call, for tests (the same bits
 * as "off"). */
enum gp_grad_addends { GP_GRAD_ADDENDS_ON, GP_GRAD_ADDENDS_OFF, GP_GRAD_ADDENDS_ALL };

static inline enum gp_grad_addends gp_grad_addends(void)
{
    static const char *const ways[] = {"on", "off", "all", "1", "0", NULL};
    static const enum gp_grad_addends as[] = {GP_GRAD_ADDENDS_ON, GP_GRAD_ADDENDS_OFF, GP_GRAD_ADDENDS_ALL,
                                              GP_GRAD_ADDENDS_ON, GP_GRAD_ADDENDS_OFF};
    return as[gp_env_choice("GP_GRAD_ADDENDS", ways, 0)];
}

/* One layer's call: the fields of the backends' kernel contexts
 * (backend/cpu/kernel.h says what each means). */
struct gp_layer_call {
    const struct gp_graph *graph;
    const struct gp_node *node;
    const void *kernel;      /* kernel_for(node), looked up once by the caller */
    void *const *in, *const *out;
    float *const *din, *const *dout;
    /* Storage types of the tensors behind in/out/din/dout: a float tensor is
     * GP_DTYPE_FLOAT32 or GP_DTYPE_BFLOAT16 (then its pointer above points at
     * bfloat16 data, whatever its C type says); others their own dtype. NULL:
     * every float tensor is float32. Only kernels that say they read bfloat16
     * (kernel_bf16) see bfloat16 here: backend/mixed_call.h stages the rest. */
    const enum gp_dtype *in_dt, *out_dt, *din_dt, *dout_dt;
    /* How the outputs are stored (as out_dt), also when the kernel is given
     * float32 copies instead (backend/mixed_call.h sets it): a fused kernel
     * rounds an intermediate result as the unfused nodes stored it (a
     * BatchNormalization's normalized value before its fused residual Add),
     * and a backward tells a stored output's sign without reading it (a
     * fused Relu's mask from X). Set for forward and backward calls alike.
     * NULL: float32. */
    const enum gp_dtype *stored_out_dt;
    /* Bit k: din[k] holds no gradient yet and was not cleared (this layer is
     * the first to write it: the planner skipped its zeroing), so the
     * backward writes every element of it (=, as 0 + x) instead of adding.
     * Set only where gp_compute_ops.overwrites said the kernel can. */
    uint32_t din_overwrite;
    /* Backward only, not NULL where gp_compute_ops.grad_addend said yes:
     * output 0's gradient is dout[0] + dout_addend, element by element, as
     * convert's accumulate adds (float32 sum, one rounding to the storage
     * type): the last term of it, written apart by its last writer
     * (pipeline/plan.h, addend_off), for the kernel to add as it reads
     * dout[0] rather than in a pass of its own over both. The same storage
     * type and layout as dout[0], whose region the kernel may write (this
     * call is its last reader). */
    const void *dout_addend;
    /* Bit k: input k (in_nhwc) or output k (out_nhwc), and its gradient,
     * lies channels-last ([N, H, W, C] for the shape [N, C, H, W];
     * gp_value.channels_last). Nonzero only for a kernel that said it reads
     * that call's layouts itself (gp_compute_ops.layout_native): the others
     * get [N, C, H, W] copies (backend/mixed_call.h). */
    uint32_t in_nhwc, out_nhwc;
    /* Bit k: in[k] is the executor's channels-last copy of a static value
     * the graph keeps [N, C, H, W] (a Conv's filter W [M, C/g, kh, kw] as
     * [M, kh, kw, C/g]: pipeline/plan.h, filter copies), while din[k], its
     * gradient, lies as the value does. Set only where layout_native said
     * yes to the call with bit k in in_nhwc; in_nhwc carries it too. */
    uint32_t held_nhwc;
    /* Bit k (only where held_nhwc has it): din[k] too is the executor's
     * channels-last copy, of the value's gradient, which the executor adds
     * into the gradient once the step's backward is done. */
    uint32_t held_grad_nhwc;
    void *saved, *scratch;
    bool training, update_state;
    /* Forward only, for a kernel whose `remakes` said yes: write output 0
     * again, the bits its training forward wrote, from the inputs and the
     * saved state that forward left, and nothing else (no statistics, no
     * other output, the saved state untouched; out[k > 0] are NULL). */
    bool remake;
    uint64_t seed, step;
    const uint64_t *step_dev; /* device memory holding the step, or NULL (CUDA graphs) */
    int64_t sample_offset;
    double dropout_ratio;
    double *deferred_stats;
};

/* The training objective on the last stage's output. */
struct gp_loss_spec {
    enum gp_loss_kind kind;
    int class_axis;          /* cross-entropy: resolved (not AUTO) */
    int64_t ignore_index;
    enum gp_dtype target_dtype; /* int64 labels, float32 targets, or UNDEFINED (output loss) */
    struct gp_shape target_shape; /* per micro-batch */
};

/* One micro-batch's loss: dout written (=) with the gradient scaled by
 * 1/denominator, the terms' sum written to *loss_sum (device memory). */
struct gp_loss_call {
    const struct gp_loss_spec *spec;
    const struct gp_shape *out_shape;
    const void *out;
    const void *target;      /* NULL for the output loss */
    void *dout;
    /* How out and dout are stored: GP_DTYPE_FLOAT32 (or UNDEFINED, the
     * same), or GP_DTYPE_BFLOAT16 for a backend with loss_bf16 (others get
     * float32 copies: backend/mixed_call.h). */
    enum gp_dtype dt;
    double denominator;
    double *loss_sum;
    void *scratch;           /* loss_scratch_bytes() */
};

/* How a kernel meets bfloat16 storage (gp_compute_ops.kernel_bf16). */
enum gp_bf16_calls {
    /* float32 only: bfloat16 tensors reach it through float32 copies
     * (backend/mixed_call.h) */
    GP_BF16_STAGED = 0,
    /* reads and writes bfloat16 itself when every float input, output and
     * incoming gradient is bfloat16 (input gradients may be float32: a
     * parameter's); a mix is staged (the matrix products and convolutions) */
    GP_BF16_UNIFORM,
    /* reads and writes each float tensor as its *_dt entry says, any mix of
     * bfloat16 activations and float32 parameters */
    GP_BF16_ANY,
};

struct gp_compute_ops {
    /* Per-stage state bound to the stage's compute stream (CUDA: cuBLAS and
     * cuDNN handles in the math mode the precision asks for), with
     * `workspace`: context_bytes of the stage's planned device memory for
     * the libraries. */
    size_t context_bytes;
    gp_status (*context_create)(struct gp_device *dev, struct gp_stream *compute,
                                const struct gp_compute_options *opts, void *workspace, void **ctx,
                                struct gp_error *err);
    void (*context_destroy)(void *ctx);

    /* Kernel lookup: false when the backend has no kernel for the node;
     * *trainable tells whether it has a backward. */
    bool (*has_kernel)(const struct gp_node *node, bool *trainable);
    /* The backend's kernel for the node (opaque), for gp_layer_call.kernel:
     * looked up once per layer rather than on every call. */
    const void *(*kernel_for)(const struct gp_node *node);
    /* How that kernel's forward, or backward, meets bfloat16 storage (the
     * call's *_dt arrays). */
    enum gp_bf16_calls (*kernel_bf16)(const void *kernel, bool backward);
    /* Whether the kernel's backward writes input k's gradient whole when
     * asked to (gp_layer_call.din_overwrite), so the planner need not clear
     * it first. NULL: never. */
    bool (*overwrites)(const struct gp_graph *g, const struct gp_node *node, int k);
    /* Whether the kernel reads and writes the call's channels-last tensors
     * as they lie (gp_layer_call.in_nhwc, out_nhwc), forward or backward.
     * NULL, or false: they reach it through [N, C, H, W] copies. Layout-
     * neutral ops (ops/layout_neutral.h) need no say: they run on the
     * tensors as they lie whenever their layouts agree. */
    bool (*layout_native)(const void *kernel, const struct gp_graph *g, const struct gp_node *node,
                          uint32_t in_nhwc, uint32_t out_nhwc, bool backward);
    size_t (*saved_bytes)(const struct gp_graph *g, const struct gp_node *node);
    /* Whether the kernel's forward can remake the node's output 0
     * (gp_layer_call.remake). NULL: never. */
    bool (*remakes)(const struct gp_graph *g, const struct gp_node *node);
    /* The kernel's workspace with the stage's options (a convolution's
     * algorithm, and so its workspace, depends on precision and policy),
     * for a backward that computes the gradients of the inputs in `din`
     * (bit k: input k; all bits when the caller does not know): a
     * convolution plans no workspace for a direction it never runs (the
     * data gradient of a network's first convolution). Bit 31
     * (GP_SCRATCH_FLOAT_CALL) says that in bf16 some call of the layer
     * computes on float32 tensors (its own float32 storage, or copies:
     * backend/mixed_call.h), where a convolution runs another problem;
     * without it, only its bfloat16 calls are planned for. */
    size_t (*scratch_bytes)(const struct gp_graph *g, const struct gp_node *node,
                            const struct gp_compute_options *opts, uint32_t din);
    gp_status (*forward)(void *ctx, const struct gp_layer_call *c, struct gp_error *err);
    gp_status (*backward)(void *ctx, const struct gp_layer_call *c, struct gp_error *err);

    gp_status (*zero)(void *ctx, void *ptr, size_t bytes, struct gp_error *err);
    /* dst = src (accumulate: dst += src), n elements of float32 or bfloat16
     * each; arithmetic in float32, a bfloat16 result rounded to nearest even. */
    gp_status (*convert)(void *ctx, void *dst, enum gp_dtype dst_type, const void *src, enum gp_dtype src_type,
                         int64_t n, bool accumulate, struct gp_error *err);
    /* The same for a rank-4 tensor of logical shape [N, C, H, W] (`shape`)
     * between layouts: dst (channels-last when dst_nhwc) = src (channels-
     * last when src_nhwc), or += with accumulate. Exact but for a bfloat16
     * destination's one rounding. */
    gp_status (*relayout)(void *ctx, void *dst, enum gp_dtype dst_type, bool dst_nhwc, const void *src,
                          enum gp_dtype src_type, bool src_nhwc, const struct gp_shape *shape, bool accumulate,
                          struct gp_error *err);

    size_t (*loss_scratch_bytes)(const struct gp_shape *out_shape);
    gp_status (*loss)(void *ctx, const struct gp_loss_call *c, struct gp_error *err);
    /* Whether loss reads a bfloat16 output and writes its bfloat16
     * gradient itself (gp_loss_call.dt), with the staged path's bits: the
     * float32 loss on the widened output, its gradient rounded once. */
    bool loss_bf16;

    /* Deferred BatchNorm (backend/cpu/kernel.h). The sums are cleared
     * either way; the running statistics are left alone where `skip`
     * (device memory, the step's gp_optim_scalars.skip; NULL: never) is
     * nonzero when the commit runs: the step diverged. */
    size_t (*bn_stats_len)(const struct gp_graph *g, const struct gp_node *node);
    gp_status (*bn_commit)(void *ctx, const struct gp_graph *g, const struct gp_node *node, float *rmean,
                           float *rvar, double *stats, const int32_t *skip, struct gp_error *err);

    /* One optimizer step over the stage's parameters (device pointers),
     * gp_optim_apply's: the scalars (learning rate, bias corrections,
     * clipping coefficient, skip) are read from `scalars`, device memory,
     * when the step runs, not when it is issued, so a captured step
     * replays with each step's values. opt->steps is not changed. */
    gp_status (*optim_step)(void *ctx, struct gp_optim *opt, const struct gp_optim_scalars *scalars,
                            struct gp_error *err);
    /* The step's guard, gp_optim_guard's arithmetic bit for bit, on device
     * memory: norms (float), order (int32: which norm is the model's i-th
     * parameter's, n of them), loss_parts (m doubles), and the scalars it
     * reads (max_norm, denominator) and completes (total_norm, coef, skip). */
    gp_status (*optim_guard)(void *ctx, const float *norms, const int32_t *order, int n, const double *loss_parts,
                             int m, struct gp_optim_scalars *scalars, struct gp_error *err);
    /* Waits until the work launched so far has run (profiling only). */
    gp_status (*synchronize)(void *ctx, struct gp_error *err);
    /* out[k] (device memory) = the 2-norm of tensors[k], for clipping. */
    gp_status (*norms)(void *ctx, const float *const *tensors, const int64_t *numels, int count, float *out,
                       struct gp_error *err);
    /* relayout's dst[t] (dst_type; channels-last when to_nhwc) = src[t]
     * (float32, laid out the other way; logical shape shapes[t], [N, C,
     * H, W]), or += with accumulate, for t < n, in as few launches as the
     * backend can (a stage's filter copies and their gradients, once per
     * step, pipeline/plan.h). NULL: the caller relays them one at a time. */
    gp_status (*relayout_many)(void *ctx, int n, void *const *dst, enum gp_dtype dst_type, bool to_nhwc,
                               const float *const *src, const struct gp_shape *const *shapes, bool accumulate,
                               struct gp_error *err);
    /* Whether the backward of `producer` may take its output 0's gradient
     * as two terms (gp_layer_call.dout_addend): the sum its other readers
     * wrote, and apart, stored in dt, the term of `writer`, its last
     * reader (so the last backward to add into it), whose input `slot` it
     * is and whose kernel writes that gradient whole (overwrites). Say yes
     * only where the bits equal writer adding in place: writer's term
     * needs no rounding to dt (float32) or writer rounds it to dt before
     * adding anyway (a bfloat16 convolution's data gradient, as PyTorch's
     * autograd adds two bfloat16 gradients). NULL: never. */
    bool (*grad_addend)(const struct gp_graph *g, const struct gp_node *producer, const struct gp_node *writer,
                        int slot, enum gp_dtype dt);
};

extern const struct gp_compute_ops gp_cpu_compute_ops;

#endif
