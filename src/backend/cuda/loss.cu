/* Device-side losses of a training step, twins of train/loss.c (see
 * cuda/train_kernels.h for the contracts).
 *
 * Each launch computes the loss terms and writes the gradient in one
 * kernel; every block leaves one double partial sum in `scratch` (at most
 * LOSS_PARTIALS of them, the grid depending on the shape alone), then one
 * block adds the partials in a fixed tree into *loss_sum: the same bits run
 * to run. The per-element arithmetic is the CPU's: log-sum-exp in double
 * with the maximum subtracted, the gradient (exp(x - lse) - onehot) * inv in
 * double rounded once to float; mse's gradient is the CPU's float32
 * scale * (pred - target). Two things differ from the CPU's: the order of
 * the double sums, and cross-entropy's exponentials, gp_fast_exp's
 * (fast_exp.cuh: within ~1.04 double ulps, as CUDA's exp() is within 1,
 * in 12 double operations to exp()'s 15: with two per logit they, not the
 * memory traffic, are the kernel's time). So losses agree to ~1e-15
 * relative, and a gradient is the float32 rounding of a double a few ulps
 * from the CPU's: the same float but where that double lies within a few
 * double ulps of a rounding boundary (~2^-28 of the values), then an ulp
 * off. Where the argument is outside [-708, 708] (-inf, NaN, underflow)
 * gp_fast_exp returns exp()'s bits, so special values behave as before.
 *   The output and its gradient are float32 or bfloat16, read and written
 * in place (a bf16 stage's logits need no float32 copies): every kernel is
 * templated on the storage, widens exactly, computes as for float32 and
 * rounds each gradient value once more (gp_f32_to_bf16_bits), with the
 * float32 launch's grid and split of the rows, so mse and the output loss
 * store the bits that widening, the float32 kernel and a conversion stored.
 * Cross-entropy's bfloat16 rows are computed otherwise in two places. The
 * block-per-row kernel's pass 1 takes the exponentials in float32 and adds
 * each group of them in float32 before the double sum (ms_group_f32, as
 * autocast's float32 log_softmax would: the double exponentials were that
 * kernel's time), so its loss terms lie within ~2^-21 of the float32
 * kernel's (the strided kernel's loss stays the float32 one, bit for bit).
 * And its gradient is computed in float32 (ce_grad_f32:
 * exp(x - m) * (inv / s), one expf and no double work per value; the
 * label's value, and x - m below -80, -inf or NaN, by the double formula),
 * within 7 * 2^-24 relative of the double formula's value (plus 2^-149
 * among subnormals). So a bfloat16 gradient value is the float32 kernel's
 * rounded to bfloat16 but where that value lies within ~2^-21 relative of
 * a bfloat16 rounding boundary (a midpoint, 2^-8 relative apart: at most
 * ~2^-12 of the values; 2e-5 .. 4e-5 of GPT-2-sized rows of normal logits
 * in an emulation on the CPU, expf's error taken as up to 2 ulps), and then
 * the neighbouring bfloat16, one ulp off.
 *   Cross-entropy along a contiguous class axis ([N, C] or [N, T, C]; rows
 *   of up to GPT-2's 50304 classes) runs one block of up to 256 threads per
 *   row, float4 loads when the row allows (bfloat16: 8-byte loads of 4
 *   values in float32's split, two groups ahead; the gradient pass by
 *   16-byte runs of 8), the next group of loads in
 *   flight while a group's exponentials are computed: pass 1 folds max and
 *   sum of exponentials online (each thread a running (max, sum), rescaled
 *   at most once per group of 8 elements, merged in a fixed tree), pass 2
 *   writes the gradient, so logits are read twice (the second time mostly
 *   from L2) and the gradient written once. Along a strided class axis ([N, C, H, W]) one
 *   thread takes a row (neighbouring threads read neighbouring pixels, so
 *   loads coalesce) and follows the CPU's three loops exactly; few rows with
 *   many classes go to the block-per-row kernel with a stride instead.
 *   Labels must be valid (the trainer checks them on the host); a label that
 *   is neither ignore_index nor in [0, C) is never used as an index: its row
 *   adds a NaN to the loss, so the mistake shows.
 *
 * No function synchronizes or allocates; every launch is checked and a
 * failure names the function and the kernel. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cuda_runtime.h>

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/fast_exp.cuh"
#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/train_kernels.h"

/* ---- shared helpers ---- */

#define LOSS_THREADS 256
#define LOSS_PARTIALS 4096 /* per-block partial sums at most (scratch doubles) */
#define REDUCE_THREADS 1024

static unsigned loss_blocks(int64_t n)
{
    int64_t b = (n + LOSS_THREADS - 1) / LOSS_THREADS;
    return (unsigned)(b < 1 ? 1 : b > LOSS_PARTIALS ? LOSS_PARTIALS : b);
}

