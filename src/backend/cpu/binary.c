/* CPU kernels: the binary family, the broadcasting elementwise ops. Binary
 * arithmetic, comparisons and logic, variadic Max/Min/Sum/Mean, Where and
 * Expand, all with numpy (multidirectional) broadcasting.
 *
 * Forward walks the output in rows and splits independent output elements
 * across threads. The gradient of a broadcast input is the sum of the
 * output's terms over the axes it was broadcast along; each input element
 * sums its own terms in a fixed order on one thread, so results are the
 * same for any thread count. Formulas follow PyTorch's autograd (div, pow,
 * where, maximum). */
#include <string.h>
#include <tgmath.h>

#include "backend/cpu/kernel_util.h"
#include "ops/fold_util.h"

/* ---- broadcast plans ---- */

#define BP_MAX 4     /* operands of a plan: up to three inputs and the output */
#define BLOCK 4096   /* elements of a row one thread handles at a time */

/* The output shape with size-1 axes dropped and neighbouring axes merged
 * wherever every operand is contiguous across them (same shapes collapse to
 * one axis). st[k][d]: operand k's stride along axis d in elements, 0 where
 * it is broadcast. Operands past n have all strides 0. */
struct bplan {
    int rank, n;
    int64_t numel;
    int64_t dims[GP_MAX_RANK];
    int64_t st[BP_MAX][GP_MAX_RANK];
};

static void bplan_init(struct bplan *p, const struct gp_shape *out, int n,
                       const struct gp_shape *const *in)
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

/* Operand offsets at the start of row `row` (all axes but the last). */
static inline void bplan_row(const struct bplan *p, int64_t row, int64_t *off)
{
    for (int k = 0; k < BP_MAX; k++) off[k] = 0;
    for (int d = p->rank - 2; d >= 0; d--) {
        int64_t x = row % p->dims[d];
        row /= p->dims[d];
        for (int k = 0; k < BP_MAX; k++) off[k] += x * p->st[k][d];
    }
}

/* Runs the statement(s) in ... for every output element: i is its index,
 * o0..o2 the offsets of operands 0..2. */
#define BCAST_FOR(plan, ...)                                                                 \
    do {                                                                                     \
        const struct bplan *p_ = (plan);                                                     \
        int last_ = p_->rank - 1;                                                            \
        int64_t inner_ = p_->dims[last_], n_ = p_->numel;                                    \
        int64_t nblk_ = (inner_ + BLOCK - 1) / BLOCK, tasks_ = n_ ? n_ / inner_ * nblk_ : 0; \
        _Pragma("omp parallel for if (n_ > GP_CPU_PAR_MIN) schedule(static)")               \
        for (int64_t t_ = 0; t_ < tasks_; t_++) {                                            \
            int64_t r_ = t_ / nblk_, j0_ = t_ % nblk_ * BLOCK;                              \
            int64_t j1_ = j0_ + BLOCK < inner_ ? j0_ + BLOCK : inner_, b_[BP_MAX];          \
            bplan_row(p_, r_, b_);                                                           \
            for (int64_t j_ = j0_; j_ < j1_; j_++) {                                         \
                int64_t i = r_ * inner_ + j_, o0 = b_[0] + j_ * p_->st[0][last_];            \
                int64_t o1 = b_[1] + j_ * p_->st[1][last_], o2 = b_[2] + j_ * p_->st[2][last_]; \
                (void)i, (void)o0, (void)o1, (void)o2;                                       \
                __VA_ARGS__;                                                                 \
            }                                                                                \
        }                                                                                    \
    } while (0)

/* dst[e] += the sum, over every output position where operand t's element e
 * was read, of the expression in ... (which reads offsets o0..o3). Threads
 * split the elements e; each sums its terms in row-major order. */
