/* CPU kernels: Attention (ops/attention.h), forward and backward; the
 * reference the CUDA kernels (cuda/attention.cu) are compared with.
 *
 * The same algorithm as the GPU's, without its tiles: no [Tq, Tk] matrix
 * is ever stored. Forward, per query row i (of one batch and head):
 *   s_ij = scale * q_i . k_j + mask_ij   over the keys j the row attends to
 *   m_i = max_j s_ij,  l_i = sum_j exp(s_ij - m_i)
 *   y_i = sum_j exp(s_ij - m_i) v_j / l_i,   lse_i = m_i + log l_i (saved)
 * Backward recomputes p_ij = exp(s_ij - lse_i) and, with dp_ij = dy_i . v_j
 * and D_i = sum_j p_ij dp_ij (scratch),
 *   dq_i = scale sum_j p_ij (dp_ij - D_i) k_j        (a pass over rows i)
 *   dk_j = scale sum_i p_ij (dp_ij - D_i) q_i,  dv_j = sum_i p_ij dy_i
 *                                                    (a pass over keys j)
 * Each pass writes only its own rows, so the threads split rows and the
 * results do not depend on their count. Dot products accumulate in double;
 * the weighted sums over keys in `real`, as the unfused chain's GEMMs do.
 *
 * Packed Q, K, V (ops/attention.h): all three read from input 0 at the
 * plan's offsets, their gradients accumulated into input 0's, each element
 * by the same sequence of additions as a separate gradient's (the row pass
 * writes Q's third, the key pass K's and V's), so a packed node gives the
 * bits of the Split it replaced. */
#include <math.h>
#include <string.h>

#include "backend/cpu/kernel_util.h"
#include "ops/attention.h"

/* The score of query i against key j (b, h fixed by the row pointers);
 * -INFINITY when the row does not attend to j. */
static inline double score(const struct gp_attention_plan *p, const real *q, const real *kb, const void *mask,
                           int64_t moff, int64_t i, int64_t j)
{
    if (p->causal && j > i) return -INFINITY;
    int64_t mo = moff + i * p->mask_stride[2] + j * p->mask_stride[3];
    if (p->mask == GP_ATTN_MASK_BOOL && !((const uint8_t *)mask)[mo]) return -INFINITY;
    const real *k = kb + j * p->k_stride[2];
    double s = 0;
    for (int64_t d = 0; d < p->head_size; d++) s += (double)q[d] * k[d];
    /* Rounded as the unfused chain rounds the scaled scores. */
    real r = (real)((real)s * (real)p->scale);
    if (p->mask == GP_ATTN_MASK_ADD) r += ((const real *)mask)[mo];
    return r;
}

static size_t rows_of(const struct gp_graph *g, const struct gp_node *node)
{
    struct gp_attention_plan p;
    gp_attention_plan(g, node, &p);
    return (size_t)(p.batch * p.heads * p.q_len);
}

/* ctx->saved: lse [B, H, Tq]. ctx->scratch: D [B, H, Tq] (backward). */
static size_t attn_saved(const struct gp_graph *g, const struct gp_node *node)
{
    return sizeof(real) * rows_of(g, node);
}

static size_t attn_scratch(const struct gp_graph *g, const struct gp_node *node)
{
    return sizeof(double) * rows_of(g, node);
}

/* Offsets of batch b, head h in Q, K, V, Y and the mask. */
struct heads_at {
    int64_t q, k, v, y, m;
};

static struct heads_at heads_at(const struct gp_attention_plan *p, int64_t b, int64_t h)
{
    return (struct heads_at){
        .q = p->q_offset + b * p->q_stride[0] + h * p->q_stride[1],
        .k = p->k_offset + b * p->k_stride[0] + h * p->k_stride[1],
        .v = p->v_offset + b * p->v_stride[0] + h * p->v_stride[1],
        .y = b * p->y_stride[0] + h * p->y_stride[1],
        .m = b * p->mask_stride[0] + h * p->mask_stride[1],
    };
}

static gp_status attn_forward(struct gp_cpu_ctx *ctx, struct gp_error *err)
{
    (void)err;
    struct gp_attention_plan p;
    gp_attention_plan(ctx->graph, ctx->node, &p);
    const real *Q = ctx->in[0], *K = ctx->in[gp_attention_qkv_input(&p, 1)];
    const real *V = ctx->in[gp_attention_qkv_input(&p, 2)];
    const void *M = ctx->node->n_inputs > 3 ? ctx->in[3] : NULL;
    real *Y = ctx->out[0], *lse = ctx->saved;
    int64_t rows = p.batch * p.heads * p.q_len, dv = p.v_head_size;
#pragma omp parallel for if (rows * p.kv_len * p.head_size > GP_CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        int64_t i = r % p.q_len, bh = r / p.q_len;
        struct heads_at at = heads_at(&p, bh / p.heads, bh % p.heads);
        const real *q = Q + at.q + i * p.q_stride[2];
        real *y = Y + at.y + i * p.y_stride[2];
        double m = -INFINITY;
        for (int64_t j = 0; j < p.kv_len; j++) {
            double s = score(&p, q, K + at.k, M, at.m, i, j);
            if (s > m) m = s;
        }
        for (int64_t d = 0; d < dv; d++) y[d] = 0;
        if (m == -INFINITY) { /* attends to nothing */
            lse[r] = -INFINITY;
            continue;
        }
        double l = 0;
        for (int64_t j = 0; j < p.kv_len; j++) {
            double s = score(&p, q, K + at.k, M, at.m, i, j);
            if (s == -INFINITY) continue;
            real e = (real)exp(s - m);
            l += e;
            const real *v = V + at.v + j * p.v_stride[2];
            for (int64_t d = 0; d < dv; d++) y[d] += e * v[d];
        }
        real inv = (real)(1.0 / l);
        for (int64_t d = 0; d < dv; d++) y[d] *= inv;
        lse[r] = (real)(m + log(l));
    }
    return GP_OK;
}

