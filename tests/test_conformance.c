/* Forward conformance against the ONNX backend node tests.
 *
 * Each test folder of onnx/backend/test/data/node (scripts/fetch_onnx_tests.sh
 * puts them in .cache/onnx-node-tests; GP_ONNX_NODE_TESTS names the folder)
 * holds model.onnx and test_data_set_N/{input,output}_K.pb. For every folder
 * whose name belongs to an op we support, the model is loaded with the
 * file's own sizes, run forward on the CPU backend (float build), and every
 * output compared with the expected one: rtol 1e-4 and atol 1e-5 for float32
 * and float64, one half / bfloat16 rounding step for those, exact for
 * integers and booleans.
 *
 * The loader wants static shapes, so inputs that decide a shape (Reshape's
 * shape, Resize's scales, Range's bounds...) cannot stay graph inputs, and a
 * graph input needs a batch axis. When a model fails to load for one of those
 * reasons, it is loaded again with its inputs after the first, then all of
 * them, turned into Constant nodes holding that data set's values; a model
 * that then folds completely at load time checks our constant folding
 * rather than a kernel, and its line says so.
 *
 * Where this project follows PyTorch rather than ONNX's reference, the
 * expected output is converted, not ignored: BatchNormalization's running
 * variance in training mode is PyTorch's (unbiased).
 *
 * Outcomes: PASS; SKIP for tests on the explicit skip list (each with its
 * reason) and for load or run failures whose message is one of the listed
 * deliberate rejections (the loader's or kernel's message is printed); FAIL
 * for anything else: an unexpected load failure, a missing CPU kernel, a run
 * error, a wrong dtype, shape or value, or a crash or hang (each test runs
 * in a child process). Exit status: 0 when nothing failed, 1 otherwise, 77
 * (meson's skip) when the tests are not there.
 *
 *     test_conformance [--no-fork] [SUBSTRING...]   run only matching tests */
#include <dirent.h>
#include <stdarg.h>
#include <fnmatch.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/cpu/runner.h"
#include "onnx.pb-c.h"
#include "onnx/load.h"
#include "onnx/tensor_proto.h"
#include "ops/registry.h"

/* ---- which tests ---- */

/* Ops we support, as the test names spell them: a test belongs to op X when
 * its name is test_X followed by nothing, '_' or a digit (test_and2d). */
static const char *const ops[] = {
    "abs", "add", "and", "argmax", "argmin", "attention", "averagepool", "basic_conv", "batchnorm", "cast",
    "castlike", "ceil", "clip", "concat", "constant", "constant_pad", "constantofshape", "conv",
    "convtranspose", "div", "dropout", "edge_pad", "einsum", "elu", "equal", "erf", "exp", "expand",
    "flatten", "floor", "gather", "gelu", "gemm", "globalaveragepool", "globalmaxpool", "greater",
    "greater_equal", "hardsigmoid", "hardswish", "identity", "instancenorm", "layer_normalization",
    "leakyrelu", "less", "less_equal", "log", "logsoftmax", "matmul", "max", "maxpool", "mean",
    "min", "mod", "mul", "neg", "not", "or", "pad", "pow", "range", "reciprocal", "reduce_l2",
    "reduce_max", "reduce_mean", "reduce_min", "reduce_prod", "reduce_sum", "reduce_sum_square",
    "reflect_pad", "relu", "reshape", "resize", "round", "scatternd", "shape", "sigmoid", "sign", "size",
    "slice", "softmax", "softplus", "split", "sqrt", "squeeze", "sub", "sum", "tanh", "tile",
    "transpose", "tril", "triu", "unsqueeze", "upsample", "where", "wrap_pad", "xor",
};

#define N_OPS (sizeof ops / sizeof *ops)

/* Registered ops whose node tests are named otherwise than their op type
 * in lower case; ops with no node tests of their own map to NULL. */
static const struct {
    const char *op_type, *tests;
} test_names[] = {
    {"BatchNormalization", "batchnorm"},
    {"GreaterOrEqual", "greater_equal"}, {"InstanceNormalization", "instancenorm"},
    {"LayerNormalization", "layer_normalization"}, {"LessOrEqual", "less_equal"},
    {"ReduceL2", "reduce_l2"}, {"ReduceMax", "reduce_max"}, {"ReduceMean", "reduce_mean"},
    {"ReduceMin", "reduce_min"}, {"ReduceProd", "reduce_prod"}, {"ReduceSum", "reduce_sum"},
    {"ReduceSumSquare", "reduce_sum_square"}, {"Trilu", "triu"},
};