#define BCAST_REDUCE(plan, t, dst, ow, ...)                                                  \
    do {                                                                                     \
        const struct bplan *p_ = (plan);                                                     \
        int kept_[GP_MAX_RANK], red_[GP_MAX_RANK], nk_ = 0, nr_ = 0;                         \
        int64_t ne_ = 1, n_ = p_->numel;                                                     \
        for (int d_ = 0; d_ < p_->rank; d_++) {                                              \
            if (p_->st[t][d_]) kept_[nk_++] = d_, ne_ *= p_->dims[d_];                       \
            else red_[nr_++] = d_;                                                           \
        }                                                                                    \
        if (n_ == 0) ne_ = 0;                                                                \
        _Pragma("omp parallel for if (n_ > GP_CPU_PAR_MIN) schedule(static)")               \
        for (int64_t e_ = 0; e_ < ne_; e_++) {                                               \
            int64_t off_[BP_MAX] = {0}, idx_[GP_MAX_RANK] = {0}, rem_ = e_;                  \
            for (int q_ = nk_ - 1; q_ >= 0; q_--) {                                          \
                int d_ = kept_[q_];                                                          \
                int64_t x_ = rem_ % p_->dims[d_];                                            \
                rem_ /= p_->dims[d_];                                                        \
                for (int k_ = 0; k_ < BP_MAX; k_++) off_[k_] += x_ * p_->st[k_][d_];         \
            }                                                                                \
            int64_t at_ = off_[t];                                                           \
            double acc_ = 0;                                                                 \
            for (int q_ = 0; q_ >= 0;) {                                                     \
                int64_t o0 = off_[0], o1 = off_[1], o2 = off_[2], o3 = off_[3];              \
                (void)o0, (void)o1, (void)o2, (void)o3;                                      \
                acc_ += (double)(__VA_ARGS__);                                               \
                for (q_ = nr_ - 1; q_ >= 0; q_--) {                                          \
                    int d_ = red_[q_];                                                       \
                    for (int k_ = 0; k_ < BP_MAX; k_++) off_[k_] += p_->st[k_][d_];          \
                    if (++idx_[q_] < p_->dims[d_]) break;                                    \
                    for (int k_ = 0; k_ < BP_MAX; k_++) off_[k_] -= p_->st[k_][d_] * p_->dims[d_]; \
                    idx_[q_] = 0;                                                            \
                }                                                                            \
            }                                                                                \
            (dst)[at_] = ((ow) ? (real)0 : (dst)[at_]) + (real)acc_;                         \
        }                                                                                    \
    } while (0)

/* A plan over the node's inputs [first, first + n) and its output 0 (the
 * output is operand n). */
static void plan_node(const struct gp_cpu_ctx *c, int first, int n, struct bplan *p)
{
    const struct gp_shape *shapes[BP_MAX];
    for (int k = 0; k < n; k++) shapes[k] = gp_cpu_in_shape(c, first + k);
    shapes[n] = gp_cpu_out_shape(c, 0);
    bplan_init(p, shapes[n], n + 1, shapes);
}

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

static int64_t ipow(int64_t b, int64_t e)
{
    if (e < 0) return b == 1 ? 1 : b == -1 ? (e & 1 ? -1 : 1) : 0;
    uint64_t r = 1, ub = (uint64_t)b;
    for (; e; e >>= 1, ub *= ub)
        if (e & 1) r *= ub;
    return (int64_t)r;
}

/* Integer (and bool) semantics, as the op layer folds them: arithmetic
 * wraps, Div truncates toward zero, Mod takes the divisor's sign unless
 * fmod (then C's %); uint64 compares and divides unsigned. The caller has
 * ruled out division by zero. */
static int64_t int_op(enum bop op, int64_t x, int64_t y, bool c_fmod, bool u64)
{
    uint64_t ux = (uint64_t)x, uy = (uint64_t)y;
    switch (op) {
    case B_ADD: return (int64_t)(ux + uy);
    case B_SUB: return (int64_t)(ux - uy);
    case B_MUL: return (int64_t)(ux * uy);
    case B_DIV:
        if (u64) return (int64_t)(ux / uy);
        return x == INT64_MIN && y == -1 ? INT64_MIN : x / y;
    case B_MOD: {
        if (u64) return (int64_t)(ux % uy);
        int64_t r = y == -1 ? 0 : x % y;
        if (!c_fmod && r != 0 && (r < 0) != (y < 0)) r += y;
        return r;
    }
    case B_POW: return ipow(x, y);
    case B_EQ: return x == y;
    case B_LT: return u64 ? ux < uy : x < y;
    case B_LE: return u64 ? ux <= uy : x <= y;
    case B_GT: return u64 ? ux > uy : x > y;
    case B_GE: return u64 ? ux >= uy : x >= y;
    case B_AND: return x && y;
    case B_OR: return x || y;
    case B_XOR: return !x != !y;
    default: return 0;
    }
}

