/* CUDA conv family: the choice of cuDNN's algorithms for a convolution
 * problem (conv_problem.cuh), and the descriptors it is made with.
 *
 * Algorithms: chosen once per geometry and mode (with GP_CONV_API=graph
 * the graph API's configuration first, conv_graph.h), by cuDNN's measurements
 * (cudnnFind*Algorithm, as PyTorch's cudnn.benchmark does; its heuristics,
 * cudnnGet*Algorithm_v7, where measuring fails): the fastest result that
 * succeeds with a workspace of at most conv_ws_cap, deterministic and (in
 * float32 without TF32) free of FFT and Winograd if there is one; with
 * ctx->fast_conv, the fastest that runs. The math is FMA (float32
 * semantics) for float32, TF32 tensor cores when ctx->tf32, and tensor
 * cores for bfloat16. Choices live in a process-wide table under a mutex,
 * keyed by the whole cuDNN problem and the mode (storage, TF32, fast_conv);
 * gp_cuda_conv_scratch_bytes makes them for the stage's options (with a
 * handle of its own) so the executor plans the workspace, and forward and
 * backward find the same choice there. */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>
#include <cudnn.h>

#include "backend/cuda/conv_measure.h"
#include "backend/cuda/conv_problem.cuh"
#include "backend/cuda/device.h"
#include "util/env.h"

#define MAX_PERF 32 /* results asked of cuDNN's heuristics */

const char *conv_math_name(struct conv_mode m)
{
    return m.bf16 ? "bfloat16 tensor-op" : m.tf32 ? "TF32" : "FMA";
}

/* ---- cuDNN descriptors ---- */

#define DNN_TRY(e, fn, ...)                                                                  \
    do {                                                                                     \
        cudnnStatus_t st_ = fn(__VA_ARGS__);                                                 \
        if (st_ != CUDNN_STATUS_SUCCESS) {                                                   \
            (e)->st = st_;                                                                   \
            (e)->call = #fn;                                                                 \
            return false;                                                                    \
        }                                                                                    \
    } while (0)

void conv_descs_destroy(struct descs *d)
{
    if (d->img) cudnnDestroyTensorDescriptor(d->img);
    if (d->col) cudnnDestroyTensorDescriptor(d->col);
    if (d->w) cudnnDestroyFilterDescriptor(d->w);
    if (d->conv) cudnnDestroyConvolutionDescriptor(d->conv);
    memset(d, 0, sizeof *d);
}

static bool set_tensor(cudnnTensorDescriptor_t t, cudnnDataType_t dt, int nd, int64_t n, int64_t ch,
                       const int64_t *sp, bool nhwc, struct dnn_err *e)
{
    int dims[MAX_AXES + 2], strides[MAX_AXES + 2];
    dims[0] = (int)n;
    dims[1] = (int)ch;
    for (int i = 0; i < nd - 2; i++) dims[i + 2] = (int)sp[i];
    if (nhwc) { /* [n, spatial..., ch] in memory */
        int run = dims[1];
        strides[1] = 1;
        for (int i = nd - 1; i >= 2; i--) {
            strides[i] = run;
            run *= dims[i];
        }
        strides[0] = run;
    } else {
        strides[nd - 1] = 1;
        for (int i = nd - 2; i >= 0; i--) strides[i] = strides[i + 1] * dims[i + 1];
    }
    DNN_TRY(e, cudnnSetTensorNdDescriptor, t, dt, nd, dims, strides);
    return true;
}

/* The descriptors of the node's problem in storage `bf16` (tensors and
 * filter; the compute type is float32 either way); `math` for the
 * convolution. The columns' shape is checked against cuDNN's own output
 * shape. */
bool conv_descs_create(const struct conv_geom *g, bool bf16, cudnnMathType_t math, struct descs *d,
                         struct dnn_err *e)
{
    memset(d, 0, sizeof *d);
    int nd = g->ns + 2;
    cudnnDataType_t dt = bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    DNN_TRY(e, cudnnCreateTensorDescriptor, &d->img);
    DNN_TRY(e, cudnnCreateTensorDescriptor, &d->col);
    DNN_TRY(e, cudnnCreateFilterDescriptor, &d->w);
    DNN_TRY(e, cudnnCreateConvolutionDescriptor, &d->conv);
    if (!set_tensor(d->img, dt, nd, g->n, g->img_ch, g->imgb, g->nhwc, e)) return false;
    if (!set_tensor(d->col, dt, nd, g->n, g->col_ch, g->col, g->nhwc, e)) return false;
    int wd[MAX_AXES + 2];
    wd[0] = (int)g->col_ch;
    wd[1] = (int)(g->img_ch / g->group);
    for (int i = 0; i < g->ns; i++) wd[i + 2] = (int)g->k[i];
    DNN_TRY(e, cudnnSetFilterNdDescriptor, d->w, dt, g->nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, nd, wd);
    int pad[MAX_AXES], str[MAX_AXES], dil[MAX_AXES];
    for (int i = 0; i < g->ns; i++) {
        pad[i] = (int)g->q[i];
        str[i] = (int)g->s[i];
        dil[i] = (int)g->d[i];
    }
    DNN_TRY(e, cudnnSetConvolutionNdDescriptor, d->conv, g->ns, pad, str, dil,
            CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT);
    DNN_TRY(e, cudnnSetConvolutionGroupCount, d->conv, (int)g->group);
    DNN_TRY(e, cudnnSetConvolutionMathType, d->conv, math);
    int od[MAX_AXES + 2];
    DNN_TRY(e, cudnnGetConvolutionNdForwardOutputDim, d->conv, d->img, d->w, nd, od);
    bool same = od[0] == (int)g->n && od[1] == (int)g->col_ch;
    for (int i = 0; i < g->ns; i++) same = same && od[i + 2] == (int)g->col[i];
    if (!same) {
        e->st = CUDNN_STATUS_BAD_PARAM;
        e->call = "cudnnGetConvolutionNdForwardOutputDim (its output shape is not the node's)";
        return false;
    }
    return true;
}

/* ---- algorithm choice, cached ---- */

struct algo_key {
    int ns, group, bf16, tf32, fastest, transpose, direct, nhwc;
    int dirs; /* 0: all three directions; else the one CONV_DIR_* chosen for */
    int img[MAX_AXES + 2], col[MAX_AXES + 2], w[MAX_AXES + 2];
    int q[MAX_AXES], s[MAX_AXES], d[MAX_AXES];
};

