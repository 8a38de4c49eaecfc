/* The CUDA elementwise and binary kernels (cuda/elementwise.cu, binary.cu)
 * against the CPU float kernels, the reference: one-node graphs through
 * op_compare (every output, every input gradient, gradients accumulated
 * onto random starting values).
 *
 * Covered: every unary op (float; Relu/Neg/Abs/Sign/Erf on int64 and
 * int32, Not on bool; Gelu in both modes, Elu / LeakyRelu / HardSigmoid
 * with and without their attributes; halves for Round, zeros for Sign and
 * Relu's kink, NaN); Clip (Clip-6 attributes and defaults, Clip-13 bounds
 * as inputs, either omitted, lo > hi, inputs on the bounds, int64); Cast
 * and CastLike between float32, int64, int32 and bool (saturation, NaN,
 * wrapping); Identity; binary Add/Sub/Mul/Div/Pow (float and integer
 * exponents) on broadcast shapes, scalars and shapes whose broadcast input
 * takes the two-level reduction (a bias of [16384, 768]), row vectors
 * (GPT-2's [16, 1024, 2304] + [2304], [M, N] with [1, N] on either side,
 * Sub's negated terms, Mul/Div, a fused Relu, N not a multiple of 8); Mod (fmod on
 * floats, both signs conventions on integers), comparisons on floats and
 * int64, And/Or/Xor and Equal on bool, integer arithmetic and Pow with a
 * float exponent on an integer base; Max/Min/Sum/Mean over one to three
 * broadcast inputs with ties and NaN (the first maximum gets the
 * gradient), integer Max/Min; Where (broadcast condition and values, any
 * dtype); Expand. Shapes of more than 2^20 elements make the grid-stride
 * loops go round. Gelu at GPT-2's [16, 1024, 3072] in both forms, float32
 * and bfloat16, its gradient accumulated and written whole (first writer).
 *
 * bfloat16 (the kernels read and write it themselves, bf16_any): the
 * unary, Clip, Cast/CastLike/Identity, binary (float and integer), Where
 * and Expand cases again with bfloat16 storage (op_compare.h): every
 * float tensor bfloat16; and the mixes the executor makes: an input that
 * is a float32 parameter (float32 storage and gradient: a bias added to a
 * bfloat16 activation, broadcast and summed back, on either side), a
 * bfloat16 input with a float32 gradient, a float32 output; float
 * initializers (scalar operands, Clip's bounds, Where's constant branch)
 * are float32 with float32 gradients throughout, as in the executor.
 * Max/Min/Sum/Mean stay staged and are not run in bfloat16.
 *
 * Also: kernel lookup, launch errors naming the node, and backward with
 * absent gradients.
 *
 * Without a CUDA device the test prints why and exits 77 (a skip). */

#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda/cuda_test_util.h"
#include "backend/cuda/kernel.h"
#include "cuda/op_compare.h"
#include "kernel_graph.h"

/* test_kernels.cu: a launch with zero blocks, left unchecked. */
void gp_test_bad_launch(cudaStream_t s);

#define I64(...) ((const int64_t[]){__VA_ARGS__})

/* ---- data ---- */

static float randf(float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(next_u64() >> 13) * (1.0 / 1099511627776.0));
}

static float *floats(int64_t n, float lo, float hi)
{
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++) v[i] = randf(lo, hi);
    return v;
}

/* Values on a grid of `levels` steps of 0.5 from lo: ties and equalities. */
static float *grid_floats(int64_t n, float lo, int levels)
{
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++) v[i] = lo + 0.5f * (float)(next_u64() % (uint64_t)levels);
    return v;
}

/* n elements of dtype dt, random: floats in [lo, hi), integers in
 * [lo, hi], bools. */
static void *data_of(enum gp_dtype dt, int64_t n, float lo, float hi)
{
    switch (dt) {
    case GP_DTYPE_INT64: return ints64(n, (int64_t)lo, (int64_t)hi);
    case GP_DTYPE_INT32: return ints32(n, (int32_t)lo, (int32_t)hi);
    case GP_DTYPE_BOOL: return bools(n, 3);
    default: return floats(n, lo, hi);
    }
}

/* ---- graph helpers ---- */

struct tshape {
    int rank;
    int64_t dims[5];
};

#define SH(r, ...) ((struct tshape){r, {__VA_ARGS__}})

static int64_t numel_sh(struct tshape s)
{
    int64_t n = 1;
    for (int i = 0; i < s.rank; i++) n *= s.dims[i];
    return n;
}

static void cf32(struct gp_graph *g, const char *name, float v);

/* A graph input; a scalar (a graph input needs a batch axis) is an
 * initializer of value 1.25 instead, whose data the harness uses. */
static void input_t(struct gp_graph *g, const char *name, enum gp_dtype dt, struct tshape sh)
{
    struct gp_error err = {0};
    if (sh.rank == 0 && dt == GP_DTYPE_FLOAT32) {
        cf32(g, name, 1.25f);
        return;
    }
    if (sh.rank == 0) fail_msg("%s: scalar %s inputs are not supported here", name, gp_dtype_name(dt));
    struct gp_shape s = {.rank = sh.rank};
    for (int i = 0; i < sh.rank; i++) s.dims[i] = sh.dims[i];
    if (gp_graph_add_input(g, name, dt, &s, &err) != GP_OK) fail_msg("%s: %s", name, err.msg);
}

static void ci64(struct gp_graph *g, const char *name, int rank, const int64_t *dims, const int64_t *v)
{
    struct gp_error err = {0};
    struct gp_shape s = {.rank = rank};
    for (int i = 0; i < rank; i++) s.dims[i] = dims[i];
    if (gp_graph_add_const_i64(g, name, &s, v, &err) != GP_OK) fail_msg("%s", err.msg);
}

static void cf32(struct gp_graph *g, const char *name, float v)
{
    struct gp_error err = {0};
    struct gp_shape s = {.rank = 0};
    if (gp_graph_add_const_f32(g, name, &s, &v, &err) != GP_OK) fail_msg("%s", err.msg);
}

static char *shape_text(struct tshape s, char *buf, size_t size)
{
    int at = snprintf(buf, size, "[");
    for (int i = 0; i < s.rank; i++) at += snprintf(buf + at, size - (size_t)at, i ? ",%lld" : "%lld", (long long)s.dims[i]);
    snprintf(buf + at, size - (size_t)at, "]");
    return buf;
}

/* Set by the bf16 tests: every case compared with bfloat16 storage, and
 * the inputs (bit k) whose gradients are float32 (params), the inputs and
 * outputs stored as float32 (op_compare.h). */
static struct {
    bool on;
    uint32_t params, f32_inputs, f32_outputs;
} b16;

