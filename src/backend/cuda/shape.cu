/* CUDA kernels: the shape family, twin of backend/cpu/shape.c. Reshape,
 * Flatten, Squeeze, Unsqueeze, Transpose, Concat, Split, Slice, Tile,
 * Trilu, and the shape producers (Shape, Size, ConstantOfShape, Range) that
 * loading normally folds away. Gather is in gather.cu, Pad in pad.cu.
 *
 * Forward moves elements by their size, so every dtype works (float
 * tensors are float32 on the device, as plan.c lays them out). Plans
 * (permutations, split sizes, slice starts and steps) come from the op
 * layer's helpers, exactly as on the CPU, so both backends and shape
 * inference agree by construction.
 *
 * Strided views: Transpose, Concat, Split and Slice move each element once
 * between two strided views of the same index space (view_run, the CPU's
 * copy_view); backward is the same move with the roles swapped, adding.
 * The view is simplified first (size-1 axes dropped, axes merged where
 * both sides are contiguous across them), then runs as
 *   - one cudaMemcpyAsync when both sides are contiguous,
 *   - a row copy in 16/8/4-byte units when the last axis is contiguous on
 *     both sides (Concat, Split, most Slices, Transpose keeping the last
 *     axis),
 *   - a 32x32 shared-memory tile transpose when the axes contiguous on the
 *     two sides differ and both are at least 16 long (the common last-two-
 *     axes Transpose, coalesced on both sides),
 *   - a general strided gather otherwise.
 *
 * Differences from the CPU kernels: Trilu's k is read on the device. */
#include <string.h>

#include <cuda_runtime.h>

#include "backend/cuda/kernel.h"
#include "backend/cuda/kernel_util.cuh"

extern "C" {
#include "ops/fold_util.h"
}

/* ---- small helpers ---- */

/* An element of `es` bytes, moved as one load and store. */
template <int ES> struct elem_of;
template <> struct elem_of<1> { typedef uint8_t T; };
template <> struct elem_of<2> { typedef uint16_t T; };
template <> struct elem_of<4> { typedef uint32_t T; };
template <> struct elem_of<8> { typedef unsigned long long T; };
template <> struct elem_of<16> { typedef uint4 T; };

/* dst += src in float lanes, never contracted. */
__device__ static inline float vadd(float a, float b) { return __fadd_rn(a, b); }
__device__ static inline float2 vadd(float2 a, float2 b)
{
    return make_float2(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y));
}
__device__ static inline float4 vadd(float4 a, float4 b)
{
    return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z),
                       __fadd_rn(a.w, b.w));
}

/* ---- dst [n] += src [n] (float), float4 where aligned ---- */

__global__ static void add_into_kernel(float *dst, const float *src, int64_t n, bool vec)
{
    int64_t n4 = vec ? n / 4 : 0;
    GP_GRID_STRIDE(i, n4)
    {
        float4 *d = (float4 *)dst + i;
        *d = vadd(*d, ((const float4 *)src)[i]);
    }
    GP_GRID_STRIDE(j, n - n4 * 4)
    {
        int64_t i = n4 * 4 + j;
        dst[i] = __fadd_rn(dst[i], src[i]);
    }
}

static gp_status add_into(const struct gp_cuda_ctx *c, float *dst, const float *src, int64_t n,
                          const char *what, struct gp_error *err)
{
    if (n <= 0) return GP_OK;
    bool vec = ((uintptr_t)dst % 16 == 0) && ((uintptr_t)src % 16 == 0);
    add_into_kernel<<<gp_cuda_blocks_for(vec ? (n + 3) / 4 : n), GP_CUDA_THREADS, 0, c->stream>>>(
        dst, src, n, vec);
    return gp_cuda_check_launch(c, what, err);
}

/* ---- strided views ---- */

/* An index space with each element at base + sum(idx[d] * st[d]) on either
 * side; kernels get it by value. */
struct view {
    int rank;
    int64_t n;
    int64_t dims[GP_MAX_RANK];
    int64_t dst_st[GP_MAX_RANK], src_st[GP_MAX_RANK];
    int64_t dst_base, src_base;
};

/* Drops size-1 axes and merges an axis into the one before it where both
 * sides are contiguous across the pair. */
