/* CUDA kernels: the misc family, twin of backend/cpu/misc.c and resize.c:
 * Softmax and LogSoftmax, the reductions (ReduceSum, Mean, Max, Min, Prod,
 * SumSquare, L2), ArgMax/ArgMin, Dropout, Resize and Upsample.
 *
 * Same semantics as the CPU kernels, term for term: sums accumulate in
 * double, NaNs propagate the same way, ties and zeros get the same
 * gradients, Dropout draws the same mask (the counter-based Philox of
 * backend/cpu/rng.h, compiled for the device too, keyed by seed, step, the
 * node's source_index and the element's global index in the mini-batch).
 *
 * Determinism: no float atomics. Row and cell reductions run one warp or
 * one block per row / cell with a fixed-order tree (or one thread per cell
 * in the CPU's own order where that reads coalesced), so results are the
 * same run to run. Resize's backward gathers: each input element adds the
 * gradients of the outputs that read it, in the CPU's order (row-major
 * output, corner by corner), in float, straight into dX, which reproduces
 * the CPU's scatter bit for bit. The only integer atomics are the min/max
 * that find, per input position, the range of outputs reading it (order
 * independent).
 *
 * Rounding: nvcc contracts a * b + c into FMAs, the CPU build does not;
 * where a product feeds a sum the operations are spelled with the _rn
 * intrinsics. expf/logf are CUDA's (a few ulps from glibc's). */
#include <math.h>
#include <string.h>

#include "backend/cuda/kernel_util.cuh"

extern "C" {
#include "ops/fold_util.h"
}

#include "backend/cpu/rng.h"

#define FADD __fadd_rn
#define FSUB __fsub_rn
#define FMUL __fmul_rn
#define DADD __dadd_rn
#define DMUL __dmul_rn

/* ---- shared helpers ---- */

static struct gp_infer_ctx infer_ctx(const struct gp_graph *g, const struct gp_node *node,
                                     struct gp_error *err)
{
    struct gp_infer_ctx ic;
    ic.graph = (struct gp_graph *)g;
    ic.node = (struct gp_node *)node;
    ic.err = err;
    return ic;
}

/* a / b for a, b >= 0: 32-bit division when both fit (a fraction of the
 * 64-bit one's instructions), which index decompositions nearly always
 * allow. */
__device__ static inline int64_t fdiv(int64_t a, int64_t b)
{
    return ((a | b) >> 32) == 0 ? (int64_t)((uint32_t)a / (uint32_t)b) : a / b;
}

__device__ static inline double warp_sum(double v)
{
    for (int o = 16; o > 0; o >>= 1) v = DADD(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* ---- Softmax, LogSoftmax ---- */

/* The input as `count` vectors of `len` elements `stride` apart (the CPU's
 * struct vecs): before opset 13 the rows of [D0..D(axis-1), rest], since 13
 * the vectors along `axis` alone. */
struct vecs {
    int64_t count, len, stride;
};

static gp_status softmax_vecs(const struct gp_cuda_ctx *c, struct gp_error *err, struct vecs *v)
{
    struct gp_infer_ctx ic = infer_ctx(c->graph, c->node, err);
    const struct gp_shape *xs = &gp_cuda_in_value(c, 0)->shape;
    bool coerce = c->node->def->since_version < 13;
    int axis;
    GP_TRY(gp_norm_axis(&ic, gp_node_attr_int(c->node, "axis", coerce ? 1 : -1), xs->rank, &axis));
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= xs->dims[d];
    for (int d = axis + 1; d < xs->rank; d++) inner *= xs->dims[d];
    if (coerce) v->count = outer, v->len = xs->dims[axis] * inner, v->stride = 1;
    else v->count = outer * inner, v->len = xs->dims[axis], v->stride = inner;
    return GP_OK;
}

/* The CPU's running maximum: a NaN sticks. */
__device__ static inline float max_nan(float m, float x)
{
    return x > m || x != x ? x : m;
}

__device__ static float block_max(float v, float *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_down_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : -INFINITY;
        for (int o = 16; o > 0; o >>= 1) v = max_nan(v, __shfl_down_sync(0xffffffffu, v, o));
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

/* One block per row (stride 1): max, sum of exp in double, write. */
template <bool VEC>
__global__ static void softmax_rows_kernel(const float *X, float *Y, int64_t rows, int64_t len,
                                           bool log_out)
{
    __shared__ double sh[32];
    __shared__ float shf[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *x = X + r * len;
        float *y = Y + r * len;
        float m = -INFINITY;
        if (VEC) {
            const float4 *x4 = (const float4 *)x;
            for (int64_t q = threadIdx.x; q < len / 4; q += blockDim.x) {
                float4 v = x4[q];
                m = max_nan(max_nan(max_nan(max_nan(m, v.x), v.y), v.z), v.w);
            }
        } else {
            for (int64_t j = threadIdx.x; j < len; j += blockDim.x) m = max_nan(m, x[j]);
        }
        m = block_max(m, shf);
        if (m == -INFINITY) m = 0;
        double s = 0;
        if (VEC) {
            const float4 *x4 = (const float4 *)x;
            for (int64_t q = threadIdx.x; q < len / 4; q += blockDim.x) {
                float4 v = x4[q];
                s = DADD(s, (double)expf(FSUB(v.x, m)));
                s = DADD(s, (double)expf(FSUB(v.y, m)));
                s = DADD(s, (double)expf(FSUB(v.z, m)));
                s = DADD(s, (double)expf(FSUB(v.w, m)));
            }
        } else {
            for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
                s = DADD(s, (double)expf(FSUB(x[j], m)));
        }
        s = gp_dev_block_sum(s, sh);
        if (log_out) {
            float ls = (float)log(s);
            if (VEC) {
                const float4 *x4 = (const float4 *)x;
                float4 *y4 = (float4 *)y;
                for (int64_t q = threadIdx.x; q < len / 4; q += blockDim.x) {
                    float4 v = x4[q], o;
                    o.x = FSUB(FSUB(v.x, m), ls);
                    o.y = FSUB(FSUB(v.y, m), ls);
                    o.z = FSUB(FSUB(v.z, m), ls);
                    o.w = FSUB(FSUB(v.w, m), ls);
                    y4[q] = o;
                }
            } else {
                for (int64_t j = threadIdx.x; j < len; j += blockDim.x) y[j] = FSUB(FSUB(x[j], m), ls);
            }
        } else {
            float inv = (float)(1.0 / s);
            if (VEC) {
                const float4 *x4 = (const float4 *)x;
                float4 *y4 = (float4 *)y;
                for (int64_t q = threadIdx.x; q < len / 4; q += blockDim.x) {
                    float4 v = x4[q], o;
                    o.x = FMUL(expf(FSUB(v.x, m)), inv);
                    o.y = FMUL(expf(FSUB(v.y, m)), inv);
                    o.z = FMUL(expf(FSUB(v.z, m)), inv);
                    o.w = FMUL(expf(FSUB(v.w, m)), inv);
                    y4[q] = o;
                }
            } else {
                for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
                    y[j] = FMUL(expf(FSUB(x[j], m)), inv);
            }
        }
    }
}

#define WARP_ROW_MAX 1024 /* rows up to this length: one warp each */

/* One warp per row (stride 1, short rows): three passes over the row, the
 * second and third from L1. (Keeping the row in registers, fully unrolled,
 * measured 3x slower on an H200.) */
__global__ static void softmax_warp_kernel(const float *X, float *Y, int64_t rows, int64_t len,
                                           bool log_out)
{
    int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    for (int64_t r = blockIdx.x * (int64_t)wpb + (threadIdx.x >> 5); r < rows;
         r += (int64_t)gridDim.x * wpb) {
        const float *x = X + r * len;
        float *y = Y + r * len;
        float m = -INFINITY;
        for (int64_t j = lane; j < len; j += 32) m = max_nan(m, x[j]);
        for (int o = 16; o > 0; o >>= 1) m = max_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (m == -INFINITY) m = 0;
        double s = 0;
        for (int64_t j = lane; j < len; j += 32) s = DADD(s, (double)expf(FSUB(x[j], m)));
        s = warp_sum(s);
        if (log_out) {
            float ls = (float)log(s);
            for (int64_t j = lane; j < len; j += 32) y[j] = FSUB(FSUB(x[j], m), ls);
        } else {
            float inv = (float)(1.0 / s);
            for (int64_t j = lane; j < len; j += 32) y[j] = FMUL(expf(FSUB(x[j], m)), inv);
        }
    }
}

/* One thread per vector (stride > 1: the vectors interleave, so
 * neighbouring threads read neighbouring addresses), in the CPU's order. */
__global__ static void softmax_strided_kernel(struct vecs v, const float *X, float *Y, bool log_out)
{
    GP_GRID_STRIDE(k, v.count) {
        int64_t o = k / v.stride * v.len * v.stride + k % v.stride, s = v.stride;
        const float *x = X + o;
        float *y = Y + o;
        float m = -INFINITY;
        for (int64_t j = 0; j < v.len; j++) m = max_nan(m, x[j * s]);
        if (m == -INFINITY) m = 0;
        double sum = 0;
        for (int64_t j = 0; j < v.len; j++) sum = DADD(sum, (double)expf(FSUB(x[j * s], m)));
        if (log_out) {
            float ls = (float)log(sum);
            for (int64_t j = 0; j < v.len; j++) y[j * s] = FSUB(FSUB(x[j * s], m), ls);
        } else {
            float inv = (float)(1.0 / sum);
            for (int64_t j = 0; j < v.len; j++) y[j * s] = FMUL(expf(FSUB(x[j * s], m)), inv);
        }
    }
}

static bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

static unsigned row_block_threads(int64_t len)
{
    return len <= 4096 ? 256 : len <= 16384 ? 512 : 1024;
}

/* X [..] -> Y [..]: exp(x - max) / sum, or (x - max) - log(sum). */
static gp_status softmax_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    GP_TRY(gp_cuda_want_f32(c, 0, err));
    struct vecs v;
    GP_TRY(softmax_vecs(c, err, &v));
    if (v.count == 0 || v.len == 0) return GP_OK;
    bool log_out = strcmp(c->node->op_type, "LogSoftmax") == 0;
    const float *X = (const float *)c->in[0];
    float *Y = (float *)c->out[0];
    if (v.stride > 1) {
        softmax_strided_kernel<<<gp_cuda_blocks_for(v.count), GP_CUDA_THREADS, 0, c->stream>>>(v, X, Y,
                                                                                             log_out);
    } else if (v.len <= WARP_ROW_MAX) {
        int64_t blocks = (v.count + 7) / 8;
        softmax_warp_kernel<<<gp_cuda_capped_grid(blocks, 1 << 20), 256, 0, c->stream>>>(X, Y, v.count, v.len,
                                                                                log_out);
    } else {
        unsigned t = row_block_threads(v.len), g = gp_cuda_capped_grid(v.count, 1 << 20);
        if (v.len % 4 == 0 && aligned16(X) && aligned16(Y))
            softmax_rows_kernel<true><<<g, t, 0, c->stream>>>(X, Y, v.count, v.len, log_out);
        else
            softmax_rows_kernel<false><<<g, t, 0, c->stream>>>(X, Y, v.count, v.len, log_out);
    }
    return gp_cuda_check_launch(c, log_out ? "LogSoftmax forward" : "Softmax forward", err);
}

/* The terms of the backward dot product and of dX, as the CPU writes them:
 * Softmax dot += dy y, dx += y (dy - dot); LogSoftmax dot += dy,
 * dx += dy - exp(y) dot. */
__device__ static inline float sm_dot_term(bool log_out, float y, float dy)
{
    return log_out ? dy : FMUL(dy, y);
}

__device__ static inline float sm_dx(bool log_out, float y, float dy, float d)
{
    return log_out ? FSUB(dy, FMUL(expf(y), d)) : FMUL(y, FSUB(dy, d));
}

template <bool VEC>
__global__ static void softmax_bwd_rows_kernel(const float *Y, const float *dY, float *dX,
                                               int64_t rows, int64_t len, bool log_out)
{
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *y = Y + r * len, *dy = dY + r * len;
        float *dx = dX + r * len;
        double dot = 0;
        if (VEC) {
            const float4 *y4 = (const float4 *)y, *dy4 = (const float4 *)dy;
            for (int64_t q = threadIdx.x; q < len / 4; q += blockDim.x) {
                float4 a = y4[q], b = dy4[q];
                dot = DADD(dot, (double)sm_dot_term(log_out, a.x, b.x));
                dot = DADD(dot, (double)sm_dot_term(log_out, a.y, b.y));
                dot = DADD(dot, (double)sm_dot_term(log_out, a.z, b.z));
                dot = DADD(dot, (double)sm_dot_term(log_out, a.w, b.w));
            }
        } else {
            for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
                dot = DADD(dot, (double)sm_dot_term(log_out, y[j], dy[j]));
        }
        float d = (float)gp_dev_block_sum(dot, sh);
        if (VEC) {
            const float4 *y4 = (const float4 *)y, *dy4 = (const float4 *)dy;
            float4 *dx4 = (float4 *)dx;
            for (int64_t q = threadIdx.x; q < len / 4; q += blockDim.x) {
                float4 a = y4[q], b = dy4[q], o = dx4[q];
                o.x = FADD(o.x, sm_dx(log_out, a.x, b.x, d));
                o.y = FADD(o.y, sm_dx(log_out, a.y, b.y, d));
                o.z = FADD(o.z, sm_dx(log_out, a.z, b.z, d));
                o.w = FADD(o.w, sm_dx(log_out, a.w, b.w, d));
                dx4[q] = o;
            }
        } else {
            for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
                dx[j] = FADD(dx[j], sm_dx(log_out, y[j], dy[j], d));
        }
    }
}

__global__ static void softmax_bwd_warp_kernel(const float *Y, const float *dY, float *dX,
                                               int64_t rows, int64_t len, bool log_out)
{
    int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    for (int64_t r = blockIdx.x * (int64_t)wpb + (threadIdx.x >> 5); r < rows;
         r += (int64_t)gridDim.x * wpb) {
        const float *y = Y + r * len, *dy = dY + r * len;
        float *dx = dX + r * len;
        double dot = 0;
        for (int64_t j = lane; j < len; j += 32) dot = DADD(dot, (double)sm_dot_term(log_out, y[j], dy[j]));
        float d = (float)warp_sum(dot);
        for (int64_t j = lane; j < len; j += 32) dx[j] = FADD(dx[j], sm_dx(log_out, y[j], dy[j], d));
    }
}

__global__ static void softmax_bwd_strided_kernel(struct vecs v, const float *Y, const float *dY,
                                                  float *dX, bool log_out)
{
    GP_GRID_STRIDE(k, v.count) {
        int64_t o = k / v.stride * v.len * v.stride + k % v.stride, s = v.stride;
        const float *y = Y + o, *dy = dY + o;
        float *dx = dX + o;
        double dot = 0;
        for (int64_t j = 0; j < v.len; j++) dot = DADD(dot, (double)sm_dot_term(log_out, y[j * s], dy[j * s]));
        float d = (float)dot;
        for (int64_t j = 0; j < v.len; j++) dx[j * s] = FADD(dx[j * s], sm_dx(log_out, y[j * s], dy[j * s], d));
    }
}

static gp_status softmax_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    const float *Y = (const float *)c->out[0], *dY = c->dout[0];
    float *dX = c->din[0];
    if (!dY || !dX) return GP_OK;
    GP_TRY(gp_cuda_want_f32(c, 0, err));
    struct vecs v;
    GP_TRY(softmax_vecs(c, err, &v));
    if (v.count == 0 || v.len == 0) return GP_OK;
    bool log_out = strcmp(c->node->op_type, "LogSoftmax") == 0;
    if (v.stride > 1) {
        softmax_bwd_strided_kernel<<<gp_cuda_blocks_for(v.count), GP_CUDA_THREADS, 0, c->stream>>>(
            v, Y, dY, dX, log_out);
    } else if (v.len <= WARP_ROW_MAX) {
        int64_t blocks = (v.count + 7) / 8;
        softmax_bwd_warp_kernel<<<gp_cuda_capped_grid(blocks, 1 << 20), 256, 0, c->stream>>>(Y, dY, dX, v.count,
                                                                                    v.len, log_out);
    } else {
        unsigned t = row_block_threads(v.len), g = gp_cuda_capped_grid(v.count, 1 << 20);
        if (v.len % 4 == 0 && aligned16(Y) && aligned16(dY) && aligned16(dX))
            softmax_bwd_rows_kernel<true><<<g, t, 0, c->stream>>>(Y, dY, dX, v.count, v.len, log_out);
        else
            softmax_bwd_rows_kernel<false><<<g, t, 0, c->stream>>>(Y, dY, dX, v.count, v.len, log_out);
    }
    return gp_cuda_check_launch(c, log_out ? "LogSoftmax backward" : "Softmax backward", err);
}

