/* Shape and elementwise ops through gp_graph_finalize: inferred shapes,
 * folded constant values and the errors a user sees. Graphs are built by
 * hand with the builder API; axis 0 of every graph input is the batch. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "graph/build.h"

#define S(...) ((const char *const[]){__VA_ARGS__})
#define I64(...) ((const int64_t[]){__VA_ARGS__})
#define F32(...) ((const float[]){__VA_ARGS__})

/* ---- building ---- */

static struct gp_shape shape_of(int rank, const int64_t *dims)
{
    struct gp_shape s = {.rank = rank};
    for (int i = 0; i < rank; i++) s.dims[i] = dims[i];
    return s;
}

static void init(struct gp_graph *g, int64_t batch, int64_t opset)
{
    struct gp_error err = {0};
    assert_int_equal(gp_graph_init(g, batch, opset, 128, 64, &err), GP_OK);
}

static void input(struct gp_graph *g, const char *name, enum gp_dtype dtype, int rank,
                  const int64_t *dims)
{
    struct gp_error err = {0};
    struct gp_shape s = shape_of(rank, dims);
    assert_int_equal(gp_graph_add_input(g, name, dtype, &s, &err), GP_OK);
}

static void ci64(struct gp_graph *g, const char *name, int rank, const int64_t *dims,
                 const int64_t *data)
{
    struct gp_error err = {0};
    struct gp_shape s = shape_of(rank, dims);
    assert_int_equal(gp_graph_add_const_i64(g, name, &s, data, &err), GP_OK);
}

static void cf32(struct gp_graph *g, const char *name, int rank, const int64_t *dims,
                 const float *data)
{
    struct gp_error err = {0};
    struct gp_shape s = shape_of(rank, dims);
    assert_int_equal(gp_graph_add_const_f32(g, name, &s, data, &err), GP_OK);
}

/* A constant of any dtype, elements given as doubles. */
static void cany(struct gp_graph *g, const char *name, enum gp_dtype dtype, int rank,
                 const int64_t *dims, const double *data)
{
    struct gp_error err = {0};
    struct gp_shape s = shape_of(rank, dims);
    struct gp_tensor *t = gp_graph_new_tensor(g, dtype, &s);
    assert_non_null(t);
    for (int64_t i = 0; i < gp_shape_numel(&s); i++) gp_tensor_set_f64(t, i, data[i]);
    assert_int_equal(gp_graph_add_initializer(g, name, t, &err), GP_OK);
}

static int node(struct gp_graph *g, const char *op, int ni, const char *const *in, int no,
                const char *const *out)
{
    struct gp_error err = {0};
    int id = gp_graph_add_node(g, op, "", NULL, ni, in, no, out, &err);
    if (id < 0) fail_msg("%s", err.msg);
    return id;
}

static struct gp_attr *attr(struct gp_graph *g, int n, const char *name, enum gp_attr_type type)
{
    struct gp_error err = {0};
    struct gp_attr *a = gp_graph_add_attr(g, n, name, type, 4, &err);
    if (!a) fail_msg("%s", err.msg);
    return a;
}

static void attr_int(struct gp_graph *g, int n, const char *name, int64_t v)
{
    attr(g, n, name, GP_ATTR_INT)->i = v;
}

static void attr_str(struct gp_graph *g, int n, const char *name, const char *v)
{
    attr(g, n, name, GP_ATTR_STRING)->s = v;
}

static void attr_ints(struct gp_graph *g, int n, const char *name, int count, const int64_t *v)
{
    struct gp_attr *a = attr(g, n, name, GP_ATTR_INTS);
    a->count = count;
    a->ints = gp_arena_memdup(&g->arena, v, sizeof *v * (size_t)count);
}

static void output(struct gp_graph *g, const char *name)
{
    struct gp_error err = {0};
    assert_int_equal(gp_graph_add_output(g, name, &err), GP_OK);
}

/* ---- checking ---- */

static void finalize_ok(struct gp_graph *g)
{
    struct gp_error err = {0};
    if (gp_graph_finalize(g, &err) != GP_OK) fail_msg("finalize failed: %s", err.msg);
}

static void expect_error(struct gp_graph *g, gp_status status, const char *needle)
{
    struct gp_error err = {0};
    gp_status st = gp_graph_finalize(g, &err);
    if (st != status) fail_msg("expected status %d, got %d: %s", status, st, err.msg);
    if (!strstr(err.msg, needle)) fail_msg("message '%s' lacks '%s'", err.msg, needle);
    gp_graph_free(g);
}

static const struct gp_value *val(const struct gp_graph *g, const char *name)
{
    int id = gp_graph_find_value(g, name);
    if (id < 0) fail_msg("no value '%s'", name);
    return &g->values[id];
}