static void view_init(struct view *v, const struct gp_shape *shape, const int64_t *dst_st,
                      int64_t dst_base, const int64_t *src_st, int64_t src_base)
{
    memset(v, 0, sizeof *v);
    v->n = gp_shape_numel(shape);
    v->dst_base = dst_base;
    v->src_base = src_base;
    for (int d = 0; d < shape->rank; d++) {
        if (shape->dims[d] == 1) continue;
        int r = v->rank - 1;
        if (r >= 0 && v->dst_st[r] == dst_st[d] * shape->dims[d] &&
            v->src_st[r] == src_st[d] * shape->dims[d]) {
            v->dims[r] *= shape->dims[d];
            v->dst_st[r] = dst_st[d];
            v->src_st[r] = src_st[d];
            continue;
        }
        v->dims[v->rank] = shape->dims[d];
        v->dst_st[v->rank] = dst_st[d];
        v->src_st[v->rank] = src_st[d];
        v->rank++;
    }
    if (v->rank == 0) { /* one element */
        v->rank = 1;
        v->dims[0] = 1;
        v->dst_st[0] = v->src_st[0] = 1;
    }
}

/* Element i of the index space: dst[od] = src[os] (or += for ADD). IT is
 * the index type: 32-bit division where the space fits. */
template <typename T, typename IT, bool ADD>
__global__ static void view_kernel(struct view v, T *dst, const T *src)
{
    IT n = (IT)v.n;
    for (IT i = (IT)(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += (IT)(gridDim.x * blockDim.x)) {
        IT rem = i;
        int64_t od = v.dst_base, os = v.src_base;
        for (int d = v.rank - 1; d >= 0; d--) {
            IT x = rem % (IT)v.dims[d];
            rem /= (IT)v.dims[d];
            od += (int64_t)x * v.dst_st[d];
            os += (int64_t)x * v.src_st[d];
        }
        if constexpr (ADD) dst[od] = vadd(dst[od], src[os]);
        else dst[od] = src[os];
    }
}

/* The tile transpose: axis `as` has source stride 1, axis `ad` destination
 * stride 1. A block of 32 x 8 threads moves a 32 x 32 tile: it reads
 * along `as` (coalesced), writes along `ad` (coalesced). Blocks loop over
 * tiles x the other axes (the batch). */
#define TILE 32
#define TILE_ROWS 8

template <typename T, bool ADD>
__global__ static void view_tile_kernel(struct view v, int as, int ad, int64_t tiles_s,
                                        int64_t tiles_d, int64_t n_blocks, T *dst, const T *src)
{
    __shared__ T tile[TILE][TILE + 1];
    int64_t ns = v.dims[as], nd = v.dims[ad];
    for (int64_t b = blockIdx.x; b < n_blocks; b += gridDim.x) {
        int64_t ts = b % tiles_s, rest = b / tiles_s;
        int64_t td = rest % tiles_d, bi = rest / tiles_d;
        int64_t od = v.dst_base, os = v.src_base;
        for (int d = v.rank - 1; d >= 0; d--) {
            if (d == as || d == ad) continue;
            int64_t x = bi % v.dims[d];
            bi /= v.dims[d];
            od += x * v.dst_st[d];
            os += x * v.src_st[d];
        }
        int64_t s0 = ts * TILE, d0 = td * TILE;
        int64_t xs = s0 + threadIdx.x;
        for (int k = threadIdx.y; k < TILE; k += TILE_ROWS) {
            int64_t xd = d0 + k;
            if (xs < ns && xd < nd) tile[k][threadIdx.x] = src[os + xs + xd * v.src_st[ad]];
        }
        __syncthreads();
        int64_t yd = d0 + threadIdx.x;
        for (int k = threadIdx.y; k < TILE; k += TILE_ROWS) {
            int64_t ys = s0 + k;
            if (yd < nd && ys < ns) {
                T *o = dst + od + yd + ys * v.dst_st[as];
                if constexpr (ADD) *o = vadd(*o, tile[threadIdx.x][k]);
                else *o = tile[threadIdx.x][k];
            }
        }
        __syncthreads();
    }
}

template <typename T, bool ADD>
static void launch_view(const struct view *v, void *dst, const void *src, cudaStream_t s)
{
    unsigned blocks = gp_cuda_blocks_for(v->n);
    if (v->n <= INT32_MAX)
        view_kernel<T, uint32_t, ADD><<<blocks, GP_CUDA_THREADS, 0, s>>>(*v, (T *)dst, (const T *)src);
    else
        view_kernel<T, int64_t, ADD><<<blocks, GP_CUDA_THREADS, 0, s>>>(*v, (T *)dst, (const T *)src);
}

template <typename T, bool ADD>
static void launch_tile(const struct view *v, int as, int ad, void *dst, const void *src, cudaStream_t s)
{
    int64_t ts = (v->dims[as] + TILE - 1) / TILE, td = (v->dims[ad] + TILE - 1) / TILE;
    int64_t nb = ts * td * (v->n / (v->dims[as] * v->dims[ad]));
    unsigned grid = (unsigned)(nb < 65536 ? nb : 65536);
    view_tile_kernel<T, ADD><<<grid, dim3(TILE, TILE_ROWS), 0, s>>>(*v, as, ad, ts, td, nb, (T *)dst,
                                                                    (const T *)src);
}

/* Scales a view whose last axis is contiguous on both sides to units of
 * `u` bytes (elements of `es`), when every offset stays a whole number of
 * units and both pointers are aligned to u. */
static bool view_units(struct view *v, size_t es, size_t u, const void *dst, const void *src)
{
    int last = v->rank - 1;
    int64_t U = (int64_t)u, E = (int64_t)es;
    if ((uintptr_t)dst % u || (uintptr_t)src % u) return false;
    if ((v->dims[last] * E) % U || (v->dst_base * E) % U || (v->src_base * E) % U) return false;
    for (int d = 0; d < last; d++)
        if ((v->dst_st[d] * E) % U || (v->src_st[d] * E) % U) return false;
    if (U == E) return true;
    v->dims[last] = v->dims[last] * E / U;
    v->dst_base = v->dst_base * E / U;
    v->src_base = v->src_base * E / U;
    for (int d = 0; d < last; d++) {
        v->dst_st[d] = v->dst_st[d] * E / U;
        v->src_st[d] = v->src_st[d] * E / U;
    }
    v->n = v->n * E / U;
    return true;
}

/* Moves the elements of index space `shape` from src to dst, element idx
 * at base + sum(idx[d] * st[d]) on either side, `es` bytes each; with
 * `add`, dst (float) += src (float). The twin of the CPU's copy_view. */
static gp_status view_run(const struct gp_cuda_ctx *c, struct gp_error *err, void *dst,
                          const int64_t *dst_st, int64_t dst_base, const void *src,
                          const int64_t *src_st, int64_t src_base, const struct gp_shape *shape,
                          size_t es, bool add, const char *what)
{
    struct view v;
    view_init(&v, shape, dst_st, dst_base, src_st, src_base);
    if (v.n == 0) return GP_OK;
    GP_TRY(gp_cuda_check_esize(c, es, err));
    if (add && es != sizeof(float))
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "%s: gradient of a non-float tensor", what);
    cudaStream_t s = c->stream;
    int last = v.rank - 1;
    if (!add && v.rank == 1 && v.dst_st[0] == 1 && v.src_st[0] == 1) {
        if (dst == src && dst_base == src_base) return GP_OK;
        return gp_cuda_call(c,
                         cudaMemcpyAsync((char *)dst + v.dst_base * (int64_t)es,
                                         (const char *)src + v.src_base * (int64_t)es,
                                         (size_t)v.n * es, cudaMemcpyDeviceToDevice, s),
                         what, err);
    }
    if (v.dst_st[last] == 1 && v.src_st[last] == 1) { /* contiguous rows */
        static const size_t units[] = {16, 8, 4, 2, 1};
        for (size_t k = 0; k < sizeof units / sizeof *units; k++) {
            size_t u = units[k];
            if (add && u < sizeof(float)) break;
            struct view w = v;
            if (!view_units(&w, es, u, dst, src)) continue;
            if (add) {
                if (u == 16) launch_view<float4, true>(&w, dst, src, s);
                else if (u == 8) launch_view<float2, true>(&w, dst, src, s);
                else launch_view<float, true>(&w, dst, src, s);
            } else {
                switch (u) {
                case 16: launch_view<uint4, false>(&w, dst, src, s); break;
                case 8: launch_view<unsigned long long, false>(&w, dst, src, s); break;
                case 4: launch_view<uint32_t, false>(&w, dst, src, s); break;
                case 2: launch_view<uint16_t, false>(&w, dst, src, s); break;
                default: launch_view<uint8_t, false>(&w, dst, src, s); break;
                }
            }
            return gp_cuda_check_launch(c, what, err);
        }
        /* not reached: u == es always fits */
    }
    int as = -1, ad = -1;
    for (int d = 0; d < v.rank; d++) {
        if (v.src_st[d] == 1 && as < 0) as = d;
        if (v.dst_st[d] == 1 && ad < 0) ad = d;
    }
    bool tiled = as >= 0 && ad >= 0 && as != ad && v.dims[as] >= 16 && v.dims[ad] >= 16;
    switch (es) {
    case 1:
        if (tiled) launch_tile<uint8_t, false>(&v, as, ad, dst, src, s);
        else launch_view<uint8_t, false>(&v, dst, src, s);
        break;
    case 2:
        if (tiled) launch_tile<uint16_t, false>(&v, as, ad, dst, src, s);
        else launch_view<uint16_t, false>(&v, dst, src, s);
        break;
    case 4:
        if (add) {
            if (tiled) launch_tile<float, true>(&v, as, ad, dst, src, s);
            else launch_view<float, true>(&v, dst, src, s);
        } else {
            if (tiled) launch_tile<uint32_t, false>(&v, as, ad, dst, src, s);
            else launch_view<uint32_t, false>(&v, dst, src, s);
        }
        break;
    default:
        if (tiled) launch_tile<unsigned long long, false>(&v, as, ad, dst, src, s);
        else launch_view<unsigned long long, false>(&v, dst, src, s);
        break;
    }
    return gp_cuda_check_launch(c, what, err);
}

