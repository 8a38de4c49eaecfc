/* CPU kernels of the matmul and conv families (src/backend/cpu/matmul.c,
 * conv.c): forward against PyTorch, backward against finite differences in
 * double precision, the float build against the double one, and results
 * bit-identical whatever the number of threads.
 *
 * Inputs of the forward cases are the pattern p(i) = ((i * a + b) % m - off)
 * / scale, exact in float; the expected outputs were computed from the same
 * patterns by PyTorch 1.13 in float64 (torch.nn.functional.conv*d after
 * F.pad for ONNX's asymmetric pads; A @ B; alpha * A' @ B' + beta * C). They
 * are dyadic fractions, exact in float too. */
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

static const float mm_batched_y[36] = {
    1.25f, -1.03125f, -0.96875f, 1.125f, -0.4375f, -0.15625f, 1.28125f, -1.0f, -0.875f, 1.21875f,
    -0.625f, -0.34375f, -0.71875f, -0.96875f, -0.78125f, 1.3125f, 1.21875f, -0.53125f, -0.9375f,
    0.96875f, -0.40625f, -0.3125f, 0.8125f, 0.8125f, -0.71875f, 1.1875f, -0.46875f, -0.375f,
    0.8125f, 0.8125f, -0.90625f, 1.40625f, 1.09375f, -0.4375f, 0.0f, 0.8125f,
};

static const float mm_vec_mat_y[6] = {
    -0.28125f, -0.125f, -1.1875f, 0.78125f, -0.28125f, -0.125f,
};

static const float mm_mat_vec_y[6] = {
    0.75f, -1.53125f, 0.65625f, -1.625f, 0.5625f, 0.0f,
};

static const float gemm_y[15] = {
    -0.921875f, 1.96875f, -2.140625f, 0.75f, -2.546875f, -1.25f, 1.859375f, -2.03125f, 1.078125f,
    -3.421875f, -1.0625f, 1.921875f, -2.09375f, 0.890625f, -2.921875f,
};

static const float gemm_cmn_y[15] = {
    -1.109375f, -0.40625f, 0.828125f, -0.296875f, 0.9375f, -1.359375f, -0.796875f, 0.90625f,
    -0.96875f, 0.734375f, 1.484375f, 1.078125f, -1.078125f, 0.421875f, 0.015625f,
};

static const float gemm_cm1_y[15] = {
    -1.109375f, 0.34375f, 0.578125f, 0.203125f, 0.4375f, -1.859375f, -0.546875f, 0.15625f,
    -0.96875f, -0.265625f, 2.234375f, 0.828125f, -0.578125f, 1.671875f, 0.265625f,
};

static const float conv2d_y[108] = {
    -0.59375f, -0.6875f, 0.59375f, -1.6875f, 1.46875f, -0.53125f, -0.46875f, 0.28125f, -1.71875f,
    0.3125f, 2.03125f, 0.65625f, 2.65625f, -0.25f, 2.34375f, 0.78125f, 0.40625f, 0.71875f, -1.0625f,
    0.03125f, -1.96875f, -2.1875f, 1.03125f, -1.9375f, -1.0625f, -2.5625f, 0.0625f, 0.21875f,
    0.53125f, 1.875f, -0.875f, 0.75f, 1.34375f, -1.375f, 1.15625f, 0.59375f, -0.4375f, -1.25f,
    -2.75f, 0.6875f, -1.0f, -2.6875f, 0.4375f, -1.40625f, -0.84375f, -2.0625f, 0.46875f, 0.59375f,
    -1.96875f, 0.75f, 0.03125f, -1.5625f, -0.0625f, 0.40625f, -1.59375f, 1.40625f, -0.75f,
    -1.59375f, 1.21875f, -0.78125f, -0.375f, 0.375f, -1.625f, 1.6875f, 0.3125f, 1.6875f, 0.875f,
    0.375f, 0.21875f, 0.90625f, 0.53125f, 0.84375f, -0.96875f, -0.21875f, -2.21875f, -0.96875f,
    -1.53125f, -1.0625f, -0.90625f, -2.40625f, 0.21875f, 0.34375f, 0.65625f, 0.28125f, -2.21875f,
    2.15625f, 0.6875f, -0.5f, -0.71875f, 0.78125f, -0.28125f, -1.09375f, -1.5625f, 0.21875f,
    -1.46875f, -0.75f, -2.5f, -0.90625f, -1.03125f, -1.875f, 0.65625f, 0.09375f, -1.15625f,
    -1.1875f, 0.5f, 1.03125f, -1.25f, 0.25f,
};

