/* CUDA kernels: the conv family, twin of backend/cpu/conv.c: Conv and
 * ConvTranspose, forward and backward, through cuDNN.
 *
 * Both ops are one cuDNN convolution between an "image" (Conv's input,
 * ConvTranspose's output) and "columns" (Conv's output, ConvTranspose's
 * input), with the weight as the convolution's filter in either case
 * (Conv's W [M, C/g, k...], ConvTranspose's W [C, M/g, k...]): Conv runs it
 * forward, ConvTranspose as its data gradient. So
 *   Conv           forward: cudnnConvolutionForward          (X -> Y)
 *                  dX:      cudnnConvolutionBackwardData     (dY -> dX)
 *                  dW:      cudnnConvolutionBackwardFilter   (X, dY)
 *   ConvTranspose  forward: cudnnConvolutionBackwardData     (X -> Y)
 *                  dX:      cudnnConvolutionForward          (dY -> dX)
 *                  dW:      cudnnConvolutionBackwardFilter   (dY, X)
 * and the bias and its gradient (a per-channel sum in double, one block per
 * channel, a fixed order) are kernels of this file. Gradients accumulate
 * (beta = 1).
 *
 * The window comes from gp_window_resolve, as in shape inference and the
 * CPU kernel. cuDNN pads symmetrically; where the node's pads are not (or
 * ConvTranspose's output_padding and output_shape ask for cells no tap
 * reaches beyond what cuDNN allows), the image goes through a buffer in
 * scratch: the padded input is copied there (zeros around), or the full
 * transposed output is computed there and cropped. 1-D convolutions run as
 * 2-D ones with a leading axis of 1; up to 3 spatial axes, as on the CPU.
 *
 * Storage (ctx->*_dt): float32, or bfloat16 (the BF16 precision of
 * backend/compute.h) for X, W (the executor's bfloat16 copy), Y and the
 * activation gradients dX, dY alike, in cuDNN's bfloat16 configuration
 * (bfloat16 tensors and filter, float32 compute type). The bias is either,
 * and so are dB and dW; cuDNN's filter gradient has the filter's type, so a
 * float32 dW (a parameter's) is computed into a bfloat16 buffer in scratch
 * and added to dW there (which is what autocast's cast of the weight does
 * to its gradient in PyTorch).
 *
 * Channels-last (gp_cuda_ctx.in_nhwc / out_nhwc, graph/layout.h): a Conv
 * over 2 axes with cuDNN's own padding takes X and Y in either layout; it
 * convolves channels-last (cuDNN's NHWC kernels, no transposes of its own)
 * when its channels per group come in runs of 8 (a float32 call's input
 * channels in runs of 4; fewer input channels are padded with zeros to
 * the run), and relays whichever of X and Y
 * lies otherwise through scratch (see "Conv, channels-last").
 *
 * Algorithms: chosen and cached by conv_algos.cu: the legacy API's, or
 * with GP_CONV_API=graph cuDNN's graph API's engine configurations
 * (conv_graph.h) where it has them. The graph API has no beta: a result it
 * accumulates is computed into a buffer in scratch and added. */
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cudnn.h>

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/conv_problem.cuh"
#include "backend/cuda/conv_x3.h"
#include "backend/cuda/convert.h"
#include "backend/cuda/kernel_util.cuh"

extern "C" {
#include "backend/compute.h"
#include "ops/window.h"
#include "util/env.h"
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The input channels of a channels-last float32 convolution come in runs
 * of 4 (16 bytes, what cuDNN's TF32 channels-last kernels align to: the
 * ResNet stem's 3 channels padded to 4, half of the 8 bfloat16 needs and
 * half the stem's work: ResNet-50 +2.1% in tf32, +3.3% in fp32 on an
 * H100, bench/RESULTS.md 2026-12-06), or with GP_CONV_FLOAT32_RUN=8 of 8
 * as in bfloat16, as before. GP_CONV_FLOAT32_RUN=1 pads none: cuDNN gets
 * the stem's 3 channels as they are and pads them itself inside the
 * engines that need it, as PyTorch's channels-last stem does (its weight
 * gradient 0.61 ms on an H100 with cuDNN's padding kernel, ours on 4
 * padded channels 0.91). Measured: correct (the GPU suite passes with
 * it) but slower, ResNet-50 tf32 2918.7 -> 2840.8 samples/s (H100,
 * bench/RESULTS.md 2026-12-06 19:19): cuDNN chose the same weight
 * gradient engine on 3 channels, so it stays off. Bfloat16's are always
 * runs of 8. Read at each call, as the other settings here. */
static int64_t image_channel_run(bool bf16)
{
    static const char *const runs[] = {"4", "8", "1", NULL};
    static const int64_t run_of[] = {4, 8, 1};
    return bf16 ? 8 : run_of[gp_env_choice("GP_CONV_FLOAT32_RUN", runs, 0)];
}

/* `nhwc`: the call's tensors (either of X and Y) are channels-last; the
 * geometry then convolves channels-last where it can (conv_geom.nhwc).
 * `bf16`: the call's storage type is bfloat16 (image_channel_run). */
static gp_status conv_geom_init(const struct gp_graph *graph, const struct gp_node *node,
                                bool transpose, bool nhwc, bool bf16, struct conv_geom *g, struct gp_error *err)
{
    memset(g, 0, sizeof *g);
    const struct gp_value *x = gp_node_input(graph, node, 0), *w = gp_node_input(graph, node, 1);
    const struct gp_value *b = gp_node_input(graph, node, 2);
    /* gp_window_resolve only reads the node's attributes; its context type
     * is the (mutable) inference one. */
    struct gp_infer_ctx ic = {(struct gp_graph *)graph, (struct gp_node *)node, err};
    struct gp_window win;
    GP_TRY(gp_window_resolve(&ic, transpose ? GP_WINDOW_CONV_TRANSPOSE : GP_WINDOW_CONV, &x->shape,
                             &w->shape.dims[2], &win));
    if (win.n_spatial > MAX_AXES)
        return gp_error_set(err, GP_ERR_UNSUPPORTED,
                            "node '%s' (%s): the CUDA backend convolves up to %d spatial axes, not %d",
                            node->name, node->op_type, MAX_AXES, win.n_spatial);
    if (x->dtype != GP_DTYPE_FLOAT32 || w->dtype != GP_DTYPE_FLOAT32 ||
        (b && b->dtype != GP_DTYPE_FLOAT32))
        return gp_error_set(err, GP_ERR_UNSUPPORTED,
                            "node '%s' (%s): the CUDA backend convolves float32 tensors only",
                            node->name, node->op_type);
    g->transpose = transpose;
    g->n = x->shape.dims[0];
    g->c = x->shape.dims[1];
    g->group = gp_node_attr_int(node, "group", 1);
    int64_t mg = transpose ? w->shape.dims[1] : w->shape.dims[0] / g->group;
    g->m = mg * g->group;
    g->img_ch = transpose ? g->m : g->c;
    g->col_ch = transpose ? g->c : g->m;
    g->ns = win.n_spatial < 2 ? 2 : win.n_spatial;
    int lead = g->ns - win.n_spatial;
    g->img_size = g->imgb_size = g->col_size = 1;
    g->direct = true;
    for (int i = 0; i < g->ns; i++) {
        int j = i - lead;
        bool ax = j >= 0;
        int64_t in = ax ? win.in[j] : 1, out = ax ? win.out[j] : 1;
        int64_t k = ax ? win.kernel[j] : 1, s = ax ? win.stride[j] : 1, d = ax ? win.dilation[j] : 1;
        int64_t pb = ax ? win.pad_begin[j] : 0, pe = ax ? win.pad_end[j] : 0;
        int64_t ext = (k - 1) * d + 1;
        g->k[i] = k;
        g->s[i] = s;
        g->d[i] = d;
        if (!transpose) {
            g->img[i] = in;
            g->col[i] = out;
            /* cuDNN's output with pads pb on both sides: when it is the
             * node's, the end pads make no difference. */
            int64_t span = in + 2 * pb - ext;
            if (span >= 0 && span / s + 1 == out) {
                g->q[i] = pb;
                g->imgb[i] = in;
                g->off[i] = 0;
            } else { /* pad the input explicitly by what cuDNN's pads lack */
                g->q[i] = min64(pb, pe);
                g->imgb[i] = in + pb + pe - 2 * g->q[i];
                g->off[i] = pb - g->q[i];
            }
        } else {
            g->img[i] = out;
            g->col[i] = in;
            /* Taps reach the first F cells of the full output; the node's
             * output is the full one from pb on. cuDNN's image with pads q
             * is the full output from q on, of any size F - 2q + r with
             * 0 <= r < stride (the r cells no tap reaches). */
            int64_t f = s * (in - 1) + ext;
            int64_t r = out - f + 2 * pb;
            if (r >= 0 && r < s) {
                g->q[i] = pb;
                g->imgb[i] = out;
                g->off[i] = 0;
            } else {
                int64_t q = min64(pb, pe);
                if (f - 2 * q < 1) q = (f - 1) / 2;
                g->q[i] = q;
                g->imgb[i] = f - 2 * q;
                g->off[i] = pb - q;
            }
        }
        if (g->off[i] != 0 || g->imgb[i] != g->img[i]) g->direct = false;
        g->img_size *= g->img[i];
        g->imgb_size *= g->imgb[i];
        g->col_size *= g->col[i];
    }
    /* Channels-last tensors reach a Conv over 2 axes with cuDNN's own
     * padding (conv_relayable; any other gets [N, C, H, W] copies: its
     * layout_native says no). It convolves channels-last when its channels
     * per group are whole 16-byte runs of bfloat16 (8): cuDNN's
     * channels-last kernels load channels 16 bytes at a time. One with
     * fewer input channels (ResNet's stem: 3) convolves them padded to 8,
     * X and W relaid with zero channels (conv_padded): cuDNN's own
     * padding of such a call went through a float32 copy, TF32 kernels
     * and three transposes of its own, at 8x the time. A float32 call's
     * input channels pad to and come in runs of 4 (image_channel_run; of 1
     * with GP_CONV_FLOAT32_RUN=1: none padded). */
    int64_t run = image_channel_run(bf16);
    g->relayable = !transpose && win.n_spatial == 2 && g->direct;
    if (nhwc && g->relayable && g->group == 1 && g->img_ch < 8 && g->img_ch % run != 0 && g->col_ch % 8 == 0)
        g->img_ch = (g->img_ch + run - 1) / run * run;
    g->nhwc = nhwc && g->relayable && (g->img_ch / g->group) % run == 0 && (g->col_ch / g->group) % 8 == 0;
    /* cuDNN's legacy API takes int dimensions and strides. */
    int64_t biggest = g->n * g->img_ch * (g->imgb_size > g->img_size ? g->imgb_size : g->img_size);
    if (g->n * g->col_ch * g->col_size > biggest) biggest = g->n * g->col_ch * g->col_size;
    if (gp_shape_numel(&w->shape) > biggest) biggest = gp_shape_numel(&w->shape);
    if (biggest > INT_MAX)
        return gp_error_set(err, GP_ERR_UNSUPPORTED,
                            "node '%s' (%s): a tensor of %lld elements exceeds cuDNN's int sizes",
                            node->name, node->op_type, (long long)biggest);
    return GP_OK;
}

/* ---- mode ---- */