/* Tests of other ops whose names start like ours. */
static const char *const other_ops[] = {
    "test_gather_elements*",   /* GatherElements */
    "test_split_to_sequence*", /* SplitToSequence: lowered at load only where SequenceAt reads it
                                  (onnx/sequence.c); these tests output the sequence itself */
};

struct listed {
    const char *pattern; /* fnmatch pattern: on a test name, or (with '*'
                            around it) on a loader or kernel message */
    const char *reason;
};

/* Tests skipped without running, each for a reason. */
static const struct listed skip_tests[] = {
    {"test_dropout_random*", "random dropout mask: our Philox stream is not ONNX's"},
    /* With ceil_mode the last window hangs past the padded input; the
     * expected output divides it by the whole kernel, onnxruntime (and our
     * kernel) by the cells inside input + pads (onnx 1.17's data; see
     * openvinotoolkit/openvino#30842). */
    {"test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True",
     "expected output counts the ceil-mode overhang in the divisor; onnxruntime agrees with us"},
    /* align_corners with scales: the expected output maps coordinates with
     * the fractional length 4 x 0.6 = 2.4, onnxruntime and PyTorch with the
     * output size 2, as we do. */
    {"test_resize_downsample_scales_linear_align_corners",
     "expected output uses the fractional resized length; onnxruntime and PyTorch agree with us"},
    {NULL, NULL},
};

/* Load failures that are deliberate rejections: a message containing the
 * pattern (fnmatch, with '*' around it) makes the test a skip. */
static const struct listed load_rejections[] = {
    {"element type 1[789] (undefined)", "float8 element types are not supported"},
    {"element type 20 (undefined)", "float8 element types are not supported"},
    {"element type 2[12] (undefined)", "4-bit integer element types are not supported"},
    {"element type 8 (string)", "string tensors are not supported"},
    {"is not a tensor (sequences, maps and optionals are not supported)",
     "sequences and optionals are not supported"},
    {"unsupported op type: Loop", "control flow (Loop) is not supported"},
    {"cannot reduce the empty axis", "max / min over an empty axis is refused (PyTorch too)"},
    {"(Einsum): equation '*' has ", "Einsum beyond batched matrix products and single-operand "
                                    "permutations and sums is not supported"},
    {NULL, NULL},
};

/* Run errors that are deliberate refusals of a kernel: a message containing
 * the pattern makes the test a skip (with the kernel's message). */
static const struct listed run_rejections[] = {
    {"mode 'cubic' is not supported", "cubic Resize is not supported (nearest and linear are)"},
    {"antialiased downsampling", "antialiased Resize is not supported"},
    {"pools float tensors, not", "pooling integer tensors is not supported"},
    {NULL, NULL},
};

static bool name_has_op(const char *name, const char *op)
{
    size_t n = strlen(op);
    if (strncmp(name, "test_", 5) != 0 || strncmp(name + 5, op, n) != 0) return false;
    char c = name[5 + n];
    return c == '\0' || c == '_' || (c >= '0' && c <= '9');
}

static bool selected(const char *name)
{
    for (size_t i = 0; i < sizeof other_ops / sizeof *other_ops; i++)
        if (fnmatch(other_ops[i], name, 0) == 0) return false;
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
        if (name_has_op(name, ops[i])) return true;
    return false;
}

static const char *listed_reason(const struct listed *list, const char *text, bool substring)
{
    char pat[512];
    for (; list->pattern; list++) {
        snprintf(pat, sizeof pat, substring ? "*%s*" : "%s", list->pattern);
        if (fnmatch(pat, text, 0) == 0) return list->reason;
    }
    return NULL;
}

/* ---- results ---- */

enum outcome { PASS = 0, FAIL = 1, SKIP = 77 };

struct result {
    enum outcome outcome;
    char msg[3072];
};