#define IN(k) (1u << (k))
#define OUT(k) (1u << (k))

static void bf16_set(uint32_t params, uint32_t f32_inputs, uint32_t f32_outputs)
{
    b16.on = true;
    b16.params = params;
    b16.f32_inputs = f32_inputs;
    b16.f32_outputs = f32_outputs;
}

static void bf16_off(void) { memset(&b16, 0, sizeof b16); }

/* Finalizes g, which must keep exactly the node under test, and compares
 * it (in bf16 mode with b16's storage; float initializers float32, with
 * float32 gradients, as the executor keeps them). */
static void compare(struct gp_graph *g, struct op_compare o)
{
    finalize_ok(g);
    if (g->n_nodes != 1) fail_msg("%s: the graph has %d nodes after loading, not 1", o.label, g->n_nodes);
    char label[320];
    if (b16.on) {
        const struct gp_node *nd = &g->nodes[0];
        o.bf16 = true;
        o.params |= b16.params;
        o.f32_inputs |= b16.f32_inputs;
        o.f32_outputs |= b16.f32_outputs;
        for (int k = 0; k < nd->n_inputs && k < 32; k++) {
            if (nd->inputs[k] < 0) continue;
            const struct gp_value *v = &g->values[nd->inputs[k]];
            if (gp_dtype_is_float(v->dtype) && v->kind != GP_VALUE_ACTIVATION && v->kind != GP_VALUE_INPUT) {
                o.params |= IN(k);
                o.f32_inputs |= IN(k);
            }
        }
        snprintf(label, sizeof label, "%s (bf16; float32 gradients 0x%x, inputs 0x%x, outputs 0x%x)",
                 o.label ? o.label : nd->op_type, o.params, o.f32_inputs, o.f32_outputs);
        o.label = label;
    }
    op_compare_node(g, 0, &o);
    gp_graph_free(g);
}

/* ---- lookup and launch errors ---- */

/* Unknown ops and foreign domains find no kernel; a failed launch is an
 * error naming the node and the call. */
static void test_lookup_and_errors(void **state)
{
    (void)state;
    struct gp_node nd = {.name = "mystery_node", .op_type = "NoSuchOp", .domain = ""};
    assert_null(gp_cuda_kernel_for(&nd));
    nd.op_type = "Relu";
    assert_non_null(gp_cuda_kernel_for(&nd));
    nd.domain = "com.example";
    assert_null(gp_cuda_kernel_for(&nd));
    nd.domain = "";
    static const char *const ops[] = {
        "Gelu", "Log", "Abs", "Reciprocal", "Softplus", "Elu", "HardSigmoid", "HardSwish", "Floor", "Ceil",
        "Round", "Sign", "Not", "Pow", "Mod", "Equal", "Less", "LessOrEqual", "Greater",
        "GreaterOrEqual", "And", "Or", "Xor", "Max", "Min", "Sum", "Mean", "Where", "Expand", "Clip",
        "Cast", "CastLike", "Identity"};
    for (size_t k = 0; k < sizeof ops / sizeof *ops; k++) {
        nd.op_type = ops[k];
        if (!gp_cuda_kernel_for(&nd)) fail_msg("no CUDA kernel for %s", ops[k]);
    }
    nd.op_type = "Relu";

    struct gp_cuda_ctx c = {.node = &nd};
    struct gp_error err = {0};
    cudaGetLastError(); /* start clean */
    assert_int_equal(gp_cuda_check_launch(&c, "nothing launched", &err), GP_OK);
    gp_test_bad_launch(NULL); /* zero blocks: an invalid configuration */
    assert_int_equal(gp_cuda_check_launch(&c, "relu forward", &err), GP_ERR_DEVICE);
    if (!strstr(err.msg, "mystery_node") || !strstr(err.msg, "(Relu)") || !strstr(err.msg, "relu forward"))
        fail_msg("launch error message lacks the node, op or call: '%s'", err.msg);
    /* Reported once: the error is cleared for the next kernel. */
    gp_error_clear(&err);
    assert_int_equal(gp_cuda_check_launch(&c, "next", &err), GP_OK);
}

/* ---- unary ---- */

struct unary_case {
    const char *op;
    int opset;
    float alpha, beta; /* NAN: no attribute */
    const char *approximate;
    float lo, hi;
    int special; /* 1: zeros, -0 and NaN; 2: halves and zeros; 3: both signs away from 0 */
};

static void test_unary(void **state)
{
    (void)state;
    static const struct unary_case cases[] = {
        {"Relu", 14, NAN, NAN, NULL, -2, 2, 1},
        {"LeakyRelu", 16, NAN, NAN, NULL, -2, 2, 1},
        {"LeakyRelu", 16, 0.2f, NAN, NULL, -2, 2, 1},
        {"LeakyRelu", 16, -0.5f, NAN, NULL, -2, 2, 1}, /* its gradient reads X, not Y */
        {"Sigmoid", 13, NAN, NAN, NULL, -8, 8, 0},
        {"Tanh", 13, NAN, NAN, NULL, -3, 3, 0},
        {"Erf", 13, NAN, NAN, NULL, -2.5f, 2.5f, 0},
        {"Gelu", 20, NAN, NAN, NULL, -4, 4, 0},
        {"Gelu", 20, NAN, NAN, "none", -4, 4, 0},
        {"Gelu", 20, NAN, NAN, "tanh", -4, 4, 0},
        {"Sqrt", 13, NAN, NAN, NULL, 0.05f, 4, 0},
        {"Neg", 13, NAN, NAN, NULL, -2, 2, 0},
        {"Exp", 13, NAN, NAN, NULL, -4, 4, 0},
        {"Log", 13, NAN, NAN, NULL, 0.05f, 8, 0},
        {"Abs", 13, NAN, NAN, NULL, -2, 2, 1},
        {"Reciprocal", 13, NAN, NAN, NULL, 0, 0, 3},
        {"Softplus", 13, NAN, NAN, NULL, -12, 12, 0},
        {"Elu", 13, NAN, NAN, NULL, -3, 3, 1},
        {"Elu", 13, 0.5f, NAN, NULL, -3, 3, 0},
        {"HardSigmoid", 13, NAN, NAN, NULL, -4, 4, 0},
        {"HardSigmoid", 13, 0.5f, 0.3f, NULL, -3, 3, 0},
        {"HardSwish", 14, NAN, NAN, NULL, -5, 5, 0},
        {"Floor", 13, NAN, NAN, NULL, 0, 0, 2},
        {"Ceil", 13, NAN, NAN, NULL, 0, 0, 2},
        {"Round", 11, NAN, NAN, NULL, 0, 0, 2},
        {"Sign", 13, NAN, NAN, NULL, 0, 0, 2},
        {"Identity", 16, NAN, NAN, NULL, -2, 2, 0},
    };
    static const struct tshape shapes[] = {SH(4, 2, 3, 4, 5), SH(2, 1100, 1001)};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            const struct unary_case *u = &cases[c];
            struct gp_graph g;
            begin(&g, u->opset);
            input_t(&g, "x", GP_DTYPE_FLOAT32, shapes[s]);
            int n = node(&g, u->op, 1, S("x"), 1, S("y"));
            if (!isnan(u->alpha)) attr_f(&g, n, "alpha", u->alpha);
            if (!isnan(u->beta)) attr_f(&g, n, "beta", u->beta);
            if (u->approximate) attr_s(&g, n, "approximate", u->approximate);
            int64_t count = numel_sh(shapes[s]);
            float *x = NULL;
            if (u->special) {
                x = floats(count, u->lo, u->hi);
                for (int64_t i = 0; i < count; i++) {
                    if (u->special == 2) x[i] = 0.5f * (float)((int64_t)(next_u64() % 21) - 10) +
                                                (next_u64() % 4 == 0 ? randf(-0.2f, 0.2f) : 0.0f);
                    else if (u->special == 3) x[i] = (next_u64() & 1 ? 1.0f : -1.0f) * randf(0.25f, 4.0f);
                }
                if (u->special == 1) {
                    x[0] = 0.0f; /* the kink: both sides take the same branch */
                    x[1] = -0.0f;
                    x[2] = NAN;
                }
            }
            char label[160], sb[64];
            snprintf(label, sizeof label, "%s%s%s%s %s", u->op, !isnan(u->alpha) ? " (alpha)" : "",
                     u->approximate ? " approximate=" : "", u->approximate ? u->approximate : "",
                     shape_text(shapes[s], sb, sizeof sb));
            compare(&g, (struct op_compare){.label = label, .inputs = {x}, .lo = u->lo, .hi = u->hi});
            free(x);
        }
    }
}

