/* The CUDA normalization kernels (cuda/batch_norm.cu, instance_norm.cu,
 * layer_norm.cu) against the CPU float kernels, the reference:
 * BatchNormalization, InstanceNormalization and LayerNormalization,
 * one-node graphs through op_compare (forward outputs, every input
 * gradient, and the running statistics BatchNormalization updates in
 * place), in training and in evaluation.
 *
 * BatchNormalization: opsets 7, 9, 14, 15 with every output count (the
 * optional outputs' gradients flow back through the batch statistics),
 * epsilon and momentum attributes, inputs of rank 2 (one value per
 * channel and sample: the flat elementwise path) to 5, shapes with several
 * chunks per channel and with more planes than a grid's y dimension. The
 * Each again with a fused Relu (gp_node.fused_relu: the output max(y, 0),
 * dY masked by its sign), whose CPU kernel is checked against the unfused
 * pair bit for bit (test_cpu_pool_norm). The
 * deferred statistics (ctx->deferred_stats) are checked by hand over two
 * micro-batches and a recomputation, then gp_cuda_bn_commit against
 * gp_cpu_bn_commit_f32.
 *
 * LayerNormalization: every axis, with and without B, the optional Mean
 * and InvStdDev outputs, Scale and B broadcast from fewer axes (the CPU's
 * float sums in its own order), GPT-2's [batch, tokens, 768] (also whole:
 * [16, 1024, 768], 16384 rows, more than the fused backward's blocks take
 * in one pass each), and more rows than the parameter gradients have
 * blocks; rows short enough for a warp each (up to 1024: 8 to 32 values
 * a lane, runs of 8 or single values, both limits exactly), for the
 * register kernels, and longer ones (the generic kernels). The parameter
 * gradients of full Scale and B: the column-sum kernel (runs of 8 or
 * single values, every row length). The register kernels move runs of 8, 4, 2 or 1
 * values (rows of 768, 100, 770, 767), hold 4 rows a block (row counts
 * that are not multiples of 4, one row), and take one warp (rows up to
 * 256) or several with a shared-memory step (up to 4096 forward, 2048
 * backward, both limits exactly).
 *
 * bf16 (the kernels read and write bfloat16 themselves, bf16_any): every
 * case again with op_compare's bfloat16 storage (op_compare.h: the CPU
 * float kernel on bfloat16-rounded data is the reference, rounded where
 * the CUDA side stores bfloat16), in the mixes of storage types a bf16
 * stage produces: the executor's (X, Y, dY, dX bfloat16; the parameters
 * and, for BatchNormalization, the running statistics float32, with
 * float32 gradients), everything bfloat16 (parameters that are
 * activations, running statistics updated in place in bfloat16), and
 * others that take the kernels' run-time typed path (X float32 beside a
 * bfloat16 Y, float32 optional outputs, a float32 dX). Every backward
 * starts from nonzero input gradients, so it checks that a bfloat16 dX is
 * accumulated into (+=). The deferred statistics are checked by hand with
 * a bfloat16 X and Y too.
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

#include <cuda_runtime_api.h>

#include "backend/cpu/kernel.h"
#include "backend/cuda/kernel.h"
#include "graph/tensor.h"
#include "cuda/cuda_test_util.h"
#include "cuda/op_compare.h"
#include "kernel_graph.h"


/* ---- BatchNormalization ---- */

struct bn_case {
    const char *label;
    int64_t opset;
    int rank;
    int64_t x[5];
    int n_outputs;      /* Y, running mean, running var, saved mean, saved var */
    bool training_mode; /* the attribute (14+) */
    float eps, momentum; /* 0: absent */
};

/* The running mean "m" and var "v" initializers of ch channels (var
 * positive). */
static void bn_running_stats(struct gp_graph *g, int64_t ch)
{
    float *m = malloc(sizeof(float) * (size_t)ch), *v = malloc(sizeof(float) * (size_t)ch);
    assert_non_null(m);
    assert_non_null(v);
    for (int64_t i = 0; i < ch; i++) {
        m[i] = 0.1f * (float)(i % 7) - 0.3f;
        v[i] = 0.5f + 0.25f * (float)(i % 5);
    }
    const_f32(g, "m", ch, m);
    const_f32(g, "v", ch, v);
    free(m);
    free(v);
}

/* X, scale "s" and B "b" graph inputs (random); running mean "m" and var
 * "v" initializers (var positive). */
static void build_bn(struct gp_graph *g, const struct bn_case *c)
{
    begin(g, c->opset);
    int64_t ch = c->x[1];
    input(g, "x", c->rank, c->x);
    input(g, "s", 1, &ch);
    input(g, "b", 1, &ch);
    bn_running_stats(g, ch);
    int n = node(g, "BatchNormalization", 5, S("x", "s", "b", "m", "v"), c->n_outputs,
                 S("y", "rm", "rv", "sm", "sv"));
    if (c->training_mode) attr_i(g, n, "training_mode", 1);
    if (c->eps) attr_f(g, n, "epsilon", c->eps);
    if (c->momentum) attr_f(g, n, "momentum", c->momentum);
    finalize_ok(g);
}

