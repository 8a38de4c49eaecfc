/* CUDA kernels: the elementwise family, twin of backend/cpu/elementwise.c
 * (unary ops, Clip, Cast/CastLike, Identity) and backend/cpu/binary.c (the
 * broadcasting ops: binary arithmetic, comparisons and logic, variadic
 * Max/Min/Sum/Mean, Where, Expand). Same formulas as the CPU kernels, term
 * for term, so that the two agree to a few ulps: the CPU build is the
 * reference the tests hold these to.
 *
 * Types: float tensors are float32 on the device (every float dtype, as
 * plan.c lays them out); integer and bool tensors keep their types, and
 * the ops the CPU runs on them (Relu/Neg/Abs/Sign/Erf/Not, integer
 * arithmetic, comparisons, logic, Max/Min, Clip, Cast, Where, Expand) do
 * the same here through the same int64 / double conversions.
 *
 * Rounding: nvcc contracts a * b + c into one FMA, which the CPU build does
 * not; where a product feeds a sum (Gelu, HardSigmoid, Tanh's gradient,
 * every += into din) the operations are spelled with __fmul_rn /
 * __fadd_rn, which are never contracted, so only the math library's ulps
 * differ from the CPU.
 *
 * Broadcasting: one plan (bplan, the CPU's: size-1 axes dropped, axes
 * merged where every operand is contiguous across them) over up to four
 * operands serves every broadcasting op; forward kernels take a functor
 * (the op) and the plan. The gradient of a broadcast input is the sum of
 * its terms over the axes it was broadcast along, in double in row-major
 * order as on the CPU: an input that is not broadcast gets its one term
 * per element through the forward kernels' indexing; one thread per input
 * element sums when each has few terms; otherwise (a bias of a large
 * activation) the terms are cut into fixed chunks, summed in double by one
 * thread per (element, chunk) into scratch, and a warp per element adds
 * the chunks in a fixed order: deterministic, and the CPU's sum to double
 * rounding. Forward kernels take a block per row of the last axis when it
 * is long (no per-element division), else grid-stride loops with 32-bit
 * index arithmetic where the tensor fits; nothing uses atomics.
 *
 * Differences from the CPU kernels: integer Div and Mod by zero fail on the
 * CPU, which reads the divisor first; the divisor is device data here, so
 * such an element gives 0. */
#include <float.h>
#include <math.h>
#include <string.h>

#include <cuda_runtime.h>

#include "backend/cuda/kernel.h"
#include "backend/cuda/kernel_util.cuh"

extern "C" {
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

/* Bytes per element on the device. */
static size_t esize_of(enum gp_dtype dt)
{
    return is_float(dt) ? sizeof(float) : gp_dtype_size(dt);
}

/* ---- unary ---- */

enum uop {
    U_RELU, U_LEAKY, U_SIGMOID, U_TANH, U_ERF, U_GELU, U_SQRT, U_NEG, U_EXP, U_LOG, U_ABS,
    U_RECIP, U_SOFTPLUS, U_ELU, U_HARDSIGMOID, U_FLOOR, U_CEIL, U_ROUND, U_SIGN, U_NOT, U_NONE,
};

static enum uop uop_of(const char *op_type)
{
    static const char *const names[] = {
        "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Erf", "Gelu", "Sqrt", "Neg", "Exp", "Log", "Abs",
        "Reciprocal", "Softplus", "Elu", "HardSigmoid", "Floor", "Ceil", "Round", "Sign", "Not"};
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
    case U_GELU:
        if (p.tanh_gelu) return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, gelu_tanh_t(x)));
        return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, erff(__fmul_rn(x, SQRT1_2F))));
    case U_SQRT: return sqrtf(x);
    case U_NEG: return -x;
    case U_EXP: return expf(x);
    case U_LOG: return logf(x);
    case U_ABS: return fabsf(x);
    case U_RECIP: return 1.0f / x;
    case U_SOFTPLUS: return x > 0 ? __fadd_rn(x, log1pf(expf(-x))) : log1pf(expf(x));
    case U_ELU: return x < 0 ? a * expm1f(x) : x;
    case U_HARDSIGMOID: return fmaxf(0.0f, fminf(1.0f, __fadd_rn(__fmul_rn(a, x), p.beta)));
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
    case U_RELU: return x > 0 ? dy : 0.0f;
    case U_LEAKY: return x > 0 ? dy : a * dy;
    case U_SIGMOID: return dy * (1.0f - y) * y;
    case U_TANH: return dy * __fsub_rn(1.0f, __fmul_rn(y, y));
    case U_ERF: return dy * (float)M_2_SQRTPI * expf(-x * x);
    case U_GELU: {
        if (p.tanh_gelu) return __fmul_rn(dy, gelu_tanh_grad(x));
        float cdf = __fmul_rn(0.5f, __fadd_rn(1.0f, erff(__fmul_rn(x, SQRT1_2F))));
        float pdf = __fmul_rn(__fmul_rn(x, expf(__fmul_rn(__fmul_rn(-0.5f, x), x))), GELU_PDF);
        return __fmul_rn(dy, __fadd_rn(cdf, pdf));
    }
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
    default: return 0.0f;
    }
}

/* Grid-stride loops that keep ILP independent elements in flight per
 * thread (each pass loads them all, then computes and stores): coalesced,
 * and latency hidden even for long formulas. */
#define ILP 4
#define GRID_STRIDE_ILP(i0, st, n)                                                   \
    for (int64_t st = (int64_t)gridDim.x * blockDim.x,                               \
                 i0 = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;                \
         i0 < (n); i0 += ILP * st)

static unsigned blocks_ilp(int64_t n) { return blocks_for((n + ILP - 1) / ILP); }

/* X [n] -> Y [n]. */
__global__ static void unary_forward_kernel(struct uparams p, const float *X, float *Y, int64_t n)
{
    GRID_STRIDE_ILP(i0, st, n)
    {
        float x[ILP];
#pragma unroll
        for (int u = 0; u < ILP; u++) x[u] = i0 + u * st < n ? X[i0 + u * st] : 0.0f;
#pragma unroll
        for (int u = 0; u < ILP; u++)
            if (i0 + u * st < n) Y[i0 + u * st] = unary_f(p, x[u]);
    }
}

/* dX [n] += dY [n] * f'(X); X, Y the forward input and output (Y NULL
 * where the gradient does not read it). */
