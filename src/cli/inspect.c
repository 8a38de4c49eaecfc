/* gpipe-onnx inspect: the model summary and its sequential layer list. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "graph/exporter.h"
#include "graph/layers.h"
#include "graph/layout.h"
#include "onnx/load.h"
#include "ops/registry.h"
#include "util/json_writer.h"

static void help(FILE *f)
{
    fputs("usage: gpipe-onnx inspect MODEL.onnx [--batch N] [--layout L] [--json]\n"
          "\n"
          "Loads the model, binds axis 0 of every input to the batch size, folds the\n"
          "constant subgraphs exporters emit, infers every shape, and prints:\n"
          "  - the summary: producer, IR version, opset, inputs and outputs with shapes,\n"
          "    parameter count and bytes;\n"
          "  - one row per layer (the nodes that run, in order): index, op, node name,\n"
          "    output shape(s), parameters, and the bytes per batch of the frontier at the\n"
          "    cut after the layer (every value made before the cut and used after it,\n"
          "    skip connections included): what a pipeline stage boundary there moves.\n"
          "\n"
          "options:\n"
          "  --batch N   batch size bound to axis 0 of the inputs (default 1)\n"
          "  --layout L  auto (default), nchw or nhwc: which activations train --layout\n"
          "              would store channels-last ([N, H, W, C]). nhwc runs the layout\n"
          "              pass: the table marks each layer whose output is channels-last\n"
          "              and counts them; auto is nchw here (it means nhwc on GPUs,\n"
          "              and inspect has no devices)\n"
          "  --json      print the same as JSON: top-level 'layers' (index, op, name,\n"
          "              output_shapes, params, frontier_bytes, channels_last...),\n"
          "              'parameters', 'layout' and 'channels_last_activations'\n"
          "  -h, --help  this help\n"
          "\n"
          "Exit status: 0 on success, 1 when the model cannot be loaded (the reason is\n"
          "printed on one line), 2 on a usage error.\n",
          f);
}

static void json_shape(struct gp_json *j, const struct gp_shape *s)
{
    gp_json_array_begin(j);
    for (int i = 0; i < s->rank; i++) gp_json_int(j, s->dims[i]);
    gp_json_array_end(j);
}

static void json_value_list(struct gp_json *j, const struct gp_graph *g, const int *ids, int n)
{
    gp_json_array_begin(j);
    for (int i = 0; i < n; i++) {
        const struct gp_value *v = &g->values[ids[i]];
        gp_json_object_begin(j);
        gp_json_key(j, "name");
        gp_json_string(j, v->name);
        gp_json_key(j, "dtype");
        gp_json_string(j, gp_dtype_name(v->dtype));
        gp_json_key(j, "shape");
        json_shape(j, &v->shape);
        gp_json_object_end(j);
    }
    gp_json_array_end(j);
}

static int count_kind(const struct gp_graph *g, enum gp_value_kind kind, int64_t *elems,
                      int64_t *bytes)
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

/* Folded nodes counted per op type, in order of first appearance. */
struct op_tally {
    const char *op;
    int count;
};

static int tally_folded(const struct gp_graph *g, struct op_tally *t)
{
    int n = 0;
    for (int i = 0; i < g->n_folded; i++) {
        int k = 0;
        while (k < n && strcmp(t[k].op, g->folded[i].op_type) != 0) k++;
        if (k == n) t[n++] = (struct op_tally){g->folded[i].op_type, 0};
        t[k].count++;
    }
    return n;
}

/* Whether the layer's output 0 is stored channels-last (graph/layout.h). */
static bool out_channels_last(const struct gp_graph *g, const struct gp_node *n)
{
    return n->n_outputs > 0 && n->outputs[0] >= 0 && g->values[n->outputs[0]].channels_last;
}

