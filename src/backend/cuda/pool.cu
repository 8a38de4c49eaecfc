/* CUDA kernels: the pool family, twin of backend/cpu/pool.c: MaxPool,
 * AveragePool, GlobalAveragePool and GlobalMaxPool, forward and backward.
 *
 * Own kernels, no cuDNN: each output cell is one thread that visits its
 * window's taps in the CPU's order with the CPU's rules (the first maximum
 * in scan order, a NaN winning; the same float sum and divisor), so forward
 * results equal the CPU's bit for bit. Backward gathers rather than
 * scatters: each input cell is one thread that visits the output cells
 * whose windows hold it, in increasing order, and adds their contributions
 * one after another, as the CPU's loop over output cells adds them; no
 * atomics, and the same bits as the CPU. MaxPool's forward keeps each
 * window's argmax in saved memory for its backward: an int32 offset within
 * the plane or, asked for, the tap's index within the window in a byte,
 * where the window has at most 255 taps (argmax_keep). Global pools use
 * a warp (small planes) or a block (large planes) per plane, partial sums
 * in double and a fixed reduction order.
 *
 * Index arithmetic is the kernels' cost (the data is read once): windowed
 * kernels are templates over the index type (int where every offset fits,
 * which is nearly always, int64_t otherwise) and over whether any dilation
 * exceeds 1 (without, a window's taps need no divisions).
 *
 * The window comes from gp_window_resolve, as in shape inference and the
 * CPU kernel; up to 3 spatial axes, fewer padded in front with axes of 1.
 *
 * bfloat16 (gp_cuda_kernel.bf16_any): X, Y, dY and dX may each be stored as
 * bfloat16 or float32, as ctx->*_dt says. Loads widen exactly, every
 * stored value is rounded once (to nearest even), and dX's float32 sum
 * starts from the widened old value: the float32 kernel on widened copies,
 * rounded back (the staged call, backend/mixed_call.h), at half the bytes.
 * The kernels are templates over IO, the storage of a launch's tensors,
 * chosen once on the host (io_kind_of): io_typed<float> (all float32: the
 * float32 code as it was), io_typed<__nv_bfloat16> (all bfloat16) or
 * io_mixed (each tensor's type read at run time, gp_fptr).
 *
 * Channels-last (gp_cuda_kernel.layout_native, ctx->in_nhwc / out_nhwc;
 * graph/layout.h): MaxPool over 2 spatial axes without Indices reads X and
 * writes Y as [N, H, W, C] when both lie so, its saved argmax (the same
 * in-plane offsets) then kept at Y's channels-last positions;
 * GlobalAveragePool reads X channels-last, Y ([N, C, 1, 1]) being the same
 * memory in either layout, and its backward adds to dX channels-last. A
 * thread takes a run of consecutive channels (up to 16 bytes of each
 * tensor per access where C and the pointers allow) and does for each
 * channel what the planar kernels do for its plane, in their order: the
 * same bits (GlobalAveragePool's forward sums in another fixed order,
 * within float32 rounding of the CPU's, as the planar one does). Any other
 * call with channels-last tensors gets [N, C, H, W] copies
 * (backend/mixed_call.h). */
#include <initializer_list>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/kernel_util.cuh"
#include "util/env.h"

extern "C" {
#include "ops/window.h"
}

/* ---- storage: act / set_act / add_act load, store and accumulate into
 * (one rounding) an element; ldg loads through the read-only cache. ---- */

__device__ static inline float ldg_of(const float *p) { return __ldg(p); }
__device__ static inline float ldg_of(const __nv_bfloat16 *p) { return __bfloat162float(__ldg(p)); }

template <typename A> struct io_typed {
    __device__ static float act(gp_fptr t, int64_t i) { return gp_load((const A *)t.p + i); }
    __device__ static float ldg(gp_fptr t, int64_t i) { return ldg_of((const A *)t.p + i); }
    __device__ static void set_act(gp_fptr t, int64_t i, float v) { gp_store((A *)t.p + i, v); }
    /* Values i .. i + VEC - 1 as one access (the channels-last kernels'
     * runs along C; i a multiple of VEC, nhwc_vec checked the alignment). */
    template <int VEC> __device__ static void run(gp_fptr t, int64_t i, float (&v)[VEC])
    {
        gp_run<A, VEC>::load(t.p, i, v);
    }
    template <int VEC> __device__ static void set_run(gp_fptr t, int64_t i, const float (&v)[VEC])
    {
        gp_run<A, VEC>::store(t.p, i, v);
    }
};

struct io_mixed {
    __device__ static float act(gp_fptr t, int64_t i) { return gp_ld(t, i); }
    __device__ static float ldg(gp_fptr t, int64_t i) { return gp_ld(t, i); }
    __device__ static void set_act(gp_fptr t, int64_t i, float v) { gp_st(t, i, v); }
    /* One value at a time (the run-time typed path takes runs of 1). */
    template <int VEC> __device__ static void run(gp_fptr t, int64_t i, float (&v)[VEC])
    {
#pragma unroll
        for (int k = 0; k < VEC; k++) v[k] = gp_ld(t, i + k);
    }
    template <int VEC> __device__ static void set_run(gp_fptr t, int64_t i, const float (&v)[VEC])
    {
#pragma unroll
        for (int k = 0; k < VEC; k++) gp_st(t, i + k, v[k]);
    }
};

enum io_kind { IO_F32, IO_BF16, IO_MIXED };

/* The storage of a launch that reads or writes `ts` (absent ones, p NULL,
 * do not count). */
static enum io_kind io_kind_of(std::initializer_list<gp_fptr> ts)
{
    bool b16 = false, f32 = false;
    for (const gp_fptr &t : ts)
        if (t.p) (t.bf16 ? b16 : f32) = true;
    return b16 && f32 ? IO_MIXED : b16 ? IO_BF16 : IO_F32;
}

/* Runs the statement(s) with IO the storage `kind` names. */
#define IO_DISPATCH(kind, ...)                                                        \
    do {                                                                              \
        if ((kind) == IO_F32) {                                                       \
            typedef io_typed<float> IO;                                               \
            __VA_ARGS__;                                                              \
        } else if ((kind) == IO_BF16) {                                               \
            typedef io_typed<__nv_bfloat16> IO;                                       \
            __VA_ARGS__;                                                              \
        } else {                                                                      \
            typedef io_mixed IO;                                                      \
            __VA_ARGS__;                                                              \
        }                                                                             \
    } while (0)

#define MAX_AXES 3

/* The window over exactly 3 spatial axes: output cell o's taps read input
 * cells o * s - p + t * d, t < k; cells outside [0, in) are padding. */
template <typename I> struct pool_plan {
    I planes; /* N * C */
    I in[MAX_AXES], out[MAX_AXES];
    I k[MAX_AXES], s[MAX_AXES], d[MAX_AXES], p[MAX_AXES], pad_end[MAX_AXES];
    I in_size, out_size;
};

/* The node's window in int64_t, and whether int indices suffice: every
 * cell index of X and Y, and every tap position o * s - p + t * d (at most
 * the padded input plus a window), far from INT_MAX. */
