/* Attention (ONNX opset 23): validation, shape inference and the kernels'
 * plan (ops/attention.h). The subset taken: Q, K, V and an optional
 * attn_mask, is_causal, scale, q_num_heads / kv_num_heads. The key-value
 * cache (past_key, past_value, present_*), softcap, the qk_matmul_output
 * modes and grouped-query attention (kv_num_heads != q_num_heads) are
 * refused with a message naming the node. softmax_precision is accepted and
 * has no effect: the softmax is computed in float32 or better anyway.
 * A packed node (gp_node.packed_qkv, made by the fusion only) is checked as
 * the 3-D form with Q, K and V the thirds of its input 0. */
#include "ops/attention.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ops/families.h"
#include "ops/fold_util.h"

#define SHAPE_BUF 160

static const char *fmt(const struct gp_shape *s, char *buf) { return gp_shape_format(s, buf, SHAPE_BUF); }

/* Heads of a 3-D input: the attribute, which must divide the hidden size. */
static gp_status heads_3d(struct gp_infer_ctx *ctx, const char *attr, const struct gp_value *v, int64_t *heads,
                          int64_t *size)
{
    int64_t h = gp_node_attr_int(ctx->node, attr, 0);
    if (h < 1)
        return gp_op_error(ctx, GP_ERR_INVALID, "3-D inputs need %s (at least 1; got %lld)", attr, (long long)h);
    if (v->shape.dims[2] % h)
        return gp_op_error(ctx, GP_ERR_SHAPE, "input '%s' has hidden size %lld, which %s %lld does not divide",
                           v->name, (long long)v->shape.dims[2], attr, (long long)h);
    *heads = h;
    *size = v->shape.dims[2] / h;
    return GP_OK;
}

