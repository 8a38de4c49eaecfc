/* The CPU-against-CUDA comparison of one node (op_compare.h). */
#include "op_compare.h"

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

#include "backend/compute.h"
#include "backend/cpu/kernel.h"
#include "backend/cuda/kernel.h"
#include "graph/layout.h"
#include "graph/tensor.h"

#define MAX_IO OP_COMPARE_MAX_INPUTS

static int n_cases;
static char op_types[64][32];
static int n_op_types;

int op_compare_cases(void) { return n_cases; }
int op_compare_op_types(void) { return n_op_types; }

static void note_op(const char *op)
{
    for (int i = 0; i < n_op_types; i++)
        if (strcmp(op_types[i], op) == 0) return;
    if (n_op_types < 64) snprintf(op_types[n_op_types++], sizeof op_types[0], "%s", op);
}

void op_compare_require_device(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("skipped: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
        exit(77);
    }
}

/* xorshift, fixed seed: a failure reproduces; every case draws fresh values. */
static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static float uniform(float lo, float hi)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return lo + (hi - lo) * (float)((rng_state >> 40) * (1.0 / 16777216.0));
}

void op_cuda_ok(cudaError_t e, const char *label, const char *what)
{
    if (e != cudaSuccess) fail_msg("%s: %s: %s", label, what, cudaGetErrorString(e));
}

static size_t esize(enum gp_dtype dt)
{
    return gp_dtype_is_float(dt) ? sizeof(float) : gp_dtype_size(dt);
}

void *op_dev_alloc(size_t bytes, const char *label)
{
    void *d = NULL;
    op_cuda_ok(cudaMalloc(&d, bytes ? bytes : 16), label, "cudaMalloc");
    return d;
}

void *op_dev_copy_of(const void *h, size_t bytes, const char *label)
{
    void *d = op_dev_alloc(bytes, label);
    if (bytes) op_cuda_ok(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), label, "upload");
    return d;
}

static void *host_copy_of(const void *d, size_t bytes, const char *label)
{
    void *h = malloc(bytes ? bytes : 16);
    assert_non_null(h);
    if (bytes) op_cuda_ok(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), label, "download");
    return h;
}

static float *random_floats(int64_t n, float lo, float hi)
{
    float *a = malloc(sizeof(float) * (size_t)(n ? n : 1));
    assert_non_null(a);
    for (int64_t i = 0; i < n; i++) a[i] = uniform(lo, hi);
    return a;
}

/* Host data for input k: given, the initializer's, or random floats. */
static void *input_data(const struct gp_graph *g, const struct gp_value *v, const struct op_compare *o,
                        int k, float lo, float hi)
{
    int64_t n = gp_shape_numel(&v->shape);
    size_t bytes = (size_t)n * esize(v->dtype);
    void *h = malloc(bytes ? bytes : 16);
    assert_non_null(h);
    if (k < MAX_IO && o->inputs[k]) {
        memcpy(h, o->inputs[k], bytes);
    } else if (v->constant) {
        if (gp_dtype_is_float(v->dtype))
            for (int64_t e = 0; e < n; e++) ((float *)h)[e] = (float)gp_tensor_get_f64(v->constant, e);
        else
            memcpy(h, v->constant->data, bytes);
    } else if (gp_dtype_is_float(v->dtype)) {
        for (int64_t e = 0; e < n; e++) ((float *)h)[e] = uniform(lo, hi);
    } else if (o->index_bound > 0 && v->dtype == GP_DTYPE_BOOL) {
        for (int64_t e = 0; e < n; e++) ((uint8_t *)h)[e] = uniform(0, 1) < 0.5f;
    } else if (o->index_bound > 0 && (v->dtype == GP_DTYPE_INT64 || v->dtype == GP_DTYPE_INT32)) {
        for (int64_t e = 0; e < n; e++) {
            int64_t x = (int64_t)uniform(0, (float)o->index_bound);
            if (v->dtype == GP_DTYPE_INT64) ((int64_t *)h)[e] = x;
            else ((int32_t *)h)[e] = (int32_t)x;
        }
    } else {
        fail_msg("%s: input %d ('%s') is %s and not an initializer: give its data", o->label, k, v->name,
                 gp_dtype_name(v->dtype));
    }
    (void)g;
    return h;
}

