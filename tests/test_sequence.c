/* SplitToSequence read by SequenceAt, lowered at load (onnx/sequence.c):
 * models built here with equal chunks (a scalar split, the last chunk
 * shorter, as torch.split exports), an explicit split, and chunks of one
 * with keepdims=0 (torch.unbind), their positions as Constant nodes (as the
 * dynamo exporter writes them) or initializers, negative ones too; each
 * loaded into the expected Slice / Squeeze nodes, run forward against the
 * chunks taken directly, backward against finite differences and in bf16
 * against fp32. Every other use of a sequence is refused at load with a
 * message naming the node. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx.pb-c.h"
#include "onnx/load.h"
#include "op_check.h"

#define MAX_NODES 12
#define MAX_CONSTS 8
#define MAX_OUTS 4

/* x: float [2, 7, 3], plus an int64 scalar input 'p' when asked. */
static const int64_t x_dims[3] = {2, 7, 3};

struct model {
    Onnx__ModelProto m;
    Onnx__GraphProto g;
    Onnx__OperatorSetIdProto opset, *opsets[1];
    Onnx__NodeProto node[MAX_NODES], *nodes[MAX_NODES];
    Onnx__AttributeProto attr[MAX_NODES][2], *attrs[MAX_NODES][2];
    char *node_in[MAX_NODES][2], *node_out[MAX_NODES][1];
    Onnx__TensorProto t[MAX_CONSTS], *inits[MAX_CONSTS];
    int64_t t_data[MAX_CONSTS][8], t_dims[MAX_CONSTS][1];
    Onnx__ValueInfoProto in[2], out[MAX_OUTS], *ins[2], *outs[MAX_OUTS];
    Onnx__TypeProto type[2];
    Onnx__TypeProto__Tensor tt[2];
    Onnx__TensorShapeProto shape[2];
    Onnx__TensorShapeProto__Dimension dims[3], *dimp[3];
    int n_t;
};

static struct model *model_new(int64_t opset, bool p_input)
{
    struct model *md = calloc(1, sizeof *md);
    assert_non_null(md);
    onnx__model_proto__init(&md->m);
    onnx__graph_proto__init(&md->g);
    onnx__operator_set_id_proto__init(&md->opset);
    md->opset.has_version = 1;
    md->opset.version = opset;
    md->opset.domain = "";
    md->opsets[0] = &md->opset;
    md->m.has_ir_version = 1;
    md->m.ir_version = 8;
    md->m.producer_name = "test";
    md->m.n_opset_import = 1;
    md->m.opset_import = md->opsets;
    md->m.graph = &md->g;
    md->g.name = "sequence";
    md->g.node = md->nodes;
    md->g.initializer = md->inits;
    md->g.input = md->ins;
    md->g.output = md->outs;
    for (int k = 0; k < (p_input ? 2 : 1); k++) {
        onnx__value_info_proto__init(&md->in[k]);
        onnx__type_proto__init(&md->type[k]);
        onnx__type_proto__tensor__init(&md->tt[k]);
        onnx__tensor_shape_proto__init(&md->shape[k]);
        md->tt[k].has_elem_type = 1;
        md->tt[k].elem_type = k ? ONNX__TENSOR_PROTO__DATA_TYPE__INT64 : ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
        md->tt[k].shape = &md->shape[k];
        md->type[k].value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
        md->type[k].tensor_type = &md->tt[k];
        md->in[k].name = k ? "p" : "x";
        md->in[k].type = &md->type[k];
        md->ins[k] = &md->in[k];
    }
    for (int d = 0; d < 3; d++) {
        onnx__tensor_shape_proto__dimension__init(&md->dims[d]);
        md->dims[d].value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
        md->dims[d].dim_value = x_dims[d];
        md->dimp[d] = &md->dims[d];
    }
    md->shape[0].n_dim = 3;
    md->shape[0].dim = md->dimp;
    md->g.n_input = p_input ? 2 : 1;
    return md;
}

/* A node of up to two inputs (NULL: absent) and one output, with up to
 * two int attributes (name NULL: none). */
static Onnx__NodeProto *node(struct model *md, const char *op, const char *name, const char *a, const char *b,
                             const char *out, const char *k0, int64_t v0, const char *k1, int64_t v1)
{
    int i = (int)md->g.n_node++;
    assert_true(i < MAX_NODES);
    Onnx__NodeProto *np = &md->node[i];
    onnx__node_proto__init(np);
    np->op_type = (char *)op;
    np->name = (char *)name;
    md->node_in[i][0] = (char *)a;
    md->node_in[i][1] = (char *)b;
    np->n_input = b ? 2 : 1;
    np->input = md->node_in[i];
    md->node_out[i][0] = (char *)out;
    np->n_output = 1;
    np->output = md->node_out[i];
    const char *keys[2] = {k0, k1};
    const int64_t vals[2] = {v0, v1};
    for (int k = 0; k < 2 && keys[k]; k++) {
        Onnx__AttributeProto *at = &md->attr[i][k];
        onnx__attribute_proto__init(at);
        at->name = (char *)keys[k];
        at->has_type = 1;
        at->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
        at->has_i = 1;
        at->i = vals[k];
        md->attrs[i][k] = at;
        np->n_attribute = (size_t)k + 1;
    }
    np->attribute = md->attrs[i];
    md->nodes[i] = np;
    return np;
}