__global__ static void unary_backward_kernel(struct uparams p, const float *X, const float *Y,
                                             const float *dY, float *dX, int64_t n)
{
    GRID_STRIDE_ILP(i0, st, n)
    {
        float x[ILP], y[ILP], dy[ILP], dx[ILP];
#pragma unroll
        for (int u = 0; u < ILP; u++) {
            int64_t i = i0 + u * st;
            bool in = i < n;
            x[u] = in ? X[i] : 0.0f;
            y[u] = in && Y ? Y[i] : 0.0f;
            dy[u] = in ? dY[i] : 0.0f;
            dx[u] = in ? dX[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < ILP; u++)
            if (i0 + u * st < n) dX[i0 + u * st] = __fadd_rn(dx[u], unary_grad(p, x[u], y[u], dy[u]));
    }
}

/* The ops whose gradient reads the forward output. */
static bool grad_reads_y(enum uop op)
{
    return op == U_SIGMOID || op == U_TANH || op == U_SQRT || op == U_EXP || op == U_RECIP;
}

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
    unary_forward_kernel<<<blocks_ilp(n), THREADS, 0, c->stream>>>(
        uparams_of(c->node, op), (const float *)c->in[0], (float *)c->out[0], n);
    return gp_cuda_check_launch(c, "unary forward", err);
}

/* Floor, Ceil, Round and Sign have zero gradient (their input is marked
 * non-differentiable): nothing to add. */
static gp_status unary_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    enum uop op = uop_of(c->node->op_type);
    if (op == U_NONE || op == U_NOT) return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "no gradient");
    if (!c->dout[0] || !c->din[0]) return GP_OK;
    if (op == U_FLOOR || op == U_CEIL || op == U_ROUND || op == U_SIGN) return GP_OK;
    int64_t n = gp_shape_numel(&in_value(c, 0)->shape);
    if (n == 0) return GP_OK;
    unary_backward_kernel<<<blocks_ilp(n), THREADS, 0, c->stream>>>(
        uparams_of(c->node, op), (const float *)c->in[0],
        grad_reads_y(op) ? (const float *)c->out[0] : NULL, c->dout[0], c->din[0], n);
    return gp_cuda_check_launch(c, "unary backward", err);
}

/* ---- Clip ---- */

/* Y = min(max(X, lo), hi), hi winning when lo > hi. Bounds: the optional
 * scalar inputs 1 and 2 (Clip-11+, device memory, read by the kernel) or
 * the attributes min/max (Clip-6, defaulting to float's range). */
__global__ static void clip_forward_kernel(const float *X, float *Y, int64_t n, const float *lop,
                                           const float *hip, float lo_a, float hi_a)
{
    float lo = lop ? *lop : lo_a, hi = hip ? *hip : hi_a;
    GRID_STRIDE(i, n)
    {
        float x = X[i];
        Y[i] = x < lo ? (lo > hi ? hi : lo) : x > hi ? hi : x;
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

/* dX += dY where lo <= X <= hi (the bounds pass the gradient). */
__global__ static void clip_backward_kernel(const float *X, const float *dY, float *dX, int64_t n,
                                            const float *lop, const float *hip, float lo_a, float hi_a)
{
    float lo = lop ? *lop : lo_a, hi = hip ? *hip : hi_a;
    GRID_STRIDE(i, n)
    {
        float x = X[i];
        dX[i] = __fadd_rn(dX[i], x >= lo && x <= hi ? dY[i] : 0.0f);
    }
}

static const void *opt_in(const struct gp_cuda_ctx *c, int i)
{
    return c->node->n_inputs > i ? c->in[i] : NULL;
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
    clip_forward_kernel<<<blocks_for(n), THREADS, 0, c->stream>>>(
        (const float *)c->in[0], (float *)c->out[0], n, (const float *)opt_in(c, 1),
        (const float *)opt_in(c, 2), gp_node_attr_float(c->node, "min", -FLT_MAX),
        gp_node_attr_float(c->node, "max", FLT_MAX));
    return gp_cuda_check_launch(c, "Clip forward", err);
}

static gp_status clip_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->dout[0] || !c->din[0]) return GP_OK;
    int64_t n = gp_shape_numel(&in_value(c, 0)->shape);
    if (n == 0) return GP_OK;
    clip_backward_kernel<<<blocks_for(n), THREADS, 0, c->stream>>>(
        (const float *)c->in[0], c->dout[0], c->din[0], n, (const float *)opt_in(c, 1),
        (const float *)opt_in(c, 2), gp_node_attr_float(c->node, "min", -FLT_MAX),
        gp_node_attr_float(c->node, "max", FLT_MAX));
    return gp_cuda_check_launch(c, "Clip backward", err);
}

/* ---- Cast, CastLike, Identity ---- */

/* X [n] of any type -> Y [n] of the output's type: float to integer
 * truncates toward zero (saturating), anything to bool is X != 0, integer
 * to float goes through double as on the CPU. */
__global__ static void cast_kernel(const void *X, int from, void *Y, int to, bool via_f64, int64_t n)
{
    if (via_f64) {
        GRID_STRIDE(i, n) gp_dev_store_f64(Y, to, i, gp_dev_load_f64(X, from, i));
    } else {
        GRID_STRIDE(i, n) gp_dev_store_i64(Y, to, i, gp_dev_load_i64(X, from, i));
    }
}

static gp_status cast_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    int64_t n = gp_shape_numel(&in_value(c, 0)->shape);
    enum gp_dtype from = in_value(c, 0)->dtype, to = out_value(c, 0)->dtype;
    if (n == 0) return GP_OK;
    if (esize_of(from) == esize_of(to) && (from == to || (is_float(from) && is_float(to)))) {
        if (c->out[0] == c->in[0]) return GP_OK;
        return gp_cuda_call(c, cudaMemcpyAsync(c->out[0], c->in[0], (size_t)n * esize_of(to),
                                            cudaMemcpyDeviceToDevice, c->stream),
                         "cudaMemcpyAsync", err);
    }
    bool via_f64 = is_float(from) || is_float(to) || from == GP_DTYPE_UINT64;
    cast_kernel<<<blocks_for(n), THREADS, 0, c->stream>>>(c->in[0], (int)from, c->out[0], (int)to,
                                                         via_f64, n);
    return gp_cuda_check_launch(c, "Cast forward", err);
}

/* dX [n] += dY [n]. */
__global__ static void add_into_kernel(const float *dY, float *dX, int64_t n)
{
    GRID_STRIDE(i, n) dX[i] = __fadd_rn(dX[i], dY[i]);
}

/* The gradient passes through float-to-float casts (and Identity on
 * floats); a cast to or from an integer type has none. */
