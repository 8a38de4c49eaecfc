/* The public API: contexts, errors, the loaded model, its layer list and
 * frontiers (include/gpipe_onnx.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/api.h"
#include "backend/backends.h"
#include "graph/exporter.h"
#include "graph/layout.h"
#include "onnx/load.h"
#include "util/atomic_file.h"
#include "util/cpu_cores.h"
#include "util/mapped.h"
#include "ops/registry.h"
#include "partitioner/profile.h"
#ifdef GP_HAVE_CUDA
#include "backend/cuda/device_query.h"
#endif

#ifndef GP_VERSION
#define GP_VERSION "unknown"
#endif

const char *gpo_version(void) { return GP_VERSION; }

const char *gpo_status_name(gpo_status status)
{
    switch (status) {
    case GPO_OK: return "GPO_OK";
    case GPO_ERR_IO: return "GPO_ERR_IO";
    case GPO_ERR_PARSE: return "GPO_ERR_PARSE";
    case GPO_ERR_UNSUPPORTED: return "GPO_ERR_UNSUPPORTED";
    case GPO_ERR_SHAPE: return "GPO_ERR_SHAPE";
    case GPO_ERR_INVALID: return "GPO_ERR_INVALID";
    case GPO_ERR_NOMEM: return "GPO_ERR_NOMEM";
    case GPO_ERR_DEVICE: return "GPO_ERR_DEVICE";
    case GPO_ERR_COMM: return "GPO_ERR_COMM";
    case GPO_ERR_ARGUMENT: return "GPO_ERR_ARGUMENT";
    }
    return "GPO_ERR_UNKNOWN";
}

void gpo_begin(gpo_model *m) { gp_error_clear(&m->err); }

gpo_status gpo_fail(gpo_model *m, gpo_status st, const char *fmt, ...)
{
    if (m->err.status != GP_OK) return st; /* the first message is closest to the cause */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err.msg, sizeof m->err.msg, fmt, ap);
    va_end(ap);
    m->err.status = st == GPO_ERR_ARGUMENT ? GP_ERR_INVALID : (gp_status)st;
    return st;
}

const char *gpo_last_error(const gpo_model *m) { return m ? m->err.msg : "out of memory"; }

void gpo_free(void *p) { free(p); }

void gpo_open_options_init(struct gpo_open_options *o)
{
    memset(o, 0, sizeof *o);
    o->batch = 1;
    o->fuse_attention = 1;
}

static void unload(gpo_model *m)
{
    if (!m->loaded) return;
    gp_layers_free(&m->layers);
    gp_graph_free(&m->g);
    free(m->ids);
    free(m->frontier_names);
    free(m->tied);
    free(m->tied_readers);
    m->ids = NULL;
    m->frontier_names = NULL;
    m->tied = NULL;
    m->tied_readers = NULL;
    m->n_tied = 0;
    m->loaded = false;
}

/* Parameters read by several layers, with their readers. */
static gpo_status find_tied(gpo_model *m)
{
    const struct gp_graph *g = &m->g;
    int *count = calloc((size_t)g->n_values + 1, sizeof *count);
    if (!count) return gpo_fail(m, GPO_ERR_NOMEM, "out of memory listing tied parameters");
    int total = 0;
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_inputs; k++) {
            int v = g->nodes[i].inputs[k];
            if (v < 0 || g->values[v].kind != GP_VALUE_PARAMETER) continue;
            bool again = false; /* a layer reading it twice counts once */
            for (int q = 0; q < k; q++) again |= g->nodes[i].inputs[q] == v;
            if (!again) count[v]++;
        }
    for (int v = 0; v < g->n_values; v++)
        if (count[v] > 1) {
            m->n_tied++;
            total += count[v];
        }
    m->tied = calloc((size_t)m->n_tied + 1, sizeof *m->tied);
    m->tied_readers = calloc((size_t)total + 1, sizeof *m->tied_readers);
    if (!m->tied || !m->tied_readers) {
        free(count);
        return gpo_fail(m, GPO_ERR_NOMEM, "out of memory listing tied parameters");
    }
    int t = 0, used = 0;
    for (int v = 0; v < g->n_values; v++) {
        if (count[v] < 2) continue;
        struct gpo_tied *td = &m->tied[t++];
        td->name = g->values[v].name;
        td->readers = m->tied_readers + used;
        for (int i = 0; i < g->n_nodes; i++) {
            bool reads = false;
            for (int k = 0; k < g->nodes[i].n_inputs; k++) reads |= g->nodes[i].inputs[k] == v;
            if (reads) m->tied_readers[used + td->n_readers++] = i;
        }
        used += td->n_readers;
    }
    free(count);
    return GPO_OK;
}

