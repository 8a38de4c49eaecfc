#include "graph/exporter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/registry.h"

/* "2.11.0+cu130" -> 2, 11; false when it does not start with numbers. */
static bool parse_version(const char *v, int *major, int *minor)
{
    char *end;
    if (!v) return false;
    long a = strtol(v, &end, 10);
    if (end == v || *end != '.') return false;
    const char *m = end + 1;
    long b = strtol(m, &end, 10);
    if (end == m) return false;
    *major = (int)a;
    *minor = (int)b;
    return true;
}

/* "node_Conv_12", "node_12": how the dynamo exporter names nodes. */
static bool dynamo_node_name(const char *s) { return s && strncmp(s, "node_", 5) == 0 && s[5]; }

/* "val_7": how it names the values it made up. */
static bool dynamo_value_name(const char *s)
{
    if (!s || strncmp(s, "val_", 4) != 0 || !s[4]) return false;
    for (s += 4; *s; s++)
        if (*s < '0' || *s > '9') return false;
    return true;
}

/* A name that says a BatchNorm was there: 'running_mean', 'running_var',
 * 'batchnorm', 'batch_norm', or a part 'bn' / 'bn<digits>' between
 * separators ("layer1.0.bn2.weight", "bn.bias"). */
static bool batch_norm_name(const char *s)
{
    if (!s) return false;
    char low[256];
    size_t n = 0;
    for (; s[n] && n + 1 < sizeof low; n++) low[n] = (char)(s[n] >= 'A' && s[n] <= 'Z' ? s[n] - 'A' + 'a' : s[n]);
    low[n] = '\0';
    if (strstr(low, "running_mean") || strstr(low, "running_var") || strstr(low, "batchnorm") ||
        strstr(low, "batch_norm"))
        return true;
    for (size_t i = 0; i + 1 < n; i++) {
        bool starts = i == 0 || low[i - 1] == '.' || low[i - 1] == '_' || low[i - 1] == '/';
        if (!starts || low[i] != 'b' || low[i + 1] != 'n') continue;
        size_t j = i + 2;
        while (low[j] >= '0' && low[j] <= '9') j++;
        if (!low[j] || low[j] == '.' || low[j] == '_' || low[j] == '/') return true;
    }
    return false;
}

/* "getitem", "getitem_12": the name dynamo gives a value taken out of a
 * tuple, such as the output BatchNorm's functional form returns. A
 * convolution never returns a tuple, so a convolution writing such a value
 * took it over from the BatchNorm that was folded into it. */
static bool getitem_name(const char *s)
{
    if (!s || strncmp(s, "getitem", 7) != 0) return false;
    s += 7;
    if (!*s) return true;
    if (*s++ != '_' || !*s) return false;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return false;
    return true;
}

static bool is_conv(const struct gp_node *n)
{
    return !strcmp(n->op_type, "Conv") || !strcmp(n->op_type, "ConvTranspose");
}

/* Every element the same value (false for an empty or missing tensor);
 * stops at the first that differs, so a random weight costs a few reads. */
static bool all_equal(const struct gp_tensor *t)
{
    if (!t) return false;
    int64_t n = gp_shape_numel(&t->shape);
    if (n < 1) return false;
    double first = gp_tensor_get_f64(t, 0);
    for (int64_t i = 1; i < n; i++)
        if (gp_tensor_get_f64(t, i) != first) return false;
    return true;
}

