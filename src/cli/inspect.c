/* gpipe-onnx inspect: the model summary and its sequential layer list.
 * Built on the public API (include/gpipe_onnx.h) alone, with the CLI's
 * formatting helpers (--json: the library's gpo_model_json). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "gpipe_onnx.h"

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
          "              and counts them, and a list says why each layer that could\n"
          "              write channels-last does not (the reader that refused it);\n"
          "              auto is nchw here (it means nhwc on GPUs, and inspect has no\n"
          "              devices)\n"
          "  --json      print the same as JSON: top-level 'layers' (index, op, name,\n"
          "              output_shapes, params, frontier_bytes, channels_last,\n"
          "              layout_note...), 'parameters', 'layout' and\n"
          "              'channels_last_activations'\n"
          "  -h, --help  this help\n"
          "\n"
          "Exit status: 0 on success, 1 when the model cannot be loaded (the reason is\n"
          "printed on one line), 2 on a usage error.\n",
          f);
}

/* "[1, 8, 16, 16]" into buf. */
static char *format_shape(const struct gpo_value *v, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < v->rank && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "", (long long)v->dims[i]);
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}

typedef gpo_status (*value_fn)(gpo_model *m, int k, struct gpo_value *out);

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

/* Parameters read by several layers (tied: a GPT's embedding and head):
 * a pipeline cut between those layers gives each stage a copy. */
static void print_tied(gpo_model *m, int n_tied)
{
    for (int k = 0; k < n_tied; k++) {
        struct gpo_tied t;
        if (gpo_tied(m, k, &t) != GPO_OK) continue;
        char layers[256] = "";
        size_t len = 0;
        for (int r = 0; r < t.n_readers && len < sizeof layers; r++)
            len += (size_t)snprintf(layers + len, sizeof layers - len, "%s%d", r ? ", " : "", t.readers[r]);
        printf("%-12s %s read by layers %s: stages that split them each hold a copy, gradients summed\n", "tied",
               t.name, layers);
    }
}

