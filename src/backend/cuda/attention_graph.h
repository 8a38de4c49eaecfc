/* CUDA Attention through cuDNN's fused scaled dot-product attention (flash
 * attention on tensor cores), by its graph API (cudnn-frontend's `sdpa`
 * and `sdpa_backward`), behind a C interface (attention_graph.cpp holds the
 * C++). attention.cu runs it for bfloat16 calls that it supports and keeps
 * its own kernels for the rest.
 *
 * A problem is one Attention call in bfloat16: Q [B, H, Tq, D], K [B, H,
 * Tk, D], V [B, H, Tk, Dv], Y [B, H, Tq, Dv] as strided views (element
 * strides of batch, head and token; each head's values contiguous), so the
 * 3-D form [B, T, H * D] is passed in place. No mask, or the causal one
 * (key j kept for query i when j <= i: cuDNN's top-left diagonal). Float32
 * softmax statistics: lse [B, H, Tq], the natural logarithm of each row's
 * sum of exp(scaled score), as the own kernels save it. The gradients dQ,
 * dK, dV are written whole in bfloat16 with their inputs' strides.
 *
 * Built plans are kept per GPU and problem for the process's life; so is a
 * refusal, with its reason. */
#ifndef GP_CUDA_ATTENTION_GRAPH_H
#define GP_CUDA_ATTENTION_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cudnn.h>

#ifdef __cplusplus
extern "C" {
#endif

struct attn_graph_problem {
    int64_t batch, heads, q_len, kv_len, head_size, v_head_size;
    int64_t q_stride[3], k_stride[3], v_stride[3], y_stride[3]; /* batch, head, token */
    bool causal;
    float scale;
    /* The backward without atomics: the same bits run after run. cuDNN's
     * default backward sums dQ with atomics. */
    bool deterministic;
};

/* Whether cuDNN runs the problem, forward and backward, on the current
 * GPU: builds both plans (kept) and gives their workspaces. False, with
 * *why naming the cudnn-frontend call and its status, when either does not
 * build. */
bool attn_graph_supported(cudnnHandle_t h, const struct attn_graph_problem *p, size_t *fwd_ws, size_t *bwd_ws,
                          char *why, size_t why_size);

/* Forward on handle h's stream: y = attention(q, k, v) (bfloat16), lse
 * (float32 [B, H, Tq]). `ws`: the forward's workspace. */
bool attn_graph_forward(cudnnHandle_t h, const struct attn_graph_problem *p, const void *q, const void *k,
                        const void *v, void *y, float *lse, void *ws, char *why, size_t why_size);

/* Backward on handle h's stream: dq, dk, dv (bfloat16, the strides of q,
 * k, v) written whole from dy (the strides of y) and the forward's y and
 * lse. `ws`: the backward's workspace. */
bool attn_graph_backward(cudnnHandle_t h, const struct attn_graph_problem *p, const void *q, const void *k,
                         const void *v, const void *y, const void *dy, const float *lse, void *dq, void *dk,
                         void *dv, void *ws, char *why, size_t why_size);

#ifdef __cplusplus
}
#endif

#endif
