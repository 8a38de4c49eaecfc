/* Losses against PyTorch 1.13 (values pasted from F.cross_entropy and
 * F.mse_loss runs, see the comments), against finite differences, and the
 * micro-batch contract: sums over micro-batches / denominator == the mean. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/loss.h"

static struct gp_shape shp(int rank, ...)
{
    struct gp_shape s = {.rank = rank};
    va_list ap;
    va_start(ap, rank);
    for (int i = 0; i < rank; i++) s.dims[i] = va_arg(ap, int);
    va_end(ap);
    return s;
}

/* PyTorch computes the softmax in float32 and we in double: gradients agree
 * to a few float32 ulps of the value. */
static void assert_close_f(const float *got, const float *want, int n, double rel, const char *what)
{
    for (int i = 0; i < n; i++) {
        double tol = rel * fabs((double)want[i]) + 1e-9;
        if (fabs((double)got[i] - (double)want[i]) > tol)
            fail_msg("%s[%d]: got %a (%.9g), want %a (%.9g)", what, i, got[i], got[i], want[i], want[i]);
    }
}

/* ---- cross-entropy against PyTorch ----
 * torch.manual_seed(3); logits = round(randn * 2, 3 decimals);
 * loss_sum = F.cross_entropy(x.double(), y, reduction='sum')
 * grad     = x.grad after F.cross_entropy(x, y).backward() (mean, float32) */

static const float ce_x[20] = {
    -0.152999997f, 0.720000029f, -1.56400001f, 0.143000007f, 2.09200001f,
    1.04400003f, -0.333999991f, 0.105999999f, 0.809000015f, 1.22300005f,
    1.52100003f, -0.0670000017f, 1.99600005f, 0.917999983f, 4.87300014f,
    -0.294f, 0.970000029f, 0.409999996f, 0.676999986f, 2.70600009f};
static const int64_t ce_y[4] = {1, 4, -100, 0};
static const double ce_sum = 6.2832313431798124;
static const float ce_g[20] = {
    0x1.7aa87p-6f, -0x1.1cacbap-2f, 0x1.716ae8p-8f, 0x1.fd1826p-6f, 0x1.bed608p-3f,
    0x1.781dcp-4f, 0x1.7b3fbp-6f, 0x1.266e62p-5f, 0x1.2958b4p-4f, -0x1.c9beccp-3f,
    0.0f, 0.0f, 0.0f, 0.0f, 0.0f,
    -0x1.49adc4p-2f, 0x1.4a040ap-5f, 0x1.79041cp-6f, 0x1.ec65eep-6f, 0x1.d42d46p-3f};

static void test_cross_entropy_nc(void **state)
{
    (void)state;
    struct gp_shape xs = shp(2, 4, 5), ys = shp(1, 4);
    struct gp_error err = {0};
    assert_int_equal(gp_loss_count_targets(ce_y, 4, GP_LOSS_IGNORE_INDEX), 3);
    float g[20];
    double sum = 0;
    int64_t terms = 0;
    assert_int_equal(gp_cross_entropy(ce_x, &xs, ce_y, &ys, GP_CLASS_AXIS_AUTO, GP_LOSS_IGNORE_INDEX, 3.0,
                                      g, &sum, &terms, &err),
                     GP_OK);
    assert_int_equal(terms, 3);
    assert_true(fabs(sum - ce_sum) < 1e-12 * ce_sum);
    assert_close_f(g, ce_g, 20, 2e-6, "grad");
    for (int i = 10; i < 15; i++) assert_true(g[i] == 0.0f); /* the ignored row */

    /* the loss alone */
    double sum_only = 0;
    assert_int_equal(gp_cross_entropy(ce_x, &xs, ce_y, &ys, 1, GP_LOSS_IGNORE_INDEX, 3.0, NULL, &sum_only,
                                      NULL, &err),
                     GP_OK);
    assert_true(sum_only == sum);
}

/* [N, T, C] with labels [N, T]: PyTorch reference computed on the
 * flattened [N*T, C] view, which is what language models do. */
