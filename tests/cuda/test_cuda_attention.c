/* The CUDA Attention kernels (cuda/attention.cu: tiled forward, dQ and
 * dK/dV backward passes) against the CPU float kernel, the reference,
 * through op_compare: the output and the gradients of Q, K and V (added to
 * nonzero initial gradients: the kernels must accumulate).
 *
 * Cases: the 4-D and 3-D forms; head sizes 64 and 128 (the two templates)
 * and smaller ones (16, 40: lanes past the head idle), V's head size other
 * than Q's; sequence lengths that are not multiples of the tiles (32 keys,
 * 16 or 8 rows), Tq != Tk; causal (tiles above the diagonal skipped, in the
 * forward and both backward passes), an additive float mask broadcast from
 * [Tq, Tk], a bool mask per batch ([B, 1, Tq, Tk]) with a fully masked
 * row (its output 0, no gradient); GPT-2's shape (12 heads of 64, 256
 * tokens, causal, 3-D); packed Q, K, V (a Split of one [B, T, 3 * C] input
 * into thirds, absorbed at load: read at offsets 0, C, 2 * C with row
 * stride 3 * C, the three gradients added into the one input's): GPT-2's
 * shape (B 2), and 3 heads of 40 with the bool mask. Each again in
 * bfloat16 storage (bf16_any).
 *
 * Float32 calls run the tensor-core kernels in 3xTF32 (each operand split
 * in two TF32 parts: within about 2^-20 of each product) and, in
 * test_attention_fma, the CUDA-core kernels (GP_ATTENTION_FP32=fma); every
 * own-kernel call of the first must have run in 3xTF32, none of the
 * second's. Tolerance, both: float32 sums of up to Tk terms in another
 * order (the CPU sums its dot products in double), CUDA's expf or the
 * hardware's ex2 (2^-22): 1e-4 relative plus 2e-5 of each tensor's largest
 * element.
 *
 * cuDNN's SDPA (cuda/attention_graph.cpp) runs the bf16 calls it supports
 * (no mask or causal, head sizes multiples of 8): some of the cases above,
 * and GPT-2's shapes (12 heads of 64, T 256 and 1024, causal, 3-D and 4-D;
 * and one without the causal mask; packed Q, K, V at T 256 and 1024,
 * cuDNN reading the thirds through input 0's strides and offsets and
 * writing dQ, dK, dV into one packed scratch), which must run there when the build
 * has cudnn-frontend (unless GP_ATTENTION_CUDNN=0 is set: then the own
 * kernels). The other bf16 cases run twice, on the own kernels
 * (GP_ATTENTION_CUDNN=0) and on the default paths. Each bf16 case prints
 * which path ran, and why not cuDNN's. cuDNN rounds the probabilities to
 * bfloat16 before their product with V (and dS before dQ, dK), an error of
 * 2^-9 of each term: within the bf16 bounds of op_compare.h, with 4e-3 of
 * each tensor's largest element for sums of 1024 terms.
 *
 * First writers (din_overwrite): GPT-2's shapes packed, 3-D and 4-D with
 * cuDNN writing the gradients straight (and through scratch into float32
 * gradients), some of the cases above on the own kernels (float32, bf16,
 * and GPT-2's again with GP_ATTENTION_CUDNN=0): the gradients, poisoned
 * with NaN beforehand, against the CPU and, bit for bit, against the call
 * that adds them into zeros from the same draws.
 *
 * TF32 (ctx->tf32; cuda/attention_tf32.cu, mma.sync on tensor cores): every
 * case above and the tf32 cases below (GPT-2's head at batch 2, 4-D, 3-D
 * and packed; head size 128; no mask; lengths 100 and 33 and Tq != Tk, so
 * that tiles of 64 rows and of 64 or 32 keys end partly filled), float32
 * and bfloat16 storage (bf16 with GP_ATTENTION_CUDNN=0, unless the caller
 * set it, so that the TF32 kernels and not cuDNN's take them), forward and
 * backward, each run twice for the same bits, and first writers. Every
 * call that stays off cuDNN must run the TF32 kernels
 * (gp_cuda_attention_tf32_calls; GP_ATTENTION_VERBOSE=1 names them
 * tf32-mma-kernels). Tolerance: Q, K, V, dY, P and dS are rounded to
 * TF32 (2^-11 relative) before their products, so a score s = scale q.k
 * is off by up to about 2^-10 scale sum_d |q_d k_d| (~1e-2 for head size
 * 64 and values in [-2, 2), its random-walk size ~1e-3), which moves each
 * probability by that much relative; Y, a weighted mean of V, and the
 * gradients, sums of such terms against float32 ones, are off by about
 * that fraction of their scale: 1e-2 relative plus 1e-2 of each tensor's
 * largest element (bf16: 1e-2 of it on top of op_compare.h's bounds).
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

#include "backend/cuda/kernel.h"
#include "cuda/op_compare.h"
#include "kernel_graph.h"

#define I64(...) ((const int64_t[]){__VA_ARGS__})
#define S(...) ((const char *const[]){__VA_ARGS__})

struct attn_case {
    const char *label;
    bool three_d;
    int64_t b, h, tq, tk, d, dv;
    int mask; /* 0 none, 1 additive float [tq, tk], 2 bool [b, 1, tq, tk] */
    bool causal;
    bool packed; /* 3-D, Tq = Tk, D = Dv: Q, K, V the thirds of input qkv [B, T, 3 * C] */
};

