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

const char *gp_pipe_schedule_name(enum gp_pipe_schedule_kind kind)
{
    switch (kind) {
    case GP_PIPE_GPIPE: return "gpipe";
    case GP_PIPE_1F1B: return "1f1b";
    }
    return "?";
}

bool gp_pipe_schedule_parse(const char *name, enum gp_pipe_schedule_kind *out)
{
    if (name && !strcmp(name, "gpipe")) *out = GP_PIPE_GPIPE;
    else if (name && !strcmp(name, "1f1b")) *out = GP_PIPE_1F1B;
    else return false;
    return true;
}

/* One stage's forwards and backwards in the order it runs them: step q of
 * stage k is micro-batch order[k * 2M + q], a forward when >= 0, the
 * backward of micro-batch -1 - order[...] otherwise. */
static void stage_orders(enum gp_pipe_schedule_kind kind, int K, int M, int *order)
{
    for (int k = 0; k < K; k++) {
        int *o = order + (size_t)k * 2 * (size_t)M, n = 0;
        if (kind == GP_PIPE_GPIPE) {
            for (int j = 0; j < M; j++) o[n++] = j;
            for (int j = 0; j < M; j++) o[n++] = -1 - j;
            continue;
        }
        /* 1F1B: the warm-up fills the pipeline below this stage, so that
         * the forward of micro-batch w+i reaches the last stage as the
         * backward of micro-batch i comes back. */
        int w = K - 1 - k < M ? K - 1 - k : M;
        for (int j = 0; j < w; j++) o[n++] = j;
        for (int i = 0; i < M; i++) {
            if (w + i < M) o[n++] = w + i;
            o[n++] = -1 - i;
        }
    }
}

/* Simulates the clocks: each stage takes its next step at the first clock
 * after everything it waits for finished, later stages first within a
 * clock. */
static gp_status generate(enum gp_pipe_schedule_kind kind, int K, int M, enum gp_checkpoint mode,
                          struct gp_pipe_schedule *out, struct gp_error *err)
{
    memset(out, 0, sizeof *out);
    if (K < 1 || M < 1)
        return gp_error_set(err, GP_ERR_INVALID, "a schedule needs at least one stage and one micro-batch");
    out->kind = kind;
    out->checkpoint = mode;
    out->n_stages = K;
    out->n_micro = M;
    size_t km = (size_t)K * (size_t)M;
    out->actions = calloc(km * 3 + 1, sizeof *out->actions);
    int *order = malloc(sizeof(int) * 2 * km);
    int *next = calloc((size_t)K, sizeof(int));
    int *fwd_at = malloc(sizeof(int) * km), *bwd_at = malloc(sizeof(int) * km); /* clock, -1: not yet */
    bool *recompute = calloc(km, sizeof(bool));
    gp_status st = GP_OK;
    if (!out->actions || !order || !next || !fwd_at || !bwd_at || !recompute) {
        st = gp_error_set(err, GP_ERR_NOMEM, "out of memory for the schedule");
        goto done;
    }
    stage_orders(kind, K, M, order);
    for (size_t q = 0; q < km; q++) fwd_at[q] = bwd_at[q] = -1;
    for (int k = 0; k < K; k++)
        for (int q = 0; q < 2 * M; q++) {
            int step = order[(size_t)k * 2 * M + q];
            if (step >= 0) continue;
            int j = -1 - step;
            bool follows = q > 0 && order[(size_t)k * 2 * M + q - 1] == j;
            recompute[(size_t)k * M + j] = mode == GP_CHECKPOINT_ALWAYS || (mode == GP_CHECKPOINT_EXCEPT_LAST && !follows);
        }
    int n = 0;
    for (int c = 0, left = 2 * K * M; left > 0; c++) {
        int issued = 0;
        for (int k = K - 1; k >= 0; k--) {
            if (next[k] == 2 * M) continue;
            int step = order[(size_t)k * 2 * M + next[k]];
            int j = step >= 0 ? step : -1 - step;
            if (step >= 0) {
                /* After the previous stage's forward of the micro-batch. */
                int dep = k > 0 ? fwd_at[(size_t)(k - 1) * M + j] : -1;
                if (k > 0 && (dep < 0 || dep >= c)) continue;
                fwd_at[(size_t)k * M + j] = c;
                out->actions[n++] = (struct gp_action){GP_ACT_FORWARD, k, j, c};
            } else {
                /* After the next stage's backward (the last stage: its forward). */
                int dep = k + 1 < K ? bwd_at[(size_t)(k + 1) * M + j] : fwd_at[(size_t)k * M + j];
                if (dep < 0 || dep >= c) continue;
                bwd_at[(size_t)k * M + j] = c;
                if (recompute[(size_t)k * M + j]) out->actions[n++] = (struct gp_action){GP_ACT_RECOMPUTE, k, j, c};
                out->actions[n++] = (struct gp_action){GP_ACT_BACKWARD, k, j, c};
            }
            next[k]++;
            left--;
            issued++;
        }
        /* What an action waits for ran at an earlier clock, so a clock
         * without progress would never end: a bug in the orders above. */
        if (!issued) {
            st = gp_error_set(err, GP_ERR_INVALID, "the %s schedule of %d stages and %d micro-batches is stuck",
                              gp_pipe_schedule_name(kind), K, M);
            goto done;
        }
    }
    out->n_actions = n;
done:
    free(order);
    free(next);
    free(fwd_at);
    free(bwd_at);
    free(recompute);
    if (st != GP_OK) gp_pipe_schedule_free(out);
    return st;
}

gp_status gp_pipe_schedule_gpipe(int n_stages, int n_micro, enum gp_checkpoint mode,
                                 struct gp_pipe_schedule *out, struct gp_error *err)
{
    return generate(GP_PIPE_GPIPE, n_stages, n_micro, mode, out, err);
}

gp_status gp_pipe_schedule_1f1b(int n_stages, int n_micro, enum gp_checkpoint mode,
                                struct gp_pipe_schedule *out, struct gp_error *err)
{
    return generate(GP_PIPE_1F1B, n_stages, n_micro, mode, out, err);
}

gp_status gp_pipe_schedule_make(enum gp_pipe_schedule_kind kind, int n_stages, int n_micro,
                                enum gp_checkpoint mode, struct gp_pipe_schedule *out, struct gp_error *err)
{
    if (kind != GP_PIPE_GPIPE && kind != GP_PIPE_1F1B) {
        memset(out, 0, sizeof *out);
        return gp_error_set(err, GP_ERR_INVALID, "unknown pipeline schedule %d", (int)kind);
    }
    return generate(kind, n_stages, n_micro, mode, out, err);
}

void gp_pipe_schedule_free(struct gp_pipe_schedule *s)
{
    free(s->actions);
    memset(s, 0, sizeof *s);
}
