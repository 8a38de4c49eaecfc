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
 * One block per row; rows of up to 4096 values (backward: 2048) stay in
 * registers, so a row is read once. The parameter gradients sum over rows
 * in a fixed number of blocks / chunks (partials in scratch, then added per
 * column in a fixed order).
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
#include <math.h>
#include <string.h>

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/norm_storage.cuh"

/* ---- storage: IO of norm_storage.cuh for the row kernels (par: Scale or
 * B); the per-row Mean and InvStdDev (and their gradients), and the
 * parameter gradients, are read and written with gp_ld / gp_st / gp_acc
 * whatever the call (once per row or column). */

/* ---- LayerNormalization ---- */

/* X viewed as [rows, cols]: cols = the normalized axes. Scale and B
 * broadcast to the normalized shape; `full` when one has an entry per
 * column (indexed by column then), as on the CPU. */
struct ln_plan {
    int64_t rows, cols;
    double eps;
    int rank;
    int64_t dims[GP_MAX_RANK];                          /* normalized shape */
    int64_t sstride[GP_MAX_RANK], bstride[GP_MAX_RANK]; /* Scale's, B's strides over it */
    bool sfull, bfull;
    int64_t chunks; /* row chunks of the parameter-gradient partial sums */
    /* Rows of at most LN_REG_COLS (backward: LN_REG_BWD_COLS): a block
     * keeps its row in registers (reg_threads threads, LN_VPT values each)
     * and backward adds the parameter gradients' terms of its rows
     * (blocks: reg_blocks) in registers too. */
    bool reg, reg_bwd;
    int reg_threads;
    int64_t reg_blocks;
};

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

#define LN_TILE_COLS 32
#define LN_TILE_ROWS 8
#define LN_CHUNK_ROWS 32
#define LN_MAX_CHUNKS 128
#define LN_MAX_PARTIALS (4 << 20) /* doubles of partials at most (32 MiB) */
#define LN_VPT 8                  /* values per thread of a row kept in registers */
#define LN_REG_COLS 4096          /* rows up to this length: in registers */
#define LN_REG_BWD_COLS 2048      /* backward (512 threads of 118 registers ran slower) */
#define LN_REG_BLOCKS 1024        /* blocks of the register backward (fixed: partials) */
#define LN_FIN_LANES 32           /* partials each column's final sum splits over */

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
    p->reg_threads = p->cols <= 256 ? 32 : p->cols <= 1024 ? 128 : p->cols <= 2048 ? 256 : 512;
    p->reg_blocks = p->rows < LN_REG_BLOCKS ? (p->rows < 1 ? 1 : p->rows) : LN_REG_BLOCKS;
}

/* Offset into a broadcast parameter of column j. */
__device__ static inline int64_t ln_index(const struct ln_plan &p, const int64_t *st, bool full,
                                          int64_t j)
{
    if (full) return j;
    int64_t off = 0;
    for (int i = p.rank - 1; i >= 0; i--) {
        off += (j % p.dims[i]) * st[i];
        j /= p.dims[i];
    }
    return off;
}

/* ctx->saved: mean [rows] and inverse standard deviation [rows] (float). */
static size_t ln_saved(const struct gp_graph *g, const struct gp_node *node)
{
    struct ln_plan p;
    ln_plan_of(g, node, &p);
    return 2 * sizeof(float) * (size_t)p.rows;
}

/* Scratch: the parameter gradients' partial sums, [chunks, cols] twice
 * (or [reg_blocks, cols] twice on the register path). */
static size_t ln_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    struct ln_plan p;
    ln_plan_of(g, node, &p);
    return 2 * sizeof(double) * (size_t)((p.reg_bwd ? p.reg_blocks : p.chunks) * p.cols);
}

/* Rows of at most LN_REG_COLS: the row is read once into registers (thread
 * t holds columns t, t + blockDim, ...: the order block_moments sums in,
 * so the statistics are the same as the generic kernel's). */