static const struct bn_case bn_cases[] = {
    {"BN-15 [4,3,5,7]", 15, 4, {4, 3, 5, 7}, 1, false, 0, 0},
    {"BN-15 3 outputs", 15, 4, {4, 3, 5, 7}, 3, true, 1e-3f, 0.8f},
    {"BN-14 3 outputs", 14, 4, {3, 2, 2, 3}, 3, true, 0, 0},
    {"BN-9 5 outputs", 9, 4, {2, 3, 3, 2}, 5, false, 1e-3f, 0.8f},
    {"BN-9 rank 3", 9, 3, {2, 4, 5}, 5, false, 0, 0.7f},
    {"BN-7 5 outputs", 7, 4, {3, 2, 2, 3}, 5, false, 0, 0},
    {"BN-15 rank 2", 15, 2, {37, 5}, 1, false, 0, 0},
    {"BN-15 rank 5", 15, 5, {2, 2, 2, 3, 2}, 3, true, 1e-2f, 0.5f},
    /* Several chunks per channel, planes of 1600 cells. */
    {"BN-15 [8,16,40,40]", 15, 4, {8, 16, 40, 40}, 3, true, 0, 0},
    /* Rank 2 with 1.28M values: the flat loops wrap. */
    {"BN-15 [20000,64]", 15, 2, {20000, 64}, 1, false, 0, 0},
    /* 66000 planes of 128 cells: more than a grid's y dimension. */
    {"BN-15 [600,110,128]", 15, 3, {600, 110, 128}, 1, false, 0, 0},
    /* ResNet-50's last stages: planes of 49 cells (one value at a time). */
    {"BN-15 [16,64,7,7]", 15, 4, {16, 64, 7, 7}, 1, false, 0, 0},
    /* Runs of 4 values (planes of 196 and 12 cells) and of 2 (10 cells),
     * odd batches and channel counts; the cases above with planes of 1600
     * and 128 cells take runs of 8. */
    {"BN-15 [5,24,14,14] runs of 4", 15, 4, {5, 24, 14, 14}, 3, true, 0, 0},
    {"BN-15 [5,7,6,2] runs of 4", 15, 4, {5, 7, 6, 2}, 1, false, 0, 0},
    {"BN-9 [3,5,2,5] runs of 2", 9, 4, {3, 5, 2, 5}, 5, false, 1e-3f, 0.8f},
    {"BN-15 [9,3,56,56] runs of 8", 15, 4, {9, 3, 56, 56}, 3, true, 0, 0},
};

static void test_bn(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof bn_cases / sizeof *bn_cases; k++) {
        for (int eval = 0; eval < 2; eval++)
            for (int relu = 0; relu < 2; relu++) {
                struct gp_graph g;
                build_bn(&g, &bn_cases[k]);
                g.nodes[0].fused_relu = relu; /* as graph/fuse.c leaves a BatchNormalization then Relu */
                char label[128];
                snprintf(label, sizeof label, "%s%s, %s", bn_cases[k].label, relu ? " + Relu" : "",
                         eval ? "evaluation" : "training");
                op_compare_node(&g, 0, &(struct op_compare){.label = label, .eval = eval});
                gp_graph_free(&g);
            }
    }
}

/* The bf16 storage mixes of the tests below (op_compare's params,
 * f32_inputs, f32_outputs bits), for labels too. */
struct bf16_mix {
    const char *name;
    uint32_t params, f32_inputs, f32_outputs;
};

/* BatchNormalization's inputs X, scale (1), B (2), mean (3), var (4). */
static const struct bf16_mix bn_mixes[] = {
    /* The executor's: scale and B parameters, mean and var float32. */
    {"executor", 0x6, 0x1e, 0},
    {"all bfloat16", 0, 0, 0},
    /* The run-time typed path: X float32 beside a bfloat16 Y (forward),
     * float32 optional outputs, a float32 dX. */
    {"X float32", 0x6, 0x1f, 0},
    {"optional outputs float32", 0x6, 0x1e, 0x1e},
    {"dX float32", 0x7, 0x1e, 0},
};

static void test_bn_bf16(void **state)
{
    (void)state;
    const int n_mixes = (int)(sizeof bn_mixes / sizeof *bn_mixes);
    for (size_t k = 0; k < sizeof bn_cases / sizeof *bn_cases; k++) {
        /* The executor's mix and all-bfloat16 for every case; one of the
         * others per case, in turn. */
        int others = 2 + (int)k % (n_mixes - 2);
        for (int eval = 0; eval < 2; eval++)
            for (int m = 0; m < n_mixes; m++) {
                if (m >= 2 && m != others) continue;
                const struct bf16_mix *x = &bn_mixes[m];
                struct gp_graph g;
                build_bn(&g, &bn_cases[k]);
                /* Every other case with a fused Relu. */
                bool relu = (k + (size_t)m) % 2 == 1;
                g.nodes[0].fused_relu = relu;
                char label[160];
                snprintf(label, sizeof label, "%s%s, %s, bf16 (%s)", bn_cases[k].label, relu ? " + Relu" : "",
                         eval ? "evaluation" : "training", x->name);
                op_compare_node(&g, 0, &(struct op_compare){.label = label, .eval = eval, .bf16 = true,
                                                            .params = x->params, .f32_inputs = x->f32_inputs,
                                                            .f32_outputs = x->f32_outputs});
                gp_graph_free(&g);
            }
    }
}

/* Channels-last (graph/layout.h): X, Y and their gradients [N, H, W, C] on
 * the CUDA side (op_compare's nhwc masks), every rank-4 case in float32
 * and in the executor's and the all-bfloat16 mixes, training and
 * evaluation, with and without a fused Relu, each run twice on the CUDA
 * side for the same bits; and shapes of ResNet-50's (64 channels of 56 x
 * 56 cells: many chunks of rows; 2048 channels: many blocks across a row). */