static const float conv1d_y[40] = {
    0.25f, 1.84375f, 1.4375f, -1.71875f, -0.0625f, 0.3125f, 0.28125f, -2.84375f, 0.21875f, 1.5625f,
    -1.65625f, 1.15625f, 1.8125f, -0.28125f, -1.6875f, 0.4375f, 0.40625f, -2.875f, 0.03125f,
    1.5625f, -0.0625f, 1.34375f, -1.46875f, 0.1875f, 1.84375f, 0.3125f, -1.34375f, 0.0f, 1.34375f,
    0.28125f, -1.34375f, 1.25f, -0.15625f, -1.5625f, 1.15625f, 0.25f, -1.4375f, 0.09375f, 1.625f,
    0.40625f,
};

static const float conv_dw_y[27] = {
    0.1875f, -0.09375f, -1.90625f, -0.1875f, -2.1875f, -0.1875f, 0.28125f, -0.1875f, -0.65625f,
    -0.53125f, 1.4375f, 1.03125f, 1.40625f, 1.65625f, 0.8125f, 1.125f, 0.0625f, 1.0f, -1.09375f,
    -0.65625f, -0.5f, -0.625f, -0.53125f, -0.9375f, -1.5f, -0.40625f, -0.875f,
};

static const float conv3d_y[120] = {
    -0.15625f, -0.25f, -0.15625f, -0.09375f, -0.3125f, 1.5f, -0.03125f, -0.375f, -0.28125f,
    0.78125f, -0.125f, -0.40625f, -0.375f, -0.5625f, -0.5625f, -0.1875f, 1.15625f, -1.25f, 0.0f,
    -0.5625f, 1.5f, 0.125f, 0.15625f, -0.5f, -0.65625f, -0.5625f, -0.5625f, 1.25f, -1.25f, 1.5f,
    -0.28125f, 1.5f, -1.25f, -0.34375f, -0.5f, 0.5625f, 0.09375f, -0.5625f, 1.15625f, -0.40625f,
    1.5f, -0.5625f, 1.5f, -1.25f, 1.15625f, -0.8125f, 0.5625f, -1.125f, 0.34375f, -0.34375f,
    -0.78125f, 0.46875f, -0.28125f, -0.375f, -0.4375f, 1.5f, -0.3125f, 0.0f, -0.90625f, 0.4375f,
    -1.25f, 0.78125f, 1.875f, -1.03125f, 0.625f, -0.34375f, -0.8125f, 0.46875f, -1.53125f, 0.53125f,
    -0.4375f, -0.34375f, 0.65625f, 2.09375f, -3.21875f, 0.75f, 0.25f, -2.3125f, 0.84375f, -0.5625f,
    2.71875f, -0.1875f, -0.09375f, 0.0f, 1.375f, -3.21875f, 1.78125f, -0.59375f, -2.3125f, 0.28125f,
    -1.53125f, 2.71875f, -0.1875f, -0.28125f, 0.0f, 1.125f, -1.34375f, 1.78125f, 0.25f, -1.25f,
    0.28125f, -0.5625f, 1.9375f, -0.1875f, -2.40625f, -0.375f, 1.125f, -1.1875f, 0.21875f, 0.59375f,
    -1.0f, 0.09375f, 0.96875f, 0.40625f, -0.375f, -0.71875f, 0.78125f, 0.3125f, -0.78125f, 0.25f,
};

