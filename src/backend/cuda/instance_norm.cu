/* CUDA kernels: InstanceNormalization, twin of backend/cpu/instance_norm.c,
 * forward and backward, with the CPU's (PyTorch's) formulas: biased
 * variance, epsilon inside the square root. One block per plane, moving
 * runs of up to 8 values per access.
 *
 * Statistics are accumulated in double, as the CPU does: the mean first,
 * then the sum of squared deviations from it (two passes), so the float
 * results agree with the CPU's to an ulp. Every reduction runs in a fixed
 * order (per-thread strided sums, then a shuffle/shared-memory tree of a
 * fixed block size; a channel's parameter gradients add its planes' sums in
 * sample order), so results are identical run to run; no atomics anywhere.
 *
 * Rounding: nvcc contracts a * b + c into FMAs, the CPU build does not;
 * where a product feeds a sum the operations are spelled with the _rn
 * intrinsics (never contracted), in float and in double, in the CPU's order
 * of operations.
 *
 * bfloat16 (gp_cuda_kernel.bf16_any): every float tensor may be stored as
 * bfloat16 or float32, as ctx->*_dt says. Loads widen exactly and every
 * stored value is rounded once (to nearest even), a gradient after its
 * float32 term is added to the widened old value: the results of the
 * float32 kernel on widened copies, rounded back (the staged call,
 * backend/mixed_call.h). Statistics, saved state and scratch stay float32
 * / double. */
#include <initializer_list>
#include <math.h>
#include <string.h>

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/norm_nhwc.cuh"
#include "backend/cuda/norm_storage.cuh"

/* ---- storage: IO of norm_storage.cuh for the plane kernels; the
 * parameter gradients are accumulated with gp_acc whatever the call (C
 * values). */

/* ---- InstanceNormalization ---- */

/* X [N, C, D...]: each (sample, channel) plane of S cells normalized by its
 * own mean and biased variance. One block per plane. */
struct in_plan {
    int64_t n, c, s;
    double eps;
};

static void in_plan_of(const struct gp_cuda_ctx *ctx, struct in_plan *p)
{
    const struct gp_shape *x = &gp_cuda_in_value(ctx, 0)->shape;
    p->n = x->dims[0];
    p->c = x->dims[1];
    p->s = 1;
    for (int i = 2; i < x->rank; i++) p->s *= x->dims[i];
    p->eps = gp_node_attr_float(ctx->node, "epsilon", 1e-5f);
}

/* ctx->saved: mean [N C] and inverse standard deviation [N C] (float). */
static size_t in_saved(const struct gp_graph *g, const struct gp_node *node)
{
    const struct gp_shape *x = &gp_node_input(g, node, 0)->shape;
    return 2 * sizeof(float) * (size_t)(x->dims[0] * x->dims[1]);
}

static size_t in_nhwc_scratch(const struct gp_graph *g, const struct gp_node *node);

/* Scratch: per-plane sums of dy and dy xhat (doubles) for backward; the
 * channels-last passes' (in_nhwc_scratch) when more. */
static size_t in_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    const struct gp_shape *x = &gp_node_input(g, node, 0)->shape;
    size_t nchw = 2 * sizeof(double) * (size_t)(x->dims[0] * x->dims[1]), nhwc = in_nhwc_scratch(g, node);
    return nchw > nhwc ? nchw : nhwc;
}

/* The passes over a plane move runs of VEC consecutive values as one access
 * (io_vec_for: VEC divides the plane and the tensors' alignment allows it),
 * the loops unrolled 4 times so their loads are in flight together: one
 * value per access at a time leaves most of the bandwidth unused. A
 * thread adds its values in run order, then the fixed tree. */

/* The mean and biased variance of the n values of x from `base` (two
 * passes, in double). */
template <class IO, int VEC>
__device__ static inline void in_block_moments(gp_fptr x, int64_t base, int64_t n, double *sh, double *mean,
                                               double *var)
{
    const int64_t runs = n / VEC;
    double s = 0;
#pragma unroll 4
    for (int64_t r = threadIdx.x; r < runs; r += blockDim.x) {
        float v[VEC];
        IO::template acts<VEC>(x, base + r * VEC, v);
#pragma unroll
        for (int k = 0; k < VEC; k++) s = DADD(s, (double)v[k]);
    }
    s = gp_dev_block_sum(s, sh);
    double m = n > 0 ? s / (double)n : 0.0;
    double q = 0;
#pragma unroll 4
    for (int64_t r = threadIdx.x; r < runs; r += blockDim.x) {
        float v[VEC];
        IO::template acts<VEC>(x, base + r * VEC, v);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            double d = DSUB((double)v[k], m);
            q = DADD(q, DMUL(d, d));
        }
    }
    q = gp_dev_block_sum(q, sh);
    *mean = m;
    *var = n > 0 ? q / (double)n : 0.0;
}

