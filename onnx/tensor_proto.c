#include "onnx/tensor_proto.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/external_data.h"

static const char *tensor_name(const Onnx__TensorProto *tp)
{
    return tp->name && *tp->name ? tp->name : "(unnamed)";
}

/* The typed field that holds this dtype (ONNX's rules), and its length. */
static gp_status copy_typed(const Onnx__TensorProto *tp, struct gp_tensor *t, int64_t numel,
                            struct gp_error *err)
{
    const char *name = tensor_name(tp);
    size_t have = 0;
    switch (t->dtype) {
    case GP_DTYPE_FLOAT32: have = tp->n_float_data; break;
    case GP_DTYPE_INT32: case GP_DTYPE_INT16: case GP_DTYPE_INT8: case GP_DTYPE_UINT16:
    case GP_DTYPE_UINT8: case GP_DTYPE_BOOL: case GP_DTYPE_FLOAT16: case GP_DTYPE_BFLOAT16:
        have = tp->n_int32_data; break;
    case GP_DTYPE_INT64: have = tp->n_int64_data; break;
    case GP_DTYPE_FLOAT64: have = tp->n_double_data; break;
    case GP_DTYPE_UINT32: case GP_DTYPE_UINT64: have = tp->n_uint64_data; break;
    default: break;
    }
    if ((int64_t)have != numel)
        return gp_error_set(err, GP_ERR_INVALID,
                            "tensor '%s': holds %zu %s values but its shape needs %lld", name,
                            have, gp_dtype_name(t->dtype), (long long)numel);
    for (int64_t i = 0; i < numel; i++) {
        switch (t->dtype) {
        case GP_DTYPE_FLOAT32: ((float *)t->data)[i] = tp->float_data[i]; break;
        case GP_DTYPE_FLOAT64: ((double *)t->data)[i] = tp->double_data[i]; break;
        case GP_DTYPE_INT64: ((int64_t *)t->data)[i] = tp->int64_data[i]; break;
        case GP_DTYPE_UINT64: ((uint64_t *)t->data)[i] = tp->uint64_data[i]; break;
        case GP_DTYPE_UINT32: ((uint32_t *)t->data)[i] = (uint32_t)tp->uint64_data[i]; break;
        /* float16 and bfloat16 travel as their bit patterns in int32_data. */
        case GP_DTYPE_FLOAT16: case GP_DTYPE_BFLOAT16:
            ((uint16_t *)t->data)[i] = (uint16_t)tp->int32_data[i];
            break;
        default: gp_tensor_set_i64(t, i, tp->int32_data[i]); break;
        }
    }
    return GP_OK;
}

static gp_status map_external(struct gp_graph *g, const Onnx__TensorProto *tp, struct gp_tensor *t,
                              struct gp_error *err)
{
    const char *location = NULL;
    int64_t offset = 0, length = -1;
    for (size_t i = 0; i < tp->n_external_data; i++) {
        const Onnx__StringStringEntryProto *e = tp->external_data[i];
        if (!e->key || !e->value) continue;
        char *end = NULL;
        if (strcmp(e->key, "location") == 0) {
            location = e->value;
        } else if (strcmp(e->key, "offset") == 0 || strcmp(e->key, "length") == 0) {
            errno = 0;
            long long v = strtoll(e->value, &end, 10);
            if (errno || end == e->value || *end || v < 0)
                return gp_error_set(err, GP_ERR_INVALID,
                                    "tensor '%s': external data %s '%s' is not a valid number",
                                    tensor_name(tp), e->key, e->value);
            if (e->key[0] == 'o') offset = v;
            else length = v;
        }
    }
    void *data = NULL;
    GP_TRY(gp_external_data_map(g->dir ? g->dir : ".", location, offset, length, (int64_t)t->nbytes,
                                tensor_name(tp), &g->mappings, &data, err));
    /* Kept a view even when unaligned: every reader of constant data goes
     * through memcpy or the alignment-safe accessors (graph/tensor.h). */
    t->data = data;
    t->view = data != NULL;
    return GP_OK;
}

gp_status gp_onnx_tensor(struct gp_graph *g, const Onnx__TensorProto *tp, bool borrow,
                         struct gp_tensor **out, struct gp_error *err)
{
    const char *name = tensor_name(tp);
    enum gp_dtype dtype = (enum gp_dtype)(tp->has_data_type ? tp->data_type : 0);
    size_t esize = gp_dtype_size(dtype);
    if (!esize)
        return gp_error_set(err, GP_ERR_UNSUPPORTED,
                            "tensor '%s': element type %d (%s) is not supported", name,
                            (int)tp->data_type, gp_dtype_name(dtype));
    if (tp->segment)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "tensor '%s': segmented tensors are not supported",
                            name);
    struct gp_tensor *t = gp_arena_alloc(&g->arena, sizeof *t);
    if (!t) return gp_error_set(err, GP_ERR_NOMEM, "out of memory reading '%s'", name);
    t->dtype = dtype;
    if (tp->n_dims > GP_MAX_RANK)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "tensor '%s': rank %zu exceeds the supported %d",
                            name, tp->n_dims, GP_MAX_RANK);
    t->shape.rank = (int)tp->n_dims;
    for (size_t i = 0; i < tp->n_dims; i++) t->shape.dims[i] = tp->dims[i];
    if (!gp_shape_check(&t->shape, esize)) {
        char s[200];
        return gp_error_set(err, GP_ERR_INVALID,
                            "tensor '%s': invalid dimensions %s (negative or too large)", name,
                            gp_shape_format(&t->shape, s, sizeof s));
    }
    int64_t numel = gp_shape_numel(&t->shape);
    t->nbytes = (size_t)numel * esize;

    if (tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
        GP_TRY(map_external(g, tp, t, err));
    } else if (tp->has_raw_data) {
        if (tp->raw_data.len != t->nbytes)
            return gp_error_set(err, GP_ERR_INVALID,
                                "tensor '%s': raw_data holds %zu bytes but its %s shape needs %zu",
                                name, tp->raw_data.len, gp_dtype_name(dtype), t->nbytes);
        /* raw_data is little-endian, as is every host this program targets.
         * Borrowed, it stays in the mapped file; otherwise it is copied so
         * the protobuf can be freed after loading. */
        if (borrow && t->nbytes) {
            t->data = tp->raw_data.data;
            t->view = true;
        } else {
            t->data = gp_arena_memdup(&g->arena, tp->raw_data.data, t->nbytes);
            if (!t->data) return gp_error_set(err, GP_ERR_NOMEM, "out of memory reading '%s'", name);
        }
    } else {
        t->data = gp_arena_alloc(&g->arena, t->nbytes);
        if (!t->data) return gp_error_set(err, GP_ERR_NOMEM, "out of memory reading '%s'", name);
        GP_TRY(copy_typed(tp, t, numel, err));
    }
    *out = t;
    return GP_OK;
}
