/* Channels-last storage (graph/layout.h): which activations the pass tags
 * on graphs built by hand and on the shipped models, the layout-neutral
 * calls, the --layout policy; and that the CPU backend, which reads no
 * layout itself and so computes every tagged call on [N, C, H, W] copies,
 * trains a tagged graph to the bits of the untagged one (losses and saved
 * models byte for byte) in fp32 and bf16, on one device and on pipelines
 * of CPU devices under every checkpoint mode: the reference the GPU's
 * channels-last kernels are compared with. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "graph/build.h"
#include "graph/layout.h"
#include "onnx/load.h"
#include "train/trainer.h"

#define S(...) ((const char *const[]){__VA_ARGS__})

/* ---- building graphs ---- */

static void init(struct gp_graph *g)
{
    struct gp_error err = {0};
    assert_int_equal(gp_graph_init(g, 2, 17, 128, 64, &err), GP_OK);
}

static void input(struct gp_graph *g, const char *name, int64_t c, int64_t hw)
{
    struct gp_error err = {0};
    struct gp_shape s = {.rank = 4, .dims = {1, c, hw, hw}};
    assert_int_equal(gp_graph_add_input(g, name, GP_DTYPE_FLOAT32, &s, &err), GP_OK);
}

/* A float32 constant of the given shape, every element 0.5. */
static void weight(struct gp_graph *g, const char *name, int rank, const int64_t *dims)
{
    struct gp_error err = {0};
    struct gp_shape s = {.rank = rank};
    for (int i = 0; i < rank; i++) s.dims[i] = dims[i];
    int64_t n = gp_shape_numel(&s);
    float *data = malloc(sizeof(float) * (size_t)(n ? n : 1));
    assert_non_null(data);
    for (int64_t i = 0; i < n; i++) data[i] = 0.5f;
    gp_status st = gp_graph_add_const_f32(g, name, &s, data, &err);
    free(data);
    if (st != GP_OK) fail_msg("%s", err.msg);
}

static int node(struct gp_graph *g, const char *op, const char *name, int ni, const char *const *in, int no,
                const char *const *out)
{
    struct gp_error err = {0};
    int id = gp_graph_add_node(g, op, "", name, ni, in, no, out, &err);
    if (id < 0) fail_msg("%s", err.msg);
    return id;
}

static void attr_ints(struct gp_graph *g, int n, const char *name, int count, const int64_t *v)
{
    struct gp_error err = {0};
    struct gp_attr *a = gp_graph_add_attr(g, n, name, GP_ATTR_INTS, 8, &err);
    if (!a) fail_msg("%s", err.msg);
    a->count = count;
    a->ints = gp_arena_memdup(&g->arena, v, sizeof *v * (size_t)count);
}

static void attr_i(struct gp_graph *g, int n, const char *name, int64_t v)
{
    struct gp_error err = {0};
    struct gp_attr *a = gp_graph_add_attr(g, n, name, GP_ATTR_INT, 8, &err);
    if (!a) fail_msg("%s", err.msg);
    a->i = v;
}

/* y = Conv(x) with `cout` 3x3 filters over `cin` channels, padded to keep H, W. */
static void conv(struct gp_graph *g, const char *x, const char *y, int64_t cin, int64_t cout)
{
    char w[64];
    snprintf(w, sizeof w, "%s.w", y);
    weight(g, w, 4, (int64_t[]){cout, cin, 3, 3});
    int n = node(g, "Conv", y, 2, (const char *const[]){x, w}, 1, S(y));
    attr_ints(g, n, "kernel_shape", 2, (int64_t[]){3, 3});
    attr_ints(g, n, "pads", 4, (int64_t[]){1, 1, 1, 1});
}

/* y = BatchNormalization(x) over c channels (inference form: one output). */
static void batch_norm(struct gp_graph *g, const char *x, const char *y, int64_t c)
{
    static const char *const parts[] = {"scale", "bias", "mean", "var"};
    char names[4][64];
    for (int i = 0; i < 4; i++) {
        snprintf(names[i], sizeof names[i], "%s.%s", y, parts[i]);
        weight(g, names[i], 1, &c);
    }
    node(g, "BatchNormalization", y, 5, (const char *const[]){x, names[0], names[1], names[2], names[3]}, 1, S(y));
}

static void output(struct gp_graph *g, const char *name)
{
    struct gp_error err = {0};
    assert_int_equal(gp_graph_add_output(g, name, &err), GP_OK);
}

static void finalize(struct gp_graph *g)
{
    struct gp_error err = {0};
    if (gp_graph_finalize(g, &err) != GP_OK) fail_msg("finalize: %s", err.msg);
}

static bool tagged(const struct gp_graph *g, const char *name)
{
    int v = gp_graph_find_value(g, name);
    if (v < 0) fail_msg("no value '%s'", name);
    return g->values[v].channels_last;
}

/* Every name in `yes` tagged and every name in `no` not. */
static void expect_tags(const struct gp_graph *g, const char *const *yes, int n_yes, const char *const *no, int n_no)
{
    for (int i = 0; i < n_yes; i++)
        if (!tagged(g, yes[i])) fail_msg("'%s' is not channels-last", yes[i]);
    for (int i = 0; i < n_no; i++)
        if (tagged(g, no[i])) fail_msg("'%s' is channels-last", no[i]);
}

/* Fails unless gp_layout_why_not explains value `name` with a line
 * containing `needle`. */
