/* Elementwise ops: unary activations and math, binary ops with numpy
 * broadcasting, variadic Max/Min/Sum/Mean, Where, Cast/CastLike, Expand and
 * Clip. Shape inference is "same as the input" or "broadcast of the inputs";
 * folding evaluates in double (floats) or int64 (integers) and stores into
 * the output dtype, which for + - * / sqrt on float32 gives the correctly
 * rounded float32 result. */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "ops/families.h"
#include "ops/fold_util.h"

/* ---- unary ---- */

#define SQRT_2_OVER_PI 0.7978845608028654

struct unary_params {
    double alpha, beta;
    bool tanh_gelu;
};

static double f_relu(double x, const struct unary_params *p)
{
    (void)p;
    return x > 0 || isnan(x) ? x : 0;
}
static double f_leaky(double x, const struct unary_params *p) { return x < 0 ? p->alpha * x : x; }
static double f_sigmoid(double x, const struct unary_params *p)
{
    (void)p;
    return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x));
}
static double f_tanh(double x, const struct unary_params *p) { (void)p; return tanh(x); }
static double f_erf(double x, const struct unary_params *p) { (void)p; return erf(x); }
static double f_gelu(double x, const struct unary_params *p)
{
    if (p->tanh_gelu)
        return 0.5 * x * (1 + tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)));
    return 0.5 * x * (1 + erf(x / sqrt(2.0)));
}
static double f_sqrt(double x, const struct unary_params *p) { (void)p; return sqrt(x); }
static double f_neg(double x, const struct unary_params *p) { (void)p; return -x; }
static double f_exp(double x, const struct unary_params *p) { (void)p; return exp(x); }
static double f_log(double x, const struct unary_params *p) { (void)p; return log(x); }
static double f_abs(double x, const struct unary_params *p) { (void)p; return fabs(x); }
static double f_recip(double x, const struct unary_params *p) { (void)p; return 1 / x; }
static double f_floor(double x, const struct unary_params *p) { (void)p; return floor(x); }
static double f_ceil(double x, const struct unary_params *p) { (void)p; return ceil(x); }
/* Halves round to even, as ONNX specifies (nearbyint in the default mode). */
static double f_round(double x, const struct unary_params *p) { (void)p; return nearbyint(x); }
static double f_softplus(double x, const struct unary_params *p)
{
    (void)p;
    return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
}
static double f_hardsigmoid(double x, const struct unary_params *p)
{
    return fmax(0, fmin(1, p->alpha * x + p->beta));
}
static double f_hardswish(double x, const struct unary_params *p)
{
    (void)p;
    return x * fmin(fmax(x + 3, 0), 6) / 6;
}
static double f_elu(double x, const struct unary_params *p)
{
    return x < 0 ? p->alpha * (exp(x) - 1) : x;
}
static double f_sign(double x, const struct unary_params *p)
{
    (void)p;
    return x > 0 ? 1 : x < 0 ? -1 : x; /* keeps NaN and signed zero */
}

/* Integer forms for the ops ONNX also defines on integer tensors; values
 * wrap like the C cast that stores them (Neg and Abs of INT_MIN). */
static int64_t i_relu(int64_t x) { return x > 0 ? x : 0; }
static int64_t i_neg(int64_t x) { return (int64_t)(0 - (uint64_t)x); }
static int64_t i_abs(int64_t x) { return x < 0 ? i_neg(x) : x; }
static int64_t i_sign(int64_t x) { return (x > 0) - (x < 0); }
static int64_t i_not(int64_t x) { return !x; }

struct unary_op {
    const char *name;
    double (*f)(double, const struct unary_params *);
    int64_t (*i)(int64_t); /* NULL: integers go through f */
};

static const struct unary_op unary_ops[] = {
    {"Relu", f_relu, i_relu},         {"LeakyRelu", f_leaky, NULL},
    {"Sigmoid", f_sigmoid, NULL},     {"Tanh", f_tanh, NULL},
    {"Erf", f_erf, NULL},             {"Gelu", f_gelu, NULL},
    {"Sqrt", f_sqrt, NULL},           {"Neg", f_neg, i_neg},
    {"Exp", f_exp, NULL},             {"Log", f_log, NULL},
    {"Abs", f_abs, i_abs},            {"Reciprocal", f_recip, NULL},
    {"Floor", f_floor, NULL},         {"Ceil", f_ceil, NULL},
    {"Round", f_round, NULL},         {"Not", NULL, i_not},
    {"Softplus", f_softplus, NULL},   {"HardSigmoid", f_hardsigmoid, NULL},
    {"HardSwish", f_hardswish, NULL},
    {"Elu", f_elu, NULL},             {"Sign", f_sign, i_sign},
};

typedef gp_status (*dtype_check)(struct gp_infer_ctx *, int);

