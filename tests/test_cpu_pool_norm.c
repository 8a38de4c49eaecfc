/* CPU kernels of the pool and normalization families
 * (src/backend/cpu/pool.c, batch_norm.c, instance_norm.c, layer_norm.c):
 * forward against PyTorch, backward against finite differences in double
 * precision, the float build against the double one, BatchNorm's running
 * statistics after a training step, and results bit-identical whatever the
 * number of threads.
 *
 * Inputs of the forward cases are the pattern p(i) = ((i * a + b) % m - off)
 * / scale, exact in float (and full of ties, which MaxPool must break
 * towards the first cell as PyTorch does). The expected outputs were
 * computed from the same patterns by PyTorch 1.13 in float64: max_pool*d
 * (with return_indices, offset by plane for ONNX's Indices), avg_pool2d,
 * and for ONNX's asymmetric pads F.pad then avg_pool2d, dividing by a pooled
 * mask of ones when padding is excluded; batch_norm (momentum 0.1, i.e.
 * ONNX's 0.9), layer_norm, instance_norm. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/runner.h"
#include "graph/build.h"
#include "op_check.h"

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define S(...) ((const char *const[]){__VA_ARGS__})

/* ---- expected outputs (PyTorch, float64) ---- */

static const float maxpool_y[32] = {
    0.375f, 0.625f, 0.5f, 0.625f, 0.375f, 0.625f, 0.375f, 0.625f, 0.25f, 0.625f, 0.25f, 0.625f,
    0.125f, 0.5f, 0.0f, 0.375f, 0.0f, 0.375f, 0.625f, 0.5f, 0.625f, 0.375f, 0.625f, 0.375f, 0.5f,
    0.625f, 0.625f, 0.25f, -0.25f, 0.625f, 0.5f, 0.0f,
};

static const int64_t maxpool_ind[32] = {
    7, 1, 4, 12, 7, 23, 18, 12, 21, 23, 32, 34, 35, 37, 38, 40, 49, 51, 45, 48, 56, 51, 67, 62, 70,
    78, 67, 76, 77, 78, 81, 82,
};

static const float maxpool_ties_y[32] = {
    0.25f, 0.5f, 0.5f, 0.5f, 0.0f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.25f, 0.0f, 0.5f,
    0.25f, 0.0f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.0f, 0.5f,
    0.25f, 0.5f,
};

static const int64_t maxpool_ties_ind[32] = {
    0, 8, 3, 13, 7, 8, 18, 13, 28, 23, 38, 33, 35, 37, 38, 40, 42, 43, 53, 48, 63, 58, 53, 68, 63,
    78, 73, 68, 77, 78, 80, 83,
};

static const float maxpool1d_y[28] = {
    0.0f, 1.25f, 0.0f, 1.25f, 1.0f, 0.5f, 1.0f, 1.5f, 0.25f, 1.5f, 1.25f, 0.75f, 1.25f, 0.0f,
    -0.25f, 1.0f, 1.5f, 1.0f, 1.5f, 0.25f, 1.5f, 1.25f, 0.0f, 1.25f, 1.0f, 0.5f, 1.0f, -0.25f,
};

static const float avgpool_excl_y[18] = {
    0.0625f, 0.0f, -0.0833333333f, 0.145833333f, -0.0694444444f, 0.0f, 0.0f, -0.0625f,
    0.0833333333f, -0.15625f, -0.104166667f, 0.0416666667f, 0.0416666667f, 0.0555555556f,
    -0.0277777778f, 0.125f, 0.0625f, -0.0208333333f,
};

static const float avgpool_ceil_incl_y[24] = {
    0.0277777778f, 0.0f, -0.0555555556f, -0.0416666667f, 0.0972222222f, -0.0694444444f, 0.0f,
    -0.0208333333f, 0.0f, -0.0416666667f, 0.0555555556f, 0.166666667f, -0.0694444444f,
    -0.0694444444f, 0.0277777778f, 0.0f, 0.0277777778f, 0.0555555556f, -0.0277777778f, -0.1875f,
    0.0555555556f, 0.0416666667f, -0.0138888889f, -0.0208333333f,
};

static const float avgpool_ceil_excl_y[24] = {
    0.0625f, 0.0f, -0.0833333333f, -0.125f, 0.145833333f, -0.0694444444f, 0.0f, -0.0416666667f,
    0.0f, -0.0625f, 0.0833333333f, 0.5f, -0.15625f, -0.104166667f, 0.0416666667f, 0.0f,
    0.0416666667f, 0.0555555556f, -0.0277777778f, -0.375f, 0.125f, 0.0625f, -0.0208333333f,
    -0.0625f,
};

static const float avgpool_asym_incl_y[15] = {
    -0.208333333f, -0.333333333f, 0.375f, 0.0f, -0.375f, 0.625f, 0.25f, -0.125f, 0.0416666667f,
    -0.333333333f, 0.166666667f, 0.0f, -0.125f, 0.291666667f, 0.166666667f,
};

static const float avgpool_asym_excl_y[15] = {
    -0.416666667f, -0.333333333f, 0.375f, 0.0f, -0.375f, 1.25f, 0.25f, -0.125f, 0.0416666667f,
    -0.333333333f, 1.0f, 0.0f, -0.375f, 0.875f, 0.5f,
};

static const float gap_y[6] = {
    0.104166667f, -0.145833333f, 0.0625f, 0.0416666667f, 0.0208333333f, 0.0f,
};

static const float gmp_y[6] = {
    0.625f, 0.375f, 0.625f, 0.625f, 0.5f, 0.625f,
};