static void expect_why(const struct gp_graph *g, const char *name, const char *needle)
{
    char why[512] = "";
    int v = gp_graph_find_value(g, name);
    if (v < 0) fail_msg("no value '%s'", name);
    if (!gp_layout_why_not(g, v, why, sizeof why)) fail_msg("'%s': no reason given for [N, C, H, W]", name);
    if (!strstr(why, needle)) fail_msg("'%s': the reason '%s' lacks '%s'", name, why, needle);
}

/* ---- invariants any tagging must keep ---- */

static bool is_op(const struct gp_node *n, const char *op) { return !strcmp(n->op_type, op); }

/* What the header promises of each tagged value: a rank-4 float32
 * activation made by a node, not a graph input or output, made
 * channels-last by its producer (a 2-D Conv; a follower, BatchNormalization,
 * InstanceNormalization, Dropout, Resize or MaxPool, of a tagged input; a
 * Concat of tagged inputs; a neutral op whose call then runs as the
 * tensors lie), and read as it lies by every reader: a Conv's image, a
 * follower's input, a Concat tagged with all its inputs,
 * GlobalAveragePool, or a neutral op whose own call
 * runs as its tensors lie (gp_layout_neutral_call). A neutral reader that
 * would get a copy (its other operand broadcast, its output untagged) means
 * the tag costs a transposition instead of saving one. */
static bool is_follower(const struct gp_node *n)
{
    return is_op(n, "BatchNormalization") || is_op(n, "InstanceNormalization") || is_op(n, "Dropout") ||
           is_op(n, "MaxPool") || is_op(n, "Resize") || is_op(n, "Upsample");
}

/* A Concat whose inputs are all tagged (it then writes its output tagged). */
static bool concat_all_tagged(const struct gp_graph *g, const struct gp_node *n)
{
    if (!is_op(n, "Concat")) return false;
    for (int k = 0; k < n->n_inputs; k++)
        if (!g->values[n->inputs[k]].channels_last) return false;
    return g->values[n->outputs[0]].channels_last;
}

static void check_invariants(const struct gp_graph *g, const char *what)
{
    for (int v = 0; v < g->n_values; v++) {
        const struct gp_value *val = &g->values[v];
        if (!val->channels_last) continue;
        if (val->kind != GP_VALUE_ACTIVATION || val->producer < 0 || val->is_output || val->shape.rank != 4 ||
            val->dtype != GP_DTYPE_FLOAT32)
            fail_msg("%s: '%s' is tagged but is not a rank-4 float activation inside the graph", what, val->name);
        const struct gp_node *p = &g->nodes[val->producer];
        bool made = is_op(p, "Conv") ||
                    (is_follower(p) && g->values[p->inputs[0]].channels_last &&
                     (!p->fused_add || g->values[p->inputs[5]].channels_last)) ||
                    concat_all_tagged(g, p) ||
                    (gp_layout_neutral_op(p) &&
                     gp_layout_neutral_call(g, p, gp_layout_in_mask(g, p), gp_layout_out_mask(g, p)));
        if (!made) fail_msg("%s: '%s' is tagged but its producer %s does not make it channels-last", what, val->name,
                            p->op_type);
        for (int i = 0; i < g->n_nodes; i++) {
            const struct gp_node *n = &g->nodes[i];
            for (int k = 0; k < n->n_inputs; k++) {
                if (n->inputs[k] != v) continue;
                /* A BatchNorm's fused residual (input 5) lies as its input 0. */
                bool residual = is_op(n, "BatchNormalization") && n->fused_add && k == 5 &&
                                g->values[n->inputs[0]].channels_last;
                bool reads = ((is_op(n, "Conv") || is_follower(n)) && k == 0) || residual || concat_all_tagged(g, n) ||
                             is_op(n, "GlobalAveragePool") ||
                             (gp_layout_neutral_op(n) &&
                              gp_layout_neutral_call(g, n, gp_layout_in_mask(g, n), gp_layout_out_mask(g, n)));
                if (!reads)
                    fail_msg("%s: '%s' is tagged but layer %d (%s '%s') reads it as input %d through a copy", what,
                             val->name, i, n->op_type, n->name, k);
            }
        }
    }
    for (int i = 0; i < g->n_inputs; i++) assert_false(g->values[g->inputs[i]].channels_last);
    for (int i = 0; i < g->n_outputs; i++) assert_false(g->values[g->outputs[i]].channels_last);
}

/* ---- the pass on graphs built by hand ---- */

/* A residual block as torchvision writes it, then the classifier head:
 *   c1 = Conv(x); r1 = Relu(BN(c1)); c2 = Conv(r1); b2 = BN(c2);
 *   r2 = Relu(Add(b2, r1)); p = MaxPool(r2); r3 = Relu(p);
 *   y = Gemm(Flatten(GlobalAveragePool(r3)))
 * (the first two Relus fuse into the BN and the Add before them; r3, after
 * a MaxPool, stays a Relu). */
