/* CUDA kernels: BatchNormalization, twin of backend/cpu/batch_norm.c,
 * forward and backward, with the CPU's (PyTorch's) formulas: biased
 * variance, epsilon inside the square root, y = (x - mean) * invstd *
 * scale + bias; and the deferred update of the running statistics
 * (gp_cuda_bn_stats_len, gp_cuda_bn_commit).
 *
 * A fused Relu (gp_node.fused_relu, graph/fuse.c): the normalize pass
 * writes max(y, 0) by Relu's formula, and the backward passes read the
 * output to mask dY where it is not positive, as the CPU kernel does.
 * A fused residual Add (gp_node.fused_add, input 5): the normalize pass
 * adds it (bn_out_value), and the backward writes its gradient first, then
 * runs the plain backward on it (bn_residual_backward).
 *
 * Statistics are accumulated in double, as the CPU does: the mean first,
 * then the sum of squared deviations from it (two passes), so the float
 * results agree with the CPU's to an ulp. Every reduction runs in a fixed
 * order (per-thread strided sums, then a shuffle/shared-memory tree of a
 * fixed block size, then partial sums added in chunk order), so results are
 * identical run to run; no atomics anywhere. The channels-last
 * statistics widen values to double with integer operations and an exact
 * DMUL instead of F2F (bn_widen_scaled): the same doubles, so the same
 * sums bit for bit; a lane that met an infinity or NaN walks its rows
 * again with F2F.
 *
 * Each channel's N * S values are split into P chunks (a function of the
 * shape only): a grid of C x P blocks writes per-chunk partial sums to
 * scratch, one thread per channel adds them in chunk order and finishes
 * the statistics (saved mean / inverse std, the optional outputs, the
 * running statistics or the deferred sums), and an elementwise pass
 * applies them. Backward mirrors it.
 *
 * Bandwidth: one 2-byte load per thread at a time leaves the memory
 * system mostly idle (these kernels once ran at a fifth of the H200's
 * bandwidth, and at a quarter with 8 such loads in flight: ncu measured
 * 1.1 TB/s over a ResNet-50 step). So every pass moves runs of up to 8
 * consecutive values of a plane as one access of up to 16 bytes
 * (io_vec_for: the longest run dividing the plane that the tensors'
 * alignment allows), several runs in flight per thread, all of a round's
 * loads issued before the first is used; the elementwise passes follow
 * each run's channel incrementally (no division per value). The sums add
 * a thread's values in run order, then the fixed tree: the order depends
 * on the shape and the run length only, so results are reproducible.
 *
 * Rounding: nvcc contracts a * b + c into FMAs, the CPU build does not;
 * where a product feeds a sum the operations are spelled with the _rn
 * intrinsics (never contracted), in float and in double, in the CPU's order
 * of operations.
 *
 * bfloat16 (gp_cuda_kernel.bf16_any): X, Y, dY and dX may be stored as
 * bfloat16, and so may the [C] tensors, each as ctx->*_dt says. Loads widen
 * exactly and every stored value is rounded once (to nearest even), dX
 * after its one float32 term is added to the widened old value: the
 * results of the float32 kernel on widened copies, rounded back (the
 * staged call, backend/mixed_call.h), at half the bytes. Statistics,
 * saved state and scratch stay float32 / double. */
#include <initializer_list>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/convert.h"
#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/norm_nhwc.cuh"
#include "backend/cuda/norm_storage.cuh"
#include "util/env.h"

/* ---- storage: IO of norm_storage.cuh for X, Y, dY, dX and the parameters;
 * the per-channel finishing kernels read and write their [C] tensors with
 * gp_ld / gp_st whatever the call (C values, not worth a template). */

/* ---- BatchNormalization ---- */

/* X [N, C, D...]: statistics per channel over N and the spatial cells S.
 * The passes move runs of `vec` consecutive values of a plane (8, 4, 2 or
 * 1: io_vec_for) as one access; a channel's count = N * S values are
 * N * sg runs (sg = S / vec) in (n, i) order, split into P chunks of lg
 * runs (the last one shorter). */
struct bn_plan {
    int64_t n, c, s, count;
    int vec;           /* values per run */
    int64_t sg, countg; /* runs per plane, per channel */
    int64_t p, lg;     /* chunks per channel, runs per chunk */
    int64_t wr, wc;    /* a step of BN_THREADS runs of [N, C, sg]: plane runs, channels (mod C) */
    double eps, momentum;
};

#define BN_THREADS 256
#define BN_MAX_CHUNKS 64

/* Runs in flight per thread and pass: all of a thread's loads of a round
 * are issued before the first is used. 16 values for runs of 2 to 8 (32
 * bytes of bfloat16 per tensor), 8 one at a time. */
__host__ __device__ constexpr int bn_ilp_for(int vec) { return vec >= 8 ? 2 : vec == 4 ? 4 : 8; }
template <int VEC> struct bn_ilp {
    static const int n = bn_ilp_for(VEC);
};

/* About 2048 blocks in all, at least 2048 values per chunk: the chunks a
 * channel is split into, at most (scratch is planned for this many). */
static int64_t bn_chunks_max(int64_t c, int64_t count)
{
    int64_t chunks = (2048 + c - 1) / (c > 0 ? c : 1);
    int64_t by_size = (count + 2047) / 2048;
    if (chunks > by_size) chunks = by_size;
    if (chunks > BN_MAX_CHUNKS) chunks = BN_MAX_CHUNKS;
    return chunks < 1 ? 1 : chunks;
}

static void bn_plan_of(const struct gp_graph *g, const struct gp_node *node, int vec, struct bn_plan *p)
{
    const struct gp_shape *x = &gp_node_input(g, node, 0)->shape;
    p->n = x->dims[0];
    p->c = x->rank > 1 ? x->dims[1] : 1;
    p->s = 1;
    for (int i = 2; i < x->rank; i++) p->s *= x->dims[i];
    p->count = p->n * p->s;
    p->vec = vec > 1 && p->s % vec == 0 ? vec : 1;
    p->sg = p->s / p->vec;
    p->countg = p->n * p->sg;
    int64_t chunks = bn_chunks_max(p->c, p->count);
    p->lg = (p->countg + chunks - 1) / chunks;
    if (p->lg < 1) p->lg = 1;
    p->p = (p->countg + p->lg - 1) / p->lg;
    if (p->p < 1) p->p = 1;
    p->wr = p->sg > 0 ? BN_THREADS % p->sg : 0;
    p->wc = p->sg > 0 && p->c > 0 ? (BN_THREADS / p->sg) % p->c : 0;
    p->eps = gp_node_attr_float(node, "epsilon", 1e-5f);
    p->momentum = gp_node_attr_float(node, "momentum", 0.9f);
}

/* A fused residual (gp_node.fused_add): input 5, added to the normalized
 * value (bn_out_value); p NULL without one. */
static gp_fptr bn_residual(const struct gp_cuda_ctx *ctx)
{
    gp_fptr none = {NULL, false};
    return ctx->node->fused_add ? gp_cuda_in_f(ctx, 5) : none;
}

/* Whether the normalized value is rounded to bfloat16 before a fused
 * residual is added: the output is stored as bfloat16 (as the unfused
 * BatchNorm's was), also when this call got float32 copies. */
static bool bn_round_bf16(const struct gp_cuda_ctx *ctx, gp_fptr y)
{
    return ctx->stored_out_dt ? ctx->stored_out_dt[0] == GP_DTYPE_BFLOAT16 : y.bf16;
}

/* Saved per call: the mean [C] and inverse standard deviation [C] (float)
 * that normalized the forward, as on the CPU, then the transform's alpha
 * and beta pairs [C]: channels-last's backward reads them back to tell
 * where a fused Relu's output was positive without reading the output,
 * and a remade output (gp_cuda_ctx.remake) is the normalize pass again on
 * them. */
static size_t bn_saved(const struct gp_graph *g, const struct gp_node *node)
{
    return 4 * sizeof(float) * (size_t)gp_node_input(g, node, 0)->shape.dims[1];
}

/* Scratch (doubles): forward partials psum, psq_raw, psq [C * P] each;
 * backward partials [2 C P] and per-channel coefficients [5 C]; P at its
 * most for any run length. */
static int64_t bn_nhwc_chunks_max(const struct gp_graph *g, const struct gp_node *node);

/* The most chunks per channel of either layout (scratch's partials). */
static int64_t bn_scratch_chunks(const struct gp_graph *g, const struct gp_node *node)
{
    struct bn_plan p;
    bn_plan_of(g, node, 1, &p);
    int64_t chunks = bn_chunks_max(p.c, p.count), cl = bn_nhwc_chunks_max(g, node);
    return cl > chunks ? cl : chunks;
}

static size_t bn_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    int64_t c = gp_node_input(g, node, 0)->shape.dims[1];
    return sizeof(double) * (size_t)(3 * c * bn_scratch_chunks(g, node) + 5 * c);
}

/* Walks runs j0 + t, j0 + t + T, ... < j1 of channel c (t the thread,
 * T the block's size): run offset (n C + c) sg + i for j = n sg + i, kept
 * incrementally. ILP runs at a time: load(offset of its first value) for
 * each of them first, then add(run) for each, in order. */
template <class V, int ILP, class Load, class Add>
__device__ static inline void bn_chunk_walk(const struct bn_plan &p, int64_t c, int64_t j0, int64_t j1,
                                            Load load, Add add)
{
    const int64_t step = blockDim.x;
    int64_t j = j0 + threadIdx.x;
    int64_t n = j / p.sg, i = j - n * p.sg;
    const int64_t dn = step / p.sg, di = step - dn * p.sg;
    for (; j < j1; j += ILP * step) {
        V v[ILP];
#pragma unroll
        for (int k = 0; k < ILP; k++) {
            if (j + k * step < j1) v[k] = load(((n * p.c + c) * p.sg + i) * p.vec);
            i += di;
            n += dn;
            if (i >= p.sg) i -= p.sg, n++;
        }
#pragma unroll
        for (int k = 0; k < ILP; k++)
            if (j + k * step < j1) add(v[k]);
    }
}

/* The elementwise passes: run e of [N, C, sg] and its channel, e
 * advancing by BN_THREADS (the block's size) from the thread's first:
 * one division per ILP runs. */
__device__ static inline void bn_walk_init(const struct bn_plan &p, int64_t e, int64_t *r, int64_t *c)
{
    int64_t q = gp_dev_fdiv(e, p.sg);
    *r = e - q * p.sg;
    *c = q - gp_dev_fdiv(q, p.c) * p.c;
}

__device__ static inline void bn_walk_next(const struct bn_plan &p, int64_t *r, int64_t *c)
{
    *r += p.wr;
    *c += p.wc;
    if (*r >= p.sg) *r -= p.sg, (*c)++;
    if (*c >= p.c) *c -= p.c;
}

/* Thread t of block b handles runs e0 + k BN_THREADS, k < ILP, e0 =
 * b BN_THREADS ILP + t, then a grid's span further. */
#define BN_FLAT_LOOP(total, ilp, e0)                                                  \
    for (int64_t e0 = blockIdx.x * ((int64_t)BN_THREADS * (ilp)) + threadIdx.x; e0 < (total); \
         e0 += (int64_t)gridDim.x * BN_THREADS * (ilp))

static unsigned bn_flat_blocks(const struct bn_plan &p)
{
    int64_t span = (int64_t)BN_THREADS * bn_ilp_for(p.vec);
    return gp_cuda_capped_grid((p.n * p.c * p.sg + span - 1) / span, 1 << 20);
}

/* A run of values. */
template <int VEC> struct bn_run {
    float v[VEC];
};
template <int VEC> struct bn_run2 {
    float a[VEC], b[VEC];
};


/* The run of x at value offset off. */
template <class IO, int VEC> __device__ static inline bn_run<VEC> bn_load_run(gp_fptr x, int64_t off)
{
    bn_run<VEC> r;
    IO::template acts<VEC>(x, off, r.v);
    return r;
}