static gp_status unary_common(struct gp_infer_ctx *ctx, dtype_check check)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    if (check) GP_TRY(check(ctx, 0));
    gp_set_out(ctx, 0, x->dtype, &x->shape);
    return GP_OK;
}

static gp_status infer_unary_float(struct gp_infer_ctx *ctx)
{
    return unary_common(ctx, gp_want_float);
}

static gp_status infer_unary_numeric(struct gp_infer_ctx *ctx)
{
    return unary_common(ctx, gp_want_numeric);
}

static gp_status infer_unary_bool(struct gp_infer_ctx *ctx)
{
    return unary_common(ctx, gp_want_bool);
}

static gp_status infer_identity(struct gp_infer_ctx *ctx) { return unary_common(ctx, NULL); }

static gp_status infer_gelu(struct gp_infer_ctx *ctx)
{
    const char *approx = gp_node_attr_string(ctx->node, "approximate", "none");
    if (strcmp(approx, "none") != 0 && strcmp(approx, "tanh") != 0)
        return gp_op_error(ctx, GP_ERR_INVALID,
                           "attribute approximate is '%s'; expected 'none' or 'tanh'", approx);
    return infer_unary_float(ctx);
}

static gp_status fold_unary(struct gp_infer_ctx *ctx)
{
    const struct gp_tensor *x = gp_in(ctx, 0)->constant;
    struct gp_tensor *y = gp_fold_out(ctx, 0);
    if (!y) return GP_ERR_NOMEM;
    const struct gp_node *node = ctx->node;
    if (strcmp(node->op_type, "Identity") == 0) {
        memcpy(y->data, x->data, x->nbytes);
        return GP_OK;
    }
    const struct unary_op *op = NULL;
    for (size_t k = 0; k < sizeof unary_ops / sizeof unary_ops[0]; k++)
        if (strcmp(unary_ops[k].name, node->op_type) == 0) op = &unary_ops[k];
    if (!op) return gp_op_error(ctx, GP_ERR_UNSUPPORTED, "no evaluator for this op");

    bool is_leaky = strcmp(node->op_type, "LeakyRelu") == 0;
    bool is_hs = strcmp(node->op_type, "HardSigmoid") == 0;
    struct unary_params p = {
        .alpha = gp_node_attr_float(node, "alpha", is_leaky ? 0.01f : is_hs ? 0.2f : 1.0f),
        .beta = gp_node_attr_float(node, "beta", 0.5f),
        .tanh_gelu = strcmp(gp_node_attr_string(node, "approximate", "none"), "tanh") == 0,
    };
    /* Unsigned values: Abs and Relu are the identity, Sign is x != 0. */
    bool unsig = x->dtype == GP_DTYPE_UINT8 || x->dtype == GP_DTYPE_UINT16 ||
                 x->dtype == GP_DTYPE_UINT32 || x->dtype == GP_DTYPE_UINT64;
    int64_t n = gp_shape_numel(&x->shape);
    for (int64_t i = 0; i < n; i++) {
        if (gp_dtype_is_float(x->dtype)) {
            gp_tensor_set_f64(y, i, op->f(gp_tensor_get_f64(x, i), &p));
        } else if (unsig && (op->i == i_abs || op->i == i_relu || op->i == i_sign)) {
            int64_t v = gp_tensor_get_i64(x, i);
            gp_tensor_set_i64(y, i, op->i == i_sign ? v != 0 : v);
        } else if (op->i) {
            gp_tensor_set_i64(y, i, op->i(gp_tensor_get_i64(x, i)));
        } else {
            gp_tensor_set_f64(y, i, op->f((double)gp_tensor_get_i64(x, i), &p));
        }
    }
    return GP_OK;
}

/* ---- binary and variadic ---- */

enum bop {
    B_ADD, B_SUB, B_MUL, B_DIV, B_POW, B_MOD, B_EQ, B_LT, B_LE, B_GT, B_GE,
    B_AND, B_OR, B_XOR, B_MAX, B_MIN, B_SUM, B_MEAN,
};

static const char *const bop_names[] = {
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Equal", "Less", "LessOrEqual", "Greater",
    "GreaterOrEqual", "And", "Or", "Xor", "Max", "Min", "Sum", "Mean",
};

static int bop_of(const char *op_type)
{
    for (int k = 0; k < (int)(sizeof bop_names / sizeof bop_names[0]); k++)
        if (strcmp(bop_names[k], op_type) == 0) return k;
    return -1;
}

static int64_t ipow(int64_t b, int64_t e)
{
    if (e < 0) return b == 1 ? 1 : b == -1 ? (e & 1 ? -1 : 1) : 0;
    uint64_t r = 1, ub = (uint64_t)b;
    for (; e; e >>= 1, ub *= ub)
        if (e & 1) r *= ub;
    return (int64_t)r;
}