static void constant(struct gp_graph *g, const char *name, enum gp_dtype dt, int rank, const int64_t *dims,
                     double (*f)(int64_t))
{
    struct gp_error err = {0};
    struct gp_shape s = {.rank = rank};
    for (int i = 0; i < rank; i++) s.dims[i] = dims[i];
    struct gp_tensor *t = gp_graph_new_tensor(g, dt, &s);
    assert_non_null(t);
    for (int64_t i = 0; i < gp_shape_numel(&s); i++) gp_tensor_set_f64(t, i, f(i));
    if (gp_graph_add_initializer(g, name, t, &err) != GP_OK) fail_msg("%s", err.msg);
}

static int64_t mask_tq, mask_tk; /* the case's lengths, for the mask generators */
static double add_value(int64_t i) { return (double)((i * 7) % 5) - 2; }
/* Two keys of three; batch 1's first row none at all. */
static double keep_value(int64_t i)
{
    int64_t b = i / (mask_tq * mask_tk), row = i / mask_tk % mask_tq, col = i % mask_tk;
    return !(b == 1 && row == 0) && (row + col) % 3 != 1;
}

static void build(struct gp_graph *g, const struct attn_case *c)
{
    struct gp_error err = {0};
    if (gp_graph_init(g, 0, 23, 64, 16, &err) != GP_OK) fail_msg("%s", err.msg);
    if (c->packed) {
        /* Split into thirds along the last axis: absorbed by the fusion.
         * Not through node(), which makes every output a graph output: a
         * part that is one stays (graph/fuse_attention.c). */
        input(g, "qkv", 3, I64(c->b, c->tq, 3 * c->h * c->d));
        int n = gp_graph_add_node(g, "Split", "", "split", 1, S("qkv"), 3, S("q", "k", "v"), &err);
        if (n < 0) fail_msg("%s", err.msg);
        attr_i(g, n, "num_outputs", 3);
        attr_i(g, n, "axis", -1);
    } else if (c->three_d) {
        input(g, "q", 3, I64(c->b, c->tq, c->h * c->d));
        input(g, "k", 3, I64(c->b, c->tk, c->h * c->d));
        input(g, "v", 3, I64(c->b, c->tk, c->h * c->dv));
    } else {
        input(g, "q", 4, I64(c->b, c->h, c->tq, c->d));
        input(g, "k", 4, I64(c->b, c->h, c->tk, c->d));
        input(g, "v", 4, I64(c->b, c->h, c->tk, c->dv));
    }
    mask_tq = c->tq, mask_tk = c->tk;
    if (c->mask == 1) {
        /* Integers cast to float fold into a constant (a float initializer
         * read directly would be a trainable parameter). */
        constant(g, "mi", GP_DTYPE_INT64, 2, I64(c->tq, c->tk), add_value);
        int n = gp_graph_add_node(g, "Cast", "", "cast", 1, S("mi"), 1, S("m"), &err);
        if (n < 0) fail_msg("%s", err.msg);
        attr_i(g, n, "to", GP_DTYPE_FLOAT32);
    } else if (c->mask == 2) {
        /* Batch 1's first row masks every key. */
        constant(g, "m", GP_DTYPE_BOOL, 4, I64(c->b, 1, c->tq, c->tk), keep_value);
    }
    int n = node(g, "Attention", c->mask ? 4 : 3, c->mask ? S("q", "k", "v", "m") : S("q", "k", "v"), 1, S("y"));
    if (c->causal) attr_i(g, n, "is_causal", 1);
    if (c->three_d) {
        attr_i(g, n, "q_num_heads", c->h);
        attr_i(g, n, "kv_num_heads", c->h);
    }
    finalize_ok(g);
    assert_int_equal(g->n_nodes, 1);
    assert_int_equal(g->nodes[0].packed_qkv, c->packed);
}

