/* Sequences, as PyTorch's dynamo exporter writes torch.split / chunk /
 * unbind: a SplitToSequence whose chunks are taken out one by one by
 * SequenceAt at constant positions (nanoGPT's q, k, v = qkv.split(C, 2)):
 *
 *     SplitToSequence(x, split; axis, keepdims) -> seq
 *     SequenceAt(seq, i) -> chunk_i
 *
 * Each chunk is a slice of x, so each SequenceAt becomes
 *
 *     Slice(x, starts=[first], ends=[last + 1], axes=[axis]) -> chunk_i
 *
 * (then Squeeze(axis) where no split is given and keepdims=0), and the
 * SplitToSequence itself goes. A Slice needs no shape at load: with a
 * scalar split s (equal chunks, the last shorter) chunk i is [i s, (i+1) s)
 * clamped to the axis, with a list it is where the list says, without one
 * it is [i, i+1). Slice has forward and backward kernels on every backend,
 * so the chunks train wherever it does; the saved model is written from the
 * original file (onnx/save.c), so it keeps the sequence ops.
 *
 * Refused at load, naming the node: a sequence read by anything else than
 * SequenceAt (ConcatFromSequence, SequenceLength, a graph output, a Loop),
 * a SequenceAt of a sequence that no SplitToSequence made, a split or
 * position that is not a constant (an initializer or a Constant node), and a
 * negative position into equal chunks (their number is known only with the
 * shapes). Positions beyond the last chunk, and an explicit split that does
 * not add up to the axis, are refused after shapes are inferred. */
#include "onnx/sequence.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph/build.h"
#include "util/arena.h"

#define MAX_SPLIT 4096

static bool default_domain(const Onnx__NodeProto *np)
{
    return !np->domain || !*np->domain || !strcmp(np->domain, "ai.onnx");
}

static bool is_op(const Onnx__NodeProto *np, const char *op)
{
    return np->op_type && !strcmp(np->op_type, op) && default_domain(np);
}

bool gp_onnx_is_sequence_op(const Onnx__NodeProto *np)
{
    return is_op(np, "SplitToSequence") || is_op(np, "SequenceAt");
}

static const char *node_name(const Onnx__NodeProto *np, const char *fallback)
{
    return np->name && *np->name ? np->name : fallback;
}

/* The integers a TensorProto holds (int64 or int32, raw or typed); -1 when
 * it holds something else or more than `max`. */
static int64_t tensor_ints(const Onnx__TensorProto *tp, int64_t *out, int64_t max)
{
    if (!tp->has_data_type) return -1;
    bool i64 = tp->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
    bool i32 = tp->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__INT32;
    if (!i64 && !i32) return -1;
    if (tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) return -1;
    int64_t n = 1;
    for (size_t d = 0; d < tp->n_dims; d++) {
        if (tp->dims[d] < 0 || (tp->dims[d] && n > max / tp->dims[d])) return -1;
        n *= tp->dims[d];
    }
    if (n > max) return -1;
    if (tp->has_raw_data) {
        size_t width = i64 ? 8 : 4;
        if (tp->raw_data.len != (size_t)n * width) return -1;
        for (int64_t k = 0; k < n; k++) {
            const uint8_t *p = tp->raw_data.data + (size_t)k * width;
            uint64_t u = 0;
            for (size_t b = 0; b < width; b++) u |= (uint64_t)p[b] << (8 * b);
            out[k] = i64 ? (int64_t)u : (int64_t)(int32_t)(uint32_t)u;
        }
        return n;
    }
    if (i64 && tp->n_int64_data == (size_t)n) {
        for (int64_t k = 0; k < n; k++) out[k] = tp->int64_data[k];
        return n;
    }
    if (i32 && tp->n_int32_data == (size_t)n) {
        for (int64_t k = 0; k < n; k++) out[k] = tp->int32_data[k];
        return n;
    }
    return -1;
}

/* The integers of the constant named `name` (an initializer, or a Constant
 * node's value, value_int or value_ints) into out[max]; their count, -1
 * when `name` is not such a constant. `*scalar`: rank 0. */
