/* CUDA kernels: LayerNormalization, twin of backend/cpu/layer_norm.c,
 * forward and backward, with the CPU's (PyTorch's) formulas: biased
 * variance, epsilon inside the square root.
 *
 * Statistics are accumulated in double, as the CPU does: the mean first,
 * then the sum of squared deviations from it (two passes), so the float
 * results agree with the CPU's to an ulp. Every reduction runs in a fixed
 * order (per-thread strided sums, then a shuffle/shared-memory tree of a
 * fixed block size, then partial sums added in chunk order), so results are
 * identical run to run; no atomics anywhere.
 *
 * Rows of up to 1024 values (GPT-2's 768): a warp per row, the warp
 * path (layer_norm.cuh; its kernels in layer_norm_warp_forward.cu and
 * layer_norm_warp_backward.cu) (forward reads X and writes Y once; backward reads X, dY and
 * the old dX, unless the executor says it writes first (overwrites), and
 * writes dX), the parameter gradients of full Scale and B by a separate
 * column-sum kernel that reads X and dY again. Longer rows of up to 4096
 * values (backward: 2048) stay in registers, so a row
 * is read once: thread t of a block holds columns 8t .. 8t + 7 (one
 * 16-byte load of bfloat16, io_vec_for; shorter runs, down to one value,
 * where the row length or the pointers do not allow it), the block as many
 * warps as that takes (768 values: 3), and it holds LN_ROWS rows at once,
 * whose sums go through one shuffle tree and one shared-memory step
 * together. A block per row, with one 2-byte load per thread and two
 * __syncthreads trees per row, kept too few bytes in flight (0.59 TB/s on
 * an H200 for GPT-2's rows of 768). Longer rows: one block per row, the
 * generic kernels. The parameter gradients sum over rows in a fixed number
 * of blocks / chunks (partials in scratch, then added per column in a
 * fixed order); the register backward's blocks keep their columns' sums
 * in registers over all their rows.
 *
 * First writer (gp_cuda_overwrite(ctx, 0), as on the CPU): dX is written
 * as 0 + its gradient on every path, its old values not read.
 *
 * Rounding: nvcc contracts a * b + c into FMAs, the CPU build does not;
 * where a product feeds a sum the operations are spelled with the _rn
 * intrinsics (never contracted), in float and in double, in the CPU's order
 * of operations.
 *
 * bfloat16 (gp_cuda_kernel.bf16_any): every float tensor may be stored as
 * bfloat16 or float32, as ctx->*_dt says (GPT-2 in bf16: X, Y, dY, dX
 * bfloat16, Scale and B float32). Loads widen exactly and every stored
 * value is rounded once (to nearest even), a gradient after its float32
 * sum is added to the widened old value: the results of the float32
 * kernel on widened copies, rounded back (the staged call,
 * backend/mixed_call.h), at half the bytes. Statistics, saved state and
 * scratch stay float32 / double. */
#include <initializer_list>
#include <string.h>

#include "backend/cuda/layer_norm.cuh"

static bool ln_strides(const struct gp_value *v, const struct ln_plan *p, int64_t *st)
{
    for (int i = 0; i < GP_MAX_RANK; i++) st[i] = 0;
    if (!v) return true;
    int64_t acc = 1;
    for (int i = p->rank - 1; i >= 0; i--) {
        int j = v->shape.rank - (p->rank - i);
        int64_t d = j >= 0 ? v->shape.dims[j] : 1;
        st[i] = d == 1 ? 0 : acc;
        acc *= d;
    }
    return gp_shape_numel(&v->shape) == p->cols;
}

static void ln_plan_of(const struct gp_graph *g, const struct gp_node *node, struct ln_plan *p)
{
    memset(p, 0, sizeof *p);
    const struct gp_shape *x = &gp_node_input(g, node, 0)->shape;
    int64_t axis = gp_node_attr_int(node, "axis", -1);
    int ax = (int)(axis < 0 ? axis + x->rank : axis);
    p->rank = x->rank - ax;
    p->rows = p->cols = 1;
    for (int i = 0; i < ax; i++) p->rows *= x->dims[i];
    for (int i = ax; i < x->rank; i++) {
        p->dims[i - ax] = x->dims[i];
        p->cols *= x->dims[i];
    }
    p->eps = gp_node_attr_float(node, "epsilon", 1e-5f);
    p->sfull = ln_strides(gp_node_input(g, node, 1), p, p->sstride);
    p->bfull = ln_strides(node->n_inputs > 2 ? gp_node_input(g, node, 2) : NULL, p, p->bstride);
    int64_t ch = (p->rows + LN_CHUNK_ROWS - 1) / LN_CHUNK_ROWS;
    if (ch > LN_MAX_CHUNKS) ch = LN_MAX_CHUNKS;
    while (ch > 1 && 2 * ch * p->cols > LN_MAX_PARTIALS) ch /= 2;
    p->chunks = ch < 1 ? 1 : ch;
    p->reg = p->cols <= LN_REG_COLS;
    p->reg_bwd = p->cols <= LN_REG_BWD_COLS;
    p->warp = p->cols <= LN_WARP_COLS;
    p->npl = 8 * (int)((p->cols + 255) / 256); /* 8, 16, 24 or 32 where warp */
    if (p->npl < 8) p->npl = 8;
    int64_t warps = (p->cols + 32 * LN_VPT - 1) / (32 * LN_VPT);
    if (warps < 1) warps = 1;
    if (warps > LN_MAX_WARPS) warps = LN_MAX_WARPS; /* only where !reg */
    p->reg_threads = 32 * (int)warps;
    int64_t groups = (p->rows + LN_ROWS - 1) / LN_ROWS;
    int64_t cap = LN_BWD_SMS * (warps < LN_BWD_SM_WARPS ? LN_BWD_SM_WARPS / warps : 1);
    p->reg_blocks = groups < 1 ? 1 : groups < cap ? groups : cap;
}

