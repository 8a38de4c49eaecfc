/* CUDA conv and pool kernels (src/backend/cuda/conv.cu: Conv, ConvTranspose;
 * src/backend/cuda/pool.cu: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool)
 * against the CPU kernels: outputs and every input gradient, with
 * accumulation into existing gradients, through op_compare_node.
 *
 * Convolutions: cuDNN's algorithms add terms in other orders than the
 * CPU's im2col + BLAS, so the absolute tolerance scales with the longest
 * sum of a case (Cg * kernel forward, N * output cells for the weight's
 * gradient). Pools: the CUDA kernels visit the CPU's taps in the CPU's
 * order, so they get the default (tight) tolerance, and MaxPool's ties and
 * NaNs must route gradients to the same cells. TF32 stays off.
 *
 * bf16: Conv and ConvTranspose read and write bfloat16 themselves (cuDNN's
 * bfloat16 configuration, float32 compute); op_compare_node runs the CPU
 * float kernel on bfloat16-rounded data and rounds its results where the
 * CUDA side stores bfloat16: |d| <= (2^-7 + 2^-9) |ref| + 2^-7 rms(ref) +
 * sum_tol(K) for bfloat16 tensors (Y, dX; W, B and their gradients when
 * they are activations), 2^-8 (|ref| + rms(ref)) + sum_tol(K) for float32
 * ones (the parameters' dW and dB: dW passes through bfloat16 once), K the
 * longest sum as for float32 (op_compare.h).
 *
 * Float32 (no TF32): Conv runs in 3xTF32 where it can (cuda/conv_x3.h),
 * held to float32's tolerance, which TF32 alone misses, and with
 * GP_CONV_FP32=fma on cuDNN's float32 algorithms; run_conv counts the
 * calls that ran in 3xTF32 (x3_runs): none with fma.
 *
 * With GP_CONV_ADD_API=graph-beta (and GP_CONV_API=graph, so that every
 * call is the graph API's) every result added into its output
 * (3xTF32's second parts, float32 weight gradients, ConvTranspose's dX)
 * is added by the graph API's engine itself where one builds with beta 1;
 * test_graph_beta_ran checks that some did, so that the cases above
 * covered that path (by default that way is measured against the others
 * and may or may not win; with the others alone, it never runs).
 *
 * Channels-last: the convolutions with X, Y or both [N, H, W, C]
 * (test_conv_nhwc), and with W and dW [M, kh, kw, C] too, as the
 * executor's filter copies give them (test_conv_filter_copies); the pools'
 * own [N, H, W, C] kernels (MaxPool over 2 axes, GlobalAveragePool);
 * against the same CPU kernels, op_compare transposing the CUDA side's
 * tensors on the host. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backends.h"
#include "backend/compute.h"
#include "backend/cuda/conv_x3.h"
#include "backend/cuda/kernel.h"
#include "kernel_graph.h"
#include "cuda_test_util.h"
#include "op_compare.h"


/* Set by the TF32 tests: cuBLAS / cuDNN may round operands to TF32 (10
 * mantissa bits), so errors grow like the square root of a sum's length
 * times 2^-11 of its terms. */
static bool tf32_mode;

/* Set by the bf16 tests: bfloat16 storage, with W and the bias as
 * parameters (float32 gradients) unless `activations`, the bias read as
 * float32 when `bias_f32`, and the fast_conv policy when `fast`. */
static struct {
    bool on, activations, bias_f32, fast;
} bf16_mode;

/* ---- Conv and ConvTranspose ---- */

struct conv_case {
    const char *label;
    const char *op;
    int rank;
    int64_t x[5], w[5];
    bool bias;
    int64_t group; /* 0: attribute absent */
    int64_t strides[3], dilations[3], output_padding[3], output_shape[3]; /* [0] 0: absent */
    bool has_pads;
    int64_t pads[6];
    const char *auto_pad;
    int64_t opset; /* 0: 13 */
};

/* Channels-last on the CUDA side (op_compare's nhwc masks): bit 0 X, bit
 * 1 Y; cases the kernel does not take channels-last are skipped. */
static uint32_t nhwc_mode;
static int nhwc_runs;
/* With nhwc_mode: W and dW channels-last too, as the executor's filter
 * copies give them (pipeline/plan.h; gp_cuda_ctx.held_grad_nhwc). */
static bool filter_copies;
static int filter_runs;

/* Float32 calls that ran in 3xTF32, and whether they may (the default;
 * not with GP_CONV_FP32=fma: cuda/conv.cu x3_wanted). */
static int x3_runs;

static bool x3_asked(void)
{
    const char *v = getenv("GP_CONV_FP32");
    return !(v && strcmp(v, "fma") == 0);
}

/* The case's graph: its node alone, inputs x, w (and b). */
static void conv_graph(struct gp_graph *g, const struct conv_case *c)
{
    begin(g, c->opset ? c->opset : 13);
    int ns = c->rank - 2;
    bool transpose = strcmp(c->op, "ConvTranspose") == 0;
    int64_t m = transpose ? c->w[1] * (c->group ? c->group : 1) : c->w[0];
    input(g, "x", c->rank, c->x);
    input(g, "w", c->rank, c->w);
    if (c->bias) input(g, "b", 1, &m);
    int n = node(g, c->op, c->bias ? 3 : 2, S("x", "w", "b"), 1, S("y"));
    if (c->group) attr_i(g, n, "group", c->group);
    if (c->strides[0]) attr_ints(g, n, "strides", ns, c->strides);
    if (c->dilations[0]) attr_ints(g, n, "dilations", ns, c->dilations);
    if (c->output_padding[0]) attr_ints(g, n, "output_padding", ns, c->output_padding);
    if (c->output_shape[0]) attr_ints(g, n, "output_shape", ns, c->output_shape);
    if (c->has_pads) attr_ints(g, n, "pads", 2 * ns, c->pads);
    if (c->auto_pad) attr_s(g, n, "auto_pad", c->auto_pad);
    finalize_ok(g);
}

static void run_conv(const struct conv_case *c)
{
    struct gp_graph g;
    conv_graph(&g, c);
    bool transpose = strcmp(c->op, "ConvTranspose") == 0;
    /* Longest sums: forward over a group's channels and the kernel (and for
     * ConvTranspose, the taps landing on a cell); weight and bias
     * gradients over the batch and the columns' cells. */
    int64_t ksize = 1, xcells = 1, ycells = 1;
    const struct gp_shape *ys = &g.values[g.nodes[0].outputs[0]].shape;
    for (int i = 2; i < c->rank; i++) {
        ksize *= c->w[i];
        xcells *= c->x[i];
        ycells *= ys->dims[i];
    }
    int64_t len = (transpose ? c->x[1] : c->w[1]) * ksize;
    int64_t cells = c->x[0] * (transpose ? xcells : ycells);
    if (cells > len) len = cells;
    char label[260];
    if (nhwc_mode) {
        const struct gp_cuda_kernel *k = gp_cuda_kernel_for(&g.nodes[0]);
        uint32_t in = (nhwc_mode & 1u) | (filter_copies ? 2u : 0u);
        if (!k->layout_native || !k->layout_native(&g, &g.nodes[0], in, nhwc_mode >> 1, false)) {
            gp_graph_free(&g);
            return;
        }
        nhwc_runs++;
        filter_runs += filter_copies;
    }
    static const char *const layouts[] = {"", " [X channels-last]", " [Y channels-last]", " [channels-last]"};
    snprintf(label, sizeof label, "%s: %s%s%s%s%s%s%s%s", c->op, c->label, layouts[nhwc_mode & 3u],
             filter_copies ? " [W and dW channels-last]" : "",
             tf32_mode ? " (TF32)" : "", bf16_mode.on ? " (bf16" : "",
             bf16_mode.on && bf16_mode.activations ? ", W and B activations" : "",
             bf16_mode.on && bf16_mode.bias_f32 && c->bias ? ", B float32" : "",
             bf16_mode.on ? (bf16_mode.fast ? ", fast_conv)" : ")") : "");
    struct op_compare o = sum_compare(label, len, tf32_mode);
    if (bf16_mode.on)
        o = (struct op_compare){.label = label, .bf16 = true, .abs_tol = sum_tol(len),
                                .params = bf16_mode.activations ? 0u : 6u, /* W (1), B (2) */
                                .f32_inputs = bf16_mode.bias_f32 ? 4u : 0u, .fast_conv = bf16_mode.fast};
    /* fast_conv in bfloat16 lets cuDNN take algorithms that keep bfloat16
     * intermediates (Winograd and FFT transforms, split reductions; which
     * one varies from run to run): their error follows the tensor's scale,
     * not each element's, and reached one bfloat16 step of the largest
     * value on the GPU. Two steps of it are allowed. */
    if (bf16_mode.on && bf16_mode.fast) {
        o.abs_tol = 1.0 / 64;
        o.scale_abs_tol = true;
    }
    o.nhwc_inputs = (nhwc_mode & 1u) | (nhwc_mode && filter_copies ? 2u : 0u);
    o.nhwc_outputs = nhwc_mode >> 1;
    o.held_grads = nhwc_mode && filter_copies ? 2u : 0u;
    unsigned long long x3_before = gp_cuda_conv_x3_calls();
    op_compare_node(&g, 0, &o);
    if (gp_cuda_conv_x3_calls() != x3_before) {
        if (tf32_mode || bf16_mode.on || !x3_asked())
            fail_msg("%s: ran in 3xTF32, which only float32 calls without GP_CONV_FP32=fma do", label);
        x3_runs++;
    }
    gp_graph_free(&g);
}

