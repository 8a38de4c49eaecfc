/* The graph IR: topological order, structural errors, op resolution,
 * trainability and frontiers, on graphs built by hand. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "graph/build.h"
#include "graph/layers.h"

#define S(...) ((const char *const[]){__VA_ARGS__})

static void init(struct gp_graph *g, int64_t batch)
{
    struct gp_error err = {0};
    assert_int_equal(gp_graph_init(g, batch, 17, 64, 32, &err), GP_OK);
}

static void input(struct gp_graph *g, const char *name, int rank, const int64_t *dims)
{
    struct gp_error err = {0};
    struct gp_shape s = {.rank = rank};
    for (int i = 0; i < rank; i++) s.dims[i] = dims[i];
    assert_int_equal(gp_graph_add_input(g, name, GP_DTYPE_FLOAT32, &s, &err), GP_OK);
}

static int node(struct gp_graph *g, const char *op, const char *name, int ni,
                const char *const *in, int no, const char *const *out)
{
    struct gp_error err = {0};
    int id = gp_graph_add_node(g, op, "", name, ni, in, no, out, &err);
    if (id < 0) fail_msg("%s", err.msg);
    return id;
}

static void output(struct gp_graph *g, const char *name)
{
    struct gp_error err = {0};
    assert_int_equal(gp_graph_add_output(g, name, &err), GP_OK);
}

static void expect_error(struct gp_graph *g, gp_status status, const char *needle)
{
    struct gp_error err = {0};
    gp_status st = gp_graph_finalize(g, &err);
    if (st != status) fail_msg("expected status %d, got %d: %s", status, st, err.msg);
    if (!strstr(err.msg, needle)) fail_msg("message '%s' lacks '%s'", err.msg, needle);
    gp_graph_free(g);
}

/* Nodes listed out of order are sorted; ties keep the file's order. */
static void test_sorts_nodes(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 2);
    input(&g, "x", 2, (int64_t[]){1, 4});
    node(&g, "Relu", "c", 1, S("b"), 1, S("y"));
    node(&g, "Sigmoid", "a", 1, S("x"), 1, S("a_out"));
    node(&g, "Tanh", "b", 1, S("a_out"), 1, S("b"));
    output(&g, "y");
    struct gp_error err = {0};
    assert_int_equal(gp_graph_finalize(&g, &err), GP_OK);
    assert_string_equal(g.nodes[0].name, "a");
    assert_string_equal(g.nodes[1].name, "b");
    assert_string_equal(g.nodes[2].name, "c");
    /* Batch bound on the input and carried through. */
    const struct gp_value *y = &g.values[gp_graph_find_value(&g, "y")];
    assert_int_equal(y->shape.dims[0], 2);
    assert_int_equal(y->shape.dims[1], 4);
    assert_int_equal(y->producer, 2);
    gp_graph_free(&g);
}

static void test_cycle_is_named(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 1);
    input(&g, "x", 2, (int64_t[]){1, 4});
    node(&g, "Add", "p", 2, S("x", "loop_b"), 1, S("loop_a"));
    node(&g, "Relu", "q", 1, S("loop_a"), 1, S("loop_b"));
    output(&g, "loop_b");
    expect_error(&g, GP_ERR_INVALID, "cycle through value 'loop_");
}

static void test_dangling_input_is_named(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 1);
    input(&g, "x", 2, (int64_t[]){1, 4});
    node(&g, "Add", "adder", 2, S("x", "ghost"), 1, S("y"));
    output(&g, "y");
    expect_error(&g, GP_ERR_INVALID, "'ghost', which no node");
}

static void test_duplicate_output_is_named(void **state)
{
    (void)state;
    struct gp_graph g;
    struct gp_error err = {0};
    init(&g, 1);
    input(&g, "x", 2, (int64_t[]){1, 4});
    node(&g, "Relu", "first", 1, S("x"), 1, S("twice"));
    assert_int_equal(gp_graph_add_node(&g, "Relu", "", "second", 1, S("x"), 1, S("twice"), &err), -1);
    assert_non_null(strstr(err.msg, "'twice' is produced twice"));
    gp_graph_free(&g);
}

