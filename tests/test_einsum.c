/* Einsum, lowered at load (onnx/einsum.c): each supported equation loaded
 * from a model built here, run forward against a direct evaluation of the
 * sum the equation names, backward against finite differences (double
 * precision), and in bf16 against fp32; the lowered nodes are the ones
 * expected; equations outside the supported forms are refused at load with
 * a message naming the node, the equation and the reason. */
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

#define MAX_IN 2
#define MAX_RANK 6

/* A model of one Einsum node over float inputs of the given shapes. */
struct einsum_model {
    Onnx__ModelProto m;
    Onnx__GraphProto g;
    Onnx__OperatorSetIdProto opset, *opsets[1];
    Onnx__NodeProto node, *nodes[1];
    Onnx__AttributeProto attr, *attrs[1];
    char *node_in[MAX_IN], *node_out[1];
    Onnx__ValueInfoProto in[MAX_IN], out, *ins[MAX_IN], *outs[1];
    Onnx__TypeProto type[MAX_IN];
    Onnx__TypeProto__Tensor tt[MAX_IN];
    Onnx__TensorShapeProto shape[MAX_IN];
    Onnx__TensorShapeProto__Dimension dims[MAX_IN][MAX_RANK], *dimp[MAX_IN][MAX_RANK];
};

static char *names[MAX_IN] = {"a", "b"};

/* Packs the model; shapes[k] has ranks[k] sizes. */
static uint8_t *einsum_bytes(const char *equation, int n_in, const int *ranks, const int64_t shapes[][MAX_RANK],
                             int64_t opset, size_t *size)
{
    struct einsum_model *md = calloc(1, sizeof *md);
    assert_non_null(md);
    onnx__model_proto__init(&md->m);
    onnx__graph_proto__init(&md->g);
    onnx__operator_set_id_proto__init(&md->opset);
    onnx__node_proto__init(&md->node);
    onnx__attribute_proto__init(&md->attr);
    md->attr.name = "equation";
    md->attr.has_type = 1;
    md->attr.type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
    md->attr.has_s = 1;
    md->attr.s.data = (uint8_t *)equation;
    md->attr.s.len = strlen(equation);
    md->attrs[0] = &md->attr;
    for (int k = 0; k < n_in; k++) {
        md->node_in[k] = names[k];
        onnx__value_info_proto__init(&md->in[k]);
        onnx__type_proto__init(&md->type[k]);
        onnx__type_proto__tensor__init(&md->tt[k]);
        onnx__tensor_shape_proto__init(&md->shape[k]);
        for (int d = 0; d < ranks[k]; d++) {
            onnx__tensor_shape_proto__dimension__init(&md->dims[k][d]);
            md->dims[k][d].value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            md->dims[k][d].dim_value = shapes[k][d];
            md->dimp[k][d] = &md->dims[k][d];
        }
        md->shape[k].n_dim = (size_t)ranks[k];
        md->shape[k].dim = md->dimp[k];
        md->tt[k].has_elem_type = 1;
        md->tt[k].elem_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
        md->tt[k].shape = &md->shape[k];
        md->type[k].value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
        md->type[k].tensor_type = &md->tt[k];
        md->in[k].name = names[k];
        md->in[k].type = &md->type[k];
        md->ins[k] = &md->in[k];
    }
    md->node_out[0] = "y";
    md->node.op_type = "Einsum";
    md->node.name = "attention/Einsum";
    md->node.n_input = (size_t)n_in;
    md->node.input = md->node_in;
    md->node.n_output = 1;
    md->node.output = md->node_out;
    md->node.n_attribute = 1;
    md->node.attribute = md->attrs;
    md->nodes[0] = &md->node;
    onnx__value_info_proto__init(&md->out);
    md->out.name = "y";
    md->outs[0] = &md->out;
    md->g.name = "einsum";
    md->g.n_node = 1;
    md->g.node = md->nodes;
    md->g.n_input = (size_t)n_in;
    md->g.input = md->ins;
    md->g.n_output = 1;
    md->g.output = md->outs;
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
    *size = onnx__model_proto__get_packed_size(&md->m);
    uint8_t *bytes = malloc(*size);
    assert_non_null(bytes);
    onnx__model_proto__pack(&md->m, bytes);
    free(md);
    return bytes;
}

