/* The CUDA elementwise kernels (cuda/elementwise.cu) against the CPU float
 * kernels, the reference: for each op a one-node graph, random inputs, the
 * forward output and every input gradient compared element by element.
 * Gradients start from random values on both sides, so the test also checks
 * that backward accumulates (+=) rather than overwrites. Binary ops run on
 * broadcast shapes ([2,3,4] with [4], [2,1,4] with [1,3,1], scalars) and on
 * tensors large enough that the grid-stride loops go round more than once.
 *
 * Tolerance: |cuda - cpu| <= 1e-5 |cpu| + 1e-6. Arithmetic is identical on
 * both sides up to the math library (expf, tanhf, erff differ by a few ulps)
 * and the absolute term covers gradients that cancel to near zero.
 *
 * Without a CUDA device the test prints why and exits 77 (a skip). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/cpu/kernel.h"
#include "cuda/kernel.h"
#include "graph/build.h"

/* test_kernels.cu: a launch with zero blocks, left unchecked. */
void gp_test_bad_launch(cudaStream_t s);

#define REL_TOL 1e-5
#define ABS_TOL 1e-6

static int n_checked;           /* op cases compared */
static char ops_seen[32][32];   /* distinct op types, for the summary (copied: the
                                   graphs naming them are freed) */
static int n_ops_seen;

static void note_op(const char *op)
{
    for (int i = 0; i < n_ops_seen; i++)
        if (strcmp(ops_seen[i], op) == 0) return;
    if (n_ops_seen < 32) snprintf(ops_seen[n_ops_seen++], sizeof ops_seen[0], "%s", op);
}

/* ---- helpers ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

/* Uniform in [lo, hi). */
static float uniform(float lo, float hi)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return lo + (hi - lo) * (float)((rng_state >> 40) * (1.0 / 16777216.0));
}

static void cuda_ok(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) fail_msg("%s: %s", what, cudaGetErrorString(e));
}

static float *dev_upload(const float *h, int64_t n)
{
    void *d = NULL;
    size_t bytes = (size_t)(n ? n : 1) * sizeof(float);
    cuda_ok(cudaMalloc(&d, bytes), "cudaMalloc");
    if (n) cuda_ok(cudaMemcpy(d, h, (size_t)n * sizeof(float), cudaMemcpyHostToDevice), "upload");
    return d;
}

static void dev_download(float *h, const float *d, int64_t n)
{
    if (n) cuda_ok(cudaMemcpy(h, d, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost), "download");
}

static char *shape_str(const struct gp_shape *s, char *buf, size_t size)
{
    return gp_shape_format(s, buf, size);
}

/* Fails naming the case, the tensor and the first element out of tolerance.
 * NaN matches NaN (Relu passes NaN through on both backends). */
static void compare(const char *label, const char *tensor, const float *gpu, const float *cpu, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float g = gpu[i], c = cpu[i];
        if (isnan(c) && isnan(g)) continue;
        double diff = fabs((double)g - (double)c);
        if (!(diff <= REL_TOL * fabs((double)c) + ABS_TOL))
            fail_msg("%s: %s, element %lld: cuda %.9g, cpu %.9g (difference %.3g)", label, tensor,
                     (long long)i, (double)g, (double)c, diff);
    }
}

/* A one-node graph: inputs x0..x{n-1} (float32, given shapes), output y. */
struct one_node {
    struct gp_graph g;
    const struct gp_node *node;
};

