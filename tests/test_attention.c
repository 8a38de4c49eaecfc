/* Attention (ops/attention.h, backend/cpu/attention.c) and the attention
 * fusion (graph/fuse_attention.c):
 *  - the op: forward against a direct evaluation in double (4-D and 3-D
 *    forms, packed Q, K, V from a Split, additive and bool masks, causal,
 *    Tq != Tk), gradients against
 *    finite differences in double (op_gradcheck, which also compares bf16
 *    with fp32 layer by layer), refusals naming the node;
 *  - the fusion, on torch 1.13 and 2.11 exports (TorchScript and dynamo
 *    exporters; models/export_attention.py, tests/data/attention/) and on
 *    chains built by hand: each spelling
 *    fuses into one Attention node with the attributes it should have,
 *    each near miss stays unfused, and the fused graph trains like the
 *    unfused one (GP_FUSE_ATTENTION=0) within float32 rounding: outputs,
 *    every gradient, over four SGD steps; where a Split made Q, K and V,
 *    the Split is absorbed (packed_qkv) and trains to the same bits as the
 *    Attention that keeps it (GP_FUSE_QKV_SPLIT=0); its near misses stay;
 *  - on the same fixtures, the transformers' other fusion (graph/fuse.c):
 *    the Linear weights' Transposes absorbed into their MatMuls, which
 *    train like the graph that keeps them (GP_FUSE_WEIGHT_TRANSPOSE=0);
 *  - memory: what the executor's stage plan (pipeline/plan.c) allocates
 *    for one attention layer grows linearly in the sequence length T when
 *    fused and quadratically as the exported chain (MatMul, scale, causal
 *    mask, Softmax, MatMul), T = 256 to 2048, on the CPU's kernels and,
 *    where the build has CUDA, the CUDA kernels' (fp32 and bf16; planning
 *    needs no GPU, but without one cuDNN's plans cannot be built, so the
 *    bf16 figures are then the own kernels'). */
#include "cpu_kernel_test.h"

#include "backend/backends.h"
#include "backend/compute.h"
#include "backend/device.h"
#include "fixtures.h"
#include "graph/layers.h"
#include "onnx/load.h"
#include "pipeline/plan.h"

/* The float build's runner (cpu_kernel_test.h declares the double one). */
struct gp_cpu_runner;
gp_status gp_cpu_runner_create_f32(const struct gp_graph *, bool, struct gp_cpu_runner **, struct gp_error *);
void gp_cpu_runner_free_f32(struct gp_cpu_runner *);
void gp_cpu_runner_set_f32(struct gp_cpu_runner *, int, const void *);
void gp_cpu_runner_get_f32(struct gp_cpu_runner *, int, void *);
void *gp_cpu_runner_data_f32(struct gp_cpu_runner *, int);
void *gp_cpu_runner_grad_f32(struct gp_cpu_runner *, int);
gp_status gp_cpu_runner_forward_f32(struct gp_cpu_runner *, const struct gp_run_opts *, int, int, struct gp_error *);
gp_status gp_cpu_runner_backward_f32(struct gp_cpu_runner *, const struct gp_run_opts *, int, int, struct gp_error *);
void gp_cpu_runner_zero_activation_grads_f32(struct gp_cpu_runner *);
void gp_cpu_runner_zero_param_grads_f32(struct gp_cpu_runner *);

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 11;
}
static double uniform(uint64_t *s) { return (double)rng_next(s) / 9007199254740992.0 * 2 - 1; }

/* ---- the op ---- */

struct attn_case {
    const char *label;
    bool three_d;
    int64_t b, h, tq, tk, d, dv;
    int mask;        /* 0 none, 1 additive float [tq, tk], 2 bool [b, 1, tq, tk] */
    bool causal;
    float scale;     /* 0: the default */
    bool packed;     /* 3-D, Tq = Tk, D = Dv: Q, K, V the thirds of one Split of qkv [B, T, 3 * C] */
};

static double mask_add(int64_t i, int64_t j) { return (double)((i * 3 + j * 5) % 4) - 2; }
static bool mask_keep(int64_t b, int64_t i, int64_t j) { return (i + j + b) % 3 != 0 || j == 0; }

static void build_attention(struct gp_graph *g, const struct attn_case *c)
{
    init(g, 23);
    int64_t qd[4], kd[4], vd[4];
    int rank = c->three_d ? 3 : 4;
    if (c->three_d) {
        memcpy(qd, I64(c->b, c->tq, c->h * c->d), sizeof(int64_t) * 3);
        memcpy(kd, I64(c->b, c->tk, c->h * c->d), sizeof(int64_t) * 3);
        memcpy(vd, I64(c->b, c->tk, c->h * c->dv), sizeof(int64_t) * 3);
    } else {
        memcpy(qd, I64(c->b, c->h, c->tq, c->d), sizeof qd);
        memcpy(kd, I64(c->b, c->h, c->tk, c->d), sizeof kd);
        memcpy(vd, I64(c->b, c->h, c->tk, c->dv), sizeof vd);
    }
    if (c->packed) {
        /* Split by num_outputs along axis -1, or by a sizes input along 2:
         * either absorbs. */
        int64_t hd = c->h * c->d;
        input(g, "qkv", GP_DTYPE_FLOAT32, 3, I64(c->b, c->tq, 3 * hd));
        int n;
        if (c->causal) {
            n = node(g, "Split", 1, S("qkv"), 3, S("q", "k", "v"));
            attr_int(g, n, "num_outputs", 3);
            attr_int(g, n, "axis", -1);
        } else {
            cany(g, "sizes", GP_DTYPE_INT64, 1, I64(3), F64((double)hd, (double)hd, (double)hd));
            n = node(g, "Split", 2, S("qkv", "sizes"), 3, S("q", "k", "v"));
            attr_int(g, n, "axis", 2);
        }
    } else {
        input(g, "q", GP_DTYPE_FLOAT32, rank, qd);
        input(g, "k", GP_DTYPE_FLOAT32, rank, kd);
        input(g, "v", GP_DTYPE_FLOAT32, rank, vd);
    }
    if (c->mask == 1) {
        /* Integers cast to float: a constant (an initializer read through
         * Cast is not trainable), not a parameter. */
        double m[256];
        for (int64_t i = 0; i < c->tq; i++)
            for (int64_t j = 0; j < c->tk; j++) m[i * c->tk + j] = mask_add(i, j);
        cany(g, "mi", GP_DTYPE_INT64, 2, I64(c->tq, c->tk), m);
        int n = node(g, "Cast", 1, S("mi"), 1, S("m"));
        attr_int(g, n, "to", GP_DTYPE_FLOAT32);
    } else if (c->mask == 2) {
        double m[512];
        for (int64_t b = 0; b < c->b; b++)
            for (int64_t i = 0; i < c->tq; i++)
                for (int64_t j = 0; j < c->tk; j++) m[(b * c->tq + i) * c->tk + j] = mask_keep(b, i, j);
        cany(g, "m", GP_DTYPE_BOOL, 4, I64(c->b, 1, c->tq, c->tk), m);
    }
    int n = node(g, "Attention", c->mask ? 4 : 3, c->mask ? S("q", "k", "v", "m") : S("q", "k", "v"), 1, S("y"));
    if (c->causal) attr_int(g, n, "is_causal", 1);
    if (c->scale != 0) attr_float(g, n, "scale", c->scale);
    if (c->three_d) {
        attr_int(g, n, "q_num_heads", c->h);
        attr_int(g, n, "kv_num_heads", c->h);
    }
    output(g, "y");
    finalize(g);
}

