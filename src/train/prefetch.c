/* Three sets of batch buffers: the step running reads one, the next
 * step's waits in another (its inputs uploaded to the device during this
 * step: gp_step_opts.next_inputs), and the worker fills the third with
 * the step after it. Only one party touches the epoch order at a time (the
 * worker is joined before anything else gathers), and the data set is
 * only read. */
#include "train/prefetch.h"

#include <pthread.h>
#include <stdlib.h>

enum { BUFS = 3 };

struct gp_prefetch {
    struct gp_pipeline *pipe;
    const struct gp_dataset *d;
    int64_t batch, per_epoch;
    bool shuffle;
    uint64_t seed;
    int64_t *order, order_epoch;  /* the order of epoch order_epoch (-1: none yet) */
    void *x[BUFS], *labels[BUFS];
    int64_t holds[BUFS];          /* the step each buffer holds; -1: none */
    pthread_t worker;
    bool running;
    int64_t job_step;
    int job_buf;
};

static void gather(struct gp_prefetch *f, int64_t step, int b)
{
    int64_t epoch = step / f->per_epoch, first = step % f->per_epoch * f->batch;
    if (epoch != f->order_epoch) {
        gp_dataset_order(f->d->n, f->shuffle, f->seed, epoch, f->order);
        f->order_epoch = epoch;
    }
    if (f->labels[b]) gp_dataset_gather(&f->d->y, f->order, f->d->n, first, f->batch, f->labels[b]);
    gp_dataset_gather(&f->d->x, f->order, f->d->n, first, f->batch, f->x[b]);
    f->holds[b] = step;
}

/* The pipeline's host memory (pinned on a GPU), or plain memory without one. */
static void *buffer(struct gp_pipeline *pipe, size_t bytes)
{
    return pipe ? gp_pipeline_host_alloc(pipe, bytes) : malloc(bytes ? bytes : 1);
}

static void unbuffer(struct gp_pipeline *pipe, void *p)
{
    if (pipe)
        gp_pipeline_host_free(pipe, p);
    else
        free(p);
}

static void *work(void *arg)
{
    struct gp_prefetch *f = arg;
    gather(f, f->job_step, f->job_buf);
    return NULL;
}

gp_status gp_prefetch_create(struct gp_pipeline *pipe, const struct gp_dataset *d, int64_t batch,
                             int64_t per_epoch, bool shuffle, uint64_t seed, struct gp_prefetch **out,
                             struct gp_error *err)
{
    *out = NULL;
    struct gp_prefetch *f = calloc(1, sizeof *f);
    if (!f) return gp_error_set(err, GP_ERR_NOMEM, "out of memory");
    *f = (struct gp_prefetch){.pipe = pipe, .d = d, .batch = batch, .per_epoch = per_epoch > 0 ? per_epoch : 1,
                              .shuffle = shuffle, .seed = seed, .order_epoch = -1, .holds = {-1, -1, -1}};
    f->order = malloc(sizeof(int64_t) * (size_t)(d->n + 1));
    bool ok = f->order != NULL;
    bool has_labels = d->y.dtype != GP_DTYPE_UNDEFINED;
    for (int b = 0; b < BUFS && ok; b++) {
        f->x[b] = buffer(pipe, gp_dataset_row_bytes(&d->x) * (size_t)batch);
        if (has_labels) f->labels[b] = buffer(pipe, gp_dataset_row_bytes(&d->y) * (size_t)batch);
        ok = f->x[b] && (!has_labels || f->labels[b]);
    }
    if (!ok) {
        gp_prefetch_free(f);
        return gp_error_set(err, GP_ERR_NOMEM, "out of host memory for %d batches of %lld samples", BUFS,
                            (long long)batch);
    }
    *out = f;
    return GP_OK;
}

/* The buffer holding `step`, or -1. */
static int holding(const struct gp_prefetch *f, int64_t step)
{
    for (int b = 0; b < BUFS; b++)
        if (f->holds[b] == step) return b;
    return -1;
}

/* A buffer other than a and b (either may be -1). */
static int other(int a, int b)
{
    for (int c = 0; c < BUFS; c++)
        if (c != a && c != b) return c;
    return -1;
}

void gp_prefetch_get(struct gp_prefetch *f, int64_t step, int64_t next, int64_t after, const void **x,
                     const void **labels, const void **x_next)
{
    if (f->running) {
        pthread_join(f->worker, NULL);
        f->running = false;
    }
    int b = holding(f, step);
    int n = next < 0 ? -1 : holding(f, next);
    if (b < 0) gather(f, step, b = other(n, -1));
    if (next >= 0 && n < 0) gather(f, next, n = other(b, -1));
    *x = f->x[b];
    *labels = f->labels[b];
    if (x_next) *x_next = n >= 0 ? f->x[n] : NULL;
    if (after < 0) return;
    f->job_step = after;
    f->job_buf = other(b, n);
    f->holds[f->job_buf] = -1;
    /* Without a thread, the next call gathers it itself. */
    f->running = pthread_create(&f->worker, NULL, work, f) == 0;
}

void gp_prefetch_free(struct gp_prefetch *f)
{
    if (!f) return;
    if (f->running) pthread_join(f->worker, NULL);
    for (int b = 0; b < BUFS; b++) {
        unbuffer(f->pipe, f->x[b]);
        unbuffer(f->pipe, f->labels[b]);
    }
    free(f->order);
    free(f);
}