template <class IO, int VEC>
__global__ static void in_forward_kernel(struct in_plan p, gp_fptr x, gp_fptr scale, gp_fptr bias, gp_fptr y,
                                         float *mean, float *invstd)
{
    __shared__ double sh[32];
    const int64_t runs = p.s / VEC;
    for (int64_t pl = blockIdx.x; pl < p.n * p.c; pl += gridDim.x) {
        int64_t base = pl * p.s;
        double m, var;
        in_block_moments<IO, VEC>(x, base, p.s, sh, &m, &var);
        float mr = (float)m, is = (float)(1.0 / sqrt(DADD(var, p.eps)));
        if (threadIdx.x == 0) mean[pl] = mr, invstd[pl] = is;
        float a = FMUL(is, IO::par(scale, pl % p.c)), b = IO::par(bias, pl % p.c);
#pragma unroll 4
        for (int64_t r = threadIdx.x; r < runs; r += blockDim.x) {
            float v[VEC];
            IO::template acts<VEC>(x, base + r * VEC, v);
#pragma unroll
            for (int k = 0; k < VEC; k++) v[k] = FADD(FMUL(FSUB(v[k], mr), a), b);
            IO::template set_acts<VEC>(y, base + r * VEC, v);
        }
    }
}

static gp_status in_nhwc_forward(struct gp_cuda_ctx *ctx, struct gp_error *err);
/* Backward's tensors: X, scale, and the gradients (p NULL: not wanted; dY
 * NULL: none arrived). */
struct in_bwd_tensors {
    gp_fptr x, scale, dy, dx, dscale, dbias;
};
static gp_status in_nhwc_backward(struct gp_cuda_ctx *ctx, const struct in_bwd_tensors &t, struct gp_error *err);

static gp_status in_forward(struct gp_cuda_ctx *ctx, struct gp_error *err)
{
    for (int i = 0; i < 3; i++) GP_TRY(gp_cuda_want_f32(ctx, i, err));
    if (gp_cuda_nhwc(ctx->in_nhwc, 0)) return in_nhwc_forward(ctx, err);
    struct in_plan p;
    in_plan_of(ctx, &p);
    if (p.n * p.c == 0) return GP_OK;
    float *mean = (float *)ctx->saved, *invstd = mean + p.n * p.c;
    gp_fptr x = gp_cuda_in_f(ctx, 0), scale = gp_cuda_in_f(ctx, 1), bias = gp_cuda_in_f(ctx, 2);
    gp_fptr y = gp_cuda_out_f(ctx, 0);
    enum io_kind kind = io_kind_of({x, y}, {scale, bias});
    unsigned grid = gp_cuda_capped_grid(p.n * p.c, 1 << 20), threads = gp_cuda_row_threads(p.s);
    int vec = io_vec_for(kind, p.s, {x, y});
    IO_DISPATCH(kind, IO_VEC_DISPATCH(vec, in_forward_kernel<IO, VEC><<<grid, threads, 0, ctx->stream>>>(
                                               p, x, scale, bias, y, mean, invstd)));
    return gp_cuda_check_launch(ctx, "InstanceNormalization forward", err);
}

/* One block per plane: its sums of dy and dy xhat (to scratch) and, when
 * dx is wanted, dx += scale invstd (dy - mean(dy) - xhat mean(dy xhat))
 * (ow: dx = 0 + that, dx not read: gp_cuda_ctx.din_overwrite). */
template <class IO, int VEC>
__global__ static void in_bwd_plane_kernel(struct in_plan p, gp_fptr x, gp_fptr scale, gp_fptr dy,
                                           const float *mean, const float *invstd, double *sums, gp_fptr dx,
                                           bool ow)
{
    __shared__ double sh[32];
    const int64_t runs = p.s / VEC;
    for (int64_t pl = blockIdx.x; pl < p.n * p.c; pl += gridDim.x) {
        int64_t base = pl * p.s;
        float m = mean[pl], is = invstd[pl];
        double s = 0, sx = 0;
#pragma unroll 4
        for (int64_t r = threadIdx.x; r < runs; r += blockDim.x) {
            float g[VEC], xv[VEC];
            IO::template acts<VEC>(dy, base + r * VEC, g);
            IO::template acts<VEC>(x, base + r * VEC, xv);
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                s = DADD(s, (double)g[k]);
                sx = DADD(sx, DMUL((double)g[k], (double)FMUL(FSUB(xv[k], m), is)));
            }
        }
        s = gp_dev_block_sum(s, sh);
        sx = gp_dev_block_sum(sx, sh);
        if (threadIdx.x == 0) sums[2 * pl] = s, sums[2 * pl + 1] = sx;
        if (!dx.p) continue;
        double a = DMUL((double)IO::par(scale, pl % p.c), (double)is), mdy = s / (double)p.s;
        double mdyx = sx / (double)p.s;
#pragma unroll 4
        for (int64_t r = threadIdx.x; r < runs; r += blockDim.x) {
            float g[VEC], xv[VEC], d[VEC];
            IO::template acts<VEC>(dy, base + r * VEC, g);
            IO::template acts<VEC>(x, base + r * VEC, xv);
            if (ow) {
#pragma unroll
                for (int k = 0; k < VEC; k++) d[k] = 0.0f;
            } else {
                IO::template acts<VEC>(dx, base + r * VEC, d);
            }
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                double xhat = (double)FMUL(FSUB(xv[k], m), is);
                double v = DMUL(a, DSUB(DSUB((double)g[k], mdy), DMUL(xhat, mdyx)));
                d[k] = FADD(d[k], (float)v);
            }
            IO::template set_acts<VEC>(dx, base + r * VEC, d);
        }
    }
}

