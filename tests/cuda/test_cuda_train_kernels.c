/* CUDA training kernels (cuda/train_kernels.h; loss.cu, optim.cu) against
 * their CPU twins:
 *   losses     gp_cross_entropy (class axis 1 strided and contiguous, the
 *              last axis up to GPT-2's 50304 classes, ignored labels, an
 *              ignore index inside [0, C), NaN / inf / -inf logits, loss
 *              only), gp_mse_loss, gp_output_loss: gradients to 1e-6
 *              relative (mse's and the output loss's bit for bit), losses
 *              to 1e-9 relative; on bfloat16 outputs (the same cases, GPT-2's
 *              [16, 1024, 50304] and odd vocabularies, misaligned rows)
 *              BIT-IDENTICAL to the float32 call on a widened copy, its
 *              gradient rounded to bfloat16 (cross-entropy's: within one
 *              bfloat16 ulp, at most 1e-3 of the values off);
 *   fast exp   gp_fast_exp (the losses' exponentials): within 1.05 double
 *              ulps of expl() over [-708, 708] (random, at the reduction's
 *              half-way points, at 0 and at the shortcut's ends), exp()'s
 *              bits outside it (-inf, +inf, NaN, subnormal results, 0,
 *              overflow); float32 gradients rounded from it equal those
 *              rounded from exp() but in rare ties, off by one ulp;
 *   optimizer  gp_optim_step after gp_scale_grads: SGD (plain, momentum,
 *              dampening, nesterov, weight decay) and AdamW (torch 1.13 and
 *              2.x arithmetic, both lerp branches, with and without weight
 *              decay), 3 steps with changing lr, with clip_coef 1 and < 1,
 *              the scalars read from device memory, over enough tensors to
 *              need several launches, aligned and misaligned:
 *              parameters, state and (clipped) gradients BIT-IDENTICAL; a
 *              step marked skip changes none of them;
 *   guard      gp_cuda_optim_guard against gp_optim_guard (the clipping
 *              coefficient from a norm of norms read in a given order, the
 *              skip flag from the losses and the norm): every count of
 *              norms from 0 to 40 and a few hundred, norms spanning
 *              magnitudes, infinities and NaNs: BIT-IDENTICAL;
 *   buffers    gp_cuda_accumulate (bit for bit), gp_cuda_norms (1e-6
 *              relative against double and against gp_norm2_f32);
 *   convert    gp_cuda_convert between float32 and bfloat16, copied and
 *              accumulated, 16-byte runs, their tails and misaligned
 *              pointers, GPT-2's [16, 1024, 50304] logits' gradient: bit
 *              for bit against a loop on the host;
 *   layouts    gp_cuda_relayout and gp_cuda_relayout_channels (between
 *              [n, c, hw] and [n, hw, c], channels padded with zeros and
 *              dropped, float32 and bfloat16, written and accumulated),
 *              and gp_cuda_relayout_many (a stage's filter copies: many
 *              tensors of float32 in launches of 32, both ways, into
 *              float32 or bfloat16, written and accumulated): bit for bit
 *              against a loop on the host.
 * Sizes are odd and large enough that the grid-stride loops wrap.
 *
 * Without a CUDA device the test prints why and exits 77 (a skip). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/convert.h"
#include "backend/cuda/train_kernels.h"
#include "graph/tensor.h"
#include "train/loss.h"
#include "train/optim.h"

static int n_cases;

#define CK(call)                                                                                \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess)                                                                  \
            fail_msg("%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call, cudaGetErrorString(e_),   \
                     cudaGetErrorName(e_));                                                     \
    } while (0)

/* `call` fills the caller's `err` */
#define GP(call)                                                                                \
    do {                                                                                        \
        gp_status st_ = (call);                                                                 \
        if (st_ != GP_OK) fail_msg("%s:%d: %s: %s", __FILE__, __LINE__, #call, err.msg);       \
    } while (0)

/* ---- helpers ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng_next(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static float uniform(void) /* [0, 1) */
{
    return (float)(rng_next() >> 40) * (1.0f / 16777216.0f);
}

static float normalish(void) /* mean 0, sd ~1 */
{
    return (uniform() + uniform() + uniform() + uniform() - 2.0f) * 1.7320508f;
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) fail_msg("out of host memory (%zu bytes)", bytes);
    return p;
}

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    CK(cudaMalloc(&p, bytes ? bytes : 16));
    return p;
}

static void *dev_copy(const void *host, size_t bytes)
{
    void *p = dev_alloc(bytes);
    if (bytes) CK(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    return p;
}

static void to_host(void *host, const void *dev, size_t bytes)
{
    if (bytes) CK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
}

static cudaStream_t new_stream(void)
{
    cudaStream_t s;
    /* A blocking stream: the uploads and poison fills before a launch are
     * plain cudaMemcpy / cudaMemset on the legacy default stream, which a
     * non-blocking stream does not wait for (a fill could land after the
     * kernel's writes: seen under compute-sanitizer, which slows the host). */
    CK(cudaStreamCreateWithFlags(&s, cudaStreamDefault));
    return s;
}

static void sync_stream(cudaStream_t s, const char *what)
{
    cudaError_t e = cudaStreamSynchronize(s);
    if (e != cudaSuccess)
        fail_msg("%s: the kernels failed on the device: %s (%s)", what, cudaGetErrorString(e),
                 cudaGetErrorName(e));
}

static bool close_rel(double got, double want, double rel, double abs_floor)
{
    if (isnan(want) || isnan(got)) return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got)) return got == want;
    return fabs(got - want) <= rel * fabs(want) + abs_floor;
}

/* Gradients: every element close (NaN where the CPU has NaN). */
static void compare_floats(const char *label, const float *got, const float *want, int64_t n, double rel,
                           double abs_floor)
{
    for (int64_t i = 0; i < n; i++)
        if (!close_rel(got[i], want[i], rel, abs_floor))
            fail_msg("%s: element %lld: CUDA %.9g (%a), CPU %.9g (%a), relative tolerance %g", label,
                     (long long)i, (double)got[i], (double)got[i], (double)want[i], (double)want[i], rel);
}

static void compare_bits(const char *label, const float *got, const float *want, int64_t n)
{
    if (memcmp(got, want, sizeof(float) * (size_t)n) == 0) return;
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            fail_msg("%s: element %lld of %lld differs: CUDA %.9g (%a), CPU %.9g (%a)", label, (long long)i,
                     (long long)n, (double)got[i], (double)got[i], (double)want[i], (double)want[i]);
}

static struct gp_shape make_shape(int rank, const int64_t *dims)
{
    struct gp_shape s = {.rank = rank};
    for (int i = 0; i < rank; i++) s.dims[i] = dims[i];
    return s;
}

/* ---- cross-entropy ---- */

/* SP_HOT_MAX (bfloat16 only): every 7th logit -inf, and every other row's
 * label at its maximum */
enum special { SP_NONE, SP_INF_LOGITS, SP_NONFINITE, SP_HOT_MAX };

struct ce_case {
    const char *label;
    int rank;
    int64_t dims[5];
    int axis;
    int64_t ignore_index;
    double ignore_frac;
    float spread; /* logits ~ spread * normal */
    int misalign; /* floats to shift logits and gradient by (scalar path) */
    bool loss_only;
    enum special special;
};