/* out[oi] = a[ai] op b[bi]; a and b share a dtype except for Pow. False on
 * an integer division by zero. */
static bool apply(enum bop op, bool c_fmod, struct gp_tensor *o, int64_t oi,
                  const struct gp_tensor *a, int64_t ai, const struct gp_tensor *b, int64_t bi)
{
    if (op == B_SUM || op == B_MEAN) op = B_ADD;
    if (op == B_POW) {
        if (gp_dtype_is_float(a->dtype))
            gp_tensor_set_f64(o, oi, pow(gp_tensor_get_f64(a, ai), gp_tensor_get_f64(b, bi)));
        else if (gp_dtype_is_float(b->dtype)) /* integer base, float exponent */
            gp_tensor_set_f64(o, oi,
                              pow((double)gp_tensor_get_i64(a, ai), gp_tensor_get_f64(b, bi)));
        else
            gp_tensor_set_i64(o, oi, ipow(gp_tensor_get_i64(a, ai), gp_tensor_get_i64(b, bi)));
        return true;
    }
    if (gp_dtype_is_float(a->dtype)) {
        double x = gp_tensor_get_f64(a, ai), y = gp_tensor_get_f64(b, bi), r = 0;
        switch (op) {
        case B_ADD: r = x + y; break;
        case B_SUB: r = x - y; break;
        case B_MUL: r = x * y; break;
        case B_DIV: r = x / y; break;
        case B_MOD: r = fmod(x, y); break;
        case B_EQ: r = x == y; break;
        case B_LT: r = x < y; break;
        case B_LE: r = x <= y; break;
        case B_GT: r = x > y; break;
        case B_GE: r = x >= y; break;
        case B_MAX: r = isnan(x) || isnan(y) ? NAN : fmax(x, y); break;
        case B_MIN: r = isnan(x) || isnan(y) ? NAN : fmin(x, y); break;
        default: break;
        }
        gp_tensor_set_f64(o, oi, r);
        return true;
    }
    if (a->dtype == GP_DTYPE_UINT64) { /* the one type whose values exceed int64 */
        uint64_t x = (uint64_t)gp_tensor_get_i64(a, ai), y = (uint64_t)gp_tensor_get_i64(b, bi);
        uint64_t r = 0;
        switch (op) {
        case B_ADD: r = x + y; break;
        case B_SUB: r = x - y; break;
        case B_MUL: r = x * y; break;
        case B_DIV: if (!y) return false; r = x / y; break;
        case B_MOD: if (!y) return false; r = x % y; break;
        case B_EQ: r = x == y; break;
        case B_LT: r = x < y; break;
        case B_LE: r = x <= y; break;
        case B_GT: r = x > y; break;
        case B_GE: r = x >= y; break;
        case B_MAX: r = x > y ? x : y; break;
        case B_MIN: r = x < y ? x : y; break;
        default: break;
        }
        gp_tensor_set_i64(o, oi, (int64_t)r);
        return true;
    }
    int64_t x = gp_tensor_get_i64(a, ai), y = gp_tensor_get_i64(b, bi), r = 0;
    switch (op) {
    /* Unsigned arithmetic: wraps instead of signed-overflow UB; the store
     * into narrower types wraps the same way. */
    case B_ADD: r = (int64_t)((uint64_t)x + (uint64_t)y); break;
    case B_SUB: r = (int64_t)((uint64_t)x - (uint64_t)y); break;
    case B_MUL: r = (int64_t)((uint64_t)x * (uint64_t)y); break;
    case B_DIV: /* truncates toward zero, like C and onnxruntime */
        if (!y) return false;
        r = (x == INT64_MIN && y == -1) ? INT64_MIN : x / y;
        break;
    case B_MOD:
        if (!y) return false;
        r = y == -1 ? 0 : x % y; /* C %: sign of the dividend (fmod=1) */
        if (!c_fmod && r != 0 && ((r < 0) != (y < 0))) r += y; /* sign of the divisor */
        break;
    case B_EQ: r = x == y; break;
    case B_LT: r = x < y; break;
    case B_LE: r = x <= y; break;
    case B_GT: r = x > y; break;
    case B_GE: r = x >= y; break;
    case B_AND: r = x && y; break;
    case B_OR: r = x || y; break;
    case B_XOR: r = !x != !y; break;
    case B_MAX: r = x > y ? x : y; break;
    case B_MIN: r = x < y ? x : y; break;
    default: break;
    }
    gp_tensor_set_i64(o, oi, r);
    return true;
}

/* Two required inputs and their broadcast shape. */
static gp_status binary_shape(struct gp_infer_ctx *ctx, struct gp_value **a, struct gp_value **b,
                              struct gp_shape *out)
{
    GP_TRY(gp_req_in(ctx, 0, a));
    GP_TRY(gp_req_in(ctx, 1, b));
    return gp_broadcast(ctx, &(*a)->shape, &(*b)->shape, out);
}