/* One thread per channel: dscale, dB add the channel's planes in sample
 * order, as the CPU does. */
__global__ static void in_bwd_params_kernel(struct in_plan p, const double *sums, gp_fptr dscale,
                                            gp_fptr dbias)
{
    GP_GRID_STRIDE(c, p.c) {
        double sc = 0, sb = 0;
        for (int64_t n = 0; n < p.n; n++) {
            int64_t pl = n * p.c + c;
            sc = DADD(sc, sums[2 * pl + 1]);
            sb = DADD(sb, sums[2 * pl]);
        }
        if (dscale.p) gp_acc(dscale, c, (float)sc);
        if (dbias.p) gp_acc(dbias, c, (float)sb);
    }
}

/* No incoming gradient: nothing to add, but a dX to be written whole
 * (din_overwrite) is written as zeros. */
static gp_status in_no_dy(struct gp_cuda_ctx *ctx, gp_fptr dx, struct gp_error *err)
{
    if (!dx.p || !gp_cuda_overwrite(ctx, 0)) return GP_OK;
    size_t n = (size_t)gp_shape_numel(&gp_cuda_in_value(ctx, 0)->shape);
    return gp_cuda_call(ctx, cudaMemsetAsync(dx.p, 0, n * gp_cuda_float_size(dx.bf16), ctx->stream),
                        "cudaMemsetAsync", err);
}

/* dscale, dB from the per-plane sums (sums[2 pl]: of dy, sums[2 pl + 1]:
 * of dy xhat), either layout's. */
static gp_status in_params_grad(struct gp_cuda_ctx *ctx, const struct in_plan &p, const double *sums,
                                gp_fptr dscale, gp_fptr dbias, struct gp_error *err)
{
    if (!dscale.p && !dbias.p) return GP_OK;
    in_bwd_params_kernel<<<gp_cuda_blocks_for(p.c), GP_CUDA_THREADS, 0, ctx->stream>>>(p, sums, dscale,
                                                                                      dbias);
    return gp_cuda_check_launch(ctx, "InstanceNormalization parameter gradients", err);
}

static gp_status in_backward(struct gp_cuda_ctx *ctx, struct gp_error *err)
{
    for (int i = 0; i < 3; i++) GP_TRY(gp_cuda_want_f32(ctx, i, err));
    gp_fptr none = {NULL, false};
    const struct in_bwd_tensors t = {gp_cuda_in_f(ctx, 0),
                                     gp_cuda_in_f(ctx, 1),
                                     ctx->dout[0] ? gp_cuda_dout_f(ctx, 0) : none,
                                     ctx->din[0] ? gp_cuda_din_f(ctx, 0) : none,
                                     ctx->din[1] ? gp_cuda_din_f(ctx, 1) : none,
                                     ctx->din[2] ? gp_cuda_din_f(ctx, 2) : none};
    if (!t.dy.p) return in_no_dy(ctx, t.dx, err);
    if (gp_cuda_nhwc(ctx->in_nhwc, 0)) return in_nhwc_backward(ctx, t, err);
    struct in_plan p;
    in_plan_of(ctx, &p);
    gp_fptr x = t.x, scale = t.scale, dy = t.dy, dx = t.dx, dscale = t.dscale, dbias = t.dbias;
    if (p.n * p.c == 0 || (!dx.p && !dscale.p && !dbias.p)) return GP_OK;
    const float *mean = (const float *)ctx->saved, *invstd = mean + p.n * p.c;
    double *sums = (double *)ctx->scratch;
    enum io_kind kind = io_kind_of({x, dy, dx}, {scale});
    unsigned grid = gp_cuda_capped_grid(p.n * p.c, 1 << 20), threads = gp_cuda_row_threads(p.s);
    int vec = io_vec_for(kind, p.s, {x, dy, dx});
    bool ow = gp_cuda_overwrite(ctx, 0);
    IO_DISPATCH(kind, IO_VEC_DISPATCH(vec, in_bwd_plane_kernel<IO, VEC><<<grid, threads, 0, ctx->stream>>>(
                                               p, x, scale, dy, mean, invstd, sums, dx, ow)));
    GP_TRY(gp_cuda_check_launch(ctx, "InstanceNormalization backward", err));
    return in_params_grad(ctx, p, sums, dscale, dbias, err);
}

