/* CUDA kernels: Resize and Upsample, twin of backend/cpu/resize.c: modes
 * nearest and linear, the CPU's tables computed in the same single
 * precision arithmetic.
 *
 * Determinism: no float atomics. Resize's backward gathers: each input
 * element adds the gradients of the outputs that read it, in the CPU's
 * order (row-major output, corner by corner), in float, straight into dX,
 * which reproduces the CPU's scatter bit for bit. The only integer atomics
 * are the min/max that find, per input position, the range of outputs
 * reading it (order independent).
 *
 * Rounding: nvcc contracts a * b + c into FMAs, the CPU build does not;
 * where a product feeds a sum the operations are spelled with the _rn
 * intrinsics.
 *
 * bfloat16 (bf16_any): float X, Y, dY and dX each float32 or bfloat16;
 * loads widen, every stored value is rounded once (a dX element gathers its
 * terms in float from its widened value, then is rounded), so results equal
 * those of float32 copies. Other dtypes as ever. */
#include <math.h>
#include <string.h>

#include <initializer_list>

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/storage.cuh"

extern "C" {
#include "ops/fold_util.h"
}

/* ---- Resize, Upsample ---- */

/* resize.c's plan: per axis, per output position, sources i0, i1 and
 * weights w0, w1 (nearest: i1 = i0, w1 = 0; -1 where tf_crop_and_resize
 * extrapolates), computed in single precision as onnxruntime does. The
 * tables are computed on the device into scratch (the same float
 * arithmetic, on the host too, decides which leading axes are identities). */
enum coords {
    CT_HALF_PIXEL, CT_HALF_PIXEL_SYMMETRIC, CT_PYTORCH_HALF_PIXEL, CT_ALIGN_CORNERS,
    CT_ASYMMETRIC, CT_TF_HALF_PIXEL_FOR_NN, CT_TF_CROP_AND_RESIZE,
};
enum nearest { N_ROUND_PREFER_FLOOR, N_ROUND_PREFER_CEIL, N_FLOOR, N_CEIL, N_SIMPLE };

#ifdef __CUDA_ARCH__
#define RS_ADD(a, b) __fadd_rn(a, b)
#define RS_SUB(a, b) __fsub_rn(a, b)
#define RS_MUL(a, b) __fmul_rn(a, b)
#define RS_DIV(a, b) __fdiv_rn(a, b)
#else
#define RS_ADD(a, b) ((a) + (b))
#define RS_SUB(a, b) ((a) - (b))
#define RS_MUL(a, b) ((a) * (b))
#define RS_DIV(a, b) ((a) / (b))
#endif

__host__ __device__ static float source_coord(int m, float x, float scale, int64_t in, int64_t out,
                                              float roi_start, float roi_end)
{
    float fin = (float)in, fout = (float)out;
    switch (m) {
    case CT_HALF_PIXEL: return RS_SUB(RS_DIV(RS_ADD(x, 0.5f), scale), 0.5f);
    case CT_HALF_PIXEL_SYMMETRIC: {
        float adjustment = RS_DIV(fout, RS_MUL(scale, fin)), center = RS_DIV(fin, 2.0f);
        return RS_SUB(RS_ADD(RS_MUL(center, RS_SUB(1.0f, adjustment)), RS_DIV(RS_ADD(x, 0.5f), scale)),
                      0.5f);
    }
    case CT_PYTORCH_HALF_PIXEL: return out > 1 ? RS_SUB(RS_DIV(RS_ADD(x, 0.5f), scale), 0.5f) : 0.0f;
    case CT_ALIGN_CORNERS: return out == 1 ? 0.0f : RS_DIV(RS_MUL(x, RS_SUB(fin, 1.0f)), RS_SUB(fout, 1.0f));
    case CT_ASYMMETRIC: return RS_DIV(x, scale);
    case CT_TF_HALF_PIXEL_FOR_NN: return RS_DIV(RS_ADD(x, 0.5f), scale);
    case CT_TF_CROP_AND_RESIZE:
        return out > 1 ? RS_ADD(RS_MUL(roi_start, RS_SUB(fin, 1.0f)),
                                RS_DIV(RS_MUL(RS_MUL(x, RS_SUB(roi_end, roi_start)), RS_SUB(fin, 1.0f)),
                                       RS_SUB(fout, 1.0f)))
                       : RS_MUL(RS_MUL(0.5f, RS_ADD(roi_start, roi_end)), RS_SUB(fin, 1.0f));
    }
    return x;
}

__host__ __device__ static int64_t round_nearest(int m, float x, float scale)
{
    switch (m) {
    case N_ROUND_PREFER_FLOOR:
        return x == RS_ADD(floorf(x), 0.5f) ? (int64_t)floorf(x) : (int64_t)roundf(x);
    case N_ROUND_PREFER_CEIL: return (int64_t)roundf(x);
    case N_FLOOR: return (int64_t)floorf(x);
    case N_CEIL: return (int64_t)ceilf(x);
    case N_SIMPLE: return scale < 1 ? (int64_t)ceilf(x) : (int64_t)x;
    }
    return 0;
}

