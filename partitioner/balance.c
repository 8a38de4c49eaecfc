#include "partitioner/balance.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/slots.h"

/* What the schedule asks of each stage (pipeline/slots.h): activation sets,
 * input-frontier boxes and gradient inboxes held at once, and the share of
 * micro-batches recomputed. */
struct stage_load {
    int sets, boxes, inboxes;
    double recompute;
};

static gp_status stage_loads(const struct gp_balance_config *c, struct stage_load *load, struct gp_error *err)
{
    struct gp_pipe_schedule sched;
    GP_TRY(gp_pipe_schedule_make(c->schedule, c->n_stages, c->n_micro, c->checkpoint, &sched, err));
    struct gp_stage_slots *slots = calloc((size_t)c->n_stages, sizeof *slots);
    gp_status st = slots ? gp_pipe_slots_plan(&sched, slots, err) : gp_error_set(err, GP_ERR_NOMEM, "out of memory balancing");
    for (int s = 0; st == GP_OK && s < c->n_stages; s++) {
        load[s] = (struct stage_load){.sets = slots[s].n_sets, .boxes = slots[s].n_boxes,
                                      .inboxes = slots[s].n_inboxes,
                                      .recompute = (double)slots[s].n_checkpointed / (double)c->n_micro};
        gp_stage_slots_free(&slots[s]);
    }
    free(slots);
    gp_pipe_schedule_free(&sched);
    return st;
}

/* Per-micro-batch time of layer i: forward, backward and, for the share of
 * micro-batches its stage recomputes, forward again. */
static double layer_time(const struct gp_profile *p, const struct stage_load *load, int i)
{
    const struct gp_layer_profile *l = &p->layers[i];
    /* Before each micro-batch's backward the executor clears the gradient
     * regions that no kernel writes first: estimated as one memory pass
     * over the layer's kept activations. */
    double clear_ms = (double)l->activation_bytes / (p->copy_gbps * 1e6);
    return l->forward_ms + l->backward_ms + load->recompute * l->forward_ms + clear_ms;
}

/* Bytes layer i costs its stage: the parameter, its gradient and optimizer
 * state, and its activations once per activation set the stage holds (each
 * micro-batch in flight without checkpointing; one set with it, the others
 * keep only input frontiers). A tied parameter's copy (one an earlier layer
 * owns) with its gradient and state counts where the stage does not hold
 * that earlier reader (`first`: the stage's first layer); the partition
 * searches with it counted always (first = INT_MAX: an additive upper
 * bound, too high only where a stage holds two readers of one tied
 * parameter), the figures count it exactly. */
static double layer_memory(const struct gp_profile *p, const struct gp_balance_config *c,
                           const struct stage_load *load, int i, int first)
{
    const struct gp_layer_profile *l = &p->layers[i];
    int64_t params = l->param_bytes + (l->tied_bytes && l->tied_prev < first ? l->tied_bytes : 0);
    return (double)params * (2 + c->optim_state_floats) + (double)l->activation_bytes * load->sets;
}

/* What stage [first, last) pays once for its largest layer's working set
 * (gp_layer_profile.peak_bytes: the one block of forward-only values and
 * activation gradients a stage plans, sized by its largest need). */
static double stage_peak(const struct gp_profile *p, int first, int last)
{
    double most = 0;
    for (int i = first; i < last; i++)
        if ((double)p->layers[i].peak_bytes > most) most = (double)p->layers[i].peak_bytes;
    return most;
}

/* The frontier at cut c (before layer c), per micro-batch. */
static int64_t frontier_at(const struct gp_profile *p, int c)
{
    return c == 0 ? p->input_frontier_bytes : p->layers[c - 1].frontier_bytes;
}

/* What the first stage holds of the data (pipeline/stage.c's blocks): its
 * boxes of the input frontier (the type the stage stores it in), the
 * mini-batch's rows as they arrive, and by default the next step's rows
 * (pipeline/inputs_ahead.c; in the frontier's type where the stage stores
 * them narrower: bf16 boxes of float32 data). Where the stage converts
 * the rows (bf16) and each micro-batch has a box of its own, the rows may
 * lie in the block of its forward-only activations and gradients
 * (stage.c, inputs_in_block): they cost only what they exceed that block
 * by, about the stage's peak (`peak`; < 0, unknown: the rows counted
 * whole, an upper bound). */