static gp_status attention_infer(struct gp_infer_ctx *ctx)
{
    struct gp_value *q, *k, *v, third;
    GP_TRY(gp_req_in(ctx, 0, &q));
    if (ctx->node->packed_qkv) {
        /* Q, K and V are views of input 0's thirds: checked as three
         * [B, T, C] inputs. */
        if (q->shape.rank != 3 || q->shape.dims[2] % 3)
            return gp_op_error(ctx, GP_ERR_SHAPE, "packed Q, K, V '%s' must be [B, T, 3 * C]", q->name);
        third = *q;
        third.shape.dims[2] /= 3;
        q = k = v = &third;
    } else {
        GP_TRY(gp_req_in(ctx, 1, &k));
        GP_TRY(gp_req_in(ctx, 2, &v));
    }
    GP_TRY(gp_want_float(ctx, 0));
    if (!ctx->node->packed_qkv) GP_TRY(gp_same_dtype(ctx, 0, 2));
    if (gp_in(ctx, 4) || gp_in(ctx, 5))
        return gp_op_error(ctx, GP_ERR_UNSUPPORTED, "past_key / past_value (a key-value cache) are not supported");
    for (int i = 1; i < ctx->node->n_outputs; i++)
        if (gp_out(ctx, i))
            return gp_op_error(ctx, GP_ERR_UNSUPPORTED, "output %d (%s) is not supported", i,
                               i == 3 ? "qk_matmul_output" : "present key / value");
    if (gp_node_attr_float(ctx->node, "softcap", 0.0f) != 0.0f)
        return gp_op_error(ctx, GP_ERR_UNSUPPORTED, "softcap is not supported");
    if (gp_node_attr_int(ctx->node, "qk_matmul_output_mode", 0) != 0)
        return gp_op_error(ctx, GP_ERR_UNSUPPORTED, "qk_matmul_output_mode %lld is not supported (only 0)",
                           (long long)gp_node_attr_int(ctx->node, "qk_matmul_output_mode", 0));
    int64_t causal = gp_node_attr_int(ctx->node, "is_causal", 0);
    if (causal != 0 && causal != 1)
        return gp_op_error(ctx, GP_ERR_INVALID, "is_causal must be 0 or 1, not %lld", (long long)causal);
    float scale = gp_node_attr_float(ctx->node, "scale", 1.0f);
    if (!isfinite(scale))
        return gp_op_error(ctx, GP_ERR_INVALID, "scale must be finite");
    int r = q->shape.rank;
    char s1[SHAPE_BUF], s2[SHAPE_BUF], s3[SHAPE_BUF];
    if ((r != 3 && r != 4) || k->shape.rank != r || v->shape.rank != r)
        return gp_op_error(ctx, GP_ERR_SHAPE,
                           "Q %s, K %s and V %s must all be 4-D [B, H, T, D] or all 3-D [B, T, H * D]",
                           fmt(&q->shape, s1), fmt(&k->shape, s2), fmt(&v->shape, s3));
    int64_t b = q->shape.dims[0], hq, hk, hv, tq, tk, d, dk, dv;
    if (r == 4) {
        hq = q->shape.dims[1], tq = q->shape.dims[2], d = q->shape.dims[3];
        hk = k->shape.dims[1], tk = k->shape.dims[2], dk = k->shape.dims[3];
        hv = v->shape.dims[1], dv = v->shape.dims[3];
        int64_t aq = gp_node_attr_int(ctx->node, "q_num_heads", hq), ak = gp_node_attr_int(ctx->node, "kv_num_heads", hk);
        if (aq != hq || ak != hk)
            return gp_op_error(ctx, GP_ERR_SHAPE, "q_num_heads %lld / kv_num_heads %lld disagree with Q %s and K %s",
                               (long long)aq, (long long)ak, fmt(&q->shape, s1), fmt(&k->shape, s2));
        if (v->shape.dims[2] != tk)
            return gp_op_error(ctx, GP_ERR_SHAPE, "K %s and V %s differ in sequence length", fmt(&k->shape, s1),
                               fmt(&v->shape, s2));
    } else {
        tq = q->shape.dims[1], tk = k->shape.dims[1];
        GP_TRY(heads_3d(ctx, "q_num_heads", q, &hq, &d));
        GP_TRY(heads_3d(ctx, "kv_num_heads", k, &hk, &dk));
        GP_TRY(heads_3d(ctx, "kv_num_heads", v, &hv, &dv));
        if (v->shape.dims[1] != tk)
            return gp_op_error(ctx, GP_ERR_SHAPE, "K %s and V %s differ in sequence length", fmt(&k->shape, s1),
                               fmt(&v->shape, s2));
    }
    if (hk != hq || hv != hq)
        return gp_op_error(ctx, GP_ERR_UNSUPPORTED,
                           "kv_num_heads %lld differs from q_num_heads %lld (grouped-query attention is not "
                           "supported)", (long long)hk, (long long)hq);
    if (k->shape.dims[0] != b || v->shape.dims[0] != b)
        return gp_op_error(ctx, GP_ERR_SHAPE, "Q %s, K %s and V %s differ in batch size", fmt(&q->shape, s1),
                           fmt(&k->shape, s2), fmt(&v->shape, s3));
    if (dk != d)
        return gp_op_error(ctx, GP_ERR_SHAPE, "Q %s and K %s differ in head size (%lld, %lld)", fmt(&q->shape, s1),
                           fmt(&k->shape, s2), (long long)d, (long long)dk);
    if (d < 1 || dv < 1)
        return gp_op_error(ctx, GP_ERR_SHAPE, "the head size must be at least 1");
    struct gp_value *m = gp_in(ctx, 3);
    if (m) {
        if (m->dtype != GP_DTYPE_BOOL && m->dtype != q->dtype)
            return gp_op_error(ctx, GP_ERR_INVALID, "attn_mask '%s' is %s; expected bool or Q's %s", m->name,
                               gp_dtype_name(m->dtype), gp_dtype_name(q->dtype));
        struct gp_shape full = {.rank = 4, .dims = {b, hq, tq, tk}};
        bool ok = m->shape.rank <= 4;
        for (int i = 0; ok && i < m->shape.rank; i++) {
            int64_t md = m->shape.dims[m->shape.rank - 1 - i], fd = full.dims[3 - i];
            ok = md == fd || md == 1;
        }
        if (!ok)
            return gp_op_error(ctx, GP_ERR_SHAPE, "attn_mask '%s' %s does not broadcast to %s", m->name,
                               fmt(&m->shape, s1), fmt(&full, s2));
    }
    struct gp_shape y = r == 4 ? (struct gp_shape){.rank = 4, .dims = {b, hq, tq, dv}}
                               : (struct gp_shape){.rank = 3, .dims = {b, tq, hq * dv}};
    GP_TRY(gp_check_shape(ctx, &y));
    gp_set_out(ctx, 0, q->dtype, &y);
    return GP_OK;
}

