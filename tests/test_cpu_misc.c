/* CPU kernels of the softmax, reduce, dropout and resize families
 * (src/backend/cpu/softmax.c, reduce.c, dropout.c, resize.c):
 * Softmax/LogSoftmax, reductions, ArgMax/ArgMin, Dropout, Resize and
 * Upsample. Forward values against PyTorch 1.13 and ONNX's reference
 * resize (onnx 1.12's backend test generator), literals below; gradients
 * against finite differences in double precision and, at ties, zeros and
 * many-to-one scatters, against PyTorch's autograd; the float build against
 * the double build; Dropout's mask statistics and its invariance to the
 * micro-batch split. */
#include "cpu_kernel_test.h"

#include "backend/cpu/rng.h"

static const struct op_check_opts checks = {.seed = 3};

/* 2 sin(1.3 i) in float32, i = 0..23, as a [2, 3, 4] tensor. */
static const float x24[24] = {
    0,           1.92711639f,  1.03100276f,  -1.37553227f, -1.76690936f, 0.430239975f,
    1.99708664f, 0.638196707f, -1.65565288f, -1.52396715f, 0.840334058f, 1.97354388f,
    0.215507299f, -1.858248f,  -1.20966566f, 1.21107972f,  1.85759044f,  -0.217273191f,
    -1.97383106f, -0.838721812f, 1.52511692f, 1.65465581f, -0.639879942f, -1.99699008f};

/* ---- Softmax, LogSoftmax ---- */

#define NO_AXIS INT64_MIN /* the default: 1 before opset 13, -1 since */

static void build_softmax(struct gp_graph *g, const char *op, int opset, int64_t axis)
{
    init(g, opset);
    input(g, "x", GP_DTYPE_FLOAT32, 3, I64(2, 3, 4));
    int n = node(g, op, 1, S("x"), 1, S("y"));
    if (axis != NO_AXIS) attr_int(g, n, "axis", axis);
    output(g, "y");
    finalize(g);
}

