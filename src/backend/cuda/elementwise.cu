/* CUDA kernels: the elementwise family, twin of backend/cpu/elementwise.c:
 * unary ops, Clip, Cast/CastLike, Identity (the broadcasting ops are in
 * binary.cu). Same formulas as the CPU kernels, term for term, so that the
 * two agree to a few ulps: the CPU build is the reference the tests hold
 * these to. Every tensor is [n] elements in row-major order.
 *
 * Types: float tensors are float32 on the device (every float dtype, as
 * plan.c lays them out); integer and bool tensors keep their types, and
 * the ops the CPU runs on them (Relu/Neg/Abs/Sign/Erf/Not, Clip, Cast) do
 * the same here through the same int64 / double conversions.
 *
 * bfloat16 (a bf16 stage; every entry sets bf16_any): each float tensor is
 * float32 or bfloat16 as ctx->*_dt says. The kernels are instantiated for
 * float32 throughout (the float32 path, unchanged), bfloat16 throughout,
 * and a mix (each tensor a gp_fptr): loads widen, arithmetic is float32 as
 * above, each stored value is rounded once to nearest even, and din +=
 * adds the float32 term to the widened gradient and rounds once: what the
 * float32 kernels gave on widened copies rounded back (a staged call).
 *
 * Rounding: nvcc contracts a * b + c into one FMA, which the CPU build does
 * not; where a product feeds a sum (Gelu, HardSigmoid, Tanh's gradient,
 * every += into din) the operations are spelled with __fmul_rn /
 * __fadd_rn, which are never contracted, so only the math library's ulps
 * differ from the CPU. */
#include <float.h>
#include <initializer_list>
#include <math.h>
#include <string.h>

#include <cuda_runtime.h>

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/elementwise_storage.cuh"
#include "backend/cuda/kernel.h"
#include "backend/cuda/kernel_util.cuh"

extern "C" {
#include "ops/backward_reads.h"
#include "ops/fold_util.h"
}

#define THREADS GP_CUDA_THREADS
#define blocks_for gp_cuda_blocks_for
#define GRID_STRIDE GP_GRID_STRIDE

static const struct gp_value *in_value(const struct gp_cuda_ctx *c, int i)
{
    return gp_node_input(c->graph, c->node, i);
}

static const struct gp_value *out_value(const struct gp_cuda_ctx *c, int i)
{
    return gp_node_output(c->graph, c->node, i);
}

static bool is_float(enum gp_dtype dt) { return gp_dtype_is_float(dt); }

static bool in16(const struct gp_cuda_ctx *c, int k) { return gp_cuda_is_bf16(c->in_dt, k); }
static bool out16(const struct gp_cuda_ctx *c, int k) { return gp_cuda_is_bf16(c->out_dt, k); }
static bool din16(const struct gp_cuda_ctx *c, int k) { return gp_cuda_is_bf16(c->din_dt, k); }
static bool dout16(const struct gp_cuda_ctx *c, int k) { return gp_cuda_is_bf16(c->dout_dt, k); }

/* ---- unary ---- */

enum uop {
    U_RELU, U_LEAKY, U_SIGMOID, U_TANH, U_ERF, U_GELU, U_SQRT, U_NEG, U_EXP, U_LOG, U_ABS,
    U_RECIP, U_SOFTPLUS, U_ELU, U_HARDSIGMOID, U_HARDSWISH, U_FLOOR, U_CEIL, U_ROUND, U_SIGN, U_NOT, U_NONE,
};

static enum uop uop_of(const char *op_type)
{
    static const char *const names[] = {
        "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Erf", "Gelu", "Sqrt", "Neg", "Exp", "Log", "Abs",
        "Reciprocal", "Softplus", "Elu", "HardSigmoid", "HardSwish", "Floor", "Ceil", "Round", "Sign", "Not"};
    for (int k = 0; k < U_NONE; k++)
        if (strcmp(names[k], op_type) == 0) return (enum uop)k;
    return U_NONE;
}

struct uparams {
    int op;
    float alpha, beta;
    bool tanh_gelu;
};

static struct uparams uparams_of(const struct gp_node *node, enum uop op)
{
    struct uparams p;
    p.op = op;
    p.alpha = gp_node_attr_float(node, "alpha", op == U_LEAKY ? 0.01f : op == U_HARDSIGMOID ? 0.2f : 1.0f);
    p.beta = gp_node_attr_float(node, "beta", 0.5f);
    p.tanh_gelu = strcmp(gp_node_attr_string(node, "approximate", "none"), "tanh") == 0;
    return p;
}

