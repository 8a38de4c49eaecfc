/* gp_backward_reads: the table, checked against both backends' backward
 * kernels (backend/cpu/, cuda/): each entry says what they read. */
#include "ops/backward_reads.h"

#include <string.h>

#define ALL 0xffffffffu
#define BIT(k) (1u << (k))

static bool is(const struct gp_node *n, const char *const *names)
{
    for (; *names; names++)
        if (strcmp(n->op_type, *names) == 0) return true;
    return false;
}

bool gp_unary_grad_reads(const struct gp_node *n, bool *x, bool *y)
{
    static const char *const from_y[] = {"Sigmoid", "Tanh", "Sqrt", "Exp", "Reciprocal", NULL};
    static const char *const from_x[] = {"Erf", "Gelu", "Log", "Abs", "Softplus", "Elu", "HardSigmoid",
                                         "HardSwish", NULL};
    *x = *y = false;
    if (*n->domain && strcmp(n->domain, "ai.onnx") != 0) return false;
    if (strcmp(n->op_type, "Relu") == 0) {
        *y = true;
    } else if (strcmp(n->op_type, "LeakyRelu") == 0) {
        bool y_sign = gp_node_attr_float(n, "alpha", 0.01f) >= 0;
        *y = y_sign;
        *x = !y_sign;
    } else if (is(n, from_y)) {
        *y = true;
    } else if (is(n, from_x)) {
        *x = true;
    } else if (strcmp(n->op_type, "Neg") != 0) {
        return false;
    }
    return true;
}

void gp_backward_reads(const struct gp_node *n, uint32_t din, uint32_t *in, uint32_t *out)
{
    *in = ALL;
    *out = ALL;
    if (*n->domain && strcmp(n->domain, "ai.onnx") != 0) return;
    /* Data movement and sums: the gradient is routed by shapes and
     * attributes; the shape-like inputs after the data (Reshape's shape,
     * Slice's starts, Gather's indices, Resize's scales, Dropout's ratio)
     * are read. */
    static const char *const route[] = {"Identity", "Reshape",  "Flatten", "Squeeze", "Unsqueeze", "Transpose",
                                        "Concat",   "Split",    "Slice",   "Gather",  "Expand",    "Tile",
                                        "Pad",      "Cast",     "CastLike", "Dropout", "Resize",   "Upsample",
                                        "GlobalAveragePool", "AveragePool", "Add", "Sub", NULL};
    if (is(n, route)) {
        /* Concat's and Add's inputs are all data: none is read. */
        bool all_data = strcmp(n->op_type, "Concat") == 0 || strcmp(n->op_type, "Add") == 0 ||
                        strcmp(n->op_type, "Sub") == 0;
        *in = all_data ? 0 : ALL & ~BIT(0);
        /* A fused Relu's mask is its output's sign (graph/fuse.c). */
        *out = n->fused_relu ? BIT(0) : 0;
        return;
    }
    /* BatchNormalization's gradients read its input (and the statistics
     * the forward saved for them, the kernel's own), its output only as a
     * fused Relu's mask with a fused residual Add (the sum's sign): a fused
     * Relu's mask alone is told from the input, x alpha + beta as the
     * forward computed it and stored it (the saved statistics' alpha and
     * beta). So a normalized output read by nothing but a MaxPool (ResNet's
     * stem) is not kept. Conv's and ConvTranspose's read the input and the
     * weights, never the output. A convolution's output read by nothing
     * else (ResNet's last normalization of a block, before its residual
     * Add; a U-Net's convolution before Dropout) then lives only until its
     * last reader's forward. */
    if (strcmp(n->op_type, "BatchNormalization") == 0) {
        *out = n->fused_relu && n->fused_add ? BIT(0) : 0;
        /* A fused residual (fused_add, input 5) is data its gradient does
         * not read, as the Add's did not. */
        if (n->fused_add) *in = ALL & ~BIT(5);
        return;
    }
    if (strcmp(n->op_type, "Conv") == 0 || strcmp(n->op_type, "ConvTranspose") == 0) {
        *out = 0;
        return;
    }
    /* MaxPool's gradient goes to each window's argmax, which its forward
     * saved (both backends): it reads neither X nor Y (nor Indices). */
    if (strcmp(n->op_type, "MaxPool") == 0) {
        *in = 0;
        *out = 0;
        return;
    }
    /* InstanceNormalization's gradients read its input and the statistics
     * the forward saved, never its output. */
    if (strcmp(n->op_type, "InstanceNormalization") == 0) {
        *out = 0;
        return;
    }
    /* The unary activations: as gp_unary_grad_reads says (a U-Net's
     * LeakyRelu reads its output, which the next convolution keeps anyway,
     * so the InstanceNorm output before it lives only through the forward). */
    bool x, y;
    if (gp_unary_grad_reads(n, &x, &y)) {
        *in = x ? BIT(0) : 0;
        *out = y ? BIT(0) : 0;
        return;
    }
    /* Softmax' gradient is a function of its output alone. */
    if (strcmp(n->op_type, "Softmax") == 0 || strcmp(n->op_type, "LogSoftmax") == 0) {
        *in = 0;
        *out = BIT(0);
        return;
    }
    /* Where routes by the condition. */
    if (strcmp(n->op_type, "Where") == 0) {
        *in = BIT(0);
        *out = 0;
        return;
    }
    /* Products: each factor's gradient needs the other factor; a quotient's
     * divisor gradient needs both. */
    if (strcmp(n->op_type, "Mul") == 0 || strcmp(n->op_type, "MatMul") == 0 ||
        strcmp(n->op_type, "Gemm") == 0) {
        *in = ((din & BIT(0)) ? BIT(1) : 0) | ((din & BIT(1)) ? BIT(0) : 0);
        *out = 0;
        return;
    }
    if (strcmp(n->op_type, "Div") == 0) {
        *in = ((din & BIT(0)) ? BIT(1) : 0) | ((din & BIT(1)) ? BIT(0) | BIT(1) : 0);
        *out = 0;
        return;
    }
}
