#include "backend/cpu/runner.h"

#include <stdlib.h>
#include <string.h>

struct gp_cpu_runner {
    const struct gp_graph *g;
    unsigned char *block;
    size_t bytes;
    size_t *data_off;  /* per value: offset of its data (SIZE_MAX: none) */
    size_t *grad_off;  /* per value: offset of its gradient (SIZE_MAX: none) */
    const struct gp_cpu_kernel **kernels; /* per layer */
    size_t *saved_off, *scratch_off;      /* per layer */
    /* Per-layer argument arrays, prepared once. */
    void ***in, ***out;
    real ***din, ***dout;
};

#define NONE SIZE_MAX

static size_t elem_size(const struct gp_value *v)
{
    return gp_dtype_is_float(v->dtype) ? sizeof(real) : gp_dtype_size(v->dtype);
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

void *GP_CPU(gp_cpu_runner_data)(struct gp_cpu_runner *r, int id)
{
    return r->data_off[id] == NONE ? NULL : r->block + r->data_off[id];
}

real *GP_CPU(gp_cpu_runner_grad)(struct gp_cpu_runner *r, int id)
{
    return r->grad_off[id] == NONE ? NULL : (real *)(r->block + r->grad_off[id]);
}

size_t GP_CPU(gp_cpu_runner_bytes)(const struct gp_cpu_runner *r) { return r->bytes; }

void GP_CPU(gp_cpu_runner_free)(struct gp_cpu_runner *r)
{
    if (!r) return;
    int n = r->g->n_nodes;
    for (int i = 0; i < n; i++) {
        if (r->in) free(r->in[i]);
        if (r->out) free(r->out[i]);
        if (r->din) free(r->din[i]);
        if (r->dout) free(r->dout[i]);
    }
    free(r->in);
    free(r->out);
    free(r->din);
    free(r->dout);
    free(r->block);
    free(r->data_off);
    free(r->grad_off);
    free(r->kernels);
    free(r->saved_off);
    free(r->scratch_off);
    free(r);
}

void GP_CPU(gp_cpu_runner_set)(struct gp_cpu_runner *r, int id, const void *data)
{
    const struct gp_value *v = &r->g->values[id];
    void *dst = GP_CPU(gp_cpu_runner_data)(r, id);
    int64_t n = gp_shape_numel(&v->shape);
    if (!dst) return;
    if (gp_dtype_is_float(v->dtype)) {
        /* Convert from the graph's stored dtype through the tensor accessors. */
        struct gp_tensor t = {.dtype = v->dtype, .shape = v->shape, .data = (void *)data};
        for (int64_t i = 0; i < n; i++) ((real *)dst)[i] = (real)gp_tensor_get_f64(&t, i);
    } else {
        memcpy(dst, data, (size_t)n * gp_dtype_size(v->dtype));
    }
}

void GP_CPU(gp_cpu_runner_get)(struct gp_cpu_runner *r, int id, void *data)
{
    const struct gp_value *v = &r->g->values[id];
    const void *src = GP_CPU(gp_cpu_runner_data)(r, id);
    int64_t n = gp_shape_numel(&v->shape);
    if (!src) return;
    if (gp_dtype_is_float(v->dtype)) {
        struct gp_tensor t = {.dtype = v->dtype, .shape = v->shape, .data = data};
        for (int64_t i = 0; i < n; i++) gp_tensor_set_f64(&t, i, (double)((const real *)src)[i]);
    } else {
        memcpy(data, src, (size_t)n * gp_dtype_size(v->dtype));
    }
}

/* Which values carry gradients: float parameters, float graph inputs when
 * asked, and every float output of a node with such an input through a
 * differentiable slot. */
static void mark_grads(const struct gp_graph *g, bool grad_inputs, bool *needs)
{
    for (int v = 0; v < g->n_values; v++) {
        const struct gp_value *val = &g->values[v];
        needs[v] = gp_dtype_is_float(val->dtype) &&
                   (val->kind == GP_VALUE_PARAMETER || (grad_inputs && val->kind == GP_VALUE_INPUT));
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const struct gp_node *n = &g->nodes[i];
        bool any = false;
        for (int k = 0; k < n->n_inputs; k++) {
            int v = n->inputs[k];
            if (v >= 0 && needs[v] && !(k < 32 && (n->def->nondiff_inputs >> k) & 1)) any = true;
        }
        if (!any) continue;
        for (int k = 0; k < n->n_outputs; k++) {
            int v = n->outputs[k];
            if (v >= 0 && gp_dtype_is_float(g->values[v].dtype)) needs[v] = true;
        }
    }
}

gp_status GP_CPU(gp_cpu_runner_create)(const struct gp_graph *g, bool grad_inputs,
                                       struct gp_cpu_runner **out, struct gp_error *err)
{
    *out = NULL;
    struct gp_cpu_runner *r = calloc(1, sizeof *r);
    if (!r) return gp_error_set(err, GP_ERR_NOMEM, "out of memory planning the CPU runner");
    r->g = g;
    int nv = g->n_values, nn = g->n_nodes;
    r->data_off = malloc(sizeof(size_t) * ((size_t)nv + 1));
    r->grad_off = malloc(sizeof(size_t) * ((size_t)nv + 1));
    r->kernels = calloc((size_t)nn + 1, sizeof *r->kernels);
    r->saved_off = calloc((size_t)nn + 1, sizeof(size_t));
    r->scratch_off = calloc((size_t)nn + 1, sizeof(size_t));
    r->in = calloc((size_t)nn + 1, sizeof *r->in);
    r->out = calloc((size_t)nn + 1, sizeof *r->out);
    r->din = calloc((size_t)nn + 1, sizeof *r->din);
    r->dout = calloc((size_t)nn + 1, sizeof *r->dout);
    bool *needs = calloc((size_t)nv + 1, sizeof(bool));
    gp_status st = GP_OK;
    if (!r->data_off || !r->grad_off || !r->kernels || !r->saved_off || !r->scratch_off ||
        !r->in || !r->out || !r->din || !r->dout || !needs) {
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory planning the CPU runner");
        goto fail;
    }
    mark_grads(g, grad_inputs, needs);

    /* Every missing kernel is named at once, as unsupported ops are. */
    char missing[1024] = "";
    size_t used = 0;
    for (int i = 0; i < nn; i++) {
        const struct gp_node *n = &g->nodes[i];
        r->kernels[i] = GP_CPU(gp_cpu_kernel_for)(n);
        bool wants_grad = false;
        for (int k = 0; k < n->n_inputs; k++)
            if (n->inputs[k] >= 0 && needs[n->inputs[k]] && !(k < 32 && (n->def->nondiff_inputs >> k) & 1))
                wants_grad = true;
        const char *why = !r->kernels[i] ? "no CPU kernel"
                          : wants_grad && !r->kernels[i]->backward ? "no CPU gradient" : NULL;
        if (!why) continue;
        int w = snprintf(missing + used, sizeof missing - used, "%s%s '%s' (%s)", used ? ", " : "",
                         n->op_type, n->name, why);
        if (w > 0 && (size_t)w < sizeof missing - used) used += (size_t)w;
    }
    if (used) {
        st = gp_error_set(err, GP_ERR_UNSUPPORTED, "cannot run on the CPU: %s", missing);
        goto fail;
    }

    size_t off = 0;
    for (int v = 0; v < nv; v++) {
        const struct gp_value *val = &g->values[v];
        /* Every value with a shape gets a buffer, folded constants too
         * (running nodes read them; they are small). */
        r->data_off[v] = NONE;
        r->grad_off[v] = NONE;
        if (!val->has_shape) continue;
        r->data_off[v] = off;
        off += align64((size_t)gp_shape_numel(&val->shape) * elem_size(val));
        if (needs[v]) {
            r->grad_off[v] = off;
            off += align64((size_t)gp_shape_numel(&val->shape) * sizeof(real));
        }
    }
    /* Layers run one at a time, so they share one scratch area sized for
     * the largest; saved state lives until backward, so each has its own. */
    size_t scratch_max = 0;
    for (int i = 0; i < nn; i++) {
        const struct gp_cpu_kernel *k = r->kernels[i];
        size_t saved = k->saved_bytes ? k->saved_bytes(g, &g->nodes[i]) : 0;
        size_t scratch = k->scratch_bytes ? k->scratch_bytes(g, &g->nodes[i]) : 0;
        r->saved_off[i] = off;
        off += align64(saved);
        if (scratch > scratch_max) scratch_max = scratch;
    }
    for (int i = 0; i < nn; i++) r->scratch_off[i] = off;
    off += align64(scratch_max);
    r->bytes = off;
    r->block = aligned_alloc(64, align64(off ? off : 64));
    if (!r->block) {
        char a[64];
        snprintf(a, sizeof a, "%zu", off);
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory: the CPU runner needs %s bytes", a);
        goto fail;
    }
    memset(r->block, 0, align64(off ? off : 64));
    for (int v = 0; v < nv; v++)
        if (g->values[v].constant && r->data_off[v] != NONE)
            GP_CPU(gp_cpu_runner_set)(r, v, g->values[v].constant->data);

    for (int i = 0; i < nn; i++) {
        const struct gp_node *n = &g->nodes[i];
        r->in[i] = calloc((size_t)n->n_inputs + 1, sizeof(void *));
        r->din[i] = calloc((size_t)n->n_inputs + 1, sizeof(real *));
        r->out[i] = calloc((size_t)n->n_outputs + 1, sizeof(void *));
        r->dout[i] = calloc((size_t)n->n_outputs + 1, sizeof(real *));
        if (!r->in[i] || !r->din[i] || !r->out[i] || !r->dout[i]) {
            st = gp_error_set(err, GP_ERR_NOMEM, "out of memory planning the CPU runner");
            goto fail;
        }
        for (int k = 0; k < n->n_inputs; k++) {
            int v = n->inputs[k];
            if (v < 0) continue;
            r->in[i][k] = GP_CPU(gp_cpu_runner_data)(r, v);
            if (!(k < 32 && (n->def->nondiff_inputs >> k) & 1)) r->din[i][k] = GP_CPU(gp_cpu_runner_grad)(r, v);
        }
        for (int k = 0; k < n->n_outputs; k++) {
            int v = n->outputs[k];
            if (v < 0) continue;
            r->out[i][k] = GP_CPU(gp_cpu_runner_data)(r, v);
            r->dout[i][k] = GP_CPU(gp_cpu_runner_grad)(r, v);
        }
    }
    free(needs);
    *out = r;
    return GP_OK;
fail:
    free(needs);
    GP_CPU(gp_cpu_runner_free)(r);
    return st;
}

static struct gp_cpu_ctx make_ctx(struct gp_cpu_runner *r, int i, const struct gp_run_opts *o)
{
    return (struct gp_cpu_ctx){
        .graph = r->g,
        .node = &r->g->nodes[i],
        .in = r->in[i],
        .out = r->out[i],
        .din = r->din[i],
        .dout = r->dout[i],
        .saved = r->block + r->saved_off[i],
        .scratch = r->block + r->scratch_off[i],
        .training = o->training,
        .update_state = o->update_state,
        .seed = o->seed,
        .step = o->step,
        .sample_offset = o->sample_offset,
        .dropout_ratio = o->dropout_ratio,
    };
}

gp_status GP_CPU(gp_cpu_runner_forward)(struct gp_cpu_runner *r, const struct gp_run_opts *o,
                                        int first, int last, struct gp_error *err)
{
    for (int i = first; i < last; i++) {
        struct gp_cpu_ctx c = make_ctx(r, i, o);
        GP_TRY(r->kernels[i]->forward(&c, err));
    }
    return GP_OK;
}

void GP_CPU(gp_cpu_runner_zero_activation_grads)(struct gp_cpu_runner *r)
{
    for (int v = 0; v < r->g->n_values; v++)
        if (r->grad_off[v] != NONE && r->g->values[v].kind != GP_VALUE_PARAMETER)
            memset(r->block + r->grad_off[v], 0,
                   (size_t)gp_shape_numel(&r->g->values[v].shape) * sizeof(real));
}

void GP_CPU(gp_cpu_runner_zero_param_grads)(struct gp_cpu_runner *r)
{
    for (int v = 0; v < r->g->n_values; v++)
        if (r->grad_off[v] != NONE && r->g->values[v].kind == GP_VALUE_PARAMETER)
            memset(r->block + r->grad_off[v], 0,
                   (size_t)gp_shape_numel(&r->g->values[v].shape) * sizeof(real));
}

gp_status GP_CPU(gp_cpu_runner_backward)(struct gp_cpu_runner *r, const struct gp_run_opts *o,
                                         int first, int last, struct gp_error *err)
{
    for (int i = last - 1; i >= first; i--) {
        const struct gp_node *n = &r->g->nodes[i];
        bool any_out = false, any_in = false;
        for (int k = 0; k < n->n_outputs; k++) any_out |= r->dout[i][k] != NULL;
        for (int k = 0; k < n->n_inputs; k++) any_in |= r->din[i][k] != NULL;
        if (!any_out || !any_in) continue;
        struct gp_cpu_ctx c = make_ctx(r, i, o);
        GP_TRY(r->kernels[i]->backward(&c, err));
    }
    return GP_OK;
}
