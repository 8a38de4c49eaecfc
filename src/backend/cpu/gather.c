/* CPU kernels: Gather, forward and backward. Forward moves rows by their
 * size, so every dtype works; indices are int64 or int32, negative ones
 * counting from the end, each checked before any element moves. */
#include <string.h>

#include "backend/cpu/kernel_util.h"
#include "ops/fold_util.h"

/* ---- Gather ---- */

/* data [pre, dim, post] (axis in the middle), indices [q] (any shape,
 * int64 or int32, negative counting from the end) -> [pre, q, post]. */
struct gather_plan {
    int axis;
    int64_t pre, dim, post, q;
    enum gp_dtype idx_type;
};

static gp_status gather_plan(struct gp_cpu_ctx *c, struct gp_error *err, struct gather_plan *p)
{
    struct gp_infer_ctx ic = gp_cpu_infer_ctx(c, err);
    const struct gp_shape *xs = gp_cpu_in_shape(c, 0);
    GP_TRY(gp_norm_axis(&ic, gp_node_attr_int(c->node, "axis", 0), xs->rank, &p->axis));
    p->pre = p->post = 1;
    for (int d = 0; d < p->axis; d++) p->pre *= xs->dims[d];
    for (int d = p->axis + 1; d < xs->rank; d++) p->post *= xs->dims[d];
    p->dim = xs->dims[p->axis];
    p->q = gp_shape_numel(gp_cpu_in_shape(c, 1));
    p->idx_type = gp_cpu_in_value(c, 1)->dtype;
    /* Indices come from data at run time: every one is checked before any
     * element moves. */
    for (int64_t j = 0; j < p->q; j++) {
        int64_t k = gp_cpu_load_i64(c->in[1], p->idx_type, j);
        if (k < -p->dim || k >= p->dim)
            return gp_cpu_error(c, err, GP_ERR_INVALID,
                                "index %lld (element %lld of indices '%s') is out of range for "
                                "axis %d of size %lld",
                                (long long)k, (long long)j, gp_cpu_in_value(c, 1)->name, p->axis,
                                (long long)p->dim);
    }
    return GP_OK;
}

static inline int64_t gather_index(const struct gp_cpu_ctx *c, const struct gather_plan *p,
                                   int64_t j)
{
    int64_t k = gp_cpu_load_i64(c->in[1], p->idx_type, j);
    return k < 0 ? k + p->dim : k;
}

static gp_status gather_forward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    struct gather_plan p;
    GP_TRY(gather_plan(c, err, &p));
    size_t row = (size_t)p.post * gp_cpu_in_esize(c, 0);
    const char *x = c->in[0];
    char *y = c->out[0];
    int64_t tasks = p.pre * p.q;
#pragma omp parallel for if (tasks * p.post > GP_CPU_PAR_MIN) schedule(static)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t r = t / p.q, j = t % p.q;
        memcpy(y + (size_t)t * row, x + (size_t)(r * p.dim + gather_index(c, &p, j)) * row, row);
    }
    return GP_OK;
}

/* dData[r, idx[j], :] += dY[r, j, :]: repeated indices (an embedding's
 * common tokens) add up. Threads split (r, block of columns); each adds the
 * indices in order, so sums do not depend on the thread count. */
static gp_status gather_backward(struct gp_cpu_ctx *c, struct gp_error *err)
{
    real *dx = c->din[0];
    const real *dy = c->dout[0];
    if (!dx || !dy) return GP_OK;
    struct gather_plan p;
    GP_TRY(gather_plan(c, err, &p));
    enum { COLS = 256 };
    int64_t nblk = (p.post + COLS - 1) / COLS, tasks = p.pre * nblk;
#pragma omp parallel for if (p.pre * p.q * p.post > GP_CPU_PAR_MIN) schedule(static)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t r = t / nblk, c0 = t % nblk * COLS, c1 = c0 + COLS < p.post ? c0 + COLS : p.post;
        for (int64_t j = 0; j < p.q; j++) {
            real *d = dx + (r * p.dim + gather_index(c, &p, j)) * p.post;
            const real *s = dy + (r * p.q + j) * p.post;
            for (int64_t col = c0; col < c1; col++) d[col] += s[col];
        }
    }
    return GP_OK;
}

/* ---- the table ---- */

const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_gather)[] = {
    {"Gather", NULL, NULL, gather_forward, gather_backward},
    {0},
};
