#include "partitioner/profile.h"

#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/compute.h"
#include "backend/cpu/runner.h"
#include "graph/layers.h"
#include "pipeline/plan.h"
#include "util/json_parse.h"
#include "util/json_writer.h"
#include "util/atomic_file.h"

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double gp_profile_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Bandwidth of a frontier-sized copy, as a stage boundary would do it. */
static double measure_copy_gbps(void)
{
    size_t bytes = 16u << 20;
    char *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) {
        free(a);
        free(b);
        return 5.0;
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now_ms();
        memcpy(b, a, bytes);
        double t = now_ms() - t0;
        if (t < best) best = t;
    }
    volatile char sink = b[bytes - 1];
    (void)sink;
    free(a);
    free(b);
    return best > 0 ? (double)bytes / (best * 1e6) : 5.0;
}

/* Bytes of an activation as a stage stores it in that precision. */
static int64_t stored_bytes(const struct gp_value *v, enum gp_precision precision)
{
    if (precision == GP_PRECISION_BF16 && gp_dtype_is_float(v->dtype)) return gp_shape_numel(&v->shape) * 2;
    return gp_value_bytes(v);
}

static int64_t cut_bytes(const struct gp_graph *g, const struct gp_layers *l, int cut, enum gp_precision precision,
                         int *ids)
{
    int n = gp_layers_frontier(l, g, cut, ids);
    int64_t bytes = 0;
    for (int q = 0; q < n; q++) bytes += stored_bytes(&g->values[ids[q]], precision);
    return bytes;
}

/* What the profile takes from the model itself: the data input's rows, and
 * each layer's reads of parameters an earlier layer owns (float32 master
 * copies: 4 bytes an element in every precision). */
static void fill_from_model(const struct gp_graph *g, struct gp_profile *out)
{
    int input = gp_graph_data_input(g);
    out->input_bytes = input >= 0 ? gp_value_bytes(&g->values[input]) : 0;
    for (int i = 0; i < g->n_nodes; i++) {
        struct gp_layer_profile *lp = &out->layers[i];
        lp->tied_bytes = 0;
        lp->tied_prev = -1;
        const struct gp_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_inputs; k++) {
            int v = n->inputs[k], prev = -1;
            if (v < 0 || g->values[v].kind != GP_VALUE_PARAMETER) continue;
            bool again = false;
            for (int q = 0; q < k; q++) again |= n->inputs[q] == v;
            for (int j = 0; j < i && !again; j++)
                for (int q = 0; q < g->nodes[j].n_inputs; q++)
                    if (g->nodes[j].inputs[q] == v) prev = j;
            if (again || prev < 0) continue;
            lp->tied_bytes += gp_shape_numel(&g->values[v].shape) * 4;
            if (prev > lp->tied_prev) lp->tied_prev = prev;
        }
    }
}

/* gp_layer_profile.peak_bytes of node n: what its forward holds that no
 * backward keeps (its inputs and outputs not in kept[]), or what its
 * backward holds (the gradients of its outputs and activation inputs,
 * needs[]), the larger. */
static int64_t peak_bytes(const struct gp_graph *g, const struct gp_node *n, const bool *needs, const bool *kept,
                          enum gp_precision precision)
{
    int64_t fwd = 0, bwd = 0;
    for (int k = 0; k < n->n_outputs; k++) {
        int v = n->outputs[k];
        if (v < 0) continue;
        int64_t b = stored_bytes(&g->values[v], precision);
        if (!kept[v]) fwd += b;
        if (needs[v]) bwd += b;
    }
    for (int k = 0; k < n->n_inputs; k++) {
        int u = n->inputs[k];
        if (u < 0 || g->values[u].is_initializer) continue;
        int64_t b = stored_bytes(&g->values[u], precision);
        if (!kept[u]) fwd += b;
        if (needs[u]) bwd += b;
    }
    return fwd > bwd ? fwd : bwd;
}