static const struct conv_case conv_cases[] = {
    /* The CPU tests' reference cases. */
    {"2-D, stride 2, asymmetric pads, dilation 2, groups 2, bias", "Conv", 4, {2, 4, 6, 7},
     {6, 2, 3, 2}, true, 2, {2, 2}, {2, 2}, {0}, {0}, true, {1, 0, 2, 1}, NULL, 0},
    {"1-D, stride 2, pads (2, 1)", "Conv", 3, {2, 3, 9}, {4, 3, 3}, false, 0, {2}, {0}, {0}, {0},
     true, {2, 1}, NULL, 0},
    {"depthwise, SAME_UPPER, stride 2", "Conv", 4, {1, 3, 5, 5}, {3, 1, 2, 2}, true, 3, {2, 2},
     {0}, {0}, {0}, false, {0}, "SAME_UPPER", 0},
    {"3-D, asymmetric pads", "Conv", 5, {1, 2, 4, 4, 3}, {2, 2, 2, 2, 2}, false, 0, {0}, {0}, {0},
     {0}, true, {1, 0, 1, 1, 1, 0}, NULL, 0},
    /* 1x1, SAME_LOWER, depthwise multiplier, dilated 1-D. */
    {"1x1, groups 2, bias", "Conv", 4, {2, 4, 3, 3}, {6, 2, 1, 1}, true, 2, {0}, {0}, {0}, {0},
     false, {0}, NULL, 0},
    {"1x1, stride 2", "Conv", 4, {1, 3, 5, 4}, {2, 3, 1, 1}, true, 0, {2, 2}, {0}, {0}, {0},
     false, {0}, NULL, 0},
    {"SAME_LOWER, stride 2", "Conv", 4, {1, 2, 6, 5}, {3, 2, 3, 3}, true, 0, {2, 2}, {0}, {0},
     {0}, false, {0}, "SAME_LOWER", 0},
    {"depthwise multiplier 2, pads 1", "Conv", 4, {1, 2, 5, 5}, {4, 1, 3, 3}, false, 2, {0}, {0},
     {0}, {0}, true, {1, 1, 1, 1}, NULL, 0},
    {"1-D, dilation 3, pads (0, 3)", "Conv", 3, {2, 2, 7}, {2, 2, 2}, true, 0, {1}, {3}, {0}, {0},
     true, {0, 3}, NULL, 0},
    {"3-D, stride 2, dilation (1, 2, 1), bias", "Conv", 5, {2, 3, 7, 8, 6}, {4, 3, 3, 2, 3}, true,
     0, {2, 1, 2}, {1, 2, 1}, {0}, {0}, true, {1, 0, 1, 1, 1, 0}, NULL, 0},
    /* Sizes of real networks. */
    {"ResNet stem: 7x7, stride 2, pads 3", "Conv", 4, {2, 3, 112, 112}, {64, 3, 7, 7}, false, 0,
     {2, 2}, {0}, {0}, {0}, true, {3, 3, 3, 3}, NULL, 0},
    {"3x3 64 -> 64, pads 1, bias", "Conv", 4, {2, 64, 14, 14}, {64, 64, 3, 3}, true, 0, {0}, {0},
     {0}, {0}, true, {1, 1, 1, 1}, NULL, 0},
    {"3x3 stride 2 downsampling, 32 -> 48", "Conv", 4, {3, 32, 15, 15}, {48, 32, 3, 3}, false, 0,
     {2, 2}, {0}, {0}, {0}, true, {1, 1, 1, 1}, NULL, 0},
    {"1x1 projection, stride 2, 64 -> 128", "Conv", 4, {2, 64, 14, 14}, {128, 64, 1, 1}, false, 0,
     {2, 2}, {0}, {0}, {0}, false, {0}, NULL, 0},
    {"1x1 pointwise, 96 -> 40, bias", "Conv", 4, {4, 96, 9, 9}, {40, 96, 1, 1}, true, 0, {0}, {0},
     {0}, {0}, false, {0}, NULL, 0},
    {"depthwise 3x3, 32 channels", "Conv", 4, {2, 32, 17, 17}, {32, 1, 3, 3}, true, 32, {0}, {0},
     {0}, {0}, true, {1, 1, 1, 1}, NULL, 0},
    {"depthwise 5x5 stride 2, SAME_UPPER", "Conv", 4, {2, 24, 16, 16}, {24, 1, 5, 5}, false, 24,
     {2, 2}, {0}, {0}, {0}, false, {0}, "SAME_UPPER", 0},
    {"odd sizes, kernel 3x2, stride (2, 1), groups 3", "Conv", 4, {3, 6, 13, 11}, {9, 2, 3, 2},
     true, 3, {2, 1}, {0}, {0}, {0}, true, {1, 0, 1, 0}, NULL, 0},
    {"asymmetric pads larger at the end, stride 2", "Conv", 4, {2, 5, 10, 9}, {7, 5, 3, 3}, true,
     0, {2, 2}, {0}, {0}, {0}, true, {0, 1, 2, 2}, NULL, 0},
    {"VALID, dilation 2", "Conv", 4, {2, 4, 12, 12}, {8, 4, 3, 3}, false, 0, {0}, {2, 2}, {0},
     {0}, true, {1, 1, 1, 1}, "VALID", 0},
    {"1-D, 40 channels, kernel 5, pads 2", "Conv", 3, {4, 40, 100}, {48, 40, 5}, true, 0, {0}, {0},
     {0}, {0}, true, {2, 2}, NULL, 0},
    /* Input channels not in whole runs: channels-last pads them to 8
     * (conv.cu; float32 to 4 where fewer than 4, to 8 with
     * GP_CONV_FLOAT32_RUN=8, not at all with GP_CONV_FLOAT32_RUN=1). */
    {"1x1, 5 -> 16 (channels padded), bias", "Conv", 4, {2, 5, 6, 7}, {16, 5, 1, 1}, true, 0, {0}, {0},
     {0}, {0}, false, {0}, NULL, 0},
    {"3x3 stride 2, 1 -> 8 (channels padded), pads 1", "Conv", 4, {3, 1, 11, 10}, {8, 1, 3, 3}, false, 0,
     {2, 2}, {0}, {0}, {0}, true, {1, 1, 1, 1}, NULL, 0},
};

static const struct conv_case convt_cases[] = {
    /* The CPU tests' cases. */
    {"groups 2, stride 2, pads 1, output_padding (1, 0), dilation (1, 2), bias", "ConvTranspose",
     4, {1, 4, 2, 2}, {4, 3, 3, 3}, true, 2, {2, 2}, {1, 2}, {1, 0}, {0}, true, {1, 0, 1, 0}, NULL,
     0},
    {"1-D, stride 3, pads 1, output_padding 2", "ConvTranspose", 3, {2, 2, 4}, {2, 3, 3}, false, 0,
     {3}, {0}, {2}, {0}, true, {1, 1}, NULL, 0},
    {"stride (2, 3), asymmetric pads", "ConvTranspose", 4, {1, 2, 3, 3}, {2, 2, 3, 2}, true, 0,
     {2, 3}, {0}, {0}, {0}, true, {0, 1, 2, 0}, NULL, 0},
    {"output_shape (7, 8), beyond the full output", "ConvTranspose", 4, {1, 2, 3, 3},
     {2, 1, 3, 3}, true, 0, {2, 2}, {0}, {0}, {7, 8}, false, {0}, NULL, 0},
    {"1x1, groups 2", "ConvTranspose", 4, {2, 4, 3, 3}, {4, 2, 1, 1}, true, 2, {0}, {0}, {0}, {0},
     false, {0}, NULL, 0},
    {"3-D, stride (2, 1, 2), asymmetric pads", "ConvTranspose", 5, {1, 2, 2, 3, 2},
     {2, 2, 2, 2, 3}, false, 0, {2, 1, 2}, {0}, {0}, {0}, true, {0, 1, 0, 1, 0, 1}, NULL, 0},
    {"SAME_UPPER, stride 2 (opset 11)", "ConvTranspose", 4, {1, 2, 3, 2}, {2, 3, 3, 3}, true, 0,
     {2, 2}, {0}, {0}, {0}, false, {0}, "SAME_UPPER", 11},
    {"SAME_LOWER, stride 2 (opset 11)", "ConvTranspose", 4, {2, 3, 4, 5}, {3, 2, 3, 3}, false, 0,
     {2, 2}, {0}, {0}, {0}, false, {0}, "SAME_LOWER", 11},
    /* Decoders. */
    {"stride 2, kernel 4, pads 1 (DCGAN)", "ConvTranspose", 4, {2, 16, 8, 8}, {16, 8, 4, 4}, true,
     0, {2, 2}, {0}, {0}, {0}, true, {1, 1, 1, 1}, NULL, 0},
    {"stride 2, kernel 3, pads 1, output_padding 1", "ConvTranspose", 4, {2, 8, 9, 9},
     {8, 6, 3, 3}, true, 0, {2, 2}, {0}, {1, 1}, {0}, true, {1, 1, 1, 1}, NULL, 0},
    {"stride 2, kernel 2 (U-Net up), 32 -> 16", "ConvTranspose", 4, {2, 32, 12, 12},
     {32, 16, 2, 2}, true, 0, {2, 2}, {0}, {0}, {0}, false, {0}, NULL, 0},
    {"groups 4, stride 2, kernel 3, output_padding 1, pads (1, 0, 0, 1)", "ConvTranspose", 4,
     {2, 8, 5, 6}, {8, 3, 3, 3}, true, 4, {2, 2}, {0}, {1, 1}, {0}, true, {1, 0, 0, 1}, NULL, 0},
    {"stride 1, dilation 2, output_padding 1 (below the dilation)", "ConvTranspose", 4,
     {1, 3, 5, 5}, {3, 2, 3, 3}, true, 0, {1, 1}, {2, 2}, {1, 1}, {0}, false, {0}, NULL, 0},
};

