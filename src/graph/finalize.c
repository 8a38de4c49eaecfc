/* gp_graph_finalize: from the nodes as the file lists them to the static,
 * sorted, folded IR. The steps run in this order because each needs the one
 * before: ops must be resolved to validate attributes, sorted to infer
 * shapes, and shapes known to fold (Shape of an activation folds once its
 * batch axis is bound). */
#include "graph/build.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/registry.h"

/* ---- op resolution and validation ---- */

static int64_t domain_version(const struct gp_graph *g, const char *domain)
{
    if (!*domain || strcmp(domain, "ai.onnx") == 0) return g->opset;
    for (int i = 0; i < g->n_opsets; i++)
        if (strcmp(g->opsets[i].domain, domain) == 0) return g->opsets[i].version;
    return -1;
}

/* Finds "name:" in the comma-separated spec and returns its type letter, or 0. */
static char attr_spec_type(const char *spec, const char *name)
{
    size_t len = strlen(name);
    for (const char *p = spec ? spec : ""; *p;) {
        const char *colon = strchr(p, ':');
        if (!colon) break;
        if ((size_t)(colon - p) == len && strncmp(p, name, len) == 0) return colon[1];
        p = strchr(colon, ',');
        if (!p) break;
        p++;
    }
    return 0;
}

static enum gp_attr_type attr_type_of_letter(char c)
{
    switch (c) {
    case 'f': return GP_ATTR_FLOAT;
    case 'i': return GP_ATTR_INT;
    case 's': return GP_ATTR_STRING;
    case 't': return GP_ATTR_TENSOR;
    case 'F': return GP_ATTR_FLOATS;
    case 'I': return GP_ATTR_INTS;
    case 'S': return GP_ATTR_STRINGS;
    default: return GP_ATTR_UNDEFINED;
    }
}

static const char *attr_type_name(enum gp_attr_type t)
{
    switch (t) {
    case GP_ATTR_FLOAT: return "float";
    case GP_ATTR_INT: return "int";
    case GP_ATTR_STRING: return "string";
    case GP_ATTR_TENSOR: return "tensor";
    case GP_ATTR_GRAPH: return "graph";
    case GP_ATTR_FLOATS: return "floats";
    case GP_ATTR_INTS: return "ints";
    case GP_ATTR_STRINGS: return "strings";
    default: return "unsupported kind";
    }
}

static gp_status check_node(const struct gp_graph *g, const struct gp_node *n,
                            const struct gp_op_def *d, struct gp_error *err)
{
    int present_in = n->n_inputs, present_out = n->n_outputs;
    while (present_in > 0 && n->inputs[present_in - 1] < 0) present_in--;
    while (present_out > 0 && n->outputs[present_out - 1] < 0) present_out--;
    if (present_in < d->min_inputs || n->n_inputs > d->max_inputs)
        return gp_error_set(err, GP_ERR_INVALID,
                            "node '%s' (%s-%d): has %d inputs, expected %d to %d", n->name,
                            n->op_type, d->since_version, n->n_inputs, d->min_inputs,
                            d->max_inputs);
    if (present_out < d->min_outputs || n->n_outputs > d->max_outputs)
        return gp_error_set(err, GP_ERR_INVALID,
                            "node '%s' (%s-%d): has %d outputs, expected %d to %d", n->name,
                            n->op_type, d->since_version, n->n_outputs, d->min_outputs,
                            d->max_outputs);
    for (int i = 0; i < n->n_attrs; i++) {
        const struct gp_attr *a = &n->attrs[i];
        char letter = attr_spec_type(d->attrs, a->name);
        if (!letter)
            return gp_error_set(err, GP_ERR_UNSUPPORTED,
                                "node '%s' (%s-%d): unknown attribute '%s' (known: %s)", n->name,
                                n->op_type, d->since_version, a->name,
                                d->attrs && *d->attrs ? d->attrs : "none");
        if (attr_type_of_letter(letter) != a->type)
            return gp_error_set(err, GP_ERR_INVALID,
                                "node '%s' (%s): attribute '%s' is a %s, expected a %s", n->name,
                                n->op_type, a->name, attr_type_name(a->type),
                                attr_type_name(attr_type_of_letter(letter)));
    }
    (void)g;
    return GP_OK;
}