/* Float32 convolutions (no TF32) run in 3xTF32 (conv_x3.h) where they
 * can: within test_cuda_conv's float32 bounds on both cuDNN APIs, at
 * tensor-core speed. GP_CONV_FP32=fma keeps them on cuDNN's float32 (FMA)
 * algorithms. */
static bool x3_wanted(void)
{
    static const char *const ways[] = {"3xtf32", "fma", NULL};
    return gp_env_choice("GP_CONV_FP32", ways, 0) == 0;
}

static struct conv_mode ctx_mode(const struct gp_cuda_ctx *c)
{
    struct conv_mode m;
    m.bf16 = gp_cuda_is_bf16(c->in_dt, 0);
    m.tf32 = !m.bf16 && c->tf32;
    m.fast = c->fast_conv;
    m.x3 = !m.bf16 && !m.tf32 && x3_wanted();
    return m;
}

static struct conv_mode options_mode(const struct gp_compute_options *o)
{
    struct conv_mode m;
    m.bf16 = o->precision == GP_PRECISION_BF16;
    m.tf32 = o->precision == GP_PRECISION_TF32;
    m.fast = o->fast_conv;
    m.x3 = o->precision == GP_PRECISION_FP32 && x3_wanted();
    return m;
}

/* Bytes of the image buffer (0 when direct). */
static size_t buffer_bytes(const struct conv_geom *g, bool bf16)
{
    if (g->direct) return 0;
    return align_up(gp_cuda_float_size(bf16) * (size_t)(g->n * g->img_ch * g->imgb_size));
}

/* The filter's elements (W's, for either op). */
static int64_t filter_numel(const struct conv_geom *g)
{
    int64_t n = g->col_ch * (g->img_ch / g->group);
    for (int i = 0; i < g->ns; i++) n *= g->k[i];
    return n;
}

/* Bytes of the bfloat16 buffer a float32 dW is computed into (bfloat16
 * storage only). */
static size_t dw_buffer_bytes(const struct conv_geom *g, bool bf16)
{
    return bf16 ? align_up(sizeof(__nv_bfloat16) * (size_t)filter_numel(g)) : 0;
}

static gp_status dnn_error(const struct gp_cuda_ctx *c, struct gp_error *err, const struct dnn_err *e,
                           const char *what)
{
    return gp_cuda_error(c, err, GP_ERR_DEVICE, "%s: %s: %s", what, e->call ? e->call : "cuDNN",
                         cudnnGetErrorString(e->st));
}

/* ---- float32 in 3xTF32 (conv_x3.h) ---- */

static bool conv_padded(const struct conv_geom *g);

/* Whether a call of geometry g in `mode` runs in 3xTF32: float32 without
 * TF32, a Conv or ConvTranspose of one group whose image is the tensor
 * itself (no pad buffer, no zero channels), its doubled tensors within
 * cuDNN's int sizes. The rest stays on cuDNN's float32 algorithms. A
 * ConvTranspose runs the same three directions with the roles swapped
 * (its forward is the data direction), on the same split operands: the
 * summed axes are img_ch and col_ch whichever op it is (x3_geom). */
static bool x3_applies(const struct conv_geom *g, struct conv_mode mode)
{
    if (!mode.x3 || g->group != 1 || !g->direct || conv_padded(g)) return false;
    int64_t img = g->n * g->img_ch * g->img_size, col = g->n * g->col_ch * g->col_size;
    return 2 * img <= INT_MAX && 2 * col <= INT_MAX && 2 * filter_numel(g) <= INT_MAX;
}

/* A 3xTF32 direction makes two TF32 calls, its parts (conv_x3.h): part 0
 * hi hi over the node's own summed axis, part 1 hi lo and lo hi over that
 * axis doubled, added to part 0's result. */
#define X3_PARTS 2

/* The copies of each operand part `part` convolves: 1 (hi), 2 (the small
 * products' (lo, hi) and (hi, lo)). */
static int x3_copies(int part) { return part == 0 ? 1 : 2; }

/* The TF32 problem of direction k (0 forward, 1 data, 2 filter), part
 * `part`: its summed axis (the image's channels, the columns' channels,
 * a ConvTranspose's batch) times x3_copies(part); a Conv's filter
 * gradient's second part has the columns' channels doubled, its output
 * channels with them (x3_filter_run). The image's channels are X's of a
 * Conv (c) and Y's of a ConvTranspose (m). */
static void x3_geom(const struct conv_geom *g, int k, int part, struct conv_geom *out)
{
    int copies = x3_copies(part);
    *out = *g;
    if (k == 0) {
        out->img_ch *= copies;
        if (g->transpose) out->m *= copies;
        else out->c *= copies;
    } else if (k == 1) {
        out->col_ch *= copies;
        if (g->transpose) out->c *= copies;
        else out->m *= copies;
    } else if (g->transpose) {
        out->n *= copies;
    } else {
        out->col_ch *= copies;
        out->m *= copies;
    }
}

/* The TF32 problems' mode: TF32 whose algorithms keep the exact split
 * operands as they are (conv_problem.cuh). */
static struct conv_mode x3_mode(struct conv_mode m)
{
    struct conv_mode t = {false, true, m.fast, true};
    return t;
}

/* The algorithms of part `part`'s three TF32 problems, each chosen for
 * its own direction only, as one choice. */
static bool x3_lookup(cudnnHandle_t h, const struct conv_geom *g, struct conv_mode mode, int part,
                      struct algo_choice *ch, struct dnn_err *e, const char **why)
{
    memset(ch, 0, sizeof *ch);
    for (int k = 0; k < 3; k++) {
        struct conv_geom gk;
        x3_geom(g, k, part, &gk);
        struct algo_choice one;
        if (!conv_lookup_algos(h, &gk, x3_mode(mode), 1u << k, &one, e, why)) return false;
        ch->acc_legacy[k] = one.acc_legacy[k], ch->ws_acc[k] = one.ws_acc[k];
        memcpy(ch->graph_acc[k], one.graph_acc[k], CONV_GRAPH_NAME);
        if (k == 0) {
            ch->fwd = one.fwd, ch->m_fwd = one.m_fwd, ch->ws_fwd = one.ws_fwd;
            memcpy(ch->graph_fwd, one.graph_fwd, CONV_GRAPH_NAME);
        } else if (k == 1) {
            ch->bwd_data = one.bwd_data, ch->m_data = one.m_data, ch->ws_data = one.ws_data;
            memcpy(ch->graph_data, one.graph_data, CONV_GRAPH_NAME);
        } else {
            ch->bwd_filter = one.bwd_filter, ch->m_filter = one.m_filter, ch->ws_filter = one.ws_filter;
            memcpy(ch->graph_filter, one.graph_filter, CONV_GRAPH_NAME);
        }
    }
    return true;
}

/* A call's algorithms: ch[0] the node's problem's (or in 3xTF32 its first
 * part's), ch[1] the second part's where a 3xTF32 direction makes two
 * calls (parts 2; else 1). */
struct conv_choice {
    struct algo_choice ch[2];
    int parts;
};

/* Every part's algorithms in `mode`; false (e, why) when a lookup fails. */
static bool lookup_choice(cudnnHandle_t h, const struct conv_geom *g, struct conv_mode mode,
                          struct conv_choice *cc, struct dnn_err *e, const char **why)
{
    memset(cc, 0, sizeof *cc);
    cc->parts = 1;
    if (!x3_applies(g, mode)) return conv_lookup_algos(h, g, mode, CONV_DIRS_ALL, &cc->ch[0], e, why);
    cc->parts = X3_PARTS;
    for (int p = 0; p < cc->parts; p++)
        if (!x3_lookup(h, g, mode, p, &cc->ch[p], e, why)) return false;
    return true;
}

/* Bytes of one operand's split copies (n values): hi's region, then the
 * two small copies'. */
static size_t x3_operand_bytes(int64_t n)
{
    return align_up(sizeof(float) * (size_t)n) + align_up(2 * sizeof(float) * (size_t)n);
}

/* GP_CONV_X3_BATCH=blocked: a ConvTranspose's filter gradient's operands
 * split along the batch as two whole blocks
 * (gp_cuda_conv_x3_split_blocks), hi's block also the first call's
 * operand: one copy fewer written for each. Off by default. (A Conv's
 * filter gradient splits otherwise: x3_filter_run.) Read once: the plan
 * and the calls must agree. */
static bool x3_batch_blocked(void)
{
    static int on = -1;
    if (on < 0) {
        static const char *const ways[] = {"interleaved", "blocked", NULL};
        on = gp_env_choice("GP_CONV_X3_BATCH", ways, 0) == 1;
    }
    return on;
}

/* Whether the filter gradient's operands of n_img and n_col values split
 * as blocks: asked, and each block 256-byte aligned (a multiple of 64
 * values), as every operand cuDNN was measured with. */
static bool x3_blocks_apply(int64_t n_img, int64_t n_col)
{
    return x3_batch_blocked() && n_img % 64 == 0 && n_col % 64 == 0;
}

/* Bytes of one operand's two copies as blocks (n values each). */
static size_t x3_blocks_bytes(int64_t n) { return align_up(2 * sizeof(float) * (size_t)n); }

/* A Conv's filter gradient's region (x3_filter_run): the columns' split
 * (where the data gradient leaves it), the image's hi and lo, the filter
 * gradient's parts ([2M, R] and [M, R]). */
static size_t x3_filter_run_bytes(int64_t n_img, int64_t n_col, int64_t n_w)
{
    return x3_operand_bytes(n_col) + 2 * align_up(sizeof(float) * (size_t)n_img) +
           align_up(2 * sizeof(float) * (size_t)n_w) + align_up(sizeof(float) * (size_t)n_w);
}

/* Bytes of the split operands of the directions in `dirs`: forward X
 * and W, data dY and W, filter X and dY (a backward's two reuse one
 * region). */
static size_t x3_buffer_bytes(const struct conv_geom *g, unsigned dirs)
{
    int64_t n_img = g->n * g->img_ch * g->img_size, n_col = g->n * g->col_ch * g->col_size;
    size_t img = x3_operand_bytes(n_img), col = x3_operand_bytes(n_col), w = x3_operand_bytes(filter_numel(g));
    size_t filter = !g->transpose                    ? x3_filter_run_bytes(n_img, n_col, filter_numel(g))
                    : x3_blocks_apply(n_img, n_col) ? x3_blocks_bytes(n_img) + x3_blocks_bytes(n_col)
                                                    : img + col;
    size_t most = 0;
    if ((dirs & CONV_DIR_FWD) && img + w > most) most = img + w;
    if ((dirs & CONV_DIR_DATA) && col + w > most) most = col + w;
    if ((dirs & CONV_DIR_FILTER) && filter > most) most = filter;
    return most;
}

static unsigned long long x3_calls;

extern "C" unsigned long long gp_cuda_conv_x3_calls(void) { return __atomic_load_n(&x3_calls, __ATOMIC_RELAXED); }

static unsigned long long graph_beta_calls;

extern "C" unsigned long long gp_cuda_conv_graph_beta_calls(void)
{
    return __atomic_load_n(&graph_beta_calls, __ATOMIC_RELAXED);
}