/* One table entry: output position o of an axis in -> out. */
__host__ __device__ static void table_entry(int cm, int nm, bool linear, float scale, float start,
                                            float end, int64_t in, int64_t out, int64_t o,
                                            int64_t *i0, int64_t *i1, float *w0, float *w1)
{
    float x = source_coord(cm, (float)o, scale, in, out, start, end);
    if (cm == CT_TF_CROP_AND_RESIZE && (x < 0 || x > (float)(in - 1))) {
        *i0 = *i1 = -1, *w0 = 1, *w1 = 0;
    } else if (linear) {
        x = x < 0 ? 0 : x > (float)(in - 1) ? (float)(in - 1) : x;
        int64_t i = (int64_t)x;
        if (i > in - 1) i = in - 1;
        *i0 = i;
        *i1 = i < in - 1 ? i + 1 : i;
        *w1 = RS_SUB(x, (float)i);
        *w0 = RS_SUB(1.0f, *w1);
    } else {
        int64_t i = round_nearest(nm, x, scale);
        *i0 = *i1 = i < 0 ? 0 : i > in - 1 ? in - 1 : i;
        *w0 = 1, *w1 = 0;
    }
}

struct rs_plan {
    int rank, lead, cm, nm;
    bool linear;
    float extrapolation;
    int64_t xdims[GP_MAX_RANK], ydims[GP_MAX_RANK], xst[GP_MAX_RANK], yst[GP_MAX_RANK];
    float scale[GP_MAX_RANK], start[GP_MAX_RANK], end[GP_MAX_RANK];
    /* Device tables per axis (axes >= lead): into scratch. */
    int64_t *i0[GP_MAX_RANK], *i1[GP_MAX_RANK];
    float *w0[GP_MAX_RANK], *w1[GP_MAX_RANK];
    int64_t *first[GP_MAX_RANK], *last[GP_MAX_RANK]; /* backward: outputs reading input i */
    int64_t tab_total, in_total;                     /* sums of ydims / xdims over axes >= lead */
};

/* Tables for every axis: 2 int64 and 2 float per output position, and
 * (backward) 2 int64 per input position. */
static size_t resize_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    const struct gp_value *x = gp_node_input(g, node, 0), *y = gp_node_output(g, node, 0);
    size_t n = 0, m = 0;
    for (int d = 0; d < y->shape.rank; d++) n += (size_t)y->shape.dims[d], m += (size_t)x->shape.dims[d];
    return n * (2 * sizeof(int64_t) + 2 * sizeof(float)) + m * 2 * sizeof(int64_t);
}

static int choice(const char *s, const char *const *names, int n, int dflt)
{
    for (int k = 0; k < n; k++)
        if (strcmp(s, names[k]) == 0) return k;
    return dflt;
}

static int const_floats(const struct gp_cuda_ctx *c, int i, float *out, int max)
{
    if (i >= c->node->n_inputs || c->node->inputs[i] < 0) return 0;
    const struct gp_tensor *t = gp_cuda_in_value(c, i)->constant;
    int64_t n = t ? gp_shape_numel(&t->shape) : 0;
    if (n > max) n = max;
    for (int64_t k = 0; k < n; k++) out[k] = (float)gp_tensor_get_f64(t, k);
    return (int)n;
}