/* Block (c, k): chunk k of channel c: sum and sum of squares of x. */
template <class IO, int VEC>
__global__ static void bn_sums_kernel(struct bn_plan p, gp_fptr x, double *psum, double *psq_raw)
{
    __shared__ double sh[32];
    int64_t c = blockIdx.x, k = blockIdx.y;
    int64_t j0 = k * p.lg, j1 = j0 + p.lg < p.countg ? j0 + p.lg : p.countg;
    double s = 0, q = 0;
    bn_chunk_walk<bn_run<VEC>, bn_ilp<VEC>::n>(
        p, c, j0, j1,
        [&](int64_t off) { return bn_load_run<IO, VEC>(x, off); },
        [&](const bn_run<VEC> &r) {
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                double v = r.v[i];
                s = DADD(s, v);
                q = DADD(q, DMUL(v, v));
            }
        });
    s = gp_dev_block_sum(s, sh);
    q = gp_dev_block_sum(q, sh);
    if (threadIdx.x == 0) psum[c * p.p + k] = s, psq_raw[c * p.p + k] = q;
}

/* The channel's mean: its chunks' sums added in chunk order. */
__device__ static double bn_channel_mean(const struct bn_plan &p, const double *psum, int64_t c)
{
    double s = 0;
    for (int64_t k = 0; k < p.p; k++) s = DADD(s, psum[c * p.p + k]);
    return s / (double)p.count;
}

/* Block (c, k): sum over chunk k of (x - mean)^2, mean the channel's. */
template <class IO, int VEC>
__global__ static void bn_sq_kernel(struct bn_plan p, gp_fptr x, const double *psum, double *psq)
{
    __shared__ double sh[32];
    __shared__ double mean_sh;
    int64_t c = blockIdx.x, k = blockIdx.y;
    if (threadIdx.x == 0) mean_sh = bn_channel_mean(p, psum, c);
    __syncthreads();
    double m = mean_sh;
    int64_t j0 = k * p.lg, j1 = j0 + p.lg < p.countg ? j0 + p.lg : p.countg;
    double q = 0;
    bn_chunk_walk<bn_run<VEC>, bn_ilp<VEC>::n>(
        p, c, j0, j1,
        [&](int64_t off) { return bn_load_run<IO, VEC>(x, off); },
        [&](const bn_run<VEC> &r) {
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                double d = DSUB((double)r.v[i], m);
                q = DADD(q, DMUL(d, d));
            }
        });
    q = gp_dev_block_sum(q, sh);
    if (threadIdx.x == 0) psq[c * p.p + k] = q;
}

struct bn_outs {
    gp_fptr rmean, rvar;                   /* inputs 3 and 4, updated in place */
    gp_fptr out_rmean, out_rvar, out_mean, out_var; /* p NULL: absent */
    float *mean, *invstd;                  /* saved */
    double *deferred;
    gp_fptr scale, bias;
    float *ab; /* [C] pairs: the transform's alpha and beta */
};

/* Channel c's statistics from its sums (training: sum, sum of squares,
 * and with two passes q, the sum of squared deviations), the outputs, the
 * running statistics and the transform's alpha and beta. */
__device__ static void bn_finish_channel(const struct bn_plan &p, int64_t c, bool training, bool update, double sum,
                                         double sumsq, double q, bool one_pass, const struct bn_outs &o)
{
    double m, var;
    if (training) {
        m = sum / (double)p.count;
        /* Channels-last takes one pass: the squared deviations from
         * the sums (in double, exact enough for float data: the
         * deferred statistics do the same). */
        if (one_pass) {
            q = DSUB(sumsq, DMUL(sum, m));
            if (q < 0) q = 0;
        }
        var = q / (double)p.count;
    } else {
        m = gp_ld(o.rmean, c);
        var = gp_ld(o.rvar, c);
    }
    float is = (float)(1.0 / sqrt(DADD(var, p.eps)));
    o.mean[c] = (float)m;
    o.invstd[c] = is;
    float alpha = FMUL(is, gp_ld(o.scale, c));
    o.ab[2 * c] = alpha;
    o.ab[2 * c + 1] = FSUB(gp_ld(o.bias, c), FMUL((float)m, alpha));
    float rm = gp_ld(o.rmean, c), rv = gp_ld(o.rvar, c), new_mean = rm, new_var = rv;
    if (training) {
        double unbiased = DMUL(var, (double)p.count) / (double)(p.count - 1);
        new_mean = (float)DADD(DMUL(p.momentum, (double)rm), DMUL(DSUB(1.0, p.momentum), m));
        new_var = (float)DADD(DMUL(p.momentum, (double)rv), DMUL(DSUB(1.0, p.momentum), unbiased));
    }
    if (o.out_rmean.p) gp_st(o.out_rmean, c, new_mean);
    if (o.out_rvar.p) gp_st(o.out_rvar, c, new_var);
    if (o.out_mean.p) gp_st(o.out_mean, c, (float)m);
    if (o.out_var.p) gp_st(o.out_var, c, (float)var);
    if (update && o.deferred) {
        o.deferred[c] = DADD(o.deferred[c], sum);
        o.deferred[p.c + c] = DADD(o.deferred[p.c + c], sumsq);
        if (c == 0) o.deferred[2 * p.c] = DADD(o.deferred[2 * p.c], (double)p.count);
    } else if (update) {
        gp_st(o.rmean, c, new_mean);
        gp_st(o.rvar, c, new_var);
    }
}

/* One thread per channel: the statistics (the batch's in training, the
 * running ones in evaluation), saved mean and inverse std, the optional
 * outputs, and the running statistics (in place) or the deferred sums. */
__global__ static void bn_finish_kernel(struct bn_plan p, bool training, bool update,
                                        const double *psum, const double *psq_raw,
                                        const double *psq, bool one_pass, struct bn_outs o)
{
    GP_GRID_STRIDE(c, p.c) {
        double sum = 0, sumsq = 0, q = 0;
        if (training)
            for (int64_t k = 0; k < p.p; k++) {
                sum = DADD(sum, psum[c * p.p + k]);
                sumsq = DADD(sumsq, psq_raw[c * p.p + k]);
                if (!one_pass) q = DADD(q, psq[c * p.p + k]);
            }
        bn_finish_channel(p, c, training, update, sum, sumsq, q, one_pass, o);
    }
}

/* A fused residual (gp_node.fused_add): t + r, t rounded first to the
 * output's storage (as the unfused BatchNorm stored it; exact in float32),
 * the Add's float32 sum; then a fused Relu, by Relu's formula (NaN passes),
 * before the store's rounding, which keeps the sign (and 0). */
__device__ static inline float bn_out_value(float t, const float *r, int i, bool round_bf16, bool relu)
{
    if (r) t = FADD(round_bf16 ? __bfloat162float(__float2bfloat16_rn(t)) : t, r[i]);
    return !relu || t > 0 || t != t ? t : 0.0f;
}

/* y = x * alpha + beta, alpha = invstd * scale, beta = bias - mean * alpha
 * (PyTorch's transform, as the CPU computes it; alpha and beta from the
 * finishing kernel), plus a fused residual `res` (p NULL: none). */
template <class IO, int VEC>
__global__ static void bn_apply_kernel(struct bn_plan p, gp_fptr x, const float *ab, gp_fptr res, bool round_bf16,
                                       gp_fptr y, bool relu)
{
    const int ILP = bn_ilp<VEC>::n;
    const int64_t total = p.n * p.c * p.sg;
    BN_FLAT_LOOP(total, ILP, e0) {
        int64_t r, c;
        bn_walk_init(p, e0, &r, &c);
        float v[ILP][VEC], rv[ILP][VEC];
        int ch[ILP];
#pragma unroll
        for (int k = 0; k < ILP; k++) {
            int64_t e = e0 + k * BN_THREADS;
            ch[k] = (int)c;
            if (e < total) IO::template acts<VEC>(x, e * VEC, v[k]);
            if (e < total && res.p) IO::template acts<VEC>(res, e * VEC, rv[k]);
            bn_walk_next(p, &r, &c);
        }
#pragma unroll
        for (int k = 0; k < ILP; k++) {
            int64_t e = e0 + k * BN_THREADS;
            if (e >= total) continue;
            float a = ab[2 * ch[k]], b = ab[2 * ch[k] + 1];
#pragma unroll
            for (int i = 0; i < VEC; i++)
                v[k][i] = bn_out_value(FADD(FMUL(v[k][i], a), b), res.p ? rv[k] : NULL, i, round_bf16, relu);
            IO::template set_acts<VEC>(y, e * VEC, v[k]);
        }
    }
}

/* Inputs X [N, C, D...], scale [C], B [C], mean [C], var [C] -> Y like X;
 * optional outputs [C]: running mean and var as updated by this batch, and
 * (opsets 7, 9) the batch's mean and biased variance. Training updates the
 * running statistics in place (ctx->update_state) with ONNX's momentum and
 * the unbiased batch variance, or adds the batch's sums to
 * ctx->deferred_stats; evaluation uses the running statistics. */
static gp_status bn_nhwc_forward(struct gp_cuda_ctx *ctx, struct gp_error *err);
/* A fused residual's gradient for the channels-last statistics pass to
 * write (bn_residual_backward): the incoming dY, the fused Relu's output
 * Y (p NULL: no Relu) and dY's second term `add` (gp_cuda_ctx.dout_addend;
 * p NULL: none). */
struct bn_res_src {
    gp_fptr dy, y, add;
};
static gp_status bn_nhwc_backward(struct gp_cuda_ctx *ctx, bool relu, const struct bn_res_src *res,
                                  struct gp_error *err);
static bool bn_nhwc_bwd_sums_run(const struct gp_cuda_ctx *ctx);

static gp_status bn_forward(struct gp_cuda_ctx *ctx, struct gp_error *err)
{
    for (int i = 0; i < 5; i++) GP_TRY(gp_cuda_want_f32(ctx, i, err));
    if (gp_cuda_nhwc(ctx->in_nhwc, 0)) return bn_nhwc_forward(ctx, err);
    struct bn_plan p;
    bn_plan_of(ctx->graph, ctx->node, 1, &p);
    if (ctx->training && p.count < 2)
        return gp_cuda_error(ctx, err, GP_ERR_SHAPE,
                             "training needs more than one value per channel to estimate the "
                             "variance (input [%lld, %lld, ...]; PyTorch refuses this too)",
                             (long long)p.n, (long long)p.c);
    if (p.c == 0) return GP_OK;
    bool training = ctx->training, update = ctx->training && ctx->update_state;
    gp_fptr x = gp_cuda_in_f(ctx, 0), y = gp_cuda_out_f(ctx, 0), res = bn_residual(ctx);
    gp_fptr scale = gp_cuda_in_f(ctx, 1), bias = gp_cuda_in_f(ctx, 2);
    enum io_kind kind = io_kind_of({x, y, res}, {scale, bias});
    bn_plan_of(ctx->graph, ctx->node, io_vec_for(kind, p.s, {x, y, res}), &p);
    double *psum = (double *)ctx->scratch, *psq_raw = psum + p.c * p.p, *psq = psq_raw + p.c * p.p;
    /* A remade output (ctx->remake): the normalize pass alone, on the
     * alpha and beta the forward saved. */
    bool remake = ctx->remake;
    if (training && !remake) {
        dim3 grid((unsigned)p.c, (unsigned)p.p, 1);
        IO_DISPATCH(kind, IO_VEC_DISPATCH(p.vec, bn_sums_kernel<IO, VEC><<<grid, BN_THREADS, 0, ctx->stream>>>(
                                                 p, x, psum, psq_raw)));
        GP_TRY(gp_cuda_check_launch(ctx, "BatchNormalization sums", err));
        IO_DISPATCH(kind, IO_VEC_DISPATCH(p.vec, bn_sq_kernel<IO, VEC><<<grid, BN_THREADS, 0, ctx->stream>>>(
                                                 p, x, psum, psq)));
        GP_TRY(gp_cuda_check_launch(ctx, "BatchNormalization variance", err));
    }
    struct bn_outs o;
    o.rmean = gp_cuda_in_f(ctx, 3);
    o.rvar = gp_cuda_in_f(ctx, 4);
    o.out_rmean = opt_out_f(ctx, 1);
    o.out_rvar = opt_out_f(ctx, 2);
    o.out_mean = opt_out_f(ctx, 3);
    o.out_var = opt_out_f(ctx, 4);
    o.mean = (float *)ctx->saved;
    o.invstd = o.mean + p.c;
    o.deferred = ctx->deferred_stats;
    o.scale = scale;
    o.bias = bias;
    o.ab = o.mean + 2 * p.c; /* saved: a remade output's (bn_saved) */
    if (!remake) {
        bn_finish_kernel<<<gp_cuda_blocks_for(p.c), GP_CUDA_THREADS, 0, ctx->stream>>>(
            p, training, update, psum, psq_raw, psq, false, o);
        GP_TRY(gp_cuda_check_launch(ctx, "BatchNormalization statistics", err));
    }
    if (p.n * p.s == 0) return GP_OK;
    IO_DISPATCH(kind, IO_VEC_DISPATCH(p.vec, bn_apply_kernel<IO, VEC><<<bn_flat_blocks(p), BN_THREADS, 0,
                                                                   ctx->stream>>>(p, x, o.ab, res,
                                                                                  bn_round_bf16(ctx, y), y,
                                                                                  ctx->node->fused_relu)));
    return gp_cuda_check_launch(ctx, "BatchNormalization normalize", err);
}