/* An int64 constant: a scalar (n < 0, value v[0]) or a list of n, as an
 * initializer or a Constant node. */
static void constant(struct model *md, const char *name, const int64_t *v, int n, bool as_node)
{
    int k = md->n_t++;
    assert_true(k < MAX_CONSTS);
    Onnx__TensorProto *tp = &md->t[k];
    onnx__tensor_proto__init(tp);
    tp->has_data_type = 1;
    tp->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
    int count = n < 0 ? 1 : n;
    if (n >= 0) {
        md->t_dims[k][0] = n;
        tp->n_dims = 1;
        tp->dims = md->t_dims[k];
    }
    memcpy(md->t_data[k], v, sizeof(int64_t) * (size_t)count);
    tp->n_int64_data = (size_t)count;
    tp->int64_data = md->t_data[k];
    if (!as_node) {
        tp->name = (char *)name;
        md->inits[md->g.n_initializer++] = tp;
        return;
    }
    Onnx__NodeProto *np = node(md, "Constant", name, NULL, NULL, name, NULL, 0, NULL, 0);
    np->n_input = 0;
    Onnx__AttributeProto *at = &md->attr[np - md->node][0];
    onnx__attribute_proto__init(at);
    at->name = "value";
    at->has_type = 1;
    at->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR;
    at->t = tp;
    md->attrs[np - md->node][0] = at;
    np->n_attribute = 1;
}

static void output(struct model *md, const char *name)
{
    int k = (int)md->g.n_output++;
    assert_true(k < MAX_OUTS);
    onnx__value_info_proto__init(&md->out[k]);
    md->out[k].name = (char *)name;
    md->outs[k] = &md->out[k];
}

static gp_status load(struct model *md, struct gp_graph *g, struct gp_error *err)
{
    size_t size = onnx__model_proto__get_packed_size(&md->m);
    uint8_t *bytes = malloc(size);
    assert_non_null(bytes);
    onnx__model_proto__pack(&md->m, bytes);
    free(md);
    gp_status st = gp_onnx_load_buffer(bytes, size, ".", 0, g, err);
    free(bytes);
    return st;
}

/* One chunk the model should give: x[..., first:first+len, ...] on `axis`,
 * that axis dropped when `squeeze`. */
struct chunk {
    int axis;
    int64_t first, len;
    bool squeeze;
};

static uint64_t rng = 0x2545f4914f6cdd1dull;

