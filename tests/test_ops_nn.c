/* Shape inference of the nn and math op families (src/ops/nn.c, math.c) on
 * one-node graphs built by hand. Expected shapes are computed from the
 * formulas written beside each case (PyTorch's and ONNX's), and were checked
 * against onnxruntime running the same nodes. The attribute table at the top
 * is ONNX 1.23's schemas for every since-version up to opset 21. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/build.h"
#include "ops/registry.h"

#define S(...) ((const char *const[]){__VA_ARGS__})
#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))
/* An int64 list and its length, for dims, ints attributes and constants. */
#define I64(...) N_OF(((const int64_t[]){__VA_ARGS__})), ((const int64_t[]){__VA_ARGS__})
#define F32(...) N_OF(((const float[]){__VA_ARGS__})), ((const float[]){__VA_ARGS__})

/* ---- graph building ---- */

static void begin(struct gp_graph *g, int64_t opset, int64_t batch)
{
    struct gp_error err = {0};
    assert_int_equal(gp_graph_init(g, batch, opset, 64, 16, &err), GP_OK);
}

static struct gp_shape shape_of(int rank, const int64_t *dims)
{
    struct gp_shape s = {.rank = rank};
    for (int i = 0; i < rank; i++) s.dims[i] = dims[i];
    return s;
}

/* A graph input; its axis 0 is rebound to the graph's batch. */
static void input_t(struct gp_graph *g, const char *name, enum gp_dtype dtype, int rank,
                    const int64_t *dims)
{
    struct gp_error err = {0};
    struct gp_shape s = shape_of(rank, dims);
    if (gp_graph_add_input(g, name, dtype, &s, &err) != GP_OK) fail_msg("%s", err.msg);
}

static void input(struct gp_graph *g, const char *name, int rank, const int64_t *dims)
{
    input_t(g, name, GP_DTYPE_FLOAT32, rank, dims);
}

/* A float32 initializer of the given shape filled with `fill`. */
static void weight(struct gp_graph *g, const char *name, int rank, const int64_t *dims)
{
    struct gp_error err = {0};
    struct gp_shape s = shape_of(rank, dims);
    int64_t n = gp_shape_numel(&s);
    float *data = calloc((size_t)(n ? n : 1), sizeof *data);
    assert_non_null(data);
    for (int64_t i = 0; i < n; i++) data[i] = 0.5f;
    gp_status st = gp_graph_add_const_f32(g, name, &s, data, &err);
    free(data);
    if (st != GP_OK) fail_msg("%s", err.msg);
}

/* 1-D constants with the given values. */
static void const_f32(struct gp_graph *g, const char *name, int n, const float *v)
{
    struct gp_error err = {0};
    struct gp_shape s = {.rank = 1, .dims = {n}};
    if (gp_graph_add_const_f32(g, name, &s, v, &err) != GP_OK) fail_msg("%s", err.msg);
}

static void const_i64(struct gp_graph *g, const char *name, int n, const int64_t *v)
{
    struct gp_error err = {0};
    struct gp_shape s = {.rank = 1, .dims = {n}};
    if (gp_graph_add_const_i64(g, name, &s, v, &err) != GP_OK) fail_msg("%s", err.msg);
}

/* A scalar constant of any dtype (ratio, training_mode, constant_value). */
static void const_scalar(struct gp_graph *g, const char *name, enum gp_dtype dtype, double v)
{
    struct gp_error err = {0};
    struct gp_shape s = {.rank = 0};
    struct gp_tensor *t = gp_graph_new_tensor(g, dtype, &s);
    assert_non_null(t);
    gp_tensor_set_f64(t, 0, v);
    if (gp_graph_add_initializer(g, name, t, &err) != GP_OK) fail_msg("%s", err.msg);
}

static int add_node(struct gp_graph *g, const char *name, const char *op, int ni,
                    const char *const *in, int no, const char *const *out)
{
    struct gp_error err = {0};
    int id = gp_graph_add_node(g, op, "", name, ni, in, no, out, &err);
    if (id < 0) fail_msg("%s", err.msg);
    return id;
}

/* The node under test, "n0", whose outputs are all graph outputs. */
static int node(struct gp_graph *g, const char *op, int ni, const char *const *in, int no,
                const char *const *out)
{
    struct gp_error err = {0};
    int id = add_node(g, "n0", op, ni, in, no, out);
    for (int i = 0; i < no; i++)
        if (out[i] && *out[i] && gp_graph_add_output(g, out[i], &err) != GP_OK)
            fail_msg("%s", err.msg);
    return id;
}

static struct gp_attr *attr(struct gp_graph *g, int n, const char *name, enum gp_attr_type type)
{
    struct gp_error err = {0};
    struct gp_attr *a = gp_graph_add_attr(g, n, name, type, 16, &err);
    if (!a) fail_msg("%s", err.msg);
    return a;
}

static void attr_i(struct gp_graph *g, int n, const char *name, int64_t v)
{
    attr(g, n, name, GP_ATTR_INT)->i = v;
}

static void attr_f(struct gp_graph *g, int n, const char *name, float v)
{
    attr(g, n, name, GP_ATTR_FLOAT)->f = v;
}

static void attr_s(struct gp_graph *g, int n, const char *name, const char *v)
{
    attr(g, n, name, GP_ATTR_STRING)->s = gp_arena_strdup(&g->arena, v);
}

static void attr_ints(struct gp_graph *g, int n, const char *name, int count, const int64_t *v)
{
    struct gp_attr *a = attr(g, n, name, GP_ATTR_INTS);
    a->count = count;
    a->ints = gp_arena_memdup(&g->arena, v, sizeof *v * (size_t)count);
}

static void attr_floats(struct gp_graph *g, int n, const char *name, int count, const float *v)
{
    struct gp_attr *a = attr(g, n, name, GP_ATTR_FLOATS);
    a->count = count;
    a->floats = gp_arena_memdup(&g->arena, v, sizeof *v * (size_t)count);
}

/* BatchNormalization's scale "s", bias "b", mean "m" and var "v", each [c]. */
static void bn_params(struct gp_graph *g, int64_t c)
{
    static const char *const names[] = {"s", "b", "m", "v"};
    for (int i = 0; i < 4; i++) weight(g, names[i], 1, &c);
}

/* ---- checking ---- */

static void finalize_ok(struct gp_graph *g)
{
    struct gp_error err = {0};
    if (gp_graph_finalize(g, &err) != GP_OK) fail_msg("finalize failed: %s", err.msg);
}

static void check_value(const struct gp_graph *g, const char *name, enum gp_dtype dtype,
                         int rank, const int64_t *dims)
{
    int id = gp_graph_find_value(g, name);
    if (id < 0) fail_msg("no value '%s'", name);
    const struct gp_value *v = &g->values[id];
    struct gp_shape want = shape_of(rank, dims);
    char a[160], b[160];
    if (!v->has_shape || !gp_shape_equal(&v->shape, &want))
        fail_msg("'%s' has shape %s, expected %s", name, gp_shape_format(&v->shape, a, sizeof a),
                 gp_shape_format(&want, b, sizeof b));
    if (v->dtype != dtype)
        fail_msg("'%s' is %s, expected %s", name, gp_dtype_name(v->dtype), gp_dtype_name(dtype));
}

static void check_shape(const struct gp_graph *g, const char *name, int rank, const int64_t *dims)
{
    check_value(g, name, GP_DTYPE_FLOAT32, rank, dims);
}

/* Finalize fails with `status` and a message holding every needle. Frees g. */
static void expect_error(struct gp_graph *g, gp_status status, const char *needle,
                         const char *needle2)
{
    struct gp_error err = {0};
    gp_status st = gp_graph_finalize(g, &err);
    if (st != status) fail_msg("expected status %d, got %d: %s", status, st, err.msg);
    if (!strstr(err.msg, needle)) fail_msg("message '%s' lacks '%s'", err.msg, needle);
    if (needle2 && !strstr(err.msg, needle2)) fail_msg("message '%s' lacks '%s'", err.msg, needle2);
    gp_graph_free(g);
}

/* ---- the registry against ONNX's schemas ---- */

struct schema {
    const char *op;
    int since, min_in, max_in, min_out, max_out;
    const char *attrs; /* sorted "name:type" list */
};

/* Generated from onnx.defs.get_schema for each since-version from the first
 * one supported up to opset 21. */