/* ---- reductions ---- */

enum rkind {
    R_SUM, R_MEAN, R_MAX, R_MIN, R_PROD, R_SUM_SQUARE, R_L2,
    X_TIES, X_ZEROS, X_NZPROD, /* backward's per-cell statistics */
};

static enum rkind rkind_of(const char *op)
{
    static const char *const names[] = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin",
                                        "ReduceProd", "ReduceSumSquare", "ReduceL2"};
    for (int k = 0; k < 7; k++)
        if (strcmp(op, names[k]) == 0) return (enum rkind)k;
    return R_SUM;
}

/* The input's axes split into kept ones (one output cell per index) and
 * reduced ones, with the input's strides (the CPU's struct rplan). */
struct rplan {
    int nk, nr;
    int64_t kdims[GP_MAX_RANK], kst[GP_MAX_RANK];
    int64_t rdims[GP_MAX_RANK], rst[GP_MAX_RANK];
    int64_t cells, count;
    /* Per input axis: the cell stride (0 for reduced axes), for backward. */
    int rank;
    int64_t dims[GP_MAX_RANK], cst[GP_MAX_RANK];
};

/* Axes from the attribute (opsets before 13 / 18) or the constant input 1;
 * none reduces all, or nothing with noop_with_empty_axes. */
static gp_status reduce_plan(const struct gp_graph *g, const struct gp_node *node,
                             struct gp_error *err, struct rplan *p)
{
    struct gp_infer_ctx ic = infer_ctx(g, node, err);
    const struct gp_shape *xs = &gp_node_input(g, node, 0)->shape;
    int r = xs->rank, n = 0;
    int64_t axes[GP_MAX_RANK];
    if (node->def->max_inputs >= 2) {
        if (node->n_inputs > 1 && node->inputs[1] >= 0)
            GP_TRY(gp_const_ints(&ic, 1, "axes", axes, GP_MAX_RANK, &n));
    } else {
        const int64_t *a;
        int64_t count = gp_node_attr_ints(node, "axes", &a);
        for (int64_t k = 0; k < count && k < GP_MAX_RANK; k++) axes[n++] = a[k];
    }
    bool noop = n == 0 && gp_node_attr_int(node, "noop_with_empty_axes", 0) != 0;
    bool red[GP_MAX_RANK];
    for (int d = 0; d < r; d++) red[d] = n == 0 && !noop;
    for (int k = 0; k < n; k++) {
        int d;
        GP_TRY(gp_norm_axis(&ic, axes[k], r, &d));
        red[d] = true;
    }
    int64_t st[GP_MAX_RANK];
    gp_shape_strides(xs, st);
    memset(p, 0, sizeof *p);
    p->cells = p->count = 1;
    p->rank = r;
    for (int d = 0; d < r; d++) {
        p->dims[d] = xs->dims[d];
        if (red[d]) {
            p->rdims[p->nr] = xs->dims[d], p->rst[p->nr++] = st[d];
            p->count *= xs->dims[d];
        } else {
            p->kdims[p->nk] = xs->dims[d], p->kst[p->nk++] = st[d];
            p->cells *= xs->dims[d];
        }
    }
    int64_t acc = 1;
    for (int d = r - 1; d >= 0; d--) {
        p->cst[d] = red[d] ? 0 : acc;
        if (!red[d]) acc *= xs->dims[d];
    }
    return GP_OK;
}