static const struct attn_case cases[] = {
    {"4-D, no mask", false, 2, 2, 5, 5, 4, 4, 0, false, 0},
    {"4-D, causal, additive mask, Tq != Tk", false, 2, 2, 3, 5, 4, 3, 1, true, 0.7f},
    {"3-D, bool mask", true, 2, 3, 4, 6, 2, 3, 2, false, 0},
    {"3-D, causal", true, 1, 2, 6, 6, 4, 4, 0, true, 0},
    {"3-D packed (Split absorbed), causal", true, 2, 2, 5, 5, 4, 4, 0, true, 0, true},
    {"3-D packed, bool mask, scale", true, 2, 3, 4, 4, 2, 2, 2, false, 0.6f, true},
};

/* Element [b, h, t, e] of a 4-D or 3-D tensor of head size n. */
static int64_t at(const struct attn_case *c, int64_t T, int64_t n, int64_t b, int64_t h, int64_t t, int64_t e)
{
    return c->three_d ? (b * T + t) * c->h * n + h * n + e : ((b * c->h + h) * T + t) * n + e;
}

/* Y by the definition, in double. */
static void reference(const struct attn_case *c, const float *q, const float *k, const float *v, double *y)
{
    double scale = c->scale != 0 ? c->scale : 1 / sqrt((double)c->d);
    for (int64_t b = 0; b < c->b; b++)
        for (int64_t h = 0; h < c->h; h++)
            for (int64_t i = 0; i < c->tq; i++) {
                double s[64], m = -INFINITY, l = 0;
                for (int64_t j = 0; j < c->tk; j++) {
                    double dot = 0;
                    for (int64_t e = 0; e < c->d; e++)
                        dot += (double)q[at(c, c->tq, c->d, b, h, i, e)] * k[at(c, c->tk, c->d, b, h, j, e)];
                    s[j] = dot * scale + (c->mask == 1 ? mask_add(i, j) : 0);
                    if ((c->causal && j > i) || (c->mask == 2 && !mask_keep(b, i, j))) s[j] = -INFINITY;
                    m = fmax(m, s[j]);
                }
                for (int64_t j = 0; j < c->tk; j++) l += exp(s[j] - m);
                for (int64_t e = 0; e < c->dv; e++) {
                    double acc = 0;
                    for (int64_t j = 0; j < c->tk; j++) acc += exp(s[j] - m) / l * v[at(c, c->tk, c->dv, b, h, j, e)];
                    y[at(c, c->tq, c->dv, b, h, i, e)] = acc;
                }
            }
}

static void test_forward_reference(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const struct attn_case *c = &cases[k];
        struct gp_graph g;
        build_attention(&g, c);
        assert_int_equal(g.n_nodes, 1);
        assert_int_equal(g.nodes[0].packed_qkv, c->packed);
        int64_t nq = gp_shape_numel(&val(&g, "q")->shape), nk = gp_shape_numel(&val(&g, "k")->shape);
        int64_t nv = gp_shape_numel(&val(&g, "v")->shape), ny = gp_shape_numel(&val(&g, "y")->shape);
        float *q = malloc(sizeof(float) * (size_t)nq), *kk = malloc(sizeof(float) * (size_t)nk);
        float *v = malloc(sizeof(float) * (size_t)nv), *y = malloc(sizeof(float) * (size_t)ny);
        double *want = malloc(sizeof(double) * (size_t)ny);
        uint64_t s = 11 + k;
        for (int64_t i = 0; i < nq; i++) q[i] = (float)(2 * uniform(&s));
        for (int64_t i = 0; i < nk; i++) kk[i] = (float)(2 * uniform(&s));
        for (int64_t i = 0; i < nv; i++) v[i] = (float)uniform(&s);
        if (c->packed) {
            /* Each token's row: its Q, K and V. */
            int64_t hd = c->h * c->d, rows = c->b * c->tq;
            float *qkv = malloc(sizeof(float) * (size_t)(3 * nq));
            for (int64_t r = 0; r < rows; r++)
                for (int64_t e = 0; e < hd; e++) {
                    qkv[r * 3 * hd + e] = q[r * hd + e];
                    qkv[r * 3 * hd + hd + e] = kk[r * hd + e];
                    qkv[r * 3 * hd + 2 * hd + e] = v[r * hd + e];
                }
            op_forward_f32(&g, (const void *[]){qkv}, (void *[]){y}, false);
            free(qkv);
        } else {
            op_forward_f32(&g, (const void *[]){q, kk, v}, (void *[]){y}, false);
        }
        reference(c, q, kk, v, want);
        double worst = 0;
        for (int64_t i = 0; i < ny; i++) {
            double e = fabs(y[i] - want[i]);
            if (!(e <= 2e-6 * fmax(1, fabs(want[i])))) fail_msg("%s: y[%lld] = %.9g, expected %.9g", c->label, (long long)i, y[i], want[i]);
            worst = fmax(worst, e);
        }
        printf("%-40s forward within %.2g of the definition\n", c->label, worst);
        free(q), free(kk), free(v), free(y), free(want);
        gp_graph_free(&g);
    }
}

/* Gradients of Q, K and V against finite differences (double build), and
 * every layer in bf16 against fp32 (op_gradcheck runs op_bf16_vs_f32). */
static void test_gradients(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        struct gp_graph g;
        build_attention(&g, &cases[k]);
        op_gradcheck(&g, &(struct op_check_opts){.seed = 5 + k, .max_elems = 200});
        gp_graph_free(&g);
    }
}

static void expect_refused(struct gp_graph *g, const char *needle)
{
    struct gp_error err = {0};
    gp_status st = gp_graph_finalize(g, &err);
    if (st == GP_OK) fail_msg("accepted; expected a message with '%s'", needle);
    if (!strstr(err.msg, needle) || !strstr(err.msg, "Attention"))
        fail_msg("message '%s' lacks '%s' or the node", err.msg, needle);
    gp_graph_free(g);
}