static void expect_shape(const struct gp_graph *g, const char *name, int rank, const int64_t *dims)
{
    const struct gp_value *v = val(g, name);
    assert_true(v->has_shape);
    struct gp_shape want = shape_of(rank, dims);
    if (!gp_shape_equal(&v->shape, &want)) {
        char a[160], b[160];
        fail_msg("'%s' has shape %s, expected %s", name, gp_shape_format(&v->shape, a, sizeof a),
                 gp_shape_format(&want, b, sizeof b));
    }
}

/* Folded value: the constant's dtype, shape and elements (as doubles). */
static void expect_values(const struct gp_graph *g, const char *name, enum gp_dtype dtype,
                          int rank, const int64_t *dims, const double *want)
{
    expect_shape(g, name, rank, dims);
    const struct gp_value *v = val(g, name);
    if (!v->constant) fail_msg("'%s' was not folded", name);
    assert_int_equal(v->kind, GP_VALUE_CONSTANT);
    assert_int_equal(v->dtype, dtype);
    assert_int_equal(v->constant->dtype, dtype);
    for (int64_t i = 0; i < gp_shape_numel(&v->shape); i++) {
        double got = gp_tensor_get_f64(v->constant, i);
        if (!(fabs(got - want[i]) <= 1e-6 * (1 + fabs(want[i]))))
            fail_msg("'%s'[%lld] = %.9g, expected %.9g", name, (long long)i, got, want[i]);
    }
}

#define D(...) ((const double[]){__VA_ARGS__})

/* ---- the exporter's shape chain ---- */

/* torch.onnx writes x.view(x.size(0), -1) as Shape -> Gather -> Unsqueeze
 * -> Concat -> Reshape. With the batch bound the chain folds away and the
 * target uses the bound batch, not the one in the file. */
static void test_exporter_chain_binds_batch(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 5, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 3, I64(2, 3, 4));
    ci64(&g, "zero", 0, NULL, I64(0));
    ci64(&g, "axes0", 1, I64(1), I64(0));
    ci64(&g, "rest", 1, I64(1), I64(-1));
    node(&g, "Shape", 1, S("x"), 1, S("shape"));
    int gather = node(&g, "Gather", 2, S("shape", "zero"), 1, S("batch"));
    attr_int(&g, gather, "axis", 0);
    node(&g, "Unsqueeze", 2, S("batch", "axes0"), 1, S("batch1"));
    int cat = node(&g, "Concat", 2, S("batch1", "rest"), 1, S("target"));
    attr_int(&g, cat, "axis", 0);
    node(&g, "Reshape", 2, S("x", "target"), 1, S("y"));
    output(&g, "y");
    finalize_ok(&g);

    assert_int_equal(g.n_nodes, 1);
    assert_string_equal(g.nodes[0].op_type, "Reshape");
    assert_int_equal(g.n_folded, 4);
    expect_values(&g, "shape", GP_DTYPE_INT64, 1, I64(3), D(5, 3, 4));
    expect_values(&g, "batch", GP_DTYPE_INT64, 0, NULL, D(5));
    expect_values(&g, "target", GP_DTYPE_INT64, 1, I64(2), D(5, -1));
    expect_shape(&g, "y", 2, I64(5, 12));
    assert_null(val(&g, "y")->constant);
    gp_graph_free(&g);
}

/* GPT-style head split: C / n_head computed from Shape, through Div and
 * Cast, then Reshape to [B, T, heads, C / heads]. */
static void test_shape_arithmetic_chain(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 3, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 3, I64(1, 6, 8));
    ci64(&g, "i0", 0, NULL, I64(0));
    ci64(&g, "i1", 0, NULL, I64(1));
    ci64(&g, "i2", 0, NULL, I64(2));
    ci64(&g, "heads", 0, NULL, I64(4));
    ci64(&g, "heads1", 1, I64(1), I64(4));
    ci64(&g, "ax", 1, I64(1), I64(0));
    node(&g, "Shape", 1, S("x"), 1, S("s"));
    node(&g, "Gather", 2, S("s", "i0"), 1, S("b"));
    node(&g, "Gather", 2, S("s", "i1"), 1, S("t"));
    node(&g, "Gather", 2, S("s", "i2"), 1, S("c"));
    node(&g, "Div", 2, S("c", "heads"), 1, S("hd"));
    int cast = node(&g, "Cast", 1, S("hd"), 1, S("hd64"));
    attr_int(&g, cast, "to", GP_DTYPE_INT64);
    node(&g, "Unsqueeze", 2, S("b", "ax"), 1, S("b1"));
    node(&g, "Unsqueeze", 2, S("t", "ax"), 1, S("t1"));
    node(&g, "Unsqueeze", 2, S("hd64", "ax"), 1, S("hd1"));
    int cat = node(&g, "Concat", 4, S("b1", "t1", "heads1", "hd1"), 1, S("target"));
    attr_int(&g, cat, "axis", 0);
    node(&g, "Reshape", 2, S("x", "target"), 1, S("y"));
    int tr = node(&g, "Transpose", 1, S("y"), 1, S("z"));
    attr_ints(&g, tr, "perm", 4, I64(0, 2, 1, 3));
    output(&g, "z");
    finalize_ok(&g);
    assert_int_equal(g.n_nodes, 2);
    expect_values(&g, "target", GP_DTYPE_INT64, 1, I64(4), D(3, 6, 4, 2));
    expect_shape(&g, "z", 4, I64(3, 4, 6, 2));
    gp_graph_free(&g);
}