/* ---- channels-last ----
 * X [N, D..., C] (gp_cuda_ctx.in_nhwc; Y, dY and dX alike): sample n is S
 * rows of C channels, and plane (n, c) is column c of those rows. Every
 * access is a run of `vec` consecutive channels of one row (the longest
 * of 8, 4, 2, 1 dividing C that the tensors' alignment allows).
 *
 * Sums (the statistics; backward's sums of dy and dy xhat): blocks of
 * tx x ty threads, tx lanes across a row's runs and ty lanes down the
 * rows, a grid of gx blocks across the runs by p chunks of a sample's
 * rows by N samples. Each lane adds its rows in order in double, the ty
 * lanes of a run then in a fixed order (norm_nhwc.cuh), and each chunk's
 * sums go to scratch; a warp per plane then adds its chunks in order. So
 * results are the same run to run (the order depends on the shape and
 * run length only) and equal the CPU's to float
 * rounding: the statistics are the sum and the sum of squares in double
 * (one pass, where the CPU takes the mean first and then the squared
 * deviations from it: the variance moves by about 2^-53 S mean^2 / var
 * relative, far below float's 2^-24 unless the mean is thousands of
 * standard deviations from 0).
 *
 * Elementwise passes (normalize, dX): a grid of blocks per sample whose
 * thread count is a multiple of the runs per row, so every run of a
 * thread has the same channels and it loads their statistics and
 * coefficients once; IN_NHWC_ILP runs a round, all loads first. The
 * arithmetic is the NCHW kernels' (and the CPU's), operation for
 * operation. */

#define IN_THREADS 256
#define IN_NHWC_ILP 4      /* elementwise passes: runs in flight per thread */
#define IN_NHWC_MAX_CHUNKS 1024
/* The sums: at most this many blocks, so that they run in one wave (three
 * blocks an SM, the kernel's launch bounds, on an H200's 132 SMs): a
 * second, partial wave would take as long as the first. */
#define IN_NHWC_BLOCKS 396
#define IN_NHWC_RUNS 16    /* elementwise passes: runs per thread */

/* The sums' rows in flight per lane: 8 of one tensor forward, 4 of two
 * backward (x and dy). */
__host__ __device__ constexpr int in_nhwc_rows_ilp(bool backward) { return backward ? 4 : 8; }

struct in_nhwc_plan {
    int64_t n, s, c; /* samples, rows per sample, channels */
    int vec;         /* channels per run */
    int64_t cr;      /* runs per row */
    int tx, ty;      /* sums: block of tx run lanes x ty row lanes, tx ty = IN_THREADS */
    int64_t gx;      /* sums: blocks across a row's runs */
    int64_t p, lr;   /* sums: chunks of a sample's rows, rows per chunk */
    double eps;
};

static void in_nhwc_shape(const struct gp_graph *g, const struct gp_node *node, int64_t *n, int64_t *s, int64_t *c)
{
    const struct gp_shape *x = &gp_node_input(g, node, 0)->shape;
    *n = x->dims[0];
    *c = x->rank > 1 ? x->dims[1] : 1;
    *s = 1;
    for (int i = 2; i < x->rank; i++) *s *= x->dims[i];
}

static void in_nhwc_plan_of(const struct gp_graph *g, const struct gp_node *node, int vec, struct in_nhwc_plan *q)
{
    in_nhwc_shape(g, node, &q->n, &q->s, &q->c);
    q->eps = gp_node_attr_float(node, "epsilon", 1e-5f);
    q->vec = vec > 1 && q->c % vec == 0 ? vec : 1;
    q->cr = q->c / q->vec;
    int tx = 1;
    while (tx < q->cr && tx < 32) tx *= 2;
    q->tx = tx;
    q->ty = IN_THREADS / tx;
    q->gx = (q->cr + tx - 1) / tx;
    /* At most IN_NHWC_BLOCKS blocks in all (at least one chunk a sample),
     * each lane at least 8 rows. */
    int64_t across = q->gx * (q->n > 0 ? q->n : 1);
    int64_t chunks = IN_NHWC_BLOCKS / across;
    int64_t by_rows = (q->s + 8 * q->ty - 1) / (8 * q->ty);
    if (chunks > by_rows) chunks = by_rows;
    if (chunks > IN_NHWC_MAX_CHUNKS) chunks = IN_NHWC_MAX_CHUNKS;
    if (chunks < 1) chunks = 1;
    q->lr = (q->s + chunks - 1) / chunks;
    if (q->lr < 1) q->lr = 1;
    q->p = (q->s + q->lr - 1) / q->lr;
    if (q->p < 1) q->p = 1;
}