static const struct schema schemas[] = {
    {"Conv", 1, 2, 3, 1, 1, "auto_pad:s,dilations:I,group:i,kernel_shape:I,pads:I,strides:I"},
    {"Conv", 11, 2, 3, 1, 1, "auto_pad:s,dilations:I,group:i,kernel_shape:I,pads:I,strides:I"},
    {"ConvTranspose", 1, 2, 3, 1, 1, "auto_pad:s,dilations:I,group:i,kernel_shape:I,"
     "output_padding:I,output_shape:I,pads:I,strides:I"},
    {"ConvTranspose", 11, 2, 3, 1, 1, "auto_pad:s,dilations:I,group:i,kernel_shape:I,"
     "output_padding:I,output_shape:I,pads:I,strides:I"},
    {"MaxPool", 1, 1, 1, 1, 1, "auto_pad:s,kernel_shape:I,pads:I,strides:I"},
    {"MaxPool", 8, 1, 1, 1, 2, "auto_pad:s,kernel_shape:I,pads:I,storage_order:i,strides:I"},
    {"MaxPool", 10, 1, 1, 1, 2, "auto_pad:s,ceil_mode:i,dilations:I,kernel_shape:I,pads:I,"
     "storage_order:i,strides:I"},
    {"MaxPool", 11, 1, 1, 1, 2, "auto_pad:s,ceil_mode:i,dilations:I,kernel_shape:I,pads:I,"
     "storage_order:i,strides:I"},
    {"MaxPool", 12, 1, 1, 1, 2, "auto_pad:s,ceil_mode:i,dilations:I,kernel_shape:I,pads:I,"
     "storage_order:i,strides:I"},
    {"AveragePool", 1, 1, 1, 1, 1, "auto_pad:s,kernel_shape:I,pads:I,strides:I"},
    {"AveragePool", 7, 1, 1, 1, 1, "auto_pad:s,count_include_pad:i,kernel_shape:I,pads:I,"
     "strides:I"},
    {"AveragePool", 10, 1, 1, 1, 1, "auto_pad:s,ceil_mode:i,count_include_pad:i,kernel_shape:I,"
     "pads:I,strides:I"},
    {"AveragePool", 11, 1, 1, 1, 1, "auto_pad:s,ceil_mode:i,count_include_pad:i,kernel_shape:I,"
     "pads:I,strides:I"},
    {"AveragePool", 19, 1, 1, 1, 1, "auto_pad:s,ceil_mode:i,count_include_pad:i,dilations:I,"
     "kernel_shape:I,pads:I,strides:I"},
    {"GlobalAveragePool", 1, 1, 1, 1, 1, ""},
    {"GlobalMaxPool", 1, 1, 1, 1, 1, ""},
    {"BatchNormalization", 7, 5, 5, 1, 5, "epsilon:f,momentum:f,spatial:i"},
    {"BatchNormalization", 9, 5, 5, 1, 5, "epsilon:f,momentum:f"},
    {"BatchNormalization", 14, 5, 5, 1, 3, "epsilon:f,momentum:f,training_mode:i"},
    {"BatchNormalization", 15, 5, 5, 1, 3, "epsilon:f,momentum:f,training_mode:i"},
    {"InstanceNormalization", 6, 3, 3, 1, 1, "epsilon:f"},
    {"LayerNormalization", 17, 2, 3, 1, 3, "axis:i,epsilon:f,stash_type:i"},
    {"Dropout", 7, 1, 1, 1, 2, "ratio:f"},
    {"Dropout", 10, 1, 1, 1, 2, "ratio:f"},
    {"Dropout", 12, 1, 3, 1, 2, "seed:i"},
    {"Dropout", 13, 1, 3, 1, 2, "seed:i"},
    {"Resize", 10, 2, 2, 1, 1, "mode:s"},
    {"Resize", 11, 3, 4, 1, 1, "coordinate_transformation_mode:s,cubic_coeff_a:f,"
     "exclude_outside:i,extrapolation_value:f,mode:s,nearest_mode:s"},
    {"Resize", 13, 1, 4, 1, 1, "coordinate_transformation_mode:s,cubic_coeff_a:f,"
     "exclude_outside:i,extrapolation_value:f,mode:s,nearest_mode:s"},
    {"Resize", 18, 1, 4, 1, 1, "antialias:i,axes:I,coordinate_transformation_mode:s,"
     "cubic_coeff_a:f,exclude_outside:i,extrapolation_value:f,keep_aspect_ratio_policy:s,"
     "mode:s,nearest_mode:s"},
    {"Resize", 19, 1, 4, 1, 1, "antialias:i,axes:I,coordinate_transformation_mode:s,"
     "cubic_coeff_a:f,exclude_outside:i,extrapolation_value:f,keep_aspect_ratio_policy:s,"
     "mode:s,nearest_mode:s"},
    {"Upsample", 7, 1, 1, 1, 1, "mode:s,scales:F"},
    {"Upsample", 9, 2, 2, 1, 1, "mode:s"},
    {"Upsample", 10, 2, 2, 1, 1, "mode:s"},
    {"Pad", 2, 1, 1, 1, 1, "mode:s,pads:I,value:f"},
    {"Pad", 11, 2, 3, 1, 1, "mode:s"},
    {"Pad", 13, 2, 3, 1, 1, "mode:s"},
    {"Pad", 18, 2, 4, 1, 1, "mode:s"},
    {"Pad", 19, 2, 4, 1, 1, "mode:s"},
    {"Pad", 21, 2, 4, 1, 1, "mode:s"},
    {"Gemm", 7, 3, 3, 1, 1, "alpha:f,beta:f,transA:i,transB:i"},
    {"Gemm", 9, 3, 3, 1, 1, "alpha:f,beta:f,transA:i,transB:i"},
    {"Gemm", 11, 2, 3, 1, 1, "alpha:f,beta:f,transA:i,transB:i"},
    {"Gemm", 13, 2, 3, 1, 1, "alpha:f,beta:f,transA:i,transB:i"},
    {"MatMul", 1, 2, 2, 1, 1, ""},
    {"MatMul", 9, 2, 2, 1, 1, ""},
    {"MatMul", 13, 2, 2, 1, 1, ""},
    {"Softmax", 1, 1, 1, 1, 1, "axis:i"},
    {"Softmax", 11, 1, 1, 1, 1, "axis:i"},
    {"Softmax", 13, 1, 1, 1, 1, "axis:i"},
    {"LogSoftmax", 1, 1, 1, 1, 1, "axis:i"},
    {"LogSoftmax", 11, 1, 1, 1, 1, "axis:i"},
    {"LogSoftmax", 13, 1, 1, 1, 1, "axis:i"},
    {"ReduceMean", 1, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceMean", 11, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceMean", 13, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceMean", 18, 1, 2, 1, 1, "keepdims:i,noop_with_empty_axes:i"},
    {"ReduceSum", 1, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceSum", 11, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceSum", 13, 1, 2, 1, 1, "keepdims:i,noop_with_empty_axes:i"},
    {"ReduceMax", 1, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceMax", 11, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceMax", 12, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceMax", 13, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceMax", 18, 1, 2, 1, 1, "keepdims:i,noop_with_empty_axes:i"},
    {"ReduceMax", 20, 1, 2, 1, 1, "keepdims:i,noop_with_empty_axes:i"},
    {"ReduceMin", 1, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceMin", 11, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceMin", 12, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceMin", 13, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceMin", 18, 1, 2, 1, 1, "keepdims:i,noop_with_empty_axes:i"},
    {"ReduceMin", 20, 1, 2, 1, 1, "keepdims:i,noop_with_empty_axes:i"},
    {"ReduceProd", 1, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceProd", 11, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceProd", 13, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceProd", 18, 1, 2, 1, 1, "keepdims:i,noop_with_empty_axes:i"},
    {"ReduceSumSquare", 1, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceSumSquare", 11, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceSumSquare", 13, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceSumSquare", 18, 1, 2, 1, 1, "keepdims:i,noop_with_empty_axes:i"},
    {"ReduceL2", 1, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceL2", 11, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceL2", 13, 1, 1, 1, 1, "axes:I,keepdims:i"},
    {"ReduceL2", 18, 1, 2, 1, 1, "keepdims:i,noop_with_empty_axes:i"},
    {"ArgMax", 1, 1, 1, 1, 1, "axis:i,keepdims:i"},
    {"ArgMax", 11, 1, 1, 1, 1, "axis:i,keepdims:i"},
    {"ArgMax", 12, 1, 1, 1, 1, "axis:i,keepdims:i,select_last_index:i"},
    {"ArgMax", 13, 1, 1, 1, 1, "axis:i,keepdims:i,select_last_index:i"},
    {"ArgMin", 1, 1, 1, 1, 1, "axis:i,keepdims:i"},
    {"ArgMin", 11, 1, 1, 1, 1, "axis:i,keepdims:i"},
    {"ArgMin", 12, 1, 1, 1, 1, "axis:i,keepdims:i,select_last_index:i"},
    {"ArgMin", 13, 1, 1, 1, 1, "axis:i,keepdims:i,select_last_index:i"},
};

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The comma-separated list, sorted, back into buf. */
static const char *sorted_list(const char *list, char *buf, size_t size)
{
    char tmp[512];
    const char *items[32];
    int n = 0;
    snprintf(tmp, sizeof tmp, "%s", list ? list : "");
    for (char *tok = strtok(tmp, ","); tok && n < 32; tok = strtok(NULL, ",")) items[n++] = tok;
    qsort(items, (size_t)n, sizeof *items, cmp_str);
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%s", i ? "," : "", items[i]);
    return buf;
}

/* Each since-version resolves to an entry whose arity and attributes are
 * exactly ONNX's, so every valid model passes the loader's checks. */
static void test_registry_matches_onnx_schemas(void **state)
{
    (void)state;
    for (int i = 0; i < N_OF(schemas); i++) {
        const struct schema *s = &schemas[i];
        bool known = false;
        const struct gp_op_def *d = gp_op_lookup("", s->op, s->since, &known);
        if (!d) fail_msg("%s-%d resolves to nothing", s->op, s->since);
        if (!d->infer) fail_msg("%s-%d has no infer function", s->op, s->since);
        if (d->min_inputs != s->min_in || d->max_inputs != s->max_in ||
            d->min_outputs != s->min_out || d->max_outputs != s->max_out)
            fail_msg("%s-%d (entry %d): arity in %d..%d out %d..%d, ONNX says in %d..%d out "
                     "%d..%d",
                     s->op, s->since, d->since_version, d->min_inputs, d->max_inputs,
                     d->min_outputs, d->max_outputs, s->min_in, s->max_in, s->min_out,
                     s->max_out);
        char got[512];
        sorted_list(d->attrs, got, sizeof got);
        if (strcmp(got, s->attrs) != 0)
            fail_msg("%s-%d (entry %d): attributes '%s', ONNX says '%s'", s->op, s->since,
                     d->since_version, got, s->attrs);
    }
    /* Older versions than supported are refused, not silently mistaken. */
    bool known = false;
    assert_null(gp_op_lookup("", "BatchNormalization", 6, &known));
    assert_true(known);
    assert_null(gp_op_lookup("", "Gemm", 6, &known));
}

/* Which inputs never take a gradient decides which initializers train. */
static void test_nondiff_inputs(void **state)
{
    (void)state;
    struct gp_graph g;
    begin(&g, 15, 2);
    input(&g, "x", I64(2, 3, 4, 4));
    bn_params(&g, 3);
    int n = node(&g, "BatchNormalization", 5, S("x", "s", "b", "m", "v"), 3,
                 S("y", "rm", "rv"));
    attr_i(&g, n, "training_mode", 1);
    finalize_ok(&g);
    assert_int_equal(g.values[gp_graph_find_value(&g, "s")].kind, GP_VALUE_PARAMETER);
    assert_int_equal(g.values[gp_graph_find_value(&g, "b")].kind, GP_VALUE_PARAMETER);
    assert_int_equal(g.values[gp_graph_find_value(&g, "m")].kind, GP_VALUE_BUFFER);
    assert_int_equal(g.values[gp_graph_find_value(&g, "v")].kind, GP_VALUE_BUFFER);
    check_shape(&g, "y", I64(2, 3, 4, 4));
    check_shape(&g, "rm", I64(3));
    check_shape(&g, "rv", I64(3));
    gp_graph_free(&g);
}

/* ---- convolution ---- */

/* out = floor((in + pad_begin + pad_end - dilation * (k - 1) - 1) / stride) + 1 */
static void test_conv_shapes(void **state)
{
    (void)state;
    struct gp_graph g;
    /* 2-D, 3x3, pad 1: same size. */
    begin(&g, 17, 2);
    input(&g, "x", I64(2, 3, 32, 32));
    weight(&g, "w", I64(16, 3, 3, 3));
    weight(&g, "b", I64(16));
    int n = node(&g, "Conv", 3, S("x", "w", "b"), 1, S("y"));
    attr_ints(&g, n, "pads", I64(1, 1, 1, 1));
    finalize_ok(&g);
    check_shape(&g, "y", I64(2, 16, 32, 32));
    gp_graph_free(&g);

    /* Asymmetric pads, strides, dilations, groups: H (11+1+2-5)/2+1 = 5,
     * W (9+0+1-2)/3+1 = 3. */
    begin(&g, 11, 1);
    input(&g, "x", I64(1, 4, 11, 9));
    weight(&g, "w", I64(8, 2, 3, 2));
    n = node(&g, "Conv", 2, S("x", "w"), 1, S("y"));
    attr_i(&g, n, "group", 2);
    attr_ints(&g, n, "strides", I64(2, 3));
    attr_ints(&g, n, "dilations", I64(2, 1));
    attr_ints(&g, n, "pads", I64(1, 0, 2, 1));
    attr_ints(&g, n, "kernel_shape", I64(3, 2));
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 8, 5, 3));
    gp_graph_free(&g);

    /* 1-D VALID: (10-3)/2+1 = 4. */
    begin(&g, 13, 2);
    input(&g, "x", I64(2, 4, 10));
    weight(&g, "w", I64(6, 4, 3));
    n = node(&g, "Conv", 2, S("x", "w"), 1, S("y"));
    attr_ints(&g, n, "strides", I64(2));
    attr_s(&g, n, "auto_pad", "VALID");
    finalize_ok(&g);
    check_shape(&g, "y", I64(2, 6, 4));
    gp_graph_free(&g);

    /* 3-D: D (5+2-3)/1+1 = 5, H (6+2-3)/2+1 = 3, W (7+2-3)/3+1 = 3. */
    begin(&g, 17, 1);
    input(&g, "x", I64(1, 2, 5, 6, 7));
    weight(&g, "w", I64(4, 2, 3, 3, 3));
    n = node(&g, "Conv", 2, S("x", "w"), 1, S("y"));
    attr_ints(&g, n, "strides", I64(1, 2, 3));
    attr_ints(&g, n, "pads", I64(1, 1, 1, 1, 1, 1));
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 4, 5, 3, 3));
    gp_graph_free(&g);

    /* SAME_UPPER and SAME_LOWER: ceil(in / stride) = ceil(7/2), ceil(8/3). */
    for (int lower = 0; lower < 2; lower++) {
        begin(&g, 17, 1);
        input(&g, "x", I64(1, 3, 7, 8));
        weight(&g, "w", I64(5, 3, 3, 2));
        n = node(&g, "Conv", 2, S("x", "w"), 1, S("y"));
        attr_ints(&g, n, "strides", I64(2, 3));
        attr_s(&g, n, "auto_pad", lower ? "SAME_LOWER" : "SAME_UPPER");
        finalize_ok(&g);
        check_shape(&g, "y", I64(1, 5, 4, 3));
        gp_graph_free(&g);
    }

    /* Depthwise: group = C = M. */
    begin(&g, 17, 1);
    input(&g, "x", I64(1, 8, 5, 5));
    weight(&g, "w", I64(8, 1, 3, 3));
    n = node(&g, "Conv", 2, S("x", "w"), 1, S("y"));
    attr_i(&g, n, "group", 8);
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 8, 3, 3));
    gp_graph_free(&g);
}