/* Deferred statistics: 2C + 1 doubles, as on the CPU. */
extern "C" size_t gp_cuda_bn_stats_len(const struct gp_graph *g, const struct gp_node *node)
{
    return 2 * (size_t)gp_node_input(g, node, 0)->shape.dims[1] + 1;
}

__global__ static void bn_commit_kernel(int64_t c_n, double momentum, float *rmean, float *rvar,
                                        const double *stats, const int32_t *skip)
{
    double count = stats[2 * c_n];
    if (count < 2 || (skip && *skip)) return;
    GP_GRID_STRIDE(c, c_n) {
        double m = stats[c] / count;
        double var = DSUB(stats[c_n + c] / count, DMUL(m, m));
        if (var < 0) var = 0;
        double unbiased = DMUL(var, count) / DSUB(count, 1.0);
        rmean[c] = (float)DADD(DMUL(momentum, (double)rmean[c]), DMUL(DSUB(1.0, momentum), m));
        rvar[c] = (float)DADD(DMUL(momentum, (double)rvar[c]), DMUL(DSUB(1.0, momentum), unbiased));
    }
}

/* The running statistics from the mini-batch's accumulated sums (when it
 * counted at least 2 values per channel), then the sums cleared. */
extern "C" gp_status gp_cuda_bn_commit(cudaStream_t stream, const struct gp_graph *g,
                                       const struct gp_node *node, float *rmean, float *rvar,
                                       double *stats, const int32_t *skip, struct gp_error *err)
{
    int64_t c_n = gp_node_input(g, node, 0)->shape.dims[1];
    double momentum = gp_node_attr_float(node, "momentum", 0.9f);
    if (c_n > 0) {
        bn_commit_kernel<<<gp_cuda_blocks_for(c_n), GP_CUDA_THREADS, 0, stream>>>(c_n, momentum, rmean,
                                                                                  rvar, stats, skip);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            return gp_error_set(err, GP_ERR_DEVICE, "node '%s' (%s): deferred statistics commit: %s",
                                node->name, node->op_type, cudaGetErrorString(e));
    }
    cudaError_t e = cudaMemsetAsync(stats, 0, sizeof(double) * (size_t)(2 * c_n + 1), stream);
    if (e != cudaSuccess)
        return gp_error_set(err, GP_ERR_DEVICE,
                            "node '%s' (%s): clearing the deferred statistics (cudaMemsetAsync): %s",
                            node->name, node->op_type, cudaGetErrorString(e));
    return GP_OK;
}

/* A fused Relu's mask (no fused residual): whether the output the forward
 * stored was > 0, told from x as the forward computed it (the saved alpha
 * and beta: the normalize passes' float operations, then the output's
 * storage rounding), so backward need not read Y (ops/backward_reads.c):
 * the same bits as testing Y. Rounded to bfloat16 (to nearest even), t
 * stays above 0 exactly when t > 2^-134, half the least bfloat16
 * subnormal (2^-134 itself ties to 0); NaN fails both tests. */
__device__ static inline bool bn_relu_positive(float x, float alpha, float beta, bool y_bf16)
{
    return FADD(FMUL(x, alpha), beta) > (y_bf16 ? 0x1p-134f : 0.0f);
}

/* Block (c, k): sums over chunk k of dy and dy * xhat, xhat = (x - mean) *
 * invstd in float as on the CPU. */
template <class IO, int VEC>
__global__ static void bn_bwd_sums_kernel(struct bn_plan p, gp_fptr x, gp_fptr dy, const float *ab, bool y_bf16,
                                          const float *mean, const float *invstd, double *pdy, double *pdyx)
{
    __shared__ double sh[32];
    int64_t c = blockIdx.x, k = blockIdx.y;
    int64_t j0 = k * p.lg, j1 = j0 + p.lg < p.countg ? j0 + p.lg : p.countg;
    float m = mean[c], is = invstd[c];
    float ra = ab ? ab[2 * c] : 0.0f, rb = ab ? ab[2 * c + 1] : 0.0f;
    double s = 0, sx = 0;
    bn_chunk_walk<bn_run2<VEC>, bn_ilp<VEC>::n>(
        p, c, j0, j1,
        [&](int64_t off) {
            bn_run2<VEC> r;
            IO::template acts<VEC>(dy, off, r.a);
            IO::template acts<VEC>(x, off, r.b);
            if (ab)
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    if (!bn_relu_positive(r.b[i], ra, rb, y_bf16)) r.a[i] = 0.0f;
            return r;
        },
        [&](const bn_run2<VEC> &r) {
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                s = DADD(s, (double)r.a[i]);
                sx = DADD(sx, DMUL((double)r.a[i], (double)FMUL(FSUB(r.b[i], m), is)));
            }
        });
    s = gp_dev_block_sum(s, sh);
    sx = gp_dev_block_sum(sx, sh);
    if (threadIdx.x == 0) pdy[c * p.p + k] = s, pdyx[c * p.p + k] = sx;
}

struct bn_grads {
    gp_fptr scale;
    const float *invstd;
    gp_fptr d_rmean, d_rvar, d_mean, d_var; /* p NULL: absent or zero */
    gp_fptr dscale, dbias;                  /* p NULL: not wanted */
    double *coef; /* [5 C]: a, mdy, mdyx, cm, cv per channel */
};

/* Channel c's parameter gradients and dx coefficients from its sums. */
__device__ static void bn_bwd_finish_channel(const struct bn_plan &p, int64_t c, double sum_dy, double sum_dy_xhat,
                                             const struct bn_grads &g)
{
    if (g.dscale.p) gp_acc(g.dscale, c, (float)sum_dy_xhat);
    if (g.dbias.p) gp_acc(g.dbias, c, (float)sum_dy);
    if (!g.coef) return;
    double one_m = DSUB(1.0, p.momentum), count = (double)p.count;
    double g_mean = 0, g_var = 0;
    if (g.d_rmean.p) g_mean = DADD(g_mean, DMUL(one_m, (double)gp_ld(g.d_rmean, c)));
    if (g.d_mean.p) g_mean = DADD(g_mean, (double)gp_ld(g.d_mean, c));
    if (g.d_rvar.p)
        g_var = DADD(g_var,
                     DMUL(DMUL(one_m, count) / (double)(p.count - 1), (double)gp_ld(g.d_rvar, c)));
    if (g.d_var.p) g_var = DADD(g_var, (double)gp_ld(g.d_var, c));
    double *k = g.coef + 5 * c;
    k[0] = DMUL((double)gp_ld(g.scale, c), (double)g.invstd[c]);
    k[1] = sum_dy / count;
    k[2] = sum_dy_xhat / count;
    k[3] = g_mean / count;
    k[4] = DMUL(2.0, g_var) / count;
}

/* One thread per channel: the parameter gradients and dx's coefficients. */
__global__ static void bn_bwd_finish_kernel(struct bn_plan p, bool have_dy, const double *pdy,
                                            const double *pdyx, struct bn_grads g)
{
    GP_GRID_STRIDE(c, p.c) {
        double sum_dy = 0, sum_dy_xhat = 0;
        if (have_dy)
            for (int64_t k = 0; k < p.p; k++) {
                sum_dy = DADD(sum_dy, pdy[c * p.p + k]);
                sum_dy_xhat = DADD(sum_dy_xhat, pdyx[c * p.p + k]);
            }
        bn_bwd_finish_channel(p, c, sum_dy, sum_dy_xhat, g);
    }
}

/* Training: dx += a (dy - mdy - xhat mdyx) + cm + cv (x - mean), in
 * double, xc = x - mean in float as on the CPU; with `ow` dx = 0 + that
 * (dx not read: its first writer). The old dx is loaded with x and dy. */
template <class IO, int VEC>
__global__ static void bn_bwd_dx_train_kernel(struct bn_plan p, gp_fptr x, gp_fptr dy, const float *ab, bool y_bf16,
                                              const float *mean, const float *invstd, const double *coef, gp_fptr dx,
                                              bool ow)
{
    const int ILP = bn_ilp<VEC>::n;
    const int64_t total = p.n * p.c * p.sg;
    BN_FLAT_LOOP(total, ILP, e0) {
        int64_t r, c;
        bn_walk_init(p, e0, &r, &c);
        float xv[ILP][VEC], gv[ILP][VEC], old[ILP][VEC];
        int ch[ILP];
#pragma unroll
        for (int k = 0; k < ILP; k++) {
            int64_t e = e0 + k * BN_THREADS;
            ch[k] = (int)c;
            if (e < total) {
                IO::template acts<VEC>(x, e * VEC, xv[k]);
                if (dy.p)
                    IO::template acts<VEC>(dy, e * VEC, gv[k]);
                else
#pragma unroll
                    for (int i = 0; i < VEC; i++) gv[k][i] = 0.0f;
                if (ab && dy.p)
#pragma unroll
                    for (int i = 0; i < VEC; i++)
                        if (!bn_relu_positive(xv[k][i], ab[2 * ch[k]], ab[2 * ch[k] + 1], y_bf16)) gv[k][i] = 0.0f;
                if (ow)
#pragma unroll
                    for (int i = 0; i < VEC; i++) old[k][i] = 0.0f;
                else
                    IO::template acts<VEC>(dx, e * VEC, old[k]);
            }
            bn_walk_next(p, &r, &c);
        }
#pragma unroll
        for (int k = 0; k < ILP; k++) {
            int64_t e = e0 + k * BN_THREADS;
            if (e >= total) continue;
            const double *kc = coef + 5 * ch[k];
            const float m = mean[ch[k]];
            const double is = (double)invstd[ch[k]];
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                double xc = (double)FSUB(xv[k][i], m), xhat = DMUL(xc, is);
                double v = DMUL(kc[0], DSUB(DSUB((double)gv[k][i], kc[1]), DMUL(xhat, kc[2])));
                v = DADD(DADD(v, kc[3]), DMUL(kc[4], xc));
                old[k][i] = FADD(old[k][i], (float)v);
            }
            IO::template set_acts<VEC>(dx, e * VEC, old[k]);
        }
    }
}

/* Evaluation: dx += dy * (scale * invstd) (dx = 0 + that with `ow`). */
template <class IO, int VEC>
__global__ static void bn_bwd_dx_eval_kernel(struct bn_plan p, gp_fptr x, gp_fptr dy, const float *ab, bool y_bf16,
                                             gp_fptr scale, const float *invstd, gp_fptr dx, bool ow)
{
    const int ILP = bn_ilp<VEC>::n;
    const int64_t total = p.n * p.c * p.sg;
    BN_FLAT_LOOP(total, ILP, e0) {
        int64_t r, c;
        bn_walk_init(p, e0, &r, &c);
        float gv[ILP][VEC], old[ILP][VEC];
        int ch[ILP];
#pragma unroll
        for (int k = 0; k < ILP; k++) {
            int64_t e = e0 + k * BN_THREADS;
            ch[k] = (int)c;
            if (e < total) {
                IO::template acts<VEC>(dy, e * VEC, gv[k]);
                if (ab) {
                    float xv[VEC];
                    IO::template acts<VEC>(x, e * VEC, xv);
#pragma unroll
                    for (int i = 0; i < VEC; i++)
                        if (!bn_relu_positive(xv[i], ab[2 * ch[k]], ab[2 * ch[k] + 1], y_bf16)) gv[k][i] = 0.0f;
                }
                if (ow)
#pragma unroll
                    for (int i = 0; i < VEC; i++) old[k][i] = 0.0f;
                else
                    IO::template acts<VEC>(dx, e * VEC, old[k]);
            }
            bn_walk_next(p, &r, &c);
        }
#pragma unroll
        for (int k = 0; k < ILP; k++) {
            int64_t e = e0 + k * BN_THREADS;
            if (e >= total) continue;
            float f = FMUL(IO::par(scale, ch[k]), invstd[ch[k]]);
#pragma unroll
            for (int i = 0; i < VEC; i++) old[k][i] = FADD(old[k][i], FMUL(gv[k][i], f));
            IO::template set_acts<VEC>(dx, e * VEC, old[k]);
        }
    }
}

