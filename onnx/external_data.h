/* Tensor data stored outside the .onnx file (ONNX "external data"): files
 * named relative to the model's folder, memory-mapped, bounds-checked. */
#ifndef GP_ONNX_EXTERNAL_DATA_H
#define GP_ONNX_EXTERNAL_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

struct gp_mapping;

/* Maps `length` bytes at `offset` of `location`, a path relative to
 * `model_dir`. Refuses absolute paths and any path that resolves (symbolic
 * links included) outside the model's folder, offsets and lengths outside
 * the file, and lengths other than `expected` (when expected >= 0).
 * The mapping is read-only and private (the file is never modified; a
 * tensor that is a view of it must be copied before any write) and is added to
 * *list, which gp_external_data_release unmaps. `tensor` names the tensor in
 * messages. */
gp_status gp_external_data_map(const char *model_dir, const char *location, int64_t offset,
                               int64_t length, int64_t expected, const char *tensor,
                               struct gp_mapping **list, void **data, struct gp_error *err);

/* Adds `len` bytes mapped at `addr` (by mmap, len > 0) to *list, which then
 * unmaps them; false when out of memory (the caller keeps them). */
bool gp_mapping_adopt(struct gp_mapping **list, void *addr, size_t len);

void gp_external_data_release(struct gp_mapping *list);

#endif
