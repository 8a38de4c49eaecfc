/* The backends this build has, by name, so that code above the backend
 * layer (trainer, partitioner, command line) never names one directly. */
#ifndef GP_BACKEND_BACKENDS_H
#define GP_BACKEND_BACKENDS_H

#include "backend/device.h"

/* "cpu" or "cuda": the backend's device ops, or NULL when this build has
 * none by that name (built without CUDA). */
const struct gp_device_ops *gp_backend_find(const char *name);

#endif
