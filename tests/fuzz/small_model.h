/* For the fuzz targets that run what loads: whether a model's values take
 * at most `limit` bytes in all (each value's tensor at the bound batch), so
 * that running it stays fast; sizes that overflow count as too large. */
#ifndef GP_TESTS_FUZZ_SMALL_MODEL_H
#define GP_TESTS_FUZZ_SMALL_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "graph/graph.h"

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
