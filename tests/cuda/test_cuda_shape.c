/* The CUDA shape, gather and pad kernels (cuda/shape.cu, gather.cu, pad.cu)
 * against the CPU float kernels, the reference: one-node graphs through
 * op_compare (every output, every input gradient, gradients accumulated
 * onto random starting values).
 *
 * Covered: Reshape, Flatten, Squeeze and Unsqueeze (attribute and input
 * axes); Transpose (the tile path [2,3,65,67] (0,1,3,2), the row path
 * (0,2,1,3), the general gather (3,2,1,0), the default perm, a batch axis
 * between the tiled ones, int64 / bool / int32 elements); Concat and Split
 * along every axis (Split-11 attribute, Split-13 input, Split-18
 * num_outputs, even); Slice (Slice-1 attributes, Slice-10 without axes,
 * Slice-13 negative steps on every axis, INT64_MIN ends); Gather (an
 * embedding [50, 16] with [4, 33] indices with repeats and negative ones,
 * int32 indices, axes 1 and -1, a scalar index, int64 data, runs long
 * enough to take the two-level path, GPT-2's [50304, 768] table); Tile;
 * Trilu (upper, lower, k from input, none); Pad (constant with a value,
 * reflect, edge, wrap, crops, Pad-2 attributes, Pad-18 axes, int64 data);
 * and the shape producers that loading folds (Shape, Size,
 * ConstantOfShape, Range), run from the folded node. Several shapes hold
 * more than 2^20 elements so that the grid-stride loops go round.
 *
 * bfloat16 (the *_bf16 tests): every kernel of the shape and gather
 * families but Pad and Range, with bfloat16 activations, a float32
 * parameter as input 0, a bfloat16 input with a float32 gradient, and a
 * float32 output 0 (bf16_modes), forward and backward, gradients added
 * onto random values.
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

/* ---- graph helpers ---- */

static void input_t(struct gp_graph *g, const char *name, enum gp_dtype dt, int rank, const int64_t *dims)
{
    struct gp_error err = {0};
    struct gp_shape s = {.rank = rank};
    for (int i = 0; i < rank; i++) s.dims[i] = dims[i];
    if (gp_graph_add_input(g, name, dt, &s, &err) != GP_OK) fail_msg("%s", err.msg);
}

static void ci64(struct gp_graph *g, const char *name, int rank, const int64_t *dims, const int64_t *v)
{
    struct gp_error err = {0};
    struct gp_shape s = {.rank = rank};
    for (int i = 0; i < rank; i++) s.dims[i] = dims[i];
    if (gp_graph_add_const_i64(g, name, &s, v, &err) != GP_OK) fail_msg("%s", err.msg);
}

static void cf32(struct gp_graph *g, const char *name, int rank, const int64_t *dims, const float *v)
{
    struct gp_error err = {0};
    struct gp_shape s = {.rank = rank};
    for (int i = 0; i < rank; i++) s.dims[i] = dims[i];
    if (gp_graph_add_const_f32(g, name, &s, v, &err) != GP_OK) fail_msg("%s", err.msg);
}

/* Finalizes g, which must keep exactly the node under test, and compares it. */
static void compare(struct gp_graph *g, struct op_compare o)
{
    finalize_ok(g);
    if (g->n_nodes != 1) fail_msg("%s: the graph has %d nodes after loading, not 1", o.label, g->n_nodes);
    op_compare_node(g, 0, &o);
    gp_graph_free(g);
}

static int64_t numel(int rank, const int64_t *dims)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= dims[i];
    return n;
}

/* ---- Reshape, Flatten, Squeeze, Unsqueeze ---- */

static void test_copies(void **state)
{
    (void)state;
    struct gp_graph g;

    begin(&g, 14);
    input(&g, "x", 3, I64(2, 3, 4));
    ci64(&g, "shape", 1, I64(3), I64(4, 1, 6));
    node(&g, "Reshape", 2, S("x", "shape"), 1, S("y"));
    compare(&g, (struct op_compare){.label = "Reshape [2,3,4] -> [4,1,6]"});

    begin(&g, 14);
    input(&g, "x", 2, I64(4201, 1001)); /* float4 and a tail: the add loop goes round */
    ci64(&g, "shape", 1, I64(2), I64(1001, 4201));
    node(&g, "Reshape", 2, S("x", "shape"), 1, S("y"));
    compare(&g, (struct op_compare){.label = "Reshape [4201,1001]"});

    begin(&g, 14);
    input_t(&g, "x", GP_DTYPE_INT64, 2, I64(3, 5));
    ci64(&g, "shape", 1, I64(1), I64(15));
    node(&g, "Reshape", 2, S("x", "shape"), 1, S("y"));
    int64_t *xi = ints64(15, INT64_MIN / 2, INT64_MAX / 2);
    compare(&g, (struct op_compare){.label = "Reshape int64", .inputs = {xi}});
    free(xi);

    begin(&g, 13);
    input(&g, "x", 4, I64(2, 3, 4, 5));
    attr_i(&g, node(&g, "Flatten", 1, S("x"), 1, S("y")), "axis", 2);
    compare(&g, (struct op_compare){.label = "Flatten axis 2"});

    begin(&g, 13);
    input(&g, "x", 3, I64(2, 3, 4));
    node(&g, "Flatten", 1, S("x"), 1, S("y"));
    compare(&g, (struct op_compare){.label = "Flatten default axis"});

    begin(&g, 13);
    input(&g, "x", 4, I64(2, 1, 3, 1));
    ci64(&g, "axes", 1, I64(2), I64(1, -1));
    node(&g, "Squeeze", 2, S("x", "axes"), 1, S("y"));
    compare(&g, (struct op_compare){.label = "Squeeze-13 axes input"});

    begin(&g, 11);
    input(&g, "x", 3, I64(2, 1, 3));
    attr_ints(&g, node(&g, "Squeeze", 1, S("x"), 1, S("y")), "axes", 1, I64(1));
    compare(&g, (struct op_compare){.label = "Squeeze-11 axes attribute"});

    begin(&g, 13);
    input(&g, "x", 2, I64(2, 3));
    ci64(&g, "axes", 1, I64(2), I64(0, -1));
    node(&g, "Unsqueeze", 2, S("x", "axes"), 1, S("y"));
    compare(&g, (struct op_compare){.label = "Unsqueeze-13 axes input"});

    begin(&g, 11);
    input(&g, "x", 2, I64(2, 3));
    attr_ints(&g, node(&g, "Unsqueeze", 1, S("x"), 1, S("y")), "axes", 1, I64(1));
    compare(&g, (struct op_compare){.label = "Unsqueeze-11 axes attribute"});
}

/* ---- Transpose ---- */