static void test_cross_entropy_language_model(void **state)
{
    (void)state;
    static const float x[24] = {
        0.074000001f, -0.135000005f, 0.85799998f, -1.73599994f, -2.39299989f, 2.05599999f,
        0.143999994f, -0.368999988f, 0.405999988f, -0.409000009f, -0.824000001f, 1.375f,
        -0.150000006f, -0.847000003f, 0.842999995f, -0.514999986f, -3.90799999f, -2.44300008f,
        -0.661000013f, -0.848999977f, 1.02499998f, -0.0399999991f, -2.24300003f, -0.977999985f};
    static const int64_t y[6] = {3, 0, -100, 1, 1, 2};
    static const float want[24] = {
        0x1.89592ap-5f, 0x1.3f2936p-5f, 0x1.aec24p-4f, -0x1.8981bap-3f, -0x1.95c358p-3f,
        0x1.4837aep-3f, 0x1.840b36p-6f, 0x1.d0a424p-7f, 0.0f, 0.0f, 0.0f, 0.0f,
        0x1.4ef124p-5f, -0x1.6fe4acp-3f, 0x1.c40ecap-4f, 0x1.d107fap-6f, 0x1.f4c856p-9f,
        -0x1.77bcf8p-3f, 0x1.926552p-4f, 0x1.4d6e5ap-4f, 0x1.0ddffap-3f, 0x1.742232p-5f,
        -0x1.8f528ep-3f, 0x1.235044p-6f};
    struct gp_shape xs = shp(3, 2, 3, 4), ys = shp(2, 2, 3);
    struct gp_error err = {0};
    int axis = -1;
    assert_int_equal(gp_loss_class_axis(&xs, &ys, GP_CLASS_AXIS_AUTO, &axis, &err), GP_OK);
    assert_int_equal(axis, 2);
    float g[24];
    double sum;
    assert_int_equal(gp_cross_entropy(x, &xs, y, &ys, GP_CLASS_AXIS_AUTO, GP_LOSS_IGNORE_INDEX, 5.0, g,
                                      &sum, NULL, &err),
                     GP_OK);
    assert_true(fabs(sum - 16.369917271267866) < 1e-12 * 16.37);
    assert_close_f(g, want, 24, 2e-6, "grad");
}

/* [N, C, H, W] with labels [N, H, W] (segmentation): class axis 1. */
static const float seg_x[24] = {
    2.27999997f, 4.12099981f, -0.870000005f, 3.54900002f, 0.374000013f, -0.363000005f,
    -0.182999998f, -1.47000003f, 0.786000013f, 1.83700001f, -0.521000028f, 0.101999998f,
    1.32500005f, 1.24600005f, 0.893000007f, 1.53799999f, -2.53299999f, 2.54500008f,
    -2.48399997f, -1.77100003f, 2.33200002f, 1.17299998f, 1.55400002f, 0.808000028f};
static const int64_t seg_y[8] = {0, 2, 1, -100, 2, 2, 0, 1};

static void test_cross_entropy_nchw(void **state)
{
    (void)state;
    static const float want[24] = {
        -0x1.3e052ep-5f, 0x1.06d424p-3f, 0x1.09a602p-5f, 0.0f, 0x1.fad6bp-7f, 0x1.7bc1f2p-10f,
        -0x1.411f56p-4f, 0.0f, 0x1.7e9f06p-6f, -0x1.09cba8p-3f, 0x1.7898aap-5f, 0.0f,
        0x1.375f1cp-5f, 0x1.a250c6p-6f, -0x1.842eecp-4f, 0x1.815a38p-4f, 0x1.a4adcep-11f,
        0x1.7f58eep-4f, 0x1.ae78c4p-10f, -0x1.1d8752p-3f, -0x1.3df1d8p-5f, -0x1.e7ed2p-4f,
        0x1.7d7508p-4f, 0x1.7368dcp-5f};
    struct gp_shape xs = shp(4, 2, 3, 2, 2), ys = shp(3, 2, 2, 2);
    struct gp_error err = {0};
    float g[24];
    double sum;
    int64_t terms;
    assert_int_equal(gp_cross_entropy(seg_x, &xs, seg_y, &ys, GP_CLASS_AXIS_AUTO, GP_LOSS_IGNORE_INDEX, 7.0,
                                      g, &sum, &terms, &err),
                     GP_OK);
    assert_int_equal(terms, 7);
    assert_true(fabs(sum - 10.431626985886815) < 1e-12 * 10.4);
    assert_close_f(g, want, 24, 2e-6, "grad");
}

