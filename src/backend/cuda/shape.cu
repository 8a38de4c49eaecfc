/* CUDA kernels: the shape family, twin of backend/cpu/shape.c. Reshape,
 * Flatten, Squeeze, Unsqueeze, Transpose, Concat, Split, Slice, Tile,
 * Trilu, and the shape producers (Shape, Size, ConstantOfShape, Range) that
 * loading normally folds away. Gather is in gather.cu, Pad in pad.cu.
 *
 * Forward moves elements by their size, so every dtype works. Float
 * tensors are float32 on the device, or bfloat16 where ctx->*_dt says so
 * (every kernel here takes any mix, gp_cuda_kernel.bf16_any): a move
 * between two tensors of one storage type copies their bits, one between
 * float32 and bfloat16 converts (rounding to nearest even into bfloat16),
 * and a gradient is added in float32 and rounded once per element, which
 * is what the executor's float32 copies did. Plans (permutations, split
 * sizes, slice starts and steps) come from the op layer's helpers, exactly
 * as on the CPU, so both backends and shape inference agree by
 * construction.
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
 * A converting or adding move in bfloat16 takes the same paths, in
 * groups of up to 16 bytes per side on contiguous rows (view_run_f).
 *
 * Differences from the CPU kernels: Trilu's k is read on the device. */
#include <string.h>

#include <type_traits>

#include <cuda_runtime.h>

#include "backend/cuda/bf16.cuh"
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

/* ---- storage types ---- */

/* How a tensor of the call is stored: a float tensor as float32 or
 * bfloat16 (ctx->*_dt), any other as its own dtype; es bytes an element. */
struct sto {
    bool bf16;
    size_t es;
};

static struct sto sto_of(enum gp_dtype dtype, const enum gp_dtype *dt, int k)
{
    struct sto s;
    s.bf16 = gp_dtype_is_float(dtype) && gp_cuda_is_bf16(dt, k);
    s.es = s.bf16 ? sizeof(__nv_bfloat16) : gp_cuda_esize(dtype);
    return s;
}

static struct sto in_sto(const struct gp_cuda_ctx *c, int k)
{
    return sto_of(gp_cuda_in_value(c, k)->dtype, c->in_dt, k);
}

static struct sto out_sto(const struct gp_cuda_ctx *c, int k)
{
    return sto_of(gp_cuda_out_value(c, k)->dtype, c->out_dt, k);
}

/* Gradients belong to float tensors. */
static struct sto grad_sto(bool bf16)
{
    struct sto s = {bf16, bf16 ? sizeof(__nv_bfloat16) : sizeof(float)};
    return s;
}

static struct sto din_sto(const struct gp_cuda_ctx *c, int k) { return grad_sto(gp_cuda_is_bf16(c->din_dt, k)); }
static struct sto dout_sto(const struct gp_cuda_ctx *c, int k) { return grad_sto(gp_cuda_is_bf16(c->dout_dt, k)); }

/* Whether a move between the two copies bits. */
static bool same_sto(struct sto a, struct sto b) { return a.bf16 == b.bf16 && a.es == b.es; }

/* N elements of T, moved as one load or store (at most 16 bytes). */
template <typename T, int N> struct __align__(sizeof(T) * N) grp {
    T v[N];
};

/* *o = v, or *o += v (ADD). Where the types match, a move copies the bits
 * and a float32 add is vadd; otherwise the value goes through float32
 * (exact from bfloat16) and is rounded once into a bfloat16 *o. */
template <bool ADD, typename TD, typename TS>
__device__ static inline void put(TD *o, TS v)
{
    if constexpr (!ADD && std::is_same<TD, TS>::value) {
        *o = v;
    } else if constexpr (ADD && std::is_same<TD, TS>::value && !std::is_same<TD, __nv_bfloat16>::value) {
        *o = vadd(*o, v);
    } else {
        float x = gp_load(&v);
        if constexpr (ADD) x = __fadd_rn(gp_load(o), x);
        gp_store(o, x);
    }
}

