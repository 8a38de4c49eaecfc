/* Channels-last storage: the layout pass and the layout-neutral ops
 * (graph/layout.h). */
#include "graph/layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool gp_layout_policy_parse(const char *s, enum gp_layout_policy *out)
{
    if (!strcmp(s, "auto")) *out = GP_LAYOUT_AUTO;
    else if (!strcmp(s, "nchw")) *out = GP_LAYOUT_NCHW;
    else if (!strcmp(s, "nhwc") || !strcmp(s, "channels-last")) *out = GP_LAYOUT_NHWC;
    else return false;
    return true;
}

const char *gp_layout_policy_name(enum gp_layout_policy p)
{
    return p == GP_LAYOUT_NCHW ? "nchw" : p == GP_LAYOUT_NHWC ? "nhwc" : "auto";
}

bool gp_layout_policy_on(enum gp_layout_policy p, bool all_gpus)
{
    return p == GP_LAYOUT_NHWC || (p == GP_LAYOUT_AUTO && all_gpus);
}

static bool default_domain(const struct gp_node *n) { return !*n->domain || !strcmp(n->domain, "ai.onnx"); }

bool gp_layout_neutral_op(const struct gp_node *node)
{
    static const char *const ops[] = {
        "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Erf", "Gelu", "Sqrt", "Neg", "Exp", "Log", "Abs",
        "Reciprocal", "Softplus", "Elu", "HardSigmoid", "HardSwish", "Floor", "Ceil", "Round", "Sign",
        "Clip", "Cast", "CastLike", "Identity", "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum",
        "Mean", "Where",
    };
    if (!default_domain(node)) return false;
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
        if (!strcmp(node->op_type, ops[i])) return true;
    return false;
}

static bool bit(uint32_t m, int k) { return k < 32 && ((m >> k) & 1); }

bool gp_layout_neutral_call(const struct gp_graph *g, const struct gp_node *node, uint32_t in_nhwc,
                            uint32_t out_nhwc)
{
    if (!in_nhwc && !out_nhwc) return true;
    if (!gp_layout_neutral_op(node) || node->n_outputs < 1 || node->outputs[0] < 0 || node->n_inputs > 32 ||
        node->n_outputs > 32)
        return false;
    const struct gp_shape *shape = &g->values[node->outputs[0]].shape;
    for (int k = 0; k < node->n_outputs; k++) {
        int v = node->outputs[k];
        if (v >= 0 && (!bit(out_nhwc, k) || !gp_shape_equal(&g->values[v].shape, shape))) return false;
    }
    for (int k = 0; k < node->n_inputs; k++) {
        int v = node->inputs[k];
        if (v < 0) continue;
        if (bit(in_nhwc, k) ? !gp_shape_equal(&g->values[v].shape, shape) : gp_shape_numel(&g->values[v].shape) != 1)
            return false;
    }
    return true;
}

uint32_t gp_layout_in_mask(const struct gp_graph *g, const struct gp_node *node)
{
    uint32_t m = 0;
    for (int k = 0; k < node->n_inputs && k < 32; k++)
        if (node->inputs[k] >= 0 && g->values[node->inputs[k]].channels_last) m |= 1u << k;
    return m;
}

uint32_t gp_layout_out_mask(const struct gp_graph *g, const struct gp_node *node)
{
    uint32_t m = 0;
    for (int k = 0; k < node->n_outputs && k < 32; k++)
        if (node->outputs[k] >= 0 && g->values[node->outputs[k]].channels_last) m |= 1u << k;
    return m;
}

/* ---- the pass ---- */

static bool is_op(const struct gp_node *n, const char *op) { return default_domain(n) && !strcmp(n->op_type, op); }

/* A value the pass may tag: a float activation of rank 4 computed by a
 * node, not a graph output. */
static bool taggable(const struct gp_graph *g, int v)
{
    if (v < 0) return false;
    const struct gp_value *val = &g->values[v];
    return val->kind == GP_VALUE_ACTIVATION && val->producer >= 0 && val->has_shape && val->shape.rank == 4 &&
           val->dtype == GP_DTYPE_FLOAT32 && !val->is_output;
}

/* Conv over 2 spatial axes: the op whose output starts channels-last. */
static bool is_conv2d(const struct gp_graph *g, const struct gp_node *n)
{
    return is_op(n, "Conv") && n->n_inputs >= 2 && n->inputs[0] >= 0 && g->values[n->inputs[0]].shape.rank == 4;
}

/* An op whose output 0 follows input 0's layout and which reads that
 * layout itself: BatchNormalization, InstanceNormalization, Dropout (its
 * mask, if any, stays [N, C, H, W]: it is drawn and stored by each
 * element's [N, C, H, W] position in either layout), Resize and Upsample
 * of rank 4 (their scales, sizes and roi are no images), MaxPool over 2
 * axes without its indices output. */
