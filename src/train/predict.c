#include "train/predict.h"

#include <stdlib.h>
#include <string.h>

#include "backend/cpu/runner.h"
#include "onnx/load.h"

gp_status gp_predict(const char *model_path, const struct gp_dataset *data, int64_t batch,
                     bool training, struct gp_tensor *out, struct gp_error *err)
{
    memset(out, 0, sizeof *out);
    struct gp_graph g;
    GP_TRY(gp_onnx_load(model_path, batch, &g, err));
    struct gp_cpu_runner *r = NULL;
    int64_t *rows = malloc(sizeof(int64_t) * (size_t)(batch + data->n + 1));
    gp_status st = rows ? gp_cpu_runner_create_f32(&g, false, &r, err)
                        : gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    if (st != GP_OK) goto done;
    int input = -1, output = g.outputs[0];
    for (int i = 0; i < g.n_inputs; i++)
        if (!g.values[g.inputs[i]].is_initializer) input = g.inputs[i];
    const struct gp_value *o = &g.values[output];
    out->dtype = GP_DTYPE_FLOAT32;
    out->shape = o->shape;
    out->shape.dims[0] = data->n;
    int64_t per_row = gp_shape_numel(&o->shape) / batch;
    out->nbytes = sizeof(float) * (size_t)(per_row * data->n);
    out->data = malloc(out->nbytes + 64);
    float *chunk = malloc(sizeof(float) * (size_t)gp_shape_numel(&o->shape) + 64);
    if (!out->data || !chunk) {
        free(chunk);
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory for the predictions");
        goto done;
    }
    for (int64_t i = 0; i < data->n; i++) rows[i] = i;
    struct gp_run_opts ro = {.training = training, .dropout_ratio = training ? 0 : -1};
    for (int64_t i = 0; i < data->n && st == GP_OK; i += batch) {
        int64_t n = data->n - i < batch ? data->n - i : batch;
        gp_dataset_gather(&data->x, rows, data->n, i, batch, gp_cpu_runner_data_f32(r, input));
        st = gp_cpu_runner_forward_f32(r, &ro, 0, g.n_nodes, err);
        if (st != GP_OK) break;
        gp_cpu_runner_get_f32(r, output, chunk);
        memcpy((float *)out->data + i * per_row, chunk, sizeof(float) * (size_t)(n * per_row));
    }
    free(chunk);
done:
    if (st != GP_OK) {
        free(out->data);
        out->data = NULL;
    }
    free(rows);
    gp_cpu_runner_free_f32(r);
    gp_graph_free(&g);
    return st;
}
