/* CUDA matmul kernels (src/backend/cuda/matmul.cu: Gemm, MatMul) against the CPU
 * kernels: outputs and every input gradient, with accumulation into
 * existing gradients, through op_compare_node.
 *
 * cuBLAS and OpenBLAS add a product's terms in different orders, so
 * results agree to float rounding, which grows with the length of the sums:
 * each case's absolute tolerance scales with its longest reduction (the
 * inner dimension forward, M or N backward, times the batch entries a
 * broadcast operand's gradient sums). TF32 stays off.
 *
 * bf16: the kernels read and write bfloat16 themselves; op_compare_node
 * runs the CPU float kernel on bfloat16-rounded data and rounds its results
 * where the CUDA side stores bfloat16 (op_compare.h gives the bound:
 * |d| <= (2^-7 + 2^-9) |ref| + 2^-7 rms(ref) + sum_tol(K) for bfloat16
 * tensors, 2^-8 (|ref| + rms(ref)) + sum_tol(K) for float32 ones, K the
 * longest sum as for float32). Which inputs are
 * parameters (float32 gradients) and which are read as float32 varies by
 * case, as the executor's storage does. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "kernel_graph.h"
#include "cuda_test_util.h"
#include "op_compare.h"


/* Set by the TF32 tests: cuBLAS / cuDNN may round operands to TF32 (10
 * mantissa bits), so errors grow like the square root of a sum's length
 * times 2^-11 of its terms. */
static bool tf32_mode;

/* Set by the bf16 tests: bfloat16 storage, and per case the inputs that
 * are parameters (bit k: gradient float32), that are read as float32 and
 * the outputs written as float32 (op_compare). */
static bool bf16_mode;
static uint32_t bf16_params, bf16_f32_inputs, bf16_f32_outputs;

/* The comparison of a case whose outputs are sums of `len` terms. */
static struct op_compare compare_for(const char *label, int64_t len)
{
    if (!bf16_mode) return sum_compare(label, len, tf32_mode);
    return (struct op_compare){.label = label, .bf16 = true, .abs_tol = sum_tol(len), .params = bf16_params,
                               .f32_inputs = bf16_f32_inputs, .f32_outputs = bf16_f32_outputs};
}

/* " (TF32)", or the bf16 storage of a case, for labels. */
static const char *mode_suffix(char *buf, size_t size)
{
    if (tf32_mode) return " (TF32)";
    if (!bf16_mode) return "";
    snprintf(buf, size, " (bf16; parameters 0x%x, float32 inputs 0x%x, outputs 0x%x)", bf16_params,
             bf16_f32_inputs, bf16_f32_outputs);
    return buf;
}

static int64_t max3(int64_t a, int64_t b, int64_t c)
{
    int64_t m = a > b ? a : b;
    return m > c ? m : c;
}

/* ---- Gemm ---- */

struct gemm_case {
    int ta, tb;
    int c_rank; /* -1: no C; 0: a scalar constant */
    int64_t c[2];
    float alpha, beta;
    int64_t m, k, n;
};