__device__ static inline int64_t cell_base(const struct rplan &p, int64_t cell)
{
    int64_t base = 0;
    for (int q = p.nk - 1; q >= 0; q--) {
        base += cell % p.kdims[q] * p.kst[q];
        cell /= p.kdims[q];
    }
    return base;
}

/* Offset (from the cell's base) of the cell's element e, row-major over
 * the reduced axes. */
__device__ static inline int64_t red_offset(const struct rplan &p, int64_t e)
{
    if (p.nr == 1) return e * p.rst[0];
    int64_t off = 0;
    for (int q = p.nr - 1; q >= 0; q--) {
        off += e % p.rdims[q] * p.rst[q];
        e /= p.rdims[q];
    }
    return off;
}

/* Steps the reduced multi-index and the offset; false when done. */
__device__ static inline bool cell_next(const struct rplan &p, int64_t *idx, int64_t *off)
{
    for (int q = p.nr - 1; q >= 0; q--) {
        *off += p.rst[q];
        if (++idx[q] < p.rdims[q]) return true;
        *off -= p.rst[q] * p.rdims[q];
        idx[q] = 0;
    }
    return false;
}

/* Per kind: the element's term, how terms combine, the starting value. */
__device__ static inline double r_term(int kind, float v, float y)
{
    switch (kind) {
    case R_SUM_SQUARE: case R_L2: return DMUL((double)v, (double)v);
    case X_TIES: return v == y || (v != v && y != y) ? 1.0 : 0.0;
    case X_ZEROS: return v == 0 ? 1.0 : 0.0;
    case X_NZPROD: return v == 0 ? 1.0 : (double)v;
    default: return (double)v;
    }
}

/* a is the accumulator (earlier elements), b the new term: Max/Min keep
 * the first NaN, as the CPU's `if (v > best || v != v) best = best != best
 * ? best : v`. */
__device__ static inline double r_combine(int kind, double a, double b)
{
    switch (kind) {
    case R_MAX: return a != a ? a : (b > a || b != b) ? b : a;
    case R_MIN: return a != a ? a : (b < a || b != b) ? b : a;
    case R_PROD: case X_NZPROD: return DMUL(a, b);
    default: return DADD(a, b);
    }
}

__device__ static inline double r_identity(int kind)
{
    switch (kind) {
    case R_MAX: return -INFINITY;
    case R_MIN: return INFINITY;
    case R_PROD: case X_NZPROD: return 1.0;
    default: return 0.0;
    }
}

/* The cell's result into Y (float, forward kinds) or aux (double,
 * backward's statistics). */
__device__ static inline void r_store(int kind, const struct rplan &p, double acc, int64_t cell,
                                      float *Y, double *aux)
{
    switch (kind) {
    case R_MEAN: Y[cell] = (float)(acc / (double)p.count); break;
    case R_L2: Y[cell] = (float)sqrt(acc); break;
    case X_TIES: case X_ZEROS: case X_NZPROD: aux[cell] = acc; break;
    default: Y[cell] = (float)acc; break;
    }
}

/* One thread per cell, the CPU's order exactly. Y_in: the forward output
 * (X_TIES compares with it). */
__global__ static void reduce_thread_kernel(struct rplan p, int kind, const float *X,
                                            const float *Y_in, float *Y, double *aux)
{
    GP_GRID_STRIDE(cell, p.cells) {
        int64_t off = cell_base(p, cell), idx[GP_MAX_RANK];
        for (int q = 0; q < p.nr; q++) idx[q] = 0;
        float y = Y_in ? Y_in[cell] : 0.0f;
        double acc = r_identity(kind);
        do acc = r_combine(kind, acc, r_term(kind, X[off], y));
        while (cell_next(p, idx, &off));
        r_store(kind, p, acc, cell, Y, aux);
    }
}

/* One warp per cell (warp = true) or one block per cell: strided partial
 * terms, then a fixed-order tree. */
template <bool WARP>
__global__ static void reduce_group_kernel(struct rplan p, int kind, const float *X,
                                           const float *Y_in, float *Y, double *aux)
{
    __shared__ double sh[32];
    int lane = threadIdx.x & 31;
    int64_t first = WARP ? blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5) : blockIdx.x;
    int64_t step = WARP ? (int64_t)gridDim.x * (blockDim.x >> 5) : gridDim.x;
    int64_t t0 = WARP ? lane : threadIdx.x, ts = WARP ? 32 : blockDim.x;
    for (int64_t cell = first; cell < p.cells; cell += step) {
        int64_t base = cell_base(p, cell);
        float y = Y_in ? Y_in[cell] : 0.0f;
        double acc = r_identity(kind);
        for (int64_t e = t0; e < p.count; e += ts)
            acc = r_combine(kind, acc, r_term(kind, X[base + red_offset(p, e)], y));
        /* Tree: the lower-indexed partner is the accumulator. */
        for (int o = 16; o > 0; o >>= 1) acc = r_combine(kind, acc, __shfl_down_sync(0xffffffffu, acc, o));
        if (!WARP) {
            int w = threadIdx.x >> 5, nw = blockDim.x >> 5;
            __syncthreads();
            if (lane == 0) sh[w] = acc;
            __syncthreads();
            if (w == 0) {
                acc = lane < nw ? sh[lane] : r_identity(kind);
                for (int o = 16; o > 0; o >>= 1)
                    acc = r_combine(kind, acc, __shfl_down_sync(0xffffffffu, acc, o));
            }
        }
        if ((WARP ? lane : threadIdx.x) == 0) r_store(kind, p, acc, cell, Y, aux);
    }
}

/* Integer data, one thread per cell: sums wrap in uint64, Mean truncates,
 * as the CPU's reduce_forward_int. */
__global__ static void reduce_int_kernel(struct rplan p, int kind, int dt, const void *X, void *Y)
{
    GP_GRID_STRIDE(cell, p.cells) {
        int64_t off = cell_base(p, cell), idx[GP_MAX_RANK];
        for (int q = 0; q < p.nr; q++) idx[q] = 0;
        uint64_t acc = kind == R_PROD ? 1 : 0;
        int64_t best = 0;
        bool first = true;
        do {
            int64_t v = gp_dev_load_i64(X, dt, off);
            switch (kind) {
            case R_MAX: if (first || v > best) best = v; break;
            case R_MIN: if (first || v < best) best = v; break;
            case R_PROD: acc *= (uint64_t)v; break;
            case R_SUM_SQUARE: case R_L2: acc += (uint64_t)v * (uint64_t)v; break;
            default: acc += (uint64_t)v; break;
            }
            first = false;
        } while (cell_next(p, idx, &off));
        int64_t out = kind == R_MAX || kind == R_MIN ? best : (int64_t)acc;
        if (kind == R_MEAN) out = p.count ? out / p.count : 0;
        if (kind == R_L2) out = (int64_t)sqrt((double)out);
        gp_dev_store_i64(Y, dt, cell, out);
    }
}

__global__ static void fill_f32_kernel(float *Y, int64_t n, float v)
{
    GP_GRID_STRIDE(i, n) Y[i] = v;
}

/* Launches the cell reduction of `kind` with the layout that reads
 * coalesced: a warp or block per cell when the last input axis is reduced
 * (or the cells are few), else a thread per cell. */
static void launch_reduce(const struct rplan &p, int kind, const float *X, const float *Y_in,
                          float *Y, double *aux, cudaStream_t s)
{
    bool last_reduced = p.nr > 0 && p.rst[p.nr - 1] == 1;
    if (p.nr == 0 || p.count <= 8 || (!last_reduced && p.cells >= 2048)) {
        reduce_thread_kernel<<<gp_cuda_blocks_for(p.cells), GP_CUDA_THREADS, 0, s>>>(p, kind, X, Y_in,
                                                                                   Y, aux);
    } else if (p.count <= 2048) {
        reduce_group_kernel<true><<<gp_cuda_capped_grid((p.cells + 7) / 8, 1 << 20), 256, 0, s>>>(p, kind, X, Y_in,
                                                                                         Y, aux);
    } else {
        unsigned t = p.count >= 65536 ? 512 : 256;
        reduce_group_kernel<false><<<gp_cuda_capped_grid(p.cells, 1 << 20), t, 0, s>>>(p, kind, X, Y_in, Y, aux);
    }
}

/* Scratch: backward of Max/Min (ties) and Prod (zeros, nonzero product):
 * two doubles per cell. */
static size_t reduce_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    enum rkind kind = rkind_of(node->op_type);
    if (kind != R_MAX && kind != R_MIN && kind != R_PROD) return 0;
    struct rplan p;
    if (reduce_plan(g, node, NULL, &p) != GP_OK) return 0;
    return 2 * sizeof(double) * (size_t)p.cells;
}

/* X [..] -> Y [kept axes, reduced ones as 1 or gone]. */
static gp_status reduce_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    struct rplan p;
    GP_TRY(reduce_plan(c->graph, c->node, err, &p));
    enum rkind kind = rkind_of(c->node->op_type);
    enum gp_dtype dt = gp_cuda_in_value(c, 0)->dtype;
    if (p.cells == 0) return GP_OK;
    if (dt != GP_DTYPE_FLOAT32) {
        if (gp_dtype_is_float(dt))
            return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "%s data (the CUDA kernel takes float32 "
                                 "and integer types)", gp_dtype_name(dt));
        if (p.count == 0)
            return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "an empty reduction of %s data",
                                 gp_dtype_name(dt));
        reduce_int_kernel<<<gp_cuda_blocks_for(p.cells), GP_CUDA_THREADS, 0, c->stream>>>(
            p, kind, (int)dt, c->in[0], c->out[0]);
        return gp_cuda_check_launch(c, "reduction (integer)", err);
    }
    float *Y = (float *)c->out[0];
    if (p.count == 0) { /* an empty reduction: the identity element */
        fill_f32_kernel<<<gp_cuda_blocks_for(p.cells), GP_CUDA_THREADS, 0, c->stream>>>(
            Y, p.cells, kind == R_PROD ? 1.0f : 0.0f);
        return gp_cuda_check_launch(c, "reduction (empty)", err);
    }
    launch_reduce(p, kind, (const float *)c->in[0], NULL, Y, NULL, c->stream);
    return gp_cuda_check_launch(c, "reduction forward", err);
}

