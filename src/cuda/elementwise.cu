/* CUDA kernels: the elementwise family, twin of backend/cpu/elementwise.c
 * (unary ops, Identity) and of the float32 arithmetic of binary.c (Add,
 * Sub, Mul, Div with numpy broadcasting). Same formulas as the CPU kernels,
 * term for term, so that the two agree to a few ulps: the CPU build is the
 * reference the tests hold these to.
 *
 * Float tensors only (float32); integer inputs are refused with an error
 * naming the node, except for Identity, which copies any dtype.
 *
 * Rounding: nvcc contracts a * b + c into one FMA, which the CPU build does
 * not; where a product feeds a sum (Tanh's gradient, every += into din) the
 * operations are spelled with __fmul_rn / __fadd_rn, which are never
 * contracted, so only the math library's ulps differ from the CPU. Loops
 * are grid-stride over int64 indices; no kernel uses atomics, so results
 * are identical run to run. */
#include <math.h>
#include <string.h>

#include <cuda_runtime.h>

#include "cuda/kernel.h"

extern "C" {
#include "ops/fold_util.h"
#include "util/error.h"
}

#define THREADS 256
#define MAX_BLOCKS 1024 /* grid-stride: more elements loop, fewer idle */

static unsigned blocks_for(int64_t n)
{
    int64_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < 1 ? 1 : b > MAX_BLOCKS ? MAX_BLOCKS : b);
}

#define GRID_STRIDE(i, n)                                                            \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n);        \
         i += (int64_t)gridDim.x * blockDim.x)

/* "node 'name' (Op): message" into err. */
static gp_status node_error(const struct gp_cuda_ctx *c, struct gp_error *err, gp_status st,
                            const char *msg, const char *arg)
{
    return gp_error_set(err, st, "node '%s' (%s): %s%s", c->node->name, c->node->op_type, msg,
                        arg ? arg : "");
}

static const struct gp_value *in_value(const struct gp_cuda_ctx *c, int i)
{
    return gp_node_input(c->graph, c->node, i);
}

static gp_status want_f32(const struct gp_cuda_ctx *c, int i, struct gp_error *err)
{
    enum gp_dtype dt = in_value(c, i)->dtype;
    if (dt == GP_DTYPE_FLOAT32) return GP_OK;
    return node_error(c, err, GP_ERR_UNSUPPORTED, "CUDA kernel takes float32 only, not ",
                      gp_dtype_name(dt));
}

/* ---- unary ---- */

enum uop { U_RELU, U_LEAKY, U_SIGMOID, U_TANH, U_ERF, U_SQRT, U_NEG, U_EXP, U_NONE };

static enum uop uop_of(const char *op_type)
{
    static const char *const names[] = {"Relu", "LeakyRelu", "Sigmoid", "Tanh",
                                        "Erf",  "Sqrt",      "Neg",     "Exp"};
    for (int k = 0; k < U_NONE; k++)
        if (strcmp(names[k], op_type) == 0) return (enum uop)k;
    return U_NONE;
}

/* The op is uniform across the grid, so the switches below never diverge. */
__device__ static inline float unary_f(int op, float x, float a)
{
    switch (op) {
    case U_RELU: return x > 0 || x != x ? x : 0.0f;
    case U_LEAKY: return x < 0 ? a * x : x;
    case U_SIGMOID: return x >= 0 ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x));
    case U_TANH: return tanhf(x);
    case U_ERF: return erff(x);
    case U_SQRT: return sqrtf(x);
    case U_NEG: return -x;
    case U_EXP: return expf(x);
    default: return 0.0f;
    }
}

/* dy * f'(x), reading the forward output y where the CPU kernel does. */
__device__ static inline float unary_grad(int op, float x, float y, float dy, float a)
{
    switch (op) {
    case U_RELU: return x > 0 ? dy : 0.0f;
    case U_LEAKY: return x > 0 ? dy : a * dy;
    case U_SIGMOID: return dy * (1.0f - y) * y;
    case U_TANH: return dy * __fsub_rn(1.0f, __fmul_rn(y, y));
    case U_ERF: return dy * (float)M_2_SQRTPI * expf(-x * x);
    case U_SQRT: return dy / (2.0f * y);
    case U_NEG: return -dy;
    case U_EXP: return dy * y;
    default: return 0.0f;
    }
}

