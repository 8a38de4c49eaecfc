/* Sliding-window geometry shared by Conv, ConvTranspose, MaxPool and
 * AveragePool: the kernel, strides, dilations and the padding actually
 * applied on each side of each spatial axis, resolved once from the node's
 * attributes (auto_pad included) and the input's shape. Shape inference and
 * every backend's kernels use the same resolution, so they cannot disagree
 * about where a window starts.
 *
 * Tensors are [N, C, D1, ..., Dk]: k = rank - 2 spatial axes. */
#ifndef GP_OPS_WINDOW_H
#define GP_OPS_WINDOW_H

#include <stdbool.h>
#include <stdint.h>

#include "ops/registry.h"

#define GP_WINDOW_MAX_SPATIAL (GP_MAX_RANK - 2)

enum gp_window_kind {
    GP_WINDOW_CONV,           /* out = floor((in + pads - extent) / stride) + 1 */
    GP_WINDOW_POOL,           /* as conv, and ceil_mode may round up */
    GP_WINDOW_CONV_TRANSPOSE, /* out = stride * (in - 1) + extent + output_padding - pads */
};

struct gp_window {
    int n_spatial;
    int64_t in[GP_WINDOW_MAX_SPATIAL];       /* input spatial sizes */
    int64_t out[GP_WINDOW_MAX_SPATIAL];      /* output spatial sizes */
    int64_t kernel[GP_WINDOW_MAX_SPATIAL];
    int64_t stride[GP_WINDOW_MAX_SPATIAL];
    int64_t dilation[GP_WINDOW_MAX_SPATIAL];
    /* Padding of the input (conv, pool) or cropped from the full output
     * (transpose), per side. For a pool with ceil_mode, windows may also run
     * past pad_end; they are clipped there (MaxPool ignores those cells;
     * AveragePool divides by the cells inside the padded input). */
    int64_t pad_begin[GP_WINDOW_MAX_SPATIAL];
    int64_t pad_end[GP_WINDOW_MAX_SPATIAL];
    int64_t output_padding[GP_WINDOW_MAX_SPATIAL]; /* transpose only, else 0 */
};

/* Resolves the window of the node in `ctx` for input x ([N, C, D1..Dk]).
 * `kernel` is the kernel's spatial shape for Conv/ConvTranspose (taken from
 * the weight; a kernel_shape attribute must then agree with it) or NULL for
 * pools, whose kernel_shape attribute is required. Reads the attributes
 * strides, dilations, pads, auto_pad, ceil_mode, output_padding and
 * output_shape where the node has them, validates them and fails with a
 * message naming the attribute and spatial axis. */
gp_status gp_window_resolve(struct gp_infer_ctx *ctx, enum gp_window_kind kind,
                            const struct gp_shape *x, const int64_t *kernel, struct gp_window *w);

#endif
