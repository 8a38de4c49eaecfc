/* Kernel lookup and launch checks for the CUDA backend (cuda/kernel.h). */
#include <string.h>

#include <cuda_runtime.h>

#include "cuda/kernel.h"

extern "C" {
#include "util/error.h"
}

/* One table per family file, searched in order, as the CPU backend does. */
static const struct gp_cuda_kernel *const tables[] = {
    gp_cuda_kernels_elementwise,
};

extern "C" const struct gp_cuda_kernel *gp_cuda_kernel_for(const struct gp_node *node)
{
    if (*node->domain && strcmp(node->domain, "ai.onnx") != 0) return NULL;
    for (size_t t = 0; t < sizeof tables / sizeof *tables; t++)
        for (const struct gp_cuda_kernel *k = tables[t]; k->op_type; k++)
            if (strcmp(k->op_type, node->op_type) == 0) return k;
    return NULL;
}

/* cudaGetLastError also clears a launch error, so the next kernel is not
 * blamed for this one. Asynchronous faults (a bad address inside a kernel)
 * surface later, at the stream's synchronize, not here. */
extern "C" gp_status gp_cuda_check_launch(const struct gp_cuda_ctx *c, const char *what,
                                          struct gp_error *err)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return GP_OK;
    return gp_error_set(err, GP_ERR_DEVICE, "node '%s' (%s): %s: %s", c->node->name,
                        c->node->op_type, what, cudaGetErrorString(e));
}