static void test_conv_errors(void **state)
{
    (void)state;
    struct gp_graph g;
    begin(&g, 17, 1);
    input(&g, "x", I64(1, 3, 8, 8));
    weight(&g, "w", I64(4, 4, 3, 3));
    node(&g, "Conv", 2, S("x", "w"), 1, S("y"));
    expect_error(&g, GP_ERR_SHAPE, "node 'n0' (Conv): input has 3 channels but the weight "
                 "[4, 4, 3, 3] expects 4 (group 1)", NULL);

    begin(&g, 17, 1);
    input(&g, "x", I64(1, 6, 8, 8));
    weight(&g, "w", I64(4, 3, 3, 3));
    attr_i(&g, node(&g, "Conv", 2, S("x", "w"), 1, S("y")), "group", 4);
    expect_error(&g, GP_ERR_SHAPE, "input has 6 channels, which group 4 does not divide", NULL);

    begin(&g, 17, 1);
    input(&g, "x", I64(1, 6, 8, 8));
    weight(&g, "w", I64(5, 3, 3, 3));
    attr_i(&g, node(&g, "Conv", 2, S("x", "w"), 1, S("y")), "group", 2);
    expect_error(&g, GP_ERR_SHAPE, "weight has 5 output channels, which group 2", NULL);

    begin(&g, 17, 1);
    input(&g, "x", I64(1, 3, 8, 8));
    weight(&g, "w", I64(4, 3, 3, 3));
    weight(&g, "b", I64(3));
    node(&g, "Conv", 3, S("x", "w", "b"), 1, S("y"));
    expect_error(&g, GP_ERR_SHAPE, "bias 'b' has shape [3]; expected [4]", NULL);

    begin(&g, 17, 1);
    input(&g, "x", I64(1, 3, 4, 4));
    weight(&g, "w", I64(4, 3, 3, 3));
    attr_ints(&g, node(&g, "Conv", 2, S("x", "w"), 1, S("y")), "dilations", I64(2, 1));
    expect_error(&g, GP_ERR_SHAPE, "spatial axis 0: the window extent 5", "padded input size 4");

    begin(&g, 17, 1);
    input(&g, "x", I64(1, 3, 8, 8));
    weight(&g, "w", I64(4, 3, 3, 3));
    attr_ints(&g, node(&g, "Conv", 2, S("x", "w"), 1, S("y")), "kernel_shape", I64(3, 2));
    expect_error(&g, GP_ERR_SHAPE, "kernel_shape [3, 2] disagrees with the weight's", NULL);

    begin(&g, 17, 1);
    input(&g, "x", I64(1, 3, 8, 8));
    weight(&g, "w", I64(4, 3, 3, 3));
    attr_ints(&g, node(&g, "Conv", 2, S("x", "w"), 1, S("y")), "pads", I64(1, 1));
    expect_error(&g, GP_ERR_INVALID, "pads [1, 1] has 2 entries, expected 4", NULL);

    begin(&g, 17, 1);
    input(&g, "x", I64(1, 3, 8, 8));
    weight(&g, "w", I64(4, 3, 3));
    node(&g, "Conv", 2, S("x", "w"), 1, S("y"));
    expect_error(&g, GP_ERR_SHAPE, "weight has shape [4, 3, 3] but the input [1, 3, 8, 8]", NULL);
}

