/* Einsum, lowered at load into the ops that compute it: what exporters write
 * for attention (torchvision's maxvit: "bghid,bghjd->bghij" and
 * "bghij,bghjd->bghid") is a batched matrix product, so it becomes
 *
 *     Transpose(A) -> MatMul <- Transpose(B),  then Transpose(result)
 *
 * (each Transpose only where the order is not already right), and a single
 * operand's permutation or sum becomes Transpose / ReduceSum. Those ops have
 * forward and backward kernels on every backend, so an Einsum trains
 * wherever they do. The saved model is written from the original file
 * (onnx/save.c), so it keeps the Einsum.
 *
 * Supported equations (letters, spaces, an explicit "->" or numpy's implicit
 * output: the labels that appear once, in alphabetical order):
 *   - one operand, each label once: any permutation, any labels summed away;
 *   - two operands, each label at most once per operand, the output's labels
 *     from the operands: labels in both operands and the output (batch
 *     labels, any number), exactly one label in both operands only (summed),
 *     exactly one label of each operand's own in the output.
 * Anything else (an ellipsis, a repeated label such as a diagonal or trace,
 * an outer or inner product, more than two operands) is refused at load,
 * naming the node and its equation. */
#include "onnx/einsum.h"

#include <stdio.h>
#include <string.h>

#include "graph/build.h"
#include "util/arena.h"

#define MAX_LABELS 52

struct term {
    int n;
    char labels[MAX_LABELS];
};

struct equation {
    int n_in;
    struct term in[2], out;
};

bool gp_onnx_is_einsum(const Onnx__NodeProto *np)
{
    return np->op_type && !strcmp(np->op_type, "Einsum") &&
           (!np->domain || !*np->domain || !strcmp(np->domain, "ai.onnx"));
}

static const char *equation_of(const Onnx__NodeProto *np, char *buf, size_t size)
{
    for (size_t k = 0; k < np->n_attribute; k++) {
        const Onnx__AttributeProto *a = np->attribute[k];
        if (a->name && !strcmp(a->name, "equation") && a->has_s) {
            snprintf(buf, size, "%.*s", (int)a->s.len, (const char *)a->s.data);
            return buf;
        }
    }
    return NULL;
}

static int label_index(const struct term *t, char c)
{
    for (int i = 0; i < t->n; i++)
        if (t->labels[i] == c) return i;
    return -1;
}

static bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* Parses `s` into terms; false with `why` set when it is malformed or uses
 * what the lowering does not (an ellipsis, a repeated label). */
static bool parse(const char *s, struct equation *eq, const char **why)
{
    memset(eq, 0, sizeof *eq);
    struct term *t = &eq->in[0];
    bool output = false;
    for (const char *p = s; *p; p++) {
        char c = *p;
        if (c == ' ') continue;
        if (c == '.') {
            *why = "an ellipsis ('...')";
            return false;
        }
        if (c == ',') {
            if (output || eq->n_in + 1 >= 2) {
                *why = output ? "a ',' after '->'" : "more than two operands";
                return false;
            }
            t = &eq->in[++eq->n_in];
            continue;
        }
        if (c == '-' && p[1] == '>') {
            if (output) {
                *why = "two '->'";
                return false;
            }
            output = true;
            t = &eq->out;
            p++;
            continue;
        }
        if (!is_letter(c)) {
            *why = "a character that is not a letter, ',', '->' or a space";
            return false;
        }
        if (label_index(t, c) >= 0) {
            *why = "a label repeated within one term (a diagonal or trace)";
            return false;
        }
        if (t->n >= MAX_LABELS) {
            *why = "more labels than letters";
            return false;
        }
        t->labels[t->n++] = c;
    }
    eq->n_in++;
    if (!output) { /* numpy's implicit output: the labels seen once, sorted */
        for (char c = 'A'; c <= 'z'; c++) {
            if (!is_letter(c)) continue;
            int seen = 0;
            for (int k = 0; k < eq->n_in; k++) seen += label_index(&eq->in[k], c) >= 0;
            if (seen == 1) eq->out.labels[eq->out.n++] = c;
        }
    }
    for (int i = 0; i < eq->out.n; i++) {
        bool found = false;
        for (int k = 0; k < eq->n_in; k++) found |= label_index(&eq->in[k], eq->out.labels[i]) >= 0;
        if (!found) {
            *why = "an output label that no operand has";
            return false;
        }
    }
    return true;
}

/* The lowering's node and value names: the Einsum's output name with a
 * suffix no exporter writes. */
static const char *derived(struct gp_graph *g, const char *base, const char *what)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s::einsum_%s", base, what);
    return gp_arena_strdup(&g->arena, buf);
}

static bool identity(const int64_t *perm, int n)
{
    for (int i = 0; i < n; i++)
        if (perm[i] != i) return false;
    return true;
}

/* Adds Transpose(x, perm) -> a value named after `base`, unless perm is the
 * identity; the value that holds the result. -1 on error. */