/* GPT-2 small's Gelu ([16, 1024, 3072], the MLP's hidden activation) in
 * both forms, float32 and bfloat16, the gradient added onto random values
 * and written whole (its first writer, din_overwrite): the runs kernels
 * with the formula fixed when compiled (elementwise.cu, ufix). Inputs in
 * [-6, 6): both of erff's ranges, tanh near saturation. */
static void test_gelu_gpt2(void **state)
{
    (void)state;
    static const struct tshape sh = SH(3, 16, 1024, 3072);
    for (int form = 0; form < 2; form++)
        for (int b = 0; b < 2; b++)
            for (int ow = 0; ow < 2; ow++) {
                if (b) bf16_set(0, 0, 0);
                else bf16_off();
                struct gp_graph g;
                begin(&g, 20);
                input_t(&g, "x", GP_DTYPE_FLOAT32, sh);
                int n = node(&g, "Gelu", 1, S("x"), 1, S("y"));
                if (form) attr_s(&g, n, "approximate", "tanh");
                char label[96];
                snprintf(label, sizeof label, "Gelu%s [16,1024,3072]%s", form ? " approximate=tanh" : "",
                         ow ? ", dX written whole" : "");
                compare(&g, (struct op_compare){.label = label, .lo = -6, .hi = 6, .overwrite = ow ? IN(0) : 0});
            }
    bf16_off();
}

/* Integer and bool inputs: forward only (no gradient). */
static void test_unary_int(void **state)
{
    (void)state;
    static const char *const ops[] = {"Relu", "Neg", "Abs", "Sign", "Erf"};
    static const enum gp_dtype types[] = {GP_DTYPE_INT64, GP_DTYPE_INT32};
    for (size_t o = 0; o < sizeof ops / sizeof *ops; o++) {
        for (int t = 0; t < 2; t++) {
            struct gp_graph g;
            begin(&g, 14);
            struct tshape sh = SH(2, 37, 41);
            input_t(&g, "x", types[t], sh);
            node(&g, ops[o], 1, S("x"), 1, S("y"));
            void *x = data_of(types[t], numel_sh(sh), -5, 5);
            if (types[t] == GP_DTYPE_INT64) ((int64_t *)x)[0] = INT64_MIN, ((int64_t *)x)[1] = INT64_MAX;
            else ((int32_t *)x)[0] = INT32_MIN, ((int32_t *)x)[1] = INT32_MAX;
            char label[64];
            snprintf(label, sizeof label, "%s %s", ops[o], gp_dtype_name(types[t]));
            compare(&g, (struct op_compare){.label = label, .inputs = {x}, .forward_only = true});
            free(x);
        }
    }
    struct gp_graph g;
    begin(&g, 13);
    input_t(&g, "x", GP_DTYPE_BOOL, SH(2, 300, 7));
    node(&g, "Not", 1, S("x"), 1, S("y"));
    uint8_t *b = bools(2100, 3);
    compare(&g, (struct op_compare){.label = "Not", .inputs = {b}, .forward_only = true});
    free(b);
}

/* ---- Clip ---- */

static void test_clip(void **state)
{
    (void)state;
    struct tshape sh = SH(3, 7, 11, 13);
    int64_t n = numel_sh(sh);
    /* Inputs on the bounds too: the bounds pass the gradient. */
    float *x = floats(n, -2, 2);
    for (int64_t i = 0; i < n; i += 5) x[i] = i % 10 ? -0.5f : 0.75f;
    struct gp_graph g;

    begin(&g, 6);
    input_t(&g, "x", GP_DTYPE_FLOAT32, sh);
    int nd = node(&g, "Clip", 1, S("x"), 1, S("y"));
    attr_f(&g, nd, "min", -0.5f);
    attr_f(&g, nd, "max", 0.75f);
    compare(&g, (struct op_compare){.label = "Clip-6 attributes", .inputs = {x}});

    begin(&g, 6);
    input_t(&g, "x", GP_DTYPE_FLOAT32, sh);
    node(&g, "Clip", 1, S("x"), 1, S("y"));
    compare(&g, (struct op_compare){.label = "Clip-6 defaults", .inputs = {x}});

    static const struct {
        const char *label;
        bool lo, hi;
        float vlo, vhi;
    } cases[] = {
        {"Clip-13 min and max inputs", true, true, -0.5f, 0.75f},
        {"Clip-13 min only", true, false, -0.5f, 0},
        {"Clip-13 max only", false, true, 0, 0.75f},
        {"Clip-13 no bounds", false, false, 0, 0},
        {"Clip-13 min > max", true, true, 0.75f, -0.5f},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        begin(&g, 13);
        input_t(&g, "x", GP_DTYPE_FLOAT32, sh);
        if (cases[k].lo) cf32(&g, "lo", cases[k].vlo);
        if (cases[k].hi) cf32(&g, "hi", cases[k].vhi);
        int ni = cases[k].hi ? 3 : cases[k].lo ? 2 : 1;
        node(&g, "Clip", ni, S("x", cases[k].lo ? "lo" : "", "hi"), 1, S("y"));
        compare(&g, (struct op_compare){.label = cases[k].label, .inputs = {x}});
    }
    free(x);

    begin(&g, 13);
    input_t(&g, "x", GP_DTYPE_FLOAT32, SH(2, 1100, 1001));
    cf32(&g, "lo", -1.0f);
    cf32(&g, "hi", 1.25f);
    node(&g, "Clip", 3, S("x", "lo", "hi"), 1, S("y"));
    compare(&g, (struct op_compare){.label = "Clip-13 [1100, 1001]"});

    begin(&g, 13);
    input_t(&g, "x", GP_DTYPE_INT64, SH(2, 5, 9));
    ci64(&g, "lo", 0, NULL, I64(-3));
    ci64(&g, "hi", 0, NULL, I64(4));
    node(&g, "Clip", 3, S("x", "lo", "hi"), 1, S("y"));
    int64_t *xi = ints64(45, -9, 9);
    compare(&g, (struct op_compare){.label = "Clip-13 int64", .inputs = {xi}});
    free(xi);
}

