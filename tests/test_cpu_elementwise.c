/* CPU kernels of the elementwise and binary families
 * (src/backend/cpu/elementwise.c, binary.c): forward values against
 * PyTorch 1.13 (literals below; float32), gradients against finite
 * differences in double precision, gradients at kinks and ties against
 * PyTorch's autograd, and the float build against the double build. */
#include "cpu_kernel_test.h"

#include "backend/cpu/kernel.h"

/* Graph inputs named "pos*" get values in [0.2, 2.2); "den*" values of
 * magnitude in [0.5, 1.5) with alternating sign (divisors); "c*" bools;
 * "i*" small integers; anything else uniform(-1, 1). */
static double gen(const char *name, int64_t i, void *user)
{
    (void)user;
    double frac = fmod((double)i * 0.6180339887 + (double)name[0] * 0.1, 1.0);
    if (strncmp(name, "pos", 3) == 0) return 0.2 + 2 * frac;
    if (strncmp(name, "den", 3) == 0) return (i % 2 ? -1 : 1) * (0.5 + frac);
    if (name[0] == 'c') return (double)((i * 7 + 3) % 3 == 0);
    if (name[0] == 'i') return (double)((i * 5) % 7) - 3;
    return NAN;
}

static const struct op_check_opts checks = {.seed = 11, .gen = gen};

/* ---- unary ---- */

static const float unary_x[7] = {-2.5f, -1.0f, -0.3f, 0.0f, 0.4f, 1.2f, 3.0f};
static const float unary_pos[7] = {0.05f, 0.3f, 1.0f, 2.0f, 4.5f, 9.0f, 100.0f};

struct unary_case {
    const char *op;
    int opset;
    const char *fattr; /* a float attribute, or NULL */
    float fval;
    const char *approximate; /* Gelu's attribute, or NULL */
    bool positive;           /* takes unary_pos instead of unary_x */
    float want[7];
};

/* torch.nn.functional / torch.* on unary_x (or unary_pos), float32. */
static const struct unary_case unary_cases[] = {
    {"Relu", 17, NULL, 0, NULL, false, {0, 0, 0, 0, 0.400000006f, 1.20000005f, 3}},
    {"LeakyRelu", 17, NULL, 0, NULL, false,
     {-0.0249999985f, -0.00999999978f, -0.00300000003f, 0, 0.400000006f, 1.20000005f, 3}},
    {"LeakyRelu", 17, "alpha", 0.2f, NULL, false,
     {-0.5f, -0.200000003f, -0.0600000024f, 0, 0.400000006f, 1.20000005f, 3}},
    /* A negative slope: the gradient's sign test reads X (gp_unary_grad_reads). */
    {"LeakyRelu", 17, "alpha", -0.5f, NULL, false,
     {1.25f, 0.5f, 0.150000006f, 0, 0.400000006f, 1.20000005f, 3}},
    {"Sigmoid", 17, NULL, 0, NULL, false,
     {0.0758581758f, 0.268941432f, 0.425557494f, 0.5f, 0.598687649f, 0.768524826f, 0.952574134f}},
    {"Tanh", 17, NULL, 0, NULL, false,
     {-0.986614287f, -0.761594176f, -0.291312635f, 0, 0.379948974f, 0.833654642f, 0.995054781f}},
    {"Erf", 17, NULL, 0, NULL, false,
     {-0.999593019f, -0.842700779f, -0.328626782f, 0, 0.428392351f, 0.910313964f, 0.999977887f}},
    {"Gelu", 20, NULL, 0, "none", false,
     {-0.0155241787f, -0.158655286f, -0.114626586f, 0, 0.262168676f, 1.06191635f, 2.99595022f}},
    {"Gelu", 20, NULL, 0, "tanh", false,
     {-0.0150842965f, -0.158807993f, -0.114629082f, 0, 0.262161165f, 1.06170273f, 2.99636269f}},
    {"Sqrt", 17, NULL, 0, NULL, true,
     {0.223606795f, 0.547722578f, 1, 1.41421354f, 2.12132025f, 3, 10}},
    {"Neg", 17, NULL, 0, NULL, false, {2.5f, 1, 0.300000012f, 0, -0.400000006f, -1.20000005f, -3}},
    {"Exp", 17, NULL, 0, NULL, false,
     {0.0820849985f, 0.36787945f, 0.740818202f, 1, 1.49182463f, 3.320117f, 20.085537f}},
    {"Log", 17, NULL, 0, NULL, true,
     {-2.99573231f, -1.20397282f, 0, 0.693147182f, 1.50407743f, 2.19722462f, 4.60517025f}},
    {"Abs", 17, NULL, 0, NULL, false, {2.5f, 1, 0.300000012f, 0, 0.400000006f, 1.20000005f, 3}},
    {"Reciprocal", 17, NULL, 0, NULL, true,
     {20, 3.33333325f, 1, 0.5f, 0.222222224f, 0.111111112f, 0.00999999978f}},
    {"Softplus", 17, NULL, 0, NULL, false,
     {0.078889735f, 0.313261688f, 0.554355264f, 0.693147182f, 0.913015246f, 1.46328247f,
      3.04858732f}},
    {"Elu", 17, NULL, 0, NULL, false,
     {-0.917914987f, -0.63212055f, -0.259181798f, 0, 0.400000006f, 1.20000005f, 3}},
    {"Elu", 17, "alpha", 0.5f, NULL, false,
     {-0.458957493f, -0.316060275f, -0.129590899f, 0, 0.400000006f, 1.20000005f, 3}},
    /* clamp(0.2 x + 0.5, 0, 1): ONNX's default alpha and beta. */
    {"HardSigmoid", 17, NULL, 0, NULL, false,
     {0, 0.300000012f, 0.439999998f, 0.5f, 0.579999983f, 0.74000001f, 1}},
    {"HardSigmoid", 17, "alpha", 0.6f, NULL, false, {0, 0, 0.32f, 0.5f, 0.74f, 1, 1}},
    /* x clamp(x + 3, 0, 6) / 6 (PyTorch's hardswish, float32). */
    {"HardSwish", 17, NULL, 0, NULL, false,
     {-0.208333328f, -0.333333343f, -0.135000005f, 0, 0.226666674f, 0.839999974f, 3}},
    {"Floor", 17, NULL, 0, NULL, false, {-3, -1, -1, 0, 0, 1, 3}},
    {"Ceil", 17, NULL, 0, NULL, false, {-2, -1, -0.0f, 0, 1, 2, 3}},
    {"Sign", 17, NULL, 0, NULL, false, {-1, -1, -1, 0, 1, 1, 1}},
};

