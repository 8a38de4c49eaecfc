/* CPU kernels: the elementwise family. Unary activations and math, Clip,
 * Cast/CastLike and Identity here; the broadcasting ops (binary, variadic,
 * Where, Expand) in binary.c. Every tensor is [n] elements in row-major
 * order, input and output alike.
 *
 * Forward and backward formulas follow PyTorch's (threshold_backward for
 * Relu, gelu_backward, clamp_backward...), so a model trains the same way
 * here as it did before export. Backward reads the forward output where
 * that is how PyTorch differentiates (Sigmoid, Tanh, Exp, Sqrt...). */
#include <float.h>
#include <string.h>
#include <tgmath.h>

#include "backend/cpu/kernel_util.h"
#include "ops/backward_reads.h"

#define R(x) ((real)(x))

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
    real alpha, beta;
    bool tanh_gelu;
};

static struct uparams uparams_of(const struct gp_node *node, enum uop op)
{
    return (struct uparams){
        .alpha = gp_node_attr_float(node, "alpha", op == U_LEAKY ? 0.01f
                                                   : op == U_HARDSIGMOID ? 0.2f : 1.0f),
        .beta = gp_node_attr_float(node, "beta", 0.5f),
        .tanh_gelu = strcmp(gp_node_attr_string(node, "approximate", "none"), "tanh") == 0,
    };
}

/* sqrt(2 / pi) and the cubic coefficient of Gelu's tanh form. */
#define GELU_BETA 0.7978845608028654
#define GELU_KAPPA 0.044715

/* Y[i] = f(X[i]) with x = X[i]; threads split i. */
#define MAP(...)                                                            \
    do {                                                                    \
        _Pragma("omp parallel for if (n > GP_CPU_PAR_MIN) schedule(static)") \
        for (int64_t i = 0; i < n; i++) {                                   \
            real x = X[i];                                                  \
            Y[i] = (__VA_ARGS__);                                           \
        }                                                                   \
    } while (0)

/* dX[i] += the expression, with x, y and dy the elements at i. */
#define GRAD(...)                                                           \
    do {                                                                    \
        _Pragma("omp parallel for if (n > GP_CPU_PAR_MIN) schedule(static)") \
        for (int64_t i = 0; i < n; i++) {                                   \
            real x = X ? X[i] : 0, y = Y ? Y[i] : 0, dy = dY[i];            \
            (void)x, (void)y;                                               \
            real base_ = ow ? 0 : dX[i];                                    \
            dX[i] = base_ + (__VA_ARGS__);                                  \
        }                                                                   \
    } while (0)

static inline real sigmoid(real x)
{
    return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x));
}

/* d/dx of 0.5 x (1 + tanh(u)), u = beta (x + kappa x^3), in PyTorch's
 * arrangement of the terms. */
static inline real gelu_tanh_grad(real x)
{
    real t = tanh(R(GELU_BETA) * (x + R(GELU_KAPPA) * x * x * x));
    real du = R(GELU_BETA) * (1 + 3 * R(GELU_KAPPA) * x * x);
    return R(0.5) * (1 + t) + R(0.5) * x * (1 - t * t) * du;
}

/* Integer inputs (Relu, Neg, Abs, Sign, Erf and Not on bool): element by
 * element through int64, wrapping like the store. */
static gp_status unary_forward_int(struct gp_cpu_ctx *c, enum uop op, int64_t n,
                                   struct gp_error *err)
{
    enum gp_dtype dt = gp_cpu_in_value(c, 0)->dtype;
    bool unsig = dt == GP_DTYPE_UINT8 || dt == GP_DTYPE_UINT16 || dt == GP_DTYPE_UINT32 ||
                 dt == GP_DTYPE_UINT64 || dt == GP_DTYPE_BOOL;
    for (int64_t i = 0; i < n; i++) {
        int64_t x = gp_cpu_load_i64(c->in[0], dt, i), y;
        switch (op) {
        case U_RELU: y = unsig || x > 0 ? x : 0; break;
        case U_NEG: y = (int64_t)(0 - (uint64_t)x); break;
        case U_ABS: y = unsig || x >= 0 ? x : (int64_t)(0 - (uint64_t)x); break;
        case U_SIGN: y = unsig ? x != 0 : (x > 0) - (x < 0); break;
        case U_NOT: y = !x; break;
        case U_ERF:
            gp_cpu_store_f64(c->out[0], dt, i, erf(gp_cpu_load_f64(c->in[0], dt, i)));
            continue;
        default:
            return gp_cpu_error(c, err, GP_ERR_UNSUPPORTED, "%s input", gp_dtype_name(dt));
        }
        gp_cpu_store_i64(c->out[0], dt, i, y);
    }
    return GP_OK;
}

