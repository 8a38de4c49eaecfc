/* CPU kernels of the shape, gather and pad families
 * (src/backend/cpu/shape.c, gather.c, pad.c): forward values against
 * numpy / PyTorch 1.13 (literals below), gradients against finite
 * differences in double precision and, where several outputs read one
 * input (Pad's reflect and edge modes, Gather's repeated indices), against
 * PyTorch's autograd; and the float build against the double build. */
#include "cpu_kernel_test.h"

#include "backend/cpu/kernel.h"

/* "i*" inputs are indices in [-3, 3]; the rest uniform(-1, 1). */
static double gen(const char *name, int64_t i, void *user)
{
    (void)user;
    if (name[0] == 'i') return (double)((i * 5) % 7) - 3;
    return NAN;
}

static const struct op_check_opts checks = {.seed = 5, .gen = gen};

static const float iota24[24] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11,
                                 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23};

/* ---- copies ---- */

static void test_copies(void **state)
{
    (void)state;
    struct gp_graph g;
    /* Reshape, Flatten, Squeeze and Unsqueeze chained: data in order, and
     * the gradient flows back through all four. */
    init(&g, 17);
    input(&g, "x", GP_DTYPE_FLOAT32, 3, I64(2, 3, 4));
    ci64(&g, "shape", 1, I64(3), I64(4, 1, 6));
    ci64(&g, "ax", 1, I64(1), I64(1));
    ci64(&g, "ax0", 1, I64(1), I64(0));
    node(&g, "Reshape", 2, S("x", "shape"), 1, S("a"));
    node(&g, "Squeeze", 2, S("a", "ax"), 1, S("b"));
    node(&g, "Unsqueeze", 2, S("b", "ax0"), 1, S("c"));
    attr_int(&g, node(&g, "Flatten", 1, S("c"), 1, S("y")), "axis", 2);
    output(&g, "y");
    finalize(&g);
    assert_int_equal(val(&g, "y")->shape.dims[0], 4);
    float y[24];
    run1(&g, (const void *[]){iota24}, y);
    expect_near("copies", y, iota24, 24, 0);
    check_all(&g, &checks);
    gp_graph_free(&g);

    /* Any dtype. */
    init(&g, 17);
    input(&g, "i", GP_DTYPE_INT64, 2, I64(2, 2));
    ci64(&g, "shape", 1, I64(1), I64(4));
    node(&g, "Reshape", 2, S("i", "shape"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    int64_t yi[4];
    run1(&g, (const void *[]){I64(5, -6, 7, INT64_MAX)}, yi);
    assert_true(yi[0] == 5 && yi[1] == -6 && yi[2] == 7 && yi[3] == INT64_MAX);
    gp_graph_free(&g);
}

/* ---- Transpose ---- */

static void build_transpose(struct gp_graph *g, int n_perm, const int64_t *perm)
{
    init(g, 17);
    input(g, "x", GP_DTYPE_FLOAT32, 3, I64(2, 3, 4));
    int n = node(g, "Transpose", 1, S("x"), 1, S("y"));
    if (n_perm) attr_ints(g, n, "perm", n_perm, perm);
    output(g, "y");
    finalize(g);
}

static void test_transpose(void **state)
{
    (void)state;
    struct gp_graph g;
    float y[24];
    build_transpose(&g, 3, I64(2, 0, 1));
    run1(&g, (const void *[]){iota24}, y);
    expect_near("perm 2,0,1", y,
                F32(0, 4, 8, 12, 16, 20, 1, 5, 9, 13, 17, 21, 2, 6, 10, 14, 18, 22, 3, 7, 11, 15,
                    19, 23), 24, 0);
    gp_graph_free(&g);
    build_transpose(&g, 0, NULL); /* default: reversed axes */
    run1(&g, (const void *[]){iota24}, y);
    expect_near("reversed", y,
                F32(0, 12, 4, 16, 8, 20, 1, 13, 5, 17, 9, 21, 2, 14, 6, 18, 10, 22, 3, 15, 7, 19,
                    11, 23), 24, 0);
    gp_graph_free(&g);

    static const int64_t perms[][3] = {{0, 1, 2}, {1, 0, 2}, {0, 2, 1}, {2, 1, 0}, {1, 2, 0}};
    for (size_t k = 0; k < sizeof perms / sizeof *perms; k++) {
        build_transpose(&g, 3, perms[k]);
        check_all(&g, &checks);
        gp_graph_free(&g);
    }
}

/* ---- Concat, Split ---- */

static void test_concat(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 17);
    input(&g, "a", GP_DTYPE_FLOAT32, 2, I64(2, 1));
    input(&g, "b", GP_DTYPE_FLOAT32, 2, I64(2, 2));
    input(&g, "c", GP_DTYPE_FLOAT32, 2, I64(2, 1));
    attr_int(&g, node(&g, "Concat", 3, S("a", "b", "c"), 1, S("y")), "axis", -1);
    output(&g, "y");
    finalize(&g);
    float y[8];
    run1(&g, (const void *[]){F32(1, 2), F32(3, 4, 5, 6), F32(7, 8)}, y);
    expect_near("Concat", y, F32(1, 3, 4, 7, 2, 5, 6, 8), 8, 0);
    gp_graph_free(&g);

    /* Every axis of [2, 3, 4]-like inputs that differ along it. */
    for (int axis = 0; axis < 3; axis++) {
        int64_t da[3] = {2, 3, 4}, db[3] = {2, 3, 4};
        da[axis] = 1;
        db[axis] = 3;
        init(&g, 13);
        input(&g, "a", GP_DTYPE_FLOAT32, 3, da);
        input(&g, "b", GP_DTYPE_FLOAT32, 3, db);
        double p[24];
        for (int i = 0; i < 24; i++) p[i] = 0.125 * (i % 7) - 0.4;
        cany(&g, "p", GP_DTYPE_FLOAT32, 3, I64(2, 3, 4), p); /* a parameter in the middle */
        attr_int(&g, node(&g, "Concat", 3, S("a", "p", "b"), 1, S("y")), "axis", axis);
        output(&g, "y");
        finalize(&g);
        check_all(&g, &checks);
        gp_graph_free(&g);
    }
}

static void test_split(void **state)
{
    (void)state;
    struct gp_graph g;
    /* Uneven sizes from the attribute (Split-11), the input (13) and
     * num_outputs (18: ceil(7 / 3) = 3, 3, 1). */
    for (int version = 0; version < 3; version++) {
        init(&g, version == 0 ? 11 : version == 1 ? 13 : 18);
        input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(2, 7));
        int n;
        if (version == 1) {
            ci64(&g, "split", 1, I64(3), I64(2, 4, 1));
            n = node(&g, "Split", 2, S("x", "split"), 3, S("y0", "y1", "y2"));
        } else {
            n = node(&g, "Split", 1, S("x"), 3, S("y0", "y1", "y2"));
            if (version == 0) attr_ints(&g, n, "split", 3, I64(2, 4, 1));
            else attr_int(&g, n, "num_outputs", 3);
        }
        attr_int(&g, n, "axis", -1);
        output(&g, "y0");
        output(&g, "y1");
        output(&g, "y2");
        finalize(&g);
        float y0[6], y1[8], y2[2];
        const float x[14] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
        op_forward_f32(&g, (const void *[]){x}, (void *[]){y0, y1, y2}, false);
        if (version == 2) {
            expect_near("y0", y0, F32(0, 1, 2, 7, 8, 9), 6, 0);
            expect_near("y1", y1, F32(3, 4, 5, 10, 11, 12), 6, 0);
            expect_near("y2", y2, F32(6, 13), 2, 0);
        } else {
            expect_near("y0", y0, F32(0, 1, 7, 8), 4, 0);
            expect_near("y1", y1, F32(2, 3, 4, 5, 9, 10, 11, 12), 8, 0);
            expect_near("y2", y2, F32(6, 13), 2, 0);
        }
        check_all(&g, &checks);
        gp_graph_free(&g);
    }
    /* Along axis 0, with only one output read by the loss. */
    init(&g, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(4, 3));
    node(&g, "Split", 1, S("x"), 2, S("y0", "y1"));
    output(&g, "y1");
    finalize(&g);
    check_all(&g, &checks);
    gp_graph_free(&g);
}