/* dY (and the gradients of the optional [C] outputs) -> dX, dscale, dB, as
 * on the CPU: in training the batch statistics depend on X,
 *   dx = scale invstd (dy - sum(dy) / count - xhat sum(dy xhat) / count)
 * plus what flows back through the statistics' outputs; in evaluation
 * dx = dy scale invstd. */
static gp_status bn_nchw_backward(struct gp_cuda_ctx *ctx, bool relu, struct gp_error *err)
{
    struct bn_plan p;
    bn_plan_of(ctx->graph, ctx->node, 1, &p);
    if (p.c == 0) return GP_OK;
    gp_fptr x = gp_cuda_in_f(ctx, 0), dy = gp_cuda_dout_f(ctx, 0), dx = gp_cuda_din_f(ctx, 0);
    gp_fptr scale = gp_cuda_in_f(ctx, 1);
    const float *mean = (const float *)ctx->saved, *invstd = mean + p.c;
    /* A fused Relu's mask, told from x by the saved alpha and beta
     * (bn_relu_positive) and the output's storage type: Y is not read. */
    const float *ab = relu ? mean + 2 * p.c : NULL;
    bool y_bf16 = relu && bn_round_bf16(ctx, gp_cuda_out_f(ctx, 0));
    enum io_kind kind = io_kind_of({x, dy, dx}, {scale});
    bn_plan_of(ctx->graph, ctx->node, io_vec_for(kind, p.s, {x, dy, dx}), &p);
    double *pdy = (double *)ctx->scratch, *pdyx = pdy + p.c * p.p, *coef = pdyx + p.c * p.p;
    bool have_dy = dy.p && p.count > 0;
    if (have_dy && (ctx->din[1] || ctx->din[2] || (dx.p && ctx->training))) {
        dim3 grid((unsigned)p.c, (unsigned)p.p, 1);
        IO_DISPATCH(kind, IO_VEC_DISPATCH(p.vec, bn_bwd_sums_kernel<IO, VEC><<<grid, BN_THREADS, 0, ctx->stream>>>(
                                                 p, x, dy, ab, y_bf16, mean, invstd, pdy, pdyx)));
        GP_TRY(gp_cuda_check_launch(ctx, "BatchNormalization backward sums", err));
    } else {
        have_dy = false;
    }
    struct bn_grads g;
    gp_fptr none = {NULL, false};
    g.scale = scale;
    g.invstd = invstd;
    g.d_rmean = opt_dout_f(ctx, 1);
    g.d_rvar = opt_dout_f(ctx, 2);
    g.d_mean = opt_dout_f(ctx, 3);
    g.d_var = opt_dout_f(ctx, 4);
    g.dscale = ctx->din[1] ? gp_cuda_din_f(ctx, 1) : none;
    g.dbias = ctx->din[2] ? gp_cuda_din_f(ctx, 2) : none;
    g.coef = dx.p && ctx->training ? coef : NULL;
    if (g.dscale.p || g.dbias.p || g.coef) {
        bn_bwd_finish_kernel<<<gp_cuda_blocks_for(p.c), GP_CUDA_THREADS, 0, ctx->stream>>>(
            p, have_dy, pdy, pdyx, g);
        GP_TRY(gp_cuda_check_launch(ctx, "BatchNormalization backward statistics", err));
    }
    int64_t n = p.n * p.c * p.s;
    if (!dx.p || n == 0) return GP_OK;
    bool ow = gp_cuda_overwrite(ctx, 0);
    if (ctx->training) {
        IO_DISPATCH(kind, IO_VEC_DISPATCH(p.vec, bn_bwd_dx_train_kernel<IO, VEC><<<bn_flat_blocks(p), BN_THREADS, 0,
                                                                          ctx->stream>>>(
                                                 p, x, dy, ab, y_bf16, mean, invstd, coef, dx, ow)));
    } else {
        if (!dy.p) /* nothing to add; zeros to write when dx is not cleared */
            return ow ? gp_cuda_call(ctx, cudaMemsetAsync(dx.p, 0, (size_t)n * (dx.bf16 ? 2 : 4), ctx->stream),
                                     "cudaMemsetAsync", err)
                      : GP_OK;
        IO_DISPATCH(kind, IO_VEC_DISPATCH(p.vec, bn_bwd_dx_eval_kernel<IO, VEC><<<bn_flat_blocks(p), BN_THREADS, 0,
                                                                         ctx->stream>>>(
                                                 p, x, dy, ab, y_bf16, scale, invstd, dx, ow)));
    }
    return gp_cuda_check_launch(ctx, "BatchNormalization backward dx", err);
}

/* dY's second term (gp_cuda_ctx.dout_addend: pipeline/plan.h, addend_off)
 * added into dY in place, the add its writer would have made, where no
 * pass of this backward adds it as it reads dY; none left after. */
static gp_status bn_add_addend(struct gp_cuda_ctx *ctx, struct gp_error *err)
{
    gp_fptr dy = gp_cuda_dout_f(ctx, 0);
    if (ctx->dout_addend && dy.p) {
        enum gp_dtype dt = dy.bf16 ? GP_DTYPE_BFLOAT16 : GP_DTYPE_FLOAT32;
        GP_TRY(gp_cuda_convert(ctx->stream, dy.p, dt, ctx->dout_addend, dt,
                               gp_shape_numel(&gp_cuda_out_value(ctx, 0)->shape), true, err));
    }
    ctx->dout_addend = NULL;
    return GP_OK;
}

/* A fused residual's backward (gp_node.fused_add): g = dY where the
 * output is > 0 (a fused Relu; dY everywhere without one), written into
 * the residual's gradient (dres: =, or += with one rounding, as the Add's
 * backward wrote it) and, when `in_place`, over dY itself, whose region
 * this backward is the last to read. Runs of VEC values. */
template <class IO, int VEC>
__global__ static void bn_residual_grad_kernel(int64_t runs, gp_fptr dy, gp_fptr y, gp_fptr dres, bool accumulate,
                                               bool in_place)
{
    GP_GRID_STRIDE(e, runs) {
        float g[VEC], m[VEC], old[VEC];
        IO::template acts<VEC>(dy, e * VEC, g);
        if (y.p) IO::template acts<VEC>(y, e * VEC, m);
        if (dres.p && accumulate) IO::template acts<VEC>(dres, e * VEC, old);
#pragma unroll
        for (int i = 0; i < VEC; i++)
            if (y.p && !(m[i] > 0)) g[i] = 0.0f;
        if (in_place) IO::template set_acts<VEC>(dy, e * VEC, g);
        if (dres.p) {
            if (accumulate)
#pragma unroll
                for (int i = 0; i < VEC; i++) old[i] = FADD(old[i], g[i]);
            IO::template set_acts<VEC>(dres, e * VEC, accumulate ? old : g);
        }
    }
}

/* A channels-last fused residual's gradient written by the statistics
 * pass (bn_nhwc_bwd_sums_kernel's RES) as it reads dY, one pass fewer than
 * its own kernel before it (the same bits); GP_BN_RES_SUMS=0 runs that
 * kernel instead. Read at each call (a getenv per BatchNorm backward, nothing
 * beside its passes), so that one process can compare both ways. */
static bool bn_res_sums(void)
{
    return gp_env_flag("GP_BN_RES_SUMS", true);
}

/* The backward of a BatchNormalization with a fused residual Add: the
 * residual's gradient first (bn_residual_grad_kernel), then the plain
 * BatchNorm backward on that same masked dY, read from where it was just
 * written: the residual's gradient when this writes it whole (its first
 * writer, the usual case: three passes where the unfused Add + Relu and
 * BatchNorm took four), else dY's own region, masked in place. */
static gp_status bn_residual_backward(struct gp_cuda_ctx *ctx, struct gp_error *err)
{
    gp_fptr dy = gp_cuda_dout_f(ctx, 0), dres = gp_cuda_din_f(ctx, 5);
    gp_fptr y = ctx->node->fused_relu ? gp_cuda_out_f(ctx, 0) : gp_fptr{NULL, false};
    int64_t n = gp_shape_numel(&gp_cuda_out_value(ctx, 0)->shape);
    bool ow = gp_cuda_overwrite(ctx, 5);
    bool nhwc = gp_cuda_nhwc(ctx->in_nhwc, 0);
    if (!dy.p) { /* no gradient: the residual's is zero, owed when it is not cleared */
        if (dres.p && ow)
            GP_TRY(gp_cuda_call(ctx, cudaMemsetAsync(dres.p, 0, (size_t)n * (dres.bf16 ? 2 : 4), ctx->stream),
                                "cudaMemsetAsync", err));
        return nhwc ? bn_nhwc_backward(ctx, false, NULL, err) : bn_nchw_backward(ctx, false, err);
    }
    /* dY's stand-in for the BatchNorm: the residual's gradient, written
     * whole in dY's storage type, or dY masked in place. */
    bool into_dres = dres.p && ow && dres.bf16 == dy.bf16;
    bool in_place = !into_dres && y.p;
    /* Channels-last, the statistics pass writes it as it reads dY
     * (bn_nhwc_bwd_sums_kernel's RES), adding dY's second term where there
     * is one, where it runs, unless GP_BN_RES_SUMS=0. */
    bool in_sums = into_dres && nhwc && n > 0 && bn_res_sums() && bn_nhwc_bwd_sums_run(ctx);
    gp_fptr add = {(void *)ctx->dout_addend, dy.bf16};
    if (!in_sums) GP_TRY(bn_add_addend(ctx, err));
    struct bn_res_src src = {dy, y, in_sums ? add : gp_fptr{NULL, false}};
    if (n > 0 && !in_sums && (dres.p || in_place)) {
        enum io_kind kind = io_kind_of({dy, y, dres}, {});
        int vec = io_vec_for(kind, n, {dy, y, dres});
        int64_t runs = n / vec;
        IO_DISPATCH(kind, IO_VEC_DISPATCH(vec, bn_residual_grad_kernel<IO, VEC><<<gp_cuda_blocks_for(runs),
                                                                           GP_CUDA_THREADS, 0, ctx->stream>>>(
                                                 runs, dy, y, dres, dres.p && !ow, in_place)));
        GP_TRY(gp_cuda_check_launch(ctx, "BatchNormalization residual gradient", err));
    }
    float *dout[8] = {0};
    for (int k = 0; k < ctx->node->n_outputs && k < 8; k++) dout[k] = ctx->dout[k];
    if (into_dres) dout[0] = (float *)dres.p;
    struct gp_cuda_ctx plain = *ctx;
    plain.dout = dout;
    plain.dout_addend = NULL; /* added above, or by the statistics pass (src) */
    return nhwc ? bn_nhwc_backward(&plain, false, in_sums ? &src : NULL, err) : bn_nchw_backward(&plain, false, err);
}

static gp_status bn_backward(struct gp_cuda_ctx *ctx, struct gp_error *err)
{
    for (int i = 0; i < 5; i++) GP_TRY(gp_cuda_want_f32(ctx, i, err));
    if (ctx->node->fused_add) return bn_residual_backward(ctx, err);
    GP_TRY(bn_add_addend(ctx, err));
    bool relu = ctx->node->fused_relu;
    return gp_cuda_nhwc(ctx->in_nhwc, 0) ? bn_nhwc_backward(ctx, relu, NULL, err)
                                         : bn_nchw_backward(ctx, relu, err);
}

