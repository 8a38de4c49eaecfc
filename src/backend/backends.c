/* The backends this build has (backend/backends.h). */
#include "backend/backends.h"

#include <string.h>

#ifdef GP_HAVE_CUDA
#include "backend/cuda/device.h"
#endif

const struct gp_device_ops *gp_backend_find(const char *name)
{
    if (strcmp(name, "cpu") == 0) return &gp_cpu_device_ops;
#ifdef GP_HAVE_CUDA
    if (strcmp(name, "cuda") == 0) return &gp_cuda_device_ops;
#endif
    return NULL;
}