static void build_unary(struct gp_graph *g, const struct unary_case *uc, int rank,
                        const int64_t *dims)
{
    init(g, uc->opset);
    input(g, uc->positive ? "pos" : "x", GP_DTYPE_FLOAT32, rank, dims);
    int n = node(g, uc->op, 1, uc->positive ? S("pos") : S("x"), 1, S("y"));
    if (uc->fattr) attr_float(g, n, uc->fattr, uc->fval);
    if (uc->approximate) attr_str(g, n, "approximate", uc->approximate);
    output(g, "y");
    finalize(g);
}

static void test_unary_forward(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof unary_cases / sizeof *unary_cases; k++) {
        const struct unary_case *uc = &unary_cases[k];
        struct gp_graph g;
        build_unary(&g, uc, 1, I64(7));
        float y[7];
        run1(&g, (const void *[]){uc->positive ? unary_pos : unary_x}, y);
        expect_near(uc->op, y, uc->want, 7, 2e-6);
        gp_graph_free(&g);
    }
}

/* Every differentiable case on a [3, 5] input: finite differences and
 * float vs double. */
static void test_unary_gradients(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof unary_cases / sizeof *unary_cases; k++) {
        struct gp_graph g;
        build_unary(&g, &unary_cases[k], 2, I64(3, 5));
        check_all(&g, &checks);
        gp_graph_free(&g);
    }
}

/* dY = 1 at x = -1, 0, 1, where finite differences cannot judge: the
 * values of torch.autograd at the kinks. */
