#include "pipeline/plan.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <stdio.h>

#include "backend/compute.h"
#include "backend/mixed_call.h"
#include "graph/layout.h"
#include "ops/backward_reads.h"
#include "ops/registry.h"
#include "util/env.h"

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Bytes of a value on the stage: float dtypes are held as float32 or, for
 * activations in bf16, bfloat16 (plan->dt). An activation's gradient (in the
 * gradient set, the inboxes) is stored as the value is. */
size_t gp_plan_value_bytes(const struct gp_graph *g, const struct gp_stage_plan *p, int v)
{
    return (size_t)gp_shape_numel(&g->values[v].shape) * gp_dtype_size(p->dt[v]);
}


bool gp_plan_autocast_op(const struct gp_node *n)
{
    static const char *const ops[] = {"MatMul", "Gemm", "Conv", "ConvTranspose"};
    if (*n->domain && strcmp(n->domain, "ai.onnx") != 0) return false;
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
        if (strcmp(n->op_type, ops[i]) == 0) return true;
    return false;
}

/* A layer's call types (gp_stage_plan.call_dt). */
static void call_types(const struct gp_stage_plan *p, const struct gp_node *n, enum gp_dtype *in_dt,
                       enum gp_dtype *out_dt, enum gp_dtype *din_dt, enum gp_dtype *dout_dt, uint32_t *shadowed)
{
    *shadowed = 0;
    for (int k = 0; k < n->n_inputs; k++) {
        int v = n->inputs[k];
        enum gp_dtype t = v >= 0 ? p->dt[v] : GP_DTYPE_FLOAT32;
        bool shadow = v >= 0 && p->shadow_off[v] != SIZE_MAX && gp_plan_autocast_op(n);
        if (shadow && k < 32) *shadowed |= 1u << k;
        in_dt[k] = shadow ? GP_DTYPE_BFLOAT16 : t;
        bool f32_grad = v < 0 || p->home[v] == GP_HOME_STATIC || p->home[v] == GP_HOME_STEP;
        din_dt[k] = f32_grad ? GP_DTYPE_FLOAT32 : t;
    }
    for (int k = 0; k < n->n_outputs; k++) {
        int v = n->outputs[k];
        enum gp_dtype t = v >= 0 ? p->dt[v] : GP_DTYPE_FLOAT32;
        out_dt[k] = t;
        dout_dt[k] = v >= 0 && p->home[v] == GP_HOME_STEP ? GP_DTYPE_FLOAT32 : t;
    }
}

/* ---- channels-last filter copies (plan.h) ---- */

/* How many input slots of the graph's nodes read value v. */
static int readers_of(const struct gp_graph *g, int v)
{
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_inputs; k++) n += g->nodes[i].inputs[k] == v;
    return n;
}

/* Whether layer n's filter gets a channels-last copy: a 2-D Conv's W with
 * more than one kernel cell (a 1x1 filter lies the same either way), a
 * float static value read by this node alone and only as W (so its
 * gradient has one writer and tied copies stay as they are), called as it
 * lies in both directions with W channels-last: the kernel says so, and
 * in bf16 it reads bfloat16 itself (a staged call would transpose the
 * gradient too). */
static bool filter_copy_fits(const struct gp_graph *g, const struct gp_compute_ops *ops,
                             const struct gp_stage_plan *p, const struct gp_node *n)
{
    if ((*n->domain && strcmp(n->domain, "ai.onnx") != 0) || strcmp(n->op_type, "Conv") != 0 || n->n_inputs < 2)
        return false;
    int v = n->inputs[1];
    if (v < 0 || p->home[v] != GP_HOME_STATIC || p->dt[v] != GP_DTYPE_FLOAT32) return false;
    const struct gp_value *w = &g->values[v];
    if (w->is_output || w->shape.rank != 4 || w->shape.dims[2] * w->shape.dims[3] <= 1 || readers_of(g, v) != 1)
        return false;
    const void *kernel = ops->kernel_for(n);
    if (!kernel || !ops->layout_native) return false;
    if (p->precision == GP_PRECISION_BF16 &&
        (!ops->kernel_bf16 || ops->kernel_bf16(kernel, false) == GP_BF16_STAGED ||
         ops->kernel_bf16(kernel, true) == GP_BF16_STAGED || p->shadow_off[v] == SIZE_MAX))
        return false;
    uint32_t in = gp_layout_in_mask(g, n) | 2u, out = gp_layout_out_mask(g, n);
    return ops->layout_native(kernel, g, n, in, out, false) && ops->layout_native(kernel, g, n, in, out, true);
}

static gp_status plan_filter_copies(const struct gp_graph *g, const bool *needs_grad,
                                    const struct gp_compute_ops *ops, struct gp_stage_plan *p, struct gp_error *err)
{
    int nv = g->n_values, nl = p->last - p->first;
    p->filter_nhwc = calloc((size_t)nv + 1, sizeof(bool));
    p->filter_off = malloc(sizeof(size_t) * ((size_t)nv + 1));
    p->filter_grad_off = malloc(sizeof(size_t) * ((size_t)nv + 1));
    p->filtered = malloc(sizeof(int) * ((size_t)nv + 1));
    p->call_held = calloc((size_t)nl + 1, sizeof(uint32_t));
    if (!p->filter_nhwc || !p->filter_off || !p->filter_grad_off || !p->filtered || !p->call_held)
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory planning a stage");
    for (int v = 0; v < nv; v++) p->filter_off[v] = p->filter_grad_off[v] = SIZE_MAX;
    if (!gp_env_flag("GP_CHANNELS_LAST_FILTERS", false)) return GP_OK;
    p->batch_shadows = p->n_shadowed > 0;
    for (int i = p->first; i < p->last; i++) {
        const struct gp_node *n = &g->nodes[i];
        if (!filter_copy_fits(g, ops, p, n)) continue;
        int v = n->inputs[1];
        p->filter_nhwc[v] = true;
        p->filtered[p->n_filtered++] = v;
        p->call_held[i - p->first] = 2u;
        size_t bytes = align64((size_t)gp_shape_numel(&g->values[v].shape) * sizeof(float));
        if (needs_grad[v] && g->values[v].kind == GP_VALUE_PARAMETER) {
            p->filter_grad_off[v] = p->filter_grad_bytes;
            p->filter_grad_bytes += bytes;
        }
        if (p->shadow_off[v] != SIZE_MAX) continue; /* bf16: the shadow is the copy */
        p->filter_off[v] = p->filter_bytes;
        p->filter_bytes += bytes;
    }
    return GP_OK;
}

static bool nondiff(const struct gp_node *n, int k)
{
    return k < 32 && ((n->def->nondiff_inputs >> k) & 1);
}

/* The input gradients a layer's backward is asked for (bit k), as the
 * executor asks them (tasks.c, grad_addr): every input in a
 * differentiable slot below 32 that carries a gradient or is a
 * once-per-step value (whose gradient block is always there); 0 when no
 * output carries a gradient, as then no gradient flows in and that
 * backward does not run. Reads p->home: after plan_once (p NULL: no
 * once-per-step values). */
static uint32_t backward_din(const struct gp_graph *g, const bool *needs_grad, const struct gp_stage_plan *p,
                             const struct gp_node *n)
{
    bool flows = false;
    for (int k = 0; k < n->n_outputs; k++) flows |= n->outputs[k] >= 0 && needs_grad[n->outputs[k]];
    if (!flows) return 0;
    uint32_t din = 0;
    for (int k = 0; k < n->n_inputs && k < 32; k++) {
        int v = n->inputs[k];
        if (v >= 0 && (needs_grad[v] || (p && p->home[v] == GP_HOME_STEP)) && !nondiff(n, k)) din |= 1u << k;
    }
    return din;
}