/* Resolves every node; unsupported ops are gathered into one message,
 * grouped by op type, so a user sees the whole list at once. */
static gp_status resolve_ops(struct gp_graph *g, struct gp_error *err)
{
    char msg[GP_ERROR_MSG_MAX] = "";
    size_t used = 0;
    int n_bad = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        struct gp_node *n = &g->nodes[i];
        int64_t version = domain_version(g, n->domain);
        bool known = false;
        n->def = version >= 0 ? gp_op_lookup(n->domain, n->op_type, version, &known) : NULL;
        if (n->def) continue;
        /* Skip op types already listed: their first node names them. */
        bool listed = false;
        for (int j = 0; j < i && !listed; j++)
            listed = !g->nodes[j].def && strcmp(g->nodes[j].op_type, n->op_type) == 0 &&
                     strcmp(g->nodes[j].domain, n->domain) == 0;
        if (listed) continue;
        int count = 0;
        for (int j = i; j < g->n_nodes; j++)
            count += strcmp(g->nodes[j].op_type, n->op_type) == 0 &&
                     strcmp(g->nodes[j].domain, n->domain) == 0;
        char what[400];
        if (version < 0)
            snprintf(what, sizeof what, "%s%s%s (domain '%s' is not imported by the model)",
                     n->domain, *n->domain ? "." : "", n->op_type, n->domain);
        else if (known)
            snprintf(what, sizeof what, "%s%s%s at opset %lld", n->domain, *n->domain ? "." : "",
                     n->op_type, (long long)version);
        else
            snprintf(what, sizeof what, "%s%s%s", n->domain, *n->domain ? "." : "", n->op_type);
        int w = snprintf(msg + used, sizeof msg - used, "%s%s (%d node%s, first '%s')",
                         n_bad ? ", " : "", what, count, count == 1 ? "" : "s", n->name);
        if (w > 0 && (size_t)w < sizeof msg - used) used += (size_t)w;
        n_bad++;
    }
    if (n_bad)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "%d unsupported op type%s: %s", n_bad,
                            n_bad == 1 ? "" : "s", msg);
    for (int i = 0; i < g->n_nodes; i++) GP_TRY(check_node(g, &g->nodes[i], g->nodes[i].def, err));
    return GP_OK;
}

/* ---- topological order ---- */

/* Consumers of each value in CSR form: cons[start[v] .. start[v+1]). */
struct uses {
    int *start, *node, *slot;
};

static gp_status build_uses(const struct gp_graph *g, struct uses *u, struct gp_error *err)
{
    u->start = calloc((size_t)g->n_values + 1, sizeof(int));
    int total = 0;
    for (int i = 0; i < g->n_nodes; i++) total += g->nodes[i].n_inputs;
    u->node = malloc(sizeof(int) * (size_t)(total + 1));
    u->slot = malloc(sizeof(int) * (size_t)(total + 1));
    if (!u->start || !u->node || !u->slot)
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory indexing the graph");
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_inputs; k++)
            if (g->nodes[i].inputs[k] >= 0) u->start[g->nodes[i].inputs[k] + 1]++;
    for (int v = 0; v < g->n_values; v++) u->start[v + 1] += u->start[v];
    int *fill = calloc((size_t)g->n_values + 1, sizeof(int));
    if (!fill) return gp_error_set(err, GP_ERR_NOMEM, "out of memory indexing the graph");
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_inputs; k++) {
            int v = g->nodes[i].inputs[k];
            if (v < 0) continue;
            int at = u->start[v] + fill[v]++;
            u->node[at] = i;
            u->slot[at] = k;
        }
    free(fill);
    return GP_OK;
}

static void free_uses(struct uses *u)
{
    free(u->start);
    free(u->node);
    free(u->slot);
}

