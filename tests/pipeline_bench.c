#include "pipeline_bench.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "onnx/load.h"

void pipe_bench_open(const struct pipe_bench_setup *su, struct pipe_bench *b)
{
    char model[4096], name[256];
    snprintf(name, sizeof name, "%s.onnx", su->fixture);
    fixture_path(name, model, sizeof model);
    struct gp_error err = {0};
    memset(b, 0, sizeof *b);
    b->su = *su;
    if (gp_dataset_synthetic(model, su->batch * su->batches, 7, &b->ds, &err) != GP_OK) fail_msg("%s", err.msg);
    int64_t micro = su->batch / su->chunks;
    if (gp_onnx_load(model, micro, &b->g, &err) != GP_OK) fail_msg("%s", err.msg);
    b->x_row = gp_dataset_row_bytes(&b->ds.x);
    b->y_row = gp_dataset_row_bytes(&b->ds.y);
    const struct gp_value *o = &b->g.values[b->g.outputs[0]];
    struct gp_loss_spec loss = {.ignore_index = GP_LOSS_IGNORE_INDEX, .target_dtype = b->ds.y.dtype,
                                .target_shape = b->ds.y.shape};
    loss.target_shape.dims[0] = micro;
    if (b->ds.y.dtype == GP_DTYPE_INT64) {
        loss.kind = GP_LOSS_CROSS_ENTROPY;
        if (gp_loss_class_axis(&o->shape, &loss.target_shape, GP_CLASS_AXIS_AUTO, &loss.class_axis, &err) != GP_OK)
            fail_msg("%s", err.msg);
    } else {
        loss.kind = GP_LOSS_MSE;
    }
    b->loss = loss.kind;
    struct gp_optim_config oc = su->adamw ? gp_adamw_defaults(2e-3) : gp_sgd_defaults(0.05);
    if (!su->adamw) {
        oc.momentum = 0.9;
        oc.weight_decay = 1e-3;
    }
    const struct gp_device_ops *ops[8];
    for (int k = 0; k < su->stages; k++) ops[k] = su->ops;
    struct gp_pipeline_config pc = {
        .graph = &b->g,
        .n_stages = su->stages,
        .balance = su->balance,
        .device_ops = ops,
        .device_index = su->device,
        .n_micro = su->chunks,
        .schedule = su->schedule,
        .checkpoint = GP_CHECKPOINT_EXCEPT_LAST,
        .optim = oc,
        .deferred_batch_norm = su->deferred_bn,
        .loss = loss,
        .cuda_graph = su->graph,
        .compute = {.precision = su->precision},
        .remote = su->remote,
    };
    if (gp_pipeline_create(&pc, &b->p, &err) != GP_OK) fail_msg("%s: %s", su->fixture, err.msg);
}

void pipe_bench_close(struct pipe_bench *b)
{
    gp_pipeline_free(b->p);
    gp_graph_free(&b->g);
    gp_dataset_free(&b->ds);
}

const void *pipe_bench_x(const struct pipe_bench *b, int s)
{
    return (const char *)b->ds.x.data + (size_t)((s % b->su.batches) * b->su.batch) * b->x_row;
}

const void *pipe_bench_y(const struct pipe_bench *b, int s)
{
    return (const char *)b->ds.y.data + (size_t)((s % b->su.batches) * b->su.batch) * b->y_row;
}

double pipe_bench_denominator(const struct pipe_bench *b, const void *y)
{
    int64_t n = gp_shape_numel(&b->ds.y.shape) / b->ds.n * b->su.batch;
    if (b->loss == GP_LOSS_CROSS_ENTROPY) return (double)gp_loss_count_targets(y, n, GP_LOSS_IGNORE_INDEX);
    return (double)n;
}

static bool kept(const struct gp_value *val)
{
    return val->is_initializer && gp_dtype_is_float(val->dtype) &&
           (val->kind == GP_VALUE_PARAMETER || val->kind == GP_VALUE_BUFFER);
}

float *pipe_bench_keep(struct pipe_bench *b, size_t *count)
{
    struct gp_error err = {0};
    int slots = gp_pipeline_optim_slots(b->p);
    size_t n = 0;
    for (int v = 0; v < b->g.n_values; v++)
        if (kept(&b->g.values[v]))
            n += (size_t)gp_shape_numel(&b->g.values[v].shape) *
                 (size_t)(1 + (b->g.values[v].kind == GP_VALUE_PARAMETER ? slots : 0));
    float *out = malloc(sizeof(float) * (n + 1));
    assert_non_null(out);
    float *at = out;
    for (int v = 0; v < b->g.n_values; v++) {
        const struct gp_value *val = &b->g.values[v];
        if (!kept(val)) continue;
        int64_t numel = gp_shape_numel(&val->shape);
        if (gp_pipeline_read(b->p, v, at, &err) != GP_OK) fail_msg("%s", err.msg);
        at += numel;
        for (int q = 0; val->kind == GP_VALUE_PARAMETER && q < slots; q++) {
            if (gp_pipeline_read_optim(b->p, v, q, at, &err) != GP_OK) fail_msg("%s", err.msg);
            at += numel;
        }
    }
    *count = n;
    return out;
}