static void run_gemm(const struct gemm_case *c)
{
    struct gp_graph g;
    begin(&g, c->c_rank < 0 ? 13 : 7);
    int64_t a[2] = {c->ta ? c->k : c->m, c->ta ? c->m : c->k};
    int64_t b[2] = {c->tb ? c->n : c->k, c->tb ? c->k : c->n};
    input(&g, "a", 2, a);
    input(&g, "b", 2, b);
    if (c->c_rank > 0) input(&g, "c", c->c_rank, c->c);
    if (c->c_rank == 0) { /* a scalar cannot be a graph input (no batch axis) */
        struct gp_error err = {0};
        struct gp_shape s = {.rank = 0};
        if (gp_graph_add_const_f32(&g, "c", &s, (const float[]){0.375f}, &err) != GP_OK)
            fail_msg("%s", err.msg);
    }
    int n = node(&g, "Gemm", c->c_rank < 0 ? 2 : 3, S("a", "b", "c"), 1, S("y"));
    if (c->ta) attr_i(&g, n, "transA", 1);
    if (c->tb) attr_i(&g, n, "transB", 1);
    if (c->alpha != 1) attr_f(&g, n, "alpha", c->alpha);
    if (c->beta != 1) attr_f(&g, n, "beta", c->beta);
    finalize_ok(&g);
    char label[240], suffix[96];
    snprintf(label, sizeof label, "Gemm %lldx%lldx%lld transA=%d transB=%d C rank %d [%lld,%lld] "
             "alpha=%g beta=%g%s", (long long)c->m, (long long)c->k, (long long)c->n, c->ta, c->tb,
             c->c_rank, (long long)c->c[0], (long long)c->c[1], c->alpha, c->beta,
             mode_suffix(suffix, sizeof suffix));
    /* The longest sums: K forward, N (dA), M (dB), M * N (a scalar dC). */
    int64_t len = max3(c->k, c->n, c->m);
    struct op_compare o = compare_for(label, len);
    op_compare_node(&g, 0, &o);
    gp_graph_free(&g);
}

/* Every transpose combination with every shape of C that broadcasts. */
static void test_gemm_small(void **state)
{
    (void)state;
    static const struct {
        int rank;
        int64_t dims[2];
    } cs[] = {{-1, {0}}, {0, {0}}, {1, {5}}, {1, {1}}, {2, {1, 5}}, {2, {3, 1}}, {2, {3, 5}},
              {2, {1, 1}}};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int k = 0; k < N_OF(cs); k++) {
                struct gemm_case c = {ta, tb, cs[k].rank, {cs[k].dims[0], cs[k].dims[1]}, 0.7f, -1.3f,
                                      3, 4, 5};
                run_gemm(&c);
            }
}

/* Sizes that are neither powers of two nor small, every transpose and the
 * common shapes of C; alpha and beta of 1 and others, beta 0 (C ignored). */
static void test_gemm_large(void **state)
{
    (void)state;
    static const struct {
        int rank;
        int64_t dims[2];
    } cs[] = {{-1, {0}}, {0, {0}}, {1, {77}}, {2, {1, 77}}, {2, {257, 77}}, {2, {257, 1}}};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int k = 0; k < N_OF(cs); k++) {
                struct gemm_case c = {ta, tb, cs[k].rank, {cs[k].dims[0], cs[k].dims[1]}, 1.0f, 1.0f,
                                      257, 130, 77};
                run_gemm(&c);
            }
    struct gemm_case more[] = {
        {0, 1, 1, {77}, 0.5f, 2.0f, 257, 130, 77},
        {1, 0, 2, {257, 77}, -1.5f, 0.25f, 257, 130, 77},
        {0, 0, 2, {257, 77}, 1.0f, 0.0f, 257, 130, 77}, /* beta 0: no C at all */
        {0, 1, 1, {1000}, 1.0f, 1.0f, 64, 512, 1000},   /* a classifier head */
        {0, 1, 1, {33}, 1.0f, 1.0f, 1, 2049, 33},       /* one row */
        {1, 1, 0, {0}, 2.0f, -0.5f, 300, 7, 1},         /* one column, scalar C */
    };
    for (int i = 0; i < N_OF(more); i++) run_gemm(&more[i]);
}

/* ---- MatMul ---- */