static gp_status resize_plan(struct gp_cuda_ctx *c, struct gp_error *err, struct rs_plan *p)
{
    const struct gp_node *n = c->node;
    const struct gp_shape *xs = &gp_cuda_in_value(c, 0)->shape, *ys = &gp_cuda_out_value(c, 0)->shape;
    int r = xs->rank, version = n->def->since_version;
    bool upsample = strcmp(n->op_type, "Upsample") == 0, modern = !upsample && version >= 11;
    memset(p, 0, sizeof *p);
    const char *mode = gp_node_attr_string(n, "mode", "nearest");
    if (strcmp(mode, "nearest") != 0 && strcmp(mode, "linear") != 0)
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED,
                             "mode '%s' is not supported (nearest and linear are)", mode);
    p->linear = strcmp(mode, "linear") == 0;
    static const char *const coord_names[] = {
        "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
        "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"};
    static const char *const nearest_names[] = {"round_prefer_floor", "round_prefer_ceil",
                                                "floor", "ceil"};
    p->cm = modern ? choice(gp_node_attr_string(n, "coordinate_transformation_mode", "half_pixel"),
                            coord_names, 7, 0)
                   : CT_ASYMMETRIC;
    p->nm = modern ? choice(gp_node_attr_string(n, "nearest_mode", "round_prefer_floor"),
                            nearest_names, 4, 0)
                   : N_SIMPLE;
    p->extrapolation = gp_node_attr_float(n, "extrapolation_value", 0.0f);

    int axes[GP_MAX_RANK], n_axes = r;
    for (int d = 0; d < r; d++) axes[d] = d;
    const int64_t *ax;
    int64_t n_ax = gp_node_attr_ints(n, "axes", &ax);
    if (n_ax >= 0) {
        struct gp_infer_ctx ic = gp_cuda_infer_ctx(c->graph, c->node, err);
        n_axes = (int)n_ax;
        for (int k = 0; k < n_axes; k++) GP_TRY(gp_norm_axis(&ic, ax[k], r, &axes[k]));
    }
    float given[GP_MAX_RANK], roi[2 * GP_MAX_RANK];
    for (int d = 0; d < r; d++) p->scale[d] = 1, p->start[d] = 0, p->end[d] = 1;
    int n_given;
    if (upsample && version < 9) {
        const struct gp_attr *a = gp_node_attr(n, "scales");
        n_given = a ? (int)a->count : 0;
        for (int k = 0; k < n_given && k < GP_MAX_RANK; k++) given[k] = a->floats[k];
    } else {
        n_given = const_floats(c, modern ? 2 : 1, given, GP_MAX_RANK);
    }
    if (n_given) {
        for (int k = 0; k < n_axes && k < n_given; k++) p->scale[axes[k]] = given[k];
    } else {
        const char *policy = gp_node_attr_string(n, "keep_aspect_ratio_policy", "stretch");
        bool larger = strcmp(policy, "not_smaller") == 0, stretch = strcmp(policy, "stretch") == 0;
        const struct gp_value *sv = c->node->n_inputs > 3 ? gp_cuda_in_value(c, 3) : NULL;
        const struct gp_tensor *sizes = sv ? sv->constant : NULL;
        if (!sizes)
            return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED,
                                 "neither constant scales nor constant sizes are given");
        float common = larger ? 0.0f : INFINITY;
        for (int k = 0; k < n_axes; k++) {
            int d = axes[k];
            p->scale[d] = (float)ys->dims[d] / (float)xs->dims[d];
            float f = (float)gp_tensor_get_i64(sizes, k) / (float)xs->dims[d];
            common = larger ? fmaxf(common, f) : fminf(common, f);
        }
        if (!stretch)
            for (int k = 0; k < n_axes; k++) p->scale[axes[k]] = common;
    }
    if (p->cm == CT_TF_CROP_AND_RESIZE) {
        if (const_floats(c, 1, roi, 2 * GP_MAX_RANK) >= 2 * n_axes)
            for (int k = 0; k < n_axes; k++)
                p->start[axes[k]] = roi[k], p->end[axes[k]] = roi[n_axes + k];
    }
    if (gp_node_attr_int(n, "antialias", 0) && p->linear)
        for (int d = 0; d < r; d++)
            if (p->scale[d] < 1)
                return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED,
                                     "antialiased downsampling (axis %d, scale %g) is not supported",
                                     d, (double)p->scale[d]);
    /* Channels-last X and Y: the plan of the same resize over the storage
     * order of the axes, [N, H, W, C] (gp_cuda_kernel.layout_native). Every
     * kernel below then works as the tensors lie: each output takes the
     * same sources and weights (an axis's weights are multiplied in axis
     * order, and the channel axis, an identity, contributes 1s or skipped
     * corners wherever it falls), and backward visits a source's outputs in
     * the same order (H before W). */
    struct gp_shape xs_st, ys_st;
    if (r == 4 && gp_cuda_nhwc(c->in_nhwc, 0)) {
        static const int perm[4] = {0, 2, 3, 1};
        float scale[4], start[4], end[4];
        xs_st = *xs, ys_st = *ys;
        for (int d = 0; d < 4; d++) {
            xs_st.dims[d] = xs->dims[perm[d]];
            ys_st.dims[d] = ys->dims[perm[d]];
            scale[d] = p->scale[perm[d]], start[d] = p->start[perm[d]], end[d] = p->end[perm[d]];
        }
        for (int d = 0; d < 4; d++) p->scale[d] = scale[d], p->start[d] = start[d], p->end[d] = end[d];
        xs = &xs_st;
        ys = &ys_st;
    }
    p->rank = r;
    gp_shape_strides(xs, p->xst);
    gp_shape_strides(ys, p->yst);
    p->lead = r;
    for (int d = 0; d < r; d++) {
        p->xdims[d] = xs->dims[d];
        p->ydims[d] = ys->dims[d];
        int64_t in = xs->dims[d], out = ys->dims[d];
        bool identity = in == out;
        for (int64_t o = 0; identity && o < out; o++) {
            int64_t i0, i1;
            float w0, w1;
            table_entry(p->cm, p->nm, p->linear, p->scale[d], p->start[d], p->end[d], in, out, o, &i0,
                        &i1, &w0, &w1);
            identity = i0 == o && w1 == 0;
        }
        if (!identity && p->lead == r) p->lead = d;
    }
    /* Scratch: int64 tables (i0, i1 per output position; first, last per
     * input position) for axes >= lead, then the float weights. */
    int64_t *ints = (int64_t *)c->scratch;
    int64_t tab = 0, inn = 0;
    for (int d = p->lead; d < r; d++) tab += ys->dims[d], inn += xs->dims[d];
    float *reals = (float *)(ints + 2 * tab + 2 * inn);
    for (int d = p->lead; d < r; d++) {
        p->i0[d] = ints, p->i1[d] = ints + ys->dims[d];
        ints += 2 * ys->dims[d];
        p->first[d] = ints, p->last[d] = ints + xs->dims[d];
        ints += 2 * xs->dims[d];
        p->w0[d] = reals, p->w1[d] = reals + ys->dims[d];
        reals += 2 * ys->dims[d];
    }
    p->tab_total = tab;
    p->in_total = inn;
    return GP_OK;
}