static gp_status binary_forward_int(struct gp_cpu_ctx *c, enum bop op, const struct bplan *p,
                                    struct gp_error *err)
{
    enum gp_dtype at = gp_cpu_in_value(c, 0)->dtype, bt = gp_cpu_in_value(c, 1)->dtype;
    enum gp_dtype yt = gp_cpu_out_value(c, 0)->dtype;
    const void *a = c->in[0], *b = c->in[1];
    void *y = c->out[0];
    bool c_fmod = gp_node_attr_int(c->node, "fmod", 0) != 0, u64 = at == GP_DTYPE_UINT64;
    if (op == B_DIV || op == B_MOD) { /* checked first: the loop below cannot stop */
        int64_t nb = gp_shape_numel(gp_cpu_in_shape(c, 1));
        for (int64_t i = 0; i < nb; i++)
            if (gp_cpu_load_i64(b, bt, i) == 0)
                return gp_cpu_error(c, err, GP_ERR_INVALID,
                                    "integer division by zero (divisor element %lld)",
                                    (long long)i);
    }
    if (op == B_POW && gp_dtype_is_float(bt)) /* integer base, float exponent */
        BCAST_FOR(p, gp_cpu_store_f64(y, yt, i, pow(gp_cpu_load_f64(a, at, o0),
                                                    gp_cpu_load_f64(b, bt, o1))));
    else
        BCAST_FOR(p, gp_cpu_store_i64(y, yt, i, int_op(op, gp_cpu_load_i64(a, at, o0),
                                                       gp_cpu_load_i64(b, bt, o1), c_fmod, u64)));
    return GP_OK;
}

/* A [..], B [..] -> Y [broadcast of both]; comparisons and logic give bool. */
static gp_status binary_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    enum bop op = bop_of(c->node->op_type);
    if (op == B_NONE) return gp_cpu_error(c, err, GP_ERR_UNSUPPORTED, "not a binary op");
    struct bplan p;
    plan_node(c, 0, 2, &p);
    enum gp_dtype bt = gp_cpu_in_value(c, 1)->dtype;
    if (!gp_dtype_is_float(gp_cpu_in_value(c, 0)->dtype)) return binary_forward_int(c, op, &p, err);
    const real *A = c->in[0], *B = c->in[1];
    real *Y = c->out[0];
    uint8_t *Q = c->out[0];
    switch (op) {
    case B_ADD: BCAST_FOR(&p, Y[i] = A[o0] + B[o1]); break;
    case B_SUB: BCAST_FOR(&p, Y[i] = A[o0] - B[o1]); break;
    case B_MUL: BCAST_FOR(&p, Y[i] = A[o0] * B[o1]); break;
    case B_DIV: BCAST_FOR(&p, Y[i] = A[o0] / B[o1]); break;
    case B_MOD: BCAST_FOR(&p, Y[i] = fmod(A[o0], B[o1])); break; /* fmod=1 for floats */
    case B_POW:
        if (gp_dtype_is_float(bt)) BCAST_FOR(&p, Y[i] = pow(A[o0], B[o1]));
        else BCAST_FOR(&p, Y[i] = pow(A[o0], (real)gp_cpu_load_f64(c->in[1], bt, o1)));
        break;
    case B_EQ: BCAST_FOR(&p, Q[i] = A[o0] == B[o1]); break;
    case B_LT: BCAST_FOR(&p, Q[i] = A[o0] < B[o1]); break;
    case B_LE: BCAST_FOR(&p, Q[i] = A[o0] <= B[o1]); break;
    case B_GT: BCAST_FOR(&p, Q[i] = A[o0] > B[o1]); break;
    case B_GE: BCAST_FOR(&p, Q[i] = A[o0] >= B[o1]); break;
    default: return gp_cpu_error(c, err, GP_ERR_UNSUPPORTED, "floating-point inputs");
    }
    /* A fused Relu (an Add without broadcasting: graph/fuse.c), by Relu's
     * formula (NaN passes). */
    if (c->node->fused_relu)
        for (int64_t i = 0; i < p.numel; i++) Y[i] = Y[i] > 0 || Y[i] != Y[i] ? Y[i] : 0;
    return GP_OK;
}