static void run_matmul(int ra, const int64_t *a, int rb, const int64_t *b)
{
    struct gp_graph g;
    begin(&g, 13);
    input(&g, "a", ra, a);
    input(&g, "b", rb, b);
    node(&g, "MatMul", 2, S("a", "b"), 1, S("y"));
    finalize_ok(&g);
    char label[280], sa[80] = "", sb[80] = "", suffix[96];
    int64_t batch = 1, m = ra >= 2 ? a[ra - 2] : 1, k = a[ra - 1], n = rb >= 2 ? b[rb - 1] : 1;
    for (int i = 0; i < ra; i++)
        snprintf(sa + strlen(sa), sizeof sa - strlen(sa), "%s%lld", i ? "," : "", (long long)a[i]);
    for (int i = 0; i < rb; i++)
        snprintf(sb + strlen(sb), sizeof sb - strlen(sb), "%s%lld", i ? "," : "", (long long)b[i]);
    snprintf(label, sizeof label, "MatMul [%s] x [%s]%s", sa, sb, mode_suffix(suffix, sizeof suffix));
    const struct gp_shape *y = &g.values[g.nodes[0].outputs[0]].shape;
    batch = gp_shape_numel(y) / (m * n > 0 ? m * n : 1);
    /* A broadcast operand's gradient sums over up to the whole batch. */
    int64_t len = max3(k, n * batch, m * batch);
    struct op_compare o = compare_for(label, len);
    op_compare_node(&g, 0, &o);
    gp_graph_free(&g);
}

static void test_matmul(void **state)
{
    (void)state;
    static const struct {
        int ra, rb;
        int64_t a[5], b[5];
    } cases[] = {
        /* 2-D, small and large. */
        {2, 2, {3, 4}, {4, 5}},
        {2, 2, {257, 130}, {130, 77}},
        /* 1-D operands. */
        {1, 2, {130}, {130, 77}},
        {2, 1, {257, 130}, {130}},
        {1, 1, {130}, {130}},
        {1, 3, {4}, {2, 4, 3}},
        {3, 1, {2, 3, 4}, {4}},
        /* A batch against one matrix (folded into rows), both ways. */
        {3, 2, {2, 3, 4}, {4, 5}},
        {4, 2, {2, 3, 4, 5}, {5, 6}},
        {3, 2, {8, 65, 96}, {96, 80}},
        {2, 3, {3, 4}, {2, 4, 5}},
        {2, 3, {65, 96}, {8, 96, 80}},
        /* Batches on both sides, equal and broadcast. */
        {3, 3, {4, 33, 17}, {4, 17, 29}},
        {4, 4, {2, 3, 16, 8}, {2, 3, 8, 16}},
        {4, 3, {2, 1, 4, 5}, {3, 5, 6}},
        {4, 3, {2, 1, 3, 4}, {3, 4, 2}},
        {3, 3, {1, 3, 4}, {2, 4, 5}},
        {4, 4, {2, 2, 3, 4}, {2, 1, 4, 2}},
        {4, 4, {5, 1, 7, 9}, {1, 6, 9, 11}},
        {5, 3, {2, 3, 1, 5, 7}, {4, 7, 3}},
    };
    for (int k = 0; k < N_OF(cases); k++)
        run_matmul(cases[k].ra, cases[k].a, cases[k].rb, cases[k].b);
}

/* TF32 allowed: the compute type and math mode of that path run. */
static void test_tf32(void **state)
{
    (void)state;
    tf32_mode = true;
    struct gemm_case g1 = {0, 1, 1, {77}, 1.0f, 1.0f, 257, 130, 77};
    run_gemm(&g1);
    run_matmul(4, (const int64_t[]){2, 1, 40, 64}, 3, (const int64_t[]){3, 64, 33});
    run_matmul(3, (const int64_t[]){8, 65, 96}, 2, (const int64_t[]){96, 80});
    tf32_mode = false;
}

/* ---- bf16 ---- */

#define IN(k) (1u << (k))

static void bf16_set(uint32_t params, uint32_t f32_inputs, uint32_t f32_outputs)
{
    bf16_mode = true;
    bf16_params = params;
    bf16_f32_inputs = f32_inputs;
    bf16_f32_outputs = f32_outputs;
}

static void bf16_off(void)
{
    bf16_mode = false;
    bf16_params = bf16_f32_inputs = bf16_f32_outputs = 0;
}