static void test_softmax(void **state)
{
    (void)state;
    static const struct {
        const char *op;
        int opset;
        int64_t axis;
        float want[24];
    } cases[] = {
        {"Softmax", 13, 1, /* torch.softmax(x, 1) */
         {0.734307349f, 0.796470404f, 0.224515259f, 0.0270507f, 0.125463933f, 0.17827253f,
          0.589943945f, 0.202642217f, 0.140228719f, 0.0252570752f, 0.185540825f, 0.770307004f,
          0.101310484f, 0.0251852814f, 0.309251815f, 0.85528928f, 0.523361862f, 0.129960999f,
          0.144025519f, 0.110127427f, 0.375327706f, 0.844853699f, 0.546722651f, 0.0345832668f}},
        {"LogSoftmax", 13, -1, /* torch.log_softmax(x, -1) */
         {-2.39116859f, -0.464052111f, -1.36016572f, -3.76670074f, -4.16199255f, -1.96484327f,
          -0.397996634f, -1.7568866f, -3.95041609f, -3.81873035f, -1.45442927f, -0.321219474f,
          -1.4042455f, -3.47800088f, -2.82941842f, -0.408673048f, -0.19450222f, -2.26936579f,
          -4.02592373f, -2.8908143f, -0.825311065f, -0.695772171f, -2.99030781f, -4.34741783f}},
        {"Softmax", 11, 1, /* coerced to [2, 12]: softmax of each row */
         {0.0314292908f, 0.21590893f, 0.0881238356f, 0.00794234034f, 0.00537001574f,
          0.0483265147f, 0.231557205f, 0.0594976619f, 0.00600196794f, 0.00684674364f,
          0.0728261024f, 0.226169378f, 0.053180445f, 0.00668546371f, 0.0127881365f,
          0.143920809f, 0.274725914f, 0.0344983079f, 0.00595572265f, 0.0185313094f,
          0.197019041f, 0.224267453f, 0.0226079933f, 0.00581937889f}},
        {"LogSoftmax", 11, 0, /* coerced to [1, 24] */
         {-4.00993919f, -2.0828228f, -2.97893667f, -5.38547134f, -5.77684879f, -3.57969928f,
          -2.01285267f, -3.37174273f, -5.66559219f, -5.53390646f, -3.16960526f, -2.03639555f,
          -3.79443216f, -5.86818743f, -5.21960497f, -2.7988596f, -2.152349f, -4.22721243f,
          -5.98377037f, -4.84866142f, -2.48482227f, -2.3552835f, -4.64981937f, -6.0069294f}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        /* Cases at the default axis run again without the attribute. */
        bool is_default = cases[k].axis == (cases[k].opset < 13 ? 1 : -1);
        for (int dflt = 0; dflt <= (int)is_default; dflt++) {
            struct gp_graph g;
            build_softmax(&g, cases[k].op, cases[k].opset, dflt ? NO_AXIS : cases[k].axis);
            float y[24];
            run1(&g, (const void *[]){x24}, y);
            expect_near(cases[k].op, y, cases[k].want, 24, 2e-6);
            gp_graph_free(&g);
        }
    }
    /* Gradients along every axis, both forms, both opsets. */
    static const char *const ops[] = {"Softmax", "LogSoftmax"};
    for (int k = 0; k < 2; k++)
        for (int axis = -1; axis < 3; axis++)
            for (int opset = 11; opset <= 13; opset += 2) {
                struct gp_graph g;
                build_softmax(&g, ops[k], opset, axis);
                check_all(&g, &checks);
                gp_graph_free(&g);
            }
    /* Large inputs stay finite (the maximum is subtracted first) and keep
     * their precision: LogSoftmax is (x - max) - log(sum), not x - (max +
     * log(sum)), which rounds at 1e4's float spacing (ONNX's
     * logsoftmax_large_number). */
    struct gp_graph g;
    float big[24], y[24];
    for (int i = 0; i < 24; i++) big[i] = 10000.0f + (float)(i % 4);
    build_softmax(&g, "Softmax", 13, -1);
    run1(&g, (const void *[]){big}, y);
    expect_near("softmax of large values", y,
                F32(0.0320586041f, 0.0871443227f, 0.236882806f, 0.643914223f), 4, 1e-6);
    gp_graph_free(&g);
    build_softmax(&g, "LogSoftmax", 13, -1);
    run1(&g, (const void *[]){big}, y);
    expect_near("log_softmax of large values", y,
                F32(-3.4401896f, -2.4401896f, -1.44018972f, -0.440189689f), 4, 1e-6);
    gp_graph_free(&g);
}

/* ---- reductions ---- */

/* A reduction of x [2, 3, 4]: axes as an attribute (old opsets) or as the
 * constant input 1 (ReduceSum-13, the others since 18). n_axes < 0: none. */
static void build_reduce(struct gp_graph *g, const char *op, bool axes_input, int n_axes,
                         const int64_t *axes, int64_t keepdims, int64_t noop)
{
    bool is_sum = strcmp(op, "ReduceSum") == 0;
    init(g, axes_input ? (is_sum ? 13 : 18) : (is_sum ? 11 : 13));
    input(g, "x", GP_DTYPE_FLOAT32, 3, I64(2, 3, 4));
    int n;
    if (axes_input && n_axes >= 0) {
        ci64(g, "axes", 1, I64(n_axes), axes);
        n = node(g, op, 2, S("x", "axes"), 1, S("y"));
    } else {
        n = node(g, op, 1, S("x"), 1, S("y"));
        if (n_axes >= 0) attr_ints(g, n, "axes", n_axes, axes);
    }
    if (keepdims >= 0) attr_int(g, n, "keepdims", keepdims);
    if (noop >= 0) attr_int(g, n, "noop_with_empty_axes", noop);
    output(g, "y");
    finalize(g);
}

static void test_reductions(void **state)
{
    (void)state;
    static const struct {
        const char *op;
        int n_axes;
        int64_t axes[3];
        int64_t keepdims;
        int n;
        float want[8];
    } cases[] = {
        {"ReduceSum", 1, {1}, 1, 8, /* x.sum(1, keepdim=True) */
         {-3.42256212f, 0.833389163f, 3.86842346f, 1.23620832f, 3.59821463f, -0.420865417f,
          -3.82337666f, -1.62463212f}},
        {"ReduceMean", 2, {0, 2}, 0, 3, {-0.00734248757f, 0.0157972723f, 0.0221451074f}},
        {"ReduceMax", -1, {0}, 1, 1, {1.99708664f}},
        {"ReduceMin", 1, {-1}, 0, 6,
         {-1.37553227f, -1.76690936f, -1.65565288f, -1.858248f, -1.97383106f, -1.99699008f}},
        {"ReduceProd", 1, {2}, 0, 6,
         {0, -0.968894541f, 4.18450117f, 0.586683273f, -0.668165505f, 3.22466946f}},
        {"ReduceSumSquare", 1, {1}, 0, 8,
         {5.86315536f, 6.22136021f, 5.75748348f, 6.19425964f, 5.82306767f, 6.23817921f,
          5.76874638f, 6.1581378f}},
        {"ReduceL2", 2, {0, 1}, 0, 4, {3.41851163f, 3.52980733f, 3.39503026f, 3.51459765f}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        for (int axes_input = 0; axes_input < 2; axes_input++) {
            struct gp_graph g;
            build_reduce(&g, cases[k].op, axes_input, cases[k].n_axes, cases[k].axes,
                         cases[k].keepdims, -1);
            float y[24];
            run1(&g, (const void *[]){x24}, y);
            expect_near(cases[k].op, y, cases[k].want, cases[k].n, 2e-6);
            assert_int_equal(gp_shape_numel(&val(&g, "y")->shape), cases[k].n);
            check_all(&g, &checks);
            gp_graph_free(&g);
        }
    }
    /* noop_with_empty_axes: no axes, nothing reduced (SumSquare squares). */
    struct gp_graph g;
    build_reduce(&g, "ReduceSumSquare", true, -1, NULL, 1, 1);
    float y[24], want[24];
    run1(&g, (const void *[]){x24}, y);
    for (int i = 0; i < 24; i++) want[i] = x24[i] * x24[i];
    expect_near("noop", y, want, 24, 1e-6);
    check_all(&g, &checks);
    gp_graph_free(&g);
    /* Every kind over every single axis and over all, keepdims both ways. */
    static const char *const ops[] = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin",
                                      "ReduceProd", "ReduceSumSquare", "ReduceL2"};
    for (int k = 0; k < 7; k++)
        for (int axis = -1; axis < 3; axis++) {
            build_reduce(&g, ops[k], axis % 2 == 0, axis < 0 ? -1 : 1, (int64_t[]){axis},
                         axis == 1 ? 0 : 1, -1);
            check_all(&g, &checks);
            gp_graph_free(&g);
        }
}

/* Max splits the gradient among ties (torch.amax); Prod with zeros. */
static void test_reduction_gradients_match_pytorch(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(2, 4));
    int n = node(&g, "ReduceMax", 1, S("x"), 1, S("y"));
    attr_ints(&g, n, "axes", 1, I64(1));
    attr_int(&g, n, "keepdims", 0);
    output(&g, "y");
    finalize(&g);
    struct gp_cpu_runner *r = run_backward(&g, (const void *[]){F32(1, 5, 3, 5, 7, 7, 2, -1)},
                                           (const double *[]){F64(1, 1)}, false);
    expect_near64("amax ties", grad_of(r, &g, "x"), F64(0, 0.5, 0, 0.5, 0.5, 0.5, 0, 0), 8, 0);
    gp_cpu_runner_free_f64(r);
    gp_graph_free(&g);

    init(&g, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(3, 4));
    n = node(&g, "ReduceProd", 1, S("x"), 1, S("y"));
    attr_ints(&g, n, "axes", 1, I64(1));
    attr_int(&g, n, "keepdims", 0);
    output(&g, "y");
    finalize(&g);
    r = run_backward(&g, (const void *[]){F32(2, 0, 3, 4, 0, 5, 0, 1, 1, 2, 3, 4)},
                     (const double *[]){F64(1, 1, 2)}, false);
    expect_near64("prod zeros", grad_of(r, &g, "x"), F64(0, 24, 0, 0, 0, 0, 0, 0, 48, 24, 16, 12),
                  12, 1e-12);
    gp_cpu_runner_free_f64(r);
    gp_graph_free(&g);
}

/* ---- ArgMax, ArgMin ---- */