/* d(loss_sum)/dx by central differences equals denominator * gradient. */
static void test_cross_entropy_finite_differences(void **state)
{
    (void)state;
    struct gp_shape xs = shp(4, 2, 3, 2, 2), ys = shp(3, 2, 2, 2);
    struct gp_error err = {0};
    const double denom = 2.5;
    float g[24], x[24];
    double sum;
    memcpy(x, seg_x, sizeof x);
    assert_int_equal(gp_cross_entropy(x, &xs, seg_y, &ys, 1, GP_LOSS_IGNORE_INDEX, denom, g, &sum, NULL, &err),
                     GP_OK);
    for (int i = 0; i < 24; i++) {
        float keep = x[i];
        double lp, lm;
        x[i] = keep + 0x1p-10f;
        float up = x[i];
        assert_int_equal(gp_cross_entropy(x, &xs, seg_y, &ys, 1, GP_LOSS_IGNORE_INDEX, denom, NULL, &lp, NULL, &err), GP_OK);
        x[i] = keep - 0x1p-10f;
        float down = x[i];
        assert_int_equal(gp_cross_entropy(x, &xs, seg_y, &ys, 1, GP_LOSS_IGNORE_INDEX, denom, NULL, &lm, NULL, &err), GP_OK);
        x[i] = keep;
        double fd = (lp - lm) / ((double)up - (double)down) / denom;
        if (fabs(fd - g[i]) > 1e-6 + 1e-5 * fabs(fd)) fail_msg("x[%d]: grad %.9g, finite difference %.9g", i, g[i], fd);
    }
}

/* Micro-batches with the mini-batch's denominator add up to the mean. */
/* Logits far beyond exp's range: the maximum is subtracted first, so the
 * loss and gradient stay finite and exact (softmax is one-hot here). */
static void test_extreme_logits(void **state)
{
    (void)state;
    static const float x[6] = {-1000.0f, 0.0f, 1000.0f, 3e38f, -3e38f, 0.0f};
    static const int64_t y[2] = {2, 1};
    struct gp_shape xs = shp(2, 2, 3), ys = shp(1, 2);
    struct gp_error err = {0};
    float g[6];
    double sum;
    assert_int_equal(gp_cross_entropy(x, &xs, y, &ys, GP_CLASS_AXIS_AUTO, GP_LOSS_IGNORE_INDEX, 1.0, g, &sum, NULL, &err), GP_OK);
    /* row 0 adds 1000 - 1000, row 1 adds 3e38 - (-3e38) */
    assert_true(sum == 2.0 * (double)3e38f);
    static const float want[6] = {0.0f, 0.0f, 0.0f, 1.0f, -1.0f, 0.0f};
    assert_memory_equal(g, want, sizeof want);
}

static void test_micro_batches_accumulate_to_the_mean(void **state)
{
    (void)state;
    struct gp_error err = {0};
    struct gp_shape full = shp(2, 4, 5), fy = shp(1, 4), half = shp(2, 2, 5), hy = shp(1, 2);
    const double denom = (double)gp_loss_count_targets(ce_y, 4, GP_LOSS_IGNORE_INDEX);
    float g_full[20], g_mb[20];
    double s_full, s_a, s_b;
    int64_t t_a, t_b;
    assert_int_equal(gp_cross_entropy(ce_x, &full, ce_y, &fy, GP_CLASS_AXIS_AUTO, GP_LOSS_IGNORE_INDEX, denom, g_full, &s_full, NULL, &err), GP_OK);
    assert_int_equal(gp_cross_entropy(ce_x, &half, ce_y, &hy, GP_CLASS_AXIS_AUTO, GP_LOSS_IGNORE_INDEX, denom, g_mb, &s_a, &t_a, &err), GP_OK);
    assert_int_equal(gp_cross_entropy(ce_x + 10, &half, ce_y + 2, &hy, GP_CLASS_AXIS_AUTO, GP_LOSS_IGNORE_INDEX, denom, g_mb + 10, &s_b, &t_b, &err), GP_OK);
    assert_int_equal(t_a + t_b, 3);
    assert_true(fabs((s_a + s_b) / denom - ce_sum / 3.0) < 1e-14);
    assert_memory_equal(g_full, g_mb, sizeof g_full);
}

