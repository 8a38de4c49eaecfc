#include "onnx/load.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graph/build.h"
#include "onnx.pb-c.h"
#include "onnx/einsum.h"
#include "onnx/external_data.h"
#include "onnx/sequence.h"
#include "onnx/tensor_proto.h"
#include "onnx/wire.h"
#include "util/mapped.h"

/* Files larger than this must use external data (protobuf's own limit is 2 GiB). */
#define GP_MAX_MODEL_BYTES ((size_t)2 << 30)

static gp_status add_attr(struct gp_graph *g, int node, const Onnx__AttributeProto *ap,
                          int max_attrs, struct gp_error *err)
{
    const char *nname = g->nodes[node].name;
    if (!ap->name || !*ap->name)
        return gp_error_set(err, GP_ERR_INVALID, "node '%s': an attribute has no name", nname);
    if (ap->ref_attr_name && *ap->ref_attr_name)
        return gp_error_set(err, GP_ERR_UNSUPPORTED,
                            "node '%s': attribute '%s' refers to a function attribute", nname,
                            ap->name);
    enum gp_attr_type type = ap->has_type ? (enum gp_attr_type)ap->type : GP_ATTR_UNDEFINED;
    /* IR version 1 files leave `type` unset: infer it from the field used. */
    if (type == GP_ATTR_UNDEFINED) {
        if (ap->has_f) type = GP_ATTR_FLOAT;
        else if (ap->has_i) type = GP_ATTR_INT;
        else if (ap->has_s) type = GP_ATTR_STRING;
        else if (ap->t) type = GP_ATTR_TENSOR;
        else if (ap->g) type = GP_ATTR_GRAPH;
        else if (ap->n_floats) type = GP_ATTR_FLOATS;
        else if (ap->n_ints) type = GP_ATTR_INTS;
        else if (ap->n_strings) type = GP_ATTR_STRINGS;
    }
    switch (type) {
    case GP_ATTR_FLOAT: case GP_ATTR_INT: case GP_ATTR_STRING: case GP_ATTR_TENSOR:
    case GP_ATTR_GRAPH: case GP_ATTR_FLOATS: case GP_ATTR_INTS: case GP_ATTR_STRINGS:
        break;
    default:
        type = GP_ATTR_OTHER;
    }
    struct gp_attr *a = gp_graph_add_attr(g, node, ap->name, type, max_attrs, err);
    if (!a) return err ? err->status : GP_ERR_INVALID;
    switch (type) {
    case GP_ATTR_FLOAT: a->f = ap->f; break;
    case GP_ATTR_INT: a->i = ap->i; break;
    case GP_ATTR_STRING:
        a->s = gp_arena_strndup(&g->arena, (const char *)ap->s.data, ap->s.len);
        if (!a->s) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
        break;
    case GP_ATTR_TENSOR:
        if (!ap->t)
            return gp_error_set(err, GP_ERR_INVALID, "node '%s': tensor attribute '%s' is empty",
                                nname, ap->name);
        GP_TRY(gp_onnx_tensor(g, ap->t, false, &a->t, err));
        break;
    case GP_ATTR_FLOATS:
        a->count = (int64_t)ap->n_floats;
        a->floats = gp_arena_memdup(&g->arena, ap->floats, sizeof(float) * ap->n_floats);
        if (!a->floats) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
        break;
    case GP_ATTR_INTS:
        a->count = (int64_t)ap->n_ints;
        a->ints = gp_arena_memdup(&g->arena, ap->ints, sizeof(int64_t) * ap->n_ints);
        if (!a->ints) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
        break;
    case GP_ATTR_STRINGS:
        a->count = (int64_t)ap->n_strings;
        a->strings = gp_arena_alloc(&g->arena, sizeof(char *) * (ap->n_strings + 1));
        if (!a->strings) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < ap->n_strings; i++) {
            a->strings[i] = gp_arena_strndup(&g->arena, (const char *)ap->strings[i].data,
                                             ap->strings[i].len);
            if (!a->strings[i]) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
        }
        break;
    default: break; /* graphs and the rest: kept by name; the op check refuses them */
    }
    return GP_OK;
}