static bool follows_input0(const struct gp_graph *g, const struct gp_node *n)
{
    if (is_op(n, "BatchNormalization")) return true;
    bool rank4 = n->n_inputs >= 1 && n->inputs[0] >= 0 && g->values[n->inputs[0]].shape.rank == 4;
    if (is_op(n, "InstanceNormalization") || is_op(n, "Dropout") || is_op(n, "Resize") || is_op(n, "Upsample"))
        return rank4;
    if (is_op(n, "MaxPool")) return n->n_outputs == 1 && rank4;
    return false;
}

/* A Concat of rank-4 tensors: its output is channels-last when every
 * input is (each tensor is read or written through its own strides, so a
 * Concat along any axis costs the same either way). */
static bool concat4(const struct gp_graph *g, const struct gp_node *n)
{
    if (!is_op(n, "Concat") || n->n_outputs != 1 || n->outputs[0] < 0 ||
        g->values[n->outputs[0]].shape.rank != 4)
        return false;
    for (int k = 0; k < n->n_inputs; k++)
        if (n->inputs[k] < 0 || g->values[n->inputs[k]].shape.rank != 4) return false;
    return true;
}

/* Whether node n reads value v (as input k) channels-last as it lies:
 * a Conv's image, a follower's input 0 (a Dropout's ratio and
 * training_mode, InstanceNormalization's scale and bias are no images)
 * and a BatchNormalization's fused residual (gp_node.fused_add, input 5,
 * which lies as input 0 does), any input of a neutral op, and
 * GlobalAveragePool, whose [N, C, 1, 1] output is the same memory in
 * both layouts (it reads its input through a cheap [N, C, H, W] copy, or
 * as it lies). */
static bool reads_channels_last(const struct gp_graph *g, const struct gp_node *n, int k)
{
    if (is_conv2d(g, n)) return k == 0;
    if (follows_input0(g, n)) return k == 0 || (n->fused_add && k == 5);
    return gp_layout_neutral_op(n) || is_op(n, "GlobalAveragePool") || concat4(g, n);
}

/* agree[v]: value v has readers and each reads it channels-last;
 * blocker[v]: the first reader that does not. */
static bool *readers_agree(const struct gp_graph *g, int *blocker)
{
    bool *agree = calloc((size_t)g->n_values + 1, sizeof *agree), *refused = calloc((size_t)g->n_values + 1, 1);
    if (!agree || !refused) {
        free(agree);
        free(refused);
        return NULL;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const struct gp_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_inputs; k++) {
            int v = n->inputs[k];
            if (v < 0) continue;
            if (reads_channels_last(g, n, k)) {
                agree[v] = true;
            } else if (!refused[v]) {
                refused[v] = true;
                blocker[v] = i;
            }
        }
    }
    for (int v = 0; v < g->n_values; v++) agree[v] &= !refused[v];
    free(refused);
    return agree;
}

/* Whether node n computes its output channels-last from its inputs' tags. */
static bool makes_channels_last(const struct gp_graph *g, const struct gp_node *n)
{
    if (n->n_outputs < 1 || !taggable(g, n->outputs[0])) return false;
    if (is_conv2d(g, n)) return true;
    /* A fused residual (gp_node.fused_add) lies as input 0 does, or neither is read so. */
    if (follows_input0(g, n))
        return g->values[n->inputs[0]].channels_last && (!n->fused_add || g->values[n->inputs[5]].channels_last);
    if (concat4(g, n)) {
        for (int k = 0; k < n->n_inputs; k++)
            if (!g->values[n->inputs[k]].channels_last) return false;
        return true;
    }
    if (!gp_layout_neutral_op(n)) return false;
    /* Every input channels-last or a scalar, at least one channels-last. */
    bool any = false;
    for (int k = 0; k < n->n_inputs; k++) {
        int v = n->inputs[k];
        if (v < 0) continue;
        if (g->values[v].channels_last) any = true;
        else if (gp_shape_numel(&g->values[v].shape) != 1) return false;
    }
    return any;
}

void gp_graph_clear_layout(struct gp_graph *g)
{
    for (int v = 0; v < g->n_values; v++) g->values[v].channels_last = false, g->values[v].layout_blocker = -1;
}

int gp_graph_channels_last_count(const struct gp_graph *g)
{
    int count = 0;
    for (int v = 0; v < g->n_values; v++) count += g->values[v].channels_last;
    return count;
}

/* Withdraws agreement from every tagged value that a reader reads
 * through copies after all: a neutral op whose other operand is broadcast
 * or untagged, or whose own output is untagged; a Concat whose output is
 * untagged (an input untagged, or the output refused by its readers); a
 * follower (BatchNorm, MaxPool, ...) whose output is untagged, whose
 * kernels read both or neither channels-last (its input's producer writes
 * [N, C, H, W] then, which a convolution does at the cost of one
 * transpose, where the follower on copies would pay for four). True when
 * any was withdrawn. */