/* ---- Cast, CastLike, Identity ---- */

static void cast_case(enum gp_dtype from, enum gp_dtype to, bool like)
{
    struct gp_graph g;
    struct tshape sh = SH(2, 31, 17);
    int64_t n = numel_sh(sh);
    begin(&g, like ? 15 : 13);
    input_t(&g, "x", from, sh);
    void *x = data_of(from, n, -1000, 1000);
    void *t = NULL;
    if (from == GP_DTYPE_FLOAT32) { /* fractions, saturation, wrapping, NaN */
        float *f = x;
        f[0] = NAN, f[1] = 3e9f, f[2] = -3e9f, f[3] = 1e20f, f[4] = -1e20f, f[5] = 0.75f, f[6] = -0.75f;
        f[7] = 0.0f, f[8] = -0.0f, f[9] = 2.5f;
    } else if (from == GP_DTYPE_INT64) {
        int64_t *v = x;
        v[0] = INT64_MAX, v[1] = INT64_MIN, v[2] = (int64_t)1 << 40, v[3] = ((int64_t)1 << 53) + 1, v[4] = 0;
        v[5] = 16777217;
    } else if (from == GP_DTYPE_INT32) {
        int32_t *v = x;
        v[0] = INT32_MAX, v[1] = INT32_MIN, v[2] = 0, v[3] = 16777217;
    }
    if (like) {
        input_t(&g, "t", to, SH(1, 3));
        t = data_of(to, 3, 0, 1);
        node(&g, "CastLike", 2, S("x", "t"), 1, S("y"));
    } else {
        attr_i(&g, node(&g, "Cast", 1, S("x"), 1, S("y")), "to", (int64_t)to);
    }
    char label[96];
    snprintf(label, sizeof label, "%s %s -> %s", like ? "CastLike" : "Cast", gp_dtype_name(from),
             gp_dtype_name(to));
    compare(&g, (struct op_compare){.label = label, .inputs = {x, t}});
    free(x);
    free(t);
}

static void test_cast(void **state)
{
    (void)state;
    static const enum gp_dtype types[] = {GP_DTYPE_FLOAT32, GP_DTYPE_INT64, GP_DTYPE_INT32, GP_DTYPE_BOOL};
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) cast_case(types[a], types[b], false);
    cast_case(GP_DTYPE_FLOAT32, GP_DTYPE_INT64, true);
    cast_case(GP_DTYPE_INT32, GP_DTYPE_FLOAT32, true);
    cast_case(GP_DTYPE_FLOAT32, GP_DTYPE_FLOAT32, true);

    struct gp_graph g;
    begin(&g, 13);
    input_t(&g, "x", GP_DTYPE_FLOAT64, SH(2, 3, 5));
    attr_i(&g, node(&g, "Cast", 1, S("x"), 1, S("y")), "to", GP_DTYPE_FLOAT32);
    compare(&g, (struct op_compare){.label = "Cast float64 -> float32 (float storage)"});

    begin(&g, 16);
    input_t(&g, "x", GP_DTYPE_INT64, SH(2, 3, 5));
    node(&g, "Identity", 1, S("x"), 1, S("y"));
    int64_t *xi = ints64(15, -100, 100);
    compare(&g, (struct op_compare){.label = "Identity int64", .inputs = {xi}});
    free(xi);
}

/* ---- binary ---- */

struct bin_case {
    const char *op;
    int opset;
    enum gp_dtype at, bt;
    struct tshape a, b;
};

/* A op B with given data (or random floats in [lo, hi) when NULL). */
static void bin_run(const char *op, int opset, enum gp_dtype at, struct tshape as, const void *a,
                    enum gp_dtype bt, struct tshape bs, const void *b, int64_t fmod, bool forward_only,
                    float lo, float hi)
{
    struct gp_graph g;
    begin(&g, opset);
    input_t(&g, "a", at, as);
    input_t(&g, "b", bt, bs);
    int n = node(&g, op, 2, S("a", "b"), 1, S("y"));
    if (fmod >= 0) attr_i(&g, n, "fmod", fmod);
    char label[160], s1[64], s2[64];
    snprintf(label, sizeof label, "%s %s %s with %s %s%s", op, gp_dtype_name(at), shape_text(as, s1, sizeof s1),
             gp_dtype_name(bt), shape_text(bs, s2, sizeof s2), fmod == 1 ? " fmod" : "");
    compare(&g, (struct op_compare){.label = label, .inputs = {a, b}, .forward_only = forward_only,
                                    .lo = lo, .hi = hi});
}

/* An Add with a fused Relu (gp_node.fused_relu, as graph/fuse.c leaves a
 * residual Add then Relu), both inputs of one shape: the runs path (sizes
 * a multiple of 8) and the per-value one; every fourth sum exactly 0. */
static void add_relu_run(struct tshape sh)
{
    int64_t n = numel_sh(sh);
    float *a = floats(n, -2, 2), *b = floats(n, -2, 2);
    for (int64_t i = 0; i < n; i += 4) b[i] = -a[i];
    struct gp_graph g;
    begin(&g, 14);
    input_t(&g, "a", GP_DTYPE_FLOAT32, sh);
    input_t(&g, "b", GP_DTYPE_FLOAT32, sh);
    int k = node(&g, "Add", 2, S("a", "b"), 1, S("y"));
    g.nodes[k].fused_relu = true;
    char label[160], s1[64];
    snprintf(label, sizeof label, "Add + Relu %s", shape_text(sh, s1, sizeof s1));
    compare(&g, (struct op_compare){.label = label, .inputs = {a, b}});
    free(a);
    free(b);
}