static void algo_key_init(const struct conv_geom *g, struct conv_mode mode, unsigned dirs, struct algo_key *k)
{
    memset(k, 0, sizeof *k); /* padding too: keys compare with memcmp */
    k->dirs = (dirs & CONV_DIRS_ALL) == CONV_DIRS_ALL ? 0 : (int)dirs;
    k->ns = g->ns;
    k->group = (int)g->group;
    k->bf16 = mode.bf16;
    k->tf32 = mode.tf32 ? (mode.x3 ? 2 : 1) : 0; /* 2: 3xTF32's problems, precise algorithms only */
    k->fastest = mode.fast;
    k->transpose = g->transpose;
    k->direct = g->direct;
    k->nhwc = g->nhwc;
    k->img[0] = k->col[0] = (int)g->n;
    k->img[1] = (int)g->img_ch;
    k->col[1] = (int)g->col_ch;
    k->w[0] = (int)g->col_ch;
    k->w[1] = (int)(g->img_ch / g->group);
    for (int i = 0; i < g->ns; i++) {
        k->img[i + 2] = (int)g->imgb[i];
        k->col[i + 2] = (int)g->col[i];
        k->w[i + 2] = (int)g->k[i];
        k->q[i] = (int)g->q[i];
        k->s[i] = (int)g->s[i];
        k->d[i] = (int)g->d[i];
    }
}

size_t conv_ws_cap(const struct conv_geom *g)
{
    double filter = (double)g->col_ch * (double)(g->img_ch / g->group);
    for (int i = 0; i < g->ns; i++) filter *= (double)g->k[i];
    double n = (double)g->n * (double)g->img_ch * (double)g->imgb_size +
               (double)g->n * (double)g->col_ch * (double)g->col_size + filter;
    double bytes = 2.0 * sizeof(float) * n;
    const double lo = (double)((size_t)256 << 20), hi = (double)((size_t)4 << 30);
    return (size_t)(bytes < lo ? lo : bytes > hi ? hi : bytes);
}

/* Tensor cores allowed: TF32 for float32 storage with ctx->tf32, and
 * always for bfloat16 storage, which has no float32 semantics to keep. */
static bool tensor_ops(struct conv_mode m) { return m.tf32 || m.bf16; }

/* Whether the mode promises float32's precision, which FFT and Winograd
 * (precise() below) do not keep: float32 on FMA, and 3xTF32's TF32
 * problems (the split operands are exact in TF32 only as they are; a
 * transform of them is rounded to TF32 again). */
static bool float32_precision(struct conv_mode m) { return !tensor_ops(m) || m.x3; }

/* Whether a result's math type is allowed: without tensor cores only FMA
 * (or the default, which the descriptor's FMA setting then restricts);
 * with them, anything but down-conversion to half precision. */
static bool math_ok(cudnnMathType_t m, struct conv_mode mode)
{
    if (tensor_ops(mode)) return m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    return m == CUDNN_FMA_MATH || m == CUDNN_DEFAULT_MATH;
}