void gp_plan_needs_grad(const struct gp_graph *g, bool *needs)
{
    for (int v = 0; v < g->n_values; v++)
        needs[v] = gp_dtype_is_float(g->values[v].dtype) && g->values[v].kind == GP_VALUE_PARAMETER;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct gp_node *n = &g->nodes[i];
        bool any = false;
        for (int k = 0; k < n->n_inputs; k++)
            if (n->inputs[k] >= 0 && needs[n->inputs[k]] && !nondiff(n, k)) any = true;
        if (!any) continue;
        for (int k = 0; k < n->n_outputs; k++)
            if (n->outputs[k] >= 0 && gp_dtype_is_float(g->values[n->outputs[k]].dtype))
                needs[n->outputs[k]] = true;
    }
}

/* Every layer of [first, last) needs a kernel of the backend, and one with
 * a backward where gradients flow through it: all that lack one are named
 * in one message. */
static gp_status check_kernels(const struct gp_graph *g, const struct gp_compute_ops *ops,
                               const char *backend, const bool *needs_grad, int first, int last,
                               struct gp_error *err)
{
    char list[768] = "";
    size_t len = 0;
    int missing = 0;
    const char *reported[32];
    for (int i = first; i < last; i++) {
        const struct gp_node *n = &g->nodes[i];
        bool trainable = false, found = ops->has_kernel(n, &trainable);
        bool grads = false;
        for (int k = 0; k < n->n_outputs; k++) grads |= n->outputs[k] >= 0 && needs_grad[n->outputs[k]];
        if (found && (trainable || !grads)) continue;
        /* One entry per op type, with the first node that has it. */
        bool seen = false;
        for (int r = 0; r < missing && r < 32; r++) seen |= strcmp(reported[r], n->op_type) == 0;
        if (seen) continue;
        if (missing < 32) reported[missing] = n->op_type;
        missing++;
        if (len < sizeof list - 1)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s%s (layer %d, '%s')",
                                    missing > 1 ? ", " : "", n->op_type, found ? " backward" : "", i,
                                    n->name);
    }
    if (!missing) return GP_OK;
    return gp_error_set(err, GP_ERR_UNSUPPORTED, "the %s backend has no kernel for %s", backend, list);
}

/* ---- the gradient set ----
 * A value's gradient is needed from the backward of its last consumer in
 * the stage (the first to add into it; or from the start of the backward,
 * for an output-frontier value whose gradient arrives from the next stage)
 * until the backward of its producer has read it; an input-frontier value's
 * gradient lives to the end (it is sent to the previous stage). Offsets are
 * given greedily in backward order, first fit among the gaps between the
 * regions still alive, so the set takes about the largest number of bytes
 * alive at once rather than the sum over all values. A region is zeroed
 * when its value is born (gp_stage_plan.born), since kernels accumulate,
 * unless its first writer writes it whole (first_writers). */

struct region {
    size_t off, size;
    int until; /* layer whose backward ends it; INT_MIN: the end of the backward */
};