/* The same per element of a group: one load of each side, one store. */
template <bool ADD, typename TD, typename TS, int N>
__device__ static inline void put(grp<TD, N> *o, grp<TS, N> v)
{
    grp<TD, N> r;
    if constexpr (ADD) r = *o;
#pragma unroll
    for (int k = 0; k < N; k++) put<ADD>(&r.v[k], v.v[k]);
    *o = r;
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

/* Element i of the index space: dst[od] = src[os] (or += for ADD; put).
 * IT is the index type: 32-bit division where the space fits. */
template <typename TD, typename TS, typename IT, bool ADD>
__global__ static void view_kernel(struct view v, TD *dst, const TS *src)
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
        put<ADD>(&dst[od], src[os]);
    }
}

/* The tile transpose: axis `as` has source stride 1, axis `ad` destination
 * stride 1. A block of 32 x 8 threads moves a 32 x 32 tile: it reads
 * along `as` (coalesced), writes along `ad` (coalesced). Blocks loop over
 * tiles x the other axes (the batch). */
#define TILE 32
#define TILE_ROWS 8

template <typename TD, typename TS, bool ADD>
__global__ static void view_tile_kernel(struct view v, int as, int ad, int64_t tiles_s,
                                        int64_t tiles_d, int64_t n_blocks, TD *dst, const TS *src)
{
    __shared__ TS tile[TILE][TILE + 1];
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
            if (yd < nd && ys < ns) put<ADD>(dst + od + yd + ys * v.dst_st[as], tile[threadIdx.x][k]);
        }
        __syncthreads();
    }
}

template <typename TD, typename TS, bool ADD>
static void launch_view(const struct view *v, void *dst, const void *src, cudaStream_t s)
{
    unsigned blocks = gp_cuda_blocks_for(v->n);
    if (v->n <= INT32_MAX)
        view_kernel<TD, TS, uint32_t, ADD><<<blocks, GP_CUDA_THREADS, 0, s>>>(*v, (TD *)dst, (const TS *)src);
    else
        view_kernel<TD, TS, int64_t, ADD><<<blocks, GP_CUDA_THREADS, 0, s>>>(*v, (TD *)dst, (const TS *)src);
}