static gp_status check_defined(const struct gp_graph *g, struct gp_error *err)
{
    for (int i = 0; i < g->n_nodes; i++) {
        const struct gp_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_inputs; k++) {
            if (n->inputs[k] < 0) continue;
            const struct gp_value *v = &g->values[n->inputs[k]];
            if (v->producer < 0 && v->kind != GP_VALUE_INPUT && !v->is_initializer)
                return gp_error_set(err, GP_ERR_INVALID,
                                    "node '%s' (%s) reads '%s', which no node, graph input or "
                                    "initializer defines",
                                    n->name, n->op_type, v->name);
        }
    }
    for (int i = 0; i < g->n_outputs; i++) {
        const struct gp_value *v = &g->values[g->outputs[i]];
        if (v->producer < 0 && v->kind != GP_VALUE_INPUT && !v->is_initializer)
            return gp_error_set(err, GP_ERR_INVALID,
                                "graph output '%s' is not produced by any node", v->name);
    }
    if (g->n_outputs == 0)
        return gp_error_set(err, GP_ERR_INVALID, "the graph has no outputs");
    return GP_OK;
}

/* Min-heap of node indices: Kahn's algorithm that always takes the ready
 * node listed first in the file, so a file already in order keeps it. */
static void heap_push(int *h, int *n, int x)
{
    int i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > x) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = x;
}

static int heap_pop(int *h, int *n)
{
    int top = h[0], x = h[--(*n)], i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= x) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = x;
    return top;
}

static gp_status topo_sort(struct gp_graph *g, const struct uses *u, struct gp_error *err)
{
    int n = g->n_nodes;
    int *pending = calloc((size_t)n + 1, sizeof(int));
    int *heap = malloc(sizeof(int) * ((size_t)n + 1));
    int *order = malloc(sizeof(int) * ((size_t)n + 1));
    gp_status st = GP_OK;
    if (!pending || !heap || !order) {
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory sorting the graph");
        goto done;
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < g->nodes[i].n_inputs; k++) {
            int v = g->nodes[i].inputs[k];
            if (v >= 0 && g->values[v].producer >= 0) pending[i]++;
        }
    int hn = 0, done_count = 0;
    for (int i = 0; i < n; i++)
        if (!pending[i]) heap_push(heap, &hn, i);
    while (hn) {
        int i = heap_pop(heap, &hn);
        order[done_count++] = i;
        for (int k = 0; k < g->nodes[i].n_outputs; k++) {
            int v = g->nodes[i].outputs[k];
            if (v < 0) continue;
            for (int c = u->start[v]; c < u->start[v + 1]; c++)
                if (--pending[u->node[c]] == 0) heap_push(heap, &hn, u->node[c]);
        }
    }
    if (done_count < n) {
        /* Every node left waits on another node left: name one such edge. */
        for (int i = 0; i < n; i++) {
            if (!pending[i]) continue;
            for (int k = 0; k < g->nodes[i].n_inputs; k++) {
                int v = g->nodes[i].inputs[k];
                if (v >= 0 && g->values[v].producer >= 0 && pending[g->values[v].producer]) {
                    st = gp_error_set(err, GP_ERR_INVALID,
                                      "the graph has a cycle through value '%s' (made by '%s', "
                                      "read by '%s')",
                                      g->values[v].name, g->nodes[g->values[v].producer].name,
                                      g->nodes[i].name);
                    goto done;
                }
            }
        }
        st = gp_error_set(err, GP_ERR_INVALID, "the graph has a cycle");
        goto done;
    }
    /* Permute the nodes into that order and renumber producers. */
    struct gp_node *sorted = malloc(sizeof *sorted * ((size_t)n + 1));
    if (!sorted) {
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory sorting the graph");
        goto done;
    }
    for (int i = 0; i < n; i++) sorted[i] = g->nodes[order[i]];
    memcpy(g->nodes, sorted, sizeof *sorted * (size_t)n);
    free(sorted);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < g->nodes[i].n_outputs; k++)
            if (g->nodes[i].outputs[k] >= 0) g->values[g->nodes[i].outputs[k]].producer = i;
done:
    free(pending);
    free(heap);
    free(order);
    return st;
}

/* ---- batch binding ---- */