static const char *transpose(struct gp_graph *g, const char *node_name, const char *x, const int64_t *perm,
                             int n, const char *out, const char *base, const char *what,
                             struct gp_error *err)
{
    if (identity(perm, n) && !out) return x;
    const char *y = out ? out : derived(g, base, what);
    const char *in[1] = {x}, *outs[1] = {y};
    int node = gp_graph_add_node(g, identity(perm, n) ? "Identity" : "Transpose", "",
                                 derived(g, node_name, what), 1, in, 1, outs, err);
    if (node < 0) return NULL;
    if (!identity(perm, n)) {
        struct gp_attr *a = gp_graph_add_attr(g, node, "perm", GP_ATTR_INTS, 1, err);
        if (!a) return NULL;
        a->count = n;
        a->ints = gp_arena_memdup(&g->arena, perm, sizeof(int64_t) * (size_t)n);
        if (!a->ints) {
            gp_error_set(err, GP_ERR_NOMEM, "out of memory lowering Einsum");
            return NULL;
        }
    }
    return y;
}

/* One operand: the labels not in the output summed away (ReduceSum over
 * them), then the rest put in the output's order. */
static gp_status lower_one(struct gp_graph *g, const char *name, const char *x, const char *y,
                           const struct equation *eq, struct gp_error *err)
{
    const struct term *a = &eq->in[0], *o = &eq->out;
    int64_t axes[MAX_LABELS];
    char kept[MAX_LABELS];
    int n_axes = 0, kept_n = 0;
    for (int i = 0; i < a->n; i++) {
        if (label_index(o, a->labels[i]) < 0) axes[n_axes++] = i;
        else kept[kept_n++] = a->labels[i];
    }
    int64_t perm[MAX_LABELS];
    for (int i = 0; i < o->n; i++)
        for (int j = 0; j < kept_n; j++)
            if (kept[j] == o->labels[i]) perm[i] = j;
    const char *cur = x;
    if (n_axes) {
        /* Straight into y when the kept labels are in the output's order. */
        const char *summed = identity(perm, o->n) ? y : derived(g, y, "summed");
        const char *axes_name = derived(g, y, "axes");
        int node;
        if (g->opset >= 13) {
            struct gp_shape sh = {.rank = 1, .dims = {n_axes}};
            GP_TRY(gp_graph_add_const_i64(g, axes_name, &sh, axes, err));
            const char *in[2] = {x, axes_name}, *outs[1] = {summed};
            node = gp_graph_add_node(g, "ReduceSum", "", derived(g, name, "sum"), 2, in, 1, outs, err);
        } else {
            const char *in[1] = {x}, *outs[1] = {summed};
            node = gp_graph_add_node(g, "ReduceSum", "", derived(g, name, "sum"), 1, in, 1, outs, err);
        }
        if (node < 0) return err->status;
        struct gp_attr *k = gp_graph_add_attr(g, node, "keepdims", GP_ATTR_INT, 2, err);
        if (!k) return err->status;
        k->i = 0;
        if (g->opset < 13) {
            struct gp_attr *ax = gp_graph_add_attr(g, node, "axes", GP_ATTR_INTS, 2, err);
            if (!ax) return err->status;
            ax->count = n_axes;
            ax->ints = gp_arena_memdup(&g->arena, axes, sizeof(int64_t) * (size_t)n_axes);
            if (!ax->ints) return gp_error_set(err, GP_ERR_NOMEM, "out of memory lowering Einsum");
        }
        if (summed == y) return GP_OK;
        cur = summed;
    }
    return transpose(g, name, cur, perm, o->n, y, y, "out", err) ? GP_OK : err->status;
}

/* Two operands as a batched matrix product: A to [batch..., m, k], B to
 * [batch..., k, n], MatMul, then [batch..., m, n] to the output's order.
 * `why` is set when the equation is not of that form. */