static void test_shape_window_and_size(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 2, 15);
    input(&g, "x", GP_DTYPE_FLOAT32, 4, I64(1, 3, 4, 5));
    int n = node(&g, "Shape", 1, S("x"), 1, S("mid"));
    attr_int(&g, n, "start", 1);
    attr_int(&g, n, "end", -1);
    n = node(&g, "Shape", 1, S("x"), 1, S("none"));
    attr_int(&g, n, "start", -1);
    attr_int(&g, n, "end", 1); /* end before start: empty */
    node(&g, "Size", 1, S("x"), 1, S("size"));
    output(&g, "mid");
    output(&g, "none");
    output(&g, "size");
    finalize_ok(&g);
    assert_int_equal(g.n_nodes, 0);
    expect_values(&g, "mid", GP_DTYPE_INT64, 1, I64(2), D(3, 4));
    expect_shape(&g, "none", 1, I64(0));
    expect_values(&g, "size", GP_DTYPE_INT64, 0, NULL, D(120));
    gp_graph_free(&g);
}

/* ---- Reshape ---- */

static void test_reshape_zero_and_wildcard(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 2, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 3, I64(1, 3, 4));
    ci64(&g, "t1", 1, I64(2), I64(0, -1));
    ci64(&g, "t2", 1, I64(4), I64(-1, 2, 1, 2));
    node(&g, "Reshape", 2, S("x", "t1"), 1, S("a"));
    node(&g, "Reshape", 2, S("x", "t2"), 1, S("b"));
    output(&g, "a");
    output(&g, "b");
    finalize_ok(&g);
    expect_shape(&g, "a", 2, I64(2, 12));
    expect_shape(&g, "b", 4, I64(6, 2, 1, 2));
    gp_graph_free(&g);
}

static void test_reshape_count_mismatch_hint(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 2, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 3, I64(1, 3, 4));
    ci64(&g, "t", 1, I64(2), I64(4, 5));
    node(&g, "Reshape", 2, S("x", "t"), 1, S("y"));
    output(&g, "y");
    expect_error(&g, GP_ERR_SHAPE,
                 "Reshape target [4, 5] has 20 elements but the input [2, 3, 4] has 24");

    init(&g, 2, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 3, I64(1, 3, 4));
    ci64(&g, "t", 1, I64(2), I64(4, 5));
    node(&g, "Reshape", 2, S("x", "t"), 1, S("y"));
    output(&g, "y");
    expect_error(&g, GP_ERR_SHAPE, "dynamic_axes={'input': {0: 'batch'}}");

    /* The typical cause: a batch literal baked in at export. */
    init(&g, 3, 13);
    g.export_batch = 8;
    input(&g, "x", GP_DTYPE_FLOAT32, 3, I64(8, 3, 4));
    ci64(&g, "t", 1, I64(3), I64(8, -1, 2));
    node(&g, "Reshape", 2, S("x", "t"), 1, S("y"));
    output(&g, "y");
    expect_error(&g, GP_ERR_SHAPE, "exported with batch size 8 and is loaded with 3");

    init(&g, 3, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 3, I64(8, 3, 4));
    ci64(&g, "t", 1, I64(3), I64(8, -1, 2));
    node(&g, "Reshape", 2, S("x", "t"), 1, S("y"));
    output(&g, "y");
    expect_error(&g, GP_ERR_SHAPE, "36 is not a multiple of 16");
}

static void test_reshape_shape_from_data(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 2, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(1, 6));
    input(&g, "t", GP_DTYPE_INT64, 1, I64(2));
    node(&g, "Reshape", 2, S("x", "t"), 1, S("y"));
    output(&g, "y");
    expect_error(&g, GP_ERR_UNSUPPORTED, "input 1 ('t') must be known at load time");
}