static void test_refusals(void **state)
{
    (void)state;
    struct gp_graph g;
    const char *what[] = {"softcap", "qk_matmul_output_mode", "grouped-query", "past_key", "qk_matmul_output"};
    for (int w = 0; w < 5; w++) {
        init(&g, 23);
        input(&g, "q", GP_DTYPE_FLOAT32, 4, I64(1, 2, 3, 4));
        input(&g, "k", GP_DTYPE_FLOAT32, 4, I64(1, w == 2 ? 1 : 2, 3, 4));
        input(&g, "v", GP_DTYPE_FLOAT32, 4, I64(1, w == 2 ? 1 : 2, 3, 4));
        input(&g, "pk", GP_DTYPE_FLOAT32, 4, I64(1, 2, 3, 4));
        int n = w == 3   ? node(&g, "Attention", 5, S("q", "k", "v", "", "pk"), 1, S("y"))
                : w == 4 ? node(&g, "Attention", 3, S("q", "k", "v"), 4, S("y", "", "", "qk"))
                         : node(&g, "Attention", 3, S("q", "k", "v"), 1, S("y"));
        if (w == 0) attr_float(&g, n, "softcap", 5);
        if (w == 1) attr_int(&g, n, "qk_matmul_output_mode", 1);
        output(&g, "y");
        expect_refused(&g, what[w]);
    }
    /* 3-D inputs without head counts. */
    init(&g, 23);
    input(&g, "q", GP_DTYPE_FLOAT32, 3, I64(1, 3, 8));
    input(&g, "k", GP_DTYPE_FLOAT32, 3, I64(1, 3, 8));
    input(&g, "v", GP_DTYPE_FLOAT32, 3, I64(1, 3, 8));
    node(&g, "Attention", 3, S("q", "k", "v"), 1, S("y"));
    output(&g, "y");
    expect_refused(&g, "q_num_heads");
}

/* ---- the fusion ---- */

/* Fixture `name` loaded with the fusion that `off_env` switches off
 * (set to 0) off, or with every fusion when off_env is NULL. */
static void load_with(const char *name, int64_t batch, const char *off_env, struct gp_graph *g)
{
    char file[256], path[4096];
    snprintf(file, sizeof file, "../tests/data/attention/%s.onnx", name);
    fixture_path(file, path, sizeof path);
    if (off_env) setenv(off_env, "0", 1);
    struct gp_error err = {0};
    gp_status st = gp_onnx_load(path, batch, g, &err);
    if (off_env) unsetenv(off_env);
    if (st != GP_OK) fail_msg("%s: %s", name, err.msg);
}

static void load(const char *name, int64_t batch, bool fuse, struct gp_graph *g)
{
    load_with(name, batch, fuse ? NULL : "GP_FUSE_ATTENTION", g);
}

static int count_op(const struct gp_graph *g, const char *op, int *last)
{
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (!strcmp(g->nodes[i].op_type, op)) n++, *last = i;
    return n;
}

/* A spelling: how the fused node must look. */
struct spelling {
    const char *name;
    int64_t causal, heads; /* heads 0: the 4-D form */
    bool mask;
    float scale;
    int layers_gone;       /* nodes fewer than unfused */
    bool qkv;              /* Q, K, V from one Split: absorbed (one of layers_gone) */
};

static const struct spelling spellings[] = {
    /* nanoGPT (bench/models.py's block): split and merge absorbed, the
     * sliced `bias` compare is causal. 13 nodes -> Attention, and the
     * Split of c_attn's output into Q, K, V. */
    {"nanogpt_op13", 1, 2, false, 0.353553385f, 13, true},
    {"nanogpt_op17", 1, 2, false, 0.353553385f, 13, true},
    {"div_add_op17", 0, 2, true, 0.353553385f, 13, true},
    {"sqrt_scaled_op17", 0, 2, false, 0.353553385f, 13, true},
    {"q_scaled_where_op17", 1, 2, false, 0.353553385f, 13, true},
    /* nn.MultiheadAttention: [batch * heads, T, D], K's transpose kept. */
    {"mha_op13", 0, 1, false, 0.353553385f, 3},
    {"mha_op17", 0, 1, false, 0.353553385f, 3},
    {"mha_float_causal_op14", 1, 1, false, 0.353553385f, 5},
    {"mha_bool_causal_op14", 1, 1, false, 0.353553385f, 5},
    {"mha_float_band_op14", 0, 1, true, 0.353553385f, 5},
    /* torch 2.11 (models/export_attention.py --torch2). SDPA through the
     * TorchScript exporter: sqrt-scaled Q and K, a -inf triangle built from
     * Trilu (folded), K's head split also transposed for a Shape that
     * folded away (that dead Transpose goes too). */
    {"nanogpt_sdpa_torch2_op17", 1, 2, false, 0.353553385f, 15, true},
    /* The dynamo exporter, optimize off: SDPA with K transposed through
     * [B * H, T, D] and a -3.4e38 triangle (CastLike folds); the explicit
     * form with a clone (Identity) in the head merge; nn.MultiheadAttention
     * as 4-D [B, H, T, D] views of its [B * H, T, D] heads. */
    {"nanogpt_sdpa_dynamo", 1, 2, false, 0.353553385f, 16},
    {"nanogpt_dynamo", 1, 2, false, 0.353553385f, 14},
    {"mha_dynamo", 0, 0, false, 0.353553385f, 7},
};

/* Near misses: nothing fuses. */
static const char *const near_misses[] = {
    "nanogpt_dropout_op17",  /* attention dropout, p = 0.1 */
    "nanogpt_dropout0_op17", /* a Dropout node even at p = 0 */
    "softmax_dim2_op17",     /* softmax over the queries */
    "param_scale_op17",      /* the scale a parameter */
    "param_mask_op17",       /* the mask a float initializer: trainable */
    "input_mask_op17",       /* the mask computed from the input */
    "scores_out_op17",       /* the scores also a graph output */
    /* The dynamo exporter with optimize on turns the scale (and the fill
     * and the mask's 0) into float initializers, which load as trainable
     * parameters (inspect says so): fusing would freeze them. */
    "nanogpt_sdpa_dynamo_opt",
    "nanogpt_dynamo_opt",
    "mha_dynamo_opt",
};