/* Entry t of the flattened tables (axes lead.., positions): its axis. */
__device__ static inline int rs_axis_of(const struct rs_plan &p, int64_t *t, const int64_t *dims)
{
    int d = p.lead;
    while (d < p.rank - 1 && *t >= dims[d]) *t -= dims[d], d++;
    return d;
}

/* One thread per (axis, output position): the tables; with `ranges`, the
 * range of output positions reading each input position (first / last,
 * set to (INT64_MAX, -1) before) by integer min / max. */
__global__ static void rs_tables_kernel(struct rs_plan p, bool ranges)
{
    GP_GRID_STRIDE(t, p.tab_total) {
        int64_t o = t;
        int d = rs_axis_of(p, &o, p.ydims);
        int64_t i0, i1;
        float w0, w1;
        table_entry(p.cm, p.nm, p.linear, p.scale[d], p.start[d], p.end[d], p.xdims[d], p.ydims[d], o,
                    &i0, &i1, &w0, &w1);
        p.i0[d][o] = i0, p.i1[d][o] = i1, p.w0[d][o] = w0, p.w1[d][o] = w1;
        if (ranges && i0 >= 0) {
            atomicMin((long long *)&p.first[d][i0], (long long)o);
            atomicMax((long long *)&p.last[d][i0], (long long)o);
            if (p.linear && i1 != i0) {
                atomicMin((long long *)&p.first[d][i1], (long long)o);
                atomicMax((long long *)&p.last[d][i1], (long long)o);
            }
        }
    }
}

__global__ static void rs_ranges_init_kernel(struct rs_plan p)
{
    GP_GRID_STRIDE(t, p.in_total) {
        int64_t i = t;
        int d = rs_axis_of(p, &i, p.xdims);
        p.first[d][i] = INT64_MAX;
        p.last[d][i] = -1;
    }
}

/* Generic kernels, one thread per element, any rank and lead. */

/* Output element o: nearest copies its source (float32 here), linear sums
 * its corners' weighted values in double, corner by corner as the CPU
 * (corner k: bit d - lead picks axis d's high neighbour; the weight is the
 * product over the axes in order; corners of weight 0 skipped). */
template <typename XP, typename YP>
__global__ static void rs_forward_f32_kernel(struct rs_plan p, XP X, YP Y, int64_t n)
{
    int corners = p.linear ? 1 << (p.rank - p.lead) : 1;
    GP_GRID_STRIDE(o, n) {
        int64_t idx[GP_MAX_RANK], rem = o, base = 0;
        for (int d = p.rank - 1; d >= 0; d--) {
            int64_t q = gp_dev_fdiv(rem, p.ydims[d]);
            idx[d] = rem - q * p.ydims[d];
            rem = q;
            if (d < p.lead) base += idx[d] * p.xst[d];
        }
        double acc = 0;
        bool extrap = false;
        for (int k = 0; k < corners; k++) {
            int64_t src = base;
            float w = 1.0f;
            for (int d = p.lead; d < p.rank && src >= 0; d++) {
                bool hi = (k >> (d - p.lead)) & 1;
                int64_t i = hi ? p.i1[d][idx[d]] : p.i0[d][idx[d]];
                w = FMUL(w, hi ? p.w1[d][idx[d]] : p.w0[d][idx[d]]);
                src = i < 0 ? -1 : src + i * p.xst[d];
            }
            if (w == 0 && src >= 0) continue;
            if (src < 0) {
                extrap = true;
                break;
            }
            if (!p.linear) {
                acc = ld(X, src);
                break;
            }
            acc = DADD(acc, DMUL((double)w, (double)ld(X, src)));
        }
        st(Y, o, extrap ? p.extrapolation : (float)acc);
    }
}