/* out = (in - 1) * stride - pad_begin - pad_end + dilation * (k - 1) + output_padding + 1 */
static void test_conv_transpose_shapes(void **state)
{
    (void)state;
    struct gp_graph g;
    /* 4*2 - 2 + 2 + 1 + 1 = 10. */
    begin(&g, 17, 1);
    input(&g, "x", I64(1, 4, 5, 5));
    weight(&g, "w", I64(4, 3, 3, 3));
    weight(&g, "b", I64(3));
    int n = node(&g, "ConvTranspose", 3, S("x", "w", "b"), 1, S("y"));
    attr_ints(&g, n, "strides", I64(2, 2));
    attr_ints(&g, n, "pads", I64(1, 1, 1, 1));
    attr_ints(&g, n, "output_padding", I64(1, 1));
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 3, 10, 10));
    gp_graph_free(&g);

    /* Groups: M = 2 * 2; H 2*1 + 2*1 + 1 = 5, W 3*2 + 2 + 1 = 9. */
    begin(&g, 17, 1);
    input(&g, "x", I64(1, 4, 3, 4));
    weight(&g, "w", I64(4, 2, 2, 3));
    n = node(&g, "ConvTranspose", 2, S("x", "w"), 1, S("y"));
    attr_i(&g, n, "group", 2);
    attr_ints(&g, n, "strides", I64(1, 2));
    attr_ints(&g, n, "dilations", I64(2, 1));
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 4, 5, 9));
    gp_graph_free(&g);

    /* output_shape wins; SAME_UPPER gives in * stride. */
    begin(&g, 17, 1);
    input(&g, "x", I64(1, 2, 3, 3));
    weight(&g, "w", I64(2, 1, 3, 3));
    n = node(&g, "ConvTranspose", 2, S("x", "w"), 1, S("y"));
    attr_ints(&g, n, "strides", I64(2, 2));
    attr_ints(&g, n, "output_shape", I64(6, 7));
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 1, 6, 7));
    gp_graph_free(&g);

    begin(&g, 17, 1);
    input(&g, "x", I64(1, 2, 3, 4));
    weight(&g, "w", I64(2, 2, 3, 3));
    n = node(&g, "ConvTranspose", 2, S("x", "w"), 1, S("y"));
    attr_ints(&g, n, "strides", I64(2, 3));
    attr_s(&g, n, "auto_pad", "SAME_UPPER");
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 2, 6, 12));
    gp_graph_free(&g);

    /* The weight is [C, M/group, ...]: its axis 0 must match C. */
    begin(&g, 17, 1);
    input(&g, "x", I64(1, 4, 3, 3));
    weight(&g, "w", I64(3, 4, 3, 3));
    node(&g, "ConvTranspose", 2, S("x", "w"), 1, S("y"));
    expect_error(&g, GP_ERR_SHAPE, "input has 4 channels but the weight [3, 4, 3, 3] expects 3",
                 NULL);

    begin(&g, 17, 1);
    input(&g, "x", I64(1, 4, 3, 3));
    weight(&g, "w", I64(4, 4, 3, 3));
    n = node(&g, "ConvTranspose", 2, S("x", "w"), 1, S("y"));
    attr_ints(&g, n, "output_padding", I64(1, 0));
    expect_error(&g, GP_ERR_INVALID, "output_padding[0] is 1; it must be smaller than the stride",
                 NULL);
}

/* ---- pooling ---- */

static void test_pool_shapes(void **state)
{
    (void)state;
    struct gp_graph g;
    /* (32+2-3)/2+1 = 16, with int64 Indices. */
    begin(&g, 17, 1);
    input(&g, "x", I64(1, 3, 32, 32));
    int n = node(&g, "MaxPool", 1, S("x"), 2, S("y", "idx"));
    attr_ints(&g, n, "kernel_shape", I64(3, 3));
    attr_ints(&g, n, "strides", I64(2, 2));
    attr_ints(&g, n, "pads", I64(1, 1, 1, 1));
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 3, 16, 16));
    check_value(&g, "idx", GP_DTYPE_INT64, I64(1, 3, 16, 16));
    gp_graph_free(&g);

    /* ceil_mode: ceil((5+2-2)/2)+1 = 4, but the 4th window would start at
     * 6 >= 5 + 1, wholly in the end padding, so PyTorch drops it: 3. */
    begin(&g, 17, 1);
    input(&g, "x", I64(1, 1, 5, 5));
    n = node(&g, "MaxPool", 1, S("x"), 1, S("y"));
    attr_ints(&g, n, "kernel_shape", I64(2, 2));
    attr_ints(&g, n, "strides", I64(2, 2));
    attr_ints(&g, n, "pads", I64(1, 1, 1, 1));
    attr_i(&g, n, "ceil_mode", 1);
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 1, 3, 3));
    gp_graph_free(&g);

    /* ceil((6+2-3)/2)+1 = 4, last window starts at 6 < 7: kept. */
    begin(&g, 17, 1);
    input(&g, "x", I64(1, 1, 6, 6));
    n = node(&g, "MaxPool", 1, S("x"), 1, S("y"));
    attr_ints(&g, n, "kernel_shape", I64(3, 3));
    attr_ints(&g, n, "strides", I64(2, 2));
    attr_ints(&g, n, "pads", I64(1, 1, 1, 1));
    attr_i(&g, n, "ceil_mode", 1);
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 1, 4, 4));
    gp_graph_free(&g);

    /* Dilated 1-D: 10 - (2*2+1) + 1 = 6. */
    begin(&g, 12, 1);
    input(&g, "x", I64(1, 1, 10));
    n = node(&g, "MaxPool", 1, S("x"), 1, S("y"));
    attr_ints(&g, n, "kernel_shape", I64(3));
    attr_ints(&g, n, "dilations", I64(2));
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 1, 6));
    gp_graph_free(&g);

    /* AveragePool: floor((8-3)/2)+1 = 3; ceil_mode gives ceil(2.5)+1 = 4. */
    for (int ceil_mode = 0; ceil_mode < 2; ceil_mode++) {
        begin(&g, 17, 2);
        input(&g, "x", I64(2, 3, 8, 8));
        n = node(&g, "AveragePool", 1, S("x"), 1, S("y"));
        attr_ints(&g, n, "kernel_shape", I64(3, 3));
        attr_ints(&g, n, "strides", I64(2, 2));
        attr_i(&g, n, "ceil_mode", ceil_mode);
        attr_i(&g, n, "count_include_pad", 1);
        finalize_ok(&g);
        if (ceil_mode) check_shape(&g, "y", I64(2, 3, 4, 4));
        else check_shape(&g, "y", I64(2, 3, 3, 3));
        gp_graph_free(&g);
    }

    /* SAME_LOWER pooling: ceil(7/2) = 4, ceil(8/3) = 3. */
    begin(&g, 19, 1);
    input(&g, "x", I64(1, 1, 7, 8));
    n = node(&g, "AveragePool", 1, S("x"), 1, S("y"));
    attr_ints(&g, n, "kernel_shape", I64(3, 2));
    attr_ints(&g, n, "strides", I64(2, 3));
    attr_s(&g, n, "auto_pad", "SAME_LOWER");
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 1, 4, 3));
    gp_graph_free(&g);

    begin(&g, 17, 2);
    input(&g, "x", I64(2, 5, 7, 3));
    node(&g, "GlobalAveragePool", 1, S("x"), 1, S("y"));
    finalize_ok(&g);
    check_shape(&g, "y", I64(2, 5, 1, 1));
    gp_graph_free(&g);

    begin(&g, 17, 2);
    input(&g, "x", I64(2, 5, 9));
    node(&g, "GlobalMaxPool", 1, S("x"), 1, S("y"));
    finalize_ok(&g);
    check_shape(&g, "y", I64(2, 5, 1));
    gp_graph_free(&g);
}