static size_t align_to(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* The first offset (a multiple of `align`) where `size` bytes meet none of
 * the regions in live (sorted by offset). */
static size_t first_fit_aligned(const struct region *live, int n_live, size_t size, size_t align)
{
    size_t at = 0;
    for (int r = 0; r < n_live; r++) {
        if (live[r].off >= at + size) return at;
        if (live[r].off + live[r].size > at) at = align_to(live[r].off + live[r].size, align);
    }
    return at;
}

static size_t first_fit(const struct region *live, int n_live, size_t size)
{
    return first_fit_aligned(live, n_live, size, 1);
}

static void insert_sorted(struct region *live, int *n_live, struct region r)
{
    int i = *n_live;
    while (i > 0 && live[i - 1].off > r.off) {
        live[i] = live[i - 1];
        i--;
    }
    live[i] = r;
    (*n_live)++;
}

/* ---- gradients in the activation set's dead bytes ----
 * As the backward goes down the layers, more of the micro-batch's
 * activation set is read by nothing to come: a kept value after the
 * backward of its last reader (set_death), a layer's saved state after its
 * own backward. A gradient region born then may lie there, in that
 * micro-batch's set, if it fits in bytes that are dead (they stay dead to
 * the end of the backward) and meets no other region placed there; else it
 * goes to the gradient set as before. ResNet's largest gradients come last,
 * when most of the set is dead. */

/* Adds [off, off + size) to the dead intervals (sorted, touching ones merged). */
static void add_dead(struct region *dead, int *n_dead, size_t off, size_t size)
{
    if (!size) return;
    insert_sorted(dead, n_dead, (struct region){.off = off, .size = size});
    int m = 0;
    for (int i = 0; i < *n_dead; i++) {
        if (m && dead[m - 1].off + dead[m - 1].size >= dead[i].off) {
            size_t end = dead[i].off + dead[i].size;
            if (end > dead[m - 1].off + dead[m - 1].size) dead[m - 1].size = end - dead[m - 1].off;
        } else {
            dead[m++] = dead[i];
        }
    }
    *n_dead = m;
}

/* The first offset where [at, at + size) lies inside one dead interval and
 * meets none of the regions placed in the set (live, sorted by offset);
 * SIZE_MAX when there is none. */
static size_t set_fit_aligned(const struct region *dead, int n_dead, const struct region *live, int n_live,
                              size_t size, size_t align)
{
    for (int d = 0; d < n_dead; d++) {
        size_t at = align_to(dead[d].off, align), end = dead[d].off + dead[d].size;
        for (int r = 0; r < n_live && at + size <= end; r++)
            if (live[r].off < at + size && live[r].off + live[r].size > at)
                at = align_to(live[r].off + live[r].size, align);
        if (at + size <= end) return at;
    }
    return SIZE_MAX;
}

static size_t set_fit(const struct region *dead, int n_dead, const struct region *live, int n_live, size_t size)
{
    return set_fit_aligned(dead, n_dead, live, n_live, size, 1);
}

/* First writers: the backward of a value's birth layer writes its
 * gradient whole (gp_layer_call.din_overwrite) instead of adding into a
 * cleared region, where its kernel can (gp_compute_ops.overwrites), the
 * layer reads the value once (a value read twice gets two terms from one
 * call), in a differentiable slot below 32, and runs per micro-batch (a
 * once-per-step layer's gradients accumulate over the micro-batches). A
 * gradient that arrives from the next stage is seeded, not written. Marks
 * the values in `overwritten` and the layers' bits in p->din_overwrite. */
static void first_writers(const struct gp_graph *g, const struct gp_compute_ops *ops, const int *birth,
                          const bool *inbox, struct gp_stage_plan *p, bool *overwritten)
{
    if (!ops || !ops->overwrites) return;
    for (int v = 0; v < g->n_values; v++) {
        int b = birth[v];
        if (b == INT_MIN || inbox[v] || b < p->first || b >= p->last || p->once[b - p->first]) continue;
        const struct gp_node *n = &g->nodes[b];
        int slot = -1, reads = 0;
        for (int k = 0; k < n->n_inputs; k++)
            if (n->inputs[k] == v) slot = k, reads++;
        if (reads != 1 || slot >= 32 || ((n->def->nondiff_inputs >> slot) & 1)) continue;
        if (!ops->overwrites(g, n, slot)) continue;
        overwritten[v] = true;
        p->din_overwrite[b - p->first] |= 1u << slot;
    }
}

/* Gradient addends (plan.h): value v's gradient, planned here (birth[v]
 * set), not arriving from the next stage nor seeded by the loss (a graph
 * output), is output 0 of a per-micro-batch layer of the stage and gets
 * terms from at least two layers. Its first reader in a differentiable
 * slot, the last backward to add into it, runs per micro-batch, reads it
 * once (one term), in a slot below 32 whose gradient its kernel writes
 * whole (overwrites), and the backend says that the producer can take
 * that term apart (grad_addend). Sets p->addend_writer. */
static void plan_addends(const struct gp_graph *g, const struct gp_compute_ops *ops, const int *birth,
                         const bool *inbox, struct gp_stage_plan *p)
{
    for (int v = 0; v < g->n_values; v++) p->addend_writer[v] = INT_MIN;
    if (!ops || !ops->grad_addend || !ops->overwrites || gp_grad_addends() == GP_GRAD_ADDENDS_OFF) return;
    for (int v = 0; v < g->n_values; v++) {
        int prod = g->values[v].producer;
        if (birth[v] == INT_MIN || inbox[v] || g->values[v].is_output || prod < p->first || prod >= p->last ||
            p->once[prod - p->first] || g->nodes[prod].outputs[0] != v)
            continue;
        int writer = INT_MIN, slot = -1, terms = 0, writer_terms = 0;
        for (int i = p->last - 1; i > prod; i--) {
            const struct gp_node *n = &g->nodes[i];
            int here = 0, at = -1;
            for (int k = 0; k < n->n_inputs; k++)
                if (n->inputs[k] == v && !(k < 32 && ((n->def->nondiff_inputs >> k) & 1))) here++, at = k;
            if (!here) continue;
            terms += here;
            writer = i, slot = at, writer_terms = here; /* the lowest so far */
        }
        if (writer == INT_MIN || terms < 2 || writer_terms != 1 || slot >= 32 || p->once[writer - p->first]) continue;
        const struct gp_node *w = &g->nodes[writer];
        if (!ops->overwrites(g, w, slot) || !ops->grad_addend(g, &g->nodes[prod], w, slot, p->dt[v])) continue;
        p->addend_writer[v] = writer;
    }
}

/* Values remade in the backward (plan.h) are regions of the set too, from
 * the backward of their last reader (remade_at) to their own layer's. A
 * region lies in the activation set's dead bytes where it fits (above;
 * set_death from plan_arena), but for the input frontier's gradients,
 * which are copied out after the backward while the set may be reused,
 * and the output frontier's, born before anything is dead. */
static gp_status plan_gradients(const struct gp_graph *g, const bool *needs_grad, const struct gp_compute_ops *ops,
                                struct gp_stage_plan *p, const bool *inbox, const int *remade_at,
                                const int *set_death, struct gp_error *err)
{
    int nv = g->n_values, first = p->first, last = p->last, nl = last - first;
    int *birth = malloc(sizeof(int) * ((size_t)nv + 1)); /* layer (or last: the start) */
    /* Regions in the gradient set, regions in the set, the set's dead
     * intervals (at most one a value and one a layer). */
    struct region *live = malloc(sizeof *live * ((size_t)nv + 1));
    struct region *in_set = malloc(sizeof *in_set * ((size_t)nv + 1));
    struct region *dead = malloc(sizeof *dead * ((size_t)nv + (size_t)nl + 2));
    p->born_start = calloc((size_t)nl + 2, sizeof(int));
    p->born = malloc(sizeof(int) * ((size_t)nv + 1));
    p->remade_start = calloc((size_t)nl + 2, sizeof(int));
    p->remade = malloc(sizeof(int) * ((size_t)nv + 1));
    p->grad_in_set = calloc((size_t)nv + 1, sizeof(bool));
    p->remade_in_set = calloc((size_t)nv + 1, sizeof(bool));
    p->addend_writer = malloc(sizeof(int) * ((size_t)nv + 1));
    p->addend_off = malloc(sizeof(size_t) * ((size_t)nv + 1));
    p->addend_in_set = calloc((size_t)nv + 1, sizeof(bool));
    if (!birth || !live || !in_set || !dead || !p->born_start || !p->born || !p->remade_start || !p->remade ||
        !p->grad_in_set || !p->remade_in_set || !p->addend_writer || !p->addend_off || !p->addend_in_set) {
        free(birth);
        free(live);
        free(in_set);
        free(dead);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory planning a stage");
    }
    bool use_sets = gp_env_flag("GP_GRADIENTS_IN_SETS", true);
    int n_set = 0, n_dead = 0;
    for (int v = 0; v < nv; v++) birth[v] = INT_MIN;
    for (int v = 0; v < nv; v++) {
        if (!needs_grad[v] || (p->home[v] != GP_HOME_BOX && p->home[v] != GP_HOME_LOCAL &&
                               p->home[v] != GP_HOME_ARENA))
            continue;
        int b = inbox[v] ? last : INT_MIN;
        for (int i = first; i < last && !inbox[v]; i++) {
            const struct gp_node *n = &g->nodes[i];
            for (int k = 0; k < n->n_inputs; k++)
                if (n->inputs[k] == v && i > b) b = i;
        }
        /* Read by no layer of the stage and not arriving: born (zero) at
         * its producer, which reads it as an absent gradient. */
        if (b == INT_MIN) b = g->values[v].producer >= first ? g->values[v].producer : first;
        birth[v] = b;
    }
    plan_addends(g, ops, birth, inbox, p);
    for (int v = 0; v < nv; v++) p->addend_off[v] = SIZE_MAX;
    /* Births grouped by time: index t = last - b (0: the start, then the
     * layers from last - 1 down to first). */
    for (int v = 0; v < nv; v++)
        if (birth[v] != INT_MIN) p->born_start[last - birth[v] + 1]++;
    for (int t = 0; t <= nl; t++) p->born_start[t + 1] += p->born_start[t];
    int *fill = calloc((size_t)nl + 2, sizeof(int));
    if (!fill) {
        free(birth);
        free(live);
        free(in_set);
        free(dead);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory planning a stage");
    }
    for (int v = 0; v < nv; v++)
        if (birth[v] != INT_MIN) {
            int t = last - birth[v];
            p->born[p->born_start[t] + fill[t]++] = v;
        }
    /* The remade values, by time alike. */
    for (int v = 0; v < nv; v++)
        if (remade_at[v] != INT_MIN) p->remade_start[last - remade_at[v] + 1]++;
    for (int t = 0; t <= nl; t++) p->remade_start[t + 1] += p->remade_start[t];
    memset(fill, 0, sizeof(int) * ((size_t)nl + 2));
    for (int v = 0; v < nv; v++)
        if (remade_at[v] != INT_MIN) {
            int t = last - remade_at[v];
            p->remade[p->remade_start[t] + fill[t]++] = v;
        }
    free(fill);

    int n_live = 0;
    p->grad_bytes = 0;
    for (int t = 0; t <= nl; t++) {
        int layer = last - t; /* t = 0: the start (layer == last) */
        /* The gradients born now, then the values remade now, then the
         * addends this layer's backward writes (q from n_born + n_remade
         * on, every value looked at: few layers write any). */
        int n_born = p->born_start[t + 1] - p->born_start[t], n_remade = p->remade_start[t + 1] - p->remade_start[t];
        for (int q = 0; q < n_born + n_remade + (layer < last ? nv : 0); q++) {
            bool remade = q >= n_born && q < n_born + n_remade, addend = q >= n_born + n_remade;
            int v = addend   ? q - n_born - n_remade
                    : remade ? p->remade[p->remade_start[t] + q - n_born]
                             : p->born[p->born_start[t] + q];
            if (addend && p->addend_writer[v] != layer) continue;
            size_t size = align64(gp_plan_value_bytes(g, p, v));
            int producer = g->values[v].producer;
            struct region r = {.size = size,
                               .until = p->home[v] == GP_HOME_BOX || producer < first ? INT_MIN : producer};
            size_t at = use_sets && r.until != INT_MIN && !(inbox[v] && !remade && !addend)
                            ? set_fit(dead, n_dead, in_set, n_set, size)
                            : SIZE_MAX;
            if (at != SIZE_MAX) {
                r.off = at;
                insert_sorted(in_set, &n_set, r);
            } else {
                r.off = first_fit(live, n_live, size);
                if (r.off + size > p->grad_bytes) p->grad_bytes = r.off + size;
                insert_sorted(live, &n_live, r);
            }
            *(addend ? &p->addend_off[v] : remade ? &p->remade_off[v] : &p->grad_off[v]) = r.off;
            *(addend ? &p->addend_in_set[v] : remade ? &p->remade_in_set[v] : &p->grad_in_set[v]) = at != SIZE_MAX;
        }
        /* Then this layer's backward workspace, alive for its call only:
         * in the set's dead bytes where it fits, else the block's. */
        size_t ws = layer < last ? p->bwd_scratch_bytes[layer - first] : 0;
        if (ws) {
            size_t at = use_sets ? set_fit_aligned(dead, n_dead, in_set, n_set, align64(ws), GP_SCRATCH_ALIGN)
                                 : SIZE_MAX;
            if (at != SIZE_MAX) {
                insert_sorted(in_set, &n_set, (struct region){.off = at, .size = align64(ws), .until = layer});
                p->bwd_scratch_off[layer - first] = at;
            }
        }
        /* After this layer's backward its outputs' gradients (and its
         * remade output) are done, and the set's bytes that only it read
         * (its saved state, the values it was the last to read) are dead. */
        if (layer < last) {
            int kept = 0;
            for (int r = 0; r < n_live; r++)
                if (live[r].until != layer) live[kept++] = live[r];
            n_live = kept;
            kept = 0;
            for (int r = 0; r < n_set; r++)
                if (in_set[r].until != layer) in_set[kept++] = in_set[r];
            n_set = kept;
            add_dead(dead, &n_dead, p->saved_off[layer - first], align64(ops->saved_bytes(g, &g->nodes[layer])));
            for (int v = 0; v < nv; v++)
                if (set_death[v] == layer) add_dead(dead, &n_dead, p->off[v], align64(gp_plan_value_bytes(g, p, v)));
        }
    }
    free(in_set);
    free(dead);
    /* What to zero at each time, as byte ranges: the regions born together
     * and not written whole by their first writer, sorted by place (the
     * gradient set's, then the activation set's) and offset, touching ones
     * of one place merged, so the step issues one clear per range rather
     * than one per value. */
    p->zero_start = calloc((size_t)nl + 2, sizeof(int));
    p->zeros = malloc(sizeof *p->zeros * ((size_t)p->born_start[nl + 1] + 1));
    p->din_overwrite = calloc((size_t)nl + 1, sizeof(uint32_t));
    bool *overwritten = calloc((size_t)nv + 1, sizeof(bool));
    if (!p->zero_start || !p->zeros || !p->din_overwrite || !overwritten) {
        free(birth);
        free(live);
        free(overwritten);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory planning a stage");
    }
    first_writers(g, ops, birth, inbox, p, overwritten);
    /* An addend's writer writes it whole (plan_addends chose writers that can). */
    for (int v = 0; v < nv; v++) {
        int w = p->addend_writer[v];
        if (w == INT_MIN) continue;
        for (int k = 0; k < g->nodes[w].n_inputs && k < 32; k++)
            if (g->nodes[w].inputs[k] == v) p->din_overwrite[w - first] |= 1u << k;
    }
    /* The output frontier's gradients start as copies of what arrived in
     * the inbox (tasks.c, run_backward), written whole before any layer
     * adds to them: no clear (for GPT-2's logits, 1.65 GB of zeros written
     * and read back per micro-batch). */
    for (int v = 0; v < nv; v++)
        if (inbox[v] && birth[v] != INT_MIN) overwritten[v] = true;
    int nz = 0;
    for (int t = 0; t <= nl; t++) {
        p->zero_start[t] = nz;
        int n = 0;
        for (int q = p->born_start[t]; q < p->born_start[t + 1]; q++) {
            int v = p->born[q];
            if (overwritten[v]) continue;
            /* `until` holds the place here: 1 in the activation set. */
            live[n++] = (struct region){.off = p->grad_off[v], .size = align64(gp_plan_value_bytes(g, p, v)),
                                        .until = p->grad_in_set[v]};
        }
        for (int i = 1; i < n; i++) /* insertion sort: few regions per time */
            for (int k = i; k > 0 && (live[k - 1].until > live[k].until ||
                                      (live[k - 1].until == live[k].until && live[k - 1].off > live[k].off));
                 k--) {
                struct region tmp = live[k];
                live[k] = live[k - 1];
                live[k - 1] = tmp;
            }
        for (int i = 0; i < n; i++) {
            struct gp_byte_range *prev = nz > p->zero_start[t] ? &p->zeros[nz - 1] : NULL;
            if (prev && prev->in_set == (live[i].until != 0) && prev->off + prev->bytes == live[i].off)
                prev->bytes += live[i].size;
            else
                p->zeros[nz++] = (struct gp_byte_range){live[i].off, live[i].size, live[i].until != 0};
        }
    }
    p->zero_start[nl + 1] = nz;
    free(birth);
    free(live);
    free(overwritten);
    return GP_OK;
}

/* ---- forward-only activations ----
 * A value the stage makes that no backward reads (gp_backward_reads), that
 * is not in the output frontier (copied to the next stage) and not a graph
 * output, is needed only until its last reader's forward: such values share
 * one arena, offsets given first fit in forward order (a layer's outputs
 * are placed before its inputs that end there are released), so the arena
 * takes about the largest number of bytes alive at once. Every micro-batch
 * reuses it: nothing in it outlives its forward. */

/* Whether layer i's output v may be remade in the backward instead of
 * kept (plan.h, remade_off): asked for, the kernel can, v is its output 0
 * and stays in the stage, the layer runs per micro-batch, and every input
 * it reads is static or kept for the whole backward (a box or the set),
 * not in the arena, which the next forward reuses. */
static bool remakeable(const struct gp_graph *g, const struct gp_compute_ops *ops,
                       const struct gp_compute_options *opts, const struct gp_stage_plan *p, int i, int v,
                       const bool *pinned)
{
    const struct gp_node *n = &g->nodes[i];
    if (!opts || !opts->remake_norm || (opts->remake_only && !opts->remake_only[v]) || !ops || !ops->remakes ||
        pinned[v] || n->outputs[0] != v || p->once[i - p->first] || !ops->remakes(g, n))
        return false;
    for (int k = 0; k < n->n_inputs; k++) {
        int u = n->inputs[k];
        if (u >= 0 && p->home[u] != GP_HOME_STATIC && p->home[u] != GP_HOME_STEP && p->home[u] != GP_HOME_BOX &&
            p->home[u] != GP_HOME_LOCAL)
            return false;
    }
    return true;
}

/* remade_at[v]: for a value remade in the backward, the layer whose
 * backward reads it first (the last reader); INT_MIN for the others.
 * set_death[v]: for a value kept in the activation set, the layer after
 * whose backward nothing reads it again (its first reader, the remake of
 * a value made from it counting as a read by that value's remade_at
 * layer), so its bytes of the set may hold gradients from then on; INT_MIN
 * where that never comes (read by no backward, or copied to the next
 * stage or a graph output: other streams read those). */
/* Workspaces placed in the arena and the sets (plan.h), unless
 * GP_SCRATCH_IN_SETS=0 keeps them all in the block. */
static bool scratch_in_sets(void)
{
    return gp_env_flag("GP_SCRATCH_IN_SETS", true);
}

static gp_status plan_arena(const struct gp_graph *g, const bool *needs_grad, const struct gp_compute_ops *ops,
                            const struct gp_compute_options *opts, struct gp_stage_plan *p, int *remade_at,
                            int *set_death, struct gp_error *err)
{
    int nv = g->n_values, first = p->first, last = p->last;
    bool *kept = calloc((size_t)nv + 1, sizeof(bool));
    bool *pinned = calloc((size_t)nv + 1, sizeof(bool));
    int *last_read = malloc(sizeof(int) * ((size_t)nv + 1));
    int *first_bwd = malloc(sizeof(int) * ((size_t)nv + 1)); /* the last layer whose backward reads it */
    struct region *live = malloc(sizeof *live * ((size_t)nv + 1));
    if (!kept || !pinned || !last_read || !first_bwd || !live) {
        free(kept);
        free(pinned);
        free(last_read);
        free(first_bwd);
        free(live);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory planning a stage");
    }
    for (int v = 0; v < nv; v++) last_read[v] = first_bwd[v] = remade_at[v] = set_death[v] = INT_MIN;
    for (int k = 0; k < p->n_frontier_out; k++) kept[p->frontier_out[k]] = pinned[p->frontier_out[k]] = true;
    for (int k = 0; k < g->n_outputs; k++) kept[g->outputs[k]] = pinned[g->outputs[k]] = true;
    for (int i = first; i < last; i++) {
        const struct gp_node *n = &g->nodes[i];
        /* A layer runs its backward only when a gradient flows in and one
         * is wanted out of it (tasks.c): otherwise it reads nothing. */
        uint32_t din = backward_din(g, needs_grad, p, n);
        uint32_t reads_in = 0, reads_out = 0;
        if (din) gp_backward_reads(n, din, &reads_in, &reads_out);
        for (int k = 0; k < n->n_inputs; k++) {
            int v = n->inputs[k];
            if (v < 0) continue;
            if (k >= 32 || (reads_in >> k) & 1) {
                kept[v] = true, first_bwd[v] = i;
                if (set_death[v] == INT_MIN) set_death[v] = i;
            }
            if (i > last_read[v]) last_read[v] = i;
        }
        for (int k = 0; k < n->n_outputs; k++) {
            int v = n->outputs[k];
            if (v < 0 || !(k >= 32 || (reads_out >> k) & 1)) continue;
            kept[v] = true, first_bwd[v] = i;
            if (set_death[v] == INT_MIN) set_death[v] = i;
        }
    }
    int n_live = 0;
    p->arena_bytes = 0;
    for (int i = first; i < last; i++) {
        const struct gp_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_outputs; k++) {
            int v = n->outputs[k];
            if (v < 0 || p->home[v] != GP_HOME_LOCAL) continue;
            /* Layers come in order, so the inputs' homes are settled. */
            if (kept[v] && !remakeable(g, ops, opts, p, i, v, pinned)) continue;
            if (kept[v]) {
                remade_at[v] = first_bwd[v];
                /* The remake reads the layer's inputs then. */
                for (int q = 0; q < n->n_inputs; q++) {
                    int u = n->inputs[q];
                    if (u >= 0 && set_death[u] > remade_at[v]) set_death[u] = remade_at[v];
                }
            }
            p->home[v] = GP_HOME_ARENA;
            size_t size = align64(gp_plan_value_bytes(g, p, v));
            struct region r = {.off = first_fit(live, n_live, size), .size = size,
                               .until = last_read[v] >= i ? last_read[v] : i};
            p->off[v] = r.off;
            if (r.off + size > p->arena_bytes) p->arena_bytes = r.off + size;
            insert_sorted(live, &n_live, r);
        }
        int kept_n = 0;
        for (int r = 0; r < n_live; r++)
            if (live[r].until != i) live[kept_n++] = live[r];
        n_live = kept_n;
    }
    /* The forwards' workspaces (plan.h, fwd_scratch_off), each alive during
     * its layer's call, beside the arena values alive then, where that
     * fits below the arena's size: a second walk over the same regions,
     * which never grows the arena. Not a once-per-step layer's, nor one
     * whose output is remade (its remake is a forward in the backward,
     * when the arena is not the forward's). */
    n_live = 0;
    for (int i = first; i < last && scratch_in_sets(); i++) {
        const struct gp_node *n = &g->nodes[i];
        bool remakes_here = false;
        for (int k = 0; k < n->n_outputs; k++) {
            int v = n->outputs[k];
            if (v < 0 || p->home[v] != GP_HOME_ARENA) continue;
            remakes_here |= remade_at[v] != INT_MIN;
            insert_sorted(live, &n_live,
                          (struct region){.off = p->off[v], .size = align64(gp_plan_value_bytes(g, p, v)),
                                          .until = last_read[v] >= i ? last_read[v] : i});
        }
        size_t ws = align64(p->fwd_scratch_bytes[i - first]);
        if (ws && !p->once[i - first] && !remakes_here) {
            size_t at = first_fit_aligned(live, n_live, ws, GP_SCRATCH_ALIGN);
            if (at + ws <= p->arena_bytes) p->fwd_scratch_off[i - first] = at;
        }
        int kept_n = 0;
        for (int r = 0; r < n_live; r++)
            if (live[r].until != i) live[kept_n++] = live[r];
        n_live = kept_n;
    }
    for (int v = 0; v < nv; v++)
        if (pinned[v] || p->home[v] != GP_HOME_LOCAL) set_death[v] = INT_MIN;
    free(kept);
    free(pinned);
    free(last_read);
    free(first_bwd);
    free(live);
    return GP_OK;
}