/* Nearest on any other dtype: the source element's bytes. */
template <typename T>
__global__ static void rs_forward_copy_kernel(struct rs_plan p, const T *X, T *Y, int dt, int64_t n)
{
    GP_GRID_STRIDE(o, n) {
        int64_t rem = o, src = 0;
        for (int d = p.rank - 1; d >= 0 && src >= 0; d--) {
            int64_t q = gp_dev_fdiv(rem, p.ydims[d]), id = rem - q * p.ydims[d];
            rem = q;
            int64_t i = d < p.lead ? id : p.i0[d][id];
            src = i < 0 ? -1 : src + i * p.xst[d];
        }
        if (src < 0) gp_dev_store_f64(Y, dt, o, (double)p.extrapolation);
        else Y[o] = X[src];
    }
}

/* Input element i gathers w * dY[o] over the outputs o and corners that
 * read it, in the CPU's order (o row-major, corners ascending), adding in
 * float straight into dX[i] as the CPU's scatter does. Per table axis the
 * outputs reading position xi[d] are first..last, filtered by the tables
 * (a corner counts where every axis's neighbour is xi[d]). */
template <typename DP, typename GP>
__device__ static void rs_gather(const struct rs_plan &p, DP dY, GP dX, int64_t i)
{
    int corners = p.linear ? 1 << (p.rank - p.lead) : 1;
    int64_t xi[GP_MAX_RANK], rem = i, base = 0;
    for (int d = p.rank - 1; d >= 0; d--) {
        int64_t q = gp_dev_fdiv(rem, p.xdims[d]);
        xi[d] = rem - q * p.xdims[d];
        rem = q;
        if (d < p.lead) base += xi[d] * p.yst[d];
    }
    int64_t lo[GP_MAX_RANK], hi[GP_MAX_RANK], oi[GP_MAX_RANK];
    for (int d = p.lead; d < p.rank; d++) {
        lo[d] = p.first[d][xi[d]];
        hi[d] = p.last[d][xi[d]];
        oi[d] = lo[d];
        if (lo[d] > hi[d]) return;
    }
    float acc = ld(dX, i);
    for (;;) {
        int64_t off = base;
        for (int d = p.lead; d < p.rank; d++) off += oi[d] * p.yst[d];
        for (int k = 0; k < corners; k++) {
            float w = 1.0f;
            bool match = true;
            for (int d = p.lead; d < p.rank; d++) {
                bool h = (k >> (d - p.lead)) & 1;
                if ((h ? p.i1[d][oi[d]] : p.i0[d][oi[d]]) != xi[d]) {
                    match = false;
                    break;
                }
                w = FMUL(w, h ? p.w1[d][oi[d]] : p.w0[d][oi[d]]);
            }
            if (!match || w == 0) continue;
            acc = FADD(acc, FMUL(w, ld(dY, off)));
        }
        int d = p.rank - 1;
        for (; d >= p.lead; d--) {
            if (++oi[d] <= hi[d]) break;
            oi[d] = lo[d];
        }
        if (d < p.lead) break;
    }
    st(dX, i, acc);
}

template <typename DP, typename GP>
__global__ static void rs_backward_kernel(struct rs_plan p, DP dY, GP dX, int64_t n)
{
    GP_GRID_STRIDE(i, n) rs_gather(p, dY, dX, i);
}

/* Row kernels (float32, lead < rank): a block takes a batch of rows of the
 * last axis. What the axes before the last contribute is the same along a
 * row, so it is worked out once per row (in parallel over the batch) into
 * shared memory, and every element then costs a look-up in the last
 * axis's table: the generic kernels spend most of their time on per-element
 * index arithmetic. */
#define RS_ROW_OUTER 64     /* corners over the axes before the last (2^6) */
#define RS_FWD_ENTRIES 256  /* (row, corner) entries of a forward batch */

/* Forward: entry (row, ko) for each corner ko over the table axes before
 * the last: the row's source offset (-1: extrapolated) and the product of
 * those axes' weights in axis order, so that the last axis's weight
 * multiplies in last, as in the CPU's product. */
