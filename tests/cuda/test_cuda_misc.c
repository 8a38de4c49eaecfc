/* The CUDA softmax, reduce, dropout and resize kernels (cuda/softmax.cu,
 * reduce.cu, dropout.cu, resize.cu) against the CPU float kernels, the
 * reference, through op_compare: forward outputs and every input gradient.
 *
 * Softmax / LogSoftmax: opset 13 (one axis) and 11 (flattened rows), every
 * axis, GPT-2-like rows of 50304 (the float4 block-per-row path), odd long
 * rows (scalar block path), short rows (warp per row), strided vectors.
 * Reductions: all seven, axes as an attribute and as an input, keepdims,
 * noop_with_empty_axes, reduce-all, each launch layout (thread, warp and
 * block per cell), ties (Max/Min split the gradient), NaN, zeros (Prod),
 * integer data. ArgMax / ArgMin: every axis, keepdims, select_last_index,
 * ties and NaN, float and int64, the warp-per-slot path. Dropout: opsets 7
 * (float mask), 10, 12, 13; the ratio as attribute or constant input,
 * training_mode constant or computed (read on the device); training, evaluation, ratio 0, mode false; the
 * masks must match the CPU's element for element (the same Philox key:
 * op_compare runs both with seed 1234, step 7, sample_offset 3). Resize
 * and Upsample: every coordinate transformation and nearest mode, linear
 * in 2 and 3 axes, scales and sizes, Resize-18's axes and aspect policy,
 * tf_crop_and_resize with extrapolation, integer data, large tensors.
 *
 * bf16: the same kernels read and write bfloat16 themselves (bf16_any).
 * Each family again with bfloat16 activations (all float tensors bfloat16)
 * and with the mixes the executor hands them (a float32 constant or
 * parameter among activations, a float32 gradient, a float32 output), so
 * that both the bfloat16 and the mixed-storage kernels run; every case
 * starts from a nonzero input gradient (op_compare checks +=). Pad's
 * float32 cases are in test_cuda_shape.c; its bf16 ones are here.
 *
 * Without a CUDA device the test prints why and exits 77 (a skip). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_test_util.h"
#include "cuda/op_compare.h"
#include "kernel_graph.h"

#define I64(...) ((const int64_t[]){__VA_ARGS__})
#define F32(...) ((const float[]){__VA_ARGS__})

static struct gp_shape shp(int rank, const int64_t *dims)
{
    struct gp_shape s = {.rank = rank};
    for (int i = 0; i < rank; i++) s.dims[i] = dims[i];
    return s;
}

static void input_dt(struct gp_graph *g, const char *name, enum gp_dtype dt, int rank, const int64_t *dims)
{
    struct gp_error err = {0};
    struct gp_shape s = shp(rank, dims);
    if (gp_graph_add_input(g, name, dt, &s, &err) != GP_OK) fail_msg("%s", err.msg);
}

static void ci64(struct gp_graph *g, const char *name, int rank, const int64_t *dims, const int64_t *v)
{
    struct gp_error err = {0};
    struct gp_shape s = shp(rank, dims);
    if (gp_graph_add_const_i64(g, name, &s, v, &err) != GP_OK) fail_msg("%s", err.msg);
}

static void cf32(struct gp_graph *g, const char *name, int rank, const int64_t *dims, const float *v)
{
    struct gp_error err = {0};
    struct gp_shape s = shp(rank, dims);
    if (gp_graph_add_const_f32(g, name, &s, v, &err) != GP_OK) fail_msg("%s", err.msg);
}

static void cbool(struct gp_graph *g, const char *name, bool v)
{
    struct gp_error err = {0};
    struct gp_shape s = {.rank = 0};
    struct gp_tensor *t = gp_graph_new_tensor(g, GP_DTYPE_BOOL, &s);
    assert_non_null(t);
    gp_tensor_set_f64(t, 0, v);
    if (gp_graph_add_initializer(g, name, t, &err) != GP_OK) fail_msg("%s", err.msg);
}

static void attr_floats(struct gp_graph *g, int n, const char *name, int count, const float *v)
{
    struct gp_attr *a = attr(g, n, name, GP_ATTR_FLOATS);
    a->count = count;
    a->floats = gp_arena_memdup(&g->arena, v, sizeof *v * (size_t)count);
}

static int64_t numel(int rank, const int64_t *dims)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= dims[i];
    return n;
}

/* Set by the bf16 tests: bfloat16 storage on the CUDA side, and per case
 * the inputs whose gradients are float32 (parameters) and the inputs and
 * outputs stored as float32 (op_compare.h). */
#define IN(k) (1u << (k))
static struct {
    bool on;
    uint32_t params, f32_inputs, f32_outputs;
} bf16_mode;

static void bf16_set(uint32_t params, uint32_t f32_inputs, uint32_t f32_outputs)
{
    bf16_mode.on = true;
    bf16_mode.params = params;
    bf16_mode.f32_inputs = f32_inputs;
    bf16_mode.f32_outputs = f32_outputs;
}

static void bf16_off(void) { memset(&bf16_mode, 0, sizeof bf16_mode); }

/* Node 0 of g through op_compare, in the bf16 mode set (the label says
 * which). */
static void compare(const struct gp_graph *g, struct op_compare o)
{
    char label[256];
    if (bf16_mode.on) {
        snprintf(label, sizeof label, "%s (bf16; parameters 0x%x, float32 inputs 0x%x, outputs 0x%x)",
                 o.label ? o.label : g->nodes[0].op_type, bf16_mode.params, bf16_mode.f32_inputs,
                 bf16_mode.f32_outputs);
        o.label = label;
        o.bf16 = true;
        o.params = bf16_mode.params;
        o.f32_inputs = bf16_mode.f32_inputs;
        o.f32_outputs = bf16_mode.f32_outputs;
    }
    op_compare_node(g, 0, &o);
}

/* The storage mixes a one-input op's bf16 cases run: all bfloat16; X a
 * float32 constant; X a parameter read directly (float32, its gradient
 * too); a float32 gradient of a bfloat16 X; a float32 Y. */