cudnnMathType_t conv_base_math(struct conv_mode m)
{
    return m.bf16 ? CUDNN_TENSOR_OP_MATH : m.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

/* The math type a chosen result runs with. */
static cudnnMathType_t exec_math(cudnnMathType_t m, struct conv_mode mode)
{
    return tensor_ops(mode) ? m : CUDNN_FMA_MATH;
}

/* Algorithms that compute a float32 convolution as float32 arithmetic
 * would. FFT and Winograd transform the problem and lose precision (errors
 * near 1e-4 relative, enough to move weights visibly after a few steps), so
 * without TF32, where the promise is float32 semantics, they are not used. */
static bool precise(cudnnConvolutionFwdAlgo_t a)
{
    return a != CUDNN_CONVOLUTION_FWD_ALGO_FFT && a != CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING &&
           a != CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD && a != CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}

static bool precise(cudnnConvolutionBwdDataAlgo_t a)
{
    return a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT && a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING &&
           a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD &&
           a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}

static bool precise(cudnnConvolutionBwdFilterAlgo_t a)
{
    return a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT && a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING &&
           a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

/* Picks among `n` heuristic results (best first) the first one that
 * succeeds, meets `level` (0: deterministic and precise, 1: precise, 2: any;
 * precision matters only where the promise is float32's: float32_precision),
 * whose math type is allowed and whose workspace (asked of cuDNN for that
 * algorithm and math type) fits `cap`. `ws_of`
 * returns false when cuDNN refuses the algorithm. */
#define PICK_LEVEL(perf, count, mode, cap, level, conv, ws_of, out_algo, out_math, out_ws, out_ms, found) \
    do {                                                                                     \
        found = false;                                                                       \
        for (int i_ = 0; i_ < (count) && !found; i_++) {                                     \
            if ((perf)[i_].status != CUDNN_STATUS_SUCCESS) continue;                         \
            if ((level) < 1 && (perf)[i_].determinism != CUDNN_DETERMINISTIC) continue;      \
            if ((level) < 2 && float32_precision(mode) && !precise((perf)[i_].algo)) continue; \
            if (!math_ok((perf)[i_].mathType, mode)) continue;                               \
            cudnnMathType_t m_ = exec_math((perf)[i_].mathType, mode);                       \
            if (cudnnSetConvolutionMathType(conv, m_) != CUDNN_STATUS_SUCCESS) continue;     \
            size_t ws_ = 0;                                                                  \
            if (!ws_of((perf)[i_].algo, &ws_)) continue;                                     \
            if (ws_ < (perf)[i_].memory) ws_ = (perf)[i_].memory;                            \
            if (ws_ > (cap)) continue;                                                       \
            out_algo = (perf)[i_].algo;                                                      \
            out_math = m_;                                                                   \
            out_ws = ws_;                                                                    \
            out_ms = (perf)[i_].time;                                                        \
            found = true;                                                                    \
        }                                                                                    \
    } while (0)

/* Preference order: deterministic and precise; precise (cuDNN's atomics
 * make the last bits vary run to run); anything that runs. Most shapes stop
 * at the first; the later ones keep a convolution that has no such
 * algorithm training rather than failing. fast_conv starts at the last. */
#define PICK(perf, count, mode, cap, conv, ws_of, out_algo, out_math, out_ws, out_ms, found)      \
    do {                                                                                     \
        found = false;                                                                       \
        int first_ = (mode).fast ? 2 : 0;                                                    \
        for (int level_ = first_; level_ < 3 && !found; level_++)                            \
            PICK_LEVEL(perf, count, mode, cap, level_, conv, ws_of, out_algo, out_math, out_ws, out_ms, found); \
    } while (0)

/* ---- reporting (GP_CONV_VERBOSE) ---- */

/* GP_CONV_VERBOSE=1 prints each choice on stderr, one "conv-choice" line
 * per problem, per candidate cuDNN measured and per direction chosen, so
 * that a slow layer can be traced to its algorithm and compared with what
 * PyTorch runs for the same problem (bench/conv_torch.py reads these). */
bool conv_verbose(void)
{
    return gp_env_flag("GP_CONV_VERBOSE", false);
}

static const char *mode_name(struct conv_mode m)
{
    return m.bf16 ? "bf16" : m.tf32 ? (m.x3 ? "tf32-x3" : "tf32") : "fp32";
}

static void dims_text(char *out, size_t size, const int64_t *v, int n)
{
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < n && len < size; i++)
        len += (size_t)snprintf(out + len, size - len, i ? "x%lld" : "%lld", (long long)v[i]);
}

static void report_problem(const struct conv_geom *g, struct conv_mode mode)
{
    char img[64], col[64], k[32], s[32], q[32], d[32];
    dims_text(img, sizeof img, g->imgb, g->ns);
    dims_text(col, sizeof col, g->col, g->ns);
    dims_text(k, sizeof k, g->k, g->ns);
    dims_text(s, sizeof s, g->s, g->ns);
    dims_text(q, sizeof q, g->q, g->ns);
    dims_text(d, sizeof d, g->d, g->ns);
    fprintf(stderr,
            "conv-choice problem n=%lld img_ch=%lld img=%s col_ch=%lld col=%s k=%s s=%s q=%s d=%s group=%lld "
            "transpose=%d direct=%d mode=%s fast=%d\n",
            (long long)g->n, (long long)g->img_ch, img, (long long)g->col_ch, col, k, s, q, d, (long long)g->group,
            (int)g->transpose, (int)g->direct, mode_name(mode), (int)mode.fast);
}

#define REPORT_PERF(dir, perf, count)                                                                     \
    do {                                                                                                   \
        if (conv_verbose())                                                                                \
            for (int i_ = 0; i_ < (count); i_++)                                                           \
                fprintf(stderr, "conv-choice legacy %s algo=%d status=%d det=%d math=%d ms=%.4f ws=%zu\n", \
                        dir, (int)(perf)[i_].algo, (int)(perf)[i_].status, (int)(perf)[i_].determinism,    \
                        (int)(perf)[i_].mathType, (double)(perf)[i_].time, (size_t)(perf)[i_].memory);     \
    } while (0)

/* ---- the graph API's problems ---- */

bool conv_graph_accumulates(const struct conv_geom *g, enum conv_graph_op op)
{
    switch (op) {
    case CONV_GRAPH_FPROP: return g->transpose;                /* ConvTranspose's dX */
    case CONV_GRAPH_DGRAD: return !g->transpose && g->direct;  /* Conv's dX (else through the image buffer) */
    case CONV_GRAPH_WGRAD: return false;
    }
    return false;
}

/* A bfloat16 result the graph API accumulates is computed in bfloat16 and
 * then added in float32, rounded once more (as PyTorch's autograd adds two
 * bfloat16 gradients), not computed in float32: cuDNN 9.19 has no engine
 * for a bfloat16 data gradient with a float32 output on the H200, so those
 * fell back to the legacy API. GP_CONV_ACCUMULATE=float keeps the float32
 * result (one rounding, as the CPU backend's). */
static bool bf16_accumulation(void)
{
    static const char *const ways[] = {"bf16", "float", NULL};
    return gp_env_choice("GP_CONV_ACCUMULATE", ways, 0) == 0;
}

extern "C" bool gp_cuda_conv_rounds_added_terms(void) { return bf16_accumulation(); }

void conv_graph_problem_of(const struct conv_geom *g, struct conv_mode mode, enum conv_graph_op op,
                           struct conv_graph_problem *p)
{
    memset(p, 0, sizeof *p);
    p->nd = g->ns + 2;
    p->img[0] = p->col[0] = g->n;
    p->img[1] = g->img_ch;
    p->col[1] = g->col_ch;
    p->w[0] = g->col_ch;
    p->w[1] = g->img_ch / g->group;
    for (int i = 0; i < g->ns; i++) {
        p->img[i + 2] = g->imgb[i];
        p->col[i + 2] = g->col[i];
        p->w[i + 2] = g->k[i];
        p->pad[i] = g->q[i];
        p->stride[i] = g->s[i];
        p->dilation[i] = g->d[i];
    }
    p->bf16 = mode.bf16;
    p->tf32 = mode.tf32;
    p->precise = float32_precision(mode);
    p->nondeterministic = mode.fast;
    p->float_out = mode.bf16 && conv_graph_accumulates(g, op) && !bf16_accumulation();
    p->nhwc = g->nhwc;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Which API convolutions run on (GP_CONV_API): "fastest" (the default
 * where the graph API is built in: both measured, per direction the
 * faster), "graph" (the graph API first, the legacy API where it has
 * nothing) or "legacy". */
enum conv_api { API_LEGACY, API_GRAPH, API_FASTEST };

static enum conv_api conv_api(void)
{
#ifdef GP_HAVE_CUDNN_GRAPH
    static const char *const apis[] = {"fastest", "graph", "legacy", NULL};
    static const enum conv_api as[] = {API_FASTEST, API_GRAPH, API_LEGACY};
    return as[gp_env_choice("GP_CONV_API", apis, 0)];
#else
    return API_LEGACY;
#endif
}

/* The graph API's choice of each direction (an empty name where it has
 * none), its workspace and its measured time. */
struct graph_choice {
    char name[3][CONV_GRAPH_NAME];
    size_t ws[3];
    float ms[3];
};

static void choose_graphs(const struct conv_geom *g, struct conv_mode mode, unsigned dirs,
                          struct graph_choice *gc)
{
    memset(gc, 0, sizeof *gc);
    static const enum conv_graph_op ops[3] = {CONV_GRAPH_FPROP, CONV_GRAPH_DGRAD, CONV_GRAPH_WGRAD};
    for (int k = 0; k < 3; k++) {
        if (!(dirs & (1u << k))) continue;
        struct conv_graph_problem p;
        conv_graph_problem_of(g, mode, ops[k], &p);
        char why[256];
        if (!conv_graph_choose(&p, ops[k], conv_ws_cap(g), gc->name[k], CONV_GRAPH_NAME, &gc->ws[k], &gc->ms[k], why,
                               sizeof why))
            gc->name[k][0] = '\0';
    }
}

/* ---- a result added into its output ----
 * cudnn-frontend's graphs have no beta: a result added into its output
 * (beta 1: a Conv's dX that another layer wrote first, as at a residual
 * block's input; a float32 dW, which sums the micro-batches; a 3xTF32
 * call's second part but a Conv's filter gradient's, conv_x3.h) is computed into a
 * buffer and then added, two passes more over the output than the legacy
 * API's own beta = 1. Where the graph API won the plain call, the added
 * call is measured both ways, the legacy algorithm with beta 1 against
 * the graph API's time plus the add's, and the faster kept
 * (algo_choice.acc_legacy). A third way: the graph API's engines adding
 * the result themselves, built through cuDNN's backend descriptors with
 * beta 1 (conv_graph.h, conv_graph_beta_choose; algo_choice.graph_acc).
 * GP_CONV_ADD_API says which ways: unset (or "measured-beta"), all
 * three measured for every added call (the third since 2026-12-06:
 * ResNet-50 on an H100, fp32 1042.7 -> 1119.5 samples/s, tf32 2904.0 ->
 * 2938.9, bench/RESULTS.md); "measured", the first two; "legacy",
 * "graph" or "graph-beta", every added call that way without measuring
 * against the others ("graph-beta" where an engine builds with beta 1,
 * else the graph API's add; the tests run each). */
enum add_policy { ADD_MEASURED, ADD_MEASURED_BETA, ADD_LEGACY, ADD_GRAPH, ADD_GRAPH_BETA };

static const char *const add_ways[] = {"measured-beta", "measured", "legacy", "graph", "graph-beta", NULL};

static enum add_policy add_policy(void)
{
    static const enum add_policy as[] = {ADD_MEASURED_BETA, ADD_MEASURED, ADD_LEGACY, ADD_GRAPH, ADD_GRAPH_BETA};
    return as[gp_env_choice("GP_CONV_ADD_API", add_ways, 0)];
}

extern "C" const char *gp_cuda_conv_add_api(void) { return add_ways[gp_env_choice("GP_CONV_ADD_API", add_ways, 0)]; }

/* Whether direction k of the problem may be called adding into its
 * output: ConvTranspose's dX (the forward direction) and a Conv's dX
 * where another layer wrote them first (conv_graph_accumulates), a
 * float32 dW (a bfloat16 convolution's is computed into a buffer with
 * beta 0), and, in a 3xTF32 part's problem, every direction but a
 * Conv's filter gradient. */
static bool may_add(const struct conv_geom *g, struct conv_mode mode, int k)
{
    /* 3xTF32's second parts add, but for a Conv's filter gradient, whose
     * parts are written whole and summed apart (conv.cu x3_filter_run). */
    if (mode.x3) return k != 2 || g->transpose;
    if (k == 0) return conv_graph_accumulates(g, CONV_GRAPH_FPROP);
    if (k == 1) return conv_graph_accumulates(g, CONV_GRAPH_DGRAD);
    return !mode.bf16;
}

static const char *const dir_names[3] = {"fwd", "data", "filter"};

/* Decides how direction k of a problem whose plain call runs on the graph
 * API (graph_ms, measured into a buffer) adds its result into the output
 * (ch->acc_legacy[k], ch->graph_acc[k], ch->ws_acc[k]): the measured
 * times of the legacy algorithm (ch's, for direction k, whose workspace
 * is legacy_ws) with beta 1, of the graph API's result and an add, and
 * of the graph API's engines with beta 1, as GP_CONV_ADD_API asks; the
 * fastest kept. Descriptors d as the choice's. */
static void choose_accumulation(cudnnHandle_t h, const struct conv_geom *g, struct conv_mode mode,
                                const struct descs *d, int k, float graph_ms, size_t legacy_ws,
                                struct algo_choice *ch)
{
    enum add_policy pol = add_policy();
    const bool beta = pol == ADD_MEASURED_BETA || pol == ADD_GRAPH_BETA;
    ch->acc_legacy[k] = false;
    ch->graph_acc[k][0] = '\0';
    ch->ws_acc[k] = 0;
    if (pol == ADD_GRAPH) return;
    if (pol == ADD_LEGACY) {
        ch->acc_legacy[k] = true;
        ch->ws_acc[k] = legacy_ws;
        if (conv_verbose())
            fprintf(stderr, "conv-choice %s-accumulate legacy (GP_CONV_ADD_API)\n", dir_names[k]);
        return;
    }
    if (graph_ms < 0) return;
    static const enum conv_graph_op ops[3] = {CONV_GRAPH_FPROP, CONV_GRAPH_DGRAD, CONV_GRAPH_WGRAD};
    struct conv_graph_problem p;
    conv_graph_problem_of(g, mode, ops[k], &p);
    /* The engines' own add, on buffers of their own: first, before this
     * function's buffers are taken. Where a bfloat16 result is added in
     * bfloat16 (GP_CONV_ACCUMULATE=bf16: rounded twice, as the add
     * kernel does) it is not a candidate: the engine rounds once. */
    float beta_ms = -1;
    size_t beta_ws = 0;
    char beta_name[CONV_GRAPH_NAME] = "";
    if (beta && (!mode.bf16 || p.float_out)) {
        struct conv_graph_problem pb = p;
        pb.float_out = false;
        char why[256];
        if (!conv_graph_beta_choose(&pb, ops[k], conv_ws_cap(g), beta_name, sizeof beta_name, &beta_ws, &beta_ms,
                                    why, sizeof why)) {
            beta_ms = -1;
            if (conv_verbose()) fprintf(stderr, "conv-choice %s-accumulate graph-beta none: %s\n", dir_names[k], why);
        }
    }
    size_t es = mode.bf16 ? 2 : 4, acc_es = mode.bf16 && !p.float_out ? 2 : 4;
    int64_t n_img = g->n * g->img_ch * g->imgb_size, n_col = g->n * g->col_ch * g->col_size;
    int64_t n_w = g->col_ch * (g->img_ch / g->group);
    for (int i = 0; i < g->ns; i++) n_w *= g->k[i];
    const int64_t n_out = k == 0 ? n_col : k == 1 ? n_img : n_w;
    float legacy_ms = -1, add_ms = -1;
    if (pol != ADD_GRAPH_BETA) {
        conv_device_buffers buf;
        void *img = buf.get(es * (size_t)n_img), *col = buf.get(es * (size_t)n_col), *w = buf.get(es * (size_t)n_w);
        void *acc = buf.get(acc_es * (size_t)n_out), *ws = buf.get(legacy_ws);
        cudaStream_t s = nullptr;
        cudnnGetStream(h, &s);
        const cudnnMathType_t math[3] = {ch->m_fwd, ch->m_data, ch->m_filter};
        /* No memory to measure in: the graph API's add (or its beta). */
        if (img && col && w && acc && ws && cudnnSetConvolutionMathType(d->conv, math[k]) == CUDNN_STATUS_SUCCESS) {
            if (cudaStreamSynchronize(cudaStreamLegacy) != cudaSuccess) cudaGetLastError(); /* the clears */
            float one = 1.0f;
            legacy_ms = conv_time_best(s, 3, [&] {
                cudnnStatus_t st =
                    k == 0 ? cudnnConvolutionForward(h, &one, d->img, img, d->w, w, d->conv, ch->fwd, ws, legacy_ws,
                                                     &one, d->col, col)
                    : k == 1 ? cudnnConvolutionBackwardData(h, &one, d->w, w, d->col, col, d->conv, ch->bwd_data, ws,
                                                            legacy_ws, &one, d->img, img)
                             : cudnnConvolutionBackwardFilter(h, &one, d->img, img, d->col, col, d->conv,
                                                              ch->bwd_filter, ws, legacy_ws, &one, d->w, w);
                return st == CUDNN_STATUS_SUCCESS;
            });
            void *out = k == 0 ? col : k == 1 ? img : w;
            add_ms = conv_time_best(s, 3, [&] {
                return conv_accumulate_launch(s, out, acc, n_out, mode.bf16, p.float_out) == cudaSuccess;
            });
        }
    }
    /* The fastest of the three; the graph API's add where nothing else
     * was measured. */
    float best = add_ms >= 0 ? graph_ms + add_ms : -1;
    if (legacy_ms >= 0 && best >= 0 && legacy_ms < best) {
        best = legacy_ms;
        ch->acc_legacy[k] = true;
        ch->ws_acc[k] = legacy_ws;
    }
    if (beta_ms >= 0 && (best < 0 || beta_ms < best)) {
        ch->acc_legacy[k] = false;
        memcpy(ch->graph_acc[k], beta_name, CONV_GRAPH_NAME);
        ch->ws_acc[k] = beta_ws;
    }
    if (conv_verbose()) {
        const int algo[3] = {(int)ch->fwd, (int)ch->bwd_data, (int)ch->bwd_filter};
        fprintf(stderr,
                "conv-choice %s-accumulate %s legacy algo=%d ms=%.4f graph ms=%.4f add ms=%.4f graph-beta %s ms=%.4f\n",
                dir_names[k], ch->graph_acc[k][0] ? "graph-beta" : ch->acc_legacy[k] ? "legacy" : "graph", algo[k],
                (double)legacy_ms, (double)graph_ms, (double)add_ms, beta_name[0] ? beta_name : "-",
                (double)beta_ms);
    }
}

/* Chooses the algorithms of the problem's directions in `dirs` with
 * handle h, on the API conv_api() says. On failure *why says which step
 * found nothing. */
static bool choose_algos(cudnnHandle_t h, const struct conv_geom *g, struct conv_mode mode, unsigned dirs,
                         struct algo_choice *ch, struct dnn_err *e, const char **why)
{
    struct descs d;
    *why = NULL;
    memset(ch, 0, sizeof *ch);
    enum conv_api api = conv_api();
    const size_t cap = conv_ws_cap(g);
    if (conv_verbose()) report_problem(g, mode);
    struct graph_choice gc;
    memset(&gc, 0, sizeof gc);
    if (api != API_LEGACY) choose_graphs(g, mode, dirs, &gc);
    /* The legacy API's measured times (-1: not measured, from its heuristics). */
    float legacy_ms[3] = {-1, -1, -1};
    /* "graph" asks the legacy API only where the graph API has nothing;
     * directions not asked for are skipped. */
    bool skip[3];
    for (int k = 0; k < 3; k++) skip[k] = (api == API_GRAPH && gc.name[k][0]) || !(dirs & (1u << k));
    bool ok = conv_descs_create(g, mode.bf16, conv_base_math(mode), &d, e);
    int count = 0;
    bool found = false;
    const double t_legacy = now_s();
    if (ok && !skip[0]) {
        cudnnConvolutionFwdAlgoPerf_t perf[MAX_PERF];
        auto ws_of = [&](cudnnConvolutionFwdAlgo_t a, size_t *ws) {
            return cudnnGetConvolutionForwardWorkspaceSize(h, d.img, d.w, d.conv, d.col, a, ws) ==
                   CUDNN_STATUS_SUCCESS;
        };
        /* Measured first (fastest first), then the heuristics' ranking. */
        if (cudnnFindConvolutionForwardAlgorithm(h, d.img, d.w, d.conv, d.col, MAX_PERF, &count, perf) ==
            CUDNN_STATUS_SUCCESS) {
            REPORT_PERF("fwd", perf, count);
            PICK(perf, count, mode, cap, d.conv, ws_of, ch->fwd, ch->m_fwd, ch->ws_fwd, legacy_ms[0], found);
        }
        if (!found) {
            cudnnSetConvolutionMathType(d.conv, conv_base_math(mode));
            cudnnStatus_t st = cudnnGetConvolutionForwardAlgorithm_v7(h, d.img, d.w, d.conv, d.col, MAX_PERF,
                                                                      &count, perf);
            if (st != CUDNN_STATUS_SUCCESS) {
                e->st = st, e->call = "cudnnGetConvolutionForwardAlgorithm_v7", ok = false;
            } else {
                PICK(perf, count, mode, cap, d.conv, ws_of, ch->fwd, ch->m_fwd, ch->ws_fwd, legacy_ms[0], found);
                if (!found) *why = "forward", ok = false;
            }
        }
    }
    if (ok && !skip[1]) {
        cudnnSetConvolutionMathType(d.conv, conv_base_math(mode));
        cudnnConvolutionBwdDataAlgoPerf_t perf[MAX_PERF];
        auto ws_of = [&](cudnnConvolutionBwdDataAlgo_t a, size_t *ws) {
            return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.col, d.conv, d.img, a, ws) ==
                   CUDNN_STATUS_SUCCESS;
        };
        if (cudnnFindConvolutionBackwardDataAlgorithm(h, d.w, d.col, d.conv, d.img, MAX_PERF, &count, perf) ==
            CUDNN_STATUS_SUCCESS) {
            REPORT_PERF("data", perf, count);
            PICK(perf, count, mode, cap, d.conv, ws_of, ch->bwd_data, ch->m_data, ch->ws_data, legacy_ms[1], found);
        }
        if (!found) {
            cudnnSetConvolutionMathType(d.conv, conv_base_math(mode));
            cudnnStatus_t st = cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.col, d.conv, d.img,
                                                                           MAX_PERF, &count, perf);
            if (st != CUDNN_STATUS_SUCCESS) {
                e->st = st, e->call = "cudnnGetConvolutionBackwardDataAlgorithm_v7", ok = false;
            } else {
                PICK(perf, count, mode, cap, d.conv, ws_of, ch->bwd_data, ch->m_data, ch->ws_data, legacy_ms[1], found);
                if (!found) *why = "backward data", ok = false;
            }
        }
    }
    if (ok && !skip[2]) {
        cudnnSetConvolutionMathType(d.conv, conv_base_math(mode));
        cudnnConvolutionBwdFilterAlgoPerf_t perf[MAX_PERF];
        auto ws_of = [&](cudnnConvolutionBwdFilterAlgo_t a, size_t *ws) {
            return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.img, d.col, d.conv, d.w, a, ws) ==
                   CUDNN_STATUS_SUCCESS;
        };
        if (cudnnFindConvolutionBackwardFilterAlgorithm(h, d.img, d.col, d.conv, d.w, MAX_PERF, &count, perf) ==
            CUDNN_STATUS_SUCCESS) {
            REPORT_PERF("filter", perf, count);
            PICK(perf, count, mode, cap, d.conv, ws_of, ch->bwd_filter, ch->m_filter, ch->ws_filter, legacy_ms[2], found);
        }
        if (!found) {
            cudnnSetConvolutionMathType(d.conv, conv_base_math(mode));
            cudnnStatus_t st = cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.img, d.col, d.conv, d.w,
                                                                             MAX_PERF, &count, perf);
            if (st != CUDNN_STATUS_SUCCESS) {
                e->st = st, e->call = "cudnnGetConvolutionBackwardFilterAlgorithm_v7", ok = false;
            } else {
                PICK(perf, count, mode, cap, d.conv, ws_of, ch->bwd_filter, ch->m_filter, ch->ws_filter, legacy_ms[2], found);
                if (!found) *why = "backward filter", ok = false;
            }
        }
    }
    if (conv_verbose()) fprintf(stderr, "conv-choice legacy seconds: %.3f\n", now_s() - t_legacy);
    /* The graph API's where it was asked first, or where it measured faster
     * (or the legacy API has no measurement). Where the legacy API found
     * nothing, a graph choice keeps the convolution running. */
    char *names[3] = {ch->graph_fwd, ch->graph_data, ch->graph_filter};
    size_t *ws[3] = {&ch->ws_fwd, &ch->ws_data, &ch->ws_filter};
    /* The legacy algorithms' workspaces, kept for adding into the output
     * where the graph API wins the plain call (choose_accumulation). */
    const size_t legacy_ws[3] = {ch->ws_fwd, ch->ws_data, ch->ws_filter};
    bool any_graph = false;
    for (int k = 0; k < 3; k++) {
        if (!gc.name[k][0]) continue;
        if (api == API_GRAPH || !ok || legacy_ms[k] < 0 || (gc.ms[k] >= 0 && gc.ms[k] <= legacy_ms[k])) {
            memcpy(names[k], gc.name[k], CONV_GRAPH_NAME);
            *ws[k] = gc.ws[k];
            any_graph = true;
        }
    }
    /* A result on the graph API added into its output: against the
     * legacy algorithm's beta 1, where the legacy API found one; with
     * GP_CONV_ADD_API=graph-beta, which needs no legacy algorithm, also
     * where GP_CONV_API=graph left the legacy API unasked. */
    for (int k = 0; k < 3; k++) {
        bool asked = !skip[k] || (add_policy() == ADD_GRAPH_BETA && (dirs & (1u << k)));
        if (ok && asked && names[k][0] && may_add(g, mode, k))
            choose_accumulation(h, g, mode, &d, k, gc.ms[k], legacy_ws[k], ch);
    }
    conv_descs_destroy(&d);
    bool all_graph = any_graph;
    for (int k = 0; k < 3; k++)
        if ((dirs & (1u << k)) && !names[k][0]) all_graph = false;
    if (!ok && all_graph) {
        ok = true; /* the legacy API failed, but the graph API has every direction asked for */
        *why = NULL;
    }
    if (conv_verbose() && ok) {
        int legacy[3] = {(int)ch->fwd, (int)ch->bwd_data, (int)ch->bwd_filter};
        for (int k = 0; k < 3; k++) {
            if (!(dirs & (1u << k))) continue;
            if (names[k][0])
                fprintf(stderr, "conv-choice chosen %s graph name=%s ms=%.4f legacy_ms=%.4f\n", dir_names[k], names[k],
                        (double)gc.ms[k], (double)legacy_ms[k]);
            else
                fprintf(stderr, "conv-choice chosen %s legacy algo=%d ms=%.4f graph_ms=%.4f\n", dir_names[k], legacy[k],
                        (double)legacy_ms[k], (double)gc.ms[k]);
        }
    }
    return ok;
}