/* Gemm in bfloat16: every transpose with every shape of C, B and C as
 * parameters (float32 gradients; the weight a bfloat16 copy, the bias read
 * as its bfloat16 copy or as float32 directly), then all activations
 * (bfloat16 gradients into dC too), a float32 Y, alpha and beta that are
 * not 1 (cuBLAS applies beta to the C copied into Y), beta 0, and sizes of
 * real layers. */
static void test_gemm_bf16(void **state)
{
    (void)state;
    static const struct {
        int rank;
        int64_t dims[2];
    } cs[] = {{-1, {0}}, {0, {0}}, {1, {5}}, {1, {1}}, {2, {1, 5}}, {2, {3, 1}}, {2, {3, 5}},
              {2, {1, 1}}};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int k = 0; k < N_OF(cs); k++) {
                struct gemm_case c = {ta, tb, cs[k].rank, {cs[k].dims[0], cs[k].dims[1]}, 0.7f, -1.3f,
                                      3, 4, 5};
                bf16_set(IN(1) | IN(2), k % 2 ? IN(2) : 0, 0);
                run_gemm(&c);
                bf16_set(0, 0, 0); /* A, B and C activations: every gradient bfloat16 */
                run_gemm(&c);
            }
    static const struct {
        struct gemm_case c;
        uint32_t params, f32_inputs, f32_outputs;
    } more[] = {
        {{0, 1, 1, {77}, 1.0f, 1.0f, 257, 130, 77}, IN(1) | IN(2), 0, 0},         /* a linear layer */
        {{0, 1, 1, {77}, 1.0f, 1.0f, 257, 130, 77}, IN(1) | IN(2), IN(2), 0},     /* its bias float32 */
        {{1, 0, 2, {257, 77}, -1.5f, 0.25f, 257, 130, 77}, IN(1) | IN(2), 0, 0},
        {{1, 1, 2, {1, 77}, 0.5f, 2.0f, 257, 130, 77}, 0, 0, 0},
        {{0, 0, 2, {257, 1}, 1.0f, 1.0f, 257, 130, 77}, IN(0), IN(2), 0},
        {{0, 0, 2, {257, 77}, 1.0f, 0.0f, 257, 130, 77}, IN(1) | IN(2), 0, 0},   /* beta 0: no C */
        {{0, 1, 1, {77}, 1.0f, 1.0f, 257, 130, 77}, IN(1) | IN(2), 0, IN(0)},    /* Y float32 */
        {{0, 1, 1, {1000}, 1.0f, 1.0f, 64, 512, 1000}, IN(1) | IN(2), 0, 0},     /* a classifier head */
        {{0, 1, 1, {33}, 1.0f, 1.0f, 1, 2049, 33}, IN(1) | IN(2), IN(2), 0},     /* one row */
        {{1, 1, 0, {0}, 2.0f, -0.5f, 300, 7, 1}, IN(1), 0, 0},                    /* one column, scalar C */
        {{0, 1, -1, {0}, 1.0f, 1.0f, 512, 768, 768}, IN(1), 0, 0},               /* no C, K 768 */
    };
    for (int i = 0; i < N_OF(more); i++) {
        bf16_set(more[i].params, more[i].f32_inputs, more[i].f32_outputs);
        run_gemm(&more[i].c);
    }
    bf16_off();
}

/* MatMul in bfloat16: a weight shared by a batch of activations (folded
 * into rows; the weight a parameter), activations on both sides (attention),
 * and broadcast operands whose per-entry products are summed in float32
 * into a bfloat16 (activation) or float32 (parameter) gradient. */
