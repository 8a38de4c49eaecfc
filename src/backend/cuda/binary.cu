/* CUDA kernels: the binary family, twin of backend/cpu/binary.c: the
 * broadcasting ops (binary arithmetic, comparisons and logic, variadic
 * Max/Min/Sum/Mean, Where, Expand), on the plans and reductions of
 * broadcast.cuh. Same formulas as the CPU kernels, term for term, so that
 * the two agree to a few ulps.
 *
 * Types: float tensors are float32 on the device; integer and bool tensors
 * keep their types, and the ops the CPU runs on them (integer arithmetic,
 * comparisons, logic, Max/Min, Where, Expand) do the same here through the
 * same int64 / double conversions.
 *
 * bfloat16 (a bf16 stage: bf16_any entries): each float tensor is float32
 * or bfloat16 as ctx->*_dt says; the kernels are instantiated for float32
 * throughout (the float32 path), bfloat16 throughout, and a mix
 * (broadcast.cuh's storage), with float32 arithmetic and one rounding per
 * stored value, so they give what the float32 kernels on widened copies
 * gave. Max/Min/Sum/Mean stay staged: their folds keep a running result in
 * the output, which a bfloat16 output would round after every input.
 *
 * Bandwidth paths: operands of Y's shape on runs of 8 values (one 16-byte
 * access of bfloat16): the forward when neither broadcasts, Add's and
 * Sub's gradient of any operand that is not broadcast; and a row vector
 * (a bias [N] over [M, N]: row_runs.cuh) in the forward and in its
 * gradient's column sums. Each gives the generic path's bits.
 *
 * First writers: Add and Sub write an input's gradient whole when asked
 * (binary_overwrites): the runs path as 0 + the term, the others into
 * cleared memory.
 *
 * Rounding: every += into din and every product that feeds a sum is
 * spelled with __fmul_rn / __fadd_rn, which nvcc never contracts into an
 * FMA (the CPU build does not contract either).
 *
 * Differences from the CPU kernels: integer Div and Mod by zero fail on the
 * CPU, which reads the divisor first; the divisor is device data here, so
 * such an element gives 0. */
#include <float.h>
#include <math.h>
#include <string.h>

#include <cuda_runtime.h>

#include "backend/cuda/broadcast.cuh"
#include "backend/cuda/kernel.h"
#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/row_runs.cuh"