static void transpose_case_o(struct op_compare o, enum gp_dtype dt, int rank, const int64_t *dims,
                             const int64_t *perm)
{
    struct gp_graph g;
    begin(&g, 13);
    input_t(&g, "x", dt, rank, dims);
    int n = node(&g, "Transpose", 1, S("x"), 1, S("y"));
    if (perm) attr_ints(&g, n, "perm", rank, perm);
    int64_t count = numel(rank, dims);
    void *data = NULL;
    if (dt == GP_DTYPE_INT64) data = ints64(count, -1000000, 1000000);
    else if (dt == GP_DTYPE_INT32) data = ints32(count, -100000, 100000);
    else if (dt == GP_DTYPE_BOOL) data = bools(count, 2);
    o.inputs[0] = data;
    compare(&g, o);
    free(data);
}

static void transpose_case(const char *label, enum gp_dtype dt, int rank, const int64_t *dims,
                           const int64_t *perm)
{
    transpose_case_o((struct op_compare){.label = label}, dt, rank, dims, perm);
}

static void test_transpose(void **state)
{
    (void)state;
    transpose_case("Transpose [2,3,65,67] (0,1,3,2): tiles", GP_DTYPE_FLOAT32, 4, I64(2, 3, 65, 67),
                   I64(0, 1, 3, 2));
    transpose_case("Transpose [2,3,65,67] (0,2,1,3): rows", GP_DTYPE_FLOAT32, 4, I64(2, 3, 65, 67),
                   I64(0, 2, 1, 3));
    transpose_case("Transpose [2,3,65,67] (3,2,1,0): gather", GP_DTYPE_FLOAT32, 4, I64(2, 3, 65, 67),
                   I64(3, 2, 1, 0));
    transpose_case("Transpose [3,4,5] default perm", GP_DTYPE_FLOAT32, 3, I64(3, 4, 5), NULL);
    transpose_case("Transpose [40,3,50] (2,1,0): tiles around a batch axis", GP_DTYPE_FLOAT32, 3,
                   I64(40, 3, 50), I64(2, 1, 0));
    transpose_case("Transpose [5,17,33] (1,2,0)", GP_DTYPE_FLOAT32, 3, I64(5, 17, 33), I64(1, 2, 0));
    transpose_case("Transpose int64 [2,33,40] (0,2,1)", GP_DTYPE_INT64, 3, I64(2, 33, 40), I64(0, 2, 1));
    transpose_case("Transpose bool [2,40,33] (0,2,1)", GP_DTYPE_BOOL, 3, I64(2, 40, 33), I64(0, 2, 1));
    transpose_case("Transpose int32 [3,17,19] (2,0,1)", GP_DTYPE_INT32, 3, I64(3, 17, 19), I64(2, 0, 1));
    transpose_case("Transpose [4,64,65,67] (0,1,3,2)", GP_DTYPE_FLOAT32, 4, I64(4, 64, 65, 67),
                   I64(0, 1, 3, 2));
    transpose_case("Transpose [4,64,65,67] (1,0,2,3)", GP_DTYPE_FLOAT32, 4, I64(4, 64, 65, 67),
                   I64(1, 0, 2, 3));
    transpose_case("Transpose [8,12,128,64] (0,2,1,3): heads", GP_DTYPE_FLOAT32, 4, I64(8, 12, 128, 64),
                   I64(0, 2, 1, 3));
}

/* ---- Concat, Split ---- */

static void test_concat(void **state)
{
    (void)state;
    for (int axis = -1; axis < 3; axis++) {
        struct gp_graph g;
        begin(&g, 13);
        int a = axis < 0 ? 2 : axis;
        for (int k = 0; k < 3; k++) {
            int64_t d[3] = {2, 3, 5};
            d[a] = k + 1 + (a == 2 ? 3 : 0);
            input(&g, k == 0 ? "a" : k == 1 ? "b" : "c", 3, d);
        }
        attr_i(&g, node(&g, "Concat", 3, S("a", "b", "c"), 1, S("y")), "axis", axis);
        char label[64];
        snprintf(label, sizeof label, "Concat axis %d", axis);
        compare(&g, (struct op_compare){.label = label});
    }
    struct gp_graph g;
    begin(&g, 13);
    input(&g, "a", 2, I64(8, 64));
    input(&g, "b", 2, I64(8, 128));
    attr_i(&g, node(&g, "Concat", 2, S("a", "b"), 1, S("y")), "axis", 1);
    compare(&g, (struct op_compare){.label = "Concat aligned rows"});

    begin(&g, 13);
    input(&g, "a", 2, I64(1000, 300));
    input(&g, "b", 2, I64(1000, 701));
    input(&g, "c", 2, I64(1000, 101));
    attr_i(&g, node(&g, "Concat", 3, S("a", "b", "c"), 1, S("y")), "axis", 1);
    compare(&g, (struct op_compare){.label = "Concat [1000, 1102]"});

    begin(&g, 13);
    input_t(&g, "a", GP_DTYPE_INT64, 2, I64(3, 2));
    input_t(&g, "b", GP_DTYPE_INT64, 2, I64(3, 5));
    attr_i(&g, node(&g, "Concat", 2, S("a", "b"), 1, S("y")), "axis", 1);
    int64_t *ia = ints64(6, -50, 50), *ib = ints64(15, -50, 50);
    compare(&g, (struct op_compare){.label = "Concat int64", .inputs = {ia, ib}});
    free(ia);
    free(ib);
}

static void test_split(void **state)
{
    (void)state;
    struct gp_graph g;

    begin(&g, 11);
    input(&g, "x", 3, I64(2, 6, 5));
    int n = node(&g, "Split", 1, S("x"), 3, S("y0", "y1", "y2"));
    attr_i(&g, n, "axis", 1);
    attr_ints(&g, n, "split", 3, I64(1, 2, 3));
    compare(&g, (struct op_compare){.label = "Split-11 split attribute, axis 1"});

    begin(&g, 13);
    input(&g, "x", 3, I64(3, 4, 7));
    ci64(&g, "split", 1, I64(2), I64(5, 2));
    attr_i(&g, node(&g, "Split", 2, S("x", "split"), 2, S("y0", "y1")), "axis", -1);
    compare(&g, (struct op_compare){.label = "Split-13 split input, axis -1"});

    begin(&g, 18);
    input(&g, "x", 2, I64(2, 7));
    n = node(&g, "Split", 1, S("x"), 3, S("y0", "y1", "y2"));
    attr_i(&g, n, "axis", 1);
    attr_i(&g, n, "num_outputs", 3);
    compare(&g, (struct op_compare){.label = "Split-18 num_outputs 3 of 7"});

    begin(&g, 13);
    input(&g, "x", 2, I64(4, 5));
    node(&g, "Split", 1, S("x"), 2, S("y0", "y1"));
    compare(&g, (struct op_compare){.label = "Split-13 even, axis 0"});

    begin(&g, 13);
    input(&g, "x", 2, I64(2200, 1000));
    node(&g, "Split", 1, S("x"), 2, S("y0", "y1"));
    compare(&g, (struct op_compare){.label = "Split [2200, 1000] axis 0"});

    begin(&g, 13);
    input(&g, "x", 2, I64(1100, 1001));
    ci64(&g, "split", 1, I64(2), I64(400, 601));
    attr_i(&g, node(&g, "Split", 2, S("x", "split"), 2, S("y0", "y1")), "axis", 1);
    compare(&g, (struct op_compare){.label = "Split [1100, 1001] axis 1"});

    begin(&g, 13);
    input_t(&g, "x", GP_DTYPE_INT64, 2, I64(3, 6));
    attr_i(&g, node(&g, "Split", 1, S("x"), 2, S("y0", "y1")), "axis", 1);
    int64_t *xi = ints64(18, -9, 9);
    compare(&g, (struct op_compare){.label = "Split int64", .inputs = {xi}});
    free(xi);
}

