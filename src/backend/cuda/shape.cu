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

#include "backend/cuda/strided_copy.cuh"

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

/* The strides of a tensor of shape s as it lies: [N, C, H, W] row-major,
 * or channels-last ([N, H, W, C] storage; rank 4). */
static void strides_as_laid(const struct gp_shape *s, bool nhwc, int64_t *st)
{
    contiguous(s, st);
    if (!nhwc || s->rank != 4) return;
    int64_t c = s->dims[1], h = s->dims[2], w = s->dims[3];
    st[1] = 1, st[3] = c, st[2] = w * c, st[0] = h * w * c;
}

/* Shape and strides in the axis order [0, 2, 3, 1] (a channels-last
 * output's storage order: the index space walks Y's memory in order, so a
 * Concat of channels-last tensors moves whole rows of channels). */
static void to_storage_order(struct gp_shape *s, int64_t *a, int64_t *b)
{
    static const int perm[4] = {0, 2, 3, 1};
    struct gp_shape t = *s;
    int64_t ta[4], tb[4];
    for (int d = 0; d < 4; d++) t.dims[d] = s->dims[perm[d]], ta[d] = a[perm[d]], tb[d] = b[perm[d]];
    *s = t;
    memcpy(a, ta, sizeof ta);
    memcpy(b, tb, sizeof tb);
}

/* Input k is the view of Y starting at its offset along the axis; each
 * tensor as it lies (channels-last ones: gp_cuda_kernel.layout_native). */
static gp_status concat_run(struct gp_cuda_ctx *c, struct gp_error *err, bool backward)
{
    struct gp_infer_ctx ic = gp_cuda_infer_ctx(c->graph, c->node, err);
    const struct gp_shape *ys = gp_cuda_out_shape(c, 0);
    int axis;
    GP_TRY(gp_norm_axis(&ic, gp_node_attr_int(c->node, "axis", 0), ys->rank, &axis));
    bool y_nhwc = gp_cuda_nhwc(c->out_nhwc, 0);
    int64_t y_st[GP_MAX_RANK], x_st[GP_MAX_RANK], at = 0;
    for (int k = 0; k < c->node->n_inputs; k++) {
        struct gp_shape xs = *gp_cuda_in_shape(c, k);
        strides_as_laid(ys, y_nhwc, y_st);
        strides_as_laid(&xs, gp_cuda_nhwc(c->in_nhwc, k), x_st);
        int64_t y_at = at * y_st[axis];
        at += xs.dims[axis];
        if (y_nhwc) to_storage_order(&xs, y_st, x_st);
        if (!backward)
            GP_TRY(view_run(c, err, c->out[0], out_sto(c, 0), y_st, y_at, c->in[k], in_sto(c, k), x_st, 0, &xs,
                            false, "Concat forward"));
        else if (c->din[k] && c->dout[0])
            GP_TRY(view_run(c, err, c->din[k], din_sto(c, k), x_st, 0, c->dout[0], dout_sto(c, 0), y_st, y_at,
                            &xs, true, "Concat backward"));
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

/* Any layouts of rank-4 tensors: each is read or written through its own
 * strides (the layout pass tags all or none of a Concat's tensors). */
static bool concat_layout_native(const struct gp_graph *g, const struct gp_node *node, uint32_t in_nhwc,
                                 uint32_t out_nhwc, bool backward)
{
    (void)in_nhwc, (void)out_nhwc, (void)backward;
    if (node->n_inputs > 32 || gp_node_output(g, node, 0)->shape.rank != 4) return false;
    for (int k = 0; k < node->n_inputs; k++)
        if (node->inputs[k] < 0 || gp_node_input(g, node, k)->shape.rank != 4) return false;
    return true;
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
    {"Concat", NULL, NULL, concat_forward, concat_backward, false, true, false, NULL, concat_layout_native},
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