static void test_unsupported_ops_listed_together(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 1);
    input(&g, "x", 2, (int64_t[]){1, 4});
    node(&g, "FancyOp", "f1", 1, S("x"), 1, S("a"));
    node(&g, "FancyOp", "f2", 1, S("a"), 1, S("b"));
    node(&g, "NonZero", "nz", 1, S("b"), 1, S("c"));
    node(&g, "Relu", "r", 1, S("c"), 1, S("y"));
    output(&g, "y");
    struct gp_error err = {0};
    assert_int_equal(gp_graph_finalize(&g, &err), GP_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "2 unsupported op types"));
    assert_non_null(strstr(err.msg, "FancyOp (2 nodes, first 'f1')"));
    assert_non_null(strstr(err.msg, "NonZero (1 node, first 'nz')"));
    gp_graph_free(&g);
}

static void test_unknown_domain(void **state)
{
    (void)state;
    struct gp_graph g;
    struct gp_error err = {0};
    init(&g, 1);
    input(&g, "x", 2, (int64_t[]){1, 4});
    assert_true(gp_graph_add_node(&g, "Relu", "com.example", "r", 1, S("x"), 1, S("y"), &err) >= 0);
    output(&g, "y");
    expect_error(&g, GP_ERR_UNSUPPORTED, "domain 'com.example' is not imported");
}

static void test_unknown_attribute(void **state)
{
    (void)state;
    struct gp_graph g;
    struct gp_error err = {0};
    init(&g, 1);
    input(&g, "x", 2, (int64_t[]){1, 4});
    int n = node(&g, "LeakyRelu", "lr", 1, S("x"), 1, S("y"));
    struct gp_attr *a = gp_graph_add_attr(&g, n, "slope", GP_ATTR_FLOAT, 2, &err);
    a->f = 0.1f;
    output(&g, "y");
    expect_error(&g, GP_ERR_UNSUPPORTED, "unknown attribute 'slope'");

    init(&g, 1);
    input(&g, "x", 2, (int64_t[]){1, 4});
    n = node(&g, "LeakyRelu", "lr", 1, S("x"), 1, S("y"));
    a = gp_graph_add_attr(&g, n, "alpha", GP_ATTR_INT, 2, &err);
    a->i = 1;
    output(&g, "y");
    expect_error(&g, GP_ERR_INVALID, "attribute 'alpha' is a int, expected a float");
}

static void test_arity_checked(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 1);
    input(&g, "x", 2, (int64_t[]){1, 4});
    node(&g, "Add", "lonely", 1, S("x"), 1, S("y"));
    output(&g, "y");
    expect_error(&g, GP_ERR_INVALID, "node 'lonely' (Add-14): has 1 inputs, expected 2 to 2");
}

static void test_scalar_input_refused(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 1);
    input(&g, "s", 0, NULL);
    node(&g, "Relu", "r", 1, S("s"), 1, S("y"));
    output(&g, "y");
    expect_error(&g, GP_ERR_SHAPE, "graph input 's' is a scalar");
}

/* A weight reaches the output through MatMul: trainable. A float
 * initializer read only through Shape is not; a constant derived from it
 * folds. A weight transposed before use is trainable and the Transpose stays. */
static void test_trainability(void **state)
{
    (void)state;
    struct gp_graph g;
    struct gp_error err = {0};
    init(&g, 3);
    input(&g, "x", 2, (int64_t[]){1, 4});
    float w[4 * 5] = {0}, table[7] = {0};
    assert_int_equal(gp_graph_add_const_f32(&g, "w", &(struct gp_shape){2, {5, 4}}, w, &err), GP_OK);
    assert_int_equal(gp_graph_add_const_f32(&g, "table", &(struct gp_shape){1, {7}}, table, &err), GP_OK);
    node(&g, "Transpose", "wt", 1, S("w"), 1, S("w_t"));
    node(&g, "MatMul", "mm", 2, S("x", "w_t"), 1, S("h"));
    node(&g, "Shape", "shp", 1, S("table"), 1, S("table_shape"));
    node(&g, "Reshape", "rs", 2, S("h", "hshape"), 1, S("y"));
    /* hshape = [batch, 5] computed from h's shape: folds */
    node(&g, "Shape", "hs", 1, S("h"), 1, S("hshape"));
    output(&g, "y");
    output(&g, "table_shape");
    assert_int_equal(gp_graph_finalize(&g, &err), GP_OK);
    assert_int_equal(g.values[gp_graph_find_value(&g, "w")].kind, GP_VALUE_PARAMETER);
    assert_int_equal(g.values[gp_graph_find_value(&g, "table")].kind, GP_VALUE_CONSTANT);
    assert_int_equal(g.values[gp_graph_find_value(&g, "hshape")].kind, GP_VALUE_CONSTANT);
    /* MatMul (reading the parameter w transposed in place: graph/fuse.c)
     * and Reshape run; both Shapes folded. */
    assert_int_equal(g.n_nodes, 2);
    assert_true(g.nodes[0].trans_b);
    assert_int_equal(g.n_folded, 2);
    assert_int_equal(gp_graph_param_count(&g), 20);
    const struct gp_value *y = &g.values[gp_graph_find_value(&g, "y")];
    assert_int_equal(y->shape.dims[0], 3);
    assert_int_equal(y->shape.dims[1], 5);
    gp_graph_free(&g);
}