/* *out = the sum of part[0, n), in a fixed order. One block. */
__global__ void __launch_bounds__(REDUCE_THREADS) sum_partials_kernel(const double *part, int n, double *out)
{
    __shared__ double sh[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += part[i];
    s = gp_dev_block_sum0(s, sh);
    if (threadIdx.x == 0) *out = s;
}

static gp_status finish_loss(cudaStream_t stream, const char *fn, const double *part, unsigned n,
                             double *loss_sum, struct gp_error *err)
{
    sum_partials_kernel<<<1, REDUCE_THREADS, 0, stream>>>(part, (int)n, loss_sum);
    return gp_cuda_launched(fn, "sum_partials_kernel", err);
}

static gp_status check_loss_args(const char *fn, double denominator, const double *loss_sum,
                                 const void *scratch, struct gp_error *err)
{
    if (!(denominator > 0) || !isfinite(denominator))
        return gp_error_set(err, GP_ERR_INVALID,
                            "%s: the denominator (loss terms in the mini-batch) must be positive, "
                            "not %g",
                            fn, denominator);
    if (!loss_sum || !scratch)
        return gp_error_set(err, GP_ERR_INVALID, "%s: no %s", fn, loss_sum ? "scratch" : "loss_sum");
    return GP_OK;
}

extern "C" size_t gp_cuda_loss_scratch_bytes(const struct gp_shape *output_shape)
{
    (void)output_shape; /* the grids are capped at LOSS_PARTIALS blocks whatever the shape */
    return LOSS_PARTIALS * sizeof(double);
}

/* ---- storage ----
 * The output and its gradient are float32 or bfloat16 (as its 16 bits:
 * widened exactly, rounded once by gp_f32_to_bf16_bits, the executor's own
 * conversion). A kernel templated on T computes the same float32 values
 * either way, so the bfloat16 path stores what widening the output,
 * running the float32 path and rounding its gradient stored. */
typedef uint16_t bf16_bits;

__device__ static inline float ld_el(const float *p, int64_t i) { return p[i]; }
__device__ static inline float ld_el(const bf16_bits *p, int64_t i) { return gp_bf16_bits_to_f32(p[i]); }
__device__ static inline void st_el(float *p, int64_t i, float v) { p[i] = v; }
__device__ static inline void st_el(bf16_bits *p, int64_t i, float v) { p[i] = gp_f32_to_bf16_bits(v); }

/* Two bfloat16 in a 32-bit word, the lower address in the low half. */
__device__ static inline float lo_bf16(uint32_t w) { return __uint_as_float(w << 16); }
__device__ static inline float hi_bf16(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ static inline uint32_t pack_bf16(float lo, float hi)
{
    return (uint32_t)gp_f32_to_bf16_bits(lo) | (uint32_t)gp_f32_to_bf16_bits(hi) << 16;
}

/* Runs of 4 values (`chunk`, one 16-byte float4 or one 8-byte load of
 * bfloat16) and of WIDE values (`wide`, 16 bytes either way). */
template <typename T> struct io;
template <> struct io<float> {
    typedef float4 chunk;
    typedef float4 wide;
    enum { WIDE = 4 };
};
template <> struct io<bf16_bits> {
    typedef uint2 chunk;
    typedef uint4 wide;
    enum { WIDE = 8 };
};

__device__ static inline void widen(const float4 &q, float *v)
{
    v[0] = q.x;
    v[1] = q.y;
    v[2] = q.z;
    v[3] = q.w;
}
__device__ static inline void widen(const uint2 &q, float *v)
{
    v[0] = lo_bf16(q.x);
    v[1] = hi_bf16(q.x);
    v[2] = lo_bf16(q.y);
    v[3] = hi_bf16(q.y);
}
__device__ static inline void widen(const uint4 &q, float *v)
{
    widen(make_uint2(q.x, q.y), v);
    widen(make_uint2(q.z, q.w), v + 4);
}
__device__ static inline void narrow(const float *v, float4 &q) { q = make_float4(v[0], v[1], v[2], v[3]); }
__device__ static inline void narrow(const float *v, uint4 &q)
{
    q = make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]), pack_bf16(v[6], v[7]));
}

/* Chunk j of x (values 4j .. 4j + 3), all -inf from n4 on. VEC: one
 * vector load (x aligned to the chunk's bytes); else four scalar loads
 * (a bfloat16 row that is not 8-byte aligned), the same values. */
__device__ static inline void load_chunk(float4 &q, const float *x, int64_t j, int64_t n4, bool vec)
{
    if (j >= n4)
        q = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
    else if (vec)
        q = reinterpret_cast<const float4 *>(x)[j];
    else
        q = make_float4(x[4 * j], x[4 * j + 1], x[4 * j + 2], x[4 * j + 3]);
}
__device__ static inline void load_chunk(uint2 &q, const bf16_bits *x, int64_t j, int64_t n4, bool vec)
{
    if (j >= n4)
        q = make_uint2(0xff80ff80u, 0xff80ff80u); /* bfloat16 -inf, twice */
    else if (vec)
        q = reinterpret_cast<const uint2 *>(x)[j];
    else
        q = make_uint2((uint32_t)x[4 * j] | (uint32_t)x[4 * j + 1] << 16,
                       (uint32_t)x[4 * j + 2] | (uint32_t)x[4 * j + 3] << 16);
}

/* ---- cross-entropy ---- */