static const struct {
    uint32_t params, f32_inputs, f32_outputs;
} mixes[] = {{0, 0, 0}, {0, IN(0), 0}, {IN(0), IN(0), 0}, {IN(0), 0, 0}, {0, 0, IN(0)}};

/* ---- Softmax, LogSoftmax ---- */

#define NO_AXIS INT64_MIN

static void softmax_case(const char *op, int opset, int rank, const int64_t *dims, int64_t axis)
{
    struct gp_graph g;
    begin(&g, opset);
    input(&g, "x", rank, dims);
    int n = node(&g, op, 1, S("x"), 1, S("y"));
    if (axis != NO_AXIS) attr_i(&g, n, "axis", axis);
    finalize_ok(&g);
    char label[128];
    snprintf(label, sizeof label, "%s-%d rank %d [%lld, ...] axis %lld", op, opset, rank,
             (long long)dims[0], (long long)(axis == NO_AXIS ? -99 : axis));
    compare(&g, (struct op_compare){.label = label});
    gp_graph_free(&g);
}

static void test_softmax(void **state)
{
    (void)state;
    static const char *const ops[] = {"Softmax", "LogSoftmax"};
    for (int k = 0; k < 2; k++) {
        /* Every axis of [2, 3, 4] in both opsets, and the defaults. */
        for (int opset = 11; opset <= 13; opset += 2) {
            for (int64_t axis = -1; axis < 3; axis++) softmax_case(ops[k], opset, 3, I64(2, 3, 4), axis);
            softmax_case(ops[k], opset, 3, I64(2, 3, 4), NO_AXIS);
        }
        softmax_case(ops[k], 13, 2, I64(4, 50304), -1);    /* GPT-2's vocabulary: float4 rows */
        softmax_case(ops[k], 13, 2, I64(3, 50301), -1);    /* odd length: scalar rows */
        softmax_case(ops[k], 13, 2, I64(5, 2000), 1);      /* block of 256 */
        softmax_case(ops[k], 13, 2, I64(37, 1000), -1);    /* a warp per row */
        softmax_case(ops[k], 13, 2, I64(1000, 7), -1);     /* many short rows */
        softmax_case(ops[k], 13, 3, I64(3, 1500, 5), 1);   /* strided, long */
        softmax_case(ops[k], 13, 4, I64(2, 3, 4, 5), 1);   /* strided */
        softmax_case(ops[k], 11, 4, I64(2, 3, 40, 50), 1); /* coerced rows of 6000 */
        softmax_case(ops[k], 13, 3, I64(6000, 4, 50), -1); /* 24000 rows: the grid loops */
    }
    /* Large values: (x - max) stays exact; huge negative ones underflow to
     * exp 0 (op_compare cannot compare infinities: inf - inf is NaN). */
    float big[3 * 40];
    for (int i = 0; i < 40; i++) big[i] = 10000.0f + (float)(i % 4);
    for (int i = 40; i < 80; i++) big[i] = i % 2 ? -1e30f : -1.0f;
    for (int i = 80; i < 120; i++) big[i] = -1e30f;
    for (int k = 0; k < 2; k++) {
        struct gp_graph g;
        begin(&g, 13);
        input(&g, "x", 2, I64(3, 40));
        node(&g, ops[k], 1, S("x"), 1, S("y"));
        finalize_ok(&g);
        compare(&g, (struct op_compare){.label = "softmax of large values", .inputs = {big}});
        gp_graph_free(&g);
    }
}

/* Softmax and LogSoftmax in bfloat16: every layout (strided, a warp per
 * row, blocks with and without vectors; the attention scores of GPT-2 are
 * rows of 1024, a warp each) in each storage mix. */
static void test_softmax_bf16(void **state)
{
    (void)state;
    static const char *const ops[] = {"Softmax", "LogSoftmax"};
    for (int k = 0; k < 2; k++) {
        for (int m = 0; m < N_OF(mixes); m++) {
            bf16_set(mixes[m].params, mixes[m].f32_inputs, mixes[m].f32_outputs);
            softmax_case(ops[k], 13, 3, I64(2, 3, 4), -1);
            softmax_case(ops[k], 13, 3, I64(2, 3, 4), 0);      /* strided */
            softmax_case(ops[k], 11, 3, I64(2, 3, 4), 1);      /* coerced rows */
            softmax_case(ops[k], 13, 4, I64(2, 3, 16, 1024), -1); /* attention: a warp per row */
            softmax_case(ops[k], 13, 2, I64(37, 1000), -1);
            softmax_case(ops[k], 13, 2, I64(4, 50304), -1);    /* vectors of 4 */
            softmax_case(ops[k], 13, 2, I64(3, 50301), -1);    /* odd length: scalar rows */
            softmax_case(ops[k], 13, 3, I64(3, 1500, 5), 1);   /* strided, long */
        }
    }
    bf16_set(0, 0, 0);
    softmax_case("Softmax", 13, 3, I64(6000, 4, 50), -1);      /* the grid loops */
    bf16_off();
}

/* ---- reductions ---- */

static bool axes_by_input(const char *op, int opset)
{
    return strcmp(op, "ReduceSum") == 0 ? opset >= 13 : opset >= 18;
}

/* A reduction of x [dims]: axes (n_axes < 0: none) as the attribute or the
 * input, as the opset has it; keepdims / noop < 0: absent. */
static void build_reduce(struct gp_graph *g, const char *op, int opset, int rank, const int64_t *dims,
                         int n_axes, const int64_t *axes, int64_t keepdims, int64_t noop, enum gp_dtype dt)
{
    begin(g, opset);
    input_dt(g, "x", dt, rank, dims);
    int n;
    if (axes_by_input(op, opset) && n_axes >= 0) {
        ci64(g, "axes", 1, (int64_t[]){n_axes}, axes);
        n = node(g, op, 2, S("x", "axes"), 1, S("y"));
    } else {
        n = node(g, op, 1, S("x"), 1, S("y"));
        if (n_axes >= 0) attr_ints(g, n, "axes", n_axes, axes);
    }
    if (keepdims >= 0) attr_i(g, n, "keepdims", keepdims);
    if (noop >= 0) attr_i(g, n, "noop_with_empty_axes", noop);
    finalize_ok(g);
}

