/* One node of a finalized graph run through the CPU float kernel (the
 * reference) and the CUDA kernel from the same inputs, and every output and
 * input gradient compared element by element: the harness every CUDA op test
 * shares.
 *
 * Inputs: float tensors draw fresh uniform values in [lo, hi) unless the
 * caller gives data (o->inputs[k]); initializers (parameters, constants)
 * use their data in the graph; integer and bool inputs must be initializers
 * or given (or, with index_bound, drawn). Backward starts from random output gradients and from random
 * input gradients on both sides, so it also checks that CUDA accumulates
 * (+=), except the gradients `overwrite` names: the CUDA kernel is asked
 * to write those whole (din_overwrite), both sides start them at zero and
 * the CUDA buffer holds NaN instead, so a read or an unwritten element
 * fails. Saved and scratch memory are each kernel's own sizes; the CUDA
 * output is poisoned with NaN first, so an unwritten element fails.
 *
 * Tolerance: |cuda - cpu| <= rel_tol |cpu| + abs_tol (defaults 1e-5 and
 * 1e-6); integer outputs must match exactly.
 *
 * bfloat16 (bf16, for kernels that read it themselves, gp_cuda_kernel.bf16):
 * the CUDA side gets the storage types of the BF16 precision
 * (backend/compute.h): float inputs, outputs and output gradients in
 * bfloat16, input gradients too except those of `params` (float32, as a
 * parameter's); f32_inputs and f32_outputs keep those in float32 (a bias
 * parameter read directly). Every float input, every output gradient and
 * every bfloat16 gradient's initial value is rounded to bfloat16 on the
 * host, so both sides start from the same numbers; the reference is the
 * CPU float kernel on them, its results rounded to bfloat16 (to nearest
 * even) where the CUDA side stores bfloat16. Tolerance, bfloat16 tensors:
 *   |cuda - ref| <= (2^-7 + 2^-9) |ref| + 2^-7 rms(ref) + abs_tol:
 * one bfloat16 step (at most 2^-7 relative) where the two sides' float32
 * results fall on either side of a rounding boundary, plus the rounding of
 * an intermediate where a kernel stores one (cuDNN's output before its
 * bias, a gradient computed into a buffer before it is added: at most
 * 2^-9 of it, so of |ref| plus the added term, which rms(ref) bounds), the
 * rms term also covering elements whose sums cancel; float32 tensors:
 *   |cuda - ref| <= 2^-8 (|ref| + rms(ref)) + abs_tol
 * (a convolution's float32 weight gradient is rounded to bfloat16 once
 * before it is added); abs_tol is the caller's slack for float32 sums of K
 * terms added in other orders (sum_tol(K)). rel_tol is not used.
 *
 * Channels-last (nhwc_inputs, nhwc_outputs; graph/layout.h): on the CUDA
 * side only, input k (bit k of nhwc_inputs; a rank-4 float tensor) and its
 * gradient, and output k (bit k of nhwc_outputs) and its gradient, lie as
 * [N, H, W, C] for the graph's [N, C, H, W], as the executor hands them to
 * a kernel whose layout_native said yes (ctx->in_nhwc, out_nhwc get the
 * masks). The harness transposes on the host: the inputs, the output
 * gradients and the initial input gradients before they are uploaded, the
 * results (outputs, input gradients, inputs after the step) back to
 * [N, C, H, W] before they are compared, so the NaN poison and the +=
 * check work as in [N, C, H, W]. The CPU side, the reference, stays
 * [N, C, H, W]. With a mask set, the CUDA kernel's layout_native must say
 * yes to the call (forward, and backward when it runs), or, where it has
 * none, the op must be layout-neutral for it (gp_layout_neutral_call):
 * else the case fails saying so. */
#ifndef GP_TESTS_CUDA_OP_COMPARE_H
#define GP_TESTS_CUDA_OP_COMPARE_H

#include <stdbool.h>
#include <stdint.h>

#include "graph/graph.h"

#define OP_COMPARE_MAX_INPUTS 16

struct op_compare {
    const char *label;                          /* case name for failure messages */
    const void *inputs[OP_COMPARE_MAX_INPUTS];  /* host data per node input, or NULL */
    float lo, hi;                               /* random range; both 0: [-2, 2) */
    bool eval;                                  /* training = false (running statistics, no dropout) */
    bool forward_only;                          /* skip backward (ops without a gradient) */
    bool tf32;                                  /* the CUDA side may use TF32 */
    double rel_tol, abs_tol;                    /* 0: the defaults */
    int64_t index_bound;                        /* > 0: integer inputs without data draw from [0, bound) */
    bool scale_abs_tol;                         /* abs_tol times the tensor's largest |cpu| (at least 1):
                                                   for long sums whose terms cancel */
    bool fast_conv;                             /* the CUDA side may take the fastest convolution
                                                   algorithms (ctx->fast_conv) */
    bool bf16;                                  /* bfloat16 storage on the CUDA side (above) */
    uint32_t params;                            /* bf16: inputs (bit k) whose gradients are float32 */
    uint32_t f32_inputs, f32_outputs;           /* bf16: inputs, outputs (bit k) stored as float32 */
    uint32_t nhwc_inputs, nhwc_outputs;         /* CUDA side: inputs, outputs (bit k; rank 4) and their
                                                   gradients channels-last (above) */
    uint32_t held_grads;                        /* inputs (bit k, in nhwc_inputs too) given as the
                                                   executor's channels-last copies with their gradients'
                                                   (gp_cuda_ctx.held_grad_nhwc: a Conv's W) */
    uint32_t overwrite;                         /* inputs (bit k) whose gradient the CUDA kernel writes
                                                   whole (gp_cuda_ctx.din_overwrite): both sides start
                                                   it at zero, the CUDA buffer poisoned with NaN */
    uint32_t zero_grads;                        /* inputs (bit k) whose gradient starts at zero on both
                                                   sides, the CUDA kernel adding into it: the call
                                                   an overwriting one must equal bit for bit */
    uint64_t seed;                              /* nonzero: the case draws its values from this seed,
                                                   so two cases of one graph draw the same inputs and
                                                   output gradients (the initial input gradients
                                                   come after them) */
    float **got_dx;                             /* non-NULL: got_dx[k] receives the CUDA side's
                                                   gradient of input k as it lies (bfloat16 widened,
                                                   exact; malloc'd, the caller frees), or NULL */
    bool twice;                                 /* run the CUDA side a second time from the same
                                                   inputs (outputs and scratch poisoned again): every
                                                   output, input gradient and input after the step
                                                   must have the same bits (deterministic kernels) */
};

/* Compares node `node` of g on both backends; fails the cmocka test (naming
 * label, tensor and element) on a mismatch or error. */
void op_compare_node(const struct gp_graph *g, int node, const struct op_compare *o);

/* Cases compared so far and distinct op types seen, for a test's summary
 * line: "PASSED, <ops> ops (<cases> cases against the CPU kernels)". */
int op_compare_cases(void);
int op_compare_op_types(void);

/* For tests that drive a kernel by hand: fail naming label and call on a
 * CUDA error; device memory (freed with cudaFree), or a copy of host data. */
#include <cuda_runtime_api.h>
void op_cuda_ok(cudaError_t e, const char *label, const char *what);
void *op_dev_alloc(size_t bytes, const char *label);
void *op_dev_copy_of(const void *h, size_t bytes, const char *label);

/* Exits 77 (skip) with a message when no CUDA device is visible. */
void op_compare_require_device(void);

#endif