static const struct bn_case bn_nhwc_extra[] = {
    {"BN-15 [16,64,28,28]", 15, 4, {16, 64, 28, 28}, 1, false, 0, 0},
    {"BN-15 [4,2048,7,7]", 15, 4, {4, 2048, 7, 7}, 3, true, 0, 0},
    {"BN-15 [3,40,5,5] runs of 8 over 5 groups", 15, 4, {3, 40, 5, 5}, 1, false, 0, 0},
    /* The elementwise passes' rounds of 4 runs a thread: a grid of 98
     * blocks that takes two whole rounds (bfloat16, 8 channels a run; dX
     * 4); 2048 channels, dX's 512 runs a row over a grid of an even block
     * count; 12 channels (runs of 4, dX's 3 runs a row over 3 blocks) and
     * rounds whose last runs fall past the end. */
    {"BN-15 [8,64,56,56]", 15, 4, {8, 64, 56, 56}, 1, false, 0, 0},
    {"BN-15 [8,2048,7,7]", 15, 4, {8, 2048, 7, 7}, 3, true, 0, 0},
    {"BN-15 [6,12,9,9] runs of 4", 15, 4, {6, 12, 9, 9}, 1, false, 0, 0},
};

/* One channels-last case: X from `x_data` ([N, C, H, W] host floats) or
 * random (NULL); mix < 0 float32, else bn_mixes[mix]. */
static void bn_nhwc_case(const struct bn_case *c, int eval, int relu, int mix, const float *x_data)
{
    struct gp_graph g;
    build_bn(&g, c);
    g.nodes[0].fused_relu = relu;
    char label[192];
    const struct bf16_mix *x = mix >= 0 ? &bn_mixes[mix] : NULL;
    snprintf(label, sizeof label, "%s%s, %s, channels-last%s%s%s", c->label, relu ? " + Relu" : "",
             eval ? "evaluation" : "training", x ? ", bf16 (" : "", x ? x->name : "", x ? ")" : "");
    /* Twice: the same bits from the same inputs (fixed reduction orders). */
    struct op_compare o = {.label = label, .eval = eval, .nhwc_inputs = 1, .nhwc_outputs = 1, .twice = true};
    o.inputs[0] = x_data;
    if (x) {
        o.bf16 = true;
        o.params = x->params;
        o.f32_inputs = x->f32_inputs;
        o.f32_outputs = x->f32_outputs;
    }
    op_compare_node(&g, 0, &o);
    gp_graph_free(&g);
}

static void test_bn_nhwc(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof bn_cases / sizeof *bn_cases + sizeof bn_nhwc_extra / sizeof *bn_nhwc_extra; k++) {
        size_t n_main = sizeof bn_cases / sizeof *bn_cases;
        const struct bn_case *c = k < n_main ? &bn_cases[k] : &bn_nhwc_extra[k - n_main];
        if (c->rank != 4) continue;
        for (int eval = 0; eval < 2; eval++)
            for (int relu = 0; relu < 2; relu++)
                for (int mix = -1; mix < 2; mix++) bn_nhwc_case(c, eval, relu, mix, NULL);
    }
}

/* Training with one value per channel is refused, naming the node, before
 * anything is launched (no device memory needed). */
static void test_bn_one_value(void **state)
{
    (void)state;
    struct gp_graph g;
    struct bn_case c = {"one value", 15, 2, {1, 3}, 1, false, 0, 0};
    build_bn(&g, &c);
    const struct gp_cuda_kernel *k = gp_cuda_kernel_for(&g.nodes[0]);
    assert_non_null(k);
    void *in[5] = {0}, *out[1] = {0};
    struct gp_cuda_ctx ctx = {.graph = &g, .node = &g.nodes[0], .in = in, .out = out,
                              .training = true, .update_state = true, .dropout_ratio = -1};
    struct gp_error err = {0};
    assert_int_equal(k->forward(&ctx, &err), GP_ERR_SHAPE);
    assert_non_null(strstr(err.msg, "n0"));
    gp_graph_free(&g);
}

static void cuda_ok(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) fail_msg("deferred statistics: %s: %s", what, cudaGetErrorString(e));
}

static void *dev_upload(const void *h, size_t bytes)
{
    void *d = NULL;
    cuda_ok(cudaMalloc(&d, bytes ? bytes : 16), "cudaMalloc");
    if (h && bytes) cuda_ok(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), "upload");
    else cuda_ok(cudaMemset(d, 0, bytes ? bytes : 16), "cudaMemset");
    return d;
}

static void download(void *h, const void *d, size_t bytes)
{
    cuda_ok(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), "download");
}

static void expect_close(const char *what, const float *gpu, const float *cpu, int64_t n, double rel,
                         double abs_tol)
{
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)gpu[i] - (double)cpu[i]);
        if (!(d <= rel * fabs((double)cpu[i]) + abs_tol))
            fail_msg("deferred statistics: %s, element %lld: cuda %.9g, cpu %.9g", what, (long long)i,
                     (double)gpu[i], (double)cpu[i]);
    }
}

static float rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (float)((*s >> 40) * (1.0 / 16777216.0)) * 4.0f - 1.0f;
}

static float round_bf16(float v) { return gp_bf16_to_float(gp_float_to_bf16(v)); }

/* Channels-last values the statistics passes cannot widen with integer
 * operations (batch_norm.cu, bn_widen_scaled): an infinity (channel 3), a
 * NaN (5), values whose squares overflow float but not double (7: 2^70),
 * tiny ones whose float squares fall below float's normal range (9:
 * 2^-70), beside ordinary channels. Those lanes, rounds and threads take
 * the F2F paths; every channel must match the CPU (NaN where it has NaN),
 * in float32 and bfloat16, training and evaluation, with a fused Relu
 * and without. */
