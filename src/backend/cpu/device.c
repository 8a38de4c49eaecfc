/* The CPU backend of the device interface (backend/device.h).
 *
 * A device is a number and a thread count; the work happens on streams. A
 * stream is one worker thread that takes items from a FIFO ring: tasks,
 * copies, event records and event waits, run one at a time in the order they
 * were enqueued. Streams of different devices (and the copy streams between
 * them) therefore run at once, the way CUDA streams do.
 *
 * Events count generations. event_record hands out the next generation and
 * enqueues a marker; when the worker reaches the marker the event's completed
 * generation becomes that one. stream_wait captures the latest generation
 * recorded so far and enqueues a wait: the worker sleeps on the event's
 * condition variable until that generation is complete. A wait on a
 * never-recorded event is a no-op, as in CUDA.
 *
 * Generations complete in the order they were handed out: a marker waits for
 * the one before it. That only matters when an event is recorded again on
 * another stream while its previous record is still pending; then "completed
 * >= g" stays exact (generation g really was reached, not a later one on
 * another stream), at the price that the second stream pauses at its marker
 * until the first record is reached (CUDA would not pause it). It cannot
 * deadlock: every item waits only on items that were enqueued before it (a
 * wait captures generations already recorded, and a marker waits for the one
 * recorded before it), so the waits form no cycle.
 *
 * Errors: after a task fails, the worker skips the stream's remaining tasks
 * and copies but still runs its records and waits, so no stream waiting on
 * this one deadlocks; stream_synchronize returns the first message and clears
 * it, after which the stream runs work again.
 *
 * Threads for kernels: set_threads(dev, n) sets how many OpenMP threads the
 * tasks of the device's streams may use. OpenMP's thread count is per thread,
 * so each worker calls omp_set_num_threads(n) before a task when n changed.
 * The default is 1: the executor knows how many devices share the cores and
 * sets it; a stage that silently took every core would fight the others. */
#include "backend/compute.h"
#include "backend/device.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "util/env.h"

#define ALIGN 64
#define RING_INITIAL 64 /* items; a ring doubles when full, so steady state allocates nothing */
#define SPANS_INITIAL 256

struct gp_device {
    int index;
    atomic_int threads; /* OpenMP threads per task on this device's streams */
};

struct gp_event {
    pthread_mutex_t mu;
    pthread_cond_t cv;     /* broadcast whenever `completed` or `pending_waits` changes */
    uint64_t recorded;     /* the latest generation handed out by event_record; 0: never */
    uint64_t completed;    /* every generation <= this has been reached */
    int pending_waits;     /* enqueued wait items that still reference this event */
};

enum item_kind { ITEM_TASK, ITEM_COPY, ITEM_RECORD, ITEM_WAIT };

struct item {
    enum item_kind kind;
    struct gp_task_tag tag; /* ITEM_TASK, ITEM_COPY */
    union {
        struct {
            gp_task_fn fn;
            void *arg;
        } task;
        struct {
            void *dst;
            const void *src;
            size_t bytes;
        } copy;
        struct {
            struct gp_event *event;
            uint64_t gen;
        } ev;
    } u;
};

/* Span arrays grow by moving into a larger block; the smaller one is kept
 * (linked through prev) so that an array handed out by trace_spans stays
 * valid until the next trace start, as the interface promises. Geometric
 * growth keeps the retired blocks smaller than the live one. */
struct span_block {
    struct span_block *prev;
    struct gp_trace_span spans[];
};

struct gp_stream {
    struct gp_device *dev;
    char name[64];
    pthread_t thread;

    pthread_mutex_t mu;      /* guards everything below */
    pthread_cond_t work_cv;  /* to the worker: an item arrived, or stop */
    pthread_cond_t done_cv;  /* to synchronize: `done` advanced */
    struct item *ring;       /* cap items, a power of two; count of them from head */
    size_t cap, head, count;
    uint64_t issued, done;   /* items pushed and items finished, ever */
    int sync_waiters;
    bool stop;
    bool failed;             /* skip tasks and copies until synchronize */
    struct gp_error err;     /* the first failure, while failed */

    bool trace_on;
    struct span_block *spans;
    int span_count, span_cap;

    int omp_threads; /* worker only: the value last given to omp_set_num_threads */
};

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* ---- devices and memory ---- */

static gp_status cpu_open(int index, struct gp_device **out, struct gp_error *err)
{
    *out = NULL;
    if (index < 0) return gp_error_set(err, GP_ERR_INVALID, "cpu:%d: no such device", index);
    struct gp_device *dev = calloc(1, sizeof *dev);
    if (!dev) return gp_error_set(err, GP_ERR_NOMEM, "cpu:%d: out of memory", index);
    dev->index = index;
    atomic_init(&dev->threads, 1);
    *out = dev;
    return GP_OK;
}