static gp_status pool_plan_init(const struct gp_cuda_ctx *c, pool_plan<int64_t> *pp, bool *small,
                                bool *dilated, struct gp_error *err)
{
    const struct gp_value *x = gp_cuda_in_value(c, 0);
    struct gp_infer_ctx ic = {(struct gp_graph *)c->graph, (struct gp_node *)c->node, err};
    struct gp_window w;
    GP_TRY(gp_window_resolve(&ic, GP_WINDOW_POOL, &x->shape, NULL, &w));
    if (w.n_spatial > MAX_AXES)
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED,
                             "the CUDA backend pools over up to %d spatial axes, not %d", MAX_AXES,
                             w.n_spatial);
    if (x->dtype != GP_DTYPE_FLOAT32)
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "the CUDA backend pools float32 tensors, not %s",
                             gp_dtype_name(x->dtype));
    memset(pp, 0, sizeof *pp);
    pp->planes = x->shape.dims[0] * x->shape.dims[1];
    pp->in_size = pp->out_size = 1;
    *dilated = false;
    *small = true;
    const int64_t lim = INT_MAX / 4;
    int lead = MAX_AXES - w.n_spatial;
    for (int i = 0; i < MAX_AXES; i++) {
        int j = i - lead;
        bool ax = j >= 0;
        pp->in[i] = ax ? w.in[j] : 1;
        pp->out[i] = ax ? w.out[j] : 1;
        pp->k[i] = ax ? w.kernel[j] : 1;
        pp->s[i] = ax ? w.stride[j] : 1;
        pp->d[i] = ax ? w.dilation[j] : 1;
        pp->p[i] = ax ? w.pad_begin[j] : 0;
        pp->pad_end[i] = ax ? w.pad_end[j] : 0;
        pp->in_size *= pp->in[i];
        pp->out_size *= pp->out[i];
        if (pp->d[i] != 1) *dilated = true;
        int64_t extent = (pp->k[i] - 1) * pp->d[i] + 1;
        if (pp->in[i] + pp->p[i] + pp->pad_end[i] + extent + pp->s[i] > lim) *small = false;
    }
    if (pp->planes * pp->in_size > lim || pp->planes * pp->out_size > lim) *small = false;
    return GP_OK;
}

template <typename I> static pool_plan<I> plan_as(const pool_plan<int64_t> &p)
{
    pool_plan<I> q;
    q.planes = (I)p.planes;
    q.in_size = (I)p.in_size;
    q.out_size = (I)p.out_size;
    for (int i = 0; i < MAX_AXES; i++) {
        q.in[i] = (I)p.in[i];
        q.out[i] = (I)p.out[i];
        q.k[i] = (I)p.k[i];
        q.s[i] = (I)p.s[i];
        q.d[i] = (I)p.d[i];
        q.p[i] = (I)p.p[i];
        q.pad_end[i] = (I)p.pad_end[i];
    }
    return q;
}

#define POOL_GRID_STRIDE(I, e, n)                                                                 \
    for (I e = (I)(blockIdx.x * blockDim.x + threadIdx.x); e < (n); e += (I)(gridDim.x * blockDim.x))

/* Along axis a, the taps of output cell o: the first inside the input
 * (*t0), one past the last (*t1), and how many lie inside the padded input
 * (*padded); the CPU's taps(). Without dilations the divisions by d are
 * divisions by 1, left out. */
template <typename I, bool DIL>
__device__ static inline void taps(const pool_plan<I> &pp, int a, I o, I *t0, I *t1, I *padded)
{
    I start = o * pp.s[a] - pp.p[a], k = pp.k[a];
    I lo, hi, hp;
    if (DIL) {
        I d = pp.d[a];
        lo = start >= 0 ? 0 : (-start + d - 1) / d;
        hi = pp.in[a] - start <= 0 ? 0 : (pp.in[a] - start + d - 1) / d;
        hp = pp.in[a] + pp.pad_end[a] - start <= 0 ? 0 : (pp.in[a] + pp.pad_end[a] - start + d - 1) / d;
    } else {
        lo = start >= 0 ? 0 : -start;
        hi = pp.in[a] - start <= 0 ? 0 : pp.in[a] - start;
        hp = pp.in[a] + pp.pad_end[a] - start <= 0 ? 0 : pp.in[a] + pp.pad_end[a] - start;
    }
    if (hi > k) hi = k;
    if (hp > k) hp = k;
    if (lo > hi) lo = hi;
    *t0 = lo;
    *t1 = hi;
    *padded = hp;
}

/* Cell r of a plane of dims n -> its coordinates. */
template <typename I> __device__ static inline void coords(const I *n, I r, I *c)
{
    I q = r / n[2];
    c[2] = r - q * n[2];
    c[0] = q / n[1];
    c[1] = q - c[0] * n[1];
}

/* Along axis a, the output cells whose windows may hold input cell i:
 * [*lo, *hi] (inclusive; empty when lo > hi); with dilations each must be
 * checked for a tap landing exactly on i. */
template <typename I>
__device__ static inline void holders(const pool_plan<I> &pp, int a, I i, I *lo, I *hi)
{
    I top = i + pp.p[a];                   /* o * s + t * d == top */
    I low = top - (pp.k[a] - 1) * pp.d[a]; /* the last tap */
    *lo = low <= 0 ? 0 : (low + pp.s[a] - 1) / pp.s[a];
    I h = top / pp.s[a];
    *hi = h < pp.out[a] - 1 ? h : pp.out[a] - 1;
}

/* Whether output cell o along axis a has a tap on input cell i (always,
 * within holders' range, without dilations). */
template <typename I, bool DIL>
__device__ static inline bool tap_on(const pool_plan<I> &pp, int a, I o, I i)
{
    if (!DIL) return true;
    I rem = i + pp.p[a] - o * pp.s[a];
    return rem >= 0 && rem % pp.d[a] == 0 && rem / pp.d[a] < pp.k[a];
}

/* ---- MaxPool ---- */

/* How the forward keeps a window's argmax for the backward (maxpool_saved):
 * T = unsigned char, the tap's index within the window, (t0 k1 + t1) k2
 * + t2 (255: no input cell), where the window has at most 255 taps,
 * unless GP_MAXPOOL_BYTE_ARGMAX=0 (argmax_in_bytes: ResNet's stem's 3 x 3
 * pool keeps 24.5 MiB at batch 128, where an int32 keeps 98); else
 * T = int, the input cell's offset within the plane (-1: none). key()
 * is what a window o keeps when its argmax is input cell i (coordinates;
 * r its offset), or -1 where no tap of o lands on i (a dilated window's
 * gaps), which no kept value equals; the backward compares. */
template <typename T> struct argmax_keep;

template <> struct argmax_keep<int> {
    template <typename I> __device__ static int kept(I idx, I tap)
    {
        (void)tap;
        return (int)idx;
    }
    template <typename I, bool DIL>
    __device__ static int key(const pool_plan<I> &pp, I o0, I o1, I o2, const I *i, I r)
    {
        (void)pp, (void)o0, (void)o1, (void)o2, (void)i;
        return (int)r;
    }
};

template <> struct argmax_keep<unsigned char> {
    template <typename I> __device__ static unsigned char kept(I idx, I tap)
    {
        return idx < 0 ? (unsigned char)255 : (unsigned char)tap;
    }
    template <typename I, bool DIL>
    __device__ static int key(const pool_plan<I> &pp, I o0, I o1, I o2, const I *i, I r)
    {
        (void)r;
        const I o[MAX_AXES] = {o0, o1, o2};
        int tap = 0;
#pragma unroll
        for (int a = 0; a < MAX_AXES; a++) {
            I rem = i[a] + pp.p[a] - o[a] * pp.s[a];
            if (DIL) {
                if (rem < 0 || rem % pp.d[a] != 0 || rem / pp.d[a] >= pp.k[a]) return -1;
                rem /= pp.d[a];
            }
            tap = tap * (int)pp.k[a] + (int)rem;
        }
        return tap;
    }
};

/* Bytes unless GP_MAXPOOL_BYTE_ARGMAX=0 (int32 offsets, the form before;
 * read at every call, so that one process can run both). The planner's
 * saved size and the calls must agree: set it before a pipeline is made,
 * not while it runs. */
static bool byte_argmax_on(void) { return gp_env_flag("GP_MAXPOOL_BYTE_ARGMAX", true); }

/* Whether the window's argmax is kept in a byte (argmax_keep). */
static bool argmax_in_bytes(const pool_plan<int64_t> &pp)
{
    return byte_argmax_on() && pp.k[0] * pp.k[1] * pp.k[2] <= 255;
}

/* The offset within the plane of the first maximum of output cell o, NaN
 * winning as in PyTorch; -1 when the window holds no input cell. *tap:
 * that cell's tap index within the window (argmax_keep). */