static const struct attn_case cases[] = {
    {"4-D, D 64, T 100", false, 2, 3, 100, 100, 64, 64, 0, false},
    {"4-D, D 64, causal, T 77", false, 2, 2, 77, 77, 64, 64, 0, true},
    {"4-D, D 16, Dv 40, Tq 9 Tk 50", false, 1, 2, 9, 50, 16, 40, 0, false},
    {"4-D, D 128, Dv 96, causal + additive mask, Tq 40 Tk 70", false, 2, 2, 40, 70, 128, 96, 1, true},
    {"3-D, 4 heads of 32, bool mask with a fully masked row", true, 2, 4, 33, 45, 32, 32, 2, false},
    {"3-D, 12 heads of 64, causal, T 256 (GPT-2's head)", true, 1, 12, 256, 256, 64, 64, 0, true},
    {"3-D, 1 head of 128 (nn.MultiheadAttention's [N, T, D])", true, 6, 1, 31, 31, 128, 128, 0, false},
    {"3-D packed Q, K, V, 12 heads of 64, causal, T 256 (GPT-2's)", true, 2, 12, 256, 256, 64, 64, 0, true, true},
    {"3-D packed Q, K, V, 3 heads of 40, bool mask, T 45", true, 2, 3, 45, 45, 40, 40, 2, false, true},
};

/* GPT-2 small's attention (12 heads of 64) in bf16, for cuDNN's SDPA. */
static const struct attn_case cudnn_cases[] = {
    {"3-D, 12 heads of 64, causal, T 256", true, 2, 12, 256, 256, 64, 64, 0, true},
    {"4-D, 12 heads of 64, causal, T 256", false, 2, 12, 256, 256, 64, 64, 0, true},
    {"3-D, 12 heads of 64, T 256", true, 1, 12, 256, 256, 64, 64, 0, false},
    {"3-D, 12 heads of 64, causal, T 1024", true, 1, 12, 1024, 1024, 64, 64, 0, true},
    {"4-D, 12 heads of 64, causal, T 1024", false, 1, 12, 1024, 1024, 64, 64, 0, true},
    {"3-D packed Q, K, V, 12 heads of 64, causal, T 256", true, 2, 12, 256, 256, 64, 64, 0, true, true},
    {"3-D packed Q, K, V, 12 heads of 64, causal, T 1024", true, 1, 12, 1024, 1024, 64, 64, 0, true, true},
};

/* TF32 on GPT-2's head at batch 2 (4-D, 3-D, packed), head size 128, no
 * mask, and lengths that leave the tiles partly filled (64 query rows or
 * keys per block, 64 or 32 walked). */