static void test_argmax(void **state)
{
    (void)state;
    static const struct {
        const char *op;
        int64_t axis, keepdims, last;
        int n;
        int64_t want[8];
    } cases[] = {
        {"ArgMax", 1, 1, 0, 8, {0, 0, 1, 2, 1, 2, 2, 0}}, /* x.argmax(1) */
        {"ArgMin", -1, 0, 0, 6, {3, 0, 0, 1, 2, 3}},      /* x.argmin(2) */
    };
    for (int k = 0; k < 2; k++) {
        struct gp_graph g;
        init(&g, 13);
        input(&g, "x", GP_DTYPE_FLOAT32, 3, I64(2, 3, 4));
        int n = node(&g, cases[k].op, 1, S("x"), 1, S("y"));
        attr_int(&g, n, "axis", cases[k].axis);
        attr_int(&g, n, "keepdims", cases[k].keepdims);
        output(&g, "y");
        finalize(&g);
        int64_t y[8];
        run1(&g, (const void *[]){x24}, y);
        for (int i = 0; i < cases[k].n; i++)
            if (y[i] != cases[k].want[i])
                fail_msg("%s[%d]: %lld, expected %lld", cases[k].op, i, (long long)y[i],
                         (long long)cases[k].want[i]);
        gp_graph_free(&g);
    }
    /* Ties: the first, or the last with select_last_index; int64 data. */
    for (int last = 0; last < 2; last++) {
        struct gp_graph g;
        init(&g, 13);
        input(&g, "x", GP_DTYPE_INT64, 2, I64(2, 4));
        int n = node(&g, "ArgMax", 1, S("x"), 1, S("y"));
        attr_int(&g, n, "axis", 1);
        attr_int(&g, n, "select_last_index", last);
        output(&g, "y");
        finalize(&g);
        int64_t y[2];
        run1(&g, (const void *[]){I64(1, 5, 3, 5, 7, 7, 7, -1)}, y);
        assert_int_equal(y[0], last ? 3 : 1);
        assert_int_equal(y[1], last ? 2 : 0);
        gp_graph_free(&g);
    }
}

/* ---- Dropout ---- */

/* Dropout of x [n, m] (opset 13: ratio and training_mode as inputs). */
static void build_dropout(struct gp_graph *g, int64_t n, int64_t m, float ratio, int mode)
{
    init(g, 13);
    input(g, "x", GP_DTYPE_FLOAT32, 2, (int64_t[]){n, m});
    cf32(g, "ratio", 0, NULL, (float[]){ratio});
    if (mode >= 0) cany(g, "mode", GP_DTYPE_BOOL, 0, NULL, (double[]){mode});
    node(g, "Dropout", mode >= 0 ? 3 : 2, mode >= 0 ? S("x", "ratio", "mode") : S("x", "ratio"),
         2, S("y", "mask"));
    output(g, "y");
    output(g, "mask");
    finalize(g);
}

/* Forward in the double build with the given options; y and mask copied out. */
static void run_dropout(const struct gp_graph *g, const float *x, const struct gp_run_opts *o,
                        double *y, uint8_t *mask)
{
    struct gp_error err = {0};
    struct gp_cpu_runner *r = NULL;
    if (gp_cpu_runner_create_f64(g, false, &r, &err) != GP_OK) fail_msg("%s", err.msg);
    gp_cpu_runner_set_f64(r, g->inputs[0], x);
    if (gp_cpu_runner_forward_f64(r, o, 0, g->n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);
    int64_t n = gp_shape_numel(&val(g, "y")->shape);
    memcpy(y, gp_cpu_runner_data_f64(r, gp_graph_find_value(g, "y")), sizeof(double) * (size_t)n);
    memcpy(mask, gp_cpu_runner_data_f64(r, gp_graph_find_value(g, "mask")), (size_t)n);
    gp_cpu_runner_free_f64(r);
}

static void test_dropout_masks(void **state)
{
    (void)state;
    enum { N = 64, M = 1000 };
    static float x[N * M];
    static double y[N * M];
    static uint8_t mask[N * M];
    for (int i = 0; i < N * M; i++) x[i] = (float)(i % 97) * 0.25f - 12;
    struct gp_graph g;
    build_dropout(&g, N, M, 0.3f, 1);
    struct gp_run_opts o = {.training = true, .seed = 42, .step = 7, .dropout_ratio = -1};
    run_dropout(&g, x, &o, y, mask);
    /* The mask is the counter RNG keyed by (seed, step, node, index); kept
     * elements scale by 1 / (1 - ratio) (ratio: the float32 0.3), dropped
     * ones are 0. */
    int64_t kept = 0;
    uint32_t node_id = (uint32_t)g.nodes[0].source_index;
    for (int i = 0; i < N * M; i++) {
        bool keep = gp_rng_uniform(42, 7, node_id, (uint64_t)i) >= 0.3f;
        if (mask[i] != keep) fail_msg("mask[%d] = %d", i, mask[i]);
        double want = keep ? (double)x[i] * (1.0 / (1.0 - (double)0.3f)) : 0;
        if (fabs(y[i] - want) > 1e-12 * fmax(1, fabs(want))) fail_msg("y[%d] = %g, want %g", i, y[i], want);
        kept += keep;
    }
    /* 64000 draws: the kept fraction is 0.7 within 5.5 standard deviations. */
    double frac = (double)kept / (N * M);
    if (fabs(frac - 0.7) > 0.01) fail_msg("kept fraction %g", frac);

    /* Another step draws another mask; the same step the same one. */
    static double y2[N * M];
    static uint8_t mask2[N * M];
    o.step = 8;
    run_dropout(&g, x, &o, y2, mask2);
    int64_t same = 0;
    for (int i = 0; i < N * M; i++) same += mask[i] == mask2[i];
    assert_true(same < N * M * 0.7);
    o.step = 7;
    run_dropout(&g, x, &o, y2, mask2);
    assert_memory_equal(mask, mask2, sizeof mask);
    gp_graph_free(&g);

    /* Split into two micro-batches of 32 samples (sample_offset 0 and 32):
     * the same masks as the whole mini-batch. */
    build_dropout(&g, N / 2, M, 0.3f, 1);
    for (int half = 0; half < 2; half++) {
        o.sample_offset = half * (N / 2);
        run_dropout(&g, x + half * (N / 2) * M, &o, y2, mask2);
        assert_memory_equal(mask + half * (N / 2) * M, mask2, (size_t)(N / 2) * M);
        assert_memory_equal(y + half * (N / 2) * M, y2, sizeof(double) * (N / 2) * M);
    }
    /* Without the offset the second half would differ. */
    o.sample_offset = 0;
    run_dropout(&g, x + (N / 2) * M, &o, y2, mask2);
    assert_true(memcmp(mask + (N / 2) * M, mask2, (size_t)(N / 2) * M) != 0);
    gp_graph_free(&g);
}

static void test_dropout_modes(void **state)
{
    (void)state;
    enum { N = 4, M = 50 };
    float x[N * M];
    double y[N * M];
    uint8_t mask[N * M];
    for (int i = 0; i < N * M; i++) x[i] = (float)i - 100;
    struct gp_run_opts train = {.training = true, .seed = 9, .step = 1, .dropout_ratio = -1};
    struct gp_run_opts eval = {.training = false, .seed = 9, .step = 1, .dropout_ratio = -1};
    struct {
        float ratio;
        int mode; /* training_mode input: -1 absent */
        const struct gp_run_opts *o;
        double override;
        bool active;
    } cases[] = {
        {0.5f, 1, &eval, -1, false},  /* evaluation: identity */
        {0.5f, 0, &train, -1, false}, /* training_mode false */
        {0.5f, -1, &train, -1, true}, /* absent: follows the run */
        {0.5f, 1, &train, 0, false},  /* the run's ratio 0 overrides */
        {0.0f, 1, &train, -1, false}, /* ratio 0 */
        {0.5f, 1, &train, 0.9, true}, /* the run's ratio 0.9 overrides */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        struct gp_graph g;
        build_dropout(&g, N, M, cases[k].ratio, cases[k].mode);
        struct gp_run_opts o = *cases[k].o;
        o.dropout_ratio = cases[k].override;
        run_dropout(&g, x, &o, y, mask);
        int kept = 0;
        for (int i = 0; i < N * M; i++) {
            kept += mask[i];
            if (!cases[k].active && (y[i] != x[i] || !mask[i])) fail_msg("case %zu: y[%d] = %g", k, i, y[i]);
        }
        if (cases[k].active && (kept == N * M || kept == 0)) fail_msg("case %zu: kept %d", k, kept);
        if (cases[k].override == 0.9 && kept > N * M / 4) fail_msg("ratio 0.9 kept %d", kept);
        gp_graph_free(&g);
    }
    /* Dropout-7: ratio attribute, a float mask. */
    struct gp_graph g;
    init(&g, 7);
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(N, M));
    attr_float(&g, node(&g, "Dropout", 1, S("x"), 2, S("y", "mask")), "ratio", 0.25f);
    output(&g, "y");
    output(&g, "mask");
    finalize(&g);
    float y7[N * M], m7[N * M];
    op_forward_f32(&g, (const void *[]){x}, (void *[]){y7, m7}, true);
    int kept = 0;
    for (int i = 0; i < N * M; i++) {
        assert_true(m7[i] == 0 || m7[i] == 1);
        kept += m7[i] == 1;
        assert_true(y7[i] == (m7[i] == 1 ? x[i] * (float)(1 / 0.75) : 0));
    }
    assert_true(kept > 0 && kept < N * M);
    gp_graph_free(&g);
}