static float uniform(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Loads md, checks the lowered ops (want_ops: their types in alphabetical
 * order), each output against its chunk taken
 * from x directly, the gradient and bf16. */
static void check(struct model *md, const char *what, const char *want_ops, int n_chunks, const struct chunk *want)
{
    struct gp_graph g;
    struct gp_error err = {0};
    if (load(md, &g, &err) != GP_OK) fail_msg("%s: %s", what, err.msg);
    /* In alphabetical order: the nodes' own order is the topological sort's. */
    const char *sorted[MAX_NODES * 2];
    assert_true(g.n_nodes <= MAX_NODES * 2);
    for (int i = 0; i < g.n_nodes; i++) {
        int j = i;
        for (; j > 0 && strcmp(sorted[j - 1], g.nodes[i].op_type) > 0; j--) sorted[j] = sorted[j - 1];
        sorted[j] = g.nodes[i].op_type;
    }
    char ops[256] = "";
    for (int i = 0; i < g.n_nodes; i++)
        snprintf(ops + strlen(ops), sizeof ops - strlen(ops), "%s%s", i ? " " : "", sorted[i]);
    if (strcmp(ops, want_ops)) fail_msg("%s: lowered to '%s', expected '%s'", what, ops, want_ops);
    assert_int_equal(g.n_outputs, n_chunks);

    float x[2 * 7 * 3];
    for (int i = 0; i < 42; i++) x[i] = uniform();
    float *got[MAX_OUTS];
    void *outs[MAX_OUTS];
    for (int k = 0; k < n_chunks; k++) outs[k] = got[k] = calloc(42, sizeof(float));
    const void *inputs[1] = {x};
    op_forward_f32(&g, inputs, outs, false);
    for (int k = 0; k < n_chunks; k++) {
        const struct chunk *c = &want[k];
        const struct gp_shape *s = &g.values[g.outputs[k]].shape;
        int64_t d[3] = {x_dims[0], x_dims[1], x_dims[2]};
        d[c->axis] = c->len;
        int rank = c->squeeze ? 2 : 3;
        bool shape_ok = s->rank == rank;
        for (int a = 0, r = 0; shape_ok && a < 3; a++) {
            if (c->squeeze && a == c->axis) continue;
            shape_ok = s->dims[r++] == d[a];
        }
        if (!shape_ok) fail_msg("%s: output %d has rank %d, first axis %lld", what, k, s->rank, (long long)s->dims[0]);
        int64_t at = 0;
        for (int64_t i = 0; i < d[0]; i++)
            for (int64_t j = 0; j < d[1]; j++)
                for (int64_t l = 0; l < d[2]; l++) {
                    int64_t src[3] = {i, j, l};
                    src[c->axis] += c->first;
                    float w = x[(src[0] * x_dims[1] + src[1]) * x_dims[2] + src[2]];
                    if (got[k][at] != w)
                        fail_msg("%s: output %d element %lld is %g, x's %g", what, k, (long long)at, (double)got[k][at],
                                 (double)w);
                    at++;
                }
        free(got[k]);
    }
    struct op_check_opts o = {.seed = 11};
    op_gradcheck(&g, &o);
    op_bf16_vs_f32(&g, &o);
    printf("%-44s %-28s forward, gradient and bf16 checked\n", what, ops);
    gp_graph_free(&g);
}

/* torch.split(x, 3, dim=1) as the dynamo exporter writes it: a scalar
 * split, positions as Constant nodes; 7 = 3 + 3 + 1. */
static void test_equal_chunks(void **state)
{
    (void)state;
    struct model *md = model_new(20, false);
    constant(md, "size", (const int64_t[]){3}, -1, true);
    node(md, "SplitToSequence", "node_split", "x", "size", "split", "axis", 1, "keepdims", 1);
    const char *pos[3] = {"i0", "i1", "i2"}, *outs[3] = {"getitem", "getitem_1", "getitem_2"};
    const char *names[3] = {"n0", "n0_2", "n0_3"};
    for (int k = 0; k < 3; k++) {
        constant(md, pos[k], (const int64_t[]){k}, -1, true);
        node(md, "SequenceAt", names[k], "split", pos[k], outs[k], NULL, 0, NULL, 0);
        output(md, outs[k]);
    }
    check(md, "scalar split 3 of 7, positions 0 1 2", "Slice Slice Slice", 3,
          (const struct chunk[]){{1, 0, 3, false}, {1, 3, 3, false}, {1, 6, 1, false}});
}

/* An explicit split as an initializer, negative positions, and a
 * keepdims=0 that a given split makes no difference to. */
static void test_explicit_split(void **state)
{
    (void)state;
    struct model *md = model_new(17, false);
    constant(md, "sizes", (const int64_t[]){2, 4, 1}, 3, false);
    constant(md, "last", (const int64_t[]){-1}, -1, false);
    constant(md, "middle", (const int64_t[]){-2}, -1, false);
    node(md, "SplitToSequence", "split", "x", "sizes", "seq", "axis", -2, "keepdims", 0);
    node(md, "SequenceAt", "at_last", "seq", "last", "y0", NULL, 0, NULL, 0);
    node(md, "SequenceAt", "at_middle", "seq", "middle", "y1", NULL, 0, NULL, 0);
    output(md, "y0");
    output(md, "y1");
    check(md, "split [2, 4, 1] on axis -2, positions -1 -2", "Slice Slice", 2,
          (const struct chunk[]){{1, 6, 1, false}, {1, 2, 4, false}});
}

/* No split: chunks of one; keepdims=0 drops the axis (torch.unbind), with
 * Squeeze's axes an input (opset 13 on) or an attribute (opset 12). */
static void test_unbind(void **state)
{
    (void)state;
    for (int64_t opset = 12; opset <= 17; opset += 5) {
        struct model *md = model_new(opset, false);
        constant(md, "first", (const int64_t[]){0}, -1, true);
        constant(md, "last", (const int64_t[]){-1}, -1, false);
        node(md, "SplitToSequence", "unbind", "x", NULL, "seq", "axis", 2, "keepdims", 0);
        node(md, "SequenceAt", "at_first", "seq", "first", "y0", NULL, 0, NULL, 0);
        node(md, "SequenceAt", "at_last", "seq", "last", "y1", NULL, 0, NULL, 0);
        output(md, "y0");
        output(md, "y1");
        char what[64];
        snprintf(what, sizeof what, "unbind axis 2, positions 0 -1 (opset %lld)", (long long)opset);
        check(md, what, "Slice Slice Squeeze Squeeze", 2, (const struct chunk[]){{2, 0, 1, true}, {2, 2, 1, true}});
    }
    struct model *md = model_new(17, false);
    constant(md, "one", (const int64_t[]){1}, -1, false);
    node(md, "SplitToSequence", "chunks", "x", NULL, "seq", "axis", 0, NULL, 0);
    node(md, "SequenceAt", "at", "seq", "one", "y", NULL, 0, NULL, 0);
    output(md, "y");
    check(md, "chunks of 1 on axis 0 kept, position 1", "Slice", 1, (const struct chunk[]){{0, 1, 1, false}});
}

static void refused(struct model *md, const char *what, const char *node_name, const char *why)
{
    struct gp_graph g;
    struct gp_error err = {0};
    if (load(md, &g, &err) == GP_OK) {
        gp_graph_free(&g);
        fail_msg("%s loaded; it should be refused (%s)", what, why);
    }
    char want[128];
    snprintf(want, sizeof want, "node '%s'", node_name);
    if (!strstr(err.msg, want) || !strstr(err.msg, why))
        fail_msg("%s: the message '%s' should name node '%s' and say '%s'", what, err.msg, node_name, why);
    printf("refused %-40s %s\n", what, err.msg);
}

/* x split in threes along axis 1, read at `at` by SequenceAt 'n0'. */
static struct model *split3(const int64_t *sizes, int n_sizes, bool p_input)
{
    struct model *md = model_new(20, p_input);
    constant(md, "size", sizes, n_sizes, false);
    node(md, "SplitToSequence", "node_split", "x", "size", "split", "axis", 1, NULL, 0);
    return md;
}

static void test_refusals(void **state)
{
    (void)state;
    struct model *md = split3((const int64_t[]){3}, -1, false);
    node(md, "ConcatFromSequence", "concat", "split", NULL, "y", "axis", 1, NULL, 0);
    output(md, "y");
    refused(md, "a sequence read by ConcatFromSequence", "node_split", "read by node 'concat' (ConcatFromSequence)");

    md = split3((const int64_t[]){3}, -1, false);
    output(md, "split");
    refused(md, "a sequence as a graph output", "node_split", "is a graph output");

    md = split3((const int64_t[]){3}, -1, true);
    node(md, "SequenceAt", "n0", "split", "p", "y", NULL, 0, NULL, 0);
    output(md, "y");
    refused(md, "a position from a graph input", "n0", "position 'p' is not a constant");

    md = model_new(20, true);
    node(md, "SplitToSequence", "node_split", "x", "p", "split", "axis", 1, NULL, 0);
    constant(md, "i", (const int64_t[]){0}, -1, false);
    node(md, "SequenceAt", "n0", "split", "i", "y", NULL, 0, NULL, 0);
    output(md, "y");
    refused(md, "a split from a graph input", "node_split", "split 'p' is not a constant");

    md = split3((const int64_t[]){3}, -1, false);
    constant(md, "i", (const int64_t[]){-1}, -1, false);
    node(md, "SequenceAt", "n0", "split", "i", "y", NULL, 0, NULL, 0);
    output(md, "y");
    refused(md, "a negative position into equal chunks", "n0", "counts from the end of equal chunks");

    md = split3((const int64_t[]){3}, -1, false);
    constant(md, "i", (const int64_t[]){3}, -1, false);
    node(md, "SequenceAt", "n0", "split", "i", "y", NULL, 0, NULL, 0);
    output(md, "y");
    refused(md, "position 3 of 7 in threes", "n0", "position 3 is past the last chunk");

    md = split3((const int64_t[]){2, 4}, 2, false);
    constant(md, "i", (const int64_t[]){0}, -1, false);
    node(md, "SequenceAt", "n0", "split", "i", "y", NULL, 0, NULL, 0);
    output(md, "y");
    refused(md, "a split [2, 4] of 7", "n0", "the split adds up to 6, but axis 1 of 'x' has 7");

    md = split3((const int64_t[]){2, 5}, 2, false);
    constant(md, "i", (const int64_t[]){2}, -1, false);
    node(md, "SequenceAt", "n0", "split", "i", "y", NULL, 0, NULL, 0);
    output(md, "y");
    refused(md, "position 2 of a split [2, 5]", "n0", "position 2, but node 'node_split' makes 2 chunks");

    md = model_new(20, false);
    constant(md, "i", (const int64_t[]){0}, -1, false);
    node(md, "SequenceConstruct", "construct", "x", NULL, "seq", NULL, 0, NULL, 0);
    node(md, "SequenceAt", "n0", "seq", "i", "y", NULL, 0, NULL, 0);
    output(md, "y");
    refused(md, "a sequence from SequenceConstruct", "n0", "comes from node 'construct'");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equal_chunks),
        cmocka_unit_test(test_explicit_split),
        cmocka_unit_test(test_unbind),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