template <class IO>
__global__ static void ln_forward_reg_kernel(struct ln_plan p, gp_fptr x, gp_fptr scale, gp_fptr bias,
                                             gp_fptr y, float *mean, float *invstd, gp_fptr out_mean,
                                             gp_fptr out_inv)
{
    __shared__ double sh[32];
    for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
        int64_t base = r * p.cols;
        float v[LN_VPT];
        double s = 0;
#pragma unroll
        for (int k = 0; k < LN_VPT; k++) {
            int64_t j = threadIdx.x + (int64_t)k * blockDim.x;
            v[k] = j < p.cols ? IO::act(x, base + j) : 0.0f;
            if (j < p.cols) s = DADD(s, (double)v[k]);
        }
        s = gp_dev_block_sum(s, sh);
        double m = s / (double)p.cols, q = 0;
#pragma unroll
        for (int k = 0; k < LN_VPT; k++) {
            int64_t j = threadIdx.x + (int64_t)k * blockDim.x;
            if (j < p.cols) {
                double d = DSUB((double)v[k], m);
                q = DADD(q, DMUL(d, d));
            }
        }
        q = gp_dev_block_sum(q, sh);
        double var = q / (double)p.cols;
        float mr = (float)m, is = (float)(1.0 / sqrt(DADD(var, p.eps)));
        if (threadIdx.x == 0) {
            mean[r] = mr;
            invstd[r] = is;
            if (out_mean.p) gp_st(out_mean, r, mr);
            if (out_inv.p) gp_st(out_inv, r, is);
        }
#pragma unroll
        for (int k = 0; k < LN_VPT; k++) {
            int64_t j = threadIdx.x + (int64_t)k * blockDim.x;
            if (j < p.cols) {
                float o = FMUL(FMUL(FSUB(v[k], mr), is), IO::par(scale, ln_index(p, p.sstride, p.sfull, j)));
                IO::set_act(y, base + j, bias.p ? FADD(o, IO::par(bias, ln_index(p, p.bstride, p.bfull, j))) : o);
            }
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
    if (p.reg)
        IO_DISPATCH(kind, ln_forward_reg_kernel<IO><<<grid, p.reg_threads, 0, ctx->stream>>>(
                              p, x, scale, bias, y, mean, invstd, out_mean, out_inv));
    else
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
                                        gp_fptr d_inv, gp_fptr dx)
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
            IO::add_act(dx, base + j, (float)v);
        }
    }
}

/* Full parameters: block (column tile, row chunk) sums dy xhat and dy over
 * its rows for 32 columns; threads (tx, ty) take rows ty, ty + 8, ... and
 * the 8 lanes' sums are added in ty order. */
template <class IO>
__global__ static void ln_bwd_partial_kernel(struct ln_plan p, gp_fptr x, gp_fptr dy, const float *mean,
                                             const float *invstd, double *pss, double *psb)
{
    __shared__ double ss_sh[LN_TILE_ROWS][LN_TILE_COLS], sb_sh[LN_TILE_ROWS][LN_TILE_COLS];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t j = blockIdx.x * (int64_t)LN_TILE_COLS + tx, k = blockIdx.y;
    int64_t per = (p.rows + p.chunks - 1) / p.chunks;
    int64_t r0 = k * per, r1 = r0 + per < p.rows ? r0 + per : p.rows;
    double ss = 0, sb = 0;
    if (j < p.cols)
        for (int64_t r = r0 + ty; r < r1; r += LN_TILE_ROWS) {
            float g = IO::act(dy, r * p.cols + j);
            float xhat = FMUL(FSUB(IO::act(x, r * p.cols + j), mean[r]), invstd[r]);
            ss = DADD(ss, DMUL((double)g, (double)xhat));
            sb = DADD(sb, (double)g);
        }
    ss_sh[ty][tx] = ss;
    sb_sh[ty][tx] = sb;
    __syncthreads();
    if (ty == 0 && j < p.cols) {
        for (int t = 1; t < LN_TILE_ROWS; t++) {
            ss = DADD(ss, ss_sh[t][tx]);
            sb = DADD(sb, sb_sh[t][tx]);
        }
        pss[k * p.cols + j] = ss;
        psb[k * p.cols + j] = sb;
    }
}