static double first_stage_inputs(const struct gp_profile *p, const struct gp_balance_config *c,
                                 const struct stage_load *load, double peak)
{
    double rows = (double)p->input_bytes * c->n_micro;
    double held = rows;
    if (peak >= 0 && p->input_frontier_bytes < p->input_bytes && load[0].boxes >= c->n_micro)
        held = rows > peak ? rows - peak : 0;
    double ahead = p->input_frontier_bytes < p->input_bytes ? (double)p->input_frontier_bytes * c->n_micro : rows;
    return (double)p->input_frontier_bytes * load[0].boxes + held + (c->inputs_ahead ? ahead : 0);
}

/* What stage s starting at cut c pays for its boundary: receiving the
 * frontier's activations and sending back their gradients (time), or
 * holding its boxes of that frontier and the stage before's inboxes of its
 * gradients (memory, counted here with the stage that receives; the first
 * stage's: its inputs, with the rows counted whole). */
static double boundary_cost(const struct gp_profile *p, const struct gp_balance_config *c,
                            enum gp_balance_by by, const struct stage_load *load, int s, int cut)
{
    if (s == 0 && cut == 0) return by == GP_BALANCE_TIME ? 0 : first_stage_inputs(p, c, load, -1);
    if (cut == 0 || s == 0) return 0;
    double bytes = (double)frontier_at(p, cut);
    if (by == GP_BALANCE_TIME) return 2 * bytes / (p->copy_gbps * 1e6);
    return bytes * (load[s].boxes + load[s - 1].inboxes);
}

/* Bytes counted in double as int64_t, saturated at 9.2e18: a profile's
 * sizes are int64_t each, but their sums and multiples (a parameter's
 * with its gradient and optimizer state) may pass INT64_MAX, whose
 * conversion is undefined (the profile fuzzer's input with 8.4e18
 * parameter bytes). 9.2e18 is exact in double and below 2^63, so a
 * reader converting the figure to double and back (the CLI's bars) stays
 * defined too. */
static int64_t saturated_bytes(double m)
{
    if (!(m > 0)) return 0;
    return m >= 9.2e18 ? (int64_t)9.2e18 : (int64_t)m;
}

static void figures(const struct gp_profile *p, const struct gp_balance_config *c, const struct stage_load *load,
                    const struct gp_partition *part, struct gp_split_report *r)
{
    memset(r, 0, sizeof *r);
    r->k = part->k;
    double sum = 0, worst = 0;
    for (int s = 0; s < part->k; s++) {
        struct gp_stage_figures *f = &r->stages[s];
        f->first_layer = part->first[s];
        f->last_layer = part->first[s + 1];
        double t = boundary_cost(p, c, GP_BALANCE_TIME, load, s, f->first_layer);
        double peak = stage_peak(p, f->first_layer, f->last_layer);
        double m = s == 0 ? first_stage_inputs(p, c, load, peak)
                          : boundary_cost(p, c, GP_BALANCE_MEMORY, load, s, f->first_layer);
        for (int i = f->first_layer; i < f->last_layer; i++) {
            t += layer_time(p, &load[s], i);
            m += layer_memory(p, c, &load[s], i, f->first_layer);
        }
        m += peak;
        f->time_ms = t;
        f->memory_bytes = saturated_bytes(m);
        f->frontier_in_bytes = frontier_at(p, f->first_layer);
        f->frontier_out_bytes = frontier_at(p, f->last_layer);
        double objective = c->by == GP_BALANCE_TIME ? t : m;
        sum += objective;
        if (objective > worst) worst = objective;
        if (t > r->max_time_ms) r->max_time_ms = t;
        if (f->memory_bytes > r->max_memory_bytes) r->max_memory_bytes = f->memory_bytes;
        r->mean_time_ms += t / part->k;
    }
    r->imbalance = sum > 0 ? worst / (sum / part->k) : 1;
    /* GPipe and 1F1B alike: M + K - 1 clock cycles of forward and backward,
     * each as long as the slowest stage (1F1B moves work, not the bubble). */
    r->predicted_step_ms = (double)(c->n_micro + part->k - 1) * r->max_time_ms;
    r->throughput = r->predicted_step_ms > 0 ? (double)c->batch / (r->predicted_step_ms / 1e3) : 0;
}

