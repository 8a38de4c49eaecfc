/* Fusion of scaled dot-product attention, as exporters spell it, into one
 * Attention node (ONNX opset 23 semantics, ops/attention.h), run first by
 * gp_graph_fuse.
 *
 * Recognized, starting from a Softmax over the last axis:
 *
 *   S = MatMul(Q', Kt)                      Kt = Transpose(K', perm swapping
 *                                                the last two axes), or for
 *                                                [B, H, T, D] K' the dynamo
 *                                                exporter's Reshape(Transpose(
 *                                                Reshape(K', [B * H, T, D]),
 *                                                perm [0, 2, 1]), [B, H, D, T])
 *   S = S * c  |  S / c                     scale after the product, and/or
 *   Q' = Q * c | Q / c, K' = K * c | K / c  before it on Q, on K, or both
 *                                           (sqrt-scaled); no scale at all is
 *                                           scale 1
 *   S = S + M                               M a constant float mask, or
 *   S = Where(C, S, f) | Where(C, f, S)     C a constant bool mask, f a
 *                                           scalar constant <= -1e4 or -inf
 *                                           (masked_fill: C true = masked)
 *   P = Softmax(S, axis = -1)
 *   Y = MatMul(P, V)
 *
 * with c scalar constants (their product is the fused op's scale). Q, K, V
 * are [B, H, T, D] (nanoGPT, Hugging Face, torch 2's SDPA export) or
 * [N, T, D] (nn.MultiheadAttention's exports at opsets 13 to 17, with
 * N = batch * heads: the 3-D form with one head). Where each of Q, K and V
 * is the head split of a [B, T, H * D] tensor, Transpose(Reshape(x,
 * [B, T, H, D]), perm [0, 2, 1, 3]), and Y goes through the merge,
 * Reshape(Transpose(Y, perm [0, 2, 1, 3]), [B, T, H * D]), those eight
 * nodes go as well (and an Identity in the merge: the dynamo exporter's
 * clone) and the fused op takes the 3-D form with H heads: the kernels
 * read the heads in place, so the split and merge copies vanish. A
 * Transpose, Reshape or Identity whose result nothing reads (torch 2's
 * TorchScript export transposes K's heads for a Shape that folds) is no
 * reader of its input, and goes with the match that takes that input.
 *
 * Then the projection split: where a 3-D Attention's (fused or the file's)
 * Q, K and V are the three outputs, in that order, of one Split of one
 * tensor x [B, T, 3 * C] into equal thirds along its last axis (GPT-2's
 * and nanoGPT's c_attn(x).split(C, dim=2)), each read only by the
 * Attention and x only by the Split, the Split goes and the Attention
 * reads x itself (gp_node.packed_qkv, ops/attention.h): the kernels read
 * Q, K, V at offsets 0, C, 2 * C of each token's row, and write their
 * gradients into x's, so the three [B, T, C] copies forward and the
 * concatenation of their gradients backward vanish. Each element of x's
 * gradient gets what the Split's backward gave it, its third's gradient
 * added once to zero (x has no other reader, which would add its terms
 * in another order), so the results are the Split's bits on the CPU.
 * Anything else stays: another axis, unequal parts, a part read
 * elsewhere, the parts in another order, or x read elsewhere.
 * GP_FUSE_QKV_SPLIT=0 keeps the Split (for comparisons).
 *
 * A mask whose constant values are the causal pattern (keep key j for
 * query i when j <= i: nanoGPT's `bias` buffer sliced and compared, a
 * triangle of 0 and -inf) becomes is_causal = 1 with no mask tensor;
 * another constant mask is passed on (a masked_fill condition inverted into
 * a keep mask).
 *
 * Nothing fuses when the pattern only nearly matches: an intermediate value
 * with a second reader (or a graph output), a Softmax over another axis, a
 * scale that is not a scalar constant (a parameter, a per-position tensor),
 * a mask that is not constant, a fill value that does not mask (above
 * -1e4), shapes that broadcast in the products, or anything else between
 * the ops. In particular a Dropout between the Softmax and the second
 * MatMul (attention dropout, as the fixture GPT trains with) keeps the
 * chain unfused: the fused kernels have no dropout, and its masks must stay
 * the executor's (keyed by node and element, backend/cpu/rng.h).
 *
 * The results equal the chain's within float32 rounding, except for a
 * query row that attends to no key at all, where the chain gives NaN and
 * the fused op 0; and for a masked_fill with a finite fill value f, where a
 * masked score weighs exp(f - max) in the chain (0 in float32 unless the
 * scores reach |f|) and exactly 0 fused.
 *
 * GP_FUSE_ATTENTION=0 in the environment (the CLI's --no-fuse-attention)
 * turns this pass off: the unfused chain is the reference it is tested
 * against. */
