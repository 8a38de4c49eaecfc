#include "graph/build.h"

#include <stdio.h>
#include <string.h>

gp_status gp_graph_init(struct gp_graph *g, int64_t batch, int64_t opset, int max_values,
                        int max_nodes, struct gp_error *err)
{
    memset(g, 0, sizeof *g);
    if (batch < 0)
        return gp_error_set(err, GP_ERR_INVALID, "the batch size must be at least 1 (got %lld)",
                            (long long)batch);
    if (max_values < 0 || max_nodes < 0 || max_values > (1 << 28) || max_nodes > (1 << 28))
        return gp_error_set(err, GP_ERR_INVALID, "the model is too large (%d values, %d nodes)",
                            max_values, max_nodes);
    g->batch = batch;
    g->opset = opset;
    g->cap_values = max_values;
    g->cap_nodes = max_nodes;
    g->values = gp_arena_alloc(&g->arena, sizeof *g->values * (size_t)(max_values + 1));
    g->nodes = gp_arena_alloc(&g->arena, sizeof *g->nodes * (size_t)(max_nodes + 1));
    g->inputs = gp_arena_alloc(&g->arena, sizeof *g->inputs * (size_t)(max_values + 1));
    g->outputs = gp_arena_alloc(&g->arena, sizeof *g->outputs * (size_t)(max_values + 1));
    if (!g->values || !g->nodes || !g->inputs || !g->outputs ||
        !gp_strmap_init(&g->value_names, (size_t)max_values))
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory creating a graph of %d values",
                            max_values);
    return GP_OK;
}

int gp_graph_lookup(const struct gp_graph *g, const char *name)
{
    return gp_strmap_get(&g->value_names, name);
}

int gp_graph_value(struct gp_graph *g, const char *name, struct gp_error *err)
{
    int id = gp_strmap_get(&g->value_names, name);
    if (id >= 0) return id;
    if (g->n_values >= g->cap_values) {
        gp_error_set(err, GP_ERR_INVALID, "too many values (more than %d)", g->cap_values);
        return -1;
    }
    struct gp_value *v = &g->values[g->n_values];
    memset(v, 0, sizeof *v);
    v->name = gp_arena_strdup(&g->arena, name);
    v->kind = GP_VALUE_ACTIVATION;
    v->producer = -1;
    v->layout_blocker = -1;
    if (!v->name || !gp_strmap_put(&g->value_names, v->name, g->n_values)) {
        gp_error_set(err, GP_ERR_NOMEM, "out of memory adding value '%s'", name);
        return -1;
    }
    return g->n_values++;
}

gp_status gp_graph_add_input(struct gp_graph *g, const char *name, enum gp_dtype dtype,
                             const struct gp_shape *shape, struct gp_error *err)
{
    int id = gp_graph_value(g, name, err);
    if (id < 0) return err ? err->status : GP_ERR_INVALID;
    struct gp_value *v = &g->values[id];
    if (v->kind == GP_VALUE_INPUT)
        return gp_error_set(err, GP_ERR_INVALID, "graph input '%s' is listed twice", name);
    v->kind = GP_VALUE_INPUT;
    v->dtype = dtype;
    v->shape = *shape;
    v->has_shape = true;
    g->inputs[g->n_inputs++] = id;
    return GP_OK;
}

gp_status gp_graph_add_initializer(struct gp_graph *g, const char *name, struct gp_tensor *t,
                                   struct gp_error *err)
{
    int id = gp_graph_value(g, name, err);
    if (id < 0) return err ? err->status : GP_ERR_INVALID;
    struct gp_value *v = &g->values[id];
    if (v->is_initializer)
        return gp_error_set(err, GP_ERR_INVALID, "initializer '%s' is defined twice", name);
    /* The kind (parameter, buffer or constant) is decided at finalize, once
     * the consumers are known. */
    v->kind = GP_VALUE_CONSTANT;
    v->is_initializer = true;
    v->constant = t;
    v->dtype = t->dtype;
    v->shape = t->shape;
    v->has_shape = true;
    return GP_OK;
}

gp_status gp_graph_add_output(struct gp_graph *g, const char *name, struct gp_error *err)
{
    int id = gp_graph_value(g, name, err);
    if (id < 0) return err ? err->status : GP_ERR_INVALID;
    if (g->values[id].is_output)
        return gp_error_set(err, GP_ERR_INVALID, "graph output '%s' is listed twice", name);
    g->values[id].is_output = true;
    g->outputs[g->n_outputs++] = id;
    return GP_OK;
}