struct cache_entry {
    struct algo_key key;
    struct algo_choice ch;
};

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cache_entry *cache;
static int cache_len, cache_cap;

/* Told after each choice measured (gp_cuda_on_measure), under cache_mu:
 * one call at a time. */
static void (*measure_fn)(void *user, double seconds);
static void *measure_user;

extern "C" void gp_cuda_on_measure(void (*fn)(void *user, double seconds), void *user)
{
    pthread_mutex_lock(&cache_mu);
    measure_fn = fn;
    measure_user = user;
    pthread_mutex_unlock(&cache_mu);
}

/* The choice for the problem in `mode`, from the table or made now with
 * `h` (NULL: a handle of its own, created for the choice and destroyed
 * after it, so that nothing outlives the stages) and added to it. */
bool conv_lookup_algos(cudnnHandle_t h, const struct conv_geom *g, struct conv_mode mode, unsigned dirs,
                       struct algo_choice *ch, struct dnn_err *e, const char **why)
{
    struct algo_key key;
    algo_key_init(g, mode, dirs, &key);
    if (key.dirs == 0) dirs = CONV_DIRS_ALL;
    *why = NULL;
    pthread_mutex_lock(&cache_mu);
    for (int i = 0; i < cache_len; i++)
        if (memcmp(&cache[i].key, &key, sizeof key) == 0) {
            *ch = cache[i].ch;
            pthread_mutex_unlock(&cache_mu);
            return true;
        }
    bool ok = true;
    double t0 = now_s();
    cudnnHandle_t own = NULL;
    if (!h) {
        cudnnStatus_t st = cudnnCreate(&own);
        if (st != CUDNN_STATUS_SUCCESS) own = NULL, e->st = st, e->call = "cudnnCreate", ok = false;
        h = own;
    }
    ok = ok && choose_algos(h, g, mode, dirs, ch, e, why);
    if (own) cudnnDestroy(own);
    if (ok) {
        if (cache_len == cache_cap) {
            int cap = cache_cap ? 2 * cache_cap : 64;
            struct cache_entry *grown = (struct cache_entry *)realloc(cache, sizeof *cache * (size_t)cap);
            if (grown) cache = grown, cache_cap = cap;
        }
        if (cache_len < cache_cap) {
            cache[cache_len].key = key;
            cache[cache_len].ch = *ch;
            cache_len++;
        }
        if (measure_fn) measure_fn(measure_user, now_s() - t0);
    }
    pthread_mutex_unlock(&cache_mu);
    return ok;
}

