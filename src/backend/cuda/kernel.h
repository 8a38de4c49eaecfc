/* CUDA kernels: forward and backward per op type, the CUDA twin of
 * backend/cpu/kernel.h with the same conventions, so that a stage runs the
 * same layer list on either backend and the CPU kernels are the reference
 * the CUDA ones are tested against.
 *
 * Shapes live in the graph (static, axis 0 bound to the micro-batch); the
 * context gives device pointers. Float tensors are float32 (TF32 only when
 * ctx->tf32). Backward ACCUMULATES (+=) into every non-NULL din[k]; dout[k]
 * NULL means a zero gradient. A kernel launches its work on ctx->stream and
 * never synchronizes the host; it allocates nothing (scratch and saved state
 * are planned, like the CPU backend's). */
#ifndef GP_CUDA_KERNEL_H
#define GP_CUDA_KERNEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "graph/graph.h"
#include "ops/registry.h"

struct gp_cuda_ctx {
    const struct gp_graph *graph;
    const struct gp_node *node;
    void *const *in;       /* [node->n_inputs] device pointers; NULL for omitted inputs */
    void *const *out;      /* [node->n_outputs] */
    float *const *din;     /* gradients to accumulate into, or NULL */
    uint32_t din_overwrite; /* bit k: write din[k] whole instead (backend/compute.h) */
    /* Bit k: input k (in_nhwc) or output k (out_nhwc), and its gradient,
     * lies channels-last, [N, H, W, C] for the graph's [N, C, H, W]. Only
     * for a kernel whose `layout_native` said yes to the call; zero for
     * every other. A Conv's W (bit 1 of in_nhwc) is the executor's copy
     * (gp_layer_call.held_nhwc), its gradient channels-last only where
     * held_grad_nhwc says. */
    uint32_t in_nhwc, out_nhwc;
    /* Bit k: din[k] is the executor's channels-last copy of input k's
     * gradient (gp_layer_call.held_grad_nhwc; input k channels-last too). */
    uint32_t held_grad_nhwc;
    float *const *dout;    /* incoming gradients, or NULL (zero) */
    /* Output 0's gradient is dout[0] + dout_addend (backend/compute.h,
     * gp_layer_call.dout_addend): only a BatchNormalization's backward
     * sees one (compute.cu adds it in place for any other kernel). */
    const void *dout_addend;
    /* Storage types of in/out/din/dout (backend/compute.h, gp_layer_call):
     * GP_DTYPE_FLOAT32 or GP_DTYPE_BFLOAT16 for float tensors. Non-NULL and
     * holding bfloat16 only for a kernel whose table entry sets `bf16` or
     * `bf16_any`; the others always see float32. */
    const enum gp_dtype *in_dt, *out_dt, *din_dt, *dout_dt;
    void *saved;           /* saved_bytes() of device memory per micro-batch */
    void *scratch;         /* scratch_bytes() of device memory, contents undefined */
    cudaStream_t stream;
    void *cublas;          /* cublasHandle_t bound to `stream`, math mode set by tf32 */
    void *cublas_workspace; /* cublas's workspace (GP_CUDA_LIBS_WORKSPACE_BYTES), which
                               cuBLASLt's calls on `stream` share (stream order keeps them
                               apart); NULL: they take none */
    void *cudnn;           /* cudnnHandle_t bound to `stream` */
    bool tf32;             /* allow TF32 tensor cores; default off: float32 semantics */
    bool fast_conv;        /* convolutions may take the fastest, non-deterministic algorithms */
    bool training, update_state;
    uint64_t seed, step;   /* dropout key, as on the CPU (backend/cpu/rng.h) */
    const uint64_t *step_dev; /* when non-NULL, the step is read from here (device memory), so a
                                 replayed CUDA graph draws each step's masks */
    int64_t sample_offset;
    double dropout_ratio;  /* < 0: the model's own */
    double *deferred_stats; /* device memory; see backend/cpu/kernel.h */
    /* Forward: write output 0 again, the bits the training forward wrote,
     * from the inputs and its saved state, nothing else (backend/compute.h,
     * gp_layer_call.remake; only where the kernel's `remakes` says). */
    bool remake;
    /* How the outputs are stored (gp_layer_call.stored_out_dt): out_dt's,
     * also when the kernel is handed float32 copies. NULL: float32. */
    const enum gp_dtype *stored_out_dt;
};

