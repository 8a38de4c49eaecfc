/* Building one-node test graphs for the CPU kernel tests, and the
 * deterministic input patterns their expected values were computed from. */
#ifndef GP_TESTS_KERNEL_GRAPH_H
#define GP_TESTS_KERNEL_GRAPH_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>

#include "graph/build.h"

static inline void begin(struct gp_graph *g, int64_t opset)
{
    struct gp_error err = {0};
    if (gp_graph_init(g, 0, opset, 64, 16, &err) != GP_OK) fail_msg("%s", err.msg);
}

/* A float32 graph input; the graph's batch 0 keeps its axis 0 as given. */
static inline void input(struct gp_graph *g, const char *name, int rank, const int64_t *dims)
{
    struct gp_error err = {0};
    struct gp_shape s = {.rank = rank};
    for (int i = 0; i < rank; i++) s.dims[i] = dims[i];
    if (gp_graph_add_input(g, name, GP_DTYPE_FLOAT32, &s, &err) != GP_OK) fail_msg("%s", err.msg);
}

static inline void const_f32(struct gp_graph *g, const char *name, int64_t n, const float *v)
{
    struct gp_error err = {0};
    struct gp_shape s = {.rank = 1, .dims = {n}};
    if (gp_graph_add_const_f32(g, name, &s, v, &err) != GP_OK) fail_msg("%s", err.msg);
}

/* The node under test; its present outputs are the graph's outputs. */
static inline int node(struct gp_graph *g, const char *op, int ni, const char *const *in, int no,
                const char *const *out)
{
    struct gp_error err = {0};
    int id = gp_graph_add_node(g, op, "", "n0", ni, in, no, out, &err);
    if (id < 0) fail_msg("%s", err.msg);
    for (int i = 0; i < no; i++)
        if (*out[i] && gp_graph_add_output(g, out[i], &err) != GP_OK) fail_msg("%s", err.msg);
    return id;
}

static inline struct gp_attr *attr(struct gp_graph *g, int n, const char *name, enum gp_attr_type type)
{
    struct gp_error err = {0};
    struct gp_attr *a = gp_graph_add_attr(g, n, name, type, 16, &err);
    if (!a) fail_msg("%s", err.msg);
    return a;
}

static inline void attr_i(struct gp_graph *g, int n, const char *name, int64_t v)
{
    attr(g, n, name, GP_ATTR_INT)->i = v;
}

static inline void attr_f(struct gp_graph *g, int n, const char *name, float v)
{
    attr(g, n, name, GP_ATTR_FLOAT)->f = v;
}

static inline void attr_s(struct gp_graph *g, int n, const char *name, const char *v)
{
    attr(g, n, name, GP_ATTR_STRING)->s = gp_arena_strdup(&g->arena, v);
}

static inline void attr_ints(struct gp_graph *g, int n, const char *name, int count, const int64_t *v)
{
    struct gp_attr *a = attr(g, n, name, GP_ATTR_INTS);
    a->count = count;
    a->ints = gp_arena_memdup(&g->arena, v, sizeof *v * (size_t)count);
}

static inline void finalize_ok(struct gp_graph *g)
{
    struct gp_error err = {0};
    if (gp_graph_finalize(g, &err) != GP_OK) fail_msg("finalize failed: %s", err.msg);
}

/* ---- inputs and checks ---- */

/* p(i) = ((i * a + b) % m - off) / scale, as the generator of the expected
 * values computed it. */
struct pat {
    int a, b, m, off;
    float scale;
};

#define PAT_X {7, 3, 11, 5, 8.0f}
#define PAT_W {5, 1, 13, 6, 4.0f}
#define PAT_B {3, 2, 7, 3, 2.0f}

static inline float *pattern(int64_t n, struct pat p)
{
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++) v[i] = (float)((i * p.a + p.b) % p.m - p.off) / p.scale;
    return v;
}

static inline int64_t numel_of(const struct gp_graph *g, int id)
{
    return gp_shape_numel(&g->values[id].shape);
}

#endif