static void test_residual_block(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g);
    input(&g, "x", 3, 8);
    conv(&g, "x", "c1", 3, 4);
    batch_norm(&g, "c1", "b1", 4);
    node(&g, "Relu", "relu1", 1, S("b1"), 1, S("r1"));
    conv(&g, "r1", "c2", 4, 4);
    batch_norm(&g, "c2", "b2", 4);
    node(&g, "Add", "add", 2, S("b2", "r1"), 1, S("sum"));
    node(&g, "Relu", "relu2", 1, S("sum"), 1, S("r2"));
    int mp = node(&g, "MaxPool", "pool", 1, S("r2"), 1, S("p"));
    attr_ints(&g, mp, "kernel_shape", 2, (int64_t[]){2, 2});
    attr_ints(&g, mp, "strides", 2, (int64_t[]){2, 2});
    node(&g, "Relu", "relu3", 1, S("p"), 1, S("r3"));
    node(&g, "GlobalAveragePool", "gap", 1, S("r3"), 1, S("gap"));
    node(&g, "Flatten", "flatten", 1, S("gap"), 1, S("flat"));
    weight(&g, "fc.w", 2, (int64_t[]){10, 4});
    weight(&g, "fc.b", 1, (int64_t[]){10});
    int fc = node(&g, "Gemm", "fc", 3, S("flat", "fc.w", "fc.b"), 1, S("y"));
    attr_i(&g, fc, "transB", 1);
    output(&g, "y");
    finalize(&g);
    /* The Relu after the first BN fused into it, the Add and its Relu
     * into the second BN (gp_node.fused_add): r1 and r2 are made by
     * BatchNormalizations, r2 reading r1 as its residual (input 5) in
     * r1's layout. */
    assert_int_equal(g.n_nodes, 9);
    assert_true(g.nodes[g.values[gp_graph_find_value(&g, "r1")].producer].fused_relu);
    const struct gp_node *bn2 = &g.nodes[g.values[gp_graph_find_value(&g, "r2")].producer];
    assert_true(bn2->fused_add && bn2->fused_relu && bn2->n_inputs == 6);
    assert_int_equal(bn2->inputs[5], gp_graph_find_value(&g, "r1"));

    assert_int_equal(gp_graph_channels_last(&g), 6);
    expect_tags(&g, S("c1", "r1", "c2", "r2", "p", "r3"), 6, S("x", "gap", "flat", "y"), 4);
    assert_int_equal(gp_graph_channels_last_count(&g), 6);
    check_invariants(&g, "residual block");
    /* The pass starts from scratch: run again, the same tags. */
    assert_int_equal(gp_graph_channels_last(&g), 6);
    gp_graph_clear_layout(&g);
    assert_int_equal(gp_graph_channels_last_count(&g), 0);
    gp_graph_free(&g);
}

/* The benchmark U-Net's cell, twice, then a Conv: c = Conv(x);
 * d, mask = Dropout(c); n = InstanceNormalization(d); r = LeakyRelu(n).
 * The Dropout and InstanceNorm follow their input's layout, LeakyRelu is
 * neutral: every activation is tagged but the masks (bool, drawn and
 * stored [N, C, H, W] in either layout) and the last Conv's output, a
 * graph output. */
static void test_unet_cell(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g);
    input(&g, "x", 3, 8);
    struct gp_error err = {0};
    assert_int_equal(gp_graph_add_const_f32(&g, "ratio", &(struct gp_shape){.rank = 0}, (float[]){0.25f}, &err),
                     GP_OK);
    for (int cell = 0; cell < 2; cell++) {
        char c[16], d[16], m[16], n[16], r[16], sc[16], bi[16];
        snprintf(c, sizeof c, "c%d", cell);
        snprintf(d, sizeof d, "d%d", cell);
        snprintf(m, sizeof m, "mask%d", cell);
        snprintf(n, sizeof n, "n%d", cell);
        snprintf(r, sizeof r, "r%d", cell);
        snprintf(sc, sizeof sc, "scale%d", cell);
        snprintf(bi, sizeof bi, "bias%d", cell);
        conv(&g, cell ? "r0" : "x", c, cell ? 4 : 3, 4);
        node(&g, "Dropout", d, 2, (const char *const[]){c, "ratio"}, 2, (const char *const[]){d, m});
        weight(&g, sc, 1, (int64_t[]){4});
        weight(&g, bi, 1, (int64_t[]){4});
        node(&g, "InstanceNormalization", n, 3, (const char *const[]){d, sc, bi}, 1, (const char *const[]){n});
        node(&g, "LeakyRelu", r, 1, (const char *const[]){n}, 1, (const char *const[]){r});
    }
    conv(&g, "r1", "y", 4, 2);
    output(&g, "y");
    finalize(&g);

    assert_int_equal(gp_graph_channels_last(&g), 8);
    expect_tags(&g, S("c0", "d0", "n0", "r0", "c1", "d1", "n1", "r1"), 8, S("x", "mask0", "mask1", "y"), 4);
    check_invariants(&g, "U-Net cell");
    gp_graph_free(&g);
}

/* A U-Net decoder step: up = Resize(c1) (nearest, x2), cat = Concat(up,
 * c2) along the channels, then a Conv: all tagged, Resize following its
 * input and Concat its inputs. A Concat with an untagged input (a graph
 * input) stays [N, C, H, W], and so does its tagged input's Conv. */
static void test_concat_resize(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g);
    input(&g, "x", 3, 4);
    input(&g, "x8", 4, 8);
    struct gp_error err = {0};
    assert_int_equal(gp_graph_add_const_f32(&g, "scales", &(struct gp_shape){.rank = 1, .dims = {4}},
                                            (float[]){1, 1, 2, 2}, &err),
                     GP_OK);
    conv(&g, "x", "c1", 3, 4);
    node(&g, "Resize", "up", 3, S("c1", "", "scales"), 1, S("up"));
    conv(&g, "x8", "c2", 4, 4);
    attr_i(&g, node(&g, "Concat", "cat", 2, S("up", "c2"), 1, S("cat")), "axis", 1);
    conv(&g, "cat", "y", 8, 2);
    output(&g, "y");
    conv(&g, "x8", "c3", 4, 4);
    attr_i(&g, node(&g, "Concat", "cat_in", 2, S("c3", "x8"), 1, S("cat_in")), "axis", 1);
    conv(&g, "cat_in", "y2", 8, 2);
    output(&g, "y2");
    finalize(&g);

    assert_int_equal(gp_graph_channels_last(&g), 4);
    expect_tags(&g, S("c1", "up", "c2", "cat"), 4, S("x", "x8", "y", "c3", "cat_in", "y2"), 6);
    check_invariants(&g, "Concat and Resize");
    gp_graph_free(&g);
}