static void test_matmul_bf16(void **state)
{
    (void)state;
    static const struct {
        int ra, rb;
        int64_t a[5], b[5];
        uint32_t params;
    } cases[] = {
        {2, 2, {3, 4}, {4, 5}, IN(1)},
        {2, 2, {257, 130}, {130, 77}, IN(1)},
        {2, 2, {257, 130}, {130, 77}, 0},
        {1, 2, {130}, {130, 77}, IN(1)},
        {2, 1, {257, 130}, {130}, 0},
        {1, 1, {130}, {130}, 0},
        {1, 3, {4}, {2, 4, 3}, 0},
        {3, 1, {2, 3, 4}, {4}, IN(1)},
        {3, 2, {2, 3, 4}, {4, 5}, IN(1)},
        {4, 2, {2, 3, 4, 5}, {5, 6}, IN(1)},
        {3, 2, {8, 65, 96}, {96, 80}, IN(1)},
        {3, 2, {4, 128, 768}, {768, 256}, IN(1)},          /* a transformer's projection */
        {2, 3, {3, 4}, {2, 4, 5}, IN(0)},
        {2, 3, {65, 96}, {8, 96, 80}, IN(0)},               /* a shared A, summed into float32 */
        {2, 3, {65, 96}, {8, 96, 80}, 0},                   /* ... into bfloat16 */
        {3, 3, {4, 33, 17}, {4, 17, 29}, 0},
        {4, 4, {2, 4, 64, 32}, {2, 4, 32, 64}, 0},          /* attention scores */
        {4, 4, {2, 3, 16, 8}, {2, 3, 8, 16}, 0},
        {4, 3, {2, 1, 4, 5}, {3, 5, 6}, 0},
        {4, 3, {2, 1, 4, 5}, {3, 5, 6}, IN(1)},
        {4, 3, {2, 1, 3, 4}, {3, 4, 2}, IN(0)},
        {3, 3, {1, 3, 4}, {2, 4, 5}, 0},
        {4, 4, {2, 2, 3, 4}, {2, 1, 4, 2}, IN(1)},
        {4, 4, {5, 1, 7, 9}, {1, 6, 9, 11}, 0},
        {4, 4, {5, 1, 7, 9}, {1, 6, 9, 11}, IN(0) | IN(1)},
        {5, 3, {2, 3, 1, 5, 7}, {4, 7, 3}, IN(1)},
    };
    for (int k = 0; k < N_OF(cases); k++) {
        bf16_set(cases[k].params, 0, 0);
        run_matmul(cases[k].ra, cases[k].a, cases[k].rb, cases[k].b);
    }
    bf16_set(IN(1), 0, IN(0)); /* a float32 Y, from bfloat16 operands */
    run_matmul(3, (const int64_t[]){8, 65, 96}, 2, (const int64_t[]){96, 80});
    run_matmul(4, (const int64_t[]){2, 1, 4, 5}, 3, (const int64_t[]){3, 5, 6});
    bf16_off();
}

/* ---- MatMul with a fused bias (graph/fuse.c) ----
 * x [.., K] @ W (+ b [N]) as a Linear layer exports it, Add(MatMul(x, W), b)
 * or with W transposed, fused at finalize into one MatMul with b as input 2:
 * forward through cuBLASLt's bias epilogue (or cublasGemmEx and the bias
 * pass where cuBLASLt has no algorithm), b's gradient the column sums of
 * dY. The CPU's fused kernel is the reference; in bf16 b is read through
 * its bfloat16 copy as the weight is (pipeline/plan.c; autocast rounds a
 * Linear's bias to bfloat16 too), on both sides, with a float32 gradient. */
