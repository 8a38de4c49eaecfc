/* Channels-last filter copies (pipeline/plan.h, GP_CHANNELS_LAST_FILTERS=1):
 * the executor holds a Conv's filter [M, C/g, kh, kw] also as
 * [M, kh, kw, C/g], made once per step, and its gradient's copy, which
 * the Conv's backward accumulates into and the executor writes over the
 * gradient once per step, for kernels that read them so.
 *
 * The CPU's kernels read no layout, so the test stands in a backend whose
 * Conv says it reads W channels-last (layout_native with bit 1) and relays
 * W and dW itself around the CPU's kernel: training through the copies
 * then gives the bits of training without them, and anything the executor
 * gets wrong shows: a copy stale after an optimizer step or a parameter
 * written between steps, a gradient copy not cleared between updates or
 * added where it holds the sum (two steps' gradients before one update)
 * or not written, a copy given to a call that does not read it so. It also counts
 * what the executor does: each copy made and each gradient copy written once
 * per step, every call of a copied filter given the copies. And the
 * planner's choice: which filters get copies (3x3 and 7x7 ones read by
 * their Conv alone, not 1x1 ones), none with the setting off, none in bf16
 * where the kernel does not read bfloat16 itself. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/device.h"
#include "backend/mixed_call.h"
#include "fixtures.h"
#include "graph/layers.h"
#include "onnx/load.h"
#include "pipeline/plan.h"
#include "pipeline_bench.h"

#define STEPS 3

/* ---- a backend whose Conv reads W channels-last ---- */

static struct gp_compute_ops held_ops;
static struct gp_device_ops held_dev;
static int held_forwards, held_backwards, filter_relayouts, gradient_relayouts;

static bool is_conv(const struct gp_node *n) { return !strcmp(n->op_type, "Conv"); }

static bool reads_held(const void *kernel, const struct gp_graph *g, const struct gp_node *node, uint32_t in_nhwc,
                       uint32_t out_nhwc, bool backward)
{
    (void)kernel, (void)g, (void)backward;
    return is_conv(node) && in_nhwc == 2u && out_nhwc == 0;
}

/* A filter [M, kh, kw, C] as [M, C, kh, kw] (malloc'd), or back. */
static float *filter_as_model(const struct gp_layer_call *c, const float *cl)
{
    const struct gp_shape *s = &gp_node_input(c->graph, c->node, 1)->shape;
    int64_t m = s->dims[0], ch = s->dims[1], cells = s->dims[2] * s->dims[3];
    float *w = malloc(sizeof(float) * (size_t)(m * ch * cells));
    assert_non_null(w);
    for (int64_t o = 0; o < m; o++)
        for (int64_t k = 0; k < ch; k++)
            for (int64_t e = 0; e < cells; e++) w[(o * ch + k) * cells + e] = cl[(o * cells + e) * ch + k];
    return w;
}

static void filter_back(const struct gp_layer_call *c, const float *w, float *cl)
{
    const struct gp_shape *s = &gp_node_input(c->graph, c->node, 1)->shape;
    int64_t m = s->dims[0], ch = s->dims[1], cells = s->dims[2] * s->dims[3];
    for (int64_t o = 0; o < m; o++)
        for (int64_t k = 0; k < ch; k++)
            for (int64_t e = 0; e < cells; e++) cl[(o * cells + e) * ch + k] = w[(o * ch + k) * cells + e];
}

