/* The public API's model summary as JSON (gpo_model_json): the summary
 * and the sequential layer list, what `gpipe-onnx inspect --json` prints,
 * written from the public calls alone through the JSON writer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "util/json_writer.h"

static void json_shape(struct gp_json *j, const struct gpo_value *v)
{
    gp_json_array_begin(j);
    for (int i = 0; i < v->rank; i++) gp_json_int(j, v->dims[i]);
    gp_json_array_end(j);
}

typedef gpo_status (*value_fn)(gpo_model *m, int k, struct gpo_value *out);

static void json_value_list(struct gp_json *j, gpo_model *m, value_fn get, int n)
{
    gp_json_array_begin(j);
    for (int i = 0; i < n; i++) {
        struct gpo_value v;
        if (get(m, i, &v) != GPO_OK) continue;
        gp_json_object_begin(j);
        gp_json_key(j, "name");
        gp_json_string(j, v.name);
        gp_json_key(j, "dtype");
        gp_json_string(j, v.dtype);
        gp_json_key(j, "shape");
        json_shape(j, &v);
        gp_json_object_end(j);
    }
    gp_json_array_end(j);
}

/* Folded nodes counted per op type, in order of first appearance. */
struct op_tally {
    const char *op;
    int count;
};

static int tally_folded(const gpo_model *m, int n_folded, struct op_tally *t)
{
    int n = 0;
    for (int i = 0; i < n_folded; i++) {
        const char *op = gpo_folded_op(m, i);
        int k = 0;
        while (k < n && strcmp(t[k].op, op) != 0) k++;
        if (k == n) t[n++] = (struct op_tally){op, 0};
        t[k].count++;
    }
    return n;
}