/* X [n] -> Y [n]. */
static gp_status unary_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    enum uop op = uop_of(c->node->op_type);
    int64_t n = gp_shape_numel(gp_cpu_in_shape(c, 0));
    if (!gp_dtype_is_float(gp_cpu_in_value(c, 0)->dtype)) return unary_forward_int(c, op, n, err);
    const real *X = c->in[0];
    real *Y = c->out[0];
    struct uparams p = uparams_of(c->node, op);
    real a = p.alpha, b = p.beta;
    switch (op) {
    case U_RELU: MAP(x > 0 || x != x ? x : 0); break;
    case U_LEAKY: MAP(x < 0 ? a * x : x); break;
    case U_SIGMOID: MAP(sigmoid(x)); break;
    case U_TANH: MAP(tanh(x)); break;
    case U_ERF: MAP(erf(x)); break;
    case U_GELU:
        if (p.tanh_gelu) MAP(R(0.5) * x * (1 + tanh(R(GELU_BETA) * (x + R(GELU_KAPPA) * x * x * x))));
        else MAP(R(0.5) * x * (1 + erf(x * R(M_SQRT1_2))));
        break;
    case U_SQRT: MAP(sqrt(x)); break;
    case U_NEG: MAP(-x); break;
    case U_EXP: MAP(exp(x)); break;
    case U_LOG: MAP(log(x)); break;
    case U_ABS: MAP(fabs(x)); break;
    case U_RECIP: MAP(1 / x); break;
    /* log(1 + e^x) without overflow for large x. */
    case U_SOFTPLUS: MAP(x > 0 ? x + log1p(exp(-x)) : log1p(exp(x))); break;
    case U_ELU: MAP(x < 0 ? a * expm1(x) : x); break;
    case U_HARDSIGMOID: MAP(fmax(R(0), fmin(R(1), a * x + b))); break;
    /* x max(0, min(1, x/6 + 1/2)) (ONNX), in PyTorch's order: x min(max(x + 3, 0), 6) / 6. */
    case U_HARDSWISH: MAP(x * fmin(fmax(x + 3, R(0)), R(6)) / 6); break;
    case U_FLOOR: MAP(floor(x)); break;
    case U_CEIL: MAP(ceil(x)); break;
    case U_ROUND: MAP(nearbyint(x)); break; /* halves to even, as ONNX specifies */
    case U_SIGN: MAP(x > 0 ? 1 : x < 0 ? -1 : x); break;
    default: return gp_cpu_error(c, err, GP_ERR_UNSUPPORTED, "floating-point input");
    }
    return GP_OK;
}

/* dX [n] += dY [n] * f'(X) (X, Y: the forward input and output). Floor,
 * Ceil, Round and Sign have zero gradient: their input is marked
 * non-differentiable, so this is never called for them. */