#include "graph/build.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/fuse_util.h"
#include "ops/registry.h"
#include "util/env.h"

#define MASK_FILL_MAX -1e4 /* exp(-1e4) is 0 in float32 and below */

struct attn_match {
    int drop[24], n_drop; /* nodes that go */
    int last;             /* the node that becomes Attention */
    int q, k, v, mask;    /* mask: -1 for none */
    bool invert_mask;     /* mask is a masked_fill condition (true: masked) */
    bool causal;
    double scale;
    int64_t heads;        /* > 0: the 3-D form with this many heads */
    int qk;               /* the first MatMul: names the fused node */
    int k_tr;             /* >= 0: a Transpose of m->k by k_perm that stays */
    int64_t k_perm[4];
    int k_reader;         /* the node of the chain reading m->k */
    struct gp_shape k_shape; /* K's [..., T, D] */
};

struct ctx {
    struct gp_graph *g;
    const int *uses, *user;
    const bool *dropped;
};

/* The node making v when it is `op` with one output that only `consumer`
 * reads (and is no graph output); -1 otherwise. */
static int producer_for(const struct ctx *c, int v, const char *op, int consumer)
{
    if (v < 0) return -1;
    int p = c->g->values[v].producer;
    if (p < 0 || c->dropped[p] || !gp_fuse_is_op(&c->g->nodes[p], op) || c->g->nodes[p].n_outputs != 1) return -1;
    return gp_fuse_sole_consumer(c->g, c->uses, c->user, v) == consumer ? p : -1;
}

static void take(struct attn_match *m, int node) { m->drop[m->n_drop++] = node; }

/* A Mul by, or Div by, a scalar constant making v for `consumer`: folds
 * its factor into m->scale and returns the scaled operand; v otherwise. */
static int strip_scale(const struct ctx *c, struct attn_match *m, int v, int consumer)
{
    int p = producer_for(c, v, "Mul", consumer);
    if (p >= 0) {
        const struct gp_node *n = &c->g->nodes[p];
        for (int s = 0; s < 2 && n->n_inputs == 2; s++) {
            double k = gp_fuse_scalar(c->g, n->inputs[s]);
            if (isfinite(k) && k != 0 && n->inputs[1 - s] >= 0 &&
                gp_shape_equal(&c->g->values[n->inputs[1 - s]].shape, &c->g->values[v].shape)) {
                m->scale *= k;
                take(m, p);
                return n->inputs[1 - s];
            }
        }
        return v;
    }
    p = producer_for(c, v, "Div", consumer);
    if (p >= 0) {
        const struct gp_node *n = &c->g->nodes[p];
        double k = n->n_inputs == 2 ? gp_fuse_scalar(c->g, n->inputs[1]) : NAN;
        if (isfinite(k) && k != 0 && n->inputs[0] >= 0 &&
            gp_shape_equal(&c->g->values[n->inputs[0]].shape, &c->g->values[v].shape)) {
            m->scale /= k;
            take(m, p);
            return n->inputs[0];
        }
    }
    return v;
}

static bool ints_are(const int64_t *v, int64_t n, const int64_t *want, int64_t wn)
{
    if (n != wn) return false;
    for (int64_t i = 0; i < n; i++)
        if (v[i] != want[i]) return false;
    return true;
}

/* Transpose node p has this permutation. */
static bool perm_is(const struct gp_node *n, const int64_t *want, int rank)
{
    const int64_t *perm;
    int64_t np = gp_node_attr_ints(n, "perm", &perm);
    return np == rank && ints_are(perm, np, want, rank);
}

/* A constant mask that broadcasts into scores `s` without growing them:
 * every axis 1 or the scores' own, and in the [N, T, D] form (heads == 0,
 * rank 3) only the last two axes may be other than 1 (the fused op reads
 * the mask's axis -3 as heads). */
static bool mask_fits(const struct gp_value *mv, const struct gp_shape *s)
{
    const struct gp_shape *ms = &mv->shape;
    if (!mv->constant || mv->kind == GP_VALUE_PARAMETER || ms->rank > s->rank || ms->rank > 4) return false;
    for (int i = 0; i < ms->rank; i++) {
        int64_t md = ms->dims[ms->rank - 1 - i], sd = s->dims[s->rank - 1 - i];
        if (md != sd && md != 1) return false;
        if (s->rank == 3 && i >= 2 && md != 1) return false;
    }
    return true;
}