static void contiguous(const struct gp_shape *s, int64_t *st) { gp_shape_strides(s, st); }

/* ---- Reshape, Flatten, Squeeze, Unsqueeze ---- */

/* X -> Y with the same elements in the same order: a device-to-device copy
 * on the stream (none when the executor aliased the buffers). */
static gp_status copy_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    size_t bytes = (size_t)gp_shape_numel(gp_cuda_in_shape(c, 0)) * gp_cuda_in_esize(c, 0);
    if (bytes == 0 || c->out[0] == c->in[0]) return GP_OK;
    return gp_cuda_call(c, cudaMemcpyAsync(c->out[0], c->in[0], bytes, cudaMemcpyDeviceToDevice, c->stream),
                     "cudaMemcpyAsync", err);
}

static gp_status copy_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->din[0] || !c->dout[0]) return GP_OK;
    return add_into(c, c->din[0], c->dout[0], gp_shape_numel(gp_cuda_in_shape(c, 0)), "copy backward", err);
}

/* ---- Transpose ---- */

/* Output axis d walks input axis perm[d]: x_st[d] = input stride of perm[d]. */
static gp_status transpose_view(struct gp_cuda_ctx *c, struct gp_error *err, int64_t *x_st)
{
    struct gp_infer_ctx ic = gp_cuda_infer_ctx(c->graph, c->node, err);
    return gp_transpose_view(&ic, gp_cuda_in_shape(c, 0), x_st);
}