static void test_spellings_fuse(void **state)
{
    (void)state;
    for (size_t s = 0; s < sizeof spellings / sizeof *spellings; s++) {
        const struct spelling *sp = &spellings[s];
        struct gp_graph f, u;
        load(sp->name, 2, true, &f);
        load(sp->name, 2, false, &u);
        int a = -1, dummy;
        if (count_op(&f, "Attention", &a) != 1) fail_msg("%s: no single Attention node", sp->name);
        assert_int_equal(count_op(&u, "Attention", &dummy), 0);
        if (u.n_nodes - f.n_nodes != sp->layers_gone)
            fail_msg("%s: %d layers fused, %d unfused", sp->name, f.n_nodes, u.n_nodes);
        const struct gp_node *n = &f.nodes[a];
        assert_int_equal(gp_node_attr_int(n, "is_causal", -1), sp->causal);
        assert_int_equal(gp_node_attr_int(n, "q_num_heads", 0), sp->heads);
        assert_int_equal(n->n_inputs, sp->mask ? 4 : 3);
        if (n->packed_qkv != sp->qkv) fail_msg("%s: packed_qkv %d, expected %d", sp->name, n->packed_qkv, sp->qkv);
        if (sp->qkv) {
            assert_true(n->inputs[0] >= 0 && n->inputs[1] < 0 && n->inputs[2] < 0);
            assert_int_equal(count_op(&f, "Split", &dummy) + 1, count_op(&u, "Split", &dummy));
            /* GP_FUSE_QKV_SPLIT=0: the same Attention beside its Split. */
            struct gp_graph k;
            load_with(sp->name, 2, "GP_FUSE_QKV_SPLIT", &k);
            assert_int_equal(k.n_nodes, f.n_nodes + 1);
            assert_int_equal(count_op(&k, "Attention", &a), 1);
            assert_false(k.nodes[a].packed_qkv);
            gp_graph_free(&k);
        }
        if (fabsf(gp_node_attr_float(n, "scale", 0) - sp->scale) > 1e-6f * sp->scale)
            fail_msg("%s: scale %.9g, expected %.9g", sp->name, gp_node_attr_float(n, "scale", 0), sp->scale);
        assert_int_equal(f.n_nodes + f.n_folded + f.n_fused, f.n_source_nodes);
        gp_graph_free(&f);
        gp_graph_free(&u);
    }
    for (size_t s = 0; s < sizeof near_misses / sizeof *near_misses; s++) {
        struct gp_graph g;
        int dummy;
        load(near_misses[s], 2, true, &g);
        if (count_op(&g, "Attention", &dummy) != 0) fail_msg("%s fused", near_misses[s]);
        gp_graph_free(&g);
    }
}

/* A chain built by hand: MatMul(q, Transpose(k)) * c, Softmax, MatMul(v),
 * c a scalar (fuses) or a [Tk] vector cast from integers (a constant, but
 * not a scalar: stays); `p_out`: the probabilities also a graph output
 * (a second reader: stays). */
static int hand_chain(bool vector_scale, bool p_out)
{
    struct gp_graph g;
    init(&g, 17);
    input(&g, "q", GP_DTYPE_FLOAT32, 4, I64(1, 2, 4, 8));
    input(&g, "k", GP_DTYPE_FLOAT32, 4, I64(1, 2, 4, 8));
    input(&g, "v", GP_DTYPE_FLOAT32, 4, I64(1, 2, 4, 8));
    cany(&g, "ci", GP_DTYPE_INT64, 1, I64(vector_scale ? 4 : 1), F64(1, 2, 3, 4));
    attr_int(&g, node(&g, "Cast", 1, S("ci"), 1, S("c")), "to", GP_DTYPE_FLOAT32);
    attr_ints(&g, node(&g, "Transpose", 1, S("k"), 1, S("kt")), "perm", 4, I64(0, 1, 3, 2));
    node(&g, "MatMul", 2, S("q", "kt"), 1, S("s0"));
    node(&g, "Mul", 2, S("s0", "c"), 1, S("s"));
    node(&g, "Softmax", 1, S("s"), 1, S("p"));
    node(&g, "MatMul", 2, S("p", "v"), 1, S("y"));
    output(&g, "y");
    if (p_out) output(&g, "p");
    finalize(&g);
    int a, n = count_op(&g, "Attention", &a);
    if (n == 1) assert_true(gp_node_attr_float(&g.nodes[a], "scale", 0) == 1.0f);
    gp_graph_free(&g);
    return n;
}

/* The dynamo exporter's K transpose, by hand: Reshape(Transpose(Reshape(
 * k, [B * H, T, D]), perm), [B, H, D, T]) with perm [0, 2, 1] (fuses) or
 * [0, 1, 2] (no transpose: the reshape scrambles K, stays); c = 2 scales
 * Q and K (sqrt-scaled: 4). */
static int dynamo_kt_chain(bool swap)
{
    struct gp_graph g;
    init(&g, 17);
    input(&g, "q", GP_DTYPE_FLOAT32, 4, I64(1, 2, 4, 8));
    input(&g, "k", GP_DTYPE_FLOAT32, 4, I64(1, 2, 4, 8));
    input(&g, "v", GP_DTYPE_FLOAT32, 4, I64(1, 2, 4, 8));
    cany(&g, "ci", GP_DTYPE_INT64, 0, I64(0), F64(2));
    attr_int(&g, node(&g, "Cast", 1, S("ci"), 1, S("c")), "to", GP_DTYPE_FLOAT32);
    cany(&g, "s3", GP_DTYPE_INT64, 1, I64(3), F64(2, 4, 8));
    cany(&g, "s4", GP_DTYPE_INT64, 1, I64(4), F64(1, 2, 8, 4));
    node(&g, "Reshape", 2, S("k", "s3"), 1, S("k3"));
    attr_ints(&g, node(&g, "Transpose", 1, S("k3"), 1, S("k3t")), "perm", 3, swap ? I64(0, 2, 1) : I64(0, 1, 2));
    node(&g, "Reshape", 2, S("k3t", "s4"), 1, S("kt"));
    node(&g, "Mul", 2, S("q", "c"), 1, S("qs"));
    node(&g, "Mul", 2, S("kt", "c"), 1, S("kts"));
    node(&g, "MatMul", 2, S("qs", "kts"), 1, S("s"));
    node(&g, "Softmax", 1, S("s"), 1, S("p"));
    node(&g, "MatMul", 2, S("p", "v"), 1, S("y"));
    output(&g, "y");
    finalize(&g);
    int a, n = count_op(&g, "Attention", &a);
    if (n == 1) {
        assert_true(gp_node_attr_float(&g.nodes[a], "scale", 0) == 4.0f);
        assert_int_equal(g.n_nodes, 1);
    }
    gp_graph_free(&g);
    return n;
}

static void test_hand_built_chains(void **state)
{
    (void)state;
    assert_int_equal(hand_chain(false, false), 1);
    assert_int_equal(hand_chain(true, false), 0);
    assert_int_equal(hand_chain(false, true), 0);
    assert_int_equal(dynamo_kt_chain(true), 1);
    assert_int_equal(dynamo_kt_chain(false), 0);
}

/* The fixture GPT (attention dropout: unfused) loads as before. */
static void test_fixture_gpt_unfused(void **state)
{
    (void)state;
    struct gp_graph g;
    char path[4096];
    struct gp_error err = {0};
    if (gp_onnx_load(fixture_path("gpt_op17.onnx", path, sizeof path), 2, &g, &err) != GP_OK) fail_msg("%s", err.msg);
    int dummy;
    assert_int_equal(count_op(&g, "Attention", &dummy), 0);
    gp_graph_free(&g);
}