static gp_status ctx_algos(const struct gp_cuda_ctx *c, const struct conv_geom *g, struct conv_mode mode,
                           struct conv_choice *cc, struct gp_error *err)
{
    struct dnn_err e = {CUDNN_STATUS_SUCCESS, NULL};
    const char *why = NULL;
    if (lookup_choice((cudnnHandle_t)c->cudnn, g, mode, cc, &e, &why)) return GP_OK;
    if (why && x3_applies(g, mode))
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED,
                             "cuDNN offers no TF32 %s algorithm for this float32 convolution in 3xTF32 "
                             "(with GP_CONV_FP32=fma it runs on cuDNN's float32 algorithms)",
                             why);
    if (why)
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED,
                             "cuDNN offers no %s algorithm with a workspace of at most "
                             "%zu MiB for this convolution (%s math)",
                             why, conv_ws_cap(g) >> 20, conv_math_name(mode));
    return dnn_error(c, err, &e, "choosing algorithms");
}

/* ---- scratch ----
 * A call lays out its scratch for the directions it runs (call_dirs):
 * the forward its one, the backward those of the gradients asked for. The
 * planner gives a node the larger of its forward's and its backward's
 * layouts, so a direction that never runs takes nothing: the data
 * gradient of a network's first convolution, whose input is the data
 * (ResNet-50's stem in bf16: 312 MB of workspace for its data gradient
 * algorithm, 26 times the next largest of the network). */

/* The directions (CONV_DIR_*) a call runs: a forward its own (ConvTranspose's
 * is the data gradient's algorithm); a backward those of the gradients in
 * din (bit 0 X, bit 1 W; the bias's needs none). */
static unsigned call_dirs(bool transpose, bool backward, uint32_t din)
{
    if (!backward) return transpose ? CONV_DIR_DATA : CONV_DIR_FWD;
    unsigned d = 0;
    if (din & 1u) d |= transpose ? CONV_DIR_FWD : CONV_DIR_DATA;
    if (din & 2u) d |= CONV_DIR_FILTER;
    return d;
}

/* Bytes of the buffer a graph API result is accumulated from (its output
 * then gets the buffer added): the largest output that a direction of
 * `dirs` on the graph API accumulates, in the type run_graph computes it
 * in (float32, or bfloat16 where the problem's result is: a bfloat16
 * data gradient by default, conv_graph_problem_of). 0 when none does. */
static size_t acc_buffer_bytes(const struct conv_geom *g, struct conv_mode mode, const struct conv_choice *cc,
                               unsigned dirs)
{
    int64_t img = g->n * g->img_ch * g->imgb_size, col = g->n * g->col_ch * g->col_size;
    const struct algo_choice *ch = &cc->ch[0];
    /* A separate 3xTF32 call's second part adds to its output in every
     * direction but a Conv's filter gradient, whose parts are written
     * whole and summed apart (x3_filter_run). Where the legacy API or the
     * graph API's engine adds (algo_choice.acc_legacy, graph_acc) no
     * buffer is needed. */
    const struct algo_choice *add = cc->parts > 1 ? &cc->ch[1] : NULL;
    bool graph[3], graph_add[3];
    const char *const names[3] = {ch->graph_fwd, ch->graph_data, ch->graph_filter};
    const char *const add_names[3] = {add ? add->graph_fwd : "", add ? add->graph_data : "",
                                      add ? add->graph_filter : ""};
    for (int k = 0; k < 3; k++) {
        graph[k] = names[k][0] && !ch->acc_legacy[k] && !ch->graph_acc[k][0];
        graph_add[k] = add && add_names[k][0] && !add->acc_legacy[k] && !add->graph_acc[k][0];
    }
    const struct {
        bool on;
        enum conv_graph_op op;
        int64_t n;
    } acc[3] = {
        {(dirs & CONV_DIR_FWD) && ((graph[0] && g->transpose) || graph_add[0]), CONV_GRAPH_FPROP,
         col}, /* ConvTranspose's dX, a Conv's Y in parts */
        {(dirs & CONV_DIR_DATA) && ((graph[1] && !g->transpose) || graph_add[1]), CONV_GRAPH_DGRAD,
         img}, /* Conv's dX, a ConvTranspose's Y in parts */
        {(dirs & CONV_DIR_FILTER) && (graph[2] || graph_add[2]) && !(add && !g->transpose), CONV_GRAPH_WGRAD,
         filter_numel(g)}, /* dW */
    };
    size_t most = 0;
    for (int k = 0; k < 3; k++) {
        if (!acc[k].on) continue;
        struct conv_graph_problem p;
        conv_graph_problem_of(g, mode, acc[k].op, &p);
        size_t bytes = (mode.bf16 && !p.float_out ? sizeof(uint16_t) : sizeof(float)) * (size_t)acc[k].n;
        if (bytes > most) most = bytes;
    }
    return most ? align_up(most) : 0;
}

/* The workspace of the directions in `dirs`: their largest algorithm's,
 * over every part. */
static size_t ws_bytes(const struct conv_choice *cc, unsigned dirs)
{
    size_t ws = 0;
    for (int p = 0; p < cc->parts; p++) {
        const struct algo_choice *ch = &cc->ch[p];
        if ((dirs & CONV_DIR_FWD) && ch->ws_fwd > ws) ws = ch->ws_fwd;
        if ((dirs & CONV_DIR_DATA) && ch->ws_data > ws) ws = ch->ws_data;
        for (int k = 0; k < 3; k++)
            if ((dirs & (1u << k)) && (ch->acc_legacy[k] || ch->graph_acc[k][0]) && ch->ws_acc[k] > ws)
                ws = ch->ws_acc[k];
        if ((dirs & CONV_DIR_FILTER) && ch->ws_filter > ws) ws = ch->ws_filter;
    }
    return ws;
}

/* A call's layout after its channels-last buffers: the image buffer, a
 * float32 dW's bfloat16 buffer, the accumulation buffer, in 3xTF32 the
 * split operands, then the workspace (run_begin places them so). */
static size_t call_bytes(const struct conv_geom *g, struct conv_mode mode, bool x3, const struct conv_choice *cc,
                         unsigned dirs)
{
    return buffer_bytes(g, mode.bf16) + dw_buffer_bytes(g, mode.bf16) + acc_buffer_bytes(g, mode, cc, dirs) +
           (x3 ? x3_buffer_bytes(g, dirs) : 0) + ws_bytes(cc, dirs);
}

/* Scratch in `mode` for the node's forward and a backward computing the
 * gradients in din: the larger of the two calls' layouts (the backward's
 * alone with GP_SCRATCH_BACKWARD in din). */
static size_t mode_scratch(const struct conv_geom *g, struct conv_mode mode, uint32_t din)
{
    struct conv_choice cc;
    struct dnn_err e = {CUDNN_STATUS_SUCCESS, NULL};
    const char *why;
    bool x3 = x3_applies(g, mode);
    unsigned fwd = call_dirs(g->transpose, false, din), bwd = call_dirs(g->transpose, true, din);
    if (!lookup_choice(NULL, g, mode, &cc, &e, &why)) {
        /* Nothing found: the run chooses again and reports what fails;
         * plan for the most any algorithm may take. */
        size_t ws = conv_ws_cap(g);
        for (int p = 0; p < (x3 ? X3_PARTS : 0); p++)
            for (int k = 0; k < 3; k++) { /* the TF32 problems' caps */
                struct conv_geom gk;
                x3_geom(g, k, p, &gk);
                if (conv_ws_cap(&gk) > ws) ws = conv_ws_cap(&gk);
            }
        memset(&cc, 0, sizeof cc);
        cc.parts = x3 ? X3_PARTS : 1;
        for (int p = 0; p < cc.parts; p++) cc.ch[p].ws_fwd = cc.ch[p].ws_data = cc.ch[p].ws_filter = ws;
    }
    size_t f = call_bytes(g, mode, x3, &cc, fwd), b = call_bytes(g, mode, x3, &cc, bwd);
    if (gp_scratch_backward_only(din)) return b;
    return f > b ? f : b;
}

/* Whether X's and W's channels are convolved padded with zeros to
 * img_ch (conv_geom_init): c of them are X's. */
static bool conv_padded(const struct conv_geom *g) { return !g->transpose && g->img_ch != g->c; }

/* Whether the filter's channels-last form differs from W's ([M, C/g,
 * k...] against [M, k..., C/g]): not for 1x1 kernels, unless padded. */
static bool filter_relaid(const struct conv_geom *g)
{
    return g->nhwc && (g->k[0] * g->k[1] > 1 || conv_padded(g));
}

/* Whether X goes through its buffer: it lies otherwise than the run's
 * layout, or its channels are padded. */
static bool image_relaid(const struct conv_geom *g, bool x_cl) { return x_cl != g->nhwc || conv_padded(g); }

/* Scratch of a channels-last run before its cuDNN buffers: X (and dX)
 * channels-last when X lies [N, C, H, W] (x_cl false), Y (and dY) when Y
 * does, the filter and its gradient channels-last when they differ. */
static size_t nhwc_bytes(const struct conv_geom *g, bool bf16, bool x_cl, bool y_cl)
{
    size_t es = gp_cuda_float_size(bf16), b = 0;
    if (image_relaid(g, x_cl)) b += align_up(es * (size_t)(g->n * g->img_ch * g->img_size));
    if (y_cl != g->nhwc) b += align_up(es * (size_t)(g->n * g->col_ch * g->col_size));
    if (filter_relaid(g)) b += 2 * align_up(es * (size_t)filter_numel(g));
    return b;
}

/* The table's scratch_bytes, for callers that do not say the mode: the
 * most any precision, policy and layout can take. */
static size_t conv_scratch_common(const struct gp_graph *graph, const struct gp_node *node,
                                  bool transpose)
{
    struct conv_geom g;
    struct gp_error err;
    memset(&err, 0, sizeof err);
    static const enum gp_precision precisions[] = {GP_PRECISION_FP32, GP_PRECISION_TF32, GP_PRECISION_BF16};
    size_t most = 0;
    for (int p = 0; p < 3; p++)
        for (int fast = 0; fast < 2; fast++) {
            struct gp_compute_options o;
            memset(&o, 0, sizeof o);
            o.precision = precisions[p];
            o.fast_conv = fast != 0;
            bool bf16 = options_mode(&o).bf16;
            if (conv_geom_init(graph, node, transpose, false, bf16, &g, &err) != GP_OK) return 0;
            struct conv_geom gc; /* channels-last, X and Y both transposed: the most it takes */
            if (conv_geom_init(graph, node, transpose, true, bf16, &gc, &err) != GP_OK) return 0;
            size_t s = mode_scratch(&g, options_mode(&o), ~0u);
            if (s > most) most = s;
            /* X and Y relaid: the most a layout call takes */
            s = gc.relayable ? nhwc_bytes(&gc, options_mode(&o).bf16, !gc.nhwc, !gc.nhwc) +
                                   mode_scratch(&gc, options_mode(&o), ~0u)
                             : 0;
            if (s > most) most = s;
        }
    return most;
}

static size_t conv_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    return conv_scratch_common(g, node, false);
}

static size_t conv_transpose_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    return conv_scratch_common(g, node, true);
}

/* ---- helper kernels ---- */

typedef __nv_bfloat16 bf16_t;

/* The image and its buffer over 3 axes (fewer padded in front with 1). */
struct pad_map {
    int64_t planes;
    int64_t img[3], imgb[3], off[3];
    int64_t img_size, imgb_size;
};

