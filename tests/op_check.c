#include "op_check.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#undef GP_CPU
#define GP_CPU_DOUBLE
#include "backend/cpu/runner.h"
#include "layer_run.h"
#undef GP_CPU_DOUBLE

/* The float build's entry points (runner.h above declared the double ones). */
struct gp_cpu_runner;
gp_status gp_cpu_runner_create_f32(const struct gp_graph *, bool, struct gp_cpu_runner **,
                                   struct gp_error *);
void gp_cpu_runner_free_f32(struct gp_cpu_runner *);
void gp_cpu_runner_set_f32(struct gp_cpu_runner *, int, const void *);
void gp_cpu_runner_get_f32(struct gp_cpu_runner *, int, void *);
gp_status gp_cpu_runner_forward_f32(struct gp_cpu_runner *, const struct gp_run_opts *, int, int,
                                    struct gp_error *);

static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform(uint64_t *s) { return (double)(next(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0; }

/* Input data in the graph's dtype (float32 for float values), from the
 * generator or uniform(-1, 1). */
static void *make_input(const struct gp_value *v, const struct op_check_opts *o, uint64_t *rng)
{
    int64_t n = gp_shape_numel(&v->shape);
    struct gp_tensor t = {.dtype = v->dtype, .shape = v->shape};
    t.data = calloc((size_t)(n ? n : 1), gp_dtype_size(v->dtype));
    for (int64_t i = 0; i < n; i++) {
        double x = o->gen ? o->gen(v->name, i, o->user) : NAN;
        if (isnan(x)) {
            if (!gp_dtype_is_float(v->dtype))
                fail_msg("integer input '%s' needs values from the generator", v->name);
            x = uniform(rng);
        }
        gp_tensor_set_f64(&t, i, x);
    }
    return t.data;
}

static struct gp_run_opts run_opts(const struct op_check_opts *o)
{
    return (struct gp_run_opts){.training = o->training, .update_state = false,
                                .seed = o->seed, .step = 3, .dropout_ratio = -1};
}

/* What input and parameter gradients hold before backward (see op_gradcheck). */
#define GRAD_PREFILL 0.375

/* L = sum over float outputs of w . out */
static double loss(const struct gp_graph *g, struct gp_cpu_runner *r, double *const *w)
{
    double l = 0;
    for (int k = 0; k < g->n_outputs; k++) {
        const struct gp_value *v = &g->values[g->outputs[k]];
        if (!gp_dtype_is_float(v->dtype)) continue;
        const double *y = gp_cpu_runner_data_f64(r, g->outputs[k]);
        for (int64_t i = 0; i < gp_shape_numel(&v->shape); i++) l += w[k][i] * y[i];
    }
    return l;
}

void op_gradcheck(const struct gp_graph *g, const struct op_check_opts *o)
{
    double tol = o->tol > 0 ? o->tol : 1e-6;
    int max_elems = o->max_elems > 0 ? o->max_elems : 64;
    uint64_t rng = o->seed * 7919 + 17;
    struct gp_error err = {0};
    struct gp_cpu_runner *r = NULL;
    if (gp_cpu_runner_create_f64(g, true, &r, &err) != GP_OK) fail_msg("%s", err.msg);
    for (int k = 0; k < g->n_inputs; k++) {
        void *data = make_input(&g->values[g->inputs[k]], o, &rng);
        gp_cpu_runner_set_f64(r, g->inputs[k], data);
        free(data);
    }
    double **w = calloc((size_t)g->n_outputs, sizeof *w);
    for (int k = 0; k < g->n_outputs; k++) {
        int64_t n = gp_shape_numel(&g->values[g->outputs[k]].shape);
        w[k] = malloc(sizeof(double) * (size_t)(n ? n : 1));
        for (int64_t i = 0; i < n; i++) w[k][i] = uniform(&rng);
    }
    struct gp_run_opts ro = run_opts(o);
    if (gp_cpu_runner_forward_f64(r, &ro, 0, g->n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);
    gp_cpu_runner_zero_activation_grads_f64(r);
    gp_cpu_runner_zero_param_grads_f64(r);
    /* Kernels accumulate (+=) into input gradients; start those at a known
     * nonzero value, subtracted below, so a kernel that overwrites fails. */
    for (int v = 0; v < g->n_values; v++) {
        const struct gp_value *val = &g->values[v];
        double *grad = gp_cpu_runner_grad_f64(r, v);
        if (!grad || (val->kind != GP_VALUE_INPUT && val->kind != GP_VALUE_PARAMETER)) continue;
        for (int64_t i = 0; i < gp_shape_numel(&val->shape); i++) grad[i] = GRAD_PREFILL;
    }
    for (int k = 0; k < g->n_outputs; k++) {
        double *dy = gp_cpu_runner_grad_f64(r, g->outputs[k]);
        if (dy) memcpy(dy, w[k], sizeof(double) * (size_t)gp_shape_numel(&g->values[g->outputs[k]].shape));
    }
    if (gp_cpu_runner_backward_f64(r, &ro, 0, g->n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);

    int checked = 0;
    for (int v = 0; v < g->n_values; v++) {
        const struct gp_value *val = &g->values[v];
        if (val->kind != GP_VALUE_INPUT && val->kind != GP_VALUE_PARAMETER) continue;
        const double *grad = gp_cpu_runner_grad_f64(r, v);
        if (!grad) continue;
        int64_t n = gp_shape_numel(&val->shape);
        double *analytic = malloc(sizeof(double) * (size_t)(n ? n : 1));
        for (int64_t i = 0; i < n; i++) analytic[i] = grad[i] - GRAD_PREFILL;
        double *x = gp_cpu_runner_data_f64(r, v);
        int64_t stride = n > max_elems ? n / max_elems : 1;
        for (int64_t i = 0; i < n; i += stride) {
            double saved = x[i], h = 1e-6 * fmax(1.0, fabs(saved));
            x[i] = saved + h;
            if (gp_cpu_runner_forward_f64(r, &ro, 0, g->n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);
            double lp = loss(g, r, w);
            x[i] = saved - h;
            if (gp_cpu_runner_forward_f64(r, &ro, 0, g->n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);
            double lm = loss(g, r, w);
            x[i] = saved;
            double numeric = (lp - lm) / (2 * h);
            /* Written so that a NaN on either side fails. */
            if (!(fabs(numeric - analytic[i]) <= tol * fmax(1.0, fabs(numeric))))
                fail_msg("gradient of '%s'[%lld]: backward %.10g, finite differences %.10g",
                         val->name, (long long)i, analytic[i], numeric);
            checked++;
        }
        free(analytic);
    }
    if (!checked) fail_msg("no gradient was checked: does the graph have float inputs?");
    for (int k = 0; k < g->n_outputs; k++) free(w[k]);
    free(w);
    gp_cpu_runner_free_f64(r);
    op_bf16_vs_f32(g, o);
}

/* bf16 rounds every stored tensor to 8 significant bits (2^-9 relative) and
 * a sum of products carries about 2^-8 of its scale: an element agrees within
 * 3% of (|fp32| + rms); 0.5% of a tensor's elements (plus one) may not, where
 * a rounded input crossed a kink, a tie or an integer (ReLU at 0, argmax,
 * Floor, a divisor near 0). */
void op_bf16_vs_f32(const struct gp_graph *g, const struct op_check_opts *o)
{
    int worst_layer;
    layer_run_compare_graph(g, "bf16 against fp32", 2, o->gen, o->user, &gp_cpu_device_ops, GP_PRECISION_BF16,
                            &gp_cpu_device_ops, GP_PRECISION_FP32, 0.03, 0.005, &worst_layer);
}

void op_forward_f32_vs_f64(const struct gp_graph *g, const struct op_check_opts *o)
{
    double tol = o->tol > 0 ? o->tol : 1e-5;
    uint64_t rng = o->seed * 7919 + 17;
    struct gp_error err = {0};
    struct gp_cpu_runner *r64 = NULL, *r32 = NULL;
    if (gp_cpu_runner_create_f64(g, false, &r64, &err) != GP_OK) fail_msg("%s", err.msg);
    if (gp_cpu_runner_create_f32(g, false, &r32, &err) != GP_OK) fail_msg("%s", err.msg);
    for (int k = 0; k < g->n_inputs; k++) {
        void *data = make_input(&g->values[g->inputs[k]], o, &rng);
        gp_cpu_runner_set_f64(r64, g->inputs[k], data);
        gp_cpu_runner_set_f32(r32, g->inputs[k], data);
        free(data);
    }
    struct gp_run_opts ro = run_opts(o);
    if (gp_cpu_runner_forward_f64(r64, &ro, 0, g->n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);
    if (gp_cpu_runner_forward_f32(r32, &ro, 0, g->n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);
    for (int k = 0; k < g->n_outputs; k++) {
        const struct gp_value *v = &g->values[g->outputs[k]];
        if (!gp_dtype_is_float(v->dtype)) continue;
        int64_t n = gp_shape_numel(&v->shape);
        float *a = malloc(sizeof(float) * (size_t)(n ? n : 1));
        gp_cpu_runner_get_f32(r32, g->outputs[k], a);
        const double *b = gp_cpu_runner_data_f64(r64, g->outputs[k]);
        for (int64_t i = 0; i < n; i++)
            if (isnan(b[i]) ? !isnan(a[i]) : !(fabs(a[i] - b[i]) <= tol * fmax(1.0, fabs(b[i]))))
                fail_msg("output '%s'[%lld]: float %.9g, double %.12g", v->name, (long long)i,
                         (double)a[i], b[i]);
        free(a);
    }
    gp_cpu_runner_free_f64(r64);
    gp_cpu_runner_free_f32(r32);
}

void op_forward_f32(const struct gp_graph *g, const void *const *inputs, void **outputs,
                    bool training)
{
    struct gp_error err = {0};
    struct gp_cpu_runner *r = NULL;
    if (gp_cpu_runner_create_f32(g, false, &r, &err) != GP_OK) fail_msg("%s", err.msg);
    struct op_check_opts o = {.seed = 1, .training = training};
    uint64_t rng = 99;
    for (int k = 0; k < g->n_inputs; k++) {
        void *gen = inputs && inputs[k] ? NULL : make_input(&g->values[g->inputs[k]], &o, &rng);
        gp_cpu_runner_set_f32(r, g->inputs[k], gen ? gen : inputs[k]);
        free(gen);
    }
    struct gp_run_opts ro = run_opts(&o);
    if (gp_cpu_runner_forward_f32(r, &ro, 0, g->n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);
    for (int k = 0; k < g->n_outputs; k++) gp_cpu_runner_get_f32(r, g->outputs[k], outputs[k]);
    gp_cpu_runner_free_f32(r);
}