/* Every Conv case in float32; without GP_CONV_FP32=fma those of one group
 * whose pads cuDNN takes (11 of them) in 3xTF32. */
static void test_conv(void **state)
{
    (void)state;
    x3_runs = 0;
    for (int k = 0; k < N_OF(conv_cases); k++) run_conv(&conv_cases[k]);
    printf("float32: %d of %d convolutions in 3xTF32%s\n", x3_runs, N_OF(conv_cases),
           x3_asked() ? "" : " (GP_CONV_FP32=fma)");
    if (!x3_asked()) assert_int_equal(x3_runs, 0);
    else assert_true(x3_runs >= 10);
}

/* gp_backend_on_measure's hook: told of each problem whose algorithms
 * are measured (the progress a first run shows), not of those already
 * chosen. */
static int measured_problems;
static double measured_seconds;

static void count_measured(void *user, double seconds)
{
    assert_ptr_equal(user, &measured_problems);
    measured_problems++;
    measured_seconds += seconds;
}

static void test_measure_hook(void **state)
{
    (void)state;
    /* A problem no other case has: its directions chosen when it first runs. */
    static const struct conv_case fresh = {"7->5 3x3 on 9x11, measured once", "Conv", 4,
                                           {2, 7, 9, 11}, {5, 7, 3, 3}, true, 0, {0}, {0}, {0}, {0},
                                           false, {0}, NULL, 0};
    gp_backend_on_measure(count_measured, &measured_problems);
    measured_problems = 0;
    measured_seconds = 0;
    run_conv(&fresh);
    int first = measured_problems;
    double seconds = measured_seconds;
    measured_problems = 0;
    run_conv(&fresh);
    int again = measured_problems;
    gp_backend_on_measure(NULL, NULL);
    printf("measure hook: %d problem(s) measured in %.3f s, %d when run again\n", first, seconds, again);
    assert_true(first >= 1);
    assert_true(seconds > 0);
    assert_int_equal(again, 0);
}

/* Channels-last (graph/layout.h): every 2-D Conv case cuDNN takes so
 * (symmetric pads), X and Y channels-last, and each alone (the other
 * relaid through scratch: where the graph's input meets the stem), in
 * float32, TF32 and bfloat16 (with B float32 every other case). */
static void test_conv_nhwc(void **state)
{
    (void)state;
    nhwc_runs = 0;
    x3_runs = 0;
    for (nhwc_mode = 1; nhwc_mode <= 3; nhwc_mode++)
        for (int k = 0; k < N_OF(conv_cases); k++) run_conv(&conv_cases[k]);
    printf("channels-last float32: %d convolutions in 3xTF32\n", x3_runs);
    if (x3_asked()) assert_true(x3_runs >= 15); /* 7 a layout mode */
    else assert_int_equal(x3_runs, 0);
    nhwc_mode = 3;
    tf32_mode = true;
    run_conv(&conv_cases[11]);
    run_conv(&conv_cases[10]);
    tf32_mode = false;
    bf16_mode.on = true;
    for (nhwc_mode = 1; nhwc_mode <= 3; nhwc_mode++)
        for (int k = 0; k < N_OF(conv_cases); k++) {
            bf16_mode.bias_f32 = k % 2 == 1;
            run_conv(&conv_cases[k]);
        }
    memset(&bf16_mode, 0, sizeof bf16_mode);
    nhwc_mode = 0;
    printf("channels-last: %d convolutions against the CPU\n", nhwc_runs);
    assert_true(nhwc_runs >= 40); /* most 2-D cases qualify: about 10 per mode and precision */
}

/* The executor's filter copies (pipeline/plan.h): W and dW given
 * channels-last, [M, kh, kw, C], with X, Y or both, in float32, TF32 and
 * bfloat16, wherever the kernel takes them (2-D, channels not padded in
 * either precision: the 3x3 cases of 32 and 64 channels). */
static void test_conv_filter_copies(void **state)
{
    (void)state;
    filter_copies = true;
    filter_runs = 0;
    for (int mode = 0; mode < 3; mode++) {
        tf32_mode = mode == 1;
        bf16_mode.on = mode == 2;
        for (nhwc_mode = 1; nhwc_mode <= 3; nhwc_mode++)
            for (int k = 0; k < N_OF(conv_cases); k++) {
                bf16_mode.bias_f32 = k % 2 == 1;
                run_conv(&conv_cases[k]);
            }
    }
    tf32_mode = false;
    memset(&bf16_mode, 0, sizeof bf16_mode);
    nhwc_mode = 0;
    filter_copies = false;
    printf("channels-last filters: %d convolutions against the CPU\n", filter_runs);
    assert_true(filter_runs >= 12); /* two cases, three layouts, three precisions: 18 */
}

/* Every ConvTranspose case in float32; without GP_CONV_FP32=fma those of
 * one group without a pad buffer in 3xTF32 (the U-Net's and DCGAN's
 * up-convolutions among them). */
static void test_conv_transpose(void **state)
{
    (void)state;
    x3_runs = 0;
    for (int k = 0; k < N_OF(convt_cases); k++) run_conv(&convt_cases[k]);
    printf("ConvTranspose float32: %d of %d in 3xTF32\n", x3_runs, N_OF(convt_cases));
    if (!x3_asked()) assert_int_equal(x3_runs, 0);
    else assert_true(x3_runs >= 2);
}

/* TF32 allowed: cuDNN's algorithm choice and math type in that mode. */
static void test_conv_tf32(void **state)
{
    (void)state;
    tf32_mode = true;
    run_conv(&conv_cases[0]);  /* asymmetric pads: the padded buffer */
    run_conv(&conv_cases[11]); /* 3x3 64 -> 64 */
    run_conv(&conv_cases[10]); /* the ResNet stem */
    run_conv(&convt_cases[9]); /* output_padding */
    tf32_mode = false;
}

/* bfloat16: every Conv case, W and B parameters, the bias read as its
 * bfloat16 copy and (every other case) as float32. */
static void test_conv_bf16(void **state)
{
    (void)state;
    bf16_mode.on = true;
    for (int k = 0; k < N_OF(conv_cases); k++) {
        bf16_mode.bias_f32 = k % 2 == 1;
        run_conv(&conv_cases[k]);
    }
    memset(&bf16_mode, 0, sizeof bf16_mode);
}

static void test_conv_transpose_bf16(void **state)
{
    (void)state;
    bf16_mode.on = true;
    for (int k = 0; k < N_OF(convt_cases); k++) {
        bf16_mode.bias_f32 = k % 2 == 0;
        run_conv(&convt_cases[k]);
    }
    memset(&bf16_mode, 0, sizeof bf16_mode);
}

/* bfloat16 with W and B activations (bfloat16 gradients: cuDNN accumulates
 * dW itself, dB rounds once), and with the fast_conv policy. */
static void test_conv_bf16_modes(void **state)
{
    (void)state;
    bf16_mode.on = true;
    bf16_mode.activations = true;
    run_conv(&conv_cases[0]);  /* the padded buffer */
    run_conv(&conv_cases[11]); /* 3x3 64 -> 64, bias */
    run_conv(&convt_cases[0]); /* output_padding, groups: the transposed buffer */
    run_conv(&convt_cases[10]);
    bf16_mode.activations = false;
    bf16_mode.fast = true;
    run_conv(&conv_cases[0]);
    run_conv(&conv_cases[10]); /* the ResNet stem */
    run_conv(&conv_cases[11]);
    run_conv(&convt_cases[9]);
    memset(&bf16_mode, 0, sizeof bf16_mode);
}

/* gp_cuda_conv_scratch_bytes: each mode's workspace within the table's
 * scratch_bytes (the most of any mode), bf16's holding the bfloat16 dW
 * buffer, and other nodes given their kernel's scratch_bytes. */
