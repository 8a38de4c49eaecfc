/* CUDA kernels: the shape family, twin of backend/cpu/shape.c. Reshape,
 * Flatten, Squeeze, Unsqueeze, Transpose, Concat, Split, Slice, Gather,
 * Tile, Trilu, Pad, and the shape producers (Shape, Size, ConstantOfShape,
 * Range) that loading normally folds away.
 *
 * Forward moves elements by their size, so every dtype works (float
 * tensors are float32 on the device, as plan.c lays them out). Plans
 * (permutations, split sizes, slice starts and steps, pads) come from the
 * op layer's helpers, exactly as on the CPU, so both backends and shape
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
 * Gather's backward is deterministic without float atomics: the indices
 * are sorted stably by value (an LSD radix sort in 8-bit digits, positions
 * as payload), each value's run of positions is cut into pieces of
 * GATHER_PIECE; a run of one piece (nearly every row of an embedding) is
 * added into its table row in position order starting from the row's
 * value, exactly the CPU's sequence of float additions; a longer run sums
 * its pieces in double, then adds the pieces in order. Pad's backward has
 * each input element walk the output cells that read it (per axis a range,
 * a progression or at most three mirror images) in row-major order, again
 * the CPU's sequence of additions.
 *
 * Differences from the CPU kernels: the CPU fails on a Gather index out of
 * range; here indices are device data that the host cannot read without a
 * synchronize, so an out-of-range index gathers zeros and gets no gradient.
 * Trilu's k and Pad's constant value are read on the device. */
#include <string.h>

#include <cuda_runtime.h>

#include "backend/cuda/kernel.h"
#include "backend/cuda/kernel_util.cuh"

extern "C" {
#include "ops/fold_util.h"
}

/* ---- small helpers ---- */

static struct gp_infer_ctx infer_ctx(const struct gp_cuda_ctx *c, struct gp_error *err)
{
    struct gp_infer_ctx ic;
    ic.graph = (struct gp_graph *)c->graph;
    ic.node = (struct gp_node *)c->node;
    ic.err = err;
    return ic;
}

/* Bytes per element on the device: float dtypes are float32. */
static size_t esize_of(enum gp_dtype dt)
{
    return gp_dtype_is_float(dt) ? sizeof(float) : gp_dtype_size(dt);
}

static size_t in_esize(const struct gp_cuda_ctx *c, int i)
{
    return esize_of(gp_cuda_in_value(c, i)->dtype);
}

static const struct gp_shape *in_shape(const struct gp_cuda_ctx *c, int i)
{
    return &gp_cuda_in_value(c, i)->shape;
}

static const struct gp_shape *out_shape(const struct gp_cuda_ctx *c, int i)
{
    return &gp_cuda_out_value(c, i)->shape;
}

static gp_status check_es(const struct gp_cuda_ctx *c, size_t es, struct gp_error *err)
{
    if (es == 1 || es == 2 || es == 4 || es == 8) return GP_OK;
    return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "elements of %zu bytes", es);
}

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
    GP_TRY(check_es(c, es, err));
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
    size_t bytes = (size_t)gp_shape_numel(in_shape(c, 0)) * in_esize(c, 0);
    if (bytes == 0 || c->out[0] == c->in[0]) return GP_OK;
    return gp_cuda_call(c, cudaMemcpyAsync(c->out[0], c->in[0], bytes, cudaMemcpyDeviceToDevice, c->stream),
                     "cudaMemcpyAsync", err);
}

static gp_status copy_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->din[0] || !c->dout[0]) return GP_OK;
    return add_into(c, c->din[0], c->dout[0], gp_shape_numel(in_shape(c, 0)), "copy backward", err);
}

/* ---- Transpose ---- */

/* Output axis d walks input axis perm[d]: x_st[d] = input stride of perm[d]. */
static gp_status transpose_view(struct gp_cuda_ctx *c, struct gp_error *err, int64_t *x_st)
{
    struct gp_infer_ctx ic = infer_ctx(c, err);
    return gp_transpose_view(&ic, in_shape(c, 0), x_st);
}

static gp_status transpose_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    int64_t x_st[GP_MAX_RANK], y_st[GP_MAX_RANK];
    GP_TRY(transpose_view(c, err, x_st));
    const struct gp_shape *ys = out_shape(c, 0);
    contiguous(ys, y_st);
    return view_run(c, err, c->out[0], y_st, 0, c->in[0], x_st, 0, ys, in_esize(c, 0), false,
                    "Transpose forward");
}

static gp_status transpose_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->din[0] || !c->dout[0]) return GP_OK;
    int64_t x_st[GP_MAX_RANK], y_st[GP_MAX_RANK];
    GP_TRY(transpose_view(c, err, x_st));
    const struct gp_shape *ys = out_shape(c, 0);
    contiguous(ys, y_st);
    return view_run(c, err, c->din[0], x_st, 0, c->dout[0], y_st, 0, ys, sizeof(float), true,
                    "Transpose backward");
}

/* ---- Concat, Split ---- */

/* Input k is the view of Y starting at its offset along the axis. */
static gp_status concat_run(struct gp_cuda_ctx *c, struct gp_error *err, bool backward)
{
    struct gp_infer_ctx ic = infer_ctx(c, err);
    const struct gp_shape *ys = out_shape(c, 0);
    int axis;
    GP_TRY(gp_norm_axis(&ic, gp_node_attr_int(c->node, "axis", 0), ys->rank, &axis));
    int64_t y_st[GP_MAX_RANK], x_st[GP_MAX_RANK], at = 0;
    contiguous(ys, y_st);
    for (int k = 0; k < c->node->n_inputs; k++) {
        const struct gp_shape *xs = in_shape(c, k);
        contiguous(xs, x_st);
        if (!backward)
            GP_TRY(view_run(c, err, c->out[0], y_st, at * y_st[axis], c->in[k], x_st, 0, xs,
                            in_esize(c, k), false, "Concat forward"));
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
    struct gp_infer_ctx ic = infer_ctx(c, err);
    const struct gp_shape *xs = in_shape(c, 0);
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
                            in_esize(c, 0), false, "Split forward"));
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
    struct gp_infer_ctx ic = infer_ctx(c, err);
    return gp_slice_view(&ic, in_shape(c, 0), x_st, base);
}