/* dX per input element, its cell's dY and statistics: Sum dY; Mean
 * dY / count; SumSquare 2 X dY; L2 X dY / Y (0 where Y = 0); Max/Min dY
 * split evenly among the elements equal to Y; Prod dY times the product of
 * the others (exact with zeros). */
__global__ static void reduce_bwd_kernel(struct rplan p, int kind, const float *X, const float *Y,
                                         const float *dY, const double *s0, const double *s1,
                                         float *dX, int64_t n)
{
    GP_GRID_STRIDE(i, n) {
        int64_t rem = i, cell = 0;
        for (int d = p.rank - 1; d >= 0; d--) {
            int64_t q = fdiv(rem, p.dims[d]);
            cell += (rem - q * p.dims[d]) * p.cst[d];
            rem = q;
        }
        float x = X[i], dy = dY[cell], y = Y[cell], g;
        switch (kind) {
        case R_SUM: g = dy; break;
        case R_MEAN: g = dy / (float)p.count; break;
        case R_SUM_SQUARE: g = FMUL(FMUL(2.0f, x), dy); break;
        case R_L2: g = y == 0 ? 0.0f : FMUL(dy, x) / y; break;
        case R_PROD: {
            double zeros = s0[cell], nonzero = s1[cell];
            g = zeros == 0 ? (float)DMUL((double)dy, nonzero / (double)x)
                : zeros == 1 && x == 0 ? (float)DMUL((double)dy, nonzero) : 0.0f;
            break;
        }
        default: g = x == y || (x != x && y != y) ? dy / (float)s0[cell] : 0.0f; break;
        }
        dX[i] = FADD(dX[i], g);
    }
}

static gp_status reduce_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    const float *X = (const float *)c->in[0], *Y = (const float *)c->out[0], *dY = c->dout[0];
    float *dX = c->din[0];
    if (!dY || !dX) return GP_OK;
    GP_TRY(gp_cuda_want_f32(c, 0, err));
    struct rplan p;
    GP_TRY(reduce_plan(c->graph, c->node, err, &p));
    enum rkind kind = rkind_of(c->node->op_type);
    if (p.count == 0 || p.cells == 0) return GP_OK;
    double *s0 = (double *)c->scratch, *s1 = s0 ? s0 + p.cells : NULL;
    if (kind == R_MAX || kind == R_MIN) {
        launch_reduce(p, X_TIES, X, Y, NULL, s0, c->stream);
        GP_TRY(gp_cuda_check_launch(c, "reduction backward (ties)", err));
    } else if (kind == R_PROD) {
        launch_reduce(p, X_ZEROS, X, NULL, NULL, s0, c->stream);
        GP_TRY(gp_cuda_check_launch(c, "reduction backward (zeros)", err));
        launch_reduce(p, X_NZPROD, X, NULL, NULL, s1, c->stream);
        GP_TRY(gp_cuda_check_launch(c, "reduction backward (product)", err));
    }
    int64_t n = p.cells * p.count;
    reduce_bwd_kernel<<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, c->stream>>>(p, kind, X, Y, dY, s0,
                                                                               s1, dX, n);
    return gp_cuda_check_launch(c, "reduction backward", err);
}

/* ---- ArgMax, ArgMin ---- */

struct argplan {
    int64_t outer, inner, dim;
    bool is_max, last, fp;
    int dt;
};

/* The CPU's loop exactly: the first extreme element (the last with
 * select_last_index); a NaN is the extreme, the first one found stays. */
__global__ static void arg_thread_kernel(struct argplan a, const void *X, int64_t *Y)
{
    GP_GRID_STRIDE(k, a.outer * a.inner) {
        int64_t base = k / a.inner * a.dim * a.inner + k % a.inner, best = 0;
        for (int64_t j = 1; j < a.dim; j++) {
            int64_t ia = base + j * a.inner, ib = base + best * a.inner;
            bool better, equal;
            if (a.fp) {
                double x = ((const float *)X)[ia], y = ((const float *)X)[ib];
                if (y != y) break;
                better = x != x || (a.is_max ? x > y : x < y);
                equal = x == y;
            } else {
                int64_t x = gp_dev_load_i64(X, a.dt, ia), y = gp_dev_load_i64(X, a.dt, ib);
                better = a.is_max ? x > y : x < y;
                equal = x == y;
            }
            if (better || (a.last && equal)) best = j;
        }
        Y[k] = best;
    }
}

/* (value, index) candidates: idx -1 for none. */
struct argc {
    double v;
    int64_t iv;
    int64_t idx;
};

/* The candidate of the two that the CPU's scan ends with: a NaN (the
 * first), else the extreme, ties by index (first, or last). */
__device__ static inline struct argc arg_pick(const struct argplan &a, struct argc p, struct argc q)
{
    if (p.idx < 0) return q;
    if (q.idx < 0) return p;
    if (a.fp) {
        bool pn = p.v != p.v, qn = q.v != q.v;
        if (pn || qn) return pn && qn ? (p.idx < q.idx ? p : q) : pn ? p : q;
        if (p.v != q.v) return (a.is_max ? p.v > q.v : p.v < q.v) ? p : q;
    } else if (p.iv != q.iv) {
        return (a.is_max ? p.iv > q.iv : p.iv < q.iv) ? p : q;
    }
    return a.last ? (p.idx > q.idx ? p : q) : (p.idx < q.idx ? p : q);
}

/* One warp per slot (inner == 1: contiguous). */
__global__ static void arg_warp_kernel(struct argplan a, const void *X, int64_t *Y)
{
    int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    for (int64_t k = blockIdx.x * (int64_t)wpb + (threadIdx.x >> 5); k < a.outer;
         k += (int64_t)gridDim.x * wpb) {
        int64_t base = k * a.dim;
        struct argc best = {0.0, 0, -1};
        for (int64_t j = lane; j < a.dim; j += 32) {
            struct argc cand;
            cand.idx = j;
            if (a.fp) cand.v = ((const float *)X)[base + j], cand.iv = 0;
            else cand.iv = gp_dev_load_i64(X, a.dt, base + j), cand.v = 0;
            best = arg_pick(a, best, cand);
        }
        for (int o = 16; o > 0; o >>= 1) {
            struct argc other;
            other.v = __shfl_down_sync(0xffffffffu, best.v, o);
            other.iv = __shfl_down_sync(0xffffffffu, best.iv, o);
            other.idx = __shfl_down_sync(0xffffffffu, best.idx, o);
            best = arg_pick(a, best, other);
        }
        if (lane == 0) Y[k] = best.idx < 0 ? 0 : best.idx;
    }
}

/* X [..] -> int64 indices along `axis`, kept as 1 or dropped. */
static gp_status arg_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    struct gp_infer_ctx ic = infer_ctx(c->graph, c->node, err);
    const struct gp_value *xv = gp_cuda_in_value(c, 0);
    const struct gp_shape *xs = &xv->shape;
    int axis;
    GP_TRY(gp_norm_axis(&ic, gp_node_attr_int(c->node, "axis", 0), xs->rank, &axis));
    struct argplan a;
    a.is_max = strcmp(c->node->op_type, "ArgMax") == 0;
    a.last = gp_node_attr_int(c->node, "select_last_index", 0) != 0;
    a.outer = a.inner = 1;
    a.dim = xs->dims[axis];
    for (int d = 0; d < axis; d++) a.outer *= xs->dims[d];
    for (int d = axis + 1; d < xs->rank; d++) a.inner *= xs->dims[d];
    a.fp = gp_dtype_is_float(xv->dtype);
    a.dt = (int)xv->dtype;
    if (a.fp && xv->dtype != GP_DTYPE_FLOAT32)
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "%s data (the CUDA kernel takes float32 and "
                             "integer types)", gp_dtype_name(xv->dtype));
    int64_t slots = a.outer * a.inner;
    if (slots == 0) return GP_OK;
    int64_t *Y = (int64_t *)c->out[0];
    if (a.inner == 1 && a.dim >= 64)
        arg_warp_kernel<<<gp_cuda_capped_grid((slots + 7) / 8, 1 << 20), 256, 0, c->stream>>>(a, c->in[0], Y);
    else
        arg_thread_kernel<<<gp_cuda_blocks_for(slots), GP_CUDA_THREADS, 0, c->stream>>>(a, c->in[0], Y);
    return gp_cuda_check_launch(c, a.is_max ? "ArgMax" : "ArgMin", err);
}

/* ---- Dropout ---- */

/* What decides the mask, as the CPU's dropout_of: the run's ratio when set,
 * else the node's (attribute before opset 12, the constant input since -
 * the loader requires it constant - or 0.5 when absent); training_mode from
 * input 2 (12+) when given, else the run's. A constant training_mode is
 * read here, a computed one (device memory) by the kernel itself, so
 * nothing waits for the device. */
struct dropout {
    bool training;
    double ratio;
    bool mode;               /* when mode_dev is NULL */
    const uint8_t *mode_dev; /* bool scalar on the device, or NULL */
    uint64_t seed, step;
    const uint64_t *step_dev; /* the step in device memory (replayed CUDA graphs), or NULL */
    uint32_t node;
    int64_t first; /* global index of element 0 */
};

/* Input i's first element from its constant data (floats as the CPU's
 * buffer holds them: rounded to float32), or false when not constant. */
static bool const_scalar(const struct gp_cuda_ctx *c, int i, double *v)
{
    const struct gp_value *val = gp_cuda_in_value(c, i);
    if (!val || !val->constant || gp_shape_numel(&val->constant->shape) < 1) return false;
    double x = gp_tensor_get_f64(val->constant, 0);
    *v = gp_dtype_is_float(val->dtype) ? (double)(float)x : x;
    return true;
}