static const float bn_train_y[36] = {
    -0.841462932f, -1.98536672f, -1.33170741f, -0.678048105f, -1.82195189f, -1.16829259f,
    -1.15910582f, 1.02070513f, -0.22490113f, -1.47050739f, 0.709303564f, -0.536302695f,
    -1.98536672f, -1.33170741f, -0.678048105f, -1.82195189f, -1.16829259f, -0.514633278f,
    1.02070513f, -0.22490113f, -1.47050739f, 0.709303564f, -0.536302695f, 1.64350826f, -1.33170741f,
    -0.678048105f, -1.82195189f, -1.16829259f, -0.514633278f, -1.65853707f, -0.22490113f,
    -1.47050739f, 0.709303564f, -0.536302695f, 1.64350826f, 0.397901999f,
};

static const float bn_running_mean[2] = {
    0.09625f, -0.183472222f,
};

static const float bn_running_var[2] = {
    0.465487132f, 1.81705984f,
};

static const float bn_batch_mean[2] = {
    0.0625f, -0.0347222222f,
};

static const float bn_batch_var[2] = {
    0.146267361f, 0.161120756f,
};

static const float bn_eval_y[36] = {
    -1.00275974f, -1.62086038f, -1.26766002f, -0.914459652f, -1.53256029f, -1.17935993f,
    -0.212079021f, 0.406484791f, 0.0530197553f, -0.30044528f, 0.318118532f, -0.0353465035f,
    -1.62086038f, -1.26766002f, -0.914459652f, -1.53256029f, -1.17935993f, -0.82615956f,
    0.406484791f, 0.0530197553f, -0.30044528f, 0.318118532f, -0.0353465035f, 0.583217308f,
    -1.26766002f, -0.914459652f, -1.53256029f, -1.17935993f, -0.82615956f, -1.4442602f,
    0.0530197553f, -0.30044528f, 0.318118532f, -0.0353465035f, 0.583217308f, 0.229752273f,
};

static const float ln_y[24] = {
    0.244579093f, 1.0f, -0.526176941f, 1.19042789f, -0.823109916f, -0.0812268101f, 1.81136944f,
    0.528872928f, 1.27075603f, -1.39259625f, 1.55594853f, -1.20216836f, -2.22139213f, 1.0f,
    -2.28321959f, -0.307489398f, -1.56259608f, 1.99055526f, 1.30595216f, -0.925653326f, 2.62749801f,
    -0.881067453f, -0.589171746f, -2.18855685f,
};

static const float ln_mean[2] = {
    -0.0208333333f, 0.0520833333f,
};

static const float ln_invstd[2] = {
    2.59925792f, 2.40368937f,
};

static const float in_y[30] = {
    -0.775673529f, -1.88243529f, -1.25f, -0.617564706f, -1.72432647f, 0.487694171f, -0.905717746f,
    1.53275311f, 0.139341192f, -1.25407072f, 0.762305829f, 2.15571775f, -0.282753108f, 1.11065881f,
    2.50407072f, -1.87703536f, -1.1803294f, -0.483623446f, -1.70285887f, -1.00615291f, -1.51630953f,
    0.524876377f, -0.641515572f, 1.39967034f, 0.23327839f, 2.19865294f, -0.0148705889f, 1.25f,
    2.51487059f, 0.301347058f,
};


/* ---- graphs ---- */

#include "kernel_graph.h"

static void expect_close(const char *what, const float *got, const float *want, int64_t n,
                         double tol)
{
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= tol * fmax(1.0, fabs(want[i]))))
            fail_msg("%s[%lld] is %.9g, expected %.9g", what, (long long)i, got[i], want[i]);
}

/* Forward in float on pattern inputs pats[k] (graph input order); returns
 * every graph output in its dtype (free each and the array). */
static void **forward_outputs(const struct gp_graph *g, const struct pat *pats, bool training)
{
    void *in[8] = {0};
    void **out = calloc(8, sizeof *out);
    assert_true(g->n_inputs <= 8 && g->n_outputs <= 8);
    for (int k = 0; k < g->n_inputs; k++) in[k] = pattern(numel_of(g, g->inputs[k]), pats[k]);
    for (int k = 0; k < g->n_outputs; k++) {
        const struct gp_value *v = &g->values[g->outputs[k]];
        out[k] = calloc((size_t)(numel_of(g, g->outputs[k]) + 1), gp_dtype_size(v->dtype));
    }
    op_forward_f32(g, (const void *const *)in, out, training);
    for (int k = 0; k < 8; k++) free(in[k]);
    return out;
}

static void free_outputs(void **out)
{
    for (int k = 0; k < 8; k++) free(out[k]);
    free(out);
}

/* Output 0 of a forward on pattern inputs against want[n]. */
static void expect_forward(const struct gp_graph *g, const struct pat *pats, const float *want,
                           int64_t n, double tol)
{
    if (numel_of(g, g->outputs[0]) != n)
        fail_msg("output has %lld elements, expected %lld", (long long)numel_of(g, g->outputs[0]),
                 (long long)n);
    void **out = forward_outputs(g, pats, false);
    expect_close("output", out[0], want, n, tol);
    free_outputs(out);
}

static void check_numerics(const struct gp_graph *g, bool training, uint64_t seed)
{
    struct op_check_opts o = {.seed = seed, .training = training};
    op_gradcheck(g, &o);
    op_forward_f32_vs_f64(g, &o);
}

/* ---- pools ---- */

struct pool_case {
    const char *op;
    int64_t opset;
    int rank;
    int64_t x[5];
    int64_t kernel[3], strides[3], dilations[3]; /* [0] 0: absent */
    bool has_pads;
    int64_t pads[6];
    int ceil_mode, count_include_pad, storage_order; /* 0: absent (the default) */
    const char *auto_pad;
    bool indices; /* MaxPool's second output */
};

