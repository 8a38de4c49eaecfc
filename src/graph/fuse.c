/* Fusion of op chains that exporters spell out into the one op that does
 * the same, after folding (graph/build.h, gp_graph_finalize's last step).
 *
 * Today GELU, which exporters below opset 20 spell out:
 *   exact (PyTorch's F.gelu / nn.GELU):
 *     y = Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5)          -> Gelu(x)
 *   tanh form (F.gelu(approximate='tanh'), Hugging Face's gelu_new):
 *     t = Tanh(Mul(sqrt(2/pi), Add(x, Mul(0.044715, x^3))))
 *     y = Mul(Mul(x, 0.5), Add(t, 1)) or Mul(Mul(x, Add(t, 1)), 0.5)
 *     with x^3 as Pow(x, 3), Mul(x, Mul(x, x)) or Mul(Mul(x, x), x)
 *                                                  -> Gelu(x, approximate="tanh")
 * (any operand order of the commutative ops).
 * Five layers forward and five backward, each a pass over the [batch,
 * tokens, 4 * width] activation and four of them keeping that activation
 * for backward, become one layer that keeps only x. Gelu computes PyTorch's
 * own formula, 0.5 x (1 + erf(x / sqrt 2)), and its exact derivative, so
 * the result is closer to PyTorch's training than the chain's rounding.
 *
 * A chain fuses only when each of its intermediate values has one consumer
 * (the next op of the chain) and is not a graph output, x is float32, and
 * the constants are the scalars above (constants, not parameters).
 *
 * And, not a fusion, a Dropout's mask that nothing reads is dropped (the
 * output omitted), so no kernel writes it.
 *
 * And Relu into the BatchNormalization before it (every convolution block
 * of a ResNet), or into the residual Add before it (an Add without
 * broadcasting): y = Relu(BatchNormalization(x, ...)) or Relu(Add(a, b))
 * becomes the one node, flagged fused_relu, when its output has the Relu
 * as its only consumer and is not a graph output. Its kernels write
 * max(y, 0) and mask dY by the output's sign (output > 0 exactly where
 * Relu's input was > 0, NaN included), so the results are the unfused
 * pair's bits, at two passes over the activation fewer forward and two
 * backward, and without the tensor before the Relu kept for its backward.
 *
 * And a residual Add into the BatchNormalization making one of its
 * operands (every block of a ResNet: y = Relu(BN(x) + r)): the
 * BatchNormalization, flagged fused_add, takes the Add's other operand r
 * as input 5, writes the Add's output (Relu'd when the Add had the Relu
 * fused), and sits in the Add's place in the order (r may be made after
 * the BatchNorm: a downsampling branch exported after the main one). Its
 * kernels add r to the normalized value, rounded first to the output's
 * storage type as the unfused BatchNorm stored it, so the results are the
 * unfused nodes' bits; r's gradient is the masked dY, as the Add wrote it.
 * Forward that is the BatchNorm output's write and read fewer; backward
 * the BatchNorm's own copy of dY. Only when the BatchNorm's output has the
 * Add as its only reader, its other outputs (running statistics) none,
 * and neither is a graph output; of two such operands, the one made last.
 * (GP_FUSE_BN_ADD=0: not, for comparisons.)
 *
 * And the Transpose of a weight into the MatMul reading it: nn.Linear (and
 * GPT-2's Conv1D) export y = MatMul(x, Transpose(W)) with W [N, K] a
 * parameter; the MatMul, flagged trans_b, reads W in place as B^T (BLAS's
 * transpose flag) and writes W's gradient directly. The Transpose layer,
 * its [K, N] copy of the weight (once per step), and the transpose of its
 * gradient back go. Only for a 2-D parameter read by nothing else, whose
 * Transpose (perm [1, 0]) only that MatMul reads, as its B (a tied weight
 * keeps its Transpose, below): the products are the same sums in the
 * same order, so the results are the unfused pair's up to BLAS's own
 * choice of kernel for the other operand layout.
 *
 * And the bias Add after a MatMul into it: every Linear layer exports as
 * y = Add(MatMul(x, W), b) (either operand order) with b a [N] parameter
 * (or [1, ..., N]); the MatMul, flagged fused_bias, takes b as a third
 * input and adds it to each row of its product before storing it. Forward,
 * that is the one pass over the [rows, N] product fewer (read and written
 * again) and, where the product is stored as bfloat16, one rounding instead
 * of two (cuBLASLt's bias epilogue adds b to the float32 accumulator; in
 * bf16, b is read through its bfloat16 copy as the weight is, rounded to
 * bfloat16 as PyTorch's autocast rounds a Linear's bias);
 * backward, b's gradient is the column sums of dY, as the Add's was, and
 * the MatMul reads dY itself instead of the Add's copy of it. Only when the
 * product has the Add as its only reader and is not a graph output, b is a
 * float32 parameter or constant of the product's dtype whose every axis
 * but the last (the product's last, N, of a B with two or more axes) is 1,
 * of rank at most the product's, and b is read by nothing else (a shared
 * bias keeps its Add, as a tied weight keeps its Transpose). In float32
 * the result is the unfused pair's bits: the same float32 add of b to the
 * same product, and the same sums for b's gradient; in bf16 it differs from
 * the unfused pair's (b rounded to bfloat16, the product not), by about a
 * bfloat16 rounding.
 * (GP_FUSE_MATMUL_BIAS=0: not, for comparisons.)
 *
 * Scaled dot-product attention fuses first, into one Attention node
 * (graph/fuse_attention.c).
 *
 * The saved model is unaffected: it is written from the original file
 * (onnx/save.c), not from this IR. */