/* ---- layers computed once per step ----
 * A layer whose every input is static (or made by such a layer), that keeps
 * no saved state, does not depend on training mode or the dropout key, and
 * whose outputs stay in the stage (not the frontier, not a graph output)
 * computes the same values for every micro-batch: its outputs get one home
 * per step (with a gradient that accumulates over the micro-batches, as a
 * parameter's does). Exporters make such layers of every Linear weight's
 * transpose, so this saves two transposes of every weight per micro-batch. */
/* Whether layer n runs once per step: it saves nothing, is no Dropout or
 * BatchNormalization, makes no leaf (an output frontier's value, a graph
 * output: those are per micro-batch) and reads only fixed values (static
 * ones, or those of once-per-step layers before it). */
static bool runs_once(const struct gp_graph *g, size_t (*saved_bytes)(const struct gp_graph *, const struct gp_node *),
                      const struct gp_node *n, const bool *fixed, const bool *leaves)
{
    bool ok = saved_bytes(g, n) == 0 && strcmp(n->op_type, "Dropout") != 0 &&
              strcmp(n->op_type, "BatchNormalization") != 0 && n->n_outputs > 0;
    for (int k = 0; ok && k < n->n_inputs; k++) ok = n->inputs[k] < 0 || fixed[n->inputs[k]];
    for (int k = 0; ok && k < n->n_outputs; k++) ok = n->outputs[k] < 0 || !leaves[n->outputs[k]];
    return ok;
}