/* ---- Slice ---- */

static void build_slice(struct gp_graph *g, const int64_t *starts, const int64_t *ends,
                        const int64_t *axes, const int64_t *steps)
{
    init(g, 13);
    input(g, "x", GP_DTYPE_FLOAT32, 2, I64(4, 6));
    ci64(g, "starts", 1, I64(2), starts);
    ci64(g, "ends", 1, I64(2), ends);
    ci64(g, "axes", 1, I64(2), axes);
    ci64(g, "steps", 1, I64(2), steps);
    node(g, "Slice", 5, S("x", "starts", "ends", "axes", "steps"), 1, S("y"));
    output(g, "y");
    finalize(g);
}

static void test_slice(void **state)
{
    (void)state;
    struct gp_graph g;
    float y[24];
    /* x[3:-5:-1, 0:6:2] */
    build_slice(&g, I64(3, 0), I64(-5, 6), I64(0, 1), I64(-1, 2));
    run1(&g, (const void *[]){iota24}, y);
    expect_near("slice", y, F32(18, 20, 22, 12, 14, 16, 6, 8, 10, 0, 2, 4), 12, 0);
    check_all(&g, &checks);
    gp_graph_free(&g);
    /* x[::-2, 5:0:-3], axes listed backwards */
    build_slice(&g, I64(5, -1), I64(0, INT64_MIN), I64(1, 0), I64(-3, -2));
    run1(&g, (const void *[]){iota24}, y);
    expect_near("slice2", y, F32(23, 20, 11, 8), 4, 0);
    check_all(&g, &checks);
    gp_graph_free(&g);
    /* Plain ranges (Slice-1 attributes) */
    init(&g, 9);
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(4, 6));
    int n = node(&g, "Slice", 1, S("x"), 1, S("y"));
    attr_ints(&g, n, "starts", 1, I64(1));
    attr_ints(&g, n, "ends", 1, I64(100));
    attr_ints(&g, n, "axes", 1, I64(1));
    output(&g, "y");
    finalize(&g);
    run1(&g, (const void *[]){iota24}, y);
    for (int i = 0; i < 20; i++)
        if (y[i] != (float)(i / 5 * 6 + i % 5 + 1)) fail_msg("slice-1 [%d]: %g", i, y[i]);
    check_all(&g, &checks);
    gp_graph_free(&g);
}