/* Streams and events of the device must be destroyed first. */
static void cpu_close(struct gp_device *dev) { free(dev); }

static void *cpu_alloc(struct gp_device *dev, size_t bytes)
{
    (void)dev;
    /* C11 wants a size that is a multiple of the alignment; 0 bytes still
     * gets a distinct pointer, so that free and NULL checks stay simple. */
    if (bytes > SIZE_MAX - (ALIGN - 1)) return NULL;
    size_t rounded = bytes == 0 ? ALIGN : (bytes + ALIGN - 1) / ALIGN * ALIGN;
    void *p = aligned_alloc(ALIGN, rounded);
    if (p) memset(p, 0, rounded);
    return p;
}

static void cpu_free(struct gp_device *dev, void *ptr)
{
    (void)dev;
    free(ptr);
}

static void cpu_set_threads(struct gp_device *dev, int threads)
{
    atomic_store(&dev->threads, threads < 1 ? 1 : threads);
}

/* ---- the queue ---- */

/* Doubles the ring, unrolling it so that head is 0. Caller holds s->mu. */
static bool ring_grow(struct gp_stream *s)
{
    size_t ncap = s->cap * 2;
    struct item *r = malloc(ncap * sizeof *r);
    if (!r) return false;
    for (size_t i = 0; i < s->count; i++) r[i] = s->ring[(s->head + i) & (s->cap - 1)];
    free(s->ring);
    s->ring = r;
    s->cap = ncap;
    s->head = 0;
    return true;
}

/* Appends an item; caller holds s->mu. When the ring cannot grow the item is
 * lost, so the stream fails as a failed task would, and reports it at
 * synchronize. */
static bool push_locked(struct gp_stream *s, const struct item *it)
{
    if (s->count == s->cap && !ring_grow(s)) {
        if (!s->failed) {
            s->failed = true;
            gp_error_clear(&s->err);
            gp_error_set(&s->err, GP_ERR_NOMEM, "stream '%s' of cpu:%d: out of memory queuing work",
                         s->name, s->dev->index);
        }
        return false;
    }
    s->ring[(s->head + s->count) & (s->cap - 1)] = *it;
    s->count++;
    s->issued++;
    pthread_cond_signal(&s->work_cv);
    return true;
}

static void push(struct gp_stream *s, const struct item *it)
{
    pthread_mutex_lock(&s->mu);
    push_locked(s, it);
    pthread_mutex_unlock(&s->mu);
}

/* ---- the worker ---- */

/* Caller holds s->mu. A span that finds no memory is dropped: the timeline
 * is a diagnostic, not worth failing the step for. */
static void append_span(struct gp_stream *s, const struct gp_task_tag *tag, double t0, double t1)
{
    if (s->span_count == s->span_cap) {
        int ncap = s->span_cap ? s->span_cap * 2 : SPANS_INITIAL;
        struct span_block *b = malloc(sizeof *b + (size_t)ncap * sizeof b->spans[0]);
        if (!b) return;
        if (s->span_count) memcpy(b->spans, s->spans->spans, (size_t)s->span_count * sizeof b->spans[0]);
        b->prev = s->spans;
        s->spans = b;
        s->span_cap = ncap;
    }
    s->spans->spans[s->span_count++] = (struct gp_trace_span){.tag = *tag, .start_us = t0, .end_us = t1};
}

static void free_spans(struct gp_stream *s)
{
    for (struct span_block *b = s->spans, *prev; b; b = prev) {
        prev = b->prev;
        free(b);
    }
    s->spans = NULL;
    s->span_count = s->span_cap = 0;
}