#include "graph/build.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/fuse_util.h"
#include "ops/registry.h"
#include "util/env.h"

static bool near(double a, double b) { return fabs(a - b) <= 1e-6 * fabs(b); }

/* A matched chain: its nodes (the last one, which makes y, becomes the
 * Gelu), its input x, and which form. */
struct chain {
    int nodes[12], n;
    int x;
    bool tanh;
};

/* The exact form, starting at the Div node d. */
static bool match_gelu(const struct gp_graph *g, const int *uses, const int *user, int d, struct chain *c)
{
    const struct gp_node *div = &g->nodes[d];
    if (!gp_fuse_is_op(div, "Div") || div->n_inputs != 2 || div->n_outputs != 1) return false;
    int x = div->inputs[0];
    if (x < 0 || g->values[x].dtype != GP_DTYPE_FLOAT32 || !near(gp_fuse_scalar(g, div->inputs[1]), M_SQRT2))
        return false;
    int e = gp_fuse_sole_consumer(g, uses, user, div->outputs[0]);
    if (e < 0 || !gp_fuse_is_op(&g->nodes[e], "Erf") || g->nodes[e].n_outputs != 1) return false;
    int a = gp_fuse_sole_consumer(g, uses, user, g->nodes[e].outputs[0]);
    if (a < 0 || !gp_fuse_is_op(&g->nodes[a], "Add") ||
        !near(gp_fuse_scalar(g, gp_fuse_other_operand(&g->nodes[a], g->nodes[e].outputs[0])), 1.0))
        return false;
    int m = gp_fuse_sole_consumer(g, uses, user, g->nodes[a].outputs[0]);
    if (m < 0 || !gp_fuse_is_op(&g->nodes[m], "Mul") || gp_fuse_other_operand(&g->nodes[m], g->nodes[a].outputs[0]) != x)
        return false;
    int h = gp_fuse_sole_consumer(g, uses, user, g->nodes[m].outputs[0]);
    if (h < 0 || !gp_fuse_is_op(&g->nodes[h], "Mul") ||
        !near(gp_fuse_scalar(g, gp_fuse_other_operand(&g->nodes[h], g->nodes[m].outputs[0])), 0.5))
        return false;
    const struct gp_value *xv = &g->values[x], *yv = &g->values[g->nodes[h].outputs[0]];
    if (!gp_shape_equal(&xv->shape, &yv->shape) || yv->dtype != GP_DTYPE_FLOAT32) return false;
    *c = (struct chain){.nodes = {d, e, a, m, h}, .n = 5, .x = x};
    return true;
}