/* ctx->saved: mean [rows] and inverse standard deviation [rows] (float). */
static size_t ln_saved(const struct gp_graph *g, const struct gp_node *node)
{
    struct ln_plan p;
    ln_plan_of(g, node, &p);
    return 2 * sizeof(float) * (size_t)p.rows;
}

/* Scratch: the parameter gradients' partial sums, [cols, chunks] twice
 * (or [reg_blocks, cols] twice on the register path). */
static size_t ln_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    struct ln_plan p;
    ln_plan_of(g, node, &p);
    return 2 * sizeof(double) * (size_t)((p.reg_bwd && !p.warp ? p.reg_blocks : p.chunks) * p.cols);
}

/* Whether the warp kernels may read the parameters by runs of VEC: float32
 * (not io_mixed), one per column, aligned to a run's bytes (16 at most). */
static bool ln_pvec(const struct ln_plan &p, enum io_kind kind, int vec, gp_fptr scale, gp_fptr bias)
{
    size_t align = vec == 8 ? 16 : 4;
    if (kind == IO_MIXED || !p.sfull || (uintptr_t)scale.p % align) return false;
    return !bias.p || (p.bfull && (uintptr_t)bias.p % align == 0);
}

/* ---- the register path (rows of at most LN_REG_COLS) ----
 * Thread t of a block of reg_threads holds columns j0 = 8t .. 8t + 7 of
 * rows g LN_ROWS .. g LN_ROWS + LN_ROWS - 1 for row groups g = blockIdx.x,
 * + gridDim.x, ... Columns move in runs of VEC (io_vec_for): cols % VEC
 * == 0 and each tensor is aligned to a run's bytes (16 at most), so the
 * run at column j0 + VEC i of row r starts at element r cols + 8t + VEC i,
 * a multiple of VEC, and lies wholly inside the row or wholly past it. */

/* Row r's values j0 .. j0 + LN_VPT - 1 of t (0 past the row, or for a row
 * r >= rows). */
template <class IO, int VEC>
__device__ static inline void ln_load_row(gp_fptr t, const struct ln_plan &p, int64_t r, int64_t j0,
                                          float (&v)[LN_VPT])
{
#pragma unroll
    for (int i = 0; i < LN_VPT / VEC; i++) {
        float u[VEC];
        if (r < p.rows && j0 + VEC * i < p.cols) {
            IO::template acts<VEC>(t, r * p.cols + j0 + VEC * i, u);
        } else {
#pragma unroll
            for (int k = 0; k < VEC; k++) u[k] = 0.0f;
        }
#pragma unroll
        for (int k = 0; k < VEC; k++) v[VEC * i + k] = u[k];
    }
}

/* Stores row r's values j0 .. (within the row; r < rows). */
template <class IO, int VEC>
__device__ static inline void ln_store_row(gp_fptr t, const struct ln_plan &p, int64_t r, int64_t j0,
                                           const float (&v)[LN_VPT])
{
#pragma unroll
    for (int i = 0; i < LN_VPT / VEC; i++) {
        if (j0 + VEC * i >= p.cols) break;
        float u[VEC];
#pragma unroll
        for (int k = 0; k < VEC; k++) u[k] = v[VEC * i + k];
        IO::template set_acts<VEC>(t, r * p.cols + j0 + VEC * i, u);
    }
}

/* v[i] summed over the block, for each i, in a fixed order: each warp's
 * lanes by a shuffle-down tree, then the warps' sums in warp order
 * (through sh when there are several). Every thread gets lane 0's sums
 * (broadcast: the lanes of a butterfly would each round in another
 * order). All threads of the block call it. */
template <int N>
__device__ static inline void ln_block_sums(double (&v)[N], double (*sh)[LN_MAX_WARPS])
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int i = 0; i < N; i++) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v[i] = DADD(v[i], __shfl_down_sync(0xffffffffu, v[i], o));
        v[i] = __shfl_sync(0xffffffffu, v[i], 0);
    }
    if (nw == 1) return;
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < N; i++) sh[i][w] = v[i];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N; i++) {
        double s = sh[i][0];
        for (int u = 1; u < nw; u++) s = DADD(s, sh[i][u]);
        v[i] = s;
    }
}

/* Forward: each row's statistics as the generic kernel's formulas (sum,
 * mean, squared deviations from it, in double), summed per thread in
 * column order, then by ln_block_sums. */