/* ---- Slice ---- */

static void slice13_o(struct op_compare o, int rank, const int64_t *dims, int n, const int64_t *starts,
                      const int64_t *ends, const int64_t *axes, const int64_t *steps)
{
    struct gp_graph g;
    begin(&g, 13);
    input(&g, "x", rank, dims);
    ci64(&g, "starts", 1, I64(n), starts);
    ci64(&g, "ends", 1, I64(n), ends);
    int ni = 3;
    if (axes) ci64(&g, "axes", 1, I64(n), axes), ni = 4;
    if (steps) ci64(&g, "steps", 1, I64(n), steps), ni = 5;
    node(&g, "Slice", ni, S("x", "starts", "ends", axes ? "axes" : "", "steps"), 1, S("y"));
    compare(&g, o);
}

static void slice13(const char *label, int rank, const int64_t *dims, int n, const int64_t *starts,
                    const int64_t *ends, const int64_t *axes, const int64_t *steps)
{
    slice13_o((struct op_compare){.label = label}, rank, dims, n, starts, ends, axes, steps);
}

static void test_slice(void **state)
{
    (void)state;
    slice13("Slice x[3:-5:-1, 0:6:2]", 2, I64(4, 6), 2, I64(3, 0), I64(-5, 6), I64(0, 1), I64(-1, 2));
    slice13("Slice x[::-2, 5:0:-3], axes backwards", 2, I64(4, 6), 2, I64(5, -1), I64(0, INT64_MIN),
            I64(1, 0), I64(-3, -2));
    slice13("Slice last axis reversed", 3, I64(3, 5, 7), 1, I64(-1), I64(-100), I64(2), I64(-1));
    slice13("Slice no axes, no steps", 2, I64(4, 6), 2, I64(1, 0), I64(3, 5), NULL, NULL);
    slice13("Slice [1200, 1001] rows 1..999", 2, I64(1200, 1001), 2, I64(0, 1), I64(1200, 1000),
            I64(0, 1), I64(1, 1));
    slice13("Slice [3, 1024, 768] aligned columns", 3, I64(3, 1024, 768), 1, I64(256), I64(512), I64(2),
            I64(1));
    slice13("Slice [6, 7, 9] every axis negative", 3, I64(6, 7, 9), 3, I64(-1, 5, 8), I64(0, -100, 1),
            I64(0, 1, 2), I64(-2, -3, -4));

    struct gp_graph g;
    begin(&g, 9);
    input(&g, "x", 2, I64(4, 6));
    int n = node(&g, "Slice", 1, S("x"), 1, S("y"));
    attr_ints(&g, n, "starts", 1, I64(1));
    attr_ints(&g, n, "ends", 1, I64(100));
    attr_ints(&g, n, "axes", 1, I64(1));
    compare(&g, (struct op_compare){.label = "Slice-1 attributes"});

    begin(&g, 13);
    input_t(&g, "x", GP_DTYPE_INT64, 2, I64(4, 6));
    ci64(&g, "starts", 1, I64(1), I64(4));
    ci64(&g, "ends", 1, I64(1), I64(0));
    ci64(&g, "axes", 1, I64(1), I64(1));
    ci64(&g, "steps", 1, I64(1), I64(-2));
    node(&g, "Slice", 5, S("x", "starts", "ends", "axes", "steps"), 1, S("y"));
    int64_t *xi = ints64(24, -99, 99);
    compare(&g, (struct op_compare){.label = "Slice int64", .inputs = {xi}});
    free(xi);
}

/* ---- Gather ---- */

static void gather_case_o(struct op_compare o, int rank, const int64_t *dims, int axis, enum gp_dtype it,
                          int irank, const int64_t *idims, const void *idx)
{
    struct gp_graph g;
    begin(&g, 13);
    input(&g, "x", rank, dims);
    input_t(&g, "i", it, irank, idims);
    int n = node(&g, "Gather", 2, S("x", "i"), 1, S("y"));
    if (axis) attr_i(&g, n, "axis", axis);
    o.inputs[1] = idx;
    compare(&g, o);
}

static void gather_case(const char *label, int rank, const int64_t *dims, int axis, enum gp_dtype it,
                        int irank, const int64_t *idims, const void *idx, double abs_tol)
{
    gather_case_o((struct op_compare){.label = label, .abs_tol = abs_tol}, rank, dims, axis, it, irank, idims,
                  idx);
}

/* Indices in [-dim, dim) skewed toward small ids (a word-frequency-like
 * distribution): id = floor(dim u^power), negated (counted from the end)
 * one time in five. */
static int64_t *skewed(int64_t n, int64_t dim, double power)
{
    int64_t *v = malloc(sizeof(int64_t) * (size_t)n);
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++) {
        int64_t k = (int64_t)((double)dim * pow(next_unit(), power));
        if (k >= dim) k = dim - 1;
        v[i] = next_u64() % 5 == 0 ? k - dim : k;
    }
    return v;
}