static void test_labels_out_of_range_are_named(void **state)
{
    (void)state;
    struct gp_shape xs = shp(4, 2, 3, 2, 2), ys = shp(3, 2, 2, 2);
    int64_t y[8];
    memcpy(y, seg_y, sizeof y);
    y[5] = 3; /* position [1, 0, 1] */
    float g[24];
    for (int i = 0; i < 24; i++) g[i] = 42.0f;
    double sum = -1;
    struct gp_error err = {0};
    assert_int_equal(gp_cross_entropy(seg_x, &xs, y, &ys, GP_CLASS_AXIS_AUTO, GP_LOSS_IGNORE_INDEX, 7.0, g, &sum, NULL, &err),
                     GP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "label 3 at position [1, 0, 1]"));
    assert_true(g[0] == 42.0f); /* nothing written */
    y[5] = -1;
    gp_error_clear(&err);
    assert_int_equal(gp_cross_entropy(seg_x, &xs, y, &ys, GP_CLASS_AXIS_AUTO, GP_LOSS_IGNORE_INDEX, 7.0, g, &sum, NULL, &err),
                     GP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "label -1 at position [1, 0, 1]"));
    /* -1 is fine as the ignore index (and -100 then is not) */
    gp_error_clear(&err);
    assert_int_equal(gp_cross_entropy(seg_x, &xs, y, &ys, GP_CLASS_AXIS_AUTO, -1, 7.0, g, &sum, NULL, &err),
                     GP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "label -100 at position [0, 1, 1]"));
    y[3] = -1;
    gp_error_clear(&err);
    assert_int_equal(gp_cross_entropy(seg_x, &xs, y, &ys, GP_CLASS_AXIS_AUTO, -1, 7.0, g, &sum, NULL, &err), GP_OK);
    int64_t correct, counted;
    y[3] = -100;
    y[5] = 17;
    gp_error_clear(&err);
    assert_int_equal(gp_accuracy(seg_x, &xs, y, &ys, GP_CLASS_AXIS_AUTO, GP_LOSS_IGNORE_INDEX, &correct, &counted, &err),
                     GP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "label 17"));
    /* a denominator that is not positive */
    gp_error_clear(&err);
    assert_int_equal(gp_cross_entropy(seg_x, &xs, seg_y, &ys, GP_CLASS_AXIS_AUTO, GP_LOSS_IGNORE_INDEX, 0.0, g, &sum, NULL, &err),
                     GP_ERR_INVALID);
}

static void test_class_axis_inference(void **state)
{
    (void)state;
    struct gp_error err = {0};
    int axis = -7;
    struct gp_shape a = shp(2, 8, 10), al = shp(1, 8);
    assert_int_equal(gp_loss_class_axis(&a, &al, GP_CLASS_AXIS_AUTO, &axis, &err), GP_OK);
    assert_int_equal(axis, 1);
    struct gp_shape b = shp(1, 10), bl = shp(0);
    assert_int_equal(gp_loss_class_axis(&b, &bl, GP_CLASS_AXIS_AUTO, &axis, &err), GP_OK);
    assert_int_equal(axis, 0);
    struct gp_shape c = shp(4, 2, 5, 7, 9), cl = shp(3, 2, 7, 9);
    assert_int_equal(gp_loss_class_axis(&c, &cl, GP_CLASS_AXIS_AUTO, &axis, &err), GP_OK);
    assert_int_equal(axis, 1);
    struct gp_shape d = shp(3, 4, 16, 64), dl = shp(2, 4, 16);
    assert_int_equal(gp_loss_class_axis(&d, &dl, GP_CLASS_AXIS_AUTO, &axis, &err), GP_OK);
    assert_int_equal(axis, 2);
    /* ambiguous: [N, 16, 16] with [N, 16] */
    struct gp_shape e = shp(3, 4, 16, 16), el = shp(2, 4, 16);
    assert_int_equal(gp_loss_class_axis(&e, &el, GP_CLASS_AXIS_AUTO, &axis, &err), GP_ERR_SHAPE);
    assert_non_null(strstr(err.msg, "explicitly"));
    gp_error_clear(&err);
    assert_int_equal(gp_loss_class_axis(&e, &el, -1, &axis, &err), GP_OK);
    assert_int_equal(axis, 2);
    assert_int_equal(gp_loss_class_axis(&e, &el, 1, &axis, &err), GP_OK);
    assert_int_equal(axis, 1);
    /* explicit but wrong, and shapes that fit nothing */
    assert_int_equal(gp_loss_class_axis(&d, &dl, 1, &axis, &err), GP_ERR_SHAPE);
    gp_error_clear(&err);
    struct gp_shape f = shp(2, 4, 10), fl = shp(1, 5);
    assert_int_equal(gp_loss_class_axis(&f, &fl, GP_CLASS_AXIS_AUTO, &axis, &err), GP_ERR_SHAPE);
    gp_error_clear(&err);
    assert_int_equal(gp_loss_class_axis(&f, &f, GP_CLASS_AXIS_AUTO, &axis, &err), GP_ERR_SHAPE);
    assert_non_null(strstr(err.msg, "one dimension fewer"));
}