extern "C" {
#include "ops/fold_util.h"
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

/* Float A and B (B of any type for Pow: then it is an integer exponent,
 * Bi); S: the storage of A, B and a float Y (broadcast.cuh). */
template <class S>
struct fbin_op {
    typedef typename stor<S>::ptr P;
    int op, bt;
    bool b_float;
    bool relu; /* a fused Relu (Add only: graph/fuse.c) */
    P A, B, Y;
    const void *Bi;
    uint8_t *Q;
    __device__ void operator()(int64_t i, const int64_t *o) const
    {
        float a = ldf(A, o[0]);
        if (!b_float) { /* Pow with an integer exponent */
            stf(Y, i, powf(a, (float)gp_dev_load_f64(Bi, bt, o[1])));
            return;
        }
        float b = ldf(B, o[1]);
        switch (op) {
        case B_ADD: {
            float t = a + b;
            stf(Y, i, !relu || t > 0 || t != t ? t : 0.0f); /* Relu's formula: NaN passes */
            break;
        }
        case B_SUB: stf(Y, i, a - b); break;
        case B_MUL: stf(Y, i, a * b); break;
        case B_DIV: stf(Y, i, a / b); break;
        case B_MOD: stf(Y, i, fmodf(a, b)); break; /* fmod=1 for floats */
        case B_POW: stf(Y, i, powf(a, b)); break;
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
    bool c_fmod, u64, pow_float, b_bf16;
    const void *A, *B;
    void *Y;
    __device__ void operator()(int64_t i, const int64_t *o) const
    {
        if (pow_float) { /* integer base, float exponent (bfloat16 when b_bf16) */
            double e = b_bf16 ? (double)__bfloat162float(((const __nv_bfloat16 *)B)[o[1]])
                              : gp_dev_load_f64(B, bt, o[1]);
            gp_dev_store_f64(Y, yt, i, pow(gp_dev_load_f64(A, at, o[0]), e));
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

/* Add, Sub and Mul of two tensors of Y's shape (no broadcasting: the
 * residual adds), all of one storage S, on runs of 8 values (one 16-byte
 * access of bfloat16; gp_runs_fit): one value per access leaves most of
 * the bandwidth unused. The same operations per value as fbin_op. */
#define RUN 8
template <class S>
__global__ static void same_forward_runs_kernel(int op, bool relu, const S *A, const S *B, S *Y, int64_t runs)
{
    const int64_t st = (int64_t)gridDim.x * blockDim.x;
    for (int64_t r0 = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r0 < runs; r0 += 2 * st) {
        float a[2][RUN], b[2][RUN];
#pragma unroll
        for (int u = 0; u < 2; u++)
            if (r0 + u * st < runs) {
                gp_run<S, RUN>::load(A, (r0 + u * st) * RUN, a[u]);
                gp_run<S, RUN>::load(B, (r0 + u * st) * RUN, b[u]);
            }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (r0 + u * st >= runs) continue;
#pragma unroll
            for (int k = 0; k < RUN; k++) {
                float t = op == B_ADD ? a[u][k] + b[u][k] : op == B_SUB ? a[u][k] - b[u][k] : a[u][k] * b[u][k];
                a[u][k] = !relu || t > 0 || t != t ? t : 0.0f;
            }
            gp_run<S, RUN>::store(Y, (r0 + u * st) * RUN, a[u]);
        }
    }
}

/* Add's and Sub's gradient of an operand that is not broadcast (of Y's
 * shape, contiguous; the other one may be): dX += dY (Sub's second input:
 * += -dY), one rounding, as reduce_same_kernel and add_term_op compute it;
 * with Y (an Add's fused Relu) dY only where Y > 0. With `ow` (dX's first
 * writer, gp_cuda_overwrite) dX is not read: 0 + the term, as the unary
 * ops write it. */
template <class S>
__global__ static void same_grad_runs_kernel(bool negate, const S *dY, const S *Y, S *dX, int64_t runs, bool ow)
{
    const int64_t st = (int64_t)gridDim.x * blockDim.x;
    for (int64_t r0 = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r0 < runs; r0 += 2 * st) {
        float g[2][RUN], d[2][RUN];
#pragma unroll
        for (int u = 0; u < 2; u++)
            if (r0 + u * st < runs) {
                gp_run<S, RUN>::load(dY, (r0 + u * st) * RUN, g[u]);
                if (ow)
#pragma unroll
                    for (int k = 0; k < RUN; k++) d[u][k] = 0.0f;
                else
                    gp_run<S, RUN>::load(dX, (r0 + u * st) * RUN, d[u]);
                if (Y) {
                    float y[RUN];
                    gp_run<S, RUN>::load(Y, (r0 + u * st) * RUN, y);
#pragma unroll
                    for (int k = 0; k < RUN; k++) g[u][k] = y[k] > 0 ? g[u][k] : 0.0f;
                }
            }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (r0 + u * st >= runs) continue;
#pragma unroll
            for (int k = 0; k < RUN; k++) d[u][k] = __fadd_rn(d[u][k], negate ? -g[u][k] : g[u][k]);
            gp_run<S, RUN>::store(dX, (r0 + u * st) * RUN, d[u]);
        }
    }
}

/* Whether a plan has no broadcasting at all (every operand walks the
 * output's elements in order). */
static bool plan_is_same(const struct bplan *p)
{
    bool same = p->rank == 1;
    for (int k = 0; same && k < p->n; k++) same = p->st[k][0] == 1;
    return same;
}

/* Whether operand `row` (0 or 1) of a two-input plan is a row vector of
 * the last axis broadcast along every leading one ([N] or [1, N] against
 * [.., M, N]) while the other operand and the output walk [M, N] in order:
 * the plan merged down to [M, N] with those strides. */
static bool plan_is_row(const struct bplan *p, int row)
{
    if (p->rank != 2 || p->n != 3) return false;
    int64_t n = p->dims[1];
    return p->st[row][0] == 0 && p->st[row][1] == 1 && p->st[1 - row][0] == n && p->st[1 - row][1] == 1 &&
           p->st[2][0] == n && p->st[2][1] == 1;
}

/* Whether the row-vector runs (row_runs.cuh) fit a plan [M, N]: N a
 * multiple of a run, every run of the full tensors (elements of `full`
 * bytes) and of the row (`row` bytes) aligned, and the run count within
 * the kernels' 32-bit column arithmetic. */
static bool row_runs_fit(const struct bplan *p, size_t full, std::initializer_list<const void *> fulls,
                         size_t row, const void *row_ptr)
{
    return p->dims[1] % RUN_W == 0 && p->numel / RUN_W <= (int64_t)UINT32_MAX &&
           gp_runs_fit(p->numel, RUN_W, full, fulls) && gp_runs_fit(p->dims[1], RUN_W, row, {row_ptr});
}

/* Y = A op B with operand `row` a row vector (plan_is_row) through
 * row_forward_runs_kernel; F the storage of the full operand and Y, R the
 * row's. */
template <class F, class R>
static gp_status row_forward_launch(struct gp_cuda_ctx *c, const struct bplan *p, enum bop op, int row,
                                    struct gp_error *err)
{
    int64_t runs = p->numel / RUN_W;
    if (runs == 0) return GP_OK;
    unsigned grid = gp_cuda_blocks_for((runs + 1) / 2);
    int rop = op == B_ADD ? ROW_ADD : op == B_SUB ? ROW_SUB : op == B_MUL ? ROW_MUL : ROW_DIV;
    row_forward_runs_kernel<F, R><<<grid, GP_CUDA_THREADS, 0, c->stream>>>(
        rop, c->node->fused_relu && op == B_ADD, row == 0, (const F *)c->in[1 - row], (const R *)c->in[row],
        (F *)c->out[0], (uint32_t)(p->dims[1] / RUN_W), runs);
    return gp_cuda_check_launch(c, "binary forward", err);
}

template <class S>
static gp_status binary_forward_launch(struct gp_cuda_ctx *c, const struct bplan *p, enum bop op,
                                       enum gp_dtype bt, bool a16, bool b16, bool y16, struct gp_error *err)
{
    fbin_op<S> f;
    f.op = op;
    f.bt = (int)bt;
    f.b_float = gp_dtype_is_float(bt);
    f.relu = c->node->fused_relu && op == B_ADD;
    f.A = stor_ptr<S>(c->in[0], a16);
    f.B = stor_ptr<S>(c->in[1], b16);
    f.Y = stor_ptr<S>(c->out[0], y16);
    f.Bi = c->in[1];
    f.Q = (uint8_t *)c->out[0];
    return launch_bcast(c, p, f, "binary forward", err);
}

/* A [..], B [..] -> Y [broadcast of both]; comparisons and logic give bool. */
static gp_status binary_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    enum bop op = bop_of(c->node->op_type);
    if (op == B_NONE) return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "not a binary op");
    struct bplan p;
    plan_node(c, 0, 2, &p);
    enum gp_dtype at = gp_cuda_in_value(c, 0)->dtype, bt = gp_cuda_in_value(c, 1)->dtype;
    enum gp_dtype yt = gp_cuda_out_value(c, 0)->dtype;
    if (!gp_dtype_is_float(at)) {
        struct ibin_op f;
        f.op = op;
        f.at = (int)at;
        f.bt = (int)bt;
        f.yt = (int)yt;
        f.c_fmod = gp_node_attr_int(c->node, "fmod", 0) != 0;
        f.u64 = at == GP_DTYPE_UINT64;
        f.pow_float = op == B_POW && gp_dtype_is_float(bt);
        f.b_bf16 = f.pow_float && gp_cuda_is_bf16(c->in_dt, 1);
        f.A = c->in[0];
        f.B = c->in[1];
        f.Y = c->out[0];
        return launch_bcast(c, &p, f, "binary forward (integer)", err);
    }
    if (op >= B_AND) return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "floating-point inputs");
    if (!gp_dtype_is_float(bt) && op != B_POW)
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "float input 0 with %s input 1",
                             gp_dtype_name(bt));
    bool b_float = gp_dtype_is_float(bt), y_float = gp_dtype_is_float(yt);
    bool a16 = gp_cuda_is_bf16(c->in_dt, 0), b16 = gp_cuda_is_bf16(c->in_dt, 1);
    bool y16 = gp_cuda_is_bf16(c->out_dt, 0);
    /* An integer exponent or a bool result counts as neither type. */
    enum stor_kind k = stor_of({a16, b_float ? b16 : a16, y_float ? y16 : a16});
    bool relu = c->node->fused_relu && op == B_ADD;
    if ((op == B_ADD || op == B_SUB || op == B_MUL) && b_float && k != STOR_MIX && plan_is_same(&p) &&
        gp_runs_fit(p.numel, RUN, k == STOR_BF16 ? 2 : 4, {c->in[0], c->in[1], c->out[0]})) {
        if (p.numel == 0) return GP_OK;
        unsigned grid = gp_cuda_blocks_for((p.numel / RUN + 1) / 2);
        if (k == STOR_BF16)
            same_forward_runs_kernel<__nv_bfloat16><<<grid, GP_CUDA_THREADS, 0, c->stream>>>(
                op, relu, (const __nv_bfloat16 *)c->in[0], (const __nv_bfloat16 *)c->in[1], (__nv_bfloat16 *)c->out[0],
                p.numel / RUN);
        else
            same_forward_runs_kernel<float><<<grid, GP_CUDA_THREADS, 0, c->stream>>>(
                op, relu, (const float *)c->in[0], (const float *)c->in[1], (float *)c->out[0], p.numel / RUN);
        return gp_cuda_check_launch(c, "binary forward", err);
    }
    /* A bias: the full operand and Y of one storage, the row of either. */
    int row = plan_is_row(&p, 1) ? 1 : plan_is_row(&p, 0) ? 0 : -1;
    if (row >= 0 && op <= B_DIV && b_float && y_float) {
        bool f16 = row == 1 ? a16 : b16, r16 = row == 1 ? b16 : a16;
        if (f16 == y16 && row_runs_fit(&p, gp_cuda_float_size(f16), {c->in[1 - row], c->out[0]},
                                       gp_cuda_float_size(r16), c->in[row])) {
            if (f16)
                return r16 ? row_forward_launch<__nv_bfloat16, __nv_bfloat16>(c, &p, op, row, err)
                           : row_forward_launch<__nv_bfloat16, float>(c, &p, op, row, err);
            return r16 ? row_forward_launch<float, __nv_bfloat16>(c, &p, op, row, err)
                       : row_forward_launch<float, float>(c, &p, op, row, err);
        }
    }
    WITH_STOR(k, return binary_forward_launch<S>(c, &p, op, bt, a16, b16, y16, err));
}