/* One thread per column: the chunks' partials in chunk order. */
__global__ static void ln_bwd_params_kernel(struct ln_plan p, const double *pss, const double *psb,
                                            gp_fptr dscale, gp_fptr dbias)
{
    GP_GRID_STRIDE(j, p.cols) {
        double ss = 0, sb = 0;
        for (int64_t k = 0; k < p.chunks; k++) {
            ss = DADD(ss, pss[k * p.cols + j]);
            sb = DADD(sb, psb[k * p.cols + j]);
        }
        if (dscale.p) gp_acc(dscale, j, (float)ss);
        if (dbias.p) gp_acc(dbias, j, (float)sb);
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

/* Rows of at most LN_REG_COLS, reg_blocks blocks: each block takes rows
 * blockIdx.x, + gridDim.x, ... with x and dy in registers; dx as
 * ln_bwd_dx_kernel (same terms, same order), and with pss, psb the
 * block's sums of dy xhat and dy per column (its rows in order) into
 * partials [gridDim.x, cols], which ln_bwd_reg_final_kernel adds. */
template <class IO>
__global__ static void ln_bwd_reg_kernel(struct ln_plan p, gp_fptr x, gp_fptr scale, gp_fptr dy,
                                         const float *mean, const float *invstd, gp_fptr d_mean,
                                         gp_fptr d_inv, gp_fptr dx, double *pss, double *psb)
{
    __shared__ double sh[32];
    double ss[LN_VPT], sb[LN_VPT];
#pragma unroll
    for (int k = 0; k < LN_VPT; k++) ss[k] = sb[k] = 0;
    for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
        int64_t base = r * p.cols;
        float m = mean[r], is = invstd[r];
        float xv[LN_VPT], gv[LN_VPT];
#pragma unroll
        for (int k = 0; k < LN_VPT; k++) {
            int64_t j = threadIdx.x + (int64_t)k * blockDim.x;
            xv[k] = j < p.cols ? IO::act(x, base + j) : 0.0f;
            gv[k] = j < p.cols && dy.p ? IO::act(dy, base + j) : 0.0f;
        }
        if (dx.p) {
            double sg = 0, sgx = 0;
            if (dy.p) {
#pragma unroll
                for (int k = 0; k < LN_VPT; k++) {
                    int64_t j = threadIdx.x + (int64_t)k * blockDim.x;
                    if (j < p.cols) {
                        float sc = IO::par(scale, ln_index(p, p.sstride, p.sfull, j));
                        double g = DMUL((double)gv[k], (double)sc);
                        sg = DADD(sg, g);
                        sgx = DADD(sgx, DMUL(g, (double)FMUL(FSUB(xv[k], m), is)));
                    }
                }
                sg = gp_dev_block_sum(sg, sh);
                sgx = gp_dev_block_sum(sgx, sh);
            }
            double n = (double)p.cols, mg = sg / n, mgx = sgx / n;
            double cm = d_mean.p ? (double)gp_ld(d_mean, r) / n : 0.0;
            double cv = d_inv.p ? DMUL(DMUL(DMUL(-(double)gp_ld(d_inv, r), (double)is), (double)is),
                                       (double)is) / n
                                : 0.0;
#pragma unroll
            for (int k = 0; k < LN_VPT; k++) {
                int64_t j = threadIdx.x + (int64_t)k * blockDim.x;
                if (j < p.cols) {
                    double xc = (double)FSUB(xv[k], m), xhat = DMUL(xc, (double)is);
                    double v = DADD(cm, DMUL(cv, xc));
                    if (dy.p) {
                        float sc = IO::par(scale, ln_index(p, p.sstride, p.sfull, j));
                        double g = DMUL((double)gv[k], (double)sc);
                        v = DADD(v, DMUL((double)is, DSUB(DSUB(g, mg), DMUL(xhat, mgx))));
                    }
                    IO::add_act(dx, base + j, (float)v);
                }
            }
        }
        if (pss) {
#pragma unroll
            for (int k = 0; k < LN_VPT; k++) {
                ss[k] = DADD(ss[k], DMUL((double)gv[k], (double)FMUL(FSUB(xv[k], m), is)));
                sb[k] = DADD(sb[k], (double)gv[k]);
            }
        }
    }
    if (pss) {
#pragma unroll
        for (int k = 0; k < LN_VPT; k++) {
            int64_t j = threadIdx.x + (int64_t)k * blockDim.x;
            if (j < p.cols) {
                pss[blockIdx.x * p.cols + j] = ss[k];
                psb[blockIdx.x * p.cols + j] = sb[k];
            }
        }
    }
}

/* Per column, the reg_blocks partials: threads (tx, ty) of a 32 x 32
 * block add partials ty, ty + 32, ... of column tx; the 32 sums are added
 * in ty order. */
__global__ static void ln_bwd_reg_final_kernel(struct ln_plan p, const double *pss, const double *psb,
                                               gp_fptr dscale, gp_fptr dbias)
{
    __shared__ double ss_sh[LN_FIN_LANES][LN_TILE_COLS + 1], sb_sh[LN_FIN_LANES][LN_TILE_COLS + 1];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t j = blockIdx.x * (int64_t)LN_TILE_COLS + tx;
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
    bool params = dy.p && (dscale.p || dbias.p);
    if (p.reg_bwd && (dx.p || (params && p.sfull && p.bfull))) {
        bool fused = params && p.sfull && p.bfull;
        double *pss = fused ? (double *)ctx->scratch : NULL;
        double *psb = fused ? pss + p.reg_blocks * p.cols : NULL;
        unsigned grid = fused ? (unsigned)p.reg_blocks : gp_cuda_capped_grid(p.rows, 1 << 20);
        IO_DISPATCH(kind, ln_bwd_reg_kernel<IO><<<grid, p.reg_threads, 0, ctx->stream>>>(
                              p, x, scale, dy, mean, invstd, d_mean, d_inv, dx, pss, psb));
        GP_TRY(gp_cuda_check_launch(ctx, "LayerNormalization backward", err));
        if (fused) {
            dim3 fgrid((unsigned)((p.cols + LN_TILE_COLS - 1) / LN_TILE_COLS), 1, 1);
            ln_bwd_reg_final_kernel<<<fgrid, dim3(LN_TILE_COLS, LN_FIN_LANES, 1), 0, ctx->stream>>>(
                p, pss, psb, dscale, dbias);
            return gp_cuda_check_launch(ctx, "LayerNormalization parameter gradients", err);
        }
        dx = none; /* done */
    }
    if (dx.p) {
        unsigned grid = gp_cuda_capped_grid(p.rows, 1 << 20), threads = gp_cuda_row_threads(p.cols);
        IO_DISPATCH(kind, ln_bwd_dx_kernel<IO><<<grid, threads, 0, ctx->stream>>>(p, x, scale, dy, mean, invstd,
                                                                                  d_mean, d_inv, dx));
        GP_TRY(gp_cuda_check_launch(ctx, "LayerNormalization backward dx", err));
    }
    if (!dy.p || (!dscale.p && !dbias.p)) return GP_OK;
    if (p.sfull && p.bfull) {
        double *pss = (double *)ctx->scratch, *psb = pss + p.chunks * p.cols;
        dim3 grid((unsigned)((p.cols + LN_TILE_COLS - 1) / LN_TILE_COLS), (unsigned)p.chunks, 1);
        dim3 block(LN_TILE_COLS, LN_TILE_ROWS, 1);
        IO_DISPATCH(kind, ln_bwd_partial_kernel<IO><<<grid, block, 0, ctx->stream>>>(p, x, dy, mean, invstd, pss,
                                                                                     psb));
        GP_TRY(gp_cuda_check_launch(ctx, "LayerNormalization backward partial sums", err));
        ln_bwd_params_kernel<<<gp_cuda_blocks_for(p.cols), GP_CUDA_THREADS, 0, ctx->stream>>>(
            p, pss, psb, dscale, dbias);
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
    {"LayerNormalization", ln_saved, ln_scratch, ln_forward, ln_backward, false, true},
    {NULL, NULL, NULL, NULL, NULL},
};