static void run_ce(const struct ce_case *k)
{
    struct gp_shape shape = make_shape(k->rank, k->dims);
    struct gp_shape lshape = {.rank = k->rank - 1};
    for (int i = 0, j = 0; i < k->rank; i++)
        if (i != k->axis) lshape.dims[j++] = k->dims[i];
    const int64_t n = gp_shape_numel(&shape), C = k->dims[k->axis], rows = n / C;
    int64_t S = 1;
    for (int i = k->axis + 1; i < k->rank; i++) S *= k->dims[i];

    float *x = xmalloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = k->spread * normalish();
    int64_t *y = xmalloc(sizeof(int64_t) * (size_t)(rows ? rows : 1));
    for (int64_t r = 0; r < rows; r++) {
        y[r] = (int64_t)(rng_next() % (uint64_t)C);
        if (uniform() < k->ignore_frac) y[r] = k->ignore_index;
    }
    /* a row of very large logits: log-sum-exp must subtract the maximum */
    if (rows > 2) {
        int64_t r = 1, o = r / S, i = r % S;
        for (int64_t c = 0; c < C; c++) x[o * C * S + c * S + i] += 85.0f;
        if (y[r] == k->ignore_index) y[r] = 0;
    }
    if (k->special != SP_NONE) {
        /* row 0: some -inf logits; row 2: all -inf (NaN); row 3: a +inf (NaN);
         * row 4: a NaN; row 5: ignored with a NaN (zero gradient) */
        for (int64_t r = 0; r < rows && r < 6; r++) {
            int64_t o = r / S, i = r % S;
            float *xr = x + o * C * S + i;
            y[r] = r == 5 ? k->ignore_index : (r == 0 ? 1 : 0);
            switch (r) {
            case 0:
                for (int64_t c = 2; c < C; c += 3) xr[c * S] = -INFINITY;
                break;
            case 2:
                if (k->special == SP_NONFINITE)
                    for (int64_t c = 0; c < C; c++) xr[c * S] = -INFINITY;
                break;
            case 3:
                if (k->special == SP_NONFINITE) xr[(C / 2) * S] = INFINITY;
                break;
            case 4:
            case 5:
                if (k->special == SP_NONFINITE) xr[(C - 1) * S] = NAN;
                break;
            default: break;
            }
        }
    }
    const int64_t terms = gp_loss_count_targets(y, rows, k->ignore_index);
    const double den = terms > 0 ? (double)terms * 1.5 : 1.0;

    float *want_g = xmalloc(sizeof(float) * (size_t)n);
    double want_loss = 0;
    int64_t want_terms = 0;
    struct gp_error err = {0};
    GP(gp_cross_entropy(x, &shape, y, &lshape, k->axis, k->ignore_index, den, want_g, &want_loss, &want_terms,
                        &err));
    assert_int_equal(want_terms, terms);

    cudaStream_t st = new_stream();
    const int mis = k->misalign;
    float *dx = dev_alloc(sizeof(float) * (size_t)(n + mis));
    CK(cudaMemcpy(dx + mis, x, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
    int64_t *dy = dev_copy(y, sizeof(int64_t) * (size_t)rows);
    float *dg = dev_alloc(sizeof(float) * (size_t)(n + mis));
    CK(cudaMemset(dg, 0xff, sizeof(float) * (size_t)(n + mis))); /* NaN: every element must be written */
    double *dloss = dev_alloc(sizeof(double));
    void *scratch = dev_alloc(gp_cuda_loss_scratch_bytes(&shape));
    GP(gp_cuda_cross_entropy(st, dx + mis, GP_DTYPE_FLOAT32, &shape, k->axis, dy, k->ignore_index, den,
                             k->loss_only ? NULL : dg + mis, dloss, scratch, &err));
    sync_stream(st, k->label);
    /* twice: the same loss, bit for bit (fixed-order sums) */
    double loss1 = 0, loss2 = 0;
    to_host(&loss1, dloss, sizeof loss1);
    GP(gp_cuda_cross_entropy(st, dx + mis, GP_DTYPE_FLOAT32, &shape, k->axis, dy, k->ignore_index, den,
                             k->loss_only ? NULL : dg + mis, dloss, scratch, &err));
    sync_stream(st, k->label);
    to_host(&loss2, dloss, sizeof loss2);
    if (memcmp(&loss1, &loss2, sizeof loss1) != 0 && !(isnan(loss1) && isnan(loss2)))
        fail_msg("%s: the loss differs between two runs: %.17g and %.17g", k->label, loss1, loss2);

    if (!close_rel(loss1, want_loss, 1e-9, 0))
        fail_msg("%s: loss sum CUDA %.17g, CPU %.17g (relative difference %.3g)", k->label, loss1, want_loss,
                 fabs(loss1 - want_loss) / fabs(want_loss));
    float *got_g = xmalloc(sizeof(float) * (size_t)n);
    if (k->loss_only) {
        to_host(got_g, dg + mis, sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            if (!isnan(got_g[i])) fail_msg("%s: loss only, yet gradient element %lld was written", k->label,
                                           (long long)i);
    } else {
        to_host(got_g, dg + mis, sizeof(float) * (size_t)n);
        char what[200];
        snprintf(what, sizeof what, "%s: dlogits", k->label);
        compare_floats(what, got_g, want_g, n, 1e-6, 1e-37);
    }
    n_cases++;

    CK(cudaFree(dx));
    CK(cudaFree(dy));
    CK(cudaFree(dg));
    CK(cudaFree(dloss));
    CK(cudaFree(scratch));
    CK(cudaStreamDestroy(st));
    free(x);
    free(y);
    free(want_g);
    free(got_g);
}

static void test_cross_entropy(void **state)
{
    (void)state;
    static const struct ce_case cases[] = {
        {"[8,10] axis 1", 2, {8, 10}, 1, GP_LOSS_IGNORE_INDEX, 0.2, 2.0f, 0, false, SP_NONE},
        {"[4,7,5,3] axis 1 (strided, thread per row)", 4, {4, 7, 5, 3}, 1, GP_LOSS_IGNORE_INDEX, 0.2, 3.0f, 0,
         false, SP_NONE},
        {"[2,9,50304] last axis (GPT-2 vocabulary)", 3, {2, 9, 50304}, 2, GP_LOSS_IGNORE_INDEX, 0.2, 4.0f, 0,
         false, SP_NONE},
        {"[2,9,50304] last axis, misaligned (scalar loads)", 3, {2, 9, 50304}, 2, GP_LOSS_IGNORE_INDEX, 0.1,
         4.0f, 1, false, SP_NONE},
        {"[2,300,5] axis 1 (strided, block per row)", 3, {2, 300, 5}, 1, GP_LOSS_IGNORE_INDEX, 0.2, 2.0f, 0,
         false, SP_NONE},
        {"[5000,12] axis 1 (more rows than blocks)", 2, {5000, 12}, 1, GP_LOSS_IGNORE_INDEX, 0.2, 2.0f, 0, false,
         SP_NONE},
        {"[3,5,1001] last axis (odd class count)", 3, {3, 5, 1001}, 2, GP_LOSS_IGNORE_INDEX, 0.2, 2.0f, 0, false,
         SP_NONE},
        {"[1000] axis 0 (one sample)", 1, {1000}, 0, GP_LOSS_IGNORE_INDEX, 0.0, 2.0f, 0, false, SP_NONE},
        {"[2,3,600,1000] axis 1 (1.2M rows: the grid wraps)", 4, {2, 3, 600, 1000}, 1, GP_LOSS_IGNORE_INDEX, 0.1,
         2.0f, 0, false, SP_NONE},
        {"[6,40,40] axis 1, ignore_index 3 (a class)", 3, {6, 40, 40}, 1, 3, 0.0, 2.0f, 0, false, SP_NONE},
        {"[64,2048] axis 1, loss only", 2, {64, 2048}, 1, GP_LOSS_IGNORE_INDEX, 0.2, 2.0f, 0, true, SP_NONE},
        {"[2,8,300] axis 1, all ignored", 3, {2, 8, 300}, 1, GP_LOSS_IGNORE_INDEX, 1.0, 2.0f, 0, false,
         SP_NONE},
        {"[7,36] axis 1, -inf logits", 2, {7, 36}, 1, GP_LOSS_IGNORE_INDEX, 0.0, 2.0f, 0, false,
         SP_INF_LOGITS},
        {"[2,33,3] axis 1 strided, -inf logits", 3, {2, 33, 3}, 1, GP_LOSS_IGNORE_INDEX, 0.0, 2.0f, 0, false,
         SP_INF_LOGITS},
        {"[7,36] axis 1, NaN/inf logits (vector loads)", 2, {7, 36}, 1, GP_LOSS_IGNORE_INDEX, 0.0, 2.0f, 0,
         false, SP_NONFINITE},
        {"[7,33] axis 1, NaN/inf logits (scalar loads)", 2, {7, 33}, 1, GP_LOSS_IGNORE_INDEX, 0.0, 2.0f, 0,
         false, SP_NONFINITE},
        {"[2,33,3] axis 1 strided, NaN/inf logits", 3, {2, 33, 3}, 1, GP_LOSS_IGNORE_INDEX, 0.0, 2.0f, 0, false,
         SP_NONFINITE},
        {"[1,600,7] axis 1 strided block per row, NaN/inf logits", 3, {1, 600, 7}, 1, GP_LOSS_IGNORE_INDEX, 0.0,
         2.0f, 0, false, SP_NONFINITE},
        {"[0,10] axis 1 (empty)", 2, {0, 10}, 1, GP_LOSS_IGNORE_INDEX, 0.0, 2.0f, 0, false, SP_NONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_ce(&cases[i]);

    /* refusals */
    struct gp_error err = {0};
    struct gp_shape s = make_shape(2, (const int64_t[]){4, 5});
    assert_int_equal(gp_cuda_cross_entropy(NULL, NULL, GP_DTYPE_FLOAT32, &s, 2, NULL, -100, 1.0, NULL, (double *)16, (void *)16,
                                           &err),
                     GP_ERR_INVALID);
    err = (struct gp_error){0};
    assert_int_equal(gp_cuda_cross_entropy(NULL, NULL, GP_DTYPE_FLOAT32, &s, 1, NULL, -100, 0.0, NULL, (double *)16, (void *)16,
                                           &err),
                     GP_ERR_INVALID);
    err = (struct gp_error){0};
    assert_int_equal(gp_cuda_cross_entropy(NULL, NULL, GP_DTYPE_INT8, &s, 1, NULL, -100, 1.0, NULL, (double *)16,
                                           (void *)16, &err),
                     GP_ERR_UNSUPPORTED);
}

/* ---- the losses' exponential ---- */

/* test_kernels.cu */
cudaError_t gp_test_fast_exp(const double *d, double *fast, double *ref, size_t n, cudaStream_t s);

static uint64_t dbits(double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static uint32_t fbits(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

/* float32 values one ulp apart (same sign, finite) */
static bool adjacent(float a, float b)
{
    const uint32_t x = fbits(a), y = fbits(b);
    return (x >> 31) == (y >> 31) && (x > y ? x - y : y - x) == 1;
}

static void test_fast_exp(void **state)
{
    (void)state;
    const double ln2_32 = 0.693147180559945309417 / 32;
    static const double specials[] = {
        0.0, -0.0, -INFINITY, INFINITY, NAN, -NAN, -708.0, 708.0, -708.0000000000001, 708.0000000000001,
        -708.39, -708.4, -709.0, -720.0, -744.0, -745.1, -746.0, -800.0, -1e300, -DBL_MAX, 709.7, 710.0,
        1e300, -DBL_MIN, -4.9e-324, 4.9e-324, -1e-20, -0x1p-58, -0x1p-57, -1e-300,
    };
    const size_t ns = sizeof specials / sizeof specials[0], nr = 1u << 21, n = ns + nr;
    double *d = xmalloc(sizeof(double) * n), *fast = xmalloc(sizeof(double) * n),
           *ref = xmalloc(sizeof(double) * n);
    memcpy(d, specials, sizeof specials);
    for (size_t i = ns; i < n; i++) {
        const double u = (double)(rng_next() >> 11) * 0x1p-53; /* [0, 1) */
        switch (i % 6) {
        case 0: d[i] = -708.0 * u; break;                   /* pass 1 and 2's range */
        case 1: d[i] = -30.0 * u; break;                    /* where logits' terms are */
        case 2: d[i] = -1e-3 * u; break;                    /* near the maximum */
        case 3: d[i] = 708.0 * u; break;                    /* positive: covered too */
        case 4: /* the reduction's half-way points, where k may round either way */
            d[i] = -(double)(rng_next() % 32688 + 1) * ln2_32 * (1 + (u - 0.5) * 1e-12);
            break;
        default: d[i] = -(double)(rng_next() % 709) - u * 1e-6; break; /* integers, as logits' gaps */
        }
    }
    cudaStream_t st = new_stream();
    double *dd = dev_copy(d, sizeof(double) * n), *dfast = dev_alloc(sizeof(double) * n),
           *dref = dev_alloc(sizeof(double) * n);
    CK(gp_test_fast_exp(dd, dfast, dref, n, st));
    sync_stream(st, "gp_fast_exp");
    to_host(fast, dfast, sizeof(double) * n);
    to_host(ref, dref, sizeof(double) * n);

    double worst = 0, worst_cuda = 0, worst_at = 0;
    long grad_diffs = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(fabs(d[i]) <= 708.0)) { /* the shortcut's outside: exp()'s bits */
            if (dbits(fast[i]) != dbits(ref[i]) && !(isnan(fast[i]) && isnan(ref[i])))
                fail_msg("gp_fast_exp(%a) = %a, exp() %a: outside [-708, 708] they must be equal", d[i], fast[i],
                         ref[i]);
            continue;
        }
        const long double want = expl((long double)d[i]);
        const double ulp = ldexp(1.0, ilogb((double)want) - 52);
        const double e = (double)(fabsl((long double)fast[i] - want) / ulp),
                     ec = (double)(fabsl((long double)ref[i] - want) / ulp);
        if (e > worst) worst = e, worst_at = d[i];
        if (ec > worst_cuda) worst_cuda = ec;
        if (d[i] == 0 && fast[i] != 1.0) fail_msg("gp_fast_exp(%a) = %a, not 1", d[i], fast[i]);
        /* the gradients' rounding: (exp(d) - onehot) * inv to float32, for
         * a denominator of GPT-2's tokens and of 1 */
        if (d[i] > 0) continue;
        static const double invs[] = {1.0 / (1.5 * 16384), 1.0};
        for (int k = 0; k < 2; k++)
            for (int hot = 0; hot < 2; hot++) {
                const float a = (float)((fast[i] - hot) * invs[k]), b = (float)((ref[i] - hot) * invs[k]);
                if (fbits(a) == fbits(b)) continue;
                if (!adjacent(a, b))
                    fail_msg("gradient from gp_fast_exp(%a) %a, from exp() %a: more than an ulp apart", d[i],
                             (double)a, (double)b);
                grad_diffs++;
            }
    }
    printf("gp_fast_exp: %zu arguments, max error %.3f ulp (at %a; exp(): %.3f ulp), %ld float32 gradients "
           "an ulp from exp()'s\n",
           n, worst, worst_at, worst_cuda, grad_diffs);
    /* the header's bound: the table's and the last fma's half ulps and a few hundredths */
    if (worst > 1.05) fail_msg("gp_fast_exp: error %.3f ulp at %a (bound 1.05)", worst, worst_at);
    /* two functions within ~1 ulp each round to different floats only when
     * the value lies within ~2 double ulps of a float32 rounding boundary:
     * ~2^-28 of the values, so ~0.03 expected here; 8 is already a bug */
    if (grad_diffs > 8) fail_msg("gp_fast_exp: %ld float32 gradients differ from exp()'s", grad_diffs);
    n_cases++;
    CK(cudaFree(dd));
    CK(cudaFree(dfast));
    CK(cudaFree(dref));
    CK(cudaStreamDestroy(st));
    free(d);
    free(fast);
    free(ref);
}

/* ---- mse and output loss ---- */

static void run_mse(int64_t n, int mis, bool loss_only)
{
    char label[120];
    snprintf(label, sizeof label, "mse n=%lld misalign=%d%s", (long long)n, mis, loss_only ? " loss only" : "");
    float *p = xmalloc(sizeof(float) * (size_t)n), *t = xmalloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        p[i] = normalish();
        t[i] = normalish() * 0.5f;
    }
    const double den = (double)n * 3.0 + 7.0;
    struct gp_shape shape = make_shape(1, (const int64_t[]){n});
    float *want = xmalloc(sizeof(float) * (size_t)n);
    double want_loss = 0;
    struct gp_error err = {0};
    GP(gp_mse_loss(p, t, &shape, &shape, den, want, &want_loss, &err));

    cudaStream_t st = new_stream();
    float *dp = dev_alloc(sizeof(float) * (size_t)(n + 1)), *dt = dev_alloc(sizeof(float) * (size_t)(n + 1));
    float *dg = dev_alloc(sizeof(float) * (size_t)(n + 1));
    CK(cudaMemcpy(dp + mis, p, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dt, t, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
    CK(cudaMemset(dg, 0xff, sizeof(float) * (size_t)(n + 1)));
    double *dloss = dev_alloc(sizeof(double));
    void *scratch = dev_alloc(gp_cuda_loss_scratch_bytes(&shape));
    GP(gp_cuda_mse_loss(st, dp + mis, GP_DTYPE_FLOAT32, dt, n, den, loss_only ? NULL : dg + mis, dloss, scratch, &err));
    sync_stream(st, label);
    double loss = 0;
    to_host(&loss, dloss, sizeof loss);
    if (!close_rel(loss, want_loss, 1e-9, 0))
        fail_msg("%s: loss sum CUDA %.17g, CPU %.17g", label, loss, want_loss);
    float *got = xmalloc(sizeof(float) * (size_t)n);
    to_host(got, dg + mis, sizeof(float) * (size_t)n);
    if (loss_only) {
        for (int64_t i = 0; i < n; i++)
            if (!isnan(got[i])) fail_msg("%s: gradient element %lld was written", label, (long long)i);
    } else {
        compare_bits(label, got, want, n);
    }
    n_cases++;
    CK(cudaFree(dp));
    CK(cudaFree(dt));
    CK(cudaFree(dg));
    CK(cudaFree(dloss));
    CK(cudaFree(scratch));
    CK(cudaStreamDestroy(st));
    free(p);
    free(t);
    free(want);
    free(got);
}

static void test_mse(void **state)
{
    (void)state;
    run_mse(1, 0, false);
    run_mse(7, 0, false);
    run_mse(4099, 1, false);
    run_mse(5000003, 0, false); /* float4 grid wraps */
    run_mse(1100001, 1, false); /* scalar grid wraps */
    run_mse(1000, 0, true);
    run_mse(0, 0, false);
}

static void run_output_loss(int64_t n, int mis, bool loss_only)
{
    char label[120];
    snprintf(label, sizeof label, "output loss n=%lld misalign=%d%s", (long long)n, mis,
             loss_only ? " loss only" : "");
    float *o = xmalloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) o[i] = uniform() + 0.25f * normalish();
    const double den = (double)n * 2.0 + 3.0;
    struct gp_shape shape = make_shape(2, (const int64_t[]){1, n});
    float *want = xmalloc(sizeof(float) * (size_t)n);
    double want_loss = 0;
    struct gp_error err = {0};
    GP(gp_output_loss(o, &shape, den, want, &want_loss, &err));
    double abs_sum = 0;
    for (int64_t i = 0; i < n; i++) abs_sum += fabs(o[i]);

    cudaStream_t st = new_stream();
    float *dout = dev_alloc(sizeof(float) * (size_t)(n + 1)), *dg = dev_alloc(sizeof(float) * (size_t)(n + 1));
    CK(cudaMemcpy(dout + mis, o, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
    CK(cudaMemset(dg, 0xff, sizeof(float) * (size_t)(n + 1)));
    double *dloss = dev_alloc(sizeof(double));
    void *scratch = dev_alloc(gp_cuda_loss_scratch_bytes(&shape));
    GP(gp_cuda_output_loss(st, dout + mis, GP_DTYPE_FLOAT32, n, den, loss_only ? NULL : dg + mis, dloss, scratch, &err));
    sync_stream(st, label);
    double loss = 0;
    to_host(&loss, dloss, sizeof loss);
    /* terms of both signs: the tolerance is relative to the sum of |terms| */
    if (!(fabs(loss - want_loss) <= 1e-12 * abs_sum))
        fail_msg("%s: loss sum CUDA %.17g, CPU %.17g (sum of |terms| %.17g)", label, loss, want_loss, abs_sum);
    float *got = xmalloc(sizeof(float) * (size_t)n);
    to_host(got, dg + mis, sizeof(float) * (size_t)n);
    if (loss_only) {
        for (int64_t i = 0; i < n; i++)
            if (!isnan(got[i])) fail_msg("%s: gradient element %lld was written", label, (long long)i);
    } else {
        compare_bits(label, got, want, n);
    }
    n_cases++;
    CK(cudaFree(dout));
    CK(cudaFree(dg));
    CK(cudaFree(dloss));
    CK(cudaFree(scratch));
    CK(cudaStreamDestroy(st));
    free(o);
    free(want);
    free(got);
}

static void test_output_loss(void **state)
{
    (void)state;
    run_output_loss(1, 0, false);
    run_output_loss(1234567, 0, false);
    run_output_loss(4194307, 0, false); /* float4 grid wraps */
    run_output_loss(1234567, 1, false);
    run_output_loss(999, 0, true);
}

/* ---- the losses on bfloat16 outputs ----
 * The bfloat16 call against the float32 call on a widened copy of the same
 * values (widened on the device by gp_cuda_convert, exact), whose own
 * agreement with the CPU the cases above check: the loss BIT-IDENTICAL
 * (but cross-entropy's block-per-row kernel, whose bfloat16 pass sums the
 * exponentials in float32: within 2^-19 a loss term) and
 * every bfloat16 gradient value of mse and the output loss the float32
 * gradient rounded to nearest even (gp_float_to_bf16). Cross-entropy's
 * bfloat16 gradient is computed in float32 (loss.cu, ce_grad_f32), within
 * 7 * 2^-24 relative of the float32 kernel's double formula: rounded to
 * bfloat16 the two agree but within that of a rounding boundary (bfloat16's
 * midpoints lie 2^-8 .. 2^-7 relative apart, so at most ~2e-4 of the
 * values; ~2e-5 in an emulation), so each value may be one bfloat16 ulp
 * off, and at most n / 1000 + 1 of them are (with the float32 sums' lse,
 * ~2^-21 further: ~3e-4 of the values at most); -inf logits' values are 0
 * in both, and the label's value, by the double formula in both, must be
 * equal where the sums are the float32 kernel's (else one ulp allowed). The
 * float32 copy is 16-byte aligned (as the
 * executor's staging was), the bfloat16 tensors are `misalign` values off
 * (2 bytes: scalar loads, 8 bytes: 8-byte loads but no 16-byte runs). */

enum loss_kind { L_CE, L_MSE, L_OUT };

struct bf_case {
    const char *label;
    enum loss_kind kind;
    int rank;
    int64_t dims[5];
    int axis;             /* cross-entropy */
    double ignore_frac;   /* cross-entropy */
    int misalign;         /* bfloat16 values */
    bool loss_only;
    enum special special; /* cross-entropy: row 0 -inf logits, row 2 all -inf, row 3 +inf, row 4 NaN */
    bool f32_misaligned;  /* mse, output loss: the float32 copy as misaligned (the same split) */
};

/* a within tol of b; equal infinities and two NaNs agree. */
static bool near_loss(double a, double b, double tol)
{
    return a == b || (isnan(a) && isnan(b)) || fabs(a - b) <= tol;
}

/* Whether gp_cuda_cross_entropy runs its block-per-row kernel on these
 * logits (loss.cu, ce_launch): the class axis contiguous, or strided with
 * few rows of many classes. */
static bool ce_rows_kernel_takes(int rank, const int64_t *dims, int axis)
{
    int64_t S = 1, rows = 1;
    for (int i = 0; i < rank; i++)
        if (i != axis) rows *= dims[i];
    for (int i = axis + 1; i < rank; i++) S *= dims[i];
    return !(S > 1 && (rows >= 16384 || dims[axis] <= 256));
}

static void run_bf16_loss(const struct bf_case *k)
{
    struct gp_shape shape = make_shape(k->rank, k->dims);
    const int64_t n = gp_shape_numel(&shape);
    const int64_t C = k->kind == L_CE ? k->dims[k->axis] : 1, rows = C ? n / C : 0;
    int64_t S = 1;
    if (k->kind == L_CE)
        for (int i = k->axis + 1; i < k->rank; i++) S *= k->dims[i];
    const int mis = k->misalign, fmis = k->f32_misaligned ? 1 : 0;

    /* bfloat16 values: a cheap pattern for the big cases, spread ~4 */
    uint16_t *xb = xmalloc(sizeof(uint16_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        xb[i] = gp_float_to_bf16(n > 10000000 ? 0.25f * (float)((int)(rng_next() >> 58) - 32) : 4.0f * normalish());
    if (k->kind == L_CE && k->special != SP_NONE && k->special != SP_HOT_MAX)
        for (int64_t r = 0; r < rows && r < 5; r++) {
            const int64_t o = r / S, i = r % S;
            uint16_t *xr = xb + o * C * S + i;
            for (int64_t c = 0; c < C; c++) {
                float v = gp_bf16_to_float(xr[c * S]);
                if (r == 0 && c % 3 == 2) v = -INFINITY;
                if (r == 2) v = -INFINITY;
                if (r == 3 && c == C / 2) v = INFINITY;
                if (r == 4 && c == C - 1) v = NAN;
                xr[c * S] = gp_float_to_bf16(v);
            }
        }
    if (k->kind == L_CE && k->special == SP_HOT_MAX)
        for (int64_t i = 0; i < n; i += 7) xb[i] = gp_float_to_bf16(-INFINITY);
    int64_t *y = NULL;
    float *t = NULL;
    if (k->kind == L_CE) {
        y = xmalloc(sizeof(int64_t) * (size_t)(rows ? rows : 1));
        for (int64_t r = 0; r < rows; r++) {
            y[r] = (int64_t)(rng_next() % (uint64_t)C);
            if (uniform() < k->ignore_frac) y[r] = GP_LOSS_IGNORE_INDEX;
        }
        if (rows > 1 && k->ignore_frac < 1.0) y[rows - 1] = C - 1; /* the last class hot in the last row: the last run's last value */
        if (k->special == SP_HOT_MAX)
            for (int64_t r = 0; r < rows; r += 2) {
                if (y[r] == GP_LOSS_IGNORE_INDEX) continue;
                const uint16_t *xr = xb + (r / S) * C * S + r % S;
                int64_t best = 0;
                for (int64_t c = 1; c < C; c++)
                    if (gp_bf16_to_float(xr[c * S]) > gp_bf16_to_float(xr[best * S])) best = c;
                y[r] = best;
            }
    } else if (k->kind == L_MSE) {
        t = xmalloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) t[i] = normalish();
    }
    const int64_t terms = k->kind == L_CE ? gp_loss_count_targets(y, rows, GP_LOSS_IGNORE_INDEX) : n;
    const double den = terms > 0 ? (double)terms * 1.5 : 1.0;

    struct gp_error err = {0};
    cudaStream_t st = new_stream();
    uint16_t *dxb = dev_alloc(sizeof(uint16_t) * (size_t)(n + 8)), *dgb = dev_alloc(sizeof(uint16_t) * (size_t)(n + 8));
    float *dxf = dev_alloc(sizeof(float) * (size_t)(n + 4)), *dgf = dev_alloc(sizeof(float) * (size_t)(n + 4));
    CK(cudaMemcpy(dxb + mis, xb, sizeof(uint16_t) * (size_t)n, cudaMemcpyHostToDevice));
    GP(gp_cuda_convert(NULL, dxf + fmis, GP_DTYPE_FLOAT32, dxb + mis, GP_DTYPE_BFLOAT16, n, false, &err));
    CK(cudaDeviceSynchronize());
    CK(cudaMemset(dgb, 0xff, sizeof(uint16_t) * (size_t)(n + 8))); /* NaN: every value must be written */
    CK(cudaMemset(dgf, 0xff, sizeof(float) * (size_t)(n + 4)));
    int64_t *dy = y ? dev_copy(y, sizeof(int64_t) * (size_t)(rows ? rows : 1)) : NULL;
    float *dt = t ? dev_copy(t, sizeof(float) * (size_t)n) : NULL;
    double *dloss = dev_alloc(2 * sizeof(double));
    void *scratch = dev_alloc(gp_cuda_loss_scratch_bytes(&shape));
    double loss_b[2], loss_f = 0;
    for (int rep = 0; rep < 3; rep++) { /* bfloat16 twice (the same bits run to run), float32 once */
        const bool b = rep < 2;
        const void *x = b ? (const void *)(dxb + mis) : (const void *)(dxf + fmis);
        void *gr = k->loss_only ? NULL : b ? (void *)(dgb + mis) : (void *)(dgf + fmis);
        const enum gp_dtype dtp = b ? GP_DTYPE_BFLOAT16 : GP_DTYPE_FLOAT32;
        if (k->kind == L_CE)
            GP(gp_cuda_cross_entropy(st, x, dtp, &shape, k->axis, dy, GP_LOSS_IGNORE_INDEX, den, gr, dloss, scratch,
                                     &err));
        else if (k->kind == L_MSE)
            GP(gp_cuda_mse_loss(st, x, dtp, dt, n, den, gr, dloss, scratch, &err));
        else
            GP(gp_cuda_output_loss(st, x, dtp, n, den, gr, dloss, scratch, &err));
        sync_stream(st, k->label);
        to_host(b ? &loss_b[rep] : &loss_f, dloss, sizeof(double));
    }
    if (memcmp(&loss_b[0], &loss_b[1], sizeof(double)) != 0)
        fail_msg("%s: the bfloat16 loss differs between two runs: %.17g and %.17g", k->label, loss_b[0], loss_b[1]);
    /* cross-entropy's block-per-row kernel sums a bfloat16 row's
     * exponentials in float32 (loss.cu, ms_group_f32): each loss term within
     * ~2^-21 of the double one; allowed 2^-19 a term. Its strided kernel,
     * mse and the output loss: the float32 loss, bit for bit. */
    const bool ce_f32_sums = k->kind == L_CE && ce_rows_kernel_takes(k->rank, k->dims, k->axis);
    const double loss_tol = ce_f32_sums ? ldexp((double)terms, -19) : 0.0;
    if (ce_f32_sums ? !near_loss(loss_b[0], loss_f, loss_tol) : memcmp(&loss_b[0], &loss_f, sizeof(double)) != 0)
        fail_msg("%s: the bfloat16 loss %.17g (%a) is not the float32 one on the widened copy, %.17g (%a), "
                 "within %g",
                 k->label, loss_b[0], loss_b[0], loss_f, loss_f, loss_tol);
    if (k->kind == L_CE && n > 0 && n <= 4000000) {
        /* and the CPU's on the same values */
        float *xf = xmalloc(sizeof(float) * (size_t)n), *want_g = xmalloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) xf[i] = gp_bf16_to_float(xb[i]);
        struct gp_shape lshape = {.rank = k->rank - 1};
        for (int i = 0, j = 0; i < k->rank; i++)
            if (i != k->axis) lshape.dims[j++] = k->dims[i];
        double want_loss = 0;
        int64_t want_terms = 0;
        GP(gp_cross_entropy(xf, &shape, y, &lshape, k->axis, GP_LOSS_IGNORE_INDEX, den, want_g, &want_loss,
                            &want_terms, &err));
        if (!near_loss(loss_b[0], want_loss, loss_tol + 1e-9 * fabs(want_loss)))
            fail_msg("%s: bfloat16 loss sum CUDA %.17g, CPU %.17g", k->label, loss_b[0], want_loss);
        free(xf);
        free(want_g);
    }
    uint16_t *got = xmalloc(sizeof(uint16_t) * (size_t)(n + 8));
    to_host(got, dgb, sizeof(uint16_t) * (size_t)(n + 8));
    for (int64_t i = 0; i < n + 8; i++) {
        const bool inside = i >= mis && i < mis + n;
        if ((!inside || k->loss_only) && got[i] != 0xffff)
            fail_msg("%s: bfloat16 gradient value %lld written (outside the tensor, or loss only)", k->label,
                     (long long)(i - mis));
    }
    if (!k->loss_only) {
        float *gf = xmalloc(sizeof(float) * (size_t)(n ? n : 1));
        to_host(gf, dgf + fmis, sizeof(float) * (size_t)n);
        int64_t off = 0;
        for (int64_t i = 0; i < n; i++) {
            const uint16_t want = gp_float_to_bf16(gf[i]), have = got[mis + i];
            if (have == want) continue;
            /* cross-entropy: one ulp (the same sign, neighbouring bits; NaN
             * as NaN), except the label's value and a -inf logit's */
            const int64_t c = k->kind == L_CE ? i / S % C : 0, r = k->kind == L_CE ? i / (C * S) * S + i % S : 0;
            /* the label's value: the double formula on both sides, but with
             * lse from float32 sums where ce_f32_sums */
            const bool exact = k->kind != L_CE || (c == y[r] && !ce_f32_sums) ||
                               gp_bf16_to_float(xb[i]) == -INFINITY;
            const bool nan = isnan(gp_bf16_to_float(have)) && isnan(gp_bf16_to_float(want));
            const bool near = (have ^ want) < 0x8000 && (have - want == 1 || want - have == 1);
            if (nan && !exact) continue;
            if (exact || !near)
                fail_msg("%s: gradient value %lld: bfloat16 %#06x, the float32 gradient %.9g (%a) rounded %#06x",
                         k->label, (long long)i, have, (double)gf[i], (double)gf[i], want);
            off++;
        }
        if (off > n / 1000 + 1)
            fail_msg("%s: %lld of %lld bfloat16 gradient values one ulp from the float32 gradient's rounding",
                     k->label, (long long)off, (long long)n);
        if (k->kind == L_CE && n >= 100000)
            printf("%s: %lld of %lld gradient values (%.2g) one bfloat16 ulp from float32's\n", k->label,
                   (long long)off, (long long)n, (double)off / (double)n);
        free(gf);
    }
    n_cases++;
    CK(cudaFree(dxb));
    CK(cudaFree(dgb));
    CK(cudaFree(dxf));
    CK(cudaFree(dgf));
    if (dy) CK(cudaFree(dy));
    if (dt) CK(cudaFree(dt));
    CK(cudaFree(dloss));
    CK(cudaFree(scratch));
    CK(cudaStreamDestroy(st));
    free(xb);
    free(y);
    free(t);
    free(got);
}

static void test_bf16_losses(void **state)
{
    (void)state;
    static const struct bf_case cases[] = {
        {"bf16 ce [16,50304] axis 1 (16-byte runs)", L_CE, 2, {16, 50304}, 1, 0.2, 0, false, SP_NONE, false},
        {"bf16 ce [2,9,50304] last axis", L_CE, 3, {2, 9, 50304}, 2, 0.2, 0, false, SP_NONE, false},
        {"bf16 ce [2,9,50304] misaligned 2 bytes (scalar loads, float32's split)", L_CE, 3, {2, 9, 50304}, 2, 0.1, 1,
         false, SP_NONE, false},
        {"bf16 ce [2,9,50304] misaligned 8 bytes (8-byte loads, gradient by value)", L_CE, 3, {2, 9, 50304}, 2,
         0.1, 4, false, SP_NONE, false},
        {"bf16 ce [3,5,50257] last axis (GPT-2's odd vocabulary)", L_CE, 3, {3, 5, 50257}, 2, 0.2, 0, false, SP_NONE,
         false},
        {"bf16 ce [4,1004] axis 1 (C % 8 == 4)", L_CE, 2, {4, 1004}, 1, 0.2, 0, false, SP_NONE, false},
        {"bf16 ce [5000,12] axis 1 (more rows than blocks)", L_CE, 2, {5000, 12}, 1, 0.2, 0, false, SP_NONE, false},
        {"bf16 ce [7,33] axis 1 odd", L_CE, 2, {7, 33}, 1, 0.0, 0, false, SP_NONE, false},
        {"bf16 ce [4,7,5,3] axis 1 (strided, thread per row)", L_CE, 4, {4, 7, 5, 3}, 1, 0.2, 0, false, SP_NONE,
         false},
        {"bf16 ce [2,300,5] axis 1 (strided, block per row)", L_CE, 3, {2, 300, 5}, 1, 0.2, 0, false, SP_NONE,
         false},
        {"bf16 ce [2,8,304] last axis, all ignored", L_CE, 3, {2, 8, 304}, 2, 1.0, 0, false, SP_NONE, false},
        {"bf16 ce [8,50304] axis 1, loss only", L_CE, 2, {8, 50304}, 1, 0.2, 0, true, SP_NONE, false},
        {"bf16 ce [7,64] axis 1, NaN/inf logits (chunks)", L_CE, 2, {7, 64}, 1, 0.0, 0, false, SP_NONFINITE, false},
        {"bf16 ce [7,33] axis 1, NaN/inf logits (values)", L_CE, 2, {7, 33}, 1, 0.0, 0, false, SP_NONFINITE, false},
        {"bf16 ce [0,10] axis 1 (empty)", L_CE, 2, {0, 10}, 1, 0.0, 0, false, SP_NONE, false},
        /* the float32 gradient path on GPT-2's rows, and its exceptions: ignored rows, -inf logits, labels at
         * the maximum (taken by the double formula) */
        {"bf16 ce [2,8,50304] last axis (the gradient in float32)", L_CE, 3, {2, 8, 50304}, 2, 0.0, 0, false,
         SP_NONE, false},
        {"bf16 ce [2,8,50304] last axis, ignored rows, -inf logits, labels at the maximum", L_CE, 3,
         {2, 8, 50304}, 2, 0.25, 0, false, SP_HOT_MAX, false},
        {"bf16 ce [4,7,300] axis 1 (strided, thread per row), -inf logits, labels at the maximum", L_CE, 3,
         {4, 7, 300}, 1, 0.25, 0, false, SP_HOT_MAX, false},
        /* GPT-2 small's whole step: 824M logits, 1.65 GB of bfloat16, 3.3 GB as float32 (past 2^31 bytes) */
        {"bf16 ce [16,1024,50304] last axis (GPT-2, batch 16)", L_CE, 3, {16, 1024, 50304}, 2, 0.01, 0, false,
         SP_NONE, false},
        {"bf16 mse n=7", L_MSE, 1, {7}, 0, 0, 0, false, SP_NONE, false},
        {"bf16 mse n=5000003 (chunks, the grid wraps)", L_MSE, 1, {5000003}, 0, 0, 0, false, SP_NONE, false},
        {"bf16 mse n=4099 misaligned", L_MSE, 1, {4099}, 0, 0, 1, false, SP_NONE, true},
        {"bf16 mse n=1000 loss only", L_MSE, 1, {1000}, 0, 0, 0, true, SP_NONE, false},
        {"bf16 output loss n=1", L_OUT, 1, {1}, 0, 0, 0, false, SP_NONE, false},
        {"bf16 output loss n=4194307 (the grid wraps)", L_OUT, 1, {4194307}, 0, 0, 0, false, SP_NONE, false},
        {"bf16 output loss n=1234567 misaligned", L_OUT, 1, {1234567}, 0, 0, 1, false, SP_NONE, true},
        {"bf16 output loss n=999 loss only", L_OUT, 1, {999}, 0, 0, 0, true, SP_NONE, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_bf16_loss(&cases[i]);
}

/* ---- optimizers ---- */

struct opt_case {
    const char *label;
    struct gp_optim_config cfg;
};

/* Parameter sizes: many small tensors (more than one launch's list of 64),
 * empty ones, tensors of many chunks (16384 elements), a chunk long and
 * just over. Tensor MISALIGNED's pointers are 4 bytes off 16 (scalar path). */
#define N_PARAMS 150
#define MISALIGNED 5
static int64_t param_sizes[N_PARAMS];

static int64_t p_off[N_PARAMS + 1], p_total;
static float *p0, *g[3]; /* initial parameters, the gradients of the 3 steps */

static void make_data(void)
{
    static const int64_t small[] = {1, 3, 64, 1000, 4097, 7, 12, 256, 513, 2};
    for (int i = 0; i < N_PARAMS; i++) param_sizes[i] = small[i % 10] + i;
    param_sizes[47] = 3 * 65536 - 5;
    param_sizes[50] = 16384;
    param_sizes[51] = 16385;
    param_sizes[52] = 0;
    param_sizes[53] = 65536;
    param_sizes[63] = 2359296; /* ResNet-50's largest convolution */
    param_sizes[64] = 0;
    param_sizes[MISALIGNED] = 70001;
    param_sizes[60] = 3000017;
    param_sizes[130] = 1048573;
    p_total = 0;
    for (int i = 0; i < N_PARAMS; i++) {
        p_off[i] = p_total;
        p_total += (param_sizes[i] + 16) & ~(int64_t)15; /* room to misalign */
    }
    p_off[N_PARAMS] = p_total;
    p0 = xmalloc(sizeof(float) * (size_t)p_total);
    for (int64_t i = 0; i < p_total; i++) p0[i] = 0.5f * normalish();
    p0[3] = 0.0f;
    static const float gscale[3] = {0.1f, 1.0f, 3.0f};
    for (int s = 0; s < 3; s++) {
        g[s] = xmalloc(sizeof(float) * (size_t)p_total);
        for (int64_t i = 0; i < p_total; i++) g[s][i] = gscale[s] * normalish();
        g[s][5] = 0.0f;
        g[s][7] = -50.0f * g[s][7];
        g[s][p_off[60] + 1000] = 0.0f;
    }
}

static void run_optim(const struct opt_case *k, float clip)
{
    char label[200];
    snprintf(label, sizeof label, "%s, clip_coef %g", k->label, (double)clip);
    const int np = N_PARAMS;
    const double lrs[3] = {k->cfg.lr, k->cfg.lr, k->cfg.lr / 2};

    /* the CPU */
    float *hp = xmalloc(sizeof(float) * (size_t)p_total), *hg = xmalloc(sizeof(float) * (size_t)p_total);
    memcpy(hp, p0, sizeof(float) * (size_t)p_total);
    struct gp_param hparams[N_PARAMS];
    for (int i = 0; i < np; i++) {
        int64_t o = p_off[i] + (i == MISALIGNED ? 1 : 0);
        hparams[i] = (struct gp_param){.name = "p", .data = hp + o, .grad = hg + o, .numel = param_sizes[i]};
    }
    struct gp_optim *hopt = NULL;
    struct gp_error err = {0};
    GP(gp_optim_create(&k->cfg, hparams, np, &hopt, &err));

    /* the GPU */
    cudaStream_t st = new_stream();
    float *dp = dev_copy(p0, sizeof(float) * (size_t)p_total);
    float *dg = dev_alloc(sizeof(float) * (size_t)p_total);
    struct gp_param dparams[N_PARAMS];
    for (int i = 0; i < np; i++) {
        int64_t o = p_off[i] + (i == MISALIGNED ? 1 : 0);
        dparams[i] = (struct gp_param){.name = "p", .data = dp + o, .grad = dg + o, .numel = param_sizes[i]};
    }
    size_t state_bytes = gp_optim_state_bytes_for(&k->cfg, dparams, np);
    void *dstate = dev_alloc(state_bytes);
    if (state_bytes) CK(cudaMemset(dstate, 0, state_bytes));
    struct gp_optim *dopt = NULL;
    GP(gp_optim_create_in(&k->cfg, dparams, np, dstate, &dopt, &err));

    /* The step's scalars in device memory, as a pipeline keeps them: the
     * host's gp_optim_scalars_for, the clipping coefficient beside them. */
    struct gp_optim_scalars *dscalars = dev_alloc(sizeof(struct gp_optim_scalars));
    for (int s = 0; s < 3; s++) {
        memcpy(hg, g[s], sizeof(float) * (size_t)p_total);
        if (clip < 1.0f) gp_scale_grads(hparams, np, clip);
        gp_optim_step(hopt, lrs[s]);

        CK(cudaMemcpy(dg, g[s], sizeof(float) * (size_t)p_total, cudaMemcpyHostToDevice));
        struct gp_optim_scalars sc;
        gp_optim_scalars_for(&dopt->cfg, lrs[s], ++dopt->steps, &sc);
        sc.coef = clip;
        CK(cudaMemcpy(dscalars, &sc, sizeof sc, cudaMemcpyHostToDevice));
        GP(gp_cuda_optim_step(st, dopt, dscalars, &err));
        sync_stream(st, label);
    }
    assert_int_equal(dopt->steps, hopt->steps);

    float *got = xmalloc(sizeof(float) * (size_t)p_total);
    char what[300];
    to_host(got, dp, sizeof(float) * (size_t)p_total);
    for (int i = 0; i < np; i++) {
        snprintf(what, sizeof what, "%s: parameter %d (%lld elements) after 3 steps", label, i,
                 (long long)param_sizes[i]);
        compare_bits(what, got + (hparams[i].data - hp), hparams[i].data, param_sizes[i]);
    }
    to_host(got, dg, sizeof(float) * (size_t)p_total);
    for (int i = 0; i < np; i++) {
        snprintf(what, sizeof what, "%s: gradient %d (clipped in place)", label, i);
        compare_bits(what, got + (hparams[i].grad - hg), hparams[i].grad, param_sizes[i]);
    }
    int nstate = gp_optim_state_floats(&k->cfg);
    if (state_bytes) {
        assert_int_equal(state_bytes, gp_optim_state_bytes(hopt));
        float *gs = xmalloc(state_bytes);
        to_host(gs, dstate, state_bytes);
        for (int sidx = 0; sidx < nstate; sidx++)
            for (int i = 0; i < np; i++) {
                snprintf(what, sizeof what, "%s: state %d of parameter %d", label, sidx, i);
                compare_bits(what, gs + (dopt->state[sidx][i] - (float *)dstate),
                             hopt->state[sidx][i], param_sizes[i]);
            }
        free(gs);
    }
    /* A step the guard marked to skip changes nothing: parameters, state
     * and gradients keep their bits. */
    float *before = xmalloc(sizeof(float) * (size_t)p_total);
    to_host(before, dp, sizeof(float) * (size_t)p_total);
    void *state_before = state_bytes ? xmalloc(state_bytes) : NULL;
    if (state_bytes) to_host(state_before, dstate, state_bytes);
    struct gp_optim_scalars skip;
    gp_optim_scalars_for(&dopt->cfg, lrs[0], dopt->steps + 1, &skip);
    skip.coef = 0.5f;
    skip.skip = 1;
    CK(cudaMemcpy(dscalars, &skip, sizeof skip, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dg, g[0], sizeof(float) * (size_t)p_total, cudaMemcpyHostToDevice));
    GP(gp_cuda_optim_step(st, dopt, dscalars, &err));
    sync_stream(st, label);
    float *after = xmalloc(sizeof(float) * (size_t)p_total);
    to_host(after, dp, sizeof(float) * (size_t)p_total);
    if (memcmp(before, after, sizeof(float) * (size_t)p_total) != 0)
        fail_msg("%s: a skipped step changed the parameters", label);
    to_host(after, dg, sizeof(float) * (size_t)p_total);
    if (memcmp(g[0], after, sizeof(float) * (size_t)p_total) != 0)
        fail_msg("%s: a skipped step clipped the gradients", label);
    if (state_bytes) {
        void *state_after = xmalloc(state_bytes);
        to_host(state_after, dstate, state_bytes);
        if (memcmp(state_before, state_after, state_bytes) != 0)
            fail_msg("%s: a skipped step changed the optimizer state", label);
        free(state_after);
    }
    free(state_before);
    free(before);
    free(after);
    CK(cudaFree(dscalars));
    n_cases++;

    gp_optim_free(hopt);
    gp_optim_free(dopt);
    CK(cudaFree(dp));
    CK(cudaFree(dg));
    CK(cudaFree(dstate));
    CK(cudaStreamDestroy(st));
    free(hp);
    free(hg);
    free(got);
}

static void test_optimizers(void **state)
{
    (void)state;
    make_data();
    struct opt_case cases[10];
    int nc = 0;
    cases[nc++] = (struct opt_case){"SGD plain", gp_sgd_defaults(0.1)};
    struct gp_optim_config c = gp_sgd_defaults(0.05);
    c.momentum = 0.9;
    cases[nc++] = (struct opt_case){"SGD momentum 0.9", c};
    c = gp_sgd_defaults(0.05);
    c.momentum = 0.8;
    c.dampening = 0.3;
    c.weight_decay = 1e-3;
    cases[nc++] = (struct opt_case){"SGD momentum 0.8, dampening 0.3, weight decay 1e-3", c};
    c = gp_sgd_defaults(0.02);
    c.momentum = 0.9;
    c.nesterov = true;
    c.weight_decay = 5e-4;
    cases[nc++] = (struct opt_case){"SGD nesterov 0.9, weight decay 5e-4", c};
    c = gp_sgd_defaults(0.1);
    c.weight_decay = 1e-2;
    cases[nc++] = (struct opt_case){"SGD weight decay only", c};
    cases[nc++] = (struct opt_case){"AdamW torch 1.13 defaults", gp_adamw_defaults(1e-3)};
    c = gp_adamw_defaults(3e-3);
    c.weight_decay = 0.0;
    c.beta1 = 0.8;
    c.beta2 = 0.95;
    c.eps = 1e-6;
    cases[nc++] = (struct opt_case){"AdamW torch 1.13, no weight decay, betas (0.8, 0.95)", c};
    c = gp_adamw_defaults(1e-3);
    c.arith = GP_TORCH_2;
    cases[nc++] = (struct opt_case){"AdamW torch 2 (lerp, |1-beta1| < 0.5)", c};
    c = gp_adamw_defaults(2e-3);
    c.arith = GP_TORCH_2;
    c.beta1 = 0.3;
    c.weight_decay = 0.1;
    cases[nc++] = (struct opt_case){"AdamW torch 2 (lerp, |1-beta1| >= 0.5), weight decay 0.1", c};
    for (int i = 0; i < nc; i++) {
        run_optim(&cases[i], 1.0f);
        run_optim(&cases[i], 0.37f);
    }
    free(p0);
    for (int s = 0; s < 3; s++) free(g[s]);
}

/* ---- buffers ---- */

static void run_accumulate(int64_t n, int mis_dst, int mis_src)
{
    char label[120];
    snprintf(label, sizeof label, "accumulate n=%lld misalign %d/%d", (long long)n, mis_dst, mis_src);
    float *d = xmalloc(sizeof(float) * (size_t)n), *s = xmalloc(sizeof(float) * (size_t)n);
    float *want = xmalloc(sizeof(float) * (size_t)n), *got = xmalloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        d[i] = normalish();
        s[i] = 1e-3f * normalish();
        want[i] = d[i] + s[i];
    }
    cudaStream_t st = new_stream();
    float *dd = dev_alloc(sizeof(float) * (size_t)(n + 1)), *ds = dev_alloc(sizeof(float) * (size_t)(n + 1));
    CK(cudaMemcpy(dd + mis_dst, d, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ds + mis_src, s, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
    struct gp_error err = {0};
    GP(gp_cuda_accumulate(st, dd + mis_dst, ds + mis_src, n, &err));
    sync_stream(st, label);
    to_host(got, dd + mis_dst, sizeof(float) * (size_t)n);
    compare_bits(label, got, want, n);
    n_cases++;
    CK(cudaFree(dd));
    CK(cudaFree(ds));
    CK(cudaStreamDestroy(st));
    free(d);
    free(s);
    free(want);
    free(got);
}

static void test_accumulate(void **state)
{
    (void)state;
    run_accumulate(1, 0, 0);
    run_accumulate(3000001, 0, 0);
    run_accumulate(5000003, 0, 0); /* float4 grid wraps */
    run_accumulate(3000001, 1, 0);
    run_accumulate(3000001, 0, 1);
    struct gp_error err = {0};
    assert_int_equal(gp_cuda_accumulate(NULL, NULL, NULL, 0, &err), GP_OK);
}

/* One gp_cuda_convert against a loop on the host: n values from src
 * (float32, or bfloat16 when sb) into dst (likewise db), onto dst's
 * earlier values when acc, the tensors smis and dmis values past a 16-byte
 * boundary (0: 16-byte runs with a scalar tail, else scalar throughout).
 * Values: random, -0 and infinities; without acc NaNs too (a sum's NaN is
 * the device's canonical one, the host's keeps its payload). Bit for bit;
 * the bytes around dst untouched. */
static void run_convert(int64_t n, bool sb, bool db, bool acc, int smis, int dmis)
{
    size_t es = sb ? 2 : 4, ed = db ? 2 : 4;
    const bool big = n > 100000000;
    char *sh = xmalloc(es * (size_t)(n + 1)), *dh = xmalloc(ed * (size_t)(n + 1)), *got = xmalloc(ed * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) {
        /* a cheap pattern for the big case */
        float v = big ? 0.25f * (float)((int)((uint64_t)i * 2654435761u >> 26 & 63) - 32) : normalish();
        float w = big ? 0.5f * (float)((int)((uint64_t)i * 40503u >> 10 & 31) - 16) : normalish();
        if (i % 97 == 5) v = -0.0f;
        if (i % 89 == 7) v = i & 1 ? INFINITY : -INFINITY;
        if (!acc && i % 83 == 11) v = i & 1 ? NAN : -NAN;
        if (sb) ((uint16_t *)sh)[i] = gp_float_to_bf16(v);
        else ((float *)sh)[i] = v;
        if (db) ((uint16_t *)dh)[i] = gp_float_to_bf16(w);
        else ((float *)dh)[i] = w;
    }
    /* room for the misalignment and a guard value after the end */
    char *ds = dev_alloc(es * (size_t)(n + 8)), *dd = dev_alloc(ed * (size_t)(n + 9));
    CK(cudaMemset(dd, 0x5a, ed * (size_t)(n + 9)));
    CK(cudaMemcpy(ds + es * (size_t)smis, sh, es * (size_t)n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dd + ed * (size_t)dmis, dh, ed * (size_t)n, cudaMemcpyHostToDevice));
    cudaStream_t st = new_stream();
    struct gp_error err = {0};
    GP(gp_cuda_convert(st, dd + ed * (size_t)dmis, db ? GP_DTYPE_BFLOAT16 : GP_DTYPE_FLOAT32, ds + es * (size_t)smis,
                       sb ? GP_DTYPE_BFLOAT16 : GP_DTYPE_FLOAT32, n, acc, &err));
    sync_stream(st, "convert");
    to_host(got, dd + ed * (size_t)dmis, ed * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) {
        float v = sb ? gp_bf16_to_float(((uint16_t *)sh)[i]) : ((float *)sh)[i];
        if (acc) v = (db ? gp_bf16_to_float(((uint16_t *)dh)[i]) : ((float *)dh)[i]) + v;
        bool same;
        if (db) same = ((uint16_t *)got)[i] == gp_float_to_bf16(v);
        else same = memcmp((float *)got + i, &v, sizeof v) == 0;
        if (!same)
            fail_msg("convert %s -> %s%s of %lld values (misaligned %d, %d) at %lld: %g, want %g", sb ? "bf16" : "f32",
                     db ? "bf16" : "f32", acc ? " (accumulate)" : "", (long long)n, smis, dmis, (long long)i,
                     db ? (double)gp_bf16_to_float(((uint16_t *)got)[i]) : (double)((float *)got)[i], (double)v);
    }
    for (size_t b = 0; b < ed; b++)
        if ((unsigned char)got[ed * (size_t)n + b] != 0x5a)
            fail_msg("convert of %lld values wrote past the end", (long long)n);
    n_cases++;
    cudaStreamDestroy(st);
    cudaFree(ds);
    cudaFree(dd);
    free(sh), free(dh), free(got);
}

/* Every pair of storage types, copied and accumulated: sizes below one run,
 * whole runs, a tail, a grid that wraps (more than 2 x 4096 x 256 runs),
 * misaligned pointers (scalar) and pointers 16 bytes apart (runs); then the
 * executor's seeding of GPT-2's logits' gradient, [16, 1024, 50304]
 * bfloat16, copied (tasks.c) and accumulated. */
static void test_convert(void **state)
{
    (void)state;
    for (int t = 0; t < 4; t++) {
        bool sb = t & 1, db = t & 2;
        for (int acc = 0; acc < 2; acc++) {
            run_convert(5, sb, db, acc, 0, 0);
            run_convert(64, sb, db, acc, 0, 0);
            run_convert(1000003, sb, db, acc, 0, 0);
            run_convert(20000005, sb, db, acc, 0, 0);
            run_convert(100003, sb, db, acc, 1, 0);
            run_convert(100003, sb, db, acc, 0, 1);
            run_convert(100000, sb, db, acc, sb ? 8 : 4, db ? 8 : 4);
        }
    }
    run_convert((int64_t)16 * 1024 * 50304, true, true, false, 0, 0);
    run_convert((int64_t)16 * 1024 * 50304, true, true, true, 0, 0);
}

/* Element (b, ch, p) of a tensor [n, c, hw] laid out [n, hw, c] or not. */
static int64_t layout_index(bool nhwc, int64_t c, int64_t hw, int64_t b, int64_t ch, int64_t p)
{
    return nhwc ? (b * hw + p) * c + ch : (b * c + ch) * hw + p;
}

/* One relayout against the host: src [n, sc, hw] (float32, or bfloat16
 * when sb) into dst [n, dc, hw] (likewise db), onto dst's earlier values
 * when acc; `channels` calls gp_cuda_relayout_channels, else
 * gp_cuda_relayout (sc == dc). */
static void run_relayout(bool channels, bool dn, int64_t dc, bool db, bool sn, int64_t sc, bool sb, int64_t n,
                         int64_t hw, bool acc)
{
    int64_t ns = n * sc * hw, nd = n * dc * hw;
    size_t es = sb ? 2 : 4, ed = db ? 2 : 4;
    float *sv = xmalloc(sizeof(float) * (size_t)ns), *dv = xmalloc(sizeof(float) * (size_t)nd);
    char *sh = xmalloc(es * (size_t)ns), *dh = xmalloc(ed * (size_t)nd), *got = xmalloc(ed * (size_t)nd);
    for (int64_t i = 0; i < ns; i++) {
        float v = normalish();
        if (sb) ((uint16_t *)sh)[i] = gp_float_to_bf16(v), v = gp_bf16_to_float(((uint16_t *)sh)[i]);
        else ((float *)sh)[i] = v;
        sv[i] = v;
    }
    for (int64_t i = 0; i < nd; i++) {
        float v = normalish();
        if (db) ((uint16_t *)dh)[i] = gp_float_to_bf16(v), v = gp_bf16_to_float(((uint16_t *)dh)[i]);
        else ((float *)dh)[i] = v;
        dv[i] = v;
    }
    void *ds = dev_copy(sh, es * (size_t)ns), *dd = dev_copy(dh, ed * (size_t)nd);
    cudaStream_t st = new_stream();
    struct gp_error err = {0};
    enum gp_dtype dt = db ? GP_DTYPE_BFLOAT16 : GP_DTYPE_FLOAT32, stype = sb ? GP_DTYPE_BFLOAT16 : GP_DTYPE_FLOAT32;
    if (channels)
        GP(gp_cuda_relayout_channels(st, dd, dt, dn, dc, ds, stype, sn, sc, n, hw, acc, &err));
    else
        GP(gp_cuda_relayout(st, dd, dt, dn, ds, stype, sn, n, sc, hw, acc, &err));
    assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
    assert_int_equal(cudaMemcpy(got, dd, ed * (size_t)nd, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t b = 0; b < n; b++)
        for (int64_t ch = 0; ch < dc; ch++)
            for (int64_t p = 0; p < hw; p++) {
                int64_t d = layout_index(dn, dc, hw, b, ch, p);
                float v = ch < sc ? sv[layout_index(sn, sc, hw, b, ch, p)] : 0.0f;
                if (acc) v = dv[d] + v;
                if (db) {
                    uint16_t want = gp_float_to_bf16(v), have = ((uint16_t *)got)[d];
                    if (want != have)
                        fail_msg("relayout [%lld, %lld -> %lld, %lld] at (%lld, %lld, %lld): %04x, want %04x",
                                 (long long)n, (long long)sc, (long long)dc, (long long)hw, (long long)b,
                                 (long long)ch, (long long)p, have, want);
                } else {
                    float have = ((float *)got)[d];
                    if (memcmp(&have, &v, sizeof v))
                        fail_msg("relayout [%lld, %lld -> %lld, %lld] at (%lld, %lld, %lld): %g, want %g",
                                 (long long)n, (long long)sc, (long long)dc, (long long)hw, (long long)b,
                                 (long long)ch, (long long)p, have, v);
                }
            }
    n_cases++;
    cudaStreamDestroy(st);
    cudaFree(ds);
    cudaFree(dd);
    free(sv), free(dv), free(sh), free(dh), free(got);
}

static void test_relayout(void **state)
{
    (void)state;
    for (int t = 0; t < 4; t++) { /* storage of source and destination */
        bool sb = t & 1, db = t & 2;
        for (int acc = 0; acc < 2; acc++) {
            /* Tiles (cells > 16) and the gather (filters' 9 cells), both ways. */
            run_relayout(false, true, 40, db, false, 40, sb, 3, 37, acc);
            run_relayout(false, false, 40, db, true, 40, sb, 3, 37, acc);
            run_relayout(false, true, 96, db, false, 96, sb, 35, 9, acc);
            run_relayout(false, false, 96, db, true, 96, sb, 35, 9, acc);
            /* Channels padded (a stem's X and W) and dropped (dX, dW). */
            run_relayout(true, true, 8, db, false, 3, sb, 4, 50, acc);
            run_relayout(true, true, 8, db, true, 3, sb, 2, 49, acc);
            run_relayout(true, false, 3, db, true, 8, sb, 4, 50, acc);
            run_relayout(true, true, 5, db, true, 8, sb, 2, 13, acc);
            run_relayout(true, true, 8, db, false, 3, sb, 64, 49, acc);
            /* 16-byte pixels from planes (one store a pixel): float32's
             * 4 channels, bfloat16's 8 above. */
            run_relayout(true, true, 4, db, false, 3, sb, 5, 47, acc);
            run_relayout(true, true, 4, db, false, 4, sb, 3, 50, acc);
        }
    }
    run_relayout(true, true, 8, false, false, 3, true, 16, 224 * 224, false); /* a stem batch's image */
    run_relayout(true, true, 4, false, false, 3, false, 16, 224 * 224, false); /* float32's, into float32 */
}

/* gp_cuda_relayout_many on `count` float32 tensors [n, c, hw] of sizes
 * that vary (one empty), into dst of storage db, to channels-last or back,
 * onto dst's earlier values when acc: against the host, bit for bit. */
static void run_relayout_many(int count, bool to_nhwc, bool db, bool acc)
{
    enum { MAX = 80 };
    assert_true(count <= MAX);
    int64_t batch[MAX], channels[MAX], cells[MAX];
    void *dst[MAX];
    const float *src[MAX];
    float *sv[MAX], *dv[MAX];
    size_t ed = db ? 2 : 4;
    cudaStream_t st = new_stream();
    for (int t = 0; t < count; t++) {
        static const int64_t cs[] = {8, 16, 64, 3, 256}, hws[] = {9, 49, 1, 25, 9};
        batch[t] = t == 5 ? 0 : 1 + t % 7, channels[t] = cs[t % 5], cells[t] = hws[(t / 5) % 5];
        int64_t n = batch[t] * channels[t] * cells[t];
        sv[t] = xmalloc(sizeof(float) * (size_t)(n + 1));
        dv[t] = xmalloc(sizeof(float) * (size_t)(n + 1));
        char *dh = xmalloc(ed * (size_t)(n + 1));
        for (int64_t i = 0; i < n; i++) {
            sv[t][i] = normalish();
            float v = normalish();
            if (db) ((uint16_t *)dh)[i] = gp_float_to_bf16(v), v = gp_bf16_to_float(((uint16_t *)dh)[i]);
            else ((float *)dh)[i] = v;
            dv[t][i] = v;
        }
        src[t] = dev_copy(sv[t], sizeof(float) * (size_t)(n + 1));
        dst[t] = dev_copy(dh, ed * (size_t)(n + 1));
        free(dh);
    }
    struct gp_error err = {0};
    GP(gp_cuda_relayout_many(st, count, dst, db ? GP_DTYPE_BFLOAT16 : GP_DTYPE_FLOAT32, to_nhwc, src, batch, channels,
                             cells, acc, &err));
    assert_int_equal(cudaStreamSynchronize(st), cudaSuccess);
    for (int t = 0; t < count; t++) {
        int64_t n = batch[t] * channels[t] * cells[t], c = channels[t], hw = cells[t];
        char *got = xmalloc(ed * (size_t)(n + 1));
        assert_int_equal(cudaMemcpy(got, dst[t], ed * (size_t)(n + 1), cudaMemcpyDeviceToHost), cudaSuccess);
        for (int64_t b = 0; b < batch[t]; b++)
            for (int64_t ch = 0; ch < c; ch++)
                for (int64_t p = 0; p < hw; p++) {
                    int64_t d = layout_index(to_nhwc, c, hw, b, ch, p);
                    float v = sv[t][layout_index(!to_nhwc, c, hw, b, ch, p)];
                    if (acc) v = dv[t][d] + v;
                    bool same = db ? ((uint16_t *)got)[d] == gp_float_to_bf16(v)
                                   : !memcmp(&((float *)got)[d], &v, sizeof v);
                    if (!same)
                        fail_msg("relayout_many of %d (%s, %s%s): tensor %d [%lld, %lld, %lld] at (%lld, %lld, %lld)",
                                 count, to_nhwc ? "to channels-last" : "back", db ? "bfloat16" : "float32",
                                 acc ? ", accumulated" : "", t, (long long)batch[t], (long long)c, (long long)hw,
                                 (long long)b, (long long)ch, (long long)p);
                }
        free(got);
    }
    n_cases++;
    for (int t = 0; t < count; t++) {
        cudaFree((void *)src[t]);
        cudaFree(dst[t]);
        free(sv[t]), free(dv[t]);
    }
    cudaStreamDestroy(st);
}

/* One tensor, a launch's 32, and 80 (three launches), each way. */
static void test_relayout_many(void **state)
{
    (void)state;
    static const int counts[] = {1, 32, 80};
    for (int i = 0; i < 3; i++)
        for (int way = 0; way < 2; way++)
            for (int db = 0; db < 2; db++)
                for (int acc = 0; acc < 2; acc++) run_relayout_many(counts[i], way == 0, db, acc);
}

static void test_norms(void **state)
{
    (void)state;
    enum { COUNT = 230 }; /* more than one launch's list */
    int64_t sizes[COUNT];
    for (int k = 0; k < COUNT; k++) sizes[k] = 1 + (k * 37) % 300;
    sizes[0] = 0;
    sizes[1] = 1;
    sizes[2] = 7;
    sizes[3] = 8;
    sizes[4] = 65537;
    sizes[5] = (1 << 20) + 3;
    sizes[6] = 5000000;
    sizes[200] = 99999;
    const int misaligned = 7; /* its pointer is 4 bytes off 16 */
    int64_t off[COUNT], total = 0;
    for (int k = 0; k < COUNT; k++) {
        off[k] = total + (k == misaligned);
        total += (sizes[k] + 16) & ~(int64_t)15;
    }
    float *h = xmalloc(sizeof(float) * (size_t)total);
    for (int64_t i = 0; i < total; i++) h[i] = normalish() * (1.0f + (float)(i % 5));
    float *dh = dev_copy(h, sizeof(float) * (size_t)total);
    const float *ptrs[COUNT];
    for (int k = 0; k < COUNT; k++) ptrs[k] = dh + off[k];
    float *dout = dev_alloc(sizeof(float) * COUNT);
    cudaStream_t st = new_stream();
    struct gp_error err = {0};
    GP(gp_cuda_norms(st, ptrs, sizes, COUNT, dout, &err));
    sync_stream(st, "norms");
    float got[COUNT];
    to_host(got, dout, sizeof got);
    for (int k = 0; k < COUNT; k++) {
        const float *x = h + off[k];
        double s = 0;
        for (int64_t i = 0; i < sizes[k]; i++) s += (double)x[i] * (double)x[i];
        const double exact = sqrt(s);
        const float cpu = gp_norm2_f32(x, sizes[k]);
        if (!close_rel(got[k], exact, 1e-6, 0))
            fail_msg("norm of tensor %d (%lld elements): CUDA %.9g, double reference %.17g", k,
                     (long long)sizes[k], (double)got[k], exact);
        /* the CPU's float32 lanes drift from the exact norm as n grows */
        const double rel = sizes[k] <= 100000 ? 1e-6 : 1e-3;
        if (!close_rel(got[k], cpu, rel, 0))
            fail_msg("norm of tensor %d (%lld elements): CUDA %.9g, gp_norm2_f32 %.9g", k, (long long)sizes[k],
                     (double)got[k], (double)cpu);
    }
    n_cases++;
    assert_int_equal(gp_cuda_norms(st, ptrs, sizes, 0, dout, &err), GP_OK);
    CK(cudaFree(dh));
    CK(cudaFree(dout));
    CK(cudaStreamDestroy(st));
    free(h);
}

/* The same bits, or both NaN: a NaN's payload and sign are the hardware's
 * (the device's canonical NaN, the host's propagated one), and a NaN norm
 * skips the step whatever they are. */
static bool same_float(float a, float b) { return fbits(a) == fbits(b) || (isnan(a) && isnan(b)); }

/* One guard on the device against gp_optim_guard: the same scalars in,
 * total_norm, coef and skip out, compared bit for bit. */
static void run_guard(const float *norms, const int32_t *order, int n, const double *losses, int m,
                      double max_norm, double denominator, const char *what)
{
    /* order[] indexes the whole gathered array, not just its first n */
    int32_t top = 0;
    for (int i = 0; i < n; i++)
        if (order[i] > top) top = order[i];
    float *dn = dev_copy(norms, sizeof(float) * (size_t)(top + 1));
    int32_t *dorder = dev_copy(order, sizeof(int32_t) * (size_t)(n + 1));
    double *dl = dev_copy(losses, sizeof(double) * (size_t)(m + 1));
    struct gp_optim_scalars want, got;
    gp_optim_scalars_for(&(struct gp_optim_config){.kind = GP_OPTIM_SGD, .lr = 0.1}, 0.1, 3, &want);
    want.max_norm = max_norm;
    want.denominator = denominator;
    struct gp_optim_scalars *ds = dev_copy(&want, sizeof want);
    cudaStream_t st = new_stream();
    struct gp_error err = {0};
    GP(gp_cuda_optim_guard(st, dn, dorder, n, dl, m, ds, &err));
    sync_stream(st, what);
    to_host(&got, ds, sizeof got);
    gp_optim_guard(norms, order, n, losses, m, &want);
    if (!same_float(got.total_norm, want.total_norm) || !same_float(got.coef, want.coef) || got.skip != want.skip)
        fail_msg("%s (%d norms, max_norm %g): CUDA norm %.9g coef %.9g skip %d, CPU norm %.9g coef %.9g skip %d",
                 what, n, max_norm, (double)got.total_norm, (double)got.coef, got.skip, (double)want.total_norm,
                 (double)want.coef, want.skip);
    /* the host's part is read, never written */
    if (got.neg_lr != want.neg_lr || got.max_norm != max_norm || got.denominator != denominator)
        fail_msg("%s: the guard changed the host's scalars", what);
    n_cases++;
    CK(cudaFree(dn));
    CK(cudaFree(dorder));
    CK(cudaFree(dl));
    CK(cudaFree(ds));
    CK(cudaStreamDestroy(st));
}

static void test_optim_guard(void **state)
{
    (void)state;
    enum { MOST = 400 };
    float norms[MOST + 1];
    int32_t order[MOST + 1];
    /* Norms over many magnitudes (the last bits of a sum of squares
     * depend on the order), read in a shuffled order. */
    for (int i = 0; i < MOST; i++) norms[i] = fabsf(normalish()) * powf(10.0f, (float)(i % 9) - 4.0f);
    for (int i = 0; i < MOST; i++) order[i] = i;
    for (int i = MOST - 1; i > 0; i--) {
        int j = (int)(rng_next() % (uint64_t)(i + 1));
        int32_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    double losses[9] = {2.5, 1e-3, 7.0, 3.25, 0.125, 11.0, 4.0, 1.5, 0.0};
    static const double max_norms[4] = {0.0, 0.05, 1.0, 1e9};
    for (int n = 0; n <= 40; n++)
        for (int q = 0; q < 4; q++) run_guard(norms, order, n, losses, 8, max_norms[q], 96.0, "norm counts");
    static const int large[3] = {161, 257, MOST};
    for (int i = 0; i < 3; i++)
        for (int q = 1; q < 4; q++) run_guard(norms, order, large[i], losses, 8, max_norms[q], 96.0, "many norms");
    /* Divergence: a loss or a norm that is not finite sets skip; a
     * denominator of 0 (every label ignored) too, as the trainer's own
     * division gives NaN. */
    double bad[4] = {1.0, INFINITY, 2.0, 0.0};
    run_guard(norms, order, 12, bad, 3, 0.05, 4.0, "an infinite loss");
    bad[1] = NAN;
    run_guard(norms, order, 12, bad, 3, 0.0, 4.0, "a NaN loss, no clipping");
    run_guard(norms, order, 12, losses, 8, 0.5, 0.0, "a denominator of 0");
    float saved = norms[order[5]];
    norms[order[5]] = INFINITY;
    run_guard(norms, order, 12, losses, 8, 0.5, 96.0, "an infinite norm");
    run_guard(norms, order, 12, losses, 8, 0.0, 96.0, "an infinite norm, not clipping");
    norms[order[5]] = NAN;
    run_guard(norms, order, 12, losses, 8, 0.5, 96.0, "a NaN norm");
    norms[order[5]] = saved;
    norms[order[0]] = 3e19f; /* its square overflows float32 */
    run_guard(norms, order, 12, losses, 8, 0.5, 96.0, "a norm whose square overflows");
}

int main(void)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        printf("cuda_train_kernels: skipped: cudaGetDeviceCount failed: %s (%s)\n", cudaGetErrorString(e),
               cudaGetErrorName(e));
        return 77;
    }
    if (count == 0) {
        printf("cuda_train_kernels: skipped: no CUDA device\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fast_exp),
        cmocka_unit_test(test_cross_entropy), cmocka_unit_test(test_mse),
        cmocka_unit_test(test_output_loss),   cmocka_unit_test(test_bf16_losses),
        cmocka_unit_test(test_optimizers),    cmocka_unit_test(test_optim_guard),
        cmocka_unit_test(test_accumulate),    cmocka_unit_test(test_norms),
        cmocka_unit_test(test_relayout),      cmocka_unit_test(test_relayout_many),
        cmocka_unit_test(test_convert),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (failed) {
        printf("cuda_train_kernels: FAILED, %d test(s) failed (%d cases passed)\n", failed, n_cases);
        return 1;
    }
    printf("cuda_train_kernels: PASSED, %d tests (%d cases against the CPU functions: cross-entropy, mse, "
           "output loss, SGD/AdamW steps bit for bit, the step's guard bit for bit, accumulate, convert, norms)\n",
           (int)(sizeof tests / sizeof *tests),
           n_cases);
    return 0;
}