/* Worst |a - b| over a tensor, relative to its largest |b|. */
static double rel_diff(const float *a, const float *b, int64_t n)
{
    double worst = 0, scale = 1e-30;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= worst)) worst = d; /* NaN sticks */
    }
    return worst / scale;
}

struct run {
    struct gp_graph g;
    struct gp_cpu_runner *r;
};

static void run_open(struct run *R, const char *name, const char *off_env)
{
    struct gp_error err = {0};
    load_with(name, 2, off_env, &R->g);
    if (gp_cpu_runner_create_f32(&R->g, true, &R->r, &err) != GP_OK) fail_msg("%s", err.msg);
}

/* One forward and backward on x with output gradient w. */
static void run_step(struct run *R, const float *x, const float *w)
{
    struct gp_error err = {0};
    struct gp_run_opts o = {.training = true, .seed = 1, .step = 1, .dropout_ratio = -1};
    gp_cpu_runner_set_f32(R->r, R->g.inputs[0], x);
    if (gp_cpu_runner_forward_f32(R->r, &o, 0, R->g.n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);
    gp_cpu_runner_zero_activation_grads_f32(R->r);
    gp_cpu_runner_zero_param_grads_f32(R->r);
    int y = R->g.outputs[0];
    memcpy(gp_cpu_runner_grad_f32(R->r, y), w, sizeof(float) * (size_t)gp_shape_numel(&R->g.values[y].shape));
    if (gp_cpu_runner_backward_f32(R->r, &o, 0, R->g.n_nodes, &err) != GP_OK) fail_msg("%s", err.msg);
}

/* Fused (every fusion) against the graph without the fusion that off_env
 * switches off: output, the input's and every parameter's gradient, then
 * the output after three SGD steps. Both graphs hold the same values by
 * name (the fusions only drop activations). Returns the worst difference. */
static double compare_fusion(const char *name, const char *off_env, uint64_t seed)
{
    struct run F, U;
    run_open(&F, name, NULL);
    run_open(&U, name, off_env);
    const struct gp_value *xv = &F.g.values[F.g.inputs[0]], *yv = &F.g.values[F.g.outputs[0]];
    int64_t nx = gp_shape_numel(&xv->shape), ny = gp_shape_numel(&yv->shape);
    float *x = malloc(sizeof(float) * (size_t)nx), *w = malloc(sizeof(float) * (size_t)ny);
    uint64_t rs = seed;
    for (int64_t i = 0; i < nx; i++) x[i] = (float)uniform(&rs);
    for (int64_t i = 0; i < ny; i++) w[i] = (float)uniform(&rs);
    double worst = 0;
    for (int step = 0; step < 4; step++) {
        run_step(&F, x, w);
        run_step(&U, x, w);
        const float *yf = gp_cpu_runner_data_f32(F.r, F.g.outputs[0]);
        const float *yu = gp_cpu_runner_data_f32(U.r, U.g.outputs[0]);
        double e = rel_diff(yf, yu, ny);
        if (!(e <= 1e-5)) fail_msg("%s step %d: outputs differ by %.3g", name, step, e);
        worst = fmax(worst, e);
        e = rel_diff(gp_cpu_runner_grad_f32(F.r, F.g.inputs[0]), gp_cpu_runner_grad_f32(U.r, U.g.inputs[0]), nx);
        if (!(e <= 1e-5)) fail_msg("%s step %d: input gradients differ by %.3g", name, step, e);
        worst = fmax(worst, e);
        int params = 0;
        for (int v = 0; v < F.g.n_values; v++) {
            const struct gp_value *pv = &F.g.values[v];
            if (pv->kind != GP_VALUE_PARAMETER) continue;
            int vu = gp_graph_find_value(&U.g, pv->name);
            assert_true(vu >= 0 && U.g.values[vu].kind == GP_VALUE_PARAMETER);
            int64_t n = gp_shape_numel(&pv->shape);
            float *gf = gp_cpu_runner_grad_f32(F.r, v), *gu = gp_cpu_runner_grad_f32(U.r, vu);
            e = rel_diff(gf, gu, n);
            if (!(e <= 1e-5)) fail_msg("%s step %d: gradient of %s differs by %.3g", name, step, pv->name, e);
            worst = fmax(worst, e);
            /* SGD, the same update in both (from the unfused gradient). */
            float *pf = gp_cpu_runner_data_f32(F.r, v), *pu = gp_cpu_runner_data_f32(U.r, vu);
            for (int64_t i = 0; i < n; i++) {
                pu[i] -= 0.1f * gu[i];
                pf[i] -= 0.1f * gf[i];
            }
            params++;
        }
        assert_true(params >= 2);
    }
    free(x), free(w);
    gp_cpu_runner_free_f32(F.r);
    gp_cpu_runner_free_f32(U.r);
    gp_graph_free(&F.g);
    gp_graph_free(&U.g);
    return worst;
}

static void test_fused_equals_unfused(void **state)
{
    (void)state;
    double worst_all = 0;
    for (size_t s = 0; s < sizeof spellings / sizeof *spellings; s++) {
        double worst = compare_fusion(spellings[s].name, "GP_FUSE_ATTENTION", 99 + s);
        printf("%-24s fused within %.2g of unfused (relative to each tensor's largest element; 4 steps)\n",
               spellings[s].name, worst);
        worst_all = fmax(worst_all, worst);
    }
    printf("worst over the spellings: %.2g\n", worst_all);
}

/* The Split absorbed (packed_qkv) against the fused graph that keeps it
 * (GP_FUSE_QKV_SPLIT=0): the same bits, every step. */
static void test_qkv_split_same_bits(void **state)
{
    (void)state;
    int n = 0;
    for (size_t s = 0; s < sizeof spellings / sizeof *spellings; s++) {
        if (!spellings[s].qkv) continue;
        double worst = compare_fusion(spellings[s].name, "GP_FUSE_QKV_SPLIT", 41 + s);
        if (worst != 0) fail_msg("%s: packed Q, K, V differ from the Split's by %.3g", spellings[s].name, worst);
        printf("%-24s Split absorbed: the same bits as the Attention beside it (4 steps)\n", spellings[s].name);
        n++;
    }
    assert_true(n >= 4);
}

/* x [2, 3, 24] split along its last axis into Q, K, V for a 3-D Attention
 * of 2 heads (causal), by hand. `how`: 0 the equal thirds in order
 * (absorbed); the near misses, which keep the Split: 1 unequal parts
 * [8, 8, 16] of x [2, 3, 32] (V's heads of 8); 2 along the tokens (x
 * [2, 9, 8]); 3 Q and K swapped; 4 V also a graph output; 5 x also a
 * graph output; 6 Q read twice (as Q and K). Returns the Splits left;
 * *packed: the flag. */
static int split_chain(int how, bool *packed)
{
    struct gp_graph g;
    init(&g, 23);
    int64_t cols = how == 1 ? 32 : how == 2 ? 8 : 24, rows = how == 2 ? 9 : 3;
    input(&g, "x", GP_DTYPE_FLOAT32, 3, I64(2, rows, cols));
    int n;
    if (how == 1) {
        cany(&g, "sizes", GP_DTYPE_INT64, 1, I64(3), F64(8, 8, 16));
        n = node(&g, "Split", 2, S("x", "sizes"), 3, S("q", "k", "v"));
    } else {
        n = node(&g, "Split", 1, S("x"), 3, S("q", "k", "v"));
        attr_int(&g, n, "num_outputs", 3);
    }
    attr_int(&g, n, "axis", how == 2 ? 1 : 2);
    const char *const *in = how == 3 ? S("k", "q", "v") : how == 6 ? S("q", "q", "v") : S("q", "k", "v");
    n = node(&g, "Attention", 3, in, 1, S("y"));
    attr_int(&g, n, "is_causal", 1);
    attr_int(&g, n, "q_num_heads", 2);
    attr_int(&g, n, "kv_num_heads", 2);
    output(&g, "y");
    if (how == 4) output(&g, "v");
    if (how == 5) output(&g, "x");
    finalize(&g);
    int a = -1, s = -1, splits = count_op(&g, "Split", &s);
    assert_int_equal(count_op(&g, "Attention", &a), 1);
    *packed = g.nodes[a].packed_qkv;
    if (*packed) assert_int_equal(g.values[g.nodes[a].inputs[0]].shape.dims[2], 24);
    gp_graph_free(&g);
    return splits;
}

static void test_qkv_split_hand_built(void **state)
{
    (void)state;
    bool packed;
    assert_int_equal(split_chain(0, &packed), 0);
    assert_true(packed);
    for (int how = 1; how <= 6; how++) {
        if (split_chain(how, &packed) != 1 || packed) fail_msg("near miss %d: the Split was absorbed", how);
    }
}

/* The transformers' other fusion (graph/fuse.c): each Linear's
 * MatMul(x, Transpose(W)) reads W in place (trans_b). Its layers and
 * results against the graph with the Transposes kept. */
static void test_weight_transposes_absorbed(void **state)
{
    (void)state;
    static const char *const names[] = {"nanogpt_op17", "mha_op17", "nanogpt_sdpa_dynamo"};
    for (size_t s = 0; s < sizeof names / sizeof *names; s++) {
        struct gp_graph f, u;
        load_with(names[s], 2, NULL, &f);
        load_with(names[s], 2, "GP_FUSE_WEIGHT_TRANSPOSE", &u);
        int dummy, absorbed = 0;
        for (int i = 0; i < f.n_nodes; i++)
            if (f.nodes[i].trans_b) {
                absorbed++;
                assert_string_equal(f.nodes[i].op_type, "MatMul");
                assert_int_equal(f.values[f.nodes[i].inputs[1]].kind, GP_VALUE_PARAMETER);
            }
        int kept = count_op(&u, "Transpose", &dummy) - count_op(&f, "Transpose", &dummy);
        if (absorbed < 1 || kept != absorbed) fail_msg("%s: %d MatMuls read a weight transposed, %d Transposes went", names[s], absorbed, kept);
        assert_int_equal(f.n_nodes + absorbed, u.n_nodes);
        gp_graph_free(&f);
        gp_graph_free(&u);
        double worst = compare_fusion(names[s], "GP_FUSE_WEIGHT_TRANSPOSE", 7 + s);
        printf("%-24s %d weight Transposes absorbed; within %.2g of the graph that keeps them (4 steps)\n", names[s],
               absorbed, worst);
    }
}

/* The bias Adds after the Linear layers' MatMuls (graph/fuse.c,
 * fused_bias): on the attention fixtures (float inputs) the fused graph
 * trains to the same bits as the one that keeps the Adds
 * (GP_FUSE_MATMUL_BIAS=0): the same float32 add after the same product,
 * the same column sums for the bias's gradient. On the fixture GPT and MLP
 * (token and image inputs), the count: every MatMul whose product only a
 * parameter's Add reads absorbed that Add. */
static void test_matmul_biases_absorbed(void **state)
{
    (void)state;
    static const char *const names[] = {"nanogpt_op17", "mha_op17", "nanogpt_sdpa_dynamo"};
    for (size_t s = 0; s < sizeof names / sizeof *names; s++) {
        struct gp_graph f, u;
        load_with(names[s], 2, NULL, &f);
        load_with(names[s], 2, "GP_FUSE_MATMUL_BIAS", &u);
        int dummy, fused = 0;
        for (int i = 0; i < f.n_nodes; i++)
            if (f.nodes[i].fused_bias) {
                fused++;
                assert_string_equal(f.nodes[i].op_type, "MatMul");
                assert_int_equal(f.nodes[i].n_inputs, 3);
                assert_int_equal(f.values[f.nodes[i].inputs[2]].kind, GP_VALUE_PARAMETER);
            }
        int kept = count_op(&u, "Add", &dummy) - count_op(&f, "Add", &dummy);
        if (fused < 1 || kept != fused) fail_msg("%s: %d MatMuls add a bias, %d Adds went", names[s], fused, kept);
        assert_int_equal(f.n_nodes + fused, u.n_nodes);
        gp_graph_free(&f);
        gp_graph_free(&u);
        double worst = compare_fusion(names[s], "GP_FUSE_MATMUL_BIAS", 17 + s);
        if (worst != 0) fail_msg("%s: the fused biases differ from the Adds by %.3g", names[s], worst);
        printf("%-24s %d bias Adds absorbed; the same bits as the graph that keeps them (4 steps)\n", names[s], fused);
    }
    static const char *const fixtures[] = {"gpt_op17.onnx", "gpt_dynamo.onnx"};
    for (size_t s = 0; s < sizeof fixtures / sizeof *fixtures; s++) {
        char path[4096];
        struct gp_graph f, u;
        struct gp_error err = {0};
        fixture_path(fixtures[s], path, sizeof path);
        if (gp_onnx_load(path, 2, &f, &err) != GP_OK) fail_msg("%s", err.msg);
        setenv("GP_FUSE_MATMUL_BIAS", "0", 1);
        gp_status st = gp_onnx_load(path, 2, &u, &err);
        unsetenv("GP_FUSE_MATMUL_BIAS");
        if (st != GP_OK) fail_msg("%s", err.msg);
        int fused = 0, pairs = 0, dummy;
        for (int i = 0; i < f.n_nodes; i++) fused += f.nodes[i].fused_bias;
        /* MatMul + parameter Add pairs of the unfused graph whose product
         * has no other reader. */
        for (int i = 0; i < u.n_nodes; i++) {
            const struct gp_node *n = &u.nodes[i];
            if (strcmp(n->op_type, "MatMul") || u.values[n->outputs[0]].is_output) continue;
            int readers = 0, add = -1;
            for (int j = 0; j < u.n_nodes; j++)
                for (int k = 0; k < u.nodes[j].n_inputs; k++)
                    if (u.nodes[j].inputs[k] == n->outputs[0]) readers++, add = j;
            if (readers != 1 || strcmp(u.nodes[add].op_type, "Add")) continue;
            const struct gp_node *a = &u.nodes[add];
            int b = a->inputs[0] == n->outputs[0] ? a->inputs[1] : a->inputs[0];
            if (b >= 0 && u.values[b].kind == GP_VALUE_PARAMETER) pairs++;
        }
        if (fused < 1 || fused != pairs) fail_msg("%s: %d of %d MatMul + bias pairs fused", fixtures[s], fused, pairs);
        assert_int_equal(count_op(&u, "Add", &dummy) - count_op(&f, "Add", &dummy), fused);
        printf("%-24s %d bias Adds absorbed\n", fixtures[s], fused);
        gp_graph_free(&f);
        gp_graph_free(&u);
    }
}

/* ---- memory against the sequence length ----
 * One attention layer as a stage of its own, planned by the executor's
 * planner (gp_plan_stage) for the backend's kernels (their saved-state and
 * scratch hooks), fused and as the chain the exporters write. The fused
 * layer saves one logsumexp per query row (its backward's scratch: one
 * value per row): linear in T. The chain keeps the [T, T] probabilities
 * for the backward, passes [T, T] scores through the forward's arena
 * (two alive at once) and [T, T] gradients through the gradient set (two
 * alive at once), and holds the [T, T] mask: quadratic (at T = 2048 on the
 * CPU, 172 MiB against 10 MiB). */

enum { MEM_B = 1, MEM_H = 2, MEM_D = 64 };

/* x [B, H, T, D] (the data); Q, K, V = x plus a bias of their own (float
 * initializers, so parameters: gradients flow back through the layer as in
 * a model, and no scale by a parameter sits on Q); then MatMul(Q,
 * Transpose(K)) / 8, Where(causal keep [T, T], scores, -1e9), Softmax,
 * MatMul with V. Fused unless `fuse` is false (GP_FUSE_ATTENTION=0). */
static void build_attention_layer(struct gp_graph *g, int64_t T, bool fuse)
{
    init(g, 17);
    input(g, "x", GP_DTYPE_FLOAT32, 4, I64(MEM_B, MEM_H, T, MEM_D));
    static const double zeros[MEM_D];
    cany(g, "bq", GP_DTYPE_FLOAT32, 1, I64(MEM_D), zeros);
    cany(g, "bk", GP_DTYPE_FLOAT32, 1, I64(MEM_D), zeros);
    cany(g, "bv", GP_DTYPE_FLOAT32, 1, I64(MEM_D), zeros);
    node(g, "Add", 2, S("x", "bq"), 1, S("q"));
    node(g, "Add", 2, S("x", "bk"), 1, S("k"));
    node(g, "Add", 2, S("x", "bv"), 1, S("v"));
    /* Constants cast from integers: not parameters (see hand_chain). */
    cany(g, "ci", GP_DTYPE_INT64, 0, I64(0), F64(8));
    attr_int(g, node(g, "Cast", 1, S("ci"), 1, S("c")), "to", GP_DTYPE_FLOAT32);
    cany(g, "fi", GP_DTYPE_INT64, 0, I64(0), F64(-1e9));
    attr_int(g, node(g, "Cast", 1, S("fi"), 1, S("fill")), "to", GP_DTYPE_FLOAT32);
    /* The triangle set element by element: a [T, T] array of doubles for
     * cany would be 32 MiB at T = 2048. */
    struct gp_error err = {0};
    struct gp_shape ms = shp(2, I64(T, T));
    struct gp_tensor *keep = gp_graph_new_tensor(g, GP_DTYPE_BOOL, &ms);
    assert_non_null(keep);
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < T; j++) gp_tensor_set_f64(keep, i * T + j, j <= i);
    assert_int_equal(gp_graph_add_initializer(g, "keep", keep, &err), GP_OK);
    attr_ints(g, node(g, "Transpose", 1, S("k"), 1, S("kt")), "perm", 4, I64(0, 1, 3, 2));
    node(g, "MatMul", 2, S("q", "kt"), 1, S("s0"));
    node(g, "Div", 2, S("s0", "c"), 1, S("s1"));
    node(g, "Where", 3, S("keep", "s1", "fill"), 1, S("s"));
    attr_int(g, node(g, "Softmax", 1, S("s"), 1, S("p")), "axis", -1);
    node(g, "MatMul", 2, S("p", "v"), 1, S("y"));
    output(g, "y");
    if (!fuse) setenv("GP_FUSE_ATTENTION", "0", 1);
    finalize(g);
    if (!fuse) unsetenv("GP_FUSE_ATTENTION");
    int a = -1;
    assert_int_equal(count_op(g, "Attention", &a), fuse ? 1 : 0);
    if (fuse) assert_int_equal(gp_node_attr_int(&g->nodes[a], "is_causal", 0), 1);
}

