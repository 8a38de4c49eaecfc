/* CUDA kernels: Softmax and LogSoftmax, twin of backend/cpu/softmax.c.
 *
 * Same semantics as the CPU kernels, term for term: sums accumulate in
 * double and NaNs propagate the same way.
 *
 * Determinism: no float atomics. A row runs on one warp or one block with a
 * fixed-order tree (vectors strided along the axis: one thread each, in the
 * CPU's own order, which reads coalesced), so results are the same run to
 * run.
 *
 * Rounding: nvcc contracts a * b + c into FMAs, the CPU build does not;
 * where a product feeds a sum the operations are spelled with the _rn
 * intrinsics. expf/logf are CUDA's (a few ulps from glibc's).
 *
 * bfloat16 (bf16_any): X, Y, dY and dX each float32 or bfloat16; loads
 * widen, every stored value is rounded once, the arithmetic is the float32
 * kernels' own, so results equal those of float32 copies. */
#include <math.h>
#include <string.h>

#include <initializer_list>

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/storage.cuh"

extern "C" {
#include "ops/fold_util.h"
}

/* Four consecutive elements (vector q) of a row whose vectors are aligned
 * (vec_ok): one float4, or four bfloat16 in 8 bytes; a mix (never
 * vectorized) element by element. */
__device__ static inline float4 ld4(const float *p, int64_t q) { return ((const float4 *)p)[q]; }
__device__ static inline float4 ld4(const bf16_t *p, int64_t q)
{
    uint2 u = ((const uint2 *)p)[q];
    __nv_bfloat162 a, b;
    memcpy(&a, &u.x, sizeof a);
    memcpy(&b, &u.y, sizeof b);
    float2 fa = __bfloat1622float2(a), fb = __bfloat1622float2(b);
    return make_float4(fa.x, fa.y, fb.x, fb.y);
}
__device__ static inline float4 ld4(gp_fptr t, int64_t q)
{
    return make_float4(ld(t, 4 * q), ld(t, 4 * q + 1), ld(t, 4 * q + 2), ld(t, 4 * q + 3));
}
__device__ static inline void st4(float *p, int64_t q, float4 v) { ((float4 *)p)[q] = v; }
__device__ static inline void st4(bf16_t *p, int64_t q, float4 v)
{
    __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    uint2 u;
    memcpy(&u.x, &a, sizeof a);
    memcpy(&u.y, &b, sizeof b);
    ((uint2 *)p)[q] = u;
}
__device__ static inline void st4(gp_fptr t, int64_t q, float4 v)
{
    st(t, 4 * q, v.x), st(t, 4 * q + 1, v.y), st(t, 4 * q + 2, v.z), st(t, 4 * q + 3, v.w);
}

/* Whether ld4 / st4 may use p. */
static inline bool vec_ok(const float *p) { return gp_cuda_aligned16(p); }
static inline bool vec_ok(const bf16_t *p) { return ((uintptr_t)p & 7) == 0; }
static inline bool vec_ok(gp_fptr) { return false; }

/* ---- Softmax, LogSoftmax ---- */