static gp_status infer_arith(struct gp_infer_ctx *ctx)
{
    struct gp_value *a, *b;
    struct gp_shape s;
    GP_TRY(binary_shape(ctx, &a, &b, &s));
    GP_TRY(gp_want_numeric(ctx, 0));
    GP_TRY(gp_same_dtype(ctx, 0, 1));
    gp_set_out(ctx, 0, a->dtype, &s);
    return GP_OK;
}

/* Pow-7 wants one type; since Pow-12 the exponent's type is free and the
 * output takes the base's. */
static gp_status infer_pow12(struct gp_infer_ctx *ctx)
{
    struct gp_value *a, *b;
    struct gp_shape s;
    GP_TRY(binary_shape(ctx, &a, &b, &s));
    GP_TRY(gp_want_numeric(ctx, 0));
    GP_TRY(gp_want_numeric(ctx, 1));
    gp_set_out(ctx, 0, a->dtype, &s);
    return GP_OK;
}

static gp_status infer_mod(struct gp_infer_ctx *ctx)
{
    GP_TRY(infer_arith(ctx));
    if (gp_dtype_is_float(gp_in(ctx, 0)->dtype) && gp_node_attr_int(ctx->node, "fmod", 0) != 1)
        return gp_op_error(ctx, GP_ERR_INVALID,
                           "Mod of floating-point inputs requires fmod=1 (fmod=0 is integer-only)");
    return GP_OK;
}

static gp_status infer_compare(struct gp_infer_ctx *ctx)
{
    struct gp_value *a, *b;
    struct gp_shape s;
    GP_TRY(binary_shape(ctx, &a, &b, &s));
    if (!(strcmp(ctx->node->op_type, "Equal") == 0 && a->dtype == GP_DTYPE_BOOL))
        GP_TRY(gp_want_numeric(ctx, 0));
    GP_TRY(gp_same_dtype(ctx, 0, 1));
    gp_set_out(ctx, 0, GP_DTYPE_BOOL, &s);
    return GP_OK;
}

static gp_status infer_logic(struct gp_infer_ctx *ctx)
{
    struct gp_value *a, *b;
    struct gp_shape s;
    GP_TRY(binary_shape(ctx, &a, &b, &s));
    GP_TRY(gp_want_bool(ctx, 0));
    GP_TRY(gp_want_bool(ctx, 1));
    gp_set_out(ctx, 0, GP_DTYPE_BOOL, &s);
    return GP_OK;
}

static gp_status infer_variadic(struct gp_infer_ctx *ctx, bool float_only)
{
    struct gp_value *v;
    GP_TRY(gp_req_in(ctx, 0, &v));
    struct gp_shape s = v->shape;
    for (int i = 1; i < ctx->node->n_inputs; i++) {
        GP_TRY(gp_req_in(ctx, i, &v));
        GP_TRY(gp_broadcast(ctx, &s, &v->shape, &s));
    }
    GP_TRY(float_only ? gp_want_float(ctx, 0) : gp_want_numeric(ctx, 0));
    GP_TRY(gp_same_dtype(ctx, 0, ctx->node->n_inputs - 1));
    gp_set_out(ctx, 0, gp_in(ctx, 0)->dtype, &s);
    return GP_OK;
}

static gp_status infer_maxmin(struct gp_infer_ctx *ctx) { return infer_variadic(ctx, false); }
static gp_status infer_summean(struct gp_infer_ctx *ctx) { return infer_variadic(ctx, true); }

static gp_status div_zero(struct gp_infer_ctx *ctx)
{
    return gp_op_error(ctx, GP_ERR_INVALID, "integer division by zero while folding constants");
}