void gp_profile_fill_bytes(const struct gp_graph *g, const struct gp_layers *l,
                           size_t (*saved_bytes)(const struct gp_graph *, const struct gp_node *),
                           enum gp_precision precision, struct gp_profile *out)
{
    snprintf(out->precision, sizeof out->precision, "%s", gp_precision_name(precision));
    int *ids = malloc(sizeof(int) * ((size_t)g->n_values + 1));
    /* Outputs no backward reads live only through the forward, in an
     * arena the layers share (pipeline/plan.h): not the layer's. Without
     * memory for the flags, every output counts (an upper bound). */
    bool *needs = calloc((size_t)g->n_values + 1, sizeof(bool)), *kept = calloc((size_t)g->n_values + 1, sizeof(bool));
    if (needs && kept) gp_plan_needs_grad(g, needs);
    if (needs && kept && !gp_plan_backward_kept(g, needs, saved_bytes, NULL, kept)) {
        free(kept);
        kept = NULL;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const struct gp_node *n = &g->nodes[i];
        struct gp_layer_profile *lp = &out->layers[i];
        snprintf(lp->op, sizeof lp->op, "%s", n->op_type);
        lp->param_bytes = l->layer_params[i] * 4;
        lp->activation_bytes = 0;
        for (int k = 0; k < n->n_outputs; k++) {
            int v = n->outputs[k];
            if (v >= 0 && (!kept || !needs || kept[v])) lp->activation_bytes += stored_bytes(&g->values[v], precision);
        }
        lp->activation_bytes += (int64_t)saved_bytes(g, n);
        lp->peak_bytes = kept && needs ? peak_bytes(g, n, needs, kept, precision) : 0;
        lp->frontier_bytes = ids ? cut_bytes(g, l, i + 1, precision, ids) : l->frontier_bytes[i + 1];
    }
    out->input_frontier_bytes = ids ? cut_bytes(g, l, 0, precision, ids) : l->frontier_bytes[0];
    free(ids);
    free(needs);
    free(kept);
    fill_from_model(g, out);
}

void gp_profile_remake(const struct gp_graph *g, size_t (*saved_bytes)(const struct gp_graph *, const struct gp_node *),
                       bool (*remakes)(const struct gp_graph *, const struct gp_node *), enum gp_precision precision,
                       struct gp_profile *prof)
{
    int nv = g->n_values;
    bool *needs = calloc((size_t)nv + 1, sizeof(bool)), *kept = calloc((size_t)nv + 1, sizeof(bool));
    bool *stays = calloc((size_t)nv + 1, sizeof(bool));
    if (needs && kept && stays) {
        gp_plan_needs_grad(g, needs);
        if (gp_plan_backward_kept(g, needs, saved_bytes, NULL, kept) &&
            gp_plan_backward_kept(g, needs, saved_bytes, remakes, stays))
            for (int i = 0; i < g->n_nodes && i < prof->n_layers; i++) {
                const struct gp_node *n = &g->nodes[i];
                struct gp_layer_profile *lp = &prof->layers[i];
                /* A remade output is forward-only now (its remake lives
                 * in the backward's block). */
                lp->peak_bytes = peak_bytes(g, n, needs, stays, precision);
                bool remade = false;
                for (int k = 0; k < n->n_outputs; k++) {
                    int v = n->outputs[k];
                    if (v < 0 || !kept[v] || stays[v]) continue;
                    lp->activation_bytes -= stored_bytes(&g->values[v], precision);
                    remade = true;
                }
                /* Remade in the backward: the layer's forward runs again there. */
                if (remade) lp->backward_ms += lp->forward_ms;
            }
    }
    free(needs);
    free(kept);
    free(stays);
}