gpo_status gpo_reload(gpo_model *m)
{
    unload(m);
    gp_status st = gp_onnx_load(m->current, m->opts.batch, &m->g, &m->err);
    if (st != GP_OK) return gpo_status_of(st);
    st = gp_layers_build(&m->g, &m->layers, &m->err);
    if (st != GP_OK) {
        gp_graph_free(&m->g);
        return gpo_status_of(st);
    }
    m->loaded = true;
    if (m->opts.channels_last) gp_graph_channels_last(&m->g);
    if (!gp_graph_exporter_note(&m->g, m->note, sizeof m->note)) m->note[0] = '\0';
    m->ids = malloc(sizeof(int) * ((size_t)m->g.n_values + 1));
    m->frontier_names = malloc(sizeof(char *) * ((size_t)m->g.n_values + 1));
    if (!m->ids || !m->frontier_names) return gpo_fail(m, GPO_ERR_NOMEM, "out of memory loading '%s'", m->path);
    return find_tied(m);
}

gpo_status gpo_open(const char *path, const struct gpo_open_options *opts, gpo_model **out)
{
    gpo_model *m = calloc(1, sizeof *m);
    *out = m;
    if (!m) return GPO_ERR_NOMEM;
    if (opts) m->opts = *opts;
    else gpo_open_options_init(&m->opts);
    if (!path) return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_open: no model path");
    if (m->opts.batch < 1) return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_open: batch must be at least 1, not %lld",
                                           (long long)m->opts.batch);
    m->path = strdup(path);
    if (!m->path) return gpo_fail(m, GPO_ERR_NOMEM, "out of memory opening '%s'", path);
    m->current = m->path;
    /* The loader reads this switch from the environment (process-wide). */
    if (!m->opts.fuse_attention) setenv("GP_FUSE_ATTENTION", "0", 1);
    return gpo_reload(m);
}

void gpo_close(gpo_model *m)
{
    if (!m) return;
    unload(m);
    gpo_report_free(m);
    gpo_job_end(m); /* (MPI_Abort, no return, when this rank failed alone) */
    if (m->tmp) {
        unlink(m->tmp);
        free(m->tmp);
    }
    free(m->saved);
    free(m->path);
    free(m);
}

/* ---- what was loaded ---- */

static int count_kind(const struct gp_graph *g, enum gp_value_kind kind, int64_t *elems, int64_t *bytes)
{
    int n = 0;
    *elems = *bytes = 0;
    for (int i = 0; i < g->n_values; i++) {
        const struct gp_value *v = &g->values[i];
        if (v->kind != kind || !v->is_initializer) continue;
        n++;
        *elems += gp_shape_numel(&v->shape);
        *bytes += gp_value_bytes(v);
    }
    return n;
}

void gpo_model_info(const gpo_model *m, struct gpo_model_info *out)
{
    memset(out, 0, sizeof *out);
    if (!m || !m->loaded) return;
    const struct gp_graph *g = &m->g;
    out->path = m->path;
    out->producer_name = g->producer_name;
    out->producer_version = g->producer_version;
    out->ir_version = g->ir_version;
    out->opset = g->opset;
    out->batch = g->batch;
    out->n_inputs = g->n_inputs;
    out->n_outputs = g->n_outputs;
    out->parameter_tensors = count_kind(g, GP_VALUE_PARAMETER, &out->parameters, &out->parameter_bytes);
    out->buffer_tensors = count_kind(g, GP_VALUE_BUFFER, &out->buffers, &out->buffer_bytes);
    out->source_nodes = g->n_source_nodes;
    out->folded_nodes = g->n_folded;
    out->fused_nodes = g->n_fused;
    out->fusions = g->n_fusions;
    out->n_layers = g->n_nodes;
    out->input_frontier_bytes = m->layers.frontier_bytes[0];
    out->channels_last_activations = gp_graph_channels_last_count(g);
    out->n_tied = m->n_tied;
    out->export_note = m->note[0] ? m->note : NULL;
}

static void value_of(const struct gp_graph *g, int id, struct gpo_value *out)
{
    if (id < 0) {
        *out = (struct gpo_value){.name = "", .dtype = "", .rank = -1, .dims = NULL};
        return;
    }
    const struct gp_value *v = &g->values[id];
    *out = (struct gpo_value){.name = v->name, .dtype = gp_dtype_name(v->dtype), .rank = v->shape.rank,
                              .dims = v->shape.dims};
}

