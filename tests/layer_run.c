/* One layer on any backend and precision (layer_run.h). */
#include "layer_run.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/mixed_call.h"
#include "ops/registry.h"
#include "pipeline/plan.h"

#define MAX_IO LAYER_RUN_MAX_IO

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float uniform(float lo, float hi)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return lo + (hi - lo) * (float)((rng >> 40) * (1.0 / 16777216.0));
}

static size_t host_esize(enum gp_dtype dt) { return gp_dtype_is_float(dt) ? sizeof(float) : gp_dtype_size(dt); }

static void *xmalloc(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 16);
    assert_non_null(p);
    return p;
}

static bool nondiff(const struct gp_node *n, int k) { return k < 32 && ((n->def->nondiff_inputs >> k) & 1); }

static bool is_graph_input(const struct gp_graph *g, int v)
{
    for (int k = 0; k < g->n_inputs; k++)
        if (g->inputs[k] == v) return true;
    return false;
}

void layer_run_inputs(const struct gp_graph *g, int layer, int64_t index_bound, struct layer_io *io)
{
    layer_run_inputs_gen(g, layer, index_bound, NULL, NULL, io);
}

void layer_run_inputs_gen(const struct gp_graph *g, int layer, int64_t index_bound,
                          double (*gen)(const char *name, int64_t i, void *user), void *user,
                          struct layer_io *io)
{
    const struct gp_node *node = &g->nodes[layer];
    memset(io, 0, sizeof *io);
    if (node->n_inputs > MAX_IO || node->n_outputs > MAX_IO) fail_msg("layer %d: too many inputs or outputs", layer);
    bool trainable = false;
    for (int k = 0; k < node->n_inputs; k++) {
        if (node->inputs[k] < 0) continue;
        const struct gp_value *v = &g->values[node->inputs[k]];
        int64_t n = gp_shape_numel(&v->shape);
        io->in[k] = xmalloc((size_t)n * host_esize(v->dtype));
        bool generated = gen && !v->constant && is_graph_input(g, node->inputs[k]) && n > 0 &&
                         !isnan(gen(v->name, 0, user));
        if (generated) {
            struct gp_tensor t = {.dtype = gp_dtype_is_float(v->dtype) ? GP_DTYPE_FLOAT32 : v->dtype,
                                  .shape = v->shape, .data = io->in[k]};
            for (int64_t e = 0; e < n; e++) {
                double x = gen(v->name, e, user);
                gp_tensor_set_f64(&t, e, isnan(x) ? uniform(-2, 2) : x);
            }
        } else if (v->constant) {
            if (gp_dtype_is_float(v->dtype))
                for (int64_t e = 0; e < n; e++) ((float *)io->in[k])[e] = (float)gp_tensor_get_f64(v->constant, e);
            else
                memcpy(io->in[k], v->constant->data, (size_t)n * gp_dtype_size(v->dtype));
        } else if (gp_dtype_is_float(v->dtype)) {
            for (int64_t e = 0; e < n; e++) ((float *)io->in[k])[e] = uniform(-2, 2);
        } else if (v->dtype == GP_DTYPE_BOOL) {
            for (int64_t e = 0; e < n; e++) ((uint8_t *)io->in[k])[e] = uniform(0, 1) < 0.5f;
        } else if (v->dtype == GP_DTYPE_INT64 || v->dtype == GP_DTYPE_INT32) {
            for (int64_t e = 0; e < n; e++) {
                int64_t x = (int64_t)uniform(0, (float)index_bound);
                if (v->dtype == GP_DTYPE_INT64) ((int64_t *)io->in[k])[e] = x;
                else ((int32_t *)io->in[k])[e] = (int32_t)x;
            }
        } else {
            fail_msg("layer %d: input '%s' is %s and not an initializer", layer, v->name, gp_dtype_name(v->dtype));
        }
        io->want_din[k] = gp_dtype_is_float(v->dtype) && !nondiff(node, k);
        if (io->want_din[k]) {
            trainable = true;
            io->din0[k] = xmalloc(sizeof(float) * (size_t)n);
            /* Small: backward accumulates into it, and the gradient must dominate. */
            for (int64_t e = 0; e < n; e++) io->din0[k][e] = uniform(-0.01f, 0.01f);
        }
    }
    bool float_out = false;
    for (int k = 0; k < node->n_outputs; k++) {
        if (node->outputs[k] < 0) continue;
        const struct gp_value *v = &g->values[node->outputs[k]];
        if (!gp_dtype_is_float(v->dtype)) continue;
        float_out = true;
        int64_t n = gp_shape_numel(&v->shape);
        io->dout[k] = xmalloc(sizeof(float) * (size_t)n);
        for (int64_t e = 0; e < n; e++) io->dout[k][e] = uniform(-1, 1);
    }
    io->backward = trainable && float_out;
}