static enum outcome set(struct result *r, enum outcome o, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static enum outcome set(struct result *r, enum outcome o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    return r->outcome = o;
}

/* ---- files ---- */

static unsigned char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *buf = NULL;
    size_t cap = 0, len = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? 2 * cap : 65536;
            unsigned char *nb = realloc(buf, cap);
            if (!nb) break;
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    bool ok = !ferror(f) && buf;
    fclose(f);
    if (!ok) {
        free(buf);
        return NULL;
    }
    *size = len;
    return buf;
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int only_tests(const struct dirent *e) { return strncmp(e->d_name, "test_", 5) == 0; }
static int only_data_sets(const struct dirent *e)
{
    return strncmp(e->d_name, "test_data_set_", 14) == 0;
}

/* A TensorProto file; NULL when absent or malformed. */
static Onnx__TensorProto *read_tensor(const char *path, bool *present)
{
    size_t size;
    unsigned char *buf = read_file(path, &size);
    *present = buf != NULL;
    if (!buf) return NULL;
    Onnx__TensorProto *tp = onnx__tensor_proto__unpack(NULL, size, buf);
    free(buf);
    return tp;
}

/* ---- one data set ---- */

struct data_set {
    char name[256];
    int n_in, n_out;
    Onnx__TensorProto **in, **out; /* [n_in], [n_out] */
};

static void free_data_set(struct data_set *d)
{
    for (int k = 0; k < d->n_in; k++)
        if (d->in[k]) onnx__tensor_proto__free_unpacked(d->in[k], NULL);
    for (int k = 0; k < d->n_out; k++)
        if (d->out[k]) onnx__tensor_proto__free_unpacked(d->out[k], NULL);
    free(d->in);
    free(d->out);
}

/* Inputs and outputs that are not tensors (is_tensor false: sequences,
 * optionals) are left NULL: the loader refuses those models anyway. */
static enum outcome read_data_set(const char *dir, int n_in, int n_out, const bool *is_tensor,
                                  struct data_set *d, struct result *r)
{
    char path[8400];
    d->n_in = n_in;
    d->n_out = n_out;
    d->in = calloc((size_t)n_in + 1, sizeof *d->in);
    d->out = calloc((size_t)n_out + 1, sizeof *d->out);
    if (!d->in || !d->out) return set(r, FAIL, "out of memory");
    for (int k = 0; k < n_in + n_out; k++) {
        bool input = k < n_in, present;
        if (!is_tensor[k]) continue;
        int j = input ? k : k - n_in;
        snprintf(path, sizeof path, "%s/%s_%d.pb", dir, input ? "input" : "output", j);
        Onnx__TensorProto *tp = read_tensor(path, &present);
        if (!tp)
            return set(r, FAIL, "%s/%s_%d.pb: %s (only tensors are supported)", d->name,
                       input ? "input" : "output", j, present ? "not a TensorProto" : "missing");
        (input ? d->in : d->out)[j] = tp;
    }
    return PASS;
}

/* ---- turning inputs into Constant nodes ---- */

/* Packs a copy of `m` in which graph inputs [first, n) are replaced by
 * Constant nodes holding d's tensors. `m` is left as it was. */
static unsigned char *bake_inputs(Onnx__ModelProto *m, const char *const *in_names, int n_in,
                                  int first, const struct data_set *d, size_t *size)
{
    Onnx__GraphProto *gr = m->graph;
    int n_const = n_in - first;
    Onnx__NodeProto *cnodes = calloc((size_t)n_const + 1, sizeof *cnodes);
    Onnx__AttributeProto *cattrs = calloc((size_t)n_const + 1, sizeof *cattrs);
    Onnx__AttributeProto **cattr_ptrs = calloc((size_t)n_const + 1, sizeof *cattr_ptrs);
    char **couts = calloc((size_t)n_const + 1, sizeof *couts);
    Onnx__NodeProto **nodes = calloc(gr->n_node + (size_t)n_const + 1, sizeof *nodes);
    Onnx__ValueInfoProto **inputs = calloc(gr->n_input + 1, sizeof *inputs);
    unsigned char *buf = NULL;
    if (!cnodes || !cattrs || !cattr_ptrs || !couts || !nodes || !inputs) goto done;

    size_t n_nodes = 0, n_inputs = 0;
    for (int k = first; k < n_in; k++) {
        int c = k - first;
        onnx__attribute_proto__init(&cattrs[c]);
        cattrs[c].name = "value";
        cattrs[c].has_type = 1;
        cattrs[c].type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR;
        cattrs[c].t = d->in[k];
        cattr_ptrs[c] = &cattrs[c];
        onnx__node_proto__init(&cnodes[c]);
        cnodes[c].op_type = "Constant";
        couts[c] = (char *)in_names[k];
        cnodes[c].n_output = 1;
        cnodes[c].output = &couts[c];
        cnodes[c].n_attribute = 1;
        cnodes[c].attribute = &cattr_ptrs[c];
        nodes[n_nodes++] = &cnodes[c];
    }
    for (size_t i = 0; i < gr->n_node; i++) nodes[n_nodes++] = gr->node[i];
    for (size_t i = 0; i < gr->n_input; i++) {
        bool baked = false;
        for (int k = first; k < n_in; k++) baked |= strcmp(gr->input[i]->name, in_names[k]) == 0;
        if (!baked) inputs[n_inputs++] = gr->input[i];
    }

    Onnx__NodeProto **old_nodes = gr->node;
    Onnx__ValueInfoProto **old_inputs = gr->input;
    size_t old_n_node = gr->n_node, old_n_input = gr->n_input;
    gr->node = nodes;
    gr->n_node = n_nodes;
    gr->input = inputs;
    gr->n_input = n_inputs;
    *size = onnx__model_proto__get_packed_size(m);
    buf = malloc(*size ? *size : 1);
    if (buf) onnx__model_proto__pack(m, buf);
    gr->node = old_nodes;
    gr->n_node = old_n_node;
    gr->input = old_inputs;
    gr->n_input = old_n_input;
done:
    free(cnodes);
    free(cattrs);
    free(cattr_ptrs);
    free(couts);
    free(nodes);
    free(inputs);
    return buf;
}

/* ---- comparing ---- */

static bool close_enough(enum gp_dtype dt, double got, double want)
{
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return got == want;
    double rtol = 1e-4, atol = 1e-5;
    if (dt == GP_DTYPE_FLOAT16) rtol = 1e-3;     /* one rounding step of a half */
    if (dt == GP_DTYPE_BFLOAT16) rtol = 8e-3;
    return fabs(got - want) <= atol + rtol * fabs(want);
}

static enum outcome compare(const char *name, const struct gp_tensor *want, enum gp_dtype dt,
                            const struct gp_shape *shape, void *got_data, struct result *r)
{
    char a[256], b[256];
    if (want->dtype != dt)
        return set(r, FAIL, "output '%s': dtype %s, expected %s", name, gp_dtype_name(dt),
                   gp_dtype_name(want->dtype));
    if (!gp_shape_equal(&want->shape, shape))
        return set(r, FAIL, "output '%s': shape %s, expected %s", name,
                   gp_shape_format(shape, a, sizeof a), gp_shape_format(&want->shape, b, sizeof b));
    struct gp_tensor got = {.dtype = dt, .shape = *shape, .data = got_data};
    int64_t n = gp_shape_numel(shape), bad = 0, first = -1;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        bool ok;
        if (gp_dtype_is_float(dt)) {
            double g = gp_tensor_get_f64(&got, i), w = gp_tensor_get_f64(want, i);
            ok = close_enough(dt, g, w);
            if (!ok && !isnan(g - w) && fabs(g - w) > worst) worst = fabs(g - w);
        } else {
            ok = gp_tensor_get_i64(&got, i) == gp_tensor_get_i64(want, i);
        }
        if (!ok && bad++ == 0) first = i;
    }
    if (!bad) return PASS;
    if (gp_dtype_is_float(dt))
        return set(r, FAIL,
                   "output '%s' %s: %lld of %lld elements differ (largest |diff| %.3g); "
                   "first [%lld]: %.9g, expected %.9g",
                   name, gp_shape_format(shape, a, sizeof a), (long long)bad, (long long)n, worst,
                   (long long)first, gp_tensor_get_f64(&got, first),
                   gp_tensor_get_f64(want, first));
    return set(r, FAIL,
               "output '%s' %s: %lld of %lld elements differ; first [%lld]: %lld, expected %lld",
               name, gp_shape_format(shape, a, sizeof a), (long long)bad, (long long)n,
               (long long)first, (long long)gp_tensor_get_i64(&got, first),
               (long long)gp_tensor_get_i64(want, first));
}