struct ce_args {
    const void *x;      /* float32 or bfloat16 (the kernel's T) */
    const int64_t *labels;
    void *dx;           /* the same type, or NULL */
    double *part;
    int64_t rows, C, S, ignore;
    double inv;
    bool vec;  /* CE_CHUNKS: chunks by vector loads (else scalar ones) */
    bool wide; /* CE_CHUNKS: the gradient pass by 16-byte runs (else value by value) */
};

/* The running (m, s) moved to the group's maximum when that is larger:
 * s rescaled once, in double (both folds below). */
template <int K>
__device__ static inline void ms_rescale(const float (&v)[K], float &m, double &s, const double *tab)
{
    float mx = v[0];
#pragma unroll
    for (int u = 1; u < K; u++) mx = fmaxf(mx, v[u]);
    if (mx > m) {
        s *= gp_fast_exp((double)m - (double)mx, tab);
        m = mx;
    }
}

/* A group of K elements into a running (max m, sum s of exp(x - m)): one
 * rescale per group at most (when the group holds a new maximum), so the
 * warps do not diverge element by element. m never becomes NaN (fmaxf and >
 * skip NaN); a NaN element makes s NaN, as it makes the CPU's sum. A -inf
 * adds exp(-inf - m) = 0 on the CPU when m is finite; it adds nothing here,
 * so that a thread that has seen only -inf keeps s = 0 (a row of only -inf,
 * or one holding +inf, is made NaN at the end, as on the CPU). Padding
 * elements are -inf (so a group of padding alone changes nothing). */
template <int K>
__device__ static inline void ms_group(const float (&v)[K], float &m, double &s, const double *tab)
{
    ms_rescale(v, m, s, tab);
#pragma unroll
    for (int u = 0; u < K; u++) {
        const double e = gp_fast_exp((double)v[u] - (double)m, tab);
        s += v[u] == -INFINITY ? 0.0 : e;
    }
}

/* The bfloat16 path's pass 1 (ms_of): each exponential in float32, as
 * autocast's float32 log_softmax takes them, and the group's K of them
 * added in float32 in a fixed pairwise tree before the group's sum joins
 * the thread's double s (the maximum's rescale stays in double). The
 * double formula's exponentials, not the memory traffic, were the bfloat16
 * kernel's time (~40 instructions a logit, at 25% occupancy). Error of a
 * group's sum against the double one: expf's 2 ulps, d = v - m's rounding
 * (exact for bfloat16 values whose exponents lie within 16 of each
 * other's), log2(K) additions: within ~2^-21 relative, so the row's lse is
 * within ~2^-21 of the float32 kernel's (absolute) and a loss term as
 * close. Special values as ms_group: -inf adds 0, NaN makes s NaN, +inf
 * makes m infinite (the row becomes NaN at the end). */
template <int K>
__device__ static inline void ms_group_f32(const float (&v)[K], float &m, double &s, const double *tab)
{
    ms_rescale(v, m, s, tab);
    float e[K];
#pragma unroll
    for (int u = 0; u < K; u++) e[u] = v[u] == -INFINITY ? 0.0f : expf(__fsub_rn(v[u], m));
#pragma unroll
    for (int w = K / 2; w > 0; w >>= 1)
#pragma unroll
        for (int u = 0; u < w; u++) e[u] = __fadd_rn(e[u], e[u + w]);
    s += (double)e[0];
}

/* Pass 1's fold for storage T: float32 keeps the double exponentials (its
 * loss is the CPU's to ~1e-15), bfloat16 takes ms_group_f32. */
template <int K>
__device__ static inline void ms_of(float, const float (&v)[K], float &m, double &s, const double *tab)
{
    ms_group(v, m, s, tab);
}
template <int K>
__device__ static inline void ms_of(bf16_bits, const float (&v)[K], float &m, double &s, const double *tab)
{
    ms_group_f32(v, m, s, tab);
}

__device__ static inline void ms_merge(float &m, double &s, float m2, double s2, const double *tab)
{
    const float M = m > m2 ? m : m2;
    const double a = (m == M || m == -INFINITY) ? s : s * gp_fast_exp((double)m - (double)M, tab);
    const double b = (m2 == M || m2 == -INFINITY) ? s2 : s2 * gp_fast_exp((double)m2 - (double)M, tab);
    m = M;
    s = a + b;
}

/* The block's (max, sum) in a fixed tree, valid in thread 0. */
__device__ static void block_ms(float &m, double &s, float *shm, double *shs, const double *tab)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_down_sync(0xffffffffu, m, o);
        double s2 = __shfl_down_sync(0xffffffffu, s, o);
        ms_merge(m, s, m2, s2, tab);
    }
    __syncthreads();
    if (lane == 0) {
        shm[w] = m;
        shs[w] = s;
    }
    __syncthreads();
    if (w == 0) {
        m = lane < nw ? shm[lane] : -INFINITY;
        s = lane < nw ? shs[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) {
            float m2 = __shfl_down_sync(0xffffffffu, m, o);
            double s2 = __shfl_down_sync(0xffffffffu, s, o);
            ms_merge(m, s, m2, s2, tab);
        }
    }
}