static gp_status call_cpu(void *ctx, const struct gp_layer_call *c, bool backward, struct gp_error *err)
{
    const struct gp_compute_ops *cpu = gp_cpu_device_ops.compute;
    if (!(c->in_nhwc & 2u)) return backward ? cpu->backward(ctx, c, err) : cpu->forward(ctx, c, err);
    /* The executor's copy, and its bit in in_nhwc, only where the kernel
     * said yes; in backward its gradient's copy too (every filter here is
     * a trained parameter). */
    assert_int_equal(c->held_nhwc, 2u);
    assert_int_equal(c->in_nhwc, 2u);
    assert_int_equal(c->held_grad_nhwc, backward && c->din[1] ? 2u : 0u);
    float *w = filter_as_model(c, c->in[1]), *dw = NULL;
    void *in[64];
    float *din[64];
    assert_true(c->node->n_inputs < 64);
    for (int k = 0; k <= c->node->n_inputs; k++) in[k] = c->in[k];
    in[1] = w;
    struct gp_layer_call d = *c;
    d.in = in;
    d.in_nhwc = d.held_nhwc = d.held_grad_nhwc = 0;
    if (c->held_grad_nhwc) { /* accumulated into as it lies */
        dw = filter_as_model(c, c->din[1]);
        for (int k = 0; k <= c->node->n_inputs; k++) din[k] = c->din[k];
        din[1] = dw;
        d.din = din;
    }
    gp_status st = backward ? cpu->backward(ctx, &d, err) : cpu->forward(ctx, &d, err);
    if (dw) filter_back(c, dw, c->din[1]);
    free(w);
    free(dw);
    if (backward) held_backwards++;
    else held_forwards++;
    return st;
}

static gp_status held_forward(void *ctx, const struct gp_layer_call *c, struct gp_error *err)
{
    return call_cpu(ctx, c, false, err);
}

static gp_status held_backward(void *ctx, const struct gp_layer_call *c, struct gp_error *err)
{
    return call_cpu(ctx, c, true, err);
}

static gp_status counted_relayout(void *ctx, void *dst, enum gp_dtype dst_type, bool dst_nhwc, const void *src,
                                  enum gp_dtype src_type, bool src_nhwc, const struct gp_shape *shape, bool accumulate,
                                  struct gp_error *err)
{
    filter_relayouts += dst_nhwc && !src_nhwc;
    gradient_relayouts += src_nhwc && !dst_nhwc;
    return gp_cpu_device_ops.compute->relayout(ctx, dst, dst_type, dst_nhwc, src, src_type, src_nhwc, shape,
                                               accumulate, err);
}

static void make_backend(void)
{
    held_ops = *gp_cpu_device_ops.compute;
    held_ops.layout_native = reads_held;
    held_ops.forward = held_forward;
    held_ops.backward = held_backward;
    held_ops.relayout = counted_relayout;
    held_dev = gp_cpu_device_ops;
    held_dev.compute = &held_ops;
}

/* ---- training with and without the copies ---- */

struct setup {
    const char *fixture;
    int64_t batch;
    int stages, chunks;
    bool adamw, deferred_bn;
    enum gp_precision precision;
    /* Each optimizer step takes the gradients of two gp_pipeline_step
     * calls (this step's batch and the next one's), accumulated. */
    bool accumulate;
};

struct result {
    double loss[STEPS];
    float *kept;
    size_t n;
};

/* A filter written between steps (its first, scaled): the next step's
 * copy must be made from it. */
static void rewrite_first_copied(struct pipe_bench *b)
{
    for (int v = 0; v < b->g.n_values; v++) {
        const struct gp_value *val = &b->g.values[v];
        if (val->kind != GP_VALUE_PARAMETER || val->shape.rank != 4 || val->shape.dims[2] * val->shape.dims[3] < 9)
            continue;
        int64_t n = gp_shape_numel(&val->shape);
        float *w = malloc(sizeof(float) * (size_t)n);
        assert_non_null(w);
        struct gp_error err = {0};
        if (gp_pipeline_read(b->p, v, w, &err) != GP_OK) fail_msg("%s", err.msg);
        for (int64_t e = 0; e < n; e++) w[e] *= 0.75f;
        if (gp_pipeline_write(b->p, v, w, &err) != GP_OK) fail_msg("%s", err.msg);
        free(w);
        return;
    }
    fail_msg("%s: no 3x3 filter", b->su.fixture);
}