/* ---- the table as text: what a saved training state keeps ----
 *
 * cuDNN's measurements vary from run to run, and two algorithms of one
 * problem differ in their last bits, so a resumed run (or another process
 * of one run) computes as the first only with the first one's choices.
 * The text names the cuDNN version and the GPU they were measured on,
 * then one line per problem: "conv" and the key's numbers, then the three
 * legacy algorithms, their math types and workspaces, then the three graph
 * API configurations' names ("-" where the legacy algorithm runs), then,
 * for each direction whose added call runs on the legacy API, the word
 * fwd-acc-legacy, data-acc-legacy or filter-acc-legacy and that call's
 * workspace, or where it runs on the graph API with beta 1,
 * fwd-acc-graph (data-, filter-), its configuration's name and workspace.
 * A channels-last problem's line starts "conv-nhwc" instead (the key's other
 * numbers as "conv"'s: states saved before channels-last read as they did,
 * and a reader that does not know the word skips the line), and a choice
 * made for one direction only (the 3xTF32 problems of conv_x3.h) ends the
 * word with "-fwd", "-data" or "-filter". */

static const char *const dir_words[3] = {"-fwd", "-data", "-filter"};

/* After the names: a direction's result added into its output on the
 * legacy API, and that call's workspace (algo_choice.acc_legacy; absent:
 * on the plain call's choice, as lines written before it read). */