/* A Conv whose reader takes [N, C, H, W] (Softmax over the channels,
 * Reshape) keeps the model's layout, as does a Conv with one such reader
 * among others, or one read by an InstanceNormalization whose output is a
 * graph output (a follower reads both or neither channels-last); a
 * BatchNormalization after an untagged Conv follows it. */
static void test_readers_refuse(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g);
    input(&g, "x", 3, 4);
    conv(&g, "x", "c_soft", 3, 4);
    int sm = node(&g, "Softmax", "softmax", 1, S("c_soft"), 1, S("soft"));
    attr_i(&g, sm, "axis", 1);
    output(&g, "soft");

    conv(&g, "x", "c_in", 3, 4);
    weight(&g, "in.scale", 1, (int64_t[]){4});
    weight(&g, "in.bias", 1, (int64_t[]){4});
    node(&g, "InstanceNormalization", "inorm", 3, S("c_in", "in.scale", "in.bias"), 1, S("inormed"));
    output(&g, "inormed");

    conv(&g, "x", "c_reshape", 3, 4);
    struct gp_error err = {0};
    assert_int_equal(gp_graph_add_const_i64(&g, "flat_shape", &(struct gp_shape){.rank = 1, .dims = {2}},
                                            (int64_t[]){2, -1}, &err),
                     GP_OK);
    node(&g, "Reshape", "reshape", 2, S("c_reshape", "flat_shape"), 1, S("reshaped"));
    output(&g, "reshaped");

    /* Read by a BatchNormalization (channels-last) and by a Softmax (not). */
    conv(&g, "x", "c_both", 3, 4);
    batch_norm(&g, "c_both", "bn_both", 4);
    conv(&g, "bn_both", "c_after", 4, 4);
    output(&g, "c_after");
    int sm2 = node(&g, "Softmax", "softmax2", 1, S("c_both"), 1, S("soft2"));
    attr_i(&g, sm2, "axis", 1);
    output(&g, "soft2");
    finalize(&g);

    assert_int_equal(gp_graph_channels_last(&g), 0);
    expect_tags(&g, NULL, 0, S("c_soft", "c_in", "c_reshape", "c_both", "bn_both", "c_after"), 6);
    check_invariants(&g, "refusing readers");
    /* Why each stays [N, C, H, W] (what inspect --layout nhwc prints). */
    expect_why(&g, "c_soft", "read by Softmax 'softmax' (input 0), which reads [N, C, H, W]");
    expect_why(&g, "c_in", "read by InstanceNormalization 'inorm', whose output stays");
    expect_why(&g, "inormed", "a graph output");
    expect_why(&g, "c_reshape", "read by Reshape 'reshape'");
    expect_why(&g, "c_both", "read by Softmax 'softmax2'");
    expect_why(&g, "bn_both", "its input 'c_both' is [N, C, H, W]");
    char why[64];
    assert_false(gp_layout_why_not(&g, gp_graph_find_value(&g, "x"), why, sizeof why)); /* a graph input */
    gp_graph_free(&g);
}

/* A neutral op runs on tensors as they lie only when every operand has its
 * output's shape or is a scalar: Mul by a [1, C, 1, 1] scale would read the
 * scale at NCHW positions. Such a Mul gets [N, C, H, W] copies, so neither
 * its output nor the Conv output it reads is tagged (a tag there would buy
 * a transposition on each side for nothing); a Mul by a scalar and an Add
 * of two tagged tensors are tagged. */
static void test_broadcast_operand(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g);
    input(&g, "x", 3, 4);
    /* Mul by a per-channel scale, then another Conv. */
    conv(&g, "x", "c_scaled", 3, 4);
    weight(&g, "chan_scale", 4, (int64_t[]){1, 4, 1, 1});
    node(&g, "Mul", "mul_chan", 2, S("c_scaled", "chan_scale"), 1, S("scaled"));
    conv(&g, "scaled", "c_next", 4, 4);
    output(&g, "c_next");
    /* Mul by a scalar, Add of two tagged operands, then a Conv. */
    conv(&g, "x", "c_a", 3, 4);
    conv(&g, "x", "c_b", 3, 4);
    weight(&g, "half", 0, NULL);
    node(&g, "Mul", "mul_scalar", 2, S("c_a", "half"), 1, S("halved"));
    node(&g, "Add", "add", 2, S("halved", "c_b"), 1, S("summed"));
    conv(&g, "summed", "c_end", 4, 4);
    output(&g, "c_end");
    /* Add of two Conv outputs, one [N, C, 1, 1] broadcast over the other:
     * both could lie channels-last, but the Add cannot run on them so. */
    input(&g, "x1", 3, 1);
    conv(&g, "x", "c_full", 3, 4);
    conv(&g, "x1", "c_pixel", 3, 4);
    node(&g, "Add", "add_bcast", 2, S("c_full", "c_pixel"), 1, S("bsum"));
    conv(&g, "bsum", "c_bsum", 4, 4);
    output(&g, "c_bsum");
    finalize(&g);

    gp_graph_channels_last(&g);
    expect_tags(&g, S("c_a", "c_b", "halved", "summed"), 4, S("scaled", "c_next", "c_end", "bsum", "c_bsum"), 5);
    if (tagged(&g, "c_scaled"))
        fail_msg("'c_scaled' is tagged though its only reader, Mul by a [1, C, 1, 1] scale, gets an NCHW copy");
    if (tagged(&g, "c_full") || tagged(&g, "c_pixel"))
        fail_msg("'c_full' or 'c_pixel' is tagged though their only reader, a broadcasting Add, gets NCHW copies");
    check_invariants(&g, "broadcast operand");
    gp_graph_free(&g);
}