static void print_json(const struct gp_graph *g, const struct gp_layers *l, const char *path,
                       enum gp_layout_policy layout)
{
    struct gp_json j;
    gp_json_init(&j, stdout, true);
    int64_t elems, bytes;
    gp_json_object_begin(&j);
    gp_json_key(&j, "model");
    gp_json_string(&j, path);
    gp_json_key(&j, "producer_name");
    gp_json_string(&j, g->producer_name);
    gp_json_key(&j, "producer_version");
    gp_json_string(&j, g->producer_version);
    char note[2048];
    gp_json_key(&j, "export_note"); /* graph/exporter.h; null for most models */
    if (gp_graph_exporter_note(g, note, sizeof note)) gp_json_string(&j, note);
    else gp_json_null(&j);
    gp_json_key(&j, "ir_version");
    gp_json_int(&j, g->ir_version);
    gp_json_key(&j, "opset");
    gp_json_int(&j, g->opset);
    gp_json_key(&j, "batch");
    gp_json_int(&j, g->batch);
    gp_json_key(&j, "inputs");
    json_value_list(&j, g, g->inputs, g->n_inputs);
    gp_json_key(&j, "outputs");
    json_value_list(&j, g, g->outputs, g->n_outputs);
    int n_params = count_kind(g, GP_VALUE_PARAMETER, &elems, &bytes);
    gp_json_key(&j, "parameters");
    gp_json_int(&j, elems);
    gp_json_key(&j, "parameter_bytes");
    gp_json_int(&j, bytes);
    gp_json_key(&j, "parameter_tensors");
    gp_json_int(&j, n_params);
    int n_buffers = count_kind(g, GP_VALUE_BUFFER, &elems, &bytes);
    gp_json_key(&j, "buffers");
    gp_json_int(&j, elems);
    gp_json_key(&j, "buffer_tensors");
    gp_json_int(&j, n_buffers);
    gp_json_key(&j, "source_nodes");
    gp_json_int(&j, g->n_source_nodes);
    gp_json_key(&j, "folded_nodes");
    gp_json_int(&j, g->n_folded);
    gp_json_key(&j, "fused_nodes");
    gp_json_int(&j, g->n_fused);
    struct op_tally *t = calloc((size_t)g->n_folded + 1, sizeof *t);
    int nt = t ? tally_folded(g, t) : 0;
    gp_json_key(&j, "folded_ops");
    gp_json_object_begin(&j);
    for (int i = 0; i < nt; i++) {
        gp_json_key(&j, t[i].op);
        gp_json_int(&j, t[i].count);
    }
    gp_json_object_end(&j);
    free(t);
    gp_json_key(&j, "input_frontier_bytes");
    gp_json_int(&j, l->frontier_bytes[0]);
    gp_json_key(&j, "layout");
    gp_json_string(&j, gp_layout_policy_name(layout));
    gp_json_key(&j, "channels_last_activations");
    gp_json_int(&j, gp_graph_channels_last_count(g));

    int *ids = malloc(sizeof(int) * ((size_t)g->n_values + 1));
    gp_json_key(&j, "layers");
    gp_json_array_begin(&j);
    for (int i = 0; i < g->n_nodes; i++) {
        const struct gp_node *n = &g->nodes[i];
        gp_json_object_begin(&j);
        gp_json_key(&j, "index");
        gp_json_int(&j, i);
        gp_json_key(&j, "op");
        gp_json_string(&j, n->op_type);
        if (n->fused_relu) {
            gp_json_key(&j, "fused");
            gp_json_string(&j, "Relu");
        }
        gp_json_key(&j, "domain");
        gp_json_string(&j, n->domain);
        gp_json_key(&j, "since_version");
        gp_json_int(&j, n->def->since_version);
        gp_json_key(&j, "name");
        gp_json_string(&j, n->name);
        gp_json_key(&j, "inputs");
        gp_json_array_begin(&j);
        for (int k = 0; k < n->n_inputs; k++)
            gp_json_string(&j, n->inputs[k] >= 0 ? g->values[n->inputs[k]].name : "");
        gp_json_array_end(&j);
        gp_json_key(&j, "outputs");
        gp_json_array_begin(&j);
        for (int k = 0; k < n->n_outputs; k++)
            gp_json_string(&j, n->outputs[k] >= 0 ? g->values[n->outputs[k]].name : "");
        gp_json_array_end(&j);
        gp_json_key(&j, "output_shapes");
        gp_json_array_begin(&j);
        for (int k = 0; k < n->n_outputs; k++) {
            if (n->outputs[k] < 0) gp_json_null(&j);
            else json_shape(&j, &g->values[n->outputs[k]].shape);
        }
        gp_json_array_end(&j);
        gp_json_key(&j, "output_dtypes");
        gp_json_array_begin(&j);
        for (int k = 0; k < n->n_outputs; k++)
            gp_json_string(&j, n->outputs[k] >= 0 ? gp_dtype_name(g->values[n->outputs[k]].dtype)
                                                  : "");
        gp_json_array_end(&j);
        gp_json_key(&j, "channels_last");
        gp_json_bool(&j, out_channels_last(g, n));
        gp_json_key(&j, "params");
        gp_json_int(&j, l->layer_params[i]);
        gp_json_key(&j, "frontier_bytes");
        gp_json_int(&j, l->frontier_bytes[i + 1]);
        gp_json_key(&j, "frontier");
        gp_json_array_begin(&j);
        int nf = ids ? gp_layers_frontier(l, g, i + 1, ids) : 0;
        for (int k = 0; k < nf; k++) gp_json_string(&j, g->values[ids[k]].name);
        gp_json_array_end(&j);
        gp_json_object_end(&j);
    }
    gp_json_array_end(&j);
    free(ids);
    gp_json_object_end(&j);
    gp_json_finish(&j);
}