static gp_status unary_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    enum uop op = uop_of(c->node->op_type);
    int64_t n = gp_shape_numel(gp_cpu_in_shape(c, 0));
    /* Only what gp_unary_grad_reads names: the executor keeps no more. */
    bool rx, ry;
    gp_unary_grad_reads(c->node, &rx, &ry);
    const real *X = rx ? c->in[0] : NULL, *Y = ry ? c->out[0] : NULL, *dY = c->dout[0];
    real *dX = c->din[0];
    bool ow = gp_cpu_overwrite(c, 0);
    if (!dX) return GP_OK;
    if (!dY) {
        if (ow) memset(dX, 0, sizeof(real) * (size_t)n);
        return GP_OK;
    }
    struct uparams p = uparams_of(c->node, op);
    real a = p.alpha, b = p.beta;
    switch (op) {
    case U_RELU: GRAD(y > 0 ? dy : 0); break;
    case U_LEAKY: /* the sign of Y for alpha >= 0, else of X */
        if (ry) GRAD(y > 0 ? dy : a * dy);
        else GRAD(x > 0 ? dy : a * dy);
        break;
    case U_SIGMOID: GRAD(dy * (1 - y) * y); break;
    case U_TANH: GRAD(dy * (1 - y * y)); break;
    case U_ERF: GRAD(dy * R(M_2_SQRTPI) * exp(-x * x)); break;
    case U_GELU:
        if (p.tanh_gelu) {
            GRAD(dy * gelu_tanh_grad(x));
        } else { /* Phi(x) + x phi(x) */
            GRAD(dy * (R(0.5) * (1 + erf(x * R(M_SQRT1_2))) +
                       x * exp(R(-0.5) * x * x) * R(0.5 * M_2_SQRTPI * M_SQRT1_2)));
        }
        break;
    case U_SQRT: GRAD(dy / (2 * y)); break;
    case U_NEG: GRAD(-dy); break;
    case U_EXP: GRAD(dy * y); break;
    case U_LOG: GRAD(dy / x); break;
    case U_ABS: GRAD(x > 0 ? dy : x < 0 ? -dy : 0); break;
    case U_RECIP: GRAD(-dy * (y * y)); break;
    case U_SOFTPLUS: GRAD(dy * sigmoid(x)); break;
    case U_ELU: GRAD(x > 0 ? dy : dy * a * exp(x)); break;
    case U_HARDSIGMOID: GRAD(a * x + b > 0 && a * x + b < 1 ? dy * a : 0); break;
    /* PyTorch's hardswish_backward: 0 below -3, x/3 + 1/2 up to 3 (inclusive), 1 above. */
    case U_HARDSWISH: GRAD(x < -3 ? 0 : x <= 3 ? dy * (x / 3 + R(0.5)) : dy); break;
    case U_FLOOR: case U_CEIL: case U_ROUND: case U_SIGN:
        if (ow) memset(dX, 0, sizeof(real) * (size_t)n);
        break;
    default: return gp_cpu_error(c, err, GP_ERR_UNSUPPORTED, "no gradient");
    }
    return GP_OK;
}

/* ---- Clip ---- */

/* X [n] -> Y [n] = min(max(X, lo), hi) (hi wins when lo > hi, as ONNX
 * says). Bounds: attributes min/max (Clip-6, defaulting to float's lowest
 * and largest values) or optional scalar inputs 1 and 2 (11+) of X's type,
 * unbounded when omitted. */
static gp_status clip_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    int64_t n = gp_shape_numel(gp_cpu_in_shape(c, 0));
    enum gp_dtype dt = gp_cpu_in_value(c, 0)->dtype;
    const void *lo_in = c->node->n_inputs > 1 ? c->in[1] : NULL;
    const void *hi_in = c->node->n_inputs > 2 ? c->in[2] : NULL;
    if (!gp_dtype_is_float(dt)) {
        bool u64 = dt == GP_DTYPE_UINT64;
        for (int64_t i = 0; i < n; i++) {
            int64_t v = gp_cpu_load_i64(c->in[0], dt, i);
            if (lo_in) {
                int64_t lo = gp_cpu_load_i64(lo_in, dt, 0);
                if (u64 ? (uint64_t)v < (uint64_t)lo : v < lo) v = lo;
            }
            if (hi_in) {
                int64_t hi = gp_cpu_load_i64(hi_in, dt, 0);
                if (u64 ? (uint64_t)v > (uint64_t)hi : v > hi) v = hi;
            }
            gp_cpu_store_i64(c->out[0], dt, i, v);
        }
        return GP_OK;
    }
    real lo = lo_in ? *(const real *)lo_in : R(gp_node_attr_float(c->node, "min", -FLT_MAX));
    real hi = hi_in ? *(const real *)hi_in : R(gp_node_attr_float(c->node, "max", FLT_MAX));
    const real *X = c->in[0];
    real *Y = c->out[0];
    MAP(x < lo ? (lo > hi ? hi : lo) : x > hi ? hi : x);
    return GP_OK;
}

/* dX += dY where lo <= X <= hi (PyTorch's clamp_backward: the bounds
 * themselves pass the gradient). The bounds get none: they are marked
 * non-differentiable. */