static void build_pool(struct gp_graph *g, const struct pool_case *c)
{
    begin(g, c->opset);
    int ns = c->rank - 2;
    input(g, "x", c->rank, c->x);
    int n = node(g, c->op, 1, S("x"), c->indices ? 2 : 1, S("y", "i"));
    if (c->kernel[0]) attr_ints(g, n, "kernel_shape", ns, c->kernel);
    if (c->strides[0]) attr_ints(g, n, "strides", ns, c->strides);
    if (c->dilations[0]) attr_ints(g, n, "dilations", ns, c->dilations);
    if (c->has_pads) attr_ints(g, n, "pads", 2 * ns, c->pads);
    if (c->ceil_mode) attr_i(g, n, "ceil_mode", 1);
    if (c->count_include_pad) attr_i(g, n, "count_include_pad", 1);
    if (c->storage_order) attr_i(g, n, "storage_order", 1);
    if (c->auto_pad) attr_s(g, n, "auto_pad", c->auto_pad);
    finalize_ok(g);
}

/* 2-D, kernel (3, 2), stride 2, pads 1, ceil_mode: the last column of
 * windows would start in the end padding and is dropped. */
static const struct pool_case maxpool_ceil = {
    "MaxPool", 12, 4, {1, 2, 6, 7}, {3, 2}, {2, 2}, {0}, true, {1, 1, 1, 1}, 1, 0, 0, NULL, true};

static void test_maxpool_forward(void **state)
{
    (void)state;
    struct gp_graph g;
    build_pool(&g, &maxpool_ceil);
    void **out = forward_outputs(&g, (struct pat[]){PAT_X}, false);
    expect_close("y", out[0], maxpool_y, N_OF(maxpool_y), 0);
    const int64_t *ind = out[1];
    for (int i = 0; i < N_OF(maxpool_ind); i++) assert_int_equal(ind[i], maxpool_ind[i]);
    free_outputs(out);
    gp_graph_free(&g);

    /* storage_order 1: the same cells, spatial offsets column-major. */
    struct pool_case c = maxpool_ceil;
    c.storage_order = 1;
    build_pool(&g, &c);
    out = forward_outputs(&g, (struct pat[]){PAT_X}, false);
    ind = out[1];
    for (int i = 0; i < N_OF(maxpool_ind); i++) {
        int64_t plane = maxpool_ind[i] / 42, off = maxpool_ind[i] % 42;
        assert_int_equal(ind[i], plane * 42 + (off % 7) * 6 + off / 7);
    }
    free_outputs(out);
    gp_graph_free(&g);

    /* A pattern of period 5: windows full of ties, broken towards the
     * first cell in scan order. */
    build_pool(&g, &maxpool_ceil);
    out = forward_outputs(&g, (struct pat[]){{7, 3, 5, 2, 4.0f}}, false);
    expect_close("y", out[0], maxpool_ties_y, N_OF(maxpool_ties_y), 0);
    ind = out[1];
    for (int i = 0; i < N_OF(maxpool_ties_ind); i++) assert_int_equal(ind[i], maxpool_ties_ind[i]);
    free_outputs(out);
    gp_graph_free(&g);

    /* 1-D, kernel 3, dilation 2, pads 1. */
    struct pool_case d = {"MaxPool", 12, 3, {2, 2, 9}, {3}, {1}, {2}, true, {1, 1}, 0, 0, 0, NULL,
                          false};
    build_pool(&g, &d);
    expect_forward(&g, (struct pat[]){PAT_W}, maxpool1d_y, N_OF(maxpool1d_y), 0);
    gp_graph_free(&g);
}

/* Kernel 3, stride 2, pads 1 on [1, 2, 5, 6], then asymmetric pads. */
static const struct pool_case avg_cases[] = {
    {"AveragePool", 11, 4, {1, 2, 5, 6}, {3, 3}, {2, 2}, {0}, true, {1, 1, 1, 1}, 0, 0, 0, NULL,
     false},
    {"AveragePool", 11, 4, {1, 2, 5, 6}, {3, 3}, {2, 2}, {0}, true, {1, 1, 1, 1}, 1, 1, 0, NULL,
     false},
    {"AveragePool", 11, 4, {1, 2, 5, 6}, {3, 3}, {2, 2}, {0}, true, {1, 1, 1, 1}, 1, 0, 0, NULL,
     false},
    {"AveragePool", 11, 4, {1, 1, 5, 5}, {3, 2}, {2, 1}, {0}, true, {0, 1, 2, 0}, 0, 1, 0, NULL,
     false},
    {"AveragePool", 11, 4, {1, 1, 5, 5}, {3, 2}, {2, 1}, {0}, true, {0, 1, 2, 0}, 0, 0, 0, NULL,
     false},
};

static void test_avgpool_forward(void **state)
{
    (void)state;
    static const float *const want[] = {avgpool_excl_y, avgpool_ceil_incl_y, avgpool_ceil_excl_y,
                                        avgpool_asym_incl_y, avgpool_asym_excl_y};
    static const int64_t sizes[] = {N_OF(avgpool_excl_y), N_OF(avgpool_ceil_incl_y),
                                    N_OF(avgpool_ceil_excl_y), N_OF(avgpool_asym_incl_y),
                                    N_OF(avgpool_asym_excl_y)};
    for (int k = 0; k < N_OF(avg_cases); k++) {
        struct gp_graph g;
        build_pool(&g, &avg_cases[k]);
        expect_forward(&g, (struct pat[]){k < 3 ? (struct pat)PAT_X : (struct pat)PAT_W}, want[k],
                       sizes[k], 1e-6);
        gp_graph_free(&g);
    }
}