/* A graph input's declared type: a tensor with a known element type and a
 * shape whose axis 0 may be symbolic (the batch) and whose other axes must be
 * numbers, since shapes are static. */
static gp_status add_input(struct gp_graph *g, const Onnx__ValueInfoProto *vi, struct gp_error *err)
{
    const char *name = vi->name;
    const Onnx__TypeProto *tp = vi->type;
    if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE || !tp->tensor_type)
        return gp_error_set(err, GP_ERR_UNSUPPORTED,
                            "graph input '%s' is not a tensor (sequences, maps and optionals are "
                            "not supported)",
                            name);
    const Onnx__TypeProto__Tensor *tt = tp->tensor_type;
    enum gp_dtype dtype = (enum gp_dtype)(tt->has_elem_type ? tt->elem_type : 0);
    if (!gp_dtype_size(dtype))
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "graph input '%s' has element type %d (%s)",
                            name, (int)tt->elem_type, gp_dtype_name(dtype));
    if (!tt->shape)
        return gp_error_set(err, GP_ERR_SHAPE,
                            "graph input '%s' has no shape: export with a fixed input size", name);
    if (tt->shape->n_dim > GP_MAX_RANK)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "graph input '%s' has rank %zu (at most %d)",
                            name, tt->shape->n_dim, GP_MAX_RANK);
    struct gp_shape shape = {.rank = (int)tt->shape->n_dim};
    for (size_t i = 0; i < tt->shape->n_dim; i++) {
        const Onnx__TensorShapeProto__Dimension *d = tt->shape->dim[i];
        bool numeric = d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
        if (i == 0) {
            /* The batch axis: bound at finalize; remember a numeric export
             * batch so a Reshape that baked it in can be explained. */
            if (numeric && d->dim_value > 0) g->export_batch = d->dim_value;
            /* -1 marks a symbolic batch axis: gp_graph_finalize binds it. */
            shape.dims[0] = numeric && d->dim_value >= 0 ? d->dim_value : -1;
            continue;
        }
        if (!numeric)
            return gp_error_set(err, GP_ERR_SHAPE,
                                "graph input '%s' has a symbolic dimension '%s' at axis %zu: only "
                                "the batch axis 0 may be dynamic (export with fixed sizes elsewhere)",
                                name,
                                d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM &&
                                        d->dim_param
                                    ? d->dim_param
                                    : "?",
                                i);
        if (d->dim_value < 0)
            return gp_error_set(err, GP_ERR_SHAPE, "graph input '%s' has a negative dimension %lld",
                                name, (long long)d->dim_value);
        shape.dims[i] = d->dim_value;
    }
    return gp_graph_add_input(g, name, dtype, &shape, err);
}

static bool is_initializer_name(const Onnx__GraphProto *gp, const char *name)
{
    for (size_t i = 0; i < gp->n_initializer; i++)
        if (gp->initializer[i]->name && strcmp(gp->initializer[i]->name, name) == 0) return true;
    return false;
}

/* `borrow`: the initializers' raw_data lie in the mapped model file, which
 * the graph keeps (see load_bytes). */