static gp_status fold_binary(struct gp_infer_ctx *ctx)
{
    int op = bop_of(ctx->node->op_type);
    if (op < 0) return gp_op_error(ctx, GP_ERR_UNSUPPORTED, "no evaluator for this op");
    struct gp_tensor *o = gp_fold_out(ctx, 0);
    if (!o) return GP_ERR_NOMEM;
    bool c_fmod = gp_node_attr_int(ctx->node, "fmod", 0) != 0;
    int64_t n = gp_shape_numel(&o->shape), sa[GP_MAX_RANK], sb[GP_MAX_RANK];
    const struct gp_tensor *a = gp_in(ctx, 0)->constant;
    int n_in = ctx->node->n_inputs;
    if (n_in == 1) { /* a variadic op of one input is a copy */
        memcpy(o->data, a->data, a->nbytes);
        return GP_OK;
    }
    const struct gp_tensor *b = gp_in(ctx, 1)->constant;
    gp_bcast_strides(&a->shape, &o->shape, sa);
    gp_bcast_strides(&b->shape, &o->shape, sb);
    struct gp_iter it;
    gp_iter_init(&it, &o->shape);
    gp_iter_add(&it, sa, 0);
    gp_iter_add(&it, sb, 0);
    for (int64_t i = 0; i < n; i++, gp_iter_next(&it))
        if (!apply((enum bop)op, c_fmod, o, i, a, it.off[0], b, it.off[1])) return div_zero(ctx);
    /* Variadic ops fold the rest in one at a time into the output, which
     * already has the full broadcast shape. */
    for (int k = 2; k < n_in; k++) {
        b = gp_in(ctx, k)->constant;
        gp_bcast_strides(&b->shape, &o->shape, sb);
        gp_iter_init(&it, &o->shape);
        gp_iter_add(&it, sb, 0);
        for (int64_t i = 0; i < n; i++, gp_iter_next(&it))
            apply((enum bop)op, c_fmod, o, i, o, i, b, it.off[0]);
    }
    if (op == B_MEAN)
        for (int64_t i = 0; i < n; i++) gp_tensor_set_f64(o, i, gp_tensor_get_f64(o, i) / n_in);
    return GP_OK;
}

/* ---- Where ---- */

static gp_status infer_where(struct gp_infer_ctx *ctx)
{
    struct gp_value *c, *x, *y;
    GP_TRY(gp_req_in(ctx, 0, &c));
    GP_TRY(gp_req_in(ctx, 1, &x));
    GP_TRY(gp_req_in(ctx, 2, &y));
    GP_TRY(gp_want_bool(ctx, 0));
    GP_TRY(gp_same_dtype(ctx, 1, 2));
    struct gp_shape s;
    GP_TRY(gp_broadcast(ctx, &c->shape, &x->shape, &s));
    GP_TRY(gp_broadcast(ctx, &s, &y->shape, &s));
    gp_set_out(ctx, 0, x->dtype, &s);
    return GP_OK;
}

static gp_status fold_where(struct gp_infer_ctx *ctx)
{
    const struct gp_tensor *c = gp_in(ctx, 0)->constant, *x = gp_in(ctx, 1)->constant,
                           *y = gp_in(ctx, 2)->constant;
    struct gp_tensor *o = gp_fold_out(ctx, 0);
    if (!o) return GP_ERR_NOMEM;
    int64_t s[GP_MAX_RANK], n = gp_shape_numel(&o->shape);
    size_t es = gp_dtype_size(o->dtype);
    struct gp_iter it;
    gp_iter_init(&it, &o->shape);
    gp_bcast_strides(&c->shape, &o->shape, s);
    gp_iter_add(&it, s, 0);
    gp_bcast_strides(&x->shape, &o->shape, s);
    gp_iter_add(&it, s, 0);
    gp_bcast_strides(&y->shape, &o->shape, s);
    gp_iter_add(&it, s, 0);
    for (int64_t i = 0; i < n; i++, gp_iter_next(&it)) {
        bool take_x = ((const uint8_t *)c->data)[it.off[0]] != 0;
        const unsigned char *src = take_x ? (const unsigned char *)x->data + it.off[1] * es
                                          : (const unsigned char *)y->data + it.off[2] * es;
        memcpy((unsigned char *)o->data + i * (int64_t)es, src, es);
    }
    return GP_OK;
}

/* ---- Cast, CastLike ---- */

static gp_status cast_to(struct gp_infer_ctx *ctx, enum gp_dtype to)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    if (to == GP_DTYPE_STRING || gp_dtype_size(to) == 0)
        return gp_op_error(ctx, GP_ERR_UNSUPPORTED, "cast to element type %d (%s) is not supported",
                           (int)to, gp_dtype_name(to));
    gp_set_out(ctx, 0, to, &x->shape);
    return GP_OK;
}

static gp_status infer_cast(struct gp_infer_ctx *ctx)
{
    if (!gp_node_attr(ctx->node, "to"))
        return gp_op_error(ctx, GP_ERR_INVALID, "attribute 'to' is required");
    return cast_to(ctx, (enum gp_dtype)gp_node_attr_int(ctx->node, "to", 0));
}

static gp_status infer_castlike(struct gp_infer_ctx *ctx)
{
    struct gp_value *like;
    GP_TRY(gp_req_in(ctx, 1, &like));
    return cast_to(ctx, like->dtype);
}

/* Float to integer truncates toward zero (saturating out of range, see
 * gp_tensor_set_f64), anything to bool is x != 0, integers keep exact
 * values through int64. */
