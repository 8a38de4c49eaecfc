/* CUDA conv family: convolutions through cuDNN's graph API (cudnn-frontend),
 * behind a C interface (conv_graph.cpp holds the C++).
 *
 * The legacy API (cudnnFind*Algorithm, conv_algos.cu) offers a handful of
 * algorithms per direction; the graph API offers every engine and knob
 * setting cuDNN has for the problem, as PyTorch uses it. On the H200 in
 * bfloat16 the legacy deterministic backward had no fast kernel for some
 * shapes (a 3x3 stride-2 layer of ResNet-50: 65.7 ms against 2.4 in TF32)
 * where PyTorch, on the graph API with deterministic engines only, trains
 * the whole network at 2348 samples/s. A problem the graph API cannot run
 * stays on the legacy path. For now the graph API runs only with
 * GP_CONV_API=graph (conv_algos.cu says why).
 *
 * A choice is an engine configuration, named by cuDNN's tag for it (engine
 * and knobs, such as "eng4_k2=1_k3=0"): chosen by measuring every candidate
 * that keeps the mode's rules (conv_graph_choose), kept by name in the
 * algorithm table with the legacy choices, and built into an execution plan
 * once per GPU from its name (conv_graph_run). */
#ifndef GP_CUDA_CONV_GRAPH_H
#define GP_CUDA_CONV_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cudnn.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Which of the three convolutions of a problem: the columns from the
 * image (FPROP), the image's gradient from the columns' (DGRAD), the
 * filter's gradient from both (WGRAD). */
enum conv_graph_op { CONV_GRAPH_FPROP, CONV_GRAPH_DGRAD, CONV_GRAPH_WGRAD };

#define CONV_GRAPH_NAME 128 /* bytes of an engine configuration's name */

/* One problem: packed NCHW (NCDHW) tensors (or channels-last, `nhwc`), image [n, img_ch, spatial],
 * filter [col_ch, img_ch / groups, kernel], columns [n, col_ch, spatial];
 * symmetric padding. Storage bfloat16 or float32; the computation in
 * float32 (tensor cores: bfloat16 always, float32 only with tf32). */
struct conv_graph_problem {
    int nd; /* 4 or 5 */
    int64_t img[5], w[5], col[5];
    int64_t pad[3], stride[3], dilation[3];
    bool bf16, tf32;
    bool precise;          /* float32's precision promised: no FFT or Winograd (float32, and 3xTF32's problems) */
    bool nondeterministic; /* engines whose results vary run to run allowed (--fast-conv) */
    bool float_out;        /* the result in float32 whatever the storage (to accumulate it in float32) */
    bool nhwc;             /* channels-last: image and columns [n, spatial, ch], filter [out, kernel, in / groups]
                              (the dims above still list channels second) */
};

/* GP_CONV_VERBOSE set (not "0"): choices and the candidates measured for
 * them reported on stderr as "conv-choice" lines (conv_algos.cu). */
bool conv_verbose(void);

/* Measures every engine configuration of `op` that keeps the problem's
 * rules (deterministic unless allowed; float32 semantics without tensor
 * cores for float32 without TF32: no FFT or Winograd; no reduced-precision
 * reductions unless nondeterministic is allowed, which asks for the fastest
 * whatever its numerics; never down-converted inputs) and whose
 * workspace is at most ws_cap, on buffers of its own on the current GPU.
 * name gets the fastest's, *ws its workspace, *ms its time (milliseconds;
 * -1 when nothing could be measured, the heuristics' first then). False,
 * with *why, when the
 * graph API has none that runs (the caller stays on the legacy API). */
bool conv_graph_choose(const struct conv_graph_problem *p, enum conv_graph_op op, size_t ws_cap, char *name,
                       size_t name_size, size_t *ws, float *ms, char *why, size_t why_size);

/* Runs `op` with the configuration `name` on handle h's stream: FPROP
 * col = conv(img: a, w: b); DGRAD img = dgrad(col: a, w: b); WGRAD
 * w = wgrad(img: a, col: b); `out` overwritten. The plan is built on the
 * current GPU the first time, then kept. False, with *why, on failure. */
bool conv_graph_run(cudnnHandle_t h, const struct conv_graph_problem *p, enum conv_graph_op op, const char *name,
                    const void *a, const void *b, void *out, void *ws, char *why, size_t why_size);

/* The same with beta 1: the result added into `out` by the engine itself
 * (cuDNN's backend convolution operations take beta; cudnn-frontend's
 * graphs above always build beta 0, conv_graph.cpp). `name`s are of
 * these configurations, not the graph's; `out` is in the storage type
 * (p->float_out is not read: the engine adds in float32 and rounds once).
 * choose measures the candidates as conv_graph_choose does, adding into a
 * buffer of its own. */
bool conv_graph_beta_choose(const struct conv_graph_problem *p, enum conv_graph_op op, size_t ws_cap, char *name,
                            size_t name_size, size_t *ws, float *ms, char *why, size_t why_size);
bool conv_graph_beta_run(cudnnHandle_t h, const struct conv_graph_problem *p, enum conv_graph_op op, const char *name,
                         const void *a, const void *b, void *out, void *ws, char *why, size_t why_size);

#ifdef __cplusplus
}
#endif

#endif