static void test_reshape_two_wildcards(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 2, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(1, 6));
    ci64(&g, "t", 1, I64(2), I64(-1, -1));
    node(&g, "Reshape", 2, S("x", "t"), 1, S("y"));
    output(&g, "y");
    expect_error(&g, GP_ERR_SHAPE, "more than one -1");
}

/* ---- errors of other ops ---- */

static void test_broadcast_error(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 2, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(1, 3));
    cf32(&g, "c", 1, I64(4), F32(1, 2, 3, 4));
    node(&g, "Add", 2, S("x", "c"), 1, S("y"));
    output(&g, "y");
    expect_error(&g, GP_ERR_SHAPE, "shapes [2, 3] and [4] do not broadcast");
}

static void test_bad_axis(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 2, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(1, 3));
    int n = node(&g, "Concat", 2, S("x", "x"), 1, S("y"));
    attr_int(&g, n, "axis", 2);
    output(&g, "y");
    expect_error(&g, GP_ERR_INVALID, "axis 2 is out of range for rank 2");

    init(&g, 2, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(1, 3));
    ci64(&g, "i", 0, NULL, I64(0));
    n = node(&g, "Gather", 2, S("x", "i"), 1, S("y"));
    attr_int(&g, n, "axis", -3);
    output(&g, "y");
    expect_error(&g, GP_ERR_INVALID, "axis -3 is out of range for rank 2");
}

static void test_concat_mismatch(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 2, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(1, 3));
    input(&g, "z", GP_DTYPE_FLOAT32, 2, I64(1, 4));
    int n = node(&g, "Concat", 2, S("x", "z"), 1, S("y"));
    attr_int(&g, n, "axis", 0);
    output(&g, "y");
    expect_error(&g, GP_ERR_SHAPE, "input 1 has shape [2, 4], which differs from input 0's [2, 3]");
}

static void test_gather_index_out_of_range(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 2, 13);
    ci64(&g, "data", 1, I64(3), I64(10, 20, 30));
    ci64(&g, "idx", 1, I64(2), I64(-3, 3));
    node(&g, "Gather", 2, S("data", "idx"), 1, S("y"));
    output(&g, "y");
    expect_error(&g, GP_ERR_INVALID, "index 3 is out of range for axis 0 of size 3");
}

static void test_squeeze_non_unit_axis(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 2, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 3, I64(1, 1, 3));
    ci64(&g, "ax", 1, I64(1), I64(2));
    node(&g, "Squeeze", 2, S("x", "ax"), 1, S("y"));
    output(&g, "y");
    expect_error(&g, GP_ERR_SHAPE, "cannot squeeze axis 2 of size 3");
}

/* ---- shapes of ops that run ---- */