static void pad_map_init(const struct conv_geom *g, struct pad_map *pm)
{
    int lead = 3 - g->ns;
    pm->planes = g->n * g->img_ch;
    for (int i = 0; i < 3; i++) {
        int j = i - lead;
        pm->img[i] = j >= 0 ? g->img[j] : 1;
        pm->imgb[i] = j >= 0 ? g->imgb[j] : 1;
        pm->off[i] = j >= 0 ? g->off[j] : 0;
    }
    pm->img_size = g->img_size;
    pm->imgb_size = g->imgb_size;
}

/* buf [planes, imgb...] = src [planes, img...] placed at off, zeros around
 * (T: the convolution's storage). */
template <typename T>
__global__ static void gather_kernel(const T *src, T *buf, struct pad_map pm)
{
    GP_GRID_STRIDE(e, pm.planes * pm.imgb_size)
    {
        int64_t pl = e / pm.imgb_size, r = e - pl * pm.imgb_size;
        int64_t j2 = r % pm.imgb[2], j1 = (r / pm.imgb[2]) % pm.imgb[1], j0 = r / (pm.imgb[2] * pm.imgb[1]);
        int64_t i0 = j0 - pm.off[0], i1 = j1 - pm.off[1], i2 = j2 - pm.off[2];
        bool in = i0 >= 0 && i0 < pm.img[0] && i1 >= 0 && i1 < pm.img[1] && i2 >= 0 && i2 < pm.img[2];
        buf[e] = in ? src[pl * pm.img_size + (i0 * pm.img[1] + i1) * pm.img[2] + i2] : T(0.0f);
    }
}

/* dst [planes, img...]: each cell from buf at its place (0 where buf has
 * none), added to dst (`add`) or to the channel's bias (or 0); float32
 * arithmetic, one rounding into a bfloat16 dst. */
template <typename T, typename TB>
__global__ static void place_kernel(const T *buf, T *dst, const TB *bias, int64_t ch, bool add,
                                    struct pad_map pm)
{
    GP_GRID_STRIDE(e, pm.planes * pm.img_size)
    {
        int64_t pl = e / pm.img_size, r = e - pl * pm.img_size;
        int64_t i2 = r % pm.img[2], i1 = (r / pm.img[2]) % pm.img[1], i0 = r / (pm.img[2] * pm.img[1]);
        int64_t j0 = i0 + pm.off[0], j1 = i1 + pm.off[1], j2 = i2 + pm.off[2];
        float v = 0.0f;
        if (j0 < pm.imgb[0] && j1 < pm.imgb[1] && j2 < pm.imgb[2])
            v = gp_load(buf + pl * pm.imgb_size + (j0 * pm.imgb[1] + j1) * pm.imgb[2] + j2);
        float base = add ? gp_load(dst + e) : bias ? gp_load(bias + pl % ch) : 0.0f;
        gp_store(dst + e, __fadd_rn(base, v));
    }
}

/* y [planes, size] += bias [planes % ch]. */
template <typename T, typename TB>
__global__ static void bias_add_kernel(T *y, const TB *bias, int64_t ch, int64_t size, int64_t n)
{
    GP_GRID_STRIDE(e, n) gp_store(y + e, __fadd_rn(gp_load(y + e), gp_load(bias + (e / size) % ch)));
}

#define BIAS_THREADS 512

/* dB [ch] += dY [N, ch, size] summed over N and the cells: one block per
 * channel, partial sums in double, a tree in a fixed order. */
template <typename TB, typename TD>
__global__ static void bias_grad_kernel(TB *db, const TD *dy, int64_t n, int64_t ch, int64_t size)
{
    __shared__ double part[BIAS_THREADS];
    int64_t c = blockIdx.x;
    double s = 0;
    for (int64_t i = 0; i < n; i++) {
        const TD *row = dy + (i * ch + c) * size;
        for (int64_t t = threadIdx.x; t < size; t += BIAS_THREADS) s += (double)gp_load(row + t);
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int half = BIAS_THREADS / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) gp_store(db + c, __fadd_rn(gp_load(db + c), (float)part[0]));
}

/* dst [n] (float32) += src [n] (bfloat16): a float32 dW from its buffer. */
__global__ static void add_bf16_kernel(float *dst, const bf16_t *src, int64_t n)
{
    GP_GRID_STRIDE(e, n) dst[e] = __fadd_rn(dst[e], gp_load(src + e));
}

/* Launchers: `bf16` is the convolution's storage, the bias and its
 * gradient say theirs. */
static gp_status launch_gather(const struct gp_cuda_ctx *c, const struct conv_geom *g, bool bf16,
                               const void *src, void *buf, struct gp_error *err)
{
    struct pad_map pm;
    pad_map_init(g, &pm);
    int64_t n = pm.planes * pm.imgb_size;
    if (n == 0) return GP_OK;
    unsigned blocks = gp_cuda_blocks_for(n);
    if (bf16)
        gather_kernel<bf16_t><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>((const bf16_t *)src, (bf16_t *)buf, pm);
    else
        gather_kernel<float><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>((const float *)src, (float *)buf, pm);
    return gp_cuda_check_launch(c, "image into its padded buffer", err);
}

template <typename T, typename TB>
static void place(const struct gp_cuda_ctx *c, const struct conv_geom *g, const struct pad_map *pm,
                  const void *buf, void *dst, const void *bias, bool add)
{
    place_kernel<T, TB><<<gp_cuda_blocks_for(pm->planes * pm->img_size), GP_CUDA_THREADS, 0, c->stream>>>(
        (const T *)buf, (T *)dst, (const TB *)bias, g->img_ch, add, *pm);
}

static gp_status launch_place(const struct gp_cuda_ctx *c, const struct conv_geom *g, bool bf16,
                              const void *buf, void *dst, const void *bias, bool bias_bf16, bool add,
                              struct gp_error *err)
{
    struct pad_map pm;
    pad_map_init(g, &pm);
    int64_t n = pm.planes * pm.img_size;
    if (n == 0) return GP_OK;
    if (bf16 && bias_bf16) place<bf16_t, bf16_t>(c, g, &pm, buf, dst, bias, add);
    else if (bf16) place<bf16_t, float>(c, g, &pm, buf, dst, bias, add);
    else if (bias_bf16) place<float, bf16_t>(c, g, &pm, buf, dst, bias, add);
    else place<float, float>(c, g, &pm, buf, dst, bias, add);
    return gp_cuda_check_launch(c, "image out of its buffer", err);
}

template <typename T, typename TB>
static void bias_add(const struct gp_cuda_ctx *c, void *y, const void *bias, int64_t ch, int64_t size,
                     int64_t total)
{
    bias_add_kernel<T, TB><<<gp_cuda_blocks_for(total), GP_CUDA_THREADS, 0, c->stream>>>(
        (T *)y, (const TB *)bias, ch, size, total);
}

static gp_status launch_bias_add(const struct gp_cuda_ctx *c, bool bf16, void *y, const void *bias,
                                 bool bias_bf16, int64_t n, int64_t ch, int64_t size, struct gp_error *err)
{
    int64_t total = n * ch * size;
    if (!bias || total == 0) return GP_OK;
    if (bf16 && bias_bf16) bias_add<bf16_t, bf16_t>(c, y, bias, ch, size, total);
    else if (bf16) bias_add<bf16_t, float>(c, y, bias, ch, size, total);
    else if (bias_bf16) bias_add<float, bf16_t>(c, y, bias, ch, size, total);
    else bias_add<float, float>(c, y, bias, ch, size, total);
    return gp_cuda_check_launch(c, "bias", err);
}

template <typename TB, typename TD>
static void bias_grad(const struct gp_cuda_ctx *c, void *db, const void *dy, int64_t n, int64_t ch,
                      int64_t size)
{
    bias_grad_kernel<TB, TD><<<(unsigned)ch, BIAS_THREADS, 0, c->stream>>>((TB *)db, (const TD *)dy, n, ch,
                                                                           size);
}

static gp_status launch_bias_grad(const struct gp_cuda_ctx *c, void *db, bool db_bf16, const void *dy,
                                  bool dy_bf16, int64_t n, int64_t ch, int64_t size, struct gp_error *err)
{
    if (!db || ch == 0) return GP_OK;
    if (ch > INT_MAX) return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "too many channels for the bias");
    if (db_bf16 && dy_bf16) bias_grad<bf16_t, bf16_t>(c, db, dy, n, ch, size);
    else if (db_bf16) bias_grad<bf16_t, float>(c, db, dy, n, ch, size);
    else if (dy_bf16) bias_grad<float, bf16_t>(c, db, dy, n, ch, size);
    else bias_grad<float, float>(c, db, dy, n, ch, size);
    return gp_cuda_check_launch(c, "bias gradient", err);
}

/* ---- the three cuDNN calls ---- */

/* Everything a call needs: geometry, mode, algorithms, descriptors,
 * buffers. */
struct conv_run {
    struct conv_geom g;
    struct conv_mode mode;
    struct conv_choice cc; /* cc.ch[0] the node's problem's (in 3xTF32 its first part's) */
    struct descs d;
    void *buf;   /* image buffer (NULL when direct) */
    bf16_t *dwbuf; /* a float32 dW's bfloat16 buffer (bfloat16 storage only) */
    void *acc;   /* a graph API result to accumulate (NULL when none is) */
    void *ws;    /* workspace */
    /* Channels-last (g.nhwc): whether X and Y lie so, and the buffers of
     * what does not (nhwc_bytes): X or dX, Y or dY, the filter and its
     * gradient (NULL when not needed); w_cl: W itself lies [M, k..., C/g]
     * (the executor's copy, gp_layer_call.held_nhwc: no filter buffer), and
     * dw_cl: dW too (held_grad_nhwc: written where it lies). */
    bool x_cl, y_cl, w_cl, dw_cl;
    void *xt, *yt, *wt, *dwt;
    /* 3xTF32 (x3_applies): each part's TF32 problem of each direction
     * (x3_geom), their descriptors, and the split operands' region
     * (x3_buffer_bytes). */
    bool x3;
    struct conv_geom g3[2][3];
    struct descs d3[2][3];
    char *x3buf;
    /* The dY whose split along its channels (a Conv's data gradient's
     * first operand) lies at the start of x3buf, for the filter gradient
     * after it in the same call (x3_filter_run); NULL when none does. */
    const void *x3_dy;
};

static const char *dt_name(bool bf16) { return bf16 ? "bfloat16" : "float32"; }

/* X, W, Y (forward) or dY, dX (backward) must share one storage: cuDNN's
 * configurations have one type for tensors and filter. */
static gp_status check_storage(const struct gp_cuda_ctx *c, bool bf16, bool backward, struct gp_error *err)
{
    const char *what = NULL;
    bool other = bf16;
    if (gp_cuda_is_bf16(c->in_dt, 1) != bf16) {
        what = "W", other = !bf16;
    } else if (!backward && gp_cuda_is_bf16(c->out_dt, 0) != bf16) {
        what = "Y", other = !bf16;
    } else if (backward && gp_cuda_is_bf16(c->dout_dt, 0) != bf16) {
        what = "dY", other = !bf16;
    } else if (backward && c->din[0] && gp_cuda_is_bf16(c->din_dt, 0) != bf16) {
        what = "dX", other = !bf16;
    } else if (backward && c->din[1] && !bf16 && gp_cuda_is_bf16(c->din_dt, 1)) {
        what = "dW", other = true;
    }
    if (!what) return GP_OK;
    return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED,
                         "X is stored as %s and %s as %s: cuDNN convolves tensors of one storage type",
                         dt_name(bf16), what, dt_name(other));
}