template <class IO, int VEC>
__global__ static void __launch_bounds__(LN_MAX_WARPS * 32)
    ln_forward_reg_kernel(struct ln_plan p, gp_fptr x, gp_fptr scale, gp_fptr bias, gp_fptr y, float *mean,
                          float *invstd, gp_fptr out_mean, gp_fptr out_inv)
{
    __shared__ double sh[LN_ROWS][LN_MAX_WARPS];
    const int64_t j0 = (int64_t)threadIdx.x * LN_VPT;
    float sc[LN_VPT], bi[LN_VPT]; /* the same columns for every row */
#pragma unroll
    for (int k = 0; k < LN_VPT; k++) {
        int64_t j = j0 + k;
        sc[k] = j < p.cols ? IO::par(scale, ln_index(p, p.sstride, p.sfull, j)) : 0.0f;
        bi[k] = j < p.cols && bias.p ? IO::par(bias, ln_index(p, p.bstride, p.bfull, j)) : 0.0f;
    }
    const int64_t groups = (p.rows + LN_ROWS - 1) / LN_ROWS;
    for (int64_t gi = blockIdx.x; gi < groups; gi += gridDim.x) {
        const int64_t r0 = gi * LN_ROWS;
        float v[LN_ROWS][LN_VPT];
        double s[LN_ROWS];
#pragma unroll
        for (int rr = 0; rr < LN_ROWS; rr++) {
            ln_load_row<IO, VEC>(x, p, r0 + rr, j0, v[rr]);
            s[rr] = 0;
#pragma unroll
            for (int k = 0; k < LN_VPT; k++)
                if (j0 + k < p.cols) s[rr] = DADD(s[rr], (double)v[rr][k]);
        }
        ln_block_sums(s, sh);
        double m[LN_ROWS], q[LN_ROWS];
#pragma unroll
        for (int rr = 0; rr < LN_ROWS; rr++) {
            m[rr] = s[rr] / (double)p.cols;
            q[rr] = 0;
#pragma unroll
            for (int k = 0; k < LN_VPT; k++)
                if (j0 + k < p.cols) {
                    double d = DSUB((double)v[rr][k], m[rr]);
                    q[rr] = DADD(q[rr], DMUL(d, d));
                }
        }
        ln_block_sums(q, sh);
#pragma unroll
        for (int rr = 0; rr < LN_ROWS; rr++) {
            const int64_t r = r0 + rr;
            if (r >= p.rows) break;
            double var = q[rr] / (double)p.cols;
            float mr = (float)m[rr], is = (float)(1.0 / sqrt(DADD(var, p.eps)));
            if (threadIdx.x == 0) {
                mean[r] = mr;
                invstd[r] = is;
                if (out_mean.p) gp_st(out_mean, r, mr);
                if (out_inv.p) gp_st(out_inv, r, is);
            }
            float o[LN_VPT];
#pragma unroll
            for (int k = 0; k < LN_VPT; k++) {
                o[k] = FMUL(FMUL(FSUB(v[rr][k], mr), is), sc[k]);
                if (bias.p) o[k] = FADD(o[k], bi[k]);
            }
            ln_store_row<IO, VEC>(y, p, r, j0, o);
        }
    }
}

/* gp_dev_block_moments of the n values of x from `base`, in its order. */
template <class IO>
__device__ static inline void ln_block_moments(gp_fptr x, int64_t base, int64_t n, double *sh, double *mean,
                                               double *var)
{
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s = DADD(s, (double)IO::act(x, base + i));
    s = gp_dev_block_sum(s, sh);
    double m = n > 0 ? s / (double)n : 0.0;
    double q = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        double d = DSUB((double)IO::act(x, base + i), m);
        q = DADD(q, DMUL(d, d));
    }
    q = gp_dev_block_sum(q, sh);
    *mean = m;
    *var = n > 0 ? q / (double)n : 0.0;
}

template <class IO>
__global__ static void ln_forward_kernel(struct ln_plan p, gp_fptr x, gp_fptr scale, gp_fptr bias, gp_fptr y,
                                         float *mean, float *invstd, gp_fptr out_mean, gp_fptr out_inv)
{
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
        int64_t base = r * p.cols;
        double m, var;
        ln_block_moments<IO>(x, base, p.cols, sh, &m, &var);
        float mr = (float)m, is = (float)(1.0 / sqrt(DADD(var, p.eps)));
        if (threadIdx.x == 0) {
            mean[r] = mr;
            invstd[r] = is;
            if (out_mean.p) gp_st(out_mean, r, mr);
            if (out_inv.p) gp_st(out_inv, r, is);
        }
        for (int64_t j = threadIdx.x; j < p.cols; j += blockDim.x) {
            float v = FMUL(FMUL(FSUB(IO::act(x, base + j), mr), is),
                           IO::par(scale, ln_index(p, p.sstride, p.sfull, j)));
            IO::set_act(y, base + j, bias.p ? FADD(v, IO::par(bias, ln_index(p, p.bstride, p.bfull, j))) : v);
        }
    }
}

