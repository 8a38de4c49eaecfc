/* Tied parameters: one initializer read by layers of several stages (a
 * GPT's token embedding, which its output head reads transposed). Each of
 * those stages holds its own copy (plan.c), made from the same initializer
 * bytes, and accumulates into its own gradient only what its layers
 * contribute. Before the optimizer step the copies' gradients become their
 * sum, added in stage order, g = (g_h0 + g_h1) + g_h2 ..., the same bits on
 * every holder, so every holder takes the same step (weight decay and
 * optimizer state included) and the copies stay equal: the saved model
 * writes the first holder's. Clipping counts the parameter once
 * (pipeline.c).
 *
 * In one process the gradients meet on the host (copies through each
 * holder's compute stream, so any backend); across processes (cfg.remote)
 * the first holder of each replica receives the others' gradients in stage
 * order, sums and sends the sum back. Every process walks the same list in
 * the same order, each exchange completing before the next, so messages
 * of one tag never cross.
 *
 * Against one stage holding the parameter: there every micro-batch's
 * backward adds its contributions into one gradient, layer after layer;
 * split, each holder adds its own layers' and the holders' sums are added
 * last. That is the same sum when each holder's part is already one term of
 * the one-stage order, e.g. a GPT's head reads the embedding through a
 * Transpose computed once per step, whose gradient is added once, after
 * every micro-batch's Gather: one stage sums (e_0 + e_1 + ...) + h, the
 * split stages sum (e_0 + e_1 + ...) + h too (README, "Tied parameters"). */
#include <stdlib.h>
#include <string.h>

#include "pipeline/internal.h"

void gp_pipe_tied_free(struct gp_pipeline *p)
{
    for (int t = 0; t < p->n_tied; t++) free(p->tied[t].holders);
    free(p->tied);
    free(p->tied_acc);
    free(p->tied_tmp);
    p->tied = NULL;
    p->tied_acc = p->tied_tmp = NULL;
    p->n_tied = 0;
}

gp_status gp_pipe_tied_plan(struct gp_pipeline *p, struct gp_error *err)
{
    const struct gp_graph *g = p->g;
    int64_t most = 0;
    for (int v = 0; v < g->n_values; v++) {
        if (g->values[v].kind != GP_VALUE_PARAMETER) continue;
        int n = 0;
        for (int k = 0; k < p->K; k++) n += p->stages[k].plan.home[v] == GP_HOME_STATIC;
        if (n < 2) continue;
        if (!gp_dtype_is_float(g->values[v].dtype))
            return gp_error_set(err, GP_ERR_UNSUPPORTED, "parameter '%s' is %s and read by %d stages: only float "
                                "parameters can be held by several stages", g->values[v].name,
                                gp_dtype_name(g->values[v].dtype), n);
        struct gp_pipe_tied *grown = realloc(p->tied, sizeof *grown * (size_t)(p->n_tied + 1));
        if (!grown) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
        p->tied = grown;
        struct gp_pipe_tied *t = &p->tied[p->n_tied++];
        *t = (struct gp_pipe_tied){.value = v, .numel = gp_shape_numel(&g->values[v].shape)};
        t->holders = malloc(sizeof(int) * (size_t)n);
        if (!t->holders) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
        for (int k = 0; k < p->K; k++)
            if (p->stages[k].plan.home[v] == GP_HOME_STATIC) t->holders[t->n++] = k;
        if (t->numel > most) most = t->numel;
    }
    if (!p->n_tied) return GP_OK;
    p->tied_acc = malloc(sizeof(float) * (size_t)(most + 1));
    p->tied_tmp = malloc(sizeof(float) * (size_t)(most + 1));
    if (!p->tied_acc || !p->tied_tmp) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    return GP_OK;
}

/* Stage k's gradient of parameter v to or from host memory. */
static gp_status grad_io(struct gp_pipeline *p, int k, int v, float *host, size_t bytes, bool read,
                         struct gp_error *err)
{
    struct stage *s = &p->stages[k];
    float *grad = (float *)(s->param_grads + s->plan.off[v]);
    struct gp_task_tag tag = tag_of(GP_TASK_COPY, k, -1, read ? "read tied gradient" : "write tied gradient");
    if (read) s->ops->copy(s->compute, host, grad, bytes, &tag);
    else s->ops->copy(s->compute, grad, host, bytes, &tag);
    return s->ops->stream_synchronize(s->compute, err);
}

static gp_status sum_one(struct gp_pipeline *p, const struct gp_pipe_tied *t, struct gp_error *err)
{
    const struct gp_pipe_remote *r = p->cfg.remote;
    size_t bytes = sizeof(float) * (size_t)t->numel;
    float *acc = p->tied_acc, *tmp = p->tied_tmp;
    int root = t->holders[0];
    if (r && r->stage != root) {
        bool holder = false;
        for (int i = 1; i < t->n; i++) holder |= t->holders[i] == r->stage;
        if (!holder) return GP_OK;
        GP_TRY(grad_io(p, r->stage, t->value, tmp, bytes, true, err));
        GP_TRY(r->send(r->ctx, root, GP_PIPE_TAG_TIED, tmp, bytes, err));
        GP_TRY(r->recv(r->ctx, root, GP_PIPE_TAG_TIED, acc, bytes, err));
        return grad_io(p, r->stage, t->value, acc, bytes, false, err);
    }
    GP_TRY(grad_io(p, root, t->value, acc, bytes, true, err));
    for (int i = 1; i < t->n; i++) {
        int k = t->holders[i];
        if (stage_local(p, k)) GP_TRY(grad_io(p, k, t->value, tmp, bytes, true, err));
        else GP_TRY(r->recv(r->ctx, k, GP_PIPE_TAG_TIED, tmp, bytes, err));
        for (int64_t e = 0; e < t->numel; e++) acc[e] += tmp[e];
    }
    for (int i = 0; i < t->n; i++) {
        int k = t->holders[i];
        if (stage_local(p, k)) GP_TRY(grad_io(p, k, t->value, acc, bytes, false, err));
        else GP_TRY(r->send(r->ctx, k, GP_PIPE_TAG_TIED, acc, bytes, err));
    }
    return GP_OK;
}

gp_status gp_pipe_tied_sum(struct gp_pipeline *p, struct gp_error *err)
{
    for (int i = 0; i < p->n_tied; i++) {
        const struct gp_pipe_tied *t = &p->tied[i];
        gp_status st = sum_one(p, t, err);
        if (st != GP_OK) {
            gp_error_prefix(err, "summing the gradients of parameter '%s' (tied, held by %d stages): ",
                            p->g->values[t->value].name, t->n);
            if (p->cfg.remote) gp_error_prefix(err, "stage %d: ", p->cfg.remote->stage);
            return st;
        }
    }
    return GP_OK;
}