/* ---- running ---- */

/* gp_onnx_tensor, except that a uint16 tensor where the graph has bfloat16
 * is read as bfloat16: ONNX's test generator writes bfloat16 data as uint16
 * (NumPy has no bfloat16), with the same bits. */
static gp_status tensor_for(struct gp_graph *g, const Onnx__TensorProto *tp, enum gp_dtype want,
                            struct gp_tensor **out, struct gp_error *err)
{
    if (want == GP_DTYPE_BFLOAT16 && tp->has_data_type && tp->data_type == GP_DTYPE_UINT16) {
        Onnx__TensorProto copy = *tp;
        copy.data_type = GP_DTYPE_BFLOAT16;
        return gp_onnx_tensor(g, &copy, false, out, err);
    }
    return gp_onnx_tensor(g, tp, false, out, err);
}

/* Training mode when a node asks for it (BatchNormalization training_mode). */
static bool wants_training(const Onnx__ModelProto *m)
{
    for (size_t i = 0; i < m->graph->n_node; i++) {
        const Onnx__NodeProto *n = m->graph->node[i];
        if (strcmp(n->op_type, "BatchNormalization") != 0) continue;
        for (size_t a = 0; a < n->n_attribute; a++)
            if (strcmp(n->attribute[a]->name, "training_mode") == 0 && n->attribute[a]->i)
                return true;
    }
    return false;
}

