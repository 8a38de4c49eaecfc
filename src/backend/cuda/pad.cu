/* CUDA kernels: Pad, twin of backend/cpu/pad.c: constant, reflect, edge and
 * wrap modes, every dtype. The CPU's per-axis maps are computed on the fly.
 *
 * Backward has each input element walk the output cells that read it (per
 * axis a range, a progression or at most three mirror images) in row-major
 * order: the CPU's sequence of additions, without atomics.
 *
 * Differences from the CPU kernels: the constant value is read on the
 * device.
 *
 * bfloat16 (bf16_any): float X, Y, dY, dX and the constant value each
 * float32 or bfloat16; loads widen, every stored value is rounded once (the
 * value into a bfloat16 Y; a dX element sums its terms in float from its
 * widened value), so results equal those of float32 copies. */
#include <string.h>

#include <initializer_list>

#include <cuda_runtime.h>

#include "backend/cuda/bf16.cuh"
#include "backend/cuda/kernel.h"
#include "backend/cuda/kernel_util.cuh"
#include "backend/cuda/storage.cuh"

extern "C" {
#include "ops/fold_util.h"
}

/* ---- Pad ---- */

/* Per axis d, output position o reads input position o - begin[d],
 * brought back inside by the mode (edge: clamp; reflect: mirror without
 * repeating the border; wrap: modulo), or the constant: the CPU's maps,
 * computed on the fly. */
enum pad_mode { PAD_CONSTANT, PAD_REFLECT, PAD_EDGE, PAD_WRAP };

struct pad_plan {
    int rank, mode;
    int64_t xd[GP_MAX_RANK], yd[GP_MAX_RANK], begin[GP_MAX_RANK], x_st[GP_MAX_RANK], y_st[GP_MAX_RANK];
};

/* Constant fill: *fillp when given (device memory), else the bits of fillv. */
struct pad_fill {
    const void *fillp;
    unsigned long long fillv;
};

static gp_status pad_plan_of(struct gp_cuda_ctx *c, struct gp_error *err, struct pad_plan *p,
                             struct pad_fill *f)
{
    struct gp_infer_ctx ic = gp_cuda_infer_ctx(c->graph, c->node, err);
    const struct gp_shape *xs = gp_cuda_in_shape(c, 0), *ys = gp_cuda_out_shape(c, 0);
    int version = c->node->def->since_version, r = xs->rank;
    const char *mode = gp_node_attr_string(c->node, "mode", "constant");
    memset(p, 0, sizeof *p);
    memset(f, 0, sizeof *f);
    p->rank = r;
    p->mode = !strcmp(mode, "reflect") ? PAD_REFLECT : !strcmp(mode, "edge") ? PAD_EDGE
              : !strcmp(mode, "wrap") ? PAD_WRAP : PAD_CONSTANT;
    int64_t pads[2 * GP_MAX_RANK];
    int n_pads = 0, axes[GP_MAX_RANK], n_axes = r;
    for (int d = 0; d < r; d++) axes[d] = d;
    enum gp_dtype dt = gp_cuda_in_value(c, 0)->dtype;
    if (version < 11) {
        const int64_t *v;
        n_pads = (int)gp_node_attr_ints(c->node, "pads", &v);
        for (int k = 0; k < n_pads && k < 2 * GP_MAX_RANK; k++) pads[k] = v[k];
        float value = gp_node_attr_float(c->node, "value", 0.0f);
        uint32_t bits;
        memcpy(&bits, &value, sizeof bits);
        if (gp_dtype_is_float(dt)) f->fillv = bits;
    } else {
        GP_TRY(gp_const_ints(&ic, 1, "pads", pads, 2 * GP_MAX_RANK, &n_pads));
        bool has_value = c->node->n_inputs > 2 && c->in[2];
        if (gp_dtype_is_float(dt)) {
            if (has_value && gp_dtype_is_float(gp_cuda_in_value(c, 2)->dtype)) f->fillp = c->in[2];
        } else if (has_value) {
            f->fillp = c->in[2];
        }
        if (version >= 18 && c->node->n_inputs > 3 && c->in[3]) {
            int64_t ax[GP_MAX_RANK];
            GP_TRY(gp_const_ints(&ic, 3, "axes", ax, GP_MAX_RANK, &n_axes));
            for (int k = 0; k < n_axes; k++) GP_TRY(gp_norm_axis(&ic, ax[k], r, &axes[k]));
        }
    }
    if (n_pads < n_axes)
        return gp_cuda_error(c, err, GP_ERR_INVALID, "%d pads for %d axes", n_pads, n_axes);
    for (int k = 0; k < n_axes; k++) p->begin[axes[k]] = pads[k];
    gp_shape_strides(xs, p->x_st);
    gp_shape_strides(ys, p->y_st);
    for (int d = 0; d < r; d++) {
        p->xd[d] = xs->dims[d];
        p->yd[d] = ys->dims[d];
    }
    return GP_OK;
}