static gp_status dropout_of(const struct gp_cuda_ctx *c, struct gp_error *err, struct dropout *d)
{
    const struct gp_node *n = c->node;
    int version = n->def->since_version;
    memset(d, 0, sizeof *d);
    d->training = c->training;
    d->ratio = 0.5;
    d->mode = true;
    if (c->dropout_ratio >= 0) {
        d->ratio = c->dropout_ratio;
    } else if (version < 12) {
        d->ratio = gp_node_attr_float(n, "ratio", 0.5f);
    } else if (n->n_inputs > 1 && c->in[1] && !const_scalar(c, 1, &d->ratio)) {
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "the ratio (input 1) is not a constant");
    }
    if (version >= 12 && n->n_inputs >= 3 && c->in[2]) {
        double m;
        if (const_scalar(c, 2, &m)) d->mode = m != 0;
        else d->mode_dev = (const uint8_t *)c->in[2];
    }
    const struct gp_shape *xs = &gp_cuda_in_value(c, 0)->shape;
    int64_t per_sample = xs->rank > 0 && xs->dims[0] ? gp_shape_numel(xs) / xs->dims[0]
                                                      : gp_shape_numel(xs);
    d->seed = c->seed;
    d->step = c->step;
    d->step_dev = c->step_dev;
    d->node = (uint32_t)n->source_index;
    d->first = c->sample_offset * per_sample;
    return GP_OK;
}

/* The per-thread decision: active, the ratio as float (the comparison is
 * in float on both backends) and the scale 1 / (1 - ratio). */
__device__ static inline bool dropout_setup(const struct dropout &d, float *ratio, float *scale)
{
    bool mode = d.mode_dev ? *d.mode_dev != 0 : d.mode;
    *ratio = (float)d.ratio;
    *scale = (float)(1.0 / (1.0 - d.ratio));
    return d.training && mode && d.ratio > 0;
}

__global__ static void dropout_forward_kernel(struct dropout d, const float *X, float *Y,
                                              void *mask, bool mask_bool, int64_t n)
{
    float ratio, scale;
    bool active = dropout_setup(d, &ratio, &scale);
    const uint64_t step = d.step_dev ? *d.step_dev : d.step;
    GP_GRID_STRIDE(i, n) {
        bool keep = !active || gp_rng_uniform(d.seed, step, d.node, (uint64_t)(d.first + i)) >= ratio;
        float x = X[i];
        Y[i] = !active ? x : keep ? FMUL(x, scale) : 0.0f;
        if (mask && mask_bool) ((uint8_t *)mask)[i] = keep;
        else if (mask) ((float *)mask)[i] = keep ? 1.0f : 0.0f;
    }
}

__global__ static void dropout_backward_kernel(struct dropout d, const float *dY, float *dX, int64_t n)
{
    float ratio, scale;
    bool active = dropout_setup(d, &ratio, &scale);
    const uint64_t step = d.step_dev ? *d.step_dev : d.step;
    GP_GRID_STRIDE(i, n) {
        float g = dY[i];
        if (active)
            g = gp_rng_uniform(d.seed, step, d.node, (uint64_t)(d.first + i)) >= ratio ? FMUL(g, scale) : 0.0f;
        dX[i] = FADD(dX[i], g);
    }
}

/* X [N, ..] -> Y, optional mask (float in opset 7, bool since 10). */
static gp_status dropout_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    GP_TRY(gp_cuda_want_f32(c, 0, err));
    struct dropout d;
    GP_TRY(dropout_of(c, err, &d));
    int64_t n = gp_shape_numel(&gp_cuda_in_value(c, 0)->shape);
    if (n == 0) return GP_OK;
    void *mask = c->node->n_outputs > 1 ? c->out[1] : NULL;
    bool mask_bool = true;
    if (mask) {
        enum gp_dtype mt = gp_cuda_out_value(c, 1)->dtype;
        if (mt != GP_DTYPE_BOOL && mt != GP_DTYPE_FLOAT32)
            return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "a mask of type %s", gp_dtype_name(mt));
        mask_bool = mt == GP_DTYPE_BOOL;
    }
    dropout_forward_kernel<<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, c->stream>>>(
        d, (const float *)c->in[0], (float *)c->out[0], mask, mask_bool, n);
    return gp_cuda_check_launch(c, "Dropout forward", err);
}

/* dX += dY * mask * scale, the mask drawn again from the same key. */
static gp_status dropout_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    const float *dY = c->dout[0];
    float *dX = c->din[0];
    if (!dY || !dX) return GP_OK;
    GP_TRY(gp_cuda_want_f32(c, 0, err));
    struct dropout d;
    GP_TRY(dropout_of(c, err, &d));
    int64_t n = gp_shape_numel(&gp_cuda_in_value(c, 0)->shape);
    if (n == 0) return GP_OK;
    dropout_backward_kernel<<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, c->stream>>>(d, dY, dX, n);
    return gp_cuda_check_launch(c, "Dropout backward", err);
}

/* ---- Resize, Upsample ---- */

/* resize.c's plan: per axis, per output position, sources i0, i1 and
 * weights w0, w1 (nearest: i1 = i0, w1 = 0; -1 where tf_crop_and_resize
 * extrapolates), computed in single precision as onnxruntime does. The
 * tables are computed on the device into scratch (the same float
 * arithmetic, on the host too, decides which leading axes are identities). */
enum coords {
    CT_HALF_PIXEL, CT_HALF_PIXEL_SYMMETRIC, CT_PYTORCH_HALF_PIXEL, CT_ALIGN_CORNERS,
    CT_ASYMMETRIC, CT_TF_HALF_PIXEL_FOR_NN, CT_TF_CROP_AND_RESIZE,
};
enum nearest { N_ROUND_PREFER_FLOOR, N_ROUND_PREFER_CEIL, N_FLOOR, N_CEIL, N_SIMPLE };

#ifdef __CUDA_ARCH__
#define RS_ADD(a, b) __fadd_rn(a, b)
#define RS_SUB(a, b) __fsub_rn(a, b)
#define RS_MUL(a, b) __fmul_rn(a, b)
#define RS_DIV(a, b) __fdiv_rn(a, b)
#else
#define RS_ADD(a, b) ((a) + (b))
#define RS_SUB(a, b) ((a) - (b))
#define RS_MUL(a, b) ((a) * (b))
#define RS_DIV(a, b) ((a) / (b))
#endif

__host__ __device__ static float source_coord(int m, float x, float scale, int64_t in, int64_t out,
                                              float roi_start, float roi_end)
{
    float fin = (float)in, fout = (float)out;
    switch (m) {
    case CT_HALF_PIXEL: return RS_SUB(RS_DIV(RS_ADD(x, 0.5f), scale), 0.5f);
    case CT_HALF_PIXEL_SYMMETRIC: {
        float adjustment = RS_DIV(fout, RS_MUL(scale, fin)), center = RS_DIV(fin, 2.0f);
        return RS_SUB(RS_ADD(RS_MUL(center, RS_SUB(1.0f, adjustment)), RS_DIV(RS_ADD(x, 0.5f), scale)),
                      0.5f);
    }
    case CT_PYTORCH_HALF_PIXEL: return out > 1 ? RS_SUB(RS_DIV(RS_ADD(x, 0.5f), scale), 0.5f) : 0.0f;
    case CT_ALIGN_CORNERS: return out == 1 ? 0.0f : RS_DIV(RS_MUL(x, RS_SUB(fin, 1.0f)), RS_SUB(fout, 1.0f));
    case CT_ASYMMETRIC: return RS_DIV(x, scale);
    case CT_TF_HALF_PIXEL_FOR_NN: return RS_DIV(RS_ADD(x, 0.5f), scale);
    case CT_TF_CROP_AND_RESIZE:
        return out > 1 ? RS_ADD(RS_MUL(roi_start, RS_SUB(fin, 1.0f)),
                                RS_DIV(RS_MUL(RS_MUL(x, RS_SUB(roi_end, roi_start)), RS_SUB(fin, 1.0f)),
                                       RS_SUB(fout, 1.0f)))
                       : RS_MUL(RS_MUL(0.5f, RS_ADD(roi_start, roi_end)), RS_SUB(fin, 1.0f));
    }
    return x;
}

__host__ __device__ static int64_t round_nearest(int m, float x, float scale)
{
    switch (m) {
    case N_ROUND_PREFER_FLOOR:
        return x == RS_ADD(floorf(x), 0.5f) ? (int64_t)floorf(x) : (int64_t)roundf(x);
    case N_ROUND_PREFER_CEIL: return (int64_t)roundf(x);
    case N_FLOOR: return (int64_t)floorf(x);
    case N_CEIL: return (int64_t)ceilf(x);
    case N_SIMPLE: return scale < 1 ? (int64_t)ceilf(x) : (int64_t)x;
    }
    return 0;
}

/* One table entry: output position o of an axis in -> out. */
__host__ __device__ static void table_entry(int cm, int nm, bool linear, float scale, float start,
                                            float end, int64_t in, int64_t out, int64_t o,
                                            int64_t *i0, int64_t *i1, float *w0, float *w1)
{
    float x = source_coord(cm, (float)o, scale, in, out, start, end);
    if (cm == CT_TF_CROP_AND_RESIZE && (x < 0 || x > (float)(in - 1))) {
        *i0 = *i1 = -1, *w0 = 1, *w1 = 0;
    } else if (linear) {
        x = x < 0 ? 0 : x > (float)(in - 1) ? (float)(in - 1) : x;
        int64_t i = (int64_t)x;
        if (i > in - 1) i = in - 1;
        *i0 = i;
        *i1 = i < in - 1 ? i + 1 : i;
        *w1 = RS_SUB(x, (float)i);
        *w0 = RS_SUB(1.0f, *w1);
    } else {
        int64_t i = round_nearest(nm, x, scale);
        *i0 = *i1 = i < 0 ? 0 : i > in - 1 ? in - 1 : i;
        *w0 = 1, *w1 = 0;
    }
}