static void build(struct one_node *t, const char *op, int n_in, const struct gp_shape *shapes,
                  float alpha)
{
    struct gp_error err = {0};
    static const char *const names[] = {"x0", "x1"};
    if (gp_graph_init(&t->g, 0, 17, 16, 4, &err) != GP_OK) fail_msg("graph init: %s", err.msg);
    /* A graph input needs a batch axis, so scalars are initializers (they
     * become trainable parameters: read, not folded). Their data here is
     * unused: the kernels read the buffers the test passes. */
    for (int i = 0; i < n_in; i++) {
        gp_status st = shapes[i].rank == 0
                           ? gp_graph_add_const_f32(&t->g, names[i], &shapes[i], &(float){0}, &err)
                           : gp_graph_add_input(&t->g, names[i], GP_DTYPE_FLOAT32, &shapes[i], &err);
        if (st != GP_OK) fail_msg("%s: input %s: %s", op, names[i], err.msg);
    }
    const char *out[] = {"y"};
    int id = gp_graph_add_node(&t->g, op, "", "n", n_in, names, 1, out, &err);
    if (id < 0) fail_msg("%s: add node: %s", op, err.msg);
    if (!isnan(alpha)) {
        struct gp_attr *a = gp_graph_add_attr(&t->g, id, "alpha", GP_ATTR_FLOAT, 1, &err);
        if (!a) fail_msg("%s: attribute: %s", op, err.msg);
        a->f = alpha;
    }
    if (gp_graph_add_output(&t->g, "y", &err) != GP_OK) fail_msg("%s: output: %s", op, err.msg);
    if (gp_graph_finalize(&t->g, &err) != GP_OK) fail_msg("%s: finalize: %s", op, err.msg);
    if (t->g.n_nodes != 1) fail_msg("%s: graph has %d nodes, expected 1", op, t->g.n_nodes);
    t->node = &t->g.nodes[0];
}

/* Runs node on both backends from the same inputs X[k], output gradient dY
 * and starting input gradients D0[k]; compares Y and every dX[k]. */
static void run_case(const char *label, struct one_node *t, float *const *X, const float *dY,
                     float *const *D0)
{
    const struct gp_graph *g = &t->g;
    const struct gp_node *node = t->node;
    int n_in = node->n_inputs;
    int64_t n_y = gp_shape_numel(&gp_node_output(g, node, 0)->shape), n_x[2];
    for (int k = 0; k < n_in; k++) n_x[k] = gp_shape_numel(&gp_node_input(g, node, k)->shape);

    const struct gp_cpu_kernel *ck = gp_cpu_kernel_for_f32(node);
    const struct gp_cuda_kernel *gk = gp_cuda_kernel_for(node);
    if (!ck) fail_msg("%s: no CPU kernel", label);
    if (!gk) fail_msg("%s: no CUDA kernel", label);
    if (!gk->backward) fail_msg("%s: CUDA kernel has no backward", label);
    if (gk->saved_bytes || gk->scratch_bytes) fail_msg("%s: unexpected saved/scratch memory", label);

    /* CPU reference. */
    float *Y_cpu = calloc((size_t)n_y + 1, sizeof(float));
    float *dY_cpu = malloc(((size_t)n_y + 1) * sizeof(float));
    float *D_cpu[2] = {NULL, NULL};
    assert_non_null(Y_cpu);
    assert_non_null(dY_cpu);
    memcpy(dY_cpu, dY, (size_t)n_y * sizeof(float));
    for (int k = 0; k < n_in; k++) {
        D_cpu[k] = malloc(((size_t)n_x[k] + 1) * sizeof(float));
        assert_non_null(D_cpu[k]);
        memcpy(D_cpu[k], D0[k], (size_t)n_x[k] * sizeof(float));
    }
    void *in[2] = {X[0], n_in > 1 ? X[1] : NULL}, *out[1] = {Y_cpu};
    real *din[2] = {D_cpu[0], D_cpu[1]}, *dout[1] = {dY_cpu};
    struct gp_cpu_ctx cc = {.graph = g, .node = node, .in = in, .out = out, .din = din, .dout = dout,
                            .dropout_ratio = -1};
    struct gp_error err = {0};
    if (ck->forward(&cc, &err) != GP_OK) fail_msg("%s: CPU forward: %s", label, err.msg);
    if (ck->backward(&cc, &err) != GP_OK) fail_msg("%s: CPU backward: %s", label, err.msg);

    /* CUDA. */
    cudaStream_t stream;
    cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    float *dX[2] = {NULL, NULL}, *dD[2] = {NULL, NULL};
    for (int k = 0; k < n_in; k++) {
        dX[k] = dev_upload(X[k], n_x[k]);
        dD[k] = dev_upload(D0[k], n_x[k]);
    }
    float *dYv = dev_upload(dY, n_y);
    void *out_buf = NULL;
    cuda_ok(cudaMalloc(&out_buf, (size_t)(n_y ? n_y : 1) * sizeof(float)), "cudaMalloc");
    cuda_ok(cudaMemset(out_buf, 0xff, (size_t)(n_y ? n_y : 1) * sizeof(float)), "cudaMemset");
    void *gin[2] = {dX[0], dX[1]}, *gout[1] = {out_buf};
    float *gdin[2] = {dD[0], dD[1]}, *gdout[1] = {dYv};
    struct gp_cuda_ctx gc = {.graph = g, .node = node, .in = gin, .out = gout, .din = gdin,
                             .dout = gdout, .stream = stream, .dropout_ratio = -1};
    if (gk->forward(&gc, &err) != GP_OK) fail_msg("%s: CUDA forward: %s", label, err.msg);
    if (gk->backward(&gc, &err) != GP_OK) fail_msg("%s: CUDA backward: %s", label, err.msg);
    cuda_ok(cudaStreamSynchronize(stream), label);

    float *h = malloc(((size_t)n_y + 1) * sizeof(float));
    assert_non_null(h);
    dev_download(h, out_buf, n_y);
    compare(label, "output Y", h, Y_cpu, n_y);
    for (int k = 0; k < n_in; k++) {
        float *hd = malloc(((size_t)n_x[k] + 1) * sizeof(float));
        assert_non_null(hd);
        dev_download(hd, dD[k], n_x[k]);
        compare(label, k == 0 ? "gradient of input 0" : "gradient of input 1", hd, D_cpu[k], n_x[k]);
        free(hd);
    }
    free(h);

    for (int k = 0; k < n_in; k++) {
        cudaFree(dX[k]);
        cudaFree(dD[k]);
        free(D_cpu[k]);
    }
    cudaFree(dYv);
    cudaFree(out_buf);
    cudaStreamDestroy(stream);
    free(Y_cpu);
    free(dY_cpu);
    n_checked++;
    note_op(node->op_type);
}