static const float convt_y[168] = {
    -0.0625f, -0.5f, -1.84375f, -0.5f, 0.0625f, -0.5f, -1.4375f, -0.09375f, -0.5f, -1.5625f, -0.5f,
    1.5f, -0.5f, -1.875f, -0.84375f, -0.5f, 0.78125f, -0.5f, -1.3125f, -0.5f, -0.03125f, -1.03125f,
    -0.5f, 0.59375f, -0.5f, -1.5f, -0.5f, -0.03125f, 0.1875f, 1.0f, 1.78125f, 1.0f, 0.84375f, 1.0f,
    1.0f, -0.40625f, 1.0f, 3.125f, 1.0f, -1.53125f, 1.0f, 1.78125f, 1.71875f, 1.0f, 0.09375f, 1.0f,
    0.84375f, 1.0f, 1.46875f, 1.53125f, 1.0f, -0.09375f, 1.0f, 2.28125f, 1.0f, 0.25f, -0.625f,
    -1.0f, -0.9375f, -1.0f, -1.46875f, -1.0f, -0.0625f, -0.5625f, -1.0f, -2.1875f, -1.0f, 0.875f,
    -1.0f, -2.53125f, -1.25f, -1.0f, -1.25f, -1.0f, -0.09375f, -1.0f, -1.75f, -1.4375f, -1.0f,
    0.1875f, -1.0f, -1.90625f, -1.0f, -0.53125f, 0.53125f, 0.5f, 2.0625f, 0.5f, 0.03125f, 0.5f,
    -0.25f, 1.375f, 0.5f, 1.0f, 0.5f, 1.15625f, 0.5f, -1.375f, 0.21875f, 0.5f, 0.3125f, 0.5f,
    1.6875f, 0.5f, -0.25f, 0.15625f, 0.5f, 0.375f, 0.5f, 1.75f, 0.5f, -0.125f, -0.71875f, -1.5f,
    -1.96875f, -1.5f, -1.96875f, -1.5f, -0.96875f, -2.90625f, -1.5f, -0.8125f, -1.5f, -1.0625f,
    -1.5f, -0.90625f, -1.96875f, -1.5f, -0.28125f, -1.5f, -2.5625f, -1.5f, -1.0625f, -0.8125f,
    -1.5f, -2.65625f, -1.5f, -1.6875f, -1.5f, -0.9375f, -0.5f, 0.0f, -0.46875f, 0.0f, -0.46875f,
    0.0f, -0.625f, 0.78125f, 0.0f, 0.46875f, 0.0f, -0.59375f, 0.0f, -0.1875f, 0.5625f, 0.0f,
    -1.03125f, 0.0f, 1.15625f, 0.0f, -0.8125f, -0.3125f, 0.0f, -0.15625f, 0.0f, 1.21875f, 0.0f,
    -0.6875f,
};

static const float convt1d_y[72] = {
    0.75f, -0.5625f, -0.78125f, 0.0f, 0.78125f, -0.28125f, -0.75f, 0.40625f, 0.5625f, 0.5625f,
    -0.65625f, 0.0f, -0.75f, 0.375f, -0.46875f, 0.3125f, -0.9375f, -0.46875f, 0.6875f, -0.1875f,
    0.5625f, -0.65625f, 0.5625f, 0.0f, -0.625f, 0.5f, -0.15625f, 0.625f, -0.625f, -0.65625f, 0.5f,
    -0.375f, 0.5625f, -0.65625f, 0.5625f, 0.0f, 0.9375f, -0.46875f, 0.8125f, 0.1875f, -0.84375f,
    -0.40625f, -0.5625f, 0.5f, 0.4375f, 0.75f, -0.5625f, 0.0f, -0.84375f, 0.1875f, 0.5625f,
    -0.46875f, 0.9375f, -0.46875f, 0.59375f, -0.375f, 0.5625f, -0.75f, 0.375f, 0.0f, -0.59375f,
    0.4375f, 0.3125f, -0.71875f, 0.6875f, -0.53125f, 0.53125f, -0.4375f, 0.6875f, -0.625f, 0.5f,
    0.0f,
};


/* ---- graphs ---- */

#include "kernel_graph.h"

/* Runs g forward in float on pattern inputs pats[k] (graph input order)
 * and compares output 0, elementwise, with want[n]. */