/* ---- bfloat16 on the host (graph/tensor.h's conversions, to nearest even) ---- */

static float round_bf16(float v) { return gp_bf16_to_float(gp_float_to_bf16(v)); }

static void round_all_bf16(float *a, int64_t n)
{
    for (int64_t i = 0; i < n; i++) a[i] = round_bf16(a[i]);
}

static bool bit(uint32_t mask, int k) { return k < 32 && ((mask >> k) & 1); }

/* Device memory holding n floats as bfloat16 (b16) or float32. */
static void *upload_floats(const float *h, int64_t n, bool b16, const char *label)
{
    if (!b16) return op_dev_copy_of(h, sizeof(float) * (size_t)n, label);
    uint16_t *t = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
    assert_non_null(t);
    for (int64_t i = 0; i < n; i++) t[i] = gp_float_to_bf16(h[i]);
    void *d = op_dev_copy_of(t, sizeof(uint16_t) * (size_t)n, label);
    free(t);
    return d;
}

/* n floats stored on the device as bfloat16 (b16) or float32, widened. */
static float *download_floats(const void *d, int64_t n, bool b16, const char *label)
{
    float *h = malloc(sizeof(float) * (size_t)(n ? n : 1));
    assert_non_null(h);
    if (!b16) {
        if (n) op_cuda_ok(cudaMemcpy(h, d, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost), label, "download");
        return h;
    }
    uint16_t *t = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
    assert_non_null(t);
    if (n) op_cuda_ok(cudaMemcpy(t, d, sizeof(uint16_t) * (size_t)n, cudaMemcpyDeviceToHost), label, "download");
    for (int64_t i = 0; i < n; i++) h[i] = gp_bf16_to_float(t[i]);
    free(t);
    return h;
}

/* ---- channels-last on the host (op_compare.h) ---- */

/* A copy of the n = N * C * H * W floats of a tensor of shape [N, C, H, W]
 * (`s`), from [N, C, H, W] to [N, H, W, C] (to_nhwc) or back. */
static float *relayout(const float *a, const struct gp_shape *s, bool to_nhwc)
{
    int64_t N = s->dims[0], C = s->dims[1], H = s->dims[2], W = s->dims[3], n = N * C * H * W;
    float *r = malloc(sizeof(float) * (size_t)(n ? n : 1));
    assert_non_null(r);
    for (int64_t b = 0; b < N; b++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t w = 0; w < W; w++) {
                    int64_t nchw = ((b * C + c) * H + h) * W + w, nhwc = ((b * H + h) * W + w) * C + c;
                    if (to_nhwc) r[nhwc] = a[nchw];
                    else r[nchw] = a[nhwc];
                }
    return r;
}

/* upload_floats of [N, C, H, W] host data, laid out [N, H, W, C] on the
 * device when nhwc (shape `s`). */
static void *upload_as(const float *h, int64_t n, bool b16, bool nhwc, const struct gp_shape *s, const char *label)
{
    if (!nhwc) return upload_floats(h, n, b16, label);
    float *t = relayout(h, s, true);
    void *d = upload_floats(t, n, b16, label);
    free(t);
    return d;
}

/* download_floats, back to [N, C, H, W] when the device holds [N, H, W, C]. */
static float *download_as(const void *d, int64_t n, bool b16, bool nhwc, const struct gp_shape *s,
                          const char *label)
{
    float *h = download_floats(d, n, b16, label);
    if (!nhwc) return h;
    float *r = relayout(h, s, false);
    free(h);
    return r;
}

/* A tensor's tolerance: |gpu - cpu| <= rel |cpu| + rms_rel rms(cpu) + abs_tol
 * (rms_rel 0 outside bf16). */