static gp_status cast_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->dout[0] || !c->din[0] || !is_float(in_value(c, 0)->dtype)) return GP_OK;
    int64_t n = gp_shape_numel(&in_value(c, 0)->shape);
    if (n == 0) return GP_OK;
    add_into_kernel<<<blocks_for(n), THREADS, 0, c->stream>>>(c->dout[0], c->din[0], n);
    return gp_cuda_check_launch(c, "gradient pass-through", err);
}

/* X [n] -> Y [n], any dtype: a device-to-device copy on the stream. */
static gp_status identity_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    const struct gp_value *x = in_value(c, 0);
    size_t bytes = (size_t)gp_shape_numel(&x->shape) * esize_of(x->dtype);
    if (bytes == 0 || c->out[0] == c->in[0]) return GP_OK;
    return gp_cuda_call(c, cudaMemcpyAsync(c->out[0], c->in[0], bytes, cudaMemcpyDeviceToDevice, c->stream),
                     "cudaMemcpyAsync", err);
}

/* ---- broadcast plans ---- */

#define BP_MAX 4 /* operands: up to three inputs and the output */

/* The output shape with size-1 axes dropped and neighbouring axes merged
 * wherever every operand is contiguous across them (the CPU's bplan, so
 * both backends sum the same terms in the same order). st[k][d]: operand
 * k's stride along axis d in elements, 0 where it is broadcast; operands
 * past n have all strides 0. Passed to kernels by value. */
struct bplan {
    int rank, n;
    int64_t numel;
    int64_t dims[GP_MAX_RANK];
    int64_t st[BP_MAX][GP_MAX_RANK];
};

static void bplan_init(struct bplan *p, const struct gp_shape *out, int n, const struct gp_shape *const *in)
{
    int64_t st[BP_MAX][GP_MAX_RANK];
    memset(p, 0, sizeof *p);
    p->n = n;
    p->numel = gp_shape_numel(out);
    for (int k = 0; k < n; k++) gp_bcast_strides(in[k], out, st[k]);
    for (int d = 0; d < out->rank; d++) {
        if (out->dims[d] == 1) continue;
        int r = p->rank - 1;
        bool merge = r >= 0;
        for (int k = 0; merge && k < n; k++) merge = p->st[k][r] == st[k][d] * out->dims[d];
        if (merge) {
            p->dims[r] *= out->dims[d];
            for (int k = 0; k < n; k++) p->st[k][r] = st[k][d];
            continue;
        }
        p->dims[p->rank] = out->dims[d];
        for (int k = 0; k < n; k++) p->st[k][p->rank] = st[k][d];
        p->rank++;
    }
    if (p->rank == 0) p->rank = 1, p->dims[0] = 1; /* a scalar output */
}

/* A plan over the node's inputs [first, first + n) and its output 0 (the
 * output is operand n). */
static void plan_graph(const struct gp_graph *g, const struct gp_node *node, int first, int n,
                       struct bplan *p)
{
    const struct gp_shape *shapes[BP_MAX];
    for (int k = 0; k < n; k++) shapes[k] = &gp_node_input(g, node, first + k)->shape;
    shapes[n] = &gp_node_output(g, node, 0)->shape;
    bplan_init(p, shapes[n], n + 1, shapes);
}

static void plan_node(const struct gp_cuda_ctx *c, int first, int n, struct bplan *p)
{
    plan_graph(c->graph, c->node, first, n, p);
}

/* Every output element i with its operands' offsets o[0..3]: f(i, o).
 * MODE 0: one axis, offsets i * stride (0 or 1): no division; 1: rows of
 * the last axis, a block per row, the row's offsets decoded once (bias
 * adds); 2: index arithmetic per element in 32 bits; 3: in 64. */
template <class F, int MODE>
__global__ static void bcast_kernel(struct bplan p, F f, int64_t parts)
{
    if (MODE == 0) {
        GRID_STRIDE(i, p.numel)
        {
            int64_t o[BP_MAX];
            for (int k = 0; k < BP_MAX; k++) o[k] = i * p.st[k][0];
            f(i, o);
        }
    } else if (MODE == 1) {
        /* `parts` blocks share a row (parts > 1 when there are few long
         * rows, e.g. attention scores [B*heads, T*T] against a mask). */
        int last = p.rank - 1;
        int64_t inner = p.dims[last], rows = p.numel / inner;
        for (int64_t rb = blockIdx.x; rb < rows * parts; rb += gridDim.x) {
            int64_t row = rb / parts, part = rb % parts;
            int64_t base[BP_MAX] = {0, 0, 0, 0}, rem = row;
            for (int d = last - 1; d >= 0; d--) {
                int64_t x = rem % p.dims[d];
                rem /= p.dims[d];
                for (int k = 0; k < BP_MAX; k++) base[k] += x * p.st[k][d];
            }
            for (int64_t j = part * blockDim.x + threadIdx.x; j < inner; j += parts * blockDim.x) {
                int64_t o[BP_MAX];
                for (int k = 0; k < BP_MAX; k++) o[k] = base[k] + j * p.st[k][last];
                f(row * inner + j, o);
            }
        }
    } else if (MODE == 2) {
        uint32_t n = (uint32_t)p.numel;
        for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
            int64_t o[BP_MAX] = {0, 0, 0, 0};
            uint32_t rem = i;
            for (int d = p.rank - 1; d >= 0; d--) {
                uint32_t x = rem % (uint32_t)p.dims[d];
                rem /= (uint32_t)p.dims[d];
                for (int k = 0; k < BP_MAX; k++) o[k] += (int64_t)x * p.st[k][d];
            }
            f((int64_t)i, o);
        }
    } else {
        GRID_STRIDE(i, p.numel)
        {
            int64_t o[BP_MAX] = {0, 0, 0, 0}, rem = i;
            for (int d = p.rank - 1; d >= 0; d--) {
                int64_t x = rem % p.dims[d];
                rem /= p.dims[d];
                for (int k = 0; k < BP_MAX; k++) o[k] += x * p.st[k][d];
            }
            f(i, o);
        }
    }
}

#define ROW_MIN 128     /* a last axis at least this long runs blocks along rows */
#define ROW_BLOCKS 2048 /* blocks that fill an H200 (132 SMs) several times over */

