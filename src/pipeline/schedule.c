#include "pipeline/schedule.h"

#include <stdlib.h>
#include <string.h>

const char *gp_checkpoint_name(enum gp_checkpoint c)
{
    switch (c) {
    case GP_CHECKPOINT_NEVER: return "never";
    case GP_CHECKPOINT_EXCEPT_LAST: return "except_last";
    case GP_CHECKPOINT_ALWAYS: return "always";
    }
    return "?";
}

int gp_checkpointed(enum gp_checkpoint mode, int j, int n_micro)
{
    switch (mode) {
    case GP_CHECKPOINT_NEVER: return 0;
    case GP_CHECKPOINT_EXCEPT_LAST: return j < n_micro - 1;
    case GP_CHECKPOINT_ALWAYS: return 1;
    }
    return 0;
}

gp_status gp_pipe_schedule_gpipe(int n_stages, int n_micro, enum gp_checkpoint mode,
                            struct gp_pipe_schedule *out, struct gp_error *err)
{
    memset(out, 0, sizeof *out);
    if (n_stages < 1 || n_micro < 1)
        return gp_error_set(err, GP_ERR_INVALID, "a schedule needs at least one stage and one micro-batch");
    out->n_stages = n_stages;
    out->n_micro = n_micro;
    out->actions = calloc((size_t)n_stages * (size_t)n_micro * 3 + 1, sizeof *out->actions);
    if (!out->actions) return gp_error_set(err, GP_ERR_NOMEM, "out of memory for the schedule");
    int n = 0, cycles = n_micro + n_stages - 1;
    /* Forward: the diagonal. Issued clock by clock so that everything an
     * action waits for was issued before it. */
    for (int c = 0; c < cycles; c++)
        for (int k = 0; k < n_stages; k++) {
            int j = c - k;
            if (j < 0 || j >= n_micro) continue;
            out->actions[n++] = (struct gp_action){GP_ACT_FORWARD, k, j, c};
        }
    /* Backward: the mirror, from the last stage and the last micro-batch. */
    for (int c = 0; c < cycles; c++)
        for (int k = n_stages - 1; k >= 0; k--) {
            int j = n_micro - 1 - (c - (n_stages - 1 - k));
            if (j < 0 || j >= n_micro) continue;
            if (gp_checkpointed(mode, j, n_micro))
                out->actions[n++] = (struct gp_action){GP_ACT_RECOMPUTE, k, j, cycles + c};
            out->actions[n++] = (struct gp_action){GP_ACT_BACKWARD, k, j, cycles + c};
        }
    out->n_actions = n;
    return GP_OK;
}

void gp_pipe_schedule_free(struct gp_pipe_schedule *s)
{
    free(s->actions);
    memset(s, 0, sizeof *s);
}