gp_status gp_profile_cpu(const struct gp_graph *g, const char *model_name, int threads, int warmup,
                         int repeats,
                         void (*progress)(void *user, int done, int total), void *user,
                         struct gp_profile *out, struct gp_error *err)
{
    memset(out, 0, sizeof *out);
    if (repeats < 1) repeats = 1;
    int saved_threads = omp_get_max_threads();
    omp_set_num_threads(threads > 0 ? threads : 1);
    snprintf(out->model, sizeof out->model, "%s", model_name ? model_name : "");
    snprintf(out->device, sizeof out->device, "cpu");
    out->n_layers = g->n_nodes;
    out->layers = calloc((size_t)g->n_nodes + 1, sizeof *out->layers);
    double *samples = NULL;
    struct gp_layers l = {0};
    struct gp_cpu_runner *r = NULL;
    gp_status st = GP_OK;
    if (!out->layers) {
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory profiling");
        goto done;
    }
    if ((st = gp_layers_build(g, &l, err)) != GP_OK) goto done;
    if ((st = gp_cpu_runner_create_f32(g, false, &r, err)) != GP_OK) goto done;
    int input = gp_graph_data_input(g);
    out->micro_batch = input >= 0 ? g->values[input].shape.dims[0] : g->batch;
    /* Real-looking inputs: small floats, or token ids 0 (always in range). */
    if (input >= 0 && gp_dtype_is_float(g->values[input].dtype)) {
        float *x = gp_cpu_runner_data_f32(r, input);
        for (int64_t i = 0; i < gp_shape_numel(&g->values[input].shape); i++) x[i] = (float)((i * 7919) % 200 - 100) / 100.0f;
    }
    /* One whole pass fills every value with what that layer really sees;
     * the outputs' gradients are set to ones so backward has real work. */
    struct gp_run_opts ro = {.training = true, .update_state = false, .dropout_ratio = -1};
    if ((st = gp_cpu_runner_forward_f32(r, &ro, 0, g->n_nodes, err)) != GP_OK) goto done;
    gp_cpu_runner_zero_activation_grads_f32(r);
    for (int k = 0; k < g->n_outputs; k++) {
        float *dy = gp_cpu_runner_grad_f32(r, g->outputs[k]);
        for (int64_t i = 0; dy && i < gp_shape_numel(&g->values[g->outputs[k]].shape); i++) dy[i] = 1.0f / 64;
    }
    if ((st = gp_cpu_runner_backward_f32(r, &ro, 0, g->n_nodes, err)) != GP_OK) goto done;
    (void)samples;

    /* Layers are timed inside whole passes, forward in order and backward in
     * reverse, so each sees the caches a stage's sequential run leaves it
     * (a layer repeated alone would run hot and look faster than it is). */
    double *fwd = malloc(sizeof(double) * (size_t)g->n_nodes * (size_t)repeats + 1);
    double *bwd = malloc(sizeof(double) * (size_t)g->n_nodes * (size_t)repeats + 1);
    if (!fwd || !bwd) {
        free(fwd);
        free(bwd);
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory profiling");
        goto done;
    }
    for (int rep = 0; rep < warmup + repeats && st == GP_OK; rep++) {
        for (int i = 0; i < g->n_nodes && st == GP_OK; i++) {
            double t0 = now_ms();
            st = gp_cpu_runner_forward_f32(r, &ro, i, i + 1, err);
            if (rep >= warmup) fwd[(size_t)i * (size_t)repeats + (size_t)(rep - warmup)] = now_ms() - t0;
        }
        gp_cpu_runner_zero_activation_grads_f32(r);
        for (int k = 0; k < g->n_outputs; k++) {
            float *dy = gp_cpu_runner_grad_f32(r, g->outputs[k]);
            for (int64_t e = 0; dy && e < gp_shape_numel(&g->values[g->outputs[k]].shape); e++) dy[e] = 1.0f / 64;
        }
        for (int i = g->n_nodes - 1; i >= 0 && st == GP_OK; i--) {
            double t0 = now_ms();
            st = gp_cpu_runner_backward_f32(r, &ro, i, i + 1, err);
            if (rep >= warmup) bwd[(size_t)i * (size_t)repeats + (size_t)(rep - warmup)] = now_ms() - t0;
        }
        if (progress) progress(user, rep + 1, warmup + repeats);
    }
    gp_profile_fill_bytes(g, &l, gp_cpu_compute_ops.saved_bytes, GP_PRECISION_FP32, out);
    for (int i = 0; i < g->n_nodes && st == GP_OK; i++) {
        out->layers[i].forward_ms = gp_profile_median(fwd + (size_t)i * (size_t)repeats, repeats);
        out->layers[i].backward_ms = gp_profile_median(bwd + (size_t)i * (size_t)repeats, repeats);
    }
    free(fwd);
    free(bwd);
    if (st != GP_OK) goto done;
    out->copy_gbps = measure_copy_gbps();
done:
    omp_set_num_threads(saved_threads);
    free(samples);
    gp_cpu_runner_free_f32(r);
    gp_layers_free(&l);
    if (st != GP_OK) gp_profile_free(out);
    return st;
}