/* ---- MSE against PyTorch: the gradient is bit-identical ---- */
static void test_mse(void **state)
{
    (void)state;
    static const float p[6] = {-1.35800004f, 1.67799997f, 1.22300005f, 1.35300004f, 0.824999988f, 0.0520000011f};
    static const float t[6] = {-0.0560000017f, 2.92600012f, 7.57800007f, 0.536000013f, 0.80400002f, -1.23000002f};
    /* F.mse_loss(p, t).backward(): the mean over 6 elements */
    static const float want[6] = {-0x1.bc6a8p-2f, -0x1.a9fbecp-2f, -0x1.0f258cp+1f, 0x1.16de8ep-2f, 0x1.cac056p-8f, 0x1.b596ep-2f};
    struct gp_shape s = shp(2, 2, 3), wrong = shp(2, 3, 2);
    struct gp_error err = {0};
    float g[6];
    double sum;
    assert_int_equal(gp_mse_loss(p, t, &s, &s, 6.0, g, &sum, &err), GP_OK);
    assert_true(fabs(sum - 45.950187805778292) < 1e-12 * 46);
    assert_memory_equal(g, want, sizeof want);
    /* finite differences */
    float x[6];
    memcpy(x, p, sizeof x);
    for (int i = 0; i < 6; i++) {
        double lp, lm;
        float keep = x[i];
        x[i] = keep + 0x1p-8f;
        float up = x[i];
        gp_mse_loss(x, t, &s, &s, 6.0, NULL, &lp, &err);
        x[i] = keep - 0x1p-8f;
        float down = x[i];
        gp_mse_loss(x, t, &s, &s, 6.0, NULL, &lm, &err);
        x[i] = keep;
        double fd = (lp - lm) / ((double)up - (double)down) / 6.0;
        assert_true(fabs(fd - g[i]) < 1e-6 * (1 + fabs(fd)));
    }
    assert_int_equal(gp_mse_loss(p, t, &s, &wrong, 6.0, g, &sum, &err), GP_ERR_SHAPE);
    assert_non_null(strstr(err.msg, "[3, 2]"));
}

static void test_output_is_the_loss(void **state)
{
    (void)state;
    static const float out[3] = {0.5f, 2.0f, -1.0f};
    struct gp_shape s = shp(1, 3);
    float g[3];
    double sum;
    struct gp_error err = {0};
    /* three micro-batches of three elements: denominator 9 */
    assert_int_equal(gp_output_loss(out, &s, 9.0, g, &sum, &err), GP_OK);
    assert_true(sum == 1.5);
    for (int i = 0; i < 3; i++) assert_true(g[i] == (float)(1.0 / 9.0));
    struct gp_shape scalar = shp(0);
    assert_int_equal(gp_output_loss(out, &scalar, 4.0, g, &sum, &err), GP_OK);
    assert_true(sum == 0.5 && g[0] == 0.25f);
}