/* The node making value v when it is op `op` with one output, whose output
 * only `consumer` reads (and no graph output); -1 otherwise. */
static int producer_for(const struct gp_graph *g, const int *uses, const int *user, int v, const char *op,
                        int consumer)
{
    if (v < 0) return -1;
    int p = g->values[v].producer;
    if (p < 0 || !gp_fuse_is_op(&g->nodes[p], op) || g->nodes[p].n_outputs != 1) return -1;
    return gp_fuse_sole_consumer(g, uses, user, v) == consumer ? p : -1;
}

/* Binary node p as (constant ~= k) op other: the other operand, or -1. */
static int with_const(const struct gp_graph *g, int p, double k)
{
    const struct gp_node *n = &g->nodes[p];
    if (n->n_inputs != 2) return -1;
    for (int s = 0; s < 2; s++)
        if (near(gp_fuse_scalar(g, n->inputs[s]), k)) return n->inputs[1 - s];
    return -1;
}

/* x^3 made for `consumer` as Pow(x, 3), Mul(x, Mul(x, x)) or Mul(Mul(x, x), x):
 * x, with the nodes appended to c; -1 otherwise. */
static int match_cube(const struct gp_graph *g, const int *uses, const int *user, int v, int consumer,
                      struct chain *c)
{
    int p = producer_for(g, uses, user, v, "Pow", consumer);
    if (p >= 0) {
        const struct gp_node *n = &g->nodes[p];
        if (n->n_inputs != 2 || !near(gp_fuse_scalar(g, n->inputs[1]), 3.0)) return -1;
        c->nodes[c->n++] = p;
        return n->inputs[0];
    }
    p = producer_for(g, uses, user, v, "Mul", consumer);
    if (p < 0) return -1;
    const struct gp_node *n = &g->nodes[p];
    for (int s = 0; s < 2; s++) {
        int sq = producer_for(g, uses, user, n->inputs[s], "Mul", p);
        int x = n->inputs[1 - s];
        if (sq >= 0 && g->nodes[sq].inputs[0] == x && g->nodes[sq].inputs[1] == x) {
            c->nodes[c->n++] = sq;
            c->nodes[c->n++] = p;
            return x;
        }
    }
    return -1;
}