/* Strides of a [B, H, T, D] view of a 4-D or 3-D input of `heads` heads. */
static void view_strides(const struct gp_shape *s, int64_t heads, int64_t *st)
{
    if (s->rank == 4) {
        st[2] = s->dims[3];
        st[1] = s->dims[2] * st[2];
        st[0] = s->dims[1] * st[1];
    } else {
        st[1] = s->dims[2] / heads; /* D */
        st[2] = s->dims[2];
        st[0] = s->dims[1] * st[2];
    }
}

void gp_attention_plan(const struct gp_graph *g, const struct gp_node *n, struct gp_attention_plan *p)
{
    const struct gp_shape *q = &gp_node_input(g, n, 0)->shape, *y = &gp_node_output(g, n, 0)->shape, *k, *v;
    struct gp_shape third;
    if (n->packed_qkv) {
        third = *q;
        third.dims[2] /= 3;
        q = k = v = &third;
    } else {
        k = &gp_node_input(g, n, 1)->shape;
        v = &gp_node_input(g, n, 2)->shape;
    }
    memset(p, 0, sizeof *p);
    p->three_d = q->rank == 3;
    p->batch = q->dims[0];
    if (p->three_d) {
        p->heads = gp_node_attr_int(n, "q_num_heads", 1);
        p->q_len = q->dims[1];
        p->kv_len = k->dims[1];
        p->head_size = q->dims[2] / p->heads;
        p->v_head_size = v->dims[2] / p->heads;
    } else {
        p->heads = q->dims[1];
        p->q_len = q->dims[2];
        p->kv_len = k->dims[2];
        p->head_size = q->dims[3];
        p->v_head_size = v->dims[3];
    }
    view_strides(q, p->heads, p->q_stride);
    view_strides(k, p->heads, p->k_stride);
    view_strides(v, p->heads, p->v_stride);
    view_strides(y, p->heads, p->y_stride);
    if (n->packed_qkv) {
        /* Each token's row holds Q, K, V one after the other: 3 * C apart. */
        int64_t c = third.dims[2];
        p->packed = true;
        p->k_offset = c;
        p->v_offset = 2 * c;
        int64_t *st[3] = {p->q_stride, p->k_stride, p->v_stride};
        for (int i = 0; i < 3; i++) {
            st[i][2] = 3 * c;
            st[i][0] = third.dims[1] * 3 * c;
        }
    }
    p->causal = gp_node_attr_int(n, "is_causal", 0) != 0;
    p->scale = gp_node_attr_float(n, "scale", (float)(1.0 / sqrt((double)p->head_size)));
    const struct gp_value *m = gp_node_input(g, n, 3);
    if (m) {
        p->mask = m->dtype == GP_DTYPE_BOOL ? GP_ATTN_MASK_BOOL : GP_ATTN_MASK_ADD;
        int64_t acc = 1;
        for (int i = 0; i < m->shape.rank; i++) {
            int64_t d = m->shape.dims[m->shape.rank - 1 - i];
            p->mask_stride[3 - i] = d == 1 ? 0 : acc;
            acc *= d;
        }
    }
}

/* attn_mask is differentiable in ONNX: its gradient is the scores' (a
 * learned bias would need it); the kernels refuse to compute it, so that a
 * model whose mask depends on parameters fails with a message rather than
 * silently training without that gradient. */
const struct gp_op_def gp_ops_attention[] = {
    {"", "Attention", 23, 3, 6, 1, 4,
     "is_causal:i,kv_num_heads:i,q_num_heads:i,qk_matmul_output_mode:i,scale:f,softcap:f,softmax_precision:i",
     (1u << 4) | (1u << 5), attention_infer, GP_FOLD_NEVER, NULL},
    {0},
};