/* The term that output position (o0, o1, o2) contributes to input t's
 * gradient, in float as the CPU computes it (PyTorch's formulas: pow's
 * gradients are 0 where B == 0, resp. where A == 0 and B >= 0). */
template <class S>
struct bin_term {
    typedef typename stor<S>::ptr P;
    int op, t, bt;
    bool b_float;
    bool relu; /* an Add's fused Relu: dY where Y > 0 */
    P A, B, Y, dY;
    const void *Bi;
    __device__ float operator()(const int64_t *o) const
    {
        float dy = ldf(dY, o[2]);
        switch (op) {
        case B_ADD: return !relu || ldf(Y, o[2]) > 0 ? dy : 0.0f;
        case B_SUB: return t == 0 ? dy : -dy;
        case B_MUL: return t == 0 ? dy * ldf(B, o[1]) : dy * ldf(A, o[0]);
        case B_DIV: {
            float b = ldf(B, o[1]);
            return t == 0 ? dy / b : -dy * ldf(A, o[0]) / (b * b);
        }
        default: /* B_POW */
            if (t == 0) {
                if (b_float) {
                    float b = ldf(B, o[1]);
                    return b == 0 ? 0.0f : dy * b * powf(ldf(A, o[0]), b - 1);
                }
                double e = gp_dev_load_f64(Bi, bt, o[1]);
                return dy * (e == 0 ? 0.0f : (float)e * powf(ldf(A, o[0]), (float)(e - 1)));
            } else {
                float a = ldf(A, o[0]), b = ldf(B, o[1]);
                return a == 0 && b >= 0 ? 0.0f : dy * ldf(Y, o[2]) * logf(a);
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

template <class S>
static gp_status binary_backward_launch(struct gp_cuda_ctx *c, const struct bplan *p, enum bop op, int t,
                                        struct gp_error *err)
{
    enum gp_dtype bt = gp_cuda_in_value(c, 1)->dtype;
    bin_term<S> term;
    term.op = op;
    term.t = t;
    term.bt = (int)bt;
    term.b_float = gp_dtype_is_float(bt);
    term.relu = c->node->fused_relu && op == B_ADD;
    term.A = stor_ptr<S>(c->in[0], gp_cuda_is_bf16(c->in_dt, 0));
    term.B = stor_ptr<S>(c->in[1], gp_cuda_is_bf16(c->in_dt, 1));
    term.Bi = c->in[1];
    term.Y = stor_ptr<S>(c->out[0], gp_cuda_is_bf16(c->out_dt, 0));
    term.dY = stor_ptr<S>(c->dout[0], gp_cuda_is_bf16(c->dout_dt, 0));
    return reduce_into(c, p, t, term, stor_ptr<S>(c->din[t], gp_cuda_is_bf16(c->din_dt, t)), c->scratch,
                       t == 0 ? "binary backward (input 0)" : "binary backward (input 1)", err);
}

/* Zeros into input t's gradient (dX's first writer taking a path that
 * adds into it). */
static gp_status zero_din(struct gp_cuda_ctx *c, int t, struct gp_error *err)
{
    int64_t n = gp_shape_numel(&gp_cuda_in_value(c, t)->shape);
    if (n == 0) return GP_OK;
    size_t es = gp_cuda_float_size(gp_cuda_is_bf16(c->din_dt, t));
    return gp_cuda_call(c, cudaMemsetAsync(c->din[t], 0, (size_t)n * es, c->stream), "cudaMemsetAsync", err);
}

/* Add's and Sub's gradient of a row vector (plan_is_row(p, t)): the
 * column sums of dY in chunks (row_grad_part_kernel), folded in a fixed
 * order into dX (reduce_finish_kernel), over the chunks reduce_into would
 * take (`nch` of `chunk` rows, nch > 1; `part`: reduce_scratch(p, t)); G
 * the storage of dY and Y, D dX's. */
template <class G, class D>
static gp_status row_grad_launch(struct gp_cuda_ctx *c, const struct bplan *p, const struct bsplit *s, int t,
                                 bool negate, const void *ymask, int64_t chunk, int64_t nch,
                                 struct gp_error *err)
{
    const char *what = t == 0 ? "binary backward (input 0)" : "binary backward (input 1)";
    row_grad_part_kernel<G><<<gp_cuda_blocks_for(p->dims[1] / GRAD_W * nch), GP_CUDA_THREADS, 0, c->stream>>>(
        negate, (const G *)c->dout[0], (const G *)ymask, p->dims[0], p->dims[1], chunk, nch, (double *)c->scratch);
    GP_TRY(gp_cuda_check_launch(c, what, err));
    reduce_finish_kernel<D *><<<gp_cuda_blocks_for(s->ne * 32), GP_CUDA_THREADS, 0, c->stream>>>(
        *p, *s, t, nch, (const double *)c->scratch, (D *)c->din[t]);
    return gp_cuda_check_launch(c, what, err);
}

/* dA = sum over A's broadcast axes of dY * dY/dA; likewise dB. With
 * gp_cuda_overwrite(c, t) (Add, Sub: binary_overwrites) dX is written
 * whole: zeros without dY. */
static gp_status binary_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    enum bop op = bop_of(c->node->op_type);
    if (op > B_POW) return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "this op has no gradient");
    enum gp_dtype bt = gp_cuda_in_value(c, 1)->dtype;
    bool b_float = gp_dtype_is_float(bt);
    if (!c->dout[0]) {
        for (int t = 0; t < 2; t++)
            if (c->din[t] && gp_cuda_overwrite(c, t)) GP_TRY(zero_din(c, t, err));
        return GP_OK;
    }
    struct bplan p;
    plan_node(c, 0, 2, &p);
    bool a16 = gp_cuda_is_bf16(c->in_dt, 0), b16 = gp_cuda_is_bf16(c->in_dt, 1);
    bool y16 = gp_cuda_is_bf16(c->out_dt, 0), dy16 = gp_cuda_is_bf16(c->dout_dt, 0);
    for (int t = 0; t < 2; t++) {
        if (!c->din[t]) continue;
        if (t == 1 && !b_float) continue; /* an integer exponent has no gradient */
        bool d16 = gp_cuda_is_bf16(c->din_dt, t), ow = gp_cuda_overwrite(c, t);
        /* The storage of what the term reads (Add and Sub: dY alone) and
         * of the gradient. */
        bool reads_ab = op != B_ADD && op != B_SUB;
        bool relu = c->node->fused_relu && op == B_ADD; /* reads Y for the mask */
        enum stor_kind k = stor_of({dy16, d16, reads_ab ? a16 : dy16, reads_ab && b_float ? b16 : dy16,
                                    op == B_POW || relu ? y16 : dy16});
        const void *ymask = relu ? c->out[0] : NULL;
        bool negate = op == B_SUB && t == 1;
        /* Operand t not broadcast (Y's elements, in order; the other one
         * may be): one term per element, on runs. */
        bool full = gp_shape_numel(&gp_cuda_in_value(c, t)->shape) == p.numel;
        if (!reads_ab && k != STOR_MIX && full &&
            gp_runs_fit(p.numel, RUN, k == STOR_BF16 ? 2 : 4, {c->dout[0], c->din[t], ymask})) {
            if (p.numel == 0) continue;
            unsigned grid = gp_cuda_blocks_for((p.numel / RUN + 1) / 2);
            if (k == STOR_BF16)
                same_grad_runs_kernel<__nv_bfloat16><<<grid, GP_CUDA_THREADS, 0, c->stream>>>(
                    negate, (const __nv_bfloat16 *)c->dout[0], (const __nv_bfloat16 *)ymask,
                    (__nv_bfloat16 *)c->din[t], p.numel / RUN, ow);
            else
                same_grad_runs_kernel<float><<<grid, GP_CUDA_THREADS, 0, c->stream>>>(
                    negate, (const float *)c->dout[0], (const float *)ymask, (float *)c->din[t], p.numel / RUN,
                    ow);
            GP_TRY(gp_cuda_check_launch(c, t == 0 ? "binary backward (input 0)" : "binary backward (input 1)", err));
            continue;
        }
        /* The paths below add into dX. */
        if (ow) GP_TRY(zero_din(c, t, err));
        if (!reads_ab && plan_is_row(&p, t)) { /* a bias: column sums on runs */
            struct bsplit s;
            bsplit_init(&s, &p, t);
            int64_t chunk, nch;
            reduce_chunks(s.ne, s.nred, &chunk, &nch);
            enum stor_kind g = stor_of({dy16, relu ? y16 : dy16});
            if (nch > 1 && c->scratch && g != STOR_MIX &&
                row_runs_fit(&p, gp_cuda_float_size(dy16), {c->dout[0], ymask}, 1, NULL)) {
                gp_status st;
                if (dy16)
                    st = d16 ? row_grad_launch<__nv_bfloat16, __nv_bfloat16>(c, &p, &s, t, negate, ymask, chunk, nch, err)
                             : row_grad_launch<__nv_bfloat16, float>(c, &p, &s, t, negate, ymask, chunk, nch, err);
                else
                    st = d16 ? row_grad_launch<float, __nv_bfloat16>(c, &p, &s, t, negate, ymask, chunk, nch, err)
                             : row_grad_launch<float, float>(c, &p, &s, t, negate, ymask, chunk, nch, err);
                GP_TRY(st);
                continue;
            }
        }
        WITH_STOR(k, GP_TRY(binary_backward_launch<S>(c, &p, op, t, err)));
    }
    return GP_OK;
}

/* Add and Sub write an input's float gradient whole when asked (the runs
 * path as 0 + the term, the others after clearing it; gp_cuda_kernel.
 * overwrites). */
static bool binary_overwrites(const struct gp_graph *g, const struct gp_node *node, int k)
{
    return (strcmp(node->op_type, "Add") == 0 || strcmp(node->op_type, "Sub") == 0) && k >= 0 && k < 2 &&
           gp_dtype_is_float(gp_node_input(g, node, k)->dtype);
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
    return gp_cuda_align256((size_t)gp_shape_numel(&gp_node_output(g, node, 0)->shape) *
                            sizeof(int32_t));
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
    enum gp_dtype dt = gp_cuda_out_value(c, 0)->dtype;
    int n = c->node->n_inputs;
    struct bplan p;
    if (!gp_dtype_is_float(dt)) {
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
        int64_t m = gp_shape_numel(&gp_cuda_out_value(c, 0)->shape);
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

/* Float values of mixed storage: widened, selected, rounded once. */
struct where_fop {
    const uint8_t *C;
    gp_fptr X, Y, O;
    __device__ void operator()(int64_t i, const int64_t *o) const
    {
        gp_st(O, i, C[o[0]] ? gp_ld(X, o[1]) : gp_ld(Y, o[2]));
    }
};

/* Elements of X, Y and O, moved as they are when all three share one
 * storage (bfloat16 ones too: widening and rounding back gives the same
 * value), else converted. */
static gp_status where_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    struct bplan p;
    plan_node(c, 0, 3, &p);
    size_t es = gp_cuda_esize(gp_cuda_out_value(c, 0)->dtype);
    if (gp_dtype_is_float(gp_cuda_out_value(c, 0)->dtype)) {
        bool x16 = gp_cuda_is_bf16(c->in_dt, 1), y16 = gp_cuda_is_bf16(c->in_dt, 2);
        bool o16 = gp_cuda_is_bf16(c->out_dt, 0);
        if (stor_of({x16, y16, o16}) == STOR_MIX) {
            struct where_fop f;
            f.C = (const uint8_t *)c->in[0];
            f.X = gp_cuda_in_f(c, 1);
            f.Y = gp_cuda_in_f(c, 2);
            f.O = gp_cuda_out_f(c, 0);
            return launch_bcast(c, &p, f, "Where forward", err);
        }
        es = gp_cuda_float_size(o16);
    }
    switch (es) {
    case 1: return where_launch<uint8_t>(c, &p, err);
    case 2: return where_launch<uint16_t>(c, &p, err);
    case 4: return where_launch<uint32_t>(c, &p, err);
    case 8: return where_launch<unsigned long long>(c, &p, err);
    default: return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "%s values",
                                  gp_dtype_name(gp_cuda_out_value(c, 0)->dtype));
    }
}

template <class S>
struct where_term {
    bool x_side;
    const uint8_t *C;
    typename stor<S>::ptr dO;
    __device__ float operator()(const int64_t *o) const
    {
        bool c = C[o[0]] != 0;
        return c == x_side ? ldf(dO, o[3]) : 0.0f;
    }
};

template <class S>
static gp_status where_backward_launch(struct gp_cuda_ctx *c, const struct bplan *p, int t, struct gp_error *err)
{
    where_term<S> term;
    term.x_side = t == 1;
    term.C = (const uint8_t *)c->in[0];
    term.dO = stor_ptr<S>(c->dout[0], gp_cuda_is_bf16(c->dout_dt, 0));
    return reduce_into(c, p, t, term, stor_ptr<S>(c->din[t], gp_cuda_is_bf16(c->din_dt, t)), c->scratch,
                       t == 1 ? "Where backward (X)" : "Where backward (Y)", err);
}

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
        enum stor_kind k = stor_of({gp_cuda_is_bf16(c->dout_dt, 0), gp_cuda_is_bf16(c->din_dt, t)});
        WITH_STOR(k, GP_TRY(where_backward_launch<S>(c, &p, t, err)));
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

/* Float X and Y of different storage: widened and rounded once. */
struct expand_fop {
    gp_fptr X, Y;
    __device__ void operator()(int64_t i, const int64_t *o) const { gp_st(Y, i, gp_ld(X, o[0])); }
};

/* X [..] -> Y [broadcast of X's shape and the constant target], any dtype
 * (moved as it is when X and Y share one storage). */
static gp_status expand_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    struct bplan p;
    plan_node(c, 0, 1, &p);
    size_t es = gp_cuda_esize(gp_cuda_out_value(c, 0)->dtype);
    if (gp_dtype_is_float(gp_cuda_out_value(c, 0)->dtype)) {
        bool x16 = gp_cuda_is_bf16(c->in_dt, 0), y16 = gp_cuda_is_bf16(c->out_dt, 0);
        if (x16 != y16) {
            struct expand_fop f;
            f.X = gp_cuda_in_f(c, 0);
            f.Y = gp_cuda_out_f(c, 0);
            return launch_bcast(c, &p, f, "Expand forward", err);
        }
        es = gp_cuda_float_size(y16);
    }
    switch (es) {
    case 1: return expand_launch<uint8_t>(c, &p, err);
    case 2: return expand_launch<uint16_t>(c, &p, err);
    case 4: return expand_launch<uint32_t>(c, &p, err);
    case 8: return expand_launch<unsigned long long>(c, &p, err);
    default: return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "%s values",
                                  gp_dtype_name(gp_cuda_out_value(c, 0)->dtype));
    }
}