static int64_t constant_ints(const Onnx__GraphProto *gp, const char *name, int64_t *out, int64_t max, bool *scalar)
{
    *scalar = false;
    for (size_t i = 0; i < gp->n_initializer; i++) {
        const Onnx__TensorProto *tp = gp->initializer[i];
        if (tp->name && !strcmp(tp->name, name)) {
            *scalar = tp->n_dims == 0;
            return tensor_ints(tp, out, max);
        }
    }
    for (size_t i = 0; i < gp->n_node; i++) {
        const Onnx__NodeProto *np = gp->node[i];
        if (np->n_output < 1 || !np->output[0] || strcmp(np->output[0], name)) continue;
        if (!is_op(np, "Constant") || np->n_attribute != 1) return -1;
        const Onnx__AttributeProto *a = np->attribute[0];
        if (!a->name) return -1;
        if (!strcmp(a->name, "value") && a->t) {
            *scalar = a->t->n_dims == 0;
            return tensor_ints(a->t, out, max);
        }
        if (!strcmp(a->name, "value_int") && a->has_i) {
            *scalar = true;
            out[0] = a->i;
            return 1;
        }
        if (!strcmp(a->name, "value_ints") && (int64_t)a->n_ints <= max) {
            for (size_t k = 0; k < a->n_ints; k++) out[k] = a->ints[k];
            return (int64_t)a->n_ints;
        }
        return -1;
    }
    return -1;
}

static int64_t int_attr(const Onnx__NodeProto *np, const char *name, int64_t dflt)
{
    for (size_t k = 0; k < np->n_attribute; k++)
        if (np->attribute[k]->name && !strcmp(np->attribute[k]->name, name) && np->attribute[k]->has_i)
            return np->attribute[k]->i;
    return dflt;
}

static const Onnx__NodeProto *producer(const Onnx__GraphProto *gp, const char *name)
{
    for (size_t i = 0; i < gp->n_node; i++)
        for (size_t k = 0; k < gp->node[i]->n_output; k++)
            if (gp->node[i]->output[k] && !strcmp(gp->node[i]->output[k], name)) return gp->node[i];
    return NULL;
}

/* One SplitToSequence's chunks: split[n] (n < 0: no split input, chunks
 * of 1), or equal chunks of split[0] when `scalar`. */
struct chunks {
    int64_t axis, keepdims, n;
    bool scalar;
    int64_t split[MAX_SPLIT];
};

static gp_status split_of(const Onnx__GraphProto *gp, const Onnx__NodeProto *sp, struct chunks *c,
                          struct gp_error *err)
{
    const char *sname = node_name(sp, "SplitToSequence");
    c->axis = int_attr(sp, "axis", 0);
    c->keepdims = int_attr(sp, "keepdims", 1);
    c->scalar = false;
    c->n = -1;
    if (sp->n_input < 1 || !sp->input[0] || !*sp->input[0] || sp->n_output != 1)
        return gp_error_set(err, GP_ERR_INVALID, "node '%s' (SplitToSequence): it needs an input and one output",
                            sname);
    if (sp->n_input < 2 || !sp->input[1] || !*sp->input[1]) return GP_OK;
    c->n = constant_ints(gp, sp->input[1], c->split, MAX_SPLIT, &c->scalar);
    if (c->n < 0 || (c->scalar && c->n != 1))
        return gp_error_set(err, GP_ERR_UNSUPPORTED,
                            "node '%s' (SplitToSequence): its split '%s' is not a constant (an initializer or "
                            "a Constant node of at most %d integers); only constant splits are supported",
                            sname, sp->input[1], MAX_SPLIT);
    /* Bounded so that no sum or product of positions overflows. */
    for (int64_t k = 0; k < c->n; k++)
        if (c->split[k] < (c->scalar ? 1 : 0) || c->split[k] > ((int64_t)1 << 31))
            return gp_error_set(err, GP_ERR_INVALID, "node '%s' (SplitToSequence): split '%s' holds %lld", sname,
                                sp->input[1], (long long)c->split[k]);
    return GP_OK;
}