template <typename XP, typename YP>
__global__ static void rs_forward_rows_kernel(struct rs_plan p, XP X, YP Y, int64_t rows)
{
    __shared__ int64_t sh_src[RS_FWD_ENTRIES];
    __shared__ float sh_w[RS_FWD_ENTRIES];
    int last = p.rank - 1, m = p.rank - p.lead;
    int outer = p.linear ? 1 << (m - 1) : 1, corners = p.linear ? 1 << m : 1;
    int64_t batch = RS_FWD_ENTRIES / outer, ylast = p.ydims[last];
    const int64_t *i0l = p.i0[last], *i1l = p.i1[last];
    const float *w0l = p.w0[last], *w1l = p.w1[last];
    for (int64_t row0 = blockIdx.x * batch; row0 < rows; row0 += (int64_t)gridDim.x * batch) {
        int64_t nr = rows - row0 < batch ? rows - row0 : batch;
        __syncthreads(); /* the previous batch's entries are read */
        for (int t = threadIdx.x; t < nr * outer; t += blockDim.x) {
            int ko = t % outer;
            int64_t rem = row0 + t / outer, src = 0, ids[GP_MAX_RANK];
            bool ext = false;
            for (int d = last - 1; d >= 0; d--) {
                int64_t q = gp_dev_fdiv(rem, p.ydims[d]);
                ids[d] = rem - q * p.ydims[d];
                rem = q;
            }
            float w = 1.0f;
            for (int d = 0; d < last; d++) {
                if (d < p.lead) {
                    src += ids[d] * p.xst[d];
                } else {
                    bool h = (ko >> (d - p.lead)) & 1;
                    int64_t i = h ? p.i1[d][ids[d]] : p.i0[d][ids[d]];
                    if (i < 0) ext = true;
                    src += i * p.xst[d];
                    w = FMUL(w, h ? p.w1[d][ids[d]] : p.w0[d][ids[d]]);
                }
            }
            sh_src[t] = ext ? -1 : src;
            sh_w[t] = w;
        }
        __syncthreads();
        for (int64_t e = threadIdx.x; e < nr * ylast; e += blockDim.x) {
            int64_t r = gp_dev_fdiv(e, ylast), ow = e - r * ylast;
            const int64_t *ss = sh_src + r * outer;
            const float *sw = sh_w + r * outer;
            int64_t y = (row0 + r) * ylast + ow;
            int64_t i0 = i0l[ow];
            if (ss[0] < 0 || i0 < 0) {
                st(Y, y, p.extrapolation);
                continue;
            }
            if (!p.linear) {
                st(Y, y, ld(X, ss[0] + i0));
                continue;
            }
            int64_t i1 = i1l[ow];
            float a0 = w0l[ow], a1 = w1l[ow];
            double acc = 0;
            for (int k = 0; k < corners; k++) {
                int ko = k & (outer - 1);
                bool h = k >> (m - 1);
                float w = FMUL(sw[ko], h ? a1 : a0);
                if (w == 0) continue;
                acc = DADD(acc, DMUL((double)w, (double)ld(X, ss[ko] + (h ? i1 : i0))));
            }
            st(Y, y, (float)acc);
        }
    }
}

/* Backward, per input row: the outputs reading it, over the table axes
 * before the last, are a product of ranges; their combinations in
 * row-major order ("combos", each an output row offset) and, per combo,
 * the corners ko whose neighbours on those axes are this row's positions
 * (the product of their weights; NaN marks a corner that does not read
 * the row) go to shared memory, one thread per row of the batch. Each
 * element then gathers in the CPU's order: combos, the last axis's outputs
 * in its range, corners (the last axis's bit is the high one). A row with
 * more combos or entries than fit falls back to rs_gather. */
#define RS_BWD_ROWS 32
#define RS_BWD_COMBOS 16
#define RS_BWD_ENTRIES 64