/* X, Scale, optional B -> Y like X; optional Mean and InvStdDev per row. */
static gp_status ln_forward(struct gp_cuda_ctx *ctx, struct gp_error *err)
{
    for (int i = 0; i < ctx->node->n_inputs && i < 3; i++) GP_TRY(gp_cuda_want_f32(ctx, i, err));
    struct ln_plan p;
    ln_plan_of(ctx->graph, ctx->node, &p);
    if (p.rows == 0) return GP_OK;
    float *mean = (float *)ctx->saved, *invstd = mean + p.rows;
    gp_fptr none = {NULL, false};
    gp_fptr x = gp_cuda_in_f(ctx, 0), scale = gp_cuda_in_f(ctx, 1), y = gp_cuda_out_f(ctx, 0);
    gp_fptr bias = ctx->node->n_inputs > 2 ? gp_cuda_in_f(ctx, 2) : none;
    gp_fptr out_mean = opt_out_f(ctx, 1), out_inv = opt_out_f(ctx, 2);
    enum io_kind kind = io_kind_of({x, y}, {scale, bias});
    unsigned grid = gp_cuda_capped_grid(p.rows, 1 << 20);
    if (p.warp) {
        int vec = io_vec_for(kind, p.cols, {x, y});
        bool pvec = ln_pvec(p, kind, vec, scale, bias);
        unsigned wgrid = gp_cuda_capped_grid((p.rows + LN_WARP_BLOCK / 32 - 1) / (LN_WARP_BLOCK / 32), 1 << 20);
        ln_warp_forward(p, kind, vec, pvec, wgrid, ctx->stream, x, scale, bias, y, mean, invstd, out_mean,
                        out_inv);
    } else if (p.reg) {
        int vec = io_vec_for(kind, p.cols, {x, y});
        unsigned groups = gp_cuda_capped_grid((p.rows + LN_ROWS - 1) / LN_ROWS, 1 << 20);
        IO_DISPATCH(kind, IO_VEC_DISPATCH(vec, ln_forward_reg_kernel<IO, VEC><<<groups, p.reg_threads, 0,
                                                                                ctx->stream>>>(
                                                   p, x, scale, bias, y, mean, invstd, out_mean, out_inv)));
    } else
        IO_DISPATCH(kind, ln_forward_kernel<IO><<<grid, gp_cuda_row_threads(p.cols), 0, ctx->stream>>>(
                              p, x, scale, bias, y, mean, invstd, out_mean, out_inv));
    return gp_cuda_check_launch(ctx, "LayerNormalization forward", err);
}

/* One block per row: with g = dy * scale (double),
 * dx += invstd (g - mean(g) - xhat mean(g xhat)) + d(Mean) / cols
 *       - d(InvStdDev) invstd^3 (x - mean) / cols. */
template <class IO>
__global__ static void ln_bwd_dx_kernel(struct ln_plan p, gp_fptr x, gp_fptr scale, gp_fptr dy,
                                        const float *mean, const float *invstd, gp_fptr d_mean,
                                        gp_fptr d_inv, gp_fptr dx, bool ow)
{
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
        int64_t base = r * p.cols;
        float m = mean[r], is = invstd[r];
        double sg = 0, sgx = 0;
        if (dy.p) {
            for (int64_t j = threadIdx.x; j < p.cols; j += blockDim.x) {
                double g = DMUL((double)IO::act(dy, base + j),
                                (double)IO::par(scale, ln_index(p, p.sstride, p.sfull, j)));
                sg = DADD(sg, g);
                sgx = DADD(sgx, DMUL(g, (double)FMUL(FSUB(IO::act(x, base + j), m), is)));
            }
            sg = gp_dev_block_sum(sg, sh);
            sgx = gp_dev_block_sum(sgx, sh);
        }
        double n = (double)p.cols, mg = sg / n, mgx = sgx / n;
        double cm = d_mean.p ? (double)gp_ld(d_mean, r) / n : 0.0;
        double cv = d_inv.p
                        ? DMUL(DMUL(DMUL(-(double)gp_ld(d_inv, r), (double)is), (double)is), (double)is) / n
                        : 0.0;
        for (int64_t j = threadIdx.x; j < p.cols; j += blockDim.x) {
            double xc = (double)FSUB(IO::act(x, base + j), m), xhat = DMUL(xc, (double)is);
            double v = DADD(cm, DMUL(cv, xc));
            if (dy.p) {
                double g = DMUL((double)IO::act(dy, base + j),
                                (double)IO::par(scale, ln_index(p, p.sstride, p.sfull, j)));
                v = DADD(v, DMUL((double)is, DSUB(DSUB(g, mg), DMUL(xhat, mgx))));
            }
            if (ow) IO::set_act(dx, base + j, FADD(0.0f, (float)v)); /* the CPU's 0 + v */
            else IO::add_act(dx, base + j, (float)v);
        }
    }
}

/* Full parameters: the sums of dy xhat and dy per column over a row chunk
 * (p.chunks of them), into partials [cols, chunks]. Thread (tx, ty) of a
 * block takes LN_VPT columns (one 16-byte load of bfloat16 per tensor and
 * row where VEC is 8; ln_load_row's layout) of rows ty, ty + LN_CS_TY, ...
 * of the chunk, LN_CS_ROWS rows loaded before they are added (bytes in
 * flight), in increasing row order; the row lanes' sums are then added in
 * ty order. Apart from dX's kernel, so that it keeps few registers: X and
 * dY are read again (GPT-2: 50 MB), with 16 doubles a thread. FP64 per
 * value: 2 conversions, 3 adds / multiplies. */