/* X [n] -> Y [n]. */
__global__ static void unary_forward_kernel(int op, float a, const float *X, float *Y, int64_t n)
{
    GRID_STRIDE(i, n) Y[i] = unary_f(op, X[i], a);
}

/* dX [n] += dY [n] * f'(X); X, Y the forward input and output. */
__global__ static void unary_backward_kernel(int op, float a, const float *X, const float *Y,
                                             const float *dY, float *dX, int64_t n)
{
    GRID_STRIDE(i, n) dX[i] = __fadd_rn(dX[i], unary_grad(op, X[i], Y[i], dY[i], a));
}

static float alpha_of(const struct gp_node *node, enum uop op)
{
    return gp_node_attr_float(node, "alpha", op == U_LEAKY ? 0.01f : 1.0f);
}

static gp_status unary_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    enum uop op = uop_of(c->node->op_type);
    if (op == U_NONE) return node_error(c, err, GP_ERR_UNSUPPORTED, "not a unary op", NULL);
    GP_TRY(want_f32(c, 0, err));
    int64_t n = gp_shape_numel(&in_value(c, 0)->shape);
    if (n == 0) return GP_OK;
    unary_forward_kernel<<<blocks_for(n), THREADS, 0, c->stream>>>(
        op, alpha_of(c->node, op), (const float *)c->in[0], (float *)c->out[0], n);
    return gp_cuda_check_launch(c, "unary forward", err);
}

static gp_status unary_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    enum uop op = uop_of(c->node->op_type);
    if (op == U_NONE) return node_error(c, err, GP_ERR_UNSUPPORTED, "not a unary op", NULL);
    if (!c->dout[0] || !c->din[0]) return GP_OK;
    GP_TRY(want_f32(c, 0, err));
    int64_t n = gp_shape_numel(&in_value(c, 0)->shape);
    if (n == 0) return GP_OK;
    unary_backward_kernel<<<blocks_for(n), THREADS, 0, c->stream>>>(
        op, alpha_of(c->node, op), (const float *)c->in[0], (const float *)c->out[0],
        c->dout[0], c->din[0], n);
    return gp_cuda_check_launch(c, "unary backward", err);
}

/* ---- Identity ---- */

/* X [n] -> Y [n], any dtype: a device-to-device copy on the stream. */
static gp_status identity_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    const struct gp_value *x = in_value(c, 0);
    size_t bytes = (size_t)gp_shape_numel(&x->shape) * gp_dtype_size(x->dtype);
    if (bytes == 0 || c->out[0] == c->in[0]) return GP_OK;
    cudaError_t e = cudaMemcpyAsync(c->out[0], c->in[0], bytes, cudaMemcpyDeviceToDevice, c->stream);
    if (e != cudaSuccess)
        return node_error(c, err, GP_ERR_DEVICE, "cudaMemcpyAsync: ", cudaGetErrorString(e));
    return GP_OK;
}

/* dX [n] += dY [n]. */
__global__ static void add_into_kernel(const float *dY, float *dX, int64_t n)
{
    GRID_STRIDE(i, n) dX[i] = __fadd_rn(dX[i], dY[i]);
}

/* The gradient passes through float tensors; integer ones get none (their
 * output's dout is NULL, as on the CPU). */
static gp_status identity_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->dout[0] || !c->din[0] || in_value(c, 0)->dtype != GP_DTYPE_FLOAT32) return GP_OK;
    int64_t n = gp_shape_numel(&in_value(c, 0)->shape);
    if (n == 0) return GP_OK;
    add_into_kernel<<<blocks_for(n), THREADS, 0, c->stream>>>(c->dout[0], c->din[0], n);
    return gp_cuda_check_launch(c, "Identity backward", err);
}

/* ---- binary, broadcasting ---- */

enum bop { B_ADD, B_SUB, B_MUL, B_DIV, B_NONE };

static enum bop bop_of(const char *op_type)
{
    static const char *const names[] = {"Add", "Sub", "Mul", "Div"};
    for (int k = 0; k < B_NONE; k++)
        if (strcmp(names[k], op_type) == 0) return (enum bop)k;
    return B_NONE;
}