static void test_conv_scratch_modes(void **state)
{
    (void)state;
    const struct conv_case *cases[] = {&conv_cases[0], &conv_cases[10], &conv_cases[11], &convt_cases[0],
                                       &convt_cases[3]};
    static const enum gp_precision precisions[] = {GP_PRECISION_FP32, GP_PRECISION_TF32, GP_PRECISION_BF16};
    for (int i = 0; i < N_OF(cases); i++) {
        const struct conv_case *c = cases[i];
        struct gp_graph g;
        conv_graph(&g, c);
        const struct gp_node *nd = &g.nodes[0];
        const struct gp_cuda_kernel *k = gp_cuda_kernel_for(nd);
        assert_non_null(k);
        assert_non_null(k->scratch_bytes);
        size_t most = k->scratch_bytes(&g, nd);
        int64_t wn = 1;
        for (int a = 0; a < c->rank; a++) wn *= c->w[a];
        for (int p = 0; p < N_OF(precisions); p++)
            for (int fast = 0; fast < 2; fast++) {
                struct gp_compute_options o = {.precision = precisions[p], .fast_conv = fast != 0};
                size_t s = gp_cuda_conv_scratch_bytes(&g, nd, &o, ~0u);
                if (s > most)
                    fail_msg("%s: %s: %s%s needs %zu bytes, more than scratch_bytes' %zu", c->op, c->label,
                             gp_precision_name(o.precision), fast ? " fast_conv" : "", s, most);
                if (o.precision == GP_PRECISION_BF16 && s < sizeof(uint16_t) * (size_t)wn)
                    fail_msg("%s: %s: bf16 scratch %zu has no room for dW's bfloat16 buffer (%lld elements)",
                             c->op, c->label, s, (long long)wn);
            }
        gp_graph_free(&g);
    }
    /* Not a convolution: the kernel's own scratch_bytes. */
    struct gp_graph g;
    begin(&g, 13);
    input(&g, "a", 3, (const int64_t[]){1, 3, 4});
    input(&g, "b", 3, (const int64_t[]){2, 4, 5});
    node(&g, "MatMul", 2, S("a", "b"), 1, S("y"));
    finalize_ok(&g);
    const struct gp_cuda_kernel *k = gp_cuda_kernel_for(&g.nodes[0]);
    assert_non_null(k);
    struct gp_compute_options o = {.precision = GP_PRECISION_BF16};
    size_t own = k->scratch_bytes ? k->scratch_bytes(&g, &g.nodes[0]) : 0;
    assert_true(own > 0); /* a broadcast operand: per-entry products */
    assert_int_equal(gp_cuda_conv_scratch_bytes(&g, &g.nodes[0], &o, ~0u), own);
    gp_graph_free(&g);
}

/* ---- a backward asked for some gradients only ---- */

static float *device_random(int64_t n)
{
    float *h = malloc(sizeof(float) * (size_t)n), *d = NULL;
    assert_non_null(h);
    for (int64_t i = 0; i < n; i++) h[i] = (float)(next_unit() - 0.5);
    assert_int_equal(cudaMalloc((void **)&d, sizeof(float) * (size_t)(n ? n : 1)), cudaSuccess);
    assert_int_equal(cudaMemcpy(d, h, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice), cudaSuccess);
    free(h);
    return d;
}

static float *device_zeros(int64_t n)
{
    float *d = NULL;
    assert_int_equal(cudaMalloc((void **)&d, sizeof(float) * (size_t)(n ? n : 1)), cudaSuccess);
    assert_int_equal(cudaMemset(d, 0, sizeof(float) * (size_t)(n ? n : 1)), cudaSuccess);
    return d;
}

#define GUARD_BYTES 4096

/* Forward and a backward computing the gradients in `din` (bit 0 dX, bit
 * 1 dW; dB always), float32, in exactly the scratch the planner gives for
 * that din (gp_cuda_conv_scratch_bytes) followed by a guard that must come
 * back untouched; dW into *dw_out (a host copy) when asked. */