static void test_bn_nhwc_extremes(void **state)
{
    (void)state;
    const struct bn_case c = {"BN-15 [6,16,12,12] extremes", 15, 4, {6, 16, 12, 12}, 1, false, 0, 0};
    const int64_t n = 6, ch = 16, hw = 144;
    float *x = malloc(sizeof(float) * (size_t)(n * ch * hw));
    assert_non_null(x);
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    for (int64_t b = 0; b < n; b++)
        for (int64_t k = 0; k < ch; k++)
            for (int64_t i = 0; i < hw; i++) {
                float v = rnd(&seed);
                if (k == 7) v = ldexpf(v, 70);
                if (k == 9) v = ldexpf(v, -70);
                x[(b * ch + k) * hw + i] = round_bf16(v); /* the same values in both storages */
            }
    x[(2 * ch + 3) * hw + 17] = INFINITY;
    x[(4 * ch + 5) * hw + 100] = NAN;
    for (int eval = 0; eval < 2; eval++)
        for (int relu = 0; relu < 2; relu++)
            for (int mix = -1; mix < 2; mix++) bn_nhwc_case(&c, eval, relu, mix, x);
    free(x);
}

/* x -> BatchNormalization -> + r -> (Relu) -> y, as a ResNet block ends:
 * graph/fuse.c makes it one BatchNormalization with the residual r as
 * input 5 (gp_node.fused_add) and the Relu fused; shape c->x. */
static void build_bn_residual(struct gp_graph *g, const struct bn_case *c, bool relu)
{
    struct gp_error err = {0};
    begin(g, c->opset);
    int64_t ch = c->x[1];
    input(g, "x", c->rank, c->x);
    input(g, "s", 1, &ch);
    input(g, "b", 1, &ch);
    input(g, "r", c->rank, c->x);
    bn_running_stats(g, ch);
    if (gp_graph_add_node(g, "BatchNormalization", "", "bn", 5, S("x", "s", "b", "m", "v"), 1, S("h"), &err) < 0 ||
        gp_graph_add_node(g, "Add", "", "add", 2, S("h", "r"), 1, S(relu ? "a" : "y"), &err) < 0 ||
        (relu && gp_graph_add_node(g, "Relu", "", "relu", 1, S("a"), 1, S("y"), &err) < 0) ||
        gp_graph_add_output(g, "y", &err) != GP_OK)
        fail_msg("%s", err.msg);
    finalize_ok(g);
    if (g->n_nodes != 1 || !g->nodes[0].fused_add || g->nodes[0].fused_relu != relu)
        fail_msg("%s: BatchNormalization, Add%s not fused into one node (%d nodes)", c->label, relu ? ", Relu" : "",
                 g->n_nodes);
}

/* The residual Add (and Relu) fused into the BatchNormalization, on its
 * own against the CPU: channels-last X, R and Y, float32 and the
 * executor's bfloat16 mix, with R's gradient written whole (its first
 * writer: NaN before, as the executor plans a residual block's input) and
 * added into, dX written whole and added into, with R's gradient written
 * by the statistics pass (the default) and by its own kernel (GP_BN_RES_SUMS=0); X with
 * an infinity and a NaN (the statistics passes' exact walks, which then
 * read that gradient back) in one case. Each twice for the same bits. */
static void test_bn_residual_nhwc(void **state)
{
    (void)state;
    static const struct bn_case cases[] = {
        {"BN-15 [4,16,10,10] + residual", 15, 4, {4, 16, 10, 10}, 1, false, 0, 0},
        {"BN-15 [8,64,28,28] + residual", 15, 4, {8, 64, 28, 28}, 1, false, 0, 0},
        {"BN-15 [3,24,7,7] + residual, extremes", 15, 4, {3, 24, 7, 7}, 1, false, 0, 0},
    };
    const char *set = getenv("GP_BN_RES_SUMS");
    char was[16];
    snprintf(was, sizeof was, "%s", set ? set : "");
    int runs = 0;
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const struct bn_case *c = &cases[k];
        int64_t n = c->x[0] * c->x[1] * c->x[2] * c->x[3];
        float *x = NULL;
        if (strstr(c->label, "extremes")) {
            x = malloc(sizeof(float) * (size_t)n);
            assert_non_null(x);
            uint64_t seed = 0x2545f4914f6cdd1dull;
            for (int64_t i = 0; i < n; i++) x[i] = round_bf16(rnd(&seed));
            x[5 * c->x[2] * c->x[3] + 11] = INFINITY; /* channel 5 of sample 0 */
            x[(c->x[1] + 9) * c->x[2] * c->x[3] + 3] = NAN; /* channel 9 of sample 1 */
        }
        for (int relu = 0; relu < 2; relu++)
            for (int mix = -1; mix < 1; mix++)
                for (int ow = 0; ow < 4; ow++)
                    for (int sums = 0; sums < 2; sums++) {
                        struct gp_graph g;
                        build_bn_residual(&g, c, relu);
                        char label[224];
                        snprintf(label, sizeof label, "%s%s, %s, dR %s, dX %s, R's gradient by %s", c->label,
                                 relu ? " + Relu" : "", mix < 0 ? "float32" : "bf16 (executor)",
                                 ow & 1 ? "written" : "added", ow & 2 ? "written" : "added",
                                 sums ? "the statistics pass" : "its own pass");
                        struct op_compare o = {.label = label, .nhwc_inputs = 1u | 1u << 5, .nhwc_outputs = 1,
                                               .overwrite = (ow & 1 ? 1u << 5 : 0) | (ow & 2 ? 1u : 0),
                                               .twice = true};
                        o.inputs[0] = x;
                        if (mix >= 0) {
                            o.bf16 = true;
                            o.params = bn_mixes[0].params;
                            o.f32_inputs = bn_mixes[0].f32_inputs;
                            o.f32_outputs = bn_mixes[0].f32_outputs;
                        }
                        setenv("GP_BN_RES_SUMS", sums ? "1" : "0", 1);
                        op_compare_node(&g, 0, &o);
                        gp_graph_free(&g);
                        runs++;
                    }
        free(x);
    }
    if (set) setenv("GP_BN_RES_SUMS", was, 1);
    else unsetenv("GP_BN_RES_SUMS");
    printf("fused residual BatchNorm, channels-last: %d cases against the CPU\n", runs);
}

