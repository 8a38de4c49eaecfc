#include "train/predict.h"

#include <stdlib.h>
#include <string.h>

#include "graph/layout.h"
#include "onnx/load.h"
#include "pipeline/pipeline.h"

gp_status gp_predict(const char *model_path, const struct gp_dataset *data, const struct gp_predict_options *o,
                     struct gp_tensor *out, struct gp_error *err)
{
    memset(out, 0, sizeof *out);
    int64_t batch = o->batch;
    struct gp_graph g;
    GP_TRY(gp_onnx_load(model_path, batch, &g, err));
    if (o->channels_last) gp_graph_channels_last(&g);
    /* One stage, one micro-batch per forward: the executor's evaluation,
     * in the precision asked for, on the device asked for. */
    struct gp_pipeline *p = NULL;
    struct gp_pipeline_config pc = {
        .graph = &g,
        .n_stages = 1,
        .device_ops = &o->device_ops,
        .device_index = &o->device_index,
        .n_micro = 1,
        .checkpoint = GP_CHECKPOINT_EXCEPT_LAST,
        .optim = gp_sgd_defaults(0),
        .loss = {.kind = GP_LOSS_OUTPUT, .target_dtype = GP_DTYPE_UNDEFINED},
        .compute = {.precision = o->precision},
    };
    int64_t *rows = malloc(sizeof(int64_t) * (size_t)(batch + data->n + 1));
    void *x = malloc(gp_dataset_row_bytes(&data->x) * (size_t)batch + 64);
    float *chunk = NULL;
    gp_status st = rows && x ? gp_pipeline_create(&pc, &p, err) : gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    if (st != GP_OK) goto done;
    const struct gp_value *ov = &g.values[g.outputs[0]];
    out->dtype = GP_DTYPE_FLOAT32;
    out->shape = ov->shape;
    out->shape.dims[0] = data->n;
    int64_t per_row = gp_shape_numel(&ov->shape) / batch;
    out->nbytes = sizeof(float) * (size_t)(per_row * data->n);
    out->data = malloc(out->nbytes + 64);
    chunk = malloc(sizeof(float) * (size_t)gp_shape_numel(&ov->shape) + 64);
    if (!out->data || !chunk) {
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory for the predictions");
        goto done;
    }
    for (int64_t i = 0; i < data->n; i++) rows[i] = i;
    for (int64_t i = 0; i < data->n && st == GP_OK; i += batch) {
        int64_t n = data->n - i < batch ? data->n - i : batch;
        gp_dataset_gather(&data->x, rows, data->n, i, batch, x);
        st = gp_pipeline_eval(p, x, o->training, chunk, err);
        if (st != GP_OK) break;
        memcpy((float *)out->data + i * per_row, chunk, sizeof(float) * (size_t)(n * per_row));
    }
done:
    if (st != GP_OK) {
        free(out->data);
        out->data = NULL;
    }
    free(chunk);
    free(x);
    free(rows);
    gp_pipeline_free(p);
    gp_graph_free(&g);
    return st;
}