struct rs_plan {
    int rank, lead, cm, nm;
    bool linear;
    float extrapolation;
    int64_t xdims[GP_MAX_RANK], ydims[GP_MAX_RANK], xst[GP_MAX_RANK], yst[GP_MAX_RANK];
    float scale[GP_MAX_RANK], start[GP_MAX_RANK], end[GP_MAX_RANK];
    /* Device tables per axis (axes >= lead): into scratch. */
    int64_t *i0[GP_MAX_RANK], *i1[GP_MAX_RANK];
    float *w0[GP_MAX_RANK], *w1[GP_MAX_RANK];
    int64_t *first[GP_MAX_RANK], *last[GP_MAX_RANK]; /* backward: outputs reading input i */
    int64_t tab_total, in_total;                     /* sums of ydims / xdims over axes >= lead */
};

/* Tables for every axis: 2 int64 and 2 float per output position, and
 * (backward) 2 int64 per input position. */
static size_t resize_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    const struct gp_value *x = gp_node_input(g, node, 0), *y = gp_node_output(g, node, 0);
    size_t n = 0, m = 0;
    for (int d = 0; d < y->shape.rank; d++) n += (size_t)y->shape.dims[d], m += (size_t)x->shape.dims[d];
    return n * (2 * sizeof(int64_t) + 2 * sizeof(float)) + m * 2 * sizeof(int64_t);
}

static int choice(const char *s, const char *const *names, int n, int dflt)
{
    for (int k = 0; k < n; k++)
        if (strcmp(s, names[k]) == 0) return k;
    return dflt;
}

static int const_floats(const struct gp_cuda_ctx *c, int i, float *out, int max)
{
    if (i >= c->node->n_inputs || c->node->inputs[i] < 0) return 0;
    const struct gp_tensor *t = gp_cuda_in_value(c, i)->constant;
    int64_t n = t ? gp_shape_numel(&t->shape) : 0;
    if (n > max) n = max;
    for (int64_t k = 0; k < n; k++) out[k] = (float)gp_tensor_get_f64(t, k);
    return (int)n;
}

static gp_status resize_plan(struct gp_cuda_ctx *c, struct gp_error *err, struct rs_plan *p)
{
    const struct gp_node *n = c->node;
    const struct gp_shape *xs = &gp_cuda_in_value(c, 0)->shape, *ys = &gp_cuda_out_value(c, 0)->shape;
    int r = xs->rank, version = n->def->since_version;
    bool upsample = strcmp(n->op_type, "Upsample") == 0, modern = !upsample && version >= 11;
    memset(p, 0, sizeof *p);
    const char *mode = gp_node_attr_string(n, "mode", "nearest");
    if (strcmp(mode, "nearest") != 0 && strcmp(mode, "linear") != 0)
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED,
                             "mode '%s' is not supported (nearest and linear are)", mode);
    p->linear = strcmp(mode, "linear") == 0;
    static const char *const coord_names[] = {
        "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
        "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"};
    static const char *const nearest_names[] = {"round_prefer_floor", "round_prefer_ceil",
                                                "floor", "ceil"};
    p->cm = modern ? choice(gp_node_attr_string(n, "coordinate_transformation_mode", "half_pixel"),
                            coord_names, 7, 0)
                   : CT_ASYMMETRIC;
    p->nm = modern ? choice(gp_node_attr_string(n, "nearest_mode", "round_prefer_floor"),
                            nearest_names, 4, 0)
                   : N_SIMPLE;
    p->extrapolation = gp_node_attr_float(n, "extrapolation_value", 0.0f);

    int axes[GP_MAX_RANK], n_axes = r;
    for (int d = 0; d < r; d++) axes[d] = d;
    const int64_t *ax;
    int64_t n_ax = gp_node_attr_ints(n, "axes", &ax);
    if (n_ax >= 0) {
        struct gp_infer_ctx ic = infer_ctx(c->graph, c->node, err);
        n_axes = (int)n_ax;
        for (int k = 0; k < n_axes; k++) GP_TRY(gp_norm_axis(&ic, ax[k], r, &axes[k]));
    }
    float given[GP_MAX_RANK], roi[2 * GP_MAX_RANK];
    for (int d = 0; d < r; d++) p->scale[d] = 1, p->start[d] = 0, p->end[d] = 1;
    int n_given;
    if (upsample && version < 9) {
        const struct gp_attr *a = gp_node_attr(n, "scales");
        n_given = a ? (int)a->count : 0;
        for (int k = 0; k < n_given && k < GP_MAX_RANK; k++) given[k] = a->floats[k];
    } else {
        n_given = const_floats(c, modern ? 2 : 1, given, GP_MAX_RANK);
    }
    if (n_given) {
        for (int k = 0; k < n_axes && k < n_given; k++) p->scale[axes[k]] = given[k];
    } else {
        const char *policy = gp_node_attr_string(n, "keep_aspect_ratio_policy", "stretch");
        bool larger = strcmp(policy, "not_smaller") == 0, stretch = strcmp(policy, "stretch") == 0;
        const struct gp_value *sv = c->node->n_inputs > 3 ? gp_cuda_in_value(c, 3) : NULL;
        const struct gp_tensor *sizes = sv ? sv->constant : NULL;
        if (!sizes)
            return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED,
                                 "neither constant scales nor constant sizes are given");
        float common = larger ? 0.0f : INFINITY;
        for (int k = 0; k < n_axes; k++) {
            int d = axes[k];
            p->scale[d] = (float)ys->dims[d] / (float)xs->dims[d];
            float f = (float)gp_tensor_get_i64(sizes, k) / (float)xs->dims[d];
            common = larger ? fmaxf(common, f) : fminf(common, f);
        }
        if (!stretch)
            for (int k = 0; k < n_axes; k++) p->scale[axes[k]] = common;
    }
    if (p->cm == CT_TF_CROP_AND_RESIZE) {
        if (const_floats(c, 1, roi, 2 * GP_MAX_RANK) >= 2 * n_axes)
            for (int k = 0; k < n_axes; k++)
                p->start[axes[k]] = roi[k], p->end[axes[k]] = roi[n_axes + k];
    }
    if (gp_node_attr_int(n, "antialias", 0) && p->linear)
        for (int d = 0; d < r; d++)
            if (p->scale[d] < 1)
                return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED,
                                     "antialiased downsampling (axis %d, scale %g) is not supported",
                                     d, (double)p->scale[d]);
    p->rank = r;
    gp_shape_strides(xs, p->xst);
    gp_shape_strides(ys, p->yst);
    p->lead = r;
    for (int d = 0; d < r; d++) {
        p->xdims[d] = xs->dims[d];
        p->ydims[d] = ys->dims[d];
        int64_t in = xs->dims[d], out = ys->dims[d];
        bool identity = in == out;
        for (int64_t o = 0; identity && o < out; o++) {
            int64_t i0, i1;
            float w0, w1;
            table_entry(p->cm, p->nm, p->linear, p->scale[d], p->start[d], p->end[d], in, out, o, &i0,
                        &i1, &w0, &w1);
            identity = i0 == o && w1 == 0;
        }
        if (!identity && p->lead == r) p->lead = d;
    }
    /* Scratch: int64 tables (i0, i1 per output position; first, last per
     * input position) for axes >= lead, then the float weights. */
    int64_t *ints = (int64_t *)c->scratch;
    int64_t tab = 0, inn = 0;
    for (int d = p->lead; d < r; d++) tab += ys->dims[d], inn += xs->dims[d];
    float *reals = (float *)(ints + 2 * tab + 2 * inn);
    for (int d = p->lead; d < r; d++) {
        p->i0[d] = ints, p->i1[d] = ints + ys->dims[d];
        ints += 2 * ys->dims[d];
        p->first[d] = ints, p->last[d] = ints + xs->dims[d];
        ints += 2 * xs->dims[d];
        p->w0[d] = reals, p->w1[d] = reals + ys->dims[d];
        reals += 2 * ys->dims[d];
    }
    p->tab_total = tab;
    p->in_total = inn;
    return GP_OK;
}

/* Entry t of the flattened tables (axes lead.., positions): its axis. */
__device__ static inline int rs_axis_of(const struct rs_plan &p, int64_t *t, const int64_t *dims)
{
    int d = p.lead;
    while (d < p.rank - 1 && *t >= dims[d]) *t -= dims[d], d++;
    return d;
}

/* One thread per (axis, output position): the tables; with `ranges`, the
 * range of output positions reading each input position (first / last,
 * set to (INT64_MAX, -1) before) by integer min / max. */
__global__ static void rs_tables_kernel(struct rs_plan p, bool ranges)
{
    GP_GRID_STRIDE(t, p.tab_total) {
        int64_t o = t;
        int d = rs_axis_of(p, &o, p.ydims);
        int64_t i0, i1;
        float w0, w1;
        table_entry(p.cm, p.nm, p.linear, p.scale[d], p.start[d], p.end[d], p.xdims[d], p.ydims[d], o,
                    &i0, &i1, &w0, &w1);
        p.i0[d][o] = i0, p.i1[d][o] = i1, p.w0[d][o] = w0, p.w1[d][o] = w1;
        if (ranges && i0 >= 0) {
            atomicMin((long long *)&p.first[d][i0], (long long)o);
            atomicMax((long long *)&p.last[d][i0], (long long)o);
            if (p.linear && i1 != i0) {
                atomicMin((long long *)&p.first[d][i1], (long long)o);
                atomicMax((long long *)&p.last[d][i1], (long long)o);
            }
        }
    }
}

__global__ static void rs_ranges_init_kernel(struct rs_plan p)
{
    GP_GRID_STRIDE(t, p.in_total) {
        int64_t i = t;
        int d = rs_axis_of(p, &i, p.xdims);
        p.first[d][i] = INT64_MAX;
        p.last[d][i] = -1;
    }
}

/* Generic kernels, one thread per element, any rank and lead. */