template <class F>
static gp_status launch_bcast(const struct gp_cuda_ctx *c, const struct bplan *p, F f, const char *what,
                              struct gp_error *err)
{
    if (p->numel == 0) return GP_OK;
    unsigned b = blocks_for(p->numel);
    int64_t inner = p->dims[p->rank - 1];
    if (p->rank == 1) {
        bcast_kernel<F, 0><<<b, THREADS, 0, c->stream>>>(*p, f, 1);
    } else if (inner >= ROW_MIN) {
        /* At least ROW_BLOCKS blocks: long rows are split between blocks
         * (each block at least a full pass of its threads). */
        int64_t rows = p->numel / inner, parts = 1;
        if (rows < ROW_BLOCKS) {
            parts = (ROW_BLOCKS + rows - 1) / rows;
            int64_t most = (inner + THREADS - 1) / THREADS;
            if (parts > most) parts = most;
        }
        int64_t work = rows * parts;
        unsigned grid = (unsigned)(work < 32768 ? work : 32768);
        bcast_kernel<F, 1><<<grid, THREADS, 0, c->stream>>>(*p, f, parts);
    } else if (p->numel <= INT32_MAX) {
        bcast_kernel<F, 2><<<b, THREADS, 0, c->stream>>>(*p, f, 1);
    } else {
        bcast_kernel<F, 3><<<b, THREADS, 0, c->stream>>>(*p, f, 1);
    }
    return gp_cuda_check_launch(c, what, err);
}

/* ---- reductions over broadcast axes (the CPU's BCAST_REDUCE) ---- */

/* Axes of the plan split for operand t: `kept` where t has a stride (its
 * elements), `red` where it was broadcast (summed over). */
struct bsplit {
    int nk, nr;
    int kept[GP_MAX_RANK], red[GP_MAX_RANK];
    int64_t ne, nred; /* elements of operand t; terms each sums */
};

static void bsplit_init(struct bsplit *s, const struct bplan *p, int t)
{
    memset(s, 0, sizeof *s);
    s->ne = s->nred = 1;
    for (int d = 0; d < p->rank; d++) {
        if (p->st[t][d]) s->kept[s->nk++] = d, s->ne *= p->dims[d];
        else s->red[s->nr++] = d, s->nred *= p->dims[d];
    }
}

/* Two-stage sums when each element has many terms: chunks of `chunk`
 * terms, n_chunks of them, so that ne * n_chunks threads fill the GPU. */
#define REDUCE_TARGET (256 * 1024)
#define REDUCE_MIN_TERMS 32

static void reduce_chunks(int64_t ne, int64_t nred, int64_t *chunk, int64_t *n_chunks)
{
    *chunk = nred;
    *n_chunks = 1;
    if (nred < 2 * REDUCE_MIN_TERMS || ne >= REDUCE_TARGET) return;
    int64_t want = (REDUCE_TARGET + ne - 1) / ne, most = nred / REDUCE_MIN_TERMS;
    int64_t s = want < most ? want : most;
    if (s <= 1) return;
    *chunk = (nred + s - 1) / s;
    *n_chunks = (nred + *chunk - 1) / *chunk;
}

/* Scratch for reducing onto operand t of the plan: doubles. */
static size_t reduce_scratch(const struct bplan *p, int t)
{
    if (p->numel == 0) return 0;
    struct bsplit s;
    bsplit_init(&s, p, t);
    int64_t chunk, nch;
    reduce_chunks(s.ne, s.nred, &chunk, &nch);
    return nch > 1 ? (size_t)(s.ne * nch) * sizeof(double) : 0;
}

/* Offsets of element e of operand t (decoded over the kept axes). */
__device__ static inline void kept_offsets(const struct bplan &p, const struct bsplit &s, int64_t e,
                                           int64_t *off)
{
    for (int k = 0; k < BP_MAX; k++) off[k] = 0;
    int64_t rem = e;
    for (int q = s.nk - 1; q >= 0; q--) {
        int d = s.kept[q];
        int64_t x = rem % p.dims[d];
        rem /= p.dims[d];
#pragma unroll
        for (int k = 0; k < BP_MAX; k++) off[k] += x * p.st[k][d];
    }
}

/* off[t] with t known only at run time, without forcing off[] into local
 * memory. */
__device__ static inline int64_t pick(const int64_t *off, int t)
{
    return t == 0 ? off[0] : t == 1 ? off[1] : t == 2 ? off[2] : off[3];
}

/* Sum of term(off) over reduced positions [m0, m1) in row-major order. */
template <class Term>
__device__ static inline double sum_terms(const struct bplan &p, const struct bsplit &s, const Term &term,
                                          int64_t *off, int64_t m0, int64_t m1)
{
    if (s.nr == 1) { /* one reduced axis (after merging): a constant step */
        int d = s.red[0];
        int64_t step[BP_MAX];
#pragma unroll
        for (int k = 0; k < BP_MAX; k++) {
            step[k] = p.st[k][d];
            off[k] += m0 * step[k];
        }
        double acc = 0;
        for (int64_t m = m0; m < m1; m++) {
            acc += (double)term(off);
#pragma unroll
            for (int k = 0; k < BP_MAX; k++) off[k] += step[k];
        }
        return acc;
    }
    int64_t idx[GP_MAX_RANK], rem = m0;
    for (int q = s.nr - 1; q >= 0; q--) {
        int d = s.red[q];
        idx[q] = rem % p.dims[d];
        rem /= p.dims[d];
        for (int k = 0; k < BP_MAX; k++) off[k] += idx[q] * p.st[k][d];
    }
    double acc = 0;
    for (int64_t m = m0; m < m1; m++) {
        acc += (double)term(off);
        /* Odometer over the reduced axes, the last one fastest. */
        for (int q = s.nr - 1; q >= 0; q--) {
            int d = s.red[q];
            for (int k = 0; k < BP_MAX; k++) off[k] += p.st[k][d];
            if (++idx[q] < p.dims[d]) break;
            for (int k = 0; k < BP_MAX; k++) off[k] -= p.st[k][d] * p.dims[d];
            idx[q] = 0;
        }
    }
    return acc;
}

/* dst[e] += the sum over the broadcast axes, one thread per element. */
template <class Term>
__global__ static void reduce_kernel(struct bplan p, struct bsplit s, int t, Term term, float *dst)
{
    GRID_STRIDE(e, s.ne)
    {
        int64_t off[BP_MAX];
        kept_offsets(p, s, e, off);
        int64_t at = pick(off, t);
        double acc = sum_terms(p, s, term, off, 0, s.nred);
        dst[at] = __fadd_rn(dst[at], (float)acc);
    }
}

/* No broadcasting: every operand is contiguous at offset e (a residual
 * add's gradient). The CPU's sum of one term in double rounds back to it. */