static gpo_status check_loaded(gpo_model *m, const char *fn)
{
    if (!m) return GPO_ERR_ARGUMENT;
    gpo_begin(m);
    if (!m->loaded) return gpo_fail(m, GPO_ERR_ARGUMENT, "%s: no model loaded", fn);
    return GPO_OK;
}

gpo_status gpo_input(gpo_model *m, int k, struct gpo_value *out)
{
    gpo_status st = check_loaded(m, "gpo_input");
    if (st != GPO_OK) return st;
    if (k < 0 || k >= m->g.n_inputs)
        return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_input: input %d of %d", k, m->g.n_inputs);
    value_of(&m->g, m->g.inputs[k], out);
    return GPO_OK;
}

gpo_status gpo_output(gpo_model *m, int k, struct gpo_value *out)
{
    gpo_status st = check_loaded(m, "gpo_output");
    if (st != GPO_OK) return st;
    if (k < 0 || k >= m->g.n_outputs)
        return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_output: output %d of %d", k, m->g.n_outputs);
    value_of(&m->g, m->g.outputs[k], out);
    return GPO_OK;
}

const char *gpo_folded_op(const gpo_model *m, int k)
{
    if (!m || !m->loaded || k < 0 || k >= m->g.n_folded) return NULL;
    return m->g.folded[k].op_type;
}

gpo_status gpo_tied(gpo_model *m, int k, struct gpo_tied *out)
{
    gpo_status st = check_loaded(m, "gpo_tied");
    if (st != GPO_OK) return st;
    if (k < 0 || k >= m->n_tied) return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_tied: %d of %d", k, m->n_tied);
    *out = m->tied[k];
    return GPO_OK;
}

/* ---- layers and frontiers ---- */

int gpo_layer_count(const gpo_model *m) { return m && m->loaded ? m->g.n_nodes : 0; }

gpo_status gpo_layer(gpo_model *m, int i, struct gpo_layer *out)
{
    gpo_status st = check_loaded(m, "gpo_layer");
    if (st != GPO_OK) return st;
    if (i < 0 || i >= m->g.n_nodes)
        return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_layer: layer %d of %d", i, m->g.n_nodes);
    const struct gp_node *n = &m->g.nodes[i];
    *out = (struct gpo_layer){
        .index = i, .op = n->op_type, .domain = n->domain, .since_version = n->def ? n->def->since_version : 0,
        .fused_relu = n->fused_relu, .trans_b = n->trans_b, .name = n->name, .n_inputs = n->n_inputs, .n_outputs = n->n_outputs,
        .params = m->layers.layer_params[i], .frontier_bytes = m->layers.frontier_bytes[i + 1],
        .frontier_count = m->layers.frontier_count[i + 1],
        .channels_last = n->n_outputs > 0 && n->outputs[0] >= 0 && m->g.values[n->outputs[0]].channels_last,
        .packed_qkv = n->packed_qkv, .fused_bias = n->fused_bias, .fused_add = n->fused_add};
    return GPO_OK;
}

int gpo_layer_layout_note(const gpo_model *m, int i, char *buf, size_t size)
{
    if (!m || !m->loaded || !m->opts.channels_last || i < 0 || i >= m->g.n_nodes || !buf || size == 0) return 0;
    const struct gp_node *n = &m->g.nodes[i];
    return n->n_outputs > 0 && gp_layout_why_not(&m->g, n->outputs[0], buf, size);
}

const char *gpo_layer_input(const gpo_model *m, int i, int k)
{
    if (!m || !m->loaded || i < 0 || i >= m->g.n_nodes || k < 0 || k >= m->g.nodes[i].n_inputs) return NULL;
    int v = m->g.nodes[i].inputs[k];
    return v >= 0 ? m->g.values[v].name : "";
}

gpo_status gpo_layer_output(gpo_model *m, int i, int k, struct gpo_value *out)
{
    gpo_status st = check_loaded(m, "gpo_layer_output");
    if (st != GPO_OK) return st;
    if (i < 0 || i >= m->g.n_nodes || k < 0 || k >= m->g.nodes[i].n_outputs)
        return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_layer_output: output %d of layer %d", k, i);
    value_of(&m->g, m->g.nodes[i].outputs[k], out);
    return GPO_OK;
}

int64_t gpo_frontier_bytes(const gpo_model *m, int cut)
{
    if (!m || !m->loaded || cut < 0 || cut > m->g.n_nodes) return -1;
    return m->layers.frontier_bytes[cut];
}

int gpo_frontier(gpo_model *m, int cut, const char **names, int cap)
{
    if (!m || !m->loaded || cut < 0 || cut > m->g.n_nodes) return -1;
    int n = gp_layers_frontier(&m->layers, &m->g, cut, m->ids);
    for (int k = 0; k < n && k < cap; k++) names[k] = m->g.values[m->ids[k]].name;
    return n;
}