static void test_unary_kinks_match_pytorch(void **state)
{
    (void)state;
    static const struct {
        const char *op;
        const char *fattr;
        float fval;
        double want[3];
    } cases[] = {
        {"Relu", NULL, 0, {0, 0, 1}},
        {"Abs", NULL, 0, {-1, 0, 1}},
        {"LeakyRelu", NULL, 0, {0.01, 0.01, 1}},
        {"LeakyRelu", "alpha", -0.5f, {-0.5, -0.5, 1}},
        {"Elu", "alpha", 0.5f, {0.18393972058572117, 0.5, 1}},
        /* 0.6 x + 0.5: saturated at -1 and 1 */
        {"HardSigmoid", "alpha", 0.6f, {0, 0.6000000238418579, 0}},
        {"HardSwish", NULL, 0, {1.0 / 6, 0.5, 5.0 / 6}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        struct gp_graph g;
        init(&g, 17);
        input(&g, "x", GP_DTYPE_FLOAT32, 1, I64(3));
        int n = node(&g, cases[k].op, 1, S("x"), 1, S("y"));
        if (cases[k].fattr) attr_float(&g, n, cases[k].fattr, cases[k].fval);
        output(&g, "y");
        finalize(&g);
        struct gp_cpu_runner *r =
            run_backward(&g, (const void *[]){F32(-1, 0, 1)}, (const double *[]){F64(1, 1, 1)}, false);
        expect_near64(cases[k].op, grad_of(r, &g, "x"), cases[k].want, 3, 1e-7);
        gp_cpu_runner_free_f64(r);
        gp_graph_free(&g);
    }
}

/* HardSwish's gradient at its kinks, as torch.nn.functional.hardswish's
 * backward (torch 1.13, float64): -3 takes the middle piece (x/3 + 1/2 =
 * -1/2), 3 too (3/2). */
static void test_hardswish_kinks_match_pytorch(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 17);
    input(&g, "x", GP_DTYPE_FLOAT32, 1, I64(5));
    node(&g, "HardSwish", 1, S("x"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    struct gp_cpu_runner *r =
        run_backward(&g, (const void *[]){F32(-4, -3, 0, 3, 4)}, (const double *[]){F64(1, 1, 1, 1, 1)}, false);
    expect_near64("HardSwish", grad_of(r, &g, "x"), F64(0, -0.5, 0.5, 1.5, 1), 5, 1e-12);
    gp_cpu_runner_free_f64(r);
    gp_graph_free(&g);
}

/* Round halves to even; integer Relu/Neg/Abs/Sign; Not. */
static void test_unary_round_and_integers(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 17);
    input(&g, "x", GP_DTYPE_FLOAT32, 1, I64(7));
    node(&g, "Round", 1, S("x"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    float y[7];
    run1(&g, (const void *[]){F32(-2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f, 0.4999f)}, y);
    expect_near("Round", y, F32(-2, -2, -0.0f, 0, 2, 2, 0), 7, 0);
    gp_graph_free(&g);

    static const struct {
        const char *op;
        int64_t want[4];
    } cases[] = {
        {"Relu", {0, 0, 5, 0}},
        {"Neg", {7, 0, -5, INT64_MAX}},
        {"Abs", {7, 0, 5, INT64_MAX}},
        {"Sign", {-1, 0, 1, -1}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        init(&g, 17);
        input(&g, "x", GP_DTYPE_INT64, 1, I64(4));
        node(&g, cases[k].op, 1, S("x"), 1, S("y"));
        output(&g, "y");
        finalize(&g);
        int64_t out[4];
        run1(&g, (const void *[]){I64(-7, 0, 5, -INT64_MAX)}, out);
        for (int i = 0; i < 4; i++) assert_int_equal(out[i], cases[k].want[i]);
        gp_graph_free(&g);
    }

    init(&g, 17);
    input(&g, "x", GP_DTYPE_BOOL, 1, I64(3));
    node(&g, "Not", 1, S("x"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    uint8_t b[3];
    run1(&g, (const void *[]){U8(1, 0, 1)}, b);
    assert_int_equal(b[0], 0);
    assert_int_equal(b[1], 1);
    assert_int_equal(b[2], 0);
    gp_graph_free(&g);
}

/* ---- binary ---- */

/* A scalar b (rank 0) cannot be a graph input (those need a batch axis):
 * it becomes a trainable initializer, so its gradient is checked too. */
static void build_binary(struct gp_graph *g, const char *op, const char *a, int ra,
                         const int64_t *da, const char *b, int rb, const int64_t *db)
{
    init(g, 17);
    input(g, a, GP_DTYPE_FLOAT32, ra, da);
    if (rb) input(g, b, GP_DTYPE_FLOAT32, rb, db);
    else cany(g, b, GP_DTYPE_FLOAT32, 0, NULL, F64(-0.7));
    node(g, op, 2, S(a, b), 1, S("y"));
    output(g, "y");
    finalize(g);
}

/* a [2, 3] op b [2, 1], values from PyTorch. */
static void test_binary_forward(void **state)
{
    (void)state;
    static const struct {
        const char *op;
        float want[6];
    } cases[] = {
        {"Add", {2, 0.25f, 3.5f, 1, -1.25f, -2.5f}},
        {"Sub", {-1, -2.75f, 0.5f, 5, 2.75f, 1.5f}},
        {"Mul", {0.75f, -1.875f, 3, -6, -1.5f, 1}},
        {"Div", {0.333333343f, -0.833333313f, 1.33333337f, -1.5f, -0.375f, 0.25f}},
    };
    const float a[6] = {0.5f, -1.25f, 2.0f, 3.0f, 0.75f, -0.5f}, b[2] = {1.5f, -2.0f};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        struct gp_graph g;
        build_binary(&g, cases[k].op, "a", 2, I64(2, 3), "b", 2, I64(2, 1));
        float y[6];
        run1(&g, (const void *[]){a, b}, y);
        expect_near(cases[k].op, y, cases[k].want, 6, 1e-7);
        gp_graph_free(&g);
    }

    /* Pow [2, 3] ^ [3]; fmod. */
    struct gp_graph g;
    build_binary(&g, "Pow", "a", 2, I64(2, 3), "b", 1, I64(3));
    float y[6];
    run1(&g, (const void *[]){F32(0.5f, 1.25f, 2.0f, 3.0f, 0.75f, 1.5f), F32(1.5f, -2.0f, 0.5f)}, y);
    expect_near("Pow", y,
                F32(0.353553385f, 0.639999986f, 1.41421354f, 5.19615221f, 1.77777779f,
                    1.22474492f), 6, 2e-7);
    gp_graph_free(&g);

    init(&g, 17);
    input(&g, "a", GP_DTYPE_FLOAT32, 1, I64(4));
    input(&g, "b", GP_DTYPE_FLOAT32, 1, I64(4));
    attr_int(&g, node(&g, "Mod", 2, S("a", "b"), 1, S("y")), "fmod", 1);
    output(&g, "y");
    finalize(&g);
    run1(&g, (const void *[]){F32(5.5f, -5.5f, 7.0f, -7.25f), F32(2, 2, -3, 1.5f)}, y);
    expect_near("Mod", y, F32(1.5f, -1.5f, 1, -1.25f), 4, 0);
    gp_graph_free(&g);
}

/* Integer arithmetic: Div truncates, Mod follows the divisor's sign unless
 * fmod=1, Pow with an integer exponent; division by zero is an error that
 * names the node. */
static void test_binary_integers(void **state)
{
    (void)state;
    static const struct {
        const char *op;
        int64_t fmod;
        int64_t want[4];
    } cases[] = {
        {"Add", -1, {-4, -8, 7, -4}},
        {"Div", -1, {-2, 3, 2, 0}},
        {"Mod", 0, {2, 0, 1, -4}},
        {"Mod", 1, {-1, 0, 1, 3}},
        {"Pow", -1, {-343, 0, 25, 0}}, /* negative exponents give 0 */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        struct gp_graph g;
        init(&g, 17);
        input(&g, "a", GP_DTYPE_INT64, 1, I64(4));
        input(&g, "b", GP_DTYPE_INT64, 1, I64(4));
        int n = node(&g, cases[k].op, 2, S("a", "b"), 1, S("y"));
        if (cases[k].fmod >= 0) attr_int(&g, n, "fmod", cases[k].fmod);
        output(&g, "y");
        finalize(&g);
        int64_t y[4];
        run1(&g, (const void *[]){I64(-7, -6, 5, 3), I64(3, -2, 2, -7)}, y);
        for (int i = 0; i < 4; i++)
            if (y[i] != cases[k].want[i])
                fail_msg("%s[%d]: %lld, expected %lld", cases[k].op, i, (long long)y[i],
                         (long long)cases[k].want[i]);
        gp_graph_free(&g);
    }

    struct gp_graph g;
    init(&g, 17);
    input(&g, "a", GP_DTYPE_INT32, 1, I64(2));
    input(&g, "b", GP_DTYPE_INT32, 1, I64(2));
    node(&g, "Div", 2, S("a", "b"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    struct gp_error err = {0};
    struct gp_cpu_runner *r = NULL;
    assert_int_equal(gp_cpu_runner_create_f64(&g, false, &r, &err), GP_OK);
    gp_cpu_runner_set_f64(r, g.inputs[0], (const int32_t[]){4, 5});
    gp_cpu_runner_set_f64(r, g.inputs[1], (const int32_t[]){2, 0});
    struct gp_run_opts o = {.dropout_ratio = -1};
    assert_int_equal(gp_cpu_runner_forward_f64(r, &o, 0, g.n_nodes, &err), GP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "(Div)"));
    assert_non_null(strstr(err.msg, "division by zero (divisor element 1)"));
    gp_cpu_runner_free_f64(r);
    gp_graph_free(&g);
}

/* a + b -> s -> Relu -> y; b shaped `bdims` (rank 3, or [4] to broadcast);
 * `keep_s`: s is a graph output too. */
static void build_add_relu(struct gp_graph *g, int brank, const int64_t *bdims, bool keep_s)
{
    init(g, 17);
    input(g, "a", GP_DTYPE_FLOAT32, 3, I64(2, 3, 4));
    input(g, "b", GP_DTYPE_FLOAT32, brank, bdims);
    node(g, "Add", 2, S("a", "b"), 1, S("s"));
    node(g, "Relu", 1, S("s"), 1, S("y"));
    output(g, "y");
    if (keep_s) output(g, "s");
    finalize(g);
}

/* Relu fused into a residual Add (graph/fuse.c): one node whose output and
 * both gradients are the pair's bits, sums of exactly 0 included (masked,
 * as Relu's backward masks its input 0); with broadcasting, or the sum read
 * elsewhere, the two stay apart. */
static void test_add_relu_fused(void **state)
{
    (void)state;
    struct gp_graph fused, pair, bcast;
    build_add_relu(&fused, 3, I64(2, 3, 4), false);
    build_add_relu(&pair, 3, I64(2, 3, 4), true);
    build_add_relu(&bcast, 1, I64(4), false);
    assert_int_equal(fused.n_nodes, 1);
    assert_true(fused.nodes[0].fused_relu);
    assert_int_equal(pair.n_nodes, 2);
    assert_int_equal(bcast.n_nodes, 2);
    float a[24], b[24];
    double dy[24];
    for (int i = 0; i < 24; i++) {
        a[i] = (float)((i * 7 + 3) % 11 - 5) / 8.0f;
        b[i] = i % 5 == 0 ? -a[i] : (float)((i * 5 + 1) % 9 - 4) / 4.0f; /* every fifth sum is 0 */
        dy[i] = (double)((i * 3 + 2) % 7 - 3) / 2.0;
    }
    const void *in[2] = {a, b};
    struct gp_cpu_runner *rf = run_backward(&fused, in, (const double *const[]){dy}, true);
    struct gp_cpu_runner *rp = run_backward(&pair, in, (const double *const[]){dy, NULL}, true);
    int masked = 0;
    const double *yf = gp_cpu_runner_data_f64(rf, gp_graph_find_value(&fused, "y"));
    for (int i = 0; i < 24; i++) masked += yf[i] == 0;
    if (masked < 6 || masked > 18) fail_msg("%d of 24 sums masked: choose inputs of both signs", masked);
    if (memcmp(yf, gp_cpu_runner_data_f64(rp, gp_graph_find_value(&pair, "y")), sizeof(double) * 24))
        fail_msg("y: fused Add + Relu differs from the pair");
    static const char *const names[] = {"a", "b"};
    for (int k = 0; k < 2; k++)
        if (memcmp(grad_of(rf, &fused, names[k]), grad_of(rp, &pair, names[k]), sizeof(double) * 24))
            fail_msg("gradient of %s: fused Add + Relu differs from the pair", names[k]);
    gp_cpu_runner_free_f64(rf);
    gp_cpu_runner_free_f64(rp);
    op_gradcheck(&fused, &(struct op_check_opts){.seed = 5});
    gp_graph_free(&fused);
    gp_graph_free(&pair);
    gp_graph_free(&bcast);
}

/* Gradients of both inputs over broadcasting patterns: same shapes, one
 * side broadcast, both sides broadcast, lower rank, a scalar. */
static void test_binary_gradients(void **state)
{
    (void)state;
    static const struct {
        int ra;
        int64_t da[3];
        int rb;
        int64_t db[3];
    } shapes[] = {
        {3, {2, 3, 4}, 3, {2, 3, 4}},
        {3, {2, 3, 4}, 2, {3, 1}},
        {3, {2, 1, 4}, 2, {3, 1}},
        {1, {4}, 3, {2, 3, 4}},
        {3, {2, 3, 1}, 0, {0}},
        {2, {1, 5}, 2, {4, 1}},
    };
    static const char *const ops[] = {"Add", "Sub", "Mul", "Div"};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        for (size_t k = 0; k < 4; k++) {
            struct gp_graph g;
            build_binary(&g, ops[k], "a", shapes[s].ra, shapes[s].da, "den", shapes[s].rb,
                         shapes[s].db);
            check_all(&g, &checks);
            gp_graph_free(&g);
        }
        /* Pow: positive base, constant exponent (marked non-differentiable). */
        struct gp_graph g;
        init(&g, 17);
        input(&g, "pos", GP_DTYPE_FLOAT32, shapes[s].ra, shapes[s].da);
        double e[24];
        for (int i = 0; i < 24; i++) e[i] = -1.5 + 0.25 * i;
        struct gp_shape sb = shp(shapes[s].rb, shapes[s].db);
        assert_true(gp_shape_numel(&sb) <= 24);
        cany(&g, "e", GP_DTYPE_FLOAT32, shapes[s].rb, shapes[s].db, e);
        node(&g, "Pow", 2, S("pos", "e"), 1, S("y"));
        output(&g, "y");
        finalize(&g);
        check_all(&g, &checks);
        gp_graph_free(&g);
    }
    /* The same input on both sides accumulates both terms: d(x*x)/dx = 2x. */
    struct gp_graph g;
    init(&g, 17);
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(2, 3));
    node(&g, "Mul", 2, S("x", "x"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    check_all(&g, &checks);
    gp_graph_free(&g);
}

/* Pow's gradients at its special points, against PyTorch: both inputs'
 * gradients, including the exponent's (the runner never asks for it, as
 * the op layer treats the exponent as a constant; called directly here). */
static void test_pow_gradients_match_pytorch(void **state)
{
    (void)state;
    struct gp_graph g;
    build_binary(&g, "Pow", "a", 2, I64(2, 3), "b", 1, I64(3));
    const double a[6] = {0.5, 1.25, 2.0, 3.0, 0.75, 1.5}, b[3] = {1.5, -2.0, 0.5};
    double y[6], dy[6] = {1, 1, 1, 1, 1, 1}, da[6] = {0}, db[3] = {0};
    for (int i = 0; i < 6; i++) y[i] = pow(a[i], b[i % 3]);
    const struct gp_node *n = &g.nodes[0];
    const struct gp_cpu_kernel *k = gp_cpu_kernel_for_f64(n);
    assert_non_null(k);
    struct gp_cpu_ctx c = {.graph = &g, .node = n, .in = (void *[]){(void *)a, (void *)b},
                           .out = (void *[]){y}, .din = (double *[]){da, db},
                           .dout = (double *[]){dy}};
    struct gp_error err = {0};
    assert_int_equal(k->backward(&c, &err), GP_OK);
    expect_near64("dA", da,
                  F64(1.06066012, -1.02400005, 0.353553385, 2.59807611, -4.74074078, 0.408248305),
                  6, 1e-7);
    expect_near64("dB", db, F64(5.46349192, -0.368622988, 1.47684944), 3, 1e-7);

    /* Exponent 0 gives no base gradient; base 0 with exponent >= 0 gives no
     * exponent gradient (torch: [0, 0.25, 0] for bases [1, 4, 0]). */
    const double a2[6] = {1, 4, 0, 1, 4, 0}, b2[3] = {0, 0.5, 2};
    for (int i = 0; i < 6; i++) y[i] = pow(a2[i], b2[i % 3]), da[i] = 0;
    db[0] = db[1] = db[2] = 0;
    c.in = (void *[]){(void *)a2, (void *)b2};
    assert_int_equal(k->backward(&c, &err), GP_OK);
    expect_near64("dA at 0", da, F64(0, 0.25, 0, 0, 0.25, 0), 6, 1e-12);
    expect_near64("dB at 0", db, F64(0, 2 * 2 * log(4.0), 0), 3, 1e-12);
    gp_graph_free(&g);
}

/* Comparisons and logic: bool outputs, broadcast; float and int64 inputs
 * against C's own comparisons of the same values. */
static void test_compare_and_logic(void **state)
{
    (void)state;
    static const char *const ops[] = {"Equal", "Less", "LessOrEqual", "Greater",
                                      "GreaterOrEqual"};
    for (int k = 0; k < 5; k++) {
        for (int as_int = 0; as_int < 2; as_int++) {
            struct gp_graph g;
            enum gp_dtype dt = as_int ? GP_DTYPE_INT64 : GP_DTYPE_FLOAT32;
            init(&g, 17);
            input(&g, "a", dt, 2, I64(2, 3));
            input(&g, "b", dt, 1, I64(3));
            node(&g, ops[k], 2, S("a", "b"), 1, S("y"));
            output(&g, "y");
            finalize(&g);
            uint8_t y[6];
            if (as_int) run1(&g, (const void *[]){I64(1, 2, 3, 4, 5, 6), I64(2, 5, 2)}, y);
            else run1(&g, (const void *[]){F32(1, 2, 3, 4, 5, 6), F32(2, 5, 2)}, y);
            for (int i = 0; i < 6; i++) {
                int x = i + 1, b = i % 3 == 1 ? 5 : 2;
                int want = k == 0 ? x == b : k == 1 ? x < b : k == 2 ? x <= b : k == 3 ? x > b
                                                                                     : x >= b;
                if (y[i] != want) fail_msg("%s[%d] (int %d): %d", ops[k], i, as_int, y[i]);
            }
            gp_graph_free(&g);
        }
    }
    static const struct {
        const char *op;
        uint8_t want[4];
    } logic[] = {{"And", {0, 0, 0, 1}}, {"Or", {0, 1, 1, 1}}, {"Xor", {0, 1, 1, 0}}};
    for (size_t k = 0; k < 3; k++) {
        struct gp_graph g;
        init(&g, 17);
        input(&g, "a", GP_DTYPE_BOOL, 2, I64(2, 2));
        input(&g, "b", GP_DTYPE_BOOL, 1, I64(2));
        node(&g, logic[k].op, 2, S("a", "b"), 1, S("y"));
        output(&g, "y");
        finalize(&g);
        uint8_t y[4];
        run1(&g, (const void *[]){U8(0, 0, 1, 1), U8(0, 1)}, y);
        for (int i = 0; i < 4; i++) assert_int_equal(y[i], logic[k].want[i]);
        gp_graph_free(&g);
    }
}

/* ---- variadic ---- */

static void build_variadic(struct gp_graph *g, const char *op, int n_in)
{
    static const int64_t dims[3][3] = {{2, 3, 4}, {3, 1}, {4}};
    static const int ranks[3] = {3, 2, 1};
    static const char *const names[3] = {"x0", "x1", "x2"};
    init(g, 17);
    for (int k = 0; k < n_in; k++) input(g, names[k], GP_DTYPE_FLOAT32, ranks[k], dims[k]);
    node(g, op, n_in, names, 1, S("y"));
    output(g, "y");
    finalize(g);
}

static void test_variadic(void **state)
{
    (void)state;
    static const char *const ops[] = {"Max", "Min", "Sum", "Mean"};
    for (int k = 0; k < 4; k++) {
        for (int n_in = 1; n_in <= 3; n_in++) {
            struct gp_graph g;
            build_variadic(&g, ops[k], n_in);
            check_all(&g, &checks);
            gp_graph_free(&g);
        }
    }
    /* Forward against torch.maximum / minimum / sum / mean of three [4]. */
    static const struct {
        const char *op;
        float want[4];
    } cases[] = {
        {"Max", {4, 2, 3, 5}}, {"Min", {0, 0, 0, 0}},
        {"Sum", {5, 4, 4, 9}}, {"Mean", {5.0f / 3, 4.0f / 3, 4.0f / 3, 3}},
    };
    for (int k = 0; k < 4; k++) {
        struct gp_graph g;
        init(&g, 17);
        input(&g, "a", GP_DTYPE_FLOAT32, 1, I64(4));
        input(&g, "b", GP_DTYPE_FLOAT32, 1, I64(4));
        input(&g, "c", GP_DTYPE_FLOAT32, 1, I64(1));
        node(&g, cases[k].op, 3, S("a", "b", "c"), 1, S("y"));
        output(&g, "y");
        finalize(&g);
        float y[4];
        run1(&g, (const void *[]){F32(1, 2, 3, 4), F32(4, 2, 1, 5), F32(0)}, y);
        expect_near(cases[k].op, y, cases[k].want, 4, 1e-7);
        gp_graph_free(&g);
    }
}

/* Ties send the whole gradient to the first input holding the value; a
 * NaN is selected and propagates. */
static void test_max_ties_go_to_first(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 17);
    input(&g, "a", GP_DTYPE_FLOAT32, 1, I64(4));
    input(&g, "b", GP_DTYPE_FLOAT32, 1, I64(4));
    node(&g, "Max", 2, S("a", "b"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    struct gp_cpu_runner *r = run_backward(&g, (const void *[]){F32(1, 2, 3, NAN), F32(4, 2, 1, 5)},
                                           (const double *[]){F64(1, 10, 100, 1000)}, false);
    expect_near64("da", grad_of(r, &g, "a"), F64(0, 10, 100, 1000), 4, 0);
    expect_near64("db", grad_of(r, &g, "b"), F64(1, 0, 0, 0), 4, 0);
    const double *y = gp_cpu_runner_data_f64(r, gp_graph_find_value(&g, "y"));
    assert_true(isnan(y[3]));
    gp_cpu_runner_free_f64(r);
    gp_graph_free(&g);
}

/* ---- Where, Expand, Clip, Cast, Identity ---- */

static void test_where(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 17);
    input(&g, "c", GP_DTYPE_BOOL, 2, I64(2, 1));
    input(&g, "x", GP_DTYPE_FLOAT32, 1, I64(3));
    input(&g, "y", GP_DTYPE_FLOAT32, 2, I64(2, 3));
    node(&g, "Where", 3, S("c", "x", "y"), 1, S("o"));
    output(&g, "o");
    finalize(&g);
    float o[6];
    run1(&g, (const void *[]){U8(1, 0), F32(1, 2, 3), F32(4, 5, 6, 7, 8, 9)}, o);
    expect_near("Where", o, F32(1, 2, 3, 7, 8, 9), 6, 0);
    /* dx gets the rows where c holds, summed; dy the rest. */
    struct gp_cpu_runner *r = run_backward(&g, (const void *[]){U8(1, 0), F32(1, 2, 3),
                                                                F32(4, 5, 6, 7, 8, 9)},
                                           (const double *[]){F64(1, 2, 3, 4, 5, 6)}, false);
    expect_near64("dx", grad_of(r, &g, "x"), F64(1, 2, 3), 3, 0);
    expect_near64("dy", grad_of(r, &g, "y"), F64(0, 0, 0, 4, 5, 6), 6, 0);
    gp_cpu_runner_free_f64(r);
    check_all(&g, &checks);
    gp_graph_free(&g);

    /* A full-size condition against broadcast values; int64 values. */
    init(&g, 17);
    input(&g, "c", GP_DTYPE_BOOL, 3, I64(2, 3, 4));
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(3, 1));
    cany(&g, "y", GP_DTYPE_FLOAT32, 0, NULL, F64(0.25)); /* a scalar parameter */
    node(&g, "Where", 3, S("c", "x", "y"), 1, S("o"));
    output(&g, "o");
    finalize(&g);
    check_all(&g, &checks);
    gp_graph_free(&g);

    init(&g, 17);
    input(&g, "c", GP_DTYPE_BOOL, 1, I64(3));
    input(&g, "i", GP_DTYPE_INT64, 1, I64(3));
    input(&g, "j", GP_DTYPE_INT64, 1, I64(1));
    node(&g, "Where", 3, S("c", "i", "j"), 1, S("o"));
    output(&g, "o");
    finalize(&g);
    int64_t oi[3];
    run1(&g, (const void *[]){U8(0, 1, 0), I64(10, 20, 30), I64(-1)}, oi);
    assert_int_equal(oi[0], -1);
    assert_int_equal(oi[1], 20);
    assert_int_equal(oi[2], -1);
    gp_graph_free(&g);
}

static void test_expand(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 17);
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(3, 1));
    ci64(&g, "shape", 1, I64(3), I64(2, 1, 4));
    node(&g, "Expand", 2, S("x", "shape"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    float y[24];
    run1(&g, (const void *[]){F32(1, 2, 3)}, y);
    for (int i = 0; i < 24; i++) assert_true(y[i] == (float)((i / 4) % 3 + 1));
    struct gp_cpu_runner *r = run_backward(&g, (const void *[]){F32(1, 2, 3)},
                                           (const double *[]){F64(1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3,
                                                                  4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6)},
                                           false);
    expect_near64("dx", grad_of(r, &g, "x"), F64(20, 28, 36), 3, 0);
    gp_cpu_runner_free_f64(r);
    check_all(&g, &checks);
    gp_graph_free(&g);

    init(&g, 17);
    input(&g, "i", GP_DTYPE_INT64, 1, I64(2));
    ci64(&g, "shape", 1, I64(2), I64(3, 1));
    node(&g, "Expand", 2, S("i", "shape"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    int64_t yi[6];
    run1(&g, (const void *[]){I64(7, -8)}, yi);
    for (int i = 0; i < 6; i++) assert_int_equal(yi[i], i % 2 ? -8 : 7);
    gp_graph_free(&g);
}

static void test_clip(void **state)
{
    (void)state;
    /* Clip-6 with attributes; Clip-13 with constant bound inputs, one
     * omitted; the gradient passes at the bounds, as torch.clamp's does. */
    for (int version = 0; version < 2; version++) {
        struct gp_graph g;
        init(&g, version ? 13 : 6);
        input(&g, "x", GP_DTYPE_FLOAT32, 1, I64(5));
        if (version) {
            cf32(&g, "lo", 0, NULL, F32(-2.5f));
            cf32(&g, "hi", 0, NULL, F32(2.5f));
            node(&g, "Clip", 3, S("x", "lo", "hi"), 1, S("y"));
        } else {
            int n = node(&g, "Clip", 1, S("x"), 1, S("y"));
            attr_float(&g, n, "min", -2.5f);
            attr_float(&g, n, "max", 2.5f);
        }
        output(&g, "y");
        finalize(&g);
        float y[5];
        const float x[5] = {-3, -2.5f, 0, 2.5f, 3};
        run1(&g, (const void *[]){x}, y);
        expect_near("Clip", y, F32(-2.5f, -2.5f, 0, 2.5f, 2.5f), 5, 0);
        struct gp_cpu_runner *r = run_backward(&g, (const void *[]){x},
                                               (const double *[]){F64(1, 1, 1, 1, 1)}, false);
        expect_near64("dClip", grad_of(r, &g, "x"), F64(0, 1, 1, 1, 0), 5, 0);
        gp_cpu_runner_free_f64(r);
        check_all(&g, &checks);
        gp_graph_free(&g);
    }
    /* Only max given; min > max gives max; integers. */
    struct gp_graph g;
    init(&g, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 1, I64(3));
    cf32(&g, "hi", 0, NULL, F32(0.5f));
    node(&g, "Clip", 3, S("x", "", "hi"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    float y[3];
    run1(&g, (const void *[]){F32(-7, 0.25f, 9)}, y);
    expect_near("Clip max only", y, F32(-7, 0.25f, 0.5f), 3, 0);
    gp_graph_free(&g);

    init(&g, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 1, I64(3));
    cf32(&g, "lo", 0, NULL, F32(2));
    cf32(&g, "hi", 0, NULL, F32(1));
    node(&g, "Clip", 3, S("x", "lo", "hi"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    run1(&g, (const void *[]){F32(0, 1.5f, 3)}, y);
    expect_near("Clip min > max", y, F32(1, 1, 1), 3, 0);
    gp_graph_free(&g);

    init(&g, 13);
    input(&g, "x", GP_DTYPE_INT32, 1, I64(3));
    cany(&g, "lo", GP_DTYPE_INT32, 0, NULL, F64(-1));
    cany(&g, "hi", GP_DTYPE_INT32, 0, NULL, F64(4));
    node(&g, "Clip", 3, S("x", "lo", "hi"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    int32_t yi[3];
    run1(&g, (const void *[]){(const int32_t[]){-5, 2, 9}}, yi);
    assert_int_equal(yi[0], -1);
    assert_int_equal(yi[1], 2);
    assert_int_equal(yi[2], 4);
    gp_graph_free(&g);
}

static void test_cast(void **state)
{
    (void)state;
    const float x[5] = {-2.7f, -0.5f, 0.0f, 1.9f, 3e10f};
    struct gp_graph g;
    /* float -> int64 truncates (and saturates), -> int32, -> bool. */
    init(&g, 17);
    input(&g, "x", GP_DTYPE_FLOAT32, 1, I64(5));
    attr_int(&g, node(&g, "Cast", 1, S("x"), 1, S("a")), "to", GP_DTYPE_INT64);
    attr_int(&g, node(&g, "Cast", 1, S("x"), 1, S("b")), "to", GP_DTYPE_BOOL);
    output(&g, "a");
    output(&g, "b");
    finalize(&g);
    int64_t a[5];
    uint8_t b[5];
    op_forward_f32(&g, (const void *[]){x}, (void *[]){a, b}, false);
    assert_int_equal(a[0], -2);
    assert_int_equal(a[1], 0);
    assert_int_equal(a[3], 1);
    assert_int_equal(a[4], 30000001024LL);
    for (int i = 0; i < 5; i++) assert_int_equal(b[i], i != 2);
    gp_graph_free(&g);

    /* int64 -> float, bool -> float, int64 -> int32 (wraps). */
    init(&g, 17);
    input(&g, "i", GP_DTYPE_INT64, 1, I64(3));
    input(&g, "c", GP_DTYPE_BOOL, 1, I64(3));
    attr_int(&g, node(&g, "Cast", 1, S("i"), 1, S("f")), "to", GP_DTYPE_FLOAT32);
    attr_int(&g, node(&g, "Cast", 1, S("c"), 1, S("fc")), "to", GP_DTYPE_FLOAT32);
    attr_int(&g, node(&g, "Cast", 1, S("i"), 1, S("i32")), "to", GP_DTYPE_INT32);
    output(&g, "f");
    output(&g, "fc");
    output(&g, "i32");
    finalize(&g);
    float f[3], fc[3];
    int32_t i32[3];
    op_forward_f32(&g, (const void *[]){I64(-3, 7, 4294967297LL), U8(1, 0, 1)},
                   (void *[]){f, fc, i32}, false);
    expect_near("int64->float", f, F32(-3, 7, 4294967297.0f), 3, 0);
    expect_near("bool->float", fc, F32(1, 0, 1), 3, 0);
    assert_int_equal(i32[0], -3);
    assert_int_equal(i32[2], 1);
    gp_graph_free(&g);

    /* Float to float passes the gradient; CastLike takes the second input's
     * type. */
    init(&g, 17);
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(2, 3));
    attr_int(&g, node(&g, "Cast", 1, S("x"), 1, S("y")), "to", GP_DTYPE_FLOAT32);
    output(&g, "y");
    finalize(&g);
    check_all(&g, &checks);
    gp_graph_free(&g);

    init(&g, 17);
    input(&g, "x", GP_DTYPE_FLOAT32, 1, I64(5));
    cany(&g, "like", GP_DTYPE_INT32, 1, I64(1), F64(0));
    node(&g, "CastLike", 2, S("x", "like"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    int32_t yl[5];
    run1(&g, (const void *[]){x}, yl);
    assert_int_equal(yl[0], -2);
    assert_int_equal(yl[3], 1);
    gp_graph_free(&g);
}

static void test_identity(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 17);
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(3, 2));
    node(&g, "Identity", 1, S("x"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    float y[6];
    const float x[6] = {1, -2, 3, -4, 5, -6};
    run1(&g, (const void *[]){x}, y);
    expect_near("Identity", y, x, 6, 0);
    check_all(&g, &checks);
    gp_graph_free(&g);

    init(&g, 17);
    input(&g, "i", GP_DTYPE_INT64, 1, I64(2));
    node(&g, "Identity", 1, S("i"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    int64_t yi[2];
    run1(&g, (const void *[]){I64(INT64_MIN, 5)}, yi);
    assert_true(yi[0] == INT64_MIN && yi[1] == 5);
    gp_graph_free(&g);
}

/* Shapes large enough that loops split across threads and rows split into
 * blocks (a row of 20000 is 4 full blocks and a partial one): values
 * against a plain loop, gradients, and bit-identical results on 1 and 4
 * threads. */
static void test_large_shapes(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 17);
    input(&g, "a", GP_DTYPE_FLOAT32, 2, I64(2, 20000));
    input(&g, "b", GP_DTYPE_FLOAT32, 1, I64(20000));
    node(&g, "Sub", 2, S("a", "b"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    float *a = malloc(sizeof(float) * 40000), *b = malloc(sizeof(float) * 20000);
    float *y = malloc(sizeof(float) * 40000), *want = malloc(sizeof(float) * 40000);
    for (int i = 0; i < 40000; i++) a[i] = (float)sin(i * 0.1);
    for (int i = 0; i < 20000; i++) b[i] = (float)cos(i * 0.7);
    for (int i = 0; i < 40000; i++) want[i] = a[i] - b[i % 20000];
    run1(&g, (const void *[]){a, b}, y);
    expect_near("large Sub", y, want, 40000, 0);
    check_all(&g, &checks);
    expect_thread_invariant(&g, false, gen);
    gp_graph_free(&g);
    free(a);
    free(b);
    free(y);
    free(want);

    init(&g, 17);
    input(&g, "a", GP_DTYPE_FLOAT32, 3, I64(3, 40, 500));
    input(&g, "den", GP_DTYPE_FLOAT32, 2, I64(40, 1));
    node(&g, "Div", 2, S("a", "den"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    check_all(&g, &checks);
    expect_thread_invariant(&g, false, gen);
    gp_graph_free(&g);

    init(&g, 17);
    input(&g, "a", GP_DTYPE_FLOAT32, 2, I64(2, 20000));
    input(&g, "b", GP_DTYPE_FLOAT32, 1, I64(20000));
    input(&g, "c", GP_DTYPE_BOOL, 2, I64(2, 1));
    node(&g, "Max", 2, S("a", "b"), 1, S("m"));
    node(&g, "Where", 3, S("c", "m", "b"), 1, S("w"));
    node(&g, "Tanh", 1, S("w"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    check_all(&g, &checks);
    expect_thread_invariant(&g, false, gen);
    gp_graph_free(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unary_forward),
        cmocka_unit_test(test_unary_gradients),
        cmocka_unit_test(test_unary_kinks_match_pytorch),
        cmocka_unit_test(test_hardswish_kinks_match_pytorch),
        cmocka_unit_test(test_unary_round_and_integers),
        cmocka_unit_test(test_binary_forward),
        cmocka_unit_test(test_binary_integers),
        cmocka_unit_test(test_binary_gradients),
        cmocka_unit_test(test_add_relu_fused),
        cmocka_unit_test(test_pow_gradients_match_pytorch),
        cmocka_unit_test(test_compare_and_logic),
        cmocka_unit_test(test_variadic),
        cmocka_unit_test(test_max_ties_go_to_first),
        cmocka_unit_test(test_where),
        cmocka_unit_test(test_expand),
        cmocka_unit_test(test_clip),
        cmocka_unit_test(test_cast),
        cmocka_unit_test(test_identity),
        cmocka_unit_test(test_large_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