struct gp_cuda_kernel {
    const char *op_type;
    size_t (*saved_bytes)(const struct gp_graph *g, const struct gp_node *node);   /* NULL: 0 */
    size_t (*scratch_bytes)(const struct gp_graph *g, const struct gp_node *node); /* NULL: 0 */
    gp_status (*forward)(struct gp_cuda_ctx *ctx, struct gp_error *err);
    gp_status (*backward)(struct gp_cuda_ctx *ctx, struct gp_error *err); /* NULL: no gradient */
    /* Reads and writes bfloat16 storage itself (ctx->*_dt), with float32
     * arithmetic inside, when all its float tensors are bfloat16 (input
     * gradients may be float32; GP_BF16_UNIFORM); false: the executor hands
     * it float32 copies. */
    bool bf16;
    /* Reads and writes each float tensor as ctx->*_dt says, any mix of
     * bfloat16 and float32 (GP_BF16_ANY; backend/cuda/bf16.cuh). */
    bool bf16_any;
    /* Its backward may run on float32 copies even so (mixed_call.h), when
     * gp_cuda_conv_backward_staged() says: the convolutions, whose
     * bfloat16 backward in cuDNN was once slower than TF32's on the copies. */
    bool bf16_staged_backward;
    /* Whether backward writes input k's gradient whole when asked
     * (gp_cuda_ctx.din_overwrite): every element, as 0 + its gradient.
     * NULL: never. Not asked with GP_CUDA_FIRST_WRITERS=0. */
    bool (*overwrites)(const struct gp_graph *g, const struct gp_node *node, int k);
    /* Whether it reads and writes the call's channels-last tensors itself
     * (in_nhwc, out_nhwc, as given) in forward, or backward. NULL: never;
     * the executor hands it [N, C, H, W] copies (backend/mixed_call.h). */
    bool (*layout_native)(const struct gp_graph *g, const struct gp_node *node, uint32_t in_nhwc,
                          uint32_t out_nhwc, bool backward);
    /* Whether forward can remake output 0 (gp_cuda_ctx.remake). NULL: never. */
    bool (*remakes)(const struct gp_graph *g, const struct gp_node *node);
};

/* Bit k of a layout mask (gp_cuda_ctx.in_nhwc, out_nhwc). */
static inline bool gp_cuda_nhwc(uint32_t mask, int k) { return k < 32 && ((mask >> k) & 1); }

/* Whether bit k of the context's din_overwrite is set. */
static inline bool gp_cuda_overwrite(const struct gp_cuda_ctx *c, int k)
{
    return k < 32 && ((c->din_overwrite >> k) & 1);
}

/* Input 0's gradient written whole (the kernels whose only activation
 * gradient is input 0's: the unary ops, BatchNormalization, Conv). */
bool gp_cuda_overwrites_input0(const struct gp_graph *g, const struct gp_node *node, int k);

/* GP_CONV_BF16_BACKWARD=staged: the convolutions' bfloat16 backward on
 * float32 copies with TF32, as before cuDNN's workspace cap was lifted
 * (conv_problem.cuh); default (native): in bfloat16. */
bool gp_cuda_conv_backward_staged(void);

/* The kernel for a node (matched by op_type), or NULL. */
const struct gp_cuda_kernel *gp_cuda_kernel_for(const struct gp_node *node);

/* The workspace a Conv or ConvTranspose node takes with a stage's options
 * (its algorithms, and so their workspace, depend on the precision and on
 * fast_conv; cuda/conv.cu) and a backward computing the gradients of the
 * inputs in `din` (bit k: input k; ~0u: all; GP_SCRATCH_FLOAT_CALL: in bf16,
 * its float32 calls too, backend/compute.h), for the planner: exactly
 * that mode's and those directions', where the kernel's scratch_bytes is
 * the most of any mode and direction. Attention nodes:
 * gp_cuda_attention_scratch_bytes. Other nodes: their kernel's
 * scratch_bytes. */
struct gp_compute_options;
size_t gp_cuda_conv_scratch_bytes(const struct gp_graph *g, const struct gp_node *node,
                                  const struct gp_compute_options *opts, uint32_t din);

/* An Attention node's scratch with a stage's options: in bfloat16, what
 * cuDNN's SDPA takes where it runs the node (cuda/attention.cu; the plans
 * are built on the current GPU to know), else the own kernels'. */
size_t gp_cuda_attention_scratch_bytes(const struct gp_graph *g, const struct gp_node *node,
                                       const struct gp_compute_options *opts);

/* Attention calls so far by path (cuDNN's SDPA, the own kernels: one per
 * forward or backward call) and why cuDNN did not run the last one that
 * stayed on the own kernels, for tests. */
void gp_cuda_attention_paths(unsigned long long *cudnn_calls, unsigned long long *own_calls, char *why,
                             size_t why_size);

/* Of the own kernels' calls, those that ran the TF32 tensor-core kernels
 * (ctx->tf32: cuda/attention_tf32.cu), for tests. */
unsigned long long gp_cuda_attention_tf32_calls(void);
/* Of the own-kernel calls, those on the tensor-core kernels in 3xTF32 (float32 calls). */
unsigned long long gp_cuda_attention_x3_calls(void);
/* Convolution directions (forward, data or filter gradient) run so far in
 * 3xTF32 (float32 calls: cuda/conv_x3.h), for tests. */