template <class Term>
__global__ static void reduce_same_kernel(int64_t n, Term term, float *dst)
{
    GRID_STRIDE_ILP(e0, st, n)
    {
        float v[ILP], d[ILP];
#pragma unroll
        for (int u = 0; u < ILP; u++) {
            int64_t e = e0 + u * st;
            int64_t off[BP_MAX] = {e, e, e, e};
            v[u] = e < n ? term(off) : 0.0f;
            d[u] = e < n ? dst[e] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < ILP; u++)
            if (e0 + u * st < n) dst[e0 + u * st] = __fadd_rn(d[u], v[u]);
    }
}

/* Stage 1: part[ch * ne + e] = the sum of chunk ch of element e's terms. */
template <class Term>
__global__ static void reduce_part_kernel(struct bplan p, struct bsplit s, Term term, int64_t chunk,
                                          int64_t n_chunks, double *part)
{
    GRID_STRIDE(t, s.ne * n_chunks)
    {
        int64_t e = t % s.ne, ch = t / s.ne;
        int64_t off[BP_MAX];
        kept_offsets(p, s, e, off);
        int64_t m0 = ch * chunk, m1 = m0 + chunk < s.nred ? m0 + chunk : s.nred;
        part[t] = sum_terms(p, s, term, off, m0, m1);
    }
}

/* Stage 2: dst[e] += the chunks' sums, a warp per element: lane l sums
 * chunks l, l + 32, ... in order, then a fixed shuffle tree adds the
 * lanes (deterministic). */
__global__ static void reduce_finish_kernel(struct bplan p, struct bsplit s, int t, int64_t n_chunks,
                                            const double *part, float *dst)
{
    int lane = threadIdx.x & 31;
    int64_t w0 = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    int64_t nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t e = w0; e < s.ne; e += nw) {
        double acc = 0;
        for (int64_t ch = lane; ch < n_chunks; ch += 32) acc += part[ch * s.ne + e];
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) {
            int64_t off[BP_MAX];
            kept_offsets(p, s, e, off);
            int64_t at = pick(off, t);
            dst[at] = __fadd_rn(dst[at], (float)acc);
        }
    }
}

/* Operand t not broadcast at all: each of its elements gets one term
 * (the CPU's sum of one term in double rounds back to it), computed over
 * the output with the forward kernels' index arithmetic. */
template <class Term>
struct add_term_op {
    Term term;
    int t;
    float *dst;
    __device__ void operator()(int64_t i, const int64_t *o) const
    {
        (void)i;
        int64_t at = pick(o, t);
        dst[at] = __fadd_rn(dst[at], term(o));
    }
};

/* dst (operand t's gradient) += term summed over the axes t was broadcast
 * along; `part` is reduce_scratch(p, t) bytes of scratch. */
template <class Term>
static gp_status reduce_into(const struct gp_cuda_ctx *c, const struct bplan *p, int t, Term term,
                             float *dst, void *part, const char *what, struct gp_error *err)
{
    if (p->numel == 0) return GP_OK;
    struct bsplit s;
    bsplit_init(&s, p, t);
    int64_t chunk, nch;
    bool same = p->rank == 1;
    for (int k = 0; same && k < p->n; k++) same = p->st[k][0] == 1;
    if (same) {
        reduce_same_kernel<Term><<<blocks_ilp(p->numel), THREADS, 0, c->stream>>>(p->numel, term, dst);
        return gp_cuda_check_launch(c, what, err);
    }
    if (s.nred == 1) {
        add_term_op<Term> f;
        f.term = term;
        f.t = t;
        f.dst = dst;
        return launch_bcast(c, p, f, what, err);
    }
    reduce_chunks(s.ne, s.nred, &chunk, &nch);
    if (nch <= 1) {
        reduce_kernel<Term><<<blocks_for(s.ne), THREADS, 0, c->stream>>>(*p, s, t, term, dst);
        return gp_cuda_check_launch(c, what, err);
    }
    if (!part) return gp_cuda_error(c, err, GP_ERR_INVALID, "%s: no scratch memory", what);
    reduce_part_kernel<Term><<<blocks_for(s.ne * nch), THREADS, 0, c->stream>>>(*p, s, term, chunk, nch,
                                                                               (double *)part);
    GP_TRY(gp_cuda_check_launch(c, what, err));
    reduce_finish_kernel<<<blocks_for(s.ne * 32), THREADS, 0, c->stream>>>(*p, s, t, nch,
                                                                          (const double *)part, dst);
    return gp_cuda_check_launch(c, what, err);
}

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

/* ---- binary ---- */

enum bop { B_ADD, B_SUB, B_MUL, B_DIV, B_POW, B_MOD, B_EQ, B_LT, B_LE, B_GT, B_GE,
           B_AND, B_OR, B_XOR, B_NONE };

static enum bop bop_of(const char *op_type)
{
    static const char *const names[] = {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Equal",
                                        "Less", "LessOrEqual", "Greater", "GreaterOrEqual",
                                        "And", "Or", "Xor"};
    for (int k = 0; k < B_NONE; k++)
        if (strcmp(names[k], op_type) == 0) return (enum bop)k;
    return B_NONE;
}

/* Float A and B (B of any type for Pow: then it is an integer exponent). */
struct fbin_op {
    int op, bt;
    bool b_float;
    const float *A;
    const void *B;
    float *Y;
    uint8_t *Q;
    __device__ void operator()(int64_t i, const int64_t *o) const
    {
        float a = A[o[0]];
        if (!b_float) { /* Pow with an integer exponent */
            Y[i] = powf(a, (float)gp_dev_load_f64(B, bt, o[1]));
            return;
        }
        float b = ((const float *)B)[o[1]];
        switch (op) {
        case B_ADD: Y[i] = a + b; break;
        case B_SUB: Y[i] = a - b; break;
        case B_MUL: Y[i] = a * b; break;
        case B_DIV: Y[i] = a / b; break;
        case B_MOD: Y[i] = fmodf(a, b); break; /* fmod=1 for floats */
        case B_POW: Y[i] = powf(a, b); break;
        case B_EQ: Q[i] = a == b; break;
        case B_LT: Q[i] = a < b; break;
        case B_LE: Q[i] = a <= b; break;
        case B_GT: Q[i] = a > b; break;
        default: Q[i] = a >= b; break;
        }
    }
};

