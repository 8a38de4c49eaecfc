/* CPU kernels: Dropout, forward and backward, its mask drawn from the
 * counter-based generator of rng.h (the CUDA backend draws the same). */
#include "backend/cpu/kernel_util.h"
#include "backend/cpu/rng.h"

/* ---- Dropout ---- */

/* Dropout: X [N, ..] -> Y [N, ..] and an optional mask like X (X's float
 * type in opset 7, bool since 10). Active when the run trains and the node
 * is in training mode: Dropout-12+ reads that from its training_mode input
 * when given (exporters write a constant true), and otherwise follows the
 * run. The ratio is the run's override when set, else the node's (an
 * attribute before 12, the constant input 1 since).
 *
 * Element i is kept iff gp_rng_uniform(seed, step, node, g) >= ratio, where
 * g = sample_offset * (elements per sample) + i is its index in the whole
 * mini-batch, so every split into micro-batches, and every recomputation,
 * draws the same mask; backward draws it again instead of saving it. Kept
 * elements scale by 1 / (1 - ratio). */
struct dropout {
    bool active;
    float ratio; /* compared in float in both builds, so they keep the same elements */
    real scale;
    int64_t first; /* global index of element 0 */
    uint32_t node;
};

static struct dropout dropout_of(const struct gp_cpu_ctx *c)
{
    const struct gp_node *n = c->node;
    int version = n->def->since_version;
    double ratio = c->dropout_ratio >= 0 ? c->dropout_ratio
                   : version < 12 ? gp_node_attr_float(n, "ratio", 0.5f)
                   : n->n_inputs > 1 && c->in[1] ? (double)*(const real *)c->in[1] : 0.5;
    bool mode = version < 12 || n->n_inputs < 3 || !c->in[2] || *(const uint8_t *)c->in[2];
    const struct gp_shape *xs = gp_cpu_in_shape(c, 0);
    int64_t per_sample = xs->rank > 0 && xs->dims[0] ? gp_shape_numel(xs) / xs->dims[0]
                                                      : gp_shape_numel(xs);
    struct dropout d = {
        .active = c->training && mode && ratio > 0,
        .ratio = (float)ratio,
        .scale = (real)(1.0 / (1.0 - ratio)),
        .first = c->sample_offset * per_sample,
        .node = (uint32_t)n->source_index,
    };
    return d;
}

static inline bool dropout_keep(const struct gp_cpu_ctx *c, const struct dropout *d, int64_t i)
{
    return gp_rng_uniform(c->seed, c->step, d->node, (uint64_t)(d->first + i)) >= d->ratio;
}

static gp_status dropout_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    struct dropout d = dropout_of(c);
    int64_t n = gp_shape_numel(gp_cpu_in_shape(c, 0));
    const real *X = c->in[0];
    real *Y = c->out[0];
    void *mask = c->node->n_outputs > 1 ? c->out[1] : NULL;
    enum gp_dtype mt = mask ? gp_cpu_out_value(c, 1)->dtype : GP_DTYPE_BOOL;
#pragma omp parallel for if (n > GP_CPU_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        bool keep = !d.active || dropout_keep(c, &d, i);
        Y[i] = !d.active ? X[i] : keep ? X[i] * d.scale : 0;
        if (mask && mt == GP_DTYPE_BOOL) ((uint8_t *)mask)[i] = keep;
        else if (mask) ((real *)mask)[i] = keep;
    }
    return GP_OK;
}

static gp_status dropout_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    (void)err;
    const real *dY = c->dout[0];
    real *dX = c->din[0];
    if (!dY || !dX) return GP_OK;
    struct dropout d = dropout_of(c);
    int64_t n = gp_shape_numel(gp_cpu_in_shape(c, 0));
#pragma omp parallel for if (n > GP_CPU_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++)
        dX[i] += !d.active ? dY[i] : dropout_keep(c, &d, i) ? dY[i] * d.scale : 0;
    return GP_OK;
}

/* ---- the table ---- */

const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_dropout)[] = {
    {"Dropout", NULL, NULL, dropout_forward, dropout_backward},
    {0},
};