static gp_status bind_batch(struct gp_graph *g, struct gp_error *err)
{
    for (int i = 0; i < g->n_inputs; i++) {
        struct gp_value *v = &g->values[g->inputs[i]];
        if (v->is_initializer) continue; /* old exporters list initializers as inputs */
        if (v->shape.rank < 1)
            return gp_error_set(err, GP_ERR_SHAPE,
                                "graph input '%s' is a scalar: it needs a batch axis 0", v->name);
        if (g->batch > 0) {
            v->shape.dims[0] = g->batch;
        } else if (v->shape.dims[0] < 0) {
            return gp_error_set(err, GP_ERR_SHAPE,
                                "graph input '%s' has a symbolic batch axis: give a batch size",
                                v->name);
        }
        if (!gp_shape_check(&v->shape, gp_dtype_size(v->dtype) ? gp_dtype_size(v->dtype) : 1)) {
            char s[160];
            return gp_error_set(err, GP_ERR_SHAPE, "graph input '%s' has an invalid shape %s",
                                v->name, gp_shape_format(&v->shape, s, sizeof s));
        }
    }
    return GP_OK;
}

/* ---- trainability ---- */

/* A float initializer is a parameter when some path carries its gradient to
 * a graph output: through differentiable input slots, float outputs, and
 * nodes that are not folded. `relevant[v]` marks values on such paths. */
static void mark_relevant(const struct gp_graph *g, const bool *folded, bool *relevant)
{
    memset(relevant, 0, sizeof(bool) * (size_t)g->n_values);
    for (int i = 0; i < g->n_outputs; i++) {
        const struct gp_value *v = &g->values[g->outputs[i]];
        if (gp_dtype_is_float(v->dtype)) relevant[g->outputs[i]] = true;
    }
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        const struct gp_node *n = &g->nodes[i];
        if (folded[i]) continue;
        bool any = false;
        for (int k = 0; k < n->n_outputs; k++) {
            int v = n->outputs[k];
            if (v >= 0 && relevant[v] && gp_dtype_is_float(g->values[v].dtype)) any = true;
        }
        if (!any) continue;
        for (int k = 0; k < n->n_inputs; k++) {
            int v = n->inputs[k];
            if (v < 0 || (k < 32 && (n->def->nondiff_inputs >> k) & 1)) continue;
            if (gp_dtype_is_float(g->values[v].dtype)) relevant[v] = true;
        }
    }
}

/* ---- shape inference and folding ---- */

static bool foldable(const struct gp_graph *g, const struct gp_node *n, const bool *trainable)
{
    if (n->def->fold_kind == GP_FOLD_NEVER || !n->def->fold) return false;
    for (int k = 0; k < n->n_inputs; k++) {
        int v = n->inputs[k];
        if (v < 0) continue;
        if (n->def->fold_kind == GP_FOLD_SHAPES && k == 0) continue;
        /* CastLike reads only the dtype of its second input (the dynamo
         * exporter casts every constant like an activation). */
        if (k == 1 && !strcmp(n->op_type, "CastLike")) continue;
        if (!g->values[v].constant || trainable[v]) return false;
    }
    return true;
}

/* Infers every node in order and folds those whose inputs are all known.
 * Idempotent: a second run after trainability changed folds what it can. */
static gp_status infer_and_fold(struct gp_graph *g, bool *folded, const bool *trainable,
                                struct gp_error *err)
{
    for (int i = 0; i < g->n_nodes; i++) {
        struct gp_node *n = &g->nodes[i];
        if (folded[i]) continue;
        for (int k = 0; k < n->n_inputs; k++) {
            const struct gp_value *v = gp_node_input(g, n, k);
            if (v && !v->has_shape)
                return gp_error_set(err, GP_ERR_SHAPE, "node '%s' (%s): input '%s' has no shape",
                                    n->name, n->op_type, v->name);
        }
        struct gp_infer_ctx ctx = {.graph = g, .node = n, .err = err};
        GP_TRY(n->def->infer(&ctx));
        for (int k = 0; k < n->n_outputs; k++) {
            struct gp_value *v = gp_node_output(g, n, k);
            if (!v) continue;
            if (!v->has_shape)
                return gp_error_set(err, GP_ERR_SHAPE,
                                    "node '%s' (%s): the shape of output '%s' could not be inferred",
                                    n->name, n->op_type, v->name);
            size_t esize = gp_dtype_size(v->dtype);
            if (!esize || !gp_shape_check(&v->shape, esize)) {
                char s[160];
                return gp_error_set(err, GP_ERR_SHAPE,
                                    "node '%s' (%s): output '%s' has an invalid %s shape %s",
                                    n->name, n->op_type, v->name, gp_dtype_name(v->dtype),
                                    gp_shape_format(&v->shape, s, sizeof s));
            }
        }
        if (!foldable(g, n, trainable)) continue;
        GP_TRY(n->def->fold(&ctx));
        for (int k = 0; k < n->n_outputs; k++) {
            struct gp_value *v = gp_node_output(g, n, k);
            if (!v) continue;
            if (!v->constant)
                return gp_error_set(err, GP_ERR_INVALID,
                                    "node '%s' (%s): folding produced no value for '%s'", n->name,
                                    n->op_type, v->name);
            v->kind = GP_VALUE_CONSTANT;
        }
        folded[i] = true;
    }
    return GP_OK;
}