gp_status gp_onnx_check_sequences(const Onnx__GraphProto *gp, struct gp_error *err)
{
    struct chunks *c = NULL;
    for (size_t i = 0; i < gp->n_node; i++) {
        const Onnx__NodeProto *np = gp->node[i];
        if (is_op(np, "SplitToSequence")) {
            const char *sname = node_name(np, "SplitToSequence");
            if (!c && !(c = malloc(sizeof *c))) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
            gp_status st = split_of(gp, np, c, err);
            if (st != GP_OK) {
                free(c);
                return st;
            }
            const char *seq = np->output[0];
            for (size_t o = 0; o < gp->n_output; o++)
                if (gp->output[o]->name && !strcmp(gp->output[o]->name, seq)) {
                    free(c);
                    return gp_error_set(err, GP_ERR_UNSUPPORTED,
                                        "node '%s' (SplitToSequence): its sequence '%s' is a graph output; only "
                                        "tensors are (sequences are supported only as SequenceAt reads them)",
                                        sname, seq);
                }
            for (size_t j = 0; j < gp->n_node; j++) {
                const Onnx__NodeProto *r = gp->node[j];
                for (size_t k = 0; k < r->n_input; k++) {
                    if (!r->input[k] || strcmp(r->input[k], seq)) continue;
                    if (k == 0 && is_op(r, "SequenceAt")) continue;
                    free(c);
                    return gp_error_set(err, GP_ERR_UNSUPPORTED,
                                        "node '%s' (SplitToSequence): its sequence '%s' is read by node '%s' (%s); "
                                        "sequences are supported only as SequenceAt reads them at constant "
                                        "positions",
                                        sname, seq, node_name(r, "?"), r->op_type ? r->op_type : "?");
                }
            }
        } else if (is_op(np, "SequenceAt")) {
            const char *aname = node_name(np, "SequenceAt");
            if (np->n_input != 2 || !np->input[0] || !np->input[1] || np->n_output != 1) {
                free(c);
                return gp_error_set(err, GP_ERR_INVALID, "node '%s' (SequenceAt): it needs 2 inputs and 1 output",
                                    aname);
            }
            const Onnx__NodeProto *sp = producer(gp, np->input[0]);
            if (!sp || !is_op(sp, "SplitToSequence")) {
                free(c);
                return gp_error_set(err, GP_ERR_UNSUPPORTED,
                                    "node '%s' (SequenceAt): its sequence '%s' comes from %s%s%s; only "
                                    "SplitToSequence's sequences are supported",
                                    aname, np->input[0], sp ? "node '" : "no node",
                                    sp ? node_name(sp, "?") : "", sp ? "'" : "");
            }
            int64_t pos;
            bool scalar;
            if (constant_ints(gp, np->input[1], &pos, 1, &scalar) != 1) {
                free(c);
                return gp_error_set(err, GP_ERR_UNSUPPORTED,
                                    "node '%s' (SequenceAt): its position '%s' is not a constant (an "
                                    "initializer or a Constant node); only constant positions are supported",
                                    aname, np->input[1]);
            }
        }
    }
    free(c);
    return GP_OK;
}

/* The lowering's value and node names: the SequenceAt's output or name
 * with a suffix no exporter writes. */
static const char *derived(struct gp_graph *g, const char *base, const char *what)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s::sequence_%s", base, what);
    return gp_arena_strdup(&g->arena, buf);
}

static gp_status add_ints(struct gp_graph *g, const char *name, int64_t v, struct gp_error *err)
{
    struct gp_shape sh = {.rank = 1, .dims = {1}};
    return gp_graph_add_const_i64(g, name, &sh, &v, err);
}

gp_status gp_onnx_lower_sequence_op(struct gp_graph *g, const Onnx__GraphProto *gp, const Onnx__NodeProto *np,
                                    struct gp_sequence_check *checks, int *n_checks, struct gp_error *err)
{
    if (is_op(np, "SplitToSequence")) return GP_OK; /* its readers slice its input */
    const char *aname = node_name(np, "SequenceAt");
    const Onnx__NodeProto *sp = producer(gp, np->input[0]);
    struct chunks *c = malloc(sizeof *c);
    if (!c) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    gp_status st = split_of(gp, sp, c, err);
    int64_t pos = 0;
    bool scalar;
    constant_ints(gp, np->input[1], &pos, 1, &scalar);
    /* [start, end) along the axis; total: the axis size the split implies. */
    int64_t start = 0, end = 0, total = -1, chunk = 0;
    if (st == GP_OK && (pos > ((int64_t)1 << 31) || pos < -((int64_t)1 << 31)))
        st = gp_error_set(err, GP_ERR_INVALID, "node '%s' (SequenceAt): position %lld", aname, (long long)pos);
    if (st == GP_OK && c->n < 0) { /* chunks of 1 */
        start = pos;
        end = pos == -1 ? INT64_MAX : pos + 1;
        chunk = 1;
    } else if (st == GP_OK && c->scalar) {
        if (pos < 0)
            st = gp_error_set(err, GP_ERR_UNSUPPORTED,
                              "node '%s' (SequenceAt): position %lld counts from the end of equal chunks "
                              "(node '%s', split %lld), whose number is known only with the shapes; only "
                              "positions from the start are supported there",
                              aname, (long long)pos, node_name(sp, "SplitToSequence"), (long long)c->split[0]);
        chunk = c->split[0];
        start = pos * chunk;
        end = start + chunk;
    } else if (st == GP_OK) {
        int64_t i = pos < 0 ? pos + c->n : pos;
        if (i < 0 || i >= c->n)
            st = gp_error_set(err, GP_ERR_INVALID, "node '%s' (SequenceAt): position %lld, but node '%s' makes %lld chunks",
                              aname, (long long)pos, node_name(sp, "SplitToSequence"), (long long)c->n);
        total = 0;
        for (int64_t k = 0; k < c->n; k++) {
            if (k == i) start = total, end = total + c->split[k];
            total += c->split[k];
        }
        pos = i;
    }
    bool squeeze = c->n < 0 && c->keepdims == 0;
    int64_t axis = c->axis;
    free(c);
    if (st != GP_OK) return st;