/* The input element output element o reads (*src), or false: the
 * constant. */
__device__ static inline bool pad_source(const struct pad_plan &p, int64_t o, int64_t *src)
{
    int64_t rem = o, s = 0;
    bool inside = true;
    for (int d = p.rank - 1; d >= 0; d--) {
        int64_t od = rem % p.yd[d], in = p.xd[d];
        rem /= p.yd[d];
        int64_t i = od - p.begin[d];
        if (i < 0 || i >= in) {
            switch (p.mode) {
            case PAD_CONSTANT: inside = false; break;
            case PAD_EDGE: i = i < 0 ? 0 : in - 1; break;
            case PAD_REFLECT: i = i < 0 ? -i : 2 * (in - 1) - i; break;
            default: i = ((i % in) + in) % in; break;
            }
        }
        s += i * p.x_st[d];
    }
    *src = s;
    return inside;
}

template <typename T>
__global__ static void pad_forward_kernel(struct pad_plan p, struct pad_fill f, const T *x, T *y, int64_t n)
{
    T fill;
    if (f.fillp) fill = *(const T *)f.fillp;
    else memcpy(&fill, &f.fillv, sizeof fill); /* the low bytes: little-endian */
    GP_GRID_STRIDE(o, n)
    {
        int64_t src;
        bool inside = pad_source(p, o, &src);
        y[o] = inside ? x[src] : fill;
    }
}

/* Float data with any bfloat16 among X, Y and the value: the elements
 * widened and stored rounded (X's values pass exactly between like
 * storages); the value from fillp (the input, either storage) or fillv
 * (float32 bits). XP, YP: the storage of X and Y. */
template <typename XP, typename YP>
__global__ static void pad_forward_float_kernel(struct pad_plan p, gp_fptr fillp, uint32_t fillv, XP x, YP y,
                                                int64_t n)
{
    float fill;
    if (fillp.p) fill = gp_ld(fillp, 0);
    else memcpy(&fill, &fillv, sizeof fill);
    GP_GRID_STRIDE(o, n)
    {
        int64_t src;
        bool inside = pad_source(p, o, &src);
        st(y, o, inside ? ld(x, src) : fill);
    }
}

/* The output positions along one axis that read input position i, in
 * increasing order: n of them, at first + k * step, or pts[k] (reflect). */
struct preimage {
    int64_t n, first, step, pts[3];
    bool list;
};

__device__ static inline void pad_preimage(int mode, int64_t i, int64_t b, int64_t in, int64_t out,
                                           struct preimage *pi)
{
    pi->list = false;
    pi->step = 1;
    switch (mode) {
    case PAD_CONSTANT:
        pi->first = i + b;
        pi->n = pi->first >= 0 && pi->first < out;
        break;
    case PAD_EDGE: {
        int64_t lo = i == 0 ? 0 : i + b, hi = i == in - 1 ? out - 1 : i + b;
        if (lo < 0) lo = 0;
        if (hi > out - 1) hi = out - 1;
        pi->first = lo;
        pi->n = hi >= lo ? hi - lo + 1 : 0;
        break;
    }
    case PAD_WRAP: {
        int64_t o0 = ((i + b) % in + in) % in;
        pi->first = o0;
        pi->step = in;
        pi->n = o0 < out ? (out - 1 - o0) / in + 1 : 0;
        break;
    }
    default: { /* reflect: b - i (left mirror), b + i, b + 2 (in - 1) - i (right mirror) */
        pi->list = true;
        pi->n = 0;
        int64_t c0 = b - i, c1 = b + i, c2 = b + 2 * (in - 1) - i;
        if (i > 0 && c0 >= 0 && c0 < out) pi->pts[pi->n++] = c0;
        if (c1 >= 0 && c1 < out) pi->pts[pi->n++] = c1;
        if (2 * (in - 1) - i >= in && c2 >= 0 && c2 < out) pi->pts[pi->n++] = c2;
        break;
    }
    }
}

/* dX[e] += dY[o] over every o that reads e, in increasing o: the CPU adds
 * them into dX in that order. DP, GP: the storage of dY and dX. */