template <class IO, int VEC>
__global__ static void __launch_bounds__(LN_CS_TX * LN_CS_TY)
    ln_bwd_colsum_kernel(struct ln_plan p, gp_fptr x, gp_fptr dy, const float *mean, const float *invstd,
                         double *pss, double *psb)
{
    __shared__ double sh[2][LN_CS_TY - 1][LN_VPT][LN_CS_TX];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t j0 = ((int64_t)blockIdx.x * LN_CS_TX + tx) * LN_VPT, k = blockIdx.y;
    const int64_t per = (p.rows + p.chunks - 1) / p.chunks, r0 = k * per;
    const int64_t r1 = r0 + per < p.rows ? r0 + per : p.rows;
    double ss[LN_VPT], sb[LN_VPT];
#pragma unroll
    for (int e = 0; e < LN_VPT; e++) ss[e] = sb[e] = 0;
    if (j0 < p.cols) {
        for (int64_t r = r0 + ty; r < r1; r += LN_CS_ROWS * LN_CS_TY) {
            float xv[LN_CS_ROWS][LN_VPT], gv[LN_CS_ROWS][LN_VPT], m[LN_CS_ROWS], is[LN_CS_ROWS];
#pragma unroll
            for (int u = 0; u < LN_CS_ROWS; u++) {
                const int64_t ru = r + (int64_t)u * LN_CS_TY;
                const bool ok = ru < r1;
                if (ok) {
                    ln_load_row<IO, VEC>(x, p, ru, j0, xv[u]);
                    ln_load_row<IO, VEC>(dy, p, ru, j0, gv[u]);
                }
                m[u] = ok ? mean[ru] : 0.0f;
                is[u] = ok ? invstd[ru] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < LN_CS_ROWS; u++) {
                if (r + (int64_t)u * LN_CS_TY >= r1) break;
#pragma unroll
                for (int e = 0; e < LN_VPT; e++)
                    if (VEC == LN_VPT || j0 + e < p.cols) {
                        float xhat = FMUL(FSUB(xv[u][e], m[u]), is[u]);
                        ss[e] = DADD(ss[e], DMUL((double)gv[u][e], (double)xhat));
                        sb[e] = DADD(sb[e], (double)gv[u][e]);
                    }
            }
        }
    }
    if (ty > 0) {
#pragma unroll
        for (int e = 0; e < LN_VPT; e++) {
            sh[0][ty - 1][e][tx] = ss[e];
            sh[1][ty - 1][e][tx] = sb[e];
        }
    }
    __syncthreads();
    if (ty == 0 && j0 < p.cols) {
#pragma unroll
        for (int e = 0; e < LN_VPT; e++) {
            if (j0 + e >= p.cols) break;
            for (int t = 0; t < LN_CS_TY - 1; t++) {
                ss[e] = DADD(ss[e], sh[0][t][e][tx]);
                sb[e] = DADD(sb[e], sh[1][t][e][tx]);
            }
            pss[(j0 + e) * p.chunks + k] = ss[e];
            psb[(j0 + e) * p.chunks + k] = sb[e];
        }
    }
}

/* A warp per column: lane l adds partials l, l + 32, ... (chunk order),
 * then the lanes' sums go through a shuffle-down tree (fixed order); lane
 * 0 adds the result to the gradient. A column's partials are contiguous,
 * so a warp's loads are too, and each lane has few. */
__global__ static void ln_bwd_params_kernel(struct ln_plan p, const double *pss, const double *psb,
                                            gp_fptr dscale, gp_fptr dbias)
{
    const int lane = threadIdx.x & 31;
    const int64_t wpb = blockDim.x >> 5, step = (int64_t)gridDim.x * wpb;
    for (int64_t j = blockIdx.x * wpb + (threadIdx.x >> 5); j < p.cols; j += step) {
        double ss = 0, sb = 0;
        for (int64_t k = lane; k < p.chunks; k += 32) {
            ss = DADD(ss, pss[j * p.chunks + k]);
            sb = DADD(sb, psb[j * p.chunks + k]);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            ss = DADD(ss, __shfl_down_sync(0xffffffffu, ss, o));
            sb = DADD(sb, __shfl_down_sync(0xffffffffu, sb, o));
        }
        if (lane == 0) {
            if (dscale.p) gp_acc(dscale, j, (float)ss);
            if (dbias.p) gp_acc(dbias, j, (float)sb);
        }
    }
}

/* Broadcast parameters (the CPU's single-threaded path): float sums
 * straight into the gradient, in row-major (row, column) order. One thread
 * per parameter entry walks its columns in increasing order, which is the
 * order the CPU adds that entry's terms in, so the sums are the CPU's bit
 * for bit. is_scale: dScale (terms dy xhat) else dB (terms dy). A bfloat16
 * gradient is widened first and rounded once, after the last term. */