static gp_status slice_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    int64_t x_st[GP_MAX_RANK], y_st[GP_MAX_RANK], base;
    GP_TRY(slice_view(c, err, x_st, &base));
    const struct gp_shape *ys = out_shape(c, 0);
    contiguous(ys, y_st);
    return view_run(c, err, c->out[0], y_st, 0, c->in[0], x_st, base, ys, in_esize(c, 0), false,
                    "Slice forward");
}

static gp_status slice_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->din[0] || !c->dout[0]) return GP_OK;
    int64_t x_st[GP_MAX_RANK], y_st[GP_MAX_RANK], base;
    GP_TRY(slice_view(c, err, x_st, &base));
    const struct gp_shape *ys = out_shape(c, 0);
    contiguous(ys, y_st);
    return view_run(c, err, c->din[0], x_st, base, c->dout[0], y_st, 0, ys, sizeof(float), true,
                    "Slice backward");
}

/* ---- Gather ---- */

/* data [pre, dim, post] (axis in the middle), indices [q] (any shape,
 * int64 or int32, negative counting from the end) -> [pre, q, post]. */
struct gather_plan {
    int axis;
    int64_t pre, dim, post, q;
    enum gp_dtype idx_type;
};

static gp_status gather_plan_of(const struct gp_graph *g, const struct gp_node *node,
                                struct gp_error *err, struct gather_plan *p)
{
    struct gp_infer_ctx ic;
    ic.graph = (struct gp_graph *)g;
    ic.node = (struct gp_node *)node;
    ic.err = err;
    const struct gp_shape *xs = &gp_node_input(g, node, 0)->shape;
    GP_TRY(gp_norm_axis(&ic, gp_node_attr_int(node, "axis", 0), xs->rank, &p->axis));
    p->pre = p->post = 1;
    for (int d = 0; d < p->axis; d++) p->pre *= xs->dims[d];
    for (int d = p->axis + 1; d < xs->rank; d++) p->post *= xs->dims[d];
    p->dim = xs->dims[p->axis];
    const struct gp_value *iv = gp_node_input(g, node, 1);
    p->q = gp_shape_numel(&iv->shape);
    p->idx_type = iv->dtype;
    if (p->idx_type != GP_DTYPE_INT64 && p->idx_type != GP_DTYPE_INT32)
        return gp_error_set(err, GP_ERR_UNSUPPORTED, "node '%s' (%s): %s indices", node->name,
                            node->op_type, gp_dtype_name(p->idx_type));
    return GP_OK;
}

template <typename I>
__device__ static inline int64_t gather_index(const I *idx, int64_t j, int64_t dim)
{
    int64_t k = (int64_t)idx[j];
    return k < 0 ? k + dim : k;
}

/* Y [pre, q, post units] = X [pre, k(j), post units]; zeros where an index
 * is out of range. */
template <typename T, typename I>
__global__ static void gather_kernel(const T *x, const I *idx, T *y, int64_t dim, int64_t q,
                                     int64_t post, int64_t n)
{
    GP_GRID_STRIDE(t, n)
    {
        int64_t col = t % post, rest = t / post, j = rest % q, r = rest / q;
        int64_t k = gather_index(idx, j, dim);
        T z{};
        y[t] = k >= 0 && k < dim ? x[(r * dim + k) * post + col] : z;
    }
}

template <typename T>
static void launch_gather(const struct gather_plan *p, int64_t post_units, const void *x,
                          const void *idx, void *y, cudaStream_t s)
{
    int64_t n = p->pre * p->q * post_units;
    if (p->idx_type == GP_DTYPE_INT64)
        gather_kernel<T, int64_t><<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, s>>>(
            (const T *)x, (const int64_t *)idx, (T *)y, p->dim, p->q, post_units, n);
    else
        gather_kernel<T, int32_t><<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, s>>>(
            (const T *)x, (const int32_t *)idx, (T *)y, p->dim, p->q, post_units, n);
}

static gp_status gather_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    struct gather_plan p;
    GP_TRY(gather_plan_of(c->graph, c->node, err, &p));
    size_t es = in_esize(c, 0);
    GP_TRY(check_es(c, es, err));
    if (p.pre * p.q * p.post == 0) return GP_OK;
    size_t row = (size_t)p.post * es;
    bool al16 = (uintptr_t)c->in[0] % 16 == 0 && (uintptr_t)c->out[0] % 16 == 0;
    bool al8 = (uintptr_t)c->in[0] % 8 == 0 && (uintptr_t)c->out[0] % 8 == 0;
    if (row % 16 == 0 && al16) launch_gather<uint4>(&p, (int64_t)(row / 16), c->in[0], c->in[1], c->out[0], c->stream);
    else if (row % 8 == 0 && al8) launch_gather<unsigned long long>(&p, (int64_t)(row / 8), c->in[0], c->in[1], c->out[0], c->stream);
    else if (row % 4 == 0) launch_gather<uint32_t>(&p, (int64_t)(row / 4), c->in[0], c->in[1], c->out[0], c->stream);
    else if (row % 2 == 0) launch_gather<uint16_t>(&p, (int64_t)(row / 2), c->in[0], c->in[1], c->out[0], c->stream);
    else launch_gather<uint8_t>(&p, (int64_t)row, c->in[0], c->in[1], c->out[0], c->stream);
    return gp_cuda_check_launch(c, "Gather forward", err);
}