static void expect_forward(const struct gp_graph *g, const struct pat *pats, const float *want,
                           int64_t n, double tol)
{
    void *in[8] = {0}, *out[8] = {0};
    assert_true(g->n_inputs <= 8 && g->n_outputs <= 8);
    for (int k = 0; k < g->n_inputs; k++) in[k] = pattern(numel_of(g, g->inputs[k]), pats[k]);
    for (int k = 0; k < g->n_outputs; k++) {
        const struct gp_value *v = &g->values[g->outputs[k]];
        out[k] = calloc((size_t)(numel_of(g, g->outputs[k]) + 1), gp_dtype_size(v->dtype));
    }
    if (numel_of(g, g->outputs[0]) != n)
        fail_msg("output has %lld elements, expected %lld", (long long)numel_of(g, g->outputs[0]),
                 (long long)n);
    op_forward_f32(g, (const void *const *)in, out, false);
    const float *y = out[0];
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(y[i] - want[i]) <= tol * fmax(1.0, fabs(want[i]))))
            fail_msg("output[%lld] is %.9g, expected %.9g", (long long)i, y[i], want[i]);
    for (int k = 0; k < 8; k++) {
        free(in[k]);
        free(out[k]);
    }
}

/* Gradients against finite differences and float against double. */
static void check_numerics(const struct gp_graph *g, uint64_t seed)
{
    struct op_check_opts o = {.seed = seed};
    op_gradcheck(g, &o);
    op_forward_f32_vs_f64(g, &o);
}

/* ---- Gemm ---- */

struct gemm_case {
    int ta, tb;
    int c_rank; /* -1: no C */
    int64_t c[2];
    float alpha, beta;
};

/* Y [3, 5] = alpha * A' B' + beta * C with M = 3, K = 4, N = 5. */
static void build_gemm(struct gp_graph *g, const struct gemm_case *c)
{
    begin(g, c->c_rank < 0 ? 13 : 7);
    int64_t a[2] = {c->ta ? 4 : 3, c->ta ? 3 : 4}, b[2] = {c->tb ? 5 : 4, c->tb ? 4 : 5};
    input(g, "a", 2, a);
    input(g, "b", 2, b);
    if (c->c_rank > 0) input(g, "c", c->c_rank, c->c);
    if (c->c_rank == 0) { /* a scalar cannot be a graph input (no batch axis) */
        struct gp_error err = {0};
        struct gp_shape s = {.rank = 0};
        if (gp_graph_add_const_f32(g, "c", &s, (const float[]){0.375f}, &err) != GP_OK)
            fail_msg("%s", err.msg);
    }
    int n = node(g, "Gemm", c->c_rank < 0 ? 2 : 3, S("a", "b", "c"), 1, S("y"));
    if (c->ta) attr_i(g, n, "transA", 1);
    if (c->tb) attr_i(g, n, "transB", 1);
    if (c->alpha != 1) attr_f(g, n, "alpha", c->alpha);
    if (c->beta != 1) attr_f(g, n, "beta", c->beta);
    finalize_ok(g);
}

static void test_gemm_forward(void **state)
{
    (void)state;
    struct gp_graph g;
    struct gemm_case c = {1, 1, 1, {5}, 0.5f, 2.0f};
    build_gemm(&g, &c);
    expect_forward(&g, (struct pat[]){PAT_X, PAT_W, PAT_B}, gemm_y, N_OF(gemm_y), 1e-6);
    gp_graph_free(&g);
}

/* C of shape [M, N] and [M, 1]: each row of C has its own entries. */
static void test_gemm_forward_c_shapes(void **state)
{
    (void)state;
    struct gp_graph g;
    struct gemm_case c = {0, 0, 2, {3, 5}, 1.5f, -0.5f};
    build_gemm(&g, &c);
    expect_forward(&g, (struct pat[]){PAT_X, PAT_W, PAT_B}, gemm_cmn_y, N_OF(gemm_cmn_y), 1e-6);
    gp_graph_free(&g);
    c.c[1] = 1;
    build_gemm(&g, &c);
    expect_forward(&g, (struct pat[]){PAT_X, PAT_W, PAT_B}, gemm_cm1_y, N_OF(gemm_cm1_y), 1e-6);
    gp_graph_free(&g);
}

/* beta = 0 ignores C, NaNs included, as PyTorch's addmm does. */
static void test_gemm_beta_zero_ignores_c(void **state)
{
    (void)state;
    struct gp_graph g;
    struct gemm_case c = {0, 0, 2, {3, 5}, 1.0f, 0.0f};
    build_gemm(&g, &c);
    float a[12], b[20], cm[15], y[15];
    for (int i = 0; i < 12; i++) a[i] = (float)(i % 5) - 2;
    for (int i = 0; i < 20; i++) b[i] = (float)(i % 3) - 1;
    for (int i = 0; i < 15; i++) cm[i] = NAN;
    op_forward_f32(&g, (const void *const[]){a, b, cm}, (void *[]){y}, false);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 5; j++) {
            float want = 0;
            for (int k = 0; k < 4; k++) want += a[i * 4 + k] * b[k * 5 + j];
            assert_float_equal(y[i * 5 + j], want, 1e-6);
        }
    gp_graph_free(&g);
}