__device__ static inline int64_t ipow(int64_t b, int64_t e)
{
    if (e < 0) return b == 1 ? 1 : b == -1 ? (e & 1 ? -1 : 1) : 0;
    uint64_t r = 1, ub = (uint64_t)b;
    for (; e; e >>= 1, ub *= ub)
        if (e & 1) r *= ub;
    return (int64_t)r;
}

/* Integer (and bool) semantics, as the CPU's int_op: arithmetic wraps, Div
 * truncates toward zero, Mod takes the divisor's sign unless fmod; uint64
 * compares and divides unsigned. A zero divisor gives 0 (the CPU fails). */
struct ibin_op {
    int op, at, bt, yt;
    bool c_fmod, u64, pow_float;
    const void *A, *B;
    void *Y;
    __device__ void operator()(int64_t i, const int64_t *o) const
    {
        if (pow_float) { /* integer base, float exponent */
            gp_dev_store_f64(Y, yt, i, pow(gp_dev_load_f64(A, at, o[0]), gp_dev_load_f64(B, bt, o[1])));
            return;
        }
        int64_t x = gp_dev_load_i64(A, at, o[0]), y = gp_dev_load_i64(B, bt, o[1]), r;
        uint64_t ux = (uint64_t)x, uy = (uint64_t)y;
        switch (op) {
        case B_ADD: r = (int64_t)(ux + uy); break;
        case B_SUB: r = (int64_t)(ux - uy); break;
        case B_MUL: r = (int64_t)(ux * uy); break;
        case B_DIV:
            if (y == 0) r = 0;
            else if (u64) r = (int64_t)(ux / uy);
            else r = x == INT64_MIN && y == -1 ? INT64_MIN : x / y;
            break;
        case B_MOD:
            if (y == 0) {
                r = 0;
            } else if (u64) {
                r = (int64_t)(ux % uy);
            } else {
                r = y == -1 ? 0 : x % y;
                if (!c_fmod && r != 0 && (r < 0) != (y < 0)) r += y;
            }
            break;
        case B_POW: r = ipow(x, y); break;
        case B_EQ: r = x == y; break;
        case B_LT: r = u64 ? ux < uy : x < y; break;
        case B_LE: r = u64 ? ux <= uy : x <= y; break;
        case B_GT: r = u64 ? ux > uy : x > y; break;
        case B_GE: r = u64 ? ux >= uy : x >= y; break;
        case B_AND: r = x && y; break;
        case B_OR: r = x || y; break;
        default: r = !x != !y; break;
        }
        gp_dev_store_i64(Y, yt, i, r);
    }
};

/* A [..], B [..] -> Y [broadcast of both]; comparisons and logic give bool. */
static gp_status binary_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    enum bop op = bop_of(c->node->op_type);
    if (op == B_NONE) return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "not a binary op");
    struct bplan p;
    plan_node(c, 0, 2, &p);
    enum gp_dtype at = in_value(c, 0)->dtype, bt = in_value(c, 1)->dtype, yt = out_value(c, 0)->dtype;
    if (!is_float(at)) {
        struct ibin_op f;
        f.op = op;
        f.at = (int)at;
        f.bt = (int)bt;
        f.yt = (int)yt;
        f.c_fmod = gp_node_attr_int(c->node, "fmod", 0) != 0;
        f.u64 = at == GP_DTYPE_UINT64;
        f.pow_float = op == B_POW && is_float(bt);
        f.A = c->in[0];
        f.B = c->in[1];
        f.Y = c->out[0];
        return launch_bcast(c, &p, f, "binary forward (integer)", err);
    }
    if (op >= B_AND) return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "floating-point inputs");
    if (!is_float(bt) && op != B_POW)
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "float input 0 with %s input 1",
                             gp_dtype_name(bt));
    struct fbin_op f;
    f.op = op;
    f.bt = (int)bt;
    f.b_float = is_float(bt);
    f.A = (const float *)c->in[0];
    f.B = c->in[1];
    f.Y = (float *)c->out[0];
    f.Q = (uint8_t *)c->out[0];
    return launch_bcast(c, &p, f, "binary forward", err);
}

/* The term that output position (o0, o1, o2) contributes to input t's
 * gradient, in float as the CPU computes it (PyTorch's formulas: pow's
 * gradients are 0 where B == 0, resp. where A == 0 and B >= 0). */
struct bin_term {
    int op, t, bt;
    bool b_float;
    const float *A, *B, *Y, *dY;
    const void *Bi;
    __device__ float operator()(const int64_t *o) const
    {
        float dy = dY[o[2]];
        switch (op) {
        case B_ADD: return dy;
        case B_SUB: return t == 0 ? dy : -dy;
        case B_MUL: return t == 0 ? dy * B[o[1]] : dy * A[o[0]];
        case B_DIV: return t == 0 ? dy / B[o[1]] : -dy * A[o[0]] / (B[o[1]] * B[o[1]]);
        default: /* B_POW */
            if (t == 0) {
                if (b_float) {
                    float b = B[o[1]];
                    return b == 0 ? 0.0f : dy * b * powf(A[o[0]], b - 1);
                }
                double e = gp_dev_load_f64(Bi, bt, o[1]);
                return dy * (e == 0 ? 0.0f : (float)e * powf(A[o[0]], (float)(e - 1)));
            } else {
                float a = A[o[0]], b = B[o[1]];
                return a == 0 && b >= 0 ? 0.0f : dy * Y[o[2]] * logf(a);
            }
        }
    }
};

static size_t binary_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    struct bplan p;
    plan_graph(g, node, 0, 2, &p);
    size_t a = reduce_scratch(&p, 0), b = reduce_scratch(&p, 1);
    return a > b ? a : b;
}

/* dA = sum over A's broadcast axes of dY * dY/dA; likewise dB. */
static gp_status binary_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    enum bop op = bop_of(c->node->op_type);
    if (op > B_POW) return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "this op has no gradient");
    if (!c->dout[0]) return GP_OK;
    struct bplan p;
    plan_node(c, 0, 2, &p);
    enum gp_dtype bt = in_value(c, 1)->dtype;
    for (int t = 0; t < 2; t++) {
        if (!c->din[t]) continue;
        if (t == 1 && !is_float(bt)) continue; /* an integer exponent has no gradient */
        struct bin_term term;
        term.op = op;
        term.t = t;
        term.bt = (int)bt;
        term.b_float = is_float(bt);
        term.A = (const float *)c->in[0];
        term.B = (const float *)c->in[1];
        term.Bi = c->in[1];
        term.Y = (const float *)c->out[0];
        term.dY = c->dout[0];
        GP_TRY(reduce_into(c, &p, t, term, c->din[t], c->scratch,
                           t == 0 ? "binary backward (input 0)" : "binary backward (input 1)", err));
    }
    return GP_OK;
}

