/* CUDA conv family: the choice of cuDNN's algorithms for a convolution
 * problem (conv_problem.cuh), and the descriptors it is made with.
 *
 * Algorithms: chosen once per geometry and mode, by cuDNN's measurements
 * (cudnnFind*Algorithm, as PyTorch's cudnn.benchmark does; its heuristics,
 * cudnnGet*Algorithm_v7, where measuring fails): the fastest result that
 * succeeds with a workspace of at most WS_CAP, deterministic and (in
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
#include <stdlib.h>
#include <string.h>

#include <cudnn.h>

#include "backend/cuda/conv_problem.cuh"

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
                       const int64_t *sp, struct dnn_err *e)
{
    int dims[MAX_AXES + 2], strides[MAX_AXES + 2];
    dims[0] = (int)n;
    dims[1] = (int)ch;
    for (int i = 0; i < nd - 2; i++) dims[i + 2] = (int)sp[i];
    strides[nd - 1] = 1;
    for (int i = nd - 2; i >= 0; i--) strides[i] = strides[i + 1] * dims[i + 1];
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
    if (!set_tensor(d->img, dt, nd, g->n, g->img_ch, g->imgb, e)) return false;
    if (!set_tensor(d->col, dt, nd, g->n, g->col_ch, g->col, e)) return false;
    int wd[MAX_AXES + 2];
    wd[0] = (int)g->col_ch;
    wd[1] = (int)(g->img_ch / g->group);
    for (int i = 0; i < g->ns; i++) wd[i + 2] = (int)g->k[i];
    DNN_TRY(e, cudnnSetFilterNdDescriptor, d->w, dt, CUDNN_TENSOR_NCHW, nd, wd);
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
    int ns, group, bf16, tf32, fastest;
    int img[MAX_AXES + 2], col[MAX_AXES + 2], w[MAX_AXES + 2];
    int q[MAX_AXES], s[MAX_AXES], d[MAX_AXES];
};

static void algo_key_init(const struct conv_geom *g, struct conv_mode mode, struct algo_key *k)
{
    memset(k, 0, sizeof *k); /* padding too: keys compare with memcmp */
    k->ns = g->ns;
    k->group = (int)g->group;
    k->bf16 = mode.bf16;
    k->tf32 = mode.tf32;
    k->fastest = mode.fast;
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

/* Tensor cores allowed: TF32 for float32 storage with ctx->tf32, and
 * always for bfloat16 storage, which has no float32 semantics to keep. */
static bool tensor_ops(struct conv_mode m) { return m.tf32 || m.bf16; }

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
 * precision matters only without tensor cores, where the promise is
 * float32 semantics), whose math type is allowed and whose workspace
 * (asked of cuDNN for that algorithm and math type) fits WS_CAP. `ws_of`
 * returns false when cuDNN refuses the algorithm. */
#define PICK_LEVEL(perf, count, mode, level, conv, ws_of, out_algo, out_math, out_ws, found)     \
    do {                                                                                     \
        found = false;                                                                       \
        for (int i_ = 0; i_ < (count) && !found; i_++) {                                     \
            if ((perf)[i_].status != CUDNN_STATUS_SUCCESS) continue;                         \
            if ((level) < 1 && (perf)[i_].determinism != CUDNN_DETERMINISTIC) continue;      \
            if ((level) < 2 && !tensor_ops(mode) && !precise((perf)[i_].algo)) continue;     \
            if (!math_ok((perf)[i_].mathType, mode)) continue;                               \
            cudnnMathType_t m_ = exec_math((perf)[i_].mathType, mode);                       \
            if (cudnnSetConvolutionMathType(conv, m_) != CUDNN_STATUS_SUCCESS) continue;     \
            size_t ws_ = 0;                                                                  \
            if (!ws_of((perf)[i_].algo, &ws_)) continue;                                     \
            if (ws_ < (perf)[i_].memory) ws_ = (perf)[i_].memory;                            \
            if (ws_ > WS_CAP) continue;                                                      \
            out_algo = (perf)[i_].algo;                                                      \
            out_math = m_;                                                                   \
            out_ws = ws_;                                                                    \
            found = true;                                                                    \
        }                                                                                    \
    } while (0)

/* Preference order: deterministic and precise; precise (cuDNN's atomics
 * make the last bits vary run to run); anything that runs. Most shapes stop
 * at the first; the later ones keep a convolution that has no such
 * algorithm training rather than failing. fast_conv starts at the last. */
#define PICK(perf, count, mode, conv, ws_of, out_algo, out_math, out_ws, found)                   \
    do {                                                                                     \
        found = false;                                                                       \
        int first_ = (mode).fast ? 2 : 0;                                                    \
        for (int level_ = first_; level_ < 3 && !found; level_++)                            \
            PICK_LEVEL(perf, count, mode, level_, conv, ws_of, out_algo, out_math, out_ws, found); \
    } while (0)

/* Chooses the three algorithms of the problem with handle h. On failure
 * *why says which step found nothing. */