/* Every transpose combination with every shape of C that broadcasts. */
static void test_gemm_gradients(void **state)
{
    (void)state;
    static const struct {
        int rank;
        int64_t dims[2];
    } cs[] = {{-1, {0}}, {0, {0}}, {1, {5}}, {1, {1}}, {2, {1, 5}}, {2, {3, 1}}, {2, {3, 5}},
              {2, {1, 1}}};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int k = 0; k < N_OF(cs); k++) {
                struct gemm_case c = {ta, tb, cs[k].rank, {cs[k].dims[0], cs[k].dims[1]}, 0.7f,
                                      -1.3f};
                struct gp_graph g;
                build_gemm(&g, &c);
                check_numerics(&g, (uint64_t)(ta * 100 + tb * 10 + k));
                gp_graph_free(&g);
            }
}

/* ---- MatMul ---- */

static void build_matmul(struct gp_graph *g, int ra, const int64_t *a, int rb, const int64_t *b)
{
    begin(g, 13);
    input(g, "a", ra, a);
    input(g, "b", rb, b);
    node(g, "MatMul", 2, S("a", "b"), 1, S("y"));
    finalize_ok(g);
}

static void test_matmul_forward(void **state)
{
    (void)state;
    struct gp_graph g;
    struct pat p[2] = {PAT_X, PAT_W};
    build_matmul(&g, 4, (int64_t[]){2, 1, 3, 4}, 3, (int64_t[]){3, 4, 2});
    expect_forward(&g, p, mm_batched_y, N_OF(mm_batched_y), 1e-6);
    gp_graph_free(&g);
    build_matmul(&g, 1, (int64_t[]){4}, 3, (int64_t[]){2, 4, 3});
    expect_forward(&g, p, mm_vec_mat_y, N_OF(mm_vec_mat_y), 1e-6);
    gp_graph_free(&g);
    build_matmul(&g, 3, (int64_t[]){2, 3, 4}, 1, (int64_t[]){4});
    expect_forward(&g, p, mm_mat_vec_y, N_OF(mm_mat_vec_y), 1e-6);
    gp_graph_free(&g);
}

/* 1-D promotion, one operand shared by a batch (both ways), and batch axes
 * broadcast from either side. */
static void test_matmul_gradients(void **state)
{
    (void)state;
    static const struct {
        int ra, rb;
        int64_t a[4], b[4];
    } cases[] = {
        {2, 2, {3, 4}, {4, 5}},
        {3, 2, {2, 3, 4}, {4, 5}},
        {2, 3, {3, 4}, {2, 4, 5}},
        {4, 3, {2, 1, 3, 4}, {3, 4, 2}},
        {3, 3, {1, 3, 4}, {2, 4, 5}},
        {4, 4, {2, 2, 3, 4}, {2, 1, 4, 2}},
        {1, 1, {4}, {4}},
        {1, 3, {4}, {2, 4, 3}},
        {3, 1, {2, 3, 4}, {4}},
        {2, 1, {5, 4}, {4}},
        {1, 2, {4}, {4, 2}},
    };
    for (int k = 0; k < N_OF(cases); k++) {
        struct gp_graph g;
        build_matmul(&g, cases[k].ra, cases[k].a, cases[k].rb, cases[k].b);
        check_numerics(&g, (uint64_t)k + 1);
        gp_graph_free(&g);
    }
}

/* ---- Conv and ConvTranspose ---- */

struct conv_case {
    const char *op;
    int rank;
    int64_t x[5], w[5];
    bool bias;
    int64_t group; /* 0: attribute absent */
    int64_t strides[3], dilations[3], output_padding[3], output_shape[3]; /* [0] 0: absent */
    bool has_pads;
    int64_t pads[6];
    const char *auto_pad;
    int64_t opset; /* 0: 13 */
};