/* The tanh form, starting at the Tanh node t. */
static bool match_gelu_tanh(const struct gp_graph *g, const int *uses, const int *user, int t, struct chain *c)
{
    const struct gp_node *tn = &g->nodes[t];
    if (!gp_fuse_is_op(tn, "Tanh") || tn->n_inputs != 1 || tn->n_outputs != 1) return false;
    *c = (struct chain){.n = 0, .tanh = true};
    int sp = producer_for(g, uses, user, tn->inputs[0], "Mul", t);
    int r = sp >= 0 ? with_const(g, sp, 0.7978845608028654) : -1;
    int rp = producer_for(g, uses, user, r, "Add", sp);
    if (rp < 0 || g->nodes[rp].n_inputs != 2) return false;
    int x = -1;
    for (int s = 0; s < 2 && x < 0; s++) {
        int qp = producer_for(g, uses, user, g->nodes[rp].inputs[s], "Mul", rp);
        int cube = qp >= 0 ? with_const(g, qp, 0.044715) : -1;
        if (cube < 0) continue;
        int n0 = c->n;
        int cx = match_cube(g, uses, user, cube, qp, c);
        if (cx >= 0 && cx == g->nodes[rp].inputs[1 - s]) {
            c->nodes[c->n++] = qp;
            x = cx;
        } else {
            c->n = n0;
        }
    }
    if (x < 0 || g->values[x].dtype != GP_DTYPE_FLOAT32) return false;
    c->nodes[c->n++] = rp;
    c->nodes[c->n++] = sp;
    c->nodes[c->n++] = t;
    int u = gp_fuse_sole_consumer(g, uses, user, tn->outputs[0]); /* Add(t, 1) */
    if (u < 0 || !gp_fuse_is_op(&g->nodes[u], "Add") || !near(gp_fuse_scalar(g, gp_fuse_other_operand(&g->nodes[u], tn->outputs[0])), 1.0))
        return false;
    c->nodes[c->n++] = u;
    int w = gp_fuse_sole_consumer(g, uses, user, g->nodes[u].outputs[0]);
    if (w < 0 || !gp_fuse_is_op(&g->nodes[w], "Mul")) return false;
    int o = gp_fuse_other_operand(&g->nodes[w], g->nodes[u].outputs[0]);
    int last = -1;
    if (o == x) { /* Mul(Mul(x, Add(t, 1)), 0.5) */
        int h = gp_fuse_sole_consumer(g, uses, user, g->nodes[w].outputs[0]);
        if (h < 0 || !gp_fuse_is_op(&g->nodes[h], "Mul") ||
            !near(gp_fuse_scalar(g, gp_fuse_other_operand(&g->nodes[h], g->nodes[w].outputs[0])), 0.5))
            return false;
        c->nodes[c->n++] = w;
        last = h;
    } else { /* Mul(Mul(x, 0.5), Add(t, 1)) */
        int a = producer_for(g, uses, user, o, "Mul", w);
        if (a < 0 || with_const(g, a, 0.5) != x) return false;
        c->nodes[c->n++] = a;
        last = w;
    }
    c->nodes[c->n++] = last;
    const struct gp_value *yv = &g->values[g->nodes[last].outputs[0]];
    if (g->nodes[last].n_outputs != 1 || !gp_shape_equal(&g->values[x].shape, &yv->shape) ||
        yv->dtype != GP_DTYPE_FLOAT32)
        return false;
    c->x = x;
    return true;
}

/* An Add of two float tensors of its output's shape (a residual add: no
 * broadcasting, which the fused kernels do not take). */
static bool same_shape_add(const struct gp_graph *g, const struct gp_node *n)
{
    if (!gp_fuse_is_op(n, "Add") || n->n_inputs != 2 || n->n_outputs != 1 || n->inputs[0] < 0 || n->inputs[1] < 0)
        return false;
    const struct gp_value *y = &g->values[n->outputs[0]];
    for (int k = 0; k < 2; k++) {
        const struct gp_value *x = &g->values[n->inputs[k]];
        if (!gp_shape_equal(&x->shape, &y->shape) || x->dtype != y->dtype) return false;
    }
    return true;
}

/* A Transpose swapping the two axes of a 2-D parameter (perm [1, 0], or
 * no perm: reversed axes). */
static bool weight_transpose(const struct gp_graph *g, const struct gp_node *t)
{
    if (!gp_fuse_is_op(t, "Transpose") || t->n_inputs != 1 || t->n_outputs != 1 || t->inputs[0] < 0)
        return false;
    const struct gp_value *w = &g->values[t->inputs[0]];
    if (w->kind != GP_VALUE_PARAMETER || w->shape.rank != 2 || w->dtype != GP_DTYPE_FLOAT32) return false;
    for (int a = 0; a < t->n_attrs; a++)
        if (!strcmp(t->attrs[a].name, "perm"))
            return t->attrs[a].type == GP_ATTR_INTS && t->attrs[a].count == 2 && t->attrs[a].ints[0] == 1 &&
                   t->attrs[a].ints[1] == 0;
    return true;
}

/* Value b as the bias of product p (a MatMul's output whose B has two or
 * more axes): a float parameter or constant of p's dtype, shaped [N] or
 * [1, ..., N] with N p's last axis, no more axes than p. */