gp_status gp_profile_save(const struct gp_profile *p, const char *path, struct gp_error *err)
{
    struct gp_atomic_file file;
    GP_TRY(gp_atomic_create(&file, path, err));
    FILE *f = gp_atomic_stream(&file);
    if (!f) {
        gp_atomic_abort(&file);
        return gp_error_set(err, GP_ERR_IO, "cannot write '%s'", path);
    }
    struct gp_json j;
    gp_json_init(&j, f, true);
    gp_json_object_begin(&j);
    gp_json_key(&j, "format");
    gp_json_string(&j, "gpipe-onnx profile 1");
    gp_json_key(&j, "model");
    gp_json_string(&j, p->model);
    gp_json_key(&j, "device");
    gp_json_string(&j, p->device);
    gp_json_key(&j, "precision");
    gp_json_string(&j, p->precision[0] ? p->precision : "fp32");
    gp_json_key(&j, "fast_conv");
    gp_json_bool(&j, p->fast_conv);
    gp_json_key(&j, "micro_batch");
    gp_json_int(&j, p->micro_batch);
    gp_json_key(&j, "input_frontier_bytes");
    gp_json_int(&j, p->input_frontier_bytes);
    gp_json_key(&j, "copy_gbps");
    gp_json_double(&j, p->copy_gbps);
    gp_json_key(&j, "layers");
    gp_json_array_begin(&j);
    for (int i = 0; i < p->n_layers; i++) {
        const struct gp_layer_profile *l = &p->layers[i];
        gp_json_object_begin(&j);
        gp_json_key(&j, "index");
        gp_json_int(&j, i);
        gp_json_key(&j, "op");
        gp_json_string(&j, l->op);
        gp_json_key(&j, "forward_ms");
        gp_json_double(&j, l->forward_ms);
        gp_json_key(&j, "backward_ms");
        gp_json_double(&j, l->backward_ms);
        gp_json_key(&j, "param_bytes");
        gp_json_int(&j, l->param_bytes);
        gp_json_key(&j, "activation_bytes");
        gp_json_int(&j, l->activation_bytes);
        gp_json_key(&j, "frontier_bytes");
        gp_json_int(&j, l->frontier_bytes);
        gp_json_key(&j, "peak_bytes");
        gp_json_int(&j, l->peak_bytes);
        gp_json_object_end(&j);
    }
    gp_json_array_end(&j);
    gp_json_object_end(&j);
    gp_json_finish(&j);
    return gp_atomic_commit(&file, err);
}

static const struct gp_jvalue *field(const struct gp_jvalue *o, const char *key, enum gp_jtype t)
{
    const struct gp_jvalue *v = gp_jobject_get(o, key);
    return v && v->type == t ? v : NULL;
}

