/* Stage planning's gradient set: regions are shared over time, never while
 * both are alive. For every fixture, cut into 1 to 3 stages, each value's
 * gradient lifetime is derived here from the graph alone (from the
 * backward of its last consumer in the stage, or the start for gradients
 * that arrive from the next stage, to its producer's backward, or the end
 * for the stage's input frontier), and any two values whose lifetimes meet
 * must have disjoint bytes. The set must also be smaller than one region
 * per value on the models with many layers, or sharing does nothing. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/compute.h"
#include "fixtures.h"
#include "graph/layers.h"
#include "onnx/load.h"
#include "ops/backward_reads.h"
#include "ops/registry.h"
#include "pipeline/plan.h"

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static void check_stage(const struct gp_graph *g, const struct gp_layers *l, const bool *needs, int first, int last,
                        size_t *set_bytes, size_t *sum_bytes, int *once_layers)
{
    struct gp_stage_plan p;
    struct gp_error err = {0};
    if (gp_plan_stage(g, l, needs, &gp_cpu_compute_ops, &(struct gp_compute_options){0}, "cpu", first, last, &p, &err) != GP_OK)
        fail_msg("%s", err.msg);
    int nv = g->n_values;
    /* Lifetimes in backward time: t = 0 the start, t = last - i the backward of layer i. */
    int *from = malloc(sizeof(int) * (size_t)(nv + 1)), *to = malloc(sizeof(int) * (size_t)(nv + 1));
    assert_non_null(from);
    assert_non_null(to);
    bool *inbox = calloc((size_t)nv + 1, sizeof(bool));
    assert_non_null(inbox);
    for (int k = 0; k < p.n_frontier_out; k++) inbox[p.frontier_out[k]] = needs[p.frontier_out[k]];
    *set_bytes = p.grad_bytes;
    *sum_bytes = 0;
    for (int v = 0; v < nv; v++) {
        from[v] = INT_MIN;
        if (p.grad_off[v] == SIZE_MAX) continue;
        int producer = g->values[v].producer;
        int last_use = INT_MIN;
        for (int i = first; i < last; i++)
            for (int k = 0; k < g->nodes[i].n_inputs; k++)
                if (g->nodes[i].inputs[k] == v && i > last_use) last_use = i;
        from[v] = inbox[v] ? 0 : last_use != INT_MIN ? last - last_use : last - producer;
        to[v] = producer < first ? last - first + 1 : last - producer;
        assert_true(from[v] <= to[v]);
        size_t size = align64(sizeof(float) * (size_t)gp_shape_numel(&g->values[v].shape));
        assert_true(p.grad_off[v] + size <= p.grad_bytes);
        *sum_bytes += size;
    }
    for (int a = 0; a < nv; a++) {
        if (from[a] == INT_MIN) continue;
        size_t sa = align64(sizeof(float) * (size_t)gp_shape_numel(&g->values[a].shape));
        for (int b = a + 1; b < nv; b++) {
            if (from[b] == INT_MIN || to[a] < from[b] || to[b] < from[a]) continue;
            size_t sb = align64(sizeof(float) * (size_t)gp_shape_numel(&g->values[b].shape));
            if (p.grad_off[a] < p.grad_off[b] + sb && p.grad_off[b] < p.grad_off[a] + sa)
                fail_msg("layers %d-%d: the gradients of '%s' and '%s' are alive together but overlap", first,
                         last - 1, g->values[a].name, g->values[b].name);
        }
    }
    /* Every gradient region is cleared when born: it lies inside one of
     * the merged ranges of its birth time, and the ranges stay in the set. */
    for (int t = 0; t <= last - first; t++) {
        for (int q = p.zero_start[t]; q < p.zero_start[t + 1]; q++)
            assert_true(p.zeros[q].off + p.zeros[q].bytes <= p.grad_bytes);
        for (int q = p.born_start[t]; q < p.born_start[t + 1]; q++) {
            int v = p.born[q];
            size_t size = align64(sizeof(float) * (size_t)gp_shape_numel(&g->values[v].shape));
            bool covered = false;
            for (int r = p.zero_start[t]; r < p.zero_start[t + 1]; r++)
                covered |= p.zeros[r].off <= p.grad_off[v] && p.grad_off[v] + size <= p.zeros[r].off + p.zeros[r].bytes;
            if (!covered) fail_msg("the gradient of '%s' is not cleared when born", g->values[v].name);
        }
    }
    /* The forward arena: values alive together (from their producer's
     * forward to their last reader's) never share bytes, and none of them
     * is read by a backward or leaves the stage. */
    for (int a = 0; a < nv; a++) {
        if (p.home[a] != GP_HOME_ARENA) continue;
        int pa = g->values[a].producer, ea = pa;
        for (int i = first; i < last; i++)
            for (int k = 0; k < g->nodes[i].n_inputs; k++)
                if (g->nodes[i].inputs[k] == a) {
                    if (i > ea) ea = i;
                    const struct gp_node *n = &g->nodes[i];
                    uint32_t din = 0, in = 0, out = 0;
                    for (int q = 0; q < n->n_inputs && q < 32; q++)
                        if (n->inputs[q] >= 0 && needs[n->inputs[q]] && !((n->def->nondiff_inputs >> q) & 1))
                            din |= 1u << q;
                    gp_backward_reads(n, din, &in, &out);
                    if (k < 32 && ((in >> k) & 1) && needs[g->nodes[i].outputs[0]])
                        fail_msg("'%s' is in the arena but layer %d's backward may read it", g->values[a].name, i);
                }
        for (int k = 0; k < p.n_frontier_out; k++)
            if (p.frontier_out[k] == a) fail_msg("'%s' leaves the stage but is in the arena", g->values[a].name);
        size_t sa = align64(gp_value_bytes(&g->values[a]));
        assert_true(p.off[a] + sa <= p.arena_bytes);
        for (int b = a + 1; b < nv; b++) {
            if (p.home[b] != GP_HOME_ARENA) continue;
            int pb = g->values[b].producer, eb = pb;
            for (int i = first; i < last; i++)
                for (int k = 0; k < g->nodes[i].n_inputs; k++)
                    if (g->nodes[i].inputs[k] == b && i > eb) eb = i;
            if (ea < pb || eb < pa) continue;
            size_t sb = align64(gp_value_bytes(&g->values[b]));
            if (p.off[a] < p.off[b] + sb && p.off[b] < p.off[a] + sa)
                fail_msg("layers %d-%d: '%s' and '%s' are alive together in the arena but overlap", first,
                         last - 1, g->values[a].name, g->values[b].name);
        }
    }
    /* Layers computed once per step read static values only, and their
     * outputs stay in the stage. */
    int once = 0;
    for (int i = first; i < last; i++) {
        if (!p.once[i - first]) continue;
        once++;
        const struct gp_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_inputs; k++)
            if (n->inputs[k] >= 0 && p.home[n->inputs[k]] != GP_HOME_STATIC && p.home[n->inputs[k]] != GP_HOME_STEP)
                fail_msg("layer %d ('%s') runs once per step but reads '%s'", i, n->name,
                         g->values[n->inputs[k]].name);
        for (int k = 0; k < n->n_outputs; k++)
            for (int q = 0; q < p.n_frontier_out; q++)
                if (n->outputs[k] >= 0 && p.frontier_out[q] == n->outputs[k])
                    fail_msg("layer %d's output leaves the stage but is made once per step", i);
    }
    *once_layers += once;
    free(from);
    free(to);
    free(inbox);
    gp_plan_free(&p);
}