static const char *const reduce_ops[] = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin",
                                         "ReduceProd", "ReduceSumSquare", "ReduceL2"};

static void test_reductions(void **state)
{
    (void)state;
    static const struct {
        int rank;
        int64_t dims[4];
        int n_axes;
        int64_t axes[3];
        int64_t keepdims, noop;
        bool new_opset; /* axes as input (and noop) */
    } cases[] = {
        {3, {3, 5, 7}, 1, {1}, -1, -1, false},
        {3, {3, 5, 7}, 2, {0, 2}, 0, -1, true},
        {3, {3, 5, 7}, 2, {-1, 0}, 1, -1, false},
        {3, {3, 5, 7}, -1, {0}, 0, -1, false},  /* all axes */
        {3, {3, 5, 7}, -1, {0}, 1, -1, true},   /* all axes, input form without axes */
        {3, {3, 5, 7}, -1, {0}, 1, 1, true},    /* noop_with_empty_axes */
        {2, {64, 3000}, 1, {1}, 0, -1, true},   /* a block per cell */
        {2, {300, 500}, 1, {-1}, 1, -1, false}, /* a warp per cell */
        {2, {5000, 9}, 1, {0}, 0, -1, true},    /* a block per cell, strided */
        {2, {10, 3000}, 1, {0}, 0, -1, false},  /* a thread per cell */
        {4, {4, 6, 5, 3}, 2, {1, 3}, 1, -1, true},
        {4, {4, 6, 5, 3}, 3, {0, 2, 3}, 0, -1, false},
        {2, {3, 7}, 1, {0}, 1, -1, false},      /* count 3: thread per cell */
    };
    for (int k = 0; k < 7; k++) {
        const char *op = reduce_ops[k];
        bool is_sum = k == 0, is_prod = k == 4;
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            int opset = cases[c].new_opset ? (is_sum ? 13 : 18) : (is_sum ? 11 : 13);
            struct gp_graph g;
            build_reduce(&g, op, opset, cases[c].rank, cases[c].dims, cases[c].n_axes, cases[c].axes,
                         cases[c].keepdims, cases[c].noop, GP_DTYPE_FLOAT32);
            char label[128];
            snprintf(label, sizeof label, "%s-%d case %zu", op, opset, c);
            /* Prod over thousands of values stays in range near 1. */
            struct op_compare o = {.label = label};
            if (is_prod) o.lo = 0.95f, o.hi = 1.05f;
            compare(&g, o);
            gp_graph_free(&g);
        }
    }
}

/* Ties split Max/Min's gradient; a NaN wins; Prod with no, one and two
 * zeros in a cell. */
static void test_reduction_special(void **state)
{
    (void)state;
    enum { R = 6, C = 8 };
    static float ties[R * C], zeros[R * C];
    for (int i = 0; i < R * C; i++) {
        ties[i] = (float)((i * 7) % 3);
        zeros[i] = 0.5f + 0.125f * (float)(i % 5);
    }
    ties[2 * C + 3] = NAN;
    zeros[1 * C + 2] = 0;                        /* row 1: one zero */
    zeros[2 * C + 0] = zeros[2 * C + 5] = 0;     /* row 2: two */
    zeros[3 * C + 7] = 0;                        /* row 3: one, at the end */
    for (int ax = 0; ax < 2; ax++) {
        for (int k = 2; k <= 4; k++) {
            struct gp_graph g;
            build_reduce(&g, reduce_ops[k], 13, 2, I64(R, C), 1, (int64_t[]){ax}, 1, -1, GP_DTYPE_FLOAT32);
            char label[96];
            snprintf(label, sizeof label, "%s axis %d with %s", reduce_ops[k], ax, k == 4 ? "zeros" : "ties");
            compare(&g, (struct op_compare){.label = label, .inputs = {k == 4 ? zeros : ties}});
            gp_graph_free(&g);
        }
    }
    /* Many ties in long rows: the warp and block layouts count them. */
    enum { LR = 5, LC = 3001 };
    static float lt[LR * LC];
    for (int i = 0; i < LR * LC; i++) lt[i] = (float)((i * 13) % 4);
    for (int k = 2; k <= 3; k++) {
        struct gp_graph g;
        build_reduce(&g, reduce_ops[k], 13, 2, I64(LR, LC), 1, I64(1), 0, -1, GP_DTYPE_FLOAT32);
        compare(&g, (struct op_compare){.label = "long rows of ties", .inputs = {lt}});
        gp_graph_free(&g);
    }
    /* Integer data: wrapping sums, truncating Mean (forward only). */
    static int64_t xi[4 * 9];
    static int32_t xi32[4 * 9];
    for (int i = 0; i < 36; i++) xi[i] = xi32[i] = (i * 37) % 23 - 11;
    for (int k = 0; k < 7; k++) {
        for (int t = 0; t < 2; t++) {
            struct gp_graph g;
            build_reduce(&g, reduce_ops[k], 13, 2, I64(4, 9), 1, I64(1), 0, -1,
                         t ? GP_DTYPE_INT32 : GP_DTYPE_INT64);
            char label[96];
            snprintf(label, sizeof label, "%s of %s", reduce_ops[k], t ? "int32" : "int64");
            compare(&g, (struct op_compare){.label = label, .forward_only = true,
                                                        .inputs = {t ? (const void *)xi32 : (const void *)xi}});
            gp_graph_free(&g);
        }
    }
}

/* The reductions in bfloat16: each of the seven in each launch layout, in
 * each storage mix; ties, NaN and zeros (their statistics in double from
 * the widened data). */
