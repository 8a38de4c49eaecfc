/* The public API: profiling and balancing, the report as structs, JSON and
 * SVG (include/gpipe_onnx.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "backend/backends.h"
#include "partitioner/report.h"
#include "partitioner/run.h"
#include "pipeline/pipeline.h"

void gpo_balance_options_init(struct gpo_balance_options *o)
{
    memset(o, 0, sizeof *o);
    o->by = GPO_BALANCE_TIME;
    o->batch = 32;
    o->chunks = 1;
    o->checkpoint = GPO_CHECKPOINT_EXCEPT_LAST;
    o->repeats = 5;
}

void gpo_report_free(gpo_model *m)
{
    if (!m->has_report) return;
    gp_profile_free(&m->prof);
    free(m->layer_profiles);
    m->layer_profiles = NULL;
    m->has_report = false;
}

static void split_of(const struct gp_split_report *r, struct gpo_stage *stages, int *balance, struct gpo_split *out)
{
    for (int s = 0; s < r->k; s++) {
        const struct gp_stage_figures *f = &r->stages[s];
        stages[s] = (struct gpo_stage){.first_layer = f->first_layer, .last_layer = f->last_layer - 1,
                                       .time_ms = f->time_ms, .memory_bytes = f->memory_bytes,
                                       .frontier_in_bytes = f->frontier_in_bytes,
                                       .frontier_out_bytes = f->frontier_out_bytes};
        balance[s] = f->last_layer - f->first_layer;
    }
    *out = (struct gpo_split){.n_stages = r->k, .stages = stages, .balance = balance, .imbalance = r->imbalance,
                              .predicted_step_ms = r->predicted_step_ms, .throughput = r->throughput};
}

/* The options' measure callback (user: the options), from the backend's counts. */
static void relay_measure(void *user, int problems, double seconds, bool done)
{
    const struct gpo_balance_options *o = user;
    o->measure(o->user, problems, seconds, done);
}

gpo_status gpo_balance(gpo_model *m, const struct gpo_balance_options *opts, const struct gpo_balance_report **out)
{
    if (!m) return GPO_ERR_ARGUMENT;
    gpo_begin(m);
    if (out) *out = NULL;
    if (!opts) return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_balance: no options");
    bool cuda[GPO_MAX_STAGES] = {0};
    int device[GPO_MAX_STAGES] = {0};
    struct gp_balance_config bc = {
        .by = opts->by == GPO_BALANCE_MEMORY ? GP_BALANCE_MEMORY : GP_BALANCE_TIME, .batch = opts->batch,
        .n_micro = opts->chunks, .schedule = gpo_schedule_of(opts->schedule),
        .checkpoint = gpo_checkpoint_of(opts->checkpoint),
        .optim_state_floats = opts->optimizer == GPO_OPTIMIZER_ADAMW ? 2 : opts->momentum > 0 ? 1 : 0,
        .inputs_ahead = gp_pipeline_inputs_ahead_on(gpo_job_remote(m))};
    gpo_status st = gpo_parse_devices(m, opts->devices, &bc.n_stages, cuda, device);
    if (st != GPO_OK) return st;
    if (bc.batch < 1 || bc.n_micro < 1 || bc.batch % bc.n_micro)
        return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_balance: %d chunks do not divide a batch of %lld", bc.n_micro,
                        (long long)bc.batch);
    if (opts->repeats < 1) return gpo_fail(m, GPO_ERR_ARGUMENT, "gpo_balance: repeats must be at least 1");
    gpo_report_free(m);
    struct gp_balance_run run = {.model = m->current, .cfg = &bc, .repeats = opts->repeats, .cuda = cuda,
                                 .device = device, .precision = gpo_precision_of(opts->precision),
                                 .layout = gpo_layout_of(opts->layout), .fast_conv = opts->fast_conv,
                                 .remake_norm = opts->recompute_norm != 0, .profile_in = opts->profile_in,
                                 .profile_out = opts->profile_out, .progress = opts->progress, .user = opts->user};
    struct gp_measure_count meas = {.report = opts->measure ? relay_measure : NULL, .user = (void *)opts};
    gp_measure_begin(&meas);
    gp_status gst = gp_balance_run(&run, &m->prof, &m->rep, &m->err);
    gp_measure_end(&meas);
    if (gst != GP_OK) return gpo_status_of(gst);
    m->has_report = true;
    const struct gp_profile *p = &m->prof;
    m->layer_profiles = calloc((size_t)p->n_layers + 1, sizeof *m->layer_profiles);
    if (!m->layer_profiles) {
        gpo_report_free(m);
        return gpo_fail(m, GPO_ERR_NOMEM, "out of memory balancing '%s'", m->path);
    }
    for (int i = 0; i < p->n_layers; i++) {
        const struct gp_layer_profile *l = &p->layers[i];
        m->layer_profiles[i] = (struct gpo_layer_profile){
            .op = l->op, .forward_ms = l->forward_ms, .backward_ms = l->backward_ms, .param_bytes = l->param_bytes,
            .activation_bytes = l->activation_bytes, .frontier_bytes = l->frontier_bytes};
    }
    struct gpo_balance_report *r = &m->report;
    *r = (struct gpo_balance_report){.device = p->device, .precision = p->precision, .micro_batch = p->micro_batch,
                                     .copy_gbps = p->copy_gbps, .n_layers = p->n_layers,
                                     .layers = m->layer_profiles, .bubble = m->rep.bubble,
                                     .suggested_chunks = m->rep.suggested_chunks};
    split_of(&m->rep.optimal, m->stages[0], m->balance[0], &r->optimal);
    split_of(&m->rep.even, m->stages[1], m->balance[1], &r->even);
    split_of(&m->rep.heuristic, m->stages[2], m->balance[2], &r->heuristic);
    if (out) *out = r;
    return GPO_OK;
}