static void test_accuracy(void **state)
{
    (void)state;
    struct gp_error err = {0};
    int64_t correct, counted;
    /* rows' argmax: 4, 4, 4 (ignored), 4 -> labels 1, 4, -, 0: one right */
    struct gp_shape xs = shp(2, 4, 5), ys = shp(1, 4);
    assert_int_equal(gp_accuracy(ce_x, &xs, ce_y, &ys, GP_CLASS_AXIS_AUTO, GP_LOSS_IGNORE_INDEX, &correct, &counted, &err), GP_OK);
    assert_int_equal(counted, 3);
    assert_int_equal(correct, 1);
    static const int64_t y_right[4] = {4, 4, 4, 4};
    assert_int_equal(gp_accuracy(ce_x, &xs, y_right, &ys, GP_CLASS_AXIS_AUTO, GP_LOSS_IGNORE_INDEX, &correct, &counted, &err), GP_OK);
    assert_int_equal(counted, 4);
    assert_int_equal(correct, 4);
    /* ties go to the first maximum; NaN wins like torch.argmax */
    static const float t[8] = {1.0f, 3.0f, 3.0f, 0.0f, 1.0f, NAN, 5.0f, NAN};
    static const int64_t yt[2] = {1, 1};
    struct gp_shape ts = shp(2, 2, 4), tl = shp(1, 2);
    assert_int_equal(gp_accuracy(t, &ts, yt, &tl, GP_CLASS_AXIS_AUTO, GP_LOSS_IGNORE_INDEX, &correct, &counted, &err), GP_OK);
    assert_int_equal(correct, 2);
    /* [N, C, H, W]: class axis 1 */
    struct gp_shape xs3 = shp(4, 2, 3, 2, 2), ys3 = shp(3, 2, 2, 2);
    assert_int_equal(gp_accuracy(seg_x, &xs3, seg_y, &ys3, GP_CLASS_AXIS_AUTO, GP_LOSS_IGNORE_INDEX, &correct, &counted, &err), GP_OK);
    assert_int_equal(counted, 7);
    /* argmax over classes of seg_x per (n, h, w): 0,0,1,0 / 2,1,2,0 vs labels
     * 0,2,1,- / 2,2,0,1 (numpy's argmax(1)) */
    assert_int_equal(correct, 3);
}

/* A batch large enough to run threaded: the same bits with 1 or 4 threads,
 * and rows that match the one-row computation. */
static void test_large_batch_is_deterministic(void **state)
{
    (void)state;
    const int N = 4096, C = 37;
    float *x = malloc(sizeof *x * (size_t)N * C);
    float *g1t = malloc(sizeof *x * (size_t)N * C), *g4t = malloc(sizeof *x * (size_t)N * C);
    int64_t *y = malloc(sizeof *y * (size_t)N);
    unsigned s = 7;
    for (int i = 0; i < N * C; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)((int)(s >> 9) % 20000 - 10000) * 1e-3f;
    }
    for (int i = 0; i < N; i++) y[i] = i % 11 == 0 ? GP_LOSS_IGNORE_INDEX : (i * 7) % C;
    struct gp_shape xs = shp(2, N, C), ys = shp(1, N);
    struct gp_error err = {0};
    double s1, s4;
    int keep = omp_get_max_threads();
    omp_set_num_threads(1);
    assert_int_equal(gp_cross_entropy(x, &xs, y, &ys, GP_CLASS_AXIS_AUTO, GP_LOSS_IGNORE_INDEX, 1000.0, g1t, &s1, NULL, &err), GP_OK);
    omp_set_num_threads(4);
    assert_int_equal(gp_cross_entropy(x, &xs, y, &ys, GP_CLASS_AXIS_AUTO, GP_LOSS_IGNORE_INDEX, 1000.0, g4t, &s4, NULL, &err), GP_OK);
    omp_set_num_threads(keep);
    assert_memory_equal(&s1, &s4, sizeof s1);
    assert_memory_equal(g1t, g4t, sizeof *x * (size_t)N * C);
    double rows = 0;
    struct gp_shape one = shp(2, 1, C), oy = shp(1, 1);
    for (int i = 0; i < N; i++) {
        double r;
        float gr[64];
        assert_int_equal(gp_cross_entropy(x + (size_t)i * C, &one, y + i, &oy, GP_CLASS_AXIS_AUTO, GP_LOSS_IGNORE_INDEX, 1000.0, gr, &r, NULL, &err), GP_OK);
        rows += r;
        assert_memory_equal(gr, g1t + (size_t)i * C, sizeof(float) * C);
    }
    assert_true(fabs(rows - s1) < 1e-10 * fabs(s1));
    free(x);
    free(g1t);
    free(g4t);
    free(y);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cross_entropy_nc),
        cmocka_unit_test(test_cross_entropy_language_model),
        cmocka_unit_test(test_cross_entropy_nchw),
        cmocka_unit_test(test_cross_entropy_finite_differences),
        cmocka_unit_test(test_extreme_logits),
        cmocka_unit_test(test_micro_batches_accumulate_to_the_mean),
        cmocka_unit_test(test_labels_out_of_range_are_named),
        cmocka_unit_test(test_class_axis_inference),
        cmocka_unit_test(test_mse),
        cmocka_unit_test(test_output_is_the_loss),
        cmocka_unit_test(test_accuracy),
        cmocka_unit_test(test_large_batch_is_deterministic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