static gp_status plan_once(const struct gp_graph *g, const struct gp_compute_ops *ops, struct gp_stage_plan *p,
                           struct gp_error *err)
{
    int first = p->first, last = p->last;
    p->once = calloc((size_t)(last - first) + 1, sizeof(bool));
    if (!p->once) return gp_error_set(err, GP_ERR_NOMEM, "out of memory planning a stage");
    bool *leaves = calloc((size_t)g->n_values + 1, sizeof(bool)), *fixed = calloc((size_t)g->n_values + 1, sizeof(bool));
    if (!leaves || !fixed) {
        free(leaves);
        free(fixed);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory planning a stage");
    }
    for (int k = 0; k < p->n_frontier_out; k++) leaves[p->frontier_out[k]] = true;
    for (int k = 0; k < g->n_outputs; k++) leaves[g->outputs[k]] = true;
    for (int v = 0; v < g->n_values; v++) fixed[v] = p->home[v] == GP_HOME_STATIC || p->home[v] == GP_HOME_STEP;
    for (int i = first; i < last; i++) {
        const struct gp_node *n = &g->nodes[i];
        if (!runs_once(g, ops->saved_bytes, n, fixed, leaves)) continue;
        p->once[i - first] = true;
        for (int k = 0; k < n->n_outputs; k++) {
            int v = n->outputs[k];
            if (v < 0) continue;
            p->home[v] = GP_HOME_STEP;
            fixed[v] = true;
            p->off[v] = p->step_bytes;
            p->step_bytes += align64(gp_plan_value_bytes(g, p, v));
            /* Its gradient sums over the micro-batches, like a parameter's: float32. */
            p->step_grad_off[v] = p->step_grad_bytes;
            p->step_grad_bytes += align64((size_t)gp_shape_numel(&g->values[v].shape) * sizeof(float));
        }
    }
    free(leaves);
    free(fixed);
    return GP_OK;
}