static void test_gather(void **state)
{
    (void)state;
    /* The embedding: [50, 16] table, [4, 33] indices with repeats. */
    int64_t *i64 = ints64(132, -50, 49);
    for (int k = 0; k < 20; k++) i64[k * 6] = 7; /* one row read 20 times */
    i64[1] = -43;                                /* = 7, counted from the end */
    gather_case("Gather embedding [50,16] by [4,33] int64", 2, I64(50, 16), 0, GP_DTYPE_INT64, 2,
                I64(4, 33), i64, 0);
    free(i64);
    int32_t *i32 = ints32(132, -50, 49);
    gather_case("Gather embedding [50,16] by [4,33] int32", 2, I64(50, 16), 0, GP_DTYPE_INT32, 2,
                I64(4, 33), i32, 0);
    free(i32);

    i64 = ints64(33, -50, 49);
    gather_case("Gather axis 1 [5,50,7] by [3,11]", 3, I64(5, 50, 7), 1, GP_DTYPE_INT64, 2, I64(3, 11),
                i64, 0);
    free(i64);
    i32 = ints32(10, -9, 8);
    gather_case("Gather axis -1 [4,6,9] by [10] int32", 3, I64(4, 6, 9), -1, GP_DTYPE_INT32, 1, I64(10),
                i32, 0);
    free(i32);
    i64 = ints64(12, -3, 2);
    gather_case("Gather axis 0 [3,5] by [2,6]: every row many times", 2, I64(3, 5), 0, GP_DTYPE_INT64, 2,
                I64(2, 6), i64, 0);
    free(i64);

    /* A scalar index (an initializer): the axis goes away. */
    struct gp_graph g;
    begin(&g, 13);
    input(&g, "x", 2, I64(7, 5));
    ci64(&g, "i", 0, NULL, I64(-2));
    attr_i(&g, node(&g, "Gather", 2, S("x", "i"), 1, S("y")), "axis", 1);
    compare(&g, (struct op_compare){.label = "Gather scalar index, axis 1"});

    /* int64 data. */
    begin(&g, 13);
    input_t(&g, "x", GP_DTYPE_INT64, 2, I64(6, 3));
    input_t(&g, "i", GP_DTYPE_INT64, 1, I64(8));
    node(&g, "Gather", 2, S("x", "i"), 1, S("y"));
    int64_t *xi = ints64(18, -1000, 1000);
    i64 = ints64(8, -6, 5);
    compare(&g, (struct op_compare){.label = "Gather int64 data", .inputs = {xi, i64}});
    free(xi);
    free(i64);

    /* Runs longer than a piece (two-level sums) and two radix passes: the
     * CPU adds up to ~3000 terms in float in order, the GPU in double, so
     * the absolute tolerance allows for the CPU's rounding. */
    i64 = skewed(8 * 2048, 5000, 6.0);
    gather_case("Gather [5000,64] by [8,2048], long runs", 2, I64(5000, 64), 0, GP_DTYPE_INT64, 2,
                I64(8, 2048), i64, 2e-4);
    free(i64);
    i64 = skewed(3 * 700, 300, 3.0);
    gather_case("Gather axis 1 [4,300,5] by [3,700], long runs", 3, I64(4, 300, 5), 1, GP_DTYPE_INT64, 2,
                I64(3, 700), i64, 1e-4);
    free(i64);

    /* GPT-2's token embedding: [50304, 768] by [8, 1024]. */
    i64 = skewed(8 * 1024, 50304, 4.0);
    gather_case("Gather GPT-2 [50304,768] by [8,1024]", 2, I64(50304, 768), 0, GP_DTYPE_INT64, 2,
                I64(8, 1024), i64, 1e-4);
    free(i64);
}

/* ---- Tile, Trilu ---- */

static void tile_case_o(struct op_compare o, enum gp_dtype dt, int rank, const int64_t *dims, const int64_t *rep)
{
    struct gp_graph g;
    begin(&g, 13);
    input_t(&g, "x", dt, rank, dims);
    ci64(&g, "rep", 1, I64(rank), rep);
    node(&g, "Tile", 2, S("x", "rep"), 1, S("y"));
    void *data = dt == GP_DTYPE_INT64 ? ints64(numel(rank, dims), -99, 99) : NULL;
    o.inputs[0] = data;
    compare(&g, o);
    free(data);
}

static void tile_case(const char *label, enum gp_dtype dt, int rank, const int64_t *dims, const int64_t *rep)
{
    tile_case_o((struct op_compare){.label = label}, dt, rank, dims, rep);
}

static void test_tile(void **state)
{
    (void)state;
    tile_case("Tile [2,3] by (2,2)", GP_DTYPE_FLOAT32, 2, I64(2, 3), I64(2, 2));
    tile_case("Tile [2,1,3] by (1,3,2)", GP_DTYPE_FLOAT32, 3, I64(2, 1, 3), I64(1, 3, 2));
    tile_case("Tile [5] by (3)", GP_DTYPE_FLOAT32, 1, I64(5), I64(3));
    tile_case("Tile int64 [3,2] by (2,3)", GP_DTYPE_INT64, 2, I64(3, 2), I64(2, 3));
    tile_case("Tile [64,130,33] by (1,1,5)", GP_DTYPE_FLOAT32, 3, I64(64, 130, 33), I64(1, 1, 5));
}

static void trilu_case_o(struct op_compare o, enum gp_dtype dt, int rank, const int64_t *dims, bool upper,
                         bool has_k, int64_t k)
{
    struct gp_graph g;
    begin(&g, 14);
    input_t(&g, "x", dt, rank, dims);
    if (has_k) ci64(&g, "k", 0, NULL, &k);
    int n = node(&g, "Trilu", has_k ? 2 : 1, S("x", "k"), 1, S("y"));
    attr_i(&g, n, "upper", upper);
    void *data = dt == GP_DTYPE_INT64 ? ints64(numel(rank, dims), -99, 99) : NULL;
    o.inputs[0] = data;
    compare(&g, o);
    free(data);
}

static void trilu_case(const char *label, enum gp_dtype dt, int rank, const int64_t *dims, bool upper,
                       bool has_k, int64_t k)
{
    trilu_case_o((struct op_compare){.label = label}, dt, rank, dims, upper, has_k, k);
}

static void test_trilu(void **state)
{
    (void)state;
    trilu_case("Trilu upper k=1 [3,4]", GP_DTYPE_FLOAT32, 2, I64(3, 4), true, true, 1);
    trilu_case("Trilu lower k=-1 [3,4]", GP_DTYPE_FLOAT32, 2, I64(3, 4), false, true, -1);
    trilu_case("Trilu upper, no k [4,3]", GP_DTYPE_FLOAT32, 2, I64(4, 3), true, false, 0);
    trilu_case("Trilu lower k=2 [2,3,5,7]", GP_DTYPE_FLOAT32, 4, I64(2, 3, 5, 7), false, true, 2);
    trilu_case("Trilu int64 upper k=0 [3,5]", GP_DTYPE_INT64, 2, I64(3, 5), true, true, 0);
    trilu_case("Trilu [3,700,600] upper k=-3", GP_DTYPE_FLOAT32, 3, I64(3, 700, 600), true, true, -3);
}

/* ---- Pad ---- */

/* Pad-11 (Pad-19 for wrap): pads as a constant input, an optional value. */
static void pad_case(const char *label, int rank, const int64_t *dims, const char *mode, const int64_t *pads,
                     bool with_value)
{
    struct gp_graph g;
    begin(&g, strcmp(mode, "wrap") == 0 ? 19 : 13);
    input(&g, "x", rank, dims);
    ci64(&g, "pads", 1, I64(2 * rank), pads);
    int n;
    if (with_value) {
        cf32(&g, "v", 0, NULL, (const float[]){-1.5f});
        n = node(&g, "Pad", 3, S("x", "pads", "v"), 1, S("y"));
    } else {
        n = node(&g, "Pad", 2, S("x", "pads"), 1, S("y"));
    }
    attr_s(&g, n, "mode", mode);
    compare(&g, (struct op_compare){.label = label});
}