/* The bias Add after a MatMul folds into it (graph/fuse.c: fused_bias,
 * the bias as input 2) for x [2, 3, 4] @ W [4, 5] (or Transpose(W [5, 4]))
 * + b. `how`: 0 Add(p, b) with b [5]; 1 Add(b, p) with b [1, 1, 5] and W
 * transposed; 2 b a constant (read through a Cast, so not trainable);
 * 3 GP_FUSE_MATMUL_BIAS=0. The near misses, which keep the Add: 4 b [3, 5]
 * (a bias per token, not per column); 5 b [1] (a scalar broadcast over
 * the columns); 6 the product read twice (also by a Relu); 7 the product a
 * graph output; 8 b read by another node too; 9 Add(p, p); 10 b computed
 * (an activation, not a weight); 11 a 1-D W (the product has no column axis).
 * Returns the nodes left; *fused: the MatMul's flag. */
static int bias_chain(int how, bool *fused)
{
    struct gp_graph g;
    struct gp_error err = {0};
    init(&g, 2);
    input(&g, "x", 3, (int64_t[]){2, 3, 4});
    float w[20], b[15];
    for (int i = 0; i < 20; i++) w[i] = (float)(i % 7) / 4 - 0.75f;
    for (int i = 0; i < 15; i++) b[i] = (float)i / 8;
    bool tb = how == 1;
    struct gp_shape ws = how == 11 ? (struct gp_shape){1, {4}} : (struct gp_shape){2, {tb ? 5 : 4, tb ? 4 : 5}};
    assert_int_equal(gp_graph_add_const_f32(&g, "w", &ws, w, &err), GP_OK);
    struct gp_shape bs = how == 1 ? (struct gp_shape){3, {1, 1, 5}} : how == 4 ? (struct gp_shape){2, {3, 5}}
                         : how == 5 || how == 11 ? (struct gp_shape){1, {1}} : (struct gp_shape){1, {5}};
    if (how == 10) {
        assert_int_equal(gp_graph_add_const_f32(&g, "c", &bs, b, &err), GP_OK);
        node(&g, "Sigmoid", "sig", 1, S("c"), 1, S("b"));
    } else if (how == 2) {
        int64_t bi[5] = {1, 2, 3, 4, 5};
        assert_int_equal(gp_graph_add_const_i64(&g, "bi", &bs, bi, &err), GP_OK);
        int c = node(&g, "Cast", "cast", 1, S("bi"), 1, S("b"));
        struct gp_attr *to = gp_graph_add_attr(&g, c, "to", GP_ATTR_INT, 16, &err);
        if (!to) fail_msg("%s", err.msg);
        to->i = GP_DTYPE_FLOAT32;
    } else {
        assert_int_equal(gp_graph_add_const_f32(&g, "b", &bs, b, &err), GP_OK);
    }
    if (tb) node(&g, "Transpose", "t", 1, S("w"), 1, S("wt"));
    node(&g, "MatMul", "mm", 2, S("x", tb ? "wt" : "w"), 1, S("p"));
    node(&g, "Add", "add", 2, how == 1 ? S("b", "p") : how == 9 ? S("p", "p") : S("p", "b"), 1, S("y"));
    output(&g, "y");
    if (how == 6) {
        node(&g, "Relu", "r", 1, S("p"), 1, S("r"));
        output(&g, "r");
    }
    if (how == 7) output(&g, "p");
    if (how == 8) {
        node(&g, "Mul", "m", 2, S("y", "b"), 1, S("z"));
        output(&g, "z");
    }
    if (how == 3) setenv("GP_FUSE_MATMUL_BIAS", "0", 1);
    gp_status st = gp_graph_finalize(&g, &err);
    if (how == 3) unsetenv("GP_FUSE_MATMUL_BIAS");
    if (st != GP_OK) fail_msg("case %d: %s", how, err.msg);
    *fused = false;
    for (int i = 0; i < g.n_nodes; i++) {
        const struct gp_node *n = &g.nodes[i];
        if (!n->fused_bias) continue;
        *fused = true;
        assert_string_equal(n->op_type, "MatMul");
        assert_int_equal(n->n_inputs, 3);
        assert_int_equal(n->inputs[2], gp_graph_find_value(&g, "b"));
        assert_int_equal(n->outputs[0], gp_graph_find_value(&g, "y"));
        assert_int_equal(g.values[n->outputs[0]].producer, i);
        assert_int_equal(n->trans_b, tb);
    }
    int left = g.n_nodes;
    gp_graph_free(&g);
    return left;
}