__device__ static inline float ce_grad(float v, double lse, bool hot, double inv, const double *tab)
{
    return (float)((gp_fast_exp((double)v - lse, tab) - (hot ? 1.0 : 0.0)) * inv);
}

/* A row's constants for the bfloat16 gradient: m its maximum, c = inv / s
 * rounded once to float (s >= 1, the maximum's own term; NaN where the row
 * made s NaN, and then every gradient of the row is NaN, as ce_grad's). */
struct ce_row {
    double lse, inv;
    float m, c;
};

/* Below this d = v - m the bfloat16 gradient takes ce_grad: expf(d) stays
 * a normal float (expf(-87.3) is the smallest), so its relative error
 * holds, and -inf and NaN take the double formula's path and bits. */
#define CE_F32_DMIN -80.0f

/* The bfloat16 path's gradient, in float32: exp(v - lse) * inv =
 * exp(v - m) * (inv / s), so each value costs one expf (CUDA's, within
 * 2 ulps; not __expf) and no double operation or conversion (a conversion
 * runs at a quarter of the double rate on sm_90, and with ce_grad's exp the
 * double work was the kernel's time). d = v - m is exact but where v or m
 * is tiny beside the other (both bfloat16: d needs 24 bits unless their
 * exponents lie far apart); its rounding error t, from the two-sum, is put
 * back as e * (1 + t) (t <= 2^-17, t^2 negligible). Against the double
 * formula's exact value g: relative error at most expf's 2 ulps (2^-22)
 * plus c's, the product's and the correction's roundings (2^-24 each):
 * |g' - g| <= 7 * 2^-24 |g|, plus 2^-149 where g' is subnormal. The label's
 * value (exp(.) - 1 cancels: float would lose its low bits) and d below
 * CE_F32_DMIN take ce_grad itself: a branch, taken once a row or where a
 * logit is -inf or NaN, so the warps almost never diverge. */
__device__ static inline float ce_grad_f32(float v, const ce_row &w, bool hot, const double *tab)
{
    const float d = __fsub_rn(v, w.m);
    if (hot || !(d >= CE_F32_DMIN)) return ce_grad(v, w.lse, hot, w.inv, tab);
    const float b = __fsub_rn(d, v); /* two-sum of v and -m: t = (v + -m) - d exactly */
    const float t = __fadd_rn(__fsub_rn(v, __fsub_rn(d, b)), __fsub_rn(-w.m, b));
    const float p = __fmul_rn(expf(d), w.c);
    return t == 0.0f ? p : fmaf(p, t, p);
}

/* The gradient value for storage T: float32 keeps ce_grad's double
 * formula and bits; bfloat16 takes ce_grad_f32, whose float lies within
 * 7 * 2^-24 relative of ce_grad's, so that one bfloat16 rounding of the two
 * agrees but where the value lies that close to a rounding boundary. */
__device__ static inline float ce_grad_t(float, float v, const ce_row &w, bool hot, const double *tab)
{
    return ce_grad(v, w.lse, hot, w.inv, tab);
}
__device__ static inline float ce_grad_t(bf16_bits, float v, const ce_row &w, bool hot, const double *tab)
{
    return ce_grad_f32(v, w, hot, tab);
}

#define CE_ROW_THREADS 256 /* at most; fewer for short rows */
#ifndef CE_U
#define CE_U 2 /* chunks (or 2 * CE_U scalars) per thread and group; float32 on an H200,
                  [8, 1024, 50304]: 2 (78 registers) 1.78 ms, 4 (128) 1.94 ms */
#endif
/* Groups whose chunks are loaded at once, while the previous ones'
 * exponentials are computed: two for bfloat16, whose chunks are half the
 * bytes, so that a thread keeps as many bytes in flight (4 x 8) as float32
 * does (2 x 16). The groups, and their order, are float32's: only how far
 * ahead they are loaded differs. */
template <typename T> struct ce_ahead {
    enum { N = sizeof(T) == 2 ? 2 : 1 };
};

/* How a block-per-row launch splits a row over its threads:
 *   CE_VALUES  thread t takes values t, t + bd, ..., 2 * CE_U per group;
 *   CE_CHUNKS  (S == 1, C % 4 == 0) thread t takes chunks t, t + bd, ...,
 *              CE_U per group.
 * The split fixes the order of the (max, sum) folds, so float32 and
 * bfloat16 choose it alike: a bfloat16 row gets float32's split of its
 * widened copy (which is 16-byte aligned: the executor's staging), and with
 * it the same loss and gradient bits. */
enum { CE_VALUES, CE_CHUNKS };

/* The row's gradient, 16 bytes (io<T>::WIDE values) at a time (S == 1,
 * C % WIDE == 0, x and g 16-byte aligned), the next group's loads in
 * flight while a group's gradients are computed. Each value's gradient
 * depends on it, lse and the label alone, so any split gives the same bits. */