/* n floats into device memory as bfloat16 (b16) or float32, at d. */
static void upload_as(void *d, const float *h, int n, bool b16)
{
    if (!b16) {
        cuda_ok(cudaMemcpy(d, h, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice), "upload");
        return;
    }
    uint16_t *t = malloc(sizeof(uint16_t) * (size_t)n);
    assert_non_null(t);
    for (int i = 0; i < n; i++) t[i] = gp_float_to_bf16(h[i]);
    cuda_ok(cudaMemcpy(d, t, sizeof(uint16_t) * (size_t)n, cudaMemcpyHostToDevice), "upload");
    free(t);
}

static void download_as(float *h, const void *d, int n, bool b16)
{
    if (!b16) {
        download(h, d, sizeof(float) * (size_t)n);
        return;
    }
    uint16_t *t = malloc(sizeof(uint16_t) * (size_t)n);
    assert_non_null(t);
    download(t, d, sizeof(uint16_t) * (size_t)n);
    for (int i = 0; i < n; i++) h[i] = gp_bf16_to_float(t[i]);
    free(t);
}

/* Two micro-batches of [3, 4, 5, 6] with deferred statistics (and a
 * recomputation of the first with update_state false, which adds nothing):
 * the same Y on both backends, running statistics untouched, the same
 * sums; then the commit on both, which updates the running statistics the
 * same way and clears the sums. b16: X and Y stored as bfloat16 on the
 * CUDA side (the parameters and statistics float32, as the executor has
 * them), X rounded to bfloat16 for both; Y within a bfloat16 step of the
 * CPU's rounded. */
static void bn_deferred_run(bool b16)
{
    struct gp_graph g;
    struct bn_case c = {"deferred", 15, 4, {3, 4, 5, 6}, 1, false, 0, 0.85f};
    build_bn(&g, &c);
    const struct gp_node *nd = &g.nodes[0];
    const struct gp_cpu_kernel *ck = gp_cpu_kernel_for_f32(nd);
    const struct gp_cuda_kernel *gk = gp_cuda_kernel_for(nd);
    assert_non_null(ck);
    assert_non_null(gk);
    enum { N = 3, C = 4, SP = 30, NX = N * C * SP };
    size_t len = gp_cuda_bn_stats_len(&g, nd);
    assert_int_equal(len, gp_cpu_bn_stats_len_f32(&g, nd));
    assert_int_equal(len, 2 * C + 1);

    uint64_t seed = 0x1234567ull;
    static float x[2][NX], y_cpu[NX], y_gpu[NX];
    float scale[C], bias[C], rm0[C], rv0[C], rm_cpu[C], rv_cpu[C], rm_gpu[C], rv_gpu[C];
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < NX; i++) {
            x[b][i] = rnd(&seed) * 3.0f + (float)b;
            if (b16) x[b][i] = round_bf16(x[b][i]);
        }
    for (int i = 0; i < C; i++) {
        scale[i] = rnd(&seed);
        bias[i] = rnd(&seed);
        rm0[i] = rm_cpu[i] = 0.1f * (float)i;
        rv0[i] = rv_cpu[i] = 1.0f + 0.5f * (float)i;
    }
    double stats_cpu[2 * C + 1] = {0}, stats_gpu[2 * C + 1];

    cudaStream_t stream;
    /* A blocking stream: the uploads and poison fills before a launch are
     * plain cudaMemcpy / cudaMemset on the legacy default stream, which a
     * non-blocking stream does not wait for (a fill could land after the
     * kernel's writes: seen under compute-sanitizer, which slows the host). */
    cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamDefault), "cudaStreamCreate");
    float *dx = dev_upload(NULL, sizeof x[0]), *ds = dev_upload(scale, sizeof scale);
    float *db = dev_upload(bias, sizeof bias), *drm = dev_upload(rm0, sizeof rm0);
    float *drv = dev_upload(rv0, sizeof rv0), *dy = dev_upload(NULL, sizeof y_gpu);
    double *dstats = dev_upload(stats_cpu, sizeof stats_cpu);
    void *dsaved = dev_upload(NULL, gk->saved_bytes(&g, nd) + 64);
    void *dscratch = dev_upload(NULL, gk->scratch_bytes(&g, nd) + 64);
    void *csaved = calloc(1, ck->saved_bytes(&g, nd) + 64);
    assert_non_null(csaved);

    for (int pass = 0; pass < 3; pass++) {
        int b = pass == 2 ? 0 : pass; /* pass 2 recomputes micro-batch 0 */
        bool update = pass < 2;
        void *cin[5] = {x[b], scale, bias, rm_cpu, rv_cpu}, *cout[1] = {y_cpu};
        struct gp_cpu_ctx cc = {.graph = &g, .node = nd, .in = cin, .out = cout, .saved = csaved,
                                .training = true, .update_state = update, .dropout_ratio = -1,
                                .deferred_stats = stats_cpu};
        struct gp_error err = {0};
        if (ck->forward(&cc, &err) != GP_OK) fail_msg("CPU forward: %s", err.msg);
        upload_as(dx, x[b], NX, b16);
        void *gin[5] = {dx, ds, db, drm, drv}, *gout[1] = {dy};
        const enum gp_dtype f = GP_DTYPE_FLOAT32, h = GP_DTYPE_BFLOAT16;
        const enum gp_dtype in_dt[5] = {h, f, f, f, f}, out_dt[1] = {h};
        struct gp_cuda_ctx gc = {.graph = &g, .node = nd, .in = gin, .out = gout,
                                 .in_dt = b16 ? in_dt : NULL, .out_dt = b16 ? out_dt : NULL,
                                 .saved = dsaved, .scratch = dscratch, .stream = stream, .training = true,
                                 .update_state = update, .dropout_ratio = -1,
                                 .deferred_stats = dstats};
        if (gk->forward(&gc, &err) != GP_OK) fail_msg("CUDA forward: %s", err.msg);
        cuda_ok(cudaStreamSynchronize(stream), "forward");
        download_as(y_gpu, dy, NX, b16);
        if (b16) {
            for (int i = 0; i < NX; i++) y_cpu[i] = round_bf16(y_cpu[i]);
            expect_close("Y (bf16)", y_gpu, y_cpu, NX, 1.0 / 128, 1e-6);
        } else {
            expect_close("Y", y_gpu, y_cpu, NX, 1e-5, 1e-6);
        }
        download(rm_gpu, drm, sizeof rm_gpu);
        download(rv_gpu, drv, sizeof rv_gpu);
        for (int i = 0; i < C; i++)
            if (rm_gpu[i] != rm0[i] || rv_gpu[i] != rv0[i] || rm_cpu[i] != rm0[i] || rv_cpu[i] != rv0[i])
                fail_msg("deferred statistics: running statistics changed in forward (channel %d)", i);
        download(stats_gpu, dstats, sizeof stats_gpu);
        for (int i = 0; i < 2 * C + 1; i++)
            if (!(fabs(stats_gpu[i] - stats_cpu[i]) <= 1e-10 * fabs(stats_cpu[i]) + 1e-9))
                fail_msg("deferred statistics: pass %d, sum %d: cuda %.17g, cpu %.17g", pass, i,
                         stats_gpu[i], stats_cpu[i]);
    }
    assert_true(stats_cpu[2 * C] == 2.0 * N * SP);

    struct gp_error err = {0};
    gp_cpu_bn_commit_f32(&g, nd, rm_cpu, rv_cpu, stats_cpu);
    if (gp_cuda_bn_commit(stream, &g, nd, drm, drv, dstats, NULL, &err) != GP_OK)
        fail_msg("gp_cuda_bn_commit: %s", err.msg);
    cuda_ok(cudaStreamSynchronize(stream), "commit");
    download(rm_gpu, drm, sizeof rm_gpu);
    download(rv_gpu, drv, sizeof rv_gpu);
    download(stats_gpu, dstats, sizeof stats_gpu);
    expect_close("committed running mean", rm_gpu, rm_cpu, C, 1e-6, 1e-7);
    expect_close("committed running var", rv_gpu, rv_cpu, C, 1e-6, 1e-7);
    for (int i = 0; i < C; i++)
        if (rm_cpu[i] == rm0[i] || rv_cpu[i] == rv0[i]) fail_msg("deferred statistics: commit changed nothing");
    for (int i = 0; i < 2 * C + 1; i++)
        if (stats_gpu[i] != 0 || stats_cpu[i] != 0) fail_msg("deferred statistics: sum %d not cleared", i);

    /* A commit of nothing (count 0) leaves the running statistics alone. */
    if (gp_cuda_bn_commit(stream, &g, nd, drm, drv, dstats, NULL, &err) != GP_OK)
        fail_msg("gp_cuda_bn_commit: %s", err.msg);
    cuda_ok(cudaStreamSynchronize(stream), "empty commit");
    float rm2[C];
    download(rm2, drm, sizeof rm2);
    assert_memory_equal(rm2, rm_gpu, sizeof rm2);

    cudaFree(dx);
    cudaFree(ds);
    cudaFree(db);
    cudaFree(drm);
    cudaFree(drv);
    cudaFree(dy);
    cudaFree(dstats);
    cudaFree(dsaved);
    cudaFree(dscratch);
    free(csaved);
    cudaStreamDestroy(stream);
    gp_graph_free(&g);
}