template <typename I, bool DIL, class IO>
__device__ static inline I window_argmax(const pool_plan<I> &pp, gp_fptr x, int64_t base, const I *o, I *tap)
{
    I a[MAX_AXES], b[MAX_AXES], unused;
    for (int i = 0; i < MAX_AXES; i++) taps<I, DIL>(pp, i, o[i], &a[i], &b[i], &unused);
    I best = -1, best_tap = -1;
    float max = -INFINITY;
    for (I t0 = a[0]; t0 < b[0]; t0++) {
        I i0 = o[0] * pp.s[0] - pp.p[0] + t0 * pp.d[0];
        for (I t1 = a[1]; t1 < b[1]; t1++) {
            I i1 = o[1] * pp.s[1] - pp.p[1] + t1 * pp.d[1];
            I row = (i0 * pp.in[1] + i1) * pp.in[2] + o[2] * pp.s[2] - pp.p[2];
            for (I t2 = a[2]; t2 < b[2]; t2++) {
                I idx = row + t2 * pp.d[2];
                float v = IO::ldg(x, base + idx);
                I t = (t0 * pp.k[1] + t1) * pp.k[2] + t2;
                if (best < 0) best = idx, best_tap = t;
                if (v > max || isnan(v)) {
                    max = v;
                    best = idx;
                    best_tap = t;
                }
            }
        }
    }
    *tap = best_tap;
    return best;
}

/* X -> Y, optional Indices (ONNX's offsets into the whole X, row-major or,
 * with col_major, column-major over the spatial axes), optional argmax
 * (saved, for backward). */
template <typename I, bool DIL, class IO, typename T>
__global__ static void maxpool_forward_kernel(pool_plan<I> pp, gp_fptr x, gp_fptr y, int64_t *__restrict__ ind,
                                              T *__restrict__ arg, bool col_major)
{
    POOL_GRID_STRIDE(I, e, pp.planes * pp.out_size)
    {
        I pl = e / pp.out_size, o[MAX_AXES];
        coords<I>(pp.out, e - pl * pp.out_size, o);
        int64_t base = (int64_t)pl * pp.in_size;
        I tap, best = window_argmax<I, DIL, IO>(pp, x, base, o, &tap);
        IO::set_act(y, e, best >= 0 ? IO::ldg(x, base + best) : -INFINITY);
        if (arg) arg[e] = argmax_keep<T>::kept(best, tap);
        if (ind) {
            int64_t v = -1;
            if (best >= 0) {
                int64_t b = best;
                if (col_major) {
                    I i[MAX_AXES];
                    coords<I>(pp.in, best, i);
                    b = ((int64_t)i[2] * pp.in[1] + i[1]) * pp.in[0] + i[0];
                }
                v = (int64_t)pl * pp.in_size + b;
            }
            ind[e] = v;
        }
    }
}

/* dX += dY at each window's maximum: each input cell sums, in increasing
 * order, the dY of the windows whose saved argmax is that cell. */
template <typename I, bool DIL, class IO, typename T>
__global__ static void maxpool_backward_kernel(pool_plan<I> pp, const T *__restrict__ arg, gp_fptr dy,
                                               gp_fptr dx)
{
    POOL_GRID_STRIDE(I, e, pp.planes * pp.in_size)
    {
        I pl = e / pp.in_size, r = e - pl * pp.in_size, i[MAX_AXES];
        coords<I>(pp.in, r, i);
        I lo[MAX_AXES], hi[MAX_AXES];
        for (int a = 0; a < MAX_AXES; a++) holders<I>(pp, a, i[a], &lo[a], &hi[a]);
        const T *ap = arg + (int64_t)pl * pp.out_size;
        int64_t dyb = (int64_t)pl * pp.out_size;
        float acc = IO::act(dx, e);
        for (I o0 = lo[0]; o0 <= hi[0]; o0++)
            for (I o1 = lo[1]; o1 <= hi[1]; o1++) {
                I row = (o0 * pp.out[1] + o1) * pp.out[2];
                for (I o2 = lo[2]; o2 <= hi[2]; o2++)
                    if ((int)__ldg(ap + row + o2) == argmax_keep<T>::template key<I, DIL>(pp, o0, o1, o2, i, r))
                        acc = __fadd_rn(acc, IO::ldg(dy, dyb + row + o2));
            }
        IO::set_act(dx, e, acc);
    }
}

/* ---- channels-last (ctx->in_nhwc, out_nhwc) ----
 *
 * A rank-4 tensor tagged channels-last lies as [N, H, W, C] for the
 * graph's [N, C, H, W] (graph/layout.h). The kernels below are the ones
 * above with the loops over a plane's cells kept and the channel moved
 * innermost: a thread takes a run of VEC consecutive channels of one cell
 * (one access of up to 16 bytes, gp_run) and does, for each channel of the
 * run, exactly what the planar kernel's thread does for that channel's
 * plane, in the same order. So results are the planar kernels' bit for bit
 * (GlobalAveragePool's forward: within its float32 rounding, below). Only
 * 2 spatial axes: the plan's axes 1 and 2 (axis 0 is 1). */

/* A run of VEC saved argmaxes (argmax_keep's T) as one access, beside a
 * run of Y. */
template <typename T, int VEC> struct arg_run {
    typedef typename gp_raw<(int)sizeof(T) * VEC>::t raw;
    union u {
        raw r;
        T a[VEC];
    };
    __device__ static void load(const T *p, int64_t i, int (&v)[VEC])
    {
        u x;
        x.r = *(const raw *)(p + i);
#pragma unroll
        for (int k = 0; k < VEC; k++) v[k] = (int)x.a[k];
    }
    __device__ static void store(T *p, int64_t i, const T (&v)[VEC])
    {
        u x;
#pragma unroll
        for (int k = 0; k < VEC; k++) x.a[k] = v[k];
        *(raw *)(p + i) = x.r;
    }
};

/* The run length along C: the longest of 8, 4, 2 channels that divides C
 * (so a run never leaves its cell) and whose bytes, at most 16, every
 * pointer given aligns (`tensors` of the launch's storage, `arg` the
 * saved argmax, of arg_size bytes each; NULL ones do not count); else 1,
 * and always 1 for the run-time typed path. Every run then starts at a
 * multiple of VEC. */
static int nhwc_vec(enum io_kind kind, int64_t ch, std::initializer_list<const void *> tensors, const void *arg,
                    size_t arg_size)
{
    if (kind == IO_MIXED) return 1;
    size_t elem = kind == IO_BF16 ? 2 : 4;
    for (int vec = (int)(16 / elem); vec > 1; vec /= 2) {
        if (ch % vec) continue;
        size_t ialign = arg_size * (size_t)vec > 16 ? 16 : arg_size * (size_t)vec;
        bool ok = !arg || (uintptr_t)arg % ialign == 0;
        for (const void *p : tensors)
            if (p && (uintptr_t)p % (elem * (size_t)vec)) ok = false;
        if (ok) return vec;
    }
    return 1;
}

/* Runs the statement(s) with IO the storage `kind` names and VEC the run
 * length `vec` (nhwc_vec: float32 4, 2, 1; bfloat16 8, 4, 2, 1; mixed 1)
 * as constants. */
#define NHWC_DISPATCH(kind, vec, ...)                                                 \
    do {                                                                              \
        if ((kind) == IO_F32) {                                                       \
            typedef io_typed<float> IO;                                               \
            if ((vec) == 4) {                                                         \
                const int VEC = 4;                                                    \
                __VA_ARGS__;                                                          \
            } else if ((vec) == 2) {                                                  \
                const int VEC = 2;                                                    \
                __VA_ARGS__;                                                          \
            } else {                                                                  \
                const int VEC = 1;                                                    \
                __VA_ARGS__;                                                          \
            }                                                                         \
        } else if ((kind) == IO_BF16) {                                               \
            typedef io_typed<__nv_bfloat16> IO;                                       \
            if ((vec) == 8) {                                                         \
                const int VEC = 8;                                                    \
                __VA_ARGS__;                                                          \
            } else if ((vec) == 4) {                                                  \
                const int VEC = 4;                                                    \
                __VA_ARGS__;                                                          \
            } else if ((vec) == 2) {                                                  \
                const int VEC = 2;                                                    \
                __VA_ARGS__;                                                          \
            } else {                                                                  \
                const int VEC = 1;                                                    \
                __VA_ARGS__;                                                          \
            }                                                                         \
        } else {                                                                      \
            typedef io_mixed IO;                                                      \
            const int VEC = 1;                                                        \
            __VA_ARGS__;                                                              \
        }                                                                             \
    } while (0)