static void test_pad(void **state)
{
    (void)state;
    pad_case("Pad constant with value", 2, I64(2, 3), "constant", I64(0, 2, 0, 1), true);
    pad_case("Pad reflect", 2, I64(2, 3), "reflect", I64(1, 2, 1, 2), false);
    pad_case("Pad edge", 2, I64(2, 3), "edge", I64(1, 0, 0, 3), false);
    pad_case("Pad wrap", 2, I64(2, 3), "wrap", I64(0, 3, 1, 2), false);
    pad_case("Pad constant crop and pad", 2, I64(2, 3), "constant", I64(0, -1, 0, 1), false);
    pad_case("Pad edge of a one-wide axis", 2, I64(3, 1), "edge", I64(0, 2, 1, 3), false);
    pad_case("Pad reflect with a crop", 2, I64(3, 4), "reflect", I64(0, -1, 2, 2), false);
    pad_case("Pad wrap with a crop", 2, I64(3, 4), "wrap", I64(0, -1, 1, 2), false);
    pad_case("Pad edge crop both ends", 2, I64(4, 6), "edge", I64(-1, 2, 2, -2), false);
    pad_case("Pad reflect [4,8,180,181]", 4, I64(4, 8, 180, 181), "reflect", I64(0, 0, 2, 1, 0, 0, 3, 2),
             false);
    pad_case("Pad edge [2,3,33,35] all axes", 4, I64(2, 3, 33, 35), "edge", I64(1, 0, 2, 3, 0, 1, 3, 2),
             false);

    struct gp_graph g;
    begin(&g, 9);
    input(&g, "x", 4, I64(2, 3, 4, 5));
    int n = node(&g, "Pad", 1, S("x"), 1, S("y"));
    attr_ints(&g, n, "pads", 8, I64(0, 0, 1, 2, 0, 0, 2, 0));
    attr_f(&g, n, "value", 0.5f);
    compare(&g, (struct op_compare){.label = "Pad-2 attributes with value"});

    begin(&g, 18);
    input(&g, "x", 3, I64(2, 3, 4));
    ci64(&g, "pads", 1, I64(2), I64(1, 2));
    ci64(&g, "axes", 1, I64(1), I64(-1));
    attr_s(&g, node(&g, "Pad", 4, S("x", "pads", "", "axes"), 1, S("y")), "mode", "reflect");
    compare(&g, (struct op_compare){.label = "Pad-18 axes"});

    begin(&g, 13);
    input_t(&g, "x", GP_DTYPE_INT64, 2, I64(3, 4));
    ci64(&g, "pads", 1, I64(4), I64(1, 0, 0, 2));
    ci64(&g, "v", 0, NULL, I64(-7));
    node(&g, "Pad", 3, S("x", "pads", "v"), 1, S("y"));
    int64_t *xi = ints64(12, -99, 99);
    compare(&g, (struct op_compare){.label = "Pad int64 constant value", .inputs = {xi}});
    free(xi);
}

/* ---- Shape, Size, ConstantOfShape, Range: folded at load; compared from
 * the folded node (the harness only reads the node list and the values). */

static void compare_folded_o(struct gp_graph *g, struct op_compare o)
{
    finalize_ok(g);
    if (g->n_folded != 1) fail_msg("%s: %d folded nodes, not 1", o.label, g->n_folded);
    struct gp_graph view = *g;
    view.nodes = g->folded;
    view.n_nodes = g->n_folded;
    o.forward_only = true;
    op_compare_node(&view, 0, &o);
    gp_graph_free(g);
}

static void compare_folded(struct gp_graph *g, const char *label)
{
    compare_folded_o(g, (struct op_compare){.label = label});
}

static void test_shape_producers(void **state)
{
    (void)state;
    struct gp_graph g;
    begin(&g, 15);
    input(&g, "x", 3, I64(2, 3, 4));
    attr_i(&g, node(&g, "Shape", 1, S("x"), 1, S("y")), "start", -2);
    compare_folded(&g, "Shape start -2");

    begin(&g, 13);
    input(&g, "x", 3, I64(2, 3, 4));
    node(&g, "Shape", 1, S("x"), 1, S("y"));
    compare_folded(&g, "Shape");

    begin(&g, 13);
    input(&g, "x", 3, I64(2, 3, 4));
    node(&g, "Size", 1, S("x"), 1, S("y"));
    compare_folded(&g, "Size");

    begin(&g, 13);
    input(&g, "x", 1, I64(1));
    ci64(&g, "s", 1, I64(2), I64(2, 3));
    int n = node(&g, "ConstantOfShape", 1, S("s"), 1, S("y"));
    struct gp_attr *a = attr(&g, n, "value", GP_ATTR_TENSOR);
    struct gp_shape one = {.rank = 1, .dims = {1}};
    a->t = gp_graph_new_tensor(&g, GP_DTYPE_INT32, &one);
    assert_non_null(a->t);
    ((int32_t *)a->t->data)[0] = -7;
    compare_folded(&g, "ConstantOfShape int32 -7");

    begin(&g, 13);
    input(&g, "x", 1, I64(1));
    ci64(&g, "s", 1, I64(2), I64(3, 5));
    node(&g, "ConstantOfShape", 1, S("s"), 1, S("y"));
    compare_folded(&g, "ConstantOfShape default");

    begin(&g, 13);
    input(&g, "x", 1, I64(1));
    cf32(&g, "start", 0, NULL, (const float[]){1});
    cf32(&g, "limit", 0, NULL, (const float[]){2});
    cf32(&g, "delta", 0, NULL, (const float[]){0.25f});
    node(&g, "Range", 3, S("start", "limit", "delta"), 1, S("y"));
    compare_folded(&g, "Range float");

    begin(&g, 13);
    input(&g, "x", 1, I64(1));
    ci64(&g, "start", 0, NULL, I64(10));
    ci64(&g, "limit", 0, NULL, I64(3));
    ci64(&g, "delta", 0, NULL, I64(-3));
    node(&g, "Range", 3, S("start", "limit", "delta"), 1, S("y"));
    compare_folded(&g, "Range int64");
}

/* ---- bf16 ----
 * The kernels read and write bfloat16 themselves (bf16_any): every case
 * runs with the storage types a bf16 stage gives (op_compare.h) in each of
 * these modes: all activations (bfloat16 throughout); input 0 a float32
 * parameter (stored and its gradient float32: a forward converts into a
 * bfloat16 output, a backward adds bfloat16 into float32); input 0 a
 * per-step value (stored bfloat16, its gradient float32); output 0 stored
 * float32 (a forward widens into it). op_compare starts every input
 * gradient from random values, so each backward is checked to add once. */

#define BIT(k) (1u << (k))

struct bf16_mode {
    const char *name;
    uint32_t params, f32_inputs, f32_outputs;
};

static const struct bf16_mode bf16_modes[] = {
    {"bf16", 0, 0, 0},
    {"bf16, input 0 a float32 parameter", BIT(0), BIT(0), 0},
    {"bf16, input 0 bfloat16 with a float32 gradient", BIT(0), 0, 0},
    {"bf16, output 0 float32", 0, 0, BIT(0)},
};
#define N_MODES ((int)(sizeof bf16_modes / sizeof *bf16_modes))
#define ALL_BF16 (&bf16_modes[0])
#define F32_PARAM (&bf16_modes[1])