/* ---- channels-last ----
 * X [N, D..., C] (gp_cuda_ctx.in_nhwc; Y, dY and dX alike) as rows of C
 * channels, rows = N * S. Every access is a run of `vec` consecutive
 * channels of one row (the longest of 8, 4, 2, 1 dividing C that the
 * tensors' alignment allows: 16 bytes of bfloat16 for any C divisible by
 * 8, which is every ResNet layer but the stem's input).
 *
 * Statistics: blocks of tx x ty threads (tx lanes across a row's runs, ty
 * lanes down the rows), a grid of gx blocks across the runs by p chunks of
 * rows. Each lane sums its rows in order in double, the ty lanes of a run
 * then add in a fixed order (norm_nhwc.cuh), and each chunk's partial sums
 * go to scratch in the NCHW kernels' places, so one finishing kernel serves
 * both layouts (in one pass: the sum and the sum of squares, the squared
 * deviations from them in double).
 *
 * Elementwise passes: a grid whose thread count is a multiple of the runs
 * per row, so a thread's runs all belong to the same channels and it loads
 * their per-channel coefficients once; a thread moves BN_NHWC_FLAT_ILP
 * runs a round, all loads first (one 16-byte load a thread at a time left
 * the normalize pass waiting on memory, 60% of the bandwidth). dX's runs
 * are at most 4 channels (its coefficients are doubles: see
 * bn_nhwc_backward). Results are reproducible (the order
 * depends on the shape and run length only) and equal the CPU's to float
 * rounding. */

struct bn_nhwc_plan {
    int64_t rows, c;
    int vec;        /* channels per run */
    int64_t cr;     /* runs per row */
    int tx, ty;     /* block: tx run lanes x ty row lanes, tx ty = BN_THREADS */
    int64_t gx;     /* blocks across a row's runs */
    int64_t p, lr;  /* chunks of rows, rows per chunk */
};

#define BN_NHWC_MAX_CHUNKS 4096
#define BN_NHWC_ILP 8      /* rows in flight per lane */
#define BN_NHWC_FLAT_ILP 4 /* elementwise passes: runs in flight per thread */
/* Training dx: runs in flight per thread. With its 80 registers (3 blocks
 * an SM, 37.5% occupancy) dx waits on its loads (ncu: 77% of stalls, 2.35
 * TB/s at 56 x 56 x 256), yet every other shape measured was slower on
 * ResNet-50 bf16 (H100, 2026-12-07; 5159 and 5164 samples/s as is): 2 runs
 * capped at 64 registers (4 blocks, 64 bytes spilled) 5097, 4 runs 4996
 * (486 bytes spilled); and the backward statistics capped at 80 registers
 * (3 blocks, 400 bytes spilled) 4769. */
#define BN_NHWC_DX_ILP 2

/* Tuning knobs, read once (measurement only; the defaults are the ones in
 * use): GP_BN_NHWC_BLOCKS, the statistics passes' target block count;
 * GP_BN_NHWC_STATS_VEC and GP_BN_NHWC_BWD_VEC, the forward's and the
 * backward's statistics run length in bfloat16; GP_BN_NHWC_RUNS, the
 * elementwise passes' runs per thread. */
static int bn_nhwc_knob(const char *name, int dflt)
{
    return (int)gp_env_positive(name, 1 << 20, dflt);
}
static int bn_nhwc_blocks_target(void)
{
    static int k = bn_nhwc_knob("GP_BN_NHWC_BLOCKS", 264);
    return k;
}
static int bn_nhwc_runs_per_thread(void)
{
    static int k = bn_nhwc_knob("GP_BN_NHWC_RUNS", 32);
    return k;
}
static int bn_nhwc_stats_vec_bf16(bool backward)
{
    static int fwd = bn_nhwc_knob("GP_BN_NHWC_STATS_VEC", 4), bwd = bn_nhwc_knob("GP_BN_NHWC_BWD_VEC", 4);
    return backward ? bwd : fwd;
}

static void bn_nhwc_plan_of(int64_t rows, int64_t c, int vec, struct bn_nhwc_plan *q)
{
    q->rows = rows;
    q->c = c;
    q->vec = vec > 1 && c % vec == 0 ? vec : 1;
    q->cr = c / q->vec;
    int tx = 1;
    while (tx < q->cr && tx < 32) tx *= 2;
    q->tx = tx;
    q->ty = BN_THREADS / tx;
    q->gx = (q->cr + tx - 1) / tx;
    /* About 264 blocks (one wave of 2 blocks an SM on an H200's 132
     * SMs: measured on ResNet-50 bf16, 264 5128 samples/s, 512 5037 and 5026,
     * 1024 4896; fewer blocks, fewer reductions), each lane at least
     * BN_NHWC_ILP rows; the chunks' partial sums are then folded per
     * channel by a warp each (bn_nhwc_finish_kernel). */
    int64_t target = bn_nhwc_blocks_target();
    int64_t chunks = (target + q->gx - 1) / q->gx;
    int64_t by_rows = (rows + (int64_t)BN_NHWC_ILP * q->ty - 1) / ((int64_t)BN_NHWC_ILP * q->ty);
    if (chunks > by_rows) chunks = by_rows;
    if (chunks > BN_NHWC_MAX_CHUNKS) chunks = BN_NHWC_MAX_CHUNKS;
    if (chunks < 1) chunks = 1;
    q->lr = (rows + chunks - 1) / chunks;
    if (q->lr < 1) q->lr = 1;
    q->p = (rows + q->lr - 1) / q->lr;
    if (q->p < 1) q->p = 1;
}

static void bn_nhwc_shape(const struct gp_graph *g, const struct gp_node *node, int64_t *rows, int64_t *c)
{
    const struct gp_shape *x = &gp_node_input(g, node, 0)->shape;
    *c = x->rank > 1 ? x->dims[1] : 1;
    *rows = x->dims[0];
    for (int i = 2; i < x->rank; i++) *rows *= x->dims[i];
}

/* The most chunks any run length takes (scratch is planned for it). */
static int64_t bn_nhwc_chunks_max(const struct gp_graph *g, const struct gp_node *node)
{
    int64_t rows, c, most = 1;
    bn_nhwc_shape(g, node, &rows, &c);
    for (int vec = 8; vec >= 1; vec /= 2) {
        struct bn_nhwc_plan q;
        bn_nhwc_plan_of(rows, c, vec, &q);
        if (q.p > most) most = q.p;
    }
    return most;
}

/* The statistics passes' runs: 4 channels (8 bytes of bfloat16, 16 of
 * float32), 8 rows in flight a lane. Measured on ResNet-50 bf16 (H200,
 * samples/s): forward runs of 4 channels 5100, of 8 5037 (twice the
 * doubles a lane: 128 registers); backward runs of 4 5037, of 2 5022.
 * The run-time typed path takes 1. The knobs (GP_BN_NHWC_STATS_VEC,
 * GP_BN_NHWC_BWD_VEC) give the bfloat16 lengths; float32 takes at most
 * 4. */
static int bn_nhwc_stats_vec(enum io_kind kind, int vec, bool backward)
{
    if (kind == IO_MIXED) return 1;
    int want = bn_nhwc_stats_vec_bf16(backward);
    if (kind == IO_F32 && want > 4) want = 4;
    while (want > 1 && (want > vec || vec % want)) want /= 2;
    return want;
}

/* Launches of the two finishing kernels below: a warp per channel. */
static unsigned bn_nhwc_finish_blocks(int64_t c) { return (unsigned)((c * 32 + 255) / 256); }

/* Warp w: channel w's statistics from its chunks' sums and squares
 * (training), then bn_finish_channel in one pass: one launch where the
 * NCHW kernels fold in their finishing kernel's loop. */
__global__ static void bn_nhwc_finish_kernel(struct bn_plan p, int64_t parts, bool training, bool update,
                                             const double *psum, const double *psq, struct bn_outs o)
{
    int64_t c = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (c >= p.c) return; /* whole warps leave together: c is the warp's */
    double sum = 0, sumsq = 0;
    if (training) gp_nhwc_fold_parts(c, parts, psum, psq, sum, sumsq);
    if ((threadIdx.x & 31) == 0) bn_finish_channel(p, c, training, update, sum, sumsq, 0, true, o);
}

/* Warp w: channel w's sums of dy and dy * xhat, then bn_bwd_finish_channel. */
__global__ static void bn_nhwc_bwd_finish_kernel(struct bn_plan p, int64_t parts, bool have_dy, const double *pdy,
                                                 const double *pdyx, struct bn_grads g)
{
    int64_t c = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (c >= p.c) return;
    double sum_dy = 0, sum_dy_xhat = 0;
    if (have_dy) gp_nhwc_fold_parts(c, parts, pdy, pdyx, sum_dy, sum_dy_xhat);
    if ((threadIdx.x & 31) == 0) bn_bwd_finish_channel(p, c, sum_dy, sum_dy_xhat, g);
}

/* The NCHW finishing kernels' plan for the same statistics. */
static struct bn_plan bn_plan_for_finish(const struct gp_node *node, const struct bn_nhwc_plan &q)
{
    struct bn_plan p;
    memset(&p, 0, sizeof p);
    p.n = q.rows;
    p.c = q.c;
    p.s = 1;
    p.count = q.rows;
    p.p = q.p;
    p.eps = gp_node_attr_float(node, "epsilon", 1e-5f);
    p.momentum = gp_node_attr_float(node, "momentum", 0.9f);
    return p;
}

/* Walks lane (run, threadIdx.y)'s rows of chunk k, BN_NHWC_ILP at a
 * time: load(value offset) for each first, then add(values). */
template <int VEC, class Load, class Add>
__device__ static inline void bn_nhwc_rows(const struct bn_nhwc_plan &q, int64_t run, int64_t k, Load load, Add add)
{
    const int64_t r0 = k * q.lr, r1 = r0 + q.lr < q.rows ? r0 + q.lr : q.rows;
    for (int64_t r = r0 + threadIdx.y; r < r1; r += (int64_t)BN_NHWC_ILP * q.ty) {
        decltype(load((int64_t)0)) v[BN_NHWC_ILP];
#pragma unroll
        for (int u = 0; u < BN_NHWC_ILP; u++)
            if (r + u * q.ty < r1) v[u] = load((r + u * q.ty) * q.c + run * VEC);
#pragma unroll
        for (int u = 0; u < BN_NHWC_ILP; u++)
            if (r + u * q.ty < r1) add(v[u]);
    }
}

/* Widening without F2F. A float32 -> float64 conversion (F2F.F64.F32)
 * issues at a quarter of the FP64 adds' rate on sm_90 (16 a clock an SM
 * against 64). Shifting a float's bits right by 3 (the sign kept: an
 * arithmetic shift, then the three copies of the sign cleared) gives the
 * double f * 2^-896 exactly for every finite f, zeros and subnormals
 * included (1023 - 127 = 896: float32 subnormals land on float64
 * subnormals of the same significand), two integer operations a value
 * (the low word is 0 for bfloat16, three for float32). The passes below
 * add and multiply such scaled values (scaling by a power of two commutes
 * with rounding) and scale the results back once. Infinities and NaNs
 * come out finite (|v| >= 2^128 x 2^-896), so each pass checks for them
 * (a square sum that large, a float check sum that overflows) and then
 * takes the F2F path: the same results bit for bit wherever F2F's would
 * be finite (the exceptions each pass names are below float's normal
 * range). */
__device__ static inline double bn_widen_scaled(float f, bool low_zero)
{
    unsigned u = __float_as_uint(f);
    unsigned hi = (unsigned)((int)u >> 3) & 0x8fffffffu;
    return __hiloint2double((int)hi, low_zero ? 0 : (int)(u << 29));
}

/* A compile-time bool for generic lambdas (decltype(arg)::value). */
template <bool V> struct bn_bool {
    static const bool value = V;
};

/* Whether IO's activations are bfloat16 (their float's low 16 bits 0). */
template <class IO> struct bn_io_bf16 {
    static const bool v = false;
};
template <> struct bn_io_bf16<io_typed<__nv_bfloat16>> {
    static const bool v = true;
};

/* The fast walks' loop: lane (run, threadIdx.y)'s rows of chunk k, ILP
 * at a time with no bounds checks, then the rest one at a time;
 * load(i) loads the lane's i-th row (row k lr + threadIdx.y + i ty).
 * bn_nhwc_rows, which checks every row's bounds on 64-bit offsets, took
 * 22 instructions a value at 2 channels a run (ncu, ResNet-50 bf16),
 * most of them addressing; its loop is the exact walks' below. */
template <int ILP, class Load, class Add>
__device__ static inline void bn_nhwc_lane(const struct bn_nhwc_plan &q, int64_t k, Load load, Add add)
{
    const int64_t r0 = k * q.lr + threadIdx.y, end = k * q.lr + q.lr < q.rows ? k * q.lr + q.lr : q.rows;
    const int64_t n = r0 < end ? (end - r0 + q.ty - 1) / q.ty : 0;
    int64_t i = 0;
    for (; i + ILP <= n; i += ILP) {
        decltype(load((int64_t)0)) v[ILP];
#pragma unroll
        for (int u = 0; u < ILP; u++) v[u] = load(i + u);
#pragma unroll
        for (int u = 0; u < ILP; u++) add(v[u]);
    }
#pragma unroll 1
    for (; i < n; i++) add(load(i));
}