/* The sums' run length: at most 4 channels (8 doubles a lane). */
static int in_nhwc_sums_vec(int vec) { return vec > 4 ? 4 : vec; }

/* IO_VEC_DISPATCH for the passes whose runs are at most 4 channels (the
 * sums, dX): no 8-channel instances. */
#define IN_VEC4_DISPATCH(vec, ...)                                                    \
    do {                                                                              \
        switch (vec) {                                                                \
        case 4: { const int VEC = 4; __VA_ARGS__; } break;                            \
        case 2: { const int VEC = 2; __VA_ARGS__; } break;                            \
        default: { const int VEC = 1; __VA_ARGS__; } break;                           \
        }                                                                             \
    } while (0)

/* Scratch, laid out by in_nhwc_scratch_of: the chunks' two sums per plane
 * (2 N C p doubles, for the most chunks any run length takes), the
 * planes' two sums (2 N C, as the NCHW backward leaves them for
 * in_bwd_params_kernel) and dX's coefficients (3 N C). */
struct in_nhwc_scratch {
    double *part_a, *part_b, *sums, *coef;
};

static int64_t in_nhwc_chunks_max(const struct gp_graph *g, const struct gp_node *node)
{
    int64_t most = 1;
    for (int vec = 4; vec >= 1; vec /= 2) {
        struct in_nhwc_plan q;
        in_nhwc_plan_of(g, node, vec, &q);
        if (q.p > most) most = q.p;
    }
    return most;
}

static size_t in_nhwc_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    int64_t n, s, c;
    in_nhwc_shape(g, node, &n, &s, &c);
    int64_t planes = n * c;
    return sizeof(double) * (size_t)(planes * (2 * in_nhwc_chunks_max(g, node) + 5));
}

static struct in_nhwc_scratch in_nhwc_scratch_of(const struct gp_cuda_ctx *ctx)
{
    int64_t n, s, c;
    in_nhwc_shape(ctx->graph, ctx->node, &n, &s, &c);
    int64_t planes = n * c, pmax = in_nhwc_chunks_max(ctx->graph, ctx->node);
    struct in_nhwc_scratch r;
    r.part_a = (double *)ctx->scratch;
    r.part_b = r.part_a + planes * pmax;
    r.sums = r.part_b + planes * pmax;
    r.coef = r.sums + 2 * planes;
    return r;
}

/* Block (run group blockIdx.x, chunk blockIdx.y, sample blockIdx.z): per
 * channel of its runs, the sums over the chunk's rows of f(values) into
 * part_a and part_b at [(n C + c) p + k]. BACKWARD: f = (dy, dy xhat)
 * with xhat = (x - mean) invstd in float, as the CPU; else (x, x^2).
 * Lanes walk their rows in_nhwc_rows_ilp at a time, all loads first. */
template <class IO, int VEC, bool BACKWARD>
__global__ static void __launch_bounds__(IN_THREADS, 3)
    in_nhwc_sums_kernel(struct in_nhwc_plan q, gp_fptr x, gp_fptr dy, const float *mean, const float *invstd,
                        double *part_a, double *part_b)
{
    __shared__ double sh[IN_THREADS * 2 * VEC];
    const int64_t run = blockIdx.x * (int64_t)q.tx + threadIdx.x, k = blockIdx.y, n = blockIdx.z;
    double a[VEC], b[VEC];
#pragma unroll
    for (int i = 0; i < VEC; i++) a[i] = b[i] = 0;
    if (run < q.cr) {
        float m[VEC], is[VEC];
#pragma unroll
        for (int i = 0; i < VEC; i++) {
            m[i] = BACKWARD ? mean[n * q.c + run * VEC + i] : 0.0f;
            is[i] = BACKWARD ? invstd[n * q.c + run * VEC + i] : 0.0f;
        }
        const int64_t r0 = k * q.lr + threadIdx.y, end = (k + 1) * q.lr < q.s ? (k + 1) * q.lr : q.s;
        const int64_t base = n * q.s * q.c + run * VEC, step = (int64_t)q.ty * q.c;
        const int64_t rows = r0 < end ? (end - r0 + q.ty - 1) / q.ty : 0;
        int64_t off = base + r0 * q.c;
        const int ILP = in_nhwc_rows_ilp(BACKWARD);
        for (int64_t i = 0; i < rows; i += ILP) {
            float v[ILP][VEC], g[ILP][VEC];
#pragma unroll
            for (int u = 0; u < ILP; u++)
                if (i + u < rows) {
                    IO::template acts<VEC>(x, off + u * step, v[u]);
                    if (BACKWARD) IO::template acts<VEC>(dy, off + u * step, g[u]);
                }
#pragma unroll
            for (int u = 0; u < ILP; u++)
                if (i + u < rows)
#pragma unroll
                    for (int j = 0; j < VEC; j++) {
                        if (BACKWARD) {
                            double gd = (double)g[u][j];
                            a[j] = DADD(a[j], gd);
                            b[j] = DADD(b[j], DMUL(gd, (double)FMUL(FSUB(v[u][j], m[j]), is[j])));
                        } else {
                            double xd = (double)v[u][j];
                            a[j] = DADD(a[j], xd);
                            b[j] = DADD(b[j], DMUL(xd, xd));
                        }
                    }
            off += ILP * step;
        }
    }
    gp_nhwc_reduce_lanes<IN_THREADS, VEC>(q.tx, a, b, sh);
    if (threadIdx.y == 0 && run < q.cr)
#pragma unroll
        for (int i = 0; i < VEC; i++) {
            int64_t pl = n * q.c + run * VEC + i;
            part_a[pl * q.p + k] = a[i];
            part_b[pl * q.p + k] = b[i];
        }
}