template <class IO>
__global__ static void ln_bwd_bcast_kernel(struct ln_plan p, bool is_scale, int64_t entries, gp_fptr x,
                                           gp_fptr dy, const float *mean, const float *invstd,
                                           gp_fptr dparam)
{
    const int64_t *st = is_scale ? p.sstride : p.bstride;
    bool full = is_scale ? p.sfull : p.bfull;
    GP_GRID_STRIDE(e, entries) {
        /* The entry's fixed coordinates and the column of the first one. */
        int64_t cst[GP_MAX_RANK], base = 0, acc = 1;
        for (int i = p.rank - 1; i >= 0; i--) {
            cst[i] = acc;
            acc *= p.dims[i];
        }
        int free_ax[GP_MAX_RANK], nf = 0;
        if (full) {
            base = e;
        } else {
            for (int i = 0; i < p.rank; i++) {
                if (st[i] != 0) base += (e / st[i]) % p.dims[i] * cst[i];
                else if (p.dims[i] > 1) free_ax[nf++] = i;
            }
        }
        float a = gp_ld(dparam, e);
        for (int64_t r = 0; r < p.rows; r++) {
            int64_t row = r * p.cols;
            float m = mean[r], is = invstd[r];
            int64_t idx[GP_MAX_RANK], j = base;
            for (int q = 0; q < nf; q++) idx[q] = 0;
            for (;;) {
                float g = IO::act(dy, row + j);
                float term = is_scale ? FMUL(g, FMUL(FSUB(IO::act(x, row + j), m), is)) : g;
                a = FADD(a, term);
                int q = nf - 1;
                for (; q >= 0; q--) {
                    int ax = free_ax[q];
                    j += cst[ax];
                    if (++idx[q] < p.dims[ax]) break;
                    j -= cst[ax] * p.dims[ax];
                    idx[q] = 0;
                }
                if (q < 0) break;
            }
        }
        gp_st(dparam, e, a);
    }
}

/* Backward on the register path (rows of at most LN_REG_BWD_COLS): x and
 * dy of LN_ROWS rows in registers (the layout above); dx as
 * ln_bwd_dx_kernel (same terms, same order; its two sums per row through
 * one ln_block_sums), and with pss, psb the block's sums of dy xhat and dy
 * per column (its rows in increasing order) into partials [gridDim.x,
 * cols], which ln_bwd_reg_final_kernel adds. */
template <class IO, int VEC>
__global__ static void __launch_bounds__(LN_REG_BWD_COLS / LN_VPT)
    ln_bwd_reg_kernel(struct ln_plan p, gp_fptr x, gp_fptr scale, gp_fptr dy, const float *mean,
                      const float *invstd, gp_fptr d_mean, gp_fptr d_inv, gp_fptr dx, bool ow, double *pss,
                      double *psb)
{
    __shared__ double sh[2 * LN_ROWS][LN_MAX_WARPS];
    const int64_t j0 = (int64_t)threadIdx.x * LN_VPT;
    float sc[LN_VPT];
    double ss[LN_VPT], sb[LN_VPT];
#pragma unroll
    for (int k = 0; k < LN_VPT; k++) {
        sc[k] = j0 + k < p.cols ? IO::par(scale, ln_index(p, p.sstride, p.sfull, j0 + k)) : 0.0f;
        ss[k] = sb[k] = 0;
    }
    const int64_t groups = (p.rows + LN_ROWS - 1) / LN_ROWS;
    for (int64_t gi = blockIdx.x; gi < groups; gi += gridDim.x) {
        const int64_t r0 = gi * LN_ROWS;
        /* Every load of the group first (dx's old values and the rows'
         * d(Mean), d(InvStdDev) too): issued together, not each behind the
         * previous row's stores, which the compiler cannot reorder. */
        float xv[LN_ROWS][LN_VPT], gv[LN_ROWS][LN_VPT], od[LN_ROWS][LN_VPT];
        float m[LN_ROWS], is[LN_ROWS], dm[LN_ROWS], di[LN_ROWS];
#pragma unroll
        for (int rr = 0; rr < LN_ROWS; rr++) {
            const int64_t r = r0 + rr;
            const bool ok = r < p.rows;
            ln_load_row<IO, VEC>(x, p, r, j0, xv[rr]);
            if (dy.p) {
                ln_load_row<IO, VEC>(dy, p, r, j0, gv[rr]);
            } else {
#pragma unroll
                for (int k = 0; k < LN_VPT; k++) gv[rr][k] = 0.0f;
            }
            if (dx.p && !ow) {
                ln_load_row<IO, VEC>(dx, p, r, j0, od[rr]);
            } else {
#pragma unroll
                for (int k = 0; k < LN_VPT; k++) od[rr][k] = 0.0f; /* ow: 0 + v, as the CPU */
            }
            m[rr] = ok ? mean[r] : 0.0f;
            is[rr] = ok ? invstd[r] : 0.0f;
            dm[rr] = ok && d_mean.p ? gp_ld(d_mean, r) : 0.0f;
            di[rr] = ok && d_inv.p ? gp_ld(d_inv, r) : 0.0f;
        }
        /* One pass over the values for dx's sums and the parameter
         * gradients' terms, which share xhat and (double) dy: a second pass
         * after the block sums would keep them all live across the sums,
         * in registers the row data need. */
        double t[2 * LN_ROWS]; /* sums of g and of g xhat per row */
#pragma unroll
        for (int i = 0; i < 2 * LN_ROWS; i++) t[i] = 0;
#pragma unroll
        for (int rr = 0; rr < LN_ROWS; rr++) {
            const bool ok = r0 + rr < p.rows;
#pragma unroll
            for (int k = 0; k < LN_VPT; k++) {
                double gd = (double)gv[rr][k], xh = (double)FMUL(FSUB(xv[rr][k], m[rr]), is[rr]);
                if (dx.p && dy.p && j0 + k < p.cols) {
                    double g = DMUL(gd, (double)sc[k]);
                    t[rr] = DADD(t[rr], g);
                    t[LN_ROWS + rr] = DADD(t[LN_ROWS + rr], DMUL(g, xh));
                }
                if (pss && ok) {
                    ss[k] = DADD(ss[k], DMUL(gd, xh));
                    sb[k] = DADD(sb[k], gd);
                }
            }
        }
        if (dx.p) {
            if (dy.p) ln_block_sums(t, sh); /* dx.p, dy.p: the same for the whole block */
#pragma unroll
            for (int rr = 0; rr < LN_ROWS; rr++) {
                const int64_t r = r0 + rr;
                if (r >= p.rows) break;
                double n = (double)p.cols, mg = t[rr] / n, mgx = t[LN_ROWS + rr] / n;
                double cm = d_mean.p ? (double)dm[rr] / n : 0.0;
                double cv = d_inv.p ? DMUL(DMUL(DMUL(-(double)di[rr], (double)is[rr]), (double)is[rr]),
                                           (double)is[rr]) / n
                                    : 0.0;
                float o[LN_VPT]; /* dx += v: the old value, widened, plus v, rounded once */
#pragma unroll
                for (int k = 0; k < LN_VPT; k++) {
                    double xc = (double)FSUB(xv[rr][k], m[rr]), xhat = DMUL(xc, (double)is[rr]);
                    double v = DADD(cm, DMUL(cv, xc));
                    if (dy.p) {
                        double g = DMUL((double)gv[rr][k], (double)sc[k]);
                        v = DADD(v, DMUL((double)is[rr], DSUB(DSUB(g, mg), DMUL(xhat, mgx))));
                    }
                    o[k] = FADD(od[rr][k], (float)v);
                }
                ln_store_row<IO, VEC>(dx, p, r, j0, o);
            }
        }
    }
    if (pss) {
#pragma unroll
        for (int k = 0; k < LN_VPT; k++) {
            int64_t j = j0 + k;
            if (j < p.cols) {
                pss[blockIdx.x * p.cols + j] = ss[k];
                psb[blockIdx.x * p.cols + j] = sb[k];
            }
        }
    }
}