/* PyTorch's BatchNorm, and ours, update the running variance with the
 * unbiased batch variance; ONNX's reference uses the biased one. When value
 * `id` is a training BatchNormalization's running_var output, `want` is
 * rewritten to PyTorch's: with momentum m, input running variance v0 and n
 * elements per channel, ONNX's want = m v0 + (1 - m) b gives the biased b,
 * and PyTorch's is m v0 + (1 - m) b n / (n - 1). */
static bool bn_running_var_to_unbiased(const struct gp_graph *g, struct gp_cpu_runner *run, int id,
                                       struct gp_tensor *want)
{
    const struct gp_value *v = &g->values[id];
    if (v->producer < 0) return false;
    const struct gp_node *n = &g->nodes[v->producer];
    if (strcmp(n->op_type, "BatchNormalization") != 0 || n->n_outputs < 3 || n->outputs[2] != id ||
        n->n_inputs < 5 || n->inputs[4] < 0 || want->dtype != GP_DTYPE_FLOAT32)
        return false;
    const struct gp_value *x = &g->values[n->inputs[0]], *v0 = &g->values[n->inputs[4]];
    int64_t c = gp_shape_numel(&v0->shape), count = gp_shape_numel(&x->shape) / (c ? c : 1);
    float *var0 = calloc((size_t)(c ? c : 1), sizeof *var0);
    if (!var0 || count < 2 || v0->dtype != GP_DTYPE_FLOAT32) {
        free(var0);
        return false;
    }
    gp_cpu_runner_get_f32(run, n->inputs[4], var0);
    double m = gp_node_attr_float(n, "momentum", 0.9f);
    for (int64_t i = 0; i < c; i++) {
        double biased = (gp_tensor_get_f64(want, i) - m * var0[i]) / (1 - m);
        gp_tensor_set_f64(want, i, m * var0[i] + (1 - m) * biased * count / (count - 1));
    }
    free(var0);
    return true;
}

static enum outcome run_error(struct result *r, const struct gp_error *err)
{
    const char *why = listed_reason(run_rejections, err->msg, true);
    return why ? set(r, SKIP, "%s (kernel: %s)", why, err->msg) : set(r, FAIL, "%s", err->msg);
}

/* Runs data set d on graph g; in_names / out_names are the model's graph
 * inputs and outputs in file order (the order of input_K / output_K). */
static enum outcome run_data_set(struct gp_graph *g, const struct data_set *d,
                                 const char *const *in_names, const char *const *out_names,
                                 bool training, char *note, size_t note_size, struct result *r)
{
    struct gp_error err = {0};
    struct gp_cpu_runner *run = NULL;
    enum outcome o = PASS;
    void *buf = NULL;
    if (gp_cpu_runner_create_f32(g, false, &run, &err) != GP_OK)
        return run_error(r, &err);

    for (int k = 0; k < g->n_inputs && o == PASS; k++) {
        const struct gp_value *v = &g->values[g->inputs[k]];
        int j = 0;
        while (j < d->n_in && strcmp(in_names[j], v->name) != 0) j++;
        if (j == d->n_in) {
            o = set(r, FAIL, "graph input '%s' has no data in %s", v->name, d->name);
            break;
        }
        struct gp_tensor *t = NULL;
        char a[256], b[256];
        if (!d->in[j])
            o = set(r, FAIL, "graph input '%s' is not a tensor", v->name);
        else if (tensor_for(g, d->in[j], v->dtype, &t, &err) != GP_OK)
            o = set(r, FAIL, "%s/input_%d.pb: %s", d->name, j, err.msg);
        else if (t->dtype != v->dtype || !gp_shape_equal(&t->shape, &v->shape))
            o = set(r, FAIL, "%s/input_%d.pb is %s %s, the graph input '%s' %s %s", d->name, j,
                    gp_dtype_name(t->dtype), gp_shape_format(&t->shape, a, sizeof a), v->name,
                    gp_dtype_name(v->dtype), gp_shape_format(&v->shape, b, sizeof b));
        else
            gp_cpu_runner_set_f32(run, g->inputs[k], t->data);
    }
    struct gp_run_opts ro = {.training = training, .update_state = false, .seed = 1, .step = 0,
                             .dropout_ratio = -1};
    if (o == PASS && gp_cpu_runner_forward_f32(run, &ro, 0, g->n_nodes, &err) != GP_OK)
        o = run_error(r, &err);

    for (int k = 0; k < d->n_out && o == PASS; k++) {
        int id = gp_graph_find_value(g, out_names[k]);
        if (id < 0 || !g->values[id].is_output) {
            o = set(r, FAIL, "graph output '%s' is not in the loaded graph", out_names[k]);
            break;
        }
        const struct gp_value *v = &g->values[id];
        struct gp_tensor *want = NULL;
        if (!d->out[k]) {
            o = set(r, FAIL, "graph output '%s' is not a tensor", v->name);
            break;
        }
        if (tensor_for(g, d->out[k], v->dtype, &want, &err) != GP_OK) {
            o = set(r, FAIL, "%s/output_%d.pb: %s", d->name, k, err.msg);
            break;
        }
        int64_t n = gp_shape_numel(&v->shape);
        free(buf);
        buf = calloc((size_t)(n ? n : 1), gp_dtype_size(v->dtype) ? gp_dtype_size(v->dtype) : 1);
        if (!buf || !gp_cpu_runner_data_f32(run, id)) {
            o = set(r, FAIL, "output '%s' has no buffer", v->name);
            break;
        }
        gp_cpu_runner_get_f32(run, id, buf);
        if (training && bn_running_var_to_unbiased(g, run, id, want))
            snprintf(note, note_size, "; '%s' compared as PyTorch's (unbiased)", v->name);
        o = compare(v->name, want, v->dtype, &v->shape, buf, r);
    }
    free(buf);
    gp_cpu_runner_free_f32(run);
    return o;
}