static gp_status transpose_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    int64_t x_st[GP_MAX_RANK], y_st[GP_MAX_RANK];
    GP_TRY(transpose_view(c, err, x_st));
    const struct gp_shape *ys = gp_cuda_out_shape(c, 0);
    contiguous(ys, y_st);
    return view_run(c, err, c->out[0], y_st, 0, c->in[0], x_st, 0, ys, gp_cuda_in_esize(c, 0), false,
                    "Transpose forward");
}

static gp_status transpose_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->din[0] || !c->dout[0]) return GP_OK;
    int64_t x_st[GP_MAX_RANK], y_st[GP_MAX_RANK];
    GP_TRY(transpose_view(c, err, x_st));
    const struct gp_shape *ys = gp_cuda_out_shape(c, 0);
    contiguous(ys, y_st);
    return view_run(c, err, c->din[0], x_st, 0, c->dout[0], y_st, 0, ys, sizeof(float), true,
                    "Transpose backward");
}

/* ---- Concat, Split ---- */

/* Input k is the view of Y starting at its offset along the axis. */
static gp_status concat_run(struct gp_cuda_ctx *c, struct gp_error *err, bool backward)
{
    struct gp_infer_ctx ic = gp_cuda_infer_ctx(c->graph, c->node, err);
    const struct gp_shape *ys = gp_cuda_out_shape(c, 0);
    int axis;
    GP_TRY(gp_norm_axis(&ic, gp_node_attr_int(c->node, "axis", 0), ys->rank, &axis));
    int64_t y_st[GP_MAX_RANK], x_st[GP_MAX_RANK], at = 0;
    contiguous(ys, y_st);
    for (int k = 0; k < c->node->n_inputs; k++) {
        const struct gp_shape *xs = gp_cuda_in_shape(c, k);
        contiguous(xs, x_st);
        if (!backward)
            GP_TRY(view_run(c, err, c->out[0], y_st, at * y_st[axis], c->in[k], x_st, 0, xs,
                            gp_cuda_in_esize(c, k), false, "Concat forward"));
        else if (c->din[k] && c->dout[0])
            GP_TRY(view_run(c, err, c->din[k], x_st, 0, c->dout[0], y_st, at * y_st[axis], xs,
                            sizeof(float), true, "Concat backward"));
        at += xs->dims[axis];
    }
    return GP_OK;
}

static gp_status concat_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    return concat_run(c, err, false);
}

static gp_status concat_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    return concat_run(c, err, true);
}

/* Output k is the view of X from the sum of the sizes before it. The sizes
 * live on the host (the CPU keeps them in its scratch). */
#define SPLIT_MAX 1024