bool gp_plan_backward_kept(const struct gp_graph *g, const bool *needs_grad,
                           size_t (*saved_bytes)(const struct gp_graph *, const struct gp_node *),
                           bool (*remakes)(const struct gp_graph *, const struct gp_node *), bool *kept)
{
    int nv = g->n_values;
    bool *leaves = calloc((size_t)nv + 1, sizeof(bool)), *fixed = calloc((size_t)nv + 1, sizeof(bool));
    if (!leaves || !fixed) {
        free(leaves);
        free(fixed);
        return false;
    }
    /* One stage holding the whole graph: static values are those known at
     * load time that no layer makes (plan_stage's homes). */
    for (int v = 0; v < nv; v++) fixed[v] = g->values[v].constant;
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_outputs; k++)
            if (g->nodes[i].outputs[k] >= 0) fixed[g->nodes[i].outputs[k]] = false;
    for (int k = 0; k < g->n_outputs; k++)
        if (g->outputs[k] >= 0) leaves[g->outputs[k]] = true;
    for (int i = 0; i < g->n_nodes; i++)
        if (runs_once(g, saved_bytes, &g->nodes[i], fixed, leaves))
            for (int k = 0; k < g->nodes[i].n_outputs; k++)
                if (g->nodes[i].outputs[k] >= 0) fixed[g->nodes[i].outputs[k]] = true;
    for (int v = 0; v < nv; v++) kept[v] = leaves[v];
    for (int i = 0; i < g->n_nodes; i++) {
        const struct gp_node *n = &g->nodes[i];
        uint32_t din = backward_din(g, needs_grad, NULL, n), reads_in = 0, reads_out = 0;
        if (!din) continue;
        gp_backward_reads(n, din, &reads_in, &reads_out);
        for (int k = 0; k < n->n_inputs; k++)
            if (n->inputs[k] >= 0 && (k >= 32 || (reads_in >> k) & 1)) kept[n->inputs[k]] = true;
        for (int k = 0; k < n->n_outputs; k++)
            if (n->outputs[k] >= 0 && (k >= 32 || (reads_out >> k) & 1)) kept[n->outputs[k]] = true;
    }
    /* Once-per-step values live in the step's block, not a set. */
    for (int v = 0; v < nv; v++) kept[v] = kept[v] && !fixed[v];
    /* Remade outputs (remakeable's rule, in forward order): their inputs
     * must stay for the backward, as constants (static), once-per-step
     * values (fixed), the stage's inputs (no layer makes them) or kept. */
    bool *made = remakes ? calloc((size_t)nv + 1, sizeof(bool)) : NULL;
    for (int i = 0; made && i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_outputs; k++)
            if (g->nodes[i].outputs[k] >= 0) made[g->nodes[i].outputs[k]] = true;
    for (int i = 0; made && i < g->n_nodes; i++) {
        const struct gp_node *n = &g->nodes[i];
        int v = n->n_outputs > 0 ? n->outputs[0] : -1;
        if (v < 0 || !kept[v] || leaves[v] || !remakes(g, n)) continue;
        bool stays = true;
        for (int k = 0; k < n->n_inputs; k++) {
            int u = n->inputs[k];
            if (u >= 0 && made[u] && !fixed[u] && !kept[u]) stays = false;
        }
        if (stays) kept[v] = false;
    }
    bool ok = !remakes || made;
    free(made);
    free(leaves);
    free(fixed);
    return ok;
}

/* ---- kernel workspace ----
 * Layer i's asks: its forward's workspace and, for the gradients its
 * backward computes (din), its backward's, apart (the arena and the sets
 * place them: plan_arena, plan_gradients), or, for a once-per-step layer
 * (its calls run outside the micro-batches' timelines) and with
 * GP_SCRATCH_IN_SETS=0, the most of both, for the block. In bf16 also for
 * its calls on float32 tensors where it has any (float_call: a
 * convolution then runs a float32 problem, whose algorithms may ask far
 * more than its bfloat16 ones: up to ~1 GiB against ~0.2 on ResNet-50 at
 * batch 128). */
static void plan_scratch(const struct gp_graph *g, const struct gp_compute_ops *ops,
                         const struct gp_compute_options *opts, struct gp_stage_plan *p, int i, uint32_t din,
                         bool float_call)
{
    uint32_t flags = float_call ? GP_SCRATCH_FLOAT_CALL : 0;
    bool apart = !p->once[i - p->first] && scratch_in_sets();
    p->fwd_scratch_bytes[i - p->first] = ops->scratch_bytes(g, &g->nodes[i], opts, (apart ? 0 : din) | flags);
    if (apart && din)
        p->bwd_scratch_bytes[i - p->first] = ops->scratch_bytes(g, &g->nodes[i], opts, din | flags | GP_SCRATCH_BACKWARD);
}

/* The kernel workspace block: the most any call asks that has no place in
 * the arena or a set (the loss's is added by the stage). */
static void plan_block(struct gp_stage_plan *p)
{
    p->scratch_bytes = 0;
    p->scratch_layer = -1;
    for (int i = p->first; i < p->last; i++) {
        size_t f = p->fwd_scratch_off[i - p->first] == SIZE_MAX ? p->fwd_scratch_bytes[i - p->first] : 0;
        size_t b = p->bwd_scratch_off[i - p->first] == SIZE_MAX ? p->bwd_scratch_bytes[i - p->first] : 0;
        if (f > p->scratch_bytes) p->scratch_bytes = f, p->scratch_layer = i;
        if (b > p->scratch_bytes) p->scratch_bytes = b, p->scratch_layer = i;
    }
}

/* ---- float32 staging ----
 * The most any call of the stage needs for float32 [N, C, H, W] copies of
 * its channels-last tensors, for kernels that read them otherwise
 * (backend/mixed_call.h), forward or backward; nothing when no value is
 * channels-last. And each layer's workspace (no bfloat16 here). */