/* ---- one run ---- */

struct run {
    const struct gp_compute_ops *cops;
    void *cctx;
    struct gp_layer_call call;
    void *staging;
    bool backward;
};

static gp_status run_task(void *arg, struct gp_error *err)
{
    struct run *r = arg;
    GP_TRY(gp_mixed_forward(r->cops, r->cctx, &r->call, r->staging, err));
    if (r->backward) GP_TRY(gp_mixed_backward(r->cops, r->cctx, &r->call, r->staging, err));
    return GP_OK;
}

/* Host float32 data in the storage type dt (bfloat16 rounded as the
 * backends round), ready to copy. */
static void *stored(const float *x, int64_t n, enum gp_dtype dt)
{
    if (dt != GP_DTYPE_BFLOAT16) {
        void *c = xmalloc(sizeof(float) * (size_t)n);
        memcpy(c, x, sizeof(float) * (size_t)n);
        return c;
    }
    uint16_t *b = xmalloc(sizeof(uint16_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) b[i] = gp_float_to_bf16(x[i]);
    return b;
}

static float *widened(const void *d, int64_t n, enum gp_dtype dt)
{
    float *f = xmalloc(sizeof(float) * (size_t)n);
    if (dt == GP_DTYPE_BFLOAT16)
        for (int64_t i = 0; i < n; i++) f[i] = gp_bf16_to_float(((const uint16_t *)d)[i]);
    else
        memcpy(f, d, sizeof(float) * (size_t)n);
    return f;
}

void layer_run(const struct gp_device_ops *ops, int index, enum gp_precision p, const struct gp_graph *g,
               int layer, const char *label, struct layer_io *io)
{
    const struct gp_node *node = &g->nodes[layer];
    const struct gp_compute_ops *cops = ops->compute;
    struct gp_error err = {0};
    struct gp_device *dev = NULL;
    struct gp_stream *stream = NULL;
    if (ops->open(index, &dev, &err) != GP_OK) fail_msg("%s: open: %s", label, err.msg);
    if (ops->stream_create(dev, "layer", &stream, &err) != GP_OK) fail_msg("%s: stream: %s", label, err.msg);
    struct gp_compute_options opts = {.precision = p};
    void *workspace = cops->context_bytes ? ops->alloc(dev, cops->context_bytes) : NULL;
    void *cctx = NULL;
    if (cops->context_create(dev, stream, &opts, workspace, &cctx, &err) != GP_OK)
        fail_msg("%s: context: %s", label, err.msg);
    const void *kernel = cops->kernel_for(node);
    if (!kernel) fail_msg("%s: the %s backend has no kernel for %s", label, ops->name, node->op_type);

    /* Storage types as a stage plans them (pipeline/plan.c). */
    bool bf16 = p == GP_PRECISION_BF16;
    enum gp_dtype in_dt[MAX_IO + 1], out_dt[MAX_IO + 1], din_dt[MAX_IO + 1], dout_dt[MAX_IO + 1];
    for (int k = 0; k < node->n_inputs; k++) {
        const struct gp_value *v = node->inputs[k] >= 0 ? &g->values[node->inputs[k]] : NULL;
        bool fl = v && gp_dtype_is_float(v->dtype);
        bool act = v && !v->constant;
        in_dt[k] = !v ? GP_DTYPE_FLOAT32
                   : !fl ? v->dtype
                   : bf16 && (act || gp_plan_autocast_op(node)) ? GP_DTYPE_BFLOAT16 /* activation or shadow */
                                                               : GP_DTYPE_FLOAT32;
        din_dt[k] = bf16 && act && fl ? GP_DTYPE_BFLOAT16 : GP_DTYPE_FLOAT32;
    }
    for (int k = 0; k < node->n_outputs; k++) {
        const struct gp_value *v = node->outputs[k] >= 0 ? &g->values[node->outputs[k]] : NULL;
        out_dt[k] = !v ? GP_DTYPE_FLOAT32 : !gp_dtype_is_float(v->dtype) ? v->dtype
                                     : bf16 ? GP_DTYPE_BFLOAT16 : GP_DTYPE_FLOAT32;
        dout_dt[k] = out_dt[k];
    }

    void *din[MAX_IO + 1] = {0}, *dout[MAX_IO + 1] = {0}, *in[MAX_IO + 1] = {0}, *out[MAX_IO + 1] = {0};
    struct gp_task_tag tag = {.kind = GP_TASK_COPY, .stage = -1, .microbatch = -1, .name = "layer data"};
    void *host_tmp[4 * MAX_IO] = {0};
    int n_tmp = 0;
    uint32_t din_wanted = 0;
    for (int k = 0; k < node->n_inputs; k++) {
        if (!io->in[k]) continue;
        /* A value read twice has one buffer and one gradient, as in a stage. */
        int same = -1;
        for (int q = 0; q < k && same < 0; q++)
            if (node->inputs[q] == node->inputs[k]) same = q;
        if (same >= 0) {
            in[k] = in[same];
            din[k] = din[same];
            if (din[k]) din_wanted |= k < 32 ? 1u << k : 0;
            continue;
        }
        const struct gp_value *v = &g->values[node->inputs[k]];
        int64_t n = gp_shape_numel(&v->shape);
        size_t bytes = (size_t)n * gp_dtype_size(gp_dtype_is_float(v->dtype) ? in_dt[k] : v->dtype);
        void *h = gp_dtype_is_float(v->dtype) ? stored(io->in[k], n, in_dt[k]) : NULL;
        if (h) host_tmp[n_tmp++] = h;
        in[k] = ops->alloc(dev, bytes + 64);
        assert_non_null(in[k]);
        ops->copy(stream, in[k], h ? h : io->in[k], bytes, &tag);
        if (io->backward && io->want_din[k]) {
            din_wanted |= k < 32 ? 1u << k : 0;
            size_t gbytes = (size_t)n * gp_dtype_size(din_dt[k]);
            void *hd = stored(io->din0[k], n, din_dt[k]);
            host_tmp[n_tmp++] = hd;
            din[k] = ops->alloc(dev, gbytes + 64);
            assert_non_null(din[k]);
            ops->copy(stream, din[k], hd, gbytes, &tag);
        }
    }
    for (int k = 0; k < node->n_outputs; k++) {
        if (node->outputs[k] < 0) continue;
        const struct gp_value *v = &g->values[node->outputs[k]];
        int64_t n = gp_shape_numel(&v->shape);
        out[k] = ops->alloc(dev, (size_t)n * gp_dtype_size(out_dt[k]) + 64);
        assert_non_null(out[k]);
        if (io->backward && io->dout[k]) {
            void *hd = stored(io->dout[k], n, dout_dt[k]);
            host_tmp[n_tmp++] = hd;
            dout[k] = ops->alloc(dev, (size_t)n * gp_dtype_size(dout_dt[k]) + 64);
            assert_non_null(dout[k]);
            ops->copy(stream, dout[k], hd, (size_t)n * gp_dtype_size(dout_dt[k]), &tag);
        }
    }
    size_t saved_bytes = cops->saved_bytes(g, node), scratch_bytes = cops->scratch_bytes(g, node, &opts, ~0u);
    size_t fs = gp_mixed_staging_bytes(cops, kernel, g, node, in_dt, out_dt, NULL, NULL, false, 0);
    size_t bs = io->backward ? gp_mixed_staging_bytes(cops, kernel, g, node, in_dt, out_dt, din_dt, dout_dt, true,
                                                      din_wanted)
                             : 0;
    void *saved = ops->alloc(dev, saved_bytes + 64), *scratch = ops->alloc(dev, scratch_bytes + 64);
    void *staging = ops->alloc(dev, (fs > bs ? fs : bs) + 64);
    assert_non_null(saved);
    assert_non_null(scratch);
    assert_non_null(staging);

    struct run r = {
        .cops = cops,
        .cctx = cctx,
        .staging = staging,
        .backward = io->backward,
        .call = {.graph = g, .node = node, .kernel = kernel, .in = in, .out = out, .din = (float *const *)din,
                 .dout = (float *const *)dout, .in_dt = in_dt, .out_dt = out_dt, .din_dt = din_dt,
                 .dout_dt = dout_dt, .din_overwrite = io->din_overwrite, .saved = saved, .scratch = scratch,
                 .training = true, .update_state = true,
                 .seed = 1234, .step = 7, .sample_offset = 3, .dropout_ratio = -1},
    };
    struct gp_task_tag ttag = {.kind = GP_TASK_FORWARD, .stage = 0, .microbatch = 0, .name = "layer"};
    ops->enqueue(stream, run_task, &r, &ttag);
    if (ops->stream_synchronize(stream, &err) != GP_OK) fail_msg("%s: %s %s: %s", label, ops->name,
                                                                 gp_precision_name(p), err.msg);

    /* Results back to the host, widened to float32. */
    void *dl[2 * MAX_IO] = {0};
    for (int k = 0; k < node->n_outputs; k++) {
        if (!out[k]) continue;
        const struct gp_value *v = &g->values[node->outputs[k]];
        int64_t n = gp_shape_numel(&v->shape);
        size_t bytes = (size_t)n * gp_dtype_size(out_dt[k]);
        dl[k] = xmalloc(bytes);
        ops->copy(stream, dl[k], out[k], bytes, &tag);
    }
    for (int k = 0; k < node->n_inputs; k++) {
        if (!din[k]) continue;
        int64_t n = gp_shape_numel(&g->values[node->inputs[k]].shape);
        size_t bytes = (size_t)n * gp_dtype_size(din_dt[k]);
        dl[MAX_IO + k] = xmalloc(bytes);
        ops->copy(stream, dl[MAX_IO + k], din[k], bytes, &tag);
    }
    if (ops->stream_synchronize(stream, &err) != GP_OK) fail_msg("%s: read back: %s", label, err.msg);
    for (int k = 0; k < node->n_outputs; k++) {
        if (!dl[k]) continue;
        const struct gp_value *v = &g->values[node->outputs[k]];
        int64_t n = gp_shape_numel(&v->shape);
        if (gp_dtype_is_float(v->dtype)) {
            io->out[k] = widened(dl[k], n, out_dt[k]);
            free(dl[k]);
        } else {
            io->out[k] = dl[k];
        }
    }
    for (int k = 0; k < node->n_inputs; k++) {
        if (!dl[MAX_IO + k]) continue;
        io->din[k] = widened(dl[MAX_IO + k], gp_shape_numel(&g->values[node->inputs[k]].shape), din_dt[k]);
        free(dl[MAX_IO + k]);
    }

    for (int k = 0; k < MAX_IO + 1; k++) {
        bool shared = false; /* freed with the first reader's */
        for (int q = 0; q < k && k < node->n_inputs; q++) shared |= in[q] == in[k];
        if (in[k] && !shared) ops->free(dev, in[k]);
        if (din[k] && !shared) ops->free(dev, din[k]);
        if (out[k]) ops->free(dev, out[k]);
        if (dout[k]) ops->free(dev, dout[k]);
    }
    for (int t = 0; t < n_tmp; t++) free(host_tmp[t]);
    ops->free(dev, saved);
    ops->free(dev, scratch);
    ops->free(dev, staging);
    cops->context_destroy(cctx);
    if (workspace) ops->free(dev, workspace);
    ops->stream_destroy(stream);
    ops->close(dev);
}

void layer_run_free_results(const struct gp_graph *g, int layer, struct layer_io *io)
{
    (void)g, (void)layer;
    for (int k = 0; k < MAX_IO; k++) {
        free(io->out[k]);
        free(io->din[k]);
        io->out[k] = NULL;
        io->din[k] = NULL;
    }
}

void layer_run_free(const struct gp_graph *g, int layer, struct layer_io *io)
{
    layer_run_free_results(g, layer, io);
    for (int k = 0; k < MAX_IO; k++) {
        free(io->in[k]);
        free(io->dout[k]);
        free(io->din0[k]);
    }
    memset(io, 0, sizeof *io);
}

double layer_compare(const char *label, const char *tensor, int index, const float *a, const float *b, int64_t n,
                     double rel, double flips)
{
    double ss = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(b[i])) ss += (double)b[i] * b[i];
    double rms = n ? sqrt(ss / (double)n) : 0;
    double worst = 0;
    int64_t bad = 0, first_bad = -1;
    for (int64_t i = 0; i < n; i++) {
        if (a[i] == b[i] || (isnan(a[i]) && isnan(b[i]))) continue;
        double scale = fabs((double)b[i]) + rms;
        double d = fabs((double)a[i] - (double)b[i]) / (scale > 0 ? scale : 1);
        if (!(d <= rel)) {
            if (first_bad < 0) first_bad = i;
            bad++;
            continue;
        }
        if (d > worst) worst = d;
    }
    /* One element more: a small tensor of an ill-conditioned op (a random
     * divisor near 0) may have one. */
    if ((double)bad > flips * (double)n + 1)
        fail_msg("%s: %s %d: %lld of %lld elements differ by more than %.3g of (|ref| + rms %.3g); first, element "
                 "%lld: %.9g against %.9g",
                 label, tensor, index, (long long)bad, (long long)n, rel, rms, (long long)first_bad,
                 (double)a[first_bad], (double)b[first_bad]);
    return worst;
}