/* ---- shared helpers ---- */

int gpo_devices_parse(const char *list, struct gpo_device *out, int max, char *errbuf, size_t errsize)
{
    struct gp_error err = {0};
    bool cuda[GPO_MAX_STAGES];
    int index[GPO_MAX_STAGES], n = 0;
    if (max > GPO_MAX_STAGES) max = GPO_MAX_STAGES;
    if (!out || max < 1 || gp_device_list_parse(list, max, &n, cuda, index, &err) != GP_OK) {
        if (errbuf && errsize) snprintf(errbuf, errsize, "%s", err.msg[0] ? err.msg : "no room for the devices");
        return -1;
    }
    for (int k = 0; k < n; k++) out[k] = (struct gpo_device){.cuda = cuda[k], .index = index[k]};
    return n;
}

const char *gpo_devices_format(const struct gpo_device *d, int n, char *buf, size_t size)
{
    if (!buf || !size) return buf;
    buf[0] = '\0';
    size_t len = 0;
    for (int k = 0; k < n && len < size; k++)
        len += (size_t)snprintf(buf + len, size - len, "%s%s:%d", k ? "," : "", d[k].cuda ? "cuda" : "cpu",
                                d[k].index);
    return buf;
}

const char *gpo_stage_devices(int n, const bool *cuda, const int *index, char *buf, size_t size)
{
    struct gpo_device d[GPO_MAX_STAGES];
    if (n > GPO_MAX_STAGES) n = GPO_MAX_STAGES;
    for (int k = 0; k < n; k++) d[k] = (struct gpo_device){.cuda = cuda[k], .index = index[k]};
    return gpo_devices_format(d, n, buf, size);
}

void gpo_train_balance_options(const struct gpo_train_config *cfg, const struct gpo_train_callbacks *cb,
                               const char *devices, int64_t batch, const char *by, struct gpo_balance_options *bo)
{
    gpo_balance_options_init(bo);
    bo->devices = devices;
    bo->by = !strcmp(by, "time") ? GPO_BALANCE_TIME : GPO_BALANCE_MEMORY;
    bo->batch = batch;
    bo->chunks = (int)cfg->chunks;
    bo->checkpoint = cfg->checkpoint;
    bo->schedule = cfg->pipeline_schedule;
    bo->optimizer = cfg->optimizer;
    bo->momentum = cfg->momentum;
    bo->precision = cfg->precision;
    bo->layout = cfg->layout;
    bo->fast_conv = cfg->fast_conv;
    bo->recompute_norm = cfg->recompute_norm == GPO_RECOMPUTE_ALWAYS;
    bo->progress = cb ? cb->on_profile : NULL;
    bo->measure = cb ? cb->on_measure : NULL;
    bo->user = cb ? cb->user : NULL;
}

const char *gpo_mapped_file(const void *addr) { return gp_mapped_find(addr); }

gpo_status gpo_parse_devices(gpo_model *m, const char *list, int *n_out, bool *cuda, int *index)
{
    struct gp_error err = {0};
    if (gp_device_list_parse(list, GPO_MAX_STAGES, n_out, cuda, index, &err) != GP_OK)
        return gpo_fail(m, GPO_ERR_ARGUMENT, "%s", err.msg);
    return GPO_OK;
}

int gpo_gpu_count(void)
{
#ifdef GP_HAVE_CUDA
    /* No context: a rank of a job across processes counts before it picks
     * its GPU, and a context on GPU 0 (hundreds of MiB) in every rank would
     * take the memory of the rank computing there. */
    return gp_cuda_device_count();
#else
    return 0;
#endif
}

enum gp_precision gpo_precision_of(enum gpo_precision p)
{
    return p == GPO_PRECISION_BF16 ? GP_PRECISION_BF16 : p == GPO_PRECISION_TF32 ? GP_PRECISION_TF32 : GP_PRECISION_FP32;
}

enum gp_layout_policy gpo_layout_of(enum gpo_layout l)
{
    return l == GPO_LAYOUT_NCHW ? GP_LAYOUT_NCHW : l == GPO_LAYOUT_NHWC ? GP_LAYOUT_NHWC : GP_LAYOUT_AUTO;
}

enum gp_checkpoint gpo_checkpoint_of(enum gpo_checkpoint c)
{
    return c == GPO_CHECKPOINT_ALWAYS ? GP_CHECKPOINT_ALWAYS
           : c == GPO_CHECKPOINT_NEVER ? GP_CHECKPOINT_NEVER
                                       : GP_CHECKPOINT_EXCEPT_LAST;
}