static gp_status load(const char *equation, int n_in, const int *ranks, const int64_t shapes[][MAX_RANK],
                      int64_t opset, struct gp_graph *g, struct gp_error *err)
{
    size_t size;
    uint8_t *bytes = einsum_bytes(equation, n_in, ranks, shapes, opset, &size);
    gp_status st = gp_onnx_load_buffer(bytes, size, ".", 0, g, err);
    free(bytes);
    return st;
}

/* The labels of each term of `eq` (letters only) and the output's, explicit
 * or numpy's implicit one. */
struct terms {
    int n_in;
    char in[MAX_IN][MAX_RANK + 1], out[MAX_RANK + 1];
};

static struct terms terms_of(const char *eq)
{
    struct terms t;
    memset(&t, 0, sizeof t);
    char *dst = t.in[0];
    const char *arrow = strstr(eq, "->");
    for (const char *p = eq; *p && p != arrow; p++) {
        if (*p == ',') dst = t.in[++t.n_in];
        else if (*p != ' ') *dst++ = *p, *dst = 0;
    }
    t.n_in++;
    if (arrow) {
        dst = t.out;
        for (const char *p = arrow + 2; *p; p++)
            if (*p != ' ') *dst++ = *p;
    } else {
        for (char c = 'a'; c <= 'z'; c++) {
            int seen = 0;
            for (int k = 0; k < t.n_in; k++) seen += strchr(t.in[k], c) != NULL;
            if (seen == 1) t.out[strlen(t.out)] = c;
        }
    }
    return t;
}

/* The equation's sum evaluated directly: every assignment of the labels,
 * in double. sizes[c]: the size of label c. */
static double *reference(const struct terms *t, const int64_t *sizes, const float *const *x, int64_t *n_out)
{
    char labels[27] = {0};
    int nl = 0;
    for (int k = 0; k < t->n_in; k++)
        for (const char *p = t->in[k]; *p; p++)
            if (!strchr(labels, *p)) labels[nl++] = *p;
    int64_t total = 1, out_n = 1;
    for (int i = 0; i < nl; i++) total *= sizes[(int)labels[i]];
    for (const char *p = t->out; *p; p++) out_n *= sizes[(int)*p];
    double *y = calloc((size_t)out_n, sizeof *y);
    assert_non_null(y);
    int64_t at[128] = {0};
    for (int64_t e = 0; e < total; e++) {
        int64_t r = e;
        for (int i = nl - 1; i >= 0; i--) {
            at[(int)labels[i]] = r % sizes[(int)labels[i]];
            r /= sizes[(int)labels[i]];
        }
        double prod = 1;
        for (int k = 0; k < t->n_in; k++) {
            int64_t off = 0;
            for (const char *p = t->in[k]; *p; p++) off = off * sizes[(int)*p] + at[(int)*p];
            prod *= x[k][off];
        }
        int64_t off = 0;
        for (const char *p = t->out; *p; p++) off = off * sizes[(int)*p] + at[(int)*p];
        y[off] += prod;
    }
    *n_out = out_n;
    return y;
}

static uint64_t rng = 0x2545f4914f6cdd1dull;