static gp_status plan_layout_staging(const struct gp_graph *g, const bool *needs_grad,
                                     const struct gp_compute_ops *ops, const struct gp_compute_options *opts,
                                     struct gp_stage_plan *p)
{
    for (int i = p->first; i < p->last; i++) {
        const struct gp_node *n = &g->nodes[i];
        uint32_t din = backward_din(g, needs_grad, p, n);
        const void *kernel = ops->kernel_for(n);
        size_t f = gp_mixed_staging_bytes(ops, kernel, g, n, NULL, NULL, NULL, NULL, false, 0);
        size_t b = din ? gp_mixed_staging_bytes(ops, kernel, g, n, NULL, NULL, NULL, NULL, true, din) : 0;
        if (f > p->staging_bytes) p->staging_bytes = f;
        if (b > p->staging_bytes) p->staging_bytes = b;
        plan_scratch(g, ops, opts, p, i, din, false);
    }
    return GP_OK;
}

/* ---- bf16 calls and their float32 staging ----
 * Every layer's call types, planned once (the step only reads them), and the
 * most any call of the stage needs for float32 copies of its bfloat16
 * (or channels-last) tensors (kernels that compute in float32), forward or
 * backward, the loss on the last stage's output (nothing where the
 * backend's loss reads bfloat16 itself); each layer's workspace for the
 * calls it makes (plan_scratch). Evaluation reads a bfloat16
 * output back as it is and widens it on the host (gp_pipeline_eval). */
static gp_status plan_calls(const struct gp_graph *g, const bool *needs_grad, const struct gp_compute_ops *ops,
                            const struct gp_compute_options *opts, struct gp_stage_plan *p, struct gp_error *err)
{
    p->staging_bytes = 0;
    int n_layers = p->last - p->first;
    p->bwd_scratch_bytes = calloc((size_t)n_layers + 1, sizeof(size_t));
    p->bwd_scratch_off = malloc(sizeof(size_t) * ((size_t)n_layers + 1));
    p->fwd_scratch_bytes = calloc((size_t)n_layers + 1, sizeof(size_t));
    p->fwd_scratch_off = malloc(sizeof(size_t) * ((size_t)n_layers + 1));
    if (!p->bwd_scratch_bytes || !p->bwd_scratch_off || !p->fwd_scratch_bytes || !p->fwd_scratch_off)
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory planning a stage");
    for (int i = 0; i < n_layers; i++) p->bwd_scratch_off[i] = p->fwd_scratch_off[i] = SIZE_MAX;
    if (p->precision != GP_PRECISION_BF16) return plan_layout_staging(g, needs_grad, ops, opts, p);
    int nl = p->last - p->first;
    size_t total = 0;
    p->call_dt_off = malloc(sizeof(size_t) * ((size_t)nl + 1));
    p->call_shadowed = calloc((size_t)nl + 1, sizeof(uint32_t));
    if (!p->call_dt_off || !p->call_shadowed) return gp_error_set(err, GP_ERR_NOMEM, "out of memory planning a stage");
    for (int i = p->first; i < p->last; i++) {
        p->call_dt_off[i - p->first] = total;
        total += 2 * (size_t)(g->nodes[i].n_inputs + g->nodes[i].n_outputs + 2);
    }
    p->call_dt = malloc(sizeof *p->call_dt * (total + 1));
    if (!p->call_dt) return gp_error_set(err, GP_ERR_NOMEM, "out of memory planning a stage");
    for (size_t e = 0; e < total; e++) p->call_dt[e] = GP_DTYPE_FLOAT32;
    for (int i = p->first; i < p->last; i++) {
        const struct gp_node *n = &g->nodes[i];
        enum gp_dtype *in_dt = p->call_dt + p->call_dt_off[i - p->first], *out_dt = in_dt + n->n_inputs + 1;
        enum gp_dtype *din_dt = out_dt + n->n_outputs + 1, *dout_dt = din_dt + n->n_inputs + 1;
        call_types(p, n, in_dt, out_dt, din_dt, dout_dt, &p->call_shadowed[i - p->first]);
        uint32_t din = backward_din(g, needs_grad, p, n);
        const void *kernel = ops->kernel_for(n);
        size_t f = gp_mixed_staging_bytes(ops, kernel, g, n, in_dt, out_dt, NULL, NULL, false, 0);
        size_t b = din ? gp_mixed_staging_bytes(ops, kernel, g, n, in_dt, out_dt, din_dt, dout_dt, true, din) : 0;
        if (f > p->staging_bytes) p->staging_bytes = f;
        if (b > p->staging_bytes) p->staging_bytes = b;
        /* On float32 tensors: staged (copies), or its output stored so. */
        plan_scratch(g, ops, opts, p, i, din, f > 0 || b > 0 || (n->n_outputs > 0 && out_dt[0] == GP_DTYPE_FLOAT32));
    }
    for (int k = 0; k < g->n_outputs; k++) {
        int v = g->outputs[k];
        if (p->home[v] != GP_HOME_LOCAL && p->home[v] != GP_HOME_BOX) continue;
        size_t l = gp_mixed_loss_staging_bytes(ops, &g->values[v].shape, p->dt[v], p->dt[v]);
        if (l > p->staging_bytes) p->staging_bytes = l;
    }
    return GP_OK;
}

size_t gp_plan_shared_bytes(const struct gp_stage_plan *p)
{
    if (!p->grads_share_arena) return p->arena_bytes + p->grad_bytes;
    return p->arena_bytes > p->grad_bytes ? p->arena_bytes : p->grad_bytes;
}

gp_status gp_plan_stage(const struct gp_graph *g, const struct gp_layers *l, const bool *needs_grad,
                        const struct gp_compute_ops *ops, const struct gp_compute_options *opts,
                        const char *backend, int first, int last, struct gp_stage_plan *p,
                        struct gp_error *err)
{
    memset(p, 0, sizeof *p);
    p->scratch_layer = -1;
    p->precision = opts->precision;
    GP_TRY(check_kernels(g, ops, backend, needs_grad, first, last, err));
    int nv = g->n_values;
    p->first = first;
    p->last = last;
    p->home = calloc((size_t)nv + 1, sizeof *p->home);
    p->off = calloc((size_t)nv + 1, sizeof *p->off);
    p->grad_off = malloc(sizeof(size_t) * ((size_t)nv + 1));
    p->inbox_off = malloc(sizeof(size_t) * ((size_t)nv + 1));
    p->saved_off = calloc((size_t)(last - first) + 1, sizeof(size_t));
    p->frontier_in = malloc(sizeof(int) * ((size_t)nv + 1));
    p->frontier_out = malloc(sizeof(int) * ((size_t)nv + 1));
    p->dt = calloc((size_t)nv + 1, sizeof *p->dt);
    p->shadow_off = malloc(sizeof(size_t) * ((size_t)nv + 1));
    p->step_grad_off = malloc(sizeof(size_t) * ((size_t)nv + 1));
    p->shadowed = malloc(sizeof(int) * ((size_t)nv + 1));
    p->remade_off = malloc(sizeof(size_t) * ((size_t)nv + 1));
    if (!p->remade_off || !p->home || !p->off || !p->grad_off || !p->inbox_off || !p->saved_off || !p->frontier_in ||
        !p->frontier_out || !p->dt || !p->shadow_off || !p->step_grad_off || !p->shadowed)
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory planning a stage");
    for (int v = 0; v < nv; v++)
        p->grad_off[v] = p->inbox_off[v] = p->shadow_off[v] = p->step_grad_off[v] = p->remade_off[v] = SIZE_MAX;
    p->n_frontier_in = gp_layers_frontier(l, g, first, p->frontier_in);
    p->n_frontier_out = gp_layers_frontier(l, g, last, p->frontier_out);