static void test_matmul_bias_fuses(void **state)
{
    (void)state;
    bool fused;
    assert_int_equal(bias_chain(0, &fused), 1);
    assert_true(fused);
    assert_int_equal(bias_chain(1, &fused), 1); /* Transpose and Add both absorbed */
    assert_true(fused);
    assert_int_equal(bias_chain(2, &fused), 1); /* the Cast folds: b a constant */
    assert_true(fused);
    assert_int_equal(bias_chain(3, &fused), 2);
    assert_false(fused);
    for (int how = 4; how <= 11; how++) {
        bias_chain(how, &fused);
        if (fused) fail_msg("near miss %d: the Add was absorbed", how);
    }
}

/* Resize scales computed from float constants (Add(k, k)) must fold even
 * though k is a float initializer read through a differentiable slot: its
 * value only reaches the output through the non-differentiable scales. */
static void test_float_constant_arithmetic_folds_into_scales(void **state)
{
    (void)state;
    struct gp_graph g;
    struct gp_error err = {0};
    init(&g, 2);
    input(&g, "x", 4, (int64_t[]){1, 3, 4, 4});
    float half[4] = {0.5f, 0.5f, 1.0f, 1.0f};
    assert_int_equal(gp_graph_add_const_f32(&g, "k", &(struct gp_shape){1, {4}}, half, &err), GP_OK);
    node(&g, "Add", "double_it", 2, S("k", "k"), 1, S("scales"));
    node(&g, "Resize", "up", 3, S("x", "", "scales"), 1, S("y"));
    output(&g, "y");
    if (gp_graph_finalize(&g, &err) != GP_OK) fail_msg("%s", err.msg);
    assert_int_equal(g.n_nodes, 1);
    assert_int_equal(g.values[gp_graph_find_value(&g, "k")].kind, GP_VALUE_CONSTANT);
    const struct gp_value *y = &g.values[gp_graph_find_value(&g, "y")];
    assert_int_equal(y->shape.dims[0], 2);
    assert_int_equal(y->shape.dims[1], 3);
    assert_int_equal(y->shape.dims[2], 8);
    assert_int_equal(y->shape.dims[3], 8);
    gp_graph_free(&g);
}

/* A Constant node making the float scalar `name`, as exporters write
 * constants (an initializer would be a trainable parameter, never fused). */
static void konst(struct gp_graph *g, const char *name, float value)
{
    struct gp_error err = {0};
    int n = node(g, "Constant", name, 0, NULL, 1, (const char *const[]){name});
    struct gp_attr *a = gp_graph_add_attr(g, n, "value_float", GP_ATTR_FLOAT, 1, &err);
    if (!a) fail_msg("%s", err.msg);
    a->f = value;
}

/* The exact GELU as exporters write it below opset 20; `keep_erf`: the
 * Erf's output is also a graph output. */
static void gelu_chain(struct gp_graph *g, bool keep_erf)
{
    struct gp_error err = {0};
    init(g, 2);
    input(g, "x", 2, (int64_t[]){1, 8});
    konst(g, "sqrt2", 1.41421353816986083984f);
    konst(g, "one", 1.0f);
    konst(g, "half", 0.5f);
    node(g, "Relu", "/pre/Relu", 1, S("x"), 1, S("h"));
    node(g, "Div", "/mlp/act/Div", 2, S("h", "sqrt2"), 1, S("d"));
    node(g, "Erf", "/mlp/act/Erf", 1, S("d"), 1, S("e"));
    node(g, "Add", "/mlp/act/Add", 2, S("one", "e"), 1, S("a")); /* either order */
    node(g, "Mul", "/mlp/act/Mul", 2, S("a", "h"), 1, S("m"));
    node(g, "Mul", "/mlp/act/Mul_1", 2, S("m", "half"), 1, S("y"));
    output(g, "y");
    if (keep_erf) output(g, "e");
    if (gp_graph_finalize(g, &err) != GP_OK) fail_msg("%s", err.msg);
}