static void test_gradient_lifetimes(void **state)
{
    (void)state;
    static const char *const fixtures[] = {"mlp_op17", "digits_cnn_op17", "resnet_op17", "unet_op17", "gpt_op17",
                                           "gpt_torch2_op17"};
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        char name[256], path[4096];
        snprintf(name, sizeof name, "%s.onnx", fixtures[f]);
        fixture_path(name, path, sizeof path);
        struct gp_graph g;
        struct gp_layers l;
        struct gp_error err = {0};
        if (gp_onnx_load(path, 4, &g, &err) != GP_OK) fail_msg("%s", err.msg);
        if (gp_layers_build(&g, &l, &err) != GP_OK) fail_msg("%s", err.msg);
        bool *needs = calloc((size_t)g.n_values + 1, sizeof(bool));
        assert_non_null(needs);
        gp_plan_needs_grad(&g, needs);
        size_t whole_set = 0, whole_sum = 0;
        int once = 0;
        for (int k = 1; k <= 3; k++)
            for (int s = 0; s < k; s++) {
                int first = g.n_nodes * s / k, last = g.n_nodes * (s + 1) / k;
                size_t set, sum;
                int stage_once = 0;
                check_stage(&g, &l, needs, first, last, &set, &sum, &stage_once);
                if (k == 1) whole_set = set, whole_sum = sum, once = stage_once;
            }
        printf("%-16s gradient set %8zu bytes, %8zu without sharing; %d layers once per step\n", fixtures[f],
               whole_set, whole_sum, once);
        /* The GPT exports transpose every Linear weight in a layer of its own. */
        if (strncmp(fixtures[f], "gpt", 3) == 0 && once == 0)
            fail_msg("%s: no layer runs once per step", fixtures[f]);
        if (g.n_nodes >= 20 && !(whole_set < whole_sum))
            fail_msg("%s: the gradient set shares nothing (%zu bytes)", fixtures[f], whole_set);
        free(needs);
        gp_layers_free(&l);
        gp_graph_free(&g);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_gradient_lifetimes)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
