/* Kernel lookup for the CPU backend (compiled once per `real` type). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "backend/cpu/kernel.h"

static const struct gp_cpu_kernel *const tables[] = {
    GP_CPU(gp_cpu_kernels_elementwise),
    GP_CPU(gp_cpu_kernels_binary),
    GP_CPU(gp_cpu_kernels_shape),
    GP_CPU(gp_cpu_kernels_gather),
    GP_CPU(gp_cpu_kernels_pad),
    GP_CPU(gp_cpu_kernels_matmul),
    GP_CPU(gp_cpu_kernels_conv),
    GP_CPU(gp_cpu_kernels_pool),
    GP_CPU(gp_cpu_kernels_batch_norm),
    GP_CPU(gp_cpu_kernels_instance_norm),
    GP_CPU(gp_cpu_kernels_layer_norm),
    GP_CPU(gp_cpu_kernels_softmax),
    GP_CPU(gp_cpu_kernels_reduce),
    GP_CPU(gp_cpu_kernels_dropout),
    GP_CPU(gp_cpu_kernels_resize),
    GP_CPU(gp_cpu_kernels_attention),
};

const struct gp_cpu_kernel *GP_CPU(gp_cpu_kernel_for)(const struct gp_node *node)
{
    if (*node->domain && strcmp(node->domain, "ai.onnx") != 0) return NULL;
    for (size_t t = 0; t < sizeof tables / sizeof *tables; t++)
        for (const struct gp_cpu_kernel *k = tables[t]; k->op_type; k++)
            if (strcmp(k->op_type, node->op_type) == 0) return k;
    return NULL;
}

gp_status GP_CPU(gp_cpu_error)(const struct gp_cpu_ctx *c, struct gp_error *err, gp_status status,
                               const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return gp_error_set(err, status, "node '%s' (%s): %s", c->node->name, c->node->op_type, msg);
}