/* Graph outputs stay as the model says, whatever makes them: a Conv's, a
 * BatchNormalization's (and then the Conv before it writes [N, C, H, W]
 * too: BatchNorm reads both or neither channels-last), and a Conv output
 * that is both a graph output and read by another Conv. */
static void test_graph_outputs(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g);
    input(&g, "x", 3, 4);
    conv(&g, "x", "c_out", 3, 4);
    output(&g, "c_out");
    conv(&g, "x", "c_bn", 3, 4);
    batch_norm(&g, "c_bn", "bn_out", 4);
    output(&g, "bn_out");
    conv(&g, "x", "c_shared", 3, 4);
    output(&g, "c_shared");
    conv(&g, "c_shared", "c_last", 4, 4);
    output(&g, "c_last");
    finalize(&g);

    assert_int_equal(gp_graph_channels_last(&g), 0);
    expect_tags(&g, NULL, 0, S("x", "c_out", "c_bn", "bn_out", "c_shared", "c_last"), 6);
    check_invariants(&g, "graph outputs");
    gp_graph_free(&g);
}

/* gp_layout_neutral_call: which calls of which ops run as their tensors lie. */
static void test_neutral_call(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g);
    input(&g, "a", 4, 3);
    input(&g, "b", 4, 3);
    weight(&g, "scalar", 0, NULL);
    weight(&g, "one", 1, (int64_t[]){1});
    weight(&g, "per_channel", 4, (int64_t[]){1, 4, 1, 1});
    node(&g, "Add", "add", 2, S("a", "b"), 1, S("add_out"));
    node(&g, "Mul", "mul_scalar", 2, S("scalar", "a"), 1, S("mul_s_out"));
    node(&g, "Mul", "mul_one", 2, S("a", "one"), 1, S("mul_1_out"));
    node(&g, "Mul", "mul_chan", 2, S("a", "per_channel"), 1, S("mul_c_out"));
    node(&g, "Relu", "relu", 1, S("a"), 1, S("relu_out"));
    attr_i(&g, node(&g, "Softmax", "softmax", 1, S("a"), 1, S("soft_out")), "axis", 1);
    node(&g, "Dropout", "dropout", 1, S("a"), 1, S("drop_out"));
    node(&g, "GlobalAveragePool", "gap", 1, S("a"), 1, S("gap_out"));
    static const char *const names[] = {"add", "mul_scalar", "mul_one", "mul_chan", "relu", "softmax", "dropout", "gap"};
    static const char *const outs[] = {"add_out", "mul_s_out", "mul_1_out", "mul_c_out",
                                       "relu_out", "soft_out", "drop_out", "gap_out"};
    for (int i = 0; i < 8; i++) output(&g, outs[i]);
    finalize(&g);
    /* Finalize sorts the nodes: find them by name. */
    const struct gp_node *n[8];
    for (int i = 0; i < 8; i++) {
        n[i] = NULL;
        for (int j = 0; j < g.n_nodes; j++)
            if (!strcmp(g.nodes[j].name, names[i])) n[i] = &g.nodes[j];
        if (!n[i]) fail_msg("no node '%s'", names[i]);
    }
    /* Another domain's Relu is not ONNX's (built by hand: finalize would
     * refuse the unknown domain). */
    const struct gp_node custom = {.name = "custom_relu", .op_type = "Relu", .domain = "com.example"};
    const struct gp_node *n_add = n[0], *n_mul_s = n[1], *n_mul_1 = n[2], *n_mul_c = n[3], *n_relu = n[4],
                         *n_soft = n[5], *n_drop = n[6], *n_gap = n[7];

    assert_true(gp_layout_neutral_op(n_add) && gp_layout_neutral_op(n_relu) && gp_layout_neutral_op(n_mul_c));
    /* Dropout's mask depends on the position; Softmax and GlobalAveragePool
     * reduce over axes; another domain's Relu is not ONNX's. */
    assert_false(gp_layout_neutral_op(n_drop));
    assert_false(gp_layout_neutral_op(n_soft));
    assert_false(gp_layout_neutral_op(n_gap));
    assert_false(gp_layout_neutral_op(&custom));

    /* Nothing channels-last: any op runs as it is. */
    assert_true(gp_layout_neutral_call(&g, n_soft, 0, 0));
    assert_true(gp_layout_neutral_call(&g, n_drop, 0, 0));
    /* Every tensor channels-last. */
    assert_true(gp_layout_neutral_call(&g, n_add, 0x3, 0x1));
    assert_true(gp_layout_neutral_call(&g, n_relu, 0x1, 0x1));
    /* A mix of layouts among full-size tensors. */
    assert_false(gp_layout_neutral_call(&g, n_add, 0x1, 0x1));
    assert_false(gp_layout_neutral_call(&g, n_add, 0x2, 0x1));
    assert_false(gp_layout_neutral_call(&g, n_add, 0x3, 0x0));
    assert_false(gp_layout_neutral_call(&g, n_relu, 0x1, 0x0));
    assert_false(gp_layout_neutral_call(&g, n_relu, 0x0, 0x1));
    /* A scalar operand (rank 0 or one element) is the same in any layout. */
    assert_true(gp_layout_neutral_call(&g, n_mul_s, 0x2, 0x1));
    assert_true(gp_layout_neutral_call(&g, n_mul_1, 0x1, 0x1));
    /* A broadcast [1, C, 1, 1] operand is not. */
    assert_false(gp_layout_neutral_call(&g, n_mul_c, 0x1, 0x1));
    /* Not neutral: any channels-last tensor needs copies. */
    assert_false(gp_layout_neutral_call(&g, n_soft, 0x1, 0x1));
    assert_false(gp_layout_neutral_call(&g, n_drop, 0x1, 0x1));
    assert_false(gp_layout_neutral_call(&g, n_gap, 0x1, 0x0));
    gp_graph_free(&g);
}