/* Per column, the reg_blocks partials: threads (tx, ty) of an
 * LN_FIN_COLS x LN_FIN_LANES block add partials ty, ty + LN_FIN_LANES,
 * ... of column tx; the lanes' sums are added in ty order. */
__global__ static void ln_bwd_reg_final_kernel(struct ln_plan p, const double *pss, const double *psb,
                                               gp_fptr dscale, gp_fptr dbias)
{
    __shared__ double ss_sh[LN_FIN_LANES][LN_FIN_COLS + 1], sb_sh[LN_FIN_LANES][LN_FIN_COLS + 1];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t j = blockIdx.x * (int64_t)LN_FIN_COLS + tx;
    double ss = 0, sb = 0;
    if (j < p.cols)
        for (int64_t k = ty; k < p.reg_blocks; k += LN_FIN_LANES) {
            ss = DADD(ss, pss[k * p.cols + j]);
            sb = DADD(sb, psb[k * p.cols + j]);
        }
    ss_sh[ty][tx] = ss;
    sb_sh[ty][tx] = sb;
    __syncthreads();
    if (ty == 0 && j < p.cols) {
        for (int t = 1; t < LN_FIN_LANES; t++) {
            ss = DADD(ss, ss_sh[t][tx]);
            sb = DADD(sb, sb_sh[t][tx]);
        }
        if (dscale.p) gp_acc(dscale, j, (float)ss);
        if (dbias.p) gp_acc(dbias, j, (float)sb);
    }
}

