/* Helpers for the CPU kernel tests (test_cpu_*.c): one-node graphs built
 * with the builder API, forward runs with given data, and backward runs with
 * a given output gradient in the double build, so a test can compare a
 * kernel's values with PyTorch's at the points finite differences cannot
 * judge (kinks, bounds, ties). Header-only: each test program includes it
 * once. Graphs keep the sizes they declare (batch 0). */
#ifndef GP_TESTS_CPU_KERNEL_TEST_H
#define GP_TESTS_CPU_KERNEL_TEST_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "graph/build.h"
#include "op_check.h"

#define GP_CPU_DOUBLE
#include "backend/cpu/runner.h"
#undef GP_CPU_DOUBLE

#define S(...) ((const char *const[]){__VA_ARGS__})
#define I64(...) ((const int64_t[]){__VA_ARGS__})
#define F32(...) ((const float[]){__VA_ARGS__})
#define F64(...) ((const double[]){__VA_ARGS__})
#define U8(...) ((const uint8_t[]){__VA_ARGS__})

static inline struct gp_shape shp(int rank, const int64_t *dims)
{
    struct gp_shape s = {.rank = rank};
    for (int i = 0; i < rank; i++) s.dims[i] = dims[i];
    return s;
}

static inline void init(struct gp_graph *g, int64_t opset)
{
    struct gp_error err = {0};
    assert_int_equal(gp_graph_init(g, 0, opset, 256, 64, &err), GP_OK);
}

static inline void input(struct gp_graph *g, const char *name, enum gp_dtype dtype, int rank,
                         const int64_t *dims)
{
    struct gp_error err = {0};
    struct gp_shape s = shp(rank, dims);
    assert_int_equal(gp_graph_add_input(g, name, dtype, &s, &err), GP_OK);
}

/* An initializer of any dtype, elements given as doubles. A float one that
 * reaches an output through differentiable inputs becomes a parameter. */
static inline void cany(struct gp_graph *g, const char *name, enum gp_dtype dtype, int rank,
                        const int64_t *dims, const double *data)
{
    struct gp_error err = {0};
    struct gp_shape s = shp(rank, dims);
    struct gp_tensor *t = gp_graph_new_tensor(g, dtype, &s);
    assert_non_null(t);
    for (int64_t i = 0; i < gp_shape_numel(&s); i++) gp_tensor_set_f64(t, i, data[i]);
    assert_int_equal(gp_graph_add_initializer(g, name, t, &err), GP_OK);
}

static inline void ci64(struct gp_graph *g, const char *name, int rank, const int64_t *dims,
                        const int64_t *data)
{
    struct gp_error err = {0};
    struct gp_shape s = shp(rank, dims);
    assert_int_equal(gp_graph_add_const_i64(g, name, &s, data, &err), GP_OK);
}

static inline void cf32(struct gp_graph *g, const char *name, int rank, const int64_t *dims,
                        const float *data)
{
    struct gp_error err = {0};
    struct gp_shape s = shp(rank, dims);
    assert_int_equal(gp_graph_add_const_f32(g, name, &s, data, &err), GP_OK);
}

static inline int node(struct gp_graph *g, const char *op, int ni, const char *const *in, int no,
                       const char *const *out)
{
    struct gp_error err = {0};
    int id = gp_graph_add_node(g, op, "", NULL, ni, in, no, out, &err);
    if (id < 0) fail_msg("%s", err.msg);
    return id;
}

static inline struct gp_attr *attr(struct gp_graph *g, int n, const char *name,
                                   enum gp_attr_type type)
{
    struct gp_error err = {0};
    struct gp_attr *a = gp_graph_add_attr(g, n, name, type, 8, &err);
    if (!a) fail_msg("%s", err.msg);
    return a;
}

static inline void attr_int(struct gp_graph *g, int n, const char *name, int64_t v)
{
    attr(g, n, name, GP_ATTR_INT)->i = v;
}