static float uniform(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Loads `eq` with the label sizes given as "i=3,j=4,...", checks the
 * lowered graph's ops (a space-separated list, in order), the forward
 * against the direct sum, the backward against finite differences and bf16
 * against fp32. */
static void check(const char *eq, const char *size_spec, int64_t opset, const char *want_ops)
{
    struct terms t = terms_of(eq);
    int64_t sizes[128] = {0};
    for (const char *p = size_spec; *p; p++)
        if (p[1] == '=') sizes[(int)p[0]] = strtol(p + 2, NULL, 10);
    int ranks[MAX_IN];
    int64_t shapes[MAX_IN][MAX_RANK];
    float *x[MAX_IN];
    for (int k = 0; k < t.n_in; k++) {
        ranks[k] = (int)strlen(t.in[k]);
        int64_t n = 1;
        for (int d = 0; d < ranks[k]; d++) n *= shapes[k][d] = sizes[(int)t.in[k][d]];
        x[k] = malloc(sizeof(float) * (size_t)n);
        assert_non_null(x[k]);
        for (int64_t i = 0; i < n; i++) x[k][i] = uniform();
    }
    struct gp_graph g;
    struct gp_error err = {0};
    if (load(eq, t.n_in, ranks, shapes, opset, &g, &err) != GP_OK) fail_msg("'%s': %s", eq, err.msg);

    char ops[256] = "";
    for (int i = 0; i < g.n_nodes; i++)
        snprintf(ops + strlen(ops), sizeof ops - strlen(ops), "%s%s", i ? " " : "", g.nodes[i].op_type);
    if (strcmp(ops, want_ops)) fail_msg("'%s' (opset %lld): lowered to '%s', expected '%s'", eq, (long long)opset, ops, want_ops);

    int64_t n_out;
    double *want = reference(&t, sizes, (const float *const *)x, &n_out);
    const struct gp_value *y = &g.values[g.outputs[0]];
    if (gp_shape_numel(&y->shape) != n_out || y->shape.rank != (int)strlen(t.out))
        fail_msg("'%s': output of %lld elements, rank %d; expected %lld, rank %d", eq,
                 (long long)gp_shape_numel(&y->shape), y->shape.rank, (long long)n_out, (int)strlen(t.out));
    for (int d = 0; d < y->shape.rank; d++)
        if (y->shape.dims[d] != sizes[(int)t.out[d]])
            fail_msg("'%s': output axis %d is %lld, label '%c' has %lld", eq, d, (long long)y->shape.dims[d],
                     t.out[d], (long long)sizes[(int)t.out[d]]);
    float *got = malloc(sizeof(float) * (size_t)n_out);
    assert_non_null(got);
    const void *inputs[MAX_IN] = {x[0], t.n_in > 1 ? x[1] : NULL};
    void *outputs[1] = {got};
    op_forward_f32(&g, inputs, outputs, false);
    for (int64_t i = 0; i < n_out; i++)
        if (!(fabs(got[i] - want[i]) <= 1e-5 * (1 + fabs(want[i]))))
            fail_msg("'%s': element %lld is %.9g, the direct sum %.9g", eq, (long long)i, (double)got[i], want[i]);

    struct op_check_opts o = {.seed = 7};
    op_gradcheck(&g, &o);
    op_bf16_vs_f32(&g, &o);
    printf("%-28s opset %2lld: %-34s forward, gradient and bf16 checked\n", eq, (long long)opset, ops);
    free(got);
    free(want);
    for (int k = 0; k < t.n_in; k++) free(x[k]);
    gp_graph_free(&g);
}

/* Attention as maxvit exports it, and batched products whose operands and
 * output need permuting. */
static void test_batched_products(void **state)
{
    (void)state;
    check("bghid,bghjd->bghij", "b=2,g=3,h=2,i=4,j=5,d=3", 17, "Transpose MatMul");
    check("bghij,bghjd->bghid", "b=2,g=3,h=2,i=4,j=5,d=3", 17, "MatMul");
    check("bij,bjk->bik", "b=3,i=2,j=4,k=5", 13, "MatMul");
    check("ikb,bkj->bji", "b=3,i=2,j=4,k=5", 17, "Transpose MatMul Transpose");
    check("kib,jbk->bij", "b=3,i=2,j=4,k=5", 17, "Transpose Transpose MatMul");
    check("B G H I D, B G H J D -> B G H I J", "B=2,G=2,H=3,I=3,J=4,D=2", 17, "Transpose MatMul");
    check("ij,jk", "i=3,j=4,k=2", 12, "MatMul");        /* implicit output: ik */
    check("hij,hjk->hki", "h=2,i=3,j=4,k=2", 17, "MatMul Transpose");
}

/* One operand: permutations and sums, ReduceSum's axes as an input (opset
 * 13 and later) and as an attribute (opset 12). */
static void test_one_operand(void **state)
{
    (void)state;
    check("ijk->kij", "i=2,j=3,k=4", 17, "Transpose");
    check("ijk->ik", "i=2,j=3,k=4", 17, "ReduceSum");
    check("ijk->ki", "i=2,j=3,k=4", 17, "ReduceSum Transpose");
    check("ijk->ki", "i=2,j=3,k=4", 12, "ReduceSum Transpose");
    check("ij->", "i=3,j=4", 13, "ReduceSum");
    check("ij->ij", "i=3,j=4", 17, "Identity");
}

static void refused(const char *eq, int n_in, const char *why)
{
    int ranks[MAX_IN] = {2, 2};
    int64_t shapes[MAX_IN][MAX_RANK] = {{3, 3}, {3, 3}};
    struct terms t = terms_of(eq);
    for (int k = 0; k < n_in && strchr(eq, '.') == NULL; k++) ranks[k] = (int)strlen(t.in[k]);
    for (int k = 0; k < n_in; k++)
        for (int d = 0; d < ranks[k]; d++) shapes[k][d] = 3;
    struct gp_graph g;
    struct gp_error err = {0};
    if (load(eq, n_in, ranks, shapes, 17, &g, &err) == GP_OK) {
        gp_graph_free(&g);
        fail_msg("'%s' loaded; it should be refused (%s)", eq, why);
    }
    char want[256];
    snprintf(want, sizeof want, "equation '%s'", eq);
    if (!strstr(err.msg, "attention/Einsum") || !strstr(err.msg, want) || !strstr(err.msg, why))
        fail_msg("'%s': the message '%s' should name the node, the equation and '%s'", eq, err.msg, why);
    printf("refused %-22s %s\n", eq, err.msg);
}

static void test_refusals(void **state)
{
    (void)state;
    refused("ii->i", 1, "repeated within one term");
    refused("...ij,...jk->...ik", 2, "an ellipsis");
    refused("i,i", 2, "not exactly one label of each operand's own");
    refused("ij,j->i", 2, "not exactly one label of each operand's own");
    refused("ij,kl->ijkl", 2, "not exactly one label summed");
    refused("ij,jk->k", 2, "summed within one operand only");
    refused("ij,jk->iz", 2, "an output label that no operand has");
    refused("ij->ji", 2, "has 1 operand, the node 2");
}

/* An operand whose rank is not its term's length: an error at load (the
 * lowered ops' shape checks), never a wrong result. */
static void test_rank_mismatch(void **state)
{
    (void)state;
    const char *eqs[3] = {"ij->ji", "ij,jk->ik", "bij,bjk->bik"};
    const int n_in[3] = {1, 2, 2};
    const int ranks[3][MAX_IN] = {{3, 0}, {3, 2}, {2, 3}};
    for (int c = 0; c < 3; c++) {
        int64_t shapes[MAX_IN][MAX_RANK] = {{3, 3, 3}, {3, 3, 3}};
        struct gp_graph g;
        struct gp_error err = {0};
        if (load(eqs[c], n_in[c], ranks[c], shapes, 17, &g, &err) == GP_OK) {
            gp_graph_free(&g);
            fail_msg("'%s' with an operand of rank %d loaded", eqs[c], ranks[c][0]);
        }
        printf("refused %-22s %s\n", eqs[c], err.msg);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_products),
        cmocka_unit_test(test_one_operand),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_rank_mismatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
