/* Stage planning. The schedules' buffer slots (test_schedule_slots, below)
 * first, then the gradient set.
 *
 * The gradient set: regions are shared over time, never while
 * both are alive. For every fixture, cut into 1 to 3 stages, each value's
 * gradient lifetime is derived here from the graph alone (from the
 * backward of its last consumer in the stage, or the start for gradients
 * that arrive from the next stage, to its producer's backward, or the end
 * for the stage's input frontier), and any two values whose lifetimes meet
 * must have disjoint bytes (in the gradient set, or in the activation
 * set's dead bytes, where a region covers only bytes no backward reads
 * after its birth). The set must also be smaller than one region per
 * value on the models with many layers, or sharing does nothing. */
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
#include "pipeline/slots.h"

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* The input gradients node n's backward is asked for (bit k: input k). */
static uint32_t wanted_din(const struct gp_node *n, const bool *needs)
{
    uint32_t din = 0;
    for (int q = 0; q < n->n_inputs && q < 32; q++)
        if (n->inputs[q] >= 0 && needs[n->inputs[q]] && !((n->def->nondiff_inputs >> q) & 1)) din |= 1u << q;
    return din;
}

/* A gradient region placed in the activation set (plan.h, grad_in_set)
 * covers only bytes no backward reads after its birth (before layer
 * `birth`'s backward): kept values whose last backward reader (the lowest
 * layer, read_min) comes before it, and saved state of layers above it. */
static void check_in_set(const struct gp_graph *g, const struct gp_stage_plan *p, const int *read_min, int v,
                         size_t o, int birth, size_t size)
{
    if (o + size > p->local_bytes) fail_msg("the gradient of '%s' lies past the activation set", g->values[v].name);
    for (int u = 0; u < g->n_values; u++) {
        if (p->home[u] != GP_HOME_LOCAL) continue;
        size_t su = align64(gp_value_bytes(&g->values[u]));
        if (!(p->off[u] < o + size && o < p->off[u] + su)) continue;
        bool leaves = false;
        for (int k = 0; k < p->n_frontier_out; k++) leaves |= p->frontier_out[k] == u;
        if (read_min[u] == INT_MAX || read_min[u] <= birth || leaves)
            fail_msg("the gradient of '%s', born at layer %d's backward, lies in the set over '%s', read by "
                     "layer %d's backward", g->values[v].name, birth, g->values[u].name, read_min[u]);
    }
    for (int i = p->first; i < p->last; i++) {
        size_t ss = align64(gp_cpu_compute_ops.saved_bytes(g, &g->nodes[i]));
        if (ss && p->saved_off[i - p->first] < o + size && o < p->saved_off[i - p->first] + ss && i <= birth)
            fail_msg("the gradient of '%s', born at layer %d's backward, lies over layer %d's saved state",
                     g->values[v].name, birth, i);
    }
}

/* Gradient addends (plan.h, addend_off) of a plan whose backend takes them
 * wherever its kernels write a gradient whole: the writer is the value's
 * first reader in a differentiable slot (the last backward to add into
 * it), of two or more terms, reads it once and writes it whole there;
 * the producer is the stage's, per micro-batch, the value its output 0;
 * the region, alive from the writer's backward to the producer's, meets
 * no gradient region or other addend alive with it, and in the activation
 * set lies over dead bytes only. from/to: the gradients' lifetimes in
 * backward time (INT_MIN: none), as check_stage computes them. */
static void check_addends(const struct gp_graph *g, const struct gp_stage_plan *p, const bool *inbox,
                          const int *read_min, const int *from, const int *to, int *addends)
{
    int first = p->first, last = p->last;
    for (int v = 0; v < g->n_values; v++) {
        int w = p->addend_writer[v];
        if (w == INT_MIN) continue;
        (*addends)++;
        int prod = g->values[v].producer;
        if (!(prod >= first && prod < w && w < last && !p->once[w - first] && !p->once[prod - first] &&
              g->nodes[prod].outputs[0] == v && !inbox[v] && !g->values[v].is_output && from[v] != INT_MIN))
            fail_msg("the last term of the gradient of '%s' is written by layer %d, made by layer %d: not a pair "
                     "the plan may split", g->values[v].name, w, prod);
        int terms = 0, low = INT_MAX, reads = 0;
        for (int i = prod + 1; i < last; i++)
            for (int k = 0; k < g->nodes[i].n_inputs; k++)
                if (g->nodes[i].inputs[k] == v && !(k < 32 && ((g->nodes[i].def->nondiff_inputs >> k) & 1))) {
                    terms++;
                    if (i < low) low = i;
                }
        for (int k = 0; k < g->nodes[w].n_inputs; k++)
            if (g->nodes[w].inputs[k] == v) {
                reads++;
                if (k >= 32 || !((p->din_overwrite[w - first] >> k) & 1))
                    fail_msg("layer %d writes the last term of the gradient of '%s' but not whole", w,
                             g->values[v].name);
            }
        if (low != w || reads != 1 || terms < 2)
            fail_msg("the last term of the gradient of '%s': layer %d writes it, but the first reader is layer %d "
                     "(%d terms, %d reads there)", g->values[v].name, w, low, terms, reads);
        int af = last - w, at = last - prod;
        size_t size = align64(sizeof(float) * (size_t)gp_shape_numel(&g->values[v].shape)), o = p->addend_off[v];
        if (p->addend_in_set[v])
            check_in_set(g, p, read_min, v, o, w, size);
        else
            assert_true(o + size <= p->grad_bytes);
        for (int u = 0; u < g->n_values; u++) {
            if (from[u] == INT_MIN || to[u] < af || at < from[u] || p->grad_in_set[u] != p->addend_in_set[v]) continue;
            size_t su = align64(sizeof(float) * (size_t)gp_shape_numel(&g->values[u].shape));
            if (p->grad_off[u] < o + size && o < p->grad_off[u] + su)
                fail_msg("the last term of the gradient of '%s' overlaps the gradient of '%s', alive with it",
                         g->values[v].name, g->values[u].name);
        }
        for (int u = v + 1; u < g->n_values; u++) {
            int wu = p->addend_writer[u];
            if (wu == INT_MIN || last - g->values[u].producer < af || at < last - wu ||
                p->addend_in_set[u] != p->addend_in_set[v])
                continue;
            size_t su = align64(sizeof(float) * (size_t)gp_shape_numel(&g->values[u].shape));
            if (p->addend_off[u] < o + size && o < p->addend_off[u] + su)
                fail_msg("the last terms of the gradients of '%s' and '%s' overlap, alive together", g->values[v].name,
                         g->values[u].name);
        }
    }
}