template <typename T>
__device__ static void ce_grad_wide(const T *x, T *g, int64_t C, int64_t y, const ce_row &w, const double *tab)
{
    typedef typename io<T>::wide W;
    const int K = io<T>::WIDE;
    const W *xw = reinterpret_cast<const W *>(x);
    W *gw = reinterpret_cast<W *>(g);
    const int64_t nw = C / K, bd = blockDim.x;
    W q[CE_U];
#pragma unroll
    for (int u = 0; u < CE_U; u++) {
        const int64_t j = threadIdx.x + u * bd;
        if (j < nw) q[u] = xw[j];
    }
    for (int64_t j0 = threadIdx.x; j0 < nw; j0 += CE_U * bd) {
        W cur[CE_U];
#pragma unroll
        for (int u = 0; u < CE_U; u++) cur[u] = q[u];
#pragma unroll
        for (int u = 0; u < CE_U; u++) {
            const int64_t j = j0 + (CE_U + u) * bd;
            if (j < nw) q[u] = xw[j];
        }
#pragma unroll
        for (int u = 0; u < CE_U; u++) {
            const int64_t j = j0 + u * bd;
            if (j < nw) {
                float v[K];
                widen(cur[u], v);
#pragma unroll
                for (int k = 0; k < K; k++) v[k] = ce_grad_t(T(), v[k], w, j * K + k == y, tab);
                narrow(v, gw[j]);
            }
        }
    }
}

/* One block per row (blocks loop over rows), classes `S` apart, the split
 * SPLIT (above). Pass 1 takes the row's max and sum of exponentials in one
 * read, pass 2 writes the gradient (a second read, partly from L2).
 * bfloat16: four blocks of 256 threads on an SM (64 registers, no spills:
 * 50% occupancy; at 96 registers it was 25%, and latency-bound). */
template <typename T, int SPLIT>
__global__ void __launch_bounds__(CE_ROW_THREADS, sizeof(T) == 2 ? 4 : 1) ce_rows_kernel(const ce_args a)
{
    typedef typename io<T>::chunk Q;
    const int AH = ce_ahead<T>::N;
    __shared__ float shm[32];
    __shared__ double shs[32];
    __shared__ double sh_lse;
    __shared__ float sh_m, sh_c;
    __shared__ double tab[GP_FAST_EXP_TABLE];
    gp_fast_exp_load(tab);
    __syncthreads();
    const int64_t C = a.C, S = a.S, C4 = C >> 2, bd = blockDim.x;
    const bool wide = SPLIT == CE_CHUNKS && a.wide;
    double acc = 0.0; /* thread 0's: the block's rows in order */
    for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
        const int64_t o = r / S, i = r - o * S;
        const T *x = (const T *)a.x + o * C * S + i;
        T *g = a.dx ? (T *)a.dx + o * C * S + i : NULL;
        const int64_t y = a.labels[r]; /* the same in every thread: the branches are uniform */
        if (y == a.ignore) {
            if (g) {
                if (wide) {
                    typedef typename io<T>::wide W;
                    W z;
                    const float zeros[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                    narrow(zeros, z);
                    for (int64_t j = threadIdx.x; j < C / io<T>::WIDE; j += bd) reinterpret_cast<W *>(g)[j] = z;
                } else {
                    for (int64_t c = threadIdx.x; c < C; c += bd) st_el(g, c * S, 0.0f);
                }
            }
            continue;
        }
        float m = -INFINITY;
        double s = 0.0;
        if (SPLIT == CE_CHUNKS) {
            /* the next AH groups' loads are in flight while these ones'
             * exponentials are computed */
            Q q[AH * CE_U];
#pragma unroll
            for (int u = 0; u < AH * CE_U; u++) load_chunk(q[u], x, threadIdx.x + u * bd, C4, a.vec);
            for (int64_t j0 = threadIdx.x; j0 < C4; j0 += AH * CE_U * bd) {
                Q cur[AH * CE_U];
#pragma unroll
                for (int u = 0; u < AH * CE_U; u++) cur[u] = q[u];
#pragma unroll
                for (int u = 0; u < AH * CE_U; u++) load_chunk(q[u], x, j0 + (AH * CE_U + u) * bd, C4, a.vec);
#pragma unroll
                for (int h = 0; h < AH; h++) {
                    float v[4 * CE_U];
#pragma unroll
                    for (int u = 0; u < CE_U; u++) widen(cur[h * CE_U + u], v + 4 * u);
                    ms_of(T(), v, m, s, tab);
                }
            }
        } else {
            for (int64_t c0 = threadIdx.x; c0 < C; c0 += 2 * CE_U * bd) {
                float v[2 * CE_U];
#pragma unroll
                for (int u = 0; u < 2 * CE_U; u++) {
                    const int64_t c = c0 + u * bd;
                    v[u] = c < C ? ld_el(x, c * S) : -INFINITY;
                }
                ms_of(T(), v, m, s, tab);
            }
        }
        block_ms(m, s, shm, shs, tab);
        if (threadIdx.x == 0) {
            /* the CPU's exp(x - m) is exp(inf - inf) = NaN at the maximum
             * when that is infinite (or all logits are -inf) */
            if (isinf(m)) s = NAN;
            const double lse = (double)m + log(s);
            sh_lse = lse;
            if (sizeof(T) == 2) { /* ce_grad_f32's; float32 has no use for them */
                sh_m = m;
                sh_c = (float)(a.inv / s);
            }
            acc += (y >= 0 && y < C) ? lse - (double)ld_el(x, y * S) : (double)NAN;
        }
        __syncthreads();
        const ce_row w = {sh_lse, a.inv, sh_m, sh_c};
        if (g) {
            if (wide)
                ce_grad_wide(x, g, C, y, w, tab);
            else
                for (int64_t c = threadIdx.x; c < C; c += bd)
                    st_el(g, c * S, ce_grad_t(T(), ld_el(x, c * S), w, c == y, tab));
        }
        /* block_ms's first barrier keeps sh_lse, sh_m, sh_c until every
         * thread has read them */
    }
    if (threadIdx.x == 0) a.part[blockIdx.x] = acc;
}