gp_status gp_balance(const struct gp_profile *prof, const struct gp_balance_config *cfg,
                     struct gp_balance_report *out, struct gp_error *err)
{
    memset(out, 0, sizeof *out);
    out->cfg = *cfg;
    int n = prof->n_layers, k = cfg->n_stages;
    if (k < 1 || k > n || k > GP_MAX_STAGES)
        return gp_error_set(err, GP_ERR_INVALID, "cannot split %d layers into %d stages", n, k);
    if (cfg->n_micro < 1) return gp_error_set(err, GP_ERR_INVALID, "balancing needs at least one micro-batch");
    size_t kn = (size_t)k * (size_t)n;
    struct stage_load *load = calloc((size_t)k, sizeof *load);
    double *weight = malloc(sizeof(double) * ((size_t)n + 1));
    double *stage_weight = malloc(sizeof(double) * (kn + 1)), *stage_boundary = malloc(sizeof(double) * (kn + 1));
    double *peak = malloc(sizeof(double) * ((size_t)n + 1));
    gp_status st = load && weight && stage_weight && stage_boundary && peak
                       ? stage_loads(cfg, load, err)
                       : gp_error_set(err, GP_ERR_NOMEM, "out of memory balancing");
    if (st == GP_OK) {
        for (int s = 0; s < k; s++)
            for (int i = 0; i < n; i++) {
                stage_weight[(size_t)s * n + i] = cfg->by == GP_BALANCE_TIME
                                                      ? layer_time(prof, &load[s], i)
                                                      : layer_memory(prof, cfg, &load[s], i, INT_MAX);
                stage_boundary[(size_t)s * n + i] = boundary_cost(prof, cfg, cfg->by, load, s, i);
            }
        /* torchgpipe's heuristic knows no stages: it splits by the mean
         * over the stages (written so that equal weights stay exact). */
        for (int i = 0; i < n; i++) {
            double w0 = stage_weight[i], spread = 0;
            for (int s = 1; s < k; s++) spread += (stage_weight[(size_t)s * n + i] - w0) / k;
            weight[i] = w0 + spread > 0 ? w0 + spread : 0;
        }
    }
    bool by_memory = cfg->by == GP_BALANCE_MEMORY;
    for (int i = 0; st == GP_OK && by_memory && i < n; i++) peak[i] = (double)prof->layers[i].peak_bytes;
    struct gp_partition_problem problem = {.n = n, .weight = weight, .k = k, .stage_weight = stage_weight,
                                           .stage_boundary = stage_boundary, .peak = by_memory ? peak : NULL};
    struct gp_partition opt, even, heur;
    if (st == GP_OK) st = gp_partition_optimal(&problem, &opt, err);
    if (st == GP_OK) st = gp_partition_even(&problem, &even, err);
    if (st == GP_OK) st = gp_partition_heuristic(&problem, &heur, err);
    free(weight);
    free(stage_weight);
    free(stage_boundary);
    free(peak);
    if (st == GP_OK) {
        figures(prof, cfg, load, &opt, &out->optimal);
        figures(prof, cfg, load, &even, &out->even);
        figures(prof, cfg, load, &heur, &out->heuristic);
    }
    free(load);
    GP_TRY(st);
    out->bubble = (double)(k - 1) / (double)(cfg->n_micro + k - 1);
    out->suggested_chunks = (int)cfg->batch;
    for (int64_t m = 1; m <= cfg->batch; m++)
        if (cfg->batch % m == 0 && (double)(k - 1) / (double)(m + k - 1) <= 0.10) {
            out->suggested_chunks = (int)m;
            break;
        }
    return GP_OK;
}

void gp_balance_counts(const struct gp_split_report *r, int *counts)
{
    for (int s = 0; s < r->k; s++) counts[s] = r->stages[s].last_layer - r->stages[s].first_layer;
}