/* The CPU's constants, rounded to float as R() does there. */
#define GELU_BETA ((float)0.7978845608028654)
#define GELU_KAPPA ((float)0.044715)
#define SQRT1_2F ((float)M_SQRT1_2)
#define GELU_PDF ((float)(0.5 * M_2_SQRTPI * M_SQRT1_2))

__device__ static inline float sigmoidf_(float x)
{
    return x >= 0 ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x));
}

/* tanh(beta (x + kappa x^3)), the products in the CPU's order. */
__device__ static inline float gelu_tanh_t(float x)
{
    float x3 = __fmul_rn(__fmul_rn(__fmul_rn(GELU_KAPPA, x), x), x);
    return tanhf(__fmul_rn(GELU_BETA, __fadd_rn(x, x3)));
}

/* 0.5 (1 + t) + 0.5 x (1 - t^2) beta (1 + 3 kappa x^2), as the CPU's
 * gelu_tanh_grad. */
__device__ static inline float gelu_tanh_grad(float x)
{
    float t = gelu_tanh_t(x);
    float k3 = 3.0f * GELU_KAPPA;
    float du = __fmul_rn(GELU_BETA, __fadd_rn(1.0f, __fmul_rn(__fmul_rn(k3, x), x)));
    float a = __fmul_rn(0.5f, __fadd_rn(1.0f, t));
    float b = __fmul_rn(__fmul_rn(__fmul_rn(0.5f, x), __fsub_rn(1.0f, __fmul_rn(t, t))), du);
    return __fadd_rn(a, b);
}

/* Gelu's erf form, 0.5 x (1 + erf(x / sqrt 2)), and its tanh form. */
__device__ static inline float gelu_erf(float x)
{
    return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, erff(__fmul_rn(x, SQRT1_2F))));
}

__device__ static inline float gelu_tanh(float x)
{
    return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, gelu_tanh_t(x)));
}

/* Phi(x) + x phi(x), as the CPU's erf-form gradient. */
__device__ static inline float gelu_erf_grad(float x)
{
    float cdf = __fmul_rn(0.5f, __fadd_rn(1.0f, erff(__fmul_rn(x, SQRT1_2F))));
    float pdf = __fmul_rn(__fmul_rn(x, expf(__fmul_rn(__fmul_rn(-0.5f, x), x))), GELU_PDF);
    return __fadd_rn(cdf, pdf);
}

/* The op is uniform across the grid, so the switches below never diverge. */
__device__ static inline float unary_f(const struct uparams &p, float x)
{
    float a = p.alpha;
    switch (p.op) {
    case U_RELU: return x > 0 || x != x ? x : 0.0f;
    case U_LEAKY: return x < 0 ? a * x : x;
    case U_SIGMOID: return sigmoidf_(x);
    case U_TANH: return tanhf(x);
    case U_ERF: return erff(x);
    case U_GELU: return p.tanh_gelu ? gelu_tanh(x) : gelu_erf(x);
    case U_SQRT: return sqrtf(x);
    case U_NEG: return -x;
    case U_EXP: return expf(x);
    case U_LOG: return logf(x);
    case U_ABS: return fabsf(x);
    case U_RECIP: return 1.0f / x;
    case U_SOFTPLUS: return x > 0 ? __fadd_rn(x, log1pf(expf(-x))) : log1pf(expf(x));
    case U_ELU: return x < 0 ? a * expm1f(x) : x;
    case U_HARDSIGMOID: return fmaxf(0.0f, fminf(1.0f, __fadd_rn(__fmul_rn(a, x), p.beta)));
    case U_HARDSWISH: return __fdiv_rn(__fmul_rn(x, fminf(fmaxf(__fadd_rn(x, 3.0f), 0.0f), 6.0f)), 6.0f);
    case U_FLOOR: return floorf(x);
    case U_CEIL: return ceilf(x);
    case U_ROUND: return rintf(x); /* halves to even */
    case U_SIGN: return x > 0 ? 1.0f : x < 0 ? -1.0f : x;
    default: return 0.0f;
    }
}