static void test_gelu_chain_fuses(void **state)
{
    (void)state;
    struct gp_graph g;
    gelu_chain(&g, false);
    assert_int_equal(g.n_nodes, 2);
    assert_string_equal(g.nodes[1].op_type, "Gelu");
    assert_string_equal(g.nodes[1].name, "/mlp/act/Gelu");
    assert_int_equal(g.nodes[1].n_inputs, 1);
    assert_string_equal(g.values[g.nodes[1].inputs[0]].name, "h");
    assert_string_equal(g.values[g.nodes[1].outputs[0]].name, "y");
    assert_int_equal(g.values[g.nodes[1].outputs[0]].producer, 1);
    assert_int_equal(g.n_fused, 4);
    assert_int_equal(g.n_nodes + g.n_folded + g.n_fused, g.n_source_nodes);
    gp_graph_free(&g);
    /* An intermediate read elsewhere keeps the chain as it is. */
    gelu_chain(&g, true);
    assert_int_equal(g.n_nodes, 6);
    assert_int_equal(g.n_fused, 0);
    gp_graph_free(&g);
}

/* A Dropout's mask that nothing reads is dropped (its output omitted: no
 * kernel writes it); one read by a node, or a graph output, stays. */
static void test_unread_dropout_mask_dropped(void **state)
{
    (void)state;
    for (int how = 0; how < 3; how++) {
        struct gp_graph g;
        struct gp_error err = {0};
        init(&g, 2);
        input(&g, "x", 2, (int64_t[]){2, 3});
        node(&g, "Dropout", "drop", 1, S("x"), 2, S("y", "mask"));
        output(&g, "y");
        if (how == 1) {
            int c = node(&g, "Cast", "cast", 1, S("mask"), 1, S("m"));
            struct gp_attr *to = gp_graph_add_attr(&g, c, "to", GP_ATTR_INT, 16, &err);
            if (!to) fail_msg("%s", err.msg);
            to->i = GP_DTYPE_FLOAT32;
            output(&g, "m");
        }
        if (how == 2) output(&g, "mask");
        if (gp_graph_finalize(&g, &err) != GP_OK) fail_msg("%s", err.msg);
        const struct gp_node *d = &g.nodes[0];
        assert_string_equal(d->op_type, "Dropout");
        assert_int_equal(d->n_outputs, 2);
        int mask = gp_graph_find_value(&g, "mask");
        if (how == 0) {
            assert_int_equal(d->outputs[1], -1);
            assert_int_equal(g.values[mask].producer, -1);
        } else {
            assert_int_equal(d->outputs[1], mask);
            assert_int_equal(g.values[mask].producer, 0);
        }
        gp_graph_free(&g);
    }
}

/* The tanh form in its two exported spellings: Hugging Face's gelu_new
 * (0.5 x first, x^3 by Pow) and torch's symbolic (x^3 as x (x x), the 0.5
 * last); both become one Gelu with approximate="tanh". */