static bool choose_algos(cudnnHandle_t h, const struct conv_geom *g, struct conv_mode mode,
                         struct algo_choice *ch, struct dnn_err *e, const char **why)
{
    struct descs d;
    *why = NULL;
    bool ok = conv_descs_create(g, mode.bf16, conv_base_math(mode), &d, e);
    int count = 0;
    bool found = false;
    if (ok) {
        cudnnConvolutionFwdAlgoPerf_t perf[MAX_PERF];
        auto ws_of = [&](cudnnConvolutionFwdAlgo_t a, size_t *ws) {
            return cudnnGetConvolutionForwardWorkspaceSize(h, d.img, d.w, d.conv, d.col, a, ws) ==
                   CUDNN_STATUS_SUCCESS;
        };
        /* Measured first (fastest first), then the heuristics' ranking. */
        if (cudnnFindConvolutionForwardAlgorithm(h, d.img, d.w, d.conv, d.col, MAX_PERF, &count, perf) ==
            CUDNN_STATUS_SUCCESS)
            PICK(perf, count, mode, d.conv, ws_of, ch->fwd, ch->m_fwd, ch->ws_fwd, found);
        if (!found) {
            cudnnSetConvolutionMathType(d.conv, conv_base_math(mode));
            cudnnStatus_t st = cudnnGetConvolutionForwardAlgorithm_v7(h, d.img, d.w, d.conv, d.col, MAX_PERF,
                                                                      &count, perf);
            if (st != CUDNN_STATUS_SUCCESS) {
                e->st = st, e->call = "cudnnGetConvolutionForwardAlgorithm_v7", ok = false;
            } else {
                PICK(perf, count, mode, d.conv, ws_of, ch->fwd, ch->m_fwd, ch->ws_fwd, found);
                if (!found) *why = "forward", ok = false;
            }
        }
    }
    if (ok) {
        cudnnSetConvolutionMathType(d.conv, conv_base_math(mode));
        cudnnConvolutionBwdDataAlgoPerf_t perf[MAX_PERF];
        auto ws_of = [&](cudnnConvolutionBwdDataAlgo_t a, size_t *ws) {
            return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.col, d.conv, d.img, a, ws) ==
                   CUDNN_STATUS_SUCCESS;
        };
        if (cudnnFindConvolutionBackwardDataAlgorithm(h, d.w, d.col, d.conv, d.img, MAX_PERF, &count, perf) ==
            CUDNN_STATUS_SUCCESS)
            PICK(perf, count, mode, d.conv, ws_of, ch->bwd_data, ch->m_data, ch->ws_data, found);
        if (!found) {
            cudnnSetConvolutionMathType(d.conv, conv_base_math(mode));
            cudnnStatus_t st = cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.col, d.conv, d.img,
                                                                           MAX_PERF, &count, perf);
            if (st != CUDNN_STATUS_SUCCESS) {
                e->st = st, e->call = "cudnnGetConvolutionBackwardDataAlgorithm_v7", ok = false;
            } else {
                PICK(perf, count, mode, d.conv, ws_of, ch->bwd_data, ch->m_data, ch->ws_data, found);
                if (!found) *why = "backward data", ok = false;
            }
        }
    }
    if (ok) {
        cudnnSetConvolutionMathType(d.conv, conv_base_math(mode));
        cudnnConvolutionBwdFilterAlgoPerf_t perf[MAX_PERF];
        auto ws_of = [&](cudnnConvolutionBwdFilterAlgo_t a, size_t *ws) {
            return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.img, d.col, d.conv, d.w, a, ws) ==
                   CUDNN_STATUS_SUCCESS;
        };
        if (cudnnFindConvolutionBackwardFilterAlgorithm(h, d.img, d.col, d.conv, d.w, MAX_PERF, &count, perf) ==
            CUDNN_STATUS_SUCCESS)
            PICK(perf, count, mode, d.conv, ws_of, ch->bwd_filter, ch->m_filter, ch->ws_filter, found);
        if (!found) {
            cudnnSetConvolutionMathType(d.conv, conv_base_math(mode));
            cudnnStatus_t st = cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.img, d.col, d.conv, d.w,
                                                                             MAX_PERF, &count, perf);
            if (st != CUDNN_STATUS_SUCCESS) {
                e->st = st, e->call = "cudnnGetConvolutionBackwardFilterAlgorithm_v7", ok = false;
            } else {
                PICK(perf, count, mode, d.conv, ws_of, ch->bwd_filter, ch->m_filter, ch->ws_filter, found);
                if (!found) *why = "backward filter", ok = false;
            }
        }
    }
    conv_descs_destroy(&d);
    return ok;
}

struct cache_entry {
    struct algo_key key;
    struct algo_choice ch;
};

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cache_entry *cache;
static int cache_len, cache_cap;

/* The choice for the problem in `mode`, from the table or made now with
 * `h` (NULL: a handle of its own, created for the choice and destroyed
 * after it, so that nothing outlives the stages) and added to it. */
bool conv_lookup_algos(cudnnHandle_t h, const struct conv_geom *g, struct conv_mode mode,
                         struct algo_choice *ch, struct dnn_err *e, const char **why)
{
    struct algo_key key;
    algo_key_init(g, mode, &key);
    *why = NULL;
    pthread_mutex_lock(&cache_mu);
    for (int i = 0; i < cache_len; i++)
        if (memcmp(&cache[i].key, &key, sizeof key) == 0) {
            *ch = cache[i].ch;
            pthread_mutex_unlock(&cache_mu);
            return true;
        }
    bool ok = true;
    cudnnHandle_t own = NULL;
    if (!h) {
        cudnnStatus_t st = cudnnCreate(&own);
        if (st != CUDNN_STATUS_SUCCESS) own = NULL, e->st = st, e->call = "cudnnCreate", ok = false;
        h = own;
    }
    ok = ok && choose_algos(h, g, mode, ch, e, why);
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
    }
    pthread_mutex_unlock(&cache_mu);
    return ok;
}