template <typename TD, typename TS, bool ADD>
static void launch_tile(const struct view *v, int as, int ad, void *dst, const void *src, cudaStream_t s)
{
    int64_t ts = (v->dims[as] + TILE - 1) / TILE, td = (v->dims[ad] + TILE - 1) / TILE;
    int64_t nb = ts * td * (v->n / (v->dims[as] * v->dims[ad]));
    unsigned grid = (unsigned)(nb < 65536 ? nb : 65536);
    view_tile_kernel<TD, TS, ADD><<<grid, dim3(TILE, TILE_ROWS), 0, s>>>(*v, as, ad, ts, td, nb, (TD *)dst,
                                                                         (const TS *)src);
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

/* view_units for two element types: groups of n elements, when every
 * offset stays a whole number of groups and each pointer is aligned to
 * its side's group. */
static bool view_groups(struct view *v, int64_t n, const void *dst, size_t dst_es, const void *src,
                        size_t src_es)
{
    int last = v->rank - 1;
    if ((uintptr_t)dst % ((size_t)n * dst_es) || (uintptr_t)src % ((size_t)n * src_es)) return false;
    if (v->dims[last] % n || v->dst_base % n || v->src_base % n) return false;
    for (int d = 0; d < last; d++)
        if (v->dst_st[d] % n || v->src_st[d] % n) return false;
    if (n == 1) return true;
    v->dims[last] /= n;
    v->dst_base /= n;
    v->src_base /= n;
    for (int d = 0; d < last; d++) {
        v->dst_st[d] /= n;
        v->src_st[d] /= n;
    }
    v->n /= n;
    return true;
}

/* The axes of stride 1 on the source and on the destination side, and
 * whether the tile transpose suits them. */
static bool view_tiled(const struct view *v, int *as, int *ad)
{
    *as = *ad = -1;
    for (int d = 0; d < v->rank; d++) {
        if (v->src_st[d] == 1 && *as < 0) *as = d;
        if (v->dst_st[d] == 1 && *ad < 0) *ad = d;
    }
    return *as >= 0 && *ad >= 0 && *as != *ad && v->dims[*as] >= 16 && v->dims[*ad] >= 16;
}

/* Contiguous rows in groups of N (when the view allows them). */
template <typename TD, typename TS, bool ADD, int N>
static bool launch_groups(const struct view *v, void *dst, const void *src, cudaStream_t s)
{
    struct view w = *v;
    if (!view_groups(&w, N, dst, sizeof(TD), src, sizeof(TS))) return false;
    if constexpr (N == 1) launch_view<TD, TS, ADD>(&w, dst, src, s);
    else launch_view<grp<TD, N>, grp<TS, N>, ADD>(&w, dst, src, s);
    return true;
}

/* A view between float tensors of storage types TD and TS (float or
 * __nv_bfloat16): the paths of view_run, rows in groups of up to 16 bytes
 * on the wider side. */
template <typename TD, typename TS, bool ADD>
static void launch_view_f(const struct view *v, void *dst, const void *src, cudaStream_t s)
{
    int last = v->rank - 1, as, ad;
    if (v->dst_st[last] == 1 && v->src_st[last] == 1) {
        constexpr int N = 16 / (int)(sizeof(TD) > sizeof(TS) ? sizeof(TD) : sizeof(TS));
        if (launch_groups<TD, TS, ADD, N>(v, dst, src, s)) return;
        if (launch_groups<TD, TS, ADD, N / 2>(v, dst, src, s)) return;
        if (launch_groups<TD, TS, ADD, (N / 4 > 1 ? N / 4 : 1)>(v, dst, src, s)) return;
        launch_groups<TD, TS, ADD, 1>(v, dst, src, s); /* always fits */
        return;
    }
    if (view_tiled(v, &as, &ad)) launch_tile<TD, TS, ADD>(v, as, ad, dst, src, s);
    else launch_view<TD, TS, ADD>(v, dst, src, s);
}

/* The moves of float tensors that are not bit copies or float32 adds: a
 * conversion between float32 and bfloat16, or an add with bfloat16 on
 * either side (one rounding per stored element). */
static gp_status view_run_f(const struct gp_cuda_ctx *c, struct gp_error *err, const struct view *v, void *dst,
                            bool dst_bf16, const void *src, bool src_bf16, bool add, const char *what)
{
    typedef __nv_bfloat16 bf16;
    cudaStream_t s = c->stream;
    if (add && dst_bf16 && src_bf16) launch_view_f<bf16, bf16, true>(v, dst, src, s);
    else if (add && dst_bf16) launch_view_f<bf16, float, true>(v, dst, src, s);
    else if (add && src_bf16) launch_view_f<float, bf16, true>(v, dst, src, s);
    else if (!add && dst_bf16 && !src_bf16) launch_view_f<bf16, float, false>(v, dst, src, s);
    else if (!add && !dst_bf16 && src_bf16) launch_view_f<float, bf16, false>(v, dst, src, s);
    else return gp_cuda_error(c, err, GP_ERR_INVALID, "%s: no conversion to make", what); /* not reached */
    return gp_cuda_check_launch(c, what, err);
}

/* Moves the elements of index space `shape` from src to dst, element idx
 * at base + sum(idx[d] * st[d]) on either side, each side stored as `ds`
 * and `ss` say; with `add`, dst (float) += src (float). The twin of the
 * CPU's copy_view. */
static gp_status view_run(const struct gp_cuda_ctx *c, struct gp_error *err, void *dst, struct sto ds,
                          const int64_t *dst_st, int64_t dst_base, const void *src, struct sto ss,
                          const int64_t *src_st, int64_t src_base, const struct gp_shape *shape, bool add,
                          const char *what)
{
    struct view v;
    view_init(&v, shape, dst_st, dst_base, src_st, src_base);
    if (v.n == 0) return GP_OK;
    bool same = same_sto(ds, ss);
    if ((ds.bf16 || ss.bf16) && (add || !same))
        return view_run_f(c, err, &v, dst, ds.bf16, src, ss.bf16, add, what);
    if (!same)
        return gp_cuda_error(c, err, GP_ERR_INVALID, "%s: elements of %zu bytes into elements of %zu", what,
                             ss.es, ds.es);
    size_t es = ds.es; /* from here on: bits moved, or float32 added */
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
                if (u == 16) launch_view<float4, float4, true>(&w, dst, src, s);
                else if (u == 8) launch_view<float2, float2, true>(&w, dst, src, s);
                else launch_view<float, float, true>(&w, dst, src, s);
            } else {
                switch (u) {
                case 16: launch_view<uint4, uint4, false>(&w, dst, src, s); break;
                case 8: launch_view<unsigned long long, unsigned long long, false>(&w, dst, src, s); break;
                case 4: launch_view<uint32_t, uint32_t, false>(&w, dst, src, s); break;
                case 2: launch_view<uint16_t, uint16_t, false>(&w, dst, src, s); break;
                default: launch_view<uint8_t, uint8_t, false>(&w, dst, src, s); break;
                }
            }
            return gp_cuda_check_launch(c, what, err);
        }
        /* not reached: u == es always fits */
    }
    int as, ad;
    bool tiled = view_tiled(&v, &as, &ad);
    switch (es) {
    case 1:
        if (tiled) launch_tile<uint8_t, uint8_t, false>(&v, as, ad, dst, src, s);
        else launch_view<uint8_t, uint8_t, false>(&v, dst, src, s);
        break;
    case 2:
        if (tiled) launch_tile<uint16_t, uint16_t, false>(&v, as, ad, dst, src, s);
        else launch_view<uint16_t, uint16_t, false>(&v, dst, src, s);
        break;
    case 4:
        if (add) {
            if (tiled) launch_tile<float, float, true>(&v, as, ad, dst, src, s);
            else launch_view<float, float, true>(&v, dst, src, s);
        } else {
            if (tiled) launch_tile<uint32_t, uint32_t, false>(&v, as, ad, dst, src, s);
            else launch_view<uint32_t, uint32_t, false>(&v, dst, src, s);
        }
        break;
    default:
        if (tiled) launch_tile<unsigned long long, unsigned long long, false>(&v, as, ad, dst, src, s);
        else launch_view<unsigned long long, unsigned long long, false>(&v, dst, src, s);
        break;
    }
    return gp_cuda_check_launch(c, what, err);
}