static void test_runtime_shapes(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 2, 11);
    input(&g, "x", GP_DTYPE_FLOAT32, 3, I64(1, 5, 7));
    ci64(&g, "idx", 2, I64(2, 2), I64(0, 1, -1, 4));
    int n = node(&g, "Gather", 2, S("x", "idx"), 1, S("gathered"));
    attr_int(&g, n, "axis", 1);
    n = node(&g, "Flatten", 1, S("x"), 1, S("flat"));
    attr_int(&g, n, "axis", -1);
    n = node(&g, "Unsqueeze", 1, S("x"), 1, S("unsq"));
    attr_ints(&g, n, "axes", 2, I64(0, -1));
    node(&g, "Squeeze", 1, S("unsq"), 1, S("sq"));
    node(&g, "Transpose", 1, S("x"), 1, S("tr"));
    cf32(&g, "col", 2, I64(5, 1), F32(1, 2, 3, 4, 5));
    node(&g, "Greater", 2, S("x", "col"), 1, S("cmp"));
    node(&g, "Where", 3, S("cmp", "x", "col"), 1, S("w"));
    ci64(&g, "ecol", 2, I64(3, 1), I64(1, 2, 3));
    ci64(&g, "eshape", 1, I64(3), I64(2, 1, 4));
    node(&g, "Expand", 2, S("ecol", "eshape"), 1, S("ex"));
    output(&g, "gathered");
    output(&g, "flat");
    output(&g, "sq");
    output(&g, "unsq");
    output(&g, "tr");
    output(&g, "w");
    output(&g, "ex");
    finalize_ok(&g);
    expect_shape(&g, "gathered", 4, I64(2, 2, 2, 7));
    expect_shape(&g, "flat", 2, I64(10, 7));
    expect_shape(&g, "unsq", 5, I64(1, 2, 5, 7, 1));
    expect_shape(&g, "sq", 3, I64(2, 5, 7));
    expect_shape(&g, "tr", 3, I64(7, 5, 2));
    expect_shape(&g, "cmp", 3, I64(2, 5, 7));
    assert_int_equal(val(&g, "cmp")->dtype, GP_DTYPE_BOOL);
    expect_shape(&g, "w", 3, I64(2, 5, 7));
    expect_values(&g, "ex", GP_DTYPE_INT64, 3, I64(2, 3, 4),
                  D(1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
    assert_int_equal(g.n_nodes, 7);
    gp_graph_free(&g);
}

/* ---- folded values of shape ops ---- */

static void test_slice_fold(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 1, 13);
    ci64(&g, "v", 1, I64(10), I64(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
    ci64(&g, "m", 2, I64(3, 4), I64(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
    ci64(&g, "s9", 1, I64(1), I64(9));
    ci64(&g, "emin", 1, I64(1), I64(INT64_MIN));
    ci64(&g, "ax0", 1, I64(1), I64(0));
    ci64(&g, "stm3", 1, I64(1), I64(-3));
    ci64(&g, "st2", 1, I64(2), I64(1, -100));
    ci64(&g, "en2", 1, I64(2), I64(INT64_MAX, 100));
    ci64(&g, "ax2", 1, I64(2), I64(-2, 1));
    ci64(&g, "sp2", 1, I64(2), I64(1, 2));
    node(&g, "Slice", 5, S("v", "s9", "emin", "ax0", "stm3"), 1, S("back"));
    node(&g, "Slice", 5, S("m", "st2", "en2", "ax2", "sp2"), 1, S("sub"));
    node(&g, "Slice", 3, S("m", "en2", "st2"), 1, S("empty"));
    output(&g, "back");
    output(&g, "sub");
    output(&g, "empty");
    finalize_ok(&g);
    expect_values(&g, "back", GP_DTYPE_INT64, 1, I64(4), D(9, 6, 3, 0));
    expect_values(&g, "sub", GP_DTYPE_INT64, 2, I64(2, 2), D(4, 6, 8, 10));
    expect_shape(&g, "empty", 2, I64(0, 0));
    gp_graph_free(&g);

    /* Slice-1: attributes; the default axes are 0.. in order. */
    init(&g, 1, 9);
    ci64(&g, "m", 2, I64(3, 4), I64(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
    int n = node(&g, "Slice", 1, S("m"), 1, S("y"));
    attr_ints(&g, n, "starts", 2, I64(-1, 1));
    attr_ints(&g, n, "ends", 2, I64(3, 3));
    output(&g, "y");
    finalize_ok(&g);
    expect_values(&g, "y", GP_DTYPE_INT64, 2, I64(1, 2), D(9, 10));
    gp_graph_free(&g);
}

static void test_split_fold(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 1, 18);
    ci64(&g, "v", 1, I64(5), I64(1, 2, 3, 4, 5));
    ci64(&g, "m", 2, I64(2, 3), I64(1, 2, 3, 4, 5, 6));
    ci64(&g, "sizes", 1, I64(2), I64(1, 2));
    int n = node(&g, "Split", 1, S("v"), 2, S("a", "b"));
    attr_int(&g, n, "num_outputs", 2);
    n = node(&g, "Split", 2, S("m", "sizes"), 2, S("c", "d"));
    attr_int(&g, n, "axis", -1);
    output(&g, "a");
    output(&g, "b");
    output(&g, "c");
    output(&g, "d");
    finalize_ok(&g);
    expect_values(&g, "a", GP_DTYPE_INT64, 1, I64(3), D(1, 2, 3));
    expect_values(&g, "b", GP_DTYPE_INT64, 1, I64(2), D(4, 5));
    expect_values(&g, "c", GP_DTYPE_INT64, 2, I64(2, 1), D(1, 4));
    expect_values(&g, "d", GP_DTYPE_INT64, 2, I64(2, 2), D(2, 3, 5, 6));
    gp_graph_free(&g);

    /* Split-13 without sizes splits evenly, and refuses what does not divide. */
    init(&g, 1, 13);
    ci64(&g, "v", 1, I64(5), I64(1, 2, 3, 4, 5));
    node(&g, "Split", 1, S("v"), 2, S("a", "b"));
    output(&g, "a");
    expect_error(&g, GP_ERR_SHAPE, "size 5 does not split evenly into 2 outputs");
}

static void test_transpose_concat_gather_fold(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 1, 13);
    cf32(&g, "m", 2, I64(2, 3), F32(1, 2, 3, 4, 5, 6));
    ci64(&g, "rows", 1, I64(2), I64(2, -3));
    node(&g, "Transpose", 1, S("m"), 1, S("t"));
    int n = node(&g, "Concat", 2, S("m", "m"), 1, S("c"));
    attr_int(&g, n, "axis", 1);
    node(&g, "Gather", 2, S("t", "rows"), 1, S("g"));
    n = node(&g, "Gather", 2, S("m", "rows"), 1, S("g1"));
    attr_int(&g, n, "axis", 1);
    /* Only an integer output: float constants that reach a float output
     * through differentiable inputs would be trainable, hence not folded. */
    output(&g, "rows");
    finalize_ok(&g);
    assert_int_equal(g.n_nodes, 0);
    expect_values(&g, "t", GP_DTYPE_FLOAT32, 2, I64(3, 2), D(1, 4, 2, 5, 3, 6));
    expect_values(&g, "c", GP_DTYPE_FLOAT32, 2, I64(2, 6), D(1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6));
    expect_values(&g, "g", GP_DTYPE_FLOAT32, 2, I64(2, 2), D(3, 6, 1, 4));
    expect_values(&g, "g1", GP_DTYPE_FLOAT32, 2, I64(2, 2), D(3, 1, 6, 4));
    gp_graph_free(&g);
}

static void test_generators_fold(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 1, 14);
    ci64(&g, "i0", 0, NULL, I64(0));
    ci64(&g, "i10", 0, NULL, I64(10));
    ci64(&g, "i3", 0, NULL, I64(3));
    ci64(&g, "im2", 0, NULL, I64(-2));
    cf32(&g, "f1", 0, NULL, F32(1));
    cf32(&g, "f2", 0, NULL, F32(2));
    cf32(&g, "f03", 0, NULL, F32(0.3f));
    ci64(&g, "shape", 1, I64(2), I64(2, 3));
    ci64(&g, "row", 2, I64(1, 2), I64(1, 2));
    ci64(&g, "reps", 1, I64(2), I64(2, 2));
    ci64(&g, "sq", 2, I64(3, 3), I64(1, 2, 3, 4, 5, 6, 7, 8, 9));
    ci64(&g, "k1", 0, NULL, I64(1));
    node(&g, "Range", 3, S("i0", "i10", "i3"), 1, S("r"));
    node(&g, "Range", 3, S("i3", "i10", "im2"), 1, S("r_empty"));
    node(&g, "Range", 3, S("f1", "f2", "f03"), 1, S("rf"));
    node(&g, "ConstantOfShape", 1, S("shape"), 1, S("zeros"));
    int n = node(&g, "ConstantOfShape", 1, S("shape"), 1, S("sevens"));
    struct gp_shape one = {.rank = 1, .dims = {1}};
    struct gp_attr *a = attr(&g, n, "value", GP_ATTR_TENSOR);
    a->t = gp_graph_new_tensor(&g, GP_DTYPE_INT32, &one);
    gp_tensor_set_i64(a->t, 0, 7);
    node(&g, "Tile", 2, S("row", "reps"), 1, S("tiled"));
    node(&g, "Trilu", 2, S("sq", "k1"), 1, S("upper"));
    n = node(&g, "Trilu", 1, S("sq"), 1, S("lower"));
    attr_int(&g, n, "upper", 0);
    const char *outs[] = {"r", "r_empty", "rf", "zeros", "sevens", "tiled", "upper", "lower"};
    for (int i = 0; i < 8; i++) output(&g, outs[i]);
    finalize_ok(&g);
    assert_int_equal(g.n_nodes, 0);
    expect_values(&g, "r", GP_DTYPE_INT64, 1, I64(4), D(0, 3, 6, 9));
    expect_shape(&g, "r_empty", 1, I64(0));
    expect_values(&g, "rf", GP_DTYPE_FLOAT32, 1, I64(4),
                  D(1, 1 + (double)0.3f, 1 + 2 * (double)0.3f, 1 + 3 * (double)0.3f));
    expect_values(&g, "zeros", GP_DTYPE_FLOAT32, 2, I64(2, 3), D(0, 0, 0, 0, 0, 0));
    expect_values(&g, "sevens", GP_DTYPE_INT32, 2, I64(2, 3), D(7, 7, 7, 7, 7, 7));
    expect_values(&g, "tiled", GP_DTYPE_INT64, 2, I64(2, 4), D(1, 2, 1, 2, 1, 2, 1, 2));
    expect_values(&g, "upper", GP_DTYPE_INT64, 2, I64(3, 3), D(0, 2, 3, 0, 0, 6, 0, 0, 0));
    expect_values(&g, "lower", GP_DTYPE_INT64, 2, I64(3, 3), D(1, 0, 0, 4, 5, 0, 7, 8, 9));
    gp_graph_free(&g);
}

/* ScatterND folds (swin's shifted-window mask is one made of shapes):
 * rows, single cells with a negative index, and a reduction; an index out
 * of range and updates of the wrong shape are refused. ONNX's examples. */
static void test_scatter_nd_fold(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 1, 18);
    ci64(&g, "data", 2, I64(3, 2), I64(1, 2, 3, 4, 5, 6));
    ci64(&g, "rows", 2, I64(2, 1), I64(2, 0));
    ci64(&g, "rowvals", 2, I64(2, 2), I64(10, 11, 20, 21));
    ci64(&g, "cells", 2, I64(2, 2), I64(-1, 1, 0, 0));
    ci64(&g, "cellvals", 1, I64(2), I64(7, 8));
    node(&g, "ScatterND", 3, S("data", "rows", "rowvals"), 1, S("by_rows"));
    node(&g, "ScatterND", 3, S("data", "cells", "cellvals"), 1, S("by_cells"));
    int n = node(&g, "ScatterND", 3, S("data", "cells", "cellvals"), 1, S("added"));
    attr_str(&g, n, "reduction", "add");
    const char *outs[] = {"by_rows", "by_cells", "added"};
    for (int i = 0; i < 3; i++) output(&g, outs[i]);
    finalize_ok(&g);
    assert_int_equal(g.n_nodes, 0);
    expect_values(&g, "by_rows", GP_DTYPE_INT64, 2, I64(3, 2), D(20, 21, 3, 4, 10, 11));
    expect_values(&g, "by_cells", GP_DTYPE_INT64, 2, I64(3, 2), D(8, 2, 3, 4, 5, 7));
    expect_values(&g, "added", GP_DTYPE_INT64, 2, I64(3, 2), D(9, 2, 3, 4, 5, 13));
    gp_graph_free(&g);

    init(&g, 1, 13);
    ci64(&g, "data", 1, I64(3), I64(1, 2, 3));
    ci64(&g, "at", 2, I64(1, 1), I64(3));
    ci64(&g, "v", 1, I64(1), I64(9));
    node(&g, "ScatterND", 3, S("data", "at", "v"), 1, S("y"));
    output(&g, "y");
    expect_error(&g, GP_ERR_INVALID, "index 3 is out of range for axis 0 of size 3");

    init(&g, 1, 13);
    ci64(&g, "data", 1, I64(3), I64(1, 2, 3));
    ci64(&g, "at", 2, I64(1, 1), I64(0));
    ci64(&g, "v", 1, I64(2), I64(9, 9));
    node(&g, "ScatterND", 3, S("data", "at", "v"), 1, S("y"));
    output(&g, "y");
    expect_error(&g, GP_ERR_SHAPE, "updates have the wrong shape");

    /* On data it has no kernel: refused at load, naming the input. */
    init(&g, 1, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(1, 3));
    ci64(&g, "at", 2, I64(1, 1), I64(0));
    cf32(&g, "v", 2, I64(1, 3), F32(1, 2, 3));
    node(&g, "ScatterND", 3, S("x", "at", "v"), 1, S("y"));
    output(&g, "y");
    expect_error(&g, GP_ERR_UNSUPPORTED, "input 0 ('x') must be known at load time: ScatterND");

    /* A float initializer that reaches the output would be trained. */
    init(&g, 1, 13);
    cf32(&g, "w", 2, I64(1, 3), F32(0, 0, 0));
    ci64(&g, "at", 2, I64(1, 1), I64(0));
    cf32(&g, "v", 2, I64(1, 3), F32(1, 2, 3));
    node(&g, "ScatterND", 3, S("w", "at", "v"), 1, S("y"));
    output(&g, "y");
    expect_error(&g, GP_ERR_UNSUPPORTED, "on a trainable initializer");
}

static void test_constant_node(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 1, 13);
    int n = node(&g, "Constant", 0, NULL, 1, S("c"));
    attr_ints(&g, n, "value_ints", 3, I64(4, -1, 2));
    n = node(&g, "Constant", 0, NULL, 1, S("f"));
    attr(&g, n, "value_float", GP_ATTR_FLOAT)->f = 0.5f;
    output(&g, "c");
    output(&g, "f");
    finalize_ok(&g);
    expect_values(&g, "c", GP_DTYPE_INT64, 1, I64(3), D(4, -1, 2));
    expect_values(&g, "f", GP_DTYPE_FLOAT32, 0, NULL, D(0.5));
    gp_graph_free(&g);

    init(&g, 1, 13);
    n = node(&g, "Constant", 0, NULL, 1, S("c"));
    attr_int(&g, n, "value_int", 1);
    attr(&g, n, "value_float", GP_ATTR_FLOAT)->f = 1;
    output(&g, "c");
    expect_error(&g, GP_ERR_INVALID, "exactly one value attribute, found 2");
}

/* ---- folded values of elementwise ops ---- */

static void test_elementwise_fold(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 1, 13);
    ci64(&g, "a", 1, I64(4), I64(-7, 7, -7, 7));
    ci64(&g, "b", 1, I64(4), I64(2, 2, -2, -2));
    cf32(&g, "x", 2, I64(2, 2), F32(-2.7f, 0.1f, 2.5f, 3.5f));
    cf32(&g, "col", 2, I64(2, 1), F32(1, 10));
    cany(&g, "cond", GP_DTYPE_BOOL, 1, I64(2), D(1, 0));
    cf32(&g, "lo", 0, NULL, F32(0));
    cf32(&g, "hi", 0, NULL, F32(3));
    node(&g, "Div", 2, S("a", "b"), 1, S("div"));
    node(&g, "Mod", 2, S("a", "b"), 1, S("mod"));
    int n = node(&g, "Mod", 2, S("a", "b"), 1, S("fmod"));
    attr_int(&g, n, "fmod", 1);
    n = node(&g, "Cast", 1, S("x"), 1, S("trunc"));
    attr_int(&g, n, "to", GP_DTYPE_INT64);
    node(&g, "Round", 1, S("x"), 1, S("round"));
    node(&g, "Add", 2, S("x", "col"), 1, S("add"));
    node(&g, "Equal", 2, S("mod", "fmod"), 1, S("eq"));
    node(&g, "Where", 3, S("cond", "x", "col"), 1, S("where"));
    node(&g, "Max", 3, S("x", "col", "lo"), 1, S("max"));
    node(&g, "Clip", 3, S("x", "lo", "hi"), 1, S("clip"));
    ci64(&g, "two", 0, NULL, I64(2));
    node(&g, "Pow", 2, S("x", "two"), 1, S("pow"));
    node(&g, "Abs", 1, S("a"), 1, S("abs"));
    /* Integer outputs only, so that no float constant counts as trainable. */
    output(&g, "div");
    output(&g, "eq");
    finalize_ok(&g);
    assert_int_equal(g.n_nodes, 0);
    expect_values(&g, "div", GP_DTYPE_INT64, 1, I64(4), D(-3, 3, 3, -3));
    expect_values(&g, "mod", GP_DTYPE_INT64, 1, I64(4), D(1, 1, -1, -1));
    expect_values(&g, "fmod", GP_DTYPE_INT64, 1, I64(4), D(-1, 1, -1, 1));
    expect_values(&g, "trunc", GP_DTYPE_INT64, 2, I64(2, 2), D(-2, 0, 2, 3));
    expect_values(&g, "round", GP_DTYPE_FLOAT32, 2, I64(2, 2), D(-3, 0, 2, 4));
    expect_values(&g, "add", GP_DTYPE_FLOAT32, 2, I64(2, 2),
                  D((float)(-2.7f + 1), (float)(0.1f + 1), 12.5, 13.5));
    expect_values(&g, "eq", GP_DTYPE_BOOL, 1, I64(4), D(0, 1, 1, 0));
    expect_values(&g, "where", GP_DTYPE_FLOAT32, 2, I64(2, 2), D(-2.7f, 1, 2.5, 10));
    expect_values(&g, "max", GP_DTYPE_FLOAT32, 2, I64(2, 2), D(1, 1, 10, 10));
    expect_values(&g, "clip", GP_DTYPE_FLOAT32, 2, I64(2, 2), D(0, 0.1f, 2.5, 3));
    expect_values(&g, "pow", GP_DTYPE_FLOAT32, 2, I64(2, 2),
                  D((double)-2.7f * -2.7f, (double)0.1f * 0.1f, 6.25, 12.25));
    expect_values(&g, "abs", GP_DTYPE_INT64, 1, I64(4), D(7, 7, 7, 7));
    gp_graph_free(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exporter_chain_binds_batch),
        cmocka_unit_test(test_shape_arithmetic_chain),
        cmocka_unit_test(test_shape_window_and_size),
        cmocka_unit_test(test_reshape_zero_and_wildcard),
        cmocka_unit_test(test_reshape_count_mismatch_hint),
        cmocka_unit_test(test_reshape_shape_from_data),
        cmocka_unit_test(test_reshape_two_wildcards),
        cmocka_unit_test(test_broadcast_error),
        cmocka_unit_test(test_bad_axis),
        cmocka_unit_test(test_concat_mismatch),
        cmocka_unit_test(test_gather_index_out_of_range),
        cmocka_unit_test(test_squeeze_non_unit_axis),
        cmocka_unit_test(test_runtime_shapes),
        cmocka_unit_test(test_slice_fold),
        cmocka_unit_test(test_split_fold),
        cmocka_unit_test(test_transpose_concat_gather_fold),
        cmocka_unit_test(test_generators_fold),
        cmocka_unit_test(test_scatter_nd_fold),
        cmocka_unit_test(test_constant_node),
        cmocka_unit_test(test_elementwise_fold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