/* dy * f'(x), reading the forward output y where the CPU kernel does. */
__device__ static inline float unary_grad(const struct uparams &p, float x, float y, float dy)
{
    float a = p.alpha;
    switch (p.op) {
    case U_RELU: return y > 0 ? dy : 0.0f;
    case U_LEAKY: return (a >= 0 ? y : x) > 0 ? dy : a * dy; /* gp_unary_grad_reads */
    case U_SIGMOID: return dy * (1.0f - y) * y;
    case U_TANH: return dy * __fsub_rn(1.0f, __fmul_rn(y, y));
    case U_ERF: return dy * (float)M_2_SQRTPI * expf(-x * x);
    case U_GELU: return __fmul_rn(dy, p.tanh_gelu ? gelu_tanh_grad(x) : gelu_erf_grad(x));
    case U_SQRT: return dy / (2.0f * y);
    case U_NEG: return -dy;
    case U_EXP: return dy * y;
    case U_LOG: return dy / x;
    case U_ABS: return x > 0 ? dy : x < 0 ? -dy : 0.0f;
    case U_RECIP: return -dy * (y * y);
    case U_SOFTPLUS: return dy * sigmoidf_(x);
    case U_ELU: return x > 0 ? dy : dy * a * expf(x);
    case U_HARDSIGMOID: {
        float v = __fadd_rn(__fmul_rn(a, x), p.beta);
        return v > 0 && v < 1 ? dy * a : 0.0f;
    }
    case U_HARDSWISH: return x < -3.0f ? 0.0f : x <= 3.0f ? __fmul_rn(dy, __fadd_rn(__fdiv_rn(x, 3.0f), 0.5f)) : dy;
    default: return 0.0f;
    }
}

/* The formula a runs kernel computes: FIX_ANY, whichever p.op says, or one
 * op fixed when the kernel is compiled (Gelu, a transformer's costliest
 * activation: GPT-2's [16, 1024, 3072] four times per layer and pass).
 * The switch above, inlined into each of a thread's 32 values, makes the
 * generic kernel carry every op's code and a dispatch per value: the
 * bfloat16 forward is 15,303 PTX instructions against 1,059 fixed to
 * Gelu's erf form (backward 4,796 against 1,017), and Gelu ran at 1.1 TB/s
 * (forward) and 1.3 TB/s (backward) where a kernel moving the same bytes
 * with an add per value reaches 3.5. Fixed, the kernel is the formula's
 * own instructions: erff and a few multiplies forward, erff, expf and a
 * few more backward. The same functions compute each value either way, so
 * the results are the same bits. */
enum ufix { FIX_ANY, FIX_GELU_ERF, FIX_GELU_TANH };

static enum ufix ufix_of(const struct uparams &p)
{
    if (p.op != U_GELU) return FIX_ANY;
    return p.tanh_gelu ? FIX_GELU_TANH : FIX_GELU_ERF;
}

template <int F> __device__ static inline float unary_fx(const struct uparams &p, float x)
{
    if (F == FIX_GELU_ERF) return gelu_erf(x);
    if (F == FIX_GELU_TANH) return gelu_tanh(x);
    return unary_f(p, x);
}

template <int F> __device__ static inline float unary_gradx(const struct uparams &p, float x, float y, float dy)
{
    if (F == FIX_GELU_ERF) return __fmul_rn(dy, gelu_erf_grad(x));
    if (F == FIX_GELU_TANH) return __fmul_rn(dy, gelu_tanh_grad(x));
    return unary_grad(p, x, y, dy);
}

/* X [n] -> Y [n]; S the storage of both. */
template <class S>
__global__ static void unary_forward_kernel(struct uparams p, typename stor<S>::ptr X, typename stor<S>::ptr Y,
                                            int64_t n)
{
    GP_GRID_STRIDE_ILP(i0, st, n)
    {
        float x[GP_ILP];
#pragma unroll
        for (int u = 0; u < GP_ILP; u++) x[u] = i0 + u * st < n ? ldf(X, i0 + u * st) : 0.0f;
#pragma unroll
        for (int u = 0; u < GP_ILP; u++)
            if (i0 + u * st < n) stf(Y, i0 + u * st, unary_f(p, x[u]));
    }
}

/* dX [n] += dY [n] * f'(X) (with `ow`, dX = 0 + that: dX not read); X, Y
 * the forward input and output (each read only where has_x, has_y: the
 * gradients that use it, gp_unary_grad_reads); S the storage of all. */