/* Backward: dData[r, k(j), :] += dY[r, j, :], deterministic.
 *
 * 1. keys[j] = k(j) (out of range: dim, sorted last and skipped), vals[j] = j;
 *    sorted stably by key in 8-bit LSD radix passes (per pass: a histogram
 *    per tile of GATHER_TILE positions, one exclusive scan of the
 *    digit-major histograms, a stable scatter).
 * 2. seg_lo[v], seg_hi[v]: the run of key v in the sorted order.
 * 3. pieces: each run cut into ceil(len / GATHER_PIECE) pieces; exclusive
 *    scans give each key's first piece, its first partial (keys of more
 *    than one piece only) and its index among multi-piece keys.
 * 4. a warp per (r, piece), lanes over columns: a single-piece key adds
 *    its positions into dData in position order (the CPU's float
 *    additions); a piece of a longer run sums in double into its partial.
 * 5. a warp per (r, multi-piece key): dData += the partials, in order, in
 *    double.
 * Every step is a fixed function of the indices: the result is the same
 * from run to run. */
#define GATHER_PIECE 32
#define GATHER_ITEMS 2
#define GATHER_TILE (GP_CUDA_THREADS * GATHER_ITEMS)
#define SCAN_BLOCK 1024   /* threads of a scan block, elements per block */
#define SCAN_SMALL 16384  /* up to this many: a single-block scan */

struct gather_layout {
    int64_t q, dim, ntiles, npc_max, mk_max, mp_max;
    int passes;
    size_t keys[2], vals[2], hist, bsum, seg_lo, seg_hi, piece_start, mp_start, mk_start, piece_key,
        mkey, partial, total;
};

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

static void gather_layout_of(const struct gather_plan *p, struct gather_layout *l)
{
    memset(l, 0, sizeof *l);
    int64_t q = p->q, dim = p->dim;
    l->q = q;
    l->dim = dim;
    l->ntiles = (q + GATHER_TILE - 1) / GATHER_TILE;
    int bits = 0;
    while (bits < 62 && ((int64_t)1 << bits) <= dim) bits++; /* keys 0..dim (dim: out of range) */
    l->passes = (bits + 7) / 8;
    if (l->passes < 1) l->passes = 1;
    l->npc_max = (q < dim ? q : dim) + q / GATHER_PIECE + 1;
    l->mk_max = q / (GATHER_PIECE + 1) + 1;
    l->mp_max = 2 * (q / GATHER_PIECE) + 1;
    size_t at = 0, qi = (size_t)q * sizeof(int32_t), di = (size_t)(dim + 1) * sizeof(int32_t);
#define TAKE(field, bytes) (l->field = at, at = align256(at + (bytes)))
    TAKE(keys[0], qi);
    TAKE(keys[1], qi);
    TAKE(vals[0], qi);
    TAKE(vals[1], qi);
    TAKE(hist, (size_t)(256 * l->ntiles + 1) * sizeof(int32_t));
    int64_t most = 256 * l->ntiles > dim ? 256 * l->ntiles : dim;
    TAKE(bsum, (size_t)(3 * ((most + SCAN_BLOCK - 1) / SCAN_BLOCK + 1)) * sizeof(int32_t));
    TAKE(seg_lo, di);
    TAKE(seg_hi, di);
    TAKE(piece_start, di);
    TAKE(mp_start, di);
    TAKE(mk_start, di);
    TAKE(piece_key, (size_t)l->npc_max * sizeof(int32_t));
    TAKE(mkey, (size_t)l->mk_max * sizeof(int32_t));
    TAKE(partial, (size_t)(p->pre * l->mp_max * p->post) * sizeof(double));
#undef TAKE
    l->total = at;
}

static size_t gather_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    struct gather_plan p;
    struct gp_error err;
    memset(&err, 0, sizeof err);
    if (gather_plan_of(g, node, &err, &p) != GP_OK) return 0;
    struct gather_layout l;
    gather_layout_of(&p, &l);
    return l.total;
}

template <typename I>
__global__ static void gather_keys_kernel(const I *idx, int64_t q, int64_t dim, uint32_t *keys,
                                          int32_t *vals)
{
    GP_GRID_STRIDE(j, q)
    {
        int64_t k = gather_index(idx, j, dim);
        keys[j] = (uint32_t)(k >= 0 && k < dim ? k : dim);
        vals[j] = (int32_t)j;
    }
}

/* hist[digit * ntiles + tile]: how many keys of the tile have the digit. */
__global__ static void radix_hist_kernel(const uint32_t *keys, int64_t q, int shift, int64_t ntiles,
                                         int32_t *hist)
{
    __shared__ int32_t cnt[256];
    for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        cnt[threadIdx.x] = 0;
        __syncthreads();
        for (int it = 0; it < GATHER_ITEMS; it++) {
            int64_t i = tile * GATHER_TILE + (int64_t)it * GP_CUDA_THREADS + threadIdx.x;
            if (i < q) atomicAdd(&cnt[(keys[i] >> shift) & 255], 1); /* integer: exact */
        }
        __syncthreads();
        hist[(int64_t)threadIdx.x * ntiles + tile] = cnt[threadIdx.x];
        __syncthreads();
    }
}

/* Exclusive prefix sum of v over the block (blockDim.x a multiple of 32, at
 * most 1024); *total gets the block's sum. */
