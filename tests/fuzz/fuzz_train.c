/* libFuzzer target through the training executor: a small model that loads
 * (micro-batch 1) is made into a pipeline on CPU devices, two micro-batches,
 * and trains one step against zero targets (mean squared error on its first
 * output; zero inputs, token ids 0): the planner, the schedule and the CPU
 * compute ops. The input's last byte picks float32 or bf16, NCHW or
 * channels-last, BatchNorm outputs kept or remade, one stage or two (where
 * the model has two layers), GPipe or 1F1B; after the step, one
 * micro-batch is evaluated (batch or running statistics). Any bytes end in
 * results or an error with a message, never a crash, a hang or a
 * sanitizer report.
 * Models whose values take more than RUN_BYTES are only loaded. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/device.h"
#include "graph/layout.h"
#include "pipeline/pipeline.h"
#include "train/loss.h"
#include "small_model.h"

#define RUN_BYTES (2 << 20)
#define MICRO 2

static void step(const struct gp_graph *g, uint8_t pick)
{
    struct gp_error err = {0};
    int input = gp_graph_data_input(g);
    const struct gp_value *o = &g->values[g->outputs[0]];
    if (input < 0 || !gp_dtype_is_float(o->dtype)) return;
    struct gp_loss_spec loss = {.kind = GP_LOSS_MSE, .ignore_index = GP_LOSS_IGNORE_INDEX,
                                .target_dtype = GP_DTYPE_FLOAT32, .target_shape = o->shape};
    const struct gp_device_ops *ops[2] = {&gp_cpu_device_ops, &gp_cpu_device_ops};
    int device[2] = {0, 1};
    int stages = (pick & 8) && g->n_nodes >= 2 ? 2 : 1;
    struct gp_pipeline_config pc = {
        .graph = g, .n_stages = stages, .device_ops = ops, .device_index = device, .n_micro = MICRO,
        .schedule = pick & 16 ? GP_PIPE_1F1B : GP_PIPE_GPIPE,
        .checkpoint = GP_CHECKPOINT_EXCEPT_LAST, .optim = gp_sgd_defaults(0.01), .loss = loss,
        .compute = {.precision = pick & 1 ? GP_PRECISION_BF16 : GP_PRECISION_FP32, .remake_norm = pick & 4}};
    struct gp_pipeline *p = NULL;
    if (gp_pipeline_create(&pc, &p, &err) != GP_OK) {
        if (err.msg[0] == '\0') __builtin_trap();
        return;
    }
    size_t xb = (size_t)gp_value_bytes(&g->values[input]) * MICRO;
    size_t yb = (size_t)gp_shape_numel(&o->shape) * sizeof(float) * MICRO;
    void *x = calloc(1, xb + 1), *y = calloc(1, yb + 1);
    if (x && y) {
        struct gp_step_opts so = {.seed = 1, .dropout_ratio = -1};
        struct gp_step_outcome out = {0};
        double denominator = (double)gp_shape_numel(&o->shape) * MICRO;
        gp_status st = gp_pipeline_train_step(p, x, y, &so, denominator > 0 ? denominator : 1, 0.01, 0, &out, &err);
        if (st != GP_OK && err.msg[0] == '\0') __builtin_trap();
        /* Then an evaluation of one micro-batch (predict's path), into y's room. */
        if (st == GP_OK && gp_pipeline_eval(p, x, pick & 32, y, &err) != GP_OK && err.msg[0] == '\0')
            __builtin_trap();
    }
    free(x);
    free(y);
    gp_pipeline_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gp_graph g;
    if (!fuzz_load(data, size, &g)) return 0;
    uint8_t pick = size ? data[size - 1] : 0;
    if (fuzz_small_model(&g, RUN_BYTES)) {
        if (pick & 2) gp_graph_channels_last(&g);
        step(&g, pick);
    }
    gp_graph_free(&g);
    return 0;
}