/* p_ij and dp_ij - D_i for row r (query i) and key j; false when the row
 * does not attend to j. */
static inline bool prob(const struct gp_attention_plan *p, const real *q, const real *kb, const void *mask,
                        int64_t moff, int64_t i, int64_t j, real lse, double *pij)
{
    double s = score(p, q, kb, mask, moff, i, j);
    if (s == -INFINITY || lse == -INFINITY) return false;
    *pij = exp(s - (double)lse);
    return true;
}

static double dot(const real *a, const real *b, int64_t n)
{
    double s = 0;
    for (int64_t d = 0; d < n; d++) s += (double)a[d] * b[d];
    return s;
}

static gp_status attn_backward(struct gp_cpu_ctx *ctx, struct gp_error *err)
{
    /* A constant mask's gradient goes nowhere (a layer run alone may still
     * ask for it); any other mask's is refused. */
    if (ctx->node->n_inputs > 3 && ctx->din[3] && gp_cpu_in_value(ctx, 3)->kind != GP_VALUE_CONSTANT)
        return gp_cpu_error(ctx, err, GP_ERR_UNSUPPORTED,
                            "the gradient of attn_mask is not supported (the mask must be a constant or "
                            "depend on no parameter)");
    struct gp_attention_plan p;
    gp_attention_plan(ctx->graph, ctx->node, &p);
    int ik = gp_attention_qkv_input(&p, 1), iv = gp_attention_qkv_input(&p, 2);
    const real *dY = ctx->dout[0];
    real *dQ = ctx->din[0], *dK = ctx->din[ik], *dV = ctx->din[iv];
    if (!dY || (!dQ && !dK && !dV)) return GP_OK;
    const real *Q = ctx->in[0], *K = ctx->in[ik], *V = ctx->in[iv];
    const void *M = ctx->node->n_inputs > 3 ? ctx->in[3] : NULL;
    const real *lse = ctx->saved;
    double *Dsum = ctx->scratch;
    int64_t rows = p.batch * p.heads * p.q_len, keys = p.batch * p.heads * p.kv_len;
    int64_t dh = p.head_size, dv = p.v_head_size;
    bool par = rows * p.kv_len * (dh + dv) > GP_CPU_PAR_MIN;
    real scale = (real)p.scale;

    /* Rows: D_i, then dq_i. */
#pragma omp parallel for if (par)
    for (int64_t r = 0; r < rows; r++) {
        int64_t i = r % p.q_len, bh = r / p.q_len;
        struct heads_at at = heads_at(&p, bh / p.heads, bh % p.heads);
        const real *q = Q + at.q + i * p.q_stride[2];
        const real *dy = dY + at.y + i * p.y_stride[2];
        double D = 0, pij;
        for (int64_t j = 0; j < p.kv_len; j++)
            if (prob(&p, q, K + at.k, M, at.m, i, j, lse[r], &pij))
                D += pij * dot(dy, V + at.v + j * p.v_stride[2], dv);
        Dsum[r] = D;
        if (!dQ) continue;
        real *dq = dQ + at.q + i * p.q_stride[2];
        for (int64_t j = 0; j < p.kv_len; j++) {
            if (!prob(&p, q, K + at.k, M, at.m, i, j, lse[r], &pij)) continue;
            const real *k = K + at.k + j * p.k_stride[2];
            real ds = (real)(pij * (dot(dy, V + at.v + j * p.v_stride[2], dv) - D)) * scale;
            for (int64_t d = 0; d < dh; d++) dq[d] += ds * k[d];
        }
    }
    if (!dK && !dV) return GP_OK;
    /* Keys: dk_j and dv_j. */
#pragma omp parallel for if (par)
    for (int64_t c = 0; c < keys; c++) {
        int64_t j = c % p.kv_len, bh = c / p.kv_len;
        struct heads_at at = heads_at(&p, bh / p.heads, bh % p.heads);
        const real *v = V + at.v + j * p.v_stride[2];
        real *dk = dK ? dK + at.k + j * p.k_stride[2] : NULL;
        real *dvv = dV ? dV + at.v + j * p.v_stride[2] : NULL;
        for (int64_t i = 0; i < p.q_len; i++) {
            int64_t r = bh * p.q_len + i;
            const real *q = Q + at.q + i * p.q_stride[2];
            const real *dy = dY + at.y + i * p.y_stride[2];
            double pij;
            if (!prob(&p, q, K + at.k, M, at.m, i, j, lse[r], &pij)) continue;
            if (dvv) {
                real pr = (real)pij;
                for (int64_t d = 0; d < dv; d++) dvv[d] += pr * dy[d];
            }
            if (dk) {
                real ds = (real)(pij * (dot(dy, v, dv) - Dsum[r])) * scale;
                for (int64_t d = 0; d < dh; d++) dk[d] += ds * q[d];
            }
        }
    }
    return GP_OK;
}

const struct gp_cpu_kernel GP_CPU(gp_cpu_kernels_attention)[] = {
    {"Attention", attn_saved, attn_scratch, attn_forward, attn_backward},
    {0},
};