/* The loader's static-shape requirements: only a load failure with one of
 * these messages is retried with the inputs as constants. */
static const struct listed static_requirements[] = {
    {"must be known at load time", "a shape-deciding input is data"},
    {"needs a batch axis", "a graph input without a batch axis"},
    {NULL, NULL},
};

static void append(char *buf, size_t size, const char *s)
{
    size_t len = strlen(buf), n = strlen(s);
    if (len + 1 >= size) return;
    if (n > size - len - 1) n = size - len - 1;
    memcpy(buf + len, s, n);
    buf[len + n] = '\0';
}

/* Loads the model into g: as it is, else with inputs from d turned into
 * constants (`how` says which), unless the loader refused something on
 * purpose. On failure, *rejected is the listed reason when the last
 * attempt's message is a deliberate rejection, else NULL. */
static gp_status load_model(const char *path, const char *dir, Onnx__ModelProto *m,
                            const char *const *in_names, int n_in, const struct data_set *d,
                            struct gp_graph *g, const char **how, const char **rejected,
                            struct gp_error *err)
{
    static const char *const hows[] = {" with inputs after the first as constants",
                                       " with all inputs as constants"};
    *how = "";
    if (gp_onnx_load(path, 0, g, err) == GP_OK) return GP_OK;
    *rejected = listed_reason(load_rejections, err->msg, true);
    if (*rejected || !listed_reason(static_requirements, err->msg, true)) return err->status;
    struct gp_error last = {0};
    int tried = -1;
    for (int from = 1; from >= 0; from--) {
        bool tensors = from < n_in;
        for (int k = from; k < n_in; k++) tensors &= d->in[k] != NULL;
        if (!tensors) continue;
        size_t size;
        unsigned char *buf = bake_inputs(m, in_names, n_in, from, d, &size);
        if (!buf) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
        gp_error_clear(&last);
        gp_status st = gp_onnx_load_buffer(buf, size, dir, 0, g, &last);
        free(buf);
        if (st == GP_OK) {
            *how = hows[1 - from];
            return GP_OK;
        }
        tried = from;
    }
    if (tried >= 0) {
        append(err->msg, sizeof err->msg, "; then");
        append(err->msg, sizeof err->msg, hows[1 - tried]);
        append(err->msg, sizeof err->msg, ": ");
        append(err->msg, sizeof err->msg, last.msg);
        *rejected = listed_reason(load_rejections, last.msg, true);
    }
    return err->status ? err->status : GP_ERR_INVALID;
}

static bool is_tensor_type(const Onnx__ValueInfoProto *v)
{
    return v->type && v->type->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
}

static enum outcome run_test(const char *root, const char *name, struct result *r)
{
    char dir[4096], path[4096 + 16];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    const char *why = listed_reason(skip_tests, name, false);
    if (why) return set(r, SKIP, "%s", why);