/* The op_compare of a bf16 case; its label is written into buf. */
static struct op_compare bf16_o(char *buf, size_t size, const char *label, const struct bf16_mode *m,
                                double abs_tol)
{
    snprintf(buf, size, "%s (%s)", label, m->name);
    return (struct op_compare){.label = buf, .bf16 = true, .params = m->params, .f32_inputs = m->f32_inputs,
                               .f32_outputs = m->f32_outputs, .abs_tol = abs_tol};
}

/* Concat of rank-4 tensors with channels-last ones (graph/layout.h) on
 * the CUDA side: along the channels (U-Net's skip connections: whole rows
 * of channels), along H and along N, every tensor channels-last; and
 * mixes (one input channels-last, the output channels-last or not), which
 * the kernel takes too (each tensor through its own strides). Float32 and
 * each bfloat16 mode. */
static void test_concat_nhwc(void **state)
{
    (void)state;
    static const struct {
        const char *label;
        int axis;
        int64_t a[4], b[4];
        uint32_t in_nhwc, out_nhwc;
    } cases[] = {
        {"channels, all channels-last", 1, {2, 8, 5, 6}, {2, 16, 5, 6}, 0x3, 0x1},
        {"channels of odd counts, all channels-last", 1, {2, 3, 4, 5}, {2, 5, 4, 5}, 0x3, 0x1},
        {"H, all channels-last", 2, {2, 4, 3, 5}, {2, 4, 6, 5}, 0x3, 0x1},
        {"N, all channels-last", 0, {1, 4, 3, 5}, {2, 4, 3, 5}, 0x3, 0x1},
        {"channels, input 0 channels-last", 1, {2, 8, 5, 6}, {2, 4, 5, 6}, 0x1, 0x1},
        {"channels, inputs channels-last, output not", 1, {2, 8, 5, 6}, {2, 4, 5, 6}, 0x3, 0x0},
    };
    char label[200];
    for (int m = -1; m < N_MODES; m++)
        for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
            struct gp_graph g;
            begin(&g, 13);
            input(&g, "a", 4, cases[k].a);
            input(&g, "b", 4, cases[k].b);
            attr_i(&g, node(&g, "Concat", 2, S("a", "b"), 1, S("y")), "axis", cases[k].axis);
            char what[160];
            snprintf(what, sizeof what, "Concat axis %d, %s", cases[k].axis, cases[k].label);
            struct op_compare o = m < 0 ? (struct op_compare){.label = what}
                                        : bf16_o(label, sizeof label, what, &bf16_modes[m], 0);
            o.nhwc_inputs = cases[k].in_nhwc;
            o.nhwc_outputs = cases[k].out_nhwc;
            o.twice = true;
            compare(&g, o);
        }
}

/* Reshape (a flat copy: groups and a tail), Flatten, Squeeze, Unsqueeze. */
static void test_copies_bf16(void **state)
{
    (void)state;
    char label[160];
    for (int m = 0; m < N_MODES; m++) {
        struct gp_graph g;
        begin(&g, 14);
        input(&g, "x", 3, I64(2, 3, 4));
        ci64(&g, "shape", 1, I64(3), I64(4, 1, 6));
        node(&g, "Reshape", 2, S("x", "shape"), 1, S("y"));
        compare(&g, bf16_o(label, sizeof label, "Reshape [2,3,4] -> [4,1,6]", &bf16_modes[m], 0));

        begin(&g, 14);
        input(&g, "x", 2, I64(4201, 1001)); /* groups of 8, a tail of 1 */
        ci64(&g, "shape", 1, I64(2), I64(1001, 4201));
        node(&g, "Reshape", 2, S("x", "shape"), 1, S("y"));
        compare(&g, bf16_o(label, sizeof label, "Reshape [4201,1001]", &bf16_modes[m], 0));

        begin(&g, 14);
        input(&g, "x", 1, I64(7)); /* a tail only */
        ci64(&g, "shape", 1, I64(2), I64(7, 1));
        node(&g, "Reshape", 2, S("x", "shape"), 1, S("y"));
        compare(&g, bf16_o(label, sizeof label, "Reshape [7] -> [7,1]", &bf16_modes[m], 0));
    }
    struct gp_graph g;
    begin(&g, 13);
    input(&g, "x", 4, I64(2, 3, 4, 5));
    attr_i(&g, node(&g, "Flatten", 1, S("x"), 1, S("y")), "axis", 2);
    compare(&g, bf16_o(label, sizeof label, "Flatten axis 2", ALL_BF16, 0));

    begin(&g, 13);
    input(&g, "x", 4, I64(2, 1, 3, 1));
    ci64(&g, "axes", 1, I64(2), I64(1, -1));
    node(&g, "Squeeze", 2, S("x", "axes"), 1, S("y"));
    compare(&g, bf16_o(label, sizeof label, "Squeeze-13 axes input", ALL_BF16, 0));

    begin(&g, 13);
    input(&g, "x", 2, I64(2, 3));
    ci64(&g, "axes", 1, I64(2), I64(0, -1));
    node(&g, "Unsqueeze", 2, S("x", "axes"), 1, S("y"));
    compare(&g, bf16_o(label, sizeof label, "Unsqueeze-13 axes input", F32_PARAM, 0));

    /* Integers keep their own type in a bf16 call. */
    begin(&g, 14);
    input_t(&g, "x", GP_DTYPE_INT64, 2, I64(3, 5));
    ci64(&g, "shape", 1, I64(1), I64(15));
    node(&g, "Reshape", 2, S("x", "shape"), 1, S("y"));
    int64_t *xi = ints64(15, INT64_MIN / 2, INT64_MAX / 2);
    struct op_compare o = bf16_o(label, sizeof label, "Reshape int64", ALL_BF16, 0);
    o.inputs[0] = xi;
    compare(&g, o);
    free(xi);
}

/* Transpose: the tile path (with conversions: a weight's transpose), rows,
 * the general gather, attention heads, integers. */