/* X [N, H, W, C] -> Y [N, OH, OW, C], and the argmax (saved, for
 * backward). Thread e takes channels c0 .. c0 + VEC - 1 of output cell q
 * (e * VEC = q * C + c0, Y's and the argmax's channels-last offset) and
 * scans the window as window_argmax does, with its rule per channel: the
 * first maximum in scan order, a NaN winning. The argmax it keeps is the
 * planar kernel's value (argmax_keep), stored at Y's channels-last
 * position; the backward reads it there, so a call's forward and backward
 * must both run channels-last (maxpool_layout_native answers both alike). */
template <typename I, bool DIL, class IO, int VEC, typename T>
__global__ static void maxpool_nhwc_forward_kernel(pool_plan<I> pp, I ch, gp_fptr x, gp_fptr y,
                                                   T *__restrict__ arg)
{
    const I runs = ch / VEC, batch = pp.planes / ch;
    POOL_GRID_STRIDE(I, e, batch * pp.out_size * runs)
    {
        I q = e / runs, c0 = (e - q * runs) * VEC;
        I b = q / pp.out_size, cell = q - b * pp.out_size;
        I o1 = cell / pp.out[2], o2 = cell - o1 * pp.out[2];
        I a1, e1, a2, e2, unused;
        taps<I, DIL>(pp, 1, o1, &a1, &e1, &unused);
        taps<I, DIL>(pp, 2, o2, &a2, &e2, &unused);
        const I xb = b * pp.in_size;
        I best[VEC], tap[VEC];
        float max[VEC];
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            best[j] = tap[j] = -1;
            max[j] = -INFINITY;
        }
        for (I t1 = a1; t1 < e1; t1++) {
            I row = (o1 * pp.s[1] - pp.p[1] + t1 * pp.d[1]) * pp.in[2] + o2 * pp.s[2] - pp.p[2];
            for (I t2 = a2; t2 < e2; t2++) {
                I idx = row + t2 * pp.d[2];
                float v[VEC];
                IO::template run<VEC>(x, (int64_t)((xb + idx) * ch + c0), v);
                I t = t1 * pp.k[2] + t2; /* axis 0 has one tap */
#pragma unroll
                for (int j = 0; j < VEC; j++) {
                    if (best[j] < 0) best[j] = idx, tap[j] = t;
                    if (v[j] > max[j] || isnan(v[j])) {
                        max[j] = v[j];
                        best[j] = idx;
                        tap[j] = t;
                    }
                }
            }
        }
        /* max[j] is X at best[j] (the planar kernel reloads it): the
         * first tap sets best without max only when it is -inf. */
        float out[VEC];
        T keep[VEC];
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            out[j] = best[j] >= 0 ? max[j] : -INFINITY;
            keep[j] = argmax_keep<T>::kept(best[j], tap[j]);
        }
        IO::template set_run<VEC>(y, (int64_t)e * VEC, out);
        if (arg) arg_run<T, VEC>::store(arg, (int64_t)e * VEC, keep);
    }
}

/* dX += dY at each window's maximum, channels-last: thread e takes
 * channels c0 .. c0 + VEC - 1 of input cell r (e * VEC = its channels-last
 * offset) and visits the output cells whose windows may hold it in
 * increasing order (holders), adding, for each channel whose saved argmax
 * is r, that cell's dY: the planar kernel's sums in its order. */
template <typename I, bool DIL, class IO, int VEC, typename T>
__global__ static void maxpool_nhwc_backward_kernel(pool_plan<I> pp, I ch, const T *__restrict__ arg, gp_fptr dy,
                                                    gp_fptr dx)
{
    const I runs = ch / VEC, batch = pp.planes / ch;
    POOL_GRID_STRIDE(I, e, batch * pp.in_size * runs)
    {
        I q = e / runs, c0 = (e - q * runs) * VEC;
        I b = q / pp.in_size, r = q - b * pp.in_size;
        I i1 = r / pp.in[2], i2 = r - i1 * pp.in[2];
        const I i[MAX_AXES] = {0, i1, i2};
        I lo1, hi1, lo2, hi2;
        holders<I>(pp, 1, i1, &lo1, &hi1);
        holders<I>(pp, 2, i2, &lo2, &hi2);
        const I yb = b * pp.out_size;
        float acc[VEC];
        IO::template run<VEC>(dx, (int64_t)e * VEC, acc);
        for (I o1 = lo1; o1 <= hi1; o1++)
            for (I o2 = lo2; o2 <= hi2; o2++) {
                int64_t at = (int64_t)((yb + o1 * pp.out[2] + o2) * ch + c0);
                int a[VEC];
                arg_run<T, VEC>::load(arg, at, a);
                const int key = argmax_keep<T>::template key<I, DIL>(pp, 0, o1, o2, i, r);
                bool hit = false;
#pragma unroll
                for (int j = 0; j < VEC; j++) hit |= a[j] == key;
                if (!hit) continue; /* most windows: dY need not be read */
                float g[VEC];
                IO::template run<VEC>(dy, at, g);
#pragma unroll
                for (int j = 0; j < VEC; j++)
                    if (a[j] == key) acc[j] = __fadd_rn(acc[j], g[j]);
            }
        IO::template set_run<VEC>(dx, (int64_t)e * VEC, acc);
    }
}

/* MaxPool reads and writes channels-last itself over 2 spatial axes
 * without the Indices output, X and Y both channels-last (the layout
 * pass's MaxPool, graph/layout.h); every other call gets [N, C, H, W]
 * copies. Forward and backward are answered alike: the saved argmax lies
 * in the layout the forward ran in. */
static bool maxpool_layout_native(const struct gp_graph *g, const struct gp_node *node, uint32_t in_nhwc,
                                  uint32_t out_nhwc, bool backward)
{
    (void)backward;
    const struct gp_value *x = gp_node_input(g, node, 0), *y = gp_node_output(g, node, 0);
    bool indices = gp_node_output(g, node, 1) != NULL;
    return x && y && x->shape.rank == 4 && y->shape.rank == 4 && !indices && gp_cuda_nhwc(in_nhwc, 0) &&
           gp_cuda_nhwc(out_nhwc, 0);
}

/* Whether the call runs channels-last: X or Y tagged, which only a call
 * maxpool_layout_native accepted may be (anything else is refused rather
 * than read in the wrong layout). */
static gp_status maxpool_nhwc_call(const struct gp_cuda_ctx *c, bool *nhwc, struct gp_error *err)
{
    *nhwc = gp_cuda_nhwc(c->in_nhwc, 0) || gp_cuda_nhwc(c->out_nhwc, 0);
    if (*nhwc && !maxpool_layout_native(c->graph, c->node, c->in_nhwc, c->out_nhwc, false))
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED,
                             "MaxPool runs channels-last only over 2 spatial axes, without Indices, with X "
                             "and Y both channels-last");
    return GP_OK;
}

template <typename I, class IO, int VEC, typename T>
static void maxpool_nhwc_forward_launch(const struct gp_cuda_ctx *c, const pool_plan<int64_t> &p64, int64_t ch,
                                        bool dilated)
{
    pool_plan<I> pp = plan_as<I>(p64);
    unsigned blocks = gp_cuda_blocks_for(p64.planes * p64.out_size / VEC);
    gp_fptr x = gp_cuda_in_f(c, 0), y = gp_cuda_out_f(c, 0);
    T *arg = (T *)c->saved;
    if (dilated)
        maxpool_nhwc_forward_kernel<I, true, IO, VEC, T><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>(pp, (I)ch, x,
                                                                                                   y, arg);
    else
        maxpool_nhwc_forward_kernel<I, false, IO, VEC, T><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>(pp, (I)ch, x,
                                                                                                    y, arg);
}