/* One thread per row, classes S apart (S > 1: neighbouring threads read
 * neighbouring addresses). The CPU's loops, term for term. */
template <typename T>
__global__ void __launch_bounds__(LOSS_THREADS) ce_cols_kernel(const ce_args a)
{
    __shared__ double sh[32];
    __shared__ double tab[GP_FAST_EXP_TABLE];
    gp_fast_exp_load(tab);
    __syncthreads();
    const int64_t C = a.C, S = a.S;
    double acc = 0.0;
    GP_GRID_STRIDE(r, a.rows) {
        const int64_t o = r / S, i = r - o * S;
        const T *x = (const T *)a.x + o * C * S + i;
        T *g = a.dx ? (T *)a.dx + o * C * S + i : NULL;
        const int64_t y = a.labels[r];
        if (y == a.ignore) {
            if (g)
                for (int64_t c = 0; c < C; c++) st_el(g, c * S, 0.0f);
            continue;
        }
        double m = ld_el(x, 0);
        for (int64_t c = 1; c < C; c++)
            if (ld_el(x, c * S) > m) m = ld_el(x, c * S);
        double se = 0.0;
        for (int64_t c = 0; c < C; c++) se += gp_fast_exp((double)ld_el(x, c * S) - m, tab);
        const double lse = m + log(se);
        acc += (y >= 0 && y < C) ? lse - (double)ld_el(x, y * S) : (double)NAN;
        /* m is a float's value; se >= 1 (or NaN) as block_ms's s */
        const ce_row w = {lse, a.inv, (float)m, sizeof(T) == 2 ? (float)(a.inv / se) : 0.0f};
        if (g)
            for (int64_t c = 0; c < C; c++) st_el(g, c * S, ce_grad_t(T(), ld_el(x, c * S), w, c == y, tab));
    }
    acc = gp_dev_block_sum0(acc, sh);
    if (threadIdx.x == 0) a.part[blockIdx.x] = acc;
}

static bool aligned_to(const void *p, uintptr_t n) { return ((uintptr_t)p & (n - 1)) == 0; }

/* The launch for storage T (one kernel and the partials' sum). */
template <typename T>
static gp_status ce_launch(cudaStream_t stream, const char *fn, ce_args a, double *loss_sum, struct gp_error *err)
{
    const bool bf16 = sizeof(T) == 2;
    unsigned blocks;
    if (a.S > 1 && (a.rows >= 16384 || a.C <= 256)) {
        blocks = loss_blocks(a.rows);
        ce_cols_kernel<T><<<blocks, LOSS_THREADS, 0, stream>>>(a);
        GP_TRY(gp_cuda_launched(fn, bf16 ? "ce_cols_kernel<bf16>" : "ce_cols_kernel", err));
    } else {
        /* float32: chunks when the rows allow 16-byte loads and stores
         * (as before bfloat16 storage read itself); bfloat16: whenever its
         * widened copy would take them (S == 1, C % 4 == 0), by 8-byte
         * loads when the rows are 8-byte aligned (a row is C % 4 == 0
         * values after the tensor's start), else by scalar ones; the
         * gradient by 16-byte runs when those fit (C % 8 == 0, both tensors
         * 16-byte aligned), else value by value. */
        bool chunks = a.S == 1 && a.C % 4 == 0;
        if (bf16) {
            a.vec = aligned_to(a.x, 8);
            a.wide = a.C % 8 == 0 && aligned_to(a.x, 16) && (!a.dx || aligned_to(a.dx, 16));
        } else {
            chunks = chunks && aligned_to(a.x, 16) && (!a.dx || aligned_to(a.dx, 16));
            a.vec = a.wide = true;
        }
        const int64_t items = chunks ? a.C / 4 : a.C;
        int threads = 32; /* about 16 items a thread or more */
        while (threads < CE_ROW_THREADS && (int64_t)threads * 16 < items) threads *= 2;
        blocks = (unsigned)(a.rows < 1 ? 1 : a.rows > LOSS_PARTIALS ? LOSS_PARTIALS : a.rows);
        if (chunks) {
            ce_rows_kernel<T, CE_CHUNKS><<<blocks, threads, 0, stream>>>(a);
            GP_TRY(gp_cuda_launched(fn, bf16 ? "ce_rows_kernel<bf16, chunks>" : "ce_rows_kernel<vec>", err));
        } else {
            ce_rows_kernel<T, CE_VALUES><<<blocks, threads, 0, stream>>>(a);
            GP_TRY(gp_cuda_launched(fn, bf16 ? "ce_rows_kernel<bf16>" : "ce_rows_kernel", err));
        }
    }
    return finish_loss(stream, fn, a.part, blocks, loss_sum, err);
}