static bool row_bias(const struct gp_graph *g, int b, int p)
{
    if (b < 0 || p < 0) return false;
    const struct gp_value *bv = &g->values[b], *pv = &g->values[p];
    if ((bv->kind != GP_VALUE_PARAMETER && bv->kind != GP_VALUE_CONSTANT) || !bv->constant ||
        bv->dtype != GP_DTYPE_FLOAT32 || pv->dtype != bv->dtype || bv->shape.rank < 1 ||
        bv->shape.rank > pv->shape.rank)
        return false;
    for (int a = 0; a < bv->shape.rank - 1; a++)
        if (bv->shape.dims[a] != 1) return false;
    return bv->shape.dims[bv->shape.rank - 1] == pv->shape.dims[pv->shape.rank - 1];
}

/* "<folder of the first node's name>/Gelu" (the exporter's module path),
 * or "Gelu_<index>" for names without one. */
static const char *gelu_name(struct gp_graph *g, const struct gp_node *first, int index)
{
    char buf[512];
    const char *slash = strrchr(first->name, '/');
    if (slash && slash - first->name < 400)
        snprintf(buf, sizeof buf, "%.*s/Gelu", (int)(slash - first->name), first->name);
    else
        snprintf(buf, sizeof buf, "Gelu_%d", index);
    return gp_arena_strdup(&g->arena, buf);
}