/* What the executor allocates for the stage with one micro-batch in
 * flight: gp_pipeline_report's planned_bytes with one input box, one
 * activation set (each layer's saved state in it) and one gradient inbox,
 * without the optimizer's state (the optimizer's, not the layer's):
 * parameters and their gradients, constants, once-per-step values and
 * bf16 shadows, the box, the set, the forward's arena, the gradient set,
 * the largest kernel scratch and bf16's float32 staging. */
static int64_t stage_bytes(const struct gp_stage_plan *p)
{
    size_t ws = ((p->scratch_bytes + 63) & ~(size_t)63) + ((p->staging_bytes + 63) & ~(size_t)63);
    return (int64_t)(2 * p->param_bytes + (p->static_bytes - p->param_bytes) + p->step_bytes + p->step_grad_bytes +
                     p->shadow_bytes + p->box_bytes + p->local_bytes + p->inbox_bytes + p->arena_bytes +
                     p->grad_bytes + ws);
}

/* The layer at T planned on one stage for `ops` in `precision`. */
static int64_t layer_bytes(int64_t T, bool fuse, const struct gp_compute_ops *ops, const char *backend,
                           enum gp_precision precision)
{
    struct gp_graph g;
    struct gp_layers l;
    struct gp_stage_plan p;
    struct gp_error err = {0};
    build_attention_layer(&g, T, fuse);
    if (gp_layers_build(&g, &l, &err) != GP_OK) fail_msg("%s", err.msg);
    bool *needs = calloc((size_t)g.n_values + 1, sizeof(bool));
    assert_non_null(needs);
    gp_plan_needs_grad(&g, needs);
    /* The gradient reaches Q, K and V: the layer's backward is planned. */
    assert_true(needs[gp_graph_find_value(&g, "q")] && needs[gp_graph_find_value(&g, "y")]);
    const struct gp_compute_options opts = {.precision = precision};
    if (gp_plan_stage(&g, &l, needs, ops, &opts, backend, 0, g.n_nodes, &p, &err) != GP_OK)
        fail_msg("%s T=%lld: %s", backend, (long long)T, err.msg);
    int64_t bytes = stage_bytes(&p);
    gp_plan_free(&p);
    free(needs);
    gp_layers_free(&l);
    gp_graph_free(&g);
    return bytes;
}