static void test_bn_deferred(void **state)
{
    (void)state;
    bn_deferred_run(false);
}

static void test_bn_deferred_bf16(void **state)
{
    (void)state;
    bn_deferred_run(true);
}

/* ---- InstanceNormalization ---- */

static const struct {
    int rank;
    int64_t x[5];
    float eps;
} in_cases[] = {
    {3, {2, 3, 5}, 0},
    {4, {2, 2, 3, 2}, 1e-3f},
    {5, {1, 3, 2, 2, 2}, 0},
    {4, {3, 5, 17, 19}, 0},
    {4, {4, 8, 64, 65}, 0}, /* planes of 4160: 512 threads */
    /* Runs of 4 values (planes of 36, as U-Net's deepest) and of 8 (U-Net's
     * 48x48 level); the planes of 8 and 4160 above take runs of 8, of 6
     * runs of 2, the odd ones single values. */
    {4, {2, 3, 6, 6}, 0},
    {4, {2, 4, 48, 48}, 0},
};

/* Inputs X, scale (1), B (2). */
static const struct bf16_mix in_mixes[] = {
    {"executor", 0x6, 0x6, 0},
    {"all bfloat16", 0, 0, 0},
    {"X float32", 0x6, 0x7, 0},
    {"dX float32", 0x7, 0x6, 0},
};

/* Channels-last cases beside in_cases' rank-4 ones: runs of 8 channels
 * over 5 groups, of 4 (12 channels), single channels (7), many chunks of
 * rows per sample (64 channels of 48 x 48, U-Net's second level at a
 * smaller batch) and rows wider than a block's 32 run lanes (1024
 * channels, U-Net's deepest). */
static const struct {
    int rank;
    int64_t x[5];
    float eps;
} in_nhwc_extra[] = {
    {4, {3, 40, 5, 5}, 0},
    {4, {2, 12, 9, 9}, 1e-3f},
    {4, {2, 7, 6, 5}, 0},
    {4, {4, 64, 48, 48}, 0},
    {4, {2, 1024, 3, 3}, 0},
};