static inline void attr_float(struct gp_graph *g, int n, const char *name, float v)
{
    attr(g, n, name, GP_ATTR_FLOAT)->f = v;
}

static inline void attr_str(struct gp_graph *g, int n, const char *name, const char *v)
{
    attr(g, n, name, GP_ATTR_STRING)->s = gp_arena_strdup(&g->arena, v);
}

static inline void attr_ints(struct gp_graph *g, int n, const char *name, int count,
                             const int64_t *v)
{
    struct gp_attr *a = attr(g, n, name, GP_ATTR_INTS);
    a->count = count;
    a->ints = gp_arena_memdup(&g->arena, v, sizeof *v * (size_t)count);
}

static inline void attr_floats(struct gp_graph *g, int n, const char *name, int count,
                               const float *v)
{
    struct gp_attr *a = attr(g, n, name, GP_ATTR_FLOATS);
    a->count = count;
    a->floats = gp_arena_memdup(&g->arena, v, sizeof *v * (size_t)count);
}

static inline void output(struct gp_graph *g, const char *name)
{
    struct gp_error err = {0};
    assert_int_equal(gp_graph_add_output(g, name, &err), GP_OK);
}

static inline void finalize(struct gp_graph *g)
{
    struct gp_error err = {0};
    if (gp_graph_finalize(g, &err) != GP_OK) fail_msg("finalize failed: %s", err.msg);
}

static inline const struct gp_value *val(const struct gp_graph *g, const char *name)
{
    int id = gp_graph_find_value(g, name);
    if (id < 0) fail_msg("no value '%s'", name);
    return &g->values[id];
}

/* got[i] within tol (absolute, scaled by max(1, |want|)) of want[i]. NaN
 * must meet NaN. */
static inline void expect_near(const char *what, const float *got, const float *want, int64_t n,
                               double tol)
{
    for (int64_t i = 0; i < n; i++) {
        double a = got[i], b = want[i];
        bool ok = isnan(b) ? isnan(a) : fabs(a - b) <= tol * fmax(1.0, fabs(b));
        if (!ok) fail_msg("%s[%lld]: got %.9g, expected %.9g", what, (long long)i, a, b);
    }
}

static inline void expect_near64(const char *what, const double *got, const double *want,
                                 int64_t n, double tol)
{
    for (int64_t i = 0; i < n; i++) {
        bool ok = isnan(want[i]) ? isnan(got[i])
                                 : fabs(got[i] - want[i]) <= tol * fmax(1.0, fabs(want[i]));
        if (!ok)
            fail_msg("%s[%lld]: got %.12g, expected %.12g", what, (long long)i, got[i], want[i]);
    }
}

/* Forward (float build) of a graph with one output: inputs in graph order,
 * given in graph dtypes (float32 for float values); the output is copied
 * into `out` in its dtype. */
static inline void run1(const struct gp_graph *g, const void *const *inputs, void *out)
{
    void *outs[1] = {out};
    op_forward_f32(g, inputs, outs, false);
}

/* Forward then backward in the double build with dY = dys[k] (doubles) for
 * output k; the runner stays alive for reading gradients through grad_of.
 * inputs: as for run1. */