static void contiguous(const struct gp_shape *s, int64_t *st) { gp_shape_strides(s, st); }

/* ---- Reshape, Flatten, Squeeze, Unsqueeze ---- */

/* dst [n] = src [n] (or += with add) through view_run: the first
 * multiple of 8 elements in groups, the rest after them (a view's rows
 * take groups only where their whole length does). */
static gp_status flat_run(const struct gp_cuda_ctx *c, struct gp_error *err, void *dst, struct sto ds,
                          const void *src, struct sto ss, int64_t n, bool add, const char *what)
{
    int64_t head = n - n % 8, st[1] = {1};
    struct gp_shape fs;
    memset(&fs, 0, sizeof fs);
    fs.rank = 1;
    fs.dims[0] = head;
    if (head > 0) GP_TRY(view_run(c, err, dst, ds, st, 0, src, ss, st, 0, &fs, add, what));
    fs.dims[0] = n - head;
    if (n > head) GP_TRY(view_run(c, err, dst, ds, st, head, src, ss, st, head, &fs, add, what));
    return GP_OK;
}

/* X -> Y with the same elements in the same order: a device-to-device copy
 * on the stream (none when the executor aliased the buffers), or a
 * conversion where one is float32 and the other bfloat16. */
static gp_status copy_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    int64_t n = gp_shape_numel(gp_cuda_in_shape(c, 0));
    struct sto xs = in_sto(c, 0), ys = out_sto(c, 0);
    if (!same_sto(xs, ys)) {
        if (c->out[0] == c->in[0])
            return gp_cuda_error(c, err, GP_ERR_INVALID, "input and output share memory but not a storage type");
        return flat_run(c, err, c->out[0], ys, c->in[0], xs, n, false, "copy forward");
    }
    size_t bytes = (size_t)n * xs.es;
    if (bytes == 0 || c->out[0] == c->in[0]) return GP_OK;
    return gp_cuda_call(c, cudaMemcpyAsync(c->out[0], c->in[0], bytes, cudaMemcpyDeviceToDevice, c->stream),
                     "cudaMemcpyAsync", err);
}

static gp_status copy_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->din[0] || !c->dout[0]) return GP_OK;
    int64_t n = gp_shape_numel(gp_cuda_in_shape(c, 0));
    struct sto dxs = din_sto(c, 0), dys = dout_sto(c, 0);
    if (!dxs.bf16 && !dys.bf16) return add_into(c, c->din[0], c->dout[0], n, "copy backward", err);
    return flat_run(c, err, c->din[0], dxs, c->dout[0], dys, n, true, "copy backward");
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
    return view_run(c, err, c->out[0], out_sto(c, 0), y_st, 0, c->in[0], in_sto(c, 0), x_st, 0, ys, false,
                    "Transpose forward");
}