static struct gp_shape shape_of(int rank, const int64_t *dims)
{
    struct gp_shape s = {.rank = rank};
    for (int i = 0; i < rank; i++) s.dims[i] = dims[i];
    return s;
}

static float *random_array(int64_t n, float lo, float hi)
{
    float *a = malloc(((size_t)n + 1) * sizeof(float));
    assert_non_null(a);
    for (int64_t i = 0; i < n; i++) a[i] = uniform(lo, hi);
    return a;
}

/* ---- unary ---- */

struct unary_case {
    const char *op;
    float alpha; /* NAN: no attribute */
    float lo, hi; /* input range */
};

static void test_unary(void **state)
{
    (void)state;
    static const struct unary_case cases[] = {
        {"Relu", NAN, -2, 2},    {"LeakyRelu", NAN, -2, 2}, {"LeakyRelu", 0.2f, -2, 2},
        {"Sigmoid", NAN, -8, 8}, {"Tanh", NAN, -3, 3},      {"Erf", NAN, -2.5f, 2.5f},
        {"Sqrt", NAN, 0.05f, 4}, {"Neg", NAN, -2, 2},       {"Exp", NAN, -4, 4},
        {"Identity", NAN, -2, 2},
    };
    static const int64_t small[] = {2, 3, 4, 5}, large[] = {300, 1001};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        for (int s = 0; s < 2; s++) {
            const struct unary_case *u = &cases[c];
            struct gp_shape sh = s == 0 ? shape_of(4, small) : shape_of(2, large);
            struct one_node t;
            build(&t, u->op, 1, &sh, u->alpha);
            int64_t n = gp_shape_numel(&sh);
            float *x = random_array(n, u->lo, u->hi), *dy = random_array(n, -1, 1);
            float *d0 = random_array(n, -1, 1);
            if (strcmp(u->op, "Relu") == 0 || strcmp(u->op, "LeakyRelu") == 0) {
                x[0] = 0.0f; /* the kink: both sides take the same branch */
                x[1] = -0.0f;
                x[2] = NAN; /* passed through by the forward pass */
            }
            char label[128], sb[64];
            snprintf(label, sizeof label, "%s%s %s", u->op, isnan(u->alpha) ? "" : " (alpha 0.2)",
                     shape_str(&sh, sb, sizeof sb));
            float *X[2] = {x, NULL}, *D0[2] = {d0, NULL};
            run_case(label, &t, X, dy, D0);
            free(x);
            free(dy);
            free(d0);
            gp_graph_free(&t.g);
        }
    }
}