static void run_record(struct gp_event *e, uint64_t gen)
{
    pthread_mutex_lock(&e->mu);
    while (e->completed < gen - 1) pthread_cond_wait(&e->cv, &e->mu);
    e->completed = gen;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static void run_wait(struct gp_event *e, uint64_t gen)
{
    pthread_mutex_lock(&e->mu);
    while (e->completed < gen) pthread_cond_wait(&e->cv, &e->mu);
    e->pending_waits--;
    pthread_cond_broadcast(&e->cv); /* event_destroy may be waiting for this */
    pthread_mutex_unlock(&e->mu);
}

/* Runs one task; returns its status with its message in *err. */
static gp_status run_task(struct gp_stream *s, const struct item *it, struct gp_error *err)
{
#ifdef _OPENMP
    int n = atomic_load(&s->dev->threads);
    if (n != s->omp_threads) {
        omp_set_num_threads(n);
        s->omp_threads = n;
    }
#endif
    err->status = GP_OK;
    err->msg[0] = '\0';
    gp_status st = it->u.task.fn(it->u.task.arg, err);
    if (st != GP_OK && err->msg[0] == '\0') {
        /* The task failed without saying why: name it at least. */
        err->status = GP_OK;
        gp_error_set(err, st, "task '%s' (stage %d, micro-batch %d) on stream '%s' of cpu:%d failed: %s",
                     it->tag.name ? it->tag.name : "?", it->tag.stage, it->tag.microbatch, s->name,
                     s->dev->index, gp_status_name(st));
    }
    return st;
}

static void *worker_main(void *arg)
{
    struct gp_stream *s = arg;
    struct gp_error err = {0}; /* one per worker, not per task: it is 2 KiB */
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->count == 0 && !s->stop) pthread_cond_wait(&s->work_cv, &s->mu);
        if (s->count == 0) break; /* stopping, and drained */
        struct item it = s->ring[s->head];
        s->head = (s->head + 1) & (s->cap - 1);
        s->count--;
        bool skip = s->failed;
        bool trace = s->trace_on;
        pthread_mutex_unlock(&s->mu);

        gp_status st = GP_OK;
        bool ran = false;
        double t0 = 0, t1 = 0;
        switch (it.kind) {
        case ITEM_TASK:
            if (skip) break;
            t0 = now_us();
            st = run_task(s, &it, &err);
            t1 = now_us();
            ran = true;
            break;
        case ITEM_COPY:
            if (skip) break;
            t0 = now_us();
            if (it.u.copy.bytes) memcpy(it.u.copy.dst, it.u.copy.src, it.u.copy.bytes);
            t1 = now_us();
            ran = true;
            break;
        case ITEM_RECORD:
            run_record(it.u.ev.event, it.u.ev.gen);
            break;
        case ITEM_WAIT:
            run_wait(it.u.ev.event, it.u.ev.gen);
            break;
        }

        pthread_mutex_lock(&s->mu);
        if (st != GP_OK && !s->failed) {
            s->failed = true;
            s->err = err;
            s->err.status = st;
        }
        if (ran && trace && s->trace_on) append_span(s, &it.tag, t0, t1);
        s->done++;
        if (s->sync_waiters) pthread_cond_broadcast(&s->done_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- streams ---- */

static gp_status cpu_stream_create(struct gp_device *dev, const char *name, struct gp_stream **out,
                                   struct gp_error *err)
{
    *out = NULL;
    struct gp_stream *s = calloc(1, sizeof *s);
    struct item *ring = malloc(RING_INITIAL * sizeof *ring);
    if (!s || !ring) {
        free(s);
        free(ring);
        return gp_error_set(err, GP_ERR_NOMEM, "cpu:%d: out of memory creating stream '%s'",
                            dev->index, name ? name : "");
    }
    s->dev = dev;
    snprintf(s->name, sizeof s->name, "%s", name ? name : "");
    s->ring = ring;
    s->cap = RING_INITIAL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    int rc = pthread_create(&s->thread, NULL, worker_main, s);
    if (rc != 0) {
        pthread_cond_destroy(&s->done_cv);
        pthread_cond_destroy(&s->work_cv);
        pthread_mutex_destroy(&s->mu);
        free(ring);
        free(s);
        return gp_error_set(err, GP_ERR_DEVICE, "cpu:%d: cannot start the thread of stream '%s': %s",
                            dev->index, name ? name : "", strerror(rc));
    }
    /* A name for debuggers and top (15 characters at most); cosmetic. */
    char tname[16];
    int len = snprintf(tname, sizeof tname, "gp%d ", dev->index);
    if (len > 0 && (size_t)len < sizeof tname) {
        size_t room = sizeof tname - (size_t)len - 1;
        memcpy(tname + len, s->name, strnlen(s->name, room));
        tname[len + (int)strnlen(s->name, room)] = '\0';
    }
    (void)pthread_setname_np(s->thread, tname);
    *out = s;
    return GP_OK;
}

/* Runs what is queued, then stops the worker. An error not yet reported by
 * synchronize is dropped. */
static void cpu_stream_destroy(struct gp_stream *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->done_cv);
    pthread_cond_destroy(&s->work_cv);
    pthread_mutex_destroy(&s->mu);
    free_spans(s);
    free(s->ring);
    free(s);
}

static void cpu_enqueue(struct gp_stream *s, gp_task_fn fn, void *arg, const struct gp_task_tag *tag)
{
    struct item it = {.kind = ITEM_TASK, .u.task = {fn, arg}};
    it.tag = tag ? *tag : (struct gp_task_tag){GP_TASK_OTHER, -1, -1, "task"};
    push(s, &it);
}

/* One memcpy: on the CPU a copy is memory bandwidth whichever thread does it,
 * and splitting it across OpenMP threads would take cores from compute. */
static void cpu_copy(struct gp_stream *s, void *dst, const void *src, size_t bytes,
                     const struct gp_task_tag *tag)
{
    struct item it = {.kind = ITEM_COPY, .u.copy = {dst, src, bytes}};
    it.tag = tag ? *tag : (struct gp_task_tag){GP_TASK_COPY, -1, -1, "copy"};
    push(s, &it);
}

static gp_status cpu_stream_synchronize(struct gp_stream *s, struct gp_error *err)
{
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->issued;
    s->sync_waiters++;
    while (s->done < target) pthread_cond_wait(&s->done_cv, &s->mu);
    s->sync_waiters--;
    gp_status st = GP_OK;
    if (s->failed) {
        st = s->err.status;
        gp_error_set(err, st, "%s", s->err.msg);
        s->failed = false;
        gp_error_clear(&s->err);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* ---- events ---- */

static gp_status cpu_event_create(struct gp_device *dev, struct gp_event **out, struct gp_error *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out) return gp_error_set(err, GP_ERR_NOMEM, "cpu:%d: out of memory creating an event", dev->index);
    pthread_mutex_init(&(*out)->mu, NULL);
    pthread_cond_init(&(*out)->cv, NULL);
    return GP_OK;
}

/* Unlike CUDA's, this waits for the event's pending records and waits to run
 * first (the items point at it); after a synchronize that is immediate. */
static void cpu_event_destroy(struct gp_event *e)
{
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    while (e->completed < e->recorded || e->pending_waits > 0) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

/* The generation is handed out and the marker enqueued under the event's
 * lock, so generations sit in their streams in the order they were handed
 * out (what run_record's in-order completion relies on). */
static void cpu_event_record(struct gp_event *e, struct gp_stream *s)
{
    pthread_mutex_lock(&e->mu);
    pthread_mutex_lock(&s->mu);
    struct item it = {.kind = ITEM_RECORD, .u.ev = {e, e->recorded + 1}};
    if (push_locked(s, &it)) e->recorded++;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_unlock(&e->mu);
}

static void cpu_stream_wait(struct gp_stream *s, struct gp_event *e)
{
    pthread_mutex_lock(&e->mu);
    uint64_t gen = e->recorded;
    if (gen > e->completed) { /* never recorded, or already reached: nothing to wait for */
        pthread_mutex_lock(&s->mu);
        struct item it = {.kind = ITEM_WAIT, .u.ev = {e, gen}};
        if (push_locked(s, &it)) e->pending_waits++;
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_unlock(&e->mu);
}

/* ---- the timeline ---- */

static void cpu_trace_enable(struct gp_stream *s, int enabled)
{
    pthread_mutex_lock(&s->mu);
    if (enabled) free_spans(s);
    s->trace_on = enabled != 0;
    pthread_mutex_unlock(&s->mu);
}

static const struct gp_trace_span *cpu_trace_spans(struct gp_stream *s, int *count)
{
    pthread_mutex_lock(&s->mu);
    *count = s->span_count;
    const struct gp_trace_span *p = s->spans ? s->spans->spans : NULL;
    pthread_mutex_unlock(&s->mu);
    return p;
}

/* No limit known in advance: host memory is virtual and overcommitted (free
 * pages exclude the page cache, which the kernel gives back), so the
 * allocation itself is what tells. GP_CPU_MEMORY_AVAILABLE=BYTES makes a
 * CPU device report that much free, as a GPU reports its own, to try what
 * a stage does when it does not fit (tests). */
static size_t cpu_mem_available(struct gp_device *dev)
{
    (void)dev;
    long bytes = gp_env_positive("GP_CPU_MEMORY_AVAILABLE", LONG_MAX, 0);
    return bytes > 0 ? (size_t)bytes : SIZE_MAX;
}

const struct gp_device_ops gp_cpu_device_ops = {
    .name = "cpu",
    .open = cpu_open,
    .close = cpu_close,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .enqueue = cpu_enqueue,
    .copy = cpu_copy,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait = cpu_stream_wait,
    .stream_synchronize = cpu_stream_synchronize,
    .trace_enable = cpu_trace_enable,
    .trace_spans = cpu_trace_spans,
    .set_threads = cpu_set_threads,
    .mem_available = cpu_mem_available,
    .compute = &gp_cpu_compute_ops,
};