static void test_reductions_bf16(void **state)
{
    (void)state;
    static const struct {
        int rank;
        int64_t dims[4];
        int n_axes;
        int64_t axes[3];
        int64_t keepdims;
        bool new_opset;
    } cases[] = {
        {3, {3, 5, 7}, 2, {0, 2}, 0, true},    /* a thread per cell */
        {3, {3, 5, 7}, -1, {0}, 0, false},     /* all axes */
        {2, {64, 3000}, 1, {1}, 0, true},      /* a block per cell */
        {2, {300, 500}, 1, {-1}, 1, false},    /* a warp per cell */
        {2, {5000, 9}, 1, {0}, 0, true},       /* a block per cell, strided */
        {4, {4, 6, 5, 3}, 2, {1, 3}, 1, true}, /* broadcast back over two axes */
    };
    for (int m = 0; m < N_OF(mixes); m++) {
        bf16_set(mixes[m].params, mixes[m].f32_inputs, mixes[m].f32_outputs);
        for (int k = 0; k < 7; k++) {
            const char *op = reduce_ops[k];
            bool is_sum = k == 0;
            for (int c = 0; c < N_OF(cases); c++) {
                int opset = cases[c].new_opset ? (is_sum ? 13 : 18) : (is_sum ? 11 : 13);
                struct gp_graph g;
                build_reduce(&g, op, opset, cases[c].rank, cases[c].dims, cases[c].n_axes, cases[c].axes,
                             cases[c].keepdims, -1, GP_DTYPE_FLOAT32);
                char label[128];
                snprintf(label, sizeof label, "%s-%d case %d", op, opset, c);
                struct op_compare o = {.label = label};
                if (k == 4) o.lo = 0.95f, o.hi = 1.05f;
                compare(&g, o);
                gp_graph_free(&g);
            }
        }
    }
    bf16_set(0, 0, 0);
    test_reduction_special(state); /* ties, NaN, zeros; integer data as ever */
    bf16_set(IN(0), IN(0), 0);
    test_reduction_special(state);
    bf16_off();
}

/* ---- ArgMax, ArgMin ---- */

static void arg_case(const char *op, int rank, const int64_t *dims, int64_t axis, int64_t keepdims,
                     int64_t last, enum gp_dtype dt, const void *data)
{
    struct gp_graph g;
    begin(&g, 13);
    input_dt(&g, "x", dt, rank, dims);
    int n = node(&g, op, 1, S("x"), 1, S("y"));
    attr_i(&g, n, "axis", axis);
    if (keepdims >= 0) attr_i(&g, n, "keepdims", keepdims);
    if (last >= 0) attr_i(&g, n, "select_last_index", last);
    finalize_ok(&g);
    char label[128];
    snprintf(label, sizeof label, "%s [%lld, ..] axis %lld keepdims %lld last %lld", op, (long long)dims[0],
             (long long)axis, (long long)keepdims, (long long)last);
    compare(&g, (struct op_compare){.label = label, .inputs = {data}, .forward_only = true});
    gp_graph_free(&g);
}

static void test_argmax(void **state)
{
    (void)state;
    static const char *const ops[] = {"ArgMax", "ArgMin"};
    static float small[3 * 5 * 7], big[16 * 1000], nans[4 * 100];
    static int64_t ints[6 * 100];
    for (int i = 0; i < 105; i++) small[i] = (float)((i * 7) % 4);
    for (int i = 0; i < 16000; i++) big[i] = (float)((i * 13) % 50) * 0.5f;
    for (int i = 0; i < 400; i++) nans[i] = (float)((i * 11) % 9);
    nans[37] = nans[41] = NAN;    /* row 0: the first NaN is the answer */
    nans[100 + 99] = NAN;         /* row 1: the last element */
    nans[300 + 0] = NAN;          /* row 3: the first */
    for (int i = 0; i < 600; i++) ints[i] = (i * 29) % 17 - 8;
    for (int k = 0; k < 2; k++) {
        for (int64_t axis = -1; axis < 3; axis++)
            for (int keep = 0; keep < 2; keep++)
                for (int last = 0; last < 2; last++)
                    arg_case(ops[k], 3, I64(3, 5, 7), axis, keep, last, GP_DTYPE_FLOAT32, small);
        arg_case(ops[k], 3, I64(3, 5, 7), 1, -1, -1, GP_DTYPE_FLOAT32, NULL); /* random, defaults */
        for (int last = 0; last < 2; last++) {
            arg_case(ops[k], 2, I64(16, 1000), 1, 0, last, GP_DTYPE_FLOAT32, big); /* warp per slot */
            arg_case(ops[k], 2, I64(16, 1000), 0, 1, last, GP_DTYPE_FLOAT32, big);
            arg_case(ops[k], 2, I64(4, 100), 1, 1, last, GP_DTYPE_FLOAT32, nans);
            arg_case(ops[k], 2, I64(100, 4), 0, 1, last, GP_DTYPE_FLOAT32, nans);
            arg_case(ops[k], 2, I64(6, 100), 1, 0, last, GP_DTYPE_INT64, ints);
            arg_case(ops[k], 2, I64(6, 100), 0, 0, last, GP_DTYPE_INT64, ints);
        }
    }
}

/* ArgMax and ArgMin of bfloat16 data (int64 indices): the thread and warp
 * layouts, ties (the data are exact in bfloat16) and NaN. */
static void test_argmax_bf16(void **state)
{
    (void)state;
    bf16_set(0, 0, 0);
    test_argmax(state);
    bf16_off();
}

/* ---- Dropout ---- */

/* The ratio: absent, or a constant (the loader requires one); the
 * training_mode: absent, a constant, or computed (a graph input whose
 * value op_compare uploads: the kernel reads it on the device). */
enum { MODE_NONE = -1, MODE_FALSE = 0, MODE_TRUE = 1, MODE_INPUT_FALSE = 2, MODE_INPUT_TRUE = 3 };

/* Set by test_dropout_nhwc: X, Y and their gradients channels-last on the
 * CUDA side (rank 4), dX written whole. */
static bool dropout_nhwc;