static gp_status fold_cast(struct gp_infer_ctx *ctx)
{
    const struct gp_tensor *x = gp_in(ctx, 0)->constant;
    struct gp_tensor *o = gp_fold_out(ctx, 0);
    if (!o) return GP_ERR_NOMEM;
    int64_t n = gp_shape_numel(&x->shape);
    if (x->dtype == o->dtype) {
        memcpy(o->data, x->data, x->nbytes);
    } else if (gp_dtype_is_float(x->dtype) || gp_dtype_is_float(o->dtype) ||
               x->dtype == GP_DTYPE_UINT64) {
        for (int64_t i = 0; i < n; i++) gp_tensor_set_f64(o, i, gp_tensor_get_f64(x, i));
    } else {
        for (int64_t i = 0; i < n; i++) gp_tensor_set_i64(o, i, gp_tensor_get_i64(x, i));
    }
    return GP_OK;
}

/* ---- Expand ---- */

static gp_status infer_expand(struct gp_infer_ctx *ctx)
{
    struct gp_value *x;
    GP_TRY(gp_req_in(ctx, 0, &x));
    int64_t dims[GP_MAX_RANK];
    int n;
    GP_TRY(gp_const_ints(ctx, 1, "shape", dims, GP_MAX_RANK, &n));
    struct gp_shape target = {.rank = n}, s;
    for (int d = 0; d < n; d++) {
        if (dims[d] < 0) {
            char b[160];
            return gp_op_error(ctx, GP_ERR_SHAPE, "Expand shape %s has a negative dimension",
                               gp_ints_format(dims, n, b, sizeof b));
        }
        target.dims[d] = dims[d];
    }
    GP_TRY(gp_broadcast(ctx, &x->shape, &target, &s));
    GP_TRY(gp_check_shape(ctx, &s));
    gp_set_out(ctx, 0, x->dtype, &s);
    return GP_OK;
}

static gp_status fold_expand(struct gp_infer_ctx *ctx)
{
    const struct gp_tensor *x = gp_in(ctx, 0)->constant;
    struct gp_tensor *o = gp_fold_out(ctx, 0);
    if (!o) return GP_ERR_NOMEM;
    int64_t s[GP_MAX_RANK];
    gp_bcast_strides(&x->shape, &o->shape, s);
    gp_copy_strided(o->data, x->data, gp_dtype_size(o->dtype), &o->shape, s, 0);
    return GP_OK;
}

/* ---- Clip ---- */

/* Clip-6: bounds are float attributes. */
static gp_status infer_clip6(struct gp_infer_ctx *ctx) { return infer_unary_float(ctx); }

/* Clip-11+: optional scalar inputs min and max of the input's type; they
 * only change values, so they need not be constant for inference. */
static gp_status infer_clip11(struct gp_infer_ctx *ctx)
{
    GP_TRY(infer_unary_numeric(ctx));
    GP_TRY(gp_same_dtype(ctx, 0, 2));
    for (int i = 1; i <= 2; i++) {
        struct gp_value *b = gp_in(ctx, i);
        if (b && b->has_shape && gp_shape_numel(&b->shape) != 1) {
            char s[160];
            return gp_op_error(ctx, GP_ERR_SHAPE,
                               "%s (input %d) must be a scalar, but its shape is %s",
                               i == 1 ? "min" : "max", i, gp_shape_format(&b->shape, s, sizeof s));
        }
    }
    return GP_OK;
}

static gp_status fold_clip(struct gp_infer_ctx *ctx)
{
    const struct gp_tensor *x = gp_in(ctx, 0)->constant;
    struct gp_tensor *o = gp_fold_out(ctx, 0);
    if (!o) return GP_ERR_NOMEM;
    int64_t n = gp_shape_numel(&x->shape);
    struct gp_value *lo_v = gp_in(ctx, 1), *hi_v = gp_in(ctx, 2);
    const struct gp_attr *lo_a = gp_node_attr(ctx->node, "min"); /* Clip-6 */
    const struct gp_attr *hi_a = gp_node_attr(ctx->node, "max");
    if (gp_dtype_is_float(x->dtype)) {
        double lo = lo_v ? gp_tensor_get_f64(lo_v->constant, 0) : lo_a ? lo_a->f : -INFINITY;
        double hi = hi_v ? gp_tensor_get_f64(hi_v->constant, 0) : hi_a ? hi_a->f : INFINITY;
        for (int64_t i = 0; i < n; i++) {
            double v = gp_tensor_get_f64(x, i);
            /* min > max gives max everywhere, as ONNX specifies; NaN stays. */
            if (v < lo) v = lo;
            if (v > hi) v = hi;
            gp_tensor_set_f64(o, i, v);
        }
    } else {
        int64_t lo = lo_v ? gp_tensor_get_i64(lo_v->constant, 0) : INT64_MIN;
        int64_t hi = hi_v ? gp_tensor_get_i64(hi_v->constant, 0) : INT64_MAX;
        bool u64 = x->dtype == GP_DTYPE_UINT64;
        for (int64_t i = 0; i < n; i++) {
            int64_t v = gp_tensor_get_i64(x, i);
            if (u64) {
                if (lo_v && (uint64_t)v < (uint64_t)lo) v = lo;
                if (hi_v && (uint64_t)v > (uint64_t)hi) v = hi;
            } else {
                if (v < lo) v = lo;
                if (v > hi) v = hi;
            }
            gp_tensor_set_i64(o, i, v);
        }
    }
    return GP_OK;
}