static gp_status split_run(struct gp_cuda_ctx *c, struct gp_error *err, bool backward)
{
    struct gp_infer_ctx ic = gp_cuda_infer_ctx(c->graph, c->node, err);
    const struct gp_shape *xs = gp_cuda_in_shape(c, 0);
    if (c->node->n_outputs > SPLIT_MAX)
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "%d outputs; at most %d are supported",
                             c->node->n_outputs, SPLIT_MAX);
    int axis;
    GP_TRY(gp_norm_axis(&ic, gp_node_attr_int(c->node, "axis", 0), xs->rank, &axis));
    int64_t sizes[SPLIT_MAX];
    GP_TRY(gp_split_sizes(&ic, xs->dims[axis], sizes));
    int64_t x_st[GP_MAX_RANK], y_st[GP_MAX_RANK], at = 0;
    contiguous(xs, x_st);
    for (int k = 0; k < c->node->n_outputs; at += sizes[k], k++) {
        if (!c->out[k]) continue;
        struct gp_shape ys = *xs;
        ys.dims[axis] = sizes[k];
        contiguous(&ys, y_st);
        if (!backward)
            GP_TRY(view_run(c, err, c->out[k], y_st, 0, c->in[0], x_st, at * x_st[axis], &ys,
                            gp_cuda_in_esize(c, 0), false, "Split forward"));
        else if (c->din[0] && c->dout[k])
            GP_TRY(view_run(c, err, c->din[0], x_st, at * x_st[axis], c->dout[k], y_st, 0, &ys,
                            sizeof(float), true, "Split backward"));
    }
    return GP_OK;
}

static gp_status split_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    return split_run(c, err, false);
}

static gp_status split_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    return split_run(c, err, true);
}

/* ---- Slice ---- */

/* Output position i on axis d reads input position start[d] + i * step[d]
 * (steps may be negative: the strides are). */
static gp_status slice_view(struct gp_cuda_ctx *c, struct gp_error *err, int64_t *x_st, int64_t *base)
{
    struct gp_infer_ctx ic = gp_cuda_infer_ctx(c->graph, c->node, err);
    return gp_slice_view(&ic, gp_cuda_in_shape(c, 0), x_st, base);
}

static gp_status slice_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    int64_t x_st[GP_MAX_RANK], y_st[GP_MAX_RANK], base;
    GP_TRY(slice_view(c, err, x_st, &base));
    const struct gp_shape *ys = gp_cuda_out_shape(c, 0);
    contiguous(ys, y_st);
    return view_run(c, err, c->out[0], y_st, 0, c->in[0], x_st, base, ys, gp_cuda_in_esize(c, 0), false,
                    "Slice forward");
}

static gp_status slice_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->din[0] || !c->dout[0]) return GP_OK;
    int64_t x_st[GP_MAX_RANK], y_st[GP_MAX_RANK], base;
    GP_TRY(slice_view(c, err, x_st, &base));
    const struct gp_shape *ys = gp_cuda_out_shape(c, 0);
    contiguous(ys, y_st);
    return view_run(c, err, c->din[0], x_st, base, c->dout[0], y_st, 0, ys, sizeof(float), true,
                    "Slice backward");
}

/* ---- Tile ---- */

struct tile_plan {
    int rank;
    int64_t xd[GP_MAX_RANK], yd[GP_MAX_RANK], x_st[GP_MAX_RANK], y_st[GP_MAX_RANK], rep[GP_MAX_RANK];
    int64_t copies;
};

static void tile_plan_of(const struct gp_cuda_ctx *c, struct tile_plan *p)
{
    const struct gp_shape *xs = gp_cuda_in_shape(c, 0), *ys = gp_cuda_out_shape(c, 0);
    memset(p, 0, sizeof *p);
    p->rank = xs->rank;
    contiguous(xs, p->x_st);
    contiguous(ys, p->y_st);
    p->copies = 1;
    for (int d = 0; d < xs->rank; d++) {
        p->xd[d] = xs->dims[d];
        p->yd[d] = ys->dims[d];
        p->rep[d] = xs->dims[d] ? ys->dims[d] / xs->dims[d] : 0;
        p->copies *= p->rep[d];
    }
}

/* Y[idx] = X[idx mod D] per axis. */
template <typename T>
__global__ static void tile_forward_kernel(struct tile_plan p, const T *x, T *y, int64_t n)
{
    GP_GRID_STRIDE(i, n)
    {
        int64_t rem = i, src = 0;
        for (int d = p.rank - 1; d >= 0; d--) {
            src += rem % p.yd[d] % p.xd[d] * p.x_st[d];
            rem /= p.yd[d];
        }
        y[i] = x[src];
    }
}

