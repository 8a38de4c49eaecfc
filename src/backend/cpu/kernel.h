/* CPU kernels: forward and backward per op type.
 *
 * Shapes are static and live in the graph (g->values[id].shape, with axis 0
 * bound to the micro-batch), so a kernel reads them from there and gets only
 * data pointers here. Floating-point tensors (any float dtype in the graph)
 * are `real` arrays; int64, int32 and bool (uint8) tensors keep their types.
 *
 * Gradient convention: backward ACCUMULATES (+=) into every non-NULL din[k].
 * The executor zeroes gradient buffers when a step (parameters) or a
 * micro-batch's backward (activations) begins, so parameters accumulate
 * over micro-batches and values read by several nodes sum their gradients
 * with no extra code. din[k] is NULL when input k needs no gradient (data,
 * indices, constants); dout[k] is NULL when output k gets no gradient (read
 * by nothing that needs one): treat it as zero. The exception: a kernel
 * whose `overwrites` says so may be asked (din_overwrite bit k) to write
 * din[k] whole, as 0 + its gradient, because the executor did not clear it
 * (this layer is the first to write it); it must then write every element,
 * zeros included where dout is NULL. */
#ifndef GP_BACKEND_CPU_KERNEL_H
#define GP_BACKEND_CPU_KERNEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/real.h"
#include "graph/graph.h"
#include "ops/registry.h"

struct gp_cpu_ctx {
    const struct gp_graph *graph;
    const struct gp_node *node;
    void *const *in;     /* [node->n_inputs]; NULL for omitted optional inputs */
    void *const *out;    /* [node->n_outputs]; NULL for omitted outputs */
    real *const *din;    /* [node->n_inputs]: gradients to accumulate into, or NULL */
    uint32_t din_overwrite; /* bit k: din[k] is not cleared: write it (see above) */
    real *const *dout;   /* [node->n_outputs]: incoming gradients, or NULL (zero) */
    void *saved;         /* saved_bytes() of per-micro-batch state: written by
                            forward, read by backward (dropout needs none: its
                            mask is drawn again from the same RNG key) */
    void *scratch;       /* scratch_bytes() of workspace, contents undefined */
    bool training;       /* batch statistics and dropout on; false for evaluation */
    bool update_state;   /* forward may update running statistics (false on
                            recomputation, so a checkpointed micro-batch
                            counts once) */
    uint64_t seed, step; /* the dropout RNG key, with the node's source_index */
    int64_t sample_offset; /* index of this micro-batch's first sample in the
                              mini-batch: dropout keys elements by their global
                              index, so any split into micro-batches draws the
                              same masks */
    double dropout_ratio;  /* < 0: the model's own ratios; otherwise overrides them */
    /* Deferred batch normalization: when non-NULL (and update_state),
     * BatchNormalization adds its batch's per-channel sums [C], sums of
     * squares [C] and value count [1] here instead of updating its running
     * statistics; gp_cpu_bn_commit applies them once per mini-batch. */
    double *deferred_stats;
    /* Forward: write output 0 again from the inputs and the saved state, as
     * the training forward did, and nothing else (backend/compute.h,
     * gp_layer_call.remake; only where the kernel's `remakes` says). */
    bool remake;
    /* How the outputs are stored (gp_layer_call.stored_out_dt; the kernel
     * sees float32 copies of bfloat16 ones): NULL, float32. */
    const enum gp_dtype *stored_out_dt;
};

struct gp_cpu_kernel {
    const char *op_type;
    size_t (*saved_bytes)(const struct gp_graph *g, const struct gp_node *node);   /* NULL: 0 */
    size_t (*scratch_bytes)(const struct gp_graph *g, const struct gp_node *node); /* NULL: 0 */
    gp_status (*forward)(struct gp_cpu_ctx *ctx, struct gp_error *err);
    /* NULL when the op has no gradient: the executor refuses to train
     * through it (e.g. comparisons); it may still run in forward. */
    gp_status (*backward)(struct gp_cpu_ctx *ctx, struct gp_error *err);
    /* Whether backward can write input k's gradient whole when asked
     * (gp_cpu_ctx.din_overwrite). NULL: never. */
    bool (*overwrites)(const struct gp_graph *g, const struct gp_node *node, int k);
    /* Whether forward can remake output 0 (gp_cpu_ctx.remake). NULL: never. */
    bool (*remakes)(const struct gp_graph *g, const struct gp_node *node);
};

/* Whether bit k of the context's din_overwrite is set. */
static inline bool gp_cpu_overwrite(const struct gp_cpu_ctx *c, int k)
{
    return k < 32 && ((c->din_overwrite >> k) & 1);
}

/* The kernel for a node (matched by op_type; a kernel reads
 * node->def->since_version itself where versions differ), or NULL. */
const struct gp_cpu_kernel *GP_CPU(gp_cpu_kernel_for)(const struct gp_node *node);

/* Kernel tables, one per family file (src/backend/cpu/<family>.c, twin of
 * src/backend/cuda/<family>.cu), terminated by an entry with op_type NULL.
 * elementwise: unary ops, Clip, Cast, Identity; binary: the broadcasting
 * ops (binary, variadic Max/Min/Sum/Mean, Where, Expand); shape: Reshape,
 * Transpose, Concat, Split, Slice, Tile, Trilu and the shape producers;
 * reduce: the reductions and ArgMax/ArgMin; resize: Resize, Upsample. */
extern const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_elementwise)[];
extern const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_binary)[];
extern const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_shape)[];
extern const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_gather)[];
extern const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_pad)[];
extern const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_matmul)[];
extern const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_conv)[];
extern const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_pool)[];
extern const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_batch_norm)[];
extern const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_instance_norm)[];
extern const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_layer_norm)[];
extern const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_softmax)[];
extern const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_reduce)[];
extern const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_dropout)[];
extern const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_resize)[];
extern const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_attention)[];

/* Deferred batch normalization: doubles of statistics a BatchNormalization
 * node accumulates (2C + 1), and the update of its running statistics from
 * them (then cleared), as if the whole mini-batch had been one batch. */
size_t GP_CPU(gp_cpu_bn_stats_len)(const struct gp_graph *g, const struct gp_node *node);
void GP_CPU(gp_cpu_bn_commit)(const struct gp_graph *g, const struct gp_node *node, real *rmean,
                              real *rvar, double *stats);

/* Helpers shared by kernels. */
static inline const struct gp_value *gp_cpu_in_value(const struct gp_cpu_ctx *c, int i)
{
    return gp_node_input(c->graph, c->node, i);
}
static inline const struct gp_value *gp_cpu_out_value(const struct gp_cpu_ctx *c, int i)
{
    return gp_node_output(c->graph, c->node, i);
}
/* "node 'name' (Op): message" into err; returns status. */
gp_status GP_CPU(gp_cpu_error)(const struct gp_cpu_ctx *c, struct gp_error *err, gp_status status,
                               const char *fmt, ...) __attribute__((format(printf, 4, 5)));
#define gp_cpu_error GP_CPU(gp_cpu_error)

#endif