static gp_status lower_two(struct gp_graph *g, const char *name, const char *const *x, const char *y,
                           const struct equation *eq, const char **why, struct gp_error *err)
{
    const struct term *a = &eq->in[0], *b = &eq->in[1], *o = &eq->out;
    char batch[MAX_LABELS], m = 0, n = 0, k = 0;
    int n_batch = 0, n_m = 0, n_n = 0, n_k = 0;
    for (int i = 0; i < o->n; i++) { /* batch labels in the output's order */
        char c = o->labels[i];
        bool in_a = label_index(a, c) >= 0, in_b = label_index(b, c) >= 0;
        if (in_a && in_b) batch[n_batch++] = c;
        else if (in_a) m = c, n_m++;
        else n = c, n_n++;
    }
    for (int i = 0; i < a->n; i++) {
        char c = a->labels[i];
        if (label_index(o, c) >= 0) continue;
        if (label_index(b, c) < 0) {
            *why = "a label summed within one operand only";
            return GP_ERR_UNSUPPORTED;
        }
        k = c, n_k++;
    }
    for (int i = 0; i < b->n; i++)
        if (label_index(o, b->labels[i]) < 0 && label_index(a, b->labels[i]) < 0) {
            *why = "a label summed within one operand only";
            return GP_ERR_UNSUPPORTED;
        }
    if (n_k != 1 || n_m != 1 || n_n != 1) {
        *why = n_k != 1 ? "not exactly one label summed between the operands (an outer product, or several "
                          "summed labels)"
                        : "not exactly one label of each operand's own in the output (a matrix-vector "
                          "product, or several free labels)";
        return GP_ERR_UNSUPPORTED;
    }
    int64_t pa[MAX_LABELS], pb[MAX_LABELS], po[MAX_LABELS];
    for (int i = 0; i < n_batch; i++) {
        pa[i] = label_index(a, batch[i]);
        pb[i] = label_index(b, batch[i]);
    }
    pa[n_batch] = label_index(a, m), pa[n_batch + 1] = label_index(a, k);
    pb[n_batch] = label_index(b, k), pb[n_batch + 1] = label_index(b, n);
    /* The product's labels: batch..., m, n; the output's i-th is one of them. */
    char prod[MAX_LABELS];
    memcpy(prod, batch, (size_t)n_batch);
    prod[n_batch] = m, prod[n_batch + 1] = n;
    for (int i = 0; i < o->n; i++)
        for (int j = 0; j < n_batch + 2; j++)
            if (prod[j] == o->labels[i]) po[i] = j;
    const char *ta = transpose(g, name, x[0], pa, a->n, NULL, y, "a", err);
    const char *tb = ta ? transpose(g, name, x[1], pb, b->n, NULL, y, "b", err) : NULL;
    if (!ta || !tb) return err->status;
    bool last = identity(po, o->n);
    const char *p = last ? y : derived(g, y, "product");
    const char *in[2] = {ta, tb}, *outs[1] = {p};
    if (gp_graph_add_node(g, "MatMul", "", derived(g, name, "matmul"), 2, in, 1, outs, err) < 0)
        return err->status;
    if (last) return GP_OK;
    return transpose(g, name, p, po, o->n, y, y, "out", err) ? GP_OK : err->status;
}

gp_status gp_onnx_lower_einsum(struct gp_graph *g, const Onnx__NodeProto *np, struct gp_einsum_check *checks,
                               int *n_checks, struct gp_error *err)
{
    char eqbuf[512];
    const char *node_name = np->name && *np->name ? np->name : "Einsum";
    const char *text = equation_of(np, eqbuf, sizeof eqbuf);
    if (!text)
        return gp_error_set(err, GP_ERR_INVALID, "node '%s' (Einsum): no 'equation' attribute", node_name);
    struct equation eq;
    const char *why = NULL;
    if (np->n_output != 1 || !np->output[0] || !*np->output[0])
        return gp_error_set(err, GP_ERR_INVALID, "node '%s' (Einsum): it must have one output", node_name);
    gp_status st = GP_OK;
    if (parse(text, &eq, &why) && (size_t)eq.n_in != np->n_input)
        return gp_error_set(err, GP_ERR_INVALID, "node '%s' (Einsum): equation '%s' has %d operand%s, the node %zu",
                            node_name, text, eq.n_in, eq.n_in == 1 ? "" : "s", np->n_input);
    if (!why) {
        const char *name = gp_arena_strdup(&g->arena, node_name), *eq_copy = gp_arena_strdup(&g->arena, text);
        if (!name || !eq_copy) return gp_error_set(err, GP_ERR_NOMEM, "out of memory lowering Einsum");
        for (int k = 0; k < eq.n_in; k++) {
            const char *v = gp_arena_strdup(&g->arena, np->input[k]);
            if (!v) return gp_error_set(err, GP_ERR_NOMEM, "out of memory lowering Einsum");
            checks[(*n_checks)++] = (struct gp_einsum_check){name, eq_copy, v, eq.in[k].n};
        }
        if (eq.n_in == 1) return lower_one(g, name, np->input[0], np->output[0], &eq, err);
        st = lower_two(g, name, (const char *const *)np->input, np->output[0], &eq, &why, err);
        if (!why) return st;
    }
    return gp_error_set(err, GP_ERR_UNSUPPORTED,
                        "node '%s' (Einsum): equation '%s' has %s; supported: one operand (a permutation, "
                        "labels summed away) or a batched matrix product of two (batch labels, one label "
                        "summed between them, one of each operand's own)",
                        node_name, text, why);
}

gp_status gp_onnx_einsum_verify(const struct gp_graph *g, const struct gp_einsum_check *checks, int n,
                                struct gp_error *err)
{
    for (int i = 0; i < n; i++) {
        int v = gp_graph_lookup(g, checks[i].value);
        if (v < 0) continue; /* gone with folding: its consumers were checked then */
        if (g->values[v].shape.rank != checks[i].rank)
            return gp_error_set(err, GP_ERR_SHAPE,
                                "node '%s' (Einsum): equation '%s' gives operand '%s' %d label%s, but it has "
                                "rank %d",
                                checks[i].node, checks[i].equation, checks[i].value, checks[i].rank,
                                checks[i].rank == 1 ? "" : "s", g->values[v].shape.rank);
    }
    return GP_OK;
}
