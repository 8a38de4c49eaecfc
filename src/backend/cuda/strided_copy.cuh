/* Strided copies for the shape family (shape.cu): element moves of any
 * size, float adds, the storage of each tensor of a call (float32,
 * bfloat16 or its own dtype), and views (an index space with strides on
 * either side) copied, converted or added into with one rounding, which
 * Reshape, Transpose, Concat, Split, Slice and Tile are built on. Included
 * by shape.cu alone: its static functions are that file's, kept apart to
 * keep each file readable. */
#ifndef GP_CUDA_STRIDED_COPY_CUH
#define GP_CUDA_STRIDED_COPY_CUH

#include <stdint.h>
#include <string.h>

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/kernel.h"
#include "backend/cuda/kernel_util.cuh"

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

#endif