static void print_values(const char *label, gpo_model *m, value_fn get, int n)
{
    for (int i = 0; i < n; i++) {
        struct gpo_value v;
        if (get(m, i, &v) != GPO_OK) continue;
        char s[256];
        printf("%-12s %s  %s %s\n", i ? "" : label, v.name, v.dtype, format_shape(&v, s, sizeof s));
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

/* The layers whose output could be channels-last but stays [N, C, H, W],
 * and why (the first 20; the JSON has them all). */
static void print_layout_notes(const gpo_model *m, int n_layers)
{
    int shown = 0, total = 0;
    char note[512];
    for (int i = 0; i < n_layers; i++) {
        if (!gpo_layer_layout_note(m, i, note, sizeof note)) continue;
        if (total++ == 0) printf("\nstays [N, C, H, W]:\n");
        if (shown >= 20) continue;
        struct gpo_layer l;
        if (gpo_layer((gpo_model *)m, i, &l) != GPO_OK) continue;
        printf("  #%d %s '%s': %s\n", i, l.op, l.name, note);
        shown++;
    }
    if (total > shown) printf("  ... and %d more (inspect --json: each layer's layout_note)\n", total - shown);
}

static void print_table(gpo_model *m, const struct gpo_model_info *info, const char *path, bool nhwc)
{
    char a[64], b[64];
    printf("%-12s %s\n", "model", path);
    printf("%-12s %s %s (IR version %lld, opset %lld)\n", "producer",
           *info->producer_name ? info->producer_name : "(unknown)", info->producer_version,
           (long long)info->ir_version, (long long)info->opset);
    if (info->export_note) printf("%-12s %s\n", "note", info->export_note);
    printf("%-12s %lld (bound to axis 0 of every input)\n", "batch", (long long)info->batch);
    print_values("inputs", m, gpo_input, info->n_inputs);
    print_values("outputs", m, gpo_output, info->n_outputs);
    printf("%-12s %s in %d tensors (%s)\n", "parameters", gp_cli_count(info->parameters, a, sizeof a),
           info->parameter_tensors, gp_cli_bytes(info->parameter_bytes, b, sizeof b));
    print_tied(m, info->n_tied);
    if (info->buffer_tensors)
        printf("%-12s %s in %d tensors (%s): state without gradients\n", "buffers",
               gp_cli_count(info->buffers, a, sizeof a), info->buffer_tensors,
               gp_cli_bytes(info->buffer_bytes, b, sizeof b));
    printf("%-12s %d in the file, %d folded at load time, ", "nodes", info->source_nodes, info->folded_nodes);
    if (info->fused_nodes)
        printf("%d fused into %d (exported attention and the Split making its Q, K, V into Attention, GELU chains into Gelu, Relu into the BatchNormalization or residual Add "
               "before it, residual Adds into the BatchNormalization before them, weight Transposes and bias Adds "
               "into their MatMul), ",
               info->fused_nodes + info->fusions, info->fusions);
    printf("%d layers\n", info->n_layers);
    struct op_tally *t = calloc((size_t)info->folded_nodes + 1, sizeof *t);
    int nt = t ? tally_folded(m, info->folded_nodes, t) : 0;
    if (nt) {
        printf("%-12s", "folded");
        for (int i = 0; i < nt; i++) printf("%s %s x%d", i ? "," : "", t[i].op, t[i].count);
        printf("\n");
    }
    free(t);
    printf("%-12s %s\n", "input bytes", gp_cli_bytes(info->input_frontier_bytes, a, sizeof a));
    if (nhwc)
        printf("%-12s nhwc: %d activations channels-last ([N, H, W, C]; the layers marked nhwc)\n", "layout",
               info->channels_last_activations);
    printf("\n");

    int name_w = 4, op_w = 2;
    for (int i = 0; i < info->n_layers; i++) {
        struct gpo_layer l;
        if (gpo_layer(m, i, &l) != GPO_OK) continue;
        int len = (int)strlen(l.name);
        /* "+Add", "+Relu", "(B^T)", "(QKV)", "+bias" */
        int olen = (int)strlen(l.op) + (l.fused_add ? 4 : 0) + (l.fused_relu ? 5 : 0) + (l.trans_b ? 5 : 0) +
                   (l.packed_qkv ? 5 : 0) + (l.fused_bias ? 5 : 0);
        if (len > name_w) name_w = len;
        if (olen > op_w) op_w = olen;
    }
    if (name_w > 40) name_w = 40;
    if (op_w > 28) op_w = 28;
    /* With the layout pass, a last column marks channels-last outputs. */
    int front_w = nhwc ? 14 : 0;
    printf("%5s  %-*s  %-*s  %-24s %12s  %-*s%s\n", "#", op_w, "op", name_w, "name", "output shape",
           "params", front_w, "frontier after", nhwc ? "  layout" : "");
    for (int i = 0; i < info->n_layers; i++) {
        struct gpo_layer l;
        if (gpo_layer(m, i, &l) != GPO_OK) continue;
        char name[64], shapes[512] = "";
        size_t used = 0;
        for (int k = 0; k < l.n_outputs; k++) {
            struct gpo_value v;
            if (gpo_layer_output(m, i, k, &v) != GPO_OK || v.rank < 0) continue;
            char s[160];
            int w = snprintf(shapes + used, sizeof shapes - used, "%s%s", used ? " " : "",
                             format_shape(&v, s, sizeof s));
            if (w < 0 || (size_t)w >= sizeof shapes - used) break;
            used += (size_t)w;
        }
        char op[64];
        snprintf(op, sizeof op, "%s%s%s%s%s%s", l.op, l.fused_add ? "+Add" : "", l.fused_relu ? "+Relu" : "",
                 l.trans_b ? "(B^T)" : "", l.packed_qkv ? "(QKV)" : "", l.fused_bias ? "+bias" : "");
        const char *mark = nhwc && l.channels_last ? "  nhwc" : "";
        printf("%5d  %-*s  %-*s  %-24s %12s  %-*s%s\n", i, op_w, op, name_w, clip(l.name, name_w, name, sizeof name),
               shapes, l.params ? gp_cli_count(l.params, a, sizeof a) : "-", *mark ? front_w : 0,
               gp_cli_bytes(l.frontier_bytes, b, sizeof b), mark);
    }
    if (nhwc) print_layout_notes(m, info->n_layers);
}

int gp_cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    int64_t batch = 1;
    bool json = false, nhwc = false;
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
            /* auto means the model's layout here: inspect has no devices
             * (as training on CPU devices would). */
            if (val && (!strcmp(val, "auto") || !strcmp(val, "nchw"))) nhwc = false;
            else if (val && !strcmp(val, "nhwc")) nhwc = true;
            else return gp_cli_usage("inspect", "--layout takes auto, nchw or nhwc, not '%s'", val ? val : "");
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

    struct gpo_open_options o;
    gpo_open_options_init(&o);
    o.batch = batch;
    o.channels_last = nhwc;
    gpo_model *m = NULL;
    if (gpo_open(path, &o, &m) != GPO_OK) {
        int status = gp_cli_fail("%s", gpo_last_error(m));
        gpo_close(m);
        return status;
    }
    struct gpo_model_info info;
    gpo_model_info(m, &info);
    int status = GP_EXIT_OK;
    char *text = NULL;
    if (!json) print_table(m, &info, path, nhwc);
    else if (gpo_model_json(m, &text) == GPO_OK) fputs(text, stdout);
    else status = gp_cli_fail("%s", gpo_last_error(m));
    gpo_free(text);
    if (status == GP_EXIT_OK && fflush(stdout) != 0) status = gp_cli_fail("cannot write the report");
    gpo_close(m);
    return status;
}