static void run_matmul_bias(int ra, const int64_t *a, int64_t n, bool trans_b, bool bias_first)
{
    struct gp_graph g;
    struct gp_error err = {0};
    begin(&g, 13);
    input(&g, "a", ra, a);
    int64_t k = a[ra - 1];
    float *w = pattern(k * n, (struct pat)PAT_W), *b = pattern(n, (struct pat)PAT_B);
    struct gp_shape ws = {.rank = 2, .dims = {trans_b ? n : k, trans_b ? k : n}};
    if (gp_graph_add_const_f32(&g, "w", &ws, w, &err) != GP_OK) fail_msg("%s", err.msg);
    const_f32(&g, "bias", n, b);
    if (trans_b) {
        if (gp_graph_add_node(&g, "Transpose", "", "t", 1, S("w"), 1, S("wt"), &err) < 0) fail_msg("%s", err.msg);
        if (gp_graph_add_node(&g, "MatMul", "", "mm", 2, S("a", "wt"), 1, S("p"), &err) < 0) fail_msg("%s", err.msg);
    } else if (gp_graph_add_node(&g, "MatMul", "", "mm", 2, S("a", "w"), 1, S("p"), &err) < 0) {
        fail_msg("%s", err.msg);
    }
    node(&g, "Add", 2, bias_first ? S("bias", "p") : S("p", "bias"), 1, S("y"));
    finalize_ok(&g);
    assert_int_equal(g.n_nodes, 1);
    assert_true(g.nodes[0].fused_bias);
    assert_int_equal(g.nodes[0].trans_b, trans_b);
    char label[280], sa[80] = "", suffix[96];
    for (int i = 0; i < ra; i++)
        snprintf(sa + strlen(sa), sizeof sa - strlen(sa), "%s%lld", i ? "," : "", (long long)a[i]);
    snprintf(label, sizeof label, "MatMul%s+bias [%s] x [%lld, %lld]%s", trans_b ? "(B^T)" : "", sa, (long long)k,
             (long long)n, mode_suffix(suffix, sizeof suffix));
    int64_t rows = gp_shape_numel(&g.values[g.inputs[0]].shape) / k;
    struct op_compare o = compare_for(label, max3(k, n, rows));
    op_compare_node(&g, 0, &o);
    gp_graph_free(&g);
    free(w);
    free(b);
}

static const struct {
    int ra;
    int64_t a[4], n;
    bool trans_b, bias_first;
} bias_cases[] = {
    {2, {3, 4}, 5, false, false},               /* no run fits: the plain kernels */
    {3, {2, 3, 8}, 16, true, true},
    {2, {257, 128}, 72, false, true},
    {3, {2, 128, 768}, 2304, true, false},      /* GPT-2's attention projection (c_attn) */
    {3, {2, 128, 768}, 2304, false, false},
    {3, {2, 128, 3072}, 768, true, false},      /* its MLP's down projection */
    {1, {96}, 40, false, false},                /* a 1-D x: one row */
};

static void test_matmul_bias(void **state)
{
    (void)state;
    for (int i = 0; i < N_OF(bias_cases); i++)
        run_matmul_bias(bias_cases[i].ra, bias_cases[i].a, bias_cases[i].n, bias_cases[i].trans_b,
                        bias_cases[i].bias_first);
    tf32_mode = true;
    for (int i = 0; i < N_OF(bias_cases); i++)
        run_matmul_bias(bias_cases[i].ra, bias_cases[i].a, bias_cases[i].n, bias_cases[i].trans_b,
                        bias_cases[i].bias_first);
    tf32_mode = false;
}

static void test_matmul_bias_bf16(void **state)
{
    (void)state;
    /* x an activation, W and b parameters (read through their bfloat16
     * copies, with float32 gradients). */
    bf16_set(IN(1) | IN(2), 0, 0);
    for (int i = 0; i < N_OF(bias_cases); i++)
        run_matmul_bias(bias_cases[i].ra, bias_cases[i].a, bias_cases[i].n, bias_cases[i].trans_b,
                        bias_cases[i].bias_first);
    /* ... into a float32 Y. */
    bf16_set(IN(1) | IN(2), 0, IN(0));
    run_matmul_bias(3, (const int64_t[]){2, 128, 768}, 2304, true, false);
    bf16_off();
}

int main(void)
{
    op_compare_require_device();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_small),
        cmocka_unit_test(test_gemm_large),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_tf32),
        cmocka_unit_test(test_gemm_bf16),
        cmocka_unit_test(test_matmul_bf16),
        cmocka_unit_test(test_matmul_bias),
        cmocka_unit_test(test_matmul_bias_bf16),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (failed == 0)
        printf("cuda_matmul: PASSED, %d ops (%d cases against the CPU kernels)\n", op_compare_op_types(),
               op_compare_cases());
    return failed ? 1 : 0;
}