static gp_status run_begin(const struct gp_cuda_ctx *c, bool transpose, bool backward, struct conv_run *r,
                           struct gp_error *err)
{
    memset(r, 0, sizeof *r);
    r->x_cl = gp_cuda_nhwc(c->in_nhwc, 0);
    r->y_cl = gp_cuda_nhwc(c->out_nhwc, 0);
    r->w_cl = gp_cuda_nhwc(c->in_nhwc, 1);
    r->dw_cl = r->w_cl && gp_cuda_nhwc(c->held_grad_nhwc, 1);
    r->mode = ctx_mode(c);
    GP_TRY(conv_geom_init(c->graph, c->node, transpose, r->x_cl || r->y_cl, r->mode.bf16, &r->g, err));
    if ((r->x_cl || r->y_cl) && !r->g.relayable)
        return gp_cuda_error(c, err, GP_ERR_INVALID, "channels-last tensors given to a convolution that takes none");
    if (r->w_cl && (!r->g.nhwc || conv_padded(&r->g)))
        return gp_cuda_error(c, err, GP_ERR_INVALID,
                             "a channels-last filter given to a convolution that does not run channels-last "
                             "on its channels as they are");
    GP_TRY(check_storage(c, r->mode.bf16, backward, err));
    GP_TRY(ctx_algos(c, &r->g, r->mode, &r->cc, err));
    struct dnn_err e = {CUDNN_STATUS_SUCCESS, NULL};
    if (!conv_descs_create(&r->g, r->mode.bf16, conv_base_math(r->mode), &r->d, &e))
        return dnn_error(c, err, &e, "descriptors");
    r->x3 = x3_applies(&r->g, r->mode);
    for (int p = 0; p < (r->x3 ? r->cc.parts : 0); p++)
        for (int k = 0; k < 3; k++) {
            x3_geom(&r->g, k, p, &r->g3[p][k]);
            if (!conv_descs_create(&r->g3[p][k], false, conv_base_math(x3_mode(r->mode)), &r->d3[p][k], &e))
                return dnn_error(c, err, &e, "descriptors of a 3xTF32 problem");
        }
    /* Scratch: channels-last buffers (nhwc_bytes), then image buffer, dW
     * buffer, accumulation buffer, 3xTF32's split operands, workspace
     * (mode_scratch). */
    char *next = (char *)c->scratch;
    if (r->x_cl || r->y_cl) {
        size_t es = gp_cuda_float_size(r->mode.bf16);
        size_t xb = align_up(es * (size_t)(r->g.n * r->g.img_ch * r->g.img_size));
        size_t yb = align_up(es * (size_t)(r->g.n * r->g.col_ch * r->g.col_size));
        size_t fb = align_up(es * (size_t)filter_numel(&r->g));
        if (image_relaid(&r->g, r->x_cl)) r->xt = next, next += xb;
        if (r->y_cl != r->g.nhwc) r->yt = next, next += yb;
        /* A channels-last W (w_cl) is read as it lies; dW goes through
         * its buffer unless it lies so too (dw_cl). */
        if (filter_relaid(&r->g)) r->wt = r->w_cl ? NULL : next, r->dwt = next + fb, next += 2 * fb;
    }
    /* This call's directions (call_dirs): the planner gave the larger of
     * the forward's and the backward's layouts. */
    uint32_t din = (c->din && c->din[0] ? 1u : 0u) | (c->din && c->din[1] ? 2u : 0u);
    unsigned dirs = call_dirs(transpose, backward, din);
    size_t bb = buffer_bytes(&r->g, r->mode.bf16), wb = dw_buffer_bytes(&r->g, r->mode.bf16);
    size_t ab = acc_buffer_bytes(&r->g, r->mode, &r->cc, dirs);
    r->buf = bb ? next : NULL;
    r->dwbuf = wb ? (bf16_t *)(next + bb) : NULL;
    r->acc = ab ? next + bb + wb : NULL;
    size_t xb = r->x3 ? x3_buffer_bytes(&r->g, dirs) : 0;
    r->x3buf = xb ? next + bb + wb + ab : NULL;
    r->ws = next + bb + wb + ab + xb;
    return GP_OK;
}

static gp_status dnn_call(const struct gp_cuda_ctx *c, struct gp_error *err, cudnnStatus_t st,
                          const char *call)
{
    if (st == CUDNN_STATUS_SUCCESS) return GP_OK;
    return gp_cuda_error(c, err, GP_ERR_DEVICE, "%s: %s", call, cudnnGetErrorString(st));
}

/* dst[i] (the convolution's storage) += src[i] (float32, or that storage). */
template <typename D, typename S>
__global__ static void accumulate_kernel(D *dst, const S *src, int64_t n)
{
    GP_GRID_STRIDE(i, n) dst[i] = D((float)dst[i] + (float)src[i]);
}

/* The same on runs of 8 values (16-byte accesses of bfloat16; gp_runs_fit):
 * a single 2-byte value per access leaves most of the bandwidth unused. */
template <typename D, typename S>
__global__ static void accumulate_runs_kernel(D *dst, const S *src, int64_t runs)
{
    const int64_t st = (int64_t)gridDim.x * blockDim.x;
    for (int64_t r0 = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r0 < runs; r0 += 2 * st) {
        float d[2][8], v[2][8];
#pragma unroll
        for (int u = 0; u < 2; u++)
            if (r0 + u * st < runs) {
                gp_run<D, 8>::load(dst, (r0 + u * st) * 8, d[u]);
                gp_run<S, 8>::load(src, (r0 + u * st) * 8, v[u]);
            }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (r0 + u * st >= runs) continue;
#pragma unroll
            for (int k = 0; k < 8; k++) d[u][k] = d[u][k] + v[u][k];
            gp_run<D, 8>::store(dst, (r0 + u * st) * 8, d[u]);
        }
    }
}

/* out += acc, n values, on runs where they fit. */
template <typename D, typename S>
static void accumulate(cudaStream_t stream, D *out, const S *acc, int64_t n)
{
    if (gp_runs_fit(n, 8, sizeof(D), {out}) && gp_runs_fit(n, 8, sizeof(S), {acc}))
        accumulate_runs_kernel<D, S><<<gp_cuda_blocks_for((n / 8 + 1) / 2), GP_CUDA_THREADS, 0, stream>>>(out, acc,
                                                                                                      n / 8);
    else
        accumulate_kernel<D, S><<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, stream>>>(out, acc, n);
}

/* out = a graph API convolution `op` of (a, b), or out += it when beta is
 * 1: computed into the accumulation buffer (float32 where the problem says
 * so), then added, each sum rounded once. `n` is out's element count. */
static gp_status run_graph(const struct gp_cuda_ctx *c, struct conv_run *r, const struct conv_geom *g,
                           struct conv_mode mode, enum conv_graph_op op, const char *name, const void *a,
                           const void *b, void *out, int64_t n, float beta, struct gp_error *err)
{
    struct conv_graph_problem p;
    conv_graph_problem_of(g, mode, op, &p);
    void *dst = beta != 0.0f ? r->acc : out;
    if (!dst)
        return gp_cuda_error(c, err, GP_ERR_DEVICE, "conv: no accumulation buffer for an accumulated %s",
                             name);
    char why[512];
    if (!conv_graph_run((cudnnHandle_t)c->cudnn, &p, op, name, a, b, dst, r->ws, why, sizeof why))
        return gp_cuda_error(c, err, GP_ERR_DEVICE, "cuDNN graph convolution (%s): %s", name, why);
    if (beta == 0.0f || n == 0) return GP_OK;
    conv_accumulate_launch(c->stream, out, dst, n, mode.bf16, p.float_out);
    return gp_cuda_check_launch(c, "convolution result added to its gradient", err);
}

/* Direction k's call adding its result into out on the graph API's
 * engine configuration `name` (an algo_choice's graph_acc[k]: beta 1,
 * conv_graph_beta_run): no buffer, no add. */
static gp_status run_graph_beta(const struct gp_cuda_ctx *c, struct conv_run *r, const struct conv_geom *g,
                                struct conv_mode mode, int k, const char *name, const void *a, const void *b,
                                void *out, struct gp_error *err)
{
    static const enum conv_graph_op ops[3] = {CONV_GRAPH_FPROP, CONV_GRAPH_DGRAD, CONV_GRAPH_WGRAD};
    struct conv_graph_problem p;
    conv_graph_problem_of(g, mode, ops[k], &p);
    p.float_out = false; /* the output in the storage type, as the choice measured it */
    char why[512];
    if (!conv_graph_beta_run((cudnnHandle_t)c->cudnn, &p, ops[k], name, a, b, out, r->ws, why, sizeof why))
        return gp_cuda_error(c, err, GP_ERR_DEVICE, "cuDNN graph convolution with beta 1 (%s): %s", name, why);
    __atomic_add_fetch(&graph_beta_calls, 1, __ATOMIC_RELAXED);
    return GP_OK;
}

cudaError_t conv_accumulate_launch(cudaStream_t stream, void *dst, const void *src, int64_t n, bool bf16,
                                   bool float_src)
{
    if (!bf16)
        accumulate(stream, (float *)dst, (const float *)src, n);
    else if (float_src)
        accumulate(stream, (bf16_t *)dst, (const float *)src, n);
    else
        accumulate(stream, (bf16_t *)dst, (const bf16_t *)src, n);
    return cudaPeekAtLastError();
}

/* ---- the calls, in 3xTF32 on the split operands (conv_x3.h) ---- */

static gp_status x3_split(const struct gp_cuda_ctx *c, float *dst, float *hi, const void *src, int64_t outer,
                          int64_t ch, int64_t inner, int copies, unsigned lo_parts, struct gp_error *err)
{
    cudaError_t e = gp_cuda_conv_x3_split(c->stream, dst, hi, (const float *)src, outer, ch, inner, copies, lo_parts);
    if (e != cudaSuccess)
        return gp_cuda_error(c, err, GP_ERR_DEVICE, "3xTF32 operand split: %s", cudaGetErrorString(e));
    return GP_OK;
}

/* How one operand of a direction splits: `n` values as [outer, ch, inner]
 * along its summed axis `ch`. */
struct x3_axis {
    int64_t outer, ch, inner;
};

/* An operand's split copies into `dst` (x3_operand_bytes): hi alone,
 * then the two small copies after it, `lo2` their pattern, in one pass
 * over the operand. part[p] gets part p's copies. */
static gp_status x3_operand(const struct gp_cuda_ctx *c, char *dst, const void *src, struct x3_axis ax,
                            unsigned lo2, const void **part, struct gp_error *err)
{
    char *small = dst + align_up(sizeof(float) * (size_t)(ax.outer * ax.ch * ax.inner));
    part[0] = dst;
    part[1] = small;
    return x3_split(c, (float *)small, (float *)dst, src, ax.outer, ax.ch, ax.inner, 2, lo2, err);
}

/* An operand's two copies as whole blocks of the batch (x3_blocks_bytes),
 * `lo2` their pattern: part[1] both, part[0] hi's block. */
