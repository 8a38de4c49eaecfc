/* Scaled dot-product attention (ONNX Attention, opset 23): the plan both
 * backends' kernels read, so that they agree on every stride.
 *
 *   Y = softmax(scale * Q K^T + mask) V      per batch and head
 *
 * Q, K, V come in one of ONNX's two forms: 4-D [B, H, T, D], or 3-D
 * [B, T, H * D] with the head count in q_num_heads / kv_num_heads. The
 * kernels take both as strided views (batch, head and token strides; the
 * head's D values contiguous), so the 3-D form (what the attention fusion
 * writes: the exporters' head split and merge absorbed) needs no copy. Y
 * has Q's form with V's head size.
 *
 * Packed (gp_node.packed_qkv, set by the attention fusion where GPT-2's
 * Split of one [B, T, 3 * C] projection made Q, K and V): input 0 holds
 * all three, Q, K, V being its thirds along the last axis (offsets 0, C,
 * 2 * C into each token's row of 3 * C), and their gradients are written
 * into input 0's gradient, each third as the separate gradient would be.
 *
 * The mask, optional, broadcasts to [B, H, Tq, Tk] (right-aligned, stride 0
 * on its axes of size 1): float values are added to the scaled scores, bool
 * values say which keys a query attends to (true: keep). is_causal keeps key
 * j for query i when j <= i (the upper-left alignment of opset 23). A query
 * that attends to no key at all gets Y = 0 and no gradient (where the
 * unfused chain would give NaN). */
#ifndef GP_OPS_ATTENTION_H
#define GP_OPS_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "graph/graph.h"

enum gp_attention_mask { GP_ATTN_MASK_NONE = 0, GP_ATTN_MASK_ADD, GP_ATTN_MASK_BOOL };

struct gp_attention_plan {
    int64_t batch, heads, q_len, kv_len, head_size, v_head_size;
    /* Element strides: [0] batch, [1] head, [2] token. */
    int64_t q_stride[3], k_stride[3], v_stride[3], y_stride[3];
    /* Where Q, K, V begin in their input (elements); 0 unless packed. */
    int64_t q_offset, k_offset, v_offset;
    /* Element strides over [batch, head, query, key]; 0 where broadcast. */
    int64_t mask_stride[4];
    enum gp_attention_mask mask;
    bool causal;
    bool three_d;
    bool packed; /* Q, K, V all in input 0 (gp_node.packed_qkv) */
    float scale;
};

/* The input holding Q (k = 0), K (1) or V (2): input 0 for all three when
 * packed. */
static inline int gp_attention_qkv_input(const struct gp_attention_plan *p, int k) { return p->packed ? 0 : k; }

/* The plan of a node whose shapes were inferred (so valid). */
void gp_attention_plan(const struct gp_graph *g, const struct gp_node *node, struct gp_attention_plan *p);

#endif