bool gp_graph_exporter_note(const struct gp_graph *g, char *note, size_t size)
{
    int major = 0, minor = 0;
    if (!g->producer_name || strcmp(g->producer_name, "pytorch") != 0 ||
        !parse_version(g->producer_version, &major, &minor) || major < 2 || (major == 2 && minor < 5))
        return false;
    int dynamo_names = 0;
    for (int i = 0; i < g->n_nodes; i++) dynamo_names += dynamo_node_name(g->nodes[i].name);
    for (int v = 0; v < g->n_values; v++) dynamo_names += dynamo_value_name(g->values[v].name);
    if (!dynamo_names) return false; /* the TorchScript exporter's names: '/layer1/conv/Conv' */

    /* BatchNorm folded: no BatchNormalization runs, and either convolutions
     * write the values their BatchNorm wrote (named 'getitem...', what
     * torch 2.11's optimizer leaves: it drops the BatchNorm's parameters and
     * renames the convolution 'node_Conv_<n>'), or convolutions carry
     * biases and some name still speaks of a BatchNorm. */
    int n_bn = 0, n_conv = 0, conv_bias = 0, conv_getitem = 0, getitem_conv = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct gp_node *n = &g->nodes[i];
        if (!strcmp(n->op_type, "BatchNormalization")) n_bn++;
        if (!is_conv(n)) continue;
        n_conv++;
        if (n->n_inputs >= 3 && n->inputs[2] >= 0) conv_bias++;
        if (n->n_outputs >= 1 && n->outputs[0] >= 0 && getitem_name(g->values[n->outputs[0]].name)) {
            conv_getitem++;
            if (getitem_conv < 0) getitem_conv = i;
        }
    }
    const char *bn_name = NULL;
    for (int v = 0; v < g->n_values && !bn_name; v++)
        if (batch_norm_name(g->values[v].name)) bn_name = g->values[v].name;
    for (int i = 0; i < g->n_nodes && !bn_name; i++)
        if (batch_norm_name(g->nodes[i].name)) bn_name = g->nodes[i].name;
    bool bn_folded = !n_bn && (conv_getitem || (conv_bias && bn_name));

    /* Parameters read by several nodes through slots that carry gradients,
     * whose elements are all equal: what fresh LayerNorm weights (ones) and
     * biases (zeros) look like when the exporter merged them. Weights tied
     * on purpose (GPT's embedding and output layer) are random and pass. */
    int shared = 0, example = -1, first_reader = -1, second_reader = -1;
    int *readers = calloc((size_t)g->n_values + 1, sizeof *readers);
    int *first = calloc((size_t)g->n_values + 1, sizeof *first);
    for (int i = 0; readers && first && i < g->n_nodes; i++) {
        const struct gp_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_inputs; k++) {
            int v = n->inputs[k];
            if (v < 0 || g->values[v].kind != GP_VALUE_PARAMETER) continue;
            if (n->def && k < 32 && ((n->def->nondiff_inputs >> k) & 1)) continue;
            bool again = false; /* one node reading it twice counts once */
            for (int j = 0; j < k; j++) again |= n->inputs[j] == v;
            if (again) continue;
            if (!all_equal(g->values[v].constant)) continue;
            if (readers[v]++ == 0) {
                first[v] = i;
            } else if (readers[v] == 2) {
                shared++;
                if (example < 0) example = v, first_reader = first[v], second_reader = i;
            }
        }
    }
    free(readers);
    free(first);
    if (!bn_folded && !shared) return false;

    size_t used = 0;
    used += (size_t)snprintf(note + used, size - used,
                             "this model looks like an optimized dynamo export (producer pytorch %s, "
                             "node names like '%s'): torch.onnx.export(..., dynamo=True) optimizes by "
                             "default, which training cannot undo.",
                             g->producer_version, g->n_nodes ? g->nodes[0].name : "node_...");
    if (bn_folded && conv_getitem && used < size) {
        const struct gp_node *c = &g->nodes[getitem_conv];
        used += (size_t)snprintf(note + used, size - used,
                                 " BatchNormalization was folded into the convolutions: none is left, and "
                                 "%d of %d convolution%s write%s what dynamo names a BatchNorm's output "
                                 "(such as '%s' writing '%s'), so this model trains without BatchNorm.",
                                 conv_getitem, n_conv, n_conv > 1 ? "s" : "", conv_getitem > 1 ? "" : "s",
                                 c->name, g->values[c->outputs[0]].name);
    } else if (bn_folded && used < size) {
        used += (size_t)snprintf(note + used, size - used,
                                 " BatchNormalization was folded into the convolutions: none is left, "
                                 "%d convolution%s biases, and names such as '%s' say there was "
                                 "one, so this model trains without BatchNorm.",
                                 conv_bias, conv_bias > 1 ? "s carry" : " carries", bn_name);
    }
    if (shared && used < size)
        used += (size_t)snprintf(note + used, size - used,
                                 " %d parameter%s read by several nodes (such as '%s' by '%s' and "
                                 "'%s', all its elements equal): the exporter merges initializers that "
                                 "hold equal values, so parameters that were separate in PyTorch train "
                                 "as one.",
                                 shared, shared > 1 ? "s are" : " is", g->values[example].name,
                                 g->nodes[first_reader].name, g->nodes[second_reader].name);
    if (used < size)
        snprintf(note + used, size - used,
                 " Export with torch.onnx.export(..., dynamo=True, optimize=False) (or dynamo=False) "
                 "to keep them as they were.");
    return true;
}