    snprintf(path, sizeof path, "%s/model.onnx", dir);
    size_t size;
    unsigned char *bytes = read_file(path, &size);
    if (!bytes) return set(r, FAIL, "cannot read %s", path);
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, size, bytes);
    free(bytes);
    if (!m || !m->graph) {
        if (m) onnx__model_proto__free_unpacked(m, NULL);
        return set(r, FAIL, "model.onnx is not a ModelProto");
    }

    /* Graph inputs fed by input_K.pb: those without an initializer. */
    Onnx__GraphProto *gr = m->graph;
    const char **in_names = calloc(gr->n_input + 1, sizeof *in_names);
    const char **out_names = calloc(gr->n_output + 1, sizeof *out_names);
    bool *is_tensor = calloc(gr->n_input + gr->n_output + 1, sizeof *is_tensor);
    int n_in = 0, n_out = 0;
    if (!in_names || !out_names || !is_tensor) {
        free(in_names);
        free(out_names);
        free(is_tensor);
        onnx__model_proto__free_unpacked(m, NULL);
        return set(r, FAIL, "out of memory");
    }
    for (size_t i = 0; i < gr->n_input; i++) {
        bool init = false;
        for (size_t j = 0; j < gr->n_initializer; j++)
            init |= strcmp(gr->initializer[j]->name, gr->input[i]->name) == 0;
        if (init) continue;
        is_tensor[n_in] = is_tensor_type(gr->input[i]);
        in_names[n_in++] = gr->input[i]->name;
    }
    for (size_t i = 0; i < gr->n_output; i++) {
        is_tensor[n_in + n_out] = is_tensor_type(gr->output[i]);
        out_names[n_out++] = gr->output[i]->name;
    }

    struct dirent **sets = NULL;
    int n_sets = scandir(dir, &sets, only_data_sets, alphasort);
    bool training = wants_training(m);
    enum outcome o = PASS;
    const char *how = "";
    char note[512] = "";
    int nodes_run = 0;
    if (n_sets <= 0) o = set(r, FAIL, "no test_data_set_* folder");
    for (int s = 0; s < n_sets && o == PASS; s++) {
        struct data_set d = {0};
        char sdir[8192];
        snprintf(d.name, sizeof d.name, "%s", sets[s]->d_name);
        snprintf(sdir, sizeof sdir, "%s/%s", dir, sets[s]->d_name);
        o = read_data_set(sdir, n_in, n_out, is_tensor, &d, r);
        struct gp_graph g;
        struct gp_error err = {0};
        const char *deliberate = NULL;
        if (o == PASS && load_model(path, dir, m, in_names, n_in, &d, &g, &how, &deliberate,
                                    &err) != GP_OK) {
            o = deliberate ? set(r, SKIP, "%s (loader: %s)", deliberate, err.msg)
                           : set(r, FAIL, "load: %s", err.msg);
        } else if (o == PASS) {
            nodes_run = g.n_nodes;
            o = run_data_set(&g, &d, in_names, out_names, training, note, sizeof note, r);
            if (o != PASS && n_sets > 1) { /* name the data set: "test_data_set_1: ..." */
                size_t pre = strlen(d.name) + 2, len = strlen(r->msg);
                if (len + pre >= sizeof r->msg) len = sizeof r->msg - pre - 1;
                memmove(r->msg + pre, r->msg, len);
                r->msg[pre + len] = '\0';
                memcpy(r->msg, d.name, pre - 2);
                memcpy(r->msg + pre - 2, ": ", 2);
            }
            gp_graph_free(&g);
        }
        free_data_set(&d);
    }
    for (int s = 0; s < n_sets; s++) free(sets[s]);
    free(sets);
    if (o == PASS) {
        if (nodes_run)
            set(r, PASS, "%d data set%s, %d node%s run%s%s%s", n_sets, n_sets > 1 ? "s" : "",
                nodes_run, nodes_run > 1 ? "s" : "", training ? " in training mode" : "", how,
                note);
        else
            set(r, PASS, "%d data set%s, folded at load time%s%s", n_sets, n_sets > 1 ? "s" : "",
                how, note);
    }
    free(in_names);
    free(out_names);
    free(is_tensor);
    onnx__model_proto__free_unpacked(m, NULL);
    return o;
}

/* ---- main ---- */

static const char *label(enum outcome o)
{
    return o == PASS ? "PASS" : o == SKIP ? "SKIP" : "FAIL";
}

/* Runs one test in a child process so that a crash or a hang fails that
 * test only; the child prints its own line. */