static gp_status build_graph(const Onnx__ModelProto *mp, struct gp_graph *g, int64_t batch,
                             bool borrow, struct gp_error *err)
{
    const Onnx__GraphProto *gp = mp->graph;
    if (!gp) return gp_error_set(err, GP_ERR_INVALID, "the model has no graph");

    int64_t opset = -1;
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *o = mp->opset_import[i];
        if (!o->domain || !*o->domain || strcmp(o->domain, "ai.onnx") == 0) opset = o->version;
    }
    if (opset < 1)
        return gp_error_set(err, GP_ERR_INVALID,
                            "the model imports no opset of the default ONNX domain");
    if (gp->n_sparse_initializer)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "sparse initializers are not supported");

    /* Every name appears at most once as an initializer, input, output or
     * node output, and once per node input: that bounds the value table. */
    size_t max_values = gp->n_initializer + gp->n_input + gp->n_output, max_nodes = gp->n_node, n_einsum = 0;
    size_t n_sequence = 0;
    for (size_t i = 0; i < gp->n_node; i++) {
        max_values += gp->node[i]->n_input + gp->node[i]->n_output;
        if (gp_onnx_is_einsum(gp->node[i])) /* lowered into several nodes */
            max_values += GP_EINSUM_EXTRA_VALUES, max_nodes += GP_EINSUM_EXTRA_NODES, n_einsum++;
        if (gp_onnx_is_sequence_op(gp->node[i]))
            max_values += GP_SEQUENCE_EXTRA_VALUES, max_nodes += GP_SEQUENCE_EXTRA_NODES, n_sequence++;
    }
    GP_TRY(gp_onnx_check_sequences(gp, err));
    if (max_values > (1u << 27) || max_nodes > (1u << 27))
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "the model is too large (%zu nodes)", gp->n_node);

    char *keep_path = g->path ? (char *)g->path : NULL, *keep_dir = g->dir ? (char *)g->dir : NULL;
    GP_TRY(gp_graph_init(g, batch, opset, (int)max_values, (int)max_nodes, err));
    /* Two operand checks per Einsum (onnx/einsum.h), in the graph's arena. */
    struct gp_einsum_check *einsum_checks = gp_arena_alloc(&g->arena, sizeof *einsum_checks * (2 * n_einsum + 1));
    int n_einsum_checks = 0;
    if (!einsum_checks) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    /* One check per SequenceAt (onnx/sequence.h). */
    struct gp_sequence_check *sequence_checks = gp_arena_alloc(&g->arena, sizeof *sequence_checks * (n_sequence + 1));
    int n_sequence_checks = 0;
    if (!sequence_checks) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    /* gp_graph_init cleared the graph: copy the paths back into its arena. */
    g->path = keep_path ? gp_arena_strdup(&g->arena, keep_path) : NULL;
    g->dir = keep_dir ? gp_arena_strdup(&g->arena, keep_dir) : NULL;
    g->ir_version = mp->has_ir_version ? mp->ir_version : 0;
    g->model_version = mp->has_model_version ? mp->model_version : 0;
    g->producer_name = gp_arena_strdup(&g->arena, mp->producer_name);
    g->producer_version = gp_arena_strdup(&g->arena, mp->producer_version);
    g->graph_name = gp_arena_strdup(&g->arena, gp->name);
    g->opsets = gp_arena_alloc(&g->arena, sizeof *g->opsets * (mp->n_opset_import + 1));
    if (!g->opsets) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        g->opsets[i].domain = gp_arena_strdup(&g->arena, mp->opset_import[i]->domain);
        g->opsets[i].version = mp->opset_import[i]->version;
    }
    g->n_opsets = (int)mp->n_opset_import;
    g->metadata_keys = gp_arena_alloc(&g->arena, sizeof(char *) * (mp->n_metadata_props + 1));
    g->metadata_values = gp_arena_alloc(&g->arena, sizeof(char *) * (mp->n_metadata_props + 1));
    if (!g->metadata_keys || !g->metadata_values)
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < mp->n_metadata_props; i++) {
        const Onnx__StringStringEntryProto *e = mp->metadata_props[i];
        if (!e->key) continue;
        g->metadata_keys[g->n_metadata] = gp_arena_strdup(&g->arena, e->key);
        g->metadata_values[g->n_metadata] = gp_arena_strdup(&g->arena, e->value);
        g->n_metadata++;
    }

    for (size_t i = 0; i < gp->n_initializer; i++) {
        const Onnx__TensorProto *tp = gp->initializer[i];
        if (!tp->name || !*tp->name)
            return gp_error_set(err, GP_ERR_INVALID, "initializer %zu has no name", i);
        struct gp_tensor *t = NULL;
        GP_TRY(gp_onnx_tensor(g, tp, borrow, &t, err));
        GP_TRY(gp_graph_add_initializer(g, tp->name, t, err));
    }
    for (size_t i = 0; i < gp->n_input; i++) {
        const Onnx__ValueInfoProto *vi = gp->input[i];
        if (!vi->name || !*vi->name)
            return gp_error_set(err, GP_ERR_INVALID, "graph input %zu has no name", i);
        /* Before IR version 4, initializers were listed among the inputs too. */
        if (is_initializer_name(gp, vi->name)) continue;
        GP_TRY(add_input(g, vi, err));
    }
    for (size_t i = 0; i < gp->n_node; i++) {
        const Onnx__NodeProto *np = gp->node[i];
        if (!np->op_type || !*np->op_type)
            return gp_error_set(err, GP_ERR_INVALID, "node %zu ('%s') has no op_type", i,
                                np->name ? np->name : "");
        if (gp_onnx_is_einsum(np)) {
            GP_TRY(gp_onnx_lower_einsum(g, np, einsum_checks, &n_einsum_checks, err));
            continue;
        }
        if (gp_onnx_is_sequence_op(np)) {
            GP_TRY(gp_onnx_lower_sequence_op(g, gp, np, sequence_checks, &n_sequence_checks, err));
            continue;
        }
        int node = gp_graph_add_node(g, np->op_type, np->domain, np->name, (int)np->n_input,
                                     (const char *const *)np->input, (int)np->n_output,
                                     (const char *const *)np->output, err);
        if (node < 0) return err ? err->status : GP_ERR_INVALID;
        for (size_t k = 0; k < np->n_attribute; k++)
            GP_TRY(add_attr(g, node, np->attribute[k], (int)np->n_attribute, err));
    }
    for (size_t i = 0; i < gp->n_output; i++) {
        if (!gp->output[i]->name || !*gp->output[i]->name)
            return gp_error_set(err, GP_ERR_INVALID, "graph output %zu has no name", i);
        GP_TRY(gp_graph_add_output(g, gp->output[i]->name, err));
    }
    GP_TRY(gp_graph_finalize(g, err));
    GP_TRY(gp_onnx_sequence_verify(g, sequence_checks, n_sequence_checks, err));
    return gp_onnx_einsum_verify(g, einsum_checks, n_einsum_checks, err);
}