/* Runs of VEC channels with int indices; with int64_t ones (tensors of
 * about 2^29 elements and more) one channel at a time, which keeps the
 * number of kernels built down. */
static void maxpool_nhwc_forward(const struct gp_cuda_ctx *c, const pool_plan<int64_t> &pp, bool small, bool dilated)
{
    int64_t ch = gp_cuda_in_shape(c, 0)->dims[1];
    gp_fptr x = gp_cuda_in_f(c, 0), y = gp_cuda_out_f(c, 0);
    enum io_kind kind = io_kind_of({x, y});
    bool bytes = argmax_in_bytes(pp);
    if (small) {
        int vec = nhwc_vec(kind, ch, {x.p, y.p}, c->saved, bytes ? 1 : sizeof(int));
        if (bytes)
            NHWC_DISPATCH(kind, vec, maxpool_nhwc_forward_launch<int, IO, VEC, unsigned char>(c, pp, ch, dilated));
        else
            NHWC_DISPATCH(kind, vec, maxpool_nhwc_forward_launch<int, IO, VEC, int>(c, pp, ch, dilated));
    } else if (bytes) {
        IO_DISPATCH(kind, maxpool_nhwc_forward_launch<int64_t, IO, 1, unsigned char>(c, pp, ch, dilated));
    } else {
        IO_DISPATCH(kind, maxpool_nhwc_forward_launch<int64_t, IO, 1, int>(c, pp, ch, dilated));
    }
}

template <typename I, bool DIL, class IO, int VEC, typename T>
static void maxpool_nhwc_backward_launch(const struct gp_cuda_ctx *c, const pool_plan<int64_t> &pp, int64_t ch)
{
    unsigned blocks = gp_cuda_blocks_for(pp.planes * pp.in_size / VEC);
    maxpool_nhwc_backward_kernel<I, DIL, IO, VEC, T><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>(
        plan_as<I>(pp), (I)ch, (const T *)c->saved, gp_cuda_dout_f(c, 0), gp_cuda_din_f(c, 0));
}

/* Runs of VEC channels with int indices, as the forward; the argmax kept
 * as the forward kept it (argmax_in_bytes). */
static void maxpool_nhwc_backward(const struct gp_cuda_ctx *c, const pool_plan<int64_t> &pp, bool small, bool dilated)
{
    int64_t ch = gp_cuda_in_shape(c, 0)->dims[1];
    gp_fptr dy = gp_cuda_dout_f(c, 0), dx = gp_cuda_din_f(c, 0);
    enum io_kind kind = io_kind_of({dy, dx});
    bool bytes = argmax_in_bytes(pp);
    int vec = small ? nhwc_vec(kind, ch, {dy.p, dx.p}, c->saved, bytes ? 1 : sizeof(int)) : 1;
#define MAXPOOL_NHWC_BACKWARD(I, VEC)                                                            \
    do {                                                                                         \
        if (bytes && dilated) maxpool_nhwc_backward_launch<I, true, IO, VEC, unsigned char>(c, pp, ch);  \
        else if (bytes) maxpool_nhwc_backward_launch<I, false, IO, VEC, unsigned char>(c, pp, ch);       \
        else if (dilated) maxpool_nhwc_backward_launch<I, true, IO, VEC, int>(c, pp, ch);                \
        else maxpool_nhwc_backward_launch<I, false, IO, VEC, int>(c, pp, ch);                            \
    } while (0)
    if (small)
        NHWC_DISPATCH(kind, vec, MAXPOOL_NHWC_BACKWARD(int, VEC));
    else
        IO_DISPATCH(kind, MAXPOOL_NHWC_BACKWARD(int64_t, 1));
#undef MAXPOOL_NHWC_BACKWARD
}

static bool want_indices(const struct gp_cuda_ctx *c)
{
    return c->node->n_outputs > 1 && c->out[1] && gp_cuda_out_value(c, 1);
}

/* The argmax of every output cell, a byte or an int32 (argmax_keep: as
 * argmax_in_bytes decides from the same window; int32 where the window
 * does not resolve, which the forward then refuses). */
static size_t maxpool_saved(const struct gp_graph *g, const struct gp_node *node)
{
    const struct gp_value *x = gp_node_input(g, node, 0), *y = gp_node_output(g, node, 0);
    if (!x || !y) return 0;
    struct gp_error err;
    memset(&err, 0, sizeof err);
    struct gp_infer_ctx ic = {(struct gp_graph *)g, (struct gp_node *)node, &err};
    struct gp_window w;
    int64_t taps = 1;
    if (gp_window_resolve(&ic, GP_WINDOW_POOL, &x->shape, NULL, &w) != GP_OK) taps = 256;
    for (int i = 0; taps <= 255 && i < w.n_spatial; i++) taps *= w.kernel[i];
    return (byte_argmax_on() && taps <= 255 ? 1 : sizeof(int)) * (size_t)gp_shape_numel(&y->shape);
}

template <typename I, class IO, typename T>
static void maxpool_forward_launch(const struct gp_cuda_ctx *c, const pool_plan<int64_t> &p64, bool dilated,
                                   int64_t *ind, bool col_major)
{
    pool_plan<I> pp = plan_as<I>(p64);
    unsigned blocks = gp_cuda_blocks_for(p64.planes * p64.out_size);
    gp_fptr x = gp_cuda_in_f(c, 0), y = gp_cuda_out_f(c, 0);
    T *arg = (T *)c->saved;
    if (dilated)
        maxpool_forward_kernel<I, true, IO, T><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>(pp, x, y, ind, arg,
                                                                                         col_major);
    else
        maxpool_forward_kernel<I, false, IO, T><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>(pp, x, y, ind, arg,
                                                                                          col_major);
}

static gp_status maxpool_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    pool_plan<int64_t> pp;
    bool small, dilated;
    GP_TRY(pool_plan_init(c, &pp, &small, &dilated, err));
    if (pp.in_size > INT_MAX)
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "a plane of %lld cells exceeds int32 argmax offsets",
                             (long long)pp.in_size);
    if (pp.planes * pp.out_size == 0) return GP_OK;
    bool nhwc;
    GP_TRY(maxpool_nhwc_call(c, &nhwc, err));
    if (nhwc) {
        maxpool_nhwc_forward(c, pp, small, dilated);
        return gp_cuda_check_launch(c, "MaxPool forward (channels-last)", err);
    }
    int64_t *ind = want_indices(c) ? (int64_t *)c->out[1] : NULL;
    bool col_major = gp_node_attr_int(c->node, "storage_order", 0) != 0;
    enum io_kind kind = io_kind_of({gp_cuda_in_f(c, 0), gp_cuda_out_f(c, 0)});
    bool bytes = argmax_in_bytes(pp);
    if (small && bytes)
        IO_DISPATCH(kind, maxpool_forward_launch<int, IO, unsigned char>(c, pp, dilated, ind, col_major));
    else if (small)
        IO_DISPATCH(kind, maxpool_forward_launch<int, IO, int>(c, pp, dilated, ind, col_major));
    else if (bytes)
        IO_DISPATCH(kind, maxpool_forward_launch<int64_t, IO, unsigned char>(c, pp, dilated, ind, col_major));
    else
        IO_DISPATCH(kind, maxpool_forward_launch<int64_t, IO, int>(c, pp, dilated, ind, col_major));
    return gp_cuda_check_launch(c, "MaxPool forward", err);
}