/* ---- Gather ---- */

static const double emb15[15] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};

static void test_gather(void **state)
{
    (void)state;
    struct gp_graph g;
    /* An embedding: trainable [5, 3] table, constant indices [2, 3] with
     * repeats and a negative one. */
    init(&g, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 1, I64(1)); /* a graph needs an input */
    cany(&g, "table", GP_DTYPE_FLOAT32, 2, I64(5, 3), emb15);
    ci64(&g, "idx", 2, I64(2, 3), I64(1, 1, 4, 0, -1, 1));
    node(&g, "Gather", 2, S("table", "idx"), 1, S("e"));
    node(&g, "Mul", 2, S("e", "x"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    assert_int_equal(val(&g, "table")->kind, GP_VALUE_PARAMETER);
    float y[18];
    run1(&g, (const void *[]){F32(1)}, y);
    expect_near("gather axis 0", y,
                F32(3, 4, 5, 3, 4, 5, 12, 13, 14, 0, 1, 2, 12, 13, 14, 3, 4, 5), 18, 0);
    /* dTable: row 1 read three times, row 4 twice, row 0 once. */
    double dy[18];
    for (int i = 0; i < 18; i++) dy[i] = i + 1;
    struct gp_cpu_runner *r = run_backward(&g, (const void *[]){F32(1)}, (const double *[]){dy}, false);
    expect_near64("dTable", grad_of(r, &g, "table"),
                  F64(10, 11, 12, 1 + 4 + 16, 2 + 5 + 17, 3 + 6 + 18, 0, 0, 0, 0, 0, 0,
                      7 + 13, 8 + 14, 9 + 15), 15, 0);
    gp_cpu_runner_free_f64(r);
    check_all(&g, &checks);
    gp_graph_free(&g);

    /* Axis 1 with int32 indices from data, negative ones included. */
    init(&g, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(5, 3));
    input(&g, "i", GP_DTYPE_INT32, 1, I64(3));
    attr_int(&g, node(&g, "Gather", 2, S("x", "i"), 1, S("y")), "axis", 1);
    output(&g, "y");
    finalize(&g);
    float x15[15];
    for (int i = 0; i < 15; i++) x15[i] = (float)i;
    run1(&g, (const void *[]){x15, (const int32_t[]){2, -3, 0}}, y);
    expect_near("gather axis 1", y, F32(2, 0, 0, 5, 3, 3, 8, 6, 6, 11, 9, 9, 14, 12, 12), 15, 0);
    check_all(&g, &checks); /* gen: indices -3, 2, 0 */
    gp_graph_free(&g);

    /* An index out of range at run time, on either side, is an error naming
     * it. */
    init(&g, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(5, 3));
    input(&g, "i", GP_DTYPE_INT64, 1, I64(2));
    node(&g, "Gather", 2, S("x", "i"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    static const struct {
        int64_t idx[2];
        const char *needle;
    } bad[] = {{{4, -6}, "index -6 (element 1 of indices 'i')"},
               {{5, -5}, "index 5 (element 0 of indices 'i')"}};
    for (int k = 0; k < 2; k++) {
        struct gp_error err = {0};
        r = NULL;
        assert_int_equal(gp_cpu_runner_create_f64(&g, false, &r, &err), GP_OK);
        gp_cpu_runner_set_f64(r, g.inputs[0], x15);
        gp_cpu_runner_set_f64(r, g.inputs[1], bad[k].idx);
        struct gp_run_opts o = {.dropout_ratio = -1};
        assert_int_equal(gp_cpu_runner_forward_f64(r, &o, 0, g.n_nodes, &err), GP_ERR_INVALID);
        if (!strstr(err.msg, "(Gather)") || !strstr(err.msg, bad[k].needle) ||
            !strstr(err.msg, "axis 0 of size 5"))
            fail_msg("message: %s", err.msg);
        gp_cpu_runner_free_f64(r);
    }
    gp_graph_free(&g);
}

/* ---- Tile, Trilu ---- */

static void test_tile(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(2, 3));
    ci64(&g, "rep", 1, I64(2), I64(2, 2));
    node(&g, "Tile", 2, S("x", "rep"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    float y[24];
    run1(&g, (const void *[]){F32(1, 2, 3, 4, 5, 6)}, y);
    expect_near("Tile", y,
                F32(1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6, 1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6), 24, 0);
    check_all(&g, &checks);
    gp_graph_free(&g);

    init(&g, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 3, I64(2, 1, 3));
    ci64(&g, "rep", 1, I64(3), I64(1, 3, 2));
    node(&g, "Tile", 2, S("x", "rep"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    check_all(&g, &checks);
    gp_graph_free(&g);
}

static void test_trilu(void **state)
{
    (void)state;
    float x12[12];
    for (int i = 0; i < 12; i++) x12[i] = (float)(i + 1);
    for (int upper = 0; upper < 2; upper++) {
        struct gp_graph g;
        init(&g, 14);
        input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(3, 4));
        ci64(&g, "k", 0, NULL, I64(upper ? 1 : -1));
        attr_int(&g, node(&g, "Trilu", 2, S("x", "k"), 1, S("y")), "upper", upper);
        output(&g, "y");
        finalize(&g);
        float y[12];
        run1(&g, (const void *[]){x12}, y);
        if (upper) expect_near("triu k=1", y, F32(0, 2, 3, 4, 0, 0, 7, 8, 0, 0, 0, 12), 12, 0);
        else expect_near("tril k=-1", y, F32(0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0), 12, 0);
        check_all(&g, &checks);
        gp_graph_free(&g);
    }
}

/* ---- Pad ---- */

/* p [2, 3] = 1..6 padded by (begins, ends) in `mode`; pads as Pad-11's
 * input (or Pad-19 for wrap). */
static void build_pad(struct gp_graph *g, const char *mode, const int64_t *pads, bool with_value)
{
    init(g, strcmp(mode, "wrap") == 0 ? 19 : 13);
    input(g, "x", GP_DTYPE_FLOAT32, 2, I64(2, 3));
    ci64(g, "pads", 1, I64(4), pads);
    int n;
    if (with_value) {
        cf32(g, "v", 0, NULL, F32(-1.5f));
        n = node(g, "Pad", 3, S("x", "pads", "v"), 1, S("y"));
    } else {
        n = node(g, "Pad", 2, S("x", "pads"), 1, S("y"));
    }
    attr_str(g, n, "mode", mode);
    output(g, "y");
    finalize(g);
}

static void test_pad(void **state)
{
    (void)state;
    static const float p6[6] = {1, 2, 3, 4, 5, 6};
    static const struct {
        const char *mode;
        int64_t pads[4]; /* begin0, begin1, end0, end1 */
        bool value;
        int n;
        float want[28];
    } cases[] = {
        {"constant", {0, 2, 0, 1}, true, 12, {-1.5f, -1.5f, 1, 2, 3, -1.5f, -1.5f, -1.5f, 4, 5, 6, -1.5f}},
        {"reflect", {1, 2, 1, 2}, false, 28,
         {6, 5, 4, 5, 6, 5, 4, 3, 2, 1, 2, 3, 2, 1, 6, 5, 4, 5, 6, 5, 4, 3, 2, 1, 2, 3, 2, 1}},
        {"edge", {1, 0, 0, 3}, false, 18, {1, 2, 3, 3, 3, 3, 1, 2, 3, 3, 3, 3, 4, 5, 6, 6, 6, 6}},
        {"wrap", {0, 3, 1, 2}, false, 24,
         {1, 2, 3, 1, 2, 3, 1, 2, 4, 5, 6, 4, 5, 6, 4, 5, 1, 2, 3, 1, 2, 3, 1, 2}},
        {"constant", {0, -1, 0, 1}, false, 6, {2, 3, 0, 5, 6, 0}}, /* crop and pad */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        struct gp_graph g;
        build_pad(&g, cases[k].mode, cases[k].pads, cases[k].value);
        float y[28];
        run1(&g, (const void *[]){p6}, y);
        expect_near(cases[k].mode, y, cases[k].want, cases[k].n, 0);
        check_all(&g, &checks);
        gp_graph_free(&g);
    }
    /* Gradients where several outputs read one input, against torch's
     * reflect and replicate padding with dY = 0, 1, 2, ... */
    static const struct {
        const char *mode;
        int64_t pads[4];
        double want[6];
    } grads[] = {
        {"reflect", {1, 2, 1, 2}, {72, 102, 64, 44, 60, 36}},
        {"edge", {1, 0, 0, 3}, {6, 8, 52, 12, 13, 62}},
    };
    for (int k = 0; k < 2; k++) {
        struct gp_graph g;
        build_pad(&g, grads[k].mode, grads[k].pads, false);
        double dy[28];
        for (int i = 0; i < 28; i++) dy[i] = i;
        struct gp_cpu_runner *r = run_backward(&g, (const void *[]){p6}, (const double *[]){dy}, false);
        expect_near64(grads[k].mode, grad_of(r, &g, "x"), grads[k].want, 6, 0);
        gp_cpu_runner_free_f64(r);
        gp_graph_free(&g);
    }
    /* Pad-2 (attributes) on [N, C, H, W], padding only the spatial axes. */
    struct gp_graph g;
    init(&g, 9);
    input(&g, "x", GP_DTYPE_FLOAT32, 4, I64(2, 3, 4, 5));
    int n = node(&g, "Pad", 1, S("x"), 1, S("y"));
    attr_ints(&g, n, "pads", 8, I64(0, 0, 1, 2, 0, 0, 2, 0));
    attr_float(&g, n, "value", 0.5f);
    output(&g, "y");
    finalize(&g);
    check_all(&g, &checks);
    gp_graph_free(&g);
    /* Pad-18 with axes. */
    init(&g, 18);
    input(&g, "x", GP_DTYPE_FLOAT32, 3, I64(2, 3, 4));
    ci64(&g, "pads", 1, I64(2), I64(1, 2));
    ci64(&g, "axes", 1, I64(1), I64(-1));
    attr_str(&g, node(&g, "Pad", 4, S("x", "pads", "", "axes"), 1, S("y")), "mode", "reflect");
    output(&g, "y");
    finalize(&g);
    assert_int_equal(val(&g, "y")->shape.dims[2], 7);
    check_all(&g, &checks);
    gp_graph_free(&g);
}

/* ---- Shape, Size, ConstantOfShape, Range: folded at load, so their
 * kernels are called directly here. ---- */

static void run_kernel(const struct gp_graph *g, void *const *in, void *const *out)
{
    assert_int_equal(g->n_folded, 1);
    const struct gp_cpu_kernel *k = gp_cpu_kernel_for_f64(&g->folded[0]);
    assert_non_null(k);
    struct gp_cpu_ctx c = {.graph = g, .node = &g->folded[0], .in = in, .out = out};
    struct gp_error err = {0};
    if (k->forward(&c, &err) != GP_OK) fail_msg("%s", err.msg);
}

static void test_shape_producers(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 15);
    input(&g, "x", GP_DTYPE_FLOAT32, 3, I64(2, 3, 4));
    attr_int(&g, node(&g, "Shape", 1, S("x"), 1, S("y")), "start", -2);
    output(&g, "y");
    finalize(&g); /* Shape folds: the node is kept in g.folded */
    int64_t dims[2];
    double x[24] = {0};
    run_kernel(&g, (void *[]){x}, (void *[]){dims});
    assert_true(dims[0] == 3 && dims[1] == 4);
    gp_graph_free(&g);

    init(&g, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 3, I64(2, 3, 4));
    node(&g, "Size", 1, S("x"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    int64_t size;
    run_kernel(&g, (void *[]){x}, (void *[]){&size});
    assert_int_equal(size, 24);
    gp_graph_free(&g);

    init(&g, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 1, I64(1));
    ci64(&g, "s", 1, I64(2), I64(2, 3));
    int n = node(&g, "ConstantOfShape", 1, S("s"), 1, S("y"));
    struct gp_attr *a = attr(&g, n, "value", GP_ATTR_TENSOR);
    struct gp_shape one = shp(1, I64(1));
    a->t = gp_graph_new_tensor(&g, GP_DTYPE_INT32, &one);
    ((int32_t *)a->t->data)[0] = -7;
    output(&g, "y");
    finalize(&g);
    int32_t filled[6];
    run_kernel(&g, (void *[]){(void *)I64(2, 3)}, (void *[]){filled});
    for (int i = 0; i < 6; i++) assert_int_equal(filled[i], -7);
    gp_graph_free(&g);

    init(&g, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 1, I64(1));
    cany(&g, "start", GP_DTYPE_FLOAT32, 0, NULL, F64(1));
    cany(&g, "limit", GP_DTYPE_FLOAT32, 0, NULL, F64(2));
    cany(&g, "delta", GP_DTYPE_FLOAT32, 0, NULL, F64(0.25));
    node(&g, "Range", 3, S("start", "limit", "delta"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    double rf[4];
    run_kernel(&g, (void *[]){(void *)F64(1), (void *)F64(2), (void *)F64(0.25)}, (void *[]){rf});
    expect_near64("Range", rf, F64(1, 1.25, 1.5, 1.75), 4, 0);
    gp_graph_free(&g);

    init(&g, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 1, I64(1));
    ci64(&g, "start", 0, NULL, I64(10));
    ci64(&g, "limit", 0, NULL, I64(3));
    ci64(&g, "delta", 0, NULL, I64(-3));
    node(&g, "Range", 3, S("start", "limit", "delta"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    int64_t ri[3];
    run_kernel(&g, (void *[]){(void *)I64(10), (void *)I64(3), (void *)I64(-3)}, (void *[]){ri});
    assert_true(ri[0] == 10 && ri[1] == 7 && ri[2] == 4);
    gp_graph_free(&g);
}

/* Shapes large enough that loops split across threads (and Gather's
 * gradient into several column blocks): gradients, and bit-identical
 * results on 1 and 4 threads. */
static double gen_large(const char *name, int64_t i, void *user)
{
    (void)user;
    if (name[0] == 'i') return (double)((i * 7) % 50) - 10; /* indices into 50 rows */
    return NAN;
}

static void test_large_shapes(void **state)
{
    (void)state;
    const struct op_check_opts o = {.seed = 8, .gen = gen_large};
    struct gp_graph g;
    init(&g, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 3, I64(8, 64, 70));
    input(&g, "i", GP_DTYPE_INT64, 2, I64(4, 40));
    double *table = malloc(sizeof(double) * 50 * 300);
    for (int k = 0; k < 50 * 300; k++) table[k] = sin(k * 0.01);
    cany(&g, "table", GP_DTYPE_FLOAT32, 2, I64(50, 300), table);
    free(table);
    ci64(&g, "pads", 1, I64(6), I64(0, 3, 2, 0, 1, 5));
    ci64(&g, "rep", 1, I64(3), I64(1, 2, 1));
    attr_ints(&g, node(&g, "Transpose", 1, S("x"), 1, S("t")), "perm", 3, I64(2, 0, 1));
    attr_str(&g, node(&g, "Pad", 2, S("t", "pads"), 1, S("p")), "mode", "reflect");
    node(&g, "Tile", 2, S("p", "rep"), 1, S("y0"));
    node(&g, "Gather", 2, S("table", "i"), 1, S("y1"));
    output(&g, "y0");
    output(&g, "y1");
    finalize(&g);
    check_all(&g, &o);
    expect_thread_invariant(&g, false, gen_large);
    gp_graph_free(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copies),
        cmocka_unit_test(test_transpose),
        cmocka_unit_test(test_concat),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_slice),
        cmocka_unit_test(test_gather),
        cmocka_unit_test(test_tile),
        cmocka_unit_test(test_trilu),
        cmocka_unit_test(test_pad),
        cmocka_unit_test(test_shape_producers),
        cmocka_unit_test(test_large_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