/* Whether mask value mv keeps exactly the keys j <= i of every query i of
 * [Tq, Tk] scores: a bool keep (or, inverted, masked) triangle, or a float
 * triangle of 0 and -inf or a value that masks as well (<= -1e4: the
 * dynamo exporter's SDPA adds -3.4e38). Its leading axes must be 1. */
static bool mask_is_causal(const struct gp_value *mv, bool inverted, int64_t tq, int64_t tk)
{
    const struct gp_shape *ms = &mv->shape;
    if (ms->rank < 2 || ms->dims[ms->rank - 2] != tq || ms->dims[ms->rank - 1] != tk) return false;
    for (int i = 0; i < ms->rank - 2; i++)
        if (ms->dims[i] != 1) return false;
    const struct gp_tensor *t = mv->constant;
    for (int64_t i = 0; i < tq; i++)
        for (int64_t j = 0; j < tk; j++) {
            int64_t at = i * tk + j;
            if (mv->dtype == GP_DTYPE_BOOL) {
                bool keep = (gp_tensor_get_i64(t, at) != 0) != inverted;
                if (keep != (j <= i)) return false;
            } else {
                double x = gp_tensor_get_f64(t, at);
                if (j <= i ? x != 0 : !(x <= MASK_FILL_MAX)) return false;
            }
        }
    return true;
}

/* x [B, T, H, D] as Reshape(x3 [B, T, H * D]) read only by `consumer`:
 * appends the Reshape to `nodes` and returns x3; -1 otherwise. */
static int split_reshape(const struct ctx *c, int x, int consumer, int *nodes, int *n)
{
    int r = producer_for(c, x, "Reshape", consumer);
    if (r < 0 || c->g->nodes[r].n_inputs < 1) return -1;
    int x3 = c->g->nodes[r].inputs[0];
    if (x3 < 0) return -1;
    const struct gp_shape *s3 = &c->g->values[x3].shape, *s = &c->g->values[x].shape;
    if (s3->rank != 3 || s->rank != 4 || s->dims[0] != s3->dims[0] || s->dims[1] != s3->dims[1] ||
        s->dims[2] * s->dims[3] != s3->dims[2])
        return -1;
    nodes[(*n)++] = r;
    return x3;
}

static const int64_t head_perm[4] = {0, 2, 1, 3};

/* The head split making x4 [B, H, T, D] for `consumer`:
 * Transpose(Reshape(x3 [B, T, H * D], [B, T, H, D]), perm [0, 2, 1, 3]).
 * Appends its two nodes to `nodes` and returns x3; -1 otherwise. */
static int head_split(const struct ctx *c, int x4, int consumer, int *nodes, int *n)
{
    int t = producer_for(c, x4, "Transpose", consumer);
    if (t < 0 || !perm_is(&c->g->nodes[t], head_perm, 4)) return -1;
    int x3 = split_reshape(c, c->g->nodes[t].inputs[0], t, nodes, n);
    if (x3 >= 0) nodes[(*n)++] = t;
    return x3;
}

/* The head merge of y4 [B, H, T, Dv]: Reshape(Transpose(y4, perm
 * [0, 2, 1, 3]), [B, T, H * Dv]), with or without an Identity between the
 * two: the Reshape node (its Transpose and Identity appended to `nodes`);
 * -1 otherwise. */
static int head_merge(const struct ctx *c, int y4, int *nodes, int *n)
{
    int t = gp_fuse_sole_consumer(c->g, c->uses, c->user, y4);
    if (t < 0 || c->dropped[t] || !gp_fuse_is_op(&c->g->nodes[t], "Transpose") || !perm_is(&c->g->nodes[t], head_perm, 4))
        return -1;
    int x = c->g->nodes[t].outputs[0];
    int r = gp_fuse_sole_consumer(c->g, c->uses, c->user, x);
    int id = -1;
    if (r >= 0 && !c->dropped[r] && gp_fuse_is_op(&c->g->nodes[r], "Identity") && c->g->nodes[r].n_outputs == 1) {
        /* The dynamo exporter's clone of the transposed heads. */
        id = r;
        x = c->g->nodes[id].outputs[0];
        r = gp_fuse_sole_consumer(c->g, c->uses, c->user, x);
    }
    if (r < 0 || c->dropped[r] || !gp_fuse_is_op(&c->g->nodes[r], "Reshape") || c->g->nodes[r].inputs[0] != x ||
        c->g->nodes[r].n_outputs != 1)
        return -1;
    const struct gp_shape *s4 = &c->g->values[y4].shape, *s3 = &c->g->values[c->g->nodes[r].outputs[0]].shape;
    if (s3->rank != 3 || s3->dims[0] != s4->dims[0] || s3->dims[1] != s4->dims[2] ||
        s3->dims[2] != s4->dims[1] * s4->dims[3])
        return -1;
    nodes[(*n)++] = t;
    if (id >= 0) nodes[(*n)++] = id;
    return r;
}