/* The same over a row vector (a bias [.., N] of [.., M, N]: the row
 * paths of binary.cu), every fourth sum of the first row's columns exactly
 * 0 so that the Relu mask cuts some terms of the bias's column sums. */
static void add_relu_row_run(struct tshape as, struct tshape bs)
{
    int64_t na = numel_sh(as), nb = numel_sh(bs);
    float *a = floats(na, -2, 2), *b = floats(nb, -2, 2);
    for (int64_t i = 0; i < na; i += 4) a[i] = -b[i % nb];
    struct gp_graph g;
    begin(&g, 14);
    input_t(&g, "a", GP_DTYPE_FLOAT32, as);
    input_t(&g, "b", GP_DTYPE_FLOAT32, bs);
    int k = node(&g, "Add", 2, S("a", "b"), 1, S("y"));
    g.nodes[k].fused_relu = true;
    char label[160], s1[64], s2[64];
    snprintf(label, sizeof label, "Add + Relu %s with %s", shape_text(as, s1, sizeof s1),
             shape_text(bs, s2, sizeof s2));
    compare(&g, (struct op_compare){.label = label, .inputs = {a, b}});
    free(a);
    free(b);
}

/* Row vectors (binary.cu's row paths: the forward on runs, the full
 * operand's gradient on runs, the row's column sums on runs in chunks)
 * and their neighbours that must not take them. */
static void row_cases(void)
{
    const enum gp_dtype F = GP_DTYPE_FLOAT32;
    /* GPT-2's bias after a MatMul: [16, 1024, 2304] + [2304] (114 chunks
     * of 144 rows), and the same against a [1, N] row. */
    bin_run("Add", 14, F, SH(3, 16, 1024, 2304), NULL, F, SH(1, 2304), NULL, -1, false, 0, 0);
    bin_run("Add", 14, F, SH(2, 4096, 768), NULL, F, SH(2, 1, 768), NULL, -1, false, 0, 0);
    /* The row as A, and Sub's negated terms on either side (9 chunks of
     * 34 rows, the last one short). */
    bin_run("Add", 14, F, SH(1, 776), NULL, F, SH(2, 300, 776), NULL, -1, false, 0, 0);
    bin_run("Sub", 14, F, SH(2, 300, 776), NULL, F, SH(2, 1, 776), NULL, -1, false, 0, 0);
    bin_run("Sub", 14, F, SH(2, 1, 776), NULL, F, SH(3, 3, 100, 776), NULL, -1, false, 0, 0);
    /* Few rows: one chunk (reduce_kernel), the forward still on runs. */
    bin_run("Sub", 14, F, SH(2, 40, 64), NULL, F, SH(1, 64), NULL, -1, false, 0, 0);
    /* N not a multiple of 8: the generic forward and column sums; the
     * full operand's gradient on runs all the same (4096 * 1001 is). */
    bin_run("Add", 14, F, SH(2, 4096, 1001), NULL, F, SH(1, 1001), NULL, -1, false, 0, 0);
    bin_run("Sub", 14, F, SH(2, 1, 1001), NULL, F, SH(2, 4095, 1001), NULL, -1, false, 0, 0);
    /* Mul and Div: the forward on runs, the gradients generic. */
    float *a = floats(640 * 1536, -2, 2), *b = floats(1536, 0.5f, 2.0f);
    for (int64_t i = 0; i < 1536; i += 2) b[i] = -b[i];
    bin_run("Mul", 14, F, SH(2, 640, 1536), a, F, SH(1, 1536), b, -1, false, 0, 0);
    bin_run("Div", 14, F, SH(2, 640, 1536), a, F, SH(1, 1536), b, -1, false, 0, 0);
    free(a);
    free(b);
    a = floats(1536, -2, 2);
    b = floats(640 * 1536, 0.5f, 2.0f);
    for (int64_t i = 0; i < 640 * 1536; i += 2) b[i] = -b[i];
    bin_run("Div", 14, F, SH(1, 1536), a, F, SH(2, 640, 1536), b, -1, false, 0, 0);
    free(a);
    free(b);
    /* A fused Relu over a bias (the mask in both gradients). */
    add_relu_row_run(SH(2, 2048, 3072), SH(1, 3072));
    add_relu_row_run(SH(2, 64, 1001), SH(1, 1001));
}

static const struct tshape bshapes[][2] = {
    {SH(3, 2, 3, 4), SH(1, 4)},              /* trailing axis */
    {SH(3, 2, 1, 4), SH(3, 1, 3, 1)},        /* both broadcast */
    {SH(3, 2, 3, 4), SH(0, 0)},              /* scalar B (an initializer) */
    {SH(0, 0), SH(3, 2, 3, 4)},              /* scalar A */
    {SH(3, 2, 3, 4), SH(3, 2, 3, 4)},        /* same shapes */
    {SH(4, 8, 64, 33, 17), SH(3, 64, 1, 1)}, /* one middle axis kept: two-level */
    {SH(2, 1, 4099), SH(3, 130, 1, 1)},      /* outer product */
    {SH(2, 1100, 1001), SH(2, 1100, 1001)},  /* same, the loops go round */
};