unsigned long long gp_cuda_conv_x3_calls(void);
/* Convolution calls run so far adding their result into the output on the
 * graph API with beta 1 (cuda/conv_graph.h conv_graph_beta_run), for tests. */
unsigned long long gp_cuda_conv_graph_beta_calls(void);
/* GP_CONV_ADD_API as the convolutions read it (conv_algos.cu): the way
 * they add a result into their output, "measured-beta" unless set. */
const char *gp_cuda_conv_add_api(void);
/* Whether a bfloat16 convolution rounds its data gradient to bfloat16
 * before adding it into a gradient another layer wrote (GP_CONV_ACCUMULATE
 * unset or "bf16", conv_algos.cu), so that writing it apart and adding it
 * later gives the same bits (gp_compute_ops.grad_addend). */
bool gp_cuda_conv_rounds_added_terms(void);

/* Kernel tables, one per family file (src/backend/cuda/<family>.cu, twin of
 * src/backend/cpu/<family>.c, whose kernel.h says what each family holds),
 * each ending with an entry whose op_type is NULL. */
extern const struct gp_cuda_kernel gp_cuda_kernels_elementwise[];
extern const struct gp_cuda_kernel gp_cuda_kernels_binary[];
extern const struct gp_cuda_kernel gp_cuda_kernels_shape[];
extern const struct gp_cuda_kernel gp_cuda_kernels_gather[];
extern const struct gp_cuda_kernel gp_cuda_kernels_pad[];
extern const struct gp_cuda_kernel gp_cuda_kernels_matmul[];
extern const struct gp_cuda_kernel gp_cuda_kernels_conv[];
extern const struct gp_cuda_kernel gp_cuda_kernels_pool[];
extern const struct gp_cuda_kernel gp_cuda_kernels_batch_norm[];
extern const struct gp_cuda_kernel gp_cuda_kernels_instance_norm[];
extern const struct gp_cuda_kernel gp_cuda_kernels_layer_norm[];
extern const struct gp_cuda_kernel gp_cuda_kernels_softmax[];
extern const struct gp_cuda_kernel gp_cuda_kernels_reduce[];
extern const struct gp_cuda_kernel gp_cuda_kernels_dropout[];
extern const struct gp_cuda_kernel gp_cuda_kernels_resize[];
extern const struct gp_cuda_kernel gp_cuda_kernels_attention[];

/* Deferred batch normalization, twin of the CPU's gp_cpu_bn_stats_len /
 * gp_cpu_bn_commit: doubles of statistics a BatchNormalization node
 * accumulates in device memory (2C + 1), and the update of its running
 * statistics (device float32) from them, launched on `stream`, which then
 * clears them; `skip` (device memory, or NULL) nonzero when the commit runs
 * leaves the running statistics alone (the step diverged). */
size_t gp_cuda_bn_stats_len(const struct gp_graph *g, const struct gp_node *node);
gp_status gp_cuda_bn_commit(cudaStream_t stream, const struct gp_graph *g, const struct gp_node *node,
                            float *rmean, float *rvar, double *stats, const int32_t *skip, struct gp_error *err);

/* "node 'name' (Op): message" into err; returns status. */
gp_status gp_cuda_error(const struct gp_cuda_ctx *c, struct gp_error *err, gp_status status,
                        const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* cuBLAS and cuDNN handles bound to `stream`, for the kernels' ctx: cuBLAS
 * gets a workspace of its own, so that it never allocates while a step
 * runs (`workspace`: GP_CUDA_LIBS_WORKSPACE_BYTES of device memory the
 * caller planned; NULL: allocated here), and the math mode `tf32` asks for
 * (off: float32 semantics). Errors name the library call. */
#define GP_CUDA_LIBS_WORKSPACE_BYTES ((size_t)32 << 20) /* cuBLAS's recommendation for Hopper */
struct gp_cuda_libs {
    void *cublas;           /* cublasHandle_t */
    void *cudnn;            /* cudnnHandle_t */
    void *cublas_workspace; /* device memory */
    bool owns_workspace;
};
gp_status gp_cuda_libs_create(cudaStream_t stream, bool tf32, void *workspace, struct gp_cuda_libs *out,
                              struct gp_error *err);
void gp_cuda_libs_destroy(struct gp_cuda_libs *libs); /* zeroed: nothing to do */

/* "node 'name' (Op): <call>: <CUDA error>" into err when a launch failed;
 * GP_OK otherwise. Kernels call it after their launches. */
gp_status gp_cuda_check_launch(const struct gp_cuda_ctx *c, const char *what, struct gp_error *err);

#ifdef __cplusplus
}
#endif

#endif