static void test_policy(void **state)
{
    (void)state;
    enum gp_layout_policy p = GP_LAYOUT_NCHW;
    assert_true(gp_layout_policy_parse("auto", &p));
    assert_int_equal(p, GP_LAYOUT_AUTO);
    assert_true(gp_layout_policy_parse("nchw", &p));
    assert_int_equal(p, GP_LAYOUT_NCHW);
    assert_true(gp_layout_policy_parse("nhwc", &p));
    assert_int_equal(p, GP_LAYOUT_NHWC);
    p = GP_LAYOUT_AUTO;
    assert_true(gp_layout_policy_parse("channels-last", &p));
    assert_int_equal(p, GP_LAYOUT_NHWC);
    /* A bad name leaves the policy as it was. */
    p = GP_LAYOUT_NCHW;
    assert_false(gp_layout_policy_parse("bogus", &p));
    assert_false(gp_layout_policy_parse("", &p));
    assert_false(gp_layout_policy_parse("NHWC", &p));
    assert_int_equal(p, GP_LAYOUT_NCHW);
    /* Names parse back to their policy. */
    const enum gp_layout_policy all[] = {GP_LAYOUT_AUTO, GP_LAYOUT_NCHW, GP_LAYOUT_NHWC};
    for (int i = 0; i < 3; i++) {
        enum gp_layout_policy q;
        assert_true(gp_layout_policy_parse(gp_layout_policy_name(all[i]), &q));
        assert_int_equal(q, all[i]);
    }
    assert_string_equal(gp_layout_policy_name(GP_LAYOUT_AUTO), "auto");
    assert_string_equal(gp_layout_policy_name(GP_LAYOUT_NCHW), "nchw");
    assert_string_equal(gp_layout_policy_name(GP_LAYOUT_NHWC), "nhwc");
    /* auto: channels-last only where every stage is on a GPU. */
    assert_true(gp_layout_policy_on(GP_LAYOUT_AUTO, true));
    assert_false(gp_layout_policy_on(GP_LAYOUT_AUTO, false));
    assert_true(gp_layout_policy_on(GP_LAYOUT_NHWC, true));
    assert_true(gp_layout_policy_on(GP_LAYOUT_NHWC, false));
    assert_false(gp_layout_policy_on(GP_LAYOUT_NCHW, true));
    assert_false(gp_layout_policy_on(GP_LAYOUT_NCHW, false));
}

/* ---- the shipped models ---- */

static void load(const char *fixture, struct gp_graph *g)
{
    char path[4096];
    fixture_path(fixture, path, sizeof path);
    struct gp_error err = {0};
    if (gp_onnx_load(path, 4, g, &err) != GP_OK) fail_msg("%s: %s", fixture, err.msg);
}

/* The tags the pass gives the fixtures: digits_cnn's first convolution
 * and BatchNorm (its MaxPool's output is read by Flatten, so the MaxPool
 * reads [N, C, H, W] and so does what feeds it);
 * resnet's every activation from the stem to the last residual block (16:
 * 8 Convs, 8 BatchNorms, 3 of them with the residual Add fused;
 * GlobalAveragePool's output is not);
 * unet's where no ConvTranspose reads or writes (13, below); nothing in
 * the models without convolutions; and the invariants on each. */