template <class S>
__global__ static void unary_backward_kernel(struct uparams p, typename stor<S>::ptr X, bool has_x,
                                             typename stor<S>::ptr Y, bool has_y, typename stor<S>::ptr dY,
                                             typename stor<S>::ptr dX, int64_t n, bool ow)
{
    GP_GRID_STRIDE_ILP(i0, st, n)
    {
        float x[GP_ILP], y[GP_ILP], dy[GP_ILP], dx[GP_ILP];
#pragma unroll
        for (int u = 0; u < GP_ILP; u++) {
            int64_t i = i0 + u * st;
            bool in = i < n;
            x[u] = in && has_x ? ldf(X, i) : 0.0f;
            y[u] = in && has_y ? ldf(Y, i) : 0.0f;
            dy[u] = in ? ldf(dY, i) : 0.0f;
            dx[u] = in && !ow ? ldf(dX, i) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < GP_ILP; u++)
            if (i0 + u * st < n) stf(dX, i0 + u * st, __fadd_rn(dx[u], unary_grad(p, x[u], y[u], dy[u])));
    }
}

/* The same two passes on runs of 8 values (one 16-byte access of
 * bfloat16, two of float32), for a launch whose tensors are all of one
 * storage S, n a multiple of 8, aligned (gp_runs_fit): one value per
 * access leaves most of the memory system's bandwidth unused. Each value
 * is computed as above, so the results are the same bits. */
#define RUN 8
template <class S, int F>
__global__ static void unary_forward_runs_kernel(struct uparams p, const S *X, S *Y, int64_t runs)
{
    GP_GRID_STRIDE_ILP(r0, st, runs)
    {
        float x[GP_ILP][RUN];
#pragma unroll
        for (int u = 0; u < GP_ILP; u++)
            if (r0 + u * st < runs) gp_run<S, RUN>::load(X, (r0 + u * st) * RUN, x[u]);
#pragma unroll
        for (int u = 0; u < GP_ILP; u++) {
            if (r0 + u * st >= runs) continue;
#pragma unroll
            for (int k = 0; k < RUN; k++) x[u][k] = unary_fx<F>(p, x[u][k]);
            gp_run<S, RUN>::store(Y, (r0 + u * st) * RUN, x[u]);
        }
    }
}

/* Two runs in flight per thread (four tensors' worth of registers). */
template <class S, int F>
__global__ static void unary_backward_runs_kernel(struct uparams p, const S *X, const S *Y, const S *dY, S *dX,
                                                  int64_t runs, bool ow)
{
    const int64_t st = (int64_t)gridDim.x * blockDim.x;
    for (int64_t r0 = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r0 < runs; r0 += 2 * st) {
        float x[2][RUN], y[2][RUN], dy[2][RUN], dx[2][RUN];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int64_t r = r0 + u * st;
            if (r >= runs) continue;
            if (X)
                gp_run<S, RUN>::load(X, r * RUN, x[u]);
            else
#pragma unroll
                for (int k = 0; k < RUN; k++) x[u][k] = 0.0f;
            gp_run<S, RUN>::load(dY, r * RUN, dy[u]);
            if (Y)
                gp_run<S, RUN>::load(Y, r * RUN, y[u]);
            else
#pragma unroll
                for (int k = 0; k < RUN; k++) y[u][k] = 0.0f;
            if (ow)
#pragma unroll
                for (int k = 0; k < RUN; k++) dx[u][k] = 0.0f;
            else
                gp_run<S, RUN>::load(dX, r * RUN, dx[u]);
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int64_t r = r0 + u * st;
            if (r >= runs) continue;
#pragma unroll
            for (int k = 0; k < RUN; k++) dx[u][k] = __fadd_rn(dx[u][k], unary_gradx<F>(p, x[u][k], y[u][k], dy[u][k]));
            gp_run<S, RUN>::store(dX, r * RUN, dx[u]);
        }
    }
}

/* The runs kernels' launches: X [n] -> Y [n] (n / RUN runs, ILP of them
 * per thread and pass), and dX from X, Y (NULL where the gradient does not
 * read it) and dY (two runs per thread and pass). */
template <class S, int F>
static void launch_forward_runs(const struct gp_cuda_ctx *c, const struct uparams &p, int64_t n)
{
    unary_forward_runs_kernel<S, F><<<gp_cuda_blocks_ilp(n / RUN), THREADS, 0, c->stream>>>(
        p, (const S *)c->in[0], (S *)c->out[0], n / RUN);
}

template <class S, int F>
static void launch_backward_runs(const struct gp_cuda_ctx *c, const struct uparams &p, const void *xp, const void *yp,
                                 int64_t n, bool ow)
{
    unary_backward_runs_kernel<S, F><<<gp_cuda_blocks_for((n / RUN + 1) / 2), THREADS, 0, c->stream>>>(
        p, (const S *)xp, (const S *)yp, (const S *)c->dout[0], (S *)c->din[0], n / RUN, ow);
}