__device__ static int32_t block_exclusive_sum(int32_t v, int32_t *total)
{
    __shared__ int32_t warp_sums[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int32_t x = v;
    for (int o = 1; o < 32; o <<= 1) {
        int32_t y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[w] = x;
    __syncthreads();
    if (w == 0) {
        int32_t s = lane < nw ? warp_sums[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            int32_t y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        warp_sums[lane] = s;
    }
    __syncthreads();
    int32_t excl = x - v + (w > 0 ? warp_sums[w - 1] : 0);
    *total = warp_sums[nw - 1];
    __syncthreads();
    return excl;
}

/* Exclusive prefix sums of K int32 arrays a[k] [n + 1], in place, with
 * the totals in a[k][n]. Up to SCAN_SMALL elements: one block, each
 * thread a contiguous chunk. More: per block of SCAN_BLOCK elements its
 * sums (coalesced), one block scans those, each block rescans its own. */

template <int K> struct scan_arrays {
    int32_t *a[K];
};

template <int K>
__global__ static void scan_small_kernel(struct scan_arrays<K> s, int64_t n)
{
    int64_t chunk = (n + blockDim.x - 1) / blockDim.x, lo = threadIdx.x * chunk;
    int64_t hi = lo + chunk < n ? lo + chunk : n;
    for (int k = 0; k < K; k++) {
        int32_t *a = s.a[k], sum = 0, total;
        for (int64_t i = lo; i < hi; i++) sum += a[i];
        int32_t run = block_exclusive_sum(sum, &total);
        for (int64_t i = lo; i < hi; i++) {
            int32_t t = a[i];
            a[i] = run;
            run += t;
        }
        if (threadIdx.x == 0) a[n] = total;
    }
}

template <int K>
__global__ static void scan_up_kernel(struct scan_arrays<K> s, int64_t n, int64_t nb, int32_t *bsum)
{
    for (int64_t b = blockIdx.x; b < nb; b += gridDim.x) {
        int64_t i = b * SCAN_BLOCK + threadIdx.x;
        for (int k = 0; k < K; k++) {
            int32_t total;
            block_exclusive_sum(i < n ? s.a[k][i] : 0, &total);
            if (threadIdx.x == 0) bsum[k * nb + b] = total;
        }
    }
}

template <int K>
__global__ static void scan_mid_kernel(struct scan_arrays<K> s, int64_t n, int64_t nb, int32_t *bsum)
{
    int64_t chunk = (nb + blockDim.x - 1) / blockDim.x, lo = threadIdx.x * chunk;
    int64_t hi = lo + chunk < nb ? lo + chunk : nb;
    for (int k = 0; k < K; k++) {
        int32_t *a = bsum + k * nb, sum = 0, total;
        for (int64_t i = lo; i < hi; i++) sum += a[i];
        int32_t run = block_exclusive_sum(sum, &total);
        for (int64_t i = lo; i < hi; i++) {
            int32_t t = a[i];
            a[i] = run;
            run += t;
        }
        if (threadIdx.x == 0) s.a[k][n] = total;
    }
}

template <int K>
__global__ static void scan_down_kernel(struct scan_arrays<K> s, int64_t n, int64_t nb, const int32_t *bsum)
{
    for (int64_t b = blockIdx.x; b < nb; b += gridDim.x) {
        int64_t i = b * SCAN_BLOCK + threadIdx.x;
        for (int k = 0; k < K; k++) {
            int32_t total, v = i < n ? s.a[k][i] : 0;
            int32_t excl = block_exclusive_sum(v, &total);
            if (i < n) s.a[k][i] = excl + bsum[k * nb + b];
        }
    }
}

template <int K>
static gp_status scan_run(const struct gp_cuda_ctx *c, struct scan_arrays<K> a, int64_t n, int32_t *bsum,
                          const char *what, struct gp_error *err)
{
    if (n <= SCAN_SMALL) {
        scan_small_kernel<K><<<1, SCAN_BLOCK, 0, c->stream>>>(a, n);
        return gp_cuda_check_launch(c, what, err);
    }
    int64_t nb = (n + SCAN_BLOCK - 1) / SCAN_BLOCK;
    unsigned grid = (unsigned)(nb < 65535 ? nb : 65535);
    scan_up_kernel<K><<<grid, SCAN_BLOCK, 0, c->stream>>>(a, n, nb, bsum);
    GP_TRY(gp_cuda_check_launch(c, what, err));
    scan_mid_kernel<K><<<1, SCAN_BLOCK, 0, c->stream>>>(a, n, nb, bsum);
    GP_TRY(gp_cuda_check_launch(c, what, err));
    scan_down_kernel<K><<<grid, SCAN_BLOCK, 0, c->stream>>>(a, n, nb, bsum);
    return gp_cuda_check_launch(c, what, err);
}

/* Stable scatter of one pass: a tile's keys go, in position order, to
 * hist (scanned) [digit, tile] onwards. Each round of 256 keys ranks them
 * within their warp (__match_any_sync) and across warps (per-warp counts). */
__global__ static void radix_scatter_kernel(const uint32_t *keys_in, const int32_t *vals_in, int64_t q,
                                            int shift, int64_t ntiles, const int32_t *hist,
                                            uint32_t *keys_out, int32_t *vals_out)
{
    __shared__ int32_t base[256];
    __shared__ int32_t wcnt[GP_CUDA_THREADS / 32][256];
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        base[tid] = hist[(int64_t)tid * ntiles + tile];
        for (int it = 0; it < GATHER_ITEMS; it++) {
            for (int w = 0; w < GP_CUDA_THREADS / 32; w++) wcnt[w][tid] = 0;
            __syncthreads();
            int64_t i = tile * GATHER_TILE + (int64_t)it * GP_CUDA_THREADS + tid;
            bool valid = i < q;
            uint32_t key = valid ? keys_in[i] : 0;
            int32_t val = valid ? vals_in[i] : 0;
            int digit = valid ? (int)((key >> shift) & 255) : 256;
            unsigned peers = __match_any_sync(0xffffffffu, digit);
            int rank = __popc(peers & ((1u << lane) - 1));
            if (valid && lane == __ffs(peers) - 1) wcnt[warp][digit] = __popc(peers);
            __syncthreads();
            int32_t run = base[tid];
            for (int w = 0; w < GP_CUDA_THREADS / 32; w++) {
                int32_t t = wcnt[w][tid];
                wcnt[w][tid] = run;
                run += t;
            }
            base[tid] = run;
            __syncthreads();
            if (valid) {
                int32_t dst = wcnt[warp][digit] + rank;
                keys_out[dst] = key;
                vals_out[dst] = val;
            }
            __syncthreads();
        }
    }
}

/* The run [seg_lo[v], seg_hi[v]) of each key v < dim in the sorted keys. */
__global__ static void gather_bounds_kernel(const uint32_t *sk, int64_t q, int64_t dim, int32_t *seg_lo,
                                            int32_t *seg_hi)
{
    GP_GRID_STRIDE(i, q)
    {
        uint32_t v = sk[i];
        if ((int64_t)v >= dim) continue;
        if (i == 0 || sk[i - 1] != v) seg_lo[v] = (int32_t)i;
        if (i == q - 1 || sk[i + 1] != v) seg_hi[v] = (int32_t)(i + 1);
    }
}

__device__ static inline int32_t pieces_of(int32_t len)
{
    return (len + GATHER_PIECE - 1) / GATHER_PIECE;
}

/* Per key: its pieces, its partials (pieces of a key of more than one)
 * and whether it has several pieces; scanned next into first piece,
 * first partial and index among multi-piece keys. */
__global__ static void gather_piece_counts_kernel(const int32_t *seg_lo, const int32_t *seg_hi, int64_t dim,
                                                  int32_t *piece_start, int32_t *mp_start, int32_t *mk_start)
{
    GP_GRID_STRIDE(v, dim)
    {
        int32_t pc = pieces_of(seg_hi[v] - seg_lo[v]);
        piece_start[v] = pc;
        mp_start[v] = pc > 1 ? pc : 0;
        mk_start[v] = pc > 1;
    }
}

/* piece_key[piece] = its key; mkey[m] = the m-th multi-piece key. */
__global__ static void gather_piece_keys_kernel(const int32_t *seg_lo, const int32_t *seg_hi, int64_t dim,
                                                const int32_t *piece_start, const int32_t *mk_start,
                                                int32_t *piece_key, int32_t *mkey)
{
    GP_GRID_STRIDE(v, dim)
    {
        int32_t pc = pieces_of(seg_hi[v] - seg_lo[v]), ps = piece_start[v];
        for (int32_t k = 0; k < pc; k++) piece_key[ps + k] = (int32_t)v;
        if (pc > 1) mkey[mk_start[v]] = (int32_t)v;
    }
}

struct gather_bwd {
    const float *dy;
    float *dx;
    const int32_t *pos, *seg_lo, *seg_hi, *piece_start, *mp_start, *mk_start, *piece_key, *mkey;
    double *partial;
    int64_t pre, dim, q, post, mp_max;
};

/* A warp per (r, piece, 32 * GATHER_COLS columns): each lane takes
 * GATHER_COLS columns, so that that many loads are in flight. */
#define GATHER_COLS 4

__global__ static void gather_piece_kernel(struct gather_bwd b)
{
    int lane = threadIdx.x & 31;
    int64_t w0 = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    int64_t nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
    int64_t nch = (b.post + 32 * GATHER_COLS - 1) / (32 * GATHER_COLS);
    int64_t npc = b.piece_start[b.dim], rows = b.pre * npc * nch;
    for (int64_t w = w0; w < rows; w += nw) {
        int64_t chunk = w % nch, rest = w / nch, piece = rest % npc, r = rest / npc;
        int32_t v = b.piece_key[piece];
        int32_t ps = b.piece_start[v], pc = b.piece_start[v + 1] - ps, k = (int32_t)piece - ps;
        int64_t lo = (int64_t)b.seg_lo[v] + (int64_t)k * GATHER_PIECE;
        int64_t hi = lo + GATHER_PIECE < b.seg_hi[v] ? lo + GATHER_PIECE : b.seg_hi[v];
        const float *dy = b.dy + r * b.q * b.post;
        float *dx = b.dx + (r * b.dim + v) * b.post;
        double *part = b.partial + (r * b.mp_max + b.mp_start[v] + k) * b.post;
        int64_t c0 = chunk * 32 * GATHER_COLS + lane;
        {
            if (pc == 1) { /* the CPU's float additions, in position order */
                float acc[GATHER_COLS];
#pragma unroll
                for (int u = 0; u < GATHER_COLS; u++) {
                    int64_t col = c0 + 32 * u;
                    acc[u] = col < b.post ? dx[col] : 0.0f;
                }
#pragma unroll 4
                for (int64_t i = lo; i < hi; i++) {
                    const float *row = dy + (int64_t)b.pos[i] * b.post;
#pragma unroll
                    for (int u = 0; u < GATHER_COLS; u++) {
                        int64_t col = c0 + 32 * u;
                        if (col < b.post) acc[u] = __fadd_rn(acc[u], row[col]);
                    }
                }
#pragma unroll
                for (int u = 0; u < GATHER_COLS; u++) {
                    int64_t col = c0 + 32 * u;
                    if (col < b.post) dx[col] = acc[u];
                }
            } else {
                double acc[GATHER_COLS] = {0, 0, 0, 0};
#pragma unroll 4
                for (int64_t i = lo; i < hi; i++) {
                    const float *row = dy + (int64_t)b.pos[i] * b.post;
#pragma unroll
                    for (int u = 0; u < GATHER_COLS; u++) {
                        int64_t col = c0 + 32 * u;
                        if (col < b.post) acc[u] += (double)row[col];
                    }
                }
#pragma unroll
                for (int u = 0; u < GATHER_COLS; u++) {
                    int64_t col = c0 + 32 * u;
                    if (col < b.post) part[col] = acc[u];
                }
            }
        }
    }
}

/* A warp per (r, multi-piece key, 32 columns): dData += its partials, in
 * order. */
__global__ static void gather_reduce_kernel(struct gather_bwd b)
{
    int lane = threadIdx.x & 31;
    int64_t w0 = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    int64_t nw = ((int64_t)gridDim.x * blockDim.x) >> 5;
    int64_t nch = (b.post + 31) / 32;
    int64_t nmk = b.mk_start[b.dim], rows = b.pre * nmk * nch;
    for (int64_t w = w0; w < rows; w += nw) {
        int64_t chunk = w % nch, rest = w / nch, m = rest % nmk, r = rest / nmk;
        int32_t v = b.mkey[m];
        int32_t pc = b.piece_start[v + 1] - b.piece_start[v];
        const double *part = b.partial + (r * b.mp_max + b.mp_start[v]) * b.post;
        float *dx = b.dx + (r * b.dim + v) * b.post;
        int64_t col = chunk * 32 + lane;
        if (col < b.post) {
            double acc = (double)dx[col];
#pragma unroll 4
            for (int32_t k = 0; k < pc; k++) acc += part[(int64_t)k * b.post + col];
            dx[col] = (float)acc;
        }
    }
}

/* Blocks for one warp per row, rows at most `rows`. */
static unsigned warp_blocks(int64_t rows)
{
    int64_t b = (rows * 32 + GP_CUDA_THREADS - 1) / GP_CUDA_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 16384 ? 16384 : b);
}

static gp_status gather_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->din[0] || !c->dout[0]) return GP_OK;
    struct gather_plan p;
    GP_TRY(gather_plan_of(c->graph, c->node, err, &p));
    if (p.q == 0 || p.pre * p.post == 0) return GP_OK;
    if (p.q >= INT32_MAX || p.dim >= INT32_MAX)
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED,
                             "backward over %lld indices into an axis of %lld: at most 2^31 - 1 each",
                             (long long)p.q, (long long)p.dim);
    struct gather_layout l;
    gather_layout_of(&p, &l);
    char *s = (char *)c->scratch;
    uint32_t *keys[2] = {(uint32_t *)(s + l.keys[0]), (uint32_t *)(s + l.keys[1])};
    int32_t *vals[2] = {(int32_t *)(s + l.vals[0]), (int32_t *)(s + l.vals[1])};
    int32_t *hist = (int32_t *)(s + l.hist), *bsum = (int32_t *)(s + l.bsum);
    cudaStream_t st = c->stream;

    unsigned qb = gp_cuda_blocks_for(p.q);
    if (p.idx_type == GP_DTYPE_INT64)
        gather_keys_kernel<int64_t><<<qb, GP_CUDA_THREADS, 0, st>>>((const int64_t *)c->in[1], p.q, p.dim,
                                                                     keys[0], vals[0]);
    else
        gather_keys_kernel<int32_t><<<qb, GP_CUDA_THREADS, 0, st>>>((const int32_t *)c->in[1], p.q, p.dim,
                                                                     keys[0], vals[0]);
    GP_TRY(gp_cuda_check_launch(c, "Gather backward: keys", err));
    unsigned tb = (unsigned)(l.ntiles < 65535 ? l.ntiles : 65535);
    int cur = 0;
    for (int pass = 0; pass < l.passes; pass++, cur ^= 1) {
        radix_hist_kernel<<<tb, GP_CUDA_THREADS, 0, st>>>(keys[cur], p.q, 8 * pass, l.ntiles, hist);
        GP_TRY(gp_cuda_check_launch(c, "Gather backward: radix histogram", err));
        struct scan_arrays<1> ha;
        ha.a[0] = hist;
        GP_TRY(scan_run(c, ha, 256 * l.ntiles, bsum, "Gather backward: radix scan", err));
        radix_scatter_kernel<<<tb, GP_CUDA_THREADS, 0, st>>>(keys[cur], vals[cur], p.q, 8 * pass,
                                                             l.ntiles, hist, keys[cur ^ 1], vals[cur ^ 1]);
        GP_TRY(gp_cuda_check_launch(c, "Gather backward: radix scatter", err));
    }

    struct gather_bwd b;
    b.dy = c->dout[0];
    b.dx = c->din[0];
    b.pos = vals[cur];
    b.seg_lo = (int32_t *)(s + l.seg_lo);
    b.seg_hi = (int32_t *)(s + l.seg_hi);
    b.piece_start = (int32_t *)(s + l.piece_start);
    b.mp_start = (int32_t *)(s + l.mp_start);
    b.mk_start = (int32_t *)(s + l.mk_start);
    b.piece_key = (int32_t *)(s + l.piece_key);
    b.mkey = (int32_t *)(s + l.mkey);
    b.partial = (double *)(s + l.partial);
    b.pre = p.pre;
    b.dim = p.dim;
    b.q = p.q;
    b.post = p.post;
    b.mp_max = l.mp_max;

    size_t di = (size_t)p.dim * sizeof(int32_t);
    GP_TRY(gp_cuda_call(c, cudaMemsetAsync((void *)b.seg_lo, 0, di, st), "Gather backward: cudaMemsetAsync", err));
    GP_TRY(gp_cuda_call(c, cudaMemsetAsync((void *)b.seg_hi, 0, di, st), "Gather backward: cudaMemsetAsync", err));
    gather_bounds_kernel<<<qb, GP_CUDA_THREADS, 0, st>>>(keys[cur], p.q, p.dim, (int32_t *)b.seg_lo,
                                                         (int32_t *)b.seg_hi);
    GP_TRY(gp_cuda_check_launch(c, "Gather backward: runs", err));
    gather_piece_counts_kernel<<<gp_cuda_blocks_for(p.dim), GP_CUDA_THREADS, 0, st>>>(
        b.seg_lo, b.seg_hi, p.dim, (int32_t *)b.piece_start, (int32_t *)b.mp_start, (int32_t *)b.mk_start);
    GP_TRY(gp_cuda_check_launch(c, "Gather backward: piece counts", err));
    struct scan_arrays<3> pa;
    pa.a[0] = (int32_t *)b.piece_start;
    pa.a[1] = (int32_t *)b.mp_start;
    pa.a[2] = (int32_t *)b.mk_start;
    GP_TRY(scan_run(c, pa, p.dim, bsum, "Gather backward: piece scan", err));
    gather_piece_keys_kernel<<<gp_cuda_blocks_for(p.dim), GP_CUDA_THREADS, 0, st>>>(
        b.seg_lo, b.seg_hi, p.dim, b.piece_start, b.mk_start, (int32_t *)b.piece_key, (int32_t *)b.mkey);
    GP_TRY(gp_cuda_check_launch(c, "Gather backward: piece keys", err));
    int64_t wide = (p.post + 32 * GATHER_COLS - 1) / (32 * GATHER_COLS), narrow = (p.post + 31) / 32;
    gather_piece_kernel<<<warp_blocks(p.pre * l.npc_max * wide), GP_CUDA_THREADS, 0, st>>>(b);
    GP_TRY(gp_cuda_check_launch(c, "Gather backward: pieces", err));
    gather_reduce_kernel<<<warp_blocks(p.pre * l.mk_max * narrow), GP_CUDA_THREADS, 0, st>>>(b);
    return gp_cuda_check_launch(c, "Gather backward: long runs", err);
}

