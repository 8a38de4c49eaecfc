/* The cuDNN problem of a Conv or ConvTranspose node, shared by the conv
 * family's kernels (conv.cu) and its algorithm choice (conv_algos.cu):
 * the geometry, the mode it runs in, cuDNN's descriptors of it and the
 * algorithms chosen for it. */
#ifndef GP_CUDA_CONV_PROBLEM_CUH
#define GP_CUDA_CONV_PROBLEM_CUH

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cudnn.h>

#include "backend/cuda/conv_graph.h"

#define MAX_AXES 3
#define ALIGN 256

static inline size_t align_up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* The cuDNN problem of a node. Spatial axes are exactly `ns` (2 or 3; a 1-D
 * conv gets a leading axis of size 1). The image buffer holds image cell
 * i (per axis) at i + off; cells of it outside the image are zero padding
 * (Conv) or cells cropped away (ConvTranspose). `direct`: the buffer is the
 * image itself (every off 0, imgb == img). */
struct conv_geom {
    bool transpose;
    int ns;
    int64_t n, c, m, group;    /* batch, X channels, Y channels, groups */
    int64_t img_ch, col_ch;    /* channels of the image and of the columns */
    int64_t img[MAX_AXES], imgb[MAX_AXES], off[MAX_AXES], col[MAX_AXES];
    int64_t k[MAX_AXES], s[MAX_AXES], d[MAX_AXES], q[MAX_AXES]; /* q: cuDNN's symmetric pads */
    int64_t img_size, imgb_size, col_size;                     /* per plane */
    bool direct;
    /* cuDNN convolves channels-last tensors (image and columns [n,
     * spatial, ch]) with a channels-last filter ([out, kernel, in /
     * groups]): 2 spatial axes, a direct image and channels in runs of 8
     * only (conv.cu). relayable: channels-last X or Y may be given (2 axes,
     * direct), relaid where they differ from the run's layout. */
    bool nhwc, relayable;
};

/* What a convolution runs in: the storage of X, W, Y and their gradients,
 * TF32 (float32 storage only) and the fast_conv policy; x3: float32
 * without TF32 runs in 3xTF32 where the geometry allows (conv_x3.h). A
 * 3xTF32 call's TF32 problems run in {tf32, x3}: TF32 on operands split
 * exactly, whose algorithms must multiply them as they are (no FFT or
 * Winograd, which transform the operands and round the transforms to
 * TF32 again, at TF32's error). */
struct conv_mode {
    bool bf16, tf32, fast, x3;
};

/* The directions of a convolution, as masks: a choice of algorithms made
 * for some of them only (conv_lookup_algos; CONV_DIRS_ALL: all three). */
enum {
    CONV_DIR_FWD = 1,
    CONV_DIR_DATA = 2,
    CONV_DIR_FILTER = 4,
    CONV_DIRS_ALL = 7,
};

struct dnn_err {
    cudnnStatus_t st;
    const char *call;
};

struct descs {
    cudnnTensorDescriptor_t img, col;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
};

/* Per direction (forward, backward data, backward filter): the legacy
 * API's algorithm and math type, or, when its name is not empty, the graph
 * API's engine configuration (conv_graph.h); and its workspace. */
struct algo_choice {
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
    cudnnMathType_t m_fwd, m_data, m_filter;
    size_t ws_fwd, ws_data, ws_filter;
    char graph_fwd[CONV_GRAPH_NAME], graph_data[CONV_GRAPH_NAME], graph_filter[CONV_GRAPH_NAME];
    /* A direction's result added into its output (beta 1: a Conv's dX
     * that another layer wrote first, a float32 dW, a 3xTF32 call's
     * second part) where the graph API is the plain call's choice: on
     * direction k's legacy algorithm (fwd, bwd_data, bwd_filter and its
     * math type) with a workspace of ws_acc[k] when acc_legacy[k]
     * (measured faster than the graph API's result computed into a
     * buffer and then added: conv_algos.cu, choose_accumulation); on the
     * graph API's engine configuration graph_acc[k] adding the result
     * itself (conv_graph_beta_run) with a workspace of ws_acc[k] where
     * that is not empty (where it measured fastest, or with
     * GP_CONV_ADD_API=graph-beta); else as the plain call. */
    bool acc_legacy[3];
    char graph_acc[3][CONV_GRAPH_NAME];
    size_t ws_acc[3];
};

/* dst += src over n values, in the convolution's storage (bfloat16 when
 * bf16), src float32 when float_src (conv.cu's add of a graph API result
 * into the gradient it accumulates). */
cudaError_t conv_accumulate_launch(cudaStream_t stream, void *dst, const void *src, int64_t n, bool bf16,
                                   bool float_src);

/* Whether the graph API's result of `op` is accumulated into its output
 * (beta = 1 in the legacy API: through a buffer and an add), and then in
 * float32 whatever the storage, so that a bfloat16 gradient is rounded
 * once, as the CPU backend does. The filter gradient of a bfloat16
 * convolution is rounded to bfloat16 first (as autocast's is), so it is
 * never float32. */
bool conv_graph_accumulates(const struct conv_geom *g, enum conv_graph_op op);

/* The graph API's problem of `op` in `mode` (conv_graph.h). */
void conv_graph_problem_of(const struct conv_geom *g, struct conv_mode mode, enum conv_graph_op op,
                           struct conv_graph_problem *p);

/* The descriptors of the problem in storage `bf16` (tensors and filter;
 * the compute type is float32 either way); `math` for the convolution. The
 * columns' shape is checked against cuDNN's own output shape. */
bool conv_descs_create(const struct conv_geom *g, bool bf16, cudnnMathType_t math, struct descs *d,
                       struct dnn_err *e);
void conv_descs_destroy(struct descs *d);

/* The most workspace an algorithm of the problem may ask for: twice the
 * float32 bytes of its image, columns and filter, at least 256 MiB and at
 * most 4 GiB. cuDNN's fast NCHW engines convolve NHWC copies of the
 * tensors they make in the workspace; under a fixed cap of 256 MiB the
 * larger layers were left with its slowest engines (ResNet-50's 1x1
 * stride-2 256 -> 512 data gradient at batch 128: 63.5 ms against 0.2 with
 * the workspace it asks for). */
size_t conv_ws_cap(const struct conv_geom *g);

/* The math type the mode's descriptors start from. */
cudnnMathType_t conv_base_math(struct conv_mode m);
const char *conv_math_name(struct conv_mode m);

/* The choice for the problem in `mode`, from the process-wide table or made
 * now with `h` (NULL: a handle of its own, destroyed after the choice) and
 * added to it: for the directions in `dirs` (CONV_DIR_* masks; the others'
 * fields are left zero and nothing is measured for them). On failure *why
 * says which step found nothing (NULL: e says which cuDNN call failed). */
bool conv_lookup_algos(cudnnHandle_t h, const struct conv_geom *g, struct conv_mode mode, unsigned dirs,
                       struct algo_choice *ch, struct dnn_err *e, const char **why);

#endif