static bool withdraw(const struct gp_graph *g, bool *agree, int *blocker)
{
    bool changed = false;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct gp_node *n = &g->nodes[i];
        if (follows_input0(g, n)) {
            for (int k = 0; k <= (n->fused_add ? 5 : 0); k += 5) { /* input 0, and a fused residual */
                int x = n->inputs[k];
                if (x >= 0 && g->values[x].channels_last && agree[x] && !g->values[n->outputs[0]].channels_last) {
                    agree[x] = false;
                    blocker[x] = i;
                    changed = true;
                }
            }
            continue;
        }
        if (concat4(g, n)) { /* all its tensors tagged, or none */
            bool out = g->values[n->outputs[0]].channels_last;
            for (int k = 0; k < n->n_inputs; k++) {
                int v = n->inputs[k];
                if (g->values[v].channels_last && agree[v] && !out) {
                    agree[v] = false;
                    blocker[v] = i;
                    changed = true;
                }
            }
            continue;
        }
        if (!gp_layout_neutral_op(n)) continue;
        if (gp_layout_neutral_call(g, n, gp_layout_in_mask(g, n), gp_layout_out_mask(g, n))) continue;
        for (int k = 0; k < n->n_inputs; k++) {
            int v = n->inputs[k];
            if (v >= 0 && g->values[v].channels_last && agree[v]) {
                agree[v] = false;
                blocker[v] = i;
                changed = true;
            }
        }
    }
    return changed;
}

int gp_graph_channels_last(struct gp_graph *g)
{
    int *blocker = malloc(sizeof(int) * ((size_t)g->n_values + 1));
    for (int v = 0; blocker && v < g->n_values; v++) blocker[v] = -1;
    bool *agree = blocker ? readers_agree(g, blocker) : NULL;
    if (!agree) {
        free(blocker);
        gp_graph_clear_layout(g);
        return 0; /* out of memory: the graph stays as the model says */
    }
    /* Agreement only shrinks: at most one round per value. */
    do {
        gp_graph_clear_layout(g);
        /* Layer order is topological: a node's inputs are decided before it. */
        for (int i = 0; i < g->n_nodes; i++) {
            const struct gp_node *n = &g->nodes[i];
            if (!makes_channels_last(g, n)) continue;
            for (int k = 0; k < n->n_outputs; k++) {
                int v = n->outputs[k];
                if (k > 0 && !(gp_layout_neutral_op(n) && taggable(g, v))) continue;
                if (agree[v]) g->values[v].channels_last = true;
            }
        }
    } while (withdraw(g, agree, blocker));
    for (int v = 0; v < g->n_values; v++) g->values[v].layout_blocker = blocker[v];
    free(agree);
    free(blocker);
    return gp_graph_channels_last_count(g);
}

/* ---- why a value stays [N, C, H, W] ---- */

/* Whether node p's output descends from a 2-D Conv's through followers,
 * Concats and neutral ops: an image the pass could have tagged (not,
 * say, a transformer's [B, heads, T, T] attention weights). */
static bool could_be_tagged(const struct gp_graph *g, const struct gp_node *p, int depth)
{
    if (is_conv2d(g, p)) return true;
    bool follower = follows_input0(g, p);
    if (depth > 64 || !(follower || concat4(g, p) || gp_layout_neutral_op(p))) return false;
    for (int k = 0; k < (follower ? 1 : p->n_inputs); k++) {
        int x = p->inputs[k];
        int q = x >= 0 ? g->values[x].producer : -1;
        if (q >= 0 && could_be_tagged(g, &g->nodes[q], depth + 1)) return true;
    }
    return false;
}

bool gp_layout_why_not(const struct gp_graph *g, int v, char *buf, size_t size)
{
    if (v < 0 || v >= g->n_values || g->values[v].channels_last || g->values[v].producer < 0) return false;
    const struct gp_value *val = &g->values[v];
    const struct gp_node *p = &g->nodes[val->producer];
    if (p->n_outputs < 1 || p->outputs[0] != v || !could_be_tagged(g, p, 0)) return false;
    if (val->kind != GP_VALUE_ACTIVATION || !val->has_shape || val->shape.rank != 4 ||
        val->dtype != GP_DTYPE_FLOAT32) {
        snprintf(buf, size, "not a float32 activation of rank 4");
        return true;
    }
    if (val->is_output) {
        snprintf(buf, size, "a graph output (kept as the model says)");
        return true;
    }
    /* The reader that refused it or withdrew it (the pass's record). */
    int b = val->layout_blocker;
    if (b >= 0 && b < g->n_nodes) {
        const struct gp_node *n = &g->nodes[b];
        int k = 0;
        while (k < n->n_inputs && n->inputs[k] != v) k++;
        if (!reads_channels_last(g, n, k))
            snprintf(buf, size, "read by %s '%s' (input %d), which reads [N, C, H, W]", n->op_type, n->name, k);
        else
            snprintf(buf, size, "read by %s '%s', whose output stays [N, C, H, W]", n->op_type, n->name);
        return true;
    }
    /* Else its producer had an input [N, C, H, W] (a Conv always makes
     * channels-last; its readers agreed). */
    for (int k = 0; k < p->n_inputs; k++) {
        int x = p->inputs[k];
        if (x >= 0 && g->values[x].shape.rank == 4 && !g->values[x].channels_last &&
            (!follows_input0(g, p) || k == 0)) {
            snprintf(buf, size, "its input '%s' is [N, C, H, W]", g->values[x].name);
            return true;
        }
    }
    snprintf(buf, size, "no reader");
    return true;
}
