/* For the fuzz targets that run what loads: loading the input bytes as a
 * model, and whether it is small enough to run. */
#ifndef GP_TESTS_FUZZ_SMALL_MODEL_H
#define GP_TESTS_FUZZ_SMALL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "graph/graph.h"
#include "onnx/load.h"

/* The bytes as a model at micro-batch 1 (external data refused: no file
 * system); false when they do not load, which must say why. */
static inline bool fuzz_load(const uint8_t *data, size_t size, struct gp_graph *g)
{
    struct gp_error err = {0};
    if (gp_onnx_load_buffer(data, size, NULL, 1, g, &err) == GP_OK) return true;
    if (err.msg[0] == '\0') __builtin_trap(); /* every failure must explain itself */
    return false;
}

/* Whether a model's values take at most `limit` bytes in all (each value's
 * tensor at the bound batch), so that running it stays fast; sizes that
 * overflow count as too large. */
static inline bool fuzz_small_model(const struct gp_graph *g, int64_t limit)
{
    int64_t total = 0;
    for (int i = 0; i < g->n_values; i++) {
        int64_t b = gp_value_bytes(&g->values[i]);
        if (b < 0 || b > limit || total > limit - b) return false;
        total += b;
    }
    return true;
}

#endif