static gp_status tile_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    struct tile_plan p;
    tile_plan_of(c, &p);
    int64_t n = gp_shape_numel(gp_cuda_out_shape(c, 0));
    size_t es = gp_cuda_in_esize(c, 0);
    GP_TRY(gp_cuda_check_esize(c, es, err));
    if (n == 0) return GP_OK;
    unsigned b = gp_cuda_blocks_for(n);
    switch (es) {
    case 1: tile_forward_kernel<uint8_t><<<b, GP_CUDA_THREADS, 0, c->stream>>>(p, (const uint8_t *)c->in[0], (uint8_t *)c->out[0], n); break;
    case 2: tile_forward_kernel<uint16_t><<<b, GP_CUDA_THREADS, 0, c->stream>>>(p, (const uint16_t *)c->in[0], (uint16_t *)c->out[0], n); break;
    case 4: tile_forward_kernel<uint32_t><<<b, GP_CUDA_THREADS, 0, c->stream>>>(p, (const uint32_t *)c->in[0], (uint32_t *)c->out[0], n); break;
    default: tile_forward_kernel<unsigned long long><<<b, GP_CUDA_THREADS, 0, c->stream>>>(p, (const unsigned long long *)c->in[0], (unsigned long long *)c->out[0], n); break;
    }
    return gp_cuda_check_launch(c, "Tile forward", err);
}

/* dX[e] += the sum over the repeats of dY[e + k * D], in order, summed in
 * float from zero as the CPU does. */
__global__ static void tile_backward_kernel(struct tile_plan p, const float *dy, float *dx, int64_t n)
{
    GP_GRID_STRIDE(e, n)
    {
        int64_t base = 0, rem = e, k[GP_MAX_RANK];
        for (int d = p.rank - 1; d >= 0; d--) {
            base += rem % p.xd[d] * p.y_st[d];
            rem /= p.xd[d];
            k[d] = 0;
        }
        float acc = 0;
        for (int64_t m = 0; m < p.copies; m++) {
            int64_t off = base;
            for (int d = 0; d < p.rank; d++) off += k[d] * p.xd[d] * p.y_st[d];
            acc = __fadd_rn(acc, dy[off]);
            for (int d = p.rank - 1; d >= 0 && ++k[d] == p.rep[d]; d--) k[d] = 0;
        }
        dx[e] = __fadd_rn(dx[e], acc);
    }
}

static gp_status tile_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->din[0] || !c->dout[0]) return GP_OK;
    struct tile_plan p;
    tile_plan_of(c, &p);
    int64_t n = gp_shape_numel(gp_cuda_in_shape(c, 0));
    if (n == 0) return GP_OK;
    tile_backward_kernel<<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, c->stream>>>(p, c->dout[0], c->din[0], n);
    return gp_cuda_check_launch(c, "Tile backward", err);
}

/* ---- Trilu ---- */

/* Keeps the elements on or above (upper) / on or below (lower) diagonal k
 * of each [rows, cols] matrix; k is input 1 (an int64 scalar on the
 * device), 0 when omitted. */
__device__ static inline bool trilu_keep(int64_t i, int64_t rc, int64_t cols, int64_t k, bool upper)
{
    int64_t in_mat = i % rc, diag = in_mat % cols - in_mat / cols;
    return upper ? diag >= k : diag <= k;
}

template <typename T>
__global__ static void trilu_forward_kernel(const T *x, T *y, int64_t n, int64_t rc, int64_t cols,
                                            const int64_t *kp, bool upper)
{
    int64_t k = kp ? *kp : 0;
    GP_GRID_STRIDE(i, n)
    {
        T z{};
        y[i] = trilu_keep(i, rc, cols, k, upper) ? x[i] : z;
    }
}

__global__ static void trilu_backward_kernel(const float *dy, float *dx, int64_t n, int64_t rc,
                                             int64_t cols, const int64_t *kp, bool upper)
{
    int64_t k = kp ? *kp : 0;
    GP_GRID_STRIDE(i, n)
    {
        if (trilu_keep(i, rc, cols, k, upper)) dx[i] = __fadd_rn(dx[i], dy[i]);
    }
}