static gp_status maxpool_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    pool_plan<int64_t> pp;
    bool small, dilated;
    GP_TRY(pool_plan_init(c, &pp, &small, &dilated, err));
    if (!c->dout[0] || !c->din[0]) return GP_OK;
    if (!c->saved)
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "MaxPool backward needs the argmax saved by forward");
    int64_t n = pp.planes * pp.in_size;
    if (n == 0 || pp.out_size == 0) return GP_OK;
    bool nhwc;
    GP_TRY(maxpool_nhwc_call(c, &nhwc, err));
    if (nhwc) {
        maxpool_nhwc_backward(c, pp, small, dilated);
        return gp_cuda_check_launch(c, "MaxPool backward (channels-last)", err);
    }
    gp_fptr dy = gp_cuda_dout_f(c, 0), dx = gp_cuda_din_f(c, 0);
    enum io_kind kind = io_kind_of({dy, dx});
    unsigned blocks = gp_cuda_blocks_for(n);
    bool bytes = argmax_in_bytes(pp);
#define MAXPOOL_BACKWARD(I, P)                                                                                   \
    do {                                                                                                         \
        if (bytes && dilated)                                                                                    \
            maxpool_backward_kernel<I, true, IO, unsigned char><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>(     \
                P, (const unsigned char *)c->saved, dy, dx);                                                     \
        else if (bytes)                                                                                          \
            maxpool_backward_kernel<I, false, IO, unsigned char><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>(    \
                P, (const unsigned char *)c->saved, dy, dx);                                                     \
        else                                                                                                     \
            maxpool_backward_kernel<I, false, IO, int><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>(              \
                P, (const int *)c->saved, dy, dx);                                                               \
    } while (0)
    if (small)
        IO_DISPATCH(kind, MAXPOOL_BACKWARD(int, plan_as<int>(pp)));
    else
        IO_DISPATCH(kind, MAXPOOL_BACKWARD(int64_t, pp));
#undef MAXPOOL_BACKWARD
    return gp_cuda_check_launch(c, "MaxPool backward", err);
}

/* ---- AveragePool ---- */

/* Along axis a, output cell o's share of its divisor: the taps inside the
 * input, or with include_pad those inside the padded input. The divisor is
 * the product over the axes (the CPU's avg_divisor). */
template <typename I, bool DIL>
__device__ static inline I div_factor(const pool_plan<I> &pp, int a, I o, bool include_pad)
{
    I t0, t1, padded;
    taps<I, DIL>(pp, a, o, &t0, &t1, &padded);
    return include_pad ? padded : t1 - t0;
}

template <typename I, bool DIL, class IO>
__global__ static void avgpool_forward_kernel(pool_plan<I> pp, gp_fptr x, gp_fptr y, bool include_pad)
{
    POOL_GRID_STRIDE(I, e, pp.planes * pp.out_size)
    {
        I pl = e / pp.out_size, o[MAX_AXES];
        coords<I>(pp.out, e - pl * pp.out_size, o);
        int64_t base = (int64_t)pl * pp.in_size;
        I a[MAX_AXES], b[MAX_AXES], padded[MAX_AXES];
        for (int i = 0; i < MAX_AXES; i++) taps<I, DIL>(pp, i, o[i], &a[i], &b[i], &padded[i]);
        float sum = 0.0f;
        for (I t0 = a[0]; t0 < b[0]; t0++) {
            I i0 = o[0] * pp.s[0] - pp.p[0] + t0 * pp.d[0];
            for (I t1 = a[1]; t1 < b[1]; t1++) {
                I i1 = o[1] * pp.s[1] - pp.p[1] + t1 * pp.d[1];
                I row = (i0 * pp.in[1] + i1) * pp.in[2] + o[2] * pp.s[2] - pp.p[2];
                for (I t2 = a[2]; t2 < b[2]; t2++) sum = __fadd_rn(sum, IO::ldg(x, base + row + t2 * pp.d[2]));
            }
        }
        int64_t div = 1;
        for (int i = 0; i < MAX_AXES; i++) div *= include_pad ? padded[i] : b[i] - a[i];
        IO::set_act(y, e, div > 0 ? __fdiv_rn(sum, (float)div) : 0.0f);
    }
}

/* dX += dY / divisor over the windows holding each input cell, in
 * increasing order of the window. */
template <typename I, bool DIL, class IO>
__global__ static void avgpool_backward_kernel(pool_plan<I> pp, gp_fptr dy, gp_fptr dx, bool include_pad)
{
    POOL_GRID_STRIDE(I, e, pp.planes * pp.in_size)
    {
        I pl = e / pp.in_size, i[MAX_AXES];
        coords<I>(pp.in, e - pl * pp.in_size, i);
        I lo[MAX_AXES], hi[MAX_AXES];
        for (int a = 0; a < MAX_AXES; a++) holders<I>(pp, a, i[a], &lo[a], &hi[a]);
        int64_t dyb = (int64_t)pl * pp.out_size;
        float acc = IO::act(dx, e);
        for (I o0 = lo[0]; o0 <= hi[0]; o0++) {
            if (!tap_on<I, DIL>(pp, 0, o0, i[0])) continue;
            int64_t f0 = div_factor<I, DIL>(pp, 0, o0, include_pad);
            for (I o1 = lo[1]; o1 <= hi[1]; o1++) {
                if (!tap_on<I, DIL>(pp, 1, o1, i[1])) continue;
                int64_t f1 = f0 * div_factor<I, DIL>(pp, 1, o1, include_pad);
                I row = (o0 * pp.out[1] + o1) * pp.out[2];
                for (I o2 = lo[2]; o2 <= hi[2]; o2++) {
                    if (!tap_on<I, DIL>(pp, 2, o2, i[2])) continue;
                    int64_t div = f1 * div_factor<I, DIL>(pp, 2, o2, include_pad);
                    if (div <= 0) continue;
                    acc = __fadd_rn(acc, __fdiv_rn(IO::ldg(dy, dyb + row + o2), (float)div));
                }
            }
        }
        IO::set_act(dx, e, acc);
    }
}

static bool include_pad_of(const struct gp_cuda_ctx *c)
{
    return gp_node_attr_int(c->node, "count_include_pad", 0) != 0;
}

template <typename I, class IO>
static void avgpool_launch(const struct gp_cuda_ctx *c, const pool_plan<int64_t> &p64, bool dilated,
                           bool backward)
{
    pool_plan<I> pp = plan_as<I>(p64);
    bool inc = include_pad_of(c);
    if (!backward) {
        unsigned blocks = gp_cuda_blocks_for(p64.planes * p64.out_size);
        gp_fptr x = gp_cuda_in_f(c, 0), y = gp_cuda_out_f(c, 0);
        if (dilated)
            avgpool_forward_kernel<I, true, IO><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>(pp, x, y, inc);
        else
            avgpool_forward_kernel<I, false, IO><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>(pp, x, y, inc);
    } else {
        unsigned blocks = gp_cuda_blocks_for(p64.planes * p64.in_size);
        gp_fptr dy = gp_cuda_dout_f(c, 0), dx = gp_cuda_din_f(c, 0);
        if (dilated)
            avgpool_backward_kernel<I, true, IO><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>(pp, dy, dx, inc);
        else
            avgpool_backward_kernel<I, false, IO><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>(pp, dy, dx, inc);
    }
}

static gp_status avgpool_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    pool_plan<int64_t> pp;
    bool small, dilated;
    GP_TRY(pool_plan_init(c, &pp, &small, &dilated, err));
    if (pp.planes * pp.out_size == 0) return GP_OK;
    enum io_kind kind = io_kind_of({gp_cuda_in_f(c, 0), gp_cuda_out_f(c, 0)});
    if (small)
        IO_DISPATCH(kind, avgpool_launch<int, IO>(c, pp, dilated, false));
    else
        IO_DISPATCH(kind, avgpool_launch<int64_t, IO>(c, pp, dilated, false));
    return gp_cuda_check_launch(c, "AveragePool forward", err);
}

static gp_status avgpool_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    pool_plan<int64_t> pp;
    bool small, dilated;
    GP_TRY(pool_plan_init(c, &pp, &small, &dilated, err));
    if (!c->dout[0] || !c->din[0]) return GP_OK;
    if (pp.planes * pp.in_size == 0 || pp.out_size == 0) return GP_OK;
    enum io_kind kind = io_kind_of({gp_cuda_dout_f(c, 0), gp_cuda_din_f(c, 0)});
    if (small)
        IO_DISPATCH(kind, avgpool_launch<int, IO>(c, pp, dilated, true));
    else
        IO_DISPATCH(kind, avgpool_launch<int64_t, IO>(c, pp, dilated, true));
    return gp_cuda_check_launch(c, "AveragePool backward", err);
}