/* ---- variadic: Max, Min, Sum, Mean ---- */

enum vop { V_MAX, V_MIN, V_SUM, V_MEAN };

static enum vop vop_of(const char *op_type)
{
    return strcmp(op_type, "Max") == 0 ? V_MAX : strcmp(op_type, "Min") == 0 ? V_MIN
           : strcmp(op_type, "Sum") == 0 ? V_SUM : V_MEAN;
}

/* Folds input k into Y (operands: X_k, Y): k == 0 copies; Max/Min keep
 * the first of equal values and any NaN; Sum adds; Mean's last fold
 * divides by n (the CPU's separate pass rounds the same). */
struct fvar_op {
    int op, k;
    float div; /* > 0: divide by it after adding */
    const float *X;
    float *Y;
    __device__ void operator()(int64_t i, const int64_t *o) const
    {
        float x = X[o[0]];
        if (k == 0) {
            Y[i] = div > 0 ? x / div : x;
            return;
        }
        float y = Y[i];
        switch (op) {
        case V_MAX: if (x > y || (x != x && y == y)) Y[i] = x; break;
        case V_MIN: if (x < y || (x != x && y == y)) Y[i] = x; break;
        default: {
            float s = y + x;
            Y[i] = div > 0 ? s / div : s;
            break;
        }
        }
    }
};

struct ivar_op {
    int op, k, dt;
    const void *X;
    void *Y;
    __device__ void operator()(int64_t i, const int64_t *o) const
    {
        int64_t v = gp_dev_load_i64(X, dt, o[0]);
        if (k == 0) {
            gp_dev_store_i64(Y, dt, i, v);
            return;
        }
        int64_t cur = gp_dev_load_i64(Y, dt, i);
        bool u64 = dt == GP_DTYPE_UINT64;
        bool gt = u64 ? (uint64_t)v > (uint64_t)cur : v > cur;
        bool lt = u64 ? (uint64_t)v < (uint64_t)cur : v < cur;
        if (op == V_MAX ? gt : lt) gp_dev_store_i64(Y, dt, i, v);
    }
};

/* win[i] = the first input whose value equals Y[i] (or is NaN when Y is):
 * exactly the one the forward pass kept. */
struct win_op {
    int k;
    const float *X, *Y;
    int32_t *win;
    __device__ void operator()(int64_t i, const int64_t *o) const
    {
        float x = X[o[0]], y = Y[i];
        if (win[i] < 0 && (x == y || (x != x && y != y))) win[i] = k;
    }
};

struct var_term {
    int op, k;
    float nf;
    const float *dY;
    const int32_t *win;
    __device__ float operator()(const int64_t *o) const
    {
        float dy = dY[o[1]];
        switch (op) {
        case V_SUM: return dy;
        case V_MEAN: return dy / nf;
        default: return win[o[1]] == k ? dy : 0.0f;
        }
    }
};

/* Max/Min: the winners [numel(Y)] int32, then the reduction's partials. */
static size_t variadic_win_bytes(const struct gp_graph *g, const struct gp_node *node)
{
    enum vop op = vop_of(node->op_type);
    if (op != V_MAX && op != V_MIN) return 0;
    return align256((size_t)gp_shape_numel(&gp_node_output(g, node, 0)->shape) * sizeof(int32_t));
}

static size_t variadic_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    size_t most = 0;
    for (int k = 0; k < node->n_inputs; k++) {
        struct bplan p;
        plan_graph(g, node, k, 1, &p);
        size_t s = reduce_scratch(&p, 0);
        if (s > most) most = s;
    }
    return variadic_win_bytes(g, node) + most;
}

static gp_status variadic_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    enum vop op = vop_of(c->node->op_type);
    enum gp_dtype dt = out_value(c, 0)->dtype;
    int n = c->node->n_inputs;
    struct bplan p;
    if (!is_float(dt)) {
        if (op != V_MAX && op != V_MIN)
            return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "%s inputs", gp_dtype_name(dt));
        for (int k = 0; k < n; k++) {
            plan_node(c, k, 1, &p);
            struct ivar_op f;
            f.op = op;
            f.k = k;
            f.dt = (int)dt;
            f.X = c->in[k];
            f.Y = c->out[0];
            GP_TRY(launch_bcast(c, &p, f, "variadic forward (integer)", err));
        }
        return GP_OK;
    }
    for (int k = 0; k < n; k++) {
        plan_node(c, k, 1, &p);
        struct fvar_op f;
        f.op = op;
        f.k = k;
        f.div = op == V_MEAN && k == n - 1 && n > 1 ? (float)n : 0.0f;
        f.X = (const float *)c->in[k];
        f.Y = (float *)c->out[0];
        GP_TRY(launch_bcast(c, &p, f, "variadic forward", err));
    }
    return GP_OK;
}

/* Sum: dXk = dY reduced to Xk's shape; Mean: dY / n. Max/Min: dY goes to
 * the input that was selected, the first of equal ones. */
static gp_status variadic_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    enum vop op = vop_of(c->node->op_type);
    int n = c->node->n_inputs;
    if (!c->dout[0]) return GP_OK;
    struct bplan p;
    int32_t *win = (int32_t *)c->scratch;
    char *part = (char *)c->scratch + variadic_win_bytes(c->graph, c->node);
    if (op == V_MAX || op == V_MIN) {
        int64_t m = gp_shape_numel(&out_value(c, 0)->shape);
        if (m == 0) return GP_OK;
        GP_TRY(gp_cuda_call(c, cudaMemsetAsync(win, 0xff, (size_t)m * sizeof(int32_t), c->stream),
                         "cudaMemsetAsync", err)); /* -1 everywhere */
        for (int k = 0; k < n; k++) {
            plan_node(c, k, 1, &p);
            struct win_op f;
            f.k = k;
            f.X = (const float *)c->in[k];
            f.Y = (const float *)c->out[0];
            f.win = win;
            GP_TRY(launch_bcast(c, &p, f, "variadic backward: winners", err));
        }
    }
    for (int k = 0; k < n; k++) {
        if (!c->din[k]) continue;
        plan_node(c, k, 1, &p);
        struct var_term term;
        term.op = op;
        term.k = k;
        term.nf = (float)n;
        term.dY = c->dout[0];
        term.win = win;
        GP_TRY(reduce_into(c, &p, 0, term, c->din[k], part, "variadic backward", err));
    }
    return GP_OK;
}