/* Runs the statement with the constant F set to the ufix value f. */
#define WITH_FIX(f, ...)                                                      \
    do {                                                                      \
        if ((f) == FIX_GELU_ERF) {                                            \
            constexpr int F = FIX_GELU_ERF;                                   \
            __VA_ARGS__;                                                      \
        } else if ((f) == FIX_GELU_TANH) {                                    \
            constexpr int F = FIX_GELU_TANH;                                  \
            __VA_ARGS__;                                                      \
        } else {                                                              \
            constexpr int F = FIX_ANY;                                        \
            __VA_ARGS__;                                                      \
        }                                                                     \
    } while (0)

/* Integer and bool inputs: element by element through int64, wrapping like
 * the store (Erf through double, as the CPU). */
__global__ static void unary_int_kernel(int op, int dt, bool unsig, const void *X, void *Y, int64_t n)
{
    GRID_STRIDE(i, n)
    {
        int64_t x = gp_dev_load_i64(X, dt, i), y;
        switch (op) {
        case U_RELU: y = unsig || x > 0 ? x : 0; break;
        case U_NEG: y = (int64_t)(0 - (uint64_t)x); break;
        case U_ABS: y = unsig || x >= 0 ? x : (int64_t)(0 - (uint64_t)x); break;
        case U_SIGN: y = unsig ? x != 0 : (x > 0) - (x < 0); break;
        case U_NOT: y = !x; break;
        default: gp_dev_store_f64(Y, dt, i, erf(gp_dev_load_f64(X, dt, i))); continue; /* U_ERF */
        }
        gp_dev_store_i64(Y, dt, i, y);
    }
}

static gp_status unary_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    enum uop op = uop_of(c->node->op_type);
    if (op == U_NONE) return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "not a unary op");
    enum gp_dtype dt = in_value(c, 0)->dtype;
    int64_t n = gp_shape_numel(&in_value(c, 0)->shape);
    if (!is_float(dt)) {
        if (op != U_RELU && op != U_NEG && op != U_ABS && op != U_SIGN && op != U_NOT && op != U_ERF)
            return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "%s input", gp_dtype_name(dt));
        if (n == 0) return GP_OK;
        bool unsig = dt == GP_DTYPE_UINT8 || dt == GP_DTYPE_UINT16 || dt == GP_DTYPE_UINT32 ||
                     dt == GP_DTYPE_UINT64 || dt == GP_DTYPE_BOOL;
        unary_int_kernel<<<blocks_for(n), THREADS, 0, c->stream>>>(op, (int)dt, unsig, c->in[0],
                                                                  c->out[0], n);
        return gp_cuda_check_launch(c, "unary forward (integer)", err);
    }
    if (op == U_NOT) return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "floating-point input");
    if (n == 0) return GP_OK;
    struct uparams p = uparams_of(c->node, op);
    enum stor_kind k = stor_of({in16(c, 0), out16(c, 0)});
    if (k != STOR_MIX && gp_runs_fit(n, RUN, k == STOR_BF16 ? 2 : 4, {c->in[0], c->out[0]})) {
        enum ufix f = ufix_of(p);
        if (k == STOR_BF16)
            WITH_FIX(f, launch_forward_runs<__nv_bfloat16, F>(c, p, n));
        else
            WITH_FIX(f, launch_forward_runs<float, F>(c, p, n));
        return gp_cuda_check_launch(c, "unary forward", err);
    }
    WITH_STOR(k,
              unary_forward_kernel<S><<<gp_cuda_blocks_ilp(n), THREADS, 0, c->stream>>>(
                  p, stor_ptr<S>(c->in[0], in16(c, 0)), stor_ptr<S>(c->out[0], out16(c, 0)), n));
    return gp_cuda_check_launch(c, "unary forward", err);
}

/* Floor, Ceil, Round and Sign have zero gradient (their input is marked
 * non-differentiable): nothing to add (zeros to write when asked to write
 * dX whole, as without dY). */