gp_status gp_graph_fuse(struct gp_graph *g, struct gp_error *err)
{
    bool known = false;
    const struct gp_op_def *gelu = gp_op_lookup("", "Gelu", 20, &known);
    int *uses = calloc((size_t)g->n_values + 1, sizeof(int));
    int *user = malloc(sizeof(int) * ((size_t)g->n_values + 1));
    bool *drop = calloc((size_t)g->n_nodes + 1, sizeof(bool));
    int *input = gp_arena_alloc(&g->arena, sizeof(int) * ((size_t)g->n_nodes + 1));
    struct gp_attr *tanh_attr = gp_arena_alloc(&g->arena, sizeof *tanh_attr);
    if (!uses || !user || !drop || !input || !tanh_attr) {
        free(uses);
        free(user);
        free(drop);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory fusing the graph");
    }
    int fused = 0;
    gp_status st = gp_graph_fuse_attention(g, drop, &fused, err);
    if (st != GP_OK) {
        free(uses);
        free(user);
        free(drop);
        return st;
    }
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_inputs && !drop[i]; k++) {
            int v = g->nodes[i].inputs[k];
            if (v >= 0) uses[v]++, user[v] = i;
        }
    *tanh_attr = (struct gp_attr){.name = "approximate", .type = GP_ATTR_STRING, .s = "tanh"};
    for (int i = 0; gelu && i < g->n_nodes; i++) {
        struct chain c;
        if (drop[i] || !(match_gelu(g, uses, user, i, &c) || match_gelu_tanh(g, uses, user, i, &c))) continue;
        bool taken = false;
        for (int k = 0; k < c.n; k++) taken |= drop[c.nodes[k]];
        if (taken) continue;
        /* The node making y (the chain's last, after all the others in
         * topological order) becomes Gelu(x); the others go, their outputs
         * left without producer or consumer. */
        int first = c.nodes[0];
        for (int k = 1; k < c.n; k++)
            if (c.nodes[k] < first) first = c.nodes[k];
        struct gp_node *last = &g->nodes[c.nodes[c.n - 1]];
        input[fused] = c.x;
        last->name = gelu_name(g, &g->nodes[first], fused);
        last->op_type = "Gelu";
        last->domain = "";
        last->def = gelu;
        last->n_inputs = 1;
        last->inputs = &input[fused];
        last->n_attrs = c.tanh ? 1 : 0;
        last->attrs = c.tanh ? tanh_attr : NULL;
        for (int k = 0; k < c.n - 1; k++) {
            drop[c.nodes[k]] = true;
            g->values[g->nodes[c.nodes[k]].outputs[0]].producer = -1;
        }
        fused++;
    }
    /* Relu into the BatchNormalization or residual Add making its input. */
    for (int i = 0; i < g->n_nodes; i++) {
        struct gp_node *r = &g->nodes[i];
        if (drop[i] || !gp_fuse_is_op(r, "Relu") || r->n_inputs != 1 || r->n_outputs != 1) continue;
        int v = r->inputs[0];
        int b = v >= 0 ? g->values[v].producer : -1;
        if (b < 0 || drop[b] || gp_fuse_sole_consumer(g, uses, user, v) != i) continue;
        struct gp_node *bn = &g->nodes[b];
        if (!(gp_fuse_is_op(bn, "BatchNormalization") || same_shape_add(g, bn)) || bn->fused_relu || bn->outputs[0] != v ||
            !gp_dtype_is_float(g->values[v].dtype) || g->values[r->outputs[0]].dtype != g->values[v].dtype)
            continue;
        bn->outputs[0] = r->outputs[0];
        bn->fused_relu = true;
        g->values[r->outputs[0]].producer = b;
        g->values[v].producer = -1;
        drop[i] = true;
        fused++;
    }
    /* Residual Adds into the BatchNormalization making an operand. */
    const bool bn_add = gp_env_flag("GP_FUSE_BN_ADD", true);
    for (int i = 0; bn_add && i < g->n_nodes; i++) {
        struct gp_node *add = &g->nodes[i];
        if (drop[i] || !same_shape_add(g, add)) continue;
        /* The operand made last (the main branch's BatchNorm after a
         * downsampling branch's), whose BatchNorm qualifies. */
        int pick = -1;
        for (int s = 0; s < 2; s++) {
            int p = add->inputs[s], b = g->values[p].producer;
            if (add->inputs[1 - s] == p || b < 0 || drop[b] || gp_fuse_sole_consumer(g, uses, user, p) != i) continue;
            const struct gp_node *bn = &g->nodes[b];
            bool ok = gp_fuse_is_op(bn, "BatchNormalization") && !bn->fused_relu && !bn->fused_add &&
                      bn->n_inputs == 5 && bn->outputs[0] == p;
            for (int k = 1; ok && k < bn->n_outputs; k++)
                ok = bn->outputs[k] < 0 || (!uses[bn->outputs[k]] && !g->values[bn->outputs[k]].is_output);
            if (ok && (pick < 0 || b > g->values[add->inputs[pick]].producer)) pick = s;
        }
        if (pick < 0) continue;
        int p = add->inputs[pick], r = add->inputs[1 - pick], b = g->values[p].producer;
        int *in = gp_arena_alloc(&g->arena, sizeof(int) * 6);
        if (!in) {
            free(uses);
            free(user);
            free(drop);
            return gp_error_set(err, GP_ERR_NOMEM, "out of memory fusing the graph");
        }
        struct gp_node fused_node = g->nodes[b];
        memcpy(in, fused_node.inputs, sizeof(int) * 5);
        in[5] = r;
        fused_node.inputs = in;
        fused_node.n_inputs = 6;
        fused_node.outputs[0] = add->outputs[0];
        fused_node.fused_relu = add->fused_relu;
        fused_node.fused_add = true;
        /* In the Add's place: r may be made after the BatchNorm. */
        g->nodes[i] = fused_node;
        for (int k = 0; k < 5; k++)
            if (in[k] >= 0 && user[in[k]] == b) user[in[k]] = i;
        g->values[p].producer = -1;
        uses[p] = 0;
        drop[b] = true;
        fused++;
    }
    /* Weight Transposes into the MatMul reading them (GP_FUSE_WEIGHT_TRANSPOSE=0:
     * not, for comparisons). */
    const bool weight_t = gp_env_flag("GP_FUSE_WEIGHT_TRANSPOSE", true);
    for (int i = 0; weight_t && i < g->n_nodes; i++) {
        struct gp_node *t = &g->nodes[i];
        if (drop[i] || !weight_transpose(g, t)) continue;
        int v = t->outputs[0];
        int m = gp_fuse_sole_consumer(g, uses, user, v);
        if (m < 0 || drop[m]) continue;
        struct gp_node *mm = &g->nodes[m];
        if (!gp_fuse_is_op(mm, "MatMul") || mm->n_inputs != 2 || mm->inputs[1] != v || mm->inputs[0] == v ||
            mm->trans_b)
            continue;
        int w = t->inputs[0];
        /* A weight read elsewhere too (a GPT's head tied to its embedding)
         * keeps its Transpose: computed once per step, its gradient added
         * once after every micro-batch's other terms, which keeps a split
         * of the readers into stages bit for bit one stage (pipeline/tied.c). */
        if (uses[w] != 1) continue;
        mm->inputs[1] = w;
        mm->trans_b = true;
        uses[w]++, user[w] = m;
        uses[v] = 0;
        g->values[v].producer = -1;
        drop[i] = true;
        fused++;
    }
    /* Bias Adds into the MatMul making their other operand
     * (GP_FUSE_MATMUL_BIAS=0: not, for comparisons). */
    const bool matmul_bias = gp_env_flag("GP_FUSE_MATMUL_BIAS", true);
    for (int i = 0; matmul_bias && i < g->n_nodes; i++) {
        struct gp_node *add = &g->nodes[i];
        if (drop[i] || !gp_fuse_is_op(add, "Add") || add->n_inputs != 2 || add->n_outputs != 1 ||
            add->outputs[0] < 0 || add->fused_relu)
            continue;
        for (int s = 0; s < 2; s++) {
            int p = add->inputs[s], b = add->inputs[1 - s];
            int m = p >= 0 ? g->values[p].producer : -1;
            if (m < 0 || drop[m] || gp_fuse_sole_consumer(g, uses, user, p) != i) continue;
            struct gp_node *mm = &g->nodes[m];
            if (!gp_fuse_is_op(mm, "MatMul") || mm->n_inputs != 2 || mm->n_outputs != 1 || mm->outputs[0] != p ||
                mm->fused_bias || mm->inputs[1] < 0 || g->values[mm->inputs[1]].shape.rank < 2)
                continue;
            /* A bias read elsewhere too keeps its Add (the tied weight's
             * reason above: one gradient, added once). */
            if (!row_bias(g, b, p) || uses[b] != 1 || b == mm->inputs[0] || b == mm->inputs[1]) continue;
            int y = add->outputs[0];
            const struct gp_value *yv = &g->values[y];
            if (yv->dtype != g->values[p].dtype || !gp_shape_equal(&yv->shape, &g->values[p].shape)) continue;
            int *in = gp_arena_alloc(&g->arena, sizeof(int) * 3);
            if (!in) {
                free(uses);
                free(user);
                free(drop);
                return gp_error_set(err, GP_ERR_NOMEM, "out of memory fusing the graph");
            }
            in[0] = mm->inputs[0];
            in[1] = mm->inputs[1];
            in[2] = b;
            mm->inputs = in;
            mm->n_inputs = 3;
            mm->fused_bias = true;
            mm->outputs[0] = y;
            g->values[y].producer = m;
            g->values[p].producer = -1;
            user[b] = m;
            uses[p] = 0;
            drop[i] = true;
            fused++;
            break;
        }
    }
    /* Dropout's mask output, read by nothing and not a graph output, goes
     * (an omitted output): exporters in training mode write it, and the
     * kernels would store a byte per element every step into memory
     * planned for it. Not a fusion: the node list stays as it is. */
    for (int i = 0; i < g->n_nodes; i++) {
        struct gp_node *n = &g->nodes[i];
        if (drop[i] || !gp_fuse_is_op(n, "Dropout") || n->n_outputs < 2) continue;
        int m = n->outputs[1];
        if (m < 0 || uses[m] || g->values[m].is_output) continue;
        g->values[m].producer = -1;
        n->outputs[1] = -1;
    }
    if (fused) {
        int count = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            if (drop[i]) continue;
            g->nodes[count] = g->nodes[i];
            for (int k = 0; k < g->nodes[count].n_outputs; k++)
                if (g->nodes[count].outputs[k] >= 0) g->values[g->nodes[count].outputs[k]].producer = count;
            count++;
        }
        g->n_fused += g->n_nodes - count;
        g->n_fusions += fused;
        g->n_nodes = count;
    }
    free(uses);
    free(user);
    free(drop);
    return GP_OK;
}