static unsigned in_nhwc_warp_blocks(int64_t planes) { return (unsigned)((planes * 32 + 255) / 256); }

/* Warp w: plane w's mean and inverse standard deviation from its chunks'
 * sums and sums of squares (the formulas of in_forward_kernel). */
__global__ static void in_nhwc_stats_kernel(struct in_nhwc_plan q, const double *psum, const double *psq,
                                            float *mean, float *invstd)
{
    int64_t pl = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (pl >= q.n * q.c) return; /* whole warps leave together */
    double s, sq;
    gp_nhwc_fold_parts(pl, q.p, psum, psq, s, sq);
    if ((threadIdx.x & 31) != 0) return;
    double m = q.s > 0 ? s / (double)q.s : 0.0;
    double var = q.s > 0 ? DSUB(sq / (double)q.s, DMUL(m, m)) : 0.0;
    if (var < 0) var = 0; /* rounding, for values all (nearly) equal */
    mean[pl] = (float)m;
    invstd[pl] = (float)(1.0 / sqrt(DADD(var, q.eps)));
}

/* Elementwise launch: per sample, blocks whose thread count is a multiple
 * of the runs per row, about IN_NHWC_RUNS runs a thread. */
static unsigned in_nhwc_flat_blocks(const struct in_nhwc_plan &q)
{
    int64_t a = q.cr, b = IN_THREADS;
    while (b) { /* gcd(cr, IN_THREADS) */
        int64_t t = a % b;
        a = b;
        b = t;
    }
    int64_t g = q.cr / a; /* blocks must be a multiple of this */
    int64_t per = (int64_t)IN_THREADS * IN_NHWC_RUNS, want = (q.s * q.cr + per - 1) / per;
    if (want > 4096) want = 4096;
    int64_t blocks = (want + g - 1) / g * g;
    return (unsigned)(blocks < g ? g : blocks);
}

/* The thread's rounds over sample blockIdx.y's runs: IN_NHWC_ILP runs
 * e + u G at a time (G the grid's threads across the sample, a multiple
 * of the runs per row). */
#define IN_NHWC_ROUNDS(q, e, G)                                                                        \
    for (int64_t G = (int64_t)gridDim.x * IN_THREADS, e = blockIdx.x * (int64_t)IN_THREADS + threadIdx.x; \
         e < (q).s * (q).cr; e += IN_NHWC_ILP * G)

/* y = (x - mean) (invstd scale) + bias, in_forward_kernel's operations. */
template <class IO, int VEC>
__global__ static void in_nhwc_apply_kernel(struct in_nhwc_plan q, gp_fptr x, gp_fptr scale, gp_fptr bias,
                                            const float *mean, const float *invstd, gp_fptr y)
{
    const int64_t n = blockIdx.y, e0 = blockIdx.x * (int64_t)IN_THREADS + threadIdx.x, total = q.s * q.cr;
    const int64_t cb = (e0 - gp_dev_fdiv(e0, q.cr) * q.cr) * VEC, base = n * q.s * q.c;
    float m[VEC], a[VEC], b[VEC];
#pragma unroll
    for (int i = 0; i < VEC; i++) {
        m[i] = mean[n * q.c + cb + i];
        a[i] = FMUL(invstd[n * q.c + cb + i], IO::par(scale, cb + i));
        b[i] = IO::par(bias, cb + i);
    }
    IN_NHWC_ROUNDS(q, e, G) {
        float v[IN_NHWC_ILP][VEC];
#pragma unroll
        for (int u = 0; u < IN_NHWC_ILP; u++)
            if (e + u * G < total) IO::template acts<VEC>(x, base + (e + u * G) * VEC, v[u]);
#pragma unroll
        for (int u = 0; u < IN_NHWC_ILP; u++) {
            if (e + u * G >= total) continue;
#pragma unroll
            for (int i = 0; i < VEC; i++) v[u][i] = FADD(FMUL(FSUB(v[u][i], m[i]), a[i]), b[i]);
            IO::template set_acts<VEC>(y, base + (e + u * G) * VEC, v[u]);
        }
    }
}