static gpo_status need_report(gpo_model *m, const char *fn)
{
    if (!m) return GPO_ERR_ARGUMENT;
    gpo_begin(m);
    if (!m->has_report) return gpo_fail(m, GPO_ERR_ARGUMENT, "%s: no balance report yet (call gpo_balance)", fn);
    return GPO_OK;
}

gpo_status gpo_balance_json(gpo_model *m, char **json)
{
    gpo_status st = need_report(m, "gpo_balance_json");
    if (st != GPO_OK) return st;
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    if (!f) return gpo_fail(m, GPO_ERR_NOMEM, "out of memory writing the balance report");
    gp_balance_json(f, &m->prof, &m->rep);
    if (fclose(f) != 0 || !buf) {
        free(buf);
        return gpo_fail(m, GPO_ERR_NOMEM, "out of memory writing the balance report");
    }
    *json = buf;
    return GPO_OK;
}

gpo_status gpo_balance_write_json(gpo_model *m, const char *path)
{
    gpo_status st = need_report(m, "gpo_balance_write_json");
    if (st != GPO_OK) return st;
    return gpo_status_of(gp_balance_json_write(path, &m->prof, &m->rep, &m->err));
}

gpo_status gpo_balance_write_svg(gpo_model *m, const char *path)
{
    gpo_status st = need_report(m, "gpo_balance_write_svg");
    if (st != GPO_OK) return st;
    if (!m->loaded || m->g.n_nodes != m->prof.n_layers)
        return gpo_status_of(gp_balance_svg_write(path, &m->prof, &m->rep, NULL, &m->err));
    const char **names = calloc((size_t)m->g.n_nodes + 1, sizeof *names);
    if (!names) return gpo_fail(m, GPO_ERR_NOMEM, "out of memory writing '%s'", path);
    for (int i = 0; i < m->g.n_nodes; i++) names[i] = m->g.nodes[i].name;
    gp_status gst = gp_balance_svg_write(path, &m->prof, &m->rep, names, &m->err);
    free(names);
    return gpo_status_of(gst);
}