static gp_status transpose_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->din[0] || !c->dout[0]) return GP_OK;
    int64_t x_st[GP_MAX_RANK], y_st[GP_MAX_RANK];
    GP_TRY(transpose_view(c, err, x_st));
    const struct gp_shape *ys = gp_cuda_out_shape(c, 0);
    contiguous(ys, y_st);
    return view_run(c, err, c->din[0], din_sto(c, 0), x_st, 0, c->dout[0], dout_sto(c, 0), y_st, 0, ys, true,
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
            GP_TRY(view_run(c, err, c->out[0], out_sto(c, 0), y_st, at * y_st[axis], c->in[k], in_sto(c, k), x_st,
                            0, xs, false, "Concat forward"));
        else if (c->din[k] && c->dout[0])
            GP_TRY(view_run(c, err, c->din[k], din_sto(c, k), x_st, 0, c->dout[0], dout_sto(c, 0), y_st,
                            at * y_st[axis], xs, true, "Concat backward"));
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
            GP_TRY(view_run(c, err, c->out[k], out_sto(c, k), y_st, 0, c->in[0], in_sto(c, 0), x_st,
                            at * x_st[axis], &ys, false, "Split forward"));
        else if (c->din[0] && c->dout[k])
            GP_TRY(view_run(c, err, c->din[0], din_sto(c, 0), x_st, at * x_st[axis], c->dout[k], dout_sto(c, k),
                            y_st, 0, &ys, true, "Split backward"));
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
    return view_run(c, err, c->out[0], out_sto(c, 0), y_st, 0, c->in[0], in_sto(c, 0), x_st, base, ys, false,
                    "Slice forward");
}

static gp_status slice_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->din[0] || !c->dout[0]) return GP_OK;
    int64_t x_st[GP_MAX_RANK], y_st[GP_MAX_RANK], base;
    GP_TRY(slice_view(c, err, x_st, &base));
    const struct gp_shape *ys = gp_cuda_out_shape(c, 0);
    contiguous(ys, y_st);
    return view_run(c, err, c->din[0], din_sto(c, 0), x_st, base, c->dout[0], dout_sto(c, 0), y_st, 0, ys, true,
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

/* Y[idx] = X[idx mod D] per axis (bits, or converted: put). */
template <typename TD, typename TS>
__global__ static void tile_forward_kernel(struct tile_plan p, const TS *x, TD *y, int64_t n)
{
    GP_GRID_STRIDE(i, n)
    {
        int64_t rem = i, src = 0;
        for (int d = p.rank - 1; d >= 0; d--) {
            src += rem % p.yd[d] % p.xd[d] * p.x_st[d];
            rem /= p.yd[d];
        }
        put<false>(&y[i], x[src]);
    }
}

/* The launch for storage types TD and TS. */
template <typename TD, typename TS>
static void tile_forward_launch(const struct tile_plan *p, const void *x, void *y, int64_t n, cudaStream_t s)
{
    tile_forward_kernel<TD, TS><<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, s>>>(*p, (const TS *)x, (TD *)y, n);
}

static gp_status tile_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    struct tile_plan p;
    tile_plan_of(c, &p);
    int64_t n = gp_shape_numel(gp_cuda_out_shape(c, 0));
    struct sto xs = in_sto(c, 0), ys = out_sto(c, 0);
    size_t es = xs.es;
    GP_TRY(gp_cuda_check_esize(c, es, err));
    if (n == 0) return GP_OK;
    const void *x = c->in[0];
    void *y = c->out[0];
    cudaStream_t s = c->stream;
    if (!same_sto(xs, ys)) { /* float32 <-> bfloat16 */
        if (ys.bf16) tile_forward_launch<__nv_bfloat16, float>(&p, x, y, n, s);
        else tile_forward_launch<float, __nv_bfloat16>(&p, x, y, n, s);
        return gp_cuda_check_launch(c, "Tile forward", err);
    }
    switch (es) {
    case 1: tile_forward_launch<uint8_t, uint8_t>(&p, x, y, n, s); break;
    case 2: tile_forward_launch<uint16_t, uint16_t>(&p, x, y, n, s); break;
    case 4: tile_forward_launch<uint32_t, uint32_t>(&p, x, y, n, s); break;
    default: tile_forward_launch<unsigned long long, unsigned long long>(&p, x, y, n, s); break;
    }
    return gp_cuda_check_launch(c, "Tile forward", err);
}