static void run(const struct setup *su, bool copies, struct result *r)
{
    setenv("GP_CHANNELS_LAST_FILTERS", copies ? "1" : "0", 1);
    struct pipe_bench_setup bs = {.fixture = su->fixture, .batch = su->batch, .batches = STEPS, .stages = su->stages,
                                  .chunks = su->chunks, .ops = copies ? &held_dev : &gp_cpu_device_ops,
                                  .adamw = su->adamw, .deferred_bn = su->deferred_bn, .precision = su->precision};
    struct pipe_bench b;
    pipe_bench_open(&bs, &b);
    unsetenv("GP_CHANNELS_LAST_FILTERS");
    memset(r, 0, sizeof *r);
    held_forwards = held_backwards = filter_relayouts = gradient_relayouts = 0;
    for (int s = 0; s < STEPS; s++) {
        if (s == 1) rewrite_first_copied(&b);
        struct gp_error err = {0};
        const void *x = pipe_bench_x(&b, s), *y = pipe_bench_y(&b, s);
        struct gp_step_opts so = {.seed = 3, .step = (uint64_t)s, .dropout_ratio = -1};
        struct gp_step_outcome out;
        memset(&out, 0, sizeof out);
        gp_status st;
        if (su->accumulate) {
            const void *x2 = pipe_bench_x(&b, (s + 1) % STEPS), *y2 = pipe_bench_y(&b, (s + 1) % STEPS);
            double first = 0;
            st = gp_pipeline_step(b.p, x, y, &so, pipe_bench_denominator(&b, y), &first, &err);
            if (st == GP_OK) st = gp_pipeline_step(b.p, x2, y2, &so, pipe_bench_denominator(&b, y2), &out.loss_sum, &err);
            if (st == GP_OK) st = gp_pipeline_optimize(b.p, 0.05, 0, &out, &err);
            out.loss_sum += first;
        } else {
            st = gp_pipeline_train_step(b.p, x, y, &so, pipe_bench_denominator(&b, y), 0.05, 0, &out, &err);
        }
        if (st != GP_OK) fail_msg("%s, step %d: %s", su->fixture, s + 1, err.msg);
        r->loss[s] = out.loss_sum;
    }
    r->kept = pipe_bench_keep(&b, &r->n);
    pipe_bench_close(&b);
}

/* Conv layers of the fixture with a filter of more than one cell. */
static int wide_filters(const char *fixture)
{
    char path[4096], name[256];
    snprintf(name, sizeof name, "%s.onnx", fixture);
    fixture_path(name, path, sizeof path);
    struct gp_graph g;
    struct gp_error err = {0};
    if (gp_onnx_load(path, 1, &g, &err) != GP_OK) fail_msg("%s", err.msg);
    int n = 0;
    for (int i = 0; i < g.n_nodes; i++) {
        const struct gp_shape *w = is_conv(&g.nodes[i]) ? &gp_node_input(&g, &g.nodes[i], 1)->shape : NULL;
        n += w && w->rank == 4 && w->dims[2] * w->dims[3] > 1;
    }
    gp_graph_free(&g);
    return n;
}

static void plan_with(const char *fixture, const struct gp_compute_ops *ops, enum gp_precision precision,
                      bool setting, struct gp_stage_plan *p, struct gp_graph *g, struct gp_layers *l);

/* The bfloat16 shadows of the fixture's weights (one stage of it all). */
static int shadows_of(const char *fixture)
{
    struct gp_stage_plan p;
    struct gp_graph g;
    struct gp_layers l;
    plan_with(fixture, &held_ops, GP_PRECISION_BF16, true, &p, &g, &l);
    int n = p.n_shadowed;
    assert_true(p.batch_shadows);
    gp_plan_free(&p);
    gp_layers_free(&l);
    gp_graph_free(&g);
    return n;
}