/* The output shape with size-1 axes dropped and neighbouring axes merged
 * where A, B and Y are all contiguous across them (the CPU's bplan, so both
 * backends sum the same terms in the same order). st[k][d]: operand k's
 * stride along axis d in elements (k = 0: A, 1: B, 2: Y), 0 where A or B is
 * broadcast. Passed to kernels by value (~340 bytes of parameters). */
struct bplan {
    int rank;
    int64_t numel;
    int64_t dims[GP_MAX_RANK];
    int64_t st[3][GP_MAX_RANK];
};

static void bplan_init(struct bplan *p, const struct gp_shape *a, const struct gp_shape *b,
                       const struct gp_shape *y)
{
    int64_t st[3][GP_MAX_RANK];
    memset(p, 0, sizeof *p);
    p->numel = gp_shape_numel(y);
    gp_bcast_strides(a, y, st[0]);
    gp_bcast_strides(b, y, st[1]);
    gp_shape_strides(y, st[2]);
    for (int d = 0; d < y->rank; d++) {
        if (y->dims[d] == 1) continue;
        int r = p->rank - 1;
        bool merge = r >= 0;
        for (int k = 0; merge && k < 3; k++) merge = p->st[k][r] == st[k][d] * y->dims[d];
        if (merge) {
            p->dims[r] *= y->dims[d];
            for (int k = 0; k < 3; k++) p->st[k][r] = st[k][d];
            continue;
        }
        p->dims[p->rank] = y->dims[d];
        for (int k = 0; k < 3; k++) p->st[k][p->rank] = st[k][d];
        p->rank++;
    }
    if (p->rank == 0) p->rank = 1, p->dims[0] = 1; /* a scalar output */
}

__device__ static inline float binary_f(int op, float a, float b)
{
    switch (op) {
    case B_ADD: return a + b;
    case B_SUB: return a - b;
    case B_MUL: return a * b;
    default: return a / b;
    }
}

/* A [..], B [..] -> Y [broadcast]; Y is contiguous, so its offset is i. */
__global__ static void binary_forward_kernel(int op, struct bplan p, const float *A, const float *B,
                                             float *Y)
{
    GRID_STRIDE(i, p.numel) {
        int64_t rem = i, oa = 0, ob = 0;
        for (int d = p.rank - 1; d >= 0; d--) {
            int64_t x = rem % p.dims[d];
            rem /= p.dims[d];
            oa += x * p.st[0][d];
            ob += x * p.st[1][d];
        }
        Y[i] = binary_f(op, A[oa], B[ob]);
    }
}

/* Same shapes (the common case: residual adds): no index arithmetic. */
__global__ static void binary_same_kernel(int op, const float *A, const float *B, float *Y, int64_t n)
{
    GRID_STRIDE(i, n) Y[i] = binary_f(op, A[i], B[i]);
}

/* The term that output position (oa, ob, oy) contributes to input t's
 * gradient, in float as the CPU computes it. */
__device__ static inline float binary_term(int op, int t, const float *A, const float *B,
                                           const float *dY, int64_t oa, int64_t ob, int64_t oy)
{
    float dy = dY[oy];
    switch (op) {
    case B_ADD: return dy;
    case B_SUB: return t == 0 ? dy : -dy;
    case B_MUL: return t == 0 ? dy * B[ob] : dy * A[oa];
    default: return t == 0 ? dy / B[ob] : -dy * A[oa] / (B[ob] * B[ob]);
    }
}

/* Axes of the plan split for input t: `kept` where t has a stride (its
 * elements), `red` where it was broadcast (summed over). */
struct bsplit {
    int nk, nr;
    int kept[GP_MAX_RANK], red[GP_MAX_RANK];
    int64_t ne; /* elements of input t */
};

/* dIn_t [ne] += the sum over the broadcast axes of the term, one thread per
 * element of input t, the terms summed in double in row-major order, as the
 * CPU's BCAST_REDUCE does: deterministic and the same sum on both backends.
 * Cost: a broadcast input with few elements (a bias [C] of a [N, C, H, W]
 * sum) gets only ne threads, each looping numel / ne times; a two-pass tree
 * reduction in a fixed order would fill the GPU when that matters. */