static void test_binary(void **state)
{
    (void)state;
    static const char *const ops[] = {"Add", "Sub", "Mul", "Div", "Pow"};
    for (size_t o = 0; o < sizeof ops / sizeof *ops; o++) {
        for (size_t s = 0; s < sizeof bshapes / sizeof *bshapes; s++) {
            struct tshape as = bshapes[s][0], bs = bshapes[s][1];
            int64_t na = numel_sh(as), nb = numel_sh(bs);
            float *a, *b;
            if (strcmp(ops[o], "Pow") == 0) {
                a = floats(na, 0.5f, 2.0f);
                b = floats(nb, -2.0f, 2.0f);
                for (int64_t i = 0; i < nb; i += 7) b[i] = (float)(i % 3); /* 0, 1, 2 exactly */
            } else {
                a = floats(na, -2, 2);
                b = floats(nb, 0.5f, 2.0f); /* divisors away from zero, of both signs */
                for (int64_t i = 0; i < nb; i++)
                    if (next_u64() & 1) b[i] = -b[i];
            }
            bin_run(ops[o], 14, GP_DTYPE_FLOAT32, as, a, GP_DTYPE_FLOAT32, bs, b, -1, false, 0, 0);
            free(a);
            free(b);
        }
    }
    add_relu_run(SH(3, 2, 3, 4));
    add_relu_run(SH(3, 5, 7));
    add_relu_run(SH(2, 1100, 1001));
    /* A bias of a large activation (two-level sums), and one summed over
     * the leading axes only. */
    bin_run("Add", 14, GP_DTYPE_FLOAT32, SH(2, 16384, 768), NULL, GP_DTYPE_FLOAT32, SH(1, 768), NULL, -1,
            false, 0, 0);
    bin_run("Mul", 14, GP_DTYPE_FLOAT32, SH(3, 4, 96, 1000), NULL, GP_DTYPE_FLOAT32, SH(3, 4, 1, 1000),
            NULL, -1, false, 0, 0);
    row_cases();

    /* Pow with an integer exponent (Pow-13): gradient to the base only. */
    float *a = floats(24, 0.5f, 2.0f);
    for (int i = 0; i < 24; i += 3) a[i] = -a[i];
    int64_t *e = ints64(4, -3, 3);
    e[0] = 0;
    bin_run("Pow", 13, GP_DTYPE_FLOAT32, SH(3, 2, 3, 4), a, GP_DTYPE_INT64, SH(1, 4), e, -1, false, 0, 0);
    free(a);
    free(e);

    /* Mod on floats (fmod), comparisons: forward only, data with ties. */
    a = floats(24, -5, 5);
    float *b = floats(4, 0.5f, 2.0f);
    b[1] = -b[1];
    bin_run("Mod", 13, GP_DTYPE_FLOAT32, SH(3, 2, 3, 4), a, GP_DTYPE_FLOAT32, SH(1, 4), b, 1, true, 0, 0);
    free(a);
    free(b);
    static const char *const cmps[] = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"};
    for (size_t k = 0; k < sizeof cmps / sizeof *cmps; k++) {
        float *fa = grid_floats(24, -1, 5), *fb = grid_floats(12, -1, 5);
        bin_run(cmps[k], 16, GP_DTYPE_FLOAT32, SH(3, 2, 3, 4), fa, GP_DTYPE_FLOAT32, SH(3, 1, 3, 4), fb, -1,
                true, 0, 0);
        free(fa);
        free(fb);
        int64_t *ia = ints64(24, -2, 2), *ib = ints64(4, -2, 2);
        bin_run(cmps[k], 16, GP_DTYPE_INT64, SH(3, 2, 3, 4), ia, GP_DTYPE_INT64, SH(1, 4), ib, -1, true, 0, 0);
        free(ia);
        free(ib);
    }
    float *fa = grid_floats(1100 * 1001, -1, 5), *fb = grid_floats(1001, -1, 5);
    bin_run("Less", 16, GP_DTYPE_FLOAT32, SH(2, 1100, 1001), fa, GP_DTYPE_FLOAT32, SH(1, 1001), fb, -1, true,
            0, 0);
    free(fa);
    free(fb);
}

/* Integer arithmetic (wrapping, truncating division, both Mod
 * conventions), Pow with a float exponent on an integer base, and logic. */
static void test_binary_int(void **state)
{
    (void)state;
    static const char *const ops[] = {"Add", "Sub", "Mul", "Div", "Mod", "Pow"};
    static const enum gp_dtype types[] = {GP_DTYPE_INT64, GP_DTYPE_INT32};
    for (size_t o = 0; o < sizeof ops / sizeof *ops; o++) {
        for (int t = 0; t < 2; t++) {
            for (int fmod = 0; fmod < (strcmp(ops[o], "Mod") == 0 ? 2 : 1); fmod++) {
                void *a = data_of(types[t], 24, -50, 50);
                void *b = data_of(types[t], 4, 1, 7);
                if (strcmp(ops[o], "Pow") == 0) {
                    free(b);
                    b = data_of(types[t], 4, -2, 5);
                }
                if (types[t] == GP_DTYPE_INT64) {
                    int64_t *v = b;
                    v[1] = -v[1] ? -v[1] : -3;
                    ((int64_t *)a)[0] = INT64_MIN;
                    ((int64_t *)a)[1] = INT64_MAX;
                } else {
                    int32_t *v = b;
                    v[1] = -v[1] ? -v[1] : -3;
                    ((int32_t *)a)[0] = INT32_MIN;
                    ((int32_t *)a)[1] = INT32_MAX;
                }
                if (strcmp(ops[o], "Pow") == 0) { /* small bases */
                    for (int i = 0; i < 24; i++) {
                        if (types[t] == GP_DTYPE_INT64) ((int64_t *)a)[i] = (int64_t)(i % 7) - 3;
                        else ((int32_t *)a)[i] = (int32_t)(i % 7) - 3;
                    }
                }
                bin_run(ops[o], 13, types[t], SH(3, 2, 3, 4), a, types[t], SH(1, 4), b,
                        strcmp(ops[o], "Mod") == 0 ? fmod : -1, true, 0, 0);
                free(a);
                free(b);
            }
        }
    }
    int64_t *ia = ints64(24, -3, 3);
    float *fb = floats(4, -2, 2);
    bin_run("Pow", 13, GP_DTYPE_INT64, SH(3, 2, 3, 4), ia, GP_DTYPE_FLOAT32, SH(1, 4), fb, -1, true, 0, 0);
    free(ia);
    free(fb);
    static const char *const logic[] = {"And", "Or", "Xor", "Equal"};
    for (size_t k = 0; k < sizeof logic / sizeof *logic; k++) {
        uint8_t *a = bools(24, 3), *b = bools(12, 3);
        bin_run(logic[k], k == 3 ? 19 : 7, GP_DTYPE_BOOL, SH(3, 2, 3, 4), a, GP_DTYPE_BOOL, SH(2, 3, 4), b, -1,
                true, 0, 0);
        free(a);
        free(b);
    }
}

/* ---- variadic ---- */

static void variadic_run(const char *op, int n_in, const struct tshape *shapes, enum gp_dtype dt,
                         bool ties, const char *what)
{
    struct gp_graph g;
    begin(&g, 13);
    static const char *const names[] = {"a", "b", "c"};
    void *data[3] = {NULL, NULL, NULL};
    for (int k = 0; k < n_in; k++) {
        input_t(&g, names[k], dt, shapes[k]);
        int64_t n = numel_sh(shapes[k]);
        if (dt != GP_DTYPE_FLOAT32) data[k] = data_of(dt, n, -4, 4);
        else if (ties) data[k] = grid_floats(n, -1, 4);
    }
    if (ties && dt == GP_DTYPE_FLOAT32) ((float *)data[n_in - 1])[0] = NAN;
    node(&g, op, n_in, names, 1, S("y"));
    char label[128];
    snprintf(label, sizeof label, "%s of %d %s inputs%s", op, n_in, gp_dtype_name(dt), what);
    compare(&g, (struct op_compare){.label = label, .inputs = {data[0], data[1], data[2]}});
    for (int k = 0; k < 3; k++) free(data[k]);
}