static void dropout_case(const char *label, int opset, int rank, const int64_t *dims, bool has_ratio,
                         float ratio, int mode, bool mask, bool eval)
{
    struct gp_graph g;
    begin(&g, opset);
    input(&g, "x", rank, dims);
    const char *ins[3] = {"x", "", ""};
    int ni = 1;
    bool mode_input = mode == MODE_INPUT_FALSE || mode == MODE_INPUT_TRUE;
    if (opset >= 12) {
        if (has_ratio) cf32(&g, "ratio", 0, NULL, (float[]){ratio});
        if (has_ratio) ins[1] = "ratio", ni = 2;
        if (mode == MODE_TRUE || mode == MODE_FALSE) cbool(&g, "mode", mode == MODE_TRUE);
        /* A graph input needs a batch axis: [1] stands for the scalar. */
        if (mode_input) input_dt(&g, "mode", GP_DTYPE_BOOL, 1, I64(1));
        if (mode != MODE_NONE) ins[2] = "mode", ni = 3;
    }
    int n = node(&g, "Dropout", ni, ins, mask ? 2 : 1, S("y", "mask"));
    if (opset < 12) attr_f(&g, n, "ratio", ratio);
    finalize_ok(&g);
    static const uint8_t no = 0, yes = 1;
    char nhwc_label[192];
    struct op_compare o = {.label = label, .eval = eval};
    if (mode_input) o.inputs[2] = mode == MODE_INPUT_TRUE ? &yes : &no;
    if (dropout_nhwc && rank == 4) {
        snprintf(nhwc_label, sizeof nhwc_label, "%s, channels-last", label);
        o.label = nhwc_label;
        o.nhwc_inputs = o.nhwc_outputs = 1;
        o.overwrite = 1;
        o.twice = true;
    }
    compare(&g, o);
    gp_graph_free(&g);
}

static void test_dropout(void **state)
{
    (void)state;
    const int64_t *d = I64(37, 53);
    for (int eval = 0; eval < 2; eval++) {
        dropout_case("Dropout-13 const ratio and mode", 13, 2, d, true, 0.3f, MODE_TRUE, true, eval);
        dropout_case("Dropout-13 no mode", 13, 2, d, true, 0.3f, MODE_NONE, true, eval);
        dropout_case("Dropout-13 mode false", 13, 2, d, true, 0.3f, MODE_FALSE, true, eval);
        dropout_case("Dropout-13 ratio 0", 13, 2, d, true, 0.0f, MODE_TRUE, true, eval);
        dropout_case("Dropout-13 computed mode true", 13, 2, d, true, 0.45f, MODE_INPUT_TRUE, true, eval);
        dropout_case("Dropout-13 computed mode false", 13, 2, d, true, 0.45f, MODE_INPUT_FALSE, true, eval);
        dropout_case("Dropout-13 no mask", 13, 3, I64(4, 9, 11), true, 0.2f, MODE_NONE, false, eval);
        dropout_case("Dropout-12 default ratio", 12, 2, d, false, 0, MODE_NONE, true, eval);
        dropout_case("Dropout-10 attribute", 10, 2, d, false, 0.6f, MODE_NONE, true, eval);
        dropout_case("Dropout-7 float mask", 7, 2, d, false, 0.25f, MODE_NONE, true, eval);
        dropout_case("Dropout-13 [300, 4000]", 13, 2, I64(300, 4000), true, 0.1f, MODE_NONE, true, eval);
    }
}

/* Dropout in bfloat16: training and evaluation, the bool mask and opset
 * 7's float mask (bfloat16 or float32), in each storage mix. Ratios are
 * exact in bfloat16: op_compare rounds the constant's data, which the CPU
 * reads, while CUDA reads the graph's constant. */
static void test_dropout_bf16(void **state)
{
    (void)state;
    const int64_t *d = I64(37, 53);
    for (int m = 0; m < N_OF(mixes); m++) {
        bf16_set(mixes[m].params, mixes[m].f32_inputs, mixes[m].f32_outputs);
        for (int eval = 0; eval < 2; eval++) {
            dropout_case("Dropout-13 const ratio and mode", 13, 2, d, true, 0.375f, MODE_TRUE, true, eval);
            dropout_case("Dropout-13 computed mode false", 13, 2, d, true, 0.25f, MODE_INPUT_FALSE, true, eval);
            dropout_case("Dropout-13 no mask", 13, 3, I64(4, 9, 11), true, 0.125f, MODE_NONE, false, eval);
            dropout_case("Dropout-7 float mask", 7, 2, d, false, 0.25f, MODE_NONE, true, eval);
            dropout_case("Dropout-13 [300, 4000]", 13, 2, I64(300, 4000), true, 0.5f, MODE_NONE, true, eval);
        }
    }
    bf16_set(0, 0, IN(1)); /* a float32 float mask beside a bfloat16 Y */
    dropout_case("Dropout-7 float mask", 7, 2, d, false, 0.25f, MODE_NONE, true, false);
    bf16_off();
}

/* Channels-last (graph/layout.h): X, Y, dY, dX [N, H, W, C] on the CUDA
 * side, the mask [N, C, H, W] (it is never tagged), dX written whole;
 * each element's draw is its [N, C, H, W] position's, so masks and values
 * equal the CPU's. Shapes: runs of 4, 2 and 1 channels over cells taken
 * 4 at a time (W a multiple of 4), and W = 7 and 5 (a Philox block per
 * element; op_compare's mini-batch offset of 3 samples puts element 0 at
 * an index that is not a multiple of 4), in float32 and every bfloat16
 * mix; opset 7's float mask. */
static void test_dropout_nhwc(void **state)
{
    (void)state;
    dropout_nhwc = true;
    static const int64_t shapes[][4] = {{2, 8, 6, 8}, {3, 6, 5, 12}, {2, 5, 3, 4}, {2, 4, 5, 7}, {1, 16, 3, 5}};
    for (int m = -1; m < N_OF(mixes); m++) {
        if (m >= 0) bf16_set(mixes[m].params, mixes[m].f32_inputs, mixes[m].f32_outputs);
        for (int k = 0; k < N_OF(shapes); k++)
            for (int eval = 0; eval < 2; eval++) {
                dropout_case("Dropout-13 [N, C, H, W]", 13, 4, shapes[k], true, 0.375f, MODE_NONE, true, eval);
                dropout_case("Dropout-13 computed mode", 13, 4, shapes[k], true, 0.25f, MODE_INPUT_TRUE, false,
                             eval);
            }
        dropout_case("Dropout-7 float mask", 7, 4, shapes[0], false, 0.25f, MODE_NONE, true, false);
        dropout_case("Dropout-7 float mask", 7, 4, shapes[3], false, 0.25f, MODE_NONE, true, false);
    }
    bf16_off();
    dropout_nhwc = false;
}

/* ---- Resize, Upsample ---- */