static gp_status in_nhwc_forward(struct gp_cuda_ctx *ctx, struct gp_error *err)
{
    gp_fptr x = gp_cuda_in_f(ctx, 0), scale = gp_cuda_in_f(ctx, 1), bias = gp_cuda_in_f(ctx, 2);
    gp_fptr y = gp_cuda_out_f(ctx, 0), none = {NULL, false};
    enum io_kind kind = io_kind_of({x, y}, {scale, bias});
    struct in_nhwc_plan q, qs; /* the elementwise pass's runs, the sums' */
    in_nhwc_plan_of(ctx->graph, ctx->node, 1, &q);
    int vec = io_vec_for(kind, q.c, {x, y});
    in_nhwc_plan_of(ctx->graph, ctx->node, vec, &q);
    in_nhwc_plan_of(ctx->graph, ctx->node, in_nhwc_sums_vec(vec), &qs);
    if (q.n * q.c == 0) return GP_OK;
    float *mean = (float *)ctx->saved, *invstd = mean + q.n * q.c;
    struct in_nhwc_scratch sc = in_nhwc_scratch_of(ctx);
    if (q.s > 0) {
        dim3 grid((unsigned)qs.gx, (unsigned)qs.p, (unsigned)qs.n), block((unsigned)qs.tx, (unsigned)qs.ty, 1);
        IO_DISPATCH(kind, IN_VEC4_DISPATCH(qs.vec, in_nhwc_sums_kernel<IO, VEC, false><<<grid, block, 0,
                                                                                         ctx->stream>>>(
                                                  qs, x, none, NULL, NULL, sc.part_a, sc.part_b)));
        GP_TRY(gp_cuda_check_launch(ctx, "InstanceNormalization sums (channels-last)", err));
    }
    in_nhwc_stats_kernel<<<in_nhwc_warp_blocks(q.n * q.c), 256, 0, ctx->stream>>>(qs, sc.part_a, sc.part_b, mean,
                                                                                   invstd);
    GP_TRY(gp_cuda_check_launch(ctx, "InstanceNormalization statistics (channels-last)", err));
    if (q.s == 0) return GP_OK;
    dim3 grid(in_nhwc_flat_blocks(q), (unsigned)q.n, 1);
    IO_DISPATCH(kind, IO_VEC_DISPATCH(q.vec, in_nhwc_apply_kernel<IO, VEC><<<grid, IN_THREADS, 0, ctx->stream>>>(
                                             q, x, scale, bias, mean, invstd, y)));
    return gp_cuda_check_launch(ctx, "InstanceNormalization normalize (channels-last)", err);
}

/* Warp w: plane w's sums of dy and dy xhat (to sums[2 pl], sums[2 pl + 1]
 * for in_bwd_params_kernel) and dX's coefficients (coef[3 pl ..]: scale
 * invstd, mean(dy), mean(dy xhat): in_bwd_plane_kernel's). */
__global__ static void in_nhwc_bwd_finish_kernel(struct in_nhwc_plan q, gp_fptr scale, const float *invstd,
                                                 const double *pdy, const double *pdyx, double *sums, double *coef)
{
    int64_t pl = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (pl >= q.n * q.c) return;
    double s, sx;
    gp_nhwc_fold_parts(pl, q.p, pdy, pdyx, s, sx);
    if ((threadIdx.x & 31) != 0) return;
    sums[2 * pl] = s;
    sums[2 * pl + 1] = sx;
    coef[3 * pl] = DMUL((double)gp_ld(scale, pl % q.c), (double)invstd[pl]);
    coef[3 * pl + 1] = s / (double)q.s;
    coef[3 * pl + 2] = sx / (double)q.s;
}

/* dx += scale invstd (dy - mean(dy) - xhat mean(dy xhat)) in double, as
 * in_bwd_plane_kernel (ow: dx = 0 + that, dx not read). */