/* mix NULL: float32; nhwc: X, Y and their gradients channels-last on the
 * CUDA side, dX written whole. */
static void run_instance_norm_shape(const char *what, int rank, const int64_t *dims, float eps, bool eval,
                                    const struct bf16_mix *mix, bool nhwc)
{
    struct gp_graph g;
    begin(&g, 13);
    input(&g, "x", rank, dims);
    input(&g, "s", 1, &dims[1]);
    input(&g, "b", 1, &dims[1]);
    int n = node(&g, "InstanceNormalization", 3, S("x", "s", "b"), 1, S("y"));
    if (eps) attr_f(&g, n, "epsilon", eps);
    finalize_ok(&g);
    char label[160];
    snprintf(label, sizeof label, "InstanceNormalization %s%s%s%s%s", what, eval ? " (eval)" : "",
             nhwc ? ", channels-last" : "", mix ? ", bf16 " : "", mix ? mix->name : "");
    struct op_compare o = {.label = label, .eval = eval};
    if (mix) {
        o.bf16 = true;
        o.params = mix->params;
        o.f32_inputs = mix->f32_inputs;
        o.f32_outputs = mix->f32_outputs;
    }
    if (nhwc) {
        o.nhwc_inputs = o.nhwc_outputs = 1;
        o.overwrite = 1;
        o.twice = true;
    }
    op_compare_node(&g, 0, &o);
    gp_graph_free(&g);
}

static void run_instance_norm(size_t k, bool eval, const struct bf16_mix *mix)
{
    char what[32];
    snprintf(what, sizeof what, "case %zu", k);
    run_instance_norm_shape(what, in_cases[k].rank, in_cases[k].x, in_cases[k].eps, eval, mix, false);
}

static void test_instance_norm(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof in_cases / sizeof *in_cases; k++)
        for (int eval = 0; eval < 2; eval++) run_instance_norm(k, eval, NULL);
}

static void test_instance_norm_bf16(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof in_cases / sizeof *in_cases; k++)
        for (int eval = 0; eval < 2; eval++)
            for (size_t m = 0; m < sizeof in_mixes / sizeof *in_mixes; m++)
                run_instance_norm(k, eval, &in_mixes[m]);
}

/* Channels-last: every rank-4 case, in float32 and each bfloat16 mix,
 * training and evaluation (InstanceNormalization uses each instance's
 * statistics in both). */
static void test_instance_norm_nhwc(void **state)
{
    (void)state;
    size_t n_main = sizeof in_cases / sizeof *in_cases, n_extra = sizeof in_nhwc_extra / sizeof *in_nhwc_extra;
    for (size_t k = 0; k < n_main + n_extra; k++) {
        int rank = k < n_main ? in_cases[k].rank : in_nhwc_extra[k - n_main].rank;
        const int64_t *x = k < n_main ? in_cases[k].x : in_nhwc_extra[k - n_main].x;
        float eps = k < n_main ? in_cases[k].eps : in_nhwc_extra[k - n_main].eps;
        if (rank != 4) continue;
        char what[64];
        snprintf(what, sizeof what, "[%lld,%lld,%lld,%lld]", (long long)x[0], (long long)x[1], (long long)x[2],
                 (long long)x[3]);
        for (int eval = 0; eval < 2; eval++) {
            run_instance_norm_shape(what, rank, x, eps, eval, NULL, true);
            for (size_t m = 0; m < sizeof in_mixes / sizeof *in_mixes; m++)
                run_instance_norm_shape(what, rank, x, eps, eval, &in_mixes[m], true);
        }
    }
}

/* ---- LayerNormalization ---- */

struct ln_case {
    const char *label;
    int rank;
    int64_t x[4];
    bool has_axis;
    int64_t axis;
    int srank, brank; /* brank -1: no B */
    int64_t s[4], b[4];
    int n_outputs; /* Y, Mean, InvStdDev */
};

