#include "backend/cuda/device_query.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <string.h>

extern "C" gp_status gp_cuda_versions(struct gp_cuda_versions *out, struct gp_error *err)
{
    memset(out, 0, sizeof *out);
    cudaRuntimeGetVersion(&out->runtime);
    /* The driver version is 0 when no driver is installed: not an error. */
    cudaDriverGetVersion(&out->driver);
    cublasStatus_t st = cublasGetVersion_v2(NULL, &out->cublas);
    (void)st;
    out->cudnn = cudnnGetVersion();
    (void)err;
    return GP_OK;
}

extern "C" gp_status gp_cuda_devices(struct gp_cuda_device *out, int max, int *count,
                                     struct gp_error *err)
{
    *count = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
        cudaGetLastError(); /* clear the sticky status for later calls */
        return GP_OK;
    }
    if (e != cudaSuccess)
        return gp_error_set(err, GP_ERR_DEVICE, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
    *count = n;
    for (int i = 0; i < n && i < max; i++) {
        cudaDeviceProp p;
        e = cudaGetDeviceProperties(&p, i);
        if (e != cudaSuccess)
            return gp_error_set(err, GP_ERR_DEVICE, "cudaGetDeviceProperties(%d): %s", i,
                                cudaGetErrorString(e));
        struct gp_cuda_device *d = &out[i];
        memset(d, 0, sizeof *d);
        memcpy(d->name, p.name, sizeof d->name - 1); /* zeroed above: stays terminated */
        d->major = p.major;
        d->minor = p.minor;
        d->multiprocessors = p.multiProcessorCount;
        d->total_bytes = p.totalGlobalMem;
        if (cudaSetDevice(i) == cudaSuccess) {
            size_t fr = 0, tot = 0;
            if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) d->free_bytes = fr;
        }
    }
    return GP_OK;
}

extern "C" int gp_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no GPU or no driver: not sticky for later calls */
        return 0;
    }
    return n;
}

extern "C" gp_status gp_cuda_device_uuid(int index, unsigned char uuid[16], struct gp_error *err)
{
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, index);
    if (e != cudaSuccess)
        return gp_error_set(err, GP_ERR_DEVICE, "cudaGetDeviceProperties(%d): %s", index, cudaGetErrorString(e));
    memcpy(uuid, p.uuid.bytes, 16);
    return GP_OK;
}