static gp_status trilu_run(struct gp_cuda_ctx *c, struct gp_error *err, bool backward)
{
    const struct gp_shape *xs = gp_cuda_in_shape(c, 0);
    if (xs->rank < 2) return gp_cuda_error(c, err, GP_ERR_INVALID, "input of rank %d", xs->rank);
    int64_t n = gp_shape_numel(xs), cols = xs->dims[xs->rank - 1];
    int64_t rc = cols * xs->dims[xs->rank - 2];
    const int64_t *kp = c->node->n_inputs > 1 && c->in[1] ? (const int64_t *)c->in[1] : NULL;
    if (kp && gp_cuda_in_value(c, 1)->dtype != GP_DTYPE_INT64)
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "k of type %s",
                             gp_dtype_name(gp_cuda_in_value(c, 1)->dtype));
    bool upper = gp_node_attr_int(c->node, "upper", 1) != 0;
    if (n == 0) return GP_OK;
    unsigned b = gp_cuda_blocks_for(n);
    cudaStream_t s = c->stream;
    if (backward) {
        if (!c->din[0] || !c->dout[0]) return GP_OK;
        trilu_backward_kernel<<<b, GP_CUDA_THREADS, 0, s>>>(c->dout[0], c->din[0], n, rc, cols, kp, upper);
        return gp_cuda_check_launch(c, "Trilu backward", err);
    }
    size_t es = gp_cuda_in_esize(c, 0);
    GP_TRY(gp_cuda_check_esize(c, es, err));
    switch (es) {
    case 1: trilu_forward_kernel<uint8_t><<<b, GP_CUDA_THREADS, 0, s>>>((const uint8_t *)c->in[0], (uint8_t *)c->out[0], n, rc, cols, kp, upper); break;
    case 2: trilu_forward_kernel<uint16_t><<<b, GP_CUDA_THREADS, 0, s>>>((const uint16_t *)c->in[0], (uint16_t *)c->out[0], n, rc, cols, kp, upper); break;
    case 4: trilu_forward_kernel<uint32_t><<<b, GP_CUDA_THREADS, 0, s>>>((const uint32_t *)c->in[0], (uint32_t *)c->out[0], n, rc, cols, kp, upper); break;
    default: trilu_forward_kernel<unsigned long long><<<b, GP_CUDA_THREADS, 0, s>>>((const unsigned long long *)c->in[0], (unsigned long long *)c->out[0], n, rc, cols, kp, upper); break;
    }
    return gp_cuda_check_launch(c, "Trilu forward", err);
}

static gp_status trilu_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    return trilu_run(c, err, false);
}

static gp_status trilu_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    return trilu_run(c, err, true);
}

/* ---- Shape, Size, ConstantOfShape, Range ---- */

/* Up to 8 int64 values (static on the host) written by a kernel: kernel
 * parameters need no host buffer that outlives the call. */
struct small_i64 {
    int n;
    int64_t v[GP_MAX_RANK];
};

__global__ static void write_small_kernel(struct small_i64 s, int64_t *y)
{
    if (threadIdx.x < (unsigned)s.n) y[threadIdx.x] = s.v[threadIdx.x];
}

/* X -> int64 [end - start]: X's static dimensions (Shape-15's window). */
static gp_status shape_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    const struct gp_shape *xs = gp_cuda_in_shape(c, 0);
    int64_t r = xs->rank, s = gp_node_attr_int(c->node, "start", 0);
    int64_t e = gp_node_attr_int(c->node, "end", r);
    if (s < 0) s += r;
    if (e < 0) e += r;
    s = s < 0 ? 0 : s > r ? r : s;
    e = e < s ? s : e > r ? r : e;
    struct small_i64 v;
    memset(&v, 0, sizeof v);
    for (int64_t d = s; d < e; d++) v.v[v.n++] = xs->dims[d];
    if (v.n == 0) return GP_OK;
    write_small_kernel<<<1, 32, 0, c->stream>>>(v, (int64_t *)c->out[0]);
    return gp_cuda_check_launch(c, "Shape forward", err);
}

static gp_status size_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    struct small_i64 v;
    memset(&v, 0, sizeof v);
    v.n = 1;
    v.v[0] = gp_shape_numel(gp_cuda_in_shape(c, 0));
    write_small_kernel<<<1, 32, 0, c->stream>>>(v, (int64_t *)c->out[0]);
    return gp_cuda_check_launch(c, "Size forward", err);
}

/* The host's conversions of the CPU backend (gp_cpu_store_f64/_i64), for
 * the one value ConstantOfShape fills with. */
static void host_store_i64(void *p, enum gp_dtype dt, int64_t v)
{
    switch (dt) {
    case GP_DTYPE_UINT8: *(uint8_t *)p = (uint8_t)v; return;
    case GP_DTYPE_BOOL: *(uint8_t *)p = v != 0; return;
    case GP_DTYPE_INT8: *(int8_t *)p = (int8_t)v; return;
    case GP_DTYPE_UINT16: *(uint16_t *)p = (uint16_t)v; return;
    case GP_DTYPE_INT16: *(int16_t *)p = (int16_t)v; return;
    case GP_DTYPE_INT32: *(int32_t *)p = (int32_t)v; return;
    case GP_DTYPE_UINT32: *(uint32_t *)p = (uint32_t)v; return;
    case GP_DTYPE_INT64: *(int64_t *)p = v; return;
    case GP_DTYPE_UINT64: *(uint64_t *)p = (uint64_t)v; return;
    default: *(float *)p = (float)v; return;
    }
}