/* Backward workspaces check_stage found in the activation sets, forward
 * ones in the arena. */
static int workspaces_in_sets, workspaces_in_arena;

static void check_stage(const struct gp_graph *g, const struct gp_layers *l, const bool *needs,
                        const struct gp_compute_ops *ops, int first, int last, size_t *set_bytes, size_t *sum_bytes,
                        int *once_layers, int *overwritten, int *in_set, int *addends)
{
    struct gp_stage_plan p;
    struct gp_error err = {0};
    if (gp_plan_stage(g, l, needs, ops, &(struct gp_compute_options){0}, "cpu", first, last, &p, &err) != GP_OK)
        fail_msg("%s", err.msg);
    int nv = g->n_values;
    /* Lifetimes in backward time: t = 0 the start, t = last - i the backward of layer i. */
    int *from = malloc(sizeof(int) * (size_t)(nv + 1)), *to = malloc(sizeof(int) * (size_t)(nv + 1));
    assert_non_null(from);
    assert_non_null(to);
    bool *inbox = calloc((size_t)nv + 1, sizeof(bool));
    assert_non_null(inbox);
    for (int k = 0; k < p.n_frontier_out; k++) inbox[p.frontier_out[k]] = needs[p.frontier_out[k]];
    /* The last layer (lowest) whose backward reads each value. */
    int *read_min = malloc(sizeof(int) * (size_t)(nv + 1));
    assert_non_null(read_min);
    for (int v = 0; v < nv; v++) read_min[v] = INT_MAX;
    for (int i = last - 1; i >= first; i--) {
        const struct gp_node *n = &g->nodes[i];
        uint32_t din = wanted_din(n, needs), in = 0, out = 0;
        bool flows = false;
        for (int k = 0; k < n->n_outputs; k++) flows |= n->outputs[k] >= 0 && needs[n->outputs[k]];
        if (!din || !flows) continue;
        gp_backward_reads(n, din, &in, &out);
        for (int k = 0; k < n->n_inputs; k++)
            if (n->inputs[k] >= 0 && (k >= 32 || ((in >> k) & 1))) read_min[n->inputs[k]] = i;
        for (int k = 0; k < n->n_outputs; k++)
            if (n->outputs[k] >= 0 && (k >= 32 || ((out >> k) & 1))) read_min[n->outputs[k]] = i;
    }
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
        if (p.grad_in_set[v]) {
            assert_false(inbox[v] || producer < first); /* never the frontiers' */
            check_in_set(g, &p, read_min, v, p.grad_off[v], last - from[v], size);
            (*in_set)++;
        } else {
            assert_true(p.grad_off[v] + size <= p.grad_bytes);
        }
        *sum_bytes += size;
    }
    for (int a = 0; a < nv; a++) {
        if (from[a] == INT_MIN) continue;
        size_t sa = align64(sizeof(float) * (size_t)gp_shape_numel(&g->values[a].shape));
        for (int b = a + 1; b < nv; b++) {
            if (from[b] == INT_MIN || to[a] < from[b] || to[b] < from[a] || p.grad_in_set[a] != p.grad_in_set[b])
                continue;
            size_t sb = align64(sizeof(float) * (size_t)gp_shape_numel(&g->values[b].shape));
            if (p.grad_off[a] < p.grad_off[b] + sb && p.grad_off[b] < p.grad_off[a] + sa)
                fail_msg("layers %d-%d: the gradients of '%s' and '%s' are alive together but overlap", first,
                         last - 1, g->values[a].name, g->values[b].name);
        }
    }
    check_addends(g, &p, inbox, read_min, from, to, addends);
    /* Backward workspaces in the set (plan.h, bwd_scratch_off): aligned,
     * inside the set, over bytes no backward from theirs on reads, and
     * apart from every gradient in the set alive at their layer's backward. */
    for (int i = first; i < last; i++) {
        size_t o = p.bwd_scratch_off[i - first], ws = p.bwd_scratch_bytes[i - first];
        if (o == SIZE_MAX) {
            assert_true(ws <= p.scratch_bytes); /* else the block holds it */
            continue;
        }
        assert_true(ws > 0 && o % GP_SCRATCH_ALIGN == 0 && o + ws <= p.local_bytes);
        for (int u = 0; u < nv; u++) {
            if (p.home[u] != GP_HOME_LOCAL) continue;
            size_t su = align64(gp_value_bytes(&g->values[u]));
            bool leaves = false;
            for (int k = 0; k < p.n_frontier_out; k++) leaves |= p.frontier_out[k] == u;
            if (p.off[u] < o + ws && o < p.off[u] + su && (read_min[u] == INT_MAX || read_min[u] <= i || leaves))
                fail_msg("layer %d's backward workspace lies over '%s', read by layer %d's backward", i,
                         g->values[u].name, read_min[u]);
        }
        for (int q = p.first; q <= i; q++) {
            size_t ss = align64(gp_cpu_compute_ops.saved_bytes(g, &g->nodes[q]));
            if (ss && p.saved_off[q - first] < o + ws && o < p.saved_off[q - first] + ss)
                fail_msg("layer %d's backward workspace lies over layer %d's saved state", i, q);
        }
        int t = last - i;
        for (int v = 0; v < nv; v++) {
            if (from[v] == INT_MIN || !p.grad_in_set[v] || t < from[v] || t > to[v]) continue;
            size_t sv = align64(sizeof(float) * (size_t)gp_shape_numel(&g->values[v].shape));
            if (p.grad_off[v] < o + ws && o < p.grad_off[v] + sv)
                fail_msg("layer %d's backward workspace overlaps the gradient of '%s'", i, g->values[v].name);
        }
        for (int v = 0; v < nv; v++) {
            int w = p.addend_writer[v];
            if (w == INT_MIN || !p.addend_in_set[v] || i > w || i < g->values[v].producer) continue;
            size_t sv = align64(sizeof(float) * (size_t)gp_shape_numel(&g->values[v].shape));
            if (p.addend_off[v] < o + ws && o < p.addend_off[v] + sv)
                fail_msg("layer %d's backward workspace overlaps the last term of the gradient of '%s'", i,
                         g->values[v].name);
        }
        workspaces_in_sets++;
    }
    /* Every gradient region is cleared when born (it lies inside one of the
     * merged ranges of its birth time, and the ranges stay in the set) or
     * written whole by its birth layer, the first to write it: that layer
     * reads it once and has its din_overwrite bit, and no clear touches it
     * then; the output frontier's (born at the start, t = 0) are copied
     * whole from the inbox and not cleared either. */
    for (int t = 0; t <= last - first; t++) {
        for (int q = p.zero_start[t]; q < p.zero_start[t + 1]; q++)
            assert_true(p.zeros[q].off + p.zeros[q].bytes <= (p.zeros[q].in_set ? p.local_bytes : p.grad_bytes));
        for (int q = p.born_start[t]; q < p.born_start[t + 1]; q++) {
            int v = p.born[q];
            size_t size = align64(sizeof(float) * (size_t)gp_shape_numel(&g->values[v].shape));
            bool covered = false, overlapped = false;
            for (int r = p.zero_start[t]; r < p.zero_start[t + 1]; r++) {
                if (p.zeros[r].in_set != p.grad_in_set[v]) continue;
                covered |= p.zeros[r].off <= p.grad_off[v] && p.grad_off[v] + size <= p.zeros[r].off + p.zeros[r].bytes;
                overlapped |= p.zeros[r].off < p.grad_off[v] + size && p.grad_off[v] < p.zeros[r].off + p.zeros[r].bytes;
            }
            int layer = last - t, written = 0;
            for (int k = 0; t > 0 && k < g->nodes[layer].n_inputs && k < 32; k++)
                if (g->nodes[layer].inputs[k] == v && ((p.din_overwrite[layer - first] >> k) & 1)) written++;
            if (t == 0 && inbox[v]) {
                if (overlapped) fail_msg("the gradient of '%s' arrives in the inbox but is also cleared", g->values[v].name);
            } else if (written) {
                int reads = 0;
                for (int k = 0; k < g->nodes[layer].n_inputs; k++) reads += g->nodes[layer].inputs[k] == v;
                if (reads != 1 || overlapped || p.once[layer - first])
                    fail_msg("the gradient of '%s' is written whole by layer %d but %s", g->values[v].name, layer,
                             reads != 1 ? "read twice there" : overlapped ? "also cleared" : "once per step");
                (*overwritten)++;
            } else if (!covered) {
                fail_msg("the gradient of '%s' is neither cleared when born nor written whole", g->values[v].name);
            }
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
                    uint32_t in = 0, out = 0;
                    gp_backward_reads(n, wanted_din(n, needs), &in, &out);
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
    /* Forward workspaces in the arena (plan.h, fwd_scratch_off): aligned,
     * inside it, apart from every arena value alive during their layer's
     * forward (from its producer's forward to its last reader's); never a
     * once-per-step layer's. */
    for (int i = first; i < last; i++) {
        size_t o = p.fwd_scratch_off[i - first], ws = p.fwd_scratch_bytes[i - first];
        if (o == SIZE_MAX) {
            assert_true(ws <= p.scratch_bytes); /* the block holds it */
            continue;
        }
        assert_false(p.once[i - first]);
        assert_true(ws > 0 && o % GP_SCRATCH_ALIGN == 0 && o + ws <= p.arena_bytes);
        for (int a = 0; a < nv; a++) {
            if (p.home[a] != GP_HOME_ARENA) continue;
            int pa = g->values[a].producer, ea = pa;
            for (int q = first; q < last; q++)
                for (int k = 0; k < g->nodes[q].n_inputs; k++)
                    if (g->nodes[q].inputs[k] == a && q > ea) ea = q;
            size_t sa = align64(gp_value_bytes(&g->values[a]));
            if (pa <= i && i <= ea && p.off[a] < o + ws && o < p.off[a] + sa)
                fail_msg("layer %d's forward workspace overlaps '%s' in the arena", i, g->values[a].name);
        }
        workspaces_in_arena++;
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
    free(read_min);
    free(from);
    free(to);
    free(inbox);
    gp_plan_free(&p);
}

/* Fixture `name` (models/NAME.onnx) loaded at batch 4 with its layers;
 * returns which values need gradients (free it). */
static bool *load_fixture(const char *name, struct gp_graph *g, struct gp_layers *l)
{
    char file[256], path[4096];
    snprintf(file, sizeof file, "%s.onnx", name);
    fixture_path(file, path, sizeof path);
    struct gp_error err = {0};
    if (gp_onnx_load(path, 4, g, &err) != GP_OK) fail_msg("%s", err.msg);
    if (gp_layers_build(g, l, &err) != GP_OK) fail_msg("%s", err.msg);
    bool *needs = calloc((size_t)g->n_values + 1, sizeof(bool));
    assert_non_null(needs);
    gp_plan_needs_grad(g, needs);
    return needs;
}

static void test_gradient_lifetimes(void **state)
{
    (void)state;
    static const char *const fixtures[] = {"mlp_op17", "digits_cnn_op17", "resnet_op17", "unet_op17", "gpt_op17",
                                           "gpt_torch2_op17"};
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        struct gp_graph g;
        struct gp_layers l;
        bool *needs = load_fixture(fixtures[f], &g, &l);
        size_t whole_set = 0, whole_sum = 0;
        int once = 0, written = 0, in_sets = 0;
        for (int k = 1; k <= 3; k++)
            for (int s = 0; s < k; s++) {
                int first = g.n_nodes * s / k, last = g.n_nodes * (s + 1) / k;
                size_t set, sum;
                int stage_once = 0, stage_written = 0, stage_in_set = 0, addends = 0;
                check_stage(&g, &l, needs, &gp_cpu_compute_ops, first, last, &set, &sum, &stage_once, &stage_written,
                            &stage_in_set, &addends);
                assert_int_equal(addends, 0); /* the CPU takes none unless GP_GRAD_ADDENDS=all */
                if (k == 1) {
                    whole_set = set, whole_sum = sum, once = stage_once;
                    written = stage_written, in_sets = stage_in_set;
                }
            }
        printf("%-16s gradient set %8zu bytes, %8zu without sharing; %d layers once per step; "
               "%d gradients written whole by their first writer; %d in the activation set's dead bytes\n",
               fixtures[f], whole_set, whole_sum, once, written, in_sets);
        printf("%-16s %d backward workspaces in the activation sets' dead bytes, %d forward ones in the arena "
               "(1 to 3 stages)\n", fixtures[f], workspaces_in_sets, workspaces_in_arena);
        if (strncmp(fixtures[f], "resnet", 6) == 0 && (workspaces_in_sets == 0 || workspaces_in_arena == 0))
            fail_msg("%s: no workspace lies in the activation set's dead bytes or in the arena", fixtures[f]);
        workspaces_in_sets = workspaces_in_arena = 0;
        /* A deep convolution net's late gradients find dead bytes. */
        if ((strncmp(fixtures[f], "resnet", 6) == 0 || strncmp(fixtures[f], "unet", 4) == 0) && in_sets == 0)
            fail_msg("%s: no gradient lies in the activation set's dead bytes", fixtures[f]);
        /* Every fixture has a ReLU, GELU's Mul or an Add whose backward
         * writes its input's gradient first (the CPU kernels can). */
        if (written == 0) fail_msg("%s: no gradient is written whole by its first writer", fixtures[f]);
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

/* A backend whose kernels write every gradient whole when asked and take
 * every last term apart (gp_compute_ops.overwrites, grad_addend). */
static bool writes_whole(const struct gp_graph *g, const struct gp_node *node, int k)
{
    (void)g, (void)node, (void)k;
    return true;
}

static bool takes_addends(const struct gp_graph *g, const struct gp_node *producer, const struct gp_node *writer,
                          int slot, enum gp_dtype dt)
{
    (void)g, (void)producer, (void)writer, (void)slot, (void)dt;
    return true;
}

/* Gradient addends (plan.h, addend_off) planned where such a backend
 * allows, on 1 to 3 stages (check_addends): ResNet's block outputs (the
 * next block's first convolution, then its residual path), the GPTs'
 * residual stream (a LayerNorm, then the residual Add). None with
 * GP_GRAD_ADDENDS=off. */
static void test_grad_addends(void **state)
{
    (void)state;
    static const char *const fixtures[] = {"resnet_op17", "unet_op17", "gpt_op17", "gpt_torch2_op17"};
    struct gp_compute_ops ops = gp_cpu_compute_ops;
    ops.overwrites = writes_whole;
    ops.grad_addend = takes_addends;
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        struct gp_graph g;
        struct gp_layers l;
        bool *needs = load_fixture(fixtures[f], &g, &l);
        int whole = 0;
        for (int off = 0; off < 2; off++) {
            if (off) setenv("GP_GRAD_ADDENDS", "off", 1);
            for (int k = 1; k <= 3; k++)
                for (int s = 0; s < k; s++) {
                    size_t set, sum;
                    int once = 0, written = 0, in_set = 0, addends = 0;
                    check_stage(&g, &l, needs, &ops, g.n_nodes * s / k, g.n_nodes * (s + 1) / k, &set, &sum, &once,
                                &written, &in_set, &addends);
                    if (off) assert_int_equal(addends, 0);
                    if (k == 1 && !off) whole = addends;
                }
            unsetenv("GP_GRAD_ADDENDS");
        }
        printf("%-16s %d gradients' last terms planned apart (one stage)\n", fixtures[f], whole);
        if (strcmp(fixtures[f], "unet_op17") != 0 && whole == 0)
            fail_msg("%s: no gradient's last term planned apart", fixtures[f]);
        free(needs);
        gp_layers_free(&l);
        gp_graph_free(&g);
    }
}

/* Forward-only convolution outputs: a BatchNormalization without a fused
 * Relu, an InstanceNormalization and a Conv never read their own output
 * in backward (gp_backward_reads), so such an output that no other
 * backward reads either (ResNet's normalization before a residual Add, the
 * U-Net fixture's ConvTranspose before a Concat and its InstanceNorms
 * before a LeakyRelu, which reads its own output, the benchmark U-Net's
 * convolutions before Dropout) is planned in the forward arena, not kept
 * for the backward, as PyTorch keeps none of them. */
static void test_forward_only_outputs(void **state)
{
    (void)state;
    static const char *const fixtures[] = {"resnet_op17", "unet_op17"};
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        struct gp_graph g;
        struct gp_layers l;
        bool *needs = load_fixture(fixtures[f], &g, &l);
        struct gp_error err = {0};
        struct gp_stage_plan p;
        if (gp_plan_stage(&g, &l, needs, &gp_cpu_compute_ops, &(struct gp_compute_options){0}, "cpu", 0, g.n_nodes,
                          &p, &err) != GP_OK)
            fail_msg("%s", err.msg);
        int expected = 0, instance_norms = 0, relu_norms = 0;
        for (int i = 0; i < g.n_nodes; i++) {
            const struct gp_node *n = &g.nodes[i];
            bool conv = strcmp(n->op_type, "Conv") == 0 || strcmp(n->op_type, "ConvTranspose") == 0;
            bool inorm = strcmp(n->op_type, "InstanceNormalization") == 0;
            /* A BatchNorm's own backward reads its output only with a
             * fused Relu and residual Add (the sum's sign). */
            bool bnorm = strcmp(n->op_type, "BatchNormalization") == 0 && !(n->fused_relu && n->fused_add);
            if (!conv && !inorm && !bnorm) continue;
            int v = n->outputs[0];
            bool read = false;
            for (int k = 0; k < g.n_outputs; k++) read |= g.outputs[k] == v;
            for (int j = i + 1; j < g.n_nodes && !read; j++) {
                const struct gp_node *m = &g.nodes[j];
                uint32_t in = 0, out = 0;
                gp_backward_reads(m, wanted_din(m, needs), &in, &out);
                for (int q = 0; q < m->n_inputs; q++) read |= m->inputs[q] == v && (q >= 32 || ((in >> q) & 1));
            }
            if (read) continue;
            expected++;
            instance_norms += inorm;
            relu_norms += bnorm && n->fused_relu;
            if (p.home[v] != GP_HOME_ARENA)
                fail_msg("%s: '%s' (layer %d, %s) is read by no backward but kept for it", fixtures[f],
                         g.values[v].name, i, n->op_type);
        }
        printf("%-16s %d convolution and normalization outputs forward-only (%d InstanceNorm, %d BatchNorm + Relu)\n",
               fixtures[f], expected, instance_norms, relu_norms);
        if (expected == 0) fail_msg("%s: no convolution or normalization output is forward-only", fixtures[f]);
        /* The U-Net fixture's two InstanceNorms feed LeakyRelus. */
        if (f == 1 && instance_norms != 2) fail_msg("unet_op17: %d InstanceNorm outputs forward-only, not 2", instance_norms);
        gp_plan_free(&p);
        free(needs);
        gp_layers_free(&l);
        gp_graph_free(&g);
    }
}

/* What the unary activations' backward reads (gp_unary_grad_reads, which
 * both backends' kernels follow), and gp_backward_reads agreeing: Relu and
 * LeakyRelu of alpha >= 0 their output (its sign is the input's), LeakyRelu
 * of a negative alpha its input, Sigmoid its output, Gelu its input, Neg
 * nothing; another domain's Relu is no ONNX op (everything, the default). */
static void test_unary_grad_reads(void **state)
{
    (void)state;
    static const struct {
        const char *op;
        float alpha; /* LeakyRelu's, or 0: none given */
        bool x, y;
    } cases[] = {
        {"Relu", 0, false, true},     {"LeakyRelu", 0, false, true}, {"LeakyRelu", 0.2f, false, true},
        {"LeakyRelu", -0.5f, true, false}, {"Sigmoid", 0, false, true}, {"Tanh", 0, false, true},
        {"Gelu", 0, true, false},     {"Softplus", 0, true, false},  {"Neg", 0, false, false},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        struct gp_node n = {.name = "n", .op_type = cases[k].op, .domain = "", .n_inputs = 1, .n_outputs = 1};
        struct gp_attr alpha = {.name = "alpha", .type = GP_ATTR_FLOAT, .f = cases[k].alpha};
        if (cases[k].alpha) n.n_attrs = 1, n.attrs = &alpha;
        bool x, y;
        if (!gp_unary_grad_reads(&n, &x, &y)) fail_msg("%s: not taken for a unary activation", cases[k].op);
        if (x != cases[k].x || y != cases[k].y)
            fail_msg("%s (alpha %g): reads X %d, Y %d; expected %d, %d", cases[k].op, (double)cases[k].alpha, x, y,
                     cases[k].x, cases[k].y);
        uint32_t in, out;
        gp_backward_reads(&n, 1, &in, &out);
        assert_int_equal(in, cases[k].x ? 1u : 0u);
        assert_int_equal(out, cases[k].y ? 1u : 0u);
    }
    struct gp_node custom = {.name = "c", .op_type = "Relu", .domain = "com.example", .n_inputs = 1, .n_outputs = 1};
    bool x, y;
    assert_false(gp_unary_grad_reads(&custom, &x, &y));
    assert_false(x || y);
    struct gp_node softmax = {.name = "s", .op_type = "Softmax", .domain = "", .n_inputs = 1, .n_outputs = 1};
    assert_false(gp_unary_grad_reads(&softmax, &x, &y));
    uint32_t in, out;
    gp_backward_reads(&custom, 1, &in, &out);
    assert_int_equal(in, 0xffffffffu);
    assert_int_equal(out, 0xffffffffu);
}

/* What BatchNormalization's and MaxPool's backward read (both backends'
 * kernels follow it): a BatchNorm its input and, only with a fused Relu
 * and a fused residual Add, its output (the sum's sign; a fused Relu's
 * mask alone is told from X), never the residual; MaxPool nothing (its
 * saved argmax). So the output of ResNet's stem, a BatchNorm + Relu that
 * only a MaxPool reads, is not kept for the backward. */
static void test_norm_pool_reads(void **state)
{
    (void)state;
    static const struct {
        bool relu, add;
        uint32_t in, out;
    } bn[] = {
        {false, false, 0xffffffffu, 0},
        {true, false, 0xffffffffu, 0},
        {false, true, 0xffffffffu & ~(1u << 5), 0},
        {true, true, 0xffffffffu & ~(1u << 5), 1},
    };
    for (size_t k = 0; k < sizeof bn / sizeof *bn; k++) {
        struct gp_node n = {.name = "bn", .op_type = "BatchNormalization", .domain = "", .n_inputs = bn[k].add ? 6 : 5,
                            .n_outputs = 1, .fused_relu = bn[k].relu, .fused_add = bn[k].add};
        uint32_t in, out;
        gp_backward_reads(&n, 1, &in, &out);
        if (in != bn[k].in || out != bn[k].out)
            fail_msg("BatchNormalization (Relu %d, Add %d): reads inputs %#x, outputs %#x; expected %#x, %#x",
                     bn[k].relu, bn[k].add, in, out, bn[k].in, bn[k].out);
    }
    struct gp_node pool = {.name = "p", .op_type = "MaxPool", .domain = "", .n_inputs = 1, .n_outputs = 2};
    uint32_t in, out;
    gp_backward_reads(&pool, 1, &in, &out);
    assert_int_equal(in, 0u);
    assert_int_equal(out, 0u);
}

/* Tied parameters: the GPT whose head reads its token embedding, cut
 * between the Gather and the head's Transpose, plans the embedding in both
 * stages as a parameter of each (its copies, pipeline/tied.c), and in one
 * only when uncut. A buffer read by layers of two stages (here made so:
 * BatchNorm's running mean read by a later layer too) is refused, naming
 * both layers. */
static void test_tied_parameters(void **state)
{
    (void)state;
    char path[4096];
    fixture_path("../tests/data/tied_gpt_op17.onnx", path, sizeof path);
    struct gp_graph g;
    struct gp_layers l;
    struct gp_error err = {0};
    struct gp_stage_plan a, b;
    if (gp_onnx_load(path, 2, &g, &err) != GP_OK) fail_msg("%s", err.msg);
    if (gp_layers_build(&g, &l, &err) != GP_OK) fail_msg("%s", err.msg);
    bool *needs = calloc((size_t)g.n_values + 1, sizeof(bool));
    assert_non_null(needs);
    gp_plan_needs_grad(&g, needs);
    int wte = gp_graph_find_value(&g, "wte.weight");
    assert_true(wte >= 0);
    const struct gp_compute_options opts = {0};
    int cut = g.n_nodes / 2;
    assert_int_equal(gp_plan_stage(&g, &l, needs, &gp_cpu_compute_ops, &opts, "cpu", 0, cut, &a, &err), GP_OK);
    assert_int_equal(gp_plan_stage(&g, &l, needs, &gp_cpu_compute_ops, &opts, "cpu", cut, g.n_nodes, &b, &err), GP_OK);
    assert_int_equal(a.home[wte], GP_HOME_STATIC);
    assert_int_equal(b.home[wte], GP_HOME_STATIC);
    /* The second stage holds the copy among its parameters (its gradient mirrors it). */
    assert_true(b.off[wte] + sizeof(float) * (size_t)gp_shape_numel(&g.values[wte].shape) <= b.param_bytes);
    gp_plan_free(&a);
    gp_plan_free(&b);
    free(needs);
    gp_layers_free(&l);
    gp_graph_free(&g);

    fixture_path("digits_cnn_op17.onnx", path, sizeof path);
    if (gp_onnx_load(path, 2, &g, &err) != GP_OK) fail_msg("%s", err.msg);
    int bn = -1;
    for (int i = 0; i < g.n_nodes && bn < 0; i++)
        if (!strcmp(g.nodes[i].op_type, "BatchNormalization")) bn = i;
    assert_true(bn >= 0 && bn + 2 < g.n_nodes);
    int mean = g.nodes[bn].inputs[3], reader = g.n_nodes - 1;
    g.nodes[reader].inputs[g.nodes[reader].n_inputs - 1] = mean;
    if (gp_layers_build(&g, &l, &err) != GP_OK) fail_msg("%s", err.msg);
    needs = calloc((size_t)g.n_values + 1, sizeof(bool));
    assert_non_null(needs);
    gp_plan_needs_grad(&g, needs);
    assert_int_equal(gp_plan_stage(&g, &l, needs, &gp_cpu_compute_ops, &opts, "cpu", 0, bn + 1, &a, &err),
                     GP_ERR_UNSUPPORTED);
    printf("refused: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "in another stage: put both in one stage"));
    assert_non_null(strstr(err.msg, g.values[mean].name));
    gp_plan_free(&a);
    free(needs);
    gp_layers_free(&l);
    gp_graph_free(&g);
}

/* ---- kernel workspace: the calls each layer makes ----
 * A layer's workspace is asked (scratch_bytes) for the gradients its
 * backward computes and, in bf16, with GP_SCRATCH_FLOAT_CALL exactly where
 * some call of it computes on float32 tensors (staged copies, or float32
 * storage of its output): a convolution's float32 problem may ask far more
 * than its bfloat16 one, and a stage whose layers all read bfloat16 must
 * not plan for it. The stage's workspace is the largest ask, and
 * scratch_layer names it. */

static uint32_t asked_din[64];
static bool asked[64];

static size_t recording_scratch(const struct gp_graph *g, const struct gp_node *node,
                                const struct gp_compute_options *opts, uint32_t din)
{
    (void)opts;
    int i = (int)(node - g->nodes);
    /* Asked for the forward (or both) and for the backward alone: both
     * asks carry the same float-call bit. */
    if (asked[i] && (asked_din[i] & GP_SCRATCH_FLOAT_CALL) != (din & GP_SCRATCH_FLOAT_CALL))
        fail_msg("layer %d: workspace asked with and without float32 calls", i);
    if (!gp_scratch_backward_only(din)) asked_din[i] = din;
    asked[i] = true;
    return (din & GP_SCRATCH_FLOAT_CALL ? 1000u : 0u) + 10u * (size_t)i; /* the last float32 call's is largest */
}

static enum gp_bf16_calls all_read_bf16(const void *kernel, bool backward)
{
    (void)kernel;
    (void)backward;
    return GP_BF16_ANY;
}

static void test_scratch_float_calls(void **state)
{
    (void)state;
    /* ~0u, every bit, asks for every call's most (a test's or a tool's one
     * workspace for the layer), never for the backward's alone. */
    assert_false(gp_scratch_backward_only(~0u));
    assert_true(gp_scratch_backward_only(3u | GP_SCRATCH_FLOAT_CALL | GP_SCRATCH_BACKWARD));
    assert_false(gp_scratch_backward_only(3u | GP_SCRATCH_FLOAT_CALL));
    char path[4096];
    fixture_path("digits_cnn_op17.onnx", path, sizeof path);
    struct gp_graph g;
    struct gp_layers l;
    struct gp_error err = {0};
    if (gp_onnx_load(path, 2, &g, &err) != GP_OK) fail_msg("%s", err.msg);
    if (gp_layers_build(&g, &l, &err) != GP_OK) fail_msg("%s", err.msg);
    assert_true(g.n_nodes <= 64);
    bool *needs = calloc((size_t)g.n_values + 1, sizeof(bool));
    assert_non_null(needs);
    gp_plan_needs_grad(&g, needs);
    /* fp32; bf16 on the CPU's kernels (every call staged); bf16 with
     * kernels that all read bfloat16 (only float32 outputs make one). */
    for (int run = 0; run < 3; run++) {
        struct gp_compute_ops ops = gp_cpu_compute_ops;
        ops.scratch_bytes = recording_scratch;
        if (run == 2) ops.kernel_bf16 = all_read_bf16;
        struct gp_compute_options opts = {.precision = run ? GP_PRECISION_BF16 : GP_PRECISION_FP32};
        memset(asked, 0, sizeof asked);
        memset(asked_din, 0, sizeof asked_din);
        struct gp_stage_plan p;
        if (gp_plan_stage(&g, &l, needs, &ops, &opts, "cpu", 0, g.n_nodes, &p, &err) != GP_OK) fail_msg("%s", err.msg);
        size_t most = 0;
        int flagged = 0;
        for (int i = 0; i < g.n_nodes; i++) {
            const struct gp_node *n = &g.nodes[i];
            assert_true(asked[i]);
            bool flag = (asked_din[i] & GP_SCRATCH_FLOAT_CALL) != 0;
            bool expect = run == 1;
            if (run == 2) {
                const enum gp_dtype *out_dt = p.call_dt + p.call_dt_off[i] + n->n_inputs + 1;
                expect = n->n_outputs > 0 && out_dt[0] == GP_DTYPE_FLOAT32;
            }
            if (flag != expect)
                fail_msg("run %d, layer %d (%s): scratch asked %s float32 calls", run, i, n->op_type,
                         flag ? "with" : "without");
            flagged += flag;
            /* The block holds each workspace that found no place in the
             * arena (forward) or in the set's dead bytes (backward). */
            if (p.fwd_scratch_off[i] == SIZE_MAX && p.fwd_scratch_bytes[i] > most) most = p.fwd_scratch_bytes[i];
            if (p.bwd_scratch_off[i] == SIZE_MAX && p.bwd_scratch_bytes[i] > most) most = p.bwd_scratch_bytes[i];
        }
        printf("run %d: %d of %d layers asked with float32 calls; workspace %zu bytes, layer %d's\n", run, flagged,
               g.n_nodes, p.scratch_bytes, p.scratch_layer);
        if (run == 2) assert_true(flagged < g.n_nodes); /* the bfloat16 layers plan for no float32 problem */
        assert_int_equal(p.scratch_bytes, most);
        /* scratch_layer names a layer that asks that much (ties: any). */
        int at = p.scratch_layer;
        assert_true(at >= 0 && at < g.n_nodes);
        assert_true((p.fwd_scratch_off[at] == SIZE_MAX && p.fwd_scratch_bytes[at] == most) ||
                    (p.bwd_scratch_off[at] == SIZE_MAX && p.bwd_scratch_bytes[at] == most));
        gp_plan_free(&p);
    }
    free(needs);
    gp_layers_free(&l);
    gp_graph_free(&g);
}

/* ---- the schedules and their slots ----
 * Every schedule of 1..8 stages and 1..16 micro-batches, each generator
 * and checkpoint mode, checked from the action list alone: every stage
 * runs its forwards and its backwards in micro-batch order (so parameter
 * gradients sum in the same order under both generators); which micro-
 * batches are recomputed is what except_last promises; two micro-batches
 * that share a box, inbox or activation set never hold it at the same time,
 * counting from the action (or the copy) that fills it to the backward
 * that last reads it; a late copy still finds its source; and the counts are
 * the bounds: on stage k of K, 1F1B holds min(M, K-k) micro-batches' boxes
 * and (without checkpointing) sets, GPipe M. */

struct positions {
    int *f, *r, *b; /* [K * M] issue positions, -1: none */
};

static void issue_positions(const struct gp_pipe_schedule *s, struct positions *p)
{
    size_t km = (size_t)s->n_stages * (size_t)s->n_micro;
    p->f = malloc(sizeof(int) * km);
    p->r = malloc(sizeof(int) * km);
    p->b = malloc(sizeof(int) * km);
    assert_true(p->f && p->r && p->b);
    for (size_t q = 0; q < km; q++) p->f[q] = p->r[q] = p->b[q] = -1;
    int *seen_f = calloc((size_t)s->n_stages, sizeof(int)), *seen_b = calloc((size_t)s->n_stages, sizeof(int));
    assert_true(seen_f && seen_b);
    for (int a = 0; a < s->n_actions; a++) {
        const struct gp_action *act = &s->actions[a];
        size_t q = (size_t)act->stage * s->n_micro + act->microbatch;
        if (act->kind == GP_ACT_FORWARD) {
            assert_int_equal(act->microbatch, seen_f[act->stage]++); /* forwards in micro-batch order */
            p->f[q] = a;
        } else if (act->kind == GP_ACT_BACKWARD) {
            assert_int_equal(act->microbatch, seen_b[act->stage]++); /* backwards too: 0, 1, ..., M-1 */
            p->b[q] = a;
        } else {
            /* A recomputation comes right before its backward. */
            assert_true(a + 1 < s->n_actions && s->actions[a + 1].kind == GP_ACT_BACKWARD &&
                        s->actions[a + 1].stage == act->stage && s->actions[a + 1].microbatch == act->microbatch);
            p->r[q] = a;
        }
    }
    for (int k = 0; k < s->n_stages; k++) {
        assert_int_equal(seen_f[k], s->n_micro);
        assert_int_equal(seen_b[k], s->n_micro);
    }
    free(seen_f);
    free(seen_b);
}

/* No two micro-batches of one slot overlap: occupation q of micro-batch j
 * is [from[j], to[j]] in issue positions. */
static void assert_disjoint(const char *what, const int *slot, const int *from, const int *to, int M, int n_slots)
{
    for (int i = 0; i < M; i++) {
        assert_true(slot[i] >= 0 && slot[i] < n_slots);
        for (int j = i + 1; j < M; j++)
            if (slot[i] == slot[j] && !(to[i] < from[j] || to[j] < from[i]))
                fail_msg("%s: %d holds micro-batches %d [%d, %d] and %d [%d, %d] at once", what, slot[i], i, from[i],
                         to[i], j, from[j], to[j]);
    }
}

/* The occupation before x in its slot (the latest that starts before it), or -1. */
static int previous(const int *slot, const int *from, int n, int x)
{
    int best = -1;
    for (int y = 0; y < n; y++)
        if (y != x && slot[y] == slot[x] && from[y] < from[x] && (best < 0 || from[y] > from[best])) best = y;
    return best;
}

static void check_schedule(enum gp_pipe_schedule_kind kind, int K, int M, enum gp_checkpoint mode)
{
    struct gp_pipe_schedule s;
    struct gp_error err = {0};
    if (gp_pipe_schedule_make(kind, K, M, mode, &s, &err) != GP_OK) fail_msg("%s", err.msg);
    struct gp_stage_slots *slots = calloc((size_t)K, sizeof *slots);
    assert_non_null(slots);
    if (gp_pipe_slots_plan(&s, slots, &err) != GP_OK)
        fail_msg("%s K=%d M=%d %s: %s", gp_pipe_schedule_name(kind), K, M, gp_checkpoint_name(mode), err.msg);
    struct positions pos;
    issue_positions(&s, &pos);
    int *from = malloc(sizeof(int) * 2 * (size_t)M), *to = malloc(sizeof(int) * 2 * (size_t)M);
    int *slot = malloc(sizeof(int) * 2 * (size_t)M);
    assert_true(from && to && slot);
    bool gpipe = kind == GP_PIPE_GPIPE;
    for (int k = 0; k < K; k++) {
        const struct gp_stage_slots *sl = &slots[k];
        const int *f = pos.f + (size_t)k * M, *r = pos.r + (size_t)k * M, *b = pos.b + (size_t)k * M;
        int bound = gpipe ? M : (K - k < M ? K - k : M);
        /* Recomputed: never none, always all; except_last all but those
         * whose backward is the stage's next action after their forward:
         * under 1F1B every one of the last stage, otherwise none when M > 1. */
        int want = mode == GP_CHECKPOINT_NEVER ? 0
                   : mode == GP_CHECKPOINT_ALWAYS ? M
                   : M > 1 && (gpipe || k < K - 1) ? M : 0;
        assert_int_equal(sl->n_checkpointed, want);
        for (int j = 0; j < M; j++) assert_int_equal(sl->checkpointed[j], r[j] >= 0);
        assert_int_equal(sl->n_boxes, bound);
        assert_int_equal(sl->n_sets, mode == GP_CHECKPOINT_NEVER || want == 0 ? bound : 1);
        /* Inboxes: GPipe's last stage holds every loss gradient until the
         * backward starts, its other stages two (the next stage's backward
         * of j is issued before this one's of j - 1); 1F1B one. */
        assert_int_equal(sl->n_inboxes, !gpipe ? 1 : k == K - 1 ? M : M < 2 ? M : 2);
        /* Occupations in half steps: 2a is action a, 2a + 1 a copy issued
         * right after it. Boxes: filled by the copy (stage 0: by the
         * forward), free after the backward; the copy comes after the
         * forward that made it, and before the forward that reads it. */
        for (int j = 0; j < M; j++) {
            from[j] = k == 0 ? 2 * f[j] : 2 * sl->copy_after[j] + 1;
            to[j] = 2 * b[j];
            if (k > 0) {
                assert_true(sl->copy_after[j] >= pos.f[(size_t)(k - 1) * M + j]);
                assert_true(sl->copy_after[j] < f[j]);
                if (j > 0) assert_true(sl->copy_after[j] >= sl->copy_after[j - 1]);
            }
            int prev = sl->box_after[j];
            if (prev >= 0) {
                assert_int_equal(sl->box[prev], sl->box[j]);
                assert_true(b[prev] <= (k == 0 ? f[j] : sl->copy_after[j])); /* its wait was issued before */
            }
        }
        char what[160];
        snprintf(what, sizeof what, "%s K=%d M=%d %s: stage %d's box", gp_pipe_schedule_name(kind), K, M,
                 gp_checkpoint_name(mode), k);
        assert_disjoint(what, sl->box, from, to, M, sl->n_boxes);
        /* A reused box waits for its previous occupant's backward. */
        for (int j = 0; j < M; j++) assert_int_equal(sl->box_after[j], previous(sl->box, from, M, j));
        for (int j = 0; j < M; j++) {
            from[j] = k + 1 < K ? 2 * pos.b[(size_t)(k + 1) * M + j] + 1 : 2 * f[j];
            to[j] = 2 * b[j];
            if (sl->inbox_after[j] >= 0) assert_true(2 * b[sl->inbox_after[j]] < from[j]);
        }
        snprintf(what, sizeof what, "%s K=%d M=%d %s: stage %d's inbox", gp_pipe_schedule_name(kind), K, M,
                 gp_checkpoint_name(mode), k);
        assert_disjoint(what, sl->inbox, from, to, M, sl->n_inboxes);
        for (int j = 0; j < M; j++) assert_int_equal(sl->inbox_after[j], previous(sl->inbox, from, M, j));
        /* Sets: every occupation, a checkpointed micro-batch's forward and
         * its recomputation-to-backward apart. */
        int n = 0;
        int *mb = malloc(sizeof(int) * 2 * (size_t)M);
        assert_non_null(mb);
        for (int j = 0; j < M; j++) {
            mb[n] = j, slot[n] = sl->fwd_set[j], from[n] = 2 * f[j], to[n++] = 2 * (r[j] >= 0 ? f[j] : b[j]);
            if (r[j] >= 0) mb[n] = j, slot[n] = sl->bwd_set[j], from[n] = 2 * r[j], to[n++] = 2 * b[j];
            else assert_int_equal(sl->bwd_set[j], sl->fwd_set[j]);
        }
        /* A set written again waits for the frontier copy of the forward
         * that wrote it before (when the previous occupant was a forward). */
        for (int x = 0; x < n; x++) {
            int y = previous(slot, from, n, x);
            int want_after = y >= 0 && from[y] == 2 * f[mb[y]] ? mb[y] : -1;
            bool is_forward = from[x] == 2 * f[mb[x]];
            if (is_forward) assert_int_equal(sl->fwd_set_after[mb[x]], want_after);
            else assert_int_equal(sl->bwd_set_after[mb[x]], want_after);
        }
        free(mb);
        for (int x = 0; x < n; x++)
            for (int y = x + 1; y < n; y++)
                if (slot[x] == slot[y] && !(to[x] < from[y] || to[y] < from[x]))
                    fail_msg("%s K=%d M=%d %s: stage %d's set %d is used twice at once", gp_pipe_schedule_name(kind), K,
                             M, gp_checkpoint_name(mode), k, slot[x]);
        /* A forward copy that leaves stage k late still finds its source:
         * nothing else is written into that set before the copy is issued. */
        for (int j = 0; k + 1 < K && j < M; j++) {
            int c = 2 * slots[k + 1].copy_after[j] + 1;
            for (int x = 0; x < n; x++)
                if (slot[x] == sl->fwd_set[j] && from[x] > 2 * f[j] && from[x] <= c)
                    fail_msg("stage %d writes set %d before micro-batch %d's frontier left it", k, slot[x], j);
        }
    }
    free(from);
    free(to);
    free(slot);
    free(pos.f);
    free(pos.r);
    free(pos.b);
    for (int k = 0; k < K; k++) gp_stage_slots_free(&slots[k]);
    free(slots);
    gp_pipe_schedule_free(&s);
}

static void test_schedule_slots(void **state)
{
    (void)state;
    int schedules = 0;
    for (int kind = 0; kind < 2; kind++)
        for (int mode = 0; mode < 3; mode++)
            for (int K = 1; K <= 8; K++)
                for (int M = 1; M <= 16; M++) {
                    check_schedule((enum gp_pipe_schedule_kind)kind, K, M, (enum gp_checkpoint)mode);
                    schedules++;
                }
    printf("%d schedules: in-order backwards, disjoint slots, 1F1B within min(M, K-k) on stage k\n", schedules);
    /* Names: parsed back; others refused. */
    enum gp_pipe_schedule_kind kind;
    assert_true(gp_pipe_schedule_parse("1f1b", &kind) && kind == GP_PIPE_1F1B);
    assert_true(gp_pipe_schedule_parse("gpipe", &kind) && kind == GP_PIPE_GPIPE);
    assert_false(gp_pipe_schedule_parse("cosine", &kind));
    assert_false(gp_pipe_schedule_parse(NULL, &kind));
}

/* The slot planning refuses a schedule that breaks a dependency. */
static void test_bad_schedule(void **state)
{
    (void)state;
    struct gp_pipe_schedule s;
    struct gp_error err = {0};
    if (gp_pipe_schedule_gpipe(2, 2, GP_CHECKPOINT_NEVER, &s, &err) != GP_OK) fail_msg("%s", err.msg);
    /* Stage 1's forward of micro-batch 0 (the second action) moved first. */
    struct gp_action first = s.actions[0];
    s.actions[0] = s.actions[1];
    s.actions[1] = first;
    struct gp_stage_slots slots[2];
    assert_int_equal(gp_pipe_slots_plan(&s, slots, &err), GP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "before the previous stage's"));
    s.actions[1] = s.actions[0];
    err = (struct gp_error){0};
    assert_int_equal(gp_pipe_slots_plan(&s, slots, &err), GP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "twice"));
    gp_pipe_schedule_free(&s);
    /* The last backward dropped. */
    if (gp_pipe_schedule_1f1b(2, 2, GP_CHECKPOINT_ALWAYS, &s, &err) != GP_OK) fail_msg("%s", err.msg);
    s.n_actions--;
    err = (struct gp_error){0};
    assert_int_equal(gp_pipe_slots_plan(&s, slots, &err), GP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "lacks its forward or its backward"));
    gp_pipe_schedule_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_schedule_slots), cmocka_unit_test(test_bad_schedule),
                                       cmocka_unit_test(test_gradient_lifetimes),
                                       cmocka_unit_test(test_grad_addends),
                                       cmocka_unit_test(test_forward_only_outputs),
                                       cmocka_unit_test(test_unary_grad_reads),
        cmocka_unit_test(test_norm_pool_reads),
                                       cmocka_unit_test(test_tied_parameters),
                                       cmocka_unit_test(test_scratch_float_calls)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