/* float32 or bfloat16, named for errors; anything else refused. */
static gp_status check_storage(const char *fn, enum gp_dtype dtype, struct gp_error *err)
{
    if (dtype == GP_DTYPE_FLOAT32 || dtype == GP_DTYPE_BFLOAT16) return GP_OK;
    return gp_error_set(err, GP_ERR_UNSUPPORTED, "%s: output stored as %s (float32 or bfloat16 only)", fn,
                        gp_dtype_name(dtype));
}

extern "C" gp_status gp_cuda_cross_entropy(cudaStream_t stream, const void *logits, enum gp_dtype dtype,
                                           const struct gp_shape *shape, int class_axis,
                                           const int64_t *labels, int64_t ignore_index,
                                           double denominator, void *dlogits, double *loss_sum,
                                           void *scratch, struct gp_error *err)
{
    static const char fn[] = "gp_cuda_cross_entropy";
    GP_TRY(check_loss_args(fn, denominator, loss_sum, scratch, err));
    GP_TRY(check_storage(fn, dtype, err));
    char buf[256];
    int axis = class_axis < 0 ? class_axis + shape->rank : class_axis;
    if (shape->rank < 1 || axis < 0 || axis >= shape->rank)
        return gp_error_set(err, GP_ERR_INVALID, "%s: class axis %d does not fit logits %s", fn,
                            class_axis, gp_shape_format(shape, buf, sizeof buf));
    ce_args a;
    memset(&a, 0, sizeof a);
    a.x = logits;
    a.labels = labels;
    a.dx = dlogits;
    a.part = (double *)scratch;
    a.C = shape->dims[axis];
    a.S = 1;
    int64_t outer = 1;
    for (int d = 0; d < axis; d++) outer *= shape->dims[d];
    for (int d = axis + 1; d < shape->rank; d++) a.S *= shape->dims[d];
    a.rows = outer * a.S;
    a.ignore = ignore_index;
    a.inv = 1.0 / denominator;
    if (a.rows > 0 && a.C < 1)
        return gp_error_set(err, GP_ERR_SHAPE, "%s: the class axis of logits %s has no classes", fn,
                            gp_shape_format(shape, buf, sizeof buf));
    if (a.rows > 0 && (!logits || !labels))
        return gp_error_set(err, GP_ERR_INVALID, "%s: no %s", fn, logits ? "labels" : "logits");
    if (dtype == GP_DTYPE_BFLOAT16) return ce_launch<bf16_bits>(stream, fn, a, loss_sum, err);
    return ce_launch<float>(stream, fn, a, loss_sum, err);
}

/* ---- mse, output loss ----
 * pred and out (and their gradients) float32 or bfloat16 (T), targets
 * float32. VEC: chunks of 4 (16-byte float4, or 8-byte loads of
 * bfloat16; targets float4), as float32's when every pointer is aligned to
 * its chunk; the same grid and split for both storages, so a bfloat16
 * output gives its aligned widened copy's sums. */

__device__ static inline double sq_term(double s, float p, float t)
{
    const double d = (double)p - (double)t;
    return s + d * d;
}

__device__ static inline float mse_grad(float scale, float p, float t)
{
    return __fmul_rn(scale, __fsub_rn(p, t));
}

__device__ static inline void narrow(const float *v, uint2 &q)
{
    q = make_uint2(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]));
}