struct rs_case {
    const char *label;
    const char *op; /* NULL: Resize */
    int opset;
    int rank;
    int64_t x[8];
    const char *mode, *coords, *nearest; /* NULL: absent */
    int n_scales;
    float scales[8];
    int n_sizes;
    int64_t sizes[5];
    int n_axes;
    int64_t axes[5];
    const char *policy;
    bool roi;
    enum gp_dtype dt; /* 0: float32 */
};

/* Set by test_resize_nhwc: X, Y and their gradients channels-last on the
 * CUDA side (rank-4 float cases). */
static bool resize_nhwc;

static void resize_case(const struct rs_case *c)
{
    struct gp_graph g;
    begin(&g, c->opset);
    enum gp_dtype dt = c->dt ? c->dt : GP_DTYPE_FLOAT32;
    input_dt(&g, "x", dt, c->rank, c->x);
    bool upsample = c->op && strcmp(c->op, "Upsample") == 0;
    int n;
    if (upsample && c->opset < 9) {
        n = node(&g, "Upsample", 1, S("x"), 1, S("y"));
        attr_floats(&g, n, "scales", c->n_scales, c->scales);
    } else if (upsample || c->opset < 11) {
        cf32(&g, "scales", 1, (int64_t[]){c->n_scales}, c->scales);
        n = node(&g, c->op ? c->op : "Resize", 2, S("x", "scales"), 1, S("y"));
    } else {
        int r2 = 2 * (c->n_axes ? c->n_axes : c->rank);
        if (c->roi) {
            float roi[16];
            /* starts then ends: the outer axes whole, the inner ones cropped past the edges. */
            for (int k = 0; k < r2 / 2; k++) {
                bool inner = k >= r2 / 2 - 2;
                roi[k] = inner ? (k % 2 ? -0.1f : 0.2f) : 0.0f;
                roi[r2 / 2 + k] = inner ? (k % 2 ? 0.8f : 1.3f) : 1.0f;
            }
            cf32(&g, "roi", 1, (int64_t[]){r2}, roi);
        } else if (c->opset == 11) {
            cf32(&g, "roi", 1, I64(0), NULL);
        }
        if (c->n_scales) cf32(&g, "scales", 1, (int64_t[]){c->n_scales}, c->scales);
        else if (c->opset == 11) cf32(&g, "scales", 1, I64(0), NULL);
        if (c->n_sizes) ci64(&g, "sizes", 1, (int64_t[]){c->n_sizes}, c->sizes);
        const char *roi = c->roi || c->opset == 11 ? "roi" : "";
        const char *scales = c->n_scales || c->opset == 11 ? "scales" : "";
        n = c->n_sizes ? node(&g, "Resize", 4, S("x", roi, scales, "sizes"), 1, S("y"))
                       : node(&g, "Resize", 3, S("x", roi, scales), 1, S("y"));
        if (c->coords) attr_s(&g, n, "coordinate_transformation_mode", c->coords);
        if (c->nearest) attr_s(&g, n, "nearest_mode", c->nearest);
        if (c->roi) attr_f(&g, n, "extrapolation_value", 10.0f);
        if (c->n_axes) attr_ints(&g, n, "axes", c->n_axes, c->axes);
        if (c->policy) attr_s(&g, n, "keep_aspect_ratio_policy", c->policy);
    }
    if (c->mode) attr_s(&g, n, "mode", c->mode);
    finalize_ok(&g);
    char nhwc_label[160];
    struct op_compare o = {.label = c->label};
    if (resize_nhwc && c->rank == 4 && dt == GP_DTYPE_FLOAT32) {
        snprintf(nhwc_label, sizeof nhwc_label, "%s, channels-last", c->label);
        o.label = nhwc_label;
        o.nhwc_inputs = o.nhwc_outputs = 1;
        o.twice = true;
    }
    int64_t *ints = NULL;
    if (dt != GP_DTYPE_FLOAT32) {
        int64_t ne = numel(c->rank, c->x);
        ints = malloc(sizeof(int64_t) * (size_t)ne);
        assert_non_null(ints);
        for (int64_t i = 0; i < ne; i++) ints[i] = i * 7 - 30;
        o.inputs[0] = ints;
        o.forward_only = true;
    }
    compare(&g, o);
    free(ints);
    gp_graph_free(&g);
}

#define X4 4, {2, 3, 5, 7}