/* ---- Where, Expand ---- */

/* Out = C ? X : Y for any dtype (moved as elements of T). */
template <typename T>
struct where_op {
    const uint8_t *C;
    const T *X, *Y;
    T *O;
    __device__ void operator()(int64_t i, const int64_t *o) const { O[i] = C[o[0]] ? X[o[1]] : Y[o[2]]; }
};

template <typename T>
static gp_status where_launch(struct gp_cuda_ctx *c, const struct bplan *p, struct gp_error *err)
{
    where_op<T> f;
    f.C = (const uint8_t *)c->in[0];
    f.X = (const T *)c->in[1];
    f.Y = (const T *)c->in[2];
    f.O = (T *)c->out[0];
    return launch_bcast(c, p, f, "Where forward", err);
}

static gp_status where_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    struct bplan p;
    plan_node(c, 0, 3, &p);
    switch (esize_of(out_value(c, 0)->dtype)) {
    case 1: return where_launch<uint8_t>(c, &p, err);
    case 2: return where_launch<uint16_t>(c, &p, err);
    case 4: return where_launch<uint32_t>(c, &p, err);
    case 8: return where_launch<unsigned long long>(c, &p, err);
    default: return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "%s values",
                                  gp_dtype_name(out_value(c, 0)->dtype));
    }
}

struct where_term {
    bool x_side;
    const uint8_t *C;
    const float *dO;
    __device__ float operator()(const int64_t *o) const
    {
        bool c = C[o[0]] != 0;
        return c == x_side ? dO[o[3]] : 0.0f;
    }
};

static size_t where_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    struct bplan p;
    plan_graph(g, node, 0, 3, &p);
    size_t a = reduce_scratch(&p, 1), b = reduce_scratch(&p, 2);
    return a > b ? a : b;
}

/* dX = dOut where C, dY = dOut elsewhere, each reduced to its shape. */
static gp_status where_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->dout[0]) return GP_OK;
    struct bplan p;
    plan_node(c, 0, 3, &p);
    for (int t = 1; t <= 2; t++) {
        if (!c->din[t]) continue;
        struct where_term term;
        term.x_side = t == 1;
        term.C = (const uint8_t *)c->in[0];
        term.dO = c->dout[0];
        GP_TRY(reduce_into(c, &p, t, term, c->din[t], c->scratch,
                           t == 1 ? "Where backward (X)" : "Where backward (Y)", err));
    }
    return GP_OK;
}

template <typename T>
struct expand_op {
    const T *X;
    T *Y;
    __device__ void operator()(int64_t i, const int64_t *o) const { Y[i] = X[o[0]]; }
};

template <typename T>
static gp_status expand_launch(struct gp_cuda_ctx *c, const struct bplan *p, struct gp_error *err)
{
    expand_op<T> f;
    f.X = (const T *)c->in[0];
    f.Y = (T *)c->out[0];
    return launch_bcast(c, p, f, "Expand forward", err);
}

/* X [..] -> Y [broadcast of X's shape and the constant target], any dtype. */
static gp_status expand_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    struct bplan p;
    plan_node(c, 0, 1, &p);
    switch (esize_of(out_value(c, 0)->dtype)) {
    case 1: return expand_launch<uint8_t>(c, &p, err);
    case 2: return expand_launch<uint16_t>(c, &p, err);
    case 4: return expand_launch<uint32_t>(c, &p, err);
    case 8: return expand_launch<unsigned long long>(c, &p, err);
    default: return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "%s values",
                                  gp_dtype_name(out_value(c, 0)->dtype));
    }
}

struct expand_term {
    const float *dY;
    __device__ float operator()(const int64_t *o) const { return dY[o[1]]; }
};

static size_t expand_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    struct bplan p;
    plan_graph(g, node, 0, 1, &p);
    return reduce_scratch(&p, 0);
}

/* dX = dY summed over the expanded axes. */
static gp_status expand_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->dout[0] || !c->din[0]) return GP_OK;
    struct bplan p;
    plan_node(c, 0, 1, &p);
    struct expand_term term;
    term.dY = c->dout[0];
    return reduce_into(c, &p, 0, term, c->din[0], c->scratch, "Expand backward", err);
}

/* ---- the table ---- */

#define UNARY(op) {op, NULL, NULL, unary_forward, unary_backward}
#define BINARY(op) {op, NULL, binary_scratch, binary_forward, binary_backward}
#define NO_GRAD(op, fwd) {op, NULL, NULL, fwd, NULL}
#define VARIADIC(op) {op, NULL, variadic_scratch, variadic_forward, variadic_backward}

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_elementwise[] = {
    UNARY("Relu"), UNARY("LeakyRelu"), UNARY("Sigmoid"), UNARY("Tanh"), UNARY("Erf"),
    UNARY("Gelu"), UNARY("Sqrt"), UNARY("Neg"), UNARY("Exp"), UNARY("Log"), UNARY("Abs"),
    UNARY("Reciprocal"), UNARY("Softplus"), UNARY("Elu"), UNARY("HardSigmoid"),
    /* Zero gradient; the op layer marks their input non-differentiable. */
    UNARY("Floor"), UNARY("Ceil"), UNARY("Round"), UNARY("Sign"),
    NO_GRAD("Not", unary_forward),

    BINARY("Add"), BINARY("Sub"), BINARY("Mul"), BINARY("Div"), BINARY("Pow"),
    NO_GRAD("Mod", binary_forward),
    NO_GRAD("Equal", binary_forward),
    NO_GRAD("Less", binary_forward),
    NO_GRAD("LessOrEqual", binary_forward),
    NO_GRAD("Greater", binary_forward),
    NO_GRAD("GreaterOrEqual", binary_forward),
    NO_GRAD("And", binary_forward),
    NO_GRAD("Or", binary_forward),
    NO_GRAD("Xor", binary_forward),

    VARIADIC("Max"), VARIADIC("Min"), VARIADIC("Sum"), VARIADIC("Mean"),
    {"Where", NULL, where_scratch, where_forward, where_backward},
    {"Expand", NULL, expand_scratch, expand_forward, expand_backward},

    {"Clip", NULL, NULL, clip_forward, clip_backward},
    {"Cast", NULL, NULL, cast_forward, cast_backward},
    {"CastLike", NULL, NULL, cast_forward, cast_backward},
    {"Identity", NULL, NULL, identity_forward, cast_backward},
    {NULL, NULL, NULL, NULL, NULL},
};