/* Kt [B, H, D, T] as the dynamo exporter spells K.transpose(-2, -1) for
 * K [B, H, T, D]: Reshape(Transpose(Reshape(K, [B * H, T, D]), perm
 * [0, 2, 1]), [B, H, D, T]), each read only by the next (the last by
 * `consumer`). Puts the three nodes in `nodes` (the one reading K last)
 * and returns K; -1 otherwise. */
static int transpose_by_3d(const struct ctx *c, int kt, int consumer, int nodes[3])
{
    static const int64_t swap3[3] = {0, 2, 1};
    int r1 = producer_for(c, kt, "Reshape", consumer);
    if (r1 < 0 || c->g->nodes[r1].n_inputs < 1) return -1;
    int t = producer_for(c, c->g->nodes[r1].inputs[0], "Transpose", r1);
    if (t < 0 || c->g->nodes[t].n_inputs != 1 || !perm_is(&c->g->nodes[t], swap3, 3)) return -1;
    int r0 = producer_for(c, c->g->nodes[t].inputs[0], "Reshape", t);
    if (r0 < 0 || c->g->nodes[r0].n_inputs < 1 || c->g->nodes[r0].inputs[0] < 0) return -1;
    int k = c->g->nodes[r0].inputs[0];
    const struct gp_shape *ks = &c->g->values[k].shape, *s3 = &c->g->values[c->g->nodes[r0].outputs[0]].shape;
    const struct gp_shape *ts = &c->g->values[kt].shape;
    if (ks->rank != 4 || s3->rank != 3 || ts->rank != 4) return -1;
    if (s3->dims[0] != ks->dims[0] * ks->dims[1] || s3->dims[1] != ks->dims[2] || s3->dims[2] != ks->dims[3] ||
        ts->dims[0] != ks->dims[0] || ts->dims[1] != ks->dims[1] || ts->dims[2] != ks->dims[3] ||
        ts->dims[3] != ks->dims[2])
        return -1;
    nodes[0] = r1, nodes[1] = t, nodes[2] = r0;
    return k;
}

static bool float32(const struct gp_graph *g, int v) { return v >= 0 && g->values[v].dtype == GP_DTYPE_FLOAT32; }