static void test_transpose_bf16(void **state)
{
    (void)state;
    char label[160];
    static const struct {
        const char *label;
        int rank;
        int64_t dims[4], perm[4];
    } cases[] = {
        {"Transpose [2,3,65,67] (0,1,3,2): tiles", 4, {2, 3, 65, 67}, {0, 1, 3, 2}},
        {"Transpose [2,3,65,67] (0,2,1,3): rows", 4, {2, 3, 65, 67}, {0, 2, 1, 3}},
        {"Transpose [2,3,65,67] (3,2,1,0): gather", 4, {2, 3, 65, 67}, {3, 2, 1, 0}},
        {"Transpose [40,3,50] (2,1,0): tiles around a batch axis", 3, {40, 3, 50}, {2, 1, 0}},
        {"Transpose [5,17,33] (1,2,0)", 3, {5, 17, 33}, {1, 2, 0}},
        {"Transpose [96,200] (1,0): a weight", 2, {96, 200}, {1, 0}},
        {"Transpose [4,8,16,64] (0,2,1,3): rows in groups", 4, {4, 8, 16, 64}, {0, 2, 1, 3}},
    };
    for (int k = 0; k < (int)(sizeof cases / sizeof *cases); k++)
        for (int m = 0; m < N_MODES; m++)
            transpose_case_o(bf16_o(label, sizeof label, cases[k].label, &bf16_modes[m], 0), GP_DTYPE_FLOAT32,
                             cases[k].rank, cases[k].dims, cases[k].perm);
    transpose_case_o(bf16_o(label, sizeof label, "Transpose [8,12,128,64] (0,2,1,3): heads", ALL_BF16, 0),
                     GP_DTYPE_FLOAT32, 4, I64(8, 12, 128, 64), I64(0, 2, 1, 3));
    transpose_case_o(bf16_o(label, sizeof label, "Transpose [768,2304] (1,0): GPT-2's weight", F32_PARAM, 0),
                     GP_DTYPE_FLOAT32, 2, I64(768, 2304), I64(1, 0));
    transpose_case_o(bf16_o(label, sizeof label, "Transpose int64 [2,33,40] (0,2,1)", ALL_BF16, 0),
                     GP_DTYPE_INT64, 3, I64(2, 33, 40), I64(0, 2, 1));
}

/* Concat and Split (input 0 / output 0 in the mode's type, the others
 * bfloat16), along every axis. */
static void test_concat_split_bf16(void **state)
{
    (void)state;
    char label[160], name[64];
    for (int m = 0; m < N_MODES; m++) {
        for (int axis = -1; axis < 3; axis++) {
            struct gp_graph g;
            begin(&g, 13);
            int a = axis < 0 ? 2 : axis;
            for (int k = 0; k < 3; k++) {
                int64_t d[3] = {2, 3, 5};
                d[a] = k + 1 + (a == 2 ? 3 : 0);
                input(&g, k == 0 ? "a" : k == 1 ? "b" : "c", 3, d);
            }
            attr_i(&g, node(&g, "Concat", 3, S("a", "b", "c"), 1, S("y")), "axis", axis);
            snprintf(name, sizeof name, "Concat axis %d", axis);
            compare(&g, bf16_o(label, sizeof label, name, &bf16_modes[m], 0));
        }
        struct gp_graph g;
        begin(&g, 13);
        input(&g, "a", 2, I64(8, 64));
        input(&g, "b", 2, I64(8, 128));
        attr_i(&g, node(&g, "Concat", 2, S("a", "b"), 1, S("y")), "axis", 1);
        compare(&g, bf16_o(label, sizeof label, "Concat aligned rows", &bf16_modes[m], 0));

        begin(&g, 13);
        input(&g, "a", 2, I64(1000, 300));
        input(&g, "b", 2, I64(1000, 701));
        input(&g, "c", 2, I64(1000, 101));
        attr_i(&g, node(&g, "Concat", 3, S("a", "b", "c"), 1, S("y")), "axis", 1);
        compare(&g, bf16_o(label, sizeof label, "Concat [1000, 1102]", &bf16_modes[m], 0));

        begin(&g, 13);
        input(&g, "x", 3, I64(3, 4, 7));
        ci64(&g, "split", 1, I64(2), I64(5, 2));
        attr_i(&g, node(&g, "Split", 2, S("x", "split"), 2, S("y0", "y1")), "axis", -1);
        compare(&g, bf16_o(label, sizeof label, "Split-13 split input, axis -1", &bf16_modes[m], 0));

        begin(&g, 18);
        input(&g, "x", 2, I64(2, 7));
        int n = node(&g, "Split", 1, S("x"), 3, S("y0", "y1", "y2"));
        attr_i(&g, n, "axis", 1);
        attr_i(&g, n, "num_outputs", 3);
        compare(&g, bf16_o(label, sizeof label, "Split-18 num_outputs 3 of 7", &bf16_modes[m], 0));

        begin(&g, 13);
        input(&g, "x", 2, I64(2200, 1000));
        node(&g, "Split", 1, S("x"), 2, S("y0", "y1"));
        compare(&g, bf16_o(label, sizeof label, "Split [2200, 1000] axis 0", &bf16_modes[m], 0));

        begin(&g, 13);
        input(&g, "x", 2, I64(1100, 1001));
        ci64(&g, "split", 1, I64(2), I64(400, 601));
        attr_i(&g, node(&g, "Split", 2, S("x", "split"), 2, S("y0", "y1")), "axis", 1);
        compare(&g, bf16_o(label, sizeof label, "Split [1100, 1001] axis 1", &bf16_modes[m], 0));
    }
    struct gp_graph g;
    begin(&g, 13);
    input_t(&g, "a", GP_DTYPE_INT64, 2, I64(3, 2));
    input_t(&g, "b", GP_DTYPE_INT64, 2, I64(3, 5));
    attr_i(&g, node(&g, "Concat", 2, S("a", "b"), 1, S("y")), "axis", 1);
    int64_t *ia = ints64(6, -50, 50), *ib = ints64(15, -50, 50);
    struct op_compare o = bf16_o(label, sizeof label, "Concat int64", ALL_BF16, 0);
    o.inputs[0] = ia;
    o.inputs[1] = ib;
    compare(&g, o);
    free(ia);
    free(ib);
}

/* Slice: negative steps (general path), rows, aligned rows (groups). */
static void test_slice_bf16(void **state)
{
    (void)state;
    char label[160];
    for (int m = 0; m < N_MODES; m++) {
        const struct bf16_mode *md = &bf16_modes[m];
        slice13_o(bf16_o(label, sizeof label, "Slice x[3:-5:-1, 0:6:2]", md, 0), 2, I64(4, 6), 2, I64(3, 0),
                  I64(-5, 6), I64(0, 1), I64(-1, 2));
        slice13_o(bf16_o(label, sizeof label, "Slice [1200, 1001] rows 1..999", md, 0), 2, I64(1200, 1001), 2,
                  I64(0, 1), I64(1200, 1000), I64(0, 1), I64(1, 1));
        slice13_o(bf16_o(label, sizeof label, "Slice [3, 1024, 768] aligned columns", md, 0), 3,
                  I64(3, 1024, 768), 1, I64(256), I64(512), I64(2), I64(1));
        slice13_o(bf16_o(label, sizeof label, "Slice [6, 7, 9] every axis negative", md, 0), 3, I64(6, 7, 9), 3,
                  I64(-1, 5, 8), I64(0, -100, 1), I64(0, 1, 2), I64(-2, -3, -4));
    }
}

/* Gather: GPT-2's embedding (a float32 table into a bfloat16 output, its
 * gradient float32), a gathered activation (bfloat16 throughout), rows of
 * 4, 2 and 1 elements, repeated indices, runs of several pieces. */