static void host_store_f64(void *p, enum gp_dtype dt, double v)
{
    if (gp_dtype_is_float(dt)) {
        *(float *)p = (float)v;
    } else if (dt == GP_DTYPE_BOOL) {
        *(uint8_t *)p = v != 0;
    } else if (dt == GP_DTYPE_UINT64 && v >= 9.2233720368547758e18) {
        *(uint64_t *)p = v >= 1.8446744073709552e19 ? UINT64_MAX : (uint64_t)v;
    } else {
        int64_t iv = v != v ? 0
                     : v >= 9.2233720368547758e18 ? INT64_MAX
                     : v <= -9.2233720368547758e18 ? INT64_MIN
                                                  : (int64_t)v;
        host_store_i64(p, dt, iv);
    }
}

template <typename T>
__global__ static void fill_kernel(T *y, int64_t n, unsigned long long bits)
{
    T v;
    memcpy(&v, &bits, sizeof v);
    GP_GRID_STRIDE(i, n) y[i] = v;
}

static gp_status constant_of_shape_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    const struct gp_value *y = gp_cuda_out_value(c, 0);
    int64_t n = gp_shape_numel(&y->shape);
    size_t es = gp_cuda_esize(y->dtype);
    GP_TRY(gp_cuda_check_esize(c, es, err));
    const struct gp_attr *a = gp_node_attr(c->node, "value");
    unsigned long long bits = 0;
    if (!a || !a->t) host_store_f64(&bits, y->dtype, 0);
    else if (gp_dtype_is_float(a->t->dtype)) host_store_f64(&bits, y->dtype, gp_tensor_get_f64(a->t, 0));
    else host_store_i64(&bits, y->dtype, gp_tensor_get_i64(a->t, 0));
    if (n == 0) return GP_OK;
    unsigned b = gp_cuda_blocks_for(n);
    switch (es) {
    case 1: fill_kernel<uint8_t><<<b, GP_CUDA_THREADS, 0, c->stream>>>((uint8_t *)c->out[0], n, bits); break;
    case 2: fill_kernel<uint16_t><<<b, GP_CUDA_THREADS, 0, c->stream>>>((uint16_t *)c->out[0], n, bits); break;
    case 4: fill_kernel<uint32_t><<<b, GP_CUDA_THREADS, 0, c->stream>>>((uint32_t *)c->out[0], n, bits); break;
    default: fill_kernel<unsigned long long><<<b, GP_CUDA_THREADS, 0, c->stream>>>((unsigned long long *)c->out[0], n, bits); break;
    }
    return gp_cuda_check_launch(c, "ConstantOfShape forward", err);
}

/* Y [n] = start + i * delta: in double for floats, wrapping int64
 * arithmetic for integers; n is the output's static length. */
__global__ static void range_kernel(const void *start, const void *delta, void *y, int dt, bool is_float,
                                    int64_t n)
{
    if (is_float) {
        double s = gp_dev_load_f64(start, dt, 0), d = gp_dev_load_f64(delta, dt, 0);
        GP_GRID_STRIDE(i, n)((float *)y)[i] = (float)__dadd_rn(s, __dmul_rn((double)i, d));
    } else {
        uint64_t s = (uint64_t)gp_dev_load_i64(start, dt, 0), d = (uint64_t)gp_dev_load_i64(delta, dt, 0);
        GP_GRID_STRIDE(i, n) gp_dev_store_i64(y, dt, i, (int64_t)(s + (uint64_t)i * d));
    }
}

static gp_status range_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    const struct gp_value *y = gp_cuda_out_value(c, 0);
    int64_t n = gp_shape_numel(&y->shape);
    if (n == 0) return GP_OK;
    range_kernel<<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, c->stream>>>(
        c->in[0], c->in[2], c->out[0], (int)y->dtype, gp_dtype_is_float(y->dtype), n);
    return gp_cuda_check_launch(c, "Range forward", err);
}

/* ---- the table ---- */

#define COPY(op) {op, NULL, NULL, copy_forward, copy_backward}
#define NO_GRAD(op, fwd) {op, NULL, NULL, fwd, NULL}

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_shape[] = {
    COPY("Reshape"), COPY("Flatten"), COPY("Squeeze"), COPY("Unsqueeze"),
    {"Transpose", NULL, NULL, transpose_forward, transpose_backward},
    {"Concat", NULL, NULL, concat_forward, concat_backward},
    {"Split", NULL, NULL, split_forward, split_backward},
    {"Slice", NULL, NULL, slice_forward, slice_backward},
    {"Tile", NULL, NULL, tile_forward, tile_backward},
    {"Trilu", NULL, NULL, trilu_forward, trilu_backward},
    NO_GRAD("Shape", shape_forward),
    NO_GRAD("Size", size_forward),
    NO_GRAD("ConstantOfShape", constant_of_shape_forward),
    NO_GRAD("Range", range_forward),
    {NULL, NULL, NULL, NULL, NULL},
};