/* B * A^(B-1) for an integer exponent e (Pow-12+ allows one). */
static inline real pow_int_term(real a, double e)
{
    return e == 0 ? 0 : (real)e * pow(a, (real)(e - 1));
}

/* dA = sum over broadcast axes of dY * dY/dA; likewise dB. */
static gp_status binary_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    enum bop op = bop_of(c->node->op_type);
    const real *A = c->in[0], *B = c->in[1], *Y = c->out[0], *dY = c->dout[0];
    real *dA = c->din[0], *dB = c->din[1];
    bool ow_a = gp_cpu_overwrite(c, 0), ow_b = gp_cpu_overwrite(c, 1);
    if (!dY) { /* no gradient: written as zeros where asked to be written */
        if (dA && ow_a) memset(dA, 0, sizeof(real) * (size_t)gp_shape_numel(gp_cpu_in_shape(c, 0)));
        if (dB && ow_b) memset(dB, 0, sizeof(real) * (size_t)gp_shape_numel(gp_cpu_in_shape(c, 1)));
        return GP_OK;
    }
    struct bplan p;
    plan_node(c, 0, 2, &p);
    enum gp_dtype bt = gp_cpu_in_value(c, 1)->dtype;
    switch (op) {
    case B_ADD:
        if (c->node->fused_relu) { /* dY where the output is > 0: Relu's backward */
            if (dA) BCAST_REDUCE(&p, 0, dA, ow_a, Y[o2] > 0 ? dY[o2] : 0);
            if (dB) BCAST_REDUCE(&p, 1, dB, ow_b, Y[o2] > 0 ? dY[o2] : 0);
            break;
        }
        if (dA) BCAST_REDUCE(&p, 0, dA, ow_a, dY[o2]);
        if (dB) BCAST_REDUCE(&p, 1, dB, ow_b, dY[o2]);
        break;
    case B_SUB:
        if (dA) BCAST_REDUCE(&p, 0, dA, ow_a, dY[o2]);
        if (dB) BCAST_REDUCE(&p, 1, dB, ow_b, -dY[o2]);
        break;
    case B_MUL:
        if (dA) BCAST_REDUCE(&p, 0, dA, ow_a, dY[o2] * B[o1]);
        if (dB) BCAST_REDUCE(&p, 1, dB, ow_b, dY[o2] * A[o0]);
        break;
    case B_DIV:
        if (dA) BCAST_REDUCE(&p, 0, dA, ow_a, dY[o2] / B[o1]);
        if (dB) BCAST_REDUCE(&p, 1, dB, ow_b, -dY[o2] * A[o0] / (B[o1] * B[o1]));
        break;
    case B_POW: {
        /* d/dA = B * A^(B-1), 0 where B == 0; d/dB = Y * log(A), 0 where
         * A == 0 and B >= 0 (PyTorch's pow_backward_self / _exponent). */
        if (dA && gp_dtype_is_float(bt))
            BCAST_REDUCE(&p, 0, dA, ow_a, B[o1] == 0 ? 0 : dY[o2] * B[o1] * pow(A[o0], B[o1] - 1));
        else if (dA)
            BCAST_REDUCE(&p, 0, dA, ow_a, dY[o2] * pow_int_term(A[o0], gp_cpu_load_f64(c->in[1], bt, o1)));
        if (dB && gp_dtype_is_float(bt))
            BCAST_REDUCE(&p, 1, dB, ow_b, A[o0] == 0 && B[o1] >= 0 ? 0 : dY[o2] * Y[o2] * log(A[o0]));
        break;
    }
    default:
        return gp_cpu_error(c, err, GP_ERR_UNSUPPORTED, "this op has no gradient");
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

/* Max/Min backward keeps, per output element, which input it came from. */
static size_t variadic_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    const struct gp_value *y = gp_node_output(g, node, 0);
    return (size_t)gp_shape_numel(&y->shape) * sizeof(int32_t);
}

/* X0..Xn-1 [..] -> Y [broadcast of all]. Inputs fold in one at a time, so
 * Y[i] sees them in input order: Max/Min keep the first of equal values and
 * any NaN; Sum adds left to right. */