static void write_json(FILE *f, gpo_model *m, const struct gpo_model_info *info, const char *path, bool nhwc)
{
    struct gp_json j;
    gp_json_init(&j, f, true);
    gp_json_object_begin(&j);
    gp_json_key(&j, "model");
    gp_json_string(&j, path);
    gp_json_key(&j, "producer_name");
    gp_json_string(&j, info->producer_name);
    gp_json_key(&j, "producer_version");
    gp_json_string(&j, info->producer_version);
    gp_json_key(&j, "export_note"); /* null for most models */
    if (info->export_note) gp_json_string(&j, info->export_note);
    else gp_json_null(&j);
    gp_json_key(&j, "ir_version");
    gp_json_int(&j, info->ir_version);
    gp_json_key(&j, "opset");
    gp_json_int(&j, info->opset);
    gp_json_key(&j, "batch");
    gp_json_int(&j, info->batch);
    gp_json_key(&j, "inputs");
    json_value_list(&j, m, gpo_input, info->n_inputs);
    gp_json_key(&j, "outputs");
    json_value_list(&j, m, gpo_output, info->n_outputs);
    gp_json_key(&j, "parameters");
    gp_json_int(&j, info->parameters);
    gp_json_key(&j, "parameter_bytes");
    gp_json_int(&j, info->parameter_bytes);
    gp_json_key(&j, "parameter_tensors");
    gp_json_int(&j, info->parameter_tensors);
    gp_json_key(&j, "buffers");
    gp_json_int(&j, info->buffers);
    gp_json_key(&j, "buffer_tensors");
    gp_json_int(&j, info->buffer_tensors);
    gp_json_key(&j, "source_nodes");
    gp_json_int(&j, info->source_nodes);
    gp_json_key(&j, "folded_nodes");
    gp_json_int(&j, info->folded_nodes);
    gp_json_key(&j, "fused_nodes");
    gp_json_int(&j, info->fused_nodes);
    struct op_tally *t = calloc((size_t)info->folded_nodes + 1, sizeof *t);
    int nt = t ? tally_folded(m, info->folded_nodes, t) : 0;
    gp_json_key(&j, "folded_ops");
    gp_json_object_begin(&j);
    for (int i = 0; i < nt; i++) {
        gp_json_key(&j, t[i].op);
        gp_json_int(&j, t[i].count);
    }
    gp_json_object_end(&j);
    free(t);
    gp_json_key(&j, "input_frontier_bytes");
    gp_json_int(&j, info->input_frontier_bytes);
    gp_json_key(&j, "layout");
    gp_json_string(&j, nhwc ? "nhwc" : "nchw");
    gp_json_key(&j, "channels_last_activations");
    gp_json_int(&j, info->channels_last_activations);

    const char **names = NULL;
    int names_cap = 0;
    gp_json_key(&j, "layers");
    gp_json_array_begin(&j);
    for (int i = 0; i < info->n_layers; i++) {
        struct gpo_layer l;
        if (gpo_layer(m, i, &l) != GPO_OK) break;
        gp_json_object_begin(&j);
        gp_json_key(&j, "index");
        gp_json_int(&j, i);
        gp_json_key(&j, "op");
        gp_json_string(&j, l.op);
        if (l.fused_relu || l.fused_add) {
            gp_json_key(&j, "fused");
            gp_json_string(&j, !l.fused_add ? "Relu" : l.fused_relu ? "Add+Relu" : "Add");
        }
        if (l.trans_b) {
            gp_json_key(&j, "transposed_b");
            gp_json_bool(&j, true);
        }
        if (l.packed_qkv) {
            gp_json_key(&j, "packed_qkv");
            gp_json_bool(&j, true);
        }
        if (l.fused_bias) {
            gp_json_key(&j, "fused_bias");
            gp_json_bool(&j, true);
        }
        gp_json_key(&j, "domain");
        gp_json_string(&j, l.domain);
        gp_json_key(&j, "since_version");
        gp_json_int(&j, l.since_version);
        gp_json_key(&j, "name");
        gp_json_string(&j, l.name);
        gp_json_key(&j, "inputs");
        gp_json_array_begin(&j);
        for (int k = 0; k < l.n_inputs; k++) gp_json_string(&j, gpo_layer_input(m, i, k));
        gp_json_array_end(&j);
        struct gpo_value out[16];
        int n_out = l.n_outputs < 16 ? l.n_outputs : 16;
        for (int k = 0; k < n_out; k++) gpo_layer_output(m, i, k, &out[k]);
        gp_json_key(&j, "outputs");
        gp_json_array_begin(&j);
        for (int k = 0; k < n_out; k++) gp_json_string(&j, out[k].name);
        gp_json_array_end(&j);
        gp_json_key(&j, "output_shapes");
        gp_json_array_begin(&j);
        for (int k = 0; k < n_out; k++) {
            if (out[k].rank < 0) gp_json_null(&j);
            else json_shape(&j, &out[k]);
        }
        gp_json_array_end(&j);
        gp_json_key(&j, "output_dtypes");
        gp_json_array_begin(&j);
        for (int k = 0; k < n_out; k++) gp_json_string(&j, out[k].dtype);
        gp_json_array_end(&j);
        gp_json_key(&j, "channels_last");
        gp_json_bool(&j, l.channels_last);
        char note[512];
        if (nhwc && gpo_layer_layout_note(m, i, note, sizeof note)) {
            gp_json_key(&j, "layout_note");
            gp_json_string(&j, note);
        }
        gp_json_key(&j, "params");
        gp_json_int(&j, l.params);
        gp_json_key(&j, "frontier_bytes");
        gp_json_int(&j, l.frontier_bytes);
        gp_json_key(&j, "frontier");
        gp_json_array_begin(&j);
        if (l.frontier_count > names_cap) {
            const char **grown = realloc(names, sizeof *names * (size_t)l.frontier_count);
            if (grown) {
                names = grown;
                names_cap = l.frontier_count;
            }
        }
        int nf = gpo_frontier(m, i + 1, names, names_cap);
        for (int k = 0; k < nf && k < names_cap; k++) gp_json_string(&j, names[k]);
        gp_json_array_end(&j);
        gp_json_object_end(&j);
    }
    gp_json_array_end(&j);
    free(names);
    gp_json_object_end(&j);
    gp_json_finish(&j);
}

gpo_status gpo_model_json(gpo_model *m, char **json)
{
    if (!m) return GPO_ERR_ARGUMENT;
    gpo_begin(m);
    if (!json || !m->loaded) return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_model_json: no model or no output");
    struct gpo_model_info info;
    gpo_model_info(m, &info);
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    if (!f) return gpo_fail(m, GPO_ERR_NOMEM, "out of memory writing the model summary");
    write_json(f, m, &info, m->path, m->opts.channels_last);
    if (fclose(f) != 0 || !buf) {
        free(buf);
        return gpo_fail(m, GPO_ERR_NOMEM, "out of memory writing the model summary");
    }
    *json = buf;
    return GPO_OK;
}