/* A node is static when no input depends on the batch: it only reshapes
 * or transposes parameters and constants (exporters emit Transpose(W) before
 * MatMul). */
static void mark_static(const struct gp_graph *g, const bool *folded, bool *is_static)
{
    for (int i = 0; i < g->n_nodes; i++) {
        const struct gp_node *n = &g->nodes[i];
        bool st = !folded[i];
        for (int k = 0; k < n->n_inputs && st; k++) {
            int v = n->inputs[k];
            if (v < 0) continue;
            const struct gp_value *val = &g->values[v];
            if (val->kind == GP_VALUE_INPUT) st = false;
            else if (val->producer >= 0 && !folded[val->producer] && !is_static[val->producer])
                st = false;
        }
        is_static[i] = st;
    }
}

/* Emits node i after its not-yet-emitted static producers (depth first). */
static void emit_with_static_producers(const struct gp_graph *g, int i, const bool *folded,
                                       const bool *is_static, bool *emitted, int *order,
                                       int *count)
{
    const struct gp_node *n = &g->nodes[i];
    for (int k = 0; k < n->n_inputs; k++) {
        int v = n->inputs[k];
        if (v < 0) continue;
        int p = g->values[v].producer;
        if (p >= 0 && !folded[p] && is_static[p] && !emitted[p])
            emit_with_static_producers(g, p, folded, is_static, emitted, order, count);
    }
    emitted[i] = true;
    order[(*count)++] = i;
}

/* Drops folded nodes from the list (their outputs become producer-less
 * constants) and moves each static node next to its first consumer, so a
 * weight's Transpose sits beside the MatMul that reads it instead of at the
 * top of the list, where it would lengthen every frontier in between. */
static gp_status compact(struct gp_graph *g, const bool *folded, struct gp_error *err)
{
    int n = g->n_nodes;
    g->folded = gp_arena_alloc(&g->arena, sizeof *g->folded * ((size_t)n + 1));
    bool *is_static = calloc((size_t)n + 1, sizeof(bool));
    bool *emitted = calloc((size_t)n + 1, sizeof(bool));
    int *order = malloc(sizeof(int) * ((size_t)n + 1));
    struct gp_node *kept = malloc(sizeof *kept * ((size_t)n + 1));
    if (!g->folded || !is_static || !emitted || !order || !kept) {
        free(is_static);
        free(emitted);
        free(order);
        free(kept);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory finalizing the graph");
    }
    mark_static(g, folded, is_static);
    int count = 0;
    for (int i = 0; i < n; i++)
        if (!folded[i] && !is_static[i])
            emit_with_static_producers(g, i, folded, is_static, emitted, order, &count);
    for (int i = 0; i < n; i++) /* static nodes nothing dynamic reads (graph outputs) */
        if (!folded[i] && !emitted[i])
            emit_with_static_producers(g, i, folded, is_static, emitted, order, &count);
    for (int i = 0; i < n; i++) {
        if (!folded[i]) continue;
        const struct gp_node *f = &g->nodes[i];
        for (int k = 0; k < f->n_outputs; k++)
            if (f->outputs[k] >= 0) g->values[f->outputs[k]].producer = -1;
        g->folded[g->n_folded++] = *f;
    }
    for (int j = 0; j < count; j++) {
        kept[j] = g->nodes[order[j]];
        for (int k = 0; k < kept[j].n_outputs; k++)
            if (kept[j].outputs[k] >= 0) g->values[kept[j].outputs[k]].producer = j;
    }
    memcpy(g->nodes, kept, sizeof *kept * (size_t)count);
    g->n_nodes = count;
    free(is_static);
    free(emitted);
    free(order);
    free(kept);
    return GP_OK;
}