/* ---- global pools ---- */

/* Planes of at least this many cells get a block each; smaller ones a warp. */
#define BLOCK_PLANE 4096
#define WARPS_PER_BLOCK (GP_CUDA_THREADS / 32)

static gp_status global_dims(const struct gp_cuda_ctx *c, int64_t *planes, int64_t *size,
                             struct gp_error *err)
{
    const struct gp_value *x = gp_cuda_in_value(c, 0);
    if (x->dtype != GP_DTYPE_FLOAT32)
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "the CUDA backend pools float32 tensors, not %s",
                             gp_dtype_name(x->dtype));
    const struct gp_shape *s = &x->shape;
    *planes = s->dims[0] * s->dims[1];
    *size = 1;
    for (int i = 2; i < s->rank; i++) *size *= s->dims[i];
    return GP_OK;
}

/* A plane's best cell by the CPU's plane_argmax rule, reduced over lanes:
 * scanning in increasing order, a cell replaces the best when larger or NaN;
 * so the best is the last NaN if any, else the first maximum (index -1:
 * none yet). Combining two lanes' bests keeps that meaning. */
struct best {
    float v;
    int64_t i;
};

__device__ static inline struct best best_step(struct best b, float v, int64_t i)
{
    if (b.i < 0) {
        b.i = i;
        b.v = v;
    } else if (v > b.v || isnan(v)) {
        b.v = v;
        b.i = i;
    }
    return b;
}

__device__ static inline struct best best_merge(struct best a, struct best b)
{
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    bool an = isnan(a.v), bn = isnan(b.v);
    if (an || bn) {
        if (an && bn) return a.i > b.i ? a : b;
        return an ? a : b;
    }
    if (a.v != b.v) return a.v > b.v ? a : b;
    return a.i < b.i ? a : b;
}

__device__ static inline double warp_sum(double s)
{
    for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffffu, s, off);
    return s;
}

__device__ static inline struct best warp_best(struct best b)
{
    for (int off = 16; off > 0; off /= 2) {
        struct best o;
        o.v = __shfl_down_sync(0xffffffffu, b.v, off);
        o.i = __shfl_down_sync(0xffffffffu, b.i, off);
        b = best_merge(b, o);
    }
    return b;
}

/* The plane's sum in double: a warp (lanes stride over the plane) or, with
 * block, the whole block (then warps combine in order). Every thread of the
 * group gets the result. */
template <class IO> __device__ static inline double plane_sum(gp_fptr x, int64_t base, int64_t size, bool block)
{
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    int64_t start = block ? threadIdx.x : lane, step = block ? blockDim.x : 32;
    double s = 0;
    for (int64_t t = start; t < size; t += step) s += (double)IO::act(x, base + t);
    s = warp_sum(s);
    s = __shfl_sync(0xffffffffu, s, 0);
    if (!block) return s;
    __shared__ double part[WARPS_PER_BLOCK];
    if (lane == 0) part[wid] = s;
    __syncthreads();
    double t = 0;
    for (int w = 0; w < WARPS_PER_BLOCK; w++) t += part[w];
    return t;
}

template <class IO>
__device__ static inline struct best plane_best(gp_fptr x, int64_t base, int64_t size, bool block)
{
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    int64_t start = block ? threadIdx.x : lane, step = block ? blockDim.x : 32;
    struct best b = {-INFINITY, -1};
    for (int64_t t = start; t < size; t += step) b = best_step(b, IO::act(x, base + t), t);
    b = warp_best(b);
    b.v = __shfl_sync(0xffffffffu, b.v, 0);
    b.i = __shfl_sync(0xffffffffu, b.i, 0);
    if (!block) return b;
    __shared__ struct best part[WARPS_PER_BLOCK];
    if (lane == 0) part[wid] = b;
    __syncthreads();
    struct best r = part[0];
    for (int w = 1; w < WARPS_PER_BLOCK; w++) r = best_merge(r, part[w]);
    return r;
}

/* One plane per warp (block false) or per block (true); `plane` indexes
 * the group. Warps beyond the last plane do nothing. */
__device__ static inline int64_t group_plane(bool block)
{
    return block ? (int64_t)blockIdx.x : (int64_t)blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
}

template <class IO>
__global__ static void global_avg_forward_kernel(gp_fptr x, gp_fptr y, int64_t planes, int64_t size, bool block)
{
    int64_t pl = group_plane(block);
    if (pl >= planes) return;
    double s = plane_sum<IO>(x, pl * size, size, block);
    if ((threadIdx.x & (block ? blockDim.x - 1 : 31)) == 0) IO::set_act(y, pl, (float)(s / (double)size));
}

template <class IO>
__global__ static void global_max_forward_kernel(gp_fptr x, gp_fptr y, int64_t planes, int64_t size, bool block)
{
    int64_t pl = group_plane(block);
    if (pl >= planes) return;
    struct best b = plane_best<IO>(x, pl * size, size, block);
    if ((threadIdx.x & (block ? blockDim.x - 1 : 31)) == 0) IO::set_act(y, pl, b.i >= 0 ? b.v : -INFINITY);
}

/* dX += dY at each plane's best cell: one term per element. */
template <class IO>
__global__ static void global_max_backward_kernel(gp_fptr x, gp_fptr dy, gp_fptr dx, int64_t planes,
                                                  int64_t size, bool block)
{
    int64_t pl = group_plane(block);
    if (pl >= planes) return;
    struct best b = plane_best<IO>(x, pl * size, size, block);
    if ((threadIdx.x & (block ? blockDim.x - 1 : 31)) == 0 && b.i >= 0) {
        int64_t at = pl * size + b.i;
        IO::set_act(dx, at, __fadd_rn(IO::act(dx, at), IO::act(dy, pl)));
    }
}

/* dX [planes, size] += dY [planes] / size. */
template <class IO>
__global__ static void global_avg_backward_kernel(gp_fptr dy, gp_fptr dx, int64_t planes, int64_t size)
{
    GP_GRID_STRIDE(e, planes * size) {
        IO::set_act(dx, e, __fadd_rn(IO::act(dx, e), __fdiv_rn(IO::act(dy, e / size), (float)size)));
    }
}

/* Channels-last GlobalAveragePool: X [N, HW, C] -> Y [N, C] (Y's
 * [N, C, 1, 1] is the same memory in either layout). A block takes one
 * sample and 32 runs of VEC channels, a lane each, coalesced along C; its
 * warps split the plane's cells, warp w summing cells w, w + W, w + 2W,
 * ... (W warps) in double, and each channel's W partial sums then meet in
 * warp order: a fixed order, other than the CPU's (one sum in cell
 * order), so Y is within its float32 rounding, as the planar kernel's. */
template <class IO, int VEC>
__global__ static void global_avg_nhwc_forward_kernel(gp_fptr x, gp_fptr y, int64_t ch, int64_t size, int64_t tiles)
{
    int64_t b = blockIdx.x / tiles, tile = blockIdx.x - b * tiles;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int64_t c0 = (tile * 32 + lane) * VEC;
    bool live = c0 < ch; /* ch is a multiple of VEC: a live run is whole */
    double s[VEC];
#pragma unroll
    for (int j = 0; j < VEC; j++) s[j] = 0;
    if (live)
        for (int64_t t = w; t < size; t += WARPS_PER_BLOCK) {
            float v[VEC];
            IO::template run<VEC>(x, (b * size + t) * ch + c0, v);
#pragma unroll
            for (int j = 0; j < VEC; j++) s[j] += (double)v[j];
        }
    __shared__ double part[WARPS_PER_BLOCK][32 * VEC];
#pragma unroll
    for (int j = 0; j < VEC; j++) part[w][lane * VEC + j] = s[j];
    __syncthreads();
    if (w != 0 || !live) return;
    float out[VEC];
#pragma unroll
    for (int j = 0; j < VEC; j++) {
        double t = 0;
        for (int k = 0; k < WARPS_PER_BLOCK; k++) t += part[k][lane * VEC + j];
        out[j] = (float)(t / (double)size);
    }
    IO::template set_run<VEC>(y, b * ch + c0, out);
}