enum gp_pipe_schedule_kind gpo_schedule_of(enum gpo_pipeline_schedule s)
{
    return s == GPO_PIPELINE_1F1B ? GP_PIPE_1F1B : GP_PIPE_GPIPE;
}

int gpo_precision_parse(const char *name, enum gpo_precision *out)
{
    enum gp_precision p;
    if (!name || !gp_precision_parse(name, &p)) return 0;
    *out = p == GP_PRECISION_BF16 ? GPO_PRECISION_BF16 : p == GP_PRECISION_TF32 ? GPO_PRECISION_TF32 : GPO_PRECISION_FP32;
    return 1;
}

int gpo_layout_parse(const char *name, enum gpo_layout *out)
{
    enum gp_layout_policy l;
    if (!name || !gp_layout_policy_parse(name, &l)) return 0;
    *out = l == GP_LAYOUT_NCHW ? GPO_LAYOUT_NCHW : l == GP_LAYOUT_NHWC ? GPO_LAYOUT_NHWC : GPO_LAYOUT_AUTO;
    return 1;
}

int gpo_checkpoint_parse(const char *name, enum gpo_checkpoint *out)
{
    if (!name) return 0;
    if (!strcmp(name, "always")) *out = GPO_CHECKPOINT_ALWAYS;
    else if (!strcmp(name, "except_last")) *out = GPO_CHECKPOINT_EXCEPT_LAST;
    else if (!strcmp(name, "never")) *out = GPO_CHECKPOINT_NEVER;
    else return 0;
    return 1;
}

int gpo_pipeline_schedule_parse(const char *name, enum gpo_pipeline_schedule *out)
{
    enum gp_pipe_schedule_kind k;
    if (!name || !gp_pipe_schedule_parse(name, &k)) return 0;
    *out = k == GP_PIPE_1F1B ? GPO_PIPELINE_1F1B : GPO_PIPELINE_GPIPE;
    return 1;
}

const char *gpo_checkpoint_name(enum gpo_checkpoint c) { return gp_checkpoint_name(gpo_checkpoint_of(c)); }

const char *gpo_pipeline_schedule_name(enum gpo_pipeline_schedule s)
{
    return gp_pipe_schedule_name(gpo_schedule_of(s));
}

gpo_status gpo_check_output(gpo_model *m, const char *path)
{
    if (!m) return GPO_ERR_ARGUMENT;
    gpo_begin(m);
    if (!path) return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_check_output: no path");
    return gpo_status_of(gp_atomic_check(path, &m->err));
}

const char *gpo_metadata(const gpo_model *m, const char *key)
{
    if (!m || !m->loaded || !key) return NULL;
    return gp_graph_metadata(&m->g, key);
}

void gpo_system_info(struct gpo_system *out)
{
    memset(out, 0, sizeof *out);
    out->cpu_cores = gp_cpu_cores();
#ifdef GP_HAVE_CUDA
    out->cuda = 1;
    struct gp_error err = {0};
    struct gp_cuda_versions v = {0};
    if (gp_cuda_versions(&v, &err) == GP_OK) {
        out->cuda_runtime = v.runtime;
        out->cuda_driver = v.driver;
        out->cublas = v.cublas;
        out->cudnn = (int64_t)v.cudnn;
    }
#endif
}

int gpo_gpus(struct gpo_gpu *out, int max, char *errbuf, size_t errsize)
{
    if (errbuf && errsize) errbuf[0] = '\0';
#ifdef GP_HAVE_CUDA
    struct gp_error err = {0};
    int count = 0, room = max > 0 ? max : 0;
    struct gp_cuda_device *devs = calloc((size_t)room + 1, sizeof *devs);
    if (!devs) {
        if (errbuf && errsize) snprintf(errbuf, errsize, "out of memory listing GPUs");
        return -1;
    }
    if (gp_cuda_devices(devs, room, &count, &err) != GP_OK) {
        if (errbuf && errsize) snprintf(errbuf, errsize, "%s", err.msg);
        free(devs);
        return -1;
    }
    for (int i = 0; i < count && i < room; i++) {
        memset(&out[i], 0, sizeof out[i]);
        snprintf(out[i].name, sizeof out[i].name, "%s", devs[i].name);
        out[i].major = devs[i].major;
        out[i].minor = devs[i].minor;
        out[i].multiprocessors = devs[i].multiprocessors;
        out[i].total_bytes = (int64_t)devs[i].total_bytes;
        out[i].free_bytes = (int64_t)devs[i].free_bytes;
    }
    free(devs);
    return count;
#else
    (void)out;
    (void)max;
    return 0;
#endif
}