/* Training-mode gradients with a fixed key are deterministic: backward
 * draws the forward's mask again. */
static void test_dropout_gradients(void **state)
{
    (void)state;
    struct gp_graph g;
    build_dropout(&g, 3, 7, 0.4f, 1);
    struct op_check_opts o = checks;
    o.training = true;
    check_all(&g, &o);
    o.training = false;
    check_all(&g, &o);
    gp_graph_free(&g);
}

/* ---- Resize, Upsample ---- */

/* 0.5 (i + 1) + sin(i), i = 0..15, as [1, 1, 4, 4]. */
static const float img[16] = {0.5f, 1.84147096f, 2.40929747f, 2.14111996f, 1.74319744f,
                              2.04107571f, 3.22058439f, 4.65698671f, 5.48935843f, 5.41211843f,
                              4.95597887f, 5.00000954f, 5.96342707f, 7.42016697f, 8.49060726f,
                              8.65028763f};

static const float nearest_x2[64] = {
    0.5f, 0.5f, 1.84147096f, 1.84147096f, 2.40929747f, 2.40929747f, 2.14111996f, 2.14111996f,
    0.5f, 0.5f, 1.84147096f, 1.84147096f, 2.40929747f, 2.40929747f, 2.14111996f, 2.14111996f,
    1.74319744f, 1.74319744f, 2.04107571f, 2.04107571f, 3.22058439f, 3.22058439f, 4.65698671f,
    4.65698671f, 1.74319744f, 1.74319744f, 2.04107571f, 2.04107571f, 3.22058439f, 3.22058439f,
    4.65698671f, 4.65698671f, 5.48935843f, 5.48935843f, 5.41211843f, 5.41211843f, 4.95597887f,
    4.95597887f, 5.00000954f, 5.00000954f, 5.48935843f, 5.48935843f, 5.41211843f, 5.41211843f,
    4.95597887f, 4.95597887f, 5.00000954f, 5.00000954f, 5.96342707f, 5.96342707f, 7.42016697f,
    7.42016697f, 8.49060726f, 8.49060726f, 8.65028763f, 8.65028763f, 5.96342707f, 5.96342707f,
    7.42016697f, 7.42016697f, 8.49060726f, 8.49060726f, 8.65028763f, 8.65028763f};

/* Resize-13 of x [1, 1, 4, 4] by scales (n_sizes 0) or to sizes. */
static void build_resize(struct gp_graph *g, int opset, const char *mode, const char *coords,
                         const char *nearest, const float *scales, const int64_t *sizes,
                         const float *roi)
{
    init(g, opset);
    input(g, "x", GP_DTYPE_FLOAT32, 4, I64(1, 1, 4, 4));
    if (roi) cf32(g, "roi", 1, I64(8), roi);
    if (scales) cf32(g, "scales", 1, I64(4), scales);
    if (sizes) ci64(g, "sizes", 1, I64(4), sizes);
    int n = node(g, "Resize", sizes ? 4 : 3,
                 sizes ? S("x", roi ? "roi" : "", "", "sizes") : S("x", roi ? "roi" : "", "scales"),
                 1, S("y"));
    attr_str(g, n, "mode", mode);
    if (coords) attr_str(g, n, "coordinate_transformation_mode", coords);
    if (nearest) attr_str(g, n, "nearest_mode", nearest);
    if (roi) attr_float(g, n, "extrapolation_value", 10.0f);
    output(g, "y");
    finalize(g);
}