static void test_pool_errors(void **state)
{
    (void)state;
    struct gp_graph g;
    begin(&g, 17, 1);
    input(&g, "x", I64(1, 3, 8, 8));
    node(&g, "MaxPool", 1, S("x"), 1, S("y"));
    expect_error(&g, GP_ERR_INVALID, "kernel_shape attribute is required", NULL);

    begin(&g, 17, 1);
    input(&g, "x", I64(1, 3, 8, 8));
    int n = node(&g, "MaxPool", 1, S("x"), 1, S("y"));
    attr_ints(&g, n, "kernel_shape", I64(2, 2));
    attr_ints(&g, n, "pads", I64(2, 0, 0, 0));
    expect_error(&g, GP_ERR_INVALID, "spatial axis 0: pads 2, 0 must be smaller than the kernel",
                 NULL);

    begin(&g, 17, 1);
    input(&g, "x", I64(1, 3, 8));
    n = node(&g, "AveragePool", 1, S("x"), 1, S("y"));
    attr_ints(&g, n, "kernel_shape", I64(3));
    attr_s(&g, n, "auto_pad", "SAME");
    expect_error(&g, GP_ERR_INVALID, "auto_pad 'SAME' is not one of", NULL);

    /* ceil_mode arrived in opset 10. */
    begin(&g, 8, 1);
    input(&g, "x", I64(1, 3, 8, 8));
    n = node(&g, "MaxPool", 1, S("x"), 1, S("y"));
    attr_ints(&g, n, "kernel_shape", I64(2, 2));
    attr_i(&g, n, "ceil_mode", 1);
    expect_error(&g, GP_ERR_UNSUPPORTED, "unknown attribute 'ceil_mode'", NULL);

    begin(&g, 17, 1);
    input(&g, "x", I64(1, 3));
    node(&g, "GlobalAveragePool", 1, S("x"), 1, S("y"));
    expect_error(&g, GP_ERR_SHAPE, "input 'x' has shape [1, 3]; expected [N, C, D1, ...]", NULL);
}

/* ---- normalization ---- */

static void test_batch_norm(void **state)
{
    (void)state;
    struct gp_graph g;
    /* Opset 9 training export: Y plus four [C] statistics. */
    begin(&g, 9, 4);
    input(&g, "x", I64(4, 3, 8, 8));
    bn_params(&g, 3);
    node(&g, "BatchNormalization", 5, S("x", "s", "b", "m", "v"), 5,
         S("y", "rm", "rv", "sm", "sv"));
    finalize_ok(&g);
    check_shape(&g, "y", I64(4, 3, 8, 8));
    static const char *const stats[] = {"rm", "rv", "sm", "sv"};
    for (int i = 0; i < 4; i++) check_shape(&g, stats[i], I64(3));
    gp_graph_free(&g);

    /* 1-D batch norm over [N, C]. */
    begin(&g, 15, 4);
    input(&g, "x", I64(4, 6));
    bn_params(&g, 6);
    node(&g, "BatchNormalization", 5, S("x", "s", "b", "m", "v"), 1, S("y"));
    finalize_ok(&g);
    check_shape(&g, "y", I64(4, 6));
    gp_graph_free(&g);

    /* Statistics outputs without training_mode. */
    begin(&g, 14, 4);
    input(&g, "x", I64(4, 3, 8, 8));
    bn_params(&g, 3);
    node(&g, "BatchNormalization", 5, S("x", "s", "b", "m", "v"), 3, S("y", "rm", "rv"));
    expect_error(&g, GP_ERR_INVALID, "need training_mode=1", NULL);

    begin(&g, 15, 4);
    input(&g, "x", I64(4, 3, 8, 8));
    weight(&g, "s", I64(3));
    weight(&g, "b", I64(3));
    weight(&g, "m", I64(4));
    weight(&g, "v", I64(3));
    node(&g, "BatchNormalization", 5, S("x", "s", "b", "m", "v"), 1, S("y"));
    expect_error(&g, GP_ERR_SHAPE, "mean 'm' has shape [4]; expected [3] (one per channel)", NULL);

    begin(&g, 7, 4);
    input(&g, "x", I64(4, 3, 8, 8));
    bn_params(&g, 3);
    attr_i(&g, node(&g, "BatchNormalization", 5, S("x", "s", "b", "m", "v"), 1, S("y")),
           "spatial", 0);
    expect_error(&g, GP_ERR_UNSUPPORTED, "spatial=0", NULL);
}

static void test_instance_and_layer_norm(void **state)
{
    (void)state;
    struct gp_graph g;
    begin(&g, 17, 2);
    input(&g, "x", I64(2, 4, 6, 6));
    weight(&g, "s", I64(4));
    weight(&g, "b", I64(4));
    node(&g, "InstanceNormalization", 3, S("x", "s", "b"), 1, S("y"));
    finalize_ok(&g);
    check_shape(&g, "y", I64(2, 4, 6, 6));
    gp_graph_free(&g);

    begin(&g, 17, 2);
    input(&g, "x", I64(2, 4, 6, 6));
    weight(&g, "s", I64(6));
    weight(&g, "b", I64(4));
    node(&g, "InstanceNormalization", 3, S("x", "s", "b"), 1, S("y"));
    expect_error(&g, GP_ERR_SHAPE, "scale 's' has shape [6]; expected [4]", NULL);

    /* Default axis -1: Mean and InvStdDev are [2, 5, 1]. */
    begin(&g, 17, 2);
    input(&g, "x", I64(2, 5, 8));
    weight(&g, "s", I64(8));
    weight(&g, "b", I64(8));
    node(&g, "LayerNormalization", 3, S("x", "s", "b"), 3, S("y", "mean", "inv"));
    finalize_ok(&g);
    check_shape(&g, "y", I64(2, 5, 8));
    check_shape(&g, "mean", I64(2, 5, 1));
    check_shape(&g, "inv", I64(2, 5, 1));
    gp_graph_free(&g);

    /* axis 1 over a float16 input: statistics in float32 (stash_type 1). */
    begin(&g, 17, 2);
    input_t(&g, "x", GP_DTYPE_FLOAT16, I64(2, 5, 8));
    {
        struct gp_error err = {0};
        struct gp_shape s = {.rank = 2, .dims = {5, 8}};
        struct gp_tensor *t = gp_graph_new_tensor(&g, GP_DTYPE_FLOAT16, &s);
        assert_non_null(t);
        assert_int_equal(gp_graph_add_initializer(&g, "s", t, &err), GP_OK);
    }
    attr_i(&g, node(&g, "LayerNormalization", 2, S("x", "s"), 3, S("y", "mean", "inv")), "axis",
           1);
    finalize_ok(&g);
    check_value(&g, "y", GP_DTYPE_FLOAT16, I64(2, 5, 8));
    check_value(&g, "mean", GP_DTYPE_FLOAT32, I64(2, 1, 1));
    check_value(&g, "inv", GP_DTYPE_FLOAT32, I64(2, 1, 1));
    gp_graph_free(&g);

    begin(&g, 17, 2);
    input(&g, "x", I64(2, 5, 8));
    weight(&g, "s", I64(5));
    node(&g, "LayerNormalization", 2, S("x", "s"), 1, S("y"));
    expect_error(&g, GP_ERR_SHAPE, "Scale 's' has shape [5], which does not broadcast to the "
                 "normalized shape [8]", NULL);
}

/* ---- dropout ---- */

