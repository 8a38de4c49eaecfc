/* The per-layer profile measured on a device (partitioner/profile.h):
 * the model as a one-stage pipeline, trained on synthetic data with every
 * layer timed. Where the CPU profiler runs layers through its own runner,
 * this one runs exactly the kernels, memory layout and streams a stage
 * will have, on the device a stage will use. */
#include "partitioner/profile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/compute.h"
#include "backend/device.h"
#include "graph/layers.h"
#include "pipeline/pipeline.h"

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

/* Bytes per second of a 64 MiB copy from device `index` to `peer` (or
 * within `index`), the best of five, in GB/s; 0 when it cannot be measured. */
static double copy_gbps(const struct gp_device_ops *ops, int index, int peer, struct gp_error *err)
{
    const size_t bytes = (size_t)64 << 20;
    struct gp_device *a = NULL, *b = NULL;
    struct gp_stream *s = NULL;
    void *src = NULL, *dst = NULL;
    double best = 0;
    if (ops->open(index, &a, err) != GP_OK) goto done;
    if (peer >= 0 && peer != index && ops->open(peer, &b, err) != GP_OK) goto done;
    if (ops->stream_create(a, "copy bandwidth", &s, err) != GP_OK) goto done;
    src = ops->alloc(a, bytes);
    dst = ops->alloc(b ? b : a, bytes);
    if (!src || !dst) goto done;
    for (int r = 0; r < 6; r++) {
        double t0 = now_ms();
        ops->copy(s, dst, src, bytes, NULL);
        if (ops->stream_synchronize(s, err) != GP_OK) goto done;
        double ms = now_ms() - t0;
        double gbps = ms > 0 ? (double)bytes / (ms * 1e6) : 0;
        if (r > 0 && gbps > best) best = gbps; /* the first warms up */
    }
done:
    if (src) ops->free(a, src);
    if (dst) ops->free(b ? b : a, dst);
    if (s) ops->stream_destroy(s);
    if (b) ops->close(b);
    if (a) ops->close(a);
    return best;
}

gp_status gp_profile_device(const struct gp_graph *g, const char *model_name, const struct gp_device_ops *ops,
                            int index, int peer, const struct gp_compute_options *compute, int warmup, int repeats,
                            void (*progress)(void *user, int done, int total), void *user,
                            struct gp_profile *out, struct gp_error *err)
{
    memset(out, 0, sizeof *out);
    if (repeats < 1) repeats = 1;
    enum gp_precision precision = compute->precision;
    out->fast_conv = compute->fast_conv;
    if (!ops->compute)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "the %s backend cannot run kernels in this build", ops->name);
    snprintf(out->model, sizeof out->model, "%s", model_name ? model_name : "");
    snprintf(out->device, sizeof out->device, "%s", ops->name);
    out->n_layers = g->n_nodes;
    int input = gp_graph_data_input(g);
    if (input < 0) return gp_error_set(err, GP_ERR_UNSUPPORTED, "the model has no data input to profile with");
    out->micro_batch = g->values[input].shape.dims[0];

    struct gp_layers l = {0};
    struct gp_pipeline *pipe = NULL;
    unsigned char *x = NULL;
    double *fwd = NULL, *bwd = NULL, *f1 = NULL, *b1 = NULL;
    gp_status st = GP_OK;
    out->layers = calloc((size_t)g->n_nodes + 1, sizeof *out->layers);
    size_t n = (size_t)g->n_nodes * (size_t)repeats + 1;
    fwd = malloc(sizeof(double) * n);
    bwd = malloc(sizeof(double) * n);
    f1 = calloc((size_t)g->n_nodes + 1, sizeof(double));
    b1 = calloc((size_t)g->n_nodes + 1, sizeof(double));
    const struct gp_value *in = &g->values[input];
    size_t x_bytes = (size_t)gp_shape_numel(&in->shape) * gp_dtype_size(in->dtype);
    x = calloc(1, x_bytes + 64); /* integer inputs (token ids) stay 0: always in range */
    if (!out->layers || !fwd || !bwd || !f1 || !b1 || !x) {
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory profiling");
        goto done;
    }
    if (gp_dtype_is_float(in->dtype) && in->dtype == GP_DTYPE_FLOAT32)
        for (int64_t i = 0; i < gp_shape_numel(&in->shape); i++)
            ((float *)x)[i] = (float)((i * 7919) % 200 - 100) / 100.0f;
    if ((st = gp_layers_build(g, &l, err)) != GP_OK) goto done;
    gp_profile_fill_bytes(g, &l, ops->compute->saved_bytes, precision, out);

    /* One stage, one micro-batch, everything kept: each layer's forward and
     * backward once per step, as a stage without recomputation runs them.
     * The loss is the output's mean (its gradient is all that backward
     * needs); no optimizer step, so the weights stay as the model has them. */
    const struct gp_device_ops *ops_list[1] = {ops};
    int devices[1] = {index};
    struct gp_pipeline_config pc = {
        .graph = g,
        .n_stages = 1,
        .device_ops = ops_list,
        .device_index = devices,
        .n_micro = 1,
        .checkpoint = GP_CHECKPOINT_NEVER,
        .optim = gp_sgd_defaults(0.0),
        .loss = {.kind = GP_LOSS_OUTPUT, .target_dtype = GP_DTYPE_UNDEFINED},
        .time_layers = true,
        .compute = *compute,
    };
    if ((st = gp_pipeline_create(&pc, &pipe, err)) != GP_OK) goto done;
    double denominator = (double)gp_shape_numel(&g->values[g->outputs[0]].shape);
    for (int rep = 0; rep < warmup + repeats && st == GP_OK; rep++) {
        struct gp_step_opts so = {.seed = 1, .step = (uint64_t)rep, .dropout_ratio = -1};
        double loss = 0;
        if ((st = gp_pipeline_step(pipe, x, NULL, &so, denominator, &loss, err)) != GP_OK) break;
        if (rep >= warmup) {
            gp_pipeline_layer_times(pipe, f1, b1);
            for (int i = 0; i < g->n_nodes; i++) {
                fwd[(size_t)i * (size_t)repeats + (size_t)(rep - warmup)] = f1[i];
                bwd[(size_t)i * (size_t)repeats + (size_t)(rep - warmup)] = b1[i];
            }
        }
        if (progress) progress(user, rep + 1, warmup + repeats);
    }
    if (st != GP_OK) goto done;
    for (int i = 0; i < g->n_nodes; i++) {
        out->layers[i].forward_ms = gp_profile_median(fwd + (size_t)i * (size_t)repeats, repeats);
        out->layers[i].backward_ms = gp_profile_median(bwd + (size_t)i * (size_t)repeats, repeats);
    }
    gp_pipeline_free(pipe);
    pipe = NULL;
    out->copy_gbps = copy_gbps(ops, index, peer, err);
    if (out->copy_gbps <= 0) {
        st = err->status != GP_OK ? err->status
                                  : gp_error_set(err, GP_ERR_DEVICE, "%s:%d: could not measure copy bandwidth",
                                                 ops->name, index);
    }
done:
    gp_pipeline_free(pipe);
    gp_layers_free(&l);
    free(x);
    free(fwd);
    free(bwd);
    free(f1);
    free(b1);
    if (st != GP_OK) gp_profile_free(out);
    return st;
}