static void same_bits(const struct setup *su)
{
    char what[256];
    snprintf(what, sizeof what, "%s, %d stage%s x %d micro-batches, %s%s, %s%s", su->fixture, su->stages,
             su->stages > 1 ? "s" : "", su->chunks, su->adamw ? "AdamW" : "SGD",
             su->deferred_bn ? ", deferred BatchNorm" : "", gp_precision_name(su->precision),
             su->accumulate ? ", two steps' gradients an update" : "");
    struct result plain, held;
    run(su, false, &plain);
    run(su, true, &held);
    /* Every filter of more than one cell is copied, each once per step
     * (the CPU's relayout is only called for them here: the graph has no
     * channels-last activations); every forward and backward of their
     * Convs read the copy (forwards again where the pipeline recomputes:
     * checkpoint except_last). In bf16 the stand-in kernel, as the CPU's,
     * does not read bfloat16 itself: no filter copies, but every shadow
     * made in the batched launches, as a flat tensor relaid. */
    bool bf16 = su->precision == GP_PRECISION_BF16;
    int expect = bf16 ? 0 : wide_filters(su->fixture), made = bf16 ? shadows_of(su->fixture) : expect;
    /* Accumulating, the copies are made for the first backward pass of
     * an update (the parameters change only in the optimizer step; at
     * most once a pass), and the gradient's copy written at every pass's end. */
    int passes = su->accumulate ? 2 * STEPS : STEPS;
    if (filter_relayouts < made * STEPS || filter_relayouts > made * passes)
        fail_msg("%s: %d copies made in %d steps, %d expected", what, filter_relayouts, STEPS, made * STEPS);
    if (gradient_relayouts != expect * passes)
        fail_msg("%s: %d gradient copies added in %d passes, %d expected", what, gradient_relayouts, passes,
                 expect * passes);
    assert_in_range(held_forwards, expect * passes * su->chunks, 2 * expect * passes * su->chunks);
    assert_int_equal(held_backwards, expect * passes * su->chunks);
    for (int s = 0; s < STEPS; s++)
        if (memcmp(&plain.loss[s], &held.loss[s], sizeof(double)))
            fail_msg("%s: step %d loss %.17g with copies, %.17g without", what, s + 1, held.loss[s], plain.loss[s]);
    assert_int_equal(plain.n, held.n);
    for (size_t e = 0; e < plain.n; e++)
        if (memcmp(&plain.kept[e], &held.kept[e], sizeof(float)))
            fail_msg("%s: kept float %zu (parameters, buffers, optimizer state) %.9g with copies, %.9g without", what,
                     e, held.kept[e], plain.kept[e]);
    free(plain.kept);
    free(held.kept);
    printf("%s: %d filters held channels-last, %d copies made a step, the same bits\n", what, expect, made);
}

static void test_same_bits(void **state)
{
    (void)state;
    const struct setup setups[] = {
        {"digits_cnn_op17", 8, 1, 1, false, false},
        {"resnet_op17", 8, 1, 1, false, false},
        {"resnet_op17", 8, 2, 4, true, false},
        {"resnet_op17", 8, 3, 2, false, true},
        {"unet_op17", 4, 2, 2, false, false},
        {"resnet_op17", 8, 2, 2, false, false, GP_PRECISION_BF16},
        {"unet_op17", 4, 1, 1, true, false, GP_PRECISION_BF16},
        /* The gradient's copy holds two passes' sum: written, not added. */
        {"resnet_op17", 8, 1, 1, false, false, GP_PRECISION_FP32, true},
        {"resnet_op17", 8, 2, 2, true, false, GP_PRECISION_FP32, true},
    };
    for (size_t i = 0; i < sizeof setups / sizeof *setups; i++) same_bits(&setups[i]);
}

/* ---- the planner's choice ---- */

static void plan_with(const char *fixture, const struct gp_compute_ops *ops, enum gp_precision precision,
                      bool setting, struct gp_stage_plan *p, struct gp_graph *g, struct gp_layers *l)
{
    char path[4096], name[256];
    snprintf(name, sizeof name, "%s.onnx", fixture);
    fixture_path(name, path, sizeof path);
    struct gp_error err = {0};
    if (gp_onnx_load(path, 2, g, &err) != GP_OK) fail_msg("%s", err.msg);
    if (gp_layers_build(g, l, &err) != GP_OK) fail_msg("%s", err.msg);
    bool *needs = calloc((size_t)g->n_values + 1, sizeof(bool));
    assert_non_null(needs);
    gp_plan_needs_grad(g, needs);
    setenv("GP_CHANNELS_LAST_FILTERS", setting ? "1" : "0", 1);
    struct gp_compute_options opts = {.precision = precision};
    gp_status st = gp_plan_stage(g, l, needs, ops, &opts, "cpu", 0, g->n_nodes, p, &err);
    unsetenv("GP_CHANNELS_LAST_FILTERS");
    free(needs);
    if (st != GP_OK) fail_msg("%s", err.msg);
}

