/* What training keeps between steps, read and written between steps: the
 * parameters and buffers (BatchNorm running statistics) in the stages'
 * static blocks, the optimizer's state tensors and its step count. A saved
 * training state is made of these (train/state.h); everything else a step
 * uses is rebuilt by the step itself (bf16 weight copies, gradients,
 * deferred BatchNorm sums, which the optimizer step clears). Copies go
 * through the stage's compute stream, so they work on any backend.
 *
 * Stages in other processes (cfg.remote): writes set what the local stage
 * holds and skip the rest (every process writes the same values, read from
 * the same state), reads of optimizer state go to stage 0's process of
 * replica 0 as gp_pipeline_read does (remote.c). */
#include <string.h>

#include "pipeline/internal.h"

/* The bytes of value v as float32. */
static size_t float_bytes(const struct gp_pipeline *p, int v)
{
    return sizeof(float) * (size_t)gp_shape_numel(&p->g->values[v].shape);
}

gp_status gp_pipeline_write(struct gp_pipeline *p, int value, const float *in, struct gp_error *err)
{
    if (value < 0 || value >= p->g->n_values)
        return gp_error_set(err, GP_ERR_INVALID, "no value %d in the model", value);
    const struct gp_value *v = &p->g->values[value];
    if (!gp_dtype_is_float(v->dtype))
        return gp_error_set(err, GP_ERR_INVALID, "value '%s' is %s, not float", v->name, gp_dtype_name(v->dtype));
    bool held = false;
    for (int k = 0; k < p->K; k++) {
        struct stage *s = &p->stages[k];
        if (s->plan.home[value] != GP_HOME_STATIC) continue;
        held = true;
        if (!stage_local(p, k)) continue;
        struct gp_task_tag tag = tag_of(GP_TASK_COPY, k, -1, "write parameter");
        s->ops->copy(s->compute, s->static_block + s->plan.off[value], in, float_bytes(p, value), &tag);
        GP_TRY(s->ops->stream_synchronize(s->compute, err));
    }
    if (!held) return gp_error_set(err, GP_ERR_INVALID, "value '%s' is not held by any stage", v->name);
    return GP_OK;
}

int gp_pipeline_optim_slots(const struct gp_pipeline *p) { return gp_optim_state_floats(&p->cfg.optim); }

const char *gp_pipeline_optim_slot_name(const struct gp_pipeline *p, int slot)
{
    if (p->cfg.optim.kind == GP_OPTIM_ADAMW) return slot == 0 ? "exp_avg" : "exp_avg_sq";
    return "momentum_buffer";
}

/* The stage and index of parameter `value` in its optimizer, for each
 * stage that holds it in turn (from *k on); false when no more do. */
static bool next_holder(struct gp_pipeline *p, int value, int *k, int *index)
{
    for (; *k < p->K; (*k)++) {
        struct stage *s = &p->stages[*k];
        if (!s->opt) continue;
        for (int i = 0; i < s->n_params; i++)
            if (s->param_values[i] == value) {
                *index = i;
                return true;
            }
    }
    return false;
}

static gp_status check_slot(const struct gp_pipeline *p, int value, int slot, struct gp_error *err)
{
    if (value < 0 || value >= p->g->n_values)
        return gp_error_set(err, GP_ERR_INVALID, "no value %d in the model", value);
    if (slot < 0 || slot >= gp_pipeline_optim_slots(p))
        return gp_error_set(err, GP_ERR_INVALID, "the optimizer has no state tensor %d", slot);
    return GP_OK;
}

gp_status gp_pipeline_read_optim(struct gp_pipeline *p, int value, int slot, float *out, struct gp_error *err)
{
    GP_TRY(check_slot(p, value, slot, err));
    if (p->cfg.remote) return gp_pipe_remote_read_optim(p, value, slot, out, err);
    int k = 0, i = 0;
    if (!next_holder(p, value, &k, &i))
        return gp_error_set(err, GP_ERR_INVALID, "'%s' is not a parameter of any stage", p->g->values[value].name);
    struct stage *s = &p->stages[k];
    struct gp_task_tag tag = tag_of(GP_TASK_COPY, k, -1, "read optimizer state");
    s->ops->copy(s->compute, out, s->opt->state[slot][i], float_bytes(p, value), &tag);
    return s->ops->stream_synchronize(s->compute, err);
}

gp_status gp_pipeline_write_optim(struct gp_pipeline *p, int value, int slot, const float *in,
                                  struct gp_error *err)
{
    GP_TRY(check_slot(p, value, slot, err));
    int k = 0, i = 0, held = 0;
    for (; next_holder(p, value, &k, &i); k++, held++) {
        struct stage *s = &p->stages[k];
        struct gp_task_tag tag = tag_of(GP_TASK_COPY, k, -1, "write optimizer state");
        s->ops->copy(s->compute, s->opt->state[slot][i], in, float_bytes(p, value), &tag);
        GP_TRY(s->ops->stream_synchronize(s->compute, err));
    }
    /* Another process's stage holds it: its process writes it. */
    for (int h = 0; !held && p->cfg.remote && h < p->K; h++)
        held = p->stages[h].plan.home[value] == GP_HOME_STATIC && p->g->values[value].kind == GP_VALUE_PARAMETER;
    if (!held)
        return gp_error_set(err, GP_ERR_INVALID, "'%s' is not a parameter of any stage", p->g->values[value].name);
    return GP_OK;
}

/* A process whose stage has no parameters has no optimizer: it counts its
 * steps as the others do. */
int64_t gp_pipeline_optim_steps(const struct gp_pipeline *p)
{
    for (int k = 0; k < p->K; k++)
        if (p->stages[k].opt) return p->stages[k].opt->steps;
    return p->optim_steps;
}

void gp_pipeline_set_optim_steps(struct gp_pipeline *p, int64_t steps)
{
    p->optim_steps = steps;
    for (int k = 0; k < p->K; k++)
        if (p->stages[k].opt) p->stages[k].opt->steps = steps;
}