#ifdef GP_HAVE_CUDA
/* cuda/attention.cu: an Attention node's scratch for a stage's options;
 * in bf16 cuDNN's where it would run the node (its plans built on the
 * current GPU), else the own kernels'. */
size_t gp_cuda_attention_scratch_bytes(const struct gp_graph *g, const struct gp_node *node,
                                       const struct gp_compute_options *opts);
#endif

enum { MEM_N = 4 };
static const int64_t mem_T[MEM_N] = {256, 512, 1024, 2048};

/* Fused: each doubling adds twice what the previous one added (within 1%
 * and 4 KiB: alignment), and at the largest T the chain takes over 8 times
 * as much; unfused: the last doubling multiplies by 3.5 or more. Prints the
 * table. `linear_fused` false: the fused figures are only printed (cuDNN's
 * deterministic backward keeps dP whole in its workspace before cuDNN
 * 9.25, B x H x T x T bfloat16 values: README). */
static void check_growth(const char *what, const int64_t *fused, const int64_t *unfused, bool linear_fused)
{
    printf("%s:\n%8s %16s %16s %8s\n", what, "T", "fused bytes", "unfused bytes", "ratio");
    for (int i = 0; i < MEM_N; i++)
        printf("%8lld %16lld %16lld %8.1f\n", (long long)mem_T[i], (long long)fused[i], (long long)unfused[i],
               (double)unfused[i] / (double)fused[i]);
    for (int i = 2; i < MEM_N && linear_fused; i++) {
        int64_t d1 = fused[i - 1] - fused[i - 2], d2 = fused[i] - fused[i - 1];
        if (d1 <= 0 || llabs(d2 - 2 * d1) > d2 / 100 + 4096)
            fail_msg("%s: fused bytes not linear in T: +%lld from T=%lld to %lld, +%lld from %lld to %lld", what,
                     (long long)d1, (long long)mem_T[i - 2], (long long)mem_T[i - 1], (long long)d2,
                     (long long)mem_T[i - 1], (long long)mem_T[i]);
    }
    double r = (double)unfused[MEM_N - 1] / (double)unfused[MEM_N - 2];
    printf("unfused x%.2f from T=%lld to %lld\n", r, (long long)mem_T[MEM_N - 2], (long long)mem_T[MEM_N - 1]);
    if (!(r >= 3.5)) fail_msg("%s: unfused bytes grew x%.2f per doubling at T=%lld: not quadratic", what, r,
                              (long long)mem_T[MEM_N - 2]);
    if (linear_fused && !(unfused[MEM_N - 1] > 8 * fused[MEM_N - 1]))
        fail_msg("%s: the chain takes %lld bytes at T=%lld, the fused layer %lld", what,
                 (long long)unfused[MEM_N - 1], (long long)mem_T[MEM_N - 1], (long long)fused[MEM_N - 1]);
}

