/* What CUDA sees: devices, and the versions of the runtime, cuBLAS and cuDNN
 * this program was linked with. The proof that the CUDA build is wired. */
#ifndef GP_CUDA_DEVICE_QUERY_H
#define GP_CUDA_DEVICE_QUERY_H

#include <stddef.h>

#include "util/error.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gp_cuda_device {
    char name[256];
    int major, minor;          /* compute capability */
    size_t total_bytes, free_bytes;
    int multiprocessors;
};

struct gp_cuda_versions {
    int runtime, driver, cublas;
    size_t cudnn;
};

/* Library versions; works without any GPU. */
gp_status gp_cuda_versions(struct gp_cuda_versions *out, struct gp_error *err);
/* Fills up to `max` devices; *count gets how many exist (0 without a GPU or
 * driver, which is not an error). Makes a context on each device it fills
 * (for its free memory): a process that will compute on one GPU asks
 * gp_cuda_device_count instead. */
gp_status gp_cuda_devices(struct gp_cuda_device *out, int max, int *count, struct gp_error *err);

/* How many GPUs this process sees (0 without a GPU or driver), making no
 * context on any of them. */
int gp_cuda_device_count(void);
/* GPU `index`'s UUID (the same in every process, whatever each one's
 * CUDA_VISIBLE_DEVICES calls it), making no context. */
gp_status gp_cuda_device_uuid(int index, unsigned char uuid[16], struct gp_error *err);

#ifdef __cplusplus
}
#endif

#endif