template <typename DP, typename GP>
__global__ static void rs_backward_rows_kernel(struct rs_plan p, DP dY, GP dX, int64_t rows)
{
    __shared__ int64_t sh_off[RS_BWD_ROWS][RS_BWD_COMBOS];
    __shared__ int sh_first[RS_BWD_ROWS][RS_BWD_COMBOS + 1];
    __shared__ float sh_w[RS_BWD_ROWS][RS_BWD_ENTRIES];
    __shared__ int sh_n[RS_BWD_ROWS]; /* combos, or -1: fall back */
    int last = p.rank - 1, m = p.rank - p.lead;
    int outer = p.linear ? 1 << (m - 1) : 1;
    int64_t xlast = p.xdims[last];
    const int64_t *i0l = p.i0[last], *i1l = p.i1[last];
    const float *w0l = p.w0[last], *w1l = p.w1[last];
    const int64_t *fl = p.first[last], *ll = p.last[last];
    for (int64_t row0 = blockIdx.x * (int64_t)RS_BWD_ROWS; row0 < rows;
         row0 += (int64_t)gridDim.x * RS_BWD_ROWS) {
        int64_t nr = rows - row0 < RS_BWD_ROWS ? rows - row0 : RS_BWD_ROWS;
        __syncthreads();
        if (threadIdx.x < nr) {
            int rr = threadIdx.x;
            int64_t rem = row0 + rr, base = 0, xi[GP_MAX_RANK], lo[GP_MAX_RANK], hi[GP_MAX_RANK],
                    oi[GP_MAX_RANK];
            for (int d = last - 1; d >= 0; d--) {
                int64_t q = gp_dev_fdiv(rem, p.xdims[d]);
                xi[d] = rem - q * p.xdims[d];
                rem = q;
                if (d < p.lead) base += xi[d] * p.yst[d];
            }
            int n = 0, e = 0;
            bool empty = false;
            for (int d = p.lead; d < last; d++) {
                lo[d] = oi[d] = p.first[d][xi[d]];
                hi[d] = p.last[d][xi[d]];
                if (lo[d] > hi[d]) empty = true;
            }
            while (!empty) {
                if (n == RS_BWD_COMBOS || e + outer > RS_BWD_ENTRIES) {
                    n = -1;
                    break;
                }
                int64_t off = base;
                for (int d = p.lead; d < last; d++) off += oi[d] * p.yst[d];
                sh_off[rr][n] = off;
                sh_first[rr][n] = e;
                for (int ko = 0; ko < outer; ko++) {
                    float w = 1.0f;
                    bool match = true;
                    for (int d = p.lead; d < last && match; d++) {
                        bool h = (ko >> (d - p.lead)) & 1;
                        if ((h ? p.i1[d][oi[d]] : p.i0[d][oi[d]]) != xi[d]) match = false;
                        else w = FMUL(w, h ? p.w1[d][oi[d]] : p.w0[d][oi[d]]);
                    }
                    sh_w[rr][e++] = match ? w : NAN;
                }
                n++;
                int d = last - 1;
                for (; d >= p.lead; d--) {
                    if (++oi[d] <= hi[d]) break;
                    oi[d] = lo[d];
                }
                if (d < p.lead) break;
            }
            if (n >= 0) sh_first[rr][n] = e;
            sh_n[rr] = n;
        }
        __syncthreads();
        for (int64_t el = threadIdx.x; el < nr * xlast; el += blockDim.x) {
            int64_t r = gp_dev_fdiv(el, xlast), xw = el - r * xlast, i = (row0 + r) * xlast + xw;
            int n = sh_n[r];
            if (n < 0) {
                rs_gather(p, dY, dX, i);
                continue;
            }
            int64_t lo = fl[xw], hi = ll[xw];
            if (lo > hi || n == 0) continue;
            float acc = ld(dX, i);
            for (int c = 0; c < n; c++) {
                DP dy = dY + sh_off[r][c];
                int e0 = sh_first[r][c], e1 = sh_first[r][c + 1];
                for (int64_t ow = lo; ow <= hi; ow++) {
                    for (int h = 0; h < (p.linear ? 2 : 1); h++) {
                        if ((h ? i1l[ow] : i0l[ow]) != xw) continue;
                        float wl = h ? w1l[ow] : w0l[ow];
                        for (int e = e0; e < e1; e++) {
                            float wo = sh_w[r][e];
                            if (wo != wo) continue;
                            float w = FMUL(wo, wl);
                            if (w == 0) continue;
                            acc = FADD(acc, FMUL(w, ld(dy, ow)));
                        }
                    }
                }
            }
            st(dX, i, acc);
        }
    }
}

/* The row kernels take a resized axis (lead < rank) and at most
 * RS_ROW_OUTER corners over the axes before the last. */
static bool rs_rows_ok(const struct rs_plan &p)
{
    int m = p.rank - p.lead;
    return m >= 1 && (!p.linear || (1 << (m - 1)) <= RS_ROW_OUTER);
}