/* Output element o: nearest copies its source (float32 here), linear sums
 * its corners' weighted values in double, corner by corner as the CPU
 * (corner k: bit d - lead picks axis d's high neighbour; the weight is the
 * product over the axes in order; corners of weight 0 skipped). */
__global__ static void rs_forward_f32_kernel(struct rs_plan p, const float *X, float *Y, int64_t n)
{
    int corners = p.linear ? 1 << (p.rank - p.lead) : 1;
    GP_GRID_STRIDE(o, n) {
        int64_t idx[GP_MAX_RANK], rem = o, base = 0;
        for (int d = p.rank - 1; d >= 0; d--) {
            int64_t q = fdiv(rem, p.ydims[d]);
            idx[d] = rem - q * p.ydims[d];
            rem = q;
            if (d < p.lead) base += idx[d] * p.xst[d];
        }
        double acc = 0;
        bool extrap = false;
        for (int k = 0; k < corners; k++) {
            int64_t src = base;
            float w = 1.0f;
            for (int d = p.lead; d < p.rank && src >= 0; d++) {
                bool hi = (k >> (d - p.lead)) & 1;
                int64_t i = hi ? p.i1[d][idx[d]] : p.i0[d][idx[d]];
                w = FMUL(w, hi ? p.w1[d][idx[d]] : p.w0[d][idx[d]]);
                src = i < 0 ? -1 : src + i * p.xst[d];
            }
            if (w == 0 && src >= 0) continue;
            if (src < 0) {
                extrap = true;
                break;
            }
            if (!p.linear) {
                acc = X[src];
                break;
            }
            acc = DADD(acc, DMUL((double)w, (double)X[src]));
        }
        Y[o] = extrap ? p.extrapolation : (float)acc;
    }
}

/* Nearest on any other dtype: the source element's bytes. */
template <typename T>
__global__ static void rs_forward_copy_kernel(struct rs_plan p, const T *X, T *Y, int dt, int64_t n)
{
    GP_GRID_STRIDE(o, n) {
        int64_t rem = o, src = 0;
        for (int d = p.rank - 1; d >= 0 && src >= 0; d--) {
            int64_t q = fdiv(rem, p.ydims[d]), id = rem - q * p.ydims[d];
            rem = q;
            int64_t i = d < p.lead ? id : p.i0[d][id];
            src = i < 0 ? -1 : src + i * p.xst[d];
        }
        if (src < 0) gp_dev_store_f64(Y, dt, o, (double)p.extrapolation);
        else Y[o] = X[src];
    }
}

/* Input element i gathers w * dY[o] over the outputs o and corners that
 * read it, in the CPU's order (o row-major, corners ascending), adding in
 * float straight into dX[i] as the CPU's scatter does. Per table axis the
 * outputs reading position xi[d] are first..last, filtered by the tables
 * (a corner counts where every axis's neighbour is xi[d]). */
__device__ static void rs_gather(const struct rs_plan &p, const float *dY, float *dX, int64_t i)
{
    int corners = p.linear ? 1 << (p.rank - p.lead) : 1;
    int64_t xi[GP_MAX_RANK], rem = i, base = 0;
    for (int d = p.rank - 1; d >= 0; d--) {
        int64_t q = fdiv(rem, p.xdims[d]);
        xi[d] = rem - q * p.xdims[d];
        rem = q;
        if (d < p.lead) base += xi[d] * p.yst[d];
    }
    int64_t lo[GP_MAX_RANK], hi[GP_MAX_RANK], oi[GP_MAX_RANK];
    for (int d = p.lead; d < p.rank; d++) {
        lo[d] = p.first[d][xi[d]];
        hi[d] = p.last[d][xi[d]];
        oi[d] = lo[d];
        if (lo[d] > hi[d]) return;
    }
    float acc = dX[i];
    for (;;) {
        int64_t off = base;
        for (int d = p.lead; d < p.rank; d++) off += oi[d] * p.yst[d];
        for (int k = 0; k < corners; k++) {
            float w = 1.0f;
            bool match = true;
            for (int d = p.lead; d < p.rank; d++) {
                bool h = (k >> (d - p.lead)) & 1;
                if ((h ? p.i1[d][oi[d]] : p.i0[d][oi[d]]) != xi[d]) {
                    match = false;
                    break;
                }
                w = FMUL(w, h ? p.w1[d][oi[d]] : p.w0[d][oi[d]]);
            }
            if (!match || w == 0) continue;
            acc = FADD(acc, FMUL(w, dY[off]));
        }
        int d = p.rank - 1;
        for (; d >= p.lead; d--) {
            if (++oi[d] <= hi[d]) break;
            oi[d] = lo[d];
        }
        if (d < p.lead) break;
    }
    dX[i] = acc;
}

__global__ static void rs_backward_kernel(struct rs_plan p, const float *dY, float *dX, int64_t n)
{
    GP_GRID_STRIDE(i, n) rs_gather(p, dY, dX, i);
}

/* Row kernels (float32, lead < rank): a block takes a batch of rows of the
 * last axis. What the axes before the last contribute is the same along a
 * row, so it is worked out once per row (in parallel over the batch) into
 * shared memory, and every element then costs a look-up in the last
 * axis's table: the generic kernels spend most of their time on per-element
 * index arithmetic. */
#define RS_ROW_OUTER 64     /* corners over the axes before the last (2^6) */
#define RS_FWD_ENTRIES 256  /* (row, corner) entries of a forward batch */

/* Forward: entry (row, ko) for each corner ko over the table axes before
 * the last: the row's source offset (-1: extrapolated) and the product of
 * those axes' weights in axis order, so that the last axis's weight
 * multiplies in last, as in the CPU's product. */
__global__ static void rs_forward_rows_kernel(struct rs_plan p, const float *X, float *Y, int64_t rows)
{
    __shared__ int64_t sh_src[RS_FWD_ENTRIES];
    __shared__ float sh_w[RS_FWD_ENTRIES];
    int last = p.rank - 1, m = p.rank - p.lead;
    int outer = p.linear ? 1 << (m - 1) : 1, corners = p.linear ? 1 << m : 1;
    int64_t batch = RS_FWD_ENTRIES / outer, ylast = p.ydims[last];
    const int64_t *i0l = p.i0[last], *i1l = p.i1[last];
    const float *w0l = p.w0[last], *w1l = p.w1[last];
    for (int64_t row0 = blockIdx.x * batch; row0 < rows; row0 += (int64_t)gridDim.x * batch) {
        int64_t nr = rows - row0 < batch ? rows - row0 : batch;
        __syncthreads(); /* the previous batch's entries are read */
        for (int t = threadIdx.x; t < nr * outer; t += blockDim.x) {
            int ko = t % outer;
            int64_t rem = row0 + t / outer, src = 0, ids[GP_MAX_RANK];
            bool ext = false;
            for (int d = last - 1; d >= 0; d--) {
                int64_t q = fdiv(rem, p.ydims[d]);
                ids[d] = rem - q * p.ydims[d];
                rem = q;
            }
            float w = 1.0f;
            for (int d = 0; d < last; d++) {
                if (d < p.lead) {
                    src += ids[d] * p.xst[d];
                } else {
                    bool h = (ko >> (d - p.lead)) & 1;
                    int64_t i = h ? p.i1[d][ids[d]] : p.i0[d][ids[d]];
                    if (i < 0) ext = true;
                    src += i * p.xst[d];
                    w = FMUL(w, h ? p.w1[d][ids[d]] : p.w0[d][ids[d]]);
                }
            }
            sh_src[t] = ext ? -1 : src;
            sh_w[t] = w;
        }
        __syncthreads();
        for (int64_t e = threadIdx.x; e < nr * ylast; e += blockDim.x) {
            int64_t r = fdiv(e, ylast), ow = e - r * ylast;
            const int64_t *ss = sh_src + r * outer;
            const float *sw = sh_w + r * outer;
            float *y = Y + (row0 + r) * ylast + ow;
            int64_t i0 = i0l[ow];
            if (ss[0] < 0 || i0 < 0) {
                *y = p.extrapolation;
                continue;
            }
            if (!p.linear) {
                *y = X[ss[0] + i0];
                continue;
            }
            int64_t i1 = i1l[ow];
            float a0 = w0l[ow], a1 = w1l[ow];
            double acc = 0;
            for (int k = 0; k < corners; k++) {
                int ko = k & (outer - 1);
                bool h = k >> (m - 1);
                float w = FMUL(sw[ko], h ? a1 : a0);
                if (w == 0) continue;
                acc = DADD(acc, DMUL((double)w, (double)X[ss[ko] + (h ? i1 : i0)]));
            }
            *y = (float)acc;
        }
    }
}

/* Backward, per input row: the outputs reading it, over the table axes
 * before the last, are a product of ranges; their combinations in
 * row-major order ("combos", each an output row offset) and, per combo,
 * the corners ko whose neighbours on those axes are this row's positions
 * (the product of their weights; NaN marks a corner that does not read
 * the row) go to shared memory, one thread per row of the batch. Each
 * element then gathers in the CPU's order: combos, the last axis's outputs
 * in its range, corners (the last axis's bit is the high one). A row with
 * more combos or entries than fit falls back to rs_gather. */
#define RS_BWD_ROWS 32
#define RS_BWD_COMBOS 16
#define RS_BWD_ENTRIES 64