template <typename DP, typename GP>
__global__ static void pad_backward_kernel(struct pad_plan p, DP dy, GP dx, int64_t n)
{
    GP_GRID_STRIDE(e, n)
    {
        struct preimage pi[GP_MAX_RANK];
        int64_t rem = e, k[GP_MAX_RANK];
        bool any = true;
        for (int d = p.rank - 1; d >= 0; d--) {
            int64_t i = rem % p.xd[d];
            rem /= p.xd[d];
            pad_preimage(p.mode, i, p.begin[d], p.xd[d], p.yd[d], &pi[d]);
            if (pi[d].n == 0) any = false;
            k[d] = 0;
        }
        if (!any) continue;
        float acc = ld(dx, e);
        for (;;) {
            int64_t o = 0;
            for (int d = 0; d < p.rank; d++)
                o += (pi[d].list ? pi[d].pts[k[d]] : pi[d].first + k[d] * pi[d].step) * p.y_st[d];
            acc = __fadd_rn(acc, ld(dy, o));
            int d = p.rank - 1;
            for (; d >= 0 && ++k[d] == pi[d].n; d--) k[d] = 0;
            if (d < 0) break;
        }
        st(dx, e, acc);
    }
}

static gp_status pad_forward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    struct pad_plan p;
    struct pad_fill f;
    GP_TRY(pad_plan_of(c, err, &p, &f));
    int64_t n = gp_shape_numel(gp_cuda_out_shape(c, 0));
    size_t es = gp_cuda_in_esize(c, 0);
    GP_TRY(gp_cuda_check_esize(c, es, err));
    if (n == 0) return GP_OK;
    if (gp_shape_numel(gp_cuda_in_shape(c, 0)) == 0 && p.mode != PAD_CONSTANT)
        return gp_cuda_error(c, err, GP_ERR_INVALID, "%s padding of an empty tensor",
                             gp_node_attr_string(c->node, "mode", "constant"));
    unsigned b = gp_cuda_blocks_for(n);
    cudaStream_t s = c->stream;
    gp_fptr xf = gp_cuda_in_f(c, 0), yf = gp_cuda_out_f(c, 0), ff = {(void *)f.fillp, false};
    if (f.fillp && gp_dtype_is_float(gp_cuda_in_value(c, 0)->dtype)) ff.bf16 = gp_cuda_is_bf16(c->in_dt, 2);
    if (xf.bf16 || yf.bf16 || ff.bf16) {
        with_storage(storage_of({xf, yf}), [&](auto tag) {
            pad_forward_float_kernel<<<b, GP_CUDA_THREADS, 0, s>>>(p, ff, (uint32_t)f.fillv, in_as(tag, xf),
                                                                   out_as(tag, yf), n);
        });
        return gp_cuda_check_launch(c, "Pad forward", err);
    }
    switch (es) {
    case 1: pad_forward_kernel<uint8_t><<<b, GP_CUDA_THREADS, 0, s>>>(p, f, (const uint8_t *)c->in[0], (uint8_t *)c->out[0], n); break;
    case 2: pad_forward_kernel<uint16_t><<<b, GP_CUDA_THREADS, 0, s>>>(p, f, (const uint16_t *)c->in[0], (uint16_t *)c->out[0], n); break;
    case 4: pad_forward_kernel<uint32_t><<<b, GP_CUDA_THREADS, 0, s>>>(p, f, (const uint32_t *)c->in[0], (uint32_t *)c->out[0], n); break;
    default: pad_forward_kernel<unsigned long long><<<b, GP_CUDA_THREADS, 0, s>>>(p, f, (const unsigned long long *)c->in[0], (unsigned long long *)c->out[0], n); break;
    }
    return gp_cuda_check_launch(c, "Pad forward", err);
}

static gp_status pad_backward(struct gp_cuda_ctx *c, struct gp_error *err)
{
    if (!c->din[0] || !c->dout[0]) return GP_OK;
    struct pad_plan p;
    struct pad_fill f;
    GP_TRY(pad_plan_of(c, err, &p, &f));
    int64_t n = gp_shape_numel(gp_cuda_in_shape(c, 0));
    if (n == 0 || gp_shape_numel(gp_cuda_out_shape(c, 0)) == 0) return GP_OK;
    gp_fptr dyf = gp_cuda_dout_f(c, 0), dxf = gp_cuda_din_f(c, 0);
    cudaStream_t s = c->stream;
    with_storage(storage_of({dyf, dxf}), [&](auto tag) {
        pad_backward_kernel<<<gp_cuda_blocks_for(n), GP_CUDA_THREADS, 0, s>>>(p, in_as(tag, dyf), out_as(tag, dxf),
                                                                            n);
    });
    return gp_cuda_check_launch(c, "Pad backward", err);
}

/* ---- the table ---- */

extern "C" const struct gp_cuda_kernel gp_cuda_kernels_pad[] = {
    {"Pad", NULL, NULL, pad_forward, pad_backward, false, true},
    {NULL, NULL, NULL, NULL, NULL, false, false},
};