static const char *const acc_words[3] = {"fwd-acc-legacy", "data-acc-legacy", "filter-acc-legacy"};
/* Or on the graph API's configuration NAME adding it itself, and that
 * call's workspace: "data-acc-graph NAME WS" (algo_choice.graph_acc). */
static const char *const acc_graph_words[3] = {"fwd-acc-graph", "data-acc-graph", "filter-acc-graph"};

static const char *dirs_word(int dirs)
{
    for (int k = 0; k < 3; k++)
        if (dirs == (1 << k)) return dir_words[k];
    return "";
}

#define KEY_INTS (7 + 3 * (MAX_AXES + 2) + 3 * MAX_AXES)

static void key_ints(const struct algo_key *k, int *v)
{
    int n = 0;
    v[n++] = k->ns, v[n++] = k->group, v[n++] = k->bf16, v[n++] = k->tf32, v[n++] = k->fastest;
    v[n++] = k->transpose, v[n++] = k->direct;
    for (int i = 0; i < MAX_AXES + 2; i++) v[n++] = k->img[i];
    for (int i = 0; i < MAX_AXES + 2; i++) v[n++] = k->col[i];
    for (int i = 0; i < MAX_AXES + 2; i++) v[n++] = k->w[i];
    for (int i = 0; i < MAX_AXES; i++) v[n++] = k->q[i];
    for (int i = 0; i < MAX_AXES; i++) v[n++] = k->s[i];
    for (int i = 0; i < MAX_AXES; i++) v[n++] = k->d[i];
}