static void test_fixtures(void **state)
{
    (void)state;
    struct gp_graph g;
    load("digits_cnn_op17.onnx", &g);
    assert_int_equal(gp_graph_channels_last(&g), 2);
    for (int i = 0; i < 4; i++) {
        const struct gp_node *n = &g.nodes[i];
        if (g.values[n->outputs[0]].channels_last != (i < 2))
            fail_msg("digits_cnn: layer %d (%s) is %s", i, n->op_type, i < 2 ? "not tagged" : "tagged");
    }
    assert_true(is_op(&g.nodes[4], "MaxPool"));
    assert_false(g.values[g.nodes[4].outputs[0]].channels_last);
    check_invariants(&g, "digits_cnn");
    gp_graph_free(&g);

    load("resnet_op17.onnx", &g);
    assert_int_equal(gp_graph_channels_last(&g), 16);
    for (int i = 0; i < g.n_nodes; i++) {
        const struct gp_node *n = &g.nodes[i];
        bool want = is_op(n, "Conv") || is_op(n, "BatchNormalization") || is_op(n, "Add");
        if (g.values[n->outputs[0]].channels_last != want)
            fail_msg("resnet: layer %d (%s '%s') is %s", i, n->op_type, n->name,
                     want ? "not tagged" : "tagged");
    }
    check_invariants(&g, "resnet");
    gp_graph_free(&g);

    load("unet_op17.onnx", &g);
    /* Tagged: layers 4-13 (Conv, BatchNorm, LeakyRelu, MaxPool, Conv,
     * BatchNorm, LeakyRelu, Dropout, Resize, Concat) and 19-21 (Conv,
     * InstanceNorm, LeakyRelu). Not: the first block (0-3), whose LeakyRelu
     * the last Concat (18) reads beside the ConvTranspose's output, which
     * no channels-last kernel writes; the block 14-16 that feeds that
     * ConvTranspose, which reads [N, C, H, W]; the last Conv, a graph
     * output. */
    int unet = gp_graph_channels_last(&g);
    assert_int_equal(unet, 13);
    for (int i = 0; i < g.n_nodes; i++) {
        const struct gp_node *n = &g.nodes[i];
        bool want = (i >= 4 && i <= 13) || (i >= 19 && i <= 21);
        if (g.values[n->outputs[0]].channels_last != want)
            fail_msg("unet: layer %d (%s '%s') is %s", i, n->op_type, n->name, want ? "not tagged" : "tagged");
    }
    assert_true(is_op(&g.nodes[11], "Dropout") && is_op(&g.nodes[12], "Resize") && is_op(&g.nodes[13], "Concat"));
    assert_true(is_op(&g.nodes[17], "ConvTranspose") && is_op(&g.nodes[20], "InstanceNormalization"));
    check_invariants(&g, "unet");
    /* The reasons chain back to the root: the first block's LeakyRelu is
     * read by the last Concat, whose other input the ConvTranspose writes
     * [N, C, H, W]. */
    expect_why(&g, g.values[g.nodes[0].outputs[0]].name, "read by InstanceNormalization");
    expect_why(&g, g.values[g.nodes[2].outputs[0]].name, "read by Concat");
    expect_why(&g, g.values[g.nodes[18].outputs[0]].name, "ConvTranspose_output_0' is [N, C, H, W]");
    expect_why(&g, g.values[g.nodes[16].outputs[0]].name, "read by ConvTranspose");
    gp_graph_free(&g);

    /* Models without 2-D convolutions: nothing to tag. */
    static const char *const flat[] = {"mlp_op17.onnx", "gpt_op17.onnx"};
    for (int i = 0; i < 2; i++) {
        load(flat[i], &g);
        assert_int_equal(gp_graph_channels_last(&g), 0);
        gp_graph_free(&g);
    }
    printf("tagged: digits_cnn 2, resnet 16, unet %d\n", unet);
}

/* ---- training: tagged and untagged, the same bits ---- */

#define STEPS 3
#define MAX_STAGES 3

static char tmp[256];

struct result {
    double loss[STEPS];
    double val_loss;
    bool has_val;
    int tagged; /* from the trainer's note; 0 when it said nothing */
    char saved[512];
};

static void on_step(void *user, const struct gp_step_report *r) { ((struct result *)user)->loss[r->step] = r->loss; }

static void on_epoch(void *user, const struct gp_epoch_report *r)
{
    struct result *res = user;
    res->has_val = r->has_val;
    res->val_loss = r->val_loss;
}

static void on_note(void *user, const char *message)
{
    int n;
    if (sscanf(message, "%d activations stored channels-last", &n) == 1) ((struct result *)user)->tagged = n;
}

struct setup {
    const char *fixture;
    int64_t batch, chunks;
    int stages;
    enum gp_checkpoint checkpoint;
    enum gp_pipe_schedule_kind schedule;
    enum gp_optimizer_kind optimizer;
    bool deferred_bn;
    bool validate;
};

static void train(const struct setup *c, enum gp_precision precision, enum gp_layout_policy layout,
                  struct result *res)
{
    char model[4096], name[256];
    snprintf(name, sizeof name, "%s.onnx", c->fixture);
    fixture_path(name, model, sizeof model);
    struct gp_error err = {0};
    struct gp_dataset ds, val;
    if (gp_dataset_synthetic(model, c->batch * STEPS, 7, &ds, &err) != GP_OK) fail_msg("%s", err.msg);
    /* Validation data of a size the batch does not divide: the padded last chunk too. */
    if (c->validate && gp_dataset_synthetic(model, c->batch + c->batch / 2, 11, &val, &err) != GP_OK)
        fail_msg("%s", err.msg);
    struct gp_train_config cfg;
    gp_train_config_defaults(&cfg);
    cfg.model_path = model;
    cfg.batch = c->batch;
    cfg.chunks = c->chunks;
    cfg.steps = STEPS;
    cfg.shuffle = true;
    cfg.seed = 3;
    cfg.optimizer = c->optimizer;
    cfg.lr = c->optimizer == GP_OPT_ADAMW ? 1e-3 : 0.05;
    cfg.momentum = 0.9;
    cfg.precision = precision;
    cfg.layout = layout;
    cfg.n_stages = c->stages;
    for (int k = 0; k < c->stages; k++) cfg.stage_device[k] = k;
    cfg.checkpoint = c->checkpoint;
    cfg.pipeline_schedule = c->schedule;
    cfg.deferred_batch_norm = c->deferred_bn;
    snprintf(res->saved, sizeof res->saved, "%s/%s_%d_%lld_%s_%s_%s.onnx", tmp, c->fixture, c->stages,
             (long long)c->chunks, gp_checkpoint_name(c->checkpoint), gp_precision_name(precision),
             gp_layout_policy_name(layout));
    cfg.save_path = res->saved;
    struct gp_train_callbacks cb = {.user = res, .on_step = on_step, .on_epoch = on_epoch, .on_note = on_note};
    if (gp_train(&cfg, &ds, c->validate ? &val : NULL, &cb, &err) != GP_OK)
        fail_msg("%s, %d stages, %s, layout %s: %s", c->fixture, c->stages, gp_precision_name(precision),
                 gp_layout_policy_name(layout), err.msg);
    gp_dataset_free(&ds);
    if (c->validate) gp_dataset_free(&val);
}