/* Rows in flight per lane in the fast walks: 4 runs of 16 bytes, else 8
 * (64 bytes of each tensor a lane reads for runs of 8 bytes). */
__host__ __device__ constexpr int bn_nhwc_ilp(int vec, int elem) { return vec * elem >= 16 ? 4 : 8; }

/* Lane (run, threadIdx.y)'s sums and sums of squares of chunk k, exactly
 * as double sums of the values widened with F2F, into out[0 .. VEC) and
 * out[VEC .. 2 VEC): the statistics pass's fallback for a lane that met
 * a value it cannot widen with integer operations (an infinity or NaN).
 * Not inlined, and its results through memory, so that the fast walk's
 * values stay in registers. */
template <class IO, int VEC>
__device__ __noinline__ static void bn_nhwc_sums_exact(struct bn_nhwc_plan q, int64_t run, int64_t k, gp_fptr x,
                                                       double *out)
{
    double s[VEC], sq[VEC];
#pragma unroll
    for (int i = 0; i < VEC; i++) s[i] = sq[i] = 0;
    bn_nhwc_rows<VEC>(
        q, run, k, [&](int64_t off) { return bn_load_run<IO, VEC>(x, off); },
        [&](const bn_run<VEC> &r) {
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                double v = (double)r.v[i];
                s[i] = DADD(s[i], v);
                sq[i] = DADD(sq[i], DMUL(v, v));
            }
        });
#pragma unroll
    for (int i = 0; i < VEC; i++) out[i] = s[i], out[VEC + i] = sq[i];
}

/* Block (run group, chunk k): sums and sums of squares of x per channel.
 *
 * bfloat16: each value is widened scaled (bn_widen_scaled: x 2^-896,
 * two integer operations) and added so; its square is taken in float
 * (exact: 16 significant bits) and widened the same way. The scaled sums
 * times 2^896 are the double sums of the values and of their squares bit
 * for bit (scaling by a power of two commutes with rounding; below
 * double's normal range the sums are exact), with one exception: a
 * square below float's normal range (|x| < 2^-63) keeps only its bits
 * from 2^-146 up, which moves no variance that float can hold. Per value:
 * two DADDs and a handful of integer operations, where widening by F2F
 * and squaring by DMUL kept the FP64 and conversion pipes busy. A value that
 * is infinite or NaN (or squares past float's range) makes the scaled
 * sum of squares 2^-768 or more: the lane then walks again exactly
 * (bn_nhwc_sums_exact); every sum of finite values is the same either
 * way. float32: F2F, DMUL and DADD as on the CPU. */
template <class IO, int VEC>
__global__ static void __launch_bounds__(BN_THREADS, VEC >= 8 ? 2 : 3)
    bn_nhwc_sums_kernel(struct bn_nhwc_plan q, gp_fptr x, double *psum, double *psq_raw)
{
    __shared__ double sh[BN_THREADS * VEC * 2]; /* the reduction's, and the exact walk's results */
    const bool B = bn_io_bf16<IO>::v;
    const int64_t run = blockIdx.x * (int64_t)q.tx + threadIdx.x, k = blockIdx.y;
    double s[VEC], sq[VEC];
#pragma unroll
    for (int i = 0; i < VEC; i++) s[i] = sq[i] = 0;
    if (run < q.cr) {
        const int64_t off = (k * q.lr + threadIdx.y) * q.c + run * VEC, step = (int64_t)q.ty * q.c;
        bn_nhwc_lane<bn_nhwc_ilp(VEC, B ? 2 : 4)>(
            q, k, [&](int64_t i) { return bn_load_run<IO, VEC>(x, off + i * step); },
            [&](const bn_run<VEC> &r) {
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    if (B) {
                        s[i] = DADD(s[i], bn_widen_scaled(r.v[i], true));
                        sq[i] = DADD(sq[i], bn_widen_scaled(FMUL(r.v[i], r.v[i]), true));
                    } else {
                        double v = (double)r.v[i];
                        s[i] = DADD(s[i], v);
                        sq[i] = DADD(sq[i], DMUL(v, v));
                    }
                }
            });
        if (B) {
            bool big = false;
#pragma unroll
            for (int i = 0; i < VEC; i++) big |= !(sq[i] < 0x1p-768);
            if (big) {
                double *out = sh + (threadIdx.y * q.tx + threadIdx.x) * 2 * VEC;
                bn_nhwc_sums_exact<IO, VEC>(q, run, k, x, out);
#pragma unroll
                for (int i = 0; i < VEC; i++) s[i] = out[i], sq[i] = out[VEC + i];
            } else {
#pragma unroll
                for (int i = 0; i < VEC; i++) s[i] = DMUL(s[i], 0x1p896), sq[i] = DMUL(sq[i], 0x1p896);
            }
        }
    }
    __syncthreads(); /* an exact walk's results read back before sh is reused */
    gp_nhwc_reduce_lanes<BN_THREADS, VEC>(q.tx, s, sq, sh);
    if (threadIdx.y == 0 && run < q.cr)
#pragma unroll
        for (int i = 0; i < VEC; i++) {
            int64_t c = run * VEC + i;
            psum[c * q.p + k] = s[i];
            psq_raw[c * q.p + k] = sq[i];
        }
}

/* Elementwise launch: BN_THREADS-thread blocks, a thread count that is a
 * multiple of the runs per row (so each thread's runs share channels),
 * about bn_nhwc_runs_per_thread runs per thread, at most 8192 blocks
 * before that rounding. 32 runs a thread (ResNet-50 bf16: 5119 samples/s
 * against 5103 at 16 and 5037 at 8): the per-channel coefficients, loaded
 * once a thread, cost less. Small layers run few blocks so (ResNet-50's
 * 7 x 7 and 14 x 14 layers: 98-392 of them, dx at 0.5-1.8 TB/s by ncu's
 * DRAM bytes, mostly L2 hits), yet at least a full wave of blocks (8 an
 * SM) where the tensor allowed was slower: ResNet-50 bf16 on an H100 5065
 * samples/s against 5118, each thread loading and deriving its channels'
 * coefficients for fewer runs (2026-12-07). */
static unsigned bn_nhwc_flat_blocks(const struct bn_nhwc_plan &q)
{
    int64_t total = q.rows * q.cr, g = 1, a = q.cr, b = BN_THREADS;
    while (b) { /* gcd(cr, BN_THREADS) */
        int64_t t = a % b;
        a = b;
        b = t;
    }
    g = q.cr / a; /* blocks must be a multiple of this */
    int64_t per = (int64_t)BN_THREADS * bn_nhwc_runs_per_thread();
    int64_t want = (total + per - 1) / per;
    if (want > 8192) want = 8192;
    int64_t blocks = (want + g - 1) / g * g;
    return (unsigned)(blocks < g ? g : blocks);
}

/* The thread's rounds: BN_NHWC_FLAT_ILP runs e + u G at a time (G the
 * grid's threads, a multiple of the runs per row: every run of a thread
 * has the same channels), all their loads issued before the first value
 * is used; a round's runs are distinct values, each loaded and stored by
 * this thread alone, so the order is safe whatever the tensors alias.
 * Offsets stay in int64 (e + u G < rows cr + 3 G). */
#define BN_NHWC_ROUNDS(q, e, G, ILP)                                                               \
    for (int64_t G = (int64_t)gridDim.x * BN_THREADS, e = blockIdx.x * (int64_t)BN_THREADS + threadIdx.x; \
         e < (q).rows * (q).cr; e += (ILP) * G)

/* y = x * alpha + beta per channel (bn_apply_kernel's formula). */
template <class IO, int VEC>
__global__ static void bn_nhwc_apply_kernel(struct bn_nhwc_plan q, gp_fptr x, const float *ab, gp_fptr res,
                                            bool round_bf16, gp_fptr y, bool relu)
{
    const int ILP = BN_NHWC_FLAT_ILP;
    const int64_t e0 = blockIdx.x * (int64_t)BN_THREADS + threadIdx.x, total = q.rows * q.cr;
    const int64_t cb = (e0 - gp_dev_fdiv(e0, q.cr) * q.cr) * VEC;
    float a[VEC], b[VEC];
#pragma unroll
    for (int i = 0; i < VEC; i++) a[i] = ab[2 * (cb + i)], b[i] = ab[2 * (cb + i) + 1];
    BN_NHWC_ROUNDS(q, e, G, ILP) {
        float v[ILP][VEC], rv[ILP][VEC];
#pragma unroll
        for (int u = 0; u < ILP; u++) {
            if (e + u * G < total) IO::template acts<VEC>(x, (e + u * G) * VEC, v[u]);
            if (e + u * G < total && res.p) IO::template acts<VEC>(res, (e + u * G) * VEC, rv[u]);
        }
#pragma unroll
        for (int u = 0; u < ILP; u++) {
            if (e + u * G >= total) continue;
#pragma unroll
            for (int i = 0; i < VEC; i++)
                v[u][i] = bn_out_value(FADD(FMUL(v[u][i], a[i]), b[i]), res.p ? rv[u] : NULL, i, round_bf16, relu);
            IO::template set_acts<VEC>(y, (e + u * G) * VEC, v[u]);
        }
    }
}

static gp_status bn_nhwc_forward(struct gp_cuda_ctx *ctx, struct gp_error *err)
{
    int64_t rows, c;
    bn_nhwc_shape(ctx->graph, ctx->node, &rows, &c);
    if (ctx->training && rows < 2)
        return gp_cuda_error(ctx, err, GP_ERR_SHAPE,
                             "training needs more than one value per channel to estimate the "
                             "variance (input [%lld, %lld, ...]; PyTorch refuses this too)",
                             (long long)gp_node_input(ctx->graph, ctx->node, 0)->shape.dims[0], (long long)c);
    if (c == 0) return GP_OK;
    bool training = ctx->training, update = ctx->training && ctx->update_state;
    gp_fptr x = gp_cuda_in_f(ctx, 0), y = gp_cuda_out_f(ctx, 0), res = bn_residual(ctx);
    gp_fptr scale = gp_cuda_in_f(ctx, 1), bias = gp_cuda_in_f(ctx, 2);
    enum io_kind kind = io_kind_of({x, y, res}, {scale, bias});
    struct bn_nhwc_plan q, qs; /* the elementwise pass's runs, the statistics' */
    int vec = io_vec_for(kind, c, {x, y, res});
    bn_nhwc_plan_of(rows, c, vec, &q);
    bn_nhwc_plan_of(rows, c, bn_nhwc_stats_vec(kind, vec, false), &qs);
    struct bn_plan p = bn_plan_for_finish(ctx->node, qs);
    double *psum = (double *)ctx->scratch, *psq_raw = psum + c * qs.p;
    bool remake = ctx->remake; /* the normalize pass alone, on the saved alpha and beta */
    if (training && !remake) { /* rows >= 2 */
        dim3 grid((unsigned)qs.gx, (unsigned)qs.p, 1), block((unsigned)qs.tx, (unsigned)qs.ty, 1);
        IO_DISPATCH(kind, IO_VEC_DISPATCH(qs.vec, bn_nhwc_sums_kernel<IO, VEC><<<grid, block, 0, ctx->stream>>>(
                                                  qs, x, psum, psq_raw)));
        GP_TRY(gp_cuda_check_launch(ctx, "BatchNormalization sums (channels-last)", err));
    }
    struct bn_outs o;
    o.rmean = gp_cuda_in_f(ctx, 3);
    o.rvar = gp_cuda_in_f(ctx, 4);
    o.out_rmean = opt_out_f(ctx, 1);
    o.out_rvar = opt_out_f(ctx, 2);
    o.out_mean = opt_out_f(ctx, 3);
    o.out_var = opt_out_f(ctx, 4);
    o.mean = (float *)ctx->saved;
    o.invstd = o.mean + p.c;
    o.deferred = ctx->deferred_stats;
    o.scale = scale;
    o.bias = bias;
    o.ab = o.mean + 2 * c; /* saved: backward's Relu mask (bn_relu_positive) */
    if (!remake) {
        bn_nhwc_finish_kernel<<<bn_nhwc_finish_blocks(c), 256, 0, ctx->stream>>>(p, qs.p, training, update, psum,
                                                                                psq_raw, o);
        GP_TRY(gp_cuda_check_launch(ctx, "BatchNormalization statistics (channels-last)", err));
    }
    if (rows == 0) return GP_OK;
    IO_DISPATCH(kind, IO_VEC_DISPATCH(q.vec, bn_nhwc_apply_kernel<IO, VEC><<<bn_nhwc_flat_blocks(q), BN_THREADS, 0,
                                                                         ctx->stream>>>(
                                             q, x, o.ab, res, bn_round_bf16(ctx, y), y, ctx->node->fused_relu)));
    return gp_cuda_check_launch(ctx, "BatchNormalization normalize (channels-last)", err);
}