static void test_planner(void **state)
{
    (void)state;
    struct gp_stage_plan p;
    struct gp_graph g;
    struct gp_layers l;
    /* resnet_op17: a 3x3 stem, 3x3 blocks and a 1x1 downsample. */
    plan_with("resnet_op17", &held_ops, GP_PRECISION_FP32, true, &p, &g, &l);
    assert_int_equal(p.n_filtered, wide_filters("resnet_op17"));
    size_t bytes = 0;
    for (int i = 0; i < g.n_nodes; i++) {
        const struct gp_node *n = &g.nodes[i];
        if (!is_conv(n)) {
            assert_int_equal(p.call_held[i], 0);
            continue;
        }
        int v = n->inputs[1];
        const struct gp_shape *w = &g.values[v].shape;
        bool wide = w->dims[2] * w->dims[3] > 1;
        assert_int_equal(p.call_held[i], wide ? 2u : 0u);
        assert_int_equal(p.filter_nhwc[v], wide);
        if (!wide) {
            assert_true(p.filter_off[v] == SIZE_MAX);
            continue;
        }
        assert_true(p.filter_off[v] != SIZE_MAX && p.filter_off[v] % 64 == 0);
        assert_true(p.filter_off[v] + sizeof(float) * (size_t)gp_shape_numel(w) <= p.filter_bytes);
        bytes += sizeof(float) * (size_t)gp_shape_numel(w);
    }
    assert_true(p.filter_bytes >= bytes);
    gp_plan_free(&p);
    gp_layers_free(&l);
    gp_graph_free(&g);

    /* The setting off; the CPU's own kernels (no layout read); bf16 on a
     * kernel that does not read bfloat16 itself: no copies. */
    struct {
        const struct gp_compute_ops *ops;
        enum gp_precision precision;
        bool setting;
    } none[] = {{&held_ops, GP_PRECISION_FP32, false},
                {gp_cpu_device_ops.compute, GP_PRECISION_FP32, true},
                {&held_ops, GP_PRECISION_BF16, true}};
    for (size_t c = 0; c < sizeof none / sizeof *none; c++) {
        plan_with("resnet_op17", none[c].ops, none[c].precision, none[c].setting, &p, &g, &l);
        if (p.n_filtered || p.filter_bytes) fail_msg("case %zu: %d filters copied", c, p.n_filtered);
        gp_plan_free(&p);
        gp_layers_free(&l);
        gp_graph_free(&g);
    }
}

/* A call given a copy its kernel does not read so is refused, not staged
 * (staging would transpose the gradient too). */
static void test_copy_not_read(void **state)
{
    (void)state;
    char path[4096];
    fixture_path("digits_cnn_op17.onnx", path, sizeof path);
    struct gp_graph g;
    struct gp_error err = {0};
    if (gp_onnx_load(path, 1, &g, &err) != GP_OK) fail_msg("%s", err.msg);
    const struct gp_node *conv = &g.nodes[0];
    assert_true(is_conv(conv));
    struct gp_layer_call c = {.graph = &g, .node = conv, .held_nhwc = 2u};
    c.kernel = gp_cpu_device_ops.compute->kernel_for(conv);
    assert_int_equal(gp_mixed_forward(gp_cpu_device_ops.compute, NULL, &c, NULL, &err), GP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "channels-last copy"));
    memset(&err, 0, sizeof err);
    assert_int_equal(gp_mixed_backward(gp_cpu_device_ops.compute, NULL, &c, NULL, &err), GP_ERR_INVALID);
    printf("refused: %s\n", err.msg);
    gp_graph_free(&g);
}

int main(void)
{
    make_backend();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_planner),
        cmocka_unit_test(test_copy_not_read),
        cmocka_unit_test(test_same_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