static void test_tanh_gelu_chains_fuse(void **state)
{
    (void)state;
    for (int form = 0; form < 2; form++) {
        struct gp_graph g;
        struct gp_error err = {0};
        init(&g, 2);
        input(&g, "x", 2, (int64_t[]){1, 8});
        konst(&g, "half", 0.5f);
        konst(&g, "three", 3.0f);
        konst(&g, "kappa", 0.044715f);
        konst(&g, "beta", 0.7978845608028654f);
        konst(&g, "one", 1.0f);
        node(&g, "Relu", "/pre/Relu", 1, S("x"), 1, S("h"));
        if (form == 0) {
            node(&g, "Mul", "/act/Mul", 2, S("half", "h"), 1, S("a"));
            node(&g, "Pow", "/act/Pow", 2, S("h", "three"), 1, S("cube"));
        } else {
            node(&g, "Mul", "/act/Mul_sq", 2, S("h", "h"), 1, S("sq"));
            node(&g, "Mul", "/act/Mul_cube", 2, S("h", "sq"), 1, S("cube"));
        }
        node(&g, "Mul", "/act/Mul_k", 2, S("kappa", "cube"), 1, S("q"));
        node(&g, "Add", "/act/Add", 2, S("h", "q"), 1, S("r"));
        node(&g, "Mul", "/act/Mul_b", 2, S("beta", "r"), 1, S("s"));
        node(&g, "Tanh", "/act/Tanh", 1, S("s"), 1, S("t"));
        node(&g, "Add", "/act/Add_1", 2, S("one", "t"), 1, S("u"));
        if (form == 0) {
            node(&g, "Mul", "/act/Mul_out", 2, S("a", "u"), 1, S("y"));
        } else {
            node(&g, "Mul", "/act/Mul_x", 2, S("h", "u"), 1, S("m"));
            node(&g, "Mul", "/act/Mul_out", 2, S("half", "m"), 1, S("y"));
        }
        output(&g, "y");
        if (gp_graph_finalize(&g, &err) != GP_OK) fail_msg("%s", err.msg);
        assert_int_equal(g.n_nodes, 2);
        const struct gp_node *n = &g.nodes[1];
        assert_string_equal(n->op_type, "Gelu");
        assert_string_equal(n->name, "/act/Gelu");
        assert_string_equal(gp_node_attr_string(n, "approximate", "none"), "tanh");
        assert_string_equal(g.values[n->inputs[0]].name, "h");
        assert_string_equal(g.values[n->outputs[0]].name, "y");
        assert_int_equal(g.n_nodes + g.n_folded + g.n_fused, g.n_source_nodes);
        gp_graph_free(&g);
    }
}

/* x -> a -> b -> c(a, b) -> d: the value a crosses the cuts before b and c. */
static void test_frontier_by_hand(void **state)
{
    (void)state;
    struct gp_graph g;
    struct gp_error err = {0};
    init(&g, 2);
    input(&g, "x", 2, (int64_t[]){1, 8});
    node(&g, "Relu", "la", 1, S("x"), 1, S("a"));
    node(&g, "Tanh", "lb", 1, S("a"), 1, S("b"));
    node(&g, "Add", "lc", 2, S("a", "b"), 1, S("c"));
    node(&g, "Sigmoid", "ld", 1, S("c"), 1, S("d"));
    output(&g, "d");
    assert_int_equal(gp_graph_finalize(&g, &err), GP_OK);
    struct gp_layers l;
    assert_int_equal(gp_layers_build(&g, &l, &err), GP_OK);
    const int64_t one = 2 * 8 * 4; /* bytes of one [2, 8] float tensor */
    assert_int_equal(l.frontier_bytes[0], one);     /* x */
    assert_int_equal(l.frontier_bytes[1], one);     /* a */
    assert_int_equal(l.frontier_bytes[2], 2 * one); /* a, b */
    assert_int_equal(l.frontier_bytes[3], one);     /* c */
    assert_int_equal(l.frontier_bytes[4], one);     /* d, the output */
    int ids[8];
    assert_int_equal(gp_layers_frontier(&l, &g, 2, ids), 2);
    assert_string_equal(g.values[ids[0]].name, "a");
    assert_string_equal(g.values[ids[1]].name, "b");
    gp_layers_free(&l);
    gp_graph_free(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sorts_nodes),
        cmocka_unit_test(test_cycle_is_named),
        cmocka_unit_test(test_dangling_input_is_named),
        cmocka_unit_test(test_duplicate_output_is_named),
        cmocka_unit_test(test_unsupported_ops_listed_together),
        cmocka_unit_test(test_unknown_domain),
        cmocka_unit_test(test_unknown_attribute),
        cmocka_unit_test(test_arity_checked),
        cmocka_unit_test(test_scalar_input_refused),
        cmocka_unit_test(test_trainability),
        cmocka_unit_test(test_frontier_by_hand),
        cmocka_unit_test(test_gelu_chain_fuses),
        cmocka_unit_test(test_unread_dropout_mask_dropped),
        cmocka_unit_test(test_tanh_gelu_chains_fuse),
        cmocka_unit_test(test_float_constant_arithmetic_folds_into_scales),
        cmocka_unit_test(test_matmul_bias_fuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