/* The tags the trainer reports for the fixture: the pass's count. */
static int tags_of(const char *fixture)
{
    char name[256];
    snprintf(name, sizeof name, "%s.onnx", fixture);
    struct gp_graph g;
    load(name, &g);
    int n = gp_graph_channels_last(&g);
    gp_graph_free(&g);
    return n;
}

static void same_bits(const struct setup *c, enum gp_precision precision)
{
    struct result nchw, nhwc, dflt;
    memset(&nchw, 0, sizeof nchw);
    memset(&nhwc, 0, sizeof nhwc);
    memset(&dflt, 0, sizeof dflt);
    train(c, precision, GP_LAYOUT_NCHW, &nchw);
    train(c, precision, GP_LAYOUT_NHWC, &nhwc);
    /* auto on CPU devices: the model's layout. */
    train(c, precision, GP_LAYOUT_AUTO, &dflt);
    char what[256];
    snprintf(what, sizeof what, "%s, %d stages x %lld micro-batches, checkpoint %s, %s, %s%s", c->fixture, c->stages,
             (long long)c->chunks, gp_checkpoint_name(c->checkpoint), gp_pipe_schedule_name(c->schedule),
             gp_precision_name(precision), c->deferred_bn ? ", deferred BatchNorm" : "");
    /* The trainer did tag (else this compares a run with itself). */
    if (nhwc.tagged != tags_of(c->fixture))
        fail_msg("%s: the nhwc run tagged %d activations, the pass %d", what, nhwc.tagged, tags_of(c->fixture));
    assert_int_equal(nchw.tagged, 0);
    assert_int_equal(dflt.tagged, 0);
    for (int s = 0; s < STEPS; s++)
        if (memcmp(&nchw.loss[s], &nhwc.loss[s], sizeof(double)))
            fail_msg("%s: step %d loss %.17g channels-last, %.17g as the model says", what, s + 1, nhwc.loss[s],
                     nchw.loss[s]);
    if (c->validate) {
        assert_true(nchw.has_val && nhwc.has_val);
        if (memcmp(&nchw.val_loss, &nhwc.val_loss, sizeof(double)))
            fail_msg("%s: validation loss %.17g channels-last, %.17g as the model says", what, nhwc.val_loss,
                     nchw.val_loss);
    }
    size_t na, nb, nc;
    unsigned char *a = read_whole(nchw.saved, &na), *b = read_whole(nhwc.saved, &nb), *d = read_whole(dflt.saved, &nc);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(d);
    if (na != nb || memcmp(a, b, na)) fail_msg("%s: the saved models differ", what);
    if (na != nc || memcmp(a, d, na)) fail_msg("%s: auto saved another model than nchw", what);
    free(a);
    free(b);
    free(d);
    printf("%s: %d activations channels-last, the same bits\n", what, nhwc.tagged);
}

/* Each fixture's setups: one device; a pipeline keeping every activation;
 * a pipeline recomputing every micro-batch (the recomputed forward writes
 * the tagged values again) with 1F1B, AdamW and deferred BatchNorm;
 * validation in each. */
static void same_bits_all(const char *fixture, int64_t batch, enum gp_precision precision)
{
    const struct setup setups[] = {
        {fixture, batch, 1, 1, GP_CHECKPOINT_EXCEPT_LAST, GP_PIPE_GPIPE, GP_OPT_SGD, false, true},
        {fixture, batch, 2, 2, GP_CHECKPOINT_NEVER, GP_PIPE_GPIPE, GP_OPT_SGD, false, true},
        {fixture, batch, 4, 3, GP_CHECKPOINT_ALWAYS, GP_PIPE_1F1B, GP_OPT_ADAMW, true, false},
        {fixture, batch, 4, 2, GP_CHECKPOINT_EXCEPT_LAST, GP_PIPE_GPIPE, GP_OPT_SGD, false, false},
    };
    for (size_t i = 0; i < sizeof setups / sizeof *setups; i++) same_bits(&setups[i], precision);
}

/* The fixtures the pass tags. */
static void test_train_fp32(void **state)
{
    (void)state;
    same_bits_all("digits_cnn_op17", 8, GP_PRECISION_FP32);
    same_bits_all("resnet_op17", 8, GP_PRECISION_FP32);
    same_bits_all("unet_op17", 4, GP_PRECISION_FP32);
}

static void test_train_bf16(void **state)
{
    (void)state;
    same_bits_all("digits_cnn_op17", 8, GP_PRECISION_BF16);
    same_bits_all("resnet_op17", 8, GP_PRECISION_BF16);
    same_bits_all("unet_op17", 4, GP_PRECISION_BF16);
}

static int setup(void **state)
{
    (void)state;
    return temp_dir(tmp, sizeof tmp) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    remove_tree(tmp);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_residual_block),
        cmocka_unit_test(test_unet_cell),
        cmocka_unit_test(test_concat_resize),
        cmocka_unit_test(test_readers_refuse),
        cmocka_unit_test(test_broadcast_operand),
        cmocka_unit_test(test_graph_outputs),
        cmocka_unit_test(test_neutral_call),
        cmocka_unit_test(test_policy),
        cmocka_unit_test(test_fixtures),
        cmocka_unit_test(test_train_fp32),
        cmocka_unit_test(test_train_bf16),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