/* Parameters read by several layers (tied: a GPT's embedding and head):
 * a pipeline cut between those layers gives each stage a copy. */
static void print_tied(const struct gp_graph *g)
{
    for (int v = 0; v < g->n_values; v++) {
        if (g->values[v].kind != GP_VALUE_PARAMETER) continue;
        char layers[256] = "";
        size_t len = 0;
        int readers = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            bool reads = false;
            for (int k = 0; k < g->nodes[i].n_inputs; k++) reads |= g->nodes[i].inputs[k] == v;
            if (!reads) continue;
            if (len < sizeof layers)
                len += (size_t)snprintf(layers + len, sizeof layers - len, "%s%d", readers ? ", " : "", i);
            readers++;
        }
        if (readers < 2) continue;
        printf("%-12s %s read by layers %s: stages that split them each hold a copy, gradients summed\n", "tied",
               g->values[v].name, layers);
    }
}

static void print_values(const char *label, const struct gp_graph *g, const int *ids, int n)
{
    for (int i = 0; i < n; i++) {
        const struct gp_value *v = &g->values[ids[i]];
        char s[256];
        printf("%-12s %s  %s %s\n", i ? "" : label, v->name, gp_dtype_name(v->dtype),
               gp_shape_format(&v->shape, s, sizeof s));
    }
}

/* Long names keep their tail, which is where exporters put the distinctive part. */
static const char *clip(const char *s, int width, char *buf, size_t size)
{
    int len = (int)strlen(s);
    if (len <= width) return s;
    snprintf(buf, size, "...%s", s + len - (width - 3));
    return buf;
}

static void print_table(const struct gp_graph *g, const struct gp_layers *l, const char *path, bool nhwc)
{
    char a[64], b[64];
    int64_t elems, bytes;
    printf("%-12s %s\n", "model", path);
    printf("%-12s %s %s (IR version %lld, opset %lld)\n", "producer",
           *g->producer_name ? g->producer_name : "(unknown)", g->producer_version,
           (long long)g->ir_version, (long long)g->opset);
    char note[2048];
    if (gp_graph_exporter_note(g, note, sizeof note)) printf("%-12s %s\n", "note", note);
    printf("%-12s %lld (bound to axis 0 of every input)\n", "batch", (long long)g->batch);
    print_values("inputs", g, g->inputs, g->n_inputs);
    print_values("outputs", g, g->outputs, g->n_outputs);
    int n_params = count_kind(g, GP_VALUE_PARAMETER, &elems, &bytes);
    printf("%-12s %s in %d tensors (%s)\n", "parameters", gp_cli_count(elems, a, sizeof a),
           n_params, gp_cli_bytes(bytes, b, sizeof b));
    print_tied(g);
    int n_buffers = count_kind(g, GP_VALUE_BUFFER, &elems, &bytes);
    if (n_buffers)
        printf("%-12s %s in %d tensors (%s): state without gradients\n", "buffers",
               gp_cli_count(elems, a, sizeof a), n_buffers, gp_cli_bytes(bytes, b, sizeof b));
    printf("%-12s %d in the file, %d folded at load time, ", "nodes", g->n_source_nodes, g->n_folded);
    if (g->n_fused)
        printf("%d fused into %d (exported attention into Attention, GELU chains into Gelu, Relu into the BatchNormalization or residual Add "
               "before it), ",
               g->n_fused + g->n_fusions, g->n_fusions);
    printf("%d layers\n", g->n_nodes);
    struct op_tally *t = calloc((size_t)g->n_folded + 1, sizeof *t);
    int nt = t ? tally_folded(g, t) : 0;
    if (nt) {
        printf("%-12s", "folded");
        for (int i = 0; i < nt; i++) printf("%s %s x%d", i ? "," : "", t[i].op, t[i].count);
        printf("\n");
    }
    free(t);
    printf("%-12s %s\n", "input bytes", gp_cli_bytes(l->frontier_bytes[0], a, sizeof a));
    if (nhwc)
        printf("%-12s nhwc: %d activations channels-last ([N, H, W, C]; the layers marked nhwc)\n", "layout",
               gp_graph_channels_last_count(g));
    printf("\n");

    int name_w = 4, op_w = 2;
    for (int i = 0; i < g->n_nodes; i++) {
        int len = (int)strlen(g->nodes[i].name);
        int olen = (int)strlen(g->nodes[i].op_type) + (g->nodes[i].fused_relu ? 5 : 0); /* "+Relu" */
        if (len > name_w) name_w = len;
        if (olen > op_w) op_w = olen;
    }
    if (name_w > 40) name_w = 40;
    if (op_w > 24) op_w = 24;
    /* With the layout pass, a last column marks channels-last outputs. */
    int front_w = nhwc ? 14 : 0;
    printf("%5s  %-*s  %-*s  %-24s %12s  %-*s%s\n", "#", op_w, "op", name_w, "name", "output shape",
           "params", front_w, "frontier after", nhwc ? "  layout" : "");
    for (int i = 0; i < g->n_nodes; i++) {
        const struct gp_node *n = &g->nodes[i];
        char name[64], shapes[512] = "";
        size_t used = 0;
        for (int k = 0; k < n->n_outputs; k++) {
            if (n->outputs[k] < 0) continue;
            char s[160];
            int w = snprintf(shapes + used, sizeof shapes - used, "%s%s", used ? " " : "",
                             gp_shape_format(&g->values[n->outputs[k]].shape, s, sizeof s));
            if (w < 0 || (size_t)w >= sizeof shapes - used) break;
            used += (size_t)w;
        }
        char op[64];
        snprintf(op, sizeof op, "%s%s", n->op_type, n->fused_relu ? "+Relu" : "");
        const char *mark = nhwc && out_channels_last(g, n) ? "  nhwc" : "";
        printf("%5d  %-*s  %-*s  %-24s %12s  %-*s%s\n", i, op_w, op, name_w,
               clip(n->name, name_w, name, sizeof name), shapes,
               l->layer_params[i] ? gp_cli_count(l->layer_params[i], a, sizeof a) : "-", *mark ? front_w : 0,
               gp_cli_bytes(l->frontier_bytes[i + 1], b, sizeof b), mark);
    }
}