static void compare_floats(const char *label, const char *tensor, int index, const float *gpu,
                           const float *cpu, int64_t n, double rel, double abs_tol, bool scaled,
                           double rms_rel)
{
    if (scaled) {
        double big = 1;
        for (int64_t i = 0; i < n; i++)
            if (fabs((double)cpu[i]) > big && isfinite(cpu[i])) big = fabs((double)cpu[i]);
        abs_tol *= big;
    }
    if (rms_rel > 0) {
        double ss = 0;
        int64_t count = 0;
        for (int64_t i = 0; i < n; i++)
            if (isfinite(cpu[i])) ss += (double)cpu[i] * (double)cpu[i], count++;
        abs_tol += rms_rel * (count ? sqrt(ss / (double)count) : 0.0);
    }
    /* Every element is checked: how many are off tells a few sign or
     * rounding disagreements from a wrong kernel. */
    int64_t off = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
        float gv = gpu[i], cv = cpu[i];
        if ((isnan(cv) && isnan(gv)) || gv == cv) continue; /* equal infinities too */
        double diff = fabs((double)gv - (double)cv);
        if (!(diff <= rel * fabs((double)cv) + abs_tol)) {
            if (first < 0) first = i;
            off++;
        }
    }
    if (off)
        fail_msg("%s: %s %d, %lld of %lld elements off; the first, element %lld: cuda %.9g, cpu %.9g "
                 "(difference %.3g)", label, tensor, index, (long long)off, (long long)n, (long long)first,
                 (double)gpu[first], (double)cpu[first], fabs((double)gpu[first] - (double)cpu[first]));
}

static void compare_exact(const char *label, const char *tensor, int index, const void *gpu,
                          const void *cpu, int64_t n, size_t es)
{
    for (int64_t i = 0; i < n; i++)
        if (memcmp((const char *)gpu + i * es, (const char *)cpu + i * es, es) != 0)
            fail_msg("%s: %s %d, element %lld of %lld differs (integer output)", label, tensor, index,
                     (long long)i, (long long)n);
}

static bool nondiff(const struct gp_node *n, int k)
{
    return k < 32 && ((n->def->nondiff_inputs >> k) & 1);
}