/* ---- the table ---- */

#define FOLD GP_FOLD_CONSTANTS
#define UNARY(op, since, attrs, infer, nondiff) \
    {"", op, since, 1, 1, 1, 1, attrs, nondiff, infer, FOLD, fold_unary}
#define BINARY(op, since, attrs, infer, nondiff) \
    {"", op, since, 2, 2, 1, 1, attrs, nondiff, infer, FOLD, fold_binary}
#define VARIADIC(op, since, infer) \
    {"", op, since, 1, INT_MAX, 1, 1, "", 0, infer, FOLD, fold_binary}
#define OTHER(op, since, min_in, max_in, attrs, nondiff, infer, fold) \
    {"", op, since, min_in, max_in, 1, 1, attrs, nondiff, infer, FOLD, fold}

/* One entry per ONNX since-version from the first modern one (Add-7 after
 * the broadcast attribute went, Relu-6 after consumed_inputs...) through
 * opset 21, so a node resolves to the version it was written for and
 * messages name it. Versions that only widen the type constraints share the
 * infer function; Pow-12 and Clip-11 change semantics and get their own.
 * Floor, Ceil, Round and Sign have zero gradient, so their input is marked
 * non-differentiable like comparison and logic inputs; Pow's exponent is
 * treated as a constant. */