static gp_status x3_operand_blocks(const struct gp_cuda_ctx *c, char *dst, const void *src, int64_t n,
                                   unsigned lo2, const void **part, struct gp_error *err)
{
    cudaError_t e = gp_cuda_conv_x3_split_blocks(c->stream, (float *)dst, (const float *)src, n, lo2);
    if (e != cudaSuccess)
        return gp_cuda_error(c, err, GP_ERR_DEVICE, "3xTF32 operand split: %s", cudaGetErrorString(e));
    part[1] = dst;
    part[0] = (const float *)dst + (lo2 & 1u ? n : 0); /* copy 0 lo: hi is block 1 */
    return GP_OK;
}

/* Direction k's operands (forward: image and filter; data: columns and
 * filter; filter: image and columns) split into the region: a[p], b[p]
 * what part p convolves. */
static gp_status x3_operands(const struct gp_cuda_ctx *c, struct conv_run *r, int k, const void *a0,
                             const void *b0, const void **a, const void **b, struct gp_error *err)
{
    const struct conv_geom *g = &r->g;
    int64_t kk = filter_numel(g) / (g->col_ch * g->img_ch);
    /* The summed axis: channels of a channels-last tensor are its last
     * axis; W's output channels are its first. */
    struct x3_axis img_ax = g->nhwc ? (struct x3_axis){g->n * g->img_size, g->img_ch, 1}
                                    : (struct x3_axis){g->n, g->img_ch, g->img_size};
    struct x3_axis col_ax = g->nhwc ? (struct x3_axis){g->n * g->col_size, g->col_ch, 1}
                                    : (struct x3_axis){g->n, g->col_ch, g->col_size};
    struct x3_axis w_in = g->nhwc ? (struct x3_axis){g->col_ch * kk, g->img_ch, 1}
                                  : (struct x3_axis){g->col_ch, g->img_ch, kk};
    struct x3_axis w_out = {1, g->col_ch, g->img_ch * kk};
    struct x3_axis img_n = {1, g->n, g->img_ch * g->img_size}, col_n = {1, g->n, g->col_ch * g->col_size};
    struct x3_axis ax_a = k == 0 ? img_ax : k == 1 ? col_ax : img_n;
    struct x3_axis ax_b = k == 0 ? w_in : k == 1 ? w_out : col_n;
    int64_t n_img = img_n.ch * img_n.inner, n_col = col_n.ch * col_n.inner;
    if (k == 2 && x3_blocks_apply(n_img, n_col)) { /* a ConvTranspose's (a Conv's: x3_filter_run) */
        /* Sample j of one block meets sample j of the other's: (lo, hi) . (hi, lo). */
        GP_TRY(x3_operand_blocks(c, r->x3buf, a0, n_img, CONV_X3_LO_HI, a, err));
        GP_TRY(x3_operand_blocks(c, r->x3buf + x3_blocks_bytes(n_img), b0, n_col, CONV_X3_HI_LO, b, err));
        __atomic_add_fetch(&x3_calls, 1, __ATOMIC_RELAXED);
        return GP_OK;
    }
    char *first = r->x3buf;
    char *second = r->x3buf + x3_operand_bytes(ax_a.outer * ax_a.ch * ax_a.inner);
    /* Copy j of one operand meets copy j of the other: hi . hi, then
     * (lo, hi) . (hi, lo), the small products. */
    GP_TRY(x3_operand(c, first, a0, ax_a, CONV_X3_LO_HI, a, err));
    GP_TRY(x3_operand(c, second, b0, ax_b, CONV_X3_HI_LO, b, err));
    r->x3_dy = k == 1 && !g->transpose ? a0 : NULL;
    __atomic_add_fetch(&x3_calls, 1, __ATOMIC_RELAXED);
    return GP_OK;
}

/* out = direction k's convolution of (a, b) (+ out when beta is 1): part
 * p's TF32 problem in 3xTF32, else the node's own. a, b as x3_operands
 * names them. */
static gp_status dir_call(const struct gp_cuda_ctx *c, struct conv_run *r, int k, int p, const void *a,
                          const void *b, void *out, float beta, struct gp_error *err)
{
    const struct algo_choice *ch = &r->cc.ch[p];
    const struct conv_geom *g = r->x3 ? &r->g3[p][k] : &r->g;
    const struct descs *d = r->x3 ? &r->d3[p][k] : &r->d;
    struct conv_mode mode = r->x3 ? x3_mode(r->mode) : r->mode;
    cudnnHandle_t h = (cudnnHandle_t)c->cudnn;
    float one = 1.0f;
    /* Added into out on the legacy API, or by the graph API's engine
     * itself, where that measured faster than the graph API's buffer and
     * add (algo_choice.acc_legacy, graph_acc). */
    bool acc_legacy = beta != 0.0f && ch->acc_legacy[k];
    if (beta != 0.0f && ch->graph_acc[k][0]) return run_graph_beta(c, r, g, mode, k, ch->graph_acc[k], a, b, out, err);
    if (k == 0) {
        if (ch->graph_fwd[0] && !acc_legacy)
            return run_graph(c, r, g, mode, CONV_GRAPH_FPROP, ch->graph_fwd, a, b, out,
                             r->g.n * r->g.col_ch * r->g.col_size, beta, err);
        GP_TRY(dnn_call(c, err, cudnnSetConvolutionMathType(d->conv, ch->m_fwd), "cudnnSetConvolutionMathType"));
        return dnn_call(c, err,
                        cudnnConvolutionForward(h, &one, d->img, a, d->w, b, d->conv, ch->fwd, r->ws,
                                                acc_legacy ? ch->ws_acc[0] : ch->ws_fwd, &beta, d->col, out),
                        "cudnnConvolutionForward");
    }
    if (k == 1) {
        if (ch->graph_data[0] && !acc_legacy)
            return run_graph(c, r, g, mode, CONV_GRAPH_DGRAD, ch->graph_data, a, b, out,
                             r->g.n * r->g.img_ch * r->g.imgb_size, beta, err);
        GP_TRY(dnn_call(c, err, cudnnSetConvolutionMathType(d->conv, ch->m_data), "cudnnSetConvolutionMathType"));
        return dnn_call(c, err,
                        cudnnConvolutionBackwardData(h, &one, d->w, b, d->col, a, d->conv, ch->bwd_data, r->ws,
                                                     acc_legacy ? ch->ws_acc[1] : ch->ws_data, &beta, d->img, out),
                        "cudnnConvolutionBackwardData");
    }
    if (ch->graph_filter[0] && !acc_legacy)
        return run_graph(c, r, g, mode, CONV_GRAPH_WGRAD, ch->graph_filter, a, b, out, filter_numel(&r->g), beta,
                         err);
    GP_TRY(dnn_call(c, err, cudnnSetConvolutionMathType(d->conv, ch->m_filter), "cudnnSetConvolutionMathType"));
    return dnn_call(c, err,
                    cudnnConvolutionBackwardFilter(h, &one, d->img, a, d->col, b, d->conv, ch->bwd_filter, r->ws,
                                                   acc_legacy ? ch->ws_acc[2] : ch->ws_filter, &beta, d->w, out),
                    "cudnnConvolutionBackwardFilter");
}

/* A Conv's filter gradient in 3xTF32 (conv_x3.h): out (+ out when beta is
 * 1) = hi hi + (lo hi + hi lo) of X (img) and dY (col), from dY's split
 * along its channels that the data gradient left at the start of the
 * region (or made here, the same way), X split in one pass into hi and
 * lo, two calls writing their parts whole and a sum. */
static gp_status x3_filter_run(const struct gp_cuda_ctx *c, struct conv_run *r, const void *img, const void *col,
                               void *out, float beta, struct gp_error *err)
{
    const struct conv_geom *g = &r->g;
    int64_t n_img = g->n * g->img_ch * g->img_size, n_col = g->n * g->col_ch * g->col_size;
    int64_t n_w = filter_numel(g);
    const void *dy[2]; /* hi; (lo, hi) along the channels */
    if (r->x3_dy == col) {
        dy[0] = r->x3buf;
        dy[1] = r->x3buf + align_up(sizeof(float) * (size_t)n_col);
    } else {
        struct x3_axis col_ax = g->nhwc ? (struct x3_axis){g->n * g->col_size, g->col_ch, 1}
                                        : (struct x3_axis){g->n, g->col_ch, g->col_size};
        GP_TRY(x3_operand(c, r->x3buf, col, col_ax, CONV_X3_LO_HI, dy, err));
    }
    char *x_hi = r->x3buf + x3_operand_bytes(n_col);
    char *x_lo = x_hi + align_up(sizeof(float) * (size_t)n_img);
    float *pa = (float *)(x_lo + align_up(sizeof(float) * (size_t)n_img)); /* [2M, R] */
    float *pb = (float *)((char *)pa + align_up(2 * sizeof(float) * (size_t)n_w)); /* [M, R] */
    GP_TRY(x3_split(c, (float *)x_lo, (float *)x_hi, img, 1, n_img, 1, 1, 1u, err)); /* copy 0 lo, hi apart */
    GP_TRY(dir_call(c, r, 2, 1, x_hi, dy[1], pa, 0.0f, err)); /* lo hi, hi hi: part 1's doubled channels */
    GP_TRY(dir_call(c, r, 2, 0, x_lo, dy[0], pb, 0.0f, err)); /* hi lo: the node's own problem */
    cudaError_t e = gp_cuda_conv_x3_filter_sum(c->stream, (float *)out, pa, pb, g->col_ch, n_w / g->col_ch,
                                               beta != 0.0f);
    if (e != cudaSuccess)
        return gp_cuda_error(c, err, GP_ERR_DEVICE, "3xTF32 filter gradient's sum: %s", cudaGetErrorString(e));
    __atomic_add_fetch(&x3_calls, 1, __ATOMIC_RELAXED);
    return GP_OK;
}

/* Direction k into out (+ out when beta is 1): one call, or in 3xTF32 on
 * the split operands, each part's call after the first adding to out. */
static gp_status run_dir(const struct gp_cuda_ctx *c, struct conv_run *r, int k, const void *a, const void *b,
                         void *out, float beta, struct gp_error *err)
{
    if (!r->x3) return dir_call(c, r, k, 0, a, b, out, beta, err);
    if (k == 2 && !r->g.transpose) return x3_filter_run(c, r, a, b, out, beta, err);
    const void *pa[2] = {NULL, NULL}, *pb[2] = {NULL, NULL};
    GP_TRY(x3_operands(c, r, k, a, b, pa, pb, err));
    for (int p = 0; p < r->cc.parts; p++) GP_TRY(dir_call(c, r, k, p, pa[p], pb[p], out, p ? 1.0f : beta, err));
    return GP_OK;
}

/* col = conv(img, W) (+ col when beta is 1). */
static gp_status run_forward(const struct gp_cuda_ctx *c, struct conv_run *r, const void *img,
                             const void *w, void *col, float beta, struct gp_error *err)
{
    return run_dir(c, r, 0, img, w, col, beta, err);
}

/* img = the data gradient of col through W (+ img when beta is 1). */
static gp_status run_data(const struct gp_cuda_ctx *c, struct conv_run *r, const void *w,
                          const void *col, void *img, float beta, struct gp_error *err)
{
    return run_dir(c, r, 1, col, w, img, beta, err);
}