static void build_conv(struct gp_graph *g, const struct conv_case *c)
{
    begin(g, c->opset ? c->opset : 13);
    int ns = c->rank - 2;
    bool transpose = strcmp(c->op, "ConvTranspose") == 0;
    int64_t m = transpose ? c->w[1] * (c->group ? c->group : 1) : c->w[0];
    input(g, "x", c->rank, c->x);
    input(g, "w", c->rank, c->w);
    if (c->bias) input(g, "b", 1, &m);
    int n = node(g, c->op, c->bias ? 3 : 2, S("x", "w", "b"), 1, S("y"));
    if (c->group) attr_i(g, n, "group", c->group);
    if (c->strides[0]) attr_ints(g, n, "strides", ns, c->strides);
    if (c->dilations[0]) attr_ints(g, n, "dilations", ns, c->dilations);
    if (c->output_padding[0]) attr_ints(g, n, "output_padding", ns, c->output_padding);
    if (c->output_shape[0]) attr_ints(g, n, "output_shape", ns, c->output_shape);
    if (c->has_pads) attr_ints(g, n, "pads", 2 * ns, c->pads);
    if (c->auto_pad) attr_s(g, n, "auto_pad", c->auto_pad);
    finalize_ok(g);
}

/* The cases whose outputs PyTorch computed (conv*_y above). */
static const struct conv_case conv_ref_cases[] = {
    /* 2-D: stride 2, pads (1, 0, 2, 1), dilation 2, groups 2, bias. */
    {"Conv", 4, {2, 4, 6, 7}, {6, 2, 3, 2}, true, 2, {2, 2}, {2, 2}, {0}, {0}, true,
     {1, 0, 2, 1}, NULL, 0},
    /* 1-D: stride 2, pads (2, 1), no bias. */
    {"Conv", 3, {2, 3, 9}, {4, 3, 3}, false, 0, {2}, {0}, {0}, {0}, true, {2, 1}, NULL, 0},
    /* Depthwise, SAME_UPPER with stride 2: pads (0, 0, 1, 1). */
    {"Conv", 4, {1, 3, 5, 5}, {3, 1, 2, 2}, true, 3, {2, 2}, {0}, {0}, {0}, false, {0},
     "SAME_UPPER", 0},
    /* 3-D, asymmetric pads. */
    {"Conv", 5, {1, 2, 4, 4, 3}, {2, 2, 2, 2, 2}, false, 0, {0}, {0}, {0}, {0}, true,
     {1, 0, 1, 1, 1, 0}, NULL, 0},
    /* Transposed 2-D: groups 2, stride 2, pads (1, 0), output_padding (1, 0),
     * dilation (1, 2), bias. */
    {"ConvTranspose", 4, {1, 4, 2, 2}, {4, 3, 3, 3}, true, 2, {2, 2}, {1, 2}, {1, 0}, {0}, true,
     {1, 0, 1, 0}, NULL, 0},
    /* Transposed 1-D: stride 3, pads 1, output_padding 2. */
    {"ConvTranspose", 3, {2, 2, 4}, {2, 3, 3}, false, 0, {3}, {0}, {2}, {0}, true, {1, 1}, NULL,
     0},
};

static const float *const conv_ref_outputs[] = {conv2d_y, conv1d_y, conv_dw_y, conv3d_y, convt_y,
                                                convt1d_y};
static const int64_t conv_ref_sizes[] = {N_OF(conv2d_y), N_OF(conv1d_y), N_OF(conv_dw_y),
                                         N_OF(conv3d_y), N_OF(convt_y), N_OF(convt1d_y)};

static void test_conv_forward(void **state)
{
    (void)state;
    for (int k = 0; k < N_OF(conv_ref_cases); k++) {
        struct gp_graph g;
        build_conv(&g, &conv_ref_cases[k]);
        expect_forward(&g, (struct pat[]){PAT_X, PAT_W, PAT_B}, conv_ref_outputs[k],
                       conv_ref_sizes[k], 1e-6);
        gp_graph_free(&g);
    }
}

/* Beyond the reference cases: the 1x1 paths (no unfolding), a 1x1 kernel
 * with a stride, SAME_LOWER, a depthwise multiplier, asymmetric transposed
 * pads, output_shape, 3-D transposed, derived transposed pads. */