const struct gp_op_def gp_ops_elementwise[] = {
    UNARY("Relu", 6, "", infer_unary_numeric, 0),
    UNARY("Relu", 13, "", infer_unary_numeric, 0),
    UNARY("Relu", 14, "", infer_unary_numeric, 0),
    UNARY("LeakyRelu", 6, "alpha:f", infer_unary_float, 0),
    UNARY("LeakyRelu", 16, "alpha:f", infer_unary_float, 0),
    UNARY("Sigmoid", 6, "", infer_unary_float, 0),
    UNARY("Sigmoid", 13, "", infer_unary_float, 0),
    UNARY("Tanh", 6, "", infer_unary_float, 0),
    UNARY("Tanh", 13, "", infer_unary_float, 0),
    UNARY("Erf", 9, "", infer_unary_numeric, 0),
    UNARY("Erf", 13, "", infer_unary_numeric, 0),
    UNARY("Gelu", 20, "approximate:s", infer_gelu, 0),
    UNARY("Sqrt", 6, "", infer_unary_float, 0),
    UNARY("Sqrt", 13, "", infer_unary_float, 0),
    UNARY("Neg", 6, "", infer_unary_numeric, 0),
    UNARY("Neg", 13, "", infer_unary_numeric, 0),
    UNARY("Exp", 6, "", infer_unary_float, 0),
    UNARY("Exp", 13, "", infer_unary_float, 0),
    UNARY("Log", 6, "", infer_unary_float, 0),
    UNARY("Log", 13, "", infer_unary_float, 0),
    UNARY("Abs", 6, "", infer_unary_numeric, 0),
    UNARY("Abs", 13, "", infer_unary_numeric, 0),
    UNARY("Reciprocal", 6, "", infer_unary_float, 0),
    UNARY("Reciprocal", 13, "", infer_unary_float, 0),
    UNARY("Floor", 6, "", infer_unary_float, 0x1),
    UNARY("Floor", 13, "", infer_unary_float, 0x1),
    UNARY("Ceil", 6, "", infer_unary_float, 0x1),
    UNARY("Ceil", 13, "", infer_unary_float, 0x1),
    UNARY("Round", 11, "", infer_unary_float, 0x1),
    UNARY("Not", 1, "", infer_unary_bool, 0x1),
    UNARY("Identity", 1, "", infer_identity, 0),
    UNARY("Identity", 13, "", infer_identity, 0),
    UNARY("Identity", 14, "", infer_identity, 0),
    UNARY("Identity", 16, "", infer_identity, 0),
    UNARY("Identity", 19, "", infer_identity, 0),
    UNARY("Identity", 21, "", infer_identity, 0),
    UNARY("Softplus", 1, "", infer_unary_float, 0),
    UNARY("HardSigmoid", 6, "alpha:f,beta:f", infer_unary_float, 0),
    UNARY("HardSwish", 14, "", infer_unary_float, 0),
    UNARY("Elu", 6, "alpha:f", infer_unary_float, 0),
    UNARY("Sign", 9, "", infer_unary_numeric, 0x1),
    UNARY("Sign", 13, "", infer_unary_numeric, 0x1),

    BINARY("Add", 7, "", infer_arith, 0),
    BINARY("Add", 13, "", infer_arith, 0),
    BINARY("Add", 14, "", infer_arith, 0),
    BINARY("Sub", 7, "", infer_arith, 0),
    BINARY("Sub", 13, "", infer_arith, 0),
    BINARY("Sub", 14, "", infer_arith, 0),
    BINARY("Mul", 7, "", infer_arith, 0),
    BINARY("Mul", 13, "", infer_arith, 0),
    BINARY("Mul", 14, "", infer_arith, 0),
    BINARY("Div", 7, "", infer_arith, 0),
    BINARY("Div", 13, "", infer_arith, 0),
    BINARY("Div", 14, "", infer_arith, 0),
    BINARY("Pow", 7, "", infer_arith, 0x2),
    BINARY("Pow", 12, "", infer_pow12, 0x2),
    BINARY("Pow", 13, "", infer_pow12, 0x2),
    BINARY("Pow", 15, "", infer_pow12, 0x2),
    BINARY("Mod", 10, "fmod:i", infer_mod, 0),
    BINARY("Mod", 13, "fmod:i", infer_mod, 0),
    BINARY("Equal", 7, "", infer_compare, 0x3),
    BINARY("Equal", 11, "", infer_compare, 0x3),
    BINARY("Equal", 13, "", infer_compare, 0x3),
    BINARY("Equal", 19, "", infer_compare, 0x3),
    BINARY("Less", 7, "", infer_compare, 0x3),
    BINARY("Less", 9, "", infer_compare, 0x3),
    BINARY("Less", 13, "", infer_compare, 0x3),
    BINARY("LessOrEqual", 12, "", infer_compare, 0x3),
    BINARY("LessOrEqual", 16, "", infer_compare, 0x3),
    BINARY("Greater", 7, "", infer_compare, 0x3),
    BINARY("Greater", 9, "", infer_compare, 0x3),
    BINARY("Greater", 13, "", infer_compare, 0x3),
    BINARY("GreaterOrEqual", 12, "", infer_compare, 0x3),
    BINARY("GreaterOrEqual", 16, "", infer_compare, 0x3),
    BINARY("And", 7, "", infer_logic, 0x3),
    BINARY("Or", 7, "", infer_logic, 0x3),
    BINARY("Xor", 7, "", infer_logic, 0x3),

    VARIADIC("Max", 8, infer_maxmin),
    VARIADIC("Max", 12, infer_maxmin),
    VARIADIC("Max", 13, infer_maxmin),
    VARIADIC("Min", 8, infer_maxmin),
    VARIADIC("Min", 12, infer_maxmin),
    VARIADIC("Min", 13, infer_maxmin),
    VARIADIC("Sum", 8, infer_summean),
    VARIADIC("Sum", 13, infer_summean),
    VARIADIC("Mean", 8, infer_summean),
    VARIADIC("Mean", 13, infer_summean),

    OTHER("Where", 9, 3, 3, "", 0x1, infer_where, fold_where),
    OTHER("Where", 16, 3, 3, "", 0x1, infer_where, fold_where),
    OTHER("Cast", 6, 1, 1, "to:i", 0, infer_cast, fold_cast),
    OTHER("Cast", 9, 1, 1, "to:i", 0, infer_cast, fold_cast),
    OTHER("Cast", 13, 1, 1, "to:i", 0, infer_cast, fold_cast),
    OTHER("Cast", 19, 1, 1, "saturate:i,to:i", 0, infer_cast, fold_cast),
    OTHER("Cast", 21, 1, 1, "saturate:i,to:i", 0, infer_cast, fold_cast),
    OTHER("CastLike", 15, 2, 2, "", 0x2, infer_castlike, fold_cast),
    OTHER("CastLike", 19, 2, 2, "saturate:i", 0x2, infer_castlike, fold_cast),
    OTHER("CastLike", 21, 2, 2, "saturate:i", 0x2, infer_castlike, fold_cast),
    OTHER("Expand", 8, 2, 2, "", 0x2, infer_expand, fold_expand),
    OTHER("Expand", 13, 2, 2, "", 0x2, infer_expand, fold_expand),
    OTHER("Clip", 6, 1, 1, "max:f,min:f", 0, infer_clip6, fold_clip),
    OTHER("Clip", 11, 1, 3, "", 0x6, infer_clip11, fold_clip),
    OTHER("Clip", 12, 1, 3, "", 0x6, infer_clip11, fold_clip),
    OTHER("Clip", 13, 1, 3, "", 0x6, infer_clip11, fold_clip),
    {0},
};
