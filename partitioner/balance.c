#include "partitioner/balance.h"

#include <stdlib.h>
#include <string.h>

/* Per-micro-batch time of layer i: forward, backward and, for the share of
 * micro-batches the checkpoint mode recomputes, forward again. */
static double layer_time(const struct gp_profile *p, const struct gp_balance_config *c, int i)
{
    double recompute = c->checkpoint == GP_CHECKPOINT_ALWAYS ? 1.0
                       : c->checkpoint == GP_CHECKPOINT_EXCEPT_LAST
                           ? (double)(c->n_micro - 1) / (double)c->n_micro
                           : 0.0;
    const struct gp_layer_profile *l = &p->layers[i];
    /* Before each micro-batch's backward the executor clears the gradients
     * of the stage's activations: about one memory pass over them. */
    double clear_ms = (double)l->activation_bytes / (p->copy_gbps * 1e6);
    return l->forward_ms + l->backward_ms + recompute * l->forward_ms + clear_ms;
}

/* Bytes layer i costs its stage: the parameter, its gradient and optimizer
 * state, and its activations for every micro-batch in flight (all M without
 * checkpointing; one set with it, the others keep only input frontiers). */
static double layer_memory(const struct gp_profile *p, const struct gp_balance_config *c, int i)
{
    const struct gp_layer_profile *l = &p->layers[i];
    int sets = c->checkpoint == GP_CHECKPOINT_NEVER ? c->n_micro : 1;
    return (double)l->param_bytes * (2 + c->optim_state_floats) + (double)l->activation_bytes * sets;
}

/* The frontier at cut c (before layer c), per micro-batch. */
static int64_t frontier_at(const struct gp_profile *p, int c)
{
    return c == 0 ? p->input_frontier_bytes : p->layers[c - 1].frontier_bytes;
}

/* What a stage starting at cut c pays for its boundary: receiving the
 * frontier's activations and sending back their gradients (time), or
 * holding M input frontiers and M gradient inboxes (memory). */
static double boundary_cost(const struct gp_profile *p, const struct gp_balance_config *c, int cut)
{
    if (cut == 0) return 0;
    double bytes = (double)frontier_at(p, cut);
    if (c->by == GP_BALANCE_TIME) return 2 * bytes / (p->copy_gbps * 1e6);
    return 2 * bytes * c->n_micro;
}

static void figures(const struct gp_profile *p, const struct gp_balance_config *c,
                    const struct gp_partition *part, struct gp_split_report *r)
{
    memset(r, 0, sizeof *r);
    r->k = part->k;
    double sum = 0, worst = 0;
    for (int s = 0; s < part->k; s++) {
        struct gp_stage_figures *f = &r->stages[s];
        f->first_layer = part->first[s];
        f->last_layer = part->first[s + 1];
        struct gp_balance_config as_time = *c, as_memory = *c;
        as_time.by = GP_BALANCE_TIME;
        as_memory.by = GP_BALANCE_MEMORY;
        double t = boundary_cost(p, &as_time, f->first_layer), m = boundary_cost(p, &as_memory, f->first_layer);
        for (int i = f->first_layer; i < f->last_layer; i++) {
            t += layer_time(p, c, i);
            m += layer_memory(p, c, i);
        }
        f->time_ms = t;
        f->memory_bytes = (int64_t)m;
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
    /* GPipe: M + K - 1 clock cycles, each as long as the slowest stage. */
    r->predicted_step_ms = (double)(c->n_micro + part->k - 1) * r->max_time_ms;
    r->throughput = r->predicted_step_ms > 0 ? (double)c->batch / (r->predicted_step_ms / 1e3) : 0;
}

gp_status gp_balance(const struct gp_profile *prof, const struct gp_balance_config *cfg,
                     struct gp_balance_report *out, struct gp_error *err)
{
    memset(out, 0, sizeof *out);
    out->cfg = *cfg;
    int n = prof->n_layers;
    if (cfg->n_stages < 1 || cfg->n_stages > n || cfg->n_stages > GP_MAX_STAGES)
        return gp_error_set(err, GP_ERR_INVALID, "cannot split %d layers into %d stages", n, cfg->n_stages);
    double *weight = malloc(sizeof(double) * ((size_t)n + 1));
    double *boundary = malloc(sizeof(double) * ((size_t)n + 1));
    if (!weight || !boundary) {
        free(weight);
        free(boundary);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory balancing");
    }
    for (int i = 0; i < n; i++) {
        weight[i] = cfg->by == GP_BALANCE_TIME ? layer_time(prof, cfg, i) : layer_memory(prof, cfg, i);
        boundary[i] = boundary_cost(prof, cfg, i);
    }
    struct gp_partition_problem problem = {.n = n, .weight = weight, .boundary = boundary, .k = cfg->n_stages};
    struct gp_partition opt, even, heur;
    gp_status st = gp_partition_optimal(&problem, &opt, err);
    if (st == GP_OK) st = gp_partition_even(&problem, &even, err);
    if (st == GP_OK) st = gp_partition_heuristic(&problem, &heur, err);
    free(weight);
    free(boundary);
    GP_TRY(st);
    figures(prof, cfg, &opt, &out->optimal);
    figures(prof, cfg, &even, &out->even);
    figures(prof, cfg, &heur, &out->heuristic);
    int k = cfg->n_stages;
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