static void test_dropout(void **state)
{
    (void)state;
    struct gp_graph g;
    /* Opset 7: the mask has the data's dtype; 10: bool. */
    for (int opset = 7; opset <= 10; opset += 3) {
        begin(&g, opset, 2);
        input(&g, "x", I64(2, 3));
        attr_f(&g, node(&g, "Dropout", 1, S("x"), 2, S("y", "mask")), "ratio", 0.25f);
        finalize_ok(&g);
        check_shape(&g, "y", I64(2, 3));
        check_value(&g, "mask", opset == 7 ? GP_DTYPE_FLOAT32 : GP_DTYPE_BOOL, I64(2, 3));
        gp_graph_free(&g);
    }

    begin(&g, 13, 2);
    input(&g, "x", I64(2, 3, 4));
    const_scalar(&g, "ratio", GP_DTYPE_FLOAT32, 0.1);
    const_scalar(&g, "train", GP_DTYPE_BOOL, 1);
    attr_i(&g, node(&g, "Dropout", 3, S("x", "ratio", "train"), 2, S("y", "mask")), "seed", 7);
    finalize_ok(&g);
    check_shape(&g, "y", I64(2, 3, 4));
    check_value(&g, "mask", GP_DTYPE_BOOL, I64(2, 3, 4));
    assert_int_not_equal(g.values[gp_graph_find_value(&g, "ratio")].kind, GP_VALUE_PARAMETER);
    gp_graph_free(&g);

    /* A ratio fed at run time cannot fix the kernel's scale. */
    begin(&g, 13, 1);
    input(&g, "x", I64(1, 3));
    input(&g, "ratio", I64(1));
    node(&g, "Dropout", 2, S("x", "ratio"), 1, S("y"));
    expect_error(&g, GP_ERR_UNSUPPORTED, "input 1 ('ratio') must be known at load time", NULL);

    begin(&g, 13, 1);
    input(&g, "x", I64(1, 3));
    const_scalar(&g, "ratio", GP_DTYPE_FLOAT32, 1.0);
    node(&g, "Dropout", 2, S("x", "ratio"), 1, S("y"));
    expect_error(&g, GP_ERR_INVALID, "ratio 1 is outside [0, 1)", NULL);
}

/* ---- resizing ---- */

static void test_resize(void **state)
{
    (void)state;
    struct gp_graph g;
    /* Opset 13 with roi omitted: floor(in * scale). */
    begin(&g, 13, 1);
    input(&g, "x", I64(1, 3, 8, 8));
    const_f32(&g, "scales", F32(1, 1, 2, 2));
    node(&g, "Resize", 3, S("x", "", "scales"), 1, S("y"));
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 3, 16, 16));
    gp_graph_free(&g);

    /* Single precision like onnxruntime: 10 * 0.7f = 7 (in double, 6.99..),
     * 5 * 1.5 = 7.5 -> 7. */
    begin(&g, 13, 1);
    input(&g, "x", I64(1, 3, 10, 5));
    const_f32(&g, "scales", F32(1, 1, 0.7f, 1.5f));
    node(&g, "Resize", 3, S("x", "", "scales"), 1, S("y"));
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 3, 7, 7));
    gp_graph_free(&g);

    /* Opset 11: roi and scales present but empty, sizes given. */
    begin(&g, 11, 1);
    input(&g, "x", I64(1, 3, 4, 4));
    const_f32(&g, "roi", 0, (const float[]){0});
    const_f32(&g, "scales", 0, (const float[]){0});
    const_i64(&g, "sizes", I64(1, 3, 5, 9));
    attr_s(&g, node(&g, "Resize", 4, S("x", "roi", "scales", "sizes"), 1, S("y")), "mode",
           "linear");
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 3, 5, 9));
    gp_graph_free(&g);

    /* Opset 18, axes [2, 3], sizes [10, 12] on [8, 4]: not_larger takes
     * min(10/8, 12/4) = 1.25 -> [10, 5]; not_smaller max = 3 -> [24, 12]. */
    for (int larger = 0; larger < 2; larger++) {
        begin(&g, 18, 1);
        input(&g, "x", I64(1, 3, 8, 4));
        const_i64(&g, "sizes", I64(10, 12));
        int n = node(&g, "Resize", 4, S("x", "", "", "sizes"), 1, S("y"));
        attr_ints(&g, n, "axes", I64(2, 3));
        attr_s(&g, n, "keep_aspect_ratio_policy", larger ? "not_smaller" : "not_larger");
        finalize_ok(&g);
        if (larger) check_shape(&g, "y", I64(1, 3, 24, 12));
        else check_shape(&g, "y", I64(1, 3, 10, 5));
        gp_graph_free(&g);
    }

    /* Opset 10: (X, scales). */
    begin(&g, 10, 1);
    input(&g, "x", I64(1, 1, 4, 4));
    const_f32(&g, "scales", F32(1, 1, 2, 3));
    node(&g, "Resize", 2, S("x", "scales"), 1, S("y"));
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 1, 8, 12));
    gp_graph_free(&g);

    /* Scales computed at run time are refused by name. */
    begin(&g, 13, 4);
    input(&g, "x", I64(4, 3, 8, 8));
    input(&g, "dyn_scales", I64(4));
    node(&g, "Resize", 3, S("x", "", "dyn_scales"), 1, S("y"));
    expect_error(&g, GP_ERR_UNSUPPORTED, "input 2 ('dyn_scales') must be known at load time",
                 NULL);

    begin(&g, 13, 1);
    input(&g, "x", I64(1, 3, 8, 8));
    const_f32(&g, "scales", F32(1, 2));
    node(&g, "Resize", 3, S("x", "", "scales"), 1, S("y"));
    expect_error(&g, GP_ERR_SHAPE, "scales has 2 entries but the input [1, 3, 8, 8] has 4", NULL);

    begin(&g, 13, 1);
    input(&g, "x", I64(1, 3, 8, 8));
    const_f32(&g, "scales", F32(1, 1, 2, 2));
    const_i64(&g, "sizes", I64(1, 3, 16, 16));
    node(&g, "Resize", 4, S("x", "", "scales", "sizes"), 1, S("y"));
    expect_error(&g, GP_ERR_INVALID, "both scales and sizes", NULL);

    /* half_pixel_symmetric is an opset-19 mode. */
    begin(&g, 18, 1);
    input(&g, "x", I64(1, 3, 8, 8));
    const_f32(&g, "scales", F32(1, 1, 2, 2));
    attr_s(&g, node(&g, "Resize", 3, S("x", "", "scales"), 1, S("y")),
           "coordinate_transformation_mode", "half_pixel_symmetric");
    expect_error(&g, GP_ERR_INVALID, "coordinate_transformation_mode 'half_pixel_symmetric' is "
                 "not one of", NULL);

    begin(&g, 10, 1);
    input(&g, "x", I64(1, 3, 8, 8));
    const_f32(&g, "scales", F32(1, 1, 2, 2));
    attr_s(&g, node(&g, "Resize", 2, S("x", "scales"), 1, S("y")), "mode", "cubic");
    expect_error(&g, GP_ERR_INVALID, "mode 'cubic' is not one of nearest,linear", NULL);
}

static void test_upsample(void **state)
{
    (void)state;
    struct gp_graph g;
    /* floor(4 * 2.5) = 10. */
    begin(&g, 7, 1);
    input(&g, "x", I64(1, 2, 3, 4));
    attr_floats(&g, node(&g, "Upsample", 1, S("x"), 1, S("y")), "scales", F32(1, 1, 2, 2.5f));
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 2, 6, 10));
    gp_graph_free(&g);

    begin(&g, 9, 1);
    input(&g, "x", I64(1, 2, 3, 4));
    const_f32(&g, "scales", F32(1, 1, 2, 3));
    node(&g, "Upsample", 2, S("x", "scales"), 1, S("y"));
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 2, 6, 12));
    gp_graph_free(&g);

    begin(&g, 9, 1);
    input(&g, "x", I64(1, 2, 3, 4));
    const_f32(&g, "scales", F32(1, 1, 0.5f, 1));
    node(&g, "Upsample", 2, S("x", "scales"), 1, S("y"));
    expect_error(&g, GP_ERR_INVALID, "scale 0.5 for axis 2 must be at least 1", NULL);
}

/* ---- padding ---- */