static const struct rs_case rs_cases[] = {
    {"2x nearest (nn.Upsample): asymmetric, floor", NULL, 13, X4, "nearest", "asymmetric", "floor",
     4, {1, 1, 2, 2}},
    {"nearest, default modes", NULL, 13, X4, NULL, NULL, NULL, 4, {1, 1, 2, 2}},
    {"nearest round_prefer_ceil, down and up", NULL, 13, X4, "nearest", "half_pixel",
     "round_prefer_ceil", 4, {1, 1, 1.5f, 0.5f}},
    {"nearest align_corners ceil", NULL, 13, X4, "nearest", "align_corners", "ceil", 4,
     {1, 1, 0.6f, 1.7f}},
    {"nearest pytorch_half_pixel floor", NULL, 13, X4, "nearest", "pytorch_half_pixel", "floor", 4,
     {1, 1, 2.5f, 0.3f}},
    {"nearest tf_half_pixel_for_nn (11)", NULL, 11, X4, "nearest", "tf_half_pixel_for_nn", NULL, 4,
     {1, 1, 2, 3}},
    {"linear half_pixel 2x", NULL, 13, X4, "linear", NULL, NULL, 4, {1, 1, 2, 2}},
    {"linear align_corners", NULL, 13, X4, "linear", "align_corners", NULL, 4, {1, 1, 1.7f, 0.6f}},
    {"linear pytorch_half_pixel", NULL, 13, X4, "linear", "pytorch_half_pixel", NULL, 4,
     {1, 1, 0.5f, 2}},
    {"linear asymmetric", NULL, 13, X4, "linear", "asymmetric", NULL, 4, {1, 1, 3, 1}},
    {"linear half_pixel_symmetric (19)", NULL, 19, X4, "linear", "half_pixel_symmetric", NULL, 4,
     {1, 1, 1.7f, 2.3f}},
    {"linear tf_crop_and_resize", NULL, 13, X4, "linear", "tf_crop_and_resize", NULL, 4,
     {1, 1, 2, 2}, .roi = true},
    {"nearest tf_crop_and_resize", NULL, 13, X4, "nearest", "tf_crop_and_resize", NULL, 4,
     {1, 1, 1.6f, 2}, .roi = true},
    {"linear to sizes", NULL, 13, X4, "linear", NULL, NULL, 0, {0}, 4, {2, 3, 9, 4}},
    {"Resize-18 axes, not_larger", NULL, 18, X4, "nearest", NULL, NULL, 0, {0}, 2, {9, 20}, 2,
     {2, 3}, "not_larger"},
    {"Resize-18 axes, not_smaller, linear", NULL, 18, X4, "linear", NULL, NULL, 0, {0}, 2, {9, 20},
     2, {-2, -1}, "not_smaller"},
    {"nearest over channels", NULL, 13, X4, "nearest", "asymmetric", "floor", 4, {1, 2, 1, 1}},
    {"identity linear", NULL, 13, X4, "linear", NULL, NULL, 4, {1, 1, 1, 1}},
    {"Upsample-7", "Upsample", 7, X4, "nearest", NULL, NULL, 4, {1, 1, 2, 3}},
    {"Upsample-9 linear", "Upsample", 9, X4, "linear", NULL, NULL, 4, {1, 1, 2, 2}},
    {"Resize-10 nearest", NULL, 10, X4, "nearest", NULL, NULL, 4, {1, 1, 3, 0.5f}},
    {"trilinear 5-D", NULL, 13, 5, {1, 2, 3, 4, 5}, "linear", NULL, NULL, 5, {1, 1, 2, 1.5f, 0.5f}},
    /* 40x along H: more output rows read an input row than the row
     * kernel's backward holds (its per-element fallback). */
    {"linear 40x along H", NULL, 13, 4, {1, 2, 3, 4}, "linear", "align_corners", NULL, 4,
     {1, 1, 40, 1}},
    /* 8 resized axes: 128 corners before the last, the generic kernels. */
    {"linear over 8 axes", NULL, 13, 8, {2, 2, 2, 2, 2, 2, 2, 3}, "linear", NULL, NULL, 8,
     {1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 2}},
    {"nearest over 8 axes", NULL, 13, 8, {2, 2, 2, 2, 2, 2, 2, 3}, "nearest", NULL, NULL, 8,
     {1.5f, 2, 1.5f, 0.5f, 1.5f, 1.5f, 1.5f, 2}},
    {"large nearest 2x", NULL, 13, 4, {4, 16, 64, 64}, "nearest", "asymmetric", "floor", 4,
     {1, 1, 2, 2}},
    {"large linear 2x", NULL, 13, 4, {4, 16, 64, 64}, "linear", "half_pixel", NULL, 4, {1, 1, 2, 2}},
    {"int64 nearest", NULL, 13, 4, {1, 2, 3, 4}, "nearest", "asymmetric", "floor", 4, {1, 1, 2, 1.5f},
     .dt = GP_DTYPE_INT64},
    {"int64 nearest tf_crop_and_resize", NULL, 13, 4, {1, 2, 3, 4}, "nearest", "tf_crop_and_resize",
     NULL, 4, {1, 1, 2, 2}, .roi = true, .dt = GP_DTYPE_INT64},
};

static void test_resize(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof rs_cases / sizeof *rs_cases; k++) resize_case(&rs_cases[k]);
}

/* Resize and Upsample in bfloat16: nearest (U-Net's 2x) and linear, the
 * row kernels and the generic ones (8 axes), the backward's per-element
 * fallback, extrapolation, in each storage mix. */
static void test_resize_bf16(void **state)
{
    (void)state;
    static const struct rs_case cases[] = {
        {"2x nearest (nn.Upsample): asymmetric, floor", NULL, 13, X4, "nearest", "asymmetric", "floor",
         4, {1, 1, 2, 2}},
        {"nearest round_prefer_ceil, down and up", NULL, 13, X4, "nearest", "half_pixel",
         "round_prefer_ceil", 4, {1, 1, 1.5f, 0.5f}},
        {"linear half_pixel 2x", NULL, 13, X4, "linear", NULL, NULL, 4, {1, 1, 2, 2}},
        {"linear align_corners", NULL, 13, X4, "linear", "align_corners", NULL, 4, {1, 1, 1.75f, 0.625f}},
        {"linear tf_crop_and_resize", NULL, 13, X4, "linear", "tf_crop_and_resize", NULL, 4,
         {1, 1, 2, 2}, .roi = true},
        {"linear to sizes", NULL, 13, X4, "linear", NULL, NULL, 0, {0}, 4, {2, 3, 9, 4}},
        {"Upsample-7", "Upsample", 7, X4, "nearest", NULL, NULL, 4, {1, 1, 2, 3}},
        {"Upsample-9 linear", "Upsample", 9, X4, "linear", NULL, NULL, 4, {1, 1, 2, 2}},
        {"trilinear 5-D", NULL, 13, 5, {1, 2, 3, 4, 5}, "linear", NULL, NULL, 5, {1, 1, 2, 1.5f, 0.5f}},
        {"identity linear", NULL, 13, X4, "linear", NULL, NULL, 4, {1, 1, 1, 1}},
        {"linear 40x along H", NULL, 13, 4, {1, 2, 3, 4}, "linear", "align_corners", NULL, 4,
         {1, 1, 40, 1}},
        {"linear over 8 axes", NULL, 13, 8, {2, 2, 2, 2, 2, 2, 2, 3}, "linear", NULL, NULL, 8,
         {1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 2}},
        {"nearest over 8 axes", NULL, 13, 8, {2, 2, 2, 2, 2, 2, 2, 3}, "nearest", NULL, NULL, 8,
         {1.5f, 2, 1.5f, 0.5f, 1.5f, 1.5f, 1.5f, 2}},
        {"large nearest 2x", NULL, 13, 4, {4, 16, 64, 64}, "nearest", "asymmetric", "floor", 4,
         {1, 1, 2, 2}},
        {"large linear 2x", NULL, 13, 4, {4, 16, 64, 64}, "linear", "half_pixel", NULL, 4, {1, 1, 2, 2}},
    };
    /* Scales, roi and sizes are float constants: float32 in the executor
     * (read from the graph by both sides). */
    for (int m = 0; m < N_OF(mixes); m++) {
        for (int k = 0; k < N_OF(cases); k++) {
            bf16_set(mixes[m].params, mixes[m].f32_inputs | ~IN(0), mixes[m].f32_outputs);
            resize_case(&cases[k]);
        }
    }
    bf16_set(0, 0, 0); /* the constants bfloat16 too: the kernels do not read them on the device */
    resize_case(&cases[2]);
    bf16_off();
}