static void run_partial(const struct gp_graph *g, uint32_t din, float **dw_out)
{
    const struct gp_node *node = &g->nodes[0];
    const struct gp_cuda_kernel *k = gp_cuda_kernel_for(node);
    assert_non_null(k);
    int64_t nx = gp_shape_numel(&gp_node_input(g, node, 0)->shape), nw = gp_shape_numel(&gp_node_input(g, node, 1)->shape);
    int64_t ny = gp_shape_numel(&gp_node_output(g, node, 0)->shape);
    bool bias = node->n_inputs > 2;
    int64_t nb = bias ? gp_shape_numel(&gp_node_input(g, node, 2)->shape) : 0;
    struct gp_compute_options opts = {.precision = GP_PRECISION_FP32};
    size_t scratch_bytes = gp_cuda_conv_scratch_bytes(g, node, &opts, din | 4u);
    unsigned char *scratch = NULL;
    assert_int_equal(cudaMalloc((void **)&scratch, scratch_bytes + GUARD_BYTES), cudaSuccess);
    assert_int_equal(cudaMemset(scratch, 0xff, scratch_bytes), cudaSuccess);
    assert_int_equal(cudaMemset(scratch + scratch_bytes, 0x5a, GUARD_BYTES), cudaSuccess);
    float *x = device_random(nx), *w = device_random(nw), *b = bias ? device_random(nb) : NULL;
    float *y = device_zeros(ny), *dy = device_random(ny);
    float *dx = (din & 1u) ? device_zeros(nx) : NULL, *dw = (din & 2u) ? device_zeros(nw) : NULL;
    float *db = bias ? device_zeros(nb) : NULL;
    void *in[3] = {x, w, b};
    void *out[1] = {y};
    float *dins[3] = {dx, dw, db}, *douts[1] = {dy}, *no_grads[3] = {NULL, NULL, NULL};
    cudaStream_t stream;
    assert_int_equal(cudaStreamCreate(&stream), cudaSuccess);
    struct gp_cuda_libs libs;
    struct gp_error err = {0};
    if (gp_cuda_libs_create(stream, false, NULL, &libs, &err) != GP_OK) fail_msg("%s", err.msg);
    struct gp_cuda_ctx c = {.graph = g, .node = node, .in = in, .out = out, .din = no_grads, .scratch = scratch,
                            .stream = stream, .cublas = libs.cublas, .cublas_workspace = libs.cublas_workspace,
                            .cudnn = libs.cudnn, .training = true, .update_state = true, .dropout_ratio = -1};
    if (k->forward(&c, &err) != GP_OK) fail_msg("forward: %s", err.msg);
    c.din = dins;
    c.dout = douts;
    if (k->backward(&c, &err) != GP_OK) fail_msg("backward (din %u): %s", din, err.msg);
    assert_int_equal(cudaStreamSynchronize(stream), cudaSuccess);
    unsigned char guard[GUARD_BYTES];
    assert_int_equal(cudaMemcpy(guard, scratch + scratch_bytes, GUARD_BYTES, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < GUARD_BYTES; i++)
        if (guard[i] != 0x5a)
            fail_msg("%s, backward for din %u: wrote byte %d past its %zu bytes of planned scratch", node->name, din, i,
                     scratch_bytes);
    if (dw_out) {
        *dw_out = malloc(sizeof(float) * (size_t)nw);
        assert_non_null(*dw_out);
        assert_int_equal(cudaMemcpy(*dw_out, dw, sizeof(float) * (size_t)nw, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    gp_cuda_libs_destroy(&libs);
    cudaStreamDestroy(stream);
    void *bufs[] = {scratch, x, w, b, y, dy, dx, dw, db};
    for (int i = 0; i < (int)N_OF(bufs); i++) cudaFree(bufs[i]);
}

/* The planner asks a convolution's scratch for the gradients its backward
 * computes (gp_compute_ops.scratch_bytes's din): a network's first
 * convolution, whose input is the data, plans none for its data gradient.
 * A backward with dW only, dX only, or both runs within its planned
 * scratch; asking fewer gradients never plans more; dW is the same bits
 * whether dX was asked too. The ResNet stem and a 3x3 layer, float32
 * (3xTF32 unless GP_CONV_FP32=fma) and bf16's sizes. */
static void test_conv_partial_backward(void **state)
{
    (void)state;
    const struct conv_case *cases[] = {&conv_cases[10], &conv_cases[11], &conv_cases[12]};
    for (int i = 0; i < (int)N_OF(cases); i++) {
        struct gp_graph g;
        conv_graph(&g, cases[i]);
        const struct gp_node *nd = &g.nodes[0];
        for (int p = 0; p < 2; p++) {
            struct gp_compute_options o = {.precision = p ? GP_PRECISION_BF16 : GP_PRECISION_FP32};
            const uint32_t f = GP_SCRATCH_FLOAT_CALL; /* with the float32 calls: all a bf16 layer can make */
            size_t all = gp_cuda_conv_scratch_bytes(&g, nd, &o, ~0u), both = gp_cuda_conv_scratch_bytes(&g, nd, &o, 7u | f);
            size_t w_only = gp_cuda_conv_scratch_bytes(&g, nd, &o, 6u | f), none = gp_cuda_conv_scratch_bytes(&g, nd, &o, f);
            size_t native = gp_cuda_conv_scratch_bytes(&g, nd, &o, 7u);
            printf("%s, %s: scratch %zu bytes for every gradient, %zu for dW and dB, %zu for none; %zu without "
                   "float32 calls\n",
                   cases[i]->label, p ? "bf16" : "float32", both, w_only, none, native);
            assert_true(all == both && w_only <= both && none <= w_only && native <= both);
            if (!p) assert_true(native == both); /* float32 has no other calls */
        }
        /* The same X, W and dY each time: every run draws from one seed. */
        float *dw_both = NULL, *dw_alone = NULL;
        uint64_t seed = cuda_test_lcg;
        run_partial(&g, 3u, &dw_both);
        cuda_test_lcg = seed;
        run_partial(&g, 2u, &dw_alone);
        cuda_test_lcg = seed;
        run_partial(&g, 1u, NULL);
        int64_t nw = gp_shape_numel(&gp_node_input(&g, nd, 1)->shape);
        if (memcmp(dw_both, dw_alone, sizeof(float) * (size_t)nw) != 0)
            fail_msg("%s: dW differs between a backward with dX and one without", cases[i]->label);
        free(dw_both);
        free(dw_alone);
        gp_graph_free(&g);
    }
}

/* ---- 3xTF32 operand splits (cuda/conv_x3.h) ---- */

/* The split as conv_x3.h says: hi x rounded to TF32 (to nearest, ties away
 * from zero; truncated where that would overflow), lo the rest rounded so;
 * a NaN or an infinity its own hi, lo 0. */
static void split_ref(float x, float *hi, float *lo)
{
    uint32_t b = bits_of(x);
    if ((b & 0x7f800000u) == 0x7f800000u) {
        *hi = x;
        *lo = 0.0f;
        return;
    }
    uint32_t r = (b + 0x1000u) & 0xffffe000u;
    if ((r & 0x7f800000u) == 0x7f800000u) r = b & 0xffffe000u;
    *hi = float_of(r);
    float rest = x - *hi;
    *lo = float_of((bits_of(rest) + 0x1000u) & 0xffffe000u);
}

/* Values of every kind: random magnitudes and signs, ties at TF32's last
 * place, zeros, the largest floats (rounding up would overflow), tiny and
 * subnormal ones, infinities and a NaN. */
static float split_value(int64_t i)
{
    switch (i % 16) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return float_of(0x3f801000u);                 /* 1 + 2^-11: a tie, away from zero */
    case 3: return float_of(0xbf803000u);                 /* a negative tie */
    case 4: return float_of(0x7f7fffffu);                 /* FLT_MAX */
    case 5: return float_of(0x00000123u);                 /* subnormal */
    case 6: return i % 32 == 6 ? INFINITY : NAN;
    case 7: return -INFINITY;
    default: return (float)((next_unit() - 0.5) * ldexp(1.0, (int)(next_u64() % 60) - 30));
    }
}

/* A split's buffers: n values of every kind on the host (src) and on the
 * device at dsrc + offset, and a device destination of 3n values (+
 * offset) filled with NaN, so that what a split leaves unwritten shows. */
struct split_bufs {
    float *src, *dsrc, *ddst;
};

static struct split_bufs split_bufs_make(int64_t n, int offset)
{
    struct split_bufs b;
    b.src = malloc(sizeof(float) * (size_t)n);
    assert_non_null(b.src);
    for (int64_t i = 0; i < n; i++) b.src[i] = split_value(i);
    assert_int_equal(cudaMalloc((void **)&b.dsrc, sizeof(float) * (size_t)(n + offset)), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&b.ddst, sizeof(float) * (size_t)(3 * n + offset)), cudaSuccess);
    assert_int_equal(cudaMemcpy(b.dsrc + offset, b.src, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice),
                     cudaSuccess);
    assert_int_equal(cudaMemset(b.ddst, 0xff, sizeof(float) * (size_t)(3 * n + offset)), cudaSuccess);
    return b;
}

static void split_bufs_free(struct split_bufs *b)
{
    cudaFree(b->dsrc);
    cudaFree(b->ddst);
    free(b->src);
}

/* One split of [outer, ch, inner] into `copies` copies against
 * split_ref, bit for bit, and the parts' properties: both TF32 (low 13
 * bits clear), hi + lo within 2^-22 of x; with_hi, the hi parts also
 * written alone in src's layout, in the same pass (the first call's
 * operand). `offset` floats shift the buffers off 16-byte alignment (the
 * one-value kernel). */
static void run_split(int64_t outer, int64_t ch, int64_t inner, int copies, unsigned lo_parts, int offset,
                      bool with_hi)
{
    int64_t n = outer * ch * inner;
    float *out = malloc(3 * sizeof(float) * (size_t)n);
    assert_non_null(out);
    /* The copies past `copies` stay NaN: written nowhere. */
    struct split_bufs bufs = split_bufs_make(n, offset);
    float *src = bufs.src, *dsrc = bufs.dsrc, *ddst = bufs.ddst;
    float *dhi = NULL, *hi_out = malloc(sizeof(float) * (size_t)(n + 1));
    assert_non_null(hi_out);
    if (with_hi) {
        assert_int_equal(cudaMalloc((void **)&dhi, sizeof(float) * (size_t)(n + offset)), cudaSuccess);
        assert_int_equal(cudaMemset(dhi, 0xff, sizeof(float) * (size_t)(n + offset)), cudaSuccess);
    }
    assert_int_equal(
        gp_cuda_conv_x3_split(NULL, ddst + offset, with_hi ? dhi + offset : NULL, dsrc + offset, outer, ch, inner,
                              copies, lo_parts),
        cudaSuccess);
    if (with_hi)
        assert_int_equal(cudaMemcpy(hi_out, dhi + offset, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost),
                         cudaSuccess);
    assert_int_equal(cudaMemcpy(out, ddst + offset, 3 * sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    for (int64_t e = copies * n; e < 3 * n; e++)
        if (bits_of(out[e]) != 0xffffffffu)
            fail_msg("split [%lld, %lld, %lld] into %d copies wrote past them, at %lld", (long long)outer,
                     (long long)ch, (long long)inner, copies, (long long)e);
    for (int64_t e = 0; e < n; e++) {
        int64_t i = e % inner, c = (e / inner) % ch, o = e / inner / ch;
        float hi, lo;
        split_ref(src[e], &hi, &lo);
        if (with_hi && bits_of(hi_out[e]) != bits_of(hi))
            fail_msg("split [%lld, %lld, %lld] of %a: hi alone %a, want %a", (long long)outer, (long long)ch,
                     (long long)inner, (double)src[e], (double)hi_out[e], (double)hi);
        for (int j = 0; j < copies; j++) {
            float want = (lo_parts >> j) & 1u ? lo : hi;
            float got = out[((o * ch + c) * copies + j) * inner + i];
            if (bits_of(got) != bits_of(want))
                fail_msg("split [%lld, %lld, %lld] into %d of %a, copy %d: %a, want %a", (long long)outer,
                         (long long)ch, (long long)inner, copies, (double)src[e], j, (double)got, (double)want);
        }
        if (!isfinite(src[e])) continue;
        if ((bits_of(hi) | bits_of(lo)) & 0x1fffu) fail_msg("%a: parts %a, %a not TF32", (double)src[e], (double)hi, (double)lo);
        double d = fabs((double)src[e] - ((double)hi + (double)lo));
        if (d > ldexp(fabs((double)src[e]), -22) + ldexp(1.0, -136))
            fail_msg("%a: hi + lo = %a, off by %a", (double)src[e], (double)hi + (double)lo, d);
    }
    split_bufs_free(&bufs);
    cudaFree(dhi);
    free(out);
    free(hi_out);
}

/* The batch axis's copies as two whole blocks (GP_CONV_X3_BATCH=blocked):
 * block j of copy j, bit for bit split_ref's, nothing written past them;
 * `offset` floats off 16-byte alignment (the one-value kernel). */
static void run_split_blocks(int64_t n, unsigned lo_parts, int offset)
{
    float *out = malloc(3 * sizeof(float) * (size_t)n);
    assert_non_null(out);
    struct split_bufs bufs = split_bufs_make(n, offset);
    float *src = bufs.src, *dsrc = bufs.dsrc, *ddst = bufs.ddst;
    assert_int_equal(gp_cuda_conv_x3_split_blocks(NULL, ddst + offset, dsrc + offset, n, lo_parts), cudaSuccess);
    assert_int_equal(cudaMemcpy(out, ddst + offset, 3 * sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    for (int64_t e = 2 * n; e < 3 * n; e++)
        if (bits_of(out[e]) != 0xffffffffu)
            fail_msg("split of %lld values into blocks wrote past them, at %lld", (long long)n, (long long)e);
    for (int64_t e = 0; e < n; e++) {
        float hi, lo;
        split_ref(src[e], &hi, &lo);
        for (int j = 0; j < 2; j++) {
            float want = (lo_parts >> j) & 1u ? lo : hi, got = out[j * n + e];
            if (bits_of(got) != bits_of(want))
                fail_msg("split of %lld values into blocks, %a, block %d: %a, want %a", (long long)n,
                         (double)src[e], j, (double)got, (double)want);
        }
    }
    split_bufs_free(&bufs);
    free(out);
}

/* Each kernel of the split: planes (inner a multiple of 4), channels
 * (inner 1, ch a multiple of 4), and any shape or alignment; two copies
 * with hi alone beside them (what conv.cu runs), two and one without; an
 * unknown count refused; the batch's blocks. */
static void test_x3_split(void **state)
{
    (void)state;
    for (int with_hi = 1; with_hi >= 0; with_hi--) {
        run_split(2, 3, 8, 2, CONV_X3_LO_HI, 0, with_hi);
        run_split(10, 8, 1, 2, CONV_X3_HI_LO, 0, with_hi);
        run_split(3, 5, 7, 2, CONV_X3_LO_HI, 2, with_hi);
        run_split(1, 4, 16, 2, CONV_X3_HI_LO, 1, with_hi);
        run_split(5, 64, 1, 2, CONV_X3_LO_HI, 3, with_hi);
    }
    run_split(2, 3, 8, 1, CONV_X3_HI, 0, false);
    run_split(10, 8, 1, 1, CONV_X3_HI, 0, false);
    run_split(3, 5, 7, 1, CONV_X3_HI, 1, false);
    /* A Conv's filter gradient's split of X (conv.cu x3_filter_run): one
     * copy, lo, over the whole tensor as channels, hi alone beside it. */
    run_split(1, 4096, 1, 1, 1u, 0, true);
    run_split(1, 1001, 1, 1, 1u, 1, true);
    assert_int_equal(gp_cuda_conv_x3_split(NULL, NULL, NULL, NULL, 1, 1, 1, 3, 0), cudaErrorInvalidValue);
    /* As blocks: 4 values a thread, and one at a time (a count not a
     * multiple of 4, or off alignment). */
    run_split_blocks(4096, CONV_X3_LO_HI, 0);
    run_split_blocks(4096, CONV_X3_HI_LO, 0);
    run_split_blocks(1001, CONV_X3_LO_HI, 0);
    run_split_blocks(4096, CONV_X3_HI_LO, 1);
}

/* A Conv's filter gradient from its 3xTF32 parts
 * (gp_cuda_conv_x3_filter_sum): out = hi hi + (lo hi + hi lo), or added
 * to out, in that order, bit for bit; nothing written past M R values. */
static void run_filter_sum(int64_t m, int64_t r, bool add)
{
    int64_t n = m * r;
    float *a = malloc(sizeof(float) * (size_t)(2 * n)), *b = malloc(sizeof(float) * (size_t)n);
    float *out = malloc(sizeof(float) * (size_t)(n + 1)), *got = malloc(sizeof(float) * (size_t)(n + 1));
    assert_true(a && b && out && got);
    for (int64_t e = 0; e < 2 * n; e++) a[e] = (float)(next_unit() * 2.0 - 1.0);
    for (int64_t e = 0; e < n; e++) b[e] = (float)(next_unit() * 2e-3 - 1e-3);
    for (int64_t e = 0; e < n; e++) out[e] = (float)(next_unit() * 4.0 - 2.0);
    out[n] = 7.0f;
    float *da, *db, *dout;
    assert_int_equal(cudaMalloc((void **)&da, sizeof(float) * (size_t)(2 * n)), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&db, sizeof(float) * (size_t)n), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&dout, sizeof(float) * (size_t)(n + 1)), cudaSuccess);
    assert_int_equal(cudaMemcpy(da, a, sizeof(float) * (size_t)(2 * n), cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(db, b, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(dout, out, sizeof(float) * (size_t)(n + 1), cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(gp_cuda_conv_x3_filter_sum(NULL, dout, da, db, m, r, add), cudaSuccess);
    assert_int_equal(cudaMemcpy(got, dout, sizeof(float) * (size_t)(n + 1), cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t e = 0; e < n; e++) {
        int64_t k = e / r, i = e % r;
        volatile float hh = a[(2 * k + 1) * r + i], small = a[2 * k * r + i] + b[e];
        volatile float base = add ? out[e] + hh : hh;
        float want = base + small;
        if (bits_of(got[e]) != bits_of(want))
            fail_msg("filter sum [%lld, %lld]%s at %lld: %a, want %a", (long long)m, (long long)r,
                     add ? " added" : "", (long long)e, (double)got[e], (double)want);
    }
    if (got[n] != 7.0f) fail_msg("filter sum [%lld, %lld] wrote past its values", (long long)m, (long long)r);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dout);
    free(a);
    free(b);
    free(out);
    free(got);
}

static void test_x3_filter_sum(void **state)
{
    (void)state;
    run_filter_sum(64, 576, false);
    run_filter_sum(64, 576, true);
    run_filter_sum(3, 7, true);
    assert_int_equal(gp_cuda_conv_x3_filter_sum(NULL, NULL, NULL, NULL, 0, 9, true), cudaSuccess);
}

/* ---- pools ---- */

struct pool_case {
    const char *label;
    const char *op;
    int rank;
    int64_t x[5];
    int64_t kernel[3];     /* [0] 0: absent (global pools) */
    int64_t strides[3], dilations[3]; /* [0] 0: absent */
    bool has_pads;
    int64_t pads[6];
    const char *auto_pad;
    int ceil_mode, count_include_pad, storage_order; /* -1: absent */
    bool indices; /* MaxPool's second output */
    int64_t opset; /* 0: 12, or 19 for AveragePool */
    int data;      /* 0: random; 1: ties (values in {0, 1, 2}); 2: ties with NaNs (not -inf: the harness
                    * compares equal infinities as a mismatch) */
};

/* The case's graph: its node alone, without the Indices output when
 * no_indices (the channels-last runs: MaxPool reads channels-last only
 * without it). */
static void pool_graph(struct gp_graph *g, const struct pool_case *c, bool no_indices)
{
    bool is_avg = strcmp(c->op, "AveragePool") == 0;
    begin(g, c->opset ? c->opset : is_avg ? 19 : 12);
    int ns = c->rank - 2;
    input(g, "x", c->rank, c->x);
    int n = node(g, c->op, 1, S("x"), c->indices && !no_indices ? 2 : 1, S("y", "ind"));
    if (c->kernel[0]) attr_ints(g, n, "kernel_shape", ns, c->kernel);
    if (c->strides[0]) attr_ints(g, n, "strides", ns, c->strides);
    if (c->dilations[0]) attr_ints(g, n, "dilations", ns, c->dilations);
    if (c->has_pads) attr_ints(g, n, "pads", 2 * ns, c->pads);
    if (c->auto_pad) attr_s(g, n, "auto_pad", c->auto_pad);
    if (c->ceil_mode >= 0) attr_i(g, n, "ceil_mode", c->ceil_mode);
    if (c->count_include_pad >= 0) attr_i(g, n, "count_include_pad", c->count_include_pad);
    if (c->storage_order >= 0) attr_i(g, n, "storage_order", c->storage_order);
    finalize_ok(g);
}

/* The case's X when it asks for ties (values in {0, 1, 2}, with NaNs for
 * data 2: exact in bfloat16 too), or NULL (random values). */
static float *pool_data(const struct pool_case *c)
{
    if (!c->data) return NULL;
    int64_t numel = 1;
    for (int i = 0; i < c->rank; i++) numel *= c->x[i];
    float *data = malloc(sizeof(float) * (size_t)numel);
    assert_non_null(data);
    uint32_t s = 12345;
    for (int64_t i = 0; i < numel; i++) {
        s = s * 1664525u + 1013904223u;
        uint32_t r = s >> 24;
        data[i] = (float)(r % 3);
        if (c->data == 2 && r % 17 == 0) data[i] = NAN;
    }
    return data;
}

static void run_pool(const struct pool_case *c)
{
    struct gp_graph g;
    pool_graph(&g, c, false);
    struct op_compare o = {.label = NULL};
    char label[200];
    snprintf(label, sizeof label, "%s: %s", c->op, c->label);
    o.label = label;
    float *data = pool_data(c);
    o.inputs[0] = data;
    /* Global averages sum in double on both sides, in different orders. */
    if (strcmp(c->op, "GlobalAveragePool") == 0) o.rel_tol = 1e-6;
    op_compare_node(&g, 0, &o);
    free(data);
    gp_graph_free(&g);
}

#define NOATTR -1, -1, -1

static const struct pool_case pool_cases[] = {
    /* MaxPool. */
    {"2x2 stride 2", "MaxPool", 4, {2, 3, 8, 8}, {2, 2}, {2, 2}, {0}, false, {0}, NULL, NOATTR,
     false, 0, 0},
    {"2x2 stride 2, Indices", "MaxPool", 4, {2, 3, 8, 9}, {2, 2}, {2, 2}, {0}, false, {0}, NULL,
     NOATTR, true, 0, 0},
    {"3x3 stride 2 pads 1 (ResNet), large enough that the grid loops", "MaxPool", 4,
     {4, 64, 66, 66}, {3, 3}, {2, 2}, {0}, true, {1, 1, 1, 1}, NULL, NOATTR, false, 0, 0},
    {"3x3 stride 2 ceil_mode, odd sizes", "MaxPool", 4, {2, 3, 9, 10}, {3, 3}, {2, 2}, {0}, false,
     {0}, NULL, 1, -1, -1, true, 0, 0},
    {"ceil_mode, pads 1, stride 3", "MaxPool", 4, {1, 2, 10, 11}, {3, 2}, {3, 3}, {0}, true,
     {1, 1, 1, 0}, NULL, 1, -1, -1, true, 0, 0},
    {"dilations 2, pads 1", "MaxPool", 4, {2, 2, 9, 8}, {2, 3}, {1, 2}, {2, 2}, true,
     {1, 1, 1, 1}, NULL, NOATTR, true, 0, 0},
    {"dilations 3, ceil_mode", "MaxPool", 4, {1, 3, 11, 10}, {2, 2}, {2, 3}, {3, 2}, false, {0},
     NULL, 1, -1, -1, true, 0, 0},
    {"storage_order 1, Indices", "MaxPool", 4, {2, 3, 7, 5}, {2, 3}, {1, 2}, {0}, true,
     {1, 0, 0, 1}, NULL, -1, -1, 1, true, 0, 0},
    {"asymmetric pads (0, 1, 1, 0)", "MaxPool", 4, {2, 4, 6, 7}, {2, 2}, {2, 2}, {0}, true,
     {0, 1, 1, 0}, NULL, NOATTR, false, 0, 0},
    {"SAME_UPPER, stride 2", "MaxPool", 4, {2, 3, 7, 8}, {3, 3}, {2, 2}, {0}, false, {0},
     "SAME_UPPER", NOATTR, true, 0, 0},
    {"SAME_LOWER, stride 1", "MaxPool", 4, {2, 3, 6, 5}, {2, 3}, {0}, {0}, false, {0},
     "SAME_LOWER", NOATTR, false, 0, 0},
    {"1-D, kernel 3, stride 2, pads 1", "MaxPool", 3, {3, 4, 25}, {3}, {2}, {0}, true, {1, 1},
     NULL, NOATTR, true, 0, 0},
    {"3-D, kernel 2x3x2, stride 2, storage_order 1", "MaxPool", 5, {2, 2, 6, 7, 5}, {2, 3, 2},
     {2, 2, 2}, {0}, true, {0, 1, 0, 1, 1, 1}, NULL, -1, -1, 1, true, 0, 0},
    {"opset 8, Indices", "MaxPool", 4, {1, 2, 6, 6}, {2, 2}, {2, 2}, {0}, false, {0}, NULL, -1, -1,
     0, true, 8, 0},
    {"opset 1", "MaxPool", 4, {1, 2, 6, 6}, {3, 3}, {0}, {0}, true, {1, 1, 1, 1}, NULL, NOATTR,
     false, 1, 0},
    /* The saved argmax (pool.cu, argmax_keep): a tap index in a byte up to
     * 255 taps a window (unless GP_MAXPOOL_BYTE_ARGMAX=0), the in-plane
     * offset in an int32 beyond. */
    {"15x17 window, 255 taps (the most a byte keeps), ties", "MaxPool", 4, {2, 3, 21, 22}, {15, 17}, {2, 1},
     {0}, true, {1, 2, 0, 1}, NULL, NOATTR, false, 0, 1},
    {"16x16 window, 256 taps (an int32 argmax), ties", "MaxPool", 4, {2, 3, 21, 20}, {16, 16}, {1, 2}, {0},
     false, {0}, NULL, NOATTR, false, 0, 1},
    {"16x16 window, dilations 2 (an int32 argmax)", "MaxPool", 4, {1, 2, 36, 34}, {16, 16}, {2, 1}, {2, 2},
     false, {0}, NULL, NOATTR, false, 0, 0},
    /* Ties: overlapping windows whose maximum repeats; the first in scan
     * order must win, forward (Indices) and backward. */
    {"ties, 3x3 stride 1 pads 1", "MaxPool", 4, {2, 3, 9, 9}, {3, 3}, {1, 1}, {0}, true,
     {1, 1, 1, 1}, NULL, NOATTR, true, 0, 1},
    {"ties, 3x3 stride 2, storage_order 1", "MaxPool", 4, {2, 3, 11, 8}, {3, 3}, {2, 2}, {0},
     false, {0}, NULL, -1, -1, 1, true, 0, 1},
    {"ties, dilations 2, ceil_mode", "MaxPool", 4, {1, 4, 10, 9}, {3, 2}, {2, 2}, {2, 2}, true,
     {1, 0, 1, 1}, NULL, 1, -1, -1, true, 0, 1},
    {"ties with NaNs", "MaxPool", 4, {2, 3, 12, 12}, {3, 3}, {2, 2}, {0}, true,
     {1, 1, 1, 1}, NULL, NOATTR, true, 0, 2},
    {"1-D ties with NaNs, kernel 4 stride 1", "MaxPool", 3, {2, 3, 40}, {4}, {1}, {0},
     false, {0}, NULL, NOATTR, true, 0, 2},
    /* AveragePool. */
    {"2x2 stride 2", "AveragePool", 4, {2, 3, 8, 8}, {2, 2}, {2, 2}, {0}, false, {0}, NULL,
     NOATTR, false, 0, 0},
    {"3x3 stride 1 pads 1, count_include_pad 0", "AveragePool", 4, {2, 3, 7, 9}, {3, 3}, {1, 1},
     {0}, true, {1, 1, 1, 1}, NULL, -1, 0, -1, false, 0, 0},
    {"3x3 stride 1 pads 1, count_include_pad 1", "AveragePool", 4, {2, 3, 7, 9}, {3, 3}, {1, 1},
     {0}, true, {1, 1, 1, 1}, NULL, -1, 1, -1, false, 0, 0},
    {"ceil_mode, count_include_pad 1, asymmetric pads", "AveragePool", 4, {2, 2, 10, 9}, {3, 3},
     {2, 2}, {0}, true, {1, 0, 0, 1}, NULL, 1, 1, -1, false, 0, 0},
    {"ceil_mode, count_include_pad 0", "AveragePool", 4, {2, 2, 10, 9}, {3, 3}, {2, 2}, {0}, true,
     {1, 0, 0, 1}, NULL, 1, 0, -1, false, 0, 0},
    {"dilations 2, pads 2, count_include_pad 1", "AveragePool", 4, {2, 3, 11, 10}, {3, 2},
     {1, 2}, {2, 2}, true, {2, 1, 2, 1}, NULL, 0, 1, -1, false, 0, 0},
    {"dilations (2, 3), ceil_mode", "AveragePool", 4, {1, 3, 12, 13}, {2, 2}, {3, 2}, {2, 3},
     false, {0}, NULL, 1, 0, -1, false, 0, 0},
    {"SAME_UPPER stride 2, count_include_pad 1", "AveragePool", 4, {2, 3, 7, 8}, {3, 3}, {2, 2},
     {0}, false, {0}, "SAME_UPPER", -1, 1, -1, false, 0, 0},
    {"1-D", "AveragePool", 3, {3, 4, 31}, {4}, {3}, {0}, true, {2, 1}, NULL, -1, 0, -1, false, 0,
     0},
    {"3-D, count_include_pad 1", "AveragePool", 5, {2, 2, 6, 7, 5}, {3, 2, 2}, {2, 2, 1}, {0}, true,
     {1, 0, 1, 1, 0, 1}, NULL, -1, 1, -1, false, 0, 0},
    {"7x7 global-like, large", "AveragePool", 4, {8, 160, 28, 28}, {7, 7}, {7, 7}, {0}, false, {0},
     NULL, NOATTR, false, 0, 0},
    {"3x3 stride 1 pads 1, large enough that the grid loops", "AveragePool", 4, {4, 64, 66, 66},
     {3, 3}, {1, 1}, {0}, true, {1, 1, 1, 1}, NULL, -1, 0, -1, false, 0, 0},
    {"opset 7", "AveragePool", 4, {1, 2, 6, 6}, {3, 3}, {2, 2}, {0}, true, {1, 1, 1, 1}, NULL, -1,
     1, -1, false, 7, 0},
    /* Global pools. */
    {"small planes", "GlobalAveragePool", 4, {2, 3, 5, 7}, {0}, {0}, {0}, false, {0}, NULL, NOATTR,
     false, 1, 0},
    {"many small planes (ResNet head)", "GlobalAveragePool", 4, {8, 512, 7, 7}, {0}, {0}, {0}, false,
     {0}, NULL, NOATTR, false, 1, 0},
    {"large planes (a block each)", "GlobalAveragePool", 4, {2, 5, 80, 81}, {0}, {0}, {0}, false,
     {0}, NULL, NOATTR, false, 1, 0},
    {"1-D", "GlobalAveragePool", 3, {3, 4, 9}, {0}, {0}, {0}, false, {0}, NULL, NOATTR, false, 1,
     0},
    {"3-D", "GlobalAveragePool", 5, {2, 3, 4, 5, 6}, {0}, {0}, {0}, false, {0}, NULL, NOATTR, false,
     1, 0},
    {"small planes", "GlobalMaxPool", 4, {2, 3, 5, 7}, {0}, {0}, {0}, false, {0}, NULL, NOATTR,
     false, 1, 0},
    {"many small planes", "GlobalMaxPool", 4, {8, 512, 7, 7}, {0}, {0}, {0}, false, {0}, NULL,
     NOATTR, false, 1, 0},
    {"large planes (a block each)", "GlobalMaxPool", 4, {2, 5, 80, 81}, {0}, {0}, {0}, false, {0},
     NULL, NOATTR, false, 1, 0},
    {"ties", "GlobalMaxPool", 4, {4, 6, 9, 11}, {0}, {0}, {0}, false, {0}, NULL, NOATTR, false, 1,
     1},
    {"ties with NaNs", "GlobalMaxPool", 4, {4, 6, 9, 11}, {0}, {0}, {0}, false, {0}, NULL,
     NOATTR, false, 1, 2},
    {"large planes, ties with NaNs", "GlobalMaxPool", 4, {2, 3, 70, 70}, {0}, {0}, {0},
     false, {0}, NULL, NOATTR, false, 1, 2},
    {"large planes, ties", "GlobalMaxPool", 4, {2, 3, 70, 70}, {0}, {0}, {0}, false, {0}, NULL,
     NOATTR, false, 1, 1},
    {"3-D", "GlobalMaxPool", 5, {2, 3, 4, 5, 6}, {0}, {0}, {0}, false, {0}, NULL, NOATTR, false, 1,
     0},
    /* For the channels-last kernels (test_pools_nhwc) too: channel counts
     * that take runs of 2 to 8 channels per access, with ties, NaNs and
     * dilations, and a size at which the backward's grid loops. */
    {"ties with NaNs, 3x3 stride 2 pads 1, 16 channels", "MaxPool", 4, {2, 16, 11, 10}, {3, 3}, {2, 2},
     {0}, true, {1, 1, 1, 1}, NULL, NOATTR, false, 0, 2},
    {"ties, dilations 2, ceil_mode, 8 channels", "MaxPool", 4, {2, 8, 10, 9}, {3, 2}, {2, 2}, {2, 2},
     true, {1, 0, 1, 1}, NULL, 1, -1, -1, false, 0, 1},
    {"ties, 2x2 stride 1, 6 channels", "MaxPool", 4, {3, 6, 7, 8}, {2, 2}, {1, 1}, {0}, false, {0},
     NULL, NOATTR, false, 0, 1},
    {"ResNet-50's: 3x3 stride 2 pads 1, 64 channels at 112x112", "MaxPool", 4, {8, 64, 112, 112},
     {3, 3}, {2, 2}, {0}, true, {1, 1, 1, 1}, NULL, NOATTR, false, 0, 0},
    {"12 channels, 33x35", "GlobalAveragePool", 4, {3, 12, 33, 35}, {0}, {0}, {0}, false, {0}, NULL,
     NOATTR, false, 1, 0},
    {"ResNet-50 head, 2048 channels", "GlobalAveragePool", 4, {4, 2048, 7, 7}, {0}, {0}, {0}, false,
     {0}, NULL, NOATTR, false, 1, 0},
};

/* MaxPool's saved argmax either way (pool.cu, argmax_keep): int32
 * offsets (GP_MAXPOOL_BYTE_ARGMAX=0), and a byte's tap index (the
 * default); the other pools once. */
static int argmax_forms(const struct pool_case *c) { return strcmp(c->op, "MaxPool") == 0 ? 2 : 1; }

static void byte_argmax(int form) { setenv("GP_MAXPOOL_BYTE_ARGMAX", form ? "1" : "0", 1); }

static void byte_argmax_default(void) { unsetenv("GP_MAXPOOL_BYTE_ARGMAX"); }

static void test_pools(void **state)
{
    (void)state;
    for (int k = 0; k < N_OF(pool_cases); k++)
        for (int f = 0; f < argmax_forms(&pool_cases[k]); f++) {
            byte_argmax(f);
            run_pool(&pool_cases[k]);
        }
    byte_argmax_default();
}

/* bf16: the pools read and write bfloat16 themselves (bf16_any). Every
 * case with X, Y, dY and dX bfloat16, and again with one of them float32
 * in turn (the kernels' run-time typed path): X (forward; GlobalMaxPool's
 * backward reads it too), Y, or dX (op_compare's params bit: a float32
 * gradient). op_compare_node runs the CPU float kernel on bfloat16-rounded
 * data and rounds its results where the CUDA side stores bfloat16; the
 * kernels visit the CPU's taps in its order, so the results agree to the
 * rounding (ties and NaNs route gradients to the same cells). The graph is
 * run_pool's. */
static const struct {
    const char *name;
    uint32_t params, f32_inputs, f32_outputs;
} pool_bf16_mixes[] = {
    {"bfloat16", 0, 0, 0},
    {"X float32", 0, 1, 0},
    {"Y float32", 0, 0, 1},
    {"dX float32", 1, 0, 0},
};

static void run_pool_bf16(const struct pool_case *c, int mix)
{
    struct gp_graph g;
    pool_graph(&g, c, false);
    char label[240];
    snprintf(label, sizeof label, "%s: %s (bf16, %s)", c->op, c->label, pool_bf16_mixes[mix].name);
    struct op_compare o = {.label = label, .bf16 = true, .params = pool_bf16_mixes[mix].params,
                           .f32_inputs = pool_bf16_mixes[mix].f32_inputs,
                           .f32_outputs = pool_bf16_mixes[mix].f32_outputs};
    float *data = pool_data(c);
    o.inputs[0] = data;
    op_compare_node(&g, 0, &o);
    free(data);
    gp_graph_free(&g);
}

static void test_pools_bf16(void **state)
{
    (void)state;
    for (int k = 0; k < N_OF(pool_cases); k++)
        for (int f = 0; f < argmax_forms(&pool_cases[k]); f++) {
            byte_argmax(f);
            run_pool_bf16(&pool_cases[k], 0);
            run_pool_bf16(&pool_cases[k], 1 + k % 3);
        }
    byte_argmax_default();
}

/* Channels-last (graph/layout.h): the pools that read it themselves
 * (pool.cu) take X, and Y where it follows, as [N, H, W, C]
 * (op_compare's nhwc_inputs, nhwc_outputs; the CPU side stays
 * [N, C, H, W]): MaxPool over 2 axes with X and Y channels-last, every
 * rank-4 MaxPool case run without its Indices output (ties, NaNs,
 * dilations, ceil_mode, pads); GlobalAveragePool with X channels-last
 * and Y tagged or not (the same memory). The kernels do per channel what
 * the planar ones do per plane, in the same order, so the tolerances are
 * those of the planar runs. */
static bool pool_nhwc_applies(const struct pool_case *c)
{
    return c->rank == 4 && (strcmp(c->op, "MaxPool") == 0 || strcmp(c->op, "GlobalAveragePool") == 0);
}

/* mix < 0: float32; else bfloat16 with pool_bf16_mixes[mix]. y_nhwc: Y
 * channels-last too. */
static void run_pool_nhwc(const struct pool_case *c, int mix, bool y_nhwc)
{
    struct gp_graph g;
    pool_graph(&g, c, true);
    char label[260];
    snprintf(label, sizeof label, "%s: %s (channels-last X%s%s%s%s)", c->op, c->label,
             y_nhwc ? " and Y" : ", Y not", c->indices ? ", without Indices" : "", mix >= 0 ? ", bf16, " : "",
             mix >= 0 ? pool_bf16_mixes[mix].name : "");
    struct op_compare o = {.label = label, .nhwc_inputs = 1, .nhwc_outputs = y_nhwc ? 1u : 0u};
    if (mix >= 0) {
        o.bf16 = true;
        o.params = pool_bf16_mixes[mix].params;
        o.f32_inputs = pool_bf16_mixes[mix].f32_inputs;
        o.f32_outputs = pool_bf16_mixes[mix].f32_outputs;
    } else if (strcmp(c->op, "GlobalAveragePool") == 0) {
        o.rel_tol = 1e-6; /* as run_pool's */
    }
    float *data = pool_data(c);
    o.inputs[0] = data;
    op_compare_node(&g, 0, &o);
    free(data);
    gp_graph_free(&g);
}

static void test_pools_nhwc(void **state)
{
    (void)state;
    for (int k = 0; k < N_OF(pool_cases); k++) {
        const struct pool_case *c = &pool_cases[k];
        if (!pool_nhwc_applies(c)) continue;
        for (int f = 0; f < argmax_forms(c); f++) {
            byte_argmax(f);
            run_pool_nhwc(c, -1, true);
        }
        byte_argmax_default();
        if (strcmp(c->op, "GlobalAveragePool") == 0) run_pool_nhwc(c, -1, false);
    }
}

/* bfloat16: each case all bfloat16, and again with one of X, Y or dX
 * float32 (case by case, as test_pools_bf16: the run-time typed path, one
 * channel per access). */
static void test_pools_nhwc_bf16(void **state)
{
    (void)state;
    for (int k = 0; k < N_OF(pool_cases); k++) {
        const struct pool_case *c = &pool_cases[k];
        if (!pool_nhwc_applies(c)) continue;
        bool gap = strcmp(c->op, "GlobalAveragePool") == 0;
        for (int f = 0; f < argmax_forms(c); f++) {
            byte_argmax(f);
            run_pool_nhwc(c, 0, true);
            run_pool_nhwc(c, 1 + k % 3, true);
        }
        byte_argmax_default();
        if (gap) run_pool_nhwc(c, 0, false);
    }
}

/* Runs last: with GP_CONV_ADD_API=graph-beta, the cases above must have
 * added some results on the graph API with beta 1 (if cuDNN builds none,
 * that way does not exist on this GPU and the setting must not be
 * offered); with a setting that leaves that way out, none. */
static void test_graph_beta_ran(void **state)
{
    (void)state;
    const char *way = gp_cuda_conv_add_api();
    bool forced = strcmp(way, "graph-beta") == 0, measured = strcmp(way, "measured-beta") == 0;
    unsigned long long n = gp_cuda_conv_graph_beta_calls();
    printf("graph API calls adding with beta 1: %llu\n", n);
    if (forced) assert_true(n > 0);
    else if (!measured) assert_int_equal(n, 0);
}

int main(void)
{
    op_compare_require_device();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv),
        cmocka_unit_test(test_conv_nhwc),
        cmocka_unit_test(test_conv_filter_copies),
        cmocka_unit_test(test_measure_hook),
        cmocka_unit_test(test_conv_transpose),
        cmocka_unit_test(test_conv_tf32),
        cmocka_unit_test(test_conv_bf16),
        cmocka_unit_test(test_conv_transpose_bf16),
        cmocka_unit_test(test_conv_bf16_modes),
        cmocka_unit_test(test_conv_scratch_modes),
        cmocka_unit_test(test_x3_split),
        cmocka_unit_test(test_x3_filter_sum),
        cmocka_unit_test(test_conv_partial_backward),
        cmocka_unit_test(test_pools),
        cmocka_unit_test(test_pools_bf16),
        cmocka_unit_test(test_pools_nhwc),
        cmocka_unit_test(test_pools_nhwc_bf16),
        cmocka_unit_test(test_graph_beta_ran),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (failed == 0)
        printf("cuda_conv: PASSED, %d ops (%d cases against the CPU kernels)\n", op_compare_op_types(),
               op_compare_cases());
    return failed ? 1 : 0;
}