/* The pattern ending in Softmax node `sm`, into m. */
static bool match(const struct ctx *c, int sm, struct attn_match *m)
{
    struct gp_graph *g = c->g;
    const struct gp_node *smn = &g->nodes[sm];
    if (!gp_fuse_is_op(smn, "Softmax") || smn->n_inputs != 1 || smn->n_outputs != 1) return false;
    int s = smn->inputs[0], p = smn->outputs[0];
    if (!float32(g, s)) return false;
    const struct gp_shape *ss = &g->values[s].shape;
    int rank = ss->rank;
    if (rank != 3 && rank != 4) return false;
    int64_t axis = gp_node_attr_int(smn, "axis", smn->def->since_version < 13 ? 1 : -1);
    if (axis < 0) axis += rank;
    if (axis != rank - 1) return false;
    *m = (struct attn_match){.mask = -1, .scale = 1.0, .k_tr = -1};
    take(m, sm);

    /* Y = MatMul(P, V). */
    int pv = gp_fuse_sole_consumer(g, c->uses, c->user, p);
    if (pv < 0 || c->dropped[pv] || !gp_fuse_is_op(&g->nodes[pv], "MatMul") || g->nodes[pv].inputs[0] != p) return false;
    m->v = g->nodes[pv].inputs[1];
    int y = g->nodes[pv].outputs[0];

    /* The mask, then a scale after the product. */
    int node = sm;
    int a = producer_for(c, s, "Add", node);
    int w = a < 0 ? producer_for(c, s, "Where", node) : -1;
    if (a >= 0) {
        const struct gp_node *n = &g->nodes[a];
        for (int k = 0; k < 2 && m->mask < 0; k++) {
            int mv = n->inputs[k], sv = n->inputs[1 - k];
            if (mv >= 0 && sv >= 0 && float32(g, mv) && mask_fits(&g->values[mv], ss) &&
                gp_shape_equal(&g->values[sv].shape, ss))
                m->mask = mv, s = sv;
        }
        if (m->mask < 0) return false;
        take(m, a);
        node = a;
    } else if (w >= 0) {
        const struct gp_node *n = &g->nodes[w];
        int cond = n->inputs[0];
        if (n->n_inputs != 3 || cond < 0 || g->values[cond].dtype != GP_DTYPE_BOOL ||
            !mask_fits(&g->values[cond], ss))
            return false;
        for (int k = 1; k <= 2 && m->mask < 0; k++) {
            double f = gp_fuse_scalar(g, n->inputs[k]);
            int sv = n->inputs[3 - k];
            if (f <= MASK_FILL_MAX && sv >= 0 && gp_shape_equal(&g->values[sv].shape, ss))
                m->mask = cond, m->invert_mask = k == 1, s = sv;
        }
        if (m->mask < 0) return false;
        take(m, w);
        node = w;
    }
    int before = m->n_drop;
    int s2 = strip_scale(c, m, s, node);
    if (m->n_drop > before) node = m->drop[m->n_drop - 1];
    s = s2;

    /* S = MatMul(Q', Kt), Kt = Transpose(K'), scales on Q' and K'. */
    int qk = producer_for(c, s, "MatMul", node);
    if (qk < 0) return false;
    take(m, qk);
    m->qk = qk;
    m->q = strip_scale(c, m, g->nodes[qk].inputs[0], qk);
    int kt = g->nodes[qk].inputs[1];
    int kn = qk;
    before = m->n_drop;
    kt = strip_scale(c, m, kt, qk);
    if (m->n_drop > before) kn = m->drop[m->n_drop - 1];
    /* Kt = Transpose(K, perm): exporters merge the swap of the last two
     * axes with the head split's (nanoGPT's k.transpose(1, 2) then
     * k.transpose(-2, -1) export as one perm [0, 2, 3, 1]), so K is x
     * permuted by perm with its last two entries swapped: x itself, or that
     * Transpose kept with the new perm (k_perm). */
    int via3[3];
    int k4 = rank == 4 ? transpose_by_3d(c, kt, kn, via3) : -1;
    if (k4 >= 0) {
        for (int i = 0; i < 3; i++) take(m, via3[i]);
        for (int i = 0; i < rank; i++) m->k_perm[i] = i;
        before = m->n_drop;
        m->k = strip_scale(c, m, k4, via3[2]);
        m->k_reader = m->n_drop > before ? m->drop[m->n_drop - 1] : via3[2];
    } else {
        int tr = producer_for(c, kt, "Transpose", kn);
        if (tr < 0 || g->nodes[tr].n_inputs != 1) return false;
        const int64_t *perm;
        int64_t np = gp_node_attr_ints(&g->nodes[tr], "perm", &perm);
        bool identity = true;
        for (int i = 0; i < rank; i++) {
            m->k_perm[i] = np < 0 ? rank - 1 - i : (np == rank ? perm[i] : -1);
            if (m->k_perm[i] < 0) return false;
        }
        int64_t sw = m->k_perm[rank - 2];
        m->k_perm[rank - 2] = m->k_perm[rank - 1], m->k_perm[rank - 1] = sw;
        for (int i = 0; i < rank; i++) identity &= m->k_perm[i] == i;
        before = m->n_drop;
        m->k = strip_scale(c, m, g->nodes[tr].inputs[0], tr);
        m->k_reader = m->n_drop > before ? m->drop[m->n_drop - 1] : tr;
        if (identity) {
            take(m, tr);
        } else {
            m->k_tr = tr; /* kept: K is its output once its perm is k_perm */
        }
    }
    struct gp_shape kshape = g->values[m->k].shape;
    if (kshape.rank != rank) return false;
    for (int i = 0; i < rank; i++) kshape.dims[i] = g->values[m->k].shape.dims[m->k_perm[i]];
    m->k_shape = kshape;

    /* Shapes: no broadcasting in the products, one dtype. */
    if (!float32(g, m->q) || !float32(g, m->k) || !float32(g, m->v) || !float32(g, y)) return false;
    const struct gp_shape *qs = &g->values[m->q].shape, *ks = &m->k_shape, *vs = &g->values[m->v].shape;
    if (qs->rank != rank || ks->rank != rank || vs->rank != rank) return false;
    for (int i = 0; i < rank - 2; i++)
        if (qs->dims[i] != ss->dims[i] || ks->dims[i] != ss->dims[i] || vs->dims[i] != ss->dims[i]) return false;
    if (ks->dims[rank - 1] != qs->dims[rank - 1] || vs->dims[rank - 2] != ks->dims[rank - 2] ||
        ss->dims[rank - 2] != qs->dims[rank - 2] || ss->dims[rank - 1] != ks->dims[rank - 2])
        return false;
    if (!isfinite(m->scale) || m->scale == 0) return false;

    int64_t tq = qs->dims[rank - 2], tk = ks->dims[rank - 2];
    if (m->mask >= 0 && mask_is_causal(&g->values[m->mask], m->invert_mask, tq, tk)) {
        m->causal = true;
        m->mask = -1;
    }
    /* A masked_fill condition is inverted in place, so no other node may
     * read it, and it must be no initializer of the file (a folded
     * comparison, as nanoGPT's): those stay the file's own values. */
    if (m->mask >= 0 && m->invert_mask &&
        (gp_fuse_sole_consumer(g, c->uses, c->user, m->mask) < 0 || g->values[m->mask].is_initializer))
        return false;

    m->last = pv;
    if (rank == 3) {
        m->heads = 1; /* [N, T, D]: N = batch * heads */
        return true;
    }
    /* The head split of Q, K and V and the merge of Y, all or none. Q's
     * and K's consumers are the first MatMul, the Transpose, or the Mul or
     * Div scaling them. */
    int extra[8], ne = 0;
    int qcons = gp_fuse_sole_consumer(g, c->uses, c->user, m->q);
    int q3 = qcons >= 0 ? head_split(c, m->q, qcons, extra, &ne) : -1;
    int k3 = -1;
    if (q3 >= 0 && m->k_tr < 0) {
        int kcons = gp_fuse_sole_consumer(g, c->uses, c->user, m->k);
        k3 = kcons >= 0 ? head_split(c, m->k, kcons, extra, &ne) : -1;
    } else if (q3 >= 0 && ints_are(m->k_perm, 4, head_perm, 4)) {
        /* The kept Transpose is K's head split: it goes with its Reshape. */
        k3 = split_reshape(c, m->k, m->k_reader, extra, &ne);
        if (k3 >= 0) extra[ne++] = m->k_tr;
    }
    int v3 = k3 >= 0 ? head_split(c, m->v, pv, extra, &ne) : -1;
    int r = v3 >= 0 ? head_merge(c, y, extra, &ne) : -1;
    if (r >= 0) {
        for (int i = 0; i < ne; i++) take(m, extra[i]);
        take(m, pv);
        m->last = r;
        m->q = q3, m->k = k3, m->v = v3;
        m->k_tr = -1;
        m->heads = qs->dims[1];
    }
    return true;
}