static gp_status unary_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    enum uop op = uop_of(c->node->op_type);
    if (op == U_NONE || op == U_NOT) return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "no gradient");
    if (!c->din[0]) return GP_OK;
    int64_t n = gp_shape_numel(&in_value(c, 0)->shape);
    bool ow = gp_cuda_overwrite(c, 0);
    if (!c->dout[0] || op == U_FLOOR || op == U_CEIL || op == U_ROUND || op == U_SIGN) {
        if (!ow || n == 0) return GP_OK;
        return gp_cuda_call(c, cudaMemsetAsync(c->din[0], 0, (size_t)n * (din16(c, 0) ? 2 : 4), c->stream),
                            "cudaMemsetAsync", err);
    }
    if (n == 0) return GP_OK;
    struct uparams p = uparams_of(c->node, op);
    /* Only what gp_unary_grad_reads names: the executor keeps no more. */
    bool rx, ry;
    gp_unary_grad_reads(c->node, &rx, &ry);
    bool x16 = in16(c, 0), y16 = out16(c, 0), dy16 = dout16(c, 0), dx16 = din16(c, 0);
    enum stor_kind k = stor_of({rx ? x16 : dy16, ry ? y16 : dy16, dy16, dx16});
    const void *xp = rx ? c->in[0] : NULL, *yp = ry ? c->out[0] : NULL;
    if (k != STOR_MIX && gp_runs_fit(n, RUN, k == STOR_BF16 ? 2 : 4, {xp, yp, c->dout[0], c->din[0]})) {
        enum ufix f = ufix_of(p);
        if (k == STOR_BF16)
            WITH_FIX(f, launch_backward_runs<__nv_bfloat16, F>(c, p, xp, yp, n, ow));
        else
            WITH_FIX(f, launch_backward_runs<float, F>(c, p, xp, yp, n, ow));
        return gp_cuda_check_launch(c, "unary backward", err);
    }
    WITH_STOR(k,
              unary_backward_kernel<S><<<gp_cuda_blocks_ilp(n), THREADS, 0, c->stream>>>(
                  p, stor_ptr<S>(xp, x16), rx, stor_ptr<S>(yp, y16), ry, stor_ptr<S>(c->dout[0], dy16),
                  stor_ptr<S>(c->din[0], dx16), n, ow));
    return gp_cuda_check_launch(c, "unary backward", err);
}

/* ---- Clip ---- */

/* A bound: the scalar input b (either storage) when present, else the
 * attribute's value a. */
__device__ static inline float clip_bound(gp_fptr b, float a) { return b.p ? gp_ld(b, 0) : a; }

/* Y = min(max(X, lo), hi), hi winning when lo > hi. Bounds: the optional
 * scalar inputs 1 and 2 (Clip-11+, device memory, read by the kernel) or
 * the attributes min/max (Clip-6, defaulting to float's range). S: the
 * storage of X and Y. */
template <class S>
__global__ static void clip_forward_kernel(typename stor<S>::ptr X, typename stor<S>::ptr Y, int64_t n,
                                           gp_fptr lop, gp_fptr hip, float lo_a, float hi_a)
{
    float lo = clip_bound(lop, lo_a), hi = clip_bound(hip, hi_a);
    GRID_STRIDE(i, n)
    {
        float x = ldf(X, i);
        stf(Y, i, x < lo ? (lo > hi ? hi : lo) : x > hi ? hi : x);
    }
}

__global__ static void clip_int_kernel(const void *X, void *Y, int dt, int64_t n, const void *lop,
                                       const void *hip)
{
    bool u64 = dt == GP_DTYPE_UINT64;
    GRID_STRIDE(i, n)
    {
        int64_t v = gp_dev_load_i64(X, dt, i);
        if (lop) {
            int64_t lo = gp_dev_load_i64(lop, dt, 0);
            if (u64 ? (uint64_t)v < (uint64_t)lo : v < lo) v = lo;
        }
        if (hip) {
            int64_t hi = gp_dev_load_i64(hip, dt, 0);
            if (u64 ? (uint64_t)v > (uint64_t)hi : v > hi) v = hi;
        }
        gp_dev_store_i64(Y, dt, i, v);
    }
}

/* dX += dY where lo <= X <= hi (the bounds pass the gradient); S: the
 * storage of X, dY and dX. */
template <class S>
__global__ static void clip_backward_kernel(typename stor<S>::ptr X, typename stor<S>::ptr dY,
                                            typename stor<S>::ptr dX, int64_t n, gp_fptr lop, gp_fptr hip,
                                            float lo_a, float hi_a)
{
    float lo = clip_bound(lop, lo_a), hi = clip_bound(hip, hi_a);
    GRID_STRIDE(i, n)
    {
        float x = ldf(X, i);
        stf(dX, i, __fadd_rn(ldf(dX, i), x >= lo && x <= hi ? ldf(dY, i) : 0.0f));
    }
}

