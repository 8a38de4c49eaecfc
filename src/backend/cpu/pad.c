/* CPU kernels: Pad (constant, reflect, edge and wrap modes; negative pads
 * crop), forward and backward, for every dtype. */
#include <string.h>

#include "backend/cpu/kernel_util.h"
#include "ops/fold_util.h"

/* ---- Pad ---- */

/* Pad: X [D0..] -> Y [D0 + b0 + e0, ..] (negative pads crop). Per axis d,
 * output position o reads input position map[d][o] = o - b[d], brought
 * back inside by the mode (edge: clamp; reflect: mirror without repeating
 * the border; wrap: modulo), or -1 for the constant. The maps live in
 * scratch: sum of the output's dimensions int64s. */
enum pad_mode { PAD_CONSTANT, PAD_REFLECT, PAD_EDGE, PAD_WRAP };

static size_t pad_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    const struct gp_value *y = gp_node_output(g, node, 0);
    size_t n = 0;
    for (int d = 0; d < y->shape.rank; d++) n += (size_t)y->shape.dims[d];
    return n * sizeof(int64_t);
}

struct pad_plan {
    int64_t *map[GP_MAX_RANK];
    int lead;       /* leading axes neither padded nor cropped */
    real value;     /* constant mode's fill (float data) */
    enum pad_mode mode;
};

static gp_status pad_plan(struct gp_cpu_ctx *c, struct gp_error *err, struct pad_plan *p)
{
    struct gp_infer_ctx ic = gp_cpu_infer_ctx(c, err);
    const struct gp_shape *xs = gp_cpu_in_shape(c, 0), *ys = gp_cpu_out_shape(c, 0);
    int version = c->node->def->since_version, r = xs->rank;
    const char *mode = gp_node_attr_string(c->node, "mode", "constant");
    p->mode = !strcmp(mode, "reflect") ? PAD_REFLECT : !strcmp(mode, "edge") ? PAD_EDGE
              : !strcmp(mode, "wrap") ? PAD_WRAP : PAD_CONSTANT;
    int64_t pads[2 * GP_MAX_RANK], begin[GP_MAX_RANK] = {0};
    int n_pads = 0, axes[GP_MAX_RANK], n_axes = r;
    for (int d = 0; d < r; d++) axes[d] = d;
    if (version < 11) {
        const int64_t *v;
        n_pads = (int)gp_node_attr_ints(c->node, "pads", &v);
        for (int k = 0; k < n_pads; k++) pads[k] = v[k];
        p->value = (real)gp_node_attr_float(c->node, "value", 0.0f);
    } else {
        GP_TRY(gp_const_ints(&ic, 1, "pads", pads, 2 * GP_MAX_RANK, &n_pads));
        p->value = c->node->n_inputs > 2 && c->in[2] && gp_dtype_is_float(gp_cpu_in_value(c, 2)->dtype)
                       ? *(const real *)c->in[2] : 0;
        if (version >= 18 && c->node->n_inputs > 3 && c->in[3]) {
            int64_t ax[GP_MAX_RANK];
            GP_TRY(gp_const_ints(&ic, 3, "axes", ax, GP_MAX_RANK, &n_axes));
            for (int k = 0; k < n_axes; k++) GP_TRY(gp_norm_axis(&ic, ax[k], r, &axes[k]));
        }
    }
    for (int k = 0; k < n_axes; k++) begin[axes[k]] = pads[k];
    int64_t *next = c->scratch;
    p->lead = r;
    for (int d = 0; d < r; d++) {
        int64_t in = xs->dims[d];
        p->map[d] = next;
        next += ys->dims[d];
        if ((begin[d] != 0 || ys->dims[d] != in) && p->lead == r) p->lead = d;
        for (int64_t o = 0; o < ys->dims[d]; o++) {
            int64_t i = o - begin[d];
            if (i < 0 || i >= in) {
                switch (p->mode) {
                case PAD_CONSTANT: i = -1; break;
                case PAD_EDGE: i = i < 0 ? 0 : in - 1; break;
                case PAD_REFLECT: i = i < 0 ? -i : 2 * (in - 1) - i; break;
                case PAD_WRAP: i = ((i % in) + in) % in; break;
                }
            }
            p->map[d][o] = i;
        }
    }
    return GP_OK;
}

/* Runs over the output in row-major order; threads split the slices of the
 * leading unpadded axes, which map one to one onto the input, so the
 * backward's accumulation into the input (several outputs may read one
 * input cell under edge/reflect/wrap) happens in a fixed order. */
static gp_status pad_run(struct gp_cpu_ctx *c, struct gp_error *err, bool backward)
{
    if (backward && (!c->din[0] || !c->dout[0])) return GP_OK;
    struct pad_plan p;
    GP_TRY(pad_plan(c, err, &p));
    const struct gp_shape *xs = gp_cpu_in_shape(c, 0), *ys = gp_cpu_out_shape(c, 0);
    int r = xs->rank;
    int64_t x_st[GP_MAX_RANK], n = gp_shape_numel(ys), outer = 1, slice = 1;
    gp_shape_strides(xs, x_st);
    for (int d = 0; d < p.lead; d++) outer *= ys->dims[d];
    for (int d = p.lead; d < r; d++) slice *= ys->dims[d];
    if (n == 0) return GP_OK;
    size_t es = gp_cpu_in_esize(c, 0);
    enum gp_dtype dt = gp_cpu_in_value(c, 0)->dtype;
    const void *fill = c->node->n_inputs > 2 ? c->in[2] : NULL; /* non-float constant_value */
#pragma omp parallel for if (n > GP_CPU_PAR_MIN) schedule(static)
    for (int64_t s = 0; s < outer; s++) {
        int64_t base = 0, rem = s, idx[GP_MAX_RANK] = {0};
        for (int d = p.lead - 1; d >= 0; d--) {
            base += rem % ys->dims[d] * x_st[d];
            rem /= ys->dims[d];
        }
        for (int64_t e = 0; e < slice; e++) {
            int64_t o = s * slice + e, src = base;
            for (int d = p.lead; d < r && src >= 0; d++)
                src = p.map[d][idx[d]] < 0 ? -1 : src + p.map[d][idx[d]] * x_st[d];
            if (backward) {
                if (src >= 0) c->din[0][src] += c->dout[0][o];
            } else if (src >= 0) {
                memcpy((char *)c->out[0] + o * (int64_t)es, (const char *)c->in[0] + src * (int64_t)es, es);
            } else if (gp_dtype_is_float(dt)) {
                ((real *)c->out[0])[o] = p.value;
            } else if (fill) {
                memcpy((char *)c->out[0] + o * (int64_t)es, fill, es);
            } else {
                memset((char *)c->out[0] + o * (int64_t)es, 0, es);
            }
            for (int d = r - 1; d >= p.lead && ++idx[d] == ys->dims[d]; d--) idx[d] = 0;
        }
    }
    return GP_OK;
}

static gp_status pad_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    return pad_run(c, err, false);
}

static gp_status pad_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    return pad_run(c, err, true);
}

/* ---- the table ---- */

const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_pad)[] = {
    {"Pad", NULL, pad_scratch, pad_forward, pad_backward},
    {0},
};