/* Unpacks the model without its initializers' raw_data (onnx/wire.h), then
 * points each initializer at its bytes in `data`. With `mapping` (the whole
 * file mapped by gp_onnx_load, `data` itself), the initializers stay views
 * of it and the graph takes the mapping over on success; otherwise `data` is
 * the caller's and they are copied. Files the pass does not handle are
 * unpacked as they are, with protobuf-c copying the weights as before. */
static gp_status load_bytes(const void *data, size_t size, const char *path, const char *dir,
                            int64_t batch, bool mapping, struct gp_graph *g, bool *kept,
                            struct gp_error *err)
{
    memset(g, 0, sizeof *g);
    *kept = false;
    uint8_t *stripped = NULL;
    size_t stripped_size = 0, n_refs = 0;
    struct gp_raw_ref *refs = NULL;
    enum gp_wire_result wr = gp_wire_strip_raw_data(data, size, &stripped, &stripped_size, &refs,
                                                    &n_refs);
    if (wr == GP_WIRE_NOMEM)
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory reading the model (%zu bytes)", size);
    Onnx__ModelProto *mp = wr == GP_WIRE_STRIPPED
                               ? onnx__model_proto__unpack(NULL, stripped_size, stripped)
                               : onnx__model_proto__unpack(NULL, size, data);
    free(stripped);
    if (!mp) {
        free(refs);
        return gp_error_set(err, GP_ERR_PARSE,
                            "not a valid ONNX model: the protobuf is malformed or truncated "
                            "(%zu bytes)",
                            size);
    }
    /* The pass counts the initializers as protobuf-c does; should they ever
     * differ, the file is unpacked as it is and nothing is lent. */
    bool lent = wr == GP_WIRE_STRIPPED;
    if (lent && (!mp->graph || mp->graph->n_initializer != n_refs)) {
        onnx__model_proto__free_unpacked(mp, NULL);
        lent = false;
        mp = onnx__model_proto__unpack(NULL, size, data);
        if (!mp) {
            free(refs);
            return gp_error_set(err, GP_ERR_PARSE, "not a valid ONNX model: the protobuf is "
                                                   "malformed or truncated (%zu bytes)", size);
        }
    }
    for (size_t i = 0; lent && i < n_refs; i++) {
        Onnx__TensorProto *tp = mp->graph->initializer[i];
        if (!refs[i].present) continue;
        tp->has_raw_data = 1;
        tp->raw_data.len = refs[i].length;
        tp->raw_data.data = (uint8_t *)data + refs[i].offset;
    }
    /* build_graph's gp_graph_init clears g; pass the paths through it. */
    g->path = path;
    g->dir = dir;
    gp_status st = build_graph(mp, g, batch, lent && mapping, err);
    /* The lent bytes are not protobuf-c's to free. */
    for (size_t i = 0; lent && i < n_refs; i++) {
        if (!refs[i].present) continue;
        mp->graph->initializer[i]->has_raw_data = 0;
        mp->graph->initializer[i]->raw_data.len = 0;
        mp->graph->initializer[i]->raw_data.data = NULL;
    }
    free(refs);
    onnx__model_proto__free_unpacked(mp, NULL);
    if (st == GP_OK && lent && mapping) {
        if (gp_mapping_adopt(&g->mappings, (void *)data, size)) *kept = true;
        else st = gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    }
    if (st != GP_OK) gp_graph_free(g);
    return st;
}