/* dw = the filter gradient of (img, col) (+ dw when beta is 1), dw in the
 * filter's storage. */
static gp_status run_filter_call(const struct gp_cuda_ctx *c, struct conv_run *r, const void *img,
                                 const void *col, void *dw, float beta, struct gp_error *err)
{
    return run_dir(c, r, 2, img, col, dw, beta, err);
}

/* dW (c->din[1]) += the filter gradient of (img, col): directly when dW
 * has the filter's storage; a float32 dW of a bfloat16 convolution through
 * the bfloat16 buffer (overwritten, then added in float32). */
static gp_status run_filter(const struct gp_cuda_ctx *c, struct conv_run *r, const void *img,
                            const void *col, struct gp_error *err)
{
    void *dw = c->din[1];
    if (!r->mode.bf16 || gp_cuda_is_bf16(c->din_dt, 1)) return run_filter_call(c, r, img, col, dw, 1.0f, err);
    GP_TRY(run_filter_call(c, r, img, col, r->dwbuf, 0.0f, err));
    int64_t n = filter_numel(&r->g);
    add_bf16_kernel<<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, c->stream>>>((float *)dw, r->dwbuf, n);
    return gp_cuda_check_launch(c, "weight gradient from its bfloat16 buffer", err);
}

/* ---- Conv, channels-last ----
 * cuDNN convolves channels-last image, columns and filter (conv_geom.nhwc).
 * What does not lie so goes through a buffer: X or Y in [N, C, H, W]
 * (where the model's graph input meets the first convolution), and W and
 * dW, which stay [M, C/g, k...] for the optimizer and the saved model,
 * whenever the kernel is larger than 1x1, and X and W of a padded call
 * (conv_padded: X [N, H, W, 8] and W [M, k..., 8], or 4 channels, with
 * zero channels past the tensors', dX and dW without them). The executor
 * may hold W channels-last itself, made once per step (in_nhwc bit 1:
 * pipeline/plan.h's filter copies): then W is read as it lies, and dW
 * goes through its buffer, or, where the executor holds a channels-last
 * copy of the gradient too (held_grad_nhwc), is added into it as it lies.
 * The bias runs along the last axis. */

static enum gp_dtype conv_dt(const struct conv_run *r) { return r->mode.bf16 ? GP_DTYPE_BFLOAT16 : GP_DTYPE_FLOAT32; }

static int64_t kernel_cells(const struct conv_geom *g) { return g->k[0] * g->k[1]; }

/* dst (channels-last when to_cl) from src, in the convolution's storage:
 * a tensor [n, ch, cells]. */
static gp_status relaid(const struct gp_cuda_ctx *c, const struct conv_run *r, void *dst, const void *src,
                        bool to_cl, int64_t n, int64_t ch, int64_t cells, struct gp_error *err)
{
    return gp_cuda_relayout(c->stream, dst, conv_dt(r), to_cl, src, conv_dt(r), !to_cl, n, ch, cells, false, err);
}

/* The channels of X (and W's second axis) as the tensors have them; the
 * run convolves img_ch, more when padded. */
static int64_t data_ch(const struct conv_geom *g) { return conv_padded(g) ? g->c : g->img_ch; }

/* The filter as cuDNN reads it: W itself for 1x1 kernels, else [M, k..., C/g] in the buffer
 * (zero channels past W's when padded). */
static gp_status nhwc_filter(const struct gp_cuda_ctx *c, const struct conv_run *r, const void **w,
                             struct gp_error *err)
{
    const struct conv_geom *g = &r->g;
    *w = c->in[1];
    if (!r->wt) return GP_OK;
    if (conv_padded(g))
        GP_TRY(gp_cuda_relayout_channels(c->stream, r->wt, conv_dt(r), true, g->img_ch, c->in[1], conv_dt(r), false,
                                         data_ch(g), g->col_ch, kernel_cells(g), false, err));
    else
        GP_TRY(relaid(c, r, r->wt, c->in[1], true, g->col_ch, g->img_ch / g->group, kernel_cells(g), err));
    *w = r->wt;
    return GP_OK;
}

/* X in the run's layout (conv_geom.nhwc): itself, or relaid into its
 * buffer (with its zero channels when padded). */
static gp_status run_image(const struct gp_cuda_ctx *c, const struct conv_run *r, const void **x,
                           struct gp_error *err)
{
    const struct conv_geom *g = &r->g;
    *x = c->in[0];
    if (!image_relaid(g, r->x_cl)) return GP_OK;
    if (conv_padded(g))
        GP_TRY(gp_cuda_relayout_channels(c->stream, r->xt, conv_dt(r), true, g->img_ch, c->in[0], conv_dt(r),
                                         r->x_cl, data_ch(g), g->n, g->img_size, false, err));
    else
        GP_TRY(relaid(c, r, r->xt, c->in[0], g->nhwc, g->n, g->img_ch, g->img_size, err));
    *x = r->xt;
    return GP_OK;
}

#define BIAS_NHWC_ROWS 32

/* dB [ch] += dY [rows, ch] summed over the rows: per block 32 channels x
 * BIAS_NHWC_ROWS row lanes, each lane summing its rows in double (lane
 * l takes rows l, l + ROWS, ...), then the lanes in a fixed tree. Reads
 * stay along the channels. */
template <typename TB, typename TD>
__global__ static void bias_grad_nhwc_kernel(TB *db, const TD *dy, int64_t rows, int64_t ch)
{
    __shared__ double part[BIAS_NHWC_ROWS][33];
    int64_t c0 = (int64_t)blockIdx.x * 32 + threadIdx.x;
    double s = 0;
    if (c0 < ch)
        for (int64_t r = threadIdx.y; r < rows; r += BIAS_NHWC_ROWS) s += (double)gp_load(dy + r * ch + c0);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    for (int half = BIAS_NHWC_ROWS / 2; half > 0; half /= 2) {
        if ((int)threadIdx.y < half) part[threadIdx.y][threadIdx.x] += part[threadIdx.y + half][threadIdx.x];
        __syncthreads();
    }
    if (threadIdx.y == 0 && c0 < ch) gp_store(db + c0, __fadd_rn(gp_load(db + c0), (float)part[0][threadIdx.x]));
}

template <typename TB, typename TD>
static void bias_grad_nhwc(const struct gp_cuda_ctx *c, void *db, const void *dy, int64_t rows, int64_t ch)
{
    bias_grad_nhwc_kernel<TB, TD><<<(unsigned)((ch + 31) / 32), dim3(32, BIAS_NHWC_ROWS), 0, c->stream>>>(
        (TB *)db, (const TD *)dy, rows, ch);
}

static gp_status launch_bias_grad_nhwc(const struct gp_cuda_ctx *c, void *db, bool db_bf16, const void *dy,
                                       bool dy_bf16, int64_t rows, int64_t ch, struct gp_error *err)
{
    if (!db || ch == 0) return GP_OK;
    if (db_bf16 && dy_bf16) bias_grad_nhwc<bf16_t, bf16_t>(c, db, dy, rows, ch);
    else if (db_bf16) bias_grad_nhwc<bf16_t, float>(c, db, dy, rows, ch);
    else if (dy_bf16) bias_grad_nhwc<float, bf16_t>(c, db, dy, rows, ch);
    else bias_grad_nhwc<float, float>(c, db, dy, rows, ch);
    return gp_cuda_check_launch(c, "bias gradient", err);
}

/* A call with channels-last X or Y: the convolution runs in the
 * geometry's layout (conv_geom.nhwc), and each of X and Y that lies
 * otherwise goes through its buffer. */
static gp_status conv_nhwc_forward_run(struct gp_cuda_ctx *c, struct conv_run *r, struct gp_error *err)
{
    const struct conv_geom *g = &r->g;
    const void *x, *w = c->in[1];
    GP_TRY(run_image(c, r, &x, err));
    if (g->nhwc) GP_TRY(nhwc_filter(c, r, &w, err));
    void *y = r->y_cl == g->nhwc ? c->out[0] : r->yt;
    GP_TRY(run_forward(c, r, x, w, y, 0.0f, err));
    const void *bias = c->node->n_inputs > 2 ? c->in[2] : NULL;
    bool bias_bf16 = bias && gp_cuda_is_bf16(c->in_dt, 2);
    /* Channel of element e: e % M channels-last ([rows, M, 1]). */
    if (g->nhwc)
        GP_TRY(launch_bias_add(c, r->mode.bf16, y, bias, bias_bf16, g->n * g->col_size, g->m, 1, err));
    else
        GP_TRY(launch_bias_add(c, r->mode.bf16, y, bias, bias_bf16, g->n, g->m, g->col_size, err));
    if (y == c->out[0]) return GP_OK;
    return relaid(c, r, c->out[0], r->yt, r->y_cl, g->n, g->col_ch, g->col_size, err);
}

static gp_status conv_nhwc_backward_run(struct gp_cuda_ctx *c, struct conv_run *r, struct gp_error *err)
{
    const struct conv_geom *g = &r->g;
    void *dx = c->din[0], *dw = c->din[1], *db = c->node->n_inputs > 2 ? c->din[2] : NULL;
    const void *dy = c->dout[0], *w = c->in[1];
    if (r->y_cl != g->nhwc) {
        GP_TRY(relaid(c, r, r->yt, c->dout[0], g->nhwc, g->n, g->col_ch, g->col_size, err));
        dy = r->yt;
    }
    bool add = !gp_cuda_overwrite(c, 0);
    if (dx) {
        if (g->nhwc) GP_TRY(nhwc_filter(c, r, &w, err));
        if (!image_relaid(g, r->x_cl)) {
            GP_TRY(run_data(c, r, w, dy, dx, add ? 1.0f : 0.0f, err));
        } else { /* into X's buffer, then added (or written) in X's layout and channels */
            GP_TRY(run_data(c, r, w, dy, r->xt, 0.0f, err));
            enum gp_dtype dxt = gp_cuda_is_bf16(c->din_dt, 0) ? GP_DTYPE_BFLOAT16 : GP_DTYPE_FLOAT32;
            if (conv_padded(g))
                GP_TRY(gp_cuda_relayout_channels(c->stream, dx, dxt, r->x_cl, data_ch(g), r->xt, conv_dt(r), true,
                                                 g->img_ch, g->n, g->img_size, add, err));
            else
                GP_TRY(gp_cuda_relayout(c->stream, dx, dxt, r->x_cl, r->xt, conv_dt(r), g->nhwc, g->n, g->img_ch,
                                        g->img_size, add, err));
        }
    }
    if (dw) {
        const void *x;
        GP_TRY(run_image(c, r, &x, err)); /* after dX: the same buffer */
        if (!r->dwt || r->dw_cl) {
            GP_TRY(run_filter(c, r, x, dy, err));
        } else { /* [M, k..., C/g] in its buffer, then added to dW's [M, C/g, k...] */
            GP_TRY(run_filter_call(c, r, x, dy, r->dwt, 0.0f, err));
            enum gp_dtype dwt = gp_cuda_is_bf16(c->din_dt, 1) ? GP_DTYPE_BFLOAT16 : GP_DTYPE_FLOAT32;
            if (conv_padded(g))
                GP_TRY(gp_cuda_relayout_channels(c->stream, dw, dwt, false, data_ch(g), r->dwt, conv_dt(r), true,
                                                 g->img_ch, g->col_ch, kernel_cells(g), true, err));
            else
                GP_TRY(gp_cuda_relayout(c->stream, dw, dwt, false, r->dwt, conv_dt(r), true, g->col_ch,
                                        g->img_ch / g->group, kernel_cells(g), true, err));
        }
    }
    bool db_bf16 = db && gp_cuda_is_bf16(c->din_dt, 2);
    if (g->nhwc) return launch_bias_grad_nhwc(c, db, db_bf16, dy, r->mode.bf16, g->n * g->col_size, g->m, err);
    return launch_bias_grad(c, db, db_bf16, dy, r->mode.bf16, g->n, g->m, g->col_size, err);
}