/* ---- binary ---- */

struct bshapes {
    int ra, rb;
    int64_t a[4], b[4];
};

static void test_binary(void **state)
{
    (void)state;
    static const char *const ops[] = {"Add", "Sub", "Mul", "Div"};
    static const struct bshapes shapes[] = {
        {3, 1, {2, 3, 4}, {4}},          /* trailing axis */
        {3, 3, {2, 1, 4}, {1, 3, 1}},    /* both broadcast */
        {3, 0, {2, 3, 4}, {0}},          /* scalar B */
        {0, 3, {0}, {2, 3, 4}},          /* scalar A */
        {0, 0, {0}, {0}},                /* scalar with scalar */
        {3, 3, {2, 3, 4}, {2, 3, 4}},    /* same shapes */
        {4, 3, {8, 64, 33, 17}, {64, 1, 1}}, /* large, one middle axis kept */
        {2, 3, {1, 4099}, {130, 1, 1}},  /* large, outer product */
    };
    for (size_t o = 0; o < sizeof ops / sizeof *ops; o++) {
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            const struct bshapes *bs = &shapes[s];
            struct gp_shape sh[2] = {shape_of(bs->ra, bs->a), shape_of(bs->rb, bs->b)};
            struct one_node t;
            build(&t, ops[o], 2, sh, NAN);
            int64_t na = gp_shape_numel(&sh[0]), nb = gp_shape_numel(&sh[1]);
            int64_t ny = gp_shape_numel(&gp_node_output(&t.g, t.node, 0)->shape);
            float *a = random_array(na, -2, 2), *b = random_array(nb, 0.5f, 2);
            /* Div: divisors away from zero, of both signs. */
            for (int64_t i = 0; i < nb; i++)
                if (uniform(0, 1) < 0.5f) b[i] = -b[i];
            float *dy = random_array(ny, -1, 1);
            float *da = random_array(na, -1, 1), *db = random_array(nb, -1, 1);
            char label[160], sa[64], sbuf[64];
            snprintf(label, sizeof label, "%s %s with %s", ops[o], shape_str(&sh[0], sa, sizeof sa),
                     shape_str(&sh[1], sbuf, sizeof sbuf));
            float *X[2] = {a, b}, *D0[2] = {da, db};
            run_case(label, &t, X, dy, D0);
            free(a);
            free(b);
            free(dy);
            free(da);
            free(db);
            gp_graph_free(&t.g);
        }
    }
}

/* ---- absent gradients ---- */

/* dout NULL: nothing changes; din NULL for one input: the other still gets
 * its gradient. Either would crash or corrupt memory if ignored. */