gp_status gp_onnx_load_buffer(const void *data, size_t size, const char *dir, int64_t batch,
                              struct gp_graph *g, struct gp_error *err)
{
    bool kept;
    return load_bytes(data, size, NULL, dir, batch, false, g, &kept, err);
}

gp_status gp_onnx_load(const char *path, int64_t batch, struct gp_graph *g, struct gp_error *err)
{
    memset(g, 0, sizeof *g);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return gp_error_set(err, GP_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return gp_error_set(err, GP_ERR_IO, "'%s' is not a regular file", path);
    }
    if ((size_t)st.st_size > GP_MAX_MODEL_BYTES) {
        close(fd);
        return gp_error_set(err, GP_ERR_UNSUPPORTED,
                            "'%s' is %lld bytes: models over 2 GiB must keep their weights as "
                            "external data",
                            path, (long long)st.st_size);
    }
    /* Mapped, not read: the weights stay in the page cache and the
     * initializers point into it (read-only: nothing writes to a view). */
    size_t size = (size_t)st.st_size;
    static const unsigned char empty[1];
    void *map = size ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0) : (void *)empty;
    close(fd);
    if (map == MAP_FAILED)
        return gp_error_set(err, GP_ERR_IO, "cannot map '%s': %s", path, strerror(errno));
    /* Its size was taken from fstat just now, so every page exists; only a
     * truncation by another process while it is mapped can still fault
     * (SIGBUS), and the table lets the command line name the file then. */
    if (size) gp_mapped_register(map, size, path);
    char *dir = strdup(path);
    if (!dir) {
        if (size) {
            gp_mapped_unregister(map);
            munmap(map, size);
        }
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    }
    char *slash = strrchr(dir, '/');
    if (slash) *(slash == dir ? slash + 1 : slash) = '\0';
    else strcpy(dir, ".");
    bool kept = false;
    gp_status s = load_bytes(map, size, path, dir, batch, size > 0, g, &kept, err);
    if (!kept && size) {
        gp_mapped_unregister(map);
        munmap(map, size);
    }
    free(dir);
    gp_error_prefix(err, "%s: ", path);
    return s;
}