int gp_cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    int64_t batch = 1;
    bool json = false;
    enum gp_layout_policy layout = GP_LAYOUT_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            help(stdout);
            return GP_EXIT_OK;
        } else if (strcmp(arg, "--json") == 0) {
            json = true;
        } else if (strcmp(arg, "--batch") == 0 || strncmp(arg, "--batch=", 8) == 0) {
            const char *val = arg[7] == '=' ? arg + 8 : (i + 1 < argc ? argv[++i] : NULL);
            if (!gp_cli_parse_int("inspect", "--batch", val, 1, (int64_t)1 << 31, &batch))
                return GP_EXIT_USAGE;
        } else if (strcmp(arg, "--layout") == 0 || strncmp(arg, "--layout=", 9) == 0) {
            const char *val = arg[8] == '=' ? arg + 9 : (i + 1 < argc ? argv[++i] : NULL);
            if (!val || !gp_layout_policy_parse(val, &layout))
                return gp_cli_usage("inspect", "--layout takes auto, nchw or nhwc, not '%s'", val ? val : "");
        } else if (arg[0] == '-' && arg[1]) {
            return gp_cli_usage("inspect", "unknown option '%s'", arg);
        } else if (!path) {
            path = arg;
        } else {
            return gp_cli_usage("inspect", "only one model can be inspected (got '%s' and '%s')",
                                path, arg);
        }
    }
    if (!path) return gp_cli_usage("inspect", "no model given");

    struct gp_graph g;
    struct gp_error err = {0};
    if (gp_onnx_load(path, batch, &g, &err) != GP_OK) return gp_cli_fail("%s", err.msg);
    struct gp_layers layers;
    if (gp_layers_build(&g, &layers, &err) != GP_OK) {
        gp_graph_free(&g);
        return gp_cli_fail("%s", err.msg);
    }
    /* As training on CPU devices would: auto means the model's layout here. */
    bool nhwc = gp_layout_policy_on(layout, false);
    if (nhwc) gp_graph_channels_last(&g);
    if (json) print_json(&g, &layers, path, nhwc ? GP_LAYOUT_NHWC : GP_LAYOUT_NCHW);
    else print_table(&g, &layers, path, nhwc);
    int status = fflush(stdout) == 0 ? GP_EXIT_OK : gp_cli_fail("cannot write the report");
    gp_layers_free(&layers);
    gp_graph_free(&g);
    return status;
}
