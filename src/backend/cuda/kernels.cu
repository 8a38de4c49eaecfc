/* Kernel lookup and launch checks for the CUDA backend (cuda/kernel.h). */
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "backend/cuda/kernel.h"

extern "C" {
#include "util/error.h"
}

/* One table per family file, searched in order, as the CPU backend does. */
static const struct gp_cuda_kernel *const tables[] = {
    gp_cuda_kernels_elementwise,
    gp_cuda_kernels_binary,
    gp_cuda_kernels_shape,
    gp_cuda_kernels_gather,
    gp_cuda_kernels_pad,
    gp_cuda_kernels_matmul,
    gp_cuda_kernels_conv,
    gp_cuda_kernels_pool,
    gp_cuda_kernels_batch_norm,
    gp_cuda_kernels_instance_norm,
    gp_cuda_kernels_layer_norm,
    gp_cuda_kernels_softmax,
    gp_cuda_kernels_reduce,
    gp_cuda_kernels_dropout,
    gp_cuda_kernels_resize,
    gp_cuda_kernels_attention,
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

extern "C" gp_status gp_cuda_error(const struct gp_cuda_ctx *c, struct gp_error *err, gp_status status,
                                   const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return gp_error_set(err, status, "node '%s' (%s): %s", c->node->name, c->node->op_type, msg);
}

extern "C" gp_status gp_cuda_libs_create(cudaStream_t stream, bool tf32, void *workspace,
                                         struct gp_cuda_libs *out, struct gp_error *err)
{
    memset(out, 0, sizeof *out);
    cublasHandle_t h = NULL;
    cublasStatus_t bs = cublasCreate(&h);
    if (bs != CUBLAS_STATUS_SUCCESS)
        return gp_error_set(err, GP_ERR_DEVICE, "cublasCreate: %s", cublasGetStatusString(bs));
    out->cublas = h;
    out->cublas_workspace = workspace;
    if (!workspace) {
        cudaError_t ce = cudaMalloc(&out->cublas_workspace, GP_CUDA_LIBS_WORKSPACE_BYTES);
        if (ce != cudaSuccess) {
            out->cublas_workspace = NULL;
            gp_cuda_libs_destroy(out);
            return gp_error_set(err, GP_ERR_NOMEM, "cuBLAS workspace (%zu MiB): %s",
                                GP_CUDA_LIBS_WORKSPACE_BYTES >> 20, cudaGetErrorString(ce));
        }
        out->owns_workspace = true;
    }
    if ((bs = cublasSetStream(h, stream)) != CUBLAS_STATUS_SUCCESS ||
        (bs = cublasSetWorkspace(h, out->cublas_workspace, GP_CUDA_LIBS_WORKSPACE_BYTES)) !=
            CUBLAS_STATUS_SUCCESS ||
        (bs = cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH)) !=
            CUBLAS_STATUS_SUCCESS) {
        gp_cuda_libs_destroy(out);
        return gp_error_set(err, GP_ERR_DEVICE, "cuBLAS setup: %s", cublasGetStatusString(bs));
    }
    cudnnHandle_t d = NULL;
    cudnnStatus_t ds = cudnnCreate(&d);
    if (ds == CUDNN_STATUS_SUCCESS) {
        out->cudnn = d;
        ds = cudnnSetStream(d, stream);
    }
    if (ds != CUDNN_STATUS_SUCCESS) {
        gp_cuda_libs_destroy(out);
        return gp_error_set(err, GP_ERR_DEVICE, "cuDNN setup: %s", cudnnGetErrorString(ds));
    }
    return GP_OK;
}

extern "C" void gp_cuda_libs_destroy(struct gp_cuda_libs *libs)
{
    if (libs->cudnn) cudnnDestroy((cudnnHandle_t)libs->cudnn);
    if (libs->cublas) cublasDestroy((cublasHandle_t)libs->cublas);
    if (libs->cublas_workspace && libs->owns_workspace) cudaFree(libs->cublas_workspace);
    memset(libs, 0, sizeof *libs);
}