/* "<folder of the first MatMul's name>/Attention", or "Attention_<i>". */
static const char *fused_name(struct gp_graph *g, const struct gp_node *first, int index)
{
    char buf[512];
    const char *slash = strrchr(first->name, '/');
    if (slash && slash - first->name < 400)
        snprintf(buf, sizeof buf, "%.*s/Attention", (int)(slash - first->name), first->name);
    else
        snprintf(buf, sizeof buf, "Attention_%d", index);
    return gp_arena_strdup(&g->arena, buf);
}

/* Node `last` becomes the Attention node of m. */
static gp_status rewrite(struct gp_graph *g, const struct attn_match *m, const struct gp_op_def *def, int index,
                         struct gp_error *err)
{
    int n_in = m->mask >= 0 ? 4 : 3;
    int *in = gp_arena_alloc(&g->arena, sizeof(int) * 4);
    struct gp_attr *attrs = gp_arena_alloc(&g->arena, sizeof *attrs * 4);
    if (!in || !attrs) return gp_error_set(err, GP_ERR_NOMEM, "out of memory fusing attention");
    in[0] = m->q, in[1] = m->k, in[2] = m->v, in[3] = m->mask;
    if (m->mask >= 0 && m->invert_mask) {
        struct gp_value *mv = &g->values[m->mask];
        struct gp_tensor *t = gp_graph_new_tensor(g, GP_DTYPE_BOOL, &mv->shape);
        if (!t) return gp_error_set(err, GP_ERR_NOMEM, "out of memory fusing attention");
        int64_t n = gp_shape_numel(&mv->shape);
        for (int64_t i = 0; i < n; i++) ((uint8_t *)t->data)[i] = gp_tensor_get_i64(mv->constant, i) == 0;
        mv->constant = t;
    }
    if (m->k_tr >= 0) {
        /* The Transpose making Kt now makes K: its perm is k_perm, its
         * input the unscaled K, its output K's shape (nothing else reads
         * that value: it was the first MatMul's, or its scale's, alone). */
        struct gp_node *t = &g->nodes[m->k_tr];
        int rank = m->k_shape.rank;
        struct gp_attr *pa = gp_arena_alloc(&g->arena, sizeof *pa);
        int64_t *perm = gp_arena_alloc(&g->arena, sizeof *perm * 4);
        if (!pa || !perm) return gp_error_set(err, GP_ERR_NOMEM, "out of memory fusing attention");
        memcpy(perm, m->k_perm, sizeof *perm * (size_t)rank);
        *pa = (struct gp_attr){.name = "perm", .type = GP_ATTR_INTS, .count = rank, .ints = perm};
        t->attrs = pa;
        t->n_attrs = 1;
        t->inputs[0] = m->k;
        g->values[t->outputs[0]].shape = m->k_shape;
        in[1] = t->outputs[0];
    }
    int na = 0;
    attrs[na++] = (struct gp_attr){.name = "scale", .type = GP_ATTR_FLOAT, .f = (float)m->scale};
    attrs[na++] = (struct gp_attr){.name = "is_causal", .type = GP_ATTR_INT, .i = m->causal};
    if (m->heads > 0) {
        attrs[na++] = (struct gp_attr){.name = "q_num_heads", .type = GP_ATTR_INT, .i = m->heads};
        attrs[na++] = (struct gp_attr){.name = "kv_num_heads", .type = GP_ATTR_INT, .i = m->heads};
    }
    struct gp_node *n = &g->nodes[m->last];
    n->name = fused_name(g, &g->nodes[m->qk], index);
    n->op_type = "Attention";
    n->domain = "";
    n->def = def;
    n->n_inputs = n_in;
    n->inputs = in;
    n->n_attrs = na;
    n->attrs = attrs;
    n->fused_relu = false;
    return GP_OK;
}