__global__ static void rs_backward_rows_kernel(struct rs_plan p, const float *dY, float *dX, int64_t rows)
{
    __shared__ int64_t sh_off[RS_BWD_ROWS][RS_BWD_COMBOS];
    __shared__ int sh_first[RS_BWD_ROWS][RS_BWD_COMBOS + 1];
    __shared__ float sh_w[RS_BWD_ROWS][RS_BWD_ENTRIES];
    __shared__ int sh_n[RS_BWD_ROWS]; /* combos, or -1: fall back */
    int last = p.rank - 1, m = p.rank - p.lead;
    int outer = p.linear ? 1 << (m - 1) : 1;
    int64_t xlast = p.xdims[last];
    const int64_t *i0l = p.i0[last], *i1l = p.i1[last];
    const float *w0l = p.w0[last], *w1l = p.w1[last];
    const int64_t *fl = p.first[last], *ll = p.last[last];
    for (int64_t row0 = blockIdx.x * (int64_t)RS_BWD_ROWS; row0 < rows;
         row0 += (int64_t)gridDim.x * RS_BWD_ROWS) {
        int64_t nr = rows - row0 < RS_BWD_ROWS ? rows - row0 : RS_BWD_ROWS;
        __syncthreads();
        if (threadIdx.x < nr) {
            int rr = threadIdx.x;
            int64_t rem = row0 + rr, base = 0, xi[GP_MAX_RANK], lo[GP_MAX_RANK], hi[GP_MAX_RANK],
                    oi[GP_MAX_RANK];
            for (int d = last - 1; d >= 0; d--) {
                int64_t q = fdiv(rem, p.xdims[d]);
                xi[d] = rem - q * p.xdims[d];
                rem = q;
                if (d < p.lead) base += xi[d] * p.yst[d];
            }
            int n = 0, e = 0;
            bool empty = false;
            for (int d = p.lead; d < last; d++) {
                lo[d] = oi[d] = p.first[d][xi[d]];
                hi[d] = p.last[d][xi[d]];
                if (lo[d] > hi[d]) empty = true;
            }
            while (!empty) {
                if (n == RS_BWD_COMBOS || e + outer > RS_BWD_ENTRIES) {
                    n = -1;
                    break;
                }
                int64_t off = base;
                for (int d = p.lead; d < last; d++) off += oi[d] * p.yst[d];
                sh_off[rr][n] = off;
                sh_first[rr][n] = e;
                for (int ko = 0; ko < outer; ko++) {
                    float w = 1.0f;
                    bool match = true;
                    for (int d = p.lead; d < last && match; d++) {
                        bool h = (ko >> (d - p.lead)) & 1;
                        if ((h ? p.i1[d][oi[d]] : p.i0[d][oi[d]]) != xi[d]) match = false;
                        else w = FMUL(w, h ? p.w1[d][oi[d]] : p.w0[d][oi[d]]);
                    }
                    sh_w[rr][e++] = match ? w : NAN;
                }
                n++;
                int d = last - 1;
                for (; d >= p.lead; d--) {
                    if (++oi[d] <= hi[d]) break;
                    oi[d] = lo[d];
                }
                if (d < p.lead) break;
            }
            if (n >= 0) sh_first[rr][n] = e;
            sh_n[rr] = n;
        }
        __syncthreads();
        for (int64_t el = threadIdx.x; el < nr * xlast; el += blockDim.x) {
            int64_t r = fdiv(el, xlast), xw = el - r * xlast, i = (row0 + r) * xlast + xw;
            int n = sh_n[r];
            if (n < 0) {
                rs_gather(p, dY, dX, i);
                continue;
            }
            int64_t lo = fl[xw], hi = ll[xw];
            if (lo > hi || n == 0) continue;
            float acc = dX[i];
            for (int c = 0; c < n; c++) {
                const float *dy = dY + sh_off[r][c];
                int e0 = sh_first[r][c], e1 = sh_first[r][c + 1];
                for (int64_t ow = lo; ow <= hi; ow++) {
                    for (int h = 0; h < (p.linear ? 2 : 1); h++) {
                        if ((h ? i1l[ow] : i0l[ow]) != xw) continue;
                        float wl = h ? w1l[ow] : w0l[ow];
                        for (int e = e0; e < e1; e++) {
                            float wo = sh_w[r][e];
                            if (wo != wo) continue;
                            float w = FMUL(wo, wl);
                            if (w == 0) continue;
                            acc = FADD(acc, FMUL(w, dy[ow]));
                        }
                    }
                }
            }
            dX[i] = acc;
        }
    }
}

/* The row kernels take a resized axis (lead < rank) and at most
 * RS_ROW_OUTER corners over the axes before the last. */
static bool rs_rows_ok(const struct rs_plan &p)
{
    int m = p.rank - p.lead;
    return m >= 1 && (!p.linear || (1 << (m - 1)) <= RS_ROW_OUTER);
}

/* X [D0..] -> Y [O0..]. */
static gp_status resize_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    struct rs_plan p;
    GP_TRY(resize_plan(c, err, &p));
    enum gp_dtype dt = gp_cuda_in_value(c, 0)->dtype;
    int64_t n = gp_shape_numel(&gp_cuda_out_value(c, 0)->shape);
    if (n == 0) return GP_OK;
    if (p.linear && dt != GP_DTYPE_FLOAT32)
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "linear resizing of %s data", gp_dtype_name(dt));
    if (gp_dtype_is_float(dt) && dt != GP_DTYPE_FLOAT32)
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "%s data (the CUDA kernel takes float32 and "
                             "integer types)", gp_dtype_name(dt));
    if (p.tab_total > 0) {
        rs_tables_kernel<<<gp_cuda_blocks_for(p.tab_total), GP_CUDA_THREADS, 0, c->stream>>>(p, false);
        GP_TRY(gp_cuda_check_launch(c, "resize tables", err));
    }
    unsigned g = gp_cuda_blocks_for(n);
    if (dt == GP_DTYPE_FLOAT32 && rs_rows_ok(p)) {
        int64_t ylast = p.ydims[p.rank - 1];
        int64_t rows = n / ylast, batch = RS_FWD_ENTRIES / (p.linear ? 1 << (p.rank - p.lead - 1) : 1);
        rs_forward_rows_kernel<<<gp_cuda_capped_grid((rows + batch - 1) / batch, 1 << 20), GP_CUDA_THREADS, 0,
                                 c->stream>>>(p, (const float *)c->in[0], (float *)c->out[0], rows);
    } else if (dt == GP_DTYPE_FLOAT32) {
        rs_forward_f32_kernel<<<g, GP_CUDA_THREADS, 0, c->stream>>>(p, (const float *)c->in[0],
                                                                    (float *)c->out[0], n);
    } else {
        switch (gp_dtype_size(dt)) {
        case 1:
            rs_forward_copy_kernel<uint8_t><<<g, GP_CUDA_THREADS, 0, c->stream>>>(
                p, (const uint8_t *)c->in[0], (uint8_t *)c->out[0], (int)dt, n);
            break;
        case 2:
            rs_forward_copy_kernel<uint16_t><<<g, GP_CUDA_THREADS, 0, c->stream>>>(
                p, (const uint16_t *)c->in[0], (uint16_t *)c->out[0], (int)dt, n);
            break;
        case 4:
            rs_forward_copy_kernel<uint32_t><<<g, GP_CUDA_THREADS, 0, c->stream>>>(
                p, (const uint32_t *)c->in[0], (uint32_t *)c->out[0], (int)dt, n);
            break;
        case 8:
            rs_forward_copy_kernel<uint64_t><<<g, GP_CUDA_THREADS, 0, c->stream>>>(
                p, (const uint64_t *)c->in[0], (uint64_t *)c->out[0], (int)dt, n);
            break;
        default:
            return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "resizing %s data", gp_dtype_name(dt));
        }
    }
    return gp_cuda_check_launch(c, "resize forward", err);
}

/* dX[source] += weight * dY[o] for every source of every output element,
 * as a gather per input element. */
static gp_status resize_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    float *dX = c->din[0];
    const float *dY = c->dout[0];
    if (!dX || !dY) return GP_OK;
    GP_TRY(gp_cuda_want_f32(c, 0, err));
    struct rs_plan p;
    GP_TRY(resize_plan(c, err, &p));
    int64_t n = gp_shape_numel(&gp_cuda_in_value(c, 0)->shape);
    if (n == 0 || gp_shape_numel(&gp_cuda_out_value(c, 0)->shape) == 0) return GP_OK;
    if (p.lead == p.rank) {
        /* Every axis an identity: dX += dY. The gather below does that too
         * (no table axes: one output, one corner); it is the same kernel. */
    } else {
        rs_ranges_init_kernel<<<gp_cuda_blocks_for(p.in_total), GP_CUDA_THREADS, 0, c->stream>>>(p);
        GP_TRY(gp_cuda_check_launch(c, "resize backward (ranges)", err));
        rs_tables_kernel<<<gp_cuda_blocks_for(p.tab_total), GP_CUDA_THREADS, 0, c->stream>>>(p, true);
        GP_TRY(gp_cuda_check_launch(c, "resize backward (tables)", err));
    }
    if (rs_rows_ok(p)) {
        int64_t xlast = p.xdims[p.rank - 1];
        int64_t rows = n / xlast;
        rs_backward_rows_kernel<<<gp_cuda_capped_grid((rows + RS_BWD_ROWS - 1) / RS_BWD_ROWS, 1 << 20),
                                  GP_CUDA_THREADS, 0, c->stream>>>(p, dY, dX, rows);
    } else {
        rs_backward_kernel<<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, c->stream>>>(p, dY, dX, n);
    }
    return gp_cuda_check_launch(c, "resize backward", err);
}

/* ---- the table ---- */

#define REDUCE(op) {op, NULL, reduce_scratch, reduce_forward, reduce_backward}

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_misc[] = {
    {"Softmax", NULL, NULL, softmax_forward, softmax_backward},
    {"LogSoftmax", NULL, NULL, softmax_forward, softmax_backward},
    REDUCE("ReduceSum"), REDUCE("ReduceMean"), REDUCE("ReduceMax"), REDUCE("ReduceMin"),
    REDUCE("ReduceProd"), REDUCE("ReduceSumSquare"), REDUCE("ReduceL2"),
    {"ArgMax", NULL, NULL, arg_forward, NULL},
    {"ArgMin", NULL, NULL, arg_forward, NULL},
    {"Dropout", NULL, NULL, dropout_forward, dropout_backward},
    {"Resize", NULL, resize_scratch, resize_forward, resize_backward},
    {"Upsample", NULL, resize_scratch, resize_forward, resize_backward},
    {NULL, NULL, NULL, NULL, NULL},
};