template <class IO, int VEC>
__global__ static void in_nhwc_dx_kernel(struct in_nhwc_plan q, gp_fptr x, gp_fptr dy, const float *mean,
                                         const float *invstd, const double *coef, gp_fptr dx, bool ow)
{
    const int64_t n = blockIdx.y, e0 = blockIdx.x * (int64_t)IN_THREADS + threadIdx.x, total = q.s * q.cr;
    const int64_t cb = (e0 - gp_dev_fdiv(e0, q.cr) * q.cr) * VEC, base = n * q.s * q.c;
    float m[VEC], is[VEC];
    double a[VEC], mdy[VEC], mdyx[VEC];
#pragma unroll
    for (int i = 0; i < VEC; i++) {
        int64_t pl = n * q.c + cb + i;
        m[i] = mean[pl];
        is[i] = invstd[pl];
        a[i] = coef[3 * pl];
        mdy[i] = coef[3 * pl + 1];
        mdyx[i] = coef[3 * pl + 2];
    }
    IN_NHWC_ROUNDS(q, e, G) {
        float g[IN_NHWC_ILP][VEC], xv[IN_NHWC_ILP][VEC], d[IN_NHWC_ILP][VEC];
#pragma unroll
        for (int u = 0; u < IN_NHWC_ILP; u++) {
            if (e + u * G >= total) continue;
            int64_t off = base + (e + u * G) * VEC;
            IO::template acts<VEC>(dy, off, g[u]);
            IO::template acts<VEC>(x, off, xv[u]);
            if (ow) {
#pragma unroll
                for (int i = 0; i < VEC; i++) d[u][i] = 0.0f;
            } else {
                IO::template acts<VEC>(dx, off, d[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < IN_NHWC_ILP; u++) {
            if (e + u * G >= total) continue;
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                double xhat = (double)FMUL(FSUB(xv[u][i], m[i]), is[i]);
                double v = DMUL(a[i], DSUB(DSUB((double)g[u][i], mdy[i]), DMUL(xhat, mdyx[i])));
                d[u][i] = FADD(d[u][i], (float)v);
            }
            IO::template set_acts<VEC>(dx, base + (e + u * G) * VEC, d[u]);
        }
    }
}

static gp_status in_nhwc_backward(struct gp_cuda_ctx *ctx, const struct in_bwd_tensors &t, struct gp_error *err)
{
    gp_fptr x = t.x, scale = t.scale, dy = t.dy, dx = t.dx, dscale = t.dscale, dbias = t.dbias;
    struct in_nhwc_plan q, qs;
    in_nhwc_plan_of(ctx->graph, ctx->node, 1, &q);
    if (q.n * q.c == 0 || q.s == 0 || (!dx.p && !dscale.p && !dbias.p)) return GP_OK;
    enum io_kind kind = io_kind_of({x, dy, dx}, {scale});
    int vec = io_vec_for(kind, q.c, {x, dy, dx});
    /* dX's runs: at most 4 channels (its coefficients are doubles). */
    in_nhwc_plan_of(ctx->graph, ctx->node, vec > 4 ? 4 : vec, &q);
    in_nhwc_plan_of(ctx->graph, ctx->node, in_nhwc_sums_vec(vec), &qs);
    const float *mean = (const float *)ctx->saved, *invstd = mean + q.n * q.c;
    struct in_nhwc_scratch sc = in_nhwc_scratch_of(ctx);
    dim3 grid((unsigned)qs.gx, (unsigned)qs.p, (unsigned)qs.n), block((unsigned)qs.tx, (unsigned)qs.ty, 1);
    IO_DISPATCH(kind, IN_VEC4_DISPATCH(qs.vec, in_nhwc_sums_kernel<IO, VEC, true><<<grid, block, 0, ctx->stream>>>(
                                              qs, x, dy, mean, invstd, sc.part_a, sc.part_b)));
    GP_TRY(gp_cuda_check_launch(ctx, "InstanceNormalization backward sums (channels-last)", err));
    in_nhwc_bwd_finish_kernel<<<in_nhwc_warp_blocks(q.n * q.c), 256, 0, ctx->stream>>>(
        qs, scale, invstd, sc.part_a, sc.part_b, sc.sums, sc.coef);
    GP_TRY(gp_cuda_check_launch(ctx, "InstanceNormalization backward coefficients (channels-last)", err));
    if (dx.p) {
        dim3 fgrid(in_nhwc_flat_blocks(q), (unsigned)q.n, 1);
        bool ow = gp_cuda_overwrite(ctx, 0);
        IO_DISPATCH(kind, IN_VEC4_DISPATCH(q.vec, in_nhwc_dx_kernel<IO, VEC><<<fgrid, IN_THREADS, 0, ctx->stream>>>(
                                                 q, x, dy, mean, invstd, sc.coef, dx, ow)));
        GP_TRY(gp_cuda_check_launch(ctx, "InstanceNormalization backward dx (channels-last)", err));
    }
    struct in_plan p = {q.n, q.c, q.s, q.eps};
    return in_params_grad(ctx, p, sc.sums, dscale, dbias, err);
}

/* X and Y both channels-last (the layout pass tags both or neither; a
 * mixed call gets [N, C, H, W] copies); scale and B are never tagged. */
static bool in_layout_native(const struct gp_graph *g, const struct gp_node *node, uint32_t in_nhwc,
                             uint32_t out_nhwc, bool backward)
{
    (void)g, (void)node, (void)backward;
    return in_nhwc == 1u && out_nhwc == 1u;
}

/* ---- the table ---- */

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_instance_norm[] = {
    {"InstanceNormalization", in_saved, in_scratch, in_forward, in_backward, false, true, false,
     gp_cuda_overwrites_input0, in_layout_native},
    {NULL, NULL, NULL, NULL, NULL},
};