static gp_status clip_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    int64_t n = gp_shape_numel(gp_cpu_in_shape(c, 0));
    const void *lo_in = c->node->n_inputs > 1 ? c->in[1] : NULL;
    const void *hi_in = c->node->n_inputs > 2 ? c->in[2] : NULL;
    real lo = lo_in ? *(const real *)lo_in : R(gp_node_attr_float(c->node, "min", -FLT_MAX));
    real hi = hi_in ? *(const real *)hi_in : R(gp_node_attr_float(c->node, "max", FLT_MAX));
    const real *X = c->in[0], *Y = c->out[0], *dY = c->dout[0];
    real *dX = c->din[0];
    bool ow = false; /* Clip's gradient is always added (GRAD) */
    if (!dY || !dX) return GP_OK;
    GRAD(x >= lo && x <= hi ? dy : 0);
    return GP_OK;
}

/* ---- Cast, CastLike, Identity ---- */

/* X [n] of any type -> Y [n] of the target type. Float to integer
 * truncates toward zero (saturating), anything to bool is X != 0. Float to
 * float (float32/16/64 are all `real` here) is a copy. */
static gp_status cast_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    int64_t n = gp_shape_numel(gp_cpu_in_shape(c, 0));
    enum gp_dtype from = gp_cpu_in_value(c, 0)->dtype, to = gp_cpu_out_value(c, 0)->dtype;
    const void *x = c->in[0];
    void *y = c->out[0];
    if (gp_cpu_esize(from) == gp_cpu_esize(to) &&
        (from == to || (gp_dtype_is_float(from) && gp_dtype_is_float(to)))) {
        memcpy(y, x, (size_t)n * gp_cpu_esize(to));
    } else if (gp_dtype_is_float(from) || gp_dtype_is_float(to) || from == GP_DTYPE_UINT64) {
#pragma omp parallel for if (n > GP_CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++) gp_cpu_store_f64(y, to, i, gp_cpu_load_f64(x, from, i));
    } else {
#pragma omp parallel for if (n > GP_CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++) gp_cpu_store_i64(y, to, i, gp_cpu_load_i64(x, from, i));
    }
    return GP_OK;
}

/* The gradient passes through float-to-float casts; a cast to or from an
 * integer type has none (its output gets no gradient: dY is NULL). */
static gp_status cast_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    const real *dY = c->dout[0];
    real *dX = c->din[0];
    if (!dY || !dX || !gp_dtype_is_float(gp_cpu_in_value(c, 0)->dtype)) return GP_OK;
    int64_t n = gp_shape_numel(gp_cpu_in_shape(c, 0));
#pragma omp parallel for if (n > GP_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) dX[i] += dY[i];
    return GP_OK;
}

/* X [n] -> Y [n], any dtype. */
static gp_status identity_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    const struct gp_value *x = gp_cpu_in_value(c, 0);
    memcpy(c->out[0], c->in[0], (size_t)gp_shape_numel(&x->shape) * gp_cpu_esize(x->dtype));
    return GP_OK;
}

/* ---- the table ---- */

/* The unary ops' backward writes dX whole when asked (dX = 0 + dY f'(X)). */
static bool unary_overwrites(const struct gp_graph *g, const struct gp_node *node, int k)
{
    (void)g, (void)node;
    return k == 0;
}

#define UNARY(op) {op, NULL, NULL, unary_forward, unary_backward, unary_overwrites}
#define NO_GRAD(op, fwd) {op, NULL, NULL, fwd, NULL}

const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_elementwise)[] = {
    UNARY("Relu"), UNARY("LeakyRelu"), UNARY("Sigmoid"), UNARY("Tanh"), UNARY("Erf"),
    UNARY("Gelu"), UNARY("Sqrt"), UNARY("Neg"), UNARY("Exp"), UNARY("Log"), UNARY("Abs"),
    UNARY("Reciprocal"), UNARY("Softplus"), UNARY("Elu"), UNARY("HardSigmoid"), UNARY("HardSwish"),
    /* Zero gradient; the op layer marks their input non-differentiable. */
    UNARY("Floor"), UNARY("Ceil"), UNARY("Round"), UNARY("Sign"),
    NO_GRAD("Not", unary_forward),

    {"Clip", NULL, NULL, clip_forward, clip_backward},
    {"Cast", NULL, NULL, cast_forward, cast_backward},
    {"CastLike", NULL, NULL, cast_forward, cast_backward},
    {"Identity", NULL, NULL, identity_forward, cast_backward},
    {0},
};