    /* Homes: the input frontier in boxes, what the stage makes in local
     * sets, and the static values its layers read. */
    for (int k = 0; k < p->n_frontier_in; k++) p->home[p->frontier_in[k]] = GP_HOME_BOX;
    for (int i = first; i < last; i++) {
        const struct gp_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_outputs; k++)
            if (n->outputs[k] >= 0) p->home[n->outputs[k]] = GP_HOME_LOCAL;
        for (int k = 0; k < n->n_inputs; k++) {
            int v = n->inputs[k];
            if (v < 0 || p->home[v] != GP_HOME_NONE) continue;
            const struct gp_value *val = &g->values[v];
            if (!val->constant)
                return gp_error_set(err, GP_ERR_INVALID,
                                    "layer %d ('%s') reads '%s', which is neither made before "
                                    "it nor known at load time",
                                    i, n->name, val->name);
            p->home[v] = GP_HOME_STATIC;
            /* A parameter read by layers of several stages (tied: a GPT's
             * embedding and head) is held by each of them, its gradients
             * summed between them before the step (pipeline/tied.c). A
             * buffer has no gradient to sum: BatchNorm's running statistics
             * updated on two devices would diverge, so it has one owner. */
            if (val->kind == GP_VALUE_BUFFER) {
                for (int j = 0; j < g->n_nodes; j++) {
                    if (j >= first && j < last) continue;
                    for (int q = 0; q < g->nodes[j].n_inputs; q++)
                        if (g->nodes[j].inputs[q] == v)
                            return gp_error_set(err, GP_ERR_UNSUPPORTED,
                                                "%s '%s' is read by layer %d ('%s') and by layer %d "
                                                "('%s') in another stage: put both in one stage",
                                                gp_value_kind_name(val->kind), val->name, i,
                                                n->name, j, g->nodes[j].name);
                }
            }
        }
    }

    /* Storage types: in bf16 every float activation (what the stage
     * receives or makes) is bfloat16; static values stay float32, with a
     * bfloat16 shadow where a matrix product or convolution reads them. */
    bool bf16 = opts->precision == GP_PRECISION_BF16;
    for (int v = 0; v < nv; v++) {
        const struct gp_value *val = &g->values[v];
        bool fl = gp_dtype_is_float(val->dtype);
        bool act = p->home[v] != GP_HOME_NONE && p->home[v] != GP_HOME_STATIC;
        p->dt[v] = !fl ? val->dtype : bf16 && act ? GP_DTYPE_BFLOAT16 : GP_DTYPE_FLOAT32;
    }
    for (int i = first; bf16 && i < last; i++) {
        const struct gp_node *n = &g->nodes[i];
        if (!gp_plan_autocast_op(n)) continue;
        for (int k = 0; k < n->n_inputs; k++) {
            int v = n->inputs[k];
            if (v < 0 || p->home[v] != GP_HOME_STATIC || p->dt[v] != GP_DTYPE_FLOAT32 ||
                p->shadow_off[v] != SIZE_MAX)
                continue;
            p->shadow_off[v] = p->shadow_bytes;
            p->shadow_bytes += align64((size_t)gp_shape_numel(&g->values[v].shape) * sizeof(uint16_t));
            p->shadowed[p->n_shadowed++] = v;
        }
    }

    GP_TRY(plan_filter_copies(g, needs_grad, ops, p, err));

    /* Offsets: static values (parameters first, so their gradients can
     * mirror them), boxes, local sets with each layer's saved state. */
    for (int pass = 0; pass < 2; pass++)
        for (int v = 0; v < nv; v++) {
            if (p->home[v] != GP_HOME_STATIC) continue;
            bool param = g->values[v].kind == GP_VALUE_PARAMETER;
            if (param != (pass == 0)) continue;
            p->off[v] = p->static_bytes;
            p->static_bytes += align64(gp_plan_value_bytes(g, p, v));
            if (param) p->param_bytes = p->static_bytes;
        }
    GP_TRY(plan_once(g, ops, p, err));
    int *remade_at = malloc(sizeof(int) * ((size_t)nv + 1)), *set_death = malloc(sizeof(int) * ((size_t)nv + 1));
    if (!remade_at || !set_death) {
        free(remade_at);
        free(set_death);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory planning a stage");
    }
    /* The calls' types, staging and workspace asks first: the arena and
     * the gradients' plan place the workspaces. */
    gp_status st = plan_calls(g, needs_grad, ops, opts, p, err);
    if (st == GP_OK) st = plan_arena(g, needs_grad, ops, opts, p, remade_at, set_death, err);
    if (st != GP_OK) {
        free(remade_at);
        free(set_death);
        return st;
    }
    for (int v = 0; v < nv; v++) {
        if (p->home[v] == GP_HOME_BOX) {
            p->off[v] = p->box_bytes;
            p->box_bytes += align64(gp_plan_value_bytes(g, p, v));
        } else if (p->home[v] == GP_HOME_LOCAL) {
            p->off[v] = p->local_bytes;
            p->local_bytes += align64(gp_plan_value_bytes(g, p, v));
        }
    }
    for (int i = first; i < last; i++) {
        const struct gp_node *n = &g->nodes[i];
        p->saved_off[i - first] = p->local_bytes;
        p->local_bytes += align64(ops->saved_bytes(g, n));
        if (n->n_inputs > p->max_inputs) p->max_inputs = n->n_inputs;
        if (n->n_outputs > p->max_outputs) p->max_outputs = n->n_outputs;
    }
    /* Every set starts where a workspace may (plan_gradients places
     * backward workspaces in a set's dead bytes). */
    p->local_bytes = align_to(p->local_bytes, GP_SCRATCH_ALIGN);
    /* Gradients arriving from the next stage for the output frontier. */
    bool *inbox = calloc((size_t)nv + 1, sizeof(bool));
    if (!inbox) {
        free(remade_at);
        free(set_death);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory planning a stage");
    }
    for (int k = 0; k < p->n_frontier_out; k++) {
        int v = p->frontier_out[k];
        if (!needs_grad[v]) continue;
        inbox[v] = true;
        p->inbox_off[v] = p->inbox_bytes;
        p->inbox_bytes += align64(gp_plan_value_bytes(g, p, v));
    }
    /* One gradient set, reused by every micro-batch's backward, for the
     * stage's values and its input frontier that carry gradients
     * (parameters keep theirs in the static gradient block). */
    st = plan_gradients(g, needs_grad, ops, p, inbox, remade_at, set_death, err);
    free(inbox);
    free(remade_at);
    free(set_death);
    if (st == GP_OK) plan_block(p);
    return st;
}

int gp_plan_addends(const struct gp_graph *g, const struct gp_stage_plan *p)
{
    int n = 0;
    for (int v = 0; p->addend_writer && v < g->n_values; v++) n += p->addend_writer[v] != INT_MIN;
    return n;
}

void gp_plan_free(struct gp_stage_plan *p)
{
    free(p->home);
    free(p->off);
    free(p->grad_off);
    free(p->inbox_off);
    free(p->saved_off);
    free(p->frontier_in);
    free(p->frontier_out);
    free(p->born_start);
    free(p->born);
    free(p->zero_start);
    free(p->zeros);
    free(p->din_overwrite);
    free(p->remade_off);
    free(p->remade_start);
    free(p->remade);
    free(p->grad_in_set);
    free(p->remade_in_set);
    free(p->addend_writer);
    free(p->addend_off);
    free(p->addend_in_set);
    free(p->bwd_scratch_bytes);
    free(p->bwd_scratch_off);
    free(p->fwd_scratch_bytes);
    free(p->fwd_scratch_off);
    free(p->once);
    free(p->dt);
    free(p->shadow_off);
    free(p->step_grad_off);
    free(p->shadowed);
    free(p->call_dt);
    free(p->call_dt_off);
    free(p->call_shadowed);
    free(p->filter_nhwc);
    free(p->filter_off);
    free(p->filter_grad_off);
    free(p->filtered);
    free(p->call_held);
    memset(p, 0, sizeof *p);
}