static const struct attn_case tf32_cases[] = {
    {"4-D, 12 heads of 64, causal, T 256 (GPT-2's)", false, 2, 12, 256, 256, 64, 64, 0, true},
    {"3-D, 12 heads of 64, causal, T 256 (GPT-2's)", true, 2, 12, 256, 256, 64, 64, 0, true},
    {"3-D packed Q, K, V, 12 heads of 64, causal, T 256 (GPT-2's)", true, 2, 12, 256, 256, 64, 64, 0, true, true},
    {"4-D, D 128, T 100", false, 2, 2, 100, 100, 128, 128, 0, false},
    {"4-D, D 128, causal, T 100", false, 1, 3, 100, 100, 128, 128, 0, true},
    {"4-D, D 64, T 33", false, 2, 3, 33, 33, 64, 64, 0, false},
    {"3-D, 4 heads of 64, causal, T 100", true, 2, 4, 100, 100, 64, 64, 0, true},
    {"4-D, D 64, Tq 100 Tk 33", false, 1, 2, 100, 33, 64, 64, 0, false},
    {"4-D, D 128, causal, Tq 33 Tk 100", false, 1, 2, 33, 100, 128, 128, 0, true},
    {"3-D packed Q, K, V, 2 heads of 128, causal, T 33", true, 2, 2, 33, 33, 128, 128, 0, true, true},
};

/* Set while the TF32 cases run: ctx->tf32, their tolerances (the
 * header's), two runs for the same bits. */
static bool tf32_mode;

/* Set while the float32 cases run on the CUDA-core kernels
 * (GP_ATTENTION_FP32=fma). */
static bool fma_mode;

/* The comparison of case c: its tolerances (the header's). */
static struct op_compare compare_of(const struct attn_case *c, const char *label, bool bf16)
{
    struct op_compare o = {.label = label, .rel_tol = 1e-4, .abs_tol = 2e-5, .scale_abs_tol = true,
                           .bf16 = bf16};
    /* A constant mask stays float32 beside bfloat16 activations. */
    if (bf16 && c->mask == 1) o.f32_inputs = 1u << 3;
    if (bf16) o.abs_tol = c->tk > 256 ? 4e-3 : 1e-3;
    if (tf32_mode) o.tf32 = true, o.twice = true, o.rel_tol = 1e-2, o.abs_tol = 1e-2;
    return o;
}

/* TF32: every call of the case that stayed off cuDNN ran the TF32 kernels
 * (and at least one did, unless cuDNN took all), since the counts were
 * own0 and tf0. */
static void check_tf32_path(const char *label, unsigned long long own0, unsigned long long tf0)
{
    if (!tf32_mode) return;
    unsigned long long cudnn1, own1;
    char why[512];
    gp_cuda_attention_paths(&cudnn1, &own1, why, sizeof why);
    unsigned long long tf1 = gp_cuda_attention_tf32_calls();
    if (tf1 - tf0 != own1 - own0)
        fail_msg("%s: %llu calls on the own kernels, %llu of them on the TF32 ones", label, own1 - own0, tf1 - tf0);
}

/* Float32 (no TF32): every own-kernel call since own0 ran in 3xTF32, or
 * none did (fma_mode), since the count was x30. */
static void check_x3_path(const char *label, unsigned long long own0, unsigned long long x30)
{
    if (tf32_mode) return;
    unsigned long long cudnn1, own1;
    char why[512];
    gp_cuda_attention_paths(&cudnn1, &own1, why, sizeof why);
    unsigned long long x31 = gp_cuda_attention_x3_calls(), want = fma_mode ? 0 : own1 - own0;
    if (x31 - x30 != want)
        fail_msg("%s: %llu calls on the own kernels, %llu of them in 3xTF32 (%llu expected)", label, own1 - own0,
                 x31 - x30, want);
}