static void test_memory_linear_in_T(void **state)
{
    (void)state;
    int64_t fused[MEM_N], unfused[MEM_N];
    char what[128];
    snprintf(what, sizeof what, "CPU stage plan, fp32, B=%d, %d heads of %d, causal", MEM_B, MEM_H, MEM_D);
    for (int i = 0; i < MEM_N; i++) {
        fused[i] = layer_bytes(mem_T[i], true, &gp_cpu_compute_ops, "cpu", GP_PRECISION_FP32);
        unfused[i] = layer_bytes(mem_T[i], false, &gp_cpu_compute_ops, "cpu", GP_PRECISION_FP32);
    }
    check_growth(what, fused, unfused, true);
#ifdef GP_HAVE_CUDA
    /* The CUDA kernels' hooks are host code: the planner asks them
     * without a GPU. */
    const struct gp_device_ops *cuda = gp_backend_find("cuda");
    assert_non_null(cuda);
    static const enum gp_precision precisions[] = {GP_PRECISION_FP32, GP_PRECISION_BF16};
    for (int k = 0; k < 2; k++) {
        enum gp_precision pr = precisions[k];
        bool cudnn = false;
        for (int i = 0; i < MEM_N; i++) {
            fused[i] = layer_bytes(mem_T[i], true, cuda->compute, "cuda", pr);
            unfused[i] = layer_bytes(mem_T[i], false, cuda->compute, "cuda", pr);
            /* The own kernels' scratch is the fp32 one: one float per row.
             * More in bf16: cuDNN's SDPA would run the layer. */
            struct gp_graph g;
            build_attention_layer(&g, mem_T[i], true);
            int a = -1;
            count_op(&g, "Attention", &a);
            const struct gp_node *n = &g.nodes[a];
            size_t own = gp_cuda_attention_scratch_bytes(&g, n, &(struct gp_compute_options){0});
            size_t here = gp_cuda_attention_scratch_bytes(&g, n, &(struct gp_compute_options){.precision = pr});
            assert_int_equal(own, sizeof(float) * MEM_B * MEM_H * (size_t)mem_T[i]);
            cudnn |= here > own;
            gp_graph_free(&g);
        }
        snprintf(what, sizeof what, "CUDA stage plan, %s, %s", gp_precision_name(pr),
                 pr != GP_PRECISION_BF16 ? "own kernels"
                 : cudnn                 ? "cuDNN's SDPA (its workspace)"
                                         : "own kernels (no GPU to build cuDNN's plans, or cuDNN declined)");
        check_growth(what, fused, unfused, !cudnn);
    }
#else
    printf("built without CUDA: the CUDA kernels' plan is not measured\n");
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_reference), cmocka_unit_test(test_gradients),
        cmocka_unit_test(test_refusals),          cmocka_unit_test(test_spellings_fuse),
        cmocka_unit_test(test_hand_built_chains), cmocka_unit_test(test_fixture_gpt_unfused),
        cmocka_unit_test(test_fused_equals_unfused), cmocka_unit_test(test_qkv_split_same_bits),
        cmocka_unit_test(test_qkv_split_hand_built), cmocka_unit_test(test_weight_transposes_absorbed),
        cmocka_unit_test(test_matmul_biases_absorbed),
        cmocka_unit_test(test_memory_linear_in_T),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
