#include "graph/graph.h"

#include <string.h>
#include <sys/mman.h>

#include "onnx/external_data.h"

const char *gp_value_kind_name(enum gp_value_kind kind)
{
    switch (kind) {
    case GP_VALUE_ACTIVATION: return "activation";
    case GP_VALUE_INPUT: return "input";
    case GP_VALUE_PARAMETER: return "parameter";
    case GP_VALUE_BUFFER: return "buffer";
    case GP_VALUE_CONSTANT: return "constant";
    }
    return "?";
}

int gp_graph_find_value(const struct gp_graph *g, const char *name)
{
    return gp_strmap_get(&g->value_names, name);
}

struct gp_tensor *gp_graph_new_tensor(struct gp_graph *g, enum gp_dtype dtype,
                                      const struct gp_shape *shape)
{
    size_t esize = gp_dtype_size(dtype);
    if (!esize || !gp_shape_check(shape, esize)) return NULL;
    struct gp_tensor *t = gp_arena_alloc(&g->arena, sizeof *t);
    if (!t) return NULL;
    t->dtype = dtype;
    t->shape = *shape;
    t->nbytes = (size_t)gp_shape_numel(shape) * esize;
    t->data = gp_arena_alloc(&g->arena, t->nbytes);
    return t->data ? t : NULL;
}

const struct gp_attr *gp_node_attr(const struct gp_node *node, const char *name)
{
    for (int i = 0; i < node->n_attrs; i++)
        if (strcmp(node->attrs[i].name, name) == 0) return &node->attrs[i];
    return NULL;
}

int64_t gp_node_attr_int(const struct gp_node *node, const char *name, int64_t dflt)
{
    const struct gp_attr *a = gp_node_attr(node, name);
    return a && a->type == GP_ATTR_INT ? a->i : dflt;
}

float gp_node_attr_float(const struct gp_node *node, const char *name, float dflt)
{
    const struct gp_attr *a = gp_node_attr(node, name);
    return a && a->type == GP_ATTR_FLOAT ? a->f : dflt;
}

const char *gp_node_attr_string(const struct gp_node *node, const char *name, const char *dflt)
{
    const struct gp_attr *a = gp_node_attr(node, name);
    return a && a->type == GP_ATTR_STRING ? a->s : dflt;
}

int64_t gp_node_attr_ints(const struct gp_node *node, const char *name, const int64_t **out)
{
    const struct gp_attr *a = gp_node_attr(node, name);
    if (!a || a->type != GP_ATTR_INTS) return -1;
    *out = a->ints;
    return a->count;
}

struct gp_value *gp_node_input(const struct gp_graph *g, const struct gp_node *node, int i)
{
    if (i < 0 || i >= node->n_inputs || node->inputs[i] < 0) return NULL;
    return &g->values[node->inputs[i]];
}

struct gp_value *gp_node_output(const struct gp_graph *g, const struct gp_node *node, int i)
{
    if (i < 0 || i >= node->n_outputs || node->outputs[i] < 0) return NULL;
    return &g->values[node->outputs[i]];
}

int64_t gp_value_bytes(const struct gp_value *v)
{
    return gp_shape_numel(&v->shape) * (int64_t)gp_dtype_size(v->dtype);
}

int gp_graph_data_inputs(const struct gp_graph *g, int *count)
{
    int first = -1, n = 0;
    for (int i = 0; i < g->n_inputs; i++)
        if (!g->values[g->inputs[i]].is_initializer) {
            if (first < 0) first = g->inputs[i];
            n++;
        }
    if (count) *count = n;
    return first;
}

int64_t gp_graph_param_count(const struct gp_graph *g)
{
    int64_t n = 0;
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i].kind == GP_VALUE_PARAMETER) n += gp_shape_numel(&g->values[i].shape);
    return n;
}

int64_t gp_graph_param_bytes(const struct gp_graph *g)
{
    int64_t n = 0;
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i].kind == GP_VALUE_PARAMETER) n += gp_value_bytes(&g->values[i]);
    return n;
}

const char *gp_graph_metadata(const struct gp_graph *g, const char *key)
{
    for (int i = 0; i < g->n_metadata; i++)
        if (strcmp(g->metadata_keys[i], key) == 0) return g->metadata_values[i];
    return NULL;
}

void gp_graph_free(struct gp_graph *g)
{
    if (!g) return;
    gp_external_data_release(g->mappings);
    g->mappings = NULL;
    gp_strmap_free(&g->value_names);
    gp_arena_free(&g->arena);
    memset(g, 0, sizeof *g);
}