/* dX[e] += the sum over the repeats of dY[e + k * D], in order, summed in
 * float from zero as the CPU does, then added with one rounding (dX and dY
 * stored as TD and TS: float or __nv_bfloat16). */
template <typename TD, typename TS>
__global__ static void tile_backward_kernel(struct tile_plan p, const TS *dy, TD *dx, int64_t n)
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
            acc = __fadd_rn(acc, gp_load(&dy[off]));
            for (int d = p.rank - 1; d >= 0 && ++k[d] == p.rep[d]; d--) k[d] = 0;
        }
        gp_store(&dx[e], __fadd_rn(gp_load(&dx[e]), acc));
    }
}

template <typename TD, typename TS>
static void tile_backward_launch(const struct tile_plan *p, const void *dy, void *dx, int64_t n, cudaStream_t s)
{
    tile_backward_kernel<TD, TS><<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, s>>>(*p, (const TS *)dy, (TD *)dx, n);
}

static gp_status tile_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->din[0] || !c->dout[0]) return GP_OK;
    struct tile_plan p;
    tile_plan_of(c, &p);
    int64_t n = gp_shape_numel(gp_cuda_in_shape(c, 0));
    if (n == 0) return GP_OK;
    bool dx16 = gp_cuda_is_bf16(c->din_dt, 0), dy16 = gp_cuda_is_bf16(c->dout_dt, 0);
    typedef __nv_bfloat16 bf16;
    if (dx16 && dy16) tile_backward_launch<bf16, bf16>(&p, c->dout[0], c->din[0], n, c->stream);
    else if (dx16) tile_backward_launch<bf16, float>(&p, c->dout[0], c->din[0], n, c->stream);
    else if (dy16) tile_backward_launch<float, bf16>(&p, c->dout[0], c->din[0], n, c->stream);
    else tile_backward_launch<float, float>(&p, c->dout[0], c->din[0], n, c->stream);
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

/* Bits where X and Y share a storage type; float32 <-> bfloat16 otherwise
 * (zero: +0 either way). */
template <typename TD, typename TS>
__global__ static void trilu_forward_kernel(const TS *x, TD *y, int64_t n, int64_t rc, int64_t cols,
                                            const int64_t *kp, bool upper)
{
    int64_t k = kp ? *kp : 0;
    GP_GRID_STRIDE(i, n)
    {
        bool keep = trilu_keep(i, rc, cols, k, upper);
        if constexpr (std::is_same<TD, TS>::value) {
            TS z{};
            y[i] = keep ? x[i] : z;
        } else {
            gp_store(&y[i], keep ? gp_load(&x[i]) : 0.0f);
        }
    }
}

template <typename TD, typename TS>
static void trilu_forward_launch(const void *x, void *y, int64_t n, int64_t rc, int64_t cols, const int64_t *kp,
                                 bool upper, cudaStream_t s)
{
    trilu_forward_kernel<TD, TS><<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, s>>>((const TS *)x, (TD *)y, n, rc,
                                                                                   cols, kp, upper);
}

/* dX (TD) += dY (TS) where kept, one rounding. */
template <typename TD, typename TS>
__global__ static void trilu_backward_kernel(const TS *dy, TD *dx, int64_t n, int64_t rc, int64_t cols,
                                             const int64_t *kp, bool upper)
{
    int64_t k = kp ? *kp : 0;
    GP_GRID_STRIDE(i, n)
    {
        if (trilu_keep(i, rc, cols, k, upper)) gp_store(&dx[i], __fadd_rn(gp_load(&dx[i]), gp_load(&dy[i])));
    }
}