static enum outcome run_isolated(const char *root, const char *name, bool use_fork)
{
    struct result r = {0};
    if (!use_fork) {
        enum outcome o = run_test(root, name, &r);
        printf("%s %s: %s\n", label(o), name, r.msg);
        return o;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        printf("FAIL %s: fork failed\n", name);
        return FAIL;
    }
    if (pid == 0) {
        alarm(120);
        enum outcome o = run_test(root, name, &r);
        printf("%s %s: %s\n", label(o), name, r.msg);
        fflush(stdout);
        exit(o);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {}
    if (WIFEXITED(status) && (WEXITSTATUS(status) == PASS || WEXITSTATUS(status) == SKIP ||
                              WEXITSTATUS(status) == FAIL))
        return (enum outcome)WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        printf("FAIL %s: crashed (signal %d: %s)\n", name, WTERMSIG(status),
               WTERMSIG(status) == SIGALRM ? "took over 120 s" : strsignal(WTERMSIG(status)));
    else
        printf("FAIL %s: child exited with status %d\n", name, WEXITSTATUS(status));
    return FAIL;
}

/* Every op the registry knows must have its node tests in `ops`, so that a
 * newly supported op is not left out of this test; returns how many lack. */
static int unlisted_ops(void)
{
    int missing = 0;
    for (int i = 0; i < gp_op_count(); i++) {
        const struct gp_op_def *d = gp_op_at(i);
        if (d->domain && *d->domain) continue; /* no node tests outside ai.onnx */
        char lower[64];
        const char *want = NULL;
        for (size_t k = 0; k < sizeof test_names / sizeof *test_names; k++)
            if (strcmp(test_names[k].op_type, d->op_type) == 0) want = test_names[k].tests;
        if (!want) {
            size_t n = 0;
            for (const char *c = d->op_type; *c && n + 1 < sizeof lower; c++)
                lower[n++] = (char)(*c >= 'A' && *c <= 'Z' ? *c - 'A' + 'a' : *c);
            lower[n] = '\0';
            want = lower;
        }
        bool found = false;
        for (size_t k = 0; k < sizeof ops / sizeof *ops && !found; k++)
            found = strcmp(ops[k], want) == 0;
        if (!found) {
            printf("FAIL %s: registered, but its node tests (test_%s*) are not in this test's "
                   "list of ops\n", d->op_type, want);
            missing++;
        }
    }
    return missing;
}

int main(int argc, char **argv)
{
    bool use_fork = true;
    int n_filters = 0;
    const char **filters = calloc((size_t)argc + 1, sizeof *filters);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--no-fork") == 0) use_fork = false;
        else filters[n_filters++] = argv[i];
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *root = getenv("GP_ONNX_NODE_TESTS");
    if (!root || !is_dir(root)) {
        printf("ONNX node tests not found at %s: run scripts/fetch_onnx_tests.sh "
               "(and set GP_ONNX_NODE_TESTS when they are elsewhere); skipping\n",
               root ? root : "(GP_ONNX_NODE_TESTS unset)");
        free(filters);
        return SKIP;
    }
    int unlisted = n_filters ? 0 : unlisted_ops();
    struct dirent **tests = NULL;
    int n = scandir(root, &tests, only_tests, alphasort);
    if (n < 0) {
        printf("cannot list %s\n", root);
        free(filters);
        return FAIL;
    }
    int counts[3] = {0}, total = 0, not_passed[2][N_OPS] = {{0}};
    for (int i = 0; i < n; i++) {
        const char *name = tests[i]->d_name;
        bool want = selected(name);
        if (want && n_filters) {
            want = false;
            for (int f = 0; f < n_filters; f++) want |= strstr(name, filters[f]) != NULL;
        }
        if (want) {
            enum outcome o = run_isolated(root, name, use_fork);
            counts[o == PASS ? 0 : o == SKIP ? 1 : 2]++;
            total++;
            if (o != PASS) { /* tallied under the longest op name it belongs to */
                size_t best = 0;
                for (size_t k = 0; k < N_OPS; k++)
                    if (name_has_op(name, ops[k]) && strlen(ops[k]) > strlen(ops[best])) best = k;
                if (name_has_op(name, ops[best])) not_passed[o == SKIP ? 0 : 1][best]++;
            }
        }
        free(tests[i]);
    }
    free(tests);
    free(filters);
    printf("conformance: %d tests of %d in %s: %d passed, %d skipped, %d failed\n", total, n,
           root, counts[0], counts[1], counts[2]);
    for (int k = 0; k < 2; k++) {
        if (!counts[k + 1]) continue;
        printf("conformance: %s by op:", k ? "failed" : "skipped");
        for (size_t j = 0; j < N_OPS; j++)
            if (not_passed[k][j]) printf(" %s %d", ops[j], not_passed[k][j]);
        printf("\n");
    }
    if (unlisted) printf("conformance: %d registered ops have no node tests listed\n", unlisted);
    return counts[2] || unlisted ? FAIL : PASS;
}