static void test_variadic(void **state)
{
    (void)state;
    static const char *const ops[] = {"Max", "Min", "Sum", "Mean"};
    static const struct tshape three[3] = {SH(3, 2, 3, 4), SH(1, 4), SH(2, 3, 1)};
    static const struct tshape same[2] = {SH(2, 5, 7), SH(2, 5, 7)};
    static const struct tshape large[2] = {SH(2, 1100, 1001), SH(1, 1001)};
    for (size_t o = 0; o < sizeof ops / sizeof *ops; o++) {
        variadic_run(ops[o], 1, three, GP_DTYPE_FLOAT32, false, "");
        variadic_run(ops[o], 2, same, GP_DTYPE_FLOAT32, false, ", same shapes");
        variadic_run(ops[o], 3, three, GP_DTYPE_FLOAT32, false, ", broadcast");
        variadic_run(ops[o], 3, three, GP_DTYPE_FLOAT32, true, ", broadcast, ties and NaN");
        variadic_run(ops[o], 2, large, GP_DTYPE_FLOAT32, o < 2, ", large");
    }
    variadic_run("Max", 3, three, GP_DTYPE_INT64, false, "");
    variadic_run("Min", 2, same, GP_DTYPE_INT32, false, "");
}

/* ---- Where, Expand ---- */

static void where_run(enum gp_dtype dt, struct tshape cs, struct tshape xs, struct tshape ys)
{
    struct gp_graph g;
    begin(&g, 16);
    input_t(&g, "c", GP_DTYPE_BOOL, cs);
    input_t(&g, "x", dt, xs);
    input_t(&g, "y", dt, ys);
    node(&g, "Where", 3, S("c", "x", "y"), 1, S("o"));
    uint8_t *c = bools(numel_sh(cs), 3);
    void *x = dt == GP_DTYPE_FLOAT32 ? NULL : data_of(dt, numel_sh(xs), -9, 9);
    void *y = dt == GP_DTYPE_FLOAT32 ? NULL : data_of(dt, numel_sh(ys), -9, 9);
    char label[160], s1[64], s2[64], s3[64];
    snprintf(label, sizeof label, "Where %s %s ? %s : %s", gp_dtype_name(dt), shape_text(cs, s1, sizeof s1),
             shape_text(xs, s2, sizeof s2), shape_text(ys, s3, sizeof s3));
    compare(&g, (struct op_compare){.label = label, .inputs = {c, x, y}});
    free(c);
    free(x);
    free(y);
}

static void expand_run(enum gp_dtype dt, struct tshape xs, int rank, const int64_t *target)
{
    struct gp_graph g;
    begin(&g, 13);
    input_t(&g, "x", dt, xs);
    ci64(&g, "shape", 1, I64(rank), target);
    node(&g, "Expand", 2, S("x", "shape"), 1, S("y"));
    void *x = dt == GP_DTYPE_FLOAT32 ? NULL : data_of(dt, numel_sh(xs), -9, 9);
    char label[128], s1[64];
    snprintf(label, sizeof label, "Expand %s %s to rank %d", gp_dtype_name(dt), shape_text(xs, s1, sizeof s1),
             rank);
    compare(&g, (struct op_compare){.label = label, .inputs = {x}});
    free(x);
}

static void test_where_expand(void **state)
{
    (void)state;
    where_run(GP_DTYPE_FLOAT32, SH(3, 2, 1, 4), SH(3, 2, 3, 4), SH(2, 3, 1));
    where_run(GP_DTYPE_FLOAT32, SH(3, 2, 3, 4), SH(0, 0), SH(1, 4));
    where_run(GP_DTYPE_FLOAT32, SH(2, 1, 1001), SH(2, 1100, 1), SH(2, 1100, 1001));
    /* The attention mask: few long rows, split between blocks. */
    where_run(GP_DTYPE_FLOAT32, SH(4, 1, 1, 96, 96), SH(4, 2, 3, 96, 96), SH(0, 0));
    where_run(GP_DTYPE_INT64, SH(2, 3, 4), SH(2, 3, 4), SH(1, 1));
    where_run(GP_DTYPE_BOOL, SH(2, 3, 4), SH(1, 4), SH(2, 3, 4));
    where_run(GP_DTYPE_INT32, SH(1, 5), SH(2, 3, 5), SH(1, 5));

    expand_run(GP_DTYPE_FLOAT32, SH(2, 3, 1), 3, I64(2, 3, 4));
    expand_run(GP_DTYPE_FLOAT32, SH(1, 1), 1, I64(5));
    expand_run(GP_DTYPE_FLOAT32, SH(1, 4), 3, I64(2, 1, 4));
    expand_run(GP_DTYPE_FLOAT32, SH(3, 2, 1, 5), 2, I64(7, 1)); /* the target broadcasts too */
    expand_run(GP_DTYPE_FLOAT32, SH(2, 1, 768), 2, I64(16384, 768));
    expand_run(GP_DTYPE_INT64, SH(2, 3, 1), 3, I64(2, 3, 4));
    expand_run(GP_DTYPE_BOOL, SH(1, 4), 2, I64(3, 4));
}

/* ---- absent gradients ---- */

/* dout NULL: nothing changes; din NULL for one input: the other still gets
 * its gradient. Either would crash or corrupt memory if ignored. */
