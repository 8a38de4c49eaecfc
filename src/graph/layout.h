/* Channels-last storage: which activations lie in memory as [N, H, W, C]
 * while their shape (and every kernel's view of the graph) says
 * [N, C, H, W] (gp_value.channels_last).
 *
 * Why: cuDNN's fast convolution kernels (tensor cores, bfloat16 and TF32)
 * compute in NHWC. Fed NCHW tensors they transpose them in and out on
 * every call: 6.9 of ResNet-50's 38 ms of GPU time per step at batch 128
 * in bfloat16 on an H200, which is what PyTorch's channels_last removes.
 *
 * The layout pass (gp_graph_channels_last) tags, in layer order, the
 * output of every 2-D Conv, and the output of every op that follows its
 * input's layout (BatchNormalization, InstanceNormalization, Dropout,
 * Resize, MaxPool, Concat and the layout-neutral ops below) when its
 * inputs are tagged; a value is tagged only where each of
 * its readers reads channels-last cheaply (another such op, or
 * GlobalAveragePool), and never a graph input or output, which stay as
 * the model says. Nothing else changes: shapes, the layer list, the saved
 * model and the frontiers between stages (bytes) are the same.
 *
 * Kernels see a call's layouts (gp_layer_call.in_nhwc, out_nhwc) only when
 * they read them themselves (gp_compute_ops.layout_native: on the GPU the
 * convolutions, BatchNormalization, InstanceNormalization, Dropout,
 * Resize, MaxPool, Concat and GlobalAveragePool), or when the op is
 * layout-neutral and the call's layouts agree (gp_layout_neutral_call). Every other call
 * gets [N, C, H, W] float32 copies (backend/mixed_call.h), so every kernel
 * stays correct on tagged values, and the CPU backend, which reads no
 * layout itself, trains a tagged graph to the same bits as an untagged
 * one: it is the reference the GPU's channels-last kernels are tested
 * against. */
#ifndef GP_GRAPH_LAYOUT_H
#define GP_GRAPH_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "graph/graph.h"

/* When to store activations channels-last (train/predict/balance
 * --layout): auto (on GPUs: yes; on CPUs, which gain nothing, no), nchw
 * (never), nhwc (wherever the pass finds a place, on any device). */
enum gp_layout_policy { GP_LAYOUT_AUTO, GP_LAYOUT_NCHW, GP_LAYOUT_NHWC };
bool gp_layout_policy_parse(const char *s, enum gp_layout_policy *out); /* false: not a policy */
const char *gp_layout_policy_name(enum gp_layout_policy p);
/* Whether the policy asks for the pass on these devices (all GPUs or not). */
bool gp_layout_policy_on(enum gp_layout_policy p, bool all_gpus);

/* Whether the op computes each output element from the elements at the
 * same position of its inputs (a scalar input broadcast), so that it runs
 * on tensors of any one layout as they lie: the activations, the
 * arithmetic ops, Clip, Cast, Identity, Where. Not Dropout (its mask
 * depends on the position). */
bool gp_layout_neutral_op(const struct gp_node *node);

/* Whether a call of a neutral op with these layouts (bit k of in_nhwc:
 * input k channels-last; out_nhwc the same for outputs) runs as the
 * tensors lie: every layout agrees, or every input and output that is
 * channels-last or not a scalar is channels-last with output 0's shape. */
bool gp_layout_neutral_call(const struct gp_graph *g, const struct gp_node *node, uint32_t in_nhwc,
                            uint32_t out_nhwc);

/* The call's layout masks from the graph's tags. */
uint32_t gp_layout_in_mask(const struct gp_graph *g, const struct gp_node *node);
uint32_t gp_layout_out_mask(const struct gp_graph *g, const struct gp_node *node);

/* Tags the graph's values channels-last as the header says (clearing any
 * earlier tags first); returns how many it tagged. */
int gp_graph_channels_last(struct gp_graph *g);
/* After the pass: why value v stays [N, C, H, W] although its producer
 * could write it channels-last (a 2-D Conv, a follower, a Concat): one
 * line into buf ("a graph output", "read by Softmax 'sm' (input 0), which
 * reads [N, C, H, W]", "read by LeakyRelu 'r', whose output stays
 * [N, C, H, W]", "its input 'x' is [N, C, H, W]"). False, buf untouched,
 * for a tagged value or one whose producer is none of those. */
bool gp_layout_why_not(const struct gp_graph *g, int v, char *buf, size_t size);
/* Clears every tag. */
void gp_graph_clear_layout(struct gp_graph *g);
/* How many values are tagged. */
int gp_graph_channels_last_count(const struct gp_graph *g);

#endif