template <typename TD, typename TS>
static void trilu_backward_launch(const void *dy, void *dx, int64_t n, int64_t rc, int64_t cols,
                                  const int64_t *kp, bool upper, cudaStream_t s)
{
    trilu_backward_kernel<TD, TS><<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, s>>>((const TS *)dy, (TD *)dx, n,
                                                                                    rc, cols, kp, upper);
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
    cudaStream_t s = c->stream;
    typedef __nv_bfloat16 bf16;
    if (backward) {
        if (!c->din[0] || !c->dout[0]) return GP_OK;
        const void *dy = c->dout[0];
        void *dx = c->din[0];
        bool dx16 = gp_cuda_is_bf16(c->din_dt, 0), dy16 = gp_cuda_is_bf16(c->dout_dt, 0);
        if (dx16 && dy16) trilu_backward_launch<bf16, bf16>(dy, dx, n, rc, cols, kp, upper, s);
        else if (dx16) trilu_backward_launch<bf16, float>(dy, dx, n, rc, cols, kp, upper, s);
        else if (dy16) trilu_backward_launch<float, bf16>(dy, dx, n, rc, cols, kp, upper, s);
        else trilu_backward_launch<float, float>(dy, dx, n, rc, cols, kp, upper, s);
        return gp_cuda_check_launch(c, "Trilu backward", err);
    }
    struct sto x_sto = in_sto(c, 0), y_sto = out_sto(c, 0);
    size_t es = x_sto.es;
    GP_TRY(gp_cuda_check_esize(c, es, err));
    const void *x = c->in[0];
    void *y = c->out[0];
    if (!same_sto(x_sto, y_sto)) { /* float32 <-> bfloat16 */
        if (y_sto.bf16) trilu_forward_launch<bf16, float>(x, y, n, rc, cols, kp, upper, s);
        else trilu_forward_launch<float, bf16>(x, y, n, rc, cols, kp, upper, s);
        return gp_cuda_check_launch(c, "Trilu forward", err);
    }
    switch (es) {
    case 1: trilu_forward_launch<uint8_t, uint8_t>(x, y, n, rc, cols, kp, upper, s); break;
    case 2: trilu_forward_launch<uint16_t, uint16_t>(x, y, n, rc, cols, kp, upper, s); break;
    case 4: trilu_forward_launch<uint32_t, uint32_t>(x, y, n, rc, cols, kp, upper, s); break;
    default: trilu_forward_launch<unsigned long long, unsigned long long>(x, y, n, rc, cols, kp, upper, s); break;
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
    struct sto ys = out_sto(c, 0);
    size_t es = ys.es;
    GP_TRY(gp_cuda_check_esize(c, es, err));
    const struct gp_attr *a = gp_node_attr(c->node, "value");
    unsigned long long bits = 0;
    if (!a || !a->t) host_store_f64(&bits, y->dtype, 0);
    else if (gp_dtype_is_float(a->t->dtype)) host_store_f64(&bits, y->dtype, gp_tensor_get_f64(a->t, 0));
    else host_store_i64(&bits, y->dtype, gp_tensor_get_i64(a->t, 0));
    if (ys.bf16) { /* the float32 value, rounded once */
        float f;
        memcpy(&f, &bits, sizeof f);
        bits = gp_float_to_bf16(f);
    }
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

/* Every entry but Range reads and writes either storage type of a float
 * tensor (bf16_any; Shape and Size read no elements). Range reads float
 * scalars as float32 and writes float32: the executor stages it (it is
 * folded at load nearly always). */
#define COPY(op) {op, NULL, NULL, copy_forward, copy_backward, false, true}
#define NO_GRAD(op, fwd) {op, NULL, NULL, fwd, NULL, false, true}

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_shape[] = {
    COPY("Reshape"), COPY("Flatten"), COPY("Squeeze"), COPY("Unsqueeze"),
    {"Transpose", NULL, NULL, transpose_forward, transpose_backward, false, true},
    {"Concat", NULL, NULL, concat_forward, concat_backward, false, true},
    {"Split", NULL, NULL, split_forward, split_backward, false, true},
    {"Slice", NULL, NULL, slice_forward, slice_backward, false, true},
    {"Tile", NULL, NULL, tile_forward, tile_backward, false, true},
    {"Trilu", NULL, NULL, trilu_forward, trilu_backward, false, true},
    NO_GRAD("Shape", shape_forward),
    NO_GRAD("Size", size_forward),
    NO_GRAD("ConstantOfShape", constant_of_shape_forward),
    {"Range", NULL, NULL, range_forward, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};