static void test_gather_bf16(void **state)
{
    (void)state;
    char label[160];
    for (int m = 0; m < N_MODES; m++) {
        const struct bf16_mode *md = &bf16_modes[m];
        int64_t *i64 = ints64(132, -50, 49);
        for (int k = 0; k < 20; k++) i64[k * 6] = 7; /* one row read 20 times */
        gather_case_o(bf16_o(label, sizeof label, "Gather embedding [50,16] by [4,33]", md, 0), 2, I64(50, 16), 0,
                      GP_DTYPE_INT64, 2, I64(4, 33), i64);
        free(i64);
        i64 = ints64(33, -50, 49);
        gather_case_o(bf16_o(label, sizeof label, "Gather axis 1 [5,50,7] by [3,11]", md, 0), 3, I64(5, 50, 7), 1,
                      GP_DTYPE_INT64, 2, I64(3, 11), i64);
        free(i64);
        int32_t *i32 = ints32(10, -9, 8);
        gather_case_o(bf16_o(label, sizeof label, "Gather axis -1 [4,6,9] by [10] int32", md, 0), 3,
                      I64(4, 6, 9), -1, GP_DTYPE_INT32, 1, I64(10), i32);
        free(i32);
        i64 = ints64(12, -3, 2);
        gather_case_o(bf16_o(label, sizeof label, "Gather [3,6] by [2,6]: every row many times", md, 0), 2,
                      I64(3, 6), 0, GP_DTYPE_INT64, 2, I64(2, 6), i64);
        free(i64);
        i64 = skewed(8 * 2048, 5000, 6.0);
        gather_case_o(bf16_o(label, sizeof label, "Gather [5000,64] by [8,2048], long runs", md, 2e-4), 2,
                      I64(5000, 64), 0, GP_DTYPE_INT64, 2, I64(8, 2048), i64);
        free(i64);
    }
    int64_t *i64 = skewed(8 * 1024, 50304, 4.0);
    gather_case_o(bf16_o(label, sizeof label, "Gather GPT-2 [50304,768] by [8,1024]", F32_PARAM, 1e-4), 2,
                  I64(50304, 768), 0, GP_DTYPE_INT64, 2, I64(8, 1024), i64);
    free(i64);

    struct gp_graph g;
    begin(&g, 13);
    input_t(&g, "x", GP_DTYPE_INT64, 2, I64(6, 3));
    input_t(&g, "i", GP_DTYPE_INT64, 1, I64(8));
    node(&g, "Gather", 2, S("x", "i"), 1, S("y"));
    int64_t *xi = ints64(18, -1000, 1000);
    i64 = ints64(8, -6, 5);
    struct op_compare o = bf16_o(label, sizeof label, "Gather int64 data", ALL_BF16, 0);
    o.inputs[0] = xi;
    o.inputs[1] = i64;
    compare(&g, o);
    free(xi);
    free(i64);
}

/* Tile (several terms summed per input gradient element) and Trilu. */
static void test_tile_trilu_bf16(void **state)
{
    (void)state;
    char label[160];
    for (int m = 0; m < N_MODES; m++) {
        const struct bf16_mode *md = &bf16_modes[m];
        tile_case_o(bf16_o(label, sizeof label, "Tile [2,3] by (2,2)", md, 0), GP_DTYPE_FLOAT32, 2, I64(2, 3),
                    I64(2, 2));
        tile_case_o(bf16_o(label, sizeof label, "Tile [2,1,3] by (1,3,2)", md, 0), GP_DTYPE_FLOAT32, 3,
                    I64(2, 1, 3), I64(1, 3, 2));
        tile_case_o(bf16_o(label, sizeof label, "Tile [64,130,33] by (1,1,5)", md, 0), GP_DTYPE_FLOAT32, 3,
                    I64(64, 130, 33), I64(1, 1, 5));
        trilu_case_o(bf16_o(label, sizeof label, "Trilu upper k=1 [3,4]", md, 0), GP_DTYPE_FLOAT32, 2, I64(3, 4),
                     true, true, 1);
        trilu_case_o(bf16_o(label, sizeof label, "Trilu lower, no k [4,3]", md, 0), GP_DTYPE_FLOAT32, 2,
                     I64(4, 3), false, false, 0);
        trilu_case_o(bf16_o(label, sizeof label, "Trilu [3,700,600] upper k=-3", md, 0), GP_DTYPE_FLOAT32, 3,
                     I64(3, 700, 600), true, true, -3);
    }
    tile_case_o(bf16_o(label, sizeof label, "Tile int64 [3,2] by (2,3)", ALL_BF16, 0), GP_DTYPE_INT64, 2,
                I64(3, 2), I64(2, 3));
    trilu_case_o(bf16_o(label, sizeof label, "Trilu int64 upper k=0 [3,5]", ALL_BF16, 0), GP_DTYPE_INT64, 2,
                 I64(3, 5), true, true, 0);
}

/* Shape reads no elements; ConstantOfShape fills a bfloat16 output with
 * its float32 value rounded once. */
static void test_shape_producers_bf16(void **state)
{
    (void)state;
    char label[160];
    struct gp_graph g;
    begin(&g, 13);
    input(&g, "x", 3, I64(2, 3, 4));
    node(&g, "Shape", 1, S("x"), 1, S("y"));
    compare_folded_o(&g, bf16_o(label, sizeof label, "Shape", ALL_BF16, 0));

    for (int m = 0; m < N_MODES; m += 3) { /* bfloat16, then float32 output */
        begin(&g, 13);
        input(&g, "x", 1, I64(1));
        ci64(&g, "s", 1, I64(2), I64(3, 5));
        int n = node(&g, "ConstantOfShape", 1, S("s"), 1, S("y"));
        struct gp_attr *a = attr(&g, n, "value", GP_ATTR_TENSOR);
        struct gp_shape one = {.rank = 1, .dims = {1}};
        a->t = gp_graph_new_tensor(&g, GP_DTYPE_FLOAT32, &one);
        assert_non_null(a->t);
        ((float *)a->t->data)[0] = 0.3f; /* not a bfloat16 value */
        compare_folded_o(&g, bf16_o(label, sizeof label, "ConstantOfShape float 0.3", &bf16_modes[m], 0));
    }
}

int main(void)
{
    op_compare_require_device();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copies),  cmocka_unit_test(test_transpose), cmocka_unit_test(test_concat),
        cmocka_unit_test(test_split),   cmocka_unit_test(test_slice),     cmocka_unit_test(test_gather),
        cmocka_unit_test(test_tile),    cmocka_unit_test(test_trilu),     cmocka_unit_test(test_pad),
        cmocka_unit_test(test_shape_producers),
        cmocka_unit_test(test_copies_bf16), cmocka_unit_test(test_transpose_bf16),
        cmocka_unit_test(test_concat_split_bf16), cmocka_unit_test(test_concat_nhwc), cmocka_unit_test(test_slice_bf16),
        cmocka_unit_test(test_gather_bf16), cmocka_unit_test(test_tile_trilu_bf16),
        cmocka_unit_test(test_shape_producers_bf16),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (failed == 0)
        printf("cuda_shape: PASSED, %d ops (%d cases against the CPU kernels)\n", op_compare_op_types(),
               op_compare_cases());
    return failed ? 1 : 0;
}