/* X [D0..] -> Y [O0..]. */
static gp_status resize_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    struct rs_plan p;
    GP_TRY(resize_plan(c, err, &p));
    enum gp_dtype dt = gp_cuda_in_value(c, 0)->dtype;
    int64_t n = gp_shape_numel(&gp_cuda_out_value(c, 0)->shape);
    if (n == 0) return GP_OK;
    if (p.linear && dt != GP_DTYPE_FLOAT32)
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "linear resizing of %s data", gp_dtype_name(dt));
    if (gp_dtype_is_float(dt) && dt != GP_DTYPE_FLOAT32)
        return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "%s data (the CUDA kernel takes float32 and "
                             "integer types)", gp_dtype_name(dt));
    if (p.tab_total > 0) {
        rs_tables_kernel<<<gp_cuda_blocks_for(p.tab_total), GP_CUDA_THREADS, 0, c->stream>>>(p, false);
        GP_TRY(gp_cuda_check_launch(c, "resize tables", err));
    }
    unsigned g = gp_cuda_blocks_for(n);
    if (dt == GP_DTYPE_FLOAT32) {
        gp_fptr xf = gp_cuda_in_f(c, 0), yf = gp_cuda_out_f(c, 0);
        cudaStream_t stream = c->stream;
        with_storage(storage_of({xf, yf}), [&](auto tag) {
            auto X = in_as(tag, xf);
            auto Y = out_as(tag, yf);
            if (rs_rows_ok(p)) {
                int64_t ylast = p.ydims[p.rank - 1];
                int64_t rows = n / ylast, batch = RS_FWD_ENTRIES / (p.linear ? 1 << (p.rank - p.lead - 1) : 1);
                rs_forward_rows_kernel<<<gp_cuda_capped_grid((rows + batch - 1) / batch, 1 << 20), GP_CUDA_THREADS,
                                         0, stream>>>(p, X, Y, rows);
            } else {
                rs_forward_f32_kernel<<<g, GP_CUDA_THREADS, 0, stream>>>(p, X, Y, n);
            }
        });
    } else {
        switch (gp_dtype_size(dt)) {
        case 1:
            rs_forward_copy_kernel<uint8_t><<<g, GP_CUDA_THREADS, 0, c->stream>>>(
                p, (const uint8_t *)c->in[0], (uint8_t *)c->out[0], (int)dt, n);
            break;
        case 2:
            rs_forward_copy_kernel<uint16_t><<<g, GP_CUDA_THREADS, 0, c->stream>>>(
                p, (const uint16_t *)c->in[0], (uint16_t *)c->out[0], (int)dt, n);
            break;
        case 4:
            rs_forward_copy_kernel<uint32_t><<<g, GP_CUDA_THREADS, 0, c->stream>>>(
                p, (const uint32_t *)c->in[0], (uint32_t *)c->out[0], (int)dt, n);
            break;
        case 8:
            rs_forward_copy_kernel<uint64_t><<<g, GP_CUDA_THREADS, 0, c->stream>>>(
                p, (const uint64_t *)c->in[0], (uint64_t *)c->out[0], (int)dt, n);
            break;
        default:
            return gp_cuda_error(c, err, GP_ERR_UNSUPPORTED, "resizing %s data", gp_dtype_name(dt));
        }
    }
    return gp_cuda_check_launch(c, "resize forward", err);
}

/* dX[source] += weight * dY[o] for every source of every output element,
 * as a gather per input element. */
static gp_status resize_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->din[0] || !c->dout[0]) return GP_OK;
    GP_TRY(gp_cuda_want_f32(c, 0, err));
    struct rs_plan p;
    GP_TRY(resize_plan(c, err, &p));
    int64_t n = gp_shape_numel(&gp_cuda_in_value(c, 0)->shape);
    if (n == 0 || gp_shape_numel(&gp_cuda_out_value(c, 0)->shape) == 0) return GP_OK;
    if (p.lead == p.rank) {
        /* Every axis an identity: dX += dY. The gather below does that too
         * (no table axes: one output, one corner); it is the same kernel. */
    } else {
        rs_ranges_init_kernel<<<gp_cuda_blocks_for(p.in_total), GP_CUDA_THREADS, 0, c->stream>>>(p);
        GP_TRY(gp_cuda_check_launch(c, "resize backward (ranges)", err));
        rs_tables_kernel<<<gp_cuda_blocks_for(p.tab_total), GP_CUDA_THREADS, 0, c->stream>>>(p, true);
        GP_TRY(gp_cuda_check_launch(c, "resize backward (tables)", err));
    }
    gp_fptr dyf = gp_cuda_dout_f(c, 0), dxf = gp_cuda_din_f(c, 0);
    cudaStream_t stream = c->stream;
    with_storage(storage_of({dyf, dxf}), [&](auto tag) {
        auto dY = in_as(tag, dyf);
        auto dX = out_as(tag, dxf);
        if (rs_rows_ok(p)) {
            int64_t xlast = p.xdims[p.rank - 1];
            int64_t rows = n / xlast;
            rs_backward_rows_kernel<<<gp_cuda_capped_grid((rows + RS_BWD_ROWS - 1) / RS_BWD_ROWS, 1 << 20),
                                      GP_CUDA_THREADS, 0, stream>>>(p, dY, dX, rows);
        } else {
            rs_backward_kernel<<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, stream>>>(p, dY, dX, n);
        }
    });
    return gp_cuda_check_launch(c, "resize backward", err);
}

/* X and Y channels-last, both of rank 4 (the layout pass tags both or
 * neither; scales, sizes and roi are never tagged): resize_plan works in
 * their storage order. */
static bool resize_layout_native(const struct gp_graph *g, const struct gp_node *node, uint32_t in_nhwc,
                                 uint32_t out_nhwc, bool backward)
{
    (void)backward;
    return in_nhwc == 1u && out_nhwc == 1u && gp_node_input(g, node, 0)->shape.rank == 4;
}

/* ---- the table ---- */

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_resize[] = {
    {"Resize", NULL, resize_scratch, resize_forward, resize_backward, false, true, false, NULL,
     resize_layout_native},
    {"Upsample", NULL, resize_scratch, resize_forward, resize_backward, false, true, false, NULL,
     resize_layout_native},
    {NULL, NULL, NULL, NULL, NULL, false, false},
};