static const void *opt_in(const struct gp_cuda_ctx *c, int i)
{
    return c->node->n_inputs > i ? c->in[i] : NULL;
}

/* Float bound input i (1: min, 2: max) with its storage; p NULL when omitted. */
static gp_fptr opt_bound(const struct gp_cuda_ctx *c, int i)
{
    gp_fptr t = {(void *)opt_in(c, i), c->node->n_inputs > i && in16(c, i)};
    return t;
}

static gp_status clip_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    int64_t n = gp_shape_numel(&in_value(c, 0)->shape);
    enum gp_dtype dt = in_value(c, 0)->dtype;
    if (n == 0) return GP_OK;
    if (!is_float(dt)) {
        clip_int_kernel<<<blocks_for(n), THREADS, 0, c->stream>>>(c->in[0], c->out[0], (int)dt, n,
                                                                 opt_in(c, 1), opt_in(c, 2));
        return gp_cuda_check_launch(c, "Clip forward (integer)", err);
    }
    float lo_a = gp_node_attr_float(c->node, "min", -FLT_MAX), hi_a = gp_node_attr_float(c->node, "max", FLT_MAX);
    WITH_STOR(stor_of({in16(c, 0), out16(c, 0)}),
              clip_forward_kernel<S><<<blocks_for(n), THREADS, 0, c->stream>>>(
                  stor_ptr<S>(c->in[0], in16(c, 0)), stor_ptr<S>(c->out[0], out16(c, 0)), n, opt_bound(c, 1),
                  opt_bound(c, 2), lo_a, hi_a));
    return gp_cuda_check_launch(c, "Clip forward", err);
}

static gp_status clip_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->dout[0] || !c->din[0]) return GP_OK;
    int64_t n = gp_shape_numel(&in_value(c, 0)->shape);
    if (n == 0) return GP_OK;
    float lo_a = gp_node_attr_float(c->node, "min", -FLT_MAX), hi_a = gp_node_attr_float(c->node, "max", FLT_MAX);
    bool x16 = in16(c, 0), dy16 = dout16(c, 0), dx16 = din16(c, 0);
    WITH_STOR(stor_of({x16, dy16, dx16}),
              clip_backward_kernel<S><<<blocks_for(n), THREADS, 0, c->stream>>>(
                  stor_ptr<S>(c->in[0], x16), stor_ptr<S>(c->dout[0], dy16), stor_ptr<S>(c->din[0], dx16), n,
                  opt_bound(c, 1), opt_bound(c, 2), lo_a, hi_a));
    return gp_cuda_check_launch(c, "Clip backward", err);
}

/* ---- Cast, CastLike, Identity ---- */

/* Element i of a tensor of dtype dt as double, and a double stored into
 * one: as gp_dev_load_f64 / gp_dev_store_f64, a float tensor stored as
 * bfloat16 where bf16 says (the store rounds to float32 first, then to
 * bfloat16: what a float32 copy rounded back gave). */
__device__ static inline double cast_load(const void *p, int dt, bool bf16, int64_t i)
{
    return bf16 ? (double)__bfloat162float(((const __nv_bfloat16 *)p)[i]) : gp_dev_load_f64(p, dt, i);
}

__device__ static inline void cast_store(void *p, int dt, bool bf16, int64_t i, double v)
{
    if (bf16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn((float)v);
    else gp_dev_store_f64(p, dt, i, v);
}

/* X [n] of any type -> Y [n] of the output's type: float to integer
 * truncates toward zero (saturating), anything to bool is X != 0, integer
 * to float goes through double as on the CPU. x16, y16: float X, Y stored
 * as bfloat16 (then via_f64). */
__global__ static void cast_kernel(const void *X, int from, bool x16, void *Y, int to, bool y16, bool via_f64,
                                   int64_t n)
{
    if (via_f64) {
        GRID_STRIDE(i, n) cast_store(Y, to, y16, i, cast_load(X, from, x16, i));
    } else {
        GRID_STRIDE(i, n) gp_dev_store_i64(Y, to, i, gp_dev_load_i64(X, from, i));
    }
}

/* Bytes of an element of a tensor of dtype dt on the device, bfloat16 where
 * bf16 says. */
static size_t stored_size(enum gp_dtype dt, bool bf16)
{
    return is_float(dt) ? gp_cuda_float_size(bf16) : gp_dtype_size(dt);
}

/* A copy where the stored types agree (float to float of one storage, or
 * one integer type), else the conversion kernel. */
static gp_status cast_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    int64_t n = gp_shape_numel(&in_value(c, 0)->shape);
    enum gp_dtype from = in_value(c, 0)->dtype, to = out_value(c, 0)->dtype;
    if (n == 0) return GP_OK;
    bool x16 = is_float(from) && in16(c, 0), y16 = is_float(to) && out16(c, 0);
    if (x16 == y16 && gp_cuda_esize(from) == gp_cuda_esize(to) &&
        (from == to || (is_float(from) && is_float(to)))) {
        if (c->out[0] == c->in[0]) return GP_OK;
        return gp_cuda_call(c, cudaMemcpyAsync(c->out[0], c->in[0], (size_t)n * stored_size(to, y16),
                                            cudaMemcpyDeviceToDevice, c->stream),
                         "cudaMemcpyAsync", err);
    }
    bool via_f64 = is_float(from) || is_float(to) || from == GP_DTYPE_UINT64;
    cast_kernel<<<blocks_for(n), THREADS, 0, c->stream>>>(c->in[0], (int)from, x16, c->out[0], (int)to, y16,
                                                         via_f64, n);
    return gp_cuda_check_launch(c, "Cast forward", err);
}