/* The warp's sum, in every lane. */
__device__ static inline double warp_sum(double v)
{
    for (int o = 16; o > 0; o >>= 1) v = DADD(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The input as `count` vectors of `len` elements `stride` apart (the CPU's
 * struct vecs): before opset 13 the rows of [D0..D(axis-1), rest], since 13
 * the vectors along `axis` alone. */
struct vecs {
    int64_t count, len, stride;
};

static gp_status softmax_vecs(const struct gp_cuda_ctx *c, struct gp_error *err, struct vecs *v)
{
    struct gp_infer_ctx ic = gp_cuda_infer_ctx(c->graph, c->node, err);
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

/* One block per row (stride 1): max, sum of exp in double, write. XP, YP:
 * the storage of X and Y (the helpers above). */
template <bool VEC, typename XP, typename YP>
__global__ static void softmax_rows_kernel(XP X, YP Y, int64_t rows, int64_t len, bool log_out)
{
    __shared__ double sh[32];
    __shared__ float shf[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        XP x = X + r * len;
        YP y = Y + r * len;
        float m = -INFINITY;
        if (VEC) {
            for (int64_t q = threadIdx.x; q < len / 4; q += blockDim.x) {
                float4 v = ld4(x, q);
                m = max_nan(max_nan(max_nan(max_nan(m, v.x), v.y), v.z), v.w);
            }
        } else {
            for (int64_t j = threadIdx.x; j < len; j += blockDim.x) m = max_nan(m, ld(x, j));
        }
        m = block_max(m, shf);
        if (m == -INFINITY) m = 0;
        double s = 0;
        if (VEC) {
            for (int64_t q = threadIdx.x; q < len / 4; q += blockDim.x) {
                float4 v = ld4(x, q);
                s = DADD(s, (double)expf(FSUB(v.x, m)));
                s = DADD(s, (double)expf(FSUB(v.y, m)));
                s = DADD(s, (double)expf(FSUB(v.z, m)));
                s = DADD(s, (double)expf(FSUB(v.w, m)));
            }
        } else {
            for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
                s = DADD(s, (double)expf(FSUB(ld(x, j), m)));
        }
        s = gp_dev_block_sum(s, sh);
        if (log_out) {
            float ls = (float)log(s);
            if (VEC) {
                for (int64_t q = threadIdx.x; q < len / 4; q += blockDim.x) {
                    float4 v = ld4(x, q), o;
                    o.x = FSUB(FSUB(v.x, m), ls);
                    o.y = FSUB(FSUB(v.y, m), ls);
                    o.z = FSUB(FSUB(v.z, m), ls);
                    o.w = FSUB(FSUB(v.w, m), ls);
                    st4(y, q, o);
                }
            } else {
                for (int64_t j = threadIdx.x; j < len; j += blockDim.x) st(y, j, FSUB(FSUB(ld(x, j), m), ls));
            }
        } else {
            float inv = (float)(1.0 / s);
            if (VEC) {
                for (int64_t q = threadIdx.x; q < len / 4; q += blockDim.x) {
                    float4 v = ld4(x, q), o;
                    o.x = FMUL(expf(FSUB(v.x, m)), inv);
                    o.y = FMUL(expf(FSUB(v.y, m)), inv);
                    o.z = FMUL(expf(FSUB(v.z, m)), inv);
                    o.w = FMUL(expf(FSUB(v.w, m)), inv);
                    st4(y, q, o);
                }
            } else {
                for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
                    st(y, j, FMUL(expf(FSUB(ld(x, j), m)), inv));
            }
        }
    }
}

#define WARP_ROW_MAX 1024 /* rows up to this length: one warp each */

/* One warp per row (stride 1, short rows): three passes over the row, the
 * second and third from L1. (Keeping the row in registers, fully unrolled,
 * measured 3x slower on an H200.) */
template <typename XP, typename YP>
__global__ static void softmax_warp_kernel(XP X, YP Y, int64_t rows, int64_t len, bool log_out)
{
    int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    for (int64_t r = blockIdx.x * (int64_t)wpb + (threadIdx.x >> 5); r < rows;
         r += (int64_t)gridDim.x * wpb) {
        XP x = X + r * len;
        YP y = Y + r * len;
        float m = -INFINITY;
        for (int64_t j = lane; j < len; j += 32) m = max_nan(m, ld(x, j));
        for (int o = 16; o > 0; o >>= 1) m = max_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (m == -INFINITY) m = 0;
        double s = 0;
        for (int64_t j = lane; j < len; j += 32) s = DADD(s, (double)expf(FSUB(ld(x, j), m)));
        s = warp_sum(s);
        if (log_out) {
            float ls = (float)log(s);
            for (int64_t j = lane; j < len; j += 32) st(y, j, FSUB(FSUB(ld(x, j), m), ls));
        } else {
            float inv = (float)(1.0 / s);
            for (int64_t j = lane; j < len; j += 32) st(y, j, FMUL(expf(FSUB(ld(x, j), m)), inv));
        }
    }
}

/* One thread per vector (stride > 1: the vectors interleave, so
 * neighbouring threads read neighbouring addresses), in the CPU's order. */
template <typename XP, typename YP>
__global__ static void softmax_strided_kernel(struct vecs v, XP X, YP Y, bool log_out)
{
    GP_GRID_STRIDE(k, v.count) {
        int64_t o = k / v.stride * v.len * v.stride + k % v.stride, s = v.stride;
        XP x = X + o;
        YP y = Y + o;
        float m = -INFINITY;
        for (int64_t j = 0; j < v.len; j++) m = max_nan(m, ld(x, j * s));
        if (m == -INFINITY) m = 0;
        double sum = 0;
        for (int64_t j = 0; j < v.len; j++) sum = DADD(sum, (double)expf(FSUB(ld(x, j * s), m)));
        if (log_out) {
            float ls = (float)log(sum);
            for (int64_t j = 0; j < v.len; j++) st(y, j * s, FSUB(FSUB(ld(x, j * s), m), ls));
        } else {
            float inv = (float)(1.0 / sum);
            for (int64_t j = 0; j < v.len; j++) st(y, j * s, FMUL(expf(FSUB(ld(x, j * s), m)), inv));
        }
    }
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
    gp_fptr xf = gp_cuda_in_f(c, 0), yf = gp_cuda_out_f(c, 0);
    cudaStream_t stream = c->stream;
    with_storage(storage_of({xf, yf}), [&](auto tag) {
        auto X = in_as(tag, xf);
        auto Y = out_as(tag, yf);
        if (v.stride > 1) {
            softmax_strided_kernel<<<gp_cuda_blocks_for(v.count), GP_CUDA_THREADS, 0, stream>>>(v, X, Y, log_out);
        } else if (v.len <= WARP_ROW_MAX) {
            int64_t blocks = (v.count + 7) / 8;
            softmax_warp_kernel<<<gp_cuda_capped_grid(blocks, 1 << 20), 256, 0, stream>>>(X, Y, v.count, v.len,
                                                                                   log_out);
        } else {
            unsigned t = row_block_threads(v.len), g = gp_cuda_capped_grid(v.count, 1 << 20);
            if (v.len % 4 == 0 && vec_ok(X) && vec_ok(Y))
                softmax_rows_kernel<true><<<g, t, 0, stream>>>(X, Y, v.count, v.len, log_out);
            else
                softmax_rows_kernel<false><<<g, t, 0, stream>>>(X, Y, v.count, v.len, log_out);
        }
    });
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

/* YP, DP, GP: the storage of Y, dY and dX; each dX element gets one term,
 * added in float32 and rounded once. */
template <bool VEC, typename YP, typename DP, typename GP>
__global__ static void softmax_bwd_rows_kernel(YP Y, DP dY, GP dX, int64_t rows, int64_t len, bool log_out)
{
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        YP y = Y + r * len;
        DP dy = dY + r * len;
        GP dx = dX + r * len;
        double dot = 0;
        if (VEC) {
            for (int64_t q = threadIdx.x; q < len / 4; q += blockDim.x) {
                float4 a = ld4(y, q), b = ld4(dy, q);
                dot = DADD(dot, (double)sm_dot_term(log_out, a.x, b.x));
                dot = DADD(dot, (double)sm_dot_term(log_out, a.y, b.y));
                dot = DADD(dot, (double)sm_dot_term(log_out, a.z, b.z));
                dot = DADD(dot, (double)sm_dot_term(log_out, a.w, b.w));
            }
        } else {
            for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
                dot = DADD(dot, (double)sm_dot_term(log_out, ld(y, j), ld(dy, j)));
        }
        float d = (float)gp_dev_block_sum(dot, sh);
        if (VEC) {
            for (int64_t q = threadIdx.x; q < len / 4; q += blockDim.x) {
                float4 a = ld4(y, q), b = ld4(dy, q), o = ld4(dx, q);
                o.x = FADD(o.x, sm_dx(log_out, a.x, b.x, d));
                o.y = FADD(o.y, sm_dx(log_out, a.y, b.y, d));
                o.z = FADD(o.z, sm_dx(log_out, a.z, b.z, d));
                o.w = FADD(o.w, sm_dx(log_out, a.w, b.w, d));
                st4(dx, q, o);
            }
        } else {
            for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
                st(dx, j, FADD(ld(dx, j), sm_dx(log_out, ld(y, j), ld(dy, j), d)));
        }
    }
}

template <typename YP, typename DP, typename GP>
__global__ static void softmax_bwd_warp_kernel(YP Y, DP dY, GP dX, int64_t rows, int64_t len, bool log_out)
{
    int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    for (int64_t r = blockIdx.x * (int64_t)wpb + (threadIdx.x >> 5); r < rows;
         r += (int64_t)gridDim.x * wpb) {
        YP y = Y + r * len;
        DP dy = dY + r * len;
        GP dx = dX + r * len;
        double dot = 0;
        for (int64_t j = lane; j < len; j += 32) dot = DADD(dot, (double)sm_dot_term(log_out, ld(y, j), ld(dy, j)));
        float d = (float)warp_sum(dot);
        for (int64_t j = lane; j < len; j += 32)
            st(dx, j, FADD(ld(dx, j), sm_dx(log_out, ld(y, j), ld(dy, j), d)));
    }
}

template <typename YP, typename DP, typename GP>
__global__ static void softmax_bwd_strided_kernel(struct vecs v, YP Y, DP dY, GP dX, bool log_out)
{
    GP_GRID_STRIDE(k, v.count) {
        int64_t o = k / v.stride * v.len * v.stride + k % v.stride, s = v.stride;
        YP y = Y + o;
        DP dy = dY + o;
        GP dx = dX + o;
        double dot = 0;
        for (int64_t j = 0; j < v.len; j++)
            dot = DADD(dot, (double)sm_dot_term(log_out, ld(y, j * s), ld(dy, j * s)));
        float d = (float)dot;
        for (int64_t j = 0; j < v.len; j++)
            st(dx, j * s, FADD(ld(dx, j * s), sm_dx(log_out, ld(y, j * s), ld(dy, j * s), d)));
    }
}

static gp_status softmax_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->dout[0] || !c->din[0]) return GP_OK;
    GP_TRY(gp_cuda_want_f32(c, 0, err));
    struct vecs v;
    GP_TRY(softmax_vecs(c, err, &v));
    if (v.count == 0 || v.len == 0) return GP_OK;
    bool log_out = strcmp(c->node->op_type, "LogSoftmax") == 0;
    gp_fptr yf = gp_cuda_out_f(c, 0), dyf = gp_cuda_dout_f(c, 0), dxf = gp_cuda_din_f(c, 0);
    cudaStream_t stream = c->stream;
    with_storage(storage_of({yf, dyf, dxf}), [&](auto tag) {
        auto Y = in_as(tag, yf);
        auto dY = in_as(tag, dyf);
        auto dX = out_as(tag, dxf);
        if (v.stride > 1) {
            softmax_bwd_strided_kernel<<<gp_cuda_blocks_for(v.count), GP_CUDA_THREADS, 0, stream>>>(v, Y, dY, dX,
                                                                                              log_out);
        } else if (v.len <= WARP_ROW_MAX) {
            int64_t blocks = (v.count + 7) / 8;
            softmax_bwd_warp_kernel<<<gp_cuda_capped_grid(blocks, 1 << 20), 256, 0, stream>>>(Y, dY, dX, v.count,
                                                                                       v.len, log_out);
        } else {
            unsigned t = row_block_threads(v.len), g = gp_cuda_capped_grid(v.count, 1 << 20);
            if (v.len % 4 == 0 && vec_ok(Y) && vec_ok(dY) && vec_ok(dX))
                softmax_bwd_rows_kernel<true><<<g, t, 0, stream>>>(Y, dY, dX, v.count, v.len, log_out);
            else
                softmax_bwd_rows_kernel<false><<<g, t, 0, stream>>>(Y, dY, dX, v.count, v.len, log_out);
        }
    });
    return gp_cuda_check_launch(c, log_out ? "LogSoftmax backward" : "Softmax backward", err);
}

/* ---- the table ---- */

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_softmax[] = {
    /* The backward reads and writes bfloat16 correctly (tested) but ran at
     * 236 GB/s on the H200 (7.2 ms per GPT-2 attention layer against the
     * float32 kernel's 1.4): until that is understood the executor stages
     * it (float32 copies, about 2.6 ms). */
    {"Softmax", NULL, NULL, softmax_forward, softmax_backward, false, true, true},
    {"LogSoftmax", NULL, NULL, softmax_forward, softmax_backward, false, true, true},
    {NULL, NULL, NULL, NULL, NULL, false, false},
};