static void test_null_gradients(void **state)
{
    (void)state;
    static const int64_t da_dims[] = {2, 3, 4}, db_dims[] = {4};
    struct gp_shape sh[2] = {shape_of(3, da_dims), shape_of(1, db_dims)};
    const char *const ops[] = {"Relu", "Add", "Identity"};
    for (int o = 0; o < 3; o++) {
        struct one_node t;
        int n_in = strcmp(ops[o], "Add") == 0 ? 2 : 1;
        build(&t, ops[o], n_in, sh, NAN);
        const struct gp_cuda_kernel *gk = gp_cuda_kernel_for(t.node);
        assert_non_null(gk);
        float *x = random_array(24, -1, 1), *d0 = random_array(24, -1, 1);
        float *dx = dev_upload(x, 24), *dd = dev_upload(d0, 24), *dy = dev_upload(x, 24);
        float *dxb = dev_upload(x, 4), *ddb = dev_upload(d0, 4);
        cudaStream_t stream;
        cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
        void *in[2] = {dx, dxb}, *out[1] = {dy};
        float *din[2] = {dd, ddb}, *dout[1] = {NULL};
        struct gp_cuda_ctx c = {.graph = &t.g, .node = t.node, .in = in, .out = out, .din = din,
                                .dout = dout, .stream = stream, .dropout_ratio = -1};
        struct gp_error err = {0};
        if (gk->backward(&c, &err) != GP_OK) fail_msg("%s: backward, dout NULL: %s", ops[o], err.msg);
        cuda_ok(cudaStreamSynchronize(stream), ops[o]);
        float h[24];
        dev_download(h, dd, 24);
        for (int i = 0; i < 24; i++)
            if (h[i] != d0[i])
                fail_msg("%s: dout NULL changed din[0] element %d: %.9g, was %.9g", ops[o], i,
                         (double)h[i], (double)d0[i]);
        if (n_in == 2) {
            /* din[0] NULL, dout ones: dB = d0 + 6 (the sum over 2 x 3). */
            float ones[24];
            for (int i = 0; i < 24; i++) ones[i] = 1.0f;
            float *dones = dev_upload(ones, 24);
            float *din2[2] = {NULL, ddb}, *dout2[1] = {dones};
            c.din = din2;
            c.dout = dout2;
            if (gk->backward(&c, &err) != GP_OK) fail_msg("Add: backward, din[0] NULL: %s", err.msg);
            cuda_ok(cudaStreamSynchronize(stream), "Add");
            dev_download(h, ddb, 4);
            for (int i = 0; i < 4; i++)
                if (fabsf(h[i] - (d0[i] + 6.0f)) > 1e-5f)
                    fail_msg("Add: din[0] NULL: din[1] element %d: %.9g, expected %.9g", i,
                             (double)h[i], (double)(d0[i] + 6.0f));
            cudaFree(dones);
        }
        cudaFree(dx);
        cudaFree(dd);
        cudaFree(dy);
        cudaFree(dxb);
        cudaFree(ddb);
        cudaStreamDestroy(stream);
        free(x);
        free(d0);
        gp_graph_free(&t.g);
    }
}

/* Unknown ops and foreign domains find no kernel; a failed launch is an
 * error naming the node and the call. */
static void test_lookup_and_errors(void **state)
{
    (void)state;
    struct gp_node node = {.name = "mystery_node", .op_type = "Conv", .domain = ""};
    assert_null(gp_cuda_kernel_for(&node));
    node.op_type = "Relu";
    assert_non_null(gp_cuda_kernel_for(&node));
    node.domain = "com.example";
    assert_null(gp_cuda_kernel_for(&node));
    node.domain = "";

    struct gp_cuda_ctx c = {.node = &node};
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

int main(void)
{
    int n_devices = 0;
    cudaError_t e = cudaGetDeviceCount(&n_devices);
    if (e != cudaSuccess || n_devices == 0) {
        printf("skipped: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup_and_errors),
        cmocka_unit_test(test_unary),
        cmocka_unit_test(test_binary),
        cmocka_unit_test(test_null_gradients),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (failed == 0)
        printf("cuda_elementwise: PASSED, %d ops (%d cases against the CPU kernels)\n", n_ops_seen,
               n_checked);
    else
        printf("cuda_elementwise: %d of %d tests FAILED\n", failed, (int)(sizeof tests / sizeof *tests));
    return failed ? 1 : 0;
}