static void test_resize_nearest(void **state)
{
    (void)state;
    /* What nn.Upsample(scale_factor=2) exports: asymmetric + floor. */
    struct gp_graph g;
    float y[64];
    build_resize(&g, 13, "nearest", "asymmetric", "floor", F32(1, 1, 2, 2), NULL, NULL);
    run1(&g, (const void *[]){img}, y);
    expect_near("torch nearest x2", y, nearest_x2, 64, 0);
    /* dX sums each 2x2 block of dY (torch: dY = 0..63). */
    double dy[64];
    for (int i = 0; i < 64; i++) dy[i] = i;
    struct gp_cpu_runner *r = run_backward(&g, (const void *[]){img}, (const double *[]){dy}, false);
    expect_near64("nearest grad", grad_of(r, &g, "x"),
                  F64(18, 26, 34, 42, 82, 90, 98, 106, 146, 154, 162, 170, 210, 218, 226, 234), 16, 0);
    gp_cpu_runner_free_f64(r);
    check_all(&g, &checks);
    gp_graph_free(&g);

    /* Every nearest_mode with three coordinate transformations, to sizes
     * [3, 7] (scales 0.75 and 1.75), against ONNX's reference resize. */
    static const struct {
        const char *nearest, *coords;
        float want[21];
    } cases[] = {
        {"round_prefer_floor", "half_pixel", {0.5f, 0.5f, 1.84147096f, 1.84147096f, 2.40929747f, 2.14111996f, 2.14111996f, 1.74319744f, 1.74319744f, 2.04107571f, 2.04107571f, 3.22058439f, 4.65698671f, 4.65698671f, 5.96342707f, 5.96342707f, 7.42016697f, 7.42016697f, 8.49060726f, 8.65028763f, 8.65028763f}},
        {"round_prefer_floor", "asymmetric", {0.5f, 1.84147096f, 1.84147096f, 2.40929747f, 2.40929747f, 2.14111996f, 2.14111996f, 1.74319744f, 2.04107571f, 2.04107571f, 3.22058439f, 3.22058439f, 4.65698671f, 4.65698671f, 5.96342707f, 7.42016697f, 7.42016697f, 8.49060726f, 8.49060726f, 8.65028763f, 8.65028763f}},
        {"round_prefer_floor", "align_corners", {0.5f, 0.5f, 1.84147096f, 1.84147096f, 2.40929747f, 2.40929747f, 2.14111996f, 1.74319744f, 1.74319744f, 2.04107571f, 2.04107571f, 3.22058439f, 3.22058439f, 4.65698671f, 5.96342707f, 5.96342707f, 7.42016697f, 7.42016697f, 8.49060726f, 8.49060726f, 8.65028763f}},
        {"round_prefer_ceil", "half_pixel", {0.5f, 0.5f, 1.84147096f, 2.40929747f, 2.40929747f, 2.14111996f, 2.14111996f, 5.48935843f, 5.48935843f, 5.41211843f, 4.95597887f, 4.95597887f, 5.00000954f, 5.00000954f, 5.96342707f, 5.96342707f, 7.42016697f, 8.49060726f, 8.49060726f, 8.65028763f, 8.65028763f}},
        {"round_prefer_ceil", "asymmetric", {0.5f, 1.84147096f, 1.84147096f, 2.40929747f, 2.40929747f, 2.14111996f, 2.14111996f, 1.74319744f, 2.04107571f, 2.04107571f, 3.22058439f, 3.22058439f, 4.65698671f, 4.65698671f, 5.96342707f, 7.42016697f, 7.42016697f, 8.49060726f, 8.49060726f, 8.65028763f, 8.65028763f}},
        {"round_prefer_ceil", "align_corners", {0.5f, 1.84147096f, 1.84147096f, 2.40929747f, 2.40929747f, 2.14111996f, 2.14111996f, 5.48935843f, 5.41211843f, 5.41211843f, 4.95597887f, 4.95597887f, 5.00000954f, 5.00000954f, 5.96342707f, 7.42016697f, 7.42016697f, 8.49060726f, 8.49060726f, 8.65028763f, 8.65028763f}},
        {"floor", "half_pixel", {0.5f, 0.5f, 0.5f, 1.84147096f, 2.40929747f, 2.40929747f, 2.14111996f, 1.74319744f, 1.74319744f, 1.74319744f, 2.04107571f, 3.22058439f, 3.22058439f, 4.65698671f, 5.48935843f, 5.48935843f, 5.48935843f, 5.41211843f, 4.95597887f, 4.95597887f, 5.00000954f}},
        {"floor", "asymmetric", {0.5f, 0.5f, 1.84147096f, 1.84147096f, 2.40929747f, 2.40929747f, 2.14111996f, 1.74319744f, 1.74319744f, 2.04107571f, 2.04107571f, 3.22058439f, 3.22058439f, 4.65698671f, 5.48935843f, 5.48935843f, 5.41211843f, 5.41211843f, 4.95597887f, 4.95597887f, 5.00000954f}},
        {"floor", "align_corners", {0.5f, 0.5f, 1.84147096f, 1.84147096f, 2.40929747f, 2.40929747f, 2.14111996f, 1.74319744f, 1.74319744f, 2.04107571f, 2.04107571f, 3.22058439f, 3.22058439f, 4.65698671f, 5.96342707f, 5.96342707f, 7.42016697f, 7.42016697f, 8.49060726f, 8.49060726f, 8.65028763f}},
        {"ceil", "half_pixel", {1.74319744f, 2.04107571f, 2.04107571f, 3.22058439f, 4.65698671f, 4.65698671f, 4.65698671f, 5.48935843f, 5.41211843f, 5.41211843f, 4.95597887f, 5.00000954f, 5.00000954f, 5.00000954f, 5.96342707f, 7.42016697f, 7.42016697f, 8.49060726f, 8.65028763f, 8.65028763f, 8.65028763f}},
        {"ceil", "asymmetric", {0.5f, 1.84147096f, 2.40929747f, 2.40929747f, 2.14111996f, 2.14111996f, 2.14111996f, 5.48935843f, 5.41211843f, 4.95597887f, 4.95597887f, 5.00000954f, 5.00000954f, 5.00000954f, 5.96342707f, 7.42016697f, 8.49060726f, 8.49060726f, 8.65028763f, 8.65028763f, 8.65028763f}},
        {"ceil", "align_corners", {0.5f, 1.84147096f, 1.84147096f, 2.40929747f, 2.40929747f, 2.14111996f, 2.14111996f, 5.48935843f, 5.41211843f, 5.41211843f, 4.95597887f, 4.95597887f, 5.00000954f, 5.00000954f, 5.96342707f, 7.42016697f, 7.42016697f, 8.49060726f, 8.49060726f, 8.65028763f, 8.65028763f}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        build_resize(&g, 13, "nearest", cases[k].coords, cases[k].nearest, NULL, I64(1, 1, 3, 7),
                     NULL);
        run1(&g, (const void *[]){img}, y);
        char what[64];
        snprintf(what, sizeof what, "%s %s", cases[k].nearest, cases[k].coords);
        expect_near(what, y, cases[k].want, 21, 0);
        check_all(&g, &checks);
        gp_graph_free(&g);
    }

    /* Upsample-7 (attribute), Upsample-9 and Resize-10 (scales input). */
    for (int v = 0; v < 3; v++) {
        init(&g, v == 0 ? 7 : v == 1 ? 9 : 10);
        input(&g, "x", GP_DTYPE_FLOAT32, 4, I64(1, 1, 4, 4));
        int n;
        if (v == 0) {
            n = node(&g, "Upsample", 1, S("x"), 1, S("y"));
            attr_floats(&g, n, "scales", 4, F32(1, 1, 2, 2));
        } else {
            cf32(&g, "scales", 1, I64(4), F32(1, 1, 2, 2));
            n = node(&g, v == 1 ? "Upsample" : "Resize", 2, S("x", "scales"), 1, S("y"));
        }
        attr_str(&g, n, "mode", "nearest");
        output(&g, "y");
        finalize(&g);
        run1(&g, (const void *[]){img}, y);
        expect_near("Upsample / Resize-10", y, nearest_x2, 64, 0);
        check_all(&g, &checks);
        gp_graph_free(&g);
    }
}

static void test_resize_linear(void **state)
{
    (void)state;
    struct gp_graph g;
    float y[64];
    /* F.interpolate(scale_factor=2, mode='bilinear', align_corners=False). */
    build_resize(&g, 13, "linear", "half_pixel", NULL, F32(1, 1, 2, 2), NULL, NULL);
    run1(&g, (const void *[]){img}, y);
    expect_near("bilinear x2", y,
                F32(0.5f, 0.835367739f, 1.50610328f, 1.98342752f, 2.2673409f, 2.34225321f,
                    2.20816422f, 2.14111996f, 0.81079936f, 1.08094251f, 1.62122893f, 2.07155895f,
                    2.43193245f, 2.65161109f, 2.73059487f, 2.77008677f, 1.43239808f, 1.57209218f,
                    1.85148036f, 2.24782157f, 2.76111555f, 3.27032709f, 3.77545571f, 4.02801991f,
                    2.67973757f, 2.73076248f, 2.83281183f, 3.07648563f, 3.46178389f, 3.92651033f,
                    4.47066498f, 4.74274254f, 4.5528183f, 4.55695295f, 4.56522274f, 4.55755091f,
                    4.53393698f, 4.62016106f, 4.81622314f, 4.91425371f, 5.60787582f, 5.68443918f,
                    5.83756685f, 5.89550686f, 5.85825968f, 5.85787153f, 5.89434338f, 5.91257906f,
                    5.84490967f, 6.11322117f, 6.64984369f, 7.09035349f, 7.43475151f, 7.63964224f,
                    7.70502615f, 7.73771811f, 5.96342707f, 6.32761192f, 7.05598211f, 7.68777704f,
                    8.22299767f, 8.53052711f, 8.61036777f, 8.65028763f), 64, 2e-6);
    check_all(&g, &checks);
    gp_graph_free(&g);

    /* To size [3, 6]: align_corners=True, and False with its gradient
     * (torch, dY = 0..17). */
    build_resize(&g, 13, "linear", "align_corners", NULL, NULL, I64(1, 1, 3, 6), NULL);
    run1(&g, (const void *[]){img}, y);
    expect_near("bilinear align_corners", y,
                F32(0.5f, 1.30488265f, 1.95503628f, 2.29573226f, 2.30202651f, 2.14111996f,
                    3.61627793f, 3.68246937f, 3.79893398f, 4.01594496f, 4.38436842f, 4.82849789f,
                    5.96342707f, 6.83747101f, 7.63425493f, 8.27651882f, 8.5544796f, 8.65028763f),
                18, 2e-6);
    check_all(&g, &checks);
    gp_graph_free(&g);
    build_resize(&g, 13, "linear", "pytorch_half_pixel", NULL, NULL, I64(1, 1, 3, 6), NULL);
    run1(&g, (const void *[]){img}, y);
    expect_near("bilinear to size", y,
                F32(0.707199574f, 1.29096901f, 1.98636734f, 2.43288302f, 2.55247164f, 2.56043124f,
                    3.61627817f, 3.67143774f, 3.78687787f, 4.02800083f, 4.45839024f, 4.82849836f,
                    5.88441563f, 6.48495388f, 7.2214942f, 7.76550102f, 7.97170544f, 8.04190826f),
                18, 2e-6);
    double dy[18];
    for (int i = 0; i < 18; i++) dy[i] = i;
    struct gp_cpu_runner *r = run_backward(&g, (const void *[]){img}, (const double *[]){dy}, false);
    expect_near64("bilinear grad", grad_of(r, &g, "x"),
                  F64(0.416666657, 2.22222185, 4.02777767, 5.83333349, 4.83333302, 6.27777624,
                      7.7222209, 9.16666603, 7.83333158, 9.27777576, 10.7222204, 12.166667,
                      15.4166679, 17.2222233, 19.0277786, 20.8333378), 16, 1e-6);
    gp_cpu_runner_free_f64(r);
    check_all(&g, &checks);
    gp_graph_free(&g);

    /* Down on one axis, up on the other (scales 0.6, 1.7), ONNX reference. */
    build_resize(&g, 13, "linear", "half_pixel", NULL, F32(1, 1, 0.6f, 1.7f), NULL, NULL);
    run1(&g, (const void *[]){img}, y);
    expect_near("linear 0.6 x 1.7", y,
                F32(0.914399147f, 1.2943076f, 1.87878215f, 2.33926149f, 2.72384641f, 2.90032627f,
                    5.48935843f, 5.45982549f, 5.4143902f, 5.15721691f, 4.96245397f, 4.98835436f),
                12, 2e-6);
    check_all(&g, &checks);
    gp_graph_free(&g);

    /* tf_crop_and_resize: inside the roi, and partly outside
     * (extrapolation_value 10), linear and nearest. */
    static const struct {
        const char *mode;
        float roi[8];
        float want[9];
    } crops[] = {
        {"linear", {0, 0, 0.4f, 0.6f, 1, 1, 0.6f, 0.8f},
         {3.39718748f, 3.68345609f, 4.03083448f, 4.01594472f, 4.16230328f, 4.38436823f,
          4.63470196f, 4.64115047f, 4.73790197f}},
        {"linear", {0, 0, 0.2f, 0.5f, 1, 1, 0.9f, 1.3f},
         {2.42865171f, 3.42426889f, 10, 4.29042214f, 4.72054332f, 10, 7.12398558f, 7.51770856f, 10}},
        {"nearest", {0, 0, 0.2f, 0.5f, 1, 1, 0.9f, 1.3f},
         {2.04107571f, 4.65698671f, 10, 5.41211843f, 5.00000954f, 10, 7.42016697f, 8.65028763f, 10}},
    };
    for (int k = 0; k < 3; k++) {
        build_resize(&g, 13, crops[k].mode, "tf_crop_and_resize", NULL, NULL, I64(1, 1, 3, 3),
                     crops[k].roi);
        run1(&g, (const void *[]){img}, y);
        expect_near("crop", y, crops[k].want, 9, 2e-6);
        check_all(&g, &checks);
        gp_graph_free(&g);
    }
}

/* The transformations the reference generator lacks, from the spec's
 * formulas (double precision): half_pixel_symmetric (Resize-19), linear;
 * tf_half_pixel_for_nn (Resize-11), nearest. Width 4 -> floor(4 * 1.7). */
static void test_resize_other_coords(void **state)
{
    (void)state;
    struct gp_graph g;
    float y[24];
    build_resize(&g, 19, "linear", "half_pixel_symmetric", NULL, F32(1, 1, 1, 1.7f), NULL, NULL);
    run1(&g, (const void *[]){img}, y);
    expect_near("half_pixel_symmetric", y,
                F32(0.539455028f, 1.32855559f, 1.95837641f, 2.29239201f, 2.30675901f, 2.14900753f,
                    1.75195857f, 1.92718108f, 2.28391573f, 2.97774437f, 3.76979704f, 4.61473959f,
                    5.48708666f, 5.44165137f, 5.31820735f, 5.04988996f, 4.97281413f, 4.99871452f,
                    6.00627236f, 6.86317818f, 7.64055174f, 8.2702225f, 8.55166152f, 8.64559115f),
                24, 2e-6);
    check_all(&g, &checks);
    gp_graph_free(&g);

    /* pytorch_half_pixel maps a length-1 output to position 0 (half_pixel
     * would read between rows 1 and 2). */
    build_resize(&g, 13, "linear", "pytorch_half_pixel", NULL, NULL, I64(1, 1, 1, 4), NULL);
    run1(&g, (const void *[]){img}, y);
    expect_near("pytorch_half_pixel to 1", y, img, 4, 0);
    gp_graph_free(&g);

    init(&g, 11);
    input(&g, "x", GP_DTYPE_FLOAT32, 4, I64(1, 1, 4, 4));
    cf32(&g, "roi", 1, I64(0), F32(0)); /* empty: required before opset 13, unused */
    cf32(&g, "scales", 1, I64(4), F32(1, 1, 1, 1.7f));
    int n = node(&g, "Resize", 3, S("x", "roi", "scales"), 1, S("y"));
    attr_str(&g, n, "mode", "nearest");
    attr_str(&g, n, "coordinate_transformation_mode", "tf_half_pixel_for_nn");
    output(&g, "y");
    finalize(&g);
    run1(&g, (const void *[]){img}, y);
    expect_near("tf_half_pixel_for_nn", y,
                F32(0.5f, 1.84147096f, 1.84147096f, 2.40929747f, 2.14111996f, 2.14111996f,
                    1.74319744f, 2.04107571f, 2.04107571f, 3.22058439f, 4.65698671f, 4.65698671f,
                    5.48935843f, 5.41211843f, 5.41211843f, 4.95597887f, 5.00000954f, 5.00000954f,
                    5.96342707f, 7.42016697f, 7.42016697f, 8.49060726f, 8.65028763f, 8.65028763f),
                24, 0);
    check_all(&g, &checks);
    gp_graph_free(&g);
}

/* Resize-18: sizes for the listed axes only, one scale for both that keeps
 * the aspect ratio (0.75 for not_larger, 1.5 for not_smaller of sizes
 * [3, 6] over [4, 4]); ONNX's reference resize at those scales. */
static void test_resize_aspect_ratio(void **state)
{
    (void)state;
    static const struct {
        const char *policy;
        int64_t out;
        float want[36];
    } cases[] = {
        {"not_larger", 3, {0.90178938f, 2.20962518f, 2.55777789f, 3.63466446f, 3.90743935f, 4.70512871f, 6.08459506f, 7.49349737f, 8.01850704f}},
        {"not_smaller", 6, {0.5f, 1.17073548f, 1.93610871f, 2.31465971f, 2.27520871f, 2.14111996f, 1.12159872f, 1.53143603f, 2.0868846f, 2.66932966f, 3.10699713f, 3.39905334f, 2.36755761f, 2.48523688f, 2.75406627f, 3.3586667f, 4.11198699f, 4.71415718f, 4.86499826f, 4.85763812f, 4.81968939f, 4.69733504f, 4.80479276f, 4.94283907f, 5.72639275f, 6.07126772f, 6.46733443f, 6.67210134f, 6.77422082f, 6.82514858f, 5.96342707f, 6.69179702f, 7.59857368f, 8.31220055f, 8.57044744f, 8.65028763f}},
    };
    for (int k = 0; k < 2; k++) {
        struct gp_graph g;
        init(&g, 18);
        input(&g, "x", GP_DTYPE_FLOAT32, 4, I64(1, 1, 4, 4));
        ci64(&g, "sizes", 1, I64(2), I64(3, 6));
        int n = node(&g, "Resize", 4, S("x", "", "", "sizes"), 1, S("y"));
        attr_str(&g, n, "mode", "linear");
        attr_ints(&g, n, "axes", 2, I64(2, 3));
        attr_str(&g, n, "keep_aspect_ratio_policy", cases[k].policy);
        output(&g, "y");
        finalize(&g);
        assert_int_equal(val(&g, "y")->shape.dims[2], cases[k].out);
        assert_int_equal(val(&g, "y")->shape.dims[3], cases[k].out);
        float y[36];
        run1(&g, (const void *[]){img}, y);
        expect_near(cases[k].policy, y, cases[k].want, cases[k].out * cases[k].out, 2e-6);
        check_all(&g, &checks);
        gp_graph_free(&g);
    }
    /* [2, 4] to not smaller than [1, 3]: scale max(1/2, 3/4) = 0.75 gives
     * [round(1.5) = 2, 3], and the coordinates use 0.75 on both axes, not
     * 2/2 (ONNX's resize_downsample_sizes_nearest_not_smaller). */
    struct gp_graph g;
    init(&g, 18);
    input(&g, "x", GP_DTYPE_FLOAT32, 4, I64(1, 1, 2, 4));
    ci64(&g, "sizes", 1, I64(2), I64(1, 3));
    int n = node(&g, "Resize", 4, S("x", "", "", "sizes"), 1, S("y"));
    attr_ints(&g, n, "axes", 2, I64(2, 3));
    attr_str(&g, n, "keep_aspect_ratio_policy", "not_smaller");
    output(&g, "y");
    finalize(&g);
    float y[12];
    run1(&g, (const void *[]){F32(1, 2, 3, 4, 5, 6, 7, 8)}, y);
    expect_near("not_smaller [2, 4]", y, F32(1, 2, 4, 5, 6, 8), 6, 0);
    gp_graph_free(&g);

    /* [4, 5] to not larger than [3, 6]: scale min(3/4, 6/5) = 0.75 gives
     * [3, round(3.75) = 4], and the coordinates use 0.75 on both axes, not
     * 4/5 (the reference evaluated at scale 0.75 on the [3, 4] grid). */
    init(&g, 18);
    input(&g, "x", GP_DTYPE_FLOAT32, 4, I64(1, 1, 4, 5));
    ci64(&g, "sizes", 1, I64(2), I64(3, 6));
    n = node(&g, "Resize", 4, S("x", "", "", "sizes"), 1, S("y"));
    attr_str(&g, n, "mode", "linear");
    attr_ints(&g, n, "axes", 2, I64(2, 3));
    attr_str(&g, n, "keep_aspect_ratio_policy", "not_larger");
    output(&g, "y");
    finalize(&g);
    assert_int_equal(val(&g, "y")->shape.dims[3], 4);
    run1(&g, (const void *[]){F32(0.5f, 1.84147096f, 2.40929747f, 2.14111996f, 1.74319744f, 2.04107571f, 3.22058439f, 4.65698671f, 5.48935843f, 5.41211843f, 4.95597887f, 5.00000954f, 5.96342707f, 7.42016697f, 8.49060726f, 8.65028763f, 8.21209717f, 8.03860283f, 8.74901295f, 10.1498775f)}, y);
    expect_near("not_larger [4, 5]", y,
                F32(0.975925492f, 2.42761777f, 2.71328514f, 2.35468427f, 3.6004889f, 4.71025193f,
                    6.2640034f, 6.95136285f, 7.97493279f, 7.68474472f, 8.38840555f, 9.8733325f),
                12, 2e-6);
    gp_graph_free(&g);
}

/* Batch and channel axes are not resized: each [H, W] plane on its own. */
static void test_resize_batched(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 4, I64(2, 3, 4, 5));
    cf32(&g, "scales", 1, I64(4), F32(1, 1, 1.5f, 2));
    attr_str(&g, node(&g, "Resize", 3, S("x", "", "scales"), 1, S("y")), "mode", "linear");
    output(&g, "y");
    finalize(&g);
    check_all(&g, &checks);
    gp_graph_free(&g);

    /* Cubic is refused by name. */
    init(&g, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 4, I64(1, 1, 4, 4));
    cf32(&g, "scales", 1, I64(4), F32(1, 1, 2, 2));
    attr_str(&g, node(&g, "Resize", 3, S("x", "", "scales"), 1, S("y")), "mode", "cubic");
    output(&g, "y");
    finalize(&g);
    struct gp_error err = {0};
    struct gp_cpu_runner *r = NULL;
    assert_int_equal(gp_cpu_runner_create_f64(&g, false, &r, &err), GP_OK);
    struct gp_run_opts o = {.dropout_ratio = -1};
    assert_int_equal(gp_cpu_runner_forward_f64(r, &o, 0, g.n_nodes, &err),
                     GP_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "mode 'cubic'"));
    gp_cpu_runner_free_f64(r);
    gp_graph_free(&g);
}