/* ---- Tile ---- */

struct tile_plan {
    int rank;
    int64_t xd[GP_MAX_RANK], yd[GP_MAX_RANK], x_st[GP_MAX_RANK], y_st[GP_MAX_RANK], rep[GP_MAX_RANK];
    int64_t copies;
};

static void tile_plan_of(const struct gp_cuda_ctx *c, struct tile_plan *p)
{
    const struct gp_shape *xs = in_shape(c, 0), *ys = out_shape(c, 0);
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
    int64_t n = gp_shape_numel(out_shape(c, 0));
    size_t es = in_esize(c, 0);
    GP_TRY(check_es(c, es, err));
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
    int64_t n = gp_shape_numel(in_shape(c, 0));
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
    const struct gp_shape *xs = in_shape(c, 0);
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
    size_t es = in_esize(c, 0);
    GP_TRY(check_es(c, es, err));
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

/* ---- Pad ---- */

/* Per axis d, output position o reads input position o - begin[d],
 * brought back inside by the mode (edge: clamp; reflect: mirror without
 * repeating the border; wrap: modulo), or the constant: the CPU's maps,
 * computed on the fly. */
enum pad_mode { PAD_CONSTANT, PAD_REFLECT, PAD_EDGE, PAD_WRAP };

struct pad_plan {
    int rank, mode;
    int64_t xd[GP_MAX_RANK], yd[GP_MAX_RANK], begin[GP_MAX_RANK], x_st[GP_MAX_RANK], y_st[GP_MAX_RANK];
};

/* Constant fill: *fillp when given (device memory), else the bits of fillv. */
struct pad_fill {
    const void *fillp;
    unsigned long long fillv;
};

static gp_status pad_plan_of(struct gp_cuda_ctx *c, struct gp_error *err, struct pad_plan *p,
                             struct pad_fill *f)
{
    struct gp_infer_ctx ic = infer_ctx(c, err);
    const struct gp_shape *xs = in_shape(c, 0), *ys = out_shape(c, 0);
    int version = c->node->def->since_version, r = xs->rank;
    const char *mode = gp_node_attr_string(c->node, "mode", "constant");
    memset(p, 0, sizeof *p);
    memset(f, 0, sizeof *f);
    p->rank = r;
    p->mode = !strcmp(mode, "reflect") ? PAD_REFLECT : !strcmp(mode, "edge") ? PAD_EDGE
              : !strcmp(mode, "wrap") ? PAD_WRAP : PAD_CONSTANT;
    int64_t pads[2 * GP_MAX_RANK];
    int n_pads = 0, axes[GP_MAX_RANK], n_axes = r;
    for (int d = 0; d < r; d++) axes[d] = d;
    enum gp_dtype dt = gp_cuda_in_value(c, 0)->dtype;
    if (version < 11) {
        const int64_t *v;
        n_pads = (int)gp_node_attr_ints(c->node, "pads", &v);
        for (int k = 0; k < n_pads && k < 2 * GP_MAX_RANK; k++) pads[k] = v[k];
        float value = gp_node_attr_float(c->node, "value", 0.0f);
        uint32_t bits;
        memcpy(&bits, &value, sizeof bits);
        if (gp_dtype_is_float(dt)) f->fillv = bits;
    } else {
        GP_TRY(gp_const_ints(&ic, 1, "pads", pads, 2 * GP_MAX_RANK, &n_pads));
        bool has_value = c->node->n_inputs > 2 && c->in[2];
        if (gp_dtype_is_float(dt)) {
            if (has_value && gp_dtype_is_float(gp_cuda_in_value(c, 2)->dtype)) f->fillp = c->in[2];
        } else if (has_value) {
            f->fillp = c->in[2];
        }
        if (version >= 18 && c->node->n_inputs > 3 && c->in[3]) {
            int64_t ax[GP_MAX_RANK];
            GP_TRY(gp_const_ints(&ic, 3, "axes", ax, GP_MAX_RANK, &n_axes));
            for (int k = 0; k < n_axes; k++) GP_TRY(gp_norm_axis(&ic, ax[k], r, &axes[k]));
        }
    }
    if (n_pads < n_axes)
        return gp_cuda_error(c, err, GP_ERR_INVALID, "%d pads for %d axes", n_pads, n_axes);
    for (int k = 0; k < n_axes; k++) p->begin[axes[k]] = pads[k];
    contiguous(xs, p->x_st);
    contiguous(ys, p->y_st);
    for (int d = 0; d < r; d++) {
        p->xd[d] = xs->dims[d];
        p->yd[d] = ys->dims[d];
    }
    return GP_OK;
}

template <typename T>
__global__ static void pad_forward_kernel(struct pad_plan p, struct pad_fill f, const T *x, T *y, int64_t n)
{
    T fill;
    if (f.fillp) fill = *(const T *)f.fillp;
    else memcpy(&fill, &f.fillv, sizeof fill); /* the low bytes: little-endian */
    GP_GRID_STRIDE(o, n)
    {
        int64_t rem = o, src = 0;
        bool inside = true;
        for (int d = p.rank - 1; d >= 0; d--) {
            int64_t od = rem % p.yd[d], in = p.xd[d];
            rem /= p.yd[d];
            int64_t i = od - p.begin[d];
            if (i < 0 || i >= in) {
                switch (p.mode) {
                case PAD_CONSTANT: inside = false; break;
                case PAD_EDGE: i = i < 0 ? 0 : in - 1; break;
                case PAD_REFLECT: i = i < 0 ? -i : 2 * (in - 1) - i; break;
                default: i = ((i % in) + in) % in; break;
                }
            }
            src += i * p.x_st[d];
        }
        y[o] = inside ? x[src] : fill;
    }
}

/* The output positions along one axis that read input position i, in
 * increasing order: n of them, at first + k * step, or pts[k] (reflect). */
struct preimage {
    int64_t n, first, step, pts[3];
    bool list;
};

__device__ static inline void pad_preimage(int mode, int64_t i, int64_t b, int64_t in, int64_t out,
                                           struct preimage *pi)
{
    pi->list = false;
    pi->step = 1;
    switch (mode) {
    case PAD_CONSTANT:
        pi->first = i + b;
        pi->n = pi->first >= 0 && pi->first < out;
        break;
    case PAD_EDGE: {
        int64_t lo = i == 0 ? 0 : i + b, hi = i == in - 1 ? out - 1 : i + b;
        if (lo < 0) lo = 0;
        if (hi > out - 1) hi = out - 1;
        pi->first = lo;
        pi->n = hi >= lo ? hi - lo + 1 : 0;
        break;
    }
    case PAD_WRAP: {
        int64_t o0 = ((i + b) % in + in) % in;
        pi->first = o0;
        pi->step = in;
        pi->n = o0 < out ? (out - 1 - o0) / in + 1 : 0;
        break;
    }
    default: { /* reflect: b - i (left mirror), b + i, b + 2 (in - 1) - i (right mirror) */
        pi->list = true;
        pi->n = 0;
        int64_t c0 = b - i, c1 = b + i, c2 = b + 2 * (in - 1) - i;
        if (i > 0 && c0 >= 0 && c0 < out) pi->pts[pi->n++] = c0;
        if (c1 >= 0 && c1 < out) pi->pts[pi->n++] = c1;
        if (2 * (in - 1) - i >= in && c2 >= 0 && c2 < out) pi->pts[pi->n++] = c2;
        break;
    }
    }
}

/* dX[e] += dY[o] over every o that reads e, in increasing o: the CPU adds
 * them into dX in that order. */
__global__ static void pad_backward_kernel(struct pad_plan p, const float *dy, float *dx, int64_t n)
{
    GP_GRID_STRIDE(e, n)
    {
        struct preimage pi[GP_MAX_RANK];
        int64_t rem = e, k[GP_MAX_RANK];
        bool any = true;
        for (int d = p.rank - 1; d >= 0; d--) {
            int64_t i = rem % p.xd[d];
            rem /= p.xd[d];
            pad_preimage(p.mode, i, p.begin[d], p.xd[d], p.yd[d], &pi[d]);
            if (pi[d].n == 0) any = false;
            k[d] = 0;
        }
        if (!any) continue;
        float acc = dx[e];
        for (;;) {
            int64_t o = 0;
            for (int d = 0; d < p.rank; d++)
                o += (pi[d].list ? pi[d].pts[k[d]] : pi[d].first + k[d] * pi[d].step) * p.y_st[d];
            acc = __fadd_rn(acc, dy[o]);
            int d = p.rank - 1;
            for (; d >= 0 && ++k[d] == pi[d].n; d--) k[d] = 0;
            if (d < 0) break;
        }
        dx[e] = acc;
    }
}

static gp_status pad_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    struct pad_plan p;
    struct pad_fill f;
    GP_TRY(pad_plan_of(c, err, &p, &f));
    int64_t n = gp_shape_numel(out_shape(c, 0));
    size_t es = in_esize(c, 0);
    GP_TRY(check_es(c, es, err));
    if (n == 0) return GP_OK;
    if (gp_shape_numel(in_shape(c, 0)) == 0 && p.mode != PAD_CONSTANT)
        return gp_cuda_error(c, err, GP_ERR_INVALID, "%s padding of an empty tensor",
                             gp_node_attr_string(c->node, "mode", "constant"));
    unsigned b = gp_cuda_blocks_for(n);
    cudaStream_t s = c->stream;
    switch (es) {
    case 1: pad_forward_kernel<uint8_t><<<b, GP_CUDA_THREADS, 0, s>>>(p, f, (const uint8_t *)c->in[0], (uint8_t *)c->out[0], n); break;
    case 2: pad_forward_kernel<uint16_t><<<b, GP_CUDA_THREADS, 0, s>>>(p, f, (const uint16_t *)c->in[0], (uint16_t *)c->out[0], n); break;
    case 4: pad_forward_kernel<uint32_t><<<b, GP_CUDA_THREADS, 0, s>>>(p, f, (const uint32_t *)c->in[0], (uint32_t *)c->out[0], n); break;
    default: pad_forward_kernel<unsigned long long><<<b, GP_CUDA_THREADS, 0, s>>>(p, f, (const unsigned long long *)c->in[0], (unsigned long long *)c->out[0], n); break;
    }
    return gp_cuda_check_launch(c, "Pad forward", err);
}