void op_compare_node(const struct gp_graph *g, int node_index, const struct op_compare *o)
{
    const struct gp_node *node = &g->nodes[node_index];
    const char *label = o->label ? o->label : node->op_type;
    double rel = o->rel_tol > 0 ? o->rel_tol : 1e-5, abs_tol = o->abs_tol > 0 ? o->abs_tol : 1e-6;
    bool b16 = o->bf16;
    /* bf16 bounds (op_compare.h): of |ref| and of rms(ref), for bfloat16 and
     * for float32 tensors. */
    const double r_bf16 = 1.0 / 128 + 1.0 / 512, rms_bf16 = 1.0 / 128, r_f32 = 1.0 / 256;
    float lo = o->lo, hi = o->hi;
    if (lo == 0 && hi == 0) lo = -2, hi = 2;
    int ni = node->n_inputs, no = node->n_outputs;
    if (ni > MAX_IO || no > MAX_IO) fail_msg("%s: too many inputs or outputs for the harness", label);
    if (o->seed) rng_state = o->seed;
    if (o->got_dx)
        for (int k = 0; k < ni; k++) o->got_dx[k] = NULL;

    const struct gp_cpu_kernel *ck = gp_cpu_kernel_for_f32(node);
    const struct gp_cuda_kernel *gk = gp_cuda_kernel_for(node);
    if (!ck) fail_msg("%s: no CPU kernel for %s", label, node->op_type);
    if (!gk) fail_msg("%s: no CUDA kernel for %s", label, node->op_type);
    bool backward = !o->forward_only && ck->backward;
    if (backward && !gk->backward) fail_msg("%s: the CUDA kernel has no backward", label);
    if (b16 && !gk->bf16 && !gk->bf16_any) fail_msg("%s: the CUDA kernel does not read bfloat16", label);
    /* Channels-last: only rank-4 float tensors, and only for a call the
     * kernel says it reads as it lies (or a layout-neutral op's). */
    uint32_t lin = o->nhwc_inputs, lout = o->nhwc_outputs;
    for (int k = 0; k < 32; k++) {
        const struct gp_value *v = bit(lin, k) ? gp_node_input(g, node, k) : NULL;
        if (bit(lin, k) && (!v || v->shape.rank != 4 || !gp_dtype_is_float(v->dtype)))
            fail_msg("%s: nhwc_inputs names input %d, which is not a rank-4 float tensor", label, k);
        v = bit(lout, k) ? gp_node_output(g, node, k) : NULL;
        if (bit(lout, k) && (!v || v->shape.rank != 4 || !gp_dtype_is_float(v->dtype)))
            fail_msg("%s: nhwc_outputs names output %d, which is not a rank-4 float tensor", label, k);
    }
    if (lin || lout) {
        if (gk->layout_native) {
            if (!gk->layout_native(g, node, lin, lout, false))
                fail_msg("%s: the CUDA kernel's layout_native refuses forward with inputs 0x%x and outputs 0x%x "
                         "channels-last (the executor would hand it [N, C, H, W] copies)",
                         label, (unsigned)lin, (unsigned)lout);
            if (backward && !gk->layout_native(g, node, lin, lout, true))
                fail_msg("%s: the CUDA kernel's layout_native refuses backward with inputs 0x%x and outputs 0x%x "
                         "channels-last (the executor would hand it [N, C, H, W] copies)",
                         label, (unsigned)lin, (unsigned)lout);
        } else if (!gp_layout_neutral_call(g, node, lin, lout)) {
            fail_msg("%s: inputs 0x%x and outputs 0x%x channels-last, but the CUDA kernel has no layout_native "
                     "and the op is not layout-neutral for the call",
                     label, (unsigned)lin, (unsigned)lout);
        }
    }

    /* Host data, shared by both sides. */
    void *hx[MAX_IO] = {0};
    int64_t nx[MAX_IO] = {0}, ny[MAX_IO] = {0};
    /* Storage on the CUDA side (bf16: op_compare.h), and what is bfloat16. */
    enum gp_dtype in_dt[MAX_IO + 1], out_dt[MAX_IO + 1], din_dt[MAX_IO + 1], dout_dt[MAX_IO + 1];
    bool x16[MAX_IO] = {0}, y16[MAX_IO] = {0}, dx16[MAX_IO] = {0};
    for (int k = 0; k <= MAX_IO; k++) in_dt[k] = out_dt[k] = din_dt[k] = dout_dt[k] = GP_DTYPE_FLOAT32;
    for (int k = 0; k < ni; k++) {
        if (node->inputs[k] < 0) continue;
        const struct gp_value *v = &g->values[node->inputs[k]];
        nx[k] = gp_shape_numel(&v->shape);
        hx[k] = input_data(g, v, o, k, lo, hi);
        bool fl = gp_dtype_is_float(v->dtype);
        x16[k] = b16 && fl && !bit(o->f32_inputs, k);
        dx16[k] = b16 && fl && !bit(o->params, k);
        in_dt[k] = !fl ? v->dtype : x16[k] ? GP_DTYPE_BFLOAT16 : GP_DTYPE_FLOAT32;
        din_dt[k] = dx16[k] ? GP_DTYPE_BFLOAT16 : GP_DTYPE_FLOAT32;
        if (b16 && fl) round_all_bf16(hx[k], nx[k]);
    }
    float *hdy[MAX_IO] = {0}, *hd0[MAX_IO] = {0};
    bool want_dx[MAX_IO] = {0};
    for (int k = 0; k < no; k++) {
        if (node->outputs[k] < 0) continue;
        const struct gp_value *v = &g->values[node->outputs[k]];
        ny[k] = gp_shape_numel(&v->shape);
        bool fl = gp_dtype_is_float(v->dtype);
        y16[k] = b16 && fl && !bit(o->f32_outputs, k);
        out_dt[k] = !fl ? v->dtype : y16[k] ? GP_DTYPE_BFLOAT16 : GP_DTYPE_FLOAT32;
        dout_dt[k] = b16 && fl ? GP_DTYPE_BFLOAT16 : GP_DTYPE_FLOAT32;
        if (fl) hdy[k] = random_floats(ny[k], -1, 1);
        if (b16 && fl) round_all_bf16(hdy[k], ny[k]);
    }
    for (int k = 0; k < ni; k++) {
        if (node->inputs[k] < 0) continue;
        const struct gp_value *v = &g->values[node->inputs[k]];
        want_dx[k] = backward && gp_dtype_is_float(v->dtype) && !nondiff(node, k);
        if (want_dx[k]) hd0[k] = bit(o->overwrite | o->zero_grads, k) ? calloc((size_t)(nx[k] ? nx[k] : 1), sizeof(float))
                                                        : random_floats(nx[k], -1, 1);
        if (want_dx[k] && dx16[k]) round_all_bf16(hd0[k], nx[k]);
    }
    uint64_t seed = 1234, step = 7;
    int64_t sample_offset = 3;

    /* ---- CPU ---- */
    void *cin[MAX_IO + 1] = {0}, *cout[MAX_IO + 1] = {0};
    real *cdin[MAX_IO + 1] = {0}, *cdout[MAX_IO + 1] = {0};
    for (int k = 0; k < ni; k++) {
        /* The CPU's own copy: a kernel may update an input in place
         * (running statistics), and CUDA must start from the same data. */
        if (hx[k]) {
            const struct gp_value *v = &g->values[node->inputs[k]];
            size_t bytes = (size_t)nx[k] * esize(v->dtype);
            cin[k] = malloc(bytes ? bytes : 16);
            assert_non_null(cin[k]);
            memcpy(cin[k], hx[k], bytes);
        }
        if (want_dx[k]) {
            cdin[k] = malloc(sizeof(float) * (size_t)(nx[k] ? nx[k] : 1));
            assert_non_null(cdin[k]);
            memcpy(cdin[k], hd0[k], sizeof(float) * (size_t)nx[k]);
        }
    }
    for (int k = 0; k < no; k++) {
        if (node->outputs[k] < 0) continue;
        const struct gp_value *v = &g->values[node->outputs[k]];
        cout[k] = calloc((size_t)(ny[k] ? ny[k] : 1), esize(v->dtype));
        assert_non_null(cout[k]);
        if (hdy[k]) {
            cdout[k] = malloc(sizeof(float) * (size_t)(ny[k] ? ny[k] : 1));
            assert_non_null(cdout[k]);
            memcpy(cdout[k], hdy[k], sizeof(float) * (size_t)ny[k]);
        }
    }
    size_t c_saved = ck->saved_bytes ? ck->saved_bytes(g, node) : 0;
    size_t c_scratch = ck->scratch_bytes ? ck->scratch_bytes(g, node) : 0;
    void *csaved = calloc(1, c_saved + 64), *cscratch = calloc(1, c_scratch + 64);
    assert_non_null(csaved);
    assert_non_null(cscratch);
    struct gp_cpu_ctx cc = {.graph = g, .node = node, .in = cin, .out = cout, .din = cdin, .dout = cdout,
                            .saved = csaved, .scratch = cscratch, .training = !o->eval,
                            .update_state = !o->eval, .seed = seed, .step = step,
                            .sample_offset = sample_offset, .dropout_ratio = -1,
                            /* bf16: how the CUDA side stores each output, as the
                             * executor tells both backends (a fused residual is
                             * added to the normalized value rounded as stored). */
                            .stored_out_dt = b16 ? out_dt : NULL};
    struct gp_error err = {0};
    /* Running statistics move on forward: each side starts from the same
     * initializer data (its own copy). */
    if (ck->forward(&cc, &err) != GP_OK) fail_msg("%s: CPU forward: %s", label, err.msg);
    /* bf16: the backward reads each output as the CUDA side stores it
     * (rounded), as the executor's staged float32 kernels do. */
    for (int k = 0; k < no && b16; k++)
        if (node->outputs[k] >= 0 && y16[k]) round_all_bf16(cout[k], ny[k]);
    if (backward && ck->backward(&cc, &err) != GP_OK) fail_msg("%s: CPU backward: %s", label, err.msg);

    /* ---- CUDA ---- */
    cudaStream_t stream;
    /* A blocking stream: the uploads and poison fills before a launch are
     * plain cudaMemcpy / cudaMemset on the legacy default stream, which a
     * non-blocking stream does not wait for (a fill could land after the
     * kernel's writes: seen under compute-sanitizer, which slows the host). */
    op_cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamDefault), label, "cudaStreamCreate");
    struct gp_cuda_libs libs;
    if (gp_cuda_libs_create(stream, o->tf32, NULL, &libs, &err) != GP_OK) fail_msg("%s: %s", label, err.msg);
    void *gin[MAX_IO + 1] = {0}, *gout[MAX_IO + 1] = {0};
    float *gdin[MAX_IO + 1] = {0}, *gdout[MAX_IO + 1] = {0};
    for (int k = 0; k < ni; k++) {
        if (node->inputs[k] < 0) continue;
        const struct gp_value *v = &g->values[node->inputs[k]];
        bool nhwc = bit(lin, k);
        if (gp_dtype_is_float(v->dtype))
            gin[k] = upload_as(hx[k], nx[k], x16[k], nhwc, &v->shape, label);
        else
            gin[k] = op_dev_copy_of(hx[k], (size_t)nx[k] * esize(v->dtype), label);
        if (want_dx[k]) gdin[k] = upload_as(hd0[k], nx[k], dx16[k], nhwc, &v->shape, label);
        if (want_dx[k] && bit(o->overwrite, k)) /* NaN: a read or an unwritten element fails */
            op_cuda_ok(cudaMemset(gdin[k], 0xff, (size_t)nx[k] * (dx16[k] ? 2 : 4)), label, "cudaMemset");
    }
    for (int k = 0; k < no; k++) {
        if (node->outputs[k] < 0) continue;
        const struct gp_value *v = &g->values[node->outputs[k]];
        size_t bytes = (size_t)ny[k] * (y16[k] ? sizeof(uint16_t) : esize(v->dtype));
        gout[k] = op_dev_alloc(bytes, label);
        /* Poison: NaN for floats (float32 and bfloat16), 0xa5 bytes for integers. */
        op_cuda_ok(cudaMemset(gout[k], gp_dtype_is_float(v->dtype) ? 0xff : 0xa5, bytes ? bytes : 16), label,
                "cudaMemset");
        if (hdy[k]) gdout[k] = upload_as(hdy[k], ny[k], b16, bit(lout, k), &v->shape, label);
    }
    /* The workspace the planner gives the node in this mode (convolutions:
     * exactly the mode's; other kernels their scratch_bytes). */
    struct gp_compute_options copts = {
        .precision = b16 ? GP_PRECISION_BF16 : o->tf32 ? GP_PRECISION_TF32 : GP_PRECISION_FP32,
        .fast_conv = o->fast_conv};
    size_t g_saved = gk->saved_bytes ? gk->saved_bytes(g, node) : 0;
    /* The planner reads the layouts from the graph's tags (a convolution
     * plans buffers for what it relays): tag the values the masks name
     * while it plans, as the layout pass would have. */
    struct gp_graph *tg = (struct gp_graph *)g;
    bool was_in[OP_COMPARE_MAX_INPUTS] = {0}, was_out[OP_COMPARE_MAX_INPUTS] = {0};
    for (int k = 0; k < node->n_inputs && k < OP_COMPARE_MAX_INPUTS; k++)
        if (node->inputs[k] >= 0) {
            was_in[k] = tg->values[node->inputs[k]].channels_last;
            if (bit(lin, k)) tg->values[node->inputs[k]].channels_last = true;
        }
    for (int k = 0; k < node->n_outputs && k < OP_COMPARE_MAX_INPUTS; k++)
        if (node->outputs[k] >= 0) {
            was_out[k] = tg->values[node->outputs[k]].channels_last;
            if (bit(lout, k)) tg->values[node->outputs[k]].channels_last = true;
        }
    size_t g_scratch = gp_cuda_conv_scratch_bytes(g, node, &copts, ~0u);
    for (int k = 0; k < node->n_inputs && k < OP_COMPARE_MAX_INPUTS; k++)
        if (node->inputs[k] >= 0) tg->values[node->inputs[k]].channels_last = was_in[k];
    for (int k = 0; k < node->n_outputs && k < OP_COMPARE_MAX_INPUTS; k++)
        if (node->outputs[k] >= 0) tg->values[node->outputs[k]].channels_last = was_out[k];
    void *gsaved = op_dev_alloc(g_saved + 64, label), *gscratch = op_dev_alloc(g_scratch + 64, label);
    op_cuda_ok(cudaMemset(gscratch, 0xff, g_scratch + 64), label, "cudaMemset"); /* undefined contents */
    struct gp_cuda_ctx gc = {.graph = g, .node = node, .in = gin, .out = gout, .din = gdin, .dout = gdout,
                             .in_dt = b16 ? in_dt : NULL, .out_dt = b16 ? out_dt : NULL,
                             .din_dt = b16 ? din_dt : NULL, .dout_dt = b16 ? dout_dt : NULL,
                             .in_nhwc = lin, .out_nhwc = lout, .held_grad_nhwc = o->held_grads,
                             .din_overwrite = o->overwrite,
                             .saved = gsaved, .scratch = gscratch, .stream = stream,
                             .cublas = libs.cublas, .cublas_workspace = libs.cublas_workspace,
                             .cudnn = libs.cudnn, .tf32 = o->tf32,
                             .fast_conv = o->fast_conv,
                             .training = !o->eval, .update_state = !o->eval, .seed = seed, .step = step,
                             .sample_offset = sample_offset, .dropout_ratio = -1};
    /* twice: the bytes of every input and input gradient before the
     * first run (inputs are updated in place, gradients added to), to
     * start the second from; the first run's results, to compare with. */
    size_t in_bytes[MAX_IO + 1] = {0}, y_bytes[MAX_IO + 1] = {0}, dx_bytes[MAX_IO + 1] = {0};
    void *in0[MAX_IO + 1] = {0}, *dx0[MAX_IO + 1] = {0};
    void *in1[MAX_IO + 1] = {0}, *y1[MAX_IO + 1] = {0}, *dx1[MAX_IO + 1] = {0};
    for (int k = 0; k < ni && o->twice; k++) {
        if (!gin[k]) continue;
        in_bytes[k] = (size_t)nx[k] * (x16[k] ? 2 : esize(g->values[node->inputs[k]].dtype));
        in0[k] = host_copy_of(gin[k], in_bytes[k], label);
        if (!gdin[k]) continue;
        dx_bytes[k] = (size_t)nx[k] * (dx16[k] ? 2 : 4);
        dx0[k] = host_copy_of(gdin[k], dx_bytes[k], label);
    }
    for (int k = 0; k < no && o->twice; k++)
        if (gout[k]) y_bytes[k] = (size_t)ny[k] * (y16[k] ? 2 : esize(g->values[node->outputs[k]].dtype));
    for (int run = 0; run < (o->twice ? 2 : 1); run++) {
        if (run == 1) {
            for (int k = 0; k < ni; k++) {
                if (in0[k]) {
                    in1[k] = host_copy_of(gin[k], in_bytes[k], label);
                    op_cuda_ok(cudaMemcpy(gin[k], in0[k], in_bytes[k], cudaMemcpyHostToDevice), label, "upload");
                }
                if (dx0[k]) {
                    dx1[k] = host_copy_of(gdin[k], dx_bytes[k], label);
                    op_cuda_ok(cudaMemcpy(gdin[k], dx0[k], dx_bytes[k], cudaMemcpyHostToDevice), label, "upload");
                }
            }
            for (int k = 0; k < no; k++)
                if (y_bytes[k]) {
                    y1[k] = host_copy_of(gout[k], y_bytes[k], label);
                    op_cuda_ok(cudaMemset(gout[k], 0xff, y_bytes[k]), label, "cudaMemset");
                }
            op_cuda_ok(cudaMemset(gscratch, 0xff, g_scratch + 64), label, "cudaMemset");
        }
        if (gk->forward(&gc, &err) != GP_OK) fail_msg("%s: CUDA forward: %s", label, err.msg);
        op_cuda_ok(cudaStreamSynchronize(stream), label, "CUDA forward");
        if (backward) {
            if (gk->backward(&gc, &err) != GP_OK) fail_msg("%s: CUDA backward: %s", label, err.msg);
            op_cuda_ok(cudaStreamSynchronize(stream), label, "CUDA backward");
        }
    }
    for (int k = 0; k < ni; k++) {
        if (in1[k]) {
            void *h = host_copy_of(gin[k], in_bytes[k], label);
            if (memcmp(h, in1[k], in_bytes[k]) != 0)
                fail_msg("%s: input %d after the step differs between two runs", label, k);
            free(h);
        }
        if (dx1[k]) {
            void *h = host_copy_of(gdin[k], dx_bytes[k], label);
            if (memcmp(h, dx1[k], dx_bytes[k]) != 0)
                fail_msg("%s: gradient of input %d differs between two runs", label, k);
            free(h);
        }
        free(in0[k]), free(dx0[k]), free(in1[k]), free(dx1[k]);
    }
    for (int k = 0; k < no; k++) {
        if (!y1[k]) continue;
        void *h = host_copy_of(gout[k], y_bytes[k], label);
        if (memcmp(h, y1[k], y_bytes[k]) != 0) fail_msg("%s: output %d differs between two runs", label, k);
        free(h), free(y1[k]);
    }

    /* ---- compare ---- */
    /* bf16: the reference is the CPU's float result rounded where the CUDA
     * side stores bfloat16, within r (|ref| + rms(ref)) + abs_tol. */
    for (int k = 0; k < no; k++) {
        if (node->outputs[k] < 0) continue;
        const struct gp_value *v = &g->values[node->outputs[k]];
        if (gp_dtype_is_float(v->dtype)) {
            float *h = download_as(gout[k], ny[k], y16[k], bit(lout, k), &v->shape, label);
            if (y16[k]) round_all_bf16(cout[k], ny[k]);
            if (b16)
                compare_floats(label, "output", k, h, cout[k], ny[k], y16[k] ? r_bf16 : r_f32, abs_tol,
                               o->scale_abs_tol, y16[k] ? rms_bf16 : r_f32);
            else
                compare_floats(label, "output", k, h, cout[k], ny[k], rel, abs_tol, o->scale_abs_tol, 0);
            free(h);
        } else {
            void *h = host_copy_of(gout[k], (size_t)ny[k] * esize(v->dtype), label);
            compare_exact(label, "output", k, h, cout[k], ny[k], esize(v->dtype));
            free(h);
        }
    }
    for (int k = 0; k < ni; k++) {
        if (!want_dx[k]) continue;
        float *h = download_as(gdin[k], nx[k], dx16[k], bit(lin, k), &g->values[node->inputs[k]].shape, label);
        if (dx16[k]) round_all_bf16(cdin[k], nx[k]);
        if (b16)
            compare_floats(label, "gradient of input", k, h, cdin[k], nx[k], dx16[k] ? r_bf16 : r_f32, abs_tol,
                           o->scale_abs_tol, dx16[k] ? rms_bf16 : r_f32);
        else
            compare_floats(label, "gradient of input", k, h, cdin[k], nx[k], rel, abs_tol, o->scale_abs_tol, 0);
        if (o->got_dx) o->got_dx[k] = h;
        else free(h);
    }
    /* Inputs a kernel updates in place (running statistics) end equal too. */
    for (int k = 0; k < ni; k++) {
        if (node->inputs[k] < 0) continue;
        const struct gp_value *v = &g->values[node->inputs[k]];
        if (!gp_dtype_is_float(v->dtype)) continue;
        float *h = download_as(gin[k], nx[k], x16[k], bit(lin, k), &v->shape, label);
        if (x16[k]) round_all_bf16(cin[k], nx[k]);
        if (b16)
            compare_floats(label, "input (after the step)", k, h, cin[k], nx[k], x16[k] ? r_bf16 : r_f32,
                           abs_tol, o->scale_abs_tol, x16[k] ? rms_bf16 : r_f32);
        else
            compare_floats(label, "input (after the step)", k, h, cin[k], nx[k], rel, abs_tol, o->scale_abs_tol,
                           0);
        free(h);
    }

    gp_cuda_libs_destroy(&libs);
    cudaStreamDestroy(stream);
    for (int k = 0; k < MAX_IO; k++) {
        cudaFree(gin[k]);
        cudaFree(gdin[k]);
        cudaFree(gout[k]);
        cudaFree(gdout[k]);
        free(hx[k]);
        free(hdy[k]);
        free(hd0[k]);
        free(cdin[k]);
        free(cin[k]);
        free(cout[k]);
        free(cdout[k]);
    }
    cudaFree(gsaved);
    cudaFree(gscratch);
    free(csaved);
    free(cscratch);
    n_cases++;
    note_op(node->op_type);
}