double layer_compare_all(const struct gp_graph *g, int layer, const char *label, const struct layer_io *a,
                         const struct layer_io *b, double rel, double flips)
{
    const struct gp_node *node = &g->nodes[layer];
    double worst = 0;
    for (int k = 0; k < node->n_outputs; k++) {
        if (!a->out[k] || !b->out[k]) continue;
        const struct gp_value *v = &g->values[node->outputs[k]];
        int64_t n = gp_shape_numel(&v->shape);
        if (!gp_dtype_is_float(v->dtype)) {
            size_t es = gp_dtype_size(v->dtype);
            int64_t bad = 0;
            for (int64_t i = 0; i < n; i++)
                bad += memcmp((const char *)a->out[k] + i * es, (const char *)b->out[k] + i * es, es) != 0;
            if ((double)bad > flips * (double)n + 1)
                fail_msg("%s: output %d (%s): %lld of %lld elements differ", label, k, gp_dtype_name(v->dtype),
                         (long long)bad, (long long)n);
            continue;
        }
        double w = layer_compare(label, "output", k, a->out[k], b->out[k], n, rel, flips);
        if (w > worst) worst = w;
    }
    for (int k = 0; k < node->n_inputs; k++) {
        if (!a->din[k] || !b->din[k]) continue;
        int64_t n = gp_shape_numel(&g->values[node->inputs[k]].shape);
        double w = layer_compare(label, "input gradient", k, a->din[k], b->din[k], n, rel, flips);
        if (w > worst) worst = w;
    }
    return worst;
}

double layer_run_compare_graph(const struct gp_graph *g, const char *name, int64_t index_bound,
                               double (*gen)(const char *name, int64_t i, void *user), void *user,
                               const struct gp_device_ops *ops_a, enum gp_precision a,
                               const struct gp_device_ops *ops_b, enum gp_precision b, double rel, double flips,
                               int *worst_layer)
{
    double worst = 0;
    *worst_layer = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        char label[256];
        snprintf(label, sizeof label, "%s, layer %d '%s' (%s)", name, i, g->nodes[i].name, g->nodes[i].op_type);
        struct layer_io ref, run;
        layer_run_inputs_gen(g, i, index_bound, gen, user, &ref);
        layer_run(ops_b, 0, b, g, i, label, &ref);
        run = ref; /* the same inputs; results of its own */
        for (int k = 0; k < MAX_IO; k++) run.out[k] = NULL, run.din[k] = NULL;
        layer_run(ops_a, 0, a, g, i, label, &run);
        double w = layer_compare_all(g, i, label, &run, &ref, rel, flips);
        if (w > worst) worst = w, *worst_layer = i;
        layer_run_free_results(g, i, &run);
        layer_run_free(g, i, &ref);
    }
    return worst;
}