static inline struct gp_cpu_runner *run_backward(const struct gp_graph *g,
                                                 const void *const *inputs,
                                                 const double *const *dys, bool training)
{
    struct gp_error err = {0};
    struct gp_cpu_runner *r = NULL;
    if (gp_cpu_runner_create_f64(g, true, &r, &err) != GP_OK) fail_msg("%s", err.msg);
    for (int k = 0; k < g->n_inputs; k++) gp_cpu_runner_set_f64(r, g->inputs[k], inputs[k]);
    struct gp_run_opts o = {.training = training, .seed = 1, .step = 3, .dropout_ratio = -1};
    if (gp_cpu_runner_forward_f64(r, &o, 0, g->n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);
    gp_cpu_runner_zero_activation_grads_f64(r);
    gp_cpu_runner_zero_param_grads_f64(r);
    for (int k = 0; k < g->n_outputs; k++) {
        double *dy = gp_cpu_runner_grad_f64(r, g->outputs[k]);
        if (dy && dys[k])
            memcpy(dy, dys[k],
                   sizeof(double) * (size_t)gp_shape_numel(&g->values[g->outputs[k]].shape));
    }
    if (gp_cpu_runner_backward_f64(r, &o, 0, g->n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);
    return r;
}

static inline const double *grad_of(struct gp_cpu_runner *r, const struct gp_graph *g,
                                    const char *name)
{
    const double *d = gp_cpu_runner_grad_f64(r, gp_graph_find_value(g, name));
    if (!d) fail_msg("'%s' has no gradient", name);
    return d;
}

/* Forward and backward (double build) on inputs from `gen` (NaN: a fixed
 * pattern) with dY a fixed pattern, once on one thread and once on four:
 * every output and every input and parameter gradient must be
 * bit-identical. Use shapes above GP_CPU_PAR_MIN elements so that loops do
 * split. */
static inline void expect_thread_invariant(const struct gp_graph *g, bool training,
                                           double (*gen)(const char *, int64_t, void *))
{
    void **in = calloc((size_t)g->n_inputs, sizeof *in);
    double **dys = calloc((size_t)g->n_outputs, sizeof *dys);
    for (int k = 0; k < g->n_inputs; k++) {
        const struct gp_value *v = &g->values[g->inputs[k]];
        struct gp_tensor t = {.dtype = v->dtype, .shape = v->shape};
        int64_t n = gp_shape_numel(&v->shape);
        in[k] = t.data = calloc((size_t)(n ? n : 1), gp_dtype_size(v->dtype));
        for (int64_t i = 0; i < n; i++) {
            double x = gen ? gen(v->name, i, NULL) : NAN;
            gp_tensor_set_f64(&t, i, isnan(x) ? sin(0.37 * (double)i + k) : x);
        }
    }
    for (int k = 0; k < g->n_outputs; k++) {
        int64_t n = gp_shape_numel(&g->values[g->outputs[k]].shape);
        dys[k] = malloc(sizeof(double) * (size_t)(n ? n : 1));
        for (int64_t i = 0; i < n; i++) dys[k][i] = cos(0.11 * (double)i + k);
    }
    struct gp_cpu_runner *r[2];
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t ? 4 : 1);
        r[t] = run_backward(g, (const void *const *)in, (const double *const *)dys, training);
    }
    omp_set_num_threads(omp_get_num_procs());
    for (int v = 0; v < g->n_values; v++) {
        const struct gp_value *val = &g->values[v];
        if (!val->has_shape) continue;
        size_t bytes = (size_t)gp_shape_numel(&val->shape) *
                       (gp_dtype_is_float(val->dtype) ? sizeof(double) : gp_dtype_size(val->dtype));
        const void *a = gp_cpu_runner_data_f64(r[0], v), *b = gp_cpu_runner_data_f64(r[1], v);
        if (a && b && memcmp(a, b, bytes) != 0)
            fail_msg("'%s' differs between 1 and 4 threads", val->name);
        const double *ga = gp_cpu_runner_grad_f64(r[0], v), *gb = gp_cpu_runner_grad_f64(r[1], v);
        if (ga && gb && memcmp(ga, gb, bytes) != 0)
            fail_msg("the gradient of '%s' differs between 1 and 4 threads", val->name);
    }
    for (int t = 0; t < 2; t++) gp_cpu_runner_free_f64(r[t]);
    for (int k = 0; k < g->n_inputs; k++) free(in[k]);
    for (int k = 0; k < g->n_outputs; k++) free(dys[k]);
    free(in);
    free(dys);
}

/* Finalizes, then runs the gradient check and the float-vs-double check. */
static inline void check_all(struct gp_graph *g, const struct op_check_opts *o)
{
    op_gradcheck(g, o);
    op_forward_f32_vs_f64(g, o);
}

#endif