int gp_graph_add_node(struct gp_graph *g, const char *op_type, const char *domain,
                      const char *name, int n_inputs, const char *const *inputs, int n_outputs,
                      const char *const *outputs, struct gp_error *err)
{
    if (g->n_nodes >= g->cap_nodes) {
        gp_error_set(err, GP_ERR_INVALID, "too many nodes (more than %d)", g->cap_nodes);
        return -1;
    }
    int index = g->n_nodes;
    struct gp_node *n = &g->nodes[index];
    memset(n, 0, sizeof *n);
    n->source_index = g->n_source_nodes;
    n->op_type = gp_arena_strdup(&g->arena, op_type ? op_type : "");
    n->domain = gp_arena_strdup(&g->arena, domain ? domain : "");
    if (name && *name) {
        n->name = gp_arena_strdup(&g->arena, name);
    } else {
        char buf[160];
        snprintf(buf, sizeof buf, "%s_%d", op_type && *op_type ? op_type : "node", index);
        n->name = gp_arena_strdup(&g->arena, buf);
    }
    n->inputs = gp_arena_alloc(&g->arena, sizeof(int) * (size_t)(n_inputs + 1));
    n->outputs = gp_arena_alloc(&g->arena, sizeof(int) * (size_t)(n_outputs + 1));
    if (!n->op_type || !n->domain || !n->name || !n->inputs || !n->outputs) {
        gp_error_set(err, GP_ERR_NOMEM, "out of memory adding node %d", index);
        return -1;
    }
    if (!*n->op_type) {
        gp_error_set(err, GP_ERR_INVALID, "node '%s' has no op_type", n->name);
        return -1;
    }
    n->n_inputs = n_inputs;
    n->n_outputs = n_outputs;
    for (int i = 0; i < n_inputs; i++) {
        if (!inputs[i] || !*inputs[i]) {
            n->inputs[i] = -1;
            continue;
        }
        n->inputs[i] = gp_graph_value(g, inputs[i], err);
        if (n->inputs[i] < 0) return -1;
    }
    for (int i = 0; i < n_outputs; i++) {
        if (!outputs[i] || !*outputs[i]) {
            n->outputs[i] = -1;
            continue;
        }
        int id = gp_graph_value(g, outputs[i], err);
        if (id < 0) return -1;
        struct gp_value *v = &g->values[id];
        if (v->producer >= 0 || v->kind == GP_VALUE_INPUT || v->is_initializer) {
            gp_error_set(err, GP_ERR_INVALID,
                         "value '%s' is produced twice (by node '%s' and by %s)", v->name,
                         n->name,
                         v->producer >= 0 ? g->nodes[v->producer].name
                         : v->kind == GP_VALUE_INPUT ? "a graph input" : "an initializer");
            return -1;
        }
        v->producer = index;
        n->outputs[i] = id;
    }
    g->n_nodes++;
    g->n_source_nodes++;
    return index;
}

struct gp_attr *gp_graph_add_attr(struct gp_graph *g, int node, const char *name,
                                  enum gp_attr_type type, int max_attrs, struct gp_error *err)
{
    struct gp_node *n = &g->nodes[node];
    if (!n->attrs) {
        n->attrs = gp_arena_alloc(&g->arena, sizeof *n->attrs * (size_t)(max_attrs + 1));
        if (!n->attrs) {
            gp_error_set(err, GP_ERR_NOMEM, "out of memory adding attributes to '%s'", n->name);
            return NULL;
        }
    }
    if (n->n_attrs >= max_attrs) {
        gp_error_set(err, GP_ERR_INVALID, "node '%s': more attributes than reserved", n->name);
        return NULL;
    }
    for (int i = 0; i < n->n_attrs; i++)
        if (strcmp(n->attrs[i].name, name) == 0) {
            gp_error_set(err, GP_ERR_INVALID, "node '%s': attribute '%s' is given twice",
                         n->name, name);
            return NULL;
        }
    struct gp_attr *a = &n->attrs[n->n_attrs++];
    memset(a, 0, sizeof *a);
    a->name = gp_arena_strdup(&g->arena, name);
    a->type = type;
    return a;
}

static gp_status add_const(struct gp_graph *g, const char *name, enum gp_dtype dtype,
                           const struct gp_shape *shape, const void *data, struct gp_error *err)
{
    struct gp_tensor *t = gp_graph_new_tensor(g, dtype, shape);
    if (!t) return gp_error_set(err, GP_ERR_NOMEM, "cannot allocate constant '%s'", name);
    memcpy(t->data, data, t->nbytes);
    return gp_graph_add_initializer(g, name, t, err);
}

gp_status gp_graph_add_const_f32(struct gp_graph *g, const char *name, const struct gp_shape *shape,
                                 const float *data, struct gp_error *err)
{
    return add_const(g, name, GP_DTYPE_FLOAT32, shape, data, err);
}

gp_status gp_graph_add_const_i64(struct gp_graph *g, const char *name, const struct gp_shape *shape,
                                 const int64_t *data, struct gp_error *err)
{
    return add_const(g, name, GP_DTYPE_INT64, shape, data, err);
}