/* The fused Relu's alpha and beta of this thread's VEC channels from cb
 * (ab NULL: no Relu; zeros). */
template <int VEC>
__device__ static inline void bn_nhwc_relu_coefs(const float *ab, int64_t cb, float (&ra)[VEC], float (&rb)[VEC])
{
#pragma unroll
    for (int i = 0; i < VEC; i++) {
        ra[i] = ab ? ab[2 * (cb + i)] : 0.0f;
        rb[i] = ab ? ab[2 * (cb + i) + 1] : 0.0f;
    }
}

/* Lane (run, threadIdx.y)'s sums of dy and dy * xhat of chunk k (the
 * fused Relu's mask applied to dy when ab is not NULL), exactly as double
 * sums of values widened with F2F, into out[0 .. VEC) and out[VEC ..
 * 2 VEC): the fallback of bn_nhwc_bwd_sums_kernel for a lane that met an
 * infinity or NaN. Not inlined, its results through memory and its
 * per-channel values loaded again, so that the fast walk's values stay
 * in registers. */
template <class IO, int VEC>
__device__ __noinline__ static void bn_nhwc_bwd_exact(struct bn_nhwc_plan q, int64_t run, int64_t k, gp_fptr x,
                                                      gp_fptr dy, const float *ab, bool y_bf16, const float *mean,
                                                      const float *invstd, double *out)
{
    double s[VEC], sx[VEC];
    float m[VEC], is[VEC], ra[VEC], rb[VEC];
#pragma unroll
    for (int i = 0; i < VEC; i++) {
        s[i] = sx[i] = 0;
        m[i] = mean[run * VEC + i];
        is[i] = invstd[run * VEC + i];
    }
    bn_nhwc_relu_coefs<VEC>(ab, run * VEC, ra, rb);
    bn_nhwc_rows<VEC>(
        q, run, k,
        [&](int64_t off) {
            bn_run2<VEC> r;
            IO::template acts<VEC>(dy, off, r.a);
            IO::template acts<VEC>(x, off, r.b);
            return r;
        },
        [&](const bn_run2<VEC> &r) {
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                float g = ab && !bn_relu_positive(r.b[i], ra[i], rb[i], y_bf16) ? 0.0f : r.a[i];
                double gd = (double)g;
                s[i] = DADD(s[i], gd);
                sx[i] = DADD(sx[i], DMUL(gd, (double)FMUL(FSUB(r.b[i], m[i]), is[i])));
            }
        });
#pragma unroll
    for (int i = 0; i < VEC; i++) out[i] = s[i], out[VEC + i] = sx[i];
}

/* Block (run group, chunk k): sums of dy and dy * xhat per channel (a
 * fused Relu's mask, from the saved alpha and beta `ab` when not NULL,
 * applied to dy), xhat = (x - mean) * invstd in float, as
 * bn_bwd_sums_kernel.
 *
 * dy is widened scaled (bn_widen_scaled: integer operations) and
 * multiplied by xhat widened with F2F: the products and sums are the
 * exact ones x 2^-896, times 2^896 at the end (bit for bit the double
 * sums but for products below 2^-126, which keep their bits from 2^-178
 * up). A float check sum of |dy| |xhat| that is not finite may hide an
 * infinity or NaN widened as a finite value: the lane then walks again
 * exactly (bn_nhwc_bwd_exact). The loop (bn_nhwc_lane) has no bounds
 * checks: the walk that checked every row's bounds and widened both
 * factors with F2F took 37 instructions a value and stalled on its
 * loads at 25% occupancy (ncu, ResNet-50 bf16: 1.4 TB/s).
 *
 * RES: dy is a fused residual's gradient that this pass writes whole as
 * it reads its source: rdy masked where the fused Relu's output ry is not
 * > 0 (ry NULL: no Relu), the values bn_residual_grad_kernel writes (one
 * pass fewer over the block's output: that kernel's read back of them
 * goes). An exact walk then reads dy back, the lane's own writes. As
 * many rows in flight: at the default run lengths (4 channels) ptxas
 * (sm_90) spills no more than without RES (bfloat16 none, float32 20
 * bytes). ADD (with RES): rdy's second term radd (gp_cuda_ctx.dout_addend)
 * added first, as the add pass in place would have (float32 sum, one
 * rounding to rdy's storage): that pass's write and read back go. */
template <class IO, int VEC, bool RES, bool ADD>
__global__ static void __launch_bounds__(BN_THREADS, 2)
    bn_nhwc_bwd_sums_kernel(struct bn_nhwc_plan q, gp_fptr x, gp_fptr dy, const float *ab, bool y_bf16,
                            const float *mean, const float *invstd, double *pdy, double *pdyx, gp_fptr rdy,
                            gp_fptr ry, gp_fptr radd)
{
    __shared__ double sh[BN_THREADS * VEC * 2]; /* the reduction's, and the exact walk's results */
    const bool B = bn_io_bf16<IO>::v;
    const int64_t run = blockIdx.x * (int64_t)q.tx + threadIdx.x, k = blockIdx.y;
    double s[VEC], sx[VEC];
    float m[VEC], is[VEC], ra[VEC], rb[VEC];
#pragma unroll
    for (int i = 0; i < VEC; i++) {
        s[i] = sx[i] = 0;
        m[i] = run < q.cr ? mean[run * VEC + i] : 0.0f;
        is[i] = run < q.cr ? invstd[run * VEC + i] : 0.0f;
    }
    bn_nhwc_relu_coefs<VEC>(run < q.cr ? ab : NULL, run * VEC, ra, rb);
    if (run < q.cr) {
        const int64_t off = (k * q.lr + threadIdx.y) * q.c + run * VEC, step = (int64_t)q.ty * q.c;
        float chk = 0;
        bn_nhwc_lane<bn_nhwc_ilp(VEC, B ? 2 : 4)>(
            q, k,
            [&](int64_t i) {
                bn_run2<VEC> r;
                if (RES) {
                    /* The residual's gradient, bn_residual_grad_kernel's
                     * values, written as they are read. */
                    IO::template acts<VEC>(rdy, off + i * step, r.a);
                    if (ADD) {
                        float a[VEC];
                        IO::template acts<VEC>(radd, off + i * step, a);
#pragma unroll
                        for (int j = 0; j < VEC; j++) r.a[j] = IO::stored(rdy, FADD(r.a[j], a[j]));
                    }
                    if (ry.p) {
                        float m[VEC];
                        IO::template acts<VEC>(ry, off + i * step, m);
#pragma unroll
                        for (int j = 0; j < VEC; j++)
                            if (!(m[j] > 0)) r.a[j] = 0.0f;
                    }
                    IO::template set_acts<VEC>(dy, off + i * step, r.a);
                } else {
                    IO::template acts<VEC>(dy, off + i * step, r.a);
                }
                IO::template acts<VEC>(x, off + i * step, r.b);
                return r;
            },
            [&](const bn_run2<VEC> &r) {
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    float g = ab && !bn_relu_positive(r.b[i], ra[i], rb[i], y_bf16) ? 0.0f : r.a[i];
                    float xhat = FMUL(FSUB(r.b[i], m[i]), is[i]);
                    double gs = bn_widen_scaled(g, B);
                    s[i] = DADD(s[i], gs);
                    sx[i] = DADD(sx[i], DMUL(gs, (double)xhat));
                    chk = __fmaf_rn(fabsf(g), fabsf(xhat), chk);
                }
            });
        if (!(chk <= 3.402823466e38f)) {
            double *out = sh + (threadIdx.y * q.tx + threadIdx.x) * 2 * VEC;
            bn_nhwc_bwd_exact<IO, VEC>(q, run, k, x, dy, ab, y_bf16, mean, invstd, out);
#pragma unroll
            for (int i = 0; i < VEC; i++) s[i] = out[i], sx[i] = out[VEC + i];
        } else {
#pragma unroll
            for (int i = 0; i < VEC; i++) s[i] = DMUL(s[i], 0x1p896), sx[i] = DMUL(sx[i], 0x1p896);
        }
    }
    __syncthreads(); /* an exact walk's results read back before sh is reused */
    gp_nhwc_reduce_lanes<BN_THREADS, VEC>(q.tx, s, sx, sh);
    if (threadIdx.y == 0 && run < q.cr)
#pragma unroll
        for (int i = 0; i < VEC; i++) {
            int64_t c = run * VEC + i;
            pdy[c * q.p + k] = s[i];
            pdyx[c * q.p + k] = sx[i];
        }
}

/* Training dx, bn_bwd_dx_train_kernel's formula per channel,
 *   v = k0 ((dy - k1) - xhat k2) + k3 + k4 xc,  xhat = xc invstd, xc = x - mean,
 * regrouped in double as v = a dy + b x + c1 (a = k0, b = k4 - k0 k2
 * invstd, c1 = k3 - k0 k1 - b mean), two FMAs on dy and x widened
 * exactly; the thread's channels' coefficients loaded once.
 *
 * dy and x are widened scaled (bn_widen_scaled: x 2^-896 by integer
 * operations) against a and b scaled by 2^896, so the products are the
 * exact ones: one F2F a value (v to float), where F2F-widening dy and
 * x - mean took four and kept the conversion pipe three quarters busy.
 * A round whose values are not all finite (an infinity or NaN widens
 * scaled to a finite value; the check is a float |dy| |x| sum) and a
 * thread whose a or b is too large to scale take the same formula with
 * F2F-widened values (times 2^-896 when a and b are scaled: exact). */
template <class IO, int VEC>
__global__ static void __launch_bounds__(BN_THREADS, 3)
    bn_nhwc_dx_train_kernel(struct bn_nhwc_plan q, gp_fptr x, gp_fptr dy, const float *ab, bool y_bf16,
                            const float *mean, const float *invstd, const double *coef, gp_fptr dx, bool ow)
{
    const bool B = bn_io_bf16<IO>::v;
    const int64_t e0 = blockIdx.x * (int64_t)BN_THREADS + threadIdx.x;
    const int64_t cb = (e0 - gp_dev_fdiv(e0, q.cr) * q.cr) * VEC;
    float ra[VEC], rb[VEC];
    double a[VEC], b[VEC], c1[VEC];
    bool scaled = true;
    bn_nhwc_relu_coefs<VEC>(dy.p ? ab : NULL, cb, ra, rb);
#pragma unroll
    for (int i = 0; i < VEC; i++) {
        const double *kc = coef + 5 * (cb + i);
        a[i] = kc[0];
        b[i] = DSUB(kc[4], DMUL(DMUL(kc[0], kc[2]), (double)invstd[cb + i]));
        c1[i] = DSUB(DSUB(kc[3], DMUL(kc[0], kc[1])), DMUL(b[i], (double)mean[cb + i]));
        scaled = scaled && fabs(a[i]) < 0x1p127 && fabs(b[i]) < 0x1p127;
    }
    if (scaled)
#pragma unroll
        for (int i = 0; i < VEC; i++) a[i] = DMUL(a[i], 0x1p896), b[i] = DMUL(b[i], 0x1p896);
    const double unscale = scaled ? 0x1p-896 : 1.0; /* F2F-widened values to a and b's scale */
    const int ILP = BN_NHWC_DX_ILP;
    const int64_t total = q.rows * q.cr, G = (int64_t)gridDim.x * BN_THREADS;
    /* One round: ILP runs e + u G (CHECK: some may lie past the end). The
     * fast and the F2F arithmetic are two branches, not one select:
     * written as a select, both were computed for every value. */
    auto round = [&](int64_t e, auto check) {
        const bool CHECK = decltype(check)::value;
        float xv[ILP][VEC], gv[ILP][VEC], old[ILP][VEC];
        float chk = 0;
#pragma unroll
        for (int u = 0; u < ILP; u++) {
            if (CHECK && e + u * G >= total) continue;
            const int64_t off = (e + u * G) * VEC;
            IO::template acts<VEC>(x, off, xv[u]);
            if (dy.p)
                IO::template acts<VEC>(dy, off, gv[u]);
            else
#pragma unroll
                for (int i = 0; i < VEC; i++) gv[u][i] = 0.0f;
            if (ow)
#pragma unroll
                for (int i = 0; i < VEC; i++) old[u][i] = 0.0f;
            else
                IO::template acts<VEC>(dx, off, old[u]);
        }
#pragma unroll
        for (int u = 0; u < ILP; u++) {
            if (CHECK && e + u * G >= total) continue;
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                if (ab && dy.p && !bn_relu_positive(xv[u][i], ra[i], rb[i], y_bf16)) gv[u][i] = 0.0f;
                chk = __fmaf_rn(fabsf(gv[u][i]), fabsf(xv[u][i]), chk);
            }
        }
        if (scaled && chk <= 3.402823466e38f) {
#pragma unroll
            for (int u = 0; u < ILP; u++)
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    double v = __fma_rn(a[i], bn_widen_scaled(gv[u][i], B),
                                        __fma_rn(b[i], bn_widen_scaled(xv[u][i], B), c1[i]));
                    old[u][i] = FADD(old[u][i], (float)v);
                }
        } else {
#pragma unroll
            for (int u = 0; u < ILP; u++)
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    double v = __fma_rn(a[i], DMUL((double)gv[u][i], unscale),
                                        __fma_rn(b[i], DMUL((double)xv[u][i], unscale), c1[i]));
                    old[u][i] = FADD(old[u][i], (float)v);
                }
        }
