/* Data-parallel replicas: the stage's parameter gradients summed over its
 * replicas in buckets, overlapped with the backward of the earlier layers
 * (as DistributedDataParallel's buckets), instead of all at once after the
 * step's backward.
 *
 * A parameter's gradient is final once the backward of the last
 * micro-batch has passed the stage's first layer that reads it, or, for a
 * parameter that a layer run once per step reads (an exporter's weight
 * Transpose), once those layers' backward has run after it. The gradient
 * block (parameters in value order, plan.c) is cut into buckets of about
 * `bucket_bytes`, from its end (the last parameters, which the backward
 * finishes first) to its start, each a contiguous range of whole
 * parameters, ready when all of its parameters are final. A thread of the
 * pipeline sums the buckets over the replicas in that fixed order, each as
 * soon as it is ready, while the stage's compute thread goes on with the
 * backward; the step waits for the last bucket before anything else talks
 * to the replicas. Each element's sum is the serial sum over the replicas
 * in replica order however the block is cut, so the bits are those of one
 * sum of the whole block after the backward: the same on every replica and
 * run after run.
 *
 * Only where this process runs one stage of several replicas (cfg.remote,
 * replicas > 1), whose device computes in host memory (a CPU device). */
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/internal.h"

struct bucket {
    size_t off, floats; /* in the stage's parameter gradient block */
    int ready;          /* progress (below) that makes it final */
};

/* progress: how many layers of the stage the last micro-batch's backward
 * has finished (0 .. layers), then layers + 1 once the once-per-step
 * layers' backward has run too. */
struct gp_pipe_buckets {
    struct gp_pipeline *p;
    struct stage *s;
    struct bucket *b;
    int n;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int progress;
    bool cancel, quit;
    uint64_t go, done;   /* steps asked for and finished */
    gp_status st;
    struct gp_error err;
};

static void *sum_thread(void *arg)
{
    struct gp_pipe_buckets *q = arg;
    const struct gp_pipe_remote *r = q->p->cfg.remote;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->quit && q->done == q->go) pthread_cond_wait(&q->cv, &q->mu);
        if (q->quit) break;
        for (int i = 0; i < q->n && q->st == GP_OK; i++) {
            while (!q->cancel && q->progress < q->b[i].ready) pthread_cond_wait(&q->cv, &q->mu);
            if (q->cancel) break;
            pthread_mutex_unlock(&q->mu);
            struct gp_error err = {0};
            gp_status st = r->sum_f32(r->ctx, (float *)(q->s->param_grads + q->b[i].off), q->b[i].floats, &err);
            pthread_mutex_lock(&q->mu);
            if (st != GP_OK) {
                q->st = st;
                q->err = err;
            }
        }
        q->done = q->go;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

void gp_pipe_buckets_free(struct gp_pipeline *p)
{
    struct gp_pipe_buckets *q = p->buckets;
    if (!q) return;
    if (q->started) {
        pthread_mutex_lock(&q->mu);
        q->quit = q->cancel = true;
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->mu);
        pthread_join(q->thread, NULL);
    }
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q->b);
    free(q);
    p->buckets = NULL;
}

gp_status gp_pipe_buckets_plan(struct gp_pipeline *p, size_t bucket_bytes, struct gp_error *err)
{
    const struct gp_pipe_remote *r = p->cfg.remote;
    if (!r || r->replicas < 2) return GP_OK;
    struct stage *s = &p->stages[r->stage];
    if (!s->plan.param_bytes || s->ops->host_alloc) return GP_OK;
    const struct gp_graph *g = p->g;
    int first = s->plan.first, layers = s->plan.last - first;
    struct gp_pipe_buckets *q = calloc(1, sizeof *q);
    int *ready = malloc(sizeof(int) * ((size_t)g->n_values + 1));
    if (q) q->b = malloc(sizeof *q->b * ((size_t)s->n_params + 1));
    if (!q || !ready || !q->b) {
        free(ready);
        if (q) free(q->b);
        free(q);
        return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->p = p;
    q->s = s;
    p->buckets = q;
    /* When each parameter's gradient is final. */
    for (int v = 0; v < g->n_values; v++) ready[v] = 0;
    for (int i = s->plan.last - 1; i >= first; i--) {
        const struct gp_node *n = &g->nodes[i];
        int when = s->plan.once[i - first] ? layers + 1 : s->plan.last - i;
        for (int k = 0; k < n->n_inputs; k++) {
            int v = n->inputs[k];
            if (v >= 0 && when > ready[v]) ready[v] = when;
        }
    }
    /* Parameters from the block's end, whole ones to a bucket. */
    size_t end = s->plan.param_bytes;
    int worst = 0;
    for (int i = s->n_params - 1; i >= 0; i--) {
        int v = s->param_values[i];
        size_t off = s->plan.off[v];
        if (ready[v] > worst) worst = ready[v];
        if (end - off < bucket_bytes && i > 0) continue;
        q->b[q->n++] = (struct bucket){.off = off, .floats = (end - off) / sizeof(float), .ready = worst};
        end = off;
        worst = 0;
    }
    free(ready);
    if (pthread_create(&q->thread, NULL, sum_thread, q) != 0)
        return gp_error_set(err, GP_ERR_INVALID, "cannot start the thread that sums gradients over replicas");
    q->started = true;
    return GP_OK;
}

bool gp_pipe_buckets_on(const struct gp_pipeline *p) { return p->buckets != NULL; }

void gp_pipe_buckets_begin(struct gp_pipeline *p)
{
    struct gp_pipe_buckets *q = p->buckets;
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    q->progress = 0;
    q->cancel = false;
    q->st = GP_OK;
    q->go++;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

void gp_pipe_buckets_progress(struct gp_pipeline *p, int progress)
{
    struct gp_pipe_buckets *q = p->buckets;
    if (!q) return;
    pthread_mutex_lock(&q->mu);
    q->progress = progress;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

int gp_pipe_buckets_count(const struct gp_pipeline *p) { return p->buckets ? p->buckets->n : 0; }

gp_status gp_pipe_buckets_finish(struct gp_pipeline *p, bool cancel, struct gp_error *err)
{
    struct gp_pipe_buckets *q = p->buckets;
    if (!q) return GP_OK;
    pthread_mutex_lock(&q->mu);
    /* A step that failed here never finishes its backward: the sums its
     * replicas wait for fail on their side within their timeout. */
    if (cancel) q->cancel = true;
    pthread_cond_broadcast(&q->cv);
    while (q->done != q->go) pthread_cond_wait(&q->cv, &q->mu);
    gp_status st = q->st;
    if (st != GP_OK && err) *err = q->err;
    pthread_mutex_unlock(&q->mu);
    if (st != GP_OK)
        gp_error_prefix(err, "stage %d, replica %d: summing gradients over %d replicas: ", p->cfg.remote->stage,
                        p->cfg.remote->replica, p->cfg.remote->replicas);
    return st;
}
