/* Datasets shaped for a model: from .npy arrays, or synthetic. */
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "data/npy.h"
#include "graph/graph.h"
#include "onnx/load.h"

/* The model's single data input (training feeds exactly one). */
static gp_status data_input(const struct gp_graph *g, const char *path, const struct gp_value **out,
                            struct gp_error *err)
{
    int found = 0, v = gp_graph_data_inputs(g, &found);
    if (v >= 0) *out = &g->values[v];
    if (found != 1)
        return gp_error_set(err, GP_ERR_UNSUPPORTED,
                            "%s: training feeds exactly one data input, the model has %d", path,
                            found);
    return GP_OK;
}

static bool same_row_shape(const struct gp_shape *a, const struct gp_shape *b)
{
    if (a->rank != b->rank) return false;
    for (int i = 1; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return false;
    return true;
}

gp_status gp_dataset_from_arrays(const char *model_path, struct gp_npy *x, struct gp_npy *y,
                                 struct gp_dataset *out, struct gp_error *err)
{
    memset(out, 0, sizeof *out);
    struct gp_graph g;
    GP_TRY(gp_onnx_load(model_path, 1, &g, err));
    const struct gp_value *in = NULL;
    gp_status st = data_input(&g, model_path, &in, err);
    if (st != GP_OK) goto done;
    char a[160], b[160];
    if (!same_row_shape(&x->shape, &in->shape) || x->shape.rank < 1) {
        st = gp_error_set(err, GP_ERR_SHAPE,
                          "the data has shape %s but the model input '%s' takes [N%s (any N)",
                          gp_shape_format(&x->shape, a, sizeof a), in->name,
                          strchr(gp_shape_format(&in->shape, b, sizeof b), ',') ? strchr(b, ',') : "]");
        goto done;
    }
    if ((st = gp_npy_convert(x, in->dtype, err)) != GP_OK) goto done;
    if (y) {
        if (y->shape.rank < 1 || y->shape.dims[0] != x->shape.dims[0]) {
            st = gp_error_set(err, GP_ERR_SHAPE, "the labels have %lld rows but the data has %lld",
                              (long long)(y->shape.rank ? y->shape.dims[0] : 0),
                              (long long)x->shape.dims[0]);
            goto done;
        }
        enum gp_dtype to = gp_dtype_is_float(y->dtype) ? GP_DTYPE_FLOAT32 : GP_DTYPE_INT64;
        if ((st = gp_npy_convert(y, to, err)) != GP_OK) goto done;
        out->y = (struct gp_tensor){.dtype = y->dtype, .shape = y->shape, .data = y->data, .nbytes = y->nbytes};
        out->owned_y = y->data;
        y->data = NULL;
    }
    out->x = (struct gp_tensor){.dtype = x->dtype, .shape = x->shape, .data = x->data, .nbytes = x->nbytes};
    out->owned_x = x->data;
    x->data = NULL;
    out->n = x->shape.dims[0];
done:
    gp_graph_free(&g);
    return st;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Size of the table an integer input indexes (the first Gather reading it). */
static int64_t index_range(const struct gp_graph *g, int input)
{
    for (int i = 0; i < g->n_nodes; i++) {
        const struct gp_node *n = &g->nodes[i];
        if (strcmp(n->op_type, "Gather") == 0 && n->n_inputs > 1 && n->inputs[1] == input) {
            const struct gp_value *table = gp_node_input(g, n, 0);
            int axis = (int)gp_node_attr_int(n, "axis", 0);
            if (axis < 0) axis += table->shape.rank;
            return table->shape.dims[axis];
        }
    }
    return 2;
}

gp_status gp_dataset_synthetic(const char *model_path, int64_t n, uint64_t seed,
                               struct gp_dataset *out, struct gp_error *err)
{
    memset(out, 0, sizeof *out);
    struct gp_graph g;
    GP_TRY(gp_onnx_load(model_path, 1, &g, err));
    const struct gp_value *in = NULL;
    gp_status st = data_input(&g, model_path, &in, err);
    if (st != GP_OK) goto done;
    const struct gp_value *o = &g.values[g.outputs[0]];
    uint64_t rng = seed * 0x2545F4914F6CDD1Dull + 7;

    struct gp_shape xs = in->shape;
    xs.dims[0] = n;
    out->x = (struct gp_tensor){.dtype = in->dtype, .shape = xs};
    out->x.nbytes = (size_t)gp_shape_numel(&xs) * gp_dtype_size(in->dtype);
    out->owned_x = out->x.data = malloc(out->x.nbytes ? out->x.nbytes : 1);
    if (!out->x.data) {
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory making %lld synthetic samples", (long long)n);
        goto done;
    }
    int64_t range = gp_dtype_is_float(in->dtype) ? 0 : index_range(&g, (int)(in - g.values));
    for (int64_t i = 0; i < gp_shape_numel(&xs); i++) {
        uint64_t r = splitmix(&rng);
        if (range) gp_tensor_set_i64(&out->x, i, (int64_t)(r % (uint64_t)range));
        else gp_tensor_set_f64(&out->x, i, (double)(r >> 11) * (2.0 / 9007199254740992.0) - 1.0);
    }
    /* Class labels for [N, C] and [N, T, C] logits; float targets otherwise. */
    struct gp_shape ys = o->shape;
    ys.dims[0] = n;
    bool classes = o->shape.rank == 2 || o->shape.rank == 3;
    int64_t n_classes = classes ? o->shape.dims[o->shape.rank - 1] : 0;
    if (classes) ys.rank--;
    out->y = (struct gp_tensor){.dtype = classes ? GP_DTYPE_INT64 : GP_DTYPE_FLOAT32, .shape = ys};
    out->y.nbytes = (size_t)gp_shape_numel(&ys) * gp_dtype_size(out->y.dtype);
    out->owned_y = out->y.data = malloc(out->y.nbytes ? out->y.nbytes : 1);
    if (!out->y.data) {
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory making synthetic labels");
        goto done;
    }
    for (int64_t i = 0; i < gp_shape_numel(&ys); i++) {
        uint64_t r = splitmix(&rng);
        if (classes) ((int64_t *)out->y.data)[i] = (int64_t)(r % (uint64_t)n_classes);
        else ((float *)out->y.data)[i] = (float)((double)(r >> 11) / 9007199254740992.0);
    }
    out->n = n;
done:
    if (st != GP_OK) gp_dataset_free(out);
    gp_graph_free(&g);
    return st;
}