/* Channels-last (graph/layout.h): every rank-4 float case of
 * test_resize with X, Y and their gradients [N, H, W, C] on the CUDA side
 * (the kernels run the resize over the storage order of the axes), in
 * float32 and each bfloat16 mix. */
static void test_resize_nhwc(void **state)
{
    (void)state;
    resize_nhwc = true;
    for (int m = -1; m < N_OF(mixes); m++)
        for (int k = 0; k < N_OF(rs_cases); k++) {
            if (rs_cases[k].rank != 4 || rs_cases[k].dt) continue;
            if (m >= 0) bf16_set(mixes[m].params, mixes[m].f32_inputs | ~IN(0), mixes[m].f32_outputs);
            resize_case(&rs_cases[k]);
        }
    bf16_off();
    resize_nhwc = false;
}

/* ---- Pad (bfloat16; the float32 cases are in test_cuda_shape.c) ---- */

/* Pad-13 (19 for wrap) of x [dims]: pads a constant input, and a constant
 * value (-1.5, input 2) or none. */
static void pad_case(const char *label, int rank, const int64_t *dims, const char *mode, const int64_t *pads,
                     bool with_value)
{
    struct gp_graph g;
    begin(&g, strcmp(mode, "wrap") == 0 ? 19 : 13);
    input(&g, "x", rank, dims);
    ci64(&g, "pads", 1, I64(2 * rank), pads);
    int n;
    if (with_value) {
        cf32(&g, "v", 0, NULL, F32(-1.5f));
        n = node(&g, "Pad", 3, S("x", "pads", "v"), 1, S("y"));
    } else {
        n = node(&g, "Pad", 2, S("x", "pads"), 1, S("y"));
    }
    attr_s(&g, n, "mode", mode);
    finalize_ok(&g);
    compare(&g, (struct op_compare){.label = label});
    gp_graph_free(&g);
}

/* Every mode, crops, a value as a bfloat16 or float32 input and as Pad-2's
 * attribute (0.1: rounded into a bfloat16 Y), in each storage mix (the
 * value a constant: float32 in the executor). */
static void test_pad_bf16(void **state)
{
    (void)state;
    for (int m = 0; m < N_OF(mixes); m++) {
        bf16_set(mixes[m].params, mixes[m].f32_inputs | IN(2), mixes[m].f32_outputs);
        pad_case("Pad constant with value", 2, I64(2, 3), "constant", I64(0, 2, 0, 1), true);
        pad_case("Pad constant", 2, I64(2, 3), "constant", I64(1, 0, 2, 1), false);
        pad_case("Pad reflect", 2, I64(2, 3), "reflect", I64(1, 2, 1, 2), false);
        pad_case("Pad edge", 2, I64(2, 3), "edge", I64(1, 0, 0, 3), false);
        pad_case("Pad wrap", 2, I64(2, 3), "wrap", I64(0, 3, 1, 2), false);
        pad_case("Pad constant crop and pad", 2, I64(2, 3), "constant", I64(0, -1, 0, 1), false);
        pad_case("Pad reflect with a crop", 2, I64(3, 4), "reflect", I64(0, -1, 2, 2), false);
        pad_case("Pad reflect [4,8,180,181]", 4, I64(4, 8, 180, 181), "reflect", I64(0, 0, 2, 1, 0, 0, 3, 2),
                 false);
        pad_case("Pad edge [2,3,33,35] all axes", 4, I64(2, 3, 33, 35), "edge", I64(1, 0, 2, 3, 0, 1, 3, 2),
                 false);
        struct gp_graph g;
        begin(&g, 9);
        input(&g, "x", 4, I64(2, 3, 4, 5));
        int n = node(&g, "Pad", 1, S("x"), 1, S("y"));
        attr_ints(&g, n, "pads", 8, I64(0, 0, 1, 2, 0, 0, 2, 0));
        attr_f(&g, n, "value", 0.1f);
        finalize_ok(&g);
        compare(&g, (struct op_compare){.label = "Pad-2 attributes with value 0.1"});
        gp_graph_free(&g);
    }
    bf16_set(0, 0, 0); /* the value bfloat16 too (a computed one) */
    pad_case("Pad constant with a bfloat16 value", 2, I64(2, 3), "constant", I64(0, 2, 0, 1), true);
    bf16_set(0, 0, IN(0)); /* ... into a float32 Y */
    pad_case("Pad constant with a bfloat16 value", 2, I64(2, 3), "constant", I64(0, 2, 0, 1), true);
    bf16_set(0, IN(0), IN(0)); /* ... beside float32 X and Y */
    pad_case("Pad constant with a bfloat16 value", 2, I64(2, 3), "constant", I64(0, 2, 0, 1), true);
    bf16_off();
}

int main(void)
{
    op_compare_require_device();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_reductions),
        cmocka_unit_test(test_reduction_special),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_resize),
        cmocka_unit_test(test_softmax_bf16),
        cmocka_unit_test(test_reductions_bf16),
        cmocka_unit_test(test_argmax_bf16),
        cmocka_unit_test(test_dropout_bf16),
        cmocka_unit_test(test_dropout_nhwc),
        cmocka_unit_test(test_resize_nhwc),
        cmocka_unit_test(test_resize_bf16),
        cmocka_unit_test(test_pad_bf16),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (failed == 0)
        printf("cuda_misc: PASSED, %d ops (%d cases against the CPU kernels)\n", op_compare_op_types(),
               op_compare_cases());
    return failed ? 1 : 0;
}