/* Shapes large enough that loops split across threads: gradients, and
 * bit-identical results on 1 and 4 threads. */
static void test_large_shapes(void **state)
{
    (void)state;
    struct gp_graph g;
    init(&g, 18);
    input(&g, "x", GP_DTYPE_FLOAT32, 2, I64(64, 600));
    ci64(&g, "ax0", 1, I64(1), I64(0));
    attr_int(&g, node(&g, "Softmax", 1, S("x"), 1, S("s1")), "axis", 1);
    attr_int(&g, node(&g, "LogSoftmax", 1, S("x"), 1, S("s0")), "axis", 0);
    node(&g, "ReduceMean", 2, S("s0", "ax0"), 1, S("r0")); /* keeps the loss small */
    node(&g, "ReduceMean", 1, S("x"), 1, S("rmean"));
    node(&g, "ReduceL2", 2, S("s1", "ax0"), 1, S("r1"));
    output(&g, "s1");
    output(&g, "r0");
    output(&g, "rmean");
    output(&g, "r1");
    finalize(&g);
    check_all(&g, &checks);
    expect_thread_invariant(&g, false, NULL);
    gp_graph_free(&g);

    init(&g, 13);
    input(&g, "x", GP_DTYPE_FLOAT32, 4, I64(2, 4, 64, 64));
    cf32(&g, "scales", 1, I64(4), F32(1, 1, 2, 1.5f));
    cf32(&g, "ratio", 0, NULL, F32(0.2f));
    attr_str(&g, node(&g, "Resize", 3, S("x", "", "scales"), 1, S("r")), "mode", "linear");
    node(&g, "Dropout", 2, S("r", "ratio"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    struct op_check_opts o = checks;
    o.training = true;
    check_all(&g, &o);
    expect_thread_invariant(&g, true, NULL);
    gp_graph_free(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_reductions),
        cmocka_unit_test(test_reduction_gradients_match_pytorch),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_dropout_masks),
        cmocka_unit_test(test_dropout_modes),
        cmocka_unit_test(test_dropout_gradients),
        cmocka_unit_test(test_resize_nearest),
        cmocka_unit_test(test_resize_linear),
        cmocka_unit_test(test_resize_other_coords),
        cmocka_unit_test(test_resize_aspect_ratio),
        cmocka_unit_test(test_resize_batched),
        cmocka_unit_test(test_large_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