/* Prints the path of the call (forward and backward) since `cudnn0`
 * cuDNN calls; fails when `must_cudnn` and cuDNN's did not run it, unless
 * the build or the environment rules it out. */
static void report_path(const char *label, unsigned long long cudnn0, bool must_cudnn)
{
    unsigned long long cudnn1, own1;
    char why[512];
    gp_cuda_attention_paths(&cudnn1, &own1, why, sizeof why);
    bool ran = cudnn1 - cudnn0 == 2; /* forward and backward */
    printf("%-72s %s%s%s\n", label, ran ? "cuDNN SDPA" : cudnn1 > cudnn0 ? "cuDNN forward, own backward" : "own kernels",
           ran ? "" : ": ", ran ? "" : why);
    if (must_cudnn && !ran && !strstr(why, "built without") && !strstr(why, "GP_ATTENTION_CUDNN=0"))
        fail_msg("%s: cuDNN's SDPA did not run it: %s", label, why);
}

/* One case; in bf16, prints the path that ran (and fails when `must_cudnn`
 * and cuDNN's did not, unless the build or the environment rules it out). */
static void run_case(const struct attn_case *c, bool bf16, bool must_cudnn)
{
    struct gp_graph g;
    build(&g, c);
    char label[256];
    snprintf(label, sizeof label, "Attention %s%s%s", c->label, bf16 ? " (bf16)" : "",
             tf32_mode ? " (TF32)" : fma_mode ? " (FMA)" : "");
    struct op_compare o = compare_of(c, label, bf16);
    unsigned long long cudnn0, own0, tf0 = gp_cuda_attention_tf32_calls(), x30 = gp_cuda_attention_x3_calls();
    char why[512];
    gp_cuda_attention_paths(&cudnn0, &own0, why, sizeof why);
    op_compare_node(&g, 0, &o);
    if (bf16 && !tf32_mode) report_path(label, cudnn0, must_cudnn);
    check_tf32_path(label, own0, tf0);
    check_x3_path(label, own0, x30);
    gp_graph_free(&g);
}

/* Inputs (bit k) holding Q, K and V: input 0 alone when packed. */
static uint32_t qkv_bits(const struct attn_case *c) { return c->packed ? 1u : 7u; }

/* Case c with the gradients of Q, K and V written whole (the layer their
 * first writer: din_overwrite; NaN in them beforehand), against the CPU,
 * then bit for bit against the call that adds them into zeros from the
 * same values (0 + x, -0 made +0 as the add makes it). `f32_grads`: those
 * gradients float32 beside bfloat16 activations (a bf16 call whose
 * gradients cuDNN cannot write straight: through scratch, written as
 * 0 + g). */