#pragma unroll
        for (int u = 0; u < ILP; u++) {
            if (CHECK && e + u * G >= total) continue;
            IO::template set_acts<VEC>(dx, (e + u * G) * VEC, old[u]);
        }
    };
    /* Whole rounds unchecked, then at most one with some runs past the end. */
    int64_t e = e0;
    for (; e + (ILP - 1) * G < total; e += ILP * G) round(e, bn_bool<false>());
    if (e < total) round(e, bn_bool<true>());
}

/* Evaluation dx += dy * (scale * invstd). */
template <class IO, int VEC>
__global__ static void bn_nhwc_dx_eval_kernel(struct bn_nhwc_plan q, gp_fptr x, gp_fptr dy, const float *ab,
                                              bool y_bf16, gp_fptr scale, const float *invstd, gp_fptr dx, bool ow)
{
    const int64_t e0 = blockIdx.x * (int64_t)BN_THREADS + threadIdx.x;
    const int64_t cb = (e0 - gp_dev_fdiv(e0, q.cr) * q.cr) * VEC;
    float f[VEC], ra[VEC], rb[VEC];
#pragma unroll
    for (int i = 0; i < VEC; i++) f[i] = FMUL(IO::par(scale, cb + i), invstd[cb + i]);
    bn_nhwc_relu_coefs<VEC>(ab, cb, ra, rb);
    const int ILP = BN_NHWC_FLAT_ILP;
    const int64_t total = q.rows * q.cr;
    BN_NHWC_ROUNDS(q, e, G, ILP) {
        float xv[ILP][VEC], gv[ILP][VEC], old[ILP][VEC];
#pragma unroll
        for (int u = 0; u < ILP; u++) {
            if (e + u * G >= total) continue;
            const int64_t off = (e + u * G) * VEC;
            IO::template acts<VEC>(dy, off, gv[u]);
            if (ab) IO::template acts<VEC>(x, off, xv[u]);
            if (ow)
#pragma unroll
                for (int i = 0; i < VEC; i++) old[u][i] = 0.0f;
            else
                IO::template acts<VEC>(dx, off, old[u]);
        }
#pragma unroll
        for (int u = 0; u < ILP; u++) {
            if (e + u * G >= total) continue;
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                float g = ab && !bn_relu_positive(xv[u][i], ra[i], rb[i], y_bf16) ? 0.0f : gv[u][i];
                old[u][i] = FADD(old[u][i], FMUL(g, f[i]));
            }
            IO::template set_acts<VEC>(dx, (e + u * G) * VEC, old[u]);
        }
    }
}

/* Whether the channels-last backward runs its statistics pass: dScale,
 * dBias or training's dX asked, of a gradient with rows. */
static bool bn_nhwc_bwd_sums_run(const struct gp_cuda_ctx *ctx)
{
    int64_t rows, c;
    bn_nhwc_shape(ctx->graph, ctx->node, &rows, &c);
    return c > 0 && rows > 0 && ctx->dout[0] && (ctx->din[1] || ctx->din[2] || (ctx->din[0] && ctx->training));
}

/* res (not NULL: a fused residual's, bn_residual_backward): dY is its
 * gradient, which the statistics pass (bn_nhwc_bwd_sums_run true) writes
 * from res->dy and res->y as it sums it. */
static gp_status bn_nhwc_backward(struct gp_cuda_ctx *ctx, bool relu, const struct bn_res_src *res,
                                  struct gp_error *err)
{
    int64_t rows, c;
    bn_nhwc_shape(ctx->graph, ctx->node, &rows, &c);
    if (c == 0) return GP_OK;
    gp_fptr x = gp_cuda_in_f(ctx, 0), dy = gp_cuda_dout_f(ctx, 0), dx = gp_cuda_din_f(ctx, 0);
    gp_fptr none = {NULL, false}, rdy = res ? res->dy : none, ry = res ? res->y : none, radd = res ? res->add : none;
    gp_fptr scale = gp_cuda_in_f(ctx, 1);
    const float *mean = (const float *)ctx->saved, *invstd = mean + c;
    /* A fused Relu's mask from x and the saved alpha and beta, in Y's
     * storage rounding (bn_relu_positive): Y is not read. */
    const float *ab = relu ? mean + 2 * c : NULL;
    bool y_bf16 = relu && gp_cuda_out_f(ctx, 0).bf16;
    enum io_kind kind = io_kind_of({x, dy, dx, rdy, ry, radd}, {scale});
    struct bn_nhwc_plan q, qs; /* the elementwise pass's runs, the statistics' */
    int vec = io_vec_for(kind, c, {x, dy, dx, rdy, ry, radd});
    /* dX's runs at most 4 channels (8 bytes of bfloat16, 16 of float32):
     * a channel's coefficients are three doubles and three floats. 8
     * channels a run, one run at a time, took 104 registers (2 blocks an
     * SM, 48 bytes in flight a thread); 4 channels, BN_NHWC_FLAT_ILP runs
     * at a time, take 118 (ptxas, sm_90): still 2 blocks, twice the bytes
     * in flight. */
    bn_nhwc_plan_of(rows, c, vec > 4 ? 4 : vec, &q);
    bn_nhwc_plan_of(rows, c, bn_nhwc_stats_vec(kind, vec, true), &qs);
    struct bn_plan p = bn_plan_for_finish(ctx->node, qs);
    double *pdy = (double *)ctx->scratch, *pdyx = pdy + c * qs.p, *coef = pdyx + c * qs.p;
    bool have_dy = bn_nhwc_bwd_sums_run(ctx);
    if (have_dy) {
        dim3 grid((unsigned)qs.gx, (unsigned)qs.p, 1), block((unsigned)qs.tx, (unsigned)qs.ty, 1);
        if (res && radd.p)
            IO_DISPATCH(kind, IO_VEC_DISPATCH(qs.vec, bn_nhwc_bwd_sums_kernel<IO, VEC, true, true>
                                                      <<<grid, block, 0, ctx->stream>>>(qs, x, dy, ab, y_bf16, mean,
                                                                                        invstd, pdy, pdyx, rdy, ry,
                                                                                        radd)));
        else if (res)
            IO_DISPATCH(kind, IO_VEC_DISPATCH(qs.vec, bn_nhwc_bwd_sums_kernel<IO, VEC, true, false>
                                                      <<<grid, block, 0, ctx->stream>>>(qs, x, dy, ab, y_bf16, mean,
                                                                                        invstd, pdy, pdyx, rdy, ry,
                                                                                        none)));
        else
            IO_DISPATCH(kind, IO_VEC_DISPATCH(qs.vec, bn_nhwc_bwd_sums_kernel<IO, VEC, false, false>
                                                      <<<grid, block, 0, ctx->stream>>>(qs, x, dy, ab, y_bf16, mean,
                                                                                        invstd, pdy, pdyx, rdy, ry,
                                                                                        none)));
        GP_TRY(gp_cuda_check_launch(ctx, "BatchNormalization backward sums (channels-last)", err));
    } else if (res) {
        return gp_cuda_error(ctx, err, GP_ERR_INVALID, "the residual's gradient left to a statistics pass that "
                             "does not run");
    }
    struct bn_grads g;
    g.scale = scale;
    g.invstd = invstd;
    g.d_rmean = opt_dout_f(ctx, 1);
    g.d_rvar = opt_dout_f(ctx, 2);
    g.d_mean = opt_dout_f(ctx, 3);
    g.d_var = opt_dout_f(ctx, 4);
    g.dscale = ctx->din[1] ? gp_cuda_din_f(ctx, 1) : none;
    g.dbias = ctx->din[2] ? gp_cuda_din_f(ctx, 2) : none;
    g.coef = dx.p && ctx->training ? coef : NULL;
    if (g.dscale.p || g.dbias.p || g.coef) {
        bn_nhwc_bwd_finish_kernel<<<bn_nhwc_finish_blocks(c), 256, 0, ctx->stream>>>(p, qs.p, have_dy, pdy, pdyx, g);
        GP_TRY(gp_cuda_check_launch(ctx, "BatchNormalization backward statistics (channels-last)", err));
    }
    int64_t n = rows * c;
    if (!dx.p || n == 0) return GP_OK;
    bool ow = gp_cuda_overwrite(ctx, 0);
    unsigned blocks = bn_nhwc_flat_blocks(q);
    if (ctx->training) {
        IO_DISPATCH(kind, IO_VEC_DISPATCH(q.vec, bn_nhwc_dx_train_kernel<IO, VEC><<<blocks, BN_THREADS, 0,
                                                                            ctx->stream>>>(
                                                 q, x, dy, ab, y_bf16, mean, invstd, coef, dx, ow)));
    } else {
        if (!dy.p)
            return ow ? gp_cuda_call(ctx, cudaMemsetAsync(dx.p, 0, (size_t)n * (dx.bf16 ? 2 : 4), ctx->stream),
                                     "cudaMemsetAsync", err)
                      : GP_OK;
        IO_DISPATCH(kind, IO_VEC_DISPATCH(q.vec, bn_nhwc_dx_eval_kernel<IO, VEC><<<blocks, BN_THREADS, 0,
                                                                           ctx->stream>>>(
                                                 q, x, dy, ab, y_bf16, scale, invstd, dx, ow)));
    }
    return gp_cuda_check_launch(ctx, "BatchNormalization backward dx (channels-last)", err);
}

/* X and Y both channels-last (the layout pass never tags one without the
 * other; a mixed call gets [N, C, H, W] copies). */
static bool bn_layout_native(const struct gp_graph *g, const struct gp_node *node, uint32_t in_nhwc,
                             uint32_t out_nhwc, bool backward)
{
    (void)g, (void)backward;
    /* X (and a fused residual, input 5) and Y channels-last. */
    uint32_t in = node->fused_add ? (1u | 1u << 5) : 1u;
    return in_nhwc == in && (out_nhwc & 1u) && !(out_nhwc & ~1u);
}

/* ---- the table ---- */

/* dX whole when asked, and a fused residual's gradient (bn_residual_grad_kernel). */
static bool bn_overwrites(const struct gp_graph *g, const struct gp_node *node, int k)
{
    return gp_cuda_overwrites_input0(g, node, k) || (k == 5 && node->fused_add);
}

/* Y can be written again from X and the saved alpha and beta (ctx->remake). */
static bool bn_remakes(const struct gp_graph *g, const struct gp_node *node)
{
    (void)g, (void)node;
    return true;
}

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_batch_norm[] = {
    {"BatchNormalization", bn_saved, bn_scratch, bn_forward, bn_backward, false, true, false,
     bn_overwrites, bn_layout_native, bn_remakes},
    {NULL, NULL, NULL, NULL, NULL},
};