gp_status gp_graph_finalize(struct gp_graph *g, struct gp_error *err)
{
    GP_TRY(resolve_ops(g, err));
    GP_TRY(check_defined(g, err));
    GP_TRY(bind_batch(g, err));

    struct uses u = {0};
    bool *folded = calloc((size_t)g->n_nodes + 1, sizeof(bool));
    bool *trainable = calloc((size_t)g->n_values + 1, sizeof(bool));
    bool *relevant = calloc((size_t)g->n_values + 1, sizeof(bool));
    gp_status st = GP_OK;
    if (!folded || !trainable || !relevant) {
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory finalizing the graph");
        goto done;
    }
    if ((st = build_uses(g, &u, err)) != GP_OK) goto done;
    if ((st = topo_sort(g, &u, err)) != GP_OK) goto done;

    /* Which initializers are trainable depends on dtypes (a gradient stops
     * at a bool output), known only after inference; what folds depends on
     * trainability. So start from a superset: float initializers that reach
     * a graph output through differentiable slots whatever the dtypes. Such
     * a path rarely leads into a slot that must be constant (Resize scales),
     * so inference rarely trips on it. Then narrow to the initializers whose
     * gradient reaches an output through float values, and fold again. */
    for (int v = 0; v < g->n_values; v++) relevant[v] = g->values[v].is_output;
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        const struct gp_node *n = &g->nodes[i];
        bool any = false;
        for (int k = 0; k < n->n_outputs; k++) any |= n->outputs[k] >= 0 && relevant[n->outputs[k]];
        if (!any) continue;
        for (int k = 0; k < n->n_inputs; k++)
            if (n->inputs[k] >= 0 && (k >= 32 || !((n->def->nondiff_inputs >> k) & 1)))
                relevant[n->inputs[k]] = true;
    }
    for (int v = 0; v < g->n_values; v++)
        trainable[v] = relevant[v] && g->values[v].is_initializer &&
                       gp_dtype_is_float(g->values[v].dtype);
    for (int round = 0; round < 3; round++) {
        if ((st = infer_and_fold(g, folded, trainable, err)) != GP_OK) goto done;
        mark_relevant(g, folded, relevant);
        bool changed = false;
        for (int v = 0; v < g->n_values; v++) {
            bool t = trainable[v] && relevant[v];
            if (t != trainable[v]) changed = true;
            trainable[v] = t;
        }
        if (!changed) break;
    }

    /* Ops without kernels must have folded. */
    for (int i = 0; i < g->n_nodes && st == GP_OK; i++) {
        const struct gp_node *n = &g->nodes[i];
        if (folded[i] || n->def->fold_kind != GP_FOLD_REQUIRED) continue;
        for (int k = 0; k < n->n_inputs; k++) {
            int v = n->inputs[k];
            if (v < 0 || (g->values[v].constant && !trainable[v])) continue;
            st = gp_error_set(err, GP_ERR_UNSUPPORTED,
                              "node '%s' (%s): input %d ('%s') must be known at load time: %s is "
                              "supported only where it folds to a constant, not on %s",
                              n->name, n->op_type, k, g->values[v].name, n->op_type,
                              trainable[v] ? "a trainable initializer" : "data");
            break;
        }
    }
    if (st != GP_OK) goto done;

    /* Initializers read by a node that runs: parameters when trainable,
     * otherwise buffers if float (state such as running statistics). */
    for (int i = 0; i < g->n_nodes; i++) {
        if (folded[i]) continue;
        const struct gp_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_inputs; k++) {
            int v = n->inputs[k];
            if (v < 0 || !g->values[v].is_initializer) continue;
            if (trainable[v]) g->values[v].kind = GP_VALUE_PARAMETER;
            else if (gp_dtype_is_float(g->values[v].dtype)) g->values[v].kind = GP_VALUE_BUFFER;
        }
    }
    st = compact(g, folded, err);
    if (st == GP_OK) st = gp_graph_fuse(g, err);
done:
    free_uses(&u);
    free(folded);
    free(trainable);
    free(relevant);
    return st;
}