__global__ static void binary_backward_kernel(int op, int t, struct bplan p, struct bsplit s,
                                              const float *A, const float *B, const float *dY,
                                              float *dIn)
{
    GRID_STRIDE(e, s.ne) {
        int64_t off[3] = {0, 0, 0}, rem = e;
        for (int q = s.nk - 1; q >= 0; q--) {
            int d = s.kept[q];
            int64_t x = rem % p.dims[d];
            rem /= p.dims[d];
            for (int k = 0; k < 3; k++) off[k] += x * p.st[k][d];
        }
        int64_t at = off[t];
        int64_t idx[GP_MAX_RANK];
        for (int q = 0; q < s.nr; q++) idx[q] = 0;
        double acc = 0;
        for (int q = 0; q >= 0;) {
            acc += (double)binary_term(op, t, A, B, dY, off[0], off[1], off[2]);
            /* Odometer over the reduced axes, the last one fastest. */
            for (q = s.nr - 1; q >= 0; q--) {
                int d = s.red[q];
                for (int k = 0; k < 3; k++) off[k] += p.st[k][d];
                if (++idx[q] < p.dims[d]) break;
                for (int k = 0; k < 3; k++) off[k] -= p.st[k][d] * p.dims[d];
                idx[q] = 0;
            }
        }
        dIn[at] = __fadd_rn(dIn[at], (float)acc);
    }
}

static gp_status plan_node(struct gp_cuda_ctx *c, struct bplan *p, struct gp_error *err)
{
    GP_TRY(want_f32(c, 0, err));
    GP_TRY(want_f32(c, 1, err));
    bplan_init(p, &in_value(c, 0)->shape, &in_value(c, 1)->shape,
               &gp_node_output(c->graph, c->node, 0)->shape);
    return GP_OK;
}

static gp_status binary_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    enum bop op = bop_of(c->node->op_type);
    if (op == B_NONE) return node_error(c, err, GP_ERR_UNSUPPORTED, "not a binary op", NULL);
    struct bplan p;
    GP_TRY(plan_node(c, &p, err));
    if (p.numel == 0) return GP_OK;
    const float *A = (const float *)c->in[0], *B = (const float *)c->in[1];
    float *Y = (float *)c->out[0];
    if (p.rank == 1 && p.st[0][0] == 1 && p.st[1][0] == 1)
        binary_same_kernel<<<blocks_for(p.numel), THREADS, 0, c->stream>>>(op, A, B, Y, p.numel);
    else
        binary_forward_kernel<<<blocks_for(p.numel), THREADS, 0, c->stream>>>(op, p, A, B, Y);
    return gp_cuda_check_launch(c, "binary forward", err);
}

/* dA = sum over A's broadcast axes of dY * dY/dA; likewise dB. */
static gp_status binary_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    enum bop op = bop_of(c->node->op_type);
    if (op == B_NONE) return node_error(c, err, GP_ERR_UNSUPPORTED, "not a binary op", NULL);
    if (!c->dout[0]) return GP_OK;
    struct bplan p;
    GP_TRY(plan_node(c, &p, err));
    if (p.numel == 0) return GP_OK;
    for (int t = 0; t < 2; t++) {
        if (!c->din[t]) continue;
        struct bsplit s;
        memset(&s, 0, sizeof s);
        s.ne = 1;
        for (int d = 0; d < p.rank; d++) {
            if (p.st[t][d]) s.kept[s.nk++] = d, s.ne *= p.dims[d];
            else s.red[s.nr++] = d;
        }
        binary_backward_kernel<<<blocks_for(s.ne), THREADS, 0, c->stream>>>(
            op, t, p, s, (const float *)c->in[0], (const float *)c->in[1], c->dout[0], c->din[t]);
        GP_TRY(gp_cuda_check_launch(c, t == 0 ? "binary backward (input 0)" : "binary backward (input 1)",
                                    err));
    }
    return GP_OK;
}

/* ---- the table ---- */

#define UNARY(op) {op, NULL, NULL, unary_forward, unary_backward}
#define BINARY(op) {op, NULL, NULL, binary_forward, binary_backward}

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_elementwise[] = {
    UNARY("Relu"), UNARY("LeakyRelu"), UNARY("Sigmoid"), UNARY("Tanh"), UNARY("Erf"),
    UNARY("Sqrt"), UNARY("Neg"), UNARY("Exp"),
    BINARY("Add"), BINARY("Sub"), BINARY("Mul"), BINARY("Div"),
    {"Identity", NULL, NULL, identity_forward, identity_backward},
    {NULL, NULL, NULL, NULL, NULL},
};
