/* The CUDA backend of the device interface (backend/device.h).
 *
 * A device is one GPU; a stream is a non-blocking CUDA stream of it; an
 * event is a CUDA event. enqueue runs the task at once on the calling host
 * thread, with the stream's device current, and the task launches its
 * kernels onto the stream that gp_cuda_current_stream() names while it runs.
 * Copies are cudaMemcpyAsync with cudaMemcpyDefault, so one call moves bytes
 * host<->device and device<->device, across GPUs too (unified addressing). */
#ifndef GP_CUDA_DEVICE_H
#define GP_CUDA_DEVICE_H

#include <cuda_runtime_api.h>
#include <stdbool.h>

#include "backend/device.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const struct gp_device_ops gp_cuda_device_ops;

/* The stream of the task that enqueue is running on this host thread; NULL
 * (CUDA's default stream, which no task should use) outside a task. Tasks
 * launch every kernel and library call onto it. A later backend passes the
 * stream to the task instead; until then this is the only way a task learns
 * where its work goes. */
cudaStream_t gp_cuda_current_stream(void);

/* The CUDA stream behind an interface stream, and a device's GPU index. */
cudaStream_t gp_cuda_stream_of(struct gp_stream *s);
int gp_cuda_device_index(struct gp_device *dev);

/* The convolution algorithms measured in this process (conv_algos.cu), as
 * text (malloc'd; NULL when none), and taken back, before any are measured,
 * from another run's text; choices measured on another GPU or cuDNN are
 * left out with a note (the device ops' choices_export / choices_import). */
char *gp_cuda_choices_export(void);
gp_status gp_cuda_choices_import(const char *text, char *note, size_t note_size, struct gp_error *err);
/* The text's first line here: the cuDNN version and the GPU that choices
 * measured in this process are valid for. */
void gp_cuda_choices_identity(char *out, size_t size);

/* backends.h's gp_backend_on_measure for the convolution algorithms. */
void gp_cuda_on_measure(void (*fn)(void *user, double seconds), void *user);
/* backends.h's gp_backend_peer_access. */
void gp_cuda_peer_access(bool on);
/* backends.h's gp_backend_on_wait: the watch over stream_synchronize. */
void gp_cuda_on_wait(gp_status (*fn)(void *user, double waited_s, struct gp_error *err), void *user);

/* The CUDA backend's compute ops (backend/compute.h; cuda/compute.cu). */
extern const struct gp_compute_ops gp_cuda_compute_ops;

#ifdef __cplusplus
}
#endif

#endif