/* For 3-D Attention node a: the Split making its Q, K and V as the equal
 * thirds, in order, of one tensor along its last axis, each read by a
 * alone, that tensor read by the Split alone; -1 otherwise. The parts'
 * shapes (inferred) say where they lie, whichever way the Split spells
 * its sizes (attribute, input, num_outputs or none). */
static int qkv_split(const struct gp_graph *g, const int *uses, const int *user, const bool *drop, int a)
{
    const struct gp_node *n = &g->nodes[a];
    if (!gp_fuse_is_op(n, "Attention") || n->packed_qkv || n->n_inputs < 3 || n->n_inputs > 4) return -1;
    int q = n->inputs[0], k = n->inputs[1], v = n->inputs[2];
    if (q < 0 || k < 0 || v < 0 || g->values[q].shape.rank != 3 || gp_node_attr_int(n, "q_num_heads", 0) < 1)
        return -1;
    int s = g->values[q].producer;
    if (s < 0 || drop[s] || !gp_fuse_is_op(&g->nodes[s], "Split")) return -1;
    const struct gp_node *sp = &g->nodes[s];
    if (sp->n_outputs != 3 || sp->outputs[0] != q || sp->outputs[1] != k || sp->outputs[2] != v ||
        sp->n_inputs < 1 || sp->inputs[0] < 0)
        return -1;
    /* Sizes given as an input: a constant that simply loses its reader. */
    if (sp->n_inputs > 1 && sp->inputs[1] >= 0 && !g->values[sp->inputs[1]].constant) return -1;
    int x = sp->inputs[0];
    const struct gp_shape *xs = &g->values[x].shape;
    int64_t axis = gp_node_attr_int(sp, "axis", 0);
    if (axis < 0) axis += xs->rank;
    if (xs->rank != 3 || axis != 2 || xs->dims[2] % 3 || g->values[x].dtype != g->values[q].dtype) return -1;
    for (int i = 0; i < 3; i++) {
        int part = sp->outputs[i];
        const struct gp_shape *ps = &g->values[part].shape;
        if (gp_fuse_sole_consumer(g, uses, user, part) != a || ps->rank != 3 || ps->dims[0] != xs->dims[0] ||
            ps->dims[1] != xs->dims[1] || ps->dims[2] != xs->dims[2] / 3)
            return -1;
    }
    return gp_fuse_sole_consumer(g, uses, user, x) == s ? s : -1;
}

/* The projection split into the Attention nodes reading its parts (the
 * header says when). `fresh`: nodes this pass made Attention, already
 * counted in *fused; another (the file's own) counts now. */
static void absorb_qkv_splits(struct gp_graph *g, bool *drop, const bool *fresh, int *uses, int *user, int *fused)
{
    memset(uses, 0, sizeof(int) * ((size_t)g->n_values + 1));
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_inputs && !drop[i]; k++) {
            int v = g->nodes[i].inputs[k];
            if (v >= 0) uses[v]++, user[v] = i;
        }
    for (int i = 0; i < g->n_nodes; i++) {
        int s = drop[i] ? -1 : qkv_split(g, uses, user, drop, i);
        if (s < 0) continue;
        struct gp_node *n = &g->nodes[i];
        n->inputs[0] = g->nodes[s].inputs[0];
        n->inputs[1] = n->inputs[2] = -1;
        n->packed_qkv = true;
        drop[s] = true;
        for (int o = 0; o < 3; o++) g->values[g->nodes[s].outputs[o]].producer = -1;
        if (!fresh[i]) (*fused)++;
    }
}