/* dX [n] += dY [n]; S the storage of both. */
template <class S>
__global__ static void add_into_kernel(typename stor<S>::ptr dY, typename stor<S>::ptr dX, int64_t n)
{
    GRID_STRIDE(i, n) stf(dX, i, __fadd_rn(ldf(dX, i), ldf(dY, i)));
}

/* The gradient passes through float-to-float casts (and Identity on
 * floats); a cast to or from an integer type has none. */
static gp_status cast_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->dout[0] || !c->din[0] || !is_float(in_value(c, 0)->dtype)) return GP_OK;
    int64_t n = gp_shape_numel(&in_value(c, 0)->shape);
    if (n == 0) return GP_OK;
    bool dy16 = dout16(c, 0), dx16 = din16(c, 0);
    WITH_STOR(stor_of({dy16, dx16}),
              add_into_kernel<S><<<blocks_for(n), THREADS, 0, c->stream>>>(stor_ptr<S>(c->dout[0], dy16),
                                                                          stor_ptr<S>(c->din[0], dx16), n));
    return gp_cuda_check_launch(c, "gradient pass-through", err);
}

/* X [n] -> Y [n], any dtype: a device-to-device copy on the stream (a
 * float tensor between float32 and bfloat16 storage: Cast's conversion). */
static gp_status identity_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    const struct gp_value *x = in_value(c, 0);
    if (is_float(x->dtype) && in16(c, 0) != out16(c, 0)) return cast_forward(c, err);
    size_t bytes = (size_t)gp_shape_numel(&x->shape) * stored_size(x->dtype, in16(c, 0));
    if (bytes == 0 || c->out[0] == c->in[0]) return GP_OK;
    return gp_cuda_call(c, cudaMemcpyAsync(c->out[0], c->in[0], bytes, cudaMemcpyDeviceToDevice, c->stream),
                     "cudaMemcpyAsync", err);
}

/* ---- the table ---- */

/* The last field: bf16_any (any mix of bfloat16 and float32 storage). */
#define UNARY(op) {op, NULL, NULL, unary_forward, unary_backward, false, true, false, gp_cuda_overwrites_input0}
#define NO_GRAD(op, fwd) {op, NULL, NULL, fwd, NULL, false, true}

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_elementwise[] = {
    UNARY("Relu"), UNARY("LeakyRelu"), UNARY("Sigmoid"), UNARY("Tanh"), UNARY("Erf"),
    UNARY("Gelu"), UNARY("Sqrt"), UNARY("Neg"), UNARY("Exp"), UNARY("Log"), UNARY("Abs"),
    UNARY("Reciprocal"), UNARY("Softplus"), UNARY("Elu"), UNARY("HardSigmoid"), UNARY("HardSwish"),
    /* Zero gradient; the op layer marks their input non-differentiable. */
    UNARY("Floor"), UNARY("Ceil"), UNARY("Round"), UNARY("Sign"),
    NO_GRAD("Not", unary_forward),

    {"Clip", NULL, NULL, clip_forward, clip_backward, false, true},
    {"Cast", NULL, NULL, cast_forward, cast_backward, false, true},
    {"CastLike", NULL, NULL, cast_forward, cast_backward, false, true},
    {"Identity", NULL, NULL, identity_forward, cast_backward, false, true},
    {NULL, NULL, NULL, NULL, NULL},
};