static gp_status ln_backward(struct gp_cuda_ctx *ctx, struct gp_error *err)
{
    for (int i = 0; i < ctx->node->n_inputs && i < 3; i++) GP_TRY(gp_cuda_want_f32(ctx, i, err));
    struct ln_plan p;
    ln_plan_of(ctx->graph, ctx->node, &p);
    if (p.rows == 0 || p.cols == 0) return GP_OK;
    gp_fptr none = {NULL, false};
    gp_fptr x = gp_cuda_in_f(ctx, 0), scale = gp_cuda_in_f(ctx, 1);
    gp_fptr dy = ctx->dout[0] ? gp_cuda_dout_f(ctx, 0) : none;
    const float *mean = (const float *)ctx->saved, *invstd = mean + p.rows;
    gp_fptr dx = ctx->din[0] ? gp_cuda_din_f(ctx, 0) : none;
    gp_fptr dscale = ctx->din[1] ? gp_cuda_din_f(ctx, 1) : none;
    gp_fptr dbias = ctx->node->n_inputs > 2 && ctx->din[2] ? gp_cuda_din_f(ctx, 2) : none;
    gp_fptr d_mean = opt_dout_f(ctx, 1), d_inv = opt_dout_f(ctx, 2);
    enum io_kind kind = io_kind_of({x, dy, dx}, {scale});
    bool params = dy.p && (dscale.p || dbias.p), ow = gp_cuda_overwrite(ctx, 0);
    if (p.warp && dx.p) {
        int vec = io_vec_for(kind, p.cols, {x, dy, dx});
        bool pvec = ln_pvec(p, kind, vec, scale, none);
        unsigned wgrid = gp_cuda_capped_grid((p.rows + LN_WARP_BLOCK / 32 - 1) / (LN_WARP_BLOCK / 32), 1 << 20);
        ln_warp_backward_dx(p, kind, vec, pvec, wgrid, ctx->stream, x, scale, dy, mean, invstd, d_mean, d_inv,
                            dx, ow);
        GP_TRY(gp_cuda_check_launch(ctx, "LayerNormalization backward dx", err));
        dx = none; /* done; the parameter gradients below */
    }
    if (!p.warp && p.reg_bwd && (dx.p || (params && p.sfull && p.bfull))) {
        bool fused = params && p.sfull && p.bfull;
        double *pss = fused ? (double *)ctx->scratch : NULL;
        double *psb = fused ? pss + p.reg_blocks * p.cols : NULL;
        unsigned grid = fused ? (unsigned)p.reg_blocks
                              : gp_cuda_capped_grid((p.rows + LN_ROWS - 1) / LN_ROWS, 1 << 20);
        int vec = io_vec_for(kind, p.cols, {x, dy, dx});
        IO_DISPATCH(kind, IO_VEC_DISPATCH(vec, ln_bwd_reg_kernel<IO, VEC><<<grid, p.reg_threads, 0, ctx->stream>>>(
                                                   p, x, scale, dy, mean, invstd, d_mean, d_inv, dx, ow, pss,
                                                   psb)));
        GP_TRY(gp_cuda_check_launch(ctx, "LayerNormalization backward", err));
        if (fused) {
            dim3 fgrid((unsigned)((p.cols + LN_FIN_COLS - 1) / LN_FIN_COLS), 1, 1);
            ln_bwd_reg_final_kernel<<<fgrid, dim3(LN_FIN_COLS, LN_FIN_LANES, 1), 0, ctx->stream>>>(
                p, pss, psb, dscale, dbias);
            return gp_cuda_check_launch(ctx, "LayerNormalization parameter gradients", err);
        }
        dx = none; /* done */
    }
    if (dx.p) {
        unsigned grid = gp_cuda_capped_grid(p.rows, 1 << 20), threads = gp_cuda_row_threads(p.cols);
        IO_DISPATCH(kind, ln_bwd_dx_kernel<IO><<<grid, threads, 0, ctx->stream>>>(p, x, scale, dy, mean, invstd,
                                                                                  d_mean, d_inv, dx, ow));
        GP_TRY(gp_cuda_check_launch(ctx, "LayerNormalization backward dx", err));
    }
    if (!dy.p || (!dscale.p && !dbias.p)) return GP_OK;
    if (p.sfull && p.bfull) {
        double *pss = (double *)ctx->scratch, *psb = pss + p.chunks * p.cols;
        dim3 grid((unsigned)((p.cols + LN_CS_TX * LN_VPT - 1) / (LN_CS_TX * LN_VPT)), (unsigned)p.chunks, 1);
        dim3 block(LN_CS_TX, LN_CS_TY, 1);
        int vec = io_vec_for(kind, p.cols, {x, dy});
        LN_IO_VEC_DISPATCH(kind, vec, ln_bwd_colsum_kernel<IO, VEC><<<grid, block, 0, ctx->stream>>>(
                                          p, x, dy, mean, invstd, pss, psb));
        GP_TRY(gp_cuda_check_launch(ctx, "LayerNormalization backward partial sums", err));
        unsigned pgrid = gp_cuda_capped_grid((p.cols + 7) / 8, 1 << 20); /* 8 warps a block, a column each */
        ln_bwd_params_kernel<<<pgrid, 256, 0, ctx->stream>>>(p, pss, psb, dscale, dbias);
        return gp_cuda_check_launch(ctx, "LayerNormalization parameter gradients", err);
    }
    for (int t = 0; t < 2; t++) {
        gp_fptr dparam = t == 0 ? dscale : dbias;
        if (!dparam.p) continue;
        int64_t entries = gp_shape_numel(&gp_cuda_in_value(ctx, t == 0 ? 1 : 2)->shape);
        if (entries == 0) continue;
        unsigned blocks = gp_cuda_blocks_for(entries);
        IO_DISPATCH(kind, ln_bwd_bcast_kernel<IO><<<blocks, GP_CUDA_THREADS, 0, ctx->stream>>>(
                              p, t == 0, entries, x, dy, mean, invstd, dparam));
        GP_TRY(gp_cuda_check_launch(ctx, t == 0 ? "LayerNormalization scale gradient (broadcast)"
                                                : "LayerNormalization bias gradient (broadcast)",
                                    err));
    }
    return GP_OK;
}

/* ---- the table ---- */

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_layer_norm[] = {
    {"LayerNormalization", ln_saved, ln_scratch, ln_forward, ln_backward, false, true, false,
     gp_cuda_overwrites_input0},
    {NULL, NULL, NULL, NULL, NULL},
};