static gp_status pad_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->din[0] || !c->dout[0]) return GP_OK;
    struct pad_plan p;
    struct pad_fill f;
    GP_TRY(pad_plan_of(c, err, &p, &f));
    int64_t n = gp_shape_numel(in_shape(c, 0));
    if (n == 0 || gp_shape_numel(out_shape(c, 0)) == 0) return GP_OK;
    pad_backward_kernel<<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, c->stream>>>(p, c->dout[0], c->din[0], n);
    return gp_cuda_check_launch(c, "Pad backward", err);
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
    const struct gp_shape *xs = in_shape(c, 0);
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
    v.v[0] = gp_shape_numel(in_shape(c, 0));
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
    size_t es = esize_of(y->dtype);
    GP_TRY(check_es(c, es, err));
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
    {"Gather", NULL, gather_scratch, gather_forward, gather_backward},
    {"Tile", NULL, NULL, tile_forward, tile_backward},
    {"Trilu", NULL, NULL, trilu_forward, trilu_backward},
    {"Pad", NULL, NULL, pad_forward, pad_backward},
    NO_GRAD("Shape", shape_forward),
    NO_GRAD("Size", size_forward),
    NO_GRAD("ConstantOfShape", constant_of_shape_forward),
    NO_GRAD("Range", range_forward),
    {NULL, NULL, NULL, NULL, NULL},
};