static gp_status variadic_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    enum vop op = vop_of(c->node->op_type);
    enum gp_dtype dt = gp_cpu_out_value(c, 0)->dtype;
    int n = c->node->n_inputs;
    struct bplan p;
    if (!gp_dtype_is_float(dt)) { /* integer Max / Min */
        void *Y = c->out[0];
        for (int k = 0; k < n; k++) {
            const void *X = c->in[k];
            plan_node(c, k, 1, &p);
            if (k == 0) {
                BCAST_FOR(&p, gp_cpu_store_i64(Y, dt, i, gp_cpu_load_i64(X, dt, o0)));
                continue;
            }
            bool u64 = dt == GP_DTYPE_UINT64;
            BCAST_FOR(&p, {
                int64_t v = gp_cpu_load_i64(X, dt, o0), cur = gp_cpu_load_i64(Y, dt, i);
                bool gt = u64 ? (uint64_t)v > (uint64_t)cur : v > cur;
                bool lt = u64 ? (uint64_t)v < (uint64_t)cur : v < cur;
                if (op == V_MAX ? gt : lt) gp_cpu_store_i64(Y, dt, i, v);
            });
        }
        return GP_OK;
    }
    real *Y = c->out[0];
    for (int k = 0; k < n; k++) {
        const real *X = c->in[k];
        plan_node(c, k, 1, &p);
        if (k == 0) {
            BCAST_FOR(&p, Y[i] = X[o0]);
            continue;
        }
        switch (op) {
        case V_MAX: BCAST_FOR(&p, if (X[o0] > Y[i] || (X[o0] != X[o0] && Y[i] == Y[i])) Y[i] = X[o0]); break;
        case V_MIN: BCAST_FOR(&p, if (X[o0] < Y[i] || (X[o0] != X[o0] && Y[i] == Y[i])) Y[i] = X[o0]); break;
        default: BCAST_FOR(&p, Y[i] += X[o0]); break;
        }
    }
    if (op == V_MEAN) {
        int64_t m = gp_shape_numel(gp_cpu_out_shape(c, 0));
#pragma omp parallel for if (m > GP_CPU_PAR_MIN)
        for (int64_t i = 0; i < m; i++) Y[i] /= (real)n;
    }
    return GP_OK;
}

/* Sum: dXk = dY reduced to Xk's shape; Mean: dY / n. Max/Min: dY goes to
 * the input that was selected, the first of equal ones. */
static gp_status variadic_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    enum vop op = vop_of(c->node->op_type);
    int n = c->node->n_inputs;
    const real *Y = c->out[0], *dY = c->dout[0];
    if (!dY) return GP_OK;
    struct bplan p;
    int32_t *win = c->scratch;
    if (op == V_MAX || op == V_MIN) {
        /* The selected input is the first whose value equals Y (or is NaN
         * when Y is): exactly the one the forward pass kept. */
        int64_t m = gp_shape_numel(gp_cpu_out_shape(c, 0));
        for (int64_t i = 0; i < m; i++) win[i] = -1;
        for (int k = 0; k < n; k++) {
            const real *X = c->in[k];
            plan_node(c, k, 1, &p);
            BCAST_FOR(&p, if (win[i] < 0 && (X[o0] == Y[i] || (X[o0] != X[o0] && Y[i] != Y[i])))
                              win[i] = k);
        }
    }
    for (int k = 0; k < n; k++) {
        real *dX = c->din[k];
        if (!dX) continue;
        plan_node(c, k, 1, &p);
        switch (op) {
        case V_SUM: BCAST_REDUCE(&p, 0, dX, false, dY[o1]); break;
        case V_MEAN: BCAST_REDUCE(&p, 0, dX, false, dY[o1] / (real)n); break;
        default: BCAST_REDUCE(&p, 0, dX, false, win[o1] == k ? dY[o1] : 0); break;
        }
    }
    return GP_OK;
}

/* ---- Where ---- */

/* C [..] bool, X [..], Y [..] -> Out [broadcast of the three] = C ? X : Y,
 * for any dtype of X and Y. */