static void key_from_ints(const long long *v, struct algo_key *k)
{
    memset(k, 0, sizeof *k);
    int n = 0;
    k->ns = (int)v[n++], k->group = (int)v[n++], k->bf16 = (int)v[n++], k->tf32 = (int)v[n++];
    k->fastest = (int)v[n++];
    k->transpose = (int)v[n++], k->direct = (int)v[n++];
    for (int i = 0; i < MAX_AXES + 2; i++) k->img[i] = (int)v[n++];
    for (int i = 0; i < MAX_AXES + 2; i++) k->col[i] = (int)v[n++];
    for (int i = 0; i < MAX_AXES + 2; i++) k->w[i] = (int)v[n++];
    for (int i = 0; i < MAX_AXES; i++) k->q[i] = (int)v[n++];
    for (int i = 0; i < MAX_AXES; i++) k->s[i] = (int)v[n++];
    for (int i = 0; i < MAX_AXES; i++) k->d[i] = (int)v[n++];
}

/* "cuda cudnn VERSION device NAME": where choices are valid (the first
 * line of the text; device "unknown" where no GPU is visible). */
extern "C" void gp_cuda_choices_identity(char *out, size_t size)
{
    int dev = 0;
    cudaDeviceProp p;
    const char *name = "unknown";
    if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&p, dev) == cudaSuccess) name = p.name;
    else cudaGetLastError();
    snprintf(out, size, "cuda cudnn %zu device %s", cudnnGetVersion(), name);
}