/* The n % 4 tail goes to the grid's first threads. */
template <typename T, bool VEC>
__global__ void __launch_bounds__(LOSS_THREADS) mse_kernel(const T *pred, const float *target, int64_t n,
                                                           float scale, T *dpred, double *part)
{
    typedef typename io<T>::chunk Q;
    __shared__ double sh[32];
    double s = 0.0;
    int64_t done = 0;
    if (VEC) {
        const float4 *t4 = reinterpret_cast<const float4 *>(target);
        const int64_t n4 = n >> 2;
        GP_GRID_STRIDE(j, n4) {
            Q q;
            load_chunk(q, pred, j, n4, true);
            float p[4], t[4], g[4];
            widen(q, p);
            widen(t4[j], t);
#pragma unroll
            for (int k = 0; k < 4; k++) s = sq_term(s, p[k], t[k]);
            if (dpred) {
#pragma unroll
                for (int k = 0; k < 4; k++) g[k] = mse_grad(scale, p[k], t[k]);
                narrow(g, reinterpret_cast<Q *>(dpred)[j]);
            }
        }
        done = n4 << 2;
    }
    GP_GRID_STRIDE(k, n - done) {
        const int64_t i = done + k;
        const float p = ld_el(pred, i);
        s = sq_term(s, p, target[i]);
        if (dpred) st_el(dpred, i, mse_grad(scale, p, target[i]));
    }
    s = gp_dev_block_sum0(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

template <typename T>
static void mse_launch(cudaStream_t stream, bool vec, unsigned blocks, const void *pred, const float *target,
                       int64_t n, float scale, void *dpred, double *part)
{
    if (vec)
        mse_kernel<T, true><<<blocks, LOSS_THREADS, 0, stream>>>((const T *)pred, target, n, scale, (T *)dpred, part);
    else
        mse_kernel<T, false><<<blocks, LOSS_THREADS, 0, stream>>>((const T *)pred, target, n, scale, (T *)dpred, part);
}

extern "C" gp_status gp_cuda_mse_loss(cudaStream_t stream, const void *pred, enum gp_dtype dtype, const float *target,
                                      int64_t n, double denominator, void *dpred, double *loss_sum, void *scratch,
                                      struct gp_error *err)
{
    static const char fn[] = "gp_cuda_mse_loss";
    GP_TRY(check_loss_args(fn, denominator, loss_sum, scratch, err));
    GP_TRY(check_storage(fn, dtype, err));
    if (n < 0) return gp_error_set(err, GP_ERR_INVALID, "%s: negative element count %lld", fn, (long long)n);
    /* the CPU's (float)(2.0 / denominator) */
    const float scale = (float)(2.0 / denominator);
    const bool bf16 = dtype == GP_DTYPE_BFLOAT16;
    const uintptr_t chunk = bf16 ? 8 : 16;
    const bool vec = aligned_to(pred, chunk) && aligned_to(target, 16) && (!dpred || aligned_to(dpred, chunk));
    const unsigned blocks = loss_blocks(vec ? n / 4 : n);
    if (bf16)
        mse_launch<bf16_bits>(stream, vec, blocks, pred, target, n, scale, dpred, (double *)scratch);
    else
        mse_launch<float>(stream, vec, blocks, pred, target, n, scale, dpred, (double *)scratch);
    GP_TRY(gp_cuda_launched(fn, vec ? "mse_kernel<vec>" : "mse_kernel", err));
    return finish_loss(stream, fn, (const double *)scratch, blocks, loss_sum, err);
}

/* dout = gv everywhere (gv already in T's values: a bfloat16 gradient
 * holds gv rounded once). */
template <typename T, bool VEC>
__global__ void __launch_bounds__(LOSS_THREADS) output_loss_kernel(const T *out, int64_t n, float gv, T *dout,
                                                                   double *part)
{
    typedef typename io<T>::chunk Q;
    __shared__ double sh[32];
    double s = 0.0;
    int64_t done = 0;
    if (VEC) {
        const int64_t n4 = n >> 2;
        const float gs[4] = {gv, gv, gv, gv};
        Q gq;
        narrow(gs, gq);
        GP_GRID_STRIDE(j, n4) {
            Q q;
            load_chunk(q, out, j, n4, true);
            float v[4];
            widen(q, v);
            s += (double)v[0];
            s += (double)v[1];
            s += (double)v[2];
            s += (double)v[3];
            if (dout) reinterpret_cast<Q *>(dout)[j] = gq;
        }
        done = n4 << 2;
    }
    GP_GRID_STRIDE(k, n - done) {
        const int64_t i = done + k;
        s += (double)ld_el(out, i);
        if (dout) st_el(dout, i, gv);
    }
    s = gp_dev_block_sum0(s, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

template <typename T>
static void output_loss_launch(cudaStream_t stream, bool vec, unsigned blocks, const void *out, int64_t n, float gv,
                               void *dout, double *part)
{
    if (vec)
        output_loss_kernel<T, true><<<blocks, LOSS_THREADS, 0, stream>>>((const T *)out, n, gv, (T *)dout, part);
    else
        output_loss_kernel<T, false><<<blocks, LOSS_THREADS, 0, stream>>>((const T *)out, n, gv, (T *)dout, part);
}

extern "C" gp_status gp_cuda_output_loss(cudaStream_t stream, const void *out, enum gp_dtype dtype, int64_t n,
                                         double denominator, void *dout, double *loss_sum, void *scratch,
                                         struct gp_error *err)
{
    static const char fn[] = "gp_cuda_output_loss";
    GP_TRY(check_loss_args(fn, denominator, loss_sum, scratch, err));
    GP_TRY(check_storage(fn, dtype, err));
    if (n < 0) return gp_error_set(err, GP_ERR_INVALID, "%s: negative element count %lld", fn, (long long)n);
    const float gv = (float)(1.0 / denominator);
    const bool bf16 = dtype == GP_DTYPE_BFLOAT16;
    const uintptr_t chunk = bf16 ? 8 : 16;
    const bool vec = aligned_to(out, chunk) && (!dout || aligned_to(dout, chunk));
    const unsigned blocks = loss_blocks(vec ? n / 4 : n);
    if (bf16)
        output_loss_launch<bf16_bits>(stream, vec, blocks, out, n, gv, dout, (double *)scratch);
    else
        output_loss_launch<float>(stream, vec, blocks, out, n, gv, dout, (double *)scratch);
    GP_TRY(gp_cuda_launched(fn, vec ? "output_loss_kernel<vec>" : "output_loss_kernel", err));
    return finish_loss(stream, fn, (const double *)scratch, blocks, loss_sum, err);
}