static gp_status where_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    struct bplan p;
    plan_node(c, 0, 3, &p);
    const uint8_t *C = c->in[0];
    enum gp_dtype dt = gp_cpu_out_value(c, 0)->dtype;
    if (gp_dtype_is_float(dt)) {
        const real *X = c->in[1], *Y = c->in[2];
        real *O = c->out[0];
        BCAST_FOR(&p, O[i] = C[o0] ? X[o1] : Y[o2]);
    } else {
        size_t es = gp_cpu_esize(dt);
        const unsigned char *X = c->in[1], *Y = c->in[2];
        unsigned char *O = c->out[0];
        BCAST_FOR(&p, memcpy(O + (size_t)i * es, C[o0] ? X + (size_t)o1 * es : Y + (size_t)o2 * es, es));
    }
    return GP_OK;
}

/* dX = dOut where C, dY = dOut elsewhere, each reduced to its shape. */
static gp_status where_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    const real *dO = c->dout[0];
    if (!dO) return GP_OK;
    struct bplan p;
    plan_node(c, 0, 3, &p);
    const uint8_t *C = c->in[0];
    if (c->din[1]) BCAST_REDUCE(&p, 1, c->din[1], false, C[o0] ? dO[o3] : 0);
    if (c->din[2]) BCAST_REDUCE(&p, 2, c->din[2], false, C[o0] ? 0 : dO[o3]);
    return GP_OK;
}

/* ---- Expand ---- */

/* X [..] -> Y [broadcast of X's shape and the constant target], any dtype. */
static gp_status expand_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    struct bplan p;
    plan_node(c, 0, 1, &p);
    enum gp_dtype dt = gp_cpu_out_value(c, 0)->dtype;
    if (gp_dtype_is_float(dt)) {
        const real *X = c->in[0];
        real *Y = c->out[0];
        BCAST_FOR(&p, Y[i] = X[o0]);
    } else {
        size_t es = gp_cpu_esize(dt);
        const unsigned char *X = c->in[0];
        unsigned char *Y = c->out[0];
        BCAST_FOR(&p, memcpy(Y + (size_t)i * es, X + (size_t)o0 * es, es));
    }
    return GP_OK;
}

/* dX = dY summed over the expanded axes. */
static gp_status expand_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    const real *dY = c->dout[0];
    if (!dY || !c->din[0]) return GP_OK;
    struct bplan p;
    plan_node(c, 0, 1, &p);
    BCAST_REDUCE(&p, 0, c->din[0], false, dY[o1]);
    return GP_OK;
}

/* ---- the table ---- */

#define NO_GRAD(op, fwd) {op, NULL, NULL, fwd, NULL}

/* Add, Sub, Mul and Div write each element of an input's gradient once
 * (BCAST_REDUCE sums its broadcast cells first), so they can write it
 * whole; not where the output is empty (nothing is written then). */
static bool binary_overwrites(const struct gp_graph *g, const struct gp_node *node, int k)
{
    const struct gp_value *y = gp_node_output(g, node, 0);
    return (k == 0 || k == 1) && y && gp_shape_numel(&y->shape) > 0;
}

const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_binary)[] = {
    {"Add", NULL, NULL, binary_forward, binary_backward, binary_overwrites},
    {"Sub", NULL, NULL, binary_forward, binary_backward, binary_overwrites},
    {"Mul", NULL, NULL, binary_forward, binary_backward, binary_overwrites},
    {"Div", NULL, NULL, binary_forward, binary_backward, binary_overwrites},
    {"Pow", NULL, NULL, binary_forward, binary_backward},
    NO_GRAD("Mod", binary_forward),
    NO_GRAD("Equal", binary_forward),
    NO_GRAD("Less", binary_forward),
    NO_GRAD("LessOrEqual", binary_forward),
    NO_GRAD("Greater", binary_forward),
    NO_GRAD("GreaterOrEqual", binary_forward),
    NO_GRAD("And", binary_forward),
    NO_GRAD("Or", binary_forward),
    NO_GRAD("Xor", binary_forward),

    {"Max", NULL, variadic_scratch, variadic_forward, variadic_backward},
    {"Min", NULL, variadic_scratch, variadic_forward, variadic_backward},
    {"Sum", NULL, NULL, variadic_forward, variadic_backward},
    {"Mean", NULL, NULL, variadic_forward, variadic_backward},
    {"Where", NULL, NULL, where_forward, where_backward},
    {"Expand", NULL, NULL, expand_forward, expand_backward},
    {0},
};
