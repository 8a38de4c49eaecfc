/* CUDA kernels: the reductions (ReduceSum, Mean, Max, Min, Prod,
 * SumSquare, L2) and ArgMax/ArgMin, twin of backend/cpu/reduce.c.
 *
 * Same semantics as the CPU kernels, term for term: sums accumulate in
 * double, NaNs propagate the same way, ties and zeros get the same
 * gradients.
 *
 * Determinism: no float atomics. Cell reductions run one warp or one block
 * per cell with a fixed-order tree (or one thread per cell in the CPU's own
 * order where that reads coalesced), so results are the same run to run.
 *
 * Rounding: nvcc contracts a * b + c into FMAs, the CPU build does not;
 * where a product feeds a sum the operations are spelled with the _rn
 * intrinsics.
 *
 * bfloat16 (bf16_any): float data, its output, dY and dX each float32 or
 * bfloat16; loads widen, every stored value is rounded once (ArgMax/ArgMin
 * write int64 as ever), the sums are the float32 kernels' own, so results
 * equal those of float32 copies. */
#include <math.h>
#include <string.h>

#include <initializer_list>

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/storage.cuh"

extern "C" {
#include "ops/fold_util.h"
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
    struct gp_infer_ctx ic = gp_cuda_infer_ctx(g, node, err);
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
template <typename YP>
__device__ static inline void r_store(int kind, const struct rplan &p, double acc, int64_t cell, YP Y,
                                      double *aux)
{
    switch (kind) {
    case R_MEAN: st(Y, cell, (float)(acc / (double)p.count)); break;
    case R_L2: st(Y, cell, (float)sqrt(acc)); break;
    case X_TIES: case X_ZEROS: case X_NZPROD: aux[cell] = acc; break;
    default: st(Y, cell, (float)acc); break;
    }
}

/* One thread per cell, the CPU's order exactly. Y: the output (forward
 * kinds), or the forward output that X_TIES compares with (the
 * statistics, into aux). XP, YP: the storage of X and Y. */
template <typename XP, typename YP>
__global__ static void reduce_thread_kernel(struct rplan p, int kind, XP X, YP Y, double *aux)
{
    GP_GRID_STRIDE(cell, p.cells) {
        int64_t off = cell_base(p, cell), idx[GP_MAX_RANK];
        for (int q = 0; q < p.nr; q++) idx[q] = 0;
        float y = kind == X_TIES ? ld(Y, cell) : 0.0f;
        double acc = r_identity(kind);
        do acc = r_combine(kind, acc, r_term(kind, ld(X, off), y));
        while (cell_next(p, idx, &off));
        r_store(kind, p, acc, cell, Y, aux);
    }
}

/* One warp per cell (warp = true) or one block per cell: strided partial
 * terms, then a fixed-order tree. */
template <bool WARP, typename XP, typename YP>
__global__ static void reduce_group_kernel(struct rplan p, int kind, XP X, YP Y, double *aux)
{
    __shared__ double sh[32];
    int lane = threadIdx.x & 31;
    int64_t first = WARP ? blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5) : blockIdx.x;
    int64_t step = WARP ? (int64_t)gridDim.x * (blockDim.x >> 5) : gridDim.x;
    int64_t t0 = WARP ? lane : threadIdx.x, ts = WARP ? 32 : blockDim.x;
    for (int64_t cell = first; cell < p.cells; cell += step) {
        int64_t base = cell_base(p, cell);
        float y = kind == X_TIES ? ld(Y, cell) : 0.0f;
        double acc = r_identity(kind);
        for (int64_t e = t0; e < p.count; e += ts)
            acc = r_combine(kind, acc, r_term(kind, ld(X, base + red_offset(p, e)), y));
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

template <typename YP>
__global__ static void fill_kernel(YP Y, int64_t n, float v)
{
    GP_GRID_STRIDE(i, n) st(Y, i, v);
}

/* Launches the cell reduction of `kind` with the layout that reads
 * coalesced: a warp or block per cell when the last input axis is reduced
 * (or the cells are few), else a thread per cell. Y as for
 * reduce_thread_kernel. */
template <typename XP, typename YP>
static void launch_reduce(const struct rplan &p, int kind, XP X, YP Y, double *aux, cudaStream_t s)
{
    bool last_reduced = p.nr > 0 && p.rst[p.nr - 1] == 1;
    if (p.nr == 0 || p.count <= 8 || (!last_reduced && p.cells >= 2048)) {
        reduce_thread_kernel<<<gp_cuda_blocks_for(p.cells), GP_CUDA_THREADS, 0, s>>>(p, kind, X, Y, aux);
    } else if (p.count <= 2048) {
        reduce_group_kernel<true><<<gp_cuda_capped_grid((p.cells + 7) / 8, 1 << 20), 256, 0, s>>>(p, kind, X, Y,
                                                                                                 aux);
    } else {
        unsigned t = p.count >= 65536 ? 512 : 256;
        reduce_group_kernel<false><<<gp_cuda_capped_grid(p.cells, 1 << 20), t, 0, s>>>(p, kind, X, Y, aux);
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
    gp_fptr xf = gp_cuda_in_f(c, 0), yf = gp_cuda_out_f(c, 0);
    cudaStream_t stream = c->stream;
    if (p.count == 0) { /* an empty reduction: the identity element */
        with_storage(storage_of({yf}), [&](auto tag) {
            fill_kernel<<<gp_cuda_blocks_for(p.cells), GP_CUDA_THREADS, 0, stream>>>(
                out_as(tag, yf), p.cells, kind == R_PROD ? 1.0f : 0.0f);
        });
        return gp_cuda_check_launch(c, "reduction (empty)", err);
    }
    with_storage(storage_of({xf, yf}), [&](auto tag) {
        launch_reduce(p, kind, in_as(tag, xf), out_as(tag, yf), (double *)NULL, stream);
    });
    return gp_cuda_check_launch(c, "reduction forward", err);
}

/* dX per input element, its cell's dY and statistics: Sum dY; Mean
 * dY / count; SumSquare 2 X dY; L2 X dY / Y (0 where Y = 0); Max/Min dY
 * split evenly among the elements equal to Y; Prod dY times the product of
 * the others (exact with zeros). */
template <typename XP, typename GP>
__global__ static void reduce_bwd_kernel(struct rplan p, int kind, XP X, XP Y, XP dY, const double *s0,
                                         const double *s1, GP dX, int64_t n)
{
    GP_GRID_STRIDE(i, n) {
        int64_t rem = i, cell = 0;
        for (int d = p.rank - 1; d >= 0; d--) {
            int64_t q = gp_dev_fdiv(rem, p.dims[d]);
            cell += (rem - q * p.dims[d]) * p.cst[d];
            rem = q;
        }
        float x = ld(X, i), dy = ld(dY, cell), y = ld(Y, cell), g;
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
        st(dX, i, FADD(ld(dX, i), g));
    }
}

static gp_status reduce_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->dout[0] || !c->din[0]) return GP_OK;
    GP_TRY(gp_cuda_want_f32(c, 0, err));
    struct rplan p;
    GP_TRY(reduce_plan(c->graph, c->node, err, &p));
    enum rkind kind = rkind_of(c->node->op_type);
    if (p.count == 0 || p.cells == 0) return GP_OK;
    double *s0 = (double *)c->scratch, *s1 = s0 ? s0 + p.cells : NULL;
    gp_fptr xf = gp_cuda_in_f(c, 0), yf = gp_cuda_out_f(c, 0), dyf = gp_cuda_dout_f(c, 0),
            dxf = gp_cuda_din_f(c, 0);
    cudaStream_t stream = c->stream;
    gp_status rc = GP_OK;
    /* Y is the forward output here: X_TIES reads it, nothing writes it. */
    with_storage(storage_of({xf, yf, dyf, dxf}), [&](auto tag) {
        auto X = in_as(tag, xf);
        if (kind == R_MAX || kind == R_MIN) {
            launch_reduce(p, X_TIES, X, out_as(tag, yf), s0, stream);
            rc = gp_cuda_check_launch(c, "reduction backward (ties)", err);
        } else if (kind == R_PROD) {
            launch_reduce(p, X_ZEROS, X, out_as(tag, yf), s0, stream);
            rc = gp_cuda_check_launch(c, "reduction backward (zeros)", err);
            if (rc == GP_OK) launch_reduce(p, X_NZPROD, X, out_as(tag, yf), s1, stream);
            if (rc == GP_OK) rc = gp_cuda_check_launch(c, "reduction backward (product)", err);
        }
        if (rc != GP_OK) return;
        int64_t n = p.cells * p.count;
        reduce_bwd_kernel<<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, stream>>>(
            p, kind, X, in_as(tag, yf), in_as(tag, dyf), s0, s1, out_as(tag, dxf), n);
        rc = gp_cuda_check_launch(c, "reduction backward", err);
    });
    return rc;
}

/* ---- ArgMax, ArgMin ---- */

struct argplan {
    int64_t outer, inner, dim;
    bool is_max, last, fp;
    int dt;
};

/* Float element i of X, stored as bfloat16 (B16) or float32. */
template <bool B16>
__device__ static inline float arg_float(const void *X, int64_t i)
{
    return B16 ? __bfloat162float(((const bf16_t *)X)[i]) : ((const float *)X)[i];
}

/* The CPU's loop exactly: the first extreme element (the last with
 * select_last_index); a NaN is the extreme, the first one found stays. */
template <bool B16>
__global__ static void arg_thread_kernel(struct argplan a, const void *X, int64_t *Y)
{
    GP_GRID_STRIDE(k, a.outer * a.inner) {
        int64_t base = k / a.inner * a.dim * a.inner + k % a.inner, best = 0;
        for (int64_t j = 1; j < a.dim; j++) {
            int64_t ia = base + j * a.inner, ib = base + best * a.inner;
            bool better, equal;
            if (a.fp) {
                double x = arg_float<B16>(X, ia), y = arg_float<B16>(X, ib);
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
template <bool B16>
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
            if (a.fp) cand.v = arg_float<B16>(X, base + j), cand.iv = 0;
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
    struct gp_infer_ctx ic = gp_cuda_infer_ctx(c->graph, c->node, err);
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
    unsigned gw = gp_cuda_capped_grid((slots + 7) / 8, 1 << 20), gt = gp_cuda_blocks_for(slots);
    bool warp = a.inner == 1 && a.dim >= 64;
    if (a.fp && gp_cuda_is_bf16(c->in_dt, 0)) {
        if (warp) arg_warp_kernel<true><<<gw, 256, 0, c->stream>>>(a, c->in[0], Y);
        else arg_thread_kernel<true><<<gt, GP_CUDA_THREADS, 0, c->stream>>>(a, c->in[0], Y);
    } else {
        if (warp) arg_warp_kernel<false><<<gw, 256, 0, c->stream>>>(a, c->in[0], Y);
        else arg_thread_kernel<false><<<gt, GP_CUDA_THREADS, 0, c->stream>>>(a, c->in[0], Y);
    }
    return gp_cuda_check_launch(c, a.is_max ? "ArgMax" : "ArgMin", err);
}

/* ---- the table ---- */

#define REDUCE(op) {op, NULL, reduce_scratch, reduce_forward, reduce_backward, false, true}

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_reduce[] = {
    REDUCE("ReduceSum"), REDUCE("ReduceMean"), REDUCE("ReduceMax"), REDUCE("ReduceMin"),
    REDUCE("ReduceProd"), REDUCE("ReduceSumSquare"), REDUCE("ReduceL2"),
    {"ArgMax", NULL, NULL, arg_forward, NULL, false, true},
    {"ArgMin", NULL, NULL, arg_forward, NULL, false, true},
    {NULL, NULL, NULL, NULL, NULL, false, false},
};