static void test_pad(void **state)
{
    (void)state;
    struct gp_graph g;
    /* Opset 2, pads [begins..., ends...]: 5+1+3 = 9, 5+2+4 = 11. */
    begin(&g, 2, 1);
    input(&g, "x", I64(1, 2, 5, 5));
    attr_ints(&g, node(&g, "Pad", 1, S("x"), 1, S("y")), "pads", I64(0, 0, 1, 2, 0, 0, 3, 4));
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 2, 9, 11));
    gp_graph_free(&g);

    /* Negative pads crop: 5-1+2 = 6, 5+1-2 = 4. */
    begin(&g, 13, 1);
    input(&g, "x", I64(1, 2, 5, 5));
    const_i64(&g, "pads", I64(0, 0, -1, 1, 0, 0, 2, -2));
    const_scalar(&g, "cv", GP_DTYPE_FLOAT32, 1.5);
    node(&g, "Pad", 3, S("x", "pads", "cv"), 1, S("y"));
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 2, 6, 4));
    gp_graph_free(&g);

    /* Opset 18 axes [-1]: the last axis grows by 2 + 3. */
    begin(&g, 18, 1);
    input(&g, "x", I64(1, 2, 5, 5));
    const_i64(&g, "pads", I64(2, 3));
    const_i64(&g, "axes", I64(-1));
    attr_s(&g, node(&g, "Pad", 4, S("x", "pads", "", "axes"), 1, S("y")), "mode", "edge");
    finalize_ok(&g);
    check_shape(&g, "y", I64(1, 2, 5, 10));
    gp_graph_free(&g);

    begin(&g, 13, 1);
    input(&g, "x", I64(1, 2, 5, 5));
    const_i64(&g, "pads", I64(0, 0, 1, 1));
    node(&g, "Pad", 2, S("x", "pads"), 1, S("y"));
    expect_error(&g, GP_ERR_SHAPE, "pads has 4 entries; the input [1, 2, 5, 5] needs 8", NULL);

    begin(&g, 13, 1);
    input(&g, "x", I64(1, 2, 3, 5));
    const_i64(&g, "pads", I64(0, 0, 3, 0, 0, 0, 0, 0));
    attr_s(&g, node(&g, "Pad", 2, S("x", "pads"), 1, S("y")), "mode", "reflect");
    expect_error(&g, GP_ERR_SHAPE, "reflect padding of 3 on axis 2 of size 3 is too large", NULL);

    begin(&g, 18, 1);
    input(&g, "x", I64(1, 2, 5, 5));
    const_i64(&g, "pads", I64(0, 0, 0, 0, 0, 0, 0, 0));
    attr_s(&g, node(&g, "Pad", 2, S("x", "pads"), 1, S("y")), "mode", "wrap");
    expect_error(&g, GP_ERR_INVALID, "mode 'wrap' is not one of", NULL);

    begin(&g, 13, 2);
    input(&g, "x", I64(2, 5));
    input(&g, "dyn_pads", I64(4));
    node(&g, "Pad", 2, S("x", "dyn_pads"), 1, S("y"));
    expect_error(&g, GP_ERR_UNSUPPORTED, "('dyn_pads') must be known at load time", NULL);
}

/* ---- Gemm and MatMul ---- */

static void test_gemm(void **state)
{
    (void)state;
    struct gp_graph g;
    /* A [4, 3], B^T of [5, 3]: [4, 5]; C [5] broadcasts. */
    begin(&g, 13, 4);
    input(&g, "a", I64(4, 3));
    weight(&g, "b", I64(5, 3));
    weight(&g, "c", I64(5));
    attr_i(&g, node(&g, "Gemm", 3, S("a", "b", "c"), 1, S("y")), "transB", 1);
    finalize_ok(&g);
    check_shape(&g, "y", I64(4, 5));
    gp_graph_free(&g);

    /* A^T of [3, 4] is [4, 3]; C [4, 1]. */
    begin(&g, 13, 3);
    input(&g, "a", I64(3, 4));
    weight(&g, "b", I64(3, 5));
    weight(&g, "c", I64(4, 1));
    attr_i(&g, node(&g, "Gemm", 3, S("a", "b", "c"), 1, S("y")), "transA", 1);
    finalize_ok(&g);
    check_shape(&g, "y", I64(4, 5));
    gp_graph_free(&g);

    /* Opset 11+: C optional. */
    begin(&g, 11, 4);
    input(&g, "a", I64(4, 3));
    weight(&g, "b", I64(3, 2));
    node(&g, "Gemm", 2, S("a", "b"), 1, S("y"));
    finalize_ok(&g);
    check_shape(&g, "y", I64(4, 2));
    gp_graph_free(&g);

    begin(&g, 13, 4);
    input(&g, "a", I64(4, 3));
    weight(&g, "b", I64(3, 5));
    weight(&g, "c", I64(3, 5));
    node(&g, "Gemm", 3, S("a", "b", "c"), 1, S("y"));
    expect_error(&g, GP_ERR_SHAPE, "C has shape [3, 5], which does not broadcast to the output "
                 "[4, 5]", NULL);

    begin(&g, 13, 4);
    input(&g, "a", I64(4, 3));
    weight(&g, "b", I64(4, 5));
    node(&g, "Gemm", 2, S("a", "b"), 1, S("y"));
    expect_error(&g, GP_ERR_SHAPE, "A is [4, 3] (transA=0) and B is [4, 5] (transB=0): inner "
                 "dimensions 3 and 4 differ", NULL);
}

static void test_matmul(void **state)
{
    (void)state;
    struct gp_graph g;
    static const struct {
        int ra;
        int64_t a[4];
        int rb;
        int64_t b[4];
        int ry;
        int64_t y[4];
    } cases[] = {
        {3, {2, 3, 4}, 2, {4, 5}, 3, {2, 3, 5}},
        {1, {4}, 2, {4, 5}, 1, {5}},          /* [1, 4] @ [4, 5], then drop the 1 */
        {3, {2, 3, 4}, 1, {4}, 2, {2, 3}},    /* [.., 4] @ [4, 1], then drop the 1 */
        {1, {4}, 1, {4}, 0, {0}},             /* dot product: a scalar */
        {4, {2, 1, 3, 4}, 3, {5, 4, 6}, 4, {2, 5, 3, 6}}, /* batch [2, 1] x [5] */
    };
    for (int i = 0; i < N_OF(cases); i++) {
        begin(&g, 13, cases[i].a[0]);
        input(&g, "a", cases[i].ra, cases[i].a);
        weight(&g, "b", cases[i].rb, cases[i].b);
        node(&g, "MatMul", 2, S("a", "b"), 1, S("y"));
        finalize_ok(&g);
        check_shape(&g, "y", cases[i].ry, cases[i].y);
        gp_graph_free(&g);
    }

    begin(&g, 13, 2);
    input(&g, "a", I64(2, 3, 4));
    weight(&g, "b", I64(5, 6));
    node(&g, "MatMul", 2, S("a", "b"), 1, S("y"));
    expect_error(&g, GP_ERR_SHAPE, "A is [2, 3, 4] and B is [5, 6]: inner dimensions 4 and 5 "
                 "differ", NULL);

    begin(&g, 13, 2);
    input(&g, "a", I64(2, 3, 4));
    weight(&g, "b", I64(3, 4, 6));
    node(&g, "MatMul", 2, S("a", "b"), 1, S("y"));
    expect_error(&g, GP_ERR_SHAPE, "batch dimensions 2 and 3 do not broadcast", NULL);
}

/* ---- softmax and reductions ---- */

static void test_softmax(void **state)
{
    (void)state;
    struct gp_graph g;
    /* Opset 11 (2-D coercion, axis 1 by default) and 13 (axis -1). */
    static const char *const ops[] = {"Softmax", "LogSoftmax"};
    for (int k = 0; k < 2; k++)
        for (int opset = 11; opset <= 13; opset += 2) {
            begin(&g, opset, 2);
            input(&g, "x", I64(2, 3, 4));
            node(&g, ops[k], 1, S("x"), 1, S("y"));
            finalize_ok(&g);
            check_shape(&g, "y", I64(2, 3, 4));
            gp_graph_free(&g);
        }

    begin(&g, 13, 2);
    input(&g, "x", I64(2, 3, 4));
    attr_i(&g, node(&g, "Softmax", 1, S("x"), 1, S("y")), "axis", 3);
    expect_error(&g, GP_ERR_INVALID, "axis 3 is out of range for rank 3", NULL);
}