template <class S>
struct expand_term {
    typename stor<S>::ptr dY;
    __device__ float operator()(const int64_t *o) const { return ldf(dY, o[1]); }
};

template <class S>
static gp_status expand_backward_launch(struct gp_cuda_ctx *c, const struct bplan *p, struct gp_error *err)
{
    expand_term<S> term;
    term.dY = stor_ptr<S>(c->dout[0], gp_cuda_is_bf16(c->dout_dt, 0));
    return reduce_into(c, p, 0, term, stor_ptr<S>(c->din[0], gp_cuda_is_bf16(c->din_dt, 0)), c->scratch,
                       "Expand backward", err);
}

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
    enum stor_kind k = stor_of({gp_cuda_is_bf16(c->dout_dt, 0), gp_cuda_is_bf16(c->din_dt, 0)});
    WITH_STOR(k, return expand_backward_launch<S>(c, &p, err));
}

/* ---- the table ---- */

/* The last field: bf16_any (any mix of bfloat16 and float32 storage;
 * the variadic ops are staged, see above). */
#define BINARY(op) {op, NULL, binary_scratch, binary_forward, binary_backward, false, true, false, binary_overwrites}
#define NO_GRAD(op, fwd) {op, NULL, NULL, fwd, NULL, false, true}
#define VARIADIC(op) {op, NULL, variadic_scratch, variadic_forward, variadic_backward}

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_binary[] = {
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
    {"Where", NULL, where_scratch, where_forward, where_backward, false, true},
    {"Expand", NULL, expand_scratch, expand_forward, expand_backward, false, true},
    {NULL, NULL, NULL, NULL, NULL},
};