/* The executor's question (gp_cuda_kernel.layout_native): a Conv over 2
 * axes with cuDNN's own padding reads channels-last X and Y, either or
 * both; and W channels-last ([M, k..., C/g], the executor's copy:
 * gp_layer_call.held_nhwc; dW [M, C/g, k...] or, held_grad_nhwc, as W
 * lies) when X or Y is and the run is channels-last with its channels
 * as they are, in either precision (a padded filter has zero channels W
 * lacks). */
static bool conv_layout_native(const struct gp_graph *g, const struct gp_node *node, uint32_t in_nhwc,
                               uint32_t out_nhwc, bool backward)
{
    (void)backward;
    if ((in_nhwc & ~3u) || (out_nhwc & ~1u)) return false; /* only X, W and Y can be */
    struct conv_geom geom, b16;
    struct gp_error err;
    memset(&err, 0, sizeof err);
    if (conv_geom_init(g, node, false, true, false, &geom, &err) != GP_OK || !geom.relayable) return false;
    if (!(in_nhwc & 2u)) return true;
    if (!((in_nhwc | out_nhwc) & 1u)) return false;
    /* Channels-last runs only on whole channel runs per group (conv_geom.nhwc:
     * not depthwise or odd channel counts, which the layout pass tags
     * channels-last all the same), in both precisions. */
    return geom.nhwc && !conv_padded(&geom) && conv_geom_init(g, node, false, true, true, &b16, &err) == GP_OK &&
           b16.nhwc && !conv_padded(&b16);
}

/* ---- Conv ---- */

static gp_status conv_forward_run(struct gp_cuda_ctx *c, struct conv_run *r, struct gp_error *err)
{
    if (r->x_cl || r->y_cl) return conv_nhwc_forward_run(c, r, err);
    bool b16 = r->mode.bf16;
    const void *x = c->in[0], *w = c->in[1];
    const void *bias = c->node->n_inputs > 2 ? c->in[2] : NULL;
    void *y = c->out[0];
    const void *img = x;
    if (!r->g.direct) {
        GP_TRY(launch_gather(c, &r->g, b16, x, r->buf, err));
        img = r->buf;
    }
    GP_TRY(run_forward(c, r, img, w, y, 0.0f, err));
    return launch_bias_add(c, b16, y, bias, bias && gp_cuda_is_bf16(c->in_dt, 2), r->g.n, r->g.m,
                           r->g.col_size, err);
}

static gp_status conv_backward_run(struct gp_cuda_ctx *c, struct conv_run *r, struct gp_error *err)
{
    if (r->x_cl || r->y_cl) return conv_nhwc_backward_run(c, r, err);
    bool b16 = r->mode.bf16;
    const void *x = c->in[0], *w = c->in[1], *dy = c->dout[0];
    void *dx = c->din[0], *dw = c->din[1], *db = c->node->n_inputs > 2 ? c->din[2] : NULL;
    /* dX added into (beta 1), or written whole where it is not cleared
     * (its first writer: beta 0, no accumulation buffer on the graph API). */
    bool add = !gp_cuda_overwrite(c, 0);
    if (dx) {
        if (r->g.direct) {
            GP_TRY(run_data(c, r, w, dy, dx, add ? 1.0f : 0.0f, err));
        } else {
            GP_TRY(run_data(c, r, w, dy, r->buf, 0.0f, err));
            GP_TRY(launch_place(c, &r->g, b16, r->buf, dx, NULL, false, add, err));
        }
    }
    if (dw) {
        const void *img = x;
        if (!r->g.direct) {
            GP_TRY(launch_gather(c, &r->g, b16, x, r->buf, err));
            img = r->buf;
        }
        GP_TRY(run_filter(c, r, img, dy, err));
    }
    return launch_bias_grad(c, db, db && gp_cuda_is_bf16(c->din_dt, 2), dy, b16, r->g.n, r->g.m,
                            r->g.col_size, err);
}

/* ---- ConvTranspose ---- */

static gp_status convt_forward_run(struct gp_cuda_ctx *c, struct conv_run *r, struct gp_error *err)
{
    bool b16 = r->mode.bf16;
    const void *x = c->in[0], *w = c->in[1];
    const void *bias = c->node->n_inputs > 2 ? c->in[2] : NULL;
    bool bias_b16 = bias && gp_cuda_is_bf16(c->in_dt, 2);
    void *y = c->out[0];
    if (r->g.direct) {
        GP_TRY(run_data(c, r, w, x, y, 0.0f, err));
        return launch_bias_add(c, b16, y, bias, bias_b16, r->g.n, r->g.m, r->g.img_size, err);
    }
    GP_TRY(run_data(c, r, w, x, r->buf, 0.0f, err));
    return launch_place(c, &r->g, b16, r->buf, y, bias, bias_b16, false, err);
}

static gp_status convt_backward_run(struct gp_cuda_ctx *c, struct conv_run *r, struct gp_error *err)
{
    bool b16 = r->mode.bf16;
    const void *x = c->in[0], *w = c->in[1], *dy = c->dout[0];
    void *dx = c->din[0], *dw = c->din[1], *db = c->node->n_inputs > 2 ? c->din[2] : NULL;
    if (dx || dw) {
        const void *img = dy;
        if (!r->g.direct) {
            GP_TRY(launch_gather(c, &r->g, b16, dy, r->buf, err));
            img = r->buf;
        }
        if (dx) GP_TRY(run_forward(c, r, img, w, dx, gp_cuda_overwrite(c, 0) ? 0.0f : 1.0f, err));
        if (dw) GP_TRY(run_filter(c, r, img, x, err));
    }
    return launch_bias_grad(c, db, db && gp_cuda_is_bf16(c->din_dt, 2), dy, b16, r->g.n, r->g.m,
                            r->g.img_size, err);
}

/* ---- entry points ---- */

typedef gp_status (*run_fn)(struct gp_cuda_ctx *, struct conv_run *, struct gp_error *);

/* No incoming gradient: nothing to add, but a dX that is not cleared (its
 * first writer) gets its zeros. */
static gp_status no_gradient(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->din[0] || !gp_cuda_overwrite(c, 0)) return GP_OK;
    size_t n = (size_t)gp_shape_numel(&gp_node_input(c->graph, c->node, 0)->shape);
    return gp_cuda_call(c, cudaMemsetAsync(c->din[0], 0, n * (gp_cuda_is_bf16(c->din_dt, 0) ? 2 : 4), c->stream),
                        "cudaMemsetAsync", err);
}

static gp_status with_run(struct gp_cuda_ctx *c, bool transpose, bool backward, run_fn fn,
                          struct gp_error *err)
{
    struct conv_geom g;
    GP_TRY(conv_geom_init(c->graph, c->node, transpose, false, false, &g, err));
    if (g.n == 0 || g.img_ch == 0 || g.col_ch == 0 || g.img_size == 0 || g.col_size == 0)
        return backward ? no_gradient(c, err) : GP_OK; /* an empty tensor: nothing for cuDNN to do */
    struct conv_run r;
    gp_status st = run_begin(c, transpose, backward, &r, err);
    if (st == GP_OK) st = fn(c, &r, err);
    conv_descs_destroy(&r.d);
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < 3; k++) conv_descs_destroy(&r.d3[p][k]);
    return st;
}

static gp_status conv_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    return with_run(c, false, false, conv_forward_run, err);
}

static gp_status conv_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->dout[0]) return no_gradient(c, err);
    return with_run(c, false, true, conv_backward_run, err);
}

static gp_status conv_transpose_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    return with_run(c, true, false, convt_forward_run, err);
}

static gp_status conv_transpose_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->dout[0]) return no_gradient(c, err);
    return with_run(c, true, true, convt_backward_run, err);
}

extern "C" bool gp_cuda_conv_backward_staged(void)
{
    static const char *const ways[] = {"native", "staged", NULL};
    return gp_env_choice("GP_CONV_BF16_BACKWARD", ways, 0) == 1;
}

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_conv[] = {
    /* bfloat16 forward and backward in cuDNN; with GP_CONV_BF16_BACKWARD=
     * staged the backward on float32 copies with TF32 (exact products of
     * bfloat16 values, float32 sums), which was faster while cuDNN's
     * workspace was capped at 256 MiB (conv_problem.cuh). */
    {"Conv", NULL, conv_scratch, conv_forward, conv_backward, true, false, true, gp_cuda_overwrites_input0,
     conv_layout_native},
    {"ConvTranspose", NULL, conv_transpose_scratch, conv_transpose_forward, conv_transpose_backward, true, false,
     true, gp_cuda_overwrites_input0},
    {NULL, NULL, NULL, NULL, NULL, false},
};

extern "C" size_t gp_cuda_conv_scratch_bytes(const struct gp_graph *g, const struct gp_node *node,
                                             const struct gp_compute_options *opts, uint32_t din)
{
    const struct gp_cuda_kernel *k = gp_cuda_kernel_for(node);
    if (!k) return 0;
    bool transpose = k->forward == conv_transpose_forward;
    if (!strcmp(node->op_type, "Attention")) return gp_cuda_attention_scratch_bytes(g, node, opts);
    if (k->forward != conv_forward && !transpose) return k->scratch_bytes ? k->scratch_bytes(g, node) : 0;
    struct conv_geom geom;
    struct gp_error err;
    memset(&err, 0, sizeof err);
    /* Channels-last as the graph's tags say (the executor's layout_native
     * call gives the kernel those). */
    bool x_cl = !transpose && gp_node_input(g, node, 0)->channels_last;
    bool y_cl = !transpose && gp_node_output(g, node, 0)->channels_last;
    if (conv_geom_init(g, node, transpose, x_cl || y_cl, options_mode(opts).bf16, &geom, &err) != GP_OK)
        return 0; /* the run reports it */
    size_t ws = nhwc_bytes(&geom, options_mode(opts).bf16, x_cl, y_cl) + mode_scratch(&geom, options_mode(opts), din);
    if (opts->precision == GP_PRECISION_BF16 && (din & GP_SCRATCH_FLOAT_CALL)) {
        /* A call on float32 tensors (mixed types, staged on float32
         * copies, and with GP_CONV_BF16_BACKWARD=staged every backward)
         * runs with TF32 (ctx_mode of a bf16 stage's float32 call); the
         * planner says whether the layer makes one. */
        struct conv_mode staged = {false, true, opts->fast_conv};
        struct conv_geom flat; /* staged calls get [N, C, H, W] copies */
        if (conv_geom_init(g, node, transpose, false, false, &flat, &err) != GP_OK) return ws;
        size_t s = mode_scratch(&flat, staged, din);
        if (s > ws) ws = s;
    }
    return ws;
}