    const char *y = np->output[0];
    const char *sliced = squeeze ? derived(g, y, "slice") : y;
    const char *starts = derived(g, y, "starts"), *ends = derived(g, y, "ends"), *axes = derived(g, y, "axes");
    const char *name = gp_arena_strdup(&g->arena, aname), *x = gp_arena_strdup(&g->arena, sp->input[0]);
    if (!sliced || !starts || !ends || !axes || !name || !x)
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory lowering SequenceAt");
    GP_TRY(add_ints(g, starts, start, err));
    GP_TRY(add_ints(g, ends, end, err));
    GP_TRY(add_ints(g, axes, axis, err));
    const char *in[4] = {x, starts, ends, axes}, *outs[1] = {sliced};
    if (gp_graph_add_node(g, "Slice", "", name, 4, in, 1, outs, err) < 0) return err->status;
    if (squeeze) {
        const char *sq = derived(g, name, "squeeze");
        const char *sq_axes = derived(g, y, "squeeze_axes");
        if (!sq || !sq_axes) return gp_error_set(err, GP_ERR_NOMEM, "out of memory lowering SequenceAt");
        const char *sin[2] = {sliced, sq_axes}, *sout[1] = {y};
        int node;
        if (g->opset >= 13) {
            GP_TRY(add_ints(g, sq_axes, axis, err));
            node = gp_graph_add_node(g, "Squeeze", "", sq, 2, sin, 1, sout, err);
        } else {
            node = gp_graph_add_node(g, "Squeeze", "", sq, 1, sin, 1, sout, err);
            struct gp_attr *a = node < 0 ? NULL : gp_graph_add_attr(g, node, "axes", GP_ATTR_INTS, 1, err);
            if (node >= 0 && !a) return err->status;
            if (a) {
                a->count = 1;
                a->ints = gp_arena_memdup(&g->arena, &axis, sizeof axis);
                if (!a->ints) return gp_error_set(err, GP_ERR_NOMEM, "out of memory lowering SequenceAt");
            }
        }
        if (node < 0) return err->status;
    }
    checks[(*n_checks)++] = (struct gp_sequence_check){name, x, axis, pos, start, total, chunk};
    return GP_OK;
}

gp_status gp_onnx_sequence_verify(const struct gp_graph *g, const struct gp_sequence_check *checks, int n,
                                  struct gp_error *err)
{
    for (int i = 0; i < n; i++) {
        const struct gp_sequence_check *c = &checks[i];
        int v = gp_graph_lookup(g, c->value);
        if (v < 0) continue; /* gone with folding: the Slice folded with it */
        const struct gp_shape *s = &g->values[v].shape;
        int64_t axis = c->axis < 0 ? c->axis + s->rank : c->axis;
        if (axis < 0 || axis >= s->rank)
            return gp_error_set(err, GP_ERR_SHAPE, "node '%s' (SequenceAt): axis %lld of '%s', which has rank %d",
                                c->node, (long long)c->axis, c->value, s->rank);
        int64_t size = s->dims[axis];
        if (c->total >= 0) { /* an explicit split: the position was checked against it */
            if (c->total != size)
                return gp_error_set(err, GP_ERR_SHAPE,
                                    "node '%s' (SequenceAt): the split adds up to %lld, but axis %lld of '%s' has "
                                    "%lld",
                                    c->node, (long long)c->total, (long long)axis, c->value, (long long)size);
            continue;
        }
        int64_t first = c->start < 0 ? c->start + size : c->start;
        if (first < 0 || first >= size)
            return gp_error_set(err, GP_ERR_SHAPE,
                                "node '%s' (SequenceAt): position %lld is past the last chunk (axis %lld of '%s' "
                                "has %lld, in chunks of %lld)",
                                c->node, (long long)c->position, (long long)axis, c->value, (long long)size,
                                (long long)c->chunk);
    }
    return GP_OK;
}