static void test_global_pools_forward(void **state)
{
    (void)state;
    struct gp_graph g;
    struct pool_case c = {"GlobalAveragePool", 13, 4, {2, 3, 2, 3}};
    build_pool(&g, &c);
    expect_forward(&g, (struct pat[]){PAT_X}, gap_y, N_OF(gap_y), 1e-6);
    gp_graph_free(&g);
    c.op = "GlobalMaxPool";
    build_pool(&g, &c);
    expect_forward(&g, (struct pat[]){PAT_X}, gmp_y, N_OF(gmp_y), 0);
    gp_graph_free(&g);
}

/* Forward then backward in float of a one-node graph with input x[n] and
 * output gradient 1 everywhere; dx[n] receives the input's gradient. */
static void backward_ones(const struct gp_graph *g, const float *x, float *dx)
{
    struct gp_error err = {0};
    struct gp_cpu_runner *r = NULL;
    if (gp_cpu_runner_create_f32(g, true, &r, &err) != GP_OK) fail_msg("%s", err.msg);
    gp_cpu_runner_set_f32(r, g->inputs[0], x);
    struct gp_run_opts o = {.dropout_ratio = -1};
    if (gp_cpu_runner_forward_f32(r, &o, 0, g->n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);
    gp_cpu_runner_zero_activation_grads_f32(r);
    float *dy = gp_cpu_runner_grad_f32(r, g->outputs[0]);
    for (int64_t i = 0; i < numel_of(g, g->outputs[0]); i++) dy[i] = 1;
    if (gp_cpu_runner_backward_f32(r, &o, 0, g->n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);
    memcpy(dx, gp_cpu_runner_grad_f32(r, g->inputs[0]),
           sizeof(float) * (size_t)numel_of(g, g->inputs[0]));
    gp_cpu_runner_free_f32(r);
}

/* At a tie the whole gradient goes to the first maximum, as PyTorch routes
 * it (finite differences cannot see this: ties are kinks). */
static void test_max_ties_route_to_first(void **state)
{
    (void)state;
    struct gp_graph g;
    /* Windows of 2, stride 1 over [3, 3, 1, 3, 3]: cells 0, 1, 3, 3. */
    struct pool_case c = {"MaxPool", 12, 3, {1, 1, 5}, {2}, {1}, {0}, false, {0}, 0, 0, 0, NULL,
                          false};
    build_pool(&g, &c);
    float dx[5];
    backward_ones(&g, (const float[]){3, 3, 1, 3, 3}, dx);
    expect_close("dx", dx, (const float[]){1, 1, 0, 2, 0}, 5, 0);
    gp_graph_free(&g);
    struct pool_case gm = {"GlobalMaxPool", 13, 3, {1, 2, 4}};
    build_pool(&g, &gm);
    float gdx[8];
    backward_ones(&g, (const float[]){1, 3, 3, 2, -1, -1, -2, -1}, gdx);
    expect_close("dx", gdx, (const float[]){0, 1, 0, 0, 1, 0, 0, 0}, 8, 0);
    gp_graph_free(&g);
}

static const struct pool_case pool_grad_cases[] = {
    {"MaxPool", 12, 4, {1, 2, 6, 7}, {3, 2}, {2, 2}, {0}, true, {1, 1, 1, 1}, 1, 0, 0, NULL, true},
    {"MaxPool", 12, 3, {2, 2, 9}, {3}, {1}, {2}, true, {1, 1}, 0, 0, 0, NULL, false},
    {"MaxPool", 12, 4, {1, 2, 7, 6}, {3, 3}, {2, 2}, {2, 1}, true, {2, 0, 1, 1}, 1, 0, 1, NULL,
     true},
    {"MaxPool", 12, 4, {1, 1, 5, 6}, {2, 3}, {2, 2}, {0}, false, {0}, 0, 0, 0, "SAME_UPPER", false},
    {"MaxPool", 12, 4, {1, 1, 5, 6}, {2, 3}, {2, 2}, {0}, false, {0}, 0, 0, 0, "SAME_LOWER", false},
    {"MaxPool", 12, 5, {1, 2, 4, 3, 5}, {2, 2, 3}, {2, 1, 2}, {0}, true, {1, 0, 1, 0, 1, 1}, 0, 0,
     0, NULL, false},
    {"MaxPool", 7, 4, {2, 1, 4, 4}, {2, 2}, {0}, {0}, false, {0}, 0, 0, 0, NULL, false},
    {"AveragePool", 11, 4, {1, 2, 5, 6}, {3, 3}, {2, 2}, {0}, true, {1, 1, 1, 1}, 0, 0, 0, NULL,
     false},
    {"AveragePool", 11, 4, {1, 2, 5, 6}, {3, 3}, {2, 2}, {0}, true, {1, 1, 1, 1}, 1, 1, 0, NULL,
     false},
    {"AveragePool", 11, 4, {1, 2, 5, 6}, {3, 3}, {2, 2}, {0}, true, {1, 1, 1, 1}, 1, 0, 0, NULL,
     false},
    {"AveragePool", 11, 4, {1, 1, 5, 5}, {3, 2}, {2, 1}, {0}, true, {0, 1, 2, 0}, 0, 1, 0, NULL,
     false},
    {"AveragePool", 19, 4, {1, 2, 7, 6}, {3, 2}, {2, 2}, {2, 3}, true, {1, 1, 2, 1}, 1, 1, 0, NULL,
     false},
    {"AveragePool", 19, 4, {1, 2, 7, 6}, {3, 2}, {2, 2}, {2, 3}, true, {1, 1, 2, 1}, 1, 0, 0, NULL,
     false},
    {"AveragePool", 11, 3, {2, 3, 8}, {3}, {3}, {0}, false, {0}, 0, 0, 0, "SAME_UPPER", false},
    {"AveragePool", 11, 5, {1, 1, 4, 5, 3}, {2, 3, 2}, {2, 2, 1}, {0}, true, {1, 1, 0, 1, 1, 1},
     1, 1, 0, NULL, false},
    {"GlobalAveragePool", 13, 4, {2, 3, 2, 3}},
    {"GlobalAveragePool", 13, 3, {2, 3, 5}},
    {"GlobalMaxPool", 13, 4, {2, 3, 2, 3}},
    {"GlobalMaxPool", 13, 5, {1, 2, 2, 3, 2}},
};

static void test_pool_gradients(void **state)
{
    (void)state;
    for (int k = 0; k < N_OF(pool_grad_cases); k++) {
        struct gp_graph g;
        build_pool(&g, &pool_grad_cases[k]);
        check_numerics(&g, false, (uint64_t)k + 1);
        gp_graph_free(&g);
    }
}

/* ---- BatchNormalization ---- */

static const float bn_mean_init[4] = {
    0.1f, -0.2f, 0.3f, 0.05f,
};
static const float bn_var_init[4] = {
    0.5f, 2.0f, 1.25f, 0.8f,
};

struct bn_case {
    int64_t opset;
    int rank;
    int64_t x[5];
    int n_outputs;      /* Y, running mean, running var, saved mean, saved var */
    bool training_mode; /* the attribute (14+), needed for the running outputs */
    float eps, momentum; /* 0: absent */
};

/* X, scale "s" and B "b" are graph inputs; mean "m" and var "v" buffers
 * initialized from bn_mean_init, bn_var_init. */
static void build_bn(struct gp_graph *g, const struct bn_case *c)
{
    begin(g, c->opset);
    int64_t ch = c->x[1];
    input(g, "x", c->rank, c->x);
    input(g, "s", 1, &ch);
    input(g, "b", 1, &ch);
    const_f32(g, "m", ch, bn_mean_init);
    const_f32(g, "v", ch, bn_var_init);
    int n = node(g, "BatchNormalization", 5, S("x", "s", "b", "m", "v"), c->n_outputs,
                 S("y", "rm", "rv", "sm", "sv"));
    if (c->training_mode) attr_i(g, n, "training_mode", 1);
    if (c->eps) attr_f(g, n, "epsilon", c->eps);
    if (c->momentum) attr_f(g, n, "momentum", c->momentum);
    finalize_ok(g);
}

static float *value_f32(struct gp_graph *g, struct gp_cpu_runner *r, const char *name)
{
    int id = gp_graph_find_value(g, name);
    assert_true(id >= 0);
    return gp_cpu_runner_data_f32(r, id);
}

/* One training step on [3, 2, 2, 3]: Y from the batch's statistics; the
 * running statistics, both as outputs and updated in place in the buffers
 * the node reads, as PyTorch leaves them; no second update when
 * recomputing (update_state false). */
static void test_bn_training_step(void **state)
{
    (void)state;
    for (int version = 0; version < 2; version++) {
        struct gp_graph g;
        struct bn_case c = {version ? 9 : 15, 4, {3, 2, 2, 3}, version ? 5 : 3, !version};
        build_bn(&g, &c);
        struct gp_error err = {0};
        struct gp_cpu_runner *r = NULL;
        if (gp_cpu_runner_create_f32(&g, false, &r, &err) != GP_OK) fail_msg("%s", err.msg);
        float *x = pattern(36, (struct pat)PAT_X), *s = pattern(2, (struct pat)PAT_B);
        float *b = pattern(2, (struct pat)PAT_W);
        gp_cpu_runner_set_f32(r, gp_graph_find_value(&g, "x"), x);
        gp_cpu_runner_set_f32(r, gp_graph_find_value(&g, "s"), s);
        gp_cpu_runner_set_f32(r, gp_graph_find_value(&g, "b"), b);
        struct gp_run_opts o = {.training = true, .update_state = true, .dropout_ratio = -1};
        if (gp_cpu_runner_forward_f32(r, &o, 0, g.n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);
        expect_close("y", value_f32(&g, r, "y"), bn_train_y, 36, 1e-5);
        expect_close("running mean output", value_f32(&g, r, "rm"), bn_running_mean, 2, 1e-6);
        expect_close("running var output", value_f32(&g, r, "rv"), bn_running_var, 2, 1e-6);
        expect_close("running mean", value_f32(&g, r, "m"), bn_running_mean, 2, 1e-6);
        expect_close("running var", value_f32(&g, r, "v"), bn_running_var, 2, 1e-6);
        if (version) {
            expect_close("saved mean", value_f32(&g, r, "sm"), bn_batch_mean, 2, 1e-6);
            expect_close("saved var", value_f32(&g, r, "sv"), bn_batch_var, 2, 1e-6);
        }
        o.update_state = false;
        if (gp_cpu_runner_forward_f32(r, &o, 0, g.n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);
        expect_close("y recomputed", value_f32(&g, r, "y"), bn_train_y, 36, 1e-5);
        expect_close("running mean kept", value_f32(&g, r, "m"), bn_running_mean, 2, 1e-6);
        expect_close("running var kept", value_f32(&g, r, "v"), bn_running_var, 2, 1e-6);
        /* A second step starts from the first one's statistics. */
        o.update_state = true;
        if (gp_cpu_runner_forward_f32(r, &o, 0, g.n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);
        float want_m[2], want_v[2];
        for (int i = 0; i < 2; i++) {
            /* 18 values per channel: the unbiased factor is 18 / 17. */
            want_m[i] = 0.9f * bn_running_mean[i] + 0.1f * bn_batch_mean[i];
            want_v[i] = 0.9f * bn_running_var[i] + 0.1f * bn_batch_var[i] * 18.0f / 17.0f;
        }
        expect_close("running mean, step 2", value_f32(&g, r, "m"), want_m, 2, 1e-6);
        expect_close("running var, step 2", value_f32(&g, r, "v"), want_v, 2, 1e-6);
        gp_cpu_runner_free_f32(r);
        free(x);
        free(s);
        free(b);
        gp_graph_free(&g);
    }
}

/* Evaluation normalizes with the running statistics (epsilon 1e-3). */
static void test_bn_eval_forward(void **state)
{
    (void)state;
    struct gp_graph g;
    struct bn_case c = {15, 4, {3, 2, 2, 3}, 1, false, 1e-3f};
    build_bn(&g, &c);
    expect_forward(&g, (struct pat[]){PAT_X, PAT_B, PAT_W}, bn_eval_y, 36, 1e-5);
    gp_graph_free(&g);
}

/* x -> BatchNormalization -> h -> Relu -> y; `keep_h`: h is a graph
 * output too, which keeps the pair apart (graph/fuse.c). */
static void build_bn_relu(struct gp_graph *g, bool keep_h)
{
    struct gp_error err = {0};
    begin(g, 15);
    int64_t dims[4] = {3, 2, 2, 3}, ch = 2;
    input(g, "x", 4, dims);
    input(g, "s", 1, &ch);
    input(g, "b", 1, &ch);
    const_f32(g, "m", ch, bn_mean_init);
    const_f32(g, "v", ch, bn_var_init);
    if (gp_graph_add_node(g, "BatchNormalization", "", "bn", 5, S("x", "s", "b", "m", "v"), 1, S("h"), &err) < 0 ||
        gp_graph_add_node(g, "Relu", "", "relu", 1, S("h"), 1, S("y"), &err) < 0 ||
        gp_graph_add_output(g, "y", &err) != GP_OK || (keep_h && gp_graph_add_output(g, "h", &err) != GP_OK))
        fail_msg("%s", err.msg);
    finalize_ok(g);
}

/* Relu fused into the BatchNormalization before it: one node, whose
 * output, running statistics and every gradient are the unfused pair's
 * bits in training and in evaluation (dY masked where Relu's input was not
 * positive, which the fused output's sign says); the double build against
 * finite differences, and bf16 against fp32. */
static void test_bn_relu_fused(void **state)
{
    (void)state;
    struct gp_graph fused, pair;
    build_bn_relu(&fused, false);
    build_bn_relu(&pair, true);
    assert_int_equal(fused.n_nodes, 1);
    assert_true(fused.nodes[0].fused_relu);
    assert_string_equal(fused.nodes[0].op_type, "BatchNormalization");
    assert_string_equal(fused.values[fused.nodes[0].outputs[0]].name, "y");
    assert_int_equal(fused.n_nodes + fused.n_folded + fused.n_fused, fused.n_source_nodes);
    assert_int_equal(pair.n_nodes, 2);
    assert_false(pair.nodes[0].fused_relu);
    for (int training = 1; training >= 0; training--) {
        struct gp_cpu_runner *r[2] = {NULL, NULL};
        struct gp_graph *gs[2] = {&fused, &pair};
        float *x = pattern(36, (struct pat)PAT_X), *sc = pattern(2, (struct pat)PAT_B);
        float *b = pattern(2, (struct pat)PAT_W), *dy = pattern(36, (struct pat)PAT_W);
        for (int k = 0; k < 2; k++) {
            struct gp_error err = {0};
            struct gp_graph *g = gs[k];
            if (gp_cpu_runner_create_f32(g, true, &r[k], &err) != GP_OK) fail_msg("%s", err.msg);
            gp_cpu_runner_set_f32(r[k], gp_graph_find_value(g, "x"), x);
            gp_cpu_runner_set_f32(r[k], gp_graph_find_value(g, "s"), sc);
            gp_cpu_runner_set_f32(r[k], gp_graph_find_value(g, "b"), b);
            struct gp_run_opts o = {.training = training, .update_state = training, .dropout_ratio = -1};
            if (gp_cpu_runner_forward_f32(r[k], &o, 0, g->n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);
            gp_cpu_runner_zero_activation_grads_f32(r[k]);
            gp_cpu_runner_zero_param_grads_f32(r[k]);
            memcpy(gp_cpu_runner_grad_f32(r[k], gp_graph_find_value(g, "y")), dy, sizeof(float) * 36);
            if (gp_cpu_runner_backward_f32(r[k], &o, 0, g->n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);
        }
        int zeros = 0;
        const float *y0 = value_f32(&fused, r[0], "y");
        for (int i = 0; i < 36; i++) zeros += y0[i] == 0;
        if (zeros < 6 || zeros > 30) fail_msg("the case masks %d of 36 values: choose inputs of both signs", zeros);
        static const char *const names[] = {"y", "m", "v"};
        for (int i = 0; i < 3; i++)
            if (memcmp(value_f32(&fused, r[0], names[i]), value_f32(&pair, r[1], names[i]),
                       sizeof(float) * (i ? 2 : 36)))
                fail_msg("%s: fused differs from BatchNormalization then Relu (training %d)", names[i], training);
        static const char *const grads[] = {"x", "s", "b"};
        for (int i = 0; i < 3; i++)
            if (memcmp(gp_cpu_runner_grad_f32(r[0], gp_graph_find_value(&fused, grads[i])),
                       gp_cpu_runner_grad_f32(r[1], gp_graph_find_value(&pair, grads[i])),
                       sizeof(float) * (i ? 2 : 36)))
                fail_msg("gradient of %s: fused differs from the pair (training %d)", grads[i], training);
        for (int k = 0; k < 2; k++) gp_cpu_runner_free_f32(r[k]);
        free(x), free(sc), free(b), free(dy);
    }
    op_gradcheck(&fused, &(struct op_check_opts){.training = true, .seed = 3});
    gp_graph_free(&fused);
    gp_graph_free(&pair);
}

/* PyTorch refuses batch statistics from one value per channel; so do we,
 * with an error naming the node rather than an infinite variance. */
static void test_bn_training_needs_two_values(void **state)
{
    (void)state;
    struct gp_graph g;
    struct bn_case c = {15, 2, {1, 3}, 1};
    build_bn(&g, &c);
    struct gp_error err = {0};
    struct gp_cpu_runner *r = NULL;
    if (gp_cpu_runner_create_f32(&g, false, &r, &err) != GP_OK) fail_msg("%s", err.msg);
    struct gp_run_opts o = {.training = true, .dropout_ratio = -1};
    assert_int_equal(gp_cpu_runner_forward_f32(r, &o, 0, g.n_nodes, &err), GP_ERR_SHAPE);
    assert_non_null(strstr(err.msg, "n0"));
    o.training = false;
    assert_int_equal(gp_cpu_runner_forward_f32(r, &o, 0, g.n_nodes, &err), GP_OK);
    gp_cpu_runner_free_f32(r);
    gp_graph_free(&g);
}

/* Every version, every output count, inputs of rank 2 to 5, training and
 * evaluation. The optional outputs are in the loss too, so their gradients
 * (through the batch statistics) are checked as well. */
static void test_bn_gradients(void **state)
{
    (void)state;
    static const struct bn_case cases[] = {
        {7, 4, {3, 2, 2, 3}, 5, false, 0, 0},
        {9, 4, {2, 3, 3, 2}, 1, false, 1e-3f, 0.8f},
        {9, 3, {2, 4, 5}, 5, false, 0, 0.7f},
        {14, 4, {3, 2, 2, 3}, 3, true, 0, 0},
        {15, 2, {5, 3}, 1, false, 0, 0},
        {15, 5, {2, 2, 2, 3, 2}, 3, true, 1e-2f, 0.5f},
    };
    for (int k = 0; k < N_OF(cases); k++) {
        struct gp_graph g;
        build_bn(&g, &cases[k]);
        check_numerics(&g, true, (uint64_t)k + 1);
        check_numerics(&g, false, (uint64_t)k + 11);
        gp_graph_free(&g);
    }
}

/* ---- InstanceNormalization ---- */

static void build_in(struct gp_graph *g, int rank, const int64_t *x, float eps)
{
    begin(g, 13);
    input(g, "x", rank, x);
    input(g, "s", 1, &x[1]);
    input(g, "b", 1, &x[1]);
    int n = node(g, "InstanceNormalization", 3, S("x", "s", "b"), 1, S("y"));
    if (eps) attr_f(g, n, "epsilon", eps);
    finalize_ok(g);
}

static void test_instance_norm(void **state)
{
    (void)state;
    struct gp_graph g;
    build_in(&g, 3, (int64_t[]){2, 3, 5}, 0);
    expect_forward(&g, (struct pat[]){PAT_X, PAT_B, PAT_W}, in_y, N_OF(in_y), 1e-5);
    check_numerics(&g, false, 1);
    gp_graph_free(&g);
    build_in(&g, 4, (int64_t[]){2, 2, 3, 2}, 1e-3f);
    check_numerics(&g, true, 2);
    gp_graph_free(&g);
    build_in(&g, 5, (int64_t[]){1, 3, 2, 2, 2}, 0);
    check_numerics(&g, false, 3);
    gp_graph_free(&g);
}

/* ---- LayerNormalization ---- */

struct ln_case {
    int rank;
    int64_t x[4];
    bool has_axis;
    int64_t axis;
    int srank, brank; /* brank -1: no B */
    int64_t s[4], b[4];
    int n_outputs; /* Y, Mean, InvStdDev */
};

static void build_ln(struct gp_graph *g, const struct ln_case *c)
{
    begin(g, 17);
    input(g, "x", c->rank, c->x);
    input(g, "s", c->srank, c->s);
    if (c->brank >= 0) input(g, "b", c->brank, c->b);
    int n = node(g, "LayerNormalization", c->brank >= 0 ? 3 : 2, S("x", "s", "b"), c->n_outputs,
                 S("y", "mean", "invstd"));
    if (c->has_axis) attr_i(g, n, "axis", c->axis);
    finalize_ok(g);
}

static void test_layer_norm_forward(void **state)
{
    (void)state;
    struct gp_graph g;
    struct ln_case c = {3, {2, 3, 4}, true, -2, 2, 2, {3, 4}, {3, 4}, 3};
    build_ln(&g, &c);
    void **out = forward_outputs(&g, (struct pat[]){PAT_X, PAT_W, PAT_B}, false);
    expect_close("y", out[0], ln_y, N_OF(ln_y), 1e-5);
    expect_close("mean", out[1], ln_mean, 2, 1e-6);
    expect_close("invstd", out[2], ln_invstd, 2, 1e-5);
    free_outputs(out);
    gp_graph_free(&g);
}

/* Axes from the first to the last, Scale and B broadcast from fewer axes or
 * axes of size 1, B absent, Mean and InvStdDev in the loss. */
static void test_layer_norm_gradients(void **state)
{
    (void)state;
    static const struct ln_case cases[] = {
        {3, {2, 3, 4}, true, -2, 2, 2, {3, 4}, {3, 4}, 3},
        {3, {2, 3, 4}, false, 0, 1, 1, {4}, {4}, 1},
        {3, {2, 3, 4}, true, 1, 1, 2, {4}, {1, 4}, 3},
        {3, {2, 3, 4}, true, 1, 2, -1, {3, 1}, {0}, 2},
        {2, {3, 5}, true, 0, 2, 1, {3, 5}, {5}, 3},
        {4, {2, 2, 3, 2}, true, 2, 1, 2, {1}, {3, 2}, 1},
    };
    for (int k = 0; k < N_OF(cases); k++) {
        struct gp_graph g;
        build_ln(&g, &cases[k]);
        check_numerics(&g, false, (uint64_t)k + 1);
        gp_graph_free(&g);
    }
}

/* ---- the thread count does not change a bit ---- */

/* Forward and backward in float with `threads` OpenMP and BLAS threads;
 * returns every float output and every input gradient, concatenated. */
static float *run_with_threads(const struct gp_graph *g, int threads, int64_t *n_out)
{
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    struct gp_error err = {0};
    struct gp_cpu_runner *r = NULL;
    if (gp_cpu_runner_create_f32(g, true, &r, &err) != GP_OK) fail_msg("%s", err.msg);
    int64_t total = 0;
    for (int k = 0; k < g->n_inputs; k++) {
        float *v = pattern(numel_of(g, g->inputs[k]), (struct pat)PAT_X);
        /* Not dyadic, so that sums round and their order shows. */
        for (int64_t i = 0; i < numel_of(g, g->inputs[k]); i++) v[i] += 0.001f * (float)(i % 97);
        gp_cpu_runner_set_f32(r, g->inputs[k], v);
        free(v);
        total += numel_of(g, g->inputs[k]);
    }
    for (int k = 0; k < g->n_outputs; k++) total += numel_of(g, g->outputs[k]);
    struct gp_run_opts o = {.training = true, .dropout_ratio = -1};
    if (gp_cpu_runner_forward_f32(r, &o, 0, g->n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);
    gp_cpu_runner_zero_activation_grads_f32(r);
    gp_cpu_runner_zero_param_grads_f32(r);
    for (int k = 0; k < g->n_outputs; k++) {
        float *dy = gp_cpu_runner_grad_f32(r, g->outputs[k]);
        float *v = pattern(numel_of(g, g->outputs[k]), (struct pat)PAT_W);
        for (int64_t i = 0; i < numel_of(g, g->outputs[k]); i++) v[i] += 0.003f * (float)(i % 89);
        if (dy) memcpy(dy, v, sizeof(float) * (size_t)numel_of(g, g->outputs[k]));
        free(v);
    }
    if (gp_cpu_runner_backward_f32(r, &o, 0, g->n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);
    float *all = calloc((size_t)total, sizeof(float)), *p = all;
    for (int k = 0; k < g->n_outputs; k++) {
        if (gp_dtype_is_float(g->values[g->outputs[k]].dtype))
            gp_cpu_runner_get_f32(r, g->outputs[k], p);
        p += numel_of(g, g->outputs[k]);
    }
    for (int k = 0; k < g->n_inputs; k++) {
        int64_t n = numel_of(g, g->inputs[k]);
        const float *dx = gp_cpu_runner_grad_f32(r, g->inputs[k]);
        assert_non_null(dx);
        memcpy(p, dx, sizeof(float) * (size_t)n);
        p += n;
    }
    gp_cpu_runner_free_f32(r);
    *n_out = total;
    return all;
}

static void expect_thread_independent(const struct gp_graph *g)
{
    int64_t n1, n4;
    float *a = run_with_threads(g, 1, &n1), *b = run_with_threads(g, 4, &n4);
    assert_int_equal(n1, n4);
    for (int64_t i = 0; i < n1; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fail_msg("element %lld: %.9g with 1 thread, %.9g with 4", (long long)i, a[i], b[i]);
    free(a);
    free(b);
}

/* Sizes above the kernels' thresholds for parallel loops. */
static void test_thread_count_invariance(void **state)
{
    (void)state;
    struct gp_graph g;
    struct pool_case pools[] = {
        {"MaxPool", 12, 4, {4, 16, 32, 32}, {3, 3}, {2, 2}, {0}, true, {1, 1, 1, 1}, 1, 0, 0,
         NULL, false},
        {"AveragePool", 11, 4, {4, 16, 32, 32}, {3, 3}, {2, 2}, {0}, true, {1, 1, 1, 1}, 1, 1, 0,
         NULL, false},
        {"GlobalAveragePool", 13, 4, {4, 16, 32, 32}},
        {"GlobalMaxPool", 13, 4, {4, 16, 32, 32}},
    };
    for (int k = 0; k < N_OF(pools); k++) {
        build_pool(&g, &pools[k]);
        expect_thread_independent(&g);
        gp_graph_free(&g);
    }
    struct bn_case bn = {9, 4, {8, 4, 32, 32}, 5};
    build_bn(&g, &bn);
    expect_thread_independent(&g);
    gp_graph_free(&g);
    build_in(&g, 4, (int64_t[]){4, 16, 32, 32}, 0);
    expect_thread_independent(&g);
    gp_graph_free(&g);
    struct ln_case ln = {3, {8, 64, 200}, true, -1, 1, 1, {200}, {200}, 3};
    build_ln(&g, &ln);
    expect_thread_independent(&g);
    gp_graph_free(&g);
    int threads = omp_get_num_procs();
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_maxpool_forward),
        cmocka_unit_test(test_avgpool_forward),
        cmocka_unit_test(test_global_pools_forward),
        cmocka_unit_test(test_max_ties_route_to_first),
        cmocka_unit_test(test_pool_gradients),
        cmocka_unit_test(test_bn_training_step),
        cmocka_unit_test(test_bn_relu_fused),
        cmocka_unit_test(test_bn_eval_forward),
        cmocka_unit_test(test_bn_training_needs_two_values),
        cmocka_unit_test(test_bn_gradients),
        cmocka_unit_test(test_instance_norm),
        cmocka_unit_test(test_layer_norm_forward),
        cmocka_unit_test(test_layer_norm_gradients),
        cmocka_unit_test(test_thread_count_invariance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