extern "C" char *gp_cuda_choices_export(void)
{
    pthread_mutex_lock(&cache_mu);
    size_t cap = 256 + (size_t)cache_len * (24 + KEY_INTS * 12 + 10 * 24 + 6 * (CONV_GRAPH_NAME + 1) + 3 * 48),
           len = 0;
    char *text = cache_len ? (char *)malloc(cap) : NULL;
    if (text) {
        gp_cuda_choices_identity(text, cap);
        len = strlen(text);
        for (int i = 0; i < cache_len; i++) {
            int v[KEY_INTS];
            key_ints(&cache[i].key, v);
            len += (size_t)snprintf(text + len, cap - len, "\nconv%s%s", cache[i].key.nhwc ? "-nhwc" : "",
                                    dirs_word(cache[i].key.dirs));
            for (int j = 0; j < KEY_INTS; j++) len += (size_t)snprintf(text + len, cap - len, " %d", v[j]);
            const struct algo_choice *c = &cache[i].ch;
            len += (size_t)snprintf(text + len, cap - len, " %d %d %zu %d %d %zu %d %d %zu", (int)c->fwd,
                                    (int)c->m_fwd, c->ws_fwd, (int)c->bwd_data, (int)c->m_data, c->ws_data,
                                    (int)c->bwd_filter, (int)c->m_filter, c->ws_filter);
            const char *names[3] = {c->graph_fwd, c->graph_data, c->graph_filter};
            for (int k = 0; k < 3; k++)
                len += (size_t)snprintf(text + len, cap - len, " %s", names[k][0] ? names[k] : "-");
            for (int k = 0; k < 3; k++)
                if (c->acc_legacy[k])
                    len += (size_t)snprintf(text + len, cap - len, " %s %zu", acc_words[k], c->ws_acc[k]);
                else if (c->graph_acc[k][0])
                    len += (size_t)snprintf(text + len, cap - len, " %s %s %zu", acc_graph_words[k], c->graph_acc[k],
                                            c->ws_acc[k]);
        }
        len += (size_t)snprintf(text + len, cap - len, "\n");
    }
    pthread_mutex_unlock(&cache_mu);
    return text;
}

extern "C" gp_status gp_cuda_choices_import(const char *text, char *note, size_t note_size, struct gp_error *err)
{
    if (note_size) note[0] = '\0';
    const char *eol = strchr(text, '\n');
    size_t head = eol ? (size_t)(eol - text) : strlen(text);
    char here[512];
    gp_cuda_choices_identity(here, sizeof here);
    if (head != strlen(here) || strncmp(text, here, head) != 0) {
        /* Measured elsewhere: measured again here; the run goes on. */
        snprintf(note, note_size,
                 "the saved convolution algorithms were measured with %.*s, this is %s: chosen again, so "
                 "the run continues but not bit for bit",
                 (int)(head < 200 ? head : 200), text, here);
        return GP_OK;
    }
    pthread_mutex_lock(&cache_mu);
    for (const char *line = eol; line && *line; line = strchr(line + 1, '\n')) {
        const char *p = line + 1;
        if (strncmp(p, "conv", 4) != 0) continue;
        p += 4;
        bool nhwc = strncmp(p, "-nhwc", 5) == 0;
        if (nhwc) p += 5;
        int dirs = 0;
        for (int k = 0; k < 3 && !dirs; k++) {
            size_t wl = strlen(dir_words[k]);
            if (strncmp(p, dir_words[k], wl) == 0 && p[wl] == ' ') dirs = 1 << k, p += wl;
        }
        if (*p != ' ') continue; /* a word this reader does not know */
        long long v[KEY_INTS + 9];
        int n = 0;
        for (char *end; n < KEY_INTS + 9; n++, p = end) {
            v[n] = strtoll(p, &end, 10);
            if (end == p || v[n] < 0 || v[n] > (n >= KEY_INTS ? LLONG_MAX : INT_MAX)) break;
        }
        struct cache_entry e;
        memset(&e, 0, sizeof e);
        char *names[3] = {e.ch.graph_fwd, e.ch.graph_data, e.ch.graph_filter};
        bool named = n == KEY_INTS + 9;
        for (int k = 0; k < 3 && named; k++) {
            while (*p == ' ') p++;
            size_t len = strcspn(p, " \n");
            named = len > 0 && len < CONV_GRAPH_NAME;
            if (named && !(len == 1 && *p == '-')) memcpy(names[k], p, len);
            p += len;
        }
        /* Each direction's word (legacy or graph) at most once, in order. */
        for (int k = 0; k < 3 && named; k++) {
            while (*p == ' ') p++;
            size_t wl = strlen(acc_words[k]), gl = strlen(acc_graph_words[k]);
            bool legacy = strncmp(p, acc_words[k], wl) == 0 && p[wl] == ' ';
            bool graph = strncmp(p, acc_graph_words[k], gl) == 0 && p[gl] == ' ';
            if (!legacy && !graph) continue;
            p += (legacy ? wl : gl) + 1;
            if (graph) {
                size_t len = strcspn(p, " \n");
                if (len == 0 || len >= CONV_GRAPH_NAME || p[len] != ' ') {
                    named = false;
                    break;
                }
                memcpy(e.ch.graph_acc[k], p, len);
                p += len + 1;
            }
            char *end;
            long long ws = strtoll(p, &end, 10);
            if (end == p || ws < 0) {
                named = false;
            } else {
                e.ch.acc_legacy[k] = legacy;
                e.ch.ws_acc[k] = (size_t)ws;
                p = end;
            }
        }
        if (!named || (*p && *p != '\n')) {
            pthread_mutex_unlock(&cache_mu);
            return gp_error_set(err, GP_ERR_PARSE, "a saved convolution algorithm line is malformed: %.80s",
                                line + 1);
        }
        key_from_ints(v, &e.key);
        e.key.nhwc = nhwc;
        e.key.dirs = dirs;
        const long long *c = v + KEY_INTS;
        e.ch.fwd = (cudnnConvolutionFwdAlgo_t)c[0], e.ch.m_fwd = (cudnnMathType_t)c[1], e.ch.ws_fwd = (size_t)c[2];
        e.ch.bwd_data = (cudnnConvolutionBwdDataAlgo_t)c[3], e.ch.m_data = (cudnnMathType_t)c[4];
        e.ch.ws_data = (size_t)c[5];
        e.ch.bwd_filter = (cudnnConvolutionBwdFilterAlgo_t)c[6], e.ch.m_filter = (cudnnMathType_t)c[7];
        e.ch.ws_filter = (size_t)c[8];
        int at = 0;
        while (at < cache_len && memcmp(&cache[at].key, &e.key, sizeof e.key) != 0) at++;
        if (at == cache_len && cache_len == cache_cap) {
            int cap = cache_cap ? 2 * cache_cap : 64;
            struct cache_entry *grown = (struct cache_entry *)realloc(cache, sizeof *cache * (size_t)cap);
            if (!grown) {
                pthread_mutex_unlock(&cache_mu);
                return gp_error_set(err, GP_ERR_NOMEM, "out of memory for the convolution algorithms");
            }
            cache = grown, cache_cap = cap;
        }
        cache[at] = e;
        if (at == cache_len) cache_len++;
    }
    pthread_mutex_unlock(&cache_mu);
    return GP_OK;
}