/* dX [N, HW, C] += dY [N, C] / HW: the planar kernel's one term per
 * element, a run of VEC channels per thread. */
template <class IO, int VEC>
__global__ static void global_avg_nhwc_backward_kernel(gp_fptr dy, gp_fptr dx, int64_t ch, int64_t size,
                                                       int64_t total_runs)
{
    const int64_t runs = ch / VEC;
    GP_GRID_STRIDE(e, total_runs)
    {
        int64_t q = gp_dev_fdiv(e, runs), c0 = (e - q * runs) * VEC, b = gp_dev_fdiv(q, size);
        float g[VEC], d[VEC];
        IO::template run<VEC>(dy, b * ch + c0, g);
        IO::template run<VEC>(dx, e * VEC, d);
#pragma unroll
        for (int j = 0; j < VEC; j++) d[j] = __fadd_rn(d[j], __fdiv_rn(g[j], (float)size));
        IO::template set_run<VEC>(dx, e * VEC, d);
    }
}

/* GlobalAveragePool reads X channels-last itself (rank 4), whatever Y's
 * tag: Y is the same memory either way. */
static bool global_avg_layout_native(const struct gp_graph *g, const struct gp_node *node, uint32_t in_nhwc,
                                     uint32_t out_nhwc, bool backward)
{
    (void)out_nhwc;
    (void)backward;
    const struct gp_value *x = gp_node_input(g, node, 0);
    return x && x->shape.rank == 4 && gp_cuda_nhwc(in_nhwc, 0);
}

/* Whether X lies channels-last (Y's tag changes nothing); refused where
 * global_avg_layout_native would not have said yes. */
static gp_status global_avg_nhwc_call(const struct gp_cuda_ctx *c, bool *nhwc, struct gp_error *err)
{
    *nhwc = gp_cuda_nhwc(c->in_nhwc, 0);
    if (*nhwc && !global_avg_layout_native(c->graph, c->node, c->in_nhwc, c->out_nhwc, false))
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "GlobalAveragePool reads channels-last only at rank 4");
    return GP_OK;
}

/* Grid for one plane per warp or per block. */
static gp_status global_grid(const struct gp_cuda_ctx *c, int64_t planes, int64_t size, bool *block,
                             unsigned *blocks, struct gp_error *err)
{
    *block = size >= BLOCK_PLANE;
    int64_t b = *block ? planes : (planes + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
    if (b > INT_MAX) return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "too many planes (%lld)", (long long)planes);
    *blocks = (unsigned)b;
    return GP_OK;
}

static gp_status global_avg_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    int64_t planes, size;
    GP_TRY(global_dims(c, &planes, &size, err));
    if (planes == 0) return GP_OK;
    bool nhwc;
    GP_TRY(global_avg_nhwc_call(c, &nhwc, err));
    if (nhwc) {
        /* A block per sample and 32 runs of channels. */
        int64_t ch = gp_cuda_in_shape(c, 0)->dims[1];
        gp_fptr x = gp_cuda_in_f(c, 0), y = gp_cuda_out_f(c, 0);
        enum io_kind kind = io_kind_of({x, y});
        int vec = nhwc_vec(kind, ch, {x.p, y.p}, NULL, 0);
        int64_t tiles = (ch / vec + 31) / 32, nb = planes / ch * tiles;
        if (nb > INT_MAX)
            return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "too many planes (%lld)", (long long)planes);
        NHWC_DISPATCH(kind, vec, global_avg_nhwc_forward_kernel<IO, VEC><<<(unsigned)nb, GP_CUDA_THREADS, 0,
                                                                            c->stream>>>(x, y, ch, size, tiles));
        return gp_cuda_check_launch(c, "GlobalAveragePool forward (channels-last)", err);
    }
    bool block = false;
    unsigned blocks = 0;
    GP_TRY(global_grid(c, planes, size, &block, &blocks, err));
    gp_fptr x = gp_cuda_in_f(c, 0), y = gp_cuda_out_f(c, 0);
    IO_DISPATCH(io_kind_of({x, y}), global_avg_forward_kernel<IO><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>(
                                        x, y, planes, size, block));
    return gp_cuda_check_launch(c, "GlobalAveragePool forward", err);
}

static gp_status global_avg_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    int64_t planes, size;
    GP_TRY(global_dims(c, &planes, &size, err));
    if (!c->dout[0] || !c->din[0] || planes * size == 0) return GP_OK;
    gp_fptr dy = gp_cuda_dout_f(c, 0), dx = gp_cuda_din_f(c, 0);
    bool nhwc;
    GP_TRY(global_avg_nhwc_call(c, &nhwc, err));
    if (nhwc) {
        int64_t ch = gp_cuda_in_shape(c, 0)->dims[1];
        enum io_kind kind = io_kind_of({dy, dx});
        int vec = nhwc_vec(kind, ch, {dy.p, dx.p}, NULL, 0);
        int64_t total = planes * size / vec;
        unsigned blocks = gp_cuda_blocks_for(total);
        NHWC_DISPATCH(kind, vec, global_avg_nhwc_backward_kernel<IO, VEC><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>(
                                     dy, dx, ch, size, total));
        return gp_cuda_check_launch(c, "GlobalAveragePool backward (channels-last)", err);
    }
    unsigned blocks = gp_cuda_blocks_for(planes * size);
    IO_DISPATCH(io_kind_of({dy, dx}), global_avg_backward_kernel<IO><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>(
                                          dy, dx, planes, size));
    return gp_cuda_check_launch(c, "GlobalAveragePool backward", err);
}

static gp_status global_max_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    int64_t planes, size;
    GP_TRY(global_dims(c, &planes, &size, err));
    if (planes == 0) return GP_OK;
    bool block = false;
    unsigned blocks = 0;
    GP_TRY(global_grid(c, planes, size, &block, &blocks, err));
    gp_fptr x = gp_cuda_in_f(c, 0), y = gp_cuda_out_f(c, 0);
    IO_DISPATCH(io_kind_of({x, y}), global_max_forward_kernel<IO><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>(
                                        x, y, planes, size, block));
    return gp_cuda_check_launch(c, "GlobalMaxPool forward", err);
}

static gp_status global_max_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    int64_t planes, size;
    GP_TRY(global_dims(c, &planes, &size, err));
    if (!c->dout[0] || !c->din[0] || planes == 0) return GP_OK;
    bool block = false;
    unsigned blocks = 0;
    GP_TRY(global_grid(c, planes, size, &block, &blocks, err));
    gp_fptr x = gp_cuda_in_f(c, 0), dy = gp_cuda_dout_f(c, 0), dx = gp_cuda_din_f(c, 0);
    enum io_kind kind = io_kind_of({x, dy, dx});
    IO_DISPATCH(kind, global_max_backward_kernel<IO><<<blocks, GP_CUDA_THREADS, 0, c->stream>>>(x, dy, dx, planes,
                                                                                               size, block));
    return gp_cuda_check_launch(c, "GlobalMaxPool backward", err);
}

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_pool[] = {
    {"MaxPool", maxpool_saved, NULL, maxpool_forward, maxpool_backward, false, true, false, NULL,
     maxpool_layout_native},
    {"AveragePool", NULL, NULL, avgpool_forward, avgpool_backward, false, true},
    {"GlobalAveragePool", NULL, NULL, global_avg_forward, global_avg_backward, false, true, false, NULL,
     global_avg_layout_native},
    {"GlobalMaxPool", NULL, NULL, global_max_forward, global_max_backward, false, true},
    {NULL, NULL, NULL, NULL, NULL},
};