static void run_first_writer(const struct attn_case *c, bool bf16, bool f32_grads, bool must_cudnn)
{
    struct gp_graph g;
    build(&g, c);
    const struct gp_cuda_kernel *kern = gp_cuda_kernel_for(&g.nodes[0]);
    uint32_t qkv = qkv_bits(c);
    for (int k = 0; k < g.nodes[0].n_inputs; k++) {
        bool want = (qkv >> k) & 1;
        if (!kern->overwrites || kern->overwrites(&g, &g.nodes[0], k) != want)
            fail_msg("%s: Attention's overwrites hook says %s for input %d", c->label, want ? "no" : "yes", k);
    }
    char label[256];
    snprintf(label, sizeof label, "Attention %s%s%s%s, first writer", c->label, bf16 ? " (bf16)" : "",
             f32_grads ? " float32 gradients" : "", tf32_mode ? " (TF32)" : "");
    float *written[OP_COMPARE_MAX_INPUTS], *added[OP_COMPARE_MAX_INPUTS];
    struct op_compare o = compare_of(c, label, bf16);
    /* Against the CPU these cases catch gradients left unwritten (NaN
     * poison), misplaced or added twice: errors of the gradients' own size.
     * The precision of cuDNN's bfloat16 backward (dS rounded to bfloat16
     * before dS^T Q: sums that cancel, here one value of GPT-2's dK 13% off
     * with this seed, written or added alike) is test_attention_cudnn's
     * subject; these take the long rows' allowance. */
    if (bf16) o.abs_tol = 4e-3;
    o.seed = 0x9e3779b97f4a7c15ull; /* both calls draw the same Q, K, V and dY */
    if (f32_grads) o.params = qkv;
    /* Added into zeros first: where the CPU comparison fails there too,
     * the values (not the first writer's stores) are off. */
    char label_added[300];
    snprintf(label_added, sizeof label_added, "%s (added into zeros)", label);
    o.label = label_added, o.zero_grads = qkv, o.got_dx = added;
    op_compare_node(&g, 0, &o);
    o.label = label, o.zero_grads = 0, o.overwrite = qkv, o.got_dx = written;
    unsigned long long cudnn0, own0, tf0 = gp_cuda_attention_tf32_calls();
    char why[512];
    gp_cuda_attention_paths(&cudnn0, &own0, why, sizeof why);
    op_compare_node(&g, 0, &o);
    if (bf16 && !tf32_mode) report_path(label, cudnn0, must_cudnn);
    check_tf32_path(label, own0, tf0);
    for (int k = 0; k < g.nodes[0].n_inputs; k++) {
        if ((qkv >> k) & 1) {
            int64_t n = gp_shape_numel(&gp_node_input(&g, &g.nodes[0], k)->shape);
            if (!written[k] || !added[k]) fail_msg("%s: no gradient of input %d", label, k);
            for (int64_t i = 0; i < n; i++) {
                uint32_t w, a;
                memcpy(&w, &written[k][i], 4);
                memcpy(&a, &added[k][i], 4);
                if (w != a)
                    fail_msg("%s: gradient of input %d, element %lld: written 0x%08x, added into zeros 0x%08x", label,
                             k, (long long)i, (unsigned)w, (unsigned)a);
            }
        }
        free(written[k]);
        free(added[k]);
    }
    gp_graph_free(&g);
}

/* Whether GP_ATTENTION_CUDNN was set by the caller (then it is obeyed). */
static bool user_choice;

static void run_cases(bool bf16)
{
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) run_case(&cases[k], bf16, false);
}

static void test_attention(void **state)
{
    (void)state;
    run_cases(false);
}

/* The float32 cases and first writers on the CUDA-core kernels. */
static void test_attention_fma(void **state)
{
    (void)state;
    fma_mode = true;
    setenv("GP_ATTENTION_FP32", "fma", 1);
    run_cases(false);
    run_first_writer(&cases[3], false, false, false); /* 4-D, D 128, Dv 96, causal + additive mask */
    run_first_writer(&cases[4], false, false, false); /* 3-D, bool mask with a fully masked row */
    run_first_writer(&cases[8], false, false, false); /* packed, 3 heads of 40, bool mask */
    unsetenv("GP_ATTENTION_FP32");
    fma_mode = false;
}

/* The bf16 cases on the own kernels (GP_ATTENTION_CUDNN=0), then on the
 * default paths (cuDNN's where it takes the call), unless the caller set
 * GP_ATTENTION_CUDNN: then only that way. */
static void test_attention_bf16(void **state)
{
    (void)state;
    if (user_choice) {
        run_cases(true);
        return;
    }
    setenv("GP_ATTENTION_CUDNN", "0", 1);
    run_cases(true);
    unsetenv("GP_ATTENTION_CUDNN");
    run_cases(true);
}

static void test_attention_cudnn(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof cudnn_cases / sizeof *cudnn_cases; k++) run_case(&cudnn_cases[k], true, true);
}

/* First writers: cuDNN's dQ, dK, dV for bf16 gradients (packed: input
 * 0's thirds; 3-D and 4-D; written straight into the gradients where
 * attention.cu's attention_direct_grads allows, else through scratch,
 * stored as 0 + g), cuDNN through scratch
 * into float32 gradients (written as 0 + g), and the own kernels writing
 * 0 + their sums (float32 and bf16; masks, head sizes the templates pad,
 * packed; the GPT-2 shapes again with GP_ATTENTION_CUDNN=0 unless the
 * caller chose). */