gp_status gp_profile_load(const char *path, const struct gp_graph *g, struct gp_profile *out,
                          struct gp_error *err)
{
    memset(out, 0, sizeof *out);
    struct gp_json_doc doc;
    GP_TRY(gp_json_parse_file(path, &doc, err));
    gp_status st = GP_OK;
    const struct gp_jvalue *root = doc.root, *layers = field(root, "layers", GP_JARRAY);
    const struct gp_jvalue *fmt = field(root, "format", GP_JSTRING);
    if (!fmt || strcmp(fmt->str, "gpipe-onnx profile 1") != 0 || !layers) {
        st = gp_error_set(err, GP_ERR_PARSE, "%s: not a gpipe-onnx profile", path);
        goto done;
    }
    if ((int)layers->count != g->n_nodes) {
        st = gp_error_set(err, GP_ERR_INVALID, "%s: profiles %zu layers but the model has %d", path,
                          layers->count, g->n_nodes);
        goto done;
    }
    out->n_layers = g->n_nodes;
    out->layers = calloc((size_t)g->n_nodes + 1, sizeof *out->layers);
    if (!out->layers) {
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory");
        goto done;
    }
    const struct gp_jvalue *v;
    snprintf(out->model, sizeof out->model, "%s", (v = field(root, "model", GP_JSTRING)) ? v->str : "");
    snprintf(out->device, sizeof out->device, "%s", (v = field(root, "device", GP_JSTRING)) ? v->str : "");
    /* Profiles written before precisions existed were float32. */
    snprintf(out->precision, sizeof out->precision, "%s",
             (v = field(root, "precision", GP_JSTRING)) ? v->str : "fp32");
    /* Profiles written before it were timed on the deterministic algorithms. */
    out->fast_conv = (v = field(root, "fast_conv", GP_JBOOL)) ? v->b : false;
    out->micro_batch = (v = field(root, "micro_batch", GP_JNUMBER)) ? v->i : 0;
    out->input_frontier_bytes = (v = field(root, "input_frontier_bytes", GP_JNUMBER)) ? v->i : 0;
    out->copy_gbps = (v = field(root, "copy_gbps", GP_JNUMBER)) ? v->num : 5.0;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct gp_jvalue *l = &layers->items[i];
        const struct gp_jvalue *op = field(l, "op", GP_JSTRING), *f = field(l, "forward_ms", GP_JNUMBER),
                               *b = field(l, "backward_ms", GP_JNUMBER);
        if (!op || !f || !b || f->num < 0 || b->num < 0) {
            st = gp_error_set(err, GP_ERR_PARSE, "%s: layer %d lacks op, forward_ms or backward_ms", path, i);
            goto done;
        }
        if (strcmp(op->str, g->nodes[i].op_type) != 0) {
            st = gp_error_set(err, GP_ERR_INVALID, "%s: layer %d is %s in the profile but %s in the model",
                              path, i, op->str, g->nodes[i].op_type);
            goto done;
        }
        struct gp_layer_profile *lp = &out->layers[i];
        snprintf(lp->op, sizeof lp->op, "%s", op->str);
        lp->forward_ms = f->num;
        lp->backward_ms = b->num;
        lp->param_bytes = (v = field(l, "param_bytes", GP_JNUMBER)) ? v->i : 0;
        lp->activation_bytes = (v = field(l, "activation_bytes", GP_JNUMBER)) ? v->i : 0;
        lp->frontier_bytes = (v = field(l, "frontier_bytes", GP_JNUMBER)) ? v->i : 0;
        /* Profiles saved before the field: 0, the sums alone. */
        lp->peak_bytes = (v = field(l, "peak_bytes", GP_JNUMBER)) ? v->i : 0;
    }
    if (st == GP_OK) fill_from_model(g, out);
done:
    gp_json_doc_free(&doc);
    if (st != GP_OK) gp_profile_free(out);
    return st;
}

void gp_profile_free(struct gp_profile *p)
{
    free(p->layers);
    memset(p, 0, sizeof *p);
}