static void test_reductions(void **state)
{
    (void)state;
    struct gp_graph g;
    /* Attribute axes (ReduceMean-13), keepdims 0: [2, 4]. */
    begin(&g, 13, 2);
    input(&g, "x", I64(2, 3, 4));
    int n = node(&g, "ReduceMean", 1, S("x"), 1, S("y"));
    attr_ints(&g, n, "axes", I64(1));
    attr_i(&g, n, "keepdims", 0);
    finalize_ok(&g);
    check_shape(&g, "y", I64(2, 4));
    gp_graph_free(&g);

    /* Input axes (ReduceSum-13), keepdims default 1: [2, 3, 1]. */
    begin(&g, 13, 2);
    input(&g, "x", I64(2, 3, 4));
    const_i64(&g, "axes", I64(-1));
    node(&g, "ReduceSum", 2, S("x", "axes"), 1, S("y"));
    finalize_ok(&g);
    check_shape(&g, "y", I64(2, 3, 1));
    gp_graph_free(&g);

    /* No axes: everything, or nothing with noop_with_empty_axes. */
    for (int noop = 0; noop < 2; noop++) {
        begin(&g, 18, 2);
        input(&g, "x", I64(2, 3, 4));
        attr_i(&g, node(&g, "ReduceMean", 1, S("x"), 1, S("y")), "noop_with_empty_axes", noop);
        finalize_ok(&g);
        if (noop) check_shape(&g, "y", I64(2, 3, 4));
        else check_shape(&g, "y", I64(1, 1, 1));
        gp_graph_free(&g);
    }

    begin(&g, 18, 2);
    input(&g, "x", I64(2, 3, 4));
    attr_i(&g, node(&g, "ReduceL2", 1, S("x"), 1, S("y")), "keepdims", 0);
    finalize_ok(&g);
    check_shape(&g, "y", 0, NULL);
    gp_graph_free(&g);

    /* Every reduction at its old and new signature. */
    static const char *const ops[] = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
                                      "ReduceProd", "ReduceSumSquare", "ReduceL2"};
    for (int k = 0; k < N_OF(ops); k++) {
        begin(&g, 12, 2);
        input(&g, "x", I64(2, 3, 4));
        attr_ints(&g, node(&g, ops[k], 1, S("x"), 1, S("y")), "axes", I64(0, 2));
        finalize_ok(&g);
        check_shape(&g, "y", I64(1, 3, 1));
        gp_graph_free(&g);

        begin(&g, 18, 2);
        input(&g, "x", I64(2, 3, 4));
        const_i64(&g, "axes", I64(0, 2));
        node(&g, ops[k], 2, S("x", "axes"), 1, S("y"));
        finalize_ok(&g);
        check_shape(&g, "y", I64(1, 3, 1));
        gp_graph_free(&g);
    }

    begin(&g, 18, 2);
    input(&g, "x", I64(2, 3, 4));
    input_t(&g, "axes", GP_DTYPE_INT64, I64(1));
    node(&g, "ReduceMax", 2, S("x", "axes"), 1, S("y"));
    expect_error(&g, GP_ERR_UNSUPPORTED, "input 1 ('axes') must be known at load time", NULL);

    begin(&g, 13, 2);
    input(&g, "x", I64(2, 3, 4));
    attr_ints(&g, node(&g, "ReduceMean", 1, S("x"), 1, S("y")), "axes", I64(1, -2));
    expect_error(&g, GP_ERR_INVALID, "axis 1 is repeated", NULL);

    /* Axes moved to an input in 18: the attribute is then unknown. */
    begin(&g, 18, 2);
    input(&g, "x", I64(2, 3, 4));
    attr_ints(&g, node(&g, "ReduceMean", 1, S("x"), 1, S("y")), "axes", I64(1));
    expect_error(&g, GP_ERR_UNSUPPORTED, "unknown attribute 'axes'", NULL);
}

/* The constant tensor behind a folded value, checked element by element. */
static void check_folded(const struct gp_graph *g, const char *name, int n, const double *want)
{
    const struct gp_value *v = &g->values[gp_graph_find_value(g, name)];
    if (v->kind != GP_VALUE_CONSTANT || !v->constant) fail_msg("'%s' was not folded", name);
    assert_int_equal(gp_shape_numel(&v->constant->shape), n);
    for (int i = 0; i < n; i++)
        if (gp_tensor_get_f64(v->constant, i) != want[i])
            fail_msg("'%s'[%d] is %g, expected %g", name, i, gp_tensor_get_f64(v->constant, i),
                     want[i]);
}

/* Reductions of constants fold at load time, as exporters' shape arithmetic
 * needs. Integer data folds in int64 (ReduceMean truncates). */
static void test_reduction_folding(void **state)
{
    (void)state;
    struct gp_graph g;
    struct gp_error err = {0};
    /* c = [[1, 2, 3], [4, 5, 6]] */
    static const int64_t c[] = {1, 2, 3, 4, 5, 6};
    static const struct {
        const char *op;
        int64_t axis, keepdims;
        int n;
        double want[3];
    } cases[] = {
        {"ReduceProd", -1, 0, 2, {6, 120}},
        {"ReduceSum", 0, 1, 3, {5, 7, 9}},
        {"ReduceMax", 1, 0, 2, {3, 6}},
        {"ReduceMin", 0, 0, 3, {1, 2, 3}},
        {"ReduceMean", 1, 0, 2, {2, 5}},
        {"ReduceSumSquare", 1, 0, 2, {14, 77}},
        {"ReduceL2", 0, 0, 3, {4, 5, 6}}, /* floor(sqrt(17, 29, 45)) */
    };
    for (int k = 0; k < N_OF(cases); k++) {
        begin(&g, 12, 1); /* axes still an attribute everywhere */
        struct gp_shape s = {.rank = 2, .dims = {2, 3}};
        assert_int_equal(gp_graph_add_const_i64(&g, "c", &s, c, &err), GP_OK);
        int n = node(&g, cases[k].op, 1, S("c"), 1, S("y"));
        attr_ints(&g, n, "axes", 1, &cases[k].axis);
        attr_i(&g, n, "keepdims", cases[k].keepdims);
        finalize_ok(&g);
        if (cases[k].keepdims) check_value(&g, "y", GP_DTYPE_INT64, I64(1, 3));
        else check_value(&g, "y", GP_DTYPE_INT64, 1, (const int64_t[]){cases[k].n});
        check_folded(&g, "y", cases[k].n, cases[k].want);
        assert_int_equal(g.n_nodes, 0);
        gp_graph_free(&g);
    }

    /* A float constant reduced into BatchNormalization's mean (a slot
     * without gradient) is no parameter once trainability settles, so it
     * folds: [[.5, 1], [1, 1.5]] summed over axis 0 is [1.5, 2.5]. */
    begin(&g, 13, 2);
    input(&g, "x", I64(2, 2, 3, 3));
    struct gp_shape s = {.rank = 2, .dims = {2, 2}};
    static const float f[] = {0.5f, 1, 1, 1.5f};
    assert_int_equal(gp_graph_add_const_f32(&g, "f", &s, f, &err), GP_OK);
    const_i64(&g, "axes", I64(0));
    int n = add_node(&g, "sum", "ReduceSum", 2, S("f", "axes"), 1, S("m"));
    attr_i(&g, n, "keepdims", 0);
    weight(&g, "s", I64(2));
    weight(&g, "b", I64(2));
    weight(&g, "v", I64(2));
    node(&g, "BatchNormalization", 5, S("x", "s", "b", "m", "v"), 1, S("y"));
    finalize_ok(&g);
    check_folded(&g, "m", 2, (const double[]){1.5, 2.5});
    check_shape(&g, "y", I64(2, 2, 3, 3));
    assert_int_equal(g.n_nodes, 1);
    gp_graph_free(&g);
}

static void test_arg_reductions(void **state)
{
    (void)state;
    struct gp_graph g;
    begin(&g, 13, 2);
    input(&g, "x", I64(2, 3, 4));
    int n = node(&g, "ArgMax", 1, S("x"), 1, S("y"));
    attr_i(&g, n, "axis", 1);
    attr_i(&g, n, "keepdims", 0);
    attr_i(&g, n, "select_last_index", 1);
    finalize_ok(&g);
    check_value(&g, "y", GP_DTYPE_INT64, I64(2, 4));
    gp_graph_free(&g);

    begin(&g, 11, 2);
    input(&g, "x", I64(2, 3, 4));
    attr_i(&g, node(&g, "ArgMin", 1, S("x"), 1, S("y")), "axis", -1);
    finalize_ok(&g);
    check_value(&g, "y", GP_DTYPE_INT64, I64(2, 3, 1));
    gp_graph_free(&g);

    /* select_last_index arrived in opset 12. */
    begin(&g, 11, 2);
    input(&g, "x", I64(2, 3, 4));
    attr_i(&g, node(&g, "ArgMax", 1, S("x"), 1, S("y")), "select_last_index", 1);
    expect_error(&g, GP_ERR_UNSUPPORTED, "unknown attribute 'select_last_index'", NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry_matches_onnx_schemas),
        cmocka_unit_test(test_nondiff_inputs),
        cmocka_unit_test(test_conv_shapes),
        cmocka_unit_test(test_conv_errors),
        cmocka_unit_test(test_conv_transpose_shapes),
        cmocka_unit_test(test_pool_shapes),
        cmocka_unit_test(test_pool_errors),
        cmocka_unit_test(test_batch_norm),
        cmocka_unit_test(test_instance_and_layer_norm),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_resize),
        cmocka_unit_test(test_upsample),
        cmocka_unit_test(test_pad),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_reductions),
        cmocka_unit_test(test_reduction_folding),
        cmocka_unit_test(test_arg_reductions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
