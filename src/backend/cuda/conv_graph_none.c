/* CUDA conv family: conv_graph.h's functions in a build without
 * cudnn-frontend's headers (src/meson.build leaves conv_graph.cpp out).
 * The graph API then has nothing: conv_algos.cu chooses on the legacy API
 * alone and never names a graph configuration, so the run functions are
 * reached only through a choice file written by a build with the graph
 * API, and then fail with a message that says why. */
#include "backend/cuda/conv_graph.h"

#include <stdio.h>

static bool none(char *why, size_t why_size)
{
    if (why_size) snprintf(why, why_size, "this build has no cuDNN graph API (cudnn-frontend's headers were not found)");
    return false;
}

bool conv_graph_choose(const struct conv_graph_problem *p, enum conv_graph_op op, size_t ws_cap, char *name,
                       size_t name_size, size_t *ws, float *ms, char *why, size_t why_size)
{
    (void)p, (void)op, (void)ws_cap, (void)name, (void)name_size, (void)ws;
    *ms = -1;
    return none(why, why_size);
}

bool conv_graph_run(cudnnHandle_t h, const struct conv_graph_problem *p, enum conv_graph_op op, const char *name,
                    const void *a, const void *b, void *out, void *ws, char *why, size_t why_size)
{
    (void)h, (void)p, (void)op, (void)name, (void)a, (void)b, (void)out, (void)ws;
    return none(why, why_size);
}

bool conv_graph_beta_choose(const struct conv_graph_problem *p, enum conv_graph_op op, size_t ws_cap, char *name,
                            size_t name_size, size_t *ws, float *ms, char *why, size_t why_size)
{
    (void)p, (void)op, (void)ws_cap, (void)name, (void)name_size, (void)ws;
    *ms = -1;
    return none(why, why_size);
}

bool conv_graph_beta_run(cudnnHandle_t h, const struct conv_graph_problem *p, enum conv_graph_op op, const char *name,
                         const void *a, const void *b, void *out, void *ws, char *why, size_t why_size)
{
    (void)h, (void)p, (void)op, (void)name, (void)a, (void)b, (void)out, (void)ws;
    return none(why, why_size);
}