static void test_attention_first_writer(void **state)
{
    (void)state;
    const struct attn_case *packed = &cudnn_cases[5], *three_d = &cudnn_cases[0], *four_d = &cudnn_cases[1];
    run_first_writer(packed, true, false, true);
    run_first_writer(three_d, true, false, true);
    run_first_writer(four_d, true, false, true);
    run_first_writer(packed, true, true, true);
    run_first_writer(three_d, true, true, true);
    run_first_writer(&cases[3], false, false, false); /* 4-D, D 128, Dv 96, causal + additive mask */
    run_first_writer(&cases[4], false, false, false); /* 3-D, bool mask with a fully masked row */
    run_first_writer(&cases[8], false, false, false); /* packed, 3 heads of 40, bool mask */
    run_first_writer(&cases[2], true, false, false);  /* 4-D, D 16, Dv 40, Tq 9 Tk 50: cuDNN's if it builds */
    run_first_writer(&cases[8], true, false, false);  /* packed with a mask: own kernels in bf16 */
    if (user_choice) return;
    setenv("GP_ATTENTION_CUDNN", "0", 1);
    run_first_writer(packed, true, false, false);
    run_first_writer(three_d, true, false, false);
    unsetenv("GP_ATTENTION_CUDNN");
}

/* TF32: the cases above and the tf32 cases, float32 and bfloat16 storage
 * (bf16 on the own kernels, GP_ATTENTION_CUDNN=0, unless the caller chose),
 * then first writers (a float32 and a bf16 case with masks, and GPT-2's
 * packed and 3-D shapes in bf16). */
static void test_attention_tf32(void **state)
{
    (void)state;
    tf32_mode = true;
    if (!user_choice) setenv("GP_ATTENTION_CUDNN", "0", 1);
    /* The path line on stderr (tf32-mma-kernels), for the log. */
    bool verbose = getenv("GP_ATTENTION_VERBOSE") != NULL;
    if (!verbose) setenv("GP_ATTENTION_VERBOSE", "1", 1);
    run_case(&tf32_cases[0], false, false);
    if (!verbose) unsetenv("GP_ATTENTION_VERBOSE");
    for (int bf16 = 0; bf16 < 2; bf16++) {
        for (size_t k = bf16 ? 0 : 1; k < sizeof tf32_cases / sizeof *tf32_cases; k++)
            run_case(&tf32_cases[k], bf16, false);
        run_cases(bf16);
    }
    run_first_writer(&cases[3], false, false, false); /* 4-D, D 128, Dv 96, causal + additive mask */
    run_first_writer(&cases[4], false, false, false); /* 3-D, bool mask with a fully masked row */
    run_first_writer(&tf32_cases[2], false, false, false); /* GPT-2's packed */
    run_first_writer(&cases[8], true, false, false);  /* packed with a mask, bf16 */
    run_first_writer(&cudnn_cases[5], true, false, false); /* GPT-2's packed, bf16 */
    run_first_writer(&cudnn_cases[0], true, true, false);  /* GPT-2's 3-D, bf16, float32 gradients */
    if (!user_choice) unsetenv("GP_ATTENTION_CUDNN");
    tf32_mode = false;
}

int main(void)
{
    op_compare_require_device();
    user_choice = getenv("GP_ATTENTION_CUDNN") != NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_fma),
        cmocka_unit_test(test_attention_bf16),
        cmocka_unit_test(test_attention_cudnn),
        cmocka_unit_test(test_attention_first_writer),
        cmocka_unit_test(test_attention_tf32),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (failed == 0) printf("cuda_attention: PASSED (%d cases against the CPU kernel)\n", op_compare_cases());
    return failed ? 1 : 0;
}