static const struct conv_case conv_more_cases[] = {
    {"Conv", 4, {2, 4, 3, 3}, {6, 2, 1, 1}, true, 2, {0}, {0}, {0}, {0}, false, {0}, NULL, 0},
    {"Conv", 4, {1, 3, 5, 4}, {2, 3, 1, 1}, true, 0, {2, 2}, {0}, {0}, {0}, false, {0}, NULL, 0},
    {"Conv", 4, {1, 2, 6, 5}, {3, 2, 3, 3}, true, 0, {2, 2}, {0}, {0}, {0}, false, {0},
     "SAME_LOWER", 0},
    {"Conv", 4, {1, 2, 5, 5}, {4, 1, 3, 3}, false, 2, {0}, {0}, {0}, {0}, true, {1, 1, 1, 1},
     NULL, 0},
    {"Conv", 3, {2, 2, 7}, {2, 2, 2}, true, 0, {1}, {3}, {0}, {0}, true, {0, 3}, NULL, 0},
    {"ConvTranspose", 4, {1, 2, 3, 3}, {2, 2, 3, 2}, true, 0, {2, 3}, {0}, {0}, {0}, true,
     {0, 1, 2, 0}, NULL, 0},
    {"ConvTranspose", 4, {1, 2, 3, 3}, {2, 1, 3, 3}, true, 0, {2, 2}, {0}, {0}, {7, 8}, false,
     {0}, NULL, 0},
    {"ConvTranspose", 4, {2, 4, 3, 3}, {4, 2, 1, 1}, true, 2, {0}, {0}, {0}, {0}, false, {0},
     NULL, 0},
    {"ConvTranspose", 5, {1, 2, 2, 3, 2}, {2, 2, 2, 2, 3}, false, 0, {2, 1, 2}, {0}, {0}, {0},
     true, {0, 1, 0, 1, 0, 1}, NULL, 0},
    {"ConvTranspose", 4, {1, 2, 3, 2}, {2, 3, 3, 3}, true, 0, {2, 2}, {0}, {0}, {0}, false, {0},
     "SAME_UPPER", 11},
};

static void test_conv_gradients(void **state)
{
    (void)state;
    for (int set = 0; set < 2; set++) {
        const struct conv_case *cases = set ? conv_more_cases : conv_ref_cases;
        int n = set ? N_OF(conv_more_cases) : N_OF(conv_ref_cases);
        for (int k = 0; k < n; k++) {
            struct gp_graph g;
            build_conv(&g, &cases[k]);
            check_numerics(&g, (uint64_t)(set * 100 + k));
            gp_graph_free(&g);
        }
    }
}

/* ---- the thread count does not change a bit ---- */

/* Forward and backward in float with `threads` OpenMP and BLAS threads;
 * returns every output and every input gradient, concatenated. */
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
    float *all = malloc(sizeof(float) * (size_t)total), *p = all;
    for (int k = 0; k < g->n_outputs; k++) {
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
    static const struct conv_case big[] = {
        {"Conv", 4, {2, 8, 32, 32}, {16, 4, 3, 3}, true, 2, {0}, {0}, {0}, {0}, true,
         {1, 1, 1, 1}, NULL, 0},
        {"ConvTranspose", 4, {2, 8, 16, 16}, {8, 4, 3, 3}, true, 2, {2, 2}, {0}, {1, 1}, {0},
         true, {1, 1, 1, 1}, NULL, 0},
    };
    for (int k = 0; k < N_OF(big); k++) {
        struct gp_graph g;
        build_conv(&g, &big[k]);
        expect_thread_independent(&g);
        gp_graph_free(&g);
    }
    struct gp_graph g;
    build_matmul(&g, 3, (int64_t[]){4, 64, 96}, 2, (int64_t[]){96, 80});
    expect_thread_independent(&g);
    gp_graph_free(&g);
    int threads = omp_get_num_procs();
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_forward),
        cmocka_unit_test(test_gemm_forward_c_shapes),
        cmocka_unit_test(test_gemm_beta_zero_ignores_c),
        cmocka_unit_test(test_gemm_gradients),
        cmocka_unit_test(test_matmul_forward),
        cmocka_unit_test(test_matmul_gradients),
        cmocka_unit_test(test_conv_forward),
        cmocka_unit_test(test_conv_gradients),
        cmocka_unit_test(test_thread_count_invariance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