static void test_null_gradients(void **state)
{
    (void)state;
    const char *const ops[] = {"Relu", "Add", "Identity", "Where", "Max"};
    for (int o = 0; o < 5; o++) {
        struct gp_graph g;
        begin(&g, 16);
        input_t(&g, "x", GP_DTYPE_FLOAT32, SH(3, 2, 3, 4));
        input_t(&g, "b", GP_DTYPE_FLOAT32, SH(1, 4));
        if (strcmp(ops[o], "Where") == 0) {
            input_t(&g, "c", GP_DTYPE_BOOL, SH(3, 2, 3, 4));
            node(&g, "Where", 3, S("c", "x", "b"), 1, S("y"));
        } else if (strcmp(ops[o], "Add") == 0 || strcmp(ops[o], "Max") == 0) {
            node(&g, ops[o], 2, S("x", "b"), 1, S("y"));
        } else {
            node(&g, ops[o], 1, S("x"), 1, S("y"));
        }
        finalize_ok(&g);
        const struct gp_node *nd = &g.nodes[0];
        const struct gp_cuda_kernel *gk = gp_cuda_kernel_for(nd);
        assert_non_null(gk);
        float x[24], d0[24], ones[24], b4[4], db0[4];
        uint8_t cond[24];
        for (int i = 0; i < 24; i++) x[i] = randf(-1, 1), d0[i] = randf(-1, 1), ones[i] = 1.0f, cond[i] = 1;
        for (int i = 0; i < 4; i++) b4[i] = 5.0f, db0[i] = randf(-1, 1); /* b wins every Max */
        float *dx = op_dev_copy_of(x, sizeof x, ops[o]), *dd = op_dev_copy_of(d0, sizeof d0, ops[o]);
        float *dy = op_dev_copy_of(x, sizeof x, ops[o]), *dones = op_dev_copy_of(ones, sizeof ones, ops[o]);
        float *dxb = op_dev_copy_of(b4, sizeof b4, ops[o]), *ddb = op_dev_copy_of(db0, sizeof db0, ops[o]);
        void *dcond = op_dev_copy_of(cond, sizeof cond, ops[o]);
        void *scratch = op_dev_alloc(4096, ops[o]);
        cudaStream_t stream;
        /* A blocking stream: the uploads and poison fills before a launch are
         * plain cudaMemcpy / cudaMemset on the legacy default stream, which a
         * non-blocking stream does not wait for (a fill could land after the
         * kernel's writes: seen under compute-sanitizer, which slows the host). */
        op_cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamDefault), ops[o], "cudaStreamCreate");
        bool where = strcmp(ops[o], "Where") == 0;
        void *in[3] = {where ? dcond : (void *)dx, where ? (void *)dx : (void *)dxb, dxb};
        void *out[1] = {dy};
        float *din[3] = {where ? NULL : dd, where ? dd : ddb, ddb}, *dout[1] = {NULL};
        struct gp_cuda_ctx c = {.graph = &g, .node = nd, .in = in, .out = out, .din = din, .dout = dout,
                                .scratch = scratch, .stream = stream, .dropout_ratio = -1};
        struct gp_error err = {0};
        if (gk->forward(&c, &err) != GP_OK) fail_msg("%s: forward: %s", ops[o], err.msg);
        if (gk->backward(&c, &err) != GP_OK) fail_msg("%s: backward, dout NULL: %s", ops[o], err.msg);
        op_cuda_ok(cudaStreamSynchronize(stream), ops[o], "backward");
        float h[24];
        op_cuda_ok(cudaMemcpy(h, dd, sizeof h, cudaMemcpyDeviceToHost), ops[o], "download");
        for (int i = 0; i < 24; i++)
            if (h[i] != d0[i])
                fail_msg("%s: dout NULL changed a gradient, element %d: %.9g, was %.9g", ops[o], i, (double)h[i],
                         (double)d0[i]);
        if (nd->n_inputs >= 2) {
            /* The first float input's gradient absent, dout ones: the
             * second gets d0 + 6 (the sum over 2 x 3) for Add and Max (b
             * wins), nothing for Where (the condition is all true). */
            float *din2[3] = {NULL, where ? NULL : ddb, where ? ddb : NULL}, *dout2[1] = {dones};
            c.din = din2;
            c.dout = dout2;
            if (gk->backward(&c, &err) != GP_OK) fail_msg("%s: backward, din[0] NULL: %s", ops[o], err.msg);
            op_cuda_ok(cudaStreamSynchronize(stream), ops[o], "backward");
            op_cuda_ok(cudaMemcpy(h, ddb, sizeof(float) * 4, cudaMemcpyDeviceToHost), ops[o], "download");
            for (int i = 0; i < 4; i++) {
                float want = db0[i] + (where ? 0.0f : 6.0f);
                if (fabsf(h[i] - want) > 1e-5f)
                    fail_msg("%s: din[0] NULL: the other gradient, element %d: %.9g, expected %.9g", ops[o], i,
                             (double)h[i], (double)want);
            }
        }
        cudaFree(dx);
        cudaFree(dd);
        cudaFree(dy);
        cudaFree(dones);
        cudaFree(dxb);
        cudaFree(ddb);
        cudaFree(dcond);
        cudaFree(scratch);
        cudaStreamDestroy(stream);
        gp_graph_free(&g);
    }
}

/* ---- bfloat16 ---- */

/* Unary ops, Clip, Cast, CastLike, Identity: all bfloat16; the input a
 * float32 parameter; a bfloat16 input with a float32 gradient; a float32
 * output. */
static void test_elementwise_bf16(void **state)
{
    bf16_set(0, 0, 0);
    test_unary(state);
    test_clip(state);
    test_cast(state);
    bf16_set(IN(0), IN(0), 0);
    test_unary(state);
    test_clip(state);
    test_cast(state);
    bf16_set(IN(0), 0, 0);
    test_unary(state);
    bf16_set(0, 0, OUT(0));
    test_unary(state);
    test_cast(state);
    bf16_off();
}

/* Binary ops (float and integer; Pow's float exponent of an integer base
 * in bfloat16), Where, Expand: all bfloat16; B a float32 parameter (a
 * bias: its gradient summed over the broadcast axes into float32); A a
 * float32 parameter; a float32 output. */
static void test_binary_bf16(void **state)
{
    bf16_set(0, 0, 0);
    test_binary(state);
    test_binary_int(state);
    test_where_expand(state);
    bf16_set(IN(1), IN(1), 0);
    test_binary(state);
    test_where_expand(state); /* Where's X, a float32 parameter */
    bf16_set(IN(0), IN(0), 0);
    test_binary(state);
    test_where_expand(state); /* Expand's X, a float32 parameter */
    bf16_set(IN(0) | IN(1), 0, 0);
    test_binary(state); /* bfloat16 operands, float32 gradients */
    bf16_set(0, 0, OUT(0));
    test_binary(state);
    test_where_expand(state);
    bf16_off();
}

int main(void)
{
    op_compare_require_device();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup_and_errors), cmocka_unit_test(test_unary),
        cmocka_unit_test(test_unary_int),         cmocka_unit_test(test_clip),
        cmocka_unit_test(test_cast),              cmocka_unit_test(test_binary),
        cmocka_unit_test(test_binary_int),        cmocka_unit_test(test_variadic),
        cmocka_unit_test(test_where_expand),      cmocka_unit_test(test_null_gradients),
        cmocka_unit_test(test_elementwise_bf16),  cmocka_unit_test(test_binary_bf16),
        cmocka_unit_test(test_gelu_gpt2),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (failed == 0)
        printf("cuda_elementwise: PASSED, %d ops (%d cases against the CPU kernels)\n", op_compare_op_types(),
               op_compare_cases());
    return failed ? 1 : 0;
}