gp_status gp_graph_fuse_attention(struct gp_graph *g, bool *drop, int *fused, struct gp_error *err)
{
    const struct gp_op_def *def = gp_op_lookup("", "Attention", 23, NULL);
    if (!def || !gp_env_flag("GP_FUSE_ATTENTION", true)) return GP_OK;
    int *uses = calloc((size_t)g->n_values + 1, sizeof(int));
    int *user = malloc(sizeof(int) * ((size_t)g->n_values + 1));
    bool *fresh = calloc((size_t)g->n_nodes + 1, sizeof(bool));
    if (!uses || !user || !fresh) {
        free(uses);
        free(user);
        free(fresh);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory fusing the graph");
    }
    /* Dead layout nodes: a Transpose, Reshape or Identity whose result
     * nothing reads any more (torch 2's exports transpose K's heads for a
     * Shape that folded away, beside the transpose the product reads). They
     * count as no reader of their input, and go with the match that takes
     * it. */
    bool *dead = calloc((size_t)g->n_nodes + 1, sizeof(bool));
    if (!dead) {
        free(uses);
        free(user);
        free(fresh);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory fusing the graph");
    }
    for (bool changed = true; changed;) {
        changed = false;
        memset(uses, 0, sizeof(int) * ((size_t)g->n_values + 1));
        for (int i = 0; i < g->n_nodes; i++)
            for (int k = 0; k < g->nodes[i].n_inputs && !dead[i] && !drop[i]; k++) {
                int v = g->nodes[i].inputs[k];
                if (v >= 0) uses[v]++, user[v] = i;
            }
        for (int i = 0; i < g->n_nodes; i++) {
            const struct gp_node *n = &g->nodes[i];
            if (dead[i] || drop[i] || n->n_outputs != 1 || n->outputs[0] < 0 || uses[n->outputs[0]] > 0 ||
                g->values[n->outputs[0]].is_output ||
                !(gp_fuse_is_op(n, "Transpose") || gp_fuse_is_op(n, "Reshape") || gp_fuse_is_op(n, "Identity")))
                continue;
            dead[i] = changed = true;
        }
    }
    struct ctx c = {.g = g, .uses = uses, .user = user, .dropped = drop};
    gp_status st = GP_OK;
    for (int i = 0; i < g->n_nodes && st == GP_OK; i++) {
        struct attn_match m;
        if (drop[i] || !match(&c, i, &m)) continue;
        bool taken = drop[m.last];
        for (int k = 0; k < m.n_drop; k++) taken |= drop[m.drop[k]];
        if (taken) continue;
        st = rewrite(g, &m, def, *fused, err);
        fresh[m.last] = true;
        for (int k = 0; k < m.n_drop; k++) {
            int d = m.drop[k];
            if (d == m.last) continue;
            drop[d] = true;
            for (int o = 0; o < g->nodes[d].n_outputs; o++)
                if (g->nodes[d].outputs[o] >= 0) g->values[g->nodes[d].outputs[o]].producer = -1;
        }
        /* Dead readers of what went, transitively (nodes are in order). */
        for (int d = 0; d < g->n_nodes; d++) {
            int v = dead[d] && !drop[d] && g->nodes[d].n_inputs > 0 ? g->nodes[d].inputs[0] : -1;
            bool gone = false;
            for (int k = 0; k < m.n_drop && v >= 0 && !gone; k++)
                for (int o = 0; o < g->nodes[m.drop[k]].n_outputs; o++)
                    gone |= m.drop[k] != m.last && g->nodes[m.drop[k]].outputs[o] == v;
            for (int e = 0; e < d && v >= 0 && !gone; e++) /* a dead reader dropped just before */
                gone |= dead[e] && drop[e] && g->nodes[e].outputs[0] == v;
            if (gone) {
                drop[d] = true;
                g->values[g->nodes[d].outputs[0]].producer = -1;
            }
        }
        (*fused)++;
    }
    if (st == GP_OK && gp_env_flag("GP_FUSE_QKV_SPLIT", true)) absorb_qkv_splits(g, drop, fresh, uses, user, fused);
    free(uses);
    free(user);
    free(dead);
    free(fresh);
    return st;
}