static const struct ln_case ln_cases[] = {
    {"axis -2, all outputs", 3, {2, 3, 4}, true, -2, 2, 2, {3, 4}, {3, 4}, 3},
    {"default axis", 3, {2, 3, 4}, false, 0, 1, 1, {4}, {4}, 1},
    {"no B", 3, {2, 3, 5}, true, -1, 1, -1, {5}, {0}, 3},
    {"axis 0", 3, {2, 3, 4}, true, 0, 3, 3, {2, 3, 4}, {2, 3, 4}, 2},
    {"axis 1 rank 4", 4, {2, 3, 4, 5}, true, 1, 3, 3, {3, 4, 5}, {3, 4, 5}, 3},
    {"Scale broadcast [4] over [3, 4]", 3, {2, 3, 4}, true, -2, 1, 2, {4}, {3, 4}, 3},
    {"B broadcast [3, 1] over [3, 4]", 3, {5, 3, 4}, true, 1, 2, 2, {3, 4}, {3, 1}, 1},
    {"both broadcast, no B", 4, {3, 2, 5, 6}, true, 1, 3, -1, {2, 1, 6}, {0}, 3},
    {"Scale [1, 768] over [5, 768]", 3, {2, 5, 768}, true, -2, 2, 2, {1, 768}, {5, 768}, 1},
    {"GPT-2 [8, 33, 768]", 3, {8, 33, 768}, true, -1, 1, 1, {768}, {768}, 1},
    {"4200 rows of 40", 2, {4200, 40}, true, -1, 1, 1, {40}, {40}, 1},
    /* The register kernels: GPT-2 small's whole activation (16-byte runs,
     * 3 warps a row, 264 blocks of 15 or 16 row groups in the fused
     * backward); runs of 4, 2 and single values; one row; 6, 8 (with 1 or
     * 2 row groups a block) and 16 warps. */
    {"GPT-2 [16, 1024, 768]", 3, {16, 1024, 768}, true, -1, 1, 1, {768}, {768}, 1},
    {"rows of 100 [37, 100]", 2, {37, 100}, true, -1, 1, 1, {100}, {100}, 3},
    {"rows of 770 [33, 770]", 2, {33, 770}, true, -1, 1, -1, {770}, {0}, 1},
    {"rows of 767 [19, 767]", 2, {19, 767}, true, -1, 1, 1, {767}, {767}, 3},
    {"one row [1, 768]", 2, {1, 768}, true, -1, 1, 1, {768}, {768}, 3},
    /* The warp path's limits: 1024 (32 values a lane, runs of 8), 520 (24
     * values a lane, the last run of 8 on lane 0 only), 1000 (single
     * values, 32 a lane, Mean and InvStdDev with their gradients), 1025
     * (the register path again). */
    {"rows of 1024 [40, 1024]", 2, {40, 1024}, true, -1, 1, 1, {1024}, {1024}, 3},
    {"rows of 520 [70, 520]", 2, {70, 520}, true, -1, 1, 1, {520}, {520}, 1},
    {"rows of 1000 [23, 1000]", 2, {23, 1000}, true, -1, 1, -1, {1000}, {0}, 3},
    {"rows of 1025 [21, 1025]", 2, {21, 1025}, true, -1, 1, 1, {1025}, {1025}, 1},
    {"rows of 1536 [50, 1536]", 2, {50, 1536}, true, -1, 1, 1, {1536}, {1536}, 1},
    {"rows of 2048 [1030, 2048]", 2, {1030, 2048}, true, -1, 1, 1, {2048}, {2048}, 1},
    {"rows of 4096 [9, 4096]", 2, {9, 4096}, true, -1, 1, 1, {4096}, {4096}, 3},
    /* Rows of 2048 to 4096: forward in registers (up to 16 warps), backward
     * generic; longer rows: the generic kernels both ways. */
    {"rows of 2500", 2, {70, 2500}, true, -1, 1, -1, {2500}, {0}, 1},
    {"wide rows [3, 5000]", 2, {3, 5000}, true, 1, 1, 1, {5000}, {5000}, 3},
    {"wide rows [130, 4500]", 2, {130, 4500}, true, -1, 1, 1, {4500}, {4500}, 1},
    {"wide, Scale broadcast [1000] over [5, 1000]", 3, {2, 5, 1000}, true, 1, 1, 2, {1000},
     {5, 1000}, 3},
};

/* Inputs X, Scale (1), B (2); outputs Y, Mean (1), InvStdDev (2). */
static const struct bf16_mix ln_mixes[] = {
    /* GPT-2 in bf16: Scale and B parameters. */
    {"executor", 0x6, 0x6, 0},
    {"all bfloat16", 0, 0, 0},
    {"X float32", 0x6, 0x7, 0},
    {"Mean and InvStdDev float32", 0x6, 0x6, 0x6},
    {"dX float32", 0x7, 0x6, 0},
};

/* mix NULL: float32. */
static void run_layer_norm(const struct ln_case *c, const struct bf16_mix *mix)
{
    struct gp_graph g;
    begin(&g, 17);
    input(&g, "x", c->rank, c->x);
    input(&g, "s", c->srank, c->s);
    if (c->brank >= 0) input(&g, "b", c->brank, c->b);
    int n = node(&g, "LayerNormalization", c->brank >= 0 ? 3 : 2, S("x", "s", "b"), c->n_outputs,
                 S("y", "mean", "invstd"));
    if (c->has_axis) attr_i(&g, n, "axis", c->axis);
    finalize_ok(&g);
    char label[160];
    snprintf(label, sizeof label, "%s%s%s", c->label, mix ? ", bf16 " : "", mix ? mix->name : "");
    struct op_compare o = {.label = label};
    if (mix) {
        o.bf16 = true;
        o.params = mix->params;
        o.f32_inputs = mix->f32_inputs;
        o.f32_outputs = mix->f32_outputs;
    }
    op_compare_node(&g, 0, &o);
    gp_graph_free(&g);
}

static void test_layer_norm(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof ln_cases / sizeof *ln_cases; k++) run_layer_norm(&ln_cases[k], NULL);
}

static void test_layer_norm_bf16(void **state)
{
    (void)state;
    const size_t n_mixes = sizeof ln_mixes / sizeof *ln_mixes;
    for (size_t k = 0; k < sizeof ln_cases / sizeof *ln_cases; k++) {
        /* The executor's mix and all-bfloat16 for every case; one of the
         * others per case, in turn. */
        size_t others = 2 + k % (n_mixes - 2);
        for (size_t m = 0; m < n_mixes; m++)
            if (m < 2 || m == others) run_layer_norm(&ln_cases[k], &ln_mixes[m]);
    }
}

int main(void)
{
    op_compare_require_device();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bn),
        cmocka_unit_test(test_bn_bf16),
        cmocka_unit_test(test_bn_nhwc),
        cmocka_unit_test(test_bn_nhwc_extremes),
        cmocka_unit_test(test_bn_residual_nhwc),
        cmocka_unit_test(test_bn_one_value),
        cmocka_unit_test(test_bn_deferred),
        cmocka_unit_test(test_bn_deferred_bf16),
        cmocka_unit_test(test_instance_norm),
        cmocka_unit_test(test_instance_norm_bf16),
        cmocka_unit_test(test_instance_norm_nhwc),
        cmocka_unit_test(test_layer_norm),
        cmocka_unit_test(test_layer_norm_bf16),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (failed == 0)
        printf("cuda_norm: PASSED, %d ops (%d cases against the CPU kernels)\n", op_compare_op_types(),
               op_compare_cases());
    return failed ? 1 : 0;
}
